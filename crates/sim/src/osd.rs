//! One simulated OSD process: the real `cairn_osd::pg::Pg` per PG, the real
//! `peering_sm::Peering` for activation and the real `HeartbeatTracker`,
//! driven the way `cairn_osd`'s runtime drives them (map following, the
//! replicated write path with resends on a new connection, the member side
//! of query/pull/push, boot and re-boot when marked down), with the
//! simulated disk and network of `world.rs`. What the runtime does with the
//! real store (resolving sub-ops into mutations) is reduced to the two
//! operations the workload sends: WriteFull and Read.

use crate::disk::TxOp;
use crate::world::{osd_addr, Ep, Ev, Msg, World, MS, POOL, SEC};
use cairn_map::{ClusterMap, MonCommand};
use cairn_ops::{
    ListCursor, LogEntry, LogOp, ObjectName, ObjectState, OpError, OpReply, OpRequest, OpStatus,
    PgInfo, PgPush, PullReply, PullWhat, SubOp, SubOpOutput, Version,
};
use cairn_osd::ec_pool::EcPg;
use cairn_osd::heartbeat::{heartbeat_peers, HbAction, HeartbeatTracker};
use cairn_osd::peering_sm::{BackfillStart, Peering, PeeringInput, PeeringOutput, PeeringParams};
use cairn_osd::pg::{Pg, PgAction, PgEvent, PgLimits, Placement, Token};
use cairn_types::{Epoch, PgId, PoolId};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

/// primary -> replica: one write (the object's whole new state).
#[derive(Debug, Clone)]
pub struct RepOpMsg {
    pub pgid: PgId,
    pub from: i32,
    pub epoch: Epoch,
    pub interval_since: Epoch,
    pub entry: LogEntry,
    pub state: Option<ObjectState>,
    /// EC: this shard's mutations (its own chunk), instead of `state`.
    pub mutations: Option<Vec<cairn_ops::Mutation>>,
    /// EC: entries up to here are on every shard (their stashes can go).
    pub roll_forward_to: Version,
    pub trim_to: Version,
    /// A backfill target that has not reached this object yet: the log
    /// entry alone (the runtime's sub-op without mutations).
    pub log_only: bool,
}

/// A member's answer to a repair fetch (`Msg::FetchedObj`).
struct FetchedMsg {
    pgid: PgId,
    oid: ObjectName,
    from: i32,
    interval_since: Epoch,
    last_update: Version,
    state: Option<ObjectState>,
}

/// A peering call waiting for its answer.
#[derive(Debug, Clone)]
struct Call {
    pgid: PgId,
    run: u64,
    osd: i32,
    deadline: u64,
}

/// What to do once a transaction is durable.
#[derive(Debug, Clone)]
pub(crate) enum Waiter {
    LocalCommit {
        pgid: PgId,
        seq: u64,
        interval_since: Epoch,
    },
    RepAck {
        pgid: PgId,
        primary: i32,
        seq: u64,
        interval_since: Epoch,
    },
    /// A backfill target acknowledges batch `seq` once it is durable.
    BackfillAck {
        pgid: PgId,
        primary: i32,
        seq: u64,
        interval_since: Epoch,
    },
}

pub(crate) struct Run {
    id: u64,
    interval_since: Epoch,
    sm: Peering,
    /// Waiting for the map to show `up_thru >= .0` until local time `.1`.
    up_thru: Option<(Epoch, u64)>,
    /// And, with this, the PG's history to end with this acting set.
    recording: Option<Vec<i32>>,
    /// What activation found: backfill targets and stray copies.
    activated: Option<(Vec<BackfillStart>, Vec<i32>)>,
}

pub(crate) struct SimPg {
    pub(crate) pg: Pg,
    pub(crate) run: Option<Run>,
    /// Sub-ops not yet acknowledged: seq -> replica -> message.
    pub(crate) repops: BTreeMap<u64, BTreeMap<i32, RepOpMsg>>,
    /// Connection generation each replica was last sent to on.
    pub(crate) sent_gen: BTreeMap<i32, u64>,
    /// The background backfill of this interval (acting primary).
    pub(crate) backfill: Option<crate::backfill::SimBackfill>,
    /// OSDs holding copies outside the up and acting sets, told to delete
    /// them once the PG is clean.
    pub(crate) strays: Vec<i32>,
    /// Stray side: local time this copy last told the primary it exists.
    pub(crate) stray_told_at: Option<u64>,
    /// No backfill to run: the request to clear a pg_temp that every up
    /// member already serves in (the runtime's `clear_unneeded_pg_temp`).
    pub(crate) pg_temp_clear: cairn_osd::backfill_target::PgTempClear,
}

/// The volatile state of a running OSD (lost on a crash).
pub struct OsdProc {
    pub(crate) map: Option<Arc<ClusterMap>>,
    /// Erasure-coded PGs' activation runs, reads and calls (`ec.rs`).
    pub(crate) ec: crate::ec::EcProc,
    pub(crate) pgs: BTreeMap<PgId, SimPg>,
    hb: HeartbeatTracker,
    hb_epoch: Epoch,
    last_boot: Option<u64>,
    last_sub: u64,
    calls: BTreeMap<u64, Call>,
    next_call: u64,
    next_run: u64,
    next_token: Token,
    pending_ops: BTreeMap<Token, u32>,
    waiters: BTreeMap<u64, Vec<Waiter>>,
    /// Client ops for a newer map than ours: (client, op, local deadline).
    held_ops: Vec<(u32, OpRequest, u64)>,
    /// Sub-ops and backfill messages for a newer map than ours, in
    /// arrival order (the two share a connection, so their order holds).
    pub(crate) held_repops: Vec<Held>,
    held_queries: Vec<(Ep, Msg, u64)>,
    /// PGs holding one of this OSD's `osd_max_backfills` slots.
    pub(crate) backfill_slots: BTreeSet<PgId>,
    /// Client ops held while the map has `pause` (the runtime's bounded
    /// wait at admission), with the local time they fail at.
    paused_ops: Vec<(u32, OpRequest, u64)>,
    /// Local time of the last beacon (usage figures) to the monitor.
    last_beacon: Option<u64>,
    /// No backfill batch starts before this local time
    /// (`osd_recovery_max_bytes_per_sec`).
    pub(crate) recovery_next_send: Option<u64>,
}

/// How often an OSD sends the monitor its beacon (usage figures).
const BEACON_INTERVAL: u64 = 2 * SEC;

/// A peer message held until this OSD has the map it was sent in.
pub(crate) enum Held {
    Rep(RepOpMsg),
    Backfill(cairn_ops::PgBackfill),
}

impl OsdProc {
    /// Why `pgid` is not active+clean here in `epoch` (None: it is).
    pub fn unclean(&self, pgid: PgId, epoch: Epoch) -> Option<String> {
        let Some(m) = &self.map else {
            return Some("no map".into());
        };
        if m.epoch != epoch {
            return Some(format!("map e{} behind e{}", m.epoch.0, epoch.0));
        }
        let Some(p) = self.pgs.get(&pgid) else {
            return Some("no PG".into());
        };
        let st = &p.pg.state;
        if st.active && st.clean {
            return None;
        }
        Some(format!(
            "{st}{}",
            st.down_reason
                .as_ref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        ))
    }
}

fn pgid_of(seed: u32) -> PgId {
    PgId {
        pool: PoolId(POOL),
        seed,
    }
}

impl World {
    pub(crate) fn proc_mut(&mut self, id: i32) -> Option<&mut OsdProc> {
        self.osds.get_mut(&id).and_then(|o| o.proc_.as_mut())
    }

    pub(crate) fn local_now(&self, id: i32) -> u64 {
        self.osds
            .get(&id)
            .map(|o| o.clock.local(self.now))
            .unwrap_or(0)
    }

    fn limits(&self) -> PgLimits {
        PgLimits {
            min_log_entries: self.cfg.min_log_entries,
            max_log_entries: self.cfg.max_log_entries,
            // Trim steps of 1 (every write) to 8 entries, varied by seed
            // without another draw from its generator.
            log_trim_min_entries: 1 + self.cfg.min_log_entries % 8,
            ..Default::default()
        }
    }

    /// Starts (or restarts) osd.`id` from its durable disk.
    pub fn start_osd(&mut self, id: i32) {
        let limits = self.limits();
        let Some(o) = self.osds.get_mut(&id) else {
            return;
        };
        o.inc += 1;
        let inc = o.inc;
        let mut pgs = BTreeMap::new();
        for (pgid, c) in &o.disk.durable.colls {
            let Some(info) = c.info.clone() else {
                continue;
            };
            let pg = Pg::new(
                *pgid,
                id,
                limits.clone(),
                info,
                c.log.values().cloned().collect(),
                c.past.clone(),
            );
            pgs.insert(*pgid, new_simpg(pg));
        }
        o.proc_ = Some(OsdProc {
            map: None,
            ec: Default::default(),
            pgs,
            hb: HeartbeatTracker::new(),
            hb_epoch: Epoch(0),
            last_boot: None,
            last_sub: 0,
            calls: BTreeMap::new(),
            next_call: 0,
            next_run: 0,
            next_token: 0,
            pending_ops: BTreeMap::new(),
            waiters: BTreeMap::new(),
            held_ops: Vec::new(),
            held_repops: Vec::new(),
            held_queries: Vec::new(),
            backfill_slots: BTreeSet::new(),
            paused_ops: Vec::new(),
            last_beacon: None,
            recovery_next_send: None,
        });
        self.reset_links_of(id);
        self.send(Ep::Osd(id), Ep::Mon, Msg::MapSub { have: Epoch(0) });
        let d = self.rng.range(0, 100 * MS);
        self.after(d, Ev::OsdTick(id, inc));
        let d = self.rng.range(0, 250 * MS);
        self.after(d, Ev::HbTick(id, inc));
    }

