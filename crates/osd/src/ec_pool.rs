//! What an erasure-coded PG knows about its pool and placement: the code
//! (k, m, stripe unit), which OSD holds which shard in the current interval
//! (CRUSH holes included) and which OSD CRUSH wants there (they differ
//! while `pg_temp` keeps complete members serving and new ones are
//! backfilled), whether partial overwrites are allowed, and the shard this
//! OSD keeps on disk. Pure data; no I/O.

use cairn_ec::ErasureCode;
use cairn_map::{ClusterMap, PoolKind};

/// CRUSH's "no OSD here" (`CRUSH_ITEM_NONE`) in an EC acting set: the shard
/// at that position is missing.
pub const SHARD_HOLE: i32 = i32::MAX;

/// Whether an EC shard may delete the copies it keeps of positions it
/// moved away from (left by a shard move, reported to peering as kept
/// copies): only once the PG is clean in `p` — every position served
/// (no hole, so the live lists compare by position) by its up OSD. Until
/// then a kept copy may be the only complete one of its position. Checked
/// when a shard takes the primary's final activation push and when the
/// primary activates.
pub fn kept_copies_droppable(p: &crate::pg::Placement) -> bool {
    !p.shards.is_empty() && p.acting == p.up && p.acting.len() as u32 >= p.size
}

/// One EC PG's code and layout on this OSD.
#[derive(Debug, Clone)]
pub struct EcPg {
    pub code: ErasureCode,
    /// Acting set by shard position; [`SHARD_HOLE`] where no OSD serves it.
    pub shards: Vec<i32>,
    /// Up set (CRUSH's placement) by shard position. A position whose up
    /// OSD is not the acting one is a backfill target.
    pub up_shards: Vec<i32>,
    pub allow_overwrites: bool,
    pub pool_name: String,
}

impl EcPg {
    /// The EC layout of `pool.seed` in `map`; `Ok(None)` for a replicated
    /// pool, `Err` when the pool's profile cannot be used.
    pub fn from_map(map: &ClusterMap, pool_id: u64, seed: u32) -> Result<Option<EcPg>, String> {
        let Some(pool) = map.pools.get(&pool_id) else {
            return Err(format!("pool {pool_id} does not exist"));
        };
        if pool.kind != PoolKind::Erasure {
            return Ok(None);
        }
        let pname = pool.ec_profile.clone().unwrap_or_default();
        let prof = map.ec_profiles.get(&pname).ok_or_else(|| {
            format!(
                "pool '{}' names erasure-code profile '{pname}', which does not exist",
                pool.name
            )
        })?;
        let code = ErasureCode::new(prof.k as usize, prof.m as usize, prof.stripe_unit)
            .map_err(|e| format!("pool '{}': profile '{pname}': {e}", pool.name))?;
        let m = map.pg_to_up(pool_id, seed).map_err(|e| e.to_string())?;
        let mut shards = m.acting;
        shards.resize(code.total(), SHARD_HOLE);
        let mut up_shards = m.up;
        up_shards.resize(code.total(), SHARD_HOLE);
        Ok(Some(EcPg {
            code,
            shards,
            up_shards,
            allow_overwrites: pool.allow_ec_overwrites,
            pool_name: pool.name.clone(),
        }))
    }

    /// Shards whose OSD is in the acting set.
    pub fn available(&self) -> Vec<bool> {
        self.shards.iter().map(|&o| o != SHARD_HOLE).collect()
    }

    /// The shard `osd` serves, if any.
    pub fn shard_of(&self, osd: i32) -> Option<usize> {
        self.shards.iter().position(|&o| o == osd)
    }

    /// The shard `osd` is placed on by CRUSH (the up set), if any.
    pub fn up_shard_of(&self, osd: i32) -> Option<usize> {
        self.up_shards.iter().position(|&o| o == osd)
    }

    /// Up members, holes dropped.
    pub fn up_members(&self) -> Vec<i32> {
        self.up_shards
            .iter()
            .copied()
            .filter(|&o| o != SHARD_HOLE)
            .collect()
    }

    /// Backfill targets: (shard, OSD) where the up OSD is not the acting
    /// one. An OSD that serves another position in the acting set is not
    /// one (the up set moved it while `pg_temp` kept it where it was): it
    /// holds one copy per interval, the position it serves, and a backfill
    /// of its up position would wipe that copy and mix the two positions'
    /// chunks in it. It moves once `pg_temp` goes; the next activation
    /// backfills it then, behind a new `pg_temp`.
    pub fn backfill_targets(&self) -> Vec<(usize, i32)> {
        self.up_shards
            .iter()
            .zip(&self.shards)
            .enumerate()
            .filter(|(_, (&u, &a))| u != SHARD_HOLE && u != a && !self.shards.contains(&u))
            .map(|(s, (&u, _))| (s, u))
            .collect()
    }

