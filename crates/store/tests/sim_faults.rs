//! Simulated-device faults: the data file, the metadata engine and the WAL
//! all run on `SimFile`s. We inject EIO / ENOSPC at a chosen operation and
//! simulate power cuts (unsynced writes dropped, one torn at a sector boundary) —
//! including a torn WAL record, a cut between the WAL sync and the next
//! checkpoint, and a crash in the middle of a checkpoint — then reopen from
//! the durable image and check that every acknowledged transaction is
//! present and none is partly visible.

mod common;

use cairn_store::sim::{Fault, FaultPlan, SimFile};
use cairn_store::{Store, StoreConfig, StoreError, StoreFiles, Transaction};
use common::*;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

fn cfg() -> StoreConfig {
    let mut c = StoreConfig::new("/nonexistent-sim-store");
    c.data_bytes = 16 << 20;
    c.cache_bytes = 4 << 20;
    // A small log: records over 64 KiB take the direct (checkpointing) path,
    // and the half-full trigger checkpoints often.
    c.wal_bytes = 256 << 10;
    c
}

/// The three simulated files of one store.
struct SimDisk {
    data: Arc<SimFile>,
    meta: Arc<SimFile>,
    wal: Arc<SimFile>,
}

impl SimDisk {
    /// The metadata file is written through a (simulated) page cache, as
    /// redb's file is; the data file and the WAL take each write as an I/O.
    fn new(plan: &Arc<FaultPlan>) -> SimDisk {
        SimDisk {
            data: SimFile::new(plan.clone()),
            meta: SimFile::new_buffered(plan.clone()),
            wal: SimFile::new(plan.clone()),
        }
    }
    /// What a power cut would choose from in each file (data, meta, WAL).
    fn unsynced(&self) -> [Vec<(u64, usize)>; 3] {
        [&self.data, &self.meta, &self.wal].map(|f| f.unsynced_extents().expect("sim file"))
    }
    fn files(&self) -> StoreFiles {
        StoreFiles {
            data: self.data.clone(),
            meta: self.meta.clone(),
            wal: self.wal.clone(),
        }
    }
    /// Power cut on all three files at one instant (each keeps a random
    /// subset of its unsynced writes).
    fn power_cut(&self, rng: &mut impl Rng, plan: &Arc<FaultPlan>) -> SimDisk {
        let _frozen = plan.pause_io();
        SimDisk {
            data: self
                .data
                .power_cut(rng.gen(), plan.clone())
                .expect("cut data"),
            meta: self
                .meta
                .power_cut(rng.gen(), plan.clone())
                .expect("cut meta"),
            wal: self
                .wal
                .power_cut(rng.gen(), plan.clone())
                .expect("cut wal"),
        }
    }
}

/// The base seed of a seeded test: `CAIRN_STORE_SIM_SEED` when set (to
/// replay a failure exactly), else random. Printed, so a failing run's
/// captured output names it.
fn base_seed(test: &str) -> u64 {
    let base = std::env::var("CAIRN_STORE_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("{test}: base seed {base} (set CAIRN_STORE_SIM_SEED={base} to replay)");
    base
}

fn injected(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Io { .. }
            | StoreError::StoreFull { .. }
            | StoreError::Poisoned(_)
            | StoreError::Kv(_)
    )
}

/// The cut metadata file's length and redb header fields (god byte, page
/// size, region layout), for a reopen that panicked inside redb.
fn describe_meta(meta: &SimFile) -> String {
    use cairn_store::device::StoreFile;
    let mut h = [0u8; 32];
    if let Err(e) = meta.read_at(&mut h, 0) {
        return format!("header unreadable: {e}");
    }
    let u32_at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().unwrap());
    format!(
        "{:?} bytes, god byte {:#x}, page {} B, region header pages {}, region max data pages {}, full regions {}, trailing region pages {}",
        meta.len(),
        h[9],
        u32_at(12),
        u32_at(16),
        u32_at(20),
        u32_at(24),
        u32_at(28)
    )
}

