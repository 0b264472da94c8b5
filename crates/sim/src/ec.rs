//! Erasure-coded PGs in the simulator: the primary's EC write path (one
//! chunk per shard position, a rollback stash written before each shard
//! applies an entry, stashes dropped once the entry is complete on every
//! shard), EC client reads (read plan over the usable shards, version
//! check, decode) and EC activation, driven the way `cairn_osd`'s
//! `EcPeeringJob` runs it: record `up_thru` and the activation in the map,
//! query, the real `check_can_activate` / `check_k_per_interval` /
//! `plan_activation`, roll divergent entries back on every shard, rebuild
//! the chunks of shards a log behind (or with no copy) from k up-to-date
//! shards with the real `rebuild_from_chunks`, then hand every shard the
//! authoritative log. The codec is the real one (`cairn_ec`). What is the
//! simulator's own: the message plumbing, the disk (stashes are objects in
//! an internal namespace, as in the store) and applying mutations to an
//! in-memory object.

use crate::disk::TxOp;
use crate::world::{Ep, Msg, World, POOL};
use cairn_map::{ClusterMap, MonCommand, PgActivation, PoolKind};
use cairn_ops::{
    EcChunkData, LogEntry, LogOp, Mutation, ObjectName, ObjectState, OpError, OpReply, OpRequest,
    OpStatus, PgInfo, PgPush, PullWhat, SubOp, SubOpOutput, Version,
};
use cairn_osd::ec_exec::{self, EcWritePlan, Step, ATTR_EC, INTERNAL_NS_PREFIX};
use cairn_osd::ec_peering::{
    check_k_per_interval, ec_resume_point, log_after_rollback, plan_activation,
    rebuild_from_chunks, recorded_intervals, EcActivationPlan, EcLayout, Kept, Notes,
};
use cairn_osd::ec_pool::{EcPg, SHARD_HOLE};
use cairn_osd::exec::{decode_version, ATTR_VERSION};
use cairn_osd::peering_sm::BackfillStart;
use cairn_osd::pg::{
    check_can_activate, settled_osds, PastInterval, PgEvent, RecoveryPlan, Token, PG_TEMP_WAIT,
};
use cairn_types::{Epoch, PgId};
use std::collections::{BTreeMap, BTreeSet};

/// Attribute of a stash object: whether the object existed before.
const RB_EXISTED: &str = "_rb_existed";
/// The object recording which shard position a collection holds.
const SHARD_MARK: &str = "shard";
/// Read attempts before a client read fails (shards may be mid-write).
const READ_ATTEMPTS: u32 = 6;

/// A stash name: the same layout as the store's (`ec_exec::stash_oid`).
fn stash_name(name: &ObjectName, seq: u64) -> ObjectName {
    ObjectName::new(
        format!("{INTERNAL_NS_PREFIX}rb.{seq:016x}.{}", name.namespace),
        name.name.clone(),
    )
}

fn shard_mark() -> ObjectName {
    ObjectName::new(format!("{INTERNAL_NS_PREFIX}meta"), SHARD_MARK)
}

/// The entry seq of a stash object, if `n` is one.
fn stash_seq(n: &ObjectName) -> Option<u64> {
    let rest = n
        .namespace
        .strip_prefix(INTERNAL_NS_PREFIX)?
        .strip_prefix("rb.")?;
    u64::from_str_radix(rest.get(..16)?, 16).ok()
}

/// Whether `n` is internal (a stash or the shard mark), never a client object.
pub fn internal(n: &ObjectName) -> bool {
    ec_exec::is_internal_ns(&n.namespace)
}

/// The object's version as stored with its chunk.
fn version_of(st: &ObjectState) -> Version {
    st.attrs
        .iter()
        .find(|(k, _)| k == ATTR_VERSION)
        .map(|(_, v)| decode_version(v))
        .unwrap_or_default()
}

fn size_of(st: &ObjectState) -> u64 {
    st.attrs
        .iter()
        .find(|(k, _)| k == ATTR_EC)
        .and_then(|(_, v)| cairn_ec::ChunkInfo::decode(v).ok())
        .map(|i| i.logical_size_bytes)
        .unwrap_or(0)
}

fn chunk_data(st: &ObjectState) -> EcChunkData {
    EcChunkData {
        version: version_of(st),
        attrs: st.attrs.clone(),
        data: vec![st.data.clone()],
    }
}

/// Applies a shard's mutations to its object (the simulated store op).
pub fn apply_mutations(old: Option<ObjectState>, muts: &[Mutation]) -> Option<ObjectState> {
    let mut cur = old;
    for m in muts {
        let st = cur.get_or_insert_with(|| ObjectState {
            data: bytes::Bytes::new(),
            attrs: vec![],
            omap: vec![],
            clones: vec![],
            data_crc: None,
        });
        match m {
            Mutation::Remove => cur = None,
            Mutation::Touch => {}
            Mutation::Truncate { size } => {
                let mut d = st.data.to_vec();
                d.resize(*size as usize, 0);
                st.data = d.into();
            }
            Mutation::Write { offset, data } => {
                let mut d = st.data.to_vec();
                let end = *offset as usize + data.len();
                if d.len() < end {
                    d.resize(end, 0);
                }
                d[*offset as usize..end].copy_from_slice(data);
                st.data = d.into();
            }
            Mutation::SetAttr { name, value } => {
                st.attrs.retain(|(k, _)| k != name);
                st.attrs.push((name.clone(), value.clone()));
            }
            Mutation::RmAttr { name } => st.attrs.retain(|(k, _)| k != name),
            other => {
                // The workload sends only WriteFull; anything else would be
                // a simulator bug, not an OSD one.
                panic!("the simulated EC store does not apply {other:?}")
            }
        }
    }
    cur
}

/// The stash that undoes `entry` on a shard whose object is `old`.
fn stash_op(pgid: PgId, entry: &LogEntry, old: Option<&ObjectState>) -> TxOp {
    let mut st = old.cloned().unwrap_or(ObjectState {
        data: bytes::Bytes::new(),
        attrs: vec![],
        omap: vec![],
        clones: vec![],
        data_crc: None,
    });
    let existed = if old.is_some() { "1" } else { "0" };
    st.attrs.push((
        RB_EXISTED.into(),
        bytes::Bytes::from_static(existed.as_bytes()),
    ));
    TxOp::Put(pgid, stash_name(&entry.oid, entry.version.seq), Some(st))
}

/// The ops undoing `entry` from its stash (none without a stash: the entry
/// changed nothing here, or was undone already).
fn rollback_ops(pgid: PgId, coll: &crate::disk::Coll, entry: &LogEntry) -> Vec<TxOp> {
    let s = stash_name(&entry.oid, entry.version.seq);
    let Some(st) = coll.objects.get(&s) else {
        return Vec::new();
    };
    let existed = st
        .attrs
        .iter()
        .any(|(k, v)| k == RB_EXISTED && v.as_ref() == b"1");
    let old = existed.then(|| {
        let mut o = st.clone();
        o.attrs.retain(|(k, _)| k != RB_EXISTED);
        o
    });
    vec![
        TxOp::Put(pgid, entry.oid.clone(), old),
        TxOp::Put(pgid, s, None),
    ]
}

/// Drops the stashes of entries up to `through` (complete on every shard).
fn drop_stashes_ops(pgid: PgId, coll: Option<&crate::disk::Coll>, through: u64) -> Vec<TxOp> {
    let Some(c) = coll else {
        return Vec::new();
    };
    c.objects
        .keys()
        .filter(|n| stash_seq(n).is_some_and(|s| s <= through))
        .map(|n| TxOp::Put(pgid, n.clone(), None))
        .collect()
}

/// One EC activation run of a primary.
struct EcRun {
    id: u64,
    interval_since: Epoch,
    epoch: Epoch,
    acting: Vec<i32>,
    probe: Vec<i32>,
    past: Vec<PastInterval>,
    history: Vec<PgActivation>,
    ec: EcPg,
    min_size: u32,
    phase: Phase,
    /// Local time the up_thru wait gives up.
    up_thru_deadline: u64,
    notes: Notes,
    /// Copies answering OSDs (this one too) keep of other positions.
    kept: Kept,
    /// OSDs that answered the query (this one too), with a copy or
    /// without: each settles its past intervals (`pg::settled_osds`).
    answered: BTreeSet<i32>,
    asked: BTreeSet<i32>,
    waiting: BTreeSet<u64>,
    plan: Option<EcActivationPlan>,
    /// Chunks read per object from the sources (rebuild), absent counts.
    chunks: BTreeMap<ObjectName, Vec<(usize, EcChunkData)>>,
    absent: BTreeMap<ObjectName, usize>,
    /// Object names of the PG (for shards that need a backfill).
    listing: Option<Vec<(u32, ObjectName)>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    UpThru,
    Query,
    Rollback,
    List,
    Read,
    Push,
    Finish,
}

