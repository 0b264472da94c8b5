//! `cairn rados -p POOL VERB …`: object operations over cairn-client (like
//! Ceph's `rados` tool) and `rados bench`/`cleanup`. Arguments are parsed
//! by hand so that Ceph's spelling (`-p POOL put OBJ FILE`, `-b 4096`)
//! works as is. Owns no placement or op logic.

use crate::bench_pattern::{BenchPattern, PATTERN_VERSION};
use crate::conn::Session;
use anyhow::{anyhow, bail, Context, Result};
use cairn_client::IoCtx;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes per op when `put`/`get` move a large object.
const IO_CHUNK_BYTES: u64 = 4 << 20;
/// Object listing page size.
const LIST_PAGE: u32 = 1000;
/// Object that records the last bench write run (for seq/rand/cleanup).
pub const BENCH_META_OBJECT: &str = "benchmark_last_metadata";
/// Concurrent removals in `cleanup`.
const CLEANUP_CONCURRENCY: usize = 16;

#[derive(Debug, Default)]
struct Opts {
    conf: Option<PathBuf>,
    pool: Option<String>,
    namespace: String,
    json: bool,
    op_bytes: Option<u64>,
    object_bytes: Option<u64>,
    concurrency: Option<usize>,
    no_cleanup: bool,
    /// `--no-verify`: seq/rand do not check the data they read.
    no_verify: bool,
    run_name: Option<String>,
    words: Vec<String>,
}

fn parse(args: &[String]) -> Result<Opts> {
    let mut o = Opts::default();
    let mut it = args.iter().peekable();
    // Skip everything up to and including the word `rados`.
    let mut seen_rados = false;
    while let Some(a) = it.next() {
        let mut val = |flag: &str| -> Result<String> {
            it.next()
                .cloned()
                .ok_or_else(|| anyhow!("{flag} needs a value"))
        };
        match a.as_str() {
            "-c" | "--conf" => o.conf = Some(PathBuf::from(val(a)?)),
            "-p" | "--pool" => o.pool = Some(val(a)?),
            "-N" | "--namespace" => o.namespace = val(a)?,
            "-f" | "--format" => {
                o.json = match val(a)?.as_str() {
                    "json" | "json-pretty" => true,
                    "plain" => false,
                    other => bail!("--format {other}: use plain or json"),
                }
            }
            "-b" => o.op_bytes = Some(crate::cmd_disk::parse_size(&val(a)?)?),
            "-O" | "--object-size" => o.object_bytes = Some(crate::cmd_disk::parse_size(&val(a)?)?),
            "-t" | "--concurrent-ios" => {
                let v = val(a)?;
                let n: usize = v
                    .parse()
                    .map_err(|_| anyhow!("-t {v}: expected a number"))?;
                if !(1..=1024).contains(&n) {
                    bail!("-t {n}: must be 1..1024");
                }
                o.concurrency = Some(n)
            }
            "--no-cleanup" => o.no_cleanup = true,
            "--no-verify" => o.no_verify = true,
            "--run-name" => o.run_name = Some(val(a)?),
            "rados" if !seen_rados => seen_rados = true,
            _ => o.words.push(a.clone()),
        }
    }
    Ok(o)
}

pub const USAGE: &str = "usage: cairn rados -p POOL put OBJ FILE|- | get OBJ FILE|- | rm OBJ | stat OBJ | ls | \
append OBJ FILE|- | truncate OBJ SIZE | setxattr OBJ NAME [VALUE] | getxattr OBJ NAME | listxattr OBJ | \
setomapval OBJ KEY [VALUE] | getomapval OBJ KEY [FILE] | listomapkeys OBJ | listomapvals OBJ | rmomapkey OBJ KEY | \
bench SECONDS write|seq|rand [-b BYTES] [-O OBJECT_BYTES] [-t N] [--no-cleanup] [--no-verify] [--run-name NAME] | cleanup [--run-name NAME]; \
cairn rados list-inconsistent-obj PGID (no pool: asks the monitors for the PG's last scrub findings)";

/// Runs `cairn rados …` (the whole command line after `cairn`).
pub fn run(args: &[String]) -> Result<()> {
    let o = parse(args)?;
    if o.words.is_empty() {
        bail!("{USAGE}");
    }
    let pool = o
        .pool
        .clone()
        .ok_or_else(|| anyhow!("no pool given: add -p POOL ('cairn osd pool ls' lists them)"))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let s = Session::connect(o.conf.as_deref(), None).await?;
        let io = s.rados.ioctx(&pool)?.with_namespace(&o.namespace);
        dispatch(&o, &io).await
    })
}

