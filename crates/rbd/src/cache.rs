//! The client write cache of one open image (librbd's `rbd_cache` in
//! write-back mode), with a disk write cache's contract: a write is
//! acknowledged once it is here; [`WriteCache::flush_all`] returns only
//! after every write acknowledged before it is durable on every acting
//! replica; a FUA write waits for its own object. Owns the dirty data, its
//! write-back (merged per object, one op per object at a time), the bounds
//! and the sticky write-back error. Does not own what an object op looks
//! like (copy-up, snapshot context): the image's `SendOp` does.
//!
//! Ordering: each write gets a sequence number. Per object, dirty data is
//! a set of non-overlapping extents (a later write replaces what it
//! overlaps and inherits the oldest sequence number of what it replaced,
//! so a flush still waits for it); at most one write-back op per object is
//! in flight, so an object's ops land in the order their data was taken.
//! Reads overlay the in-flight, then the dirty extents on what the OSDs
//! return (snapshotted before the OSD read is sent).
//!
//! Bounds: dirty plus in-flight bytes stay under `max_dirty_bytes`
//! (writers wait beyond it); above `target_dirty_bytes`, the objects dirty
//! longest are written back; data dirty for `max_dirty_age` is written
//! back by a background task; at most [`MAX_WRITEBACK_OPS`] ops are in
//! flight.

use crate::combine::{SendOp, MAX_COMBINED_BYTES, MAX_COMBINED_WRITES};
use crate::error::RbdError;
use bytes::{Bytes, BytesMut};
use cairn_client::ClientError;
use cairn_ops::SubOp;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Write-back ops one image keeps in flight (over all its objects).
pub const MAX_WRITEBACK_OPS: usize = 32;
/// Ceph's defaults for the cache keys (`rbd_cache_*`).
pub const DEFAULT_MAX_DIRTY_BYTES: u64 = 24 << 20;
pub const DEFAULT_TARGET_DIRTY_BYTES: u64 = 16 << 20;
pub const DEFAULT_MAX_DIRTY_AGE: Duration = Duration::from_secs(1);
/// Longest wait between looks at the oldest dirty data.
const AGE_TICK_MAX: Duration = Duration::from_millis(250);
/// How often an open image re-reads its cache settings.
pub const CONFIG_TICK: Duration = Duration::from_secs(1);

/// How an image caches writes (central config `rbd_cache*`, read when
/// the image is opened).
#[derive(Debug, Clone, PartialEq)]
pub struct CacheConfig {
    /// `rbd_cache` true, `rbd_cache_policy` writeback and
    /// `rbd_cache_max_dirty` > 0. False: every write is durable when
    /// acknowledged (write-through).
    pub writeback: bool,
    /// `rbd_cache_writethrough_until_flush`: stay write-through until the
    /// user's first flush (a guest that never flushes gets a safe disk).
    pub writethrough_until_flush: bool,
    pub max_dirty_bytes: u64,
    pub target_dirty_bytes: u64,
    pub max_dirty_age: Duration,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            writeback: true,
            writethrough_until_flush: true,
            max_dirty_bytes: DEFAULT_MAX_DIRTY_BYTES,
            target_dirty_bytes: DEFAULT_TARGET_DIRTY_BYTES,
            max_dirty_age: DEFAULT_MAX_DIRTY_AGE,
        }
    }
}

impl CacheConfig {
    /// Write-through: today's durable-on-ack behaviour.
    pub fn writethrough() -> CacheConfig {
        CacheConfig {
            writeback: false,
            ..CacheConfig::default()
        }
    }

    /// The configuration `who` (e.g. `client.admin`) gets from the
    /// cluster's central config. A value that does not parse is an error
    /// naming the key (the monitors validate known keys, so this only
    /// happens with values stored by an older or newer version).
    pub fn from_map(map: &cairn_map::ClusterMap, who: &str) -> Result<CacheConfig, RbdError> {
        let get = |key: &str| map.config_value(who, key);
        let bad = |key: &str, v: &str, why: String| {
            RbdError::Invalid(format!(
                "central config {key} = '{v}' for {who}: {why}; fix it with 'cairn config set client {key} …'"
            ))
        };
        let boolean = |key: &str, default: bool| -> Result<bool, RbdError> {
            match get(key) {
                Some(v) => cairn_map::config::parse_bool_value(&v).map_err(|e| bad(key, &v, e)),
                None => Ok(default),
            }
        };
        let size = |key: &str, default: u64| -> Result<u64, RbdError> {
            match get(key) {
                Some(v) => cairn_map::config::parse_size(&v).map_err(|e| bad(key, &v, e)),
                None => Ok(default),
            }
        };
        let enabled = boolean("rbd_cache", true)?;
        let policy = get("rbd_cache_policy").unwrap_or_else(|| "writeback".into());
        let writeback_policy = match policy.as_str() {
            "writeback" => true,
            "writethrough" => false,
            other => {
                return Err(bad(
                    "rbd_cache_policy",
                    other,
                    "expected writeback or writethrough".into(),
                ))
            }
        };
        let max_dirty_bytes = size("rbd_cache_max_dirty", DEFAULT_MAX_DIRTY_BYTES)?;
        let target_dirty_bytes = size("rbd_cache_target_dirty", DEFAULT_TARGET_DIRTY_BYTES)?;
        let max_dirty_age = match get("rbd_cache_max_dirty_age") {
            Some(v) => {
                let secs: f64 = v
                    .parse()
                    .map_err(|_| bad("rbd_cache_max_dirty_age", &v, "expected seconds".into()))?;
                if !(0.0..=3600.0).contains(&secs) {
                    return Err(bad(
                        "rbd_cache_max_dirty_age",
                        &v,
                        "must be between 0 and 3600 seconds".into(),
                    ));
                }
                Duration::from_secs_f64(secs)
            }
            None => DEFAULT_MAX_DIRTY_AGE,
        };
        Ok(CacheConfig {
            writeback: enabled && writeback_policy && max_dirty_bytes > 0,
            writethrough_until_flush: boolean("rbd_cache_writethrough_until_flush", true)?,
            max_dirty_bytes,
            target_dirty_bytes: target_dirty_bytes.min(max_dirty_bytes),
            max_dirty_age,
        })
    }
}

