//! The OSD's beacon to the monitors: every `osd_beacon_report_interval`
//! (and soon after any PG of which it is primary changes state) it sends
//! its store usage (statfs) and a report of each PG it is primary for:
//! state, up/acting, log length, last_update, object and byte counts, and
//! degraded copies (objects x acting members missing), and the objects it
//! recovered by log and by backfill (`PgRecoveryCounts`). Object counts come
//! from a scan of the PG's collection; while a replicated PG stays
//! active+clean they are kept from what its client writes added since the
//! scan (`crate::exec::Footprint`, published by the PG actor) instead of
//! scanning again (see [`plan`]). The monitors keep these in memory (`pg
//! stat`, `status`, PG health checks) and treat the beacon as a liveness
//! signal. Owns no PG state (it reads what the PG actors publish).

use crate::exec::Footprint;
use crate::runtime::{coll_of, MonRequests, Shared};
use crate::stats::{PgStat, Published};
use cairn_map::{ClusterMap, MonCommand, OsdBeacon, PgRecoveryCounts, PgReport};
use cairn_ops::Version;
use cairn_store::{CollectionId, ListStart, Store};
use cairn_types::PgId;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the beacon task looks for PG state changes.
pub const BEACON_CHECK_INTERVAL: Duration = Duration::from_millis(500);
/// Objects listed per store read while counting a PG.
const COUNT_PAGE: usize = 1024;
/// A PG with more objects than this is counted up to this many per beacon.
pub const COUNT_OBJECTS_MAX: u64 = 1_000_000;
/// A count kept from writes since a scan that was not settled is redone
/// after this long even while writes continue (its error, at most the
/// writes in flight during the scan, does not stay).
const COUNT_REFRESH: Duration = Duration::from_secs(60);
/// The only state in which a PG's collection changes by client writes
/// alone (no recovery, backfill or repair), so that counts can be kept
/// from the writes' footprints.
const STATE_CLEAN: &str = "active+clean";

/// Object and byte count of a PG as of a scan (plus, if `kept`, what the
/// PG's writes added since). The PG publishes a new `last_update` when a
/// write is ordered, before it is committed, so a scan right then may miss
/// it: a scan is trusted only once a second scan saw the same
/// `last_update` (`settled`).
#[derive(Debug, Clone, PartialEq)]
struct Count {
    /// The PG's `last_update` when the scan began.
    last_update: Version,
    /// The stats generation (`Published::gen`) when the scan began.
    gen: u64,
    /// The PG's written footprint when the scan began (None: not kept).
    written: Option<Footprint>,
    /// The PG was active+clean when the scan began.
    clean: bool,
    settled: bool,
    /// When the scan ran.
    at: Instant,
    objects: u64,
    bytes: u64,
    /// The PG's `last_update` at the previous beacon.
    seen: Version,
}

/// What one beacon does about one PG's count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Scan the collection.
    Scan,
    /// The scan's count plus what the writes since added.
    Kept { objects: u64, bytes: u64 },
}

/// Whether `c` (if any) still gives the count of a PG now published as
/// `p`, and how, or it must be scanned again.
fn plan(c: Option<&Count>, p: &Published, now: Instant) -> Plan {
    let Some(c) = c else {
        return Plan::Scan;
    };
    let last_update = p.pos.last_update;
    if c.gen == p.gen && c.last_update == last_update {
        // Nothing written since the scan: a second scan settles it.
        return match c.settled {
            true => Plan::Kept {
                objects: c.objects,
                bytes: c.bytes,
            },
            false => Plan::Scan,
        };
    }
    let (Some(then), Some(written)) = (c.written, p.pos.written) else {
        return Plan::Scan;
    };
    // An unsettled scan is redone once the writes paused for a beacon
    // (or after a while), so that its error does not stay.
    let refresh =
        !c.settled && (c.seen == last_update || now.duration_since(c.at) >= COUNT_REFRESH);
    if c.gen != p.gen || !c.clean || p.stat.state != STATE_CLEAN || refresh {
        return Plan::Scan;
    }
    let add = |n: u64, from: i64, to: i64| u64::try_from(n as i64 + to - from).unwrap_or(0);
    Plan::Kept {
        objects: add(c.objects, then.objects, written.objects),
        bytes: add(c.bytes, then.bytes, written.bytes),
    }
}

