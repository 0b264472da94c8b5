//! Runs the simulator over many seeds with the fault profile CI can hold
//! to (`basic`: crashes, partitions, resets, duplicates, clock faults).
//! `CAIRN_SOAK=1` runs 3000 seeds instead of 300.

use cairn_sim::{run_seed, FaultProfile};

/// Threads the seeds are spread over (each seed runs alone on one thread,
/// so a run stays exactly reproducible; CI has 2 cores).
const THREADS: u64 = 2;

#[test]
fn seeds_pass_the_oracle() {
    let soak = std::env::var("CAIRN_SOAK").is_ok_and(|v| v == "1");
    let count: u64 = if soak { 3000 } else { 300 };
    let results: Vec<(u64, Vec<String>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                s.spawn(move || {
                    let mut writes = 0;
                    let mut failures = Vec::new();
                    for seed in (t..count).step_by(THREADS as usize) {
                        let o = run_seed(seed, FaultProfile::Basic, false);
                        writes += o.acked_writes;
                        if !o.violations.is_empty() {
                            failures.push(format!(
                                "seed {seed}: {}\n  replay: cargo run -p cairn-sim -- --profile basic --seed {seed} -v",
                                o.violations.join("\n  ")
                            ));
                        }
                    }
                    (writes, failures)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("seed worker panicked"))
            .collect()
    });
    let writes: u64 = results.iter().map(|r| r.0).sum();
    let failures: Vec<String> = results.into_iter().flat_map(|r| r.1).collect();
    assert!(
        writes > count,
        "the workload barely wrote: {writes} acknowledged writes"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn one_seed_replays_exactly() {
    let a = run_seed(42, FaultProfile::Full, false);
    let b = run_seed(42, FaultProfile::Full, false);
    assert_eq!(
        (a.events, a.sim_time, a.acked_writes, a.reads, a.faults),
        (b.events, b.sim_time, b.acked_writes, b.reads, b.faults)
    );
    assert_eq!(a.violations, b.violations);
}
