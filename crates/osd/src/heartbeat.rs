//! OSD-to-OSD heartbeats and failure reports. Each OSD pings the OSDs it
//! shares PGs with, plus its nearest up neighbours by id (so an OSD without
//! PGs is still watched), every `osd_heartbeat_interval`, over its own
//! authenticated connection per peer (never queued behind replication
//! traffic). A peer that has left a ping unanswered for
//! `osd_heartbeat_grace` (counted from the oldest ping sent since its last
//! answer, as Ceph does) is reported failed to the monitors, again every
//! interval while it stays silent; the report is withdrawn as soon as it
//! answers. Only this process's monotonic clock is used.
//!
//! [`HeartbeatTracker`] is the pure state machine (events in, actions out);
//! [`run`] is the tokio edge that sends pings and reports. Owns neither the
//! monitors' judgement (`cairn_map::FailureJudge`) nor PG state.

use crate::runtime::Shared;
use cairn_map::{ClusterMap, MonCommand};
use cairn_msg::{connect, Connection, Credentials, Message, MsgConfig};
use cairn_ops::{decode, encode};
use cairn_types::{EntityName, Epoch};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Heartbeat ping: [`HbPing`] -> [`HbPong`] (type [`MSG_HB_PONG`]). In the
/// OSD range next to cairn-ops' message types.
pub const MSG_HB_PING: u16 = 0x0580;
pub const MSG_HB_PONG: u16 = 0x0581;
/// How often the tracker looks at its peers (failures are noticed within
/// this of the grace running out).
pub const HB_TICK: Duration = Duration::from_millis(250);
/// Neighbours by id watched on each side, besides PG peers.
pub const HB_NEIGHBOURS_EACH_SIDE: usize = 1;
/// Longest a connect to a peer may take before the ping counts as lost.
pub const HB_CONNECT_TIMEOUT_MAX: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HbPing {
    pub from: i32,
    pub epoch: Epoch,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HbPong {
    pub from: i32,
    pub epoch: Epoch,
}

/// What the tracker wants done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HbAction {
    Ping(i32),
    /// Tell the monitors `target` failed (`failed`) or answers again.
    Report {
        target: i32,
        failed: bool,
    },
}

#[derive(Debug, Clone)]
struct PeerState {
    /// The peer's `up_from`: a new boot restarts its bookkeeping.
    up_from: Epoch,
    /// When the oldest ping not followed by any answer was sent: the
    /// grace runs from here.
    unanswered_since: Option<Instant>,
    last_ping: Option<Instant>,
    /// When we last reported it failed (`None` = not reported).
    reported_at: Option<Instant>,
}

/// Per-peer heartbeat bookkeeping of one OSD.
#[derive(Debug, Clone)]
pub struct HeartbeatTracker {
    peers: BTreeMap<i32, PeerState>,
}

impl HeartbeatTracker {
    pub fn new() -> HeartbeatTracker {
        HeartbeatTracker {
            peers: BTreeMap::new(),
        }
    }

    /// The peers to watch now (id -> `up_from`). New or rebooted peers start
    /// afresh; dropped peers that were reported get their report withdrawn.
    pub fn set_peers(&mut self, want: &BTreeMap<i32, Epoch>) -> Vec<HbAction> {
        let mut out = Vec::new();
        let gone: Vec<i32> = self
            .peers
            .keys()
            .filter(|p| !want.contains_key(p))
            .copied()
            .collect();
        for p in gone {
            if let Some(st) = self.peers.remove(&p) {
                if st.reported_at.is_some() {
                    out.push(HbAction::Report {
                        target: p,
                        failed: false,
                    });
                }
            }
        }
        for (&p, &up_from) in want {
            let fresh = PeerState {
                up_from,
                unanswered_since: None,
                last_ping: None,
                reported_at: None,
            };
            match self.peers.get_mut(&p) {
                Some(st) if st.up_from == up_from => {}
                Some(st) => *st = fresh,
                None => {
                    self.peers.insert(p, fresh);
                }
            }
        }
        out
    }

    /// `peer` answered a ping.
    pub fn on_reply(&mut self, peer: i32) -> Vec<HbAction> {
        let Some(st) = self.peers.get_mut(&peer) else {
            return Vec::new();
        };
        st.unanswered_since = None;
        if st.reported_at.take().is_some() {
            return vec![HbAction::Report {
                target: peer,
                failed: false,
            }];
        }
        Vec::new()
    }

