//! Health checks on the monitor side: from the map plus what the runtime
//! observed (quorum, clock offsets, key file permissions) to a report of
//! named checks. Reported only: nothing here changes the map. PG and usage
//! checks come from the leader's PG statistics (`pgmap`).

use crate::model::{ClusterMap, PoolKind};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Number of placement inputs tried per pool when checking that its rule can
/// place `size` OSDs.
pub const PLACEMENT_SAMPLE_INPUTS: u32 = 64;

/// What the monitor runtime measured; the map cannot know these.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct HealthInputs {
    /// Names of the monitors in quorum. Empty = not known (MON_DOWN skipped).
    pub quorum: Vec<String>,
    /// Measured clock offset of each monitor against the leader, in ms.
    pub mon_clock_offsets_ms: BTreeMap<String, i64>,
    /// Key files found readable by users other than their owner.
    pub insecure_key_files: Vec<String>,
    /// The leader's PG statistics; `None` where they are not known (the
    /// PG and usage checks are then skipped).
    pub pgmap: Option<crate::pgmap::PgMapView>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum HealthStatus {
    Ok,
    Warn,
    Err,
}

impl HealthStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            HealthStatus::Ok => "HEALTH_OK",
            HealthStatus::Warn => "HEALTH_WARN",
            HealthStatus::Err => "HEALTH_ERR",
        }
    }
    fn tag(self) -> &'static str {
        match self {
            HealthStatus::Ok => "[OK]",
            HealthStatus::Warn => "[WRN]",
            HealthStatus::Err => "[ERR]",
        }
    }
}

/// One named check that is not OK.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthCheck {
    pub code: String,
    pub severity: HealthStatus,
    pub summary: String,
    pub detail: Vec<String>,
}

/// The overall status and every failing check, in a fixed order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthReport {
    pub status: HealthStatus,
    pub checks: Vec<HealthCheck>,
}

impl HealthReport {
    pub fn from_checks(checks: Vec<HealthCheck>) -> HealthReport {
        let status = checks
            .iter()
            .map(|c| c.severity)
            .max()
            .unwrap_or(HealthStatus::Ok);
        HealthReport { status, checks }
    }

    /// The check with this code, if raised.
    pub fn check(&self, code: &str) -> Option<&HealthCheck> {
        self.checks.iter().find(|c| c.code == code)
    }

    /// `cairn health` / `cairn health detail` text.
    pub fn to_plain(&self, detail: bool) -> String {
        let mut out = String::from(self.status.as_str());
        if !self.checks.is_empty() {
            let sums: Vec<&str> = self.checks.iter().map(|c| c.summary.as_str()).collect();
            let _ = write!(out, " {}", sums.join("; "));
        }
        out.push('\n');
        if detail {
            for c in &self.checks {
                let _ = writeln!(out, "{} {}: {}", c.severity.tag(), c.code, c.summary);
                for d in &c.detail {
                    let _ = writeln!(out, "    {d}");
                }
            }
        }
        out
    }

    /// Ceph-shaped JSON: status plus checks keyed by code.
    pub fn to_json(&self, detail: bool) -> serde_json::Value {
        let mut checks = serde_json::Map::new();
        for c in &self.checks {
            let mut v = serde_json::json!({
                "severity": c.severity.as_str(),
                "summary": { "message": c.summary, "count": c.detail.len() },
            });
            if detail {
                v["detail"] = c
                    .detail
                    .iter()
                    .map(|d| serde_json::json!({ "message": d }))
                    .collect();
            }
            checks.insert(c.code.clone(), v);
        }
        serde_json::json!({ "status": self.status.as_str(), "checks": checks })
    }
}

fn check(code: &str, severity: HealthStatus, summary: String, detail: Vec<String>) -> HealthCheck {
    HealthCheck {
        code: code.to_string(),
        severity,
        summary,
        detail,
    }
}

