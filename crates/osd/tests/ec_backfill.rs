//! Background backfill of erasure-coded PGs: an OSD marked out under an
//! EC 2+1 pool with writes running. The PGs it leaves ask for a positional
//! `pg_temp` (the old shard positions keep serving), stay active while the
//! new member's chunks are rebuilt from k shards in the background, and
//! get clean: every acknowledged object reads back, every chunk is on the
//! new up set at its position, misplaced copies go to 0, and the out
//! OSD's shards are deleted. Also: `nobackfill` holds an EC backfill (the
//! PG stays remapped, active and writable) until it is unset, and an EC
//! backfill interrupted by new intervals resumes from the target's mark,
//! and an OSD moved to another position by CRUSH gets a fresh copy of it
//! while its old position's copy is deleted once clean.

mod common;
use cairn_map::{MonCommand, OsdFlag};
use cairn_store::Store;
use common::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Objects written before the placement change: more than a clean PG log
/// holds (250 entries, trimmed in steps of 64: at most 313) per PG (pg_num
/// 4), so new members need a backfill.
const PRELOAD_OBJECTS: u64 = 1600;
const OBJ_BYTES: usize = 6000;
const EC_POOL_ID: u64 = 2;

fn create_ec21(c: &mut Cluster) {
    assert_eq!(c.create_ec21_pool("ec", 4), EC_POOL_ID);
}

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
                    // Rewrites of preloaded objects (some already copied to
                    // the new member, some not) and new objects.
                    let name = if i.is_multiple_of(2) {
                        format!("pre-{}", (w * 97 + i * 31) % PRELOAD_OBJECTS)
                    } else {
                        format!("live-{w}-{}", i % 40)
                    };
                    let seed = 1_000_000 * (w + 1) + i;
                    io.write_full(&name, pattern(seed, OBJ_BYTES))
                        .await
                        .expect("write during EC backfill");
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

/// Every object as last acknowledged (preloaded ones unless rewritten).
async fn verify(io: &cairn_client::IoCtx, acked: &BTreeMap<String, u64>, what: &str) {
    for i in 0..PRELOAD_OBJECTS {
        let name = format!("pre-{i}");
        let seed = acked.get(&name).copied().unwrap_or(i);
        let got = io.read(&name, 0, 0).await.expect("read");
        assert!(got == pattern(seed, OBJ_BYTES), "{what}: {name} differs");
    }
    for (name, seed) in acked.iter().filter(|(n, _)| n.starts_with("live-")) {
        let got = io.read(name, 0, 0).await.expect("read");
        assert!(
            got == pattern(*seed, OBJ_BYTES),
            "{what}: {name} lost its acked write"
        );
    }
}

/// Objects of each EC shard collection (seed, shard) in a stopped OSD's store.
fn ec_shards(c: &Cluster, id: i32) -> BTreeMap<(u32, u8), usize> {
    let store = Store::open(c.store_cfg(id)).expect("open store");
    let mut out = BTreeMap::new();
    for coll in store.list_collections().expect("collections") {
        if coll.pool != EC_POOL_ID {
            continue;
        }
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
        out.insert((coll.seed, coll.shard), n);
    }
    out
}

fn ec_states(c: &Cluster) -> BTreeMap<String, String> {
    c.primary_states()
        .into_iter()
        .filter(|(pg, _)| pg.starts_with(&format!("{EC_POOL_ID}.")))
        .collect()
}