/// Dirty bytes at one offset of an object.
struct Extent {
    data: Bytes,
    /// Oldest write sequence number whose data this extent carries or
    /// replaced (a flush up to it waits for this extent).
    min_seq: u64,
}

/// The op of an object being written back.
struct InFlight {
    /// (offset, data) as sent, in order.
    pieces: Vec<(u64, Bytes)>,
    bytes: u64,
    min_seq: u64,
}

#[derive(Default)]
struct Obj {
    /// Non-overlapping, by offset.
    dirty: BTreeMap<u64, Extent>,
    dirty_bytes: u64,
    /// Sequence number / time of the oldest dirty data (valid while
    /// `dirty` is not empty).
    first_seq: u64,
    dirty_since: Option<Instant>,
    in_flight: Option<InFlight>,
    /// Write back every dirty extent with `min_seq` up to this as soon
    /// as the object is free (FUA writes, discards).
    urgent_seq: u64,
}

impl Obj {
    fn is_empty(&self) -> bool {
        self.dirty.is_empty() && self.in_flight.is_none()
    }
}

#[derive(Default)]
struct State {
    /// The settings in force (the central config's, re-read while open).
    cfg: CacheConfig,
    /// The user flushed (or said it will: [`WriteCache::assume_flushing_user`]).
    user_flushed: bool,
    /// Writes are cached (policy write-back, and the first flush seen when
    /// writethrough-until-flush).
    active: bool,
    next_seq: u64,
    /// Only objects with dirty or in-flight data have an entry.
    objects: HashMap<u64, Obj>,
    /// Objects with dirty data and no op in flight, by (first_seq, objno):
    /// oldest first.
    idle_dirty: BTreeSet<(u64, u64)>,
    dirty_bytes: u64,
    in_flight_bytes: u64,
    in_flight_ops: usize,
    /// Every dirty extent with `min_seq` up to this is written back as
    /// soon as its object is free (a flush is waiting).
    urgent_seq: u64,
    /// The first write-back failure (sticky until the image is reopened).
    error: Option<String>,
}

/// One write-back op to start: (object, sub-ops).
type Start = (u64, Vec<SubOp>);

/// Where an open image re-reads its cache settings (the central config);
/// None when they cannot be read (the last good ones stay).
pub(crate) type ConfigSource = Box<dyn Fn() -> Option<CacheConfig> + Send + Sync>;

/// The write cache of one open image.
pub(crate) struct WriteCache {
    state: Mutex<State>,
    /// Settings re-read every [`CONFIG_TICK`] (None: fixed at open).
    source: Option<ConfigSource>,
    /// Signalled whenever an op completes or the cache empties.
    changed: Notify,
    send: SendOp,
    /// The data pool takes one data sub-op per op (erasure-coded).
    one_data_op: bool,
    /// For messages: image name and the data objects' name prefix.
    image: String,
    object_prefix: String,
    /// Bytes in a whole data object: a whole dirty object goes at once.
    object_bytes: u64,
}

impl WriteCache {
    /// A cache with settings fixed at open.
    #[cfg(test)]
    pub(crate) fn new(
        cfg: CacheConfig,
        send: SendOp,
        one_data_op: bool,
        image: &str,
        object_prefix: &str,
        object_bytes: u64,
    ) -> Arc<WriteCache> {
        WriteCache::with_source(
            cfg,
            None,
            send,
            one_data_op,
            image,
            object_prefix,
            object_bytes,
        )
    }

