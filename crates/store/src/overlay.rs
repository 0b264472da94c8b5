//! The in-memory overlay of metadata changes that are in the WAL but not yet
//! applied to redb, and the read views that merge it with a redb snapshot.
//!
//! Every commit group's key/value changes go into the overlay (tagged with
//! the group's number) when its WAL record is handed to the writer; redb only
//! receives them later, in one large write transaction per checkpoint (see
//! `store.rs`). A [`ReadView`] sees a redb snapshot that holds every group up
//! to some number `A` plus the overlay's versions of groups up to the view's
//! limit `V` (the groups known durable when it started, or every group for
//! the committer): for each key the newest visible overlay version wins,
//! else the redb value. Versions a view may still need are kept: the
//! committer prunes the versions of groups `<= P` only once redb holds them
//! and no registered reader started on an older redb snapshot than `P`.

use crate::error::Result;
use crate::meta::*;
use redb::{ReadOnlyTable, ReadTransaction, ReadableTable, ReadableTableMetadata};
use std::cell::OnceCell;
use std::collections::BTreeMap;
use std::iter::Peekable;
use std::ops::Bound;
use std::sync::{Arc, RwLock, RwLockReadGuard};

/// Number of metadata tables (their ids are the positions in `wal::TABLE_NAMES`).
pub(crate) const TABLES: usize = 7;
pub(crate) const TID_COLLS: u8 = 1;
pub(crate) const TID_OBJECTS: u8 = 2;
pub(crate) const TID_EXTENTS: u8 = 3;
pub(crate) const TID_OMAP: u8 = 4;
pub(crate) const TID_PGMETA: u8 = 5;
pub(crate) const TID_PGLOG: u8 = 6;

/// The redb table definition of table id `id`.
pub(crate) fn table_def(id: u8) -> Tbl {
    [
        T_SUPER, T_COLLS, T_OBJECTS, T_EXTENTS, T_OMAP, T_PGMETA, T_PGLOG,
    ][id as usize]
}

/// A value in the overlay: `None` is a deletion.
pub(crate) type Val = Option<Arc<[u8]>>;

/// What one group changed: the final state of every key it touched.
#[derive(Debug, Default)]
pub(crate) struct GroupChanges {
    /// (table id, key, value or deletion).
    pub kv: Vec<(u8, Vec<u8>, Val)>,
}

impl GroupChanges {
    fn bytes(&self) -> usize {
        self.kv
            .iter()
            .map(|(_, k, v)| k.len() + v.as_ref().map_or(0, |v| v.len()) + ENTRY_OVERHEAD_BYTES)
            .sum()
    }
}

/// One table of the overlay: key -> versions (group, value), oldest first.
type VersionMap = BTreeMap<Vec<u8>, Vec<(u64, Val)>>;
/// A merge source item: (key, value or deletion).
type Item = Result<(Vec<u8>, Option<Vec<u8>>)>;
type RedbItem<'a> = std::result::Result<
    (
        redb::AccessGuard<'a, &'static [u8]>,
        redb::AccessGuard<'a, &'static [u8]>,
    ),
    redb::StorageError,
>;

/// Bookkeeping bytes counted per overlay entry (map node share, version vector, Arc).
const ENTRY_OVERHEAD_BYTES: usize = 96;

#[derive(Default)]
struct OverlayState {
    /// Per table: key -> versions (group, value), oldest first.
    tables: [VersionMap; TABLES],
    bytes: usize,
}

/// Metadata changes of groups not yet applied to redb (shared by the
/// committer, readers and the checkpoint thread).
#[derive(Default)]
pub(crate) struct Overlay {
    state: RwLock<OverlayState>,
}

impl Overlay {
    fn read(&self) -> RwLockReadGuard<'_, OverlayState> {
        // A panic while holding the lock cannot leave a half-inserted group
        // visible to a reader that filters by durable group, so recover.
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds group `group`'s changes (groups are inserted in increasing order).
    pub fn insert(&self, group: u64, ch: &GroupChanges) {
        let mut st = self.state.write().unwrap_or_else(|e| e.into_inner());
        for (t, k, v) in &ch.kv {
            let vs = st.tables[*t as usize].entry(k.clone()).or_default();
            debug_assert!(vs.last().is_none_or(|(g, _)| *g < group));
            vs.push((group, v.clone()));
        }
        st.bytes += ch.bytes();
    }