    // ---- disk ----

    pub(crate) fn submit(&mut self, id: i32, ops: Vec<TxOp>, waiter: Option<Waiter>) {
        let now = self.now;
        let lat = self.rng.range(300, 4 * MS);
        let Some(o) = self.osds.get_mut(&id) else {
            return;
        };
        let txn = o.disk.submit(ops);
        let at = (now + lat).max(o.sync_at);
        o.sync_at = at;
        let inc = o.inc;
        if let (Some(w), Some(p)) = (waiter, o.proc_.as_mut()) {
            p.waiters.entry(txn).or_default().push(w);
        }
        self.at(at, Ev::DiskSync(id, inc, txn));
    }

    /// Makes everything submitted durable now (a store flush) and runs
    /// what waited for it.
    pub(crate) fn flush(&mut self, id: i32) {
        if let Some(o) = self.osds.get_mut(&id) {
            o.disk.sync_all();
        }
        self.run_waiters(id, u64::MAX);
    }

    pub fn disk_synced(&mut self, id: i32, txn: u64) {
        if let Some(o) = self.osds.get_mut(&id).filter(|o| o.disk.fail_next_sync) {
            // A commit failed with EIO: fail-stop. The OSD acknowledges
            // nothing of it and stops; what it had not synced is lost (the
            // runtime's `on_commit_failed` for an I/O error).
            o.disk.fail_next_sync = false;
            self.stats_failed_commit();
            self.trace(|| format!("osd.{id}: commit of transaction {txn} failed (EIO); fail-stop"));
            self.crash_osd(id);
            let d = self.rng.range(SEC, 10 * SEC);
            self.after(d, Ev::Restart(id));
            return;
        }
        if let Some(o) = self.osds.get_mut(&id) {
            o.disk.sync_through(txn);
        }
        self.run_waiters(id, txn);
    }

    fn run_waiters(&mut self, id: i32, through: u64) {
        let Some(p) = self.proc_mut(id) else {
            return;
        };
        let rest = p.waiters.split_off(&through.saturating_add(1));
        let ready = std::mem::replace(&mut p.waiters, rest);
        for w in ready.into_values().flatten() {
            match w {
                Waiter::LocalCommit {
                    pgid,
                    seq,
                    interval_since,
                } => self.pg_event(
                    id,
                    pgid,
                    PgEvent::Committed {
                        seq,
                        from: id,
                        interval_since,
                    },
                ),
                Waiter::RepAck {
                    pgid,
                    primary,
                    seq,
                    interval_since,
                } => self.send(
                    Ep::Osd(id),
                    Ep::Osd(primary),
                    Msg::RepAck {
                        pgid,
                        from: id,
                        seq,
                        interval_since,
                    },
                ),
                Waiter::BackfillAck {
                    pgid,
                    primary,
                    seq,
                    interval_since,
                } => self.send(
                    Ep::Osd(id),
                    Ep::Osd(primary),
                    Msg::BackfillAck(cairn_ops::PgBackfillAck {
                        pgid,
                        from: id,
                        interval_since,
                        seq,
                        result: Ok(()),
                    }),
                ),
            }
        }
    }

    // ---- receiving ----

    pub fn osd_recv(&mut self, id: i32, from: Ep, msg: Msg) {
        if let Msg::Notify { call, .. }
        | Msg::PullReply { call, .. }
        | Msg::PushReply { call, .. }
        | Msg::EcRollbackReply { call, .. } = &msg
        {
            if self.ec_owns(id, *call) {
                self.ec_recv(id, msg);
                return;
            }
        }
        match msg {
            Msg::EcRollback {
                call,
                pgid,
                entries,
                shard,
                ..
            } => self.ec_on_rollback(id, from, call, pgid, entries, shard),
            Msg::EcRollbackReply { .. } => {}
            Msg::Backfill(bf) => self.on_backfill(id, bf),
            Msg::BackfillAck(ack) => self.on_backfill_ack(id, ack),
            Msg::PgRemove(r) => self.on_pg_remove(id, r),
            Msg::PgStray(n) => self.on_pg_stray(id, n),
            Msg::Map(m) => self.osd_map(id, m),
            Msg::Op(req) => {
                if let Ep::Client(c) = from {
                    self.osd_client_op(id, c, req);
                }
            }
            Msg::RepOp(rep) => self.on_repop(id, rep),
            Msg::RepStale {
                pgid,
                from: r,
                interval_since,
                theirs,
            } => {
                let Some(s) = self.proc_mut(id).and_then(|p| p.pgs.get_mut(&pgid)) else {
                    return;
                };
                if interval_since != s.pg.info.same_interval_since {
                    return;
                }
                let acts = s.pg.member_interval_newer(theirs);
                if s.pg.info.same_interval_since != interval_since {
                    s.repops.clear();
                    s.sent_gen.clear();
                    s.run = None;
                }
                self.trace(|| {
                    format!(
                        "osd.{id} pg {pgid}: osd.{r} is in an interval from e{} (ours began in e{})",
                        theirs.0, interval_since.0
                    )
                });
                self.pg_actions(id, pgid, acts);
            }
            Msg::FetchObj {
                pgid,
                oid,
                from: p,
                interval_since,
            } => self.serve_fetch(id, pgid, oid, p, interval_since),
            Msg::FetchedObj {
                pgid,
                oid,
                from: m,
                interval_since,
                last_update,
                state,
            } => self.fetched(
                id,
                FetchedMsg {
                    pgid,
                    oid,
                    from: m,
                    interval_since,
                    last_update,
                    state,
                },
            ),
            Msg::RepFailed {
                pgid,
                from: r,
                seq,
                interval_since,
                error,
            } => {
                let Some(s) = self.proc_mut(id).and_then(|p| p.pgs.get_mut(&pgid)) else {
                    return;
                };
                if interval_since != s.pg.info.same_interval_since {
                    return;
                }
                let acting = s.pg.placement().is_some_and(|p| p.acting.contains(&r));
                if !acting
                    && s.backfill
                        .as_mut()
                        .is_some_and(|b| b.write_failed(r, seq, &error))
                {
                    // A backfill target, not an acting member: it leaves the
                    // PG's writes and resumes its backfill later (the
                    // runtime's `RepOpAck` error path).
                    for w in s.repops.values_mut() {
                        w.remove(&r);
                    }
                    s.repops.retain(|_, w| !w.is_empty());
                    self.backfill_step(id, pgid);
                    return;
                }
                // As the runtime's `on_commit_failed`: fail the op, re-peer.
                s.repops.clear();
                s.sent_gen.clear();
                let acts = s.pg.commit_failed(seq, r, error);
                self.trace(|| format!("osd.{id} pg {pgid}: osd.{r} refused write {seq}"));
                self.pg_actions(id, pgid, acts);
            }
            Msg::RepAck {
                pgid,
                from: r,
                seq,
                interval_since,
            } => {
                let Some(p) = self.proc_mut(id).and_then(|p| p.pgs.get_mut(&pgid)) else {
                    return;
                };
                if interval_since != p.pg.info.same_interval_since {
                    return;
                }
                if let Some(b) = p.backfill.as_mut() {
                    b.write_acked(r, seq);
                }
                if let Some(w) = p.repops.get_mut(&seq) {
                    w.remove(&r);
                    if w.is_empty() {
                        p.repops.remove(&seq);
                    }
                }
                self.pg_event(
                    id,
                    pgid,
                    PgEvent::Committed {
                        seq,
                        from: r,
                        interval_since,
                    },
                );
            }
            Msg::Query { epoch, .. } => {
                let mine = self.osd_epoch(id);
                if epoch > mine {
                    let dl = self.local_now(id) + SEC;
                    if let Some(p) = self.proc_mut(id) {
                        p.held_queries.push((from, msg, dl));
                    }
                    return;
                }
                self.answer_query(id, from, msg);
            }
            Msg::Pull {
                call,
                pgid,
                what,
                shard,
            } => {
                self.flush(id);
                // EC: a pull for another position than the one served
                // reads the copy parked there by a shard move.
                let parked = shard.filter(|s| self.ec_shard_of_copy(id, pgid) != Some(*s));
                let reply = match self.osds.get(&id).and_then(|o| {
                    o.proc_.as_ref()?.pgs.get(&pgid)?;
                    match parked {
                        Some(s) => o.disk.parked.get(&(pgid, s)),
                        None => o.disk.live.colls.get(&pgid),
                    }
                }) {
                    None => PullReply::Refused(format!("osd.{id} has no copy of pg {pgid}")),
                    Some(c) => match &what {
                        PullWhat::Objects(names)
                            if names.iter().any(|(_, n)| c.damaged.contains(n)) =>
                        {
                            PullReply::Refused(format!(
                                "osd.{id}: a requested object of pg {pgid} is damaged on this disk"
                            ))
                        }
                        _ => serve_pull(c, &what),
                    },
                };
                self.send(
                    Ep::Osd(id),
                    from,
                    Msg::PullReply {
                        call,
                        from: id,
                        reply,
                        shard,
                    },
                );
            }
            Msg::Push { call, push } => {
                let result = self.install_push(id, &push);
                self.send(
                    Ep::Osd(id),
                    from,
                    Msg::PushReply {
                        call,
                        from: id,
                        result,
                    },
                );
            }
            Msg::Notify {
                call,
                from: o,
                info,
                log,
                ..
            } => self.call_answered(id, call, PeeringInput::Notify { from: o, info, log }),
            Msg::PullReply {
                call,
                from: o,
                reply,
                ..
            } => {
                let input = match reply {
                    PullReply::Objects(objects) => PeeringInput::Pulled { from: o, objects },
                    PullReply::List { objects, next } => PeeringInput::Listed {
                        from: o,
                        objects,
                        next,
                    },
                    PullReply::Refused(e) => PeeringInput::PeerFailed {
                        osd: o,
                        why: format!("osd.{o} refused a pull: {e}"),
                    },
                };
                self.call_answered(id, call, input);
            }
            Msg::PushReply {
                call,
                from: o,
                result,
            } => self.call_answered(id, call, PeeringInput::PushAcked { to: o, result }),
            Msg::Ping { from: o } => {
                self.send(Ep::Osd(id), Ep::Osd(o), Msg::Pong { from: id });
            }
            Msg::Pong { from: o } => {
                let acts = match self.proc_mut(id) {
                    Some(p) => p.hb.on_reply(o),
                    None => return,
                };
                self.hb_actions(id, acts);
            }
            Msg::MonCmd(_) | Msg::MapSub { .. } | Msg::OpReply(_) => {}
        }
    }

