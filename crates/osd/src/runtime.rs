//! The OSD runtime: tokio tasks at the edge. An accept loop and one task
//! per connection decode messages and route them; one actor task per PG
//! owns its [`Pg`] state machine and performs its actions (store commits,
//! replication sends, replies); a map task follows the cluster map and
//! creates PGs this OSD holds. Owns no protocol decisions (see `pg`).

use crate::auth::{check_op_caps, is_peer_osd, MapKeys};
use crate::budget::MemoryBudget;
use crate::ec_exec;
use crate::ec_io::EcTarget;
use crate::ec_pool::EcPg;
use crate::exec;
use crate::peering;
use crate::pg::{PastInterval, Pg, PgAction, PgEvent, PgLimits, Placement, Role, Token};
use crate::stats::{LogPosition, PgStat, Published, StatInputs, StatKey};
use bytes::Bytes;
use cairn_map::{ClusterMap, PgRecoveryCounts, PoolKind};
use cairn_msg::{
    connect, AcceptModes, BlockCrcs, Connection, Credentials, FrameModes, KnownCrc, Listener,
    Message, MsgConfig, MsgError, Secret, DEFAULT_CLUSTER_MODES, DEFAULT_SERVICE_MODES,
};
use cairn_ops::{
    decode, decode_shared, encode, encode_parts, msg_type, EcRead, EcRollback, EcRollbackReply,
    LogEntry, LogOp, Mutation, OpError, OpReply, OpRequest, OpStatus, PgBackfill, PgBackfillAck,
    PgInfo, PgNotify, PgPull, PgPush, PgPushReply, PgQuery, PgRemove, PgStray, PullReply, RepOp,
    RepOpAck, SubOp, SubOpOutput, Version,
};
use cairn_store::{CollectionId, Store, StoreError, Transaction};
use cairn_types::{EntityName, Epoch, PgId, PoolId};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;

/// The cluster map as the OSD follows it: a watch channel fed by tests, or
/// by the monitor client's subscription in the daemon.
pub type MapSource = watch::Receiver<Arc<ClusterMap>>;

/// Commands an OSD asks the monitors to run (today `OsdAlive` for
/// `up_thru`): the daemon forwards them with its `MonClient`, tests apply
/// them to their map.
pub type MonRequests = mpsc::Sender<cairn_map::MonCommand>;

/// Store meta key of the PG info.
pub(crate) const META_INFO: &str = "info";
/// Store meta key of the past intervals.
pub(crate) const META_PAST: &str = "past_intervals";
/// Messages queued to one PG actor, at most.
const PG_QUEUE_LEN: usize = 1024;
/// A stray copy tells the acting primary it exists this often.
const STRAY_NOTIFY_INTERVAL: Duration = Duration::from_secs(3);
/// A client op waiting longer than this in a PG is reported (once).
const SLOW_OP: Duration = Duration::from_secs(5);
/// Replication sub-ops a replica holds while waiting for a newer map, at most.
const MAX_HELD_REPOPS: usize = 4096;
/// Throttle unit: permits are KiB.
const THROTTLE_UNIT_BYTES: u64 = 1024;

/// OSD settings (Ceph's names where the meaning is the same).
#[derive(Debug, Clone)]
pub struct OsdConfig {
    pub id: i32,
    /// Address to listen on (port 0 = any); the map's address for this OSD
    /// must be the one peers and clients can reach.
    pub bind_addr: SocketAddr,
    /// This OSD's own key (`osd.N` in the map's auth table), used to
    /// authenticate to peer OSDs.
    pub secret: Secret,
    /// OSD service secrets by generation, to accept client tickets.
    pub service_secrets: BTreeMap<u64, Secret>,
    /// Limits and timeouts of this OSD's connections. Its frame modes are
    /// set from `cluster_mode` and `service_mode` when the OSD starts.
    pub msg: MsgConfig,
    /// `ms_cluster_mode`: frame modes between OSDs (replication sub-ops,
    /// recovery and backfill, peering, heartbeats), most preferred first:
    /// offered when this OSD connects to another, allowed when another
    /// connects to it. Default `crc secure` ([`DEFAULT_CLUSTER_MODES`]):
    /// crc (authenticated at connect time and per header, payloads checked
    /// by crc32c) with any OSD that allows it.
    pub cluster_mode: FrameModes,
    /// `ms_service_mode`: the frame modes this OSD allows from clients.
    /// Default `crc secure` ([`DEFAULT_SERVICE_MODES`]): each client's own
    /// `ms_client_mode` list picks (see docs/operations.md).
    pub service_mode: FrameModes,
    /// `osd_client_message_size_cap`: bytes of client op payload in flight
    /// at once; more waits (the connection stops being read).
    pub client_message_size_cap_bytes: u64,
    pub pg: PgLimits,
    /// Bound on each peering call (query, pull, push) to a peer.
    pub peer_timeout: Duration,
    /// How long an op from a newer map epoch waits for this OSD's map.
    pub map_wait: Duration,
    /// Bytes of object state per recovery push or pull, at most.
    pub recovery_batch_bytes: u64,
    /// Period of the PG actors' housekeeping (resends, peering retries).
    pub tick: Duration,
    /// `osd_memory_target` this config was sized from (see
    /// [`OsdConfig::with_memory_target`]).
    pub memory_target_bytes: u64,
    /// Bytes of the data cache (whole objects of replicated PGs read in
    /// full; 0 = off). `with_memory_target` sets its share of the target.
    pub data_cache_bytes: u64,
    /// Big reads (>= 64 KiB) of replicated PGs run off the PG's task, at
    /// most this many at once per OSD (each holds its read buffer).
    pub max_parallel_reads: usize,
    /// The copy that client reads are served from (a replicated PG's
    /// primary, an EC PG's data chunks) writes big data through the
    /// kernel's page cache instead of O_DIRECT, so reads soon after a
    /// write come from memory (see `Transaction::keep_data_cached`);
    /// replicas and parity chunks bypass it. `osd_cache_written_data`,
    /// default off: it took the disk out of `rados bench seq` but cost
    /// 4 MiB writes CPU and bandwidth on the 2-vCPU test VM (bench/README.md).
    pub cache_written_data: bool,
}

impl OsdConfig {
    pub fn new(id: i32, secret: Secret) -> OsdConfig {
        OsdConfig {
            id,
            bind_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            secret,
            service_secrets: BTreeMap::new(),
            msg: MsgConfig::default(),
            cluster_mode: DEFAULT_CLUSTER_MODES,
            service_mode: DEFAULT_SERVICE_MODES,
            client_message_size_cap_bytes: 256 << 20,
            pg: PgLimits::default(),
            peer_timeout: Duration::from_secs(10),
            map_wait: Duration::from_secs(2),
            recovery_batch_bytes: 32 << 20,
            tick: Duration::from_millis(500),
            memory_target_bytes: 0,
            data_cache_bytes: 0,
            max_parallel_reads: DEFAULT_MAX_PARALLEL_READS,
            cache_written_data: false,
        }
        .with_memory_target(crate::budget::DEFAULT_MEMORY_TARGET_BYTES)
    }

    /// Sizes what grows with load from `osd_memory_target`: client bytes in
    /// flight, each connection's message windows and the PG log length
    /// (the store's cache and write queue are sized by whoever opens the
    /// store, from the same [`MemoryBudget`]).
    pub fn with_memory_target(mut self, target_bytes: u64) -> OsdConfig {
        let b = MemoryBudget::from_target(target_bytes);
        self.memory_target_bytes = b.target_bytes;
        self.client_message_size_cap_bytes = b.client_inflight_bytes;
        self.msg.max_inflight_bytes = b.connection_window_bytes as usize;
        self.pg.max_log_entries = b.max_log_entries;
        self.data_cache_bytes = b.data_cache_bytes;
        self
    }
}

/// Default of [`OsdConfig::max_parallel_reads`]: enough to keep a disk's
/// queue busy (a 16-deep client load spread over a few OSDs), few enough
/// that the read buffers stay small (8 x 4 MiB).
pub const DEFAULT_MAX_PARALLEL_READS: usize = 8;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OsdError {
    #[error("osd.{osd}: store error: {source}")]
    Store {
        osd: i32,
        #[source]
        source: StoreError,
    },
    #[error("osd.{osd}: messaging error: {source}")]
    Msg {
        osd: i32,
        #[source]
        source: MsgError,
    },
    #[error("osd.{osd}: {reason}")]
    Config { osd: i32, reason: String },
}

/// Tasks of one OSD, so that `stop` can end them all (a simulated kill).
#[derive(Default)]
struct Tasks(Mutex<Vec<AbortHandle>>);

impl Tasks {
    fn spawn<F>(&self, fut: F) -> AbortHandle
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let h = tokio::spawn(fut).abort_handle();
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() > 1024 {
            v.retain(|a| !a.is_finished());
        }
        v.push(h.clone());
        h
    }
    fn abort_all(&self) {
        let v = std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()));
        for a in v {
            a.abort();
        }
    }
}

pub(crate) enum PgMsg {
    Map(Arc<ClusterMap>),
    ClientOp {
        conn: Connection,
        msg: Message,
        req: OpRequest,
        permit: Option<OwnedSemaphorePermit>,
    },
    RepOp {
        conn: Connection,
        rep: RepOp,
        /// Verified block crcs of the message's data (see `BlockCrcs`).
        blocks: Option<Arc<BlockCrcs>>,
    },
    RepAck(RepOpAck),
    Query {
        conn: Connection,
        msg: Message,
    },
    Pull {
        conn: Connection,
        msg: Message,
        pull: PgPull,
    },
    Push {
        conn: Connection,
        msg: Message,
        push: PgPush,
    },
    Committed {
        seq: u64,
        from: i32,
        interval_since: Epoch,
    },
    EcRollback {
        conn: Connection,
        msg: Message,
        rb: EcRollback,
    },
    /// A store commit of this PG's write at `seq` failed on `from` (this
    /// OSD or a replica).
    CommitFailed {
        seq: u64,
        from: i32,
        interval_since: Epoch,
        error: OpError,
    },
    PeeringDone {
        interval_since: Epoch,
        result: Result<(PgInfo, Vec<LogEntry>), String>,
    },
    /// A read handed out by the PG finished its store read. `failed`: it
    /// failed with an I/O error, and the actor answers it (after queueing
    /// a repair, see `repair_after_read_error`).
    ReadDone {
        token: Token,
        failed: Option<Box<FailedRead>>,
    },
    /// From this PG's scrub job: block / poll / release its chunk.
    Scrub(crate::scrub::ScrubCtl),
    /// This PG's scrub job finished.
    ScrubDone(Box<crate::scrub::ScrubOutcome>),
    /// Backfill target side: a batch from the primary.
    Backfill {
        conn: Connection,
        bf: PgBackfill,
        /// Verified block crcs of the batch's data (see `BlockCrcs`).
        blocks: Option<Arc<BlockCrcs>>,
    },
    /// Primary side: a target's answer to a batch.
    BackfillAck(PgBackfillAck),
    /// The primary says this OSD's copy is a stray of a clean PG.
    Remove(PgRemove),
    /// Primary side: an OSD says it holds a stray copy.
    Stray(PgStray),
}

/// A client op waiting for its answer: where to reply, and its share of the
/// in-flight byte budget.
type PendingOp = (Connection, Message, Option<OwnedSemaphorePermit>);
/// A read that failed off the actor: its reply and the op it answers.
type FailedRead = (OpReply, Option<PendingOp>);

/// This OSD's connection to one peer OSD, as [`Shared::peer_now`] keeps it.
enum PeerSlot {
    Idle,
    /// A background connect is under way.
    Connecting,
    /// Connected; the generation is bumped per reconnect.
    Up(u64, Connection),
    /// The last connect failed (retried [`PEER_RETRY_AFTER`] later).
    Failed {
        at: std::time::Instant,
        why: String,
    },
}

/// A failed connect to a peer OSD is not retried before this.
const PEER_RETRY_AFTER: Duration = Duration::from_secs(1);

pub(crate) struct Shared {
    pub(crate) cfg: OsdConfig,
    pub(crate) store: Arc<Store>,
    pub(crate) map_rx: MapSource,
    pub(crate) mon: Option<MonRequests>,
    pgs: Mutex<HashMap<PgId, mpsc::Sender<PgMsg>>>,
    stats: Mutex<BTreeMap<PgId, Published>>,
    /// The next `Published::gen`.
    stats_gen: AtomicU64,
    /// Objects this OSD recovered as primary, per PG (for the beacons).
    recovered: Mutex<BTreeMap<PgId, PgRecoveryCounts>>,
    peers: Mutex<HashMap<i32, PeerSlot>>,
    /// Bumped whenever a background peer connect ends.
    peer_events: watch::Sender<u64>,
    /// Why this OSD stopped itself (fail-stop), once it has: its daemon
    /// reads it to stop booting it and to restart it (`Osd::failed`).
    /// The heartbeat thread watches it and stops answering at once.
    pub(crate) failed: watch::Sender<Option<String>>,
    peer_gen: AtomicU64,
    throttle: Arc<Semaphore>,
    throttle_units: u32,
    /// Backfill slots, batches in flight and the bandwidth cap.
    pub(crate) recovery: crate::backfill::RecoveryThrottle,
    /// Times what this OSD copies for recovery and backfill.
    pub(crate) copy_meter: crate::backfill::CopyMeter,
    tasks: Tasks,
    next_token: AtomicU64,
    addr: SocketAddr,
    /// Scrub slots (`osd_max_scrubs`) and scrub-map builds for peers.
    pub(crate) scrub: crate::scrub::OsdScrubShared,
    /// Whole objects of replicated PGs recently read in full.
    cache: crate::cache::DataCache,
    /// Slots for big store reads running off the PG tasks.
    read_slots: Arc<Semaphore>,
}

/// A running OSD. Dropping it (or `stop`) ends every task; the store closes
/// once the last task let go of it.
pub struct Osd {
    shared: Arc<Shared>,
    /// The heartbeat thread (OSDs started with a way to the monitors).
    hb: Option<crate::heartbeat::HbThread>,
}

impl Drop for Osd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The client-facing error for a store commit that failed on `osd`.
fn commit_error(osd: i32, why: &str) -> OpError {
    let named = format!("osd.{osd} is full");
    if let Some(i) = why.find(&named) {
        // A replica's own refusal already says which OSD is full.
        OpError::NoSpace(why[i..].to_string())
    } else if why.contains("store is full") {
        OpError::NoSpace(format!("{named}: {why}"))
    } else {
        OpError::Io(format!("osd.{osd} failed to commit: {why}"))
    }
}

pub(crate) fn coll_of(pgid: PgId) -> CollectionId {
    CollectionId::pg(pgid.pool.0, pgid.seed)
}

/// Reads of at least this many bytes run through [`blocking_store_call`]
/// (or off the PG's task).
const BLOCKING_SUBMIT_BYTES: u64 = 64 << 10;

