//! Placement properties: indep stability when an OSD goes out, bounded data
//! movement when an OSD is added, and utilisation that follows weights.

use cairn_crush::CrushMap;
use proptest::prelude::*;

/// root -> `hosts` hosts -> OSDs with the given weights (TiB).
fn host_map(weights: &[Vec<f64>]) -> CrushMap {
    let mut map = CrushMap::new();
    map.add_bucket("default", "root", None).expect("root");
    let mut osd = 0;
    for (h, ws) in weights.iter().enumerate() {
        let host = format!("host{h}");
        for &w in ws {
            map.add_device(osd, Some("hdd"), w, &[("host", &host), ("root", "default")])
                .expect("add");
            osd += 1;
        }
    }
    map
}

fn weights_strategy(
    hosts: std::ops::Range<usize>,
    per_host: std::ops::Range<usize>,
) -> impl Strategy<Value = Vec<Vec<f64>>> {
    prop::collection::vec(prop::collection::vec(0.5f64..8.0, per_host), hosts)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 8,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x000c_a1e2),
        ..ProptestConfig::default()
    }
}

/// Fraction of replicas of `before` that are not in `after`, over `xs` inputs.
fn moved_fraction(before: &CrushMap, after: &CrushMap, rule: i32, reps: usize, xs: u32) -> f64 {
    let (mut ws1, mut ws2) = (
        cairn_crush::Workspace::new(before),
        cairn_crush::Workspace::new(after),
    );
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let (mut moved, mut slots) = (0usize, 0usize);
    for x in 0..xs {
        before.do_rule_into(&mut ws1, rule, x, reps, &[], &mut a);
        after.do_rule_into(&mut ws2, rule, x, reps, &[], &mut b);
        slots += a.len();
        moved += a.iter().filter(|o| !b.contains(o)).count();
    }
    moved as f64 / slots as f64
}

proptest! {
    #![proptest_config(config())]

    /// With Ceph's erasure rule (chooseleaf indep, chooseleaf_tries 5) and at
    /// least 3 OSDs per host, marking one OSD out removes it from every
    /// mapping and leaves the other positions unchanged for at least 99% of
    /// inputs. (Not 100%: in Ceph's algorithm a position whose first draw
    /// collided with the victim's host is retried against a different
    /// collision set; this implementation is bit-identical to Ceph there.)
    #[test]
    fn indep_out_changes_only_its_positions(weights in weights_strategy(4..8, 3..6), victim_pick in 0usize..1000, size in 3u32..6) {
        let mut map = host_map(&weights);
        let rule = map.add_erasure_rule("ec", "default", "host", None, size).expect("rule");
        let n_osds = weights.iter().map(|h| h.len()).sum::<usize>();
        let victim = (victim_pick % n_osds) as i32;
        let mut reweights = vec![0x10000u32; n_osds];
        let mut ws = cairn_crush::Workspace::new(&map);
        let (mut before, mut after) = (Vec::new(), Vec::new());
        let mut inputs_changed = 0u32;
        const XS: u32 = 2000;
        for x in 0..XS {
            reweights[victim as usize] = 0x10000;
            map.do_rule_into(&mut ws, rule, x, size as usize, &reweights, &mut before);
            reweights[victim as usize] = 0;
            map.do_rule_into(&mut ws, rule, x, size as usize, &reweights, &mut after);
            prop_assert_eq!(before.len(), after.len());
            prop_assert!(!after.contains(&victim));
            if before.iter().zip(after.iter()).any(|(b, a)| *b != victim && a != b) {
                inputs_changed += 1;
            }
        }
        prop_assert!(inputs_changed * 100 <= XS, "other positions changed for {} of {} inputs", inputs_changed, XS);
    }

    /// Adding an OSD of weight w to a flat map of total weight W moves at
    /// most 1.2 * w / (W + w) of the placed replicas (3 replicas).
    #[test]
    fn adding_an_osd_moves_at_most_its_share(weights in prop::collection::vec(0.5f64..8.0, 6..14), w in 1.0f64..6.0) {
        let mut map = CrushMap::new();
        map.add_bucket("default", "root", None).expect("root");
        for (i, &wt) in weights.iter().enumerate() {
            map.add_device(i as i32, Some("hdd"), wt, &[("root", "default")]).expect("add");
        }
        let rule = map.add_replicated_rule("rep", "default", "osd", None).expect("rule");
        let before = map.clone();
        map.add_device(weights.len() as i32, Some("hdd"), w, &[("root", "default")]).expect("add");
        let share = w / (weights.iter().sum::<f64>() + w);
        let frac = moved_fraction(&before, &map, rule, 3, 4000);
        prop_assert!(frac <= 1.2 * share, "moved {:.4} of replicas, share {:.4}", frac, share);
    }
}

