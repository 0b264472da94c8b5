//! Determinism of the cluster map: the same commands give the same map on
//! every copy; replaying the logged incrementals reproduces it; failed
//! commands change nothing; the whole map survives serde round trips.

mod common;
use cairn_map::*;
use common::*;
use proptest::prelude::*;

/// Command lines exercising most verbs, including ones that fail.
const SCRIPT: &[&str] = &[
    "osd set noout",
    "osd pool create rbd 16",
    "osd pool application enable rbd rbd",
    "osd erasure-code-profile set ec21 k=2 m=1 crush-failure-domain=osd",
    "osd pool create ecp 8 8 erasure ec21",
    "osd pool set ecp allow_ec_overwrites true",
    "osd crush rule create-replicated by-osd default osd",
    "osd pool set rbd crush_rule by-osd",
    "osd crush set-device-class ssd osd.0",
    "osd crush rm-device-class osd.0",
    "osd crush set-device-class ssd osd.0",
    "osd crush reweight osd.1 2.5",
    "osd reweight 2 0.75",
    "auth get-or-create client.ro mon 'allow r'",
    "auth caps client.ro mon 'allow rw'",
    "config set osd osd_max_backfills 2",
    "config set mon mon_allow_pool_delete true",
    "osd pool delete ecp ecp --yes-i-really-really-mean-it",
    "osd down 3",
    "osd out 3",
    "osd unset noout",
    "mon add b 127.0.0.2:6789",
    "osd pool set rbd size 0",
    "osd pool create rbd 8 8 erasure",
    "auth del client.nobody",
    "config set global not_an_option 1",
];

fn run_script(map: &mut ClusterMap, lines: &[&str]) -> Vec<Incremental> {
    let mut incs = Vec::new();
    for l in lines {
        let cmd = match parse_command(&words(l)) {
            Ok(c) => c,
            Err(_) => continue,
        };
        if !cmd.is_mutation() {
            continue;
        }
        let before = map.clone();
        match map.apply_logged(&cmd, &actx()) {
            Ok((_, Some(inc))) => {
                assert_eq!(inc.epoch, before.epoch.next(), "{l}");
                incs.push(inc);
            }
            Ok((_, None)) => assert_eq!(*map, before, "{l}: no incremental but changed"),
            Err(_) => assert_eq!(*map, before, "{l}: failed but changed the map"),
        }
    }
    incs
}

#[test]
fn two_copies_agree_and_incrementals_replay() {
    let base = cluster(3, 2);
    let mut a = base.clone();
    let mut b = base.clone();
    let incs = run_script(&mut a, SCRIPT);
    run_script(&mut b, SCRIPT);
    assert_eq!(a, b);
    assert_eq!(
        a.encode(),
        b.encode(),
        "encodings differ: output depends on more than the commands"
    );
    assert!(incs.len() > 15, "{}", incs.len());
    assert_eq!(a.epoch.0, base.epoch.0 + incs.len() as u64);
    let mut replay = base.clone();
    for inc in &incs {
        replay.apply_incremental(inc).unwrap();
    }
    assert_eq!(replay, a);
    // Out of order or repeated incrementals are refused.
    let mut stale = base.clone();
    assert!(stale.apply_incremental(&incs[1]).is_err());
    assert_eq!(stale, base);
    let mut again = base.clone();
    again.apply_incremental(&incs[0]).unwrap();
    assert!(again.apply_incremental(&incs[0]).is_err());
}

#[test]
fn whole_map_round_trips() {
    let mut m = cluster(3, 2);
    run_script(&mut m, SCRIPT);
    let back = ClusterMap::decode(&m.encode()).unwrap();
    assert_eq!(back, m);
    let json = serde_json::to_string(&m).unwrap();
    let back: ClusterMap = serde_json::from_str(&json).unwrap();
    assert_eq!(back, m);
    assert!(ClusterMap::decode(&[]).is_err());
    assert!(ClusterMap::decode(&[9, 1, 2, 3]).is_err());
    let mut bad = m.encode();
    bad.truncate(bad.len() / 2);
    assert!(ClusterMap::decode(&bad).is_err());
    // Replies and incrementals cross the wire in the versioned encoding.
    let reply = run(&mut m, "osd tree").unwrap();
    let buf = cairn_types::encode_versioned(1, &reply);
    let (_, back): (u8, Reply) =
        cairn_types::decode_versioned("reply", &buf, 1, 1, 1 << 20).unwrap();
    assert_eq!(back, reply);
    let inc = Incremental {
        epoch: m.epoch.next(),
        cmd: parse_command(&words("osd pool create x 8")).unwrap(),
        ctx: actx(),
    };
    let buf = cairn_types::encode_versioned(1, &inc);
    let (_, back): (u8, Incremental) =
        cairn_types::decode_versioned("inc", &buf, 1, 1, 1 << 20).unwrap();
    assert_eq!(back, inc);
}

/// Lines the property test draws from (good and bad, all verbs that change the map).
const POOL: &[&str] = &[
    "osd set noout",
    "osd unset noout",
    "osd set pause",
    "osd pool create p1 8",
    "osd pool create p2 16 16",
    "osd pool create p1 8 8 erasure",
    "osd pool set p1 size 2",
    "osd pool set p1 pg_num 32",
    "osd pool set p1 min_size 5",
    "osd pool set p2 bulk true",
    "osd pool application enable p1 rbd",
    "config set mon mon_allow_pool_delete true",
    "config rm mon mon_allow_pool_delete",
    "osd pool delete p1 p1 --yes-i-really-really-mean-it",
    "osd erasure-code-profile set e k=2 m=1 crush-failure-domain=osd",
    "osd erasure-code-profile rm e",
    "osd pool create pe 8 8 erasure e",
    "osd crush rule create-replicated r1 default osd",
    "osd crush rule rm r1",
    "osd pool set p2 crush_rule r1",
    "osd crush set-device-class ssd osd.1",
    "osd crush rm-device-class osd.1",
    "osd crush reweight osd.2 0.5",
    "osd reweight 0 0.5",
    "osd down 1",
    "osd out 1",
    "osd in 1",
    "osd purge 1 --yes-i-really-mean-it",
    "auth get-or-create client.x mon 'allow r'",
    "auth caps client.x mon 'allow rw'",
    "auth del client.x",
    "config set osd osd_max_backfills 4",
    "config set osd osd_max_backfills 0",
    "mon add b 127.0.0.2:1",
    "mon remove b",
];

proptest! {
    // 24 cases in CI; CAIRN_SOAK=1 runs 1000.
    #![proptest_config(ProptestConfig {
        cases: if std::env::var("CAIRN_SOAK").as_deref() == Ok("1") { 1000 } else { 24 },
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_sequences_replay_identically(seq in proptest::collection::vec(0..POOL.len(), 1..25)) {
        let base = cluster(3, 1);
        let lines: Vec<&str> = seq.iter().map(|i| POOL[*i]).collect();
        let mut a = base.clone();
        let incs = run_script(&mut a, &lines);
        let mut b = base.clone();
        run_script(&mut b, &lines);
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(a.epoch.0, base.epoch.0 + incs.len() as u64);
        let mut replay = base.clone();
        for inc in &incs {
            prop_assert!(replay.apply_incremental(inc).is_ok());
        }
        prop_assert_eq!(&replay, &a);
        prop_assert_eq!(ClusterMap::decode(&a.encode()).unwrap(), a);
    }
}
