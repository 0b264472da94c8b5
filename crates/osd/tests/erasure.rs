//! Erasure-coded pools end to end with the in-process cluster: 2+1 over
//! three hosts (objects of every awkward size, the overwrite and omap
//! rules, an OSD killed during writes, degraded reads, recovery of the
//! returning OSD's chunks) and 4+2 with the seed-000 rule (two chunks per
//! host over three hosts) losing a whole host.

mod common;

use cairn_client::IoCtx;
use cairn_map::{MonCommand, PoolKind};
use common::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn create_ec_pool(c: &mut Cluster, name: &str, params: &[(&str, &str)], rule: Option<&str>) {
    c.apply(MonCommand::EcProfileSet {
        name: format!("{name}-profile"),
        params: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        force: false,
    });
    c.apply(MonCommand::PoolCreate {
        name: name.into(),
        pg_num: Some(8),
        pgp_num: None,
        kind: PoolKind::Erasure,
        profile: Some(format!("{name}-profile")),
        rule: rule.map(str::to_string),
    });
}

fn pool_set(c: &mut Cluster, pool: &str, key: &str, value: &str) {
    c.apply(MonCommand::PoolSet {
        pool: pool.into(),
        key: key.into(),
        value: value.into(),
        sure: true,
    });
}

async fn check_objects(io: &IoCtx, objs: &BTreeMap<String, Vec<u8>>, what: &str) {
    for (name, want) in objs {
        let got = io
            .read(name, 0, 0)
            .await
            .unwrap_or_else(|e| panic!("{what}: reading {name}: {e}"));
        assert_eq!(got.len(), want.len(), "{what}: {name} size");
        assert!(got == *want, "{what}: {name} content differs");
    }
}

/// Writers doing `write_full` of varied sizes until stopped; remembers
/// what was acknowledged.
struct Load {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<BTreeMap<String, Vec<u8>>>>,
    count: Arc<AtomicU64>,
    tasks: tokio::task::JoinSet<()>,
}

impl Load {
    fn start(io: &IoCtx, writers: u64) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(BTreeMap::new()));
        let count = Arc::new(AtomicU64::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        for w in 0..writers {
            let (io, stop, acked, count) = (io.clone(), stop.clone(), acked.clone(), count.clone());
            tasks.spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let seed = w * 1_000_000 + i;
                    let size = [1usize, 5000, 70_000, 300_001][(i % 4) as usize];
                    let name = format!("load-{w}-{}", i % 16);
                    let data = pattern(seed, size);
                    if io.write_full(&name, data.clone()).await.is_ok() {
                        acked.lock().unwrap().insert(name, data);
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                }
            });
        }
        Load {
            stop,
            acked,
            count,
            tasks,
        }
    }

    fn acked_count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    async fn finish(mut self) -> BTreeMap<String, Vec<u8>> {
        self.stop.store(true, Ordering::Relaxed);
        while self.tasks.join_next().await.is_some() {}
        let acked = self.acked.lock().unwrap().clone();
        acked
    }
}