/// (objects, bytes) of a PG, or why they could not be counted.
type CountResult = Result<(u64, u64), String>;

/// Counts the objects and their bytes in `pgid`'s collection.
fn count_pg(store: &Store, pgid: PgId) -> CountResult {
    // An EC PG keeps this OSD's shard in a collection of its own.
    let coll = store
        .list_collections()
        .map_err(|e| e.to_string())?
        .into_iter()
        .find(|c| c.pool == pgid.pool.0 && c.seed == pgid.seed)
        .unwrap_or_else(|| coll_of(pgid));
    count_collection(store, coll)
}

/// Counts the objects (EC rollback stashes excepted) and their bytes in
/// `coll`.
pub(crate) fn count_collection(store: &Store, coll: CollectionId) -> CountResult {
    let (mut objects, mut bytes) = (0u64, 0u64);
    let mut start = ListStart::Beginning;
    loop {
        let page = store
            .list_objects(&coll, &start, COUNT_PAGE)
            .map_err(|e| e.to_string())?;
        for o in &page {
            if crate::ec_exec::is_internal_ns(&o.namespace) {
                continue; // EC rollback stash
            }
            if let Ok(st) = store.stat(&coll, o) {
                objects += 1;
                bytes += st.size;
            }
        }
        match page.last() {
            Some(last) if page.len() == COUNT_PAGE && objects < COUNT_OBJECTS_MAX => {
                start = ListStart::After(last.clone());
            }
            _ => return Ok((objects, bytes)),
        }
    }
}

fn report_of(
    map: &ClusterMap,
    pgid: PgId,
    st: &PgStat,
    count: Option<(u64, u64)>,
    recovery: PgRecoveryCounts,
) -> PgReport {
    let size = map
        .pools
        .get(&pgid.pool.0)
        .map(|p| p.size as usize)
        .unwrap_or(st.acting.len());
    let (objects, bytes) = count.unwrap_or((0, 0));
    // Holes in EC acting sets are not OSDs of the map.
    let members = st
        .acting
        .iter()
        .filter(|o| map.osds.contains_key(o))
        .count();
    let missing = size.saturating_sub(members) as u64;
    // Copies still to backfill beyond the missing acting members are
    // misplaced (the acting set holds them; they move to the up set).
    let degraded = objects * missing;
    let misplaced = st.misplaced_objects.saturating_sub(degraded);
    PgReport {
        pgid,
        state: st.state.clone(),
        up: st.up.clone(),
        acting: st.acting.clone(),
        primary: st.primary,
        epoch: st.epoch,
        objects,
        bytes,
        log_entries: st.log_entries as u64,
        degraded_objects: degraded,
        misplaced_objects: misplaced,
        last_update: st.last_update.clone(),
        log_tail: st.log_tail.clone(),
        same_interval_since: st.same_interval_since,
        last_epoch_started: st.last_epoch_started,
        down_reason: st.down_reason.clone(),
        recovery,
        scrub: st.scrub.clone(),
        unfound_objects: 0,
        recovered_objects: st.recovered_objects,
        recovered_bytes: st.recovered_bytes,
        backfill: st.backfill.clone(),
    }
}

