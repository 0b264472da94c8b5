//! The store handle: create/open (with WAL replay), the group-commit
//! pipeline (WAL append, lazy apply, checkpoints) and the read API. Op
//! semantics live in `apply.rs`, the WAL record format in `wal.rs`, integrity
//! walks in `fsck.rs`.

use crate::alloc::Allocator;
use crate::apply::{self, Batch, Prewrite, Tables, MAX_RUN_BYTES};
use crate::device::{KvBackend, OsFile, StoreFile};
use crate::error::{Result, StoreError};
use crate::extcache::ExtentCache;
use crate::ids::{CollectionId, ObjectId};
pub use crate::intake::CommitHandle;
use crate::intake::{Completion, Empty, GroupAck, Intake, Ordered};
use crate::meta::*;
use crate::overlay::{
    GroupChanges, KvRead, Overlay, ReadView, TID_COLLS, TID_OBJECTS, TID_OMAP, TID_PGLOG,
    TID_PGMETA,
};
use crate::prepare::{DataJob, DataWriters, Prep};
use crate::txn::Transaction;
use crate::wal::{self, RedoLog, WalWriter, WAL_ALIGN};
use crate::zeroer::{ZeroState, Zeroer, ZeroingStats};
use redb::{Database, Durability, ReadTransaction, ReadableTable};
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Name of the data file inside the store directory.
pub const DATA_FILE: &str = "block";
/// Name of the metadata (redb) file inside the store or meta directory.
pub const META_FILE: &str = "meta.redb";
/// Name of the write-ahead log inside the store or meta directory.
pub const WAL_FILE: &str = "wal";
const LOCK_FILE: &str = "LOCK";
/// Smallest write-ahead log accepted.
const MIN_WAL_BYTES: u64 = 256 << 10;
/// The WAL sized from the data device (`wal_bytes` = 0): this fraction of
/// it, between [`AUTO_WAL_MIN_BYTES`] and [`AUTO_WAL_MAX_BYTES`].
const AUTO_WAL_DATA_FRACTION: u64 = 16;
const AUTO_WAL_MIN_BYTES: u64 = 32 << 20;
const AUTO_WAL_MAX_BYTES: u64 = 256 << 20;
/// Largest single WAL record (also bounded by a quarter of the log).
const MAX_WAL_RECORD_BYTES: u64 = 16 << 20;
/// How often the committer looks whether a background checkpoint's syncs are done.
const FLUSH_POLL: Duration = Duration::from_millis(2);
/// How often a wait on another store thread looks whether the store was
/// poisoned meanwhile (that thread may have died and will never answer).
const POISON_POLL: Duration = Duration::from_millis(100);
/// Small writes (below `deferred_write_below_bytes`) fill free runs of at
/// least this many bytes sequentially (see `alloc`), so that a checkpoint
/// writes them back in large I/Os.
const SMALL_WRITE_FILL_RUN_BYTES: u64 = 1 << 20;
/// Overlay memory (metadata changes not yet in redb) that starts a checkpoint
/// even before `checkpoint_interval_ms` or a quarter-full log.
const OVERLAY_CHECKPOINT_BYTES: usize = 16 << 20;

/// Store configuration. `block_size` and `data_bytes` only matter at create.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Directory holding the data file (and the metadata unless `meta_path` is set).
    pub path: PathBuf,
    /// Optional directory on a faster device for the metadata/WAL file.
    pub meta_path: Option<PathBuf>,
    /// Checksum and allocation unit: power of two in 4 KiB..=64 KiB.
    pub block_size: u32,
    /// Size of the preallocated data file.
    pub data_bytes: u64,
    /// `store_cache_bytes`: the metadata engine's cache budget.
    pub cache_bytes: u64,
    /// Data allocations fail with `StoreFull` above this fraction of capacity.
    pub full_ratio: f64,
    /// `statfs` reports `NearFull` above this fraction.
    pub nearfull_ratio: f64,
    /// `osd_max_object_size`.
    pub max_object_size: u64,
    /// Free space kept on the metadata filesystem; below it only deletions commit.
    pub meta_reserve_bytes: u64,
    /// Bytes of submitted-but-uncommitted payload before `submit` blocks.
    pub max_inflight_bytes: u64,
    /// Threads that write (and sync) the data of large writes after
    /// `submit` returned: at most this many such writes run at once.
    pub data_writer_threads: usize,
    /// Most transactions in one group commit.
    pub max_batch_txns: usize,
    /// Size of the write-ahead log file (used at create; at open the file's
    /// length). 0 (the default): sized from the data device, 1/16 of it
    /// between 32 MiB and 256 MiB — a larger log means fewer checkpoints
    /// (each one a data sync and a redb commit), see [`StoreConfig::wal_bytes_for`].
    pub wal_bytes: u64,
    /// Writes shorter than this are deferred: their data rides in the WAL
    /// record and reaches the data file without a sync of its own. Longer
    /// block-aligned writes go straight to new blocks (synced before the record).
    pub deferred_write_below_bytes: u64,
    /// Longest time acknowledged transactions stay only in the WAL before a
    /// checkpoint makes them durable in the data file and metadata.
    pub checkpoint_interval_ms: u64,
    /// `bdev_enable_discard` (Ceph's name, also off by default there):
    /// blocks freed by zero, truncate and remove are punched out of the data
    /// file (discarded on a device), so a thin-provisioned or sparse backing
    /// store shrinks. Off: the space stays written and reserved in the data
    /// file and later writes land on written blocks (no unwritten-extent
    /// conversion by the filesystem on the write path).
    pub discard_freed_blocks: bool,
    /// Write zeros, in the background and only while the store is idle,
    /// into free data-file space the filesystem still holds as unwritten
    /// (preallocated, never written), so later writes land on written
    /// blocks. Only where the filesystem reports unwritten extents (FIEMAP;
    /// ext4, XFS); never on raw devices; never into punched holes. Off by
    /// default (it writes the whole data file once); OSDs take it from
    /// `osd_zero_unwritten`.
    pub zero_unwritten: bool,
    /// The store counts as idle (and the zeroing runs) once nothing was
    /// submitted for this long.
    pub zero_idle_ms: u64,
    /// Every this many ms (0: never) the checkpoint thread starts the
    /// write-back of the data file's dirty pages (small writes' blocks)
    /// without waiting for it, so a checkpoint's data sync is not one burst
    /// of I/O in front of the log's flushes. Durability does not depend on it.
    pub writeback_pace_ms: u64,
    /// Percent of `cache_bytes` given to the committer's cache of whole
    /// extent maps of recently written objects (the rest is redb's page
    /// cache). 0: no such cache.
    pub extent_cache_pct: u32,
}

impl StoreConfig {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        StoreConfig {
            path: path.into(),
            meta_path: None,
            block_size: 4096,
            data_bytes: 10 << 30,
            cache_bytes: 128 << 20,
            full_ratio: 0.95,
            nearfull_ratio: 0.85,
            max_object_size: 128 << 20,
            meta_reserve_bytes: 256 << 20,
            max_inflight_bytes: 128 << 20,
            data_writer_threads: 8,
            max_batch_txns: 512,
            wal_bytes: 0,
            deferred_write_below_bytes: 64 << 10,
            checkpoint_interval_ms: 1000,
            discard_freed_blocks: false,
            zero_unwritten: false,
            zero_idle_ms: 200,
            writeback_pace_ms: 10,
            extent_cache_pct: 12,
        }
    }
    fn validate(&self) -> Result<()> {
        let bs = self.block_size;
        if !bs.is_power_of_two() || !(4096..=65536).contains(&bs) {
            return Err(StoreError::Invalid(format!(
                "block_size {bs} must be a power of two between 4096 and 65536"
            )));
        }
        if !(0.0 < self.nearfull_ratio
            && self.nearfull_ratio <= self.full_ratio
            && self.full_ratio <= 1.0)
        {
            return Err(StoreError::Invalid(format!(
                "need 0 < nearfull_ratio ({}) <= full_ratio ({}) <= 1",
                self.nearfull_ratio, self.full_ratio
            )));
        }
        if self.wal_bytes != 0 && self.wal_bytes < MIN_WAL_BYTES {
            return Err(StoreError::Invalid(format!(
                "wal_bytes {} is too small (at least {MIN_WAL_BYTES})",
                self.wal_bytes
            )));
        }
        if self.data_writer_threads == 0 {
            return Err(StoreError::Invalid(
                "data_writer_threads must be at least 1".into(),
            ));
        }
        if self.max_batch_txns == 0 {
            return Err(StoreError::Invalid(
                "max_batch_txns must be at least 1".into(),
            ));
        }
        Ok(())
    }
    /// The WAL size mkfs lays out for a data device of `data_bytes`:
    /// `wal_bytes` if set, else `data_bytes / 16` within 32..=256 MiB
    /// (4 KiB-aligned). 4 KiB writes at 64 threads checkpointed every
    /// ~0.1 s with 32 MiB (a quarter-full log starts one) and every
    /// ~0.6 s with 256 MiB, which halved the checkpoint thread's CPU per
    /// write (bench/README.md, store round 5).
    pub fn wal_bytes_for(&self, data_bytes: u64) -> u64 {
        let n = if self.wal_bytes != 0 {
            self.wal_bytes
        } else {
            (data_bytes / AUTO_WAL_DATA_FRACTION).clamp(AUTO_WAL_MIN_BYTES, AUTO_WAL_MAX_BYTES)
        };
        n / WAL_ALIGN * WAL_ALIGN
    }
    /// Bytes of `cache_bytes` for the committer's extent cache.
    pub(crate) fn extent_cache_bytes(&self) -> u64 {
        self.cache_bytes / 100 * u64::from(self.extent_cache_pct.min(50))
    }

    fn meta_dir(&self) -> &Path {
        self.meta_path.as_deref().unwrap_or(&self.path)
    }
}

/// Space usage as `statfs` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum FullState {
    Ok,
    NearFull,
    Full,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct StatFs {
    pub total_bytes: u64,
    pub used_bytes: u64,
    /// Bytes that can still be allocated before `full_ratio`.
    pub available_bytes: u64,
    pub state: FullState,
    pub block_size: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ObjectStat {
    pub size: u64,
    /// Bytes of data blocks allocated to the object.
    pub allocated_bytes: u64,
}

/// What one read of an object needs, from one metadata lookup
/// ([`Store::read_with_attrs`]).
#[derive(Debug, Clone)]
pub struct ObjectRead {
    /// The object's size.
    pub size: u64,
    /// All of its xattrs.
    pub attrs: BTreeMap<String, Vec<u8>>,
    /// The bytes asked for (up to the object's end).
    pub data: bytes::Bytes,
    /// crc32c of `data`, combined from the block crcs the read verified
    /// (and computed over the few bytes of partial blocks and holes): a
    /// messenger can send `data` under it without another pass.
    pub data_crc: u32,
}

/// Where `list_objects` starts.
#[derive(Debug, Clone)]
pub enum ListStart {
    Beginning,
    /// First object whose bit-reversed hash is >= `h.reverse_bits()`.
    AtHash(u32),
    /// Strictly after this object (resume from the last one returned).
    After(ObjectId),
}

/// A run of data blocks: (first block, number of blocks).
type BlockRun = (u64, u64);

/// Readers register the durable group they read up to (their epoch) and the
/// group their redb snapshot holds. Blocks freed by group G are reused only
/// once no reader with an epoch older than G remains; overlay versions are
/// pruned only below the oldest reader's redb snapshot.
#[derive(Default)]
struct ReaderEpochs {
    active: BTreeMap<u64, usize>,
    active_applied: BTreeMap<u64, usize>,
    /// (group, blocks freed, the part of them to punch).
    held: VecDeque<(u64, Vec<BlockRun>, Vec<BlockRun>)>,
}

fn count_down(m: &mut BTreeMap<u64, usize>, k: u64) {
    if let Some(n) = m.get_mut(&k) {
        *n -= 1;
        if *n == 0 {
            m.remove(&k);
        }
    }
}

pub(crate) struct Inner {
    pub db: Database,
    pub data: Arc<dyn StoreFile>,
    pub cfg: StoreConfig,
    pub block_size: u64,
    /// Blocks usable for data (excluding the label block).
    pub usable_blocks: u64,
    pub first_block: u64,
    alloc: Mutex<Allocator>,
    readers: Mutex<ReaderEpochs>,
    poisoned: Mutex<Option<String>>,
    inflight: Mutex<u64>,
    inflight_cv: Condvar,
    next_id: Mutex<u64>,
    meta_dir_for_statvfs: Option<PathBuf>,
    /// Groups numbered so far (a group's number is assigned when it has
    /// applied and goes to the WAL writer).
    groups: std::sync::atomic::AtomicU64,
    /// Every group up to this one is in redb (set by the committer after a
    /// checkpoint's or a direct group's redb commit).
    applied_group: std::sync::atomic::AtomicU64,
    /// Metadata changes of the groups after `applied_group`.
    pub(crate) overlay: Arc<Overlay>,
    /// Recycled buffers of big reads.
    pub(crate) read_bufs: Arc<crate::readbuf::ReadBufPool>,
    /// Combines verified block crcs into the crc of a read's data.
    pub(crate) block_crc: cairn_types::crc::Crc32cAppender,
    /// Bytes big reads copied from the page cache instead of the disk.
    pub(crate) cached_read_bytes: std::sync::atomic::AtomicU64,
    /// Whether this store has written big data through the page cache
    /// (`Transaction::keep_data_cached`) since it was opened: only then do
    /// big reads look in the page cache first. The look is not free — a
    /// RWF_NOWAIT read of uncached pages still starts the kernel's
    /// read-ahead, so every byte would be read twice from the disk.
    pub(crate) wrote_cached: std::sync::atomic::AtomicBool,
    /// Group commits whose WAL record (or direct durable commit) is on disk.
    durable_groups: Mutex<u64>,
    durable_cv: Condvar,
    /// Groups handed to the WAL writer and not finished yet.
    wal_jobs: Mutex<u64>,
    wal_jobs_cv: Condvar,
    /// When the store was opened (the origin of `last_activity_ms`).
    opened: Instant,
    /// Milliseconds after `opened` of the last submit or data read (the
    /// zeroing thread runs only once this is `zero_idle_ms` old).
    last_activity_ms: std::sync::atomic::AtomicU64,
    /// Tests: the store thread (`"committer"`, `"WAL"`, `"data writer"`)
    /// to panic at its next group (data writer: its next job).
    #[cfg(test)]
    panic_in: Mutex<Option<&'static str>>,
}

fn lock<T>(m: &Mutex<T>) -> Result<MutexGuard<'_, T>> {
    m.lock()
        .map_err(|_| StoreError::Poisoned("internal lock poisoned by a panic".into()))
}

