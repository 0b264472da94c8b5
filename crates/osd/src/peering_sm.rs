//! Activation of a replicated PG's primary as a pure state machine: it owns
//! the decisions and their order (persist our info, have the monitors
//! record `up_thru`, query the probe set, choose the authoritative log,
//! refuse to activate while an interval that may have written has no
//! member answering, pull what this OSD lacks, push to every acting member
//! what it lacks or holds divergently, adopt the log). It does no I/O:
//! [`Peering::handle`] takes a [`PeeringInput`] and returns the
//! [`PeeringOutput`]s to perform; the OSD runtime (`peering.rs`) performs
//! them with the real store and connections, the simulator with its own.
//! Every output that asks for something is answered by exactly one input
//! (a reply, or a failure/timeout); inputs that answer nothing the machine
//! waits for are ignored (late replies, duplicates).

use crate::pg::{
    check_can_activate, cursor_key, obj_key, plan_recovery, settled_osds, PastInterval,
    RecoveryPlan, PG_TEMP_WAIT,
};
use cairn_map::{activation_spans, PgActivation, PgRecoveryCounts};
use cairn_ops::{ListCursor, LogEntry, ObjectName, ObjectState, PgInfo, PgPush};
use cairn_types::{Epoch, PgId};
use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};

/// Objects per pull or push batch, at most (bytes are bounded too).
pub const RECOVERY_BATCH_OBJECTS: usize = 64;
/// Objects in a member's first local read for pushes (later reads are
/// sized from the objects' weight to about one push).
pub const RECOVERY_FIRST_READ_OBJECTS: usize = 2;
/// An object whose state is at least this big travels in a copy message
/// (push, pull reply, backfill batch) of its own. The messenger places one
/// bulk segment per message on an aligned address at the receiver, so the
/// object's data then reaches the disk with O_DIRECT as received; a second
/// big object in the same message would cost a bounce copy there.
pub const ALONE_OBJECT_BYTES: u64 = 512 << 10;

/// Whether a copy message that holds `held` objects of `bytes` bytes in
/// all (`big`: one of them is at least [`ALONE_OBJECT_BYTES`]) closes
/// before an object of `next` bytes, given its byte bound `limit`. A
/// message always takes its first object, however big.
pub fn copy_batch_full(held: usize, bytes: u64, big: bool, next: u64, limit: u64) -> bool {
    held > 0 && (bytes >= limit || big || next >= ALONE_OBJECT_BYTES)
}
/// Objects per backfill listing page.
pub const BACKFILL_LIST_PAGE: u32 = 512;
/// Recovery pushes in flight to one member at once (the next batch is
/// read while earlier ones travel and commit). The push that carries the
/// new info and log goes only once every earlier one is acknowledged, so
/// a member never adopts the log without the objects.
pub const RECOVERY_PUSH_WINDOW: usize = 4;
/// Pulls in flight from the authoritative copy at once (each reply is
/// installed while later ones travel). A member answers a pull with at
/// most [`pull_reply_bytes`] of objects; the puller asks again for the
/// names it left out.
pub const RECOVERY_PULL_WINDOW: usize = 4;

/// Bytes of objects one pull reply carries, at most (at least one object):
/// a full window of pulls holds about `batch_bytes`.
pub fn pull_reply_bytes(batch_bytes: u64) -> u64 {
    (batch_bytes / RECOVERY_PULL_WINDOW as u64).max(1)
}

/// An object with its whole state (None: it does not exist).
pub type ObjectCopy = (u32, ObjectName, Option<ObjectState>);

/// What one activation starts from.
#[derive(Debug, Clone)]
pub struct PeeringParams {
    pub pgid: PgId,
    pub whoami: i32,
    /// The map epoch activation runs in (pushes carry it).
    pub epoch: Epoch,
    /// First epoch of the interval being activated.
    pub interval_since: Epoch,
    pub acting: Vec<i32>,
    /// OSDs to query: the acting set and members of past intervals that
    /// may have written (`Pg`'s probe set).
    pub probe: Vec<i32>,
    pub past: Vec<PastInterval>,
    pub my_info: PgInfo,
    pub my_log: Vec<LogEntry>,
    /// The monitors already record `up_thru >= interval_since` for this
    /// OSD (or no monitor tracks it): no need to ask.
    pub up_thru_recorded: bool,
    /// The PG's activations the monitors recorded (`ClusterMap::pg_history`,
    /// oldest first); None when no monitor records them (an OSD run without
    /// one). Before activating, the primary has its own acting set recorded
    /// (with `up_thru`) unless it is the newest entry already; activation
    /// then needs an answer from a member of every entry since the newest
    /// activation a responder took part in, and asks them all.
    pub history: Option<Vec<PgActivation>>,
    /// Every OSD up in the map. Without recorded history, a primary whose
    /// copy never went active (it is new to the PG) knows nothing to probe,
    /// so it asks all of them: any copy found leads on to the members of
    /// its last activation.
    pub up_osds: Vec<i32>,
    /// A push batch is closed once it holds this many bytes of objects.
    pub batch_bytes: u64,
    /// The up set (CRUSH's placement); differs from `acting` while
    /// `pg_temp` holds.
    pub up: Vec<i32>,
    /// The pool's size and min_size.
    pub size: u32,
    pub min_size: u32,
    /// OSDs an admin declared lost: activation no longer waits for them.
    pub lost: Vec<i32>,
    /// The machine may ask for `pg_temp` (replicated pool, a monitor to
    /// ask) so new members backfill while complete ones serve.
    pub may_remap: bool,
}

/// How a backfill target starts once the PG is active.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackfillStart {
    pub osd: i32,
    /// Resume: the target's copy is good up to `through` once these
    /// objects (changed since its last update) are pushed again. None:
    /// start over (the target drops what it holds).
    pub resume: Option<(Option<ListCursor>, Vec<ObjectName>)>,
}

/// Where the interrupted backfill of a target whose copy has `info` and
/// `log` resumes, given the authoritative `auth_info` and `auth_log` the
/// PG activated with (`BackfillStart::resume`). None = start over: the
/// copy has no backfill mark, or the authoritative log no longer covers
/// what it missed since its last update. Otherwise its copy counts up to
/// the mark's cursor, once the objects at or before the cursor that
/// changed since its last update (or that it holds from entries the
/// authoritative log does not have) are sent again. Replicated and
/// erasure-coded PGs share it (an EC target's copy must hold the shard
/// position it is a target for).
pub fn backfill_resume_point(
    info: &PgInfo,
    log: &[LogEntry],
    auth_info: &PgInfo,
    auth_log: &[LogEntry],
) -> Option<(Option<ListCursor>, Vec<ObjectName>)> {
    let mark = info.backfill.as_ref()?;
    let complete_info = PgInfo {
        backfill: None,
        ..info.clone()
    };
    let objects = match plan_recovery(auth_info, auth_log, Some((&complete_info, log))) {
        RecoveryPlan::UpToDate => Vec::new(),
        RecoveryPlan::Log { objects } => objects,
        RecoveryPlan::Backfill => return None,
    };
    let through = mark.through.clone();
    let within = |o: &ObjectName| {
        through
            .as_ref()
            .is_some_and(|t| obj_key(o) <= cursor_key(t))
    };
    let resend = objects.into_iter().filter(within).collect();
    Some((through, resend))
}

/// Inputs: answers to the outputs the machine emitted.
#[derive(Debug, Clone)]
pub enum PeeringInput {
    /// The last `PersistInfo`, `InstallLocal` or `ReplaceLog` is durable.
    LocalCommitted,
    /// A local store operation failed.
    LocalFailed(String),
    /// The monitors recorded `up_thru` for this OSD.
    UpThruRecorded,
    /// They did not within the time allowed (or the link is gone).
    UpThruFailed(String),
    /// Answer to `Query` (info None: `from` holds no copy; it counts as
    /// having answered all the same, see [`crate::pg::settled_osds`]). An
    /// OSD the map shows down is not asked: `PeerFailed` instead.
    Notify {
        from: i32,
        info: Option<PgInfo>,
        log: Vec<LogEntry>,
    },
    /// A query, pull or push to `osd` failed or timed out.
    PeerFailed { osd: i32, why: String },
    /// Answer to `PullList`.
    Listed {
        from: i32,
        objects: Vec<(u32, ObjectName)>,
        next: Option<ListCursor>,
    },
    /// Answer to `PullObjects`.
    Pulled { from: i32, objects: Vec<ObjectCopy> },
    /// Answer to `Push`: `to` installed it (or failed to).
    PushAcked { to: i32, result: Result<(), String> },
    /// Answer to `ListLocal`: every object of the local collection.
    LocalListed(Vec<(u32, ObjectName)>),
    /// Answer to `ReadLocal`.
    LocalRead(Vec<ObjectCopy>),
}

