//! OSD <-> OSD messages: the replication sub-op (a resolved list of
//! mutations plus its PG log entry) and its ack, and the peering/recovery
//! messages (query/notify, pull, push). Also the PG bookkeeping records
//! they carry (`LogEntry`, `PgInfo`).

use crate::op::{ListCursor, ObjectName, OpError, ReqId, Version};
use bytes::Bytes;
use cairn_types::{Epoch, PgId};
use serde::{Deserialize, Serialize};

/// One change to one object, already resolved by the primary (appends have
/// an offset, guards were checked), so every replica applies exactly the
/// same bytes. Attribute names are store names (user xattrs carry the
/// `u.` prefix, internal ones `_`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mutation {
    Touch,
    Remove,
    Write {
        offset: u64,
        #[serde(
            serialize_with = "crate::shared::ser_bytes",
            deserialize_with = "crate::shared::bytes"
        )]
        data: Bytes,
    },
    Truncate {
        size: u64,
    },
    Zero {
        offset: u64,
        len: u64,
    },
    SetAttr {
        name: String,
        value: Bytes,
    },
    RmAttr {
        name: String,
    },
    OmapSet {
        entries: Vec<(Bytes, Bytes)>,
    },
    OmapRm {
        keys: Vec<Bytes>,
    },
    OmapClear,
    /// Preserves the head's current content as clone `clone` (its id is
    /// the writer's snap seq), before the entry's other mutations.
    CloneHead {
        clone: u64,
    },
    /// Removes clone `clone` of the object (snap trimming).
    RemoveClone {
        clone: u64,
    },
}

/// What a log entry did to its object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogOp {
    Modify,
    Delete,
    /// The op failed; logged so that a resend gets the same answer.
    Error(OpError),
}

/// One PG log entry (no data: the object holds it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    pub version: Version,
    /// The object's version before this entry (default = did not exist).
    pub prior_version: Version,
    pub reqid: Option<ReqId>,
    pub oid: ObjectName,
    pub op: LogOp,
}

/// A PG's summary on one OSD (persisted in the collection's meta).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PgInfo {
    pub pgid: Option<PgId>,
    /// Newest log entry applied here.
    pub last_update: Version,
    /// Every entry up to here is applied with its object (no missing objects).
    pub last_complete: Version,
    /// Entries newer than this are in the log; older ones were trimmed.
    pub log_tail: Version,
    /// Epoch in which the PG last went active with this OSD in its acting set.
    pub last_epoch_started: Epoch,
    /// First epoch of the current interval as this OSD last knew it.
    pub same_interval_since: Epoch,
    /// Acting set of the interval that last went active (as known here).
    pub last_active_acting: Vec<i32>,
    /// The PG was active+clean (every acting member complete) as of this epoch.
    pub last_epoch_clean: Epoch,
    /// Set while this copy is being backfilled: objects after the mark are
    /// missing, so the copy can serve neither as authoritative nor as a
    /// member until the backfill completes (None = complete).
    pub backfill: Option<BackfillMark>,
}

/// How far a backfill has copied a PG onto a target, in store order
/// (bit-reversed hash, namespace, name).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BackfillMark {
    /// Last object copied (None: nothing yet).
    pub through: Option<ListCursor>,
}

/// primary -> backfill target, one-way on the same connection as the
/// replication sub-ops (so the two stay ordered); answered with a
/// [`PgBackfillAck`]. Writes the primary sends later for objects at or
/// before `through` carry their data; later ones only their log entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgBackfill {
    pub pgid: PgId,
    pub from: i32,
    pub epoch: Epoch,
    pub interval_since: Epoch,
    /// Batch number within the interval (echoed in the ack).
    pub seq: u64,
    /// First batch: drop every object held and adopt this info (marked
    /// incomplete) and log; None to continue where the target is.
    pub start: Option<(PgInfo, Vec<LogEntry>)>,
    /// Object states to install (None = the object must not exist).
    pub objects: Vec<(u32, ObjectName, Option<ObjectState>)>,
    /// The target now holds every object up to here.
    pub through: Option<ListCursor>,
    /// The last batch: the copy is complete (its backfill mark is cleared).
    pub complete: bool,
}

