//! Background backfill of a PG, and stray removal. While `pg_temp` keeps
//! complete copies serving, the acting primary copies the PG to each up
//! member outside the acting set (a *backfill target*) in store order
//! (bit-reversed hash, namespace, name), one batch at a time: it reads the
//! next objects from its store (erasure-coded PGs: rebuilds the target
//! shard's chunk of each from k acting shards), moves the target's position
//! past them in the `Pg` (so later writes to them carry data to the target;
//! writes to objects beyond it carry only their log entry), and sends the
//! batch on the same connection as the replication sub-ops, so the two
//! stay ordered. A batch stops before an object with a write in flight.
//! The target records its position durably in its PG info (`backfill`
//! mark), so a later activation resumes instead of starting over. When
//! every target is complete the primary asks the monitors to clear
//! `pg_temp`; the PG re-peers with acting = up and goes clean, and the
//! primary then tells OSDs holding copies outside the acting and up sets
//! to delete them.
//!
//! Throttles (per OSD, central config, read at every step):
//! `osd_max_backfills` (PGs this OSD backfills at once as a primary),
//! `osd_recovery_max_active` (batches in flight), `osd_recovery_sleep`
//! (pause after each batch), `osd_recovery_max_bytes_per_sec` (0 =
//! unlimited). Flags: `nobackfill` and `norecover` stop backfill;
//! `norebalance` stops it for PGs that are only misplaced (not degraded).
//! Owns no peering decisions (`peering_sm` picks targets and pg_temp).

use crate::ec_peering::rebuild_chunk;
use crate::ec_pool::{EcPg, SHARD_HOLE};
use crate::exec;
use crate::peering::{install_objects, list_all, replace_log};
use crate::peering_sm::BackfillStart;
use crate::pg::{cursor_key, obj_key, Pg};
use crate::runtime::{Shared, META_INFO};
use cairn_map::{ClusterMap, OsdFlag};
use cairn_ops::{
    encode, msg_type, BackfillMark, ListCursor, LogEntry, ObjectName, ObjectState, PgBackfill,
    PgInfo, PgRemove,
};
use cairn_store::{CollectionId, Store, Transaction};
use cairn_types::{Epoch, PgId};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Objects per backfill batch, at most.
pub const BACKFILL_BATCH_OBJECTS: u32 = 64;
/// Bytes of object state per backfill batch, at most (the batch is read
/// inside the PG actor, so it stays small enough not to stall client I/O).
pub const BACKFILL_BATCH_BYTES_MAX: u64 = 4 << 20;
/// A batch not acknowledged within this many peer timeouts stalls the
/// target until the next interval.
const BATCH_ACK_TIMEOUTS: u32 = 3;
/// A stalled target starts over after this.
const RESTART_AFTER: Duration = Duration::from_secs(2);
/// Objects removed per transaction when a stray copy is deleted.
const STRAY_REMOVE_BATCH: usize = 1024;

/// Per-OSD recovery throttles shared by every PG actor.
#[derive(Default)]
pub(crate) struct RecoveryThrottle {
    inner: Mutex<ThrottleState>,
}

#[derive(Default)]
struct ThrottleState {
    /// PGs holding one of this OSD's `osd_max_backfills` slots.
    backfills: BTreeSet<PgId>,
    /// Backfill batches in flight (`osd_recovery_max_active`).
    active_batches: usize,
    /// No batch may start before this (`osd_recovery_max_bytes_per_sec`).
    next_send: Option<Instant>,
}

