//! cairn-rbd: block images over the Cairn object client (RBD-like). An
//! image is a header in a replicated pool and thin-provisioned data objects
//! `rbd_data.<id>.<objno:016x>` in a data pool; an exclusive lock keeps one
//! writer at a time. [`Image`] implements cairn-nbd's `BlockBackend`.
//!
//! [`fuse`] exposes an open image as a file on a FUSE mount (what
//! `cairn rbd map` attaches with `losetup` where the kernel has no nbd).
//!
//! [`snap`] has snapshots (object-level clone-on-write in the OSDs, taken
//! through the lock holder so they are a point in time) and copy-on-write
//! clones of protected snapshots.
//!
//! [`bench`] is `rbd bench`'s load generator.
//!
//! [`cache`] is the client write cache (Ceph's `rbd_cache`): with
//! `rbd_cache_policy = writeback` a write is acknowledged once cached and
//! made durable by the next flush (NBD FLUSH, fsync, close, snapshot,
//! resize); FUA writes are durable before their ack. Write-through (the
//! policy, or until the first flush) sends each write on at once; writes
//! to one data object in flight together are then combined (`combine`):
//! one op per object at a time, the rest queued and sent as one op when
//! it returns.
//!
//! Snapshots work the same whether the data pool is replicated or
//! erasure-coded (the OSDs of an EC pool clone each shard's chunk).
//!
//! [`fence`]: breaking a lock blocklists the old holder's client instance
//! first (and waits for the map that lists it), so a holder that is still
//! alive cannot write after the new holder starts.

mod backend;
pub mod bench;
pub mod cache;
mod combine;
pub mod error;
pub mod fence;
pub mod fuse;
pub mod header;
pub mod image;
pub mod map;
pub mod serve;
pub mod snap;
pub mod transfer;

pub use cache::CacheConfig;
pub use error::RbdError;
pub use fence::{BrokenLock, Fenced, Fencer};
pub use header::{ImageHeader, LockRecord, ParentSpec, SnapInfo};
pub use image::{CreateOptions, DiskUsage, Image, Rbd};
pub use serve::{serve_images, Listener, ServeOptions};
