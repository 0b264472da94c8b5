//! Client-visible operations: requests, sub-ops, per-sub-op results,
//! versions and error codes.

use bytes::Bytes;
use cairn_types::{EntityName, Epoch, PgId};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Identifies one client request across resends: the client entity, the
/// client instance (incarnation, random per `Rados` handle) and a
/// per-instance transaction id. A resent op keeps its `ReqId`, so the
/// primary applies it once.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ReqId {
    pub client: EntityName,
    pub incarnation: u64,
    pub tid: u64,
}

impl fmt::Display for ReqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:x}:{}", self.client, self.incarnation, self.tid)
    }
}

/// An object version: the map epoch the primary was in when it ordered the
/// write, and the PG-wide sequence number (grows by one per log entry).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct Version {
    pub epoch: u64,
    pub seq: u64,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}'{}", self.epoch, self.seq)
    }
}

/// An object's name inside a pool.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ObjectName {
    pub namespace: String,
    pub name: String,
}

impl ObjectName {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectName {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
    pub fn hash(&self) -> u32 {
        crate::object_hash(&self.namespace, &self.name)
    }
}

impl fmt::Display for ObjectName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{}", self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// Comparison used by `CmpXattr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CmpOp {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
}

impl CmpOp {
    /// `stored OP value`, bytewise.
    pub fn holds(self, stored: &[u8], value: &[u8]) -> bool {
        let o = stored.cmp(value);
        match self {
            CmpOp::Eq => o.is_eq(),
            CmpOp::Ne => o.is_ne(),
            CmpOp::Gt => o.is_gt(),
            CmpOp::Ge => o.is_ge(),
            CmpOp::Lt => o.is_lt(),
            CmpOp::Le => o.is_le(),
        }
    }
}

/// A position in a pool listing: the PG seed and the last object returned
/// in it (objects inside a PG are in store order: bit-reversed hash, name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListCursor {
    pub hash: u32,
    pub namespace: String,
    pub name: String,
}

/// One sub-op. A request's sub-ops run in order on one object, all or
/// nothing: if any fails, none of its writes happen and the reply carries
/// the first error. Guards (`AssertExists`, `AssertVersion`, `CmpXattr`,
/// `CmpExt`) placed before writes make compare-and-write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SubOp {
    // ---- writes ----
    /// Replaces the whole data (size becomes `data.len()`); creates the object.
    WriteFull {
        #[serde(
            serialize_with = "crate::shared::ser_bytes",
            deserialize_with = "crate::shared::bytes"
        )]
        data: Bytes,
    },
    /// Writes at `offset`; creates the object; grows the size if needed.
    Write {
        offset: u64,
        #[serde(
            serialize_with = "crate::shared::ser_bytes",
            deserialize_with = "crate::shared::bytes"
        )]
        data: Bytes,
    },
    /// Writes at the current end of the object.
    Append {
        #[serde(
            serialize_with = "crate::shared::ser_bytes",
            deserialize_with = "crate::shared::bytes"
        )]
        data: Bytes,
    },
    /// Sets the size (shrinks or extends with zeros); creates the object.
    Truncate {
        size: u64,
    },
    /// Makes `[offset, offset+len)` read as zeros without growing the object.
    Zero {
        offset: u64,
        len: u64,
    },
    /// Removes the object (`NoEnt` if it does not exist).
    Remove,
    /// Creates the object; `exclusive` fails with `Exists` if it exists.
    Create {
        exclusive: bool,
    },
    SetXattr {
        name: String,
        value: Bytes,
    },
    RmXattr {
        name: String,
    },
    OmapSet {
        entries: Vec<(Bytes, Bytes)>,
    },
    OmapRm {
        keys: Vec<Bytes>,
    },
    OmapClear,
    OmapSetHeader {
        header: Bytes,
    },
    // ---- guards ----
    AssertExists,
    /// Fails with `VersionMismatch` unless the object's version is `version`.
    AssertVersion {
        version: Version,
    },
    /// Fails with `Canceled` unless `stored OP value` holds (a missing
    /// xattr compares as empty... only for `Ne`; otherwise `NoData`).
    CmpXattr {
        name: String,
        op: CmpOp,
        value: Bytes,
    },
    /// Fails with `CmpMismatch { offset }` unless the data at `offset`
    /// equals `expected` (bytes past the end compare as zeros).
    CmpExt {
        offset: u64,
        expected: Bytes,
    },
    // ---- reads ----
    /// Reads up to `len` bytes at `offset` (`len` 0 = to the end).
    Read {
        offset: u64,
        len: u64,
    },
    Stat,
    GetXattr {
        name: String,
    },
    GetXattrs,
    OmapGetHeader,
    OmapGetVals {
        keys: Vec<Bytes>,
    },
    /// Up to `limit` keys (and values) strictly after `after`, in key order.
    OmapList {
        after: Option<Bytes>,
        limit: u32,
        values: bool,
    },
    /// Changes no data: applies the request's snap context to the object
    /// (trims clones whose snapshots were all removed). `NoEnt` when
    /// neither the object nor any clone of it exists.
    SnapTrim,
    // ---- PG-level (the request's `oid` is ignored) ----
    /// Up to `limit` objects of this PG strictly after `after`.
    ListObjects {
        after: Option<ListCursor>,
        limit: u32,
    },
}

