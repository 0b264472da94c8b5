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
//!
//! A miss costs a whole map's load (up to one record per block of the
//! object), a plain lookup only a short range scan, so when the objects
//! being written do not fit, loading on every miss (each load evicting
//! another map) costs far more than no cache: 4 KiB writes at random over
//! 1 GiB of fragmented 4 MiB objects (23 MiB of maps against a 15 MiB
//! budget) ran at 31 k writes/s with the cache and 54 k with none. So once
//! the cache is half full, at most one load is admitted per
//! [`LOOKUPS_PER_LOAD_WHEN_FULL`] lookups (hits or misses); the other misses
//! read through. A hot set that fits still ends up cached (one object per
//! 256 lookups: a few thousand writes load a few dozen objects); one that
//! does not costs about what no cache costs (a load of a 1024-extent map is
//! ~190 µs, so one per 256 lookups adds under 1 µs per write; at one per 32
//! the committer still spent 17 µs per write against 11 with no cache).

use crate::overlay::{GroupChanges, TID_EXTENTS};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// Bookkeeping bytes counted per cached extent (map node share, Arc header).
const ENTRY_OVERHEAD_BYTES: usize = 64;
/// Bookkeeping bytes counted per cached object.
const OBJECT_OVERHEAD_BYTES: usize = 128;
/// Ids of objects too large to cache remembered at most.
const MAX_TOO_LARGE: usize = 4096;
/// Once the cache is half full, lookups that must come between two loads.
pub(crate) const LOOKUPS_PER_LOAD_WHEN_FULL: u64 = 256;

/// One object's extent map: logical block -> encoded extent record.
struct ObjExtents {
    map: BTreeMap<u64, Arc<[u8]>>,
    bytes: usize,
    last_used: u64,
}

/// Load credit after one more lookup (kept to a few loads' worth).
fn earned(credit: u64) -> u64 {
    (credit + 1).min(4 * LOOKUPS_PER_LOAD_WHEN_FULL)
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
    /// Lookups not yet spent on admitting a load (at most a few loads' worth).
    load_credit: u64,
    /// Maps loaded since the cache was made.
    loads: u64,
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

    /// Object `id`'s extent map (logical block -> encoded record), if
    /// cached; a hit counts toward admitting the next load.
    pub fn object(&mut self, id: u64) -> Option<&BTreeMap<u64, Arc<[u8]>>> {
        self.tick += 1;
        let tick = self.tick;
        let o = self.objs.get_mut(&id)?;
        o.last_used = tick;
        self.load_credit = earned(self.load_credit);
        Some(&o.map)
    }

    /// Whether object `id` is cached (not a use: no hit counted).
    pub fn contains(&self, id: u64) -> bool {
        self.objs.contains_key(&id)
    }

    /// Whether to load object `id`'s map now, after a miss: not if it is
    /// known to be too large; once the cache is half full, only if enough
    /// lookups came since the last load (which this then spends; the miss
    /// itself counts as one). A caller told no reads through to the view.
    pub fn may_load(&mut self, id: u64) -> bool {
        if !self.enabled() || self.too_large.contains(&id) {
            return false;
        }
        self.load_credit = earned(self.load_credit);
        if self.bytes < self.budget_bytes / 2 {
            return true;
        }
        if self.load_credit < LOOKUPS_PER_LOAD_WHEN_FULL {
            return false;
        }
        self.load_credit -= LOOKUPS_PER_LOAD_WHEN_FULL;
        true
    }

    /// Maps loaded so far.
    #[cfg(test)]
    pub fn loads(&self) -> u64 {
        self.loads
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
        self.loads += 1;
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

    /// Plays a committer's lookups: a hit uses the map, a miss loads the
    /// map only if the cache admits it. Returns the loads and hits.
    fn play(c: &mut ExtentCache, ids: impl Iterator<Item = u64>) -> (u64, u64) {
        let (loads0, mut hits) = (c.loads(), 0);
        for id in ids {
            if c.contains(id) {
                assert!(c.object(id).is_some());
                hits += 1;
            } else if c.may_load(id) {
                c.load(id, vec![(0, vec![0; 36]), (1, vec![0; 36])]);
            }
        }
        (c.loads() - loads0, hits)
    }

    #[test]
    fn objects_that_do_not_fit_are_not_loaded_on_every_miss() {
        // 328 bytes counted per object: 24 fit in 8000; 100 are written at random.
        let mut c = ExtentCache::new(8000);
        let mut x = 7u64;
        let random = std::iter::from_fn(|| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            Some((x >> 33) % 100)
        });
        let (loads, hits) = play(&mut c, random.take(20_000));
        // Without the admission rule every miss (~75 %) loaded.
        assert!(hits > 3_000, "{hits} hits");
        assert!(
            loads <= 20 + 20_000 / LOOKUPS_PER_LOAD_WHEN_FULL,
            "{loads} loads, {hits} hits"
        );
        assert!(c.bytes <= 8000);
    }

    #[test]
    fn a_hot_set_that_fits_ends_up_cached() {
        let mut c = ExtentCache::new(8000);
        // Fill it with cold objects first, then write 15 hot ones over and over.
        play(&mut c, 1000..1040);
        play(&mut c, (0..400).flat_map(|_| 0..15));
        let (loads, hits) = play(&mut c, (0..10).flat_map(|_| 0..15));
        assert_eq!((loads, hits), (0, 150));
    }
}
