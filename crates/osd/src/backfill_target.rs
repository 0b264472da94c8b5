//! One backfill target's progress as a pure state machine: the batches in
//! flight and the *durable cursor* (the position of the last batch
//! acknowledged together with every earlier one), the client writes the
//! target owes an acknowledgement for, stall detection (a batch or a write
//! unacknowledged for too long, a failed batch or write), the back-off
//! before a stalled target resumes, and what it is sent again when it does
//! (its durable cursor and the objects it may have missed). It does no I/O
//! and reads no clock (callers pass `now`): the OSD runtime's
//! `backfill::BackfillRun` drives one per target with the real store and
//! connections, the simulator with its own.

use cairn_ops::{ListCursor, ObjectName};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// A stalled target resumes after this (doubled at each stall in a row,
/// up to [`RESTART_AFTER_MAX`]).
pub const RESTART_AFTER: Duration = Duration::from_millis(500);
pub const RESTART_AFTER_MAX: Duration = Duration::from_secs(30);

/// One batch sent to a target and not yet acknowledged.
#[derive(Debug, Clone)]
pub struct SentBatch {
    pub seq: u64,
    pub sent_at: Instant,
    pub objects: u64,
    pub bytes: u64,
    /// The target holds every object up to here once this batch is durable.
    pub through: Option<ListCursor>,
    pub complete: bool,
    pub acked: bool,
}

/// What an acknowledgement did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckOutcome {
    /// Not a batch in flight (an older run's, or a duplicate): ignored.
    Unknown,
    /// The batch failed: the target is stalled.
    Failed,
    /// The batch is acknowledged; `durable` lists the batches (objects,
    /// bytes) the durable cursor moved over, oldest first.
    Acked { durable: Vec<(u64, u64)> },
}

/// One backfill target's progress (see the module comment).
#[derive(Debug, Clone, Default)]
pub struct TargetProgress {
    /// Last object sent (store order): the next batch starts after it.
    pub sent_through: Option<ListCursor>,
    /// Last object the target holds durably (every batch up to there
    /// acknowledged): where it resumes after a stall.
    pub durable: Option<ListCursor>,
    /// Batches in flight, in send order.
    pub inflight: VecDeque<SentBatch>,
    pub done: bool,
    /// Why the target stopped (a failed or lost batch, a write it did not
    /// acknowledge in time); it resumes after `restart_at`.
    pub stalled: Option<String>,
    /// When a stalled target resumes (it was dropped from the PG's writes
    /// until then).
    pub restart_at: Option<Instant>,
    /// Stalls in a row (the back-off grows with them).
    pub stalls: u32,
    /// Client writes sent to the target and not acknowledged yet: version
    /// seq -> (sent at, object).
    pub unacked_writes: BTreeMap<u64, (Instant, ObjectName)>,
    /// Objects whose writes the target may have missed (unacknowledged
    /// when it was dropped, or written while it was dropped): sent again
    /// when it resumes.
    pub dirty: BTreeSet<ObjectName>,
    pub copied_objects: u64,
}

impl TargetProgress {
    /// A target starting (or resuming a recorded backfill) at `through`.
    pub fn starting_at(through: Option<ListCursor>) -> TargetProgress {
        TargetProgress {
            sent_through: through.clone(),
            durable: through,
            ..TargetProgress::default()
        }
    }

    /// A batch went out (`advance`: it moves the send position, as every
    /// object-carrying batch after the start does).
    pub fn sent(&mut self, b: SentBatch, advance: bool) {
        if advance {
            self.sent_through = b.through.clone();
        }
        self.inflight.push_back(b);
    }

    /// Whether another batch may go now with `window` batches in flight at
    /// most.
    pub fn ready_for_batch(&self, window: usize) -> bool {
        !self.done
            && self.stalled.is_none()
            && self.inflight.len() < window
            && !self.inflight.back().is_some_and(|b| b.complete)
    }

