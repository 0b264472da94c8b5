//! The durability boundary: every byte the store (and its metadata engine)
//! puts on disk goes through [`StoreFile`]. `OsFile` is the real thing — a
//! regular file, or a raw block device whose size is fixed;
//! [`crate::sim::SimFile`] models live vs durable bytes for fault tests.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::Arc;

/// Positional file I/O with explicit durability. Implementations must be
/// safe to call from many threads at once.
pub trait StoreFile: Send + Sync + 'static {
    /// Reads exactly `buf.len()` bytes at `offset` (error if past the end).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`; not durable until [`StoreFile::sync_data`].
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Writes `bufs` back to back from `offset` (one `pwritev` where the
    /// implementation can); not durable until [`StoreFile::sync_data`].
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let mut at = offset;
        for b in bufs {
            self.write_at(b, at)?;
            at += b.len() as u64;
        }
        Ok(())
    }
    /// Like [`StoreFile::write_at`] but may bypass the page cache (O_DIRECT);
    /// `offset` and `buf.len()` must be multiples of 4096. Still needs
    /// [`StoreFile::sync_data`] for durability (device cache, file metadata).
    fn write_at_direct(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_at(buf, offset)
    }
    /// Like [`StoreFile::read_at`] but may bypass the page cache (O_DIRECT)
    /// when `offset`, `buf.len()` and `buf`'s address are multiples of
    /// 4096; otherwise (or where O_DIRECT is unavailable) a plain read.
    fn read_at_direct(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_at(buf, offset)
    }
    /// Reads into the start of `buf` only what the page cache holds at
    /// `offset`, never waiting for the disk (and starting no read-ahead):
    /// returns how many bytes it read, 0 when the first page is not cached
    /// or where this is not supported (the default).
    fn read_at_cached(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let _ = (buf, offset);
        Ok(0)
    }
    /// Makes every completed write durable (fdatasync).
    fn sync_data(&self) -> io::Result<()>;
    /// Starts writing the file's dirty pages back without waiting for them
    /// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`), so that the next
    /// [`StoreFile::sync_data`] finds less to write at once. Makes nothing
    /// durable (no flush, no file metadata): only `sync_data` does. The
    /// default does nothing.
    fn start_writeback(&self) -> io::Result<()> {
        Ok(())
    }
    fn len(&self) -> io::Result<u64>;
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Grows or shrinks; new bytes read as zeros.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Reserves real space for `[0, len)` (fallocate) so later writes cannot
    /// hit ENOSPC; implementations that cannot reserve just extend. A file
    /// of fixed size (a raw device) fails if `len` is beyond its end.
    fn preallocate(&self, len: u64) -> io::Result<()>;
    /// Gives `[offset, offset + len)` back to the filesystem or device
    /// (fallocate PUNCH_HOLE; on a block device the kernel discards or
    /// zeroes the range). Afterwards the range reads as zeros. Returns
    /// `Ok(false)` where the file system or device cannot do it (the
    /// range then keeps its old bytes and its space).
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<bool> {
        let _ = (offset, len);
        Ok(false)
    }
    /// The size is fixed (a raw block device): `set_len` and growing
    /// `preallocate` fail.
    fn is_fixed_size(&self) -> bool {
        false
    }
    /// The ranges inside `[offset, offset + len)` the filesystem holds as
    /// allocated but never written (preallocated "unwritten" extents, which
    /// a write must first convert), as (offset, len), in order, at most
    /// `max` of them. `Ok(None)` where this cannot be known (the default;
    /// raw devices; filesystems without FIEMAP).
    fn unwritten_ranges(
        &self,
        offset: u64,
        len: u64,
        max: usize,
    ) -> io::Result<Option<Vec<(u64, u64)>>> {
        let _ = (offset, len, max);
        Ok(None)
    }
}

/// `struct fiemap_extent` of linux/fiemap.h.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct FiemapExtent {
    fe_logical: u64,
    fe_physical: u64,
    fe_length: u64,
    fe_reserved64: [u64; 2],
    fe_flags: u32,
    fe_reserved: [u32; 3],
}