async fn wait_for_more_acks(load: &Load, than: u64) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let n = load.acked_count();
        if n > than + 4 || tokio::time::Instant::now() > deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ec21_sizes_rules_failures_and_recovery() {
    let mut c = Cluster::start(3, 1, 4, 512 << 20).await;
    create_ec_pool(
        &mut c,
        "ec21",
        &[("k", "2"), ("m", "1"), ("crush-failure-domain", "host")],
        None,
    );
    c.wait_active(Duration::from_secs(60)).await;
    let io = c.client().ioctx("ec21").expect("pool");

    // Sizes around every boundary of a 2 x 4 KiB stripe, and 8 MiB.
    let mut objs = BTreeMap::new();
    for (i, size) in [
        0usize,
        1,
        4095,
        4096,
        4097,
        8191,
        8192,
        3 * 8192 + 17,
        1 << 20,
        8 << 20,
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("size-{size}");
        let data = pattern(i as u64, size);
        io.write_full(&name, data.clone())
            .await
            .expect("write_full");
        objs.insert(name, data);
    }
    check_objects(&io, &objs, "healthy").await;
    let st = io.stat("size-4097").await.expect("stat");
    assert_eq!(st.size, 4097);

    // Partial reads across stripe units.
    let got = io.read("size-24593", 4000, 9000).await.expect("range read");
    assert_eq!(got, objs["size-24593"][4000..13000]);

    // Appends (unaligned ones read the last stripe back) and xattrs.
    let mut appended = pattern(77, 5000);
    io.write_full("app", appended.clone()).await.expect("write");
    for n in [1usize, 3000, 8192, 10_000] {
        let more = pattern(n as u64, n);
        io.append("app", more.clone()).await.expect("append");
        appended.extend_from_slice(&more);
    }
    objs.insert("app".into(), appended);
    io.set_xattr("app", "colour", b"blue".to_vec())
        .await
        .expect("setxattr");
    assert_eq!(
        io.get_xattr("app", "colour").await.expect("getxattr"),
        b"blue".to_vec()
    );

    // Without allow_ec_overwrites: partial overwrite and truncate refused.
    let e = io
        .write("app", 10, b"xyz".to_vec())
        .await
        .expect_err("overwrite without allow_ec_overwrites");
    assert!(e.to_string().contains("allow_ec_overwrites"), "{e}");
    let e = io.truncate("app", 100).await.expect_err("truncate");
    assert!(e.to_string().contains("allow_ec_overwrites"), "{e}");
    // omap: refused with the reason.
    let e = io
        .omap_set("app", vec![(b"k".to_vec(), b"v".to_vec())])
        .await
        .expect_err("omap on EC");
    assert!(e.to_string().contains("replicated pool"), "{e}");

    // With the flag: read-modify-write of the stripes touched.
    pool_set(&mut c, "ec21", "allow_ec_overwrites", "true");
    let mut model = objs["size-24593"].clone();
    for (off, len) in [(10usize, 3usize), (4090, 20), (8192, 8192), (20_000, 9000)] {
        let d = pattern(off as u64 + 5, len);
        io.write("size-24593", off as u64, d.clone())
            .await
            .expect("overwrite");
        if model.len() < off + len {
            model.resize(off + len, 0);
        }
        model[off..off + len].copy_from_slice(&d);
    }
    io.truncate("size-24593", 9000).await.expect("truncate");
    model.truncate(9000);
    objs.insert("size-24593".into(), model);
    check_objects(&io, &objs, "after overwrites").await;
    io.remove("size-1").await.expect("remove");
    objs.remove("size-1");
    let mut names: Vec<String> = io
        .list_all()
        .await
        .expect("list")
        .into_iter()
        .map(|o| o.name)
        .collect();
    names.sort();
    assert_eq!(names, objs.keys().cloned().collect::<Vec<_>>(), "listing");

    // Kill an OSD while writes run: acknowledged writes survive and the
    // PGs (2 of 3 shards, min_size 2) keep serving, degraded.
    let load = Load::start(&io, 4);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let before = load.acked_count();
    c.kill(1).await;
    let during = wait_for_more_acks(&load, before).await;
    check_objects(&io, &objs, "degraded (osd.1 down)").await;
    c.restart(1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let acked = load.finish().await;
    eprintln!("acks before the kill {before}, during the outage {during}");
    assert!(during > before, "writes stopped with osd.1 down");
    objs.extend(acked);
    c.wait_clean(Duration::from_secs(90)).await;
    check_objects(&io, &objs, "after recovery").await;

    // osd.1's chunks were rebuilt: lose another OSD and read everything.
    c.kill(2).await;
    c.wait_active(Duration::from_secs(60)).await;
    check_objects(&io, &objs, "osd.2 down, rebuilt osd.1 serving").await;

    // On disk: one collection per shard, and an 8 MiB object keeps a
    // 4 MiB chunk (+ no more) on each of its shards.
    let pool_id = c
        .current()
        .pools
        .values()
        .find(|p| p.name == "ec21")
        .map(|p| p.id)
        .expect("pool");
    c.kill(0).await;
    c.kill(1).await;
    let name = cairn_ops::ObjectName::new("", "size-8388608");
    let mut chunks = 0;
    for id in [0, 1] {
        let store = reopen(&c, id).await;
        for coll in store.list_collections().expect("collections") {
            if coll.pool != pool_id {
                continue;
            }
            assert!(coll.shard < 3, "EC collection without a shard: {coll:?}");
            // Rollback stashes go once their entry is on every shard: at
            // most the newest entries of the PG keep one.
            let all = store
                .list_objects(&coll, &cairn_store::ListStart::Beginning, 100_000)
                .expect("list");
            let stashes = all
                .iter()
                .filter(|o| o.namespace.starts_with('\u{1}'))
                .count();
            assert!(stashes <= 4, "{stashes} rollback stashes left in {coll:?}");
            let oid = cairn_osd::exec::store_oid(&name);
            if let Ok(st) = store.stat(&coll, &oid) {
                assert_eq!(st.size, 4 << 20, "chunk of size-8388608 in {coll:?}");
                chunks += 1;
            }
        }
    }
    assert_eq!(chunks, 2, "two of the three chunks live on osd.0 and osd.1");
}

/// Snapshots on an EC 2+1 pool: clone-on-write per shard, snapshot reads
/// (healthy and degraded), a whiteout, clones made while a shard is down
/// rebuilt when it returns (checked by losing another shard), and trims.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ec21_snapshots_clone_each_chunk_and_survive_recovery() {
    use cairn_ops::SnapContext;
    let mut c = Cluster::start(3, 1, 4, 512 << 20).await;
    create_ec_pool(
        &mut c,
        "ecsnap",
        &[("k", "2"), ("m", "1"), ("crush-failure-domain", "host")],
        None,
    );
    pool_set(&mut c, "ecsnap", "allow_ec_overwrites", "true");
    c.wait_active(Duration::from_secs(60)).await;
    let base = c.client().ioctx("ecsnap").expect("pool");
    let ctx = |seq: u64, snaps: &[u64]| {
        base.with_snap_context(SnapContext {
            seq,
            snaps: snaps.to_vec(),
        })
    };
    let sizes = [1usize, 5000, 8192, 70_000, 300_001, 1 << 20];
    let mut v1 = BTreeMap::new();
    for (i, size) in sizes.iter().enumerate() {
        let name = format!("obj-{i}");
        let d = pattern(i as u64, *size);
        base.write_full(&name, d.clone()).await.expect("write v1");
        v1.insert(name, d);
    }
    // Snapshot 1, then overwrites, a full write and a removal.
    let io1 = ctx(1, &[1]);
    let mut v2 = v1.clone();
    for (i, (name, d)) in v2.iter_mut().enumerate() {
        match i % 3 {
            0 => {
                let w = pattern(100 + i as u64, 3000);
                io1.write(name, 10, w.clone()).await.expect("overwrite");
                if d.len() < 3010 {
                    d.resize(3010, 0);
                }
                d[10..3010].copy_from_slice(&w);
            }
            1 => {
                *d = pattern(200 + i as u64, 9000);
                io1.write_full(name, d.clone()).await.expect("write_full");
            }
            _ => {}
        }
    }
    io1.remove("obj-2").await.expect("remove");
    v2.remove("obj-2");
    let at1 = base.at_snap(1);
    check_objects(&at1, &v1, "snapshot 1").await;
    check_objects(&base, &v2, "head after snapshot 1").await;
    let e = base.read("obj-2", 0, 0).await.expect_err("removed head");
    assert!(e.is_not_found(), "{e}");
    let mut names: Vec<String> = base
        .list_all()
        .await
        .expect("list")
        .into_iter()
        .map(|o| o.name)
        .collect();
    names.sort();
    assert_eq!(
        names,
        v2.keys().cloned().collect::<Vec<_>>(),
        "no whiteout listed"
    );
    let e = at1
        .write_full("obj-0", vec![1])
        .await
        .expect_err("write at a snapshot");
    assert!(e.to_string().contains("read-only"), "{e}");

    // osd.1 down: snapshot reads are decoded; snapshot 2 is taken and
    // written while its shard misses the clones.
    c.kill(1).await;
    check_objects(&at1, &v1, "snapshot 1, osd.1 down").await;
    let io2 = ctx(2, &[2, 1]);
    let mut v3 = v2.clone();
    for (i, (name, d)) in v3.iter_mut().enumerate() {
        *d = pattern(300 + i as u64, 4096 * (i + 1) + 7);
        io2.write_full(name, d.clone()).await.expect("write v3");
    }
    check_objects(&base.at_snap(2), &v2, "snapshot 2, osd.1 down").await;
    c.restart(1).await;
    c.wait_clean(Duration::from_secs(90)).await;

    // osd.1's chunks and clones were rebuilt: lose osd.2 and read all.
    c.kill(2).await;
    c.wait_active(Duration::from_secs(60)).await;
    check_objects(&at1, &v1, "snapshot 1, rebuilt osd.1 serving").await;
    check_objects(&base.at_snap(2), &v2, "snapshot 2, rebuilt osd.1 serving").await;
    check_objects(&base, &v3, "head, rebuilt osd.1 serving").await;
    c.restart(2).await;
    c.wait_clean(Duration::from_secs(90)).await;

    // Snapshot 1 removed: trims drop its clones; snapshot 2 stays.
    let trim = ctx(2, &[2]);
    for name in v1.keys() {
        trim.snap_trim(name).await.expect("trim");
    }
    for name in v1.keys() {
        match at1.read(name, 0, 0).await {
            Err(e) => assert!(e.is_not_found(), "{name}: {e}"),
            Ok(d) => assert_eq!(Some(&d), v2.get(name), "{name} at a removed snapshot"),
        }
    }
    check_objects(&base.at_snap(2), &v2, "snapshot 2 after the trim").await;
}

