//! Object operations against the local store: resolving a client request's
//! sub-ops into replicated [`Mutation`]s (checking guards, fixing append
//! offsets), turning mutations into a store [`Transaction`], serving reads,
//! and whole-object state for recovery. Owns the store attribute naming
//! (`u.` user xattrs, `_v` version, `_h` omap header, `_ss` snapshot set);
//! not ordering or replication (see `pg`).
//!
//! Snapshots (replicated pools): a write carrying a [`SnapContext`] newer
//! than the object's snapshot set first clones the head (store object with
//! `snap = clone id`) in the same transaction and log entry; a read at a
//! snapshot resolves to the clone covering it, or the head; removing a head
//! that clones still need leaves an empty "whiteout" head holding the
//! snapshot set; clones whose snapshots are all gone are trimmed by the next
//! write (or `SnapTrim`) carrying the writer's context. Clones travel with
//! their head in [`get_object_state`] / [`put_object_state`].

use bytes::Bytes;
use cairn_ops::{
    LogOp, Mutation, ObjStat, ObjectName, ObjectState, OpError, SnapContext, SubOp, SubOpOutput,
    Version, SNAP_HEAD,
};
use cairn_store::{CollectionId, ObjectId, Store, StoreError, Transaction};
use serde::{Deserialize, Serialize};

/// Store attribute holding the object version.
pub const ATTR_VERSION: &str = "_v";
/// Store attribute holding the omap header.
pub const ATTR_OMAP_HEADER: &str = "_h";
/// Store attribute holding the object's [`SnapSet`] (on the head).
pub const ATTR_SNAPSET: &str = "_ss";
/// Version byte of the snapshot set encoding.
const SNAPSET_VERSION: u8 = 1;
/// Largest snapshot set decoded.
const SNAPSET_MAX_BYTES: usize = 1 << 20;
/// Prefix of user xattrs in the store.
pub const USER_ATTR_PREFIX: &str = "u.";
/// Most omap entries one `OmapList` returns.
pub const OMAP_LIST_MAX: u32 = 10_000;
/// Most objects one `ListObjects` returns.
pub const LIST_OBJECTS_MAX: u32 = 10_000;
/// Omap page size used when copying a whole object.
const OMAP_COPY_PAGE: usize = 4096;

pub fn store_oid(o: &ObjectName) -> ObjectId {
    ObjectId::new(o.hash(), o.name.clone()).with_namespace(o.namespace.clone())
}

pub fn map_store_err(e: StoreError) -> OpError {
    match e {
        StoreError::NoSuchObject { .. } => OpError::NoEnt,
        StoreError::ObjectExists { .. } => OpError::Exists,
        StoreError::StoreFull { .. } => OpError::NoSpace(e.to_string()),
        StoreError::ObjectTooLarge { .. } => OpError::TooBig(e.to_string()),
        StoreError::Invalid(m) => OpError::Invalid(m),
        other => OpError::Io(other.to_string()),
    }
}

pub fn encode_version(v: Version) -> Bytes {
    let mut b = Vec::with_capacity(16);
    b.extend_from_slice(&v.epoch.to_be_bytes());
    b.extend_from_slice(&v.seq.to_be_bytes());
    Bytes::from(b)
}

pub fn decode_version(b: &[u8]) -> Version {
    let part = |r: std::ops::Range<usize>| {
        b.get(r)
            .and_then(|s| <[u8; 8]>::try_from(s).ok())
            .map(u64::from_be_bytes)
            .unwrap_or(0)
    };
    Version {
        epoch: part(0..8),
        seq: part(8..16),
    }
}

/// One clone of an object: its id (the writer's snap seq when it was made),
/// the snapshots it stands for (newest first) and its size.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CloneInfo {
    pub id: u64,
    pub snaps: Vec<u64>,
    pub size: u64,
}

/// An object's snapshot bookkeeping, kept on the head.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SnapSet {
    /// Newest snap seq of a write applied to the object.
    pub seq: u64,
    /// Clones, oldest first (ids increase).
    pub clones: Vec<CloneInfo>,
    /// The head was removed; the store object stays (empty) because clones
    /// still need this snapshot set.
    pub whiteout: bool,
}

impl SnapSet {
    pub fn encode(&self) -> Bytes {
        Bytes::from(cairn_types::encode_versioned(SNAPSET_VERSION, self))
    }

    pub fn decode(b: &[u8]) -> Result<SnapSet, OpError> {
        cairn_types::decode_versioned(
            "snapshot set",
            b,
            SNAPSET_VERSION,
            SNAPSET_VERSION,
            SNAPSET_MAX_BYTES,
        )
        .map(|(_, v)| v)
        .map_err(|e| OpError::Io(e.to_string()))
    }

    /// The snapshot set stored on `head` (default when none or no head).
    pub fn load(store: &Store, coll: &CollectionId, head: &ObjectId) -> Result<SnapSet, OpError> {
        match store.getattr(coll, head, ATTR_SNAPSET) {
            Ok(Some(b)) => SnapSet::decode(&b),
            Ok(None) | Err(StoreError::NoSuchObject { .. }) => Ok(SnapSet::default()),
            Err(e) => Err(map_store_err(e)),
        }
    }

    /// Where a read at `snap` goes: `Some(SNAP_HEAD)` = the head (if it
    /// exists), `Some(id)` = clone `id`, `None` = the object did not exist
    /// at that snapshot.
    pub fn resolve(&self, snap: u64) -> Option<u64> {
        if snap == SNAP_HEAD || snap > self.seq {
            return Some(SNAP_HEAD);
        }
        self.clones
            .iter()
            .find(|c| c.id >= snap)
            .filter(|c| c.snaps.contains(&snap))
            .map(|c| c.id)
    }

    /// Applies a writer's context: drops snapshots the writer says are
    /// gone (returns the clones left with none, to remove), and, if the
    /// context is newer than the last write, records a clone of the head
    /// (`head_size` = Some when the head exists) covering the snapshots
    /// taken since. Returns (clones to remove, clone to make).
    pub fn apply_context(
        &mut self,
        sc: &SnapContext,
        head_size: Option<u64>,
    ) -> (Vec<u64>, Option<u64>) {
        let mut trimmed = Vec::new();
        if sc.seq > 0 {
            for c in &mut self.clones {
                c.snaps.retain(|s| *s > sc.seq || sc.snaps.contains(s));
                if c.snaps.is_empty() {
                    trimmed.push(c.id);
                }
            }
            self.clones.retain(|c| !c.snaps.is_empty());
        }
        let mut made = None;
        if sc.seq > self.seq {
            let covered: Vec<u64> = sc.snaps.iter().copied().filter(|s| *s > self.seq).collect();
            if let (Some(size), false) = (head_size, covered.is_empty()) {
                self.clones.push(CloneInfo {
                    id: sc.seq,
                    snaps: covered,
                    size,
                });
                made = Some(sc.seq);
            }
            self.seq = sc.seq;
        }
        (trimmed, made)
    }
}