    /// Drops the versions of groups `<= upto` of the keys `ch` touched.
    pub fn prune(&self, ch: &GroupChanges, upto: u64) {
        let mut st = self.state.write().unwrap_or_else(|e| e.into_inner());
        let mut freed = 0;
        for (t, k, _) in &ch.kv {
            let table = &mut st.tables[*t as usize];
            if let Some(vs) = table.get_mut(k.as_slice()) {
                vs.retain(|(g, v)| {
                    let keep = *g > upto;
                    if !keep {
                        freed += k.len() + v.as_ref().map_or(0, |v| v.len()) + ENTRY_OVERHEAD_BYTES;
                    }
                    keep
                });
                if vs.is_empty() {
                    table.remove(k.as_slice());
                }
            }
        }
        st.bytes = st.bytes.saturating_sub(freed);
    }

    /// Approximate memory held (keys, values and bookkeeping).
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.read().bytes
    }
}

/// The newest version visible at `limit`: None = no visible version.
fn visible(vs: &[(u64, Val)], limit: u64) -> Option<&Val> {
    vs.iter().rev().find(|(g, _)| *g <= limit).map(|(_, v)| v)
}

/// Reads of the metadata tables by table id (a redb snapshot merged with
/// the overlay, or a write transaction's own tables).
pub(crate) trait KvRead {
    fn kv_get(&self, table: u8, key: &[u8]) -> Result<Option<Vec<u8>>>;
    /// Up to `limit` entries of `[lo, hi)` in key order.
    fn kv_scan(
        &self,
        table: u8,
        lo: &[u8],
        hi: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>>;
    /// Entries of `[lo, hi)` from the last one backwards, up to and
    /// including the first whose key `stop` accepts (or down to `lo`).
    fn kv_rev_until(
        &self,
        table: u8,
        lo: &[u8],
        hi: &[u8],
        stop: &dyn Fn(&[u8]) -> bool,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>>;
}

/// One source of a merged scan: (key, value or deletion) in scan order.
pub(crate) type Src<'a> = Box<dyn Iterator<Item = Item> + 'a>;

/// Merges sorted sources, the first one winning on equal keys; deletions
/// hide the key. `rev`: the sources run backwards (largest key first).
/// Stops after `limit` entries, or right after an entry whose key `stop`
/// accepts (that entry is returned).
pub(crate) fn merge(
    srcs: Vec<Src<'_>>,
    rev: bool,
    limit: usize,
    stop: &dyn Fn(&[u8]) -> bool,
) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut srcs: Vec<Peekable<Src<'_>>> = srcs.into_iter().map(|s| s.peekable()).collect();
    let mut out = Vec::new();
    while out.len() < limit {
        // The source holding the next key (the first source wins a tie).
        let mut best: Option<(usize, &Vec<u8>)> = None;
        for (i, s) in srcs.iter_mut().enumerate() {
            if matches!(s.peek(), Some(Err(_))) {
                if let Some(Err(e)) = s.next() {
                    return Err(e);
                }
            }
            if let Some(Ok((k, _))) = s.peek() {
                let better = match best {
                    None => true,
                    Some((_, b)) => (k < b) != rev && k != b,
                };
                if better {
                    best = Some((i, k));
                }
            }
        }
        let Some((bi, _)) = best else { break };
        let Some(Ok((key, winner))) = srcs[bi].next() else {
            break;
        };
        for s in srcs.iter_mut().skip(bi + 1) {
            if matches!(s.peek(), Some(Ok((k, _))) if *k == key) {
                s.next();
            }
        }
        if let Some(v) = winner {
            let done = stop(&key);
            out.push((key, v));
            if done {
                break;
            }
        }
    }
    Ok(out)
}

/// Never stops a merge early.
pub(crate) fn no_stop(_: &[u8]) -> bool {
    false
}

/// Overlay versions of `[lo, hi)` visible at `limit`, as a merge source.
pub(crate) fn overlay_src<'a>(
    map: &'a VersionMap,
    lo: &'a [u8],
    hi: &'a [u8],
    limit: u64,
    rev: bool,
) -> Src<'a> {
    let r = map.range::<[u8], _>((Bound::Included(lo), Bound::Excluded(hi)));
    let f = move |(k, vs): (&Vec<u8>, &Vec<(u64, Val)>)| {
        visible(vs, limit).map(|v| Ok((k.clone(), v.as_ref().map(|v| v.to_vec()))))
    };
    if rev {
        Box::new(r.rev().filter_map(f))
    } else {
        Box::new(r.filter_map(f))
    }
}