/// Runs store work that blocks (a large read, a submit that waits for the
/// store's in-flight budget) from async code. On a multi-thread runtime the worker first
/// hands its other tasks to another thread (`block_in_place`), so one PG's
/// 4 MiB write or read does not stall every connection, PG and heartbeat
/// task queued on that worker; the calling task still waits, which keeps
/// the PG's submit order. On a current-thread runtime it just runs.
pub(crate) fn blocking_store_call<R>(f: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// `store.submit(txn)`. The store writes a big write's data on its own
/// threads after `submit` returns, so a PG has many in flight; `submit`
/// blocks only for the store's in-flight budget, and then runs through
/// [`blocking_store_call`].
fn submit_txn(store: &Store, txn: Transaction) -> Result<cairn_store::CommitHandle, StoreError> {
    if store.submit_would_wait(txn.payload_bytes()) {
        blocking_store_call(|| store.submit(txn))
    } else {
        store.submit(txn)
    }
}

/// Bytes `req` holds in this OSD while it runs: its payload, plus the
/// buffers of its reads (a whole-object read counted as
/// [`WHOLE_READ_ESTIMATE_BYTES`]), so read buffers and write payloads share
/// the client in-flight budget (`osd_client_message_size_cap`).
fn inflight_bytes(req: &OpRequest) -> u64 {
    req.payload_bytes()
        + req
            .ops
            .iter()
            .map(|op| match op {
                SubOp::Read { len: 0, .. } => WHOLE_READ_ESTIMATE_BYTES,
                SubOp::Read { len, .. } => *len,
                _ => 0,
            })
            .sum::<u64>()
}

/// What a read of a whole object (length 0) is counted as in the client
/// in-flight budget: the usual object size.
const WHOLE_READ_ESTIMATE_BYTES: u64 = 4 << 20;

/// Whether serving `req` may read enough data to block for a while.
fn reads_much(req: &OpRequest) -> bool {
    req.ops.iter().any(|op| match op {
        SubOp::Read { len, .. } => *len == 0 || *len >= BLOCKING_SUBMIT_BYTES,
        _ => false,
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Osd {
    /// Starts the OSD without a way to reach the monitors: PGs activate
    /// without recording `up_thru`, and every past interval with at least
    /// `min_size` members counts as one that may have accepted writes.
    pub async fn start(cfg: OsdConfig, store: Store, map: MapSource) -> Result<Osd, OsdError> {
        Osd::start_with_mon(cfg, store, map, None).await
    }

    /// Starts the OSD: binds its listener, loads the PGs in `store`, follows
    /// `map` and serves clients and peers until stopped. With `mon`, a
    /// primary has the monitors record `up_thru` before a PG goes active
    /// (and past intervals whose primary never got it are known not to
    /// have accepted writes).
    pub async fn start_with_mon(
        cfg: OsdConfig,
        store: Store,
        map: MapSource,
        mon: Option<MonRequests>,
    ) -> Result<Osd, OsdError> {
        let mut cfg = cfg;
        // Peer OSDs are connected to, and accepted, in the cluster modes;
        // everyone else is accepted in the service modes.
        cfg.msg.modes = cfg.cluster_mode;
        // Received writes come with the verified crcs of their 4 KiB
        // blocks (crc mode), which the store keeps instead of computing.
        cfg.msg.recv_block_crcs = true;
        cfg.msg.accept = AcceptModes {
            osd: cfg.cluster_mode,
            others: cfg.service_mode,
        };
        let id = cfg.id;
        let keys = Arc::new(MapKeys {
            map: map.clone(),
            service: cfg.service_secrets.clone(),
        });
        let listener = Listener::bind(
            cfg.bind_addr,
            EntityName::osd(id),
            keys.clone(),
            cfg.msg.clone(),
        )
        .await
        .map_err(|source| OsdError::Msg { osd: id, source })?;
        let units = (cfg.client_message_size_cap_bytes / THROTTLE_UNIT_BYTES)
            .clamp(1, u64::from(u32::MAX >> 4)) as u32;
        let cache = crate::cache::DataCache::new(cfg.data_cache_bytes);
        let read_slots = Arc::new(Semaphore::new(cfg.max_parallel_reads.max(1)));
        let shared = Arc::new(Shared {
            throttle: Arc::new(Semaphore::new(units as usize)),
            throttle_units: units,
            recovery: Default::default(),
            copy_meter: Default::default(),
            cfg,
            store: Arc::new(store),
            map_rx: map,
            mon,
            pgs: Mutex::new(HashMap::new()),
            stats: Mutex::new(BTreeMap::new()),
            stats_gen: AtomicU64::new(1),
            recovered: Mutex::new(BTreeMap::new()),
            peers: Mutex::new(HashMap::new()),
            peer_events: watch::channel(0).0,
            failed: watch::channel(None).0,
            peer_gen: AtomicU64::new(1),
            tasks: Tasks::default(),
            next_token: AtomicU64::new(1),
            addr: listener.local_addr(),
            scrub: crate::scrub::OsdScrubShared::default(),
            cache,
            read_slots,
        });
        let colls = shared
            .store
            .list_collections()
            .map_err(|source| OsdError::Store { osd: id, source })?;
        for c in colls {
            let pgid = PgId {
                pool: PoolId(c.pool),
                seed: c.seed,
            };
            ensure_pg(&shared, pgid).map_err(|source| OsdError::Store { osd: id, source })?;
        }
        let s2 = shared.clone();
        shared.tasks.spawn(accept_loop(s2, listener));
        let s3 = shared.clone();
        shared.tasks.spawn(map_loop(s3));
        crate::backfill::recycle_read_buffers(&shared);
        let mut hb = None;
        if let Some(mon) = shared.mon.clone() {
            // Heartbeats and beacons need the monitors to report to.
            match crate::heartbeat::HbThread::start(&shared, keys, mon.clone()).await {
                Ok(t) => hb = Some(t),
                Err(reason) => {
                    shared.tasks.abort_all();
                    return Err(OsdError::Config { osd: id, reason });
                }
            }
            shared.tasks.spawn(crate::beacon::run(shared.clone(), mon));
        }
        Ok(Osd { shared, hb })
    }

    pub fn id(&self) -> i32 {
        self.shared.cfg.id
    }

    /// The address the listener is bound to (register this in the map).
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// The heartbeat thread's listener, when the OSD runs one.
    pub fn heartbeat_addr(&self) -> Option<SocketAddr> {
        self.hb.as_ref().map(|h| h.addr())
    }

    /// The addresses to register in the map at boot: the data address,
    /// then the heartbeat address when there is one (peers ping `addrs[1]`).
    pub fn boot_addrs(&self) -> Vec<String> {
        std::iter::once(self.addr())
            .chain(self.heartbeat_addr())
            .map(|a| a.to_string())
            .collect()
    }

    /// What this OSD copied as a recovery or backfill sender since it
    /// started: first copy sent, last one durable, bytes and objects.
    pub fn copy_window(&self) -> Option<crate::backfill::CopyWindow> {
        self.shared.copy_meter.total()
    }

    /// Counters and size of the data cache.
    pub fn cache_stats(&self) -> crate::cache::CacheStats {
        self.shared.cache.stats()
    }

    /// Empties the data cache (to measure cold reads).
    pub fn drop_cache(&self) {
        self.shared.cache.clear()
    }

    /// PG states on this OSD.
    pub fn pg_stats(&self) -> Vec<PgStat> {
        lock(&self.shared.stats)
            .values()
            .map(Published::to_stat)
            .collect()
    }

    /// Why this OSD stopped itself (fail-stop after its own store failed
    /// to commit), or None while it runs. A stopped OSD serves nothing and
    /// stops answering heartbeats; its daemon must not boot it again as it
    /// is (see `cairn daemon`: it restarts it on a freshly opened store).
    pub fn failed(&self) -> Option<String> {
        self.shared.failed.borrow().clone()
    }

    /// Ends every task of this OSD at once (like a crash of the process:
    /// nothing is flushed beyond what the store already committed).
    pub fn stop(&self) {
        self.shared.tasks.abort_all();
        if let Some(hb) = &self.hb {
            hb.stop();
        }
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: Listener) {
    loop {
        match listener.accept().await {
            Ok(conn) => {
                let s = shared.clone();
                shared.tasks.spawn(serve_conn(s, conn));
            }
            Err(e) => {
                tracing::warn!("osd.{}: listener stopped: {e}", shared.cfg.id);
                return;
            }
        }
    }
}

async fn map_loop(shared: Arc<Shared>) {
    let mut rx = shared.map_rx.clone();
    loop {
        let map = rx.borrow_and_update().clone();
        let me = shared.cfg.id;
        for (pid, pool) in &map.pools {
            for seed in 0..pool.pg_num {
                let Ok(m) = map.pg_to_up(*pid, seed) else {
                    continue;
                };
                if m.up.contains(&me) || m.acting.contains(&me) {
                    let pgid = PgId {
                        pool: PoolId(*pid),
                        seed,
                    };
                    if let Err(e) = ensure_pg(&shared, pgid) {
                        tracing::error!("osd.{me}: cannot create pg {pgid}: {e}");
                    }
                }
            }
        }
        let senders: Vec<mpsc::Sender<PgMsg>> = lock(&shared.pgs).values().cloned().collect();
        for tx in senders {
            let _ = tx.send(PgMsg::Map(map.clone())).await;
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// The actor of `pgid`, created (with its collection) if needed.
fn ensure_pg(shared: &Arc<Shared>, pgid: PgId) -> Result<mpsc::Sender<PgMsg>, StoreError> {
    let mut pgs = lock(&shared.pgs);
    if let Some(tx) = pgs.get(&pgid) {
        return Ok(tx.clone());
    }
    let coll = pg_collection(shared, pgid)?;
    let store = &shared.store;
    if !store.collection_exists(&coll)? {
        let info = PgInfo {
            pgid: Some(pgid),
            ..Default::default()
        };
        let mut t = Transaction::new();
        t.create_collection(coll);
        t.meta_set(coll, META_INFO, encode(&info));
        store.commit(t)?;
    }
    let info: PgInfo = match store.meta_get(&coll, META_INFO)? {
        Some(b) => decode("pg info", &b).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        None => PgInfo::default(),
    };
    let past: Vec<PastInterval> = match store.meta_get(&coll, META_PAST)? {
        Some(b) => decode("past intervals", &b).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        None => Vec::new(),
    };
    let log = peering::read_log(store, coll)?;
    let scrub_stamps = crate::scrub::load_stamps(store, coll).unwrap_or_default();
    let pg = Pg::new(pgid, shared.cfg.id, shared.cfg.pg.clone(), info, log, past);
    let (tx, rx) = mpsc::channel(PG_QUEUE_LEN);
    let actor = PgActor {
        shared: shared.clone(),
        pg,
        pgid,
        coll,
        rx,
        tx: tx.clone(),
        pending: HashMap::new(),
        pending_since: HashMap::new(),
        repops: BTreeMap::new(),
        sent_gen: HashMap::new(),
        held: Vec::new(),
        peering: None,
        ec: None,
        ec_rolled_forward: Version::default(),
        scrub: PgScrubState {
            stamps: scrub_stamps,
            running: None,
            pending: None,
            jitter: rand::random::<f64>(),
            blocked_at: None,
            retry_at: None,
        },
        activated: Arc::default(),
        backfill: None,
        strays: Vec::new(),
        stray_told_at: None,
        pg_temp_clear: Default::default(),
        recovered: (0, 0),
        local_commits: std::collections::VecDeque::new(),
        full_refusal: None,
        published: None,
        written: exec::Footprint::default(),
    };
    shared.tasks.spawn(actor.run());
    let map = shared.map_rx.borrow().clone();
    let _ = tx.try_send(PgMsg::Map(map));
    pgs.insert(pgid, tx.clone());
    Ok(tx)
}

/// The collection of `pgid` on this OSD: the one already in the store, else
/// the PG's (replicated) or this OSD's shard's (erasure-coded) collection.
fn pg_collection(shared: &Arc<Shared>, pgid: PgId) -> Result<CollectionId, StoreError> {
    let existing: Vec<CollectionId> = shared
        .store
        .list_collections()?
        .into_iter()
        .filter(|c| c.pool == pgid.pool.0 && c.seed == pgid.seed)
        .collect();
    if existing.len() == 1 {
        return Ok(existing[0]);
    }
    let map = shared.map_rx.borrow().clone();
    let erasure = map
        .pools
        .get(&pgid.pool.0)
        .is_some_and(|p| p.kind == PoolKind::Erasure);
    if !erasure {
        return Ok(coll_of(pgid));
    }
    let shard = map.pg_to_up(pgid.pool.0, pgid.seed).ok().and_then(|m| {
        let me = shared.cfg.id;
        let acting = m.acting.iter().position(|&o| o == me);
        acting.or_else(|| m.up.iter().position(|&o| o == me))
    });
    // Several shards' copies (a shard move not cleaned up yet): the one
    // of this OSD's position, else any (the actor follows the move).
    if let Some(c) = existing
        .iter()
        .find(|c| shard.is_some_and(|s| usize::from(c.shard) == s))
        .or(existing.first())
    {
        return Ok(*c);
    }
    let shard = shard.unwrap_or(0);
    Ok(CollectionId::new(pgid.pool.0, pgid.seed, shard as u8))
}

fn pg_sender(shared: &Shared, pgid: PgId) -> Option<mpsc::Sender<PgMsg>> {
    lock(&shared.pgs).get(&pgid).cloned()
}

async fn serve_conn(shared: Arc<Shared>, conn: Connection) {
    loop {
        let msg = match conn.recv().await {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!("osd.{}: {}: {e}", shared.cfg.id, conn.peer_label());
                return;
            }
        };
        if let Err(e) = dispatch(&shared, &conn, msg).await {
            tracing::warn!(
                "osd.{}: dropping a message from {}: {e}",
                shared.cfg.id,
                conn.peer_label()
            );
        }
    }
}

async fn dispatch(shared: &Arc<Shared>, conn: &Connection, msg: Message) -> Result<(), String> {
    if msg.msg_type == msg_type::OP {
        return client_op(shared, conn, msg).await;
    }
    let map = shared.map_rx.borrow().clone();
    if is_peer_osd(&map, conn.peer()).is_none() {
        return Err(format!(
            "message type {:#x} is for OSD peers, {} is not one",
            msg.msg_type,
            conn.peer()
        ));
    }
    if msg.msg_type == crate::heartbeat::MSG_HB_PING {
        crate::heartbeat::answer_ping(shared, conn, msg).await;
        return Ok(());
    }
    let de = |e: cairn_types::DecodeError| e.to_string();
    let (pgid, pm) = match msg.msg_type {
        msg_type::REPOP => {
            let rep: RepOp = decode_shared("repop", &msg.payload).map_err(de)?;
            let tx = ensure_pg(shared, rep.pgid).map_err(|e| e.to_string())?;
            let _ = tx
                .send(PgMsg::RepOp {
                    conn: conn.clone(),
                    rep,
                    blocks: msg.blocks,
                })
                .await;
            return Ok(());
        }
        msg_type::EC_READ => {
            let r: EcRead = decode("ec read", &msg.payload).map_err(de)?;
            let reply = blocking_store_call(|| ec_exec::serve_read(&shared.store, &r));
            let _ = conn
                .reply_parts(&msg, msg_type::EC_READ_REPLY, encode_parts(&reply))
                .await;
            return Ok(());
        }
        msg_type::SCRUB_MAP => {
            let req: cairn_ops::ScrubMapRequest = decode("scrub map", &msg.payload).map_err(de)?;
            let s = shared.clone();
            let conn = conn.clone();
            // Built off the connection task: a deep map reads every byte.
            shared.tasks.spawn(async move {
                let reply = crate::scrub::serve_scrub_map(&s, req).await;
                let _ = conn
                    .reply(&msg, msg_type::SCRUB_MAP_REPLY, encode(&reply))
                    .await;
            });
            return Ok(());
        }
        msg_type::EC_ROLLBACK => {
            let rb = EcRollback::decode(&msg.payload).map_err(de)?;
            (
                rb.pgid,
                PgMsg::EcRollback {
                    conn: conn.clone(),
                    msg,
                    rb,
                },
            )
        }
        msg_type::REPOP_ACK => {
            let ack: RepOpAck = decode("repop ack", &msg.payload).map_err(de)?;
            (ack.pgid, PgMsg::RepAck(ack))
        }
        msg_type::PG_QUERY => {
            let q: PgQuery = decode("pg query", &msg.payload).map_err(de)?;
            if pg_sender(shared, q.pgid).is_none() {
                let n = PgNotify {
                    pgid: q.pgid,
                    from: shared.cfg.id,
                    epoch: map.epoch,
                    info: None,
                    log: Vec::new(),
                    shard: 0,
                    kept: Vec::new(),
                };
                let _ = conn.reply(&msg, msg_type::PG_NOTIFY, encode(&n)).await;
                return Ok(());
            }
            (
                q.pgid,
                PgMsg::Query {
                    conn: conn.clone(),
                    msg,
                },
            )
        }
        msg_type::PG_PULL => {
            let pull = PgPull::decode(&msg.payload).map_err(de)?;
            (
                pull.pgid,
                PgMsg::Pull {
                    conn: conn.clone(),
                    msg,
                    pull,
                },
            )
        }
        msg_type::PG_BACKFILL => {
            let bf: PgBackfill = decode_shared("pg backfill", &msg.payload).map_err(de)?;
            let tx = ensure_pg(shared, bf.pgid).map_err(|e| e.to_string())?;
            let _ = tx
                .send(PgMsg::Backfill {
                    conn: conn.clone(),
                    bf,
                    blocks: msg.blocks,
                })
                .await;
            return Ok(());
        }
        msg_type::PG_BACKFILL_ACK => {
            let ack: PgBackfillAck = decode("pg backfill ack", &msg.payload).map_err(de)?;
            (ack.pgid, PgMsg::BackfillAck(ack))
        }
        msg_type::PG_REMOVE => {
            let r: PgRemove = decode("pg remove", &msg.payload).map_err(de)?;
            (r.pgid, PgMsg::Remove(r))
        }
        msg_type::PG_STRAY => {
            let r: PgStray = decode("pg stray", &msg.payload).map_err(de)?;
            (r.pgid, PgMsg::Stray(r))
        }
        msg_type::PG_PUSH => {
            let push: PgPush = decode_shared("pg push", &msg.payload).map_err(de)?;
            let tx = ensure_pg(shared, push.pgid).map_err(|e| e.to_string())?;
            let _ = tx
                .send(PgMsg::Push {
                    conn: conn.clone(),
                    msg,
                    push,
                })
                .await;
            return Ok(());
        }
        other => return Err(format!("unknown message type {other:#x}")),
    };
    match pg_sender(shared, pgid) {
        Some(tx) => {
            let _ = tx.send(pm).await;
            Ok(())
        }
        None => {
            if let PgMsg::Pull { conn, msg, .. } = pm {
                let r =
                    PullReply::Refused(format!("osd.{} has no copy of pg {pgid}", shared.cfg.id));
                let _ = conn.reply(&msg, msg_type::PG_PULL_REPLY, encode(&r)).await;
            }
            Ok(())
        }
    }
}

/// Serves a read-only request of a replicated PG from the store (a lone
/// head read through the data cache). `list_version` is the version a
/// listing reports. Also returns the crc32c of a lone head read's data
/// when it is known without another pass (see [`reply_parts`]).
fn serve_read(
    shared: &Shared,
    pgid: PgId,
    coll: CollectionId,
    req: &OpRequest,
    list_version: Version,
    epoch: Epoch,
) -> (OpReply, Option<u32>) {
    let store = &shared.store;
    let mut data_crc = None;
    let (res, version) = match req.ops.as_slice() {
        [SubOp::ListObjects { after, limit }] => {
            match exec::list_client_objects(store, coll, after.as_ref(), *limit) {
                Ok((objs, next)) => (
                    Ok(vec![SubOpOutput::Objects {
                        objects: objs.into_iter().map(|(_, n)| n).collect(),
                        next,
                    }]),
                    list_version,
                ),
                Err(e) => (Err(e), Version::default()),
            }
        }
        [SubOp::Read { offset, len }] if req.snap == cairn_ops::SNAP_HEAD => {
            let read = if shared.cache.enabled() && !small_range(*len) {
                read_through_cache(shared, pgid, coll, &req.oid, *offset, *len)
            } else {
                // The cheapest path (one store lookup): small ranges are
                // page-cached by the store, a cache lookup would cost
                // more than it saves.
                exec::read_head_range(store, coll, &req.oid, *offset, *len)
                    .map(|r| (r.data, r.version, Some(r.data_crc)))
            };
            match read {
                Ok((data, v, crc)) => {
                    data_crc = crc;
                    (Ok(vec![SubOpOutput::Data(data)]), v)
                }
                Err(e) => (Err(e), Version::default()),
            }
        }
        ops => match exec::execute_read(store, coll, &req.oid, ops, req.snap) {
            Ok((out, v)) => (Ok(out), v),
            Err(e) => (Err(e), Version::default()),
        },
    };
    let reply = OpReply {
        reqid: req.reqid.clone(),
        status: OpStatus::Done(res),
        version,
        epoch,
    };
    (reply, data_crc)
}

/// The verified crcs of `data`'s leading 4 KiB blocks, when `data` is
/// a block-aligned slice of a message whose blocks the messenger checked.
fn known_block_crcs(blocks: Option<&BlockCrcs>, data: &Bytes) -> Option<Arc<[u32]>> {
    blocks?.of(data).map(Arc::from)
}

/// A source of the verified crcs of written buffers' leading 4 KiB blocks
/// (see `exec::apply_mutations_known`).
type KnownBlocks<'a> = &'a dyn Fn(&Bytes) -> Option<Arc<[u32]>>;

/// One encoded sub-op (a `RepOp`) as the segments the messenger sends
/// ([`encode_parts`]: the write's data shared, not copied), with the crcs
/// of the data segments that are known from the verified receive, so its
/// frame crc is combined from them instead of read from the bytes again.
#[derive(Clone)]
pub(crate) struct SubOpBytes {
    pub parts: Vec<Bytes>,
    pub known: Vec<KnownCrc>,
}

impl SubOpBytes {
    /// `blocks`: the verified block crcs of written buffers, if known.
    fn encode(rep: &RepOp, blocks: Option<KnownBlocks<'_>>) -> SubOpBytes {
        let parts = encode_parts(rep);
        let mut known = Vec::new();
        if let Some(blocks) = blocks {
            for m in &rep.mutations {
                let Mutation::Write { data, .. } = m else {
                    continue;
                };
                let seg = parts
                    .iter()
                    .position(|p| p.as_ptr() == data.as_ptr() && p.len() == data.len());
                let (Some(segment), Some(crcs)) = (seg, blocks(data)) else {
                    continue;
                };
                if let Some(crc) = cairn_msg::crc_from_blocks(&crcs, data) {
                    known.push(KnownCrc { segment, crc });
                }
            }
        }
        SubOpBytes { parts, known }
    }
}

/// `reply` encoded as segments, and the crc32c of its data segment when
/// `data_crc` (the crc of a lone data output) is known: the messenger then
/// combines the frame's crc from it instead of reading the data again
/// (crc mode; the client still checks every byte against that crc, so a
/// bit flipped after the store verified it is caught there).
fn reply_parts(reply: &OpReply, data_crc: Option<u32>) -> (Vec<Bytes>, Vec<KnownCrc>) {
    let parts = encode_parts(reply);
    let mut known = Vec::new();
    if let (Some(crc), OpStatus::Done(Ok(outs))) = (data_crc, &reply.status) {
        if let [SubOpOutput::Data(d)] = outs.as_slice() {
            // A big data field is its own segment, shared (same memory).
            if let Some(i) = parts
                .iter()
                .position(|p| !d.is_empty() && p.as_ptr() == d.as_ptr() && p.len() == d.len())
            {
                known.push(KnownCrc { segment: i, crc });
            }
        }
    }
    (parts, known)
}

/// A head range read served from the data cache when it holds the object
/// at the version the store holds now; else read from the store, and the
/// object offered to the cache when the read covered all of it.
fn read_through_cache(
    shared: &Shared,
    pgid: PgId,
    coll: CollectionId,
    oid: &cairn_ops::ObjectName,
    offset: u64,
    len: u64,
) -> Result<(Bytes, Version, Option<u32>), OpError> {
    let store = &shared.store;
    // The version check costs a store lookup: only for objects cached.
    let cached = shared.cache.probe(pgid, oid);
    if let Some(v) = cached
        .then(|| exec::head_version(store, coll, oid))
        .transpose()?
        .flatten()
    {
        if let Some((whole, crc)) = shared.cache.get(pgid, oid, v) {
            let size = whole.len() as u64;
            let start = offset.min(size);
            let end = if len == 0 {
                size
            } else {
                offset.saturating_add(len).min(size)
            };
            let all = start == 0 && end == size;
            let data = whole.slice(start as usize..end.max(start) as usize);
            return Ok((data, v, all.then_some(crc)));
        }
    }
    let r = exec::read_head_range(store, coll, oid, offset, len)?;
    if offset == 0 && r.data.len() as u64 == r.size && r.size >= BLOCKING_SUBMIT_BYTES {
        shared
            .cache
            .offer(pgid, oid, r.version, &r.data, r.data_crc);
    }
    Ok((r.data, r.version, Some(r.data_crc)))
}

/// Whether a read of `len` bytes (0: a whole object, size unknown) is
/// small: under 64 KiB the store reads through the page cache, which
/// already keeps such data, so the data cache neither serves nor keeps it
/// (its lookup, LRU update and crc would cost more than the read).
fn small_range(len: u64) -> bool {
    len != 0 && len < BLOCKING_SUBMIT_BYTES
}

async fn client_op(shared: &Arc<Shared>, conn: &Connection, msg: Message) -> Result<(), String> {
    let req: OpRequest = decode_shared("op request", &msg.payload).map_err(|e| e.to_string())?;
    // The reply needs only the message id: drop the encoded request now so
    // an op's data is not held twice while it waits and runs.
    let msg = Message {
        payload: Bytes::new(),
        ..msg
    };
    let answer = |status: OpStatus, epoch: Epoch| OpReply {
        reqid: req.reqid.clone(),
        status,
        version: Version::default(),
        epoch,
    };
    let msg_ref = &msg;
    let send = |r: OpReply| async move {
        let _ = conn
            .reply_parts(msg_ref, msg_type::OP_REPLY, encode_parts(&r))
            .await;
    };
    // A request id names its sender: it must be the entity the connection
    // authenticated as (OSDs excepted: they relay on their own behalf), or
    // a client could write under another's name — slipping past that name's
    // blocklist entry or colliding with its request ids in dedup.
    if conn.peer().kind != cairn_types::EntityKind::Osd && &req.reqid.client != conn.peer() {
        let why = format!(
            "the request names {} but the connection is authenticated as {}",
            req.reqid.client,
            conn.peer()
        );
        let epoch = shared.map_rx.borrow().epoch;
        send(answer(OpStatus::Done(Err(OpError::Access(why))), epoch)).await;
        return Ok(());
    }
    let mut map = shared.map_rx.borrow().clone();
    if req.epoch > map.epoch {
        let mut rx = shared.map_rx.clone();
        let _ =
            tokio::time::timeout(shared.cfg.map_wait, rx.wait_for(|m| m.epoch >= req.epoch)).await;
        map = shared.map_rx.borrow().clone();
        if req.epoch > map.epoch {
            send(answer(
                OpStatus::MapTooNew {
                    osd_epoch: map.epoch,
                },
                map.epoch,
            ))
            .await;
            return Ok(());
        }
    }
    if map.flags.contains(&cairn_map::OsdFlag::Pause) {
        // `pause`: client ops wait (bounded) for the flag to go.
        let wait = map
            .config_value(
                &format!("osd.{}", shared.cfg.id),
                "osd_client_op_pause_wait",
            )
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(30);
        let mut rx = shared.map_rx.clone();
        let unpaused = rx.wait_for(|m| !m.flags.contains(&cairn_map::OsdFlag::Pause));
        let _ = tokio::time::timeout(Duration::from_secs(wait), unpaused).await;
        map = shared.map_rx.borrow().clone();
        if map.flags.contains(&cairn_map::OsdFlag::Pause) {
            let e = OpError::Io(format!(
                "the cluster is paused (pause flag set); the op waited {wait} s (osd_client_op_pause_wait); 'cairn osd unset pause' resumes I/O"
            ));
            send(answer(OpStatus::Done(Err(e)), map.epoch)).await;
            return Ok(());
        }
    }
    let Some(pool) = map.pools.get(&req.pgid.pool.0) else {
        let e = OpError::Invalid(format!("pool {} does not exist", req.pgid.pool));
        send(answer(OpStatus::Done(Err(e)), map.epoch)).await;
        return Ok(());
    };
    if let Err(why) = check_op_caps(
        &map,
        conn.peer(),
        conn.peer_caps(),
        &pool.name,
        req.is_write(),
    ) {
        send(answer(OpStatus::Done(Err(OpError::Access(why))), map.epoch)).await;
        return Ok(());
    }
    let Some(tx) = pg_sender(shared, req.pgid) else {
        send(answer(
            OpStatus::NotPrimary {
                osd_epoch: map.epoch,
            },
            map.epoch,
        ))
        .await;
        return Ok(());
    };
    let units = (inflight_bytes(&req) / THROTTLE_UNIT_BYTES)
        .clamp(1, u64::from(shared.throttle_units)) as u32;
    let t0 = std::time::Instant::now();
    let permit = shared.throttle.clone().acquire_many_owned(units).await.ok();
    let throttled = t0.elapsed();
    let pgid = req.pgid;
    let _ = tx
        .send(PgMsg::ClientOp {
            conn: conn.clone(),
            msg,
            req,
            permit,
        })
        .await;
    if t0.elapsed() >= SLOW_OP {
        tracing::warn!(
            "osd.{}: a client op for pg {pgid} from {} waited {:.1} s for the in-flight byte throttle and {:.1} s for the PG's queue",
            shared.cfg.id,
            conn.peer_label(),
            throttled.as_secs_f64(),
            (t0.elapsed() - throttled).as_secs_f64()
        );
    }
    Ok(())
}

/// The answer to an op of a blocklisted client instance, if `req` is one.
///
/// Judged in the PG actor, where ops are ordered, against the newest map
/// the OSD has (not the PG's): an op of a new lock holder carries an epoch
/// at least the blocklisting one and makes the PG take that map before it
/// is handled, and maps only grow, so every op of the fenced instance the
/// PG handles after it is refused. Its ops handled before were ordered
/// before the new holder's (the PG's queues keep arrival order per object).
fn blocklist_refusal(shared: &Shared, req: &OpRequest) -> Option<OpReply> {
    let map = shared.map_rx.borrow();
    let entry = map.blocklisted(&req.reqid.client, req.reqid.incarnation)?;
    Some(OpReply {
        reqid: req.reqid.clone(),
        status: OpStatus::Done(Err(OpError::Blocklisted {
            client: cairn_map::ClientInstance {
                name: req.reqid.client.clone(),
                nonce: req.reqid.incarnation,
            }
            .to_string(),
            epoch: entry.added.0,
        })),
        version: Version::default(),
        epoch: map.epoch,
    })
}

impl Shared {
    /// A live connection to peer `osd` and its generation, without ever
    /// waiting: when there is none, a bounded connect starts in the
    /// background (one per peer; a failed one is retried after
    /// [`PEER_RETRY_AFTER`]) and the caller gets "not connected yet" and
    /// tries again on its next tick or map. For PG actors.
    pub(crate) fn peer_now(self: &Arc<Self>, osd: i32) -> Result<(u64, Connection), String> {
        let mut peers = lock(&self.peers);
        let slot = peers.entry(osd).or_insert(PeerSlot::Idle);
        match slot {
            PeerSlot::Up(gen, c) if !c.is_closed() => return Ok((*gen, c.clone())),
            PeerSlot::Connecting => {
                return Err(format!("osd.{osd}: not connected yet (connecting)"))
            }
            PeerSlot::Failed { at, why } if at.elapsed() < PEER_RETRY_AFTER => {
                return Err(format!("osd.{osd}: not connected ({why})"))
            }
            _ => {}
        }
        *slot = PeerSlot::Connecting;
        drop(peers);
        let s = self.clone();
        self.tasks.spawn(async move {
            let r = s.connect_peer(osd).await;
            let mut peers = lock(&s.peers);
            match r {
                Ok(conn) => {
                    let gen = s.peer_gen.fetch_add(1, Ordering::Relaxed);
                    s.spawn_conn(conn.clone());
                    peers.insert(osd, PeerSlot::Up(gen, conn));
                }
                Err(why) => {
                    peers.insert(
                        osd,
                        PeerSlot::Failed {
                            at: std::time::Instant::now(),
                            why,
                        },
                    );
                }
            }
            drop(peers);
            s.peer_events.send_modify(|n| *n += 1);
        });
        Err(format!("osd.{osd}: not connected yet (connecting)"))
    }

    /// A live connection to peer `osd` and its generation, waiting for a
    /// connect (started by [`Self::peer_now`], shared by every caller) at
    /// most the connect and handshake timeouts. For tasks off the PG actors.
    pub(crate) async fn peer(self: &Arc<Self>, osd: i32) -> Result<(u64, Connection), String> {
        let mut events = self.peer_events.subscribe();
        let deadline = tokio::time::Instant::now()
            + self.cfg.msg.connect_timeout
            + self.cfg.msg.handshake_timeout
            + PEER_RETRY_AFTER;
        loop {
            events.borrow_and_update();
            let e = match self.peer_now(osd) {
                Ok(x) => return Ok(x),
                Err(e) => e,
            };
            match lock(&self.peers).get(&osd) {
                Some(PeerSlot::Connecting) => {}
                Some(PeerSlot::Up(..)) => continue,
                // Failed (in backoff): that is the answer.
                _ => return Err(e),
            }
            if tokio::time::timeout_at(deadline, events.changed())
                .await
                .is_err()
            {
                return Err(format!("osd.{osd}: connect still under way"));
            }
        }
    }

    /// One connect to peer `osd` at its address in the current map.
    async fn connect_peer(&self, osd: i32) -> Result<Connection, String> {
        let map = self.map_rx.borrow().clone();
        let info = map
            .osds
            .get(&osd)
            .ok_or_else(|| format!("osd.{osd} is not in the map"))?;
        let addr: SocketAddr = info
            .addrs
            .first()
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| format!("osd.{osd} has no usable address in the map"))?;
        let creds = Credentials::Key {
            name: EntityName::osd(self.cfg.id),
            secret: self.cfg.secret.clone(),
        };
        connect(addr, &creds, Some(&EntityName::osd(osd)), &self.cfg.msg)
            .await
            .map_err(|e| e.to_string())
    }

    /// Spawns a task that ends when the OSD stops.
    pub(crate) fn tasks_spawn<F>(&self, fut: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(fut);
    }

    /// Adds `counts` to what this OSD recovered in `pgid` as primary.
    pub(crate) fn add_recovered(&self, pgid: PgId, counts: PgRecoveryCounts) {
        let mut m = lock(&self.recovered);
        let c = m.entry(pgid).or_default();
        c.log_objects += counts.log_objects;
        c.backfill_objects += counts.backfill_objects;
    }

    /// What `add_recovered` counted for `pgid` since this OSD started.
    pub(crate) fn recovered(&self, pgid: PgId) -> PgRecoveryCounts {
        lock(&self.recovered)
            .get(&pgid)
            .copied()
            .unwrap_or_default()
    }

    /// Every PG's published stats, by PG.
    pub(crate) fn published_map(&self) -> Vec<(PgId, Published)> {
        lock(&self.stats)
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect()
    }

    pub(crate) fn spawn_conn(self: &Arc<Self>, conn: Connection) {
        let s = self.clone();
        self.tasks.spawn(serve_conn(s, conn));
    }
}

/// One PG's actor: owns the [`Pg`] and performs its actions.
struct PgActor {
    shared: Arc<Shared>,
    pg: Pg,
    pgid: PgId,
    coll: CollectionId,
    rx: mpsc::Receiver<PgMsg>,
    tx: mpsc::Sender<PgMsg>,
    pending: HashMap<Token, PendingOp>,
    /// When each pending client op arrived, and whether it was already
    /// reported as slow.
    pending_since: HashMap<Token, (std::time::Instant, bool)>,
    /// Replication sub-ops in flight: seq -> replica not yet acked -> its
    /// encoded RepOp (EC shards each get their own chunk).
    /// In-flight replication sub-ops by version, per replica, encoded as
    /// segments ([`encode_parts`]: the write's data is shared, not copied).
    repops: BTreeMap<u64, BTreeMap<i32, SubOpBytes>>,
    /// Peer connection generation each replica was last sent to on.
    sent_gen: HashMap<i32, u64>,
    /// RepOps from a newer epoch than our map, held until the map arrives.
    held: Vec<(Connection, RepOp, Option<Arc<BlockCrcs>>)>,
    /// The activation job running for this interval, if any (aborted when
    /// the interval changes, so a stale job never pushes old state).
    peering: Option<(Epoch, AbortHandle)>,
    /// Code and shard layout when the pool is erasure-coded.
    ec: Option<EcPg>,
    /// EC: rollback stashes of log entries up to here are dropped.
    ec_rolled_forward: Version,
    scrub: PgScrubState,
    /// What the running activation found (backfill targets, strays).
    activated: Arc<Mutex<Option<peering::Activated>>>,
    /// The background backfill of this interval (acting primary).
    backfill: Option<crate::backfill::BackfillRun>,
    /// OSDs with copies outside the acting and up sets, removed once clean.
    strays: Vec<i32>,
    /// Stray side: when this copy last told the primary it exists.
    stray_told_at: Option<std::time::Instant>,
    /// Replicated primary with no backfill to run: the request to clear a
    /// pg_temp that every up member already serves in.
    pg_temp_clear: crate::backfill_target::PgTempClear,
    /// (objects, bytes) copied by finished backfill runs of this PG.
    recovered: (u64, u64),
    /// This OSD's own write commits in flight, oldest first.
    local_commits: std::collections::VecDeque<LocalCommit>,
    /// Set while a member of the PG (acting or up) is marked full in the
    /// map: why writes that add data are refused (`ClusterMap::full_refusal`).
    full_refusal: Option<String>,
    /// What the stats this actor last published were built from (None:
    /// not published yet), and the log position they carry.
    published: Option<(StatKey, LogPosition)>,
    /// Store objects and bytes this actor's replicated client writes added
    /// to the collection (see `LogPosition::written`).
    written: exec::Footprint,
}

/// A write transaction of this PG submitted to the local store and not yet
/// durable: the primary's own part of a client write, or a replica's part
/// of a primary's sub-op (with the acknowledgement to send once durable).
/// The store completes a collection's commits in submission order, so the actor waits on
/// the oldest one itself: no task per write and no extra hop between the
/// store's completion and the PG (or the replica's ack).
struct LocalCommit {
    version: Version,
    interval_since: Epoch,
    handle: Result<cairn_store::CommitHandle, String>,
    /// Replica: where to acknowledge the sub-op, and the ack to send.
    ack: Option<(Connection, RepOpAck)>,
}

/// Resolves when the oldest of `q` is durable (or failed), removing it;
/// pending while `q` is empty.
fn next_local_commit(
    q: &mut std::collections::VecDeque<LocalCommit>,
) -> impl std::future::Future<Output = (LocalCommit, Result<(), String>)> + '_ {
    use std::task::Poll;
    std::future::poll_fn(move |cx| {
        let Some(front) = q.front_mut() else {
            return Poll::Pending;
        };
        let r = match &mut front.handle {
            Ok(h) => match std::future::Future::poll(std::pin::Pin::new(h), cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(r) => r.map_err(|e| e.to_string()),
            },
            Err(e) => Err(e.clone()),
        };
        match q.pop_front() {
            Some(c) => Poll::Ready((c, r)),
            None => Poll::Pending,
        }
    })
}

/// The actor's scrub bookkeeping (the logic is `crate::scrub`'s).
struct PgScrubState {
    stamps: crate::scrub::ScrubStamps,
    /// The running job: what it does and how to stop it.
    running: Option<(crate::scrub::ScrubRequest, AbortHandle)>,
    /// An operator order waiting for a slot.
    pending: Option<crate::scrub::ScrubRequest>,
    /// Spreads periodic scrubs of this OSD's PGs (0..1).
    jitter: f64,
    /// When the job's current chunk started holding writes back.
    blocked_at: Option<std::time::Instant>,
    /// No new job before this (after a failed one).
    retry_at: Option<std::time::Instant>,
}

impl PgActor {
    async fn run(mut self) {
        let mut tick = tokio::time::interval(self.shared.cfg.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                m = self.rx.recv() => match m {
                    Some(PgMsg::Remove(r)) => {
                        if self.on_remove(r).await {
                            return;
                        }
                    }
                    Some(m) => self.on_msg(m).await,
                    None => return,
                },
                (c, r) = next_local_commit(&mut self.local_commits),
                    if !self.local_commits.is_empty() => self.on_local_commit(c, r).await,
                _ = tick.tick() => self.on_tick().await,
            }
            self.publish_stats();
        }
    }

    fn me(&self) -> i32 {
        self.shared.cfg.id
    }

    async fn on_msg(&mut self, m: PgMsg) {
        match m {
            PgMsg::Map(map) => self.on_map(map).await,
            PgMsg::ClientOp {
                conn,
                msg,
                req,
                permit,
            } => {
                // The dispatcher already waited for the client's epoch; the
                // PG takes that map before the op (a pool change such as
                // allow_ec_overwrites must not be judged on an older map).
                if req.epoch > self.pg.epoch() {
                    let map = self.shared.map_rx.borrow().clone();
                    self.on_map(map).await;
                }
                let token = self.shared.next_token.fetch_add(1, Ordering::Relaxed);
                self.pending.insert(token, (conn, msg, permit));
                self.pending_since
                    .insert(token, (std::time::Instant::now(), false));
                if let Some(refusal) = blocklist_refusal(&self.shared, &req) {
                    self.reply(token, refusal);
                    return;
                }
                let acts = self.pg.handle(PgEvent::ClientOp { token, req });
                self.run_actions(acts).await;
            }
            PgMsg::RepOp { conn, rep, blocks } => self.on_repop(conn, rep, blocks).await,
            PgMsg::ReadDone { token, failed } => {
                if let Some(f) = failed {
                    let (mut reply, pending) = *f;
                    self.repair_after_read_error(&mut reply);
                    if let Some(p) = pending {
                        self.pending.insert(token, p);
                    }
                    self.reply(token, reply);
                }
                let acts = self.pg.handle(PgEvent::ReadDone { token });
                self.run_actions(acts).await;
            }
            PgMsg::RepAck(ack) => {
                if ack.interval_since != self.pg.info.same_interval_since {
                    return;
                }
                if let Some(theirs) = ack.newer_interval {
                    tracing::info!(
                        "pg {}: osd.{} is in an interval from epoch {} (ours began in {}): starting a new one",
                        self.pgid,
                        ack.from,
                        theirs.0,
                        ack.interval_since.0
                    );
                    let acts = self.pg.member_interval_newer(theirs);
                    if self.pg.info.same_interval_since != ack.interval_since {
                        self.repops.clear();
                    }
                    self.run_actions(acts).await;
                    return;
                }
                if let Err(e) = &ack.result {
                    tracing::warn!(
                        "pg {}: osd.{} failed to apply {}: {e}",
                        self.pgid,
                        ack.from,
                        ack.version
                    );
                    let seq = ack.version.seq;
                    let acting = self
                        .pg
                        .placement()
                        .is_some_and(|p| p.acting.contains(&ack.from));
                    if !acting
                        && self
                            .backfill
                            .as_mut()
                            .is_some_and(|run| run.write_failed(ack.from, seq, e))
                    {
                        // A backfill target, not an acting member: it leaves
                        // the PG's writes (they complete without it) and
                        // resumes its backfill later; the client op and the
                        // PG's interval are unaffected.
                        for w in self.repops.values_mut() {
                            w.remove(&ack.from);
                        }
                        self.repops.retain(|_, w| !w.is_empty());
                        self.backfill_step().await;
                        return;
                    }
                    let error = commit_error(ack.from, e);
                    self.on_commit_failed(seq, ack.from, error).await;
                    return;
                }
                let seq = ack.version.seq;
                if let Some(run) = self.backfill.as_mut() {
                    run.write_acked(ack.from, seq);
                }
                if let Some(w) = self.repops.get_mut(&seq) {
                    w.remove(&ack.from);
                    if w.is_empty() {
                        self.repops.remove(&seq);
                    }
                }
                let acts = self.pg.handle(PgEvent::Committed {
                    seq,
                    from: ack.from,
                    interval_since: ack.interval_since,
                });
                self.run_actions(acts).await;
            }
            PgMsg::Committed {
                seq,
                from,
                interval_since,
            } => {
                let acts = self.pg.handle(PgEvent::Committed {
                    seq,
                    from,
                    interval_since,
                });
                self.run_actions(acts).await;
            }
            PgMsg::PeeringDone {
                interval_since,
                result,
            } => {
                if self
                    .peering
                    .as_ref()
                    .is_some_and(|(e, _)| *e == interval_since)
                {
                    self.peering = None;
                }
                if let Err(e) = &result {
                    tracing::info!("pg {}: not activating: {e}", self.pgid);
                }
                let found = self
                    .activated
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
                let current = interval_since == self.pg.info.same_interval_since;
                if let (Ok((info, log)), Some((targets, strays)), true) = (&result, found, current)
                {
                    self.strays = strays;
                    if !targets.is_empty() {
                        // Before the first op is admitted: the targets'
                        // start messages must precede every sub-op.
                        let cx = crate::backfill::StepCtx {
                            shared: &self.shared,
                            pg: &mut self.pg,
                            pgid: self.pgid,
                            coll: self.coll,
                            ec: self.ec.as_ref(),
                        };
                        let run = crate::backfill::BackfillRun::start(
                            cx,
                            interval_since,
                            targets,
                            info,
                            log,
                        )
                        .await;
                        self.backfill = Some(run);
                    }
                }
                let acts = self.pg.handle(PgEvent::PeeringDone {
                    interval_since,
                    result,
                });
                self.run_actions(acts).await;
                self.after_activation().await;
            }
            PgMsg::EcRollback { conn, msg, rb } => self.on_ec_rollback(conn, msg, rb).await,
            PgMsg::Scrub(c) => self.on_scrub_ctl(c).await,
            PgMsg::ScrubDone(o) => self.on_scrub_done(*o),
            PgMsg::Backfill { conn, bf, blocks } => self.on_backfill(conn, bf, blocks).await,
            PgMsg::BackfillAck(ack) => {
                let Some(run) = self.backfill.as_mut() else {
                    return;
                };
                if ack.interval_since != run.interval_since {
                    return;
                }
                run.on_ack(&self.shared, self.pgid, ack.from, ack.seq, ack.result);
                self.backfill_step().await;
            }
            PgMsg::Remove(_) => {}
            PgMsg::Stray(n) => self.on_stray(n),
            PgMsg::CommitFailed {
                seq,
                from,
                interval_since,
                error,
            } => {
                if interval_since == self.pg.info.same_interval_since {
                    self.on_commit_failed(seq, from, error).await;
                }
            }
            PgMsg::Query { conn, msg } => {
                // Catch up with the querier's map first, so that sub-ops of
                // the interval it closed are refused from now on.
                if let Ok(q) = decode::<PgQuery>("pg query", &msg.payload) {
                    if q.epoch > self.pg.epoch() {
                        let mut rx = self.shared.map_rx.clone();
                        let wait = rx.wait_for(|m| m.epoch >= q.epoch);
                        let _ = tokio::time::timeout(self.shared.cfg.map_wait, wait).await;
                        let map = self.shared.map_rx.borrow().clone();
                        self.on_map(map).await;
                    }
                }
                // Answer with durable state only: replicated entries are
                // recorded in memory when submitted, before they commit.
                if let Err(e) = self.flush().await {
                    tracing::warn!(
                        "pg {}: flush before answering a query failed: {e}",
                        self.pgid
                    );
                    return;
                }
                let kept = match &self.ec {
                    Some(_) => {
                        let store = &self.shared.store;
                        blocking_store_call(|| {
                            crate::ec_peering::kept_copies(store, self.pgid, self.coll)
                        })
                    }
                    None => Ok(Vec::new()),
                };
                let kept = match kept {
                    Ok(k) => k,
                    // Answering without them could make the primary roll
                    // back a write they hold: no answer (it retries).
                    Err(e) => {
                        tracing::warn!(
                            "pg {}: reading the kept copies of other shard positions: {e}",
                            self.pgid
                        );
                        return;
                    }
                };
                let n = PgNotify {
                    pgid: self.pgid,
                    from: self.me(),
                    epoch: self.pg.epoch(),
                    info: Some(self.pg.info.clone()),
                    log: self.pg.log().cloned().collect(),
                    shard: self.coll.shard,
                    kept,
                };
                let _ = conn.reply(&msg, msg_type::PG_NOTIFY, encode(&n)).await;
            }
            PgMsg::Pull { conn, msg, pull } => {
                // A pull for another shard position reads the copy this
                // OSD keeps of it (EC: left by a shard move); nothing is
                // written to that copy, so there is nothing to flush.
                let coll = match pull.shard {
                    Some(s) if s != self.coll.shard => {
                        CollectionId::new(self.pgid.pool.0, self.pgid.seed, s)
                    }
                    _ => self.coll,
                };
                let ready = if coll == self.coll {
                    self.flush()
                        .await
                        .map_err(|e| format!("flushing the store: {e}"))
                } else {
                    match self.shared.store.collection_exists(&coll) {
                        Ok(true) => Ok(()),
                        Ok(false) => Err(format!(
                            "osd.{} keeps no copy of shard {} of pg {}",
                            self.me(),
                            coll.shard,
                            self.pgid
                        )),
                        Err(e) => Err(e.to_string()),
                    }
                };
                let r = match ready {
                    // Off the async workers: reading objects verifies
                    // their checksums.
                    Ok(()) => blocking_store_call(|| {
                        peering::serve_pull(
                            &self.shared.store,
                            coll,
                            &pull.what,
                            crate::peering_sm::pull_reply_bytes(
                                self.shared.cfg.recovery_batch_bytes,
                            ),
                        )
                    }),
                    Err(e) => PullReply::Refused(e),
                };
                let parts = encode_parts(&r);
                let known = match &r {
                    PullReply::Objects(objects) => peering::known_object_crcs(&parts, objects),
                    _ => Vec::new(),
                };
                let _ = conn
                    .reply_parts_known(&msg, msg_type::PG_PULL_REPLY, parts, known)
                    .await;
            }
            PgMsg::Push { conn, msg, push } => {
                self.pg.adopt_primary_interval_start(push.from, push.epoch);
                let built = if push.epoch < self.pg.info.same_interval_since {
                    Err(format!(
                        "push from osd.{} for epoch {} is older than this OSD's interval (since {})",
                        push.from, push.epoch.0, self.pg.info.same_interval_since.0
                    ))
                } else {
                    peering::push_txn(&self.shared.store, self.coll, &push, msg.blocks.as_ref())
                };
                let (pgid, me) = (self.pgid, self.me());
                let reply = move |result| PgPushReply {
                    pgid,
                    from: me,
                    result,
                };
                let committed = built
                    .and_then(|txn| submit_txn(&self.shared.store, txn).map_err(|e| e.to_string()));
                let h = match committed {
                    Ok(h) => h,
                    Err(e) => {
                        let r = reply(Err(e));
                        let _ = conn.reply(&msg, msg_type::PG_PUSH_REPLY, encode(&r)).await;
                        return;
                    }
                };
                if push.finish.is_none() {
                    // A data push: acknowledged once durable, while this
                    // actor takes the next one (the primary pipelines them;
                    // the store keeps their order).
                    self.shared.tasks.spawn(async move {
                        let r = reply(h.await.map_err(|e| e.to_string()));
                        let _ = conn.reply(&msg, msg_type::PG_PUSH_REPLY, encode(&r)).await;
                    });
                    return;
                }
                let result = h.await.map_err(|e| e.to_string());
                if result.is_ok() {
                    if let Some((info, log)) = push.finish {
                        self.pg.reload(info, log);
                        if self.ec.is_some() {
                            self.drop_other_shards_if_clean().await;
                        }
                    }
                }
                let r = reply(result);
                let _ = conn.reply(&msg, msg_type::PG_PUSH_REPLY, encode(&r)).await;
            }
        }
    }

    async fn on_map(&mut self, map: Arc<ClusterMap>) {
        let Some(pool) = map.pools.get(&self.pgid.pool.0) else {
            return;
        };
        let Ok(m) = map.pg_to_up(self.pgid.pool.0, self.pgid.seed) else {
            return;
        };
        let prev_primary_up_thru = self
            .pg
            .placement()
            .and_then(|p| p.primary)
            .and_then(|o| map.osds.get(&o))
            .map(|i| i.up_thru);
        self.ec = match EcPg::from_map(&map, self.pgid.pool.0, self.pgid.seed) {
            Ok(ec) => ec,
            Err(e) => {
                tracing::error!("pg {}: {e}", self.pgid);
                return;
            }
        };
        if let Some(ec) = self.ec.clone() {
            self.follow_shard_move(&ec).await;
        }
        // EC: positions kept in `shards`; `up`/`acting` list live members.
        let (up, acting, shards) = match &self.ec {
            Some(ec) => (ec.up_members(), ec.live_members(), ec.shards.clone()),
            None => (m.up, m.acting, Vec::new()),
        };
        let primary = m.acting_primary;
        let acting_up_from = acting
            .iter()
            .map(|o| map.osds.get(o).map(|i| i.up_from).unwrap_or_default())
            .collect();
        let p = Placement {
            epoch: map.epoch,
            up,
            acting,
            shards,
            primary,
            size: pool.size,
            min_size: pool.min_size,
            prev_primary_up_thru: if self.shared.mon.is_some() {
                prev_primary_up_thru
            } else {
                None
            },
            acting_up_from,
            last_recorded: map.pg_activations(self.pgid).pop(),
        };
        let members: Vec<i32> = p.acting.iter().chain(&p.up).copied().collect();
        self.full_refusal = map.full_refusal(self.pgid.pool.0, &members);
        let before = self.pg.info.same_interval_since;
        let acts = self.pg.handle(PgEvent::Map(p));
        if self.pg.info.same_interval_since != before {
            self.repops.clear();
            self.sent_gen.clear();
            self.end_backfill();
            self.strays.clear();
            if let Some((_, job)) = self.peering.take() {
                job.abort();
            }
            self.stop_scrub("the PG's interval changed");
        }
        self.note_scrub_order(&map);
        self.run_actions(acts).await;
        let held = std::mem::take(&mut self.held);
        for (conn, rep, blocks) in held {
            self.on_repop(conn, rep, blocks).await;
        }
    }

    /// Warns once about each client op waiting longer than `SLOW_OP`,
    /// saying where in the PG it waits.
    fn report_slow_ops(&mut self) {
        let now = std::time::Instant::now();
        let mut slow = 0;
        let mut oldest = Duration::ZERO;
        for (since, reported) in self.pending_since.values_mut() {
            let age = now.duration_since(*since);
            if age >= SLOW_OP && !*reported {
                *reported = true;
                slow += 1;
                oldest = oldest.max(age);
            }
        }
        if slow > 0 {
            tracing::warn!(
                "pg {}: {slow} client op(s) waiting for {:.1} s or more: {}",
                self.pgid,
                oldest.as_secs_f64(),
                self.pg.wait_summary()
            );
        }
    }

    async fn on_tick(&mut self) {
        self.report_slow_ops();
        // Resend in-flight sub-ops to replicas whose connection was replaced.
        let mut targets: BTreeSet<i32> = BTreeSet::new();
        for w in self.repops.values() {
            targets.extend(w.keys().copied());
        }
        for r in targets {
            if let Ok((gen, conn)) = self.shared.peer_now(r) {
                if self.sent_gen.get(&r) != Some(&gen) {
                    self.resend_all(r, gen, &conn, u64::MAX).await;
                }
            }
        }
        // Retry activation of a PG that could not reach everyone.
        if self.peering.is_none() {
            let acts = self.pg.retry_peering();
            self.run_actions(acts).await;
        }
        self.scrub_tick().await;
        self.backfill_step().await;
        self.tell_primary_if_stray();
        self.shared.copy_meter.tick(self.me());
    }

    /// Stray side: a copy outside the up and acting sets tells the acting
    /// primary it exists, every [`STRAY_NOTIFY_INTERVAL`], so that a primary
    /// that never heard of it (it was down when the PG re-peered) has it
    /// removed once clean. Never waits for a connection.
    fn tell_primary_if_stray(&mut self) {
        let me = self.me();
        let Some(p) = self.pg.placement() else {
            return;
        };
        let Some(primary) = p.primary else {
            return;
        };
        if p.up.contains(&me) || p.acting.contains(&me) || primary == me {
            self.stray_told_at = None;
            return;
        }
        if self
            .stray_told_at
            .is_some_and(|t| t.elapsed() < STRAY_NOTIFY_INTERVAL)
        {
            return;
        }
        self.stray_told_at = Some(std::time::Instant::now());
        let msg = PgStray {
            pgid: self.pgid,
            from: me,
            epoch: p.epoch,
        };
        match self.shared.peer_now(primary) {
            Ok((_, conn)) => {
                let pgid = self.pgid;
                self.shared.tasks.spawn(async move {
                    if let Err(e) = conn.send(msg_type::PG_STRAY, encode(&msg)).await {
                        tracing::debug!(
                            "pg {pgid}: telling osd.{primary} about this stray copy: {e}"
                        );
                    }
                });
            }
            Err(e) => {
                tracing::debug!("pg {}: stray copy, primary osd.{primary}: {e}", self.pgid);
                // Try again on the next tick once connected.
                self.stray_told_at = None;
            }
        }
    }

    /// Primary side: an OSD holds a copy outside the acting and up sets;
    /// once this PG is active+clean (and not re-peering) it is told to
    /// delete it. Before that it will tell again.
    fn on_stray(&mut self, n: PgStray) {
        let Some(p) = self.pg.placement() else {
            return;
        };
        let outside = !p.up.contains(&n.from) && !p.acting.contains(&n.from);
        let clean = self.pg.role == Role::Primary
            && self.pg.state.active
            && self.pg.state.clean
            && self.peering.is_none();
        if !outside || !clean || n.from == self.me() {
            return;
        }
        let (shared, pgid, epoch) = (self.shared.clone(), self.pgid, self.pg.epoch());
        self.shared.tasks.spawn(async move {
            crate::backfill::remove_strays(&shared, pgid, epoch, &[n.from]).await;
        });
    }

    async fn resend_all(&mut self, r: i32, gen: u64, conn: &Connection, below: u64) {
        self.sent_gen.insert(r, gen);
        let msgs: Vec<SubOpBytes> = self
            .repops
            .range(..below)
            .filter_map(|(_, w)| w.get(&r).cloned())
            .collect();
        for b in msgs {
            if conn
                .send_parts_known(msg_type::REPOP, b.parts, b.known)
                .await
                .is_err()
            {
                return;
            }
        }
    }

    async fn send_repop(&mut self, r: i32, seq: u64, bytes: SubOpBytes) {
        let (gen, conn) = match self.shared.peer_now(r) {
            Ok(x) => x,
            Err(e) => {
                // Sent with the others once connected (on a tick).
                tracing::debug!("pg {}: cannot reach osd.{r} for {seq} yet: {e}", self.pgid);
                return;
            }
        };
        if self.sent_gen.get(&r) != Some(&gen) {
            self.resend_all(r, gen, &conn, seq).await;
        }
        if let Err(e) = conn
            .send_parts_known(msg_type::REPOP, bytes.parts, bytes.known)
            .await
        {
            tracing::warn!("pg {}: sending {seq} to osd.{r}: {e}", self.pgid);
        }
    }

    async fn run_actions(&mut self, acts: Vec<PgAction>) {
        let mut queue: std::collections::VecDeque<PgAction> = acts.into();
        while let Some(a) = queue.pop_front() {
            match a {
                PgAction::Reply { token, reply } => self.reply(token, reply),
                PgAction::Read { token, req } => match self.ec_target() {
                    Some(target) => {
                        // EC reads gather chunks from other shards: off the actor.
                        self.pending_since.remove(&token);
                        let pending = self.pending.remove(&token);
                        let tx = self.tx.clone();
                        self.shared.tasks.spawn(async move {
                            let reply = target.client_read(&req).await;
                            let _ = tx
                                .send(PgMsg::ReadDone {
                                    token,
                                    failed: None,
                                })
                                .await;
                            if let Some((conn, msg, permit)) = pending {
                                let _ = conn
                                    .reply_parts(&msg, msg_type::OP_REPLY, encode_parts(&reply))
                                    .await;
                                drop(permit);
                            }
                        });
                    }
                    None if reads_much(&req) => self.read_off_actor(token, req),
                    None => {
                        // Small reads (metadata, page-cached data) cost less
                        // than a hand-off to another thread.
                        let (mut reply, crc) = self.read(&req);
                        self.repair_after_read_error(&mut reply);
                        self.reply_known(token, reply, crc);
                        queue.extend(self.pg.handle(PgEvent::ReadDone { token }));
                    }
                },
                PgAction::Write {
                    token,
                    req,
                    version,
                    trim_to,
                    replicas,
                    log_only,
                } => {
                    self.shared.cache.invalidate(self.pgid, &req.oid);
                    let blocks = self
                        .pending
                        .get(&token)
                        .and_then(|(_, msg, _)| msg.blocks.clone());
                    let more = self
                        .write(req, blocks, version, trim_to, replicas, log_only)
                        .await;
                    queue.extend(more);
                }
                PgAction::Peer {
                    interval_since,
                    epoch,
                    acting,
                    probe,
                    past,
                } => {
                    // Recovery may replace objects: their cached copies go
                    // (a hit also needs the version the store holds).
                    self.shared.cache.invalidate_pg(self.pgid);
                    self.start_peering(interval_since, epoch, acting, probe, past)
                }
                PgAction::PersistMeta => self.persist_meta(),
            }
        }
    }

    /// A client read failed on this primary's own copy (a checksum
    /// mismatch or a read EIO: `OpError::Io`). Queues a deep scrub with
    /// repair of the PG, which rewrites the bad copy from a good member
    /// (unless a repair is already queued or running, or an operator's
    /// order waits), and says so in the error. The read itself still fails:
    /// serving it from another member at once is not built yet.
    fn repair_after_read_error(&mut self, reply: &mut OpReply) {
        let OpStatus::Done(Err(OpError::Io(why))) = &reply.status else {
            return;
        };
        if self.pg.role != Role::Primary {
            return;
        }
        let repairing = self
            .scrub
            .pending
            .is_some_and(|r| r.repair || r.order.is_some())
            || self.scrub.running.as_ref().is_some_and(|(r, _)| r.repair);
        if !repairing {
            tracing::warn!(
                "pg {}: a client read failed on this OSD's copy ({why}); queueing a deep scrub with repair",
                self.pgid
            );
            self.scrub.pending = Some(crate::scrub::ScrubRequest {
                deep: true,
                repair: true,
                order: None,
            });
        }
        let why = format!(
            "{why}; osd.{} queued a deep scrub with repair of pg {}: retry the read shortly",
            self.me(),
            self.pgid
        );
        reply.status = OpStatus::Done(Err(OpError::Io(why)));
    }

    fn reply(&mut self, token: Token, reply: OpReply) {
        self.reply_known(token, reply, None)
    }

    /// [`Self::reply`] with the crc32c of a lone data output, if known.
    fn reply_known(&mut self, token: Token, reply: OpReply, data_crc: Option<u32>) {
        self.pending_since.remove(&token);
        if let Some((conn, msg, permit)) = self.pending.remove(&token) {
            let (parts, known) = reply_parts(&reply, data_crc);
            // Queued at once when the connection has room (the usual case);
            // a task waits for room otherwise, so the actor never does.
            match conn.try_reply_parts_known(&msg, msg_type::OP_REPLY, parts, known.clone()) {
                Ok(()) | Err(None) => drop(permit),
                Err(Some(parts)) => {
                    self.shared.tasks.spawn(async move {
                        let _ = conn
                            .reply_parts_known(&msg, msg_type::OP_REPLY, parts, known)
                            .await;
                        drop(permit);
                    });
                }
            }
        }
    }

    fn read(&self, req: &OpRequest) -> (OpReply, Option<u32>) {
        serve_read(
            &self.shared,
            self.pgid,
            self.coll,
            req,
            self.pg.info.last_update,
            self.pg.epoch(),
        )
    }

    /// Runs a big read on the blocking pool (at most
    /// `max_parallel_reads` at once), tells the PG when the store read is
    /// done, then replies. The PG starts no write to the object meanwhile.
    fn read_off_actor(&mut self, token: Token, req: OpRequest) {
        self.pending_since.remove(&token);
        let pending = self.pending.remove(&token);
        let (shared, tx) = (self.shared.clone(), self.tx.clone());
        let (pgid, coll) = (self.pgid, self.coll);
        let (last_update, epoch) = (self.pg.info.last_update, self.pg.epoch());
        self.shared.tasks.spawn(async move {
            let slot = shared.read_slots.clone().acquire_owned().await.ok();
            let s2 = shared.clone();
            let reqid = req.reqid.clone();
            let (reply, data_crc) = tokio::task::spawn_blocking(move || {
                serve_read(&s2, pgid, coll, &req, last_update, epoch)
            })
            .await
            .unwrap_or_else(|e| {
                let reply = OpReply {
                    reqid,
                    status: OpStatus::Done(Err(OpError::Io(format!(
                        "osd.{}: read task failed: {e}",
                        shared.cfg.id
                    )))),
                    version: Version::default(),
                    epoch,
                };
                (reply, None)
            });
            if matches!(&reply.status, OpStatus::Done(Err(OpError::Io(_)))) {
                // The actor queues a repair and answers.
                let failed = Some(Box::new((reply, pending)));
                let _ = tx.send(PgMsg::ReadDone { token, failed }).await;
                return;
            }
            // The PG learns that the store read is over while the reply
            // goes out (neither waits for the other: a busy PG queue does
            // not delay the client, a slow client does not hold writes).
            let done = tx.send(PgMsg::ReadDone {
                token,
                failed: None,
            });
            let answer = async move {
                if let Some((conn, msg, permit)) = pending {
                    let (parts, known) = reply_parts(&reply, data_crc);
                    let _ = conn
                        .reply_parts_known(&msg, msg_type::OP_REPLY, parts, known)
                        .await;
                    drop(permit);
                }
            };
            let _ = tokio::join!(done, answer);
            // The slot is held until the reply is on its way, so at most
            // `max_parallel_reads` read buffers live at once.
            drop(slot);
        });
    }

    /// `blocks`: the verified block crcs of the request's data, if its
    /// connection computed them (the store and the sub-ops reuse them).
    async fn write(
        &mut self,
        req: OpRequest,
        blocks: Option<Arc<BlockCrcs>>,
        version: Version,
        trim_to: Version,
        replicas: Vec<i32>,
        log_only: Vec<i32>,
    ) -> Vec<PgAction> {
        let store = self.shared.store.clone();
        let coll = self.coll;
        let ec = self.ec_target();
        // Mutations per acting member (EC: each shard its own chunk).
        let mut shard_muts: BTreeMap<i32, Vec<Mutation>> = BTreeMap::new();
        // EC: the chunks the encoder made, with their block crcs.
        let mut chunk_crcs: Vec<(Bytes, Arc<[u32]>)> = Vec::new();
        // A member is marked full in the map: a write adding data is
        // refused at once, logged like any failed op (so a late copy of
        // the request gets the same answer and never applies later).
        let refused = self
            .full_refusal
            .as_ref()
            .filter(|_| crate::pg::adds_data(&req))
            .map(|why| OpError::NoSpace(why.clone()));
        // Replicated: the object's footprint before the write.
        let mut before_footprint = None;
        let resolved = if let Some(e) = refused {
            Err(e)
        } else if let Some(t) = &ec {
            t.prepare_write(&req, blocks.as_deref())
                .await
                .map(|(plan, writes, crcs)| {
                    chunk_crcs = writes
                        .iter()
                        .zip(crcs)
                        .filter_map(|(w, c)| Some((w.data.clone(), c?)))
                        .collect();
                    // Acting shards, then backfill targets (the chunk of the
                    // position CRUSH gives them).
                    let placed = t.ec.shards.iter().enumerate().map(|(s, &o)| (s, o));
                    for (shard, osd) in placed.chain(t.ec.backfill_targets()) {
                        if osd != crate::ec_pool::SHARD_HOLE {
                            let m = ec_exec::shard_mutations(
                                &plan, &writes, &t.ec.code, shard, version,
                            );
                            shard_muts.insert(osd, m);
                        }
                    }
                    exec::Resolved {
                        prior: plan.prior,
                        mutations: shard_muts.get(&self.me()).cloned().unwrap_or_default(),
                        outputs: plan.outputs.clone(),
                        log_op: ec_exec::log_op(&plan),
                        // EC pools do not overlap writes of one object.
                        after: exec::ObjectProjection::default(),
                    }
                })
        } else {
            self.resolve_replicated(&req, version).map(|(r, before)| {
                before_footprint = Some(before);
                r
            })
        };
        // Refuse up front a write this OSD has no room for: the refusal is
        // logged and replicated like any failed op, so every member agrees.
        let resolved = resolved.and_then(|r| match self.full_for(&r.mutations) {
            Some(e) => Err(e),
            None => Ok(r),
        });
        let (muts, outcome, op, prior) = match resolved {
            Ok(r) => {
                if ec.is_none() {
                    if let Some(before) = before_footprint {
                        self.written = self.written.moved(before, r.after.footprint());
                    }
                    // What the next write of the object starts from while
                    // this one is not yet durable (a failed write changes
                    // nothing, so the state before it stays).
                    self.pg.set_projected(&req.oid, version.seq, r.after);
                }
                (r.mutations, Ok(r.outputs), r.log_op, r.prior)
            }
            Err(e) => {
                shard_muts.clear();
                (
                    Vec::new(),
                    Err(e.clone()),
                    LogOp::Error(e),
                    Version::default(),
                )
            }
        };
        let entry = LogEntry {
            version,
            prior_version: prior,
            reqid: Some(req.reqid.clone()),
            oid: req.oid.clone(),
            op,
        };
        let (old_front, old_tail) = (self.pg.log_front(), self.pg.info.log_tail);
        let trimmed: Vec<LogEntry> = if ec.is_some() {
            self.pg
                .log()
                .filter(|e| e.version <= trim_to)
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        let more = self.pg.handle(PgEvent::Submitted {
            seq: version.seq,
            entry: entry.clone(),
            outcome,
        });
        let roll_forward_to = self.pg.complete_through();
        let mut txn = Transaction::new();
        if self.copy_serves_reads() {
            txn.keep_data_cached();
        }
        if ec.is_some() {
            let done: Vec<LogEntry> = self.rolled_forward(roll_forward_to).cloned().collect();
            self.ec_rolled_forward = roll_forward_to;
            let r = ec_exec::drop_stashes(&store, coll, trimmed.iter().chain(&done), &mut txn)
                .and_then(|()| ec_exec::stash_before(&store, coll, &entry, &muts, &mut txn));
            if let Err(e) = r {
                tracing::error!("pg {}: keeping rollback data for {version}: {e}", self.pgid);
            }
        }
        // The verified crcs of the data written: the client's blocks as
        // received (replicated) or the chunks' from the encoder (EC).
        let known = |d: &Bytes| {
            known_block_crcs(blocks.as_deref(), d).or_else(|| {
                chunk_crcs
                    .iter()
                    .find(|(c, _)| c.as_ptr() == d.as_ptr() && c.len() == d.len())
                    .map(|(_, k)| k.clone())
            })
        };
        exec::apply_mutations_known(&mut txn, coll, &req.oid, &muts, &known);
        txn.log_append(coll, version.seq, encode(&entry));
        if let Some((from, upto)) = self.pg.trimmed_since(old_front, old_tail) {
            txn.log_trim_from(coll, from, upto);
        }
        txn.meta_set(coll, META_INFO, encode(&self.pg.info));
        let interval_since = self.pg.info.same_interval_since;
        let mut rep = RepOp {
            pgid: self.pgid,
            from: self.me(),
            epoch: self.pg.epoch(),
            interval_since,
            entry,
            mutations: muts,
            trim_to,
            hash: req.oid.hash(),
            roll_forward_to,
        };
        let per_replica: BTreeMap<i32, SubOpBytes> = if ec.is_some() {
            replicas
                .iter()
                .map(|&r| {
                    // Backfill targets not yet at this object: the entry alone.
                    let muts = shard_muts.remove(&r).unwrap_or_default();
                    rep.mutations = if log_only.contains(&r) {
                        Vec::new()
                    } else {
                        muts
                    };
                    (r, SubOpBytes::encode(&rep, Some(&known)))
                })
                .collect()
        } else {
            let bytes = SubOpBytes::encode(&rep, Some(&known));
            let entry_only = if log_only.is_empty() {
                bytes.clone()
            } else {
                // Backfill targets not yet at this object: the entry alone.
                SubOpBytes::encode(
                    &RepOp {
                        mutations: Vec::new(),
                        ..rep.clone()
                    },
                    None,
                )
            };
            replicas
                .iter()
                .map(|&r| {
                    let b = if log_only.contains(&r) {
                        entry_only.clone()
                    } else {
                        bytes.clone()
                    };
                    (r, b)
                })
                .collect()
        };
        if !replicas.is_empty() {
            self.repops.insert(version.seq, per_replica.clone());
        }
        if let Some(run) = self.backfill.as_mut() {
            run.note_write(version.seq, &req.oid, &replicas);
        }
        // The sub-ops go out before the local commit is submitted, so the
        // replicas' data I/O starts no later than this OSD's (which runs
        // on the store's data writers, not in this task). The op is
        // acknowledged only once every member's commit is reported.
        for (r, bytes) in per_replica {
            self.send_repop(r, version.seq, bytes).await;
        }
        let handle = submit_txn(&self.shared.store, txn).map_err(|e| e.to_string());
        self.local_commits.push_back(LocalCommit {
            version,
            interval_since,
            handle,
            ack: None,
        });
        more
    }

    /// Resolves a write of a replicated pool against the object's state
    /// before it: the one the previous write of the object left while that
    /// write is in flight (the store shows it only once durable), else the
    /// store's. Also gives that state's footprint (what the write changes
    /// of it keeps the PG's object counts).
    fn resolve_replicated(
        &self,
        req: &OpRequest,
        version: Version,
    ) -> Result<(exec::Resolved, exec::Footprint), OpError> {
        if req.snap != cairn_ops::SNAP_HEAD {
            return Err(OpError::Invalid(format!(
                "snapshot {} of {} is read-only: writes go to the head",
                req.snap, req.oid
            )));
        }
        let loaded;
        let before = match self.pg.projected(&req.oid) {
            Some(p) => p,
            None => {
                loaded = exec::ObjectProjection::load(&self.shared.store, self.coll, &req.oid)?;
                &loaded
            }
        };
        let r = exec::resolve_write_from(
            &self.shared.store,
            self.coll,
            &req.oid,
            before,
            &req.ops,
            version,
            req.snapc.as_ref(),
        )?;
        Ok((r, before.footprint()))
    }

    /// `Some(no-space error)` when this OSD's store cannot take the data
    /// `muts` write (counted in whole blocks, plus one for an unaligned
    /// head or tail). Deletions and metadata-only changes always pass:
    /// they free space, and the store keeps a reserve for metadata.
    fn full_for(&self, muts: &[Mutation]) -> Option<OpError> {
        let st = self.shared.store.statfs().ok()?;
        let bs = u64::from(st.block_size.max(1));
        let needed: u64 = muts
            .iter()
            .map(|m| match m {
                Mutation::Write { data, .. } if !data.is_empty() => {
                    (data.len() as u64).div_ceil(bs) * bs + bs
                }
                _ => 0,
            })
            .sum();
        if needed == 0 || needed <= st.available_bytes {
            return None;
        }
        Some(OpError::NoSpace(format!(
            "osd.{} is full: {needed} bytes needed, {} available; delete data or add capacity",
            self.me(),
            st.available_bytes
        )))
    }

    /// A write's commit failed on `from`. The primary tells the ops in
    /// flight to retry and re-peers (see [`Pg::commit_failed`]); an OSD
    /// whose own commit failed for lack of space first drops the in-memory
    /// state that never reached the disk. Any other failure of its own
    /// commit (EIO, a store that broke) stops this OSD (fail-stop, as Ceph's
    /// OSD asserts): a disk that loses writes must neither acknowledge nor
    /// serve; its peers report it down and the PGs go on without it.
    async fn on_commit_failed(&mut self, seq: u64, from: i32, error: OpError) {
        if from == self.me() && !matches!(error, OpError::NoSpace(_)) {
            tracing::error!(
                "osd.{}: pg {}: the store failed to commit write {seq}: {error}; stopping this OSD (fail-stop). Check the disk (dmesg, smartctl), then restart the OSD, or replace the disk and let recovery refill it",
                self.me(),
                self.pgid
            );
            let why = format!(
                "the store failed to commit write {seq} of pg {}: {error}",
                self.pgid
            );
            self.shared.failed.send_if_modified(|f| {
                let first = f.is_none();
                if first {
                    *f = Some(why);
                }
                first
            });
            self.shared.tasks.abort_all();
            return;
        }
        if from == self.me() {
            if let Err(e) = self.reload_durable().await {
                tracing::error!("pg {}: reloading after a failed commit: {e}", self.pgid);
            }
        }
        self.repops.clear();
        tracing::warn!(
            "pg {}: write {seq} failed on osd.{from} ({error}); failing it and re-peering",
            self.pgid
        );
        let acts = self.pg.commit_failed(seq, from, error);
        self.run_actions(acts).await;
    }

    /// Waits for every transaction already submitted, then replaces the
    /// in-memory info and log with what the store holds.
    async fn reload_durable(&mut self) -> Result<(), String> {
        let store = &self.shared.store;
        let h = store
            .submit(Transaction::new())
            .map_err(|e| e.to_string())?;
        let _ = h.await;
        let info: PgInfo = match store.meta_get(&self.coll, META_INFO) {
            Ok(Some(b)) => decode("pg info", &b).map_err(|e| e.to_string())?,
            Ok(None) => return Err("no pg info on disk".into()),
            Err(e) => return Err(e.to_string()),
        };
        let log = peering::read_log(store, self.coll).map_err(|e| e.to_string())?;
        self.pg.reload(info, log);
        Ok(())
    }

    async fn on_repop(&mut self, conn: Connection, rep: RepOp, blocks: Option<Arc<BlockCrcs>>) {
        if rep.epoch > self.pg.epoch() {
            if self.held.len() < MAX_HELD_REPOPS {
                self.held.push((conn, rep, blocks));
            }
            return;
        }
        self.pg
            .adopt_primary_interval_start(rep.from, rep.interval_since);
        let ok_sender = self.pg.placement().is_some_and(|p| {
            let me = self.shared.cfg.id;
            p.primary == Some(rep.from) && (p.acting.contains(&me) || p.up.contains(&me))
        });
        if !ok_sender || rep.interval_since < self.pg.info.same_interval_since {
            tracing::debug!(
                "pg {}: ignoring {} from osd.{} (interval {} vs ours {})",
                self.pgid,
                rep.entry.version,
                rep.from,
                rep.interval_since.0,
                self.pg.info.same_interval_since.0
            );
            if ok_sender {
                // Our primary missed the interval change: tell it.
                let ours = self.pg.info.same_interval_since;
                let ack = RepOpAck {
                    pgid: self.pgid,
                    from: self.me(),
                    version: rep.entry.version,
                    interval_since: rep.interval_since,
                    result: Err(format!(
                        "osd.{}'s interval began in epoch {}, after {}",
                        self.me(),
                        ours.0,
                        rep.interval_since.0
                    )),
                    newer_interval: Some(ours),
                };
                let _ = conn.send(msg_type::REPOP_ACK, encode(&ack)).await;
            }
            return;
        }
        if rep.interval_since > self.pg.info.same_interval_since {
            self.pg.info.same_interval_since = rep.interval_since;
        }
        let ack = RepOpAck {
            pgid: self.pgid,
            from: self.me(),
            version: rep.entry.version,
            interval_since: rep.interval_since,
            result: Ok(()),
            newer_interval: None,
        };
        let mut txn = Transaction::new();
        if rep.entry.version > self.pg.info.last_update {
            // No room: refuse before touching the in-memory log, so this
            // replica stays exactly at its durable state.
            if let Some(e) = self.full_for(&rep.mutations) {
                let ack = RepOpAck {
                    result: Err(e.to_string()),
                    ..ack
                };
                let _ = conn.send(msg_type::REPOP_ACK, encode(&ack)).await;
                return;
            }
            if self.ec.is_some() {
                if let Err(e) = self.ec_stash(&rep, &mut txn) {
                    tracing::error!(
                        "pg {}: keeping rollback data for {}: {e}; not applying it",
                        self.pgid,
                        rep.entry.version
                    );
                    return;
                }
            }
            let (old_front, old_tail) = (self.pg.log_front(), self.pg.info.log_tail);
            if !self.pg.apply_replicated(&rep.entry, rep.trim_to) {
                tracing::warn!(
                    "pg {}: gap: got {} from osd.{} but last_update is {}; waiting for peering",
                    self.pgid,
                    rep.entry.version,
                    rep.from,
                    self.pg.info.last_update
                );
                return;
            }
            exec::apply_mutations_known(
                &mut txn,
                self.coll,
                &rep.entry.oid,
                &rep.mutations,
                &|d| known_block_crcs(blocks.as_deref(), d),
            );
            if self.copy_serves_reads() {
                txn.keep_data_cached();
            }
            txn.log_append(self.coll, rep.entry.version.seq, encode(&rep.entry));
            if let Some((from, upto)) = self.pg.trimmed_since(old_front, old_tail) {
                txn.log_trim_from(self.coll, from, upto);
            }
        }
        // A resend of an entry we already have is acknowledged once every
        // earlier transaction of the PG is durable (the store commits a
        // collection's transactions in submission order).
        txn.meta_set(self.coll, META_INFO, encode(&self.pg.info));
        let handle = submit_txn(&self.shared.store, txn).map_err(|e| e.to_string());
        self.local_commits.push_back(LocalCommit {
            version: ack.version,
            interval_since: ack.interval_since,
            handle,
            ack: Some((conn, ack)),
        });
    }

    /// The oldest local commit `c` of this PG ended with `r`. Primary: the
    /// PG learns its own commit (or failure). Replica: the sub-op is
    /// acknowledged with the result; a failure first makes the actor drop
    /// the in-memory state that never reached the disk.
    async fn on_local_commit(&mut self, c: LocalCommit, r: Result<(), String>) {
        let me = self.me();
        let seq = c.version.seq;
        if let Err(e) = &r {
            tracing::error!("pg {}: commit of {} failed: {e}", self.pgid, c.version);
            let failed = PgMsg::CommitFailed {
                seq,
                from: me,
                interval_since: c.interval_since,
                error: commit_error(me, e),
            };
            self.on_msg(failed).await;
        }
        match c.ack {
            None => {
                if r.is_ok() {
                    self.on_msg(PgMsg::Committed {
                        seq,
                        from: me,
                        interval_since: c.interval_since,
                    })
                    .await;
                }
            }
            Some((conn, ack)) => {
                let ack = RepOpAck { result: r, ..ack };
                let _ = conn.send(msg_type::REPOP_ACK, encode(&ack)).await;
            }
        }
    }

    fn start_peering(
        &mut self,
        interval_since: Epoch,
        epoch: Epoch,
        acting: Vec<i32>,
        probe: Vec<i32>,
        past: Vec<PastInterval>,
    ) {
        if let Some((_, old)) = self.peering.take() {
            old.abort();
        }
        // Up members outside the acting set are asked too: a backfill
        // target's mark says where its backfill resumes.
        let mut probe = probe;
        if let Some(p) = self.pg.placement() {
            for o in &p.up {
                if !probe.contains(o) {
                    probe.push(*o);
                }
            }
        }
        let job = peering::PeeringJob {
            shared: self.shared.clone(),
            pgid: self.pgid,
            coll: self.coll,
            epoch,
            interval_since,
            acting,
            probe,
            past,
            my_info: self.pg.info.clone(),
            my_log: self.pg.log().cloned().collect(),
            up: self
                .pg
                .placement()
                .map(|p| p.up.clone())
                .unwrap_or_default(),
            size: self.pg.placement().map(|p| p.size).unwrap_or(0),
            min_size: self.pg.placement().map(|p| p.min_size).unwrap_or(0),
            activated: self.activated.clone(),
        };
        *self.activated.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let tx = self.tx.clone();
        let ec = self.ec.clone();
        let h = self.shared.tasks.spawn(async move {
            let result = match ec {
                Some(ec) => {
                    crate::ec_peering::EcPeeringJob { base: job, ec }
                        .run()
                        .await
                }
                None => job.run().await,
            };
            let _ = tx
                .send(PgMsg::PeeringDone {
                    interval_since,
                    result,
                })
                .await;
        });
        self.peering = Some((interval_since, h));
    }

    /// Returns once everything submitted for this PG so far is durable
    /// (the store commits a collection's transactions in submission order).
    async fn flush(&self) -> Result<(), String> {
        let mut t = Transaction::new();
        t.meta_set(self.coll, META_INFO, encode(&self.pg.info));
        self.shared
            .store
            .submit(t)
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| e.to_string())
    }

    fn persist_meta(&self) {
        let mut t = Transaction::new();
        t.meta_set(self.coll, META_INFO, encode(&self.pg.info));
        t.meta_set(self.coll, META_PAST, encode(&self.pg.past));
        if let Err(e) = self.shared.store.submit(t) {
            tracing::error!("pg {}: persisting info failed: {e}", self.pgid);
        }
    }

    /// Whether client reads are served from this OSD's copy of the PG's
    /// objects: a replicated PG's primary (reads go to it alone), or an EC
    /// PG's data chunk (reads take data chunks, parity only when one is
    /// missing). Such a copy's writes stay in the page cache
    /// ([`OsdConfig::cache_written_data`]).
    fn copy_serves_reads(&self) -> bool {
        if !self.shared.cfg.cache_written_data {
            return false;
        }
        match &self.ec {
            Some(ec) => usize::from(self.coll.shard) < ec.code.k(),
            None => self.pg.role == Role::Primary,
        }
    }

    /// Where this PG's EC reads and writes go (None: replicated pool).
    fn ec_target(&self) -> Option<EcTarget> {
        self.ec.as_ref().map(|ec| EcTarget {
            shared: self.shared.clone(),
            pgid: self.pgid,
            coll: self.coll,
            ec: ec.clone(),
            epoch: self.pg.epoch(),
        })
    }

    /// Log entries after the last roll-forward point, up to `to`.
    fn rolled_forward(&self, to: Version) -> impl Iterator<Item = &LogEntry> {
        let from = self.ec_rolled_forward;
        self.pg
            .log()
            .filter(move |e| e.version > from && e.version <= to)
    }

    /// EC shard: rollback stash for `rep`, and removal of the stashes of the
    /// entries it trims or says are on every shard, ahead of its mutations.
    fn ec_stash(&mut self, rep: &RepOp, txn: &mut Transaction) -> Result<(), StoreError> {
        let store = self.shared.store.clone();
        let to = rep.trim_to.min(self.pg.info.last_update);
        let done: Vec<&LogEntry> = self
            .pg
            .log()
            .filter(|e| e.version <= to)
            .chain(self.rolled_forward(rep.roll_forward_to))
            .collect();
        ec_exec::drop_stashes(&store, self.coll, done.into_iter(), txn)?;
        self.ec_rolled_forward = self.ec_rolled_forward.max(rep.roll_forward_to);
        ec_exec::stash_before(&store, self.coll, &rep.entry, &rep.mutations, txn)
    }

    /// EC shard: undo divergent entries the new primary names.
    async fn on_ec_rollback(&mut self, conn: Connection, msg: Message, rb: EcRollback) {
        self.pg.adopt_primary_interval_start(rb.from, rb.epoch);
        let result = if self.ec.is_none() {
            Err(format!("pg {} is not erasure-coded here", self.pgid))
        } else if rb.epoch < self.pg.info.same_interval_since {
            Err(format!(
                "rollback from osd.{} for epoch {} is older than this OSD's interval (since {})",
                rb.from, rb.epoch.0, self.pg.info.same_interval_since.0
            ))
        } else if let Some(s) = rb.shard.filter(|s| *s != self.coll.shard) {
            // A copy kept from an earlier position, read from as a rebuild
            // source: undo there, the copy served is not touched.
            let coll = CollectionId::new(self.pgid.pool.0, self.pgid.seed, s);
            crate::ec_peering::rollback_other_copy(&self.shared.store, coll, &rb.entries).await
        } else {
            match crate::ec_peering::rollback_local(&self.shared.store, self.coll, &rb.entries)
                .await
            {
                // The undone entries leave the log too (see
                // `log_after_rollback`), durably before the answer.
                Ok(()) => {
                    let log: Vec<LogEntry> = self.pg.log().cloned().collect();
                    let (info, log) =
                        crate::ec_peering::log_after_rollback(&self.pg.info, &log, &rb.entries);
                    let mut txn = Transaction::new();
                    crate::peering::replace_log(&mut txn, self.coll, &info, &log);
                    let r = crate::peering::commit(&self.shared.store, txn).await;
                    if r.is_ok() {
                        self.pg.reload(info, log);
                    }
                    r
                }
                Err(e) => Err(e),
            }
        };
        let r = EcRollbackReply {
            pgid: self.pgid,
            from: self.me(),
            result,
        };
        let _ = conn
            .reply(&msg, msg_type::EC_ROLLBACK_REPLY, encode(&r))
            .await;
    }

    /// EC: when CRUSH moved this OSD to another shard position of the PG
    /// (in the acting set, or as a backfill target), switch to that
    /// position's collection (new and empty, so activation backfills it).
    /// The old position's copy stays on disk: while the PG is not clean it
    /// may still be needed; it is deleted once the PG is clean
    /// ([`Self::drop_other_shards_if_clean`]) or when the whole copy is a
    /// stray.
    async fn follow_shard_move(&mut self, ec: &EcPg) {
        let me = self.me();
        let Some(s) = ec.shard_of(me).or_else(|| ec.up_shard_of(me)) else {
            return;
        };
        if s == usize::from(self.coll.shard) {
            return;
        }
        let coll = CollectionId::new(self.pgid.pool.0, self.pgid.seed, s as u8);
        let store = self.shared.store.clone();
        let loaded = (|| -> Result<(PgInfo, Vec<LogEntry>), StoreError> {
            if !store.collection_exists(&coll)? {
                let info = PgInfo {
                    pgid: Some(self.pgid),
                    ..Default::default()
                };
                let mut t = Transaction::new();
                t.create_collection(coll);
                t.meta_set(coll, META_INFO, encode(&info));
                store.commit(t)?;
            }
            let info: PgInfo = match store.meta_get(&coll, META_INFO)? {
                Some(b) => decode("pg info", &b).map_err(|e| StoreError::Corrupt(e.to_string()))?,
                None => PgInfo::default(),
            };
            Ok((info, peering::read_log(&store, coll)?))
        })();
        match loaded {
            Ok((info, log)) => {
                tracing::info!(
                    "pg {}: osd.{me} moved from shard {} to shard {s}; serving shard {s} (the old shard's copy is kept until the PG is clean)",
                    self.pgid,
                    self.coll.shard
                );
                if let Err(e) = self.flush().await {
                    tracing::warn!("pg {}: flush before a shard move: {e}", self.pgid);
                }
                self.repops.clear();
                self.sent_gen.clear();
                self.coll = coll;
                self.ec_rolled_forward = Version::default();
                self.pg.reload(info, log);
            }
            Err(e) => tracing::error!(
                "pg {}: osd.{me} moved to shard {s} but its collection cannot be opened: {e}",
                self.pgid
            ),
        }
    }

    /// EC: deletes this OSD's copies of other shard positions of the PG
    /// (left by a shard move) once the PG is clean: acting = up, every
    /// position served.
    async fn drop_other_shards_if_clean(&mut self) {
        let clean = self
            .pg
            .placement()
            .is_some_and(crate::ec_pool::kept_copies_droppable);
        if clean {
            self.drop_pg_collections(false).await;
        }
    }

    /// Deletes this OSD's collections of the PG other than the one it
    /// serves (`including_current`: all of them).
    async fn drop_pg_collections(&mut self, including_current: bool) {
        let colls = match self.shared.store.list_collections() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("pg {}: listing collections: {e}", self.pgid);
                return;
            }
        };
        for c in colls {
            if c.pool != self.pgid.pool.0
                || c.seed != self.pgid.seed
                || (c == self.coll && !including_current)
            {
                continue;
            }
            match crate::backfill::delete_copy(&self.shared.store, c).await {
                Ok(()) => tracing::info!(
                    "pg {}: removed the stale copy of shard {} on osd.{}",
                    self.pgid,
                    c.shard,
                    self.me()
                ),
                Err(e) => tracing::warn!("pg {}: removing shard {}: {e}", self.pgid, c.shard),
            }
        }
    }

    /// Drops this interval's backfill run (its slot is released).
    fn end_backfill(&mut self) {
        if let Some(run) = self.backfill.take() {
            self.shared.recovery.release(self.pgid);
            self.recovered.0 += run.copied_objects;
            self.recovered.1 += run.copied_bytes;
        }
        self.pg.state.backfilling = false;
        self.pg.state.backfill_wait = false;
        self.pg.state.backfill_toofull = false;
    }

    /// An active primary with no backfill whose up members all serve in
    /// its pg_temp acting set (the up set changed back to them, maybe
    /// reordered; EC: maybe at other positions, see
    /// `EcPg::pg_temp_unneeded`): the pg_temp is not needed any more, and
    /// nothing else would clear it. Asks the monitors to, again while the
    /// map keeps it.
    async fn clear_unneeded_pg_temp(&mut self) {
        let Some(mon) = &self.shared.mon else {
            return;
        };
        if self.backfill.is_some() || self.peering.is_some() {
            return;
        }
        // EC: by position (`EcPg::pg_temp_unneeded`).
        let unneeded = self.pg.role == Role::Primary
            && self.pg.state.active
            && match &self.ec {
                Some(ec) => ec.pg_temp_unneeded(),
                None => self
                    .pg
                    .placement()
                    .is_some_and(|p| crate::backfill_target::pg_temp_unneeded(&p.up, &p.acting)),
            };
        let has_temp = self.shared.map_rx.borrow().pg_temp.contains_key(&self.pgid);
        if !self
            .pg_temp_clear
            .due(std::time::Instant::now(), has_temp, unneeded)
        {
            return;
        }
        tracing::info!(
            "pg {}: every up member serves in the pg_temp acting set; clearing pg_temp",
            self.pgid
        );
        let _ = mon
            .send(cairn_map::MonCommand::PgTemp {
                from: self.me(),
                pgid: self.pgid,
                osds: Vec::new(),
            })
            .await;
    }

    /// One backfill step (active primary with targets only).
    async fn backfill_step(&mut self) {
        self.clear_unneeded_pg_temp().await;
        if self.pg.role != Role::Primary || !self.pg.state.active {
            return;
        }
        let Some(mut run) = self.backfill.take() else {
            return;
        };
        if run.is_finished() && self.ec.is_some() && !self.strays.is_empty() {
            // EC: every up member now holds its whole shard, so copies
            // outside the up set are no longer needed. Told before pg_temp
            // is cleared: the next primary (CRUSH's) may never have heard
            // of them.
            let strays = std::mem::take(&mut self.strays);
            crate::backfill::remove_strays(&self.shared, self.pgid, self.pg.epoch(), &strays).await;
        }
        let cx = crate::backfill::StepCtx {
            shared: &self.shared,
            pg: &mut self.pg,
            pgid: self.pgid,
            coll: self.coll,
            ec: self.ec.as_ref(),
        };
        let acts = run.step(cx).await;
        self.backfill = Some(run);
        if !acts.is_empty() {
            Box::pin(self.run_actions(acts)).await;
        }
    }

    /// After an activation: once the PG is clean, strays delete their copies.
    async fn after_activation(&mut self) {
        if self.pg.state.clean && self.ec.is_some() {
            self.drop_other_shards_if_clean().await;
        }
        if self.pg.state.clean && !self.strays.is_empty() {
            let strays = std::mem::take(&mut self.strays);
            let (shared, pgid, epoch) = (self.shared.clone(), self.pgid, self.pg.epoch());
            self.shared.tasks.spawn(async move {
                crate::backfill::remove_strays(&shared, pgid, epoch, &strays).await;
            });
        }
        self.backfill_step().await;
    }

    /// Backfill target side: installs a batch and acknowledges it once durable.
    /// `blocks`: the batch message's verified block crcs (see `BlockCrcs`).
    async fn on_backfill(
        &mut self,
        conn: Connection,
        bf: PgBackfill,
        blocks: Option<Arc<BlockCrcs>>,
    ) {
        if bf.epoch > self.pg.epoch() {
            let mut rx = self.shared.map_rx.clone();
            let wait = rx.wait_for(|m| m.epoch >= bf.epoch);
            let _ = tokio::time::timeout(self.shared.cfg.map_wait, wait).await;
            let map = self.shared.map_rx.borrow().clone();
            self.on_map(map).await;
        }
        self.pg
            .adopt_primary_interval_start(bf.from, bf.interval_since);
        let me = self.me();
        let from_primary = self
            .pg
            .placement()
            .is_some_and(|p| p.primary == Some(bf.from) && p.up.contains(&me));
        let ack = |result: Result<(), String>| PgBackfillAck {
            pgid: bf.pgid,
            from: me,
            interval_since: bf.interval_since,
            seq: bf.seq,
            result,
        };
        // From the current primary, sent in a map epoch of this OSD's
        // current interval: accepted even when the primary dates the
        // interval's start earlier than this OSD does.
        let current = bf.interval_since >= self.pg.info.same_interval_since
            || bf.epoch >= self.pg.info.same_interval_since;
        if from_primary && current {
            self.pg.adopt_backfill_interval(bf.from, bf.interval_since);
        }
        if !from_primary || !current {
            let why = format!(
                "backfill from osd.{} for interval {} refused: not this OSD's primary or an older interval (ours {})",
                bf.from, bf.interval_since.0, self.pg.info.same_interval_since.0
            );
            let _ = conn
                .send(msg_type::PG_BACKFILL_ACK, encode(&ack(Err(why))))
                .await;
            return;
        }
        if bf.interval_since > self.pg.info.same_interval_since {
            self.pg.info.same_interval_since = bf.interval_since;
        }
        let built = crate::backfill::target_txn(
            &self.shared.store,
            self.coll,
            &self.pg.info,
            &bf,
            blocks.as_ref(),
        );
        let (txn, adopt, info) = match built {
            Ok(x) => x,
            Err(e) => {
                let _ = conn
                    .send(msg_type::PG_BACKFILL_ACK, encode(&ack(Err(e))))
                    .await;
                return;
            }
        };
        match adopt {
            Some((info, log)) => self.pg.reload(info, log),
            None => self.pg.info.backfill = info.backfill.clone(),
        }
        // One store transaction per batch; batches pipelined from the
        // primary group-commit in the store.
        let h = submit_txn(&self.shared.store, txn);
        let a = ack(Ok(()));
        self.shared.tasks.spawn(async move {
            let r = match h {
                Ok(h) => h.await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            let a = PgBackfillAck { result: r, ..a };
            let _ = conn.send(msg_type::PG_BACKFILL_ACK, encode(&a)).await;
        });
    }

    /// Stray side: the primary of a clean PG says this copy is no longer
    /// needed. Returns true when the copy is deleted (the actor ends).
    async fn on_remove(&mut self, r: PgRemove) -> bool {
        if r.epoch > self.pg.epoch() {
            let mut rx = self.shared.map_rx.clone();
            let wait = rx.wait_for(|m| m.epoch >= r.epoch);
            let _ = tokio::time::timeout(self.shared.cfg.map_wait, wait).await;
            let map = self.shared.map_rx.borrow().clone();
            self.on_map(map).await;
        }
        let me = self.me();
        let needed = self.pg.placement().is_none_or(|p| {
            p.up.contains(&me) || p.acting.contains(&me) || p.primary != Some(r.from)
        });
        if needed || self.peering.is_some() {
            tracing::debug!(
                "pg {}: keeping this copy (osd.{} asked to remove it, but this OSD is in the placement or the sender is not the primary)",
                self.pgid,
                r.from
            );
            return false;
        }
        if let Err(e) = self.flush().await {
            tracing::warn!("pg {}: flush before removal failed: {e}", self.pgid);
            return false;
        }
        lock(&self.shared.pgs).remove(&self.pgid);
        lock(&self.shared.stats).remove(&self.pgid);
        match crate::backfill::delete_copy(&self.shared.store, self.coll).await {
            Ok(()) => tracing::info!(
                "pg {}: stray copy removed (primary osd.{})",
                self.pgid,
                r.from
            ),
            Err(e) => tracing::warn!("pg {}: removing the stray copy: {e}", self.pgid),
        }
        // EC: copies of other shard positions left by a shard move.
        self.drop_pg_collections(false).await;
        self.shared.cache.invalidate_pg(self.pgid);
        true
    }

    fn stat_inputs(&self) -> StatInputs<'_> {
        StatInputs {
            pgid: self.pgid,
            state: &self.pg.state,
            role: self.pg.role,
            placement: self.pg.placement(),
            epoch: self.pg.epoch().0,
            info: &self.pg.info,
            log_entries: self.pg.log_len(),
            stamps: &self.scrub.stamps,
            running: self.scrub.running.as_ref().map(|(r, _)| *r),
            backfill: self.backfill.as_ref(),
            recovered: self.recovered,
            written: self.ec.is_none().then_some(self.written),
        }
    }

    /// Publishes the PG's stats if they changed since the last event: the
    /// log position alone (every write) as numbers, anything else by
    /// rebuilding the whole entry (see `crate::stats`).
    fn publish_stats(&mut self) {
        let inputs = self.stat_inputs();
        let pos = inputs.position();
        let same = self
            .published
            .as_ref()
            .is_some_and(|(key, _)| inputs.matches(key));
        if same && self.published.as_ref().is_some_and(|(_, p)| *p == pos) {
            return;
        }
        let mut table = lock(&self.shared.stats);
        match table.get_mut(&self.pgid) {
            Some(entry) if same => entry.pos = pos,
            _ => {
                let stat = inputs.stat();
                let gen = self.shared.stats_gen.fetch_add(1, Ordering::Relaxed);
                table.insert(self.pgid, Published { stat, pos, gen });
                drop(table);
                let key = inputs.key();
                self.published = Some((key, pos));
                return;
            }
        }
        drop(table);
        if let Some((_, p)) = &mut self.published {
            *p = pos;
        }
    }

    // ------------------------------------------------------------ scrub hooks

    /// A job's request about its chunk (see `crate::scrub::ScrubCtl`).
    async fn on_scrub_ctl(&mut self, c: crate::scrub::ScrubCtl) {
        use crate::scrub::ScrubCtl;
        match c {
            ScrubCtl::Block {
                interval_since,
                range,
                reply,
            } => {
                let r = if interval_since != self.pg.info.same_interval_since {
                    Err("the PG's interval changed".to_string())
                } else if self.pg.scrub_block(range) {
                    self.scrub.blocked_at = Some(std::time::Instant::now());
                    Ok(())
                } else {
                    Err(format!(
                        "pg {} is {}: not an active primary",
                        self.pgid, self.pg.state
                    ))
                };
                let _ = reply.send(r);
            }
            ScrubCtl::Settled { reply } => {
                let r = match self.pg.scrub_blocked_range() {
                    None => Err("the chunk was released (interval change or held too long)".into()),
                    Some(_) if self.pg.scrub_chunk_busy() => Ok(None),
                    Some(range) => Ok(Some(crate::scrub::chunk_log(self.pg.log(), range))),
                };
                let _ = reply.send(r);
            }
            ScrubCtl::Unblock => {
                self.scrub.blocked_at = None;
                let acts = self.pg.scrub_unblock();
                self.run_actions(acts).await;
            }
        }
    }

    fn persist_scrub(&self) {
        let mut t = Transaction::new();
        t.meta_set(
            self.coll,
            crate::scrub::META_SCRUB,
            encode(&self.scrub.stamps),
        );
        if let Err(e) = self.shared.store.submit(t) {
            tracing::warn!("pg {}: persisting scrub stamps failed: {e}", self.pgid);
        }
    }

    /// Aborts the running scrub job (its slot is freed with it).
    fn stop_scrub(&mut self, why: &str) {
        if let Some((req, job)) = self.scrub.running.take() {
            job.abort();
            tracing::info!("pg {}: scrub stopped: {why}", self.pgid);
            self.scrub.stamps.last_failure = Some(why.to_string());
            if req.order.is_some() && self.scrub.pending.is_none() {
                self.scrub.pending = Some(req);
            }
        }
        self.scrub.blocked_at = None;
    }

    /// Queues the operator's order for this PG unless already carried out.
    fn note_scrub_order(&mut self, map: &ClusterMap) {
        let Some(o) = map.scrub_order(self.pgid) else {
            return;
        };
        let queued = |r: Option<crate::scrub::ScrubRequest>| r.and_then(|r| r.order) == Some(o.id);
        if o.id <= self.scrub.stamps.order_done
            || queued(self.scrub.pending)
            || queued(self.scrub.running.as_ref().map(|(r, _)| *r))
        {
            return;
        }
        self.scrub.pending = Some(crate::scrub::ScrubRequest {
            deep: o.deep,
            repair: o.repair,
            order: Some(o.id),
        });
    }

    /// Starts a scrub when one is ordered or due and a slot is free.
    async fn scrub_tick(&mut self) {
        use crate::scrub::{now_secs, ScrubJob, ScrubSchedule, SCRUB_CHUNK_HOLD_MAX};
        let now = std::time::Instant::now();
        if self
            .scrub
            .blocked_at
            .is_some_and(|t| now.duration_since(t) > SCRUB_CHUNK_HOLD_MAX)
        {
            self.stop_scrub("a chunk held writes back too long; retrying later");
            self.scrub.retry_at = Some(now + crate::scrub::SCRUB_RETRY_AFTER);
            let acts = self.pg.scrub_unblock();
            self.run_actions(acts).await;
        }
        if self.pg.role != Role::Primary
            || !self.pg.state.active
            || self.scrub.running.is_some()
            || self.scrub.retry_at.is_some_and(|t| now < t)
        {
            return;
        }
        if self.scrub.stamps.first_seen_secs == 0 {
            self.scrub.stamps.first_seen_secs = now_secs();
            self.persist_scrub();
        }
        let map = self.shared.map_rx.borrow().clone();
        let req = match self.scrub.pending {
            Some(r) => r,
            None if self.pg.state.clean => {
                match ScrubSchedule::from_map(&map, self.me()).due(
                    &self.scrub.stamps,
                    now_secs(),
                    self.scrub.jitter,
                ) {
                    Some(r) => r,
                    None => return,
                }
            }
            None => return,
        };
        let max = map
            .config_value(&format!("osd.{}", self.me()), "osd_max_scrubs")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(1)
            .max(1);
        let Some(slot) = self.shared.scrub.try_slot(max) else {
            return;
        };
        let Some(p) = self.pg.placement() else {
            return;
        };
        let job = ScrubJob {
            shared: self.shared.clone(),
            pgid: self.pgid,
            coll: self.coll,
            actor: self.tx.clone(),
            epoch: self.pg.epoch(),
            interval_since: self.pg.info.same_interval_since,
            acting: p.acting.clone(),
            ec: self.ec.clone(),
            req,
            slot,
        };
        tracing::info!(
            "pg {}: starting {}{}",
            self.pgid,
            if req.deep { "deep-scrub" } else { "scrub" },
            if req.repair { " with repair" } else { "" }
        );
        let h = self.shared.tasks.spawn(job.run());
        self.scrub.pending = None;
        self.scrub.running = Some((req, h));
    }

    /// Records a finished job's findings and stamps.
    fn on_scrub_done(&mut self, o: crate::scrub::ScrubOutcome) {
        let ours = self
            .scrub
            .running
            .as_ref()
            .is_some_and(|(r, _)| *r == o.req);
        if !ours || o.interval_since != self.pg.info.same_interval_since {
            return;
        }
        self.scrub.running = None;
        self.scrub.blocked_at = None;
        let st = &mut self.scrub.stamps;
        match o.result {
            Ok((findings, repaired)) => {
                let now = crate::scrub::now_secs();
                st.last_scrub_secs = now;
                if o.req.deep {
                    st.last_deep_scrub_secs = now;
                }
                st.errors = findings.iter().map(|f| f.bad.len() as u64).sum();
                st.inconsistent = findings
                    .iter()
                    .take(cairn_map::SCRUB_REPORT_OBJECTS_MAX)
                    .map(|f| f.report())
                    .collect();
                st.last_failure = None;
                if let Some(id) = o.req.order {
                    st.order_done = st.order_done.max(id);
                }
                let what = if o.req.deep { "deep-scrub" } else { "scrub" };
                if st.errors == 0 {
                    tracing::info!("pg {}: {what} ok ({repaired} copies repaired)", self.pgid);
                } else {
                    tracing::warn!(
                        "pg {}: {what}: {} errors in {} objects ({repaired} copies repaired)",
                        self.pgid,
                        st.errors,
                        findings.len()
                    );
                }
                self.scrub.retry_at = None;
            }
            Err(e) => {
                tracing::warn!("pg {}: scrub failed: {e}", self.pgid);
                st.last_failure = Some(e);
                if o.req.order.is_some() && self.scrub.pending.is_none() {
                    self.scrub.pending = Some(o.req);
                }
                self.scrub.retry_at =
                    Some(std::time::Instant::now() + crate::scrub::SCRUB_RETRY_AFTER);
            }
        }
        self.persist_scrub();
    }
}