/// backfill target -> primary, one-way: batch `seq` is durable (or why not).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgBackfillAck {
    pub pgid: PgId,
    pub from: i32,
    pub interval_since: Epoch,
    pub seq: u64,
    pub result: Result<(), String>,
}

/// primary -> an OSD holding a copy outside the acting and up sets, once
/// the PG is clean: delete that copy (one-way).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgRemove {
    pub pgid: PgId,
    pub from: i32,
    pub epoch: Epoch,
}

/// An OSD holding a copy outside the PG's acting and up sets -> the acting
/// primary, one-way: "I still hold a copy". A primary that never heard of
/// it (so will never send [`PgRemove`] on its own) answers with one once
/// the PG is active+clean.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgStray {
    pub pgid: PgId,
    pub from: i32,
    pub epoch: Epoch,
}

/// primary -> replica: apply `mutations` and append `entry` in one store
/// transaction; ack once durable. Sent in version order on one connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepOp {
    pub pgid: PgId,
    pub from: i32,
    pub epoch: Epoch,
    pub interval_since: Epoch,
    pub entry: LogEntry,
    pub mutations: Vec<Mutation>,
    /// The replica may trim its log up to (and including) this version.
    pub trim_to: Version,
    /// Placement hash of the object.
    pub hash: u32,
    /// Every entry up to here is durable on every live acting member (EC
    /// shards drop the rollback stashes of those entries).
    pub roll_forward_to: Version,
}

/// replica -> primary: the entry at `version` is durable here (or why not).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepOpAck {
    pub pgid: PgId,
    pub from: i32,
    pub version: Version,
    pub interval_since: Epoch,
    pub result: Result<(), String>,
    /// Refused, not applied: the member's current interval began in this
    /// epoch, after the sender's `interval_since` (the sender is still its
    /// primary but missed a change and back); the primary starts a new
    /// interval.
    pub newer_interval: Option<Epoch>,
}

/// primary -> member: send me your info and log for this PG.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgQuery {
    pub pgid: PgId,
    pub from: i32,
    pub epoch: Epoch,
}

/// member -> primary: info and log (None if the member has no copy).
///
/// Wire history: `kept` was added after the first release. postcard
/// ignores trailing bytes, so an older OSD decodes a new answer (without
/// `kept`); a new OSD decodes an older answer with [`PgNotify::decode`]
/// (an empty `kept`). Decode it with that, never with plain `decode`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgNotify {
    pub pgid: PgId,
    pub from: i32,
    pub epoch: Epoch,
    pub info: Option<PgInfo>,
    pub log: Vec<LogEntry>,
    /// Erasure-coded pools: the shard position whose chunks this copy
    /// holds (0 for replicated pools).
    pub shard: u8,
    /// Erasure-coded pools: the copies this OSD still keeps of *other*
    /// shard positions of the PG (left by a shard move, kept until the PG
    /// is clean), each with its own info and log. An entry held there
    /// counts for that position: without them an acknowledged write held
    /// by exactly k positions, one of them in such a copy, would look
    /// unacknowledged and be rolled back.
    pub kept: Vec<KeptCopy>,
}

/// One copy of a shard position an OSD keeps besides the one it serves
/// (erasure-coded pools; see [`PgNotify::kept`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptCopy {
    pub shard: u8,
    pub info: PgInfo,
    pub log: Vec<LogEntry>,
}

/// [`PgNotify`] as the first release sent it (no `kept`).
#[derive(Serialize, Deserialize)]
struct PgNotifyV1 {
    pgid: PgId,
    from: i32,
    epoch: Epoch,
    info: Option<PgInfo>,
    log: Vec<LogEntry>,
    shard: u8,
}

