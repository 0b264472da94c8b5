//! Applies one group-commit batch of transactions inside a single redb write
//! transaction: object data goes to freshly allocated blocks (copy-on-write,
//! never overwriting committed blocks), metadata to the KV tables. Every
//! metadata change and every block image written here is also recorded in the
//! group's [`RedoLog`] (what the WAL record carries). Owns op semantics; the
//! commit pipeline around it lives in `store.rs`.

use crate::error::{Result, StoreError};
use crate::extcache::ExtentCache;
use crate::ids::{CollectionId, ObjectId};
use crate::meta::*;
use crate::overlay::{
    merge, no_stop, GroupChanges, KvRead, ReadView, Src, Val, TABLES, TID_EXTENTS,
};
use crate::store::Inner;
use crate::txn::{Op, Transaction};
use crate::wal::SharedRedo;
use cairn_types::crc::CRC_BLOCK_BYTES;
use redb::{ReadableTable, Table, WriteTransaction};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

type KvTable<'w> = Table<'w, &'static [u8], &'static [u8]>;

/// Where a [`LoggedTable`]'s changes go.
enum Back<'w> {
    /// Straight into a redb write transaction (replay, checkpoints, the
    /// direct path of a group too large for one WAL record).
    Redb(KvTable<'w>),
    /// Into a group-local map over a read view (redb snapshot + overlay):
    /// the normal path, where redb gets the changes later, at a checkpoint.
    Overlay {
        view: &'w ReadView,
        local: BTreeMap<Vec<u8>, Val>,
        /// The committer's cache of whole extent maps (extents table only).
        cache: Option<&'w RefCell<ExtentCache>>,
    },
}

/// A metadata table whose every change is also written to the group's redo
/// log (what the WAL record carries).
pub(crate) struct LoggedTable<'w> {
    back: Back<'w>,
    /// Table id in WAL records (index into `wal::TABLE_NAMES`).
    id: u8,
    redo: SharedRedo,
}

impl<'w> LoggedTable<'w> {
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        match &self.back {
            Back::Redb(t) => Ok(t.get(key)?.map(|v| v.value().to_vec())),
            Back::Overlay { view, local, .. } => match local.get(key) {
                Some(v) => Ok(v.as_ref().map(|v| v.to_vec())),
                None => view.kv_get(self.id, key),
            },
        }
    }
    /// Up to `limit` entries of `[lo, hi)` in key order.
    pub fn scan(&self, lo: &[u8], hi: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        match &self.back {
            Back::Redb(t) => scan_redb(t, lo, hi, limit),
            Back::Overlay { view, local, .. } => {
                view.scan_under(local, self.id, lo, hi, limit, false, &no_stop)
            }
        }
    }
    /// Entries of `[lo, hi)` from the last one backwards, up to and including
    /// the first whose key `stop` accepts (see [`KvRead::kv_rev_until`]).
    pub fn rev_until(
        &self,
        lo: &[u8],
        hi: &[u8],
        stop: &dyn Fn(&[u8]) -> bool,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        match &self.back {
            Back::Redb(t) => {
                let mut out = Vec::new();
                if lo >= hi {
                    return Ok(out);
                }
                for e in t.range::<&[u8]>(lo..hi)?.rev() {
                    let (k, v) = e?;
                    let done = stop(k.value());
                    out.push((k.value().to_vec(), v.value().to_vec()));
                    if done {
                        break;
                    }
                }
                Ok(out)
            }
            Back::Overlay { view, local, cache } => {
                if let Some(c) = cache {
                    if let Some(r) = cached_rev_until(view, local, c, lo, hi, stop)? {
                        return Ok(r);
                    }
                }
                view.scan_under(local, self.id, lo, hi, usize::MAX, true, stop)
            }
        }
    }
    pub fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.redo.borrow_mut().put(self.id, key, value);
        match &mut self.back {
            Back::Redb(t) => {
                t.insert(key, value)?;
            }
            Back::Overlay { local, .. } => {
                overflow_check(&self.redo)?;
                local.insert(key.to_vec(), Some(Arc::from(value)));
            }
        }
        Ok(())
    }
    /// Removes a key the caller just read (so it exists): no lookup first.
    pub fn remove_existing(&mut self, key: &[u8]) -> Result<()> {
        match &mut self.back {
            Back::Redb(_) => self.remove(key),
            Back::Overlay { local, .. } => {
                self.redo.borrow_mut().delete(self.id, key);
                overflow_check(&self.redo)?;
                local.insert(key.to_vec(), None);
                Ok(())
            }
        }
    }
    pub fn remove(&mut self, key: &[u8]) -> Result<()> {
        match &mut self.back {
            Back::Redb(t) => {
                if t.remove(key)?.is_some() {
                    self.redo.borrow_mut().delete(self.id, key);
                }
            }
            Back::Overlay { .. } => {
                if self.get(key)?.is_some() {
                    self.redo.borrow_mut().delete(self.id, key);
                    overflow_check(&self.redo)?;
                    if let Back::Overlay { local, .. } = &mut self.back {
                        local.insert(key.to_vec(), None);
                    }
                }
            }
        }
        Ok(())
    }
}

/// Key/value pairs in scan order.
type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// [`LoggedTable::rev_until`] on the extents table through the committer's
/// extent cache: the object's whole map is loaded from the view on first
/// use, then the group's own changes are merged over the cached map. None
/// when the range is not within one object or the object is not cacheable.
fn cached_rev_until(
    view: &ReadView,
    local: &BTreeMap<Vec<u8>, Val>,
    cache: &RefCell<ExtentCache>,
    lo: &[u8],
    hi: &[u8],
    stop: &dyn Fn(&[u8]) -> bool,
) -> Result<Option<Entries>> {
    let (Some((id, b_lo)), Some((id_hi, b_hi))) = (ext_key_parse(lo), ext_key_parse(hi)) else {
        return Ok(None);
    };
    if id != id_hi || b_lo >= b_hi {
        return Ok(None);
    }
    let mut c = cache.borrow_mut();
    if !c.contains(id) {
        if !c.may_load(id) {
            return Ok(None);
        }
        let max = c.max_object_extents();
        let all = view.kv_scan(
            TID_EXTENTS,
            &ext_key(id, 0),
            &ext_key(id, u64::MAX),
            max + 1,
        )?;
        if all.len() > max {
            c.set_too_large(id);
            return Ok(None);
        }
        let mut ext = Vec::with_capacity(all.len());
        for (k, v) in all {
            let (_, lb) =
                ext_key_parse(&k).ok_or_else(|| StoreError::Corrupt("bad extent key".into()))?;
            ext.push((lb, v));
        }
        c.load(id, ext);
    }
    let Some(map) = c.object(id) else {
        return Ok(None);
    };
    let l = local.range::<[u8], _>((Bound::Included(lo), Bound::Excluded(hi)));
    let local_src: Src<'_> = Box::new(
        l.rev()
            .map(|(k, v)| Ok((k.clone(), v.as_ref().map(|v| v.to_vec())))),
    );
    let cached: Src<'_> = Box::new(
        map.range(b_lo..b_hi)
            .rev()
            .map(move |(lb, v)| Ok((ext_key(id, *lb).to_vec(), Some(v.to_vec())))),
    );
    merge(vec![local_src, cached], true, usize::MAX, stop).map(Some)
}

