//! Images: create/list/info/remove/du over the object client, and an open
//! [`Image`] (holding the exclusive lock) that reads, writes, discards and
//! resizes. Owns the object layout; does not own the NBD protocol.
//!
//! Layout in the metadata pool (replicated): `rbd_id.<name>` (data = image
//! id; created exclusively, so a name is reserved atomically),
//! `rbd_header.<id>` (omap header = versioned [`ImageHeader`]),
//! `rbd_lock.<id>` (exists while an opener holds the lock; data = versioned
//! [`LockRecord`]), `rbd_directory` (omap `name_<name>` -> id, for listing).
//! Data objects `rbd_data.<id>.<objno as 16 hex>` live in the data pool and
//! exist only where something was written (thin provisioning).

use crate::cache::{CacheConfig, WriteCache};
use crate::combine::Combiner;
use crate::error::RbdError;
use crate::fence::{BrokenLock, Fenced, Fencer, FENCE_MAP_WAIT};
use crate::header::*;
use bytes::{Bytes, BytesMut};
use cairn_client::{ClientError, IoCtx, Rados};
use cairn_ops::{OpError, SubOp};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// Object ops one image operation (du, remove, a large I/O) runs at once.
pub const MAX_PARALLEL_OBJECT_OPS: usize = 32;
/// Writes (pieces inside one object) smaller than this go through the
/// per-object combiner ([`crate::combine`]); larger ones are sent as their
/// own op at once. Measured (bench/README.md, rbd section): combining
/// 4 KiB sequential writes cut the daemon's CPU per write ~5× and raised
/// their rate 3–5×, while combining 1 MiB sequential writes into 2–3 MiB
/// ops made them no faster and cost the daemon more CPU per GiB.
pub const COMBINE_BELOW_BYTES: u64 = 128 << 10;
/// Writes of at least this many bytes go around the write cache even in
/// write-back mode: straight to the OSDs as their own ops (after what the
/// cache holds of their objects), acknowledged once durable. Measured
/// (bench/README.md, "rbd bench 1 MiB writes (session 13)"): `rbd bench`
/// 1 MiB sequential writes ran 9-114 % faster this way (7 pairs) than
/// joined by the cache into 4 MiB ops (no 4 MiB copy per object, client
/// CPU per GiB -27..30 %, the daemon's -7..10 %).
pub const WRITE_AROUND_MIN_BYTES: u64 = 1 << 20;
/// Longest image name.
pub const MAX_NAME_BYTES: usize = 255;

/// Options for [`Rbd::create`].
#[derive(Debug, Clone)]
pub struct CreateOptions {
    pub size_bytes: u64,
    /// Power of two between 4 KiB and 32 MiB; default 4 MiB.
    pub object_size_bytes: Option<u64>,
    /// Pool for data objects; default: the metadata pool.
    pub data_pool: Option<String>,
}

/// Space an image uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskUsage {
    pub provisioned_bytes: u64,
    pub used_bytes: u64,
    pub objects: u64,
}

/// Images in one metadata pool.
#[derive(Clone)]
pub struct Rbd {
    rados: Rados,
    meta: IoCtx,
    /// Blocklists the holder of a lock this handle breaks.
    fencer: Option<Arc<dyn Fencer>>,
}

/// Fails early, with a clear error, if `pool` cannot hold image data: it
/// does not exist, or it is erasure-coded without `allow_ec_overwrites`
/// (image writes are partial overwrites, which such a pool refuses).
pub(crate) fn check_data_pool(rados: &Rados, pool: &str) -> Result<(), RbdError> {
    rados.ioctx(pool)?;
    let map = rados.map();
    if let Some(p) = map.pool_named(pool) {
        if p.kind == cairn_map::PoolKind::Erasure && !p.allow_ec_overwrites {
            return Err(RbdError::Invalid(format!(
                "pool '{pool}' is erasure-coded without allow_ec_overwrites, and image data needs \
                 partial overwrites: run `cairn osd pool set {pool} allow_ec_overwrites true` first"
            )));
        }
    }
    Ok(())
}

fn id_object(name: &str) -> String {
    format!("rbd_id.{name}")
}

fn is_noent(e: &ClientError) -> bool {
    e.is_not_found()
}

fn validate_name(name: &str) -> Result<(), RbdError> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES || name.contains('/') || name.contains('@') {
        return Err(RbdError::Invalid(format!(
            "image name '{name}' must be 1..={MAX_NAME_BYTES} bytes without '/' or '@'"
        )));
    }
    Ok(())
}

/// Runs `f(i)` for i in 0..n with at most MAX_PARALLEL_OBJECT_OPS at once
/// and folds the results into `acc` as they finish (memory stays bounded
/// however many objects an image has).
async fn for_each_bounded<T, A, F, Fut>(
    n: u64,
    f: F,
    mut acc: A,
    fold: impl Fn(&mut A, T),
) -> Result<A, RbdError>
where
    T: Send + 'static,
    F: Fn(u64) -> Fut,
    Fut: Future<Output = Result<T, RbdError>> + Send + 'static,
{
    let sem = Arc::new(Semaphore::new(MAX_PARALLEL_OBJECT_OPS));
    let mut set = JoinSet::new();
    let joined = |r: Result<Result<T, RbdError>, tokio::task::JoinError>| {
        r.map_err(|e| RbdError::Invalid(format!("task failed: {e}")))?
    };
    for i in 0..n {
        let permit = sem
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| RbdError::Invalid(e.to_string()))?;
        let fut = f(i);
        set.spawn(async move {
            let r = fut.await;
            drop(permit);
            r
        });
        while let Some(done) = set.try_join_next() {
            fold(&mut acc, joined(done)?);
        }
    }
    while let Some(done) = set.join_next().await {
        fold(&mut acc, joined(done)?);
    }
    Ok(acc)
}

impl Rbd {
    /// Images whose headers live in `pool` (a replicated pool).
    pub fn new(rados: &Rados, pool: &str) -> Result<Rbd, RbdError> {
        Ok(Rbd {
            rados: rados.clone(),
            meta: rados.ioctx(pool)?,
            fencer: None,
        })
    }

    /// This handle with a way to blocklist clients: needed to break a lock
    /// held by another client instance ([`Rbd::break_lock`], `open` with
    /// `break_lock`).
    pub fn with_fencer(mut self, fencer: Arc<dyn Fencer>) -> Rbd {
        self.fencer = Some(fencer);
        self
    }