/// What a write needs to know of its object's head without reading its
/// data: whether the store object exists (maybe as a whiteout), whether the
/// head exists, its size, version and snapshot set. Loaded from the store
/// in one lookup, or carried from the write before it while that one is
/// still in flight (see `pg::Busy`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectProjection {
    /// The head's store object exists (a whiteout included).
    pub raw_exists: bool,
    /// The head exists for clients (not a whiteout).
    pub exists: bool,
    /// Size of the head (0 when it does not exist).
    pub size: u64,
    /// Version stamped on the head's store object.
    pub version: Version,
    pub snapset: SnapSet,
}

impl ObjectProjection {
    /// The head of `name` as the store holds it durably, from one metadata
    /// lookup (size and xattrs; no data is read).
    pub fn load(
        store: &Store,
        coll: CollectionId,
        name: &ObjectName,
    ) -> Result<ObjectProjection, OpError> {
        // Reading zero bytes past any end returns the size and the xattrs.
        let r = match store.read_with_attrs(&coll, &store_oid(name), u64::MAX, 0) {
            Ok(r) => r,
            Err(StoreError::NoSuchObject { .. }) => return Ok(ObjectProjection::default()),
            Err(e) => return Err(map_store_err(e)),
        };
        let snapset = match r.attrs.get(ATTR_SNAPSET) {
            Some(b) => SnapSet::decode(b)?,
            None => SnapSet::default(),
        };
        let version = r
            .attrs
            .get(ATTR_VERSION)
            .map(|b| decode_version(b))
            .unwrap_or_default();
        let exists = !snapset.whiteout;
        Ok(ObjectProjection {
            raw_exists: true,
            exists,
            size: if exists { r.size } else { 0 },
            version,
            snapset,
        })
    }
}

/// Store objects and bytes of one object in its PG's collection: the
/// head's store object (a whiteout counts, with 0 bytes) and its clones,
/// as the beacon counts a collection. What a write changes of it keeps a
/// PG's object and byte counts without listing the collection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Footprint {
    pub objects: i64,
    pub bytes: i64,
}

impl Footprint {
    /// `self` plus the change from `before` to `after`.
    pub fn moved(self, before: Footprint, after: Footprint) -> Footprint {
        Footprint {
            objects: self.objects + after.objects - before.objects,
            bytes: self.bytes + after.bytes - before.bytes,
        }
    }
}

impl ObjectProjection {
    pub fn footprint(&self) -> Footprint {
        let clone_bytes: u64 = self.snapset.clones.iter().map(|c| c.size).sum();
        Footprint {
            objects: i64::from(self.raw_exists) + self.snapset.clones.len() as i64,
            bytes: i64::try_from(self.size.saturating_add(clone_bytes)).unwrap_or(i64::MAX),
        }
    }
}

/// What a request sees of its object before it runs.
struct View<'a> {
    store: &'a Store,
    coll: CollectionId,
    oid: ObjectId,
    exists: bool,
    size: u64,
    version: Version,
}

impl<'a> View<'a> {
    /// The object as seen at `snap` ([`SNAP_HEAD`] = the head): a whiteout
    /// head, or a snapshot the object did not exist at, reads as absent.
    fn load_at(
        store: &'a Store,
        coll: CollectionId,
        head: ObjectId,
        snap: u64,
    ) -> Result<Self, OpError> {
        let ss = SnapSet::load(store, &coll, &head)?;
        let target = match ss.resolve(snap) {
            Some(SNAP_HEAD) => head,
            Some(clone) => head.with_snap(clone),
            None => {
                return Ok(View {
                    store,
                    coll,
                    oid: head,
                    exists: false,
                    size: 0,
                    version: Version::default(),
                })
            }
        };
        let mut v = View::load(store, coll, target)?;
        if v.oid.snap == SNAP_HEAD && ss.whiteout {
            v.exists = false;
            v.size = 0;
        }
        Ok(v)
    }

    fn load(store: &'a Store, coll: CollectionId, oid: ObjectId) -> Result<Self, OpError> {
        let (exists, size, version) = match store.stat(&coll, &oid) {
            Ok(st) => {
                let v = store
                    .getattr(&coll, &oid, ATTR_VERSION)
                    .map_err(map_store_err)?
                    .map(|b| decode_version(&b))
                    .unwrap_or_default();
                (true, st.size, v)
            }
            Err(StoreError::NoSuchObject { .. }) => (false, 0, Version::default()),
            Err(e) => return Err(map_store_err(e)),
        };
        Ok(View {
            store,
            coll,
            oid,
            exists,
            size,
            version,
        })
    }

    fn need(&self) -> Result<(), OpError> {
        if self.exists {
            Ok(())
        } else {
            Err(OpError::NoEnt)
        }
    }

    fn getattr(&self, name: &str) -> Result<Option<Vec<u8>>, OpError> {
        if !self.exists {
            return Ok(None);
        }
        self.store
            .getattr(&self.coll, &self.oid, name)
            .map_err(map_store_err)
    }

    fn read(&self, offset: u64, len: u64) -> Result<Bytes, OpError> {
        self.need()?;
        let len = if len == 0 {
            self.size.saturating_sub(offset)
        } else {
            len
        };
        self.store
            .read_bytes(&self.coll, &self.oid, offset, len)
            .map_err(map_store_err)
    }