/// On the overlay path a group whose redo log overflowed stops at once (it
/// is redone on the direct path), so its local changes stay bounded.
fn overflow_check(redo: &SharedRedo) -> Result<()> {
    if redo.borrow().overflowed() {
        return Err(StoreError::Kv(
            "commit group too large for one WAL record".into(),
        ));
    }
    Ok(())
}

fn scan_redb<T: ReadableTable<&'static [u8], &'static [u8]>>(
    t: &T,
    lo: &[u8],
    hi: &[u8],
    limit: usize,
) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    if lo >= hi {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for e in t.range::<&[u8]>(lo..hi)?.take(limit) {
        let (k, v) = e?;
        out.push((k.value().to_vec(), v.value().to_vec()));
    }
    Ok(out)
}

/// Longest run of blocks one extent record covers.
pub(crate) const MAX_RUN_BYTES: u64 = 256 << 10;
/// Largest total size of one object's xattrs.
pub const MAX_ATTR_BYTES: usize = 64 << 10;
/// Copies (clone, clone-range) move data in chunks of this size.
const COPY_CHUNK_BYTES: u64 = 4 << 20;
/// Range deletions remove at most this many keys per step (bounded memory).
const DELETE_CHUNK_KEYS: usize = 4096;

pub(crate) struct Tables<'w> {
    pub sup: LoggedTable<'w>,
    pub colls: LoggedTable<'w>,
    pub objects: LoggedTable<'w>,
    pub extents: LoggedTable<'w>,
    pub omap: LoggedTable<'w>,
    pub pgmeta: LoggedTable<'w>,
    pub pglog: LoggedTable<'w>,
}

impl<'w> Tables<'w> {
    /// Opens every table of `w`, logging changes to `redo`.
    pub fn open(w: &'w WriteTransaction, redo: &SharedRedo) -> Result<Tables<'w>> {
        let mut t = Vec::with_capacity(TABLES);
        for id in 0..TABLES as u8 {
            t.push(LoggedTable {
                back: Back::Redb(w.open_table(crate::overlay::table_def(id))?),
                id,
                redo: redo.clone(),
            });
        }
        Ok(Tables::from_vec(t))
    }
    /// Tables that collect changes in memory over `view` (see
    /// [`Tables::into_changes`]); extent lookups go through `cache`.
    pub fn over(
        view: &'w ReadView,
        redo: &SharedRedo,
        cache: Option<&'w RefCell<ExtentCache>>,
    ) -> Tables<'w> {
        let t = (0..TABLES as u8)
            .map(|id| LoggedTable {
                back: Back::Overlay {
                    view,
                    local: BTreeMap::new(),
                    cache: cache.filter(|_| id == TID_EXTENTS),
                },
                id,
                redo: redo.clone(),
            })
            .collect();
        Tables::from_vec(t)
    }
    fn from_vec(v: Vec<LoggedTable<'w>>) -> Tables<'w> {
        let mut it = v.into_iter();
        let mut next = || it.next().expect("one table per id");
        Tables {
            sup: next(),
            colls: next(),
            objects: next(),
            extents: next(),
            omap: next(),
            pgmeta: next(),
            pglog: next(),
        }
    }
    /// The final state of every key this group touched (overlay tables only).
    pub fn into_changes(self) -> GroupChanges {
        let mut kv = Vec::new();
        for t in [
            self.sup,
            self.colls,
            self.objects,
            self.extents,
            self.omap,
            self.pgmeta,
            self.pglog,
        ] {
            if let Back::Overlay { local, .. } = t.back {
                kv.extend(local.into_iter().map(|(k, v)| (t.id, k, v)));
            }
        }
        GroupChanges { kv }
    }
    /// The table with WAL id `id`.
    pub fn by_id(&mut self, id: u8) -> Option<&mut LoggedTable<'w>> {
        Some(match id {
            0 => &mut self.sup,
            1 => &mut self.colls,
            2 => &mut self.objects,
            3 => &mut self.extents,
            4 => &mut self.omap,
            5 => &mut self.pgmeta,
            6 => &mut self.pglog,
            _ => return None,
        })
    }
    fn by_id_ref(&self, id: u8) -> Result<&LoggedTable<'w>> {
        Ok(match id {
            0 => &self.sup,
            1 => &self.colls,
            2 => &self.objects,
            3 => &self.extents,
            4 => &self.omap,
            5 => &self.pgmeta,
            6 => &self.pglog,
            _ => return Err(StoreError::Corrupt(format!("no metadata table {id}"))),
        })
    }
}

impl KvRead for Tables<'_> {
    fn kv_get(&self, table: u8, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.by_id_ref(table)?.get(key)
    }
    fn kv_scan(
        &self,
        table: u8,
        lo: &[u8],
        hi: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.by_id_ref(table)?.scan(lo, hi, limit)
    }
    fn kv_rev_until(
        &self,
        table: u8,
        lo: &[u8],
        hi: &[u8],
        stop: &dyn Fn(&[u8]) -> bool,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.by_id_ref(table)?.rev_until(lo, hi, stop)
    }
}

