//! The OSDs a node daemon hosts: each disk recorded under `<node>/osds/`
//! runs as its own supervised task (own store, listener, id, key, map
//! subscription); one that fails is restarted with a backoff and never
//! takes the process down. Each OSD talks to the monitors with its own
//! `osd.N` key: boot, `up_thru`, heartbeat failure reports and beacons
//! (which carry its PG statistics) are forwarded from the OSD runtime.
//! Owns no PG logic or failure detection (cairn-osd) and no disk
//! preparation (cmd_disk).

use anyhow::{anyhow, Context, Result};
use cairn_map::{MonCommand, OsdReported};
use cairn_mon::MonClient;
use cairn_msg::{Credentials, Keyring};
use cairn_osd::{MemoryBudget, Osd, OsdConfig};
use cairn_store::{Store, StoreConfig};
use cairn_types::EntityName;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Directory of a node's OSD records.
pub const OSDS_DIR: &str = "osds";
/// How often the daemon looks for new or removed disks (reading a few
/// small records; short so that `disk add` and `dev up` wait little).
const SCAN_INTERVAL: Duration = Duration::from_millis(200);
/// Backoff after an OSD failed to start, doubling up to the max.
const RESTART_BACKOFF_MIN: Duration = Duration::from_secs(2);
const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(60);
/// Period of the "am I still up in the map" check.
const STATUS_INTERVAL: Duration = Duration::from_secs(1);
/// The data cache's counters go to the log at most this often (when they moved).
const CACHE_LOG_INTERVAL: Duration = Duration::from_secs(60);
/// A boot message is resent at most this often while the map shows us down.
const REBOOT_INTERVAL: Duration = Duration::from_secs(3);
/// Bound on each command this daemon sends to the monitors.
const MON_CMD_TIMEOUT: Duration = Duration::from_secs(10);
/// An OSD that stopped itself (its store failed to commit) is restarted on
/// a freshly opened store at most this many times within the window (as
/// systemd's start limit does for Ceph's OSDs); after that it stays
/// stopped until the daemon restarts, so a dying disk does not flap.
const FAIL_STOP_LIMIT: usize = 3;
const FAIL_STOP_WINDOW: Duration = Duration::from_secs(30 * 60);

/// `run_one`'s error when the OSD stopped itself (fail-stop).
#[derive(Debug)]
struct FailStopped(String);

impl std::fmt::Display for FailStopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stopped itself: {}", self.0)
    }
}

impl std::error::Error for FailStopped {}
/// Store cache per OSD when no memory target is known (tools that open a
/// store outside the daemon).
pub const OSD_STORE_CACHE_BYTES: u64 = 64 << 20;

/// One disk of this node, as `disk add` recorded it (`osds/osd.N/osd.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OsdRecord {
    pub id: i32,
    pub uuid: String,
    /// What the user gave to `disk add`.
    pub device: PathBuf,
    /// `dir`, `file` or `block`.
    pub kind: String,
    /// The store directory (holds `block` or a symlink to the device, and the metadata).
    pub store_path: PathBuf,
    pub class: String,
    pub weight: f64,
    pub data_bytes: u64,
    pub host: String,
    /// Directory holding the store's metadata and write-ahead log when they
    /// live apart from the data (`disk add --meta-path`, e.g. on an SSD).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta_path: Option<PathBuf>,
    /// Freed space is punched/discarded (`disk add --discard`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub discard: bool,
}

impl OsdRecord {
    pub fn dir(node: &Path, id: i32) -> PathBuf {
        node.join(OSDS_DIR).join(format!("osd.{id}"))
    }

