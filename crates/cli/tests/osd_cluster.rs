//! Real `cairn` processes: three node daemons (mon + two OSDs each) on
//! 127.0.x.{1,2,3}; objects of random sizes written and read back
//! byte-exact through `cairn rados`; `cairn -s` showing every PG
//! active+clean from the OSDs' beacons; a whole daemon killed with SIGKILL
//! during a write load on size 3 / min_size 2: its OSDs marked down by
//! their peers' heartbeats (grace 3 s; the time to down and to every PG
//! active again is printed), PG_DEGRADED raised, the load continuing, and
//! every acknowledged object read back after the restart. Every daemon is
//! killed by PID when the test ends (also on failure).

mod common;

use common::*;
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn rados(c: &Cluster, args: &[&str], input: Option<&Path>) -> Run {
    let mut cmd = Command::new(CAIRN);
    cmd.arg("-c").arg(c.nodes[0].conf()).arg("rados").args(args);
    if let Some(p) = input {
        cmd.arg(p);
    }
    cmd.env_remove("CAIRN_CONF");
    run_cmd(cmd)
}

/// (PGs, PGs in each state) from the monitors' PG statistics.
fn pg_states(c: &Cluster) -> (u64, serde_json::Map<String, serde_json::Value>) {
    let r = c.cairn(&["pg", "stat", "-f", "json"]);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap_or_default();
    let by = v["by_state"].as_object().cloned().unwrap_or_default();
    (v["num_pgs"].as_u64().unwrap_or(0), by)
}