    /// Pings due every `interval`; a failure report once a ping has gone
    /// unanswered for `grace`, repeated every `interval` while the silence
    /// lasts.
    pub fn tick(&mut self, now: Instant, interval: Duration, grace: Duration) -> Vec<HbAction> {
        let mut out = Vec::new();
        for (&p, st) in self.peers.iter_mut() {
            if st
                .last_ping
                .is_none_or(|t| now.saturating_duration_since(t) >= interval)
            {
                st.last_ping = Some(now);
                st.unanswered_since.get_or_insert(now);
                out.push(HbAction::Ping(p));
            }
            if st
                .unanswered_since
                .is_some_and(|t| now.saturating_duration_since(t) > grace)
                && st
                    .reported_at
                    .is_none_or(|t| now.saturating_duration_since(t) >= interval)
            {
                st.reported_at = Some(now);
                out.push(HbAction::Report {
                    target: p,
                    failed: true,
                });
            }
        }
        out
    }

    /// Peers currently reported failed.
    pub fn reported(&self) -> Vec<i32> {
        self.peers
            .iter()
            .filter(|(_, s)| s.reported_at.is_some())
            .map(|(p, _)| *p)
            .collect()
    }

    pub fn peers(&self) -> Vec<i32> {
        self.peers.keys().copied().collect()
    }
}

impl Default for HeartbeatTracker {
    fn default() -> Self {
        HeartbeatTracker::new()
    }
}

/// The up OSDs `me` must watch on `map` (id -> `up_from`): every OSD in an
/// up set with `me`, plus the nearest up OSDs by id on each side.
pub fn heartbeat_peers(map: &ClusterMap, me: i32) -> BTreeMap<i32, Epoch> {
    let mut ids: BTreeSet<i32> = BTreeSet::new();
    for (pid, pool) in &map.pools {
        for seed in 0..pool.pg_num {
            let Ok(m) = map.pg_to_up(*pid, seed) else {
                continue;
            };
            if m.up.contains(&me) || m.acting.contains(&me) {
                ids.extend(m.up.iter().chain(&m.acting).copied().filter(|o| *o >= 0));
            }
        }
    }
    // Other up OSDs in id order; `pos` is where `me` would sit.
    let up: Vec<i32> = map
        .osds
        .values()
        .filter(|o| o.up && o.id != me)
        .map(|o| o.id)
        .collect();
    let n = up.len();
    let pos = up.iter().position(|o| *o > me).unwrap_or(n);
    for k in 0..HB_NEIGHBOURS_EACH_SIDE.min(n) {
        ids.insert(up[(pos + k) % n]);
        ids.insert(up[(pos + n - 1 - k) % n]);
    }
    ids.remove(&me);
    ids.into_iter()
        .filter_map(|o| map.osds.get(&o).filter(|i| i.up).map(|i| (o, i.up_from)))
        .collect()
}

fn secs_cfg(map: &ClusterMap, me: i32, key: &str, default: u64) -> Duration {
    let v = map
        .config_value(&format!("osd.{me}"), key)
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(default);
    Duration::from_secs(v.max(1))
}

/// Answers a heartbeat ping from a peer OSD.
pub(crate) async fn answer_ping(shared: &Arc<Shared>, conn: &Connection, msg: Message) {
    let pong = HbPong {
        from: shared.cfg.id,
        epoch: shared.map_rx.borrow().epoch,
    };
    let _ = conn.reply(&msg, MSG_HB_PONG, encode(&pong)).await;
}

/// A cached heartbeat connection per peer (address it was made to).
type HbConns = Arc<tokio::sync::Mutex<BTreeMap<i32, (String, Connection)>>>;

