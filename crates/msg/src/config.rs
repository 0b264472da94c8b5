//! Limits and timeouts of one messenger. Every wait in this crate is bounded
//! by one of these.

use std::time::Duration;

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