fn wait_clean(c: &Cluster, within: Duration) {
    let t0 = Instant::now();
    loop {
        let (total, by) = pg_states(c);
        let clean = by.get("active+clean").and_then(|v| v.as_u64()).unwrap_or(0);
        if total > 0 && clean == total {
            return;
        }
        assert!(t0.elapsed() < within, "PGs not active+clean: {by:?}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// True when every PG is active (none stale, unknown, peering or down).
fn all_active(c: &Cluster) -> bool {
    let (total, by) = pg_states(c);
    let active: u64 = by
        .iter()
        .filter(|(s, _)| s.split('+').any(|w| w == "active") && !s.contains("stale"))
        .filter_map(|(_, n)| n.as_u64())
        .sum();
    total > 0 && active == total
}

fn osds_up(c: &Cluster) -> u64 {
    let r = c.cairn(&["osd", "stat", "-f", "json"]);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap_or_default();
    v["num_up_osds"].as_u64().unwrap_or(u64::MAX)
}

fn add_disks(c: &Cluster, per_node: usize) {
    for n in &c.nodes {
        for i in 0..per_node {
            let path = n.dir.join(format!("disk{i}"));
            let r = c.cairn(&[
                "disk",
                "add",
                path.to_str().unwrap(),
                "--size",
                "256M",
                "--host",
                &format!("node-{}", n.name),
                "--data",
                n.dir.to_str().unwrap(),
            ]);
            assert!(r.ok, "disk add: {r:?}");
        }
    }
}

#[test]
fn three_daemons_objects_and_kill9() {
    let mut c = Cluster::bootstrap();
    c.join("b", &[]);
    c.join("c", &[]);
    c.until_quorum(3);
    // Short failure detection for the test: heartbeats every second,
    // reported after 3 s of silence; beacons every second.
    for (k, v) in [
        ("osd_heartbeat_interval", "1"),
        ("osd_heartbeat_grace", "3"),
        ("osd_beacon_report_interval", "1"),
    ] {
        c.ok(&["config", "set", "osd", k, v]);
    }
    add_disks(&c, 2);
    let ls = c.ok(&["disk", "ls", "--data", c.nodes[1].dir.to_str().unwrap()]);
    assert!(ls.contains("osd.2") && ls.contains("node-b"), "{ls}");
    c.ok(&["osd", "pool", "create", "rbd", "16"]);
    // Defaults: size 3, min_size 2.
    let d = c.ok(&["osd", "pool", "ls", "detail"]);
    assert!(d.contains("size 3") && d.contains("min_size 2"), "{d}");
    wait_clean(&c, Duration::from_secs(60));
    let tree = c.ok(&["osd", "tree"]);
    assert_eq!(tree.matches(" up ").count(), 6, "{tree}");
    let s = c.ok(&["-s"]);
    assert!(
        s.contains("pgs:     16 active+clean") && s.contains("usage:") && s.contains("HEALTH_OK"),
        "{s}"
    );
    let df = c.ok(&["osd", "df", "tree"]);
    assert!(df.contains("host node-b") && df.contains("TOTAL"), "{df}");

    // Random sizes 0..8 MiB, byte-exact round trips.
    let work = c.tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut sizes = vec![0usize, 1, 8 << 20];
    for _ in 0..9 {
        sizes.push(rng.gen_range(0..(8 << 20)));
    }
    for (i, size) in sizes.iter().enumerate() {
        let data: Vec<u8> = (0..*size).map(|_| rng.gen()).collect();
        let src = work.join(format!("in{i}"));
        std::fs::write(&src, &data).unwrap();
        let r = rados(&c, &["-p", "rbd", "put", &format!("obj{i}")], Some(&src));
        assert!(r.ok, "put obj{i} ({size} bytes): {r:?}");
        let dst = work.join(format!("out{i}"));
        let r = rados(&c, &["-p", "rbd", "get", &format!("obj{i}")], Some(&dst));
        assert!(r.ok, "get obj{i}: {r:?}");
        assert!(std::fs::read(&dst).unwrap() == data, "obj{i} differs");
    }
    let ls = rados(&c, &["-p", "rbd", "ls"], None);
    assert_eq!(ls.stdout.lines().count(), sizes.len(), "{ls:?}");
    let m = c.ok(&["osd", "map", "rbd", "obj1"]);
    assert!(
        m.starts_with("osdmap e")
            && m.contains("pool 'rbd' (1) object 'obj1' -> pg 1.")
            && m.contains("acting (["),
        "{m}"
    );

    // Write load from a thread; kill -9 node c (its mon and both OSDs) meanwhile.
    type Acked = Arc<Mutex<Vec<(String, Vec<u8>)>>>;
    let acked: Acked = Arc::default();
    let failed: Arc<Mutex<Vec<String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let conf = c.nodes[0].conf();
    let load = {
        let (acked, failed, stop, work) =
            (acked.clone(), failed.clone(), stop.clone(), work.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let name = format!("load{i}");
                let data: Vec<u8> = (0..(64 << 10) + i * 997)
                    .map(|x| (x * 31 + i) as u8)
                    .collect();
                let src = work.join(&name);
                std::fs::write(&src, &data).unwrap();
                let mut cmd = Command::new(CAIRN);
                cmd.arg("-c")
                    .arg(&conf)
                    .args(["rados", "-p", "rbd", "put", &name])
                    .arg(&src);
                let r = run_cmd(cmd);
                if r.ok {
                    acked.lock().unwrap().push((name, data));
                } else {
                    failed.lock().unwrap().push(format!("{name}: {}", r.stderr));
                }
                i += 1;
            }
        })
    };
    std::thread::sleep(Duration::from_secs(2));
    let before = acked.lock().unwrap().len();
    c.kill9("c");
    let killed_at = Instant::now();
    // Heartbeats get node c's two OSDs marked down, then every PG is
    // active again on the other two nodes.
    while osds_up(&c) != 4 {
        assert!(
            killed_at.elapsed() < Duration::from_secs(30),
            "node c's OSDs not marked down by heartbeats: {}",
            c.cairn(&["osd", "tree"]).stdout
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let down_after = killed_at.elapsed();
    while !all_active(&c) {
        assert!(
            killed_at.elapsed() < Duration::from_secs(60),
            "PGs not active again after kill -9 of node c: {:?}",
            pg_states(&c).1
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "kill -9 of node c (mon c, osd.4, osd.5): marked down after {:.1} s, every PG active after {:.1} s (grace 3 s)",
        down_after.as_secs_f64(),
        killed_at.elapsed().as_secs_f64()
    );
    let h = c.cairn(&["health", "detail"]);
    assert!(
        h.stdout.contains("PG_DEGRADED") && h.stdout.contains("OSD_DOWN"),
        "{h:?}"
    );
    // The load must keep going with node c gone.
    while acked.lock().unwrap().len() < before + 8 {
        assert!(
            killed_at.elapsed() < Duration::from_secs(60),
            "writes stalled after kill -9 of node c: {} acked before, {} now; failures {:?}",
            before,
            acked.lock().unwrap().len(),
            failed.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let r = c.start("c");
    assert!(r.ok, "restart c: {r:?}");
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::SeqCst);
    load.join().unwrap();
    wait_clean(&c, Duration::from_secs(90));
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > before + 8);
    for (name, data) in &acked {
        let dst = work.join(format!("{name}.back"));
        let r = rados(&c, &["-p", "rbd", "get", name], Some(&dst));
        assert!(r.ok, "get {name} after restart: {r:?}");
        assert!(
            std::fs::read(&dst).unwrap() == *data,
            "{name} differs after restart"
        );
    }
}
