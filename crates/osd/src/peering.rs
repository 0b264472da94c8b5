//! Activation I/O of a replicated PG: `PeeringJob` drives the pure
//! `peering_sm::Peering` machine (which makes every decision: up_thru,
//! queries, the authoritative log, the refusal to activate without a member
//! of every interval that may have written, pulls and pushes) with the real
//! store and peer connections. Also the member side of query, pull and
//! push, and the store helpers the EC activation shares.

use crate::backfill::{recovery_slot, CopyTicket, RecoverySlot};
use crate::exec;
use crate::peering_sm::{
    copy_batch_full, pull_reply_bytes, ObjectCopy, Peering, PeeringInput, PeeringOutput,
    PeeringParams, ALONE_OBJECT_BYTES, BACKFILL_LIST_PAGE, RECOVERY_PULL_WINDOW,
};
use crate::pg::PastInterval;
use crate::runtime::{blocking_store_call, Shared, META_INFO};
use cairn_msg::{BlockCrcs, KnownCrc};
use cairn_ops::{
    decode, decode_shared, encode, encode_parts, msg_type, ListCursor, LogEntry, ObjectName,
    ObjectState, PgInfo, PgNotify, PgPull, PgPush, PgPushReply, PgQuery, PullReply, PullWhat,
};
use cairn_store::{CollectionId, Store, StoreError, Transaction};
use cairn_types::{Epoch, PgId};
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use tokio::task::JoinSet;

/// Log entries read per store call.
const LOG_READ_PAGE: usize = 1024;

/// The whole PG log of `coll`, oldest first.
pub(crate) fn read_log(store: &Store, coll: CollectionId) -> Result<Vec<LogEntry>, StoreError> {
    let mut out = Vec::new();
    let mut from = 0u64;
    loop {
        let page = store.log_range(&coll, from, LOG_READ_PAGE)?;
        let n = page.len();
        for (idx, b) in page {
            let e: LogEntry =
                decode("pg log entry", &b).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            out.push(e);
            from = idx + 1;
        }
        if n < LOG_READ_PAGE {
            return Ok(out);
        }
    }
}

/// Member side of a pull. An object reply stops once it holds `max_bytes`
/// of object state (at least one object), and before a second big object
/// (see [`copy_batch_full`]): the puller asks again for the names left
/// out, so a pull of many large objects never builds a message over the
/// messenger's limit.
pub(crate) fn serve_pull(
    store: &Store,
    coll: CollectionId,
    what: &PullWhat,
    max_bytes: u64,
) -> PullReply {
    match what {
        PullWhat::Objects(names) => {
            let mut out = Vec::with_capacity(names.len());
            let (mut bytes, mut big) = (0u64, false);
            for (h, n) in names {
                let next = stored_bytes(store, coll, n);
                if copy_batch_full(out.len(), bytes, big, next, max_bytes) {
                    break;
                }
                match exec::get_object_state(store, coll, n) {
                    Ok(st) => {
                        let w = st.as_ref().map(|s| s.bytes()).unwrap_or(0);
                        bytes += w;
                        big |= w >= ALONE_OBJECT_BYTES;
                        out.push((*h, n.clone(), st));
                    }
                    Err(e) => return PullReply::Refused(format!("reading {n}: {e}")),
                }
            }
            PullReply::Objects(out)
        }
        PullWhat::List { after, limit } => {
            match exec::list_objects(store, coll, after.as_ref(), *limit) {
                Ok((objects, next)) => PullReply::List { objects, next },
                Err(e) => PullReply::Refused(e.to_string()),
            }
        }
    }
}

/// Data bytes of `name`'s head in `coll` as the store's metadata says
/// (no data read; 0 when it does not exist or cannot be stat'ed): sizes a
/// copy message before the object is read.
pub(crate) fn stored_bytes(store: &Store, coll: CollectionId, name: &ObjectName) -> u64 {
    store
        .stat(&coll, &exec::store_oid(name))
        .map(|st| st.size)
        .unwrap_or(0)
}

