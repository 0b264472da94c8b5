//! One placement group's replication bookkeeping on one OSD, as a state
//! machine: map changes (intervals, role, states), client op admission
//! (epoch checks, reqid de-duplication, per-object ordering, version
//! assignment), commit accounting (ack only when every acting member is
//! durable), the bounded PG log and its trimming, and activation. It does
//! no I/O: the runtime (`osd`) executes the returned [`PgAction`]s and feeds
//! back [`PgEvent`]s. Recovery planning is the pure [`plan_recovery`].

use crate::exec::ObjectProjection;
use cairn_ops::{
    LogEntry, LogOp, ObjectName, OpError, OpReply, OpRequest, OpStatus, PgInfo, ReqId, ScrubRange,
    SubOp, SubOpOutput, Version,
};
use cairn_types::{Epoch, PgId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

/// Identifies a client request waiting for an answer inside the runtime.
pub type Token = u64;

/// Limits of one PG.
#[derive(Debug, Clone)]
pub struct PgLimits {
    /// `osd_min_pg_log_entries`: entries kept when the PG is clean.
    pub min_log_entries: usize,
    /// `osd_max_pg_log_entries`: entries kept at most (degraded PGs keep up
    /// to this many so a returning member recovers from the log).
    pub max_log_entries: usize,
    /// `osd_pg_log_trim_min`: the log is trimmed in steps of this many
    /// entries, once it holds that many more than it keeps, not by one
    /// entry on every write. It holds at most `keep + log_trim_min_entries
    /// - 1` entries (plus writes in flight).
    pub log_trim_min_entries: usize,
    /// Past intervals remembered at most.
    pub max_past_intervals: usize,
    /// Client ops queued while the PG peers, at most (more are told to retry).
    pub max_waiting_ops: usize,
    /// Writes to one object in flight at once, at most (writes that need
    /// only the object's projected state overlap; more wait in its queue).
    pub max_object_writes_in_flight: u32,
}

impl Default for PgLimits {
    fn default() -> Self {
        PgLimits {
            min_log_entries: 250,
            max_log_entries: 3000,
            log_trim_min_entries: 64,
            max_past_intervals: 500,
            max_waiting_ops: 4096,
            max_object_writes_in_flight: 16,
        }
    }
}

/// Where the PG is placed in one map epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub epoch: Epoch,
    pub up: Vec<i32>,
    pub acting: Vec<i32>,
    /// Erasure-coded pools: the acting set by shard position, with
    /// `ec_pool::SHARD_HOLE` where a shard has no OSD (`up`/`acting` then
    /// list the live members only). Empty for replicated pools.
    pub shards: Vec<i32>,
    pub primary: Option<i32>,
    pub size: u32,
    pub min_size: u32,
    /// `up_thru` (in this map) of the previous interval's primary, when the
    /// OSD has the monitors record `up_thru`; None = unknown (then every
    /// interval with `min_size` members may have accepted writes).
    pub prev_primary_up_thru: Option<Epoch>,
    /// `up_from` of each acting member, in acting order. A member that
    /// was marked down and up again (or restarted unnoticed) since makes a
    /// new interval even when this OSD skipped the epochs in between (the
    /// map source hands over only the newest map): otherwise the primary
    /// and that member disagree on when the interval began, and the
    /// member refuses the primary's writes as stale.
    pub acting_up_from: Vec<Epoch>,
    /// The newest activation of the PG the monitors recorded
    /// (`ClusterMap::pg_history`). One with another acting set, recorded
    /// after the current interval began, means the PG went active
    /// elsewhere in epochs this OSD skipped: the interval is over even if
    /// the placement looks the same again. Not part of the interval itself.
    pub last_recorded: Option<cairn_map::PgActivation>,
}

impl Placement {
    fn same_interval(&self, o: &Placement) -> bool {
        self.up == o.up
            && self.acting == o.acting
            && self.acting_up_from == o.acting_up_from
            && self.shards == o.shards
            && self.primary == o.primary
            && self.size == o.size
            && self.min_size == o.min_size
    }
}

/// A run of epochs with one acting set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PastInterval {
    pub first: Epoch,
    pub last: Epoch,
    pub acting: Vec<i32>,
    pub primary: Option<i32>,
    /// The PG may have accepted writes in this interval.
    pub maybe_went_rw: bool,
}

/// This OSD's part in the PG.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Primary,
    Replica,
    Stray,
}

/// Reported PG state flags (printed joined by `+` like Ceph).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgState {
    pub creating: bool,
    pub peering: bool,
    pub active: bool,
    pub clean: bool,
    pub degraded: bool,
    pub undersized: bool,
    pub remapped: bool,
    /// A backfill waits for a reservation, a flag or the throttle.
    pub backfill_wait: bool,
    /// A backfill waits because a target is marked backfillfull or full.
    pub backfill_toofull: bool,
    /// A backfill copies objects to members of the up set.
    pub backfilling: bool,
    pub down: bool,
    /// Why the PG is down (which OSDs it waits for).
    pub down_reason: Option<String>,
}

impl std::fmt::Display for PgState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        for (on, name) in [
            (self.creating, "creating"),
            (self.down, "down"),
            (self.peering, "peering"),
            (self.active, "active"),
            (self.clean, "clean"),
            (self.undersized, "undersized"),
            (self.degraded, "degraded"),
            (self.remapped, "remapped"),
            (self.backfill_wait, "backfill_wait"),
            (self.backfill_toofull, "backfill_toofull"),
            (self.backfilling, "backfilling"),
        ] {
            if on {
                parts.push(name);
            }
        }
        if parts.is_empty() {
            parts.push("inactive");
        }
        f.write_str(&parts.join("+"))
    }
}

/// Inputs of the state machine.
#[derive(Debug)]
pub enum PgEvent {
    Map(Placement),
    ClientOp {
        token: Token,
        req: OpRequest,
    },
    /// The runtime resolved the write at `seq` (its entry and the result the
    /// client will get) and submitted it locally and to the replicas.
    Submitted {
        seq: u64,
        entry: LogEntry,
        outcome: Result<Vec<SubOpOutput>, OpError>,
    },
    /// The runtime finished reading the store for the read it was given
    /// as `token` (writes to that object may start once no read of it
    /// is running).
    ReadDone {
        token: Token,
    },
    /// `from` has the entry at `seq` durable.
    Committed {
        seq: u64,
        from: i32,
        interval_since: Epoch,
    },
    /// Activation finished (Ok: the info and log now on disk here) or the PG is down.
    PeeringDone {
        interval_since: Epoch,
        result: Result<(PgInfo, Vec<LogEntry>), String>,
    },
}

/// Outputs of the state machine.
#[derive(Debug)]
pub enum PgAction {
    Reply {
        token: Token,
        reply: OpReply,
    },
    /// Serve this read-only request from the local store and reply, then
    /// feed back `ReadDone` (the store read may run off the PG's task:
    /// until then no write to the object starts, so the read can see only
    /// versions every acting member has durable).
    Read {
        token: Token,
        req: OpRequest,
    },
    /// Resolve this write at `version`, feed back `Submitted`, commit it
    /// locally (with the PG log entry, the info and the log trim) and send
    /// it to `replicas` in version order.
    Write {
        token: Token,
        req: OpRequest,
        version: Version,
        trim_to: Version,
        replicas: Vec<i32>,
        /// Backfill targets among `replicas` that have not reached this
        /// object yet: they get the log entry without the data.
        log_only: Vec<i32>,
    },
    /// Run activation: query `probe`, pick the authoritative log, bring
    /// every acting member to it, then feed back `PeeringDone`.
    Peer {
        interval_since: Epoch,
        epoch: Epoch,
        acting: Vec<i32>,
        probe: Vec<i32>,
        past: Vec<PastInterval>,
    },
    /// Persist the info and past intervals (interval change).
    PersistMeta,
}

struct InFlight {
    tokens: Vec<Token>,
    reqid: ReqId,
    oid: ObjectName,
    version: Version,
    waiting: BTreeSet<i32>,
    outcome: Option<Result<Vec<SubOpOutput>, OpError>>,
    trim_to: Version,
}

/// One object's writes in flight on the primary and the ops waiting behind
/// them.
///
/// The store shows a transaction only once it is durable, so a write that
/// follows another to the same object before that one is durable cannot be
/// resolved from the store: it is resolved from `projected`, the object's
/// state after the last submitted write (Ceph's projected object context).
/// Only writes that need nothing but that state overlap
/// ([`pipelinable`]); one that reads the object's data or attributes waits
/// until no write of it is in flight, as do reads (a read sees only what
/// every acting member has durable).
#[derive(Default)]
struct Busy {
    /// Ops waiting, in arrival order.
    queue: VecDeque<(Token, OpRequest)>,
    /// Writes of the object in `inflight`.
    writes: u32,
    /// The object after the newest submitted write of it (seq, state);
    /// None while no write of it is in flight.
    projected: Option<(u64, ObjectProjection)>,
}

/// Whether a write can be resolved from the object's projected state alone
/// (size, existence, version, snapshot set) and so may start while earlier
/// writes of the object are still in flight. Guards and reads of data,
/// xattrs or omap need the store and wait. Erasure-coded pools never
/// overlap writes of one object (their writes read stripes).
pub fn pipelinable(req: &OpRequest) -> bool {
    req.is_write()
        && req.snap == cairn_ops::SNAP_HEAD
        && req.ops.iter().all(|o| {
            o.is_write()
                || matches!(
                    o,
                    SubOp::AssertExists | SubOp::AssertVersion { .. } | SubOp::Stat
                )
        })
}

/// One PG on one OSD.
pub struct Pg {
    pub pgid: PgId,
    pub whoami: i32,
    limits: PgLimits,
    pub info: PgInfo,
    log: VecDeque<LogEntry>,
    /// reqid -> seq of its log entry (covers exactly the entries in `log`).
    reqids: HashMap<ReqId, u64>,
    pub past: Vec<PastInterval>,
    placement: Option<Placement>,
    pub role: Role,
    pub state: PgState,
    went_active_this_interval: bool,
    /// True while the current interval's start is only the first map epoch
    /// this PG instance saw (it was created, or this OSD started, after the
    /// interval began, or it skipped map epochs): the real start may be
    /// earlier, and the current primary knows it.
    interval_start_estimated: bool,
    /// The earliest the current interval can have begun (the epoch after
    /// the last map this PG saw with the previous placement).
    interval_start_floor: Epoch,
    /// A member's interval began in this epoch, after ours, and our map is
    /// older still: the next map at or past it starts a new interval.
    member_interval: Option<Epoch>,
    inflight: BTreeMap<u64, InFlight>,
    /// Objects with writes in flight (or a write waiting for reads), the
    /// ops queued behind them and the state the last submitted write leaves
    /// (ordered, so that answers to queued ops go out in a reproducible
    /// order: the simulator replays a seed exactly).
    busy: BTreeMap<ObjectName, Busy>,
    /// Object reads handed to the runtime and not yet `ReadDone`, per
    /// object (kept across interval changes: the store reads still run).
    /// A write to an object in here waits in `busy`; an object never has
    /// a read and a write in flight at once.
    reading: BTreeMap<ObjectName, u32>,
    /// The object each running read is of, by token.
    read_tokens: HashMap<Token, ObjectName>,
    waiting_for_active: VecDeque<(Token, OpRequest)>,
    /// Backfill targets of this interval (members of the up set outside
    /// the acting set) and the last object each holds, in store order
    /// (None: nothing yet). Writes go to them too, with data only for
    /// objects at or before their position.
    backfill: BTreeMap<i32, Option<ObjKey>>,
    /// Backfill targets that hold every object (writes carry data to them).
    backfill_done: BTreeSet<i32>,
    /// Activation asked the monitors for `pg_temp` and waits for the map.
    pub waiting_pg_temp: bool,
    /// Set when a member's store refused a write for lack of space and the
    /// PG re-peers: until it is active again, writes carrying data are
    /// refused at once (deletes wait: they free space).
    full: Option<OpError>,
    /// Writes that were in flight when a member failed to commit one: some
    /// member may hold them durably, so until the PG is active again (and
    /// its log answers their resends) they are never refused as full.
    unsure: HashSet<ReqId>,
    /// The chunk a scrub is comparing: writes to its objects wait.
    scrub_block: Option<ScrubRange>,
    /// Writes waiting for the scrubbed chunk to be released.
    scrub_waiting: VecDeque<(Token, OpRequest)>,
}