    /// Runs one read or guard sub-op.
    fn run_read(&self, op: &SubOp) -> Result<SubOpOutput, OpError> {
        let (s, c, o) = (self.store, &self.coll, &self.oid);
        Ok(match op {
            SubOp::AssertExists => {
                self.need()?;
                SubOpOutput::None
            }
            SubOp::AssertVersion { version } => {
                if self.version != *version {
                    return Err(OpError::VersionMismatch {
                        actual: self.version,
                    });
                }
                SubOpOutput::None
            }
            SubOp::CmpXattr { name, op, value } => {
                match self.getattr(&format!("{USER_ATTR_PREFIX}{name}"))? {
                    Some(stored) if op.holds(&stored, value) => SubOpOutput::None,
                    Some(_) => return Err(OpError::Canceled),
                    None => return Err(OpError::NoData),
                }
            }
            SubOp::CmpExt { offset, expected } => {
                let mut have = if self.exists {
                    self.read(*offset, expected.len() as u64)?.to_vec()
                } else {
                    Vec::new()
                };
                have.resize(expected.len(), 0);
                if let Some(i) = have.iter().zip(expected.iter()).position(|(a, b)| a != b) {
                    return Err(OpError::CmpMismatch {
                        offset: offset + i as u64,
                    });
                }
                SubOpOutput::None
            }
            SubOp::Read { offset, len } => SubOpOutput::Data(self.read(*offset, *len)?),
            SubOp::Stat => {
                self.need()?;
                SubOpOutput::Stat(ObjStat {
                    size: self.size,
                    version: self.version,
                })
            }
            SubOp::GetXattr { name } => {
                self.need()?;
                match self.getattr(&format!("{USER_ATTR_PREFIX}{name}"))? {
                    Some(v) => SubOpOutput::Data(v.into()),
                    None => return Err(OpError::NoData),
                }
            }
            SubOp::GetXattrs => {
                self.need()?;
                let all = s.getattrs(c, o).map_err(map_store_err)?;
                SubOpOutput::Xattrs(
                    all.into_iter()
                        .filter_map(|(k, v)| {
                            k.strip_prefix(USER_ATTR_PREFIX)
                                .map(|n| (n.to_string(), Bytes::from(v)))
                        })
                        .collect(),
                )
            }
            SubOp::OmapGetHeader => {
                self.need()?;
                SubOpOutput::Data(self.getattr(ATTR_OMAP_HEADER)?.unwrap_or_default().into())
            }
            SubOp::OmapGetVals { keys } => {
                self.need()?;
                let ks: Vec<&[u8]> = keys.iter().map(|k| k.as_ref()).collect();
                let got = s.omap_get(c, o, &ks).map_err(map_store_err)?;
                SubOpOutput::Omap {
                    entries: got.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
                    more: false,
                }
            }
            SubOp::OmapList {
                after,
                limit,
                values,
            } => {
                self.need()?;
                let limit = (*limit).clamp(1, OMAP_LIST_MAX) as usize;
                let mut got = s
                    .omap_range(c, o, after.as_deref(), limit + 1)
                    .map_err(map_store_err)?;
                let more = got.len() > limit;
                got.truncate(limit);
                SubOpOutput::Omap {
                    entries: got
                        .into_iter()
                        .map(|(k, v)| {
                            let v = if *values {
                                Bytes::from(v)
                            } else {
                                Bytes::new()
                            };
                            (Bytes::from(k), v)
                        })
                        .collect(),
                    more,
                }
            }
            other => {
                return Err(OpError::Invalid(format!(
                    "sub-op {other:?} is not a read or guard"
                )))
            }
        })
    }
}

/// The outcome of resolving a write request.
pub struct Resolved {
    /// The object's version before the request.
    pub prior: Version,
    pub mutations: Vec<Mutation>,
    pub outputs: Vec<SubOpOutput>,
    pub log_op: LogOp,
    /// The object's head once the mutations apply.
    pub after: ObjectProjection,
}

fn check_extent(offset: u64, len: u64, max: u64) -> Result<(), OpError> {
    match offset.checked_add(len) {
        Some(end) if end <= max => Ok(()),
        _ => Err(OpError::TooBig(format!(
            "write ending at byte {} exceeds osd_max_object_size ({max} bytes)",
            offset.saturating_add(len)
        ))),
    }
}

/// Resolves a request's sub-ops against the object's current state into the
/// mutations every replica applies, stamping `version`. Guards and reads
/// see the object as it was before the request.
///
/// `snapc` is the writer's snapshot context (see the module comment); `snap`
/// must be [`SNAP_HEAD`] (snapshots are read-only).
pub fn resolve_write(
    store: &Store,
    coll: CollectionId,
    name: &ObjectName,
    ops: &[SubOp],
    version: Version,
    snapc: Option<&SnapContext>,
    snap: u64,
) -> Result<Resolved, OpError> {
    if snap != SNAP_HEAD {
        return Err(OpError::Invalid(format!(
            "snapshot {snap} of {name} is read-only: writes go to the head"
        )));
    }
    let before = ObjectProjection::load(store, coll, name)?;
    resolve_write_from(store, coll, name, &before, ops, version, snapc)
}