impl Inner {
    /// Notes client activity (a submit or a data read) for the idle clock.
    pub(crate) fn touch_activity(&self) {
        let now = self.opened.elapsed().as_millis() as u64;
        self.last_activity_ms
            .store(now, std::sync::atomic::Ordering::Relaxed);
    }

    /// Milliseconds since the last submit or data read.
    pub(crate) fn ms_since_last_activity(&self) -> u64 {
        let now = self.opened.elapsed().as_millis() as u64;
        now.saturating_sub(
            self.last_activity_ms
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    pub(crate) fn is_poisoned(&self) -> bool {
        self.poisoned.lock().map(|p| p.is_some()).unwrap_or(true)
    }

    /// Takes the free blocks of `[start, start + len)` out of the allocator
    /// (so nobody writes them meanwhile) and returns them as runs.
    pub(crate) fn hold_free_blocks(&self, start: u64, len: u64) -> Vec<(u64, u64)> {
        let Ok(mut a) = self.alloc.lock() else {
            return Vec::new();
        };
        let runs = a.free_parts(start, len);
        for &(s, l) in &runs {
            let taken = a.mark_used(s, l);
            debug_assert!(taken, "free_parts returned a run that is not free");
        }
        runs
    }

    /// Gives back runs taken by [`Inner::hold_free_blocks`].
    pub(crate) fn unhold_blocks(&self, runs: &[(u64, u64)]) {
        if let Ok(mut a) = self.alloc.lock() {
            for &(s, l) in runs {
                a.release(s, l);
            }
        }
    }

    /// Blocks until group `group` (and all before it) is durable.
    fn wait_durable(&self, group: u64) -> Result<()> {
        let mut d = lock(&self.durable_groups)?;
        while *d < group {
            if let Some(p) = poisoned_msg(self) {
                return Err(StoreError::Poisoned(p));
            }
            d = self
                .durable_cv
                .wait_timeout(d, POISON_POLL)
                .map_err(|_| StoreError::Poisoned("durable lock poisoned".into()))?
                .0;
        }
        Ok(())
    }

    /// Blocks until the WAL writer has finished every group handed to it,
    /// or the store is poisoned (a WAL thread that panicked never finishes
    /// the groups it held; the caller looks at the poison next).
    fn drain_wal_jobs(&self) {
        let Ok(mut n) = self.wal_jobs.lock() else {
            return;
        };
        while *n > 0 && !self.is_poisoned() {
            match self.wal_jobs_cv.wait_timeout(n, POISON_POLL) {
                Ok((g, _)) => n = g,
                Err(_) => return,
            }
        }
    }

    pub(crate) fn lock_alloc(&self) -> Result<MutexGuard<'_, Allocator>> {
        lock(&self.alloc)
    }

    /// Allocates `n` data blocks, refusing to go past `full_ratio`.
    pub(crate) fn allocate_blocks(&self, n: u64) -> Result<Vec<(u64, u64)>> {
        let mut a = self.lock_alloc()?;
        let usable = self.usable_blocks;
        let used = usable - a.free_blocks();
        let limit = (usable as f64 * self.cfg.full_ratio) as u64;
        let bs = self.block_size;
        let full = StoreError::StoreFull {
            what: "data device reached full_ratio",
            needed_bytes: n * bs,
            available_bytes: limit.saturating_sub(used) * bs,
        };
        if used + n > limit {
            return Err(full);
        }
        if n * bs < self.cfg.deferred_write_below_bytes {
            a.allocate_small(n, MAX_RUN_BYTES / bs).ok_or(full)
        } else {
            a.allocate(n, MAX_RUN_BYTES / bs).ok_or(full)
        }
    }

    /// Allocates new blocks for every block-aligned `Write` of `txn` and
    /// computes their block crcs. Small ones are written by the committer
    /// ([`write_deferred`]) and their bytes ride in the record; large ones
    /// are returned with their blocks, for a data writer (`prepare.rs`)
    /// to write and sync before the transaction may commit.
    fn prewrite(&self, txn: &Transaction) -> Result<(Vec<Option<Prewrite>>, Vec<DataWrite>)> {
        let bs = self.block_size;
        let mut pre: Vec<Option<Prewrite>> = Vec::with_capacity(txn.ops.len());
        let mut large = Vec::new();
        let mut res: Result<()> = Ok(());
        for op in &txn.ops {
            let pw = match op {
                crate::txn::Op::Write {
                    offset, data, crcs, ..
                } if offset % bs == 0
                    && !data.is_empty()
                    && (data.len() as u64).is_multiple_of(bs)
                    && offset + data.len() as u64 <= self.cfg.max_object_size =>
                {
                    match self.prewrite_one(data, crcs.as_deref()) {
                        Ok(pw) => {
                            if pw.image.is_none() {
                                large.push((data.clone(), pw.runs.clone()));
                            }
                            Some(pw)
                        }
                        Err(e) => {
                            res = Err(e);
                            break;
                        }
                    }
                }
                _ => None,
            };
            pre.push(pw);
        }
        if let Err(e) = res {
            if let Ok(mut a) = self.alloc.lock() {
                for pw in pre.iter().flatten() {
                    for &(s, l) in &pw.runs {
                        a.release(s, l);
                    }
                }
            }
            return Err(e);
        }
        if txn.keep_cached && !large.is_empty() {
            self.wrote_cached
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        pre.resize_with(txn.ops.len(), || None);
        Ok((pre, large))
    }

    /// Allocates the blocks of one aligned write and computes its crcs;
    /// keeps the bytes of a small (deferred) one. `known`: the verified
    /// crcs of `data`'s 4 KiB blocks, if the submitter has them (see
    /// `Transaction::write_verified`).
    fn prewrite_one(&self, data: &bytes::Bytes, known: Option<&[u32]>) -> Result<Prewrite> {
        let bs = self.block_size;
        let deferred = (data.len() as u64) < self.cfg.deferred_write_below_bytes;
        let runs = self.allocate_blocks(data.len() as u64 / bs)?;
        Ok(Prewrite {
            runs,
            crcs: apply::block_crcs_known(data, bs, known),
            // Written into the data file by the committer (`write_deferred`),
            // with the rest of its group, before the group applies.
            image: deferred.then(|| data.clone()),
        })
    }
}

/// A large write's data and the blocks allocated for it.
type DataWrite = (bytes::Bytes, Vec<(u64, u64)>);

struct Pending {
    txn: Transaction,
    /// Per op: blocks allocated at submit (aligned writes only).
    pre: Vec<Option<Prewrite>>,
    bytes: u64,
    done: Arc<Completion>,
    /// Large writes' data being written by a data writer (None: none).
    prep: Option<Arc<Prep>>,
    /// `txn.collections()`: what it is ordered behind in the intake.
    colls: Vec<CollectionId>,
}

impl Ordered for Pending {
    fn ready(&self) -> bool {
        self.prep.as_ref().is_none_or(|p| p.is_done())
    }
    fn collections(&self) -> &[CollectionId] {
        &self.colls
    }
}

/// A transaction dropped without a result (a store thread stopped or
/// panicked while holding it) fails instead of leaving its waiter hung.
impl Drop for Pending {
    fn drop(&mut self) {
        drop_unfinished(&self.done);
    }
}

impl Pending {
    /// Why its large data could not be written, if it could not.
    fn prepare_error(&self) -> Option<Result<()>> {
        self.prep.as_ref()?.take_error().map(Err)
    }
    fn release_prewrites(&self, inner: &Inner) {
        if let Ok(mut a) = inner.alloc.lock() {
            for pw in self.pre.iter().flatten() {
                for &(s, l) in &pw.runs {
                    a.release(s, l);
                }
            }
        }
    }
}

/// The per-disk object store. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct Store {
    inner: Arc<Inner>,
    intake: Arc<Intake<Pending>>,
    committer: Option<JoinHandle<()>>,
    /// Write large writes' data (stopped after the committer).
    writers: Option<DataWriters>,
    /// Background zeroing of unwritten free space (stopped first on drop).
    zeroer: Option<Zeroer>,
    zero_state: Arc<ZeroState>,
    _lock: Option<std::fs::File>,
}

/// Files a store lives on (for tests: simulated devices).
pub struct StoreFiles {
    pub data: Arc<dyn StoreFile>,
    pub meta: Arc<dyn StoreFile>,
    pub wal: Arc<dyn StoreFile>,
}

impl Store {
    /// mkfs: creates a new store at `cfg.path` (fails if one exists).
    ///
    /// The data goes to `<path>/block`. If that does not exist (or is an
    /// empty file) it is created and preallocated to `data_bytes`. If it is
    /// a block device (usually a symlink to one) or a non-empty file, the
    /// store takes it whole at its fixed size (`data_bytes` is ignored) —
    /// unless it already holds a store, a filesystem, a partition table or
    /// a volume, which is refused. Metadata and WAL stay files in `path`
    /// (or `meta_path`).
    pub fn create(cfg: StoreConfig) -> Result<Store> {
        let mut cfg = cfg;
        cfg.validate()?;
        let io = |what: &str, e| StoreError::io(format!("{what} under {}", cfg.path.display()), e);
        std::fs::create_dir_all(&cfg.path).map_err(|e| io("create directory", e))?;
        std::fs::create_dir_all(cfg.meta_dir()).map_err(|e| io("create meta directory", e))?;
        let lockf = take_lock(&cfg.path)?;
        let data_path = cfg.path.join(DATA_FILE);
        let meta_path = cfg.meta_dir().join(META_FILE);
        // A WAL without its data and metadata is meaningless: create_on
        // reformats it (a leftover of a removed store).
        let wal_path = cfg.meta_dir().join(WAL_FILE);
        if meta_path.exists() {
            return Err(StoreError::Format {
                path: meta_path.display().to_string(),
                reason: "a store already exists here; open it instead, or remove it first".into(),
            });
        }
        let fixed_bytes = existing_data_target(&data_path)?;
        let need = match fixed_bytes {
            Some(n) => {
                cfg.data_bytes = n;
                cfg.meta_reserve_bytes + cfg.wal_bytes_for(n)
            }
            None => cfg.data_bytes + cfg.meta_reserve_bytes + cfg.wal_bytes_for(cfg.data_bytes),
        };
        check_fs_space(cfg.meta_dir(), need)?;
        let data = Arc::new(OsFile::open(&data_path, true).map_err(|e| io("create data file", e))?);
        let meta = Arc::new(OsFile::open(&meta_path, true).map_err(|e| io("create meta file", e))?);
        let wal = Arc::new(OsFile::open(&wal_path, true).map_err(|e| io("create WAL file", e))?);
        let mut s = Store::create_on(cfg, StoreFiles { data, meta, wal })?;
        s._lock = Some(lockf);
        Ok(s)
    }

    /// Opens an existing store at `cfg.path`, replaying to its last committed state.
    pub fn open(cfg: StoreConfig) -> Result<Store> {
        cfg.validate()?;
        let lockf = take_lock(&cfg.path)?;
        let io = |what: &str, e| StoreError::io(format!("{what} under {}", cfg.path.display()), e);
        let data_path = cfg.path.join(DATA_FILE);
        let meta_path = cfg.meta_dir().join(META_FILE);
        let wal_path = cfg.meta_dir().join(WAL_FILE);
        for p in [&data_path, &meta_path] {
            if !p.exists() {
                return Err(StoreError::Format {
                    path: p.display().to_string(),
                    reason: "missing; create the store first ('cairn store mkfs')".into(),
                });
            }
        }
        if !wal_path.exists() {
            return Err(StoreError::Format {
                path: wal_path.display().to_string(),
                reason: format!(
                    "missing: the store predates the write-ahead log (format 1) or lost its WAL; \
                     this build reads format {FORMAT_VERSION} only — recreate the store and refill it from replicas"
                ),
            });
        }
        let data = Arc::new(OsFile::open(&data_path, false).map_err(|e| io("open data file", e))?);
        let meta = Arc::new(OsFile::open(&meta_path, false).map_err(|e| io("open meta file", e))?);
        let wal = Arc::new(OsFile::open(&wal_path, false).map_err(|e| io("open WAL file", e))?);
        let mut s = Store::open_on(cfg, StoreFiles { data, meta, wal })?;
        s._lock = Some(lockf);
        Ok(s)
    }