/// The request writes object data (write, write_full, append with bytes):
/// what a full disk refuses. Removes, truncates, zeroing and metadata
/// changes pass (they free space or take only the store's reserve).
pub fn adds_data(req: &OpRequest) -> bool {
    req.ops.iter().any(|o| match o {
        SubOp::WriteFull { data } | SubOp::Write { data, .. } | SubOp::Append { data } => {
            !data.is_empty()
        }
        _ => false,
    })
}

fn reply(req_reqid: &ReqId, status: OpStatus, version: Version, epoch: Epoch) -> OpReply {
    OpReply {
        reqid: req_reqid.clone(),
        status,
        version,
        epoch,
    }
}

impl Pg {
    /// A PG loaded from disk (or new: default info, empty log).
    pub fn new(
        pgid: PgId,
        whoami: i32,
        limits: PgLimits,
        info: PgInfo,
        log: Vec<LogEntry>,
        past: Vec<PastInterval>,
    ) -> Pg {
        let creating =
            info.last_epoch_started == Epoch(0) && info.last_update == Version::default();
        let mut pg = Pg {
            pgid,
            whoami,
            limits,
            info,
            log: VecDeque::new(),
            reqids: HashMap::new(),
            past,
            placement: None,
            role: Role::Stray,
            state: PgState {
                creating,
                ..Default::default()
            },
            went_active_this_interval: false,
            interval_start_estimated: false,
            interval_start_floor: Epoch(0),
            member_interval: None,
            inflight: BTreeMap::new(),
            busy: BTreeMap::new(),
            reading: BTreeMap::new(),
            read_tokens: HashMap::new(),
            waiting_for_active: VecDeque::new(),
            backfill: BTreeMap::new(),
            backfill_done: BTreeSet::new(),
            waiting_pg_temp: false,
            full: None,
            unsure: HashSet::new(),
            scrub_block: None,
            scrub_waiting: VecDeque::new(),
        };
        pg.info.pgid = Some(pgid);
        pg.reset_log(log);
        pg
    }

    fn reset_log(&mut self, log: Vec<LogEntry>) {
        self.log = log.into();
        self.reqids = self
            .log
            .iter()
            .filter_map(|e| e.reqid.clone().map(|r| (r, e.version.seq)))
            .collect();
    }

    pub fn log(&self) -> impl Iterator<Item = &LogEntry> {
        self.log.iter()
    }

    pub fn log_len(&self) -> usize {
        self.log.len()
    }

    /// The store trim that matches what the in-memory log dropped since it
    /// had `front` as its oldest entry and `tail` as its tail: the index
    /// range `[from, upto]` for `Transaction::log_trim_from`, or None when
    /// nothing was trimmed. The store holds the same entries as the
    /// in-memory log (it is loaded from it and every append and trim goes
    /// to both), so nothing below the old front is left to delete.
    pub fn trimmed_since(&self, front: Option<Version>, tail: Version) -> Option<(u64, u64)> {
        (self.info.log_tail > tail).then(|| (front.map_or(0, |v| v.seq), self.info.log_tail.seq))
    }

    /// The version of the log's oldest entry.
    pub fn log_front(&self) -> Option<Version> {
        self.log.front().map(|e| e.version)
    }

    pub fn placement(&self) -> Option<&Placement> {
        self.placement.as_ref()
    }

    pub fn epoch(&self) -> Epoch {
        self.placement.as_ref().map(|p| p.epoch).unwrap_or_default()
    }

    pub fn inflight_count(&self) -> usize {
        self.inflight.len()
    }

    /// The newest log entry that every live acting member has durable (no
    /// write at or before it is still in flight). EC shards drop their
    /// rollback stashes up to here.
    pub fn complete_through(&self) -> Version {
        let first_inflight = self.inflight.keys().next().copied();
        self.log
            .iter()
            .rev()
            .map(|e| e.version)
            .find(|v| first_inflight.is_none_or(|s| v.seq < s))
            .unwrap_or(self.info.log_tail)
    }

    /// Replaces info and log after this OSD was brought up to date by a push.
    pub fn reload(&mut self, info: PgInfo, log: Vec<LogEntry>) {
        let since = self.info.same_interval_since;
        self.info = info;
        self.info.pgid = Some(self.pgid);
        self.info.same_interval_since = self.info.same_interval_since.max(since);
        self.reset_log(log);
        self.state.creating = false;
    }

    /// Adopts the current primary's earlier start of the current interval
    /// when this PG only knows an estimate (see `interval_start_estimated`),
    /// so the primary's pushes and sub-ops of this very interval are not
    /// refused as stale. Returns whether it changed anything.
    pub fn adopt_primary_interval_start(&mut self, from: i32, since: Epoch) -> bool {
        let from_current_primary = self.placement.as_ref().is_some_and(|p| {
            // Acting members and backfill targets (up, not acting).
            p.primary == Some(from)
                && (p.acting.contains(&self.whoami) || p.up.contains(&self.whoami))
        });
        if !self.interval_start_estimated
            || !from_current_primary
            || since >= self.info.same_interval_since
            || since < self.interval_start_floor
        {
            return false;
        }
        // The previous interval ended before the adopted start.
        if let Some(last) = self.past.last_mut() {
            if last.last >= since && since.0 > last.first.0 {
                last.last = Epoch(since.0 - 1);
            }
        }
        // Stay an estimate: a later message of the primary may name an even
        // earlier start (a push carries the epoch its job began at, a sub-op
        // the interval start itself).
        self.info.same_interval_since = since;
        true
    }

    pub fn handle(&mut self, ev: PgEvent) -> Vec<PgAction> {
        let mut out = Vec::new();
        match ev {
            PgEvent::Map(p) => self.on_map(p, &mut out),
            PgEvent::ClientOp { token, req } => self.on_client_op(token, req, &mut out),
            PgEvent::Submitted {
                seq,
                entry,
                outcome,
            } => self.on_submitted(seq, entry, outcome, &mut out),
            PgEvent::ReadDone { token } => self.on_read_done(token, &mut out),
            PgEvent::Committed {
                seq,
                from,
                interval_since,
            } => {
                if interval_since == self.info.same_interval_since {
                    self.on_committed(seq, from, &mut out)
                }
            }
            PgEvent::PeeringDone {
                interval_since,
                result,
            } => self.on_peering_done(interval_since, result, &mut out),
        }
        out
    }

    /// A member refused this primary's sub-op because its interval began
    /// in epoch `theirs`, after ours: the placement changed and changed
    /// back in epochs this OSD skipped (the map source hands over only the
    /// newest map), so the two disagree on the interval and every write
    /// would wait forever. The primary starts a new interval at its current
    /// epoch (no acknowledged write is lost: none could complete while the
    /// member refused them) and peers again. Nothing happens when this OSD
    /// is not the primary, the refusal is about an older interval, or its
    /// map is older than `theirs` (the newer map comes first).
    pub fn member_interval_newer(&mut self, theirs: Epoch) -> Vec<PgAction> {
        let mut out = Vec::new();
        let Some(p) = self.placement.clone() else {
            return out;
        };
        if self.role != Role::Primary || theirs <= self.info.same_interval_since {
            return out;
        }
        if theirs > p.epoch {
            self.member_interval = Some(theirs);
            return out;
        }
        self.on_map_forced(p, true, &mut out);
        out
    }

    fn on_map(&mut self, p: Placement, out: &mut Vec<PgAction>) {
        let force = self.member_interval.is_some_and(|e| p.epoch >= e);
        self.on_map_forced(p, force, out)
    }

    /// `on_map`; with `force`, a new interval even if the placement looks
    /// the same (see `member_interval_newer`).
    fn on_map_forced(&mut self, p: Placement, force: bool, out: &mut Vec<PgAction>) {
        // Someone else activated the PG after our interval began (we
        // skipped the epochs where the placement moved away and back).
        let superseded = self.placement.is_some()
            && p.last_recorded
                .as_ref()
                .is_some_and(|r| r.since > self.info.same_interval_since && r.acting != p.acting);
        let changed = force
            || superseded
            || self
                .placement
                .as_ref()
                .is_none_or(|old| !old.same_interval(&p));
        if !changed {
            if let Some(old) = self.placement.as_mut() {
                old.epoch = p.epoch;
            }
            return;
        }
        // The start is only an estimate when this PG saw no earlier map,
        // or skipped epochs (the map source hands over the newest map
        // only): the change may have happened in any skipped epoch.
        self.interval_start_estimated = self
            .placement
            .as_ref()
            .is_none_or(|old| p.epoch.0 > old.epoch.0 + 1);
        self.interval_start_floor = self
            .placement
            .as_ref()
            .map(|old| Epoch(old.epoch.0 + 1))
            .unwrap_or_default();
        if force {
            self.interval_start_estimated = false;
            self.interval_start_floor = p.epoch;
        }
        self.member_interval = None;
        if let Some(old) = self.placement.take() {
            let first = self.info.same_interval_since;
            let primary_alive = p.prev_primary_up_thru.is_none_or(|u| u >= first);
            let maybe_went_rw = self.went_active_this_interval
                || (old.acting.len() as u32 >= old.min_size.max(1)
                    && self.role != Role::Primary
                    && primary_alive);
            if p.epoch.0 > 0 {
                self.past.push(PastInterval {
                    first: self.info.same_interval_since,
                    last: Epoch(p.epoch.0.saturating_sub(1)),
                    acting: old.acting.clone(),
                    primary: old.primary,
                    maybe_went_rw,
                });
            }
            let excess = self
                .past
                .len()
                .saturating_sub(self.limits.max_past_intervals);
            self.past.drain(..excess);
        }
        self.info.same_interval_since = p.epoch;
        self.went_active_this_interval = false;
        self.backfill.clear();
        self.backfill_done.clear();
        self.waiting_pg_temp = false;
        self.abort_ops(&p, out);
        self.role = if p.primary == Some(self.whoami) {
            Role::Primary
        } else if p.acting.contains(&self.whoami) {
            Role::Replica
        } else {
            Role::Stray
        };
        let creating = self.state.creating;
        self.state = PgState {
            creating,
            remapped: p.up != p.acting,
            undersized: (p.acting.len() as u32) < p.size,
            degraded: (p.acting.len() as u32) < p.size,
            ..Default::default()
        };
        out.push(PgAction::PersistMeta);
        if self.role == Role::Primary {
            if (p.acting.len() as u32) < p.min_size.max(1) {
                self.state.down = false;
                self.state.peering = false;
            } else {
                self.state.peering = true;
                out.push(PgAction::Peer {
                    interval_since: p.epoch,
                    epoch: p.epoch,
                    acting: p.acting.clone(),
                    probe: self.probe_set(&p),
                    past: self.past.clone(),
                });
            }
        }
        self.placement = Some(p);
    }

    /// A new activation attempt for a primary whose PG is down (an acting
    /// member did not answer, or the monitors were slow): the runtime calls
    /// this on its tick when no activation is running.
    pub fn retry_peering(&mut self) -> Vec<PgAction> {
        let Some(p) = self.placement.clone() else {
            return Vec::new();
        };
        if self.role != Role::Primary || !(self.state.down || self.waiting_pg_temp) {
            return Vec::new();
        }
        self.waiting_pg_temp = false;
        self.state.down = false;
        self.state.down_reason = None;
        self.state.peering = true;
        vec![PgAction::Peer {
            interval_since: self.info.same_interval_since,
            epoch: p.epoch,
            acting: p.acting.clone(),
            probe: self.probe_set(&p),
            past: self.past.clone(),
        }]
    }