impl SubOp {
    /// True for sub-ops that change the object (the request then goes
    /// through the replicated write path).
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            SubOp::WriteFull { .. }
                | SubOp::Write { .. }
                | SubOp::Append { .. }
                | SubOp::Truncate { .. }
                | SubOp::Zero { .. }
                | SubOp::Remove
                | SubOp::Create { .. }
                | SubOp::SetXattr { .. }
                | SubOp::RmXattr { .. }
                | SubOp::OmapSet { .. }
                | SubOp::OmapRm { .. }
                | SubOp::OmapClear
                | SubOp::OmapSetHeader { .. }
                | SubOp::SnapTrim
        )
    }

    /// Payload bytes carried (what the in-flight throttles count).
    pub fn payload_bytes(&self) -> u64 {
        let kv = |v: &[(Bytes, Bytes)]| v.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        (match self {
            SubOp::WriteFull { data } | SubOp::Write { data, .. } | SubOp::Append { data } => {
                data.len()
            }
            SubOp::SetXattr { name, value } => name.len() + value.len(),
            SubOp::OmapSet { entries } => kv(entries),
            SubOp::OmapRm { keys } | SubOp::OmapGetVals { keys } => {
                keys.iter().map(|k| k.len()).sum()
            }
            SubOp::OmapSetHeader { header } => header.len(),
            SubOp::CmpXattr { value, .. } => value.len(),
            SubOp::CmpExt { expected, .. } => expected.len(),
            _ => 0,
        } as u64)
            + 32
    }
}

/// Object metadata returned by `Stat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjStat {
    pub size: u64,
    pub version: Version,
}

/// What one successful sub-op returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SubOpOutput {
    None,
    Data(
        #[serde(
            serialize_with = "crate::shared::ser_bytes",
            deserialize_with = "crate::shared::bytes"
        )]
        Bytes,
    ),
    Stat(ObjStat),
    Xattrs(Vec<(String, Bytes)>),
    /// Omap entries (values empty when keys only were asked) and whether
    /// more follow.
    Omap {
        entries: Vec<(Bytes, Bytes)>,
        more: bool,
    },
    Objects {
        objects: Vec<ObjectName>,
        /// Resume point (None = this PG is done).
        next: Option<ListCursor>,
    },
}

/// Error codes an op can end with (the errno-like part of a reply).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum OpError {
    #[error("object does not exist")]
    NoEnt,
    #[error("object already exists")]
    Exists,
    #[error("attribute does not exist")]
    NoData,
    #[error("assert_version failed: object is at version {actual}")]
    VersionMismatch { actual: Version },
    #[error("compare failed (cmpxattr)")]
    Canceled,
    #[error("compare-and-write mismatch at byte offset {offset}")]
    CmpMismatch { offset: u64 },
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("too large: {0}")]
    TooBig(String),
    #[error("no space: {0}")]
    NoSpace(String),
    #[error("I/O error on the OSD: {0}")]
    Io(String),
    #[error("permission denied: {0}")]
    Access(String),
    /// The client instance is on the OSD map's blocklist (Ceph's
    /// EBLOCKLISTED): typically another client broke its image lock.
    #[error("client instance {client} is blocklisted (osdmap epoch {epoch}): another client fenced it, e.g. by breaking its image lock; this instance may send no more ops — see 'cairn osd blocklist ls'")]
    Blocklisted { client: String, epoch: u64 },
}

