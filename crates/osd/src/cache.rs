//! The OSD's data cache: whole objects of replicated PGs that were read in
//! full, kept within a byte budget (a share of `osd_memory_target`), each
//! with the object version it holds and a crc32c of its bytes that is
//! checked on every hit. Owns the bytes, the LRU order, the admission rule
//! and the counters. It does not decide whether an entry may be served:
//! the runtime asks with the version the store holds now (so a write,
//! recovery or repair that changed the object makes the entry miss) and
//! drops an object's entry when a write to it starts.
//!
//! Admission resists scans: while the cache has room every whole-object
//! read is kept; once full, an object is kept only when it was read
//! recently before (its key is in a bounded "ghost" list of recent
//! misses), so one pass over more data than fits does not evict what is
//! read again and again.

use bytes::Bytes;
use cairn_ops::{ObjectName, Version};
use cairn_types::PgId;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Keys of recent misses remembered for admission, at most.
const GHOST_KEYS_MAX: usize = 8192;
/// An entry never takes more than this share of the cache (1/N).
const MAX_ENTRY_SHARE: u64 = 4;

type Key = (PgId, ObjectName);

struct Entry {
    version: Version,
    data: Bytes,
    crc: u32,
    /// Position in `lru`.
    tick: u64,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<Key, Entry>,
    /// tick -> key, oldest first.
    lru: BTreeMap<u64, Key>,
    next_tick: u64,
    bytes: u64,
    /// Recent misses, oldest first (admission once the cache is full),
    /// each with the number it was remembered under; a key re-remembered
    /// later leaves a stale older pair here.
    ghosts: VecDeque<(u64, Key)>,
    /// The keys of `ghosts` and their latest number (O(1) membership).
    ghost_keys: HashMap<Key, u64>,
    next_ghost: u64,
}

/// Counters and sizes of one OSD's data cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    pub capacity_bytes: u64,
    pub bytes: u64,
    pub entries: u64,
    pub hits: u64,
    pub hit_bytes: u64,
    pub misses: u64,
    pub inserts: u64,
    pub evictions: u64,
    /// Entries dropped because a write to the object started, or the
    /// store held another version when asked.
    pub invalidations: u64,
    /// Hits whose bytes no longer matched their checksum (dropped and
    /// read from the store instead).
    pub bad_checksums: u64,
}

/// See the module header.
pub struct DataCache {
    capacity_bytes: u64,
    inner: Mutex<Inner>,
    hits: AtomicU64,
    hit_bytes: AtomicU64,
    misses: AtomicU64,
    inserts: AtomicU64,
    evictions: AtomicU64,
    invalidations: AtomicU64,
    bad_checksums: AtomicU64,
}

impl DataCache {
    /// A cache of at most `capacity_bytes` of object data (0: off).
    pub fn new(capacity_bytes: u64) -> DataCache {
        DataCache {
            capacity_bytes,
            inner: Mutex::new(Inner::default()),
            hits: AtomicU64::new(0),
            hit_bytes: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            inserts: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            invalidations: AtomicU64::new(0),
            bad_checksums: AtomicU64::new(0),
        }
    }

    pub fn enabled(&self) -> bool {
        self.capacity_bytes > 0
    }

