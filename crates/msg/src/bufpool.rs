//! Recycled receive buffers for big frame payloads. Owns their reuse, the
//! bound on what it keeps idle, and the placement of a payload's bulk
//! segment on a 4096-byte boundary; not the reading itself (see `io`).
//!
//! Why: a 4 MiB payload read into a freshly allocated buffer lands in pages
//! the kernel maps on first touch — one page fault (and a page zeroed) per
//! 4 KiB inside the socket copy. On the replicated 4 MiB write path that was
//! about 150,000 faults and 7 % of the OSD daemon's CPU per GB written
//! (`perf record -e page-faults`: 96 % of them in the receive copy). A buffer
//! handed back when the last `Bytes` of its payload drops is reused by the
//! next payload of the same size class, whose pages are already mapped.

use bytes::Bytes;
use cairn_types::idlepool::{IdlePool, IdlePoolLimits};
use std::time::Duration;

/// Payloads at least this big are read into pooled buffers; smaller ones
/// are allocated as before (the allocator serves them from its arenas).
pub const POOL_MIN_BYTES: usize = 256 << 10;
/// Buffer capacities are rounded up to a multiple of this (a size class).
pub const POOL_CLASS_BYTES: usize = 64 << 10;
/// Most bytes of idle buffers the process keeps for reuse; a buffer handed
/// back beyond it is freed.
pub const POOL_MAX_IDLE_BYTES: usize = 32 << 20;
/// Idle buffers not reused within this long are freed (checked whenever the
/// pool is used, and by [`trim_idle`]).
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(2);
/// Alignment of the bulk segment of a pooled payload (O_DIRECT's).
const ALIGN: usize = crate::frame::BULK_ALIGN;

const LIMITS: IdlePoolLimits = IdlePoolLimits {
    min_bytes: POOL_MIN_BYTES,
    class_bytes: POOL_CLASS_BYTES,
    max_idle_bytes: POOL_MAX_IDLE_BYTES,
    idle_timeout: POOL_IDLE_TIMEOUT,
};

/// The process's receive buffers (tests make their own).
static POOL: IdlePool = IdlePool::new(LIMITS);

/// A receive buffer for a `len`-byte payload whose byte `bulk_at` (if any)
/// must sit on an [`ALIGN`]-byte boundary: the buffer and the offset the
/// payload starts at. Its bytes are initialised (zero or an earlier
/// payload's), so it can be read into as a plain slice.
pub(crate) fn take(len: usize, bulk_at: Option<u16>) -> (Vec<u8>, usize) {
    take_from(&POOL, len, bulk_at)
}

fn take_from(pool: &IdlePool, len: usize, bulk_at: Option<u16>) -> (Vec<u8>, usize) {
    let class = pool.class_of(len + ALIGN);
    let reused = pool.take(class).filter(|b| b.len() == class);
    let buf = reused.unwrap_or_else(|| vec![0u8; class]);
    let at = usize::from(bulk_at.unwrap_or(0));
    let addr = buf.as_ptr() as usize;
    let start = (ALIGN - (addr + at) % ALIGN) % ALIGN;
    debug_assert!(start + len <= buf.len());
    (buf, start)
}

/// Frees idle buffers not reused within [`POOL_IDLE_TIMEOUT`] (a daemon
/// calls it periodically, so an idle process does not keep them).
pub fn trim_idle() {
    POOL.trim_idle();
}

/// Bytes of idle buffers the pool holds now.
pub fn idle_bytes() -> usize {
    POOL.idle_bytes()
}

/// The `len` payload bytes at `start` of a buffer from [`take`], as `Bytes`
/// that return the buffer to the pool when dropped.
pub(crate) fn freeze(buf: Vec<u8>, start: usize, len: usize) -> Bytes {
    freeze_into(&POOL, buf, start, len)
}

fn freeze_into(pool: &'static IdlePool, buf: Vec<u8>, start: usize, len: usize) -> Bytes {
    pool.freeze(buf, start..start + len)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::time::Instant;

    fn own_pool() -> &'static IdlePool {
        Box::leak(Box::new(IdlePool::new(LIMITS)))
    }

    #[test]
    fn buffers_are_reused_aligned_and_bounded() {
        let pool = own_pool();
        let idle = || pool.idle_bytes();
        let len = 4 << 20;
        let (mut buf, start) = take_from(pool, len, Some(100));
        assert_eq!((buf.as_ptr() as usize + start + 100) % ALIGN, 0);
        buf[start] = 7;
        let addr = buf.as_ptr() as usize;
        let b = freeze_into(pool, buf, start, len);
        assert_eq!((b.len(), b[0]), (len, 7));
        let slice = b.slice(10..20);
        drop(b);
        assert_eq!(idle(), 0, "a slice still holds the buffer");
        drop(slice);
        let class = (len + ALIGN).next_multiple_of(POOL_CLASS_BYTES);
        assert_eq!(idle(), class);
        let (again, start2) = take_from(pool, len, None);
        assert_eq!(again.as_ptr() as usize, addr, "the idle buffer is reused");
        assert_eq!((again.as_ptr() as usize + start2) % ALIGN, 0);
        assert_eq!(idle(), 0);
        // Another size class does not take it.
        let other = freeze_into(pool, again, start2, len);
        let (small, _) = take_from(pool, 1 << 20, None);
        assert_ne!(small.as_ptr(), other.as_ptr());
        drop(other);
        // Beyond the idle bound buffers are freed, not kept.
        let many: Vec<Bytes> = (0..POOL_MAX_IDLE_BYTES / class + 3)
            .map(|_| {
                let (b, s) = take_from(pool, len, None);
                freeze_into(pool, b, s, len)
            })
            .collect();
        drop(many);
        assert!(idle() <= POOL_MAX_IDLE_BYTES);
        pool.trim_idle_at(Instant::now());
        assert!(idle() > 0, "fresh idle buffers survive a trim");
        pool.trim_idle_at(Instant::now() + POOL_IDLE_TIMEOUT);
        assert_eq!(idle(), 0, "idle buffers expire");
    }
}