/// Data of a block-aligned write that the submitting thread already put in
/// freshly allocated blocks, so the committer only maps it. Large writes go
/// there with O_DIRECT and are synced before the WAL record; small ones
/// (`image`) through the page cache, and the WAL record carries their bytes.
#[derive(Debug)]
pub(crate) struct Prewrite {
    pub runs: Vec<(u64, u64)>,
    pub crcs: Vec<u32>,
    /// The written bytes, for a deferred (small) write.
    pub image: Option<bytes::Bytes>,
}

/// State of one batch attempt.
pub(crate) struct Batch<'a, 'w> {
    pub inner: &'a Inner,
    pub t: Tables<'w>,
    /// Blocks allocated in this attempt (returned to the allocator on abort).
    pub allocated: Vec<(u64, u64)>,
    /// Blocks released by this attempt (reusable only after commit and readers drain).
    pub freed: Vec<(u64, u64)>,
    /// The part of `freed` released by zero, truncate and remove: given back
    /// to the filesystem (punched) when released. Blocks freed by an
    /// overwrite are not punched: the allocator hands them out again soon.
    pub discarded: Vec<(u64, u64)>,
    pub data_dirty: bool,
    /// Where block images written by this attempt are recorded (the WAL record).
    pub redo: SharedRedo,
    pub next_id: u64,
    pub next_id_dirty: bool,
    /// The metadata filesystem is below its reserve: refuse ops that grow anything.
    pub meta_low: bool,
}

fn grows(op: &Op) -> bool {
    !matches!(
        op,
        Op::Remove(..)
            | Op::RemoveCollection(_)
            | Op::Truncate { .. }
            | Op::Zero { .. }
            | Op::RmAttr { .. }
            | Op::OmapRm { .. }
            | Op::OmapClear(..)
            | Op::OmapRmRange { .. }
            | Op::LogTrim { .. }
            | Op::MetaRm { .. }
    )
}

impl<'a, 'w> Batch<'a, 'w> {
    pub fn apply(&mut self, txn: &Transaction, pre: &[Option<Prewrite>]) -> Result<()> {
        if self.meta_low && txn.ops.iter().any(grows) {
            return Err(StoreError::StoreFull {
                what: "metadata filesystem is below meta_reserve_bytes; only deletions commit",
                needed_bytes: txn.payload_bytes(),
                available_bytes: 0,
            });
        }
        for (i, op) in txn.ops.iter().enumerate() {
            match (op, pre.get(i).and_then(|p| p.as_ref())) {
                (
                    Op::Write {
                        coll, obj, offset, ..
                    },
                    Some(pw),
                ) => {
                    let mut on = self.onode_or_new(coll, obj)?;
                    let size0 = on.size;
                    self.write_prewritten(coll, obj, &mut on, *offset, pw)?;
                    self.put_onode_if_resized(coll, obj, &on, size0)?;
                }
                _ => {
                    let before = self.freed.len();
                    self.apply_op(op)?;
                    if matches!(op, Op::Zero { .. } | Op::Truncate { .. } | Op::Remove(..)) {
                        let gone = self.freed[before..].to_vec();
                        self.discarded.extend(gone);
                    }
                }
            }
        }
        Ok(())
    }

    fn apply_op(&mut self, op: &Op) -> Result<()> {
        match op {
            Op::CreateCollection(c) => {
                if self.t.colls.get(c.key().as_slice())?.is_some() {
                    return Err(StoreError::CollectionExists(*c));
                }
                self.t.colls.insert(
                    c.key().as_slice(),
                    enc(&CollMeta { created: true }).as_slice(),
                )?;
            }
            Op::RemoveCollection(c) => self.remove_collection(c)?,
            Op::Touch(c, o) => {
                self.onode_or_new(c, o)?;
            }
            Op::Create(c, o) => {
                if self.onode(c, o)?.is_some() {
                    return Err(StoreError::ObjectExists {
                        coll: *c,
                        obj: o.clone(),
                    });
                }
                self.onode_or_new(c, o)?;
            }
            Op::Write {
                coll,
                obj,
                offset,
                data,
                crcs,
            } => {
                let mut on = self.onode_or_new(coll, obj)?;
                let size0 = on.size;
                self.write_data_known(coll, obj, &mut on, *offset, data, crcs.as_deref())?;
                self.put_onode_if_resized(coll, obj, &on, size0)?;
            }
            Op::Zero {
                coll,
                obj,
                offset,
                len,
            } => {
                let mut on = self.onode_or_new(coll, obj)?;
                let size0 = on.size;
                self.zero(coll, obj, &mut on, *offset, *len)?;
                self.put_onode_if_resized(coll, obj, &on, size0)?;
            }
            Op::Truncate { coll, obj, size } => {
                let mut on = self.onode_or_new(coll, obj)?;
                let size0 = on.size;
                self.truncate(coll, obj, &mut on, *size)?;
                self.put_onode_if_resized(coll, obj, &on, size0)?;
            }
            Op::Remove(c, o) => {
                let on = self.onode_req(c, o)?;
                self.remove_object(c, o, &on)?;
            }
            Op::Clone { coll, src, dst } => self.clone_object(coll, src, dst)?,
            Op::CloneRange {
                coll,
                src,
                dst,
                src_offset,
                len,
                dst_offset,
            } => self.clone_range(coll, src, dst, *src_offset, *len, *dst_offset)?,
            Op::SetAttrs { coll, obj, attrs } => {
                let mut on = self.onode_req(coll, obj)?;
                for (k, v) in attrs {
                    on.attrs.insert(k.clone(), v.to_vec());
                }
                let total: usize = on.attrs.iter().map(|(k, v)| k.len() + v.len()).sum();
                if total > MAX_ATTR_BYTES {
                    return Err(StoreError::Invalid(format!(
                        "xattrs of {obj} in {coll} would total {total} bytes, limit is {MAX_ATTR_BYTES}; keep large values in omap"
                    )));
                }
                self.put_onode(coll, obj, &on)?;
            }
            Op::RmAttr { coll, obj, name } => {
                let mut on = self.onode_req(coll, obj)?;
                if on.attrs.remove(name).is_some() {
                    self.put_onode(coll, obj, &on)?;
                }
            }
            Op::OmapSet { coll, obj, entries } => {
                let on = self.onode_req(coll, obj)?;
                for (k, v) in entries {
                    self.t
                        .omap
                        .insert(id_key(on.id, k).as_slice(), v.as_ref())?;
                }
            }
            Op::OmapRm { coll, obj, keys } => {
                let on = self.onode_req(coll, obj)?;
                for k in keys {
                    self.t.omap.remove(id_key(on.id, k).as_slice())?;
                }
            }
            Op::OmapClear(c, o) => {
                let on = self.onode_req(c, o)?;
                let lo = id_key(on.id, &[]);
                let hi = id_key(on.id + 1, &[]);
                delete_range(&mut self.t.omap, &lo, &hi)?;
            }
            Op::OmapRmRange {
                coll,
                obj,
                first,
                last,
            } => {
                let on = self.onode_req(coll, obj)?;
                let lo = id_key(on.id, first);
                let hi = id_key(on.id, last);
                if lo < hi {
                    delete_range(&mut self.t.omap, &lo, &hi)?;
                }
            }
            Op::LogAppend { coll, index, entry } => {
                self.coll_req(coll)?;
                self.t.pglog.insert(
                    coll_key(coll, &index.to_be_bytes()).as_slice(),
                    entry.as_ref(),
                )?;
            }
            Op::LogTrim { coll, from, upto } => {
                self.coll_req(coll)?;
                let lo = coll_key(coll, &from.to_be_bytes());
                let hi = match upto.checked_add(1) {
                    Some(n) => coll_key(coll, &n.to_be_bytes()),
                    None => coll_key(coll, &[0xFF; 9]),
                };
                delete_range(&mut self.t.pglog, &lo, &hi)?;
            }
            Op::MetaSet { coll, key, value } => {
                self.coll_req(coll)?;
                self.t
                    .pgmeta
                    .insert(coll_key(coll, key.as_bytes()).as_slice(), value.as_ref())?;
            }
            Op::MetaRm { coll, key } => {
                self.coll_req(coll)?;
                self.t
                    .pgmeta
                    .remove(coll_key(coll, key.as_bytes()).as_slice())?;
            }
        }
        Ok(())
    }

