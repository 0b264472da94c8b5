//! One open image exposed as a single regular file on a FUSE mount, so that
//! `losetup` can turn it into a block device on hosts without the kernel's
//! nbd module (`cairn rbd map`). Owns the FUSE operations and their mapping
//! onto [`Image`]; does not own the loop device, the mapping records or the
//! helper process (the CLI does).
//!
//! read/write go to the image; fsync → [`Image::flush`] (the user's
//! flush), flush (a close of the file) → [`Image::write_back`];
//! fallocate `PUNCH_HOLE|KEEP_SIZE` (what the loop driver sends for a
//! discard) → [`Image::discard`]; `ZERO_RANGE` (its write-zeroes with
//! NOUNMAP) → [`Image::write_zeroes_allocated`]. The file's size is the
//! image's size and cannot be changed through the mount. Every open is
//! direct I/O, so nothing is cached in the kernel's page cache: what the
//! loop device writes reaches the image before the write returns.

use crate::error::RbdError;
use crate::image::Image;
use bytes::Bytes;
use cairn_client::ClientError;
use cairn_ops::OpError;
use fuser::{
    consts, FileAttr, FileType, Filesystem, KernelConfig, MountOption, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Inode of the mount's root directory and of the image file.
const ROOT_INO: u64 = fuser::FUSE_ROOT_ID;
const FILE_INO: u64 = 2;
/// How long the kernel may cache attributes and names.
const ATTR_TTL: Duration = Duration::from_secs(1);
/// Block size reported by statfs; the loop driver uses it as its discard
/// granularity.
const BLOCK_BYTES: u32 = 4096;
/// Largest single FUSE write the kernel is told to send.
const MAX_WRITE_BYTES: u32 = 1 << 20;
/// Background (async) requests the kernel may keep in flight. With
/// MAX_WRITE_BYTES this bounds the helper's request buffers to 32 MiB.
const MAX_BACKGROUND: u16 = 32;

/// The filesystem: a root directory holding one file, the image.
pub struct ImageFs {
    image: Arc<Image>,
    file_name: String,
    rt: tokio::runtime::Handle,
    uid: u32,
    gid: u32,
    created: SystemTime,
}

fn errno(e: &RbdError) -> i32 {
    match e {
        RbdError::Invalid(_) => libc::EINVAL,
        RbdError::ReadOnly(_) => libc::EROFS,
        RbdError::Unsupported(_) => libc::EOPNOTSUPP,
        RbdError::Client(ClientError::Op {
            error: OpError::NoSpace(_),
            ..
        }) => libc::ENOSPC,
        _ => libc::EIO,
    }
}

impl ImageFs {
    /// `rt` runs the image I/O; every FUSE request becomes one task there,
    /// so many requests are served at once.
    pub fn new(image: Arc<Image>, rt: tokio::runtime::Handle) -> ImageFs {
        // SAFETY: getuid/getgid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        ImageFs {
            file_name: image.name().to_string(),
            image,
            rt,
            uid,
            gid,
            created: SystemTime::now(),
        }
    }

    fn attr(&self, ino: u64) -> FileAttr {
        let (kind, perm, size, nlink) = if ino == ROOT_INO {
            (FileType::Directory, 0o755, 0, 2)
        } else {
            let perm = if self.image.is_read_only() {
                0o400
            } else {
                0o600
            };
            (FileType::RegularFile, perm, self.image.size_bytes(), 1)
        };
        FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.created,
            mtime: self.created,
            ctime: self.created,
            crtime: self.created,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: BLOCK_BYTES,
            flags: 0,
        }
    }

    /// `[offset, offset+len)` clipped to the image, or an errno.
    fn clip(&self, offset: i64, len: u64) -> Result<(u64, u64), i32> {
        let offset = u64::try_from(offset).map_err(|_| libc::EINVAL)?;
        let size = self.image.size_bytes();
        if offset >= size {
            return Ok((offset, 0));
        }
        Ok((offset, len.min(size - offset)))
    }
}

