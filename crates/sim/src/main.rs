//! `cairn-sim --seed N [-v]` replays one seed exactly (with a trace);
//! `cairn-sim --seeds N [--from S]` runs many and prints each failure with
//! the command that replays it. `--profile basic|disk|full|ec|ecmove|grow`
//! picks the faults (default full; CI runs every profile).

use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!(
        "usage: cairn-sim [--profile basic|disk|full|ec|ecmove|grow] (--seed N [-v] | --seeds COUNT [--from FIRST])"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut seed: Option<u64> = None;
    let mut count: Option<u64> = None;
    let mut from = 0u64;
    let mut verbose = false;
    let mut profile = cairn_sim::FaultProfile::Full;
    let mut profile_name = "full".to_string();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let num = |v: Option<&String>| v.and_then(|s| s.parse::<u64>().ok());
        match a.as_str() {
            "--seed" => match num(it.next()) {
                Some(n) => seed = Some(n),
                None => return usage(),
            },
            "--seeds" => match num(it.next()) {
                Some(n) => count = Some(n),
                None => return usage(),
            },
            "--from" => match num(it.next()) {
                Some(n) => from = n,
                None => return usage(),
            },
            "-v" | "--verbose" => verbose = true,
            "--profile" => match it.next().map(|p| (p, p.parse())) {
                Some((name, Ok(p))) => {
                    profile = p;
                    profile_name = name.clone();
                }
                Some((_, Err(e))) => {
                    eprintln!("{e}");
                    return usage();
                }
                None => return usage(),
            },
            _ => return usage(),
        }
    }
    let seeds: Vec<u64> = match (seed, count) {
        (Some(s), None) => vec![s],
        (None, Some(n)) => (from..from + n).collect(),
        _ => return usage(),
    };
    let mut failed = 0;
    let mut totals = [0u64; 13];
    for s in &seeds {
        let o = cairn_sim::run_seed(*s, profile, verbose);
        for (t, v) in totals.iter_mut().zip([
            o.pg_temp_requests,
            o.backfill_batches,
            o.strays_removed,
            o.remapped_ops,
            o.flags_set,
            o.flag_waits,
            o.paused_ops,
            o.full_marks,
            o.mark_refusals,
            o.toofull_waits,
            o.ec_incomplete,
            o.new_osds,
            o.noin_held,
        ]) {
            *t += v;
        }
        if o.violations.is_empty() {
            if seeds.len() == 1 {
                println!(
                    "seed {s}: ok ({} events, {:.1}s simulated, {} faults, {} writes acknowledged, {} reads, healed in {:.1}s)",
                    o.events,
                    o.sim_time as f64 / 1e6,
                    o.faults,
                    o.acked_writes,
                    o.reads,
                    o.heal_time.unwrap_or(0) as f64 / 1e6
                );
            }
        } else {
            failed += 1;
            println!("seed {s}: FAILED");
            for v in &o.violations {
                println!("  {v}");
            }
            println!("  replay: cargo run -p cairn-sim -- --profile {profile_name} --seed {s} -v");
        }
    }
    println!(
        "background backfill: {} pg_temp requests, {} batches, {} stray copies removed, {} client ops answered while remapped",
        totals[0], totals[1], totals[2], totals[3]
    );
    println!(
        "operator: {} flags set, {} backfill steps held by a flag, {} client ops held by pause; {} full marks changed, {} writes refused by a full mark, {} backfill steps held as backfill_toofull",
        totals[4], totals[5], totals[6], totals[7], totals[8], totals[9]
    );
    println!(
        "erasure coding: {} activations stopped incomplete (fewer than k up-to-date shards)",
        totals[10]
    );
    println!(
        "growth: {} new OSDs joined, {} boots left out by noin (marked in when it was unset)",
        totals[11], totals[12]
    );
    if seeds.len() > 1 {
        println!("{} seeds, {failed} failed", seeds.len());
    }
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
