//! Fault-test harness: a cluster of hosts, each one real `cairn daemon`
//! process (its mon and its OSDs) on an address of its own with its own
//! `host=` CRUSH location, either on 127.0.x.y or, for partition tests,
//! each in a network namespace of its own (`netns.rs`); admin commands
//! through the real CLI; and `Writer`, a cairn-client load that records
//! every acknowledged write (name, length, content hash, when it was sent
//! and acknowledged) so a test can read every one back at the end. Every
//! daemon started is killed by PID when the `Hosts` is dropped, before its
//! namespaces are deleted. Owns no assertions about what a test expects.
#![allow(dead_code)]

use crate::common::{free_addr, run_cmd, wait_gone, Run, CAIRN};
use crate::netns::Netns;
use cairn_client::{ClientConfig, Rados};
use cairn_map::ClusterMap;
use cairn_mon::MonClient;
use cairn_msg::{Credentials, Keyring};
use cairn_store::{ListStart, Store, StoreConfig};
use cairn_types::EntityName;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hasher;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// 127.0.x ranges for loopback clusters of this test binary.
static NEXT_RANGE: AtomicU8 = AtomicU8::new(60);

/// Mon port inside namespaces (each namespace has its own port space).
const NETNS_MON_PORT: u16 = 6789;
/// Bound on waiting for a mon connection or the first map.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// What to build.
#[derive(Clone)]
pub struct Opts {
    pub hosts: usize,
    pub osds_per_host: usize,
    pub pg_num: u32,
    /// Each host in a network namespace (the caller checked availability).
    pub netns: bool,
    /// Central config set before the OSDs are added: (who, key, value).
    pub config: Vec<(String, String, String)>,
    pub disk_size: String,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            hosts: 3,
            osds_per_host: 2,
            pg_num: 32,
            netns: false,
            // Quick failure detection: heartbeats every second, reported
            // after 3 s of silence; beacons every second. OSDs are not
            // marked out unless a test lowers the interval.
            config: [
                ("osd", "osd_heartbeat_interval", "1"),
                ("osd", "osd_heartbeat_grace", "3"),
                ("osd", "osd_beacon_report_interval", "1"),
            ]
            .iter()
            .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
            .collect(),
            disk_size: "256M".into(),
        }
    }
}

impl Opts {
    pub fn set(mut self, who: &str, key: &str, value: &str) -> Self {
        self.config.retain(|(w, k, _)| !(w == who && k == key));
        self.config
            .push((who.to_string(), key.to_string(), value.to_string()));
        self
    }
}

pub struct Host {
    pub name: String,
    pub dir: PathBuf,
    pub mon_addr: SocketAddr,
    /// Its namespace, when the cluster runs in namespaces.
    pub ns: Option<String>,
}

impl Host {
    pub fn conf(&self) -> PathBuf {
        self.dir.join("cairn.conf")
    }
    pub fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.dir.join("cairn.pid"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }
    /// CRUSH host name.
    pub fn crush_host(&self) -> String {
        format!("host-{}", self.name)
    }
}

pub struct Hosts {
    pub hosts: Vec<Host>,
    /// Every daemon pid ever started, killed on drop.
    pids: Mutex<Vec<u32>>,
    pub pool: String,
    /// Dropped after `Drop::drop` has killed the daemons.
    pub net: Option<Netns>,
    pub tmp: tempfile::TempDir,
    /// One cluster at a time in this test binary: the timings (heartbeat
    /// grace 3 s) assume the machine is not also running another one.
    _serial: std::sync::MutexGuard<'static, ()>,
}

static SERIAL: Mutex<()> = Mutex::new(());

/// Host names: a, b, c, …
fn host_name(i: usize) -> String {
    ((b'a' + i as u8) as char).to_string()
}