/// Builds one beacon (store reads run on a blocking thread).
async fn build(
    shared: &Arc<Shared>,
    counts: &mut HashMap<PgId, Count>,
) -> Result<OsdBeacon, String> {
    let me = shared.cfg.id;
    let map = shared.map_rx.borrow().clone();
    let mine: Vec<(PgId, Published)> = shared
        .published_map()
        .into_iter()
        .filter(|(_, s)| s.stat.primary == Some(me))
        .collect();
    counts.retain(|pg, _| mine.iter().any(|(p, _)| p == pg));
    let now = Instant::now();
    let mut kept: HashMap<PgId, (u64, u64)> = HashMap::new();
    let mut stale: Vec<(PgId, Published)> = Vec::new();
    for (p, s) in &mine {
        match plan(counts.get(p), s, now) {
            Plan::Kept { objects, bytes } => {
                kept.insert(*p, (objects, bytes));
                if let Some(c) = counts.get_mut(p) {
                    c.seen = s.pos.last_update;
                }
            }
            Plan::Scan => stale.push((*p, s.clone())),
        }
    }
    let store = shared.store.clone();
    let scans: Vec<PgId> = stale.iter().map(|(p, _)| *p).collect();
    let (fresh, statfs) = tokio::task::spawn_blocking(move || {
        let fresh: Vec<CountResult> = scans.into_iter().map(|p| count_pg(&store, p)).collect();
        (fresh, store.statfs())
    })
    .await
    .map_err(|e| format!("beacon task: {e}"))?;
    for ((p, s), r) in stale.into_iter().zip(fresh) {
        match r {
            Ok((objects, bytes)) => {
                let settled = counts
                    .get(&p)
                    .is_some_and(|c| c.last_update == s.pos.last_update && c.gen == s.gen);
                kept.insert(p, (objects, bytes));
                counts.insert(
                    p,
                    Count {
                        last_update: s.pos.last_update,
                        gen: s.gen,
                        written: s.pos.written,
                        clean: s.stat.state == STATE_CLEAN,
                        settled,
                        at: now,
                        objects,
                        bytes,
                        seen: s.pos.last_update,
                    },
                );
            }
            Err(e) => {
                tracing::debug!("osd.{me}: counting pg {p}: {e}");
                if let Some(c) = counts.get(&p) {
                    kept.insert(p, (c.objects, c.bytes));
                }
            }
        }
    }
    let statfs = statfs.map_err(|e| format!("statfs: {e}"))?;
    let pgs = mine
        .iter()
        .map(|(p, s)| {
            let st = s.to_stat();
            report_of(&map, *p, &st, kept.get(p).copied(), shared.recovered(*p))
        })
        .collect();
    Ok(OsdBeacon {
        epoch: map.epoch.0,
        total_bytes: statfs.total_bytes,
        used_bytes: statfs.used_bytes.min(statfs.total_bytes),
        available_bytes: statfs.available_bytes,
        pgs,
    })
}

/// (pgid, state, up) of the PGs this OSD is primary for: a change sends a
/// beacon early.
fn signature(shared: &Shared) -> Vec<(PgId, String, Vec<i32>)> {
    let me = shared.cfg.id;
    shared
        .published_map()
        .into_iter()
        .filter(|(_, s)| s.stat.primary == Some(me))
        .map(|(p, s)| (p, s.stat.state, s.stat.up))
        .collect()
}

