//! Monitor-side health checks: each named check raised by the situation it
//! describes, cleared when the situation goes, with a message saying what
//! to do.

mod common;
use cairn_map::*;
use common::*;

fn inputs(quorum: &[&str]) -> HealthInputs {
    HealthInputs {
        quorum: quorum.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

#[test]
fn healthy_cluster_is_ok() {
    let m = cluster(3, 1);
    let h = m.health(&inputs(&["a"]));
    assert_eq!(h.status, HealthStatus::Ok, "{:?}", h.checks);
    assert!(h.checks.is_empty());
    assert_eq!(h.to_plain(true), "HEALTH_OK\n");
}

#[test]
fn too_few_osds_like_the_seed() {
    let m = new_map();
    let h = m.health(&inputs(&["a"]));
    assert_eq!(h.status, HealthStatus::Warn);
    let c = h.check("TOO_FEW_OSDS").unwrap();
    assert_eq!(c.summary, "OSD count 0 < osd_pool_default_size 3");
    assert!(c.detail[0].contains("cairn disk add"));
}

#[test]
fn mon_down_and_clock_skew() {
    let mut m = cluster(3, 1);
    ok(&mut m, "mon add b 127.0.0.2:6789");
    ok(&mut m, "mon add c 127.0.0.3:6789");
    let mut obs = inputs(&["a", "b"]);
    obs.mon_clock_offsets_ms.insert("b".into(), 3_600_012);
    obs.mon_clock_offsets_ms.insert("c".into(), 10);
    let h = m.health(&obs);
    let down = h.check("MON_DOWN").unwrap();
    assert_eq!(down.summary, "1/3 mons down, quorum a,b");
    assert!(down.detail[0].contains("mon.c (rank 2) at 127.0.0.3:6789 is down"));
    let skew = h.check("MON_CLOCK_SKEW").unwrap();
    assert_eq!(skew.summary, "clock skew detected on mon.b");
    assert!(
        skew.detail[0].contains("3600.012s > max 0.05s"),
        "{}",
        skew.detail[0]
    );
    assert!(skew.detail[0].contains("does not depend on clock agreement"));
    // The allowed drift is central config.
    ok(&mut m, "config set mon mon_clock_drift_allowed 3601");
    assert!(m.health(&obs).check("MON_CLOCK_SKEW").is_none());
    // Unknown quorum (empty) does not raise MON_DOWN.
    assert!(m
        .health(&HealthInputs::default())
        .check("MON_DOWN")
        .is_none());
}

#[test]
fn osd_down_and_host_down() {
    let mut m = cluster(3, 2);
    ok(&mut m, "osd down 0");
    let h = m.health(&inputs(&["a"]));
    let c = h.check("OSD_DOWN").unwrap();
    assert_eq!(c.summary, "1 osds down");
    assert!(
        c.detail[0].starts_with("osd.0 (host=node0) is down"),
        "{}",
        c.detail[0]
    );
    assert!(h.check("OSD_HOST_DOWN").is_none());
    ok(&mut m, "osd down 1");
    let h = m.health(&inputs(&["a"]));
    assert_eq!(h.check("OSD_DOWN").unwrap().summary, "2 osds down");
    let host = h.check("OSD_HOST_DOWN").unwrap();
    assert_eq!(host.summary, "1 host (2 osds) down");
    assert!(host.detail[0].contains("host node0"));
    // Out OSDs are not reported down (their data has moved).
    ok(&mut m, "osd out 0 1");
    let h = m.health(&inputs(&["a"]));
    assert!(h.check("OSD_DOWN").is_none() && h.check("OSD_HOST_DOWN").is_none());
}

#[test]
fn flags_and_no_redundancy_and_auth_insecure() {
    let mut m = cluster(3, 1);
    ok(&mut m, "osd set noout");
    ok(&mut m, "osd set noscrub");
    ok(&mut m, "config set global mon_allow_pool_size_one true");
    ok(&mut m, "osd pool create scratch 8");
    ok(&mut m, "osd pool set scratch size 1 --yes-i-really-mean-it");
    let mut obs = inputs(&["a"]);
    obs.insecure_key_files = vec!["/var/lib/cairn/keyring".into()];
    let h = m.health(&obs);
    assert_eq!(
        h.check("OSDMAP_FLAGS").unwrap().summary,
        "noout,noscrub flag(s) set"
    );
    let r = h.check("POOL_NO_REDUNDANCY").unwrap();
    assert!(r.detail[0].contains("'cairn osd pool set scratch size 3'"));
    let a = h.check("AUTH_INSECURE").unwrap();
    assert!(a.detail[0].contains("chmod 600 /var/lib/cairn/keyring"));
    let plain = h.to_plain(true);
    assert!(plain.starts_with("HEALTH_WARN "), "{plain}");
    assert!(plain.contains("[WRN] AUTH_INSECURE: 1 key file(s) readable by other users"));
    let json = h.to_json(true);
    assert_eq!(json["status"], "HEALTH_WARN");
    assert_eq!(json["checks"]["OSDMAP_FLAGS"]["severity"], "HEALTH_WARN");
    assert!(json["checks"]["AUTH_INSECURE"]["detail"][0]["message"].is_string());
}

#[test]
fn placement_warning_when_rule_cannot_place_size() {
    // Two hosts, size-3 pool with failure domain host: created, but warned.
    let mut m = cluster(2, 2);
    let r = run(&mut m, "osd pool create rbd 16").unwrap();
    assert!(r.plain.contains("pool 'rbd' created"));
    assert!(r.plain.contains("warning: pool 'rbd'"), "{}", r.plain);
    assert!(m.pools.values().any(|p| p.name == "rbd"));
    let h = m.health(&inputs(&["a"]));
    let c = h.check("POOL_PLACEMENT_UNDERSIZED").unwrap();
    assert!(
        c.detail[0].contains("CRUSH placed only 2 of 3 OSDs in distinct hosts"),
        "{}",
        c.detail[0]
    );
    assert!(c.detail[0].contains("add OSDs in more hosts"));
    let status = ok(&mut m, "status");
    assert!(status.contains("cannot place all replicas"), "{status}");
    // A third host clears it.
    add_osd(&mut m, "node9", Some("hdd"));
    assert!(m
        .health(&inputs(&["a"]))
        .check("POOL_PLACEMENT_UNDERSIZED")
        .is_none());
}

#[test]
fn placement_below_min_size_is_an_error() {
    let mut m = cluster(1, 3);
    ok(&mut m, "osd pool create rbd 8");
    let h = m.health(&inputs(&["a"]));
    assert_eq!(h.status, HealthStatus::Err);
    let c = h.check("POOL_PLACEMENT_INACTIVE").unwrap();
    assert!(c.summary.contains("I/O to affected PGs will block"));
    assert!(
        c.detail[0].contains("placed only 1 of 3"),
        "{}",
        c.detail[0]
    );
    assert!(ok(&mut m, "health").starts_with("HEALTH_ERR"));
    // Moving the pool to a per-OSD rule fixes placement.
    ok(
        &mut m,
        "osd crush rule create-replicated per-osd default osd",
    );
    ok(&mut m, "osd pool set rbd crush_rule per-osd");
    assert_eq!(m.health(&inputs(&["a"])).status, HealthStatus::Ok);
}

#[test]
fn out_osds_do_not_count_for_placement() {
    let mut m = cluster(3, 1);
    ok(&mut m, "osd pool create rbd 8");
    assert_eq!(m.health(&inputs(&["a"])).status, HealthStatus::Ok);
    ok(&mut m, "osd out 2");
    let h = m.health(&inputs(&["a"]));
    assert!(
        h.check("POOL_PLACEMENT_UNDERSIZED").is_some(),
        "{:?}",
        h.checks
    );
}
