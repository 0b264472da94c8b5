//! Recycled chunk buffers for [`crate::ErasureCode::encode_by_stripe`].
//! Owns their reuse and the bound on what it keeps idle; not the coding.
//!
//! Why: a 4 MiB 2+1 write codes into three fresh 2 MiB buffers. Fresh
//! memory is mapped page by page on first touch (512 page faults, each
//! zeroing a page, per chunk) — and glibc's periodic heap trim hands freed
//! buffers back to the kernel, so the next write faults again. A chunk's
//! buffer comes back here when the last `Bytes` of it drops (the store
//! wrote it, the replica acknowledged it) and the next write of that size
//! reuses it, already mapped.

use bytes::Bytes;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Buffers below this capacity are not pooled (the allocator's arenas
/// serve them without faults worth saving).
pub const CHUNK_POOL_MIN_BYTES: usize = 256 << 10;
/// Capacities are rounded up to a multiple of this (a size class).
pub const CHUNK_POOL_CLASS_BYTES: usize = 64 << 10;
/// Most bytes of idle buffers kept for reuse; a buffer handed back beyond
/// it is freed.
pub const CHUNK_POOL_MAX_IDLE_BYTES: usize = 24 << 20;
/// Idle buffers not reused within this long are freed.
pub const CHUNK_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(2);

struct Idle {
    buf: Vec<u8>,
    since: Instant,
}

#[derive(Default)]
struct Pool {
    free: BTreeMap<usize, Vec<Idle>>,
    idle_bytes: usize,
}

type SharedPool = Mutex<Pool>;

static POOL: SharedPool = Mutex::new(Pool {
    free: BTreeMap::new(),
    idle_bytes: 0,
});

fn lock(pool: &SharedPool) -> std::sync::MutexGuard<'_, Pool> {
    pool.lock().unwrap_or_else(|p| p.into_inner())
}

impl Pool {
    fn expire(&mut self, now: Instant) {
        let mut freed = 0;
        for list in self.free.values_mut() {
            list.retain(|i| {
                let keep = now.duration_since(i.since) < CHUNK_POOL_IDLE_TIMEOUT;
                if !keep {
                    freed += i.buf.capacity();
                }
                keep
            });
        }
        self.free.retain(|_, l| !l.is_empty());
        self.idle_bytes -= freed;
    }

    fn take(&mut self, class: usize, now: Instant) -> Option<Vec<u8>> {
        self.expire(now);
        let got = self.free.get_mut(&class).and_then(Vec::pop)?;
        self.idle_bytes -= got.buf.capacity();
        Some(got.buf)
    }

    fn give_back(&mut self, mut buf: Vec<u8>, now: Instant) {
        self.expire(now);
        let cap = buf.capacity();
        if cap < CHUNK_POOL_MIN_BYTES
            || !cap.is_multiple_of(CHUNK_POOL_CLASS_BYTES)
            || self.idle_bytes + cap > CHUNK_POOL_MAX_IDLE_BYTES
        {
            return;
        }
        buf.clear();
        self.idle_bytes += cap;
        self.free
            .entry(cap)
            .or_default()
            .push(Idle { buf, since: now });
    }
}

/// An empty buffer with room for at least `capacity` bytes: a recycled one
/// of its size class when there is one. Hand it back with [`freeze`].
pub(crate) fn take(capacity: usize) -> Vec<u8> {
    take_from(&POOL, capacity)
}

fn take_from(pool: &SharedPool, capacity: usize) -> Vec<u8> {
    if capacity < CHUNK_POOL_MIN_BYTES {
        return Vec::with_capacity(capacity);
    }
    let class = capacity.next_multiple_of(CHUNK_POOL_CLASS_BYTES);
    lock(pool)
        .take(class, Instant::now())
        .unwrap_or_else(|| Vec::with_capacity(class))
}

/// Bytes `range` of `buf` (from [`take`]), as `Bytes` that return the
/// buffer to the pool when the last clone or slice of them drops.
pub(crate) fn freeze(buf: Vec<u8>, range: std::ops::Range<usize>) -> Bytes {
    freeze_into(&POOL, buf, range)
}

fn freeze_into(pool: &'static SharedPool, buf: Vec<u8>, range: std::ops::Range<usize>) -> Bytes {
    debug_assert!(range.end <= buf.len());
    if buf.capacity() < CHUNK_POOL_MIN_BYTES {
        return Bytes::from(buf).slice(range);
    }
    Bytes::from_owner(Pooled { pool, buf, range })
}

/// Bytes of idle chunk buffers held now.
pub fn idle_bytes() -> usize {
    lock(&POOL).idle_bytes
}

/// Frees idle buffers not reused within [`CHUNK_POOL_IDLE_TIMEOUT`].
pub fn trim_idle() {
    lock(&POOL).expire(Instant::now());
}

struct Pooled {
    pool: &'static SharedPool,
    buf: Vec<u8>,
    range: std::ops::Range<usize>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf[self.range.clone()]
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        lock(self.pool).give_back(buf, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own_pool() -> &'static SharedPool {
        Box::leak(Box::new(Mutex::new(Pool::default())))
    }

    #[test]
    fn buffers_are_reused_and_the_idle_bytes_bounded() {
        let pool = own_pool();
        let idle = || lock(pool).idle_bytes;
        let want = (2 << 20) + 4096;
        let mut v = take_from(pool, want);
        let class = v.capacity();
        assert!(class >= want && class.is_multiple_of(CHUNK_POOL_CLASS_BYTES));
        v.extend_from_slice(&vec![7u8; want]);
        let addr = v.as_ptr();
        let b = freeze_into(pool, v, 4096..want);
        assert_eq!((b.len(), b[0]), (want - 4096, 7));
        let s = b.slice(1..2);
        drop(b);
        assert_eq!(idle(), 0, "a slice still holds the buffer");
        drop(s);
        assert_eq!(idle(), class);
        let again = take_from(pool, want);
        assert_eq!((again.as_ptr(), again.len()), (addr, 0), "reused, empty");
        assert_eq!(idle(), 0);
        drop(freeze_into(pool, again, 0..0));
        // Beyond the bound buffers are freed, not kept.
        let many: Vec<Bytes> = (0..CHUNK_POOL_MAX_IDLE_BYTES / class + 3)
            .map(|_| freeze_into(pool, take_from(pool, want), 0..0))
            .collect();
        drop(many);
        assert!(idle() <= CHUNK_POOL_MAX_IDLE_BYTES);
        lock(pool).expire(Instant::now() + CHUNK_POOL_IDLE_TIMEOUT);
        assert_eq!(idle(), 0, "idle buffers expire");
        // Small buffers bypass the pool.
        drop(freeze_into(pool, take_from(pool, 100), 0..0));
        assert_eq!(idle(), 0);
    }
}