impl Hosts {
    /// Bootstraps host a, joins the others as mons, sets `opts.config`,
    /// adds `osds_per_host` directory OSDs on each host, creates the pool
    /// `rbd` (size 3, min_size 2) and waits until every PG is active+clean.
    pub fn start(opts: &Opts) -> Hosts {
        let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let net = if opts.netns {
            Some(Netns::create(opts.hosts).unwrap_or_else(|e| panic!("network namespaces: {e}")))
        } else {
            None
        };
        let range = NEXT_RANGE.fetch_add(1, Ordering::SeqCst);
        let tmp = tempfile::tempdir().expect("temp dir");
        let hosts = (0..opts.hosts)
            .map(|i| {
                let name = host_name(i);
                let (mon_addr, ns) = match &net {
                    Some(n) => (
                        format!("{}:{NETNS_MON_PORT}", Netns::host_ip(i))
                            .parse()
                            .unwrap(),
                        Some(n.hosts[i].clone()),
                    ),
                    None => (free_addr(&format!("127.0.{range}.{}", i + 1)), None),
                };
                Host {
                    dir: tmp.path().join(&name),
                    name,
                    mon_addr,
                    ns,
                }
            })
            .collect();
        let c = Hosts {
            hosts,
            pids: Mutex::new(Vec::new()),
            pool: "rbd".into(),
            net,
            tmp,
            _serial: serial,
        };
        let t0 = Instant::now();
        c.bootstrap();
        for i in 1..opts.hosts {
            c.join(i);
        }
        c.until_quorum(opts.hosts, Duration::from_secs(20));
        for (who, k, v) in &opts.config {
            c.ok(&["config", "set", who, k, v]);
        }
        for i in 0..opts.hosts {
            for _ in 0..opts.osds_per_host {
                c.add_disk(i, &opts.disk_size);
            }
        }
        c.ok(&["osd", "pool", "create", &c.pool, &opts.pg_num.to_string()]);
        let d = c.ok(&["osd", "pool", "ls", "detail"]);
        assert!(d.contains("size 3") && d.contains("min_size 2"), "{d}");
        c.wait_clean(Duration::from_secs(60));
        eprintln!(
            "cluster of {} hosts x {} OSDs active+clean after {:.1} s",
            opts.hosts,
            opts.osds_per_host,
            t0.elapsed().as_secs_f64()
        );
        c
    }

