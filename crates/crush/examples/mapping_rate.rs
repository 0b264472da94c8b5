//! Mapping throughput on issue 2's map (100 hosts x 12 OSDs, 3 replicas
//! across hosts), measured by CPU time so that a busy machine does not skew
//! it, beside Ceph's `crushtool --test` on the same map:
//!
//! ```sh
//! cargo run --release -p cairn-crush --example mapping_rate -- [--crushtool] [--general] [--rounds 3] [--inputs 1000000]
//! ```
//!
//! `--general` maps through the general rule interpreter instead of the
//! fast path of `take; chooseleaf firstn; emit` rules (for A/B runs).
//! Each round maps x = 0..inputs once; the median round is reported. With
//! `--crushtool` every round also runs `crushtool -i MAP --test --rule R
//! --num-rep 3 --min-x 0 --max-x N-1 --show-mappings` and every one of its
//! lines is compared with ours (the run fails on the first difference).

#[path = "../benches/support/mod.rs"]
mod support;

use cairn_crush::{CrushMap, Workspace};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

/// CPU time this thread has run, in seconds (from the scheduler's ns counter).
fn thread_cpu_secs() -> f64 {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let ns: f64 = s
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    ns / 1e9
}

/// User + system CPU seconds of waited-for children (from /proc/self/stat).
fn children_cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_comm = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let f: Vec<f64> = after_comm
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    // cutime and cstime are fields 16 and 17 of stat (13 and 14 after comm).
    let tick = 100.0;
    (f.get(13).copied().unwrap_or(0.0) + f.get(14).copied().unwrap_or(0.0)) / tick
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Args {
    crushtool: bool,
    /// Map through the general rule interpreter, not the fast path.
    general: bool,
    rounds: usize,
    inputs: u32,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        crushtool: false,
        general: false,
        rounds: 3,
        inputs: 1_000_000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--crushtool" => a.crushtool = true,
            "--general" => a.general = true,
            "--rounds" | "--inputs" => {
                let v = it.next().ok_or(format!("{arg} needs a number"))?;
                let n: u32 = v
                    .parse()
                    .map_err(|_| format!("{arg}: '{v}' is not a number"))?;
                if n == 0 {
                    return Err(format!("{arg} must be at least 1"));
                }
                if arg == "--rounds" {
                    a.rounds = n as usize;
                } else {
                    a.inputs = n;
                }
            }
            other => return Err(format!("unknown argument '{other}'")),
        }
    }
    Ok(a)
}

/// One round of ours: (wall seconds, CPU seconds). With `keep`, every
/// mapping is kept (each followed by -1) for the comparison with crushtool.
fn run_ours(
    map: &CrushMap,
    rule: i32,
    inputs: u32,
    general: bool,
    keep: Option<&mut Vec<i32>>,
) -> (f64, f64) {
    let reweights = vec![0x10000u32; map.max_devices() as usize];
    let mut ws = if general {
        Workspace::general_only()
    } else {
        Workspace::new(map)
    };
    let mut out = Vec::with_capacity(support::REPLICAS);
    let mut sink = 0i64;
    let (t, c) = (Instant::now(), thread_cpu_secs());
    match keep {
        Some(all) => {
            all.clear();
            for x in 0..inputs {
                map.do_rule_into(&mut ws, rule, x, support::REPLICAS, &reweights, &mut out);
                all.extend_from_slice(&out);
                all.push(-1);
            }
        }
        None => {
            for x in 0..inputs {
                map.do_rule_into(&mut ws, rule, x, support::REPLICAS, &reweights, &mut out);
                sink += i64::from(out[0]);
            }
        }
    }
    std::hint::black_box(sink);
    (t.elapsed().as_secs_f64(), thread_cpu_secs() - c)
}

/// One crushtool round: (wall seconds, CPU seconds, its stdout).
fn run_crushtool(
    bin: &std::path::Path,
    rule: i32,
    inputs: u32,
) -> Result<(f64, f64, Vec<u8>), String> {
    let (t, c) = (Instant::now(), children_cpu_secs());
    let out = Command::new("crushtool")
        .arg("-i")
        .arg(bin)
        .args(["--test", "--rule", &rule.to_string(), "--num-rep"])
        .arg(support::REPLICAS.to_string())
        .args([
            "--min-x",
            "0",
            "--max-x",
            &(inputs - 1).to_string(),
            "--show-mappings",
        ])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run crushtool: {e}"))?;
    let wall = t.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(format!("crushtool --test failed: {}", out.status));
    }
    Ok((wall, children_cpu_secs() - c, out.stdout))
}