    /// The target answered batch `seq`.
    pub fn on_ack(&mut self, seq: u64, result: Result<(), String>) -> AckOutcome {
        let Some(b) = self.inflight.iter_mut().find(|b| b.seq == seq && !b.acked) else {
            return AckOutcome::Unknown;
        };
        b.acked = true;
        if let Err(e) = result {
            self.stalled = Some(format!("batch {seq} failed: {e}"));
            return AckOutcome::Failed;
        }
        // The durable cursor moves over every batch acknowledged in order.
        let mut durable = Vec::new();
        while self.inflight.front().is_some_and(|b| b.acked) {
            let Some(b) = self.inflight.pop_front() else {
                break;
            };
            durable.push((b.objects, b.bytes));
            self.copied_objects += b.objects;
            self.durable = b.through.clone();
            self.stalls = 0;
            if b.complete {
                self.done = true;
            }
        }
        AckOutcome::Acked { durable }
    }

    /// A client write (version `seq`, on `oid`) was sent to the target
    /// (`included`) or, while it is dropped from the PG's writes, not.
    pub fn note_write(&mut self, now: Instant, seq: u64, oid: &ObjectName, included: bool) {
        if included {
            self.unacked_writes.insert(seq, (now, oid.clone()));
        } else if self.stalled.is_some() {
            self.dirty.insert(oid.clone());
        }
    }

    pub fn write_acked(&mut self, seq: u64) {
        self.unacked_writes.remove(&seq);
    }

    /// The target failed to commit client write `seq`.
    pub fn write_failed(&mut self, seq: u64, why: &str) {
        if self.stalled.is_none() {
            self.stalled = Some(format!("write {seq} failed: {why}"));
        }
    }

    /// Marks the target stalled when its oldest unacknowledged batch waited
    /// more than `batch_wait` or a client write more than `write_wait`;
    /// returns why it is stalled (None: it is not).
    pub fn detect_stall(
        &mut self,
        now: Instant,
        batch_wait: Duration,
        write_wait: Duration,
    ) -> Option<&str> {
        if self.stalled.is_none() {
            let batch = self
                .inflight
                .iter()
                .find(|b| !b.acked)
                .filter(|b| now.duration_since(b.sent_at) > batch_wait);
            if let Some(b) = batch {
                self.stalled = Some(format!(
                    "batch {} not acknowledged within {batch_wait:?}",
                    b.seq
                ));
            }
        }
        if self.stalled.is_none() {
            self.stalled = self
                .unacked_writes
                .iter()
                .find(|(_, (at, _))| now.duration_since(*at) > write_wait)
                .map(|(seq, (_, oid))| {
                    format!("write {seq} to {oid} not acknowledged within {write_wait:?}")
                });
        }
        self.stalled.as_deref()
    }

    /// A stalled target not yet backing off starts to: its batches in
    /// flight are forgotten (returned: their seqs, so the caller can
    /// release what it holds for them), the writes it did not acknowledge
    /// become dirty, and it resumes after the back-off. None when it is not
    /// stalled or already backing off. The caller drops it from the PG's
    /// writes (`Pg::drop_backfill_target`).
    pub fn begin_backoff(&mut self, now: Instant) -> Option<(Duration, Vec<u64>)> {
        if self.stalled.is_none() || self.restart_at.is_some() {
            return None;
        }
        let delay = RESTART_AFTER
            .saturating_mul(1 << self.stalls.min(8))
            .min(RESTART_AFTER_MAX);
        self.stalls += 1;
        let dropped = self.inflight.drain(..).map(|b| b.seq).collect();
        let unacked = std::mem::take(&mut self.unacked_writes);
        self.dirty.extend(unacked.into_values().map(|(_, oid)| oid));
        self.done = false;
        self.restart_at = Some(now + delay);
        Some((delay, dropped))
    }

    /// Whether a backing-off target may resume now.
    pub fn resume_due(&self, now: Instant) -> bool {
        self.restart_at.is_some_and(|at| at <= now)
    }

