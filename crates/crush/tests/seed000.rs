//! The three-host cluster of seed write-up 000 (Alecto, Megaera, Tisiphone;
//! six 5.458 TiB hdd + one 0.91 TiB ssd each) with its `ec-rule` (take
//! default class hdd; choose indep 3 type host; choose indep 2 type osd).
//! crushtool printed `CRUSH rule 1 x 1 [9,16,8,13,5,0]` in that write-up.

mod common;

use cairn_crush::tester::{run_test, TestOptions};
use cairn_crush::CrushMap;
use std::collections::BTreeMap;

fn seed_map() -> CrushMap {
    CrushMap::parse_text(include_str!("data/seed000.txt")).expect("seed map parses")
}

#[test]
fn ec_rule_reproduces_the_write_up() {
    let map = seed_map();
    assert_eq!(map.rule_id("ec-rule"), Some(1));
    assert_eq!(map.do_rule(1, 1, 6, &[]), vec![9, 16, 8, 13, 5, 0]);
    let opts = TestOptions {
        rule: Some(1),
        num_rep: Some((6, 6)),
        min_x: 1,
        max_x: 1,
        show_mappings: true,
        ..TestOptions::default()
    };
    assert_eq!(run_test(&map, &opts), "CRUSH rule 1 x 1 [9,16,8,13,5,0]\n");
}

#[test]
fn ids_follow_the_natural_order() {
    let map = seed_map();
    let hdd = map.class_id("hdd").expect("hdd class");
    assert_eq!(map.item_id("default"), Some(-1));
    assert_eq!(map.shadow_of(-1, hdd), Some(-2));
    for (host, id, shadow) in [
        ("Alecto", -3, -4),
        ("Megaera", -6, -7),
        ("Tisiphone", -9, -10),
    ] {
        assert_eq!(map.item_id(host), Some(id));
        assert_eq!(map.shadow_of(id, hdd), Some(shadow));
        assert_eq!(map.item_name(shadow), Some(format!("{host}~hdd").as_str()));
    }
}

#[test]
fn every_ec_mapping_has_six_distinct_hdds_two_per_host() {
    let map = seed_map();
    let mut ws = cairn_crush::Workspace::new(&map);
    let mut out = Vec::new();
    for x in 0..10_000u32 {
        map.do_rule_into(&mut ws, 1, x, 6, &[], &mut out);
        assert_eq!(out.len(), 6, "x {x}: {out:?}");
        let mut seen = out.clone();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 6, "x {x}: duplicate OSDs in {out:?}");
        let mut per_host: BTreeMap<String, usize> = BTreeMap::new();
        for &o in &out {
            assert_eq!(
                map.device_class(o),
                Some("hdd"),
                "x {x}: osd.{o} is not hdd"
            );
            let host = map.parent_of_type(o, "host").expect("osd has a host");
            *per_host.entry(host).or_default() += 1;
        }
        assert_eq!(per_host.len(), 3, "x {x}: {per_host:?}");
        assert!(per_host.values().all(|&n| n == 2), "x {x}: {per_host:?}");
        // Pairs come host by host, as the two choose steps emit them.
        for pair in out.chunks(2) {
            assert_eq!(
                map.parent_of_type(pair[0], "host"),
                map.parent_of_type(pair[1], "host")
            );
        }
    }
}

#[test]
fn seed_map_agrees_with_crushtool_on_all_rules() {
    if !common::crushtool_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let text = include_str!("data/seed000.txt");
    let bin = common::crushtool_compile(dir.path(), "seed000", text);
    let map = seed_map();
    for (rule, reps) in [(0, 3), (1, 6), (2, 3)] {
        let theirs = common::crushtool(&[
            "-i",
            &bin,
            "--test",
            "--rule",
            &rule.to_string(),
            "--num-rep",
            &reps.to_string(),
            "--min-x",
            "0",
            "--max-x",
            "9999",
            "--show-mappings",
        ]);
        let opts = TestOptions {
            rule: Some(rule),
            num_rep: Some((reps, reps)),
            min_x: 0,
            max_x: 9999,
            show_mappings: true,
            ..TestOptions::default()
        };
        assert!(
            theirs == run_test(&map, &opts),
            "rule {rule} differs from crushtool"
        );
    }
    assert_eq!(common::crushtool(&["-d", &bin]), map.to_text());
}