    /// mkfs on caller-supplied files (simulated devices in tests).
    pub fn create_on(cfg: StoreConfig, files: StoreFiles) -> Result<Store> {
        cfg.validate()?;
        let bs = cfg.block_size as u64;
        let data_bytes = cfg.data_bytes / bs * bs;
        if data_bytes < 16 * bs {
            return Err(StoreError::Invalid(format!(
                "data_bytes {} is too small",
                cfg.data_bytes
            )));
        }
        let mut store_id = [0u8; 16];
        rand::Rng::fill(&mut rand::thread_rng(), &mut store_id);
        let sb = Superblock {
            format_version: FORMAT_VERSION,
            store_id,
            block_size: cfg.block_size,
            data_bytes,
        };
        let dio = |e| StoreError::io("data file", e);
        files.data.preallocate(data_bytes).map_err(dio)?;
        files.data.write_at(&encode_label(&sb), 0).map_err(dio)?;
        files.data.sync_data().map_err(dio)?;
        let wal_bytes = cfg.wal_bytes_for(data_bytes);
        wal::format(&*files.wal, wal_bytes).map_err(|e| StoreError::io("WAL file", e))?;
        let db = open_db(&cfg, &files.meta)?;
        let w = db.begin_write()?;
        {
            let mut t = Tables::open(&w, &RedoLog::disabled())?;
            t.sup.insert(b"super".as_slice(), enc(&sb).as_slice())?;
            t.sup
                .insert(b"next_id".as_slice(), 1u64.to_be_bytes().as_slice())?;
            t.sup
                .insert(KEY_WAL_APPLIED, 0u64.to_be_bytes().as_slice())?;
            t.sup.insert(KEY_WAL_HEAD, 0u64.to_be_bytes().as_slice())?;
        }
        w.commit()?;
        drop(db);
        Store::open_on(cfg, files)
    }