/// [`resolve_write`] against `before`, the object's head as the writes
/// before this one leave it. Reads and guards other than existence,
/// version and stat read the store: with writes of the object still in
/// flight `before` is newer than the store, and such requests must wait
/// (`pg::pipelinable`).
pub fn resolve_write_from(
    store: &Store,
    coll: CollectionId,
    name: &ObjectName,
    before: &ObjectProjection,
    ops: &[SubOp],
    version: Version,
    snapc: Option<&SnapContext>,
) -> Result<Resolved, OpError> {
    let raw_exists = before.raw_exists;
    let view = View {
        store,
        coll,
        oid: store_oid(name),
        exists: before.exists,
        size: before.size,
        version: before.version,
    };
    let mut snapset = before.snapset.clone();
    let had_snapset = snapset != SnapSet::default();
    // Clone-on-write and trimming come first (they see the head as it was).
    let mut snap_muts = Vec::new();
    if let Some(sc) = snapc {
        sc.validate()?;
        let (trimmed, made) = snapset.apply_context(sc, view.exists.then_some(view.size));
        snap_muts.extend(
            trimmed
                .into_iter()
                .map(|clone| Mutation::RemoveClone { clone }),
        );
        if let Some(clone) = made {
            snap_muts.push(Mutation::CloneHead { clone });
        }
    }
    let max = store.config().max_object_size;
    let existed = view.exists;
    let (mut exists, mut size) = (view.exists, view.size);
    let mut muts = Vec::new();
    let mut outputs = Vec::with_capacity(ops.len());
    let touch = |exists: &mut bool, muts: &mut Vec<Mutation>| {
        if !*exists {
            muts.push(Mutation::Touch);
            *exists = true;
        }
    };
    for op in ops {
        match op {
            SubOp::WriteFull { data } => {
                check_extent(0, data.len() as u64, max)?;
                muts.push(Mutation::Truncate { size: 0 });
                if !data.is_empty() {
                    muts.push(Mutation::Write {
                        offset: 0,
                        data: data.clone(),
                    });
                }
                exists = true;
                size = data.len() as u64;
            }
            SubOp::Write { offset, data } => {
                check_extent(*offset, data.len() as u64, max)?;
                touch(&mut exists, &mut muts);
                if !data.is_empty() {
                    muts.push(Mutation::Write {
                        offset: *offset,
                        data: data.clone(),
                    });
                    size = size.max(offset + data.len() as u64);
                }
            }
            SubOp::Append { data } => {
                check_extent(size, data.len() as u64, max)?;
                touch(&mut exists, &mut muts);
                if !data.is_empty() {
                    muts.push(Mutation::Write {
                        offset: size,
                        data: data.clone(),
                    });
                    size += data.len() as u64;
                }
            }
            SubOp::Truncate { size: s } => {
                check_extent(*s, 0, max)?;
                muts.push(Mutation::Truncate { size: *s });
                exists = true;
                size = *s;
            }
            SubOp::Zero { offset, len } => {
                if !exists {
                    return Err(OpError::NoEnt);
                }
                if *offset < size {
                    let len = (*len).min(size - offset);
                    muts.push(Mutation::Zero {
                        offset: *offset,
                        len,
                    });
                }
            }
            SubOp::Remove => {
                if !exists {
                    return Err(OpError::NoEnt);
                }
                muts.retain(|_| false);
                if existed {
                    muts.push(Mutation::Remove);
                }
                exists = false;
                size = 0;
            }
            SubOp::Create { exclusive } => {
                if exists && *exclusive {
                    return Err(OpError::Exists);
                }
                touch(&mut exists, &mut muts);
            }
            SubOp::SetXattr { name, value } => {
                touch(&mut exists, &mut muts);
                muts.push(Mutation::SetAttr {
                    name: format!("{USER_ATTR_PREFIX}{name}"),
                    value: value.clone(),
                });
            }
            SubOp::RmXattr { name } => {
                if !exists {
                    return Err(OpError::NoEnt);
                }
                muts.push(Mutation::RmAttr {
                    name: format!("{USER_ATTR_PREFIX}{name}"),
                });
            }
            SubOp::OmapSet { entries } => {
                touch(&mut exists, &mut muts);
                muts.push(Mutation::OmapSet {
                    entries: entries.clone(),
                });
            }
            SubOp::OmapRm { keys } => {
                if !exists {
                    return Err(OpError::NoEnt);
                }
                muts.push(Mutation::OmapRm { keys: keys.clone() });
            }
            SubOp::OmapClear => {
                if !exists {
                    return Err(OpError::NoEnt);
                }
                muts.push(Mutation::OmapClear);
                muts.push(Mutation::RmAttr {
                    name: ATTR_OMAP_HEADER.into(),
                });
            }
            SubOp::OmapSetHeader { header } => {
                touch(&mut exists, &mut muts);
                muts.push(Mutation::SetAttr {
                    name: ATTR_OMAP_HEADER.into(),
                    value: header.clone(),
                });
            }
            SubOp::SnapTrim => {
                if !raw_exists {
                    return Err(OpError::NoEnt);
                }
            }
            SubOp::ListObjects { .. } => {
                return Err(OpError::Invalid(
                    "ListObjects cannot be combined with writes".into(),
                ))
            }
            read => {
                outputs.push(view.run_read(read)?);
                continue;
            }
        }
        outputs.push(SubOpOutput::None);
    }
    let log_op = finish_snapset(
        &mut muts,
        &mut snapset,
        SnapFinish {
            exists,
            existed,
            raw_exists,
            had_snapset,
            version,
        },
    );
    snap_muts.append(&mut muts);
    let after = match log_op {
        LogOp::Delete => ObjectProjection::default(),
        _ => ObjectProjection {
            raw_exists: true,
            exists,
            size: if exists { size } else { 0 },
            version,
            snapset,
        },
    };
    Ok(Resolved {
        prior: view.version,
        mutations: snap_muts,
        outputs,
        log_op,
        after,
    })
}

/// What `finish_snapset` needs to know about the object.
struct SnapFinish {
    /// The head exists after the request.
    exists: bool,
    /// The head existed (not a whiteout) before the request.
    existed: bool,
    /// The head's store object existed before the request (maybe a whiteout).
    raw_exists: bool,
    had_snapset: bool,
    version: Version,
}

/// Ends a write's mutations: stamps the version and snapshot set, turns a
/// removal into a whiteout while clones remain, and removes a whiteout
/// whose last clone went.
fn finish_snapset(muts: &mut Vec<Mutation>, ss: &mut SnapSet, f: SnapFinish) -> LogOp {
    let stamp = |muts: &mut Vec<Mutation>, ss: &SnapSet| {
        muts.push(Mutation::SetAttr {
            name: ATTR_VERSION.into(),
            value: encode_version(f.version),
        });
        muts.push(Mutation::SetAttr {
            name: ATTR_SNAPSET.into(),
            value: ss.encode(),
        });
    };
    if f.exists {
        ss.whiteout = false;
        if f.had_snapset || *ss != SnapSet::default() {
            stamp(muts, ss);
        } else {
            muts.push(Mutation::SetAttr {
                name: ATTR_VERSION.into(),
                value: encode_version(f.version),
            });
        }
        LogOp::Modify
    } else if !ss.clones.is_empty() {
        // Whiteout: an empty head keeps the snapshot set for the clones.
        if f.existed && !muts.iter().any(|m| matches!(m, Mutation::Remove)) {
            muts.push(Mutation::Remove);
        }
        muts.push(Mutation::Touch);
        ss.whiteout = true;
        stamp(muts, ss);
        LogOp::Modify
    } else {
        if f.raw_exists && !f.existed {
            // A whiteout whose last clone was trimmed.
            muts.push(Mutation::Remove);
        }
        LogOp::Delete
    }
}

/// Appends `muts` for object `name` to `txn`.
pub fn apply_mutations(
    txn: &mut Transaction,
    coll: CollectionId,
    name: &ObjectName,
    muts: &[Mutation],
) {
    apply_mutations_known(txn, coll, name, muts, &|_| None)
}

