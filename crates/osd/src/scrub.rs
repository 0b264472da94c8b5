//! Scrub, deep-scrub and repair of one PG, run by its primary. Owns the
//! per-PG scrub bookkeeping (stamps, findings, operator orders, periodic
//! scheduling from this OSD's own clock), the member side of a scrub map
//! (object list, sizes, versions, attribute/omap digests and, deep, data
//! checksums read back through the store; an object's snapshot clones are
//! part of its head's entry), the comparison of the maps (pure:
//! [`compare`]), the EC parity check (heads and clones) and the repair of
//! bad copies.
//!
//! A scrub walks the PG in chunks of `osd_scrub_chunk_max` objects in the
//! store's listing order. For each chunk the PG actor first blocks writes
//! to the chunk's objects and lets the writes in flight on them finish
//! (see `Pg::scrub_block`), so every member's copy is final; the chunk is
//! then compared (and repaired), released, and the job sleeps
//! `osd_scrub_sleep` before the next chunk. Ordering of client ops and
//! replication stays the PG state machine's (`pg`).

use crate::ec_pool::{EcPg, SHARD_HOLE};
use crate::exec::{self, store_oid, ATTR_VERSION};
use crate::peering::PeeringJob;
use crate::runtime::{PgMsg, Shared};
use bytes::Bytes;
use cairn_map::{ClusterMap, InconsistentObjectReport, OsdFlag, PgScrubReport, ShardErrorReport};
use cairn_ops::{
    decode, encode, msg_type, EcRead, LogEntry, LogOp, ObjectName, ObjectState, PgInfo, PgPull,
    PgPush, PgPushReply, PullReply, PullWhat, ScrubMap, ScrubMapReply, ScrubMapRequest,
    ScrubObject, ScrubRange, Version, EC_READ_TO_END, SCRUB_MAP_MAX_OBJECTS, SCRUB_RANGE_END,
};
use cairn_store::{CollectionId, ListStart, Store, StoreError, Transaction};
use cairn_types::{Epoch, PgId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot, Semaphore};

/// Store meta key of a PG's scrub stamps and findings (on this OSD).
pub(crate) const META_SCRUB: &str = "scrub";
/// Objects listed per store call while building a scrub map.
const SCRUB_LIST_PAGE: usize = 256;
/// Bytes read per store call while checksumming an object.
const SCRUB_READ_PIECE_BYTES: u64 = 1 << 20;
/// Omap entries read per store call while digesting an omap.
const SCRUB_OMAP_PAGE: usize = 1024;
/// Scrub maps this OSD builds at once for other primaries (more wait).
const SCRUB_MAP_BUILDS_MAX: usize = 2;
/// How long a chunk may keep writes waiting before the actor releases it
/// and stops the scrub.
pub(crate) const SCRUB_CHUNK_HOLD_MAX: Duration = Duration::from_secs(60);
/// How often the job asks whether the writes in flight on its chunk ended.
const SCRUB_SETTLE_POLL: Duration = Duration::from_millis(5);
/// Bound on a member's deep scrub map of one chunk.
const SCRUB_DEEP_MAP_TIMEOUT: Duration = Duration::from_secs(60);
/// A scrub that failed (member unreachable, interval changed) is retried after this.
pub(crate) const SCRUB_RETRY_AFTER: Duration = Duration::from_secs(10);

/// The OSD-wide part: how many PGs scrub now (`osd_max_scrubs`) and a
/// bound on scrub maps built for other primaries.
pub(crate) struct OsdScrubShared {
    running: Arc<AtomicUsize>,
    map_builds: Arc<Semaphore>,
}

impl Default for OsdScrubShared {
    fn default() -> Self {
        OsdScrubShared {
            running: Arc::new(AtomicUsize::new(0)),
            map_builds: Arc::new(Semaphore::new(SCRUB_MAP_BUILDS_MAX)),
        }
    }
}

/// One of the OSD's `osd_max_scrubs` slots, held by a running job.
pub(crate) struct ScrubSlot(Arc<AtomicUsize>);

impl Drop for ScrubSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl OsdScrubShared {
    /// Takes a slot if fewer than `max` scrubs run.
    pub(crate) fn try_slot(&self, max: usize) -> Option<ScrubSlot> {
        let mut cur = self.running.load(Ordering::Acquire);
        loop {
            if cur >= max {
                return None;
            }
            match self
                .running
                .compare_exchange(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(ScrubSlot(self.running.clone())),
                Err(now) => cur = now,
            }
        }
    }
}

/// What this OSD keeps about a PG's scrubs (persisted under [`META_SCRUB`]).
/// Stamps are this OSD's wall-clock seconds and only ever compared with
/// this OSD's clock.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ScrubStamps {
    pub last_scrub_secs: u64,
    pub last_deep_scrub_secs: u64,
    /// When this OSD first held the PG (base of the first periodic scrub).
    pub first_seen_secs: u64,
    /// Newest operator order carried out.
    pub order_done: u64,
    /// Bad copies the last scrub found (objects x copies).
    pub errors: u64,
    pub inconsistent: Vec<InconsistentObjectReport>,
    pub last_failure: Option<String>,
}

/// What one run does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ScrubRequest {
    pub deep: bool,
    pub repair: bool,
    /// The operator order this run carries out, if any.
    pub order: Option<u64>,
}

/// The periodic-scrub settings of one OSD, read from the map.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ScrubSchedule {
    pub min_interval_secs: u64,
    pub max_interval_secs: u64,
    pub deep_interval_secs: u64,
    pub begin_hour: u64,
    pub end_hour: u64,
    pub noscrub: bool,
    pub nodeep_scrub: bool,
}