    pub(crate) fn osd_epoch(&self, id: i32) -> Epoch {
        self.osds
            .get(&id)
            .and_then(|o| o.proc_.as_ref())
            .and_then(|p| p.map.as_ref())
            .map(|m| m.epoch)
            .unwrap_or_default()
    }

    fn answer_query(&mut self, id: i32, from: Ep, msg: Msg) {
        let Msg::Query { call, pgid, .. } = msg else {
            return;
        };
        // Durable state only (replicated entries are in memory before
        // they are on disk).
        self.flush(id);
        let (info, log) = match self
            .osds
            .get(&id)
            .and_then(|o| o.proc_.as_ref())
            .and_then(|p| p.pgs.get(&pgid))
        {
            Some(p) => (Some(p.pg.info.clone()), p.pg.log().cloned().collect()),
            None => (None, Vec::new()),
        };
        let shard = self.ec_shard_of_copy(id, pgid);
        let kept = match shard {
            Some(_) => self.ec_parked_copies(id, pgid),
            None => Vec::new(),
        };
        self.send(
            Ep::Osd(id),
            from,
            Msg::Notify {
                call,
                from: id,
                info,
                log,
                shard,
                kept,
            },
        );
    }

    fn install_push(&mut self, id: i32, push: &PgPush) -> Result<(), String> {
        self.ensure_pg(id, push.pgid);
        let Some(p) = self.proc_mut(id).and_then(|p| p.pgs.get_mut(&push.pgid)) else {
            return Err("no such PG".into());
        };
        p.pg.adopt_primary_interval_start(push.from, push.epoch);
        if push.epoch < p.pg.info.same_interval_since {
            return Err(format!(
                "push from osd.{} for epoch {} is older than this OSD's interval (since {})",
                push.from, push.epoch.0, p.pg.info.same_interval_since.0
            ));
        }
        let pgid = push.pgid;
        let mut ops: Vec<TxOp> = push
            .objects
            .iter()
            .map(|(_, n, st)| TxOp::Put(pgid, n.clone(), st.clone()))
            .collect();
        if let Some(keep) = &push.keep_only {
            let keep: BTreeSet<_> = keep
                .iter()
                .map(|(_, n)| n)
                .chain(push.objects.iter().map(|(_, n, _)| n))
                .collect();
            if let Some(c) = self
                .osds
                .get(&id)
                .and_then(|o| o.disk.live.colls.get(&pgid))
            {
                for n in c
                    .objects
                    .keys()
                    .filter(|n| !keep.contains(n) && !crate::ec::internal(n))
                {
                    ops.push(TxOp::Put(pgid, n.clone(), None));
                }
            }
        }
        // A push that does not fit is refused whole (the store's
        // StoreFull): the primary's activation fails and retries later.
        if let Some(o) = self.osds.get(&id) {
            let old = |n: &cairn_ops::ObjectName| {
                o.disk
                    .live
                    .colls
                    .get(&pgid)
                    .and_then(|c| c.objects.get(n))
                    .map_or(0, |st| st.data.len() as u64)
            };
            let grows: u64 = ops
                .iter()
                .map(|op| match op {
                    TxOp::Put(_, n, Some(st)) => (st.data.len() as u64).saturating_sub(old(n)),
                    _ => 0,
                })
                .sum();
            let room = o.disk.available_bytes();
            if grows > room {
                return Err(no_space(id, grows, room).to_string());
            }
        }
        if let Some((info, log)) = &push.finish {
            ops.push(TxOp::LogReplace(pgid, log.clone()));
            ops.push(TxOp::Info(pgid, info.clone()));
        }
        self.submit(id, ops, None);
        self.flush(id);
        if let Some((info, log)) = push.finish.clone() {
            if let Some(p) = self.proc_mut(id).and_then(|p| p.pgs.get_mut(&pgid)) {
                p.pg.reload(info, log);
            }
            self.ec_drop_parked(id, pgid, false);
        }
        Ok(())
    }

    /// The PG's state machine, created (empty) if this OSD has none.
    fn ensure_pg(&mut self, id: i32, pgid: PgId) {
        let limits = self.limits();
        let Some(p) = self.proc_mut(id) else {
            return;
        };
        if p.pgs.contains_key(&pgid) {
            return;
        }
        let info = PgInfo {
            pgid: Some(pgid),
            ..Default::default()
        };
        p.pgs.insert(
            pgid,
            new_simpg(Pg::new(pgid, id, limits, info.clone(), vec![], vec![])),
        );
        self.submit(id, vec![TxOp::Info(pgid, info)], None);
        self.ec_mark_shard(id, pgid);
        let map = self.proc_mut(id).and_then(|p| p.map.clone());
        if let Some(m) = map {
            self.pg_map(id, pgid, &m);
        }
    }

    // ---- maps ----

    fn osd_map(&mut self, id: i32, m: Arc<ClusterMap>) {
        let Some(p) = self.proc_mut(id) else {
            return;
        };
        if p.map.as_ref().is_some_and(|o| o.epoch >= m.epoch) {
            return;
        }
        p.map = Some(m.clone());
        if let Some(pool) = m.pools.get(&POOL) {
            for seed in 0..pool.pg_num {
                if m.pg_to_up(POOL, seed)
                    .is_ok_and(|x| x.up.contains(&id) || x.acting.contains(&id))
                {
                    self.ensure_pg(id, pgid_of(seed));
                }
            }
        }
        let pgids: Vec<PgId> = self
            .proc_mut(id)
            .map(|p| p.pgs.keys().copied().collect())
            .unwrap_or_default();
        for pgid in pgids {
            self.pg_map(id, pgid, &m);
        }
        // Heartbeat peers follow the map (nobody while marked down).
        let me_up = m.osds.get(&id).is_some_and(|o| o.up);
        let peers = if me_up {
            heartbeat_peers(&m, id)
        } else {
            BTreeMap::new()
        };
        let acts = match self.proc_mut(id) {
            Some(p) => {
                p.hb_epoch = m.epoch;
                p.hb.set_peers(&peers)
            }
            None => return,
        };
        self.hb_actions(id, acts);
        // up_thru waits.
        let up_thru = m.osds.get(&id).map(|o| o.up_thru).unwrap_or_default();
        let ready: Vec<PgId> = self
            .proc_mut(id)
            .map(|p| {
                p.pgs
                    .iter()
                    .filter(|(_, s)| {
                        s.run.as_ref().is_some_and(|r| {
                            r.up_thru.is_some_and(|(want, _)| up_thru >= want)
                                && r.recording
                                    .as_ref()
                                    .is_none_or(|a| m.pg_activation_recorded(s.pg.pgid, a))
                        })
                    })
                    .map(|(k, _)| *k)
                    .collect()
            })
            .unwrap_or_default();
        for pgid in ready {
            if let Some(r) = self
                .proc_mut(id)
                .and_then(|p| p.pgs.get_mut(&pgid))
                .and_then(|s| s.run.as_mut())
            {
                r.up_thru = None;
            }
            self.peering_input(id, pgid, None, PeeringInput::UpThruRecorded);
        }
        self.ec_on_map(id);
        // What waited for this map.
        let unpaused = !m.flags.contains(&cairn_map::OsdFlag::Pause);
        let (ops, reps, queries) = match self.proc_mut(id) {
            Some(p) => (
                if unpaused {
                    let mut ops = std::mem::take(&mut p.paused_ops);
                    ops.append(&mut p.held_ops);
                    ops
                } else {
                    std::mem::take(&mut p.held_ops)
                },
                std::mem::take(&mut p.held_repops),
                std::mem::take(&mut p.held_queries),
            ),
            None => return,
        };
        for (c, req, dl) in ops {
            if req.epoch <= m.epoch {
                self.osd_client_op(id, c, req);
            } else if let Some(p) = self.proc_mut(id) {
                p.held_ops.push((c, req, dl));
            }
        }
        for h in reps {
            match h {
                Held::Rep(rep) => self.on_repop(id, rep),
                Held::Backfill(bf) => self.on_backfill(id, bf),
            }
        }
        for (from, q, dl) in queries {
            match &q {
                Msg::Query { epoch, .. } if *epoch > m.epoch => {
                    if let Some(p) = self.proc_mut(id) {
                        p.held_queries.push((from, q, dl));
                    }
                }
                _ => self.answer_query(id, from, q),
            }
        }
    }