    fn coll_req(&self, c: &CollectionId) -> Result<()> {
        if self.t.colls.get(c.key().as_slice())?.is_none() {
            return Err(StoreError::NoSuchCollection(*c));
        }
        Ok(())
    }

    fn onode(&self, c: &CollectionId, o: &ObjectId) -> Result<Option<Onode>> {
        match self.t.objects.get(obj_key(c, o).as_slice())? {
            Some(v) => Ok(Some(dec("onode", &v)?)),
            None => Ok(None),
        }
    }

    fn onode_req(&self, c: &CollectionId, o: &ObjectId) -> Result<Onode> {
        self.coll_req(c)?;
        self.onode(c, o)?.ok_or_else(|| StoreError::NoSuchObject {
            coll: *c,
            obj: o.clone(),
        })
    }

    fn onode_or_new(&mut self, c: &CollectionId, o: &ObjectId) -> Result<Onode> {
        self.coll_req(c)?;
        o.validate().map_err(StoreError::Invalid)?;
        if let Some(on) = self.onode(c, o)? {
            return Ok(on);
        }
        let on = Onode {
            id: self.next_id,
            size: 0,
            attrs: Default::default(),
        };
        self.next_id += 1;
        self.next_id_dirty = true;
        self.put_onode(c, o, &on)?;
        Ok(on)
    }

    fn put_onode(&mut self, c: &CollectionId, o: &ObjectId, on: &Onode) -> Result<()> {
        self.t
            .objects
            .insert(obj_key(c, o).as_slice(), enc(on).as_slice())?;
        Ok(())
    }

    /// Data ops (write, zero, truncate) change only an onode's size: an
    /// overwrite that keeps it leaves the onode record alone (a new onode
    /// was already stored by `onode_or_new`).
    fn put_onode_if_resized(
        &mut self,
        c: &CollectionId,
        o: &ObjectId,
        on: &Onode,
        size0: u64,
    ) -> Result<()> {
        if on.size != size0 {
            self.put_onode(c, o, on)?;
        }
        Ok(())
    }

    fn check_size(&self, c: &CollectionId, o: &ObjectId, end: Option<u64>) -> Result<u64> {
        let limit = self.inner.cfg.max_object_size;
        match end {
            Some(e) if e <= limit => Ok(e),
            _ => Err(StoreError::ObjectTooLarge {
                coll: *c,
                obj: o.clone(),
                size: end.unwrap_or(u64::MAX),
                limit,
            }),
        }
    }

    /// Allocates `n` blocks, honouring `full_ratio`.
    fn allocate(&mut self, n: u64) -> Result<Vec<(u64, u64)>> {
        let runs = self.inner.allocate_blocks(n)?;
        self.allocated.extend_from_slice(&runs);
        Ok(runs)
    }

    /// Maps blocks the submitter already wrote and synced (see [`Prewrite`]).
    fn write_prewritten(
        &mut self,
        c: &CollectionId,
        o: &ObjectId,
        on: &mut Onode,
        offset: u64,
        pw: &Prewrite,
    ) -> Result<()> {
        let len: u64 = pw.runs.iter().map(|r| r.1).sum::<u64>() * self.inner.block_size;
        let end = self.check_size(c, o, offset.checked_add(len))?;
        let bs = self.inner.block_size;
        let b0 = offset / bs;
        // The first extent written below goes to key b0.
        self.punch_keeping(on.id, b0, end / bs, true)?;
        let mut lb = b0;
        let mut i = 0usize;
        for &(pstart, plen) in &pw.runs {
            if let Some(img) = &pw.image {
                let at = i * bs as usize;
                self.redo
                    .borrow_mut()
                    .image(pstart, &img[at..at + (plen * bs) as usize]);
                self.data_dirty = true;
            }
            let rec = ExtentRec {
                pblock: pstart,
                crcs: pw.crcs[i..i + plen as usize].to_vec(),
            };
            self.t
                .extents
                .insert(ext_key(on.id, lb).as_slice(), rec.encode().as_slice())?;
            lb += plen;
            i += plen as usize;
        }
        on.size = on.size.max(end);
        Ok(())
    }

    /// Extents of object `id` overlapping logical blocks `[b0, b1)`.
    fn extents_overlapping(&self, id: u64, b0: u64, b1: u64) -> Result<Vec<(u64, ExtentRec)>> {
        extents_overlapping(&self.t, id, b0, b1, MAX_RUN_BYTES / self.inner.block_size)
    }

