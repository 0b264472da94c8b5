//! Activation I/O for issue 5's simple, safe peering: the primary queries
//! the acting set and the members of past intervals, picks the
//! authoritative log (newest `last_epoch_started`, then newest
//! `last_update`), refuses to activate if an interval that may have
//! accepted writes has no member answering, pulls what it lacks, and pushes
//! missing or divergent objects (or a full backfill) to every acting member
//! before the PG serves I/O. Decisions come from `pg::plan_recovery` and
//! `pg::check_can_activate`; this module only moves the bytes. Also the
//! member side of pull and push.

use crate::exec;
use crate::pg::{check_can_activate, plan_recovery, PastInterval, RecoveryPlan};
use crate::runtime::{Shared, META_INFO};
use cairn_ops::{
    decode, encode, msg_type, ListCursor, LogEntry, ObjectName, ObjectState, PgInfo, PgNotify,
    PgPull, PgPush, PgPushReply, PgQuery, PullReply, PullWhat,
};
use cairn_store::{CollectionId, Store, StoreError, Transaction};
use cairn_types::{Epoch, PgId};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

/// Log entries read per store call.
const LOG_READ_PAGE: usize = 1024;
/// Objects per pull or push batch, at most (bytes are bounded too).
const RECOVERY_BATCH_OBJECTS: usize = 64;
/// Objects per backfill listing page.
const BACKFILL_LIST_PAGE: u32 = 512;

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