async fn reopen(c: &Cluster, id: i32) -> cairn_store::Store {
    let t0 = std::time::Instant::now();
    loop {
        match cairn_store::Store::open(c.store_cfg(id)) {
            Ok(s) => return s,
            Err(e) if t0.elapsed() < Duration::from_secs(20) => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("reopening osd.{id}'s store: {e}"),
        }
    }
}

/// The seed-000 rule: 4+2, three hosts, two chunks per host.
const SEED000_RULE: &str = "
rule ec-rule {
\tid 7
\ttype erasure
\tstep set_chooseleaf_tries 5
\tstep set_choose_tries 100
\tstep take default class hdd
\tstep choose indep 3 type host
\tstep choose indep 2 type osd
\tstep emit
}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ec42_seed000_rule_survives_a_host() {
    let mut c = Cluster::start(3, 2, 4, 512 << 20).await;
    let text = c.current().crush.to_text() + SEED000_RULE;
    c.apply(MonCommand::SetCrushMap {
        encoded: text.into_bytes(),
    });
    create_ec_pool(
        &mut c,
        "ec42",
        &[("k", "4"), ("m", "2"), ("crush-failure-domain", "host")],
        Some("ec-rule"),
    );
    assert_eq!(
        c.current()
            .pools
            .values()
            .find(|p| p.name == "ec42")
            .unwrap()
            .min_size,
        5
    );
    c.wait_active(Duration::from_secs(60)).await;
    let io = c.client().ioctx("ec42").expect("pool");
    let mut objs = BTreeMap::new();
    for (i, size) in [0usize, 1, 16385, 100_000, 4 << 20].into_iter().enumerate() {
        let name = format!("o{i}");
        let data = pattern(100 + i as u64, size);
        io.write_full(&name, data.clone()).await.expect("write");
        objs.insert(name, data);
    }
    // One OSD lost: 5 chunks = min_size, still readable and writable.
    c.kill(0).await;
    c.wait_active(Duration::from_secs(60)).await;
    check_objects(&io, &objs, "osd.0 down").await;
    io.write_full("after-one", pattern(9, 50_000))
        .await
        .expect("write");
    objs.insert("after-one".into(), pattern(9, 50_000));
    // Its host-mate too: the whole host node0 is gone, 4 = k chunks left,
    // below min_size 5: the PGs stop serving (nothing is served without
    // redundancy unless the operator says so).
    c.kill(1).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let inactive = c
        .primary_states()
        .values()
        .filter(|s| !s.contains("active"))
        .count();
    assert!(
        inactive > 0,
        "PGs with 4 of 6 chunks must not be active at min_size 5"
    );
    // The operator lowers min_size to k: everything readable and writable.
    pool_set(&mut c, "ec42", "min_size", "4");
    c.wait_active(Duration::from_secs(60)).await;
    check_objects(&io, &objs, "host node0 down, min_size 4").await;
    io.write_full("after-host", pattern(10, 70_000))
        .await
        .expect("write");
    objs.insert("after-host".into(), pattern(10, 70_000));
    // The host comes back: its shards are rebuilt; then lose another host.
    c.restart(0).await;
    c.restart(1).await;
    c.wait_clean(Duration::from_secs(90)).await;
    c.kill(4).await;
    c.kill(5).await;
    c.wait_active(Duration::from_secs(60)).await;
    check_objects(&io, &objs, "host node2 down after recovery").await;
}