/// Extents asked for per FIEMAP call.
const FIEMAP_EXTENTS: usize = 64;

/// `struct fiemap` of linux/fiemap.h with room for [`FIEMAP_EXTENTS`].
#[repr(C)]
struct Fiemap {
    fm_start: u64,
    fm_length: u64,
    fm_flags: u32,
    fm_mapped_extents: u32,
    fm_extent_count: u32,
    fm_reserved: u32,
    fm_extents: [FiemapExtent; FIEMAP_EXTENTS],
}

/// `FS_IOC_FIEMAP` = `_IOWR('f', 11, struct fiemap)` (the header is 32 bytes).
const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
const FIEMAP_EXTENT_LAST: u32 = 0x1;
const FIEMAP_EXTENT_UNWRITTEN: u32 = 0x800;

/// Unwritten extents of the open regular file `fd` inside `[offset, end)`,
/// clipped to it; `Ok(None)` when the filesystem has no FIEMAP.
fn fiemap_unwritten(
    fd: libc::c_int,
    offset: u64,
    end: u64,
    max: usize,
) -> io::Result<Option<Vec<(u64, u64)>>> {
    let mut out = Vec::new();
    let mut at = offset;
    while at < end && out.len() < max {
        let mut fm = Fiemap {
            fm_start: at,
            fm_length: end - at,
            fm_flags: 0,
            fm_mapped_extents: 0,
            fm_extent_count: FIEMAP_EXTENTS as u32,
            fm_reserved: 0,
            fm_extents: [FiemapExtent::default(); FIEMAP_EXTENTS],
        };
        // SAFETY: FS_IOC_FIEMAP reads the header and writes at most
        // fm_extent_count extents into the array that follows it, all inside `fm`.
        if unsafe { libc::ioctl(fd, FS_IOC_FIEMAP as _, &mut fm as *mut Fiemap) } != 0 {
            let err = io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY) | Some(libc::EINVAL) => Ok(None),
                _ => Err(err),
            };
        }
        let n = (fm.fm_mapped_extents as usize).min(FIEMAP_EXTENTS);
        if n == 0 {
            break;
        }
        let mut last = false;
        for e in &fm.fm_extents[..n] {
            let (s, t) = (e.fe_logical.max(at), (e.fe_logical + e.fe_length).min(end));
            if e.fe_flags & FIEMAP_EXTENT_UNWRITTEN != 0 && t > s && out.len() < max {
                match out.last_mut() {
                    Some((ps, pl)) if *ps + *pl == s => *pl += t - s,
                    _ => out.push((s, t - s)),
                }
            }
            last |= e.fe_flags & FIEMAP_EXTENT_LAST != 0;
        }
        let e = &fm.fm_extents[n - 1];
        let next = e.fe_logical + e.fe_length;
        if last || next <= at {
            break;
        }
        at = next;
    }
    Ok(Some(out))
}

/// A plain file on a local filesystem, or a raw block device.
pub struct OsFile {
    file: File,
    /// Second descriptor opened with O_DIRECT, when the filesystem allows it.
    direct: Option<File>,
    name: String,
    /// Size of a block device (fixed); None for a regular file.
    device_bytes: Option<u64>,
    /// Punch-hole was refused once (EOPNOTSUPP): do not ask again.
    punch_unsupported: std::sync::atomic::AtomicBool,
}

/// Buffers per `pwritev` call (the kernel's IOV_MAX is 1024).
const IOV_MAX_PER_CALL: usize = 512;
/// Alignment O_DIRECT needs for buffers, offsets and lengths.
pub(crate) const DIRECT_ALIGN: usize = 4096;
/// Largest bounce buffer one direct write uses.
const DIRECT_CHUNK_BYTES: usize = 4 << 20;

/// A heap buffer aligned for O_DIRECT.
struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

