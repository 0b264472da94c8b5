//! Every admin command with good and bad arguments, at the library level:
//! parse, then apply (mutations) or query (reads). Failed commands must
//! leave the map untouched, epoch included (`fails` checks that).

mod common;
use cairn_map::*;
use cairn_types::{EntityName, Epoch};
use common::*;

#[test]
fn status_health_quorum_and_mon_reads() {
    let mut m = cluster(3, 1);
    let s = ok(&mut m, "status");
    assert!(s.contains("cluster:") && s.contains("services:") && s.contains("data:"));
    assert!(s.contains("health: HEALTH_OK"), "{s}");
    assert!(s.contains("mon: 1 daemons, quorum a (age 2h)"), "{s}");
    assert!(s.contains("osd: 3 osds: 3 up, 3 in"), "{s}");
    assert_eq!(ok(&mut m, "-s"), s);
    assert_eq!(ok(&mut m, "health"), "HEALTH_OK\n");
    assert_eq!(ok(&mut m, "health detail"), "HEALTH_OK\n");
    let q = run(&mut m, "quorum_status").unwrap();
    assert_eq!(q.json["quorum_leader_name"], "a");
    assert_eq!(q.json["quorum_names"][0], "a");
    let st = ok(&mut m, "mon stat");
    assert!(
        st.contains("1 mons at {a=127.0.0.1:6789}, leader 0 a, quorum 0 a"),
        "{st}"
    );
    assert!(ok(&mut m, "mon dump").contains("0: 127.0.0.1:6789 mon.a"));
    assert!(fails(&mut m, "health everything").contains("usage"));
    assert!(fails(&mut m, "status now").contains("usage"));
    assert!(fails(&mut m, "mon stat x").contains("cairn mon stat"));
    assert!(fails(&mut m, "mon frob").contains("unknown mon command"));
}