    /// The write at `seq` could not be made durable on `from` (its store
    /// commit failed, e.g. the store is full). Every op in flight or queued
    /// is told to retry, the failed one too: other members (this one
    /// included) may hold it durably and peering may keep it, so "failed"
    /// would be a lie the client could see later (a write it was told did
    /// not fit, read back). The resend gets the op's true outcome: from the
    /// log once the PG is active again, or a refusal if it never took
    /// effect. The PG then re-peers, which brings every acting member back
    /// to one log instead of leaving the op waiting forever for an ack that
    /// will not come; meanwhile new writes carrying data are refused as
    /// full at once (`error` is NoSpace).
    pub fn commit_failed(&mut self, seq: u64, from: i32, error: OpError) -> Vec<PgAction> {
        let mut out = Vec::new();
        if self.role != Role::Primary || !self.inflight.contains_key(&seq) {
            return out;
        }
        let epoch = self.epoch();
        let why = format!("osd.{from} failed to commit write {seq}: {error}");
        let retry = || OpStatus::NotActive {
            state: format!("re-peering: {why}"),
        };
        for (_, f) in std::mem::take(&mut self.inflight) {
            for t in f.tokens {
                out.push(PgAction::Reply {
                    token: t,
                    reply: reply(&f.reqid, retry(), f.version, epoch),
                });
            }
            self.unsure.insert(f.reqid);
        }
        self.answer_queued(retry(), epoch, &mut out);
        if matches!(error, OpError::NoSpace(_)) {
            self.full = Some(error);
        }
        self.state.active = false;
        self.state.clean = false;
        self.state.down = true;
        self.state.down_reason = Some(why);
        out.extend(self.retry_peering());
        out
    }

    /// Acting members plus every OSD of a past interval since the last one
    /// this OSD knows went active that is up now (the runtime drops down ones).
    fn probe_set(&self, p: &Placement) -> Vec<i32> {
        let mut s: BTreeSet<i32> = p.acting.iter().copied().collect();
        for pi in &self.past {
            if pi.maybe_went_rw && pi.last >= self.info.last_epoch_started {
                s.extend(pi.acting.iter().copied());
            }
        }
        s.extend(self.info.last_active_acting.iter().copied());
        s.into_iter().collect()
    }

    /// Answers every queued and in-flight op of the closing interval: the
    /// client recomputes placement and resends (a resend of a committed op
    /// is answered from the log).
    fn abort_ops(&mut self, p: &Placement, out: &mut Vec<PgAction>) {
        let status = || OpStatus::NotActive {
            state: "interval changed".into(),
        };
        for (_, f) in std::mem::take(&mut self.inflight) {
            for t in f.tokens {
                out.push(PgAction::Reply {
                    token: t,
                    reply: reply(&f.reqid, status(), Version::default(), p.epoch),
                });
            }
        }
        self.answer_queued(status(), p.epoch, out);
    }

    /// Answers every op queued behind a busy object or waiting for
    /// activation with `status` (the client resends).
    fn answer_queued(&mut self, status: OpStatus, epoch: Epoch, out: &mut Vec<PgAction>) {
        self.scrub_block = None;
        let queued: Vec<(Token, OpRequest)> = std::mem::take(&mut self.busy)
            .into_values()
            .flat_map(|b| b.queue.into_iter())
            .chain(self.waiting_for_active.drain(..))
            .chain(self.scrub_waiting.drain(..))
            .collect();
        for (t, req) in queued {
            out.push(PgAction::Reply {
                token: t,
                reply: reply(&req.reqid, status.clone(), Version::default(), epoch),
            });
        }
    }

    fn on_client_op(&mut self, token: Token, req: OpRequest, out: &mut Vec<PgAction>) {
        let epoch = self.epoch();
        let answer = |st: OpStatus| PgAction::Reply {
            token,
            reply: reply(&req.reqid, st, Version::default(), epoch),
        };
        if self.role != Role::Primary {
            out.push(answer(OpStatus::NotPrimary { osd_epoch: epoch }));
            return;
        }
        if req.epoch < self.info.same_interval_since {
            out.push(answer(OpStatus::MapTooOld { need: epoch }));
            return;
        }
        if !self.state.active {
            let adds_data = adds_data(&req);
            // A resend of a write that may have taken effect is never
            // refused: it waits for the log to say what became of it.
            let maybe_done =
                self.reqids.contains_key(&req.reqid) || self.unsure.contains(&req.reqid);
            if let Some(e) = self.full.as_ref().filter(|_| adds_data && !maybe_done) {
                out.push(answer(OpStatus::Done(Err(e.clone()))));
                return;
            }
            if self.state.peering && self.waiting_for_active.len() < self.limits.max_waiting_ops {
                self.waiting_for_active.push_back((token, req));
            } else {
                out.push(answer(OpStatus::NotActive {
                    state: self.state.to_string(),
                }));
            }
            return;
        }
        self.admit(token, req, out);
    }

    /// Runs an op now or queues it behind the write in flight on its object.
    fn admit(&mut self, token: Token, req: OpRequest, out: &mut Vec<PgAction>) {
        if req.is_write() {
            if let Some(&seq) = self.reqids.get(&req.reqid) {
                self.answer_dup(token, seq, &req, out);
                return;
            }
            if let Some(f) = self.inflight.values_mut().find(|f| f.reqid == req.reqid) {
                f.tokens.push(token);
                return;
            }
        }
        let pg_level = req
            .ops
            .iter()
            .any(|o| matches!(o, SubOp::ListObjects { .. }));
        if pg_level {
            // Listing reads no object's data: nothing to order it against.
            out.push(PgAction::Read { token, req });
            return;
        }
        if req.is_write() && self.blocked_by_scrub(&req.oid) {
            self.hold_for_scrub(token, req, out);
            return;
        }
        let may_overlap = self.pipelines() && pipelinable(&req);
        let max_writes = self.limits.max_object_writes_in_flight;
        if let Some(b) = self.busy.get_mut(&req.oid) {
            let overlap =
                b.queue.is_empty() && b.writes > 0 && b.writes < max_writes && may_overlap;
            if overlap {
                self.start(token, req, out);
            } else {
                b.queue.push_back((token, req));
            }
            return;
        }
        if req.is_write() && self.reading.contains_key(&req.oid) {
            // Reads of the object still run: the write (and what comes
            // after it) waits for them.
            let b = Busy {
                queue: VecDeque::from([(token, req)]),
                ..Busy::default()
            };
            self.busy.insert(b.queue[0].1.oid.clone(), b);
            return;
        }
        self.start(token, req, out);
    }

    /// Writes to one object may overlap in this PG: a replicated pool
    /// (EC writes read the stripes they change).
    fn pipelines(&self) -> bool {
        self.placement.as_ref().is_some_and(|p| p.shards.is_empty())
    }

    /// The state the newest submitted write of `oid` leaves, while a
    /// write of it is in flight: what the next write of it is resolved
    /// from (the store shows the object only as far as it is durable).
    pub fn projected(&self, oid: &ObjectName) -> Option<&ObjectProjection> {
        self.busy
            .get(oid)
            .and_then(|b| b.projected.as_ref())
            .map(|(_, p)| p)
    }

    /// Records the state write `seq` of `oid` leaves (the runtime resolved
    /// it). Ignored when no write of the object is in flight any more.
    pub fn set_projected(&mut self, oid: &ObjectName, seq: u64, state: ObjectProjection) {
        if let Some(b) = self.busy.get_mut(oid).filter(|b| b.writes > 0) {
            if b.projected.as_ref().is_none_or(|(s, _)| *s < seq) {
                b.projected = Some((seq, state));
            }
        }
    }

    /// Writes of `oid` in flight.
    pub fn object_writes_in_flight(&self, oid: &ObjectName) -> u32 {
        self.busy.get(oid).map_or(0, |b| b.writes)
    }

    /// Hands a read of one object to the runtime and counts it running.
    fn emit_read(&mut self, token: Token, req: OpRequest, out: &mut Vec<PgAction>) {
        *self.reading.entry(req.oid.clone()).or_insert(0) += 1;
        self.read_tokens.insert(token, req.oid.clone());
        out.push(PgAction::Read { token, req });
    }

    fn on_read_done(&mut self, token: Token, out: &mut Vec<PgAction>) {
        let Some(oid) = self.read_tokens.remove(&token) else {
            return;
        };
        let left = match self.reading.get_mut(&oid) {
            Some(n) => {
                *n = n.saturating_sub(1);
                *n
            }
            None => 0,
        };
        if left > 0 {
            return;
        }
        self.reading.remove(&oid);
        // The object is in `busy` only because a write waits for its reads
        // (no write runs while reads do): start it now, unless this PG can
        // no longer take writes (then `busy` was answered already).
        if self.busy.contains_key(&oid) && self.role == Role::Primary && self.state.active {
            self.release(&oid, false, out);
        }
    }

    /// Reads of `oid` handed out and not finished.
    pub fn reads_running(&self, oid: &ObjectName) -> u32 {
        self.reading.get(oid).copied().unwrap_or(0)
    }

    fn blocked_by_scrub(&self, oid: &ObjectName) -> bool {
        self.scrub_block
            .is_some_and(|r| r.contains_hash(oid.hash()))
    }

    /// Queues a write behind the scrubbed chunk (bounded: beyond
    /// `max_waiting_ops` the client is told to retry).
    fn hold_for_scrub(&mut self, token: Token, req: OpRequest, out: &mut Vec<PgAction>) {
        if self.scrub_waiting.len() < self.limits.max_waiting_ops {
            self.scrub_waiting.push_back((token, req));
        } else {
            out.push(PgAction::Reply {
                token,
                reply: reply(
                    &req.reqid,
                    OpStatus::NotActive {
                        state: "scrubbing this object's chunk; retry".into(),
                    },
                    Version::default(),
                    self.epoch(),
                ),
            });
        }
    }

    /// Scrub: writes to objects in `range` wait from now on. Returns false
    /// when the PG cannot be scrubbed now (not an active primary).
    pub fn scrub_block(&mut self, range: ScrubRange) -> bool {
        if self.role != Role::Primary || !self.state.active {
            return false;
        }
        self.scrub_block = Some(range);
        true
    }

    /// Scrub: the chunk writes wait for, if any.
    pub fn scrub_blocked_range(&self) -> Option<ScrubRange> {
        self.scrub_block
    }

    /// Scrub: whether a write to an object of the blocked chunk is still in flight.
    pub fn scrub_chunk_busy(&self) -> bool {
        let Some(r) = self.scrub_block else {
            return false;
        };
        self.inflight
            .values()
            .any(|f| r.contains_hash(f.oid.hash()))
    }

    /// Scrub: releases the chunk; the writes that waited start now.
    pub fn scrub_unblock(&mut self) -> Vec<PgAction> {
        let mut out = Vec::new();
        self.scrub_block = None;
        let waiting: Vec<_> = self.scrub_waiting.drain(..).collect();
        if self.role != Role::Primary || !self.state.active {
            let epoch = self.epoch();
            for (t, req) in waiting {
                out.push(PgAction::Reply {
                    token: t,
                    reply: reply(
                        &req.reqid,
                        OpStatus::NotActive {
                            state: self.state.to_string(),
                        },
                        Version::default(),
                        epoch,
                    ),
                });
            }
            return out;
        }
        for (t, req) in waiting {
            self.admit(t, req, &mut out);
        }
        out
    }

    fn start(&mut self, token: Token, req: OpRequest, out: &mut Vec<PgAction>) {
        if !req.is_write() {
            self.emit_read(token, req, out);
            return;
        }
        debug_assert!(
            !self.reading.contains_key(&req.oid),
            "a write starts while reads of its object run"
        );
        let Some(p) = self.placement.as_ref() else {
            return;
        };
        let version = Version {
            epoch: p.epoch.0,
            seq: self.info.last_update.seq + 1 + self.inflight_unsubmitted(),
        };
        let mut replicas: Vec<i32> = p
            .acting
            .iter()
            .copied()
            .filter(|&o| o != self.whoami)
            .collect();
        let key = obj_key(&req.oid);
        let mut log_only = Vec::new();
        for (&t, through) in &self.backfill {
            if replicas.contains(&t) || t == self.whoami {
                continue;
            }
            replicas.push(t);
            if !self.backfill_done.contains(&t) && through.as_ref().is_none_or(|th| key > *th) {
                log_only.push(t);
            }
        }
        let mut waiting: BTreeSet<i32> = replicas.iter().copied().collect();
        waiting.insert(self.whoami);
        let trim_to = self.trim_point(1 + self.inflight_unsubmitted() as usize);
        self.busy.entry(req.oid.clone()).or_default().writes += 1;
        self.inflight.insert(
            version.seq,
            InFlight {
                tokens: vec![token],
                reqid: req.reqid.clone(),
                oid: req.oid.clone(),
                version,
                waiting,
                outcome: None,
                trim_to,
            },
        );
        out.push(PgAction::Write {
            token,
            req,
            version,
            trim_to,
            replicas,
            log_only,
        });
    }

