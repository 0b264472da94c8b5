//! OSD <-> OSD messages of erasure-coded PGs: reading byte ranges of one
//! shard's chunk of an object (client reads, read-modify-write, recovery)
//! and rolling back divergent log entries on a shard during activation.
//! Shard writes themselves travel as ordinary [`crate::RepOp`]s carrying
//! that shard's mutations.

use crate::op::{ObjectName, Version};
use crate::LogEntry;
use bytes::Bytes;
use cairn_types::{Epoch, PgId};
use serde::{Deserialize, Serialize};

/// Range length meaning "up to the end of the chunk".
pub const EC_READ_TO_END: u64 = u64::MAX;

/// primary -> shard (call): read `ranges` (offset, len) of the chunk of
/// `oid` held in collection `pgid` shard `shard`: of the head, or with
/// `snap` set to a clone id, of that snapshot clone's chunk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EcRead {
    pub pgid: PgId,
    pub shard: u8,
    pub from: i32,
    pub epoch: Epoch,
    pub oid: ObjectName,
    pub ranges: Vec<(u64, u64)>,
    /// Also return every stored attribute of the chunk (recovery).
    pub with_attrs: bool,
    /// [`crate::SNAP_HEAD`] for the head, else the id of the clone to read.
    pub snap: u64,
}

/// What one shard holds of an object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EcChunkData {
    /// The object version stored with the chunk.
    pub version: Version,
    /// Stored attributes (only when asked for).
    pub attrs: Vec<(String, Bytes)>,
    /// One buffer per requested range, zero-padded to the requested length.
    #[serde(
        serialize_with = "crate::shared::ser_bytes_vec",
        deserialize_with = "crate::shared::bytes_vec"
    )]
    pub data: Vec<Bytes>,
}

/// Why a shard could not serve a chunk read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EcReadFail {
    /// The shard has no such object.
    NoEnt,
    /// The chunk failed its checksum on that disk (counts as missing).
    Checksum(String),
    /// Anything else (no such PG shard here, I/O error...).
    Other(String),
}

/// shard -> primary: the answer to an [`EcRead`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EcReadReply {
    pub result: Result<EcChunkData, EcReadFail>,
}

/// primary -> shard (call): undo these log entries (newest last) from the
/// rollback records kept with them; they reached fewer than k shards, so
/// they were never acknowledged.
///
/// Wire history: `shard` was added after the first release (decode with
/// [`EcRollback::decode`]; an older primary's request reads as `shard:
/// None`). An older OSD ignores it and undoes the entries in the copy it
/// serves, which is what it is asked for: it reports no kept copies
/// (`PgNotify::kept`), so it is never asked to undo entries in one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EcRollback {
    pub pgid: PgId,
    pub from: i32,
    pub epoch: Epoch,
    pub entries: Vec<LogEntry>,
    /// Undo them in this OSD's copy of this shard position (one it keeps
    /// from an earlier position, read from as a rebuild source); None or
    /// the position it serves = the copy it serves.
    pub shard: Option<u8>,
}

/// [`EcRollback`] as the first release sent it (no `shard`).
#[derive(Serialize, Deserialize)]
struct EcRollbackV1 {
    pgid: PgId,
    from: i32,
    epoch: Epoch,
    entries: Vec<LogEntry>,
}

impl EcRollback {
    /// Decodes a request from this release or from the first one.
    pub fn decode(buf: &[u8]) -> Result<EcRollback, cairn_types::DecodeError> {
        crate::msgs::decode_either(buf, "ec rollback", |o: EcRollbackV1| EcRollback {
            pgid: o.pgid,
            from: o.from,
            epoch: o.epoch,
            entries: o.entries,
            shard: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_types::PoolId;

    #[test]
    fn rollback_decodes_from_both_layouts() {
        let pgid = PgId {
            pool: PoolId(1),
            seed: 3,
        };
        let new = EcRollback {
            pgid,
            from: 2,
            epoch: Epoch(9),
            entries: vec![],
            shard: Some(4),
        };
        assert_eq!(EcRollback::decode(&crate::encode(&new)).unwrap(), new);
        let old = EcRollbackV1 {
            pgid,
            from: 2,
            epoch: Epoch(9),
            entries: vec![],
        };
        let back = EcRollback::decode(&crate::encode(&old)).unwrap();
        assert_eq!(back, EcRollback { shard: None, ..new });
        assert!(EcRollback::decode(&[1]).is_err());
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EcRollbackReply {
    pub pgid: PgId,
    pub from: i32,
    pub result: Result<(), String>,
}