/// A redb table range as a merge source.
pub(crate) fn redb_src<'a, T: ReadableTable<&'static [u8], &'static [u8]>>(
    t: &'a T,
    lo: &'a [u8],
    hi: &'a [u8],
    rev: bool,
) -> Result<Src<'a>> {
    let r = t.range::<&[u8]>(lo..hi)?;
    let f = |e: RedbItem<'_>| {
        e.map(|(k, v)| (k.value().to_vec(), Some(v.value().to_vec())))
            .map_err(Into::into)
    };
    Ok(if rev {
        Box::new(r.rev().map(f))
    } else {
        Box::new(r.map(f))
    })
}

type RoTable = ReadOnlyTable<&'static [u8], &'static [u8]>;

/// A consistent view for reads: a redb snapshot plus the overlay versions
/// of groups `<= limit`.
pub(crate) struct ReadView {
    r: ReadTransaction,
    tables: [OnceCell<RoTable>; TABLES],
    overlay: Arc<Overlay>,
    limit: u64,
}

impl ReadView {
    pub fn new(r: ReadTransaction, overlay: Arc<Overlay>, limit: u64) -> ReadView {
        ReadView {
            r,
            tables: Default::default(),
            overlay,
            limit,
        }
    }

    /// The redb snapshot alone (fsck walks it after a checkpoint).
    pub fn redb(&self) -> &ReadTransaction {
        &self.r
    }

    fn table(&self, id: u8) -> Result<&RoTable> {
        let cell = &self.tables[id as usize];
        if let Some(t) = cell.get() {
            return Ok(t);
        }
        let t = self.r.open_table(table_def(id))?;
        Ok(cell.get_or_init(|| t))
    }

    /// Number of keys in table `id` as this view sees it.
    pub fn count(&self, id: u8) -> Result<u64> {
        let t = self.table(id)?;
        let mut n = t.len()?;
        let st = self.overlay.read();
        for (k, vs) in &st.tables[id as usize] {
            let Some(v) = visible(vs, self.limit) else {
                continue;
            };
            let in_redb = t.get(k.as_slice())?.is_some();
            match (v.is_some(), in_redb) {
                (true, false) => n += 1,
                (false, true) => n = n.saturating_sub(1),
                _ => {}
            }
        }
        Ok(n)
    }
}

impl KvRead for ReadView {
    fn kv_get(&self, table: u8, key: &[u8]) -> Result<Option<Vec<u8>>> {
        {
            let st = self.overlay.read();
            if let Some(vs) = st.tables[table as usize].get(key) {
                if let Some(v) = visible(vs, self.limit) {
                    return Ok(v.as_ref().map(|v| v.to_vec()));
                }
            }
        }
        Ok(self.table(table)?.get(key)?.map(|v| v.value().to_vec()))
    }

    fn kv_scan(
        &self,
        table: u8,
        lo: &[u8],
        hi: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        if lo >= hi || limit == 0 {
            return Ok(Vec::new());
        }
        let t = self.table(table)?;
        let st = self.overlay.read();
        let srcs = vec![
            overlay_src(&st.tables[table as usize], lo, hi, self.limit, false),
            redb_src(t, lo, hi, false)?,
        ];
        merge(srcs, false, limit, &no_stop)
    }

    fn kv_rev_until(
        &self,
        table: u8,
        lo: &[u8],
        hi: &[u8],
        stop: &dyn Fn(&[u8]) -> bool,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        if lo >= hi {
            return Ok(Vec::new());
        }
        let t = self.table(table)?;
        let st = self.overlay.read();
        let srcs = vec![
            overlay_src(&st.tables[table as usize], lo, hi, self.limit, true),
            redb_src(t, lo, hi, true)?,
        ];
        merge(srcs, true, usize::MAX, stop)
    }
}