fn cfg_u64(map: &ClusterMap, who: &str, key: &str, default: u64) -> u64 {
    map.config_value(who, key)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn cfg_f64(map: &ClusterMap, who: &str, key: &str, default: f64) -> f64 {
    map.config_value(who, key)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

impl ScrubSchedule {
    pub fn from_map(map: &ClusterMap, osd: i32) -> ScrubSchedule {
        let who = format!("osd.{osd}");
        ScrubSchedule {
            min_interval_secs: cfg_u64(map, &who, "osd_scrub_min_interval", 86_400),
            max_interval_secs: cfg_u64(map, &who, "osd_scrub_max_interval", 604_800),
            deep_interval_secs: cfg_u64(map, &who, "osd_deep_scrub_interval", 604_800),
            begin_hour: cfg_u64(map, &who, "osd_scrub_begin_hour", 0),
            end_hour: cfg_u64(map, &who, "osd_scrub_end_hour", 0),
            noscrub: map.flags.contains(&OsdFlag::NoScrub),
            nodeep_scrub: map.flags.contains(&OsdFlag::NoDeepScrub),
        }
    }

    /// Whether periodic scrubs may start at UTC hour `hour`.
    fn hour_allowed(&self, hour: u64) -> bool {
        let (b, e) = (self.begin_hour, self.end_hour);
        if b == e {
            true
        } else if b < e {
            hour >= b && hour < e
        } else {
            hour >= b || hour < e
        }
    }

    /// The periodic scrub due at `now_secs` (this OSD's clock), if any.
    /// `jitter` in [0, 1) spreads PGs over half a minimum interval.
    pub fn due(&self, st: &ScrubStamps, now_secs: u64, jitter: f64) -> Option<ScrubRequest> {
        let hour_ok = self.hour_allowed(now_secs / 3600 % 24);
        let base = st.last_scrub_secs.max(st.first_seen_secs);
        let deep_base = st.last_deep_scrub_secs.max(st.first_seen_secs);
        let spread = (self.min_interval_secs as f64 * 0.5 * jitter.clamp(0.0, 1.0)) as u64;
        let deep_due = !self.nodeep_scrub
            && now_secs >= deep_base.saturating_add(self.deep_interval_secs + spread);
        if deep_due && hour_ok {
            return Some(ScrubRequest {
                deep: true,
                repair: false,
                order: None,
            });
        }
        let min_due = now_secs >= base.saturating_add(self.min_interval_secs + spread);
        let max_due = now_secs >= base.saturating_add(self.max_interval_secs);
        if !self.noscrub && ((min_due && hour_ok) || max_due) {
            return Some(ScrubRequest {
                deep: false,
                repair: false,
                order: None,
            });
        }
        None
    }
}

/// This OSD's wall clock in Unix seconds (stamps and hours only).
pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Loads a PG's stamps from the store (None: never written here).
pub(crate) fn load_stamps(store: &Store, coll: CollectionId) -> Option<ScrubStamps> {
    let b = store.meta_get(&coll, META_SCRUB).ok()??;
    decode("scrub stamps", &b).ok()
}

/// The report the beacon carries.
pub(crate) fn report_of(st: &ScrubStamps, running: Option<ScrubRequest>) -> PgScrubReport {
    PgScrubReport {
        last_scrub_stamp: st.last_scrub_secs,
        last_deep_scrub_stamp: st.last_deep_scrub_secs,
        scrubbing: match running {
            Some(r) if r.repair => "repairing".into(),
            Some(r) if r.deep => "deep-scrubbing".into(),
            Some(_) => "scrubbing".into(),
            None => String::new(),
        },
        errors: st.errors,
        inconsistent: st.inconsistent.clone(),
        order_done: st.order_done,
        last_failure: st.last_failure.clone(),
    }
}

/// The state suffix (`+scrubbing+deep`, `+inconsistent`, `+repair`).
pub(crate) fn state_suffix(st: &ScrubStamps, running: Option<ScrubRequest>) -> String {
    let mut s = String::new();
    if let Some(r) = running {
        s.push_str("+scrubbing");
        if r.deep {
            s.push_str("+deep");
        }
    }
    if st.errors > 0 {
        s.push_str("+inconsistent");
    }
    if running.is_some_and(|r| r.repair) {
        s.push_str("+repair");
    }
    s
}

// ------------------------------------------------------------ member side

/// The collection a scrub map request names on this OSD.
fn request_coll(req: &ScrubMapRequest) -> CollectionId {
    match req.shard {
        Some(s) => CollectionId::new(req.pgid.pool.0, req.pgid.seed, s),
        None => CollectionId::pg(req.pgid.pool.0, req.pgid.seed),
    }
}

/// Member side of a scrub-map request (built on a blocking thread, at most
/// `SCRUB_MAP_BUILDS_MAX` at once).
pub(crate) async fn serve_scrub_map(shared: &Arc<Shared>, req: ScrubMapRequest) -> ScrubMapReply {
    let _permit = shared.scrub.map_builds.clone().acquire_owned().await.ok();
    let store = shared.store.clone();
    let coll = request_coll(&req);
    let result = tokio::task::spawn_blocking(move || {
        build_scrub_map(&store, coll, req.range, req.deep, req.shard.is_some())
    })
    .await
    .unwrap_or_else(|e| Err(format!("scrub map task: {e}")));
    ScrubMapReply {
        pgid: req.pgid,
        from: shared.cfg.id,
        result,
    }
}

/// Lists the objects of `coll` in `range` (client objects only, at most
/// `limit`); the bool says more were there.
fn list_range(
    store: &Store,
    coll: CollectionId,
    range: ScrubRange,
    limit: usize,
) -> Result<(Vec<ObjectName>, bool), StoreError> {
    let mut out = Vec::new();
    if range.start >= SCRUB_RANGE_END {
        return Ok((out, false));
    }
    let mut start = ListStart::AtHash((range.start as u32).reverse_bits());
    loop {
        let page = store.list_objects(&coll, &start, SCRUB_LIST_PAGE)?;
        let n = page.len();
        for o in &page {
            if u64::from(o.hash.reverse_bits()) >= range.end {
                return Ok((out, false));
            }
            // Snapshot clones travel with (and are read through) their head.
            if crate::ec_exec::is_internal_ns(&o.namespace) || o.snap != cairn_store::SNAP_HEAD {
                continue;
            }
            if out.len() >= limit {
                return Ok((out, true));
            }
            out.push(ObjectName::new(o.namespace.clone(), o.name.clone()));
        }
        match page.last() {
            Some(last) if n == SCRUB_LIST_PAGE => start = ListStart::After(last.clone()),
            _ => return Ok((out, false)),
        }
    }
}

/// crc32c over length-prefixed parts, so that ("ab","c") != ("a","bc").
fn digest_parts<'a>(parts: impl Iterator<Item = &'a [u8]>) -> u32 {
    let mut crc = 0u32;
    for p in parts {
        crc = crc32c::crc32c_append(crc, &(p.len() as u64).to_le_bytes());
        crc = crc32c::crc32c_append(crc, p);
    }
    crc
}

/// One object's scrub entry on this member.
fn scrub_object(
    store: &Store,
    coll: CollectionId,
    name: &ObjectName,
    deep: bool,
    ec: bool,
) -> Result<Option<ScrubObject>, StoreError> {
    let o = store_oid(name);
    let st = match store.stat(&coll, &o) {
        Ok(st) => st,
        Err(StoreError::NoSuchObject { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut entry = ScrubObject {
        name: name.clone(),
        size: st.size,
        logical_size: st.size,
        version: Version::default(),
        attrs_digest: 0,
        omap_digest: 0,
        data_digest: None,
        read_error: None,
    };
    let attrs = store.getattrs(&coll, &o)?;
    if let Some(v) = attrs.get(ATTR_VERSION) {
        entry.version = exec::decode_version(v);
    }
    if ec {
        if let Some(info) = attrs
            .get(crate::ec_exec::ATTR_EC)
            .and_then(|b| cairn_ec::ChunkInfo::decode(b).ok())
        {
            entry.logical_size = info.logical_size_bytes;
        }
    }
    entry.attrs_digest = digest_parts(
        attrs
            .iter()
            .filter(|(k, _)| k.as_str() != ATTR_VERSION && k.as_str() != crate::ec_exec::ATTR_EC)
            .flat_map(|(k, v)| [k.as_bytes(), v.as_slice()]),
    );
    let mut omap_crc = 0u32;
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = store.omap_range(&coll, &o, after.as_deref(), SCRUB_OMAP_PAGE)?;
        let n = page.len();
        omap_crc = crc32c::crc32c_append(
            omap_crc,
            &digest_parts(page.iter().flat_map(|(k, v)| [k.as_slice(), v.as_slice()]))
                .to_le_bytes(),
        );
        after = page.last().map(|(k, _)| k.clone());
        if n < SCRUB_OMAP_PAGE {
            break;
        }
    }
    entry.omap_digest = omap_crc;
    // The object's snapshot clones, scrubbed with their head: each must be
    // there, and their ids, sizes and versions agree between members (they
    // join the attribute digest; an object without clones keeps the digest
    // it always had).
    let clones: Vec<u64> = match attrs.get(exec::ATTR_SNAPSET) {
        None => Vec::new(),
        Some(raw) => match exec::SnapSet::decode(raw) {
            Ok(ss) => ss.clones.iter().map(|c| c.id).collect(),
            Err(e) => {
                entry.read_error = Some(format!("snapshot set: {e}"));
                return Ok(Some(entry));
            }
        },
    };
    let mut clone_sizes = Vec::with_capacity(clones.len());
    if !clones.is_empty() {
        let mut parts: Vec<Vec<u8>> = Vec::with_capacity(clones.len());
        for &id in &clones {
            let co = o.clone().with_snap(id);
            let cst = match store.stat(&coll, &co) {
                Ok(cst) => cst,
                Err(StoreError::NoSuchObject { .. }) => {
                    entry.read_error = Some(format!("clone {id} is missing"));
                    return Ok(Some(entry));
                }
                Err(e) => return Err(e),
            };
            let version = store
                .getattr(&coll, &co, ATTR_VERSION)?
                .map(|v| exec::decode_version(&v))
                .unwrap_or_default();
            let mut part = id.to_le_bytes().to_vec();
            part.extend_from_slice(&cst.size.to_le_bytes());
            part.extend_from_slice(&version.epoch.to_le_bytes());
            part.extend_from_slice(&version.seq.to_le_bytes());
            parts.push(part);
            clone_sizes.push((id, cst.size));
        }
        let clones_digest = digest_parts(parts.iter().map(|p| p.as_slice()));
        entry.attrs_digest =
            crc32c::crc32c_append(entry.attrs_digest, &clones_digest.to_le_bytes());
    }
    if deep {
        // Head data, then each clone's, read through the store (which
        // checks every block's crc32c).
        let mut crc = 0u32;
        let pieces = std::iter::once((cairn_store::SNAP_HEAD, st.size)).chain(clone_sizes);
        for (snap, size) in pieces {
            let obj = o.clone().with_snap(snap);
            let mut off = 0u64;
            while off < size {
                let len = SCRUB_READ_PIECE_BYTES.min(size - off);
                match store.read(&coll, &obj, off, len) {
                    Ok(b) => crc = crc32c::crc32c_append(crc, &b),
                    Err(e) if snap == cairn_store::SNAP_HEAD => {
                        entry.read_error = Some(e.to_string());
                        return Ok(Some(entry));
                    }
                    Err(e) => {
                        entry.read_error = Some(format!("clone {snap}: {e}"));
                        return Ok(Some(entry));
                    }
                }
                off += len;
            }
        }
        entry.data_digest = Some(crc);
    }
    Ok(Some(entry))
}

/// This member's scrub map of `range` in `coll`.
pub(crate) fn build_scrub_map(
    store: &Store,
    coll: CollectionId,
    range: ScrubRange,
    deep: bool,
    ec: bool,
) -> Result<ScrubMap, String> {
    if !store.collection_exists(&coll).map_err(|e| e.to_string())? {
        return Err(format!("no collection {coll:?} here"));
    }
    let (names, truncated) =
        list_range(store, coll, range, SCRUB_MAP_MAX_OBJECTS).map_err(|e| e.to_string())?;
    let mut objects = Vec::with_capacity(names.len());
    for n in names {
        match scrub_object(store, coll, &n, deep, ec) {
            Ok(Some(e)) => objects.push(e),
            Ok(None) => {} // removed since the listing (not in this chunk's writes)
            Err(e) => objects.push(ScrubObject {
                name: n,
                size: 0,
                logical_size: 0,
                version: Version::default(),
                attrs_digest: 0,
                omap_digest: 0,
                data_digest: None,
                read_error: Some(e.to_string()),
            }),
        }
    }
    Ok(ScrubMap { objects, truncated })
}

// ------------------------------------------------------------- comparison

/// One member of the comparison: the OSD, its EC shard, and its map.
#[derive(Debug, Clone)]
pub(crate) struct MemberMap {
    pub osd: i32,
    pub shard: Option<u8>,
    pub map: ScrubMap,
}

/// One bad copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BadCopy {
    pub osd: i32,
    pub shard: Option<u8>,
    pub errors: Vec<&'static str>,
    pub detail: Option<String>,
}

/// One inconsistent object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Finding {
    pub name: ObjectName,
    /// The authoritative copy: its holder and version (None: the object
    /// should not exist, or no member holds a good copy).
    pub auth: Option<(i32, Version)>,
    /// False when the object should not exist (deleted per the log).
    pub should_exist: bool,
    pub bad: Vec<BadCopy>,
}

impl Finding {
    pub fn report(&self) -> InconsistentObjectReport {
        InconsistentObjectReport {
            object: self.name.to_string(),
            version: self.auth.map(|(_, v)| v.to_string()),
            auth_osd: self.auth.map(|(o, _)| o),
            shards: self
                .bad
                .iter()
                .map(|b| ShardErrorReport {
                    osd: b.osd,
                    shard: b.shard,
                    errors: b.errors.iter().map(|e| e.to_string()).collect(),
                    detail: b.detail.clone(),
                })
                .collect(),
        }
    }
}

/// What must agree between copies (EC shards hold different data, so their
/// data digests are not compared with each other).
fn signature(o: &ScrubObject, compare_data: bool) -> (Version, u64, u64, u32, u32, Option<u32>) {
    (
        o.version,
        o.size,
        o.logical_size,
        o.attrs_digest,
        o.omap_digest,
        if compare_data { o.data_digest } else { None },
    )
}

/// Compares the members' maps of one chunk. `latest_ops` holds, for the
/// objects of the chunk in the primary's log, whether their newest entry
/// deleted them (the log decides whether an object should exist; without
/// an entry, the majority of members does, ties keeping the object). The
/// authoritative copy is the newest version among readable copies, then
/// the most common, then the primary's.
pub(crate) fn compare(
    members: &[MemberMap],
    primary: i32,
    latest_ops: &HashMap<ObjectName, bool>,
    ec: bool,
) -> Vec<Finding> {
    let compare_data = !ec;
    let mut names: BTreeSet<&ObjectName> = BTreeSet::new();
    let by_member: Vec<HashMap<&ObjectName, &ScrubObject>> = members
        .iter()
        .map(|m| m.map.objects.iter().map(|o| (&o.name, o)).collect())
        .collect();
    for m in members {
        names.extend(m.map.objects.iter().map(|o| &o.name));
    }
    let mut out = Vec::new();
    for name in names {
        let copies: Vec<Option<&ScrubObject>> =
            by_member.iter().map(|b| b.get(name).copied()).collect();
        let present = copies.iter().filter(|c| c.is_some()).count();
        let should_exist = match latest_ops.get(name) {
            Some(deleted) => !deleted,
            None => present * 2 >= members.len(),
        };
        let mut bad = Vec::new();
        let mut auth = None;
        if !should_exist {
            for (m, c) in members.iter().zip(&copies) {
                if c.is_some() {
                    bad.push(BadCopy {
                        osd: m.osd,
                        shard: m.shard,
                        errors: vec!["stale"],
                        detail: Some("the PG log says this object was deleted".into()),
                    });
                }
            }
        } else {
            // Group readable copies by what must agree.
            let mut groups: BTreeMap<_, Vec<usize>> = BTreeMap::new();
            for (i, c) in copies.iter().enumerate() {
                if let Some(o) = c.filter(|o| o.read_error.is_none()) {
                    groups
                        .entry(signature(o, compare_data))
                        .or_default()
                        .push(i);
                }
            }
            let best = groups.iter().max_by_key(|(sig, idx)| {
                (
                    sig.0,
                    idx.len(),
                    idx.iter().any(|&i| members[i].osd == primary),
                )
            });
            let best_sig = best.map(|(s, _)| *s);
            if let Some((sig, idx)) = best {
                let holder = idx
                    .iter()
                    .map(|&i| members[i].osd)
                    .find(|&o| o == primary)
                    .unwrap_or(members[idx[0]].osd);
                auth = Some((holder, sig.0));
            }
            for (m, c) in members.iter().zip(&copies) {
                let Some(o) = c else {
                    bad.push(BadCopy {
                        osd: m.osd,
                        shard: m.shard,
                        errors: vec!["missing"],
                        detail: None,
                    });
                    continue;
                };
                if let Some(e) = &o.read_error {
                    bad.push(BadCopy {
                        osd: m.osd,
                        shard: m.shard,
                        errors: vec!["read_error"],
                        detail: Some(e.clone()),
                    });
                    continue;
                }
                let Some(a) = best_sig else { continue };
                let mine = signature(o, compare_data);
                let mut errors = Vec::new();
                if mine.0 != a.0 {
                    errors.push("version_mismatch");
                }
                if mine.1 != a.1 || mine.2 != a.2 {
                    errors.push("size_mismatch");
                }
                if mine.3 != a.3 {
                    errors.push("attr_mismatch");
                }
                if mine.4 != a.4 {
                    errors.push("omap_mismatch");
                }
                if mine.5 != a.5 {
                    errors.push("data_digest_mismatch");
                }
                if !errors.is_empty() {
                    let detail = (mine.0 != a.0)
                        .then(|| format!("has version {}, authoritative is {}", mine.0, a.0));
                    bad.push(BadCopy {
                        osd: m.osd,
                        shard: m.shard,
                        errors,
                        detail,
                    });
                }
            }
        }
        if !bad.is_empty() {
            out.push(Finding {
                name: name.clone(),
                auth,
                should_exist,
                bad,
            });
        }
    }
    out
}

// ----------------------------------------------------------------- the job

/// What the actor tells the job about the blocked chunk once no write is in
/// flight on it: the newest log entry of each of its objects in the log
/// (true = a delete).
pub(crate) type ChunkLog = HashMap<ObjectName, bool>;

/// Messages the job sends its PG actor.
pub(crate) enum ScrubCtl {
    /// Block writes to `range`; answers Err when the PG cannot scrub now.
    Block {
        interval_since: Epoch,
        range: ScrubRange,
        reply: oneshot::Sender<Result<(), String>>,
    },
    /// Ok(None) while writes on the chunk are in flight, then its log view.
    Settled {
        reply: oneshot::Sender<Result<Option<ChunkLog>, String>>,
    },
    Unblock,
}

/// The newest log entry per object of `range` (true = deleted).
pub(crate) fn chunk_log<'a>(
    log: impl Iterator<Item = &'a LogEntry>,
    range: ScrubRange,
) -> ChunkLog {
    let mut out = HashMap::new();
    for e in log {
        if !range.contains_hash(e.oid.hash()) {
            continue;
        }
        match e.op {
            LogOp::Modify => {
                out.insert(e.oid.clone(), false);
            }
            LogOp::Delete => {
                out.insert(e.oid.clone(), true);
            }
            LogOp::Error(_) => {}
        }
    }
    out
}

