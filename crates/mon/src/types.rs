//! The Raft type configuration of the monitor group and the values that
//! travel through the log. The log carries opaque, versioned proposals; what
//! they mean is up to the [`MapState`](crate::MapState) the mon runs (the
//! cluster map in production, a toy state in unit tests).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::Cursor;

/// A monitor as Raft sees it: its name (`a` for `mon.a`) and its address.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MonPeer {
    pub name: String,
    pub addr: String,
}

impl fmt::Display for MonPeer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mon.{}@{}", self.name, self.addr)
    }
}

/// One log entry's application data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Proposal {
    /// Creates the state (the first map of a new cluster); refused if a
    /// state already exists.
    Genesis(Vec<u8>),
    /// An encoded state-machine command.
    Command(Vec<u8>),
}

impl fmt::Display for Proposal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Proposal::Genesis(b) => write!(f, "genesis({} bytes)", b.len()),
            Proposal::Command(b) => write!(f, "command({} bytes)", b.len()),
        }
    }
}

/// What a command produced when applied: the user-facing text and JSON
/// (JSON kept as text so every encoding can carry it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmdOutput {
    pub plain: String,
    pub json: String,
}

/// The result of applying one log entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyResult {
    /// Map epoch after the entry was applied.
    pub epoch: u64,
    /// The command's reply, or the error the user sees (nothing changed).
    pub outcome: Result<CmdOutput, String>,
}

impl Default for ApplyResult {
    fn default() -> Self {
        ApplyResult {
            epoch: 0,
            outcome: Ok(CmdOutput::default()),
        }
    }
}

/// Raft node id of a monitor (assigned when it joins, never reused).
pub type MonId = u64;

openraft::declare_raft_types!(
    /// The monitor group's Raft types.
    pub MonRaftConfig:
        D = Proposal,
        R = ApplyResult,
        NodeId = MonId,
        Node = MonPeer,
        Entry = openraft::Entry<MonRaftConfig>,
        SnapshotData = Cursor<Vec<u8>>,
);

pub type MonRaft = openraft::Raft<MonRaftConfig>;
pub type LogEntry = openraft::Entry<MonRaftConfig>;
pub type StorageError = openraft::StorageError<MonId>;