impl RecoveryThrottle {
    fn lock(&self) -> std::sync::MutexGuard<'_, ThrottleState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn reserve(&self, pgid: PgId, max: usize) -> bool {
        let mut s = self.lock();
        if s.backfills.contains(&pgid) {
            return true;
        }
        if s.backfills.len() >= max.max(1) {
            return false;
        }
        s.backfills.insert(pgid);
        true
    }

    pub(crate) fn release(&self, pgid: PgId) {
        self.lock().backfills.remove(&pgid);
    }

    /// Takes a batch slot if `osd_recovery_max_active` and the bandwidth
    /// cap allow one now; Err = when to try again.
    fn start_batch(&self, now: Instant, max_active: usize) -> Result<(), Instant> {
        let mut s = self.lock();
        if let Some(t) = s.next_send.filter(|t| *t > now) {
            return Err(t);
        }
        if s.active_batches >= max_active.max(1) {
            return Err(now + Duration::from_millis(50));
        }
        s.active_batches += 1;
        Ok(())
    }

    /// A batch of `bytes` went out: the next may leave once the cap allows.
    fn sent(&self, now: Instant, bytes: u64, bytes_per_sec: u64) {
        if bytes_per_sec == 0 {
            return;
        }
        let mut s = self.lock();
        let from = s.next_send.map_or(now, |t| t.max(now));
        s.next_send = Some(from + Duration::from_secs_f64(bytes as f64 / bytes_per_sec as f64));
    }

    fn batch_done(&self) {
        let mut s = self.lock();
        s.active_batches = s.active_batches.saturating_sub(1);
    }
}

/// One backfill target's progress.
#[derive(Debug)]
struct TargetRun {
    /// Last object the target holds (store order); None: nothing yet.
    through: Option<ListCursor>,
    /// The batch in flight: (seq, sent at, objects, bytes).
    inflight: Option<(u64, Instant, u64, u64)>,
    /// The last batch (complete) went out / was acknowledged.
    complete_sent: bool,
    done: bool,
    /// Why the target stopped (a failed or lost batch); it restarts from
    /// the beginning after `RESTART_AFTER`.
    stalled: Option<String>,
    /// When a stalled target starts over (it was dropped from the PG's
    /// writes until then).
    restart_at: Option<Instant>,
    copied_objects: u64,
}

/// Backfill progress of one PG, as `pg query` and the beacon show it.
pub type BackfillStat = cairn_map::BackfillProgress;

/// The backfill of one PG in one interval, driven by its actor.
pub(crate) struct BackfillRun {
    pub interval_since: Epoch,
    targets: BTreeMap<i32, TargetRun>,
    next_seq: u64,
    reserved: bool,
    not_before: Instant,
    total_objects: u64,
    pub waiting: Option<String>,
    clear_sent: bool,
    /// Objects and bytes copied by this run (for the recovery rate).
    pub copied_objects: u64,
    pub copied_bytes: u64,
}

fn cfg_u64(map: &ClusterMap, me: i32, key: &str, default: u64) -> u64 {
    map.config_value(&format!("osd.{me}"), key)
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(default)
}

fn cfg_f64(map: &ClusterMap, me: i32, key: &str) -> f64 {
    map.config_value(&format!("osd.{me}"), key)
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// Why backfill may not run now under the cluster flags, if it may not.
pub(crate) fn blocked_by_flags(map: &ClusterMap, degraded: bool) -> Option<String> {
    if map.flags.contains(&OsdFlag::NoBackfill) {
        return Some("nobackfill is set ('cairn osd unset nobackfill' resumes)".into());
    }
    if map.flags.contains(&OsdFlag::NoRecover) {
        return Some("norecover is set ('cairn osd unset norecover' resumes)".into());
    }
    if !degraded && map.flags.contains(&OsdFlag::NoRebalance) {
        return Some("norebalance is set and the PG is only misplaced".into());
    }
    None
}

fn cursor_text(c: &Option<ListCursor>) -> String {
    match c {
        Some(c) if c.namespace.is_empty() => format!("{:08x}:{}", c.hash, c.name),
        Some(c) => format!("{:08x}:{}/{}", c.hash, c.namespace, c.name),
        None => "start".into(),
    }
}

/// Number of objects in `coll` (for progress).
fn count_objects(store: &Store, coll: CollectionId) -> u64 {
    list_all(store, coll).map(|v| v.len() as u64).unwrap_or(0)
}

/// What an actor needs to drive a backfill step.
pub(crate) struct StepCtx<'a> {
    pub shared: &'a Arc<Shared>,
    pub pg: &'a mut Pg,
    pub pgid: PgId,
    pub coll: CollectionId,
    /// Erasure-coded PG: a target's objects are its shard's chunks,
    /// rebuilt from k acting shards instead of read from the local store.
    pub ec: Option<&'a EcPg>,
}

