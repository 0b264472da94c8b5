//! PG statistics as the monitors see them (Ceph's mgr PGMap, kept by the
//! monitor leader in memory, never in the map): what each OSD reports in its
//! beacon (store usage, the PGs it is primary for), how the per-PG state of
//! the whole cluster is derived from those reports and the current map
//! (`unknown` without a report, `stale+…` when the reporting primary went
//! quiet or lost the PG), the summaries `status`, `pg stat`, `pg dump` and
//! `osd df` print, and the PG health checks. Pure: the runtime
//! says how old each report is.

use crate::health::{HealthCheck, HealthStatus};
use crate::model::ClusterMap;
use cairn_types::PgId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// PGs one beacon may carry, at most (a beacon with more is refused).
pub const BEACON_PGS_MAX: usize = 65_536;

/// One PG as its primary OSD reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgReport {
    pub pgid: PgId,
    /// `active+clean`, `peering`, `down`, … (`PgState`'s text).
    pub state: String,
    pub up: Vec<i32>,
    pub acting: Vec<i32>,
    pub primary: Option<i32>,
    /// Map epoch the OSD had when it took the report.
    pub epoch: u64,
    /// Objects in the PG on the primary.
    pub objects: u64,
    /// Bytes of object data in the PG on the primary.
    pub bytes: u64,
    pub log_entries: u64,
    /// Object copies missing from acting members (objects x missing members).
    pub degraded_objects: u64,
    /// Object copies on OSDs outside the up set (acting members not in up
    /// while `pg_temp` holds), i.e. copies still to move.
    pub misplaced_objects: u64,
    /// `epoch'seq` of the newest log entry.
    pub last_update: String,
    pub log_tail: String,
    pub same_interval_since: u64,
    pub last_epoch_started: u64,
    pub down_reason: Option<String>,
    /// Objects the reporting primary brought up to date in this PG since
    /// it started, by kind of recovery.
    pub recovery: PgRecoveryCounts,
    /// Scrub stamps, state and findings (`crate::scrub`).
    #[serde(default)]
    pub scrub: crate::scrub::PgScrubReport,
    /// Objects no reachable OSD holds (always 0 today: a PG whose only
    /// copies are unreachable stays down instead).
    pub unfound_objects: u64,
    /// Objects and bytes the primary copied for the PG by recovery and
    /// backfill since it started (counters; the monitor leader derives
    /// rates from successive beacons).
    pub recovered_objects: u64,
    pub recovered_bytes: u64,
    /// The backfill in progress, if any.
    pub backfill: Option<BackfillProgress>,
}

/// Objects recovered in one PG, counted by the primary that did it (one
/// count per object per member brought up to date), since that OSD
/// started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PgRecoveryCounts {
    /// Named by log entries the member lacked (log-based recovery).
    pub log_objects: u64,
    /// Copied by a full scan because the log did not reach back far
    /// enough or the member was new (backfill).
    pub backfill_objects: u64,
}

/// A PG's backfill as its primary reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BackfillProgress {
    /// Targets still being backfilled.
    pub targets: Vec<i32>,
    /// Objects copied so far (summed over targets).
    pub copied_objects: u64,
    /// Objects to copy in all (the primary's objects times the targets).
    pub total_objects: u64,
    /// Why it is not copying right now (flag, reservation, throttle).
    pub waiting: Option<String>,
    /// Position of the slowest target in store order (`hash:name`).
    pub position: Option<String>,
}

/// Cluster-wide recovery rate, computed by the monitor leader from
/// successive beacons on its own monotonic clock.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RecoveryRate {
    pub bytes_per_sec: f64,
    pub objects_per_sec: f64,
}

/// What an OSD tells the monitors every `osd_beacon_report_interval`: it is
/// alive, how full its store is, and the PGs it is primary for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct OsdBeacon {
    /// Map epoch the OSD had.
    pub epoch: u64,
    /// Store capacity, bytes in use and bytes still allocatable (statfs).
    pub total_bytes: u64,
    pub used_bytes: u64,
    pub available_bytes: u64,
    pub pgs: Vec<PgReport>,
}