#[test]
fn mon_add_and_remove() {
    let mut m = new_map();
    let e = m.epoch;
    ok(&mut m, "mon add b 127.0.0.2:6789");
    assert_eq!(m.epoch, e.next());
    ok(&mut m, "mon add c 127.0.0.3:6789");
    assert_eq!(
        m.mons.iter().map(|x| x.rank).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    // Same again: no change.
    let e = m.epoch;
    ok(&mut m, "mon add c 127.0.0.3:6789");
    assert_eq!(m.epoch, e);
    assert!(fails(&mut m, "mon add c 127.0.0.9:6789").contains("already exists"));
    assert!(fails(&mut m, "mon add d 127.0.0.3:6789").contains("already used by mon.c"));
    assert!(fails(&mut m, "mon add d nowhere").contains("IP:PORT"));
    assert!(fails(&mut m, "mon add 'd d' 127.0.0.4:1").contains("invalid monitor name"));
    assert!(fails(&mut m, "mon add d").contains("usage"));
    ok(&mut m, "mon remove b");
    assert_eq!(
        m.mons
            .iter()
            .map(|x| (x.name.as_str(), x.rank))
            .collect::<Vec<_>>(),
        vec![("a", 0), ("c", 1)]
    );
    assert!(fails(&mut m, "mon remove zz").contains("does not exist"));
    ok(&mut m, "mon rm c");
    assert!(fails(&mut m, "mon remove a").contains("last monitor"));
}

#[test]
fn osd_reads() {
    let mut m = cluster(2, 2);
    let tree = ok(&mut m, "osd tree");
    let lines: Vec<&str> = tree.lines().collect();
    assert!(lines[0].starts_with("ID  CLASS  WEIGHT"), "{tree}");
    assert!(lines[0].ends_with("STATUS  REWEIGHT  PRI-AFF"), "{tree}");
    assert!(lines[1].contains("root default"), "{tree}");
    assert!(lines[2].contains("    host node0"), "{tree}");
    assert!(
        lines[3].contains("hdd") && lines[3].contains("osd.0") && lines[3].contains("up"),
        "{tree}"
    );
    assert_eq!(ok(&mut m, "osd ls"), "0\n1\n2\n3\n");
    assert!(ok(&mut m, "osd stat").starts_with("4 osds: 4 up, 4 in; epoch: e"));
    let dump = run(&mut m, "osd dump").unwrap();
    assert!(dump.plain.contains("max_osd 4"));
    assert!(
        dump.plain.contains("osd.3 up   in  weight 1.00000"),
        "{}",
        dump.plain
    );
    assert_eq!(dump.json["osds"].as_array().map(Vec::len), Some(4));
    assert!(fails(&mut m, "osd tree now").contains("cairn osd tree"));
    assert!(fails(&mut m, "osd frob").contains("unknown osd command"));
}

#[test]
fn osd_flags() {
    let mut m = cluster(3, 1);
    for f in [
        "noout",
        "noin",
        "noup",
        "nodown",
        "nobackfill",
        "norecover",
        "norebalance",
        "noscrub",
        "nodeep-scrub",
        "pause",
    ] {
        ok(&mut m, &format!("osd set {f}"));
    }
    assert_eq!(m.flags.len(), 10);
    let e = m.epoch;
    ok(&mut m, "osd set noout");
    assert_eq!(m.epoch, e, "setting a set flag changes nothing");
    let h = ok(&mut m, "health detail");
    assert!(
        h.contains("OSDMAP_FLAGS") && h.contains("'cairn osd unset noout'"),
        "{h}"
    );
    ok(&mut m, "osd unset noout");
    assert!(!m.flags.contains(&OsdFlag::NoOut));
    assert!(fails(&mut m, "osd set nosuch").contains("unknown flag 'nosuch'"));
    assert!(fails(&mut m, "osd set").contains("usage"));
}

#[test]
fn osd_lifecycle_down_out_in_purge() {
    let mut m = cluster(3, 1);
    ok(&mut m, "osd down 1");
    assert!(!m.osds[&1].up);
    assert_eq!(m.osds[&1].down_at, m.epoch);
    assert!(ok(&mut m, "osd down osd.1").contains("already down"));
    ok(&mut m, "osd out 1");
    assert!(!m.osds[&1].is_in);
    ok(&mut m, "osd in 1");
    assert!(m.osds[&1].is_in);
    assert!(fails(&mut m, "osd down 9").contains("osd.9 does not exist"));
    assert!(
        fails(&mut m, "osd down 1 9").contains("osd.9"),
        "all ids checked before any change"
    );
    assert!(fails(&mut m, "osd out x").contains("not an OSD id"));
    assert!(fails(&mut m, "osd in").contains("no OSD ids"));
    assert!(fails(&mut m, "osd purge 0 --yes-i-really-mean-it").contains("is up"));
    assert!(fails(&mut m, "osd purge 1").contains("--yes-i-really-mean-it"));
    ok(&mut m, "osd purge 1 --yes-i-really-mean-it");
    assert!(!m.osds.contains_key(&1));
    assert!(!m.crush.device_ids().contains(&1));
    assert!(!m.auth.contains_key(&EntityName::osd(1)));
    // The freed id is handed out again.
    assert_eq!(add_osd(&mut m, "node9", None), 1);
}

#[test]
fn internal_osd_commands() {
    let mut m = new_map();
    let new = MonCommand::OsdNew {
        uuid: "aaaaaaaa-0000-0000-0000-000000000001".into(),
        id: None,
        host: "pi1".into(),
        weight: 0.5,
        class: Some("ssd".into()),
    };
    let r = m.apply(&new, &actx()).unwrap();
    assert_eq!(r.json["osdid"], 0);
    let osd = &m.osds[&0];
    assert!(!osd.up && !osd.is_in);
    assert_eq!(osd.device_class.as_deref(), Some("ssd"));
    assert_eq!(m.crush.parent_of_type(0, "host").as_deref(), Some("pi1"));
    assert!(m.auth.contains_key(&EntityName::osd(0)));
    // Same uuid again: same id, no change.
    let e = m.epoch;
    assert_eq!(m.apply(&new, &actx()).unwrap().json["osdid"], 0);
    assert_eq!(m.epoch, e);
    // Bad uuid / host / weight.
    let bad = |uuid: &str, host: &str, weight: f64| MonCommand::OsdNew {
        uuid: uuid.into(),
        id: None,
        host: host.into(),
        weight,
        class: None,
    };
    assert!(m.apply(&bad("zz", "h", 1.0), &actx()).is_err());
    assert!(m.apply(&bad("ab-12", "a b", 1.0), &actx()).is_err());
    assert!(m.apply(&bad("ab-12", "h", -1.0), &actx()).is_err());
    assert_eq!(m.epoch, e);
    // Boot: wrong uuid refused; right one marks up and (first boot) in.
    let boot = |uuid: &str| MonCommand::OsdBoot {
        id: 0,
        uuid: uuid.into(),
        addrs: vec!["127.0.0.1:6800".into()],
        reported: OsdReported::default(),
    };
    let err = m.apply(&boot("bbbb"), &actx()).unwrap_err();
    assert!(err.to_string().contains("right disk"), "{err}");
    // An OSD may boot itself without mon write caps; not another OSD.
    let as_osd0 = actx_as(EntityName::osd(0), 1);
    m.apply(&boot("aaaaaaaa-0000-0000-0000-000000000001"), &as_osd0)
        .unwrap();
    assert!(m.osds[&0].up && m.osds[&0].is_in);
    assert_eq!(m.osds[&0].up_from, m.epoch);
    let as_osd5 = actx_as(EntityName::osd(5), 1);
    let err = m
        .apply(&boot("aaaaaaaa-0000-0000-0000-000000000001"), &as_osd5)
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::AccessDenied);
    // up_thru.
    let want = m.epoch;
    m.apply(
        &MonCommand::OsdAlive {
            id: 0,
            want,
            activating: vec![],
        },
        &as_osd0,
    )
    .unwrap();
    assert_eq!(m.osds[&0].up_thru, want);
    assert!(m
        .apply(
            &MonCommand::OsdAlive {
                id: 0,
                want: Epoch(want.0 + 5),
                activating: vec![],
            },
            &as_osd0
        )
        .is_err());
    // noup blocks boot; nodown blocks failure marking; noout blocks auto-out.
    ok(&mut m, "osd set noup");
    ok(&mut m, "osd down 0");
    let err = m
        .apply(&boot("aaaaaaaa-0000-0000-0000-000000000001"), &as_osd0)
        .unwrap_err();
    assert!(err.to_string().contains("noup"), "{err}");
    ok(&mut m, "osd unset noup");
    m.apply(&boot("aaaaaaaa-0000-0000-0000-000000000001"), &as_osd0)
        .unwrap();
    ok(&mut m, "osd set nodown");
    let err = m
        .apply(&MonCommand::OsdFailed { id: 0 }, &actx())
        .unwrap_err();
    assert!(err.to_string().contains("nodown"), "{err}");
    ok(&mut m, "osd unset nodown");
    m.apply(&MonCommand::OsdFailed { id: 0 }, &actx()).unwrap();
    assert!(!m.osds[&0].up);
    ok(&mut m, "osd set noout");
    assert!(m.apply(&MonCommand::OsdAutoOut { id: 0 }, &actx()).is_err());
    ok(&mut m, "osd unset noout");
    m.apply(&MonCommand::OsdAutoOut { id: 0 }, &actx()).unwrap();
    assert!(!m.osds[&0].is_in && m.osds[&0].auto_out);
    // An auto-out OSD comes back in when it boots.
    m.apply(&boot("aaaaaaaa-0000-0000-0000-000000000001"), &as_osd0)
        .unwrap();
    assert!(m.osds[&0].is_in);
}

