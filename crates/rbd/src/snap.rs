//! Image snapshots and clones over the OSDs' object snapshots: creating a
//! snapshot (through the lock holder when the image is open, so that it is
//! a point in time of the holder's writes), listing, removing (and trimming
//! the clones it kept), protecting, rolling back; cloning a protected
//! snapshot into a copy-on-write child and flattening it. Does not own the
//! object-level clone-on-write (the OSD does) nor id allocation (the
//! monitors do: the caller passes an id from `PoolSnapAllocate`).
//!
//! Taking a snapshot of an open image: the taker adds omap key
//! `snapreq.<id>` = name to the header object; the lock holder polls its
//! header every [`SNAP_POLL_INTERVAL`], and on a request blocks new writes,
//! waits for those in flight, records the snapshot in the header, installs
//! the new snapshot context and lets writes go again. The taker returns
//! once the header lists the snapshot. Every write acknowledged before
//! that is in the snapshot; every write issued after it is not.

use crate::error::RbdError;
use crate::header::*;
use crate::image::{Image, Rbd, Writer, MAX_PARALLEL_OBJECT_OPS};
use bytes::Bytes;
use cairn_client::{ClientError, IoCtx};
use cairn_ops::{OpError, SubOp, SubOpOutput};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::task::JoinSet;

/// How often an open image looks for snapshot requests and header changes.
pub const SNAP_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How long taking a snapshot of an open image waits for its lock holder.
pub const SNAP_REQUEST_TIMEOUT: Duration = Duration::from_secs(20);
/// Header omap key prefix of snapshot requests.
const SNAP_REQUEST_PREFIX: &str = "snapreq.";
/// Most header compare-and-swap attempts before giving up.
const HEADER_CAS_ATTEMPTS: u32 = 64;
/// Longest snapshot name.
pub const MAX_SNAP_NAME_BYTES: usize = 255;

fn validate_snap_name(name: &str) -> Result<(), RbdError> {
    if name.is_empty()
        || name.len() > MAX_SNAP_NAME_BYTES
        || name.contains('/')
        || name.contains('@')
    {
        return Err(RbdError::Invalid(format!(
            "snapshot name '{name}' must be 1..={MAX_SNAP_NAME_BYTES} bytes without '/' or '@'"
        )));
    }
    Ok(())
}

/// Reads the header of image `id` with its object version.
async fn header_with_version(
    meta: &IoCtx,
    name: &str,
    id: &str,
) -> Result<(ImageHeader, cairn_ops::Version), RbdError> {
    let r = match meta
        .operate(&header_object(id), vec![SubOp::OmapGetHeader])
        .await
    {
        Ok(r) => r,
        Err(e) if e.is_not_found() => return Err(RbdError::NotFound(name.to_string())),
        Err(e) => return Err(e.into()),
    };
    let raw = match r.outputs.into_iter().next() {
        Some(SubOpOutput::Data(d)) => d,
        o => {
            return Err(RbdError::BadHeader {
                image: name.to_string(),
                reason: format!("header read answered {o:?}"),
            })
        }
    };
    let h = ImageHeader::decode(&raw).map_err(|reason| RbdError::BadHeader {
        image: name.to_string(),
        reason,
    })?;
    Ok((h, r.version))
}

/// Read-modify-writes the header of image `id` with compare-and-swap on
/// the header object's version (retrying when someone else changed it).
/// Returns the header as written.
pub(crate) async fn update_header(
    meta: &IoCtx,
    name: &str,
    id: &str,
    mut change: impl FnMut(&mut ImageHeader) -> Result<(), RbdError>,
) -> Result<ImageHeader, RbdError> {
    update_header_and(meta, name, id, |h| change(h).map(|_| Vec::new())).await
}