/// In a hierarchy, CRUSH moves more than the new OSD's share: inputs that
/// now pick the grown host land on any of its OSDs, and with several
/// replicas positions shift. Measured (and identical in Ceph): adding to an
/// existing host moves 1.5-2.1x the share; a new host 0.9-1.4x. We bound
/// both loosely to catch regressions and print the ratios.
#[test]
fn hierarchy_movement_is_bounded() {
    let weights = vec![
        vec![4.0, 3.0, 5.0],
        vec![2.0, 6.0, 4.0],
        vec![4.0, 4.0, 4.0],
        vec![3.0, 3.0],
        vec![5.0, 5.0, 2.0],
        vec![4.0, 4.0],
    ];
    let total: f64 = weights.iter().flatten().sum();
    let mut map = host_map(&weights);
    let rule = map
        .add_replicated_rule("rep", "default", "host", None)
        .expect("rule");
    let n = weights.iter().map(|h| h.len()).sum::<usize>() as i32;
    let w = 3.0;
    let share = w / (total + w);
    let mut existing = map.clone();
    existing
        .add_device(n, Some("hdd"), w, &[("host", "host2"), ("root", "default")])
        .expect("add");
    let mut new_host = map.clone();
    new_host
        .add_device(n, Some("hdd"), w, &[("host", "host9"), ("root", "default")])
        .expect("add");
    let r_existing = moved_fraction(&map, &existing, rule, 3, 4000) / share;
    let r_new = moved_fraction(&map, &new_host, rule, 3, 4000) / share;
    println!("moved/share with 3 replicas over hosts: into an existing host {r_existing:.2}, as a new host {r_new:.2}");
    assert!(r_existing < 2.5, "{r_existing}");
    assert!(r_new < 1.6, "{r_new}");
}

/// Over 100k inputs, each OSD's share of single-replica placements is within
/// 5% (relative) of its weight share; with 3 replicas over equal hosts, each
/// host's share is within 5% of 1/hosts.
#[test]
fn utilisation_tracks_weights() {
    let weights = vec![
        vec![1.0, 2.0, 3.0, 4.0],
        vec![2.0, 2.0, 2.0],
        vec![5.0, 0.5, 1.5],
        vec![3.0, 3.0],
    ];
    let mut map = host_map(&weights);
    let one = map
        .add_replicated_rule("one", "default", "osd", None)
        .expect("rule");
    let flat: Vec<f64> = weights.iter().flatten().copied().collect();
    let total: f64 = flat.iter().sum();
    let mut counts = vec![0u64; flat.len()];
    let mut ws = cairn_crush::Workspace::new(&map);
    let mut out = Vec::new();
    const N: u32 = 100_000;
    for x in 0..N {
        map.do_rule_into(&mut ws, one, x, 1, &[], &mut out);
        counts[out[0] as usize] += 1;
    }
    for (i, (&c, &w)) in counts.iter().zip(flat.iter()).enumerate() {
        let expected = f64::from(N) * w / total;
        let dev = (c as f64 - expected).abs() / expected;
        assert!(
            dev < 0.05,
            "osd.{i} weight {w}: {c} placements, expected {expected:.0} ({:.1}% off)",
            dev * 100.0
        );
    }

    let equal = vec![vec![2.0; 3]; 6];
    let mut map = host_map(&equal);
    let rep = map
        .add_replicated_rule("rep", "default", "host", None)
        .expect("rule");
    let mut per_host = [0u64; 6];
    let mut ws = cairn_crush::Workspace::new(&map);
    for x in 0..N {
        map.do_rule_into(&mut ws, rep, x, 3, &[], &mut out);
        assert_eq!(out.len(), 3);
        for &o in &out {
            per_host[o as usize / 3] += 1;
        }
    }
    for (h, &c) in per_host.iter().enumerate() {
        let expected = f64::from(N) * 3.0 / 6.0;
        let dev = (c as f64 - expected).abs() / expected;
        assert!(dev < 0.05, "host{h}: {c} replicas, expected {expected:.0}");
    }
}