#[test]
fn crush_rules() {
    let mut m = cluster(3, 2);
    ok(
        &mut m,
        "osd crush rule create-replicated fast default host hdd",
    );
    ok(
        &mut m,
        "osd crush rule create-replicated per-osd default osd",
    );
    let e = m.epoch;
    assert!(
        ok(&mut m, "osd crush rule create-replicated fast default host").contains("already exists")
    );
    assert_eq!(m.epoch, e);
    let ls = ok(&mut m, "osd crush rule ls");
    assert_eq!(ls, "replicated_rule\nfast\nper-osd\n");
    let d = run(&mut m, "osd crush rule dump fast").unwrap();
    assert_eq!(d.json["rule_name"], "fast");
    assert!(
        d.plain.contains("chooseleaf firstn 0 type host"),
        "{}",
        d.plain
    );
    assert!(fails(&mut m, "osd crush rule dump nosuch").contains("does not exist"));
    assert!(!fails(
        &mut m,
        "osd crush rule create-replicated r2 nosuchroot host"
    )
    .is_empty());
    assert!(!fails(&mut m, "osd crush rule create-replicated r2 default planet").is_empty());
    assert!(fails(
        &mut m,
        "osd crush rule create-replicated 'a b' default host"
    )
    .contains("invalid rule name"));
    assert!(fails(&mut m, "osd crush rule create-replicated r2 default").contains("usage"));
    // EC rule from a profile.
    ok(&mut m, "osd erasure-code-profile set ec21 k=2 m=1");
    ok(&mut m, "osd crush rule create-erasure ecrule ec21");
    let rules = m.crush.rules();
    let ec = rules.iter().find(|r| r.name == "ecrule").unwrap();
    assert_eq!(ec.rule_type, cairn_crush::RuleType::Erasure);
    assert!(
        fails(&mut m, "osd crush rule create-erasure r3 nosuchprofile").contains("does not exist")
    );
    // rm: in use refused; unknown is a no-op; otherwise removed.
    ok(&mut m, "osd pool create p 8 8 replicated fast");
    assert!(fails(&mut m, "osd crush rule rm fast").contains("in use by pool 'p'"));
    let e = m.epoch;
    assert!(ok(&mut m, "osd crush rule rm nosuch").contains("does not exist"));
    assert_eq!(m.epoch, e);
    ok(&mut m, "osd crush rule rm per-osd");
    assert!(m.crush.rule_id("per-osd").is_none());
}

#[test]
fn device_classes_and_weights() {
    let mut m = cluster(2, 2);
    assert!(fails(&mut m, "osd crush set-device-class ssd osd.0").contains("rm-device-class"));
    ok(&mut m, "osd crush rm-device-class osd.0 osd.1");
    assert_eq!(m.osds[&0].device_class, None);
    ok(&mut m, "osd crush set-device-class ssd osd.0 1");
    assert_eq!(m.crush.device_class(1), Some("ssd"));
    assert_eq!(m.osds[&1].device_class.as_deref(), Some("ssd"));
    let e = m.epoch;
    ok(&mut m, "osd crush set-device-class ssd osd.0");
    assert_eq!(m.epoch, e, "same class again changes nothing");
    assert!(fails(&mut m, "osd crush rm-device-class hdd osd.0").contains("has class 'ssd'"));
    ok(&mut m, "osd crush rm-device-class ssd osd.0");
    assert!(fails(&mut m, "osd crush set-device-class ssd osd.7").contains("osd.7 does not exist"));
    assert!(fails(&mut m, "osd crush set-device-class ssd").contains("no OSD ids"));
    assert!(
        fails(&mut m, "osd crush set-device-class 'a b' osd.0").contains("invalid device class")
    );
    ok(&mut m, "osd crush rm-device-class all");
    ok(&mut m, "osd crush set-device-class nvme all");
    assert!(m
        .osds
        .values()
        .all(|o| o.device_class.as_deref() == Some("nvme")));
    // CRUSH weight (TiB) and override reweight (0..1).
    ok(&mut m, "osd crush reweight osd.2 3.5");
    assert_eq!(m.osds[&2].crush_weight, 3.5);
    assert!((m.crush.device_weight(2).unwrap() - 3.5).abs() < 1e-4);
    assert!(fails(&mut m, "osd crush reweight osd.2 -1").contains("out of range"));
    assert!(fails(&mut m, "osd crush reweight osd.9 1").contains("does not exist"));
    assert!(fails(&mut m, "osd crush reweight osd.2 heavy").contains("not a weight"));
    ok(&mut m, "osd reweight 2 0.5");
    assert_eq!(m.osds[&2].reweight, 0.5);
    assert!(fails(&mut m, "osd reweight 2 1.5").contains("between 0.0 and 1.0"));
    assert!(fails(&mut m, "osd reweight 9 0.5").contains("does not exist"));
    assert!(ok(&mut m, "osd tree").contains("0.50000"));
}

