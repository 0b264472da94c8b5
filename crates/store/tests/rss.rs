//! Memory bound: sustained small and large writes from many threads keep the
//! process RSS within store_cache_bytes + a fixed overhead (64 MiB).

use bytes::Bytes;
use cairn_store::bench::rss_bytes;
use cairn_store::{CollectionId, ObjectId, Store, StoreConfig, Transaction};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CACHE_BYTES: u64 = 32 << 20;
const OVERHEAD_BYTES: u64 = 64 << 20;

#[test]
fn sustained_writes_stay_within_budget() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = StoreConfig::new(dir.path());
    cfg.data_bytes = 1 << 30;
    cfg.cache_bytes = CACHE_BYTES;
    cfg.meta_reserve_bytes = 0;
    let base = rss_bytes();
    let s = Arc::new(Store::create(cfg).expect("create"));
    let c = CollectionId::pg(1, 0);
    let mut t = Transaction::new();
    t.create_collection(c);
    s.commit(t).expect("mkcoll");
    let secs = if std::env::var("CAIRN_SOAK").is_ok_and(|v| v == "1") {
        60
    } else {
        4
    };
    let deadline = Instant::now() + Duration::from_secs(secs);
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let hs: Vec<_> = (0..16u32)
        .map(|th| {
            let (s, peak) = (s.clone(), peak.clone());
            std::thread::spawn(move || {
                let small = Bytes::from(vec![th as u8; 4096]);
                let big = Bytes::from(vec![th as u8; 1 << 20]);
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let o = ObjectId::new(th, format!("o{th}.{}", i % 64));
                    let mut t = Transaction::new();
                    if th % 4 == 0 {
                        t.write(c, o, 0, big.clone());
                    } else {
                        t.write(c, o.clone(), (i % 256) * 4096, small.clone())
                            .omap_set(
                                c,
                                o,
                                vec![(Bytes::from(format!("k{i}")), Bytes::from_static(b"v"))],
                            );
                    }
                    s.commit(t).expect("commit");
                    peak.fetch_max(rss_bytes(), std::sync::atomic::Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    for h in hs {
        h.join().expect("writer");
    }
    let grown = peak
        .load(std::sync::atomic::Ordering::Relaxed)
        .saturating_sub(base);
    println!(
        "RSS grew by {} MiB (budget {} + {} MiB)",
        grown >> 20,
        CACHE_BYTES >> 20,
        OVERHEAD_BYTES >> 20
    );
    assert!(
        grown <= CACHE_BYTES + OVERHEAD_BYTES,
        "RSS grew by {grown} bytes"
    );
}