/// The outcome of one run, for the actor.
pub(crate) struct ScrubOutcome {
    pub req: ScrubRequest,
    pub interval_since: Epoch,
    /// Ok: the findings left after any repair, and how many copies were repaired.
    pub result: Result<(Vec<Finding>, u64), String>,
}

/// One scrub run of a PG's primary.
pub(crate) struct ScrubJob {
    pub shared: Arc<Shared>,
    pub pgid: PgId,
    pub coll: CollectionId,
    pub actor: mpsc::Sender<PgMsg>,
    pub epoch: Epoch,
    pub interval_since: Epoch,
    /// Acting members (replicated) — for EC see `ec`.
    pub acting: Vec<i32>,
    pub ec: Option<EcPg>,
    pub req: ScrubRequest,
    pub slot: ScrubSlot,
}

impl ScrubJob {
    fn me(&self) -> i32 {
        self.shared.cfg.id
    }

    /// (osd, shard) of every member scrubbed.
    fn members(&self) -> Vec<(i32, Option<u8>)> {
        match &self.ec {
            Some(ec) => ec
                .shards
                .iter()
                .enumerate()
                .filter(|(_, &o)| o != SHARD_HOLE)
                .map(|(s, &o)| (o, Some(s as u8)))
                .collect(),
            None => self.acting.iter().map(|&o| (o, None)).collect(),
        }
    }