    /// The object client this handle uses.
    pub fn rados(&self) -> &Rados {
        &self.rados
    }

    /// The metadata pool's context.
    pub(crate) fn meta_ctx(&self) -> &IoCtx {
        &self.meta
    }

    /// The metadata pool's name.
    pub fn pool_name(&self) -> &str {
        self.meta.pool_name()
    }

    pub async fn create(&self, name: &str, opts: &CreateOptions) -> Result<ImageHeader, RbdError> {
        validate_name(name)?;
        let os = opts.object_size_bytes.unwrap_or(DEFAULT_OBJECT_BYTES);
        if !os.is_power_of_two() || !(MIN_OBJECT_BYTES..=MAX_OBJECT_BYTES).contains(&os) {
            return Err(RbdError::Invalid(format!(
                "object size {os} must be a power of two between {MIN_OBJECT_BYTES} and {MAX_OBJECT_BYTES} bytes"
            )));
        }
        if opts.size_bytes == 0 {
            return Err(RbdError::Invalid(
                "image size must be greater than 0".into(),
            ));
        }
        let data_pool = opts
            .data_pool
            .clone()
            .unwrap_or_else(|| self.meta.pool_name().to_string());
        check_data_pool(&self.rados, &data_pool)?;
        let id = format!("{:016x}", rand::random::<u64>());
        let header = ImageHeader {
            name: name.to_string(),
            id: id.clone(),
            size_bytes: opts.size_bytes,
            object_size_bytes: os,
            features: FEATURE_EXCLUSIVE_LOCK,
            data_pool,
            snapshots: Vec::new(),
            snap_seq: 0,
            parent: None,
        };
        self.create_with_header(name, header).await
    }

    /// Reserves `name` and writes `header` (create and clone).
    pub(crate) async fn create_with_header(
        &self,
        name: &str,
        header: ImageHeader,
    ) -> Result<ImageHeader, RbdError> {
        let id = header.id.clone();
        let reserve = vec![
            SubOp::Create { exclusive: true },
            SubOp::WriteFull {
                data: Bytes::from(id.clone().into_bytes()),
            },
        ];
        match self.meta.operate(&id_object(name), reserve).await {
            Ok(_) => {}
            Err(e) if matches!(e.op_error(), Some(OpError::Exists)) => {
                return Err(RbdError::Exists(name.to_string()))
            }
            Err(e) => return Err(e.into()),
        }
        let write_header = vec![
            SubOp::Create { exclusive: true },
            SubOp::OmapSetHeader {
                header: Bytes::from(header.encode()),
            },
        ];
        self.meta.operate(&header_object(&id), write_header).await?;
        self.meta
            .omap_set(
                DIRECTORY_OBJECT,
                vec![
                    (format!("name_{name}").into_bytes(), id.clone().into_bytes()),
                    (format!("id_{id}").into_bytes(), name.as_bytes().to_vec()),
                ],
            )
            .await?;
        Ok(header)
    }