impl BackfillRun {
    /// Starts the backfill of `targets` for the interval just activated
    /// with `info` and `log`: sends each target its first message (adopt
    /// this log, and drop what it holds unless it resumes) and registers
    /// the targets in the `Pg`. Runs before the PG admits its first op.
    pub(crate) async fn start(
        cx: StepCtx<'_>,
        interval_since: Epoch,
        targets: Vec<BackfillStart>,
        info: &PgInfo,
        log: &[LogEntry],
    ) -> BackfillRun {
        let mut run = BackfillRun {
            interval_since,
            targets: BTreeMap::new(),
            next_seq: 1,
            reserved: false,
            not_before: Instant::now(),
            total_objects: count_objects(&cx.shared.store, cx.coll),
            waiting: None,
            clear_sent: false,
            copied_objects: 0,
            copied_bytes: 0,
        };
        let mut positions = BTreeMap::new();
        for t in targets {
            let (through, resend) = t.resume.clone().unwrap_or((None, Vec::new()));
            let objects = match read_states(&cx.shared.store, cx.coll, &resend) {
                Ok(o) => o,
                Err(e) => {
                    tracing::warn!("pg {}: backfill of osd.{}: {e}", cx.pgid, t.osd);
                    continue;
                }
            };
            let mark = BackfillMark {
                through: through.clone(),
            };
            let start_info = PgInfo {
                backfill: Some(mark),
                ..info.clone()
            };
            let seq = run.next_seq;
            run.next_seq += 1;
            let msg = PgBackfill {
                pgid: cx.pgid,
                from: cx.shared.cfg.id,
                epoch: cx.pg.epoch(),
                interval_since,
                seq,
                start: Some((start_info, log.to_vec())),
                objects,
                through: through.clone(),
                complete: false,
            };
            let mut tr = TargetRun {
                through: through.clone(),
                inflight: None,
                complete_sent: false,
                done: false,
                stalled: None,
                restart_at: None,
                copied_objects: 0,
            };
            match send(cx.shared, t.osd, &msg).await {
                Ok(()) => tr.inflight = Some((seq, Instant::now(), 0, 0)),
                Err(e) => tr.stalled = Some(e),
            }
            tracing::info!(
                "pg {}: backfilling osd.{} from {}",
                cx.pgid,
                t.osd,
                if t.resume.is_some() {
                    cursor_text(&through)
                } else {
                    "the start".to_string()
                }
            );
            positions.insert(t.osd, through.as_ref().map(cursor_key));
            run.targets.insert(t.osd, tr);
        }
        cx.pg.set_backfill_targets(positions);
        run
    }

    /// Progress for `pg query` and the beacon.
    pub(crate) fn stat(&self) -> BackfillStat {
        let active: Vec<&TargetRun> = self.targets.values().filter(|t| !t.done).collect();
        let slowest = active
            .iter()
            .min_by_key(|t| t.through.as_ref().map(cursor_key))
            .map(|t| cursor_text(&t.through));
        BackfillStat {
            targets: self
                .targets
                .iter()
                .filter(|(_, t)| !t.done)
                .map(|(o, _)| *o)
                .collect(),
            copied_objects: self.targets.values().map(|t| t.copied_objects).sum(),
            total_objects: self.total_objects * self.targets.len() as u64,
            waiting: self.waiting.clone().or_else(|| {
                self.targets
                    .iter()
                    .find_map(|(o, t)| t.stalled.as_ref().map(|s| format!("osd.{o}: {s}")))
            }),
            position: slowest,
        }
    }

