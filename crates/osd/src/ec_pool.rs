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

    /// Backfill targets: (shard, OSD) where the up OSD is not the acting one.
    pub fn backfill_targets(&self) -> Vec<(usize, i32)> {
        self.up_shards
            .iter()
            .zip(&self.shards)
            .enumerate()
            .filter(|(_, (&u, &a))| u != SHARD_HOLE && u != a)
            .map(|(s, (&u, _))| (s, u))
            .collect()
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
