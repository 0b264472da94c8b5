//! Failure detection end to end in one process: 3 hosts x 2 OSDs with
//! heartbeats (interval 1 s, grace 3 s) and beacons (1 s) to a stand-in
//! monitor that judges them with the monitors' `FailureJudge`. An OSD is
//! killed without telling the monitors; its peers' reports get it marked
//! down, its PGs go active again on the others (timed), PG statistics show
//! the PGs degraded and PG_DEGRADED is raised; after
//! `mon_osd_down_out_interval` it is marked out and the PGs heal to
//! active+clean.

mod common;

use common::*;
use std::time::{Duration, Instant};

const GRACE_SECS: u64 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_osd_is_marked_down_by_heartbeats_and_its_pgs_recover() {
    let config = vec![
        ("osd_heartbeat_interval", "1"),
        ("osd_heartbeat_grace", "3"),
        ("osd_beacon_report_interval", "1"),
        ("mon_osd_down_out_interval", "6"),
    ];
    let mut c = Cluster::start_with(3, 2, 16, 256 << 20, config, true).await;
    let rados = c.client();
    let io = rados.ioctx("rbd").expect("ioctx");
    for i in 0..24u64 {
        io.write_full(&format!("hb{i}"), pattern(i, 1000 + i as usize * 37))
            .await
            .expect("write");
    }
    c.wait_clean(Duration::from_secs(60)).await;

    // The beacons show every PG active+clean and count the objects.
    let t0 = Instant::now();
    loop {
        let map = c.current();
        let t = map.pg_totals(&c.pg_view(Duration::from_secs(5)));
        if t.by_state.get("active+clean") == Some(&16) && t.objects == 24 {
            assert!(t.total_bytes > 0 && t.used_bytes > 0, "{t:?}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "beacons never showed 16 active+clean PGs with 24 objects: {t:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Kill osd.0 behind the monitors' back.
    let victim = 0;
    let victim_pgs: usize = c.current().pgs_per_osd()[&victim];
    c.crash(victim);
    let killed = Instant::now();
    loop {
        if !c.current().osds[&victim].up {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(GRACE_SECS + 10),
            "osd.{victim} not marked down {:?} after it was killed",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let down_after = killed.elapsed();
    c.wait_active(Duration::from_secs(60)).await;
    let active_after = killed.elapsed();
    println!(
        "osd.{victim} ({victim_pgs} PGs) killed: marked down after {:.2} s, all PGs active after {:.2} s (grace {GRACE_SECS} s)",
        down_after.as_secs_f64(),
        active_after.as_secs_f64()
    );
    assert!(
        down_after >= Duration::from_secs(GRACE_SECS - 1),
        "marked down before the grace ran out: {down_after:?}"
    );

    // The monitors' view: PGs degraded, PG_DEGRADED raised, OSD_DOWN too.
    let t0 = Instant::now();
    loop {
        let map = c.current();
        let view = c.pg_view(Duration::from_secs(5));
        let h = map.health(&cairn_map::HealthInputs {
            pgmap: Some(view),
            ..Default::default()
        });
        if h.check("PG_DEGRADED").is_some() && h.check("OSD_DOWN").is_some() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no PG_DEGRADED while osd.{victim} is down: {:?}",
            h.checks
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // I/O continues on the degraded PGs.
    io.write_full("after-kill", &b"still writable"[..])
        .await
        .expect("write while degraded");

    // After mon_osd_down_out_interval it is marked out and data re-replicates.
    let t0 = Instant::now();
    while c.current().osds[&victim].is_in {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "osd.{victim} not marked out after mon_osd_down_out_interval"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.wait_clean(Duration::from_secs(60)).await;
    for i in 0..24u64 {
        let got = io.read(&format!("hb{i}"), 0, 1 << 20).await.expect("read");
        assert_eq!(got, pattern(i, 1000 + i as usize * 37), "hb{i}");
    }
}

/// Every worker of the OSDs' runtime (and the stand-in monitor's) is held
/// busy for longer than the grace, as a loaded machine can do: the
/// heartbeat threads keep pinging and answering, and a tracker that did
/// not run does not blame its peers, so no OSD is reported failed or
/// marked down. A real kill afterwards is still detected within the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_starved_runtime_marks_no_osd_down() {
    let config = vec![
        ("osd_heartbeat_interval", "1"),
        ("osd_heartbeat_grace", "3"),
        ("osd_beacon_report_interval", "1"),
    ];
    let mut c = Cluster::start_with(3, 2, 16, 256 << 20, config, true).await;
    c.wait_clean(Duration::from_secs(60)).await;
    let epoch = c.current().epoch;
    // Hold all 4 workers (8 blocking tasks: idle workers steal them) for
    // about twice the grace.
    let t0 = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..8 {
        set.spawn(async { std::thread::sleep(Duration::from_secs(3)) });
    }
    while set.join_next().await.is_some() {}
    let stalled = t0.elapsed();
    println!("runtime held for {:.1} s", stalled.as_secs_f64());
    // Reports queued during the stall would reach the monitor now.
    tokio::time::sleep(Duration::from_secs(2 * GRACE_SECS)).await;
    let map = c.current();
    let down: Vec<i32> = map.osds.values().filter(|o| !o.up).map(|o| o.id).collect();
    assert!(
        down.is_empty(),
        "OSDs {down:?} marked down after a {stalled:?} stall of the runtime (epoch {} -> {})",
        epoch.0,
        map.epoch.0
    );
    // Real failures are still detected.
    c.crash(5);
    let killed = Instant::now();
    while c.current().osds[&5].up {
        assert!(
            killed.elapsed() < Duration::from_secs(GRACE_SECS + 5),
            "osd.5 not marked down {:?} after it was killed",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "osd.5 killed: marked down after {:.2} s",
        killed.elapsed().as_secs_f64()
    );
}
