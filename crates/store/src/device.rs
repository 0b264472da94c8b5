//! The durability boundary: every byte the store (and its metadata engine)
//! puts on disk goes through [`StoreFile`]. `OsFile` is the real thing;
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
    /// Like [`StoreFile::write_at`] but may bypass the page cache (O_DIRECT);
    /// `offset` and `buf.len()` must be multiples of 4096. Still needs
    /// [`StoreFile::sync_data`] for durability (device cache, file metadata).
    fn write_at_direct(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_at(buf, offset)
    }
    /// Makes every completed write durable (fdatasync).
    fn sync_data(&self) -> io::Result<()>;
    fn len(&self) -> io::Result<u64>;
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Grows or shrinks; new bytes read as zeros.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Reserves real space for `[0, len)` (fallocate) so later writes cannot
    /// hit ENOSPC; implementations that cannot reserve just extend.
    fn preallocate(&self, len: u64) -> io::Result<()>;
}

/// A plain file on a local filesystem.
pub struct OsFile {
    file: File,
    /// Second descriptor opened with O_DIRECT, when the filesystem allows it.
    direct: Option<File>,
    name: String,
}

/// Alignment O_DIRECT needs for buffers, offsets and lengths.
const DIRECT_ALIGN: usize = 4096;
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
    pub fn open(path: &Path, create: bool) -> io::Result<OsFile> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(path)?;
        use std::os::unix::fs::OpenOptionsExt;
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
        })
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
    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
    fn preallocate(&self, len: u64) -> io::Result<()> {
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