    pub(crate) async fn image_id(&self, name: &str) -> Result<String, RbdError> {
        validate_name(name)?;
        match self.meta.read(&id_object(name), 0, 0).await {
            Ok(d) => String::from_utf8(d).map_err(|_| RbdError::BadHeader {
                image: name.to_string(),
                reason: "id object is not UTF-8".into(),
            }),
            Err(e) if is_noent(&e) => Err(RbdError::NotFound(name.to_string())),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn info(&self, name: &str) -> Result<ImageHeader, RbdError> {
        let id = self.image_id(name).await?;
        self.read_header(name, &id).await
    }

    pub(crate) async fn read_header(&self, name: &str, id: &str) -> Result<ImageHeader, RbdError> {
        let raw = match self.meta.omap_get_header(&header_object(id)).await {
            Ok(r) => r,
            Err(e) if is_noent(&e) => return Err(RbdError::NotFound(name.to_string())),
            Err(e) => return Err(e.into()),
        };
        ImageHeader::decode(&raw).map_err(|reason| RbdError::BadHeader {
            image: name.to_string(),
            reason,
        })
    }

    /// Image names, sorted.
    pub async fn list(&self) -> Result<Vec<String>, RbdError> {
        let mut names = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let (entries, more) = match self
                .meta
                .omap_list(DIRECTORY_OBJECT, after.as_deref(), 1000)
                .await
            {
                Ok(r) => r,
                Err(e) if is_noent(&e) => return Ok(names),
                Err(e) => return Err(e.into()),
            };
            for (k, _) in &entries {
                if let Some(n) = k.strip_prefix(b"name_") {
                    names.push(String::from_utf8_lossy(n).to_string());
                }
            }
            after = entries.last().map(|(k, _)| k.clone());
            if !more || after.is_none() {
                names.sort();
                return Ok(names);
            }
        }
    }

    /// Who holds the image's lock, if anyone.
    pub async fn lock_status(&self, name: &str) -> Result<Option<LockRecord>, RbdError> {
        let id = self.image_id(name).await?;
        self.read_lock(name, &id).await
    }

    pub(crate) async fn read_lock(
        &self,
        name: &str,
        id: &str,
    ) -> Result<Option<LockRecord>, RbdError> {
        Ok(self.read_lock_raw(name, id).await?.map(|(l, _)| l))
    }

    /// The lock record and its bytes as stored (what a compare-and-remove
    /// must match).
    async fn read_lock_raw(
        &self,
        name: &str,
        id: &str,
    ) -> Result<Option<(LockRecord, Vec<u8>)>, RbdError> {
        match self.meta.read(&lock_object(id), 0, 0).await {
            Ok(d) => LockRecord::decode(&d)
                .map(|l| Some((l, d)))
                .map_err(|reason| RbdError::BadHeader {
                    image: name.to_string(),
                    reason,
                }),
            Err(e) if is_noent(&e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes the lock record if it is still exactly `raw`; false if it
    /// is gone or someone else's now.
    async fn remove_lock_if(&self, id: &str, raw: &[u8]) -> Result<bool, RbdError> {
        let ops = vec![
            SubOp::CmpExt {
                offset: 0,
                expected: Bytes::copy_from_slice(raw),
            },
            SubOp::Remove,
        ];
        match self.meta.operate(&lock_object(id), ops).await {
            Ok(_) => Ok(true),
            Err(e) if is_noent(&e) || matches!(e.op_error(), Some(OpError::CmpMismatch { .. })) => {
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Blocklists the holder of `holder` (unless it is this very client
    /// instance) and waits until this handle's map lists it, so every op
    /// sent from here on carries the blocklisting epoch.
    async fn fence_holder(&self, name: &str, holder: &LockRecord) -> Result<Fenced, RbdError> {
        let Some(client) = holder.instance() else {
            if holder.client.is_empty() {
                tracing::warn!(
                    image = name,
                    owner = holder.owner,
                    "the lock record predates client instances: its holder cannot be blocklisted"
                );
                return Ok(Fenced::Unknown);
            }
            return Err(RbdError::BadHeader {
                image: name.to_string(),
                reason: format!(
                    "the lock record names '{}', which is not a client instance",
                    holder.client
                ),
            });
        };
        if client == self.rados.instance() {
            return Ok(Fenced::OwnInstance);
        }
        let fencer = self.fencer.as_ref().ok_or_else(|| {
            RbdError::Invalid(format!(
                "image '{name}' is locked by {} ({client}); breaking the lock needs a way to blocklist that client and none was given (Rbd::with_fencer); the lock was not broken",
                holder.owner
            ))
        })?;
        let epoch = fencer.blocklist(&client).await.map_err(|e| {
            RbdError::Invalid(format!(
                "could not blocklist {client}, the holder of image '{name}''s lock, so the lock was not broken: {e}"
            ))
        })?;
        self.rados.wait_for_epoch(epoch, FENCE_MAP_WAIT).await?;
        tracing::warn!(image = name, %client, epoch = epoch.0, "blocklisted the lock holder");
        Ok(Fenced::Blocklisted { client, epoch })
    }

    /// Breaks the lock whoever holds it: blocklists the holder's client
    /// instance first (through this handle's [`Fencer`]) and waits for the
    /// map that lists it, then removes the record — only if it is still the
    /// one fenced. `None` when the image was not locked.
    pub async fn break_lock(&self, name: &str) -> Result<Option<BrokenLock>, RbdError> {
        let id = self.image_id(name).await?;
        self.break_lock_id(name, &id).await
    }

    async fn break_lock_id(&self, name: &str, id: &str) -> Result<Option<BrokenLock>, RbdError> {
        let Some((holder, raw)) = self.read_lock_raw(name, id).await? else {
            return Ok(None);
        };
        let fenced = self.fence_holder(name, &holder).await?;
        if !self.remove_lock_if(id, &raw).await? {
            if let Some(now) = self.read_lock(name, id).await? {
                return Err(RbdError::Locked {
                    image: name.to_string(),
                    owner: format!(
                        "{} (who took it while {} was fenced)",
                        now.owner, holder.owner
                    ),
                    cookie: now.cookie,
                });
            }
        }
        Ok(Some(BrokenLock { holder, fenced }))
    }

    /// Breaks the lock only if it is still exactly `held` (compare and
    /// remove in one op), so a lock someone took in the meantime stays.
    /// Does not fence: for holders known to be dead (a map helper of this
    /// host that was killed). Returns whether it was removed.
    pub async fn break_lock_if(&self, name: &str, held: &LockRecord) -> Result<bool, RbdError> {
        let id = self.image_id(name).await?;
        match self.read_lock_raw(name, &id).await? {
            Some((now, raw)) if now == *held => self.remove_lock_if(&id, &raw).await,
            _ => Ok(false),
        }
    }

    /// Space used: stats every data object of the image.
    pub async fn du(&self, name: &str) -> Result<DiskUsage, RbdError> {
        let header = self.info(name).await?;
        let data = self.rados.ioctx(&header.data_pool)?;
        let id = header.id.clone();
        let empty = DiskUsage {
            provisioned_bytes: header.size_bytes,
            used_bytes: 0,
            objects: 0,
        };
        let stat = |objno| {
            let data = data.clone();
            let oid = data_object(&id, objno);
            async move {
                match data.stat(&oid).await {
                    Ok(s) => Ok(Some(s.size)),
                    Err(e) if is_noent(&e) => Ok(None),
                    Err(e) => Err(RbdError::from(e)),
                }
            }
        };
        for_each_bounded(header.object_count(), stat, empty, |du, size| {
            if let Some(size) = size {
                du.used_bytes += size;
                du.objects += 1;
            }
        })
        .await
    }

    /// Removes an image and all its data. Refused while it is locked.
    pub async fn remove(&self, name: &str) -> Result<(), RbdError> {
        let id = self.image_id(name).await?;
        if let Some(l) = self.read_lock(name, &id).await? {
            return Err(RbdError::Locked {
                image: name.to_string(),
                owner: l.owner,
                cookie: l.cookie,
            });
        }
        // A create interrupted between reserving the name and writing the
        // header leaves no header and no data: clean up the rest anyway.
        match self.read_header(name, &id).await {
            Ok(header) => {
                if !header.snapshots.is_empty() {
                    return Err(RbdError::HasSnapshots(name.to_string()));
                }
                if let Some(parent) = &header.parent {
                    self.detach_child(parent, name).await?;
                }
                let data = self.rados.ioctx(&header.data_pool)?;
                remove_objects(&data, &id, 0, header.object_count()).await?;
                ignore_noent(self.meta.remove(&header_object(&id)).await)?;
            }
            Err(RbdError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        self.meta
            .omap_rm_keys(
                DIRECTORY_OBJECT,
                vec![
                    format!("name_{name}").into_bytes(),
                    format!("id_{id}").into_bytes(),
                ],
            )
            .await?;
        ignore_noent(self.meta.remove(&id_object(name)).await)?;
        Ok(())
    }

    /// Opens an image for I/O, taking its exclusive lock as `owner`. If
    /// someone else holds it, fails with [`RbdError::Locked`] unless
    /// `break_lock`: then the holder is fenced first (see
    /// [`Rbd::break_lock`]; needs [`Rbd::with_fencer`]).
    pub async fn open(&self, name: &str, owner: &str, break_lock: bool) -> Result<Image, RbdError> {
        let id = self.image_id(name).await?;
        let header = self.read_header(name, &id).await?;
        let record = LockRecord {
            owner: owner.to_string(),
            cookie: format!("{:016x}", rand::random::<u64>()),
            client: self.rados.instance().to_string(),
        };
        let take = || {
            vec![
                SubOp::Create { exclusive: true },
                SubOp::WriteFull {
                    data: Bytes::from(record.encode()),
                },
            ]
        };
        match self.meta.operate(&lock_object(&id), take()).await {
            Ok(_) => {}
            Err(e) if matches!(e.op_error(), Some(OpError::Exists)) => {
                if !break_lock {
                    let h = self.read_lock(name, &id).await?.unwrap_or(LockRecord {
                        owner: "an unknown client".into(),
                        cookie: "?".into(),
                        client: String::new(),
                    });
                    return Err(RbdError::Locked {
                        image: name.to_string(),
                        owner: h.owner,
                        cookie: h.cookie,
                    });
                }
                let broken = self.break_lock_id(name, &id).await?;
                tracing::warn!(image = name, broken = ?broken, "broke the exclusive lock");
                self.meta
                    .operate(&lock_object(&id), take())
                    .await
                    .map_err(|e| {
                        if matches!(e.op_error(), Some(OpError::Exists)) {
                            RbdError::Locked {
                                image: name.to_string(),
                                owner: "a client that took it while we broke it".into(),
                                cookie: "?".into(),
                            }
                        } else {
                            e.into()
                        }
                    })?;
            }
            Err(e) => return Err(e.into()),
        }
        self.make_image(name, id, header, Some(record))
    }

    /// Opens an image for reading only, without taking the lock (writes
    /// fail with [`RbdError::ReadOnly`]). If another client writes at the
    /// same time, reads see its writes as they land. `NAME@SNAP` opens
    /// snapshot SNAP: a point-in-time, read-only view.
    pub async fn open_read_only(&self, name: &str) -> Result<Image, RbdError> {
        let (image, snap) = match name.split_once('@') {
            Some((i, s)) => (i, Some(s)),
            None => (name, None),
        };
        let id = self.image_id(image).await?;
        let header = self.read_header(image, &id).await?;
        let Some(snap) = snap else {
            return self.make_image(name, id, header, None);
        };
        let info = header
            .snap(snap)
            .cloned()
            .ok_or_else(|| RbdError::SnapNotFound {
                image: image.to_string(),
                snap: snap.to_string(),
            })?;
        let mut img = self.make_image(name, id, header, None)?;
        img.data = img.data.at_snap(info.id);
        img.size_bytes = AtomicU64::new(info.size_bytes);
        img.snap_id = Some(info.id);
        if let Some(p) = &mut img.parent {
            p.overlap_bytes = p.overlap_bytes.min(info.size_bytes);
        }
        Ok(img)
    }

    fn make_image(
        &self,
        name: &str,
        id: String,
        header: ImageHeader,
        lock: Option<LockRecord>,
    ) -> Result<Image, RbdError> {
        let data = self.rados.ioctx(&header.data_pool)?;
        let parent = match &header.parent {
            Some(p) => Some(ParentIo {
                io: self.rados.ioctx(&p.data_pool)?.at_snap(p.snap_id),
                image_id: p.image_id.clone(),
                overlap_bytes: p.overlap_bytes,
            }),
            None => None,
        };
        let cache_cfg = if lock.is_some() {
            CacheConfig::from_map(&self.rados.map(), &self.rados.name().to_string())?
        } else {
            CacheConfig::writethrough()
        };
        // A writable image follows changes of its settings while open.
        let cache_source: Option<crate::cache::ConfigSource> = lock.is_some().then(|| {
            let rados = self.rados.clone();
            let image = name.to_string();
            Box::new(move || {
                CacheConfig::from_map(&rados.map(), &rados.name().to_string())
                    .map_err(|e| tracing::debug!(image, "keeping the write cache settings: {e}"))
                    .ok()
            }) as crate::cache::ConfigSource
        });
        let one_data_op = crate::combine::one_data_op(&data, &self.rados);
        let writer = Arc::new_cyclic(|me: &std::sync::Weak<Writer>| {
            let me = me.clone();
            let (oid_id, parent) = (id.clone(), parent.clone());
            let object_bytes = header.object_size_bytes;
            let send: crate::combine::SendOp = Arc::new(move |objno, ops| {
                let Some(w) = me.upgrade() else {
                    return Box::pin(async move {
                        Err(ClientError::Protocol(format!(
                            "write-back to data object {objno:x} after the image was closed"
                        )))
                    });
                };
                // The context current when the op leaves (a snapshot
                // flushes the cache before changing it).
                let io = w.io();
                let oid = data_object(&oid_id, objno);
                let copyup = copyup_source(parent.as_ref(), object_bytes, objno);
                Box::pin(Image::modify_object(io, oid, copyup, ops))
            });
            Writer {
                gate: tokio::sync::RwLock::new(()),
                io: std::sync::RwLock::new(data.with_snap_context(header.snap_context())),
                header: tokio::sync::Mutex::new(header.clone()),
                meta: self.meta.clone(),
                data: data.clone(),
                id: id.clone(),
                image: name.to_string(),
                size_bytes: AtomicU64::new(header.size_bytes),
                cache: WriteCache::with_source(
                    cache_cfg,
                    cache_source,
                    send,
                    one_data_op,
                    name,
                    &format!("rbd_data.{id}"),
                    header.object_size_bytes,
                ),
            }
        });
        if lock.is_some() {
            tokio::spawn(crate::snap::watch_snap_requests(Arc::downgrade(&writer)));
        }
        let combiner = {
            let writer = writer.clone();
            let id = id.clone();
            let parent = parent.clone();
            let object_bytes = header.object_size_bytes;
            let send: crate::combine::SendOp = Arc::new(move |objno, ops| {
                // The context current when the op leaves (a snapshot waits
                // for every write, queued ones too, before changing it).
                let io = writer.io();
                let oid = data_object(&id, objno);
                let copyup = copyup_source(parent.as_ref(), object_bytes, objno);
                Box::pin(Image::modify_object(io, oid, copyup, ops))
            });
            Combiner::new(one_data_op, send)
        };
        Ok(Image {
            name: name.to_string(),
            id,
            object_bytes: header.object_size_bytes,
            size_bytes: AtomicU64::new(header.size_bytes),
            writer,
            data,
            parent,
            snap_id: None,
            lock,
            combiner,
        })
    }
}

/// Where object `objno` of a clone copies up from: (parent data context,
/// parent object, bytes the parent backs), or None when no parent backs it.
fn copyup_source(
    parent: Option<&ParentIo>,
    object_bytes: u64,
    objno: u64,
) -> Option<(IoCtx, String, u64)> {
    let p = parent?;
    let n = p
        .overlap_bytes
        .saturating_sub(objno * object_bytes)
        .min(object_bytes);
    (n > 0).then(|| (p.io.clone(), data_object(&p.image_id, objno), n))
}

/// A clone's view of its parent: the parent's data objects at the
/// snapshot, for reads of unwritten objects and copy-up.
#[derive(Clone)]
pub(crate) struct ParentIo {
    pub io: IoCtx,
    pub image_id: String,
    pub overlap_bytes: u64,
}

/// What a writable image shares with its snapshot-request watcher: the I/O
/// gate (writes hold it shared; taking a snapshot holds it exclusively, so
/// the snapshot sees exactly the writes acknowledged before it), the data
/// context carrying the current snapshot context, and the header.
pub(crate) struct Writer {
    pub gate: tokio::sync::RwLock<()>,
    pub io: std::sync::RwLock<IoCtx>,
    pub header: tokio::sync::Mutex<ImageHeader>,
    pub meta: IoCtx,
    pub data: IoCtx,
    pub id: String,
    pub image: String,
    pub size_bytes: AtomicU64,
    /// The client write cache (write-through for read-only handles).
    pub(crate) cache: Arc<WriteCache>,
}

impl Writer {
    /// The data context writes use now.
    pub fn io(&self) -> IoCtx {
        match self.io.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Installs the snapshot context of `header`.
    pub fn adopt(&self, header: &ImageHeader) {
        let io = self.data.with_snap_context(header.snap_context());
        match self.io.write() {
            Ok(mut g) => *g = io,
            Err(p) => *p.into_inner() = io,
        }
    }
}

fn ignore_noent<T>(r: Result<T, ClientError>) -> Result<(), RbdError> {
    match r {
        Ok(_) => Ok(()),
        Err(e) if is_noent(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn remove_objects(data: &IoCtx, id: &str, from: u64, to: u64) -> Result<(), RbdError> {
    let remove = |i| {
        let data = data.clone();
        let oid = data_object(id, from + i);
        async move { ignore_noent(data.remove(&oid).await) }
    };
    for_each_bounded(to.saturating_sub(from), remove, (), |_, ()| {}).await
}

/// An open image holding the exclusive lock. Call [`Image::close`] to
/// release the lock; dropping without closing leaves it held (like a crash).
pub struct Image {
    name: String,
    id: String,
    object_bytes: u64,
    size_bytes: AtomicU64,
    /// Shared with the snapshot-request watcher (writable images).
    pub(crate) writer: Arc<Writer>,
    /// Reads (at the snapshot, for a snapshot handle).
    data: IoCtx,
    /// Set for a clone whose parent still backs part of it.
    parent: Option<ParentIo>,
    /// The snapshot this handle reads (None = the live image).
    snap_id: Option<u64>,
    /// `None` for a read-only handle.
    lock: Option<LockRecord>,
    /// Per-object write queues: one write op per object in flight, the
    /// writes that wait for it combined into the next.
    combiner: Arc<Combiner>,
}

impl Image {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes.load(Ordering::Acquire)
    }
    pub fn object_size_bytes(&self) -> u64 {
        self.object_bytes
    }
    /// The lock this handle holds (`None` when opened read-only).
    pub fn lock_record(&self) -> Option<&LockRecord> {
        self.lock.as_ref()
    }

    pub fn is_read_only(&self) -> bool {
        self.lock.is_none()
    }

    fn check_writable(&self) -> Result<(), RbdError> {
        if self.lock.is_none() {
            return Err(RbdError::ReadOnly(self.name.clone()));
        }
        Ok(())
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), RbdError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size_bytes() => Ok(()),
            _ => Err(RbdError::Invalid(format!(
                "range {offset}+{len} is beyond the end of image '{}' ({} bytes)",
                self.name,
                self.size_bytes()
            ))),
        }
    }

    /// Reads; unwritten ranges read as zeros. A read inside one object
    /// that comes back whole is handed on as received (no copy); pieces of
    /// reads spanning objects are fetched in parallel and joined. Data in
    /// the write cache (dirty or being written back) is laid over what the
    /// OSDs return; a range the cache covers entirely is not read from them.
    pub async fn read(&self, offset: u64, len: u64) -> Result<Bytes, RbdError> {
        self.check_range(offset, len)?;
        let extents = split(self.object_bytes, offset, len);
        if let [e] = extents[..] {
            let d = self.read_cached_extent(e).await?;
            if d.len() as u64 == len {
                return Ok(d);
            }
            let mut buf = BytesMut::zeroed(len as usize);
            buf[..d.len()].copy_from_slice(&d);
            return Ok(buf.freeze());
        }
        let mut buf = BytesMut::zeroed(len as usize);
        let mut set = JoinSet::new();
        for e in extents {
            // Taken now, before the OSD read is sent (see read_cached_extent).
            let cached = self.writer.cache.overlay(e.objno, e.offset, e.len)?;
            let read = (!crate::cache::covers(&cached, e.len)).then(|| {
                Self::read_extent(
                    self.data.clone(),
                    data_object(&self.id, e.objno),
                    self.parent_extent(e),
                    e,
                )
            });
            set.spawn(async move {
                match read {
                    Some(r) => r.await.map(|d| (e, d, cached)),
                    None => Ok((e, Bytes::new(), cached)),
                }
            });
        }
        while let Some(done) = set.join_next().await {
            let (e, d, cached) =
                done.map_err(|e| RbdError::Invalid(format!("task failed: {e}")))??;
            let n = d.len().min(e.len as usize);
            let at = e.buf_offset as usize;
            buf[at..at + n].copy_from_slice(&d[..n]);
            for (rel, piece) in cached {
                let from = at + rel as usize;
                buf[from..from + piece.len()].copy_from_slice(&piece);
            }
        }
        Ok(buf.freeze())
    }

    /// One object's part of a read with the write cache laid over it. The
    /// cached pieces are taken before the OSD read is sent: data written
    /// back after that is in them, data written back before is in the
    /// OSDs' answer.
    async fn read_cached_extent(&self, e: ObjectExtent) -> Result<Bytes, RbdError> {
        let cached = self.writer.cache.overlay(e.objno, e.offset, e.len)?;
        if cached.is_empty() {
            return Self::read_extent(
                self.data.clone(),
                data_object(&self.id, e.objno),
                self.parent_extent(e),
                e,
            )
            .await;
        }
        let d = if crate::cache::covers(&cached, e.len) {
            Bytes::new()
        } else {
            Self::read_extent(
                self.data.clone(),
                data_object(&self.id, e.objno),
                self.parent_extent(e),
                e,
            )
            .await?
        };
        let mut buf = BytesMut::zeroed(e.len as usize);
        let n = d.len().min(e.len as usize);
        buf[..n].copy_from_slice(&d[..n]);
        for (rel, piece) in cached {
            buf[rel as usize..rel as usize + piece.len()].copy_from_slice(&piece);
        }
        Ok(buf.freeze())
    }

    /// One object's part of a read: its bytes (shorter than asked, even
    /// empty, where the object ends or does not exist), falling back to a
    /// clone's parent for an object the clone has not written.
    async fn read_extent(
        data: IoCtx,
        oid: String,
        parent: Option<(IoCtx, String, u64)>,
        e: ObjectExtent,
    ) -> Result<Bytes, RbdError> {
        let d = match data.read_bytes(&oid, e.offset, e.len).await {
            Ok(d) => d,
            Err(err) if is_noent(&err) => match parent {
                Some((pio, poid, plen)) => match pio.read_bytes(&poid, e.offset, plen).await {
                    Ok(d) => d,
                    Err(err) if is_noent(&err) => Bytes::new(),
                    Err(err) => return Err(err.into()),
                },
                None => Bytes::new(),
            },
            Err(err) => return Err(err.into()),
        };
        Ok(d.slice(..d.len().min(e.len as usize)))
    }

    /// The parent range backing extent `e` of a clone: (parent data
    /// context, parent object, bytes to read), or None.
    fn parent_extent(&self, e: ObjectExtent) -> Option<(IoCtx, String, u64)> {
        let p = self.parent.as_ref()?;
        let start = e.objno * self.object_bytes + e.offset;
        if start >= p.overlap_bytes {
            return None;
        }
        let len = e.len.min(p.overlap_bytes - start);
        Some((p.io.clone(), data_object(&p.image_id, e.objno), len))
    }

    /// Runs `ops` on data object `objno` with the current snapshot
    /// context. On a clone, an object not written yet is first filled from
    /// the parent (copy-up) in the same op, so the parent's data under the
    /// rest of the object stays visible.
    async fn modify_object(
        io: IoCtx,
        oid: String,
        copyup: Option<(IoCtx, String, u64)>,
        ops: Vec<SubOp>,
    ) -> Result<(), ClientError> {
        let Some((pio, poid, plen)) = copyup else {
            return io.operate(&oid, ops).await.map(|_| ());
        };
        let mut guarded = vec![SubOp::AssertExists];
        guarded.extend(ops.iter().cloned());
        match io.operate(&oid, guarded).await {
            Err(e) if is_noent(&e) => {}
            other => return other.map(|_| ()),
        }
        let parent_data = match pio.read(&poid, 0, plen).await {
            Ok(d) => d,
            Err(e) if is_noent(&e) => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut up = vec![SubOp::Create { exclusive: true }];
        match overlay(parent_data, &ops) {
            // One data sub-op (erasure-coded pools take no more per op).
            Ok(data) => {
                if !data.is_empty() {
                    up.push(SubOp::Write {
                        offset: 0,
                        data: Bytes::from(data),
                    });
                }
            }
            Err(parent_data) => {
                if !parent_data.is_empty() {
                    up.push(SubOp::Write {
                        offset: 0,
                        data: Bytes::from(parent_data),
                    });
                }
                up.extend(ops.iter().cloned());
            }
        }
        match io.operate(&oid, up).await {
            // Another write of ours copied it up meanwhile.
            Err(e) if matches!(e.op_error(), Some(OpError::Exists)) => {
                io.operate(&oid, ops).await.map(|_| ())
            }
            other => other.map(|_| ()),
        }
    }

    fn copyup_source(&self, objno: u64) -> Option<(IoCtx, String, u64)> {
        copyup_source(self.parent.as_ref(), self.object_bytes, objno)
    }

    /// Writes. With the write cache in write-back mode (see
    /// [`crate::cache`]) this returns once the data is cached: durable
    /// after the next [`Image::flush`]. Write-through, and writes of
    /// [`WRITE_AROUND_MIN_BYTES`] or more: durable on every acting replica
    /// when this returns.
    pub async fn write(&self, offset: u64, data: Bytes) -> Result<(), RbdError> {
        self.write_fua(offset, data, false).await
    }

    /// Writes; with `fua`, durable on every acting replica when this
    /// returns whatever the cache mode.
    pub async fn write_fua(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), RbdError> {
        self.check_writable()?;
        self.check_range(offset, data.len() as u64)?;
        let _gate = self.writer.gate.read().await;
        let cache = &self.writer.cache;
        if cache.is_active() && (data.len() as u64) < WRITE_AROUND_MIN_BYTES {
            let extents = split(self.object_bytes, offset, data.len() as u64);
            for e in &extents {
                let piece = data.slice(e.buf_offset as usize..(e.buf_offset + e.len) as usize);
                cache.write(e.objno, e.offset, piece).await?;
            }
            if fua {
                for e in &extents {
                    cache.flush_object(e.objno).await?;
                }
            }
            return Ok(());
        }
        cache.check()?;
        let extents = split(self.object_bytes, offset, data.len() as u64);
        for e in &extents {
            // Cached writes of the object land first (write-back was on
            // and was turned off while the image is open).
            if cache.holds(e.objno) {
                cache.flush_object(e.objno).await?;
            }
        }
        if let [e] = extents[..] {
            // The common case (a request inside one object): no task.
            if e.len < COMBINE_BELOW_BYTES {
                return Ok(self.combiner.write(e.objno, e.offset, data).await?);
            }
            let ops = vec![SubOp::Write {
                offset: e.offset,
                data,
            }];
            let oid = data_object(&self.id, e.objno);
            let io = self.writer.io();
            return Ok(Self::modify_object(io, oid, self.copyup_source(e.objno), ops).await?);
        }
        let mut set = JoinSet::new();
        for e in extents {
            let piece = data.slice(e.buf_offset as usize..(e.buf_offset + e.len) as usize);
            if e.len < COMBINE_BELOW_BYTES {
                let combiner = self.combiner.clone();
                set.spawn(async move { combiner.write(e.objno, e.offset, piece).await });
                continue;
            }
            let ops = vec![SubOp::Write {
                offset: e.offset,
                data: piece,
            }];
            set.spawn(Self::modify_object(
                self.writer.io(),
                data_object(&self.id, e.objno),
                self.copyup_source(e.objno),
                ops,
            ));
        }
        join_all(set).await
    }

    /// Discards a range, freeing space: whole objects are removed, a range
    /// reaching an object's end truncates it, others are zeroed in place.
    /// Afterwards the range reads as zeros. Large ranges run at most
    /// MAX_PARALLEL_OBJECT_OPS object ops at a time.
    pub async fn discard(&self, offset: u64, len: u64) -> Result<(), RbdError> {
        self.check_writable()?;
        self.check_range(offset, len)?;
        let size = self.size_bytes();
        let _gate = self.writer.gate.read().await;
        self.flush_cached(offset, len).await?;
        let wio = self.writer.io();
        for batch in split(self.object_bytes, offset, len).chunks(MAX_PARALLEL_OBJECT_OPS) {
            let mut set = JoinSet::new();
            for e in batch.iter().copied() {
                let io = wio.clone();
                let oid = data_object(&self.id, e.objno);
                let obj_start = e.objno * self.object_bytes;
                let obj_end = (obj_start + self.object_bytes).min(size);
                let reaches_end = obj_start + e.offset + e.len >= obj_end;
                if let Some(src) = self.copyup_source(e.objno) {
                    // Over a parent, removing would show the parent's data:
                    // zero (copying up first) instead.
                    let ops = vec![SubOp::Zero {
                        offset: e.offset,
                        len: e.len,
                    }];
                    set.spawn(Self::modify_object(io, oid, Some(src), ops));
                    continue;
                }
                set.spawn(async move {
                    let ops = if e.offset == 0 && reaches_end {
                        vec![SubOp::Remove]
                    } else if reaches_end {
                        vec![SubOp::AssertExists, SubOp::Truncate { size: e.offset }]
                    } else {
                        vec![
                            SubOp::AssertExists,
                            SubOp::Zero {
                                offset: e.offset,
                                len: e.len,
                            },
                        ]
                    };
                    match io.operate(&oid, ops).await {
                        Ok(_) => Ok(()),
                        Err(err) if is_noent(&err) => Ok(()),
                        Err(err) => Err(err),
                    }
                });
            }
            join_all(set).await?;
        }
        Ok(())
    }

    /// Writes zeros that stay allocated (NBD's NO_HOLE, FUSE's ZERO_RANGE).
    /// One object's worth of zeros is shared by every piece, and at most
    /// MAX_PARALLEL_OBJECT_OPS pieces are in flight, so memory stays bounded
    /// however large the range.
    pub async fn write_zeroes_allocated(&self, offset: u64, len: u64) -> Result<(), RbdError> {
        self.check_writable()?;
        self.check_range(offset, len)?;
        let zeros = Bytes::from(vec![0u8; self.object_bytes.min(len) as usize]);
        let _gate = self.writer.gate.read().await;
        self.flush_cached(offset, len).await?;
        let wio = self.writer.io();
        for batch in split(self.object_bytes, offset, len).chunks(MAX_PARALLEL_OBJECT_OPS) {
            let mut set = JoinSet::new();
            for e in batch.iter().copied() {
                let oid = data_object(&self.id, e.objno);
                let ops = vec![SubOp::Write {
                    offset: e.offset,
                    data: zeros.slice(..e.len as usize),
                }];
                set.spawn(Self::modify_object(
                    wio.clone(),
                    oid,
                    self.copyup_source(e.objno),
                    ops,
                ));
            }
            join_all(set).await?;
        }
        Ok(())
    }

    /// The user's flush (NBD FLUSH, fsync): makes every write
    /// acknowledged before this call durable on every acting replica
    /// (writes back the write cache). Fails with the cache's sticky error
    /// if a write-back failed since the image was opened. A
    /// write-through-until-flush cache turns write-back on here.
    pub async fn flush(&self) -> Result<(), RbdError> {
        if self.lock.is_none() {
            return Ok(());
        }
        self.writer.cache.flush_user().await
    }

    /// The same durability as [`Image::flush`], for flushes the user did
    /// not ask for (a clean NBD disconnect, closing a mapped file, before
    /// close): it does not turn write-back on, so a client that never
    /// flushes keeps a write-through disk across reconnects.
    pub async fn write_back(&self) -> Result<(), RbdError> {
        if self.lock.is_none() {
            return Ok(());
        }
        self.writer.cache.flush_all().await
    }

    /// Makes the cached writes to the objects under `[offset, offset+len)`
    /// durable (before a discard or zeroing reaches the OSDs, so no older
    /// cached write lands after it).
    async fn flush_cached(&self, offset: u64, len: u64) -> Result<(), RbdError> {
        self.writer.cache.check()?;
        for e in split(self.object_bytes, offset, len) {
            self.writer.cache.flush_object(e.objno).await?;
        }
        Ok(())
    }

    /// Tells the cache this user flushes when it needs durability (what
    /// Ceph's `rbd` tool does for its own commands: bench and import end
    /// with a flush): write-back from the first write, not only after the
    /// first flush, when the policy is write-back.
    pub fn assume_flushing_user(&self) {
        self.writer.cache.assume_flushing_user();
    }

    /// The write cache's settings for this handle.
    pub fn cache_config(&self) -> CacheConfig {
        self.writer.cache.config()
    }

    /// Changes the size; shrinking frees the objects past the new end
    /// (snapshots keep their own size and data).
    pub async fn resize(&self, new_size_bytes: u64) -> Result<(), RbdError> {
        self.check_writable()?;
        if new_size_bytes == 0 {
            return Err(RbdError::Invalid(
                "image size must be greater than 0".into(),
            ));
        }
        let _gate = self.writer.gate.read().await;
        self.writer.cache.flush_all().await?;
        let mut header = self.writer.header.lock().await;
        let wio = self.writer.io();
        let old = header.size_bytes;
        if new_size_bytes < old {
            // Stop I/O past the new end first, then free the space.
            self.size_bytes.store(new_size_bytes, Ordering::Release);
            let keep = new_size_bytes.div_ceil(self.object_bytes);
            remove_objects(&wio, &self.id, keep, header.object_count()).await?;
            let tail = new_size_bytes % self.object_bytes;
            if tail != 0 {
                let oid = data_object(&self.id, keep - 1);
                let ops = vec![SubOp::Truncate { size: tail }];
                let src = self.copyup_source(keep - 1);
                let ops = if src.is_some() {
                    ops
                } else {
                    let mut g = vec![SubOp::AssertExists];
                    g.extend(ops);
                    g
                };
                ignore_noent(Self::modify_object(wio.clone(), oid, src, ops).await)?;
            }
        }
        let next = crate::snap::update_header(&self.writer.meta, &self.name, &self.id, |h| {
            h.size_bytes = new_size_bytes;
            if let Some(p) = &mut h.parent {
                p.overlap_bytes = p.overlap_bytes.min(new_size_bytes);
            }
            Ok(())
        })
        .await?;
        *header = next;
        self.size_bytes.store(new_size_bytes, Ordering::Release);
        self.writer
            .size_bytes
            .store(new_size_bytes, Ordering::Release);
        Ok(())
    }

    /// Copies every object a clone still reads from its parent into the
    /// clone (flatten). Returns the parent it was copied from (None: not
    /// a clone).
    pub(crate) async fn copy_up_all(
        &self,
        progress: crate::transfer::Progress<'_>,
    ) -> Result<Option<ParentSpec>, RbdError> {
        self.check_writable()?;
        let parent = self.writer.header.lock().await.parent.clone();
        let (Some(spec), Some(p)) = (parent, self.parent.as_ref()) else {
            return Ok(None);
        };
        let _gate = self.writer.gate.read().await;
        self.writer.cache.flush_all().await?;
        let wio = self.writer.io();
        let objects = p.overlap_bytes.div_ceil(self.object_bytes);
        let total = objects * self.object_bytes;
        for first in (0..objects).step_by(MAX_PARALLEL_OBJECT_OPS) {
            let mut set = JoinSet::new();
            for objno in first..(first + MAX_PARALLEL_OBJECT_OPS as u64).min(objects) {
                let oid = data_object(&self.id, objno);
                set.spawn(Self::modify_object(
                    wio.clone(),
                    oid,
                    self.copyup_source(objno),
                    Vec::new(),
                ));
            }
            join_all(set).await?;
            progress(
                ((first + MAX_PARALLEL_OBJECT_OPS as u64) * self.object_bytes).min(total),
                total,
            );
        }
        Ok(Some(spec))
    }

    /// The snapshot this handle reads, if it is a snapshot handle.
    pub fn snap_id(&self) -> Option<u64> {
        self.snap_id
    }

    /// Writes back the cache, then releases the lock (only if it is still
    /// ours). The lock is released even if the write-back failed; that
    /// error is returned.
    pub async fn close(self) -> Result<(), RbdError> {
        let Some(lock) = &self.lock else {
            return Ok(());
        };
        let flushed = self.writer.cache.flush_all().await;
        let ops = vec![
            SubOp::CmpExt {
                offset: 0,
                expected: Bytes::from(lock.encode()),
            },
            SubOp::Remove,
        ];
        let released = match self.writer.meta.operate(&lock_object(&self.id), ops).await {
            Ok(_) => Ok(()),
            Err(e) if is_noent(&e) || matches!(e.op_error(), Some(OpError::CmpMismatch { .. })) => {
                Err(RbdError::LockLost(self.name.clone()))
            }
            Err(e) => Err(e.into()),
        };
        flushed.and(released)
    }
}

async fn join_all(mut set: JoinSet<Result<(), ClientError>>) -> Result<(), RbdError> {
    let mut first_err = None;
    while let Some(done) = set.join_next().await {
        let r = done.map_err(|e| RbdError::Invalid(format!("task failed: {e}")))?;
        if let Err(e) = r {
            first_err.get_or_insert(RbdError::from(e));
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// The parent's object data with `ops` (writes and zeroes) applied, for a
/// copy-up that is a single write; `Err` gives the data back when `ops`
/// hold anything else.
fn overlay(mut data: Vec<u8>, ops: &[SubOp]) -> Result<Vec<u8>, Vec<u8>> {
    let simple = ops
        .iter()
        .all(|o| matches!(o, SubOp::Write { .. } | SubOp::Zero { .. }));
    if !simple {
        return Err(data);
    }
    for op in ops {
        match op {
            SubOp::Write { offset, data: d } => {
                let (off, end) = (*offset as usize, *offset as usize + d.len());
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[off..end].copy_from_slice(d);
            }
            SubOp::Zero { offset, len } => {
                let off = (*offset as usize).min(data.len());
                let end = (*offset as usize)
                    .saturating_add(*len as usize)
                    .min(data.len());
                data[off..end].fill(0);
            }
            _ => {}
        }
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_up_overlays_writes_and_zeroes_on_the_parent_data() {
        let w = |offset: u64, d: &[u8]| SubOp::Write {
            offset,
            data: Bytes::copy_from_slice(d),
        };
        let got = overlay(
            vec![1; 8],
            &[w(2, &[7, 7]), SubOp::Zero { offset: 6, len: 9 }],
        );
        assert_eq!(got, Ok(vec![1, 1, 7, 7, 1, 1, 0, 0]));
        // A write past the parent's end extends it with zeros between.
        assert_eq!(overlay(vec![1; 2], &[w(4, &[9])]), Ok(vec![1, 1, 0, 0, 9]));
        // Anything else keeps the multi-op form.
        let other = [SubOp::Truncate { size: 1 }];
        assert_eq!(overlay(vec![1; 2], &other), Err(vec![1; 2]));
    }
}
