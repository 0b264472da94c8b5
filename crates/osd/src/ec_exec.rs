//! Erasure-coded objects against the local store, one shard at a time:
//! object metadata kept on every shard (`_v` version, `_ec` chunk info with
//! the logical size, user xattrs), serving chunk-range reads to the
//! primary, turning a client request into a write plan and each shard's
//! mutations, and the rollback records (stash objects) that let a write
//! that reached fewer than k shards be undone at activation. Owns no
//! network I/O (see `ec_io`) and no ordering (see `pg`).
//!
//! Snapshots work as on replicated pools (`exec`'s [`SnapSet`], kept on
//! every shard's head as `_ss`): the first write carrying a newer snapshot
//! context clones the head in the same log entry, and since chunk
//! positions are stable each shard clones its own chunk locally (store
//! object `snap = clone id`, with the head's `_v` and `_ec` of that time).
//! A read at a snapshot reads and decodes the clones' chunks; clones whose
//! snapshots are gone are removed by the next write or `SnapTrim`; a
//! removed head with clones left stays as an empty whiteout. Rollback
//! records also undo clones made and restore clones removed.

use crate::ec_pool::EcPg;
use crate::exec::{
    map_store_err, store_oid, SnapSet, ATTR_SNAPSET, ATTR_VERSION, USER_ATTR_PREFIX,
};
use bytes::Bytes;
use cairn_ec::{plan_truncate, plan_write, plan_write_full, ChunkInfo, EcError, ShardWrite};
use cairn_ec::{ErasureCode, WritePlan};
use cairn_ops::{
    EcChunkData, EcRead, EcReadFail, EcReadReply, LogEntry, LogOp, Mutation, ObjStat, ObjectName,
    OpError, SnapContext, SubOp, SubOpOutput, Version, EC_READ_TO_END, SNAP_HEAD,
};
use cairn_store::{CollectionId, ObjectId, Store, StoreError, Transaction};
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// Store attribute holding the chunk info (code, shard, logical size).
pub const ATTR_EC: &str = "_ec";
/// Stash attribute holding the rollback record.
const ATTR_ROLLBACK: &str = "_rb";
/// Namespaces starting with this character are internal (rollback stashes)
/// and never listed.
pub const INTERNAL_NS_PREFIX: char = '\u{1}';

/// The stash object keeping what log entry `seq` changed of `name` here.
pub fn stash_oid(name: &ObjectName, seq: u64) -> ObjectId {
    ObjectId::new(name.hash(), name.name.clone()).with_namespace(format!(
        "{INTERNAL_NS_PREFIX}rb.{seq:016x}.{}",
        name.namespace
    ))
}

/// Snapshots are read-only: a write request must address the head.
pub fn refuse_snapshot_write(req: &cairn_ops::OpRequest) -> Result<(), OpError> {
    if req.snap != SNAP_HEAD {
        return Err(OpError::Invalid(format!(
            "snapshot {} of {} is read-only: writes go to the head",
            req.snap, req.oid
        )));
    }
    Ok(())
}

/// Whether a store namespace is internal (not a client object).
pub fn is_internal_ns(ns: &str) -> bool {
    ns.starts_with(INTERNAL_NS_PREFIX)
}

/// The chunk info attribute for `shard` of an object of `size` bytes. The
/// whole-chunk crc is not kept (0): the store checksums every block.
pub fn chunk_info_attr(code: &ErasureCode, shard: usize, size: u64) -> Bytes {
    Bytes::from(
        ChunkInfo {
            k: code.k() as u8,
            m: code.m() as u8,
            stripe_unit_bytes: code.geometry().stripe_unit_bytes() as u32,
            shard: shard as u8,
            logical_size_bytes: size,
            chunk_crc32c: 0,
        }
        .encode(),
    )
}

/// What this shard knows of an object (of its head, or of one clone).
#[derive(Debug, Clone)]
pub struct ShardMeta {
    pub exists: bool,
    /// Logical object size.
    pub size: u64,
    pub version: Version,
    /// The store object these describe: [`SNAP_HEAD`] or a clone id.
    pub snap: u64,
}

impl Default for ShardMeta {
    fn default() -> Self {
        ShardMeta {
            exists: false,
            size: 0,
            version: Version::default(),
            snap: SNAP_HEAD,
        }
    }
}

impl ShardMeta {
    /// The store object of `name` these describe.
    pub fn oid(&self, name: &ObjectName) -> ObjectId {
        store_oid(name).with_snap(self.snap)
    }
}

/// Every stored attribute of `o` (None when it does not exist).
fn attrs_of(
    store: &Store,
    coll: CollectionId,
    o: &ObjectId,
) -> Result<Option<std::collections::BTreeMap<String, Vec<u8>>>, OpError> {
    match store.getattrs(&coll, o) {
        Ok(a) => Ok(Some(a)),
        Err(StoreError::NoSuchObject { .. }) => Ok(None),
        Err(e) => Err(map_store_err(e)),
    }
}

/// The metadata of a store object from its attributes.
fn meta_from(
    name: &ObjectName,
    attrs: &std::collections::BTreeMap<String, Vec<u8>>,
    snap: u64,
) -> Result<ShardMeta, OpError> {
    let version = attrs
        .get(ATTR_VERSION)
        .map(|b| crate::exec::decode_version(b))
        .unwrap_or_default();
    let size = match attrs.get(ATTR_EC) {
        Some(b) => {
            ChunkInfo::decode(b)
                .map_err(|e| OpError::Io(format!("object {name}: {e}")))?
                .logical_size_bytes
        }
        None => 0,
    };
    Ok(ShardMeta {
        exists: true,
        size,
        version,
        snap,
    })
}