impl OsdBeacon {
    /// Checks the beacon's bounds; the error says what is wrong.
    pub fn validate(&self, osd: i32) -> Result<(), String> {
        if self.pgs.len() > BEACON_PGS_MAX {
            return Err(format!(
                "osd.{osd}: beacon carries {} PGs, more than {BEACON_PGS_MAX}",
                self.pgs.len()
            ));
        }
        if self.used_bytes > self.total_bytes {
            return Err(format!(
                "osd.{osd}: beacon says {} bytes used of {} total",
                self.used_bytes, self.total_bytes
            ));
        }
        Ok(())
    }
}

/// The beacon of one OSD as the monitor leader holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OsdStatsEntry {
    /// Seconds since the leader received it (leader's monotonic clock).
    pub age_secs: u64,
    /// Older than the staleness limit: its PGs show `stale+…` and its
    /// usage no longer counts.
    pub stale: bool,
    pub beacon: OsdBeacon,
}

/// Every OSD's last beacon, as handed to queries and health checks.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PgMapView {
    pub osds: BTreeMap<i32, OsdStatsEntry>,
    /// Recovery and backfill rate over the last beacons (None: no recovery).
    pub recovery: Option<RecoveryRate>,
}

/// One PG of the cluster: placement from the map, state from its primary.
#[derive(Debug, Clone, PartialEq)]
pub struct PgEntry {
    pub pgid: PgId,
    /// `unknown`, the reported state, or `stale+<reported state>`.
    pub state: String,
    pub up: Vec<i32>,
    /// Up primary.
    pub primary: Option<i32>,
    /// Acting set from the map (`pg_temp` or up).
    pub acting: Vec<i32>,
    /// The OSD that serves the PG and reports it.
    pub acting_primary: Option<i32>,
    /// The report the state comes from, if any.
    pub report: Option<PgReport>,
}

/// Totals over the cluster's PGs and OSDs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PgTotals {
    pub num_pgs: usize,
    pub by_state: BTreeMap<String, usize>,
    pub objects: u64,
    pub data_bytes: u64,
    pub degraded_objects: u64,
    /// Object copies the pools want (objects x size), the base of the
    /// degraded percentage.
    pub object_copies: u64,
    pub misplaced_objects: u64,
    pub unfound_objects: u64,
    /// From fresh beacons of up OSDs.
    pub used_bytes: u64,
    pub total_bytes: u64,
    pub available_bytes: u64,
}

impl PgMapView {
    fn fresh(&self, osd: i32) -> Option<&OsdBeacon> {
        self.osds.get(&osd).filter(|e| !e.stale).map(|e| &e.beacon)
    }
}

impl ClusterMap {
    /// Every PG of every pool with its state: the current primary's fresh
    /// report; else `stale+` the last report any OSD made as primary; else
    /// `unknown`.
    pub fn pg_entries(&self, view: &PgMapView) -> Vec<PgEntry> {
        let mut by_current: BTreeMap<(i32, PgId), &PgReport> = BTreeMap::new();
        let mut any: BTreeMap<PgId, &PgReport> = BTreeMap::new();
        for (osd, e) in &view.osds {
            for r in &e.beacon.pgs {
                if r.primary != Some(*osd) {
                    continue;
                }
                if !e.stale {
                    by_current.insert((*osd, r.pgid), r);
                }
                // Keep the newest-epoch report per PG for the stale fallback.
                let slot = any.entry(r.pgid).or_insert(r);
                if r.epoch > slot.epoch {
                    *slot = r;
                }
            }
        }
        let mut out = Vec::new();
        for pool in self.pools.values() {
            let Ok(maps) = self.pool_pg_mappings(pool.id) else {
                continue;
            };
            for (seed, m) in maps.into_iter().enumerate() {
                let pgid = PgId {
                    pool: cairn_types::PoolId(pool.id),
                    seed: seed as u32,
                };
                let current = m
                    .acting_primary
                    .filter(|p| self.is_up(*p))
                    .and_then(|p| by_current.get(&(p, pgid)).copied());
                let (state, report) = match (current, any.get(&pgid)) {
                    (Some(r), _) => (r.state.clone(), Some(r.clone())),
                    (None, Some(r)) => (format!("stale+{}", r.state), Some((*r).clone())),
                    (None, None) => ("unknown".to_string(), None),
                };
                out.push(PgEntry {
                    pgid,
                    state,
                    up: m.up,
                    primary: m.primary,
                    acting: m.acting,
                    acting_primary: m.acting_primary,
                    report,
                });
            }
        }
        out
    }