/// Every object of `coll` (backfill scans).
pub(crate) fn list_all(
    store: &Store,
    coll: CollectionId,
) -> Result<Vec<(u32, ObjectName)>, String> {
    let mut out = Vec::new();
    let mut after: Option<ListCursor> = None;
    loop {
        let (objs, next) = exec::list_objects(store, coll, after.as_ref(), BACKFILL_LIST_PAGE)
            .map_err(|e| e.to_string())?;
        out.extend(objs);
        match next {
            Some(c) => after = Some(c),
            None => return Ok(out),
        }
    }
}

/// A push or pull being metered: its ticket, bytes and objects.
type MeteredCopy = (CopyTicket, u64, u64);

/// Bytes and count of objects being copied (recovery meter).
pub(crate) fn copy_size(objects: &[ObjectCopy]) -> (u64, u64) {
    let bytes = objects
        .iter()
        .map(|(_, _, s)| s.as_ref().map(|s| s.bytes()).unwrap_or(0))
        .sum();
    (bytes, objects.len() as u64)
}

/// Installs objects in one transaction (replacing whole state). `blocks`:
/// the verified block crcs of the message that carried them (see
/// [`BlockCrcs`]), which the store keeps instead of computing its own for
/// the objects' data.
pub(crate) fn install_objects(
    store: &Store,
    coll: CollectionId,
    txn: &mut Transaction,
    objects: &[(u32, ObjectName, Option<ObjectState>)],
    blocks: &[Arc<BlockCrcs>],
) -> Result<(), String> {
    let crcs_of = |d: &bytes::Bytes| blocks.iter().find_map(|b| b.of(d)).map(Arc::from);
    for (_, name, st) in objects {
        let exists = store
            .exists(&coll, &exec::store_oid(name))
            .map_err(|e| e.to_string())?;
        exec::put_object_state_known(txn, coll, name, exists, st.as_ref(), &crcs_of);
    }
    Ok(())
}

/// The crcs of the object data segments of `parts` (a copy message
/// encoded with [`encode_parts`]) that the objects' store reads gave
/// ([`ObjectState::data_crc`]): the messenger combines the frame's crc
/// from them instead of reading the data again.
pub(crate) fn known_object_crcs(parts: &[bytes::Bytes], objects: &[ObjectCopy]) -> Vec<KnownCrc> {
    let states = objects
        .iter()
        .filter_map(|(_, _, st)| st.as_ref())
        .flat_map(|st| std::iter::once(st).chain(st.clones.iter().map(|(_, c)| c)));
    let mut known = Vec::new();
    for st in states {
        let (Some(crc), d) = (st.data_crc, &st.data) else {
            continue;
        };
        let seg = parts
            .iter()
            .position(|p| !d.is_empty() && p.as_ptr() == d.as_ptr() && p.len() == d.len());
        if let Some(segment) = seg {
            known.push(KnownCrc { segment, crc });
        }
    }
    known
}

/// Replaces the log and info of `coll` in `txn`.
pub(crate) fn replace_log(
    txn: &mut Transaction,
    coll: CollectionId,
    info: &PgInfo,
    log: &[LogEntry],
) {
    txn.log_trim(coll, u64::MAX);
    for e in log {
        txn.log_append(coll, e.version.seq, encode(e));
    }
    txn.meta_set(coll, META_INFO, encode(info));
}