    /// Unmaps logical blocks `[b0, b1)` of object `id`, splitting extents and freeing blocks.
    fn punch(&mut self, id: u64, b0: u64, b1: u64) -> Result<()> {
        self.punch_keeping(id, b0, b1, false)
    }

    /// [`Batch::punch`]; with `rewrite_b0` the caller puts a new extent at
    /// block `b0` right after, so an extent starting there is not deleted
    /// first (its key is simply overwritten: one change in the log, not two).
    fn punch_keeping(&mut self, id: u64, b0: u64, b1: u64, rewrite_b0: bool) -> Result<()> {
        if b0 >= b1 {
            return Ok(());
        }
        for (lb, e) in self.extents_overlapping(id, b0, b1)? {
            let end = lb + e.blocks();
            let cut0 = b0.max(lb);
            let cut1 = b1.min(end);
            // A left part keeps the extent's key (replaced below); otherwise
            // the key goes.
            if lb >= cut0 {
                if !(rewrite_b0 && lb == b0) {
                    self.t.extents.remove_existing(ext_key(id, lb).as_slice())?;
                }
            } else {
                let left = ExtentRec {
                    pblock: e.pblock,
                    crcs: e.crcs[..(cut0 - lb) as usize].to_vec(),
                };
                self.t
                    .extents
                    .insert(ext_key(id, lb).as_slice(), left.encode().as_slice())?;
            }
            if cut1 < end {
                let right = ExtentRec {
                    pblock: e.pblock + (cut1 - lb),
                    crcs: e.crcs[(cut1 - lb) as usize..].to_vec(),
                };
                self.t
                    .extents
                    .insert(ext_key(id, cut1).as_slice(), right.encode().as_slice())?;
            }
            self.freed.push((e.pblock + (cut0 - lb), cut1 - cut0));
        }
        Ok(())
    }

    /// Reads logical block `b` (zeros if unmapped), verifying its checksum.
    fn read_block(&self, c: &CollectionId, o: &ObjectId, on: &Onode, b: u64) -> Result<Vec<u8>> {
        let bs = self.inner.block_size;
        let len = bs.min(on.size.saturating_sub(b * bs));
        let mut v = read_range(self.inner, &self.t, c, o, on, b * bs, len)?;
        v.resize(bs as usize, 0);
        Ok(v)
    }

    /// Writes `data` at `offset`: whole new blocks, partial edge blocks merged with old content.
    fn write_data(
        &mut self,
        c: &CollectionId,
        o: &ObjectId,
        on: &mut Onode,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        self.write_data_known(c, o, on, offset, data, None)
    }

    /// [`Self::write_data`] with the verified crcs of `data`'s leading
    /// 4 KiB blocks, if known (see `Transaction::write_verified`).
    fn write_data_known(
        &mut self,
        c: &CollectionId,
        o: &ObjectId,
        on: &mut Onode,
        offset: u64,
        data: &[u8],
        known: Option<&[u32]>,
    ) -> Result<()> {
        let end = self.check_size(c, o, offset.checked_add(data.len() as u64))?;
        if data.is_empty() {
            return Ok(());
        }
        let bs = self.inner.block_size;
        let b0 = offset / bs;
        let b1 = end.div_ceil(bs);
        // Old content of partial edge blocks (beyond EOF is always zero, so skip reads there).
        let head = if !offset.is_multiple_of(bs) && b0 * bs < on.size {
            Some(self.read_block(c, o, on, b0)?)
        } else {
            None
        };
        let tail = if end % bs != 0 && end < on.size && !(b1 - 1 == b0 && head.is_some()) {
            Some(self.read_block(c, o, on, b1 - 1)?)
        } else {
            None
        };
        // The first extent written below goes to key b0, unless allocation
        // fails (then the whole attempt is dropped).
        self.punch_keeping(on.id, b0, b1, true)?;
        let runs = self.allocate(b1 - b0)?;
        let mut lb = b0;
        for (pstart, plen) in runs {
            let lo = lb * bs; // logical byte range of this run
            let hi = (lb + plen) * bs;
            let crcs;
            if lo >= offset && hi <= end {
                // Fully covered: write straight from the caller's buffer.
                let src = &data[(lo - offset) as usize..(hi - offset) as usize];
                // `known` covers `data`'s own 4 KiB blocks: usable only where
                // this run starts on one of them (an unaligned write's runs
                // do not).
                let skip = (lo - offset) as usize;
                let known_here = known
                    .filter(|_| skip.is_multiple_of(CRC_BLOCK_BYTES))
                    .and_then(|k| k.get(skip / CRC_BLOCK_BYTES..));
                crcs = block_crcs_known(src, bs, known_here);
                self.write_phys(pstart, src)?;
            } else {
                let mut buf = vec![0u8; (hi - lo) as usize];
                if let Some(h) = head.as_ref().filter(|_| lb == b0) {
                    buf[..bs as usize].copy_from_slice(h);
                }
                if lb + plen == b1 {
                    let t = tail
                        .as_ref()
                        .or(if b1 - 1 == b0 { head.as_ref() } else { None });
                    if let Some(t) = t {
                        let s = buf.len() - bs as usize;
                        buf[s..].copy_from_slice(t);
                    }
                }
                let s = offset.max(lo);
                let e = end.min(hi);
                buf[(s - lo) as usize..(e - lo) as usize]
                    .copy_from_slice(&data[(s - offset) as usize..(e - offset) as usize]);
                crcs = block_crcs(&buf, bs);
                self.write_phys(pstart, &buf)?;
            }
            let rec = ExtentRec {
                pblock: pstart,
                crcs,
            };
            self.t
                .extents
                .insert(ext_key(on.id, lb).as_slice(), rec.encode().as_slice())?;
            lb += plen;
        }
        on.size = on.size.max(end);
        Ok(())
    }

    /// Writes `buf` at fresh block `pblock` through the page cache (no sync):
    /// the WAL record carries the same bytes, so the record's sync is what
    /// makes them durable; the next checkpoint syncs the data file.
    fn write_phys(&mut self, pblock: u64, buf: &[u8]) -> Result<()> {
        self.data_dirty = true;
        self.redo.borrow_mut().image(pblock, buf);
        self.inner
            .data
            .write_at(buf, pblock * self.inner.block_size)
            .map_err(|e| StoreError::io("data file write", e))
    }