    /// Opens a store on caller-supplied files.
    pub fn open_on(cfg: StoreConfig, files: StoreFiles) -> Result<Store> {
        cfg.validate()?;
        let mut label = vec![0u8; LABEL_BYTES];
        files
            .data
            .read_at(&mut label, 0)
            .map_err(|e| StoreError::io("read data file label", e))?;
        let path = cfg.path.display().to_string();
        let fmt_err = |reason: String| StoreError::Format {
            path: path.clone(),
            reason,
        };
        let lsb = decode_label(&label).map_err(fmt_err)?;
        let data_len = files
            .data
            .len()
            .map_err(|e| StoreError::io("data file length", e))?;
        if data_len < lsb.data_bytes {
            return Err(fmt_err(format!(
                "data device or file holds {data_len} bytes but the store was made for {} (was it shrunk, or is it another device?)",
                lsb.data_bytes
            )));
        }
        let db = open_db(&cfg, &files.meta)?;
        let r = db.begin_read()?;
        let sup = r
            .open_table(T_SUPER)
            .map_err(|e| fmt_err(format!("metadata has no superblock ({e})")))?;
        let sb: Superblock = match sup.get(b"super".as_slice())? {
            Some(v) => dec("superblock", v.value())?,
            None => return Err(fmt_err("metadata has no superblock".into())),
        };
        if sb.format_version != FORMAT_VERSION {
            return Err(fmt_err(format!(
                "on-disk format {} but this build reads format {FORMAT_VERSION}",
                sb.format_version
            )));
        }
        if sb != lsb {
            return Err(fmt_err(
                "data file and metadata belong to different stores".into(),
            ));
        }
        let applied = sup_u64(&sup, KEY_WAL_APPLIED).map_err(fmt_err)?;
        let wal_head = sup_u64(&sup, KEY_WAL_HEAD).map_err(fmt_err)?;
        drop(sup);
        drop(r);
        let bs = sb.block_size as u64;
        let first_block = (LABEL_BYTES as u64).div_ceil(bs);
        let total_blocks = sb.data_bytes / bs;
        let wal_cap = files
            .wal
            .len()
            .map_err(|e| StoreError::io("WAL file length", e))?
            / WAL_ALIGN
            * WAL_ALIGN;
        if wal_cap < MIN_WAL_BYTES {
            return Err(fmt_err(format!(
                "WAL file holds {wal_cap} bytes, less than {MIN_WAL_BYTES}"
            )));
        }
        let replay = Replay {
            db: &db,
            data: &*files.data,
            wal: &*files.wal,
            store_id: sb.store_id,
            block_size: bs,
            blocks: (first_block, total_blocks),
        };
        let (last_seq, wal_start, rewritten) = replay.run(applied, wal_head, wal_cap)?;
        let r = db.begin_read()?;
        let next_id = sup_u64(&r.open_table(T_SUPER)?, b"next_id").map_err(fmt_err)?;
        let mut alloc = rebuild_allocator(&r, first_block, total_blocks)?;
        alloc.set_fill_run((SMALL_WRITE_FILL_RUN_BYTES / bs).max(1));
        drop(r);
        // Replay rewrote block images of the log, some into blocks a later
        // record freed (and punched): give those back to the filesystem again.
        let mut stale: Vec<(u64, u64)> = rewritten
            .iter()
            .flat_map(|&(s, l)| alloc.free_parts(s, l))
            .collect();
        let mut cfg = cfg;
        cfg.block_size = sb.block_size;
        cfg.data_bytes = sb.data_bytes;
        let meta_dir_for_statvfs = Some(cfg.meta_dir().to_path_buf()).filter(|p| p.exists());
        let inner = Arc::new(Inner {
            db,
            data: files.data,
            block_size: bs,
            usable_blocks: total_blocks - first_block,
            first_block,
            alloc: Mutex::new(alloc),
            readers: Mutex::new(ReaderEpochs::default()),
            poisoned: Mutex::new(None),
            inflight: Mutex::new(0),
            inflight_cv: Condvar::new(),
            next_id: Mutex::new(next_id),
            meta_dir_for_statvfs,
            cfg,
            groups: std::sync::atomic::AtomicU64::new(0),
            applied_group: std::sync::atomic::AtomicU64::new(0),
            overlay: Arc::new(Overlay::default()),
            read_bufs: Arc::default(),
            block_crc: cairn_types::crc::Crc32cAppender::new(bs),
            cached_read_bytes: Default::default(),
            wrote_cached: Default::default(),
            durable_groups: Mutex::new(0),
            durable_cv: Condvar::new(),
            wal_jobs: Mutex::new(0),
            wal_jobs_cv: Condvar::new(),
            opened: Instant::now(),
            last_activity_ms: Default::default(),
            #[cfg(test)]
            panic_in: Mutex::new(None),
        });
        punch_runs(&inner, &mut stale);
        let max_record_bytes = (wal_cap / 4).min(MAX_WAL_RECORD_BYTES);
        let log = LogState {
            pipeline: WalPipeline::spawn(inner.clone(), files.wal.clone())?,
            wal: WalWriter::new(wal_cap, wal_start, last_seq + 1, sb.store_id),
            max_record_bytes: max_record_bytes as usize,
            last_checkpoint: Instant::now(),
            flusher: Flusher::spawn(inner.clone())?,
            flushing: false,
            pending: Vec::new(),
            pending_bytes: 0,
            to_prune: VecDeque::new(),
            view: None,
            ext_cache: RefCell::new(ExtentCache::new(inner.cfg.extent_cache_bytes() as usize)),
        };
        let intake = Arc::new(Intake::new(inner.cfg.max_batch_txns));
        let (inner2, intake2) = (inner.clone(), intake.clone());
        let committer = std::thread::Builder::new()
            .name("store-commit".into())
            .spawn(move || {
                // Closed when the committer stops, even by a panic: later
                // submissions then fail instead of waiting for nobody.
                struct CloseOnExit<'a>(&'a Intake<Pending>);
                impl Drop for CloseOnExit<'_> {
                    fn drop(&mut self) {
                        self.0.close();
                    }
                }
                let _close = CloseOnExit(&intake2);
                let run = || committer_loop(&inner2, log, &intake2);
                if let Some(msg) = run_guarded(&inner2, "committer", run) {
                    fail_intake(&inner2, &intake2, &msg);
                }
            })
            .map_err(|e| StoreError::io("spawn committer thread", e))?;
        let intake3 = intake.clone();
        let writers =
            DataWriters::spawn(inner.clone(), inner.cfg.data_writer_threads, move || {
                intake3.notify_ready()
            })?;
        let zero_state = Arc::new(ZeroState::default());
        let zeroer = Zeroer::spawn(inner.clone(), zero_state.clone());
        Ok(Store {
            inner,
            intake,
            committer: Some(committer),
            writers: Some(writers),
            zeroer: Some(zeroer),
            zero_state,
            _lock: None,
        })
    }

    /// Queues `txn` for the next group commit. Blocks only while more than
    /// `max_inflight_bytes` of payload is queued (backpressure) or the
    /// intake is full; the data of large writes is written by the store's
    /// data writers meanwhile. Transactions touching a collection commit in
    /// the order they were submitted (an empty one after everything
    /// submitted before it).
    pub fn submit(&self, txn: Transaction) -> Result<CommitHandle> {
        if let Some(p) = lock(&self.inner.poisoned)?.as_ref() {
            return Err(StoreError::Poisoned(p.clone()));
        }
        let bytes = txn.payload_bytes();
        self.inner.touch_activity();

        {
            let mut inflight = lock(&self.inner.inflight)?;
            while *inflight > 0 && *inflight + bytes > self.inner.cfg.max_inflight_bytes {
                inflight = self
                    .inner
                    .inflight_cv
                    .wait(inflight)
                    .map_err(|_| StoreError::Poisoned("inflight lock".into()))?;
            }
            *inflight += bytes;
        }
        let (pre, large) = match self.inner.prewrite(&txn) {
            Ok(p) => p,
            Err(e) => {
                self.release_inflight(bytes);
                return Err(e);
            }
        };
        let cached = txn.keep_cached;
        let prep = (!large.is_empty()).then(Arc::<Prep>::default);
        // Fails only once the committer has stopped (the store is closing
        // or broken); blocks allocated above are then simply not used (the
        // allocator is rebuilt from the metadata at the next open).
        let done = self.inner_intake_push(txn, pre, bytes, prep.clone())?;
        if let (Some(prep), Some(w)) = (prep, &self.writers) {
            w.send(DataJob {
                writes: large,
                cached,
                prep,
            });
        }
        Ok(CommitHandle(done))
    }

    /// Whether `submit` of a transaction carrying `bytes` of payload would
    /// wait for the in-flight budget now (a hint: the budget moves).
    pub fn submit_would_wait(&self, bytes: u64) -> bool {
        self.inner.inflight.lock().map_or(true, |n| {
            *n > 0 && *n + bytes > self.inner.cfg.max_inflight_bytes
        })
    }

    fn inner_intake_push(
        &self,
        txn: Transaction,
        pre: Vec<Option<Prewrite>>,
        bytes: u64,
        prep: Option<Arc<Prep>>,
    ) -> Result<Arc<Completion>> {
        let colls = txn.collections();
        let r = self.intake.push(|done| Pending {
            txn,
            pre,
            bytes,
            done,
            prep,
            colls,
        });
        if r.is_err() {
            self.release_inflight(bytes);
        }
        r
    }

    /// Makes everything acknowledged so far durable in the data file and the
    /// metadata and empties the WAL (the committer also does this on its own:
    /// every `checkpoint_interval_ms`, when the WAL is half full, and at close).
    pub fn checkpoint(&self) -> Result<()> {
        if let Some(p) = lock(&self.inner.poisoned)?.as_ref() {
            return Err(StoreError::Poisoned(p.clone()));
        }
        self.intake.push_checkpoint()?.wait()
    }

    fn release_inflight(&self, bytes: u64) {
        if let Ok(mut n) = self.inner.inflight.lock() {
            *n = n.saturating_sub(bytes);
        }
        self.inner.inflight_cv.notify_all();
    }

    /// Applies `txn` atomically; returns once it is durable.
    pub fn commit(&self, txn: Transaction) -> Result<()> {
        self.submit(txn)?.wait()
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }

    pub fn config(&self) -> &StoreConfig {
        &self.inner.cfg
    }

    /// What the background zeroing of unwritten free space has done
    /// (`StoreConfig::zero_unwritten`).
    pub fn zeroing_stats(&self) -> ZeroingStats {
        self.zero_state.stats.lock().map(|s| *s).unwrap_or_default()
    }

    /// Runs `f` on a consistent view of every durable group, holding the
    /// blocks and overlay versions it may use until it ends.
    ///
    /// The view is the redb snapshot (every group up to the last
    /// checkpoint) merged with the overlay's versions of the groups known
    /// durable when the read started, so it never shows a group a crash
    /// could take back and never waits for one.
    pub(crate) fn with_read<R>(&self, f: impl FnOnce(&ReadView) -> Result<R>) -> Result<R> {
        use std::sync::atomic::Ordering;
        let inner = &self.inner;
        let (epoch, applied, r) = {
            let mut rd = lock(&inner.readers)?;
            let epoch = *lock(&inner.durable_groups)?;
            // Read before the snapshot: the snapshot holds at least this much.
            let applied = inner.applied_group.load(Ordering::SeqCst);
            *rd.active.entry(epoch).or_insert(0) += 1;
            *rd.active_applied.entry(applied).or_insert(0) += 1;
            (epoch, applied, inner.db.begin_read())
        };
        let res = r
            .map_err(StoreError::from)
            .and_then(|r| f(&ReadView::new(r, inner.overlay.clone(), epoch)));
        if let Ok(mut rd) = inner.readers.lock() {
            count_down(&mut rd.active, epoch);
            count_down(&mut rd.active_applied, applied);
        }
        res
    }

    fn onode_in(r: &ReadView, c: &CollectionId, o: &ObjectId) -> Result<Onode> {
        match r.kv_get(TID_OBJECTS, &obj_key(c, o))? {
            Some(v) => dec("onode", &v),
            None => {
                Self::coll_in(r, c)?;
                Err(StoreError::NoSuchObject {
                    coll: *c,
                    obj: o.clone(),
                })
            }
        }
    }

    fn coll_in(r: &ReadView, c: &CollectionId) -> Result<()> {
        if r.kv_get(TID_COLLS, &c.key())?.is_none() {
            return Err(StoreError::NoSuchCollection(*c));
        }
        Ok(())
    }

    /// Reads up to `len` bytes at `offset`: holes read as zeros, the result
    /// is short past end of object. Every block is checksum-verified.
    pub fn read(&self, c: &CollectionId, o: &ObjectId, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.inner.touch_activity();
        self.with_read(|r| {
            let on = Self::onode_in(r, c, o)?;
            let len = len.min(on.size.saturating_sub(offset));
            apply::read_range(&self.inner, r, c, o, &on, offset, len)
        })
    }

    /// [`Store::read`] as shared bytes: a big read lands with O_DIRECT in
    /// an aligned buffer that is returned without another copy (the page
    /// cache neither serves nor keeps it; small reads still use it).
    pub fn read_bytes(
        &self,
        c: &CollectionId,
        o: &ObjectId,
        offset: u64,
        len: u64,
    ) -> Result<bytes::Bytes> {
        self.inner.touch_activity();
        self.with_read(|r| {
            let on = Self::onode_in(r, c, o)?;
            let len = len.min(on.size.saturating_sub(offset));
            apply::read_range_bytes(&self.inner, r, c, o, &on, offset, len).map(|(d, _)| d)
        })
    }

    /// [`Store::read_bytes`] of `len` bytes at `offset` (`len` 0: to the
    /// object's end) together with the object's size and xattrs, all from
    /// one metadata lookup: a small read then costs one read transaction
    /// and one onode decode instead of one per question.
    pub fn read_with_attrs(
        &self,
        c: &CollectionId,
        o: &ObjectId,
        offset: u64,
        len: u64,
    ) -> Result<ObjectRead> {
        self.inner.touch_activity();
        self.with_read(|r| {
            let on = Self::onode_in(r, c, o)?;
            let room = on.size.saturating_sub(offset);
            let len = if len == 0 { room } else { len.min(room) };
            let (data, data_crc) = apply::read_range_bytes(&self.inner, r, c, o, &on, offset, len)?;
            Ok(ObjectRead {
                size: on.size,
                attrs: on.attrs,
                data,
                data_crc,
            })
        })
    }

    pub fn exists(&self, c: &CollectionId, o: &ObjectId) -> Result<bool> {
        match self.stat(c, o) {
            Ok(_) => Ok(true),
            Err(StoreError::NoSuchObject { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub fn stat(&self, c: &CollectionId, o: &ObjectId) -> Result<ObjectStat> {
        self.with_read(|r| {
            let on = Self::onode_in(r, c, o)?;
            let bs = self.inner.block_size;
            let blocks: u64 =
                apply::extents_overlapping(r, on.id, 0, on.size.div_ceil(bs), MAX_RUN_BYTES / bs)?
                    .iter()
                    .map(|(_, e)| e.blocks())
                    .sum();
            Ok(ObjectStat {
                size: on.size,
                allocated_bytes: blocks * bs,
            })
        })
    }

    pub fn getattr(&self, c: &CollectionId, o: &ObjectId, name: &str) -> Result<Option<Vec<u8>>> {
        self.with_read(|r| Ok(Self::onode_in(r, c, o)?.attrs.remove(name)))
    }

    pub fn getattrs(&self, c: &CollectionId, o: &ObjectId) -> Result<BTreeMap<String, Vec<u8>>> {
        self.with_read(|r| Ok(Self::onode_in(r, c, o)?.attrs))
    }

    /// Values of the given omap keys that exist.
    pub fn omap_get(
        &self,
        c: &CollectionId,
        o: &ObjectId,
        keys: &[&[u8]],
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.with_read(|r| {
            let on = Self::onode_in(r, c, o)?;
            let mut out = Vec::new();
            for k in keys {
                if let Some(v) = r.kv_get(TID_OMAP, &id_key(on.id, k))? {
                    out.push((k.to_vec(), v));
                }
            }
            Ok(out)
        })
    }

    /// Up to `limit` omap entries in key order, strictly after `after` (from the start if None).
    pub fn omap_range(
        &self,
        c: &CollectionId,
        o: &ObjectId,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.with_read(|r| {
            let on = Self::onode_in(r, c, o)?;
            let lo = match after {
                Some(a) => {
                    let mut k = id_key(on.id, a);
                    k.push(0);
                    k
                }
                None => id_key(on.id, &[]),
            };
            let hi = id_key(on.id + 1, &[]);
            Ok(r.kv_scan(TID_OMAP, &lo, &hi, limit)?
                .into_iter()
                .map(|(k, v)| (k[8..].to_vec(), v))
                .collect())
        })
    }

    /// Like [`Store::omap_range`] but keys only.
    pub fn omap_keys(
        &self,
        c: &CollectionId,
        o: &ObjectId,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>> {
        Ok(self
            .omap_range(c, o, after, limit)?
            .into_iter()
            .map(|(k, _)| k)
            .collect())
    }

    /// Up to `limit` objects of `c` in hash order (bit-reversed hash, namespace, name, snap).
    pub fn list_objects(
        &self,
        c: &CollectionId,
        start: &ListStart,
        limit: usize,
    ) -> Result<Vec<ObjectId>> {
        self.with_read(|r| {
            Self::coll_in(r, c)?;
            let prefix = c.key();
            let lo = match start {
                ListStart::Beginning => prefix.to_vec(),
                ListStart::AtHash(h) => coll_key(c, &h.reverse_bits().to_be_bytes()),
                ListStart::After(o) => {
                    let mut k = obj_key(c, o);
                    k.push(0);
                    k
                }
            };
            let hi = prefix_end(&prefix).unwrap_or_else(|| vec![0xFF; 14]);
            let mut out = Vec::new();
            for (k, _) in r.kv_scan(TID_OBJECTS, &lo, &hi, limit)? {
                let o = ObjectId::from_sort_key(&k[prefix.len()..]).ok_or_else(|| {
                    StoreError::Corrupt(format!("bad object key in collection {c}"))
                })?;
                out.push(o);
            }
            Ok(out)
        })
    }

    pub fn list_collections(&self) -> Result<Vec<CollectionId>> {
        self.with_read(|r| {
            let mut out = Vec::new();
            // Collection keys are 13 bytes: all sort below 14 x 0xFF.
            for (k, _) in r.kv_scan(TID_COLLS, &[], &[0xFF; 14], usize::MAX)? {
                out.push(
                    CollectionId::from_key(&k)
                        .ok_or_else(|| StoreError::Corrupt("bad collection key".into()))?,
                );
            }
            Ok(out)
        })
    }

    pub fn collection_exists(&self, c: &CollectionId) -> Result<bool> {
        self.with_read(|r| Ok(r.kv_get(TID_COLLS, &c.key())?.is_some()))
    }

    /// PG metadata value for `key`.
    pub fn meta_get(&self, c: &CollectionId, key: &str) -> Result<Option<Vec<u8>>> {
        self.with_read(|r| {
            Self::coll_in(r, c)?;
            r.kv_get(TID_PGMETA, &coll_key(c, key.as_bytes()))
        })
    }

    /// Up to `limit` PG log entries with index >= `from`, in index order.
    pub fn log_range(
        &self,
        c: &CollectionId,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        self.with_read(|r| {
            Self::coll_in(r, c)?;
            let lo = coll_key(c, &from.to_be_bytes());
            let hi = prefix_end(&c.key()).unwrap_or_else(|| vec![0xFF; 14]);
            let mut out = Vec::new();
            for (k, v) in r.kv_scan(TID_PGLOG, &lo, &hi, limit)? {
                let idx = u64::from_be_bytes(
                    k.get(13..21)
                        .and_then(|b| b.try_into().ok())
                        .ok_or_else(|| StoreError::Corrupt("bad log key".into()))?,
                );
                out.push((idx, v));
            }
            Ok(out)
        })
    }

    /// Bytes that big reads (>= 64 KiB) found in the kernel's page cache
    /// and copied from there instead of reading the disk, since the store
    /// opened (see [`Transaction::keep_data_cached`]).
    pub fn page_cache_read_bytes(&self) -> u64 {
        self.inner
            .cached_read_bytes
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Keeps at most `bytes` of big reads' buffers idle for reuse (16 MiB
    /// unless set; idle ones are freed after 2 s unused). An OSD sets it to
    /// its recovery in-flight bound, so the objects a recovery keeps in
    /// flight reuse buffers instead of faulting in fresh ones.
    pub fn set_read_buffers_idle_bytes(&self, bytes: u64) {
        self.inner
            .read_bufs
            .set_max_idle(usize::try_from(bytes).unwrap_or(usize::MAX));
    }

    /// Frees the big reads' buffers left idle beyond their expiry (an
    /// owner calls it now and then, so a store that stopped reading does
    /// not keep them).
    pub fn trim_idle_read_buffers(&self) {
        self.inner.read_bufs.trim_idle_at(std::time::Instant::now());
    }

    /// Bytes of big reads' buffers held idle for reuse now.
    pub fn idle_read_buffer_bytes(&self) -> u64 {
        self.inner.read_bufs.idle_bytes() as u64
    }

    pub fn statfs(&self) -> Result<StatFs> {
        let free = self.inner.lock_alloc()?.free_blocks();
        let bs = self.inner.block_size;
        let usable = self.inner.usable_blocks;
        let used = usable - free;
        let ratio = used as f64 / usable as f64;
        let cfg = &self.inner.cfg;
        let limit = (usable as f64 * cfg.full_ratio) as u64;
        Ok(StatFs {
            total_bytes: usable * bs,
            used_bytes: used * bs,
            available_bytes: limit.saturating_sub(used) * bs,
            state: if ratio >= cfg.full_ratio {
                FullState::Full
            } else if ratio >= cfg.nearfull_ratio {
                FullState::NearFull
            } else {
                FullState::Ok
            },
            block_size: bs as u32,
        })
    }

    /// Number of objects in the metadata (all collections).
    pub fn object_count(&self) -> Result<u64> {
        self.with_read(|r| r.count(TID_OBJECTS))
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.zeroer.take();
        self.intake.close();
        // The committer drains the intake, waiting for the data writers.
        if let Some(h) = self.committer.take() {
            let _ = h.join();
        }
        self.writers.take();
    }
}

fn take_lock(dir: &Path) -> Result<std::fs::File> {
    let p = dir.join(LOCK_FILE);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&p)
        .map_err(|e| StoreError::io(format!("open lock file {}", p.display()), e))?;
    f.try_lock().map_err(|_| StoreError::Format {
        path: dir.display().to_string(),
        reason: "store is in use by another process (LOCK held)".into(),
    })?;
    Ok(f)
}

fn open_db(cfg: &StoreConfig, meta: &Arc<dyn StoreFile>) -> Result<Database> {
    let mut b = Database::builder();
    b.set_cache_size((cfg.cache_bytes - cfg.extent_cache_bytes()) as usize);
    Ok(b.create_with_backend(KvBackend(meta.clone()))?)
}

/// Free space on the filesystem holding `dir`, in bytes.
pub(crate) fn fs_available(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid NUL-terminated path and a properly sized out-struct.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

fn check_fs_space(dir: &Path, need: u64) -> Result<()> {
    if let Some(avail) = fs_available(dir) {
        if avail < need {
            return Err(StoreError::StoreFull {
                what: "filesystem too small at mkfs for data_bytes (unless on a device) + meta_reserve_bytes + wal_bytes",
                needed_bytes: need,
                available_bytes: avail,
            });
        }
    }
    Ok(())
}

/// At mkfs: None if the data file is to be created (missing or empty);
/// else the fixed size of the existing device or file the store will take
/// whole, after checking that it holds nothing we would overwrite.
fn existing_data_target(data_path: &Path) -> Result<Option<u64>> {
    use std::os::unix::fs::FileTypeExt;
    let shown = data_path.display().to_string();
    let md = match std::fs::metadata(data_path) {
        Ok(md) => md,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::io(format!("inspect {shown}"), e)),
    };
    let is_device = md.file_type().is_block_device();
    if !is_device && !md.is_file() {
        return Err(StoreError::Format {
            path: shown,
            reason: "is neither a regular file nor a block device".into(),
        });
    }
    if md.is_file() && md.len() == 0 {
        return Ok(None);
    }
    let f =
        OsFile::open(data_path, false).map_err(|e| StoreError::io(format!("open {shown}"), e))?;
    let len = f
        .len()
        .map_err(|e| StoreError::io(format!("size of {shown}"), e))?;
    let mut head = vec![0u8; (len as usize).min(SIGNATURE_PROBE_BYTES)];
    f.read_at(&mut head, 0)
        .map_err(|e| StoreError::io(format!("read the start of {shown}"), e))?;
    if let Some(what) = existing_signature(&head) {
        let next = if what == "a cairn store" {
            "open it instead, or wipe it first ('cairn disk zap')"
        } else {
            "wipe it first (e.g. 'wipefs -a') if you mean to erase it"
        };
        return Err(StoreError::Format {
            path: shown,
            reason: format!("holds {what}; {next}"),
        });
    }
    Ok(Some(len))
}

fn rebuild_allocator(r: &ReadTransaction, first: u64, total: u64) -> Result<Allocator> {
    let mut a = Allocator::new_free(first, total);
    let t = r.open_table(T_EXTENTS)?;
    for e in t.iter()? {
        let (_, v) = e?;
        let e = ExtentRec::decode(v.value())?;
        if e.pblock < first || e.pblock + e.blocks() > total || !a.mark_used(e.pblock, e.blocks()) {
            return Err(StoreError::Corrupt(format!(
                "extent at block {} (+{}) is out of range or doubly allocated",
                e.pblock,
                e.blocks()
            )));
        }
    }
    Ok(a)
}

/// Reads a u64 BE value of the `super` table.
fn sup_u64<T: ReadableTable<&'static [u8], &'static [u8]>>(
    sup: &T,
    key: &[u8],
) -> std::result::Result<u64, String> {
    let name = String::from_utf8_lossy(key).into_owned();
    match sup.get(key) {
        Ok(Some(v)) => v
            .value()
            .try_into()
            .map(u64::from_be_bytes)
            .map_err(|_| format!("metadata value '{name}' is malformed")),
        Ok(None) => Err(format!("metadata has no '{name}'")),
        Err(e) => Err(format!("reading '{name}': {e}")),
    }
}

/// WAL replay at open: re-applies every valid record after `wal_applied`,
/// then checkpoints (data fdatasync + durable metadata commit).
struct Replay<'a> {
    db: &'a Database,
    data: &'a dyn StoreFile,
    wal: &'a dyn StoreFile,
    store_id: [u8; 16],
    block_size: u64,
    /// Usable data blocks `[first, end)`.
    blocks: (u64, u64),
}

impl Replay<'_> {
    /// Returns the sequence number the next record follows (the last one
    /// applied plus a gap, see below), the WAL offset where it goes, and the
    /// block runs replay rewrote.
    fn run(&self, applied: u64, head: u64, wal_cap: u64) -> Result<(u64, u64, Vec<BlockRun>)> {
        let wio = |e| StoreError::io("WAL read", e);
        if head >= wal_cap || !head.is_multiple_of(WAL_ALIGN) {
            return Err(StoreError::Corrupt(format!(
                "WAL head offset {head} is outside the {wal_cap}-byte log"
            )));
        }
        let recs = wal::scan(self.wal, wal_cap, &self.store_id, head, applied + 1).map_err(wio)?;
        // The crashed run may have left whole records *after* the first torn
        // one (they were written before it reached the disk, never synced,
        // never acknowledged). A new record ending exactly where such a
        // leftover starts would make a later scan accept it as the next one.
        // So the new run's records start `gap` sequence numbers on: more than
        // the log can hold records, so no leftover can ever be the next one.
        let gap = wal_cap / WAL_ALIGN + 1;
        let Some(last) = recs.last().copied() else {
            let w = self.db.begin_write()?;
            {
                let mut sup = w.open_table(T_SUPER)?;
                sup.insert(KEY_WAL_APPLIED, (applied + gap).to_be_bytes().as_slice())?;
            }
            w.commit()?;
            return Ok((applied + gap, head, Vec::new()));
        };
        tracing::info!(
            records = recs.len(),
            first = applied + 1,
            last = last.seq,
            "replaying the store's write-ahead log"
        );
        let w = self.db.begin_write()?; // Durability::Immediate
        let rewritten;
        {
            let mut t = Tables::open(&w, &RedoLog::disabled())?;
            // Metadata: every change, in order (puts and deletes are idempotent).
            for pos in &recs {
                let payload = wal::read_payload(self.wal, pos).map_err(wio)?;
                let v = self.decode(pos.seq, &payload)?;
                for ch in v.kv {
                    let (id, key) = match &ch {
                        wal::KvChange::Put(id, k, _) | wal::KvChange::Delete(id, k) => (*id, *k),
                    };
                    let table = t.by_id(id).ok_or_else(|| {
                        StoreError::Corrupt(format!("WAL record {} names table {id}", pos.seq))
                    })?;
                    match ch {
                        wal::KvChange::Put(_, _, val) => table.insert(key, val)?,
                        wal::KvChange::Delete(..) => table.remove(key)?,
                    }
                }
            }
            rewritten = self.replay_images(&recs)?;
            self.data
                .sync_data()
                .map_err(|e| StoreError::io("data file fdatasync (replay)", e))?;
            t.sup
                .insert(KEY_WAL_APPLIED, (last.seq + gap).to_be_bytes().as_slice())?;
            t.sup.insert(KEY_WAL_HEAD, 0u64.to_be_bytes().as_slice())?;
        }
        w.commit()?;
        Ok((last.seq + gap, 0, rewritten))
    }

    fn decode<'p>(&self, seq: u64, payload: &'p [u8]) -> Result<wal::RecordView<'p>> {
        wal::decode_payload(payload)
            .map_err(|e| StoreError::Corrupt(format!("WAL record {seq}: {e}")))
    }

    /// Data: a block may be freed and reused between records, so only the
    /// last writer of each block (a later image, or a later large write put
    /// in place before its record) may leave its bytes: walk backwards.
    /// Returns the runs of blocks written.
    fn replay_images(&self, recs: &[wal::RecordPos]) -> Result<Vec<(u64, u64)>> {
        let bs = self.block_size;
        let mut claimed = wal::BlockSet::default();
        let mut written = Vec::new();
        for pos in recs.iter().rev() {
            let payload =
                wal::read_payload(self.wal, pos).map_err(|e| StoreError::io("WAL read", e))?;
            let v = self.decode(pos.seq, &payload)?;
            for &(s, l) in &v.runs {
                claimed.insert(s, l);
            }
            for &(pblock, bytes) in v.images.iter().rev() {
                let n = bytes.len() as u64 / bs;
                if !(bytes.len() as u64).is_multiple_of(bs)
                    || pblock < self.blocks.0
                    || pblock + n > self.blocks.1
                {
                    return Err(StoreError::Corrupt(format!(
                        "WAL record {} has a block image of {} bytes at block {pblock} outside the data file",
                        pos.seq,
                        bytes.len()
                    )));
                }
                for i in 0..n {
                    if !claimed.contains(pblock + i) {
                        let blk = &bytes[(i * bs) as usize..((i + 1) * bs) as usize];
                        self.data
                            .write_at(blk, (pblock + i) * bs)
                            .map_err(|e| StoreError::io("data file write (replay)", e))?;
                        written.push((pblock + i, 1));
                    }
                }
                claimed.insert(pblock, n);
            }
        }
        Ok(written)
    }
}