impl ClusterMap {
    /// Evaluates every monitor-side health check.
    pub fn health(&self, obs: &HealthInputs) -> HealthReport {
        let mut checks = Vec::new();
        checks.extend(self.check_mon_down(obs));
        checks.extend(self.check_clock_skew(obs));
        checks.extend(self.check_osd_down());
        checks.extend(self.check_osd_host_down());
        checks.extend(self.check_flags());
        checks.extend(self.check_too_few_osds());
        checks.extend(self.check_no_redundancy());
        checks.extend(self.check_placement());
        checks.extend(self.check_fullness());
        if let Some(view) = &obs.pgmap {
            checks.extend(self.pg_health_checks(view));
        }
        checks.extend(self.check_too_many_pgs());
        checks.extend(check_auth_insecure(obs));
        HealthReport::from_checks(checks)
    }

    fn check_mon_down(&self, obs: &HealthInputs) -> Option<HealthCheck> {
        if obs.quorum.is_empty() {
            return None;
        }
        let down: Vec<_> = self
            .mons
            .iter()
            .filter(|m| !obs.quorum.contains(&m.name))
            .collect();
        if down.is_empty() {
            return None;
        }
        let detail = down
            .iter()
            .map(|m| {
                format!(
                    "mon.{} (rank {}) at {} is down (out of quorum); check that its cairn daemon runs and that {} is reachable from the other monitors",
                    m.name, m.rank, m.addr, m.addr
                )
            })
            .collect();
        Some(check(
            "MON_DOWN",
            HealthStatus::Warn,
            format!(
                "{}/{} mons down, quorum {}",
                down.len(),
                self.mons.len(),
                obs.quorum.join(",")
            ),
            detail,
        ))
    }