/// Compares crushtool's `CRUSH rule R x X [a,b,c]` lines with ours; returns
/// how many mappings were compared.
fn compare(text: &[u8], ours: &[i32], rule: i32) -> Result<u64, String> {
    let text = std::str::from_utf8(text).map_err(|_| "crushtool printed non-UTF-8".to_string())?;
    let mut groups = ours.split(|&v| v == -1);
    let mut n = 0u64;
    for (x, line) in text.lines().enumerate() {
        let mine = groups.next().unwrap_or(&[]);
        let list: Vec<String> = mine.iter().map(i32::to_string).collect();
        let want = format!("CRUSH rule {rule} x {x} [{}]", list.join(","));
        if line != want {
            return Err(format!(
                "first difference at x {x}: crushtool '{line}', cairn '{want}'"
            ));
        }
        n += 1;
    }
    Ok(n)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("mapping_rate: {e}");
            return ExitCode::from(2);
        }
    };
    let (map, rule) = support::bench_map();
    let n = f64::from(args.inputs);
    let mut ours_cpu = Vec::new();
    let mut ours_wall = Vec::new();
    let mut theirs_cpu = Vec::new();
    let mut theirs_wall = Vec::new();
    let dir = std::env::temp_dir().join(format!("cairn-mapping-rate-{}", std::process::id()));
    let bin = dir.join("map.bin");
    if args.crushtool {
        let txt = dir.join("map.txt");
        let made = std::fs::create_dir_all(&dir)
            .and_then(|_| std::fs::write(&txt, map.to_text()))
            .map_err(|e| e.to_string())
            .and_then(|_| {
                Command::new("crushtool")
                    .arg("-c")
                    .arg(&txt)
                    .arg("-o")
                    .arg(&bin)
                    .status()
                    .map_err(|e| format!("cannot run crushtool: {e}"))
            });
        match made {
            Ok(s) if s.success() => {}
            Ok(s) => {
                eprintln!("mapping_rate: crushtool -c failed: {s}");
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("mapping_rate: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let mut compared = 0u64;
    let mut kept = Vec::new();
    for round in 0..args.rounds {
        let (w, c) = run_ours(&map, rule, args.inputs, args.general, None);
        println!(
            "round {}: cairn {:.0} mappings/s by CPU time ({c:.3} s), {:.0} by wall clock",
            round + 1,
            n / c,
            n / w
        );
        ours_cpu.push(n / c);
        ours_wall.push(n / w);
        if args.crushtool {
            let (w, c, text) = match run_crushtool(&bin, rule, args.inputs) {
                Ok(v) => v,
                Err(e) => {
                    eprintln!("mapping_rate: {e}");
                    let _ = std::fs::remove_dir_all(&dir);
                    return ExitCode::FAILURE;
                }
            };
            println!(
                "round {}: crushtool {:.0} mappings/s by CPU time ({c:.3} s), {:.0} by wall clock",
                round + 1,
                n / c,
                n / w
            );
            theirs_cpu.push(n / c);
            theirs_wall.push(n / w);
            if round == 0 {
                run_ours(&map, rule, args.inputs, args.general, Some(&mut kept));
                match compare(&text, &kept, rule) {
                    Ok(k) if k == u64::from(args.inputs) => compared = k,
                    Ok(k) => {
                        eprintln!(
                            "mapping_rate: crushtool printed {k} mappings, expected {}",
                            args.inputs
                        );
                        let _ = std::fs::remove_dir_all(&dir);
                        return ExitCode::FAILURE;
                    }
                    Err(e) => {
                        eprintln!("mapping_rate: {e}");
                        let _ = std::fs::remove_dir_all(&dir);
                        return ExitCode::FAILURE;
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let (oc, ow) = (median(&mut ours_cpu), median(&mut ours_wall));
    println!(
        "median of {} rounds over x 0..{}: cairn {oc:.0} mappings/s by CPU time ({ow:.0} by wall clock)",
        args.rounds,
        args.inputs - 1
    );
    if args.crushtool {
        let (tc, tw) = (median(&mut theirs_cpu), median(&mut theirs_wall));
        println!(
            "median: crushtool --test --show-mappings {tc:.0} mappings/s by CPU time ({tw:.0} by wall clock, includes process start and printing); ratio {:.1}x by CPU time",
            oc / tc
        );
        println!(
            "crushtool and cairn agree on {compared} of {compared} mappings (x 0..{})",
            args.inputs - 1
        );
    }
    ExitCode::SUCCESS
}
