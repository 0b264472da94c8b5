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
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

struct Idle {
    buf: Vec<u8>,
    since: Instant,
}

/// A set of idle buffers by size class (the process has one, [`POOL`];
/// tests make their own).
#[derive(Default)]
struct Pool {
    /// Capacity class -> idle buffers, most recently returned last.
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
                let keep = now.duration_since(i.since) < POOL_IDLE_TIMEOUT;
                if !keep {
                    freed += i.buf.len();
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
        self.idle_bytes -= got.buf.len();
        Some(got.buf)
    }

    fn give_back(&mut self, buf: Vec<u8>, now: Instant) {
        self.expire(now);
        if buf.len() < POOL_MIN_BYTES || self.idle_bytes + buf.len() > POOL_MAX_IDLE_BYTES {
            return;
        }
        self.idle_bytes += buf.len();
        self.free
            .entry(buf.len())
            .or_default()
            .push(Idle { buf, since: now });
    }
}

/// A receive buffer for a `len`-byte payload whose byte `bulk_at` (if any)
/// must sit on an [`ALIGN`]-byte boundary: the buffer and the offset the
/// payload starts at. Its bytes are initialised (zero or an earlier
/// payload's), so it can be read into as a plain slice.
pub(crate) fn take(len: usize, bulk_at: Option<u16>) -> (Vec<u8>, usize) {
    take_from(&POOL, len, bulk_at)
}

fn take_from(pool: &SharedPool, len: usize, bulk_at: Option<u16>) -> (Vec<u8>, usize) {
    let class = (len + ALIGN).next_multiple_of(POOL_CLASS_BYTES);
    let reused = lock(pool).take(class, Instant::now());
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
    lock(&POOL).expire(Instant::now());
}

/// Bytes of idle buffers the pool holds now.
pub fn idle_bytes() -> usize {
    lock(&POOL).idle_bytes
}

/// The owner behind a pooled payload's `Bytes`: gives the buffer back when
/// the last clone or slice of the payload is dropped.
struct Pooled {
    pool: &'static SharedPool,
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        lock(self.pool).give_back(buf, Instant::now());
    }
}

/// The `len` payload bytes at `start` of a buffer from [`take`], as `Bytes`
/// that return the buffer to the pool when dropped.
pub(crate) fn freeze(buf: Vec<u8>, start: usize, len: usize) -> Bytes {
    freeze_into(&POOL, buf, start, len)
}

fn freeze_into(pool: &'static SharedPool, buf: Vec<u8>, start: usize, len: usize) -> Bytes {
    Bytes::from_owner(Pooled {
        pool,
        buf,
        start,
        len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own_pool() -> &'static SharedPool {
        Box::leak(Box::new(Mutex::new(Pool::default())))
    }

    #[test]
    fn buffers_are_reused_aligned_and_bounded() {
        let pool = own_pool();
        let idle = || lock(pool).idle_bytes;
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
        lock(pool).expire(Instant::now());
        assert!(idle() > 0, "fresh idle buffers survive a trim");
        lock(pool).expire(Instant::now() + POOL_IDLE_TIMEOUT);
        assert_eq!(idle(), 0, "idle buffers expire");
    }
}