/// Reopens a cut disk and checks: the store holds a transaction in
/// `[acked, acked + maybe]`, exactly as the model says, deep fsck is clean,
/// and it takes a new commit. Returns the store and its model.
fn reopen_and_verify(
    what: &str,
    cfg: StoreConfig,
    disk: &SimDisk,
    seed: u64,
    acked: u64,
    maybe: u64,
) -> (Store, Model) {
    let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Store::open_on(cfg.clone(), disk.files())
    }));
    let s = match opened {
        Ok(r) => r.unwrap_or_else(|e| panic!("{what} seed {seed}: reopen failed: {e}")),
        Err(_) => panic!(
            "{what} seed {seed}: reopen panicked; metadata file as cut: {}",
            describe_meta(&disk.meta)
        ),
    };
    let last = last_applied(&s, 0);
    assert!(
        last >= acked && last <= acked + maybe,
        "{what} seed {seed}: store has txn {last}, acknowledged {acked}"
    );
    let mut model = Model::default();
    advance(seed, 0, &mut model, last);
    check(&s, 0, &model);
    let rep = s.deep_fsck().expect("deep fsck");
    assert!(rep.is_clean(), "{what} seed {seed}: {:?}", rep.issues);
    let ops = gen(seed, 0, last + 1, &model);
    s.commit(to_txn(coll(0), &ops))
        .unwrap_or_else(|e| panic!("{what} seed {seed}: commit after reopen: {e}"));
    apply(&mut model, &ops);
    model.idx = last + 1;
    (s, model)
}

/// A fresh simulated store with collection 0 and `n` committed workload transactions.
fn store_with(
    cfg: StoreConfig,
    plan: &Arc<FaultPlan>,
    seed: u64,
    n: u64,
) -> (SimDisk, Store, Model) {
    let disk = SimDisk::new(plan);
    let s = Store::create_on(cfg, disk.files()).expect("mkfs on sim");
    let mut t = Transaction::new();
    t.create_collection(coll(0));
    s.commit(t).expect("mkcoll");
    let mut m = Model::default();
    for _ in 0..n {
        let ops = gen(seed, 0, m.idx + 1, &m);
        s.commit(to_txn(coll(0), &ops))
            .expect("commit before fault");
        apply(&mut m, &ops);
        m.idx += 1;
    }
    (disk, s, m)
}

/// One scenario: run, inject a fault (maybe inside a checkpoint), keep going
/// a little, cut power, reopen, verify.
fn scenario(seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let plan = FaultPlan::new();
    let mut c = cfg();
    // Sometimes checkpoint after nearly every group, sometimes never on a timer.
    c.checkpoint_interval_ms = if rng.gen_bool(0.3) { 1 } else { 3_600_000 };
    let (disk, s, mut m) = store_with(c.clone(), &plan, seed, rng.gen_range(0..20));
    let fault = match rng.gen_range(0..3) {
        0 => Some(Fault::Eio),
        1 => Some(Fault::Enospc),
        _ => None, // power cut only
    };
    if let Some(f) = fault {
        plan.fail_after(rng.gen_range(0..60), f);
    }
    let mut acked = m.idx;
    let mut failed = 0;
    for _ in 0..rng.gen_range(1..15) {
        if rng.gen_bool(0.15) {
            // An explicit checkpoint; a fault inside it poisons the store.
            if let Err(e) = s.checkpoint() {
                assert!(injected(&e), "seed {seed}: unexpected checkpoint error {e}");
                break;
            }
        }
        let ops = gen(seed, 0, m.idx + 1, &m);
        match s.commit(to_txn(coll(0), &ops)) {
            Ok(()) => {
                apply(&mut m, &ops);
                m.idx += 1;
                acked = m.idx;
            }
            Err(e) => {
                // The failure is reported, is one of the injected kinds, and we stop here
                // (the in-flight transaction may or may not have reached the disk).
                assert!(injected(&e), "seed {seed}: unexpected error {e}");
                failed += 1;
                break;
            }
        }
    }
    // Power cut while the store is still running (nothing flushed at close).
    let cut = disk.power_cut(&mut rng, &plan);
    plan.clear();
    drop(s);
    reopen_and_verify("scenario", c, &cut, seed, acked, failed);
}