    /// Feeds one PG the placement of `m` (as the runtime's `on_map`).
    fn pg_map(&mut self, id: i32, pgid: PgId, m: &ClusterMap) {
        let Some(pool) = m.pools.get(&pgid.pool.0) else {
            return;
        };
        let Ok(x) = m.pg_to_up(pgid.pool.0, pgid.seed) else {
            return;
        };
        self.ec_follow_shard_move(id, pgid, m);
        let Some(s) = self.proc_mut(id).and_then(|p| p.pgs.get_mut(&pgid)) else {
            return;
        };
        let prev_primary_up_thru =
            s.pg.placement()
                .and_then(|p| p.primary)
                .and_then(|o| m.osds.get(&o))
                .map(|i| i.up_thru);
        // EC: positions kept in `shards`; `up`/`acting` list live members
        // (as the runtime's `on_map`).
        let (up, acting, shards) = match EcPg::from_map(m, pgid.pool.0, pgid.seed) {
            Ok(Some(ec)) => (ec.up_members(), ec.live_members(), ec.shards.clone()),
            _ => (x.up.clone(), x.acting.clone(), Vec::new()),
        };
        let placement = Placement {
            epoch: m.epoch,
            up,
            acting: acting.clone(),
            shards,
            primary: x.acting_primary,
            size: pool.size,
            min_size: pool.min_size,
            prev_primary_up_thru,
            acting_up_from: acting
                .iter()
                .map(|o| m.osds.get(o).map(|i| i.up_from).unwrap_or_default())
                .collect(),
            last_recorded: m.pg_activations(pgid).pop(),
        };
        let before = s.pg.info.same_interval_since;
        let acts = s.pg.handle(PgEvent::Map(placement));
        if s.pg.info.same_interval_since != before {
            s.repops.clear();
            s.sent_gen.clear();
            s.run = None;
            s.backfill = None;
            s.strays.clear();
            if let Some(p) = self.proc_mut(id) {
                p.backfill_slots.remove(&pgid);
            }
            self.ec_drop_run(id, pgid);
        }
        self.pg_actions(id, pgid, acts);
    }

    // ---- the PG machine ----

    fn pg_event(&mut self, id: i32, pgid: PgId, ev: PgEvent) {
        let Some(s) = self.proc_mut(id).and_then(|p| p.pgs.get_mut(&pgid)) else {
            return;
        };
        let acts = s.pg.handle(ev);
        self.pg_actions(id, pgid, acts);
    }

    pub(crate) fn pg_actions(&mut self, id: i32, pgid: PgId, acts: Vec<PgAction>) {
        let mut queue: VecDeque<PgAction> = acts.into();
        while let Some(a) = queue.pop_front() {
            match a {
                PgAction::Reply { token, reply } => self.op_reply(id, token, reply),
                PgAction::Read { token, req } if self.pg_is_ec(id, pgid) => {
                    self.ec_read(id, pgid, token, req);
                    for (p, t) in self.ec_take_read_done(id) {
                        let ev = PgEvent::ReadDone { token: t };
                        match self.proc_mut(id).and_then(|o| o.pgs.get_mut(&p)) {
                            Some(s) if p == pgid => queue.extend(s.pg.handle(ev)),
                            Some(_) => self.pg_event(id, p, ev),
                            None => {}
                        }
                    }
                }
                PgAction::Read { token, req } => {
                    let damaged = self
                        .osds
                        .get(&id)
                        .is_some_and(|o| o.disk.is_damaged(pgid, &req.oid));
                    let reply = if damaged {
                        self.repair_from_member(id, pgid, &req)
                    } else {
                        self.read(id, pgid, &req)
                    };
                    self.op_reply(id, token, reply);
                    // The read is done: writes to its object may start.
                    if let Some(s) = self.proc_mut(id).and_then(|p| p.pgs.get_mut(&pgid)) {
                        queue.extend(s.pg.handle(PgEvent::ReadDone { token }));
                    }
                }
                PgAction::Write {
                    req,
                    version,
                    trim_to,
                    replicas,
                    log_only,
                    ..
                } if self.pg_is_ec(id, pgid) => {
                    queue.extend(self.ec_write(id, pgid, req, version, trim_to, replicas, log_only))
                }
                PgAction::Write {
                    req,
                    version,
                    trim_to,
                    replicas,
                    log_only,
                    ..
                } => queue.extend(self.write(id, pgid, req, version, trim_to, replicas, log_only)),
                PgAction::Peer {
                    interval_since,
                    epoch,
                    acting,
                    probe,
                    past,
                } if self.pg_is_ec(id, pgid) => {
                    self.ec_start_peering(id, pgid, interval_since, epoch, acting, probe, past)
                }
                PgAction::Peer {
                    interval_since,
                    epoch,
                    acting,
                    probe,
                    past,
                } => self.start_peering(id, pgid, interval_since, epoch, acting, probe, past),
                PgAction::PersistMeta => {
                    if let Some(s) = self.proc_mut(id).and_then(|p| p.pgs.get(&pgid)) {
                        let ops = vec![
                            TxOp::Info(pgid, s.pg.info.clone()),
                            TxOp::Past(pgid, s.pg.past.clone()),
                        ];
                        self.submit(id, ops, None);
                    }
                }
            }
        }
        if self.verbose {
            if let Some(s) = self.proc_mut(id).and_then(|p| p.pgs.get(&pgid)) {
                let st = s.pg.state.to_string();
                self.trace(|| format!("osd.{id} pg {pgid}: {st}"));
            }
        }
    }

    fn op_reply(&mut self, id: i32, token: Token, reply: OpReply) {
        if let Some(c) = self.proc_mut(id).and_then(|p| p.pending_ops.remove(&token)) {
            self.send(Ep::Osd(id), Ep::Client(c), Msg::OpReply(reply));
        }
    }

    fn read(&self, id: i32, pgid: PgId, req: &OpRequest) -> OpReply {
        let st = self
            .osds
            .get(&id)
            .and_then(|o| o.disk.live.colls.get(&pgid))
            .and_then(|c| c.objects.get(&req.oid));
        let epoch = self.osd_epoch(id);
        let status = match (st, req.ops.as_slice()) {
            (None, _) => OpStatus::Done(Err(OpError::NoEnt)),
            (Some(s), [SubOp::Read { .. }]) => {
                OpStatus::Done(Ok(vec![SubOpOutput::Data(s.data.clone())]))
            }
            _ => OpStatus::Done(Err(OpError::Invalid(
                "the simulator serves only whole-object reads".into(),
            ))),
        };
        OpReply {
            reqid: req.reqid.clone(),
            status,
            version: Version::default(),
            epoch,
        }
    }

    /// A read found this primary's copy of the object damaged (checksum
    /// mismatch or read EIO). The client is told to retry; the primary asks
    /// every other acting member for its copy and rewrites its own from the
    /// first good one (`fetched`), so the retry is served from good bytes.
    fn repair_from_member(&mut self, id: i32, pgid: PgId, req: &OpRequest) -> OpReply {
        let epoch = self.osd_epoch(id);
        let (members, interval_since) = match self.proc_mut(id).and_then(|p| p.pgs.get(&pgid)) {
            Some(s) => (
                s.pg.placement()
                    .map(|p| p.acting.clone())
                    .unwrap_or_default(),
                s.pg.info.same_interval_since,
            ),
            None => (Vec::new(), Epoch(0)),
        };
        self.trace(|| {
            format!(
                "osd.{id} pg {pgid}: {} is damaged here; repairing it from {members:?}",
                req.oid
            )
        });
        for m in members.into_iter().filter(|&m| m != id) {
            self.send(
                Ep::Osd(id),
                Ep::Osd(m),
                Msg::FetchObj {
                    pgid,
                    oid: req.oid.clone(),
                    from: id,
                    interval_since,
                },
            );
        }
        OpReply {
            reqid: req.reqid.clone(),
            status: OpStatus::NotActive {
                state: format!(
                    "object {} is damaged on osd.{id}; repairing it from another member",
                    req.oid
                ),
            },
            version: Version::default(),
            epoch,
        }
    }

    /// Member side of a repair fetch: its copy, once durable, unless it is
    /// damaged too or the member is in a newer interval.
    fn serve_fetch(
        &mut self,
        id: i32,
        pgid: PgId,
        oid: ObjectName,
        to: i32,
        interval_since: Epoch,
    ) {
        self.flush(id);
        let damaged = self
            .osds
            .get(&id)
            .is_some_and(|o| o.disk.is_damaged(pgid, &oid));
        let Some(s) = self.proc_mut(id).and_then(|p| p.pgs.get_mut(&pgid)) else {
            return;
        };
        // As for a sub-op: a member that skipped epochs takes the primary's
        // interval start; one in a newer interval, or not acting under
        // that primary, does not answer.
        s.pg.adopt_primary_interval_start(to, interval_since);
        let acting_under =
            s.pg.placement()
                .is_some_and(|p| p.primary == Some(to) && p.acting.contains(&id));
        if !acting_under || interval_since < s.pg.info.same_interval_since || damaged {
            return;
        }
        let Some(o) = self.osds.get(&id) else {
            return;
        };
        let Some(s) = o.proc_.as_ref().and_then(|p| p.pgs.get(&pgid)) else {
            return;
        };
        let last_update = s.pg.info.last_update;
        let state = o
            .disk
            .live
            .colls
            .get(&pgid)
            .and_then(|c| c.objects.get(&oid))
            .cloned();
        self.send(
            Ep::Osd(id),
            Ep::Osd(to),
            Msg::FetchedObj {
                pgid,
                oid,
                from: id,
                interval_since,
                last_update,
                state,
            },
        );
    }