    /// A `cairn` command, run inside `ns` when given.
    fn command(ns: Option<&str>) -> Command {
        match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, CAIRN]);
                c
            }
            None => Command::new(CAIRN),
        }
    }

    /// The namespace admin commands and clients run in.
    pub fn client_ns(&self) -> Option<String> {
        self.net.as_ref().map(|n| n.client.clone())
    }

    fn note_pid(&self, i: usize) {
        if let Some(p) = self.hosts[i].pid() {
            self.pids.lock().unwrap().push(p);
        }
    }

    fn bootstrap(&self) {
        let h = &self.hosts[0];
        let mut cmd = Self::command(h.ns.as_deref());
        cmd.args(["bootstrap", "--mon-ip", &h.mon_addr.to_string(), "--data"])
            .arg(&h.dir)
            .env_remove("CAIRN_CONF");
        let r = run_cmd(cmd);
        self.note_pid(0);
        assert!(r.ok, "bootstrap failed: {r:?}");
    }

    fn join(&self, i: usize) {
        let token = std::fs::read_to_string(self.hosts[0].dir.join("join-token"))
            .expect("join-token")
            .trim()
            .to_string();
        let h = &self.hosts[i];
        let mut cmd = Self::command(h.ns.as_deref());
        cmd.args([
            "join",
            &token,
            "--mon-ip",
            &h.mon_addr.to_string(),
            "--name",
            &h.name,
            "--data",
        ])
        .arg(&h.dir)
        .env_remove("CAIRN_CONF");
        let r = run_cmd(cmd);
        self.note_pid(i);
        assert!(r.ok, "join {} failed: {r:?}", h.name);
    }

    /// The admin config (host a's, which holds the admin keyring).
    pub fn admin_conf(&self) -> PathBuf {
        self.hosts[0].conf()
    }

    /// Runs an admin command (in the client namespace, if any).
    pub fn cairn(&self, args: &[&str]) -> Run {
        let mut cmd = Self::command(self.client_ns().as_deref());
        cmd.arg("-c")
            .arg(self.admin_conf())
            .args(args)
            .env_remove("CAIRN_CONF");
        run_cmd(cmd)
    }

    /// Like `cairn`, asserting success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let r = self.cairn(args);
        assert!(r.ok, "cairn {args:?} failed: {r:?}");
        r.stdout
    }

    /// Parsed JSON output of an admin command (Null when it failed).
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.extend(["-f", "json"]);
        let r = self.cairn(&a);
        if !r.ok {
            return serde_json::Value::Null;
        }
        serde_json::from_str(&r.stdout).unwrap_or_default()
    }

    fn until_quorum(&self, n: usize, within: Duration) {
        let want = format!(
            "quorum {}",
            (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(",")
        );
        let t0 = Instant::now();
        loop {
            let r = self.cairn(&["mon", "stat"]);
            if r.ok && r.stdout.contains(&want) {
                return;
            }
            assert!(t0.elapsed() < within, "no quorum of {n}: {r:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `cairn disk add` of a new directory OSD on host i; returns its id.
    pub fn add_disk(&self, i: usize, size: &str) -> i32 {
        let h = &self.hosts[i];
        let before = self.host_osds(i);
        let n = std::fs::read_dir(&h.dir)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().starts_with("disk"))
                    .count()
            })
            .unwrap_or(0);
        let path = h.dir.join(format!("disk{n}"));
        let r = self.cairn(&[
            "disk",
            "add",
            path.to_str().unwrap(),
            "--size",
            size,
            "--host",
            &h.crush_host(),
            "--data",
            h.dir.to_str().unwrap(),
        ]);
        assert!(r.ok, "disk add on host {}: {r:?}", h.name);
        let after = self.host_osds(i);
        *after
            .iter()
            .find(|o| !before.contains(o))
            .unwrap_or_else(|| panic!("no new OSD on host {} after disk add: {r:?}", h.name))
    }

    /// OSD ids recorded on host i (`disk ls`), including ones moved away
    /// by `take_osd_away`.
    pub fn host_osds(&self, i: usize) -> Vec<i32> {
        let mut ids = Vec::new();
        for sub in ["osds", "osds-away"] {
            if let Ok(d) = std::fs::read_dir(self.hosts[i].dir.join(sub)) {
                for e in d.filter_map(|e| e.ok()) {
                    let name = e.file_name().to_string_lossy().to_string();
                    if let Some(id) = name.strip_prefix("osd.").and_then(|s| s.parse().ok()) {
                        ids.push(id);
                    }
                }
            }
        }
        ids.sort();
        ids
    }

    /// The host index holding `osd`.
    pub fn host_of(&self, osd: i32) -> usize {
        (0..self.hosts.len())
            .find(|i| self.host_osds(*i).contains(&osd))
            .unwrap_or_else(|| panic!("osd.{osd} is on no host"))
    }

    /// SIGKILL of host i's daemon (its mon and every OSD).
    pub fn kill9(&self, i: usize) {
        let h = &self.hosts[i];
        let pid = h.pid().expect("pid file");
        let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
        assert!(
            wait_gone(pid),
            "host {}'s daemon (pid {pid}) still has threads running 10 s after kill -9",
            h.name
        );
        let _ = std::fs::remove_file(h.dir.join("cairn.pid"));
    }

    /// Starts host i's daemon again (in its namespace).
    pub fn start_host(&self, i: usize) -> Run {
        let h = &self.hosts[i];
        let mut cmd = Self::command(h.ns.as_deref());
        cmd.arg("-c")
            .arg(h.conf())
            .arg("daemon")
            .env_remove("CAIRN_CONF");
        let r = run_cmd(cmd);
        self.note_pid(i);
        r
    }

    /// Stops one OSD without telling the monitors, as when its disk dies:
    /// its record moves out of the node's `osds/`, so the daemon stops it
    /// (the daemon cannot kill a single OSD with a signal).
    pub fn take_osd_away(&self, osd: i32) {
        let h = &self.hosts[self.host_of(osd)];
        let away = h.dir.join("osds-away");
        std::fs::create_dir_all(&away).unwrap();
        std::fs::rename(
            h.dir.join("osds").join(format!("osd.{osd}")),
            away.join(format!("osd.{osd}")),
        )
        .expect("moving the OSD record away");
    }

    /// Gives back an OSD taken away; the daemon starts it within a second.
    pub fn bring_osd_back(&self, osd: i32) {
        let h = &self.hosts[self.host_of(osd)];
        std::fs::rename(
            h.dir.join("osds-away").join(format!("osd.{osd}")),
            h.dir.join("osds").join(format!("osd.{osd}")),
        )
        .expect("moving the OSD record back");
    }

    /// SIGKILL of every host's daemon.
    pub fn kill_all(&self) {
        for i in 0..self.hosts.len() {
            if self.hosts[i].pid().is_some() {
                self.kill9(i);
            }
        }
    }

    /// With every daemon stopped (`kill_all`): each OSD's objects (name ->
    /// content hash), read straight from its store, whichever collection
    /// (PG) holds them. OSDs taken away are read too.
    pub fn read_stores(&self) -> BTreeMap<i32, HashMap<String, u64>> {
        let mut out = BTreeMap::new();
        for h in &self.hosts {
            for sub in ["osds", "osds-away"] {
                let Ok(dir) = std::fs::read_dir(h.dir.join(sub)) else {
                    continue;
                };
                for e in dir.filter_map(|e| e.ok()) {
                    let rec: serde_json::Value = serde_json::from_slice(
                        &std::fs::read(e.path().join("osd.json")).expect("osd.json"),
                    )
                    .expect("osd.json is JSON");
                    let id = rec["id"].as_i64().expect("osd id") as i32;
                    let path = rec["store_path"].as_str().expect("store_path");
                    let mut cfg = StoreConfig::new(path);
                    cfg.data_bytes = rec["data_bytes"].as_u64().expect("data_bytes");
                    out.insert(id, store_objects(cfg));
                }
            }
        }
        out
    }

    /// `pg stat -f json`.
    pub fn pg_stat(&self) -> serde_json::Value {
        self.json(&["pg", "stat"])
    }

    /// PGs by state, and the total.
    pub fn pg_states(&self) -> (u64, serde_json::Map<String, serde_json::Value>) {
        let v = self.pg_stat();
        (
            v["num_pgs"].as_u64().unwrap_or(0),
            v["by_state"].as_object().cloned().unwrap_or_default(),
        )
    }

    pub fn all_clean(&self) -> bool {
        let (total, by) = self.pg_states();
        let clean = by.get("active+clean").and_then(|v| v.as_u64()).unwrap_or(0);
        total > 0 && clean == total
    }

    /// True when every PG is active (none stale, unknown, peering or down).
    pub fn all_active(&self) -> bool {
        let (total, by) = self.pg_states();
        let active: u64 = by
            .iter()
            .filter(|(s, _)| s.split('+').any(|w| w == "active") && !s.contains("stale"))
            .filter_map(|(_, n)| n.as_u64())
            .sum();
        total > 0 && active == total
    }

    pub fn wait_clean(&self, within: Duration) -> Duration {
        let t0 = Instant::now();
        loop {
            if self.all_clean() {
                return t0.elapsed();
            }
            assert!(
                t0.elapsed() < within,
                "PGs not active+clean after {within:?}: {:?}",
                self.pg_states().1
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// `pg dump -f json`'s per-PG entries.
    pub fn pg_dump(&self) -> Vec<serde_json::Value> {
        self.json(&["pg", "dump"])["pg_stats"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// (up, in) of each OSD from `osd dump`.
    pub fn osd_states(&self) -> BTreeMap<i32, (bool, bool)> {
        let v = self.json(&["osd", "dump"]);
        v["osds"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|o| {
                        Some((
                            o["id"].as_i64()? as i32,
                            (o["up"].as_bool()?, o["in"].as_bool()?),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits until `pred` holds on the OSD states; panics naming `what`.
    pub fn wait_osds(
        &self,
        what: &str,
        within: Duration,
        pred: impl Fn(&BTreeMap<i32, (bool, bool)>) -> bool,
    ) -> Duration {
        let t0 = Instant::now();
        loop {
            let s = self.osd_states();
            if !s.is_empty() && pred(&s) {
                return t0.elapsed();
            }
            assert!(
                t0.elapsed() < within,
                "{what}: not within {within:?}; OSDs (up, in): {s:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Mon addresses of every host.
    pub fn mon_addrs(&self) -> Vec<SocketAddr> {
        self.hosts.iter().map(|h| h.mon_addr).collect()
    }

    /// `client.admin`'s credentials.
    pub fn admin_creds(&self) -> Credentials {
        let path = self.hosts[0].dir.join("client.admin.keyring");
        let ring = Keyring::load(&path).expect("admin keyring");
        let name = EntityName::client("admin");
        let secret = ring.get(&name).expect("admin key").secret.clone();
        Credentials::Key { name, secret }
    }

    /// A writer on the pool through every mon, from the client namespace.
    pub fn writer(&self, prefix: &str, concurrency: usize) -> Writer {
        Writer::start(self.writer_opts(prefix, concurrency))
    }

    /// What `writer` uses, to adjust.
    pub fn writer_opts(&self, prefix: &str, concurrency: usize) -> WriterOpts {
        WriterOpts {
            mons: self.mon_addrs(),
            creds: self.admin_creds(),
            ns: self.client_ns(),
            pool: self.pool.clone(),
            prefix: prefix.to_string(),
            concurrency,
            op_timeout: Duration::from_secs(30),
            object_bytes: None,
        }
    }

    /// Reads every acknowledged object back; Err lists what is missing
    /// or differs.
    pub fn verify(&self, acked: &[Acked]) -> Result<(), String> {
        verify(
            self.mon_addrs(),
            self.admin_creds(),
            self.client_ns(),
            &self.pool,
            acked,
        )
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("CAIRN_KEEP_LOGS").is_some() {
            self.keep_logs();
        }
        let mut pids = self.pids.lock().map(|p| p.clone()).unwrap_or_default();
        pids.extend(self.hosts.iter().filter_map(|h| h.pid()));
        pids.sort();
        pids.dedup();
        let ours = self.tmp.path().to_string_lossy().to_string();
        for p in pids {
            // Only our own daemons: the command line names this cluster's dir.
            let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&ours) {
                let _ = Command::new("kill").arg("-9").arg(p.to_string()).status();
                wait_gone(p);
            }
        }
    }
}

impl Hosts {
    /// Copies every host's daemon log out of the temp dir (which is
    /// deleted) when a test fails (or `CAIRN_KEEP_LOGS` is set), and says
    /// where.
    fn keep_logs(&self) {
        let test = std::thread::current()
            .name()
            .unwrap_or("test")
            .replace("::", "-");
        let dir = std::env::temp_dir().join(format!("cairn-faults-{test}-{}", std::process::id()));
        if std::fs::create_dir_all(&dir).is_err() {
            return;
        }
        for h in &self.hosts {
            let _ = std::fs::copy(
                h.dir.join("daemon.log"),
                dir.join(format!("host-{}.log", h.name)),
            );
        }
        eprintln!("daemon logs kept in {}", dir.display());
    }
}

/// Every head object of every collection of a store: name -> hash.
fn store_objects(cfg: StoreConfig) -> HashMap<String, u64> {
    let path = cfg.path.display().to_string();
    // `kill9` waited until every thread of the daemon had exited, so its
    // lock on the store is gone.
    let store = Store::open(cfg).unwrap_or_else(|e| panic!("opening the store {path}: {e}"));
    let mut out = HashMap::new();
    for coll in store.list_collections().expect("collections") {
        let mut start = ListStart::Beginning;
        loop {
            let page = store.list_objects(&coll, &start, 512).expect("list");
            for o in &page {
                if o.namespace.is_empty() {
                    let data = store.read(&coll, o, 0, u64::MAX).expect("read");
                    out.insert(o.name.clone(), digest(&data));
                }
            }
            match page.last() {
                Some(last) if page.len() == 512 => start = ListStart::After(last.clone()),
                _ => break,
            }
        }
    }
    out
}

/// Where a writer connects and what it writes.
#[derive(Clone)]
pub struct WriterOpts {
    pub mons: Vec<SocketAddr>,
    pub creds: Credentials,
    /// Namespace the writer's thread enters first.
    pub ns: Option<String>,
    pub pool: String,
    /// Object names are `<prefix><n>`.
    pub prefix: String,
    pub concurrency: usize,
    /// Bound on one write including the client's retries.
    pub op_timeout: Duration,
    /// Object size; None = 4 to 68 KiB, from the name.
    pub object_bytes: Option<usize>,
}

/// One acknowledged write.
#[derive(Debug, Clone)]
pub struct Acked {
    pub name: String,
    pub len: usize,
    pub hash: u64,
    /// When the write was sent and when it was acknowledged.
    pub sent: Instant,
    pub acked: Instant,
}

/// The content of object `name`: `len` bytes, or 4 KiB to 68 KiB chosen
/// by the name.
pub fn content(name: &str, len: Option<usize>) -> Vec<u8> {
    let mut x = digest(name.as_bytes()) | 1;
    let len = len.unwrap_or(4096 + (x % (64 << 10)) as usize);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn digest(data: &[u8]) -> u64 {
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new();
    h.write(data);
    h.finish()
}

/// A map followed through a mon subscription until the receiver is dropped.
async fn follow_map(mon: &MonClient) -> Result<watch::Receiver<Arc<ClusterMap>>, String> {
    let mut sub = mon.subscribe().await.map_err(|e| e.to_string())?;
    let (tx, rx) = watch::channel(Arc::new(sub.map.clone()));
    tokio::spawn(async move {
        loop {
            match sub.next(Duration::from_secs(5)).await {
                Ok(m) => {
                    if tx.send(Arc::new(m.clone())).is_err() {
                        return;
                    }
                }
                Err(_) if tx.is_closed() => return,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    Ok(rx)
}

/// Connects (retrying, bounded) and returns the handle and the mon client
/// that must outlive it.
async fn connect(
    mons: Vec<SocketAddr>,
    creds: Credentials,
    op_timeout: Duration,
) -> Result<(Rados, MonClient), String> {
    let t0 = Instant::now();
    loop {
        let mon = MonClient::new(mons.clone(), creds.clone(), Duration::from_secs(5));
        match follow_map(&mon).await {
            Ok(rx) => {
                let mut cfg = ClientConfig::new(creds);
                cfg.op_timeout = op_timeout;
                return Ok((Rados::new(cfg, rx), mon));
            }
            Err(e) if t0.elapsed() > CONNECT_TIMEOUT => {
                return Err(format!("no map from the mons {mons:?}: {e}"))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Runs `f` on a thread of its own (in namespace `ns`, if given) with a
/// current-thread runtime.
fn on_thread<T: Send + 'static>(
    ns: Option<String>,
    f: impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = T>>> + Send + 'static,
) -> std::thread::JoinHandle<Result<T, String>> {
    std::thread::spawn(move || {
        if let Some(ns) = &ns {
            Netns::enter(ns)?;
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        Ok(rt.block_on(f()))
    })
}

/// A continuous write load; see the module comment.
pub struct Writer {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<Acked>>>,
    errors: Arc<Mutex<Vec<String>>>,
    handle: Option<std::thread::JoinHandle<Result<Result<(), String>, String>>>,
}

impl Writer {
    pub fn start(o: WriterOpts) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let (s, a, e) = (stop.clone(), acked.clone(), errors.clone());
        let handle = on_thread(o.ns.clone(), move || {
            Box::pin(async move {
                let (rados, _mon) = connect(o.mons.clone(), o.creds.clone(), o.op_timeout).await?;
                let io = rados.ioctx(&o.pool).map_err(|e| e.to_string())?;
                let next = Arc::new(AtomicU64::new(0));
                let mut tasks = Vec::new();
                for _ in 0..o.concurrency {
                    let (io, next, s, a, e) =
                        (io.clone(), next.clone(), s.clone(), a.clone(), e.clone());
                    let (prefix, size) = (o.prefix.clone(), o.object_bytes);
                    let bound = o.op_timeout + Duration::from_secs(5);
                    tasks.push(tokio::spawn(async move {
                        while !s.load(Ordering::SeqCst) {
                            let name = format!("{prefix}{}", next.fetch_add(1, Ordering::SeqCst));
                            let data = content(&name, size);
                            let (len, hash) = (data.len(), digest(&data));
                            let sent = Instant::now();
                            match tokio::time::timeout(bound, io.write_full(&name, data)).await {
                                Ok(Ok(_)) => a.lock().unwrap().push(Acked {
                                    name,
                                    len,
                                    hash,
                                    sent,
                                    acked: Instant::now(),
                                }),
                                Ok(Err(err)) => e.lock().unwrap().push(format!("{name}: {err}")),
                                Err(_) => e.lock().unwrap().push(format!("{name}: no answer")),
                            }
                        }
                    }));
                }
                for t in tasks {
                    t.await.map_err(|e| e.to_string())?;
                }
                Ok(())
            })
        });
        Writer {
            stop,
            acked,
            errors,
            handle: Some(handle),
        }
    }

    pub fn acked_count(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().unwrap().clone()
    }

    /// Acknowledged writes so far.
    pub fn acked(&self) -> Vec<Acked> {
        self.acked.lock().unwrap().clone()
    }

    /// Waits until `n` writes in total are acknowledged; false on timeout.
    pub fn wait_acked(&self, n: usize, within: Duration) -> bool {
        let t0 = Instant::now();
        while self.acked_count() < n {
            if t0.elapsed() > within || self.handle.as_ref().is_some_and(|h| h.is_finished()) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }

    /// Stops sending, waits for the writes in flight to be answered (each
    /// is bounded by the op timeout) and returns what was acknowledged and
    /// the failures.
    pub fn stop(mut self) -> (Vec<Acked>, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            match h.join() {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) | Ok(Err(e)) => panic!("writer failed: {e}"),
                Err(_) => panic!("writer thread panicked"),
            }
        }
        (self.acked(), self.errors())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Objects read back at once by `verify`.
const VERIFY_CONCURRENCY: usize = 16;

/// Reads every object of `acked` and compares length and hash.
pub fn verify(
    mons: Vec<SocketAddr>,
    creds: Credentials,
    ns: Option<String>,
    pool: &str,
    acked: &[Acked],
) -> Result<(), String> {
    let pool = pool.to_string();
    let want: Vec<(String, usize, u64)> = acked
        .iter()
        .map(|a| (a.name.clone(), a.len, a.hash))
        .collect();
    let h = on_thread(ns, move || {
        Box::pin(async move {
            let (rados, _mon) = connect(mons, creds, Duration::from_secs(30)).await?;
            let io = rados.ioctx(&pool).map_err(|e| e.to_string())?;
            let want = Arc::new(want);
            let next = Arc::new(AtomicU64::new(0));
            let bad: Arc<Mutex<Vec<String>>> = Arc::default();
            let mut tasks = Vec::new();
            for _ in 0..VERIFY_CONCURRENCY {
                let (io, want, next, bad) = (io.clone(), want.clone(), next.clone(), bad.clone());
                tasks.push(tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst) as usize;
                        let Some((name, len, hash)) = want.get(i) else {
                            return;
                        };
                        match io.read(name, 0, 0).await {
                            Ok(d) if d.len() == *len && digest(&d) == *hash => {}
                            Ok(d) => bad.lock().unwrap().push(format!(
                                "{name}: {} bytes, hash {:x}; acknowledged {len} bytes, hash {hash:x}",
                                d.len(),
                                digest(&d)
                            )),
                            Err(e) => bad.lock().unwrap().push(format!("{name}: {e}")),
                        }
                    }
                }));
            }
            for t in tasks {
                t.await.map_err(|e| e.to_string())?;
            }
            let bad = bad.lock().unwrap().clone();
            if bad.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "{} of {} acknowledged objects lost or wrong: {:?}",
                    bad.len(),
                    want.len(),
                    &bad[..bad.len().min(20)]
                ))
            }
        })
    });
    match h.join() {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => Err(e),
        Err(_) => Err("verify thread panicked".into()),
    }
}