    /// A cache whose settings follow `source` while it is open: limits
    /// and age apply at the next look; turning write-back off stops
    /// caching new writes at once (what is cached goes out as usual, and a
    /// write-through write first writes back what is cached for its
    /// objects); turning it on caches from then on (after the user's first
    /// flush, under writethrough-until-flush).
    pub(crate) fn with_source(
        cfg: CacheConfig,
        source: Option<ConfigSource>,
        send: SendOp,
        one_data_op: bool,
        image: &str,
        object_prefix: &str,
        object_bytes: u64,
    ) -> Arc<WriteCache> {
        let active = cfg.writeback && !cfg.writethrough_until_flush;
        let spawn_ticker = cfg.writeback || source.is_some();
        let cache = Arc::new(WriteCache {
            state: Mutex::new(State {
                cfg,
                active,
                next_seq: 1,
                ..State::default()
            }),
            source,
            changed: Notify::new(),
            send,
            one_data_op,
            image: image.to_string(),
            object_prefix: object_prefix.to_string(),
            object_bytes,
        });
        if spawn_ticker {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(age_writeback(Arc::downgrade(&cache)));
            }
        }
        cache
    }

    /// Takes the settings `source` gives now, if they changed.
    fn reload(&self) {
        let Some(new) = self.source.as_ref().and_then(|f| f()) else {
            return;
        };
        let mut s = self.lock();
        if s.cfg == new {
            return;
        }
        tracing::info!(image = %self.image, "write cache settings changed: {new:?}");
        s.active = new.writeback && (!new.writethrough_until_flush || s.user_flushed);
        s.cfg = new;
        drop(s);
        // Writers waiting for space may fit under a new limit.
        self.changed.notify_waiters();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn config(&self) -> CacheConfig {
        self.lock().cfg.clone()
    }

    /// Whether writes are cached now (false: they go straight to the OSDs
    /// and are durable when acknowledged).
    pub(crate) fn is_active(&self) -> bool {
        self.lock().active
    }

    /// Treats the user as one that flushes (what Ceph's `rbd` tool does
    /// for its own commands): write-back from now on, if the policy is.
    pub(crate) fn assume_flushing_user(&self) {
        let mut s = self.lock();
        s.user_flushed = true;
        if s.cfg.writeback {
            s.active = true;
        }
    }

    /// Whether anything of `objno` is cached (dirty or being written back).
    pub(crate) fn holds(&self, objno: u64) -> bool {
        self.lock().objects.contains_key(&objno)
    }

    fn error(&self, detail: &str) -> RbdError {
        RbdError::WriteBack {
            image: self.image.clone(),
            detail: detail.to_string(),
        }
    }

    /// Fails with the sticky write-back error, if there is one.
    pub(crate) fn check(&self) -> Result<(), RbdError> {
        match &self.lock().error {
            Some(e) => Err(self.error(e)),
            None => Ok(()),
        }
    }

    /// Caches a write of `data` at `offset` of object `objno` (waiting
    /// while the cache is full). Returns its sequence number.
    pub(crate) async fn write(
        self: &Arc<Self>,
        objno: u64,
        offset: u64,
        data: Bytes,
    ) -> Result<u64, RbdError> {
        let len = data.len() as u64;
        let mut data = Some(data);
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let starts = {
                let mut s = self.lock();
                if let Some(e) = &s.error {
                    return Err(self.error(e));
                }
                let held = s.dirty_bytes + s.in_flight_bytes;
                if held == 0 || held + len <= s.cfg.max_dirty_bytes {
                    let seq = s.next_seq;
                    s.next_seq += 1;
                    let data = data.take().unwrap_or_default();
                    self.insert(&mut s, objno, offset, data, seq);
                    let starts = self.pick(&mut s, Some(objno), Instant::now());
                    drop(s);
                    self.start(starts);
                    return Ok(seq);
                }
                // Full: make sure write-back is under way, then wait.
                self.pick(&mut s, None, Instant::now())
            };
            self.start(starts);
            notified.await;
        }
    }

    /// Puts `data` into object `objno`'s dirty extents, replacing what it
    /// overlaps.
    fn insert(&self, s: &mut State, objno: u64, offset: u64, data: Bytes, seq: u64) {
        let end = offset + data.len() as u64;
        let st = &mut *s;
        let o = st.objects.entry(objno).or_default();
        let was_clean = o.dirty.is_empty();
        let mut min_seq = seq;
        let overlapping: Vec<u64> = o
            .dirty
            .range(..end)
            .rev()
            .take_while(|(start, e)| *start + e.data.len() as u64 > offset)
            .map(|(start, _)| *start)
            .collect();
        for start in overlapping {
            let Some(old) = o.dirty.remove(&start) else {
                continue;
            };
            let old_end = start + old.data.len() as u64;
            o.dirty_bytes -= old.data.len() as u64;
            st.dirty_bytes -= old.data.len() as u64;
            min_seq = min_seq.min(old.min_seq);
            if start < offset {
                let keep = old.data.slice(..(offset - start) as usize);
                o.dirty_bytes += keep.len() as u64;
                st.dirty_bytes += keep.len() as u64;
                o.dirty.insert(
                    start,
                    Extent {
                        data: keep,
                        min_seq: old.min_seq,
                    },
                );
            }
            if old_end > end {
                let keep = old.data.slice((end - start) as usize..);
                o.dirty_bytes += keep.len() as u64;
                st.dirty_bytes += keep.len() as u64;
                o.dirty.insert(
                    end,
                    Extent {
                        data: keep,
                        min_seq: old.min_seq,
                    },
                );
            }
        }
        if was_clean {
            o.first_seq = seq;
            o.dirty_since = Some(Instant::now());
            if o.in_flight.is_none() {
                st.idle_dirty.insert((seq, objno));
            }
        }
        o.dirty_bytes += data.len() as u64;
        st.dirty_bytes += data.len() as u64;
        o.dirty.insert(offset, Extent { data, min_seq });
    }

    /// The write-back ops to start now: objects a flush waits for, whole
    /// dirty objects (`touched`), then the oldest while dirty bytes are
    /// over the target or older than the age limit.
    fn pick(&self, s: &mut State, touched: Option<u64>, now: Instant) -> Vec<Start> {
        let mut starts = Vec::new();
        if let Some(objno) = touched {
            let whole = s.objects.get(&objno).is_some_and(|o| {
                o.in_flight.is_none()
                    && (o.dirty_bytes >= self.object_bytes || o.urgent_seq >= o.first_seq)
            });
            if whole && s.in_flight_ops < MAX_WRITEBACK_OPS {
                starts.extend(self.take(s, objno));
            }
        }
        while s.in_flight_ops < MAX_WRITEBACK_OPS {
            let Some(&(first_seq, objno)) = s.idle_dirty.first() else {
                break;
            };
            let aged = s
                .objects
                .get(&objno)
                .and_then(|o| o.dirty_since)
                .is_some_and(|t| now.saturating_duration_since(t) >= s.cfg.max_dirty_age);
            let over = s.dirty_bytes > s.cfg.target_dirty_bytes.min(s.cfg.max_dirty_bytes);
            if !(first_seq <= s.urgent_seq || over || aged) {
                break;
            }
            match self.take(s, objno) {
                Some(st) => starts.push(st),
                None => break,
            }
        }
        starts
    }

    /// Moves object `objno`'s dirty extents (as many as one op carries)
    /// in flight and returns the op. None if it has nothing to send or an
    /// op in flight.
    fn take(&self, s: &mut State, objno: u64) -> Option<Start> {
        let st = &mut *s;
        let o = st.objects.get_mut(&objno)?;
        if o.in_flight.is_some() || o.dirty.is_empty() {
            return None;
        }
        st.idle_dirty.remove(&(o.first_seq, objno));
        let mut runs: Vec<Vec<(u64, Bytes)>> = Vec::new();
        let mut bytes = 0u64;
        let mut min_seq = u64::MAX;
        let mut taken = Vec::new();
        for (&off, e) in &o.dirty {
            let len = e.data.len() as u64;
            let joins = runs
                .last()
                .and_then(|r| r.last())
                .is_some_and(|(lo, ld)| lo + ld.len() as u64 == off);
            if !taken.is_empty()
                && (bytes + len > MAX_COMBINED_BYTES
                    || (!joins && (self.one_data_op || runs.len() >= MAX_COMBINED_WRITES)))
            {
                break;
            }
            if joins {
                if let Some(r) = runs.last_mut() {
                    r.push((off, e.data.clone()));
                }
            } else {
                runs.push(vec![(off, e.data.clone())]);
            }
            bytes += len;
            min_seq = min_seq.min(e.min_seq);
            taken.push(off);
        }
        for off in &taken {
            o.dirty.remove(off);
        }
        o.dirty_bytes -= bytes;
        st.dirty_bytes -= bytes;
        st.in_flight_bytes += bytes;
        st.in_flight_ops += 1;
        let mut ops = Vec::with_capacity(runs.len());
        let mut pieces = Vec::with_capacity(runs.len());
        for run in runs {
            let start = run[0].0;
            let data = if run.len() == 1 {
                run[0].1.clone()
            } else {
                let total: usize = run.iter().map(|(_, d)| d.len()).sum();
                let mut buf = BytesMut::with_capacity(total);
                for (_, d) in &run {
                    buf.extend_from_slice(d);
                }
                buf.freeze()
            };
            pieces.push((start, data.clone()));
            ops.push(SubOp::Write {
                offset: start,
                data,
            });
        }
        o.in_flight = Some(InFlight {
            pieces,
            bytes,
            min_seq,
        });
        // What is left keeps its age and goes when this op returns.
        if o.dirty.is_empty() {
            o.dirty_since = None;
        }
        Some((objno, ops))
    }

    /// Sends the ops (each in its own task) and records their outcome.
    fn start(self: &Arc<Self>, starts: Vec<Start>) {
        for (objno, ops) in starts {
            let cache = self.clone();
            let fut = (self.send)(objno, ops);
            tokio::spawn(async move {
                let r = fut.await;
                cache.complete(objno, r);
            });
        }
    }

    /// An op came back: its data is durable (or the error sticks), the
    /// object may go again.
    fn complete(self: &Arc<Self>, objno: u64, r: Result<(), ClientError>) {
        let starts = {
            let mut s = self.lock();
            let st = &mut *s;
            if let Some(o) = st.objects.get_mut(&objno) {
                if let Some(f) = o.in_flight.take() {
                    st.in_flight_bytes -= f.bytes;
                    st.in_flight_ops -= 1;
                    if let Err(e) = &r {
                        let msg = format!(
                            "writing back {} bytes to data object {}.{objno:016x} failed: {e}",
                            f.bytes, self.object_prefix
                        );
                        tracing::error!(image = %self.image, "{msg}");
                        st.error.get_or_insert(msg);
                    }
                }
                if o.is_empty() {
                    st.objects.remove(&objno);
                } else if !o.dirty.is_empty() {
                    st.idle_dirty.insert((o.first_seq, objno));
                }
            }
            let mut starts = Vec::new();
            let urgent = s
                .objects
                .get(&objno)
                .is_some_and(|o| !o.dirty.is_empty() && o.urgent_seq >= o.first_seq);
            if urgent && s.in_flight_ops < MAX_WRITEBACK_OPS {
                starts.extend(self.take(&mut s, objno));
            }
            starts.extend(self.pick(&mut s, None, Instant::now()));
            starts
        };
        self.start(starts);
        self.changed.notify_waiters();
    }

    /// Whether anything (in `objno`, or anywhere) up to sequence number
    /// `upto` is still dirty or in flight.
    fn pending(s: &State, objno: Option<u64>, upto: u64) -> bool {
        let obj_pending = |o: &Obj| {
            o.in_flight.as_ref().is_some_and(|f| f.min_seq <= upto)
                || (!o.dirty.is_empty() && o.first_seq <= upto)
        };
        match objno {
            Some(n) => s.objects.get(&n).is_some_and(obj_pending),
            None => s.objects.values().any(obj_pending),
        }
    }

    /// Waits until every write to `objno` (or to every object, for None)
    /// acknowledged so far is durable. The first flush of a
    /// writethrough-until-flush cache turns write-back on.
    async fn wait_durable(self: &Arc<Self>, objno: Option<u64>) -> Result<(), RbdError> {
        let upto = {
            let mut s = self.lock();
            let upto = s.next_seq - 1;
            match objno {
                Some(n) => {
                    if let Some(o) = s.objects.get_mut(&n) {
                        o.urgent_seq = o.urgent_seq.max(upto);
                    }
                }
                None => s.urgent_seq = s.urgent_seq.max(upto),
            }
            upto
        };
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let starts = {
                let mut s = self.lock();
                if let Some(e) = &s.error {
                    return Err(self.error(e));
                }
                if !Self::pending(&s, objno, upto) {
                    return Ok(());
                }
                let mut starts: Vec<Start> = match objno {
                    Some(n) if s.in_flight_ops < MAX_WRITEBACK_OPS => {
                        self.take(&mut s, n).into_iter().collect()
                    }
                    _ => Vec::new(),
                };
                starts.extend(self.pick(&mut s, None, Instant::now()));
                starts
            };
            self.start(starts);
            notified.await;
        }
    }

    /// Flush: every write acknowledged before this call is durable on
    /// every acting replica when it returns Ok; fails with the sticky
    /// write-back error if any write-back failed since the image was
    /// opened. Does not count as the user's flush (close, disconnect,
    /// snapshot, resize): a writethrough-until-flush cache stays
    /// write-through.
    pub(crate) async fn flush_all(self: &Arc<Self>) -> Result<(), RbdError> {
        self.wait_durable(None).await
    }

    /// The user's flush (NBD FLUSH, fsync): [`WriteCache::flush_all`], and
    /// it turns write-back on when the cache waits for the first one (as
    /// librbd does only for flushes whose source is the user).
    pub(crate) async fn flush_user(self: &Arc<Self>) -> Result<(), RbdError> {
        let r = self.wait_durable(None).await;
        let mut s = self.lock();
        s.user_flushed = true;
        if s.cfg.writeback {
            s.active = true;
        }
        r
    }

    /// Makes the cached writes to `objno` durable (FUA; before a discard
    /// or zeroing of the object goes to the OSDs).
    pub(crate) async fn flush_object(self: &Arc<Self>, objno: u64) -> Result<(), RbdError> {
        self.wait_durable(Some(objno)).await
    }

    /// The cached data overlapping `[offset, offset+len)` of `objno`, in
    /// the order to lay it over the OSDs' data (in flight first, then
    /// dirty), clipped to the range; offsets relative to `offset`.
    ///
    /// Fails with the sticky write-back error once a write-back failed:
    /// the data of the failed op is gone from the cache and never reached
    /// the OSDs, so what they hold there is older than what was
    /// acknowledged, and a read must not hand it out as current. (Checked
    /// under the same lock as the snapshot: a read that got its pieces
    /// before the failure returns the acknowledged data it saw.)
    pub(crate) fn overlay(
        &self,
        objno: u64,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(u64, Bytes)>, RbdError> {
        let s = self.lock();
        if let Some(e) = &s.error {
            return Err(self.error(e));
        }
        let Some(o) = s.objects.get(&objno) else {
            return Ok(Vec::new());
        };
        let end = offset + len;
        let clip = |start: u64, d: &Bytes| -> Option<(u64, Bytes)> {
            let d_end = start + d.len() as u64;
            if d_end <= offset || start >= end {
                return None;
            }
            let from = offset.max(start);
            let to = end.min(d_end);
            Some((
                from - offset,
                d.slice((from - start) as usize..(to - start) as usize),
            ))
        };
        let mut out = Vec::new();
        if let Some(f) = &o.in_flight {
            out.extend(f.pieces.iter().filter_map(|(st, d)| clip(*st, d)));
        }
        out.extend(
            o.dirty
                .range(..end)
                .rev()
                .take_while(|(st, e)| *st + e.data.len() as u64 > offset)
                .filter_map(|(st, e)| clip(*st, &e.data)),
        );
        Ok(out)
    }

    /// Bytes held (dirty, in flight).
    #[cfg(test)]
    fn held(&self) -> (u64, u64) {
        let s = self.lock();
        (s.dirty_bytes, s.in_flight_bytes)
    }
}