/// Outputs: what the runtime performs for the machine.
#[derive(Debug, Clone)]
pub enum PeeringOutput {
    /// Write our info durably (our log may hold entries submitted but not
    /// yet durable: answering queries comes after a flush). → `LocalCommitted`.
    PersistInfo(PgInfo),
    /// Ask the monitors to record `up_thru >= want` for this OSD (and,
    /// with `record`, this activation in the PG's history) and wait for a
    /// map showing it. → `UpThruRecorded` / `UpThruFailed`.
    AskUpThru {
        want: Epoch,
        record: Option<PgActivation>,
    },
    /// Query `to` for its info and log. → `Notify` / `PeerFailed`.
    Query { to: i32 },
    /// A page of `from`'s object list. → `Listed` / `PeerFailed`.
    PullList {
        from: i32,
        after: Option<ListCursor>,
        limit: u32,
    },
    /// These objects' states from `from`. → `Pulled` / `PeerFailed`.
    PullObjects {
        from: i32,
        names: Vec<(u32, ObjectName)>,
    },
    /// Every object of the local collection. → `LocalListed` / `LocalFailed`.
    ListLocal,
    /// These objects' local states. → `LocalRead` / `LocalFailed`.
    ReadLocal { names: Vec<(u32, ObjectName)> },
    /// In one local transaction: replace each object's whole state, then
    /// remove `remove`. → `LocalCommitted` / `LocalFailed`.
    InstallLocal {
        objects: Vec<ObjectCopy>,
        remove: Vec<ObjectName>,
    },
    /// Send a recovery push. → `PushAcked` / `PeerFailed`.
    Push { to: i32, push: PgPush },
    /// Replace the local log and info. → `LocalCommitted` / `LocalFailed`.
    ReplaceLog { info: PgInfo, log: Vec<LogEntry> },
    /// Ask the monitors for `pg_temp` = `osds` (complete copies that serve
    /// while the up set backfills); followed by `Done(Err(PG_TEMP_WAIT…))`.
    RequestPgTemp { osds: Vec<i32> },
    /// Just before `Done(Ok)`: the up members to backfill in the
    /// background, and OSDs holding copies outside the up and acting sets
    /// (removed once the PG is clean).
    Activated {
        backfill: Vec<BackfillStart>,
        strays: Vec<i32>,
    },
    /// Activation finished: Ok = the new info and log, durable here and on
    /// every acting member; Err = why the PG cannot activate now.
    Done(Result<(PgInfo, Vec<LogEntry>), String>),
}

/// What the machine waits for.
#[derive(Debug)]
enum Wait {
    PersistInfo,
    UpThru,
    Notifies(BTreeSet<i32>),
    /// Listing the authoritative copy (backfill of this OSD).
    AuthList,
    /// Listing the local copy to remove what the authoritative one lacks.
    LocalListForRemoval,
    StaleRemoved,
    /// Pulls in flight and/or pulled objects being installed.
    Pull,
    LocalListForPush,
    Read,
    Push,
    FinalLog,
    Finished,
}

/// Pushing to one acting member.
#[derive(Debug)]
struct PushTarget {
    osd: i32,
    /// Objects still to read and push.
    names: VecDeque<(u32, ObjectName)>,
    /// End of a backfill: the member keeps only these.
    keep_only: Option<Vec<(u32, ObjectName)>>,
    /// Read batches ready to push.
    ready: VecDeque<Vec<ObjectCopy>>,
    /// Pushes sent and not yet acknowledged.
    outstanding: usize,
    /// Objects per local read (sized from the objects read so far).
    read_objects: usize,
    /// The push carrying the new info and log went out.
    final_sent: bool,
}

/// One activation run of a replicated PG's primary.
#[derive(Debug)]
pub struct Peering {
    p: PeeringParams,
    wait: Wait,
    notes: BTreeMap<i32, (PgInfo, Vec<LogEntry>)>,
    /// Every OSD that answered a query, with a copy or without one (it
    /// settles its past intervals: [`crate::pg::settled_osds`]).
    answered: BTreeSet<i32>,
    /// Every OSD queried (or this one).
    queried: BTreeSet<i32>,
    auth: Option<(i32, PgInfo, Vec<LogEntry>)>,
    new_info: Option<PgInfo>,
    /// Backfill of this OSD: the authoritative object list so far.
    auth_listing: Vec<(u32, ObjectName)>,
    /// Objects this OSD still pulls.
    pull_queue: VecDeque<(u32, ObjectName)>,
    /// Names of the pulls in flight (at most [`RECOVERY_PULL_WINDOW`]).
    pulls_out: Vec<Vec<(u32, ObjectName)>>,
    /// Pulled objects waiting for their local install.
    pulled: VecDeque<Vec<ObjectCopy>>,
    /// An `InstallLocal` of pulled objects is not committed yet.
    installing: bool,
    /// Acting members still to bring up to date.
    members: VecDeque<i32>,
    target: Option<PushTarget>,
    /// Objects this run decided to copy, by log and by backfill.
    recovered: PgRecoveryCounts,
}

impl Peering {
    pub fn new(p: PeeringParams) -> Peering {
        Peering {
            p,
            wait: Wait::PersistInfo,
            notes: BTreeMap::new(),
            answered: BTreeSet::new(),
            queried: BTreeSet::new(),
            auth: None,
            new_info: None,
            auth_listing: Vec::new(),
            pull_queue: VecDeque::new(),
            pulls_out: Vec::new(),
            pulled: VecDeque::new(),
            installing: false,
            members: VecDeque::new(),
            target: None,
            recovered: PgRecoveryCounts::default(),
        }
    }

    /// Objects this run brought (or set out to bring) up to date: one per
    /// object per member, by log and by backfill.
    pub fn recovered(&self) -> PgRecoveryCounts {
        self.recovered
    }

    /// The first outputs.
    pub fn start(&mut self) -> Vec<PeeringOutput> {
        self.wait = Wait::PersistInfo;
        vec![PeeringOutput::PersistInfo(self.p.my_info.clone())]
    }

    pub fn is_finished(&self) -> bool {
        matches!(self.wait, Wait::Finished)
    }

    /// What activation waits for now (for `pg query` and traces).
    pub fn waiting_for(&self) -> String {
        match &self.wait {
            Wait::PersistInfo => "persisting the PG info".into(),
            Wait::UpThru => format!(
                "the monitors to record up_thru {} for osd.{}",
                self.p.interval_since.0, self.p.whoami
            ),
            Wait::Notifies(s) => format!("notifies from {s:?}"),
            Wait::AuthList | Wait::Pull => "objects from the authoritative copy".into(),
            Wait::LocalListForRemoval | Wait::LocalListForPush | Wait::Read => {
                "the local store".into()
            }
            Wait::StaleRemoved | Wait::FinalLog => "a local commit".into(),
            Wait::Push => format!(
                "osd.{} to install a recovery push",
                self.target.as_ref().map(|t| t.osd).unwrap_or(-1)
            ),
            Wait::Finished => "nothing (finished)".into(),
        }
    }

    fn me(&self) -> i32 {
        self.p.whoami
    }

    fn finish(&mut self, r: Result<(PgInfo, Vec<LogEntry>), String>) -> Vec<PeeringOutput> {
        self.wait = Wait::Finished;
        vec![PeeringOutput::Done(r)]
    }

    fn fail(&mut self, why: String) -> Vec<PeeringOutput> {
        self.finish(Err(why))
    }