/// What a write sees of an object's head on this shard.
struct HeadState {
    /// The head as clients see it (a whiteout does not exist).
    meta: ShardMeta,
    /// The head's store object exists (maybe as a whiteout).
    raw_exists: bool,
    snapset: SnapSet,
}

fn load_head(store: &Store, coll: CollectionId, name: &ObjectName) -> Result<HeadState, OpError> {
    let Some(attrs) = attrs_of(store, coll, &store_oid(name))? else {
        return Ok(HeadState {
            meta: ShardMeta::default(),
            raw_exists: false,
            snapset: SnapSet::default(),
        });
    };
    let snapset = match attrs.get(ATTR_SNAPSET) {
        Some(b) => SnapSet::decode(b)?,
        None => SnapSet::default(),
    };
    let mut meta = meta_from(name, &attrs, SNAP_HEAD)?;
    if snapset.whiteout {
        meta.exists = false;
        meta.size = 0;
    }
    Ok(HeadState {
        meta,
        raw_exists: true,
        snapset,
    })
}

/// Reads the object's head metadata from this shard (a whiteout head, kept
/// only for its clones, does not exist).
pub fn load_meta(
    store: &Store,
    coll: CollectionId,
    name: &ObjectName,
) -> Result<ShardMeta, OpError> {
    Ok(load_head(store, coll, name)?.meta)
}

/// The object's metadata as seen at snapshot `snap` ([`SNAP_HEAD`] = the
/// head): the clone covering the snapshot, the head when no write came
/// after it, or absent when the object did not exist then.
pub fn load_meta_at(
    store: &Store,
    coll: CollectionId,
    name: &ObjectName,
    snap: u64,
) -> Result<ShardMeta, OpError> {
    let head = load_head(store, coll, name)?;
    match head.snapset.resolve(snap) {
        Some(SNAP_HEAD) => Ok(head.meta),
        None => Ok(ShardMeta::default()),
        Some(clone) => match attrs_of(store, coll, &store_oid(name).with_snap(clone))? {
            Some(attrs) => meta_from(name, &attrs, clone),
            None => Err(OpError::Io(format!(
                "object {name}: clone {clone} for snapshot {snap} is missing on this shard"
            ))),
        },
    }
}

/// Shard side of an [`EcRead`]: straight from the store (the primary
/// checks versions, so no ordering with writes is needed here).
pub fn serve_read(store: &Store, req: &EcRead) -> EcReadReply {
    EcReadReply {
        result: read_chunk(store, req),
    }
}

fn read_chunk(store: &Store, req: &EcRead) -> Result<EcChunkData, EcReadFail> {
    let coll = CollectionId::new(req.pgid.pool.0, req.pgid.seed, req.shard);
    let o = store_oid(&req.oid).with_snap(req.snap);
    let fail = |e: StoreError| match e {
        StoreError::NoSuchObject { .. } => EcReadFail::NoEnt,
        StoreError::Checksum { .. } => EcReadFail::Checksum(e.to_string()),
        other => EcReadFail::Other(other.to_string()),
    };
    let version_now = || -> Result<Version, EcReadFail> {
        Ok(store
            .getattr(&coll, &o, ATTR_VERSION)
            .map_err(fail)?
            .map(|b| crate::exec::decode_version(&b))
            .unwrap_or_default())
    };
    let st = store.stat(&coll, &o).map_err(fail)?;
    let version = version_now()?;
    let mut data = Vec::with_capacity(req.ranges.len());
    for &(off, len) in &req.ranges {
        let len = if len == EC_READ_TO_END {
            st.size.saturating_sub(off)
        } else {
            len
        };
        let b = store.read_bytes(&coll, &o, off, len).map_err(fail)?;
        if b.len() as u64 == len {
            data.push(b);
        } else {
            // Short past the end of the chunk: zero-padded to the request.
            let mut v = b.to_vec();
            v.resize(len as usize, 0);
            data.push(Bytes::from(v));
        }
    }
    let attrs = if req.with_attrs {
        store
            .getattrs(&coll, &o)
            .map_err(fail)?
            .into_iter()
            .map(|(k, v)| (k, Bytes::from(v)))
            .collect()
    } else {
        Vec::new()
    };
    if version_now()? != version {
        return Err(EcReadFail::Other(format!(
            "object {} changed while it was read",
            req.oid
        )));
    }
    Ok(EcChunkData {
        version,
        attrs,
        data,
    })
}

/// The clear error for omap on an EC pool.
pub fn omap_refused(ec: &EcPg) -> OpError {
    OpError::Invalid(format!(
        "pool '{}' is erasure-coded and cannot hold omap data; keep metadata (omap) in a replicated pool",
        ec.pool_name
    ))
}

fn is_omap(op: &SubOp) -> bool {
    matches!(
        op,
        SubOp::OmapSet { .. }
            | SubOp::OmapRm { .. }
            | SubOp::OmapClear
            | SubOp::OmapSetHeader { .. }
            | SubOp::OmapGetHeader
            | SubOp::OmapGetVals { .. }
            | SubOp::OmapList { .. }
    )
}

fn ec_error(ec: &EcPg, name: &ObjectName, e: EcError) -> OpError {
    match e {
        EcError::OverwritesDisabled {
            offset,
            end,
            old_size,
        } => OpError::Invalid(format!(
            "object {name}: bytes {offset}..{end} of a {old_size}-byte object would be overwritten, but erasure-coded pool '{p}' only takes full writes and appends; run 'cairn osd pool set {p} allow_ec_overwrites true'",
            p = ec.pool_name
        )),
        other => OpError::Invalid(format!("object {name}: {other}")),
    }
}