#[test]
fn get_and_set_crush_map() {
    let mut m = cluster(3, 1);
    let r = run(&mut m, "osd getcrushmap -o /tmp/x").unwrap();
    assert!(r.plain.starts_with("got crush map from osdmap epoch"));
    assert!(!r.data.is_empty());
    let mut edited = cairn_crush::CrushMap::decode(&r.data).unwrap();
    edited
        .add_replicated_rule("by-osd", "default", "osd", None)
        .unwrap();
    let words = words("osd setcrushmap -i /tmp/x");
    // The CLI must supply the bytes.
    assert!(parse_command(&words)
        .unwrap_err()
        .to_string()
        .contains("not supplied"));
    let cmd = parse_command_with_input(&words, Some(&edited.encode())).unwrap();
    let e = m.epoch;
    m.apply(&cmd, &actx()).unwrap();
    assert_eq!(m.epoch, e.next());
    assert!(m.crush.rule_id("by-osd").is_some());
    // The text form is accepted too.
    let text = m.crush.to_text();
    let cmd = parse_command_with_input(&words, Some(text.as_bytes())).unwrap();
    m.apply(&cmd, &actx()).unwrap();
    // Garbage is refused, and so is a map that drops a rule a pool uses.
    let before = m.clone();
    let garbage = parse_command_with_input(&words, Some(&[0xff, 0x00, 0x13])).unwrap();
    assert!(m.apply(&garbage, &actx()).is_err());
    ok(&mut m, "osd pool create p 8 8 replicated by-osd");
    let mut dropped = m.crush.clone();
    dropped.remove_rule("by-osd").unwrap();
    let cmd = parse_command_with_input(&words, Some(&dropped.encode())).unwrap();
    let err = m.apply(&cmd, &actx()).unwrap_err();
    assert!(err.to_string().contains("pool 'p'"), "{err}");
    // A map naming an OSD the OSD map lacks is refused.
    let mut extra = before.crush.clone();
    extra
        .add_device(42, None, 1.0, &[("host", "ghost"), ("root", "default")])
        .unwrap();
    let cmd = parse_command_with_input(&words, Some(&extra.encode())).unwrap();
    assert!(m
        .apply(&cmd, &actx())
        .unwrap_err()
        .to_string()
        .contains("osd.42"));
    assert!(fails(&mut m, "osd getcrushmap extra").contains("usage"));
}

#[test]
fn erasure_code_profiles() {
    let mut m = new_map();
    ok(&mut m, "osd erasure-code-profile set ec42 k=4 m=2 crush-failure-domain=host crush-device-class=hdd stripe_unit=64K");
    let got = run(&mut m, "osd erasure-code-profile get ec42").unwrap();
    assert!(
        got.plain.contains("k=4\n") && got.plain.contains("stripe_unit=65536\n"),
        "{}",
        got.plain
    );
    assert_eq!(got.json["crush-device-class"], "hdd");
    assert_eq!(ok(&mut m, "osd erasure-code-profile ls"), "default\nec42\n");
    // Same again: no change. Different: needs --force.
    let e = m.epoch;
    ok(&mut m, "osd erasure-code-profile set ec42 k=4 m=2 crush-failure-domain=host crush-device-class=hdd stripe_unit=64K");
    assert_eq!(m.epoch, e);
    assert!(fails(&mut m, "osd erasure-code-profile set ec42 k=3 m=2").contains("--force"));
    ok(&mut m, "osd erasure-code-profile set ec42 k=3 m=2 --force");
    assert_eq!(m.ec_profiles["ec42"].k, 3);
    for (line, why) in [
        ("osd erasure-code-profile set bad k=0 m=2", "k >= 1"),
        ("osd erasure-code-profile set bad k=2 m=0", "m >= 1"),
        ("osd erasure-code-profile set bad k=20 m=13", "more than 32"),
        (
            "osd erasure-code-profile set bad k=2 m=1 l=3",
            "unknown erasure-code profile key 'l'",
        ),
        ("osd erasure-code-profile set bad k=2 m", "KEY=VALUE"),
        (
            "osd erasure-code-profile set bad plugin=shec",
            "unknown plugin",
        ),
    ] {
        let err = fails(&mut m, line);
        assert!(err.contains(why), "{line}: {err}");
    }
    assert!(fails(&mut m, "osd erasure-code-profile get nosuch").contains("does not exist"));
    ok(&mut m, "osd erasure-code-profile rm ec42");
    assert!(!m.ec_profiles.contains_key("ec42"));
    assert!(ok(&mut m, "osd erasure-code-profile rm ec42").contains("does not exist"));
    assert!(fails(&mut m, "osd erasure-code-profile rm").contains("usage"));
}