impl PgNotify {
    /// Decodes an answer from this release or from the first one (whose
    /// answers end before `kept`: read as no kept copies).
    pub fn decode(buf: &[u8]) -> Result<PgNotify, cairn_types::DecodeError> {
        decode_either(buf, "pg notify", |o: PgNotifyV1| PgNotify {
            pgid: o.pgid,
            from: o.from,
            epoch: o.epoch,
            info: o.info,
            log: o.log,
            shard: o.shard,
            kept: Vec::new(),
        })
    }
}

/// Decodes `buf` as `T`, else (an older peer's shorter layout) as `Old`
/// converted with `upgrade`; when both fail, the error of the current
/// layout.
pub(crate) fn decode_either<T: serde::de::DeserializeOwned, Old: serde::de::DeserializeOwned>(
    buf: &[u8],
    what: &'static str,
    upgrade: impl FnOnce(Old) -> T,
) -> Result<T, cairn_types::DecodeError> {
    match crate::decode::<T>(what, buf) {
        Ok(v) => Ok(v),
        Err(e @ cairn_types::DecodeError::Malformed { .. }) => {
            crate::decode::<Old>(what, buf).map(upgrade).map_err(|_| e)
        }
        Err(e) => Err(e),
    }
}

/// What a pull asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PullWhat {
    /// Full state of these objects (hash, name).
    Objects(Vec<(u32, ObjectName)>),
    /// Object names in store order (backfill scan).
    List {
        after: Option<ListCursor>,
        limit: u32,
    },
}

/// primary -> member (call): objects or a listing of the member's copy.
///
/// Wire history: `shard` was added after the first release (decode with
/// [`PgPull::decode`]; an older primary's pull reads as `shard: None`). An
/// older member ignores it and answers from the copy it serves, which is
/// right: it never reports kept copies ([`PgNotify::kept`]), so nobody
/// asks it for one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgPull {
    pub pgid: PgId,
    pub from: i32,
    pub epoch: Epoch,
    pub what: PullWhat,
    /// Erasure-coded pools: answer from this OSD's copy of this shard
    /// position (the one it serves, or one it keeps from an earlier
    /// position); None = the copy it serves.
    pub shard: Option<u8>,
}

/// [`PgPull`] as the first release sent it (no `shard`).
#[derive(Serialize, Deserialize)]
struct PgPullV1 {
    pgid: PgId,
    from: i32,
    epoch: Epoch,
    what: PullWhat,
}

impl PgPull {
    /// Decodes a pull from this release or from the first one (read as
    /// `shard: None`).
    pub fn decode(buf: &[u8]) -> Result<PgPull, cairn_types::DecodeError> {
        decode_either(buf, "pg pull", |o: PgPullV1| PgPull {
            pgid: o.pgid,
            from: o.from,
            epoch: o.epoch,
            what: o.what,
            shard: None,
        })
    }
}

/// Everything one object holds. `None` in a pull/push = the object does not exist.
#[derive(Debug, Clone, Eq, Serialize, Deserialize)]
pub struct ObjectState {
    #[serde(
        serialize_with = "crate::shared::ser_bytes",
        deserialize_with = "crate::shared::bytes"
    )]
    pub data: Bytes,
    pub attrs: Vec<(String, Bytes)>,
    pub omap: Vec<(Bytes, Bytes)>,
    /// The object's snapshot clones (clone id, its whole state; their own
    /// `clones` are empty): they travel with their head in recovery and
    /// backfill.
    pub clones: Vec<(u64, ObjectState)>,
    /// The crc32c of `data` when the sender knows it without reading the
    /// bytes again (combined from the block crcs a store read verified):
    /// a copy message's frame crc is then combined from it. Not on the
    /// wire (a receiver has the frame's verified block crcs instead), and
    /// not part of the state's equality.
    #[serde(skip)]
    pub data_crc: Option<u32>,
}

impl PartialEq for ObjectState {
    fn eq(&self, other: &ObjectState) -> bool {
        self.data == other.data
            && self.attrs == other.attrs
            && self.omap == other.omap
            && self.clones == other.clones
    }
}