#[test]
fn faults_and_power_cuts_reopen_consistent() {
    let soak = std::env::var("CAIRN_SOAK").is_ok_and(|v| v == "1");
    let n = if soak { 2000 } else { 40 };
    let base = base_seed("faults_and_power_cuts_reopen_consistent");
    for i in 0..n {
        println!("scenario seed {}", base.wrapping_add(i));
        scenario(base.wrapping_add(i));
    }
}

#[test]
fn eio_on_data_write_fails_only_that_batch() {
    let plan = FaultPlan::new();
    let disk = SimDisk::new(&plan);
    let s = Store::create_on(cfg(), disk.files()).expect("mkfs");
    let c = coll(0);
    let o = oid("x");
    let mut t = Transaction::new();
    t.create_collection(c);
    s.commit(t).expect("mkcoll");
    plan.fail_after(0, Fault::Eio);
    let mut t = Transaction::new();
    t.write(c, o.clone(), 0, vec![1u8; 8192]);
    let e = s.commit(t).expect_err("EIO must surface");
    assert!(e.to_string().contains("I/O error"), "{e}");
    // The store is still usable and the failed write left nothing behind.
    assert!(!s.exists(&c, &o).expect("exists"));
    let mut t = Transaction::new();
    t.write(c, o.clone(), 0, vec![2u8; 8192]);
    s.commit(t).expect("commit after transient EIO");
    assert_eq!(s.read(&c, &o, 0, 8192).expect("read"), vec![2u8; 8192]);
    plan.fail_after(0, Fault::Enospc);
    let mut t = Transaction::new();
    t.write(c, o.clone(), 0, vec![3u8; 100]);
    assert!(s.commit(t).expect_err("ENOSPC").is_full());
    assert!(s.deep_fsck().expect("fsck").is_clean());
}

/// Every acknowledged transaction sits only in the WAL (no checkpoint ran):
/// a power cut drops the lazily applied metadata and data-file writes, and
/// replay must bring every one of them back.
#[test]
fn power_cut_between_wal_sync_and_checkpoint_loses_nothing() {
    let base = base_seed("power_cut_between_wal_sync_and_checkpoint_loses_nothing");
    for i in 0..6u64 {
        let seed = base.wrapping_add(i);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let plan = FaultPlan::new();
        let mut c = cfg();
        c.wal_bytes = 8 << 20; // room for every record: no checkpoint at all
        c.checkpoint_interval_ms = 3_600_000;
        let (disk, s, m) = store_with(c.clone(), &plan, seed, 25);
        let cut = disk.power_cut(&mut rng, &plan);
        drop(s);
        let (s, m2) = reopen_and_verify("wal-only", c.clone(), &cut, seed, m.idx, 0);
        // Replay checkpointed: a second cut right away changes nothing.
        let cut2 = cut.power_cut(&mut rng, &plan);
        drop(s);
        reopen_and_verify("after replay", c, &cut2, seed, m2.idx, 0);
    }
}

/// The WAL append of a group fails (EIO at its write or its sync, or at the
/// data write before it); the power cut then keeps, drops or tears that
/// record. The transaction is either wholly there or wholly absent.
#[test]
fn torn_or_failed_wal_record_is_all_or_nothing() {
    let base = base_seed("torn_or_failed_wal_record_is_all_or_nothing");
    for k in 0..8u64 {
        for cut_seed in 0..3u64 {
            let seed = base.wrapping_add(k * 16 + cut_seed);
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let plan = FaultPlan::new();
            let mut c = cfg();
            c.wal_bytes = 8 << 20;
            c.checkpoint_interval_ms = 3_600_000;
            let (disk, s, m) = store_with(c.clone(), &plan, seed, 10);
            plan.fail_after(k, Fault::Eio);
            let ops = gen(seed, 0, m.idx + 1, &m);
            let failed = u64::from(s.commit(to_txn(coll(0), &ops)).is_err());
            let cut = disk.power_cut(&mut rng, &plan);
            plan.clear();
            drop(s);
            reopen_and_verify("torn wal", c, &cut, seed, m.idx + 1 - failed, failed);
        }
    }
}

