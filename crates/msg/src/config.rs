//! Limits, timeouts and frame-integrity modes of one messenger. Every wait
//! in this crate is bounded by one of these.

use cairn_types::{EntityKind, EntityName};
use std::time::Duration;

/// How the payload of each frame is protected once a connection is
/// authenticated (Ceph's `ms_*_mode`). Both modes authenticate both ends at
/// connect time (challenge–response) and authenticate every frame *header*
/// (keyed BLAKE3 over kind, length, sequence number and ids), so replayed,
/// reordered, dropped or injected frames and forged lengths are refused in
/// both; they differ in what protects the payload bytes:
///
/// * `Secure`: a keyed BLAKE3 MAC over header and payload. An on-path
///   attacker cannot change a payload without the session key.
/// * `Crc`: a crc32c over header and payload. Corruption in transit is
///   detected, but crc32c is unkeyed, so an attacker who can rewrite
///   packets on the path could change a payload and its checksum. Meant
///   for a trusted network (the cluster network between OSDs), where it
///   saves the MAC's CPU on every byte replicated or recovered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameMode {
    Crc,
    Secure,
}

impl FrameMode {
    /// The mode's byte in the handshake (bound into both proofs).
    pub(crate) fn wire(self) -> u8 {
        match self {
            FrameMode::Crc => 1,
            FrameMode::Secure => 2,
        }
    }

    pub(crate) fn from_wire(b: u8) -> Option<FrameMode> {
        match b {
            1 => Some(FrameMode::Crc),
            2 => Some(FrameMode::Secure),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FrameMode::Crc => "crc",
            FrameMode::Secure => "secure",
        }
    }
}

impl std::fmt::Display for FrameMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for FrameMode {
    type Err = String;
    fn from_str(s: &str) -> Result<FrameMode, String> {
        match s.trim() {
            "crc" => Ok(FrameMode::Crc),
            "secure" => Ok(FrameMode::Secure),
            other => Err(format!(
                "unknown messenger mode '{other}': expected 'crc' or 'secure'"
            )),
        }
    }
}

/// The mode a listener requires of each connecting peer, by the kind of
/// entity it claims to be (checked against its proof in the handshake).
/// A peer asking for another mode is refused with a reason naming both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcceptModes {
    /// Peers that are OSDs (the cluster network: sub-ops, recovery,
    /// heartbeats).
    pub osd: FrameMode,
    /// Every other peer (clients, monitors).
    pub others: FrameMode,
}

impl AcceptModes {
    /// The same mode for every peer.
    pub const fn all(mode: FrameMode) -> AcceptModes {
        AcceptModes {
            osd: mode,
            others: mode,
        }
    }

    pub fn for_peer(&self, peer: &EntityName) -> FrameMode {
        if peer.kind == EntityKind::Osd {
            self.osd
        } else {
            self.others
        }
    }
}

/// Default `max_message_bytes`: a 128 MiB object plus 64 KiB of headers.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = (128 << 20) + (64 << 10);
/// Default `max_inflight_bytes` per connection and direction.
pub const DEFAULT_MAX_INFLIGHT_BYTES: usize = 64 << 20;

/// Messenger limits. Build with `MsgConfig { field: x, ..Default::default() }`.
#[derive(Debug, Clone)]
pub struct MsgConfig {
    /// Frames with a bigger payload are refused from their header, before
    /// anything is allocated (and `send` refuses them locally).
    pub max_message_bytes: usize,
    /// Per connection: bytes queued for sending beyond this make `send` wait
    /// (backpressure); the receiving side queues at most this many bytes of
    /// undelivered messages before it stops reading the socket.
    pub max_inflight_bytes: usize,
    /// A keepalive frame is sent after this much send-side idleness.
    pub keepalive_interval: Duration,
    /// No bytes from the peer for this long (while we are reading) -> the
    /// connection fails with a `Timeout` naming the peer.
    pub keepalive_timeout: Duration,
    /// Bound on establishing the TCP connection.
    pub connect_timeout: Duration,
    /// Bound on the whole authentication handshake, on both sides.
    pub handshake_timeout: Duration,
    /// Bound on `send`/`reply` waiting for in-flight room (backpressure).
    /// `call` uses its own timeout instead.
    pub send_timeout: Duration,
    /// The frame mode `connect` asks the server for.
    pub mode: FrameMode,
    /// The frame modes a `Listener` requires of its peers.
    pub accept: AcceptModes,
}

impl Default for MsgConfig {
    fn default() -> Self {
        MsgConfig {
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_inflight_bytes: DEFAULT_MAX_INFLIGHT_BYTES,
            keepalive_interval: Duration::from_secs(2),
            keepalive_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(5),
            send_timeout: Duration::from_secs(30),
            mode: FrameMode::Secure,
            accept: AcceptModes::all(FrameMode::Secure),
        }
    }
}

impl MsgConfig {
    /// Checks that the limits make sense together.
    pub fn validate(&self) -> Result<(), crate::MsgError> {
        let bad = |reason: String| Err(crate::MsgError::Invalid { reason });
        if self.max_message_bytes == 0 || self.max_message_bytes > u32::MAX as usize {
            return bad(format!(
                "max_message_bytes must be 1..={} (got {})",
                u32::MAX,
                self.max_message_bytes
            ));
        }
        if self.max_inflight_bytes == 0 || self.max_inflight_bytes > u32::MAX as usize {
            return bad(format!(
                "max_inflight_bytes must be 1..={} (got {})",
                u32::MAX,
                self.max_inflight_bytes
            ));
        }
        if self.keepalive_interval.is_zero() || self.keepalive_timeout <= self.keepalive_interval {
            return bad(format!(
                "keepalive_timeout ({:?}) must be longer than keepalive_interval ({:?}), which must be > 0",
                self.keepalive_timeout, self.keepalive_interval
            ));
        }
        Ok(())
    }
}
