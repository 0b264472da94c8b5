//! Scrub, deep-scrub and repair end to end with the in-process cluster:
//! a replica's object corrupted on disk (bytes flipped in its store's data
//! file) is found by deep-scrub, named in health, repaired and scrubs
//! clean; an object removed from a replica is found by a shallow scrub; a
//! corrupted chunk of an EC 2+1 object is found and rebuilt, and so are
//! damaged chunks of its snapshot clones (on-disk damage, and a coding
//! chunk whose parity is wrong); a client read
//! that hits a damaged primary copy queues a repair; and scrubs
//! under a concurrent write load report nothing.

mod common;

use cairn_map::{HealthInputs, MonCommand, PgScrubReport, ScrubKind};
use cairn_ops::ObjectName;
use cairn_store::{CollectionId, Store, Transaction};
use cairn_types::{PgId, PoolId};
use common::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Kills `osd`, runs `f` on its store (after a checkpoint, so every byte
/// is in the data file), and starts it again.
async fn with_store_offline(c: &mut Cluster, osd: i32, f: impl FnOnce(&Store, &std::path::Path)) {
    c.kill(osd).await;
    let t0 = Instant::now();
    let store = loop {
        match Store::open(c.store_cfg(osd)) {
            Ok(s) => break s,
            Err(e) if t0.elapsed() < Duration::from_secs(20) => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("opening osd.{osd}'s store: {e}"),
        }
    };
    store.checkpoint().expect("checkpoint");
    f(&store, &c.osd_dir(osd));
    drop(store);
    c.restart(osd).await;
}

/// Flips one byte in every place of the store's data file holding `needle`.
fn corrupt_data_file(dir: &std::path::Path, needle: &[u8]) {
    let path = dir.join(cairn_store::DATA_FILE);
    let mut bytes = std::fs::read(&path).expect("read data file");
    let mut hits = 0;
    let mut i = 0;
    while i + needle.len() <= bytes.len() {
        if bytes[i..i + needle.len()] == *needle {
            bytes[i + 7] ^= 0xff;
            hits += 1;
            i += needle.len();
        } else {
            i += 1;
        }
    }
    assert!(hits > 0, "the object's bytes are not in {}", path.display());
    std::fs::write(&path, &bytes).expect("write data file");
}

/// Orders a scrub of `pgid` and waits for its primary to report it done.
async fn scrub(c: &mut Cluster, pgid: PgId, kind: ScrubKind) -> PgScrubReport {
    c.apply(MonCommand::PgScrub { pgid, kind });
    let id = c.current().scrub_order(pgid).expect("order").id;
    let t0 = Instant::now();
    loop {
        let primary = c
            .current()
            .pg_to_up(pgid.pool.0, pgid.seed)
            .unwrap()
            .primary;
        let stat = primary
            .and_then(|p| c.osds.get(&p).and_then(|o| o.as_ref()))
            .and_then(|o| {
                o.pg_stats()
                    .into_iter()
                    .find(|s| s.pgid == pgid.to_string())
            });
        if let Some(s) = stat {
            if s.scrub.order_done >= id && s.scrub.scrubbing.is_empty() {
                // What the monitor leader does when the beacon shows it.
                c.apply(MonCommand::ScrubOrdersDone {
                    done: vec![(pgid, s.scrub.order_done)],
                });
                return s.scrub;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{} of pg {pgid} did not finish in 60 s",
            kind.verb()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn pg0(pool: u64) -> PgId {
    PgId {
        pool: PoolId(pool),
        seed: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicated_corruption_and_missing_objects_are_found_and_repaired() {
    let mut c = Cluster::start_with(3, 1, 1, 256 << 20, Vec::new(), true).await;
    let io = c.client().ioctx("rbd").expect("pool");
    let victim = pattern(7, 64 << 10);
    io.write_full("victim", victim.clone()).await.unwrap();
    io.write_full("ghost", pattern(8, 3000)).await.unwrap();
    for i in 0..20 {
        io.write_full(&format!("bystander-{i}"), pattern(100 + i, 5000))
            .await
            .unwrap();
    }
    io.set_xattr("bystander-3", "colour", b"blue".to_vec())
        .await
        .unwrap();
    let pgid = pg0(1);
    let map = c.current();
    let acting = map.pg_to_up(1, 0).unwrap().up;
    let primary = acting[0];
    let replica = acting[1];

    // A clean PG scrubs clean, both ways.
    assert_eq!(scrub(&mut c, pgid, ScrubKind::Scrub).await.errors, 0);
    let r = scrub(&mut c, pgid, ScrubKind::Deep).await;
    assert_eq!(r.errors, 0, "{r:?}");
    assert!(r.last_deep_scrub_stamp > 0);

    // Flip bytes of victim on the replica's disk; remove ghost there.
    let needle = victim[8192..8192 + 64].to_vec();
    with_store_offline(&mut c, replica, |store, dir| {
        let coll = CollectionId::pg(1, 0);
        let mut t = Transaction::new();
        let g = ObjectName::new("", "ghost");
        t.remove(coll, cairn_osd::exec::store_oid(&g));
        store.commit(t).unwrap();
        store.checkpoint().unwrap();
        corrupt_data_file(dir, &needle);
    })
    .await;
    c.wait_clean(Duration::from_secs(60)).await;

    // A shallow scrub sees the missing object, not the flipped bytes.
    let r = scrub(&mut c, pgid, ScrubKind::Scrub).await;
    assert_eq!(r.errors, 1, "{r:?}");
    assert_eq!(r.inconsistent[0].object, "ghost");
    assert_eq!(r.inconsistent[0].shards[0].osd, replica);
    assert_eq!(r.inconsistent[0].shards[0].errors, vec!["missing"]);

    // Deep-scrub finds both, naming the OSD with the bad copy.
    let r = scrub(&mut c, pgid, ScrubKind::Deep).await;
    assert_eq!(r.errors, 2, "{r:?}");
    let v = r
        .inconsistent
        .iter()
        .find(|o| o.object == "victim")
        .expect("victim reported");
    assert_eq!(v.auth_osd, Some(primary));
    assert_eq!(v.shards.len(), 1);
    assert_eq!(v.shards[0].osd, replica);
    assert_eq!(v.shards[0].errors, vec!["read_error"]);
    let stats = c.osds[&primary].as_ref().unwrap().pg_stats();
    let st = stats.iter().find(|s| s.pgid == "1.0").unwrap();
    assert!(st.state.contains("inconsistent"), "{}", st.state);

    // Health names the PG, the objects and the OSD.
    let t0 = Instant::now();
    let detail = loop {
        let h = c.current().health(&HealthInputs {
            pgmap: Some(c.pg_view(Duration::from_secs(30))),
            ..Default::default()
        });
        // The stand-in monitor may still hold the beacon of the shallow scrub.
        if let (Some(e), Some(d)) = (h.check("OSD_SCRUB_ERRORS"), h.check("PG_DAMAGED")) {
            if e.summary == "2 scrub errors" {
                assert_eq!(d.summary, "Possible data damage: 1 pgs inconsistent");
                break d.detail.join("\n");
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no scrub health: {h:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(detail.contains("pg 1.0"), "{detail}");
    assert!(
        detail.contains("object victim") && detail.contains(&format!("osd.{replica} read_error")),
        "{detail}"
    );
    assert!(detail.contains("object ghost"), "{detail}");

    // Repair rewrites both copies; the re-scrub inside it is clean.
    let r = scrub(&mut c, pgid, ScrubKind::Repair).await;
    assert_eq!(r.errors, 0, "{r:?}");
    let r = scrub(&mut c, pgid, ScrubKind::Deep).await;
    assert_eq!(r.errors, 0, "{r:?}");
    let stats = c.osds[&primary].as_ref().unwrap().pg_stats();
    let st = stats.iter().find(|s| s.pgid == "1.0").unwrap();
    assert!(!st.state.contains("inconsistent"), "{}", st.state);

    // The repaired replica serves the right bytes: make it the primary.
    c.kill(primary).await;
    c.wait_active(Duration::from_secs(60)).await;
    let got = io.read("victim", 0, 0).await.unwrap();
    assert!(got == victim, "victim differs after repair");
    assert_eq!(io.read("ghost", 0, 0).await.unwrap(), pattern(8, 3000));
}

/// The primary's own copy damaged: a client read fails with an I/O error
/// that says a repair is queued, the PG deep-scrubs with repair on its own,
/// and the read then returns the right bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_error_on_the_primary_queues_a_repair() {
    let mut c = Cluster::start_with(3, 1, 1, 256 << 20, Vec::new(), true).await;
    let io = c.client().ioctx("rbd").expect("pool");
    let victim = pattern(9, 64 << 10);
    io.write_full("victim", victim.clone()).await.unwrap();
    let primary = c.current().pg_to_up(1, 0).unwrap().up[0];
    let needle = victim[8192..8192 + 64].to_vec();
    with_store_offline(&mut c, primary, |_, dir| corrupt_data_file(dir, &needle)).await;
    c.wait_clean(Duration::from_secs(60)).await;

    let err = tokio::time::timeout(Duration::from_secs(20), io.read("victim", 0, 0))
        .await
        .expect("read hung")
        .expect_err("a read of a damaged primary copy cannot succeed at once");
    let msg = err.to_string();
    assert!(msg.contains("checksum") && msg.contains("repair"), "{msg}");
    let t0 = Instant::now();
    loop {
        match tokio::time::timeout(Duration::from_secs(20), io.read("victim", 0, 0)).await {
            Ok(Ok(b)) => {
                assert!(b == victim, "the repaired bytes differ");
                break;
            }
            Ok(Err(e)) => assert!(
                t0.elapsed() < Duration::from_secs(60),
                "still failing after 60 s: {e}"
            ),
            Err(_) => panic!("read hung"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ec21_corrupted_chunk_is_found_and_rebuilt() {
    let mut c = Cluster::start(3, 1, 1, 256 << 20).await;
    let pool = c.create_ec21_pool("ec21", 1);
    c.wait_active(Duration::from_secs(60)).await;
    let io = c.client().ioctx("ec21").expect("pool");
    let data = pattern(21, 64 << 10);
    io.write_full("chunky", data.clone()).await.unwrap();
    for i in 0..6 {
        io.write_full(&format!("other-{i}"), pattern(300 + i, 9000))
            .await
            .unwrap();
    }
    let pgid = pg0(pool);
    assert_eq!(scrub(&mut c, pgid, ScrubKind::Deep).await.errors, 0);

    // Shard 1 holds the object's second stripe unit (bytes 4096..8192).
    let shards = c.current().pg_to_up(pool, 0).unwrap().up;
    let victim = shards[1];
    let needle = data[4096 + 100..4096 + 164].to_vec();
    with_store_offline(&mut c, victim, |_, dir| corrupt_data_file(dir, &needle)).await;
    c.wait_active(Duration::from_secs(60)).await;

    let r = scrub(&mut c, pgid, ScrubKind::Deep).await;
    assert_eq!(r.errors, 1, "{r:?}");
    assert_eq!(r.inconsistent[0].object, "chunky");
    let bad = &r.inconsistent[0].shards[0];
    assert_eq!((bad.osd, bad.shard), (victim, Some(1)));
    assert_eq!(bad.errors, vec!["read_error"]);

    let r = scrub(&mut c, pgid, ScrubKind::Repair).await;
    assert_eq!(r.errors, 0, "{r:?}");
    assert_eq!(scrub(&mut c, pgid, ScrubKind::Deep).await.errors, 0);
    // Read with the other data shard gone: shard 1 must be right.
    c.kill(shards[0]).await;
    c.wait_active(Duration::from_secs(60)).await;
    let got = io.read("chunky", 0, 0).await.unwrap();
    assert!(got == data, "chunky differs after repair");
}

/// Snapshot clones of an EC object are scrubbed with their head: a clone
/// chunk damaged on disk (fails the store's crc32c) is found by deep-scrub
/// and rebuilt by repair; a clone's coding chunk rewritten with wrong bytes
/// (its crc32c valid) fails the parity check and is rebuilt too. The
/// snapshot then reads back with the other data shard gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ec21_damaged_clone_chunks_are_found_and_rebuilt() {
    use cairn_ops::SnapContext;
    let mut c = Cluster::start(3, 1, 1, 256 << 20).await;
    let pool = c.create_ec21_pool("ec21", 1);
    c.wait_active(Duration::from_secs(60)).await;
    let io = c.client().ioctx("ec21").expect("pool");
    let old = pattern(31, 64 << 10);
    let new = pattern(32, 64 << 10);
    io.write_full("snappy", old.clone()).await.unwrap();
    // Snapshot 1, then a full write: clone 1 keeps `old` on every shard.
    let io1 = io.with_snap_context(SnapContext {
        seq: 1,
        snaps: vec![1],
    });
    io1.write_full("snappy", new.clone()).await.unwrap();
    // Later writes drop the rollback stash of that write (it holds the
    // old chunk too), so only the clone holds `old`.
    for i in 0..6 {
        io.write_full(&format!("other-{i}"), pattern(400 + i, 9000))
            .await
            .unwrap();
    }
    let at1 = io.at_snap(1);
    assert!(at1.read("snappy", 0, 0).await.unwrap() == old);
    let pgid = pg0(pool);
    assert_eq!(scrub(&mut c, pgid, ScrubKind::Deep).await.errors, 0);

    // Shard 1's clone chunk holds `old`'s second stripe unit.
    let shards = c.current().pg_to_up(pool, 0).unwrap().up;
    let needle = old[4096 + 100..4096 + 164].to_vec();
    with_store_offline(&mut c, shards[1], |_, dir| corrupt_data_file(dir, &needle)).await;
    c.wait_active(Duration::from_secs(60)).await;
    let r = scrub(&mut c, pgid, ScrubKind::Deep).await;
    assert_eq!(r.errors, 1, "{r:?}");
    assert_eq!(r.inconsistent[0].object, "snappy");
    let bad = &r.inconsistent[0].shards[0];
    assert_eq!((bad.osd, bad.shard), (shards[1], Some(1)), "{r:?}");
    assert_eq!(bad.errors, vec!["read_error"]);
    assert!(
        bad.detail.as_deref().is_some_and(|d| d.contains("clone 1")),
        "{r:?}"
    );
    let r = scrub(&mut c, pgid, ScrubKind::Repair).await;
    assert_eq!(r.errors, 0, "{r:?}");
    assert_eq!(scrub(&mut c, pgid, ScrubKind::Deep).await.errors, 0);

    // Shard 2 (parity): wrong bytes with a valid crc32c.
    let clone_oid = cairn_osd::exec::store_oid(&ObjectName::new("", "snappy")).with_snap(1);
    let coll = CollectionId::new(pool, 0, 2);
    with_store_offline(&mut c, shards[2], |store, _| {
        let mut t = Transaction::new();
        t.write(coll, clone_oid.clone(), 0, vec![0x5a_u8; 4096]);
        store.commit(t).expect("rewrite the clone's coding chunk");
    })
    .await;
    c.wait_active(Duration::from_secs(60)).await;
    let r = scrub(&mut c, pgid, ScrubKind::Deep).await;
    assert_eq!(r.errors, 1, "{r:?}");
    let bad = &r.inconsistent[0].shards[0];
    assert_eq!((bad.osd, bad.shard), (shards[2], Some(2)), "{r:?}");
    assert_eq!(bad.errors, vec!["ec_parity_mismatch"]);
    assert!(
        bad.detail.as_deref().is_some_and(|d| d.contains("clone 1")),
        "{r:?}"
    );
    let r = scrub(&mut c, pgid, ScrubKind::Repair).await;
    assert_eq!(r.errors, 0, "{r:?}");
    assert_eq!(scrub(&mut c, pgid, ScrubKind::Deep).await.errors, 0);

    // The snapshot needs shards 1 and 2 once shard 0 is gone.
    c.kill(shards[0]).await;
    c.wait_active(Duration::from_secs(60)).await;
    assert!(
        at1.read("snappy", 0, 0).await.unwrap() == old,
        "snapshot 1 differs after repair"
    );
    assert!(io.read("snappy", 0, 0).await.unwrap() == new);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scrubs_under_write_load_report_nothing() {
    let mut c = Cluster::start_with(
        3,
        1,
        2,
        256 << 20,
        vec![("osd_scrub_chunk_max", "3"), ("osd_scrub_sleep", "0")],
        false,
    )
    .await;
    let io = c.client().ioctx("rbd").expect("pool");
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..4u64 {
        let (io, stop, writes) = (io.clone(), stop.clone(), writes.clone());
        tasks.spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("w{w}-{}", i % 24);
                let r = match i % 5 {
                    4 => io.remove(&name).await.map(|_| ()),
                    3 => io.set_xattr(&name, "k", pattern(i, 20)).await.map(|_| ()),
                    _ => io
                        .write_full(&name, pattern(w * 1000 + i, 1000 + (i as usize % 7) * 3000))
                        .await
                        .map(|_| ()),
                };
                if r.is_ok() {
                    writes.fetch_add(1, Ordering::Relaxed);
                }
                i += 1;
            }
        });
    }
    // Baseline: the same load with no scrub running.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (b0, bt) = (writes.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let base_rate = (writes.load(Ordering::Relaxed) - b0) as f64 / bt.elapsed().as_secs_f64();
    let w0 = writes.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let mut rounds = 0;
    while rounds < 6 || t0.elapsed() < Duration::from_secs(5) {
        let pgid = PgId {
            pool: PoolId(1),
            seed: rounds % 2,
        };
        let kind = if rounds % 2 == 0 {
            ScrubKind::Deep
        } else {
            ScrubKind::Scrub
        };
        let r = scrub(&mut c, pgid, kind).await;
        assert_eq!(r.errors, 0, "false inconsistency under load: {r:?}");
        assert!(r.last_failure.is_none(), "{r:?}");
        rounds += 1;
        if t0.elapsed() > Duration::from_secs(40) {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    while tasks.join_next().await.is_some() {}
    eprintln!(
        "{rounds} back-to-back scrubs (chunks of 3 objects, no sleep) in {:.1} s: {:.0} writes/s acknowledged meanwhile, {base_rate:.0} writes/s with no scrub",
        t0.elapsed().as_secs_f64(),
        (writes.load(Ordering::Relaxed) - w0) as f64 / t0.elapsed().as_secs_f64()
    );
    assert!(
        writes.load(Ordering::Relaxed) > 50,
        "the load made too few writes to mean anything"
    );
}
