//! The block-device interface the NBD server drives. It owns the contract
//! (byte offsets, durability of FUA/flush, error kinds); it does not know
//! the wire protocol — `server` maps these errors to NBD errno values.

use bytes::Bytes;
use std::future::Future;
use std::pin::Pin;

/// A boxed, `Send` future, so that backends can be used as trait objects
/// (several exports of different kinds on one server).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a block operation failed. Each kind maps to one NBD errno.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BlockError {
    /// The device or the layer below failed (disk, network, cluster).
    #[error("I/O error: {0}")]
    Io(String),
    /// No space left for a write (NBD_ENOSPC).
    #[error("no space left: {0}")]
    NoSpace(String),
    /// Offset/length outside the device or otherwise invalid (NBD_EINVAL).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The export is read-only or the caller lacks the right (NBD_EPERM).
    #[error("not permitted: {0}")]
    NotPermitted(String),
    /// The backend does not implement this operation (NBD_ENOTSUP).
    #[error("not supported: {0}")]
    NotSupported(String),
    /// The backend is shutting down (NBD_ESHUTDOWN).
    #[error("shutting down: {0}")]
    Shutdown(String),
    /// Out of memory or a resource bound was hit (NBD_ENOMEM).
    #[error("out of resources: {0}")]
    NoMemory(String),
}

impl From<std::io::Error> for BlockError {
    fn from(e: std::io::Error) -> Self {
        if e.raw_os_error() == Some(28) {
            BlockError::NoSpace(e.to_string())
        } else {
            BlockError::Io(e.to_string())
        }
    }
}

pub type BlockResult<T> = Result<T, BlockError>;

/// A block device. Offsets and lengths are in bytes; the server checks
/// that every request lies inside `size_bytes()` before calling in, and
/// never sends a request longer than its `max_request_bytes`.
///
/// Durability contract: when `write`, `trim` or `write_zeroes` return `Ok`
/// with `fua == true`, the change is durable. `flush` makes every write that
/// completed before `flush` was called durable. Requests may run
/// concurrently, and the server does not order overlapping requests (NBD
/// clients must not send overlapping requests without waiting).
pub trait BlockBackend: Send + Sync + 'static {
    /// Size of the device in bytes.
    fn size_bytes(&self) -> u64;
    /// Preferred I/O size in bytes (a power of two, ≥ 512); the server
    /// advertises it as the preferred block size.
    fn preferred_block_bytes(&self) -> u32 {
        4096
    }
    /// True when writes through several connections at once are coherent:
    /// a flush on any connection covers writes completed on all of them.
    /// Only then does the server advertise NBD_FLAG_CAN_MULTI_CONN.
    fn multi_conn_safe(&self) -> bool;
    /// True when the device refuses writes.
    fn read_only(&self) -> bool {
        false
    }
    /// True when the device rotates (hint to the client's I/O scheduler).
    fn rotational(&self) -> bool {
        false
    }
    fn read(&self, offset: u64, len: u32) -> BoxFuture<'_, BlockResult<Bytes>>;
    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<'_, BlockResult<()>>;
    fn flush(&self) -> BoxFuture<'_, BlockResult<()>>;
    /// The server's courtesy flush when a client disconnects cleanly
    /// (`NBD_CMD_DISC`): the same durability as `flush`, but not asked for
    /// by the client, so backends that change behaviour on a client's
    /// first flush (a writethrough-until-flush cache) should not count it.
    fn flush_on_disconnect(&self) -> BoxFuture<'_, BlockResult<()>> {
        self.flush()
    }
    /// Discard a range: afterwards it reads as zeros or as its old data
    /// (NBD allows either); backends should free the space.
    fn trim(&self, offset: u64, len: u32, fua: bool) -> BoxFuture<'_, BlockResult<()>>;
    /// Make a range read as zeros. With `may_punch` the backend may free
    /// the space (deallocate); without it (NBD_CMD_FLAG_NO_HOLE) it must
    /// keep the range allocated.
    fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        may_punch: bool,
        fua: bool,
    ) -> BoxFuture<'_, BlockResult<()>>;
}
