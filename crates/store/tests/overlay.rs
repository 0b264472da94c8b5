//! Reads served from the in-memory overlay (groups in the WAL whose metadata
//! is not in redb yet), merged with redb after checkpoints, and overlay
//! pruning while readers run. Crash between the WAL sync and the metadata
//! apply: `sim_faults.rs` (power cut before any checkpoint) and `crash.rs`
//! (SIGKILL at random points, replay).

mod common;

use bytes::Bytes;
use cairn_store::*;
use common::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn cfg(dir: &std::path::Path, checkpoint_interval_ms: u64) -> StoreConfig {
    let mut c = StoreConfig::new(dir);
    c.data_bytes = 256 << 20;
    c.cache_bytes = 16 << 20;
    c.meta_reserve_bytes = 0;
    // Large enough that no quarter-full checkpoint happens on its own.
    c.wal_bytes = 64 << 20;
    c.checkpoint_interval_ms = checkpoint_interval_ms;
    c
}

/// With background checkpoints off, every read of the model workload is
/// served from the overlay over an (almost) empty redb; explicit
/// checkpoints in the middle move it to redb, and later groups' updates and
/// deletions are overlay entries over redb values. Reopen replays nothing.
#[test]
fn overlay_reads_match_the_model_before_and_after_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let seed = 7;
    let mut models = [Model::default(), Model::default()];
    {
        let s = Store::create(cfg(dir.path(), 3_600_000)).unwrap();
        let mut t = Transaction::new();
        t.create_collection(coll(0)).create_collection(coll(1));
        s.commit(t).unwrap();
        for i in 1..=120u64 {
            for (w, m) in models.iter_mut().enumerate() {
                let ops = gen(seed, w, i, m);
                s.commit(to_txn(coll(w), &ops)).unwrap();
                apply(m, &ops);
                m.idx = i;
            }
            if i % 15 == 0 {
                for (w, m) in models.iter().enumerate() {
                    check(&s, w, m);
                    assert_eq!(last_applied(&s, w), i);
                }
            }
            if i == 45 || i == 90 {
                s.checkpoint().unwrap();
                for (w, m) in models.iter().enumerate() {
                    check(&s, w, m);
                }
            }
        }
        assert_eq!(s.list_collections().unwrap().len(), 2);
        let objects: usize = models.iter().map(|m| m.objs.len()).sum();
        assert_eq!(s.object_count().unwrap(), objects as u64);
    }
    let s = Store::open(cfg(dir.path(), 3_600_000)).unwrap();
    for (w, m) in models.iter().enumerate() {
        check(&s, w, m);
    }
    assert!(s.deep_fsck().unwrap().is_clean());
}

/// Readers never see an acknowledged update go missing while checkpoints
/// (every millisecond) apply groups to redb and prune the overlay under them.
#[test]
fn readers_stay_consistent_while_checkpoints_prune_the_overlay() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(Store::create(cfg(dir.path(), 1)).unwrap());
    let c = coll(0);
    let o = oid("counter");
    let mut t = Transaction::new();
    t.create_collection(c).touch(c, o.clone());
    s.commit(t).unwrap();
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (s, acked, stop, o) = (s.clone(), acked.clone(), stop.clone(), o.clone());
            std::thread::spawn(move || {
                let mut reads = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let a = acked.load(Ordering::SeqCst);
                    let value = || {
                        s.getattr(&c, &o, "v")
                            .unwrap()
                            .map_or(0, |v| u64::from_le_bytes(v.as_slice().try_into().unwrap()))
                    };
                    let v = value();
                    assert!(v >= a, "acknowledged value {a} but read {v}");
                    if a > 0 {
                        let key = a.to_be_bytes();
                        let got = s.omap_get(&c, &o, &[key.as_slice()]).unwrap();
                        let blk = s.read(&c, &o, (a % 16) * 4096, 4096).unwrap();
                        let n = s.omap_keys(&c, &o, None, usize::MAX).unwrap().len() as u64;
                        // Later writes may have replaced the block or
                        // dropped the key meanwhile, never older states.
                        let later = value();
                        assert!(later >= v, "value went back from {v} to {later}");
                        assert!(
                            got.len() == 1 || later >= a + 64,
                            "omap key {a} missing (value {later})"
                        );
                        let b = blk[0] as u64;
                        assert!(
                            b == a % 251 || later >= a + 16,
                            "block of {a} holds {b} (value {later})"
                        );
                        assert!(n >= a.min(64), "{n} omap keys after {a}");
                    }
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut i = 0u64;
    while Instant::now() < deadline && i < 3000 {
        i += 1;
        let mut t = Transaction::new();
        t.setattr(c, o.clone(), "v", Bytes::from(i.to_le_bytes().to_vec()))
            .omap_set(
                c,
                o.clone(),
                vec![(
                    Bytes::from(i.to_be_bytes().to_vec()),
                    Bytes::from_static(b"x"),
                )],
            )
            .write(
                c,
                o.clone(),
                (i % 16) * 4096,
                Bytes::from(vec![(i % 251) as u8; 4096]),
            );
        // Keep the omap bounded: drop keys far behind.
        if i > 64 {
            let old = (i - 64).to_be_bytes();
            t.omap_rm(c, o.clone(), vec![Bytes::from(old.to_vec())]);
        }
        s.commit(t).unwrap();
        acked.store(i, Ordering::SeqCst);
    }
    stop.store(true, Ordering::SeqCst);
    let reads: u64 = readers.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(i > 10 && reads > 10, "{i} writes, {reads} reads");
    assert!(s.fsck().unwrap().is_clean());
}

/// `log_trim_from` removes exactly `[from, upto]`, over entries in redb
/// (after a checkpoint) and in the overlay alike, and a later trim starting
/// where the last one ended finds nothing in between to walk past.
#[test]
fn log_trim_from_removes_its_range_only() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::create(cfg(dir.path(), 3_600_000)).unwrap();
    let c = coll(0);
    let mut t = Transaction::new();
    t.create_collection(c);
    for i in 1..=10u64 {
        t.log_append(c, i, Bytes::from(format!("e{i}")));
    }
    s.commit(t).unwrap();
    s.checkpoint().unwrap();
    let mut t = Transaction::new();
    for i in 11..=20u64 {
        t.log_append(c, i, Bytes::from(format!("e{i}")));
    }
    t.log_trim_from(c, 5, 7);
    s.commit(t).unwrap();
    let idx = |s: &Store| -> Vec<u64> {
        let v = s.log_range(&c, 0, 100).unwrap();
        v.into_iter().map(|(i, _)| i).collect()
    };
    let mut want: Vec<u64> = (1..=4).chain(8..=20).collect();
    assert_eq!(idx(&s), want);
    // Across the checkpointed and the overlay entries, then one range that
    // is empty and one that starts above its end.
    let mut t = Transaction::new();
    t.log_trim_from(c, 8, 14)
        .log_trim_from(c, 5, 7)
        .log_trim_from(c, 16, 15);
    s.commit(t).unwrap();
    want.retain(|i| !(8..=14).contains(i));
    assert_eq!(idx(&s), want);
    s.checkpoint().unwrap();
    assert_eq!(idx(&s), want);
    let mut t = Transaction::new();
    t.log_trim(c, 16);
    s.commit(t).unwrap();
    assert_eq!(idx(&s), (17..=20).collect::<Vec<u64>>());
    drop(s);
    let s = Store::open(cfg(dir.path(), 3_600_000)).unwrap();
    assert_eq!(idx(&s), (17..=20).collect::<Vec<u64>>());
}
