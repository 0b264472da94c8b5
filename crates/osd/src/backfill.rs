//! Background backfill of a PG, stray removal, and the copy engine's
//! shared pieces (throttles, the copy meter). While `pg_temp` keeps
//! complete copies serving, the acting primary copies the PG to each up
//! member outside the acting set (a *backfill target*) in store order
//! (bit-reversed hash, namespace, name; erasure-coded PGs: each object's
//! chunk for the target's shard, rebuilt from k acting shards) as a
//! pipeline: up to
//! [`BACKFILL_WINDOW_BATCHES`] batches per target are in flight at once
//! (bounded in bytes per OSD by `osd_memory_target`), each read from the
//! store off the async workers and installed by the target in one store
//! transaction, so the next batch is read and sent while earlier ones
//! travel and commit. Sending a batch moves the target's position past its
//! objects in the `Pg` (later writes to them carry data to the target;
//! writes to objects beyond it carry only their log entry), on the same
//! connection as the replication sub-ops, so the two stay ordered. A batch
//! stops before an object with a write in flight. The target records its
//! position durably in its PG info (`backfill` mark); the primary tracks
//! the *durable cursor* (the position of the last batch acknowledged with
//! every earlier one). In a new interval the target resumes from its mark
//! (peering reports it, `peering_sm::backfill_resume_point`), once the
//! objects up to the mark that changed since its last update are sent
//! again; erasure-coded targets too, when their copy holds the position
//! they are a target for (objects sent again are rebuilt chunks).
//!
//! A slow target never holds client writes for long: a write that waited
//! [`BACKFILL_WRITE_WAIT`] for a target (or a batch unacknowledged for a
//! peer timeout) drops the target from the PG's writes (writes waiting only
//! for it complete: it is not an acting member) and, after a back-off, the
//! target resumes from its durable cursor, first receiving the current log
//! and the objects written since its oldest unacknowledged write (so
//! nothing it already held misses a write). When every target is complete
//! the primary asks the monitors to clear `pg_temp`; the PG re-peers with
//! acting = up and goes clean, and the primary then tells OSDs holding
//! copies outside the acting and up sets to delete them.
//!
//! Throttles (per OSD, central config, read at every step):
//! `osd_max_backfills` (PGs this OSD backfills at once as a primary),
//! `osd_recovery_max_active` (batches in flight, all PGs), `osd_recovery_sleep`
//! (pause after each batch), `osd_recovery_max_bytes_per_sec` (0 =
//! unlimited). Flags: `nobackfill` and `norecover` stop backfill;
//! `norebalance` stops it for PGs that are only misplaced (not degraded).
//! A target the monitors marked backfillfull or full holds the PG's
//! backfill (`backfill_toofull`) until the mark goes.
//! Owns no peering decisions (`peering_sm` picks targets and pg_temp).

use crate::backfill_target::{AckOutcome, PgTempClear, SentBatch, TargetProgress};
use crate::ec_peering::rebuild_chunk;
use crate::ec_pool::{EcPg, SHARD_HOLE};
use crate::exec;
use crate::peering::{install_objects, known_object_crcs, list_all, replace_log, stored_bytes};
use crate::peering_sm::{copy_batch_full, BackfillStart, ALONE_OBJECT_BYTES};
use crate::pg::{cursor_key, obj_key, Pg};
use crate::runtime::{blocking_store_call, Shared, META_INFO};
use cairn_map::{ClusterMap, OsdFlag};
use cairn_msg::BlockCrcs;
use cairn_ops::{
    encode, encode_parts, msg_type, BackfillMark, ListCursor, LogEntry, ObjectName, ObjectState,
    PgBackfill, PgInfo, PgRemove,
};
use cairn_store::{CollectionId, Store, Transaction};
use cairn_types::{Epoch, PgId};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Objects per backfill batch, at most.
pub const BACKFILL_BATCH_OBJECTS: u32 = 64;
/// Bytes of object state per backfill batch, at most (an object larger
/// than this travels alone in its batch).
pub const BACKFILL_BATCH_BYTES_MAX: u64 = 4 << 20;
/// Batches in flight per backfill target, at most.
pub const BACKFILL_WINDOW_BATCHES: usize = 8;
/// Share of `osd_memory_target` that backfill batches in flight (sent,
/// not yet acknowledged) may take, OSD-wide: 1/8 (40 MiB at the default).
const INFLIGHT_SHARE_DIVISOR: u64 = 8;
/// ...but never less than this (two full batches).
const MIN_INFLIGHT_BYTES: u64 = 2 * BACKFILL_BATCH_BYTES_MAX;
/// Longest a client write waits for a backfill target's acknowledgement
/// before the target is dropped from the PG's writes (and resumed later
/// from its durable cursor).
pub const BACKFILL_WRITE_WAIT: Duration = Duration::from_secs(2);
/// Objects removed per transaction when a stray copy is deleted.
const STRAY_REMOVE_BATCH: usize = 1024;
/// A copy episode of the meter ends after this long with nothing in flight.
const COPY_EPISODE_LINGER: Duration = Duration::from_secs(1);

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
    /// Bytes of those batches.
    active_bytes: u64,
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

    /// Takes a batch slot if `osd_recovery_max_active`, the in-flight byte
    /// bound and the bandwidth cap allow one now; Err = when to try again.
    fn start_batch(&self, now: Instant, max_active: usize, max_bytes: u64) -> Result<(), Instant> {
        let mut s = self.lock();
        if let Some(t) = s.next_send.filter(|t| *t > now) {
            return Err(t);
        }
        // The first batch always goes (a single object may exceed the bound).
        let full = s.active_batches > 0 && s.active_bytes >= max_bytes;
        if s.active_batches >= max_active.max(1) || full {
            return Err(now + Duration::from_millis(50));
        }
        s.active_batches += 1;
        Ok(())
    }

    /// A batch of `bytes` went out: counted in flight, and the next may
    /// leave once the bandwidth cap allows.
    fn sent(&self, now: Instant, bytes: u64, bytes_per_sec: u64) {
        let mut s = self.lock();
        s.active_bytes += bytes;
        if bytes_per_sec == 0 {
            return;
        }
        let from = s.next_send.map_or(now, |t| t.max(now));
        s.next_send = Some(from + Duration::from_secs_f64(bytes as f64 / bytes_per_sec as f64));
    }

    fn batch_done(&self, bytes: u64) {
        let mut s = self.lock();
        s.active_batches = s.active_batches.saturating_sub(1);
        s.active_bytes = s.active_bytes.saturating_sub(bytes);
    }
}

