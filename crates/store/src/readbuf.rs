//! Recycled aligned buffers for big reads. A big read lands with O_DIRECT
//! in one of these and is returned as `Bytes` without a copy; fresh memory
//! would cost a page fault and a kernel zeroing per page (and `vec![0; n]`
//! a memset on top), so when the last `Bytes` of a buffer drops it goes
//! back to a small pool and the next read overwrites it as it is. Owns the
//! buffers, the bound on idle ones ([`IDLE_BYTES_MAX`] unless the store's
//! owner sets another) and their expiry; not the reads.

use crate::device::DIRECT_ALIGN;
use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Idle buffers kept for reuse, at most this many bytes per store, unless
/// the store's owner sets another bound ([`ReadBufPool::set_max_idle`]:
/// an OSD sizes it to its recovery in-flight bound, so the buffers of the
/// objects a recovery keeps in flight come back and are reused instead of
/// freed and faulted in again).
pub(crate) const IDLE_BYTES_MAX: usize = 16 << 20;
/// Idle buffers not reused within this long are freed (a store that
/// stopped reading big objects does not keep their memory).
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(2);

/// One allocation, aligned for O_DIRECT, initialised (zeroed) when made.
struct Buf {
    ptr: NonNull<u8>,
    cap: usize,
}

// SAFETY: `Buf` owns its allocation exclusively; moving it between threads
// moves that ownership, and `&Buf` only gives shared reads.
unsafe impl Send for Buf {}
unsafe impl Sync for Buf {}

impl Buf {
    fn new(cap: usize) -> Buf {
        let layout = Self::layout(cap);
        // SAFETY: the layout has a non-zero size (cap >= DIRECT_ALIGN).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        Buf { ptr, cap }
    }

    fn layout(cap: usize) -> Layout {
        Layout::from_size_align(cap, DIRECT_ALIGN).expect("read buffer layout")
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: valid for `cap` initialised bytes (zeroed at allocation,
        // only ever overwritten since).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.cap) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `bytes`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.cap)) }
    }
}

/// An idle buffer and when it was handed back.
struct Idle {
    buf: Buf,
    since: Instant,
}

/// The idle buffers of one store.
pub(crate) struct ReadBufPool {
    idle: Mutex<Vec<Idle>>,
    /// Most bytes of idle buffers kept.
    max_idle: AtomicUsize,
}

impl Default for ReadBufPool {
    fn default() -> ReadBufPool {
        ReadBufPool {
            idle: Mutex::new(Vec::new()),
            max_idle: AtomicUsize::new(IDLE_BYTES_MAX),
        }
    }
}

impl ReadBufPool {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A buffer of at least `len` bytes (an idle one no more than twice
    /// that size if there is one). Its bytes are whatever an earlier read
    /// left: the caller overwrites what it returns.
    pub(crate) fn take(self: &Arc<Self>, len: usize) -> PooledBuf {
        let need = len.max(1).div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
        let reused = {
            let mut idle = self.lock();
            expire(&mut idle, Instant::now());
            // The most recently handed back first: its pages are warmest.
            idle.iter()
                .rposition(|b| b.buf.cap >= need && b.buf.cap <= 2 * need)
                // `remove` keeps the rest oldest first (for `expire`).
                .map(|i| idle.remove(i).buf)
        };
        PooledBuf {
            buf: Some(reused.unwrap_or_else(|| Buf::new(need))),
            len,
            pool: self.clone(),
        }
    }

    pub(crate) fn idle_bytes(&self) -> usize {
        self.lock().iter().map(|b| b.buf.cap).sum()
    }

    /// Keeps at most `bytes` of idle buffers from now on (frees the
    /// oldest beyond it).
    pub(crate) fn set_max_idle(&self, bytes: usize) {
        self.max_idle.store(bytes, Ordering::Relaxed);
        let mut idle = self.lock();
        let mut held: usize = idle.iter().map(|b| b.buf.cap).sum();
        while held > bytes && !idle.is_empty() {
            held -= idle.remove(0).buf.cap;
        }
    }

    /// Frees the buffers idle for longer than [`IDLE_TIMEOUT`] at `now`.
    pub(crate) fn trim_idle_at(&self, now: Instant) {
        expire(&mut self.lock(), now);
    }

    fn give_back(&self, b: Buf) {
        let now = Instant::now();
        let mut idle = self.lock();
        expire(&mut idle, now);
        let held: usize = idle.iter().map(|b| b.buf.cap).sum();
        if held + b.cap <= self.max_idle.load(Ordering::Relaxed) {
            idle.push(Idle { buf: b, since: now });
        }
    }
}

/// Drops the buffers of `idle` handed back more than [`IDLE_TIMEOUT`]
/// before `now` (they are kept oldest first).
fn expire(idle: &mut Vec<Idle>, now: Instant) {
    let stale = idle
        .iter()
        .take_while(|b| now.saturating_duration_since(b.since) > IDLE_TIMEOUT)
        .count();
    idle.drain(..stale);
}

/// A buffer on loan from the pool: `len` bytes in use, back to the pool
/// when dropped (as the owner of the `Bytes` made from it, when the last
/// of those drops).
pub(crate) struct PooledBuf {
    buf: Option<Buf>,
    len: usize,
    pool: Arc<ReadBufPool>,
}

impl PooledBuf {
    /// The `len` bytes to fill; starts on a `DIRECT_ALIGN` boundary.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.len;
        match self.buf.as_mut() {
            Some(b) => &mut b.bytes_mut()[..len],
            None => &mut [],
        }
    }

