//! Backfill with pg_temp: an OSD marked out under a write load keeps its
//! PGs active (the old, complete set serves through pg_temp) while the new
//! members are backfilled in the background; then every PG is active+clean
//! with complete copies on the new set and the out OSD's copies removed.
//! Also: `nobackfill` holds a backfill (the PG stays remapped and active)
//! until it is unset, and `norecover` holds log recovery (the pushes and
//! pulls that bring a returning member up to date) until it is unset.

mod common;
use cairn_map::{MonCommand, OsdFlag};
use cairn_store::Store;
use common::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Objects written before the placement change: enough per PG (pg_num 4)
/// that the PG logs (250 entries when clean, at most 313 as they trim in
/// steps of 64) no longer cover them, so new members need a backfill
/// rather than log recovery.
const PRELOAD_OBJECTS: u64 = 1400;
const OBJ_BYTES: usize = 4096;

/// Writers rewriting their own objects until stopped; records the last
/// acknowledged seed per object.
struct Load {
    acked: Arc<Mutex<BTreeMap<String, u64>>>,
    acks: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    set: tokio::task::JoinSet<()>,
}

impl Load {
    fn start(io: &cairn_client::IoCtx, writers: u64) -> Load {
        let acked: Arc<Mutex<BTreeMap<String, u64>>> = Default::default();
        let acks = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut set = tokio::task::JoinSet::new();
        for w in 0..writers {
            let (io, acked, acks, stop) = (io.clone(), acked.clone(), acks.clone(), stop.clone());
            set.spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let name = format!("live-{w}-{}", i % 50);
                    let seed = 1_000_000 * (w + 1) + i;
                    io.write_full(&name, pattern(seed, OBJ_BYTES))
                        .await
                        .expect("write during backfill");
                    acked.lock().unwrap().insert(name, seed);
                    acks.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            });
        }
        Load {
            acked,
            acks,
            stop,
            set,
        }
    }

    async fn finish(mut self) -> BTreeMap<String, u64> {
        self.stop.store(true, Ordering::Relaxed);
        while let Some(r) = self.set.join_next().await {
            r.expect("writer");
        }
        let acked = self.acked.lock().unwrap().clone();
        acked
    }
}

async fn verify(io: &cairn_client::IoCtx, acked: &BTreeMap<String, u64>) {
    for i in 0..PRELOAD_OBJECTS {
        let got = io.read(&format!("pre-{i}"), 0, 0).await.expect("read");
        assert_eq!(got, pattern(i, OBJ_BYTES), "pre-{i}");
    }
    for (name, seed) in acked {
        let got = io.read(name, 0, 0).await.expect("read");
        assert_eq!(
            got,
            pattern(*seed, OBJ_BYTES),
            "{name} lost its acked write"
        );
    }
}

/// Objects of each PG collection in a stopped OSD's store.
fn store_pgs(c: &Cluster, id: i32) -> BTreeMap<u32, usize> {
    let store = Store::open(c.store_cfg(id)).expect("open store");
    let mut out = BTreeMap::new();
    for coll in store.list_collections().expect("collections") {
        let mut n = 0;
        let mut after = None;
        loop {
            let (objs, next) =
                cairn_osd::exec::list_objects(&store, coll, after.as_ref(), 1024).expect("list");
            n += objs.len();
            match next {
                Some(c) => after = Some(c),
                None => break,
            }
        }
        out.insert(coll.seed, n);
    }
    out
}