/// A slot of `osd_recovery_max_active` held by a log-recovery push or pull
/// while it is in flight; given back when dropped.
pub(crate) struct RecoverySlot {
    shared: Arc<Shared>,
    bytes: u64,
}

impl Drop for RecoverySlot {
    fn drop(&mut self) {
        self.shared.recovery.batch_done(self.bytes);
    }
}

/// How often a copy held by the throttle looks again (a new map wakes it
/// sooner).
const RECOVERY_GATE_POLL: Duration = Duration::from_millis(100);

/// Waits until log recovery (activation's pushes and pulls) may copy about
/// `bytes` now, and takes the slot: a slot of `osd_recovery_max_active`
/// free within the in-flight byte bound and the bandwidth cap, which it
/// shares with backfill batches. A single copy always gets a slot when
/// nothing else is in flight.
///
/// `norecover` does not hold it: a PG here serves only once its acting
/// members have caught up from the log, so holding log recovery would turn
/// a maintenance flag into an outage (the flag holds backfill and the
/// background copies instead).
pub(crate) async fn recovery_slot(shared: &Arc<Shared>, bytes: u64) -> RecoverySlot {
    let me = shared.cfg.id;
    let mut rx = shared.map_rx.clone();
    loop {
        let map = rx.borrow_and_update().clone();
        let now = Instant::now();
        let max_active = cfg_u64(&map, me, "osd_recovery_max_active", 3) as usize;
        let rate = cfg_u64(&map, me, "osd_recovery_max_bytes_per_sec", 0);
        let wait_until =
            match shared
                .recovery
                .start_batch(now, max_active, inflight_bytes_max(shared))
            {
                Ok(()) => {
                    shared.recovery.sent(now, bytes, rate);
                    return RecoverySlot {
                        shared: shared.clone(),
                        bytes,
                    };
                }
                Err(until) => until.min(now + RECOVERY_GATE_POLL),
            };
        if let Ok(Err(_)) = tokio::time::timeout_at(wait_until.into(), rx.changed()).await {
            // No more maps (shutting down): just wait out the interval.
            tokio::time::sleep_until(wait_until.into()).await;
        }
    }
}

/// Bytes of backfill batches an OSD keeps in flight, at most.
fn inflight_bytes_max(shared: &Shared) -> u64 {
    (shared.cfg.memory_target_bytes / INFLIGHT_SHARE_DIVISOR).max(MIN_INFLIGHT_BYTES)
}

/// How often the store's idle read buffers are checked for expiry.
const READ_BUFFER_TRIM_INTERVAL: Duration = Duration::from_secs(1);

/// Lets the store keep as many idle read buffers as the recovery in-flight
/// bound ([`inflight_bytes_max`]) holds, so the objects backfill and
/// recovery read (4 MiB each, a bound's worth in flight) land in buffers
/// whose pages are mapped already instead of fresh ones (a page fault and
/// a zeroed page per 4 KiB: 12 % of the daemon's CPU while copying). The
/// buffers in flight come out of that idle pool, so together they stay
/// about within the bound; idle ones are freed 2 s after their last use
/// (a task here trims them while nothing reads).
pub(crate) fn recycle_read_buffers(shared: &Arc<Shared>) {
    shared
        .store
        .set_read_buffers_idle_bytes(inflight_bytes_max(shared));
    let store = shared.store.clone();
    shared.tasks_spawn(async move {
        let mut tick = tokio::time::interval(READ_BUFFER_TRIM_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            store.trim_idle_read_buffers();
        }
    });
}

