//! Runs the store benchmark without the CLI (quicker to build while tuning):
//! `cargo run --release -p cairn-store --example store_bench -- DIR SIZE_BYTES THREADS SECONDS [read]`.
//! Prints the JSON report `cairn store bench -f json` prints.
//! To compare settings: `WAL_BYTES=N` (at mkfs), `CHECKPOINT_MS=N`,
//! `WRITEBACK_MS=N` (0: no paced data write-back between checkpoints),
//! `EXTENT_CACHE_PCT=N` (`extent_cache_pct`) and `DRIVERS=N` (writes
//! submitted by N threads, see `bench`).

use cairn_store::bench::{run_with, BenchOpts};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 5 {
        eprintln!("usage: store_bench DIR SIZE_BYTES THREADS SECONDS [read]");
        std::process::exit(2);
    }
    let num = |i: usize| -> u64 {
        a[i].parse().unwrap_or_else(|_| {
            eprintln!("argument {i} ('{}') is not a number", a[i]);
            std::process::exit(2)
        })
    };
    let opts = BenchOpts {
        path: a[1].clone().into(),
        io_bytes: num(2),
        threads: num(3) as usize,
        seconds: num(4) as f64,
        read: a.get(5).is_some_and(|m| m == "read"),
        cache_bytes: 128 << 20,
        data_bytes: 4 << 30,
        block_size: 4096,
        drivers: std::env::var("DRIVERS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    };
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let tune = |c: &mut cairn_store::StoreConfig| {
        if let Some(n) = env("WAL_BYTES") {
            c.wal_bytes = n;
        }
        if let Some(n) = env("CHECKPOINT_MS") {
            c.checkpoint_interval_ms = n;
        }
        if let Some(n) = env("EXTENT_CACHE_PCT") {
            c.extent_cache_pct = n as u32;
        }
        if let Some(n) = env("WRITEBACK_MS") {
            c.writeback_pace_ms = n;
        }
    };
    match run_with(&opts, tune) {
        Ok(r) => println!("{}", serde_json::to_string(&r).unwrap_or_default()),
        Err(e) => {
            eprintln!("bench failed: {e}");
            std::process::exit(1);
        }
    }
}
