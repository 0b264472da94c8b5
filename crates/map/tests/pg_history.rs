//! The PG history the map keeps: a primary records its acting set before
//! activating; records are checked against the current placement, bounded,
//! and cleaned when the pool or the OSDs go.

mod common;
use cairn_map::*;
use cairn_types::{EntityName, Epoch, PgId, PoolId};
use common::*;

fn pg(seed: u32) -> PgId {
    PgId {
        pool: PoolId(1),
        seed,
    }
}

fn alive(m: &mut ClusterMap, from: i32, pgid: PgId, since: Epoch, acting: &[i32]) {
    let want = m.epoch;
    exec_as(
        m,
        &MonCommand::OsdAlive {
            id: from,
            want,
            activating: vec![(
                pgid,
                PgActivation {
                    since,
                    acting: acting.to_vec(),
                },
            )],
        },
        EntityName::osd(from),
    )
    .expect("osd alive");
}

#[test]
fn a_primary_records_its_acting_set_only_while_it_holds_it() {
    let mut m = cluster(5, 1);
    ok(&mut m, "osd pool create rbd 8");
    let first = m.pg_to_up(1, 0).unwrap();
    let primary = first.acting_primary.unwrap();
    let since = m.epoch;
    alive(&mut m, primary, pg(0), since, &first.acting);
    assert!(m.pg_activation_recorded(pg(0), &first.acting));
    assert_eq!(m.pg_activations(pg(0)).len(), 1);
    // The same acting set again adds nothing.
    alive(&mut m, primary, pg(0), since, &first.acting);
    assert_eq!(m.pg_activations(pg(0)).len(), 1);
    // Not the primary, or not the current acting set: ignored.
    let other = *m.osds.keys().find(|o| !first.acting.contains(o)).unwrap();
    let e = m.epoch;
    alive(&mut m, other, pg(0), e, &[other]);
    alive(&mut m, primary, pg(0), e, &[primary]);
    assert_eq!(m.pg_activations(pg(0)).len(), 1);
    // The placement moves: the new primary records the new set after the old.
    ok(&mut m, &format!("osd out {}", first.acting[1]));
    let moved = m.pg_to_up(1, 0).unwrap();
    let since2 = m.epoch;
    alive(
        &mut m,
        moved.acting_primary.unwrap(),
        pg(0),
        since2,
        &moved.acting,
    );
    let h = m.pg_activations(pg(0));
    assert_eq!(h.len(), 2);
    assert_eq!(h[0].acting, first.acting);
    assert_eq!((h[1].since, &h[1].acting), (since2, &moved.acting));
    // A late request from an older interval never goes after a newer one.
    ok(&mut m, &format!("osd in {}", first.acting[1]));
    alive(&mut m, primary, pg(0), since, &first.acting);
    assert_eq!(m.pg_activations(pg(0)).len(), 2);
    let spans = activation_spans(&m.pg_activations(pg(0)), m.epoch);
    assert_eq!(spans[0], (since, Epoch(since2.0 - 1)));
    assert_eq!(spans[1], (since2, m.epoch));
    // Purging an OSD drops it from the entries; deleting the pool drops all.
    let gone = first.acting[2];
    ok(&mut m, &format!("osd out {gone}"));
    ok(&mut m, &format!("osd down {gone}"));
    ok(&mut m, &format!("osd purge {gone} --yes-i-really-mean-it"));
    assert!(m
        .pg_activations(pg(0))
        .iter()
        .all(|e| !e.acting.contains(&gone)));
    ok(&mut m, "config set mon mon_allow_pool_delete true");
    ok(
        &mut m,
        "osd pool delete rbd rbd --yes-i-really-really-mean-it",
    );
    assert!(m.pg_history.is_empty());
}

#[test]
fn history_is_bounded() {
    let mut m = cluster(6, 1);
    ok(&mut m, "osd pool create rbd 8");
    for i in 0..(PG_HISTORY_MAX + 4) {
        let out = (i % 6) as i32;
        ok(&mut m, &format!("osd out {out}"));
        let now = m.pg_to_up(1, 0).unwrap();
        let e = m.epoch;
        alive(&mut m, now.acting_primary.unwrap(), pg(0), e, &now.acting);
        ok(&mut m, &format!("osd in {out}"));
    }
    assert!(m.pg_activations(pg(0)).len() <= PG_HISTORY_MAX);
}

/// An erasure-coded PG records its acting set with the holes dropped (the
/// live shards), checked against the current placement like a replicated
/// one.
#[test]
fn an_ec_primary_records_its_live_shards() {
    let mut m = cluster(5, 1);
    ok(&mut m, "osd erasure-code-profile set ec21 k=2 m=1");
    ok(&mut m, "osd pool create ec 8 8 erasure ec21");
    let first = m.pg_to_up(1, 0).unwrap();
    let primary = first.acting_primary.unwrap();
    let since = m.epoch;
    alive(&mut m, primary, pg(0), since, &first.acting);
    assert!(m.pg_activation_recorded(pg(0), &first.acting));
    // A shard goes down: its position is a hole, the record names the rest.
    let gone = *first.acting.iter().find(|&&o| o != primary).unwrap();
    ok(&mut m, &format!("osd down {gone}"));
    let now = m.pg_to_up(1, 0).unwrap();
    assert!(now.acting.contains(&cairn_crush::CRUSH_ITEM_NONE));
    let live: Vec<i32> = first
        .acting
        .iter()
        .copied()
        .filter(|&o| o != gone)
        .collect();
    let since2 = m.epoch;
    // The acting set with its hole is not what the OSD sends: ignored.
    alive(&mut m, primary, pg(0), since2, &now.acting);
    assert_eq!(m.pg_activations(pg(0)).len(), 1);
    alive(&mut m, primary, pg(0), since2, &live);
    let h = m.pg_activations(pg(0));
    assert_eq!(h.len(), 2);
    assert_eq!((h[1].since, &h[1].acting), (since2, &live));
}
