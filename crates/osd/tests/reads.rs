//! The replicated read path end to end: big reads run off the PG's task in
//! parallel with each other and with writes to other objects, never see a
//! write that is not acknowledged or half of one, and repeated whole-object
//! reads come from the OSD's data cache (3 OSDs, size 3, real stores).

mod common;

use bytes::Bytes;
use common::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// 1 MiB whose every 8-byte word is `generation`: a mix of two writes
/// shows as two different words.
fn generation_data(generation: u64) -> Bytes {
    let mut v = Vec::with_capacity(1 << 20);
    while v.len() < 1 << 20 {
        v.extend_from_slice(&generation.to_le_bytes());
    }
    Bytes::from(v)
}

fn generation_of(data: &[u8]) -> u64 {
    assert_eq!(data.len(), 1 << 20, "short read");
    let first = u64::from_le_bytes(data[..8].try_into().expect("8 bytes"));
    for (i, w) in data.chunks_exact(8).enumerate() {
        let g = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        assert_eq!(
            g, first,
            "word {i} is from write {g}, word 0 from write {first}"
        );
    }
    first
}

fn cache_totals(c: &Cluster) -> cairn_osd::CacheStats {
    let mut t = cairn_osd::CacheStats::default();
    for osd in c.osds.values().flatten() {
        let s = osd.cache_stats();
        t.hits += s.hits;
        t.misses += s.misses;
        t.inserts += s.inserts;
        t.invalidations += s.invalidations;
        t.bad_checksums += s.bad_checksums;
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_see_only_whole_acknowledged_writes_and_repeats_hit_the_cache() {
    let c = Cluster::start(3, 1, 8, 1 << 30).await;
    let io = c.client().ioctx("rbd").expect("pool");
    io.write_full("hot", generation_data(0))
        .await
        .expect("first write");
    // One writer replaces "hot" again and again; `acked` is the newest
    // generation acknowledged, `started` the newest sent.
    let acked = Arc::new(AtomicU64::new(0));
    let started = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(3);
    let writer = {
        let (io, acked, started) = (io.clone(), acked.clone(), started.clone());
        tokio::spawn(async move {
            let mut g = 0;
            while Instant::now() < until {
                g += 1;
                started.store(g, Ordering::SeqCst);
                io.write_full("hot", generation_data(g))
                    .await
                    .expect("write");
                acked.store(g, Ordering::SeqCst);
            }
            g
        })
    };
    let mut readers = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (io, acked, started) = (io.clone(), acked.clone(), started.clone());
        readers.spawn(async move {
            let mut reads = 0u64;
            let mut last = 0;
            while Instant::now() < until {
                let floor = acked.load(Ordering::SeqCst);
                let got = generation_of(&io.read_bytes("hot", 0, 0).await.expect("read"));
                let ceiling = started.load(Ordering::SeqCst);
                assert!(
                    got >= floor && got <= ceiling,
                    "read generation {got}: acknowledged before the read {floor}, sent by its end {ceiling}"
                );
                assert!(got >= last, "a later read went back from {last} to {got}");
                last = got;
                reads += 1;
            }
            reads
        });
    }
    let writes = writer.await.expect("writer");
    let mut reads = 0;
    while let Some(r) = readers.join_next().await {
        reads += r.expect("reader");
    }
    eprintln!("{writes} writes and {reads} reads of one object in 3 s");
    assert!(writes > 1 && reads > 4, "{writes} writes, {reads} reads");
    // Reads of the same object between writes came from the cache, and
    // every write dropped the cached copy (the generations above prove no
    // stale copy was served).
    let s = cache_totals(&c);
    eprintln!("cache after the mixed load: {s:?}");
    assert_eq!(s.bad_checksums, 0);
    // Objects read once each fill the cache (it has room); read again they
    // are hits, byte-exact.
    for i in 0..8u64 {
        io.write_full(&format!("warm-{i}"), pattern(i, 1 << 20))
            .await
            .expect("write");
    }
    let before = cache_totals(&c);
    for round in 0..2 {
        for i in 0..8u64 {
            let got = io
                .read_bytes(&format!("warm-{i}"), 0, 0)
                .await
                .expect("read");
            assert!(got == pattern(i, 1 << 20), "warm-{i} round {round}");
            // A range of a cached object is a slice of it.
            let part = io
                .read_bytes(&format!("warm-{i}"), 100_000, 200_000)
                .await
                .expect("range read");
            assert!(
                part == pattern(i, 1 << 20)[100_000..300_000],
                "warm-{i} range"
            );
        }
    }
    let after = cache_totals(&c);
    assert!(
        after.hits >= before.hits + 16,
        "expected the second round and the ranges to hit: {before:?} -> {after:?}"
    );
    // A write replaces a cached object: the next read has the new bytes.
    io.write_full("warm-0", pattern(99, 1 << 20))
        .await
        .expect("overwrite");
    let got = io.read_bytes("warm-0", 0, 0).await.expect("read");
    assert!(got == pattern(99, 1 << 20), "read after overwrite");
}
