//! The one error type of `cairn-msg`. Every variant names the peer (or the
//! file) it concerns, so a message reaching a user says who failed and why.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// Errors of the messaging layer. `Clone` so that the cause that killed a
/// connection can be handed to every waiter (pending calls, `recv`).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum MsgError {
    /// The peer could not prove it holds the shared key, or refused ours.
    #[error("authentication with {peer} failed: {reason}")]
    AuthFailed { peer: String, reason: String },

    /// The two ends allow no frame mode in common (`ms_client_mode`,
    /// `ms_service_mode`, `ms_cluster_mode`): a configuration mismatch that
    /// no retry cures, so callers give up at once instead of retrying.
    #[error("{peer}: {reason}")]
    NoCommonMode { peer: String, reason: String },

    /// A bounded wait ran out.
    #[error("{peer}: timed out after {after:?} waiting for {what}")]
    Timeout {
        peer: String,
        what: String,
        after: Duration,
    },

    /// The connection is gone (closed locally, by the peer, or after an error).
    #[error("connection to {peer} closed: {reason}")]
    Closed { peer: String, reason: String },

    /// A message larger than `max_message_bytes` (refused before allocating).
    #[error("message of {len} bytes {direction} {peer} exceeds the limit of {limit} bytes (max_message_bytes)")]
    TooLarge {
        peer: String,
        direction: &'static str,
        len: u64,
        limit: usize,
    },

    /// A socket operation failed.
    #[error("I/O error with {peer} while {action}: {detail}")]
    Io {
        peer: String,
        action: String,
        kind: io::ErrorKind,
        detail: String,
    },

    /// The peer sent something that is not valid Cairn wire protocol.
    #[error("protocol error from {peer}: {reason}")]
    Protocol { peer: String, reason: String },

    /// A signed frame failed its MAC or sequence check (tampered, replayed,
    /// reordered). The connection is closed.
    #[error("integrity check failed on a frame from {peer}: {reason}; the connection was closed")]
    Integrity { peer: String, reason: String },

    /// A keyring file could not be read, parsed or written.
    #[error("keyring {path}: {reason}")]
    Keyring { path: PathBuf, reason: String },

    /// A key in text form is not valid.
    #[error("invalid key: {reason}")]
    BadKey { reason: String },

    /// Invalid arguments or configuration given by the caller.
    #[error("invalid argument: {reason}")]
    Invalid { reason: String },
}

impl MsgError {
    pub(crate) fn io(peer: &str, action: impl Into<String>, e: &io::Error) -> MsgError {
        MsgError::Io {
            peer: peer.to_string(),
            action: action.into(),
            kind: e.kind(),
            detail: e.to_string(),
        }
    }

    pub(crate) fn protocol(peer: &str, reason: impl Into<String>) -> MsgError {
        MsgError::Protocol {
            peer: peer.to_string(),
            reason: reason.into(),
        }
    }

    pub(crate) fn timeout(peer: &str, what: impl Into<String>, after: Duration) -> MsgError {
        MsgError::Timeout {
            peer: peer.to_string(),
            what: what.into(),
            after,
        }
    }

    pub(crate) fn auth(peer: &str, reason: impl Into<String>) -> MsgError {
        MsgError::AuthFailed {
            peer: peer.to_string(),
            reason: reason.into(),
        }
    }

    /// True for errors that a fresh connection may cure (used by `Peer`).
    pub fn is_connection_error(&self) -> bool {
        matches!(
            self,
            MsgError::Closed { .. }
                | MsgError::Io { .. }
                | MsgError::Protocol { .. }
                | MsgError::Integrity { .. }
        )
    }
}
