//! A simulated disk for fault tests: it tracks which bytes are live (written)
//! and which are durable (synced), can lose unsynced writes on a simulated
//! power cut (tearing one of them at a 512-byte sector boundary), and can
//! fail a chosen operation with EIO or ENOSPC. A file made with
//! [`SimFile::new_buffered`] models the page cache in front of it (writes
//! reach the disk at the next sync, in offset order). Not used in production.

use crate::device::StoreFile;
use rand::{Rng, SeedableRng};
use std::collections::BTreeSet;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockWriteGuard};

/// Which failure to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The write or sync returns EIO (and a failed write changes nothing).
    Eio,
    /// The write returns ENOSPC.
    Enospc,
}

/// Shared fault plan: counts mutating operations (writes, syncs, set_len)
/// across every file that shares it and fails the `fail_at`-th one.
#[derive(Debug, Default)]
pub struct FaultPlan {
    ops: AtomicU64,
    fail_at: Mutex<Option<(u64, Fault)>>,
    /// Held shared by every mutating op; [`FaultPlan::pause_io`] takes it
    /// exclusively so that several files can be power-cut at one instant
    /// while the store's background work (checkpoints) keeps running.
    gate: RwLock<()>,
}

impl FaultPlan {
    pub fn new() -> Arc<FaultPlan> {
        Arc::new(FaultPlan::default())
    }
    /// Fails the `n`-th mutating operation from now (0 = the next one).
    pub fn fail_after(&self, n: u64, fault: Fault) {
        let now = self.ops.load(Ordering::SeqCst);
        if let Ok(mut g) = self.fail_at.lock() {
            *g = Some((now + n, fault));
        }
    }
    pub fn clear(&self) {
        if let Ok(mut g) = self.fail_at.lock() {
            *g = None;
        }
    }
    /// Blocks every mutating op on files of this plan until the guard drops.
    pub fn pause_io(&self) -> Option<RwLockWriteGuard<'_, ()>> {
        self.gate.write().ok()
    }
    pub fn ops(&self) -> u64 {
        self.ops.load(Ordering::SeqCst)
    }
    fn tick(&self, is_write: bool) -> io::Result<()> {
        let n = self.ops.fetch_add(1, Ordering::SeqCst);
        let Ok(mut g) = self.fail_at.lock() else {
            return Ok(());
        };
        match *g {
            Some((at, fault)) if at == n => {
                *g = None;
                let code = match fault {
                    Fault::Enospc if is_write => libc::ENOSPC,
                    _ => libc::EIO,
                };
                Err(io::Error::from_raw_os_error(code))
            }
            _ => Ok(()),
        }
    }
}

/// The unit a device writes atomically: a power cut tears a write only at
/// these boundaries of the file. Every disk writes a logical sector whole
/// or not at all (NVMe's atomic write unit is at least one logical block;
/// PostgreSQL keeps `pg_control` under 512 bytes for this reason), and redb
/// relies on it for its 320-byte header: torn at a byte, the header's
/// region layout can claim pages the file does not have (a new length's
/// low byte beside the old one's high byte), which redb asserts on when it
/// opens (`tests/sim_faults.rs` hit it in 2 of 29 runs of the checkpoint
/// crash test while tears were byte-granular).
pub const SECTOR_BYTES: u64 = 512;

/// The page size of the simulated page cache of a buffered file.
const PAGE_BYTES: u64 = 4096;

#[derive(Debug, Default, Clone)]
struct SimState {
    live: Vec<u8>,
    durable: Vec<u8>,
    /// Writes on their way to the disk since the last sync, in order.
    unsynced: Vec<(u64, Vec<u8>)>,
    /// Buffered files: pages written since they last went to the disk.
    dirty: BTreeSet<u64>,
}

/// An in-memory file with live and durable images.
#[derive(Debug)]
pub struct SimFile {
    state: Mutex<SimState>,
    plan: Arc<FaultPlan>,
    /// Writes go to a page cache and reach the disk at `sync_data`.
    buffered: bool,
}

