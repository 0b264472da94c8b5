//! Ceph's own `crushtool` is the oracle: seeded random maps (flat,
//! root→host→osd, root→rack→host→osd; weights including 0; 1–3 device
//! classes with explicit, partial or absent shadow ids; optimal, legacy and
//! mixed tunables; firstn/indep, choose/chooseleaf, two- and three-step and
//! two-take rules; num-rep 1..8; random `--weight` reweights) are compiled by
//! `crushtool -c`, tested with `crushtool --test`, and our output must be
//! identical for x in 0..1023 on every rule. `crushtool -d` of the same map
//! must also equal our `to_text()` (shadow ids, order, weights).
//!
//! CI runs `ORACLE_MAPS` maps; `CAIRN_SOAK=1` runs `SOAK_MAPS`. A failure
//! prints the seed and the map text; `CAIRN_ORACLE_SEED=N` replays one seed,
//! `CAIRN_ORACLE_MAPS=N` runs seeds 0..N.

mod common;

use cairn_crush::tester::{reweight_from_float, run_test, TestOptions};
use cairn_crush::CrushMap;
use common::*;
use std::time::Instant;

const ORACLE_MAPS: u64 = 40;
const SOAK_MAPS: u64 = 2000;

struct Totals {
    maps: u64,
    mappings: u64,
    equal: u64,
    text_equal: u64,
    failures: Vec<String>,
    crushtool_secs: f64,
    ours_secs: f64,
}

fn check_seed(seed: u64, dir: &std::path::Path, t: &mut Totals) {
    let g = gen_map(seed);
    let t0 = Instant::now();
    let bin = crushtool_compile(dir, &format!("m{seed}"), &g.text);
    t.crushtool_secs += t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let parsed = CrushMap::parse_text(&g.text);
    t.ours_secs += t0.elapsed().as_secs_f64();
    let ours = match parsed {
        Ok(m) => m,
        Err(e) => {
            t.failures.push(format!(
                "seed {seed}: our parser rejected the map: {e}\n{}",
                g.text
            ));
            return;
        }
    };
    t.maps += 1;
    // Text: crushtool -d must equal our printer.
    let t0 = Instant::now();
    let theirs_text = crushtool(&["-d", &bin]);
    t.crushtool_secs += t0.elapsed().as_secs_f64();
    if theirs_text == ours.to_text() {
        t.text_equal += 1;
    } else {
        t.failures.push(format!(
            "seed {seed}: decompiled text differs\n--- crushtool -d ---\n{theirs_text}\n--- ours ---\n{}\n--- input ---\n{}",
            ours.to_text(),
            g.text
        ));
    }
    // Round trip through our own text: printing keeps 3 decimals of each
    // weight (as crushtool does), so the first reparse may move weights by
    // less than 0.0005; from then on parse -> print -> parse is exact.
    let norm = CrushMap::parse_text(&ours.to_text());
    let twice = norm.as_ref().map(|m| CrushMap::parse_text(&m.to_text()));
    match (&norm, twice) {
        (Ok(a), Ok(Ok(b))) if *a == b && a.to_text() == b.to_text() => {}
        _ => t.failures.push(format!(
            "seed {seed}: parse(print(map)) is not stable\n{}",
            g.text
        )),
    }
    match CrushMap::decode(&ours.encode()) {
        Ok(m) if m == ours => {}
        _ => t
            .failures
            .push(format!("seed {seed}: encode/decode round trip failed")),
    }
    // Mappings for two num-rep values, with random reweights on the second.
    let reweights = gen_reweights(seed, &g.osds);
    for (pass, num_rep) in [(0u64, 1 + seed % 8), (1, 1 + (seed * 7 + 3) % 8)] {
        let mut args: Vec<String> = vec![
            "-i".into(),
            bin.clone(),
            "--test".into(),
            "--show-mappings".into(),
            "--show-bad-mappings".into(),
            "--show-statistics".into(),
            "--min-x".into(),
            "0".into(),
            "--max-x".into(),
            "1023".into(),
            "--num-rep".into(),
            num_rep.to_string(),
        ];
        if seed.is_multiple_of(2) {
            args.push("--show-utilization".into());
        }
        let mut opts = TestOptions {
            num_rep: Some((num_rep as i32, num_rep as i32)),
            show_mappings: true,
            show_bad_mappings: true,
            show_statistics: true,
            show_utilization: seed.is_multiple_of(2),
            ..TestOptions::default()
        };
        if pass == 1 {
            for (o, w) in &reweights {
                args.extend(["--weight".into(), o.to_string(), w.clone()]);
                opts.weights
                    .insert(*o, reweight_from_float(w.parse().unwrap_or(1.0)));
            }
        }
        let argv: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let t0 = Instant::now();
        let theirs = crushtool(&argv);
        t.crushtool_secs += t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        let mine = run_test(&ours, &opts);
        t.ours_secs += t0.elapsed().as_secs_f64();
        let their_maps: Vec<&str> = theirs
            .lines()
            .filter(|l| l.starts_with("CRUSH rule"))
            .collect();
        let my_maps: Vec<&str> = mine
            .lines()
            .filter(|l| l.starts_with("CRUSH rule"))
            .collect();
        t.mappings += their_maps.len() as u64;
        t.equal += their_maps
            .iter()
            .zip(my_maps.iter())
            .filter(|(a, b)| a == b)
            .count() as u64;
        if theirs != mine {
            let first_diff = theirs
                .lines()
                .zip(mine.lines())
                .find(|(a, b)| a != b)
                .map(|(a, b)| format!("crushtool: {a}\ncairn:     {b}"))
                .unwrap_or_else(|| "(one output is a prefix of the other)".into());
            t.failures.push(format!(
                "seed {seed} num_rep {num_rep} pass {pass}: output differs\n{first_diff}\nargs: {args:?}\n--- map ---\n{}",
                g.text
            ));
        }
    }
}

#[test]
fn mappings_equal_crushtool_on_random_maps() {
    if !crushtool_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let seeds: Vec<u64> = match std::env::var("CAIRN_ORACLE_SEED") {
        Ok(s) => vec![s.parse().expect("CAIRN_ORACLE_SEED must be a number")],
        Err(_) => {
            let soak = std::env::var("CAIRN_SOAK").as_deref() == Ok("1");
            let n = std::env::var("CAIRN_ORACLE_MAPS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(if soak { SOAK_MAPS } else { ORACLE_MAPS });
            (0..n).collect()
        }
    };
    let mut t = Totals {
        maps: 0,
        mappings: 0,
        equal: 0,
        text_equal: 0,
        failures: Vec::new(),
        crushtool_secs: 0.0,
        ours_secs: 0.0,
    };
    for seed in seeds {
        check_seed(seed, dir.path(), &mut t);
    }
    let summary = format!(
        "CRUSH oracle: {} maps, {} mappings compared, {} equal; decompiled text equal on {} of {} maps \
         (crushtool {:.1} s, cairn {:.1} s)",
        t.maps, t.mappings, t.equal, t.text_equal, t.maps, t.crushtool_secs, t.ours_secs
    );
    println!("{summary}");
    eprintln!("{summary}");
    if !t.failures.is_empty() {
        for f in t.failures.iter().take(3) {
            eprintln!("{f}\n");
        }
        panic!(
            "{} oracle disagreements (first 3 printed above)",
            t.failures.len()
        );
    }
    assert_eq!(t.mappings, t.equal);
}