/// Whether `pieces` (relative offsets) cover `[0, len)` completely.
pub(crate) fn covers(pieces: &[(u64, Bytes)], len: u64) -> bool {
    let mut spans: Vec<(u64, u64)> = pieces
        .iter()
        .map(|(o, d)| (*o, *o + d.len() as u64))
        .collect();
    spans.sort_unstable();
    let mut reached = 0;
    for (s, e) in spans {
        if s > reached {
            return false;
        }
        reached = reached.max(e);
    }
    reached >= len
}

/// Writes back data older than the age limit and takes changed settings;
/// ends with the cache.
async fn age_writeback(cache: Weak<WriteCache>) {
    let mut last_reload = Instant::now();
    loop {
        let tick = match cache.upgrade() {
            Some(c) => {
                (c.lock().cfg.max_dirty_age / 2).clamp(Duration::from_millis(10), AGE_TICK_MAX)
            }
            None => return,
        };
        tokio::time::sleep(tick).await;
        let Some(c) = cache.upgrade() else { return };
        if last_reload.elapsed() >= CONFIG_TICK {
            last_reload = Instant::now();
            c.reload();
        }
        let starts = {
            let mut s = c.lock();
            c.pick(&mut s, None, Instant::now())
        };
        c.start(starts);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use tokio::sync::Semaphore;

    /// An in-memory object store behind a gate: each op waits for a permit
    /// (the test decides when ops land), then applies its writes, or fails.
    #[derive(Default)]
    struct Fake {
        objects: Mutex<HashMap<u64, Vec<u8>>>,
        ops: Mutex<Vec<(u64, Vec<SubOp>)>>,
        gate: Option<Semaphore>,
        fail: AtomicBool,
        in_flight: AtomicUsize,
        max_in_flight_per_object: Mutex<HashMap<u64, usize>>,
    }

    impl Fake {
        fn open() -> Arc<Fake> {
            Arc::new(Fake::default())
        }
        fn gated() -> Arc<Fake> {
            Arc::new(Fake {
                gate: Some(Semaphore::new(0)),
                ..Fake::default()
            })
        }
        fn send(self: &Arc<Self>) -> SendOp {
            let f = self.clone();
            Arc::new(move |objno, ops| {
                let f = f.clone();
                Box::pin(async move {
                    f.in_flight.fetch_add(1, Ordering::SeqCst);
                    {
                        let mut m = f.max_in_flight_per_object.lock().unwrap();
                        let n = m.entry(objno).or_default();
                        *n += 1;
                        assert_eq!(*n, 1, "two ops in flight on object {objno}");
                    }
                    if let Some(g) = &f.gate {
                        g.acquire().await.unwrap().forget();
                    }
                    f.max_in_flight_per_object
                        .lock()
                        .unwrap()
                        .entry(objno)
                        .and_modify(|n| *n -= 1);
                    f.in_flight.fetch_sub(1, Ordering::SeqCst);
                    if f.fail.load(Ordering::SeqCst) {
                        return Err(ClientError::Protocol("disk on fire".into()));
                    }
                    f.ops.lock().unwrap().push((objno, ops.clone()));
                    let mut objs = f.objects.lock().unwrap();
                    let obj = objs.entry(objno).or_default();
                    for op in ops {
                        if let SubOp::Write { offset, data } = op {
                            let end = offset as usize + data.len();
                            if obj.len() < end {
                                obj.resize(end, 0);
                            }
                            obj[offset as usize..end].copy_from_slice(&data);
                        }
                    }
                    Ok(())
                })
            })
        }
        fn object(&self, objno: u64) -> Vec<u8> {
            self.objects
                .lock()
                .unwrap()
                .get(&objno)
                .cloned()
                .unwrap_or_default()
        }
        fn open_gate(&self, n: usize) {
            if let Some(g) = &self.gate {
                g.add_permits(n);
            }
        }
    }

    fn cfg(max_dirty: u64, target: u64, age: Duration) -> CacheConfig {
        CacheConfig {
            writeback: true,
            writethrough_until_flush: false,
            max_dirty_bytes: max_dirty,
            target_dirty_bytes: target,
            max_dirty_age: age,
        }
    }

    /// A cache that writes back only when asked (flush, FUA, full).
    fn lazy(f: &Arc<Fake>, one_data_op: bool) -> Arc<WriteCache> {
        WriteCache::new(
            cfg(1 << 30, 1 << 30, Duration::from_secs(3600)),
            f.send(),
            one_data_op,
            "img",
            "rbd_data.1",
            4 << 20,
        )
    }

    async fn settle() {
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn contiguous_writes_merge_into_one_op_and_a_flush_makes_them_durable() {
        let f = Fake::open();
        let c = lazy(&f, false);
        for i in 0..64u64 {
            c.write(3, i * 4096, Bytes::from(vec![i as u8; 4096]))
                .await
                .unwrap();
        }
        assert!(
            f.ops.lock().unwrap().is_empty(),
            "nothing goes before a flush"
        );
        assert_eq!(c.held(), (64 * 4096, 0));
        c.flush_all().await.unwrap();
        let ops = f.ops.lock().unwrap().clone();
        assert_eq!(ops.len(), 1, "one op for the object");
        assert_eq!(ops[0].1.len(), 1, "one joined write");
        let obj = f.object(3);
        for i in 0..64usize {
            assert!(obj[i * 4096..(i + 1) * 4096].iter().all(|b| *b == i as u8));
        }
        assert_eq!(c.held(), (0, 0));
    }

    #[tokio::test]
    async fn an_erasure_coded_pool_gets_one_contiguous_run_per_op() {
        let f = Fake::open();
        let c = lazy(&f, true);
        for off in [0u64, 4, 100, 104] {
            c.write(1, off, Bytes::from_static(b"abcd")).await.unwrap();
        }
        c.flush_all().await.unwrap();
        let ops: Vec<_> = f.ops.lock().unwrap().iter().map(|(_, o)| o.len()).collect();
        assert_eq!(ops, vec![1, 1]);
        assert_eq!(&f.object(1)[..8], b"abcdabcd");
        assert_eq!(&f.object(1)[100..108], b"abcdabcd");
    }

    #[tokio::test]
    async fn later_overlapping_writes_win_in_reads_and_on_disk() {
        let f = Fake::open();
        let c = lazy(&f, false);
        c.write(0, 0, Bytes::from(vec![1u8; 100])).await.unwrap();
        c.write(0, 10, Bytes::from(vec![2u8; 20])).await.unwrap();
        c.write(0, 25, Bytes::from(vec![3u8; 10])).await.unwrap();
        let mut view = vec![0u8; 100];
        for (rel, d) in c.overlay(0, 0, 100).unwrap() {
            view[rel as usize..rel as usize + d.len()].copy_from_slice(&d);
        }
        let mut want = vec![1u8; 100];
        want[10..25].fill(2);
        want[25..35].fill(3);
        assert_eq!(view, want);
        assert!(covers(&c.overlay(0, 0, 100).unwrap(), 100));
        assert!(!covers(&c.overlay(0, 0, 101).unwrap(), 101));
        c.flush_all().await.unwrap();
        assert_eq!(f.object(0), want);
    }

    #[tokio::test]
    async fn reads_see_data_while_it_is_written_back() {
        let f = Fake::gated();
        let c = lazy(&f, false);
        c.write(5, 0, Bytes::from_static(b"old!")).await.unwrap();
        let c2 = c.clone();
        let flush = tokio::spawn(async move { c2.flush_all().await });
        settle().await;
        assert_eq!(c.held(), (0, 4), "in flight");
        // Written while the first op is in flight: dirty over in-flight.
        c.write(5, 2, Bytes::from_static(b"NEW")).await.unwrap();
        let mut view = vec![0u8; 5];
        for (rel, d) in c.overlay(5, 0, 5).unwrap() {
            view[rel as usize..rel as usize + d.len()].copy_from_slice(&d);
        }
        assert_eq!(&view, b"olNEW");
        assert!(!flush.is_finished(), "a flush waits for the op in flight");
        f.open_gate(1);
        flush.await.unwrap().unwrap();
        assert_eq!(&f.object(5), b"old!");
        f.open_gate(100);
        c.flush_all().await.unwrap();
        assert_eq!(&f.object(5), b"olNEW");
    }

    #[tokio::test]
    async fn a_flush_waits_for_an_overwritten_write() {
        // Write A, then B over all of A: B's extent inherits A's sequence
        // number, so a flush taken between them still waits for it.
        let f = Fake::gated();
        let c = lazy(&f, false);
        c.write(0, 0, Bytes::from_static(b"AAAA")).await.unwrap();
        c.write(0, 0, Bytes::from_static(b"BBBB")).await.unwrap();
        let c2 = c.clone();
        let flush = tokio::spawn(async move { c2.flush_all().await });
        settle().await;
        assert!(!flush.is_finished());
        f.open_gate(10);
        flush.await.unwrap().unwrap();
        assert_eq!(&f.object(0), b"BBBB");
    }

    #[tokio::test]
    async fn fua_waits_for_its_object_only() {
        let f = Fake::open();
        let c = lazy(&f, false);
        c.write(1, 0, Bytes::from_static(b"one")).await.unwrap();
        c.write(2, 0, Bytes::from_static(b"two")).await.unwrap();
        c.flush_object(2).await.unwrap();
        assert_eq!(&f.object(2), b"two");
        assert!(f.object(1).is_empty(), "object 1 stays cached");
        assert_eq!(c.held(), (3, 0));
    }

    #[tokio::test]
    async fn a_write_back_error_sticks_and_names_the_object() {
        let f = Fake::open();
        f.fail.store(true, Ordering::SeqCst);
        let c = lazy(&f, false);
        c.write(0x2a, 0, Bytes::from_static(b"lost")).await.unwrap();
        let e = c.flush_all().await.unwrap_err().to_string();
        assert!(e.contains("rbd_data.1.000000000000002a"), "{e}");
        assert!(e.contains("disk on fire"), "{e}");
        f.fail.store(false, Ordering::SeqCst);
        // Every later write and flush fails, even though the disk healed.
        assert!(c.write(0, 0, Bytes::from_static(b"x")).await.is_err());
        assert!(c.flush_all().await.is_err());
        assert!(c.check().is_err());
    }

    #[tokio::test]
    async fn writers_wait_while_the_cache_is_full() {
        let f = Fake::gated();
        // 8 KiB may be held; above 4 KiB the oldest goes.
        let c = WriteCache::new(
            cfg(8192, 4096, Duration::from_secs(3600)),
            f.send(),
            false,
            "img",
            "rbd_data.1",
            4 << 20,
        );
        c.write(0, 0, Bytes::from(vec![1u8; 4096])).await.unwrap();
        c.write(1, 0, Bytes::from(vec![2u8; 4096])).await.unwrap();
        let c2 = c.clone();
        let third = tokio::spawn(async move { c2.write(2, 0, Bytes::from(vec![3u8; 4096])).await });
        settle().await;
        assert!(!third.is_finished(), "the third write waits for space");
        let (dirty, in_flight) = c.held();
        assert!(dirty + in_flight <= 8192);
        assert!(in_flight > 0, "write-back started under pressure");
        f.open_gate(100);
        third.await.unwrap().unwrap();
        c.flush_all().await.unwrap();
        assert_eq!(f.object(2), vec![3u8; 4096]);
    }

    #[tokio::test]
    async fn old_dirty_data_is_written_back_without_a_flush() {
        let f = Fake::open();
        let c = WriteCache::new(
            cfg(1 << 30, 1 << 30, Duration::from_millis(20)),
            f.send(),
            false,
            "img",
            "rbd_data.1",
            4 << 20,
        );
        c.write(9, 0, Bytes::from_static(b"aged")).await.unwrap();
        let t0 = Instant::now();
        while f.object(9).is_empty() {
            assert!(t0.elapsed() < Duration::from_secs(30), "never written back");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(&f.object(9), b"aged");
    }

    #[tokio::test]
    async fn a_whole_dirty_object_goes_at_once() {
        let f = Fake::open();
        let c = WriteCache::new(
            cfg(1 << 30, 1 << 30, Duration::from_secs(3600)),
            f.send(),
            false,
            "img",
            "rbd_data.1",
            8192,
        );
        c.write(4, 0, Bytes::from(vec![7u8; 4096])).await.unwrap();
        settle().await;
        assert!(f.ops.lock().unwrap().is_empty());
        c.write(4, 4096, Bytes::from(vec![8u8; 4096]))
            .await
            .unwrap();
        settle().await;
        assert_eq!(f.ops.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn writethrough_until_flush_turns_write_back_on_at_the_first_user_flush() {
        let f = Fake::open();
        let mut conf = cfg(1 << 20, 1 << 19, Duration::from_secs(1));
        conf.writethrough_until_flush = true;
        let c = WriteCache::new(conf.clone(), f.send(), false, "img", "p", 4 << 20);
        assert!(!c.is_active());
        // Flushes of our own (close, disconnect, snapshot) do not say the
        // user flushes.
        c.flush_all().await.unwrap();
        assert!(!c.is_active());
        c.flush_user().await.unwrap();
        assert!(c.is_active());
        // Policy write-through never turns it on.
        conf.writeback = false;
        let c = WriteCache::new(conf, f.send(), false, "img", "p", 4 << 20);
        c.flush_user().await.unwrap();
        c.assume_flushing_user();
        assert!(!c.is_active());
    }

    #[tokio::test]
    async fn settings_changed_while_open_apply() {
        let f = Fake::gated();
        let shared = Arc::new(Mutex::new(cfg(8192, 8192, Duration::from_secs(3600))));
        let src = shared.clone();
        let source: ConfigSource = Box::new(move || Some(src.lock().unwrap().clone()));
        let c = WriteCache::with_source(
            shared.lock().unwrap().clone(),
            Some(source),
            f.send(),
            false,
            "img",
            "rbd_data.1",
            4 << 20,
        );
        assert!(c.is_active());
        c.write(0, 0, Bytes::from(vec![1u8; 8192])).await.unwrap();
        // Full at 8 KiB: the next writer waits ...
        let c2 = c.clone();
        let waiter =
            tokio::spawn(async move { c2.write(1, 0, Bytes::from(vec![2u8; 4096])).await });
        settle().await;
        assert!(!waiter.is_finished());
        // ... until a larger limit is read.
        shared.lock().unwrap().max_dirty_bytes = 1 << 20;
        c.reload();
        tokio::time::timeout(Duration::from_secs(30), waiter)
            .await
            .expect("a raised limit lets the writer in")
            .unwrap()
            .unwrap();
        assert_eq!(c.config().max_dirty_bytes, 1 << 20);
        // Write-back turned off: new writes are not cached any more; what
        // is cached stays visible and is written back by a flush.
        shared.lock().unwrap().writeback = false;
        c.reload();
        assert!(!c.is_active());
        assert!(c.holds(0) && c.holds(1) && !c.holds(2));
        f.open_gate(100);
        c.flush_object(0).await.unwrap();
        assert!(!c.holds(0));
        c.flush_all().await.unwrap();
        assert_eq!(f.object(1), vec![2u8; 4096]);
        // And on again.
        shared.lock().unwrap().writeback = true;
        c.reload();
        assert!(c.is_active());
    }

    #[tokio::test]
    async fn reads_fail_once_a_write_back_failed() {
        // The failed op's data left the cache without reaching the OSDs:
        // a read must not return the OSDs' older data as current.
        let f = Fake::gated();
        let c = lazy(&f, false);
        c.write(1, 0, Bytes::from_static(b"new!")).await.unwrap();
        let c2 = c.clone();
        let flush = tokio::spawn(async move { c2.flush_all().await });
        settle().await;
        // A read taken while the op is in flight sees the acknowledged data.
        let seen = c.overlay(1, 0, 4).unwrap();
        assert_eq!(seen, vec![(0, Bytes::from_static(b"new!"))]);
        f.fail.store(true, Ordering::SeqCst);
        f.open_gate(100);
        assert!(flush.await.unwrap().is_err());
        let e = c.overlay(1, 0, 4).unwrap_err().to_string();
        assert!(e.contains("rbd_data.1.0000000000000001"), "{e}");
        // Every read fails, also of objects whose write-back did not.
        assert!(c.overlay(7, 0, 4).is_err());
    }

    #[test]
    fn the_config_comes_from_the_central_config() {
        let mon = cairn_map::MonInfo {
            name: "a".into(),
            addr: "127.0.0.1:1".into(),
            rank: 0,
        };
        let admin = cairn_map::AuthEntity::new(&[7; 32], &[("mon", "allow *")]);
        let mut map = cairn_map::ClusterMap::new_cluster("fsid", mon, admin);
        let c = CacheConfig::from_map(&map, "client.admin").unwrap();
        assert_eq!(c, CacheConfig::default());
        map.config.insert(
            ("client".into(), "rbd_cache_policy".into()),
            "writethrough".into(),
        );
        map.config.insert(
            ("client.admin".into(), "rbd_cache_max_dirty".into()),
            "1048576".into(),
        );
        let c = CacheConfig::from_map(&map, "client.admin").unwrap();
        assert!(!c.writeback);
        assert_eq!(c.max_dirty_bytes, 1 << 20);
        assert_eq!(c.target_dirty_bytes, 1 << 20, "target never above max");
        map.config.insert(
            ("client".into(), "rbd_cache_policy".into()),
            "sometimes".into(),
        );
        let e = CacheConfig::from_map(&map, "client.admin")
            .unwrap_err()
            .to_string();
        assert!(e.contains("rbd_cache_policy"), "{e}");
    }
}
