//! A simulated disk for fault tests: it tracks which bytes are live (written)
//! and which are durable (synced), can lose unsynced writes on a simulated
//! power cut (tearing one of them at a random byte), and can fail a chosen
//! operation with EIO or ENOSPC. Not used in production.

use crate::device::StoreFile;
use rand::{Rng, SeedableRng};
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

#[derive(Debug, Default, Clone)]
struct SimState {
    live: Vec<u8>,
    durable: Vec<u8>,
    /// Writes since the last sync, in order.
    unsynced: Vec<(u64, Vec<u8>)>,
}

/// An in-memory file with live and durable images.
#[derive(Debug)]
pub struct SimFile {
    state: Mutex<SimState>,
    plan: Arc<FaultPlan>,
}

impl SimFile {
    pub fn new(plan: Arc<FaultPlan>) -> Arc<SimFile> {
        Arc::new(SimFile {
            state: Mutex::new(SimState::default()),
            plan,
        })
    }
    fn lock(&self) -> io::Result<std::sync::MutexGuard<'_, SimState>> {
        self.state
            .lock()
            .map_err(|_| io::Error::other("sim file lock poisoned"))
    }
    /// Simulates a power cut: returns a new file holding the durable image
    /// plus a random subset of the unsynced writes (each kept whole or
    /// dropped, one possibly torn at a random byte), as a real disk may.
    pub fn power_cut(&self, seed: u64, plan: Arc<FaultPlan>) -> io::Result<Arc<SimFile>> {
        let st = self.lock()?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut img = st.durable.clone();
        let torn = if st.unsynced.is_empty() {
            usize::MAX
        } else {
            rng.gen_range(0..st.unsynced.len())
        };
        for (i, (off, data)) in st.unsynced.iter().enumerate() {
            let keep = if i == torn {
                rng.gen_range(0..=data.len())
            } else if rng.gen_bool(0.5) {
                data.len()
            } else {
                0
            };
            let off = *off as usize;
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
            }),
            plan,
        }))
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
        self.plan.tick(true)?;
        let mut st = self.lock()?;
        let o = usize::try_from(offset).map_err(io::Error::other)?;
        if st.live.len() < o + buf.len() {
            st.live.resize(o + buf.len(), 0);
            let n = st.live.len();
            st.durable.resize(n, 0);
        }
        st.live[o..o + buf.len()].copy_from_slice(buf);
        st.unsynced.push((offset, buf.to_vec()));
        Ok(())
    }
    fn sync_data(&self) -> io::Result<()> {
        let _io = self.plan.gate.read();
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