    /// A member's copy for a repair. Installed only if this copy is still
    /// the damaged one (a write since replaced it) and the member has every
    /// logged change of the object (its `last_update` reaches the newest
    /// entry for it; entries trimmed from the log are on every member).
    fn fetched(&mut self, id: i32, f: FetchedMsg) {
        let Some(o) = self.osds.get(&id) else {
            return;
        };
        if !o.disk.is_damaged(f.pgid, &f.oid) {
            return;
        }
        let Some(s) = o.proc_.as_ref().and_then(|p| p.pgs.get(&f.pgid)) else {
            return;
        };
        let newest =
            s.pg.log()
                .filter(|e| e.oid == f.oid)
                .map(|e| e.version)
                .max()
                .unwrap_or_default();
        if s.pg.info.same_interval_since != f.interval_since || f.last_update < newest {
            return;
        }
        let (pgid, oid, from) = (f.pgid, f.oid.clone(), f.from);
        self.trace(|| format!("osd.{id} pg {pgid}: {oid} repaired from osd.{from}"));
        self.submit(id, vec![TxOp::Put(pgid, f.oid, f.state)], None);
    }

    /// The replicated write path (the runtime's `write` for WriteFull):
    /// backfill targets in `log_only` get the log entry without the data.
    #[allow(clippy::too_many_arguments)]
    fn write(
        &mut self,
        id: i32,
        pgid: PgId,
        req: OpRequest,
        version: Version,
        trim_to: Version,
        replicas: Vec<i32>,
        log_only: Vec<i32>,
    ) -> Vec<PgAction> {
        let room = self.osds.get(&id).map(|o| o.disk.available_bytes());
        let marked_full = self.full_refusal(id, pgid, &req);
        let (state, op, outcome) = match req.ops.as_slice() {
            // A member marked full in the map: refused at once, logged
            // like any failed op (the runtime's `full_refusal`).
            [SubOp::WriteFull { .. }] if marked_full.is_some() => {
                let e = OpError::NoSpace(marked_full.unwrap_or_default());
                (None, LogOp::Error(e.clone()), Err(e))
            }
            // As the runtime's `full_for`: refused up front, logged and
            // replicated as a failed op, so every member agrees.
            [SubOp::WriteFull { data }] if room.is_some_and(|r| (data.len() as u64) > r) => {
                let e = no_space(id, data.len() as u64, room.unwrap_or(0));
                (None, LogOp::Error(e.clone()), Err(e))
            }
            [SubOp::WriteFull { data }] => (
                Some(ObjectState {
                    data: data.clone(),
                    attrs: vec![],
                    omap: vec![],
                    clones: vec![],
                    data_crc: None,
                }),
                LogOp::Modify,
                Ok(vec![SubOpOutput::None]),
            ),
            _ => {
                let e = OpError::Invalid("the simulator writes whole objects only".into());
                (None, LogOp::Error(e.clone()), Err(e))
            }
        };
        let is_err = outcome.is_err();
        let entry = LogEntry {
            version,
            prior_version: Version::default(),
            reqid: Some(req.reqid.clone()),
            oid: req.oid.clone(),
            op,
        };
        let epoch = self.osd_epoch(id);
        let Some(s) = self.proc_mut(id).and_then(|p| p.pgs.get_mut(&pgid)) else {
            return Vec::new();
        };
        let (old_front, old_tail) = (s.pg.log_front(), s.pg.info.log_tail);
        let more = s.pg.handle(PgEvent::Submitted {
            seq: version.seq,
            entry: entry.clone(),
            outcome,
        });
        let interval_since = s.pg.info.same_interval_since;
        let mut ops = Vec::new();
        if !is_err {
            ops.push(TxOp::Put(pgid, req.oid.clone(), state.clone()));
        }
        ops.push(TxOp::LogAppend(pgid, entry.clone()));
        if let Some((from, upto)) = s.pg.trimmed_since(old_front, old_tail) {
            ops.push(TxOp::LogTrim {
                pg: pgid,
                from,
                upto,
            });
        }
        ops.push(TxOp::Info(pgid, s.pg.info.clone()));
        let rep = RepOpMsg {
            pgid,
            from: id,
            epoch,
            interval_since,
            entry,
            state: if is_err { None } else { state },
            mutations: None,
            roll_forward_to: Version::default(),
            trim_to,
            log_only: false,
        };
        let per_replica: BTreeMap<i32, RepOpMsg> = replicas
            .iter()
            .map(|&r| {
                let only = log_only.contains(&r);
                let m = RepOpMsg {
                    state: if only { None } else { rep.state.clone() },
                    log_only: only,
                    ..rep.clone()
                };
                (r, m)
            })
            .collect();
        if !replicas.is_empty() {
            s.repops.insert(version.seq, per_replica.clone());
        }
        let now = self.osds.get(&id).map(|o| self.instant(&o.clock));
        if let (Some(b), Some(now)) = (
            self.proc_mut(id)
                .and_then(|p| p.pgs.get_mut(&pgid))
                .and_then(|s| s.backfill.as_mut()),
            now,
        ) {
            b.note_write(now, version.seq, &req.oid, &replicas);
        }
        self.submit(
            id,
            ops,
            Some(Waiter::LocalCommit {
                pgid,
                seq: version.seq,
                interval_since,
            }),
        );
        for (r, m) in per_replica {
            self.send_repop(id, pgid, r, version.seq, m);
        }
        more
    }

    /// Why a write adding data to `pgid` is refused because the primary's
    /// map marks a member of its acting or up set full (the map's
    /// `full_refusal`, as the runtime computes it at each map).
    pub(crate) fn full_refusal(&mut self, id: i32, pgid: PgId, req: &OpRequest) -> Option<String> {
        let why = {
            let p = self.proc_mut(id)?;
            let m = p.map.clone()?;
            let pl = p.pgs.get(&pgid)?.pg.placement()?;
            let members: Vec<i32> = pl.acting.iter().chain(&pl.up).copied().collect();
            m.full_refusal(pgid.pool.0, &members)
                .filter(|_| cairn_osd::pg::adds_data(req))?
        };
        self.stats_mark_refusal();
        Some(why)
    }

    fn send_repop(&mut self, id: i32, pgid: PgId, r: i32, seq: u64, rep: RepOpMsg) {
        let gen = self.link_gen(Ep::Osd(id), Ep::Osd(r));
        let stale = self
            .proc_mut(id)
            .and_then(|p| p.pgs.get(&pgid))
            .is_some_and(|s| s.sent_gen.get(&r) != Some(&gen));
        if stale {
            self.resend_all(id, pgid, r, seq);
        }
        self.send(Ep::Osd(id), Ep::Osd(r), Msg::RepOp(rep));
    }

    /// A new connection to `r`: resend every unacknowledged sub-op below `below`.
    fn resend_all(&mut self, id: i32, pgid: PgId, r: i32, below: u64) {
        let gen = self.link_gen(Ep::Osd(id), Ep::Osd(r));
        let Some(s) = self.proc_mut(id).and_then(|p| p.pgs.get_mut(&pgid)) else {
            return;
        };
        s.sent_gen.insert(r, gen);
        let msgs: Vec<RepOpMsg> = s
            .repops
            .range(..below)
            .filter_map(|(_, w)| w.get(&r).cloned())
            .collect();
        for m in msgs {
            self.send(Ep::Osd(id), Ep::Osd(r), Msg::RepOp(m));
        }
    }

