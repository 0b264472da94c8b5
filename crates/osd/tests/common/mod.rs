//! A real cluster in one process for the OSD integration tests: OSDs with
//! real stores in temp dirs, real sockets on 127.0.0.1, and a cluster map
//! built and changed with cairn-map commands and broadcast to OSDs and
//! clients through a watch channel (standing in for the monitors).
#![allow(dead_code)]

use cairn_client::{ClientConfig, Rados};
use cairn_map::*;
use cairn_msg::{Credentials, Secret};
use cairn_osd::{MonRequests, Osd, OsdConfig};
use cairn_store::{Store, StoreConfig};
use cairn_types::EntityName;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub const ADMIN_SECRET: [u8; 32] = [1; 32];

pub fn admin_creds() -> Credentials {
    Credentials::Key {
        name: EntityName::client("admin"),
        secret: Secret::from_bytes(ADMIN_SECRET),
    }
}

/// Beacons the stand-in monitor received: OSD -> (when, beacon).
pub type Beacons = Arc<Mutex<BTreeMap<i32, (Instant, OsdBeacon)>>>;

pub struct Cluster {
    pub dir: tempfile::TempDir,
    /// OSDs are started with a monitor link: they heartbeat each other and
    /// send failure reports and beacons, which the stand-in monitor judges
    /// with `FailureJudge` (as the real leader does).
    pub monitored: bool,
    pub beacons: Beacons,
    /// The map as the monitors would hold it (OSDs' `OsdAlive` requests
    /// are applied to it by a background task).
    pub map: Arc<Mutex<ClusterMap>>,
    pub tx: Arc<watch::Sender<Arc<ClusterMap>>>,
    pub mon_tx: MonRequests,
    pub osds: BTreeMap<i32, Option<Osd>>,
    pub secrets: BTreeMap<i32, [u8; 32]>,
    pub data_bytes: u64,
}

fn ctx(secret: Option<[u8; 32]>) -> ApplyContext {
    ApplyContext {
        caller: EntityName::client("admin"),
        generated_secret: secret,
    }
}

impl Cluster {
    /// `hosts` x `per_host` OSDs, one replicated pool `rbd` (size 3,
    /// min_size 2, `pg_num` PGs), every PG active.
    pub async fn start(hosts: usize, per_host: usize, pg_num: u32, data_bytes: u64) -> Cluster {
        Cluster::start_with(hosts, per_host, pg_num, data_bytes, Vec::new(), false).await
    }

    /// Like `start`, with central config set first and, when `monitored`,
    /// OSDs linked to the stand-in monitor (heartbeats, beacons, failure
    /// judgement).
    pub async fn start_with(
        hosts: usize,
        per_host: usize,
        pg_num: u32,
        data_bytes: u64,
        config: Vec<(&str, &str)>,
        monitored: bool,
    ) -> Cluster {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let map = ClusterMap::new_cluster(
            "5afc28eb-61b3-45f1-b441-6f913fd70505",
            MonInfo {
                name: "a".into(),
                addr: "127.0.0.1:1".into(),
                rank: 0,
            },
            AuthEntity::new(
                &ADMIN_SECRET,
                &[("mon", "allow *"), ("osd", "allow *"), ("mgr", "allow *")],
            ),
        );
        let mut map = map;
        for (k, v) in config {
            map.apply(
                &MonCommand::ConfigSet {
                    who: "global".into(),
                    key: k.into(),
                    value: v.into(),
                    force: false,
                },
                &ctx(None),
            )
            .unwrap_or_else(|e| panic!("config {k}={v}: {e}"));
        }
        let (tx, _) = watch::channel(Arc::new(map.clone()));
        let tx = Arc::new(tx);
        let map = Arc::new(Mutex::new(map));
        let (mon_tx, mon_rx) = tokio::sync::mpsc::channel::<MonCommand>(1024);
        let beacons: Beacons = Arc::default();
        tokio::spawn(stand_in_monitor(
            map.clone(),
            tx.clone(),
            mon_rx,
            beacons.clone(),
        ));
        let mut c = Cluster {
            monitored,
            beacons,
            mon_tx,
            dir: tempfile::Builder::new()
                .prefix("cairn-osd-test")
                .tempdir()
                .expect("tempdir"),
            map,
            tx,
            osds: BTreeMap::new(),
            secrets: BTreeMap::new(),
            data_bytes,
        };
        let mut n = 0u8;
        for h in 0..hosts {
            for _ in 0..per_host {
                let secret = [0x40 + n; 32];
                n += 1;
                let r = c.apply_with(
                    MonCommand::OsdNew {
                        uuid: format!("00000000-0000-0000-0000-{n:012x}"),
                        id: None,
                        host: format!("node{h}"),
                        weight: 1.0,
                        class: Some("hdd".into()),
                    },
                    Some(secret),
                );
                let id = r.json["osdid"].as_i64().expect("osdid") as i32;
                c.secrets.insert(id, secret);
            }
        }
        let ids: Vec<i32> = c.secrets.keys().copied().collect();
        for id in ids {
            let store = Store::create(c.store_cfg(id)).expect("create store");
            c.boot(id, store).await;
        }
        c.apply(MonCommand::PoolCreate {
            name: "rbd".into(),
            pg_num: Some(pg_num),
            pgp_num: None,
            kind: PoolKind::Replicated,
            profile: None,
            rule: None,
        });
        for (k, v) in [("size", "3"), ("min_size", "2")] {
            c.apply(MonCommand::PoolSet {
                pool: "rbd".into(),
                key: k.into(),
                value: v.into(),
                sure: false,
            });
        }
        c.wait_active(Duration::from_secs(60)).await;
        c
    }

