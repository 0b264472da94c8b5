//! What the monitor leader keeps in memory about the OSDs, outside the
//! Raft-replicated map (like Ceph's mgr PGMap and the mon's failure
//! tracking): the last beacon of each OSD (store usage and PG reports), the
//! failure judge and the blocklist entries' expiry timers. All belong to one leadership term: a new leader (or
//! a new term) starts empty, so every timer restarts on the new leader's
//! monotonic clock and nothing depends on clocks agreeing across machines.
//! Proposing the judge's decisions is the service's job.

use cairn_map::{
    BlocklistExpiry, ClusterMap, FailureJudge, MonCommand, OsdBeacon, OsdStatsEntry, PgMapView,
    RecoveryRate,
};
use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::time::Duration;
use tokio::time::Instant;

/// A beacon older than this many beacon intervals is stale: its PGs show
/// `stale+…` and its usage no longer counts.
pub const BEACON_STALE_INTERVALS: u64 = 3;
/// A beacon is never stale sooner than this.
pub const BEACON_STALE_MIN: Duration = Duration::from_secs(10);
/// Recovery rates are averaged over this window of beacons.
pub const RECOVERY_RATE_WINDOW: Duration = Duration::from_secs(30);
/// Rate samples kept at most.
const RATE_SAMPLES_MAX: usize = 256;

/// A stale beacon is forgotten after this (its PGs then show `unknown`).
pub const BEACON_FORGET_AFTER: Duration = Duration::from_secs(600);

/// The leader's per-term OSD bookkeeping.
pub struct LeaderReports {
    /// Raft term this state belongs to.
    pub term: u64,
    judge: FailureJudge,
    /// Blocklist entries' expiry timers (`cairn_map::blocklist`).
    blocklist: BlocklistExpiry,
    beacons: BTreeMap<i32, (Instant, OsdBeacon)>,
    /// (when, bytes, objects) of cluster-wide recovery counters, on this
    /// leader's monotonic clock.
    rate_samples: VecDeque<(Instant, u64, u64)>,
}

/// How old a beacon may be before it is stale, from the map's config.
pub fn beacon_stale_after(map: &ClusterMap) -> Duration {
    let interval = map
        .config_value("osd", "osd_beacon_report_interval")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(5);
    Duration::from_secs(interval * BEACON_STALE_INTERVALS).max(BEACON_STALE_MIN)
}

impl LeaderReports {
    pub fn new(term: u64) -> LeaderReports {
        LeaderReports {
            term,
            judge: FailureJudge::new(),
            blocklist: BlocklistExpiry::new(),
            beacons: BTreeMap::new(),
            rate_samples: VecDeque::new(),
        }
    }

    /// Handles a report command from an OSD; returns the map changes to
    /// propose, if the report settles any. Errors say why it was refused.
    pub fn handle(
        &mut self,
        now: Instant,
        map: &ClusterMap,
        cmd: &MonCommand,
    ) -> Result<Vec<MonCommand>, String> {
        match cmd {
            MonCommand::OsdBeacon { id, beacon } => {
                if !map.osds.contains_key(id) {
                    return Err(format!("osd.{id} is not in the map"));
                }
                beacon.validate(*id)?;
                self.judge.beacon(now.into_std(), map, *id);
                self.beacons.insert(*id, (now, beacon.clone()));
                self.sample_recovery(now);
                // The OSD's own usage figures against the map's full
                // ratios (no clock involved); then operator scrub orders
                // the beacon shows carried out leave the map.
                let mut out: Vec<MonCommand> =
                    map.fullness_change(*id, beacon).into_iter().collect();
                out.extend(map.scrub_orders_settled_by(*id, beacon));
                Ok(out)
            }
            MonCommand::OsdFailureReport { id, target, failed } => {
                if !map.osds.contains_key(target) {
                    return Err(format!("osd.{target} is not in the map"));
                }
                let decision = self
                    .judge
                    .report(now.into_std(), map, *id, *target, *failed);
                if let Some(MonCommand::OsdFailed { id: t }) = &decision {
                    tracing::info!(
                        "osd.{t} failed: reported by {:?} (heartbeats)",
                        self.judge.reporters(*t)
                    );
                }
                Ok(decision.into_iter().collect())
            }
            other => Err(format!("'{}' is not an OSD report", other.verb())),
        }
    }

    /// Periodic decisions (failures from reports or missed beacons, OSDs
    /// due to be marked out, blocklist entries that ran out); also forgets
    /// old beacons.
    pub fn tick(&mut self, now: Instant, map: &ClusterMap) -> Vec<MonCommand> {
        self.beacons.retain(|id, (at, _)| {
            map.osds.contains_key(id) && now.duration_since(*at) <= BEACON_FORGET_AFTER
        });
        let mut out = self.judge.tick(now.into_std(), map);
        out.extend(self.blocklist.tick(now.into_std(), map));
        out
    }

    /// Records the cluster-wide recovery counters (sums over the last
    /// beacon of every OSD). A counter that went down (an OSD restarted,
    /// a PG moved) restarts the window.
    fn sample_recovery(&mut self, now: Instant) {
        let (mut bytes, mut objects) = (0u64, 0u64);
        for (_, b) in self.beacons.values() {
            for r in &b.pgs {
                bytes += r.recovered_bytes;
                objects += r.recovered_objects;
            }
        }
        if self
            .rate_samples
            .back()
            .is_some_and(|(_, b, o)| bytes < *b || objects < *o)
        {
            self.rate_samples.clear();
        }
        self.rate_samples.push_back((now, bytes, objects));
        while self.rate_samples.len() > RATE_SAMPLES_MAX
            || self
                .rate_samples
                .front()
                .is_some_and(|(t, _, _)| now.duration_since(*t) > RECOVERY_RATE_WINDOW)
        {
            self.rate_samples.pop_front();
        }
    }