    async fn ctl(&self, c: ScrubCtl) -> Result<(), String> {
        self.actor
            .send(PgMsg::Scrub(c))
            .await
            .map_err(|_| "the PG stopped".to_string())
    }

    /// Runs the scrub; the outcome goes back to the actor.
    pub async fn run(self) {
        let result = self.run_chunks().await;
        let _ = self.ctl(ScrubCtl::Unblock).await;
        let outcome = ScrubOutcome {
            req: self.req,
            interval_since: self.interval_since,
            result,
        };
        let _ = self.actor.send(PgMsg::ScrubDone(Box::new(outcome))).await;
        drop(self.slot);
    }

    async fn run_chunks(&self) -> Result<(Vec<Finding>, u64), String> {
        let map = self.shared.map_rx.borrow().clone();
        let who = format!("osd.{}", self.me());
        let chunk_max = cfg_u64(&map, &who, "osd_scrub_chunk_max", 25).clamp(1, 1000) as usize;
        let sleep = Duration::from_secs_f64(cfg_f64(&map, &who, "osd_scrub_sleep", 0.05).max(0.0));
        let mut start = 0u64;
        let mut findings = Vec::new();
        let mut repaired = 0u64;
        while start < SCRUB_RANGE_END {
            let end = self.chunk_end(start, chunk_max).await?;
            let range = ScrubRange { start, end };
            let (f, r) = self.scrub_chunk(range).await?;
            findings.extend(f);
            repaired += r;
            start = end;
            if start < SCRUB_RANGE_END && !sleep.is_zero() {
                tokio::time::sleep(sleep).await;
            }
        }
        Ok((findings, repaired))
    }