impl AlignedBuf {
    fn new(len: usize) -> io::Result<AlignedBuf> {
        let layout = std::alloc::Layout::from_size_align(len.max(DIRECT_ALIGN), DIRECT_ALIGN)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: layout has non-zero size.
        let raw = unsafe { std::alloc::alloc(layout) };
        let ptr = std::ptr::NonNull::new(raw)
            .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        Ok(AlignedBuf { ptr, layout })
    }
    fn as_mut_slice(&mut self, len: usize) -> &mut [u8] {
        debug_assert!(len <= self.layout.size());
        // SAFETY: ptr is valid for layout.size() bytes, uniquely owned; u8 has no invalid values
        // once written, and callers fully overwrite the prefix they use before reading it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this exact layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl OsFile {
    /// Opens (or creates) a regular file, or opens a block device. A block
    /// device is opened exclusively (O_EXCL): the kernel refuses while it is
    /// mounted or held by another exclusive user.
    pub fn open(path: &Path, create: bool) -> io::Result<OsFile> {
        use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
        let is_device = std::fs::metadata(path)
            .map(|m| m.file_type().is_block_device())
            .unwrap_or(false);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create && !is_device)
            .truncate(false)
            .custom_flags(if is_device { libc::O_EXCL } else { 0 })
            .open(path)
            .map_err(|e| {
                if is_device && e.raw_os_error() == Some(libc::EBUSY) {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "{} is in use (mounted, or held by another program)",
                            path.display()
                        ),
                    )
                } else {
                    e
                }
            })?;
        let device_bytes = if is_device {
            use std::io::{Seek, SeekFrom};
            Some((&file).seek(SeekFrom::End(0))?)
        } else {
            None
        };
        let direct = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok();
        Ok(OsFile {
            file,
            direct,
            name: path.display().to_string(),
            device_bytes,
            punch_unsupported: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn fixed_size_error(&self, len: u64, size: u64) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is a device of fixed size {size} bytes; it cannot hold {len} bytes",
                self.name
            ),
        )
    }
}

