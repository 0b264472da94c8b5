//! Free-space policy of the data file: freed blocks stay written unless
//! discard is asked for, and the background zeroing turns never-written
//! (unwritten-extent) free space into written blocks without ever touching
//! a block that holds data — also while writers allocate and free blocks
//! around it.

use bytes::Bytes;
use cairn_store::device::{OsFile, StoreFile};
use cairn_store::*;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn cfg(dir: &Path, mib: u64) -> StoreConfig {
    let mut c = StoreConfig::new(dir);
    c.data_bytes = mib << 20;
    c.cache_bytes = 8 << 20;
    c.meta_reserve_bytes = 0;
    c.wal_bytes = 4 << 20;
    c.zero_unwritten = true;
    c
}

/// Unwritten ranges of the data file, or None where the filesystem cannot say.
fn unwritten(dir: &Path) -> Option<Vec<(u64, u64)>> {
    let f = OsFile::open(&dir.join(DATA_FILE), false).unwrap();
    let len = f.len().unwrap();
    f.unwritten_ranges(0, len, usize::MAX).unwrap()
}

fn wait_finished(s: &Store) -> ZeroingStats {
    let t0 = Instant::now();
    loop {
        let st = s.zeroing_stats();
        if st.finished {
            return st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "zeroing did not finish within 60 s: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pattern(seed: u64, n: usize) -> Bytes {
    let mut v = vec![0u8; n];
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for b in v.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    Bytes::from(v)
}

#[test]
fn idle_store_zeroes_its_unwritten_free_space_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path(), 32);
    c.zero_idle_ms = 0;
    let s = Store::create(c.clone()).unwrap();
    let Some(before) = unwritten(dir.path()) else {
        eprintln!(
            "skipped: the filesystem under {} has no FIEMAP",
            dir.path().display()
        );
        return;
    };
    let st = wait_finished(&s);
    let unwritten_before: u64 = before.iter().map(|r| r.1).sum();
    assert!(
        unwritten_before > 16 << 20,
        "mkfs left {before:?} unwritten"
    );
    assert!(
        st.zeroed_bytes >= unwritten_before.saturating_sub(1 << 20),
        "zeroed {} of {unwritten_before} unwritten bytes",
        st.zeroed_bytes
    );
    assert_eq!(
        unwritten(dir.path()).unwrap(),
        vec![],
        "unwritten space left"
    );
    // Space accounting is unchanged: nothing is allocated by zeroing.
    assert_eq!(s.statfs().unwrap().used_bytes, 0);
    drop(s);
    // A reopened store has nothing left to zero.
    let s = Store::open(c).unwrap();
    assert_eq!(wait_finished(&s).zeroed_bytes, 0);
}

#[test]
fn zeroing_waits_for_an_idle_store_and_can_be_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path(), 16);
    c.zero_idle_ms = 60_000;
    let s = Store::create(c.clone()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let st = s.zeroing_stats();
    assert_eq!(st.zeroed_bytes, 0, "zeroed while not idle: {st:?}");
    assert!(!st.finished);
    drop(s); // stops the waiting thread promptly
    c.zero_unwritten = false;
    c.zero_idle_ms = 0;
    let s = Store::open(c).unwrap();
    let st = s.zeroing_stats();
    assert!(st.finished && st.zeroed_bytes == 0, "{st:?}");
}

#[test]
fn freed_blocks_stay_written_unless_discard_is_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path(), 32);
    c.zero_unwritten = false;
    let block = dir.path().join(DATA_FILE);
    let s = Store::create(c).unwrap();
    let col = CollectionId::pg(1, 1);
    let o = ObjectId::new(1, "o");
    let mut t = Transaction::new();
    t.create_collection(col);
    t.write(col, o.clone(), 0, pattern(1, 8 << 20));
    s.commit(t).unwrap();
    s.checkpoint().unwrap();
    let on_disk = std::fs::metadata(&block).unwrap().blocks() * 512;
    let used = s.statfs().unwrap().used_bytes;
    let mut t = Transaction::new();
    t.remove(col, o.clone());
    s.commit(t).unwrap();
    s.checkpoint().unwrap();
    // statfs shows the space free; the data file keeps it (no punch).
    assert_eq!(used - s.statfs().unwrap().used_bytes, 8 << 20);
    assert_eq!(std::fs::metadata(&block).unwrap().blocks() * 512, on_disk);
}

/// Writers allocate, overwrite and remove objects (large in-place writes
/// and small deferred ones) while the zeroing runs with no idle wait; every
/// acknowledged byte reads back, before and after reopen.
#[test]
fn zeroing_never_touches_blocks_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path(), 256);
    c.zero_idle_ms = 0;
    let s = Arc::new(Store::create(c.clone()).unwrap());
    if unwritten(dir.path()).is_none() {
        eprintln!(
            "skipped: the filesystem under {} has no FIEMAP",
            dir.path().display()
        );
        return;
    }
    let col = CollectionId::pg(1, 1);
    let mut t = Transaction::new();
    t.create_collection(col);
    s.commit(t).unwrap();
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut last = std::collections::BTreeMap::new();
                for round in 0..40u64 {
                    let i = round % 6;
                    let o = ObjectId::new((w * 100 + i) as u32, format!("w{w}-{i}"));
                    let seed = w * 1000 + round;
                    let mut t = Transaction::new();
                    if round % 7 == 6 {
                        t.remove(col, o.clone());
                        last.remove(&i);
                    } else if round % 3 == 2 && last.contains_key(&i) {
                        // a small overwrite inside the object (deferred path)
                        t.write(col, o.clone(), 8192, pattern(seed, 4096));
                        let (s0, mut v): (u64, Vec<u8>) = last.remove(&i).unwrap();
                        v[8192..12288].copy_from_slice(&pattern(seed, 4096));
                        last.insert(i, (s0, v));
                    } else {
                        let len = (1 + (seed % 3) as usize) << 20;
                        let data = pattern(seed, len);
                        t.truncate(col, o.clone(), 0);
                        t.write(col, o.clone(), 0, data.clone());
                        last.insert(i, (seed, data.to_vec()));
                    }
                    s.commit(t).unwrap();
                }
                (w, last)
            })
        })
        .collect();
    let results: Vec<_> = writers.into_iter().map(|h| h.join().unwrap()).collect();
    let verify = |s: &Store| {
        for (w, last) in &results {
            for (i, (_, v)) in last {
                let o = ObjectId::new((w * 100 + i) as u32, format!("w{w}-{i}"));
                let got = s.read(&col, &o, 0, v.len() as u64).unwrap();
                assert!(got == *v, "object {o} differs after zeroing");
            }
        }
    };
    verify(&s);
    let st = wait_finished(&s);
    assert!(st.zeroed_bytes > 0, "{st:?}");
    verify(&s);
    drop(Arc::into_inner(s).expect("writers are done"));
    let s = Store::open(c).unwrap();
    verify(&s);
    assert!(s.deep_fsck().unwrap().is_clean());
}