    /// Writes handed out but whose `Submitted` has not come back yet.
    fn inflight_unsubmitted(&self) -> u64 {
        self.inflight
            .values()
            .filter(|f| f.outcome.is_none() && f.version.seq > self.info.last_update.seq)
            .count() as u64
    }

    /// The version up to which the log may be trimmed once `adding` more
    /// entries are appended: keep `min` entries when clean, `max` otherwise,
    /// trimming whole steps of `log_trim_min_entries` counted from the
    /// log's current front. Writes started before a trim lands so agree on
    /// the point, and only the first of them moves the tail.
    fn trim_point(&self, adding: usize) -> Version {
        let keep = if self.state.clean {
            self.limits.min_log_entries
        } else {
            self.limits.max_log_entries
        }
        .max(1);
        let step = self.limits.log_trim_min_entries.max(1);
        let total = self.log.len() + adding;
        let drop = total.saturating_sub(keep) / step * step;
        if drop == 0 {
            return self.info.log_tail;
        }
        self.log
            .get(drop.saturating_sub(1).min(self.log.len().saturating_sub(1)))
            .map(|e| e.version)
            .unwrap_or(self.info.log_tail)
            .max(self.info.log_tail)
    }

    fn answer_dup(&mut self, token: Token, seq: u64, req: &OpRequest, out: &mut Vec<PgAction>) {
        if let Some(f) = self.inflight.get_mut(&seq) {
            f.tokens.push(token);
            return;
        }
        let idx = self.log.iter().position(|e| e.version.seq == seq);
        let Some(e) = idx.and_then(|i| self.log.get(i)) else {
            return;
        };
        let result = match &e.op {
            LogOp::Error(err) => Err(err.clone()),
            _ => Ok(Vec::new()),
        };
        out.push(PgAction::Reply {
            token,
            reply: reply(&req.reqid, OpStatus::Done(result), e.version, self.epoch()),
        });
    }

    fn on_submitted(
        &mut self,
        seq: u64,
        entry: LogEntry,
        outcome: Result<Vec<SubOpOutput>, OpError>,
        _out: &mut [PgAction],
    ) {
        let Some(f) = self.inflight.get_mut(&seq) else {
            return;
        };
        debug_assert!(entry.version > self.info.last_update, "versions only grow");
        f.outcome = Some(outcome);
        let trim_to = f.trim_to;
        self.append_entry(entry, trim_to);
    }

    /// Appends an entry to the in-memory log after trimming up to `trim_to`.
    fn append_entry(&mut self, entry: LogEntry, trim_to: Version) {
        self.trim_log(trim_to.min(self.info.last_update));
        self.info.last_update = entry.version;
        self.info.last_complete = entry.version;
        if let Some(r) = &entry.reqid {
            self.reqids.insert(r.clone(), entry.version.seq);
        }
        self.log.push_back(entry);
    }

    /// Drops the entries up to `to` (the log's front moves, and
    /// `log_tail` with it).
    fn trim_log(&mut self, to: Version) {
        while self.log.front().is_some_and(|e| e.version <= to) {
            if let Some(e) = self.log.pop_front() {
                if let Some(r) = &e.reqid {
                    self.reqids.remove(r);
                }
                self.info.log_tail = e.version;
            }
        }
    }

    /// Replica side: records an entry the primary sent (applied by the
    /// runtime in the same store transaction). Returns false for a gap.
    pub fn apply_replicated(&mut self, entry: &LogEntry, trim_to: Version) -> bool {
        if entry.version.seq != self.info.last_update.seq + 1 {
            return false;
        }
        let to = trim_to.min(self.info.last_update);
        self.trim_log(to);
        self.info.last_update = entry.version;
        self.info.last_complete = entry.version;
        if let Some(r) = &entry.reqid {
            self.reqids.insert(r.clone(), entry.version.seq);
        }
        self.log.push_back(entry.clone());
        true
    }

    fn on_committed(&mut self, seq: u64, from: i32, out: &mut Vec<PgAction>) {
        let done = match self.inflight.get_mut(&seq) {
            Some(f) => {
                f.waiting.remove(&from);
                f.waiting.is_empty() && f.outcome.is_some()
            }
            None => false,
        };
        if !done {
            return;
        }
        // Acks go out in version order: an op completes only when every
        // earlier one has.
        while let Some((&s, f)) = self.inflight.iter().next() {
            if !(f.waiting.is_empty() && f.outcome.is_some()) {
                break;
            }
            let Some(f) = self.inflight.remove(&s) else {
                break;
            };
            let status = OpStatus::Done(f.outcome.unwrap_or(Ok(Vec::new())));
            for t in f.tokens {
                out.push(PgAction::Reply {
                    token: t,
                    reply: reply(&f.reqid, status.clone(), f.version, self.epoch()),
                });
            }
            self.release(&f.oid, true, out);
        }
    }

    /// A write of `oid` finished (`done`) or its reads did: start what
    /// queued behind it. While other writes of the object are in flight
    /// only writes that need no more than its projected state start (up to
    /// the per-object bound); once none is, the queue runs as it arrived:
    /// reads, then the next write (and the overlapping ones after it).
    fn release(&mut self, oid: &ObjectName, done: bool, out: &mut Vec<PgAction>) {
        let Some(mut b) = self.busy.remove(oid) else {
            return;
        };
        if done {
            debug_assert!(b.writes > 0, "a write finished that was not counted");
            b.writes = b.writes.saturating_sub(1);
        }
        if b.writes == 0 {
            // Everything submitted is durable here: the store shows it.
            b.projected = None;
        }
        let mut q = std::mem::take(&mut b.queue);
        self.busy.insert(oid.clone(), b);
        while let Some((t, req)) = q.pop_front() {
            let writes = self.object_writes_in_flight(oid);
            if !req.is_write() {
                if writes > 0 {
                    q.push_front((t, req));
                    break;
                }
                self.emit_read(t, req, out);
                continue;
            }
            if let Some(&seq) = self.reqids.get(&req.reqid) {
                self.answer_dup(t, seq, &req, out);
                continue;
            }
            if let Some(f) = self.inflight.values_mut().find(|f| f.reqid == req.reqid) {
                f.tokens.push(t);
                continue;
            }
            if writes > 0 {
                let overlap = writes < self.limits.max_object_writes_in_flight
                    && self.pipelines()
                    && pipelinable(&req)
                    && !self.blocked_by_scrub(oid);
                if !overlap {
                    q.push_front((t, req));
                    break;
                }
                self.start(t, req, out);
                continue;
            }
            if self.blocked_by_scrub(oid) {
                // The rest of this object's queue waits behind the scrub.
                self.hold_for_scrub(t, req, out);
                for (t, r) in q.drain(..) {
                    self.hold_for_scrub(t, r, out);
                }
                break;
            }
            if self.reading.contains_key(oid) {
                // Reads released just before it still run: wait for them.
                q.push_front((t, req));
                break;
            }
            self.start(t, req, out);
        }
        let idle = match self.busy.get_mut(oid) {
            Some(b) => {
                b.queue = q;
                b.writes == 0 && b.queue.is_empty()
            }
            None => false,
        };
        if idle {
            self.busy.remove(oid);
        }
    }

    fn on_peering_done(
        &mut self,
        interval_since: Epoch,
        result: Result<(PgInfo, Vec<LogEntry>), String>,
        out: &mut Vec<PgAction>,
    ) {
        if interval_since != self.info.same_interval_since || self.role != Role::Primary {
            return;
        }
        let Some(p) = self.placement.clone() else {
            return;
        };
        self.state.peering = false;
        match result {
            Err(why) if why.starts_with(PG_TEMP_WAIT) => {
                // Ops stay queued: the map with pg_temp starts a new
                // interval whose primary serves them (or tells them to resend).
                self.state.peering = true;
                self.waiting_pg_temp = true;
                self.state.down_reason = Some(why);
            }
            Err(why) => {
                self.state.down = true;
                self.state.down_reason = Some(why.clone());
                for (t, req) in self.waiting_for_active.drain(..) {
                    out.push(PgAction::Reply {
                        token: t,
                        reply: reply(
                            &req.reqid,
                            OpStatus::NotActive {
                                state: format!("down: {why}"),
                            },
                            Version::default(),
                            p.epoch,
                        ),
                    });
                }
            }
            Ok((info, log)) => {
                self.full = None;
                self.unsure.clear();
                self.reload(info, log);
                self.info.same_interval_since = interval_since;
                self.state.creating = false;
                self.state.active = true;
                self.went_active_this_interval = true;
                let full = p.acting.len() as u32 >= p.size;
                self.state.clean = full && p.up == p.acting;
                self.state.degraded = !full;
                self.state.undersized = !full;
                if self.state.clean {
                    self.info.last_epoch_clean = p.epoch;
                }
                out.push(PgAction::PersistMeta);
                let waiting: Vec<_> = self.waiting_for_active.drain(..).collect();
                for (t, req) in waiting {
                    self.admit(t, req, out);
                }
            }
        }
    }

    /// Where client ops wait in this PG, for slow-op warnings: role, state,
    /// the oldest writes in flight and the members they wait for, and the
    /// lengths of the queues.
    pub fn wait_summary(&self) -> String {
        let inflight: Vec<String> = self
            .inflight
            .iter()
            .take(3)
            .map(|(seq, f)| {
                format!(
                    "{seq} waits for {:?}{}",
                    f.waiting,
                    if f.outcome.is_some() {
                        ""
                    } else {
                        " (not submitted)"
                    }
                )
            })
            .collect();
        format!(
            "{:?} {} since e{}; {} in flight [{}]; queued: {} behind busy objects, {} for activation{}, {} behind scrub",
            self.role,
            self.state,
            self.info.same_interval_since.0,
            self.inflight.len(),
            inflight.join(", "),
            self.busy.values().map(|b| b.queue.len()).sum::<usize>(),
            self.waiting_for_active.len(),
            if self.waiting_pg_temp { " (waiting for pg_temp)" } else { "" },
            self.scrub_waiting.len()
        )
    }

    /// Newest version acknowledged to a client here is in the log (debug check).
    pub fn check_invariants(&self) {
        debug_assert!(self
            .log
            .iter()
            .zip(self.log.iter().skip(1))
            .all(|(a, b)| a.version < b.version));
        debug_assert!(self
            .log
            .back()
            .is_none_or(|e| e.version == self.info.last_update));
        debug_assert!(
            self.inflight
                .values()
                .all(|f| !self.reading.contains_key(&f.oid)),
            "an object has a read and a write in flight"
        );
        debug_assert_eq!(
            self.reading.values().map(|&n| n as usize).sum::<usize>(),
            self.read_tokens.len()
        );
        debug_assert!(
            self.busy.iter().all(|(oid, b)| {
                b.writes as usize == self.inflight.values().filter(|f| &f.oid == oid).count()
            }),
            "an object's count of writes in flight is off"
        );
        debug_assert!(
            self.inflight
                .values()
                .all(|f| self.busy.contains_key(&f.oid)),
            "a write in flight on an object not marked busy"
        );
    }
}

/// Prefix of the activation error that means "asked the monitors for
/// `pg_temp`; the next map brings it" (the PG keeps its ops queued).
pub const PG_TEMP_WAIT: &str = "waiting for pg_temp";

/// An object's position in store order: bit-reversed hash, namespace, name.
pub type ObjKey = (u32, String, String);

/// The store-order key of `oid`.
pub fn obj_key(oid: &ObjectName) -> ObjKey {
    (
        oid.hash().reverse_bits(),
        oid.namespace.clone(),
        oid.name.clone(),
    )
}

/// The store-order key of a listing cursor.
pub fn cursor_key(c: &cairn_ops::ListCursor) -> ObjKey {
    (c.hash.reverse_bits(), c.namespace.clone(), c.name.clone())
}