/// A client read in progress on an EC primary.
struct EcRead {
    token: Token,
    pgid: PgId,
    /// The layout of the interval the read was handed out in (the runtime's
    /// `EcTarget::ec`): every attempt plans over its acting set, even after
    /// a newer map arrived.
    ec: EcPg,
    req: OpRequest,
    version: Version,
    plan: cairn_ec::ReadPlan,
    got: BTreeMap<usize, Option<ObjectState>>,
    waiting: BTreeSet<u64>,
    failed: Vec<bool>,
    attempt: u32,
}

#[derive(Debug, Clone, Copy)]
enum For {
    Run(PgId, u64),
    Read(u64),
}

struct EcCall {
    osd: i32,
    deadline: u64,
    purpose: For,
}

/// An OSD's volatile EC state (lost on a crash).
#[derive(Default)]
pub struct EcProc {
    runs: BTreeMap<PgId, EcRun>,
    calls: BTreeMap<u64, EcCall>,
    reads: BTreeMap<u64, EcRead>,
    next_read: u64,
    /// Reads finished and not yet reported to their PG as `ReadDone`
    /// (reported by whoever drives the PG next, in order).
    read_done: Vec<(PgId, Token)>,
}

/// Whether `pgid` belongs to an erasure-coded pool in `m`.
pub fn is_ec(m: &ClusterMap, pgid: PgId) -> bool {
    m.pools
        .get(&pgid.pool.0)
        .is_some_and(|p| p.kind == PoolKind::Erasure)
}

/// The expected chunk of every shard position for `value` (the oracle's
/// side: the real codec).
pub fn expected_chunks(ec: &EcPg, value: &bytes::Bytes) -> Vec<bytes::Bytes> {
    ec.code.encode(value).unwrap_or_default()
}

impl World {
    fn ec_map(&self, id: i32) -> Option<std::sync::Arc<ClusterMap>> {
        self.osds
            .get(&id)
            .and_then(|o| o.proc_.as_ref())
            .and_then(|p| p.map.clone())
    }

    fn ec_proc(&mut self, id: i32) -> Option<&mut EcProc> {
        self.osds
            .get_mut(&id)
            .and_then(|o| o.proc_.as_mut())
            .map(|p| &mut p.ec)
    }

    fn coll(&self, id: i32, pgid: PgId) -> Option<&crate::disk::Coll> {
        self.osds
            .get(&id)
            .and_then(|o| o.disk.live.colls.get(&pgid))
    }

    /// The shard position this OSD's copy of `pgid` holds (recorded when the
    /// copy was created).
    pub fn ec_shard_of_copy(&self, id: i32, pgid: PgId) -> Option<u8> {
        self.coll(id, pgid)?
            .objects
            .get(&shard_mark())
            .and_then(|s| s.data.first().copied())
    }

    /// Records the shard position of a new copy (positions do not move in
    /// the profiles that run EC: no out, reweight or new OSDs).
    pub fn ec_mark_shard(&mut self, id: i32, pgid: PgId) {
        let Some(m) = self.ec_map(id) else {
            return;
        };
        if !is_ec(&m, pgid) || self.ec_shard_of_copy(id, pgid).is_some() {
            return;
        }
        let Ok(Some(ec)) = EcPg::from_map(&m, pgid.pool.0, pgid.seed) else {
            return;
        };
        let Some(s) = ec.up_shard_of(id).or_else(|| ec.shard_of(id)) else {
            return;
        };
        let st = ObjectState {
            data: bytes::Bytes::from(vec![s as u8]),
            attrs: vec![],
            omap: vec![],
            clones: vec![],
            data_crc: None,
        };
        self.submit_pub(id, vec![TxOp::Put(pgid, shard_mark(), Some(st))]);
    }

    /// When CRUSH moved this OSD to another shard position, it serves that
    /// position from an empty copy, as the runtime's `follow_shard_move`
    /// switches to the new position's (empty) collection; activation
    /// rebuilds it. The old position's collection is kept aside
    /// (`SimDisk::parked`, as the runtime keeps it until the PG is clean),
    /// and moving back to that position takes it up again (a copy behind
    /// by what was written meanwhile).
    pub fn ec_follow_shard_move(&mut self, id: i32, pgid: PgId, m: &ClusterMap) {
        let Ok(Some(ec)) = EcPg::from_map(m, pgid.pool.0, pgid.seed) else {
            return;
        };
        let Some(s) = ec.shard_of(id).or_else(|| ec.up_shard_of(id)) else {
            return;
        };
        let Some(old) = self.ec_shard_of_copy(id, pgid) else {
            return;
        };
        if usize::from(old) == s {
            return;
        }
        // What leaves is parked durably: flush first.
        self.flush_pub(id);
        let parked = self.osds.get_mut(&id).and_then(|o| {
            let leaving = o.disk.durable.colls.get(&pgid).cloned();
            if let Some(c) = leaving {
                o.disk.parked.insert((pgid, old), c);
            }
            o.disk.parked.remove(&(pgid, s as u8))
        });
        let back = parked.is_some();
        self.trace(|| {
            format!(
                "osd.{id} pg {pgid}: moved from shard {old} to shard {s}; serving it from {}",
                if back {
                    "the copy it kept of that position"
                } else {
                    "an empty copy"
                }
            )
        });
        let kept = parked.unwrap_or_default();
        let info = kept.info.clone().unwrap_or(PgInfo {
            pgid: Some(pgid),
            ..Default::default()
        });
        let log: Vec<LogEntry> = kept.log.values().cloned().collect();
        let mut ops: Vec<TxOp> = self
            .coll(id, pgid)
            .map(|c| {
                c.objects
                    .keys()
                    .filter(|n| !kept.objects.contains_key(*n))
                    .map(|n| TxOp::Put(pgid, n.clone(), None))
                    .collect()
            })
            .unwrap_or_default();
        for (n, st) in &kept.objects {
            ops.push(TxOp::Put(pgid, n.clone(), Some(st.clone())));
        }
        ops.push(TxOp::LogReplace(pgid, log.clone()));
        ops.push(TxOp::Info(pgid, info.clone()));
        ops.push(TxOp::Put(
            pgid,
            shard_mark(),
            Some(ObjectState {
                data: bytes::Bytes::from(vec![s as u8]),
                attrs: vec![],
                omap: vec![],
                clones: vec![],
                data_crc: None,
            }),
        ));
        self.submit_pub(id, ops);
        self.flush_pub(id);
        self.ec_drop_run(id, pgid);
        if let Some(sp) = self.pg_mut(id, pgid) {
            sp.repops.clear();
            sp.sent_gen.clear();
            sp.run = None;
            sp.pg.reload(info, log);
        }
    }

    /// The copies this OSD keeps of `pgid`'s positions other than the one
    /// it serves (parked by shard moves), with their info and log: what
    /// its query answers report (the runtime's `ec_peering::kept_copies`).
    pub fn ec_parked_copies(&self, id: i32, pgid: PgId) -> Vec<(u8, PgInfo, Vec<LogEntry>)> {
        let Some(o) = self.osds.get(&id) else {
            return Vec::new();
        };
        o.disk
            .parked
            .range((pgid, 0)..=(pgid, u8::MAX))
            .filter_map(|((_, s), c)| {
                let info = c.info.clone()?;
                Some((*s, info, c.log.values().cloned().collect()))
            })
            .collect()
    }

    /// This OSD's copy of position `shard` of `pgid`: the one it serves,
    /// or one parked by a shard move.
    fn copy_of_position(&self, id: i32, pgid: PgId, shard: u8) -> Option<&crate::disk::Coll> {
        if self.ec_shard_of_copy(id, pgid) == Some(shard) {
            return self.coll(id, pgid);
        }
        self.osds.get(&id)?.disk.parked.get(&(pgid, shard))
    }