    fn zero(
        &mut self,
        c: &CollectionId,
        o: &ObjectId,
        on: &mut Onode,
        offset: u64,
        len: u64,
    ) -> Result<()> {
        let end = self.check_size(c, o, offset.checked_add(len))?;
        if len == 0 {
            return Ok(());
        }
        let bs = self.inner.block_size;
        let fb0 = offset.div_ceil(bs);
        let fb1 = end / bs;
        if fb0 >= fb1 {
            // Inside one or two partial blocks: rewrite those bytes as zeros (only below EOF).
            let zend = end.min(on.size);
            if offset < zend {
                self.write_data(c, o, on, offset, &vec![0u8; (zend - offset) as usize])?;
            }
        } else {
            let head_end = (fb0 * bs).min(on.size);
            if offset < head_end {
                self.write_data(c, o, on, offset, &vec![0u8; (head_end - offset) as usize])?;
            }
            let tail_start = fb1 * bs;
            let tail_end = end.min(on.size);
            if tail_start < tail_end {
                self.write_data(
                    c,
                    o,
                    on,
                    tail_start,
                    &vec![0u8; (tail_end - tail_start) as usize],
                )?;
            }
            self.punch(on.id, fb0, fb1)?;
        }
        on.size = on.size.max(end);
        Ok(())
    }

    fn truncate(
        &mut self,
        c: &CollectionId,
        o: &ObjectId,
        on: &mut Onode,
        size: u64,
    ) -> Result<()> {
        self.check_size(c, o, Some(size))?;
        let bs = self.inner.block_size;
        if size < on.size {
            // Keep the invariant "bytes past EOF in the last block are zero".
            let block_end = (size.div_ceil(bs) * bs).min(on.size);
            if !size.is_multiple_of(bs) && size < block_end {
                self.write_data(c, o, on, size, &vec![0u8; (block_end - size) as usize])?;
            }
            self.punch(on.id, size.div_ceil(bs), on.size.div_ceil(bs))?;
        }
        on.size = size;
        Ok(())
    }

    fn remove_object(&mut self, c: &CollectionId, o: &ObjectId, on: &Onode) -> Result<()> {
        let bs = self.inner.block_size;
        self.punch(on.id, 0, on.size.div_ceil(bs).max(1))?;
        delete_range(
            &mut self.t.omap,
            &id_key(on.id, &[]),
            &id_key(on.id + 1, &[]),
        )?;
        self.t.objects.remove(obj_key(c, o).as_slice())?;
        Ok(())
    }

    fn remove_collection(&mut self, c: &CollectionId) -> Result<()> {
        self.coll_req(c)?;
        let prefix = c.key();
        let hi = prefix_end(&prefix).unwrap_or_else(|| vec![0xFF; 14]);
        let objects = self.t.objects.scan(&prefix, &hi, 1000)?.len() as u64;
        if objects > 0 {
            return Err(StoreError::CollectionNotEmpty { coll: *c, objects });
        }
        delete_range(&mut self.t.pgmeta, &prefix, &hi)?;
        delete_range(&mut self.t.pglog, &prefix, &hi)?;
        self.t.colls.remove(prefix.as_slice())?;
        Ok(())
    }

    fn clone_object(&mut self, c: &CollectionId, src: &ObjectId, dst: &ObjectId) -> Result<()> {
        let s = self.onode_req(c, src)?;
        if src == dst {
            return Err(StoreError::Invalid(format!("clone of {src} onto itself")));
        }
        if let Some(old) = self.onode(c, dst)? {
            self.remove_object(c, dst, &old)?;
        }
        let mut d = self.onode_or_new(c, dst)?;
        d.size = s.size;
        d.attrs = s.attrs.clone();
        // Data: copy each extent's blocks (verified) into new blocks with the same crcs.
        let bs = self.inner.block_size;
        for (lb, e) in self.extents_overlapping(s.id, 0, s.size.div_ceil(bs))? {
            let mut buf = vec![0u8; (e.blocks() * bs) as usize];
            self.inner
                .data
                .read_at(&mut buf, e.pblock * bs)
                .map_err(|er| StoreError::io("data file read", er))?;
            verify_blocks(self.inner, c, src, lb, &e, &buf)?;
            let mut done = 0u64;
            for (pstart, plen) in self.allocate(e.blocks())? {
                let part = &buf[(done * bs) as usize..((done + plen) * bs) as usize];
                self.write_phys(pstart, part)?;
                let rec = ExtentRec {
                    pblock: pstart,
                    crcs: e.crcs[done as usize..(done + plen) as usize].to_vec(),
                };
                self.t
                    .extents
                    .insert(ext_key(d.id, lb + done).as_slice(), rec.encode().as_slice())?;
                done += plen;
            }
        }
        // Omap, in bounded chunks.
        let mut cursor = id_key(s.id, &[]);
        let hi = id_key(s.id + 1, &[]);
        loop {
            let chunk = self.t.omap.scan(&cursor, &hi, DELETE_CHUNK_KEYS)?;
            let Some(last) = chunk.last() else { break };
            cursor = last.0.clone();
            cursor.push(0);
            for (k, v) in &chunk {
                self.t
                    .omap
                    .insert(id_key(d.id, &k[8..]).as_slice(), v.as_slice())?;
            }
        }
        self.put_onode(c, dst, &d)?;
        Ok(())
    }

    fn clone_range(
        &mut self,
        c: &CollectionId,
        src: &ObjectId,
        dst: &ObjectId,
        soff: u64,
        len: u64,
        doff: u64,
    ) -> Result<()> {
        let s = self.onode_req(c, src)?;
        let len = len.min(s.size.saturating_sub(soff));
        if src == dst && soff < doff.saturating_add(len) && doff < soff.saturating_add(len) {
            return Err(StoreError::Invalid(format!(
                "clone_range within {src} with overlapping ranges"
            )));
        }
        let mut d = self.onode_or_new(c, dst)?;
        let mut done = 0;
        while done < len {
            let n = COPY_CHUNK_BYTES.min(len - done);
            let s = self.onode_req(c, src)?; // re-read: src may equal dst
            let buf = read_range(self.inner, &self.t, c, src, &s, soff + done, n)?;
            self.write_data(c, dst, &mut d, doff + done, &buf)?;
            self.put_onode(c, dst, &d)?;
            done += n;
        }
        Ok(())
    }
}

