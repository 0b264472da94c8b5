//! Activation of an erasure-coded PG (the primary's side). Like the
//! replicated activation it queries the acting set and the members of past
//! intervals and refuses to activate without a member of every interval
//! that may have written. Then, EC-specific: the authoritative point is the
//! newest log entry that at least k acting shards hold (an entry on fewer
//! shards was never acknowledged); shards holding entries past it undo
//! them from their rollback stashes; a shard a log away gets the chunks it
//! lacks rebuilt from k up-to-date shards and pushed (or installed, for the
//! primary's own shard). A shard that needs a backfill is instead left to
//! the background (`backfill.rs`): the primary asks for a positional
//! `pg_temp` of complete shards (holes where none is) when that still
//! reaches min_size, and reports the backfill targets and strays once
//! active. Finally every acting shard adopts the authoritative log. Also
//! owns [`rebuild_chunk`], the per-object chunk rebuild backfill and
//! repair use.

use crate::ec_exec::{self, chunk_info_attr, ATTR_EC};
use crate::ec_io::call_read;
use crate::ec_pool::{EcPg, SHARD_HOLE};
use crate::exec;
use crate::peering::{commit, list_all, replace_log, PeeringJob};
use crate::peering_sm::{backfill_resume_point, BackfillStart};
use crate::pg::{
    check_can_activate, plan_recovery, settled_osds, PastInterval, RecoveryPlan, PG_TEMP_WAIT,
};
use crate::runtime::{Shared, META_INFO};
use bytes::Bytes;
use cairn_ec::ChunkInfo;
use cairn_map::PgRecoveryCounts;
use cairn_ops::{
    encode, msg_type, EcRead, EcReadFail, EcRollback, EcRollbackReply, LogEntry, ObjectName,
    ObjectState, PgInfo, PgPull, PgPush, PgPushReply, PgQuery, PullReply, PullWhat, Version,
    EC_READ_TO_END,
};
use cairn_store::Transaction;
use cairn_types::{Epoch, PgId};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

/// Objects per recovery push, at most (bytes are bounded too).
const EC_RECOVERY_BATCH_OBJECTS: usize = 32;
/// Objects per listing page when a new shard is backfilled.
const EC_LIST_PAGE: u32 = 512;

/// Each answering OSD's info, log and the shard position its copy holds.
pub type Notes = BTreeMap<i32, (PgInfo, Vec<LogEntry>, u8)>;

/// The copies answering OSDs keep of shard positions other than the one
/// they serve (left by a shard move; `PgNotify::kept`), by (OSD, position):
/// info and log.
pub type Kept = BTreeMap<(i32, u8), (PgInfo, Vec<LogEntry>)>;

/// The copies this OSD keeps of `pgid`'s shard positions other than the
/// one it serves (`current`): every other collection of the PG, with its
/// info and log. They are reported in query answers so that a primary
/// counts the entries they hold for their position.
pub(crate) fn kept_copies(
    store: &cairn_store::Store,
    pgid: PgId,
    current: cairn_store::CollectionId,
) -> Result<Vec<cairn_ops::KeptCopy>, String> {
    let colls = store.list_collections().map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for c in colls {
        if c.pool != pgid.pool.0 || c.seed != pgid.seed || c == current {
            continue;
        }
        let what = |e: &dyn std::fmt::Display| format!("shard {} of pg {pgid}: {e}", c.shard);
        let Some(raw) = store.meta_get(&c, META_INFO).map_err(|e| what(&e))? else {
            continue;
        };
        let info: PgInfo = cairn_ops::decode("pg info", &raw).map_err(|e| what(&e))?;
        let log = crate::peering::read_log(store, c).map_err(|e| what(&e))?;
        out.push(cairn_ops::KeptCopy {
            shard: c.shard,
            info,
            log,
        });
    }
    Ok(out)
}

/// One activation run of an EC PG's primary.
pub(crate) struct EcPeeringJob {
    pub base: PeeringJob,
    pub ec: EcPg,
}

/// Whether a copy with `info` and `log` holds log entry `v` (and so the
/// history up to it).
fn holds(info: &PgInfo, log: &[LogEntry], v: Version) -> bool {
    v == Version::default()
        || v == info.last_update
        || v == info.log_tail
        || (v < info.log_tail && info.last_update >= v)
        || log.iter().any(|e| e.version == v)
}

/// The newest version of `auth_log` (or its tail) held by at least `k` of
/// `members`.
pub fn newest_on_k(
    auth: &PgInfo,
    auth_log: &[LogEntry],
    members: &[(&PgInfo, &[LogEntry])],
    k: usize,
) -> Option<Version> {
    let candidates = auth_log
        .iter()
        .rev()
        .map(|e| e.version)
        .chain(std::iter::once(auth.log_tail));
    for v in candidates {
        let n = members.iter().filter(|(i, l)| holds(i, l, v)).count();
        if n >= k {
            return Some(v);
        }
    }
    None
}

/// [`newest_on_k`] over shard positions: the newest version of `auth_log`
/// (or its tail) that at least `k` positions hold, a position holding it
/// when any of its copies (`positions[s]`) does.
pub fn newest_on_k_positions(
    auth: &PgInfo,
    auth_log: &[LogEntry],
    positions: &[Vec<(&PgInfo, &[LogEntry])>],
    k: usize,
) -> Option<Version> {
    let candidates = auth_log
        .iter()
        .rev()
        .map(|e| e.version)
        .chain(std::iter::once(auth.log_tail));
    for v in candidates {
        let n = positions
            .iter()
            .filter(|copies| copies.iter().any(|(i, l)| holds(i, l, v)))
            .count();
        if n >= k {
            return Some(v);
        }
    }
    None
}

/// EC's stricter form of `check_can_activate`: every past interval that
/// may have accepted writes since the newest activation must have at
/// least `k` of its members among `settled` (answered, with a copy or
/// without one — `pg::settled_osds` —, or declared lost).
/// A write is acknowledged once every acting shard of its interval holds
/// it, which may be as few as `min_size` shards; with fewer than k of them
/// answering, that write may be on fewer than k of the shards asked, so it
/// would look unacknowledged and be rolled back. Err names the OSDs waited
/// for.
pub fn check_k_per_interval(
    past: &[PastInterval],
    best_les: Epoch,
    settled: &[i32],
    k: usize,
) -> Result<(), String> {
    for pi in past {
        if !pi.maybe_went_rw || pi.last < best_les {
            continue;
        }
        let have = pi.acting.iter().filter(|o| settled.contains(o)).count();
        if have < k.min(pi.acting.len()) {
            let missing: Vec<String> = pi
                .acting
                .iter()
                .filter(|o| !settled.contains(o))
                .map(|o| format!("osd.{o}"))
                .collect();
            return Err(format!(
                "waiting for {} (shards acting in epochs {}..={}, which may have accepted writes; {have} of them answered, k={k} needed): bring them back, or declare them lost",
                missing.join(", "),
                pi.first.0,
                pi.last.0
            ));
        }
    }
    Ok(())
}

/// The PG's recorded activations (`ClusterMap::pg_history`) as past
/// intervals that may have written (the newest runs to `now`).
pub fn recorded_intervals(history: &[cairn_map::PgActivation], now: Epoch) -> Vec<PastInterval> {
    cairn_map::activation_spans(history, now)
        .into_iter()
        .zip(history)
        .map(|((first, last), a)| PastInterval {
            first,
            last,
            acting: a.acting.clone(),
            primary: a.acting.first().copied(),
            maybe_went_rw: true,
        })
        .collect()
}

/// The PG's layout as one activation sees it.
pub struct EcLayout<'a> {
    pub k: usize,
    /// Acting OSD per shard position ([`SHARD_HOLE`] where none).
    pub shards: &'a [i32],
    /// Up (CRUSH) OSD per shard position.
    pub up_shards: &'a [i32],
    pub min_size: u32,
    /// A monitor can be asked for `pg_temp`.
    pub may_remap: bool,
}

/// What an activation does, decided from the query answers alone.
#[derive(Debug, Clone, PartialEq)]
pub struct EcActivationPlan {
    /// The authoritative point: the newest entry on at least k shards.
    pub point: Version,
    /// The authoritative info and log, cut at `point`.
    pub info: PgInfo,
    pub log: Vec<LogEntry>,
    /// Entries each acting OSD undoes (past the point or off its history).
    pub rollbacks: Vec<(i32, Vec<LogEntry>)>,
    /// Entries past the point that copies outside the acting set chosen
    /// as sources undo first (OSD, shard position of the copy, entries).
    pub source_rollbacks: Vec<(i32, u8, Vec<LogEntry>)>,
    /// Copies holding the authoritative state (rebuild sources), as
    /// (shard position, OSD): the acting member's copy, or for a position
    /// no acting member holds at the point, a complete copy of it
    /// elsewhere (an OSD outside the acting set, or a copy an OSD keeps
    /// from an earlier position) that holds exactly the point.
    pub sources: Vec<(usize, i32)>,
    /// Acting shards to bring up to date inside activation.
    pub recover: Vec<(usize, i32, RecoveryPlan)>,
    /// Ask for this positional `pg_temp` instead of activating now.
    pub pg_temp: Option<Vec<i32>>,
}