/// The heartbeat task of one OSD: follows the map, pings peers and sends
/// failure reports through `mon` until the OSD stops.
pub(crate) async fn run(shared: Arc<Shared>, mon: crate::runtime::MonRequests) {
    let me = shared.cfg.id;
    let mut tracker = HeartbeatTracker::new();
    let (reply_tx, mut reply_rx) = mpsc::channel::<i32>(1024);
    let conns: HbConns = Arc::default();
    let mut in_flight: BTreeSet<i32> = BTreeSet::new();
    let (done_tx, mut done_rx) = mpsc::channel::<i32>(1024);
    let mut map_rx = shared.map_rx.clone();
    let mut seen_epoch = Epoch(0);
    let mut tick = tokio::time::interval(HB_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let mut acts = Vec::new();
        tokio::select! {
            _ = tick.tick() => {}
            Some(p) = reply_rx.recv() => acts.extend(tracker.on_reply(p)),
            Some(p) = done_rx.recv() => { in_flight.remove(&p); }
            r = map_rx.changed() => if r.is_err() { return },
        }
        let map = shared.map_rx.borrow().clone();
        let now = Instant::now();
        if map.epoch != seen_epoch {
            seen_epoch = map.epoch;
            let peers = if map.osds.get(&me).is_some_and(|o| o.up) {
                heartbeat_peers(&map, me)
            } else {
                // Marked down: our reports would not count; watch nobody.
                BTreeMap::new()
            };
            acts.extend(tracker.set_peers(&peers));
            // Close connections to peers no longer watched (their reader
            // tasks would otherwise keep them open).
            conns.lock().await.retain(|p, (_, c)| {
                let keep = peers.contains_key(p);
                if !keep {
                    c.close();
                }
                keep
            });
        }
        let interval = secs_cfg(&map, me, "osd_heartbeat_interval", 6);
        let grace = secs_cfg(&map, me, "osd_heartbeat_grace", 20);
        acts.extend(tracker.tick(now, interval, grace));
        for a in acts {
            match a {
                HbAction::Ping(p) => {
                    if !in_flight.insert(p) {
                        continue;
                    }
                    let (s, c, r, d) = (
                        shared.clone(),
                        conns.clone(),
                        reply_tx.clone(),
                        done_tx.clone(),
                    );
                    let timeout = interval.min(grace);
                    shared.tasks_spawn(async move {
                        if ping(&s, &c, p, timeout).await {
                            let _ = r.send(p).await;
                        }
                        let _ = d.send(p).await;
                    });
                }
                HbAction::Report { target, failed } => {
                    if failed {
                        tracing::warn!(
                            "osd.{me}: osd.{target} has not answered heartbeats for {grace:?}; reporting it failed"
                        );
                    } else {
                        tracing::info!(
                            "osd.{me}: osd.{target} answers again; withdrawing the failure report"
                        );
                    }
                    let cmd = MonCommand::OsdFailureReport {
                        id: me,
                        target,
                        failed,
                    };
                    if mon.try_send(cmd).is_err() {
                        tracing::warn!("osd.{me}: monitor request queue full; failure report about osd.{target} dropped (resent next interval)");
                    }
                }
            }
        }
    }
}

