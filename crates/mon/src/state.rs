//! The replicated state a monitor group runs. Production uses the cluster
//! map (`crate::clustermap`); unit tests use small states. Everything here
//! must be deterministic: every mon applies the same bytes in the same order
//! and must end with the same state.

use crate::types::CmdOutput;

pub trait MapState: Clone + Send + Sync + 'static {
    /// Builds the first state from a genesis proposal.
    fn genesis(bytes: &[u8]) -> Result<Self, String>;
    /// Applies one encoded command. On error the state must be unchanged
    /// (the store applies on a copy anyway).
    fn apply_command(&mut self, bytes: &[u8]) -> Result<CmdOutput, String>;
    /// Current epoch: grows by one per effective change.
    fn epoch(&self) -> u64;
    /// Full encoding (snapshots, full maps for subscribers).
    fn encode_state(&self) -> Vec<u8>;
    fn decode_state(bytes: &[u8]) -> Result<Self, String>;
}
