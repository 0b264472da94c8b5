//! Background zeroing of the data file's never-written free space: owns the
//! thread that, while the store is idle, writes zeros over free blocks the
//! filesystem still holds as *unwritten* (preallocated at mkfs), so that
//! later client writes land on written blocks and the filesystem does not
//! convert extents on the write path. It never touches an allocated block
//! (it takes the blocks out of the allocator while it writes them), never
//! fills punched holes (they are not unwritten extents), and nothing on disk
//! depends on it: a crash midway leaves free blocks that are zeros or still
//! unwritten, and free blocks' contents are never read.

use crate::store::Inner;
use std::io;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes of zeros written per I/O (one chunk at a time, so a client write
/// arriving meanwhile waits behind at most one).
pub(crate) const ZERO_CHUNK_BYTES: usize = 4 << 20;
/// Alignment of the O_DIRECT zero writes.
const ALIGN: u64 = 4096;
/// Longest sleep between looks at the idle clock.
const IDLE_POLL: Duration = Duration::from_millis(100);

/// What the zeroing thread did (tests and logs).
#[derive(Debug, Default, Clone, Copy)]
pub struct ZeroingStats {
    /// Bytes of unwritten free space zeroed so far.
    pub zeroed_bytes: u64,
    /// The pass is over: no unwritten free space left (or the filesystem
    /// cannot tell, or zeroing is off).
    pub finished: bool,
}

/// Shared between the store handle and the thread.
#[derive(Default)]
pub(crate) struct ZeroState {
    stop: Mutex<bool>,
    stop_cv: Condvar,
    pub(crate) stats: Mutex<ZeroingStats>,
}

/// The running zeroing thread; stopped and joined on drop.
pub(crate) struct Zeroer {
    state: Arc<ZeroState>,
    thread: Option<JoinHandle<()>>,
}

impl Zeroer {
    /// Starts the thread (or, with zeroing off, records the pass as finished).
    pub(crate) fn spawn(inner: Arc<Inner>, state: Arc<ZeroState>) -> Zeroer {
        let on = inner.cfg.zero_unwritten && !inner.cfg.discard_freed_blocks;
        let thread = if on {
            let st = state.clone();
            std::thread::Builder::new()
                .name("store-zero".into())
                .spawn(move || run(&inner, &st))
                .map_err(|e| tracing::warn!(error = %e, "cannot start the zeroing thread"))
                .ok()
        } else {
            None
        };
        if thread.is_none() {
            finish(&state);
        }
        Zeroer { state, thread }
    }
}

impl Drop for Zeroer {
    fn drop(&mut self) {
        if let Ok(mut s) = self.state.stop.lock() {
            *s = true;
        }
        self.state.stop_cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn finish(state: &ZeroState) {
    if let Ok(mut s) = state.stats.lock() {
        s.finished = true;
    }
}

fn run(inner: &Inner, state: &ZeroState) {
    let started = Instant::now();
    match zero_pass(inner, state) {
        Ok(()) => {
            let z = state.stats.lock().map(|s| s.zeroed_bytes).unwrap_or(0);
            if z > 0 {
                tracing::info!(
                    zeroed_mib = z >> 20,
                    secs = started.elapsed().as_secs_f64(),
                    "unwritten free space of the data file zeroed"
                );
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "zeroing unwritten free space stopped; later writes there pay the filesystem's extent conversion")
        }
    }
    finish(state);
}

/// Sleeps until nothing was submitted for `zero_idle_ms`; false when asked
/// to stop (or the store is poisoned).
fn wait_idle(inner: &Inner, state: &ZeroState) -> bool {
    let idle_ms = inner.cfg.zero_idle_ms;
    loop {
        if inner.is_poisoned() {
            return false;
        }
        let quiet = inner.ms_since_last_activity();
        if quiet >= idle_ms {
            return true;
        }
        let Ok(stop) = state.stop.lock() else {
            return false;
        };
        if *stop {
            return false;
        }
        let wait = Duration::from_millis(idle_ms - quiet).min(IDLE_POLL);
        match state.stop_cv.wait_timeout(stop, wait) {
            Ok((stop, _)) if !*stop => {}
            _ => return false,
        }
    }
}

fn stopped(state: &ZeroState) -> bool {
    state.stop.lock().map(|s| *s).unwrap_or(true)
}

/// One pass from the start of the data area to its end.
fn zero_pass(inner: &Inner, state: &ZeroState) -> io::Result<()> {
    let bs = inner.block_size;
    let end = (inner.first_block + inner.usable_blocks) * bs;
    let mut cursor = inner.first_block * bs;
    let zeros = ZeroBuf::new(ZERO_CHUNK_BYTES)?;
    while cursor < end {
        if !wait_idle(inner, state) {
            return Ok(());
        }
        let next = match inner.data.unwritten_ranges(cursor, end - cursor, 1)? {
            None => return Ok(()),
            Some(r) => match r.first() {
                None => return Ok(()),
                Some(&r) => r,
            },
        };
        // One chunk of the next unwritten range, aligned for O_DIRECT.
        let s = next.0.max(cursor).div_ceil(ALIGN) * ALIGN;
        let e = ((next.0 + next.1).min(s + ZERO_CHUNK_BYTES as u64) / ALIGN) * ALIGN;
        cursor = (next.0 + next.1)
            .min(s + ZERO_CHUNK_BYTES as u64)
            .max(cursor + ALIGN);
        if e <= s {
            continue;
        }
        let zeroed = zero_free_part(inner, s, e, &zeros)?;
        if let Ok(mut st) = state.stats.lock() {
            st.zeroed_bytes += zeroed;
        }
        if stopped(state) {
            return Ok(());
        }
    }
    Ok(())
}

/// Writes zeros over the free blocks of `[s, e)` (bytes), holding them out
/// of the allocator meanwhile; returns the bytes written.
fn zero_free_part(inner: &Inner, s: u64, e: u64, zeros: &ZeroBuf) -> io::Result<u64> {
    let bs = inner.block_size;
    let (b0, b1) = (s / bs, e.div_ceil(bs));
    let held = inner.hold_free_blocks(b0, b1 - b0);
    let mut res = Ok(0);
    for &(rs, rl) in &held {
        let (ws, we) = ((rs * bs).max(s), ((rs + rl) * bs).min(e));
        let mut at = ws;
        while at < we {
            let n = (we - at).min(ZERO_CHUNK_BYTES as u64) as usize;
            if let Err(err) = inner.data.write_at_direct(&zeros.as_slice()[..n], at) {
                res = Err(err);
                break;
            }
            at += n as u64;
        }
        match &mut res {
            Ok(z) => *z += at - ws,
            Err(_) => break,
        }
    }
    inner.unhold_blocks(&held);
    res
}

/// A zero-filled heap buffer aligned for O_DIRECT.
struct ZeroBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

impl ZeroBuf {
    fn new(len: usize) -> io::Result<ZeroBuf> {
        let layout = std::alloc::Layout::from_size_align(len, ALIGN as usize)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: layout has non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(raw)
            .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        Ok(ZeroBuf { ptr, layout })
    }
    fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for layout.size() initialised (zeroed) bytes, never written.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for ZeroBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this exact layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: the buffer is only read after creation.
unsafe impl Send for ZeroBuf {}
