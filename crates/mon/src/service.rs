//! The monitor daemon over cairn-msg: listens with a `KeyServer` backed by
//! the map's auth table (mons share the cluster's mon secret), serves admin
//! commands (caps checked against the authenticated peer name; mutations
//! proposed to Raft on the leader, others answered with a leader hint the
//! client follows; queries answered from the local map), map subscriptions
//! (full or incremental pushes on every new epoch), mon-to-mon Raft RPCs,
//! joins of new mons, and wall-clock pings for the MON_CLOCK_SKEW check.
//!
//! Clock readings are reported only; every timeout and liveness decision
//! here uses the monotonic clock (`tokio::time::Instant`).

use crate::clustermap::{encode_command, incremental_from_log};
use crate::node::{mon_id_for, ProposeError, RaftMon, RaftTiming, RaftView};
use crate::osdreports::LeaderReports;
use crate::proto::*;
use crate::store::Catchup;
use crate::transport::{handle_rpc, RaftRpc, RaftRpcReply, RaftTransport};
use crate::types::{MonId, MonPeer};
use bytes::Bytes;
use cairn_map::{
    ApplyContext, ClusterMap, HealthInputs, MonCommand, QueryContext, Reply, RuntimeStatus,
};
use cairn_msg::{
    connect, Connection, Credentials, KeyServer, Keyring, Listener, Message, MsgConfig, Secret,
};
use cairn_types::{Conf, EntityKind, EntityName};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// How often mons ping each other (liveness for `quorum_status`, clock offsets).
pub const MON_PING_INTERVAL: Duration = Duration::from_secs(1);
/// A mon not heard from for this long counts as out of quorum in reports.
pub const MON_PEER_STALE_AFTER: Duration = Duration::from_secs(3);
/// Longest a proposal may wait for a commit.
pub const PROPOSE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a membership change (new mon catching up) may take.
pub const MEMBERSHIP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `mon add` waits for the new mon to answer a probe.
pub const MON_PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Concurrent commands and subscriptions served per client connection.
pub const COMMANDS_INFLIGHT_PER_CONN: usize = 32;
/// Period of the leader's failure and down-out decisions.
pub const OSD_JUDGE_INTERVAL: Duration = Duration::from_secs(1);

/// Everything a mon daemon needs to run.
#[derive(Debug, Clone)]
pub struct MonConfig {
    /// `a` for `mon.a`.
    pub name: String,
    /// Address to listen on and advertise.
    pub addr: SocketAddr,
    /// The mon's store lives in `data_dir` (file `mon.redb`).
    pub data_dir: PathBuf,
    /// The secret every mon of the cluster shares.
    pub mon_secret: Secret,
    /// Other mons to ask when this mon must join (from `mon_host`).
    pub join_via: Vec<SocketAddr>,
    /// `cairn.conf` whose `mon_host` is kept current with the map, if any.
    pub conf_path: Option<PathBuf>,
    /// Local key files checked for AUTH_INSECURE.
    pub key_files: Vec<PathBuf>,
    pub timing: RaftTiming,
}

fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Sends Raft RPCs and pings to other mons over cairn-msg, one cached
/// connection per peer. Each peer has its own slot, so a peer that is slow
/// to connect (dropped SYNs) never delays traffic to the others.
pub struct MsgTransport {
    creds: Credentials,
    conns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Connection>>>>>,
}

impl MsgTransport {
    pub fn new(name: &str, secret: Secret) -> MsgTransport {
        MsgTransport {
            creds: Credentials::Key {
                name: EntityName::mon(name),
                secret,
            },
            conns: Mutex::new(HashMap::new()),
        }
    }

    fn slot(&self, addr: &str) -> Arc<tokio::sync::Mutex<Option<Connection>>> {
        match self.conns.lock() {
            Ok(mut m) => m.entry(addr.to_string()).or_default().clone(),
            Err(_) => Arc::new(tokio::sync::Mutex::new(None)),
        }
    }

