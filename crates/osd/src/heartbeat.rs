//! OSD-to-OSD heartbeats and failure reports. Each OSD pings the OSDs it
//! shares PGs with, plus its nearest up neighbours by id (so an OSD without
//! PGs is still watched), every `osd_heartbeat_interval`. A peer that has
//! left a ping unanswered for `osd_heartbeat_grace` (counted from the
//! oldest ping sent since its last answer, as Ceph does) is reported
//! failed to the monitors, again every interval while it stays silent; the
//! report is withdrawn as soon as it answers. Only this process's
//! monotonic clock is used.
//!
//! Heartbeats must not mistake a busy OSD for a dead one, so:
//! - they run on a thread of their own ([`HbThread`]: its own
//!   single-threaded runtime, its own listener and connections, address
//!   `addrs[1]` in the map), never queued behind replication traffic or
//!   PG work on the data-path runtime;
//! - a late answer still answers its ping (and every older one): a ping
//!   waits for its answer up to the grace, not just an interval;
//! - a tracker that was itself not scheduled for a while
//!   ([`stall_limit`]) does not count that time as the peers' silence.
//!
//! The heartbeat thread stops answering when the OSD's data-path runtime
//! has made no progress for [`HB_DATA_PATH_STALL_MAX`], so a wedged OSD is
//! still reported, and ends at once when the OSD stops itself (fail-stop
//! after its own store failed a commit).
//!
//! [`HeartbeatTracker`] is the pure state machine (events in, actions out);
//! [`HbThread`] is the edge that sends pings, answers them and reports.
//! Owns neither the monitors' judgement (`cairn_map::FailureJudge`) nor PG
//! state.

use crate::auth::{is_peer_osd, MapKeys};
use crate::runtime::{MapSource, MonRequests, Shared};
use cairn_map::{ClusterMap, MonCommand};
use cairn_msg::{connect, Connection, Credentials, Listener, Message, MsgConfig, Secret};
use cairn_ops::{decode, encode};
use cairn_types::{EntityName, Epoch};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// Heartbeat ping: [`HbPing`] -> [`HbPong`] (type [`MSG_HB_PONG`]). In the
/// OSD range next to cairn-ops' message types.
pub const MSG_HB_PING: u16 = 0x0580;
pub const MSG_HB_PONG: u16 = 0x0581;
/// How often the tracker looks at its peers (failures are noticed within
/// this of the grace running out).
pub const HB_TICK: Duration = Duration::from_millis(250);
/// Neighbours by id watched on each side, besides PG peers.
pub const HB_NEIGHBOURS_EACH_SIDE: usize = 1;
/// Longest a connect to a peer may take before the ping counts as lost.
pub const HB_CONNECT_TIMEOUT_MAX: Duration = Duration::from_secs(2);
/// Unanswered pings remembered per peer, at most (the oldest counts).
pub const HB_UNANSWERED_MAX: usize = 64;
/// The heartbeat thread stops answering pings once the OSD's data path
/// (its main runtime) has not run for this long: peers then report it.
pub const HB_DATA_PATH_STALL_MAX: Duration = Duration::from_secs(20);
/// Bound on starting the heartbeat thread (binding its listener).
const HB_START_TIMEOUT: Duration = Duration::from_secs(10);

