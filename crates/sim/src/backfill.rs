//! Background backfill and stray removal in the simulator, driven the way
//! `cairn_osd`'s runtime drives them (`backfill::BackfillRun`, the
//! runtime's `on_backfill`, `on_stray`, `on_remove`): once activation
//! reports backfill targets (up members outside the `pg_temp` acting set),
//! the primary sends each its start (the log, and the objects it may have
//! missed when it resumes a recorded backfill), then batches of objects in
//! store order (bit-reversed hash, namespace, name) up to a write in
//! flight, a window of batches per target; the `Pg` learns each target's
//! position (later writes to objects beyond it carry only their log
//! entry); the target installs each batch in one transaction, records its
//! position in its PG info and acknowledges once durable. The per-target
//! bookkeeping — durable cursor, stalls (a batch or write unacknowledged
//! for too long, a failed one), back-off, resume with the missed objects —
//! is the runtime's own `cairn_osd::backfill_target::TargetProgress`. Once
//! every target is complete the primary asks the monitor to clear
//! `pg_temp`; the PG re-peers with acting = up, and once clean its primary
//! tells OSDs holding copies outside the up and acting sets to delete
//! them (strays also announce themselves every few seconds).
//!
//! Throttles and flags as the runtime's `BackfillRun::step`: `nobackfill`
//! and `norecover` hold every backfill, `norebalance` the backfill of a PG
//! that is not degraded, and a target the map marks backfillfull or full
//! holds it as `backfill_toofull` (the slot goes back meanwhile); a
//! stalled target resumes only when none of that holds.
//! `osd_max_backfills` (PGs per primary), `osd_recovery_max_active`
//! (batches in flight per OSD), `osd_recovery_sleep` (a pause after each
//! acknowledged batch, one batch in flight per target) and
//! `osd_recovery_max_bytes_per_sec` (the next batch waits until the bytes
//! sent fit the rate) come from the central config, which the `full`
//! profile draws per seed. Erasure-coded PGs too, when their activation
//! asked for a positional `pg_temp` (`SimConfig::ec_remap`): a target's
//! objects are its position's chunks, rebuilt from the acting shards
//! (`ec.rs`, `ec_backfill_chunks`), and strays are told to go once every
//! target is complete, before `pg_temp` is cleared.