/// This process's CPU time (user + system), from /proc (Linux).
fn process_cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which ends with ')'): utime is the
    // 12th, stime the 13th, in clock ticks (100 per second on Linux).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    (f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)) as f64 / 100.0
}

/// `rados bench`-like 4 MiB writes then reads of what was written, `threads`
/// in flight; returns (write MB/s, read MB/s).
async fn bench_pool(io: &IoCtx, label: &str, threads: usize, secs: u64) -> (f64, f64) {
    let size = 4usize << 20;
    let data = bytes::Bytes::from(pattern(3, size));
    let written = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = std::time::Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for t in 0..threads {
        let (io, data, written, stop) = (io.clone(), data.clone(), written.clone(), stop.clone());
        set.spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                io.write_full(&format!("bench-{t}-{i}"), data.clone())
                    .await
                    .expect("bench write");
                written.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            (t, i)
        });
    }
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut per_thread = vec![0u64; threads];
    while let Some(n) = set.join_next().await {
        let (t, count) = n.expect("task");
        per_thread[t] = count;
    }
    let wsecs = t0.elapsed().as_secs_f64();
    let n = written.load(Ordering::Relaxed);
    let w = n as f64 * size as f64 / wsecs / 1e6;
    let t1 = std::time::Instant::now();
    let mut set = tokio::task::JoinSet::new();
    let per = Arc::new(per_thread);
    for t in 0..threads {
        let (io, per) = (io.clone(), per.clone());
        set.spawn(async move {
            let mut bytes = 0u64;
            for (owner, &count) in per.iter().enumerate() {
                for i in (t as u64..count).step_by(threads) {
                    let got = io
                        .read(&format!("bench-{owner}-{i}"), 0, 0)
                        .await
                        .expect("bench read");
                    bytes += got.len() as u64;
                }
            }
            bytes
        });
    }
    let mut bytes = 0u64;
    while let Some(b) = set.join_next().await {
        bytes += b.expect("task");
    }
    let r = bytes as f64 / t1.elapsed().as_secs_f64() / 1e6;
    println!(
        "{label}: 4 MiB x {n} written at {w:.1} MB/s; read back at {r:.1} MB/s (-t {threads})"
    );
    (w, r)
}