/// Member side of a push: the store transaction that installs it
/// (`blocks`: the push message's verified block crcs).
pub(crate) fn push_txn(
    store: &Store,
    coll: CollectionId,
    push: &PgPush,
    blocks: Option<&Arc<BlockCrcs>>,
) -> Result<Transaction, String> {
    let mut txn = Transaction::new();
    let blocks: Vec<Arc<BlockCrcs>> = blocks.into_iter().cloned().collect();
    install_objects(store, coll, &mut txn, &push.objects, &blocks)?;
    if let Some(keep) = &push.keep_only {
        let keep: HashSet<&ObjectName> = keep.iter().map(|(_, n)| n).collect();
        for (_, n) in list_all(store, coll)? {
            if !keep.contains(&n) && !push.objects.iter().any(|(_, o, _)| *o == n) {
                txn.remove(coll, exec::store_oid(&n));
            }
        }
    }
    if let Some((info, log)) = &push.finish {
        replace_log(&mut txn, coll, info, log);
    }
    Ok(txn)
}

/// One activation run of a primary: the I/O around the pure
/// [`Peering`] machine (and the base of the EC activation job).
pub(crate) struct PeeringJob {
    pub shared: Arc<Shared>,
    pub pgid: PgId,
    pub coll: CollectionId,
    pub epoch: Epoch,
    pub interval_since: Epoch,
    pub acting: Vec<i32>,
    pub probe: Vec<i32>,
    pub past: Vec<PastInterval>,
    pub my_info: PgInfo,
    pub my_log: Vec<LogEntry>,
    /// The up set and the pool's size and min_size.
    pub up: Vec<i32>,
    pub size: u32,
    pub min_size: u32,
    /// Filled with the machine's `Activated` output (backfill targets and
    /// strays) for the PG actor.
    pub activated: Arc<std::sync::Mutex<Option<Activated>>>,
}

/// Backfill targets and stray copies an activation found.
pub(crate) type Activated = (Vec<crate::peering_sm::BackfillStart>, Vec<i32>);

/// One request/response call to a peer OSD, bounded by `peer_timeout`.
async fn call_peer<T: serde::de::DeserializeOwned>(
    shared: &Arc<Shared>,
    osd: i32,
    ty: u16,
    payload: bytes::Bytes,
    what: &'static str,
) -> Result<T, String> {
    call_peer_parts(shared, osd, ty, vec![payload], Vec::new(), what)
        .await
        .map(|(t, _)| t)
}

/// [`call_peer`] with the request as segments (`encode_parts`: object data
/// is not copied into one buffer; `known`: crcs of some of them); object
/// data in the reply shares the received buffer (`decode_shared`), whose
/// verified block crcs come with it when the messenger has them.
async fn call_peer_parts<T: serde::de::DeserializeOwned>(
    shared: &Arc<Shared>,
    osd: i32,
    ty: u16,
    payload: Vec<bytes::Bytes>,
    known: Vec<KnownCrc>,
    what: &'static str,
) -> Result<(T, Option<Arc<BlockCrcs>>), String> {
    let (_, conn) = shared.peer(osd).await?;
    let m = conn
        .call_parts_known(ty, payload, known, shared.cfg.peer_timeout)
        .await
        .map_err(|e| e.to_string())?;
    let t = decode_shared(what, &m.payload).map_err(|e| e.to_string())?;
    Ok((t, m.blocks))
}

/// Sends `q` to `osd` and decodes its answer from either notify layout
/// ([`PgNotify::decode`]: an older OSD's answer has no kept copies).
pub(crate) async fn query_peer(
    shared: &Arc<Shared>,
    osd: i32,
    q: &PgQuery,
) -> Result<PgNotify, String> {
    let (_, conn) = shared.peer(osd).await?;
    let m = conn
        .call_parts(msg_type::PG_QUERY, vec![encode(q)], shared.cfg.peer_timeout)
        .await
        .map_err(|e| e.to_string())?;
    PgNotify::decode(&m.payload).map_err(|e| e.to_string())
}

impl PeeringJob {
    fn me(&self) -> i32 {
        self.shared.cfg.id
    }

    pub(crate) async fn call<T: serde::de::DeserializeOwned>(
        &self,
        osd: i32,
        ty: u16,
        payload: bytes::Bytes,
        what: &'static str,
    ) -> Result<T, String> {
        call_peer(&self.shared, osd, ty, payload, what).await
    }

