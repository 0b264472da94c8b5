//! In-process throughput: 3 OSDs (3 hosts x 1) on disk-backed temp dirs,
//! size 3, like `rados bench write`: 4 MiB objects with 16 in flight and
//! 4 KiB objects with 64 in flight. Runs only with CAIRN_BENCH=1 (use
//! `--release`); prints MB/s, IOPS and latency.

mod common;

use common::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn bench(io: &cairn_client::IoCtx, label: &str, size: usize, threads: usize, secs: u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let lat_us = Arc::new(AtomicU64::new(0));
    let max_us = Arc::new(AtomicU64::new(0));
    let data = bytes::Bytes::from(pattern(1, size));
    let t0 = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for t in 0..threads {
        let (io, stop, ops, lat_us, max_us, data) = (
            io.clone(),
            stop.clone(),
            ops.clone(),
            lat_us.clone(),
            max_us.clone(),
            data.clone(),
        );
        let label = label.to_string();
        set.spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                io.write_full(&format!("bench_{label}_{t}_{i}"), data.clone())
                    .await
                    .expect("bench write");
                let us = started.elapsed().as_micros() as u64;
                lat_us.fetch_add(us, Ordering::Relaxed);
                max_us.fetch_max(us, Ordering::Relaxed);
                ops.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        });
    }
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    while set.join_next().await.is_some() {}
    let el = t0.elapsed().as_secs_f64();
    let n = ops.load(Ordering::Relaxed);
    println!(
        "{label}: {n} writes of {size} B in {el:.1}s, -t {threads}: {:.1} MB/s, {:.0} IOPS, avg lat {:.2} ms, max lat {:.1} ms",
        n as f64 * size as f64 / el / 1e6,
        n as f64 / el,
        lat_us.load(Ordering::Relaxed) as f64 / n.max(1) as f64 / 1000.0,
        max_us.load(Ordering::Relaxed) as f64 / 1000.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn write_throughput() {
    if std::env::var("CAIRN_BENCH")
        .map(|v| v != "1")
        .unwrap_or(true)
    {
        eprintln!("set CAIRN_BENCH=1 (and use --release) to run the throughput measurement");
        return;
    }
    let secs = std::env::var("CAIRN_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let c = Cluster::start(3, 1, 64, 8 << 30).await;
    let io = c.client().ioctx("rbd").expect("pool");
    bench(&io, "4m", 4 << 20, 16, secs).await;
    bench(&io, "4k", 4 << 10, 64, secs).await;
}