fn read_input(src: &str) -> Result<Vec<u8>> {
    if src == "-" {
        let mut v = Vec::new();
        std::io::stdin()
            .read_to_end(&mut v)
            .context("reading stdin")?;
        Ok(v)
    } else {
        std::fs::read(src).with_context(|| format!("reading {src}"))
    }
}

fn write_output(dst: &str, data: &[u8]) -> Result<()> {
    if dst == "-" {
        let mut out = std::io::stdout().lock();
        out.write_all(data)?;
        out.flush()?;
        Ok(())
    } else {
        std::fs::write(dst, data).with_context(|| format!("writing {dst}"))
    }
}

fn need<'a>(w: &'a [String], n: usize, what: &str) -> Result<&'a [String]> {
    if w.len() < n + 1 {
        bail!("rados {}: expected {what}", w[0]);
    }
    Ok(&w[1..])
}

async fn put(io: &IoCtx, oid: &str, data: Vec<u8>) -> Result<()> {
    let data = bytes::Bytes::from(data);
    let first = data.len().min(IO_CHUNK_BYTES as usize);
    io.write_full(oid, data.slice(..first)).await?;
    let mut off = first;
    while off < data.len() {
        let end = (off + IO_CHUNK_BYTES as usize).min(data.len());
        io.write(oid, off as u64, data.slice(off..end)).await?;
        off = end;
    }
    Ok(())
}