impl Pg {
    /// Sets this interval's backfill targets and their positions.
    pub fn set_backfill_targets(&mut self, targets: BTreeMap<i32, Option<ObjKey>>) {
        self.backfill = targets;
        self.state.backfill_wait = !self.backfill.is_empty();
    }

    /// `osd` now holds every object up to `through`.
    pub fn backfill_advance(&mut self, osd: i32, through: ObjKey) {
        if let Some(t) = self.backfill.get_mut(&osd) {
            *t = Some(through);
        }
    }

    /// Backfill target side: takes the current primary's start of the
    /// interval (this OSD may date it later, e.g. after skipping map
    /// epochs), so the primary's sub-ops are not refused as stale. Only
    /// for an up member outside the acting set: it serves nothing.
    pub fn adopt_backfill_interval(&mut self, from: i32, since: Epoch) {
        let target = self.placement.as_ref().is_some_and(|p| {
            p.primary == Some(from)
                && p.up.contains(&self.whoami)
                && !p.acting.contains(&self.whoami)
        });
        if target {
            self.info.same_interval_since = since;
        }
    }

    /// Stops sending writes to backfill target `osd` (its backfill failed
    /// and restarts later): writes waiting only for it complete now. It is
    /// not an acting member, so no acknowledgement loses durability.
    pub fn drop_backfill_target(&mut self, osd: i32) -> Vec<PgAction> {
        let mut out = Vec::new();
        if self.backfill.remove(&osd).is_none() {
            return out;
        }
        self.backfill_done.remove(&osd);
        let seqs: Vec<u64> = self.inflight.keys().copied().collect();
        for s in seqs {
            self.on_committed(s, osd, &mut out);
        }
        out
    }

    /// Adds backfill target `osd` at the start (nothing copied yet).
    pub fn add_backfill_target(&mut self, osd: i32) {
        self.backfill.insert(osd, None);
        self.backfill_done.remove(&osd);
    }

    /// `osd` holds every object: writes carry data to it from now on.
    pub fn backfill_complete(&mut self, osd: i32) {
        if self.backfill.contains_key(&osd) {
            self.backfill_done.insert(osd);
        }
    }

    /// Backfill targets and their positions.
    pub fn backfill_targets(&self) -> &BTreeMap<i32, Option<ObjKey>> {
        &self.backfill
    }

    /// `oid` has a write in flight or queued.
    pub fn is_busy(&self, oid: &ObjectName) -> bool {
        self.busy.contains_key(oid)
    }

    /// The first object (store order) after `after` with a write in
    /// flight or queued: a backfill batch must not reach it (the write
    /// went to the target without data, and the object may not even be
    /// listed yet), so the copy the batch sends is never overtaken.
    pub fn first_busy_after(&self, after: Option<&ObjKey>) -> Option<ObjKey> {
        self.busy
            .keys()
            .map(obj_key)
            .filter(|k| after.is_none_or(|a| k > a))
            .min()
    }
}

/// How a member gets to the authoritative log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecoveryPlan {
    UpToDate,
    /// Copy these objects (state after the authoritative log) and adopt the log.
    Log {
        objects: Vec<ObjectName>,
    },
    /// The log does not reach back far enough: copy every object.
    Backfill,
}

/// Decides how `member` (info + log; None = no copy) catches up with the
/// authoritative `auth` info and log. Entries the member has that the
/// authoritative log lacks (divergent, never acknowledged) are undone by
/// copying the authoritative state of their objects.
pub fn plan_recovery(
    auth: &PgInfo,
    auth_log: &[LogEntry],
    member: Option<(&PgInfo, &[LogEntry])>,
) -> RecoveryPlan {
    let (minfo, mlog) = match member {
        Some((i, l)) => (i.clone(), l),
        None => (PgInfo::default(), &[][..]),
    };
    if minfo.last_update == auth.last_update {
        return RecoveryPlan::UpToDate;
    }
    let auth_versions: HashSet<Version> = auth_log.iter().map(|e| e.version).collect();
    let in_auth = |v: Version| v == auth.log_tail || auth_versions.contains(&v);
    let common = if in_auth(minfo.last_update) {
        Some(minfo.last_update)
    } else {
        mlog.iter()
            .rev()
            .map(|e| e.version)
            .find(|&v| in_auth(v))
            .or_else(|| in_auth(minfo.log_tail).then_some(minfo.log_tail))
    };
    let Some(common) = common else {
        return RecoveryPlan::Backfill;
    };
    if common < auth.log_tail {
        return RecoveryPlan::Backfill;
    }
    let mut seen = HashSet::new();
    let mut objects = Vec::new();
    for e in auth_log
        .iter()
        .filter(|e| e.version > common)
        .chain(mlog.iter().filter(|e| e.version > common))
    {
        if seen.insert(e.oid.clone()) {
            objects.push(e.oid.clone());
        }
    }
    RecoveryPlan::Log { objects }
}

/// The OSDs that settle past intervals for [`check_can_activate`] (and
/// EC's `check_k_per_interval`): every OSD that answered this run's query
/// — with a copy *or without one* — and every OSD declared lost.
///
/// Why an answer with no copy settles the intervals its sender was acting
/// in (Ceph counts every probed OSD that is up the same way): a write is
/// acknowledged only once it is durable on every acting member of its
/// interval, so each member of an interval that acknowledged a write held
/// a copy of the PG durably from then on. The answer is made from durable
/// state (members flush first) by an OSD that already has the query's map,
/// so it refuses sub-ops of earlier intervals from then on. A copy leaves
/// an OSD only after a later activation holds its data elsewhere: a stray
/// is removed once the PG is clean without it, a copy of another shard
/// position once the PG is clean (the member then serves a newer copy
/// itself). That later activation is recorded in the map and checked like
/// any other: while no member of it answers, the run waits for it; once
/// one does, its `last_epoch_started` ends the older intervals' claims. So
/// an up member answering "no copy" proves the interval acknowledged
/// nothing its answer could hide. Not covered: a disk wiped and brought
/// back under the same OSD id (the monitors refuse its boot: the uuid
/// differs); giving up an OSD is `cairn osd lost`.
pub fn settled_osds(answered: impl IntoIterator<Item = i32>, lost: &[i32]) -> Vec<i32> {
    let mut s: Vec<i32> = answered.into_iter().chain(lost.iter().copied()).collect();
    s.sort_unstable();
    s.dedup();
    s
}