    pub fn store_config(&self) -> StoreConfig {
        let mut cfg = StoreConfig::new(&self.store_path);
        cfg.meta_path = self.meta_path.clone();
        cfg.data_bytes = self.data_bytes;
        cfg.discard_freed_blocks = self.discard;
        cfg.cache_bytes = OSD_STORE_CACHE_BYTES;
        cfg.meta_reserve_bytes = 16 << 20;
        // The monitors mark an OSD full at the map's full_ratio (0.95) and
        // its PGs refuse writes from then on; the store's own limit is the
        // failsafe behind it.
        cfg.full_ratio = cairn_map::OSD_FAILSAFE_FULL_RATIO;
        cfg
    }

    /// The store config with its cache and write queue sized from the
    /// OSD's memory budget.
    pub fn store_config_within(&self, budget: &MemoryBudget) -> StoreConfig {
        let mut cfg = self.store_config();
        cfg.cache_bytes = budget.store_cache_bytes;
        cfg.max_inflight_bytes = budget.store_inflight_bytes;
        cfg
    }

    pub fn save(&self, node: &Path) -> Result<()> {
        let dir = OsdRecord::dir(node, self.id);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let text = serde_json::to_vec_pretty(self)?;
        cairn_mon::service::write_file_atomic(&dir.join("osd.json"), &text, 0o644)
    }

    /// Every recorded disk of a node, by id (unreadable records are reported).
    pub fn load_all(node: &Path) -> Result<BTreeMap<i32, OsdRecord>> {
        let mut out = BTreeMap::new();
        let root = node.join(OSDS_DIR);
        let rd = match std::fs::read_dir(&root) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e).with_context(|| format!("listing {}", root.display())),
        };
        for e in rd.flatten() {
            let p = e.path().join("osd.json");
            let Ok(text) = std::fs::read(&p) else {
                continue;
            };
            let rec: OsdRecord = serde_json::from_slice(&text)
                .with_context(|| format!("parsing {}", p.display()))?;
            out.insert(rec.id, rec);
        }
        Ok(out)
    }

    pub fn keyring_path(&self, node: &Path) -> PathBuf {
        OsdRecord::dir(node, self.id).join("keyring")
    }
}

/// Where a node's OSDs listen: `[osd] public_addr`, else the mon's IP.
pub fn bind_ip(conf: &cairn_types::Conf) -> IpAddr {
    for (sec, key) in [("osd", "public_addr"), ("global", "public_addr")] {
        if let Some(ip) = conf.get(sec, key).and_then(|v| v.parse::<IpAddr>().ok()) {
            return ip;
        }
    }
    conf.get("mon", "mon_addr")
        .and_then(|a| a.parse::<SocketAddr>().ok())
        .map(|a| a.ip())
        .unwrap_or(IpAddr::from([127, 0, 0, 1]))
}

/// Runs this node's OSDs until `stop` turns true; then marks them down
/// (through `mon`, the daemon's own mon credentials) and stops them.
pub async fn run(
    node: PathBuf,
    conf: Arc<cairn_types::Conf>,
    ip: IpAddr,
    mon_addrs: Vec<SocketAddr>,
    mon: Arc<MonClient>,
    mut stop: watch::Receiver<bool>,
) {
    let mut running: HashMap<i32, (watch::Sender<bool>, tokio::task::JoinHandle<()>)> =
        HashMap::new();
    let releaser = tokio::spawn(crate::heap::release_free_memory_periodically());
    loop {
        match OsdRecord::load_all(&node) {
            Ok(recs) => {
                for (id, rec) in &recs {
                    if running
                        .get(id)
                        .map(|(_, h)| h.is_finished())
                        .unwrap_or(true)
                    {
                        let (tx, rx) = watch::channel(false);
                        let h = tokio::spawn(supervise(
                            node.clone(),
                            conf.clone(),
                            rec.clone(),
                            ip,
                            mon_addrs.clone(),
                            mon.clone(),
                            rx,
                        ));
                        running.insert(*id, (tx, h));
                    }
                }
                let gone: Vec<i32> = running
                    .keys()
                    .filter(|id| !recs.contains_key(id))
                    .copied()
                    .collect();
                for id in gone {
                    if let Some((tx, h)) = running.remove(&id) {
                        tracing::info!("osd.{id}: its disk record was removed; stopping it");
                        let _ = tx.send(true);
                        let _ = tokio::time::timeout(Duration::from_secs(5), h).await;
                    }
                }
            }
            Err(e) => tracing::warn!("reading disk records under {}: {e:#}", node.display()),
        }
        tokio::select! {
            _ = tokio::time::sleep(SCAN_INTERVAL) => {}
            _ = stop.changed() => break,
        }
    }
    let ids: Vec<i32> = running.keys().copied().collect();
    if !ids.is_empty() {
        // Like an OSD's "mark me down": peers and clients stop waiting at once.
        let cmd = MonCommand::OsdDown { ids: ids.clone() };
        match tokio::time::timeout(Duration::from_secs(3), mon.command(&cmd)).await {
            Ok(Ok(_)) => tracing::info!("marked {ids:?} down before stopping"),
            Ok(Err(e)) => tracing::warn!("could not mark {ids:?} down: {e}"),
            Err(_) => tracing::warn!("could not mark {ids:?} down: monitors did not answer"),
        }
    }
    for (_, (tx, h)) in running {
        let _ = tx.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(5), h).await;
    }
    releaser.abort();
}