impl StoreFile for OsFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }
    fn write_at_direct(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let Some(d) = &self.direct else {
            return self.file.write_all_at(buf, offset);
        };
        if !(offset as usize).is_multiple_of(DIRECT_ALIGN)
            || !buf.len().is_multiple_of(DIRECT_ALIGN)
        {
            return self.file.write_all_at(buf, offset);
        }
        if (buf.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN) {
            return d.write_all_at(buf, offset);
        }
        let mut bounce = AlignedBuf::new(buf.len().min(DIRECT_CHUNK_BYTES))?;
        for (i, chunk) in buf.chunks(DIRECT_CHUNK_BYTES).enumerate() {
            let b = bounce.as_mut_slice(chunk.len());
            b.copy_from_slice(chunk);
            d.write_all_at(b, offset + (i * DIRECT_CHUNK_BYTES) as u64)?;
        }
        Ok(())
    }
    fn read_at_direct(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match &self.direct {
            Some(d)
                if (offset as usize).is_multiple_of(DIRECT_ALIGN)
                    && buf.len().is_multiple_of(DIRECT_ALIGN)
                    && (buf.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN) =>
            {
                d.read_exact_at(buf, offset)
            }
            _ => self.file.read_exact_at(buf, offset),
        }
    }
    fn read_at_cached(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut done = 0usize;
        while done < buf.len() {
            let rest = &mut buf[done..];
            let iov = libc::iovec {
                iov_base: rest.as_mut_ptr().cast(),
                iov_len: rest.len(),
            };
            let Ok(at) = libc::off_t::try_from(offset + done as u64) else {
                break;
            };
            // SAFETY: one valid iovec over `rest`, which lives across the
            // call; the descriptor is open. RWF_NOWAIT copies only pages
            // already cached (it does not wait for I/O, but a miss may
            // still start read-ahead: callers use it only when cached
            // data is expected).
            let n = unsafe { libc::preadv2(self.file.as_raw_fd(), &iov, 1, at, libc::RWF_NOWAIT) };
            if n > 0 {
                done += n as usize;
                continue;
            }
            if n == 0 {
                break;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                // Not cached, or the kernel or file system cannot say.
                Some(libc::EAGAIN) | Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) => break,
                _ => return Err(e),
            }
        }
        Ok(done)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let mut iov: Vec<libc::iovec> = bufs
            .iter()
            .filter(|b| !b.is_empty())
            .map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        let mut first = 0;
        let mut at = offset;
        while first < iov.len() {
            let cnt = (iov.len() - first).min(IOV_MAX_PER_CALL);
            let off = libc::off_t::try_from(at)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
            // SAFETY: every iovec points into a live borrowed slice of its
            // stated length; the kernel only reads them.
            let n = unsafe {
                libc::pwritev(
                    self.file.as_raw_fd(),
                    iov[first..].as_ptr(),
                    cnt as i32,
                    off,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "pwritev wrote nothing",
                ));
            }
            let mut n = n as usize;
            at += n as u64;
            // Skip what was written; a partly written buffer keeps its rest.
            while n > 0 {
                let v = &mut iov[first];
                if n >= v.iov_len {
                    n -= v.iov_len;
                    first += 1;
                } else {
                    // SAFETY: n < iov_len: still inside the same buffer.
                    v.iov_base = unsafe { (v.iov_base as *mut u8).add(n) } as *mut libc::c_void;
                    v.iov_len -= n;
                    n = 0;
                }
            }
        }
        Ok(())
    }
    fn start_writeback(&self) -> io::Result<()> {
        // SAFETY: a valid descriptor; offset 0 and length 0 mean the whole file.
        let r = unsafe {
            libc::sync_file_range(self.file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE)
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
    fn len(&self) -> io::Result<u64> {
        match self.device_bytes {
            Some(n) => Ok(n),
            None => Ok(self.file.metadata()?.len()),
        }
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        match self.device_bytes {
            Some(n) if n == len => Ok(()),
            Some(n) => Err(self.fixed_size_error(len, n)),
            None => self.file.set_len(len),
        }
    }
    fn is_fixed_size(&self) -> bool {
        self.device_bytes.is_some()
    }
    fn unwritten_ranges(
        &self,
        offset: u64,
        len: u64,
        max: usize,
    ) -> io::Result<Option<Vec<(u64, u64)>>> {
        if self.device_bytes.is_some() {
            return Ok(None);
        }
        fiemap_unwritten(
            self.file.as_raw_fd(),
            offset,
            offset.saturating_add(len),
            max,
        )
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<bool> {
        use std::sync::atomic::Ordering;
        if len == 0 || self.punch_unsupported.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "range too large",
            ));
        };
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: fallocate on a valid, open descriptor with plain integer arguments.
        if unsafe { libc::fallocate(self.file.as_raw_fd(), mode, off, n) } == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL) => {
                tracing::warn!(file = %self.name, error = %err, "punch-hole unsupported; freed space stays allocated on the device");
                self.punch_unsupported.store(true, Ordering::Relaxed);
                Ok(false)
            }
            _ => Err(err),
        }
    }
    fn preallocate(&self, len: u64) -> io::Result<()> {
        if let Some(n) = self.device_bytes {
            // A device has all its space already; nothing to reserve.
            return if len <= n {
                Ok(())
            } else {
                Err(self.fixed_size_error(len, n))
            };
        }
        let len_off = libc::off_t::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "length too large"))?;
        // SAFETY: fallocate on a valid, open descriptor with plain integer arguments.
        let rc = unsafe { libc::fallocate(self.file.as_raw_fd(), 0, 0, len_off) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => {
                tracing::warn!(file = %self.name, "fallocate unsupported; data file is sparse, a full filesystem shows up as ENOSPC on write");
                self.file.set_len(len)
            }
            _ => Err(err),
        }
    }
}

/// Adapts a [`StoreFile`] to redb's storage backend so the metadata engine's
/// I/O crosses the same durability boundary (and the same fault injection).
pub(crate) struct KvBackend(pub Arc<dyn StoreFile>);

impl fmt::Debug for KvBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KvBackend")
    }
}

impl redb::StorageBackend for KvBackend {
    fn len(&self) -> io::Result<u64> {
        self.0.len()
    }
    fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        self.0.read_at(&mut buf, offset)?;
        Ok(buf)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&self, _eventual: bool) -> io::Result<()> {
        // Always a real sync: we never rely on barrier-only semantics.
        self.0.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.write_at(data, offset)
    }
}