use crate::disk::TxOp;
use crate::osd::{Held, Waiter};
use crate::world::{Ep, Msg, World, SEC};
use cairn_map::{ClusterMap, MonCommand, OsdFlag};
use cairn_ops::{
    BackfillMark, ListCursor, LogEntry, ObjectName, ObjectState, OpError, PgBackfill,
    PgBackfillAck, PgInfo, PgRemove, PgStray,
};
use cairn_osd::backfill_target::{
    pg_temp_unneeded, AckOutcome, PgTempClear, SentBatch, TargetProgress,
};
use cairn_osd::peering_sm::BackfillStart;
use cairn_osd::pg::{cursor_key, obj_key, PgAction, Role};
use cairn_types::{Epoch, PgId};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Batches in flight per target (the runtime's `BACKFILL_WINDOW_BATCHES`).
const WINDOW_BATCHES: usize = 8;
/// Longest a client write waits for a target (the runtime's
/// `BACKFILL_WRITE_WAIT`).
const WRITE_WAIT: Duration = Duration::from_secs(2);
/// A stray copy tells the primary it exists this often (the runtime's
/// `STRAY_NOTIFY_INTERVAL`).
const STRAY_NOTIFY_INTERVAL: u64 = 3 * SEC;

/// The backfill of one PG in one interval (acting primary).
pub(crate) struct SimBackfill {
    pub(crate) interval_since: Epoch,
    targets: BTreeMap<i32, TargetProgress>,
    next_seq: u64,
    reserved: bool,
    /// The request to clear pg_temp once every target is complete.
    clear: PgTempClear,
    /// No batch before this (`osd_recovery_sleep` after an ack).
    not_before: Option<Instant>,
}

impl SimBackfill {
    pub(crate) fn note_write(&mut self, now: Instant, seq: u64, oid: &ObjectName, to: &[i32]) {
        for (o, t) in self.targets.iter_mut() {
            t.note_write(now, seq, oid, to.contains(o));
        }
    }

    pub(crate) fn write_acked(&mut self, from: i32, seq: u64) {
        if let Some(t) = self.targets.get_mut(&from) {
            t.write_acked(seq);
        }
    }

    /// False when `from` is not a target of this run.
    pub(crate) fn write_failed(&mut self, from: i32, seq: u64, why: &OpError) -> bool {
        match self.targets.get_mut(&from) {
            Some(t) => {
                t.write_failed(seq, &why.to_string());
                true
            }
            None => false,
        }
    }

    fn is_finished(&self) -> bool {
        self.targets.values().all(|t| t.done)
    }
}

/// Objects of a collection in store order after `after`, without the EC
/// internal ones.
fn listing(
    objects: &BTreeMap<ObjectName, ObjectState>,
    after: Option<&ListCursor>,
) -> Vec<(u32, ObjectName)> {
    let after = after.map(cursor_key);
    let mut all: Vec<(u32, ObjectName)> = objects
        .keys()
        .filter(|n| !crate::ec::internal(n))
        .filter(|n| after.as_ref().is_none_or(|a| obj_key(n) > *a))
        .map(|n| (n.hash(), n.clone()))
        .collect();
    all.sort_by_key(|(_, n)| obj_key(n));
    all
}

/// Why backfill may not copy now under the map's flags (the runtime's
/// `blocked_by_flags`).
fn blocked_by_flags(map: &ClusterMap, degraded: bool) -> Option<String> {
    if map.flags.contains(&OsdFlag::NoBackfill) {
        return Some("nobackfill is set".into());
    }
    if map.flags.contains(&OsdFlag::NoRecover) {
        return Some("norecover is set".into());
    }
    if !degraded && map.flags.contains(&OsdFlag::NoRebalance) {
        return Some("norebalance is set and the PG is only misplaced".into());
    }
    None
}

/// A central config value of osd.`id`, as a number.
fn cfg_num(map: Option<&ClusterMap>, id: i32, key: &str) -> Option<f64> {
    map?.config_value(&format!("osd.{id}"), key)?
        .parse::<f64>()
        .ok()
}

fn cursor_of(h: u32, n: &ObjectName) -> ListCursor {
    ListCursor {
        hash: h,
        namespace: n.namespace.clone(),
        name: n.name.clone(),
    }
}

/// Batches of `run` in flight that hold a throttle slot (sent by
/// `send_batch`, so with bytes; starts and resends hold none).
fn slotted_in_flight(run: &SimBackfill) -> usize {
    run.targets
        .values()
        .flat_map(|t| t.inflight.iter())
        .filter(|b| !b.acked && b.bytes > 0)
        .count()
}

impl World {
    pub(crate) fn osd_instant(&self, id: i32) -> Instant {
        match self.osds.get(&id) {
            Some(o) => self.instant(&o.clock),
            None => self.base,
        }
    }

    /// The live states of `names` in osd.`id`'s copy of `pgid`.
    fn read_states(
        &self,
        id: i32,
        pgid: PgId,
        names: &[ObjectName],
    ) -> Vec<(u32, ObjectName, Option<ObjectState>)> {
        let coll = self
            .osds
            .get(&id)
            .and_then(|o| o.disk.live.colls.get(&pgid));
        names
            .iter()
            .map(|n| {
                let st = coll.and_then(|c| c.objects.get(n)).cloned();
                (n.hash(), n.clone(), st)
            })
            .collect()
    }

    /// The states backfill target `osd` must hold for `names`: the local
    /// copy's (replicated), or each object's chunk for the target's shard
    /// position rebuilt from the acting shards (erasure-coded; the
    /// runtime's `resend_states` and `read_ec_batch`).
    fn target_states(
        &self,
        id: i32,
        pgid: PgId,
        osd: i32,
        names: &[ObjectName],
    ) -> Result<Vec<(u32, ObjectName, Option<ObjectState>)>, String> {
        if self.pg_is_ec(id, pgid) {
            self.ec_backfill_chunks(id, pgid, osd, names)
        } else {
            Ok(self.read_states(id, pgid, names))
        }
    }

    /// Sends a start or resend message and records it in flight.
    fn send_unslotted(&mut self, id: i32, osd: i32, t: &mut TargetProgress, msg: PgBackfill) {
        let now = self.osd_instant(id);
        t.sent(
            SentBatch {
                seq: msg.seq,
                sent_at: now,
                objects: msg.objects.len() as u64,
                bytes: 0,
                through: msg.through.clone(),
                complete: false,
                acked: false,
            },
            false,
        );
        self.send(Ep::Osd(id), Ep::Osd(osd), Msg::Backfill(msg));
    }

    /// Starts the backfill of `targets` for the interval just activated
    /// with `info` and `log` (before the PG admits its first op).
    pub(crate) fn backfill_start(
        &mut self,
        id: i32,
        pgid: PgId,
        interval_since: Epoch,
        targets: Vec<BackfillStart>,
        info: &PgInfo,
        log: &[LogEntry],
    ) {
        let epoch = self.osd_epoch(id);
        let mut run = SimBackfill {
            interval_since,
            targets: BTreeMap::new(),
            next_seq: 1,
            reserved: false,
            clear: PgTempClear::default(),
            not_before: None,
        };
        let mut positions = BTreeMap::new();
        for t in targets {
            let (through, resend) = t.resume.clone().unwrap_or((None, Vec::new()));
            let objects = match self.target_states(id, pgid, t.osd, &resend) {
                Ok(o) => o,
                Err(e) => {
                    // As the runtime's `BackfillRun::start`: that target
                    // is left out of this interval's run.
                    let o = t.osd;
                    self.trace(|| format!("osd.{id} pg {pgid}: backfill of osd.{o}: {e}"));
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
                pgid,
                from: id,
                epoch,
                interval_since,
                seq,
                start: Some((start_info, log.to_vec())),
                objects,
                through: through.clone(),
                complete: false,
            };
            self.send_unslotted(id, t.osd, &mut tr, msg);
            self.trace(|| {
                format!(
                    "osd.{id} pg {pgid}: backfilling osd.{} from {through:?}",
                    t.osd
                )
            });
            positions.insert(t.osd, through.as_ref().map(cursor_key));
            run.targets.insert(t.osd, tr);
        }
        if let Some(s) = self.pg_mut(id, pgid) {
            s.pg.set_backfill_targets(positions);
            s.backfill = Some(run);
        }
    }

    /// After an activation: a clean PG's strays delete their copies; the
    /// backfill takes its first step.
    pub(crate) fn after_activation(&mut self, id: i32, pgid: PgId) {
        let epoch = self.osd_epoch(id);
        let strays = match self.pg_mut(id, pgid) {
            Some(s) if s.pg.state.clean && !s.strays.is_empty() => std::mem::take(&mut s.strays),
            _ => Vec::new(),
        };
        for o in strays {
            self.send_pg_remove(id, o, pgid, epoch);
        }
        self.backfill_step(id, pgid);
    }

    /// One backfill step of an active primary with targets: stalls and
    /// resumes, the `osd_max_backfills` slot, the next batches; once every
    /// target is complete, the request to clear `pg_temp`.
    /// A primary with no backfill whose up members all serve in its
    /// pg_temp acting set asks (again while the map keeps it) for the
    /// pg_temp to go (the runtime's `clear_unneeded_pg_temp`).
    fn clear_unneeded_pg_temp(&mut self, id: i32, pgid: PgId) {
        let now = self.osd_instant(id);
        let ec = self
            .proc_mut(id)
            .and_then(|p| p.map.clone())
            .and_then(|m| cairn_osd::ec_pool::EcPg::from_map(&m, pgid.pool.0, pgid.seed).ok())
            .flatten();
        let ec_running = self.ec_running(id, pgid);
        let has_temp = self
            .proc_mut(id)
            .and_then(|p| p.map.as_ref())
            .is_some_and(|m| m.pg_temp.contains_key(&pgid));
        let Some(s) = self.pg_mut(id, pgid) else {
            return;
        };
        if s.backfill.is_some() || s.run.is_some() || ec_running {
            return;
        }
        let unneeded = s.pg.role == Role::Primary
            && s.pg.state.active
            && match &ec {
                Some(ec) => ec.pg_temp_unneeded(),
                None => {
                    s.pg.placement()
                        .is_some_and(|p| pg_temp_unneeded(&p.up, &p.acting))
                }
            };
        if !s.pg_temp_clear.due(now, has_temp, unneeded) {
            return;
        }
        self.trace(|| {
            format!("osd.{id} pg {pgid}: every up member serves in the pg_temp; clearing it")
        });
        self.send_pg_temp(id, pgid, Vec::new());
    }

    pub(crate) fn backfill_step(&mut self, id: i32, pgid: PgId) {
        self.clear_unneeded_pg_temp(id, pgid);
        let now = self.osd_instant(id);
        let batch_wait = Duration::from_micros(self.cfg.peer_timeout);
        let Some(s) = self.pg_mut(id, pgid) else {
            return;
        };
        if s.pg.role != Role::Primary || !s.pg.state.active {
            return;
        }
        let Some(mut run) = s.backfill.take() else {
            return;
        };
        let mut acts: Vec<PgAction> = Vec::new();
        let degraded =
            s.pg.placement()
                .is_some_and(|p| (p.acting.len() as u32) < p.size);
        let map = self.proc_mut(id).and_then(|p| p.map.clone());
        let pending: Vec<i32> = run
            .targets
            .iter()
            .filter(|(_, t)| !t.done)
            .map(|(o, _)| *o)
            .collect();
        let held_by_flag = map.as_ref().and_then(|m| blocked_by_flags(m, degraded));
        let toofull = map.as_ref().and_then(|m| m.backfill_toofull(&pending));
        // Stalled targets leave the PG's writes and resume after a back-off
        // (not while a flag or a full target holds the backfill: a resume
        // copies the objects the target missed).
        let osds: Vec<i32> = run.targets.keys().copied().collect();
        let mut resume = Vec::new();
        for osd in osds {
            let Some(t) = run.targets.get_mut(&osd) else {
                continue;
            };
            let fresh = t.stalled.is_none();
            if let Some(why) = t
                .detect_stall(now, batch_wait, WRITE_WAIT)
                .map(str::to_string)
            {
                if fresh {
                    self.trace(|| format!("osd.{id} pg {pgid}: backfill target osd.{osd}: {why}"));
                }
            }
            let Some(t) = run.targets.get_mut(&osd) else {
                continue;
            };
            if t.begin_backoff(now).is_some() {
                if let Some(s) = self.pg_mut(id, pgid) {
                    acts.extend(s.pg.drop_backfill_target(osd));
                }
                continue;
            }
            let busy = self
                .pg_mut(id, pgid)
                .is_some_and(|s| t.dirty.iter().any(|o| s.pg.is_busy(o)));
            let held = held_by_flag.is_some() || toofull.is_some();
            if t.resume_due(now) && !busy && !held {
                resume.push(osd);
            }
        }
        for osd in resume {
            self.resume_target(id, pgid, &mut run, osd);
        }
        if run.is_finished() {
            if self.pg_is_ec(id, pgid) {
                // EC: every up member now holds its whole shard, so copies
                // outside the up set are no longer needed; told before
                // pg_temp is cleared (the runtime's `backfill_step`): the
                // next primary may never have heard of them.
                let epoch = self.osd_epoch(id);
                let strays = self
                    .pg_mut(id, pgid)
                    .map(|s| std::mem::take(&mut s.strays))
                    .unwrap_or_default();
                for o in strays {
                    self.send_pg_remove(id, o, pgid, epoch);
                }
            }
            self.backfill_finish(id, pgid, &mut run);
        } else if let Some(why) = held_by_flag {
            self.stats_flag_wait();
            self.trace(|| format!("osd.{id} pg {pgid}: backfill waits: {why}"));
            if let Some(s) = self.pg_mut(id, pgid) {
                s.pg.state.backfill_wait = true;
                s.pg.state.backfill_toofull = false;
                s.pg.state.backfilling = false;
            }
        } else if let Some(why) = toofull {
            // The slot goes back to the other PGs meanwhile.
            self.stats_toofull_wait();
            self.trace(|| format!("osd.{id} pg {pgid}: {why}"));
            if run.reserved {
                if let Some(p) = self.proc_mut(id) {
                    p.backfill_slots.remove(&pgid);
                }
                run.reserved = false;
            }
            if let Some(s) = self.pg_mut(id, pgid) {
                s.pg.state.backfill_wait = false;
                s.pg.state.backfill_toofull = true;
                s.pg.state.backfilling = false;
            }
        } else {
            self.send_batches(id, pgid, &mut run);
        }
        if let Some(s) = self.pg_mut(id, pgid) {
            // A new interval may have begun meanwhile (actions run below).
            if s.backfill.is_none() && s.pg.info.same_interval_since == run.interval_since {
                s.backfill = Some(run);
            }
        }
        if !acts.is_empty() {
            self.pg_actions(id, pgid, acts);
        }
    }

    fn send_batches(&mut self, id: i32, pgid: PgId, run: &mut SimBackfill) {
        let max_backfills = self
            .proc_mut(id)
            .and_then(|p| p.map.as_ref())
            .and_then(|m| m.config_value(&format!("osd.{id}"), "osd_max_backfills"))
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(1)
            .max(1);
        if !run.reserved {
            let Some(p) = self.proc_mut(id) else {
                return;
            };
            if p.backfill_slots.len() >= max_backfills && !p.backfill_slots.contains(&pgid) {
                if let Some(s) = p.pgs.get_mut(&pgid) {
                    s.pg.state.backfill_wait = true;
                    s.pg.state.backfilling = false;
                }
                return;
            }
            p.backfill_slots.insert(pgid);
            run.reserved = true;
        }
        let now = self.osd_instant(id);
        if run.not_before.is_some_and(|t| now < t) {
            return;
        }
        let map = self.proc_mut(id).and_then(|p| p.map.clone());
        let max_active = cfg_num(map.as_deref(), id, "osd_recovery_max_active")
            .map_or(3, |v| v as usize)
            .max(1);
        let rate = cfg_num(map.as_deref(), id, "osd_recovery_max_bytes_per_sec").unwrap_or(0.0);
        let sleep = cfg_num(map.as_deref(), id, "osd_recovery_sleep").unwrap_or(0.0) > 0.0;
        // With a sleep between batches, one batch per target at a time.
        let window = if sleep { 1 } else { WINDOW_BATCHES };
        let mut throttled = false;
        let mut progressed = true;
        while progressed && !throttled {
            progressed = false;
            let ready: Vec<i32> = run
                .targets
                .iter()
                .filter(|(_, t)| t.ready_for_batch(window))
                .map(|(o, _)| *o)
                .collect();
            for osd in ready {
                let local = self.local_now(id);
                let active = self.active_batches(id) + slotted_in_flight(run);
                let Some(p) = self.proc_mut(id) else {
                    return;
                };
                if active >= max_active || p.recovery_next_send.is_some_and(|t| local < t) {
                    throttled = true;
                    break;
                }
                if let Some(bytes) = self.send_batch(id, pgid, run, osd) {
                    progressed = true;
                    if rate > 0.0 {
                        let p = self.proc_mut(id).expect("running");
                        let from = p.recovery_next_send.unwrap_or(local).max(local);
                        p.recovery_next_send = Some(from + (bytes as f64 * 1e6 / rate) as u64);
                    }
                }
            }
        }
        if let Some(s) = self.pg_mut(id, pgid) {
            s.pg.state.backfill_wait = throttled;
            s.pg.state.backfill_toofull = false;
            s.pg.state.backfilling = !throttled;
        }
    }

    /// Backfill batches of this OSD in flight (sent, not acknowledged) in
    /// every PG but the one whose run is out being stepped
    /// (`osd_recovery_max_active` counts them).
    fn active_batches(&mut self, id: i32) -> usize {
        self.proc_mut(id).map_or(0, |p| {
            p.pgs
                .values()
                .filter_map(|s| s.backfill.as_ref())
                .map(slotted_in_flight)
                .sum()
        })
    }

    /// Reads and sends the next batch to `osd`: the objects after its
    /// position up to the first with a write in flight, at most the
    /// configured batch size; Some(bytes sent), None when there is nothing
    /// to send now.
    fn send_batch(&mut self, id: i32, pgid: PgId, run: &mut SimBackfill, osd: i32) -> Option<u64> {
        let t = run.targets.get_mut(&osd)?;
        let after = t.sent_through.clone();
        let limit = self.cfg.backfill_batch_objects.max(1);
        let s = self.proc_mut(id).and_then(|p| p.pgs.get(&pgid))?;
        let fence =
            s.pg.first_busy_after(after.as_ref().map(cursor_key).as_ref());
        let epoch = s.pg.epoch();
        let listed = self
            .osds
            .get(&id)
            .and_then(|o| o.disk.live.colls.get(&pgid))
            .map(|c| listing(&c.objects, after.as_ref()))
            .unwrap_or_default();
        let mut names = Vec::new();
        let mut stopped_early = false;
        for (h, n) in &listed {
            if fence.as_ref().is_some_and(|f| obj_key(n) >= *f) || names.len() >= limit {
                stopped_early = true;
                break;
            }
            names.push((*h, n.clone()));
        }
        let complete = !stopped_early && fence.is_none();
        if names.is_empty() && !complete {
            return None;
        }
        let wanted: Vec<ObjectName> = names.iter().map(|(_, n)| n.clone()).collect();
        let objects = match self.target_states(id, pgid, osd, &wanted) {
            Ok(o) => o,
            Err(e) => {
                // The runtime's `step`: a batch that cannot be read stalls
                // its target (resumed later from its durable cursor).
                self.trace(|| format!("osd.{id} pg {pgid}: backfill batch for osd.{osd}: {e}"));
                if let Some(t) = run.targets.get_mut(&osd) {
                    t.stalled = Some(e);
                }
                return None;
            }
        };
        let through = match names.last() {
            Some((h, n)) => Some(cursor_of(*h, n)),
            None => after,
        };
        let seq = run.next_seq;
        run.next_seq += 1;
        let n_objects = objects.len() as u64;
        // At least 1: a batch in flight counts against the throttle.
        let bytes = objects
            .iter()
            .map(|(_, _, st)| st.as_ref().map_or(0, |st| st.data.len() as u64))
            .sum::<u64>()
            .max(1);
        let msg = PgBackfill {
            pgid,
            from: id,
            epoch,
            interval_since: run.interval_since,
            seq,
            start: None,
            objects,
            through: through.clone(),
            complete,
        };
        // The position moves before anything else runs: later writes to
        // these objects then carry their data.
        if let Some(s) = self.pg_mut(id, pgid) {
            if let Some(c) = &through {
                s.pg.backfill_advance(osd, cursor_key(c));
            }
            if complete {
                s.pg.backfill_complete(osd);
            }
        }
        let now = self.osd_instant(id);
        if let Some(t) = run.targets.get_mut(&osd) {
            t.sent(
                SentBatch {
                    seq,
                    sent_at: now,
                    objects: n_objects,
                    bytes,
                    through,
                    complete,
                    acked: false,
                },
                true,
            );
        }
        self.stats_backfill_batch();
        self.trace(|| {
            format!(
                "osd.{id} pg {pgid}: backfill batch {seq} to osd.{osd}: {n_objects} objects{}",
                if complete { " (last)" } else { "" }
            )
        });
        self.send(Ep::Osd(id), Ep::Osd(osd), Msg::Backfill(msg));
        Some(bytes)
    }

    /// Resumes a stalled target from its durable cursor: the current log
    /// and info, then the objects it may have missed, then it rejoins the
    /// PG's writes at that cursor.
    fn resume_target(&mut self, id: i32, pgid: PgId, run: &mut SimBackfill, osd: i32) {
        let Some(t) = run.targets.get_mut(&osd) else {
            return;
        };
        let (through, resend) = t.resume(false);
        let Some(s) = self.proc_mut(id).and_then(|p| p.pgs.get(&pgid)) else {
            return;
        };
        let info = PgInfo {
            backfill: Some(BackfillMark {
                through: through.clone(),
            }),
            ..s.pg.info.clone()
        };
        let log: Vec<LogEntry> = s.pg.log().cloned().collect();
        let epoch = s.pg.epoch();
        let mut first = Some((info, log));
        let mut chunks: Vec<Vec<ObjectName>> = resend
            .chunks(self.cfg.backfill_batch_objects.max(1))
            .map(|c| c.to_vec())
            .collect();
        if chunks.is_empty() {
            chunks.push(Vec::new());
        }
        for names in chunks {
            let objects = match self.target_states(id, pgid, osd, &names) {
                Ok(o) => o,
                Err(e) => {
                    self.trace(|| format!("osd.{id} pg {pgid}: resuming osd.{osd}: {e}"));
                    if let Some(t) = run.targets.get_mut(&osd) {
                        t.stalled = Some(e);
                    }
                    return;
                }
            };
            let seq = run.next_seq;
            run.next_seq += 1;
            let msg = PgBackfill {
                pgid,
                from: id,
                epoch,
                interval_since: run.interval_since,
                seq,
                start: first.take(),
                objects,
                through: through.clone(),
                complete: false,
            };
            if let Some(t) = run.targets.get_mut(&osd) {
                self.send_unslotted(id, osd, t, msg);
            }
        }
        self.trace(|| {
            format!("osd.{id} pg {pgid}: backfill of osd.{osd} resumes from {through:?}")
        });
        if let Some(s) = self.pg_mut(id, pgid) {
            s.pg.add_backfill_target(osd);
            if let Some(c) = &through {
                s.pg.backfill_advance(osd, cursor_key(c));
            }
        }
    }

    /// Every target is complete: release the slot and ask the monitor to
    /// clear pg_temp (the PG then re-peers with acting = up).
    fn backfill_finish(&mut self, id: i32, pgid: PgId, run: &mut SimBackfill) {
        if run.reserved {
            if let Some(p) = self.proc_mut(id) {
                p.backfill_slots.remove(&pgid);
            }
            run.reserved = false;
        }
        let has_temp = self
            .proc_mut(id)
            .and_then(|p| p.map.as_ref())
            .is_some_and(|m| m.pg_temp.contains_key(&pgid));
        if let Some(s) = self.pg_mut(id, pgid) {
            s.pg.state.backfilling = false;
            s.pg.state.backfill_wait = false;
        }
        // Resent while the map keeps the pg_temp (a request lost in a
        // partition from the monitor).
        let now = self.osd_instant(id);
        if !run.clear.due(now, has_temp, true) {
            return;
        }
        self.trace(|| format!("osd.{id} pg {pgid}: backfill complete; clearing pg_temp"));
        self.send_pg_temp(id, pgid, Vec::new());
    }

    pub(crate) fn on_backfill_ack(&mut self, id: i32, ack: PgBackfillAck) {
        let Some(run) = self
            .pg_mut(id, ack.pgid)
            .and_then(|s| s.backfill.as_mut())
            .filter(|r| r.interval_since == ack.interval_since)
        else {
            return;
        };
        let Some(t) = run.targets.get_mut(&ack.from) else {
            return;
        };
        let outcome = t.on_ack(ack.seq, ack.result.clone());
        if matches!(outcome, AckOutcome::Acked { .. }) {
            let sleep = self
                .proc_mut(id)
                .and_then(|p| p.map.clone())
                .and_then(|m| cfg_num(Some(&m), id, "osd_recovery_sleep"))
                .unwrap_or(0.0);
            if sleep > 0.0 {
                let now = self.osd_instant(id);
                if let Some(run) = self.pg_mut(id, ack.pgid).and_then(|s| s.backfill.as_mut()) {
                    run.not_before = Some(now + Duration::from_secs_f64(sleep));
                }
            }
        }
        if let (AckOutcome::Failed, Err(e)) = (&outcome, &ack.result) {
            let (pgid, from, seq) = (ack.pgid, ack.from, ack.seq);
            self.trace(|| {
                format!("osd.{id} pg {pgid}: backfill batch {seq} failed on osd.{from}: {e}")
            });
        }
        self.backfill_step(id, ack.pgid);
    }

    /// Backfill target side: installs a batch in one transaction and
    /// acknowledges it once durable (the runtime's `on_backfill`).
    pub(crate) fn on_backfill(&mut self, id: i32, bf: PgBackfill) {
        let mine = self.osd_epoch(id);
        if bf.epoch > mine {
            if let Some(p) = self.proc_mut(id) {
                if p.held_repops.len() < 1024 {
                    p.held_repops.push(Held::Backfill(bf));
                }
            }
            self.send(Ep::Osd(id), Ep::Mon, Msg::MapSub { have: mine });
            return;
        }
        let pgid = bf.pgid;
        let room = self.osds.get(&id).map(|o| o.disk.available_bytes());
        let ack = |result: Result<(), String>| PgBackfillAck {
            pgid,
            from: id,
            interval_since: bf.interval_since,
            seq: bf.seq,
            result,
        };
        let Some(s) = self.pg_mut(id, pgid) else {
            let a = ack(Err(format!("osd.{id} has no PG {pgid}")));
            self.send(Ep::Osd(id), Ep::Osd(bf.from), Msg::BackfillAck(a));
            return;
        };
        s.pg.adopt_primary_interval_start(bf.from, bf.interval_since);
        let from_primary =
            s.pg.placement()
                .is_some_and(|p| p.primary == Some(bf.from) && p.up.contains(&id));
        let current = bf.interval_since >= s.pg.info.same_interval_since
            || bf.epoch >= s.pg.info.same_interval_since;
        if from_primary && current {
            s.pg.adopt_backfill_interval(bf.from, bf.interval_since);
        }
        if !from_primary || !current {
            let why = format!(
                "backfill from osd.{} for interval {} refused: not this OSD's primary or an older interval (ours {})",
                bf.from, bf.interval_since.0, s.pg.info.same_interval_since.0
            );
            self.send(
                Ep::Osd(id),
                Ep::Osd(bf.from),
                Msg::BackfillAck(ack(Err(why))),
            );
            return;
        }
        if bf.interval_since > s.pg.info.same_interval_since {
            s.pg.info.same_interval_since = bf.interval_since;
        }
        // The transaction (the runtime's `target_txn`).
        let (mut ops, grows) = {
            let live = self
                .osds
                .get(&id)
                .and_then(|o| o.disk.live.colls.get(&pgid));
            let mut ops = Vec::new();
            if bf.start.is_some() && bf.through.is_none() {
                // A fresh start: nothing held so far counts.
                for n in live.map(|c| c.objects.keys()).into_iter().flatten() {
                    if !crate::ec::internal(n) {
                        ops.push(TxOp::Put(pgid, n.clone(), None));
                    }
                }
            }
            let old = |n: &ObjectName| {
                live.and_then(|c| c.objects.get(n))
                    .map_or(0, |st| st.data.len() as u64)
            };
            let grows: u64 = bf
                .objects
                .iter()
                .map(|(_, n, st)| {
                    st.as_ref()
                        .map_or(0, |st| (st.data.len() as u64).saturating_sub(old(n)))
                })
                .sum();
            (ops, grows)
        };
        // A batch that does not fit is refused whole (the store's StoreFull).
        if let Some(r) = room.filter(|r| grows > *r) {
            let e = crate::osd::no_space(id, grows, r).to_string();
            self.send(Ep::Osd(id), Ep::Osd(bf.from), Msg::BackfillAck(ack(Err(e))));
            return;
        }
        for (_, n, st) in &bf.objects {
            ops.push(TxOp::Put(pgid, n.clone(), st.clone()));
        }
        let mark = (!bf.complete).then(|| BackfillMark {
            through: bf.through.clone(),
        });
        let Some(s) = self.pg_mut(id, pgid) else {
            return;
        };
        match &bf.start {
            Some((info, log)) => {
                let info = PgInfo {
                    backfill: mark,
                    ..info.clone()
                };
                ops.push(TxOp::LogReplace(pgid, log.clone()));
                ops.push(TxOp::Info(pgid, info.clone()));
                s.pg.reload(info, log.clone());
            }
            None => {
                s.pg.info.backfill = mark;
                ops.push(TxOp::Info(pgid, s.pg.info.clone()));
            }
        }
        let waiter = Waiter::BackfillAck {
            pgid,
            primary: bf.from,
            seq: bf.seq,
            interval_since: bf.interval_since,
        };
        self.submit(id, ops, Some(waiter));
    }

    /// Stray side: a copy outside the up and acting sets tells the acting
    /// primary it exists, every few seconds.
    pub(crate) fn tell_primary_if_stray(&mut self, id: i32, pgid: PgId) {
        let local = self.local_now(id);
        let Some(s) = self.pg_mut(id, pgid) else {
            return;
        };
        let Some(p) = s.pg.placement() else {
            return;
        };
        let Some(primary) = p.primary else {
            return;
        };
        if p.up.contains(&id) || p.acting.contains(&id) || primary == id {
            s.stray_told_at = None;
            return;
        }
        if s.stray_told_at
            .is_some_and(|t| local < t + STRAY_NOTIFY_INTERVAL)
        {
            return;
        }
        s.stray_told_at = Some(local);
        let epoch = p.epoch;
        self.send(
            Ep::Osd(id),
            Ep::Osd(primary),
            Msg::PgStray(PgStray {
                pgid,
                from: id,
                epoch,
            }),
        );
    }

    /// Primary side: a copy outside the acting and up sets is told to go
    /// once this PG is active+clean and not re-peering.
    pub(crate) fn on_pg_stray(&mut self, id: i32, n: PgStray) {
        let epoch = self.osd_epoch(id);
        let Some(s) = self.pg_mut(id, n.pgid) else {
            return;
        };
        let Some(p) = s.pg.placement() else {
            return;
        };
        let outside = !p.up.contains(&n.from) && !p.acting.contains(&n.from);
        let clean =
            s.pg.role == Role::Primary && s.pg.state.active && s.pg.state.clean && s.run.is_none();
        if !outside || !clean || n.from == id || self.ec_running(id, n.pgid) {
            return;
        }
        self.send_pg_remove(id, n.from, n.pgid, epoch);
    }

    /// Primary `id` tells `stray` its copy of `pgid` is no longer needed.
    fn send_pg_remove(&mut self, id: i32, stray: i32, pgid: PgId, epoch: Epoch) {
        self.send(
            Ep::Osd(id),
            Ep::Osd(stray),
            Msg::PgRemove(PgRemove {
                pgid,
                from: id,
                epoch,
            }),
        );
    }

    /// OSD `id` asks the monitor for `pgid`'s pg_temp `osds` (empty: clear it).
    pub(crate) fn send_pg_temp(&mut self, id: i32, pgid: PgId, osds: Vec<i32>) {
        self.send(
            Ep::Osd(id),
            Ep::Mon,
            Msg::MonCmd(MonCommand::PgTemp {
                from: id,
                pgid,
                osds,
            }),
        );
    }

    /// Stray side: the primary of a clean PG says this copy is no longer
    /// needed; deleted unless this OSD is in the placement (as it knows
    /// it) or the sender is not its primary.
    pub(crate) fn on_pg_remove(&mut self, id: i32, r: PgRemove) {
        if r.epoch > self.osd_epoch(id) {
            // The runtime waits for the map; here the stray's next notice
            // brings another request.
            return;
        }
        let Some(s) = self.pg_mut(id, r.pgid) else {
            return;
        };
        let needed = s.pg.placement().is_none_or(|p| {
            p.up.contains(&id) || p.acting.contains(&id) || p.primary != Some(r.from)
        });
        if needed || s.run.is_some() || self.ec_running(id, r.pgid) {
            return;
        }
        self.flush(id);
        if let Some(p) = self.proc_mut(id) {
            p.pgs.remove(&r.pgid);
            p.backfill_slots.remove(&r.pgid);
        }
        self.submit(id, vec![TxOp::RemoveColl(r.pgid)], None);
        self.flush(id);
        self.ec_drop_parked(id, r.pgid, true);
        self.stats_stray_removed();
        let (pgid, from) = (r.pgid, r.from);
        self.trace(|| format!("osd.{id} pg {pgid}: stray copy removed (primary osd.{from})"));
    }
}
