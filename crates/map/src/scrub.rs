//! Scrub as the monitors see it: operator orders (`pg scrub|deep-scrub|
//! repair PGID`, `osd scrub|deep-scrub|repair N`) kept in the map until the
//! PG's primary reports them done, the scrub part of a PG report (stamps,
//! error count, the inconsistent objects), the health checks built from
//! those reports (OSD_SCRUB_ERRORS, PG_DAMAGED) and `list-inconsistent-obj`.
//! Pure, like the rest of the map: stamps are the primary's own wall-clock
//! seconds, only displayed here, never compared across machines.

use crate::command::{MonCommand, OsdSelector};
use crate::error::CommandError;
use crate::health::{HealthCheck, HealthStatus};
use crate::model::{ClusterMap, Reply};
use crate::pgmap::{OsdBeacon, PgEntry, PgMapView};
use cairn_types::{PgId, PoolId};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Inconsistent objects a PG report carries, at most (the error count is exact).
pub const SCRUB_REPORT_OBJECTS_MAX: usize = 64;
/// Object lines `health detail` prints per PG, at most.
const HEALTH_OBJECTS_PER_PG: usize = 10;

/// What an order asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScrubKind {
    Scrub,
    Deep,
    Repair,
}

impl ScrubKind {
    pub fn verb(self) -> &'static str {
        match self {
            ScrubKind::Scrub => "scrub",
            ScrubKind::Deep => "deep-scrub",
            ScrubKind::Repair => "repair",
        }
    }
}

/// An operator's request that a PG's primary scrub it now. `id` is the map
/// epoch that made the order: the primary remembers the newest id it
/// carried out, and the monitors drop an order once its PG reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubOrder {
    pub pgid: PgId,
    pub id: u64,
    pub deep: bool,
    pub repair: bool,
}

/// One copy that scrub found bad.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardErrorReport {
    pub osd: i32,
    /// EC shard position (None: replicated pool).
    pub shard: Option<u8>,
    /// `missing`, `read_error`, `data_digest_mismatch`, `size_mismatch`,
    /// `version_mismatch`, `attr_mismatch`, `omap_mismatch`, `stale`,
    /// `ec_parity_mismatch`.
    pub errors: Vec<String>,
    /// Detail (the store's error text for read errors).
    pub detail: Option<String>,
}

/// One inconsistent object of a PG.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InconsistentObjectReport {
    /// `name` or `namespace/name`.
    pub object: String,
    /// The authoritative version (`epoch'seq`), if a good copy exists.
    pub version: Option<String>,
    /// The OSD holding the copy repair would use.
    pub auth_osd: Option<i32>,
    pub shards: Vec<ShardErrorReport>,
}

/// The scrub part of a PG report.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PgScrubReport {
    /// Unix seconds (primary's clock) of the last scrub of any kind / deep.
    pub last_scrub_stamp: u64,
    pub last_deep_scrub_stamp: u64,
    /// `scrubbing`, `deep-scrubbing`, `repairing` or empty.
    pub scrubbing: String,
    /// Bad copies found by the last scrub (objects x copies).
    pub errors: u64,
    /// The inconsistent objects (first `SCRUB_REPORT_OBJECTS_MAX`).
    pub inconsistent: Vec<InconsistentObjectReport>,
    /// Newest operator order id carried out.
    pub order_done: u64,
    /// Why the last scrub could not finish, if it did not.
    pub last_failure: Option<String>,
}

impl ClusterMap {
    fn check_pg_exists(&self, pgid: PgId) -> Result<(), CommandError> {
        let pool = self.pools.get(&pgid.pool.0).ok_or_else(|| {
            CommandError::not_found(format!(
                "pg {pgid}: pool {} does not exist; 'cairn osd pool ls detail' lists pools",
                pgid.pool.0
            ))
        })?;
        if pgid.seed >= pool.pg_num {
            return Err(CommandError::not_found(format!(
                "pg {pgid} does not exist: pool '{}' has {} PGs (0..{:x})",
                pool.name,
                pool.pg_num,
                pool.pg_num.saturating_sub(1)
            )));
        }
        Ok(())
    }

    /// Adds (or widens) the order for `pgid`.
    fn add_scrub_order(&mut self, pgid: PgId, kind: ScrubKind) {
        let id = self.epoch.next().0;
        let deep = kind != ScrubKind::Scrub;
        let repair = kind == ScrubKind::Repair;
        match self.scrub_orders.iter_mut().find(|o| o.pgid == pgid) {
            Some(o) => {
                o.id = id;
                o.deep |= deep;
                o.repair |= repair;
            }
            None => self.scrub_orders.push(ScrubOrder {
                pgid,
                id,
                deep,
                repair,
            }),
        }
        self.scrub_orders.sort_by_key(|o| o.pgid);
    }

