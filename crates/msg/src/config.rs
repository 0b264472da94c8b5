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

/// Most modes a [`FrameModes`] list can hold (one per known mode).
const MAX_MODES: usize = 2;

/// An ordered list of allowed frame modes, most preferred first (Ceph's
/// `ms_client_mode = crc secure`). Never empty, no mode twice.
///
/// A connecting side offers its whole list; the accepting side takes the
/// first mode of that list that its own list for this kind of peer
/// contains (the order of the accepting side's list does not matter). A
/// single mode (`"secure"`) is a list of one, so the single-value settings
/// of earlier versions keep their meaning.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameModes {
    modes: [FrameMode; MAX_MODES],
    len: u8,
}

impl FrameModes {
    /// Just `mode`.
    pub const fn only(mode: FrameMode) -> FrameModes {
        FrameModes {
            modes: [mode; MAX_MODES],
            len: 1,
        }
    }

    /// `first`, then `second` when `first` is not possible. They must differ.
    pub const fn prefer(first: FrameMode, second: FrameMode) -> FrameModes {
        assert!(!matches!(
            (first, second),
            (FrameMode::Crc, FrameMode::Crc) | (FrameMode::Secure, FrameMode::Secure)
        ));
        FrameModes {
            modes: [first, second],
            len: 2,
        }
    }

    /// A list from `modes` in order of preference; refused when empty or
    /// when a mode appears twice.
    pub fn new(modes: &[FrameMode]) -> Result<FrameModes, String> {
        let Some(&first) = modes.first() else {
            return Err("a messenger mode list needs at least one mode (crc, secure)".into());
        };
        let mut out = FrameModes::only(first);
        for &m in &modes[1..] {
            if out.contains(m) {
                return Err(format!(
                    "messenger mode '{m}' is listed twice in '{}'",
                    modes
                        .iter()
                        .map(|m| m.as_str())
                        .collect::<Vec<_>>()
                        .join(" ")
                ));
            }
            // Two distinct modes exist, so a third distinct one cannot.
            out.modes[usize::from(out.len)] = m;
            out.len += 1;
        }
        Ok(out)
    }

    /// The modes, most preferred first.
    pub fn as_slice(&self) -> &[FrameMode] {
        &self.modes[..usize::from(self.len)]
    }

    /// The most preferred mode.
    pub fn first(&self) -> FrameMode {
        self.modes[0]
    }

    pub fn contains(&self, mode: FrameMode) -> bool {
        self.as_slice().contains(&mode)
    }

    /// The first mode of `offered` (a peer's list, in its order of
    /// preference) that this list allows.
    pub fn pick(&self, offered: &[FrameMode]) -> Option<FrameMode> {
        offered.iter().copied().find(|&m| self.contains(m))
    }

    /// The list as wire bytes (see [`FrameMode`]), in order.
    pub(crate) fn wire(&self) -> Vec<u8> {
        self.as_slice().iter().map(|m| m.wire()).collect()
    }
}

impl From<FrameMode> for FrameModes {
    fn from(mode: FrameMode) -> FrameModes {
        FrameModes::only(mode)
    }
}

/// As the config value: `crc secure`.
impl std::fmt::Display for FrameModes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, m) in self.as_slice().iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            f.write_str(m.as_str())?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for FrameModes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FrameModes({self})")
    }
}

/// Parses `crc`, `secure`, `crc secure`, `secure,crc` (modes separated by
/// spaces or commas, most preferred first).
impl std::str::FromStr for FrameModes {
    type Err = String;
    fn from_str(s: &str) -> Result<FrameModes, String> {
        let modes = s
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|w| !w.is_empty())
            .map(str::parse)
            .collect::<Result<Vec<FrameMode>, String>>()?;
        if modes.is_empty() {
            return Err(format!(
                "messenger mode list '{s}' is empty: expected 'crc', 'secure' or both in order of preference ('crc secure')"
            ));
        }
        FrameModes::new(&modes)
    }
}