/// Misplaced object copies the EC PGs' primaries report.
fn misplaced(c: &Cluster) -> u64 {
    c.osds
        .values()
        .flatten()
        .flat_map(|o| {
            let id = o.id();
            o.pg_stats()
                .into_iter()
                .filter(move |s| s.primary == Some(id))
        })
        .filter(|s| s.pgid.starts_with(&format!("{EC_POOL_ID}.")))
        .map(|s| s.misplaced_objects)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ec21_out_osd_backfills_in_the_background() {
    let mut c = Cluster::start_with(4, 1, 4, 512 << 20, vec![], true).await;
    create_ec21(&mut c);
    c.wait_active(Duration::from_secs(30)).await;
    let io = c.client().ioctx("ec").expect("pool");
    preload(&io, PRELOAD_OBJECTS, OBJ_BYTES).await;
    let map = c.current();
    // The OSD in the most EC PGs goes out.
    let mut count: BTreeMap<i32, usize> = BTreeMap::new();
    for seed in 0..4 {
        for o in map.pg_to_up(EC_POOL_ID, seed).unwrap().up {
            *count.entry(o).or_default() += 1;
        }
    }
    let victim = *count.iter().max_by_key(|(_, n)| **n).unwrap().0;
    let load = Load::start(&io, 4);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = Instant::now();
    c.apply(MonCommand::OsdOut { ids: vec![victim] });
    let mut saw_remapped = false;
    let mut saw_misplaced = 0u64;
    let mut acks_while_remapped = 0;
    let deadline = Instant::now() + Duration::from_secs(50);
    loop {
        let st = ec_states(&c);
        if st.values().any(|s| s.contains("remapped")) {
            let a0 = load.acks.load(Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(200)).await;
            acks_while_remapped += load.acks.load(Ordering::Relaxed) - a0;
            if !saw_remapped {
                eprintln!("remapped after {:?}: {st:?}", t0.elapsed());
            }
            saw_remapped = true;
            saw_misplaced = saw_misplaced.max(misplaced(&c));
        }
        let all_clean = c
            .primary_states()
            .values()
            .filter(|s| s.as_str() == "active+clean")
            .count()
            == 8;
        if all_clean && c.current().pg_temp.is_empty() && c.current().epoch > map.epoch {
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
                "not clean after backfill: {:?}, pg_temp {:?}",
                c.primary_states(),
                c.current().pg_temp
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "clean after {:?}; {acks_while_remapped} writes acknowledged while remapped; at most {saw_misplaced} misplaced",
        t0.elapsed()
    );
    assert!(saw_remapped, "no EC PG went through pg_temp (remapped)");
    assert!(
        acks_while_remapped > 0,
        "client I/O stalled during the EC backfill"
    );
    assert_eq!(misplaced(&c), 0, "misplaced copies left once clean");
    let acked = load.finish().await;
    verify(&io, &acked, "after the backfill").await;
    // Strays are removed asynchronously once clean.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let map = c.current();
    let ids: Vec<i32> = map.osds.keys().copied().collect();
    for id in &ids {
        c.crash(*id);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held: BTreeMap<i32, BTreeMap<(u32, u8), usize>> =
        ids.iter().map(|id| (*id, ec_shards(&c, *id))).collect();
    for seed in 0..4u32 {
        let up = map.pg_to_up(EC_POOL_ID, seed).unwrap().up;
        assert_eq!(up.len(), 3);
        assert!(!up.contains(&victim));
        let counts: Vec<usize> = up
            .iter()
            .enumerate()
            .map(|(s, o)| held[o].get(&(seed, s as u8)).copied().unwrap_or(0))
            .collect();
        assert!(
            counts.iter().all(|n| *n == counts[0] && *n > 0),
            "pg {EC_POOL_ID}.{seed:x}: shards on {up:?} hold {counts:?} objects ({held:?})"
        );
        // No OSD keeps a copy of another position.
        for (o, shards) in &held {
            for (s, shard) in shards.keys() {
                if *s == seed {
                    assert_eq!(
                        up.get(usize::from(*shard)),
                        Some(o),
                        "osd.{o} still holds shard {shard} of pg {EC_POOL_ID}.{seed:x} (up {up:?})"
                    );
                }
            }
        }
    }
    assert!(
        held[&victim].is_empty(),
        "osd.{victim} (out) still holds {:?}",
        held[&victim]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ec21_nobackfill_holds_the_backfill_while_the_pg_serves() {
    let mut c = Cluster::start_with(4, 1, 4, 512 << 20, vec![], true).await;
    create_ec21(&mut c);
    c.wait_active(Duration::from_secs(30)).await;
    let io = c.client().ioctx("ec").expect("pool");
    preload(&io, PRELOAD_OBJECTS, OBJ_BYTES).await;
    c.apply(MonCommand::OsdSetFlag {
        flag: OsdFlag::NoBackfill,
    });
    let victim = c.current().pg_to_up(EC_POOL_ID, 0).unwrap().up[1];
    c.apply(MonCommand::OsdOut { ids: vec![victim] });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = ec_states(&c);
        if st.values().any(|s| s.contains("backfill_wait")) {
            break;
        }
        assert!(Instant::now() < deadline, "no backfill_wait: {st:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Held: still remapped, and serving, two seconds later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let st = ec_states(&c);
    assert!(
        st.values().any(|s| s.contains("remapped+backfill_wait")),
        "{st:?}"
    );
    assert!(st.values().all(|s| s.contains("active")), "{st:?}");
    assert!(!c.current().pg_temp.is_empty());
    assert!(misplaced(&c) > 0, "misplaced chunks not reported");
    let data = pattern(7, 3 * OBJ_BYTES);
    io.write_full("during-nobackfill", data.clone())
        .await
        .expect("writes continue under nobackfill");
    assert!(io.read("during-nobackfill", 0, 0).await.expect("read") == data);
    c.apply(MonCommand::OsdUnsetFlag {
        flag: OsdFlag::NoBackfill,
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = ec_states(&c);
        let clean = st.len() == 4 && st.values().all(|s| s == "active+clean");
        if clean && c.current().pg_temp.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "not clean after unset: {st:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(misplaced(&c), 0);
    assert!(io.read("during-nobackfill", 0, 0).await.expect("read") == data);
    verify(&io, &BTreeMap::new(), "after nobackfill was unset").await;
}

/// Objects osd.`id` copied as a recovery or backfill sender since it
/// started (0 when it is not running).
fn copied_by(c: &Cluster, id: i32) -> u64 {
    c.osds
        .get(&id)
        .and_then(|o| o.as_ref())
        .and_then(|o| o.copy_window())
        .map(|w| w.objects)
        .unwrap_or(0)
}

/// An EC backfill interrupted mid-copy resumes from the target's durable
/// mark instead of starting over. One PG (2+1, 400 objects: more than a
/// clean log, so a new member needs a backfill), paced by
/// `osd_recovery_sleep`; an OSD goes out and, once some batches of its
/// replacement (the target) are durable, the primary is killed (a new
/// interval: the out OSD, still serving its position under `pg_temp`,
/// becomes primary and takes the backfill over) and later restarted
/// (another interval, the old primary again). The objects copied after
/// the kill, summed over every OSD (nothing else moves: no writes, and
/// the replicated pool is empty), are no more than the target still
/// lacked. Once clean, the third member is stopped and every object reads
/// back through the target's chunks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ec21_interrupted_backfill_resumes_where_it_stopped() {
    const OBJECTS: u64 = 400;
    let mut c = Cluster::start_with(
        4,
        1,
        1,
        512 << 20,
        vec![("osd_recovery_sleep", "0.4")],
        true,
    )
    .await;
    c.create_ec21_pool("ecr", 1);
    assert!(c.current().pools.contains_key(&EC_POOL_ID));
    c.wait_active(Duration::from_secs(30)).await;
    let io = c.client().ioctx("ecr").expect("pool");
    preload(&io, OBJECTS, OBJ_BYTES).await;
    let up = c.current().pg_to_up(EC_POOL_ID, 0).unwrap().up;
    let (primary, victim, other) = (up[0], up[1], up[2]);
    let ids: Vec<i32> = c.current().osds.keys().copied().collect();
    let total = |c: &Cluster| ids.iter().map(|&id| copied_by(c, id)).sum::<u64>();
    assert_eq!(
        total(&c),
        0,
        "something was copied before the placement change"
    );
    c.apply(MonCommand::OsdOut { ids: vec![victim] });
    // Wait for the first durable batches on the target.
    let deadline = Instant::now() + Duration::from_secs(30);
    while total(&c) == 0 {
        assert!(
            Instant::now() < deadline,
            "no backfill batch acknowledged: {:?}",
            ec_states(&c)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let target = c.current().pg_to_up(EC_POOL_ID, 0).unwrap().up[1];
    assert!(target != victim && !up.contains(&target));
    let before: BTreeMap<i32, u64> = ids.iter().map(|&id| (id, copied_by(&c, id))).collect();
    let first: u64 = before.values().sum();
    assert!(
        first < OBJECTS,
        "the backfill ended before the interruption"
    );
    eprintln!("{first} of {OBJECTS} objects copied to osd.{target}; killing primary osd.{primary}");
    c.kill(primary).await;
    // The out OSD (first live position) takes the backfill over.
    let deadline = Instant::now() + Duration::from_secs(30);
    while copied_by(&c, victim) <= before[&victim] {
        let done = !c.current().pg_temp.keys().any(|p| p.pool.0 == EC_POOL_ID);
        if done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "osd.{victim} did not take the backfill over: {:?}",
            ec_states(&c)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    c.restart(primary).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = ec_states(&c);
        let clean = st.len() == 1 && st.values().all(|s| s == "active+clean");
        if clean && c.current().pg_temp.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "not clean: {st:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let second: u64 = ids
        .iter()
        .map(|&id| {
            let now = copied_by(&c, id);
            if id == primary {
                now
            } else {
                now - before[&id]
            }
        })
        .sum();
    eprintln!(
        "after the interruption {second} objects were copied ({first} before, {OBJECTS} in the PG)"
    );
    assert!(second > 0, "nothing was copied after the interruption");
    assert!(
        second <= OBJECTS - first,
        "the backfill started over: {second} copies after the interruption, {first} before, {OBJECTS} objects"
    );
    // Every object reads back, and through the target's chunks once the
    // third member is gone (2+1: data chunks of the primary and target).
    verify_ecr(&io, OBJECTS, "after the resumed backfill").await;
    c.kill(other).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = ec_states(&c);
        if st.len() == 1 && st.values().all(|s| s.starts_with("active")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not active without osd.{other}: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    verify_ecr(&io, OBJECTS, "with the target's chunks").await;
}

/// The preloaded objects `pre-0 .. pre-{count}` read back exactly.
async fn verify_ecr(io: &cairn_client::IoCtx, count: u64, what: &str) {
    for i in 0..count {
        let name = format!("pre-{i}");
        let got = io.read(&name, 0, 0).await.expect("read");
        assert!(got == pattern(i, OBJ_BYTES), "{what}: {name} differs");
    }
}

/// The shard-move cleanup path: when CRUSH moves an OSD to another
/// position of a PG (indep placement can shift a member when another goes
/// out), the OSD serves the new position from a fresh collection (rebuilt
/// like any new member's) and deletes its copy of the old position once
/// the PG is clean. The test looks for an `osd out` that moves some other
/// OSD between positions (pg_num 8, 2+1 over four hosts), applies it, and
/// checks on disk: the moved OSD holds the new position's chunks of every
/// object of that PG and nothing of the old position; every object reads
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ec21_a_shard_moved_by_crush_gets_a_fresh_copy_and_the_stale_one_goes() {
    const OBJECTS: u64 = 160;
    const PG_NUM: u32 = 8;
    let mut c = Cluster::start_with(4, 1, 1, 512 << 20, vec![], true).await;
    c.create_ec21_pool("ecm", PG_NUM);
    assert!(c.current().pools.contains_key(&EC_POOL_ID));
    c.wait_active(Duration::from_secs(30)).await;
    let io = c.client().ioctx("ecm").expect("pool");
    preload(&io, OBJECTS, OBJ_BYTES).await;
    // An `osd out` that moves another OSD from one position of a PG to
    // another (found on a copy of the map).
    let before = c.current();
    let admin = cairn_map::ApplyContext {
        caller: cairn_types::EntityName::client("admin"),
        generated_secret: None,
    };
    let mut found = None;
    'search: for &out in before.osds.keys() {
        let mut after = before.clone();
        after
            .apply(&MonCommand::OsdOut { ids: vec![out] }, &admin)
            .expect("out on a copy of the map");
        for seed in 0..PG_NUM {
            let old = before.pg_to_up(EC_POOL_ID, seed).unwrap().up;
            let new = after.pg_to_up(EC_POOL_ID, seed).unwrap().up;
            for (from, o) in old.iter().enumerate() {
                if *o == out {
                    continue;
                }
                if let Some(to) = new.iter().position(|x| x == o).filter(|&p| p != from) {
                    found = Some((out, seed, *o, from, to));
                    break 'search;
                }
            }
        }
    }
    let (out, seed, moved, from, to) =
        found.expect("no single 'osd out' moves an OSD between positions of an EC PG here");
    eprintln!("osd out {out}: osd.{moved} moves from shard {from} to shard {to} of pg {EC_POOL_ID}.{seed:x}");
    c.apply(MonCommand::OsdOut { ids: vec![out] });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = ec_states(&c);
        let clean = st.len() == PG_NUM as usize && st.values().all(|s| s == "active+clean");
        if clean && c.current().pg_temp.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "not clean: {st:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    verify_ecr(&io, OBJECTS, "after the shard move").await;
    // The old position's copy is deleted asynchronously once clean.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let up = c.current().pg_to_up(EC_POOL_ID, seed).unwrap().up;
    assert_eq!(up[to], moved);
    let ids: Vec<i32> = c.current().osds.keys().copied().collect();
    for id in &ids {
        c.crash(*id);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held: BTreeMap<i32, BTreeMap<(u32, u8), usize>> =
        ids.iter().map(|id| (*id, ec_shards(&c, *id))).collect();
    assert!(
        !held[&moved].contains_key(&(seed, from as u8)),
        "osd.{moved} still holds shard {from} of pg {EC_POOL_ID}.{seed:x}: {:?}",
        held[&moved]
    );
    let counts: Vec<usize> = up
        .iter()
        .enumerate()
        .map(|(s, o)| held[o].get(&(seed, s as u8)).copied().unwrap_or(0))
        .collect();
    assert!(
        counts.iter().all(|n| *n == counts[0] && *n > 0),
        "pg {EC_POOL_ID}.{seed:x}: shards on {up:?} hold {counts:?} objects"
    );
}