/// Member side of a pull.
pub(crate) fn serve_pull(store: &Store, coll: CollectionId, what: &PullWhat) -> PullReply {
    match what {
        PullWhat::Objects(names) => {
            let mut out = Vec::with_capacity(names.len());
            for (h, n) in names {
                match exec::get_object_state(store, coll, n) {
                    Ok(st) => out.push((*h, n.clone(), st)),
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

/// Installs objects in one transaction (replacing whole state).
fn install_objects(
    store: &Store,
    coll: CollectionId,
    txn: &mut Transaction,
    objects: &[(u32, ObjectName, Option<ObjectState>)],
) -> Result<(), String> {
    for (_, name, st) in objects {
        let exists = store
            .exists(&coll, &exec::store_oid(name))
            .map_err(|e| e.to_string())?;
        exec::put_object_state(txn, coll, name, exists, st.as_ref());
    }
    Ok(())
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

/// Member side of a push.
pub(crate) async fn install_push(
    store: &Arc<Store>,
    coll: CollectionId,
    push: &PgPush,
) -> Result<(), String> {
    let mut txn = Transaction::new();
    install_objects(store, coll, &mut txn, &push.objects)?;
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
    store
        .submit(txn)
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| e.to_string())
}

/// One activation run of a primary.
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
}

type Notes = BTreeMap<i32, (PgInfo, Vec<LogEntry>)>;

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
        let (_, conn) = self.shared.peer(osd).await?;
        let m = conn
            .call(ty, payload, self.shared.cfg.peer_timeout)
            .await
            .map_err(|e| e.to_string())?;
        decode(what, &m.payload).map_err(|e| e.to_string())
    }

    /// Runs activation; Ok = the new info and log (already on disk here and
    /// on every acting member); Err = why the PG cannot activate now.
    pub async fn run(self) -> Result<(PgInfo, Vec<LogEntry>), String> {
        // Our own log may hold entries submitted but not yet durable.
        let mut t = Transaction::new();
        t.meta_set(self.coll, META_INFO, encode(&self.my_info));
        commit(&self.shared.store, t).await?;
        self.ensure_up_thru().await?;
        let map = self.shared.map_rx.borrow().clone();
        let me = self.me();
        let mut notes: Notes = BTreeMap::new();
        notes.insert(me, (self.my_info.clone(), self.my_log.clone()));
        for &o in &self.probe {
            if o == me || !map.osds.get(&o).is_some_and(|i| i.up) {
                continue;
            }
            let q = PgQuery {
                pgid: self.pgid,
                from: me,
                epoch: self.epoch,
            };
            match self
                .call::<PgNotify>(o, msg_type::PG_QUERY, encode(&q), "pg notify")
                .await
            {
                Ok(n) => {
                    if let Some(info) = n.info {
                        notes.insert(o, (info, n.log));
                    }
                }
                Err(e) if self.acting.contains(&o) => {
                    return Err(format!("acting member osd.{o} did not answer: {e}"))
                }
                Err(e) => tracing::info!("pg {}: osd.{o} did not answer: {e}", self.pgid),
            }
        }
        let (auth_id, (auth_info, auth_log)) = notes
            .iter()
            .max_by_key(|(_, (i, _))| (i.last_epoch_started, i.last_update))
            .map(|(k, v)| (*k, v.clone()))
            .ok_or("no copy of the PG answered")?;
        let responders: Vec<i32> = notes.keys().copied().collect();
        check_can_activate(&self.past, auth_info.last_epoch_started, &responders)?;
        tracing::debug!(
            "pg {} e{}: authoritative copy on osd.{auth_id} (les {}, last_update {}, tail {}); responders {responders:?}",
            self.pgid,
            self.epoch.0,
            auth_info.last_epoch_started.0,
            auth_info.last_update,
            auth_info.log_tail
        );
        if auth_id != me {
            let plan = plan_recovery(
                &auth_info,
                &auth_log,
                Some((&self.my_info, &self.my_log[..])),
            );
            tracing::debug!(
                "pg {}: recovering osd.{me} from osd.{auth_id}: {plan:?}",
                self.pgid
            );
            self.recover_self(auth_id, plan).await?;
        }
        let new_info = PgInfo {
            pgid: Some(self.pgid),
            last_epoch_started: self.epoch,
            same_interval_since: self.interval_since,
            last_active_acting: self.acting.clone(),
            ..auth_info.clone()
        };
        for &m in &self.acting {
            if m == me {
                continue;
            }
            let member = notes.get(&m).map(|(i, l)| (i, &l[..]));
            let plan = plan_recovery(&auth_info, &auth_log, member);
            tracing::debug!("pg {}: bringing osd.{m} up to date: {plan:?}", self.pgid);
            self.push_to(m, plan, &new_info, &auth_log).await?;
        }
        let mut txn = Transaction::new();
        replace_log(&mut txn, self.coll, &new_info, &auth_log);
        self.shared
            .store
            .submit(txn)
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| e.to_string())?;
        Ok((new_info, auth_log))
    }

    /// Has the monitors record `up_thru >= interval_since` for this OSD
    /// (so later primaries know this interval may have accepted writes).
    pub(crate) async fn ensure_up_thru(&self) -> Result<(), String> {
        let Some(mon) = &self.shared.mon else {
            return Ok(());
        };
        let me = self.me();
        let want = self.interval_since;
        let has = |m: &cairn_map::ClusterMap| m.osds.get(&me).is_some_and(|o| o.up_thru >= want);
        if has(&self.shared.map_rx.borrow()) {
            return Ok(());
        }
        mon.send(cairn_map::MonCommand::OsdAlive { id: me, want })
            .await
            .map_err(|_| "the monitor link is closed".to_string())?;
        let mut rx = self.shared.map_rx.clone();
        let r = tokio::time::timeout(self.shared.cfg.peer_timeout, rx.wait_for(|m| has(m))).await;
        match r {
            Ok(Ok(_)) => Ok(()),
            _ => Err(format!(
                "waiting for the monitors to record up_thru {} for osd.{me}",
                want.0
            )),
        }
    }

    async fn pull_objects(
        &self,
        from: i32,
        names: Vec<(u32, ObjectName)>,
    ) -> Result<Vec<(u32, ObjectName, Option<ObjectState>)>, String> {
        let p = PgPull {
            pgid: self.pgid,
            from: self.me(),
            epoch: self.epoch,
            what: PullWhat::Objects(names),
        };
        match self
            .call::<PullReply>(from, msg_type::PG_PULL, encode(&p), "pull reply")
            .await?
        {
            PullReply::Objects(o) => Ok(o),
            PullReply::Refused(e) => Err(format!("osd.{from} refused a pull: {e}")),
            PullReply::List { .. } => Err(format!("osd.{from} answered a pull with a list")),
        }
    }

    /// Brings this OSD's copy to the authoritative one on `auth`.
    async fn recover_self(&self, auth: i32, plan: RecoveryPlan) -> Result<(), String> {
        let store = &self.shared.store;
        let names: Vec<(u32, ObjectName)> = match &plan {
            RecoveryPlan::UpToDate => return Ok(()),
            RecoveryPlan::Log { objects } => {
                objects.iter().map(|o| (o.hash(), o.clone())).collect()
            }
            RecoveryPlan::Backfill => {
                let mut all = Vec::new();
                let mut after = None;
                loop {
                    let p = PgPull {
                        pgid: self.pgid,
                        from: self.me(),
                        epoch: self.epoch,
                        what: PullWhat::List {
                            after,
                            limit: BACKFILL_LIST_PAGE,
                        },
                    };
                    match self
                        .call::<PullReply>(auth, msg_type::PG_PULL, encode(&p), "pull reply")
                        .await?
                    {
                        PullReply::List { objects, next } => {
                            all.extend(objects);
                            match next {
                                Some(c) => after = Some(c),
                                None => break,
                            }
                        }
                        PullReply::Refused(e) => return Err(format!("osd.{auth}: {e}")),
                        PullReply::Objects(_) => return Err("unexpected pull reply".into()),
                    }
                }
                let keep: HashSet<ObjectName> = all.iter().map(|(_, n)| n.clone()).collect();
                let mut txn = Transaction::new();
                for (_, n) in list_all(store, self.coll)? {
                    if !keep.contains(&n) {
                        txn.remove(self.coll, exec::store_oid(&n));
                    }
                }
                commit(store, txn).await?;
                all
            }
        };
        for chunk in names.chunks(RECOVERY_BATCH_OBJECTS) {
            let objs = self.pull_objects(auth, chunk.to_vec()).await?;
            let mut txn = Transaction::new();
            install_objects(store, self.coll, &mut txn, &objs)?;
            commit(store, txn).await?;
        }
        Ok(())
    }

    /// Pushes what member `m` lacks, then the final info and log.
    async fn push_to(
        &self,
        m: i32,
        plan: RecoveryPlan,
        info: &PgInfo,
        log: &[LogEntry],
    ) -> Result<(), String> {
        let store = &self.shared.store;
        let (names, keep_only) = match plan {
            RecoveryPlan::UpToDate => (Vec::new(), None),
            RecoveryPlan::Log { objects } => {
                (objects.into_iter().map(|o| (o.hash(), o)).collect(), None)
            }
            RecoveryPlan::Backfill => {
                let all = list_all(store, self.coll)?;
                (all.clone(), Some(all))
            }
        };
        let mut batch: Vec<(u32, ObjectName, Option<ObjectState>)> = Vec::new();
        let mut bytes = 0u64;
        for (h, n) in names {
            let st = exec::get_object_state(store, self.coll, &n).map_err(|e| e.to_string())?;
            bytes += st.as_ref().map(|s| s.bytes()).unwrap_or(0);
            batch.push((h, n, st));
            if batch.len() >= RECOVERY_BATCH_OBJECTS
                || bytes >= self.shared.cfg.recovery_batch_bytes
            {
                self.push(m, std::mem::take(&mut batch), None, None).await?;
                bytes = 0;
            }
        }
        self.push(m, batch, keep_only, Some((info.clone(), log.to_vec())))
            .await
    }

    async fn push(
        &self,
        m: i32,
        objects: Vec<(u32, ObjectName, Option<ObjectState>)>,
        keep_only: Option<Vec<(u32, ObjectName)>>,
        finish: Option<(PgInfo, Vec<LogEntry>)>,
    ) -> Result<(), String> {
        let p = PgPush {
            pgid: self.pgid,
            from: self.me(),
            epoch: self.epoch,
            objects,
            keep_only,
            finish,
        };
        let r: PgPushReply = self
            .call(m, msg_type::PG_PUSH, encode(&p), "push reply")
            .await?;
        r.result
            .map_err(|e| format!("osd.{m} failed to install a recovery push: {e}"))
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