    /// Drops orders of PGs that no longer exist.
    fn prune_scrub_orders(&mut self) {
        let pools = self.pools.clone();
        self.scrub_orders.retain(|o| {
            pools
                .get(&o.pgid.pool.0)
                .is_some_and(|p| o.pgid.seed < p.pg_num)
        });
    }

    /// `pg scrub|deep-scrub|repair PGID`.
    pub(crate) fn pg_scrub(&mut self, pgid: PgId, kind: ScrubKind) -> Result<Reply, CommandError> {
        self.check_pg_exists(pgid)?;
        let primary = self.pg_to_up(pgid.pool.0, pgid.seed)?.acting_primary;
        self.prune_scrub_orders();
        self.add_scrub_order(pgid, kind);
        let who = match primary {
            Some(p) => format!("osd.{p}"),
            None => "its primary (none is up now; it runs once one is)".into(),
        };
        let plain = format!("instructing pg {pgid} on {who} to {}\n", kind.verb());
        Ok(Reply::new(
            plain,
            json!({ "pgid": pgid.to_string(), "primary": primary, "kind": kind.verb() }),
        ))
    }

    /// `osd scrub|deep-scrub|repair N|all`: every PG whose primary is one of them.
    pub(crate) fn osd_scrub(
        &mut self,
        osds: &OsdSelector,
        kind: ScrubKind,
    ) -> Result<Reply, CommandError> {
        let ids: Vec<i32> = match osds {
            OsdSelector::All => self.osds.values().filter(|o| o.up).map(|o| o.id).collect(),
            OsdSelector::Ids(ids) => {
                for id in ids {
                    let o = self.osds.get(id).ok_or_else(|| {
                        CommandError::not_found(format!(
                            "osd.{id} does not exist; 'cairn osd ls' lists OSDs"
                        ))
                    })?;
                    if !o.up {
                        return Err(CommandError::invalid(format!(
                            "osd.{id} is down: it is primary of no PG now; scrub its PGs with 'cairn pg {} PGID' once they are active elsewhere",
                            kind.verb()
                        )));
                    }
                }
                ids.clone()
            }
        };
        let mut pgs = Vec::new();
        let pool_ids: Vec<u64> = self.pools.keys().copied().collect();
        for pool in pool_ids {
            for (seed, m) in self.pool_pg_mappings(pool)?.into_iter().enumerate() {
                if m.acting_primary.is_some_and(|p| ids.contains(&p)) {
                    pgs.push(PgId {
                        pool: PoolId(pool),
                        seed: seed as u32,
                    });
                }
            }
        }
        self.prune_scrub_orders();
        for &pgid in &pgs {
            self.add_scrub_order(pgid, kind);
        }
        let names: Vec<String> = ids.iter().map(|i| format!("osd.{i}")).collect();
        let plain = format!(
            "instructed {} to {} {} pg(s)\n",
            if names.is_empty() {
                "no up OSD".to_string()
            } else {
                names.join(", ")
            },
            kind.verb(),
            pgs.len()
        );
        let pg_text: Vec<String> = pgs.iter().map(|p| p.to_string()).collect();
        Ok(Reply::new(
            plain,
            json!({ "osds": ids, "kind": kind.verb(), "pgs": pg_text }),
        ))
    }

    /// Internal: orders the PGs' primaries report done (`id` at least the order's).
    pub(crate) fn scrub_orders_done(
        &mut self,
        done: &[(PgId, u64)],
    ) -> Result<Reply, CommandError> {
        let before = self.scrub_orders.len();
        self.scrub_orders
            .retain(|o| !done.iter().any(|(p, id)| *p == o.pgid && *id >= o.id));
        self.prune_scrub_orders();
        let n = before - self.scrub_orders.len();
        Ok(Reply::new(
            format!("{n} scrub order(s) done\n"),
            json!({ "done": n }),
        ))
    }

    /// The order for `pgid`, if one is pending.
    pub fn scrub_order(&self, pgid: PgId) -> Option<&ScrubOrder> {
        self.scrub_orders.iter().find(|o| o.pgid == pgid)
    }

    /// For the monitor leader: the orders a beacon shows carried out (only
    /// reports of PGs the beacon's OSD is primary of count).
    pub fn scrub_orders_settled_by(&self, osd: i32, beacon: &OsdBeacon) -> Option<MonCommand> {
        let done: Vec<(PgId, u64)> = beacon
            .pgs
            .iter()
            .filter(|r| r.primary == Some(osd))
            .filter(|r| {
                self.scrub_order(r.pgid)
                    .is_some_and(|o| r.scrub.order_done >= o.id)
            })
            .map(|r| (r.pgid, r.scrub.order_done))
            .collect();
        (!done.is_empty()).then_some(MonCommand::ScrubOrdersDone { done })
    }