    fn is_up(&self, osd: i32) -> bool {
        self.osds.get(&osd).is_some_and(|o| o.up)
    }

    /// Counts by state, object and byte totals, and usage.
    pub fn pg_totals(&self, view: &PgMapView) -> PgTotals {
        let entries = self.pg_entries(view);
        let mut t = PgTotals {
            num_pgs: entries.len(),
            ..Default::default()
        };
        for e in &entries {
            *t.by_state.entry(e.state.clone()).or_insert(0) += 1;
            if let Some(r) = &e.report {
                let size = self.pools.get(&e.pgid.pool.0).map(|p| p.size).unwrap_or(1);
                t.objects += r.objects;
                t.data_bytes += r.bytes;
                t.degraded_objects += r.degraded_objects;
                t.misplaced_objects += r.misplaced_objects;
                t.unfound_objects += r.unfound_objects;
                t.object_copies += r.objects * u64::from(size);
            }
        }
        for o in self.osds.values().filter(|o| o.up) {
            if let Some(b) = view.fresh(o.id) {
                t.used_bytes += b.used_bytes;
                t.total_bytes += b.total_bytes;
                t.available_bytes += b.available_bytes;
            }
        }
        t
    }

    /// PGs per OSD (each OSD of each PG's up set counts once).
    pub fn pgs_per_osd(&self) -> BTreeMap<i32, usize> {
        let mut n: BTreeMap<i32, usize> = BTreeMap::new();
        for pool in self.pools.values() {
            let Ok(maps) = self.pool_pg_mappings(pool.id) else {
                continue;
            };
            for m in maps {
                for o in
                    m.up.into_iter()
                        .filter(|o| *o >= 0 && *o != cairn_crush::CRUSH_ITEM_NONE)
                {
                    *n.entry(o).or_insert(0) += 1;
                }
            }
        }
        n
    }

    /// Health checks from PG states: PG_AVAILABILITY, PG_DEGRADED,
    /// OSD_SCRUB_ERRORS, PG_DAMAGED. (TOO_MANY_PGS needs only the map:
    /// [`ClusterMap::check_too_many_pgs`]; OSD_FULL & co. come from the
    /// marks in the map, `crate::fullness`.)
    pub fn pg_health_checks(&self, view: &PgMapView) -> Vec<HealthCheck> {
        let entries = self.pg_entries(view);
        let mut out = Vec::new();
        out.extend(check_availability(&entries));
        out.extend(self.check_degraded(&entries));
        out.extend(self.check_scrub_errors(&entries));
        out
    }