impl SimFile {
    /// A file whose every write is an I/O of its own (O_DIRECT, as the
    /// WAL's, or written at once): the write is the operation a fault hits.
    pub fn new(plan: Arc<FaultPlan>) -> Arc<SimFile> {
        Arc::new(SimFile {
            state: Mutex::new(SimState::default()),
            plan,
            buffered: false,
        })
    }
    /// A file written through the page cache, as redb's is: a write only
    /// dirties pages (it cannot fail, and reads see it); `sync_data` sends
    /// the dirty pages to the disk in offset order, one operation per page
    /// (where an injected fault hits; the sync reports it, as fsync reports
    /// a failed write-back), then flushes. A power cut may keep any of the
    /// dirty pages too. Besides being what a real kernel does, this makes a
    /// run replay exactly: redb hands a commit's pages over in the order of
    /// a randomly seeded hash map, and a fault or a cut that depended on
    /// that order differed between runs of one seed.
    pub fn new_buffered(plan: Arc<FaultPlan>) -> Arc<SimFile> {
        Arc::new(SimFile {
            state: Mutex::new(SimState::default()),
            plan,
            buffered: true,
        })
    }
    fn lock(&self) -> io::Result<std::sync::MutexGuard<'_, SimState>> {
        self.state
            .lock()
            .map_err(|_| io::Error::other("sim file lock poisoned"))
    }
    /// Simulates a power cut: returns a new file holding the durable image
    /// plus a random subset of the unsynced writes and, for a buffered
    /// file, of the dirty pages (each kept whole or dropped, one possibly
    /// torn at a sector boundary), as a real disk may.
    pub fn power_cut(&self, seed: u64, plan: Arc<FaultPlan>) -> io::Result<Arc<SimFile>> {
        let st = self.lock()?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut img = st.durable.clone();
        let mut writes: Vec<(u64, &[u8])> = st
            .unsynced
            .iter()
            .map(|(o, d)| (*o, d.as_slice()))
            .collect();
        writes.extend(st.dirty.iter().filter_map(|&p| page_of(&st.live, p)));
        let torn = if writes.is_empty() {
            usize::MAX
        } else {
            rng.gen_range(0..writes.len())
        };
        for (i, &(off, data)) in writes.iter().enumerate() {
            let keep = if i == torn {
                torn_prefix(&mut rng, off, data.len())
            } else if rng.gen_bool(0.5) {
                data.len()
            } else {
                0
            };
            let off = off as usize;
            // Only bytes inside the durable length survive (set_len is durable at once).
            let end = (off + keep).min(img.len());
            if off < end {
                img[off..end].copy_from_slice(&data[..end - off]);
            }
        }
        Ok(Arc::new(SimFile {
            state: Mutex::new(SimState {
                live: img.clone(),
                durable: img,
                unsynced: Vec::new(),
                dirty: BTreeSet::new(),
            }),
            plan,
            buffered: self.buffered,
        }))
    }
    /// What a power cut now chooses from, as (offset, length) in the order
    /// the cut draws them: the unsynced writes, then the dirty pages.
    pub fn unsynced_extents(&self) -> io::Result<Vec<(u64, usize)>> {
        let st = self.lock()?;
        let mut v: Vec<(u64, usize)> = st.unsynced.iter().map(|(o, d)| (*o, d.len())).collect();
        v.extend(
            st.dirty
                .iter()
                .filter_map(|&p| page_of(&st.live, p).map(|(o, d)| (o, d.len()))),
        );
        Ok(v)
    }
    /// Flips the bytes at `offset` in both images (bit rot).
    pub fn corrupt(&self, offset: u64, len: usize) -> io::Result<()> {
        let mut guard = self.lock()?;
        let st = &mut *guard;
        let o = offset as usize;
        for img in [&mut st.live, &mut st.durable] {
            let end = (o + len).min(img.len());
            for b in img.get_mut(o..end).into_iter().flatten() {
                *b ^= 0xA5;
            }
        }
        Ok(())
    }

    /// A buffered file's dirty pages go to the disk, in offset order, one
    /// operation each (a fault stops there: that page and the later ones
    /// stay dirty, and the sync fails).
    fn write_back(&self) -> io::Result<()> {
        let pages: Vec<u64> = self.lock()?.dirty.iter().copied().collect();
        for p in pages {
            self.plan.tick(true)?;
            let mut guard = self.lock()?;
            let st = &mut *guard;
            st.dirty.remove(&p);
            if let Some((off, data)) = page_of(&st.live, p) {
                let data = data.to_vec();
                st.unsynced.push((off, data));
            }
        }
        Ok(())
    }
}