    /// Replica side of a sub-op (the runtime's `on_repop`).
    fn on_repop(&mut self, id: i32, rep: RepOpMsg) {
        let pgid = rep.pgid;
        let room = self.osds.get(&id).map(|o| o.disk.available_bytes());
        // EC: the stash and the chunk change, from the shard's live state.
        let ec_ops = rep.mutations.is_some().then(|| self.ec_repop_ops(id, &rep));
        let Some(s) = self.proc_mut(id).and_then(|p| p.pgs.get_mut(&pgid)) else {
            return;
        };
        if rep.epoch > s.pg.epoch() {
            if let Some(p) = self.proc_mut(id) {
                if p.held_repops.len() < 1024 {
                    p.held_repops.push(Held::Rep(rep));
                }
            }
            return;
        }
        s.pg.adopt_primary_interval_start(rep.from, rep.interval_since);
        // Acting members and backfill targets (up, not acting).
        let ok_sender = s.pg.placement().is_some_and(|p| {
            p.primary == Some(rep.from) && (p.acting.contains(&id) || p.up.contains(&id))
        });
        if !ok_sender || rep.interval_since < s.pg.info.same_interval_since {
            let ours = s.pg.info.same_interval_since.0;
            self.trace(|| {
                format!(
                    "osd.{id} pg {pgid}: ignoring {} from osd.{} (interval {} vs ours {ours})",
                    rep.entry.version, rep.from, rep.interval_since.0
                )
            });
            if ok_sender {
                self.send(
                    Ep::Osd(id),
                    Ep::Osd(rep.from),
                    Msg::RepStale {
                        pgid,
                        from: id,
                        interval_since: rep.interval_since,
                        theirs: Epoch(ours),
                    },
                );
            }
            return;
        }
        if rep.interval_since > s.pg.info.same_interval_since {
            s.pg.info.same_interval_since = rep.interval_since;
        }
        let mut ops = Vec::new();
        if rep.entry.version > s.pg.info.last_update {
            // No room: refuse before touching the in-memory log, so this
            // replica stays exactly at its durable state (the runtime's
            // `on_repop`).
            let needed = rep.state.as_ref().map(|st| st.data.len() as u64);
            if let (Some(n), Some(r)) = (needed, room) {
                if n > r {
                    let error = no_space(id, n, r);
                    let from = rep.from;
                    self.send(
                        Ep::Osd(id),
                        Ep::Osd(from),
                        Msg::RepFailed {
                            pgid,
                            from: id,
                            seq: rep.entry.version.seq,
                            interval_since: rep.interval_since,
                            error,
                        },
                    );
                    return;
                }
            }
            let (old_front, old_tail) = (s.pg.log_front(), s.pg.info.log_tail);
            if !s.pg.apply_replicated(&rep.entry, rep.trim_to) {
                let last = s.pg.info.last_update;
                self.trace(|| {
                    format!(
                        "osd.{id} pg {pgid}: gap: got {} from osd.{} but last_update is {last}",
                        rep.entry.version, rep.from
                    )
                });
                return;
            }
            if let Some(e) = ec_ops {
                ops.extend(e);
            } else if !matches!(rep.entry.op, LogOp::Error(_)) && !rep.log_only {
                ops.push(TxOp::Put(pgid, rep.entry.oid.clone(), rep.state.clone()));
            }
            ops.push(TxOp::LogAppend(pgid, rep.entry.clone()));
            if let Some((from, upto)) = s.pg.trimmed_since(old_front, old_tail) {
                ops.push(TxOp::LogTrim {
                    pg: pgid,
                    from,
                    upto,
                });
            }
        }
        ops.push(TxOp::Info(pgid, s.pg.info.clone()));
        self.submit(
            id,
            ops,
            Some(Waiter::RepAck {
                pgid,
                primary: rep.from,
                seq: rep.entry.version.seq,
                interval_since: rep.interval_since,
            }),
        );
    }

    fn osd_client_op(&mut self, id: i32, c: u32, req: OpRequest) {
        let epoch = self.osd_epoch(id);
        let answer = |status: OpStatus| OpReply {
            reqid: req.reqid.clone(),
            status,
            version: Version::default(),
            epoch,
        };
        if req.epoch > epoch {
            let dl = self.local_now(id) + SEC;
            let have = epoch;
            if let Some(p) = self.proc_mut(id) {
                p.held_ops.push((c, req, dl));
            }
            self.send(Ep::Osd(id), Ep::Mon, Msg::MapSub { have });
            return;
        }
        let paused = self
            .proc_mut(id)
            .and_then(|p| p.map.as_ref())
            .is_some_and(|m| m.flags.contains(&cairn_map::OsdFlag::Pause));
        if paused {
            // `pause`: the op waits for the flag to go, at most
            // `osd_client_op_pause_wait` (the runtime's admission).
            let wait = self
                .proc_mut(id)
                .and_then(|p| p.map.as_ref())
                .and_then(|m| m.config_value(&format!("osd.{id}"), "osd_client_op_pause_wait"))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(30);
            let dl = self.local_now(id) + wait * SEC;
            if let Some(p) = self.proc_mut(id) {
                p.paused_ops.push((c, req, dl));
            }
            self.stats_paused_op();
            return;
        }
        let Some(p) = self.proc_mut(id) else {
            return;
        };
        if !p.pgs.contains_key(&req.pgid) {
            let r = answer(OpStatus::NotPrimary { osd_epoch: epoch });
            self.send(Ep::Osd(id), Ep::Client(c), Msg::OpReply(r));
            return;
        }
        p.next_token += 1;
        let token = p.next_token;
        p.pending_ops.insert(token, c);
        let pgid = req.pgid;
        self.pg_event(id, pgid, PgEvent::ClientOp { token, req });
    }

    // ---- peering ----

    #[allow(clippy::too_many_arguments)]
    fn start_peering(
        &mut self,
        id: i32,
        pgid: PgId,
        interval_since: Epoch,
        epoch: Epoch,
        acting: Vec<i32>,
        probe: Vec<i32>,
        past: Vec<cairn_osd::pg::PastInterval>,
    ) {
        let Some(p) = self.proc_mut(id) else {
            return;
        };
        let up_thru_recorded = p
            .map
            .as_ref()
            .and_then(|m| m.osds.get(&id))
            .is_some_and(|o| o.up_thru >= interval_since);
        let history = p.map.as_ref().map(|m| m.pg_activations(pgid));
        let up_osds: Vec<i32> = p
            .map
            .as_ref()
            .map(|m| m.osds.values().filter(|o| o.up).map(|o| o.id).collect())
            .unwrap_or_default();
        p.next_run += 1;
        let run_id = p.next_run;
        let Some(s) = p.pgs.get_mut(&pgid) else {
            return;
        };
        let mut sm = Peering::new(PeeringParams {
            pgid,
            whoami: id,
            epoch,
            interval_since,
            acting: acting.clone(),
            probe: probe.clone(),
            past: past.clone(),
            my_info: s.pg.info.clone(),
            my_log: s.pg.log().cloned().collect(),
            up_thru_recorded,
            history,
            up_osds,
            batch_bytes: 1 << 20,
            // As the runtime with a monitor: members of the up set that
            // need a backfill get one in the background while pg_temp
            // keeps complete copies serving.
            up: s
                .pg
                .placement()
                .map(|p| p.up.clone())
                .unwrap_or_else(|| acting.clone()),
            size: s.pg.placement().map(|p| p.size).unwrap_or(0),
            min_size: s.pg.placement().map(|p| p.min_size).unwrap_or(0),
            lost: Vec::new(),
            may_remap: true,
        });
        let outs = sm.start();
        s.run = Some(Run {
            id: run_id,
            interval_since,
            sm,
            up_thru: None,
            recording: None,
            activated: None,
        });
        self.trace(|| {
            format!(
                "osd.{id} pg {pgid}: peering run {run_id} for interval {} acting {acting:?} probe {probe:?} past {past:?}",
                interval_since.0
            )
        });
        self.peering_outputs(id, pgid, run_id, outs);
    }

    /// Feeds `input` to the PG's current run (`run`: only if it is that one).
    fn peering_input(&mut self, id: i32, pgid: PgId, run: Option<u64>, input: PeeringInput) {
        let Some(r) = self
            .proc_mut(id)
            .and_then(|p| p.pgs.get_mut(&pgid))
            .and_then(|s| s.run.as_mut())
        else {
            return;
        };
        if run.is_some_and(|x| x != r.id) {
            return;
        }
        let run_id = r.id;
        let outs = r.sm.handle(input);
        self.peering_outputs(id, pgid, run_id, outs);
    }

