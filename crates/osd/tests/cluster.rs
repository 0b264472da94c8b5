//! The replicated data path end to end: 3 hosts x 2 OSDs, size 3 /
//! min_size 2, real stores and sockets, the cairn-client library.

mod common;

use bytes::Bytes;
use cairn_ops::{msg_type, CmpOp, ObjectName, OpError, OpReply, OpRequest, OpStatus, SubOp};
use common::*;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// 1,000 objects of random sizes in 0..=8 MiB written, read back
/// byte-exact and listed. In CI the sizes are drawn log-uniformly (every
/// order of magnitude from bytes to 8 MiB equally likely, ~0.5 GiB in
/// all) to keep a debug run short; `CAIRN_SOAK=1` draws them uniformly
/// (~4 GiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn objects_of_random_sizes_round_trip() {
    const MAX: usize = 8 << 20;
    let count = 1000;
    let data_bytes = if soak() { 5 << 30 } else { 1 << 30 };
    let c = Cluster::start(3, 2, 32, data_bytes).await;
    let io = c.client().ioctx("rbd").expect("pool");
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let sizes: Vec<usize> = (0..count)
        .map(|i| match i {
            0 => 0,
            1 => MAX,
            _ if soak() => rng.gen_range(0..=MAX),
            // exp(U(0, ln(MAX + 1))) - 1: log-uniform over 0..=MAX.
            _ => ((rng.gen::<f64>() * ((MAX + 1) as f64).ln()).exp() as usize - 1).min(MAX),
        })
        .collect();
    let t0 = Instant::now();
    let sem = Arc::new(tokio::sync::Semaphore::new(8));
    let mut set = tokio::task::JoinSet::new();
    for (i, &size) in sizes.iter().enumerate() {
        let io = io.clone();
        let permit = sem.clone().acquire_owned().await.expect("sem");
        set.spawn(async move {
            io.write_full(&format!("obj-{i}"), pattern(i as u64, size))
                .await
                .expect("write");
            drop(permit);
        });
    }
    while let Some(r) = set.join_next().await {
        r.expect("task");
    }
    let total: usize = sizes.iter().sum();
    eprintln!(
        "wrote {count} objects, {} MiB, in {:?}",
        total >> 20,
        t0.elapsed()
    );
    for (i, &size) in sizes.iter().enumerate() {
        let name = format!("obj-{i}");
        let got = io.read(&name, 0, 0).await.expect("read");
        assert_eq!(got.len(), size, "{name} size");
        assert!(got == pattern(i as u64, size), "{name} content differs");
    }
    let mut names: Vec<String> = io
        .list_all()
        .await
        .expect("list")
        .into_iter()
        .map(|o| o.name)
        .collect();
    names.sort();
    let mut want: Vec<String> = (0..count).map(|i| format!("obj-{i}")).collect();
    want.sort();
    assert_eq!(names, want, "pool listing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn object_ops_semantics() {
    let mut c = Cluster::start(3, 2, 8, 256 << 20).await;
    let io = c.client().ioctx("rbd").expect("pool");
    let o = "ops";
    io.create(o, true).await.expect("create");
    let e = io
        .create(o, true)
        .await
        .expect_err("exclusive create twice");
    assert_eq!(e.op_error(), Some(&OpError::Exists));
    io.write(o, 4, b"abcd".to_vec()).await.expect("write");
    io.append(o, b"XY".to_vec()).await.expect("append");
    assert_eq!(io.read(o, 0, 0).await.unwrap(), b"\0\0\0\0abcdXY");
    io.zero(o, 5, 2).await.expect("zero");
    assert_eq!(io.read(o, 4, 4).await.unwrap(), b"a\0\0d");
    io.truncate(o, 3).await.expect("truncate");
    let st = io.stat(o).await.expect("stat");
    assert_eq!(st.size, 3);
    // assert_version / compare-and-write
    let v = io
        .write_if_version(o, st.version, 0, b"Q".to_vec())
        .await
        .expect("cas ok");
    let e = io
        .write_if_version(o, st.version, 0, b"R".to_vec())
        .await
        .expect_err("stale version");
    assert!(matches!(e.op_error(), Some(OpError::VersionMismatch { actual }) if *actual == v));
    io.compare_and_write(o, 0, b"Q".to_vec(), b"S".to_vec())
        .await
        .expect("cmpext ok");
    let e = io
        .compare_and_write(o, 0, b"Q".to_vec(), b"T".to_vec())
        .await
        .expect_err("cmpext");
    assert_eq!(e.op_error(), Some(&OpError::CmpMismatch { offset: 0 }));
    // xattrs
    io.set_xattr(o, "color", b"red".to_vec())
        .await
        .expect("setxattr");
    assert_eq!(io.get_xattr(o, "color").await.unwrap(), b"red");
    io.set_xattr_if(o, "color", CmpOp::Eq, b"red".to_vec(), b"blue".to_vec())
        .await
        .expect("cmpxattr");
    let e = io
        .set_xattr_if(o, "color", CmpOp::Eq, b"red".to_vec(), b"x".to_vec())
        .await
        .expect_err("cmpxattr");
    assert_eq!(e.op_error(), Some(&OpError::Canceled));
    assert_eq!(
        io.list_xattrs(o).await.unwrap(),
        vec![("color".to_string(), b"blue".to_vec())]
    );
    io.rm_xattr(o, "color").await.expect("rmxattr");
    let e = io.get_xattr(o, "color").await.expect_err("gone");
    assert_eq!(e.op_error(), Some(&OpError::NoData));
    // omap
    io.omap_set_header(o, b"hdr".to_vec()).await.unwrap();
    io.omap_set(
        o,
        vec![
            (b"b".to_vec(), b"2".to_vec()),
            (b"a".to_vec(), b"1".to_vec()),
        ],
    )
    .await
    .unwrap();
    assert_eq!(io.omap_get_header(o).await.unwrap(), b"hdr");
    assert_eq!(
        io.omap_get_vals_by_keys(o, vec![b"a".to_vec(), b"zz".to_vec()])
            .await
            .unwrap(),
        vec![(b"a".to_vec(), b"1".to_vec())]
    );
    io.omap_rm_keys(o, vec![b"a".to_vec()]).await.unwrap();
    let (ents, more) = io.omap_list(o, None, 10).await.unwrap();
    assert_eq!(ents, vec![(b"b".to_vec(), b"2".to_vec())]);
    assert!(!more);
    io.omap_clear(o).await.unwrap();
    assert!(io.omap_list(o, None, 10).await.unwrap().0.is_empty());
    // remove
    io.remove(o).await.expect("remove");
    assert!(io.read(o, 0, 0).await.expect_err("removed").is_not_found());
    assert!(io
        .remove(o)
        .await
        .expect_err("removed twice")
        .is_not_found());
    // striper
    let s = cairn_client::Striper::new(1 << 20, 64 << 10, 4).unwrap();
    let big = pattern(77, (5 << 20) + 123);
    s.write(&io, "img", 0, &big).await.expect("striped write");
    assert_eq!(s.size(&io, "img").await.unwrap(), big.len() as u64);
    assert!(s.read(&io, "img", 0, big.len() as u64).await.unwrap() == big);
    assert!(s.read(&io, "img", 100_000, 300_000).await.unwrap() == big[100_000..400_000]);
    s.remove(&io, "img").await.expect("striped remove");
    // A client with read-only osd caps can read but not write.
    c.apply_with(
        cairn_map::MonCommand::AuthGetOrCreate {
            entity: cairn_types::EntityName::client("ro"),
            caps: vec![
                ("mon".into(), "allow r".into()),
                ("osd".into(), "allow r pool=rbd".into()),
            ],
        },
        Some([9; 32]),
    );
    let mut cfg = cairn_client::ClientConfig::new(cairn_msg::Credentials::Key {
        name: cairn_types::EntityName::client("ro"),
        secret: cairn_msg::Secret::from_bytes([9; 32]),
    });
    cfg.op_timeout = Duration::from_secs(10);
    let ro = cairn_client::Rados::new(cfg, c.map_rx())
        .ioctx("rbd")
        .unwrap();
    io.write_full("public", b"p".to_vec()).await.unwrap();
    assert_eq!(ro.read("public", 0, 0).await.unwrap(), b"p");
    let e = ro
        .write_full("public", b"q".to_vec())
        .await
        .expect_err("read-only client wrote");
    assert!(matches!(e.op_error(), Some(OpError::Access(_))), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn omap_of_100k_keys_lists_in_order_across_pages() {
    let c = Cluster::start(3, 2, 8, 256 << 20).await;
    let io = c.client().ioctx("rbd").expect("pool");
    let total = 100_000u32;
    let batch = 5_000u32;
    let t0 = Instant::now();
    for b in 0..total / batch {
        // Keys inserted in a scrambled order; listing must sort them.
        let entries: Vec<(Vec<u8>, Vec<u8>)> = (0..batch)
            .map(|i| {
                let k = (b + i * (total / batch)) % total;
                (format!("key{k:08}").into_bytes(), k.to_le_bytes().to_vec())
            })
            .collect();
        io.omap_set("index", entries).await.expect("omap set");
    }
    let set_time = t0.elapsed();
    let mut after: Option<Vec<u8>> = None;
    let mut n = 0u32;
    let mut pages = 0;
    loop {
        let (ents, more) = io
            .omap_list("index", after.as_deref(), 1000)
            .await
            .expect("omap list");
        pages += 1;
        for (k, v) in &ents {
            assert_eq!(k, format!("key{n:08}").as_bytes(), "key order");
            assert_eq!(v, &n.to_le_bytes());
            n += 1;
        }
        after = ents.last().map(|(k, _)| k.clone());
        if !more {
            break;
        }
    }
    assert_eq!(n, total);
    eprintln!(
        "100k omap keys: set in {set_time:?}, listed in {pages} pages in {:?}",
        t0.elapsed() - set_time
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_to_one_object_serialise() {
    let c = Cluster::start(3, 2, 8, 256 << 20).await;
    let io = c.client().ioctx("rbd").expect("pool");
    let writers = 16u8;
    let per_writer = 25usize;
    let rec = 1000usize;
    let mut set = tokio::task::JoinSet::new();
    for w in 0..writers {
        let io = io.clone();
        set.spawn(async move {
            let mut versions = Vec::new();
            for _ in 0..per_writer {
                versions.push(io.append("shared", vec![w; rec]).await.expect("append"));
            }
            versions
        });
    }
    let mut all_versions = Vec::new();
    while let Some(r) = set.join_next().await {
        all_versions.extend(r.expect("task"));
    }
    let data = io.read("shared", 0, 0).await.expect("read");
    assert_eq!(data.len(), writers as usize * per_writer * rec);
    let mut count = BTreeMap::new();
    for chunk in data.chunks(rec) {
        assert!(chunk.iter().all(|&b| b == chunk[0]), "records interleaved");
        *count.entry(chunk[0]).or_insert(0) += 1;
    }
    assert!(count.values().all(|&n| n == per_writer), "{count:?}");
    all_versions.sort();
    all_versions.dedup();
    assert_eq!(
        all_versions.len(),
        writers as usize * per_writer,
        "every write got its own version"
    );
}

/// Writes at offsets, xattrs and appends to one object from many tasks at
/// once (the primary overlaps them: each is resolved from the state the
/// write before it leaves): every task's last write is what each slot
/// holds, and every acting member's store holds the same object.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlapping_writes_to_one_object_agree_on_every_member() {
    let mut c = Cluster::start(3, 2, 8, 256 << 20).await;
    let io = c.client().ioctx("rbd").expect("pool");
    let tasks = 12u64;
    let rounds = 30u64;
    let slot = 8192u64;
    let mut set = tokio::task::JoinSet::new();
    for t in 0..tasks {
        let io = io.clone();
        set.spawn(async move {
            for n in 0..rounds {
                let fill = (t * rounds + n) as u8;
                match n % 3 {
                    0 | 1 => {
                        io.write("pipe", t * slot, vec![fill; slot as usize])
                            .await
                            .expect("write");
                    }
                    _ => {
                        io.set_xattr("pipe", &format!("t{t}"), vec![fill])
                            .await
                            .expect("setxattr");
                        io.write("pipe", t * slot, vec![fill; slot as usize])
                            .await
                            .expect("write");
                    }
                }
                io.append("log", vec![t as u8; 100]).await.expect("append");
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.expect("task");
    }
    let data = io.read("pipe", 0, 0).await.expect("read");
    assert_eq!(data.len() as u64, tasks * slot);
    for t in 0..tasks {
        let last = (t * rounds + rounds - 1) as u8;
        let s = &data[(t * slot) as usize..((t + 1) * slot) as usize];
        assert!(s.iter().all(|&b| b == last), "slot {t} lost its last write");
        let x = io.get_xattr("pipe", &format!("t{t}")).await.expect("xattr");
        assert_eq!(x, vec![(t * rounds + 29) as u8]);
    }
    let log = io.read("log", 0, 0).await.expect("read log");
    assert_eq!(log.len() as u64, tasks * rounds * 100);
    assert!(log.chunks(100).all(|r| r.iter().all(|&b| b == r[0])));
    // Every member's copy is the same, byte for byte and attribute for
    // attribute (version included).
    let map = c.current();
    let pool = map.pools.values().next().unwrap().clone();
    let ids: Vec<i32> = c.osds.keys().copied().collect();
    for id in &ids {
        if let Some(Some(o)) = c.osds.insert(*id, None) {
            o.stop();
        }
    }
    for name in ["pipe", "log"] {
        let on = ObjectName::new("", name);
        let seed =
            cairn_map::stable_mod(on.hash(), pool.pg_num, pool.pg_num.next_power_of_two() - 1);
        let acting = map.pg_to_up(pool.id, seed).unwrap().up;
        let coll = cairn_store::CollectionId::pg(pool.id, seed);
        let mut copies = Vec::new();
        for id in &acting {
            let store = open_after_stop(c.store_cfg(*id)).await;
            let st = cairn_osd::exec::get_object_state(&store, coll, &on).expect("state");
            copies.push(st.expect("object on every member"));
        }
        assert_eq!(copies.len(), 3);
        assert!(
            copies.windows(2).all(|w| w[0] == w[1]),
            "{name}: copies differ"
        );
        if name == "pipe" {
            assert_eq!(copies[0].data, data);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resent_op_is_applied_once() {
    let c = Cluster::start(3, 2, 8, 256 << 20).await;
    let rados = c.client();
    let io = rados.ioctx("rbd").expect("pool");
    io.write_full("dup", b"start".to_vec())
        .await
        .expect("write");
    let map = rados.map();
    let pool = map.pools.values().find(|p| p.name == "rbd").unwrap();
    let name = ObjectName::new("", "dup");
    let seed = cairn_map::stable_mod(
        name.hash(),
        pool.pg_num,
        pool.pg_num.next_power_of_two() - 1,
    );
    let primary = map.pg_to_up(pool.id, seed).unwrap().primary.unwrap();
    let addr = map.osds[&primary].addrs[0].parse().unwrap();
    let conn = cairn_msg::connect(addr, &admin_creds(), None, &Default::default())
        .await
        .expect("connect");
    let req = OpRequest {
        reqid: cairn_ops::ReqId {
            client: cairn_types::EntityName::client("admin"),
            incarnation: 424242,
            tid: 1,
        },
        epoch: map.epoch,
        pgid: cairn_types::PgId {
            pool: cairn_types::PoolId(pool.id),
            seed,
        },
        oid: name,
        ops: vec![SubOp::Append {
            data: Bytes::from_static(b"+once"),
        }],
        snapc: None,
        snap: cairn_ops::SNAP_HEAD,
    };
    let mut versions = Vec::new();
    for _ in 0..3 {
        let m = conn
            .call(
                msg_type::OP,
                cairn_ops::encode(&req),
                Duration::from_secs(10),
            )
            .await
            .expect("call");
        let r: OpReply = cairn_ops::decode("reply", &m.payload).unwrap();
        assert!(matches!(r.status, OpStatus::Done(Ok(_))), "{r:?}");
        versions.push(r.version);
    }
    assert!(versions.windows(2).all(|w| w[0] == w[1]), "{versions:?}");
    assert_eq!(io.read("dup", 0, 0).await.unwrap(), b"start+once");

    // A request id naming another client than the connection's own
    // identity is refused and changes nothing.
    let mut forged = req.clone();
    forged.reqid.client = cairn_types::EntityName::client("someone-else");
    forged.reqid.tid = 2;
    let m = conn
        .call(
            msg_type::OP,
            cairn_ops::encode(&forged),
            Duration::from_secs(10),
        )
        .await
        .expect("call");
    let r: OpReply = cairn_ops::decode("reply", &m.payload).unwrap();
    match &r.status {
        OpStatus::Done(Err(cairn_ops::OpError::Access(why))) => {
            assert!(why.contains("client.someone-else"), "{why}")
        }
        other => panic!("a forged request id was not refused: {other:?}"),
    }
    assert_eq!(io.read("dup", 0, 0).await.unwrap(), b"start+once");
}

/// Object size of the failure-test load: 16 KiB to 40 KiB.
/// Opens a stopped OSD's store. `stop()` aborts the OSD's tasks at once, but
/// a store call already running on a blocking thread keeps its handle (and
/// the store's lock) until it returns, which on a loaded machine can take a
/// while: wait for the lock up to 30 s, then fail naming the store.
async fn open_after_stop(cfg: cairn_store::StoreConfig) -> cairn_store::Store {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match cairn_store::Store::open(cfg.clone()) {
            Ok(store) => return store,
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!(
                "store {} still not openable 30 s after stop: {e}",
                cfg.path.display()
            ),
        }
    }
}

fn load_size(i: u64) -> usize {
    (16 << 10) + (i % 7) as usize * 4096
}

/// A write load: `writers` tasks rewriting 40 objects each; records what
/// was acknowledged (object -> seed of its content).
struct Load {
    acked: Arc<std::sync::Mutex<BTreeMap<String, u64>>>,
    /// Acknowledged writes so far (the object names repeat, so count acks).
    acks: Arc<std::sync::atomic::AtomicU64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    set: tokio::task::JoinSet<u64>,
}

impl Load {
    fn start(io: &cairn_client::IoCtx, writers: u64) -> Load {
        let acked: Arc<std::sync::Mutex<BTreeMap<String, u64>>> = Default::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let acks = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut set = tokio::task::JoinSet::new();
        for w in 0..writers {
            let (io, acked, stop, acks) = (io.clone(), acked.clone(), stop.clone(), acks.clone());
            set.spawn(async move {
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let name = format!("w{w}-{}", i % 40);
                    let seed = w * 1_000_000 + i;
                    io.write_full(&name, pattern(seed, load_size(i)))
                        .await
                        .expect("write during failure");
                    acked.lock().unwrap().insert(name, seed);
                    acks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    i += 1;
                }
                i
            });
        }
        Load {
            acked,
            acks,
            stop,
            set,
        }
    }

    fn acked_count(&self) -> u64 {
        self.acks.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops the writers; returns the number of writes and what was acked.
    async fn finish(mut self) -> (u64, BTreeMap<String, u64>) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut writes = 0;
        while let Some(r) = self.set.join_next().await {
            writes += r.expect("writer");
        }
        let acked = self.acked.lock().unwrap().clone();
        (writes, acked)
    }
}

/// Stops every OSD and prints what each store holds about `name` (debugging aid).
async fn dump_object(c: &mut Cluster, name: &str) {
    let map = c.current();
    let pool = map.pools.values().next().unwrap();
    let on = ObjectName::new("", name);
    let seed = cairn_map::stable_mod(on.hash(), pool.pg_num, pool.pg_num.next_power_of_two() - 1);
    eprintln!(
        "{name} is in pg {}.{seed:x}, up {:?}",
        pool.id,
        map.pg_to_up(pool.id, seed).unwrap().up
    );
    for osd in c.osds.values().flatten() {
        for s in osd.pg_stats() {
            if s.pgid == format!("{}.{seed:x}", pool.id) {
                eprintln!("  osd.{}: {:?}", osd.id(), s);
            }
        }
    }
    let ids: Vec<i32> = c.osds.keys().copied().collect();
    for id in ids {
        if let Some(Some(o)) = c.osds.insert(id, None) {
            o.stop();
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for id in c.osds.keys().copied().collect::<Vec<_>>() {
        let Ok(store) = cairn_store::Store::open(c.store_cfg(id)) else {
            eprintln!("  osd.{id}: store busy");
            continue;
        };
        let coll = cairn_store::CollectionId::pg(pool.id, seed);
        let oid = cairn_osd::exec::store_oid(&on);
        let v = store
            .getattr(&coll, &oid, "_v")
            .ok()
            .flatten()
            .map(|b| cairn_osd::exec::decode_version(&b));
        let size = store.stat(&coll, &oid).map(|s| s.size).ok();
        eprintln!("  osd.{id} store: version {v:?} size {size:?}");
        if let Ok(log) = store.log_range(&coll, 0, 100_000) {
            for (_, b) in log {
                let e: cairn_ops::LogEntry = cairn_ops::decode("e", &b).unwrap();
                if e.oid.name == name {
                    eprintln!(
                        "    log {} prior {} {:?} {:?}",
                        e.version,
                        e.prior_version,
                        e.reqid.map(|r| r.tid),
                        e.op
                    );
                }
            }
        }
    }
}

async fn verify_acked(c: &mut Cluster, io: &cairn_client::IoCtx, acked: &BTreeMap<String, u64>) {
    for (name, seed) in acked {
        let want = pattern(*seed, load_size(seed % 1_000_000));
        let got = match io.read(name, 0, 0).await {
            Ok(g) => g,
            Err(e) => {
                dump_object(c, name).await;
                panic!("{name}: {e}");
            }
        };
        if got != want {
            // Name the write whose content we found instead.
            let found = (1..200u64)
                .filter_map(|k| seed.checked_sub(40 * k))
                .find(|s| pattern(*s, load_size(s % 1_000_000)) == got);
            dump_object(c, name).await;
            panic!(
                "{name}: acknowledged write seed {seed} lost; found {} ({} bytes)",
                found
                    .map(|s| format!("older write seed {s}"))
                    .unwrap_or_else(|| "unknown content".into()),
                got.len()
            );
        }
    }
}

/// Every PG copy on `osd` that is in its acting set matches the primary's last_update.
fn assert_caught_up(c: &Cluster, osd_id: i32) {
    let mut primaries = BTreeMap::new();
    for osd in c.osds.values().flatten() {
        for s in osd.pg_stats() {
            if s.primary == Some(osd.id()) {
                primaries.insert(s.pgid.clone(), s.last_update.clone());
            }
        }
    }
    let osd = c.osds[&osd_id].as_ref().expect("osd running");
    let mut checked = 0;
    for s in osd.pg_stats() {
        if s.acting.contains(&osd_id) {
            assert_eq!(
                Some(&s.last_update),
                primaries.get(&s.pgid),
                "pg {} on osd.{osd_id}",
                s.pgid
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "osd.{osd_id} holds no PG");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_an_osd_during_writes_loses_nothing_acknowledged() {
    let mut c = Cluster::start(3, 2, 16, 512 << 20).await;
    let io = c.client().ioctx("rbd").expect("pool");
    let load = Load::start(&io, 8);
    let victim = 2;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let before = load.acked_count();
    c.kill(victim).await;
    // Writes must keep being acknowledged while the victim is down; allow a
    // loaded CI machine time to re-peer, but bound the wait.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut during = load.acked_count();
    while during <= before && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        during = load.acked_count();
    }
    c.restart(victim).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let (writes, acked) = load.finish().await;
    eprintln!("writes: {writes}; acks before kill {before}, by the end of the outage {during}");
    assert!(
        during > before,
        "the load did not continue with osd.{victim} down"
    );
    c.wait_clean(Duration::from_secs(60)).await;
    verify_acked(&mut c, &io, &acked).await;
    assert_caught_up(&c, victim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn io_waits_below_min_size_and_resumes_without_loss() {
    let mut c = Cluster::start(3, 2, 16, 512 << 20).await;
    let io = c.client().ioctx("rbd").expect("pool");
    let load = Load::start(&io, 8);
    tokio::time::sleep(Duration::from_millis(600)).await;
    // Two OSDs on different hosts: PGs holding both drop below min_size.
    c.kill(0).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    c.kill(2).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let stalled = c
        .primary_states()
        .values()
        .filter(|s| !s.contains("active"))
        .count();
    // Bring back the first victim (it missed the writes of two intervals).
    c.restart(0).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    c.restart(2).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (writes, acked) = load.finish().await;
    eprintln!("writes: {writes}; PGs inactive with two OSDs down: {stalled}");
    assert!(stalled > 0, "expected some PGs below min_size");
    c.wait_clean(Duration::from_secs(60)).await;
    verify_acked(&mut c, &io, &acked).await;
    assert_caught_up(&c, 0);
    assert_caught_up(&c, 2);
}

/// One client handle used first from a short-lived current-thread runtime
/// (which stays alive, idle, as in a FUSE callback thread) and then from
/// the application's runtime: the later ops do not wait on connections the
/// idle runtime opened (they would never move) but answer at once; after
/// the idle runtime is gone, ops keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_used_from_an_idle_runtime_does_not_stall_others() {
    let c = Cluster::start(3, 1, 8, 256 << 20).await;
    let io = c.client().ioctx("rbd").expect("pool");
    let names: Vec<String> = (0..16).map(|i| format!("rt-{i}")).collect();
    let (io2, names2) = (io.clone(), names.clone());
    let temp = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            for n in &names2 {
                io2.write_full(n, b"from the temporary runtime".to_vec())
                    .await
                    .expect("write from the temporary runtime");
            }
        });
        rt
    })
    .join()
    .unwrap();
    // `temp` is alive and idle: connections it opened do not move.
    for n in &names {
        let t0 = Instant::now();
        tokio::time::timeout(Duration::from_secs(20), io.write_full(n, b"main".to_vec()))
            .await
            .unwrap_or_else(|_| panic!("{n}: write from the main runtime stalled"))
            .expect("write");
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{n}: {:?}",
            t0.elapsed()
        );
    }
    std::thread::spawn(move || drop(temp)).join().unwrap();
    for n in &names {
        let data = tokio::time::timeout(Duration::from_secs(20), io.read(n, 0, 0))
            .await
            .expect("read after the temporary runtime ended")
            .expect("read");
        assert_eq!(data, b"main");
    }
}