    pub fn handle(&mut self, input: PeeringInput) -> Vec<PeeringOutput> {
        use PeeringInput as I;
        if self.is_finished() {
            return Vec::new();
        }
        match (&self.wait, input) {
            (_, I::LocalFailed(e)) if self.waits_local() => self.fail(e),
            (Wait::PersistInfo, I::LocalCommitted) => self.after_persist(),
            (Wait::UpThru, I::UpThruRecorded) => self.on_up_thru_recorded(),
            (Wait::UpThru, I::UpThruFailed(why)) => self.fail(why),
            (Wait::Notifies(_), I::Notify { from, info, log }) => self.on_notify(from, info, log),
            (Wait::Notifies(_), I::PeerFailed { osd, why }) => self.on_query_failed(osd, why),
            (
                Wait::AuthList,
                I::Listed {
                    from,
                    objects,
                    next,
                },
            ) if self.is_auth(from) => self.on_auth_listed(objects, next),
            (Wait::LocalListForRemoval, I::LocalListed(local)) => self.remove_stale(local),
            (Wait::StaleRemoved, I::LocalCommitted) => self.pull_next(),
            (Wait::Pull, I::Pulled { from, objects }) if self.is_auth(from) => {
                self.on_pulled(objects)
            }
            (Wait::Pull, I::LocalCommitted) if self.installing => {
                self.installing = false;
                self.pull_next()
            }
            (Wait::AuthList | Wait::Pull, I::PeerFailed { osd, why }) if self.is_auth(osd) => {
                self.fail(why)
            }
            (Wait::LocalListForPush, I::LocalListed(all)) => {
                self.recovered.backfill_objects += all.len() as u64;
                if let Some(t) = self.target.as_mut() {
                    t.names = all.iter().cloned().collect();
                    t.keep_only = Some(all);
                }
                self.push_next()
            }
            (Wait::Read, I::LocalRead(objects)) => {
                self.split_batches(objects);
                self.push_next()
            }
            (_, I::PushAcked { to, result }) if self.pushes_to(to) => match result {
                Ok(()) => {
                    if let Some(t) = self.target.as_mut() {
                        t.outstanding -= 1;
                    }
                    if matches!(self.wait, Wait::Push) {
                        self.push_next()
                    } else {
                        Vec::new()
                    }
                }
                Err(e) => self.fail(format!("osd.{to} failed to install a recovery push: {e}")),
            },
            (_, I::PeerFailed { osd, why }) if self.pushes_to(osd) => self.fail(why),
            (Wait::FinalLog, I::LocalCommitted) => {
                let r = self.final_result();
                let mut out = self.activated();
                out.extend(self.finish(r));
                out
            }
            // Late, duplicate or unrelated answers.
            _ => Vec::new(),
        }
    }

    fn waits_local(&self) -> bool {
        (matches!(self.wait, Wait::Pull) && self.installing)
            || matches!(
                self.wait,
                Wait::PersistInfo
                    | Wait::LocalListForRemoval
                    | Wait::StaleRemoved
                    | Wait::LocalListForPush
                    | Wait::Read
                    | Wait::FinalLog
            )
    }

    fn is_auth(&self, osd: i32) -> bool {
        self.auth.as_ref().is_some_and(|(a, _, _)| *a == osd)
    }

    /// `osd` is the member being brought up to date, with pushes in flight.
    fn pushes_to(&self, osd: i32) -> bool {
        self.target
            .as_ref()
            .is_some_and(|t| t.osd == osd && t.outstanding > 0)
    }

    /// The entry this activation must add to the PG's recorded history
    /// (None: nothing records history, or the newest entry already names
    /// this acting set).
    fn record_needed(&self) -> Option<PgActivation> {
        let h = self.p.history.as_ref()?;
        if h.last().is_some_and(|a| a.acting == self.p.acting) {
            return None;
        }
        Some(PgActivation {
            since: self.p.interval_since,
            acting: self.p.acting.clone(),
        })
    }

    fn after_persist(&mut self) -> Vec<PeeringOutput> {
        let record = self.record_needed();
        if self.p.up_thru_recorded && record.is_none() {
            return self.query_all();
        }
        self.wait = Wait::UpThru;
        vec![PeeringOutput::AskUpThru {
            want: self.p.interval_since,
            record,
        }]
    }

    fn on_up_thru_recorded(&mut self) -> Vec<PeeringOutput> {
        if let Some(rec) = self.record_needed() {
            if let Some(h) = self.p.history.as_mut() {
                h.push(rec);
            }
        }
        self.query_all()
    }

    /// The recorded activations as past intervals that may have written
    /// (the newest runs to this activation's epoch).
    fn recorded_intervals(&self) -> Vec<PastInterval> {
        let Some(h) = self.p.history.as_ref() else {
            return Vec::new();
        };
        activation_spans(h, self.p.epoch)
            .into_iter()
            .zip(h)
            .map(|((first, last), a)| PastInterval {
                first,
                last,
                acting: a.acting.clone(),
                primary: a.acting.first().copied(),
                maybe_went_rw: true,
            })
            .collect()
    }

    fn query_all(&mut self) -> Vec<PeeringOutput> {
        let me = self.me();
        self.notes
            .insert(me, (self.p.my_info.clone(), self.p.my_log.clone()));
        let new_here = self.p.my_info.last_epoch_started == Epoch(0) && self.p.history.is_none();
        // Members of recorded activations this copy may not have seen.
        let les = self.p.my_info.last_epoch_started;
        let recorded: Vec<i32> = self
            .recorded_intervals()
            .into_iter()
            .filter(|pi| pi.last >= les)
            .flat_map(|pi| pi.acting)
            .collect();
        let ask: BTreeSet<i32> = self
            .p
            .probe
            .iter()
            .chain(recorded.iter())
            .chain(self.p.up_osds.iter().filter(|_| new_here))
            .copied()
            .filter(|&o| o != me)
            .collect();
        self.queried = ask.clone();
        self.queried.insert(me);
        for &o in &self.p.my_info.last_active_acting {
            self.queried.insert(o);
        }
        if ask.is_empty() {
            return self.choose_authority();
        }
        let out = ask.iter().map(|&to| PeeringOutput::Query { to }).collect();
        self.wait = Wait::Notifies(ask);
        out
    }

    /// Marks `osd` answered; true when every query is answered.
    fn answered(&mut self, osd: i32) -> Option<bool> {
        let Wait::Notifies(waiting) = &mut self.wait else {
            return None;
        };
        if !waiting.remove(&osd) {
            return None;
        }
        Some(waiting.is_empty())
    }

    fn on_notify(
        &mut self,
        from: i32,
        info: Option<PgInfo>,
        log: Vec<LogEntry>,
    ) -> Vec<PeeringOutput> {
        if self.answered(from).is_none() {
            return Vec::new();
        }
        self.answered.insert(from);
        let mut out = Vec::new();
        if let Some(info) = info {
            // The members of the interval this copy last saw activate may
            // hold newer writes than any copy asked so far (this primary
            // may never have seen those intervals: it is new, or it
            // restarted): ask them too.
            for &o in &info.last_active_acting {
                if self.queried.insert(o) {
                    if let Wait::Notifies(w) = &mut self.wait {
                        w.insert(o);
                    }
                    out.push(PeeringOutput::Query { to: o });
                }
            }
            self.notes.insert(from, (info, log));
        }
        if matches!(&self.wait, Wait::Notifies(w) if w.is_empty()) {
            out.extend(self.choose_authority());
        }
        out
    }

    fn on_query_failed(&mut self, osd: i32, why: String) -> Vec<PeeringOutput> {
        let Some(all) = self.answered(osd) else {
            return Vec::new();
        };
        if self.p.acting.contains(&osd) {
            return self.fail(format!("acting member osd.{osd} did not answer: {why}"));
        }
        if all {
            self.choose_authority()
        } else {
            Vec::new()
        }
    }