/// crc32c of each `bs`-sized block of `buf` (whose length is a multiple of `bs`).
pub(crate) fn block_crcs(buf: &[u8], bs: u64) -> Vec<u32> {
    debug_assert_eq!(buf.len() as u64 % bs, 0);
    buf.chunks(bs as usize).map(crc32c::crc32c).collect()
}

/// [`block_crcs`] of `buf`, taken from `known` (the verified crcs of
/// `buf`'s [`CRC_BLOCK_BYTES`] blocks, from its start) when they cover it
/// and `bs` is a multiple of that block; computed otherwise.
pub(crate) fn block_crcs_known(buf: &[u8], bs: u64, known: Option<&[u32]>) -> Vec<u32> {
    let n = buf.len() / CRC_BLOCK_BYTES;
    let factor = bs as usize / CRC_BLOCK_BYTES;
    match known {
        Some(k)
            if (bs as usize).is_multiple_of(CRC_BLOCK_BYTES)
                && buf.len().is_multiple_of(CRC_BLOCK_BYTES)
                && k.len() >= n =>
        {
            let crcs = cairn_types::crc::regroup_block_crcs(&k[..n], factor);
            debug_assert_eq!(
                crcs,
                block_crcs(buf, bs),
                "a write's known block crcs are not those of its data"
            );
            crcs
        }
        _ => block_crcs(buf, bs),
    }
}

/// Checks every block of an extent read into `buf` (which starts at logical block `lb`).
pub(crate) fn verify_blocks(
    inner: &Inner,
    c: &CollectionId,
    o: &ObjectId,
    lb: u64,
    e: &ExtentRec,
    buf: &[u8],
) -> Result<()> {
    let bs = inner.block_size;
    for (i, (blk, &want)) in buf.chunks(bs as usize).zip(&e.crcs).enumerate() {
        let got = crc32c::crc32c(blk);
        if got != want {
            return Err(StoreError::Checksum {
                coll: *c,
                obj: o.clone(),
                offset: (lb + i as u64) * bs,
                block_bytes: bs as u32,
                disk_offset: (e.pblock + i as u64) * bs,
                expected: want,
                actual: got,
            });
        }
    }
    Ok(())
}

pub(crate) fn extents_overlapping(
    kv: &dyn KvRead,
    id: u64,
    b0: u64,
    b1: u64,
    max_run_blocks: u64,
) -> Result<Vec<(u64, ExtentRec)>> {
    let mut out = Vec::new();
    if b0 >= b1 {
        return Ok(out);
    }
    debug_assert!(max_run_blocks > 0);
    // One backward scan from b1: every extent starting in [b0, b1), then
    // the last one starting at or before b0 (extents never overlap, so no
    // earlier one can reach b0). It stops there.
    let first = ext_key(id, 0);
    let hi = ext_key(id, b1);
    let at_or_before_b0 = |k: &[u8]| ext_key_parse(k).is_none_or(|(_, lb)| lb <= b0);
    for (k, v) in kv.kv_rev_until(TID_EXTENTS, &first, &hi, &at_or_before_b0)? {
        let (_, lb) =
            ext_key_parse(&k).ok_or_else(|| StoreError::Corrupt("bad extent key".into()))?;
        let e = ExtentRec::decode(&v)?;
        if lb + e.blocks() > b0 {
            out.push((lb, e));
        }
    }
    out.reverse();
    Ok(out)
}

/// Reads `[off, off+len)` of an object (caller clamps to its size); holes are zeros.
pub(crate) fn read_range(
    inner: &Inner,
    kv: &dyn KvRead,
    c: &CollectionId,
    o: &ObjectId,
    on: &Onode,
    off: u64,
    len: u64,
) -> Result<Vec<u8>> {
    let mut out = vec![0u8; len as usize];
    read_range_into(inner, kv, c, o, on, off, &mut out)?;
    Ok(out)
}

/// [`read_range`] and the crc32c of what it returns (see
/// [`read_range_into`]).
fn read_range_crc(
    inner: &Inner,
    kv: &dyn KvRead,
    c: &CollectionId,
    o: &ObjectId,
    on: &Onode,
    off: u64,
    len: u64,
) -> Result<(Vec<u8>, u32)> {
    let mut out = vec![0u8; len as usize];
    let crc = read_range_into(inner, kv, c, o, on, off, &mut out)?;
    Ok((out, crc))
}

/// Reads below this size go through the page cache (small reads are often
/// hits there); bigger ones are read with O_DIRECT straight into the result.
pub(crate) const DIRECT_READ_MIN_BYTES: u64 = 64 << 10;

/// [`read_range`] into a buffer whose whole blocks can be read with O_DIRECT
/// (the result starts on a 4096-byte boundary in memory), returned as
/// shared bytes of it: one DMA from the disk, no kernel copy, no page-cache
/// pages, and no zeroing (the buffer is a recycled one, see `readbuf`;
/// holes are zeroed as they are met). Also returns the data's crc32c.
pub(crate) fn read_range_bytes(
    inner: &Inner,
    kv: &dyn KvRead,
    c: &CollectionId,
    o: &ObjectId,
    on: &Onode,
    off: u64,
    len: u64,
) -> Result<(bytes::Bytes, u32)> {
    if len < DIRECT_READ_MIN_BYTES {
        return read_range_crc(inner, kv, c, o, on, off, len)
            .map(|(v, crc)| (bytes::Bytes::from(v), crc));
    }
    let mut buf = inner.read_bufs.take(len as usize);
    let crc = read_range_into(inner, kv, c, o, on, off, buf.as_mut_slice())?;
    Ok((buf.into_bytes(), crc))
}