/// Times this OSD's copying as a sender (backfill batches, recovery pushes
/// and pulls): from the first copy sent to the last one durable, and what
/// moved. The figure the recovery benchmark divides by is this copy time,
/// not the time around it (daemon start, peering, map epochs).
#[derive(Default)]
pub(crate) struct CopyMeter {
    inner: Mutex<MeterState>,
}

#[derive(Default)]
struct MeterState {
    outstanding: u64,
    episode: Option<CopyEpisode>,
    /// Since the OSD started (for in-process measurements).
    total: Option<CopyWindow>,
}

#[derive(Debug, Clone, Copy)]
struct CopyEpisode {
    first: Instant,
    first_wall: SystemTime,
    last: Instant,
    bytes: u64,
    objects: u64,
}

/// What an OSD copied as a sender, from its first copy sent to its last
/// one durable (monotonic clock of this process).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyWindow {
    pub first_sent: Instant,
    pub last_durable: Instant,
    pub bytes: u64,
    pub objects: u64,
}

impl CopyMeter {
    fn lock(&self) -> std::sync::MutexGuard<'_, MeterState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A copy (batch, push or pull) is on its way.
    pub(crate) fn begin(&self, osd: i32) {
        let now = Instant::now();
        let mut s = self.lock();
        if s.outstanding == 0 {
            if let Some(e) = s
                .episode
                .filter(|e| now.duration_since(e.last) > COPY_EPISODE_LINGER)
            {
                report_episode(osd, &e);
                s.episode = None;
            }
        }
        s.outstanding += 1;
        if s.episode.is_none() {
            s.episode = Some(CopyEpisode {
                first: now,
                first_wall: SystemTime::now(),
                last: now,
                bytes: 0,
                objects: 0,
            });
        }
        if s.total.is_none() {
            s.total = Some(CopyWindow {
                first_sent: now,
                last_durable: now,
                bytes: 0,
                objects: 0,
            });
        }
    }

    /// A copy begun earlier is durable at its destination (`bytes` and
    /// `objects` moved; 0 when it failed).
    pub(crate) fn end(&self, bytes: u64, objects: u64) {
        let now = Instant::now();
        let mut s = self.lock();
        s.outstanding = s.outstanding.saturating_sub(1);
        if bytes == 0 && objects == 0 {
            return;
        }
        if let Some(e) = s.episode.as_mut() {
            e.last = now;
            e.bytes += bytes;
            e.objects += objects;
        }
        if let Some(t) = s.total.as_mut() {
            t.last_durable = now;
            t.bytes += bytes;
            t.objects += objects;
        }
    }

    /// Logs the current episode once nothing was in flight for a while.
    pub(crate) fn tick(&self, osd: i32) {
        let mut s = self.lock();
        let idle = s.outstanding == 0
            && s.episode
                .is_some_and(|e| e.last.elapsed() > COPY_EPISODE_LINGER);
        if idle {
            if let Some(e) = s.episode.take() {
                report_episode(osd, &e);
            }
        }
    }

    pub(crate) fn total(&self) -> Option<CopyWindow> {
        self.lock().total
    }
}

/// One copy in flight (a backfill batch, a recovery push or pull): counted
/// by the meter, and holding a backfill throttle slot of `slot` bytes when
/// set, until finished — or dropped (an abandoned run, an aborted job).
pub(crate) struct CopyTicket {
    shared: Arc<Shared>,
    slot: Option<u64>,
    open: bool,
}

impl CopyTicket {
    pub(crate) fn new(shared: &Arc<Shared>, slot: Option<u64>) -> CopyTicket {
        shared.copy_meter.begin(shared.cfg.id);
        CopyTicket {
            shared: shared.clone(),
            slot,
            open: true,
        }
    }

    /// The copy is durable at its destination (`bytes`, `objects` moved;
    /// zeros when it failed).
    pub(crate) fn finish(mut self, bytes: u64, objects: u64) {
        self.close(bytes, objects);
    }

    fn close(&mut self, bytes: u64, objects: u64) {
        if !self.open {
            return;
        }
        self.open = false;
        self.shared.copy_meter.end(bytes, objects);
        if let Some(b) = self.slot {
            self.shared.recovery.batch_done(b);
        }
    }
}

impl Drop for CopyTicket {
    fn drop(&mut self) {
        self.close(0, 0);
    }
}

impl std::fmt::Debug for CopyTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CopyTicket(open: {})", self.open)
    }
}

/// One line per copy episode in the daemon log (the recovery benchmark
/// reads them): wall-clock bounds for lining up several OSDs of one
/// machine, the duration from the monotonic clock.
fn report_episode(osd: i32, e: &CopyEpisode) {
    if e.bytes == 0 {
        return;
    }
    let secs = e.last.duration_since(e.first).as_secs_f64();
    let start_ms = e
        .first_wall
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let end_ms = start_ms + (secs * 1000.0) as u128;
    tracing::info!(
        "recovery copy: osd.{osd} moved {} bytes ({} objects) in {secs:.3} s, from {start_ms} to {end_ms} ms: {:.1} MB/s",
        e.bytes,
        e.objects,
        e.bytes as f64 / 1e6 / secs.max(1e-6)
    );
}

