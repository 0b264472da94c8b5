//! `pg_temp` (set by a primary, cleared automatically), `osd lost`, and the
//! flags and subtree limit the monitors honour when deciding up/down/in/out.

mod common;
use cairn_map::*;
use cairn_types::{EntityName, PgId, PoolId};
use common::*;
use std::collections::BTreeMap;

fn pg(seed: u32) -> PgId {
    PgId {
        pool: PoolId(1),
        seed,
    }
}

fn temp(m: &mut ClusterMap, from: i32, pgid: PgId, osds: &[i32]) -> Result<Reply, String> {
    exec_as(
        m,
        &MonCommand::PgTemp {
            from,
            pgid,
            osds: osds.to_vec(),
        },
        EntityName::osd(from),
    )
}

#[test]
fn pg_temp_sets_acting_and_clears_itself() {
    let mut m = cluster(4, 1);
    ok(&mut m, "osd pool create rbd 16");
    let before = m.pg_to_up(1, 0).unwrap();
    assert_eq!(before.acting, before.up);
    assert_eq!(before.acting_primary, before.primary);
    let primary = before.primary.unwrap();
    // The primary moves out: the up set changes, the old set keeps serving.
    let leaving = before.up[1];
    ok(&mut m, &format!("osd out {leaving}"));
    let moved = m.pg_to_up(1, 0).unwrap();
    assert!(!moved.up.contains(&leaving));
    let e = m.epoch;
    temp(&mut m, primary, pg(0), &before.up).expect("primary sets pg_temp");
    assert_eq!(m.epoch, e.next());
    let now = m.pg_to_up(1, 0).unwrap();
    assert_eq!(now.up, moved.up);
    assert_eq!(now.acting, before.up);
    assert_eq!(now.acting_primary, Some(primary));
    let shown = ok(&mut m, "pg map 1.0");
    assert!(shown.contains(&format!(
        "acting [{}]",
        before
            .up
            .iter()
            .map(|o| o.to_string())
            .collect::<Vec<_>>()
            .join(",")
    )));
    // Only the primary may ask; nobody else changes it.
    let other = *m.osds.keys().find(|o| !before.up.contains(o)).unwrap();
    let before_map = m.clone();
    assert!(temp(&mut m, other, pg(0), &[other]).is_err());
    assert_eq!(m, before_map);
    // Bad input: an unknown OSD, a repeat.
    assert!(temp(&mut m, primary, pg(0), &[primary, 99]).is_err());
    assert!(temp(&mut m, primary, pg(0), &[primary, primary]).is_err());
    assert_eq!(m, before_map);
    // The primary clears it when backfill is done.
    temp(&mut m, primary, pg(0), &[]).expect("clear");
    assert!(m.pg_temp.is_empty());
    assert_eq!(m.pg_to_up(1, 0).unwrap().acting, moved.up);
    // Equal to up: dropped at once by the map itself.
    let up = m.pg_to_up(1, 0).unwrap();
    temp(&mut m, up.primary.unwrap(), pg(0), &up.up).expect("set");
    assert!(m.pg_temp.is_empty(), "a pg_temp equal to up is cleaned");
    // Naming a purged OSD: dropped.
    temp(&mut m, up.primary.unwrap(), pg(0), &before.up).expect("set again");
    assert!(!m.pg_temp.is_empty());
    ok(&mut m, &format!("osd down {leaving}"));
    ok(
        &mut m,
        &format!("osd purge {leaving} --yes-i-really-mean-it"),
    );
    assert!(
        m.pg_temp.is_empty(),
        "pg_temp naming a purged OSD is cleaned"
    );
}

#[test]
fn pg_temp_down_members_leave_acting() {
    let mut m = cluster(4, 1);
    ok(&mut m, "osd pool create rbd 8");
    let before = m.pg_to_up(1, 1).unwrap();
    let p = before.primary.unwrap();
    ok(&mut m, &format!("osd out {}", before.up[2]));
    temp(&mut m, p, pg(1), &before.up).unwrap();
    ok(&mut m, &format!("osd down {}", before.up[1]));
    let now = m.pg_to_up(1, 1).unwrap();
    assert_eq!(now.acting, vec![before.up[0], before.up[2]]);
}