async fn get(io: &IoCtx, oid: &str) -> Result<Vec<u8>> {
    let size = io.stat(oid).await?.size;
    let mut out = Vec::with_capacity(size as usize);
    let mut off = 0;
    while off < size {
        let len = IO_CHUNK_BYTES.min(size - off);
        let chunk = io.read(oid, off, len).await?;
        if chunk.is_empty() {
            break;
        }
        off += chunk.len() as u64;
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

fn printable(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}

async fn dispatch(o: &Opts, io: &IoCtx) -> Result<()> {
    let w = &o.words;
    let pool = io.pool_name().to_string();
    match w[0].as_str() {
        "put" => {
            let a = need(w, 2, "OBJ FILE|-")?;
            put(io, &a[0], read_input(&a[1])?).await
        }
        "get" => {
            let a = need(w, 2, "OBJ FILE|-")?;
            write_output(&a[1], &get(io, &a[0]).await?)
        }
        "rm" => {
            let a = need(w, 1, "OBJ")?;
            for oid in a {
                io.remove(oid).await?;
            }
            Ok(())
        }
        "stat" => {
            let a = need(w, 1, "OBJ")?;
            let st = io.stat(&a[0]).await?;
            if o.json {
                println!(
                    "{}",
                    serde_json::json!({"pool": pool, "name": a[0], "size": st.size,
                        "version": format!("{}.{}", st.version.epoch, st.version.seq)})
                );
            } else {
                println!(
                    "{pool}/{} size {}, version {}.{}",
                    a[0], st.size, st.version.epoch, st.version.seq
                );
            }
            Ok(())
        }
        "ls" => {
            let mut cur = cairn_client::PoolCursor::default();
            let mut out = std::io::stdout().lock();
            loop {
                let (objs, next) = io.list_objects(&cur, LIST_PAGE).await?;
                for ob in objs {
                    writeln!(out, "{}", ob.name)?;
                }
                match next {
                    Some(c) => cur = c,
                    None => return Ok(()),
                }
            }
        }
        "append" => {
            let a = need(w, 2, "OBJ FILE|-")?;
            io.append(&a[0], read_input(&a[1])?).await?;
            Ok(())
        }
        "truncate" => {
            let a = need(w, 2, "OBJ SIZE")?;
            let size = crate::cmd_disk::parse_size(&a[1]).or_else(|e| {
                if a[1] == "0" {
                    Ok(0)
                } else {
                    Err(e)
                }
            })?;
            io.truncate(&a[0], size).await?;
            Ok(())
        }
        "setxattr" => {
            let a = need(w, 2, "OBJ NAME [VALUE]")?;
            let v = match a.get(2) {
                Some(v) => v.as_bytes().to_vec(),
                None => read_input("-")?,
            };
            io.set_xattr(&a[0], &a[1], v).await?;
            Ok(())
        }
        "getxattr" => {
            let a = need(w, 2, "OBJ NAME")?;
            write_output("-", &io.get_xattr(&a[0], &a[1]).await?)
        }
        "rmxattr" => {
            let a = need(w, 2, "OBJ NAME")?;
            io.rm_xattr(&a[0], &a[1]).await?;
            Ok(())
        }
        "listxattr" => {
            let a = need(w, 1, "OBJ")?;
            for (k, _) in io.list_xattrs(&a[0]).await? {
                println!("{k}");
            }
            Ok(())
        }
        "setomapval" => {
            let a = need(w, 2, "OBJ KEY [VALUE]")?;
            let v = match a.get(2) {
                Some(v) => v.as_bytes().to_vec(),
                None => read_input("-")?,
            };
            io.omap_set(&a[0], vec![(a[1].as_bytes().to_vec(), v)])
                .await?;
            Ok(())
        }
        "getomapval" => {
            let a = need(w, 2, "OBJ KEY [FILE]")?;
            let vals = io
                .omap_get_vals_by_keys(&a[0], vec![a[1].as_bytes().to_vec()])
                .await?;
            let Some((_, v)) = vals.into_iter().next() else {
                bail!("no key '{}' in the omap of {pool}/{}", a[1], a[0]);
            };
            match a.get(2) {
                Some(f) => write_output(f, &v),
                None => {
                    println!("value ({} bytes) :\n{}", v.len(), printable(&v));
                    Ok(())
                }
            }
        }
        "listomapkeys" | "listomapvals" => {
            let a = need(w, 1, "OBJ")?;
            let vals = w[0] == "listomapvals";
            let mut after: Option<Vec<u8>> = None;
            loop {
                let (page, more) = io.omap_list(&a[0], after.as_deref(), LIST_PAGE).await?;
                for (k, v) in &page {
                    if vals {
                        println!(
                            "{}\nvalue ({} bytes) :\n{}",
                            printable(k),
                            v.len(),
                            printable(v)
                        );
                    } else {
                        println!("{}", printable(k));
                    }
                }
                match (more, page.last()) {
                    (true, Some((k, _))) => after = Some(k.clone()),
                    _ => return Ok(()),
                }
            }
        }
        "rmomapkey" => {
            let a = need(w, 2, "OBJ KEY")?;
            io.omap_rm_keys(&a[0], vec![a[1].as_bytes().to_vec()])
                .await?;
            Ok(())
        }
        "bench" => {
            let a = need(w, 2, "SECONDS write|seq|rand")?;
            let secs: f64 = a[0]
                .parse()
                .map_err(|_| anyhow!("bench {}: SECONDS must be a number", a[0]))?;
            if !(secs > 0.0 && secs <= 86_400.0) {
                bail!("bench {secs}: SECONDS must be in (0, 86400]");
            }
            let mode = match a[1].as_str() {
                "write" => Mode::Write,
                "seq" => Mode::Seq,
                "rand" => Mode::Rand,
                m => bail!("bench mode '{m}': use write, seq or rand"),
            };
            bench(io, o, Duration::from_secs_f64(secs), mode).await
        }
        "cleanup" => cleanup(io, o).await,
        v => bail!("unknown rados verb '{v}'\n{USAGE}"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Write,
    Seq,
    Rand,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct BenchMeta {
    prefix: String,
    ops: u64,
    op_bytes: u64,
    object_bytes: u64,
    /// `bench_pattern::PATTERN_VERSION` of the data (0: older runs, not
    /// verifiable).
    #[serde(default)]
    pattern: u32,
}

fn meta_object(o: &Opts) -> String {
    o.run_name
        .clone()
        .unwrap_or_else(|| BENCH_META_OBJECT.to_string())
}

/// Object and offset of op `k`.
fn op_target(prefix: &str, k: u64, op_bytes: u64, object_bytes: u64) -> (String, u64) {
    let per_obj = (object_bytes / op_bytes).max(1);
    (
        format!("{prefix}_object{}", k / per_obj),
        (k % per_obj) * op_bytes,
    )
}

#[derive(Default)]
struct Stats {
    started: AtomicU64,
    finished: AtomicU64,
    failed: AtomicU64,
    lat_us: Mutex<Vec<u64>>,
    last_lat_us: AtomicU64,
    first_error: Mutex<Option<String>>,
    /// Writers (or readers) still issuing or waiting for ops.
    running: AtomicUsize,
    /// Woken by the last of them to stop, so the bench's time ends when its
    /// last op does (as Ceph's `rados bench`), not at the next report tick.
    all_stopped: tokio::sync::Notify,
}

/// Counts one bench task out when it stops (returns or panics); the last
/// one wakes the reporter.
struct Running(Arc<Stats>);

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.all_stopped.notify_one();
        }
    }
}

/// Mean and sample standard deviation.
fn mean_std(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (m, 0.0);
    }
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1.0);
    (m, var.sqrt())
}