    fn peering_outputs(&mut self, id: i32, pgid: PgId, run: u64, outs: Vec<PeeringOutput>) {
        let mut todo: VecDeque<PeeringOutput> = outs.into();
        while let Some(out) = todo.pop_front() {
            let input = match out {
                PeeringOutput::RequestPgTemp { osds } => {
                    self.trace(|| format!("osd.{id} pg {pgid}: asks for pg_temp {osds:?}"));
                    self.stats_pg_temp_request();
                    self.send_pg_temp(id, pgid, osds);
                    None
                }
                PeeringOutput::Activated { backfill, strays } => {
                    if let Some(r) = self
                        .proc_mut(id)
                        .and_then(|p| p.pgs.get_mut(&pgid))
                        .and_then(|s| s.run.as_mut())
                    {
                        r.activated = Some((backfill, strays));
                    }
                    None
                }
                PeeringOutput::Done(result) => {
                    let Some(s) = self.proc_mut(id).and_then(|p| p.pgs.get_mut(&pgid)) else {
                        return;
                    };
                    let Some(r) = s.run.take() else {
                        return;
                    };
                    match &result {
                        Err(e) => self.trace(|| format!("osd.{id} pg {pgid}: not activating: {e}")),
                        Ok((info, log)) => self.trace(|| {
                            format!(
                                "osd.{id} pg {pgid}: activated at {} (tail {}, {} entries, les {})",
                                info.last_update,
                                info.log_tail,
                                log.len(),
                                info.last_epoch_started.0
                            )
                        }),
                    }
                    // As the runtime: backfill starts before the first op
                    // is admitted (its start messages precede every sub-op).
                    let current = self
                        .pg_mut(id, pgid)
                        .is_some_and(|s| r.interval_since == s.pg.info.same_interval_since);
                    if let (Ok((info, log)), Some((targets, strays)), true) =
                        (&result, r.activated.clone(), current)
                    {
                        if let Some(s) = self.pg_mut(id, pgid) {
                            s.strays = strays;
                        }
                        if !targets.is_empty() {
                            self.backfill_start(id, pgid, r.interval_since, targets, info, log);
                        }
                    }
                    self.pg_event(
                        id,
                        pgid,
                        PgEvent::PeeringDone {
                            interval_since: r.interval_since,
                            result,
                        },
                    );
                    self.after_activation(id, pgid);
                    return;
                }
                PeeringOutput::PersistInfo(info) => {
                    self.submit(id, vec![TxOp::Info(pgid, info)], None);
                    self.flush(id);
                    Some(PeeringInput::LocalCommitted)
                }
                PeeringOutput::InstallLocal { objects, remove } => {
                    let ops = objects
                        .into_iter()
                        .map(|(_, n, st)| TxOp::Put(pgid, n, st))
                        .chain(remove.into_iter().map(|n| TxOp::Put(pgid, n, None)))
                        .collect();
                    self.submit(id, ops, None);
                    self.flush(id);
                    Some(PeeringInput::LocalCommitted)
                }
                PeeringOutput::ReplaceLog { info, log } => {
                    self.submit(
                        id,
                        vec![TxOp::LogReplace(pgid, log), TxOp::Info(pgid, info)],
                        None,
                    );
                    self.flush(id);
                    Some(PeeringInput::LocalCommitted)
                }
                PeeringOutput::ListLocal => {
                    let all = self
                        .osds
                        .get(&id)
                        .and_then(|o| o.disk.live.colls.get(&pgid))
                        .map(|c| c.objects.keys().map(|n| (n.hash(), n.clone())).collect())
                        .unwrap_or_default();
                    Some(PeeringInput::LocalListed(all))
                }
                PeeringOutput::ReadLocal { names } => {
                    let coll = self
                        .osds
                        .get(&id)
                        .and_then(|o| o.disk.live.colls.get(&pgid));
                    let objs = names
                        .into_iter()
                        .map(|(h, n)| {
                            let st = coll.and_then(|c| c.objects.get(&n)).cloned();
                            (h, n, st)
                        })
                        .collect();
                    Some(PeeringInput::LocalRead(objs))
                }
                PeeringOutput::AskUpThru { want, record } => {
                    let dl = self.local_now(id) + self.cfg.peer_timeout;
                    if let Some(r) = self
                        .proc_mut(id)
                        .and_then(|p| p.pgs.get_mut(&pgid))
                        .and_then(|s| s.run.as_mut())
                    {
                        r.up_thru = Some((want, dl));
                        r.recording = record.as_ref().map(|a| a.acting.clone());
                    }
                    let activating = record.into_iter().map(|a| (pgid, a)).collect();
                    self.send(
                        Ep::Osd(id),
                        Ep::Mon,
                        Msg::MonCmd(MonCommand::OsdAlive {
                            id,
                            want,
                            activating,
                        }),
                    );
                    None
                }
                PeeringOutput::Query { to } => {
                    let up = self
                        .proc_mut(id)
                        .and_then(|p| p.map.as_ref())
                        .and_then(|m| m.osds.get(&to))
                        .is_some_and(|o| o.up);
                    if !up {
                        // Not asked: settles nothing (`pg::settled_osds`).
                        Some(PeeringInput::PeerFailed {
                            osd: to,
                            why: format!("osd.{to} is down in the current map"),
                        })
                    } else {
                        let epoch = self.osd_epoch(id);
                        self.call(id, pgid, run, to, |call| Msg::Query {
                            call,
                            pgid,
                            from: id,
                            epoch,
                        });
                        None
                    }
                }
                PeeringOutput::PullList { from, after, limit } => {
                    self.call(id, pgid, run, from, |call| Msg::Pull {
                        call,
                        pgid,
                        what: PullWhat::List { after, limit },
                        shard: None,
                    });
                    None
                }
                PeeringOutput::PullObjects { from, names } => {
                    self.call(id, pgid, run, from, |call| Msg::Pull {
                        call,
                        pgid,
                        what: PullWhat::Objects(names),
                        shard: None,
                    });
                    None
                }
                PeeringOutput::Push { to, push } => {
                    self.call(id, pgid, run, to, |call| Msg::Push { call, push });
                    None
                }
            };
            if let Some(input) = input {
                let Some(r) = self
                    .proc_mut(id)
                    .and_then(|p| p.pgs.get_mut(&pgid))
                    .and_then(|s| s.run.as_mut())
                    .filter(|r| r.id == run)
                else {
                    return;
                };
                todo.extend(r.sm.handle(input));
            }
        }
    }

    fn call(&mut self, id: i32, pgid: PgId, run: u64, osd: i32, msg: impl FnOnce(u64) -> Msg) {
        let deadline = self.local_now(id) + self.cfg.peer_timeout;
        let Some(p) = self.proc_mut(id) else {
            return;
        };
        p.next_call += 1;
        let call = p.next_call;
        p.calls.insert(
            call,
            Call {
                pgid,
                run,
                osd,
                deadline,
            },
        );
        let m = msg(call);
        self.send(Ep::Osd(id), Ep::Osd(osd), m);
    }

    fn call_answered(&mut self, id: i32, call: u64, input: PeeringInput) {
        let Some(c) = self.proc_mut(id).and_then(|p| p.calls.remove(&call)) else {
            return;
        };
        self.peering_input(id, c.pgid, Some(c.run), input);
    }

    // ---- timers ----

    pub fn osd_tick(&mut self, id: i32) {
        self.ec_tick(id);
        let local = self.local_now(id);
        // Boot, or boot again after being marked down.
        let my_addr = osd_addr(id, self.osds.get(&id).map(|o| o.inc).unwrap_or(0));
        let addr_ok = self
            .proc_mut(id)
            .and_then(|p| p.map.as_ref())
            .and_then(|m| m.osds.get(&id))
            .is_some_and(|o| o.up && o.addrs.first() == Some(&my_addr));
        if !addr_ok {
            let due = self
                .proc_mut(id)
                .is_some_and(|p| p.last_boot.is_none_or(|t| local >= t + 2 * SEC));
            if due {
                if let Some(p) = self.proc_mut(id) {
                    p.last_boot = Some(local);
                }
                if let Some(cmd) = self.boot_cmd(id) {
                    self.send(Ep::Osd(id), Ep::Mon, Msg::MonCmd(cmd));
                }
            }
        }
        // Follow the map even if a broadcast was lost.
        let have = self.osd_epoch(id);
        let sub_due = self.proc_mut(id).is_some_and(|p| local >= p.last_sub + SEC);
        if sub_due {
            if let Some(p) = self.proc_mut(id) {
                p.last_sub = local;
            }
            self.send(Ep::Osd(id), Ep::Mon, Msg::MapSub { have });
        }
        if self.cfg.ops.is_some() {
            self.beacon(id, local);
        }
        // Ops held by `pause` past their wait fail, saying why.
        let paused_out: Vec<(u32, OpRequest)> = match self.proc_mut(id) {
            Some(p) => {
                let (gone, keep): (Vec<_>, Vec<_>) =
                    p.paused_ops.drain(..).partition(|(_, _, dl)| local >= *dl);
                p.paused_ops = keep;
                gone.into_iter().map(|(c, r, _)| (c, r)).collect()
            }
            None => return,
        };
        for (c, req) in paused_out {
            let e = OpError::Io(
                "the cluster is paused (pause flag set); 'cairn osd unset pause' resumes I/O"
                    .into(),
            );
            let r = OpReply {
                reqid: req.reqid,
                status: OpStatus::Done(Err(e)),
                version: Version::default(),
                epoch: have,
            };
            self.send(Ep::Osd(id), Ep::Client(c), Msg::OpReply(r));
        }
        // Held client ops past the map wait.
        let expired: Vec<(u32, OpRequest)> = match self.proc_mut(id) {
            Some(p) => {
                let (gone, keep): (Vec<_>, Vec<_>) =
                    p.held_ops.drain(..).partition(|(_, _, dl)| local >= *dl);
                p.held_ops = keep;
                gone.into_iter().map(|(c, r, _)| (c, r)).collect()
            }
            None => return,
        };
        for (c, req) in expired {
            let r = OpReply {
                reqid: req.reqid,
                status: OpStatus::MapTooNew { osd_epoch: have },
                version: Version::default(),
                epoch: have,
            };
            self.send(Ep::Osd(id), Ep::Client(c), Msg::OpReply(r));
        }
        let stale_queries: Vec<(Ep, Msg)> = match self.proc_mut(id) {
            Some(p) => {
                let (gone, keep): (Vec<_>, Vec<_>) = p
                    .held_queries
                    .drain(..)
                    .partition(|(_, _, dl)| local >= *dl);
                p.held_queries = keep;
                gone.into_iter().map(|(f, m, _)| (f, m)).collect()
            }
            None => return,
        };
        for (from, q) in stale_queries {
            self.answer_query(id, from, q);
        }
        // Peering calls and up_thru waits that timed out.
        let timed_out: Vec<Call> = match self.proc_mut(id) {
            Some(p) => {
                let ids: Vec<u64> = p
                    .calls
                    .iter()
                    .filter(|(_, c)| local >= c.deadline)
                    .map(|(k, _)| *k)
                    .collect();
                ids.into_iter().filter_map(|k| p.calls.remove(&k)).collect()
            }
            None => return,
        };
        for c in timed_out {
            let why = format!(
                "osd.{} did not answer within {}ms",
                c.osd,
                self.cfg.peer_timeout / MS
            );
            self.peering_input(
                id,
                c.pgid,
                Some(c.run),
                PeeringInput::PeerFailed { osd: c.osd, why },
            );
        }
        let pgids: Vec<PgId> = self
            .proc_mut(id)
            .map(|p| p.pgs.keys().copied().collect())
            .unwrap_or_default();
        for pgid in pgids {
            let up_thru_late = self
                .proc_mut(id)
                .and_then(|p| p.pgs.get_mut(&pgid))
                .and_then(|s| s.run.as_mut())
                .and_then(|r| match r.up_thru {
                    Some((want, dl)) if local >= dl => {
                        r.up_thru = None;
                        Some(want)
                    }
                    _ => None,
                });
            if let Some(want) = up_thru_late {
                let why = format!(
                    "waiting for the monitors to record up_thru {} for osd.{id}",
                    want.0
                );
                self.peering_input(id, pgid, None, PeeringInput::UpThruFailed(why));
            }
            // Resend sub-ops to replicas whose connection was replaced.
            let targets: BTreeSet<i32> = self
                .proc_mut(id)
                .and_then(|p| p.pgs.get(&pgid))
                .map(|s| s.repops.values().flat_map(|w| w.keys().copied()).collect())
                .unwrap_or_default();
            for r in targets {
                let gen = self.link_gen(Ep::Osd(id), Ep::Osd(r));
                let stale = self
                    .proc_mut(id)
                    .and_then(|p| p.pgs.get(&pgid))
                    .is_some_and(|s| s.sent_gen.get(&r) != Some(&gen));
                if stale {
                    self.resend_all(id, pgid, r, u64::MAX);
                }
            }
            // Retry activation of a PG that is down.
            let acts = match self.proc_mut(id).and_then(|p| p.pgs.get_mut(&pgid)) {
                Some(s) if s.run.is_none() => s.pg.retry_peering(),
                _ => Vec::new(),
            };
            if !acts.is_empty() {
                self.pg_actions(id, pgid, acts);
            }
            self.backfill_step(id, pgid);
            self.tell_primary_if_stray(id, pgid);
        }
    }