/// One ping to `peer` over its heartbeat connection; true if it answered
/// within `timeout`.
async fn ping(shared: &Arc<Shared>, conns: &HbConns, peer: i32, timeout: Duration) -> bool {
    let Some(addr) = shared
        .map_rx
        .borrow()
        .osds
        .get(&peer)
        .and_then(|o| o.addrs.first().cloned())
    else {
        return false;
    };
    let cached = {
        let g = conns.lock().await;
        g.get(&peer)
            .filter(|(a, c)| *a == addr && !c.is_closed())
            .map(|(_, c)| c.clone())
    };
    let conn = match cached {
        Some(c) => c,
        None => {
            // A cached connection to an old address (or a closed one) goes.
            if let Some((_, old)) = conns.lock().await.remove(&peer) {
                old.close();
            }
            let Ok(sa) = addr.parse() else {
                return false;
            };
            let cfg = MsgConfig {
                connect_timeout: timeout.min(HB_CONNECT_TIMEOUT_MAX),
                handshake_timeout: timeout.min(HB_CONNECT_TIMEOUT_MAX),
                ..shared.cfg.msg.clone()
            };
            let creds = Credentials::Key {
                name: EntityName::osd(shared.cfg.id),
                secret: shared.cfg.secret.clone(),
            };
            match connect(sa, &creds, Some(&EntityName::osd(peer)), &cfg).await {
                Ok(c) => {
                    shared.spawn_conn(c.clone());
                    conns.lock().await.insert(peer, (addr, c.clone()));
                    c
                }
                Err(e) => {
                    tracing::debug!(
                        "osd.{}: heartbeat connect to osd.{peer}: {e}",
                        shared.cfg.id
                    );
                    return false;
                }
            }
        }
    };
    let msg = HbPing {
        from: shared.cfg.id,
        epoch: shared.map_rx.borrow().epoch,
    };
    match conn.call(MSG_HB_PING, encode(&msg), timeout).await {
        Ok(m) => {
            m.msg_type == MSG_HB_PONG
                && decode::<HbPong>("heartbeat pong", &m.payload).is_ok_and(|p| p.from == peer)
        }
        Err(e) => {
            if e.is_connection_error() {
                conns.lock().await.remove(&peer);
                conn.close();
            }
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(v: &[(i32, u64)]) -> BTreeMap<i32, Epoch> {
        v.iter().map(|(p, e)| (*p, Epoch(*e))).collect()
    }

    #[test]
    fn silent_peer_is_reported_after_grace_and_withdrawn_on_reply() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let (interval, grace) = (s, 3 * s);
        let mut t = HeartbeatTracker::new();
        assert!(t.set_peers(&peers(&[(1, 5), (2, 5)])).is_empty());
        let a = t.tick(t0, interval, grace);
        assert_eq!(a, vec![HbAction::Ping(1), HbAction::Ping(2)]);
        // osd.1 answers, osd.2 stays silent.
        for k in 1..=3 {
            t.on_reply(1);
            let a = t.tick(t0 + s * k, interval, grace);
            assert!(
                !a.iter().any(|x| matches!(x, HbAction::Report { .. })),
                "{a:?}"
            );
        }
        let a = t.tick(t0 + s * 3 + Duration::from_millis(10), interval, grace);
        assert!(
            a.contains(&HbAction::Report {
                target: 2,
                failed: true
            }),
            "{a:?}"
        );
        assert_eq!(t.reported(), vec![2]);
        // Not repeated before another interval, repeated after.
        let a = t.tick(t0 + s * 3 + Duration::from_millis(500), interval, grace);
        assert!(!a.iter().any(|x| matches!(x, HbAction::Report { .. })));
        let a = t.tick(t0 + s * 4 + Duration::from_millis(20), interval, grace);
        assert!(a.contains(&HbAction::Report {
            target: 2,
            failed: true
        }));
        // It answers: the report is withdrawn once.
        let a = t.on_reply(2);
        assert_eq!(
            a,
            vec![HbAction::Report {
                target: 2,
                failed: false
            }]
        );
        assert!(t.on_reply(2).is_empty());
        assert!(t.reported().is_empty());
    }

    #[test]
    fn pgless_osds_watch_their_neighbours_by_id() {
        let mut map = cairn_map::ClusterMap::new_cluster(
            "5afc28eb-61b3-45f1-b441-6f913fd70505",
            cairn_map::MonInfo {
                name: "a".into(),
                addr: "127.0.0.1:1".into(),
                rank: 0,
            },
            cairn_map::AuthEntity::new(&[1; 32], &[("mon", "allow *")]),
        );
        let ctx = cairn_map::ApplyContext {
            caller: EntityName::client("admin"),
            generated_secret: None,
        };
        for i in 0..4 {
            let uuid = format!("00000000-0000-0000-0000-{i:012x}");
            let r = map
                .apply(
                    &MonCommand::OsdNew {
                        uuid: uuid.clone(),
                        id: None,
                        host: format!("h{i}"),
                        weight: 1.0,
                        class: None,
                    },
                    &ctx,
                )
                .expect("osd new");
            let id = r.json["osdid"].as_i64().expect("id") as i32;
            map.apply(
                &MonCommand::OsdBoot {
                    id,
                    uuid,
                    addrs: vec![format!("127.0.0.1:{}", 7000 + id)],
                    reported: cairn_map::OsdReported::default(),
                },
                &ctx,
            )
            .expect("boot");
        }
        // No pools: only neighbours, wrapping around.
        let ids = |m: &ClusterMap, me| heartbeat_peers(m, me).into_keys().collect::<Vec<_>>();
        assert_eq!(ids(&map, 0), vec![1, 3]);
        assert_eq!(ids(&map, 2), vec![1, 3]);
        assert_eq!(ids(&map, 3), vec![0, 2]);
        map.apply(&MonCommand::OsdDown { ids: vec![1] }, &ctx)
            .expect("down");
        assert_eq!(ids(&map, 0), vec![2, 3], "down OSDs are skipped");
    }

    #[test]
    fn peer_set_changes_reset_or_withdraw() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut t = HeartbeatTracker::new();
        t.set_peers(&peers(&[(1, 5)]));
        assert_eq!(t.tick(t0, s, 3 * s), vec![HbAction::Ping(1)]);
        let a = t.tick(t0 + s * 5, s, 3 * s);
        assert!(a.contains(&HbAction::Report {
            target: 1,
            failed: true
        }));
        // osd.1 rebooted (new up_from): fresh bookkeeping, no report pending.
        assert!(t.set_peers(&peers(&[(1, 9)])).is_empty());
        assert!(t.reported().is_empty());
        let a = t.tick(t0 + s * 7, s, 3 * s);
        assert!(!a.iter().any(|x| matches!(x, HbAction::Report { .. })));
        // Reported again, then dropped from the set: the report is withdrawn.
        t.tick(t0 + s * 10 + Duration::from_millis(1), s, 3 * s);
        assert_eq!(t.reported(), vec![1]);
        let a = t.set_peers(&BTreeMap::new());
        assert_eq!(
            a,
            vec![HbAction::Report {
                target: 1,
                failed: false
            }]
        );
        assert!(t.peers().is_empty());
    }
}