async fn bench(io: &IoCtx, o: &Opts, secs: Duration, mode: Mode) -> Result<()> {
    let conc = o.concurrency.unwrap_or(16);
    let mut verify = mode != Mode::Write && !o.no_verify;
    let (prefix, op_bytes, object_bytes, total_ops) = match mode {
        Mode::Write => {
            let op = o.op_bytes.unwrap_or(4 << 20);
            let obj = o.object_bytes.unwrap_or(op).max(op);
            let host = crate::cmd_disk::hostname();
            (
                format!("benchmark_data_{host}_{}", std::process::id()),
                op,
                obj,
                u64::MAX,
            )
        }
        Mode::Seq | Mode::Rand => {
            let name = meta_object(o);
            let raw = io.read(&name, 0, 1 << 20).await.map_err(|e| {
                anyhow!("no bench data to read ({name}: {e}); run 'cairn rados -p {} bench SECONDS write --no-cleanup' first", io.pool_name())
            })?;
            let m: BenchMeta = serde_json::from_slice(&raw)
                .with_context(|| format!("parsing bench metadata object {name}"))?;
            if m.ops == 0 {
                bail!("the last bench write made no objects");
            }
            if verify && m.pattern != PATTERN_VERSION {
                eprintln!("note: the objects of {name} were written by an older cairn bench without headers: the data read is not verified");
                verify = false;
            }
            (m.prefix, m.op_bytes, m.object_bytes, m.ops)
        }
    };
    let pattern = BenchPattern::new(&prefix, op_bytes);
    let stats = Arc::new(Stats {
        running: AtomicUsize::new(conc),
        ..Stats::default()
    });
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + secs;
    let mut tasks = Vec::new();
    for _ in 0..conc {
        let (io, stats, next, prefix, pattern) = (
            io.clone(),
            stats.clone(),
            next.clone(),
            prefix.clone(),
            pattern.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let _running = Running(stats.clone());
            // This writer's op buffer: only its header changes per op.
            let mut buf = bytes::BytesMut::new();
            while Instant::now() < deadline {
                let k = match mode {
                    Mode::Write | Mode::Seq => next.fetch_add(1, Ordering::Relaxed),
                    Mode::Rand => rand::random::<u64>() % total_ops,
                };
                if k >= total_ops {
                    return;
                }
                let (oid, off) = op_target(&prefix, k, op_bytes, object_bytes);
                let objno = k / (object_bytes / op_bytes).max(1);
                if mode == Mode::Write {
                    pattern.fill(&mut buf, objno, off);
                }
                stats.started.fetch_add(1, Ordering::Relaxed);
                let t0 = Instant::now();
                let r: Result<(), String> = match mode {
                    Mode::Write => {
                        let data = std::mem::take(&mut buf).freeze();
                        let r = if off == 0 && op_bytes == object_bytes {
                            io.write_full(&oid, data.clone()).await.map(|_| ())
                        } else {
                            io.write(&oid, off, data.clone()).await.map(|_| ())
                        };
                        // Take the buffer back for the next op unless the
                        // client library still holds it.
                        buf = data
                            .try_into_mut()
                            .unwrap_or_else(|_| pattern.make(objno, off));
                        r.map_err(|e| e.to_string())
                    }
                    _ => match io.read_bytes(&oid, off, op_bytes).await {
                        Ok(got) if verify => pattern
                            .verify(&got, objno, off)
                            .map_err(|e| format!("{oid}: {e}")),
                        Ok(_) => Ok(()),
                        Err(e) => Err(e.to_string()),
                    },
                };
                let us = t0.elapsed().as_micros() as u64;
                match r {
                    Ok(()) => {
                        stats.finished.fetch_add(1, Ordering::Relaxed);
                        stats.last_lat_us.store(us, Ordering::Relaxed);
                        stats
                            .lat_us
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(us);
                    }
                    Err(e) => {
                        stats.failed.fetch_add(1, Ordering::Relaxed);
                        let mut fe = stats.first_error.lock().unwrap_or_else(|p| p.into_inner());
                        if fe.is_none() {
                            *fe = Some(e);
                        }
                        return;
                    }
                }
            }
        }));
    }
    let mb = (1u64 << 20) as f64;
    let mut per_sec_ops: Vec<f64> = Vec::new();
    if !o.json {
        println!(
            "hints = 1\nMaintaining {conc} concurrent writes of {op_bytes} bytes to objects of size {object_bytes} for up to {} seconds or 0 objects",
            secs.as_secs()
        );
        println!("Object prefix: {prefix}");
        println!("  sec Cur ops   started  finished  avg MB/s  cur MB/s last lat(s)  avg lat(s)");
    }
    let mut last_done = 0u64;
    let mut sec = 0u64;
    loop {
        let tick = start + Duration::from_secs(sec + 1);
        // Wakes at the next whole second, or at once when the last op is
        // done (the drain after the deadline ends the bench's time).
        let whole_second = stats.running.load(Ordering::Acquire) > 0
            && tokio::select! {
                _ = tokio::time::sleep_until(tick.into()) => true,
                _ = stats.all_stopped.notified() => false,
            };
        let all_done = stats.running.load(Ordering::Acquire) == 0;
        let done = stats.finished.load(Ordering::Relaxed);
        let started = stats.started.load(Ordering::Relaxed);
        let elapsed = start.elapsed().as_secs_f64();
        // Per-second figures count whole seconds only (and the first one,
        // however short, so a tiny bench has one).
        if (whole_second && Instant::now() <= deadline + Duration::from_millis(50)) || sec == 0 {
            per_sec_ops.push((done - last_done) as f64);
        }
        if !o.json {
            let lats = stats.lat_us.lock().unwrap_or_else(|p| p.into_inner());
            let avg_lat = if lats.is_empty() {
                0.0
            } else {
                lats.iter().sum::<u64>() as f64 / lats.len() as f64 / 1e6
            };
            drop(lats);
            let last = stats.last_lat_us.load(Ordering::Relaxed) as f64 / 1e6;
            println!(
                "{:>5} {:>7} {:>9} {:>9} {:>9.4} {:>9.4} {:>11.6} {:>11.6}",
                sec,
                started - done,
                started,
                done,
                done as f64 * op_bytes as f64 / mb / elapsed.max(1e-9),
                (done - last_done) as f64 * op_bytes as f64 / mb,
                last,
                avg_lat
            );
        }
        last_done = done;
        sec += 1;
        if all_done {
            break;
        }
    }
    let total = start.elapsed().as_secs_f64();
    for t in tasks {
        let _ = t.await;
    }
    let done = stats.finished.load(Ordering::Relaxed);
    if let Some(e) = stats
        .first_error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
    {
        eprintln!(
            "error: {} ops failed during the bench, the first with: {e}",
            stats.failed.load(Ordering::Relaxed)
        );
    }
    let lats: Vec<f64> = stats
        .lat_us
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|u| *u as f64 / 1e6)
        .collect();
    let (lat_avg, lat_std) = mean_std(&lats);
    let lat_max = lats.iter().cloned().fold(0.0, f64::max);
    let lat_min = lats.iter().cloned().fold(f64::INFINITY, f64::min);
    let lat_min = if lat_min.is_finite() { lat_min } else { 0.0 };
    let bw_per_sec: Vec<f64> = per_sec_ops
        .iter()
        .map(|n| n * op_bytes as f64 / mb)
        .collect();
    let (_, bw_std) = mean_std(&bw_per_sec);
    let (_, iops_std) = mean_std(&per_sec_ops);
    let bw = done as f64 * op_bytes as f64 / mb / total.max(1e-9);
    let iops = done as f64 / total.max(1e-9);
    let fmax = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
    let fmin = |v: &[f64]| {
        let m = v.iter().cloned().fold(f64::INFINITY, f64::min);
        if m.is_finite() {
            m
        } else {
            0.0
        }
    };
    let (made, size_label) = match mode {
        Mode::Write => ("Total writes made", "Write size"),
        _ => ("Total reads made", "Read size"),
    };
    if o.json {
        println!(
            "{}",
            serde_json::json!({
                "mode": format!("{mode:?}").to_lowercase(),
                "total_time_run": total,
                "total_ops_made": done,
                "failed_ops": stats.failed.load(Ordering::Relaxed),
                "op_size": op_bytes,
                "object_size": object_bytes,
                "concurrency": conc,
                "bandwidth_mb_sec": bw,
                "stddev_bandwidth": bw_std,
                "max_bandwidth_mb_sec": fmax(&bw_per_sec),
                "min_bandwidth_mb_sec": fmin(&bw_per_sec),
                "average_iops": iops,
                "stddev_iops": iops_std,
                "max_iops": fmax(&per_sec_ops),
                "min_iops": fmin(&per_sec_ops),
                "average_latency_s": lat_avg,
                "stddev_latency_s": lat_std,
                "max_latency_s": lat_max,
                "min_latency_s": lat_min,
            })
        );
    } else {
        println!("Total time run:         {total:.4}");
        println!("{:<24}{done}", format!("{made}:"));
        println!("{:<24}{op_bytes}", format!("{size_label}:"));
        println!("Object size:            {object_bytes}");
        println!("Bandwidth (MB/sec):     {bw:.3}");
        println!("Stddev Bandwidth:       {bw_std:.4}");
        println!("Max bandwidth (MB/sec): {:.3}", fmax(&bw_per_sec));
        println!("Min bandwidth (MB/sec): {:.3}", fmin(&bw_per_sec));
        println!("Average IOPS:           {}", iops.round() as u64);
        println!("Stddev IOPS:            {iops_std:.4}");
        println!("Max IOPS:               {}", fmax(&per_sec_ops) as u64);
        println!("Min IOPS:               {}", fmin(&per_sec_ops) as u64);
        println!("Average Latency(s):     {lat_avg:.6}");
        println!("Stddev Latency(s):      {lat_std:.6}");
        println!("Max latency(s):         {lat_max:.6}");
        println!("Min latency(s):         {lat_min:.6}");
    }
    if mode == Mode::Write {
        let meta = BenchMeta {
            prefix: prefix.clone(),
            ops: done,
            op_bytes,
            object_bytes,
            pattern: PATTERN_VERSION,
        };
        if o.no_cleanup {
            io.write_full(&meta_object(o), serde_json::to_vec(&meta)?)
                .await?;
        } else {
            if !o.json {
                println!("Cleaning up (deleting benchmark objects)");
            }
            let n = remove_bench_objects(io, &meta).await?;
            if !o.json {
                println!(
                    "Removed {n} objects\nClean up completed and total clean up time :{:.6}",
                    start.elapsed().as_secs_f64() - total
                );
            }
        }
    }
    if stats.failed.load(Ordering::Relaxed) > 0 {
        bail!("the bench had failed ops (see above)");
    }
    Ok(())
}