    /// Whether a `pg_temp` (acting differs from up) no longer helps: no up
    /// member is left to backfill (each serves, maybe at another
    /// position), and it fills no position the up set leaves empty.
    /// Nothing else would clear it: the PG would stay remapped for good.
    pub fn pg_temp_unneeded(&self) -> bool {
        self.shards != self.up_shards
            && self.backfill_targets().is_empty()
            && self
                .up_shards
                .iter()
                .zip(&self.shards)
                .all(|(&u, &a)| u != SHARD_HOLE || a == SHARD_HOLE)
    }

    /// Acting members, holes dropped (what the PG state machine counts).
    pub fn live_members(&self) -> Vec<i32> {
        self.shards
            .iter()
            .copied()
            .filter(|&o| o != SHARD_HOLE)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(shards: &[i32], up_shards: &[i32]) -> EcPg {
        EcPg {
            code: ErasureCode::new(2, 1, 4096).expect("2+1"),
            shards: shards.to_vec(),
            up_shards: up_shards.to_vec(),
            allow_overwrites: false,
            pool_name: "ec".into(),
        }
    }

    fn placement(up: &[i32], acting: &[i32], shards: &[i32]) -> crate::pg::Placement {
        crate::pg::Placement {
            epoch: cairn_types::Epoch(9),
            up: up.to_vec(),
            acting: acting.to_vec(),
            shards: shards.to_vec(),
            primary: acting.first().copied(),
            size: 3,
            min_size: 2,
            prev_primary_up_thru: None,
            acting_up_from: vec![cairn_types::Epoch(1); acting.len()],
            last_recorded: None,
        }
    }

    /// The decision behind dropping kept copies on the final activation
    /// push: clean (acting = up by position, every position served) only.
    #[test]
    fn kept_copies_go_only_once_every_position_is_served_by_its_up_osd() {
        assert!(kept_copies_droppable(&placement(
            &[1, 2, 5],
            &[1, 2, 5],
            &[1, 2, 5]
        )));
        // Remapped: pg_temp keeps osd.4 serving position 2 while osd.5
        // is backfilled; osd.5's old position's copy may be needed.
        assert!(!kept_copies_droppable(&placement(
            &[1, 2, 5],
            &[1, 2, 4],
            &[1, 2, 4]
        )));
        // A hole: live lists can look equal with positions shifted.
        assert!(!kept_copies_droppable(&placement(
            &[2, 5],
            &[2, 5],
            &[SHARD_HOLE, 2, 5]
        )));
        // Replicated PGs keep no copies of other positions.
        assert!(!kept_copies_droppable(&placement(
            &[1, 2, 5],
            &[1, 2, 5],
            &[]
        )));
    }

    #[test]
    fn an_up_member_outside_the_acting_set_is_a_backfill_target() {
        let ec = layout(&[SHARD_HOLE, 2, 5], &[6, 2, 3]);
        assert_eq!(ec.backfill_targets(), vec![(0, 6), (2, 3)]);
        assert!(!ec.pg_temp_unneeded());
    }

    /// `ecmove` seed 3 (4+2, pg_temp `[-, 2, 5, 1, 4, 0]`, then `osd out 4`
    /// moved osd.5 in the up set from position 2 to 4): osd.5 was made a
    /// backfill target while serving position 2, and the backfill's start
    /// wiped its copy ("read obj4 returned None; acknowledged 9").
    #[test]
    fn an_osd_serving_another_position_is_not_a_backfill_target() {
        let ec = layout(&[SHARD_HOLE, 2, 5], &[6, 2, 5]);
        assert_eq!(ec.backfill_targets(), vec![(0, 6)]);
        let moved = layout(&[1, 2, 5], &[1, 5, 2]);
        assert!(moved.backfill_targets().is_empty());
        // Nothing left to backfill: the pg_temp must go (the next
        // activation moves the OSDs and asks for a new one).
        assert!(moved.pg_temp_unneeded());
    }

    #[test]
    fn a_pg_temp_filling_a_position_crush_leaves_empty_stays() {
        let ec = layout(&[1, 2, 5], &[1, 2, SHARD_HOLE]);
        assert!(ec.backfill_targets().is_empty());
        assert!(!ec.pg_temp_unneeded());
        let same = layout(&[1, 2, 5], &[1, 2, 5]);
        assert!(!same.pg_temp_unneeded());
    }
}
