//! An OSD whose own store fails to commit (EIO from the disk) stops itself
//! (fail-stop): `Osd::failed` says why, its heartbeat listener stops
//! answering, its peers' reports get it marked down, its PGs go active on
//! the others, writes go on, and every acknowledged write reads back.
//! One OSD runs on a simulated disk (`cairn_store::sim`) that fails the
//! next mutating operation on demand.

mod common;

use cairn_store::sim::{Fault, FaultPlan, SimFile};
use cairn_store::{Store, StoreFiles};
use common::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_osd_whose_disk_fails_a_commit_stops_and_its_peers_get_it_marked_down() {
    let config = vec![
        ("osd_heartbeat_interval", "1"),
        ("osd_heartbeat_grace", "3"),
        ("osd_beacon_report_interval", "1"),
    ];
    // 4 hosts x 1 OSD, size 3 / min_size 2: without the victim every PG
    // still has three members.
    let mut c = Cluster::start_with(4, 1, 8, 64 << 20, config, true).await;
    let victim = 0;

    // The victim restarts on a simulated disk (an empty store, like a
    // replaced disk: it is refilled by recovery).
    c.kill(victim).await;
    let plan = FaultPlan::new();
    let files = StoreFiles {
        data: SimFile::new(plan.clone()),
        meta: SimFile::new(plan.clone()),
        wal: SimFile::new(plan.clone()),
    };
    let store = Store::create_on(c.store_cfg(victim), files).expect("store on the simulated disk");
    c.boot(victim, store).await;
    c.wait_clean(Duration::from_secs(60)).await;

    let rados = c.client();
    let io = rados.ioctx("rbd").expect("ioctx");
    let acked: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let acks = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..4u64 {
        let (io, acked, acks, stop) = (io.clone(), acked.clone(), acks.clone(), stop.clone());
        writers.spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("fs-{w}-{}", i % 16);
                let seed = (w + 1) * 1_000_000 + i;
                io.write_full(&name, pattern(seed, 8192))
                    .await
                    .unwrap_or_else(|e| panic!("write {name}: {e}"));
                acked.lock().unwrap().insert(name, seed);
                acks.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        });
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The disk fails the next write or sync.
    plan.fail_after(0, Fault::Eio);
    let t0 = Instant::now();
    let why = loop {
        if let Some(why) = c.osds[&victim].as_ref().and_then(|o| o.failed()) {
            break why;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "osd.{victim} did not stop itself after its disk failed a commit"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!(
        "osd.{victim} stopped itself after {:?}: {why}",
        t0.elapsed()
    );
    assert!(why.contains("failed to commit"), "{why}");

    // Nobody told the monitors: the peers' heartbeats must.
    loop {
        if !c.current().osds[&victim].up {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "osd.{victim} stopped but was never marked down"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("osd.{victim} marked down {:?} after the EIO", t0.elapsed());
    c.wait_active(Duration::from_secs(30)).await;

    // Writes go on without it.
    let a0 = acks.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        acks.load(Ordering::Relaxed) > a0,
        "no write was acknowledged after osd.{victim} was marked down"
    );
    stop.store(true, Ordering::Relaxed);
    while let Some(r) = writers.join_next().await {
        r.expect("writer");
    }
    let acked = acked.lock().unwrap().clone();
    for (name, seed) in &acked {
        let got = io.read(name, 0, 0).await.expect("read");
        assert!(
            got == pattern(*seed, 8192),
            "{name} lost its acknowledged write"
        );
    }
    eprintln!("{} objects read back as last acknowledged", acked.len());
}
