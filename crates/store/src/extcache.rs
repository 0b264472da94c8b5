//! The committer's cache of whole extent maps of recently written objects,
//! so a small overwrite finds the extents it splits without descending
//! redb (a range iterator over redb's page cache, merged with the overlay).
//! Owned by the committer thread only (no lock); it always equals the
//! committer's view (redb + every group in the overlay): an object's map is
//! loaded whole from that view on first use, and every group the committer
//! hands to the WAL updates the cached maps with its extent changes. A
//! direct-path group (written to redb without the overlay) clears it.
//! Bounded by a byte budget carved out of `store_cache_bytes`; least
//! recently used objects go first.

use crate::overlay::{GroupChanges, TID_EXTENTS};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// Bookkeeping bytes counted per cached extent (map node share, Arc header).
const ENTRY_OVERHEAD_BYTES: usize = 64;
/// Bookkeeping bytes counted per cached object.
const OBJECT_OVERHEAD_BYTES: usize = 128;
/// Ids of objects too large to cache remembered at most.
const MAX_TOO_LARGE: usize = 4096;

/// One object's extent map: logical block -> encoded extent record.
struct ObjExtents {
    map: BTreeMap<u64, Arc<[u8]>>,
    bytes: usize,
    last_used: u64,
}

fn entry_bytes(v: &[u8]) -> usize {
    v.len() + ENTRY_OVERHEAD_BYTES
}

#[derive(Default)]
pub(crate) struct ExtentCache {
    objs: HashMap<u64, ObjExtents>,
    bytes: usize,
    budget_bytes: usize,
    tick: u64,
    /// Objects found too large to cache (not looked up again until cleared).
    too_large: HashSet<u64>,
}

impl ExtentCache {
    pub fn new(budget_bytes: usize) -> ExtentCache {
        ExtentCache {
            budget_bytes,
            ..Default::default()
        }
    }

    pub fn enabled(&self) -> bool {
        self.budget_bytes > 0
    }

    /// Object `id`'s extent map (logical block -> encoded record), if cached.
    pub fn object(&mut self, id: u64) -> Option<&BTreeMap<u64, Arc<[u8]>>> {
        self.tick += 1;
        let tick = self.tick;
        let o = self.objs.get_mut(&id)?;
        o.last_used = tick;
        Some(&o.map)
    }

    /// Whether object `id` is worth loading (not known to be too large).
    pub fn may_load(&self, id: u64) -> bool {
        self.enabled() && !self.too_large.contains(&id)
    }

    /// Most extents of one object loaded: an object is cached only if its
    /// map takes at most a quarter of the budget.
    pub fn max_object_extents(&self) -> usize {
        self.budget_bytes / 4 / (ENTRY_OVERHEAD_BYTES + 9)
    }

    /// Notes that object `id` has more than [`ExtentCache::max_object_extents`].
    pub fn set_too_large(&mut self, id: u64) {
        if self.too_large.len() >= MAX_TOO_LARGE {
            self.too_large.clear();
        }
        self.too_large.insert(id);
    }

    /// Caches object `id`'s whole extent map (as the committer's view holds it).
    pub fn load(&mut self, id: u64, extents: Vec<(u64, Vec<u8>)>) {
        if !self.enabled() {
            return;
        }
        let mut o = ObjExtents {
            map: BTreeMap::new(),
            bytes: OBJECT_OVERHEAD_BYTES,
            last_used: self.tick,
        };
        for (lb, v) in extents {
            o.bytes += entry_bytes(&v);
            o.map.insert(lb, Arc::from(v));
        }
        if o.bytes > self.budget_bytes / 4 {
            // One huge object would push out everything else.
            self.set_too_large(id);
            return;
        }
        self.bytes += o.bytes;
        if let Some(old) = self.objs.insert(id, o) {
            self.bytes -= old.bytes;
        }
        self.evict();
    }

    /// Applies a group's extent changes to the objects cached.
    pub fn apply(&mut self, ch: &GroupChanges) {
        if self.objs.is_empty() {
            return;
        }
        for (t, k, v) in &ch.kv {
            if *t != TID_EXTENTS {
                continue;
            }
            let Some((id, lb)) = crate::meta::ext_key_parse(k) else {
                continue;
            };
            let Some(o) = self.objs.get_mut(&id) else {
                continue;
            };
            let old = match v {
                Some(v) => {
                    let v = v.clone();
                    o.bytes += entry_bytes(&v);
                    self.bytes += entry_bytes(&v);
                    o.map.insert(lb, v)
                }
                None => o.map.remove(&lb),
            };
            if let Some(old) = old {
                o.bytes -= entry_bytes(&old);
                self.bytes -= entry_bytes(&old);
            }
        }
        self.evict();
    }

    /// Forgets everything (after a group applied to redb directly).
    pub fn clear(&mut self) {
        self.objs.clear();
        self.too_large.clear();
        self.bytes = 0;
    }

    /// Drops least recently used objects until at most 3/4 of the budget is held.
    fn evict(&mut self) {
        if self.bytes <= self.budget_bytes {
            return;
        }
        let mut by_age: Vec<(u64, u64)> =
            self.objs.iter().map(|(id, o)| (o.last_used, *id)).collect();
        by_age.sort_unstable();
        let target = self.budget_bytes / 4 * 3;
        for (_, id) in by_age {
            if self.bytes <= target {
                break;
            }
            if let Some(o) = self.objs.remove(&id) {
                self.bytes -= o.bytes;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::ext_key;

    fn ch(kv: &[(u64, u64, Option<&[u8]>)]) -> GroupChanges {
        GroupChanges {
            kv: kv
                .iter()
                .map(|(id, lb, v)| (TID_EXTENTS, ext_key(*id, *lb).to_vec(), v.map(Arc::from)))
                .collect(),
        }
    }

    #[test]
    fn follows_group_changes_and_stays_in_budget() {
        let mut c = ExtentCache::new(4096);
        assert!(c.object(7).is_none());
        c.load(7, vec![(0, vec![1; 10]), (64, vec![2; 10])]);
        c.apply(&ch(&[
            (7, 10, Some(&[3; 10])),
            (7, 64, None),
            (8, 0, Some(&[9])),
        ]));
        let got: Vec<(u64, u8)> = c
            .object(7)
            .unwrap()
            .iter()
            .map(|(lb, v)| (*lb, v[0]))
            .collect();
        assert_eq!(got, vec![(0, 1), (10, 3)]);
        assert!(c.object(8).is_none());
        // Loading more than the budget evicts the least recently used.
        for id in 100..200 {
            c.load(id, vec![(0, vec![0; 100])]);
        }
        assert!(c.bytes <= 4096);
        assert!(c.object(7).is_none());
        assert!(c.object(199).is_some());
        c.clear();
        assert!(c.object(199).is_none());
    }
}
