//! The leader's failure judge (reports, withdrawals, expiry, missed
//! beacons, down -> out with its limits) driven with explicit instants, and
//! the PG statistics views and health checks built from OSD beacons.

mod common;
use cairn_map::*;
use cairn_types::{EntityName, PgId, PoolId};
use common::*;
use std::time::{Duration, Instant};

fn apply_all(m: &mut ClusterMap, cmds: Vec<MonCommand>) {
    for c in cmds {
        m.apply(&c, &actx()).unwrap();
    }
}

#[test]
fn reports_from_two_hosts_mark_down_and_withdrawals_count() {
    let m = cluster(3, 2);
    let t0 = Instant::now();
    let mut j = FailureJudge::new();
    // Same-host reporter alone: not enough.
    assert_eq!(j.report(t0, &m, 1, 0, true), None);
    // Withdrawn, then another host reports: still one host.
    assert_eq!(j.report(t0, &m, 1, 0, false), None);
    assert_eq!(j.report(t0, &m, 2, 0, true), None);
    // A second host agrees: down.
    assert_eq!(
        j.report(t0, &m, 4, 0, true),
        Some(MonCommand::OsdFailed { id: 0 })
    );
    // Self reports and reports about down OSDs are ignored.
    assert_eq!(j.report(t0, &m, 3, 3, true), None);
}

#[test]
fn reports_expire_unless_resent() {
    let m = cluster(3, 1);
    let t0 = Instant::now();
    let expiry = FailureJudge::report_expiry(&m);
    assert_eq!(expiry, Duration::from_secs(40), "2 x default grace 20 s");
    let mut j = FailureJudge::new();
    assert_eq!(j.report(t0, &m, 1, 0, true), None);
    let late = t0 + expiry + Duration::from_secs(1);
    assert_eq!(
        j.report(late, &m, 2, 0, true),
        None,
        "osd.1's report expired"
    );
    assert_eq!(
        j.report(late, &m, 1, 0, true),
        Some(MonCommand::OsdFailed { id: 0 })
    );
}

#[test]
fn missed_beacons_mark_down_and_timers_are_leader_local() {
    let mut m = cluster(3, 1);
    ok(&mut m, "config set mon mon_osd_report_timeout 30");
    let t0 = Instant::now();
    let mut j = FailureJudge::new();
    assert!(j.tick(t0, &m).is_empty(), "a new judge starts every timer");
    for id in [0, 1, 2] {
        j.beacon(t0 + Duration::from_secs(20), &m, id);
    }
    j.beacon(t0 + Duration::from_secs(40), &m, 1);
    let d = j.tick(t0 + Duration::from_secs(55), &m);
    assert_eq!(
        d,
        vec![
            MonCommand::OsdFailed { id: 0 },
            MonCommand::OsdFailed { id: 2 }
        ]
    );
    // nodown holds them up.
    ok(&mut m, "osd set nodown");
    assert!(j.tick(t0 + Duration::from_secs(56), &m).is_empty());
    // A fresh judge (new leader) restarts the timers.
    let mut fresh = FailureJudge::new();
    ok(&mut m, "osd unset nodown");
    assert!(fresh.tick(t0 + Duration::from_secs(56), &m).is_empty());
}

#[test]
fn down_osds_are_marked_out_after_the_interval_but_not_whole_hosts() {
    let mut m = cluster(3, 2);
    ok(&mut m, "config set mon mon_osd_down_out_interval 60");
    let t0 = Instant::now();
    let mut j = FailureJudge::new();
    ok(&mut m, "osd down 0");
    assert!(j.tick(t0, &m).is_empty());
    assert!(j.tick(t0 + Duration::from_secs(30), &m).is_empty());
    let d = j.tick(t0 + Duration::from_secs(61), &m);
    assert_eq!(d, vec![MonCommand::OsdAutoOut { id: 0 }]);
    apply_all(&mut m, d);
    assert!(!m.osds[&0].is_in);
    // Host node1 entirely down: neither of its OSDs goes out.
    ok(&mut m, "osd down 2 3");
    j.tick(t0 + Duration::from_secs(62), &m);
    assert!(j.tick(t0 + Duration::from_secs(200), &m).is_empty());
    // noout stops everything.
    ok(&mut m, "osd down 4");
    ok(&mut m, "osd set noout");
    j.tick(t0 + Duration::from_secs(201), &m);
    assert!(j.tick(t0 + Duration::from_secs(400), &m).is_empty());
}