/// The beacon task of one OSD: runs until the OSD stops.
pub(crate) async fn run(shared: Arc<Shared>, mon: MonRequests) {
    let me = shared.cfg.id;
    let mut counts: HashMap<PgId, Count> = HashMap::new();
    let mut last_sent: Option<Instant> = None;
    let mut last_sig = Vec::new();
    let mut tick = tokio::time::interval(BEACON_CHECK_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let map = shared.map_rx.borrow().clone();
        if !map.osds.get(&me).is_some_and(|o| o.up) {
            // Not booted (or marked down): the daemon boots us first.
            continue;
        }
        let interval = Duration::from_secs(
            map.config_value(&format!("osd.{me}"), "osd_beacon_report_interval")
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(5)
                .max(1),
        );
        let sig = signature(&shared);
        let since = last_sent.map(|t| t.elapsed());
        let due = match since {
            None => true,
            Some(d) => d >= interval || (sig != last_sig && d >= BEACON_CHECK_INTERVAL),
        };
        if !due {
            continue;
        }
        match build(&shared, &mut counts).await {
            Ok(beacon) => {
                if mon
                    .try_send(MonCommand::OsdBeacon { id: me, beacon })
                    .is_err()
                {
                    tracing::debug!("osd.{me}: monitor request queue full; beacon skipped");
                }
                last_sent = Some(Instant::now());
                last_sig = sig;
            }
            Err(e) => tracing::warn!("osd.{me}: building the beacon: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::Role;
    use crate::stats::LogPosition;

    fn published(state: &str, seq: u64, gen: u64, written: Option<(i64, i64)>) -> Published {
        Published {
            stat: PgStat {
                pgid: "1.0".into(),
                state: state.into(),
                role: Role::Primary,
                up: vec![0, 1, 2],
                acting: vec![0, 1, 2],
                primary: Some(0),
                epoch: 5,
                last_update: String::new(),
                log_tail: String::new(),
                log_entries: 0,
                same_interval_since: 4,
                last_epoch_started: 4,
                down_reason: None,
                scrub: Default::default(),
                backfill: None,
                misplaced_objects: 0,
                recovered_objects: 0,
                recovered_bytes: 0,
            },
            pos: LogPosition {
                last_update: Version { epoch: 5, seq },
                written: written.map(|(objects, bytes)| Footprint { objects, bytes }),
                ..LogPosition::default()
            },
            gen,
        }
    }

    /// The count a scan of `p` finding (objects, bytes) leaves.
    fn scanned(
        p: &Published,
        prev: Option<&Count>,
        objects: u64,
        bytes: u64,
        at: Instant,
    ) -> Count {
        Count {
            last_update: p.pos.last_update,
            gen: p.gen,
            written: p.pos.written,
            clean: p.stat.state == STATE_CLEAN,
            settled: prev.is_some_and(|c| c.last_update == p.pos.last_update && c.gen == p.gen),
            at,
            objects,
            bytes,
            seen: p.pos.last_update,
        }
    }

    #[test]
    fn a_clean_pg_is_scanned_until_settled_then_kept_from_its_writes() {
        let t = Instant::now();
        let p = published(STATE_CLEAN, 10, 1, Some((3, 300)));
        assert_eq!(plan(None, &p, t), Plan::Scan);
        let c = scanned(&p, None, 3, 300, t);
        // No write since: a second scan settles the count.
        assert_eq!(plan(Some(&c), &p, t), Plan::Scan);
        let c = scanned(&p, Some(&c), 3, 300, t);
        assert!(c.settled);
        assert_eq!(
            plan(Some(&c), &p, t),
            Plan::Kept {
                objects: 3,
                bytes: 300
            }
        );
        // Writes added 5 objects and removed one of 100 bytes.
        let p = published(STATE_CLEAN, 16, 1, Some((7, 4296)));
        assert_eq!(
            plan(Some(&c), &p, t + COUNT_REFRESH * 10),
            Plan::Kept {
                objects: 7,
                bytes: 4296
            }
        );
    }

    #[test]
    fn anything_but_client_writes_of_a_clean_pg_scans_again() {
        let t = Instant::now();
        let p = published(STATE_CLEAN, 10, 1, Some((3, 300)));
        let c = scanned(&p, None, 3, 300, t);
        let c = scanned(&p, Some(&c), 3, 300, t);
        for (what, now) in [
            (
                "the stats were rebuilt",
                published(STATE_CLEAN, 11, 2, Some((4, 400))),
            ),
            (
                "degraded",
                published("active+undersized+degraded", 11, 1, Some((4, 400))),
            ),
            (
                "scrubbing",
                published("active+clean+scrubbing", 11, 1, Some((4, 400))),
            ),
            ("counts not kept (EC)", published(STATE_CLEAN, 11, 1, None)),
        ] {
            assert_eq!(plan(Some(&c), &now, t), Plan::Scan, "{what}");
        }
        // A scan taken while the PG was not clean is not kept from.
        let d = published("active+recovering", 10, 1, Some((3, 300)));
        let c = scanned(&d, None, 3, 300, t);
        let c = scanned(&d, Some(&c), 3, 300, t);
        assert_eq!(
            plan(Some(&c), &published(STATE_CLEAN, 11, 1, Some((4, 400))), t),
            Plan::Scan
        );
    }

    #[test]
    fn an_unsettled_scan_is_redone_once_writes_pause_or_after_a_while() {
        let t = Instant::now();
        let p = published(STATE_CLEAN, 10, 1, Some((3, 300)));
        let mut c = scanned(&p, None, 3, 300, t);
        // Writes go on: kept from them.
        let p = published(STATE_CLEAN, 20, 1, Some((13, 1300)));
        assert_eq!(
            plan(Some(&c), &p, t),
            Plan::Kept {
                objects: 13,
                bytes: 1300
            }
        );
        c.seen = p.pos.last_update;
        // They paused for a beacon: scan again.
        assert_eq!(plan(Some(&c), &p, t), Plan::Scan);
        // Or they go on for long.
        let p = published(STATE_CLEAN, 30, 1, Some((23, 2300)));
        assert_eq!(plan(Some(&c), &p, t + COUNT_REFRESH), Plan::Scan);
    }
}