    pub fn store_cfg(&self, id: i32) -> StoreConfig {
        let mut cfg = StoreConfig::new(self.osd_dir(id));
        cfg.data_bytes = self.data_bytes;
        cfg.cache_bytes = 32 << 20;
        cfg.meta_reserve_bytes = 16 << 20;
        cfg
    }

    pub fn osd_dir(&self, id: i32) -> PathBuf {
        self.dir.path().join(format!("osd.{id}"))
    }

    pub fn apply_with(&mut self, cmd: MonCommand, secret: Option<[u8; 32]>) -> Reply {
        let mut m = self.map.lock().unwrap();
        let r = m
            .apply(&cmd, &ctx(secret))
            .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        self.tx.send_replace(Arc::new(m.clone()));
        r
    }

    /// The current map.
    pub fn current(&self) -> ClusterMap {
        self.map.lock().unwrap().clone()
    }

    pub fn apply(&mut self, cmd: MonCommand) -> Reply {
        self.apply_with(cmd, None)
    }

    /// Creates EC pool `name` with `pg_num` PGs on profile `ec21` (k=2,
    /// m=1, failure domain host; created on first use) and returns its id.
    pub fn create_ec21_pool(&mut self, name: &str, pg_num: u32) -> u64 {
        if !self.current().ec_profiles.contains_key("ec21") {
            self.apply(MonCommand::EcProfileSet {
                name: "ec21".into(),
                params: [("k", "2"), ("m", "1"), ("crush-failure-domain", "host")]
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                force: false,
            });
        }
        self.apply(MonCommand::PoolCreate {
            name: name.into(),
            pg_num: Some(pg_num),
            pgp_num: None,
            kind: PoolKind::Erasure,
            profile: Some("ec21".into()),
            rule: None,
        });
        self.current()
            .pools
            .values()
            .find(|p| p.name == name)
            .map(|p| p.id)
            .expect("the pool just created")
    }

    pub fn map_rx(&self) -> watch::Receiver<Arc<ClusterMap>> {
        self.tx.subscribe()
    }

    /// Starts osd.`id` on `store` and marks it up with its address.
    pub async fn boot(&mut self, id: i32, store: Store) {
        let cfg = OsdConfig::new(id, Secret::from_bytes(self.secrets[&id]));
        let mon = self.monitored.then(|| self.mon_tx.clone());
        let osd = Osd::start_with_mon(cfg, store, self.map_rx(), mon)
            .await
            .expect("osd start");
        let addrs = osd.boot_addrs();
        self.osds.insert(id, Some(osd));
        let uuid = self.current().osds[&id].uuid.clone();
        self.apply(MonCommand::OsdBoot {
            id,
            uuid,
            addrs,
            reported: OsdReported {
                total_bytes: self.data_bytes,
                used_bytes: 0,
                state: "active".into(),
                boot_id: rand::random::<u64>(),
            },
        });
    }

    /// Kills osd.`id` (all its tasks end at once) and marks it down.
    pub async fn kill(&mut self, id: i32) {
        if let Some(Some(osd)) = self.osds.insert(id, None) {
            osd.stop();
            drop(osd);
        }
        self.apply(MonCommand::OsdDown { ids: vec![id] });
    }

    /// Kills osd.`id` without telling the monitors (like kill -9 of its
    /// process): only its peers' heartbeats can get it marked down.
    pub fn crash(&mut self, id: i32) {
        if let Some(Some(osd)) = self.osds.insert(id, None) {
            osd.stop();
            drop(osd);
        }
    }

    /// The stand-in monitor's PG statistics (beacons older than
    /// `stale_after` are stale), as the monitor leader builds them.
    pub fn pg_view(&self, stale_after: Duration) -> PgMapView {
        let b = self.beacons.lock().unwrap();
        let osds = b
            .iter()
            .map(|(id, (at, beacon))| {
                (
                    *id,
                    OsdStatsEntry {
                        age_secs: at.elapsed().as_secs(),
                        stale: at.elapsed() > stale_after,
                        beacon: beacon.clone(),
                    },
                )
            })
            .collect();
        PgMapView {
            osds,
            ..Default::default()
        }
    }