/// Keeps one OSD running: starts it, restarts it after a failure with a
/// growing backoff, stops it when asked. An OSD that stopped itself is
/// marked down at once (through `mon`, the daemon's credentials) and
/// restarted at most [`FAIL_STOP_LIMIT`] times per [`FAIL_STOP_WINDOW`].
async fn supervise(
    node: PathBuf,
    conf: Arc<cairn_types::Conf>,
    rec: OsdRecord,
    ip: IpAddr,
    mon_addrs: Vec<SocketAddr>,
    mon: Arc<MonClient>,
    mut stop: watch::Receiver<bool>,
) {
    let id = rec.id;
    let mut backoff = RESTART_BACKOFF_MIN;
    let mut fail_stops: Vec<Instant> = Vec::new();
    loop {
        let started = Instant::now();
        match run_one(&node, &conf, &rec, ip, &mon_addrs, &mut stop).await {
            Ok(()) => return,
            Err(e) if e.downcast_ref::<FailStopped>().is_some() => {
                let cmd = MonCommand::OsdDown { ids: vec![id] };
                match tokio::time::timeout(Duration::from_secs(3), mon.command(&cmd)).await {
                    Ok(Ok(_)) => tracing::info!("osd.{id}: marked down after it stopped itself"),
                    Ok(Err(e)) => tracing::warn!("osd.{id}: could not mark it down: {e}"),
                    Err(_) => tracing::warn!("osd.{id}: could not mark it down: no answer"),
                }
                fail_stops.retain(|t| t.elapsed() < FAIL_STOP_WINDOW);
                fail_stops.push(Instant::now());
                if fail_stops.len() > FAIL_STOP_LIMIT {
                    tracing::error!(
                        "osd.{id}: {e:#}; it stopped itself {} times within {} min: leaving it stopped (check the disk: dmesg, smartctl; restart the daemon to try again, or replace the disk)",
                        fail_stops.len(),
                        FAIL_STOP_WINDOW.as_secs() / 60
                    );
                    let _ = stop.wait_for(|s| *s).await;
                    return;
                }
                tracing::error!(
                    "osd.{id}: {e:#}; restarting it on a freshly opened store in {backoff:?} ({} of {FAIL_STOP_LIMIT} restarts within {} min)",
                    fail_stops.len(),
                    FAIL_STOP_WINDOW.as_secs() / 60
                );
            }
            Err(e) => tracing::error!("osd.{id}: {e:#}; retrying in {backoff:?}"),
        }
        if started.elapsed() > RESTART_BACKOFF_MAX {
            backoff = RESTART_BACKOFF_MIN;
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => return,
        }
        backoff = (backoff * 2).min(RESTART_BACKOFF_MAX);
    }
}