#[test]
fn pool_create_defaults_and_errors() {
    let mut m = cluster(3, 2);
    ok(&mut m, "osd pool create rbd");
    let p = m.pools.values().find(|p| p.name == "rbd").unwrap().clone();
    assert_eq!(
        (p.size, p.min_size, p.pg_num, p.pgp_num, p.crush_rule),
        (3, 2, 32, 32, 0)
    );
    assert_eq!(p.kind, PoolKind::Replicated);
    // Defaults come from central config.
    ok(&mut m, "config set global osd_pool_default_size 2");
    ok(&mut m, "config set global osd_pool_default_pg_num 16");
    ok(&mut m, "osd pool create small");
    let s = m.pools.values().find(|p| p.name == "small").unwrap();
    assert_eq!((s.size, s.min_size, s.pg_num), (2, 1, 16));
    // Pool ids are never reused.
    let ids: Vec<u64> = m.pools.keys().copied().collect();
    assert_eq!(ids, vec![1, 2]);
    // EC pool with no rule gets a generated indep rule named after the pool.
    ok(&mut m, "osd erasure-code-profile set ec21 k=2 m=1");
    ok(&mut m, "osd pool create ecdata 8 8 erasure ec21");
    let ec = m.pools.values().find(|p| p.name == "ecdata").unwrap();
    assert_eq!((ec.size, ec.min_size, ec.stripe_width), (3, 2, 8192));
    ok(
        &mut m,
        "osd erasure-code-profile set ec42 k=4 m=2 crush-failure-domain=osd",
    );
    ok(&mut m, "osd pool create ec42pool 8 8 erasure ec42");
    let ec42 = m.pool_named("ec42pool").unwrap();
    assert_eq!((ec42.size, ec42.min_size), (6, 5), "EC min_size is k+1");
    let ec = m.pool_named("ecdata").unwrap();
    assert_eq!(ec.ec_profile.as_deref(), Some("ec21"));
    assert_eq!(m.crush.rule_id("ecdata"), Some(ec.crush_rule));
    // Existing pool of the same type: no change.
    let e = m.epoch;
    assert!(ok(&mut m, "osd pool create rbd 64").contains("already exists"));
    assert_eq!(m.epoch, e);
    assert!(fails(&mut m, "osd pool create rbd 8 8 erasure")
        .contains("already exists as a replicated pool"));
    assert!(fails(&mut m, "osd pool create x 0").contains("between 1 and"));
    assert!(fails(&mut m, "osd pool create x 8 16").contains("pgp_num 16 is larger"));
    assert!(fails(&mut m, "osd pool create x 8 8 replicated nosuchrule").contains("does not exist"));
    assert!(
        fails(&mut m, "osd pool create x 8 8 replicated ecdata").contains("not a replicated rule")
    );
    assert!(fails(&mut m, "osd pool create x 8 8 erasure nosuchprofile").contains("does not exist"));
    assert!(
        fails(&mut m, "osd pool create x 8 8 erasure ec21 replicated_rule")
            .contains("not a erasure rule")
    );
    assert!(fails(&mut m, "osd pool create 'bad name'").contains("invalid pool name"));
    assert!(fails(&mut m, "osd pool create x 8 8 replicated a b").contains("usage"));
    assert!(fails(&mut m, "osd pool create x 100000").contains("between 1 and 65536"));
    // mon_max_pg_per_osd guards against absurd PG counts.
    assert!(fails(&mut m, "osd pool create huge 65536").contains("mon_max_pg_per_osd"));
    // Size 1 needs both the config switch and the flag.
    ok(&mut m, "config set global osd_pool_default_size 1");
    assert!(fails(&mut m, "osd pool create one").contains("mon_allow_pool_size_one"));
    ok(&mut m, "config set global mon_allow_pool_size_one true");
    ok(&mut m, "osd pool create one");
}