    /// Newest `last_epoch_started`, then newest `last_update` (ties: the
    /// highest OSD id, as the notes are ordered by id).
    fn choose_authority(&mut self) -> Vec<PeeringOutput> {
        // A copy still being backfilled lacks objects: never authoritative.
        let Some((auth_id, (auth_info, auth_log))) = self
            .notes
            .iter()
            .filter(|(_, (i, _))| i.backfill.is_none())
            .max_by_key(|(_, (i, _))| (i.last_epoch_started, i.last_update))
            .map(|(k, v)| (*k, v.clone()))
        else {
            return self.fail("no copy of the PG answered".into());
        };
        let responders: Vec<i32> = self.notes.keys().copied().collect();
        let settled = settled_osds(
            responders.iter().chain(&self.answered).copied(),
            &self.p.lost,
        );
        let les = auth_info.last_epoch_started;
        if let Err(why) = check_can_activate(&self.p.past, les, &settled)
            .and_then(|()| check_can_activate(&self.recorded_intervals(), les, &settled))
        {
            return self.fail(why);
        }
        tracing::debug!(
            "pg {} e{}: authoritative copy on osd.{auth_id} (les {}, last_update {}, tail {}); responders {responders:?}",
            self.p.pgid,
            self.p.epoch.0,
            auth_info.last_epoch_started.0,
            auth_info.last_update,
            auth_info.log_tail
        );
        self.new_info = Some(PgInfo {
            pgid: Some(self.p.pgid),
            last_epoch_started: self.p.epoch,
            same_interval_since: self.p.interval_since,
            last_active_acting: self.p.acting.clone(),
            ..auth_info.clone()
        });
        let me = self.me();
        self.members = self.p.acting.iter().copied().filter(|&m| m != me).collect();
        let plan = (auth_id != me).then(|| {
            if self.p.my_info.backfill.is_some() {
                return RecoveryPlan::Backfill;
            }
            plan_recovery(
                &auth_info,
                &auth_log,
                Some((&self.p.my_info, &self.p.my_log[..])),
            )
        });
        self.auth = Some((auth_id, auth_info, auth_log));
        if let Some(want) = self.wanted_pg_temp() {
            tracing::info!(
                "pg {}: up {:?} needs backfill; asking for pg_temp {want:?} so complete copies serve meanwhile",
                self.p.pgid,
                self.p.up
            );
            let why = format!(
                "{PG_TEMP_WAIT} {want:?} (up {:?} needs backfill)",
                self.p.up
            );
            let mut out = vec![PeeringOutput::RequestPgTemp { osds: want }];
            out.extend(self.fail(why));
            return out;
        }
        match plan {
            None | Some(RecoveryPlan::UpToDate) => self.next_member(),
            Some(RecoveryPlan::Log { objects }) => {
                tracing::debug!(
                    "pg {}: recovering osd.{me} from osd.{auth_id}: {} objects from the log",
                    self.p.pgid,
                    objects.len()
                );
                self.recovered.log_objects += objects.len() as u64;
                self.pull_queue = objects.into_iter().map(|o| (o.hash(), o)).collect();
                self.pull_next()
            }
            Some(RecoveryPlan::Backfill) => {
                tracing::debug!(
                    "pg {}: backfilling osd.{me} from osd.{auth_id}",
                    self.p.pgid
                );
                self.wait = Wait::AuthList;
                vec![PeeringOutput::PullList {
                    from: auth_id,
                    after: None,
                    limit: BACKFILL_LIST_PAGE,
                }]
            }
        }
    }

    fn auth_id(&self) -> i32 {
        self.auth.as_ref().map(|(a, _, _)| *a).unwrap_or(-1)
    }

    fn on_auth_listed(
        &mut self,
        objects: Vec<(u32, ObjectName)>,
        next: Option<ListCursor>,
    ) -> Vec<PeeringOutput> {
        self.auth_listing.extend(objects);
        if let Some(after) = next {
            return vec![PeeringOutput::PullList {
                from: self.auth_id(),
                after: Some(after),
                limit: BACKFILL_LIST_PAGE,
            }];
        }
        self.wait = Wait::LocalListForRemoval;
        vec![PeeringOutput::ListLocal]
    }

    /// Backfill of this OSD: drop what the authoritative copy lacks, then
    /// pull everything it has.
    fn remove_stale(&mut self, local: Vec<(u32, ObjectName)>) -> Vec<PeeringOutput> {
        let all = std::mem::take(&mut self.auth_listing);
        let keep: HashSet<&ObjectName> = all.iter().map(|(_, n)| n).collect();
        let remove: Vec<ObjectName> = local
            .into_iter()
            .map(|(_, n)| n)
            .filter(|n| !keep.contains(n))
            .collect();
        self.recovered.backfill_objects += all.len() as u64;
        self.pull_queue = all.into_iter().collect();
        self.wait = Wait::StaleRemoved;
        vec![PeeringOutput::InstallLocal {
            objects: Vec::new(),
            remove,
        }]
    }

    /// The next pull steps: install the oldest pulled batch unless an
    /// install is running, then fill the window of pulls in flight; once
    /// everything is pulled and installed, the next member.
    fn pull_next(&mut self) -> Vec<PeeringOutput> {
        let mut out = Vec::new();
        if !self.installing {
            if let Some(objects) = self.pulled.pop_front() {
                self.installing = true;
                out.push(PeeringOutput::InstallLocal {
                    objects,
                    remove: Vec::new(),
                });
            }
        }
        while self.pulls_out.len() < RECOVERY_PULL_WINDOW && !self.pull_queue.is_empty() {
            let n = self.pull_queue.len().min(RECOVERY_BATCH_OBJECTS);
            let names: Vec<(u32, ObjectName)> = self.pull_queue.drain(..n).collect();
            self.pulls_out.push(names.clone());
            out.push(PeeringOutput::PullObjects {
                from: self.auth_id(),
                names,
            });
        }
        if self.pulls_out.is_empty() && !self.installing && self.pulled.is_empty() {
            out.extend(self.next_member());
            return out;
        }
        self.wait = Wait::Pull;
        out
    }

    /// A pull reply: matched to its pull by the names it carries (a
    /// member answers with a prefix of the names asked, bounded in
    /// bytes); names it left out go back to the front of the queue.
    fn on_pulled(&mut self, objects: Vec<ObjectCopy>) -> Vec<PeeringOutput> {
        let got: HashSet<&ObjectName> = objects.iter().map(|(_, n, _)| n).collect();
        let Some(i) = self
            .pulls_out
            .iter()
            .position(|names| names.iter().any(|(_, n)| got.contains(n)))
        else {
            let why = if objects.is_empty() {
                format!("osd.{} answered a pull with no object", self.auth_id())
            } else {
                format!(
                    "osd.{} answered a pull with objects nobody asked for",
                    self.auth_id()
                )
            };
            return self.fail(why);
        };
        let asked = self.pulls_out.swap_remove(i);
        if let Some(extra) = objects
            .iter()
            .find(|(_, n, _)| !asked.iter().any(|(_, a)| a == n))
        {
            let why = format!(
                "osd.{} answered a pull with {} it was not asked for",
                self.auth_id(),
                extra.1
            );
            return self.fail(why);
        }
        for left in asked.into_iter().rev().filter(|(_, n)| !got.contains(n)) {
            self.pull_queue.push_front(left);
        }
        self.pulled.push_back(objects);
        self.pull_next()
    }

    /// Starts bringing the next acting member up to date (or finishes).
    fn next_member(&mut self) -> Vec<PeeringOutput> {
        let Some(m) = self.members.pop_front() else {
            self.target = None;
            let Some(info) = self.new_info.clone() else {
                return self.fail("activation lost its new info".into());
            };
            let log = self.auth.as_ref().map(|a| a.2.clone()).unwrap_or_default();
            self.wait = Wait::FinalLog;
            return vec![PeeringOutput::ReplaceLog { info, log }];
        };
        let Some((_, auth_info, auth_log)) = self.auth.as_ref() else {
            return self.fail("activation lost its authoritative copy".into());
        };
        let member = self.notes.get(&m).map(|(i, l)| (i, &l[..]));
        let plan = match member {
            Some((i, _)) if i.backfill.is_some() => RecoveryPlan::Backfill,
            _ => plan_recovery(auth_info, auth_log, member),
        };
        tracing::debug!("pg {}: bringing osd.{m} up to date: {plan:?}", self.p.pgid);
        let mut t = PushTarget {
            osd: m,
            names: VecDeque::new(),
            keep_only: None,
            ready: VecDeque::new(),
            outstanding: 0,
            read_objects: RECOVERY_FIRST_READ_OBJECTS,
            final_sent: false,
        };
        match plan {
            RecoveryPlan::UpToDate => {}
            RecoveryPlan::Log { objects } => {
                self.recovered.log_objects += objects.len() as u64;
                t.names = objects.into_iter().map(|o| (o.hash(), o)).collect();
            }
            RecoveryPlan::Backfill => {
                self.target = Some(t);
                self.wait = Wait::LocalListForPush;
                return vec![PeeringOutput::ListLocal];
            }
        }
        self.target = Some(t);
        self.push_next()
    }

    /// Splits read objects into push batches closed at `batch_bytes` /
    /// [`RECOVERY_PUSH_WINDOW`] (so a full window holds about `batch_bytes`;
    /// an object of [`ALONE_OBJECT_BYTES`] or more goes alone), and sizes
    /// the next read to about one push from what these objects weighed:
    /// reads keep pace with the pushes acknowledged instead of running a
    /// window ahead (every object read waits in memory until it is pushed).
    fn split_batches(&mut self, objects: Vec<ObjectCopy>) {
        let limit = (self.p.batch_bytes / RECOVERY_PUSH_WINDOW as u64).max(1);
        let Some(t) = self.target.as_mut() else {
            return;
        };
        let weight = |o: &ObjectCopy| o.2.as_ref().map(|s| s.bytes()).unwrap_or(0);
        let total: u64 = objects.iter().map(weight).sum();
        let avg = (total / objects.len().max(1) as u64).max(1);
        t.read_objects = (limit / avg).clamp(1, RECOVERY_BATCH_OBJECTS as u64) as usize;
        let mut batch = Vec::new();
        let (mut bytes, mut big) = (0u64, false);
        for o in objects {
            let w = weight(&o);
            if copy_batch_full(batch.len(), bytes, big, w, limit) {
                t.ready.push_back(std::mem::take(&mut batch));
                (bytes, big) = (0, false);
            }
            bytes += w;
            big |= w >= ALONE_OBJECT_BYTES;
            batch.push(o);
        }
        if !batch.is_empty() {
            t.ready.push_back(batch);
        }
    }

