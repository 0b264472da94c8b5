//! Durable monitor storage in one redb file (`mon.redb` in the mon's data
//! dir): the Raft log, the vote, the committed log id, the applied state
//! machine, the latest snapshot and the last [`MAX_INCREMENTALS_KEPT`]
//! incremental commands for subscribers. Every write is a redb transaction
//! committed with fsync before openraft is told it is done, so a mon that
//! restarts comes back with everything it acknowledged.
//!
//! This module does not decide anything: openraft drives it.
//!
//! Write transactions (each ends in an fsync) run on tokio's blocking pool
//! ([`off_runtime`]): a node daemon's monitor shares its async workers with
//! the node's OSDs, and an fsync held on a worker would stall their I/O.

// openraft's traits fix `StorageError` (large) as the error type here.
#![allow(clippy::result_large_err)]

use crate::state::MapState;
use crate::types::{ApplyResult, LogEntry, MonId, MonPeer, MonRaftConfig, Proposal, StorageError};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    AnyError, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta,
    StorageIOError, StoredMembership, Vote,
};
use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::{Arc, RwLock};
use tokio::sync::watch;

/// How many incremental commands are kept for subscribers; a subscriber
/// further behind gets the full map.
pub const MAX_INCREMENTALS_KEPT: u64 = 500;
/// Largest record we decode from our own disk (a map is far smaller).
const RECORD_MAX_BYTES: usize = 256 << 20;
/// On-disk format version of every record in the file.
const RECORD_VERSION: u8 = 1;

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const INCS: TableDefinition<u64, &[u8]> = TableDefinition::new("incrementals");

const KEY_VOTE: &str = "vote";
const KEY_COMMITTED: &str = "committed";
const KEY_PURGED: &str = "last_purged";
const KEY_SM: &str = "state_machine";
const KEY_SNAPSHOT: &str = "snapshot";

fn io_err(e: impl std::fmt::Display) -> StorageError {
    StorageIOError::<MonId>::write(AnyError::error(e.to_string())).into()
}

fn enc<T: Serialize>(v: &T) -> Vec<u8> {
    cairn_types::encode_versioned(RECORD_VERSION, v)
}

fn dec<T: DeserializeOwned>(what: &'static str, b: &[u8]) -> Result<T, StorageError> {
    cairn_types::decode_versioned(what, b, RECORD_VERSION, RECORD_VERSION, RECORD_MAX_BYTES)
        .map(|(_, v)| v)
        .map_err(io_err)
}

/// Opens (or creates) the mon's database and its tables.
pub fn open_db(dir: &Path) -> Result<Arc<Database>, StorageError> {
    std::fs::create_dir_all(dir).map_err(io_err)?;
    let db = Database::create(dir.join("mon.redb")).map_err(io_err)?;
    let tx = db.begin_write().map_err(io_err)?;
    tx.open_table(LOG).map_err(io_err)?;
    tx.open_table(META).map_err(io_err)?;
    tx.open_table(INCS).map_err(io_err)?;
    tx.commit().map_err(io_err)?;
    Ok(Arc::new(db))
}

fn meta_get<T: DeserializeOwned>(
    db: &Database,
    key: &'static str,
) -> Result<Option<T>, StorageError> {
    let rtx = db.begin_read().map_err(io_err)?;
    let t = rtx.open_table(META).map_err(io_err)?;
    match t.get(key).map_err(io_err)? {
        Some(v) => Ok(Some(dec(key, v.value())?)),
        None => Ok(None),
    }
}

/// Runs `work` (a write transaction and its fsync) on tokio's blocking
/// pool when called inside a runtime, inline otherwise (start-up code).
async fn off_runtime<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, StorageError> {
    if tokio::runtime::Handle::try_current().is_err() {
        return work();
    }
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| io_err(format!("monitor store write task: {e}")))?
}

async fn meta_put<T: Serialize>(
    db: &Arc<Database>,
    key: &'static str,
    v: &T,
) -> Result<(), StorageError> {
    let (db, value) = (db.clone(), enc(v));
    off_runtime(move || {
        let tx = db.begin_write().map_err(io_err)?;
        {
            let mut t = tx.open_table(META).map_err(io_err)?;
            t.insert(key, value.as_slice()).map_err(io_err)?;
        }
        tx.commit().map_err(io_err)
    })
    .await
}

/// The Raft log and vote.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
}

impl LogStore {
    pub fn new(db: Arc<Database>) -> LogStore {
        LogStore { db }
    }
}