/// How the primary answered a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpStatus {
    /// Done: per-sub-op outputs (one per sub-op, in order) on success.
    Done(Result<Vec<SubOpOutput>, OpError>),
    /// The client's map is older than the OSD's: fetch at least `need` and resend.
    MapTooOld { need: Epoch },
    /// The OSD's map is older than the client's; it waited up to its bound
    /// for the newer map and did not get it. Resend later.
    MapTooNew { osd_epoch: Epoch },
    /// This OSD is not the primary of the PG in the client's epoch (or the
    /// PG does not exist there): recompute placement and resend.
    NotPrimary { osd_epoch: Epoch },
    /// The PG cannot serve I/O yet (peering, down, or below min_size):
    /// the client should wait for a map change and resend.
    NotActive { state: String },
}

/// The answer to an [`OpRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpReply {
    pub reqid: ReqId,
    pub status: OpStatus,
    /// Version of the object after the op (writes) or as read.
    pub version: Version,
    /// The OSD's map epoch.
    pub epoch: Epoch,
}

/// Snapshot id meaning "the head" (the live object, not a snapshot).
pub const SNAP_HEAD: u64 = u64::MAX;

/// Most snapshot ids one [`SnapContext`] may carry.
pub const MAX_SNAPS_PER_CONTEXT: usize = 4096;

/// The snapshots a writer knows of (Ceph's self-managed snap context):
/// `seq` is the newest snapshot id ever allocated for the data being
/// written, `snaps` the ids that still exist, newest first. The first write
/// to an object after a snapshot newer than the object's last write
/// preserves the object's old content as a clone covering those snapshots;
/// clones whose snapshots are all gone (ids at or below `seq` missing from
/// `snaps`) are trimmed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SnapContext {
    pub seq: u64,
    pub snaps: Vec<u64>,
}

impl SnapContext {
    /// Checks the shape: ids strictly decreasing, none above `seq`, none
    /// 0 or [`SNAP_HEAD`], at most [`MAX_SNAPS_PER_CONTEXT`].
    pub fn validate(&self) -> Result<(), OpError> {
        if self.snaps.len() > MAX_SNAPS_PER_CONTEXT {
            return Err(OpError::Invalid(format!(
                "snap context carries {} snapshots, limit is {MAX_SNAPS_PER_CONTEXT}",
                self.snaps.len()
            )));
        }
        if self.seq == SNAP_HEAD {
            return Err(OpError::Invalid("snap context seq is the head id".into()));
        }
        let mut prev = self.seq.saturating_add(1);
        for &s in &self.snaps {
            if s == 0 || s >= prev {
                return Err(OpError::Invalid(format!(
                    "snap context {self:?} is not strictly decreasing ids in 1..={}",
                    self.seq
                )));
            }
            prev = s;
        }
        Ok(())
    }
}

/// One client request: sub-ops on one object of one PG.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpRequest {
    pub reqid: ReqId,
    /// The map epoch the client computed placement with.
    pub epoch: Epoch,
    pub pgid: PgId,
    pub oid: ObjectName,
    pub ops: Vec<SubOp>,
    /// Writes: the writer's snapshot context (None = no snapshots: no
    /// clone is made and none is trimmed).
    pub snapc: Option<SnapContext>,
    /// Reads: the snapshot to read at ([`SNAP_HEAD`] = the live object).
    /// A request with writes must read at the head.
    pub snap: u64,
}

impl OpRequest {
    pub fn is_write(&self) -> bool {
        self.ops.iter().any(SubOp::is_write)
    }
    pub fn payload_bytes(&self) -> u64 {
        self.ops.iter().map(SubOp::payload_bytes).sum::<u64>() + 64
    }
}
