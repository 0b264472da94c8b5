//! cairn-store: the per-disk transactional object store every OSD runs on.
//!
//! Collections (one per PG shard) hold objects with sparse checksummed data,
//! xattrs and an ordered omap, plus PG metadata and PG log entries.
//! [`Transaction`]s apply atomically and are durable when
//! [`Store::commit`] returns; concurrent submitters share one write-ahead-log
//! record and one sync (group commit). Metadata lives in redb, data in one
//! preallocated file with an extent allocator and a crc32c per block; redb
//! and the data file are brought up to date lazily and checkpointed. See
//! `README.md` for the on-disk format and the fsync discipline.

mod alloc;
mod apply;
pub mod bench;
pub mod device;
mod error;
mod extcache;
mod fsck;
mod ids;
mod intake;
mod meta;
mod overlay;
mod prepare;
mod readbuf;
pub mod sim;
mod store;
mod txn;
mod wal;
mod zeroer;

pub use apply::MAX_ATTR_BYTES;
pub use error::{Result, StoreError};
pub use fsck::{FsckIssue, FsckReport};
pub use ids::{CollectionId, ObjectId, NO_SHARD, OBJECT_NAME_MAX_BYTES, SNAP_HEAD};
pub use meta::FORMAT_VERSION;
pub use store::{
    CommitHandle, FullState, ListStart, ObjectRead, ObjectStat, StatFs, Store, StoreConfig,
    StoreFiles, DATA_FILE, META_FILE, WAL_FILE,
};
pub use txn::{Op, Transaction};
pub use zeroer::ZeroingStats;