    /// The end of the chunk starting at `start`: just before the first
    /// object past `chunk_max` in the primary's listing.
    async fn chunk_end(&self, start: u64, chunk_max: usize) -> Result<u64, String> {
        let store = self.shared.store.clone();
        let coll = self.coll;
        tokio::task::spawn_blocking(move || {
            let from = ListStart::AtHash((start as u32).reverse_bits());
            let page = store
                .list_objects(&coll, &from, chunk_max + 1)
                .map_err(|e| e.to_string())?;
            if page.len() <= chunk_max {
                return Ok(SCRUB_RANGE_END);
            }
            let next = u64::from(page[chunk_max].hash.reverse_bits());
            Ok(next.max(start + 1))
        })
        .await
        .map_err(|e| format!("scrub listing task: {e}"))?
    }

    /// Blocks writes to the chunk, waits for those in flight, compares the
    /// members' maps (repairing when asked), and releases the chunk.
    async fn scrub_chunk(&self, range: ScrubRange) -> Result<(Vec<Finding>, u64), String> {
        let (tx, rx) = oneshot::channel();
        self.ctl(ScrubCtl::Block {
            interval_since: self.interval_since,
            range,
            reply: tx,
        })
        .await?;
        rx.await.map_err(|_| "the PG stopped".to_string())??;
        let r = self.scrub_blocked_chunk(range).await;
        self.ctl(ScrubCtl::Unblock).await?;
        r
    }

    async fn scrub_blocked_chunk(&self, range: ScrubRange) -> Result<(Vec<Finding>, u64), String> {
        let log = loop {
            let (tx, rx) = oneshot::channel();
            self.ctl(ScrubCtl::Settled { reply: tx }).await?;
            match rx.await.map_err(|_| "the PG stopped".to_string())?? {
                Some(log) => break log,
                None => tokio::time::sleep(SCRUB_SETTLE_POLL).await,
            }
        };
        let findings = self.compare_chunk(range, &log).await?;
        if findings.is_empty() || !self.req.repair {
            return Ok((findings, 0));
        }
        let mut repaired = 0u64;
        for f in &findings {
            repaired += self.repair(f).await?;
        }
        // Scrub the chunk again: what is left is reported.
        let left = self.compare_chunk(range, &log).await?;
        Ok((left, repaired))
    }

    async fn compare_chunk(
        &self,
        range: ScrubRange,
        log: &ChunkLog,
    ) -> Result<Vec<Finding>, String> {
        let maps = self.gather_maps(range).await?;
        let mut findings = compare(&maps, self.me(), log, self.ec.is_some());
        if self.req.deep {
            if let Some(ec) = &self.ec {
                findings.extend(self.check_parity(ec, &maps, &findings).await);
            }
        }
        Ok(findings)
    }