    fn up_thru_recorded(&self) -> bool {
        let me = self.me();
        self.shared.mon.is_none()
            || self
                .shared
                .map_rx
                .borrow()
                .osds
                .get(&me)
                .is_some_and(|o| o.up_thru >= self.interval_since)
    }

    /// Runs activation: drives the [`Peering`] machine, performing its
    /// local outputs in order and its remote calls concurrently. Ok = the
    /// new info and log (already on disk here and on every acting member);
    /// Err = why the PG cannot activate now.
    pub async fn run(self) -> Result<(PgInfo, Vec<LogEntry>), String> {
        // One snapshot of the map: a `watch::Ref` kept as a temporary of
        // this statement while a second `borrow()` is taken deadlocks the
        // map channel as soon as the monitor link is waiting to publish.
        let map = self.shared.map_rx.borrow().clone();
        let mut sm = Peering::new(PeeringParams {
            pgid: self.pgid,
            whoami: self.me(),
            epoch: self.epoch,
            interval_since: self.interval_since,
            acting: self.acting.clone(),
            probe: self.probe.clone(),
            past: self.past.clone(),
            my_info: self.my_info.clone(),
            my_log: self.my_log.clone(),
            up_thru_recorded: self.up_thru_recorded(),
            history: self
                .shared
                .mon
                .is_some()
                .then(|| map.pg_activations(self.pgid)),
            up_osds: map.osds.values().filter(|o| o.up).map(|o| o.id).collect(),
            batch_bytes: self.shared.cfg.recovery_batch_bytes,
            up: self.up.clone(),
            size: self.size,
            min_size: self.min_size,
            lost: map.lost_osds(),
            may_remap: self.shared.mon.is_some(),
        });
        let r = self.drive(&mut sm).await;
        self.shared.add_recovered(self.pgid, sm.recovered());
        r
    }

