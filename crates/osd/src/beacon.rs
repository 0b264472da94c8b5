//! The OSD's beacon to the monitors: every `osd_beacon_report_interval`
//! (and soon after any PG of which it is primary changes state) it sends
//! its store usage (statfs) and a report of each PG it is primary for:
//! state, up/acting, log length, last_update, object and byte counts, and
//! degraded copies (objects x acting members missing), and the objects it
//! recovered by log and by backfill (`PgRecoveryCounts`). Object counts come
//! from a scan of the PG's collection, redone when the PG's `last_update`
//! moved (twice: see `Count`). The monitors keep these in memory (`pg stat`,
//! `status`, PG health checks) and treat the beacon as a liveness signal.
//! Owns no PG state (it reads what the PG actors publish).

use crate::runtime::{coll_of, MonRequests, PgStat, Shared};
use cairn_map::{ClusterMap, MonCommand, OsdBeacon, PgRecoveryCounts, PgReport};
use cairn_store::{ListStart, Store};
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

/// Object and byte count of a PG at a given `last_update`. The PG
/// publishes a new `last_update` when a write is ordered, before it is
/// committed, so a scan right then may miss it: a count is trusted only
/// once a second scan saw the same `last_update` (`settled`).
#[derive(Debug, Clone)]
struct Count {
    last_update: String,
    settled: bool,
    objects: u64,
    bytes: u64,
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
    count: Option<&Count>,
    recovery: PgRecoveryCounts,
) -> PgReport {
    let size = map
        .pools
        .get(&pgid.pool.0)
        .map(|p| p.size as usize)
        .unwrap_or(st.acting.len());
    let objects = count.map(|c| c.objects).unwrap_or(0);
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
        bytes: count.map(|c| c.bytes).unwrap_or(0),
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
    let mine: Vec<(PgId, PgStat)> = shared
        .pg_stat_map()
        .into_iter()
        .filter(|(_, s)| s.primary == Some(me))
        .collect();
    counts.retain(|pg, _| mine.iter().any(|(p, _)| p == pg));
    let stale: Vec<(PgId, String)> = mine
        .iter()
        .filter(|(p, s)| {
            counts
                .get(p)
                .is_none_or(|c| !c.settled || c.last_update != s.last_update)
        })
        .map(|(p, s)| (*p, s.last_update.clone()))
        .collect();
    let store = shared.store.clone();
    let (fresh, statfs) = tokio::task::spawn_blocking(move || {
        let fresh: Vec<(PgId, String, CountResult)> = stale
            .into_iter()
            .map(|(p, lu)| (p, lu, count_pg(&store, p)))
            .collect();
        (fresh, store.statfs())
    })
    .await
    .map_err(|e| format!("beacon task: {e}"))?;
    for (p, last_update, r) in fresh {
        match r {
            Ok((objects, bytes)) => {
                let settled = counts.get(&p).is_some_and(|c| c.last_update == last_update);
                counts.insert(
                    p,
                    Count {
                        last_update,
                        settled,
                        objects,
                        bytes,
                    },
                );
            }
            Err(e) => tracing::debug!("osd.{me}: counting pg {p}: {e}"),
        }
    }
    let statfs = statfs.map_err(|e| format!("statfs: {e}"))?;
    let pgs = mine
        .iter()
        .map(|(p, s)| report_of(&map, *p, s, counts.get(p), shared.recovered(*p)))
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
        .pg_stat_map()
        .into_iter()
        .filter(|(_, s)| s.primary == Some(me))
        .map(|(p, s)| (p, s.state, s.up))
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