/// A checkpoint: every record up to `seq` (all before logical WAL position
/// `head`, file offset `head_off`) becomes durable outside the WAL once the
/// data file is synced and one durable redb commit has applied `changes`
/// (the metadata of every group up to `group` not yet in redb) together
/// with `wal_applied`/`wal_head`.
struct Mark {
    seq: u64,
    head: u64,
    head_off: u64,
    group: u64,
    changes: Vec<Arc<GroupChanges>>,
}

/// Makes a mark durable: waits until its groups are durable in the WAL
/// (redb must never hold a group a crash could take back), fdatasyncs the
/// data file (every deferred block written so far), then applies the
/// groups' metadata to redb and commits it with the mark, durably.
fn flush_mark(inner: &Inner, m: &Mark) -> Result<()> {
    inner.wait_durable(m.group)?;
    inner
        .data
        .sync_data()
        .map_err(|e| StoreError::io("data file fdatasync (checkpoint)", e))?;
    let mut w = inner.db.begin_write()?;
    w.set_durability(Durability::Immediate);
    {
        let mut t = Tables::open(&w, &RedoLog::disabled())?;
        for ch in &m.changes {
            for (id, k, v) in &ch.kv {
                let table = t
                    .by_id(*id)
                    .ok_or_else(|| StoreError::Corrupt(format!("no metadata table {id}")))?;
                match v {
                    Some(v) => table.insert(k, v)?,
                    None => table.remove(k)?,
                }
            }
        }
        t.sup
            .insert(KEY_WAL_APPLIED, m.seq.to_be_bytes().as_slice())?;
        t.sup
            .insert(KEY_WAL_HEAD, m.head_off.to_be_bytes().as_slice())?;
    }
    w.commit()?;
    Ok(())
}

/// Background thread that runs a checkpoint's slow part ([`flush_mark`]:
/// the data sync and the large redb commit) while the committer keeps
/// committing groups.
struct Flusher {
    tx: Option<std::sync::mpsc::Sender<Mark>>,
    done: Arc<Mutex<Option<std::result::Result<Mark, String>>>>,
    handle: Option<JoinHandle<()>>,
}

impl Flusher {
    fn spawn(inner: Arc<Inner>) -> Result<Flusher> {
        let (tx, rx) = std::sync::mpsc::channel::<Mark>();
        let done = Arc::new(Mutex::new(None));
        let done2 = done.clone();
        let handle = std::thread::Builder::new()
            .name("store-flush".into())
            .spawn(move || flusher_loop(&inner, &rx, &done2))
            .map_err(|e| StoreError::io("spawn flusher thread", e))?;
        Ok(Flusher {
            tx: Some(tx),
            done,
            handle: Some(handle),
        })
    }
    fn start(&self, m: Mark) -> bool {
        self.tx.as_ref().is_some_and(|tx| tx.send(m).is_ok())
    }
    fn take_done(&self) -> Option<std::result::Result<Mark, String>> {
        self.done.lock().ok().and_then(|mut d| d.take())
    }
}