#[test]
fn pool_set_get_each_key() {
    let mut m = cluster(3, 2);
    ok(&mut m, "osd pool create rbd 16");
    ok(
        &mut m,
        "osd crush rule create-replicated per-osd default osd",
    );
    ok(
        &mut m,
        "osd erasure-code-profile set ec21 k=2 m=1 crush-failure-domain=osd",
    );
    ok(&mut m, "osd pool create ec 8 8 erasure ec21");
    let pool = |m: &ClusterMap, n: &str| m.pools.values().find(|p| p.name == n).unwrap().clone();
    ok(&mut m, "osd pool set rbd size 2");
    assert_eq!(pool(&m, "rbd").size, 2);
    assert_eq!(pool(&m, "rbd").min_size, 2, "min_size clamped to size");
    ok(&mut m, "osd pool set rbd min_size 1");
    ok(&mut m, "osd pool set rbd pg_num 16"); // unchanged: accepted
    ok(&mut m, "osd pool set rbd pgp_num 4");
    assert_eq!((pool(&m, "rbd").pg_num, pool(&m, "rbd").pgp_num), (16, 4));
    ok(&mut m, "osd pool set rbd crush_rule per-osd");
    assert_eq!(Some(pool(&m, "rbd").crush_rule), m.crush.rule_id("per-osd"));
    ok(&mut m, "osd pool set rbd bulk true");
    ok(&mut m, "osd pool set rbd target_size_ratio 0.2");
    ok(&mut m, "osd pool set rbd quota_max_bytes 10G");
    assert_eq!(pool(&m, "rbd").quota_max_bytes, 10 << 30);
    ok(&mut m, "osd pool set-quota rbd max_objects 1000");
    assert_eq!(pool(&m, "rbd").quota_max_objects, 1000);
    ok(&mut m, "osd pool set ec allow_ec_overwrites true");
    assert!(pool(&m, "ec").allow_ec_overwrites);
    ok(&mut m, "osd pool set ec min_size 2");
    let e = m.epoch;
    assert!(ok(&mut m, "osd pool set rbd bulk true").contains("already"));
    assert_eq!(m.epoch, e);
    let got = run(&mut m, "osd pool get rbd all").unwrap();
    for k in [
        "size: 2",
        "min_size: 1",
        "pg_num: 16",
        "pgp_num: 4",
        "crush_rule: per-osd",
        "bulk: true",
        "target_size_ratio: 0.2",
        "quota_max_bytes: 10737418240",
        "quota_max_objects: 1000",
    ] {
        assert!(got.plain.contains(k), "missing '{k}' in {}", got.plain);
    }
    assert_eq!(ok(&mut m, "osd pool get rbd size"), "size: 2\n");
    assert_eq!(
        run(&mut m, "osd pool get ec allow_ec_overwrites")
            .unwrap()
            .json["allow_ec_overwrites"],
        true
    );
    let line = ok(&mut m, "osd pool ls detail");
    assert!(
        line.contains("pool 1 'rbd' replicated size 2 min_size 1 crush_rule 1"),
        "{line}"
    );
    assert!(
        line.contains("flags hashpspool,bulk max_bytes 10737418240 max_objects 1000"),
        "{line}"
    );
    assert!(
        line.contains("'ec' erasure profile ec21 size 3 min_size 2"),
        "{line}"
    );
    assert!(line.contains("flags hashpspool,ec_overwrites"), "{line}");
    assert_eq!(ok(&mut m, "osd pool ls"), "rbd\nec\n");
    for (l, why) in [
        ("osd pool set rbd size 0", "between 1 and 10"),
        ("osd pool set rbd size 11", "between 1 and 10"),
        ("osd pool set rbd size 1", "mon_allow_pool_size_one"),
        ("osd pool set rbd size x", "whole number"),
        ("osd pool set rbd min_size 3", "between 1 and its size 2"),
        ("osd pool set ec size 4", "cannot change"),
        ("osd pool set ec min_size 1", "between 2 and its size 3"),
        ("osd pool set rbd pg_num 0", "between 1 and"),
        ("osd pool set rbd pg_num 64", "not supported yet"),
        ("osd pool set rbd pgp_num 64", "cannot exceed pg_num"),
        ("osd pool set rbd crush_rule nosuch", "does not exist"),
        ("osd pool set rbd crush_rule ec", "not a replicated rule"),
        ("osd pool set rbd allow_ec_overwrites true", "replicated"),
        (
            "osd pool set ec allow_ec_overwrites false",
            "cannot be disabled",
        ),
        ("osd pool set rbd bulk maybe", "not a boolean"),
        ("osd pool set rbd target_size_ratio -1", ">= 0"),
        ("osd pool set rbd quota_max_bytes lots", "not a size"),
        (
            "osd pool set rbd colour blue",
            "unknown pool setting 'colour'",
        ),
        ("osd pool set nosuch size 3", "pool 'nosuch' does not exist"),
        ("osd pool set rbd size", "usage"),
        ("osd pool get rbd colour", "not a setting"),
        ("osd pool get nosuch size", "does not exist"),
    ] {
        let err = fails(&mut m, l);
        assert!(err.contains(why), "{l}: {err}");
    }
    // Size 1 with both switches.
    ok(&mut m, "config set global mon_allow_pool_size_one true");
    ok(&mut m, "osd pool set rbd size 1 --yes-i-really-mean-it");
}

#[test]
fn pool_application_and_delete() {
    let mut m = cluster(3, 1);
    ok(&mut m, "osd pool create rbd 8");
    ok(&mut m, "osd pool application enable rbd rbd");
    assert!(ok(&mut m, "osd pool ls detail").contains("application rbd"));
    let e = m.epoch;
    assert!(ok(&mut m, "osd pool application enable rbd rbd").contains("already enabled"));
    assert_eq!(m.epoch, e);
    assert!(fails(&mut m, "osd pool application enable nosuch rbd").contains("does not exist"));
    assert!(fails(&mut m, "osd pool application enable rbd 'x y'").contains("invalid application"));
    assert!(fails(&mut m, "osd pool application enable rbd").contains("usage"));
    // Delete: needs the name twice, the flag, and mon_allow_pool_delete.
    assert!(fails(&mut m, "osd pool delete rbd").contains("pass the pool name twice"));
    assert!(fails(
        &mut m,
        "osd pool delete rbd other --yes-i-really-really-mean-it"
    )
    .contains("twice"));
    let err = fails(
        &mut m,
        "osd pool delete rbd rbd --yes-i-really-really-mean-it",
    );
    assert!(
        err.contains("cairn config set mon mon_allow_pool_delete true"),
        "{err}"
    );
    assert!(fails(&mut m, "osd pool delete rbd rbd --yes").contains("unknown option"));
    ok(&mut m, "config set mon mon_allow_pool_delete true");
    ok(
        &mut m,
        "osd pool delete rbd rbd --yes-i-really-really-mean-it",
    );
    assert!(m.pools.is_empty());
    let e = m.epoch;
    assert!(
        ok(&mut m, "osd pool rm rbd rbd --yes-i-really-really-mean-it").contains("does not exist")
    );
    assert_eq!(m.epoch, e);
    // A new pool gets a new id.
    ok(&mut m, "osd pool create rbd 8");
    assert_eq!(m.pools.keys().copied().collect::<Vec<_>>(), vec![2]);
}

