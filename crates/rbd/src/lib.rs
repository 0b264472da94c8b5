//! cairn-rbd: block images over the Cairn object client (RBD-like). An
//! image is a header in a replicated pool and thin-provisioned data objects
//! `rbd_data.<id>.<objno:016x>` in a data pool; an exclusive lock keeps one
//! writer at a time. [`Image`] implements cairn-nbd's `BlockBackend`.
//!
//! Not here yet: snapshots and clones (they need clone-on-write in the
//! OSD), lock fencing (blocklisting a broken lock's old holder), and
//! `map`/`unmap` (nbd-client or FUSE+loop).

mod backend;
pub mod error;
pub mod header;
pub mod image;
pub mod serve;
pub mod transfer;

pub use error::RbdError;
pub use header::{ImageHeader, LockRecord};
pub use image::{CreateOptions, DiskUsage, Image, Rbd};
pub use serve::{serve_images, Listener, ServeOptions};