/// Like [`update_header`]; `change` also returns omap keys of the header
/// object to remove in the same op.
async fn update_header_and(
    meta: &IoCtx,
    name: &str,
    id: &str,
    mut change: impl FnMut(&mut ImageHeader) -> Result<Vec<Vec<u8>>, RbdError>,
) -> Result<ImageHeader, RbdError> {
    for _ in 0..HEADER_CAS_ATTEMPTS {
        let (mut h, version) = header_with_version(meta, name, id).await?;
        let rm = change(&mut h)?;
        let mut ops = vec![
            SubOp::AssertVersion { version },
            SubOp::OmapSetHeader {
                header: Bytes::from(h.encode()),
            },
        ];
        if !rm.is_empty() {
            ops.push(SubOp::OmapRm {
                keys: rm.into_iter().map(Bytes::from).collect(),
            });
        }
        match meta.operate(&header_object(id), ops).await {
            Ok(_) => return Ok(h),
            Err(e) if matches!(e.op_error(), Some(OpError::VersionMismatch { .. })) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(RbdError::Invalid(format!(
        "image '{name}': the header kept changing under {HEADER_CAS_ATTEMPTS} update attempts"
    )))
}

/// Pending snapshot requests on a header: (omap key, snap id, name).
async fn pending_requests(
    meta: &IoCtx,
    id: &str,
) -> Result<Vec<(Vec<u8>, u64, String)>, ClientError> {
    let (entries, _) = meta
        .omap_list(&header_object(id), Some(b"snapreq"), 64)
        .await?;
    Ok(entries
        .into_iter()
        .filter_map(|(k, v)| {
            let key = std::str::from_utf8(&k).ok()?;
            let snap = u64::from_str_radix(key.strip_prefix(SNAP_REQUEST_PREFIX)?, 16).ok()?;
            Some((k.clone(), snap, String::from_utf8(v).ok()?))
        })
        .collect())
}

/// The lock holder's side: runs while the image is open for writing
/// (exits when the image is dropped or closed).
pub(crate) async fn watch_snap_requests(writer: Weak<Writer>) {
    loop {
        tokio::time::sleep(SNAP_POLL_INTERVAL).await;
        let Some(w) = writer.upgrade() else { return };
        if let Err(e) = poll_once(&w).await {
            tracing::warn!(image = %w.image, error = %e, "checking for snapshot requests failed");
        }
    }
}

async fn poll_once(w: &Writer) -> Result<(), RbdError> {
    let reqs = pending_requests(&w.meta, &w.id).await?;
    if reqs.is_empty() {
        // Adopt removals made by others (a smaller context is safe at any time).
        let (h, _) = header_with_version(&w.meta, &w.image, &w.id).await?;
        let mut mine = w.header.lock().await;
        if h.snapshots != mine.snapshots && h.snap_seq == mine.snap_seq {
            w.adopt(&h);
            mine.snapshots = h.snapshots;
        }
        return Ok(());
    }
    // Block new writes, wait for the ones in flight and write back the
    // cache, so the snapshot holds every write acknowledged before it.
    let _gate = w.gate.write().await;
    w.cache.flush_all().await?;
    let mut mine = w.header.lock().await;
    let size = w.size_bytes.load(std::sync::atomic::Ordering::Acquire);
    let h = update_header_and(&w.meta, &w.image, &w.id, |h| {
        let mut done = Vec::new();
        for (key, snap, name) in &reqs {
            if h.snapshots.iter().all(|s| s.id != *snap && s.name != *name) {
                h.snapshots.push(SnapInfo {
                    id: *snap,
                    name: name.clone(),
                    size_bytes: size,
                    protected: false,
                    children: Vec::new(),
                });
                h.snapshots.sort_by_key(|s| s.id);
                h.snap_seq = h.snap_seq.max(*snap);
            }
            done.push(key.clone());
        }
        Ok(done)
    })
    .await?;
    w.adopt(&h);
    *mine = h;
    Ok(())
}

impl Rbd {
    /// Snapshots of image `name`, oldest first.
    pub async fn snap_list(&self, name: &str) -> Result<Vec<SnapInfo>, RbdError> {
        Ok(self.info(name).await?.snapshots)
    }

    /// Takes snapshot `snap` (id `snap_id`, allocated by the monitors for
    /// the image's data pool) of image `name`. If a client has the image
    /// open, that client takes it (see the module comment); otherwise it is
    /// taken here under the image's lock.
    pub async fn snap_create(&self, name: &str, snap: &str, snap_id: u64) -> Result<(), RbdError> {
        validate_snap_name(snap)?;
        let id = self.image_id(name).await?;
        let header = self.read_header(name, &id).await?;
        if header.snap(snap).is_some() {
            return Err(RbdError::SnapExists {
                image: name.to_string(),
                snap: snap.to_string(),
            });
        }
        if snap_id <= header.snap_seq {
            return Err(RbdError::Invalid(format!(
                "snapshot id {snap_id} is not newer than image '{name}''s snap seq {}",
                header.snap_seq
            )));
        }
        let deadline = tokio::time::Instant::now() + SNAP_REQUEST_TIMEOUT;
        loop {
            match self.read_lock(name, &id).await? {
                None => match self.open(name, "client.snap-create", false).await {
                    Ok(img) => {
                        let r = img.take_snapshot_locked(snap, snap_id).await;
                        let closed = img.close().await;
                        r?;
                        return closed;
                    }
                    // Someone opened it meanwhile: ask them.
                    Err(RbdError::Locked { .. }) => continue,
                    Err(e) => return Err(e),
                },
                Some(holder) => {
                    match self.request_snapshot(name, &id, snap, snap_id, deadline).await? {
                        true => return Ok(()),
                        false if tokio::time::Instant::now() >= deadline => {
                            return Err(RbdError::Invalid(format!(
                                "image '{name}' is open by {} which did not take snapshot '{snap}' within {}s; \
                                 if that client is gone, break its lock with 'cairn rbd lock break'",
                                holder.owner,
                                SNAP_REQUEST_TIMEOUT.as_secs()
                            )))
                        }
                        // The holder closed the image: take it here.
                        false => continue,
                    }
                }
            }
        }
    }

    /// Asks the lock holder for a snapshot; true once the header lists it,
    /// false if the lock went away or the deadline passed (request withdrawn).
    async fn request_snapshot(
        &self,
        name: &str,
        id: &str,
        snap: &str,
        snap_id: u64,
        deadline: tokio::time::Instant,
    ) -> Result<bool, RbdError> {
        let key = format!("{SNAP_REQUEST_PREFIX}{snap_id:016x}").into_bytes();
        self.meta_io()
            .omap_set(
                &header_object(id),
                vec![(key.clone(), snap.as_bytes().to_vec())],
            )
            .await?;
        let listed = |h: &ImageHeader| h.snapshots.iter().any(|s| s.id == snap_id);
        loop {
            tokio::time::sleep(SNAP_POLL_INTERVAL / 2).await;
            let h = self.read_header(name, id).await?;
            if listed(&h) {
                return Ok(true);
            }
            let gone = self.read_lock(name, id).await?.is_none();
            if gone || tokio::time::Instant::now() >= deadline {
                self.meta_io()
                    .omap_rm_keys(&header_object(id), vec![key.clone()])
                    .await?;
                // It may have been taken just before the withdrawal.
                return Ok(listed(&self.read_header(name, id).await?));
            }
        }
    }

    /// Removes snapshot `snap` (refused while protected), then trims the
    /// object clones only it needed (at most MAX_PARALLEL_OBJECT_OPS
    /// objects at a time).
    pub async fn snap_remove(&self, name: &str, snap: &str) -> Result<(), RbdError> {
        let id = self.image_id(name).await?;
        let h = update_header(self.meta_io(), name, &id, |h| {
            let s = h.snap(snap).ok_or_else(|| RbdError::SnapNotFound {
                image: name.to_string(),
                snap: snap.to_string(),
            })?;
            if s.protected {
                return Err(RbdError::SnapProtected {
                    image: name.to_string(),
                    snap: snap.to_string(),
                });
            }
            h.snapshots.retain(|s| s.name != snap);
            Ok(())
        })
        .await?;
        self.trim(&h).await
    }

    /// Removes every unprotected snapshot; returns how many.
    pub async fn snap_purge(&self, name: &str) -> Result<usize, RbdError> {
        let id = self.image_id(name).await?;
        let mut n = 0;
        let h = update_header(self.meta_io(), name, &id, |h| {
            let before = h.snapshots.len();
            h.snapshots.retain(|s| s.protected);
            n = before - h.snapshots.len();
            Ok(())
        })
        .await?;
        self.trim(&h).await?;
        if !h.snapshots.is_empty() {
            return Err(RbdError::SnapProtected {
                image: name.to_string(),
                snap: h
                    .snapshots
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        Ok(n)
    }

    /// Applies the header's snapshot context to every data object, removing
    /// clones no snapshot needs any more.
    async fn trim(&self, h: &ImageHeader) -> Result<(), RbdError> {
        let io = self
            .rados()
            .ioctx(&h.data_pool)?
            .with_snap_context(h.snap_context());
        // Objects past the current end may still have clones of larger snapshots.
        let objects = h
            .snapshots
            .iter()
            .map(|s| s.size_bytes)
            .chain(std::iter::once(h.size_bytes))
            .max()
            .unwrap_or(0)
            .div_ceil(h.object_size_bytes);
        // A removed snapshot may have been the largest: scan a generous range.
        let objects = objects.max(h.object_count());
        let id = h.id.clone();
        for_each_object(objects, |objno| {
            let io = io.clone();
            let oid = data_object(&id, objno);
            async move {
                match io.snap_trim(&oid).await {
                    Ok(()) => Ok(()),
                    Err(e) if e.is_not_found() => Ok(()),
                    Err(e) => Err(e.into()),
                }
            }
        })
        .await
    }

    /// Protects or unprotects snapshot `snap`. Unprotecting is refused
    /// while clones of it exist.
    pub async fn snap_set_protected(
        &self,
        name: &str,
        snap: &str,
        protected: bool,
    ) -> Result<(), RbdError> {
        let id = self.image_id(name).await?;
        update_header(self.meta_io(), name, &id, |h| {
            let s = h
                .snapshots
                .iter_mut()
                .find(|s| s.name == snap)
                .ok_or_else(|| RbdError::SnapNotFound {
                    image: name.to_string(),
                    snap: snap.to_string(),
                })?;
            if !protected && !s.children.is_empty() {
                return Err(RbdError::SnapHasChildren {
                    image: name.to_string(),
                    snap: snap.to_string(),
                    children: s.children.clone(),
                });
            }
            s.protected = protected;
            Ok(())
        })
        .await?;
        Ok(())
    }

    /// Rolls image `name` back to snapshot `snap`: every object becomes
    /// what it was in the snapshot (newer snapshots keep their content),
    /// and the size becomes the snapshot's. Takes the image's lock, so it
    /// is refused while a client has the image open.
    pub async fn snap_rollback(
        &self,
        name: &str,
        snap: &str,
        progress: crate::transfer::Progress<'_>,
    ) -> Result<(), RbdError> {
        let img = self.open(name, "client.snap-rollback", false).await?;
        let r = img.rollback_to(snap, progress).await;
        let closed = img.close().await;
        r?;
        closed
    }

    /// Makes image `child` (in `child_rbd`'s pool) a copy-on-write clone of
    /// protected snapshot `snap` of image `parent`: same size and object
    /// size, data in `data_pool` (default: the parent's data pool).
    pub async fn clone_image(
        &self,
        parent: &str,
        snap: &str,
        child_rbd: &Rbd,
        child: &str,
        data_pool: Option<&str>,
    ) -> Result<ImageHeader, RbdError> {
        let pid = self.image_id(parent).await?;
        let ph = self.read_header(parent, &pid).await?;
        let s = ph
            .snap(snap)
            .cloned()
            .ok_or_else(|| RbdError::SnapNotFound {
                image: parent.to_string(),
                snap: snap.to_string(),
            })?;
        if !s.protected {
            return Err(RbdError::SnapNotProtected {
                image: parent.to_string(),
                snap: snap.to_string(),
            });
        }
        let data_pool = data_pool.unwrap_or(&ph.data_pool).to_string();
        crate::image::check_data_pool(child_rbd.rados(), &data_pool)?;
        let header = ImageHeader {
            name: child.to_string(),
            id: format!("{:016x}", rand::random::<u64>()),
            size_bytes: s.size_bytes,
            object_size_bytes: ph.object_size_bytes,
            features: ph.features,
            data_pool,
            snapshots: Vec::new(),
            snap_seq: 0,
            parent: Some(ParentSpec {
                pool: self.pool_name().to_string(),
                image: parent.to_string(),
                image_id: pid.clone(),
                data_pool: ph.data_pool.clone(),
                snap_id: s.id,
                snap_name: s.name.clone(),
                overlap_bytes: s.size_bytes,
            }),
        };
        let child_spec = format!("{}/{child}", child_rbd.pool_name());
        // Record the child first, so the parent snapshot can never be
        // unprotected while a child exists; undo if the create fails.
        update_header(self.meta_io(), parent, &pid, |h| {
            let s = h
                .snapshots
                .iter_mut()
                .find(|x| x.id == s.id && x.protected)
                .ok_or_else(|| RbdError::SnapNotProtected {
                    image: parent.to_string(),
                    snap: snap.to_string(),
                })?;
            if !s.children.contains(&child_spec) {
                s.children.push(child_spec.clone());
            }
            Ok(())
        })
        .await?;
        match child_rbd.create_with_header(child, header).await {
            Ok(h) => Ok(h),
            Err(e) => {
                let spec = header_parent_spec(self.pool_name(), parent, &pid, s.id);
                let _ = self.detach_child_at(&spec, &child_spec).await;
                Err(e)
            }
        }
    }

    /// Copies into clone `name` every object it still reads from its
    /// parent, then cuts it loose from the parent.
    pub async fn flatten(
        &self,
        name: &str,
        progress: crate::transfer::Progress<'_>,
    ) -> Result<(), RbdError> {
        let img = self.open(name, "client.flatten", false).await?;
        let r = img.copy_up_all(progress).await;
        let r = match r {
            Ok(Some(parent)) => {
                let id = self.image_id(name).await?;
                let cut = update_header(self.meta_io(), name, &id, |h| {
                    h.parent = None;
                    Ok(())
                })
                .await;
                match cut {
                    Ok(_) => self.detach_child(&parent, name).await,
                    Err(e) => Err(e),
                }
            }
            Ok(None) => Err(RbdError::Invalid(format!(
                "image '{name}' is not a clone: there is nothing to flatten"
            ))),
            Err(e) => Err(e),
        };
        let closed = img.close().await;
        r?;
        closed
    }

    /// Removes `child` (an image of this pool) from its parent snapshot's
    /// children.
    pub(crate) async fn detach_child(
        &self,
        parent: &ParentSpec,
        child: &str,
    ) -> Result<(), RbdError> {
        self.detach_child_at(parent, &format!("{}/{child}", self.pool_name()))
            .await
    }

    async fn detach_child_at(&self, parent: &ParentSpec, child_spec: &str) -> Result<(), RbdError> {
        let prbd = Rbd::new(self.rados(), &parent.pool)?;
        let r = update_header(prbd.meta_io(), &parent.image, &parent.image_id, |h| {
            for s in h.snapshots.iter_mut().filter(|s| s.id == parent.snap_id) {
                s.children.retain(|c| c != child_spec);
            }
            Ok(())
        })
        .await;
        match r {
            Ok(_) | Err(RbdError::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn header_parent_spec(pool: &str, image: &str, id: &str, snap_id: u64) -> ParentSpec {
    ParentSpec {
        pool: pool.to_string(),
        image: image.to_string(),
        image_id: id.to_string(),
        data_pool: String::new(),
        snap_id,
        snap_name: String::new(),
        overlap_bytes: 0,
    }
}

/// Runs `f(objno)` for objno in 0..n, at most MAX_PARALLEL_OBJECT_OPS at a time.
async fn for_each_object<F, Fut>(n: u64, f: F) -> Result<(), RbdError>
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = Result<(), RbdError>> + Send + 'static,
{
    let mut set = JoinSet::new();
    let mut first = None;
    for objno in 0..n {
        if set.len() >= MAX_PARALLEL_OBJECT_OPS {
            if let Some(Ok(Err(e))) = set.join_next().await {
                first.get_or_insert(e);
            }
        }
        if first.is_some() {
            break;
        }
        set.spawn(f(objno));
    }
    while let Some(done) = set.join_next().await {
        match done {
            Ok(Err(e)) => {
                first.get_or_insert(e);
            }
            Err(e) => {
                first.get_or_insert(RbdError::Invalid(format!("task failed: {e}")));
            }
            Ok(Ok(())) => {}
        }
    }
    first.map_or(Ok(()), Err)
}

impl Image {
    /// Takes a snapshot while holding the lock (no other writer exists).
    async fn take_snapshot_locked(&self, snap: &str, snap_id: u64) -> Result<(), RbdError> {
        let w = &self.writer;
        let _gate = w.gate.write().await;
        w.cache.flush_all().await?;
        let mut mine = w.header.lock().await;
        let size = self.size_bytes();
        let h = update_header(&w.meta, &w.image, &w.id, |h| {
            if h.snap(snap).is_some() {
                return Err(RbdError::SnapExists {
                    image: w.image.clone(),
                    snap: snap.to_string(),
                });
            }
            h.snapshots.push(SnapInfo {
                id: snap_id,
                name: snap.to_string(),
                size_bytes: size,
                protected: false,
                children: Vec::new(),
            });
            h.snapshots.sort_by_key(|s| s.id);
            h.snap_seq = h.snap_seq.max(snap_id);
            Ok(())
        })
        .await?;
        w.adopt(&h);
        *mine = h;
        Ok(())
    }

    async fn rollback_to(
        &self,
        snap: &str,
        progress: crate::transfer::Progress<'_>,
    ) -> Result<(), RbdError> {
        let h = self.writer.header.lock().await.clone();
        let s = h
            .snap(snap)
            .cloned()
            .ok_or_else(|| RbdError::SnapNotFound {
                image: self.name().to_string(),
                snap: snap.to_string(),
            })?;
        if s.size_bytes != self.size_bytes() {
            self.resize(s.size_bytes).await?;
        }
        let _gate = self.writer.gate.read().await;
        // No cached write may land on top of the rolled-back data.
        self.writer.cache.flush_all().await?;
        let wio = self.writer.io();
        let at = self.writer.data.at_snap(s.id);
        let objects = s.size_bytes.div_ceil(self.object_size_bytes());
        let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let id = self.writer.id.clone();
        let total = objects;
        let counter = done.clone();
        let r = for_each_object(objects, move |objno| {
            let (wio, at) = (wio.clone(), at.clone());
            let oid = data_object(&id, objno);
            let counter = counter.clone();
            async move {
                let r = match at.read(&oid, 0, 0).await {
                    Ok(d) => wio.write_full(&oid, d).await.map(|_| ()),
                    Err(e) if e.is_not_found() => match wio.remove(&oid).await {
                        Err(e) if e.is_not_found() => Ok(()),
                        other => other.map(|_| ()),
                    },
                    Err(e) => Err(e),
                };
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                r.map_err(RbdError::from)
            }
        })
        .await;
        progress(
            done.load(std::sync::atomic::Ordering::Relaxed) * self.object_size_bytes(),
            total * self.object_size_bytes(),
        );
        r
    }
}

impl Rbd {
    /// The metadata pool's context.
    pub(crate) fn meta_io(&self) -> &IoCtx {
        self.meta_ctx()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_names_are_checked() {
        assert!(validate_snap_name("daily-1").is_ok());
        assert!(validate_snap_name("").is_err());
        assert!(validate_snap_name("a@b").is_err());
        assert!(validate_snap_name("a/b").is_err());
    }
}