    /// The next steps for the current member: after its final push was
    /// acknowledged, the next member; else ready batches while the window
    /// has room, then a read of the next names; once everything is pushed
    /// and acknowledged, the final (possibly empty) push with the new info
    /// and log (the last batch rides with it when nothing else is in flight).
    fn push_next(&mut self) -> Vec<PeeringOutput> {
        let (pgid, from, epoch) = (self.p.pgid, self.me(), self.p.epoch);
        let finish = match self.final_result() {
            Ok(f) => f,
            Err(e) => return self.fail(e),
        };
        let mut out = Vec::new();
        loop {
            let Some(t) = self.target.as_mut() else {
                out.extend(self.next_member());
                return out;
            };
            if t.final_sent {
                if t.outstanding == 0 {
                    out.extend(self.next_member());
                } else {
                    self.wait = Wait::Push;
                }
                return out;
            }
            if t.outstanding >= RECOVERY_PUSH_WINDOW {
                self.wait = Wait::Push;
                return out;
            }
            let last_batch = t.names.is_empty() && t.ready.len() <= 1;
            let objects = match t.ready.pop_front() {
                // The last batch waits to carry the final info and log
                // while earlier pushes are still in flight.
                Some(batch) if !(last_batch && t.outstanding > 0) => batch,
                Some(batch) => {
                    t.ready.push_front(batch);
                    self.wait = Wait::Push;
                    return out;
                }
                None if !t.names.is_empty() => {
                    let n = t.names.len().min(t.read_objects);
                    let names: Vec<(u32, ObjectName)> = t.names.drain(..n).collect();
                    self.wait = Wait::Read;
                    out.push(PeeringOutput::ReadLocal { names });
                    return out;
                }
                None if t.outstanding > 0 => {
                    self.wait = Wait::Push;
                    return out;
                }
                None => Vec::new(),
            };
            let last = t.names.is_empty() && t.ready.is_empty() && t.outstanding == 0;
            t.final_sent = last;
            t.outstanding += 1;
            let push = PgPush {
                pgid,
                from,
                epoch,
                objects,
                keep_only: if last { t.keep_only.take() } else { None },
                finish: last.then(|| finish.clone()),
            };
            self.wait = Wait::Push;
            out.push(PeeringOutput::Push { to: t.osd, push });
        }
    }

    /// How `osd`'s copy relates to the authoritative one (a copy still
    /// being backfilled always needs backfill).
    fn plan_for(&self, osd: i32) -> RecoveryPlan {
        let Some((_, auth_info, auth_log)) = self.auth.as_ref() else {
            return RecoveryPlan::Backfill;
        };
        match self.notes.get(&osd) {
            Some((i, _)) if i.backfill.is_some() => RecoveryPlan::Backfill,
            Some((i, l)) => plan_recovery(auth_info, auth_log, Some((i, &l[..]))),
            None => plan_recovery(auth_info, auth_log, None),
        }
    }

    /// When the acting set is the up set and some up members need a
    /// backfill: the acting set to ask for instead — up members that are
    /// complete (or a log away), then other complete copies that answered
    /// — if it reaches min_size. None: activate as usual.
    fn wanted_pg_temp(&self) -> Option<Vec<i32>> {
        if !self.p.may_remap || self.p.acting != self.p.up {
            return None;
        }
        // A member with no copy is complete only when there is nothing to
        // copy (the log of a young PG names no object). Filling it inside
        // activation would keep the PG inactive (client I/O queued) for as
        // long as the copy takes, however few the objects (a young PG's
        // 8 objects of 4 MiB kept it inactive for seconds), so it is
        // backfilled behind pg_temp like a member the log does not cover:
        // the complete copies serve meanwhile, at the cost of one map epoch
        // before the PG is active. A member *with* a copy that is a log
        // away (a short restart) still recovers from the log.
        let complete = |o: i32| match self.plan_for(o) {
            RecoveryPlan::Backfill => false,
            RecoveryPlan::Log { objects } if !self.notes.contains_key(&o) => objects.is_empty(),
            _ => true,
        };
        if self.p.up.iter().all(|&o| complete(o)) {
            return None;
        }
        let mut want: Vec<i32> = self.p.up.iter().copied().filter(|&o| complete(o)).collect();
        let mut others: Vec<i32> = self
            .notes
            .keys()
            .copied()
            .filter(|o| !want.contains(o) && !self.p.up.contains(o) && complete(*o))
            .collect();
        // Prefer the members of the last active acting set, in its order.
        let last = self
            .auth
            .as_ref()
            .map(|a| a.1.last_active_acting.clone())
            .unwrap_or_default();
        others.sort_by_key(|o| (last.iter().position(|x| x == o).unwrap_or(usize::MAX), *o));
        for o in others {
            if want.len() >= self.p.size as usize {
                break;
            }
            want.push(o);
        }
        (want.len() >= self.p.min_size.max(1) as usize && want != self.p.acting).then_some(want)
    }

    /// The `Activated` output (empty when there is nothing to report).
    fn activated(&self) -> Vec<PeeringOutput> {
        let backfill: Vec<BackfillStart> = self
            .p
            .up
            .iter()
            .copied()
            .filter(|o| !self.p.acting.contains(o))
            .map(|osd| BackfillStart {
                osd,
                resume: self.resume_point(osd),
            })
            .collect();
        let strays: Vec<i32> = self
            .notes
            .keys()
            .copied()
            .filter(|o| !self.p.acting.contains(o) && !self.p.up.contains(o))
            .collect();
        if backfill.is_empty() && strays.is_empty() {
            return Vec::new();
        }
        vec![PeeringOutput::Activated { backfill, strays }]
    }

    /// Where a backfill target's earlier, interrupted backfill can resume.
    fn resume_point(&self, osd: i32) -> Option<(Option<ListCursor>, Vec<ObjectName>)> {
        let (info, log) = self.notes.get(&osd)?;
        let (_, auth_info, auth_log) = self.auth.as_ref()?;
        backfill_resume_point(info, log, auth_info, auth_log)
    }

