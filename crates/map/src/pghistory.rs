//! The PG history the map keeps (`ClusterMap::pg_history`): for each
//! PG, the acting sets it may have gone active with, oldest first (an
//! erasure-coded PG's acting set with its holes dropped). A primary has its acting set recorded (with its `up_thru`, in one
//! `OsdAlive`) before the PG accepts a write, so any later primary — even
//! one new to the PG whose old holders are all down — learns from the map
//! which copies may hold acknowledged writes, and stays down until one of
//! them answers or is declared lost. This module owns recording (checked
//! against the current placement), its bound and its clean-up; the OSD's
//! peering decides what the entries mean.

use crate::model::{ClusterMap, PgActivation, PoolKind};
use cairn_types::{Epoch, PgId};

/// Entries kept per PG at most (the oldest go first). A PG needs the
/// entries since the newest activation any surviving copy took part in;
/// more than this many acting-set changes without one is not expected.
pub const PG_HISTORY_MAX: usize = 16;

impl ClusterMap {
    /// Records that `from`, the primary of each PG named, is about to
    /// activate it with the given acting set. An entry is skipped (the OSD
    /// sees the newer map and starts over) when `from` is not the PG's
    /// acting primary with that acting set in this map, or a newer interval
    /// is already recorded. An acting set equal to the newest entry's adds
    /// nothing: the entry already names those copies.
    pub(crate) fn record_activations(&mut self, from: i32, activating: &[(PgId, PgActivation)]) {
        for (pgid, act) in activating {
            let Some(pool) = self.pools.get(&pgid.pool.0) else {
                continue;
            };
            if pgid.seed >= pool.pg_num {
                continue;
            }
            let ec = pool.kind == PoolKind::Erasure;
            let current = match self.pg_to_up(pgid.pool.0, pgid.seed) {
                Ok(m) => m,
                Err(_) => continue,
            };
            // EC: positions with no OSD are not members.
            let acting: Vec<i32> = current
                .acting
                .iter()
                .copied()
                .filter(|&o| !ec || o != cairn_crush::CRUSH_ITEM_NONE)
                .collect();
            if current.acting_primary != Some(from) || acting != act.acting {
                continue;
            }
            let entries = self.pg_history.entry(*pgid).or_default();
            match entries.last() {
                Some(last) if last.acting == act.acting => continue,
                Some(last) if last.since > act.since => continue,
                _ => {}
            }
            entries.push(act.clone());
            let excess = entries.len().saturating_sub(PG_HISTORY_MAX);
            entries.drain(..excess);
        }
    }

    /// True when the newest recorded activation of `pgid` has `acting`.
    pub fn pg_activation_recorded(&self, pgid: PgId, acting: &[i32]) -> bool {
        self.pg_history
            .get(&pgid)
            .and_then(|h| h.last())
            .is_some_and(|a| a.acting == acting)
    }

    /// The recorded activations of `pgid`, oldest first.
    pub fn pg_activations(&self, pgid: PgId) -> Vec<PgActivation> {
        self.pg_history.get(&pgid).cloned().unwrap_or_default()
    }

    /// Drops the history of PGs that no longer exist, and purged OSDs from
    /// the entries (purging an OSD gives up whatever it held; an entry left
    /// with no OSD goes).
    pub(crate) fn clean_pg_history(&mut self) {
        if self.pg_history.is_empty() {
            return;
        }
        let pools = &self.pools;
        let osds = &self.osds;
        self.pg_history.retain(|pgid, entries| {
            let Some(pool) = pools.get(&pgid.pool.0) else {
                return false;
            };
            if pgid.seed >= pool.pg_num {
                return false;
            }
            for e in entries.iter_mut() {
                e.acting.retain(|o| osds.contains_key(o));
            }
            entries.retain(|e| !e.acting.is_empty());
            !entries.is_empty()
        });
    }
}

/// The epochs an entry covers: from its `since` to the epoch before the
/// next entry's (the newest runs to `now`).
pub fn activation_spans(entries: &[PgActivation], now: Epoch) -> Vec<(Epoch, Epoch)> {
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let last = entries
                .get(i + 1)
                .map(|n| Epoch(n.since.0.saturating_sub(1)).max(e.since))
                .unwrap_or(now.max(e.since));
            (e.since, last)
        })
        .collect()
}