/// The overlay's map of table `id`, for the committer's group-local layer
/// on top of a [`ReadView`] (see `apply::LoggedTable`).
impl ReadView {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn scan_under(
        &self,
        local: &BTreeMap<Vec<u8>, Val>,
        table: u8,
        lo: &[u8],
        hi: &[u8],
        limit: usize,
        rev: bool,
        stop: &dyn Fn(&[u8]) -> bool,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        if lo >= hi || limit == 0 {
            return Ok(Vec::new());
        }
        let t = self.table(table)?;
        let st = self.overlay.read();
        let l = local.range::<[u8], _>((Bound::Included(lo), Bound::Excluded(hi)));
        let lf = |(k, v): (&Vec<u8>, &Val)| Ok((k.clone(), v.as_ref().map(|v| v.to_vec())));
        let local_src: Src<'_> = if rev {
            Box::new(l.rev().map(lf))
        } else {
            Box::new(l.map(lf))
        };
        let srcs = vec![
            local_src,
            overlay_src(&st.tables[table as usize], lo, hi, self.limit, rev),
            redb_src(t, lo, hi, rev)?,
        ];
        merge(srcs, rev, limit, stop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(v: &[(&str, Option<&str>)]) -> Src<'static> {
        let items: Vec<Item> = v
            .iter()
            .map(|(k, v)| Ok((k.as_bytes().to_vec(), v.map(|v| v.as_bytes().to_vec()))))
            .collect();
        Box::new(items.into_iter())
    }

    fn keys(v: &[(Vec<u8>, Vec<u8>)]) -> Vec<String> {
        v.iter()
            .map(|(k, v)| {
                format!(
                    "{}={}",
                    String::from_utf8_lossy(k),
                    String::from_utf8_lossy(v)
                )
            })
            .collect()
    }

    #[test]
    fn merge_prefers_upper_layers_and_hides_deletions() {
        let top = src(&[("b", None), ("d", Some("D2"))]);
        let mid = src(&[("a", Some("A1")), ("d", Some("D1")), ("e", None)]);
        let base = src(&[
            ("a", Some("A0")),
            ("b", Some("B0")),
            ("c", Some("C0")),
            ("e", Some("E0")),
            ("f", Some("F0")),
        ]);
        let out = merge(vec![top, mid, base], false, 10, &no_stop).unwrap();
        assert_eq!(keys(&out), ["a=A1", "c=C0", "d=D2", "f=F0"]);
        let top = src(&[("b", None), ("d", Some("D2"))]);
        let base = src(&[("a", Some("A0")), ("b", Some("B0")), ("c", Some("C0"))]);
        assert_eq!(
            keys(&merge(vec![top, base], false, 2, &no_stop).unwrap()),
            ["a=A0", "c=C0"]
        );
    }

    #[test]
    fn merge_backwards() {
        let top = src(&[("d", None), ("b", Some("B1"))]);
        let base = src(&[("d", Some("D0")), ("c", Some("C0")), ("a", Some("A0"))]);
        let out = merge(vec![top, base], true, 1, &no_stop).unwrap();
        assert_eq!(keys(&out), ["c=C0"]);
        // Backwards until a key at or below "b": deletions never stop it.
        let top = src(&[("d", None), ("b", Some("B1"))]);
        let base = src(&[("d", Some("D0")), ("c", Some("C0")), ("a", Some("A0"))]);
        let out = merge(vec![top, base], true, usize::MAX, &|k| k <= b"b".as_slice()).unwrap();
        assert_eq!(keys(&out), ["c=C0", "b=B1"]);
    }

    #[test]
    fn versions_visible_by_group() {
        let o = Overlay::default();
        let ch = |v: Option<&str>| GroupChanges {
            kv: vec![(
                TID_OBJECTS,
                b"k".to_vec(),
                v.map(|v| Arc::from(v.as_bytes())),
            )],
        };
        o.insert(3, &ch(Some("three")));
        o.insert(5, &ch(None));
        o.insert(7, &ch(Some("seven")));
        let st = o.read();
        let vs = &st.tables[TID_OBJECTS as usize][b"k".as_slice()];
        assert!(visible(vs, 2).is_none());
        assert_eq!(
            visible(vs, 4).unwrap().as_deref(),
            Some(b"three".as_slice())
        );
        assert!(visible(vs, 6).unwrap().is_none());
        assert_eq!(
            visible(vs, 9).unwrap().as_deref(),
            Some(b"seven".as_slice())
        );
        drop(st);
        o.prune(&ch(None), 5);
        let st = o.read();
        let vs = &st.tables[TID_OBJECTS as usize][b"k".as_slice()];
        assert_eq!(vs.len(), 1);
        drop(st);
        o.prune(&ch(None), 7);
        assert!(o.read().tables[TID_OBJECTS as usize].is_empty());
        assert_eq!(o.bytes(), 0);
    }
}