    /// Every member's scrub map of `range` (this OSD's from its store).
    async fn gather_maps(&self, range: ScrubRange) -> Result<Vec<MemberMap>, String> {
        let mut set = tokio::task::JoinSet::new();
        for (osd, shard) in self.members() {
            let req = ScrubMapRequest {
                pgid: self.pgid,
                shard,
                from: self.me(),
                epoch: self.epoch,
                range,
                deep: self.req.deep,
            };
            let shared = self.shared.clone();
            let timeout = if self.req.deep {
                SCRUB_DEEP_MAP_TIMEOUT.max(shared.cfg.peer_timeout)
            } else {
                shared.cfg.peer_timeout
            };
            set.spawn(async move {
                let reply = if osd == shared.cfg.id {
                    serve_scrub_map(&shared, req).await
                } else {
                    match shared.peer(osd).await {
                        Ok((_, conn)) => {
                            match conn.call(msg_type::SCRUB_MAP, encode(&req), timeout).await {
                                Ok(m) => decode::<ScrubMapReply>("scrub map reply", &m.payload)
                                    .unwrap_or_else(|e| ScrubMapReply {
                                        pgid: req.pgid,
                                        from: osd,
                                        result: Err(e.to_string()),
                                    }),
                                Err(e) => ScrubMapReply {
                                    pgid: req.pgid,
                                    from: osd,
                                    result: Err(e.to_string()),
                                },
                            }
                        }
                        Err(e) => ScrubMapReply {
                            pgid: req.pgid,
                            from: osd,
                            result: Err(e),
                        },
                    }
                };
                (osd, shard, reply)
            });
        }
        let mut maps = Vec::new();
        while let Some(j) = set.join_next().await {
            let (osd, shard, reply) = j.map_err(|e| format!("scrub map task: {e}"))?;
            let map = reply
                .result
                .map_err(|e| format!("osd.{osd} could not build its scrub map: {e}"))?;
            if map.truncated {
                return Err(format!(
                    "osd.{osd} holds more than {SCRUB_MAP_MAX_OBJECTS} objects of one chunk that this primary does not; repair the PG's membership first (peering/backfill)"
                ));
            }
            maps.push(MemberMap { osd, shard, map });
        }
        maps.sort_by_key(|m| (m.shard, m.osd));
        Ok(maps)
    }

    /// Deep scrub of an EC chunk: recomputes parity from the data chunks of
    /// every object the shards agree on (its head and each snapshot clone)
    /// and compares it with the stored coding chunks.
    async fn check_parity(
        &self,
        ec: &EcPg,
        maps: &[MemberMap],
        already: &[Finding],
    ) -> Vec<Finding> {
        let mut out = Vec::new();
        if ec.shards.contains(&SHARD_HOLE) {
            return out; // a missing shard: nothing to compare parity with
        }
        let names: BTreeSet<&ObjectName> = maps
            .iter()
            .flat_map(|m| m.map.objects.iter().map(|o| &o.name))
            .collect();
        for name in names {
            if already.iter().any(|f| &f.name == name) {
                continue;
            }
            let Some(obj) = maps[0].map.objects.iter().find(|o| &o.name == name) else {
                continue;
            };
            // The head, then each clone (from this primary's own shard).
            let mut targets = Vec::new();
            if obj.size > 0 {
                targets.push((cairn_ops::SNAP_HEAD, obj.version));
            }
            match self.own_clones(name) {
                Ok(c) => targets.extend(c),
                Err(e) => {
                    tracing::warn!(
                        "pg {}: parity check of {name}'s clones skipped: {e}",
                        self.pgid
                    )
                }
            }
            // Shard -> what differs there.
            let mut bad: BTreeMap<usize, String> = BTreeMap::new();
            for (snap, version) in targets {
                let what = if snap == cairn_ops::SNAP_HEAD {
                    "coding chunk differs from the parity of the data chunks".to_string()
                } else {
                    format!("clone {snap}: coding chunk differs from the parity of the data chunks")
                };
                match self.parity_mismatches(ec, name, snap, version).await {
                    Ok(shards) => {
                        for s in shards {
                            bad.entry(s).or_insert_with(|| what.clone());
                        }
                    }
                    Err(e) => tracing::warn!(
                        "pg {}: parity check of {name} (snap {snap:#x}) skipped: {e}",
                        self.pgid
                    ),
                }
            }
            if bad.is_empty() {
                continue;
            }
            out.push(Finding {
                name: name.clone(),
                auth: Some((self.me(), obj.version)),
                should_exist: true,
                bad: bad
                    .into_iter()
                    .map(|(s, detail)| BadCopy {
                        osd: ec.shards[s],
                        shard: Some(s as u8),
                        errors: vec!["ec_parity_mismatch"],
                        detail: Some(detail),
                    })
                    .collect(),
            });
        }
        out
    }

    /// The snapshot clones of `name` on this primary's own shard that hold
    /// data: (clone id, version).
    fn own_clones(&self, name: &ObjectName) -> Result<Vec<(u64, Version)>, String> {
        let store = &self.shared.store;
        let head = store_oid(name);
        crate::runtime::blocking_store_call(|| {
            let Some(raw) = store
                .getattr(&self.coll, &head, exec::ATTR_SNAPSET)
                .map_err(|e| e.to_string())?
            else {
                return Ok(Vec::new());
            };
            let ss = exec::SnapSet::decode(&raw).map_err(|e| e.to_string())?;
            let mut out = Vec::with_capacity(ss.clones.len());
            for c in &ss.clones {
                let co = head.clone().with_snap(c.id);
                let size = store.stat(&self.coll, &co).map_err(|e| e.to_string())?.size;
                if size == 0 {
                    continue;
                }
                let version = store
                    .getattr(&self.coll, &co, ATTR_VERSION)
                    .map_err(|e| e.to_string())?
                    .map(|v| exec::decode_version(&v))
                    .unwrap_or_default();
                out.push((c.id, version));
            }
            Ok(out)
        })
    }

    /// Coding shards whose stored chunk of the head (`snap` =
    /// `SNAP_HEAD`) or of clone `snap` differs from the recomputed parity.
    async fn parity_mismatches(
        &self,
        ec: &EcPg,
        name: &ObjectName,
        snap: u64,
        version: Version,
    ) -> Result<Vec<usize>, String> {
        let mut chunks = Vec::with_capacity(ec.shards.len());
        for (s, &osd) in ec.shards.iter().enumerate() {
            let req = EcRead {
                pgid: self.pgid,
                shard: s as u8,
                from: self.me(),
                epoch: self.epoch,
                oid: name.clone(),
                ranges: vec![(0, EC_READ_TO_END)],
                with_attrs: false,
                snap,
            };
            let d = crate::ec_io::call_read(&self.shared, osd, &req)
                .await
                .map_err(|e| format!("shard {s} on osd.{osd}: {e:?}"))?;
            if d.version != version {
                return Err(format!("shard {s} changed version while checked"));
            }
            chunks.push(d.data.into_iter().next().unwrap_or_default());
        }
        ec.code
            .codec()
            .parity_mismatches(&chunks)
            .map_err(|e| e.to_string())
    }

    // ------------------------------------------------------------- repair

    /// Rewrites the bad copies of one object; returns how many were rewritten.
    async fn repair(&self, f: &Finding) -> Result<u64, String> {
        match &self.ec {
            Some(ec) => self.repair_ec(ec, f).await,
            None => self.repair_replicated(f).await,
        }
    }