/// Where the interrupted backfill of `osd`, the backfill target of shard
/// position `shard`, resumes (`BackfillStart::resume`): its answer's
/// backfill mark, when its copy holds that very position (an OSD moved to
/// another position starts that one from an empty copy) and the
/// authoritative log covers what it missed (`backfill_resume_point`).
/// The objects to send again are rebuilt for its position like any
/// backfilled chunk. None = it starts over.
pub fn ec_resume_point(
    notes: &Notes,
    osd: i32,
    shard: usize,
    auth_info: &PgInfo,
    auth_log: &[LogEntry],
) -> Option<(Option<cairn_ops::ListCursor>, Vec<ObjectName>)> {
    let (info, log, held) = notes.get(&osd)?;
    if usize::from(*held) != shard {
        return None;
    }
    backfill_resume_point(info, log, auth_info, auth_log)
}

/// Decides an EC activation from the answers (`notes`) and the layout;
/// `is_up` says whether an OSD is up in the current map. Pure: the
/// decision the runtime performs and the unit tests check.
pub fn plan_activation(
    notes: &Notes,
    kept: &Kept,
    layout: &EcLayout<'_>,
    is_up: &dyn Fn(i32) -> bool,
) -> Result<EcActivationPlan, String> {
    let k = layout.k;
    // Every complete copy that answered: (OSD, position, info, log, whether
    // it is the copy that OSD serves). Kept copies first, so that among
    // equal candidates for the authoritative log a served copy wins.
    let copies: Vec<(i32, usize, &PgInfo, &[LogEntry], bool)> = kept
        .iter()
        .map(|((o, s), (i, l))| (*o, usize::from(*s), i, &l[..], false))
        .chain(
            notes
                .iter()
                .map(|(o, (i, l, s))| (*o, usize::from(*s), i, &l[..], true)),
        )
        .filter(|c| c.2.backfill.is_none())
        .collect();
    let (auth_info, auth_log) = copies
        .iter()
        .max_by_key(|c| (c.2.last_epoch_started, c.2.last_update))
        .map(|c| (c.2.clone(), c.3.to_vec()))
        .ok_or("no complete copy of the PG answered")?;
    let members: Vec<(usize, i32)> = layout
        .shards
        .iter()
        .enumerate()
        .filter(|(_, &o)| o != SHARD_HOLE)
        .map(|(s, &o)| (s, o))
        .collect();
    // Per shard position, every complete copy of it that answered: the
    // acting member's, copies outside the acting set (an OSD marked out
    // still holding it), and copies OSDs keep of a position they moved
    // away from. An entry held at k positions may have been acknowledged,
    // wherever those copies now are; counting acting members alone would
    // take an empty new member (or one that moved position) as proof that
    // entries were never acknowledged, and roll them back.
    let position_notes: Vec<Vec<(&PgInfo, &[LogEntry])>> = (0..layout.shards.len())
        .map(|s| {
            copies
                .iter()
                .filter(|c| c.1 == s)
                .map(|c| (c.2, c.3))
                .collect()
        })
        .collect();
    let v = newest_on_k_positions(&auth_info, &auth_log, &position_notes, k).ok_or_else(|| {
        format!(
            "fewer than k={k} shards hold any common point of the newest log (positions with a copy answering: {}); bring back OSDs that held this PG",
            position_notes.iter().filter(|p| !p.is_empty()).count()
        )
    })?;
    let auth_log: Vec<LogEntry> = auth_log.into_iter().filter(|e| e.version <= v).collect();
    let auth_info = PgInfo {
        last_update: v,
        last_complete: v,
        ..auth_info
    };
    let auth_versions: HashSet<Version> = auth_log.iter().map(|e| e.version).collect();
    let off_history = |e: &LogEntry, i: &PgInfo| {
        e.version > i.log_tail
            && e.version > auth_info.log_tail
            && !auth_versions.contains(&e.version)
    };
    let mut rollbacks = Vec::new();
    for &(_, osd) in &members {
        let Some((info, log, _)) = notes.get(&osd) else {
            continue;
        };
        let divergent: Vec<LogEntry> = log
            .iter()
            .filter(|e| e.version > v || off_history(e, info))
            .cloned()
            .collect();
        if !divergent.is_empty() {
            rollbacks.push((osd, divergent));
        }
    }
    let at_point = |i: &PgInfo, l: &[LogEntry]| {
        i.backfill.is_none()
            && holds(i, l, v)
            && !l.iter().any(|e| e.version <= v && off_history(e, i))
    };
    let mut sources: Vec<(usize, i32)> = members
        .iter()
        .filter(|(_, o)| notes.get(o).is_some_and(|(i, l, _)| at_point(i, l)))
        .copied()
        .collect();
    // A position no acting member holds at the point may still have a
    // complete copy elsewhere; its chunks are read from there (by position:
    // `EcRead::shard`, `PgPull::shard`). Entries it holds past the point
    // reached fewer than k positions (never acknowledged) and are undone
    // in that copy first (`EcRollback::shard`), so that it holds exactly
    // the point.
    let mut source_rollbacks = Vec::new();
    for s in 0..layout.shards.len() {
        if sources.iter().any(|(p, _)| *p == s) {
            continue;
        }
        let other = copies
            .iter()
            .filter(|c| {
                c.1 == s
                    && at_point(c.2, c.3)
                    && is_up(c.0)
                    && !(c.4 && layout.shards.get(s) == Some(&c.0))
            })
            // One with nothing to undo first, then the copy an OSD serves
            // before one it keeps.
            .max_by_key(|c| (c.2.last_update == v, c.4));
        if let Some(c) = other {
            sources.push((s, c.0));
            let past: Vec<LogEntry> = c.3.iter().filter(|e| e.version > v).cloned().collect();
            if !past.is_empty() {
                source_rollbacks.push((c.0, c.1 as u8, past));
            }
        }
    }
    let plan_for = |osd: i32| match notes.get(&osd) {
        Some((i, _, _)) if i.backfill.is_some() => RecoveryPlan::Backfill,
        Some((i, l, _)) => plan_recovery(&auth_info, &auth_log, Some((i, &l[..]))),
        None => plan_recovery(&auth_info, &auth_log, None),
    };
    let recover: Vec<(usize, i32, RecoveryPlan)> = members
        .iter()
        .filter(|m| !sources.contains(m))
        .map(|&(s, o)| (s, o, plan_for(o)))
        .collect();
    // When the acting set is the up set and some members need a backfill
    // (no copy, or one the log does not cover), or fewer than k members
    // are up to date (so nothing can be rebuilt from them; e.g. an OSD
    // moved to another position and a new one both start empty): per
    // position, the up member when complete or a log away (and enough
    // members are up to date to rebuild from), else another up OSD whose
    // copy holds that position completely, else a hole. Only if that still
    // reaches min_size; otherwise activation rebuilds them itself (from
    // every source, copies outside the acting set too), or, with fewer than
    // k sources in all, waits.
    let acting_sources = sources.iter().filter(|m| members.contains(m)).count();
    let short_of_sources = acting_sources < k;
    let needs_backfill = |osd: i32| matches!(plan_for(osd), RecoveryPlan::Backfill);
    let behind: Vec<usize> = recover
        .iter()
        .filter(|(_, _, p)| {
            short_of_sources && !matches!(p, RecoveryPlan::UpToDate)
                || matches!(p, RecoveryPlan::Backfill)
        })
        .map(|(s, _, _)| *s)
        .collect();
    let mut pg_temp = None;
    if layout.may_remap && layout.shards == layout.up_shards && !behind.is_empty() {
        let mut want = layout.up_shards.to_vec();
        for &s in &behind {
            let stand_in = notes.iter().find(|(o, (i, l, shard))| {
                usize::from(*shard) == s
                    && i.backfill.is_none()
                    && !want.contains(o)
                    && !needs_backfill(**o)
                    && (!short_of_sources || holds(i, l, v))
                    && is_up(**o)
            });
            want[s] = stand_in.map(|(o, _)| *o).unwrap_or(SHARD_HOLE);
        }
        let live = want.iter().filter(|&&o| o != SHARD_HOLE).count();
        if live >= layout.min_size.max(1) as usize && want != layout.shards {
            pg_temp = Some(want);
        }
    }
    // Fewer than k up-to-date copies of distinct positions reachable and
    // no pg_temp to ask for (no monitor, or none reaches min_size):
    // nothing can be rebuilt, so the PG stays down (incomplete) until the
    // map changes, naming what it waits for, instead of trying (and
    // failing) every rebuild again.
    let rebuild: Vec<usize> = recover
        .iter()
        .filter(|(_, _, p)| match p {
            RecoveryPlan::UpToDate => false,
            RecoveryPlan::Log { objects } => !objects.is_empty(),
            RecoveryPlan::Backfill => true,
        })
        .map(|(s, _, _)| *s)
        .collect();
    if pg_temp.is_none() && sources.len() < k && !rebuild.is_empty() {
        return Err(incomplete_reason(
            &copies, &members, &sources, &rebuild, k, v, is_up,
        ));
    }
    Ok(EcActivationPlan {
        point: v,
        info: auth_info,
        log: auth_log,
        rollbacks,
        source_rollbacks,
        sources,
        recover,
        pg_temp,
    })
}