    /// Runs `sm` to its end (see `run`).
    async fn drive(&self, sm: &mut Peering) -> Result<(PgInfo, Vec<LogEntry>), String> {
        let mut todo: VecDeque<PeeringOutput> = sm.start().into();
        let mut calls: RemoteCalls = JoinSet::new();
        // A pull counts as copied once its objects are installed here.
        let mut pulled: Option<(CopyTicket, u64, u64)> = None;
        // The verified block crcs of pull replies not installed yet (the
        // objects' data shares their payloads), for the install.
        let mut pull_blocks: VecDeque<Arc<BlockCrcs>> = VecDeque::new();
        // The recovery slot taken before the last local read for pushes:
        // the pushes made of what it read hold it until acknowledged, so
        // objects read and not yet pushed count against the OSD's
        // `osd_recovery_max_active` and in-flight byte bound (a read
        // starts only once they allow it). The machine reads again only
        // once every batch of the previous read went out as a push.
        let mut read_slot: Option<Arc<RecoverySlot>> = None;
        loop {
            while let Some(out) = todo.pop_front() {
                match out {
                    PeeringOutput::Done(r) => return r,
                    PeeringOutput::RequestPgTemp { osds } => {
                        if let Some(mon) = &self.shared.mon {
                            let cmd = cairn_map::MonCommand::PgTemp {
                                from: self.me(),
                                pgid: self.pgid,
                                osds,
                            };
                            if mon.send(cmd).await.is_err() {
                                return Err("the monitor link is closed".into());
                            }
                        }
                    }
                    PeeringOutput::Activated { backfill, strays } => {
                        *self.activated.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some((backfill, strays));
                    }
                    PeeringOutput::AskUpThru { .. }
                    | PeeringOutput::Query { .. }
                    | PeeringOutput::PullList { .. }
                    | PeeringOutput::PullObjects { .. }
                    | PeeringOutput::Push { .. } => {
                        let slot = match &out {
                            PeeringOutput::Push { push, .. } if !push.objects.is_empty() => {
                                read_slot.clone()
                            }
                            _ => None,
                        };
                        let copy = match &out {
                            // Only pushes that carry objects count as copying.
                            PeeringOutput::Push { push, .. } if !push.objects.is_empty() => {
                                let (bytes, n) = copy_size(&push.objects);
                                Some((CopyTicket::new(&self.shared, None), bytes, n))
                            }
                            PeeringOutput::PullObjects { .. } => {
                                Some((CopyTicket::new(&self.shared, None), 0, 0))
                            }
                            _ => None,
                        };
                        let (shared, pgid, epoch) = (self.shared.clone(), self.pgid, self.epoch);
                        calls.spawn(async move {
                            let (input, blocks) = remote(shared, pgid, epoch, out, slot).await;
                            (input, copy, blocks)
                        });
                    }
                    local => {
                        if let PeeringOutput::ReadLocal { names } = &local {
                            // The previous read's slot goes first (its
                            // pushes keep it while they fly): no slot is
                            // held here while waiting for the next.
                            drop(read_slot.take());
                            let bytes = self.read_estimate(names);
                            read_slot = Some(Arc::new(recovery_slot(&self.shared, bytes).await));
                        }
                        let blocks = match &local {
                            PeeringOutput::InstallLocal { objects, .. } => {
                                take_blocks_of(&mut pull_blocks, objects)
                            }
                            _ => Vec::new(),
                        };
                        let input = self.local(local, &blocks).await;
                        if let Some((ticket, bytes, objects)) = pulled.take() {
                            match input {
                                PeeringInput::LocalCommitted => ticket.finish(bytes, objects),
                                _ => ticket.finish(0, 0),
                            }
                        }
                        todo.extend(sm.handle(input));
                    }
                }
            }
            let Some(joined) = calls.join_next().await else {
                return Err(format!(
                    "activation stalled waiting for {}",
                    sm.waiting_for()
                ));
            };
            let (input, ticket, blocks) =
                joined.map_err(|e| format!("activation call failed: {e}"))?;
            if let (PeeringInput::Pulled { .. }, Some(b)) = (&input, blocks) {
                pull_blocks.push_back(b);
                // Replies whose objects carry no whole block are never
                // taken by an install: the oldest go.
                while pull_blocks.len() > 2 * RECOVERY_PULL_WINDOW {
                    pull_blocks.pop_front();
                }
            }
            if let Some((ticket, bytes, n)) = ticket {
                match &input {
                    PeeringInput::Pulled { objects, .. } => {
                        let (bytes, n) = copy_size(objects);
                        pulled = Some((ticket, bytes, n));
                    }
                    PeeringInput::PushAcked { result: Ok(()), .. } => ticket.finish(bytes, n),
                    _ => ticket.finish(0, 0),
                }
            }
            todo.extend(sm.handle(input));
        }
    }

    /// Bytes a local read of `names` will hold, from the store's metadata
    /// (no data read).
    fn read_estimate(&self, names: &[(u32, ObjectName)]) -> u64 {
        let store = &self.shared.store;
        blocking_store_call(|| {
            names
                .iter()
                .map(|(_, n)| stored_bytes(store, self.coll, n))
                .sum()
        })
    }