/// Backfill progress of one PG, as `pg query` and the beacon show it.
pub type BackfillStat = cairn_map::BackfillProgress;

/// The backfill of one PG in one interval, driven by its actor.
pub(crate) struct BackfillRun {
    pub interval_since: Epoch,
    targets: BTreeMap<i32, TargetProgress>,
    /// What each batch in flight holds (its count in the meter and its
    /// throttle slot) until acknowledged, by (target, batch seq).
    tickets: BTreeMap<(i32, u64), CopyTicket>,
    next_seq: u64,
    reserved: bool,
    not_before: Instant,
    total_objects: u64,
    pub waiting: Option<String>,
    /// The request to clear pg_temp once every target is complete.
    clear: PgTempClear,
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
            tickets: BTreeMap::new(),
            next_seq: 1,
            reserved: false,
            not_before: Instant::now(),
            total_objects: count_objects(&cx.shared.store, cx.coll),
            waiting: None,
            clear: PgTempClear::default(),
            copied_objects: 0,
            copied_bytes: 0,
        };
        let mut positions = BTreeMap::new();
        for t in targets {
            let (through, resend) = t.resume.clone().unwrap_or((None, Vec::new()));
            let objects = match resend_states(&cx, t.osd, &resend).await {
                Ok(o) => o,
                Err(e) => {
                    tracing::warn!("pg {}: backfill of osd.{}: {e}", cx.pgid, t.osd);
                    continue;
                }
            };
            let mut tr = TargetProgress::starting_at(through.clone());
            let start_info = PgInfo {
                backfill: Some(BackfillMark {
                    through: through.clone(),
                }),
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
            send_unslotted(cx.shared, t.osd, &mut tr, &mut run.tickets, msg).await;
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
        let active: Vec<&TargetProgress> = self.targets.values().filter(|t| !t.done).collect();
        let slowest = active
            .iter()
            .min_by_key(|t| t.durable.as_ref().map(cursor_key))
            .map(|t| cursor_text(&t.durable));
        BackfillStat {
            targets: self
                .targets
                .iter()
                .filter(|(_, t)| !t.done)
                .map(|(o, _)| *o)
                .collect(),
            copied_objects: self.targets.values().map(|t| t.copied_objects).sum(),
            total_objects: self.total_objects * self.targets.len() as u64,
            // The run's own wait (flag, slot, throttle, toofull) and every
            // stalled target's reason.
            waiting: {
                let why: Vec<String> =
                    self.waiting
                        .iter()
                        .cloned()
                        .chain(self.targets.iter().filter_map(|(o, t)| {
                            t.stalled.as_ref().map(|s| format!("osd.{o}: {s}"))
                        }))
                        .collect();
                (!why.is_empty()).then(|| why.join("; "))
            },
            position: slowest,
        }
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.targets.values().all(|t| t.done)
    }

    /// A client write (version `seq`, on `oid`) goes to `replicas`: the
    /// backfill targets among them owe an acknowledgement; targets
    /// dropped for now will get the object again when they resume.
    pub(crate) fn note_write(&mut self, seq: u64, oid: &ObjectName, replicas: &[i32]) {
        let now = Instant::now();
        for (o, t) in self.targets.iter_mut() {
            t.note_write(now, seq, oid, replicas.contains(o));
        }
    }

    /// Backfill target `from` acknowledged the client write `seq`.
    pub(crate) fn write_acked(&mut self, from: i32, seq: u64) {
        if let Some(t) = self.targets.get_mut(&from) {
            t.write_acked(seq);
        }
    }

    /// Backfill target `from` failed to commit client write `seq`: like a
    /// slow target it leaves the PG's writes at the next step and resumes
    /// later (the write's object is sent again then). False when `from` is
    /// not a target of this run.
    pub(crate) fn write_failed(&mut self, from: i32, seq: u64, why: &str) -> bool {
        let Some(t) = self.targets.get_mut(&from) else {
            return false;
        };
        t.write_failed(seq, why);
        true
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
        let moved = t
            .inflight
            .iter()
            .find(|b| b.seq == seq && !b.acked)
            .map(|b| (b.bytes, b.objects));
        let ticket = self.tickets.remove(&(from, seq));
        match t.on_ack(seq, result.clone()) {
            // An older run's batch, or a duplicate.
            AckOutcome::Unknown => {
                if let Some(tk) = ticket {
                    self.tickets.insert((from, seq), tk);
                }
                return;
            }
            AckOutcome::Failed => {
                drop(ticket);
                if let Err(e) = result {
                    tracing::warn!("pg {pgid}: backfill batch {seq} failed on osd.{from}: {e}");
                }
                return;
            }
            AckOutcome::Acked { durable } => {
                if let (Some(tk), Some((bytes, objects))) = (ticket, moved) {
                    tk.finish(bytes, objects);
                }
                for (objects, bytes) in durable {
                    shared.add_recovered(
                        pgid,
                        cairn_map::PgRecoveryCounts {
                            backfill_objects: objects,
                            ..Default::default()
                        },
                    );
                    self.copied_objects += objects;
                    self.copied_bytes += bytes;
                }
            }
        }
        if sleep > 0.0 {
            self.not_before = Instant::now() + Duration::from_secs_f64(sleep);
        }
    }

    /// Sends the next batches to every target ready for them, as the
    /// flags, throttles and windows allow; drops targets too slow to
    /// acknowledge and resumes them later; asks to clear pg_temp once
    /// every target is complete.
    pub(crate) async fn step(&mut self, mut cx: StepCtx<'_>) -> Vec<crate::pg::PgAction> {
        let shared = cx.shared;
        let me = shared.cfg.id;
        let now = Instant::now();
        let map = shared.map_rx.borrow().clone();
        let degraded = cx
            .pg
            .placement()
            .is_some_and(|p| (p.acting.len() as u32) < p.size);
        let pending: Vec<i32> = self
            .targets
            .iter()
            .filter(|(_, t)| !t.done)
            .map(|(o, _)| *o)
            .collect();
        let held_by_flag = blocked_by_flags(&map, degraded);
        let toofull = map.backfill_toofull(&pending);
        self.detect_stalls(shared, cx.pgid, now);
        // A stalled target resumes only when no flag and no full target
        // holds the backfill: resuming copies the objects it missed.
        let held = held_by_flag.is_some() || toofull.is_some();
        let acts = self.handle_stalls(&mut cx, now, held).await;
        if self.is_finished() {
            self.finish(&mut cx, &map).await;
            return acts;
        }
        if let Some(why) = held_by_flag {
            self.set_waiting(cx.pg, Some(why));
            return acts;
        }
        // No data moves onto an OSD the monitors marked backfillfull (or
        // full): the PG shows backfill_toofull and retries at every step,
        // so it resumes once the mark is gone. Its reservation goes back
        // to the other PGs meanwhile.
        if let Some(why) = toofull {
            if self.reserved {
                shared.recovery.release(cx.pgid);
                self.reserved = false;
            }
            self.set_waiting(cx.pg, Some(why));
            cx.pg.state.backfill_wait = false;
            cx.pg.state.backfill_toofull = true;
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
        let max_bytes = inflight_bytes_max(shared);
        let sleep = cfg_f64(&map, me, "osd_recovery_sleep") > 0.0;
        // With a sleep between batches, one batch per target at a time.
        let window = if sleep { 1 } else { BACKFILL_WINDOW_BATCHES };
        let mut progressed = true;
        while progressed {
            progressed = false;
            let ready: Vec<i32> = self
                .targets
                .iter()
                .filter(|(_, t)| t.ready_for_batch(window))
                .map(|(o, _)| *o)
                .collect();
            for osd in ready {
                if let Err(until) = shared.recovery.start_batch(now, max_active, max_bytes) {
                    self.not_before = until;
                    self.set_waiting(cx.pg, Some("recovery throttle".into()));
                    return acts;
                }
                match self.send_batch(&mut cx, osd).await {
                    Ok(bytes) => {
                        shared.recovery.sent(now, bytes, rate);
                        progressed = true;
                    }
                    Err(e) => {
                        shared.recovery.batch_done(0);
                        if let Some(t) = self.targets.get_mut(&osd) {
                            if !e.is_empty() {
                                t.stalled = Some(e);
                            }
                        }
                    }
                }
            }
        }
        self.set_waiting(cx.pg, None);
        acts
    }

    /// Marks targets stalled whose oldest batch waited a peer timeout or
    /// whose oldest client write waited [`BACKFILL_WRITE_WAIT`].
    fn detect_stalls(&mut self, shared: &Shared, pgid: PgId, now: Instant) {
        let batch_wait = shared.cfg.peer_timeout;
        for (o, t) in self.targets.iter_mut() {
            if t.stalled.is_some() {
                continue;
            }
            if let Some(why) = t.detect_stall(now, batch_wait, BACKFILL_WRITE_WAIT) {
                tracing::warn!("pg {pgid}: backfill target osd.{o} is too slow: {why}");
            }
        }
    }

    /// Stalled targets leave the PG's writes (so no write waits for
    /// them); after a back-off they resume from their durable cursor,
    /// unless `held` (a flag or a full target holds the backfill).
    async fn handle_stalls(
        &mut self,
        cx: &mut StepCtx<'_>,
        now: Instant,
        held: bool,
    ) -> Vec<crate::pg::PgAction> {
        let mut acts = Vec::new();
        let osds: Vec<i32> = self.targets.keys().copied().collect();
        for osd in osds {
            let Some(t) = self.targets.get_mut(&osd) else {
                continue;
            };
            let why = t.stalled.clone().unwrap_or_default();
            if let Some((delay, dropped)) = t.begin_backoff(now) {
                tracing::info!(
                    "pg {}: backfill of osd.{osd} stalled ({why}); resuming it from {} in {delay:?}",
                    cx.pgid,
                    cursor_text(&t.durable)
                );
                // Unacknowledged batches release their slots (tickets dropped).
                for seq in dropped {
                    self.tickets.remove(&(osd, seq));
                }
                acts.extend(cx.pg.drop_backfill_target(osd));
                continue;
            }
            if held || !t.resume_due(now) {
                continue;
            }
            // Objects written while the target was out must be read after
            // those writes are applied here.
            if t.dirty.iter().any(|o| cx.pg.is_busy(o)) {
                continue;
            }
            self.resume_target(cx, osd).await;
        }
        acts
    }

    /// Resumes a stalled target from its durable cursor: the current log
    /// and info first, then the objects it may have missed, then it joins
    /// the PG's writes again at that cursor (all before any later sub-op).
    async fn resume_target(&mut self, cx: &mut StepCtx<'_>, osd: i32) {
        let Some(t) = self.targets.get_mut(&osd) else {
            return;
        };
        // Erasure-coded targets resume too: the objects sent again are
        // chunks rebuilt for their position (`resend_states`).
        let (through, resend) = t.resume(false);
        let info = PgInfo {
            backfill: Some(BackfillMark {
                through: through.clone(),
            }),
            ..cx.pg.info.clone()
        };
        let mut first = Some((info, cx.pg.log().cloned().collect::<Vec<_>>()));
        let mut chunks: Vec<Vec<ObjectName>> = Vec::new();
        for n in resend {
            match chunks.last_mut() {
                Some(c) if c.len() < BACKFILL_BATCH_OBJECTS as usize => c.push(n),
                _ => chunks.push(vec![n]),
            }
        }
        if chunks.is_empty() {
            chunks.push(Vec::new());
        }
        for names in chunks {
            let objects = match resend_states(cx, osd, &names).await {
                Ok(o) => o,
                Err(e) => {
                    if let Some(t) = self.targets.get_mut(&osd) {
                        t.stalled = Some(e);
                    }
                    return;
                }
            };
            let Some(t) = self.targets.get_mut(&osd) else {
                return;
            };
            let seq = self.next_seq;
            self.next_seq += 1;
            let msg = PgBackfill {
                pgid: cx.pgid,
                from: cx.shared.cfg.id,
                epoch: cx.pg.epoch(),
                interval_since: self.interval_since,
                seq,
                start: first.take(),
                objects,
                through: through.clone(),
                complete: false,
            };
            send_unslotted(cx.shared, osd, t, &mut self.tickets, msg).await;
            if t.stalled.is_some() {
                return;
            }
        }
        tracing::info!(
            "pg {}: backfill of osd.{osd} resumes from {}",
            cx.pgid,
            cursor_text(&through)
        );
        cx.pg.add_backfill_target(osd);
        if let Some(c) = &through {
            cx.pg.backfill_advance(osd, cursor_key(c));
        }
    }

    fn set_waiting(&mut self, pg: &mut Pg, why: Option<String>) {
        pg.state.backfill_wait = why.is_some();
        pg.state.backfill_toofull = false;
        pg.state.backfilling = why.is_none() && !self.is_finished();
        self.waiting = why;
    }

    /// Reads and sends the next batch to `osd`; Ok = bytes sent; Err("")
    /// = nothing to send now (a write in flight on the next object).
    async fn send_batch(&mut self, cx: &mut StepCtx<'_>, osd: i32) -> Result<u64, String> {
        let Some(t) = self.targets.get(&osd) else {
            return Err(String::new());
        };
        let after = t.sent_through.clone();
        let fence = cx
            .pg
            .first_busy_after(after.as_ref().map(cursor_key).as_ref());
        let limit = cx
            .shared
            .cfg
            .recovery_batch_bytes
            .min(BACKFILL_BATCH_BYTES_MAX);
        let store = cx.shared.store.clone();
        let coll = cx.coll;
        let (objects, bytes, complete) = match cx.ec {
            // Off the async workers: listing and reading verify checksums.
            None => blocking_store_call(|| {
                read_batch(&store, coll, after.as_ref(), fence.as_ref(), limit)
            })?,
            Some(ec) => read_ec_batch(cx, ec, osd, after.as_ref(), fence.as_ref(), limit).await?,
        };
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
        let ticket = CopyTicket::new(cx.shared, Some(bytes));
        if let Err(e) = send(cx.shared, osd, &msg).await {
            drop(ticket);
            return Err(e);
        }
        if let Some(t) = self.targets.get_mut(&osd) {
            t.sent(
                SentBatch {
                    seq,
                    sent_at: Instant::now(),
                    objects: n_objects,
                    bytes,
                    through,
                    complete,
                    acked: false,
                },
                true,
            );
            self.tickets.insert((osd, seq), ticket);
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
        // Resent while the map keeps the pg_temp: a request lost with the
        // monitor connection (or refused) would leave the PG remapped.
        let has_temp = map.pg_temp.contains_key(&cx.pgid);
        if !self.clear.due(Instant::now(), has_temp, true) {
            return;
        }
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

/// A batch read from the store: the objects after `after` up to (not
/// including) `fence`, closed at `limit_bytes`, [`BACKFILL_BATCH_OBJECTS`]
/// or around a big object (which goes alone, see [`copy_batch_full`]);
/// with their bytes, and whether it ends the copy (nothing left to list
/// and no write in flight beyond the position, which may create an object
/// not listed yet).
type ReadBatch = (Vec<(u32, ObjectName, Option<ObjectState>)>, u64, bool);

fn read_batch(
    store: &Store,
    coll: CollectionId,
    after: Option<&ListCursor>,
    fence: Option<&crate::pg::ObjKey>,
    limit_bytes: u64,
) -> Result<ReadBatch, String> {
    let (names, next) = exec::list_objects(store, coll, after, BACKFILL_BATCH_OBJECTS)
        .map_err(|e| format!("listing: {e}"))?;
    let mut objects = Vec::new();
    let (mut bytes, mut big) = (0u64, false);
    let mut stopped_early = false;
    for (h, n) in &names {
        let at_fence = fence.is_some_and(|f| obj_key(n) >= *f);
        let next = stored_bytes(store, coll, n);
        if at_fence || copy_batch_full(objects.len(), bytes, big, next, limit_bytes) {
            stopped_early = true;
            break;
        }
        let st = exec::get_object_state(store, coll, n).map_err(|e| format!("reading {n}: {e}"))?;
        let w = st.as_ref().map(|s| s.bytes()).unwrap_or(0);
        bytes += w;
        big |= w >= ALONE_OBJECT_BYTES;
        objects.push((*h, n.clone(), st));
    }
    let complete = !stopped_early && next.is_none() && fence.is_none();
    Ok((objects, bytes, complete))
}

/// Like [`read_batch`] for an erasure-coded PG: each object's chunk for
/// `osd`'s shard position, rebuilt from k acting shards.
async fn read_ec_batch(
    cx: &StepCtx<'_>,
    ec: &EcPg,
    osd: i32,
    after: Option<&ListCursor>,
    fence: Option<&crate::pg::ObjKey>,
    limit_bytes: u64,
) -> Result<ReadBatch, String> {
    let (names, next) =
        exec::list_objects(&cx.shared.store, cx.coll, after, BACKFILL_BATCH_OBJECTS)
            .map_err(|e| format!("listing: {e}"))?;
    let sources: Vec<(usize, i32)> = (0..ec.shards.len())
        .filter(|&s| ec.shards[s] != SHARD_HOLE)
        .map(|s| (s, ec.shards[s]))
        .collect();
    let shard = ec
        .up_shard_of(osd)
        .ok_or_else(|| format!("osd.{osd} holds no shard of the up set any more"))?;
    let epoch = cx.pg.epoch();
    let mut objects = Vec::new();
    let (mut bytes, mut big) = (0u64, false);
    let mut stopped_early = false;
    for (h, n) in &names {
        let at_fence = fence.is_some_and(|f| obj_key(n) >= *f);
        // This OSD's own chunk weighs about what the target's will.
        let next = stored_bytes(&cx.shared.store, cx.coll, n);
        if at_fence || copy_batch_full(objects.len(), bytes, big, next, limit_bytes) {
            stopped_early = true;
            break;
        }
        let st = rebuild_chunk(cx.shared, cx.pgid, epoch, ec, n, shard, &sources).await?;
        let w = st.as_ref().map(|s| s.bytes()).unwrap_or(0);
        bytes += w;
        big |= w >= ALONE_OBJECT_BYTES;
        objects.push((*h, n.clone(), st));
    }
    let complete = !stopped_early && next.is_none() && fence.is_none();
    Ok((objects, bytes, complete))
}

/// Sends a start or resend message (no throttle slot) and records it in
/// flight; a failure stalls the target.
async fn send_unslotted(
    shared: &Arc<Shared>,
    osd: i32,
    t: &mut TargetProgress,
    tickets: &mut BTreeMap<(i32, u64), CopyTicket>,
    msg: PgBackfill,
) {
    let bytes: u64 = msg
        .objects
        .iter()
        .map(|(_, _, s)| s.as_ref().map(|s| s.bytes()).unwrap_or(0))
        .sum();
    let objects = msg.objects.len() as u64;
    // A bare start message moves nothing: only object-carrying ones count.
    let ticket = (objects > 0).then(|| CopyTicket::new(shared, None));
    match send(shared, osd, &msg).await {
        Ok(()) => {
            t.sent(
                SentBatch {
                    seq: msg.seq,
                    sent_at: Instant::now(),
                    objects,
                    bytes,
                    through: msg.through.clone(),
                    complete: false,
                    acked: false,
                },
                false,
            );
            if let Some(tk) = ticket {
                tickets.insert((osd, msg.seq), tk);
            }
        }
        Err(e) => t.stalled = Some(e),
    }
}

/// The state `osd` (a backfill target) must hold for `names`, sent again
/// when its backfill resumes: read from the local store (replicated), or
/// each object's chunk for the target's shard position rebuilt from the
/// acting shards (erasure-coded; this OSD holds another position's chunk).
async fn resend_states(
    cx: &StepCtx<'_>,
    osd: i32,
    names: &[ObjectName],
) -> Result<Vec<(u32, ObjectName, Option<ObjectState>)>, String> {
    let Some(ec) = cx.ec else {
        let store = cx.shared.store.clone();
        let coll = cx.coll;
        return blocking_store_call(|| read_states(&store, coll, names));
    };
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let shard = ec
        .up_shard_of(osd)
        .ok_or_else(|| format!("osd.{osd} holds no shard of the up set any more"))?;
    let sources: Vec<(usize, i32)> = (0..ec.shards.len())
        .filter(|&s| ec.shards[s] != SHARD_HOLE)
        .map(|s| (s, ec.shards[s]))
        .collect();
    let epoch = cx.pg.epoch();
    let mut out = Vec::with_capacity(names.len());
    for n in names {
        let st = rebuild_chunk(cx.shared, cx.pgid, epoch, ec, n, shard, &sources).await?;
        out.push((n.hash(), n.clone(), st));
    }
    Ok(out)
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
/// The objects' data goes out as the store buffers it was read into
/// (`encode_parts`: no copy into one message buffer), under the crcs
/// their store reads verified (no second pass for the frame's crc).
async fn send(shared: &Arc<Shared>, osd: i32, msg: &PgBackfill) -> Result<(), String> {
    let (_, conn) = shared.peer(osd).await?;
    let parts = encode_parts(msg);
    let known = known_object_crcs(&parts, &msg.objects);
    conn.send_parts_known(msg_type::PG_BACKFILL, parts, known)
        .await
        .map_err(|e| e.to_string())
}

/// A target's transaction, the info and log it adopts (first message),
/// and its info afterwards.
pub(crate) type TargetTxn = (Transaction, Option<(PgInfo, Vec<LogEntry>)>, PgInfo);

/// Target side: the store transaction for one backfill message (and the
/// info and log the PG adopts), given the target's current info;
/// `blocks`: the message's verified block crcs, kept by the store for the
/// objects' data.
pub(crate) fn target_txn(
    store: &Store,
    coll: CollectionId,
    current: &PgInfo,
    msg: &PgBackfill,
    blocks: Option<&Arc<BlockCrcs>>,
) -> Result<TargetTxn, String> {
    let mut txn = Transaction::new();
    if msg.start.is_some() && msg.through.is_none() {
        // A fresh start: nothing held so far counts.
        for (_, n) in list_all(store, coll)? {
            txn.remove(coll, exec::store_oid(&n));
        }
    }
    let blocks: Vec<Arc<BlockCrcs>> = blocks.into_iter().cloned().collect();
    install_objects(store, coll, &mut txn, &msg.objects, &blocks)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn state(len: usize) -> ObjectState {
        ObjectState {
            data: Bytes::from(vec![3u8; len]),
            attrs: vec![],
            omap: vec![],
            clones: vec![],
            data_crc: None,
        }
    }

    /// Backfill batches close around big objects: each of those travels
    /// alone (its data lands aligned at the target), small ones share a
    /// batch, and the batches cover every object once, in store order.
    #[test]
    fn a_big_object_travels_alone_in_its_backfill_batch() {
        let (_dir, store) = crate::small_test_store();
        let coll = CollectionId::pg(1, 0);
        let mut t = Transaction::new();
        t.create_collection(coll);
        let mut all = BTreeSet::new();
        for i in 0..24 {
            let name = ObjectName::new("", format!("o{i}"));
            let len = if i % 3 == 0 {
                ALONE_OBJECT_BYTES as usize
            } else {
                4096
            };
            exec::put_object_state(&mut t, coll, &name, false, Some(&state(len)));
            all.insert(name.name.clone());
        }
        store.commit(t).unwrap();
        let mut after: Option<ListCursor> = None;
        let mut seen = Vec::new();
        let mut shared_batches = 0;
        for _ in 0..100 {
            let (objects, _, complete) =
                read_batch(&store, coll, after.as_ref(), None, 4 << 20).unwrap();
            let big = objects
                .iter()
                .filter(|(_, _, s)| s.as_ref().unwrap().data.len() >= ALONE_OBJECT_BYTES as usize)
                .count();
            assert!(
                big == 0 || objects.len() == 1,
                "{big} big in a batch of {}",
                objects.len()
            );
            if objects.len() > 1 {
                shared_batches += 1;
            }
            if let Some((h, n, _)) = objects.last() {
                after = Some(ListCursor {
                    hash: *h,
                    namespace: n.namespace.clone(),
                    name: n.name.clone(),
                });
            }
            seen.extend(objects.into_iter().map(|(_, n, _)| n.name));
            if complete {
                break;
            }
        }
        assert_eq!(seen.len(), all.len(), "{seen:?}");
        assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), all);
        assert!(shared_batches > 0, "small objects were not batched");
    }
}