/// Runs a read sub-op that needs only metadata (everything but `Read` and
/// `CmpExt`). None = the op needs chunk data.
pub fn run_meta_op(
    store: &Store,
    coll: CollectionId,
    ec: &EcPg,
    name: &ObjectName,
    meta: &ShardMeta,
    op: &SubOp,
) -> Option<Result<SubOpOutput, OpError>> {
    let need = || {
        if meta.exists {
            Ok(())
        } else {
            Err(OpError::NoEnt)
        }
    };
    let o = meta.oid(name);
    let getattr = |n: &str| -> Result<Option<Vec<u8>>, OpError> {
        if !meta.exists {
            return Ok(None);
        }
        store
            .getattr(&coll, &o, &format!("{USER_ATTR_PREFIX}{n}"))
            .map_err(map_store_err)
    };
    let r = || {
        Ok(match op {
            SubOp::AssertExists => {
                need()?;
                SubOpOutput::None
            }
            SubOp::AssertVersion { version } => {
                if meta.version != *version {
                    return Err(OpError::VersionMismatch {
                        actual: meta.version,
                    });
                }
                SubOpOutput::None
            }
            SubOp::CmpXattr { name, op, value } => match getattr(name)? {
                Some(stored) if op.holds(&stored, value) => SubOpOutput::None,
                Some(_) => return Err(OpError::Canceled),
                None => return Err(OpError::NoData),
            },
            SubOp::Stat => {
                need()?;
                SubOpOutput::Stat(ObjStat {
                    size: meta.size,
                    version: meta.version,
                })
            }
            SubOp::GetXattr { name } => {
                need()?;
                match getattr(name)? {
                    Some(v) => SubOpOutput::Data(v.into()),
                    None => return Err(OpError::NoData),
                }
            }
            SubOp::GetXattrs => {
                need()?;
                let all = store.getattrs(&coll, &o).map_err(map_store_err)?;
                SubOpOutput::Xattrs(
                    all.into_iter()
                        .filter_map(|(k, v)| {
                            k.strip_prefix(USER_ATTR_PREFIX)
                                .map(|n| (n.to_string(), Bytes::from(v)))
                        })
                        .collect(),
                )
            }
            op if is_omap(op) => return Err(omap_refused(ec)),
            other => {
                return Err(OpError::Invalid(format!(
                    "sub-op {other:?} is not a read or guard"
                )))
            }
        })
    };
    match op {
        SubOp::Read { .. } | SubOp::CmpExt { .. } => None,
        _ => Some(r()),
    }
}

/// One step of an EC write: the same mutation on every shard, or the data
/// change (each shard gets its own chunk bytes).
#[derive(Debug, Clone)]
pub enum Step {
    Common(Mutation),
    Data { plan: WritePlan, data: Bytes },
}

/// A client write resolved against the object's metadata.
#[derive(Debug, Clone)]
pub struct EcWritePlan {
    pub prior: Version,
    pub outputs: Vec<SubOpOutput>,
    pub steps: Vec<Step>,
    pub exists_after: bool,
    /// The head is removed but stays as an empty whiteout for its clones.
    pub whiteout_after: bool,
    pub size_after: u64,
}

impl EcWritePlan {
    /// The data step, if the request changes data.
    pub fn data_plan(&self) -> Option<(&WritePlan, &Bytes)> {
        self.steps.iter().find_map(|s| match s {
            Step::Data { plan, data } => Some((plan, data)),
            Step::Common(_) => None,
        })
    }
}