#[test]
fn auth_commands_and_caps_checks() {
    let mut m = cluster(3, 1);
    let r = run(&mut m, "auth get-or-create client.ro mon 'allow r'").unwrap();
    assert!(r.plain.starts_with("[client.ro]\n\tkey = "), "{}", r.plain);
    assert!(r.plain.contains("caps mon = \"allow r\""));
    let key = m.auth[&EntityName::client("ro")].key.clone();
    assert_eq!(decode_secret(&key).unwrap(), vec![7u8; 32]);
    // get-or-create again returns the same key without change.
    let e = m.epoch;
    let again = run(&mut m, "auth get-or-create client.ro mon 'allow r'").unwrap();
    assert_eq!(again.plain, r.plain);
    assert_eq!(m.epoch, e);
    assert!(fails(&mut m, "auth get-or-create client.ro mon 'allow rw'").contains("caps differ"));
    // client.ro can read status but not create pools or read keys.
    let ro = EntityName::client("ro");
    assert!(run_as(&mut m, "status", ro.clone()).is_ok());
    assert!(run_as(&mut m, "osd tree", ro.clone()).is_ok());
    let before = m.clone();
    let err = run_as(&mut m, "osd pool create rbd 8", ro.clone()).unwrap_err();
    assert!(
        err.contains("access denied") && err.contains("mon 'rw'"),
        "{err}"
    );
    assert!(
        err.contains("cairn auth caps client.ro mon 'allow rw'"),
        "{err}"
    );
    assert!(run_as(&mut m, "auth ls", ro.clone())
        .unwrap_err()
        .contains("access denied"));
    assert!(run_as(
        &mut m,
        "config set mon mon_allow_pool_delete true",
        ro.clone()
    )
    .is_err());
    assert_eq!(m, before);
    // Unknown entities are refused with a hint.
    let err = run_as(&mut m, "status", EntityName::client("ghost")).unwrap_err();
    assert!(err.contains("has no key"), "{err}");
    // Monitors in the map may do anything.
    assert!(run_as(&mut m, "osd set noout", EntityName::mon("a")).is_ok());
    assert!(run_as(&mut m, "osd set noout", EntityName::mon("zz")).is_err());
    // caps: rw lets client.ro create pools.
    ok(
        &mut m,
        "auth caps client.ro mon 'allow rw' osd 'allow rw pool=rbd'",
    );
    assert!(run_as(&mut m, "osd pool create rbd 8", ro.clone()).is_ok());
    assert!(m.auth[&ro].caps["osd"].contains("pool=rbd"));
    assert!(
        fails(&mut m, "auth caps client.ro mon 'allow profile osd'").contains("not a permission")
    );
    assert!(fails(&mut m, "auth caps client.ro mon 'profile osd'").contains("not supported yet"));
    assert!(fails(&mut m, "auth caps client.ro disk 'allow r'").contains("unknown service"));
    assert!(fails(&mut m, "auth caps client.ro mon").contains("pairs"));
    assert!(fails(&mut m, "auth caps client.nobody mon 'allow r'").contains("does not exist"));
    assert!(fails(
        &mut m,
        "auth get-or-create client.x mon 'allow r' mon 'allow w'"
    )
    .contains("twice"));
    assert!(fails(&mut m, "auth get-or-create bogus.x").contains("invalid entity name"));
    // ls / get / del.
    let ls = ok(&mut m, "auth ls");
    assert!(
        ls.contains("client.ro\n\tkey: ") && ls.contains("caps: [mon] allow rw"),
        "{ls}"
    );
    assert!(ok(&mut m, "auth get client.ro").contains("[client.ro]"));
    assert!(fails(&mut m, "auth get client.nobody").contains("does not exist"));
    ok(&mut m, "auth del client.ro");
    assert!(!m.auth.contains_key(&ro));
    assert!(fails(&mut m, "auth del client.ro").contains("does not exist"));
    assert!(fails(&mut m, "auth del client.admin").contains("the key this command was sent with"));
    // A new entity needs a secret from the proposing monitor.
    let cmd = parse_command(&words("auth get-or-create client.new")).unwrap();
    let no_secret = ApplyContext {
        caller: admin(),
        generated_secret: None,
    };
    assert!(m
        .apply(&cmd, &no_secret)
        .unwrap_err()
        .to_string()
        .contains("no secret"));
}

#[test]
fn central_config() {
    let mut m = new_map();
    ok(&mut m, "config set global osd_pool_default_size 2");
    ok(&mut m, "config set osd 'osd memory target' 2G");
    ok(&mut m, "config set osd.3 osd_memory_target 512M");
    assert_eq!(
        ok(&mut m, "config get osd.3 osd_memory_target"),
        "536870912\n"
    );
    assert_eq!(
        ok(&mut m, "config get osd.1 osd_memory_target"),
        "2147483648\n"
    );
    assert_eq!(ok(&mut m, "config get mon osd_pool_default_size"), "2\n");
    // Defaults show when nothing is set.
    assert_eq!(
        ok(&mut m, "config get mon mon_osd_down_out_interval"),
        "600\n"
    );
    let all = ok(&mut m, "config get osd.3");
    assert!(
        all.contains("osd_memory_target") && all.contains("osd.3"),
        "{all}"
    );
    let dump = ok(&mut m, "config dump");
    assert!(dump.starts_with("WHO"), "{dump}");
    assert!(dump.contains("osd.3") && dump.contains("536870912"));
    // tell TYPE.* config set = config set TYPE.
    ok(&mut m, "tell mon.* config set mon_allow_pool_delete true");
    assert_eq!(
        m.config
            .get(&("mon".into(), "mon_allow_pool_delete".into()))
            .map(String::as_str),
        Some("true")
    );
    ok(&mut m, "tell osd.2 config set osd_max_backfills 3");
    assert!(m
        .config
        .contains_key(&("osd.2".into(), "osd_max_backfills".into())));
    for (l, why) in [
        ("config set global osd_pool_default_size 0", "out of range"),
        (
            "config set global osd_pool_default_size three",
            "whole number",
        ),
        (
            "config set global mon_allow_pool_delete maybe",
            "true or false",
        ),
        ("config set osd osd_memory_target 1K", "out of range"),
        (
            "config set global osd_pool_default_sise 3",
            "did you mean 'osd_pool_default_size'",
        ),
        ("config set planet osd_max_backfills 2", "section 'planet'"),
        ("config set osd/class:ssd osd_max_backfills 2", "masks"),
        ("config set global", "usage"),
        ("config get osd.3 no_such_key", "not set"),
        ("tell mon.* injectargs --x", "config set"),
        ("config set global 'a=b' 1 --force", "invalid config key"),
    ] {
        let err = fails(&mut m, l);
        assert!(err.contains(why), "{l}: {err}");
    }
    ok(
        &mut m,
        "config set client rbd_cache_policy writeback --force",
    );
    assert_eq!(
        ok(&mut m, "config get client.admin rbd_cache_policy"),
        "writeback\n"
    );
    ok(&mut m, "config rm osd.3 osd_memory_target");
    assert_eq!(
        ok(&mut m, "config get osd.3 osd_memory_target"),
        "2147483648\n"
    );
    let e = m.epoch;
    assert!(ok(&mut m, "config rm osd.3 osd_memory_target").contains("was not set"));
    assert_eq!(m.epoch, e);
}