async fn remove_bench_objects(io: &IoCtx, m: &BenchMeta) -> Result<u64> {
    let per_obj = (m.object_bytes / m.op_bytes.max(1)).max(1);
    let objects = m.ops.div_ceil(per_obj);
    let next = Arc::new(AtomicU64::new(0));
    let removed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CLEANUP_CONCURRENCY {
        let (io, next, removed, prefix) =
            (io.clone(), next.clone(), removed.clone(), m.prefix.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= objects {
                    return Ok::<(), anyhow::Error>(());
                }
                match io.remove(&format!("{prefix}_object{i}")).await {
                    Ok(_) => {
                        removed.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(cairn_client::ClientError::Op { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }));
    }
    for t in tasks {
        t.await.map_err(|e| anyhow!("cleanup task: {e}"))??;
    }
    Ok(removed.load(Ordering::Relaxed))
}

async fn cleanup(io: &IoCtx, o: &Opts) -> Result<()> {
    let name = meta_object(o);
    let mut removed = 0;
    if let Ok(raw) = io.read(&name, 0, 1 << 20).await {
        if let Ok(m) = serde_json::from_slice::<BenchMeta>(&raw) {
            removed += remove_bench_objects(io, &m).await?;
        }
        io.remove(&name).await?;
    }
    // Objects of runs that were interrupted before recording metadata.
    if o.run_name.is_none() {
        for ob in io.list_all().await? {
            if ob.name.starts_with("benchmark_data_") {
                io.remove(&ob.name).await?;
                removed += 1;
            }
        }
    }
    println!("Removed {removed} objects");
    Ok(())
}
