//! Full disks, cluster-wide: the three usage ratios of the OSD map
//! (`nearfull`, `backfillfull`, `full`; Ceph's `mon_osd_*_ratio`, set with
//! `osd set-nearfull-ratio|set-backfillfull-ratio|set-full-ratio`), the
//! per-OSD marks the monitor leader records from each OSD's own usage
//! figures (its beacon's used/total bytes, never a clock), the health checks
//! OSD_NEARFULL / OSD_BACKFILLFULL / OSD_FULL, and the answers the OSDs act
//! on: which member of a PG is full (writes refused) or too full to
//! backfill onto. Pure like the rest of the map.

use crate::error::CommandError;
use crate::health::{HealthCheck, HealthStatus};
use crate::model::{ClusterMap, Reply};
use crate::pgmap::OsdBeacon;
use crate::MonCommand;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Above this fraction of its capacity an OSD's own store refuses new data
/// (Ceph's `osd_failsafe_full_ratio`): the last line behind `full_ratio`,
/// which the monitors enforce for the whole cluster first. The OSD host
/// opens every store with it; `set-full-ratio` may not go above it.
pub const OSD_FAILSAFE_FULL_RATIO: f64 = 0.97;

/// The usage ratios of the OSD map, ordered nearfull <= backfillfull <= full.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FullRatios {
    pub nearfull: f64,
    pub backfillfull: f64,
    pub full: f64,
}

impl Default for FullRatios {
    fn default() -> Self {
        FullRatios {
            nearfull: 0.85,
            backfillfull: 0.90,
            full: 0.95,
        }
    }
}

/// Which ratio `osd set-*-ratio` sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FullRatioKind {
    Nearfull,
    Backfillfull,
    Full,
}

impl FullRatioKind {
    pub fn name(self) -> &'static str {
        match self {
            FullRatioKind::Nearfull => "nearfull_ratio",
            FullRatioKind::Backfillfull => "backfillfull_ratio",
            FullRatioKind::Full => "full_ratio",
        }
    }
    fn verb(self) -> &'static str {
        match self {
            FullRatioKind::Nearfull => "set-nearfull-ratio",
            FullRatioKind::Backfillfull => "set-backfillfull-ratio",
            FullRatioKind::Full => "set-full-ratio",
        }
    }
}

/// How full an OSD is against the map's ratios (Ok is not recorded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum FullState {
    Ok,
    Nearfull,
    Backfillfull,
    Full,
}

impl FullState {
    pub fn as_str(self) -> &'static str {
        match self {
            FullState::Ok => "ok",
            FullState::Nearfull => "nearfull",
            FullState::Backfillfull => "backfillfull",
            FullState::Full => "full",
        }
    }
}

/// An OSD the monitors marked nearfull or worse: its usage figures as it
/// reported them when the mark was last changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdFullness {
    pub state: FullState,
    pub used_bytes: u64,
    pub total_bytes: u64,
}

impl OsdFullness {
    /// Whole percent used (rounded down, so 95.9 % shows as 95 %).
    pub fn percent(&self) -> u64 {
        percent(self.used_bytes, self.total_bytes)
    }
}

fn percent(used: u64, total: u64) -> u64 {
    if total == 0 {
        return 0;
    }
    (u128::from(used) * 100 / u128::from(total)) as u64
}

/// The `osd set-*-ratio` verb of a central config key that Ceph names but
/// Cairn keeps in the OSD map (`config set` refuses it and says this).
pub fn ratio_in_map(key: &str) -> Option<&'static str> {
    match key {
        "mon_osd_nearfull_ratio" => Some(FullRatioKind::Nearfull.verb()),
        "mon_osd_backfillfull_ratio" => Some(FullRatioKind::Backfillfull.verb()),
        "mon_osd_full_ratio" => Some(FullRatioKind::Full.verb()),
        _ => None,
    }
}

impl FullRatios {
    /// The state of an OSD using `used` of `total` bytes.
    pub fn state_of(&self, used: u64, total: u64) -> FullState {
        if total == 0 {
            return FullState::Ok;
        }
        let r = used as f64 / total as f64;
        if r >= self.full {
            FullState::Full
        } else if r >= self.backfillfull {
            FullState::Backfillfull
        } else if r >= self.nearfull {
            FullState::Nearfull
        } else {
            FullState::Ok
        }
    }