    /// Object copies still to make (misplaced while pg_temp serves).
    pub(crate) fn remaining_copies(&self) -> u64 {
        self.stat()
            .total_objects
            .saturating_sub(self.stat().copied_objects)
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.targets.values().all(|t| t.done)
    }

    /// The target acknowledged batch `seq`.
    pub(crate) fn on_ack(
        &mut self,
        shared: &Shared,
        pgid: PgId,
        from: i32,
        seq: u64,
        result: Result<(), String>,
    ) {
        let map = shared.map_rx.borrow().clone();
        let sleep = cfg_f64(&map, shared.cfg.id, "osd_recovery_sleep");
        let Some(t) = self.targets.get_mut(&from) else {
            return;
        };
        let Some((s, _, objs, bytes)) = t.inflight else {
            return;
        };
        if s != seq {
            return;
        }
        t.inflight = None;
        if s > 1 || objs > 0 {
            shared.recovery.batch_done();
        }
        match result {
            Ok(()) => {
                shared.add_recovered(
                    pgid,
                    cairn_map::PgRecoveryCounts {
                        backfill_objects: objs,
                        ..Default::default()
                    },
                );
                t.copied_objects += objs;
                self.copied_objects += objs;
                self.copied_bytes += bytes;
                if t.complete_sent {
                    t.done = true;
                }
                self.not_before = Instant::now() + Duration::from_secs_f64(sleep);
            }
            Err(e) => {
                tracing::warn!("backfill batch {seq} failed on osd.{from}: {e}");
                t.stalled = Some(format!("batch {seq} failed: {e}"));
            }
        }
    }

    /// Sends the next batch to every target ready for one, as the flags
    /// and throttles allow; asks to clear pg_temp once every target is
    /// complete.
    pub(crate) async fn step(&mut self, mut cx: StepCtx<'_>) -> Vec<crate::pg::PgAction> {
        let shared = cx.shared;
        let me = shared.cfg.id;
        let now = Instant::now();
        let map = shared.map_rx.borrow().clone();
        if self.is_finished() {
            self.finish(&mut cx, &map).await;
            return Vec::new();
        }
        let acts = self.handle_stalls(&mut cx, now).await;
        let timeout = shared.cfg.peer_timeout * BATCH_ACK_TIMEOUTS;
        for (o, t) in self.targets.iter_mut() {
            if let Some((seq, at, _, _)) = t.inflight {
                if now.duration_since(at) > timeout && t.stalled.is_none() {
                    t.stalled = Some(format!(
                        "batch {seq} not acknowledged within {timeout:?}; retried in the next interval"
                    ));
                    tracing::warn!("pg {}: backfill to osd.{o}: batch {seq} lost", cx.pgid);
                }
            }
        }
        let degraded = cx
            .pg
            .placement()
            .is_some_and(|p| (p.acting.len() as u32) < p.size);
        if let Some(why) = blocked_by_flags(&map, degraded) {
            self.set_waiting(cx.pg, Some(why));
            return acts;
        }
        let max_backfills = cfg_u64(&map, me, "osd_max_backfills", 1) as usize;
        if !self.reserved {
            if !shared.recovery.reserve(cx.pgid, max_backfills) {
                self.set_waiting(
                    cx.pg,
                    Some(format!(
                        "waiting for one of osd.{me}'s osd_max_backfills={max_backfills} slots"
                    )),
                );
                return acts;
            }
            self.reserved = true;
        }
        if now < self.not_before {
            return acts;
        }
        let max_active = cfg_u64(&map, me, "osd_recovery_max_active", 3) as usize;
        let rate = cfg_u64(&map, me, "osd_recovery_max_bytes_per_sec", 0);
        let ready: Vec<i32> = self
            .targets
            .iter()
            .filter(|(_, t)| !t.done && t.inflight.is_none() && t.stalled.is_none())
            .map(|(o, _)| *o)
            .collect();
        for osd in ready {
            if let Err(until) = shared.recovery.start_batch(now, max_active) {
                self.not_before = until;
                self.set_waiting(cx.pg, Some("recovery throttle".into()));
                return acts;
            }
            let sent = self.send_batch(&mut cx, osd).await;
            match sent {
                Ok(bytes) => shared.recovery.sent(now, bytes, rate),
                Err(e) => {
                    shared.recovery.batch_done();
                    if let Some(t) = self.targets.get_mut(&osd) {
                        if e.is_empty() {
                            continue; // a write in flight: next tick
                        }
                        t.stalled = Some(e);
                    }
                }
            }
        }
        self.set_waiting(cx.pg, None);
        acts
    }