    /// Recovery rate over the window, None when nothing moved.
    pub fn recovery_rate(&self) -> Option<RecoveryRate> {
        let (t0, b0, o0) = *self.rate_samples.front()?;
        let (t1, b1, o1) = *self.rate_samples.back()?;
        let secs = t1.duration_since(t0).as_secs_f64();
        if secs < 1.0 || (b1 == b0 && o1 == o0) {
            return None;
        }
        Some(RecoveryRate {
            bytes_per_sec: (b1 - b0) as f64 / secs,
            objects_per_sec: (o1 - o0) as f64 / secs,
        })
    }

    /// The PG statistics as queries and health checks see them.
    pub fn view(&self, now: Instant, map: &ClusterMap) -> PgMapView {
        let stale_after = beacon_stale_after(map);
        let osds = self
            .beacons
            .iter()
            .map(|(id, (at, b))| {
                let age = now.duration_since(*at);
                (
                    *id,
                    OsdStatsEntry {
                        age_secs: age.as_secs(),
                        stale: age > stale_after,
                        beacon: b.clone(),
                    },
                )
            })
            .collect();
        PgMapView {
            osds,
            recovery: self.recovery_rate(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_map::{ApplyContext, AuthEntity, MonInfo, OsdReported};
    use cairn_types::EntityName;

    fn map_with_osds(n: i32) -> ClusterMap {
        let mut m = ClusterMap::new_cluster(
            "5afc28eb-61b3-45f1-b441-6f913fd70505",
            MonInfo {
                name: "a".into(),
                addr: "127.0.0.1:1".into(),
                rank: 0,
            },
            AuthEntity::new(&[1; 32], &[("mon", "allow *")]),
        );
        let ctx = ApplyContext {
            caller: EntityName::client("admin"),
            generated_secret: None,
        };
        for i in 0..n {
            let uuid = format!("00000000-0000-0000-0000-{i:012x}");
            let cmd = MonCommand::OsdNew {
                uuid: uuid.clone(),
                id: None,
                host: format!("h{i}"),
                weight: 1.0,
                class: None,
            };
            let id = m.apply(&cmd, &ctx).expect("new").json["osdid"]
                .as_i64()
                .expect("id") as i32;
            let boot = MonCommand::OsdBoot {
                id,
                uuid,
                addrs: vec![format!("127.0.0.1:{}", 7000 + id)],
                reported: OsdReported::default(),
            };
            m.apply(&boot, &ctx).expect("boot");
        }
        m
    }

    #[test]
    fn beacons_go_stale_then_are_forgotten_and_reports_decide() {
        let m = map_with_osds(3);
        let t0 = Instant::now();
        let mut r = LeaderReports::new(7);
        let beacon = |total| MonCommand::OsdBeacon {
            id: 0,
            beacon: OsdBeacon {
                epoch: m.epoch.0,
                total_bytes: total,
                used_bytes: 10,
                available_bytes: 80,
                pgs: Vec::new(),
            },
        };
        assert_eq!(r.handle(t0, &m, &beacon(100)), Ok(vec![]));
        // More used than total: refused, nothing kept changes.
        assert!(r.handle(t0, &m, &beacon(5)).is_err());
        let v = r.view(t0 + Duration::from_secs(2), &m);
        assert!(!v.osds[&0].stale && v.osds[&0].beacon.total_bytes == 100);
        let stale_at = t0 + beacon_stale_after(&m) + Duration::from_secs(1);
        assert!(r.view(stale_at, &m).osds[&0].stale);
        r.tick(t0 + BEACON_FORGET_AFTER + Duration::from_secs(1), &m);
        assert!(r.view(t0, &m).osds.is_empty());
        // Two hosts report osd.2: the second report settles it.
        let rep = |id| MonCommand::OsdFailureReport {
            id,
            target: 2,
            failed: true,
        };
        assert_eq!(r.handle(t0, &m, &rep(0)), Ok(vec![]));
        assert_eq!(
            r.handle(t0, &m, &rep(1)),
            Ok(vec![MonCommand::OsdFailed { id: 2 }])
        );
        // A beacon over the full ratio: the leader proposes the mark (once).
        let full = MonCommand::OsdBeacon {
            id: 1,
            beacon: OsdBeacon {
                epoch: m.epoch.0,
                total_bytes: 100,
                used_bytes: 96,
                available_bytes: 4,
                pgs: Vec::new(),
            },
        };
        let mark = MonCommand::OsdFullness {
            id: 1,
            used_bytes: 96,
            total_bytes: 100,
        };
        assert_eq!(r.handle(t0, &m, &full), Ok(vec![mark.clone()]));
        let mut marked = m.clone();
        let ctx = ApplyContext {
            caller: EntityName::mon("a"),
            generated_secret: None,
        };
        marked.apply(&mark, &ctx).expect("mark");
        assert_eq!(r.handle(t0, &marked, &full), Ok(vec![]));
        let unknown = MonCommand::OsdFailureReport {
            id: 0,
            target: 9,
            failed: true,
        };
        assert!(r.handle(t0, &m, &unknown).is_err());
    }
}