/// What one run of a checkpoint crash did: the operations counted, whether
/// the checkpoint failed, and the unsynced writes of each file at the cut.
type CrashTrace = (u64, bool, [Vec<(u64, usize)>; 3]);

/// EIO at the `k`-th operation of a checkpoint, a power cut, reopen, verify.
fn checkpoint_crash(seed: u64, k: u64) -> CrashTrace {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let plan = FaultPlan::new();
    let mut c = cfg();
    c.wal_bytes = 8 << 20;
    c.checkpoint_interval_ms = 3_600_000;
    let (disk, s, m) = store_with(c.clone(), &plan, seed, 15);
    plan.fail_after(k, Fault::Eio);
    let r = s.checkpoint();
    if let Err(e) = &r {
        assert!(injected(e), "seed {seed}: unexpected checkpoint error {e}");
    }
    let trace = (plan.ops(), r.is_err(), disk.unsynced());
    let cut = disk.power_cut(&mut rng, &plan);
    plan.clear();
    drop(s);
    reopen_and_verify("checkpoint crash", c, &cut, seed, m.idx, 0);
    trace
}

/// A fault at each step of a checkpoint (data sync, metadata commit), then a
/// power cut: everything acknowledged before is still there after reopen.
#[test]
fn crash_during_checkpoint_loses_nothing() {
    let base = base_seed("crash_during_checkpoint_loses_nothing");
    for k in 0..10u64 {
        checkpoint_crash(base.wrapping_add(k), k);
    }
}

/// A seed replays exactly: the same operations, the same failure and the
/// same unsynced writes for the cut to choose from (redb hands a commit's
/// pages over in a randomly seeded hash map's order; the simulated page
/// cache of the metadata file writes them back in offset order).
#[test]
fn a_checkpoint_crash_seed_replays_exactly() {
    let base = base_seed("a_checkpoint_crash_seed_replays_exactly");
    for k in [2u64, 5, 7, 9] {
        let seed = base.wrapping_add(k);
        let first = checkpoint_crash(seed, k);
        let again = checkpoint_crash(seed, k);
        assert_eq!(
            first, again,
            "seed {seed}, fault at op {k}: the replay differed"
        );
    }
}

/// The (offset, sequence) of every record header in the WAL file.
fn wal_records(wal: &SimFile, wal_bytes: u64) -> Vec<(u64, u64)> {
    use cairn_store::device::StoreFile;
    let mut out = Vec::new();
    let mut head = [0u8; 16];
    for off in (0..wal_bytes).step_by(4096) {
        wal.read_at(&mut head, off).expect("read WAL");
        if &head[..4] == b"CWAL" {
            out.push((off, u64::from_le_bytes(head[8..16].try_into().unwrap())));
        }
    }
    out
}

