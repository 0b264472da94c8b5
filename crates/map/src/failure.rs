//! The monitor leader's failure judge, as a state machine: it takes OSD
//! failure reports and beacons with the leader's monotonic `now`, and says
//! which map changes to propose: `OsdFailed` when reports from enough
//! distinct subtrees agree (`failure_reports_suffice`) or when an OSD's
//! beacons stopped for `mon_osd_report_timeout`, and `OsdAutoOut` when a
//! down OSD stayed down for `mon_osd_down_out_interval`
//! (`auto_out_candidates`: `noout`, the subtree limit and the minimum in
//! ratio apply). Clocks of other machines are never consulted; a new
//! leader starts a new judge, so every timer restarts after an election.
//! Does not own the PG statistics (`pgmap`) or the proposing (the runtime).

use crate::command::MonCommand;
use crate::model::ClusterMap;
use cairn_types::Epoch;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Failure reports kept per target OSD, at most (one per reporter).
pub const REPORTERS_PER_TARGET_MAX: usize = 1024;

/// Leader-local failure and liveness bookkeeping.
#[derive(Debug, Clone)]
pub struct FailureJudge {
    /// target -> reporter -> when the report was last (re)sent.
    reports: BTreeMap<i32, BTreeMap<i32, Instant>>,
    /// OSD -> (its `up_from` when seen, last beacon or boot seen).
    last_beacon: BTreeMap<i32, (Epoch, Instant)>,
    /// OSD -> (its `down_at` when seen, when this leader first saw it down).
    down_since: BTreeMap<i32, (Epoch, Instant)>,
}

fn secs(map: &ClusterMap, who: &str, key: &str, default: u64) -> u64 {
    map.config_value(who, key)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

impl FailureJudge {
    pub fn new() -> FailureJudge {
        FailureJudge {
            reports: BTreeMap::new(),
            last_beacon: BTreeMap::new(),
            down_since: BTreeMap::new(),
        }
    }

    /// How long a failure report stays valid without being resent: twice
    /// the reporters' grace, and at least four heartbeat intervals.
    pub fn report_expiry(map: &ClusterMap) -> Duration {
        let grace = secs(map, "osd", "osd_heartbeat_grace", 20);
        let interval = secs(map, "osd", "osd_heartbeat_interval", 6);
        Duration::from_secs((2 * grace).max(4 * interval))
    }

    /// `reporter` says `target` has not answered its heartbeats
    /// (`failed`), or answers again (`!failed`, the report is withdrawn).
    /// Returns `OsdFailed` when the reports now suffice.
    pub fn report(
        &mut self,
        now: Instant,
        map: &ClusterMap,
        reporter: i32,
        target: i32,
        failed: bool,
    ) -> Option<MonCommand> {
        if !failed {
            if let Some(r) = self.reports.get_mut(&target) {
                r.remove(&reporter);
            }
            return None;
        }
        if reporter == target || !map.osds.get(&target).is_some_and(|o| o.up) {
            return None;
        }
        let r = self.reports.entry(target).or_default();
        if r.len() < REPORTERS_PER_TARGET_MAX || r.contains_key(&reporter) {
            r.insert(reporter, now);
        }
        self.judge(now, map, target)
    }

    /// An OSD's beacon arrived.
    pub fn beacon(&mut self, now: Instant, map: &ClusterMap, osd: i32) {
        if let Some(o) = map.osds.get(&osd) {
            self.last_beacon.insert(osd, (o.up_from, now));
        }
    }

    /// Reporters currently holding a valid report against `target`.
    pub fn reporters(&self, target: i32) -> Vec<i32> {
        self.reports
            .get(&target)
            .map(|r| r.keys().copied().collect())
            .unwrap_or_default()
    }

    fn judge(&mut self, now: Instant, map: &ClusterMap, target: i32) -> Option<MonCommand> {
        let expiry = Self::report_expiry(map);
        let r = self.reports.get_mut(&target)?;
        r.retain(|rep, at| {
            now.saturating_duration_since(*at) <= expiry && map.osds.get(rep).is_some_and(|o| o.up)
        });
        let reporters: Vec<i32> = r.keys().copied().collect();
        if map.failure_reports_suffice(target, &reporters) {
            Some(MonCommand::OsdFailed { id: target })
        } else {
            None
        }
    }

    /// Periodic decisions on the current map: failures judged from reports
    /// and missed beacons, then OSDs due to be marked out.
    pub fn tick(&mut self, now: Instant, map: &ClusterMap) -> Vec<MonCommand> {
        let mut out = Vec::new();
        // Forget what the map made moot: targets already down or gone.
        self.reports
            .retain(|t, _| map.osds.get(t).is_some_and(|o| o.up));
        let targets: Vec<i32> = self.reports.keys().copied().collect();
        for t in targets {
            if let Some(c) = self.judge(now, map, t) {
                out.push(c);
            }
        }
        let timeout = Duration::from_secs(secs(map, "mon", "mon_osd_report_timeout", 900));
        let nodown = map.flags.contains(&crate::model::OsdFlag::NoDown);
        self.last_beacon
            .retain(|id, _| map.osds.get(id).is_some_and(|o| o.up));
        for o in map.osds.values().filter(|o| o.up) {
            let e = self.last_beacon.entry(o.id).or_insert((o.up_from, now));
            if e.0 != o.up_from {
                // A new boot counts as a beacon.
                *e = (o.up_from, now);
            }
            let failed = MonCommand::OsdFailed { id: o.id };
            if !nodown && now.saturating_duration_since(e.1) > timeout && !out.contains(&failed) {
                out.push(failed);
            }
        }
        self.down_since
            .retain(|id, _| map.osds.get(id).is_some_and(|o| !o.up));
        let mut down_for: BTreeMap<i32, u64> = BTreeMap::new();
        for o in map.osds.values().filter(|o| !o.up) {
            let e = self.down_since.entry(o.id).or_insert((o.down_at, now));
            if e.0 != o.down_at {
                *e = (o.down_at, now);
            }
            down_for.insert(o.id, now.saturating_duration_since(e.1).as_secs());
        }
        for id in map.auto_out_candidates(&down_for) {
            out.push(MonCommand::OsdAutoOut { id });
        }
        out
    }
}

impl Default for FailureJudge {
    fn default() -> Self {
        FailureJudge::new()
    }
}