    /// Largest object the cache keeps.
    pub fn max_entry_bytes(&self) -> u64 {
        self.capacity_bytes / MAX_ENTRY_SHARE
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the cache holds some version of `oid` of `pgid` (no LRU
    /// update), so that a read not cached skips the version lookup. A
    /// "no" counts as a miss.
    pub fn probe(&self, pgid: PgId, oid: &ObjectName) -> bool {
        if !self.enabled() {
            return false;
        }
        let held = self.lock().entries.contains_key(&(pgid, oid.clone()));
        if !held {
            self.misses.fetch_add(1, Ordering::Relaxed);
        }
        held
    }

    /// The whole object `oid` of `pgid` and its crc32c if the cache holds
    /// it at `version` (the version the store holds now) and its bytes
    /// still match that checksum. An entry at another version is dropped.
    pub fn get(&self, pgid: PgId, oid: &ObjectName, version: Version) -> Option<(Bytes, u32)> {
        if !self.enabled() {
            return None;
        }
        let key = (pgid, oid.clone());
        let found = {
            let mut g = self.lock();
            let inner = &mut *g;
            match inner.entries.get_mut(&key) {
                Some(e) if e.version == version => {
                    inner.lru.remove(&e.tick);
                    e.tick = inner.next_tick;
                    inner.next_tick += 1;
                    inner.lru.insert(e.tick, key.clone());
                    Some((e.data.clone(), e.crc))
                }
                Some(_) => {
                    remove_entry(inner, &key);
                    self.invalidations.fetch_add(1, Ordering::Relaxed);
                    None
                }
                None => None,
            }
        };
        let Some((data, crc)) = found else {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        // Checked outside the lock: hits on other objects go on meanwhile.
        if crc32c::crc32c(&data) != crc {
            let mut g = self.lock();
            if g.entries.get(&key).is_some_and(|e| e.crc == crc) {
                remove_entry(&mut g, &key);
            }
            drop(g);
            self.bad_checksums.fetch_add(1, Ordering::Relaxed);
            self.misses.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "pg {pgid}: cached copy of {oid} failed its checksum; dropped, read from the store"
            );
            return None;
        }
        self.hits.fetch_add(1, Ordering::Relaxed);
        self.hit_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        Some((data, crc))
    }

    /// Offers the whole object `oid` at `version`, just read from the
    /// store (checksum-verified there; `crc` is the crc32c of `data` the
    /// store combined from the block crcs it verified). Kept if it fits,
    /// and either the cache has room or the object missed recently before.
    pub fn offer(&self, pgid: PgId, oid: &ObjectName, version: Version, data: &Bytes, crc: u32) {
        let size = data.len() as u64;
        if !self.enabled() || size > self.max_entry_bytes() {
            return;
        }
        let key = (pgid, oid.clone());
        {
            let mut g = self.lock();
            if g.entries.contains_key(&key) {
                return;
            }
            let has_room = g.bytes + size <= self.capacity_bytes;
            if !has_room && g.ghost_keys.remove(&key).is_none() {
                // Not a recent miss: remembered, not kept.
                if g.ghosts.len() >= GHOST_KEYS_MAX {
                    if let Some((n, old)) = g.ghosts.pop_front() {
                        if g.ghost_keys.get(&old) == Some(&n) {
                            g.ghost_keys.remove(&old);
                        }
                    }
                }
                let n = g.next_ghost;
                g.next_ghost += 1;
                g.ghost_keys.insert(key.clone(), n);
                g.ghosts.push_back((n, key));
                return;
            }
        }
        debug_assert_eq!(crc32c::crc32c(data), crc, "offered with a wrong crc");
        let mut g = self.lock();
        let inner = &mut *g;
        if inner.entries.contains_key(&key) {
            return;
        }
        while inner.bytes + size > self.capacity_bytes {
            let Some((_, old)) = inner.lru.pop_first() else {
                break;
            };
            if let Some(e) = inner.entries.remove(&old) {
                inner.bytes -= e.data.len() as u64;
                self.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
        let tick = inner.next_tick;
        inner.next_tick += 1;
        inner.lru.insert(tick, key.clone());
        inner.bytes += size;
        inner.entries.insert(
            key,
            Entry {
                version,
                // Shares the read's buffer (no copy); the store's aligned
                // buffers are at most one page bigger than the object.
                data: data.clone(),
                crc,
                tick,
            },
        );
        self.inserts.fetch_add(1, Ordering::Relaxed);
    }

    /// A write to `oid` starts: its cached copy goes.
    pub fn invalidate(&self, pgid: PgId, oid: &ObjectName) {
        if !self.enabled() {
            return;
        }
        let key = (pgid, oid.clone());
        let mut g = self.lock();
        if remove_entry(&mut g, &key) {
            self.invalidations.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Drops every entry of `pgid` (the PG left this OSD or re-peered).
    pub fn invalidate_pg(&self, pgid: PgId) {
        if !self.enabled() {
            return;
        }
        let mut g = self.lock();
        let keys: Vec<Key> = g.entries.keys().filter(|k| k.0 == pgid).cloned().collect();
        for k in keys {
            remove_entry(&mut g, &k);
            self.invalidations.fetch_add(1, Ordering::Relaxed);
        }
        g.ghosts.retain(|(_, k)| k.0 != pgid);
        g.ghost_keys.retain(|k, _| k.0 != pgid);
    }

    /// Drops everything (`cairn` tests and benchmarks measure cold reads).
    pub fn clear(&self) {
        let mut g = self.lock();
        *g = Inner::default();
    }

    pub fn stats(&self) -> CacheStats {
        let (bytes, entries) = {
            let g = self.lock();
            (g.bytes, g.entries.len() as u64)
        };
        CacheStats {
            capacity_bytes: self.capacity_bytes,
            bytes,
            entries,
            hits: self.hits.load(Ordering::Relaxed),
            hit_bytes: self.hit_bytes.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            inserts: self.inserts.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            invalidations: self.invalidations.load(Ordering::Relaxed),
            bad_checksums: self.bad_checksums.load(Ordering::Relaxed),
        }
    }

    /// Flips a bit of a cached object (tests of the checksum check).
    #[cfg(test)]
    fn corrupt(&self, pgid: PgId, oid: &ObjectName) {
        let mut g = self.lock();
        if let Some(e) = g.entries.get_mut(&(pgid, oid.clone())) {
            let mut v = e.data.to_vec();
            v[0] ^= 1;
            e.data = Bytes::from(v);
        }
    }
}

fn remove_entry(inner: &mut Inner, key: &Key) -> bool {
    match inner.entries.remove(key) {
        Some(e) => {
            inner.lru.remove(&e.tick);
            inner.bytes -= e.data.len() as u64;
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_types::PoolId;

    fn pg(seed: u32) -> PgId {
        PgId {
            pool: PoolId(1),
            seed,
        }
    }

    fn obj(n: u32) -> ObjectName {
        ObjectName::new("", format!("o{n}"))
    }

    fn v(seq: u64) -> Version {
        Version { epoch: 3, seq }
    }

    fn data(n: usize, b: u8) -> Bytes {
        Bytes::from(vec![b; n])
    }

    /// Offers `d` with its crc, as a store read hands it over.
    fn offer(c: &DataCache, pg: PgId, o: &ObjectName, v: Version, d: Bytes) {
        c.offer(pg, o, v, &d, crc32c::crc32c(&d));
    }

    #[test]
    fn hits_only_at_the_version_the_store_holds() {
        let c = DataCache::new(1 << 20);
        offer(&c, pg(0), &obj(1), v(5), data(1000, 7));
        assert_eq!(c.get(pg(0), &obj(1), v(5)).unwrap().0, data(1000, 7));
        assert!(c.get(pg(1), &obj(1), v(5)).is_none(), "another PG");
        // The store now holds a newer version: a miss, and the entry goes.
        assert!(c.get(pg(0), &obj(1), v(6)).is_none());
        assert!(c.get(pg(0), &obj(1), v(5)).is_none());
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.invalidations, s.entries), (1, 3, 1, 0));
    }

    #[test]
    fn writes_and_pg_changes_drop_entries() {
        let c = DataCache::new(1 << 20);
        for i in 0..4 {
            offer(&c, pg(i % 2), &obj(i), v(1), data(100, i as u8));
        }
        c.invalidate(pg(0), &obj(0));
        assert!(c.get(pg(0), &obj(0), v(1)).is_none());
        assert!(c.get(pg(0), &obj(2), v(1)).is_some());
        c.invalidate_pg(pg(1));
        assert!(c.get(pg(1), &obj(1), v(1)).is_none());
        assert!(c.get(pg(1), &obj(3), v(1)).is_none());
        assert!(c.get(pg(0), &obj(2), v(1)).is_some());
        assert_eq!(c.stats().bytes, 100);
    }

    #[test]
    fn stays_within_its_bytes_and_resists_a_scan() {
        let c = DataCache::new(4000);
        assert_eq!(c.max_entry_bytes(), 1000);
        offer(&c, pg(0), &obj(99), v(1), data(1001, 1));
        assert_eq!(c.stats().entries, 0, "too big for the cache");
        // Fills while there is room.
        for i in 0..4 {
            offer(&c, pg(0), &obj(i), v(1), data(1000, 1));
        }
        assert_eq!(c.stats().bytes, 4000);
        // A scan of new objects read once each does not evict them.
        for i in 10..20 {
            offer(&c, pg(0), &obj(i), v(1), data(1000, 1));
        }
        for i in 0..4 {
            assert!(c.get(pg(0), &obj(i), v(1)).is_some(), "o{i} evicted");
        }
        // An object read again soon is admitted, evicting the least
        // recently used one.
        assert!(c.get(pg(0), &obj(2), v(1)).is_some());
        offer(&c, pg(0), &obj(19), v(1), data(1000, 1));
        assert!(c.get(pg(0), &obj(19), v(1)).is_some());
        let s = c.stats();
        assert_eq!((s.bytes, s.entries, s.evictions), (4000, 4, 1));
        assert!(c.get(pg(0), &obj(0), v(1)).is_none(), "o0 was the oldest");
    }

    #[test]
    fn remembers_a_bounded_number_of_recent_misses() {
        let c = DataCache::new(4000);
        for i in 0..4 {
            offer(&c, pg(0), &obj(i), v(1), data(1000, 1));
        }
        let last = 10 + GHOST_KEYS_MAX as u32;
        for i in 10..=last {
            offer(&c, pg(0), &obj(i), v(1), data(1000, 1));
        }
        assert_eq!(c.stats().inserts, 4, "misses are only remembered");
        // The oldest miss was forgotten: offered again, only remembered.
        offer(&c, pg(0), &obj(10), v(1), data(1000, 1));
        assert!(c.get(pg(0), &obj(10), v(1)).is_none());
        // A recent one is admitted on its second miss.
        offer(&c, pg(0), &obj(last), v(1), data(1000, 1));
        assert!(c.get(pg(0), &obj(last), v(1)).is_some());
        // A PG's misses go with its entries.
        offer(&c, pg(1), &obj(1), v(1), data(1000, 1));
        c.invalidate_pg(pg(1));
        offer(&c, pg(1), &obj(1), v(1), data(1000, 1));
        assert!(c.get(pg(1), &obj(1), v(1)).is_none());
    }

    #[test]
    fn a_corrupted_entry_is_never_served() {
        let c = DataCache::new(1 << 20);
        offer(&c, pg(0), &obj(1), v(1), data(4096, 3));
        c.corrupt(pg(0), &obj(1));
        assert!(c.get(pg(0), &obj(1), v(1)).is_none());
        let s = c.stats();
        assert_eq!((s.bad_checksums, s.entries), (1, 0));
    }

    #[test]
    fn a_zero_capacity_cache_keeps_nothing() {
        let c = DataCache::new(0);
        offer(&c, pg(0), &obj(1), v(1), data(10, 3));
        assert!(c.get(pg(0), &obj(1), v(1)).is_none());
        assert_eq!(c.stats(), CacheStats::default());
    }
}