impl ObjectState {
    pub fn bytes(&self) -> u64 {
        (self.data.len()
            + self
                .attrs
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
            + self
                .omap
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()) as u64
            + self.clones.iter().map(|(_, c)| c.bytes()).sum::<u64>()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PullReply {
    Objects(Vec<(u32, ObjectName, Option<ObjectState>)>),
    List {
        objects: Vec<(u32, ObjectName)>,
        next: Option<ListCursor>,
    },
    /// The member refused (no such PG, newer interval, I/O error).
    Refused(String),
}

/// primary -> member: install these objects (replace whole state, or remove
/// when `None`); when `finish` is set, replace the log with `log` and the
/// info with `info` (the member is then up to date).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgPush {
    pub pgid: PgId,
    pub from: i32,
    pub epoch: Epoch,
    pub objects: Vec<(u32, ObjectName, Option<ObjectState>)>,
    /// Remove every local object not named here (end of a backfill); names by (hash, name).
    pub keep_only: Option<Vec<(u32, ObjectName)>>,
    pub finish: Option<(PgInfo, Vec<LogEntry>)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgPushReply {
    pub pgid: PgId,
    pub from: i32,
    pub result: Result<(), String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_types::PoolId;

    fn pgid() -> PgId {
        PgId {
            pool: PoolId(2),
            seed: 5,
        }
    }

    fn entry(e: u64, v: u64) -> LogEntry {
        LogEntry {
            version: Version { epoch: e, seq: v },
            prior_version: Version::default(),
            reqid: None,
            oid: ObjectName::new("", "o"),
            op: LogOp::Modify,
        }
    }

    fn info(e: u64, v: u64) -> PgInfo {
        PgInfo {
            pgid: Some(pgid()),
            last_update: Version { epoch: e, seq: v },
            ..Default::default()
        }
    }

    #[test]
    fn notify_round_trips_with_kept_copies() {
        let n = PgNotify {
            pgid: pgid(),
            from: 3,
            epoch: Epoch(40),
            info: Some(info(30, 7)),
            log: vec![entry(30, 7)],
            shard: 4,
            kept: vec![KeptCopy {
                shard: 1,
                info: info(30, 9),
                log: vec![entry(30, 8), entry(30, 9)],
            }],
        };
        assert_eq!(PgNotify::decode(&crate::encode(&n)).unwrap(), n);
    }

    #[test]
    fn an_older_peers_notify_decodes_with_no_kept_copies() {
        let old = PgNotifyV1 {
            pgid: pgid(),
            from: 3,
            epoch: Epoch(40),
            info: Some(info(30, 7)),
            log: vec![entry(30, 7)],
            shard: 2,
        };
        let n = PgNotify::decode(&crate::encode(&old)).unwrap();
        assert_eq!((n.from, n.shard, n.kept.len()), (3, 2, 0));
        assert_eq!(n.info, Some(info(30, 7)));
        // And an older peer reads a new answer (postcard ignores the
        // trailing `kept`).
        let new = PgNotify {
            kept: vec![KeptCopy {
                shard: 0,
                info: info(1, 1),
                log: vec![],
            }],
            ..n
        };
        let back: PgNotifyV1 = crate::decode("pg notify", &crate::encode(&new)).unwrap();
        assert_eq!((back.from, back.shard), (3, 2));
    }

    #[test]
    fn pull_decodes_from_both_layouts_and_garbage_is_refused() {
        let what = PullWhat::List {
            after: None,
            limit: 9,
        };
        let new = PgPull {
            pgid: pgid(),
            from: 1,
            epoch: Epoch(3),
            what: what.clone(),
            shard: Some(2),
        };
        assert_eq!(PgPull::decode(&crate::encode(&new)).unwrap(), new);
        let old = PgPullV1 {
            pgid: pgid(),
            from: 1,
            epoch: Epoch(3),
            what,
        };
        let p = PgPull::decode(&crate::encode(&old)).unwrap();
        assert_eq!(p, PgPull { shard: None, ..new });
        assert!(PgPull::decode(&[1, 0xff, 0xff]).is_err());
        assert!(PgNotify::decode(&[]).is_err());
        assert!(PgNotify::decode(&[7, 0]).is_err());
    }
}
