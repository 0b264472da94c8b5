//! Decisions the monitors and clients take from the map, as pure functions:
//! whether failure reports suffice to mark an OSD down, which down OSDs are
//! due to be marked out, and where a PG is placed (Ceph's pps hashing, CRUSH,
//! then dropping OSDs that are down). Timing (how long an OSD has been down)
//! is measured by the caller on its monotonic clock and passed in.

use crate::error::CommandError;
use crate::model::{ClusterMap, OsdFlag, PoolKind};
use cairn_crush::CRUSH_ITEM_NONE;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Where a PG lives on the current map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgMapping {
    /// CRUSH's answer before OSD states are considered.
    pub raw: Vec<i32>,
    /// The up set: replicated pools drop down OSDs (the rest shift left);
    /// EC pools keep positions and put `CRUSH_ITEM_NONE` in the holes.
    pub up: Vec<i32>,
    /// First OSD of the up set, if any (the "up primary").
    pub primary: Option<i32>,
    /// The acting set: `pg_temp` while a backfill runs, else the up set.
    pub acting: Vec<i32>,
    /// First OSD of the acting set: the one that serves the PG.
    pub acting_primary: Option<i32>,
}

/// Ceph's `ceph_stable_mod`: maps `x` into `0..b` so that growing `b`
/// moves as few values as possible. `bmask` is the next power of two of `b`, minus 1.
pub fn stable_mod(x: u32, b: u32, bmask: u32) -> u32 {
    if x & bmask < b {
        x & bmask
    } else {
        x & (bmask >> 1)
    }
}

fn pow2_mask(n: u32) -> u32 {
    n.max(1).next_power_of_two() - 1
}

impl ClusterMap {
    /// The CRUSH input (placement seed) of PG `pool.seed`, as Ceph computes it
    /// for `hashpspool` pools.
    pub fn pg_pps(&self, pool_id: u64, seed: u32) -> Result<u32, CommandError> {
        let p = self
            .pools
            .get(&pool_id)
            .ok_or_else(|| CommandError::not_found(format!("pool id {pool_id} does not exist")))?;
        let ps = stable_mod(seed, p.pgp_num, pow2_mask(p.pgp_num));
        Ok(cairn_crush::hash32_2(ps, pool_id as u32))
    }

    /// Places PG `pool.seed` on the current map.
    pub fn pg_to_up(&self, pool_id: u64, seed: u32) -> Result<PgMapping, CommandError> {
        self.pg_to_up_with(pool_id, seed, &self.crush_reweights())
    }

    /// Places every PG of a pool (index = seed), computing the reweight
    /// vector once.
    pub fn pool_pg_mappings(&self, pool_id: u64) -> Result<Vec<PgMapping>, CommandError> {
        let pg_num =
            self.pools.get(&pool_id).map(|p| p.pg_num).ok_or_else(|| {
                CommandError::not_found(format!("pool id {pool_id} does not exist"))
            })?;
        let reweights = self.crush_reweights();
        (0..pg_num)
            .map(|seed| self.pg_to_up_with(pool_id, seed, &reweights))
            .collect()
    }

    fn pg_to_up_with(
        &self,
        pool_id: u64,
        seed: u32,
        reweights: &[u32],
    ) -> Result<PgMapping, CommandError> {
        let p = self
            .pools
            .get(&pool_id)
            .ok_or_else(|| CommandError::not_found(format!("pool id {pool_id} does not exist")))?;
        if seed >= p.pg_num {
            return Err(CommandError::invalid(format!(
                "pg {pool_id}.{seed:x} does not exist: pool '{}' has pg_num {}",
                p.name, p.pg_num
            )));
        }
        let pps = self.pg_pps(pool_id, seed)?;
        let raw = self
            .crush
            .do_rule(p.crush_rule, pps, p.size as usize, reweights);
        let is_up = |o: i32| self.osds.get(&o).is_some_and(|i| i.up);
        let up: Vec<i32> = match p.kind {
            PoolKind::Replicated => raw.iter().copied().filter(|&o| is_up(o)).collect(),
            PoolKind::Erasure => raw
                .iter()
                .map(|&o| if is_up(o) { o } else { CRUSH_ITEM_NONE })
                .collect(),
        };
        let primary = up.iter().copied().find(|&o| o != CRUSH_ITEM_NONE);
        let pgid = cairn_types::PgId {
            pool: cairn_types::PoolId(pool_id),
            seed,
        };
        let acting = match p.kind {
            PoolKind::Replicated => self.temp_acting(pgid, &up),
            PoolKind::Erasure => self.temp_acting_ec(pgid, &up),
        };
        let acting_primary = acting.iter().copied().find(|&o| o != CRUSH_ITEM_NONE);
        Ok(PgMapping {
            raw,
            up,
            primary,
            acting,
            acting_primary,
        })
    }