#[test]
fn unknown_and_malformed_commands() {
    let mut m = new_map();
    for l in [
        "",
        "frob",
        "osd pool frob",
        "osd crush frob",
        "auth frob",
        "config frob",
        "osd erasure-code-profile frob",
    ] {
        let err = fails(&mut m, l);
        assert!(err.contains("cairn"), "{l}: {err}");
    }
    // Queries cannot be applied and mutations cannot be queried.
    assert!(m.apply(&MonCommand::Status, &actx()).is_err());
    assert!(m
        .query(
            &MonCommand::OsdSetFlag {
                flag: OsdFlag::NoOut
            },
            &qctx()
        )
        .is_err());
}

#[test]
fn limits_are_enforced() {
    let mut m = cluster(2, 1);
    let existing = m.crush.rules().len();
    for i in existing..CRUSH_RULES_MAX {
        ok(
            &mut m,
            &format!("osd crush rule create-replicated r{i} default osd"),
        );
    }
    let err = fails(
        &mut m,
        "osd crush rule create-replicated one-more default osd",
    );
    assert!(err.contains("the most Cairn allows"), "{err}");
    // An EC pool needing a generated rule is refused too, without a trace.
    let err = fails(&mut m, "osd pool create ecp 8 8 erasure");
    assert!(err.contains("CRUSH rules"), "{err}");
    let boot = MonCommand::OsdBoot {
        id: 0,
        uuid: m.osds[&0].uuid.clone(),
        addrs: vec!["127.0.0.1:1".into(); OSD_ADDRS_MAX + 1],
        reported: OsdReported::default(),
    };
    assert!(m.apply(&boot, &actx()).is_err());
}

#[test]
fn pg_map_and_print_key() {
    let mut m = cluster(3, 1);
    ok(&mut m, "osd pool create rbd 32");
    let r = run(&mut m, "pg map 1.1f").unwrap();
    assert!(
        r.plain
            .starts_with(&format!("osdmap e{} pg 1.1f (1.1f) -> up [", m.epoch.0)),
        "{}",
        r.plain
    );
    assert_eq!(r.json["up"].as_array().map(Vec::len), Some(3));
    assert_eq!(r.json["up_primary"], r.json["up"][0]);
    assert!(fails(&mut m, "pg map 1.20").contains("pg_num 32"));
    assert!(fails(&mut m, "pg map 9.0").contains("does not exist"));
    assert!(fails(&mut m, "pg map x").contains("invalid pg id"));
    let key = ok(&mut m, "auth print-key client.admin");
    assert_eq!(key.trim(), m.auth[&admin()].key);
    assert!(fails(&mut m, "auth print-key client.nobody").contains("does not exist"));
    let ro = cairn_types::EntityName::client("ro");
    ok(&mut m, "auth get-or-create client.ro mon 'allow r'");
    assert!(run_as(&mut m, "auth print-key client.admin", ro)
        .unwrap_err()
        .contains("access denied"));
}

#[test]
fn boot_retry_is_idempotent_and_restart_starts_new_interval() {
    let mut m = cluster(3, 1);
    let uuid = m.osds[&0].uuid.clone();
    let boot = |boot_id: u64| MonCommand::OsdBoot {
        id: 0,
        uuid: uuid.clone(),
        addrs: vec!["127.0.0.1:6800".into()],
        reported: OsdReported {
            boot_id,
            ..Default::default()
        },
    };
    m.apply(&boot(5), &actx()).unwrap();
    let (e, up_from) = (m.epoch, m.osds[&0].up_from);
    let r = m.apply(&boot(5), &actx()).unwrap();
    assert!(r.plain.contains("already up"));
    assert_eq!(m.epoch, e, "a retried boot changes nothing");
    m.apply(&boot(6), &actx()).unwrap();
    assert_eq!(m.epoch, e.next());
    assert!(
        m.osds[&0].up_from > up_from,
        "a restart starts a new interval"
    );
    assert_eq!(m.osds[&0].down_at, m.epoch);
}