    async fn conn(&self, peer: &MonPeer, timeout: Duration) -> Result<Connection, String> {
        let slot = self.slot(&peer.addr);
        let mut cached = slot.lock().await;
        if let Some(c) = cached.as_ref() {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let addr: SocketAddr = peer
            .addr
            .parse()
            .map_err(|_| format!("{peer}: bad address"))?;
        let cfg = MsgConfig {
            connect_timeout: timeout.min(Duration::from_secs(1)),
            handshake_timeout: timeout.min(Duration::from_secs(2)),
            ..MsgConfig::default()
        };
        let expect = EntityName::mon(&peer.name);
        let c = connect(addr, &self.creds, Some(&expect), &cfg)
            .await
            .map_err(|e| e.to_string())?;
        *cached = Some(c.clone());
        Ok(c)
    }

    /// Request/response to another mon.
    pub async fn call(
        &self,
        peer: &MonPeer,
        msg_type: u16,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Message, String> {
        let c = self.conn(peer, timeout).await?;
        match c.call(msg_type, payload, timeout).await {
            Ok(m) => Ok(m),
            Err(e) => {
                if e.is_connection_error() {
                    *self.slot(&peer.addr).lock().await = None;
                }
                Err(e.to_string())
            }
        }
    }
}

impl RaftTransport for MsgTransport {
    async fn call(
        &self,
        _target: MonId,
        peer: &MonPeer,
        rpc: RaftRpc,
        timeout: Duration,
    ) -> Result<RaftRpcReply, String> {
        let m = MsgTransport::call(self, peer, MSG_RAFT, encode(&rpc), timeout).await?;
        decode("raft reply", &m.payload)
    }
}

/// Keys for the listener: every mon shares the mon secret; everyone else's
/// secret is in the map's auth table.
struct MonKeys {
    mon_secret: Secret,
    mon: Arc<RaftMon<ClusterMap>>,
}

impl KeyServer for MonKeys {
    fn secret_for(&self, name: &EntityName) -> Option<Secret> {
        if name.kind == EntityKind::Mon {
            return Some(self.mon_secret.clone());
        }
        let key = self
            .mon
            .read_local(|m| m.and_then(|m| m.auth.get(name).map(|a| a.key.clone())))?;
        let bytes = cairn_map::decode_secret(&key).ok()?;
        let arr: [u8; 32] = bytes.try_into().ok()?;
        Some(Secret::from_bytes(arr))
    }

    fn service_secret(&self, _generation: u64) -> Option<Secret> {
        // Rotating service secrets for tickets belong to the OSD work; mons
        // accept key-authenticated peers only for now.
        None
    }
}

/// Clock samples kept per peer; the offset reported is the one measured
/// with the smallest round trip among them (least uncertainty).
const CLOCK_SAMPLES_KEPT: usize = 8;

#[derive(Default)]
struct PeerSeen {
    last_seen: Option<Instant>,
    /// (round trip ms, peer's wall clock minus ours RTT-corrected ms).
    samples: std::collections::VecDeque<(i64, i64)>,
}

impl PeerSeen {
    fn offset_ms(&self) -> Option<i64> {
        self.samples
            .iter()
            .min_by_key(|(rtt, _)| *rtt)
            .map(|(_, o)| *o)
    }
}

/// A running monitor.
pub struct MonService {
    cfg: MonConfig,
    mon: Arc<RaftMon<ClusterMap>>,
    transport: Arc<MsgTransport>,
    peers: Mutex<BTreeMap<String, PeerSeen>>,
    /// (term, leader) last seen and since when: the quorum's age.
    quorum_since: Mutex<Option<(u64, Option<MonId>, Instant)>>,
    /// On the leader: beacons, PG statistics and the failure judge of the
    /// current term (never replicated; a new leader starts afresh).
    osd_reports: Mutex<Option<LeaderReports>>,
}

impl MonService {
    /// Opens the store, starts Raft and binds the listener. A mon whose
    /// store has no membership yet asks the mons in `join_via` to add it.
    pub async fn start(cfg: MonConfig) -> anyhow::Result<(Arc<MonService>, Listener)> {
        let transport = Arc::new(MsgTransport::new(&cfg.name, cfg.mon_secret.clone()));
        let mon = RaftMon::<ClusterMap>::open(
            &cfg.data_dir,
            mon_id_for(&cfg.name),
            transport.clone(),
            cfg.timing,
        )
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "mon.{}: cannot open its store in {}: {e}",
                cfg.name,
                cfg.data_dir.display()
            )
        })?;
        let mon = Arc::new(mon);
        let keys = Arc::new(MonKeys {
            mon_secret: cfg.mon_secret.clone(),
            mon: mon.clone(),
        });
        let listener = Listener::bind(
            cfg.addr,
            EntityName::mon(&cfg.name),
            keys,
            MsgConfig::default(),
        )
        .await
        .map_err(|e| anyhow::anyhow!("mon.{}: cannot listen on {}: {e}", cfg.name, cfg.addr))?;
        let svc = Arc::new(MonService {
            cfg,
            mon,
            transport,
            peers: Mutex::new(BTreeMap::new()),
            quorum_since: Mutex::new(None),
            osd_reports: Mutex::new(None),
        });
        Ok((svc, listener))
    }

    /// Serves until `shutdown` resolves, then stops Raft.
    pub async fn run(
        self: Arc<Self>,
        listener: Listener,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let mut tasks = Vec::new();
        let me = self.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok(conn) => {
                        let svc = me.clone();
                        tokio::spawn(async move { svc.serve_conn(conn).await });
                    }
                    Err(e) => {
                        tracing::warn!("listener stopped: {e}");
                        return;
                    }
                }
            }
        }));
        let me = self.clone();
        tasks.push(tokio::spawn(async move { me.ping_loop().await }));
        let me = self.clone();
        tasks.push(tokio::spawn(async move { me.join_loop().await }));
        let me = self.clone();
        tasks.push(tokio::spawn(async move { me.conf_loop().await }));
        let me = self.clone();
        tasks.push(tokio::spawn(async move { me.osd_judge_loop().await }));
        shutdown.await;
        tracing::info!("mon.{}: shutting down", self.cfg.name);
        for t in &tasks {
            t.abort();
        }
        self.mon.shutdown().await;
        Ok(())
    }

    /// The Raft member (for tests and status).
    pub fn raft_mon(&self) -> &Arc<RaftMon<ClusterMap>> {
        &self.mon
    }

    async fn serve_conn(self: Arc<Self>, conn: Connection) {
        let limit = Arc::new(Semaphore::new(COMMANDS_INFLIGHT_PER_CONN));
        loop {
            let msg = match conn.recv().await {
                Ok(m) => m,
                Err(_) => return,
            };
            let peer = conn.peer().clone();
            match msg.msg_type {
                MSG_RAFT | MSG_PING if peer.kind != EntityKind::Mon => {
                    tracing::warn!("{peer} sent a mon-only message; closing");
                    conn.close();
                    return;
                }
                MSG_RAFT => {
                    let reply = match decode::<RaftRpc>("raft rpc", &msg.payload) {
                        Ok(rpc) => handle_rpc(self.mon.raft(), rpc).await,
                        Err(e) => RaftRpcReply::Error(e),
                    };
                    let _ = conn.reply(&msg, MSG_RAFT, encode(&reply)).await;
                }
                MSG_PING => {
                    if let Ok(p) = decode::<Ping>("ping", &msg.payload) {
                        self.note_seen(&p.from, None);
                    }
                    let pong = Pong {
                        from: self.cfg.name.clone(),
                        wall_ms: wall_ms(),
                    };
                    let _ = conn.reply(&msg, MSG_PING, encode(&pong)).await;
                }
                MSG_SUBSCRIBE => {
                    let have = decode::<SubscribeRequest>("subscribe", &msg.payload)
                        .map(|r| r.have_epoch)
                        .unwrap_or(0);
                    // A subscription holds one of the connection's slots
                    // for as long as it lives.
                    let Ok(permit) = limit.clone().acquire_owned().await else {
                        return;
                    };
                    let svc = self.clone();
                    let c = conn.clone();
                    tokio::spawn(async move {
                        svc.serve_subscription(c, msg, have).await;
                        drop(permit);
                    });
                }
                MSG_COMMAND | MSG_JOIN => {
                    let Ok(permit) = limit.clone().acquire_owned().await else {
                        return;
                    };
                    let svc = self.clone();
                    let c = conn.clone();
                    tokio::spawn(async move {
                        let resp = if msg.msg_type == MSG_COMMAND {
                            match decode::<CommandRequest>("command", &msg.payload) {
                                Ok(req) => svc.handle_command(&peer, req.cmd).await,
                                Err(e) => svc.response(Err(CommandFailure::Refused(e))),
                            }
                        } else {
                            match decode::<JoinRequest>("join", &msg.payload) {
                                Ok(j) if peer.kind == EntityKind::Mon => {
                                    let cmd = MonCommand::MonAdd {
                                        name: j.name,
                                        addr: j.addr,
                                    };
                                    let me = EntityName::mon(&svc.cfg.name);
                                    svc.handle_command(&me, cmd).await
                                }
                                Ok(_) => svc.response(Err(CommandFailure::Refused(
                                    "only mons may join".into(),
                                ))),
                                Err(e) => svc.response(Err(CommandFailure::Refused(e))),
                            }
                        };
                        let _ = c.reply(&msg, msg.msg_type, encode(&resp)).await;
                        drop(permit);
                    });
                }
                other => {
                    tracing::debug!("{peer}: ignoring message type {other:#x}");
                }
            }
        }
    }

    fn response(&self, result: Result<Reply, CommandFailure>) -> CommandResponse {
        let (epoch, mon_addrs) = self.mon.read_local(|m| match m {
            Some(m) => (m.epoch.0, m.mons.iter().map(|x| x.addr.clone()).collect()),
            None => (0, Vec::new()),
        });
        CommandResponse {
            result,
            epoch,
            mon_addrs,
        }
    }

    fn note_seen(&self, name: &str, sample: Option<(i64, i64)>) {
        if let Ok(mut p) = self.peers.lock() {
            let e = p.entry(name.to_string()).or_default();
            e.last_seen = Some(Instant::now());
            if let Some(s) = sample {
                if e.samples.len() >= CLOCK_SAMPLES_KEPT {
                    e.samples.pop_front();
                }
                e.samples.push_back(s);
            }
        }
    }

    /// Is this mon part of a working quorum right now? (monotonic clock)
    fn quorum_ok(&self, view: &RaftView) -> Result<(), String> {
        let max_ms = self.cfg.timing.election_timeout_max_ms * 3;
        if !view.voters.contains_key(&self.mon.id) {
            return Err(format!(
                "mon.{} is not a voting member of the monitor group (joining, or removed: then stop it with 'cairn daemon stop')",
                self.cfg.name
            ));
        }
        match &view.leader {
            None => Err(format!(
                "mon.{} knows no leader (election in progress or no majority of mons reachable)",
                self.cfg.name
            )),
            Some((id, _)) if *id == self.mon.id => match view.millis_since_quorum_ack {
                Some(ms) if ms <= max_ms => Ok(()),
                Some(ms) => Err(format!(
                    "mon.{} is leader but no majority acknowledged it for {ms} ms",
                    self.cfg.name
                )),
                None => Err(format!(
                    "mon.{} is leader without a quorum yet",
                    self.cfg.name
                )),
            },
            Some(_) => Ok(()),
        }
    }

    /// Time since this mon first saw the current (term, leader).
    fn quorum_age(&self, view: &RaftView) -> Duration {
        let leader = view.leader.as_ref().map(|(id, _)| *id);
        let Ok(mut q) = self.quorum_since.lock() else {
            return Duration::ZERO;
        };
        match *q {
            Some((term, l, since)) if term == view.term && l == leader => since.elapsed(),
            _ => {
                *q = Some((view.term, leader, Instant::now()));
                Duration::ZERO
            }
        }
    }

    fn runtime_status(&self, view: &RaftView, map: &ClusterMap) -> RuntimeStatus {
        let now = Instant::now();
        let mut quorum = vec![self.cfg.name.clone()];
        let mut offsets_vs_me: BTreeMap<String, i64> = BTreeMap::new();
        offsets_vs_me.insert(self.cfg.name.clone(), 0);
        if let Ok(p) = self.peers.lock() {
            for (name, seen) in p.iter() {
                if !map.mons.iter().any(|m| &m.name == name) {
                    continue;
                }
                if seen
                    .last_seen
                    .is_some_and(|t| now.duration_since(t) <= MON_PEER_STALE_AFTER)
                {
                    quorum.push(name.clone());
                }
                if let Some(o) = seen.offset_ms() {
                    offsets_vs_me.insert(name.clone(), o);
                }
            }
        }
        quorum.sort();
        quorum.dedup();
        let leader_name = view.leader.as_ref().map(|(_, p)| p.name.clone());
        // Offsets are reported against the leader's clock.
        let base = leader_name
            .as_ref()
            .and_then(|l| offsets_vs_me.get(l).copied())
            .unwrap_or(0);
        let mon_clock_offsets_ms = offsets_vs_me
            .into_iter()
            .map(|(n, o)| (n, o - base))
            .collect();
        let insecure_key_files = self
            .cfg
            .key_files
            .iter()
            .filter(|p| Keyring::is_world_readable(p))
            .map(|p| p.display().to_string())
            .collect();
        RuntimeStatus {
            health: HealthInputs {
                quorum,
                mon_clock_offsets_ms,
                insecure_key_files,
                pgmap: self.pg_view(view, map),
            },
            leader: leader_name,
            quorum_age_secs: self.quorum_age(view).as_secs(),
        }
    }

    /// Runs one admin command for the authenticated `caller`.
    pub async fn handle_command(&self, caller: &EntityName, cmd: MonCommand) -> CommandResponse {
        let view = self.mon.view();
        let Some(map) = self.mon.read_local(|m| m.cloned()) else {
            return self.response(Err(CommandFailure::NoQuorum(format!(
                "mon.{} has no cluster map yet (still joining)",
                self.cfg.name
            ))));
        };
        if let Err(e) = self.quorum_ok(&view) {
            return self.response(Err(CommandFailure::NoQuorum(e)));
        }
        // A mon proved the shared mon secret: it has mon rights even before
        // the map lists it (while it joins), so it acts as a listed mon.
        let stand_in;
        let caller = match map.mons.first() {
            Some(first)
                if caller.kind == EntityKind::Mon
                    && !map.mons.iter().any(|m| m.name == caller.id) =>
            {
                stand_in = EntityName::mon(&first.name);
                &stand_in
            }
            _ => caller,
        };
        if let Err(e) = map.authorize(caller, &cmd) {
            return self.response(Err(CommandFailure::Refused(e.to_string())));
        }
        let leader = view.leader.as_ref().map(|(id, _)| *id) == Some(self.mon.id);
        if (cmd.is_report() || cmd.needs_pg_stats()) && !leader {
            // Beacons, failure reports and PG statistics live on the leader.
            return self.response(Err(not_leader(&view)));
        }
        if cmd.is_report() {
            let r = self.handle_report(&view, &map, &cmd).await;
            return self.response(r);
        }
        if !cmd.is_mutation() {
            let ctx = QueryContext {
                caller: caller.clone(),
                runtime: self.runtime_status(&view, &map),
            };
            let r = map
                .query(&cmd, &ctx)
                .map_err(|e| CommandFailure::Refused(e.to_string()));
            return self.response(r);
        }
        if !leader {
            return self.response(Err(not_leader(&view)));
        }
        let r = self.propose_checked(caller, &map, &cmd).await;
        self.response(r)
    }

    /// Validates a mutation on a copy of `map`, then commits it through Raft.
    async fn propose_checked(
        &self,
        caller: &EntityName,
        map: &ClusterMap,
        cmd: &MonCommand,
    ) -> Result<Reply, CommandFailure> {
        let ctx = ApplyContext {
            caller: caller.clone(),
            generated_secret: Some(Secret::generate().as_bytes().to_owned()),
        };
        // Validate on a copy first so Raft membership only changes for a
        // command the map accepts.
        if let Err(e) = map.clone().apply(cmd, &ctx) {
            return Err(CommandFailure::Refused(e.to_string()));
        }
        self.membership_for(cmd).await?;
        match self
            .mon
            .propose(encode_command(cmd, &ctx), PROPOSE_TIMEOUT)
            .await
        {
            Ok(applied) => match applied.outcome {
                Ok(out) => Ok(Reply {
                    plain: out.plain,
                    json: serde_json::from_str(&out.json).unwrap_or(serde_json::Value::Null),
                    data: Vec::new(),
                }),
                Err(e) => Err(CommandFailure::Refused(e)),
            },
            Err(e) => Err(propose_failure(e)),
        }
    }

    /// The leader's per-term OSD bookkeeping, created for a new term.
    fn with_reports<T>(&self, view: &RaftView, f: impl FnOnce(&mut LeaderReports) -> T) -> T {
        let mut g = self.osd_reports.lock().unwrap_or_else(|p| p.into_inner());
        if g.as_ref().map(|r| r.term) != Some(view.term) {
            *g = Some(LeaderReports::new(view.term));
        }
        match g.as_mut() {
            Some(r) => f(r),
            None => unreachable!("set just above"),
        }
    }

    /// PG statistics for queries (the leader's; `None` elsewhere).
    fn pg_view(&self, view: &RaftView, map: &ClusterMap) -> Option<cairn_map::PgMapView> {
        if view.leader.as_ref().map(|(id, _)| *id) != Some(self.mon.id) {
            return None;
        }
        Some(self.with_reports(view, |r| r.view(Instant::now(), map)))
    }

    /// A beacon or failure report from an OSD (on the leader). A map
    /// change it settles is proposed in the background.
    async fn handle_report(
        &self,
        view: &RaftView,
        map: &ClusterMap,
        cmd: &MonCommand,
    ) -> Result<Reply, CommandFailure> {
        let decisions = self
            .with_reports(view, |r| r.handle(Instant::now(), map, cmd))
            .map_err(CommandFailure::Refused)?;
        for (i, change) in decisions.into_iter().enumerate() {
            // Each decision on the map as it is after the previous one.
            let map = match i {
                0 => map.clone(),
                _ => self
                    .mon
                    .read_local(|m| m.cloned())
                    .unwrap_or_else(|| map.clone()),
            };
            self.propose_decision(&map, change).await;
        }
        Ok(Reply::new("", serde_json::Value::Null))
    }

    /// Commits a change the monitors decided themselves (as this mon).
    async fn propose_decision(&self, map: &ClusterMap, cmd: MonCommand) {
        let me = EntityName::mon(&self.cfg.name);
        match self.propose_checked(&me, map, &cmd).await {
            Ok(reply) => tracing::info!("mon.{}: {}", self.cfg.name, reply.plain.trim()),
            Err(e) => tracing::warn!("mon.{}: {} failed: {e:?}", self.cfg.name, cmd.verb()),
        }
    }

    /// Every second on the leader: failures from missed beacons or stale
    /// reports, and down OSDs due to be marked out.
    async fn osd_judge_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(OSD_JUDGE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let view = self.mon.view();
            if view.leader.as_ref().map(|(id, _)| *id) != Some(self.mon.id) {
                *self.osd_reports.lock().unwrap_or_else(|p| p.into_inner()) = None;
                continue;
            }
            if self.quorum_ok(&view).is_err() {
                continue;
            }
            let Some(map) = self.mon.read_local(|m| m.cloned()) else {
                continue;
            };
            let changes = self.with_reports(&view, |r| r.tick(Instant::now(), &map));
            for cmd in changes {
                // Each decision on the map as it is after the previous one.
                let map = self
                    .mon
                    .read_local(|m| m.cloned())
                    .unwrap_or_else(|| map.clone());
                self.propose_decision(&map, cmd).await;
            }
        }
    }

    /// Raft membership part of `mon add` / `mon remove`.
    async fn membership_for(&self, cmd: &MonCommand) -> Result<(), CommandFailure> {
        match cmd {
            MonCommand::MonAdd { name, addr } => {
                let addr = addr
                    .parse::<SocketAddr>()
                    .map(|a| a.to_string())
                    .unwrap_or_else(|_| addr.clone());
                let peer = MonPeer {
                    name: name.clone(),
                    addr,
                };
                // The new mon's daemon must already run: probe it first so
                // the group never waits on a learner that is not there.
                let probe = Ping {
                    from: self.cfg.name.clone(),
                    wall_ms: wall_ms(),
                };
                if let Err(e) = self
                    .transport
                    .call(&peer, MSG_PING, encode(&probe), MON_PROBE_TIMEOUT)
                    .await
                {
                    return Err(CommandFailure::Refused(format!(
                        "cannot reach mon.{name} at {}: {e}; start its daemon first ('cairn join TOKEN --mon-ip IP --name {name}' on that node does both)",
                        peer.addr
                    )));
                }
                self.mon
                    .add_member(mon_id_for(name), peer, MEMBERSHIP_TIMEOUT)
                    .await
                    .map_err(|e| match e {
                        ProposeError::NoQuorum { .. } => CommandFailure::Refused(format!(
                            "mon.{name} did not catch up within {MEMBERSHIP_TIMEOUT:?}: is its daemon running and reachable? ({e})"
                        )),
                        other => propose_failure(other),
                    })
            }
            MonCommand::MonRemove { name } => self
                .mon
                .remove_member(mon_id_for(name), MEMBERSHIP_TIMEOUT)
                .await
                .map_err(propose_failure),
            _ => Ok(()),
        }
    }

    async fn serve_subscription(self: Arc<Self>, conn: Connection, first: Message, have: u64) {
        let mut rx = self.mon.subscribe_epochs();
        let update = self.map_update(have);
        let mut sent = match &update {
            MapUpdate::Full { epoch, .. } | MapUpdate::UpToDate { epoch } => *epoch,
            MapUpdate::Incrementals { incrementals, from } => {
                incrementals.last().map(|i| i.epoch.0).unwrap_or(*from)
            }
            MapUpdate::Unavailable(_) => have,
        };
        if conn
            .reply(&first, MSG_SUBSCRIBE, encode(&update))
            .await
            .is_err()
        {
            return;
        }
        loop {
            if rx.changed().await.is_err() || conn.is_closed() {
                return;
            }
            let now = *rx.borrow_and_update();
            if now <= sent {
                continue;
            }
            let update = self.map_update(sent);
            if let MapUpdate::Full { epoch, .. } = &update {
                sent = *epoch;
            } else if let MapUpdate::Incrementals { incrementals, .. } = &update {
                sent = incrementals.last().map(|i| i.epoch.0).unwrap_or(sent);
            }
            if conn.send(MSG_MAP_UPDATE, encode(&update)).await.is_err() {
                return;
            }
        }
    }

    fn map_update(&self, have: u64) -> MapUpdate {
        match self.mon.catchup(have) {
            Ok(Catchup::UpToDate { epoch }) => MapUpdate::UpToDate { epoch },
            Ok(Catchup::Full { epoch, state }) => MapUpdate::Full { epoch, map: state },
            Ok(Catchup::NoMap) => MapUpdate::Unavailable("this mon has no map yet".into()),
            Ok(Catchup::Incrementals { from, to, commands }) => {
                let mut incs = Vec::new();
                for (i, c) in commands.iter().enumerate() {
                    match incremental_from_log(from + 1 + i as u64, c) {
                        Ok(inc) => incs.push(inc),
                        Err(e) => return MapUpdate::Unavailable(e),
                    }
                }
                debug_assert_eq!(incs.last().map(|i| i.epoch.0), Some(to));
                MapUpdate::Incrementals {
                    from,
                    incrementals: incs,
                }
            }
            Err(e) => MapUpdate::Unavailable(e.to_string()),
        }
    }

    async fn ping_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(MON_PING_INTERVAL);
        let mut warned_removed: u64 = 0;
        loop {
            tick.tick().await;
            let view = self.mon.view();
            self.quorum_age(&view);
            let member =
                view.voters.contains_key(&self.mon.id) || view.learners.contains_key(&self.mon.id);
            if !member && !view.voters.is_empty() {
                warned_removed += 1;
                if warned_removed % 60 == 1 {
                    tracing::warn!(
                        "mon.{} is not in the monitor group any more (removed); stop this daemon with 'cairn daemon stop'",
                        self.cfg.name
                    );
                }
            }
            let peers: Vec<MonPeer> = view
                .voters
                .values()
                .chain(view.learners.values())
                .filter(|p| p.name != self.cfg.name)
                .cloned()
                .collect();
            for p in peers {
                let svc = self.clone();
                tokio::spawn(async move { svc.ping(p).await });
            }
        }
    }

    async fn ping(&self, peer: MonPeer) {
        let t0_wall = wall_ms();
        let t0 = Instant::now();
        let ping = Ping {
            from: self.cfg.name.clone(),
            wall_ms: t0_wall,
        };
        let Ok(m) = self
            .transport
            .call(&peer, MSG_PING, encode(&ping), MON_PING_INTERVAL)
            .await
        else {
            return;
        };
        let rtt_ms = t0.elapsed().as_millis() as i64;
        if let Ok(pong) = decode::<Pong>("pong", &m.payload) {
            let offset = pong.wall_ms - (t0_wall + rtt_ms / 2);
            self.note_seen(&peer.name, Some((rtt_ms, offset)));
        }
    }

    /// A mon without membership asks the others to add it, until it is in.
    async fn join_loop(self: Arc<Self>) {
        let mut delay = Duration::from_millis(200);
        while !self.mon.is_initialized().await {
            let req = JoinRequest {
                name: self.cfg.name.clone(),
                addr: self.cfg.addr.to_string(),
            };
            let mut targets: Vec<String> = self
                .cfg
                .join_via
                .iter()
                .filter(|a| **a != self.cfg.addr)
                .map(|a| a.to_string())
                .collect();
            let mut tried = 0;
            while let Some(addr) = targets.pop() {
                tried += 1;
                if tried > 16 {
                    break;
                }
                let peer = MonPeer {
                    name: String::new(),
                    addr: addr.clone(),
                };
                match self.join_once(&peer, &req).await {
                    Ok(None) => return,
                    Ok(Some(leader)) => targets.push(leader),
                    Err(e) => tracing::info!("mon.{}: join via {addr}: {e}", self.cfg.name),
                }
                if self.mon.is_initialized().await {
                    return;
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }

    /// Ok(None): joined; Ok(Some(addr)): ask the leader at addr.
    async fn join_once(&self, peer: &MonPeer, req: &JoinRequest) -> Result<Option<String>, String> {
        // The peer's name is unknown here: connect without pinning it.
        let addr: SocketAddr = peer.addr.parse().map_err(|_| "bad address".to_string())?;
        let cfg = MsgConfig {
            connect_timeout: Duration::from_secs(2),
            ..MsgConfig::default()
        };
        let c = connect(addr, &self.transport.creds, None, &cfg)
            .await
            .map_err(|e| e.to_string())?;
        let m = c
            .call(
                MSG_JOIN,
                encode(req),
                MEMBERSHIP_TIMEOUT + Duration::from_secs(5),
            )
            .await
            .map_err(|e| e.to_string())?;
        c.close();
        let resp: CommandResponse = decode("join reply", &m.payload)?;
        match resp.result {
            Ok(_) => {
                tracing::info!(
                    "mon.{} joined the monitor group via {}",
                    self.cfg.name,
                    peer.addr
                );
                Ok(None)
            }
            Err(CommandFailure::NotLeader {
                leader_addr: Some(a),
                ..
            }) => Ok(Some(a)),
            Err(f) => Err(format!("{f:?}")),
        }
    }

    /// Keeps `mon_host` in this node's cairn.conf equal to the map's mons.
    async fn conf_loop(self: Arc<Self>) {
        let Some(path) = self.cfg.conf_path.clone() else {
            return;
        };
        let mut rx = self.mon.subscribe_epochs();
        loop {
            let addrs: Vec<String> = self.mon.read_local(|m| {
                m.map(|m| m.mons.iter().map(|x| x.addr.clone()).collect())
                    .unwrap_or_default()
            });
            if !addrs.is_empty() {
                if let Err(e) = update_conf_mon_host(&path, &addrs) {
                    tracing::warn!("cannot update {}: {e}", path.display());
                }
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }
}

/// Rewrites `mon_host` in a cairn.conf (temp file + fsync + rename) when it
/// differs from `addrs`.
pub fn update_conf_mon_host(path: &std::path::Path, addrs: &[String]) -> anyhow::Result<()> {
    let mut conf = Conf::load(path)?;
    let want = addrs.join(",");
    if conf.get_in("global", "mon_host") == Some(want.as_str()) {
        return Ok(());
    }
    conf.set("global", "mon_host", want);
    write_file_atomic(path, conf.to_text().as_bytes(), 0o644)
}

/// Writes a file via temp file + fsync + rename, with the given mode.
pub fn write_file_atomic(path: &std::path::Path, data: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

fn not_leader(view: &RaftView) -> CommandFailure {
    CommandFailure::NotLeader {
        leader_name: view.leader.as_ref().map(|(_, p)| p.name.clone()),
        leader_addr: view.leader.as_ref().map(|(_, p)| p.addr.clone()),
    }
}

fn propose_failure(e: ProposeError) -> CommandFailure {
    match e {
        ProposeError::NotLeader { leader } => CommandFailure::NotLeader {
            leader_name: leader.as_ref().map(|(_, p)| p.name.clone()),
            leader_addr: leader.map(|(_, p)| p.addr),
        },
        ProposeError::NoQuorum { .. } => CommandFailure::NoQuorum(e.to_string()),
        other => CommandFailure::Refused(other.to_string()),
    }
}