    /// Every [`BEACON_INTERVAL`]: the OSD's usage figures to the monitor
    /// (the runtime's beacon; the monitor marks it nearfull/full from them).
    fn beacon(&mut self, id: i32, local: u64) {
        let epoch = self.osd_epoch(id);
        let Some(p) = self.proc_mut(id) else {
            return;
        };
        if p.last_beacon.is_some_and(|t| local < t + BEACON_INTERVAL) {
            return;
        }
        p.last_beacon = Some(local);
        let Some(disk) = self.osds.get(&id).map(|o| &o.disk) else {
            return;
        };
        let total = self.reported_total_bytes();
        let used = disk.reported_used_bytes(total);
        let beacon = cairn_map::pgmap::OsdBeacon {
            epoch: epoch.0,
            total_bytes: total,
            used_bytes: used,
            available_bytes: total - used,
            pgs: Vec::new(),
        };
        self.send(
            Ep::Osd(id),
            Ep::Mon,
            Msg::MonCmd(MonCommand::OsdBeacon { id, beacon }),
        );
    }

    pub fn hb_tick(&mut self, id: i32) {
        let Some(o) = self.osds.get(&id) else {
            return;
        };
        let now = self.instant(&o.clock.clone());
        let (interval, grace) = {
            let m = self.proc_mut(id).and_then(|p| p.map.clone());
            let get = |k: &str, d: u64| {
                m.as_ref()
                    .and_then(|m| m.config_value(&format!("osd.{id}"), k))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(d)
                    .max(1)
            };
            (
                Duration::from_secs(get("osd_heartbeat_interval", 6)),
                Duration::from_secs(get("osd_heartbeat_grace", 20)),
            )
        };
        let acts = match self.proc_mut(id) {
            Some(p) => p.hb.tick(now, interval, grace),
            None => return,
        };
        self.hb_actions(id, acts);
    }

    fn hb_actions(&mut self, id: i32, acts: Vec<HbAction>) {
        for a in acts {
            match a {
                HbAction::Ping(p) => self.send(Ep::Osd(id), Ep::Osd(p), Msg::Ping { from: id }),
                HbAction::Report { target, failed } => {
                    self.trace(|| format!("osd.{id}: reports osd.{target} failed={failed}"));
                    self.send(
                        Ep::Osd(id),
                        Ep::Mon,
                        Msg::MonCmd(MonCommand::OsdFailureReport { id, target, failed }),
                    );
                }
            }
        }
    }
}

/// What `ec.rs` uses of an OSD's machinery.
impl World {
    pub(crate) fn pg_is_ec(&self, id: i32, pgid: PgId) -> bool {
        self.osds
            .get(&id)
            .and_then(|o| o.proc_.as_ref())
            .and_then(|p| p.map.as_ref())
            .is_some_and(|m| crate::ec::is_ec(m, pgid))
    }

    pub(crate) fn pg_mut(&mut self, id: i32, pgid: PgId) -> Option<&mut SimPg> {
        self.proc_mut(id).and_then(|p| p.pgs.get_mut(&pgid))
    }

    pub(crate) fn submit_pub(&mut self, id: i32, ops: Vec<TxOp>) {
        self.submit(id, ops, None);
    }

    pub(crate) fn flush_pub(&mut self, id: i32) {
        self.flush(id);
    }

    pub(crate) fn local_now_pub(&self, id: i32) -> u64 {
        self.local_now(id)
    }

    pub(crate) fn osd_epoch_pub(&self, id: i32) -> Epoch {
        self.osd_epoch(id)
    }

    pub(crate) fn next_call_id(&mut self, id: i32) -> u64 {
        match self.proc_mut(id) {
            Some(p) => {
                p.next_call += 1;
                p.next_call
            }
            None => 0,
        }
    }

    pub(crate) fn next_run_id(&mut self, id: i32) -> u64 {
        match self.proc_mut(id) {
            Some(p) => {
                p.next_run += 1;
                p.next_run
            }
            None => 0,
        }
    }

    pub(crate) fn op_reply_pub(&mut self, id: i32, token: Token, reply: OpReply) {
        self.op_reply(id, token, reply);
    }

    pub(crate) fn pg_event_pub(&mut self, id: i32, pgid: PgId, ev: PgEvent) {
        self.pg_event(id, pgid, ev);
    }

    pub(crate) fn install_push_pub(&mut self, id: i32, push: &PgPush) -> Result<(), String> {
        self.install_push(id, push)
    }

    /// Submits the primary's own part of a write; its commit counts once durable.
    pub(crate) fn submit_local_commit(
        &mut self,
        id: i32,
        pgid: PgId,
        ops: Vec<TxOp>,
        seq: u64,
        interval_since: Epoch,
    ) {
        self.submit(
            id,
            ops,
            Some(Waiter::LocalCommit {
                pgid,
                seq,
                interval_since,
            }),
        );
    }

    /// Sends one write's sub-ops (one message per member), remembered
    /// for resends until acknowledged.
    pub(crate) fn send_repops_pub(
        &mut self,
        id: i32,
        pgid: PgId,
        seq: u64,
        reps: BTreeMap<i32, RepOpMsg>,
    ) {
        if reps.is_empty() {
            return;
        }
        if let Some(s) = self.pg_mut(id, pgid) {
            s.repops.insert(seq, reps.clone());
        }
        for (r, rep) in reps {
            self.send_repop(id, pgid, r, seq, rep);
        }
    }
}

fn new_simpg(pg: Pg) -> SimPg {
    SimPg {
        pg,
        run: None,
        repops: BTreeMap::new(),
        sent_gen: BTreeMap::new(),
        backfill: None,
        strays: Vec::new(),
        stray_told_at: None,
        pg_temp_clear: Default::default(),
    }
}

/// Member side of a pull, from the collection's live state.
fn serve_pull(c: &crate::disk::Coll, what: &PullWhat) -> PullReply {
    match what {
        PullWhat::Objects(names) => PullReply::Objects(
            names
                .iter()
                .map(|(h, n)| (*h, n.clone(), c.objects.get(n).cloned()))
                .collect(),
        ),
        PullWhat::List { after, limit } => {
            let mut all: Vec<(u32, cairn_ops::ObjectName)> = c
                .objects
                .keys()
                .filter(|n| !crate::ec::internal(n))
                .map(|n| (n.hash(), n.clone()))
                .collect();
            all.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
            let start = match after {
                None => 0,
                Some(cur) => all
                    .iter()
                    .position(|(h, n)| {
                        (*h, n.namespace.as_str(), n.name.as_str())
                            > (cur.hash, cur.namespace.as_str(), cur.name.as_str())
                    })
                    .unwrap_or(all.len()),
            };
            let end = (start + *limit as usize).min(all.len());
            let objects = all[start..end].to_vec();
            let next = (end < all.len())
                .then(|| objects.last())
                .flatten()
                .map(|(h, n)| ListCursor {
                    hash: *h,
                    namespace: n.namespace.clone(),
                    name: n.name.clone(),
                });
            PullReply::List { objects, next }
        }
    }
}

/// The client-facing error of a write osd.`id` has no room for (the
/// runtime's words, so the oracle sees the same kind of refusal).
pub(crate) fn no_space(id: i32, needed: u64, available: u64) -> OpError {
    OpError::NoSpace(format!(
        "osd.{id} is full: {needed} bytes needed, {available} available; delete data or add capacity"
    ))
}