    /// These ratios with `which` set to `ratio`, if valid and still ordered.
    fn with(self, which: FullRatioKind, ratio: f64) -> Result<FullRatios, String> {
        if !ratio.is_finite() || ratio <= 0.0 || ratio > 1.0 {
            return Err(format!(
                "{} {ratio} is out of range: it must be above 0 and at most 1",
                which.name()
            ));
        }
        if which == FullRatioKind::Full && ratio > OSD_FAILSAFE_FULL_RATIO {
            return Err(format!(
                "full_ratio {ratio} is above {OSD_FAILSAFE_FULL_RATIO}, where every OSD's own store already refuses new data (osd failsafe): the monitors could never mark an OSD full before its store fails writes"
            ));
        }
        let mut next = self;
        match which {
            FullRatioKind::Nearfull => next.nearfull = ratio,
            FullRatioKind::Backfillfull => next.backfillfull = ratio,
            FullRatioKind::Full => next.full = ratio,
        }
        if !(next.nearfull <= next.backfillfull && next.backfillfull <= next.full) {
            return Err(format!(
                "{} {ratio} would break the order nearfull_ratio <= backfillfull_ratio <= full_ratio (they would be {}, {}, {}); change the others first",
                which.name(),
                next.nearfull,
                next.backfillfull,
                next.full
            ));
        }
        Ok(next)
    }
}

impl ClusterMap {
    /// `osd set-nearfull-ratio|set-backfillfull-ratio|set-full-ratio R`;
    /// the marks the monitors recorded are re-judged at once against the
    /// new ratios (OSDs not marked are judged at their next beacon).
    pub(crate) fn set_full_ratio(
        &mut self,
        which: FullRatioKind,
        ratio: f64,
    ) -> Result<Reply, CommandError> {
        self.full_ratios = self
            .full_ratios
            .with(which, ratio)
            .map_err(|e| CommandError::invalid(format!("osd {}: {e}", which.verb())))?;
        let ratios = self.full_ratios;
        self.osd_fullness.retain(|_, f| {
            f.state = ratios.state_of(f.used_bytes, f.total_bytes);
            f.state != FullState::Ok
        });
        Ok(crate::apply::done(format!("set {} {ratio}", which.name())))
    }

    /// Internal (monitor leader): osd.`id` reported `used` of `total` bytes
    /// and its mark must change.
    pub(crate) fn record_fullness(
        &mut self,
        id: i32,
        used: u64,
        total: u64,
    ) -> Result<Reply, CommandError> {
        if !self.osds.contains_key(&id) {
            return Err(CommandError::not_found(format!("osd.{id} does not exist")));
        }
        if used > total {
            return Err(CommandError::invalid(format!(
                "osd.{id}: {used} bytes used of {total} total"
            )));
        }
        let state = self.full_ratios.state_of(used, total);
        if state == FullState::Ok {
            self.osd_fullness.remove(&id);
        } else {
            self.osd_fullness.insert(
                id,
                OsdFullness {
                    state,
                    used_bytes: used,
                    total_bytes: total,
                },
            );
        }
        Ok(crate::apply::done(format!(
            "osd.{id} is {} ({}% used)",
            state.as_str(),
            percent(used, total)
        )))
    }

    /// The mark change an OSD's beacon calls for, if any: its state against
    /// the ratios changed, or it stays marked and its whole-percent use
    /// moved (so errors and health quote a current figure without a new
    /// epoch per beacon).
    pub fn fullness_change(&self, id: i32, beacon: &OsdBeacon) -> Option<MonCommand> {
        if beacon.total_bytes == 0 || beacon.used_bytes > beacon.total_bytes {
            return None;
        }
        let state = self
            .full_ratios
            .state_of(beacon.used_bytes, beacon.total_bytes);
        let pct = percent(beacon.used_bytes, beacon.total_bytes);
        let changed = match self.osd_fullness.get(&id) {
            None => state != FullState::Ok,
            Some(f) => f.state != state || f.percent() != pct,
        };
        changed.then_some(MonCommand::OsdFullness {
            id,
            used_bytes: beacon.used_bytes,
            total_bytes: beacon.total_bytes,
        })
    }

    /// The state the monitors marked osd.`id` with.
    pub fn full_state(&self, id: i32) -> FullState {
        self.osd_fullness
            .get(&id)
            .map(|f| f.state)
            .unwrap_or(FullState::Ok)
    }

    /// Why a write that adds data to a PG of pool `pool` held by `members`
    /// must be refused, if one of them is marked full.
    pub fn full_refusal(&self, pool: u64, members: &[i32]) -> Option<String> {
        let (id, f) = members.iter().find_map(|o| {
            self.osd_fullness
                .get(o)
                .filter(|f| f.state == FullState::Full)
                .map(|f| (*o, f))
        })?;
        let name = self
            .pools
            .get(&pool)
            .map(|p| p.name.clone())
            .unwrap_or_else(|| pool.to_string());
        Some(format!(
            "pool '{name}' is full: osd.{id} is {}% used (full ratio {}); delete data or add disks",
            f.percent(),
            self.full_ratios.full
        ))
    }