    /// Reopens osd.`id`'s store (waiting for the killed instance to let go) and boots it.
    pub async fn restart(&mut self, id: i32) {
        let t0 = Instant::now();
        let store = loop {
            match Store::open(self.store_cfg(id)) {
                Ok(s) => break s,
                Err(e) if t0.elapsed() < Duration::from_secs(20) => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("reopening osd.{id}'s store: {e}"),
            }
        };
        self.boot(id, store).await;
    }

    pub fn client(&self) -> Rados {
        let mut cfg = ClientConfig::new(admin_creds());
        cfg.op_timeout = Duration::from_secs(120);
        Rados::new(cfg, self.map_rx())
    }

    /// (pgid, primary state) for every PG of the pool, from the primaries.
    pub fn primary_states(&self) -> BTreeMap<String, String> {
        let epoch = self.current().epoch.0;
        let mut out = BTreeMap::new();
        for osd in self.osds.values().flatten() {
            for s in osd.pg_stats() {
                if s.primary == Some(osd.id()) && s.epoch == epoch {
                    out.insert(s.pgid.clone(), s.state.clone());
                }
            }
        }
        out
    }

    /// Waits until every PG of every pool is active on its primary.
    pub async fn wait_active(&self, within: Duration) {
        let t0 = Instant::now();
        let want: u32 = self.current().pools.values().map(|p| p.pg_num).sum();
        loop {
            let st = self.primary_states();
            let active = st.values().filter(|s| s.contains("active")).count();
            if active as u32 == want {
                return;
            }
            if t0.elapsed() > within {
                panic!("only {active} of {want} PGs active after {within:?}: {st:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until every PG is active+clean.
    pub async fn wait_clean(&self, within: Duration) {
        let t0 = Instant::now();
        let want: u32 = self.current().pools.values().map(|p| p.pg_num).sum();
        loop {
            let st = self.primary_states();
            let clean = st.values().filter(|s| s.as_str() == "active+clean").count();
            if clean as u32 == want {
                return;
            }
            if t0.elapsed() > within {
                panic!("only {clean} of {want} PGs active+clean after {within:?}: {st:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Applies the OSDs' requests to the map like the monitors would: map
/// changes (`OsdAlive`) directly; beacons and failure reports through a
/// `FailureJudge`, ticked every 250 ms, whose decisions are applied, and
/// beacons' usage through `fullness_change` (nearfull/backfillfull/full marks).
async fn stand_in_monitor(
    map: Arc<Mutex<ClusterMap>>,
    tx: Arc<watch::Sender<Arc<ClusterMap>>>,
    mut rx: tokio::sync::mpsc::Receiver<MonCommand>,
    beacons: Beacons,
) {
    let mut judge = FailureJudge::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        let decided: Vec<MonCommand> = tokio::select! {
            cmd = rx.recv() => {
                let Some(cmd) = cmd else { return };
                let m = map.lock().unwrap().clone();
                match cmd {
                    MonCommand::OsdBeacon { id, beacon } => {
                        judge.beacon(Instant::now(), &m, id);
                        let full = m.fullness_change(id, &beacon);
                        beacons.lock().unwrap().insert(id, (Instant::now(), beacon));
                        full.into_iter().collect()
                    }
                    MonCommand::OsdFailureReport { id, target, failed } => {
                        judge.report(Instant::now(), &m, id, target, failed).into_iter().collect()
                    }
                    other => vec![other],
                }
            }
            _ = tick.tick() => {
                let m = map.lock().unwrap().clone();
                judge.tick(Instant::now(), &m)
            }
        };
        for cmd in decided {
            let mut m = map.lock().unwrap();
            if m.apply(&cmd, &ctx(None)).is_ok() {
                tx.send_replace(Arc::new(m.clone()));
            }
        }
    }
}

/// Deterministic pseudo-random bytes (fast to generate and to check).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Writes objects `pre-0` .. `pre-{count-1}` (`pattern(i, bytes)`) with 16
/// concurrent writers: enough history that new members need a backfill.
pub async fn preload(io: &cairn_client::IoCtx, count: u64, bytes: usize) {
    let mut set = tokio::task::JoinSet::new();
    for w in 0..16u64 {
        let io = io.clone();
        set.spawn(async move {
            let mut i = w;
            while i < count {
                io.write_full(&format!("pre-{i}"), pattern(i, bytes))
                    .await
                    .expect("preload write");
                i += 16;
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.expect("preload task");
    }
}

pub fn soak() -> bool {
    std::env::var("CAIRN_SOAK").is_ok_and(|v| v == "1")
}