/// Resolves a write request on an EC object. At most one sub-op per
/// request may change data (write_full, write, append, truncate, zero).
/// `snapc` is the writer's snapshot context: clone-on-write and trimming
/// of clones come first, as on replicated pools (`exec::resolve_write`).
pub fn plan_ops(
    store: &Store,
    coll: CollectionId,
    ec: &EcPg,
    name: &ObjectName,
    ops: &[SubOp],
    snapc: Option<&SnapContext>,
) -> Result<EcWritePlan, OpError> {
    let HeadState {
        meta,
        raw_exists,
        mut snapset,
    } = load_head(store, coll, name)?;
    let had_snapset = snapset != SnapSet::default();
    // Each shard clones (or drops) its own chunk: the same mutation on all.
    let mut snap_steps = Vec::new();
    if let Some(sc) = snapc {
        sc.validate()?;
        let (trimmed, made) = snapset.apply_context(sc, meta.exists.then_some(meta.size));
        snap_steps.extend(
            trimmed
                .into_iter()
                .map(|clone| Step::Common(Mutation::RemoveClone { clone })),
        );
        if let Some(clone) = made {
            snap_steps.push(Step::Common(Mutation::CloneHead { clone }));
        }
    }
    let max = store.config().max_object_size;
    let code = &ec.code;
    let (existed, mut exists, mut size) = (meta.exists, meta.exists, meta.size);
    let mut steps: Vec<Step> = Vec::new();
    let mut outputs = Vec::with_capacity(ops.len());
    let fits = |end: Option<u64>| match end {
        Some(e) if e <= max => Ok(()),
        _ => Err(OpError::TooBig(format!(
            "write ending past osd_max_object_size ({max} bytes)"
        ))),
    };
    let touch = |exists: &mut bool, steps: &mut Vec<Step>| {
        if !*exists {
            steps.push(Step::Common(Mutation::Touch));
            *exists = true;
        }
    };
    for op in ops {
        let data_step = |plan: Result<WritePlan, EcError>, data: Bytes| {
            plan.map(|plan| Step::Data { plan, data })
                .map_err(|e| ec_error(ec, name, e))
        };
        let step = match op {
            SubOp::WriteFull { data } => {
                fits(Some(data.len() as u64))?;
                Some(data_step(
                    plan_write_full(code, size, data.len() as u64),
                    data.clone(),
                )?)
            }
            SubOp::Write { offset, data } => {
                fits(offset.checked_add(data.len() as u64))?;
                touch(&mut exists, &mut steps);
                Some(data_step(
                    plan_write(code, size, *offset, data.len() as u64, ec.allow_overwrites),
                    data.clone(),
                )?)
            }
            SubOp::Append { data } => {
                fits(size.checked_add(data.len() as u64))?;
                touch(&mut exists, &mut steps);
                Some(data_step(
                    plan_write(code, size, size, data.len() as u64, ec.allow_overwrites),
                    data.clone(),
                )?)
            }
            SubOp::Truncate { size: s } => {
                fits(Some(*s))?;
                touch(&mut exists, &mut steps);
                Some(data_step(
                    plan_truncate(code, size, *s, ec.allow_overwrites),
                    Bytes::new(),
                )?)
            }
            SubOp::Zero { offset, len } => {
                if !exists {
                    return Err(OpError::NoEnt);
                }
                if *offset < size {
                    let len = (*len).min(size - offset);
                    Some(data_step(
                        plan_write(code, size, *offset, len, ec.allow_overwrites),
                        Bytes::from(vec![0u8; len as usize]),
                    )?)
                } else {
                    None
                }
            }
            SubOp::Remove => {
                if !exists {
                    return Err(OpError::NoEnt);
                }
                steps.clear();
                if existed {
                    steps.push(Step::Common(Mutation::Remove));
                }
                exists = false;
                size = 0;
                outputs.push(SubOpOutput::None);
                continue;
            }
            SubOp::Create { exclusive } => {
                if exists && *exclusive {
                    return Err(OpError::Exists);
                }
                touch(&mut exists, &mut steps);
                None
            }
            SubOp::SetXattr { name: n, value } => {
                touch(&mut exists, &mut steps);
                Some(Step::Common(Mutation::SetAttr {
                    name: format!("{USER_ATTR_PREFIX}{n}"),
                    value: value.clone(),
                }))
            }
            SubOp::RmXattr { name: n } => {
                if !exists {
                    return Err(OpError::NoEnt);
                }
                Some(Step::Common(Mutation::RmAttr {
                    name: format!("{USER_ATTR_PREFIX}{n}"),
                }))
            }
            SubOp::SnapTrim => {
                if !raw_exists {
                    return Err(OpError::NoEnt);
                }
                None
            }
            SubOp::ListObjects { .. } => {
                return Err(OpError::Invalid(
                    "ListObjects cannot be combined with writes".into(),
                ))
            }
            op if is_omap(op) => return Err(omap_refused(ec)),
            read => {
                let cur = ShardMeta {
                    exists,
                    size,
                    version: meta.version,
                    snap: SNAP_HEAD,
                };
                match run_meta_op(store, coll, ec, name, &cur, read) {
                    Some(r) => outputs.push(r?),
                    None => {
                        return Err(OpError::Invalid(format!(
                            "object {name}: on erasure-coded pool '{}' a data read ({read:?}) cannot be combined with writes in one request",
                            ec.pool_name
                        )))
                    }
                }
                continue;
            }
        };
        if let Some(Step::Data { plan, .. }) = &step {
            if steps.iter().any(|s| matches!(s, Step::Data { .. })) {
                return Err(OpError::Invalid(format!(
                    "object {name}: erasure-coded pool '{}' takes one data-changing sub-op (write_full, write, append, truncate, zero) per request",
                    ec.pool_name
                )));
            }
            exists = true;
            size = plan.new_size();
        }
        steps.extend(step);
        outputs.push(SubOpOutput::None);
    }
    // The snapshot set, and a whiteout head while clones remain.
    let set_snapset = |steps: &mut Vec<Step>, ss: &SnapSet| {
        steps.push(Step::Common(Mutation::SetAttr {
            name: ATTR_SNAPSET.into(),
            value: ss.encode(),
        }))
    };
    let mut whiteout = false;
    if exists {
        snapset.whiteout = false;
        if had_snapset || snapset != SnapSet::default() {
            set_snapset(&mut steps, &snapset);
        }
    } else if !snapset.clones.is_empty() {
        let removes = steps
            .iter()
            .any(|s| matches!(s, Step::Common(Mutation::Remove)));
        if existed && !removes {
            steps.push(Step::Common(Mutation::Remove));
        }
        steps.push(Step::Common(Mutation::Touch));
        snapset.whiteout = true;
        set_snapset(&mut steps, &snapset);
        whiteout = true;
        size = 0;
    } else if raw_exists && !existed {
        // A whiteout whose last clone was trimmed.
        steps.push(Step::Common(Mutation::Remove));
    }
    snap_steps.append(&mut steps);
    Ok(EcWritePlan {
        prior: meta.version,
        outputs,
        steps: snap_steps,
        exists_after: exists,
        whiteout_after: whiteout,
        size_after: size,
    })
}