    /// Resumes the target: from its durable cursor (`start_over`: from the
    /// start). Returns the position it
    /// resumes from and the objects to send again first (none when it
    /// starts over: it drops what it holds, and they come with the
    /// normal batches). The caller sends the current log and info, then
    /// those objects, then re-adds it to the PG's writes at that position.
    pub fn resume(&mut self, start_over: bool) -> (Option<ListCursor>, Vec<ObjectName>) {
        let through = if start_over {
            None
        } else {
            self.durable.clone()
        };
        let dirty: Vec<ObjectName> = std::mem::take(&mut self.dirty).into_iter().collect();
        self.stalled = None;
        self.restart_at = None;
        self.sent_through = through.clone();
        let resend = if through.is_some() { dirty } else { Vec::new() };
        (through, resend)
    }
}

/// How often an active primary asks again for its PG's `pg_temp` to be
/// cleared while the map still shows it (a request lost with a monitor
/// connection, or refused, is not final).
pub const PG_TEMP_CLEAR_RESEND: Duration = Duration::from_secs(5);

/// Whether a replicated PG's `pg_temp` is no longer needed although no
/// backfill runs: every member of the (non-empty) up set is in the acting
/// set, so each went active with the PG and is complete. This happens when
/// the up set changes back to members of the `pg_temp` (in another order,
/// or fewer): nothing is left to backfill, yet the acting set still is
/// not the up set, so the PG would stay remapped for good.
pub fn pg_temp_unneeded(up: &[i32], acting: &[i32]) -> bool {
    !up.is_empty() && up != acting && up.iter().all(|o| acting.contains(o))
}

/// The request to clear a PG's `pg_temp`, resent while the map still has
/// it.
#[derive(Debug, Clone, Default)]
pub struct PgTempClear {
    sent_at: Option<Instant>,
}

