//! Full disks in the map: the three ratios (defaults, `osd set-*-ratio`,
//! checked and ordered, bad input changes nothing), the marks the leader
//! records from beacons, the health checks naming the OSDs, `osd df` and
//! `osd dump`, the refusal texts the OSDs use, and reading a version-3 map.

mod common;
use cairn_map::*;
use common::*;

fn beacon(used: u64, total: u64) -> OsdBeacon {
    OsdBeacon {
        epoch: 1,
        total_bytes: total,
        used_bytes: used,
        available_bytes: total - used,
        pgs: Vec::new(),
    }
}

/// What the leader does with a beacon: proposes the mark change, if any.
fn report_usage(m: &mut ClusterMap, id: i32, used: u64, total: u64) -> bool {
    match m.fullness_change(id, &beacon(used, total)) {
        Some(cmd) => {
            m.apply(&cmd, &actx()).expect("fullness mark");
            true
        }
        None => false,
    }
}

#[test]
fn ratios_default_like_ceph_and_are_set_checked_and_ordered() {
    let mut m = cluster(3, 1);
    assert_eq!(m.full_ratios, FullRatios::default());
    let dump = ok(&mut m, "osd dump");
    assert!(
        dump.contains("full_ratio 0.95\nbackfillfull_ratio 0.9\nnearfull_ratio 0.85"),
        "{dump}"
    );
    ok(&mut m, "osd set-full-ratio 0.96");
    ok(&mut m, "osd set-backfillfull-ratio 0.92");
    ok(&mut m, "osd set-nearfull-ratio 0.8");
    assert_eq!(
        m.full_ratios,
        FullRatios {
            nearfull: 0.8,
            backfillfull: 0.92,
            full: 0.96
        }
    );
    // Bad input: a clear error and nothing changed (fails() checks the map).
    let e = fails(&mut m, "osd set-full-ratio lots");
    assert!(e.contains("not a number"), "{e}");
    let e = fails(&mut m, "osd set-full-ratio 1.5");
    assert!(e.contains("out of range"), "{e}");
    let e = fails(&mut m, "osd set-full-ratio 0.99");
    assert!(e.contains("failsafe"), "{e}");
    let e = fails(&mut m, "osd set-nearfull-ratio 0.93");
    assert!(e.contains("nearfull_ratio <= backfillfull_ratio"), "{e}");
    let e = fails(&mut m, "osd set-full-ratio 0.9");
    assert!(e.contains("order"), "{e}");
    fails(&mut m, "osd set-full-ratio");
    // The Ceph config keys point at the commands.
    let e = fails(&mut m, "config set mon mon_osd_full_ratio 0.9");
    assert!(e.contains("cairn osd set-full-ratio 0.9"), "{e}");
    let e = fails(
        &mut m,
        "config set global mon_osd_nearfull_ratio 0.7 --force",
    );
    assert!(e.contains("set-nearfull-ratio"), "{e}");
}