/// The flusher thread: runs each checkpoint handed to it and, between
/// them, every `writeback_pace_ms` in which groups committed, starts the
/// write-back of the data file's dirty pages (so the checkpoint's data sync
/// finds little left to write).
fn flusher_loop(
    inner: &Inner,
    rx: &std::sync::mpsc::Receiver<Mark>,
    done: &Mutex<Option<std::result::Result<Mark, String>>>,
) {
    use std::sync::atomic::Ordering;
    let pace = Duration::from_millis(inner.cfg.writeback_pace_ms);
    let mut seen_groups = 0;
    loop {
        let m = if pace.is_zero() {
            rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
        } else {
            rx.recv_timeout(pace)
        };
        match m {
            Ok(m) => {
                let flushed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    flush_mark(inner, &m)
                }));
                let r = match flushed {
                    Ok(Ok(())) => Ok(m),
                    Ok(Err(e)) => Err(format!("checkpoint failed: {e}")),
                    Err(p) => Err(format!(
                        "store checkpoint thread panicked: {}; the store is poisoned until reopened",
                        panic_text(&*p)
                    )),
                };
                if let Ok(mut d) = done.lock() {
                    *d = Some(r);
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                let g = inner.groups.load(Ordering::Relaxed);
                if g != seen_groups {
                    seen_groups = g;
                    // Only a head start: an error here changes nothing (the
                    // checkpoint's fdatasync reports what matters).
                    if let Err(e) = inner.data.start_writeback() {
                        tracing::debug!(error = %e, "starting data write-back failed");
                    }
                }
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The committer's WAL state (owned by the committer thread).
struct LogState {
    /// Declared first: dropped (joined) before the rest.
    pipeline: WalPipeline,
    wal: WalWriter,
    max_record_bytes: usize,
    last_checkpoint: Instant,
    flusher: Flusher,
    /// A background checkpoint is between its start and its redb commit.
    flushing: bool,
    /// Metadata of the groups not yet handed to a checkpoint, in order.
    pending: Vec<Arc<GroupChanges>>,
    pending_bytes: usize,
    /// Checkpointed groups whose overlay versions wait to be pruned:
    /// (last group of the checkpoint, its changes).
    to_prune: VecDeque<(u64, Vec<Arc<GroupChanges>>)>,
    /// The committer's read view (redb snapshot as of the last checkpoint
    /// + every group in the overlay), renewed after each checkpoint.
    view: Option<ReadView>,
    /// Whole extent maps of recently written objects, as the view holds them.
    ext_cache: RefCell<ExtentCache>,
}

impl LogState {
    /// Something acknowledged is not yet durable outside the WAL.
    fn dirty(&self) -> bool {
        self.wal.used_bytes() > 0
    }
    fn checkpoint_due(&self, interval: Duration) -> bool {
        self.wal.used_bytes() >= self.wal.capacity_bytes() / 4
            || self.pending_bytes >= OVERLAY_CHECKPOINT_BYTES
            || (self.dirty() && self.last_checkpoint.elapsed() >= interval)
    }
    /// A mark covering every group handed to the WAL writer so far.
    fn take_mark(&mut self, inner: &Inner) -> Mark {
        use std::sync::atomic::Ordering;
        self.pending_bytes = 0;
        Mark {
            seq: self.wal.last_seq(),
            head: self.wal.tail_pos(),
            head_off: self.wal.file_offset(self.wal.tail_pos()),
            group: inner.groups.load(Ordering::SeqCst),
            changes: std::mem::take(&mut self.pending),
        }
    }
    /// A checkpoint's redb commit is done: the log space before its head is
    /// free and redb holds its groups.
    fn checkpointed(&mut self, inner: &Inner, m: Mark) {
        use std::sync::atomic::Ordering;
        self.wal.advance_head(m.head);
        self.last_checkpoint = Instant::now();
        inner.applied_group.store(m.group, Ordering::SeqCst);
        self.view = None;
        if !m.changes.is_empty() {
            self.to_prune.push_back((m.group, m.changes));
        }
    }
    /// Drops overlay versions redb holds that no reader can still need.
    fn prune(&mut self, inner: &Inner) {
        use std::sync::atomic::Ordering;
        if self.to_prune.is_empty() {
            return;
        }
        let Ok(rd) = inner.readers.lock() else {
            return;
        };
        let oldest = rd.active_applied.keys().next().copied().unwrap_or(u64::MAX);
        let upto = inner.applied_group.load(Ordering::SeqCst).min(oldest);
        // Pruning under the readers lock: a reader registering meanwhile
        // would read applied_group >= upto anyway.
        while self.to_prune.front().is_some_and(|(g, _)| *g <= upto) {
            if let Some((_, chs)) = self.to_prune.pop_front() {
                for ch in &chs {
                    inner.overlay.prune(ch, upto);
                }
            }
        }
    }
    /// The committer's view, opened on first use after each checkpoint.
    fn take_view(&mut self, inner: &Inner) -> Result<ReadView> {
        match self.view.take() {
            Some(v) => Ok(v),
            None => Ok(ReadView::new(
                inner.db.begin_read()?,
                inner.overlay.clone(),
                u64::MAX,
            )),
        }
    }
    /// Waits for a background checkpoint in progress and finishes it.
    fn finish_flush(&mut self, inner: &Inner) -> std::result::Result<(), String> {
        while self.flushing {
            match self.flusher.take_done() {
                None => std::thread::sleep(FLUSH_POLL),
                Some(Err(e)) => {
                    self.flushing = false;
                    poison(inner, &e);
                    return Err(e);
                }
                Some(Ok(m)) => {
                    self.flushing = false;
                    self.checkpointed(inner, m);
                }
            }
        }
        Ok(())
    }
}

pub(crate) fn poisoned_msg(inner: &Inner) -> Option<String> {
    inner.poisoned.lock().ok().and_then(|g| g.clone())
}

pub(crate) fn poison(inner: &Inner, msg: &str) {
    tracing::error!(error = %msg, "store commit failed; store poisoned until reopen");
    if let Ok(mut p) = inner.poisoned.lock() {
        if p.is_none() {
            *p = Some(msg.to_string());
        }
    }
    inner.durable_cv.notify_all();
}

thread_local! {
    /// Completions of transactions a guarded store thread dropped
    /// unacknowledged while it panicked: failed, with the panic's message,
    /// once the unwinding reaches [`run_guarded`]. None outside a guarded thread.
    static ORPHANS: RefCell<Option<Vec<Arc<Completion>>>> = const { RefCell::new(None) };
}

/// Completions a store thread holds (checkpoint requests); failed if
/// dropped without a result, as [`Pending`]s are.
struct Waiters(Vec<Arc<Completion>>);

impl Drop for Waiters {
    fn drop(&mut self) {
        for c in &self.0 {
            drop_unfinished(c);
        }
    }
}

/// A completion is dropped by the store without a result: during a panic
/// of a guarded thread it waits for the panic's message ([`run_guarded`]),
/// otherwise it fails now.
fn drop_unfinished(c: &Arc<Completion>) {
    if c.is_finished() {
        return;
    }
    if std::thread::panicking() {
        let kept = ORPHANS
            .try_with(|o| match o.try_borrow_mut().as_deref_mut() {
                Ok(Some(v)) => {
                    v.push(c.clone());
                    true
                }
                _ => false,
            })
            .unwrap_or(false);
        if kept {
            return;
        }
    }
    let thread = std::thread::current();
    c.fail_unfinished(StoreError::Poisoned(format!(
        "store thread {} stopped before this transaction was acknowledged; reopen the store",
        thread.name().unwrap_or("(unnamed)")
    )));
}

/// The message a panic carried.
pub(crate) fn panic_text(p: &(dyn std::any::Any + Send)) -> &str {
    p.downcast_ref::<&str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// Runs the body of store thread `role`. If it panics, the store is
/// poisoned with the panic's message, every transaction the thread
/// dropped unacknowledged fails with it, and the message is returned (for
/// the caller to fail what else waits on that thread).
fn run_guarded(inner: &Inner, role: &str, body: impl FnOnce()) -> Option<String> {
    ORPHANS.with(|o| *o.borrow_mut() = Some(Vec::new()));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
    let orphans = ORPHANS.with(|o| o.borrow_mut().take()).unwrap_or_default();
    let msg = r.err().map(|p| {
        format!(
            "store {role} thread panicked: {}; the store is poisoned until reopened",
            panic_text(&*p)
        )
    });
    let fail = msg.as_deref().unwrap_or("store thread stopped");
    if let Some(m) = &msg {
        poison(inner, m);
    }
    for c in orphans {
        c.fail_unfinished(StoreError::Poisoned(fail.to_string()));
    }
    msg
}

/// The committer panicked: fails every transaction and checkpoint request
/// still queued for it (new ones fail on the poison).
fn fail_intake(inner: &Inner, intake: &Intake<Pending>, msg: &str) {
    intake.close();
    while let Ok(t) = intake.take(Duration::ZERO) {
        let results = t.txns.iter().map(|_| None).collect();
        finish_group(inner, t.txns, results, Some(msg));
        for c in t.checkpoints {
            c.complete(Err(StoreError::Poisoned(msg.to_string())));
        }
    }
}

#[cfg(test)]
impl Store {
    /// Tests: makes store thread `role` panic at its next unit of work
    /// (see `Inner::panic_in`).
    pub(crate) fn panic_next_in(&self, role: &'static str) {
        if let Ok(mut p) = self.inner.panic_in.lock() {
            *p = Some(role);
        }
    }
    /// Tests: whether the store is poisoned.
    pub(crate) fn is_poisoned(&self) -> bool {
        self.inner.is_poisoned()
    }
}

/// Tests: panics here if the test asked thread `role` to.
#[cfg(test)]
pub(crate) fn test_panic_point(inner: &Inner, role: &str) {
    let hit = inner
        .panic_in
        .lock()
        .map(|mut p| p.take_if(|r| *r == role).is_some())
        .unwrap_or(false);
    if hit {
        panic!("test panic in the {role} thread");
    }
}

/// A full checkpoint now, in the committer (explicit `checkpoint()`, close,
/// before a direct group): finishes a background one, waits for every
/// group handed to the WAL writer, then flushes everything; the WAL is
/// empty and the overlay prunable afterwards.
fn checkpoint(inner: &Inner, log: &mut LogState) -> std::result::Result<(), String> {
    if let Some(p) = poisoned_msg(inner) {
        return Err(p);
    }
    log.finish_flush(inner)?;
    inner.drain_wal_jobs();
    if let Some(p) = poisoned_msg(inner) {
        return Err(p);
    }
    if !log.dirty() && log.pending.is_empty() {
        log.last_checkpoint = Instant::now();
        return Ok(());
    }
    let m = log.take_mark(inner);
    match flush_mark(inner, &m) {
        Ok(()) => {
            log.checkpointed(inner, m);
            log.prune(inner);
            Ok(())
        }
        Err(e) => {
            let msg = format!("checkpoint failed: {e}");
            poison(inner, &msg);
            Err(msg)
        }
    }
}

/// Background checkpoints: finish one whose flush is done, start one when due.
fn background_checkpoint(inner: &Inner, log: &mut LogState, interval: Duration) {
    if poisoned_msg(inner).is_some() {
        return;
    }
    if log.flushing {
        match log.flusher.take_done() {
            None => return,
            Some(Err(e)) => {
                log.flushing = false;
                poison(inner, &e);
                return;
            }
            Some(Ok(m)) => {
                log.flushing = false;
                log.checkpointed(inner, m);
            }
        }
    }
    log.prune(inner);
    if log.checkpoint_due(interval) {
        let m = log.take_mark(inner);
        if log.flusher.start(m) {
            log.flushing = true;
        } else {
            poison(inner, "checkpoint flusher thread is gone");
        }
    }
}

fn committer_loop(inner: &Inner, mut log: LogState, intake: &Intake<Pending>) {
    let interval = Duration::from_millis(inner.cfg.checkpoint_interval_ms.max(1));
    loop {
        background_checkpoint(inner, &mut log, interval);
        let wait = if log.flushing || !log.to_prune.is_empty() {
            FLUSH_POLL
        } else if log.dirty() {
            interval.saturating_sub(log.last_checkpoint.elapsed())
        } else {
            Duration::from_secs(3600)
        };
        let taken = match intake.take(wait) {
            Ok(t) => t,
            Err(Empty::TimedOut) => continue,
            Err(Empty::Closed) => break,
        };
        let checkpoints = Waiters(taken.checkpoints);
        if !taken.txns.is_empty() {
            #[cfg(test)]
            test_panic_point(inner, "committer");
            commit_batch(inner, &mut log, taken.txns);
        }
        if !checkpoints.0.is_empty() {
            let r = checkpoint(inner, &mut log);
            for c in &checkpoints.0 {
                c.complete(r.clone().map_err(StoreError::Poisoned));
            }
        }
    }
    // Clean close: checkpoint so that the next open has nothing to replay.
    let _ = log.finish_flush(inner);
    inner.drain_wal_jobs();
    if poisoned_msg(inner).is_none() {
        let _ = checkpoint(inner, &mut log);
    }
}

/// Completes a group's transactions: `results[i]` for those that failed on
/// their own, `failed` (the store's failure) or Ok for the rest, and wakes
/// their waiters.
fn finish_group(
    inner: &Inner,
    batch: Vec<Pending>,
    results: Vec<Option<Result<()>>>,
    failed: Option<&str>,
) {
    let mut wake = Vec::new();
    set_results(inner, batch, results, failed, &mut wake);
    wake_groups(&wake);
}

/// [`finish_group`] without the wake-up: the results are set and the
/// groups to wake added to `wake` (once each), so that a thread finishing
/// several groups sets every result before it wakes anyone.
fn set_results(
    inner: &Inner,
    batch: Vec<Pending>,
    results: Vec<Option<Result<()>>>,
    failed: Option<&str>,
    wake: &mut Vec<Arc<GroupAck>>,
) {
    let mut released = 0;
    for (p, r) in batch.into_iter().zip(results) {
        released += p.bytes;
        let r = r.unwrap_or_else(|| match failed {
            None => Ok(()),
            Some(msg) => Err(StoreError::Poisoned(msg.to_string())),
        });
        // After a failed commit (poisoned) the blocks may be referenced by a
        // commit that did reach the disk: keep them until reopen rebuilds the map.
        if matches!(&r, Err(e) if !matches!(e, StoreError::Poisoned(_))) {
            p.release_prewrites(inner);
        }
        p.done.set(r);
        if !wake.iter().any(|g| Arc::ptr_eq(g, p.done.group())) {
            wake.push(p.done.group().clone());
        }
    }
    if let Ok(mut n) = inner.inflight.lock() {
        *n = n.saturating_sub(released);
    }
    inner.inflight_cv.notify_all();
}

/// Wakes every waiter of these groups: one futex call per group.
fn wake_groups(groups: &[Arc<GroupAck>]) {
    for g in groups {
        g.wake_all();
    }
}

/// Applies a batch as one group (a transaction that fails is reported alone
/// and the rest retried) and hands it to the WAL writer, which acknowledges
/// it once durable.
fn commit_batch(inner: &Inner, log: &mut LogState, batch: Vec<Pending>) {
    // A transaction whose large data could not be written fails alone.
    let mut results: Vec<Option<Result<()>>> = batch.iter().map(Pending::prepare_error).collect();
    if let Some(p) = poisoned_msg(inner) {
        finish_group(inner, batch, results, Some(&p));
        return;
    }
    write_deferred(inner, &batch, &mut results);
    let mut direct = false;
    loop {
        let attempt = if direct {
            try_direct(inner, log, &batch, &mut results)
        } else {
            try_batch(inner, log, &batch, &mut results)
        };
        match attempt {
            Ok(Attempt::Retry) => continue,
            Ok(Attempt::Direct) => {
                // Everything before goes to redb first, so that the direct
                // group's write transaction sees the current state.
                if let Err(msg) = checkpoint(inner, log) {
                    finish_group(inner, batch, results, Some(&msg));
                    return;
                }
                direct = true;
            }
            Ok(Attempt::Committed(c)) => {
                log.pipeline.send(
                    inner,
                    WalJob {
                        commit: c,
                        batch,
                        results,
                    },
                );
                return;
            }
            Err(e) => {
                let msg = e.to_string();
                poison(inner, &msg);
                finish_group(inner, batch, results, Some(&msg));
                return;
            }
        }
    }
}

/// Most blocks in one vectored write of deferred data.
const DEFERRED_WRITE_MAX_BLOCKS: usize = 512;

/// Writes the blocks of the batch's deferred (small) writes into the data
/// file through the page cache, here on the committer, in as few calls as
/// their places allow: the allocator hands small writes consecutive blocks,
/// so a group's blocks mostly form one run and go in one `pwritev`. (When
/// every submitter wrote its own 4 KiB, 64 writers queued on the data
/// file's inode lock and paid a sleep and a wake-up each.) Done before the
/// group applies, so a later group's read-modify-write finds the bytes,
/// and long before any reader can see the group (only once durable). A
/// failed write fails the transactions whose blocks it held, only them.
fn write_deferred(inner: &Inner, batch: &[Pending], results: &mut [Option<Result<()>>]) {
    let bs = inner.block_size;
    // (first physical block, bytes, transaction)
    let mut pieces: Vec<(u64, &[u8], usize)> = Vec::new();
    for (i, p) in batch.iter().enumerate() {
        for pw in p.pre.iter().flatten() {
            let Some(img) = &pw.image else {
                continue;
            };
            let mut at = 0usize;
            for &(s, l) in &pw.runs {
                let n = (l * bs) as usize;
                pieces.push((s, &img[at..at + n], i));
                at += n;
            }
        }
    }
    pieces.sort_unstable_by_key(|p| p.0);
    let mut k = 0;
    while k < pieces.len() {
        let mut end = pieces[k].0 + pieces[k].1.len() as u64 / bs;
        let mut j = k + 1;
        while j < pieces.len() && pieces[j].0 == end && j - k < DEFERRED_WRITE_MAX_BLOCKS {
            end += pieces[j].1.len() as u64 / bs;
            j += 1;
        }
        let bufs: Vec<&[u8]> = pieces[k..j].iter().map(|p| p.1).collect();
        if let Err(e) = inner.data.write_vectored_at(&bufs, pieces[k].0 * bs) {
            for p in &pieces[k..j] {
                // io::Error is not Clone: one per transaction.
                let err = match e.raw_os_error() {
                    Some(code) => std::io::Error::from_raw_os_error(code),
                    None => std::io::Error::new(e.kind(), e.to_string()),
                };
                results[p.2] = Some(Err(StoreError::io("data file write", err)));
            }
        }
        k = j;
    }
}

/// What a group attempt left for the WAL writer to finish.
struct Committed {
    /// The group's WAL record and its file offset; None when the group was
    /// made durable by a direct metadata commit.
    record: Option<(u64, wal::WalRecord)>,
    /// Blocks the group freed (reusable once durable and older readers drained).
    freed: Vec<(u64, u64)>,
    /// The part of `freed` to give back to the filesystem (zero, truncate, remove).
    discard: Vec<(u64, u64)>,
    /// The group's number (`Inner::groups`).
    group: u64,
}

enum Attempt {
    /// A transaction failed on its own (its result is set): run the rest again.
    Retry,
    /// The group does not fit in one WAL record (or the log is full): run it
    /// again as a direct redb commit.
    Direct,
    Committed(Committed),
}

/// A group on its way to the disk.
struct WalJob {
    commit: Committed,
    batch: Vec<Pending>,
    results: Vec<Option<Result<()>>>,
}

/// The WAL threads. The committer only queues each group's encoded record
/// (it never waits for the disk, so it goes straight on to the next group);
/// a WAL thread takes every record queued and not yet taken, writes them
/// (`O_DIRECT`, contiguous ones in one write) and then runs
/// `fdatasync(wal)` for every record written so far, up to
/// [`WAL_SYNCS_IN_FLIGHT`] of them at once (the block layer merges the
/// flushes). The thread that finishes a sync acknowledges the groups it
/// covers itself.
struct WalPipeline {
    q: Arc<SyncQueue>,
    syncers: Vec<JoinHandle<()>>,
}

/// WAL threads, hence writes plus fdatasyncs of the log that may run at
/// once: while one thread syncs, another writes the records queued since.
const WAL_SYNCS_IN_FLIGHT: usize = 3;
/// Queued groups (written or not) waiting for their sync before the
/// committer waits.
const WAL_WRITTEN_UNSYNCED_MAX: usize = 64;

impl WalPipeline {
    fn spawn(inner: Arc<Inner>, wal: Arc<dyn StoreFile>) -> Result<WalPipeline> {
        let q = Arc::new(SyncQueue {
            state: Mutex::new(SyncState::default()),
            cv: Condvar::new(),
        });
        let mut syncers = Vec::new();
        for i in 0..WAL_SYNCS_IN_FLIGHT {
            let (inner2, wal2, q2) = (inner.clone(), wal.clone(), q.clone());
            match std::thread::Builder::new()
                .name(format!("store-wal-sync{i}"))
                .spawn(move || {
                    let run = || wal_sync_loop(&inner2, &*wal2, &q2);
                    if let Some(msg) = run_guarded(&inner2, "WAL", run) {
                        fail_wal_queue(&inner2, &q2, &msg);
                    }
                }) {
                Ok(h) => syncers.push(h),
                Err(e) if syncers.is_empty() => {
                    return Err(StoreError::io("spawn WAL sync thread", e));
                }
                // Fewer threads only means fewer syncs in flight.
                Err(e) => tracing::warn!(error = %e, "could not spawn every WAL sync thread"),
            }
        }
        Ok(WalPipeline { q, syncers })
    }
    /// Queues the group (its record, if it has one) for the WAL threads,
    /// which write it, sync it and acknowledge it once durable.
    fn send(&self, inner: &Inner, job: WalJob) {
        if let Ok(mut n) = inner.wal_jobs.lock() {
            *n += 1;
        }
        let fail = |job: WalJob, msg: &str| {
            poison(inner, msg);
            finish_group(inner, job.batch, job.results, Some(msg));
            job_done(inner, 1);
        };
        let lock_lost = "WAL sync queue lock poisoned";
        let Ok(mut st) = self.q.state.lock() else {
            return fail(job, lock_lost);
        };
        // Bounded: WAL threads that died (panicked) never make room.
        while st.queue.len() >= WAL_WRITTEN_UNSYNCED_MAX && !inner.is_poisoned() {
            st = match self.q.cv.wait_timeout(st, POISON_POLL) {
                Ok((g, _)) => g,
                Err(_) => return fail(job, lock_lost),
            };
        }
        // A poisoned store may have no WAL thread left to finish the group.
        if let Some(msg) = poisoned_msg(inner) {
            drop(st);
            return fail(job, &msg);
        }
        st.last_ticket += 1;
        let ticket = st.last_ticket;
        let has_record = job.commit.record.is_some();
        st.queue.push_back(Queued {
            ticket,
            has_record,
            // A direct-path group is durable already: nothing to write.
            taken: !has_record,
            written: !has_record,
            job,
        });
        drop(st);
        self.q.cv.notify_all();
    }
}

impl Drop for WalPipeline {
    fn drop(&mut self) {
        if let Ok(mut st) = self.q.state.lock() {
            st.closed = true;
        }
        self.q.cv.notify_all();
        for h in self.syncers.drain(..) {
            let _ = h.join();
        }
    }
}

/// A WAL thread panicked: fails every group queued for the WAL threads
/// (later ones fail in [`WalPipeline::send`], on the poison).
fn fail_wal_queue(inner: &Inner, q: &SyncQueue, msg: &str) {
    let mut st = q.state.lock().unwrap_or_else(|e| e.into_inner());
    let jobs: Vec<WalJob> = st.queue.drain(..).map(|b| b.job).collect();
    drop(st);
    q.cv.notify_all();
    if !jobs.is_empty() {
        ack_jobs(inner, jobs, &Err(msg.to_string()));
    }
}

fn job_done(inner: &Inner, n: u64) {
    if let Ok(mut j) = inner.wal_jobs.lock() {
        *j = j.saturating_sub(n);
    }
    inner.wal_jobs_cv.notify_all();
}

/// A group between the committer and its acknowledgement.
struct Queued {
    /// Queue order = log order (the committer reserved the records' places
    /// in this order).
    ticket: u64,
    has_record: bool,
    /// A WAL thread took its record to write it.
    taken: bool,
    /// Its record is written (or it had none): a sync started from now on covers it.
    written: bool,
    job: WalJob,
}

/// Groups queued for the WAL threads, in ticket order. Records are written
/// by whichever thread takes them, so they may finish writing out of order;
/// a sync covers only the gap-free written prefix of the queue as it was
/// when the sync started (every one of those was written before it began),
/// so completions need no reordering and no group is acknowledged before
/// an earlier one.
#[derive(Default)]
struct SyncState {
    queue: VecDeque<Queued>,
    last_ticket: u64,
    /// Highest ticket a started sync covers.
    covered: u64,
    closed: bool,
}

struct SyncQueue {
    state: Mutex<SyncState>,
    cv: Condvar,
}

/// One WAL thread: syncs the log when the written prefix goes beyond what
/// started syncs cover, and after the sync acknowledges every group up to
/// the one it covered (in order, under the queue lock); otherwise writes
/// the records nobody has taken yet.
fn wal_sync_loop(inner: &Inner, wal: &dyn StoreFile, q: &SyncQueue) {
    let Ok(mut st) = q.state.lock() else {
        return;
    };
    loop {
        // 1. Sync the written prefix unless a started sync covers it (first:
        //    the records this thread just wrote wait for it).
        let target = st
            .queue
            .iter()
            .take_while(|b| b.written)
            .last()
            .map_or(0, |b| b.ticket);
        if target > st.covered {
            let from = st.covered;
            st.covered = target;
            // Only groups with a record need the log synced (a direct-path
            // group is already durable; it waits here only to keep the order).
            let needs_sync = st
                .queue
                .iter()
                .filter(|b| b.ticket > from && b.ticket <= target)
                .any(|b| b.has_record);
            drop(st);
            #[cfg(test)]
            test_panic_point(inner, "WAL");
            let r = match poisoned_msg(inner) {
                Some(p) => Err(p),
                None if needs_sync => wal
                    .sync_data()
                    .map_err(|e| StoreError::io("WAL fdatasync", e).to_string()),
                None => Ok(()),
            };
            if let Err(e) = &r {
                poison(inner, e);
            }
            st = match q.state.lock() {
                Ok(g) => g,
                Err(_) => return,
            };
            let mut done = Vec::new();
            while st.queue.front().is_some_and(|b| b.ticket <= target) {
                done.extend(st.queue.pop_front().map(|b| b.job));
            }
            if !done.is_empty() {
                ack_jobs(inner, done, &r);
            }
            q.cv.notify_all();
            continue;
        }
        // 2. Otherwise write every record queued and not taken yet (a suffix
        //    of the queue); the sync of them comes on the next turn.
        if let Some(i) = st.queue.iter().position(|b| !b.taken) {
            let mut recs = Vec::new();
            let mut tickets = Vec::new();
            for b in st.queue.iter_mut().skip(i).filter(|b| !b.taken) {
                b.taken = true;
                tickets.push(b.ticket);
                recs.extend(b.job.commit.record.take());
            }
            drop(st);
            if let Err(e) = write_records(inner, wal, recs) {
                // The sync below then fails every group from here on, in order.
                poison(inner, &e.to_string());
            }
            st = match q.state.lock() {
                Ok(g) => g,
                Err(_) => return,
            };
            for b in st.queue.iter_mut() {
                if tickets.binary_search(&b.ticket).is_ok() {
                    b.written = true;
                }
            }
            continue;
        }
        if st.closed && st.queue.is_empty() {
            return;
        }
        st = match q.cv.wait(st) {
            Ok(g) => g,
            Err(_) => return,
        };
    }
}

/// Publishes a batch's durability (or its failure) and acknowledges it.
fn ack_jobs(inner: &Inner, jobs: Vec<WalJob>, r: &std::result::Result<(), String>) {
    let n = jobs.len() as u64;
    // A sync that succeeded still does not cover a batch whose write failed.
    let failed = poisoned_msg(inner).or_else(|| r.clone().err());
    let mut wake = Vec::new();
    for job in jobs {
        match &failed {
            None => {
                let c = job.commit;
                // Durable first: a reader that registers after this sees
                // the group, so the blocks it freed can be held for the
                // readers registered before only.
                if let Ok(mut d) = inner.durable_groups.lock() {
                    *d = (*d).max(c.group);
                }
                inner.durable_cv.notify_all();
                release_after_durable(inner, c.group, c.freed, c.discard);
                set_results(inner, job.batch, job.results, None, &mut wake);
            }
            Some(msg) => set_results(inner, job.batch, job.results, Some(msg), &mut wake),
        }
    }
    // Every result first, then the wake-ups (one per group): a woken
    // caller that preempts this thread finds the others already set free.
    wake_groups(&wake);
    job_done(inner, n);
}

/// Writes `recs` (file offset, record; in log order) — contiguous ones in
/// one O_DIRECT write; not yet durable.
fn write_records(
    inner: &Inner,
    wal: &dyn StoreFile,
    recs: Vec<(u64, wal::WalRecord)>,
) -> Result<()> {
    if let Some(p) = poisoned_msg(inner) {
        return Err(StoreError::Poisoned(p));
    }
    let wio = |e| StoreError::io("WAL write", e);
    let mut i = 0;
    while i < recs.len() {
        let start = recs[i].0;
        let mut j = i + 1;
        let mut end = start + recs[i].1.len() as u64;
        while j < recs.len() && recs[j].0 == end {
            end += recs[j].1.len() as u64;
            j += 1;
        }
        if j == i + 1 {
            wal::write_record(wal, start, &recs[i].1).map_err(wio)?;
        } else {
            let parts: Vec<&wal::WalRecord> = recs[i..j].iter().map(|(_, r)| r).collect();
            wal::write_record(wal, start, &wal::WalRecord::concat(&parts)).map_err(wio)?;
        }
        i = j;
    }
    Ok(())
}

/// One attempt at a group on the normal path. The exact order (see README
/// "fsync discipline"):
/// 1. apply every transaction against the committer's view (the redb
///    snapshot merged with the overlay), collecting the changes in memory;
///    small writes go to fresh blocks through the page cache; every change
///    lands in the redo log;
/// 2. encode the WAL record and reserve its place in the log;
/// 3. number the group and put its changes in the overlay (readers see
///    them once the group is durable) and in the next checkpoint's list;
/// 4. a WAL thread writes the record, a WAL thread fdatasyncs the log —
///    the durability point — and acknowledges.
///
/// redb is not touched: the group's metadata reaches it at the next
/// checkpoint, in one large write transaction with many other groups.
fn try_batch(
    inner: &Inner,
    log: &mut LogState,
    batch: &[Pending],
    results: &mut [Option<Result<()>>],
) -> Result<Attempt> {
    let meta_low = meta_low(inner);
    let view = log.take_view(inner)?;
    let next_id = *lock(&inner.next_id)?;
    // The group's small writes log their blocks' images (read-modify-writes
    // add a few more): room for them up front.
    let images_bytes: usize = batch
        .iter()
        .flat_map(|p| p.pre.iter().flatten())
        .filter_map(|pw| Some(pw.image.as_ref()?.len() + 12 * pw.runs.len()))
        .sum();
    let redo = RedoLog::new(log.max_record_bytes, images_bytes);
    let mut b = Batch {
        inner,
        t: Tables::over(&view, &redo, Some(&log.ext_cache)),
        allocated: Vec::new(),
        freed: Vec::new(),
        discarded: Vec::new(),
        data_dirty: false,
        redo: redo.clone(),
        next_id,
        next_id_dirty: false,
        meta_low,
    };
    let mut outcome = None;
    for (i, p) in batch.iter().enumerate() {
        if results[i].is_some() {
            continue;
        }
        if let Err(e) = b.apply(&p.txn, &p.pre) {
            if redo.borrow().overflowed() {
                outcome = Some(Attempt::Direct);
            } else {
                results[i] = Some(Err(e));
                outcome = Some(Attempt::Retry);
            }
            break;
        }
    }
    if outcome.is_none() && b.next_id_dirty {
        let id = b.next_id.to_be_bytes();
        if b.t
            .sup
            .insert(b"next_id".as_slice(), id.as_slice())
            .is_err()
        {
            outcome = Some(Attempt::Direct);
        }
    }
    // Blocks that submitters wrote in place (large aligned writes).
    let runs: Vec<(u64, u64)> = batch
        .iter()
        .enumerate()
        .filter(|(i, _)| results[*i].is_none())
        .flat_map(|(_, p)| p.pre.iter().flatten())
        .filter(|pw| pw.image.is_none())
        .flat_map(|pw| pw.runs.iter().copied())
        .collect();
    let record = match outcome {
        Some(_) => None,
        None => {
            let r = redo.borrow();
            if r.overflowed() {
                None
            } else {
                let rec = wal::encode_record(log.wal.next_seq(), log.wal.store_id(), &r, &runs);
                log.wal.fits(rec.len() as u64).then_some(rec)
            }
        }
    };
    let Some(rec) = record else {
        // Give back what this attempt allocated (its page-cache writes to
        // those blocks are garbage nobody references).
        let allocated = std::mem::take(&mut b.allocated);
        drop(b);
        log.view = Some(view);
        let mut a = inner.lock_alloc()?;
        for (s, l) in allocated {
            a.release(s, l);
        }
        return Ok(outcome.unwrap_or(Attempt::Direct));
    };
    let (changes, freed, discard, next_id) = {
        let b = b;
        let Batch {
            t,
            freed,
            discarded,
            next_id,
            ..
        } = b;
        (Arc::new(t.into_changes()), freed, discarded, next_id)
    };
    log.view = Some(view);
    let off = log
        .wal
        .reserve(rec.len() as u64)
        .ok_or_else(|| StoreError::Corrupt("WAL reservation lost".into()))?;
    use std::sync::atomic::Ordering;
    let group = inner.groups.fetch_add(1, Ordering::SeqCst) + 1;
    inner.overlay.insert(group, &changes);
    log.ext_cache.borrow_mut().apply(&changes);
    log.pending_bytes += changes
        .kv
        .iter()
        .map(|(_, k, v)| k.len() + v.as_ref().map_or(0, |v| v.len()))
        .sum::<usize>();
    log.pending.push(changes);
    *lock(&inner.next_id)? = next_id;
    Ok(Attempt::Committed(Committed {
        record: Some((off, rec)),
        freed,
        discard,
        group,
    }))
}

/// The metadata filesystem is below its reserve: only shrinking ops commit.
fn meta_low(inner: &Inner) -> bool {
    inner
        .meta_dir_for_statvfs
        .as_deref()
        .and_then(fs_available)
        .is_some_and(|a| a < inner.cfg.meta_reserve_bytes)
}

/// A group too large for one WAL record (or met with a full log), run after
/// a full checkpoint: applied in one redb write transaction, then
/// fdatasync(data) and a durable redb commit that also records the WAL as
/// fully applied.
fn try_direct(
    inner: &Inner,
    log: &mut LogState,
    batch: &[Pending],
    results: &mut [Option<Result<()>>],
) -> Result<Attempt> {
    let meta_low = meta_low(inner);
    let mut w = inner.db.begin_write()?;
    w.set_durability(Durability::Immediate);
    let next_id = *lock(&inner.next_id)?;
    let redo = RedoLog::disabled();
    let mut b = Batch {
        inner,
        t: Tables::open(&w, &redo)?,
        allocated: Vec::new(),
        freed: Vec::new(),
        discarded: Vec::new(),
        data_dirty: false,
        redo: redo.clone(),
        next_id,
        next_id_dirty: false,
        meta_low,
    };
    for (i, p) in batch.iter().enumerate() {
        if results[i].is_some() {
            continue;
        }
        if let Err(e) = b.apply(&p.txn, &p.pre) {
            results[i] = Some(Err(e));
            let allocated = std::mem::take(&mut b.allocated);
            drop(b);
            w.abort()?;
            let mut a = inner.lock_alloc()?;
            for (s, l) in allocated {
                a.release(s, l);
            }
            return Ok(Attempt::Retry);
        }
    }
    if b.next_id_dirty {
        b.t.sup
            .insert(b"next_id".as_slice(), b.next_id.to_be_bytes().as_slice())?;
    }
    // The checkpoint before left the log empty: this commit holds it all.
    let tail = log.wal.tail_pos();
    b.t.sup
        .insert(KEY_WAL_APPLIED, log.wal.last_seq().to_be_bytes().as_slice())?;
    b.t.sup.insert(
        KEY_WAL_HEAD,
        log.wal.file_offset(tail).to_be_bytes().as_slice(),
    )?;
    let (freed, next_id) = (std::mem::take(&mut b.freed), b.next_id);
    let discard = std::mem::take(&mut b.discarded);
    drop(b);
    inner.drain_wal_jobs();
    if let Some(p) = poisoned_msg(inner) {
        return Err(StoreError::Poisoned(p));
    }
    inner
        .data
        .sync_data()
        .map_err(|e| StoreError::io("data file fdatasync", e))?;
    use std::sync::atomic::Ordering;
    let group = inner.groups.fetch_add(1, Ordering::SeqCst) + 1;
    w.commit()?;
    inner.applied_group.store(group, Ordering::SeqCst);
    log.view = None;
    // This group went to redb without the overlay: the cache may not know it.
    log.ext_cache.borrow_mut().clear();
    log.wal.advance_head(tail);
    log.last_checkpoint = Instant::now();
    *lock(&inner.next_id)? = next_id;
    Ok(Attempt::Committed(Committed {
        record: None,
        freed,
        discard,
        group,
    }))
}

/// Blocks freed by group `seq` (now durable) go back to the allocator once
/// every reader whose view is older than that group has finished. Discarded
/// runs are punched out of the data file first (before anyone can allocate
/// them again), so zero/truncate/remove free space on the disk too.
fn release_after_durable(
    inner: &Inner,
    seq: u64,
    freed: Vec<(u64, u64)>,
    discard: Vec<(u64, u64)>,
) {
    let mut ready = Vec::new();
    {
        let Ok(mut rd) = inner.readers.lock() else {
            return;
        };
        if !freed.is_empty() {
            rd.held.push_back((seq, freed, discard));
        }
        let oldest_reader = rd.active.keys().next().copied().unwrap_or(u64::MAX);
        // Readers with an epoch >= s already see the group that freed these blocks.
        while rd.held.front().is_some_and(|(s, _, _)| *s <= oldest_reader) {
            if let Some(h) = rd.held.pop_front() {
                ready.push(h);
            }
        }
    }
    if ready.is_empty() {
        return;
    }
    let mut punch: Vec<(u64, u64)> = ready.iter().flat_map(|h| h.2.iter().copied()).collect();
    punch_runs(inner, &mut punch);
    let Ok(mut a) = inner.alloc.lock() else {
        return;
    };
    for (_, runs, _) in ready {
        for (st, l) in runs {
            a.release(st, l);
        }
    }
}

/// Punches free block runs out of the data file (coalescing neighbours),
/// when `discard_freed_blocks` asks for it; otherwise the blocks stay
/// written (cheaper to write again). A failure only costs disk space, so it
/// is logged, not fatal.
fn punch_runs(inner: &Inner, runs: &mut [(u64, u64)]) {
    if !inner.cfg.discard_freed_blocks {
        return;
    }
    runs.sort_unstable();
    let bs = inner.block_size;
    let mut cur: Option<(u64, u64)> = None;
    let mut out = Vec::new();
    for &(s, l) in runs.iter() {
        match &mut cur {
            Some((cs, cl)) if *cs + *cl == s => *cl += l,
            _ => {
                out.extend(cur.take());
                cur = Some((s, l));
            }
        }
    }
    out.extend(cur);
    for (s, l) in out {
        if let Err(e) = inner.data.punch_hole(s * bs, l * bs) {
            tracing::warn!(block = s, blocks = l, error = %e, "punching freed blocks failed; the space stays allocated in the data file");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{CollectionId, ObjectId};
    use crate::sim::{FaultPlan, SimFile};

    fn sim_store() -> Store {
        let plan = FaultPlan::new();
        let files = StoreFiles {
            data: SimFile::new(plan.clone()),
            meta: SimFile::new(plan.clone()),
            wal: SimFile::new(plan),
        };
        let mut c = StoreConfig::new("/nonexistent-sim-store");
        c.data_bytes = 16 << 20;
        c.cache_bytes = 4 << 20;
        c.wal_bytes = 1 << 20;
        c.checkpoint_interval_ms = 3_600_000;
        let s = Store::create_on(c, files).expect("mkfs on sim");
        let mut t = Transaction::new();
        t.create_collection(CollectionId::pg(1, 0));
        s.commit(t).expect("mkcoll");
        s
    }

    fn write_txn(i: usize) -> Transaction {
        let mut t = Transaction::new();
        let name = format!("o{i}");
        t.write(
            CollectionId::pg(1, 0),
            ObjectId::new(i as u32, &name),
            0,
            vec![i as u8; 4096],
        );
        t
    }

    /// Makes store thread `role` panic at its next group while 16 writers
    /// commit: every writer returns (none hangs) with the panic named, and
    /// later commits and checkpoints fail the same way.
    fn panicking_thread_fails_every_waiter(role: &'static str) {
        let s = Arc::new(sim_store());
        *s.inner.panic_in.lock().unwrap() = Some(role);
        let (tx, rx) = std::sync::mpsc::channel();
        for i in 0..16 {
            let (s, tx) = (s.clone(), tx.clone());
            std::thread::spawn(move || {
                let r = s.commit(write_txn(i));
                let _ = tx.send(r);
            });
        }
        let mut failed = 0;
        for _ in 0..16 {
            let r = rx
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| {
                    panic!("a commit waiter hung after the {role} thread panicked")
                });
            if let Err(e) = r {
                let msg = e.to_string();
                assert!(
                    msg.contains(&format!("store {role} thread panicked"))
                        && msg.contains(&format!("test panic in the {role} thread")),
                    "{msg}"
                );
                failed += 1;
            }
        }
        // The committer panics holding the first group, so it fails; a WAL
        // thread's groups may still be acknowledged by another WAL thread
        // whose sync covered them.
        assert!(
            failed > 0 || role != "committer",
            "the {role} thread's panic failed no commit"
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while !s.inner.is_poisoned() {
            assert!(
                Instant::now() < deadline,
                "the {role} thread's panic never poisoned the store"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let e = s.commit(write_txn(99)).expect_err("commit after the panic");
        assert!(e.to_string().contains("thread panicked"), "{e}");
        let e = s.checkpoint().expect_err("checkpoint after the panic");
        assert!(e.to_string().contains("thread panicked"), "{e}");
    }

    #[test]
    fn committer_panic_fails_every_waiter() {
        panicking_thread_fails_every_waiter("committer");
    }

    #[test]
    fn wal_thread_panic_fails_every_waiter() {
        panicking_thread_fails_every_waiter("WAL");
    }

    #[test]
    fn wal_sized_from_the_data_device_unless_set() {
        let mut c = StoreConfig::new("/nonexistent");
        assert_eq!(c.wal_bytes_for(64 << 20), AUTO_WAL_MIN_BYTES);
        assert_eq!(c.wal_bytes_for(2 << 30), 128 << 20);
        assert_eq!(c.wal_bytes_for(4 << 30), AUTO_WAL_MAX_BYTES);
        assert_eq!(c.wal_bytes_for(10 << 40), AUTO_WAL_MAX_BYTES);
        // Odd device sizes still give a 4 KiB-aligned log.
        assert_eq!(c.wal_bytes_for((3 << 30) + 12345) % WAL_ALIGN, 0);
        c.wal_bytes = (1 << 20) + 100;
        assert_eq!(c.wal_bytes_for(4 << 30), 1 << 20);
        c.wal_bytes = 4096;
        assert!(c.validate().is_err(), "a WAL under 256 KiB is refused");
        c.wal_bytes = 0;
        assert!(c.validate().is_ok());
    }
}
