//! A bounded pool of idle large byte buffers, reused by size class. Owns
//! the reuse, the bound on bytes kept idle and their expiry, and the
//! `Bytes` owner that hands a buffer back when its last clone drops; not
//! what the buffers are for (the messenger's receive buffers and the
//! erasure coder's chunk buffers each wrap one of these).
//!
//! Why: a fresh multi-MiB buffer is mapped page by page on first touch
//! (one page fault and a zeroed page per 4 KiB); a buffer whose pages are
//! already mapped avoids that on every big payload or chunk.

use bytes::Bytes;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The limits of one pool.
#[derive(Debug, Clone, Copy)]
pub struct IdlePoolLimits {
    /// Buffers of smaller capacity are not pooled.
    pub min_bytes: usize,
    /// Capacities are multiples of this (a size class).
    pub class_bytes: usize,
    /// Most bytes of idle buffers kept; a buffer handed back beyond it is freed.
    pub max_idle_bytes: usize,
    /// Idle buffers not reused within this long are freed.
    pub idle_timeout: Duration,
}

struct Idle {
    buf: Vec<u8>,
    since: Instant,
}

struct Inner {
    /// Capacity class -> idle buffers, most recently returned last.
    free: BTreeMap<usize, Vec<Idle>>,
    idle_bytes: usize,
}

/// Idle buffers by size class (a process keeps one per use in a `static`).
pub struct IdlePool {
    limits: IdlePoolLimits,
    inner: Mutex<Inner>,
}

impl IdlePool {
    pub const fn new(limits: IdlePoolLimits) -> IdlePool {
        IdlePool {
            limits,
            inner: Mutex::new(Inner {
                free: BTreeMap::new(),
                idle_bytes: 0,
            }),
        }
    }

    pub fn limits(&self) -> &IdlePoolLimits {
        &self.limits
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The size class a buffer of `len` bytes comes from.
    pub fn class_of(&self, len: usize) -> usize {
        len.next_multiple_of(self.limits.class_bytes)
    }

    /// An idle buffer of capacity `class` (contents as handed back), if any.
    pub fn take(&self, class: usize) -> Option<Vec<u8>> {
        let mut inner = self.lock();
        self.expire(&mut inner, Instant::now());
        let got = inner.free.get_mut(&class).and_then(Vec::pop)?;
        inner.idle_bytes -= got.buf.capacity();
        Some(got.buf)
    }

    /// Keeps `buf` for reuse unless it is too small, not a whole size
    /// class, or the idle bound is reached (then it is freed).
    pub fn give_back(&self, buf: Vec<u8>) {
        let now = Instant::now();
        let mut inner = self.lock();
        self.expire(&mut inner, now);
        let cap = buf.capacity();
        if cap < self.limits.min_bytes
            || !cap.is_multiple_of(self.limits.class_bytes)
            || inner.idle_bytes + cap > self.limits.max_idle_bytes
        {
            return;
        }
        inner.idle_bytes += cap;
        inner
            .free
            .entry(cap)
            .or_default()
            .push(Idle { buf, since: now });
    }

    /// `range` of `buf` as `Bytes` that hand the buffer back to this pool
    /// when the last clone or slice of them drops.
    pub fn freeze(&'static self, buf: Vec<u8>, range: std::ops::Range<usize>) -> Bytes {
        debug_assert!(range.end <= buf.len());
        Bytes::from_owner(Pooled {
            pool: self,
            buf,
            range,
        })
    }

    /// Bytes of idle buffers held now.
    pub fn idle_bytes(&self) -> usize {
        self.lock().idle_bytes
    }

    /// Frees idle buffers not reused within the timeout (a daemon calls it
    /// periodically, so an idle process does not keep them).
    pub fn trim_idle(&self) {
        self.trim_idle_at(Instant::now());
    }

    /// [`IdlePool::trim_idle`] as if the time were `now` (tests).
    pub fn trim_idle_at(&self, now: Instant) {
        let mut inner = self.lock();
        self.expire(&mut inner, now);
    }

    fn expire(&self, inner: &mut Inner, now: Instant) {
        let timeout = self.limits.idle_timeout;
        let mut freed = 0;
        for list in inner.free.values_mut() {
            list.retain(|i| {
                let keep = now.saturating_duration_since(i.since) < timeout;
                if !keep {
                    freed += i.buf.capacity();
                }
                keep
            });
        }
        inner.free.retain(|_, l| !l.is_empty());
        inner.idle_bytes -= freed;
    }
}

struct Pooled {
    pool: &'static IdlePool,
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
        self.pool.give_back(std::mem::take(&mut self.buf));
    }
}