    /// Once the PG is clean here (acting = up, every position served), the
    /// copies parked by shard moves are deleted, as the runtime's
    /// `drop_other_shards_if_clean` does; `all`: a stray copy is removed,
    /// and its parked copies with it.
    pub fn ec_drop_parked(&mut self, id: i32, pgid: PgId, all: bool) {
        let clean = all
            || self.pg_mut(id, pgid).is_some_and(|sp| {
                sp.pg
                    .placement()
                    .is_some_and(cairn_osd::ec_pool::kept_copies_droppable)
            });
        if !clean {
            return;
        }
        let Some(o) = self.osds.get_mut(&id) else {
            return;
        };
        let gone: Vec<(PgId, u8)> = o
            .disk
            .parked
            .range((pgid, 0)..=(pgid, u8::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in &gone {
            o.disk.parked.remove(k);
        }
        if !gone.is_empty() {
            self.trace(|| {
                format!(
                    "osd.{id} pg {pgid}: removed the copies parked of shard(s) {:?}",
                    gone.iter().map(|(_, s)| s).collect::<Vec<_>>()
                )
            });
        }
    }

    fn ec_call(&mut self, id: i32, osd: i32, purpose: For, msg: impl FnOnce(u64) -> Msg) -> u64 {
        let deadline = self.local_now_pub(id) + self.cfg.peer_timeout;
        let call = self.next_call_id(id);
        if let Some(p) = self.ec_proc(id) {
            p.calls.insert(
                call,
                EcCall {
                    osd,
                    deadline,
                    purpose,
                },
            );
        }
        let m = msg(call);
        self.send(Ep::Osd(id), Ep::Osd(osd), m);
        call
    }

    /// [`ec_call`](Self::ec_call) on behalf of PG `pgid`'s activation run
    /// `run`, recorded among the calls the run waits for.
    fn ec_run_call(
        &mut self,
        id: i32,
        osd: i32,
        pgid: PgId,
        run: u64,
        msg: impl FnOnce(u64) -> Msg,
    ) {
        let call = self.ec_call(id, osd, For::Run(pgid, run), msg);
        if let Some(r) = self.ec_proc(id).and_then(|p| p.runs.get_mut(&pgid)) {
            r.waiting.insert(call);
        }
    }

    /// Whether `call` is one of this OSD's EC calls.
    pub fn ec_owns(&self, id: i32, call: u64) -> bool {
        self.osds
            .get(&id)
            .and_then(|o| o.proc_.as_ref())
            .is_some_and(|p| p.ec.calls.contains_key(&call))
    }

    // ---- the write path ----

    /// The primary's EC write (the runtime's `write` for an EC PG, WriteFull
    /// only): one chunk per shard, a stash before each shard applies it.
    #[allow(clippy::too_many_arguments)]
    pub fn ec_write(
        &mut self,
        id: i32,
        pgid: PgId,
        req: OpRequest,
        version: Version,
        trim_to: Version,
        replicas: Vec<i32>,
        log_only: Vec<i32>,
    ) -> Vec<cairn_osd::pg::PgAction> {
        let Some(m) = self.ec_map(id) else {
            return Vec::new();
        };
        let ec = match EcPg::from_map(&m, pgid.pool.0, pgid.seed) {
            Ok(Some(ec)) => ec,
            _ => return Vec::new(),
        };
        let old = self
            .coll(id, pgid)
            .and_then(|c| c.objects.get(&req.oid))
            .cloned();
        let prior = old.as_ref().map(version_of).unwrap_or_default();
        let old_size = old.as_ref().map(size_of).unwrap_or(0);
        // A member marked full in the map: refused at once, logged like
        // any failed op (the runtime's `full_refusal`).
        let marked_full = self.full_refusal(id, pgid, &req);
        let resolved: Result<BTreeMap<i32, Vec<Mutation>>, OpError> = match req.ops.as_slice() {
            _ if marked_full.is_some() => Err(OpError::NoSpace(marked_full.unwrap_or_default())),
            [SubOp::WriteFull { data }] => {
                cairn_ec::plan_write_full(&ec.code, old_size, data.len() as u64)
                    .and_then(|plan| {
                        let writes = plan.build(data, &[])?;
                        let ewp = EcWritePlan {
                            prior,
                            outputs: vec![SubOpOutput::None],
                            steps: vec![Step::Data {
                                plan,
                                data: data.clone(),
                            }],
                            exists_after: true,
                            whiteout_after: false,
                            size_after: data.len() as u64,
                        };
                        // Acting shards, then backfill targets (the chunk
                        // of the position CRUSH gives them), keyed by OSD
                        // as the runtime's `write` does.
                        let placed = ec.shards.iter().copied().enumerate();
                        Ok(placed
                            .chain(ec.backfill_targets())
                            .filter(|&(_, o)| o != SHARD_HOLE)
                            .map(|(s, o)| {
                                (
                                    o,
                                    ec_exec::shard_mutations(&ewp, &writes, &ec.code, s, version),
                                )
                            })
                            .collect())
                    })
                    .map_err(|e| OpError::Invalid(format!("object {}: {e}", req.oid)))
            }
            _ => Err(OpError::Invalid(
                "the simulator writes whole objects only".into(),
            )),
        };
        let (mut per_osd, op, outcome) = match resolved {
            Ok(p) => (p, LogOp::Modify, Ok(vec![SubOpOutput::None])),
            Err(e) => (BTreeMap::new(), LogOp::Error(e.clone()), Err(e)),
        };
        let entry = LogEntry {
            version,
            prior_version: if outcome.is_ok() {
                prior
            } else {
                Version::default()
            },
            reqid: Some(req.reqid.clone()),
            oid: req.oid.clone(),
            op,
        };
        let epoch = m.epoch;
        let is_err = outcome.is_err();
        let Some(s) = self.pg_mut(id, pgid) else {
            return Vec::new();
        };
        let (old_front, old_tail) = (s.pg.log_front(), s.pg.info.log_tail);
        let more = s.pg.handle(PgEvent::Submitted {
            seq: version.seq,
            entry: entry.clone(),
            outcome,
        });
        let roll_forward_to = s.pg.complete_through();
        let interval_since = s.pg.info.same_interval_since;
        let trimmed = s.pg.trimmed_since(old_front, old_tail);
        let info = s.pg.info.clone();
        let coll = self.coll(id, pgid);
        let mut ops = drop_stashes_ops(pgid, coll, roll_forward_to.seq.max(trim_to.seq));
        let my_muts = per_osd.remove(&id).unwrap_or_default();
        if !is_err {
            ops.push(stash_op(pgid, &entry, old.as_ref()));
            ops.push(TxOp::Put(
                pgid,
                req.oid.clone(),
                apply_mutations(old, &my_muts),
            ));
        }
        ops.push(TxOp::LogAppend(pgid, entry.clone()));
        if let Some((from, upto)) = trimmed {
            ops.push(TxOp::LogTrim {
                pg: pgid,
                from,
                upto,
            });
        }
        ops.push(TxOp::Info(pgid, info));
        let reps: BTreeMap<i32, crate::osd::RepOpMsg> = replicas
            .iter()
            .map(|&r| {
                (
                    r,
                    crate::osd::RepOpMsg {
                        pgid,
                        from: id,
                        epoch,
                        interval_since,
                        entry: entry.clone(),
                        state: None,
                        // Backfill targets not yet at this object: the
                        // entry alone.
                        mutations: Some(if log_only.contains(&r) {
                            Vec::new()
                        } else {
                            per_osd.remove(&r).unwrap_or_default()
                        }),
                        roll_forward_to,
                        trim_to,
                        log_only: log_only.contains(&r),
                    },
                )
            })
            .collect();
        let now = self.osd_instant(id);
        if let Some(b) = self.pg_mut(id, pgid).and_then(|s| s.backfill.as_mut()) {
            b.note_write(now, version.seq, &req.oid, &replicas);
        }
        self.submit_local_commit(id, pgid, ops, version.seq, interval_since);
        self.send_repops_pub(id, pgid, version.seq, reps);
        more
    }

    /// A shard's side of an EC sub-op: the ops that stash and apply it
    /// (and drop the stashes of entries complete everywhere).
    pub fn ec_repop_ops(&self, id: i32, rep: &crate::osd::RepOpMsg) -> Vec<TxOp> {
        let pgid = rep.pgid;
        let coll = self.coll(id, pgid);
        let mut ops = drop_stashes_ops(pgid, coll, rep.roll_forward_to.seq.max(rep.trim_to.seq));
        if matches!(rep.entry.op, LogOp::Error(_)) || rep.log_only {
            return ops;
        }
        let old = coll.and_then(|c| c.objects.get(&rep.entry.oid)).cloned();
        ops.push(stash_op(pgid, &rep.entry, old.as_ref()));
        let muts = rep.mutations.clone().unwrap_or_default();
        ops.push(TxOp::Put(
            pgid,
            rep.entry.oid.clone(),
            apply_mutations(old, &muts),
        ));
        ops
    }

    // ---- client reads ----

    /// Starts an EC client read on the primary (the runtime's
    /// `EcTarget::client_read`: metadata from this shard, chunks from the
    /// read plan's shards, the version checked, the extent assembled).
    /// A client read leaves the PG: its reply (if any) goes out, and it is
    /// noted for `ReadDone` (so writes to the object may start, as the
    /// runtime reports every read it was handed). The PG hears it from
    /// `ec_take_read_done`, after the current step, never re-entrantly.
    fn ec_read_finish(&mut self, id: i32, pgid: PgId, token: Token, reply: Option<OpReply>) {
        if let Some(r) = reply {
            self.op_reply_pub(id, token, r);
        }
        if let Some(p) = self.ec_proc(id) {
            p.read_done.push((pgid, token));
        }
    }

    /// The reads finished since the last call (see `ec_read_finish`).
    pub fn ec_take_read_done(&mut self, id: i32) -> Vec<(PgId, Token)> {
        self.ec_proc(id)
            .map(|p| std::mem::take(&mut p.read_done))
            .unwrap_or_default()
    }

    pub fn ec_read(&mut self, id: i32, pgid: PgId, token: Token, req: OpRequest) {
        let Some(m) = self.ec_map(id) else {
            return self.ec_read_finish(id, pgid, token, None);
        };
        let Ok(Some(ec)) = EcPg::from_map(&m, pgid.pool.0, pgid.seed) else {
            return self.ec_read_finish(id, pgid, token, None);
        };
        let failed = vec![false; ec.code.total()];
        self.ec_read_attempt(id, pgid, ec, token, req, failed, 0);
    }

    /// One attempt of a client read over `ec`, the layout of the interval
    /// the read began in (as the runtime's `EcTarget` keeps it: a map that
    /// arrives meanwhile must not shrink the shards it may read, or a read
    /// begun while active would fail with an I/O error instead of asking
    /// the client to resend).
    #[allow(clippy::too_many_arguments)]
    fn ec_read_attempt(
        &mut self,
        id: i32,
        pgid: PgId,
        ec: EcPg,
        token: Token,
        req: OpRequest,
        failed: Vec<bool>,
        attempt: u32,
    ) {
        let epoch = self.osd_epoch_pub(id);
        let reply = |status: OpStatus, version: Version| OpReply {
            reqid: req.reqid.clone(),
            status,
            version,
            epoch,
        };
        if !matches!(req.ops.as_slice(), [SubOp::Read { offset: 0, len: 0 }]) {
            let r = reply(
                OpStatus::Done(Err(OpError::Invalid(
                    "the simulator serves only whole-object reads".into(),
                ))),
                Version::default(),
            );
            self.ec_read_finish(id, pgid, token, Some(r));
            return;
        }
        let Some(mine) = self
            .coll(id, pgid)
            .and_then(|c| c.objects.get(&req.oid))
            .cloned()
        else {
            let r = reply(OpStatus::Done(Err(OpError::NoEnt)), Version::default());
            self.ec_read_finish(id, pgid, token, Some(r));
            return;
        };
        let (version, size) = (version_of(&mine), size_of(&mine));
        let available: Vec<bool> = ec
            .available()
            .iter()
            .zip(&failed)
            .map(|(a, f)| *a && !f)
            .collect();
        let plan = match ec.code.plan_read(size, 0, size, &available) {
            Ok(p) => p,
            // Shards failed this read (mid-write, or unreachable before the
            // map says so): all of them again, as the runtime does.
            Err(_) if failed.iter().any(|&f| f) && attempt + 1 < READ_ATTEMPTS => {
                let none = vec![false; failed.len()];
                return self.ec_read_attempt(id, pgid, ec, token, req, none, attempt + 1);
            }
            Err(_) if failed.iter().any(|&f| f) => {
                let r = reply(
                    OpStatus::NotActive {
                        state: format!(
                            "degraded: object {}: could not read enough consistent chunks",
                            req.oid
                        ),
                    },
                    Version::default(),
                );
                self.ec_read_finish(id, pgid, token, Some(r));
                return;
            }
            Err(e) => {
                let r = reply(
                    OpStatus::Done(Err(OpError::Io(format!("object {}: {e}", req.oid)))),
                    Version::default(),
                );
                self.ec_read_finish(id, pgid, token, Some(r));
                return;
            }
        };
        let shards: BTreeSet<usize> = plan.reads().iter().map(|r| r.shard).collect();
        let Some(p) = self.ec_proc(id) else {
            return;
        };
        p.next_read += 1;
        let rid = p.next_read;
        let mut read = EcRead {
            token,
            pgid,
            ec: ec.clone(),
            req: req.clone(),
            version,
            plan,
            got: BTreeMap::new(),
            waiting: BTreeSet::new(),
            failed,
            attempt,
        };
        let mut remote = Vec::new();
        for s in shards {
            let osd = ec.shards[s];
            if osd == id {
                read.got.insert(s, Some(mine.clone()));
            } else {
                remote.push((s, osd));
            }
        }
        p.reads.insert(rid, read);
        for (s, osd) in remote {
            let oid = req.oid.clone();
            let call = self.ec_call(id, osd, For::Read(rid), |call| Msg::Pull {
                call,
                pgid,
                what: PullWhat::Objects(vec![(oid.hash(), oid)]),
                shard: None,
            });
            if let Some(r) = self.ec_proc(id).and_then(|p| p.reads.get_mut(&rid)) {
                r.waiting.insert(call);
                r.got.insert(s, None);
            }
        }
        self.ec_read_progress(id, rid);
    }

    fn ec_read_answer(
        &mut self,
        id: i32,
        rid: u64,
        call: u64,
        osd: i32,
        st: Option<ObjectState>,
        ok: bool,
    ) {
        let Some(r) = self.ec_proc(id).and_then(|p| p.reads.get_mut(&rid)) else {
            return;
        };
        r.waiting.remove(&call);
        if let Some(s) = r.ec.shard_of(osd) {
            match (ok, st) {
                (true, Some(st)) => {
                    r.got.insert(s, Some(st));
                }
                _ => {
                    r.got.remove(&s);
                    if let Some(f) = r.failed.get_mut(s) {
                        *f = true;
                    }
                }
            }
        }
        self.ec_read_progress(id, rid);
        for (pgid, token) in self.ec_take_read_done(id) {
            self.pg_event_pub(id, pgid, PgEvent::ReadDone { token });
        }
    }

    fn ec_read_progress(&mut self, id: i32, rid: u64) {
        let Some(r) = self.ec_proc(id).and_then(|p| p.reads.get(&rid)) else {
            return;
        };
        if !r.waiting.is_empty() {
            return;
        }
        let Some(r) = self.ec_proc(id).and_then(|p| p.reads.remove(&rid)) else {
            return;
        };
        let mut failed = r.failed.clone();
        let mut bytes = Vec::new();
        let mut ok = true;
        for cr in r.plan.reads() {
            match r.got.get(&cr.shard) {
                Some(Some(st)) if version_of(st) == r.version => {
                    let mut d = st.data.to_vec();
                    d.resize((cr.range.end as usize).max(d.len()), 0);
                    bytes.push(bytes::Bytes::copy_from_slice(
                        &d[cr.range.start as usize..cr.range.end as usize],
                    ));
                }
                _ => {
                    failed[cr.shard] = true;
                    ok = false;
                }
            }
        }
        let epoch = self.osd_epoch_pub(id);
        if ok {
            let res =
                r.ec.code
                    .assemble_read(&r.plan, &bytes)
                    .map(|b| vec![SubOpOutput::Data(b)])
                    .map_err(|e| OpError::Io(format!("object {}: {e}", r.req.oid)));
            let reply = OpReply {
                reqid: r.req.reqid.clone(),
                status: OpStatus::Done(res),
                version: r.version,
                epoch,
            };
            self.ec_read_finish(id, r.pgid, r.token, Some(reply));
            return;
        }
        if r.attempt + 1 >= READ_ATTEMPTS {
            let reply = OpReply {
                reqid: r.req.reqid.clone(),
                status: OpStatus::NotActive {
                    state: format!(
                        "degraded: object {}: could not read enough consistent chunks after {READ_ATTEMPTS} attempts",
                        r.req.oid
                    ),
                },
                version: Version::default(),
                epoch,
            };
            self.ec_read_finish(id, r.pgid, r.token, Some(reply));
            return;
        }
        // Shards may simply be mid-write: after half the attempts, all again.
        if r.attempt + 1 >= READ_ATTEMPTS / 2 {
            failed.iter_mut().for_each(|f| *f = false);
        }
        self.ec_read_attempt(id, r.pgid, r.ec, r.token, r.req, failed, r.attempt + 1);
    }

    // ---- activation ----

    /// Starts an EC activation run (replaces any older run of the PG).
    #[allow(clippy::too_many_arguments)]
    pub fn ec_start_peering(
        &mut self,
        id: i32,
        pgid: PgId,
        interval_since: Epoch,
        epoch: Epoch,
        acting: Vec<i32>,
        probe: Vec<i32>,
        past: Vec<PastInterval>,
    ) {
        let Some(m) = self.ec_map(id) else {
            return;
        };
        let Ok(Some(ec)) = EcPg::from_map(&m, pgid.pool.0, pgid.seed) else {
            return;
        };
        let min_size = m.pools.get(&pgid.pool.0).map(|p| p.min_size).unwrap_or(0);
        let Some(s) = self.pg_mut(id, pgid) else {
            return;
        };
        let info = s.pg.info.clone();
        let log: Vec<LogEntry> = s.pg.log().cloned().collect();
        self.submit_pub(id, vec![TxOp::Info(pgid, info.clone())]);
        self.flush_pub(id);
        let run_id = self.next_run_id(id);
        let shard = self
            .ec_shard_of_copy(id, pgid)
            .or_else(|| ec.shard_of(id).map(|s| s as u8))
            .unwrap_or(0);
        let mut notes: Notes = BTreeMap::new();
        notes.insert(id, (info, log, shard));
        let kept: Kept = self
            .ec_parked_copies(id, pgid)
            .into_iter()
            .map(|(s, i, l)| ((id, s), (i, l)))
            .collect();
        let deadline = self.local_now_pub(id) + self.cfg.peer_timeout;
        let run = EcRun {
            id: run_id,
            interval_since,
            epoch,
            acting: acting.clone(),
            probe,
            past,
            history: m.pg_activations(pgid),
            ec,
            min_size,
            phase: Phase::UpThru,
            up_thru_deadline: deadline,
            notes,
            kept,
            answered: BTreeSet::from([id]),
            asked: BTreeSet::from([id]),
            waiting: BTreeSet::new(),
            plan: None,
            chunks: BTreeMap::new(),
            absent: BTreeMap::new(),
            listing: None,
        };
        self.trace(|| {
            format!(
                "osd.{id} pg {pgid}: EC activation run {run_id} for interval {} acting {acting:?} shards {:?}",
                interval_since.0, run.ec.shards
            )
        });
        if let Some(p) = self.ec_proc(id) {
            p.runs.insert(pgid, run);
        }
        let up_thru_ok = m.osds.get(&id).is_some_and(|o| o.up_thru >= interval_since);
        if up_thru_ok && m.pg_activation_recorded(pgid, &acting) {
            self.ec_query(id, pgid);
            return;
        }
        // Record up_thru and this activation in the map first (as the
        // replicated activation does): a later primary then knows whom to ask.
        self.send(
            Ep::Osd(id),
            Ep::Mon,
            Msg::MonCmd(MonCommand::OsdAlive {
                id,
                want: interval_since,
                activating: vec![(
                    pgid,
                    PgActivation {
                        since: interval_since,
                        acting,
                    },
                )],
            }),
        );
    }

    /// A new map: EC runs waiting for their up_thru/activation record go on.
    pub fn ec_on_map(&mut self, id: i32) {
        let Some(m) = self.ec_map(id) else {
            return;
        };
        let ready: Vec<PgId> = match self.ec_proc(id) {
            Some(p) => p
                .runs
                .iter()
                .filter(|(pgid, r)| {
                    r.phase == Phase::UpThru
                        && m.osds
                            .get(&id)
                            .is_some_and(|o| o.up_thru >= r.interval_since)
                        && m.pg_activation_recorded(**pgid, &r.acting)
                })
                .map(|(k, _)| *k)
                .collect(),
            None => return,
        };
        for pgid in ready {
            if let Some(r) = self.ec_proc(id).and_then(|p| p.runs.get_mut(&pgid)) {
                r.history = m.pg_activations(pgid);
            }
            self.ec_query(id, pgid);
        }
    }

    /// The EC runs' timers: up_thru waits and calls past their deadline.
    pub fn ec_tick(&mut self, id: i32) {
        let local = self.local_now_pub(id);
        let Some(p) = self.ec_proc(id) else {
            return;
        };
        let late: Vec<PgId> = p
            .runs
            .iter()
            .filter(|(_, r)| r.phase == Phase::UpThru && local >= r.up_thru_deadline)
            .map(|(k, _)| *k)
            .collect();
        let calls: Vec<u64> = p
            .calls
            .iter()
            .filter(|(_, c)| local >= c.deadline)
            .map(|(k, _)| *k)
            .collect();
        for pgid in late {
            let why = format!("waiting for the monitors to record up_thru for osd.{id}");
            self.ec_fail(id, pgid, why);
        }
        for call in calls {
            let Some(c) = self.ec_proc(id).and_then(|p| p.calls.remove(&call)) else {
                continue;
            };
            match c.purpose {
                For::Read(rid) => self.ec_read_answer(id, rid, call, c.osd, None, false),
                For::Run(pgid, run) => self.ec_run_failed(
                    id,
                    pgid,
                    run,
                    call,
                    c.osd,
                    format!("osd.{} did not answer in time", c.osd),
                ),
            }
        }
    }

    /// A message answering one of this OSD's EC calls.
    pub fn ec_recv(&mut self, id: i32, msg: Msg) {
        let call = match &msg {
            Msg::Notify { call, .. }
            | Msg::PullReply { call, .. }
            | Msg::PushReply { call, .. }
            | Msg::EcRollbackReply { call, .. } => *call,
            _ => return,
        };
        let Some(c) = self.ec_proc(id).and_then(|p| p.calls.remove(&call)) else {
            return;
        };
        match (c.purpose, msg) {
            (For::Read(rid), Msg::PullReply { reply, from, .. }) => {
                let st = match reply {
                    cairn_ops::PullReply::Objects(mut o) if o.len() == 1 => {
                        o.pop().and_then(|(_, _, st)| st).map(Some)
                    }
                    _ => None,
                };
                let ok = st.is_some();
                self.ec_read_answer(id, rid, call, from, st.flatten(), ok);
            }
            (For::Run(pgid, run), msg) => self.ec_run_answer(id, pgid, run, call, c.osd, msg),
            _ => {}
        }
    }

    fn ec_run_mut(&mut self, id: i32, pgid: PgId, run: u64) -> Option<&mut EcRun> {
        self.ec_proc(id)?
            .runs
            .get_mut(&pgid)
            .filter(|r| r.id == run)
    }

    fn ec_run_failed(&mut self, id: i32, pgid: PgId, run: u64, call: u64, osd: i32, why: String) {
        let Some(r) = self.ec_run_mut(id, pgid, run) else {
            return;
        };
        r.waiting.remove(&call);
        if r.phase == Phase::Query && !r.acting.contains(&osd) {
            // Not an acting member: its copy is simply not counted.
            self.ec_advance(id, pgid);
            return;
        }
        self.ec_fail(id, pgid, why);
    }

    fn ec_fail(&mut self, id: i32, pgid: PgId, why: String) {
        let Some(r) = self.ec_proc(id).and_then(|p| p.runs.remove(&pgid)) else {
            return;
        };
        self.trace(|| format!("osd.{id} pg {pgid}: EC activation not done: {why}"));
        if why.starts_with("incomplete:") {
            self.stats_ec_incomplete();
        }
        self.pg_event_pub(
            id,
            pgid,
            PgEvent::PeeringDone {
                interval_since: r.interval_since,
                result: Err(why),
            },
        );
    }

    fn ec_query(&mut self, id: i32, pgid: PgId) {
        let Some(m) = self.ec_map(id) else {
            return;
        };
        let Some(r) = self.ec_proc(id).and_then(|p| p.runs.get_mut(&pgid)) else {
            return;
        };
        r.phase = Phase::Query;
        let (my_info, _, _) = r.notes[&id].clone();
        let new_here = my_info.last_epoch_started == Epoch(0) && r.history.is_empty();
        let les = my_info.last_epoch_started;
        // Members of recorded activations this copy may not have seen.
        let recorded: Vec<i32> = recorded_intervals(&r.history, r.epoch)
            .into_iter()
            .filter(|pi| pi.last >= les)
            .flat_map(|pi| pi.acting)
            .collect();
        let mut todo: Vec<i32> = r.probe.clone();
        todo.extend(my_info.last_active_acting.iter().copied());
        todo.extend(recorded);
        if new_here {
            todo.extend(m.osds.values().filter(|o| o.up).map(|o| o.id));
        }
        self.ec_ask(id, pgid, todo);
        self.ec_advance(id, pgid);
    }

    fn ec_ask(&mut self, id: i32, pgid: PgId, todo: Vec<i32>) {
        let Some(m) = self.ec_map(id) else {
            return;
        };
        for o in todo {
            let Some(r) = self.ec_proc(id).and_then(|p| p.runs.get_mut(&pgid)) else {
                return;
            };
            if !m.osds.get(&o).is_some_and(|i| i.up) || !r.asked.insert(o) {
                continue;
            }
            let (run, epoch) = (r.id, r.epoch);
            self.ec_run_call(id, o, pgid, run, |call| Msg::Query {
                call,
                pgid,
                from: id,
                epoch,
            });
        }
    }

    fn ec_run_answer(&mut self, id: i32, pgid: PgId, run: u64, call: u64, osd: i32, msg: Msg) {
        let Some(r) = self.ec_run_mut(id, pgid, run) else {
            return;
        };
        r.waiting.remove(&call);
        match msg {
            Msg::Notify {
                info,
                log,
                shard,
                kept,
                ..
            } => {
                r.answered.insert(osd);
                let mut next = Vec::new();
                for (s, i, l) in kept {
                    next.extend(i.last_active_acting.iter().copied());
                    r.kept.insert((osd, s), (i, l));
                }
                if let (Some(info), Some(s)) = (info, shard) {
                    next.extend(info.last_active_acting.iter().copied());
                    r.notes.insert(osd, (info, log, s));
                }
                self.ec_ask(id, pgid, next);
            }
            Msg::EcRollbackReply { result: Err(e), .. } => {
                return self.ec_fail(
                    id,
                    pgid,
                    format!("osd.{osd} failed to roll back divergent entries: {e}"),
                )
            }
            Msg::PushReply { result: Err(e), .. } => {
                return self.ec_fail(
                    id,
                    pgid,
                    format!("osd.{osd} failed to install a recovery push: {e}"),
                )
            }
            Msg::PullReply { reply, shard, .. } => match reply {
                cairn_ops::PullReply::Objects(objs) => {
                    let shard = shard.map(usize::from).or_else(|| r.ec.shard_of(osd));
                    for (_, n, st) in objs {
                        match (st, shard) {
                            (Some(st), Some(s)) => {
                                r.chunks.entry(n).or_default().push((s, chunk_data(&st)))
                            }
                            _ => *r.absent.entry(n).or_default() += 1,
                        }
                    }
                }
                cairn_ops::PullReply::List { objects, next } => {
                    if next.is_some() {
                        return self.ec_fail(
                            id,
                            pgid,
                            "the simulator lists a PG in one page".into(),
                        );
                    }
                    r.listing = Some(objects);
                }
                cairn_ops::PullReply::Refused(e) => {
                    return self.ec_fail(id, pgid, format!("osd.{osd} refused a pull: {e}"))
                }
            },
            _ => {}
        }
        self.ec_advance(id, pgid);
    }

    /// Moves a run on once every call of its phase is answered.
    fn ec_advance(&mut self, id: i32, pgid: PgId) {
        let Some(r) = self.ec_proc(id).and_then(|p| p.runs.get(&pgid)) else {
            return;
        };
        if !r.waiting.is_empty() {
            return;
        }
        let res = match r.phase {
            Phase::UpThru => Ok(()),
            Phase::Query => self.ec_decide(id, pgid),
            Phase::Rollback => self.ec_list(id, pgid),
            Phase::List => self.ec_read_sources(id, pgid),
            Phase::Read => self.ec_push(id, pgid),
            Phase::Push => self.ec_finish(id, pgid),
            Phase::Finish => self.ec_complete(id, pgid),
        };
        if let Err(e) = res {
            self.ec_fail(id, pgid, e);
        }
    }

    /// All answers in: the real checks and plan, then the rollbacks.
    fn ec_decide(&mut self, id: i32, pgid: PgId) -> Result<(), String> {
        let m = self.ec_map(id).ok_or("no map")?;
        let may_remap = self.cfg.ec_remap;
        let r = self
            .ec_proc(id)
            .and_then(|p| p.runs.get_mut(&pgid))
            .ok_or("no run")?;
        let auth_les = r
            .notes
            .values()
            .filter(|(i, _, _)| i.backfill.is_none())
            .map(|(i, _, _)| i.last_epoch_started)
            .max()
            .ok_or("no complete copy of the PG answered")?;
        let settled = settled_osds(r.answered.iter().copied(), &m.lost_osds());
        let recorded = recorded_intervals(&r.history, r.epoch);
        check_can_activate(&r.past, auth_les, &settled)?;
        check_can_activate(&recorded, auth_les, &settled)?;
        check_k_per_interval(&r.past, auth_les, &settled, r.ec.code.k())?;
        check_k_per_interval(&recorded, auth_les, &settled, r.ec.code.k())?;
        let is_up = |o: i32| m.osds.get(&o).is_some_and(|x| x.up);
        let plan = plan_activation(
            &r.notes,
            &r.kept,
            &EcLayout {
                k: r.ec.code.k(),
                shards: &r.ec.shards,
                up_shards: &r.ec.up_shards,
                min_size: r.min_size,
                // With `ec_remap`, as the runtime with a monitor link: a
                // positional pg_temp and background backfill; else
                // activation rebuilds every shard itself.
                may_remap,
            },
            &is_up,
        )?;
        if let Some(want) = plan.pg_temp.clone() {
            let up = r.ec.up_shards.clone();
            self.trace(|| {
                format!(
                    "osd.{id} pg {pgid}: shards {up:?} need backfill; asks for pg_temp {want:?}"
                )
            });
            self.stats_pg_temp_request();
            self.send_pg_temp(id, pgid, want.clone());
            return Err(format!(
                "{PG_TEMP_WAIT} {want:?} (up {up:?} needs backfill)"
            ));
        }
        r.phase = Phase::Rollback;
        let (run, epoch) = (r.id, r.epoch);
        let rollbacks = plan.rollbacks.clone();
        let source_rollbacks = plan.source_rollbacks.clone();
        self.trace(|| {
            format!(
                "osd.{id} pg {pgid}: EC plan: point {}, rollbacks {:?} (of sources outside the acting set: {:?}), sources {:?}, recover {:?}",
                plan.point,
                plan.rollbacks
                    .iter()
                    .map(|(o, e)| (o, e.len()))
                    .collect::<Vec<_>>(),
                plan.source_rollbacks
                    .iter()
                    .map(|(o, s, e)| (o, s, e.len()))
                    .collect::<Vec<_>>(),
                plan.sources,
                plan.recover
            )
        });
        if let Some(r) = self.ec_proc(id).and_then(|p| p.runs.get_mut(&pgid)) {
            r.plan = Some(plan);
        }
        let all = rollbacks.into_iter().map(|(o, e)| (o, None, e)).chain(
            source_rollbacks
                .into_iter()
                .map(|(o, s, e)| (o, Some(s), e)),
        );
        for (osd, shard, entries) in all {
            if osd == id {
                match shard.filter(|s| self.ec_shard_of_copy(id, pgid) != Some(*s)) {
                    Some(s) => self.ec_rollback_parked(id, pgid, s, &entries)?,
                    None => self.ec_rollback_local(id, pgid, &entries),
                }
                continue;
            }
            self.ec_run_call(id, osd, pgid, run, |call| Msg::EcRollback {
                call,
                pgid,
                from: id,
                epoch,
                entries,
                shard,
            });
        }
        self.ec_advance(id, pgid);
        Ok(())
    }

    /// Undoes `entries` (oldest first) on this OSD's shard, newest first.
    pub fn ec_rollback_local(&mut self, id: i32, pgid: PgId, entries: &[LogEntry]) {
        for e in entries.iter().rev() {
            let ops = match self.coll(id, pgid) {
                Some(c) => rollback_ops(pgid, c, e),
                None => Vec::new(),
            };
            if !ops.is_empty() {
                self.submit_pub(id, ops);
            }
        }
        // The undone entries leave the log too (`log_after_rollback`).
        if let Some(sp) = self.pg_mut(id, pgid) {
            let log: Vec<LogEntry> = sp.pg.log().cloned().collect();
            let (info, log) = log_after_rollback(&sp.pg.info, &log, entries);
            sp.pg.reload(info.clone(), log.clone());
            let info = sp.pg.info.clone();
            self.submit_pub(
                id,
                vec![TxOp::LogReplace(pgid, log), TxOp::Info(pgid, info)],
            );
        }
        self.flush_pub(id);
    }

    /// Undoes `entries` (oldest first) in the copy of position `shard`
    /// this OSD parked (a rebuild source outside the acting set), and drops
    /// them from its log and info, as the runtime's
    /// `ec_peering::rollback_other_copy`. Parked copies are durable.
    fn ec_rollback_parked(
        &mut self,
        id: i32,
        pgid: PgId,
        shard: u8,
        entries: &[LogEntry],
    ) -> Result<(), String> {
        let Some(c) = self
            .osds
            .get_mut(&id)
            .and_then(|o| o.disk.parked.remove(&(pgid, shard)))
        else {
            return Err(format!(
                "osd.{id} keeps no copy of shard {shard} of pg {pgid}"
            ));
        };
        let mut d = crate::disk::DiskState::default();
        d.colls.insert(pgid, c);
        for e in entries.iter().rev() {
            let ops = rollback_ops(pgid, &d.colls[&pgid], e);
            for op in &ops {
                d.apply(op);
            }
        }
        let mut c = d.colls.remove(&pgid).unwrap_or_default();
        if let Some(info) = c.info.clone() {
            let log: Vec<LogEntry> = c.log.values().cloned().collect();
            let (info, log) = log_after_rollback(&info, &log, entries);
            c.log = log.iter().map(|e| (e.version.seq, e.clone())).collect();
            c.info = Some(info);
        }
        if let Some(o) = self.osds.get_mut(&id) {
            o.disk.parked.insert((pgid, shard), c);
        }
        Ok(())
    }

    /// A shard's side of a rollback request.
    pub fn ec_on_rollback(
        &mut self,
        id: i32,
        from: Ep,
        call: u64,
        pgid: PgId,
        entries: Vec<LogEntry>,
        shard: Option<u8>,
    ) {
        let parked = shard.filter(|s| self.ec_shard_of_copy(id, pgid) != Some(*s));
        let result = match parked {
            Some(s) => self.ec_rollback_parked(id, pgid, s, &entries),
            None if self.coll(id, pgid).is_some() => {
                self.ec_rollback_local(id, pgid, &entries);
                Ok(())
            }
            None => Err(format!("osd.{id} has no copy of pg {pgid}")),
        };
        self.send(
            Ep::Osd(id),
            from,
            Msg::EcRollbackReply {
                call,
                from: id,
                result,
            },
        );
    }

    /// Shards needing a backfill get the PG's object list from a source.
    fn ec_list(&mut self, id: i32, pgid: PgId) -> Result<(), String> {
        let r = self
            .ec_proc(id)
            .and_then(|p| p.runs.get_mut(&pgid))
            .ok_or("no run")?;
        r.phase = Phase::List;
        let plan = r.plan.as_ref().ok_or("no plan")?;
        let backfill = plan
            .recover
            .iter()
            .any(|(_, _, p)| matches!(p, RecoveryPlan::Backfill));
        if !backfill {
            self.ec_advance(id, pgid);
            return Ok(());
        }
        let (src, osd) = *plan
            .sources
            .first()
            .ok_or("no up-to-date shard to list objects from")?;
        let run = r.id;
        if osd == id {
            let all: Vec<(u32, ObjectName)> = self
                .copy_of_position(id, pgid, src as u8)
                .map(|c| {
                    c.objects
                        .keys()
                        .filter(|n| !internal(n))
                        .map(|n| (n.hash(), n.clone()))
                        .collect()
                })
                .unwrap_or_default();
            if let Some(r) = self.ec_proc(id).and_then(|p| p.runs.get_mut(&pgid)) {
                r.listing = Some(all);
            }
        } else {
            self.ec_run_call(id, osd, pgid, run, |call| Msg::Pull {
                call,
                pgid,
                what: PullWhat::List {
                    after: None,
                    limit: 100_000,
                },
                shard: Some(src as u8),
            });
        }
        self.ec_advance(id, pgid);
        Ok(())
    }

    /// Reads, from every source shard, the chunks of the objects to rebuild.
    fn ec_read_sources(&mut self, id: i32, pgid: PgId) -> Result<(), String> {
        let r = self
            .ec_proc(id)
            .and_then(|p| p.runs.get_mut(&pgid))
            .ok_or("no run")?;
        r.phase = Phase::Read;
        let plan = r.plan.as_ref().ok_or("no plan")?;
        let mut names: BTreeSet<ObjectName> = BTreeSet::new();
        for (_, _, p) in &plan.recover {
            match p {
                RecoveryPlan::UpToDate => {}
                RecoveryPlan::Log { objects } => names.extend(objects.iter().cloned()),
                RecoveryPlan::Backfill => {
                    names.extend(r.listing.iter().flatten().map(|(_, n)| n.clone()))
                }
            }
        }
        let sources: Vec<(usize, i32)> = plan.sources.clone();
        let run = r.id;
        if names.is_empty() {
            self.ec_advance(id, pgid);
            return Ok(());
        }
        let want: Vec<(u32, ObjectName)> = names.iter().map(|n| (n.hash(), n.clone())).collect();
        for (s, osd) in sources {
            if osd == id {
                let local: Vec<(ObjectName, Option<ObjectState>)> = names
                    .iter()
                    .map(|n| {
                        (
                            n.clone(),
                            self.copy_of_position(id, pgid, s as u8)
                                .and_then(|c| c.objects.get(n))
                                .cloned(),
                        )
                    })
                    .collect();
                if let Some(r) = self.ec_proc(id).and_then(|p| p.runs.get_mut(&pgid)) {
                    for (n, st) in local {
                        match st {
                            Some(st) => r.chunks.entry(n).or_default().push((s, chunk_data(&st))),
                            None => *r.absent.entry(n).or_default() += 1,
                        }
                    }
                }
                continue;
            }
            let w = want.clone();
            self.ec_run_call(id, osd, pgid, run, |call| Msg::Pull {
                call,
                pgid,
                what: PullWhat::Objects(w),
                shard: Some(s as u8),
            });
        }
        self.ec_advance(id, pgid);
        Ok(())
    }

    /// Rebuilds each behind shard's chunks from k sources and delivers them.
    fn ec_push(&mut self, id: i32, pgid: PgId) -> Result<(), String> {
        let epoch = self.osd_epoch_pub(id);
        let r = self
            .ec_proc(id)
            .and_then(|p| p.runs.get_mut(&pgid))
            .ok_or("no run")?;
        r.phase = Phase::Push;
        let plan = r.plan.clone().ok_or("no plan")?;
        let mut deliveries = Vec::new();
        for (shard, osd, p) in &plan.recover {
            let (names, keep_only): (Vec<ObjectName>, Option<Vec<(u32, ObjectName)>>) = match p {
                RecoveryPlan::UpToDate => continue,
                RecoveryPlan::Log { objects } => (objects.clone(), None),
                RecoveryPlan::Backfill => {
                    let all = r.listing.clone().unwrap_or_default();
                    (all.iter().map(|(_, n)| n.clone()).collect(), Some(all))
                }
            };
            let mut objects = Vec::new();
            for n in names {
                // A source may hold the very position rebuilt (a copy
                // outside the acting set): its chunk is then taken as is.
                let found: Vec<(usize, EcChunkData)> =
                    r.chunks.get(&n).cloned().unwrap_or_default();
                let absent = r.absent.get(&n).copied().unwrap_or(0);
                let st = rebuild_from_chunks(&r.ec.code, &n, *shard, &found, absent, Vec::new())?;
                objects.push((n.hash(), n, st));
            }
            deliveries.push((*osd, objects, keep_only));
        }
        let run = r.id;
        for (osd, objects, keep_only) in deliveries {
            let push = PgPush {
                pgid,
                from: id,
                epoch,
                objects,
                keep_only,
                finish: None,
            };
            if osd == id {
                self.install_push_pub(id, &push)?;
                continue;
            }
            self.ec_run_call(id, osd, pgid, run, |call| Msg::Push { call, push });
        }
        self.ec_advance(id, pgid);
        Ok(())
    }

    /// Every acting shard adopts the authoritative log (a push with
    /// `finish`; this OSD's own copy last, once they all answered).
    fn ec_finish(&mut self, id: i32, pgid: PgId) -> Result<(), String> {
        let epoch = self.osd_epoch_pub(id);
        let r = self
            .ec_proc(id)
            .and_then(|p| p.runs.get_mut(&pgid))
            .ok_or("no run")?;
        r.phase = Phase::Finish;
        let (new_info, log) = new_info_of(r, pgid)?;
        let members = r.ec.live_members();
        let run = r.id;
        for osd in members {
            if osd == id {
                continue;
            }
            let push = PgPush {
                pgid,
                from: id,
                epoch,
                objects: Vec::new(),
                keep_only: None,
                finish: Some((new_info.clone(), log.clone())),
            };
            self.ec_run_call(id, osd, pgid, run, |call| Msg::Push { call, push });
        }
        self.ec_advance(id, pgid);
        Ok(())
    }

    fn ec_complete(&mut self, id: i32, pgid: PgId) -> Result<(), String> {
        let r = self
            .ec_proc(id)
            .and_then(|p| p.runs.remove(&pgid))
            .ok_or("no run")?;
        let (new_info, log) = new_info_of(&r, pgid)?;
        // What activation found (the runtime's `report_activated`): the
        // backfill targets — up members whose position another OSD, or
        // nobody, serves under pg_temp — each resuming where its copy of
        // that position recorded it, and the strays (copies outside the
        // acting and up sets, removed once clean or once the backfill is
        // complete).
        let targets: Vec<BackfillStart> =
            r.ec.backfill_targets()
                .into_iter()
                .map(|(shard, osd)| BackfillStart {
                    osd,
                    resume: ec_resume_point(&r.notes, osd, shard, &new_info, &log),
                })
                .collect();
        let strays: Vec<i32> = r
            .notes
            .keys()
            .copied()
            .filter(|o| !r.ec.shards.contains(o) && !r.ec.up_shards.contains(o))
            .collect();
        self.submit_pub(
            id,
            vec![
                TxOp::LogReplace(pgid, log.clone()),
                TxOp::Info(pgid, new_info.clone()),
            ],
        );
        self.flush_pub(id);
        self.trace(|| {
            format!(
                "osd.{id} pg {pgid}: EC activated at {} ({} entries, les {})",
                new_info.last_update,
                log.len(),
                new_info.last_epoch_started.0
            )
        });
        self.ec_drop_parked(id, pgid, false);
        // As the runtime: the backfill starts before the first op is
        // admitted (its start messages precede every sub-op).
        let current = self
            .pg_mut(id, pgid)
            .is_some_and(|s| s.pg.info.same_interval_since == r.interval_since);
        if current {
            if let Some(s) = self.pg_mut(id, pgid) {
                s.strays = strays;
            }
            if !targets.is_empty() {
                self.backfill_start(id, pgid, r.interval_since, targets, &new_info, &log);
            }
        }
        self.pg_event_pub(
            id,
            pgid,
            PgEvent::PeeringDone {
                interval_since: r.interval_since,
                result: Ok((new_info, log)),
            },
        );
        self.after_activation(id, pgid);
        Ok(())
    }

    /// Whether an EC activation of `pgid` runs on this OSD.
    pub(crate) fn ec_running(&self, id: i32, pgid: PgId) -> bool {
        self.osds
            .get(&id)
            .and_then(|o| o.proc_.as_ref())
            .is_some_and(|p| p.ec.runs.contains_key(&pgid))
    }

    /// Background backfill of an EC PG: each of `names`' chunk for
    /// target `osd`'s up position, rebuilt with the real
    /// `rebuild_from_chunks` from the acting shards (the runtime's
    /// `read_ec_batch` / `rebuild_chunk`). The simulator reads the sources'
    /// live copies at once instead of by message: the runtime's PG actor
    /// waits for those reads and admits no write meanwhile, and a batch
    /// stops before an object with a write in flight, so the copies cannot
    /// change while they are read. A source that is not running or is cut
    /// off from this OSD counts as a failed read.
    pub(crate) fn ec_backfill_chunks(
        &self,
        id: i32,
        pgid: PgId,
        osd: i32,
        names: &[ObjectName],
    ) -> Result<Vec<(u32, ObjectName, Option<ObjectState>)>, String> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let m = self.ec_map(id).ok_or("no map")?;
        let ec = EcPg::from_map(&m, pgid.pool.0, pgid.seed)?
            .ok_or_else(|| format!("pg {pgid} is not erasure-coded"))?;
        let shard = ec
            .up_shard_of(osd)
            .ok_or_else(|| format!("osd.{osd} holds no shard of the up set any more"))?;
        let sources: Vec<(usize, i32)> = ec
            .shards
            .iter()
            .copied()
            .enumerate()
            .filter(|&(_, o)| o != SHARD_HOLE)
            .collect();
        let mut out = Vec::with_capacity(names.len());
        for n in names {
            let mut found = Vec::new();
            let mut absent = 0;
            let mut failures = Vec::new();
            for &(s, o) in &sources {
                let reachable = o == id
                    || (self.osds.get(&o).is_some_and(|x| x.proc_.is_some())
                        && !self.blocked(Ep::Osd(id), Ep::Osd(o))
                        && !self.blocked(Ep::Osd(o), Ep::Osd(id)));
                if !reachable {
                    failures.push(format!("shard {s}: osd.{o} did not answer"));
                    continue;
                }
                match self.copy_of_position(o, pgid, s as u8) {
                    Some(c) => match c.objects.get(n) {
                        Some(st) => found.push((s, chunk_data(st))),
                        None => absent += 1,
                    },
                    None => failures.push(format!("shard {s}: osd.{o} has no copy of it")),
                }
            }
            let st = rebuild_from_chunks(&ec.code, n, shard, &found, absent, failures)?;
            out.push((n.hash(), n.clone(), st));
        }
        Ok(out)
    }

    /// Drops a PG's EC run (a new interval began).
    pub fn ec_drop_run(&mut self, id: i32, pgid: PgId) {
        if let Some(p) = self.ec_proc(id) {
            p.runs.remove(&pgid);
        }
    }

    // ---- the oracle ----

    /// Once healed, for each EC object: every shard position of the acting
    /// set holds, durably, exactly the chunk the codec makes of the last
    /// acknowledged value, and decoding from k of them gives that value.
    pub fn ec_final_problems(&self, obj: u32, acked: Option<bytes::Bytes>) -> Vec<String> {
        let mut out = Vec::new();
        let pgid = self.pg_of(obj);
        let Ok(Some(ec)) = EcPg::from_map(&self.map, POOL, pgid.seed) else {
            return vec![format!("obj{obj}: pg {pgid} is not erasure-coded")];
        };
        let oid = World::object_name(obj);
        let want = acked.as_ref().map(|v| expected_chunks(&ec, v));
        let mut slots: Vec<Option<bytes::Bytes>> = vec![None; ec.code.total()];
        for (s, &o) in ec.shards.iter().enumerate() {
            if o == SHARD_HOLE {
                out.push(format!("obj{obj} (pg {pgid}): shard {s} has no OSD"));
                continue;
            }
            let st = self
                .osds
                .get(&o)
                .and_then(|d| d.disk.durable.colls.get(&pgid))
                .and_then(|c| c.objects.get(&oid));
            let mark = self
                .osds
                .get(&o)
                .and_then(|d| d.disk.durable.colls.get(&pgid))
                .and_then(|c| c.objects.get(&shard_mark()))
                .and_then(|m| m.data.first().copied());
            if mark != Some(s as u8) {
                out.push(format!(
                    "pg {pgid}: osd.{o} serves shard {s} but its copy holds shard {mark:?}"
                ));
            }
            let info_shard = st
                .and_then(|st| st.attrs.iter().find(|(k, _)| k == ATTR_EC))
                .and_then(|(_, v)| cairn_ec::ChunkInfo::decode(v).ok())
                .map(|i| i.shard as usize);
            match (&want, st) {
                (None, None) => {}
                (Some(w), Some(st)) if st.data == w[s] && info_shard == Some(s) => {
                    slots[s] = Some(st.data.clone());
                }
                (w, st) => out.push(format!(
                    "obj{obj} (pg {pgid}) shard {s} on osd.{o}: {} (chunk info shard {info_shard:?}), acknowledged {}",
                    match st {
                        None => "no chunk".to_string(),
                        Some(st) => format!("chunk of {} bytes, version {}", st.data.len(), version_of(st)),
                    },
                    if w.is_some() { "a value" } else { "nothing" }
                )),
            }
        }
        if let (Some(v), true) = (&acked, out.is_empty()) {
            // Decode from the last k positions (parity included when m > 0).
            let n = ec.code.total();
            let k = ec.code.k();
            let subset: Vec<Option<bytes::Bytes>> = slots
                .iter()
                .enumerate()
                .map(|(i, c)| if i >= n - k { c.clone() } else { None })
                .collect();
            match ec.code.decode(&subset, v.len() as u64) {
                Ok(d) if d == *v => {}
                other => out.push(format!(
                    "obj{obj} (pg {pgid}): decoding shards {}..{n} gave {other:?}",
                    n - k
                )),
            }
        }
        out
    }
}

/// The info and log every shard adopts at the end of `r`.
fn new_info_of(r: &EcRun, pgid: PgId) -> Result<(PgInfo, Vec<LogEntry>), String> {
    let plan = r.plan.as_ref().ok_or("no plan")?;
    let info = PgInfo {
        pgid: Some(pgid),
        last_epoch_started: r.epoch,
        same_interval_since: r.interval_since,
        last_active_acting: r.acting.clone(),
        ..plan.info.clone()
    };
    Ok((info, plan.log.clone()))
}