    /// The filled buffer as shared bytes (no copy).
    pub(crate) fn into_bytes(self) -> bytes::Bytes {
        bytes::Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for PooledBuf {
    fn as_ref(&self) -> &[u8] {
        match self.buf.as_ref() {
            Some(b) => &b.bytes()[..self.len],
            None => &[],
        }
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.pool.give_back(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_reused_and_bounded() {
        let pool = Arc::new(ReadBufPool::default());
        let mut a = pool.take(100_000);
        assert_eq!(a.as_mut_slice().len(), 100_000);
        assert_eq!(a.as_mut_slice().as_ptr() as usize % DIRECT_ALIGN, 0);
        a.as_mut_slice().fill(7);
        let ptr = a.as_mut_slice().as_ptr();
        let bytes = a.into_bytes();
        assert_eq!(bytes.len(), 100_000);
        let part = bytes.slice(10..20);
        drop(bytes);
        assert_eq!(pool.idle_bytes(), 0, "still held by a slice");
        assert_eq!(&part[..], &[7u8; 10]);
        drop(part);
        assert_eq!(pool.idle_bytes(), 102_400);
        // The next read of a similar size gets the same memory back, as
        // the last read left it.
        let mut b = pool.take(90_000);
        assert_eq!(b.as_mut_slice().as_ptr(), ptr);
        assert_eq!(b.as_mut_slice()[0], 7);
        // Much smaller reads do not take big buffers.
        drop(b);
        let mut c = pool.take(4096);
        assert_ne!(c.as_mut_slice().as_ptr(), ptr);
        // At most IDLE_BYTES_MAX stays idle.
        let many: Vec<_> = (0..8).map(|_| pool.take(4 << 20)).collect();
        drop(many);
        assert!(pool.idle_bytes() <= IDLE_BYTES_MAX);
        drop(c);
    }

    #[test]
    fn the_idle_bound_can_be_raised_and_idle_buffers_expire() {
        let pool = Arc::new(ReadBufPool::default());
        pool.set_max_idle(64 << 20);
        let many: Vec<_> = (0..12).map(|_| pool.take(4 << 20)).collect();
        drop(many);
        assert_eq!(pool.idle_bytes(), 48 << 20, "all twelve kept");
        // Reused, not allocated again.
        let again: Vec<_> = (0..12).map(|_| pool.take(4 << 20)).collect();
        assert_eq!(pool.idle_bytes(), 0);
        drop(again);
        pool.set_max_idle(8 << 20);
        assert_eq!(
            pool.idle_bytes(),
            8 << 20,
            "lowering the bound frees the excess"
        );
        pool.trim_idle_at(Instant::now() + IDLE_TIMEOUT + Duration::from_millis(10));
        assert_eq!(pool.idle_bytes(), 0, "expired");
    }
}