    fn check_clock_skew(&self, obs: &HealthInputs) -> Option<HealthCheck> {
        let allowed_secs: f64 = self
            .config_value("mon", "mon_clock_drift_allowed")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.05);
        let allowed_ms = (allowed_secs * 1000.0) as i64;
        let skewed: Vec<(&String, &i64)> = obs
            .mon_clock_offsets_ms
            .iter()
            .filter(|(_, off)| off.abs() > allowed_ms)
            .collect();
        if skewed.is_empty() {
            return None;
        }
        let names: Vec<String> = skewed.iter().map(|(n, _)| format!("mon.{n}")).collect();
        let detail = skewed
            .iter()
            .map(|(n, off)| {
                format!(
                    "mon.{n} clock skew {:.3}s > max {allowed_secs}s; Cairn does not depend on clock agreement, but logs and timestamps will be off: fix time sync on that host (e.g. 'chronyc tracking')",
                    **off as f64 / 1000.0
                )
            })
            .collect();
        Some(check(
            "MON_CLOCK_SKEW",
            HealthStatus::Warn,
            format!("clock skew detected on {}", names.join(", ")),
            detail,
        ))
    }

    fn osd_location(&self, id: i32) -> String {
        match self.crush.parent_of_type(id, "host") {
            Some(h) => format!("host={h}"),
            None => "not in CRUSH".to_string(),
        }
    }

    fn check_osd_down(&self) -> Option<HealthCheck> {
        let down: Vec<i32> = self
            .osds
            .values()
            .filter(|o| !o.up && o.is_in)
            .map(|o| o.id)
            .collect();
        if down.is_empty() {
            return None;
        }
        let noout = self.flags.contains(&crate::model::OsdFlag::NoOut);
        let detail = down
            .iter()
            .map(|id| {
                let next = if noout {
                    "noout is set, so it will not be marked out".to_string()
                } else {
                    "it will be marked out after mon_osd_down_out_interval".to_string()
                };
                format!(
                    "osd.{id} ({}) is down; start its daemon or check its disk ({next})",
                    self.osd_location(*id)
                )
            })
            .collect();
        Some(check(
            "OSD_DOWN",
            HealthStatus::Warn,
            format!("{} osds down", down.len()),
            detail,
        ))
    }

    fn check_osd_host_down(&self) -> Option<HealthCheck> {
        let mut hosts: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for o in self.osds.values() {
            if let Some(h) = self.crush.parent_of_type(o.id, "host") {
                let e = hosts.entry(h).or_default();
                e.0 += 1;
                if !o.up && o.is_in {
                    e.1 += 1;
                }
            }
        }
        let down: Vec<(String, usize)> = hosts
            .into_iter()
            .filter(|(_, (total, down))| *total > 0 && down == total)
            .map(|(h, (total, _))| (h, total))
            .collect();
        if down.is_empty() {
            return None;
        }
        let osds: usize = down.iter().map(|(_, n)| n).sum();
        let detail = down
            .iter()
            .map(|(h, n)| {
                format!(
                    "host {h} ({n} osds) is down; check that the machine is powered and reachable and that its cairn daemon runs"
                )
            })
            .collect();
        Some(check(
            "OSD_HOST_DOWN",
            HealthStatus::Warn,
            format!("{} host ({osds} osds) down", down.len()),
            detail,
        ))
    }

    fn check_flags(&self) -> Option<HealthCheck> {
        if self.flags.is_empty() {
            return None;
        }
        let names: Vec<&str> = self.flags.iter().map(|f| f.as_str()).collect();
        let detail = names
            .iter()
            .map(|f| format!("{f} is set; clear it with 'cairn osd unset {f}' when done"))
            .collect();
        Some(check(
            "OSDMAP_FLAGS",
            HealthStatus::Warn,
            format!("{} flag(s) set", names.join(",")),
            detail,
        ))
    }

    fn check_too_few_osds(&self) -> Option<HealthCheck> {
        let want: usize = self
            .config_value("mon", "osd_pool_default_size")
            .and_then(|v| v.parse().ok())
            .unwrap_or(3);
        let have = self.osds.len();
        if have >= want {
            return None;
        }
        Some(check(
            "TOO_FEW_OSDS",
            HealthStatus::Warn,
            format!("OSD count {have} < osd_pool_default_size {want}"),
            vec![format!(
                "the cluster has {have} OSDs but new pools keep {want} copies; add OSDs ('cairn disk add') or lower the default ('cairn config set global osd_pool_default_size {}')",
                have.max(1)
            )],
        ))
    }

    fn check_no_redundancy(&self) -> Option<HealthCheck> {
        let pools: Vec<_> = self
            .pools
            .values()
            .filter(|p| p.kind == PoolKind::Replicated && p.size == 1)
            .collect();
        if pools.is_empty() {
            return None;
        }
        let detail = pools
            .iter()
            .map(|p| {
                format!(
                    "pool '{}' has size 1: losing one disk loses its data; run 'cairn osd pool set {} size 3'",
                    p.name, p.name
                )
            })
            .collect();
        Some(check(
            "POOL_NO_REDUNDANCY",
            HealthStatus::Warn,
            format!("{} pool(s) have no replicas configured", pools.len()),
            detail,
        ))
    }

    fn check_placement(&self) -> Vec<HealthCheck> {
        let mut warn = Vec::new();
        let mut err = Vec::new();
        for p in self.pools.values() {
            let Some(short) = self.placement_shortfall(p) else {
                continue;
            };
            if short.min_placed < p.min_size as usize {
                err.push(short.describe(p));
            } else {
                warn.push(short.describe(p));
            }
        }
        let mut out = Vec::new();
        if !err.is_empty() {
            out.push(check(
                "POOL_PLACEMENT_INACTIVE",
                HealthStatus::Err,
                format!(
                    "{} pool(s) cannot place min_size OSDs in distinct failure domains; I/O to affected PGs will block",
                    err.len()
                ),
                err,
            ));
        }
        if !warn.is_empty() {
            out.push(check(
                "POOL_PLACEMENT_UNDERSIZED",
                HealthStatus::Warn,
                format!(
                    "{} pool(s) cannot place all replicas in distinct failure domains",
                    warn.len()
                ),
                warn,
            ));
        }
        out
    }
}

fn check_auth_insecure(obs: &HealthInputs) -> Option<HealthCheck> {
    if obs.insecure_key_files.is_empty() {
        return None;
    }
    let detail = obs
        .insecure_key_files
        .iter()
        .map(|f| format!("{f} is readable by other users; run 'chmod 600 {f}'"))
        .collect();
    Some(check(
        "AUTH_INSECURE",
        HealthStatus::Warn,
        format!(
            "{} key file(s) readable by other users",
            obs.insecure_key_files.len()
        ),
        detail,
    ))
}