impl RaftLogReader<MonRaftConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<LogEntry>, StorageError> {
        let rtx = self.db.begin_read().map_err(io_err)?;
        let t = rtx.open_table(LOG).map_err(io_err)?;
        let start = match range.start_bound() {
            Bound::Included(s) => Bound::Included(*s),
            Bound::Excluded(s) => Bound::Excluded(*s),
            Bound::Unbounded => Bound::Unbounded,
        };
        let end = match range.end_bound() {
            Bound::Included(s) => Bound::Included(*s),
            Bound::Excluded(s) => Bound::Excluded(*s),
            Bound::Unbounded => Bound::Unbounded,
        };
        let mut out = Vec::new();
        for item in t.range::<u64>((start, end)).map_err(io_err)? {
            let (_, v) = item.map_err(io_err)?;
            out.push(dec("raft log entry", v.value())?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<MonRaftConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<MonRaftConfig>, StorageError> {
        let last_purged: Option<LogId<MonId>> = meta_get(&self.db, KEY_PURGED)?;
        let rtx = self.db.begin_read().map_err(io_err)?;
        let t = rtx.open_table(LOG).map_err(io_err)?;
        let last = match t.last().map_err(io_err)? {
            Some((_, v)) => {
                let e: LogEntry = dec("raft log entry", v.value())?;
                Some(e.log_id)
            }
            None => last_purged,
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<MonId>) -> Result<(), StorageError> {
        meta_put(&self.db, KEY_VOTE, vote).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<MonId>>, StorageError> {
        meta_get(&self.db, KEY_VOTE)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<MonId>>,
    ) -> Result<(), StorageError> {
        meta_put(&self.db, KEY_COMMITTED, &committed).await
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<MonId>>, StorageError> {
        Ok(meta_get::<Option<LogId<MonId>>>(&self.db, KEY_COMMITTED)?.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<MonRaftConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = LogEntry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let records: Vec<(u64, Vec<u8>)> = entries
            .into_iter()
            .map(|e| (e.log_id.index, enc(&e)))
            .collect();
        let db = self.db.clone();
        let res = off_runtime(move || {
            let tx = db.begin_write().map_err(io_err)?;
            {
                let mut t = tx.open_table(LOG).map_err(io_err)?;
                for (index, record) in &records {
                    t.insert(*index, record.as_slice()).map_err(io_err)?;
                }
            }
            // Commit is durable (fsync) before we report the entries flushed.
            tx.commit().map_err(io_err)
        })
        .await;
        match res {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(e)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<MonId>) -> Result<(), StorageError> {
        let db = self.db.clone();
        off_runtime(move || {
            let tx = db.begin_write().map_err(io_err)?;
            {
                let mut t = tx.open_table(LOG).map_err(io_err)?;
                t.retain_in(log_id.index.., |_, _| false).map_err(io_err)?;
            }
            tx.commit().map_err(io_err)
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId<MonId>) -> Result<(), StorageError> {
        let (db, purged) = (self.db.clone(), enc(&Some(log_id)));
        off_runtime(move || {
            let tx = db.begin_write().map_err(io_err)?;
            {
                let mut m = tx.open_table(META).map_err(io_err)?;
                m.insert(KEY_PURGED, purged.as_slice()).map_err(io_err)?;
                let mut t = tx.open_table(LOG).map_err(io_err)?;
                t.retain_in(..=log_id.index, |_, _| false).map_err(io_err)?;
            }
            tx.commit().map_err(io_err)
        })
        .await
    }
}

/// The applied state as persisted: the map (if the cluster was created),
/// the last applied log id and the membership.
#[derive(Clone, Serialize, Deserialize)]
struct SmRecord {
    last_applied: Option<LogId<MonId>>,
    membership: StoredMembership<MonId, MonPeer>,
    state: Option<Vec<u8>>,
}

#[derive(Serialize, Deserialize)]
struct SnapshotRecord {
    meta: SnapshotMeta<MonId, MonPeer>,
    data: Vec<u8>,
}

/// In-memory view of the applied state, shared with the mon for reads.
pub struct Applied<S> {
    pub last_applied: Option<LogId<MonId>>,
    pub membership: StoredMembership<MonId, MonPeer>,
    pub state: Option<S>,
}

/// What a subscriber needs to catch up from a given epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Catchup {
    /// Already current.
    UpToDate { epoch: u64 },
    /// Encoded commands for epochs `from+1..=to`, in order.
    Incrementals {
        from: u64,
        to: u64,
        commands: Vec<Vec<u8>>,
    },
    /// The whole map, encoded.
    Full { epoch: u64, state: Vec<u8> },
    /// The cluster has no map yet.
    NoMap,
}

/// The Raft state machine: applies proposals to a [`MapState`].
pub struct StateMachineStore<S: MapState> {
    db: Arc<Database>,
    shared: Arc<RwLock<Applied<S>>>,
    epoch_tx: Arc<watch::Sender<u64>>,
}

impl<S: MapState> Clone for StateMachineStore<S> {
    fn clone(&self) -> Self {
        StateMachineStore {
            db: self.db.clone(),
            shared: self.shared.clone(),
            epoch_tx: self.epoch_tx.clone(),
        }
    }
}

impl<S: MapState> StateMachineStore<S> {
    /// Loads the applied state from disk.
    pub fn open(db: Arc<Database>) -> Result<StateMachineStore<S>, StorageError> {
        let rec: Option<SmRecord> = meta_get(&db, KEY_SM)?;
        let applied = match rec {
            Some(r) => Applied {
                last_applied: r.last_applied,
                membership: r.membership,
                state: match r.state {
                    Some(b) => Some(S::decode_state(&b).map_err(io_err)?),
                    None => None,
                },
            },
            None => Applied {
                last_applied: None,
                membership: StoredMembership::default(),
                state: None,
            },
        };
        let epoch = applied.state.as_ref().map(|s| s.epoch()).unwrap_or(0);
        let (tx, _) = watch::channel(epoch);
        Ok(StateMachineStore {
            db,
            shared: Arc::new(RwLock::new(applied)),
            epoch_tx: Arc::new(tx),
        })
    }

    /// The shared in-memory view (read locks only outside this module).
    pub fn shared(&self) -> Arc<RwLock<Applied<S>>> {
        self.shared.clone()
    }

    /// A receiver that sees every new epoch.
    pub fn subscribe_epochs(&self) -> watch::Receiver<u64> {
        self.epoch_tx.subscribe()
    }

    fn read(&self) -> Result<std::sync::RwLockReadGuard<'_, Applied<S>>, StorageError> {
        self.shared
            .read()
            .map_err(|_| io_err("state machine lock poisoned by a panic"))
    }

    fn write(&self) -> Result<std::sync::RwLockWriteGuard<'_, Applied<S>>, StorageError> {
        self.shared
            .write()
            .map_err(|_| io_err("state machine lock poisoned by a panic"))
    }

    fn record(applied: &Applied<S>) -> SmRecord {
        SmRecord {
            last_applied: applied.last_applied,
            membership: applied.membership.clone(),
            state: applied.state.as_ref().map(|s| s.encode_state()),
        }
    }

    /// What a subscriber at `have_epoch` needs (0 = nothing yet).
    pub fn catchup(&self, have_epoch: u64) -> Result<Catchup, StorageError> {
        let (epoch, full) = {
            let g = self.read()?;
            match &g.state {
                None => return Ok(Catchup::NoMap),
                Some(s) => (s.epoch(), s.encode_state()),
            }
        };
        if have_epoch >= epoch {
            return Ok(Catchup::UpToDate { epoch });
        }
        if have_epoch > 0 {
            let rtx = self.db.begin_read().map_err(io_err)?;
            let t = rtx.open_table(INCS).map_err(io_err)?;
            let mut commands = Vec::new();
            let mut expect = have_epoch + 1;
            for item in t.range(expect..=epoch).map_err(io_err)? {
                let (k, v) = item.map_err(io_err)?;
                if k.value() != expect {
                    break;
                }
                commands.push(v.value().to_vec());
                expect += 1;
            }
            if expect == epoch + 1 {
                return Ok(Catchup::Incrementals {
                    from: have_epoch,
                    to: epoch,
                    commands,
                });
            }
        }
        Ok(Catchup::Full { epoch, state: full })
    }

    /// Number of incrementals currently kept (for tests and status).
    pub fn incrementals_kept(&self) -> Result<u64, StorageError> {
        let rtx = self.db.begin_read().map_err(io_err)?;
        let t = rtx.open_table(INCS).map_err(io_err)?;
        t.len().map_err(io_err)
    }

    fn apply_one(
        applied: &mut Applied<S>,
        entry: &LogEntry,
        incs: &mut Vec<(u64, Vec<u8>)>,
    ) -> ApplyResult {
        applied.last_applied = Some(entry.log_id);
        let before = applied.state.as_ref().map(|s| s.epoch()).unwrap_or(0);
        let outcome = match &entry.payload {
            EntryPayload::Blank => Ok(Default::default()),
            EntryPayload::Membership(m) => {
                applied.membership = StoredMembership::new(Some(entry.log_id), m.clone());
                Ok(Default::default())
            }
            EntryPayload::Normal(Proposal::Genesis(bytes)) => match &applied.state {
                Some(_) => Err("the cluster map already exists; genesis refused".to_string()),
                None => S::genesis(bytes).map(|s| {
                    applied.state = Some(s);
                    Default::default()
                }),
            },
            EntryPayload::Normal(Proposal::Command(bytes)) => match applied.state.as_mut() {
                None => Err("the cluster has no map yet (bootstrap not finished)".to_string()),
                Some(s) => {
                    // Apply on a copy so a failed command leaves nothing behind.
                    let mut next = s.clone();
                    match next.apply_command(bytes) {
                        Ok(out) => {
                            if next.epoch() != before {
                                incs.push((next.epoch(), bytes.clone()));
                            }
                            *s = next;
                            Ok(out)
                        }
                        Err(e) => Err(e),
                    }
                }
            },
        };
        let epoch = applied.state.as_ref().map(|s| s.epoch()).unwrap_or(0);
        debug_assert!(epoch >= before, "epochs only grow");
        ApplyResult { epoch, outcome }
    }
}

impl<S: MapState> RaftSnapshotBuilder<MonRaftConfig> for StateMachineStore<S> {
    async fn build_snapshot(&mut self) -> Result<Snapshot<MonRaftConfig>, StorageError> {
        let (meta, data) = {
            let g = self.read()?;
            let data = enc(&Self::record(&g));
            let id = match g.last_applied {
                Some(l) => format!("{}-{}-{}", l.leader_id.term, l.leader_id.node_id, l.index),
                None => "empty".to_string(),
            };
            (
                SnapshotMeta {
                    last_log_id: g.last_applied,
                    last_membership: g.membership.clone(),
                    snapshot_id: id,
                },
                data,
            )
        };
        let rec = SnapshotRecord {
            meta: meta.clone(),
            data: data.clone(),
        };
        meta_put(&self.db, KEY_SNAPSHOT, &rec).await?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl<S: MapState> RaftStateMachine<MonRaftConfig> for StateMachineStore<S> {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<MonId>>, StoredMembership<MonId, MonPeer>), StorageError> {
        let g = self.read()?;
        Ok((g.last_applied, g.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<ApplyResult>, StorageError>
    where
        I: IntoIterator<Item = LogEntry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut results = Vec::new();
        let mut incs = Vec::new();
        let (record, epoch) = {
            let mut g = self.write()?;
            for entry in entries {
                results.push(Self::apply_one(&mut g, &entry, &mut incs));
            }
            let epoch = g.state.as_ref().map(|s| s.epoch()).unwrap_or(0);
            (Self::record(&g), epoch)
        };
        let (db, record) = (self.db.clone(), enc(&record));
        off_runtime(move || {
            let tx = db.begin_write().map_err(io_err)?;
            {
                let mut m = tx.open_table(META).map_err(io_err)?;
                m.insert(KEY_SM, record.as_slice()).map_err(io_err)?;
                let mut t = tx.open_table(INCS).map_err(io_err)?;
                for (e, b) in &incs {
                    t.insert(*e, b.as_slice()).map_err(io_err)?;
                }
                if epoch > MAX_INCREMENTALS_KEPT {
                    let floor = epoch - MAX_INCREMENTALS_KEPT;
                    t.retain_in(..=floor, |_, _| false).map_err(io_err)?;
                }
            }
            tx.commit().map_err(io_err)
        })
        .await?;
        self.epoch_tx.send_replace(epoch);
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<MonId, MonPeer>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let rec: SmRecord = dec("snapshot", &data)?;
        let state = match &rec.state {
            Some(b) => Some(S::decode_state(b).map_err(io_err)?),
            None => None,
        };
        let epoch = state.as_ref().map(|s| s.epoch()).unwrap_or(0);
        let new = SmRecord {
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
            state: rec.state,
        };
        let snap = SnapshotRecord {
            meta: meta.clone(),
            data,
        };
        let (db, sm, snap) = (self.db.clone(), enc(&new), enc(&snap));
        off_runtime(move || {
            let tx = db.begin_write().map_err(io_err)?;
            {
                let mut m = tx.open_table(META).map_err(io_err)?;
                m.insert(KEY_SM, sm.as_slice()).map_err(io_err)?;
                m.insert(KEY_SNAPSHOT, snap.as_slice()).map_err(io_err)?;
                // Incrementals before a snapshot are unknown here:
                // subscribers behind it get the full map.
                let mut t = tx.open_table(INCS).map_err(io_err)?;
                t.retain_in::<u64, _>(.., |_, _| false).map_err(io_err)?;
            }
            tx.commit().map_err(io_err)
        })
        .await?;
        {
            let mut g = self.write()?;
            g.last_applied = meta.last_log_id;
            g.membership = meta.last_membership.clone();
            g.state = state;
        }
        self.epoch_tx.send_replace(epoch);
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<MonRaftConfig>>, StorageError> {
        let rec: Option<SnapshotRecord> = meta_get(&self.db, KEY_SNAPSHOT)?;
        Ok(rec.map(|r| Snapshot {
            meta: r.meta,
            snapshot: Box::new(Cursor::new(r.data)),
        }))
    }
}
