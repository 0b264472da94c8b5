//! The store's error type. Every variant names what failed and, where the
//! caller can act, what to do next.

use crate::ids::{CollectionId, ObjectId};

/// Errors returned by [`crate::Store`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("collection {0} does not exist")]
    NoSuchCollection(CollectionId),
    #[error("collection {0} already exists")]
    CollectionExists(CollectionId),
    #[error("collection {coll} is not empty ({objects} objects); remove its objects first")]
    CollectionNotEmpty { coll: CollectionId, objects: u64 },
    #[error("object {obj} does not exist in collection {coll}")]
    NoSuchObject { coll: CollectionId, obj: ObjectId },
    #[error("object {obj} already exists in collection {coll}")]
    ObjectExists { coll: CollectionId, obj: ObjectId },
    #[error(
        "object {obj} in {coll}: size {size} bytes exceeds osd_max_object_size ({limit} bytes)"
    )]
    ObjectTooLarge {
        coll: CollectionId,
        obj: ObjectId,
        size: u64,
        limit: u64,
    },
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("store is full: {needed_bytes} bytes needed, {available_bytes} available ({what}); delete data or add capacity")]
    StoreFull {
        what: &'static str,
        needed_bytes: u64,
        available_bytes: u64,
    },
    #[error("checksum mismatch in collection {coll}, object {obj}, at offset {offset} (block of {block_bytes} bytes at data-file offset {disk_offset}): stored crc32c {expected:#010x}, computed {actual:#010x}; the copy on this disk is damaged — repair from a replica")]
    Checksum {
        coll: CollectionId,
        obj: ObjectId,
        offset: u64,
        block_bytes: u32,
        disk_offset: u64,
        expected: u32,
        actual: u32,
    },
    #[error("I/O error on {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("metadata engine (redb) error: {0}")]
    Kv(String),
    #[error(
        "on-disk data is corrupt: {0}; run 'cairn store fsck --deep' and repair from replicas"
    )]
    Corrupt(String),
    #[error("store at {path} is not usable: {reason}")]
    Format { path: String, reason: String },
    #[error("store was poisoned by an earlier failed sync or commit ({0}); close and reopen it (reopen replays to a consistent state)")]
    Poisoned(String),
    #[error("store is shutting down")]
    ShuttingDown,
}

impl StoreError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        if source.raw_os_error() == Some(libc::ENOSPC) {
            // The filesystem itself ran out of space under us.
            return StoreError::StoreFull {
                what: "filesystem returned ENOSPC",
                needed_bytes: 0,
                available_bytes: 0,
            };
        }
        StoreError::Io {
            what: what.into(),
            source,
        }
    }
    /// True if this error is the clean "out of space" condition.
    pub fn is_full(&self) -> bool {
        matches!(self, StoreError::StoreFull { .. })
    }
}

macro_rules! kv_from {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::Kv(e.to_string())
            }
        }
    )*};
}
kv_from!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

impl From<cairn_types::DecodeError> for StoreError {
    fn from(e: cairn_types::DecodeError) -> Self {
        StoreError::Corrupt(e.to_string())
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;