    /// Why backfill onto `targets` must wait, if one of them is marked
    /// backfillfull (or full): Ceph's `backfill_toofull`.
    pub fn backfill_toofull(&self, targets: &[i32]) -> Option<String> {
        let (id, f) = targets.iter().find_map(|o| {
            self.osd_fullness
                .get(o)
                .filter(|f| f.state >= FullState::Backfillfull)
                .map(|f| (*o, f))
        })?;
        Some(format!(
            "backfill_toofull: osd.{id} is {}% used (backfillfull ratio {}); it resumes when the OSD has room (delete data, add disks, or raise the ratio with 'cairn osd set-backfillfull-ratio')",
            f.percent(),
            self.full_ratios.backfillfull
        ))
    }

    /// OSD_FULL, OSD_BACKFILLFULL and OSD_NEARFULL from the marks in the map.
    pub(crate) fn check_fullness(&self) -> Vec<HealthCheck> {
        let r = self.full_ratios;
        let mut out = Vec::new();
        for (state, code, sev, ratio, what, advice) in [
            (
                FullState::Full,
                "OSD_FULL",
                HealthStatus::Err,
                r.full,
                "full",
                "writes to its PGs are refused; delete data or add disks",
            ),
            (
                FullState::Backfillfull,
                "OSD_BACKFILLFULL",
                HealthStatus::Warn,
                r.backfillfull,
                "backfillfull",
                "no backfill moves data onto it; delete data or add disks",
            ),
            (
                FullState::Nearfull,
                "OSD_NEARFULL",
                HealthStatus::Warn,
                r.nearfull,
                "nearfull",
                "add capacity or delete data before it is full",
            ),
        ] {
            let osds: Vec<(&i32, &OsdFullness)> = self
                .osd_fullness
                .iter()
                .filter(|(_, f)| f.state == state)
                .collect();
            if osds.is_empty() {
                continue;
            }
            let detail = osds
                .iter()
                .map(|(id, f)| {
                    format!(
                        "osd.{id} is {what}: {}% used ({} of {}, {what} ratio {ratio}); {advice}",
                        f.percent(),
                        crate::query::format_bytes(f.used_bytes),
                        crate::query::format_bytes(f.total_bytes),
                    )
                })
                .collect();
            out.push(HealthCheck {
                code: code.into(),
                severity: sev,
                summary: format!("{} {what} osd(s)", osds.len()),
                detail,
            });
        }
        out
    }

    /// `full_ratio` & co. as `osd dump` shows them (plain lines, JSON fields).
    pub(crate) fn full_ratio_lines(&self) -> (String, serde_json::Value) {
        let r = self.full_ratios;
        (
            format!(
                "full_ratio {}\nbackfillfull_ratio {}\nnearfull_ratio {}\n",
                r.full, r.backfillfull, r.nearfull
            ),
            json!({
                "full_ratio": r.full,
                "backfillfull_ratio": r.backfillfull,
                "nearfull_ratio": r.nearfull,
            }),
        )
    }

    /// Cluster-wide flags derived from the marks (`full`, `backfillfull`,
    /// `nearfull`), as `osd dump` and `status` show them beside the
    /// operator's flags.
    pub fn fullness_flags(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        for s in [
            FullState::Full,
            FullState::Backfillfull,
            FullState::Nearfull,
        ] {
            if self.osd_fullness.values().any(|f| f.state == s) {
                out.push(s.as_str());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_are_checked_and_ordered() {
        let r = FullRatios::default();
        assert!(r.with(FullRatioKind::Full, 1.5).is_err());
        assert!(r.with(FullRatioKind::Full, 0.0).is_err());
        assert!(r.with(FullRatioKind::Full, f64::NAN).is_err());
        assert!(r.with(FullRatioKind::Full, 0.98).is_err());
        assert!(r.with(FullRatioKind::Nearfull, 0.91).is_err());
        assert!(r.with(FullRatioKind::Full, 0.89).is_err());
        let ok = r.with(FullRatioKind::Full, 0.97).expect("ordered");
        assert_eq!(ok.full, 0.97);
        assert_eq!(r.state_of(96, 100), FullState::Full);
        assert_eq!(r.state_of(90, 100), FullState::Backfillfull);
        assert_eq!(r.state_of(85, 100), FullState::Nearfull);
        assert_eq!(r.state_of(84, 100), FullState::Ok);
        assert_eq!(r.state_of(0, 0), FullState::Ok);
    }
}