impl Filesystem for ImageFs {
    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), i32> {
        // Best effort: an older kernel keeps its own defaults.
        let _ = config.add_capabilities(consts::FUSE_ASYNC_DIO);
        let _ = config.set_max_write(MAX_WRITE_BYTES);
        let _ = config.set_max_background(MAX_BACKGROUND);
        let _ = config.set_congestion_threshold(MAX_BACKGROUND * 3 / 4);
        Ok(())
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        if parent == ROOT_INO && name == OsStr::new(&self.file_name) {
            reply.entry(&ATTR_TTL, &self.attr(FILE_INO), 0);
        } else {
            reply.error(libc::ENOENT);
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match ino {
            ROOT_INO | FILE_INO => reply.attr(&ATTR_TTL, &self.attr(ino)),
            _ => reply.error(libc::ENOENT),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        if ino != FILE_INO {
            return reply.error(libc::EPERM);
        }
        // The size is the image's: resize with `cairn rbd resize`. An
        // O_TRUNC open or a truncate to the current size is harmless.
        let size_ok = size.is_none_or(|s| s == self.image.size_bytes());
        if !size_ok || mode.is_some() || uid.is_some() || gid.is_some() {
            return reply.error(libc::EPERM);
        }
        reply.attr(&ATTR_TTL, &self.attr(ino));
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        if ino != FILE_INO {
            return reply.error(libc::EISDIR);
        }
        let wants_write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        if wants_write && self.image.is_read_only() {
            return reply.error(libc::EROFS);
        }
        reply.opened(0, consts::FOPEN_DIRECT_IO);
    }

    #[allow(clippy::too_many_arguments)]
    fn read(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let (offset, len) = match self.clip(offset, size as u64) {
            Ok(r) => r,
            Err(e) => return reply.error(e),
        };
        if len == 0 {
            return reply.data(&[]);
        }
        let image = self.image.clone();
        self.rt.spawn(async move {
            match image.read(offset, len).await {
                Ok(d) => reply.data(&d),
                Err(e) => {
                    tracing::warn!(image = image.name(), offset, len, "read failed: {e}");
                    reply.error(errno(&e))
                }
            }
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        offset: i64,
        data: &[u8],
        _write_flags: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(libc::EINVAL);
        };
        if offset.saturating_add(data.len() as u64) > self.image.size_bytes() {
            return reply.error(libc::EFBIG);
        }
        let image = self.image.clone();
        let data = Bytes::copy_from_slice(data);
        self.rt.spawn(async move {
            let n = data.len() as u32;
            match image.write(offset, data).await {
                Ok(()) => reply.written(n),
                Err(e) => {
                    tracing::warn!(image = image.name(), offset, "write failed: {e}");
                    reply.error(errno(&e))
                }
            }
        });
    }

    /// A close of the file (the loop device letting go): written back,
    /// but not the user's flush.
    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _lo: u64, reply: ReplyEmpty) {
        self.sync_then(reply, false);
    }

    /// What the loop device sends for the guest's fsync / FLUSH.
    fn fsync(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _data: bool, reply: ReplyEmpty) {
        self.sync_then(reply, true);
    }

    #[allow(clippy::too_many_arguments)]
    fn fallocate(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        offset: i64,
        length: i64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        let zero = libc::FALLOC_FL_ZERO_RANGE;
        let kind = if mode == punch {
            FallocKind::Discard
        } else if mode & !libc::FALLOC_FL_KEEP_SIZE == zero {
            FallocKind::ZeroRange
        } else {
            // Plain allocation cannot be promised on a thin image, and the
            // other modes change the file's size.
            return reply.error(libc::EOPNOTSUPP);
        };
        let Ok(length) = u64::try_from(length) else {
            return reply.error(libc::EINVAL);
        };
        let (offset, len) = match self.clip(offset, length) {
            Ok(r) => r,
            Err(e) => return reply.error(e),
        };
        if len == 0 {
            return reply.ok();
        }
        let image = self.image.clone();
        self.rt.spawn(async move {
            let r = match kind {
                FallocKind::Discard => image.discard(offset, len).await,
                FallocKind::ZeroRange => image.write_zeroes_allocated(offset, len).await,
            };
            match r {
                Ok(()) => reply.ok(),
                Err(e) => {
                    tracing::warn!(image = image.name(), offset, len, "fallocate failed: {e}");
                    reply.error(errno(&e))
                }
            }
        });
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        if ino != ROOT_INO {
            return reply.error(libc::ENOTDIR);
        }
        let entries = [
            (ROOT_INO, FileType::Directory, "."),
            (ROOT_INO, FileType::Directory, ".."),
            (FILE_INO, FileType::RegularFile, self.file_name.as_str()),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset.max(0) as usize) {
            if reply.add(*ino, (i + 1) as i64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        let blocks = self.image.size_bytes() / BLOCK_BYTES as u64;
        reply.statfs(blocks, blocks, blocks, 2, 0, BLOCK_BYTES, 255, BLOCK_BYTES);
    }
}

enum FallocKind {
    Discard,
    ZeroRange,
}

impl ImageFs {
    fn sync_then(&self, reply: ReplyEmpty, user: bool) {
        let image = self.image.clone();
        self.rt.spawn(async move {
            let r = if user {
                image.flush().await
            } else {
                image.write_back().await
            };
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }
}

/// A mounted image, served on its own thread until unmounted.
pub struct MountedImage {
    unmounter: fuser::SessionUnmounter,
    thread: std::thread::JoinHandle<std::io::Result<()>>,
}

impl MountedImage {
    /// Whether the session has ended (someone unmounted it from outside).
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Unmounts (lazily: a file still held open, e.g. by a loop device,
    /// keeps the session alive until it is closed) and waits for the
    /// session to end.
    pub fn unmount(mut self) -> Result<(), RbdError> {
        if !self.thread.is_finished() {
            if let Err(e) = self.unmounter.unmount() {
                tracing::warn!("unmounting the image's FUSE mount: {e}");
            }
        }
        match self.thread.join() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(RbdError::Stream(format!("FUSE session ended with: {e}"))),
            Err(_) => Err(RbdError::Stream("FUSE session thread panicked".into())),
        }
    }
}

/// Mounts `image` at `mountpoint` (an existing empty directory): the image
/// is the file `<mountpoint>/<image name>`. Requests are read on a
/// dedicated thread; the I/O runs on `rt`.
pub fn mount_image(
    image: Arc<Image>,
    mountpoint: &Path,
    rt: tokio::runtime::Handle,
) -> Result<MountedImage, RbdError> {
    let name = image.name().to_string();
    let mut options = vec![
        MountOption::FSName(format!("cairn-rbd:{name}")),
        MountOption::Subtype("cairn-rbd".into()),
        MountOption::NoAtime,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    if image.is_read_only() {
        options.push(MountOption::RO);
    }
    let fs = ImageFs::new(image, rt);
    let mut session = fuser::Session::new(fs, mountpoint, &options).map_err(|e| {
        RbdError::Invalid(format!(
            "mounting image '{name}' with FUSE at {}: {e} (is /dev/fuse present and are you root?)",
            mountpoint.display()
        ))
    })?;
    let unmounter = session.unmount_callable();
    let thread = std::thread::Builder::new()
        .name(format!("fuse-{name}"))
        .spawn(move || session.run())
        .map_err(|e| RbdError::Stream(format!("starting the FUSE thread: {e}")))?;
    Ok(MountedImage { unmounter, thread })
}