/// Defaults, as Ceph's: clients prefer `crc` and accept `secure`; OSDs
/// accept either from clients and prefer `crc` between themselves. See
/// `docs/operations.md` ("Messenger modes") for what each mode protects
/// against and when to narrow these lists to `secure`.
pub const DEFAULT_CLIENT_MODES: FrameModes = FrameModes::prefer(FrameMode::Crc, FrameMode::Secure);
/// What OSDs accept from clients by default (`ms_service_mode`).
pub const DEFAULT_SERVICE_MODES: FrameModes = FrameModes::prefer(FrameMode::Crc, FrameMode::Secure);
/// Between OSDs by default (`ms_cluster_mode`).
pub const DEFAULT_CLUSTER_MODES: FrameModes = FrameModes::prefer(FrameMode::Crc, FrameMode::Secure);

/// The modes a listener allows from each connecting peer, by the kind of
/// entity it claims to be (checked against its proof in the handshake).
/// A peer offering none of them is refused with a reason naming both
/// lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcceptModes {
    /// Peers that are OSDs (the cluster network: sub-ops, recovery,
    /// heartbeats).
    pub osd: FrameModes,
    /// Every other peer (clients, monitors).
    pub others: FrameModes,
}

impl AcceptModes {
    /// The same modes for every peer.
    pub const fn all(modes: FrameModes) -> AcceptModes {
        AcceptModes {
            osd: modes,
            others: modes,
        }
    }

    pub fn for_peer(&self, peer: &EntityName) -> FrameModes {
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
    /// The frame modes `connect` offers the server, most preferred first.
    pub modes: FrameModes,
    /// The frame modes a `Listener` allows from its peers.
    pub accept: AcceptModes,
    /// On a connection in crc mode, a received message with a bulk data
    /// segment is verified block by block and comes with the verified
    /// crc32c of each 4 KiB block ([`crate::Message::blocks`]), for a
    /// receiver that stores the data (OSDs). Same cost as a plain check.
    pub recv_block_crcs: bool,
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
            // The messenger's own defaults are the strict ones (monitors
            // use them); OSDs and clients set their lists from the
            // ms_*_mode settings (see `DEFAULT_CLIENT_MODES`).
            modes: FrameModes::only(FrameMode::Secure),
            accept: AcceptModes::all(FrameModes::only(FrameMode::Secure)),
            recv_block_crcs: false,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_lists_parse_in_order_and_refuse_bad_input() {
        let l: FrameModes = "crc secure".parse().unwrap();
        assert_eq!(l.as_slice(), &[FrameMode::Crc, FrameMode::Secure]);
        assert_eq!(l.to_string(), "crc secure");
        let l: FrameModes = " secure,crc ".parse().unwrap();
        assert_eq!(l.as_slice(), &[FrameMode::Secure, FrameMode::Crc]);
        let l: FrameModes = "secure".parse().unwrap();
        assert_eq!(l, FrameModes::only(FrameMode::Secure));
        assert!("".parse::<FrameModes>().unwrap_err().contains("empty"));
        assert!("crc crc"
            .parse::<FrameModes>()
            .unwrap_err()
            .contains("twice"));
        assert!("crc tls"
            .parse::<FrameModes>()
            .unwrap_err()
            .contains("unknown messenger mode 'tls'"));
    }

    #[test]
    fn pick_follows_the_offering_side_order() {
        let both = FrameModes::prefer(FrameMode::Secure, FrameMode::Crc);
        assert_eq!(
            both.pick(&[FrameMode::Crc, FrameMode::Secure]),
            Some(FrameMode::Crc)
        );
        assert_eq!(
            FrameModes::only(FrameMode::Secure).pick(&[FrameMode::Crc, FrameMode::Secure]),
            Some(FrameMode::Secure)
        );
        assert_eq!(
            FrameModes::only(FrameMode::Crc).pick(&[FrameMode::Secure]),
            None
        );
    }
}