    /// Performs one local output of the machine against the store
    /// (`blocks`: the verified block crcs of the pull replies whose
    /// objects it installs).
    async fn local(&self, out: PeeringOutput, blocks: &[Arc<BlockCrcs>]) -> PeeringInput {
        let store = &self.shared.store;
        let committed = |r: Result<(), String>| match r {
            Ok(()) => PeeringInput::LocalCommitted,
            Err(e) => PeeringInput::LocalFailed(e),
        };
        match out {
            PeeringOutput::PersistInfo(info) => {
                let mut t = Transaction::new();
                t.meta_set(self.coll, META_INFO, encode(&info));
                committed(commit(store, t).await)
            }
            PeeringOutput::ListLocal => match list_all(store, self.coll) {
                Ok(all) => PeeringInput::LocalListed(all),
                Err(e) => PeeringInput::LocalFailed(e),
            },
            // Off the async workers: a read of big objects blocks for a while.
            PeeringOutput::ReadLocal { names } => blocking_store_call(|| {
                let mut objects = Vec::with_capacity(names.len());
                for (h, n) in names {
                    match exec::get_object_state(store, self.coll, &n) {
                        Ok(st) => objects.push((h, n, st)),
                        Err(e) => return PeeringInput::LocalFailed(format!("reading {n}: {e}")),
                    }
                }
                PeeringInput::LocalRead(objects)
            }),
            PeeringOutput::InstallLocal { objects, remove } => {
                let mut txn = Transaction::new();
                if let Err(e) = install_objects(store, self.coll, &mut txn, &objects, blocks) {
                    return PeeringInput::LocalFailed(e);
                }
                for n in &remove {
                    txn.remove(self.coll, exec::store_oid(n));
                }
                committed(commit(store, txn).await)
            }
            PeeringOutput::ReplaceLog { info, log } => {
                let mut txn = Transaction::new();
                replace_log(&mut txn, self.coll, &info, &log);
                committed(commit(store, txn).await)
            }
            other => PeeringInput::LocalFailed(format!("not a local step: {other:?}")),
        }
    }

    /// Has the monitors record `up_thru >= interval_since` for this OSD
    /// and this activation (its acting set) in the PG's history, so later
    /// primaries know this interval may have accepted writes and whom to
    /// ask (EC activation; the replicated machine asks for the same).
    pub(crate) async fn ensure_up_thru(&self) -> Result<(), String> {
        let recorded = self
            .shared
            .map_rx
            .borrow()
            .pg_activation_recorded(self.pgid, &self.acting);
        let record = (self.shared.mon.is_some() && !recorded).then(|| {
            (
                self.pgid,
                cairn_map::PgActivation {
                    since: self.interval_since,
                    acting: self.acting.clone(),
                },
            )
        });
        if self.up_thru_recorded() && record.is_none() {
            return Ok(());
        }
        ask_up_thru(&self.shared, self.interval_since, record).await
    }
}

/// Has the monitors record `up_thru >= want` for this OSD and, with
/// `record`, a PG's activation in the map's PG history; waits (bounded)
/// for a map showing both.
async fn ask_up_thru(
    shared: &Arc<Shared>,
    want: Epoch,
    record: Option<(PgId, cairn_map::PgActivation)>,
) -> Result<(), String> {
    let Some(mon) = &shared.mon else {
        return Ok(());
    };
    let me = shared.cfg.id;
    let has = |m: &cairn_map::ClusterMap| {
        m.osds.get(&me).is_some_and(|o| o.up_thru >= want)
            && record
                .as_ref()
                .is_none_or(|(pgid, a)| m.pg_activation_recorded(*pgid, &a.acting))
    };
    let activating = record.iter().cloned().collect();
    mon.send(cairn_map::MonCommand::OsdAlive {
        id: me,
        want,
        activating,
    })
    .await
    .map_err(|_| "the monitor link is closed".to_string())?;
    let mut rx = shared.map_rx.clone();
    let r = tokio::time::timeout(shared.cfg.peer_timeout, rx.wait_for(|m| has(m))).await;
    match r {
        Ok(Ok(_)) => Ok(()),
        _ => Err(format!(
            "waiting for the monitors to record up_thru {} for osd.{me}",
            want.0
        )),
    }
}

/// Activation's remote calls in flight: each gives the machine's input,
/// the copy it meters, and a pull reply's verified block crcs.
type RemoteCalls = JoinSet<(PeeringInput, Option<MeteredCopy>, Option<Arc<BlockCrcs>>)>;

