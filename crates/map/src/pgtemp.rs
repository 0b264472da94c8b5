//! `pg_temp` and lost OSDs: the acting set a PG's primary asks for while
//! new members of its up set are backfilled (so the old, complete members
//! keep serving), its automatic clean-up after every change, and `osd
//! lost`. For a replicated pool `pg_temp` is a list of OSDs; for an
//! erasure-coded pool it is positional (one entry per shard,
//! `CRUSH_ITEM_NONE` where no complete member serves that shard). Placement
//! itself (up → acting) is `decisions`' job; the OSD decides when to ask.

use crate::apply::done;
use crate::error::CommandError;
use crate::model::{ClusterMap, PoolKind, Reply};
use cairn_crush::CRUSH_ITEM_NONE;
use cairn_types::{Epoch, PgId};
use std::collections::BTreeSet;

impl ClusterMap {
    /// `from` (the PG's current primary) sets or (with `osds` empty) clears
    /// the PG's `pg_temp`. Refused when `from` is no longer the primary or
    /// an OSD named is unknown or down; for an erasure-coded pool also when
    /// the list does not have one entry per shard (holes as
    /// `CRUSH_ITEM_NONE`) or names no OSD.
    pub(crate) fn set_pg_temp(
        &mut self,
        from: i32,
        pgid: PgId,
        osds: &[i32],
    ) -> Result<Reply, CommandError> {
        let pool = self.pools.get(&pgid.pool.0).ok_or_else(|| {
            CommandError::not_found(format!("pg {pgid}: pool {} does not exist", pgid.pool))
        })?;
        let erasure = pool.kind == PoolKind::Erasure;
        let size = pool.size as usize;
        let pool_name = pool.name.clone();
        let m = self.pg_to_up(pgid.pool.0, pgid.seed)?;
        if m.primary != Some(from) && m.acting_primary != Some(from) {
            return Err(CommandError::busy(format!(
                "pg {pgid}: osd.{from} is not its primary in epoch {} (up {:?}, acting {:?}); it asks again on the newer map",
                self.epoch.0, m.up, m.acting
            )));
        }
        if osds.is_empty() {
            return Ok(match self.pg_temp.remove(&pgid) {
                Some(_) => done(format!("pg {pgid}: pg_temp cleared")),
                None => done(format!("pg {pgid} has no pg_temp")),
            });
        }
        let named: Vec<i32> = osds
            .iter()
            .copied()
            .filter(|&o| !erasure || o != CRUSH_ITEM_NONE)
            .collect();
        if erasure && (osds.len() != size || named.is_empty()) {
            return Err(CommandError::invalid(format!(
                "pg {pgid}: pool '{pool_name}' is erasure-coded: pg_temp {osds:?} must have one entry per shard ({size}, {CRUSH_ITEM_NONE} for a hole) and name at least one OSD"
            )));
        }
        let unique: BTreeSet<i32> = named.iter().copied().collect();
        if unique.len() != named.len() || osds.len() > size.max(1) * 2 {
            return Err(CommandError::invalid(format!(
                "pg {pgid}: pg_temp {osds:?} repeats an OSD or is longer than twice the pool size {size}"
            )));
        }
        for o in &named {
            if !self.osds.get(o).is_some_and(|i| i.up) {
                return Err(CommandError::invalid(format!(
                    "pg {pgid}: osd.{o} in pg_temp {osds:?} is not an up OSD"
                )));
            }
        }
        self.pg_temp.insert(pgid, osds.to_vec());
        Ok(done(format!("pg {pgid}: pg_temp {osds:?}")))
    }

    /// Drops `pg_temp` entries that no longer mean anything: the PG or its
    /// pool is gone, an erasure-coded entry no longer has one entry per
    /// shard (the pool's size changed), an OSD named was purged,
    /// or the acting set it gives equals the up set. Runs after every change.
    pub(crate) fn clean_pg_temp(&mut self) {
        if self.pg_temp.is_empty() {
            return;
        }
        let stale: Vec<PgId> = self
            .pg_temp
            .iter()
            .filter(|(pgid, osds)| {
                let Some(pool) = self.pools.get(&pgid.pool.0) else {
                    return true;
                };
                let erasure = pool.kind == PoolKind::Erasure;
                if pgid.seed >= pool.pg_num || (erasure && osds.len() != pool.size as usize) {
                    return true;
                }
                let hole = |o: i32| erasure && o == CRUSH_ITEM_NONE;
                if osds
                    .iter()
                    .any(|&o| !hole(o) && !self.osds.contains_key(&o))
                {
                    return true;
                }
                match self.pg_to_up(pgid.pool.0, pgid.seed) {
                    Ok(m) => m.acting == m.up,
                    Err(_) => true,
                }
            })
            .map(|(p, _)| *p)
            .collect();
        for p in stale {
            self.pg_temp.remove(&p);
        }
    }

    /// The acting set `pg_temp` gives a PG whose up set is `up`: its up
    /// members in order, or `up` itself when there is no usable entry.
    pub(crate) fn temp_acting(&self, pgid: PgId, up: &[i32]) -> Vec<i32> {
        let Some(temp) = self.pg_temp.get(&pgid) else {
            return up.to_vec();
        };
        let live: Vec<i32> = temp
            .iter()
            .copied()
            .filter(|o| self.osds.get(o).is_some_and(|i| i.up))
            .collect();
        if live.is_empty() {
            up.to_vec()
        } else {
            live
        }
    }

    /// The acting set `pg_temp` gives an erasure-coded PG whose up set (by
    /// shard position) is `up`: each position's OSD while it is up, else a
    /// hole; `up` itself when there is no entry (or it names no up OSD).
    pub(crate) fn temp_acting_ec(&self, pgid: PgId, up: &[i32]) -> Vec<i32> {
        let Some(temp) = self.pg_temp.get(&pgid).filter(|t| t.len() == up.len()) else {
            return up.to_vec();
        };
        let acting: Vec<i32> = temp
            .iter()
            .map(|&o| {
                if o != CRUSH_ITEM_NONE && self.osds.get(&o).is_some_and(|i| i.up) {
                    o
                } else {
                    CRUSH_ITEM_NONE
                }
            })
            .collect();
        if acting.iter().all(|&o| o == CRUSH_ITEM_NONE) {
            up.to_vec()
        } else {
            acting
        }
    }

    /// OSDs an admin declared lost and that have not booted since.
    pub fn lost_osds(&self) -> Vec<i32> {
        self.osds
            .values()
            .filter(|o| o.lost_at > o.up_from && !o.up)
            .map(|o| o.id)
            .collect()
    }

    /// `osd lost N --yes-i-really-mean-it`.
    pub(crate) fn osd_lost(&mut self, id: i32, sure: bool) -> Result<Reply, CommandError> {
        let o = self.osd(id)?.clone();
        if o.up {
            return Err(CommandError::busy(format!(
                "osd.{id} is up; only a down OSD can be declared lost (stop it, or 'cairn osd down {id}' if it is hung)"
            )));
        }
        if !sure {
            return Err(CommandError::not_permitted(format!(
                "declaring osd.{id} lost gives up every write only it holds; PGs waiting for it activate without them. Pass --yes-i-really-mean-it: 'cairn osd lost {id} --yes-i-really-mean-it'"
            )));
        }
        if o.lost_at > o.up_from {
            return Ok(done(format!(
                "osd.{id} is already lost (since epoch {})",
                o.lost_at.0
            )));
        }
        let e: Epoch = self.next_epoch();
        self.osd_mut(id)?.lost_at = e;
        Ok(done(format!("marked osd.{id} lost (epoch {})", e.0)))
    }
}