    fn final_result(&self) -> Result<(PgInfo, Vec<LogEntry>), String> {
        match (&self.new_info, &self.auth) {
            (Some(i), Some(a)) => Ok((i.clone(), a.2.clone())),
            _ => Err("activation lost its authoritative copy".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_ops::{LogOp, Version};
    use cairn_types::PoolId;

    fn entry(epoch: u64, seq: u64, obj: &str) -> LogEntry {
        LogEntry {
            version: Version { epoch, seq },
            prior_version: Version::default(),
            reqid: None,
            oid: ObjectName::new("", obj),
            op: LogOp::Modify,
        }
    }

    fn info(les: u64, last: Version) -> PgInfo {
        PgInfo {
            last_epoch_started: Epoch(les),
            last_update: last,
            last_complete: last,
            ..Default::default()
        }
    }

    fn params(my_info: PgInfo, my_log: Vec<LogEntry>, past: Vec<PastInterval>) -> PeeringParams {
        PeeringParams {
            pgid: PgId {
                pool: PoolId(1),
                seed: 0,
            },
            whoami: 0,
            epoch: Epoch(10),
            interval_since: Epoch(10),
            acting: vec![0, 1, 2],
            probe: vec![0, 1, 2, 3],
            past,
            my_info,
            my_log,
            up_thru_recorded: false,
            history: None,
            up_osds: vec![],
            batch_bytes: 1 << 20,
            up: vec![0, 1, 2],
            size: 3,
            min_size: 2,
            lost: Vec::new(),
            may_remap: false,
        }
    }

    /// Starts a machine and answers PersistInfo and AskUpThru; returns the queries.
    fn to_queries(sm: &mut Peering) -> Vec<i32> {
        assert!(matches!(&sm.start()[..], [PeeringOutput::PersistInfo(_)]));
        let out = sm.handle(PeeringInput::LocalCommitted);
        assert!(matches!(
            &out[..],
            [PeeringOutput::AskUpThru {
                want: Epoch(10),
                record: None
            }]
        ));
        sm.handle(PeeringInput::UpThruRecorded)
            .into_iter()
            .map(|o| match o {
                PeeringOutput::Query { to } => to,
                other => panic!("expected queries, got {other:?}"),
            })
            .collect()
    }

    fn notify(from: i32, i: &PgInfo, log: &[LogEntry]) -> PeeringInput {
        PeeringInput::Notify {
            from,
            info: Some(i.clone()),
            log: log.to_vec(),
        }
    }

    #[test]
    fn up_to_date_members_get_the_final_push_and_the_pg_activates() {
        let log = vec![entry(5, 1, "a")];
        let i = info(5, Version { epoch: 5, seq: 1 });
        let mut sm = Peering::new(params(i.clone(), log.clone(), vec![]));
        assert_eq!(to_queries(&mut sm), vec![1, 2, 3]);
        assert!(sm.handle(notify(2, &i, &log)).is_empty());
        assert!(sm
            .handle(PeeringInput::Notify {
                from: 3,
                info: None,
                log: vec![]
            })
            .is_empty());
        // A late duplicate changes nothing.
        assert!(sm.handle(notify(2, &i, &log)).is_empty());
        let out = sm.handle(notify(1, &i, &log));
        let [PeeringOutput::Push { to: 1, push }] = &out[..] else {
            panic!("{out:?}")
        };
        assert!(push.objects.is_empty() && push.finish.is_some());
        let out = sm.handle(PeeringInput::PushAcked {
            to: 1,
            result: Ok(()),
        });
        assert!(matches!(&out[..], [PeeringOutput::Push { to: 2, .. }]));
        let out = sm.handle(PeeringInput::PushAcked {
            to: 2,
            result: Ok(()),
        });
        assert!(matches!(&out[..], [PeeringOutput::ReplaceLog { .. }]));
        let out = sm.handle(PeeringInput::LocalCommitted);
        let [PeeringOutput::Done(Ok((ni, nlog)))] = &out[..] else {
            panic!("{out:?}")
        };
        assert_eq!(ni.last_epoch_started, Epoch(10));
        assert_eq!(ni.same_interval_since, Epoch(10));
        assert_eq!(ni.last_active_acting, vec![0, 1, 2]);
        assert_eq!(nlog, &log);
        assert!(sm.is_finished());
    }

    #[test]
    fn a_silent_rw_interval_keeps_the_pg_down_and_names_whom_it_waits_for() {
        let past = vec![PastInterval {
            first: Epoch(7),
            last: Epoch(9),
            acting: vec![3],
            primary: Some(3),
            maybe_went_rw: true,
        }];
        let i = info(5, Version { epoch: 5, seq: 1 });
        let mut sm = Peering::new(params(i.clone(), vec![], past));
        to_queries(&mut sm);
        sm.handle(notify(1, &i, &[]));
        sm.handle(notify(2, &i, &[]));
        let out = sm.handle(PeeringInput::PeerFailed {
            osd: 3,
            why: "timed out".into(),
        });
        let [PeeringOutput::Done(Err(why))] = &out[..] else {
            panic!("{out:?}")
        };
        assert!(why.contains("waiting for osd.3"), "{why}");
    }

    #[test]
    fn a_new_primary_asks_the_members_of_the_last_activation_it_hears_of() {
        // osd.0 is new (empty); osd.1 last saw the PG activate with [1, 5];
        // osd.5 went on writing later. Activating from osd.1's copy alone
        // would roll those writes back.
        let mut p = params(PgInfo::default(), vec![], vec![]);
        p.acting = vec![0, 1];
        p.probe = vec![0, 1];
        p.up_thru_recorded = true;
        let mut sm = Peering::new(p);
        sm.start();
        let out = sm.handle(PeeringInput::LocalCommitted);
        assert!(matches!(&out[..], [PeeringOutput::Query { to: 1 }]));
        let stale = PgInfo {
            last_active_acting: vec![1, 5],
            ..info(13, Version { epoch: 13, seq: 4 })
        };
        let out = sm.handle(notify(1, &stale, &[]));
        assert!(
            matches!(&out[..], [PeeringOutput::Query { to: 5 }]),
            "{out:?}"
        );
        let newer = PgInfo {
            last_active_acting: vec![5, 6],
            ..info(17, Version { epoch: 17, seq: 9 })
        };
        let out = sm.handle(notify(5, &newer, &[entry(17, 9, "x")]));
        assert!(
            matches!(&out[..], [PeeringOutput::Query { to: 6 }]),
            "{out:?}"
        );
        let out = sm.handle(PeeringInput::PeerFailed {
            osd: 6,
            why: "down".into(),
        });
        // osd.5's copy is the authority: this OSD pulls from it.
        assert!(
            matches!(&out[..], [PeeringOutput::PullObjects { from: 5, names }] if names.len() == 1),
            "{out:?}"
        );
    }

    #[test]
    fn a_primary_new_to_the_pg_asks_every_up_osd() {
        let mut p = params(PgInfo::default(), vec![], vec![]);
        p.acting = vec![0, 1];
        p.probe = vec![0, 1];
        p.up_osds = vec![0, 1, 2, 7];
        p.up_thru_recorded = true;
        let mut sm = Peering::new(p.clone());
        sm.start();
        let asked: Vec<i32> = sm
            .handle(PeeringInput::LocalCommitted)
            .into_iter()
            .filter_map(|o| match o {
                PeeringOutput::Query { to } => Some(to),
                _ => None,
            })
            .collect();
        assert_eq!(asked, vec![1, 2, 7]);
        // A copy that has been active here asks only its probe set.
        p.my_info = info(5, Version::default());
        let mut sm = Peering::new(p);
        sm.start();
        let out = sm.handle(PeeringInput::LocalCommitted);
        assert!(
            matches!(&out[..], [PeeringOutput::Query { to: 1 }]),
            "{out:?}"
        );
    }

    #[test]
    fn an_acting_member_that_does_not_answer_fails_activation() {
        let i = info(5, Version::default());
        let mut sm = Peering::new(params(i, vec![], vec![]));
        to_queries(&mut sm);
        let out = sm.handle(PeeringInput::PeerFailed {
            osd: 2,
            why: "timed out".into(),
        });
        assert!(matches!(&out[..], [PeeringOutput::Done(Err(w))] if w.contains("osd.2")));
        assert!(sm.handle(PeeringInput::LocalCommitted).is_empty());
    }

    /// A member behind on big and small objects: each read is about one
    /// push (reads keep pace with acknowledgements), a big object goes
    /// alone in its push (aligned at the receiver), small ones share one.
    #[test]
    fn pushes_carry_one_big_object_each_and_reads_keep_pace() {
        let names = ["a", "b", "c", "d", "e"];
        let log: Vec<LogEntry> = names
            .iter()
            .enumerate()
            .map(|(i, n)| entry(5, i as u64 + 1, n))
            .collect();
        let auth = info(5, Version { epoch: 5, seq: 5 });
        let mut p = params(auth.clone(), log.clone(), vec![]);
        p.up_thru_recorded = true;
        p.probe = vec![0, 1, 2];
        p.acting = vec![0, 1];
        p.up = vec![0, 1];
        p.size = 2;
        p.min_size = 1;
        let mut sm = Peering::new(p);
        sm.start();
        assert_eq!(sm.handle(PeeringInput::LocalCommitted).len(), 2);
        assert!(sm
            .handle(PeeringInput::Notify {
                from: 2,
                info: None,
                log: vec![]
            })
            .is_empty());
        // osd.1 never held the PG: every object, from the log.
        let out = sm.handle(PeeringInput::Notify {
            from: 1,
            info: None,
            log: vec![],
        });
        let state = |len: usize| ObjectState {
            data: bytes::Bytes::from(vec![7u8; len]),
            attrs: vec![],
            omap: vec![],
            clones: vec![],
            data_crc: None,
        };
        // a and b are big, c, d and e small (the push bound is 256 KiB).
        let size = |n: &ObjectName| match n.name.as_str() {
            "a" | "b" => ALONE_OBJECT_BYTES as usize,
            _ => 1000,
        };
        let mut reads = Vec::new();
        let mut pushes: Vec<Vec<String>> = Vec::new();
        let mut todo = out;
        let mut acks = 0;
        while !sm.is_finished() {
            let mut next = Vec::new();
            for o in std::mem::take(&mut todo) {
                match o {
                    PeeringOutput::ReadLocal { names } => {
                        reads.push(names.len());
                        let read = names
                            .iter()
                            .map(|(h, n)| (*h, n.clone(), Some(state(size(n)))))
                            .collect();
                        next.extend(sm.handle(PeeringInput::LocalRead(read)));
                    }
                    PeeringOutput::Push { to: 1, push } => {
                        pushes.push(push.objects.iter().map(|o| o.1.name.clone()).collect());
                        acks += 1;
                        next.extend(sm.handle(PeeringInput::PushAcked {
                            to: 1,
                            result: Ok(()),
                        }));
                    }
                    PeeringOutput::ReplaceLog { .. } => {
                        next.extend(sm.handle(PeeringInput::LocalCommitted))
                    }
                    PeeringOutput::Done(r) => assert!(r.is_ok(), "{r:?}"),
                    other => panic!("unexpected {other:?}"),
                }
            }
            assert!(!next.is_empty() || sm.is_finished(), "stalled");
            todo = next;
        }
        // The first read takes RECOVERY_FIRST_READ_OBJECTS (a and b, big),
        // the next is sized to one push from their weight (c alone), the
        // last from c's (d and e together).
        assert_eq!(RECOVERY_FIRST_READ_OBJECTS, 2);
        assert_eq!(reads, vec![2, 1, 2]);
        let big_alone = pushes
            .iter()
            .filter(|p| p.iter().any(|n| n == "a" || n == "b"))
            .all(|p| p.len() == 1);
        assert!(big_alone, "{pushes:?}");
        let pushed: Vec<String> = pushes.concat();
        assert_eq!(pushed, names.map(String::from).to_vec());
        assert_eq!(acks, pushes.len());
    }

    #[test]
    fn a_primary_behind_pulls_then_a_divergent_member_is_repaired() {
        let auth_log = vec![entry(5, 1, "a"), entry(6, 2, "b")];
        let auth = info(6, Version { epoch: 6, seq: 2 });
        let mine = info(5, Version { epoch: 5, seq: 1 });
        // osd.2 has a divergent 5'2 on object c (never acknowledged).
        let div_log = vec![entry(5, 1, "a"), entry(5, 2, "c")];
        let div = info(5, Version { epoch: 5, seq: 2 });
        let mut p = params(mine, auth_log[..1].to_vec(), vec![]);
        p.up_thru_recorded = true;
        p.probe = vec![0, 1, 2];
        let mut sm = Peering::new(p);
        sm.start();
        let qs = sm.handle(PeeringInput::LocalCommitted);
        assert_eq!(qs.len(), 2);
        sm.handle(notify(2, &div, &div_log));
        let out = sm.handle(notify(1, &auth, &auth_log));
        let [PeeringOutput::PullObjects { from: 1, names }] = &out[..] else {
            panic!("{out:?}")
        };
        assert_eq!(names.len(), 1);
        assert_eq!(names[0].1, ObjectName::new("", "b"));
        let st = ObjectState {
            data: bytes::Bytes::from_static(b"B"),
            attrs: vec![],
            omap: vec![],
            clones: vec![],
            data_crc: None,
        };
        let got = vec![(names[0].0, names[0].1.clone(), Some(st))];
        let out = sm.handle(PeeringInput::Pulled {
            from: 1,
            objects: got,
        });
        assert!(matches!(&out[..], [PeeringOutput::InstallLocal { .. }]));
        // osd.1 is the authority itself: only its final push.
        let out = sm.handle(PeeringInput::LocalCommitted);
        assert!(
            matches!(&out[..], [PeeringOutput::Push { to: 1, push }] if push.objects.is_empty())
        );
        let out = sm.handle(PeeringInput::PushAcked {
            to: 1,
            result: Ok(()),
        });
        // osd.2: b (missing) and c (divergent) are read and pushed.
        let [PeeringOutput::ReadLocal { names }] = &out[..] else {
            panic!("{out:?}")
        };
        let objs: Vec<&str> = names.iter().map(|(_, n)| n.name.as_str()).collect();
        assert_eq!(objs, vec!["b", "c"]);
        let read = names
            .iter()
            .map(|(h, n)| (*h, n.clone(), None))
            .collect::<Vec<_>>();
        let out = sm.handle(PeeringInput::LocalRead(read));
        let [PeeringOutput::Push { to: 2, push }] = &out[..] else {
            panic!("{out:?}")
        };
        assert_eq!(push.objects.len(), 2);
        assert!(push.finish.is_some());
        // One object pulled here, two pushed to osd.2, all from the log.
        let counts = sm.recovered();
        assert_eq!((counts.log_objects, counts.backfill_objects), (3, 0));
        let out = sm.handle(PeeringInput::PushAcked {
            to: 2,
            result: Err("disk full".into()),
        });
        assert!(matches!(&out[..], [PeeringOutput::Done(Err(w))] if w.contains("disk full")));
    }

    /// A primary 300 objects behind keeps [`RECOVERY_PULL_WINDOW`] pulls in
    /// flight; replies that come back out of order and cut short (a
    /// member bounds each reply in bytes) are installed one at a time, the
    /// names left out are asked again, and every object is installed
    /// exactly once before the members' final pushes.
    #[test]
    fn pulls_are_pipelined_and_short_replies_are_asked_again() {
        let mut auth_log = vec![entry(5, 1, "a")];
        auth_log.extend((2..=301).map(|i| entry(6, i, &format!("o{i}"))));
        let auth = info(6, Version { epoch: 6, seq: 301 });
        let mine = info(5, Version { epoch: 5, seq: 1 });
        let mut p = params(mine, auth_log[..1].to_vec(), vec![]);
        p.up_thru_recorded = true;
        p.probe = vec![0, 1, 2];
        let mut sm = Peering::new(p);
        sm.start();
        sm.handle(PeeringInput::LocalCommitted);
        sm.handle(notify(2, &auth, &auth_log));
        let mut todo: VecDeque<PeeringOutput> = sm.handle(notify(1, &auth, &auth_log)).into();
        let mut pulls: Vec<(i32, Vec<(u32, ObjectName)>)> = Vec::new();
        let mut pushes: Vec<i32> = Vec::new();
        let mut installed: BTreeMap<String, usize> = BTreeMap::new();
        let (mut most_in_flight, mut done) = (0, None);
        for _ in 0..10_000 {
            if let Some(out) = todo.pop_front() {
                match out {
                    PeeringOutput::PullObjects { from, names } => pulls.push((from, names)),
                    PeeringOutput::InstallLocal { objects, .. } => {
                        for (_, n, _) in objects {
                            *installed.entry(n.name).or_default() += 1;
                        }
                        todo.extend(sm.handle(PeeringInput::LocalCommitted));
                    }
                    PeeringOutput::ReplaceLog { .. } => {
                        todo.extend(sm.handle(PeeringInput::LocalCommitted))
                    }
                    PeeringOutput::Push { to, push } => {
                        assert!(push.objects.is_empty(), "members are up to date");
                        pushes.push(to);
                    }
                    PeeringOutput::Done(r) => {
                        done = Some(r);
                        break;
                    }
                    _ => {}
                }
                continue;
            }
            most_in_flight = most_in_flight.max(pulls.len());
            if let Some((from, names)) = pulls.pop() {
                // The newest pull answers first, with at most 10 objects.
                let objects = names
                    .iter()
                    .take(10)
                    .map(|(h, n)| (*h, n.clone(), None))
                    .collect();
                todo.extend(sm.handle(PeeringInput::Pulled { from, objects }));
            } else if let Some(to) = pushes.pop() {
                todo.extend(sm.handle(PeeringInput::PushAcked { to, result: Ok(()) }));
            } else {
                break;
            }
        }
        assert!(
            matches!(done, Some(Ok(_))),
            "{done:?}: {}",
            sm.waiting_for()
        );
        assert_eq!(most_in_flight, RECOVERY_PULL_WINDOW);
        assert_eq!(installed.len(), 300);
        assert!(installed.values().all(|&n| n == 1), "{installed:?}");
    }

    #[test]
    fn a_pull_reply_with_an_object_not_asked_for_fails_activation() {
        let auth_log = vec![entry(5, 1, "a"), entry(6, 2, "b")];
        let auth = info(6, Version { epoch: 6, seq: 2 });
        let mine = info(5, Version { epoch: 5, seq: 1 });
        let mut p = params(mine, auth_log[..1].to_vec(), vec![]);
        p.up_thru_recorded = true;
        p.probe = vec![0, 1, 2];
        let mut sm = Peering::new(p);
        sm.start();
        sm.handle(PeeringInput::LocalCommitted);
        sm.handle(notify(2, &auth, &auth_log));
        let out = sm.handle(notify(1, &auth, &auth_log));
        let [PeeringOutput::PullObjects { from, names }] = &out[..] else {
            panic!("{out:?}")
        };
        let mut objects: Vec<ObjectCopy> =
            names.iter().map(|(h, n)| (*h, n.clone(), None)).collect();
        let stranger = ObjectName::new("", "zz");
        objects.push((stranger.hash(), stranger, None));
        let out = sm.handle(PeeringInput::Pulled {
            from: *from,
            objects,
        });
        assert!(
            matches!(&out[..], [PeeringOutput::Done(Err(w))] if w.contains("not asked for")),
            "{out:?}"
        );
    }

    /// A member with no copy of a young PG (the log covers its whole
    /// history): backfilled behind pg_temp as soon as the log names an
    /// object, so the PG is not inactive while it is copied; activated at
    /// once when there is nothing to copy. `objects` log entries.
    fn no_copy_member_outputs(objects: u64) -> Vec<PeeringOutput> {
        let log: Vec<LogEntry> = (1..=objects)
            .map(|s| entry(5, s, &format!("o{s}")))
            .collect();
        let i = PgInfo {
            log_tail: Version::default(),
            ..info(
                5,
                Version {
                    epoch: 5,
                    seq: objects,
                },
            )
        };
        let mut p = params(i.clone(), log.clone(), vec![]);
        p.may_remap = true;
        p.probe = vec![0, 1, 2];
        p.up_thru_recorded = true;
        let mut sm = Peering::new(p);
        sm.start();
        sm.handle(PeeringInput::LocalCommitted);
        sm.handle(notify(1, &i, &log));
        sm.handle(PeeringInput::Notify {
            from: 2,
            info: None,
            log: vec![],
        })
    }

    #[test]
    fn a_member_without_a_copy_is_backfilled_behind_pg_temp_when_the_log_names_an_object() {
        for objects in [1, 8, 64] {
            let out = no_copy_member_outputs(objects);
            assert!(
                matches!(&out[..], [PeeringOutput::RequestPgTemp { osds }, ..] if osds == &vec![0, 1]),
                "{objects} objects: {out:?}"
            );
        }
        let out = no_copy_member_outputs(0);
        assert!(
            !out.iter()
                .any(|o| matches!(o, PeeringOutput::RequestPgTemp { .. })),
            "{out:?}"
        );
    }

    fn recorded(since: u64, acting: &[i32]) -> PgActivation {
        PgActivation {
            since: Epoch(since),
            acting: acting.to_vec(),
        }
    }

    /// A primary new to the PG (empty copy), acting [0, 1], with `history`.
    fn new_primary(history: Vec<PgActivation>) -> Peering {
        let mut p = params(PgInfo::default(), vec![], vec![]);
        p.acting = vec![0, 1];
        p.up = vec![0, 1];
        p.probe = vec![0, 1];
        p.up_thru_recorded = true;
        p.history = Some(history);
        p.up_osds = vec![0, 1, 2, 3, 4, 7];
        Peering::new(p)
    }

    /// Runs to the queries, checking what the primary has recorded first.
    fn recorded_then_queries(sm: &mut Peering, expect: Option<Vec<i32>>) -> Vec<i32> {
        sm.start();
        let out = sm.handle(PeeringInput::LocalCommitted);
        let out = match expect {
            Some(acting) => {
                let [PeeringOutput::AskUpThru {
                    want: Epoch(10),
                    record: Some(r),
                }] = &out[..]
                else {
                    panic!("{out:?}")
                };
                assert_eq!(r, &recorded(10, &acting));
                sm.handle(PeeringInput::UpThruRecorded)
            }
            None => out,
        };
        out.into_iter()
            .map(|o| match o {
                PeeringOutput::Query { to } => to,
                other => panic!("expected queries, got {other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_new_primary_stays_down_while_every_member_of_a_recorded_activation_is_down() {
        // The PG went active on [3, 4] (recorded in the map); both are down
        // now and the PG moved to [0, 1], which never held it. Activating
        // empty would later roll back what [3, 4] acknowledged.
        let mut sm = new_primary(vec![recorded(5, &[3, 4])]);
        assert_eq!(
            recorded_then_queries(&mut sm, Some(vec![0, 1])),
            vec![1, 3, 4]
        );
        assert!(sm.handle(notify(1, &PgInfo::default(), &[])).is_empty());
        for o in [3, 4] {
            let out = sm.handle(PeeringInput::PeerFailed {
                osd: o,
                why: format!("osd.{o} is down in the current map"),
            });
            if o == 4 {
                let [PeeringOutput::Done(Err(why))] = &out[..] else {
                    panic!("{out:?}")
                };
                assert!(why.contains("waiting for osd.3, osd.4"), "{why}");
                assert!(why.contains("cairn osd lost 3"), "{why}");
            }
        }
    }

    #[test]
    fn a_recorded_member_that_answers_with_no_copy_settles_its_activation() {
        // `ecmove` seeds 142 and 519 (the replicated form): the map
        // recorded an activation of [3, 4] while osd.3 had just crashed; it
        // never created its copy, so that activation acknowledged nothing
        // (every acknowledged write is durable on every acting member).
        // osd.3 is up again and answers "no copy": that settles [3, 4]
        // although osd.4 stays down.
        let mut sm = new_primary(vec![recorded(5, &[3, 4])]);
        recorded_then_queries(&mut sm, Some(vec![0, 1]));
        sm.handle(notify(1, &PgInfo::default(), &[]));
        sm.handle(PeeringInput::PeerFailed {
            osd: 4,
            why: "osd.4 is down in the current map".into(),
        });
        let out = sm.handle(PeeringInput::Notify {
            from: 3,
            info: None,
            log: vec![],
        });
        assert!(
            matches!(&out[..], [PeeringOutput::Push { to: 1, .. }]),
            "{out:?}"
        );
    }

    #[test]
    fn a_recorded_member_that_answers_is_the_authority() {
        let mut sm = new_primary(vec![recorded(5, &[3, 4])]);
        recorded_then_queries(&mut sm, Some(vec![0, 1]));
        sm.handle(notify(1, &PgInfo::default(), &[]));
        sm.handle(PeeringInput::PeerFailed {
            osd: 4,
            why: "down".into(),
        });
        let held = PgInfo {
            last_active_acting: vec![3, 4],
            ..info(5, Version { epoch: 5, seq: 1 })
        };
        let out = sm.handle(notify(3, &held, &[entry(5, 1, "x")]));
        assert!(
            matches!(&out[..], [PeeringOutput::PullObjects { from: 3, names }] if names.len() == 1),
            "{out:?}"
        );
    }

    #[test]
    fn a_lost_member_settles_a_recorded_activation() {
        let mut p = params(PgInfo::default(), vec![], vec![]);
        p.acting = vec![0, 1];
        p.up = vec![0, 1];
        p.probe = vec![0, 1];
        p.up_thru_recorded = true;
        p.history = Some(vec![recorded(5, &[3])]);
        p.lost = vec![3];
        let mut sm = Peering::new(p);
        recorded_then_queries(&mut sm, Some(vec![0, 1]));
        sm.handle(PeeringInput::PeerFailed {
            osd: 3,
            why: "down".into(),
        });
        let out = sm.handle(notify(1, &PgInfo::default(), &[]));
        assert!(
            matches!(&out[..], [PeeringOutput::Push { to: 1, .. }]),
            "{out:?}"
        );
    }

    #[test]
    fn a_pg_never_recorded_asks_only_its_acting_set() {
        // No activation recorded anywhere: the PG never went active, so
        // there is nobody else to ask (no query to every up OSD).
        let mut sm = new_primary(vec![]);
        assert_eq!(recorded_then_queries(&mut sm, Some(vec![0, 1])), vec![1]);
        let out = sm.handle(notify(1, &PgInfo::default(), &[]));
        assert!(
            matches!(&out[..], [PeeringOutput::Push { to: 1, .. }]),
            "{out:?}"
        );
    }

    #[test]
    fn the_newest_recorded_acting_set_is_not_recorded_again_and_older_entries_stop_mattering() {
        // [5, 6] was followed by [0, 1], which activated in epoch 8 (this
        // copy took part): [5, 6] is not asked and does not hold the PG.
        let mut p = params(info(8, Version { epoch: 8, seq: 3 }), vec![], vec![]);
        p.acting = vec![0, 1];
        p.up = vec![0, 1];
        p.probe = vec![0, 1];
        p.up_thru_recorded = true;
        p.history = Some(vec![recorded(3, &[5, 6]), recorded(8, &[0, 1])]);
        let mut sm = Peering::new(p);
        assert_eq!(recorded_then_queries(&mut sm, None), vec![1]);
        let i = info(8, Version { epoch: 8, seq: 3 });
        let out = sm.handle(notify(1, &i, &[]));
        assert!(
            matches!(&out[..], [PeeringOutput::Push { to: 1, .. }]),
            "{out:?}"
        );
    }
}
