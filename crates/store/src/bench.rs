//! `cairn store bench`: sustained writes or reads against a store with N
//! operations in flight, reporting throughput, latency percentiles and
//! process RSS. By default each operation in flight has its own thread
//! (one blocking commit or read at a time, as each of fio's psync jobs
//! does); with `drivers` set, writes are submitted by that many threads
//! instead, each keeping its share of the N commits in flight and waiting
//! for the oldest, as the OSD drives its store (a few workers, many
//! transactions in flight). Commits of small writes complete in submission
//! order (groups are acknowledged in order), so waiting for the oldest
//! delays no other one's completion.

use crate::error::Result;
use crate::ids::{CollectionId, ObjectId};
use crate::store::{Store, StoreConfig};
use crate::txn::Transaction;
use crate::CommitHandle;
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Per-thread latency samples kept (bounds memory: 4 bytes each).
const MAX_SAMPLES_PER_THREAD: usize = 1 << 20;
/// Each thread's objects for small I/O are this large.
const SMALL_OBJECT_BYTES: u64 = 4 << 20;
/// Total bytes of objects the bench keeps live (overwrites cycle within it).
const WORKING_SET_BYTES: u64 = 1 << 30;

#[derive(Debug, Clone)]
pub struct BenchOpts {
    pub path: PathBuf,
    pub io_bytes: u64,
    pub threads: usize,
    pub seconds: f64,
    pub read: bool,
    pub cache_bytes: u64,
    pub data_bytes: u64,
    pub block_size: u32,
    /// Threads that submit writes (0: one per operation in flight); each
    /// keeps `threads / drivers` commits in flight. Reads ignore it.
    pub drivers: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub mode: &'static str,
    pub io_bytes: u64,
    pub threads: usize,
    /// Threads that submitted the writes (0: one per operation in flight).
    pub drivers: usize,
    pub seconds: f64,
    pub ops: u64,
    pub mb_per_s: f64,
    pub iops: f64,
    pub lat_p50_us: u64,
    pub lat_p99_us: u64,
    pub lat_max_us: u64,
    pub rss_peak_bytes: u64,
    pub rss_end_bytes: u64,
    pub cache_bytes: u64,
    /// CPU time (user + system) of the whole process during the timed run.
    pub cpu_seconds: f64,
    /// `cpu_seconds` per operation, in microseconds.
    pub cpu_us_per_op: f64,
    /// The same split by thread role (thread name without its number:
    /// `store-commit`, `store-flush`, `store-wal-sync`, and `callers` for the
    /// bench's own threads, which submit and wait), in µs per operation.
    pub cpu_us_per_op_by_thread: BTreeMap<String, f64>,
}

/// CPU seconds used so far by each live thread of this process (the
/// scheduler's exact run time, `/proc/self/task/*/schedstat`), summed by
/// role: the thread name without trailing digits, and `callers` for the
/// threads not named `store-…` (the bench's own, which submit and wait).
/// Empty where /proc is missing.
pub fn thread_cpu_seconds() -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for e in dir.flatten() {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        let Some(run_ns) = std::fs::read_to_string(e.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        else {
            continue;
        };
        let name = comm.trim().trim_end_matches(|c: char| c.is_ascii_digit());
        let role = if name.starts_with("store-") {
            name
        } else {
            "callers"
        };
        *out.entry(role.to_string()).or_insert(0.0) += run_ns / 1e9;
    }
    out
}

/// User + system CPU time this process has used so far, in seconds.
pub fn process_cpu_seconds() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a properly sized out-struct.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Resident set size of this process (VmRSS), in bytes.
pub fn rss_bytes() -> u64 {
    proc_status_kb("VmRSS:") * 1024
}