fn states(c: &Cluster) -> Vec<String> {
    c.primary_states().into_values().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn out_osd_backfills_in_the_background_then_strays_go() {
    let mut c = Cluster::start_with(4, 1, 4, 512 << 20, vec![], true).await;
    let io = c.client().ioctx("rbd").expect("pool");
    preload(&io, PRELOAD_OBJECTS, OBJ_BYTES).await;
    let map = c.current();
    // The OSD in the most PGs goes out.
    let mut count: BTreeMap<i32, usize> = BTreeMap::new();
    for seed in 0..4 {
        for o in map.pg_to_up(1, seed).unwrap().up {
            *count.entry(o).or_default() += 1;
        }
    }
    let victim = *count.iter().max_by_key(|(_, n)| **n).unwrap().0;
    let load = Load::start(&io, 4);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = Instant::now();
    c.apply(MonCommand::OsdOut { ids: vec![victim] });
    // The remapped PGs must serve I/O while they backfill.
    let mut saw_remapped = false;
    let mut acks_while_remapped = 0;
    let deadline = Instant::now() + Duration::from_secs(50);
    loop {
        let st = states(&c);
        let remapped = st.iter().any(|s| s.contains("remapped"));
        if remapped {
            let a0 = load.acks.load(Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(200)).await;
            let grew = load.acks.load(Ordering::Relaxed) - a0;
            if !saw_remapped {
                eprintln!("remapped after {:?}: {st:?}", t0.elapsed());
            }
            saw_remapped = true;
            acks_while_remapped += grew;
        }
        let clean = st.len() == 4 && st.iter().all(|s| s == "active+clean");
        if clean && c.current().pg_temp.is_empty() && c.current().epoch > map.epoch {
            break;
        }
        if Instant::now() > deadline {
            for (id, o) in &c.osds {
                if let Some(o) = o {
                    for s in o.pg_stats() {
                        eprintln!("osd.{id}: {s:?}");
                    }
                }
            }
            panic!(
                "not clean after backfill: {st:?}, pg_temp {:?}",
                c.current().pg_temp
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "clean after {:?}; {acks_while_remapped} writes acknowledged while remapped",
        t0.elapsed()
    );
    assert!(saw_remapped, "no PG went through pg_temp (remapped)");
    assert!(
        acks_while_remapped > 0,
        "client I/O stalled during the backfill"
    );
    let acked = load.finish().await;
    verify(&io, &acked).await;
    // Strays are removed asynchronously once clean.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let map = c.current();
    let ids: Vec<i32> = map.osds.keys().copied().collect();
    for id in &ids {
        c.crash(*id);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held: BTreeMap<i32, BTreeMap<u32, usize>> =
        ids.iter().map(|id| (*id, store_pgs(&c, *id))).collect();
    for seed in 0..4u32 {
        let up = map.pg_to_up(1, seed).unwrap().up;
        assert_eq!(up.len(), 3);
        let counts: Vec<usize> = up
            .iter()
            .map(|o| held[o].get(&seed).copied().unwrap_or(0))
            .collect();
        assert!(
            counts.iter().all(|n| *n == counts[0] && *n > 0),
            "pg 1.{seed:x}: copies on {up:?} hold {counts:?} objects"
        );
    }
    assert!(
        held[&victim].is_empty(),
        "osd.{victim} (out) still holds {:?}",
        held[&victim]
    );
}

/// A replicated stray no primary heard of: an OSD is killed and marked out
/// while down (its PGs recover on the others without it), then restarted,
/// up but out. Its copies lie outside every up and acting set and no PG
/// re-peers; it tells each primary, which has it delete the copy once the
/// PG is active+clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stray_no_primary_heard_of_is_removed() {
    let mut c = Cluster::start_with(4, 1, 4, 256 << 20, vec![], true).await;
    let io = c.client().ioctx("rbd").expect("pool");
    preload(&io, 200, OBJ_BYTES).await;
    c.wait_clean(Duration::from_secs(60)).await;
    let map = c.current();
    let mut count: BTreeMap<i32, usize> = BTreeMap::new();
    for seed in 0..4 {
        for o in map.pg_to_up(1, seed).unwrap().up {
            *count.entry(o).or_default() += 1;
        }
    }
    let victim = *count.iter().max_by_key(|(_, n)| **n).unwrap().0;
    c.kill(victim).await;
    c.apply(MonCommand::OsdOut { ids: vec![victim] });
    c.wait_clean(Duration::from_secs(60)).await;
    let t0 = Instant::now();
    while !c.current().pg_temp.is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "pg_temp never cleared"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.wait_clean(Duration::from_secs(60)).await;
    c.restart(victim).await;
    // The restarted OSD's PG actors publish their stats once they run:
    // empty stats mean "removed" only after they were seen. (If removal
    // beats the 10 ms polls, the store check at the end still decides.)
    let t0 = Instant::now();
    let mut seen_loaded = false;
    loop {
        let held: Vec<String> = c.osds[&victim]
            .as_ref()
            .expect("victim running")
            .pg_stats()
            .into_iter()
            .map(|s| s.pgid)
            .collect();
        seen_loaded |= !held.is_empty();
        if held.is_empty() && (seen_loaded || t0.elapsed() > Duration::from_secs(30)) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "osd.{victim} (out) still holds {held:?} {:?} after its restart",
            t0.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "osd.{victim}'s stray copies removed {:.1} s after its restart",
        t0.elapsed().as_secs_f64()
    );
    for s in 0..200u64 {
        let got = io.read(&format!("pre-{s}"), 0, 0).await.expect("read");
        assert_eq!(got, pattern(s, OBJ_BYTES), "pre-{s}");
    }
    c.crash(victim);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = store_pgs(&c, victim);
    assert!(held.is_empty(), "osd.{victim}'s store still holds {held:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nobackfill_holds_backfill_until_unset() {
    let mut c = Cluster::start_with(4, 1, 4, 512 << 20, vec![], true).await;
    let io = c.client().ioctx("rbd").expect("pool");
    preload(&io, PRELOAD_OBJECTS, OBJ_BYTES).await;
    c.apply(MonCommand::OsdSetFlag {
        flag: OsdFlag::NoBackfill,
    });
    c.apply(MonCommand::OsdOut { ids: vec![0] });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = states(&c);
        if st.iter().any(|s| s.contains("backfill_wait")) {
            break;
        }
        assert!(Instant::now() < deadline, "no backfill_wait: {st:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Held: still remapped (and serving) two seconds later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let st = states(&c);
    assert!(
        st.iter().any(|s| s.contains("remapped+backfill_wait")),
        "{st:?}"
    );
    assert!(st.iter().all(|s| s.contains("active")), "{st:?}");
    assert!(!c.current().pg_temp.is_empty());
    io.write_full("during-nobackfill", pattern(7, OBJ_BYTES))
        .await
        .expect("writes continue under nobackfill");
    c.apply(MonCommand::OsdUnsetFlag {
        flag: OsdFlag::NoBackfill,
    });
    c.wait_clean(Duration::from_secs(60)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.current().pg_temp.is_empty() {
        assert!(Instant::now() < deadline, "pg_temp never cleared");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        io.read("during-nobackfill", 0, 0).await.expect("read"),
        pattern(7, OBJ_BYTES)
    );
}

/// An OSD that missed writes while down comes back under `norecover` (the
/// seed write-up's power-cut routine sets it with noout and nobackfill):
/// its PGs still catch up from the log and serve, because holding log
/// recovery would leave them unable to serve until the flag is unset.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn norecover_does_not_keep_a_returning_osd_from_serving() {
    let mut c = Cluster::start(3, 1, 4, 512 << 20).await;
    let io = c.client().ioctx("rbd").expect("pool");
    preload(&io, 64, OBJ_BYTES).await;
    c.wait_clean(Duration::from_secs(60)).await;
    c.kill(2).await;
    c.wait_active(Duration::from_secs(60)).await;
    for i in 0..64u64 {
        io.write_full(&format!("missed-{i}"), pattern(500 + i, OBJ_BYTES))
            .await
            .expect("write while osd.2 is down");
    }
    for flag in [OsdFlag::NoRecover, OsdFlag::NoBackfill] {
        c.apply(MonCommand::OsdSetFlag { flag });
    }
    c.restart(2).await;
    // Every PG has osd.2 (3 OSDs, size 3) and osd.2 lacks writes of each.
    c.wait_clean(Duration::from_secs(60)).await;
    for i in 0..64u64 {
        assert_eq!(
            io.read(&format!("missed-{i}"), 0, 0).await.expect("read"),
            pattern(500 + i, OBJ_BYTES)
        );
    }
    io.write_full("after-return", pattern(9, OBJ_BYTES))
        .await
        .expect("write under norecover");
}

/// A backfill target that stops answering while the monitors still show
/// it up (`nodown`) holds client writes for at most about
/// `BACKFILL_WRITE_WAIT` (2 s, plus a tick): it is then dropped from the
/// PG's writes (it is not an acting member, so no acknowledged write loses
/// a durable copy). Back again, it resumes and the PG goes clean with
/// every acknowledged write in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_backfill_target_does_not_stall_writes() {
    let mut c = Cluster::start_with(4, 1, 4, 512 << 20, vec![], true).await;
    let io = c.client().ioctx("rbd").expect("pool");
    preload(&io, PRELOAD_OBJECTS, OBJ_BYTES).await;
    // Backfill held, so nothing but client writes goes to the targets.
    for flag in [OsdFlag::NoBackfill, OsdFlag::NoDown] {
        c.apply(MonCommand::OsdSetFlag { flag });
    }
    c.apply(MonCommand::OsdOut { ids: vec![0] });
    let deadline = Instant::now() + Duration::from_secs(30);
    // A target and the PGs it is a backfill target of (it may be an
    // acting member of others: those wait for it, rightly, and get no
    // writes here).
    let (target, pgs) = loop {
        let map = c.current();
        let waiting = states(&c).iter().any(|s| s.contains("backfill_wait"));
        let mut targets: BTreeMap<i32, Vec<u32>> = BTreeMap::new();
        for (pgid, acting) in &map.pg_temp {
            let up = map.pg_to_up(pgid.pool.0, pgid.seed).expect("up").up;
            for o in up.into_iter().filter(|o| !acting.contains(o)) {
                targets.entry(o).or_default().push(pgid.seed);
            }
        }
        if let (true, Some((t, pgs))) = (waiting, targets.into_iter().next()) {
            break (t, pgs);
        }
        assert!(Instant::now() < deadline, "no backfill target appeared");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let pg_num = c.current().pools[&1].pg_num;
    let names: Vec<String> = (0..)
        .map(|i| format!("silent-{i}"))
        .filter(|n| {
            let h = cairn_ops::ObjectName::new("", n).hash();
            let seed = cairn_map::stable_mod(h, pg_num, pg_num.next_power_of_two() - 1);
            pgs.contains(&seed)
        })
        .take(20)
        .collect();
    c.crash(target);
    // Writes to those PGs: each must finish well before the old bound
    // (three peer timeouts, 30 s).
    let mut slowest = Duration::ZERO;
    let mut acked = BTreeMap::new();
    for (i, name) in (0u64..).zip(names) {
        let t0 = Instant::now();
        tokio::time::timeout(
            Duration::from_secs(20),
            io.write_full(&name, pattern(i + 77, OBJ_BYTES)),
        )
        .await
        .unwrap_or_else(|_| panic!("{name}: write held for 20 s by silent osd.{target}"))
        .expect("write");
        slowest = slowest.max(t0.elapsed());
        acked.insert(name, i + 77);
    }
    eprintln!("slowest write with osd.{target} silent: {slowest:?}");
    assert!(
        slowest < Duration::from_secs(8),
        "a write waited {slowest:?} for silent backfill target osd.{target}"
    );
    c.restart(target).await;
    c.apply(MonCommand::OsdUnsetFlag {
        flag: OsdFlag::NoBackfill,
    });
    c.wait_clean(Duration::from_secs(60)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.current().pg_temp.is_empty() {
        assert!(Instant::now() < deadline, "pg_temp never cleared");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    verify(&io, &acked).await;
}

/// Backfill throughput with the throttles lifted (ignored: a measurement,
/// run with `cargo test -p cairn-osd --test backfill -- --ignored
/// --nocapture backfill_throughput`; compare with `fio` on the same
/// filesystem, see bench/README.md). Prints MB/s of data moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore]
async fn backfill_throughput() {
    let objects: u64 = std::env::var("CAIRN_BACKFILL_OBJECTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let size = 1 << 20;
    let mut c = Cluster::start_with(
        4,
        1,
        4,
        4 << 30,
        vec![
            ("osd_max_backfills", "16"),
            ("osd_recovery_max_active", "16"),
        ],
        true,
    )
    .await;
    let io = c.client().ioctx("rbd").expect("pool");
    let mut set = tokio::task::JoinSet::new();
    for w in 0..8u64 {
        let io = io.clone();
        set.spawn(async move {
            let mut i = w;
            while i < objects {
                io.write_full(&format!("big-{i}"), pattern(i, size))
                    .await
                    .expect("write");
                i += 8;
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.expect("writer");
    }
    // Enough small writes that the logs no longer cover the big objects.
    preload(&io, PRELOAD_OBJECTS, OBJ_BYTES).await;
    let victim = c.current().pg_to_up(1, 0).unwrap().up[1];
    let cpu0 = process_cpu_secs();
    let t0 = Instant::now();
    c.apply(MonCommand::OsdOut { ids: vec![victim] });
    c.wait_clean(Duration::from_secs(600)).await;
    while !c.current().pg_temp.is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = process_cpu_secs() - cpu0;
    let moved: u64 = c
        .osds
        .values()
        .flatten()
        .flat_map(|o| o.pg_stats())
        .map(|s| s.recovered_bytes)
        .sum();
    // The copy itself: first batch sent to last batch durable, any OSD.
    let windows: Vec<cairn_osd::CopyWindow> = c
        .osds
        .values()
        .flatten()
        .filter_map(|o| o.copy_window())
        .collect();
    let first = windows
        .iter()
        .map(|w| w.first_sent)
        .min()
        .expect("nothing copied");
    let last = windows
        .iter()
        .map(|w| w.last_durable)
        .max()
        .expect("nothing copied");
    let copied: u64 = windows.iter().map(|w| w.bytes).sum();
    let copy_secs = last.duration_since(first).as_secs_f64();
    let mb = |b: u64| b as f64 / 1e6;
    eprintln!(
        "backfill (out of osd.{victim}): {:.1} MB moved in {secs:.2} s from out to clean = {:.1} MB/s; copy phase {:.1} MB in {copy_secs:.2} s = {:.1} MB/s",
        mb(moved),
        mb(moved) / secs,
        mb(copied),
        mb(copied) / copy_secs
    );
    eprintln!(
        "CPU (every OSD of this process, out to clean): {cpu:.2} s = {:.2} CPU-s per GB moved",
        cpu / (mb(moved) / 1e3)
    );
    match fio_write_bandwidth(c.dir.path()) {
        Ok(raw) => eprintln!(
            "fio on the same filesystem: {:.1} MB/s; copy phase = {:.2}x, out to clean = {:.2}x",
            raw / 1e6,
            mb(copied) * 1e6 / copy_secs / raw,
            mb(moved) * 1e6 / secs / raw
        ),
        Err(e) => eprintln!("no fio baseline: {e}"),
    }
}

/// CPU seconds (user + system) this process has used so far.
fn process_cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are
    // the 12th and 13th of them, in clock ticks (100 per second).
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / 100.0
}

/// fio's sequential write bandwidth (bytes/s) in `dir`: 4 MiB direct
/// writes of 1 GiB, iodepth 8, a final fsync (as bench/recovery.sh).
fn fio_write_bandwidth(dir: &std::path::Path) -> Result<f64, String> {
    let file = dir.join("fio.dat");
    let out = std::process::Command::new("fio")
        .args([
            "--name=raw-write",
            "--rw=write",
            "--bs=4M",
            "--size=1G",
            "--direct=1",
            "--ioengine=libaio",
            "--iodepth=8",
            "--end_fsync=1",
            "--output-format=json",
        ])
        .arg(format!("--filename={}", file.display()))
        .output()
        .map_err(|e| format!("running fio: {e}"))?;
    let _ = std::fs::remove_file(&file);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("fio output: {e}"))?;
    v["jobs"][0]["write"]["bw_bytes"]
        .as_f64()
        .ok_or_else(|| "fio output has no write bandwidth".to_string())
}