/// Two records A then B are durable; A then tears (its bytes are damaged),
/// so reopening drops both. The next record, C, lands where A was and has
/// A's length. If C carried A's sequence number, a crash before the record
/// after C would make the scan take the leftover B as C's successor and
/// bring back a transaction the store had already dropped.
#[test]
fn a_leftover_record_after_a_torn_one_is_never_replayed() {
    let plan = FaultPlan::new();
    let mut c = cfg();
    c.wal_bytes = 8 << 20;
    c.checkpoint_interval_ms = 3_600_000;
    let disk = SimDisk::new(&plan);
    let s = Store::create_on(c.clone(), disk.files()).expect("mkfs on sim");
    let mut t = Transaction::new();
    t.create_collection(coll(0));
    s.commit(t).expect("mkcoll");
    // A is the first record the next open has to replay.
    s.checkpoint().expect("checkpoint");
    for name in ["a", "b"] {
        let mut t = Transaction::new();
        t.write(coll(0), oid(name), 0, vec![7u8; 100]);
        s.commit(t).expect("commit");
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let cut = disk.power_cut(&mut rng, &plan);
    drop(s);
    let recs = wal_records(&cut.wal, c.wal_bytes);
    let [.., (a_off, a_seq), (_, b_seq)] = recs[..] else {
        panic!("expected at least two WAL records, found {recs:?}");
    };
    assert_eq!(b_seq, a_seq + 1, "records {recs:?}");
    cut.wal.corrupt(a_off + 100, 8).expect("tear A");

    let s = Store::open_on(c.clone(), cut.files()).expect("reopen after tear");
    for name in ["a", "b"] {
        assert!(
            !s.exists(&coll(0), &oid(name)).unwrap(),
            "{name} survived its torn record"
        );
    }
    let mut t = Transaction::new();
    t.write(coll(0), oid("c"), 0, vec![9u8; 100]);
    s.commit(t).expect("commit C");
    let cut2 = cut.power_cut(&mut rng, &plan);
    drop(s);

    let s = Store::open_on(c, cut2.files()).expect("reopen after C");
    assert!(
        s.exists(&coll(0), &oid("c")).unwrap(),
        "acknowledged C lost"
    );
    assert!(
        !s.exists(&coll(0), &oid("b")).unwrap(),
        "the leftover record of B was replayed after C"
    );
    assert!(s.deep_fsck().expect("deep fsck").is_clean());
}

/// Several writers at once (one collection each), so several WAL records
/// are in flight and the WAL threads write them in parallel: a later record
/// may reach the disk before an earlier one, and a sync covers only records
/// written before it began. A power cut at a random instant; after reopen
/// every transaction acknowledged before the cut is there, each collection
/// holds a gap-free prefix of its writer's transactions (exact model
/// check: nothing after a missing one, nothing partly), and deep fsck is
/// clean.
#[test]
fn concurrent_writers_then_power_cut_lose_nothing_acknowledged() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const WRITERS: usize = 6;
    let soak = std::env::var("CAIRN_SOAK").is_ok_and(|v| v == "1");
    let rounds = if soak { 300 } else { 12 };
    // The seed replays the choices; thread timing still varies.
    let base = base_seed("concurrent_writers_then_power_cut_lose_nothing_acknowledged");
    for round in 0..rounds {
        let seed = base.wrapping_add(round);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let plan = FaultPlan::new();
        let mut c = cfg();
        c.checkpoint_interval_ms = if rng.gen_bool(0.5) { 1 } else { 3_600_000 };
        let disk = SimDisk::new(&plan);
        let s = Arc::new(Store::create_on(c.clone(), disk.files()).expect("mkfs on sim"));
        let mut t = Transaction::new();
        for w in 0..WRITERS {
            t.create_collection(coll(w));
        }
        s.commit(t).expect("mkcoll");
        let acked: Arc<Vec<AtomicU64>> =
            Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (s, acked, stop) = (s.clone(), acked.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut m = Model::default();
                    while !stop.load(Ordering::SeqCst) {
                        let ops = gen(seed, w, m.idx + 1, &m);
                        if s.commit(to_txn(coll(w), &ops)).is_err() {
                            break;
                        }
                        apply(&mut m, &ops);
                        m.idx += 1;
                        acked[w].store(m.idx, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        let want: u64 = rng.gen_range(WRITERS as u64..80);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while acked.iter().map(|a| a.load(Ordering::SeqCst)).sum::<u64>() < want
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        // Acknowledged before the cut: must survive it.
        let before: Vec<u64> = acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
        let cut = disk.power_cut(&mut rng, &plan);
        stop.store(true, Ordering::SeqCst);
        for h in writers {
            h.join().expect("writer panicked");
        }
        // Each writer had at most one more in flight at the cut.
        let after: Vec<u64> = acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
        drop(s);
        let s = Store::open_on(c, cut.files())
            .unwrap_or_else(|e| panic!("seed {seed}: reopen failed: {e}"));
        for w in 0..WRITERS {
            let last = last_applied(&s, w);
            assert!(
                last >= before[w] && last <= after[w] + 1,
                "seed {seed}: writer {w} has txn {last}, acknowledged {} before the cut",
                before[w]
            );
            let mut m = Model::default();
            advance(seed, w, &mut m, last);
            check(&s, w, &m);
        }
        let rep = s.deep_fsck().expect("deep fsck");
        assert!(rep.is_clean(), "seed {seed}: {:?}", rep.issues);
    }
}