/// Page `p` of `img` as (offset, bytes), cut at the end of the image.
fn page_of(img: &[u8], p: u64) -> Option<(u64, &[u8])> {
    let start = usize::try_from(p * PAGE_BYTES).ok()?;
    let end = (start + PAGE_BYTES as usize).min(img.len());
    (start < end).then(|| (p * PAGE_BYTES, &img[start..end]))
}

/// How many bytes of a torn write of `len` bytes at `off` reach the disk:
/// whole sectors only ([`SECTOR_BYTES`]), so 0, `len`, or up to one of the
/// sector boundaries inside the write, uniformly.
fn torn_prefix(rng: &mut impl Rng, off: u64, len: usize) -> usize {
    let end = off + len as u64;
    let first = (off / SECTOR_BYTES + 1) * SECTOR_BYTES;
    let inner = if end > first {
        (end - 1 - first) / SECTOR_BYTES + 1
    } else {
        0
    };
    match rng.gen_range(0..=inner + 1) {
        0 => 0,
        i if i == inner + 1 => len,
        i => (first + (i - 1) * SECTOR_BYTES - off) as usize,
    }
}

impl StoreFile for SimFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let st = self.lock()?;
        let o = usize::try_from(offset).map_err(io::Error::other)?;
        let src = st
            .live
            .get(o..o + buf.len())
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(src);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let _io = self.plan.gate.read();
        if !self.buffered {
            self.plan.tick(true)?;
        }
        let mut st = self.lock()?;
        let o = usize::try_from(offset).map_err(io::Error::other)?;
        if st.live.len() < o + buf.len() {
            st.live.resize(o + buf.len(), 0);
            let n = st.live.len();
            st.durable.resize(n, 0);
        }
        st.live[o..o + buf.len()].copy_from_slice(buf);
        if self.buffered {
            if !buf.is_empty() {
                let last = (offset + buf.len() as u64 - 1) / PAGE_BYTES;
                st.dirty.extend(offset / PAGE_BYTES..=last);
            }
        } else {
            st.unsynced.push((offset, buf.to_vec()));
        }
        Ok(())
    }
    fn sync_data(&self) -> io::Result<()> {
        let _io = self.plan.gate.read();
        if self.buffered {
            self.write_back()?;
        }
        self.plan.tick(false)?;
        let mut guard = self.lock()?;
        let st = &mut *guard;
        for (off, data) in st.unsynced.drain(..) {
            let o = off as usize;
            let end = (o + data.len()).min(st.durable.len());
            if o < end {
                st.durable[o..end].copy_from_slice(&data[..end - o]);
            }
        }
        Ok(())
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.lock()?.live.len() as u64)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        let _io = self.plan.gate.read();
        self.plan.tick(false)?;
        let mut st = self.lock()?;
        let n = usize::try_from(len).map_err(io::Error::other)?;
        st.live.resize(n, 0);
        st.durable.resize(n, 0);
        // Pages past the end are gone; a cut page's bytes past it are not kept.
        st.dirty.retain(|&p| p * PAGE_BYTES < len);
        Ok(())
    }
    fn preallocate(&self, len: u64) -> io::Result<()> {
        if self.len()? < len {
            self.set_len(len)?;
        }
        Ok(())
    }
    /// Modelled as an unsynced write of zeros (a cut may keep or drop it).
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<bool> {
        let end = offset.saturating_add(len).min(self.len()?);
        if offset < end {
            let zeros = vec![0u8; usize::try_from(end - offset).map_err(io::Error::other)?];
            self.write_at(&zeros, offset)?;
        }
        Ok(true)
    }
}