/// A tracker not ticked for longer than this was not running (CPU
/// starvation, a stopped process): the silence it could not observe is
/// not held against its peers. A third of the grace, at least 4 ticks.
pub fn stall_limit(grace: Duration) -> Duration {
    (grace / 3).max(HB_TICK * 4)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HbPing {
    pub from: i32,
    pub epoch: Epoch,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HbPong {
    pub from: i32,
    pub epoch: Epoch,
}

/// What the tracker wants done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HbAction {
    Ping(i32),
    /// Tell the monitors `target` failed (`failed`) or answers again.
    Report {
        target: i32,
        failed: bool,
    },
}

#[derive(Debug, Clone)]
struct PeerState {
    /// The peer's `up_from`: a new boot restarts its bookkeeping.
    up_from: Epoch,
    /// When each ping not answered yet was sent, oldest first: the grace
    /// runs from the front.
    unanswered: VecDeque<Instant>,
    last_ping: Option<Instant>,
    /// When we last reported it failed (`None` = not reported).
    reported_at: Option<Instant>,
}

/// Per-peer heartbeat bookkeeping of one OSD.
#[derive(Debug, Clone)]
pub struct HeartbeatTracker {
    peers: BTreeMap<i32, PeerState>,
    /// The previous tick: a long gap since means this tracker was stalled.
    last_tick: Option<Instant>,
    /// The last stall noticed (for the edge to log), until taken.
    stall: Option<Duration>,
}

impl HeartbeatTracker {
    pub fn new() -> HeartbeatTracker {
        HeartbeatTracker {
            peers: BTreeMap::new(),
            last_tick: None,
            stall: None,
        }
    }

    /// The peers to watch now (id -> `up_from`). New or rebooted peers start
    /// afresh; dropped peers that were reported get their report withdrawn.
    pub fn set_peers(&mut self, want: &BTreeMap<i32, Epoch>) -> Vec<HbAction> {
        let mut out = Vec::new();
        let gone: Vec<i32> = self
            .peers
            .keys()
            .filter(|p| !want.contains_key(p))
            .copied()
            .collect();
        for p in gone {
            if let Some(st) = self.peers.remove(&p) {
                if st.reported_at.is_some() {
                    out.push(HbAction::Report {
                        target: p,
                        failed: false,
                    });
                }
            }
        }
        for (&p, &up_from) in want {
            let fresh = PeerState {
                up_from,
                unanswered: VecDeque::new(),
                last_ping: None,
                reported_at: None,
            };
            match self.peers.get_mut(&p) {
                Some(st) if st.up_from == up_from => {}
                Some(st) => *st = fresh,
                None => {
                    self.peers.insert(p, fresh);
                }
            }
        }
        out
    }

    /// `peer` answered: every ping sent so far counts as answered.
    pub fn on_reply(&mut self, peer: i32) -> Vec<HbAction> {
        self.answered(peer, None)
    }

    /// `peer` answered the ping sent at `sent`: that ping and every older
    /// one count as answered, however late the answer came.
    pub fn on_pong(&mut self, peer: i32, sent: Instant) -> Vec<HbAction> {
        self.answered(peer, Some(sent))
    }

    fn answered(&mut self, peer: i32, upto: Option<Instant>) -> Vec<HbAction> {
        let Some(st) = self.peers.get_mut(&peer) else {
            return Vec::new();
        };
        match upto {
            None => st.unanswered.clear(),
            Some(t) => {
                while st.unanswered.front().is_some_and(|s| *s <= t) {
                    st.unanswered.pop_front();
                }
            }
        }
        if st.reported_at.take().is_some() {
            return vec![HbAction::Report {
                target: peer,
                failed: false,
            }];
        }
        Vec::new()
    }

    /// Pings due every `interval`; a failure report once a ping has gone
    /// unanswered for `grace`, repeated every `interval` while the silence
    /// lasts. After a gap of more than [`stall_limit`] since the previous
    /// tick, the gap is added to every unanswered ping's age allowance (this
    /// OSD could not have seen answers while it did not run) and nothing is
    /// reported on this tick.
    pub fn tick(&mut self, now: Instant, interval: Duration, grace: Duration) -> Vec<HbAction> {
        let mut out = Vec::new();
        let gap = self
            .last_tick
            .map(|t| now.saturating_duration_since(t))
            .filter(|g| *g > stall_limit(grace));
        self.last_tick = Some(now);
        if let Some(g) = gap {
            self.stall = Some(g);
        }
        for (&p, st) in self.peers.iter_mut() {
            if let Some(g) = gap {
                for t in st.unanswered.iter_mut() {
                    *t = t.checked_add(g).map_or(now, |s| s.min(now));
                }
            }
            if st
                .last_ping
                .is_none_or(|t| now.saturating_duration_since(t) >= interval)
            {
                st.last_ping = Some(now);
                if st.unanswered.len() >= HB_UNANSWERED_MAX {
                    // Keep the oldest (the grace runs from it); forget the newest.
                    st.unanswered.pop_back();
                }
                st.unanswered.push_back(now);
                out.push(HbAction::Ping(p));
            }
            if gap.is_none()
                && st
                    .unanswered
                    .front()
                    .is_some_and(|t| now.saturating_duration_since(*t) > grace)
                && st
                    .reported_at
                    .is_none_or(|t| now.saturating_duration_since(t) >= interval)
            {
                st.reported_at = Some(now);
                out.push(HbAction::Report {
                    target: p,
                    failed: true,
                });
            }
        }
        out
    }

    /// The last stall [`Self::tick`] noticed, once (for logging).
    pub fn take_stall(&mut self) -> Option<Duration> {
        self.stall.take()
    }

    /// Peers currently reported failed.
    pub fn reported(&self) -> Vec<i32> {
        self.peers
            .iter()
            .filter(|(_, s)| s.reported_at.is_some())
            .map(|(p, _)| *p)
            .collect()
    }

    pub fn peers(&self) -> Vec<i32> {
        self.peers.keys().copied().collect()
    }
}

impl Default for HeartbeatTracker {
    fn default() -> Self {
        HeartbeatTracker::new()
    }
}

/// The up OSDs `me` must watch on `map` (id -> `up_from`): every OSD in an
/// up set with `me`, plus the nearest up OSDs by id on each side.
pub fn heartbeat_peers(map: &ClusterMap, me: i32) -> BTreeMap<i32, Epoch> {
    let mut ids: BTreeSet<i32> = BTreeSet::new();
    for (pid, pool) in &map.pools {
        for seed in 0..pool.pg_num {
            let Ok(m) = map.pg_to_up(*pid, seed) else {
                continue;
            };
            if m.up.contains(&me) || m.acting.contains(&me) {
                ids.extend(m.up.iter().chain(&m.acting).copied().filter(|o| *o >= 0));
            }
        }
    }
    // Other up OSDs in id order; `pos` is where `me` would sit.
    let up: Vec<i32> = map
        .osds
        .values()
        .filter(|o| o.up && o.id != me)
        .map(|o| o.id)
        .collect();
    let n = up.len();
    let pos = up.iter().position(|o| *o > me).unwrap_or(n);
    for k in 0..HB_NEIGHBOURS_EACH_SIDE.min(n) {
        ids.insert(up[(pos + k) % n]);
        ids.insert(up[(pos + n - 1 - k) % n]);
    }
    ids.remove(&me);
    ids.into_iter()
        .filter_map(|o| map.osds.get(&o).filter(|i| i.up).map(|i| (o, i.up_from)))
        .collect()
}

/// Where to ping `osd`: its heartbeat address (`addrs[1]`) when it
/// registered one, else its data address.
pub fn heartbeat_addr(map: &ClusterMap, osd: i32) -> Option<String> {
    let o = map.osds.get(&osd)?;
    o.addrs.get(1).or(o.addrs.first()).cloned()
}

fn secs_cfg(map: &ClusterMap, me: i32, key: &str, default: u64) -> Duration {
    let v = map
        .config_value(&format!("osd.{me}"), key)
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(default);
    Duration::from_secs(v.max(1))
}

/// Answers a heartbeat ping that came on the data address (from a peer
/// that knows no heartbeat address of ours).
pub(crate) async fn answer_ping(shared: &Arc<Shared>, conn: &Connection, msg: Message) {
    let pong = HbPong {
        from: shared.cfg.id,
        epoch: shared.map_rx.borrow().epoch,
    };
    let _ = conn.reply(&msg, MSG_HB_PONG, encode(&pong)).await;
}

/// Progress stamps of the OSD's data-path runtime, read by the heartbeat
/// thread: milliseconds since `base` of the last stamp.
pub(crate) struct DataPathLiveness {
    base: Instant,
    last_ms: AtomicU64,
}

impl DataPathLiveness {
    fn new() -> DataPathLiveness {
        DataPathLiveness {
            base: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }
    fn stamp(&self) {
        let ms = self.base.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }
    /// How long the data path has not stamped.
    fn silent_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.base.elapsed().saturating_sub(last)
    }
}

/// Stamps `alive` every tick while the data-path runtime runs.
pub(crate) async fn stamp_data_path(alive: Arc<DataPathLiveness>) {
    let mut tick = tokio::time::interval(HB_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        alive.stamp();
    }
}

/// What the heartbeat thread needs of its OSD (not the store: a stopping
/// OSD's store must not wait for this thread).
#[derive(Clone)]
struct HbCtx {
    id: i32,
    secret: Secret,
    msg: MsgConfig,
    map_rx: MapSource,
    alive: Arc<DataPathLiveness>,
    /// Set when the OSD stops itself (fail-stop): the thread ends at once,
    /// so peers see the silence within one grace period.
    failed: watch::Receiver<Option<String>>,
}

/// The heartbeat thread of one running OSD: its own current-thread tokio
/// runtime with the heartbeat listener, the ping connections to peers and
/// the tracker. Stopped (and joined) by [`HbThread::stop`] or on drop;
/// its runtime's end closes every heartbeat connection.
pub(crate) struct HbThread {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl HbThread {
    /// Starts the heartbeat thread of `shared`'s OSD: binds its listener on
    /// the data listener's IP (port chosen by the system), reports failures
    /// through `mon`, and has the data-path runtime (the caller's) stamp
    /// its progress.
    pub(crate) async fn start(
        shared: &Arc<Shared>,
        keys: Arc<MapKeys>,
        mon: MonRequests,
    ) -> Result<HbThread, String> {
        let id = shared.cfg.id;
        let alive = Arc::new(DataPathLiveness::new());
        shared.tasks_spawn(stamp_data_path(alive.clone()));
        let ctx = HbCtx {
            id,
            secret: shared.cfg.secret.clone(),
            msg: shared.cfg.msg.clone(),
            map_rx: shared.map_rx.clone(),
            alive,
            failed: shared.failed.subscribe(),
        };
        let bind = SocketAddr::new(shared.cfg.bind_addr.ip(), 0);
        let (stop, stop_rx) = watch::channel(false);
        let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(format!("osd{id}-hb"))
            .spawn(move || thread_main(ctx, bind, keys, mon, stop_rx, addr_tx))
            .map_err(|e| format!("osd.{id}: starting the heartbeat thread: {e}"))?;
        let addr = match tokio::time::timeout(HB_START_TIMEOUT, addr_rx).await {
            Ok(Ok(Ok(a))) => a,
            Ok(Ok(Err(e))) => return Err(e),
            Ok(Err(_)) => return Err(format!("osd.{id}: the heartbeat thread ended at start")),
            Err(_) => {
                let _ = stop.send(true);
                return Err(format!(
                    "osd.{id}: the heartbeat thread did not start within {HB_START_TIMEOUT:?}"
                ));
            }
        };
        Ok(HbThread {
            addr,
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The heartbeat listener's address (register it as `addrs[1]`).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Ends the thread and waits for it (every heartbeat connection closes).
    pub(crate) fn stop(&self) {
        let _ = self.stop.send(true);
        let t = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = t {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for HbThread {
    fn drop(&mut self) {
        self.stop();
    }
}

fn thread_main(
    ctx: HbCtx,
    bind: SocketAddr,
    keys: Arc<MapKeys>,
    mon: MonRequests,
    mut stop: watch::Receiver<bool>,
    addr_tx: tokio::sync::oneshot::Sender<Result<SocketAddr, String>>,
) {
    let id = ctx.id;
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = addr_tx.send(Err(format!("osd.{id}: heartbeat runtime: {e}")));
            return;
        }
    };
    rt.block_on(async move {
        let listener = match Listener::bind(bind, EntityName::osd(id), keys, ctx.msg.clone()).await
        {
            Ok(l) => l,
            Err(e) => {
                let _ = addr_tx.send(Err(format!(
                    "osd.{id}: binding the heartbeat listener on {bind}: {e}"
                )));
                return;
            }
        };
        if addr_tx.send(Ok(listener.local_addr())).is_err() {
            return;
        }
        let mut failed = ctx.failed.clone();
        tokio::select! {
            _ = accept_pings(ctx.clone(), listener) => {}
            _ = run(ctx, mon) => {}
            _ = stop.wait_for(|s| *s) => {}
            _ = failed.wait_for(|f| f.is_some()) => {}
        }
    });
    // Dropping the runtime ends its tasks and closes their connections.
    drop(rt);
}

/// Serves the heartbeat listener: answers pings from peer OSDs while the
/// data path is alive.
async fn accept_pings(ctx: HbCtx, listener: Listener) {
    loop {
        let conn = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("osd.{}: heartbeat listener stopped: {e}", ctx.id);
                return;
            }
        };
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let peer_ok = is_peer_osd(&ctx.map_rx.borrow(), conn.peer()).is_some();
            if !peer_ok {
                tracing::warn!(
                    "osd.{}: {} is not a peer OSD; closing its heartbeat connection",
                    ctx.id,
                    conn.peer_label()
                );
                conn.close();
                return;
            }
            let mut wedged_logged = false;
            while let Ok(msg) = conn.recv().await {
                if msg.msg_type != MSG_HB_PING {
                    tracing::warn!(
                        "osd.{}: message type {:#x} from {} on the heartbeat listener; ignored",
                        ctx.id,
                        msg.msg_type,
                        conn.peer_label()
                    );
                    continue;
                }
                let silent = ctx.alive.silent_for();
                if silent > HB_DATA_PATH_STALL_MAX {
                    if !wedged_logged {
                        tracing::warn!(
                            "osd.{}: data path made no progress for {:.1} s; not answering heartbeats from {}",
                            ctx.id,
                            silent.as_secs_f64(),
                            conn.peer_label()
                        );
                        wedged_logged = true;
                    }
                    continue;
                }
                wedged_logged = false;
                let pong = HbPong {
                    from: ctx.id,
                    epoch: ctx.map_rx.borrow().epoch,
                };
                let _ = conn.reply(&msg, MSG_HB_PONG, encode(&pong)).await;
            }
        });
    }
}

/// Heartbeat connections to peers: (address it was made to, connection).
type HbConns = Arc<Mutex<BTreeMap<i32, (String, Connection)>>>;

/// The tracker loop: follows the map, pings peers and sends failure
/// reports through `mon`.
async fn run(ctx: HbCtx, mon: MonRequests) {
    let me = ctx.id;
    let mut tracker = HeartbeatTracker::new();
    // (peer, send time of the ping it answered)
    let (reply_tx, mut reply_rx) = mpsc::channel::<(i32, Instant)>(1024);
    let conns: HbConns = Arc::default();
    // Peers a connect is under way to (one at a time per peer).
    let connecting: Arc<Mutex<BTreeSet<i32>>> = Arc::default();
    let mut map_rx = ctx.map_rx.clone();
    let mut seen_epoch = Epoch(0);
    let mut tick = tokio::time::interval(HB_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let mut acts = Vec::new();
        tokio::select! {
            _ = tick.tick() => {}
            Some((p, sent)) = reply_rx.recv() => acts.extend(tracker.on_pong(p, sent)),
            r = map_rx.changed() => if r.is_err() { return },
        }
        // Answers already here count before any silence is judged.
        while let Ok((p, sent)) = reply_rx.try_recv() {
            acts.extend(tracker.on_pong(p, sent));
        }
        let map = ctx.map_rx.borrow().clone();
        let now = Instant::now();
        if map.epoch != seen_epoch {
            seen_epoch = map.epoch;
            let peers = if map.osds.get(&me).is_some_and(|o| o.up) {
                heartbeat_peers(&map, me)
            } else {
                // Marked down: our reports would not count; watch nobody.
                BTreeMap::new()
            };
            acts.extend(tracker.set_peers(&peers));
            // Close connections to peers no longer watched.
            lock(&conns).retain(|p, (_, c)| {
                let keep = peers.contains_key(p);
                if !keep {
                    c.close();
                }
                keep
            });
        }
        let interval = secs_cfg(&map, me, "osd_heartbeat_interval", 6);
        let grace = secs_cfg(&map, me, "osd_heartbeat_grace", 20);
        acts.extend(tracker.tick(now, interval, grace));
        if let Some(g) = tracker.take_stall() {
            tracing::warn!(
                "osd.{me}: heartbeat thread did not run for {:.1} s (CPU starvation?); peers' silence during it is not held against them",
                g.as_secs_f64()
            );
        }
        for a in acts {
            match a {
                HbAction::Ping(p) => {
                    let Some(addr) = heartbeat_addr(&map, p) else {
                        continue;
                    };
                    let cached = lock(&conns)
                        .get(&p)
                        .filter(|(a, c)| *a == addr && !c.is_closed())
                        .map(|(_, c)| c.clone());
                    if cached.is_none() && !lock(&connecting).insert(p) {
                        // A connect is under way: this ping stays unanswered.
                        continue;
                    }
                    let (ctx, conns, connecting, reply) = (
                        ctx.clone(),
                        conns.clone(),
                        connecting.clone(),
                        reply_tx.clone(),
                    );
                    tokio::spawn(async move {
                        let conn = match cached {
                            Some(c) => Some(c),
                            None => {
                                let c = connect_peer(&ctx, &conns, p, addr, grace).await;
                                lock(&connecting).remove(&p);
                                c
                            }
                        };
                        if let Some(conn) = conn {
                            if ping(&ctx, &conns, &conn, p, grace).await {
                                let _ = reply.send((p, now)).await;
                            }
                        }
                    });
                }
                HbAction::Report { target, failed } => {
                    if failed {
                        tracing::warn!(
                            "osd.{me}: osd.{target} has not answered heartbeats for {grace:?}; reporting it failed"
                        );
                    } else {
                        tracing::info!(
                            "osd.{me}: osd.{target} answers again; withdrawing the failure report"
                        );
                    }
                    let cmd = MonCommand::OsdFailureReport {
                        id: me,
                        target,
                        failed,
                    };
                    if mon.try_send(cmd).is_err() {
                        tracing::warn!("osd.{me}: monitor request queue full; failure report about osd.{target} dropped (resent next interval)");
                    }
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A new heartbeat connection to `peer` at `addr`, cached in `conns`.
async fn connect_peer(
    ctx: &HbCtx,
    conns: &HbConns,
    peer: i32,
    addr: String,
    grace: Duration,
) -> Option<Connection> {
    // A cached connection to an old address (or a closed one) goes.
    if let Some((_, old)) = lock(conns).remove(&peer) {
        old.close();
    }
    let sa: SocketAddr = addr.parse().ok()?;
    let cfg = MsgConfig {
        connect_timeout: grace.min(HB_CONNECT_TIMEOUT_MAX),
        handshake_timeout: grace.min(HB_CONNECT_TIMEOUT_MAX),
        ..ctx.msg.clone()
    };
    let creds = Credentials::Key {
        name: EntityName::osd(ctx.id),
        secret: ctx.secret.clone(),
    };
    match connect(sa, &creds, Some(&EntityName::osd(peer)), &cfg).await {
        Ok(c) => {
            // Nothing but answers is expected; drain anything else so the
            // connection notices its end.
            let d = c.clone();
            tokio::spawn(async move { while d.recv().await.is_ok() {} });
            lock(conns).insert(peer, (addr, c.clone()));
            Some(c)
        }
        Err(e) => {
            tracing::debug!("osd.{}: heartbeat connect to osd.{peer}: {e}", ctx.id);
            None
        }
    }
}

/// One ping to `peer` on `conn`; true if it answered within `timeout`
/// (the grace: a late answer still answers).
async fn ping(
    ctx: &HbCtx,
    conns: &HbConns,
    conn: &Connection,
    peer: i32,
    timeout: Duration,
) -> bool {
    let msg = HbPing {
        from: ctx.id,
        epoch: ctx.map_rx.borrow().epoch,
    };
    match conn.call(MSG_HB_PING, encode(&msg), timeout).await {
        Ok(m) => {
            m.msg_type == MSG_HB_PONG
                && decode::<HbPong>("heartbeat pong", &m.payload).is_ok_and(|p| p.from == peer)
        }
        Err(e) => {
            if e.is_connection_error() {
                let mut g = lock(conns);
                if g.get(&peer).is_some_and(|(_, c)| c.is_closed()) {
                    g.remove(&peer);
                }
                conn.close();
            }
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ticks every [`HB_TICK`] after `from` up to `to` (and at `to`).
    fn ticks(
        t: &mut HeartbeatTracker,
        from: Instant,
        to: Instant,
        interval: Duration,
        grace: Duration,
    ) -> Vec<HbAction> {
        let mut out = Vec::new();
        let mut now = from;
        while now < to {
            now = (now + HB_TICK).min(to);
            out.extend(t.tick(now, interval, grace));
        }
        out
    }

    fn peers(v: &[(i32, u64)]) -> BTreeMap<i32, Epoch> {
        v.iter().map(|(p, e)| (*p, Epoch(*e))).collect()
    }

    #[test]
    fn silent_peer_is_reported_after_grace_and_withdrawn_on_reply() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let (interval, grace) = (s, 3 * s);
        let mut t = HeartbeatTracker::new();
        assert!(t.set_peers(&peers(&[(1, 5), (2, 5)])).is_empty());
        let a = t.tick(t0, interval, grace);
        assert_eq!(a, vec![HbAction::Ping(1), HbAction::Ping(2)]);
        // osd.1 answers, osd.2 stays silent.
        for k in 1..=3 {
            t.on_reply(1);
            let a = t.tick(t0 + s * k, interval, grace);
            assert!(
                !a.iter().any(|x| matches!(x, HbAction::Report { .. })),
                "{a:?}"
            );
        }
        let a = t.tick(t0 + s * 3 + Duration::from_millis(10), interval, grace);
        assert!(
            a.contains(&HbAction::Report {
                target: 2,
                failed: true
            }),
            "{a:?}"
        );
        assert_eq!(t.reported(), vec![2]);
        // Not repeated before another interval, repeated after.
        let a = t.tick(t0 + s * 3 + Duration::from_millis(500), interval, grace);
        assert!(!a.iter().any(|x| matches!(x, HbAction::Report { .. })));
        let a = t.tick(t0 + s * 4 + Duration::from_millis(20), interval, grace);
        assert!(a.contains(&HbAction::Report {
            target: 2,
            failed: true
        }));
        // It answers: the report is withdrawn once.
        let a = t.on_reply(2);
        assert_eq!(
            a,
            vec![HbAction::Report {
                target: 2,
                failed: false
            }]
        );
        assert!(t.on_reply(2).is_empty());
        assert!(t.reported().is_empty());
    }

    #[test]
    fn a_late_answer_answers_its_ping_and_older_ones() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let (interval, grace) = (s, 3 * s);
        let mut t = HeartbeatTracker::new();
        t.set_peers(&peers(&[(1, 5)]));
        // Pings at 0, 1, 2, 3 s (ticks every 250 ms); the answer to the
        // first arrives at 2.9 s, 2.9 s late.
        let mut now = t0;
        while now < t0 + Duration::from_millis(2900) {
            t.tick(now, interval, grace);
            now += HB_TICK;
        }
        t.on_pong(1, t0);
        // The grace now runs from the ping sent at 1 s: no report at 3.5 s.
        let mut now = t0 + Duration::from_millis(3000);
        while now <= t0 + Duration::from_millis(3900) {
            let a = t.tick(now, interval, grace);
            assert!(
                !a.iter().any(|x| matches!(x, HbAction::Report { .. })),
                "{a:?} at {:?}",
                now - t0
            );
            now += HB_TICK;
        }
        // Nothing answered since: reported once the ping of 1 s is 3 s old.
        let a = t.tick(t0 + Duration::from_millis(4100), interval, grace);
        assert!(
            a.contains(&HbAction::Report {
                target: 1,
                failed: true
            }),
            "{a:?}"
        );
    }

    #[test]
    fn a_stalled_tracker_does_not_blame_its_peers() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let (interval, grace) = (s, 3 * s);
        let mut t = HeartbeatTracker::new();
        t.set_peers(&peers(&[(1, 5)]));
        assert_eq!(t.tick(t0, interval, grace), vec![HbAction::Ping(1)]);
        // This OSD does not run for 5 s (its answers may be waiting).
        let a = t.tick(t0 + 5 * s, interval, grace);
        assert!(
            !a.iter().any(|x| matches!(x, HbAction::Report { .. })),
            "{a:?}"
        );
        assert_eq!(t.take_stall(), Some(5 * s));
        assert_eq!(t.take_stall(), None);
        // Silence it can observe still counts: ticking normally, a peer
        // that never answers is reported within grace + a tick.
        let mut now = t0 + 5 * s;
        let mut reported_at = None;
        while now < t0 + 10 * s {
            now += HB_TICK;
            let a = t.tick(now, interval, grace);
            if a.iter()
                .any(|x| matches!(x, HbAction::Report { failed: true, .. }))
            {
                reported_at = Some(now - (t0 + 5 * s));
                break;
            }
        }
        let at = reported_at.expect("never reported");
        assert!(at > grace && at <= grace + 2 * HB_TICK, "{at:?}");
    }

    #[test]
    fn pgless_osds_watch_their_neighbours_by_id() {
        let mut map = cairn_map::ClusterMap::new_cluster(
            "5afc28eb-61b3-45f1-b441-6f913fd70505",
            cairn_map::MonInfo {
                name: "a".into(),
                addr: "127.0.0.1:1".into(),
                rank: 0,
            },
            cairn_map::AuthEntity::new(&[1; 32], &[("mon", "allow *")]),
        );
        let ctx = cairn_map::ApplyContext {
            caller: EntityName::client("admin"),
            generated_secret: None,
        };
        for i in 0..4 {
            let uuid = format!("00000000-0000-0000-0000-{i:012x}");
            let r = map
                .apply(
                    &MonCommand::OsdNew {
                        uuid: uuid.clone(),
                        id: None,
                        host: format!("h{i}"),
                        weight: 1.0,
                        class: None,
                    },
                    &ctx,
                )
                .expect("osd new");
            let id = r.json["osdid"].as_i64().expect("id") as i32;
            map.apply(
                &MonCommand::OsdBoot {
                    id,
                    uuid,
                    addrs: vec![format!("127.0.0.1:{}", 7000 + id)],
                    reported: cairn_map::OsdReported::default(),
                },
                &ctx,
            )
            .expect("boot");
        }
        // No pools: only neighbours, wrapping around.
        let ids = |m: &ClusterMap, me| heartbeat_peers(m, me).into_keys().collect::<Vec<_>>();
        assert_eq!(ids(&map, 0), vec![1, 3]);
        assert_eq!(ids(&map, 2), vec![1, 3]);
        assert_eq!(ids(&map, 3), vec![0, 2]);
        map.apply(&MonCommand::OsdDown { ids: vec![1] }, &ctx)
            .expect("down");
        assert_eq!(ids(&map, 0), vec![2, 3], "down OSDs are skipped");
    }

    #[test]
    fn peer_set_changes_reset_or_withdraw() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut t = HeartbeatTracker::new();
        t.set_peers(&peers(&[(1, 5)]));
        assert_eq!(t.tick(t0, s, 3 * s), vec![HbAction::Ping(1)]);
        let a = ticks(&mut t, t0, t0 + s * 5, s, 3 * s);
        assert!(a.contains(&HbAction::Report {
            target: 1,
            failed: true
        }));
        // osd.1 rebooted (new up_from): fresh bookkeeping, no report pending.
        assert!(t.set_peers(&peers(&[(1, 9)])).is_empty());
        assert!(t.reported().is_empty());
        let a = ticks(&mut t, t0 + s * 5, t0 + s * 7, s, 3 * s);
        assert!(!a.iter().any(|x| matches!(x, HbAction::Report { .. })));
        ticks(
            &mut t,
            t0 + s * 7,
            t0 + s * 10 + Duration::from_millis(1),
            s,
            3 * s,
        );
        // Reported again, then dropped from the set: the report is withdrawn.
        t.tick(t0 + s * 10 + Duration::from_millis(1), s, 3 * s);
        assert_eq!(t.reported(), vec![1]);
        let a = t.set_peers(&BTreeMap::new());
        assert_eq!(
            a,
            vec![HbAction::Report {
                target: 1,
                failed: false
            }]
        );
        assert!(t.peers().is_empty());
    }
}