/// Takes from `pending` the block crcs of the pull replies whose data
/// `objects` share.
fn take_blocks_of(
    pending: &mut VecDeque<Arc<BlockCrcs>>,
    objects: &[ObjectCopy],
) -> Vec<Arc<BlockCrcs>> {
    let datas: Vec<&bytes::Bytes> = objects
        .iter()
        .filter_map(|(_, _, st)| st.as_ref())
        .flat_map(|st| std::iter::once(&st.data).chain(st.clones.iter().map(|(_, c)| &c.data)))
        .collect();
    let (used, kept): (VecDeque<_>, VecDeque<_>) = std::mem::take(pending)
        .into_iter()
        .partition(|b| datas.iter().any(|d| b.of(d).is_some()));
    *pending = kept;
    used.into()
}

/// Performs one remote output of the machine (for `pgid`, in map
/// `epoch`); the answer as its input, with a pull reply's verified block
/// crcs when the messenger has them.
/// A push that carries `slot` (taken before its objects were read) uses
/// it instead of taking one.
async fn remote(
    shared: Arc<Shared>,
    pgid: PgId,
    epoch: Epoch,
    out: PeeringOutput,
    slot: Option<Arc<RecoverySlot>>,
) -> (PeeringInput, Option<Arc<BlockCrcs>>) {
    match out {
        PeeringOutput::PullObjects { from, names } => {
            pull_objects(&shared, pgid, epoch, from, names).await
        }
        out => (remote_call(shared, pgid, epoch, out, slot).await, None),
    }
}

/// A pull of `names` from `from`, in a recovery slot.
async fn pull_objects(
    shared: &Arc<Shared>,
    pgid: PgId,
    epoch: Epoch,
    from: i32,
    names: Vec<(u32, ObjectName)>,
) -> (PeeringInput, Option<Arc<BlockCrcs>>) {
    let failed = |why: String| PeeringInput::PeerFailed { osd: from, why };
    let _slot = recovery_slot(shared, pull_reply_bytes(shared.cfg.recovery_batch_bytes)).await;
    let p = PgPull {
        pgid,
        from: shared.cfg.id,
        epoch,
        what: PullWhat::Objects(names),
        shard: None,
    };
    let r = call_peer_parts::<PullReply>(
        shared,
        from,
        msg_type::PG_PULL,
        vec![encode(&p)],
        Vec::new(),
        "pull reply",
    )
    .await;
    match r {
        Ok((PullReply::Objects(objects), blocks)) => {
            (PeeringInput::Pulled { from, objects }, blocks)
        }
        Ok((PullReply::Refused(e), _)) => (failed(format!("osd.{from} refused a pull: {e}")), None),
        Ok((PullReply::List { .. }, _)) => (
            failed(format!("osd.{from} answered a pull with a list")),
            None,
        ),
        Err(e) => (failed(e), None),
    }
}

