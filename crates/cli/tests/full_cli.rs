//! Full disks through real `cairn` processes: one node daemon (a mon and
//! three OSDs under three CRUSH hosts) with low full ratios. Bad ratios are
//! refused; writes fill the OSDs until the monitors mark them full from
//! their beacons; then `rados put` fails at once with the pool-full error
//! naming the OSD, `health detail` shows OSD_FULL and `osd df` the mark;
//! reads and removes still work, and once removes freed the space the mark
//! goes and writes work again. Every daemon is killed by PID when the test
//! ends.

mod common;

use common::*;
use std::time::{Duration, Instant};

#[test]
fn full_osds_refuse_writes_fast_and_deletes_clear_it() {
    let c = Cluster::bootstrap();
    c.ok(&["config", "set", "osd", "osd_beacon_report_interval", "1"]);
    c.three_osds_and_rbd_pool();
    // Bad ratios: clear errors, nothing changed.
    for (args, want) in [
        (["osd", "set-full-ratio", "2"], "out of range"),
        (["osd", "set-full-ratio", "abc"], "not a number"),
        (["osd", "set-nearfull-ratio", "0.92"], "order"),
    ] {
        let r = c.cairn(&args);
        assert!(!r.ok && r.stderr.contains(want), "{args:?}: {r:?}");
    }
    assert!(c.ok(&["osd", "dump"]).contains("full_ratio 0.95"));
    // Full at 10 % of 256 MiB (each OSD holds every object: size 3).
    c.ok(&["osd", "set-nearfull-ratio", "0.06"]);
    c.ok(&["osd", "set-backfillfull-ratio", "0.08"]);
    c.ok(&["osd", "set-full-ratio", "0.1"]);
    let src = c.tmp.path().join("obj");
    std::fs::write(&src, vec![7u8; 2 << 20]).unwrap();
    let put = |name: &str| {
        let mut cmd = std::process::Command::new(CAIRN);
        cmd.arg("-c")
            .arg(c.nodes[0].conf())
            .args(["rados", "-p", "rbd", "put", name])
            .arg(&src)
            .env_remove("CAIRN_CONF");
        let t = Instant::now();
        (run_cmd(cmd), t.elapsed())
    };
    let mut written = Vec::new();
    let (refused, took) = loop {
        assert!(written.len() < 40, "40 puts of 2 MiB never filled the OSDs");
        let name = format!("o{}", written.len());
        let (r, took) = put(&name);
        if !r.ok {
            break (r, took);
        }
        written.push(name);
        std::thread::sleep(Duration::from_millis(300));
    };
    assert!(
        refused.stderr.contains("pool 'rbd' is full: osd.")
            && refused.stderr.contains("(full ratio 0.1)"),
        "{refused:?}"
    );
    assert!(
        took < Duration::from_secs(10),
        "refused only after {took:?}"
    );
    let health = c.ok(&["health", "detail"]);
    assert!(
        health.contains("HEALTH_ERR") && health.contains("OSD_FULL") && health.contains("is full"),
        "{health}"
    );
    assert!(c.ok(&["osd", "df"]).contains(",full"));
    assert!(c.ok(&["osd", "dump"]).contains("flags full"));
    // Reads and removes work on a full pool.
    let back = c.tmp.path().join("back");
    c.ok(&[
        "rados",
        "-p",
        "rbd",
        "get",
        &written[0],
        back.to_str().unwrap(),
    ]);
    assert_eq!(std::fs::read(&back).unwrap().len(), 2 << 20);
    for name in &written {
        c.ok(&["rados", "-p", "rbd", "rm", name]);
    }
    let t0 = Instant::now();
    while c.ok(&["health", "detail"]).contains("OSD_FULL") {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "OSD_FULL stayed after the removes"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let (r, _) = put("after");
    assert!(r.ok, "put after the removes: {r:?}");
}