/// How far a pool's rule falls short of `size` on the current map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacementShortfall {
    pub rule_name: String,
    pub failure_domain: String,
    pub sampled: u32,
    pub short_inputs: u32,
    pub min_placed: usize,
}

impl PlacementShortfall {
    pub fn describe(&self, p: &crate::model::Pool) -> String {
        let fix = match p.kind {
            PoolKind::Replicated => format!(
                "lower the size ('cairn osd pool set {} size {}') or use a rule with a smaller failure domain",
                p.name,
                self.min_placed.max(1)
            ),
            PoolKind::Erasure => "or recreate the pool with a profile of fewer chunks (k+m) or a smaller crush-failure-domain".to_string(),
        };
        format!(
            "pool '{}' (size {}, min_size {}, crush_rule '{}', failure domain {}): CRUSH placed only {} of {} OSDs in distinct {}s for {} of {} sampled PGs; add OSDs in more {}s, {fix}",
            p.name,
            p.size,
            p.min_size,
            self.rule_name,
            self.failure_domain,
            self.min_placed,
            p.size,
            self.failure_domain,
            self.short_inputs,
            self.sampled,
            self.failure_domain,
        )
    }
}

impl ClusterMap {
    /// The 16.16 reweights CRUSH uses: out OSDs 0, in OSDs their reweight.
    pub fn crush_reweights(&self) -> Vec<u32> {
        let max_id = self
            .crush
            .device_ids()
            .into_iter()
            .chain(self.osds.keys().copied())
            .max()
            .unwrap_or(-1);
        let len = usize::try_from(max_id + 1).unwrap_or(0);
        let mut w = vec![0u32; len];
        for o in self.osds.values() {
            if let Ok(i) = usize::try_from(o.id) {
                if o.is_in && i < len {
                    w[i] = (o.reweight.clamp(0.0, 1.0) * 65536.0).round() as u32;
                }
            }
        }
        w
    }

    /// The failure domain type of a rule (the `type` of its choose step).
    pub fn rule_failure_domain(&self, rule_id: i32) -> String {
        self.crush
            .rules()
            .into_iter()
            .find(|r| r.id == rule_id)
            .and_then(|r| {
                r.steps_text.iter().find_map(|s| {
                    let words: Vec<&str> = s.split_whitespace().collect();
                    if !words.first().is_some_and(|w| w.starts_with("choose")) {
                        return None;
                    }
                    words
                        .iter()
                        .position(|w| *w == "type")
                        .and_then(|i| words.get(i + 1))
                        .map(|t| t.to_string())
                })
            })
            .unwrap_or_else(|| "failure domain".to_string())
    }

    /// Tries the pool's rule on a sample of inputs; `None` when every input
    /// got `size` OSDs.
    pub fn placement_shortfall(&self, p: &crate::model::Pool) -> Option<PlacementShortfall> {
        let reweights = self.crush_reweights();
        let size = p.size as usize;
        let sampled = PLACEMENT_SAMPLE_INPUTS.min(p.pg_num.max(1));
        let mut short_inputs = 0;
        let mut min_placed = size;
        for x in 0..sampled {
            let placed = self
                .crush
                .do_rule(p.crush_rule, x, size, &reweights)
                .into_iter()
                .filter(|&o| o >= 0 && o != cairn_crush::CRUSH_ITEM_NONE)
                .count();
            if placed < size {
                short_inputs += 1;
                min_placed = min_placed.min(placed);
            }
        }
        if short_inputs == 0 {
            return None;
        }
        let rule_name = self
            .crush
            .rules()
            .into_iter()
            .find(|r| r.id == p.crush_rule)
            .map(|r| r.name)
            .unwrap_or_else(|| format!("#{}", p.crush_rule));
        Some(PlacementShortfall {
            rule_name,
            failure_domain: self.rule_failure_domain(p.crush_rule),
            sampled,
            short_inputs,
            min_placed,
        })
    }
}