/// [`apply_mutations`] where `crcs_of(data)` gives the verified crcs of a
/// written buffer's leading 4 KiB blocks when they are known (received
/// data: see `cairn_msg::BlockCrcs`), which the store then keeps instead
/// of computing them again.
pub fn apply_mutations_known(
    txn: &mut Transaction,
    coll: CollectionId,
    name: &ObjectName,
    muts: &[Mutation],
    crcs_of: &dyn Fn(&Bytes) -> Option<std::sync::Arc<[u32]>>,
) {
    let o = store_oid(name);
    for m in muts {
        match m {
            Mutation::Touch => txn.touch(coll, o.clone()),
            Mutation::Remove => txn.remove(coll, o.clone()),
            Mutation::Write { offset, data } => match crcs_of(data) {
                Some(crcs) => txn.write_verified(coll, o.clone(), *offset, data.clone(), crcs),
                None => txn.write(coll, o.clone(), *offset, data.clone()),
            },
            Mutation::Truncate { size } => txn.truncate(coll, o.clone(), *size),
            Mutation::Zero { offset, len } => txn.zero(coll, o.clone(), *offset, *len),
            Mutation::SetAttr { name, value } => {
                txn.setattr(coll, o.clone(), name.clone(), value.clone())
            }
            Mutation::RmAttr { name } => txn.rmattr(coll, o.clone(), name.clone()),
            Mutation::OmapSet { entries } => txn.omap_set(coll, o.clone(), entries.clone()),
            Mutation::OmapRm { keys } => txn.omap_rm(coll, o.clone(), keys.clone()),
            Mutation::OmapClear => txn.omap_clear(coll, o.clone()),
            Mutation::CloneHead { clone } => {
                txn.clone_object(coll, o.clone(), o.clone().with_snap(*clone))
            }
            Mutation::RemoveClone { clone } => {
                // Touch first: removing a clone this member never had is not an error.
                txn.touch(coll, o.clone().with_snap(*clone));
                txn.remove(coll, o.clone().with_snap(*clone))
            }
        };
    }
}

/// Serves a read-only request at snapshot `snap` ([`SNAP_HEAD`] = the
/// live object); returns the outputs and the object version.
pub fn execute_read(
    store: &Store,
    coll: CollectionId,
    name: &ObjectName,
    ops: &[SubOp],
    snap: u64,
) -> Result<(Vec<SubOpOutput>, Version), OpError> {
    let view = View::load_at(store, coll, store_oid(name), snap)?;
    let mut out = Vec::with_capacity(ops.len());
    for op in ops {
        out.push(view.run_read(op)?);
    }
    Ok((out, view.version))
}

/// The version of `name`'s head if it exists and is not a whiteout, from
/// one metadata lookup (the data cache checks its entries against it).
pub fn head_version(
    store: &Store,
    coll: CollectionId,
    name: &ObjectName,
) -> Result<Option<Version>, OpError> {
    let attrs = match store.getattrs(&coll, &store_oid(name)) {
        Ok(a) => a,
        Err(StoreError::NoSuchObject { .. }) => return Ok(None),
        Err(e) => return Err(map_store_err(e)),
    };
    if let Some(raw) = attrs.get(ATTR_SNAPSET) {
        if SnapSet::decode(raw)?.whiteout {
            return Ok(None);
        }
    }
    Ok(attrs.get(ATTR_VERSION).map(|b| decode_version(b)))
}

/// One range read of `name`'s head (`len` 0: to its end), answering as
/// `execute_read` of a lone `SubOp::Read` does.
/// One store lookup gives the data, the snapset (a whiteout reads as
/// absent) and the version: the cheapest way to serve a small read.
pub fn read_head_range(
    store: &Store,
    coll: CollectionId,
    name: &ObjectName,
    offset: u64,
    len: u64,
) -> Result<HeadRead, OpError> {
    let r = store
        .read_with_attrs(&coll, &store_oid(name), offset, len)
        .map_err(map_store_err)?;
    if let Some(raw) = r.attrs.get(ATTR_SNAPSET) {
        if SnapSet::decode(raw)?.whiteout {
            return Err(OpError::NoEnt);
        }
    }
    let version = r
        .attrs
        .get(ATTR_VERSION)
        .map(|b| decode_version(b))
        .unwrap_or_default();
    Ok(HeadRead {
        data: r.data,
        data_crc: r.data_crc,
        version,
        size: r.size,
    })
}

/// What [`read_head_range`] read.
pub struct HeadRead {
    pub data: Bytes,
    /// crc32c of `data`, from the block crcs the store verified.
    pub data_crc: u32,
    pub version: Version,
    /// The object's size (so the caller knows whether it got all of it).
    pub size: u64,
}

/// A page of a PG listing: (hash, name) pairs and the resume point.
pub type ListPage = (Vec<(u32, ObjectName)>, Option<cairn_ops::ListCursor>);

/// Lists up to `limit` objects of a PG strictly after `after`.
pub fn list_objects(
    store: &Store,
    coll: CollectionId,
    after: Option<&cairn_ops::ListCursor>,
    limit: u32,
) -> Result<ListPage, OpError> {
    let limit = limit.clamp(1, LIST_OBJECTS_MAX) as usize;
    let start = match after {
        Some(c) => cairn_store::ListStart::After(
            ObjectId::new(c.hash, c.name.clone()).with_namespace(c.namespace.clone()),
        ),
        None => cairn_store::ListStart::Beginning,
    };
    let mut got = store
        .list_objects(&coll, &start, limit + 1)
        .map_err(map_store_err)?;
    let more = got.len() > limit;
    got.truncate(limit);
    let next = if more {
        got.last().map(|o| cairn_ops::ListCursor {
            hash: o.hash,
            namespace: o.namespace.clone(),
            name: o.name.clone(),
        })
    } else {
        None
    };
    Ok((
        got.into_iter()
            // EC rollback stashes are internal objects; clones travel with their head.
            .filter(|o| {
                !crate::ec_exec::is_internal_ns(&o.namespace) && o.snap == cairn_store::SNAP_HEAD
            })
            .map(|o| (o.hash, ObjectName::new(o.namespace, o.name)))
            .collect(),
        next,
    ))
}

/// Lists up to `limit` objects a client sees (no whiteout heads) strictly
/// after `after`. Recovery and backfill use [`list_objects`], which keeps
/// whiteouts (they carry clones).
pub fn list_client_objects(
    store: &Store,
    coll: CollectionId,
    after: Option<&cairn_ops::ListCursor>,
    limit: u32,
) -> Result<ListPage, OpError> {
    let (objs, next) = list_objects(store, coll, after, limit)?;
    let mut out = Vec::with_capacity(objs.len());
    for (h, n) in objs {
        if !SnapSet::load(store, &coll, &store_oid(&n))?.whiteout {
            out.push((h, n));
        }
    }
    Ok((out, next))
}