/// `osd_memory_target` of osd.`id`: cairn.conf (`[osd.N]`, `[osd]`,
/// `[global]`) wins over the central config (`cairn config set`), which
/// falls back to the option's default. Read when the OSD starts.
fn memory_target(conf: &cairn_types::Conf, map: &cairn_map::ClusterMap, id: i32) -> Result<u64> {
    let who = format!("osd.{id}");
    let (text, from) = match conf.get(&who, "osd_memory_target") {
        Some(v) => (v.to_string(), "cairn.conf"),
        None => match map.config_value(&who, "osd_memory_target") {
            Some(v) => (v, "the central config"),
            None => return Ok(cairn_osd::budget::DEFAULT_MEMORY_TARGET_BYTES),
        },
    };
    MemoryBudget::parse_target(&text).map_err(|e| anyhow!("{who}: {e} (from {from})"))
}

/// `osd_data_cache_bytes` of osd.`id` if set (cairn.conf wins over the
/// central config, as for the memory target); None = the target's share.
fn data_cache_setting(
    conf: &cairn_types::Conf,
    map: &cairn_map::ClusterMap,
    id: i32,
) -> Result<Option<u64>> {
    let who = format!("osd.{id}");
    let (text, from) = match conf.get(&who, "osd_data_cache_bytes") {
        Some(v) => (v.to_string(), "cairn.conf"),
        None => match map.config_value(&who, "osd_data_cache_bytes") {
            Some(v) => (v, "the central config"),
            None => return Ok(None),
        },
    };
    cairn_map::config::parse_size(text.trim())
        .map(Some)
        .map_err(|e| anyhow!("{who}: osd_data_cache_bytes '{text}' (from {from}): {e}"))
}

/// `osd_cache_written_data` of osd.`id` (cairn.conf wins over the central
/// config; default off).
fn cache_written_data_setting(
    conf: &cairn_types::Conf,
    map: &cairn_map::ClusterMap,
    id: i32,
) -> Result<bool> {
    let who = format!("osd.{id}");
    let (text, from) = match conf.get(&who, "osd_cache_written_data") {
        Some(v) => (v.to_string(), "cairn.conf"),
        None => match map.config_value(&who, "osd_cache_written_data") {
            Some(v) => (v, "the central config"),
            None => return Ok(false),
        },
    };
    cairn_map::config::parse_bool_value(text.trim())
        .map_err(|e| anyhow!("{who}: osd_cache_written_data (from {from}): {e}"))
}

/// `osd_zero_unwritten` of osd.`id` (cairn.conf wins over the central
/// config; default off).
fn zero_unwritten_setting(
    conf: &cairn_types::Conf,
    map: &cairn_map::ClusterMap,
    id: i32,
) -> Result<bool> {
    let who = format!("osd.{id}");
    let (text, from) = match conf.get(&who, "osd_zero_unwritten") {
        Some(v) => (v.to_string(), "cairn.conf"),
        None => match map.config_value(&who, "osd_zero_unwritten") {
            Some(v) => (v, "the central config"),
            None => return Ok(false),
        },
    };
    cairn_map::config::parse_bool_value(text.trim())
        .map_err(|e| anyhow!("{who}: osd_zero_unwritten (from {from}): {e}"))
}

/// A messenger mode list (`ms_cluster_mode`, `ms_service_mode`, …) of
/// osd.`id`: cairn.conf wins over the central config; `None` when neither
/// sets it. Read when the OSD starts.
fn frame_modes_setting(
    conf: &cairn_types::Conf,
    map: &cairn_map::ClusterMap,
    id: i32,
    key: &str,
) -> Result<Option<cairn_msg::FrameModes>> {
    let who = format!("osd.{id}");
    let (text, from) = match conf.get(&who, key) {
        Some(v) => (v.to_string(), "cairn.conf"),
        None => match map.config_value(&who, key) {
            Some(v) => (v, "the central config"),
            None => return Ok(None),
        },
    };
    text.parse()
        .map(Some)
        .map_err(|e: String| anyhow!("{who}: {key} (from {from}): {e}"))
}