fn proc_status_kb(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

struct Layout {
    objects_per_thread: u64,
    object_bytes: u64,
}

fn layout(o: &BenchOpts) -> Layout {
    let object_bytes = o.io_bytes.max(SMALL_OBJECT_BYTES);
    let per_thread = WORKING_SET_BYTES / o.threads.max(1) as u64;
    Layout {
        objects_per_thread: (per_thread / object_bytes).clamp(1, 64),
        object_bytes,
    }
}

fn coll(t: usize) -> CollectionId {
    CollectionId::pg(1, t as u32)
}

fn obj(t: usize, i: u64) -> ObjectId {
    let name = format!("bench.{t}.{i}");
    ObjectId::new(crc32c::crc32c(name.as_bytes()), name)
}

/// Runs the benchmark; creates the store under `opts.path` if it is not there.
pub fn run(opts: &BenchOpts) -> Result<BenchReport> {
    run_with(opts, |_| {})
}

/// [`run`] with the store configuration adjusted by `tune` (WAL size,
/// checkpoint interval… when comparing settings).
pub fn run_with(opts: &BenchOpts, tune: impl FnOnce(&mut StoreConfig)) -> Result<BenchReport> {
    let mut cfg = StoreConfig::new(&opts.path);
    cfg.cache_bytes = opts.cache_bytes;
    cfg.data_bytes = opts.data_bytes;
    cfg.block_size = opts.block_size;
    tune(&mut cfg);
    let store = if opts.path.join(crate::DATA_FILE).exists() {
        Store::open(cfg)?
    } else {
        Store::create(cfg)?
    };
    let store = Arc::new(store);
    let lay = layout(opts);
    let mut txn = Transaction::new();
    for t in 0..opts.threads {
        if !store.collection_exists(&coll(t))? {
            txn.create_collection(coll(t));
        }
    }
    if !txn.is_empty() {
        store.commit(txn)?;
    }
    // Like fio's file layout: the working set exists before timing starts.
    prefill(&store, opts, &lay)?;
    let stop = Arc::new(AtomicBool::new(false));
    let rss_peak = Arc::new(AtomicU64::new(rss_bytes()));
    let sampler = {
        let (stop, peak) = (stop.clone(), rss_peak.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(rss_bytes(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let start = Instant::now();
    let cpu0 = process_cpu_seconds();
    let threads0 = thread_cpu_seconds();
    let mut handles = Vec::new();
    let drivers = if opts.read {
        0
    } else {
        opts.drivers.min(opts.threads)
    };
    if drivers == 0 {
        for t in 0..opts.threads {
            let (store, stop, o) = (store.clone(), stop.clone(), opts.clone());
            let lay = Layout { ..layout(opts) };
            handles.push(std::thread::spawn(move || {
                worker(&store, &o, &lay, t, &stop)
            }));
        }
    } else {
        for d in 0..drivers {
            let (store, stop, o) = (store.clone(), stop.clone(), opts.clone());
            let lay = Layout { ..layout(opts) };
            let slots: Vec<usize> = (d..opts.threads).step_by(drivers).collect();
            handles.push(std::thread::spawn(move || {
                driver(&store, &o, &lay, &slots, &stop)
            }));
        }
    }
    std::thread::sleep(Duration::from_secs_f64(opts.seconds));
    // Before the callers exit (their time would leave the process's list).
    let threads1 = thread_cpu_seconds();
    stop.store(true, Ordering::Relaxed);
    let mut lats = Vec::new();
    let mut first_err = None;
    for h in handles {
        match h.join() {
            Ok(Ok(mut l)) => lats.append(&mut l),
            Ok(Err(e)) => first_err = first_err.or(Some(e)),
            Err(_) => {
                first_err = first_err.or(Some(crate::StoreError::Invalid(
                    "bench thread panicked".into(),
                )))
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu_seconds = process_cpu_seconds() - cpu0;
    let _ = sampler.join();
    if let Some(e) = first_err {
        return Err(e);
    }
    lats.sort_unstable();
    let pct = |p: f64| -> u64 {
        if lats.is_empty() {
            0
        } else {
            lats[((lats.len() - 1) as f64 * p) as usize] as u64
        }
    };
    let ops = lats.len() as u64;
    Ok(BenchReport {
        mode: if opts.read { "read" } else { "write" },
        io_bytes: opts.io_bytes,
        threads: opts.threads,
        drivers,
        seconds: secs,
        ops,
        mb_per_s: (ops * opts.io_bytes) as f64 / secs / 1e6,
        iops: ops as f64 / secs,
        lat_p50_us: pct(0.50),
        lat_p99_us: pct(0.99),
        lat_max_us: lats.last().copied().unwrap_or(0) as u64,
        rss_peak_bytes: rss_peak.load(Ordering::Relaxed),
        rss_end_bytes: rss_bytes(),
        cache_bytes: opts.cache_bytes,
        cpu_seconds,
        cpu_us_per_op: cpu_seconds * 1e6 / ops.max(1) as f64,
        cpu_us_per_op_by_thread: threads1
            .into_iter()
            .map(|(k, v)| {
                let d = v - threads0.get(&k).copied().unwrap_or(0.0);
                (k, d * 1e6 / ops.max(1) as f64)
            })
            .collect(),
    })
}

fn prefill(store: &Store, opts: &BenchOpts, lay: &Layout) -> Result<()> {
    let workers = 8.min(opts.threads);
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..workers)
            .map(|w| sc.spawn(move || prefill_part(store, opts, lay, w, workers)))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(crate::StoreError::Invalid("prefill thread panicked".into()))
                })
            })
            .collect::<Result<Vec<()>>>()
    })?;
    Ok(())
}

fn prefill_part(
    store: &Store,
    opts: &BenchOpts,
    lay: &Layout,
    part: usize,
    parts: usize,
) -> Result<()> {
    let chunk = (4u64 << 20).min(lay.object_bytes);
    let data = Bytes::from(vec![0x5Au8; chunk as usize]);
    for t in (part..opts.threads).step_by(parts) {
        for i in 0..lay.objects_per_thread {
            if store.exists(&coll(t), &obj(t, i))?
                && store.stat(&coll(t), &obj(t, i))?.size >= lay.object_bytes
            {
                continue;
            }
            let mut off = 0;
            while off < lay.object_bytes {
                let mut txn = Transaction::new();
                txn.write(coll(t), obj(t, i), off, data.clone());
                store.commit(txn)?;
                off += chunk;
            }
        }
    }
    Ok(())
}

/// `len` random bytes starting at a 4 KiB-aligned address, as fio's I/O
/// buffers are: the store then writes large ones with O_DIRECT straight
/// from the caller's memory (unaligned data costs it one copy).
fn aligned_random(rng: &mut impl Rng, len: usize) -> Bytes {
    const ALIGN: usize = 4096;
    let mut buf = vec![0u8; len + ALIGN];
    let skip = buf.as_ptr().align_offset(ALIGN).min(ALIGN);
    rng.fill(&mut buf[skip..skip + len]);
    Bytes::from(buf).slice(skip..skip + len)
}

/// One operation slot's state: the collection (`t`) it uses, its random
/// stream and its data buffer. A [`worker`] thread runs one slot; a
/// [`driver`] thread several.
struct Slot {
    t: usize,
    rng: rand::rngs::StdRng,
    data: Bytes,
}

impl Slot {
    fn new(t: usize, io_bytes: u64) -> Slot {
        let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
        let data = aligned_random(&mut rng, io_bytes as usize);
        Slot { t, rng, data }
    }

    /// The object and offset of this slot's `i`-th I/O: objects in turn for
    /// whole-object I/O, else a random aligned offset in a random object.
    fn next_io(&mut self, lay: &Layout, io_bytes: u64, i: u64) -> (u64, u64) {
        let slots = (lay.object_bytes / io_bytes).max(1);
        let oi = if slots == 1 {
            i % lay.objects_per_thread
        } else {
            self.rng.gen_range(0..lay.objects_per_thread)
        };
        (oi, self.rng.gen_range(0..slots) * io_bytes)
    }

    /// Submits a write of this slot's buffer to object `oi` at `off`.
    fn write_at(&self, store: &Store, oi: u64, off: u64) -> Result<CommitHandle> {
        let mut txn = Transaction::new();
        txn.write(coll(self.t), obj(self.t, oi), off, self.data.clone());
        store.submit(txn)
    }
}

/// A driver thread: keeps one commit in flight for each of its slots,
/// waits for the oldest, records its latency and submits that slot's next.
fn driver(
    store: &Store,
    o: &BenchOpts,
    lay: &Layout,
    slots: &[usize],
    stop: &AtomicBool,
) -> Result<Vec<u32>> {
    let mut state: Vec<Slot> = slots.iter().map(|&t| Slot::new(t, o.io_bytes)).collect();
    let mut lats = Vec::new();
    let mut in_flight = std::collections::VecDeque::new();
    let mut i = 0u64;
    let submit = |s: &mut Slot, i: u64| -> Result<CommitHandle> {
        let (oi, off) = s.next_io(lay, o.io_bytes, i);
        s.write_at(store, oi, off)
    };
    for (k, s) in state.iter_mut().enumerate() {
        in_flight.push_back((k, Instant::now(), submit(s, i)?));
    }
    while let Some((k, t0, h)) = in_flight.pop_front() {
        h.wait()?;
        if lats.len() < MAX_SAMPLES_PER_THREAD * slots.len() {
            lats.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
        }
        if !stop.load(Ordering::Relaxed) {
            i += 1;
            let h = submit(&mut state[k], i)?;
            in_flight.push_back((k, Instant::now(), h));
        }
    }
    Ok(lats)
}

fn worker(
    store: &Store,
    o: &BenchOpts,
    lay: &Layout,
    t: usize,
    stop: &AtomicBool,
) -> Result<Vec<u32>> {
    let mut slot = Slot::new(t, o.io_bytes);
    let mut lats = Vec::new();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let (oi, off) = slot.next_io(lay, o.io_bytes, i);
        let t0 = Instant::now();
        if o.read {
            let got = store.read_bytes(&coll(t), &obj(t, oi), off, o.io_bytes)?;
            debug_assert_eq!(got.len() as u64, o.io_bytes);
        } else {
            slot.write_at(store, oi, off)?.wait()?;
        }
        if lats.len() < MAX_SAMPLES_PER_THREAD {
            lats.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
        }
        i += 1;
    }
    Ok(lats)
}