/// The mutations shard `shard` applies for `plan`, given the shard writes
/// built for its data step (all `k + m` of them, in shard order).
pub fn shard_mutations(
    plan: &EcWritePlan,
    writes: &[ShardWrite],
    code: &ErasureCode,
    shard: usize,
    version: Version,
) -> Vec<Mutation> {
    let mut out = Vec::new();
    for s in &plan.steps {
        match s {
            Step::Common(m) => out.push(m.clone()),
            Step::Data { .. } => {
                if let Some(w) = writes.get(shard) {
                    if w.new_chunk_len != w.old_chunk_len || w.new_chunk_len == 0 {
                        out.push(Mutation::Truncate {
                            size: w.new_chunk_len,
                        });
                    }
                    if !w.data.is_empty() {
                        out.push(Mutation::Write {
                            offset: w.offset,
                            data: w.data.clone(),
                        });
                    }
                }
            }
        }
    }
    if plan.exists_after || plan.whiteout_after {
        out.push(Mutation::SetAttr {
            name: ATTR_VERSION.into(),
            value: crate::exec::encode_version(version),
        });
        out.push(Mutation::SetAttr {
            name: ATTR_EC.into(),
            value: chunk_info_attr(code, shard, plan.size_after),
        });
    }
    out
}

/// The log op of a resolved EC write.
pub fn log_op(plan: &EcWritePlan) -> LogOp {
    if plan.exists_after || plan.whiteout_after {
        LogOp::Modify
    } else {
        LogOp::Delete
    }
}

/// Version of the rollback record encoding (1 had no clone lists).
const ROLLBACK_REC_VERSION: u8 = 2;
/// Largest rollback record decoded.
const ROLLBACK_REC_MAX_BYTES: usize = 1 << 20;

/// What a stash records about the object before its log entry.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct RollbackRec {
    existed: bool,
    old_chunk_len: u64,
    /// Old chunk bytes kept in the stash (same offsets).
    saved: Range<u64>,
    /// Snapshot clones the entry made (removed on rollback).
    made_clones: Vec<u64>,
    /// Snapshot clones the entry removed or replaced, kept as clones of
    /// the stash object with the same ids (put back on rollback).
    kept_clones: Vec<u64>,
}

/// Version 1 of the record (before snapshots on EC pools).
#[derive(Debug, Clone, Deserialize)]
struct RollbackRecV1 {
    existed: bool,
    old_chunk_len: u64,
    saved: Range<u64>,
}

impl RollbackRec {
    fn encode(&self) -> Bytes {
        Bytes::from(cairn_types::encode_versioned(ROLLBACK_REC_VERSION, self))
    }

    fn decode(raw: &[u8]) -> Result<RollbackRec, StoreError> {
        let corrupt = |e: cairn_types::DecodeError| StoreError::Corrupt(e.to_string());
        if raw.first() == Some(&1) {
            let (_, v1): (u8, RollbackRecV1) = cairn_types::decode_versioned(
                "EC rollback record",
                raw,
                1,
                1,
                ROLLBACK_REC_MAX_BYTES,
            )
            .map_err(corrupt)?;
            return Ok(RollbackRec {
                existed: v1.existed,
                old_chunk_len: v1.old_chunk_len,
                saved: v1.saved,
                ..RollbackRec::default()
            });
        }
        cairn_types::decode_versioned(
            "EC rollback record",
            raw,
            ROLLBACK_REC_VERSION,
            ROLLBACK_REC_VERSION,
            ROLLBACK_REC_MAX_BYTES,
        )
        .map(|(_, r)| r)
        .map_err(corrupt)
    }