#[test]
fn erasure_pg_temp_is_positional() {
    let mut m = cluster(4, 1);
    ok(&mut m, "osd erasure-code-profile set ec21 k=2 m=1");
    ok(&mut m, "osd pool create ec 8 8 erasure ec21");
    let before = m.pg_to_up(1, 0).unwrap();
    let p = before.primary.unwrap();
    let none = cairn_crush::CRUSH_ITEM_NONE;
    let before_map = m.clone();
    // Not one entry per shard, or no OSD at all: refused, nothing changed.
    let e = temp(&mut m, p, pg(0), &before.up[..2]).unwrap_err();
    assert!(e.contains("one entry per shard"), "{e}");
    let e = temp(&mut m, p, pg(0), &[none, none, none]).unwrap_err();
    assert!(e.contains("one entry per shard"), "{e}");
    assert_eq!(m, before_map);
    // A member moves out: the old positions keep serving.
    let leaving = before.up[1];
    ok(&mut m, &format!("osd out {leaving}"));
    let moved = m.pg_to_up(1, 0).unwrap();
    assert_ne!(moved.up[1], leaving);
    assert_eq!((moved.up[0], moved.up[2]), (before.up[0], before.up[2]));
    temp(&mut m, moved.primary.unwrap(), pg(0), &before.up).expect("positional pg_temp");
    let now = m.pg_to_up(1, 0).unwrap();
    assert_eq!(now.up, moved.up);
    assert_eq!(now.acting, before.up);
    // A hole keeps its position; a member going down leaves a hole.
    let holed = vec![before.up[0], none, before.up[2]];
    temp(&mut m, p, pg(0), &holed).expect("pg_temp with a hole");
    assert_eq!(m.pg_to_up(1, 0).unwrap().acting, holed);
    ok(&mut m, &format!("osd down {}", before.up[2]));
    let now = m.pg_to_up(1, 0).unwrap();
    assert_eq!(now.acting, vec![before.up[0], none, none]);
    assert_eq!(now.acting_primary, Some(before.up[0]));
    // Cleared by the primary: acting is up again.
    temp(&mut m, before.up[0], pg(0), &[]).expect("clear");
    let now = m.pg_to_up(1, 0).unwrap();
    assert_eq!(now.acting, now.up);
}

#[test]
fn osd_lost_needs_a_down_osd_and_confirmation() {
    let mut m = cluster(3, 1);
    let e = fails(&mut m, "osd lost 1 --yes-i-really-mean-it");
    assert!(e.contains("is up"), "{e}");
    ok(&mut m, "osd down 1");
    let e = fails(&mut m, "osd lost 1");
    assert!(e.contains("--yes-i-really-mean-it"), "{e}");
    let out = ok(&mut m, "osd lost 1 --yes-i-really-mean-it");
    assert!(out.contains("marked osd.1 lost"), "{out}");
    assert_eq!(m.lost_osds(), vec![1]);
    let out = ok(&mut m, "osd lost 1 --yes-i-really-mean-it");
    assert!(out.contains("already lost"), "{out}");
}

#[test]
fn noup_nodown_noin_are_honoured_by_the_monitors() {
    let mut m = cluster(3, 1);
    ok(&mut m, "osd set nodown");
    assert!(!m.failure_reports_suffice(0, &[1, 2]));
    let mut judge = FailureJudge::new();
    let now = std::time::Instant::now();
    assert!(judge.report(now, &m, 1, 0, true).is_none());
    assert!(judge.report(now, &m, 2, 0, true).is_none());
    ok(&mut m, "osd unset nodown");
    ok(&mut m, "osd down 0");
    ok(&mut m, "osd set noup");
    let boot = MonCommand::OsdBoot {
        id: 0,
        uuid: m.osds[&0].uuid.clone(),
        addrs: vec!["127.0.0.1:6800".into()],
        reported: OsdReported {
            boot_id: 9,
            ..Default::default()
        },
    };
    let e = m.apply(&boot, &actx()).unwrap_err().to_string();
    assert!(e.contains("noup"), "{e}");
    assert!(!m.osds[&0].up);
    ok(&mut m, "osd unset noup");
    ok(&mut m, "osd out 0");
    ok(&mut m, "osd set noin");
    ok(&mut m, "config set mon mon_osd_auto_mark_in true");
    m.apply(&boot, &actx()).unwrap();
    assert!(
        m.osds[&0].up && !m.osds[&0].is_in,
        "noin keeps a booting OSD out"
    );
}

#[test]
fn noout_and_the_subtree_limit_keep_osds_in() {
    // Two OSDs per host: a whole host down is not marked out (limit host),
    // a single OSD is.
    let mut m = cluster(3, 2);
    ok(&mut m, "config set mon mon_osd_down_out_interval 60");
    ok(&mut m, "osd down 0");
    ok(&mut m, "osd down 1");
    ok(&mut m, "osd down 2");
    let long: BTreeMap<i32, u64> = [(0, 600), (1, 600), (2, 600)].into();
    assert_eq!(
        m.auto_out_candidates(&long),
        vec![2],
        "node0 (osd.0, osd.1) is wholly down: not marked out; osd.2 alone is"
    );
    ok(&mut m, "osd set noout");
    assert!(m.auto_out_candidates(&long).is_empty());
    let e = m
        .apply(&MonCommand::OsdAutoOut { id: 2 }, &actx_as(admin(), 7))
        .unwrap_err()
        .to_string();
    assert!(e.contains("noout"), "{e}");
    ok(&mut m, "osd unset noout");
    // With the limit raised to the root, a whole host's OSDs may go out
    // too (mon_osd_min_in_ratio 0.75 of 6 stops after the first).
    ok(&mut m, "config set mon mon_osd_down_out_subtree_limit root");
    assert_eq!(m.auto_out_candidates(&long), vec![0]);
}
