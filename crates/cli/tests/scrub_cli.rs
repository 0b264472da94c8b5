//! Scrub commands through real `cairn` processes: one node daemon (a mon
//! and three OSDs under three CRUSH hosts); `pg deep-scrub` and `osd
//! scrub` reach the PGs' primaries through the map, the stamps show in
//! `pg PGID query` and `pg dump`, the monitors drop each order once the
//! primary's beacon reports it done, health stays OK and
//! `rados list-inconsistent-obj` answers. Bad input fails with a clear
//! error. (Corruption, repair and EC are covered in cairn-osd's scrub
//! tests.) Every daemon is killed by PID when the test ends.

mod common;

use common::*;
use std::time::{Duration, Instant};

fn pg_query(c: &Cluster, pgid: &str) -> serde_json::Value {
    let r = c.cairn(&["pg", pgid, "query", "-f", "json"]);
    serde_json::from_str(&r.stdout).unwrap_or_default()
}

#[test]
fn scrub_commands_reach_the_primaries_and_stamps_show() {
    let c = Cluster::bootstrap();
    c.ok(&["config", "set", "osd", "osd_beacon_report_interval", "1"]);
    c.three_osds_and_rbd_pool();
    let src = c.tmp.path().join("obj");
    std::fs::write(&src, vec![5u8; 100_000]).unwrap();
    for i in 0..8 {
        let mut cmd = std::process::Command::new(CAIRN);
        cmd.arg("-c")
            .arg(c.nodes[0].conf())
            .args(["rados", "-p", "rbd", "put", &format!("o{i}")])
            .arg(&src)
            .env_remove("CAIRN_CONF");
        let r = run_cmd(cmd);
        assert!(r.ok, "put: {r:?}");
    }

    // Bad input: clear errors.
    let r = c.cairn(&["pg", "deep-scrub", "7.0"]);
    assert!(!r.ok && r.stderr.contains("pool 7 does not exist"), "{r:?}");
    let r = c.cairn(&["osd", "scrub", "9"]);
    assert!(!r.ok && r.stderr.contains("osd.9 does not exist"), "{r:?}");

    let out = c.ok(&["pg", "deep-scrub", "1.0"]);
    assert!(out.contains("instructing pg 1.0 on osd."), "{out}");
    let primary = pg_query(&c, "1.0")["acting_primary"].as_i64().unwrap();
    let out = c.ok(&["osd", "scrub", &primary.to_string()]);
    assert!(out.contains("to scrub"), "{out}");
    // Done when the deep stamp shows and the monitors dropped the order.
    let t0 = Instant::now();
    loop {
        let q = pg_query(&c, "1.0");
        let s = &q["scrub"];
        if s["last_deep_scrub_stamp"]
            .as_str()
            .is_some_and(|v| v != "-")
            && s["pending_order"].is_null()
            && s["scrubbing"] == ""
        {
            assert_eq!(s["errors"], 0, "{q}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "deep-scrub of 1.0 not reported done: {q}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let dump = c.ok(&["pg", "dump"]);
    assert!(dump.contains("DEEP_SCRUB_STAMP"), "{dump}");
    let l = c.ok(&["rados", "list-inconsistent-obj", "1.0"]);
    assert!(l.contains("no inconsistent objects"), "{l}");
    let h = c.ok(&["health", "detail"]);
    assert!(h.starts_with("HEALTH_OK"), "{h}");
}