/// EC 2+1 against replicated size 3, in one process (3 OSDs on temp dirs).
/// Runs only with CAIRN_BENCH=1 (use --release).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ec_bench_against_replicated() {
    if std::env::var("CAIRN_BENCH")
        .map(|v| v != "1")
        .unwrap_or(true)
    {
        eprintln!("set CAIRN_BENCH=1 (and use --release) to run the EC benchmark");
        return;
    }
    let secs = std::env::var("CAIRN_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let mut c = Cluster::start(3, 1, 32, 2 << 30).await;
    create_ec_pool(
        &mut c,
        "ec21",
        &[("k", "2"), ("m", "1"), ("crush-failure-domain", "host")],
        None,
    );
    c.wait_active(Duration::from_secs(60)).await;
    let rados = c.client();
    bench_pool(
        &rados.ioctx("rbd").expect("pool"),
        "replicated size 3",
        16,
        secs,
    )
    .await;
    let enc0 = cairn_osd::ec_encode_totals();
    let cpu0 = process_cpu_secs();
    bench_pool(&rados.ioctx("ec21").expect("pool"), "ec 2+1", 16, secs).await;
    let cpu = process_cpu_secs() - cpu0;
    let enc = cairn_osd::ec_encode_totals();
    let enc_secs = (enc.nanos - enc0.nanos) as f64 / 1e9;
    println!(
        "ec 2+1 encode: {} calls, {:.0} MB in {enc_secs:.2} s ({:.2} GB/s); process CPU during the EC run {cpu:.1} s (clients and OSDs): encoding {:.1} %",
        enc.calls - enc0.calls,
        (enc.bytes - enc0.bytes) as f64 / 1e6,
        (enc.bytes - enc0.bytes) as f64 / enc_secs.max(1e-9) / 1e9,
        100.0 * enc_secs / cpu.max(1e-9)
    );
}