    fn check_degraded(&self, entries: &[PgEntry]) -> Option<HealthCheck> {
        let has = |e: &PgEntry, w: &str| e.state.split('+').any(|s| s == w);
        let degraded: Vec<&PgEntry> = entries.iter().filter(|e| has(e, "degraded")).collect();
        let undersized = entries.iter().filter(|e| has(e, "undersized")).count();
        if degraded.is_empty() && undersized == 0 {
            return None;
        }
        let (mut missing, mut copies) = (0u64, 0u64);
        for e in entries {
            if let Some(r) = &e.report {
                let size = self.pools.get(&e.pgid.pool.0).map(|p| p.size).unwrap_or(1);
                missing += r.degraded_objects;
                copies += r.objects * u64::from(size);
            }
        }
        let pct = if copies > 0 {
            missing as f64 * 100.0 / copies as f64
        } else {
            0.0
        };
        let mut summary = format!("Degraded data redundancy: {missing}/{copies} objects degraded ({pct:.3}%), {} pgs degraded", degraded.len());
        if undersized > 0 {
            summary.push_str(&format!(", {undersized} pgs undersized"));
        }
        let detail = entries
            .iter()
            .filter(|e| has(e, "degraded") || has(e, "undersized"))
            .take(50)
            .map(|e| {
                let acting = e
                    .report
                    .as_ref()
                    .map(|r| r.acting.clone())
                    .unwrap_or_default();
                format!(
                    "pg {} is {}, acting {:?}: fewer copies than the pool's size; it heals when the missing OSDs come back or are marked out and data is re-replicated",
                    e.pgid, e.state, acting
                )
            })
            .collect();
        Some(HealthCheck {
            code: "PG_DEGRADED".into(),
            severity: HealthStatus::Warn,
            summary,
            detail,
        })
    }

    /// TOO_MANY_PGS: an OSD holds more PGs than `mon_max_pg_per_osd`.
    pub fn check_too_many_pgs(&self) -> Option<HealthCheck> {
        let max = self.config_u64("mon_max_pg_per_osd", 250) as usize;
        let per = self.pgs_per_osd();
        let over: Vec<(i32, usize)> = per.into_iter().filter(|(_, n)| *n > max).collect();
        let worst = over.iter().map(|(_, n)| *n).max()?;
        let detail = over
            .iter()
            .map(|(o, n)| {
                format!(
                    "osd.{o} holds {n} PGs (max {max}); add OSDs, lower pools' pg_num, or raise mon_max_pg_per_osd"
                )
            })
            .collect();
        Some(HealthCheck {
            code: "TOO_MANY_PGS".into(),
            severity: HealthStatus::Warn,
            summary: format!("too many PGs per OSD ({worst} > max {max})"),
            detail,
        })
    }
}

fn check_availability(entries: &[PgEntry]) -> Option<HealthCheck> {
    let has = |e: &PgEntry, w: &str| e.state.split('+').any(|s| s == w);
    let inactive: Vec<&PgEntry> = entries.iter().filter(|e| !has(e, "active")).collect();
    let stale = entries.iter().filter(|e| has(e, "stale")).count();
    if inactive.is_empty() && stale == 0 {
        return None;
    }
    let down = inactive.iter().filter(|e| has(e, "down")).count();
    let incomplete = inactive.iter().filter(|e| has(e, "incomplete")).count();
    let unknown = inactive.iter().filter(|e| e.state == "unknown").count();
    let mut parts = vec![format!("{} pgs inactive", inactive.len())];
    for (n, what) in [(down, "down"), (incomplete, "incomplete"), (stale, "stale")] {
        if n > 0 {
            parts.push(format!("{n} pgs {what}"));
        }
    }
    if unknown > 0 {
        parts.push(format!("{unknown} pgs unknown"));
    }
    let detail = entries
        .iter()
        .filter(|e| !has(e, "active") || has(e, "stale"))
        .take(50)
        .map(|e| {
            let why = match e.report.as_ref().and_then(|r| r.down_reason.clone()) {
                Some(r) => format!(": {r}"),
                None if e.state == "unknown" => {
                    ": no OSD has reported it yet (its primary is starting, or the monitors just elected a leader)".to_string()
                }
                None if has(e, "stale") => {
                    ": its primary stopped reporting (down, or cannot reach the monitors)".to_string()
                }
                None => String::new(),
            };
            format!("pg {} is {}, up {:?}{why}", e.pgid, e.state, e.up)
        })
        .collect();
    Some(HealthCheck {
        code: "PG_AVAILABILITY".into(),
        severity: HealthStatus::Warn,
        summary: format!("Reduced data availability: {}", parts.join(", ")),
        detail,
    })
}