/// Fills `out` (`out.len()` bytes from `off`, whatever it held before) with
/// the object's data, verifying every block's checksum; holes read as
/// zeros. Whole blocks are read in place (with O_DIRECT when big and
/// aligned), and extents that follow each other both in the object and on
/// the disk are read with one call (a 4 MiB object is written as 16
/// extents of at most [`MAX_RUN_BYTES`], usually adjacent: one 4 MiB
/// request instead of 16 sequential 256 KiB ones); a partial first or last
/// block is read aside. Returns the crc32c of `out`, combined from the
/// verified block crcs (no second pass over whole blocks; partial blocks
/// and holes are crc'd as they are).
fn read_range_into(
    inner: &Inner,
    kv: &dyn KvRead,
    c: &CollectionId,
    o: &ObjectId,
    on: &Onode,
    off: u64,
    out: &mut [u8],
) -> Result<u32> {
    let len = out.len() as u64;
    if len == 0 {
        return Ok(0);
    }
    let bs = inner.block_size;
    let end = off + len;
    let b0 = off / bs;
    let b1 = end.div_ceil(bs);
    // Bytes of `out` before this are filled (extents come in order), and
    // `crc` is their crc32c.
    let mut filled = 0usize;
    let mut crc = 0u32;
    let hole = |out: &mut [u8], crc: u32, from: usize, to: usize| {
        out[from..to].fill(0);
        combine_bytes(crc, &out[from..to])
    };
    // Whole-block pieces waiting to be read with one call: (first logical
    // block, the piece's extent part), contiguous in the object and on disk.
    let mut run: Vec<(u64, ExtentRec)> = Vec::new();
    for (lb, e) in extents_overlapping(kv, on.id, b0, b1, MAX_RUN_BYTES / bs)? {
        let r0 = lb.max(b0);
        let r1 = (lb + e.blocks()).min(b1);
        let pstart = e.pblock + (r0 - lb);
        let sub = ExtentRec {
            pblock: pstart,
            crcs: e.crcs[(r0 - lb) as usize..(r1 - lb) as usize].to_vec(),
        };
        let s = off.max(r0 * bs);
        let en = end.min(r1 * bs);
        let whole = s == r0 * bs && en == r1 * bs;
        let joins = run
            .last()
            .is_some_and(|(l0, p)| l0 + p.blocks() == r0 && p.pblock + p.blocks() == pstart);
        if !(whole && joins) {
            crc = read_run(inner, c, o, off, out, &mut run, crc)?;
        }
        // A hole before this extent.
        crc = hole(out, crc, filled, (s - off) as usize);
        filled = (en - off) as usize;
        if whole {
            run.push((r0, sub));
            continue;
        }
        let mut buf = vec![0u8; ((r1 - r0) * bs) as usize];
        inner
            .data
            .read_at(&mut buf, pstart * bs)
            .map_err(|er| StoreError::io("data file read", er))?;
        verify_blocks(inner, c, o, r0, &sub, &buf)?;
        let part = &buf[(s - r0 * bs) as usize..(en - r0 * bs) as usize];
        out[(s - off) as usize..(en - off) as usize].copy_from_slice(part);
        crc = combine_bytes(crc, part);
    }
    crc = read_run(inner, c, o, off, out, &mut run, crc)?;
    // A hole at the end.
    Ok(hole(out, crc, filled, out.len()))
}

/// Reads the whole-block pieces of `run` (adjacent in the object and on
/// disk; `out` starts at object offset `off`) into `out` with one call,
/// verifies each piece's blocks and returns `crc` (the crc32c of `out` up
/// to the run) extended over them. Empties `run`.
fn read_run(
    inner: &Inner,
    c: &CollectionId,
    o: &ObjectId,
    off: u64,
    out: &mut [u8],
    run: &mut Vec<(u64, ExtentRec)>,
    mut crc: u32,
) -> Result<u32> {
    let (Some((first, p0)), Some((last, pn))) = (run.first(), run.last()) else {
        return Ok(crc);
    };
    let bs = inner.block_size;
    let at = (first * bs - off) as usize;
    let to = ((last + pn.blocks()) * bs - off) as usize;
    let dst = &mut out[at..to];
    let io = if dst.len() as u64 >= DIRECT_READ_MIN_BYTES {
        read_big(inner, dst, p0.pblock * bs)
    } else {
        inner.data.read_at(dst, p0.pblock * bs)
    };
    io.map_err(|er| StoreError::io("data file read", er))?;
    for (lb, sub) in run.drain(..) {
        let from = (lb * bs - off) as usize;
        let piece = &out[from..from + (sub.blocks() * bs) as usize];
        verify_blocks(inner, c, o, lb, &sub, piece)?;
        // Verified: the stored crcs are the crcs of these bytes.
        crc = sub
            .crcs
            .iter()
            .fold(crc, |acc, &b| inner.block_crc.append(acc, b));
    }
    Ok(crc)
}

/// The crc32c of `A ‖ bytes` from `crc` = crc32c(A).
fn combine_bytes(crc: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, bytes)
}

/// A big read of whole blocks: when the store keeps written data cached
/// ([`crate::Transaction::keep_data_cached`]; it stays there until the
/// kernel needs the memory), the part the page cache holds is copied from
/// it; the rest is read with O_DIRECT (one DMA, and no page-cache pages for
/// data nobody asked to keep).
fn read_big(inner: &Inner, dst: &mut [u8], at: u64) -> std::io::Result<()> {
    // A failed cached read (even EIO) is retried by the direct read, which
    // reports the device's answer.
    let cached = if inner
        .wrote_cached
        .load(std::sync::atomic::Ordering::Relaxed)
    {
        inner.data.read_at_cached(dst, at).unwrap_or(0)
    } else {
        0
    };
    // Whole pages only: the rest must stay aligned for O_DIRECT.
    let cached = cached - cached % crate::device::DIRECT_ALIGN;
    if cached > 0 {
        inner
            .cached_read_bytes
            .fetch_add(cached as u64, std::sync::atomic::Ordering::Relaxed);
    }
    if cached == dst.len() {
        return Ok(());
    }
    inner
        .data
        .read_at_direct(&mut dst[cached..], at + cached as u64)
}

/// Deletes keys in `[lo, hi)` in bounded chunks.
pub(crate) fn delete_range(t: &mut LoggedTable<'_>, lo: &[u8], hi: &[u8]) -> Result<()> {
    let mut from = lo.to_vec();
    loop {
        let keys = t.scan(&from, hi, DELETE_CHUNK_KEYS)?;
        let Some((last, _)) = keys.last() else {
            return Ok(());
        };
        from = last.clone();
        from.push(0);
        for (k, _) in &keys {
            t.remove_existing(k)?;
        }
    }
}
