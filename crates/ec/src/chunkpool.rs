//! Recycled chunk buffers for [`crate::ErasureCode::encode_by_stripe`].
//! Owns their reuse and the bound on what it keeps idle; not the coding.
//!
//! Why: a 4 MiB 2+1 write codes into three fresh 2 MiB buffers. Fresh
//! memory is mapped page by page on first touch (512 page faults, each
//! zeroing a page, per chunk) — and the daemon's periodic heap release hands freed
//! buffers back to the kernel, so the next write faults again. A chunk's
//! buffer comes back here when the last `Bytes` of it drops (the store
//! wrote it, the replica acknowledged it) and the next write of that size
//! reuses it, already mapped.

use bytes::Bytes;
use cairn_types::idlepool::{IdlePool, IdlePoolLimits};
use std::time::Duration;

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

const LIMITS: IdlePoolLimits = IdlePoolLimits {
    min_bytes: CHUNK_POOL_MIN_BYTES,
    class_bytes: CHUNK_POOL_CLASS_BYTES,
    max_idle_bytes: CHUNK_POOL_MAX_IDLE_BYTES,
    idle_timeout: CHUNK_POOL_IDLE_TIMEOUT,
};

/// The process's chunk buffers (tests make their own).
static POOL: IdlePool = IdlePool::new(LIMITS);

/// An empty buffer with room for at least `capacity` bytes: a recycled one
/// of its size class when there is one. Hand it back with [`freeze`].
pub(crate) fn take(capacity: usize) -> Vec<u8> {
    take_from(&POOL, capacity)
}

fn take_from(pool: &IdlePool, capacity: usize) -> Vec<u8> {
    if capacity < CHUNK_POOL_MIN_BYTES {
        return Vec::with_capacity(capacity);
    }
    let class = pool.class_of(capacity);
    match pool.take(class) {
        Some(mut v) => {
            v.clear();
            v
        }
        None => Vec::with_capacity(class),
    }
}

/// Bytes `range` of `buf` (from [`take`]), as `Bytes` that return the
/// buffer to the pool when the last clone or slice of them drops.
pub(crate) fn freeze(buf: Vec<u8>, range: std::ops::Range<usize>) -> Bytes {
    freeze_into(&POOL, buf, range)
}

fn freeze_into(pool: &'static IdlePool, buf: Vec<u8>, range: std::ops::Range<usize>) -> Bytes {
    debug_assert!(range.end <= buf.len());
    if buf.capacity() < CHUNK_POOL_MIN_BYTES {
        return Bytes::from(buf).slice(range);
    }
    pool.freeze(buf, range)
}

/// Bytes of idle chunk buffers held now.
pub fn idle_bytes() -> usize {
    POOL.idle_bytes()
}

/// Frees idle buffers not reused within [`CHUNK_POOL_IDLE_TIMEOUT`].
pub fn trim_idle() {
    POOL.trim_idle();
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::time::Instant;

    fn own_pool() -> &'static IdlePool {
        Box::leak(Box::new(IdlePool::new(LIMITS)))
    }

    #[test]
    fn buffers_are_reused_and_the_idle_bytes_bounded() {
        let pool = own_pool();
        let idle = || pool.idle_bytes();
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
        pool.trim_idle_at(Instant::now() + CHUNK_POOL_IDLE_TIMEOUT);
        assert_eq!(idle(), 0, "idle buffers expire");
        // Small buffers bypass the pool.
        drop(freeze_into(pool, take_from(pool, 100), 0..0));
        assert_eq!(idle(), 0);
    }
}