fn pool_map() -> ClusterMap {
    let mut m = cluster(3, 1);
    ok(&mut m, "osd pool create rbd 4");
    m
}

fn report(m: &ClusterMap, seed: u32, state: &str, objects: u64) -> PgReport {
    let up = m.pg_to_up(1, seed).unwrap();
    PgReport {
        pgid: PgId {
            pool: PoolId(1),
            seed,
        },
        state: state.into(),
        up: up.up.clone(),
        acting: up.up.clone(),
        primary: up.primary,
        epoch: m.epoch.0,
        objects,
        bytes: objects * 100,
        log_entries: objects,
        degraded_objects: if state.contains("degraded") {
            objects
        } else {
            0
        },
        misplaced_objects: 0,
        last_update: format!("{}'{objects}", m.epoch.0),
        log_tail: "0'0".into(),
        same_interval_since: 1,
        last_epoch_started: 1,
        down_reason: None,
        recovery: Default::default(),
        scrub: Default::default(),
        unfound_objects: 0,
        recovered_objects: 0,
        recovered_bytes: 0,
        backfill: None,
    }
}

fn view_of(m: &ClusterMap, reports: Vec<PgReport>, stale: &[i32]) -> PgMapView {
    let mut v = PgMapView::default();
    for o in m.osds.keys() {
        let pgs: Vec<PgReport> = reports
            .iter()
            .filter(|r| r.primary == Some(*o))
            .cloned()
            .collect();
        v.osds.insert(
            *o,
            OsdStatsEntry {
                age_secs: 1,
                stale: stale.contains(o),
                beacon: OsdBeacon {
                    epoch: m.epoch.0,
                    total_bytes: 1000,
                    used_bytes: 100,
                    available_bytes: 850,
                    pgs,
                },
            },
        );
    }
    v
}

#[test]
fn pg_states_come_from_fresh_primary_reports() {
    let m = pool_map();
    let reports: Vec<PgReport> = (0..4).map(|s| report(&m, s, "active+clean", 5)).collect();
    let v = view_of(&m, reports.clone(), &[]);
    let t = m.pg_totals(&v);
    assert_eq!(t.num_pgs, 4);
    assert_eq!(t.by_state.get("active+clean"), Some(&4));
    assert_eq!((t.objects, t.data_bytes), (20, 2000));
    assert_eq!((t.used_bytes, t.total_bytes), (300, 3000));
    let h = m.health(&HealthInputs {
        quorum: vec!["a".into()],
        pgmap: Some(v),
        ..Default::default()
    });
    assert_eq!(h.status, HealthStatus::Ok, "{:?}", h.checks);

    // No report at all: unknown, and PG_AVAILABILITY.
    let empty = view_of(&m, Vec::new(), &[]);
    let t = m.pg_totals(&empty);
    assert_eq!(t.by_state.get("unknown"), Some(&4));
    let h = m.health(&HealthInputs {
        pgmap: Some(empty),
        ..Default::default()
    });
    assert!(h.check("PG_AVAILABILITY").is_some(), "{:?}", h.checks);

    // The primary of PG 1.0 goes quiet: its PG is stale+active+clean.
    let p0 = reports[0].primary.unwrap();
    let v = view_of(&m, reports.clone(), &[p0]);
    let e = m
        .pg_entries(&v)
        .into_iter()
        .find(|e| e.pgid.seed == 0)
        .unwrap();
    assert_eq!(e.state, "stale+active+clean");
    let h = m.health(&HealthInputs {
        pgmap: Some(v),
        ..Default::default()
    });
    let c = h.check("PG_AVAILABILITY").expect("stale PGs are reported");
    assert!(c.summary.contains("stale"), "{}", c.summary);
}