#[test]
fn beacons_mark_osds_and_health_names_them() {
    let mut m = cluster(4, 1);
    ok(&mut m, "osd pool create rbd 8");
    let h = m.health(&HealthInputs::default());
    assert!(h.check("OSD_FULL").is_none() && h.check("OSD_NEARFULL").is_none());
    // Below every ratio: no change proposed.
    assert!(!report_usage(&mut m, 0, 50, 100));
    assert!(report_usage(&mut m, 0, 86, 100));
    assert!(report_usage(&mut m, 1, 91, 100));
    assert!(report_usage(&mut m, 2, 96, 100));
    // Same state and whole percent: nothing to record (no epoch per beacon).
    let e = m.epoch;
    assert!(!report_usage(&mut m, 2, 9_650, 10_000));
    assert_eq!(m.epoch, e);
    // The percent moved: recorded, so errors quote a current figure.
    assert!(report_usage(&mut m, 2, 97, 100));
    assert_eq!(m.full_state(0), FullState::Nearfull);
    assert_eq!(m.full_state(1), FullState::Backfillfull);
    assert_eq!(m.full_state(2), FullState::Full);
    assert_eq!(m.full_state(3), FullState::Ok);

    let h = m.health(&HealthInputs::default());
    assert_eq!(h.status, HealthStatus::Err);
    let full = h.check("OSD_FULL").expect("OSD_FULL");
    assert_eq!(full.summary, "1 full osd(s)");
    assert!(
        full.detail[0].starts_with("osd.2 is full: 97% used") && full.detail[0].contains("0.95"),
        "{:?}",
        full.detail
    );
    let bf = h.check("OSD_BACKFILLFULL").expect("OSD_BACKFILLFULL");
    assert!(bf.detail[0].starts_with("osd.1 is backfillfull: 91% used"));
    let nf = h.check("OSD_NEARFULL").expect("OSD_NEARFULL");
    assert!(nf.detail[0].starts_with("osd.0 is nearfull: 86% used"));
    let detail = ok(&mut m, "health detail");
    for want in [
        "OSD_FULL",
        "OSD_BACKFILLFULL",
        "OSD_NEARFULL",
        "osd.2 is full",
    ] {
        assert!(detail.contains(want), "{want} missing from: {detail}");
    }
    let df = ok(&mut m, "osd df");
    assert!(df.contains("up,full"), "{df}");
    assert!(
        df.contains("up,backfillfull") && df.contains("up,nearfull"),
        "{df}"
    );
    let dump = ok(&mut m, "osd dump");
    assert!(dump.contains("flags full,backfillfull,nearfull"), "{dump}");
    let stat = ok(&mut m, "osd stat");
    assert!(stat.contains("full"), "{stat}");

    // What the OSDs act on.
    let why = m.full_refusal(1, &[3, 2, 0]).expect("osd.2 is full");
    assert_eq!(
        why,
        "pool 'rbd' is full: osd.2 is 97% used (full ratio 0.95); delete data or add disks"
    );
    assert!(m.full_refusal(1, &[0, 1, 3]).is_none(), "only full refuses");
    let wait = m.backfill_toofull(&[3, 1]).expect("osd.1 is backfillfull");
    assert!(
        wait.starts_with("backfill_toofull: osd.1 is 91% used"),
        "{wait}"
    );
    assert!(m.backfill_toofull(&[0, 3]).is_none());

    // Raising the full ratio re-judges the marks at once; deleting data
    // (a beacon below every ratio) clears one.
    ok(&mut m, "osd set-full-ratio 0.97");
    assert_eq!(m.full_state(2), FullState::Full);
    assert!(report_usage(&mut m, 2, 80, 100));
    assert_eq!(m.full_state(2), FullState::Ok);
    assert!(m.full_refusal(1, &[2]).is_none());
    ok(&mut m, "osd set-backfillfull-ratio 0.95");
    assert_eq!(
        m.full_state(1),
        FullState::Nearfull,
        "re-judged: 91% < 0.95"
    );
    // A purged OSD leaves no mark behind.
    ok(&mut m, "osd down 0");
    ok(&mut m, "osd purge 0 --yes-i-really-mean-it");
    assert!(!m.osd_fullness.contains_key(&0));
    // Bad reports change nothing.
    assert!(m.fullness_change(1, &beacon(0, 0)).is_none());
    let before = m.clone();
    let bad = MonCommand::OsdFullness {
        id: 1,
        used_bytes: 5,
        total_bytes: 4,
    };
    assert!(m.apply(&bad, &actx()).is_err());
    let ghost = MonCommand::OsdFullness {
        id: 42,
        used_bytes: 5,
        total_bytes: 10,
    };
    assert!(m.apply(&ghost, &actx()).is_err());
    assert_eq!(m, before);
    // Only monitors may record marks: an OSD may not mark itself.
    let own = MonCommand::OsdFullness {
        id: 1,
        used_bytes: 1,
        total_bytes: 10,
    };
    assert!(m
        .apply(&own, &actx_as(cairn_types::EntityName::osd(1), 1))
        .is_err());
}

#[test]
fn a_version_3_map_is_read_with_default_ratios() {
    let mut m = cluster(3, 1);
    ok(&mut m, "osd pool create rbd 4");
    let v5 = m.encode();
    // Version 3 is version 5 without the three trailing fields (version 4
    // added the first two, version 5 the blocklist).
    let tail = cairn_types::encode_versioned(
        MAP_FORMAT_VERSION,
        &(
            FullRatios::default(),
            std::collections::BTreeMap::<i32, OsdFullness>::new(),
            Vec::<(cairn_map::ClientInstance, cairn_map::BlocklistEntry)>::new(),
        ),
    );
    let body = &v5[1..v5.len() - (tail.len() - 1)];
    let mut v3 = vec![3u8];
    v3.extend_from_slice(body);
    let back = ClusterMap::decode(&v3).expect("v3 map");
    assert_eq!(back, m);
    assert_eq!(ClusterMap::decode(&v5).expect("v5"), m);
    let mut v2 = v3.clone();
    v2[0] = 2;
    assert!(ClusterMap::decode(&v2).is_err());
}