/// [`remote`] of every output but a pull of objects.
async fn remote_call(
    shared: Arc<Shared>,
    pgid: PgId,
    epoch: Epoch,
    out: PeeringOutput,
    slot: Option<Arc<RecoverySlot>>,
) -> PeeringInput {
    let me = shared.cfg.id;
    let failed = |osd: i32, why: String| PeeringInput::PeerFailed { osd, why };
    match out {
        PeeringOutput::AskUpThru { want, record } => {
            match ask_up_thru(&shared, want, record.map(|r| (pgid, r))).await {
                Ok(()) => PeeringInput::UpThruRecorded,
                Err(e) => PeeringInput::UpThruFailed(e),
            }
        }
        PeeringOutput::Query { to } => {
            // An OSD the map shows down is not asked: it settles nothing
            // (an answer with no copy would: `pg::settled_osds`).
            let up = shared.map_rx.borrow().osds.get(&to).is_some_and(|i| i.up);
            if !up {
                return failed(to, format!("osd.{to} is down in the current map"));
            }
            let q = PgQuery {
                pgid,
                from: me,
                epoch,
            };
            match query_peer(&shared, to, &q).await {
                Ok(n) => PeeringInput::Notify {
                    from: to,
                    info: n.info,
                    log: n.log,
                },
                Err(e) => {
                    tracing::info!("pg {pgid}: osd.{to} did not answer: {e}");
                    failed(to, e)
                }
            }
        }
        PeeringOutput::PullList { from, after, limit } => {
            let p = PgPull {
                pgid,
                from: me,
                epoch,
                what: PullWhat::List { after, limit },
                shard: None,
            };
            match call_peer::<PullReply>(&shared, from, msg_type::PG_PULL, encode(&p), "pull reply")
                .await
            {
                Ok(PullReply::List { objects, next }) => PeeringInput::Listed {
                    from,
                    objects,
                    next,
                },
                Ok(PullReply::Refused(e)) => failed(from, format!("osd.{from}: {e}")),
                Ok(PullReply::Objects(_)) => failed(from, "unexpected pull reply".into()),
                Err(e) => failed(from, e),
            }
        }
        PeeringOutput::Push { to, push } => {
            // Pushes that copy objects hold a recovery slot (the
            // throttle): the one their read took, else their own; the
            // final push with only the log does not.
            let _slot = match (push.objects.is_empty(), slot) {
                (true, _) => None,
                (false, Some(s)) => Some(s),
                (false, None) => Some(Arc::new(
                    recovery_slot(&shared, copy_size(&push.objects).0).await,
                )),
            };
            let parts = encode_parts(&push);
            let known = known_object_crcs(&parts, &push.objects);
            match call_peer_parts::<PgPushReply>(
                &shared,
                to,
                msg_type::PG_PUSH,
                parts,
                known,
                "push reply",
            )
            .await
            {
                Ok((r, _)) => PeeringInput::PushAcked {
                    to,
                    result: r.result,
                },
                Err(e) => failed(to, e),
            }
        }
        other => PeeringInput::LocalFailed(format!("not a remote step: {other:?}")),
    }
}

pub(crate) async fn commit(store: &Store, txn: Transaction) -> Result<(), String> {
    if txn.is_empty() {
        return Ok(());
    }
    store
        .submit(txn)
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn state(data: Bytes, crc: Option<u32>) -> ObjectState {
        ObjectState {
            data,
            attrs: Vec::new(),
            omap: Vec::new(),
            clones: Vec::new(),
            data_crc: crc,
        }
    }

    #[test]
    fn a_copy_message_knows_the_crcs_of_its_objects_data_segments() {
        let a = Bytes::from(vec![1u8; 1 << 20]);
        let b = Bytes::from(vec![2u8; 1 << 20]);
        let c = Bytes::from(vec![3u8; 1 << 20]);
        let mut head = state(b.clone(), Some(crc32c::crc32c(&b)));
        head.clones
            .push((4, state(c.clone(), Some(crc32c::crc32c(&c)))));
        let push = PgPush {
            pgid: PgId {
                pool: cairn_types::PoolId(1),
                seed: 0,
            },
            from: 0,
            epoch: Epoch(3),
            objects: vec![
                // Read without a known crc: left to the messenger.
                (1, ObjectName::new("", "a"), Some(state(a.clone(), None))),
                (2, ObjectName::new("", "b"), Some(head)),
                (3, ObjectName::new("", "gone"), None),
            ],
            keep_only: None,
            finish: None,
        };
        let parts = encode_parts(&push);
        let known = known_object_crcs(&parts, &push.objects);
        assert_eq!(known.len(), 2);
        for k in &known {
            let seg = &parts[k.segment];
            assert!(seg.as_ptr() == b.as_ptr() || seg.as_ptr() == c.as_ptr());
            assert_eq!(k.crc, crc32c::crc32c(seg));
        }
    }
}
