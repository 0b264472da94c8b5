//! One simulated OSD disk: the PG collections (objects, log, info, past
//! intervals) as `live` state (every submitted transaction applied) and
//! `durable` state (only what a sync reached). Transactions become durable
//! in submission order (like the store's group commit); a crash throws the
//! unsynced ones away. Owns no timing: the world decides when a sync
//! happens. Not modelled: torn writes, checksums, space (the real store's
//! own tests cover those).

use cairn_ops::{LogEntry, ObjectName, ObjectState, PgInfo};
use cairn_osd::pg::PastInterval;
use cairn_types::PgId;
use std::collections::{BTreeMap, VecDeque};

/// One PG's collection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Coll {
    pub objects: BTreeMap<ObjectName, ObjectState>,
    pub log: BTreeMap<u64, LogEntry>,
    pub info: Option<PgInfo>,
    pub past: Vec<PastInterval>,
}

/// Every collection of a disk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiskState {
    pub colls: BTreeMap<PgId, Coll>,
}

/// One change of a transaction.
#[derive(Debug, Clone)]
pub enum TxOp {
    /// Replace an object's whole state (None: remove it).
    Put(PgId, ObjectName, Option<ObjectState>),
    LogAppend(PgId, LogEntry),
    /// Drop log entries with seq <= this.
    LogTrim(PgId, u64),
    LogReplace(PgId, Vec<LogEntry>),
    Info(PgId, PgInfo),
    Past(PgId, Vec<PastInterval>),
}

impl DiskState {
    fn apply(&mut self, op: &TxOp) {
        match op {
            TxOp::Put(pg, name, st) => {
                let c = self.colls.entry(*pg).or_default();
                match st {
                    Some(s) => {
                        c.objects.insert(name.clone(), s.clone());
                    }
                    None => {
                        c.objects.remove(name);
                    }
                }
            }
            TxOp::LogAppend(pg, e) => {
                self.colls
                    .entry(*pg)
                    .or_default()
                    .log
                    .insert(e.version.seq, e.clone());
            }
            TxOp::LogTrim(pg, upto) => {
                let c = self.colls.entry(*pg).or_default();
                c.log = c.log.split_off(&(upto + 1));
            }
            TxOp::LogReplace(pg, log) => {
                self.colls.entry(*pg).or_default().log =
                    log.iter().map(|e| (e.version.seq, e.clone())).collect();
            }
            TxOp::Info(pg, i) => self.colls.entry(*pg).or_default().info = Some(i.clone()),
            TxOp::Past(pg, p) => self.colls.entry(*pg).or_default().past = p.clone(),
        }
    }
}

/// A disk with live and durable state.
#[derive(Debug, Clone, Default)]
pub struct SimDisk {
    pub live: DiskState,
    pub durable: DiskState,
    /// Submitted, not yet durable, oldest first.
    pending: VecDeque<(u64, Vec<TxOp>)>,
    next_txn: u64,
}

impl SimDisk {
    /// Applies `ops` to the live state; returns the transaction's id.
    pub fn submit(&mut self, ops: Vec<TxOp>) -> u64 {
        for op in &ops {
            self.live.apply(op);
        }
        self.next_txn += 1;
        self.pending.push_back((self.next_txn, ops));
        self.next_txn
    }

    /// Makes every transaction up to `id` durable; returns the ids made so.
    pub fn sync_through(&mut self, id: u64) -> Vec<u64> {
        let mut done = Vec::new();
        while self.pending.front().is_some_and(|(t, _)| *t <= id) {
            if let Some((t, ops)) = self.pending.pop_front() {
                for op in &ops {
                    self.durable.apply(op);
                }
                done.push(t);
            }
        }
        done
    }

    /// Everything submitted is durable now.
    pub fn sync_all(&mut self) -> Vec<u64> {
        self.sync_through(u64::MAX)
    }

    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Power loss: unsynced transactions are gone.
    pub fn crash(&mut self) {
        self.pending.clear();
        self.live = self.durable.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_types::PoolId;

    #[test]
    fn a_crash_drops_exactly_the_unsynced_transactions() {
        let pg = PgId {
            pool: PoolId(1),
            seed: 0,
        };
        let obj = |d: &[u8]| {
            Some(ObjectState {
                data: bytes::Bytes::copy_from_slice(d),
                attrs: vec![],
                omap: vec![],
                clones: vec![],
            })
        };
        let name = ObjectName::new("", "a");
        let mut d = SimDisk::default();
        let t1 = d.submit(vec![TxOp::Put(pg, name.clone(), obj(b"1"))]);
        d.submit(vec![TxOp::Put(pg, name.clone(), obj(b"2"))]);
        assert_eq!(d.sync_through(t1), vec![t1]);
        d.crash();
        assert_eq!(d.live.colls[&pg].objects[&name].data.as_ref(), b"1");
        assert_eq!(d.live, d.durable);
    }
}