    /// Stalled targets leave the PG's writes (so no write waits for
    /// them); after `RESTART_AFTER` they start over with a fresh start
    /// message (sent before any later sub-op, so their log stays whole).
    async fn handle_stalls(
        &mut self,
        cx: &mut StepCtx<'_>,
        now: Instant,
    ) -> Vec<crate::pg::PgAction> {
        let mut acts = Vec::new();
        let osds: Vec<i32> = self.targets.keys().copied().collect();
        for osd in osds {
            let Some(t) = self.targets.get_mut(&osd) else {
                continue;
            };
            if t.stalled.is_some() && t.restart_at.is_none() {
                tracing::info!(
                    "pg {}: backfill of osd.{osd} stalled ({}); restarting it in {RESTART_AFTER:?}",
                    cx.pgid,
                    t.stalled.as_deref().unwrap_or("")
                );
                if t.inflight.take().is_some() {
                    cx.shared.recovery.batch_done();
                }
                t.restart_at = Some(now + RESTART_AFTER);
                acts.extend(cx.pg.drop_backfill_target(osd));
                continue;
            }
            if t.restart_at.is_none_or(|at| at > now) {
                continue;
            }
            let info = PgInfo {
                backfill: Some(BackfillMark { through: None }),
                ..cx.pg.info.clone()
            };
            let seq = self.next_seq;
            self.next_seq += 1;
            let msg = PgBackfill {
                pgid: cx.pgid,
                from: cx.shared.cfg.id,
                epoch: cx.pg.epoch(),
                interval_since: self.interval_since,
                seq,
                start: Some((info, cx.pg.log().cloned().collect())),
                objects: Vec::new(),
                through: None,
                complete: false,
            };
            *t = TargetRun {
                through: None,
                inflight: None,
                complete_sent: false,
                done: false,
                stalled: None,
                restart_at: None,
                copied_objects: t.copied_objects,
            };
            match send(cx.shared, osd, &msg).await {
                Ok(()) => {
                    t.inflight = Some((seq, Instant::now(), 0, 0));
                    cx.pg.add_backfill_target(osd);
                }
                Err(e) => t.stalled = Some(e),
            }
        }
        acts
    }

    fn set_waiting(&mut self, pg: &mut Pg, why: Option<String>) {
        pg.state.backfill_wait = why.is_some();
        pg.state.backfilling = why.is_none() && !self.is_finished();
        self.waiting = why;
    }