    /// OSD_SCRUB_ERRORS and PG_DAMAGED from the PG reports.
    pub(crate) fn check_scrub_errors(&self, entries: &[PgEntry]) -> Vec<HealthCheck> {
        let damaged: Vec<&PgEntry> = entries
            .iter()
            .filter(|e| e.report.as_ref().is_some_and(|r| r.scrub.errors > 0))
            .collect();
        if damaged.is_empty() {
            return Vec::new();
        }
        let errors: u64 = damaged
            .iter()
            .filter_map(|e| e.report.as_ref())
            .map(|r| r.scrub.errors)
            .sum();
        let mut detail = Vec::new();
        for e in damaged.iter().take(50) {
            let Some(r) = e.report.as_ref() else { continue };
            detail.push(format!(
                "pg {} is {}, acting {:?}: {} scrub error(s); run 'cairn pg repair {}'",
                e.pgid, e.state, r.acting, r.scrub.errors, e.pgid
            ));
            for o in r.scrub.inconsistent.iter().take(HEALTH_OBJECTS_PER_PG) {
                detail.push(format!("    {}", describe_object(o)));
            }
            let more = r
                .scrub
                .inconsistent
                .len()
                .saturating_sub(HEALTH_OBJECTS_PER_PG);
            if more > 0 {
                detail.push(format!(
                    "    ... {more} more: 'cairn rados list-inconsistent-obj {}'",
                    e.pgid
                ));
            }
        }
        vec![
            HealthCheck {
                code: "OSD_SCRUB_ERRORS".into(),
                severity: HealthStatus::Err,
                summary: format!("{errors} scrub errors"),
                detail: Vec::new(),
            },
            HealthCheck {
                code: "PG_DAMAGED".into(),
                severity: HealthStatus::Err,
                summary: format!("Possible data damage: {} pgs inconsistent", damaged.len()),
                detail,
            },
        ]
    }

    /// `rados list-inconsistent-obj PGID`: the primary's last scrub findings.
    pub(crate) fn q_list_inconsistent(
        &self,
        view: &PgMapView,
        pgid: PgId,
    ) -> Result<Reply, CommandError> {
        self.check_pg_exists(pgid)?;
        let entry = self.pg_entries(view).into_iter().find(|e| e.pgid == pgid);
        let Some(r) = entry.and_then(|e| e.report) else {
            return Err(CommandError::not_found(format!(
                "pg {pgid} has no report from its primary yet; retry once it is active"
            )));
        };
        let s = &r.scrub;
        let mut plain = String::new();
        if s.inconsistent.is_empty() {
            plain.push_str(&format!("pg {pgid}: no inconsistent objects"));
            if s.last_scrub_stamp == 0 {
                plain.push_str(" (never scrubbed on its current primary)");
            }
            plain.push('\n');
        } else {
            for o in &s.inconsistent {
                plain.push_str(&describe_object(o));
                plain.push('\n');
            }
        }
        let json = json!({
            "pgid": pgid.to_string(),
            "epoch": r.epoch,
            "errors": s.errors,
            "inconsistents": s.inconsistent,
        });
        Ok(Reply::new(plain, json))
    }
}

/// `object foo (version 5'12, good copy on osd.0): osd.2 data_digest_mismatch; …`
fn describe_object(o: &InconsistentObjectReport) -> String {
    let good = match (&o.version, o.auth_osd) {
        (Some(v), Some(a)) => format!("version {v}, good copy on osd.{a}"),
        (Some(v), None) => format!("version {v}"),
        (None, _) => "no good copy found".to_string(),
    };
    let shards: Vec<String> = o
        .shards
        .iter()
        .map(|s| {
            let shard = s.shard.map(|n| format!("(shard {n})")).unwrap_or_default();
            let detail = s
                .detail
                .as_ref()
                .map(|d| format!(" ({d})"))
                .unwrap_or_default();
            format!("osd.{}{shard} {}{detail}", s.osd, s.errors.join(","))
        })
        .collect();
    format!("object {} ({good}): {}", o.object, shards.join("; "))
}

/// A scrub stamp as `2026-11-22T14:54:12Z` (UTC), `-` for never.
pub fn format_stamp(unix_secs: u64) -> String {
    if unix_secs == 0 {
        return "-".into();
    }
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_format_as_utc() {
        assert_eq!(format_stamp(0), "-");
        assert_eq!(format_stamp(1), "1970-01-01T00:00:01Z");
        assert_eq!(format_stamp(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_stamp(1_795_359_252), "2026-11-22T14:54:12Z");
    }
}