    /// Whether failure reports about `target` from `reporters` are enough to
    /// mark it down: reporters must be up OSDs in at least
    /// `mon_osd_min_down_reporters` distinct hosts (fewer when the cluster
    /// has fewer other hosts with up OSDs). Never while `nodown` is set.
    pub fn failure_reports_suffice(&self, target: i32, reporters: &[i32]) -> bool {
        if self.flags.contains(&OsdFlag::NoDown) {
            return false;
        }
        if !self.osds.get(&target).is_some_and(|o| o.up) {
            return false;
        }
        let level = self
            .config_value("mon", "mon_osd_reporter_subtree_level")
            .unwrap_or_else(|| "host".into());
        let domain = |o: i32| {
            self.crush
                .parent_of_type(o, &level)
                .unwrap_or_else(|| format!("osd.{o}"))
        };
        let reporting: BTreeSet<String> = reporters
            .iter()
            .copied()
            .filter(|&r| r != target && self.osds.get(&r).is_some_and(|o| o.up))
            .map(domain)
            .collect();
        let available: BTreeSet<String> = self
            .osds
            .values()
            .filter(|o| o.up && o.id != target)
            .map(|o| domain(o.id))
            .collect();
        let wanted = self.config_u64("mon_osd_min_down_reporters", 2) as usize;
        let needed = wanted.min(available.len()).max(1);
        reporting.len() >= needed
    }

    /// Down, in OSDs that have been down at least `mon_osd_down_out_interval`
    /// (per `down_for_secs`, measured by the caller) and may be marked out
    /// now. Nothing while `noout` is set or the interval is 0; not when the
    /// OSD's whole `mon_osd_down_out_subtree_limit` subtree (e.g. its rack)
    /// is down; and not below `mon_osd_min_in_ratio` of OSDs in.
    pub fn auto_out_candidates(&self, down_for_secs: &BTreeMap<i32, u64>) -> Vec<i32> {
        let interval = self.config_u64("mon_osd_down_out_interval", 600);
        if self.flags.contains(&OsdFlag::NoOut) || interval == 0 {
            return Vec::new();
        }
        let limit = self
            .config_value("mon", "mon_osd_down_out_subtree_limit")
            .unwrap_or_else(|| "host".into());
        // Subtrees of the limit type in which every OSD is down.
        let mut subtree_up: BTreeMap<String, bool> = BTreeMap::new();
        for o in self.osds.values() {
            if let Some(s) = self.crush.parent_of_type(o.id, &limit) {
                *subtree_up.entry(s).or_insert(false) |= o.up;
            }
        }
        let min_in_ratio: f64 = self
            .config_value("mon", "mon_osd_min_in_ratio")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.75);
        let total = self.osds.len();
        let mut in_count = self.osds.values().filter(|o| o.is_in).count();
        let mut out = Vec::new();
        for o in self.osds.values() {
            if o.up || !o.is_in {
                continue;
            }
            if down_for_secs.get(&o.id).is_none_or(|s| *s < interval) {
                continue;
            }
            let whole_subtree_down = self
                .crush
                .parent_of_type(o.id, &limit)
                .is_some_and(|s| subtree_up.get(&s) == Some(&false));
            if whole_subtree_down {
                continue;
            }
            if ((in_count - 1) as f64) < min_in_ratio * total as f64 {
                break;
            }
            in_count -= 1;
            out.push(o.id);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_mod_matches_ceph() {
        // pg_num 12: mask 15; values 12..15 fold into 4..7.
        assert_eq!(stable_mod(5, 12, 15), 5);
        assert_eq!(stable_mod(13, 12, 15), 5);
        assert_eq!(stable_mod(16 + 3, 12, 15), 3);
        assert_eq!(pow2_mask(12), 15);
        assert_eq!(pow2_mask(16), 15);
        assert_eq!(pow2_mask(1), 0);
    }
}