#[test]
fn degraded_and_full_checks() {
    let mut m = pool_map();
    let mut reports: Vec<PgReport> = (0..4).map(|s| report(&m, s, "active+clean", 5)).collect();
    reports[1] = report(&m, 1, "active+undersized+degraded", 5);
    let mut v = view_of(&m, reports, &[]);
    if let Some(e) = v.osds.get_mut(&0) {
        e.beacon.used_bytes = 960;
    }
    if let Some(e) = v.osds.get_mut(&1) {
        e.beacon.used_bytes = 860;
    }
    // The leader marks OSDs from their beacons' usage; health follows the marks.
    let changes: Vec<MonCommand> = v
        .osds
        .iter()
        .filter_map(|(id, e)| m.fullness_change(*id, &e.beacon))
        .collect();
    apply_all(&mut m, changes);
    let h = m.health(&HealthInputs {
        pgmap: Some(v),
        ..Default::default()
    });
    let d = h.check("PG_DEGRADED").expect("PG_DEGRADED");
    assert!(
        d.summary.contains("5/60 objects degraded") && d.summary.contains("1 pgs undersized"),
        "{}",
        d.summary
    );
    assert!(h.check("OSD_FULL").is_some() && h.check("OSD_NEARFULL").is_some());
    assert_eq!(h.status, HealthStatus::Err);
    // TOO_MANY_PGS needs only the map.
    ok(&mut m, "config set mon mon_max_pg_per_osd 3");
    let h = m.health(&HealthInputs::default());
    let c = h.check("TOO_MANY_PGS").expect("TOO_MANY_PGS");
    assert!(c.summary.contains("4 > max 3"), "{}", c.summary);
}

#[test]
fn pg_queries_render_from_the_view() {
    let m = pool_map();
    let reports: Vec<PgReport> = (0..4).map(|s| report(&m, s, "active+clean", 5)).collect();
    let mut q = qctx();
    q.runtime.health.pgmap = Some(view_of(&m, reports, &[]));
    let stat = m.query(&MonCommand::PgStat, &q).unwrap();
    assert!(
        stat.plain
            .starts_with("4 pgs: 4 active+clean; 2.0 KiB data"),
        "{}",
        stat.plain
    );
    assert_eq!(stat.json["by_state"]["active+clean"], 4);
    let dump = m.query(&MonCommand::PgDump { brief: true }, &q).unwrap();
    assert_eq!(dump.plain.lines().count(), 5, "{}", dump.plain);
    assert!(dump.plain.contains("1.3") && dump.plain.contains("active+clean"));
    let df = m.query(&MonCommand::OsdDf { tree: true }, &q).unwrap();
    assert!(
        df.plain.contains("host node0") && df.plain.contains("TOTAL"),
        "{}",
        df.plain
    );
    assert_eq!(df.json["nodes"].as_array().unwrap().len(), 3);
    let st = m.query(&MonCommand::Status, &q).unwrap();
    assert!(st.plain.contains("pgs:     4 active+clean"), "{}", st.plain);
    assert!(st.plain.contains("objects: 20 objects"), "{}", st.plain);
    assert!(
        st.plain
            .contains("usage:   300 B used, 2.5 KiB / 2.9 KiB avail"),
        "{}",
        st.plain
    );
    assert_eq!(
        parse_command(&words("pg dump pgs_brief")).unwrap(),
        MonCommand::PgDump { brief: true }
    );
    assert_eq!(
        parse_command(&words("osd df tree")).unwrap(),
        MonCommand::OsdDf { tree: true }
    );
    assert!(
        m.clone()
            .apply(
                &MonCommand::OsdFailureReport {
                    id: 1,
                    target: 0,
                    failed: true
                },
                &actx()
            )
            .is_err(),
        "reports never change the map"
    );
}

