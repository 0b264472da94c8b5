//! One simulated OSD disk: the PG collections (objects, log, info, past
//! intervals) as `live` state (every submitted transaction applied) and
//! `durable` state (only what a sync reached). Transactions become durable
//! in submission order (like the store's group commit); a crash throws the
//! unsynced ones away. Owns no timing: the world decides when a sync
//! happens. Also a capacity (a full disk refuses what does not fit, as the
//! store's `StoreFull`) and damaged objects (a read of one fails, as a
//! checksum mismatch or a read EIO would; rewriting the object heals it).
//! Usage as the OSD reports it to the monitor (its beacon's statfs): a
//! fixed size and the bytes other data takes (`filler_bytes`), which a
//! usage fault raises so the monitor's full marks come into play.
//! Not modelled: torn writes (the real store's own tests cover those).

use cairn_ops::{LogEntry, ObjectName, ObjectState, PgInfo};
use cairn_osd::pg::PastInterval;
use cairn_types::PgId;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// One PG's collection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Coll {
    pub objects: BTreeMap<ObjectName, ObjectState>,
    pub log: BTreeMap<u64, LogEntry>,
    pub info: Option<PgInfo>,
    pub past: Vec<PastInterval>,
    /// Objects whose stored bytes are damaged: reading them fails.
    pub damaged: BTreeSet<ObjectName>,
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
    /// Drop log entries with seq in `[from, upto]` (the store's
    /// `log_trim_from`): the OSD says no entry below `from` is left, and
    /// the model checks it.
    LogTrim {
        pg: PgId,
        from: u64,
        upto: u64,
    },
    LogReplace(PgId, Vec<LogEntry>),
    Info(PgId, PgInfo),
    Past(PgId, Vec<PastInterval>),
    /// Delete the whole collection (a stray copy removed).
    RemoveColl(PgId),
}

impl DiskState {
    pub(crate) fn apply(&mut self, op: &TxOp) {
        match op {
            TxOp::Put(pg, name, st) => {
                let c = self.colls.entry(*pg).or_default();
                c.damaged.remove(name);
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
            TxOp::LogTrim { pg, from, upto } => {
                let c = self.colls.entry(*pg).or_default();
                assert!(
                    c.log.range(..*from).next().is_none(),
                    "pg {pg}: log trim from {from} leaves older entries {:?}",
                    c.log.range(..*from).map(|(s, _)| s).collect::<Vec<_>>()
                );
                c.log = c.log.split_off(&(upto + 1));
            }
            TxOp::LogReplace(pg, log) => {
                self.colls.entry(*pg).or_default().log =
                    log.iter().map(|e| (e.version.seq, e.clone())).collect();
            }
            TxOp::Info(pg, i) => self.colls.entry(*pg).or_default().info = Some(i.clone()),
            TxOp::Past(pg, p) => self.colls.entry(*pg).or_default().past = p.clone(),
            TxOp::RemoveColl(pg) => {
                self.colls.remove(pg);
            }
        }
    }
}

impl DiskState {
    /// Object data bytes held (what the capacity counts).
    pub fn used_bytes(&self) -> u64 {
        self.colls
            .values()
            .flat_map(|c| c.objects.values())
            .map(|o| o.data.len() as u64)
            .sum()
    }
}

/// The size every simulated disk of a replicated run reports (its
/// beacon's total bytes). The workload's objects take at most a few KiB of
/// it, so the usage that crosses the monitor's ratios comes from
/// `SimDisk::filler_bytes`.
pub const REPORTED_TOTAL_BYTES: u64 = 64 * 1024;
/// The same for an erasure-coded run: every chunk is a whole stripe unit
/// (4 KiB), and shards moved or backfilled leave copies until the PG is
/// clean, so its disks hold a few hundred KiB of the workload's own.
pub const EC_REPORTED_TOTAL_BYTES: u64 = 16 << 20;

/// A disk with live and durable state.
#[derive(Debug, Clone, Default)]
pub struct SimDisk {
    /// Bytes other data takes on the disk (another pool, logs): counted in
    /// the usage the OSD reports, not in `capacity_bytes`.
    pub filler_bytes: u64,
    pub live: DiskState,
    pub durable: DiskState,
    /// Object data bytes the disk holds at most (None: unbounded).
    pub capacity_bytes: Option<u64>,
    /// The next sync fails with EIO (the OSD then stops: fail-stop).
    pub fail_next_sync: bool,
    /// EC: the collections of shard positions this OSD moved away from,
    /// by (PG, position), kept (durably) as the runtime keeps the old
    /// position's collection until the PG is clean; moving back takes it
    /// up again.
    pub parked: BTreeMap<(PgId, u8), Coll>,
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

    /// Bytes in use as the OSD reports them (at most the reported `total`).
    pub fn reported_used_bytes(&self, total: u64) -> u64 {
        (self.live.used_bytes() + self.filler_bytes).min(total)
    }

    /// Bytes still free (u64::MAX when unbounded).
    pub fn available_bytes(&self) -> u64 {
        match self.capacity_bytes {
            None => u64::MAX,
            Some(c) => c.saturating_sub(self.live.used_bytes()),
        }
    }

    /// Damages the stored bytes of `name` in `pg` (a bit flip the checksum
    /// catches, or a sector that returns EIO). Only an object with no
    /// unsynced change (live and durable agree) is damaged; returns whether
    /// it was.
    pub fn damage(&mut self, pg: PgId, name: &ObjectName) -> bool {
        let same = |d: &DiskState| d.colls.get(&pg).and_then(|c| c.objects.get(name)).cloned();
        match (same(&self.live), same(&self.durable)) {
            (Some(a), Some(b)) if a == b => {}
            _ => return false,
        }
        for d in [&mut self.live, &mut self.durable] {
            if let Some(c) = d.colls.get_mut(&pg) {
                c.damaged.insert(name.clone());
            }
        }
        true
    }

    /// Whether reading `name` in `pg` fails.
    pub fn is_damaged(&self, pg: PgId, name: &ObjectName) -> bool {
        self.live
            .colls
            .get(&pg)
            .is_some_and(|c| c.damaged.contains(name))
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
                data_crc: None,
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

    #[test]
    fn capacity_counts_live_data_and_damage_survives_a_crash_until_a_rewrite() {
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
                data_crc: None,
            })
        };
        let (a, b) = (ObjectName::new("", "a"), ObjectName::new("", "b"));
        let mut d = SimDisk::default();
        assert_eq!(d.available_bytes(), u64::MAX);
        let t = d.submit(vec![TxOp::Put(pg, a.clone(), obj(b"1234"))]);
        d.capacity_bytes = Some(10);
        assert_eq!(d.available_bytes(), 6);
        // Unsynced objects cannot be damaged (live and durable differ).
        assert!(!d.damage(pg, &a));
        d.sync_through(t);
        assert!(d.damage(pg, &a));
        assert!(d.is_damaged(pg, &a) && !d.is_damaged(pg, &b));
        d.crash();
        assert!(d.is_damaged(pg, &a), "damage is on the platter");
        d.submit(vec![TxOp::Put(pg, a.clone(), obj(b"12"))]);
        assert!(!d.is_damaged(pg, &a), "a rewrite heals it");
        assert_eq!(d.available_bytes(), 8);
    }
}
