//! The client's error type: each variant says what failed and what to try.

use cairn_ops::OpError;
use std::time::Duration;

#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error("pool '{0}' does not exist; list pools with 'cairn osd pool ls'")]
    NoSuchPool(String),
    #[error("'{object}': {error}")]
    Op { object: String, error: OpError },
    #[error("op on '{object}' in pg {pg} timed out after {after:?} waiting for {}; last: {last}. Check 'cairn pg {pg} query' and 'cairn osd tree'", osd.map(|o| format!("osd.{o}")).unwrap_or_else(|| "an up OSD".into()))]
    Timeout {
        object: String,
        pg: String,
        osd: Option<i32>,
        after: Duration,
        last: String,
    },
    /// An OSD cannot be talked to and retrying will not change it (a
    /// setting must: e.g. no frame mode in common with it).
    #[error("cannot connect to {0}")]
    Connect(String),
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("not supported: {0}")]
    Unsupported(String),
    #[error("invalid argument: {0}")]
    Invalid(String),
}

impl ClientError {
    /// The OSD's error code, if the op itself failed.
    pub fn op_error(&self) -> Option<&OpError> {
        match self {
            ClientError::Op { error, .. } => Some(error),
            _ => None,
        }
    }
    pub fn is_not_found(&self) -> bool {
        matches!(self.op_error(), Some(OpError::NoEnt))
    }
    /// This client instance is blocklisted (fenced): no op will succeed.
    pub fn is_blocklisted(&self) -> bool {
        matches!(self.op_error(), Some(OpError::Blocklisted { .. }))
    }
}