/// Everything `name` holds (with its clones), or None if it does not exist.
pub fn get_object_state(
    store: &Store,
    coll: CollectionId,
    name: &ObjectName,
) -> Result<Option<ObjectState>, StoreError> {
    let o = store_oid(name);
    let Some(mut head) = read_store_object(store, coll, &o)? else {
        return Ok(None);
    };
    if let Some((_, raw)) = head.attrs.iter().find(|(k, _)| k == ATTR_SNAPSET) {
        let ss = SnapSet::decode(raw).map_err(|e| StoreError::Corrupt(format!("{o}: {e}")))?;
        for c in &ss.clones {
            let clone = o.clone().with_snap(c.id);
            let st = read_store_object(store, coll, &clone)?
                .ok_or_else(|| StoreError::Corrupt(format!("{o}: clone {} is missing", c.id)))?;
            head.clones.push((c.id, st));
        }
    }
    Ok(Some(head))
}

/// One store object's data, attributes and omap (no clones), with the
/// crc32c of its data from the block crcs the read verified.
fn read_store_object(
    store: &Store,
    coll: CollectionId,
    o: &ObjectId,
) -> Result<Option<ObjectState>, StoreError> {
    // One metadata lookup for size, xattrs and data. A big object lands
    // with O_DIRECT in an aligned buffer that travels on as is (recovery,
    // backfill and scrub send it without a copy).
    let read = match store.read_with_attrs(&coll, o, 0, 0) {
        Ok(r) => r,
        Err(StoreError::NoSuchObject { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let attrs = read
        .attrs
        .into_iter()
        .map(|(k, v)| (k, Bytes::from(v)))
        .collect();
    let mut omap = Vec::new();
    loop {
        let after = omap.last().map(|(k, _): &(Bytes, Bytes)| k.clone());
        let page = store.omap_range(&coll, o, after.as_deref(), OMAP_COPY_PAGE)?;
        let n = page.len();
        omap.extend(
            page.into_iter()
                .map(|(k, v)| (Bytes::from(k), Bytes::from(v))),
        );
        if n < OMAP_COPY_PAGE {
            break;
        }
    }
    Ok(Some(ObjectState {
        data: read.data,
        attrs,
        omap,
        clones: Vec::new(),
        data_crc: Some(read.data_crc),
    }))
}

/// Appends to `txn` what makes `name` hold exactly `state` (or not exist),
/// clones included. `exists_now` says whether the head exists in the store
/// before `txn`. Clones this member has that `state` lacks are left (never
/// read: reads go through the head's snapshot set) until trimmed.
pub fn put_object_state(
    txn: &mut Transaction,
    coll: CollectionId,
    name: &ObjectName,
    exists_now: bool,
    state: Option<&ObjectState>,
) {
    put_object_state_known(txn, coll, name, exists_now, state, &|_| None)
}

/// [`put_object_state`] where `crcs_of(data)` gives the verified crcs of
/// a data buffer's leading 4 KiB blocks when they are known (a copy
/// message's data, checked by the messenger as it arrived): the store
/// keeps them instead of computing them again (see
/// [`apply_mutations_known`]).
pub fn put_object_state_known(
    txn: &mut Transaction,
    coll: CollectionId,
    name: &ObjectName,
    exists_now: bool,
    state: Option<&ObjectState>,
    crcs_of: &dyn Fn(&Bytes) -> Option<std::sync::Arc<[u32]>>,
) {
    let o = store_oid(name);
    if exists_now {
        txn.remove(coll, o.clone());
    }
    let Some(st) = state else { return };
    for (id, clone) in &st.clones {
        let c = o.clone().with_snap(*id);
        // Touch then remove: replaces a stale clone of the same id, if any.
        txn.touch(coll, c.clone());
        txn.remove(coll, c.clone());
        write_store_object(txn, coll, c, clone, crcs_of);
    }
    write_store_object(txn, coll, o, st, crcs_of);
}

fn write_store_object(
    txn: &mut Transaction,
    coll: CollectionId,
    o: ObjectId,
    st: &ObjectState,
    crcs_of: &dyn Fn(&Bytes) -> Option<std::sync::Arc<[u32]>>,
) {
    txn.touch(coll, o.clone());
    if !st.data.is_empty() {
        match crcs_of(&st.data) {
            Some(crcs) => txn.write_verified(coll, o.clone(), 0, st.data.clone(), crcs),
            None => txn.write(coll, o.clone(), 0, st.data.clone()),
        };
    }
    if !st.attrs.is_empty() {
        txn.push(cairn_store::Op::SetAttrs {
            coll,
            obj: o.clone(),
            attrs: st.attrs.clone(),
        });
    }
    if !st.omap.is_empty() {
        txn.omap_set(coll, o, st.omap.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_object_state_replaces_an_existing_object() {
        let (_dir, store) = crate::small_test_store();
        let coll = CollectionId::pg(1, 0);
        let name = ObjectName::new("", "o");
        let mut t = Transaction::new();
        t.create_collection(coll);
        put_object_state(
            &mut t,
            coll,
            &name,
            false,
            Some(&ObjectState {
                data: Bytes::from(vec![1u8; 40960]),
                attrs: vec![("_v".into(), encode_version(Version { epoch: 1, seq: 1 }))],
                omap: vec![],
                clones: vec![],
                data_crc: None,
            }),
        );
        store.commit(t).unwrap();
        let new = ObjectState {
            data: Bytes::from(vec![2u8; 32768]),
            attrs: vec![("_v".into(), encode_version(Version { epoch: 2, seq: 5 }))],
            omap: vec![(Bytes::from_static(b"k"), Bytes::from_static(b"v"))],
            clones: vec![],
            data_crc: None,
        };
        let mut t = Transaction::new();
        put_object_state(&mut t, coll, &name, true, Some(&new));
        store.commit(t).unwrap();
        assert_eq!(get_object_state(&store, coll, &name).unwrap(), Some(new));
    }

    #[test]
    fn a_read_state_carries_its_data_crc_and_known_block_crcs_install_it() {
        let (_dir, store) = crate::small_test_store();
        let coll = CollectionId::pg(1, 0);
        let name = ObjectName::new("", "o");
        // Big enough for the store's O_DIRECT read path, with a short tail.
        let data: Vec<u8> = (0..(1u32 << 20) + 100)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let st = ObjectState {
            data: Bytes::from(data.clone()),
            attrs: vec![("_v".into(), encode_version(Version { epoch: 1, seq: 1 }))],
            omap: vec![],
            clones: vec![],
            data_crc: None,
        };
        // Installed under the crcs a receiver's messenger would give.
        let blocks: std::sync::Arc<[u32]> = data
            .chunks_exact(cairn_types::crc::CRC_BLOCK_BYTES)
            .map(crc32c::crc32c)
            .collect();
        let mut t = Transaction::new();
        t.create_collection(coll);
        let known = |d: &Bytes| (d.len() == data.len()).then(|| blocks.clone());
        put_object_state_known(&mut t, coll, &name, false, Some(&st), &known);
        store.commit(t).unwrap();
        let read = get_object_state(&store, coll, &name).unwrap().unwrap();
        assert_eq!(read, st);
        assert_eq!(read.data_crc, Some(crc32c::crc32c(&data)));
        let missing = ObjectName::new("", "none");
        assert_eq!(get_object_state(&store, coll, &missing).unwrap(), None);
    }
}

#[cfg(test)]
mod snap_tests {
    use super::*;

    struct Obj {
        _dir: tempfile::TempDir,
        store: Store,
        coll: CollectionId,
        name: ObjectName,
        seq: u64,
    }

    impl Obj {
        fn new() -> Obj {
            let (dir, store) = crate::small_test_store();
            let coll = CollectionId::pg(1, 0);
            let mut t = Transaction::new();
            t.create_collection(coll);
            store.commit(t).unwrap();
            Obj {
                _dir: dir,
                store,
                coll,
                name: ObjectName::new("", "disk.0"),
                seq: 0,
            }
        }

        fn write(&mut self, ops: Vec<SubOp>, snapc: Option<SnapContext>) -> Result<LogOp, OpError> {
            self.seq += 1;
            let v = Version {
                epoch: 1,
                seq: self.seq,
            };
            let before = ObjectProjection::load(&self.store, self.coll, &self.name)?;
            let count_before = self.count();
            let r = resolve_write(
                &self.store,
                self.coll,
                &self.name,
                &ops,
                v,
                snapc.as_ref(),
                SNAP_HEAD,
            )?;
            let mut t = Transaction::new();
            apply_mutations(&mut t, self.coll, &self.name, &r.mutations);
            self.store.commit(t).unwrap();
            // The beacon's count of the collection follows the footprint.
            assert_eq!(
                count_before.moved(before.footprint(), r.after.footprint()),
                self.count(),
                "after {ops:?}"
            );
            // The state a pipelined write would start from is what the
            // store shows once this one is durable.
            assert_eq!(
                ObjectProjection::load(&self.store, self.coll, &self.name).unwrap(),
                r.after
            );
            Ok(r.log_op)
        }

        /// The collection's objects and bytes as the beacon counts them.
        fn count(&self) -> Footprint {
            let (objects, bytes) = crate::beacon::count_collection(&self.store, self.coll).unwrap();
            Footprint {
                objects: objects as i64,
                bytes: bytes as i64,
            }
        }

        fn read_at(&self, snap: u64) -> Result<Vec<u8>, OpError> {
            let (out, _) = execute_read(
                &self.store,
                self.coll,
                &self.name,
                &[SubOp::Read { offset: 0, len: 0 }],
                snap,
            )?;
            match &out[0] {
                SubOpOutput::Data(d) => Ok(d.to_vec()),
                o => panic!("{o:?}"),
            }
        }

        fn clones(&self) -> Vec<u64> {
            SnapSet::load(&self.store, &self.coll, &store_oid(&self.name))
                .unwrap()
                .clones
                .iter()
                .map(|c| c.id)
                .collect()
        }
    }

    fn put(d: &[u8]) -> Vec<SubOp> {
        vec![SubOp::WriteFull {
            data: Bytes::copy_from_slice(d),
        }]
    }

    fn sc(seq: u64, snaps: &[u64]) -> Option<SnapContext> {
        Some(SnapContext {
            seq,
            snaps: snaps.to_vec(),
        })
    }

    #[test]
    fn first_write_after_a_snapshot_preserves_the_old_content() {
        let mut o = Obj::new();
        o.write(put(b"one"), sc(0, &[])).unwrap();
        o.write(put(b"two"), sc(3, &[3])).unwrap();
        o.write(put(b"three"), sc(3, &[3])).unwrap();
        assert_eq!(o.read_at(SNAP_HEAD).unwrap(), b"three");
        assert_eq!(o.read_at(3).unwrap(), b"one");
        assert_eq!(o.read_at(2), Err(OpError::NoEnt), "no snapshot 2 was taken");
        assert_eq!(o.read_at(4).unwrap(), b"three");
        o.write(put(b"four"), sc(5, &[5, 3])).unwrap();
        assert_eq!(o.read_at(5).unwrap(), b"three");
        assert_eq!(o.read_at(3).unwrap(), b"one");
        assert_eq!(o.clones(), vec![3, 5]);
        // A snapshot read cannot write.
        let e = resolve_write(
            &o.store,
            o.coll,
            &o.name,
            &put(b"x"),
            Version::default(),
            None,
            3,
        );
        assert!(matches!(e, Err(OpError::Invalid(_))));
    }

    #[test]
    fn objects_created_after_a_snapshot_do_not_exist_in_it() {
        let mut o = Obj::new();
        o.write(put(b"new"), sc(4, &[4, 2])).unwrap();
        assert_eq!(o.read_at(4), Err(OpError::NoEnt));
        assert_eq!(o.read_at(2), Err(OpError::NoEnt));
        assert_eq!(o.read_at(SNAP_HEAD).unwrap(), b"new");
        assert!(o.clones().is_empty());
    }

    #[test]
    fn removing_a_head_keeps_a_whiteout_while_clones_need_it() {
        let mut o = Obj::new();
        o.write(put(b"data"), None).unwrap();
        assert_eq!(
            o.write(vec![SubOp::Remove], sc(2, &[2])).unwrap(),
            LogOp::Modify
        );
        assert_eq!(o.read_at(SNAP_HEAD), Err(OpError::NoEnt));
        assert_eq!(o.read_at(2).unwrap(), b"data");
        let page = list_client_objects(&o.store, o.coll, None, 10).unwrap().0;
        assert!(page.is_empty(), "a whiteout is not listed to clients");
        assert_eq!(list_objects(&o.store, o.coll, None, 10).unwrap().0.len(), 1);
        // Recreate, then drop the snapshot: the next write trims the clone.
        o.write(put(b"again"), sc(2, &[2])).unwrap();
        assert_eq!(o.read_at(2).unwrap(), b"data");
        o.write(vec![SubOp::SnapTrim], sc(2, &[])).unwrap();
        assert!(o.clones().is_empty());
        assert_eq!(o.read_at(SNAP_HEAD).unwrap(), b"again");
        assert!(!o
            .store
            .exists(&o.coll, &store_oid(&o.name).with_snap(2))
            .unwrap());
    }

    #[test]
    fn trimming_the_last_clone_of_a_whiteout_removes_the_object() {
        let mut o = Obj::new();
        o.write(put(b"data"), None).unwrap();
        o.write(vec![SubOp::Remove], sc(2, &[2])).unwrap();
        assert_eq!(
            o.write(vec![SubOp::SnapTrim], sc(2, &[])).unwrap(),
            LogOp::Delete
        );
        assert!(!o.store.exists(&o.coll, &store_oid(&o.name)).unwrap());
        assert_eq!(
            o.write(vec![SubOp::SnapTrim], sc(2, &[])),
            Err(OpError::NoEnt)
        );
    }

    #[test]
    fn clones_travel_with_their_head() {
        let mut o = Obj::new();
        o.write(put(b"old"), None).unwrap();
        o.write(put(b"new"), sc(7, &[7])).unwrap();
        let st = get_object_state(&o.store, o.coll, &o.name)
            .unwrap()
            .unwrap();
        assert_eq!(st.clones.len(), 1);
        let mut other = Obj::new();
        let mut t = Transaction::new();
        put_object_state(&mut t, other.coll, &other.name, false, Some(&st));
        other.store.commit(t).unwrap();
        assert_eq!(other.read_at(7).unwrap(), b"old");
        assert_eq!(other.read_at(SNAP_HEAD).unwrap(), b"new");
        // Replacing again (exists_now) keeps it whole.
        let mut t = Transaction::new();
        put_object_state(&mut t, other.coll, &other.name, true, Some(&st));
        other.store.commit(t).unwrap();
        assert_eq!(other.read_at(7).unwrap(), b"old");
        other.seq = 10;
        other.write(put(b"newer"), sc(7, &[7])).unwrap();
        assert_eq!(other.read_at(7).unwrap(), b"old");
    }

    /// A mixed run of writes (snapshots, removal to a whiteout, appends,
    /// truncates, attributes), one request at a time.
    fn script() -> Vec<(Vec<SubOp>, Option<SnapContext>)> {
        let b = |d: &[u8]| Bytes::copy_from_slice(d);
        vec![
            (put(b"one"), None),
            (vec![SubOp::Append { data: b(b"+a") }], None),
            (
                vec![SubOp::Write {
                    offset: 10,
                    data: b(b"far"),
                }],
                sc(2, &[2]),
            ),
            (
                vec![SubOp::AssertExists, SubOp::Truncate { size: 4 }],
                sc(2, &[2]),
            ),
            (
                vec![SubOp::Zero {
                    offset: 1,
                    len: 100,
                }],
                sc(2, &[2]),
            ),
            (
                vec![SubOp::SetXattr {
                    name: "k".into(),
                    value: b(b"v"),
                }],
                sc(2, &[2]),
            ),
            (vec![SubOp::Remove], sc(5, &[5, 2])),
            (vec![SubOp::Zero { offset: 0, len: 1 }], sc(5, &[5, 2])),
            (
                vec![
                    SubOp::Create { exclusive: true },
                    SubOp::Append { data: b(b"x") },
                ],
                sc(5, &[5, 2]),
            ),
            (
                vec![
                    SubOp::Stat,
                    SubOp::OmapSet {
                        entries: vec![(b(b"a"), b(b"1"))],
                    },
                ],
                sc(5, &[5]),
            ),
            (vec![SubOp::Remove], sc(7, &[7])),
            (vec![SubOp::SnapTrim], sc(7, &[])),
            (vec![SubOp::Append { data: b(b"again") }], None),
        ]
    }

    #[test]
    fn write_footprints_keep_the_collections_count() {
        // `Obj::write` checks that every write changes the full count of
        // the collection by what it changes of the object's footprint:
        // creates, appends, truncates, clones, removals to a whiteout,
        // trims, deletes.
        let mut o = Obj::new();
        for (ops, snapc) in script() {
            let _ = o.write(ops, snapc);
        }
        for (ops, snapc) in [
            (vec![SubOp::Remove], sc(9, &[9])),
            (vec![SubOp::SnapTrim], sc(9, &[])),
        ] {
            o.write(ops, snapc).unwrap();
        }
        assert_eq!(o.count(), Footprint::default(), "everything removed");
    }

    #[test]
    fn writes_resolved_from_projections_match_writes_resolved_from_the_store() {
        // One at a time, each resolved once the previous is durable.
        let mut serial = Obj::new();
        let mut expect = Vec::new();
        for (ops, snapc) in script() {
            expect.push(serial.write(ops, snapc).map_err(|e| format!("{e:?}")));
        }
        // All resolved back to back from the projection chain, submitted
        // without waiting for any (as a pipelined primary does).
        let o = Obj::new();
        let mut before = ObjectProjection::load(&o.store, o.coll, &o.name).unwrap();
        let mut handles = Vec::new();
        let mut got = Vec::new();
        for (i, (ops, snapc)) in script().into_iter().enumerate() {
            let v = Version {
                epoch: 1,
                seq: i as u64 + 1,
            };
            match resolve_write_from(&o.store, o.coll, &o.name, &before, &ops, v, snapc.as_ref()) {
                Ok(r) => {
                    let mut t = Transaction::new();
                    apply_mutations(&mut t, o.coll, &o.name, &r.mutations);
                    handles.push(o.store.submit(t).unwrap());
                    got.push(Ok(r.log_op));
                    before = r.after;
                }
                Err(e) => got.push(Err(format!("{e:?}"))),
            }
        }
        for h in handles {
            h.wait().unwrap();
        }
        assert_eq!(got, expect);
        assert_eq!(
            ObjectProjection::load(&o.store, o.coll, &o.name).unwrap(),
            before
        );
        assert_eq!(
            get_object_state(&o.store, o.coll, &o.name).unwrap(),
            get_object_state(&serial.store, serial.coll, &serial.name).unwrap()
        );
    }
}