impl PgTempClear {
    /// Whether to send the request now (recorded as sent): the map still
    /// has the PG's `pg_temp`, it is no longer needed, and no request went
    /// out within [`PG_TEMP_CLEAR_RESEND`].
    pub fn due(&mut self, now: Instant, map_has_temp: bool, unneeded: bool) -> bool {
        if !map_has_temp {
            self.sent_at = None;
            return false;
        }
        if !unneeded
            || self
                .sent_at
                .is_some_and(|t| now.duration_since(t) < PG_TEMP_CLEAR_RESEND)
        {
            return false;
        }
        self.sent_at = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cur(name: &str) -> Option<ListCursor> {
        Some(ListCursor {
            hash: 0,
            namespace: String::new(),
            name: name.into(),
        })
    }

    fn batch(seq: u64, at: Instant, through: &str, complete: bool) -> SentBatch {
        SentBatch {
            seq,
            sent_at: at,
            objects: 2,
            bytes: 10,
            through: cur(through),
            complete,
            acked: false,
        }
    }

    #[test]
    fn the_durable_cursor_moves_only_over_batches_acknowledged_in_order() {
        let t0 = Instant::now();
        let mut t = TargetProgress::starting_at(None);
        t.sent(batch(1, t0, "a", false), true);
        t.sent(batch(2, t0, "b", false), true);
        t.sent(batch(3, t0, "c", true), true);
        assert_eq!(t.sent_through, cur("c"));
        assert!(!t.ready_for_batch(8), "nothing after the complete batch");
        assert_eq!(
            t.on_ack(2, Ok(())),
            AckOutcome::Acked {
                durable: Vec::new()
            }
        );
        assert_eq!(t.durable, None);
        assert_eq!(t.on_ack(2, Ok(())), AckOutcome::Unknown, "duplicate");
        assert_eq!(
            t.on_ack(1, Ok(())),
            AckOutcome::Acked {
                durable: vec![(2, 10), (2, 10)]
            }
        );
        assert_eq!(t.durable, cur("b"));
        assert!(!t.done);
        t.on_ack(3, Ok(()));
        assert!(t.done);
        assert_eq!(t.copied_objects, 6);
    }

    #[test]
    fn a_stalled_target_backs_off_then_resumes_from_its_durable_cursor_with_what_it_missed() {
        let t0 = Instant::now();
        let mut t = TargetProgress::starting_at(cur("a"));
        t.sent(batch(1, t0, "b", false), true);
        t.on_ack(1, Ok(()));
        t.sent(batch(2, t0, "c", false), true);
        let x = ObjectName::new("", "x");
        let y = ObjectName::new("", "y");
        t.note_write(t0, 7, &x, true);
        let wait = Duration::from_secs(2);
        assert!(t.detect_stall(t0 + wait / 2, wait, wait).is_none());
        let why = t
            .detect_stall(t0 + wait * 2, wait, wait)
            .map(str::to_string);
        assert!(why.is_some_and(|w| w.contains("batch 2")));
        let (delay, dropped) = t.begin_backoff(t0 + wait * 2).expect("backs off");
        assert_eq!((delay, dropped), (RESTART_AFTER, vec![2]));
        assert!(t.begin_backoff(t0 + wait * 2).is_none(), "once");
        // Written while it is out: sent again on resume.
        t.note_write(t0, 8, &y, false);
        assert!(!t.resume_due(t0 + wait * 2));
        assert!(t.resume_due(t0 + wait * 2 + delay));
        let (through, resend) = t.resume(false);
        assert_eq!(through, cur("b"));
        assert_eq!(resend, vec![x.clone(), y]);
        assert_eq!(t.sent_through, cur("b"));
        assert!(t.ready_for_batch(8));
        // A second stall in a row waits twice as long; starting over sends
        // nothing again.
        t.write_failed(9, "full");
        let (delay, _) = t.begin_backoff(t0).expect("backs off");
        assert_eq!(delay, RESTART_AFTER * 2);
        t.note_write(t0, 10, &x, false);
        assert_eq!(t.resume(true), (None, Vec::new()));
    }

    #[test]
    fn a_failed_batch_stalls_the_target() {
        let t0 = Instant::now();
        let mut t = TargetProgress::starting_at(None);
        t.sent(batch(1, t0, "a", false), true);
        assert_eq!(t.on_ack(1, Err("no room".into())), AckOutcome::Failed);
        assert!(t.stalled.as_deref().is_some_and(|s| s.contains("no room")));
        assert!(!t.ready_for_batch(8));
    }

    #[test]
    fn a_pg_temp_holding_every_up_member_is_unneeded() {
        // The up set changed back to members of the pg_temp, reordered.
        assert!(pg_temp_unneeded(&[2, 0, 4], &[0, 4, 2]));
        // Fewer up members than the pg_temp holds.
        assert!(pg_temp_unneeded(&[2, 0], &[0, 4, 2]));
        // An up member outside the acting set still needs its backfill.
        assert!(!pg_temp_unneeded(&[2, 0, 5], &[0, 4, 2]));
        assert!(!pg_temp_unneeded(&[0, 4, 2], &[0, 4, 2]));
        assert!(!pg_temp_unneeded(&[], &[0, 4, 2]));
    }

    #[test]
    fn the_clear_request_is_resent_while_the_map_keeps_the_pg_temp() {
        let t0 = Instant::now();
        let mut c = PgTempClear::default();
        assert!(!c.due(t0, true, false), "still needed");
        assert!(c.due(t0, true, true));
        assert!(!c.due(t0 + PG_TEMP_CLEAR_RESEND / 2, true, true));
        assert!(
            c.due(t0 + PG_TEMP_CLEAR_RESEND * 2, true, true),
            "lost: resent"
        );
        assert!(
            !c.due(t0 + PG_TEMP_CLEAR_RESEND * 9, false, true),
            "cleared"
        );
        assert!(
            c.due(t0 + PG_TEMP_CLEAR_RESEND * 9, true, true),
            "a new pg_temp"
        );
    }
}