    /// Reads and sends the next batch to `osd`; Ok = bytes sent; Err("")
    /// = nothing to send now (a write in flight on the next object).
    async fn send_batch(&mut self, cx: &mut StepCtx<'_>, osd: i32) -> Result<u64, String> {
        let store = &cx.shared.store;
        let Some(t) = self.targets.get(&osd) else {
            return Err(String::new());
        };
        let after = t.through.clone();
        let (names, next) =
            exec::list_objects(store, cx.coll, after.as_ref(), BACKFILL_BATCH_OBJECTS)
                .map_err(|e| format!("listing: {e}"))?;
        let limit = cx
            .shared
            .cfg
            .recovery_batch_bytes
            .min(BACKFILL_BATCH_BYTES_MAX);
        let mut objects: Vec<(u32, ObjectName, Option<ObjectState>)> = Vec::new();
        let mut bytes = 0u64;
        let mut stopped_early = false;
        let fence = cx
            .pg
            .first_busy_after(after.as_ref().map(cursor_key).as_ref());
        // EC: the target's shard position and the acting shards to
        // rebuild its chunks from.
        let ec_plan = cx.ec.map(|ec| {
            let sources: Vec<usize> = (0..ec.shards.len())
                .filter(|&s| ec.shards[s] != SHARD_HOLE)
                .collect();
            (ec, ec.up_shard_of(osd), sources)
        });
        for (h, n) in &names {
            let at_fence = fence.as_ref().is_some_and(|f| obj_key(n) >= *f);
            if at_fence || bytes >= limit {
                stopped_early = true;
                break;
            }
            let st = match &ec_plan {
                None => exec::get_object_state(store, cx.coll, n)
                    .map_err(|e| format!("reading {n}: {e}"))?,
                Some((ec, shard, sources)) => {
                    let shard = shard.ok_or_else(|| {
                        format!("osd.{osd} holds no shard of the up set any more")
                    })?;
                    let epoch = cx.pg.epoch();
                    rebuild_chunk(cx.shared, cx.pgid, epoch, ec, n, shard, sources).await?
                }
            };
            bytes += st.as_ref().map(|s| s.bytes()).unwrap_or(0);
            objects.push((*h, n.clone(), st));
        }
        // Complete only when nothing is left to list and no write in flight
        // lies beyond the position (it may create an object not listed yet).
        let complete = !stopped_early && next.is_none() && fence.is_none();
        if objects.is_empty() && !complete {
            return Err(String::new());
        }
        let through = match objects.last() {
            Some((h, n, _)) => Some(ListCursor {
                hash: *h,
                namespace: n.namespace.clone(),
                name: n.name.clone(),
            }),
            None => after,
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        let n_objects = objects.len() as u64;
        let msg = PgBackfill {
            pgid: cx.pgid,
            from: cx.shared.cfg.id,
            epoch: cx.pg.epoch(),
            interval_since: self.interval_since,
            seq,
            start: None,
            objects,
            through: through.clone(),
            complete,
        };
        // Move the position before anything else can run in this actor:
        // later writes to these objects then carry their data.
        if let Some(c) = &through {
            cx.pg.backfill_advance(osd, cursor_key(c));
        }
        if complete {
            cx.pg.backfill_complete(osd);
        }
        send(cx.shared, osd, &msg).await?;
        if let Some(t) = self.targets.get_mut(&osd) {
            t.through = through;
            t.complete_sent = complete;
            t.inflight = Some((seq, Instant::now(), n_objects, bytes));
        }
        Ok(bytes)
    }

    /// Every target is complete: release the slot and ask the monitors to
    /// clear pg_temp (the PG then re-peers with acting = up).
    async fn finish(&mut self, cx: &mut StepCtx<'_>, map: &ClusterMap) {
        if self.reserved {
            cx.shared.recovery.release(cx.pgid);
            self.reserved = false;
        }
        cx.pg.state.backfilling = false;
        cx.pg.state.backfill_wait = false;
        if self.clear_sent || !map.pg_temp.contains_key(&cx.pgid) {
            return;
        }
        self.clear_sent = true;
        tracing::info!("pg {}: backfill complete; clearing pg_temp", cx.pgid);
        if let Some(mon) = &cx.shared.mon {
            let _ = mon
                .send(cairn_map::MonCommand::PgTemp {
                    from: cx.shared.cfg.id,
                    pgid: cx.pgid,
                    osds: Vec::new(),
                })
                .await;
        }
    }
}

/// Reads the current state of `names` from the local store.
fn read_states(
    store: &Store,
    coll: CollectionId,
    names: &[ObjectName],
) -> Result<Vec<(u32, ObjectName, Option<ObjectState>)>, String> {
    names
        .iter()
        .map(|n| {
            exec::get_object_state(store, coll, n)
                .map(|st| (n.hash(), n.clone(), st))
                .map_err(|e| format!("reading {n}: {e}"))
        })
        .collect()
}

/// Sends a backfill message one-way on the peer connection sub-ops use.
async fn send(shared: &Arc<Shared>, osd: i32, msg: &PgBackfill) -> Result<(), String> {
    let (_, conn) = shared.peer(osd).await?;
    conn.send(msg_type::PG_BACKFILL, encode(msg))
        .await
        .map_err(|e| e.to_string())
}

/// A target's transaction, the info and log it adopts (first message),
/// and its info afterwards.
pub(crate) type TargetTxn = (Transaction, Option<(PgInfo, Vec<LogEntry>)>, PgInfo);

/// Target side: the store transaction for one backfill message (and the
/// info and log the PG adopts), given the target's current info.
pub(crate) fn target_txn(
    store: &Store,
    coll: CollectionId,
    current: &PgInfo,
    msg: &PgBackfill,
) -> Result<TargetTxn, String> {
    let mut txn = Transaction::new();
    if msg.start.is_some() && msg.through.is_none() {
        // A fresh start: nothing held so far counts.
        for (_, n) in list_all(store, coll)? {
            txn.remove(coll, exec::store_oid(&n));
        }
    }
    install_objects(store, coll, &mut txn, &msg.objects)?;
    let mark = (!msg.complete).then(|| BackfillMark {
        through: msg.through.clone(),
    });
    match &msg.start {
        Some((info, log)) => {
            let info = PgInfo {
                backfill: mark,
                ..info.clone()
            };
            replace_log(&mut txn, coll, &info, log);
            Ok((txn, Some((info.clone(), log.clone())), info))
        }
        None => {
            let info = PgInfo {
                backfill: mark,
                ..current.clone()
            };
            txn.meta_set(coll, META_INFO, encode(&info));
            Ok((txn, None, info))
        }
    }
}

/// Tells each stray OSD to delete its copy of the (now clean) PG.
pub(crate) async fn remove_strays(shared: &Arc<Shared>, pgid: PgId, epoch: Epoch, strays: &[i32]) {
    let msg = PgRemove {
        pgid,
        from: shared.cfg.id,
        epoch,
    };
    for &o in strays {
        match shared.peer(o).await {
            Ok((_, conn)) => {
                if let Err(e) = conn.send(msg_type::PG_REMOVE, encode(&msg)).await {
                    tracing::info!("pg {pgid}: telling osd.{o} to remove its copy: {e}");
                } else {
                    tracing::info!("pg {pgid}: clean; osd.{o} removes its stray copy");
                }
            }
            Err(e) => tracing::info!("pg {pgid}: stray osd.{o} unreachable: {e}"),
        }
    }
}

/// Stray side: deletes every object of `coll` and the collection itself.
pub(crate) async fn delete_copy(store: &Arc<Store>, coll: CollectionId) -> Result<(), String> {
    let all = list_all(store, coll)?;
    for chunk in all.chunks(STRAY_REMOVE_BATCH) {
        let mut txn = Transaction::new();
        for (_, n) in chunk {
            txn.remove(coll, exec::store_oid(n));
        }
        crate::peering::commit(store, txn).await?;
    }
    // EC stashes and anything not listed as a user object.
    let rest = store
        .list_objects(
            &coll,
            &cairn_store::ListStart::Beginning,
            STRAY_REMOVE_BATCH,
        )
        .map_err(|e| e.to_string())?;
    let mut txn = Transaction::new();
    for o in rest {
        txn.remove(coll, o);
    }
    txn.remove_collection(coll);
    crate::peering::commit(store, txn).await
}