/// Why an EC activation with fewer than k up-to-date acting shards waits:
/// which shards are up to date, which need rebuilding, and which OSDs
/// outside the acting set hold complete copies of the missing positions
/// (up ones could serve through a positional pg_temp; down ones must come
/// back).
fn incomplete_reason(
    copies: &[(i32, usize, &PgInfo, &[LogEntry], bool)],
    members: &[(usize, i32)],
    sources: &[(usize, i32)],
    rebuild: &[usize],
    k: usize,
    v: Version,
    is_up: &dyn Fn(i32) -> bool,
) -> String {
    let shard_list = |ss: &[usize]| {
        ss.iter()
            .map(|s| {
                let osd = members.iter().find(|(p, _)| p == s).map(|(_, o)| *o);
                match osd {
                    Some(o) => format!("{s} (osd.{o})"),
                    None => s.to_string(),
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let source_list = sources
        .iter()
        .map(|(s, o)| format!("{s} (osd.{o})"))
        .collect::<Vec<_>>()
        .join(", ");
    let holders: Vec<String> = copies
        .iter()
        .filter(|&&(o, shard, i, l, _)| {
            !members.contains(&(shard, o))
                && !sources.iter().any(|(p, _)| *p == shard)
                && holds(i, l, v)
        })
        .map(|&(o, shard, _, _, served)| {
            let state = if is_up(o) { "up" } else { "down" };
            let kept = if served { "" } else { ", kept copy" };
            format!("osd.{o} (shard {shard}{kept}, {state})")
        })
        .collect();
    let waits = if holders.is_empty() {
        "bring back OSDs that held this PG".to_string()
    } else {
        format!(
            "complete copies are outside the acting set on {}: bring them back into it (mark them in) or let backfill run with a monitor",
            holders.join(", ")
        )
    };
    format!(
        "incomplete: {} of the k={k} up-to-date shards needed to rebuild shard(s) {} are reachable (up to date through {v}: {}); waiting for the map to change: {waits}",
        sources.len(),
        shard_list(rebuild),
        if sources.is_empty() {
            "none".to_string()
        } else {
            source_list
        }
    )
}

impl EcPeeringJob {
    fn me(&self) -> i32 {
        self.base.shared.cfg.id
    }

    /// Runs activation; Ok = the new info and log, on every acting shard.
    pub async fn run(self) -> Result<(PgInfo, Vec<LogEntry>), String> {
        let b = &self.base;
        let store = &b.shared.store;
        let mut t = Transaction::new();
        t.meta_set(b.coll, META_INFO, encode(&b.my_info));
        commit(store, t).await?;
        b.ensure_up_thru().await?;
        let (notes, kept, answered) = self.query_all().await?;
        let auth_les = notes
            .values()
            .filter(|(i, _, _)| i.backfill.is_none())
            .map(|(i, _, _)| i.last_epoch_started)
            .max()
            .ok_or("no complete copy of the PG answered")?;
        // Every OSD that answered, with a copy or without (`settled_osds`).
        let lost = b.shared.map_rx.borrow().lost_osds();
        let settled = settled_osds(answered, &lost);
        check_can_activate(&b.past, auth_les, &settled)?;
        // The recorded activations too: a primary that skipped epochs (a
        // restart hands over only the newest map) has no past interval
        // for them, and each needs k of its shards like the others.
        let history = b.shared.map_rx.borrow().pg_activations(b.pgid);
        let recorded = recorded_intervals(&history, b.epoch);
        check_can_activate(&recorded, auth_les, &settled)?;
        check_k_per_interval(&recorded, auth_les, &settled, self.ec.code.k())?;
        check_k_per_interval(&b.past, auth_les, &settled, self.ec.code.k())?;
        let up = |o: i32| b.shared.map_rx.borrow().osds.get(&o).is_some_and(|x| x.up);
        let plan = plan_activation(
            &notes,
            &kept,
            &EcLayout {
                k: self.ec.code.k(),
                shards: &self.ec.shards,
                up_shards: &self.ec.up_shards,
                min_size: b.min_size,
                may_remap: b.shared.mon.is_some(),
            },
            &up,
        )?;
        if let Some(want) = plan.pg_temp {
            let why = format!(
                "{PG_TEMP_WAIT} {want:?} (up {:?} needs backfill)",
                self.ec.up_shards
            );
            tracing::info!(
                "pg {}: shards {:?} need backfill; asking for pg_temp {want:?} so complete shards serve meanwhile",
                b.pgid,
                self.ec.up_shards
            );
            if let Some(mon) = &b.shared.mon {
                let cmd = cairn_map::MonCommand::PgTemp {
                    from: self.me(),
                    pgid: b.pgid,
                    osds: want,
                };
                if mon.send(cmd).await.is_err() {
                    return Err("the monitor link is closed".into());
                }
            }
            return Err(why);
        }
        let (v, auth_info, auth_log, sources) = (plan.point, plan.info, plan.log, plan.sources);
        for (osd, divergent) in plan.rollbacks {
            tracing::info!(
                "pg {}: rolling back {} entries on osd.{osd} (newer than {v}, on fewer than k shards)",
                b.pgid,
                divergent.len()
            );
            self.rollback(osd, None, divergent).await?;
        }
        for (osd, shard, past) in plan.source_rollbacks {
            tracing::info!(
                "pg {}: rolling back {} entries of osd.{osd}'s copy of shard {shard} (newer than {v}), a rebuild source outside the acting set",
                b.pgid,
                past.len()
            );
            self.rollback(osd, Some(shard), past).await?;
        }
        for (shard, osd, plan) in plan.recover {
            tracing::debug!("pg {}: shard {shard} on osd.{osd}: {plan:?}", b.pgid);
            self.recover_shard(shard, osd, plan, &sources).await?;
        }
        let new_info = PgInfo {
            pgid: Some(b.pgid),
            last_epoch_started: b.epoch,
            same_interval_since: b.interval_since,
            last_active_acting: b.acting.clone(),
            ..auth_info.clone()
        };
        for osd in self.ec.live_members() {
            if osd != self.me() {
                self.push(
                    osd,
                    Vec::new(),
                    None,
                    Some((new_info.clone(), auth_log.clone())),
                )
                .await?;
            }
        }
        let mut txn = Transaction::new();
        replace_log(&mut txn, b.coll, &new_info, &auth_log);
        commit(store, txn).await?;
        self.report_activated(&notes, &new_info, &auth_log);
        Ok((new_info, auth_log))
    }

    /// Hands the PG actor the backfill targets (up members whose position
    /// another OSD, or nobody, serves under `pg_temp`), each with where an
    /// earlier, interrupted backfill of it resumes ([`ec_resume_point`]),
    /// and the strays (copies outside the acting and up sets, removed once
    /// clean).
    fn report_activated(&self, notes: &Notes, auth_info: &PgInfo, auth_log: &[LogEntry]) {
        let backfill: Vec<BackfillStart> = self
            .ec
            .backfill_targets()
            .into_iter()
            .map(|(shard, osd)| {
                let resume = ec_resume_point(notes, osd, shard, auth_info, auth_log);
                if let Some((through, resend)) = &resume {
                    tracing::info!(
                        "pg {}: shard {shard} on osd.{osd}: its backfill resumes after {} ({} objects sent again)",
                        self.base.pgid,
                        through
                            .as_ref()
                            .map(|c| format!("{:08x}:{}", c.hash, c.name))
                            .unwrap_or_else(|| "the start".into()),
                        resend.len()
                    );
                }
                BackfillStart { osd, resume }
            })
            .collect();
        let strays: Vec<i32> = notes
            .keys()
            .copied()
            .filter(|o| !self.ec.shards.contains(o) && !self.ec.up_shards.contains(o))
            .collect();
        if backfill.is_empty() && strays.is_empty() {
            return;
        }
        *self
            .base
            .activated
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some((backfill, strays));
    }

    /// Queries the probe set; a primary new to the PG (its copy never went
    /// active) also asks every up OSD, and every answer's last active
    /// acting set is asked too (a new primary knows no history, and the
    /// complete copies of a moved position are found this way).
    /// Queries the acting set, the probe set and the members of recorded
    /// activations (and of every copy's last activation): their copies,
    /// the copies they keep of other positions, and every OSD that
    /// answered (with a copy or without: it settles its intervals).
    async fn query_all(&self) -> Result<(Notes, Kept, Vec<i32>), String> {
        let b = &self.base;
        let map = b.shared.map_rx.borrow().clone();
        let me = self.me();
        let mut notes: Notes = BTreeMap::new();
        notes.insert(me, (b.my_info.clone(), b.my_log.clone(), b.coll.shard));
        let mut kept: Kept = BTreeMap::new();
        let store = &b.shared.store;
        let mine = crate::runtime::blocking_store_call(|| kept_copies(store, b.pgid, b.coll))?;
        for c in mine {
            kept.insert((me, c.shard), (c.info, c.log));
        }
        // Members of recorded activations this copy may not have seen; a
        // PG with no record at all (made before EC activations were
        // recorded) falls back to asking every up OSD when this copy is new.
        let history = map.pg_activations(b.pgid);
        let les = b.my_info.last_epoch_started;
        let new_here = les == cairn_types::Epoch(0) && history.is_empty();
        let mut asked: HashSet<i32> = HashSet::from([me]);
        let mut answered = vec![me];
        let mut todo: Vec<i32> = b.probe.clone();
        todo.extend(b.my_info.last_active_acting.iter().copied());
        todo.extend(
            recorded_intervals(&history, b.epoch)
                .into_iter()
                .filter(|pi| pi.last >= les)
                .flat_map(|pi| pi.acting),
        );
        if new_here {
            todo.extend(map.osds.values().filter(|i| i.up).map(|i| i.id));
        }
        while let Some(o) = todo.pop() {
            if !asked.insert(o) || !map.osds.get(&o).is_some_and(|i| i.up) {
                continue;
            }
            let q = PgQuery {
                pgid: b.pgid,
                from: me,
                epoch: b.epoch,
            };
            match crate::peering::query_peer(&b.shared, o, &q).await {
                Ok(n) => {
                    answered.push(o);
                    for c in n.kept {
                        todo.extend(c.info.last_active_acting.iter().copied());
                        kept.insert((o, c.shard), (c.info, c.log));
                    }
                    if let Some(info) = n.info {
                        todo.extend(info.last_active_acting.iter().copied());
                        notes.insert(o, (info, n.log, n.shard));
                    }
                }
                Err(e) if b.acting.contains(&o) => {
                    return Err(format!("acting member osd.{o} did not answer: {e}"))
                }
                Err(e) => tracing::info!("pg {}: osd.{o} did not answer: {e}", b.pgid),
            }
        }
        Ok((notes, kept, answered))
    }

    /// Undoes `entries` on `osd`'s copy (`shard`: of that position, a
    /// copy it keeps or serves outside the acting set; None: the copy it
    /// serves as an acting member).
    async fn rollback(
        &self,
        osd: i32,
        shard: Option<u8>,
        entries: Vec<LogEntry>,
    ) -> Result<(), String> {
        let b = &self.base;
        if osd == self.me() {
            return match shard.filter(|s| *s != b.coll.shard) {
                None => rollback_local(&b.shared.store, b.coll, &entries).await,
                Some(s) => {
                    let coll = cairn_store::CollectionId::new(b.pgid.pool.0, b.pgid.seed, s);
                    rollback_other_copy(&b.shared.store, coll, &entries).await
                }
            };
        }
        let rb = EcRollback {
            pgid: b.pgid,
            from: self.me(),
            epoch: b.epoch,
            entries,
            shard,
        };
        let r: EcRollbackReply = b
            .call(osd, msg_type::EC_ROLLBACK, encode(&rb), "ec rollback reply")
            .await?;
        r.result
            .map_err(|e| format!("osd.{osd} failed to roll back divergent entries: {e}"))
    }

    /// Brings shard `shard` (on `osd`) to the authoritative state.
    async fn recover_shard(
        &self,
        shard: usize,
        osd: i32,
        plan: RecoveryPlan,
        sources: &[(usize, i32)],
    ) -> Result<(), String> {
        let backfill = matches!(plan, RecoveryPlan::Backfill);
        let (names, keep_only) = match plan {
            RecoveryPlan::UpToDate => return Ok(()),
            RecoveryPlan::Log { objects } => (objects, None),
            RecoveryPlan::Backfill => {
                let all = self.list_from(sources).await?;
                let names = all.iter().map(|(_, n)| n.clone()).collect();
                (names, Some(all))
            }
        };
        let n = names.len() as u64;
        let counts = if backfill {
            PgRecoveryCounts {
                backfill_objects: n,
                ..Default::default()
            }
        } else {
            PgRecoveryCounts {
                log_objects: n,
                ..Default::default()
            }
        };
        self.base.shared.add_recovered(self.base.pgid, counts);
        tracing::info!(
            "pg {}: rebuilding {} objects of shard {shard} on osd.{osd} from shards {sources:?}",
            self.base.pgid,
            names.len()
        );
        let mut batch: Vec<(u32, ObjectName, Option<ObjectState>)> = Vec::new();
        let mut bytes = 0u64;
        for n in names {
            let st = self.rebuild_object(&n, shard, sources).await?;
            bytes += st.as_ref().map(|s| s.bytes()).unwrap_or(0);
            batch.push((n.hash(), n, st));
            if batch.len() >= EC_RECOVERY_BATCH_OBJECTS
                || bytes >= self.base.shared.cfg.recovery_batch_bytes
            {
                self.deliver(osd, std::mem::take(&mut batch), None).await?;
                bytes = 0;
            }
        }
        self.deliver(osd, batch, keep_only).await
    }

    /// Every object name of the PG, from an up-to-date copy (the first
    /// source: an acting member's when one is up to date, else a copy
    /// outside the acting set, asked for by its position).
    async fn list_from(&self, sources: &[(usize, i32)]) -> Result<Vec<(u32, ObjectName)>, String> {
        let b = &self.base;
        let Some(&(src, osd)) = sources.first() else {
            return Err("no up-to-date shard to list objects from".into());
        };
        if osd == self.me() {
            let coll = cairn_store::CollectionId::new(b.pgid.pool.0, b.pgid.seed, src as u8);
            return list_all(&b.shared.store, coll);
        }
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let p = PgPull {
                pgid: b.pgid,
                from: self.me(),
                epoch: b.epoch,
                what: PullWhat::List {
                    after,
                    limit: EC_LIST_PAGE,
                },
                shard: Some(src as u8),
            };
            match b
                .call::<PullReply>(osd, msg_type::PG_PULL, encode(&p), "pull reply")
                .await?
            {
                PullReply::List { objects, next } => {
                    all.extend(objects);
                    match next {
                        Some(c) => after = Some(c),
                        None => return Ok(all),
                    }
                }
                PullReply::Refused(e) => return Err(format!("osd.{osd}: {e}")),
                PullReply::Objects(_) => return Err("unexpected pull reply".into()),
            }
        }
    }

    /// The authoritative state of `name` for `shard`, rebuilt from the
    /// chunks of up-to-date `sources` (None = the object does not exist).
    pub(crate) async fn rebuild_object(
        &self,
        name: &ObjectName,
        shard: usize,
        sources: &[(usize, i32)],
    ) -> Result<Option<ObjectState>, String> {
        let b = &self.base;
        rebuild_chunk(&b.shared, b.pgid, b.epoch, &self.ec, name, shard, sources).await
    }

    /// Installs rebuilt objects on `osd` (this OSD: straight into its store).
    pub(crate) async fn deliver(
        &self,
        osd: i32,
        objects: Vec<(u32, ObjectName, Option<ObjectState>)>,
        keep_only: Option<Vec<(u32, ObjectName)>>,
    ) -> Result<(), String> {
        let b = &self.base;
        if osd != self.me() {
            return self.push(osd, objects, keep_only, None).await;
        }
        let store = &b.shared.store;
        let mut txn = Transaction::new();
        for (_, name, st) in &objects {
            let exists = store
                .exists(&b.coll, &exec::store_oid(name))
                .map_err(|e| e.to_string())?;
            exec::put_object_state(&mut txn, b.coll, name, exists, st.as_ref());
        }
        if let Some(keep) = keep_only {
            let keep: HashSet<ObjectName> = keep.into_iter().map(|(_, n)| n).collect();
            for (_, n) in list_all(store, b.coll)? {
                if !keep.contains(&n) && !objects.iter().any(|(_, o, _)| *o == n) {
                    txn.remove(b.coll, exec::store_oid(&n));
                }
            }
        }
        commit(store, txn).await
    }

    async fn push(
        &self,
        osd: i32,
        objects: Vec<(u32, ObjectName, Option<ObjectState>)>,
        keep_only: Option<Vec<(u32, ObjectName)>>,
        finish: Option<(PgInfo, Vec<LogEntry>)>,
    ) -> Result<(), String> {
        let b = &self.base;
        let p = PgPush {
            pgid: b.pgid,
            from: self.me(),
            epoch: b.epoch,
            objects,
            keep_only,
            finish,
        };
        let r: PgPushReply = b
            .call(osd, msg_type::PG_PUSH, encode(&p), "push reply")
            .await?;
        r.result
            .map_err(|e| format!("osd.{osd} failed to install a recovery push: {e}"))
    }
}

/// The authoritative state of `name` for `shard`, rebuilt from the
/// chunks of up-to-date `sources` ((shard position, OSD holding a copy of
/// it): acting members, or copies outside the acting set;
/// None = the object does not exist), with the shard's chunks of the
/// object's snapshot clones. Activation and background backfill both use
/// it.
pub(crate) async fn rebuild_chunk(
    shared: &Arc<Shared>,
    pgid: PgId,
    epoch: Epoch,
    ec: &EcPg,
    name: &ObjectName,
    shard: usize,
    sources: &[(usize, i32)],
) -> Result<Option<ObjectState>, String> {
    let head = cairn_ops::SNAP_HEAD;
    let Some(mut st) =
        rebuild_store_object(shared, pgid, epoch, ec, name, head, shard, sources).await?
    else {
        return Ok(None);
    };
    let snapset = match st.attrs.iter().find(|(k, _)| k == exec::ATTR_SNAPSET) {
        Some((_, raw)) => exec::SnapSet::decode(raw).map_err(|e| format!("object {name}: {e}"))?,
        None => return Ok(Some(st)),
    };
    for c in &snapset.clones {
        let clone = rebuild_store_object(shared, pgid, epoch, ec, name, c.id, shard, sources)
            .await?
            .ok_or_else(|| format!("object {name}: clone {} is on no source shard", c.id))?;
        st.clones.push((c.id, clone));
    }
    Ok(Some(st))
}

/// One store object (the head, or clone `snap`) of `name` for `shard`,
/// rebuilt from the chunks of `sources`. `sources` may include `shard`
/// itself when another OSD serves that position with a complete chunk
/// (the `pg_temp` stand-in a backfill copies from): its chunk is then
/// taken as it is. With exactly k acting shards that stand-in is one of
/// the k, so leaving it out would leave too few to rebuild from.
/// Activation and repair never pass the shard being rebuilt.
#[allow(clippy::too_many_arguments)]
async fn rebuild_store_object(
    shared: &Arc<Shared>,
    pgid: PgId,
    epoch: Epoch,
    ec: &EcPg,
    name: &ObjectName,
    snap: u64,
    shard: usize,
    sources: &[(usize, i32)],
) -> Result<Option<ObjectState>, String> {
    let code = &ec.code;
    let mut set = tokio::task::JoinSet::new();
    for &(s, osd) in sources {
        let req = EcRead {
            pgid,
            shard: s as u8,
            from: shared.cfg.id,
            epoch,
            oid: name.clone(),
            ranges: vec![(0, EC_READ_TO_END)],
            with_attrs: true,
            snap,
        };
        let shared = shared.clone();
        set.spawn(async move { (s, call_read(&shared, osd, &req).await) });
    }
    let mut found = Vec::new();
    let mut absent = 0usize;
    let mut failures = Vec::new();
    while let Some(j) = set.join_next().await {
        let Ok((s, r)) = j else { continue };
        match r {
            Ok(d) => found.push((s, d)),
            Err(EcReadFail::NoEnt) => absent += 1,
            Err(e) => failures.push(format!("shard {s}: {e:?}")),
        }
    }
    rebuild_from_chunks(code, name, shard, &found, absent, failures)
}

/// The decision half of [`rebuild_chunk`], with the reads done: `found`
/// holds the chunks read (shard position, data with attributes), `absent`
/// how many shards have no such object, `failures` why other reads failed.
/// The newest version read must be on at least k shards; the chunk of
/// `shard` is reconstructed from them (None = the object does not exist).
/// Pure; the simulator calls it too.
pub fn rebuild_from_chunks(
    code: &cairn_ec::ErasureCode,
    name: &ObjectName,
    shard: usize,
    found: &[(usize, cairn_ops::EcChunkData)],
    absent: usize,
    mut failures: Vec<String>,
) -> Result<Option<ObjectState>, String> {
    let newest = found.iter().map(|(_, d)| d.version).max();
    let Some(newest) = newest else {
        if absent >= 1 {
            return Ok(None);
        }
        return Err(format!(
            "object {name}: no shard could be read to rebuild shard {shard}: {failures:?}"
        ));
    };
    let mut size = None;
    let mut attrs: Vec<(String, Bytes)> = Vec::new();
    let mut slots: Vec<Option<Bytes>> = vec![None; code.total()];
    let mut have = 0;
    for (s, d) in found {
        if d.version != newest {
            continue;
        }
        let info = d
            .attrs
            .iter()
            .find(|(k, _)| k == ATTR_EC)
            .and_then(|(_, v)| ChunkInfo::decode(v).ok());
        let Some(info) = info else {
            failures.push(format!("shard {s}: no chunk info"));
            continue;
        };
        let want_len = code.geometry().chunk_len(info.logical_size_bytes);
        let Some(chunk) = d.data.first() else {
            continue;
        };
        if chunk.len() as u64 != want_len {
            failures.push(format!(
                "shard {s}: chunk of {} bytes, expected {want_len}",
                chunk.len()
            ));
            continue;
        }
        if size.is_none() {
            size = Some(info.logical_size_bytes);
            attrs = d.attrs.clone();
        }
        slots[*s] = Some(chunk.clone());
        have += 1;
    }
    let size = size.unwrap_or(0);
    if have < code.k() {
        return Err(format!(
            "object {name}: only {have} shards hold version {newest}, k={} needed to rebuild shard {shard}; failures: {failures:?}",
            code.k()
        ));
    }
    let data = if code.geometry().chunk_len(size) == 0 {
        Bytes::new()
    } else {
        code.codec()
            .reconstruct(&slots, &[shard])
            .map_err(|e| format!("object {name}: {e}"))?
            .into_iter()
            .next()
            .unwrap_or_default()
    };
    for (k, v) in attrs.iter_mut() {
        if k == ATTR_EC {
            *v = chunk_info_attr(code, shard, size);
        }
    }
    Ok(Some(ObjectState {
        data,
        attrs,
        omap: Vec::new(),
        clones: Vec::new(),
        data_crc: None,
    }))
}

/// A shard's info and log once `rolled_back` are undone: those entries
/// leave the log and `last_update` goes back to the newest one left (the
/// log tail when none is). The log must not keep claiming an entry whose
/// data was undone: if activation stops between the rollbacks and the
/// final log push, a later activation would count that shard as holding
/// the entry, roll it forward with too few real chunks, and never
/// rebuild it (simulator, `ec` seed 1).
pub fn log_after_rollback(
    info: &PgInfo,
    log: &[LogEntry],
    rolled_back: &[LogEntry],
) -> (PgInfo, Vec<LogEntry>) {
    let gone: HashSet<Version> = rolled_back.iter().map(|e| e.version).collect();
    let kept: Vec<LogEntry> = log
        .iter()
        .filter(|e| !gone.contains(&e.version))
        .cloned()
        .collect();
    let last = kept.last().map(|e| e.version).unwrap_or(info.log_tail);
    let info = PgInfo {
        last_update: last,
        last_complete: info.last_complete.min(last),
        ..info.clone()
    };
    (info, kept)
}

/// Undoes `entries` (oldest first) on this OSD's shard, newest first, one
/// transaction each.
pub(crate) async fn rollback_local(
    store: &cairn_store::Store,
    coll: cairn_store::CollectionId,
    entries: &[LogEntry],
) -> Result<(), String> {
    for e in entries.iter().rev() {
        let txn = ec_exec::rollback_entry(store, coll, e).map_err(|er| er.to_string())?;
        commit(store, txn).await?;
    }
    Ok(())
}

/// Undoes `entries` in a copy this OSD keeps of another shard position
/// than the one it serves (a rebuild source outside the acting set), and
/// drops them from that copy's log and info ([`log_after_rollback`]).
pub(crate) async fn rollback_other_copy(
    store: &cairn_store::Store,
    coll: cairn_store::CollectionId,
    entries: &[LogEntry],
) -> Result<(), String> {
    let what = |e: &dyn std::fmt::Display| format!("shard {}: {e}", coll.shard);
    if !store.collection_exists(&coll).map_err(|e| what(&e))? {
        return Err(format!("no copy of shard {} is kept here", coll.shard));
    }
    let info: PgInfo = match store.meta_get(&coll, META_INFO).map_err(|e| what(&e))? {
        Some(raw) => cairn_ops::decode("pg info", &raw).map_err(|e| what(&e))?,
        None => return Err(what(&"the copy has no PG info")),
    };
    let log = crate::peering::read_log(store, coll).map_err(|e| what(&e))?;
    rollback_local(store, coll, entries).await?;
    let (info, log) = log_after_rollback(&info, &log, entries);
    let mut txn = Transaction::new();
    replace_log(&mut txn, coll, &info, &log);
    commit(store, txn).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_ops::LogOp;

    fn e(seq: u64) -> LogEntry {
        LogEntry {
            version: Version { epoch: 5, seq },
            prior_version: Version::default(),
            reqid: None,
            oid: ObjectName::new("", format!("o{seq}")),
            op: LogOp::Modify,
        }
    }

    fn info(last: u64) -> PgInfo {
        PgInfo {
            last_update: if last == 0 {
                Version::default()
            } else {
                Version {
                    epoch: 5,
                    seq: last,
                }
            },
            ..Default::default()
        }
    }

    fn note(les: u64, last: u64, log: &[LogEntry], shard: u8) -> (PgInfo, Vec<LogEntry>, u8) {
        let i = PgInfo {
            last_epoch_started: cairn_types::Epoch(les),
            last_active_acting: vec![],
            ..info(last)
        };
        (i, log.to_vec(), shard)
    }

    fn layout<'a>(shards: &'a [i32], up: &'a [i32], min_size: u32) -> EcLayout<'a> {
        EcLayout {
            k: 2,
            shards,
            up_shards: up,
            min_size,
            may_remap: true,
        }
    }

    /// A log whose tail is past the start: a member with no copy needs a
    /// backfill, not log recovery.
    fn trimmed(n: u64) -> (PgInfo, Vec<LogEntry>) {
        let log: Vec<LogEntry> = (2..=n).map(e).collect();
        let i = PgInfo {
            last_epoch_started: cairn_types::Epoch(5),
            log_tail: Version { epoch: 5, seq: 1 },
            ..info(n)
        };
        (i, log)
    }

    #[test]
    fn an_out_osd_keeps_serving_its_position_while_the_new_one_backfills() {
        // 2+1: osd.3 held shard 0 and was marked out; CRUSH put osd.4 there.
        let (i, log) = trimmed(6);
        let mut notes: Notes = BTreeMap::new();
        notes.insert(1, (i.clone(), log.clone(), 1));
        notes.insert(2, (i.clone(), log.clone(), 2));
        notes.insert(3, (i.clone(), log.clone(), 0));
        notes.insert(4, (PgInfo::default(), vec![], 0));
        let shards = [4, 1, 2];
        let plan = plan_activation(&notes, &Kept::new(), &layout(&shards, &shards, 2), &|_| {
            true
        })
        .unwrap();
        assert_eq!(plan.pg_temp, Some(vec![3, 1, 2]));
        // The out OSD's copy is a source for its position too.
        assert_eq!(plan.sources, vec![(1, 1), (2, 2), (0, 3)]);
        // osd.3 down: a hole instead, still at min_size 2.
        let plan = plan_activation(&notes, &Kept::new(), &layout(&shards, &shards, 2), &|o| {
            o != 3
        })
        .unwrap();
        assert_eq!(plan.pg_temp, Some(vec![SHARD_HOLE, 1, 2]));
        // Below min_size (3) with the hole: rebuild inside activation.
        let plan = plan_activation(&notes, &Kept::new(), &layout(&shards, &shards, 3), &|o| {
            o != 3
        })
        .unwrap();
        assert_eq!(plan.pg_temp, None);
        assert_eq!(plan.recover, vec![(0, 4, RecoveryPlan::Backfill)]);
        // Already remapped (pg_temp in the map): activate, no new request.
        let acting = [3, 1, 2];
        let plan = plan_activation(&notes, &Kept::new(), &layout(&acting, &shards, 2), &|_| {
            true
        })
        .unwrap();
        assert_eq!(plan.pg_temp, None);
        assert_eq!(plan.sources, vec![(0, 3), (1, 1), (2, 2)]);
        assert!(plan.recover.is_empty());
        // No monitor to ask: rebuild inside activation.
        let mut l = layout(&shards, &shards, 2);
        l.may_remap = false;
        assert_eq!(
            plan_activation(&notes, &Kept::new(), &l, &|_| true)
                .unwrap()
                .pg_temp,
            None
        );
    }

    /// 2+1, short log (no trim): osd.1 held shard 0 and went out; CRUSH
    /// moved osd.3 from shard 2 to shard 0 (a fresh, empty collection) and
    /// put osd.2, new, at shard 2. Only osd.0 of the acting set is up to
    /// date, but the entries are on two positions (osd.1's shard 0 and
    /// osd.0's shard 1): they may have been acknowledged and must not be
    /// rolled back. Complete copies serve through pg_temp meanwhile.
    #[test]
    fn an_empty_moved_member_is_no_proof_that_entries_were_never_acknowledged() {
        let log: Vec<LogEntry> = (1..=6).map(e).collect();
        let full = PgInfo {
            last_epoch_started: cairn_types::Epoch(5),
            ..info(6)
        };
        let mut notes: Notes = BTreeMap::new();
        notes.insert(0, (full.clone(), log.clone(), 1));
        notes.insert(1, (full.clone(), log.clone(), 0));
        notes.insert(3, (PgInfo::default(), vec![], 0));
        notes.insert(2, (PgInfo::default(), vec![], 2));
        let shards = [3, 0, 2];
        let plan = plan_activation(&notes, &Kept::new(), &layout(&shards, &shards, 2), &|_| {
            true
        })
        .unwrap();
        assert_eq!(plan.point, e(6).version);
        assert!(plan.rollbacks.is_empty(), "{:?}", plan.rollbacks);
        assert_eq!(plan.sources, vec![(1, 0), (0, 1)]);
        assert_eq!(plan.pg_temp, Some(vec![1, 0, SHARD_HOLE]));
        // Under that pg_temp: both complete copies act, the rest backfills.
        let acting = [1, 0, SHARD_HOLE];
        let plan = plan_activation(&notes, &Kept::new(), &layout(&acting, &shards, 2), &|_| {
            true
        })
        .unwrap();
        assert_eq!((plan.point, plan.pg_temp.clone()), (e(6).version, None));
        assert_eq!(plan.sources, vec![(0, 1), (1, 0)]);
        assert!(plan.rollbacks.is_empty() && plan.recover.is_empty());
        // osd.1 down: one complete position left; nothing is rolled back
        // (the point stays: two positions hold it), and no pg_temp
        // reaches min_size, so activation cannot rebuild: the PG waits,
        // incomplete, naming the down OSD with the other complete copy.
        let why = plan_activation(&notes, &Kept::new(), &layout(&shards, &shards, 2), &|o| {
            o != 1
        })
        .unwrap_err();
        assert!(why.starts_with("incomplete: 1 of the k=2"), "{why}");
        assert!(why.contains("osd.1 (shard 0, down)"), "{why}");
    }

    /// No monitor link (no pg_temp to ask for) and fewer than k up-to-date
    /// acting shards: complete copies outside the acting set are sources
    /// too; with fewer than k sources in all, activation stops before any
    /// rollback or rebuild, with a reason that names the shards and the
    /// copies it waits for, instead of failing a rebuild on every retry.
    /// Once the map puts the complete copy back in the acting set, it
    /// activates.
    #[test]
    fn without_a_monitor_fewer_than_k_up_to_date_shards_wait_incomplete() {
        let log: Vec<LogEntry> = (1..=6).map(e).collect();
        let full = PgInfo {
            last_epoch_started: cairn_types::Epoch(5),
            ..info(6)
        };
        let mut notes: Notes = BTreeMap::new();
        notes.insert(0, (full.clone(), log.clone(), 1));
        notes.insert(1, (full.clone(), log.clone(), 0));
        notes.insert(3, (PgInfo::default(), vec![], 0));
        notes.insert(2, (PgInfo::default(), vec![], 2));
        let shards = [3, 0, 2];
        let mut l = layout(&shards, &shards, 2);
        l.may_remap = false;
        // osd.1, outside the acting set and up, holds shard 0 at the point:
        // shards 0 and 2 are rebuilt from it and osd.0's shard 1.
        let plan = plan_activation(&notes, &Kept::new(), &l, &|_| true).unwrap();
        assert_eq!(plan.sources, vec![(1, 0), (0, 1)]);
        let rebuilt: Vec<(usize, i32)> = plan.recover.iter().map(|(s, o, _)| (*s, *o)).collect();
        assert_eq!(rebuilt, vec![(0, 3), (2, 2)]);
        // osd.1 down: one source left, the PG waits.
        let why = plan_activation(&notes, &Kept::new(), &l, &|o| o != 1).unwrap_err();
        assert!(why.starts_with("incomplete: 1 of the k=2"), "{why}");
        assert!(why.contains("shard(s) 0 (osd.3), 2 (osd.2)"), "{why}");
        assert!(why.contains("osd.1 (shard 0, down)"), "{why}");
        // The complete copy of shard 0 back in the acting set: two sources,
        // shard 2 is rebuilt inside activation.
        let shards = [1, 0, 2];
        let mut l = layout(&shards, &shards, 2);
        l.may_remap = false;
        let plan = plan_activation(&notes, &Kept::new(), &l, &|_| true).unwrap();
        assert_eq!(plan.sources, vec![(0, 1), (1, 0)]);
        let rebuilt: Vec<(usize, i32)> = plan.recover.iter().map(|(s, o, _)| (*s, *o)).collect();
        assert_eq!(rebuilt, vec![(2, 2)]);
    }

    #[test]
    fn a_copy_of_another_position_or_mid_backfill_is_no_stand_in() {
        let (i, log) = trimmed(6);
        let mut notes: Notes = BTreeMap::new();
        notes.insert(1, (i.clone(), log.clone(), 1));
        notes.insert(2, (i.clone(), log.clone(), 2));
        // osd.5 holds shard 1, not 0; osd.6 is itself half backfilled.
        notes.insert(5, (i.clone(), log.clone(), 1));
        let half = PgInfo {
            backfill: Some(cairn_ops::BackfillMark { through: None }),
            ..i.clone()
        };
        notes.insert(6, (half, log.clone(), 0));
        notes.insert(4, (PgInfo::default(), vec![], 0));
        let shards = [4, 1, 2];
        let plan = plan_activation(&notes, &Kept::new(), &layout(&shards, &shards, 2), &|_| {
            true
        })
        .unwrap();
        assert_eq!(plan.pg_temp, Some(vec![SHARD_HOLE, 1, 2]));
    }

    #[test]
    fn a_member_a_log_away_is_recovered_in_activation_and_divergent_entries_roll_back() {
        let full: Vec<LogEntry> = (1..=4).map(e).collect();
        let mut notes: Notes = BTreeMap::new();
        // osd.1 has 1..4, osd.2 has 1..3, osd.3 has 1..2: seq 3 is on two
        // shards (the point), seq 4 on one only (never acknowledged).
        notes.insert(1, note(5, 4, &full[..4], 0));
        notes.insert(2, note(5, 3, &full[..3], 1));
        notes.insert(3, note(5, 2, &full[..2], 2));
        let shards = [1, 2, 3];
        let plan = plan_activation(&notes, &Kept::new(), &layout(&shards, &shards, 2), &|_| {
            true
        })
        .unwrap();
        assert_eq!(plan.point, Version { epoch: 5, seq: 3 });
        assert_eq!(plan.rollbacks, vec![(1, vec![e(4)])]);
        assert_eq!(plan.pg_temp, None);
        assert_eq!(plan.sources, vec![(0, 1), (1, 2)]);
        assert_eq!(
            plan.recover,
            vec![(
                2,
                3,
                RecoveryPlan::Log {
                    objects: vec![ObjectName::new("", "o3")]
                }
            )]
        );
    }

    #[test]
    fn a_member_answering_with_no_copy_counts_toward_k() {
        // `ecmove` seeds 142 and 519: 2+1, the map recorded an activation
        // of [1, 3] while osd.3 had just crashed; osd.3 never created its
        // copy (so the interval acknowledged nothing: a write is durable on
        // every acting shard first). Once osd.3 is up again and answers
        // with no copy, it settles the interval with osd.1; before, the PG
        // waited for it for good ("1 of them answered, k=2 needed").
        let past = recorded_intervals(
            &[cairn_map::PgActivation {
                since: cairn_types::Epoch(113),
                acting: vec![1, 3],
            }],
            cairn_types::Epoch(149),
        );
        let copies = [1, 5];
        let no_copy = [3];
        let only_copies = settled_osds(copies, &[]);
        let err =
            check_k_per_interval(&past, cairn_types::Epoch(110), &only_copies, 2).unwrap_err();
        assert!(err.contains("waiting for osd.3"), "{err}");
        let settled = settled_osds(copies.into_iter().chain(no_copy), &[]);
        assert!(check_k_per_interval(&past, cairn_types::Epoch(110), &settled, 2).is_ok());
        // Down, not asked: it settles nothing.
        assert!(check_k_per_interval(&past, cairn_types::Epoch(110), &[1, 5], 2).is_err());
    }

    #[test]
    fn an_interval_that_wrote_needs_k_of_its_shards_back() {
        // 2+1, min_size 2: osd.2 down, writes acknowledged on {0, 1}; then
        // osd.1 down and osd.2 back. Activating on {0, 2} would see those
        // writes on one shard only and roll them back: stay down instead.
        let past = vec![PastInterval {
            first: cairn_types::Epoch(7),
            last: cairn_types::Epoch(9),
            acting: vec![0, 1],
            primary: Some(0),
            maybe_went_rw: true,
        }];
        let err = check_k_per_interval(&past, cairn_types::Epoch(5), &[0, 2], 2).unwrap_err();
        assert!(err.contains("waiting for osd.1"), "{err}");
        assert!(check_k_per_interval(&past, cairn_types::Epoch(5), &[0, 1, 2], 2).is_ok());
        // Declared lost (settled): activation gives its writes up.
        assert!(check_k_per_interval(&past, cairn_types::Epoch(5), &[0, 2, 1], 2).is_ok());
        // Intervals older than the newest activation do not count.
        assert!(check_k_per_interval(&past, cairn_types::Epoch(10), &[0, 2], 2).is_ok());
        // The same scenario replicated-style passes with one member: the
        // reason EC needs its own check.
        assert!(check_can_activate(&past, cairn_types::Epoch(5), &[0, 2]).is_ok());
    }

    /// Seeded histories of one 2+1 or 2+2 PG: shards go down and up,
    /// each interval with at least min_size shards activates (when the
    /// checks allow) and takes writes, the last one possibly reaching only
    /// some shards. After every activation the authoritative log must hold
    /// every acknowledged write, and with every shard back the PG must
    /// activate.
    #[test]
    fn seeded_histories_never_roll_back_an_acknowledged_write() {
        for seed in 1..=3000u64 {
            let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut rnd = move |n: u64| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % n
            };
            let m = 1 + rnd(2) as usize;
            let (k, n) = (2usize, 2 + m);
            let min_size = if m == 1 { 2 } else { 3 };
            let mut logs: Vec<Vec<LogEntry>> = vec![Vec::new(); n];
            let mut les = vec![0u64; n];
            let mut past: Vec<PastInterval> = Vec::new();
            let mut acked: Vec<Version> = Vec::new();
            let mut seq = 0u64;
            for round in 0..12u64 {
                let epoch = 10 + round;
                let last_round = round == 11;
                let up: Vec<usize> = (0..n).filter(|_| last_round || rnd(4) != 0).collect();
                if up.len() < min_size {
                    continue;
                }
                let mut notes: Notes = BTreeMap::new();
                for &o in &up {
                    let last = logs[o].last().map(|e| e.version).unwrap_or_default();
                    let i = PgInfo {
                        last_update: last,
                        last_complete: last,
                        last_epoch_started: cairn_types::Epoch(les[o]),
                        ..Default::default()
                    };
                    notes.insert(o as i32, (i, logs[o].clone(), o as u8));
                }
                let settled: Vec<i32> = up.iter().map(|&o| o as i32).collect();
                let best = cairn_types::Epoch(up.iter().map(|&o| les[o]).max().unwrap_or(0));
                let allowed = check_can_activate(&past, best, &settled).is_ok()
                    && check_k_per_interval(&past, best, &settled, k).is_ok();
                let shards: Vec<i32> = (0..n)
                    .map(|o| {
                        if up.contains(&o) {
                            o as i32
                        } else {
                            SHARD_HOLE
                        }
                    })
                    .collect();
                let mut went_rw = false;
                if allowed {
                    let l = EcLayout {
                        k,
                        shards: &shards,
                        up_shards: &shards,
                        min_size: min_size as u32,
                        may_remap: false,
                    };
                    let plan = plan_activation(&notes, &Kept::new(), &l, &|_| true)
                        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
                    for v in &acked {
                        assert!(
                            plan.log.iter().any(|e| e.version == *v),
                            "seed {seed} round {round}: acknowledged {v} rolled back (point {})",
                            plan.point
                        );
                    }
                    for &o in &up {
                        logs[o] = plan.log.clone();
                        les[o] = epoch;
                    }
                    went_rw = true;
                    for w in 0..rnd(4) {
                        seq += 1;
                        let entry = LogEntry {
                            version: Version { epoch, seq },
                            ..e(seq)
                        };
                        let partial = w == 3 || rnd(3) == 0;
                        let reached: Vec<usize> = if partial {
                            up.iter().copied().filter(|_| rnd(2) == 0).collect()
                        } else {
                            up.clone()
                        };
                        for &o in &reached {
                            logs[o].push(entry.clone());
                        }
                        if reached.len() < up.len() {
                            break; // the interval ends with this write in flight
                        }
                        acked.push(entry.version);
                    }
                } else {
                    assert!(
                        !last_round,
                        "seed {seed}: every shard back, yet the PG stays down"
                    );
                }
                past.push(PastInterval {
                    first: cairn_types::Epoch(epoch),
                    last: cairn_types::Epoch(epoch),
                    acting: settled,
                    primary: Some(up[0] as i32),
                    maybe_went_rw: went_rw,
                });
            }
        }
    }

    #[test]
    fn a_rolled_back_entry_leaves_the_log() {
        let log: Vec<LogEntry> = (1..=4).map(e).collect();
        let i = PgInfo {
            last_complete: Version { epoch: 5, seq: 4 },
            ..info(4)
        };
        let (ni, nl) = log_after_rollback(&i, &log, &log[2..]);
        assert_eq!(nl, log[..2].to_vec());
        assert_eq!(ni.last_update, Version { epoch: 5, seq: 2 });
        assert_eq!(ni.last_complete, Version { epoch: 5, seq: 2 });
        // Everything rolled back: back to the tail.
        let (ni, nl) = log_after_rollback(&i, &log, &log);
        assert!(nl.is_empty());
        assert_eq!(ni.last_update, i.log_tail);
        // The bug this prevents: three of four shards undid seq 4, a fourth
        // (down then) kept it; with k=4 the logs alone made seq 4 look
        // complete on k shards, but only one chunk of it existed.
        let shards: Vec<(PgInfo, Vec<LogEntry>)> = (0..3)
            .map(|_| log_after_rollback(&i, &log, &log[3..]))
            .chain(std::iter::once((i.clone(), log.clone())))
            .collect();
        let members: Vec<(&PgInfo, &[LogEntry])> =
            shards.iter().map(|(i, l)| (i, &l[..])).collect();
        assert_eq!(
            newest_on_k(&i, &log, &members, 4),
            Some(Version { epoch: 5, seq: 3 })
        );
    }

    #[test]
    fn authoritative_point_is_the_newest_entry_on_k_shards() {
        let log: Vec<LogEntry> = (1..=4).map(e).collect();
        let (a, b, c) = (info(4), info(3), info(2));
        let (la, lb, lc) = (&log[..4], &log[..3], &log[..2]);
        let members = [(&a, la), (&b, lb), (&c, lc)];
        // 2+1: seq 3 is on two shards, seq 4 on one only.
        assert_eq!(
            newest_on_k(&a, &log, &members, 2),
            Some(Version { epoch: 5, seq: 3 })
        );
        assert_eq!(
            newest_on_k(&a, &log, &members, 3),
            Some(Version { epoch: 5, seq: 2 })
        );
        assert_eq!(
            newest_on_k(&a, &log, &members, 1),
            Some(Version { epoch: 5, seq: 4 })
        );
        // Fresh PG: nothing written anywhere.
        let z = info(0);
        assert_eq!(
            newest_on_k(&z, &[], &[(&z, &[]), (&z, &[])], 2),
            Some(Version::default())
        );
    }

    /// An interrupted EC backfill resumes from the target's mark when its
    /// copy holds the target position and the log covers what it missed;
    /// the objects up to the mark written since (or divergent there) are
    /// sent again, later ones come with the batches.
    #[test]
    fn an_ec_backfill_target_resumes_from_its_mark_at_its_own_position() {
        use crate::pg::{cursor_key, obj_key};
        let (auth, auth_log) = trimmed(20);
        // The target got batches through the 4th object of the PG's order
        // (its mark) and the log through entry 15, plus an entry 16' that
        // the authoritative log does not have.
        let mut names: Vec<ObjectName> = (1..=20).map(|s| e(s).oid).collect();
        names.sort_by_key(obj_key);
        let mark = &names[3];
        let through = cairn_ops::ListCursor {
            hash: mark.hash(),
            namespace: mark.namespace.clone(),
            name: mark.name.clone(),
        };
        let divergent = LogEntry {
            version: Version { epoch: 6, seq: 16 },
            oid: names[0].clone(),
            ..e(16)
        };
        let mut tlog: Vec<LogEntry> = (2..=15).map(e).collect();
        tlog.push(divergent.clone());
        let tinfo = PgInfo {
            last_update: divergent.version,
            log_tail: Version { epoch: 5, seq: 1 },
            backfill: Some(cairn_ops::BackfillMark {
                through: Some(through.clone()),
            }),
            ..Default::default()
        };
        let mut notes: Notes = BTreeMap::new();
        notes.insert(7, (tinfo.clone(), tlog.clone(), 1));
        let (at, resend) =
            ec_resume_point(&notes, 7, 1, &auth, &auth_log).expect("the target resumes");
        assert_eq!(at, Some(through.clone()));
        let mut want: Vec<ObjectName> = (16..=20)
            .map(|s| e(s).oid)
            .chain(std::iter::once(divergent.oid.clone()))
            .filter(|o| obj_key(o) <= cursor_key(&through))
            .collect();
        want.sort_by_key(obj_key);
        want.dedup();
        let mut got = resend.clone();
        got.sort_by_key(obj_key);
        assert_eq!(got, want);
        assert!(
            got.contains(&divergent.oid),
            "the divergent object is sent again"
        );
        // Its copy holds another position: it starts over.
        notes.insert(7, (tinfo.clone(), tlog.clone(), 2));
        assert_eq!(ec_resume_point(&notes, 7, 1, &auth, &auth_log), None);
        // No mark (never started, or finished): start over.
        let plain = PgInfo {
            backfill: None,
            ..tinfo.clone()
        };
        notes.insert(7, (plain, tlog.clone(), 1));
        assert_eq!(ec_resume_point(&notes, 7, 1, &auth, &auth_log), None);
        // The log was trimmed past what it holds: start over.
        let (auth_far, log_far) = {
            let log: Vec<LogEntry> = (18..=20).map(e).collect();
            let i = PgInfo {
                log_tail: Version { epoch: 5, seq: 17 },
                ..auth.clone()
            };
            (i, log)
        };
        let old = PgInfo {
            last_update: Version { epoch: 5, seq: 12 },
            ..tinfo.clone()
        };
        let old_log: Vec<LogEntry> = (2..=12).map(e).collect();
        notes.insert(7, (old, old_log, 1));
        assert_eq!(ec_resume_point(&notes, 7, 1, &auth_far, &log_far), None);
        // Unknown to the query (did not answer): start over.
        assert_eq!(ec_resume_point(&notes, 8, 1, &auth, &auth_log), None);
    }

    /// The bug of `ecmove` seeds 1016 and 4, in 2+1 (min_size 2): writes
    /// 1..6 were acknowledged on positions 0 (osd.0) and 1 (osd.1) while
    /// position 2 was down. Then CRUSH moved osd.1 from position 1 to 2
    /// (it keeps its position-1 copy) and put osd.3, empty, at position 1.
    /// The acting members alone hold the writes at one position; counting
    /// the copy osd.1 keeps, two hold them: nothing is rolled back, and
    /// that kept copy is a source for rebuilding positions 1 and 2.
    #[test]
    fn a_kept_copy_of_an_old_position_counts_and_serves_as_a_source() {
        let log: Vec<LogEntry> = (1..=6).map(e).collect();
        let full = PgInfo {
            last_epoch_started: cairn_types::Epoch(5),
            ..info(6)
        };
        let mut notes: Notes = BTreeMap::new();
        notes.insert(0, (full.clone(), log.clone(), 0));
        notes.insert(3, (PgInfo::default(), vec![], 1));
        notes.insert(1, (PgInfo::default(), vec![], 2));
        let shards = [0, 3, 1];
        // Without the kept copy (what an older OSD reports): the writes
        // look unacknowledged and osd.0 would roll all six back.
        let blind = plan_activation(&notes, &Kept::new(), &layout(&shards, &shards, 2), &|_| {
            true
        })
        .unwrap();
        assert_eq!(blind.point, Version::default());
        assert_eq!(blind.rollbacks, vec![(0, log.clone())]);
        let mut kept: Kept = BTreeMap::new();
        kept.insert((1, 1), (full.clone(), log.clone()));
        for may_remap in [true, false] {
            let mut l = layout(&shards, &shards, 2);
            l.may_remap = may_remap;
            let plan = plan_activation(&notes, &kept, &l, &|_| true).unwrap();
            assert_eq!(plan.point, e(6).version);
            assert!(plan.rollbacks.is_empty(), "{:?}", plan.rollbacks);
            assert_eq!(plan.sources, vec![(0, 0), (1, 1)]);
            // No OSD can stand in for positions 1 and 2 (osd.1 serves 2),
            // so no pg_temp reaches min_size: rebuilt inside activation.
            assert_eq!(plan.pg_temp, None);
            let rebuilt: Vec<(usize, i32)> =
                plan.recover.iter().map(|(s, o, _)| (*s, *o)).collect();
            assert_eq!(rebuilt, vec![(1, 3), (2, 1)]);
        }
        // osd.1 down: its kept copy still proves the writes were on two
        // positions (nothing is rolled back), but it cannot be read: wait.
        let why =
            plan_activation(&notes, &kept, &layout(&shards, &shards, 2), &|o| o != 1).unwrap_err();
        assert!(why.starts_with("incomplete: 1 of the k=2"), "{why}");
        assert!(why.contains("osd.1 (shard 1, kept copy, down)"), "{why}");
    }

    /// A kept copy holding entries past the point (never acknowledged:
    /// they reached fewer than k positions) is not rolled back with the
    /// acting members; chosen as a rebuild source (no acting member holds
    /// its position at the point), it undoes them first, so that its
    /// chunks are those of the point.
    #[test]
    fn a_kept_copy_past_the_point_is_rolled_back_before_it_serves() {
        let log: Vec<LogEntry> = (1..=6).map(e).collect();
        let at = |n: u64| PgInfo {
            last_epoch_started: cairn_types::Epoch(5),
            ..info(n)
        };
        let mut notes: Notes = BTreeMap::new();
        notes.insert(0, (at(5), log[..5].to_vec(), 0));
        notes.insert(2, (at(5), log[..5].to_vec(), 2));
        notes.insert(3, (PgInfo::default(), vec![], 1));
        let mut kept: Kept = BTreeMap::new();
        kept.insert((2, 1), (at(6), log.clone()));
        let shards = [0, 3, 2];
        let mut l = layout(&shards, &shards, 2);
        l.may_remap = false;
        let plan = plan_activation(&notes, &kept, &l, &|_| true).unwrap();
        assert_eq!(plan.point, e(5).version);
        assert!(plan.rollbacks.is_empty(), "{:?}", plan.rollbacks);
        assert_eq!(plan.source_rollbacks, vec![(2, 1, vec![e(6)])]);
        assert_eq!(plan.sources, vec![(0, 0), (2, 2), (1, 2)]);
        let rebuilt: Vec<(usize, i32)> = plan.recover.iter().map(|(s, o, _)| (*s, *o)).collect();
        assert_eq!(rebuilt, vec![(1, 3)]);
        // A copy of that position with nothing to undo is preferred.
        notes.insert(7, (at(5), log[..5].to_vec(), 1));
        let plan = plan_activation(&notes, &kept, &l, &|_| true).unwrap();
        assert!(plan.source_rollbacks.is_empty());
        assert_eq!(plan.sources, vec![(0, 0), (2, 2), (1, 7)]);
    }
}