/// The frame modes osd.`id` allows from clients: `ms_service_mode`; when
/// that is not set, `ms_client_mode` if it is set for this OSD (which
/// meant "the mode this OSD requires of clients" before mode lists), else
/// the default.
fn service_modes(
    conf: &cairn_types::Conf,
    map: &cairn_map::ClusterMap,
    id: i32,
) -> Result<cairn_msg::FrameModes> {
    Ok(
        match frame_modes_setting(conf, map, id, "ms_service_mode")? {
            Some(m) => m,
            None => frame_modes_setting(conf, map, id, "ms_client_mode")?
                .unwrap_or(cairn_msg::DEFAULT_SERVICE_MODES),
        },
    )
}

/// Runs one OSD until stopped (Ok) or until it cannot continue (Err).
async fn run_one(
    node: &Path,
    conf: &cairn_types::Conf,
    rec: &OsdRecord,
    ip: IpAddr,
    mon_addrs: &[SocketAddr],
    stop: &mut watch::Receiver<bool>,
) -> Result<()> {
    let id = rec.id;
    let ring = Keyring::load(&rec.keyring_path(node))?;
    let me = EntityName::osd(id);
    let secret = ring
        .get(&me)
        .map(|e| e.secret.clone())
        .ok_or_else(|| anyhow!("{} has no key for {me}", rec.keyring_path(node).display()))?;
    let mon = Arc::new(MonClient::new(
        mon_addrs.to_vec(),
        Credentials::Key {
            name: me.clone(),
            secret: secret.clone(),
        },
        MON_CMD_TIMEOUT,
    ));
    let map_rx = crate::conn::follow_map(&mon).await?;
    let target = memory_target(conf, &map_rx.borrow(), id)?;
    let mut budget = MemoryBudget::from_target(target);
    if let Some(bytes) = data_cache_setting(conf, &map_rx.borrow(), id)? {
        let (b, note) = budget.with_data_cache(bytes);
        budget = b;
        if let Some(note) = note {
            tracing::warn!("osd.{id}: {note}");
        }
    }
    tracing::info!(
        "osd.{id}: osd_memory_target {} MiB: store cache {} MiB, data cache {} MiB, client bytes in flight {} MiB, connection windows {} MiB, pg log <= {} entries",
        budget.target_bytes >> 20,
        budget.store_cache_bytes >> 20,
        budget.data_cache_bytes >> 20,
        budget.client_inflight_bytes >> 20,
        budget.connection_window_bytes >> 20,
        budget.max_log_entries
    );
    let mut cfg = rec.store_config_within(&budget);
    cfg.zero_unwritten = zero_unwritten_setting(conf, &map_rx.borrow(), id)?;
    let store = tokio::task::spawn_blocking(move || Store::open(cfg))
        .await
        .map_err(|e| anyhow!("store open task: {e}"))?
        .with_context(|| {
            format!(
                "opening the store of osd.{id} at {}",
                rec.store_path.display()
            )
        })?;
    let statfs = store.statfs().ok();
    let (req_tx, mut req_rx) = tokio::sync::mpsc::channel::<MonCommand>(256);
    let fwd_mon = mon.clone();
    let fwd = tokio::spawn(async move {
        let mut next: Option<MonCommand> = None;
        loop {
            let cmd = match next.take() {
                Some(c) => c,
                None => match req_rx.recv().await {
                    Some(c) => c,
                    None => break,
                },
            };
            // PGs activating together (a new pool, an OSD coming back)
            // each ask for up_thru and a history record: the requests
            // queued meanwhile go to the monitors as one command.
            let cmd = match cmd {
                MonCommand::OsdAlive {
                    id: who,
                    mut want,
                    mut activating,
                } => {
                    while let Ok(more) = req_rx.try_recv() {
                        match more {
                            MonCommand::OsdAlive {
                                id: w,
                                want: x,
                                activating: a,
                            } if w == who => {
                                want = want.max(x);
                                activating.extend(a);
                            }
                            other => {
                                next = Some(other);
                                break;
                            }
                        }
                    }
                    MonCommand::OsdAlive {
                        id: who,
                        want,
                        activating,
                    }
                }
                other => other,
            };
            if let Err(e) = fwd_mon.command(&cmd).await {
                tracing::warn!("osd.{id}: {}: {e}", cmd.verb());
            }
        }
    });
    let mut ocfg = OsdConfig::new(id, secret).with_memory_target(budget.target_bytes);
    ocfg.data_cache_bytes = budget.data_cache_bytes;
    ocfg.cache_written_data = cache_written_data_setting(conf, &map_rx.borrow(), id)?;
    if let Some(m) = frame_modes_setting(conf, &map_rx.borrow(), id, "ms_cluster_mode")? {
        ocfg.cluster_mode = m;
    }
    ocfg.service_mode = service_modes(conf, &map_rx.borrow(), id)?;
    ocfg.bind_addr = SocketAddr::new(ip, 0);
    let osd = Osd::start_with_mon(ocfg, store, map_rx.clone(), Some(req_tx))
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let addr = osd.addr().to_string();
    let boot_id: u64 = rand::random();
    let reported = OsdReported {
        total_bytes: statfs
            .as_ref()
            .map(|s| s.total_bytes)
            .unwrap_or(rec.data_bytes),
        used_bytes: statfs.as_ref().map(|s| s.used_bytes).unwrap_or(0),
        state: "active".into(),
        boot_id,
    };
    let boot = MonCommand::OsdBoot {
        id,
        uuid: rec.uuid.clone(),
        addrs: osd.boot_addrs(),
        reported: reported.clone(),
    };
    tracing::info!(
        "osd.{id} listening on {addr}, store {}",
        rec.store_path.display()
    );
    let mut last_boot: Option<Instant> = None;
    let mut cache_logged = (Instant::now(), osd.cache_stats());
    let result = loop {
        let cache = osd.cache_stats();
        if cache_logged.0.elapsed() >= CACHE_LOG_INTERVAL && cache != cache_logged.1 {
            tracing::info!(
                "osd.{id} data cache: {} of {} MiB in {} objects; hits {} ({} MiB), misses {}, inserts {}, evictions {}, invalidations {}, checksum failures {}",
                cache.bytes >> 20,
                cache.capacity_bytes >> 20,
                cache.entries,
                cache.hits,
                cache.hit_bytes >> 20,
                cache.misses,
                cache.inserts,
                cache.evictions,
                cache.invalidations,
                cache.bad_checksums
            );
            cache_logged = (Instant::now(), cache);
        }
        if let Some(why) = osd.failed() {
            // Never boot a stopped OSD again as it is: its data path is gone.
            break Err(FailStopped(why).into());
        }
        let map = map_rx.borrow().clone();
        let needs_boot = match map.osds.get(&id) {
            None => {
                break Err(anyhow!(
                    "osd.{id} is no longer in the cluster map (purged?)"
                ))
            }
            Some(o) => !o.up || o.addrs.first() != Some(&addr),
        };
        if needs_boot
            && last_boot
                .map(|t| t.elapsed() >= REBOOT_INTERVAL)
                .unwrap_or(true)
        {
            last_boot = Some(Instant::now());
            match mon.command(&boot).await {
                Ok(r) => tracing::info!("osd.{id}: {}", r.plain.trim()),
                Err(e) => tracing::warn!("osd.{id}: boot: {e}"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(STATUS_INTERVAL) => {}
            _ = stop.changed() => break Ok(()),
        }
    };
    osd.stop();
    drop(osd);
    fwd.abort();
    result
}