/// Checks that activation may go ahead: every past interval that may have
/// accepted writes since the newest activation among `responders` has at
/// least one member among them. Err names the OSDs waited for.
pub fn check_can_activate(
    past: &[PastInterval],
    best_les: Epoch,
    responders: &[i32],
) -> Result<(), String> {
    for pi in past {
        if !pi.maybe_went_rw || pi.last < best_les {
            continue;
        }
        if !pi.acting.iter().any(|o| responders.contains(o)) {
            let list: Vec<String> = pi.acting.iter().map(|o| format!("osd.{o}")).collect();
            let lost: Vec<String> = pi
                .acting
                .iter()
                .map(|o| format!("`cairn osd lost {o} --yes-i-really-mean-it`"))
                .collect();
            return Err(format!(
                "waiting for {} (acting in epochs {}..={}, which may have accepted writes): bring one of them back, or run {} to give up their writes",
                list.join(", "),
                pi.first.0,
                pi.last.0,
                lost.join(" and ")
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_ops::ObjectName;
    use cairn_types::{EntityName, PoolId};

    fn pgid() -> PgId {
        PgId {
            pool: PoolId(1),
            seed: 0,
        }
    }

    /// A PG as `whoami` first sees it: default limits, no info, log or missing objects.
    fn fresh_pg(whoami: i32) -> Pg {
        Pg::new(
            pgid(),
            whoami,
            PgLimits::default(),
            PgInfo::default(),
            vec![],
            vec![],
        )
    }

    fn placement(epoch: u64, acting: &[i32]) -> Placement {
        Placement {
            epoch: Epoch(epoch),
            up: acting.to_vec(),
            acting: acting.to_vec(),
            shards: Vec::new(),
            primary: acting.first().copied(),
            size: 3,
            min_size: 2,
            prev_primary_up_thru: None,
            acting_up_from: vec![Epoch(1); acting.len()],
            last_recorded: None,
        }
    }

    fn write_req(tid: u64, obj: &str) -> OpRequest {
        OpRequest {
            reqid: ReqId {
                client: EntityName::client("t"),
                incarnation: 1,
                tid,
            },
            epoch: Epoch(5),
            pgid: pgid(),
            oid: ObjectName::new("", obj),
            ops: vec![SubOp::WriteFull {
                data: bytes::Bytes::from_static(b"x"),
            }],
            snapc: None,
            snap: cairn_ops::SNAP_HEAD,
        }
    }

    fn active_primary() -> Pg {
        let mut pg = fresh_pg(0);
        let acts = pg.handle(PgEvent::Map(placement(5, &[0, 1, 2])));
        assert!(acts.iter().any(|a| matches!(a, PgAction::Peer { .. })));
        let info = pg.info.clone();
        pg.handle(PgEvent::PeeringDone {
            interval_since: Epoch(5),
            result: Ok((info, vec![])),
        });
        assert!(pg.state.active && pg.state.clean, "{}", pg.state);
        pg
    }

    /// Feeds the Submitted event a runtime would.
    fn submit(pg: &mut Pg, acts: &[PgAction]) -> Vec<u64> {
        let mut seqs = Vec::new();
        for a in acts {
            if let PgAction::Write { req, version, .. } = a {
                pg.handle(PgEvent::Submitted {
                    seq: version.seq,
                    entry: LogEntry {
                        version: *version,
                        prior_version: Version::default(),
                        reqid: Some(req.reqid.clone()),
                        oid: req.oid.clone(),
                        op: LogOp::Modify,
                    },
                    outcome: Ok(vec![SubOpOutput::None]),
                });
                seqs.push(version.seq);
            }
        }
        seqs
    }

    #[test]
    fn scrub_holds_writes_to_its_chunk_until_released() {
        let mut pg = active_primary();
        let writes = |acts: &[PgAction]| {
            acts.iter()
                .filter(|a| matches!(a, PgAction::Write { .. }))
                .count()
        };
        // A write to "a" is in flight when the scrub blocks a's chunk.
        let first = pg.handle(PgEvent::ClientOp {
            token: 1,
            req: write_req(1, "a"),
        });
        let seqs = submit(&mut pg, &first);
        let h = ObjectName::new("", "a").hash().reverse_bits() as u64;
        let range = ScrubRange {
            start: h,
            end: h + 1,
        };
        assert!(pg.scrub_block(range));
        assert!(pg.scrub_chunk_busy());
        // New writes to "a" wait; writes elsewhere and reads go on.
        let held = pg.handle(PgEvent::ClientOp {
            token: 2,
            req: write_req(2, "a"),
        });
        assert_eq!(writes(&held), 0);
        let other = pg.handle(PgEvent::ClientOp {
            token: 3,
            req: write_req(3, "b"),
        });
        assert_eq!(writes(&other), 1);
        submit(&mut pg, &other);
        let done = commit_all(&mut pg, seqs[0]);
        assert!(done
            .iter()
            .any(|a| matches!(a, PgAction::Reply { token: 1, .. })));
        assert_eq!(writes(&done), 0, "the queued write stays held");
        assert!(!pg.scrub_chunk_busy());
        // Released: the held write starts.
        let go = pg.scrub_unblock();
        assert_eq!(writes(&go), 1);
        assert!(pg.scrub_blocked_range().is_none());
    }

    fn read_req(tid: u64, obj: &str) -> OpRequest {
        OpRequest {
            ops: vec![SubOp::Read { offset: 0, len: 0 }],
            ..write_req(tid, obj)
        }
    }

    #[test]
    fn a_write_waits_for_running_reads_of_its_object() {
        let mut pg = active_primary();
        let is_read = |acts: &[PgAction], t: Token| {
            acts.iter()
                .any(|a| matches!(a, PgAction::Read { token, .. } if *token == t))
        };
        let writes = |acts: &[PgAction]| {
            acts.iter()
                .filter(|a| matches!(a, PgAction::Write { .. }))
                .count()
        };
        // Two reads of "a" run at once (off the PG's task).
        let r1 = pg.handle(PgEvent::ClientOp {
            token: 1,
            req: read_req(1, "a"),
        });
        let r2 = pg.handle(PgEvent::ClientOp {
            token: 2,
            req: read_req(2, "a"),
        });
        assert!(is_read(&r1, 1) && is_read(&r2, 2));
        assert_eq!(pg.reads_running(&ObjectName::new("", "a")), 2);
        // A write to "a" waits; a read queued behind it waits too; a write
        // elsewhere goes on.
        let w = pg.handle(PgEvent::ClientOp {
            token: 3,
            req: write_req(3, "a"),
        });
        assert_eq!(writes(&w), 0);
        let r4 = pg.handle(PgEvent::ClientOp {
            token: 4,
            req: read_req(4, "a"),
        });
        assert!(r4.is_empty(), "a read behind a waiting write waits: {r4:?}");
        let other = pg.handle(PgEvent::ClientOp {
            token: 5,
            req: write_req(5, "b"),
        });
        assert_eq!(writes(&other), 1);
        pg.check_invariants();
        // The first read ends: the write still waits for the second.
        assert!(pg.handle(PgEvent::ReadDone { token: 1 }).is_empty());
        // An unknown or repeated token changes nothing.
        assert!(pg.handle(PgEvent::ReadDone { token: 1 }).is_empty());
        let go = pg.handle(PgEvent::ReadDone { token: 2 });
        assert_eq!(writes(&go), 1, "{go:?}");
        assert_eq!(pg.reads_running(&ObjectName::new("", "a")), 0);
        pg.check_invariants();
        // The read queued behind the write runs after it is acknowledged
        // (writes are submitted and acknowledged in version order).
        let first = submit(&mut pg, &other);
        let seqs = submit(&mut pg, &go);
        commit_all(&mut pg, first[0]);
        let done = commit_all(&mut pg, seqs[0]);
        assert!(is_read(&done, 4), "{done:?}");
        pg.check_invariants();
    }

    #[test]
    fn reads_of_a_closed_interval_still_hold_writes_back() {
        let mut pg = active_primary();
        let r = pg.handle(PgEvent::ClientOp {
            token: 1,
            req: read_req(1, "a"),
        });
        assert_eq!(r.len(), 1);
        // The interval changes while the store read runs, and the PG comes
        // back active: a new write to "a" still waits for that read.
        pg.handle(PgEvent::Map(placement(7, &[0, 1])));
        let info = pg.info.clone();
        pg.handle(PgEvent::PeeringDone {
            interval_since: Epoch(7),
            result: Ok((info, vec![])),
        });
        assert!(pg.state.active, "{}", pg.state);
        let mut w = write_req(2, "a");
        w.epoch = Epoch(7);
        let acts = pg.handle(PgEvent::ClientOp { token: 2, req: w });
        assert!(acts.is_empty(), "{acts:?}");
        let go = pg.handle(PgEvent::ReadDone { token: 1 });
        assert!(
            go.iter().any(|a| matches!(a, PgAction::Write { .. })),
            "{go:?}"
        );
    }

    fn commit_all(pg: &mut Pg, seq: u64) -> Vec<PgAction> {
        let mut out = Vec::new();
        for from in [0, 1, 2] {
            out.extend(pg.handle(PgEvent::Committed {
                seq,
                from,
                interval_since: Epoch(5),
            }));
        }
        out
    }

    /// Sim `disk` seeds 2, 4 and 38: osd.2 refused write 1 for lack of
    /// space after osd.0 (primary) and osd.1 had it durably. Its client was
    /// told "no space" and later read the value back (peering kept the
    /// entry the primary held). Now every in-flight op is told to retry;
    /// the resend waits for the log, while a new write is refused as full.
    #[test]
    fn a_write_a_member_could_not_commit_is_retried_not_refused() {
        let mut pg = active_primary();
        let acts = pg.handle(PgEvent::ClientOp {
            token: 1,
            req: write_req(1, "a"),
        });
        let seqs = submit(&mut pg, &acts);
        pg.handle(PgEvent::Committed {
            seq: seqs[0],
            from: 0,
            interval_since: Epoch(5),
        });
        let full = OpError::NoSpace("osd.2 is full".into());
        let out = pg.commit_failed(seqs[0], 2, full);
        let status = |acts: &[PgAction], token: Token| {
            acts.iter().find_map(|a| match a {
                PgAction::Reply { token: t, reply } if *t == token => Some(reply.status.clone()),
                _ => None,
            })
        };
        assert!(
            matches!(status(&out, 1), Some(OpStatus::NotActive { .. })),
            "the failed write must be retried, got {:?}",
            status(&out, 1)
        );
        assert!(out.iter().any(|a| matches!(a, PgAction::Peer { .. })));
        // Its resend (same reqid) waits for peering; a new write is refused.
        let resend = pg.handle(PgEvent::ClientOp {
            token: 2,
            req: write_req(1, "a"),
        });
        assert!(status(&resend, 2).is_none(), "resend queued: {resend:?}");
        let new = pg.handle(PgEvent::ClientOp {
            token: 3,
            req: write_req(2, "b"),
        });
        assert!(matches!(
            status(&new, 3),
            Some(OpStatus::Done(Err(OpError::NoSpace(_))))
        ));
        // Once active the resend gets the true outcome from the log.
        let info = pg.info.clone();
        let log: Vec<LogEntry> = pg.log().cloned().collect();
        let done = pg.handle(PgEvent::PeeringDone {
            interval_since: Epoch(5),
            result: Ok((info, log)),
        });
        assert!(
            matches!(status(&done, 2), Some(OpStatus::Done(Ok(_)))),
            "resend answered from the log: {done:?}"
        );
    }

    #[test]
    fn acks_only_when_every_member_is_durable() {
        let mut pg = active_primary();
        let acts = pg.handle(PgEvent::ClientOp {
            token: 1,
            req: write_req(1, "a"),
        });
        let seqs = submit(&mut pg, &acts);
        assert_eq!(seqs, vec![1]);
        for from in [0, 1] {
            let out = pg.handle(PgEvent::Committed {
                seq: 1,
                from,
                interval_since: Epoch(5),
            });
            assert!(out.is_empty(), "acked before osd.2 committed");
        }
        let out = pg.handle(PgEvent::Committed {
            seq: 1,
            from: 2,
            interval_since: Epoch(5),
        });
        assert!(matches!(&out[..], [PgAction::Reply { token: 1, .. }]));
    }

    #[test]
    fn writes_that_read_the_object_serialise_and_resends_apply_once() {
        let mut pg = active_primary();
        let a1 = pg.handle(PgEvent::ClientOp {
            token: 1,
            req: write_req(1, "a"),
        });
        let a2 = pg.handle(PgEvent::ClientOp {
            token: 2,
            req: guarded_req(2, "a"),
        });
        assert!(a2.is_empty(), "second writer must wait: {a2:?}");
        // The first op is resent while in flight: no second write.
        let dup = pg.handle(PgEvent::ClientOp {
            token: 3,
            req: write_req(1, "a"),
        });
        assert!(dup.is_empty());
        submit(&mut pg, &a1);
        let out = commit_all(&mut pg, 1);
        let replied: Vec<Token> = out
            .iter()
            .filter_map(|a| match a {
                PgAction::Reply { token, .. } => Some(*token),
                _ => None,
            })
            .collect();
        assert_eq!(replied, vec![1, 3]);
        let writes: Vec<&PgAction> = out
            .iter()
            .filter(|a| matches!(a, PgAction::Write { .. }))
            .collect();
        assert_eq!(writes.len(), 1, "second writer starts after the first");
        // A resend after completion is answered from the log.
        let late = pg.handle(PgEvent::ClientOp {
            token: 4,
            req: write_req(1, "a"),
        });
        assert!(
            matches!(&late[..], [PgAction::Reply { token: 4, reply }] if reply.version.seq == 1)
        );
    }

    #[test]
    fn interval_change_aborts_inflight_and_records_past_interval() {
        let mut pg = active_primary();
        let acts = pg.handle(PgEvent::ClientOp {
            token: 1,
            req: write_req(1, "a"),
        });
        submit(&mut pg, &acts);
        let out = pg.handle(PgEvent::Map(placement(6, &[0, 1])));
        assert!(out
            .iter()
            .any(|a| matches!(a, PgAction::Reply { token: 1, .. })));
        assert!(out.iter().any(|a| matches!(a, PgAction::Peer { .. })));
        assert_eq!(pg.past.len(), 1);
        assert!(pg.past[0].maybe_went_rw);
        // The committed entry stays in the log for the resend.
        assert_eq!(pg.log_len(), 1);
    }

    #[test]
    fn an_interval_whose_primary_never_got_up_thru_did_not_write() {
        // Seen from replica osd.1: interval 5.. with primary osd.0.
        let mut pg = fresh_pg(1);
        pg.handle(PgEvent::Map(placement(5, &[0, 1, 2])));
        pg.handle(PgEvent::Map(Placement {
            prev_primary_up_thru: Some(Epoch(4)),
            ..placement(6, &[2, 1])
        }));
        assert!(!pg.past[0].maybe_went_rw, "osd.0 never had up_thru >= 5");
        pg.handle(PgEvent::Map(Placement {
            prev_primary_up_thru: Some(Epoch(6)),
            ..placement(7, &[0, 1])
        }));
        assert!(pg.past[1].maybe_went_rw, "osd.2 had up_thru 6");
        assert_eq!(pg.role, Role::Replica);
    }

    #[test]
    fn a_member_that_went_down_and_up_in_skipped_epochs_starts_a_new_interval() {
        // The primary saw e5 and then e9 with the same acting set; osd.1 was
        // down in between (up_from 8), which osd.1 itself saw as two
        // interval changes. Without a new interval here the two disagree
        // on the interval start and osd.1 refuses every write.
        let mut pg = active_primary();
        let out = pg.handle(PgEvent::Map(Placement {
            acting_up_from: vec![Epoch(1), Epoch(8), Epoch(1)],
            last_recorded: None,
            ..placement(9, &[0, 1, 2])
        }));
        assert!(out.iter().any(|a| matches!(a, PgAction::Peer { .. })));
        assert_eq!(pg.info.same_interval_since, Epoch(9));
        // The same map again is no change.
        let out = pg.handle(PgEvent::Map(Placement {
            acting_up_from: vec![Epoch(1), Epoch(8), Epoch(1)],
            last_recorded: None,
            ..placement(10, &[0, 1, 2])
        }));
        assert!(out.is_empty());
    }

    #[test]
    fn a_replica_that_skipped_epochs_adopts_the_primarys_earlier_interval_start() {
        // osd.1 last saw e5; the next map it gets is e9, where osd.2 joined
        // (the primary saw that happen in e7). Without adopting e7, osd.1
        // refuses every write of the primary as stale.
        let mut pg = fresh_pg(1);
        pg.handle(PgEvent::Map(placement(5, &[0, 1])));
        pg.handle(PgEvent::Map(placement(9, &[0, 1, 2])));
        assert_eq!(pg.info.same_interval_since, Epoch(9));
        assert!(
            !pg.adopt_primary_interval_start(0, Epoch(5)),
            "before the floor"
        );
        assert!(pg.adopt_primary_interval_start(0, Epoch(7)));
        assert_eq!(pg.info.same_interval_since, Epoch(7));
        assert_eq!(pg.past.last().map(|p| p.last), Some(Epoch(6)));
        // Consecutive epochs: the start is known exactly.
        pg.handle(PgEvent::Map(placement(10, &[0, 1])));
        assert!(!pg.adopt_primary_interval_start(0, Epoch(9)));
    }

    #[test]
    fn a_primary_that_missed_a_change_and_back_starts_a_new_interval_when_a_member_says_so() {
        // osd.0 saw [0, 1, 2] from e5 and next e12 with the same set; the
        // members saw it change in e8 and back in e10 and refuse writes
        // of the e5 interval. osd.0 cannot see that in its map; osd.2's
        // refusal names e10.
        let mut pg = fresh_pg(0);
        pg.handle(PgEvent::Map(placement(5, &[0, 1, 2])));
        pg.handle(PgEvent::Map(placement(12, &[0, 1, 2])));
        assert_eq!(pg.info.same_interval_since, Epoch(5));
        // Not newer than ours: nothing to do.
        assert!(pg.member_interval_newer(Epoch(5)).is_empty());
        let acts = pg.member_interval_newer(Epoch(10));
        assert_eq!(pg.info.same_interval_since, Epoch(12));
        assert!(
            acts.iter()
                .any(|a| matches!(a, PgAction::Peer { interval_since, .. } if *interval_since == Epoch(12))),
            "{acts:?}"
        );
        assert_eq!(
            pg.past.last().map(|p| (p.first, p.last)),
            Some((Epoch(5), Epoch(11)))
        );
        // A map older than the member's interval: the next map at or past
        // it starts the new interval even with the same placement.
        assert!(pg.member_interval_newer(Epoch(14)).is_empty());
        pg.handle(PgEvent::Map(placement(13, &[0, 1, 2])));
        assert_eq!(pg.info.same_interval_since, Epoch(12));
        pg.handle(PgEvent::Map(placement(14, &[0, 1, 2])));
        assert_eq!(pg.info.same_interval_since, Epoch(14));
        // A replica never restarts its interval this way.
        let mut r = fresh_pg(1);
        r.handle(PgEvent::Map(placement(5, &[0, 1, 2])));
        r.handle(PgEvent::Map(placement(12, &[0, 1, 2])));
        assert!(r.member_interval_newer(Epoch(10)).is_empty());
    }

    #[test]
    fn an_activation_recorded_elsewhere_ends_the_interval_even_if_the_placement_is_back() {
        // osd.0 was primary of [0, 1, 2] from e5, was partitioned while
        // [1, 2, 3] activated in e9 (recorded), and next sees e14 with
        // [0, 1, 2] again: its e5 interval is long over and its copy stale.
        let mut pg = fresh_pg(0);
        pg.handle(PgEvent::Map(placement(5, &[0, 1, 2])));
        let mut p = placement(14, &[0, 1, 2]);
        p.last_recorded = Some(cairn_map::PgActivation {
            since: Epoch(9),
            acting: vec![1, 2, 3],
        });
        let acts = pg.handle(PgEvent::Map(p.clone()));
        assert_eq!(pg.info.same_interval_since, Epoch(14));
        assert!(acts.iter().any(|a| matches!(a, PgAction::Peer { .. })));
        // The same record does not end the new interval again; nor does
        // our own acting set recorded.
        p.epoch = Epoch(15);
        assert!(pg.handle(PgEvent::Map(p.clone())).is_empty());
        p.epoch = Epoch(16);
        p.last_recorded = Some(cairn_map::PgActivation {
            since: Epoch(16),
            acting: vec![0, 1, 2],
        });
        assert!(pg.handle(PgEvent::Map(p)).is_empty());
        assert_eq!(pg.info.same_interval_since, Epoch(14));
    }

    #[test]
    fn below_min_size_is_not_active() {
        let mut pg = active_primary();
        let out = pg.handle(PgEvent::Map(placement(6, &[0])));
        assert!(!out.iter().any(|a| matches!(a, PgAction::Peer { .. })));
        let r = pg.handle(PgEvent::ClientOp {
            token: 9,
            req: OpRequest {
                epoch: Epoch(6),
                ..write_req(9, "b")
            },
        });
        assert!(
            matches!(&r[..], [PgAction::Reply { reply, .. }] if matches!(reply.status, OpStatus::NotActive{..}))
        );
    }

    #[test]
    fn log_is_bounded() {
        let mut pg = batched_primary(1);
        for i in 0..40 {
            let acts = pg.handle(PgEvent::ClientOp {
                token: i,
                req: write_req(i, &format!("o{i}")),
            });
            let seqs = submit(&mut pg, &acts);
            for s in seqs {
                commit_all(&mut pg, s);
            }
            pg.check_invariants();
        }
        assert_eq!(pg.log_len(), 5);
        assert_eq!(pg.info.last_update.seq, 40);
        assert_eq!(pg.info.log_tail.seq, 35);
    }

    fn batched_primary(step: usize) -> Pg {
        let mut pg = Pg::new(
            pgid(),
            0,
            PgLimits {
                min_log_entries: 5,
                max_log_entries: 10,
                log_trim_min_entries: step,
                ..Default::default()
            },
            PgInfo::default(),
            vec![],
            vec![],
        );
        pg.handle(PgEvent::Map(placement(5, &[0, 1, 2])));
        let info = pg.info.clone();
        pg.handle(PgEvent::PeeringDone {
            interval_since: Epoch(5),
            result: Ok((info, vec![])),
        });
        pg
    }

    #[test]
    fn log_trims_in_steps() {
        let mut pg = batched_primary(4);
        let mut trims = Vec::new();
        for i in 0..40 {
            let (front, tail) = (pg.log_front(), pg.info.log_tail);
            let acts = pg.handle(PgEvent::ClientOp {
                token: i,
                req: write_req(i, &format!("o{i}")),
            });
            for s in submit(&mut pg, &acts) {
                commit_all(&mut pg, s);
            }
            pg.check_invariants();
            // Keep 5, trim 4 at a time: never more than 5 + 4 - 1.
            assert!(pg.log_len() <= 8, "log of {} entries", pg.log_len());
            if let Some(t) = pg.trimmed_since(front, tail) {
                trims.push(t);
            }
            assert_eq!(
                pg.log_front().map(|v| v.seq),
                Some(pg.info.log_tail.seq + 1)
            );
        }
        // The first trim at the 9th write, then one every 4th; each store
        // trim starts where the previous one ended.
        assert_eq!(
            trims,
            [
                (1, 4),
                (5, 8),
                (9, 12),
                (13, 16),
                (17, 20),
                (21, 24),
                (25, 28),
                (29, 32)
            ]
        );
        assert_eq!(pg.log_len(), 8);
        assert_eq!(pg.info.log_tail.seq, 32);
    }

    #[test]
    fn writes_in_flight_agree_on_the_trim_point() {
        let mut pg = batched_primary(4);
        for i in 0..8 {
            let acts = pg.handle(PgEvent::ClientOp {
                token: i,
                req: write_req(i, &format!("o{i}")),
            });
            for s in submit(&mut pg, &acts) {
                commit_all(&mut pg, s);
            }
        }
        assert_eq!(pg.log_len(), 8);
        // Six writes start before any is submitted: the 1st to 4th would
        // make 9 to 12 entries (one step over 5), the 5th and 6th 13 and
        // 14 (two steps).
        let mut acts = Vec::new();
        for i in 8..14 {
            acts.extend(pg.handle(PgEvent::ClientOp {
                token: i,
                req: write_req(i, &format!("o{i}")),
            }));
        }
        let points: Vec<u64> = acts
            .iter()
            .filter_map(|a| match a {
                PgAction::Write { trim_to, .. } => Some(trim_to.seq),
                _ => None,
            })
            .collect();
        assert_eq!(points, [4, 4, 4, 4, 8, 8]);
        let mut moves = 0;
        for a in &acts {
            let (front, tail) = (pg.log_front(), pg.info.log_tail);
            submit(&mut pg, std::slice::from_ref(a));
            moves += usize::from(pg.trimmed_since(front, tail).is_some());
        }
        assert_eq!(moves, 2);
        assert_eq!(pg.info.log_tail.seq, 8);
        assert_eq!(pg.log_len(), 6);
    }

    fn entry(epoch: u64, seq: u64, obj: &str) -> LogEntry {
        LogEntry {
            version: Version { epoch, seq },
            prior_version: Version::default(),
            reqid: None,
            oid: ObjectName::new("", obj),
            op: LogOp::Modify,
        }
    }

    #[test]
    fn recovery_plans() {
        let auth_log = vec![entry(5, 1, "a"), entry(5, 2, "b"), entry(6, 3, "c")];
        let auth = PgInfo {
            last_update: Version { epoch: 6, seq: 3 },
            ..Default::default()
        };
        // Empty member, untrimmed log: copy everything in the log.
        assert_eq!(
            plan_recovery(&auth, &auth_log, None),
            RecoveryPlan::Log {
                objects: vec![
                    ObjectName::new("", "a"),
                    ObjectName::new("", "b"),
                    ObjectName::new("", "c")
                ]
            }
        );
        // Behind by one.
        let m = PgInfo {
            last_update: Version { epoch: 5, seq: 2 },
            ..Default::default()
        };
        let mlog = auth_log[..2].to_vec();
        assert_eq!(
            plan_recovery(&auth, &auth_log, Some((&m, &mlog))),
            RecoveryPlan::Log {
                objects: vec![ObjectName::new("", "c")]
            }
        );
        // Divergent entry 5'3 on object d: copy c and d.
        let m = PgInfo {
            last_update: Version { epoch: 5, seq: 3 },
            ..Default::default()
        };
        let mut mlog = auth_log[..2].to_vec();
        mlog.push(entry(5, 3, "d"));
        assert_eq!(
            plan_recovery(&auth, &auth_log, Some((&m, &mlog))),
            RecoveryPlan::Log {
                objects: vec![ObjectName::new("", "c"), ObjectName::new("", "d")]
            }
        );
        // Trimmed past the member: backfill.
        let auth2 = PgInfo {
            log_tail: Version { epoch: 5, seq: 2 },
            ..auth.clone()
        };
        let m = PgInfo {
            last_update: Version { epoch: 5, seq: 1 },
            ..Default::default()
        };
        assert_eq!(
            plan_recovery(&auth2, &auth_log[2..], Some((&m, &auth_log[..1]))),
            RecoveryPlan::Backfill
        );
        assert_eq!(
            plan_recovery(&auth, &auth_log, Some((&auth, &auth_log))),
            RecoveryPlan::UpToDate
        );
    }

    #[test]
    fn activation_needs_a_member_of_every_rw_interval() {
        let past = vec![PastInterval {
            first: Epoch(7),
            last: Epoch(9),
            acting: vec![3, 4],
            primary: Some(3),
            maybe_went_rw: true,
        }];
        assert!(check_can_activate(&past, Epoch(5), &[0, 1]).is_err());
        assert!(check_can_activate(&past, Epoch(5), &[0, 4]).is_ok());
        assert!(check_can_activate(&past, Epoch(10), &[0, 1]).is_ok());
    }

    fn guarded_req(tid: u64, obj: &str) -> OpRequest {
        OpRequest {
            ops: vec![
                SubOp::CmpXattr {
                    name: "k".into(),
                    op: cairn_ops::CmpOp::Eq,
                    value: bytes::Bytes::from_static(b"v"),
                },
                SubOp::WriteFull {
                    data: bytes::Bytes::from_static(b"y"),
                },
            ],
            ..write_req(tid, obj)
        }
    }

    fn write_tokens(acts: &[PgAction]) -> Vec<Token> {
        acts.iter()
            .filter_map(|a| match a {
                PgAction::Write { token, .. } => Some(*token),
                _ => None,
            })
            .collect()
    }

    fn reply_tokens(acts: &[PgAction]) -> Vec<Token> {
        acts.iter()
            .filter_map(|a| match a {
                PgAction::Reply { token, .. } => Some(*token),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn writes_to_one_object_overlap_and_are_acknowledged_in_version_order() {
        let mut pg = active_primary();
        let a = ObjectName::new("", "a");
        let mut seqs = Vec::new();
        for t in 1..=3 {
            let acts = pg.handle(PgEvent::ClientOp {
                token: t,
                req: write_req(t, "a"),
            });
            assert_eq!(write_tokens(&acts), vec![t], "write {t} starts at once");
            seqs.extend(submit(&mut pg, &acts));
            pg.check_invariants();
        }
        assert_eq!(pg.object_writes_in_flight(&a), 3);
        // The later writes are durable everywhere first: nothing is
        // acknowledged before the first one is.
        assert!(reply_tokens(&commit_all(&mut pg, seqs[2])).is_empty());
        assert!(reply_tokens(&commit_all(&mut pg, seqs[1])).is_empty());
        // The first one missing on one member holds them all back.
        for from in [0, 2] {
            assert!(pg
                .handle(PgEvent::Committed {
                    seq: seqs[0],
                    from,
                    interval_since: Epoch(5),
                })
                .is_empty());
        }
        let done = pg.handle(PgEvent::Committed {
            seq: seqs[0],
            from: 1,
            interval_since: Epoch(5),
        });
        assert_eq!(reply_tokens(&done), vec![1, 2, 3]);
        assert_eq!(pg.object_writes_in_flight(&a), 0);
        assert!(!pg.is_busy(&a));
        pg.check_invariants();
    }

    #[test]
    fn the_projected_state_lives_while_writes_of_the_object_are_in_flight() {
        let mut pg = active_primary();
        let a = ObjectName::new("", "a");
        let w1 = pg.handle(PgEvent::ClientOp {
            token: 1,
            req: write_req(1, "a"),
        });
        let s1 = submit(&mut pg, &w1)[0];
        assert!(
            pg.projected(&a).is_none(),
            "the first write reads the store"
        );
        let p1 = ObjectProjection {
            raw_exists: true,
            exists: true,
            size: 1,
            ..Default::default()
        };
        pg.set_projected(&a, s1, p1.clone());
        assert_eq!(pg.projected(&a), Some(&p1));
        let w2 = pg.handle(PgEvent::ClientOp {
            token: 2,
            req: write_req(2, "a"),
        });
        let s2 = submit(&mut pg, &w2)[0];
        let p2 = ObjectProjection { size: 2, ..p1 };
        pg.set_projected(&a, s2, p2.clone());
        // An older write's state never replaces a newer one's.
        pg.set_projected(&a, s1, ObjectProjection::default());
        assert_eq!(pg.projected(&a), Some(&p2));
        commit_all(&mut pg, s1);
        assert_eq!(pg.projected(&a), Some(&p2), "write 2 is still in flight");
        commit_all(&mut pg, s2);
        assert!(pg.projected(&a).is_none(), "the store shows everything now");
        // Not kept for an object without writes in flight.
        pg.set_projected(&a, s2 + 1, ObjectProjection::default());
        assert!(pg.projected(&a).is_none());
    }

    #[test]
    fn a_write_that_reads_the_object_waits_for_the_writes_in_flight() {
        let mut pg = active_primary();
        let w1 = pg.handle(PgEvent::ClientOp {
            token: 1,
            req: write_req(1, "a"),
        });
        let s1 = submit(&mut pg, &w1)[0];
        let g = pg.handle(PgEvent::ClientOp {
            token: 2,
            req: guarded_req(2, "a"),
        });
        assert!(write_tokens(&g).is_empty(), "{g:?}");
        // A blind write behind it waits too (order per object is kept).
        let w3 = pg.handle(PgEvent::ClientOp {
            token: 3,
            req: write_req(3, "a"),
        });
        assert!(write_tokens(&w3).is_empty(), "{w3:?}");
        let done = commit_all(&mut pg, s1);
        assert_eq!(reply_tokens(&done), vec![1]);
        // The guarded write starts alone, then the blind one overlaps it.
        assert_eq!(write_tokens(&done), vec![2, 3]);
        pg.check_invariants();
    }

    #[test]
    fn writes_in_flight_per_object_are_bounded() {
        let mut pg = Pg::new(
            pgid(),
            0,
            PgLimits {
                max_object_writes_in_flight: 2,
                ..Default::default()
            },
            PgInfo::default(),
            vec![],
            vec![],
        );
        pg.handle(PgEvent::Map(placement(5, &[0, 1, 2])));
        let info = pg.info.clone();
        pg.handle(PgEvent::PeeringDone {
            interval_since: Epoch(5),
            result: Ok((info, vec![])),
        });
        let mut started = Vec::new();
        let mut seqs = Vec::new();
        for t in 1..=4 {
            let acts = pg.handle(PgEvent::ClientOp {
                token: t,
                req: write_req(t, "a"),
            });
            started.extend(write_tokens(&acts));
            seqs.extend(submit(&mut pg, &acts));
        }
        assert_eq!(started, vec![1, 2]);
        let done = commit_all(&mut pg, seqs[0]);
        assert_eq!(write_tokens(&done), vec![3]);
        seqs.extend(submit(&mut pg, &done));
        pg.check_invariants();
    }

    #[test]
    fn an_interval_change_answers_every_write_in_flight_on_an_object() {
        let mut pg = active_primary();
        let mut tokens = Vec::new();
        for t in 1..=3 {
            let acts = pg.handle(PgEvent::ClientOp {
                token: t,
                req: write_req(t, "a"),
            });
            submit(&mut pg, &acts);
            tokens.push(t);
        }
        let queued = pg.handle(PgEvent::ClientOp {
            token: 4,
            req: read_req(4, "a"),
        });
        assert!(queued.is_empty());
        let acts = pg.handle(PgEvent::Map(placement(7, &[0, 1])));
        let mut answered = reply_tokens(&acts);
        answered.sort();
        assert_eq!(answered, vec![1, 2, 3, 4]);
        assert!(!pg.is_busy(&ObjectName::new("", "a")));
        assert_eq!(pg.inflight_count(), 0);
        pg.check_invariants();
    }

    #[test]
    fn erasure_coded_pgs_keep_one_write_per_object() {
        let mut pg = fresh_pg(0);
        let mut p = placement(5, &[0, 1, 2]);
        p.shards = vec![0, 1, 2];
        pg.handle(PgEvent::Map(p));
        let info = pg.info.clone();
        pg.handle(PgEvent::PeeringDone {
            interval_since: Epoch(5),
            result: Ok((info, vec![])),
        });
        assert!(pg.state.active);
        let w1 = pg.handle(PgEvent::ClientOp {
            token: 1,
            req: write_req(1, "a"),
        });
        assert_eq!(write_tokens(&w1), vec![1]);
        let w2 = pg.handle(PgEvent::ClientOp {
            token: 2,
            req: write_req(2, "a"),
        });
        assert!(write_tokens(&w2).is_empty());
    }

    /// One step of the ordering property test.
    #[derive(Debug, Clone)]
    enum Step {
        /// A client op on object `obj`: 0 blind write, 1 guarded write, 2 read.
        Op { kind: u8, obj: u8 },
        /// Member `from` commits the `pick`-th write in flight.
        Commit { pick: u8, from: u8 },
        /// The `pick`-th running read ends.
        ReadDone { pick: u8 },
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            (0u8..3, 0u8..3).prop_map(|(kind, obj)| Step::Op { kind, obj }),
            (0u8..8, 0u8..3).prop_map(|(pick, from)| Step::Commit { pick, from }),
            (0u8..4).prop_map(|pick| Step::ReadDone { pick }),
        ]
    }

    /// Checks what one batch of actions shows and records it.
    #[derive(Default)]
    struct Model {
        /// Token -> (object, is write, guarded).
        ops: BTreeMap<Token, (ObjectName, bool, bool)>,
        answered: BTreeSet<Token>,
        /// Seq -> (token, members still to commit).
        inflight: BTreeMap<u64, (Token, BTreeSet<i32>)>,
        reads: Vec<Token>,
        started_writes: BTreeSet<Token>,
        last_acked: u64,
    }

    impl Model {
        fn absorb(&mut self, pg: &mut Pg, acts: Vec<PgAction>) {
            let mut queue: VecDeque<PgAction> = acts.into();
            while let Some(a) = queue.pop_front() {
                match a {
                    PgAction::Write {
                        token,
                        req,
                        version,
                        ..
                    } => {
                        let (oid, _, guarded) = self.ops[&token].clone();
                        let n = pg.object_writes_in_flight(&oid);
                        assert!(n <= pg.limits.max_object_writes_in_flight);
                        if guarded {
                            // It reads the store: every earlier write of
                            // the object is durable everywhere (answered).
                            let alone = self
                                .ops
                                .range(..token)
                                .filter(|(_, (o, w, _))| *o == oid && *w)
                                .all(|(t, _)| self.answered.contains(t));
                            assert!(alone, "guarded write {token} overlaps an earlier one");
                        }
                        // Writes of one object start in arrival order.
                        let earlier = self
                            .ops
                            .range(..token)
                            .filter(|(_, (o, w, _))| *o == oid && *w)
                            .all(|(t, _)| self.started_writes.contains(t));
                        assert!(earlier, "write {token} overtook an earlier one");
                        self.started_writes.insert(token);
                        self.inflight
                            .insert(version.seq, (token, [0, 1, 2].into_iter().collect()));
                        queue.extend(pg.handle(PgEvent::Submitted {
                            seq: version.seq,
                            entry: LogEntry {
                                version,
                                prior_version: Version::default(),
                                reqid: Some(req.reqid.clone()),
                                oid: req.oid.clone(),
                                op: LogOp::Modify,
                            },
                            outcome: Ok(vec![]),
                        }));
                    }
                    PgAction::Read { token, req } => {
                        assert_eq!(pg.object_writes_in_flight(&req.oid), 0);
                        // Every write of the object that came before it is acknowledged.
                        let before_done = self
                            .ops
                            .range(..token)
                            .filter(|(_, (o, w, _))| *o == req.oid && *w)
                            .all(|(t, _)| self.answered.contains(t));
                        assert!(before_done, "read {token} ran before an earlier write");
                        self.reads.push(token);
                    }
                    PgAction::Reply { token, reply } => {
                        assert!(self.answered.insert(token), "{token} answered twice");
                        if self.ops[&token].1 {
                            assert!(reply.version.seq > self.last_acked, "acks out of order");
                            self.last_acked = reply.version.seq;
                        }
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
            pg.check_invariants();
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
        #[test]
        fn per_object_ordering_holds_with_overlapping_writes(
            steps in proptest::collection::vec(step(), 1..120)
        ) {
            let mut pg = Pg::new(
                pgid(),
                0,
                PgLimits {
                    max_object_writes_in_flight: 3,
                    ..Default::default()
                },
                PgInfo::default(),
                vec![],
                vec![],
            );
            pg.handle(PgEvent::Map(placement(5, &[0, 1, 2])));
            let info = pg.info.clone();
            pg.handle(PgEvent::PeeringDone {
                interval_since: Epoch(5),
                result: Ok((info, vec![])),
            });
            let mut m = Model::default();
            let mut next: Token = 1;
            for s in steps {
                match s {
                    Step::Op { kind, obj } => {
                        let name = ["a", "b", "c"][obj as usize];
                        let req = match kind {
                            0 => write_req(next, name),
                            1 => guarded_req(next, name),
                            _ => read_req(next, name),
                        };
                        m.ops.insert(next, (req.oid.clone(), kind < 2, kind == 1));
                        let acts = pg.handle(PgEvent::ClientOp { token: next, req });
                        m.absorb(&mut pg, acts);
                        next += 1;
                    }
                    Step::Commit { pick, from } => {
                        let n = m.inflight.len().max(1);
                        let Some((&seq, (_, left))) = m.inflight.iter_mut().nth(pick as usize % n)
                        else {
                            continue;
                        };
                        let from = from as i32;
                        if !left.remove(&from) {
                            continue;
                        }
                        if left.is_empty() {
                            m.inflight.remove(&seq);
                        }
                        let acts = pg.handle(PgEvent::Committed {
                            seq,
                            from,
                            interval_since: Epoch(5),
                        });
                        m.absorb(&mut pg, acts);
                    }
                    Step::ReadDone { pick } => {
                        if m.reads.is_empty() {
                            continue;
                        }
                        let token = m.reads.remove(pick as usize % m.reads.len());
                        let acts = pg.handle(PgEvent::ReadDone { token });
                        // The runtime answers the read itself.
                        m.answered.insert(token);
                        m.absorb(&mut pg, acts);
                    }
                }
            }
            // Drain: every member commits everything, every read ends.
            loop {
                if let Some(token) = m.reads.pop() {
                    m.answered.insert(token);
                    let acts = pg.handle(PgEvent::ReadDone { token });
                    m.absorb(&mut pg, acts);
                    continue;
                }
                let Some((&seq, (_, left))) = m.inflight.iter().next() else {
                    break;
                };
                let left: Vec<i32> = left.iter().copied().collect();
                m.inflight.remove(&seq);
                for from in left {
                    let acts = pg.handle(PgEvent::Committed {
                        seq,
                        from,
                        interval_since: Epoch(5),
                    });
                    m.absorb(&mut pg, acts);
                }
            }
            let all: BTreeSet<Token> = m.ops.keys().copied().collect();
            proptest::prop_assert_eq!(&m.answered, &all);
            proptest::prop_assert_eq!(pg.inflight_count(), 0);
        }
    }
}
