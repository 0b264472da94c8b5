//! Pure decisions taken from the map: PG placement, failure judgement and
//! automatic mark-out.

mod common;
use cairn_crush::CRUSH_ITEM_NONE;
use cairn_map::*;
use common::*;
use std::collections::{BTreeMap, BTreeSet};

#[test]
fn pg_placement_spreads_over_hosts_and_drops_down_osds() {
    let mut m = cluster(3, 2);
    ok(&mut m, "osd pool create rbd 64");
    ok(&mut m, "osd erasure-code-profile set ec21 k=2 m=1");
    ok(&mut m, "osd pool create ec 16 16 erasure ec21");
    let mut used = BTreeSet::new();
    for seed in 0..64 {
        let pg = m.pg_to_up(1, seed).unwrap();
        assert_eq!(pg.up.len(), 3);
        let hosts: BTreeSet<_> = pg.up.iter().map(|o| m.osds[o].host.clone()).collect();
        assert_eq!(hosts.len(), 3, "PG 1.{seed:x} not on 3 hosts: {:?}", pg.up);
        assert_eq!(pg.primary, Some(pg.up[0]));
        assert_eq!(
            m.pg_to_up(1, seed).unwrap(),
            pg,
            "placement must be deterministic"
        );
        used.extend(pg.up);
    }
    assert_eq!(used.len(), 6, "every OSD should get some PGs");
    let all = m.pool_pg_mappings(1).unwrap();
    assert_eq!(all.len(), 64);
    assert_eq!(all[7], m.pg_to_up(1, 7).unwrap());
    assert!(m
        .pg_to_up(1, 64)
        .unwrap_err()
        .to_string()
        .contains("pg_num 64"));
    assert!(m.pg_to_up(99, 0).is_err());
    // A down OSD leaves replicated up sets and leaves holes in EC ones.
    let victim = m.pg_to_up(1, 0).unwrap().up[0];
    let ec_before = m.pg_to_up(2, 0).unwrap();
    ok(&mut m, &format!("osd down {victim}"));
    let after = m.pg_to_up(1, 0).unwrap();
    assert_eq!(after.up.len(), 2);
    assert!(!after.up.contains(&victim));
    assert_ne!(after.primary, Some(victim));
    let ec_after = m.pg_to_up(2, 0).unwrap();
    for (i, o) in ec_before.up.iter().enumerate() {
        let want = if *o == victim { CRUSH_ITEM_NONE } else { *o };
        assert_eq!(ec_after.up[i], want);
    }
}

#[test]
fn failure_reports_need_distinct_hosts() {
    let mut m = cluster(3, 2);
    // osd.0 and osd.1 are on node0, 2 and 3 on node1, 4 and 5 on node2.
    assert!(
        !m.failure_reports_suffice(0, &[1]),
        "same-host reporter alone"
    );
    assert!(
        !m.failure_reports_suffice(0, &[2, 3]),
        "two reporters, one host"
    );
    assert!(m.failure_reports_suffice(0, &[1, 2]));
    assert!(m.failure_reports_suffice(0, &[2, 4]));
    assert!(
        !m.failure_reports_suffice(0, &[0, 0]),
        "self reports do not count"
    );
    ok(&mut m, "osd set nodown");
    assert!(!m.failure_reports_suffice(0, &[2, 4]));
    ok(&mut m, "osd unset nodown");
    ok(&mut m, "config set mon mon_osd_min_down_reporters 3");
    assert!(!m.failure_reports_suffice(0, &[2, 4]));
    // Two hosts with one OSD each: the only peer's report suffices.
    let small = cluster(2, 1);
    assert!(small.failure_reports_suffice(0, &[1]));
}

#[test]
fn auto_out_respects_interval_noout_subtree_and_min_in_ratio() {
    let mut m = cluster(4, 2);
    ok(&mut m, "osd down 0 2");
    let long: BTreeMap<i32, u64> = [(0, 601), (2, 601)].into_iter().collect();
    let short: BTreeMap<i32, u64> = [(0, 10), (2, 10)].into_iter().collect();
    assert_eq!(m.auto_out_candidates(&long), vec![0, 2]);
    assert!(m.auto_out_candidates(&short).is_empty());
    ok(&mut m, "osd set noout");
    assert!(m.auto_out_candidates(&long).is_empty());
    ok(&mut m, "osd unset noout");
    ok(&mut m, "config set mon mon_osd_down_out_interval 0");
    assert!(m.auto_out_candidates(&long).is_empty());
    ok(&mut m, "config rm mon mon_osd_down_out_interval");
    // A whole host down is not marked out when the subtree limit is host.
    ok(&mut m, "osd down 1");
    let host: BTreeMap<i32, u64> = [(0, 601), (1, 601), (2, 601)].into_iter().collect();
    assert_eq!(
        m.auto_out_candidates(&host),
        vec![2],
        "default limit is host"
    );
    // Never below mon_osd_min_in_ratio of OSDs in (8 OSDs, 0.75 -> at most 2 out).
    ok(&mut m, "config set mon mon_osd_down_out_subtree_limit rack");
    assert_eq!(m.auto_out_candidates(&host), vec![0, 1]);
    // Applying the decision goes through OsdAutoOut.
    for id in m.auto_out_candidates(&host) {
        m.apply(&MonCommand::OsdAutoOut { id }, &actx()).unwrap();
    }
    assert!(!m.osds[&0].is_in && !m.osds[&1].is_in && m.osds[&2].is_in);
}