    fn peering_job(&self) -> PeeringJob {
        PeeringJob {
            shared: self.shared.clone(),
            pgid: self.pgid,
            coll: self.coll,
            epoch: self.epoch,
            interval_since: self.interval_since,
            acting: self.acting.clone(),
            probe: Vec::new(),
            past: Vec::new(),
            my_info: PgInfo::default(),
            my_log: Vec::new(),
            // Repair only uses the job's calls, never activation.
            up: self.acting.clone(),
            size: 0,
            min_size: 0,
            activated: Default::default(),
        }
    }

    /// The full state of `name` from a good copy (None: should not exist).
    async fn good_state(&self, f: &Finding) -> Result<Option<ObjectState>, String> {
        if !f.should_exist {
            return Ok(None);
        }
        let bad: BTreeSet<i32> = f.bad.iter().map(|b| b.osd).collect();
        let mut sources: Vec<i32> = f.auth.map(|(o, _)| o).into_iter().collect();
        sources.extend(self.acting.iter().copied().filter(|o| !bad.contains(o)));
        sources.dedup();
        let mut last = format!("object {}: no good copy to repair from", f.name);
        for osd in sources {
            let got = if osd == self.me() {
                exec::get_object_state(&self.shared.store, self.coll, &f.name)
                    .map_err(|e| e.to_string())
            } else {
                let p = PgPull {
                    pgid: self.pgid,
                    from: self.me(),
                    epoch: self.epoch,
                    what: PullWhat::Objects(vec![(f.name.hash(), f.name.clone())]),
                    shard: None,
                };
                match self
                    .peering_job()
                    .call::<PullReply>(osd, msg_type::PG_PULL, encode(&p), "pull reply")
                    .await
                {
                    Ok(PullReply::Objects(mut v)) => Ok(v.pop().and_then(|(_, _, s)| s)),
                    Ok(PullReply::Refused(e)) => Err(e),
                    Ok(PullReply::List { .. }) => Err("unexpected pull reply".into()),
                    Err(e) => Err(e),
                }
            };
            match got {
                Ok(Some(st)) if f.auth.is_none_or(|(_, v)| version_of(&st) == v) => {
                    return Ok(Some(st))
                }
                Ok(_) => last = format!("osd.{osd} no longer holds the authoritative copy"),
                Err(e) => last = format!("reading the good copy on osd.{osd}: {e}"),
            }
        }
        Err(last)
    }

    async fn repair_replicated(&self, f: &Finding) -> Result<u64, String> {
        if f.should_exist && f.auth.is_none() {
            tracing::error!(
                "pg {}: object {} has no good copy on any member; it cannot be repaired",
                self.pgid,
                f.name
            );
            return Ok(0);
        }
        let state = self.good_state(f).await?;
        let mut n = 0;
        for b in &f.bad {
            self.install(b.osd, vec![(f.name.hash(), f.name.clone(), state.clone())])
                .await?;
            n += 1;
        }
        tracing::info!(
            "pg {}: repaired {n} copies of {} from osd.{}",
            self.pgid,
            f.name,
            f.auth.map(|(o, _)| o).unwrap_or(-1)
        );
        Ok(n)
    }

    /// Installs whole objects on `osd` (this OSD: straight into its store;
    /// the chunk is blocked, so no write races with it).
    async fn install(
        &self,
        osd: i32,
        objects: Vec<(u32, ObjectName, Option<ObjectState>)>,
    ) -> Result<(), String> {
        if osd == self.me() {
            let store = &self.shared.store;
            let mut txn = Transaction::new();
            for (_, name, st) in &objects {
                let exists = store
                    .exists(&self.coll, &store_oid(name))
                    .map_err(|e| e.to_string())?;
                exec::put_object_state(&mut txn, self.coll, name, exists, st.as_ref());
            }
            return crate::peering::commit(store, txn).await;
        }
        let p = PgPush {
            pgid: self.pgid,
            from: self.me(),
            epoch: self.epoch,
            objects,
            keep_only: None,
            finish: None,
        };
        let r: PgPushReply = self
            .peering_job()
            .call(osd, msg_type::PG_PUSH, encode(&p), "push reply")
            .await?;
        r.result
            .map_err(|e| format!("osd.{osd} failed to install the repaired copy: {e}"))
    }

    async fn repair_ec(&self, ec: &EcPg, f: &Finding) -> Result<u64, String> {
        let job = crate::ec_peering::EcPeeringJob {
            base: self.peering_job(),
            ec: ec.clone(),
        };
        let bad_shards: BTreeSet<usize> = f
            .bad
            .iter()
            .filter_map(|b| b.shard.map(usize::from))
            .collect();
        let sources: Vec<(usize, i32)> = ec
            .shards
            .iter()
            .enumerate()
            .filter(|(s, &o)| o != SHARD_HOLE && !bad_shards.contains(s))
            .map(|(s, &o)| (s, o))
            .collect();
        let mut n = 0;
        for b in &f.bad {
            let Some(shard) = b.shard.map(usize::from) else {
                continue;
            };
            let state = if f.should_exist {
                match job.rebuild_object(&f.name, shard, &sources).await? {
                    Some(st) => Some(st),
                    None => {
                        return Err(format!(
                            "object {}: no good shard holds it to rebuild shard {shard}",
                            f.name
                        ))
                    }
                }
            } else {
                None
            };
            job.deliver(b.osd, vec![(f.name.hash(), f.name.clone(), state)], None)
                .await?;
            n += 1;
        }
        tracing::info!(
            "pg {}: rebuilt {n} chunks of {} from shards {sources:?}",
            self.pgid,
            f.name
        );
        Ok(n)
    }
}