#[test]
fn scrub_orders_and_scrub_health() {
    let mut m = pool_map();
    let pg = |seed| PgId {
        pool: PoolId(1),
        seed,
    };
    // Bad input: a clear error, nothing changes.
    assert!(fails(&mut m, "pg scrub 9.0").contains("pool 9 does not exist"));
    assert!(fails(&mut m, "pg scrub 1.7").contains("has 4 PGs"));
    assert!(fails(&mut m, "pg scrub").contains("pg scrub"));
    assert!(fails(&mut m, "osd scrub 42").contains("osd.42 does not exist"));
    ok(&mut m, "pg deep-scrub 1.2");
    let o = m.scrub_order(pg(2)).cloned().unwrap();
    assert!(o.deep && !o.repair);
    assert_eq!(o.id, m.epoch.0);
    // A repair widens the pending order.
    ok(&mut m, "pg repair 1.2");
    let o = m.scrub_order(pg(2)).cloned().unwrap();
    assert!(o.deep && o.repair);
    // osd scrub: every PG the OSD is primary of.
    let p = m.pg_to_up(1, 0).unwrap().primary.unwrap();
    let out = ok(&mut m, &format!("osd scrub {p}"));
    assert!(out.contains(&format!("osd.{p}")), "{out}");
    assert!(m.scrub_order(pg(0)).is_some());

    // The primary reports order 1.2 done: the leader settles it.
    let mut reports: Vec<PgReport> = (0..4).map(|s| report(&m, s, "active+clean", 5)).collect();
    reports[2].scrub.order_done = m.scrub_order(pg(2)).unwrap().id;
    reports[2].state = "active+clean+inconsistent".into();
    reports[2].scrub.errors = 1;
    reports[2].scrub.inconsistent = vec![InconsistentObjectReport {
        object: "victim".into(),
        version: Some("5'3".into()),
        auth_osd: reports[2].primary,
        shards: vec![ShardErrorReport {
            osd: reports[2].acting[1],
            shard: None,
            errors: vec!["data_digest_mismatch".into()],
            detail: None,
        }],
    }];
    let p2 = reports[2].primary.unwrap();
    let v = view_of(&m, reports, &[]);
    let beacon = v.osds[&p2].beacon.clone();
    let done = m.scrub_orders_settled_by(p2, &beacon).expect("settles");
    exec_as(&mut m, &done, EntityName::mon("a")).unwrap();
    assert!(m.scrub_order(pg(2)).is_none());

    let h = m.health(&HealthInputs {
        pgmap: Some(v.clone()),
        ..Default::default()
    });
    assert_eq!(h.status, HealthStatus::Err);
    assert_eq!(
        h.check("OSD_SCRUB_ERRORS").unwrap().summary,
        "1 scrub errors"
    );
    let d = h.check("PG_DAMAGED").unwrap();
    assert_eq!(d.summary, "Possible data damage: 1 pgs inconsistent");
    let text = d.detail.join("\n");
    assert!(text.contains("pg 1.2") && text.contains("victim"), "{text}");
    assert!(text.contains("data_digest_mismatch"), "{text}");
    let mut q = qctx();
    q.runtime.health.pgmap = Some(v);
    let cmd = parse_command(&words("rados list-inconsistent-obj 1.2")).unwrap();
    let l = m.query(&cmd, &q).unwrap();
    assert!(l.plain.contains("victim"), "{}", l.plain);
    let dump = m.query(&MonCommand::PgDump { brief: false }, &q).unwrap();
    assert!(dump.plain.contains("SCRUB_STAMP"), "{}", dump.plain);
}
