//! Mapping throughput on a 100-host x 12-OSD map with a host-level
//! 3-replica rule (chooseleaf firstn 0 type host), through the reusable
//! workspace API. `CAIRN_BENCH_CRUSHTOOL=1` also times `crushtool --test` on
//! the same map over x 0..999999 and prints both rates and their ratio.

#[path = "support/mod.rs"]
mod support;

use cairn_crush::{CrushMap, Workspace};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;

fn mapping(c: &mut Criterion) {
    let (map, rule) = support::bench_map();
    let reweights = vec![0x10000u32; 1200];
    let mut ws = Workspace::new(&map);
    let mut out = Vec::with_capacity(3);
    const BATCH: u32 = 10_000;
    let mut g = c.benchmark_group("crush");
    g.throughput(Throughput::Elements(u64::from(BATCH)));
    g.bench_function("do_rule_100x12_host_rep3", |b| {
        let mut base = 0u32;
        b.iter(|| {
            for x in base..base + BATCH {
                map.do_rule_into(
                    &mut ws,
                    rule,
                    black_box(x),
                    support::REPLICAS,
                    &reweights,
                    &mut out,
                );
                black_box(&out);
            }
            base = base.wrapping_add(BATCH);
        })
    });
    g.finish();

    if std::env::var("CAIRN_BENCH_CRUSHTOOL").as_deref() == Ok("1") {
        compare_with_crushtool(&map, rule);
    }
}

/// (own user+system, waited-for children user+system) CPU seconds, from
/// /proc/self/stat, so rates stay meaningful on a busy machine.
fn cpu_secs() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_comm = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let f: Vec<f64> = after_comm
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    // Fields 14..17 of stat are utime, stime, cutime, cstime (index 11..14 after the comm).
    let tick = 100.0;
    let get = |i: usize| f.get(i).copied().unwrap_or(0.0) / tick;
    (get(11) + get(12), get(13) + get(14))
}

fn compare_with_crushtool(map: &CrushMap, rule: i32) {
    use std::time::Instant;
    let dir = std::env::temp_dir().join(format!("cairn-crush-bench-{}", std::process::id()));
    if std::fs::create_dir_all(&dir).is_err() {
        eprintln!("cannot create {}", dir.display());
        return;
    }
    let txt = dir.join("map.txt");
    let bin = dir.join("map.bin");
    if std::fs::write(&txt, map.to_text()).is_err() {
        return;
    }
    let ok = std::process::Command::new("crushtool")
        .arg("-c")
        .arg(&txt)
        .arg("-o")
        .arg(&bin)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("crushtool not available; skipping the comparison");
        return;
    }
    let n: u32 = 1_000_000;
    let t = Instant::now();
    let (_, child0) = cpu_secs();
    let st = std::process::Command::new("crushtool")
        .args([
            "--test",
            "--rule",
            &rule.to_string(),
            "--num-rep",
            "3",
            "--min-x",
            "0",
        ])
        .args(["--max-x", &(n - 1).to_string(), "--show-statistics", "-i"])
        .arg(&bin)
        .stdout(std::process::Stdio::null())
        .status();
    let crushtool_secs = t.elapsed().as_secs_f64();
    let crushtool_cpu = cpu_secs().1 - child0;
    if !st.map(|s| s.success()).unwrap_or(false) {
        eprintln!("crushtool --test failed");
        return;
    }
    let reweights = vec![0x10000u32; 1200];
    let mut ws = Workspace::new(map);
    let mut out = Vec::new();
    let t = Instant::now();
    let (own0, _) = cpu_secs();
    let mut sum = 0i64;
    for x in 0..n {
        map.do_rule_into(&mut ws, rule, x, support::REPLICAS, &reweights, &mut out);
        sum += i64::from(out[0]);
    }
    let ours_secs = t.elapsed().as_secs_f64();
    let ours_cpu = cpu_secs().0 - own0;
    black_box(sum);
    let ours = f64::from(n) / ours_secs;
    let theirs = f64::from(n) / crushtool_secs;
    println!(
        "x 0..{}: wall clock: cairn {:.0} mappings/s ({:.3} s), crushtool --test {:.0} mappings/s ({:.3} s, includes process start and statistics), ratio {:.2}x",
        n - 1, ours, ours_secs, theirs, crushtool_secs, ours / theirs
    );
    if ours_cpu > 0.0 && crushtool_cpu > 0.0 {
        let (oc, tc) = (f64::from(n) / ours_cpu, f64::from(n) / crushtool_cpu);
        println!(
            "x 0..{}: CPU time: cairn {:.0} mappings/s ({:.2} s), crushtool {:.0} mappings/s ({:.2} s), ratio {:.2}x",
            n - 1, oc, ours_cpu, tc, crushtool_cpu, oc / tc
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, mapping);
criterion_main!(benches);