/// The version attribute of a copied object.
fn version_of(st: &ObjectState) -> Version {
    st.attrs
        .iter()
        .find(|(k, _)| k == ATTR_VERSION)
        .map(|(_, v): &(String, Bytes)| exec::decode_version(v))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(name: &str, v: u64, data: u32) -> ScrubObject {
        ScrubObject {
            name: ObjectName::new("", name),
            size: 10,
            logical_size: 10,
            version: Version { epoch: 1, seq: v },
            attrs_digest: 7,
            omap_digest: 0,
            data_digest: Some(data),
            read_error: None,
        }
    }

    fn member(osd: i32, objs: Vec<ScrubObject>) -> MemberMap {
        MemberMap {
            osd,
            shard: None,
            map: ScrubMap {
                objects: objs,
                truncated: false,
            },
        }
    }

    #[test]
    fn clean_maps_have_no_findings() {
        let m: Vec<MemberMap> = (0..3).map(|o| member(o, vec![obj("a", 1, 5)])).collect();
        assert!(compare(&m, 0, &HashMap::new(), false).is_empty());
    }

    #[test]
    fn the_odd_copy_out_is_bad_and_the_primary_breaks_ties() {
        let m = vec![
            member(0, vec![obj("a", 1, 5)]),
            member(1, vec![obj("a", 1, 9)]),
            member(2, vec![obj("a", 1, 5)]),
        ];
        let f = compare(&m, 0, &HashMap::new(), false);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].auth.map(|a| a.0), Some(0));
        assert_eq!(f[0].bad.len(), 1);
        assert_eq!(f[0].bad[0].osd, 1);
        assert_eq!(f[0].bad[0].errors, vec!["data_digest_mismatch"]);
        // Two copies, two digests: the primary's wins.
        let f = compare(&m[..2], 1, &HashMap::new(), false);
        assert_eq!(f[0].auth.map(|a| a.0), Some(1));
        assert_eq!(f[0].bad[0].osd, 0);
    }

    #[test]
    fn missing_stale_read_errors_and_newer_versions() {
        let mut broken = obj("a", 1, 5);
        broken.read_error = Some("checksum mismatch at offset 4096".into());
        let m = vec![
            member(0, vec![broken, obj("b", 2, 1)]),
            member(1, vec![obj("a", 1, 5), obj("b", 3, 1)]),
            member(2, vec![obj("a", 1, 5), obj("c", 1, 1)]),
        ];
        let mut log = HashMap::new();
        log.insert(ObjectName::new("", "c"), true); // c was deleted
        let f = compare(&m, 0, &log, false);
        let by: HashMap<String, &Finding> = f.iter().map(|x| (x.name.name.clone(), x)).collect();
        assert_eq!(by["a"].bad[0].errors, vec!["read_error"]);
        assert_eq!(by["a"].auth.map(|a| a.0), Some(1));
        // b: the newest version wins even against the primary; osd.2 lacks it.
        let b = by["b"];
        assert_eq!(b.auth, Some((1, Version { epoch: 1, seq: 3 })));
        let bad: Vec<(i32, Vec<&str>)> = b.bad.iter().map(|x| (x.osd, x.errors.clone())).collect();
        assert_eq!(
            bad,
            vec![(0, vec!["version_mismatch"]), (2, vec!["missing"])]
        );
        // c: deleted per the log, so osd.2's copy is stale.
        assert!(!by["c"].should_exist);
        assert_eq!(by["c"].bad[0].errors, vec!["stale"]);
    }

    #[test]
    fn ec_shards_do_not_compare_data_digests() {
        let m: Vec<MemberMap> = (0..3)
            .map(|o| {
                let mut mm = member(o, vec![obj("a", 1, o as u32)]);
                mm.shard = Some(o as u8);
                mm
            })
            .collect();
        assert!(compare(&m, 0, &HashMap::new(), true).is_empty());
    }

    #[test]
    fn schedule_respects_intervals_flags_and_hours() {
        let s = ScrubSchedule {
            min_interval_secs: 100,
            max_interval_secs: 1000,
            deep_interval_secs: 5000,
            begin_hour: 0,
            end_hour: 0,
            noscrub: false,
            nodeep_scrub: false,
        };
        let st = ScrubStamps {
            first_seen_secs: 10_000,
            last_scrub_secs: 10_000,
            last_deep_scrub_secs: 10_000,
            ..Default::default()
        };
        assert_eq!(s.due(&st, 10_050, 0.0), None);
        assert_eq!(s.due(&st, 10_100, 0.0).map(|r| r.deep), Some(false));
        // Jitter spreads up to half a minimum interval.
        assert_eq!(s.due(&st, 10_120, 0.99), None);
        assert_eq!(s.due(&st, 15_000, 0.0).map(|r| r.deep), Some(true));
        let flagged = ScrubSchedule {
            noscrub: true,
            nodeep_scrub: true,
            ..s.clone()
        };
        assert_eq!(flagged.due(&st, 20_000, 0.0), None);
        // Outside the hours window only the max interval forces a scrub.
        let night = ScrubSchedule {
            begin_hour: 22,
            end_hour: 2,
            deep_interval_secs: 1_000_000,
            ..s.clone()
        };
        let noon = 12 * 3600 + 86_400 * 10;
        let st = ScrubStamps {
            first_seen_secs: noon - 500,
            last_scrub_secs: noon - 500,
            last_deep_scrub_secs: noon - 500,
            ..Default::default()
        };
        assert_eq!(night.due(&st, noon, 0.0), None);
        assert!(night.due(&st, noon + 600, 0.0).is_some());
        assert!(night.hour_allowed(23) && night.hour_allowed(1) && !night.hour_allowed(2));
    }

    #[test]
    fn member_maps_cover_exactly_their_range_and_find_corruption() {
        let (_dir, store) = crate::small_test_store();
        let coll = CollectionId::pg(1, 0);
        let mut t = Transaction::new();
        t.create_collection(coll);
        let names: Vec<ObjectName> = (0..40)
            .map(|i| ObjectName::new("", format!("o{i}")))
            .collect();
        for n in &names {
            exec::put_object_state(
                &mut t,
                coll,
                n,
                false,
                Some(&ObjectState {
                    data: Bytes::from(vec![3u8; 5000]),
                    attrs: vec![(
                        "_v".into(),
                        exec::encode_version(Version { epoch: 1, seq: 1 }),
                    )],
                    omap: vec![],
                    clones: vec![],
                    data_crc: None,
                }),
            );
        }
        store.commit(t).unwrap();
        let all = ScrubRange {
            start: 0,
            end: SCRUB_RANGE_END,
        };
        let m = build_scrub_map(&store, coll, all, true, false).unwrap();
        assert_eq!(m.objects.len(), 40);
        assert!(m
            .objects
            .iter()
            .all(|o| o.data_digest.is_some() && o.read_error.is_none()));
        let mid = 1u64 << 31;
        let lo = build_scrub_map(
            &store,
            coll,
            ScrubRange { start: 0, end: mid },
            false,
            false,
        )
        .unwrap();
        let hi = build_scrub_map(
            &store,
            coll,
            ScrubRange {
                start: mid,
                end: SCRUB_RANGE_END,
            },
            false,
            false,
        )
        .unwrap();
        assert_eq!(lo.objects.len() + hi.objects.len(), 40);
        assert!(lo
            .objects
            .iter()
            .all(|o| ScrubRange { start: 0, end: mid }.contains_hash(o.name.hash())));
    }
}