    /// The record kept in stash `s` (None when there is no stash).
    fn load(store: &Store, coll: &CollectionId, s: &ObjectId) -> Result<Option<Self>, StoreError> {
        match store.getattr(coll, s, ATTR_ROLLBACK) {
            Ok(Some(raw)) => RollbackRec::decode(&raw).map(Some),
            Ok(None) | Err(StoreError::NoSuchObject { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Adds to `txn` the removal of stash `s` and the clones it keeps.
fn remove_stash(
    store: &Store,
    coll: CollectionId,
    s: &ObjectId,
    txn: &mut Transaction,
) -> Result<(), StoreError> {
    if !store.exists(&coll, s)? {
        return Ok(());
    }
    if let Some(rec) = RollbackRec::load(store, &coll, s)? {
        for c in rec.kept_clones {
            txn.remove(coll, s.clone().with_snap(c));
        }
    }
    txn.remove(coll, s.clone());
    Ok(())
}

/// The chunk range `muts` may change of a chunk of `old_len` bytes.
fn changed_range(muts: &[Mutation], old_len: u64) -> Range<u64> {
    let mut lo = u64::MAX;
    let mut hi = 0u64;
    let mut add = |r: Range<u64>| {
        let r = r.start.min(old_len)..r.end.min(old_len);
        if r.start < r.end {
            lo = lo.min(r.start);
            hi = hi.max(r.end);
        }
    };
    for m in muts {
        match m {
            Mutation::Write { offset, data } => {
                add(*offset..offset.saturating_add(data.len() as u64))
            }
            Mutation::Zero { offset, len } => add(*offset..offset.saturating_add(*len)),
            Mutation::Truncate { size } => add(*size..old_len),
            Mutation::Remove => add(0..old_len),
            _ => {}
        }
    }
    if lo >= hi {
        0..0
    } else {
        lo..hi
    }
}

/// Adds to `txn`, before the entry's own mutations, the stash that lets
/// this shard undo `entry`: the old bytes it changes, the old attributes,
/// and whether the object existed.
pub fn stash_before(
    store: &Store,
    coll: CollectionId,
    entry: &LogEntry,
    muts: &[Mutation],
    txn: &mut Transaction,
) -> Result<(), StoreError> {
    if matches!(entry.op, LogOp::Error(_)) {
        return Ok(());
    }
    let o = store_oid(&entry.oid);
    let s = stash_oid(&entry.oid, entry.version.seq);
    remove_stash(store, coll, &s, txn)?;
    let (existed, old_len) = match store.stat(&coll, &o) {
        Ok(st) => (true, st.size),
        Err(StoreError::NoSuchObject { .. }) => (false, 0),
        Err(e) => return Err(e),
    };
    let saved = changed_range(muts, old_len);
    txn.touch(coll, s.clone());
    // Snapshot clones: those made go on rollback; those removed (or
    // replaced by a clone of the same id) are kept beside the stash.
    let (mut made_clones, mut kept_clones) = (Vec::new(), Vec::new());
    for m in muts {
        let (id, made) = match m {
            Mutation::CloneHead { clone } => (*clone, true),
            Mutation::RemoveClone { clone } => (*clone, false),
            _ => continue,
        };
        if made && !made_clones.contains(&id) {
            made_clones.push(id);
        }
        let c = o.clone().with_snap(id);
        if !kept_clones.contains(&id) && store.exists(&coll, &c)? {
            txn.clone_object(coll, c, s.clone().with_snap(id));
            kept_clones.push(id);
        }
    }
    let mut attrs: Vec<(String, Bytes)> = Vec::new();
    if existed {
        if saved.start < saved.end {
            txn.clone_range(
                coll,
                o.clone(),
                s.clone(),
                saved.start,
                saved.end - saved.start,
                saved.start,
            );
        }
        attrs.extend(
            store
                .getattrs(&coll, &o)?
                .into_iter()
                .map(|(k, v)| (k, Bytes::from(v))),
        );
    }
    let rec = RollbackRec {
        existed,
        old_chunk_len: old_len,
        saved,
        made_clones,
        kept_clones,
    };
    attrs.push((ATTR_ROLLBACK.into(), rec.encode()));
    txn.push(cairn_store::Op::SetAttrs {
        coll,
        obj: s,
        attrs,
    });
    Ok(())
}

/// Adds to `txn` the removal of the stashes of `entries` (trimmed from the
/// log, or known to be on every shard).
pub fn drop_stashes<'a>(
    store: &Store,
    coll: CollectionId,
    entries: impl Iterator<Item = &'a LogEntry>,
    txn: &mut Transaction,
) -> Result<(), StoreError> {
    let mut seen = std::collections::HashSet::new();
    for e in entries {
        if !seen.insert(e.version.seq) {
            continue;
        }
        remove_stash(store, coll, &stash_oid(&e.oid, e.version.seq), txn)?;
    }
    Ok(())
}

/// The transaction that undoes `entry` on this shard from its stash (empty
/// when there is no stash: the entry changed nothing here, or was undone).
pub fn rollback_entry(
    store: &Store,
    coll: CollectionId,
    entry: &LogEntry,
) -> Result<Transaction, StoreError> {
    let mut txn = Transaction::new();
    let o = store_oid(&entry.oid);
    let s = stash_oid(&entry.oid, entry.version.seq);
    let Some(rec) = RollbackRec::load(store, &coll, &s)? else {
        return Ok(txn);
    };
    for &c in &rec.made_clones {
        // Touch first: the clone may not have been made here.
        txn.touch(coll, o.clone().with_snap(c));
        txn.remove(coll, o.clone().with_snap(c));
    }
    for &c in &rec.kept_clones {
        txn.clone_object(coll, s.clone().with_snap(c), o.clone().with_snap(c));
        txn.remove(coll, s.clone().with_snap(c));
    }
    let exists_now = store.exists(&coll, &o)?;
    if !rec.existed {
        if exists_now {
            txn.remove(coll, o);
        }
    } else {
        if !exists_now {
            txn.touch(coll, o.clone());
        }
        txn.truncate(coll, o.clone(), rec.old_chunk_len);
        if rec.saved.start < rec.saved.end {
            txn.clone_range(
                coll,
                s.clone(),
                o.clone(),
                rec.saved.start,
                rec.saved.end - rec.saved.start,
                rec.saved.start,
            );
        }
        let old: Vec<(String, Bytes)> = store
            .getattrs(&coll, &s)?
            .into_iter()
            .filter(|(k, _)| k != ATTR_ROLLBACK)
            .map(|(k, v)| (k, Bytes::from(v)))
            .collect();
        if exists_now {
            for k in store.getattrs(&coll, &o)?.into_keys() {
                if !old.iter().any(|(n, _)| *n == k) {
                    txn.rmattr(coll, o.clone(), k);
                }
            }
        }
        txn.push(cairn_store::Op::SetAttrs {
            coll,
            obj: o,
            attrs: old,
        });
    }
    txn.remove(coll, s);
    Ok(txn)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::apply_mutations;

    /// An object's data and attributes.
    type ObjState = (Vec<u8>, Vec<(String, Vec<u8>)>);

    fn store() -> (tempfile::TempDir, Store, CollectionId) {
        let (dir, store) = crate::small_test_store();
        let coll = CollectionId::new(1, 0, 2);
        let mut t = Transaction::new();
        t.create_collection(coll);
        store.commit(t).unwrap();
        (dir, store, coll)
    }

    fn entry(seq: u64, name: &ObjectName) -> LogEntry {
        LogEntry {
            version: Version { epoch: 3, seq },
            prior_version: Version::default(),
            reqid: None,
            oid: name.clone(),
            op: LogOp::Modify,
        }
    }

    /// Applies `muts` as entry `seq` would be on a shard: stash, then write.
    fn apply(store: &Store, coll: CollectionId, name: &ObjectName, seq: u64, muts: &[Mutation]) {
        let mut t = Transaction::new();
        stash_before(store, coll, &entry(seq, name), muts, &mut t).unwrap();
        apply_mutations(&mut t, coll, name, muts);
        store.commit(t).unwrap();
    }

    fn state(store: &Store, coll: CollectionId, name: &ObjectName) -> Option<ObjState> {
        let o = store_oid(name);
        let st = store.stat(&coll, &o).ok()?;
        let data = store.read(&coll, &o, 0, st.size).unwrap();
        Some((
            data,
            store.getattrs(&coll, &o).unwrap().into_iter().collect(),
        ))
    }

    #[test]
    fn stashes_undo_writes_newest_first() {
        let (_d, store, coll) = store();
        let name = ObjectName::new("", "obj");
        let set = |k: &str, v: &[u8]| Mutation::SetAttr {
            name: k.into(),
            value: Bytes::copy_from_slice(v),
        };
        let w = |off: u64, byte: u8, n: usize| Mutation::Write {
            offset: off,
            data: Bytes::from(vec![byte; n]),
        };
        apply(
            &store,
            coll,
            &name,
            1,
            &[
                Mutation::Truncate { size: 16384 },
                w(0, 1, 16384),
                set("_v", b"1"),
            ],
        );
        let s1 = state(&store, coll, &name);
        apply(
            &store,
            coll,
            &name,
            2,
            &[w(4096, 2, 4096), set("u.a", b"x"), set("_v", b"2")],
        );
        let s2 = state(&store, coll, &name);
        apply(
            &store,
            coll,
            &name,
            3,
            &[
                Mutation::Truncate { size: 32768 },
                w(20480, 3, 8192),
                set("_v", b"3"),
            ],
        );
        apply(&store, coll, &name, 4, &[Mutation::Remove]);
        assert!(state(&store, coll, &name).is_none());
        for seq in [4, 3] {
            store
                .commit(rollback_entry(&store, coll, &entry(seq, &name)).unwrap())
                .unwrap();
        }
        assert_eq!(state(&store, coll, &name), s2, "back to entry 2");
        store
            .commit(rollback_entry(&store, coll, &entry(2, &name)).unwrap())
            .unwrap();
        assert_eq!(state(&store, coll, &name), s1, "back to entry 1");
        // Rolling back twice changes nothing; the first entry created it.
        let again = rollback_entry(&store, coll, &entry(2, &name)).unwrap();
        assert!(again.is_empty());
        store
            .commit(rollback_entry(&store, coll, &entry(1, &name)).unwrap())
            .unwrap();
        assert!(state(&store, coll, &name).is_none());
        // No stash is left behind, and none is ever listed.
        let left = store
            .list_objects(&coll, &cairn_store::ListStart::Beginning, 100)
            .unwrap();
        assert!(left.is_empty(), "{left:?}");
    }

    /// A 2+1 object on three shard stores, written as the primary and
    /// the shards would (plan on shard 0, stash + apply on each).
    struct Shards {
        _dirs: Vec<tempfile::TempDir>,
        stores: Vec<Store>,
        coll: CollectionId,
        ec: EcPg,
        name: ObjectName,
        seq: u64,
    }

    impl Shards {
        fn new() -> Shards {
            let mut dirs = Vec::new();
            let mut stores = Vec::new();
            let mut coll = CollectionId::new(1, 0, 0);
            for shard in 0..3u8 {
                let (d, st, _) = store();
                coll = CollectionId::new(1, 0, shard);
                if shard != 2 {
                    // store() made shard 2's collection.
                    let mut t = Transaction::new();
                    t.create_collection(coll);
                    st.commit(t).unwrap();
                }
                dirs.push(d);
                stores.push(st);
            }
            Shards {
                _dirs: dirs,
                stores,
                coll,
                ec: EcPg {
                    code: ErasureCode::new(2, 1, 4096).unwrap(),
                    shards: vec![0, 1, 2],
                    up_shards: vec![0, 1, 2],
                    allow_overwrites: true,
                    pool_name: "ec".into(),
                },
                name: ObjectName::new("", "disk.0"),
                seq: 0,
            }
        }

        fn coll(&self, shard: usize) -> CollectionId {
            CollectionId::new(self.coll.pool, self.coll.seed, shard as u8)
        }

        /// Runs one write request; returns its log entry.
        fn write(&mut self, ops: Vec<SubOp>, snapc: Option<SnapContext>) -> LogEntry {
            self.seq += 1;
            let version = Version {
                epoch: 3,
                seq: self.seq,
            };
            let plan = plan_ops(
                &self.stores[0],
                self.coll(0),
                &self.ec,
                &self.name,
                &ops,
                snapc.as_ref(),
            )
            .unwrap();
            let writes = match plan.data_plan() {
                Some((wp, data)) => wp.build(data, &[]).unwrap(),
                None => Vec::new(),
            };
            let mut e = entry(self.seq, &self.name);
            e.op = log_op(&plan);
            for shard in 0..3 {
                let muts = shard_mutations(&plan, &writes, &self.ec.code, shard, version);
                let (st, c) = (&self.stores[shard], self.coll(shard));
                let mut t = Transaction::new();
                stash_before(st, c, &e, &muts, &mut t).unwrap();
                apply_mutations(&mut t, c, &self.name, &muts);
                st.commit(t).unwrap();
            }
            e
        }

        /// The object at `snap`, decoded from the data shards' chunks.
        fn read_at(&self, snap: u64) -> Option<Vec<u8>> {
            let metas: Vec<ShardMeta> = (0..3)
                .map(|s| load_meta_at(&self.stores[s], self.coll(s), &self.name, snap).unwrap())
                .collect();
            for m in &metas[1..] {
                assert_eq!(
                    (m.exists, m.size, m.version, m.snap),
                    (
                        metas[0].exists,
                        metas[0].size,
                        metas[0].version,
                        metas[0].snap
                    ),
                    "shards disagree at snap {snap}"
                );
            }
            if !metas[0].exists {
                return None;
            }
            let slots: Vec<Option<Bytes>> = (0..3)
                .map(|s| {
                    let o = metas[s].oid(&self.name);
                    let len = self.stores[s].stat(&self.coll(s), &o).unwrap().size;
                    Some(Bytes::from(
                        self.stores[s].read(&self.coll(s), &o, 0, len).unwrap(),
                    ))
                })
                .collect();
            Some(self.ec.code.decode(&slots, metas[0].size).unwrap().to_vec())
        }

        fn rollback(&self, e: &LogEntry) {
            for s in 0..3 {
                let t = rollback_entry(&self.stores[s], self.coll(s), e).unwrap();
                self.stores[s].commit(t).unwrap();
            }
        }

        /// Every store object of every shard (stashes and clones too).
        fn objects(&self) -> Vec<Vec<ObjectId>> {
            (0..3)
                .map(|s| {
                    self.stores[s]
                        .list_objects(&self.coll(s), &cairn_store::ListStart::Beginning, 1000)
                        .unwrap()
                })
                .collect()
        }
    }

    fn full(byte: u8, n: usize) -> Vec<SubOp> {
        vec![SubOp::WriteFull {
            data: Bytes::from(vec![byte; n]),
        }]
    }

    fn ctx(seq: u64, snaps: &[u64]) -> Option<SnapContext> {
        Some(SnapContext {
            seq,
            snaps: snaps.to_vec(),
        })
    }

    #[test]
    fn snapshots_clone_each_shards_chunk_and_roll_back() {
        let mut sh = Shards::new();
        sh.write(full(1, 10_000), ctx(0, &[]));
        // Snapshot 1; the next write clones every shard's chunk first.
        let w2 = sh.write(full(2, 20_000), ctx(1, &[1]));
        assert_eq!(sh.read_at(1), Some(vec![1; 10_000]));
        assert_eq!(sh.read_at(SNAP_HEAD), Some(vec![2; 20_000]));
        // A later write with the same context clones nothing more.
        sh.write(full(3, 5_000), ctx(1, &[1]));
        assert_eq!(sh.read_at(1), Some(vec![1; 10_000]));
        // Snapshot 2 then removal: the head becomes a whiteout.
        let rm = sh.write(vec![SubOp::Remove], ctx(2, &[2, 1]));
        assert_eq!(rm.op, LogOp::Modify, "a whiteout keeps the clones");
        assert_eq!(sh.read_at(SNAP_HEAD), None);
        assert_eq!(sh.read_at(2), Some(vec![3; 5_000]));
        assert_eq!(sh.read_at(1), Some(vec![1; 10_000]));
        // Snapshot 1 removed: SnapTrim drops its clone (rollback puts it back).
        let trim = sh.write(vec![SubOp::SnapTrim], ctx(2, &[2]));
        assert_eq!(sh.read_at(1), None);
        assert_eq!(sh.read_at(2), Some(vec![3; 5_000]));
        sh.rollback(&trim);
        assert_eq!(sh.read_at(1), Some(vec![1; 10_000]), "trim undone");
        // Undo the removal and the cloning write: back to the first object.
        sh.rollback(&rm);
        assert_eq!(sh.read_at(SNAP_HEAD), Some(vec![3; 5_000]));
        sh.rollback(&entry_at(&sh, 3));
        sh.rollback(&w2);
        assert_eq!(sh.read_at(SNAP_HEAD), Some(vec![1; 10_000]));
        assert_eq!(sh.read_at(1), Some(vec![1; 10_000]), "head again");
        for objs in sh.objects() {
            assert_eq!(objs.len(), 2, "head and the first write's stash: {objs:?}");
        }
        // Removing the last snapshot of a whiteout removes the whiteout.
        sh.write(vec![SubOp::Remove], ctx(4, &[4]));
        assert_eq!(sh.read_at(4), Some(vec![1; 10_000]));
        sh.write(vec![SubOp::SnapTrim], ctx(5, &[]));
        assert_eq!(sh.read_at(SNAP_HEAD), None);
        let all: Vec<ObjectId> = sh.objects().concat();
        assert!(
            all.iter().all(|o| is_internal_ns(&o.namespace)),
            "only stashes remain: {all:?}"
        );
    }

    fn entry_at(sh: &Shards, seq: u64) -> LogEntry {
        entry(seq, &sh.name)
    }

    #[test]
    fn changed_range_covers_writes_and_shrinks() {
        let w = |o: u64, n: usize| Mutation::Write {
            offset: o,
            data: Bytes::from(vec![0u8; n]),
        };
        assert_eq!(changed_range(&[w(4096, 4096)], 16384), 4096..8192);
        assert_eq!(changed_range(&[w(16384, 4096)], 16384), 0..0);
        assert_eq!(
            changed_range(&[Mutation::Truncate { size: 4096 }], 16384),
            4096..16384
        );
        assert_eq!(changed_range(&[Mutation::Remove], 100), 0..100);
    }
}
