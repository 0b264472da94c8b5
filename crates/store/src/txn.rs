//! The transaction builder: an ordered list of operations applied atomically
//! by [`crate::Store::commit`]. Building a transaction does no I/O.

use crate::ids::{CollectionId, ObjectId};
use bytes::Bytes;
use std::sync::Arc;

/// One operation. Semantics (applied in order, all or nothing):
/// writes, zero and truncate create a missing object; attr and omap ops,
/// remove and clone sources require the object to exist.
#[derive(Debug, Clone)]
pub enum Op {
    CreateCollection(CollectionId),
    /// Fails unless the collection has no objects.
    RemoveCollection(CollectionId),
    /// Creates the object if missing (no-op if it exists).
    Touch(CollectionId, ObjectId),
    /// Creates the object; fails if it exists.
    Create(CollectionId, ObjectId),
    Write {
        coll: CollectionId,
        obj: ObjectId,
        offset: u64,
        data: Bytes,
        /// Verified crc32c of `data`'s leading whole
        /// [`CRC_BLOCK_BYTES`](cairn_types::crc::CRC_BLOCK_BYTES) blocks
        /// (see [`Transaction::write_verified`]); `None`: computed here.
        crcs: Option<Arc<[u32]>>,
    },
    /// Makes `[offset, offset+len)` read as zeros, freeing whole blocks; extends the size if needed.
    Zero {
        coll: CollectionId,
        obj: ObjectId,
        offset: u64,
        len: u64,
    },
    /// Sets the size, freeing blocks past it or extending with a hole.
    Truncate {
        coll: CollectionId,
        obj: ObjectId,
        size: u64,
    },
    Remove(CollectionId, ObjectId),
    /// Replaces `dst` with a copy of `src` (data, xattrs and omap).
    Clone {
        coll: CollectionId,
        src: ObjectId,
        dst: ObjectId,
    },
    /// Copies `len` bytes of `src` at `src_offset` into `dst` at `dst_offset`.
    CloneRange {
        coll: CollectionId,
        src: ObjectId,
        dst: ObjectId,
        src_offset: u64,
        len: u64,
        dst_offset: u64,
    },
    SetAttrs {
        coll: CollectionId,
        obj: ObjectId,
        attrs: Vec<(String, Bytes)>,
    },
    /// Removing a missing attribute is not an error.
    RmAttr {
        coll: CollectionId,
        obj: ObjectId,
        name: String,
    },
    OmapSet {
        coll: CollectionId,
        obj: ObjectId,
        entries: Vec<(Bytes, Bytes)>,
    },
    OmapRm {
        coll: CollectionId,
        obj: ObjectId,
        keys: Vec<Bytes>,
    },
    OmapClear(CollectionId, ObjectId),
    /// Removes omap keys in `[first, last)`.
    OmapRmRange {
        coll: CollectionId,
        obj: ObjectId,
        first: Bytes,
        last: Bytes,
    },
    /// PG log entry at `index` (overwrites an existing entry at that index).
    LogAppend {
        coll: CollectionId,
        index: u64,
        entry: Bytes,
    },
    /// Removes every log entry with index in `[from, upto]`. The caller
    /// knows no entry below `from` is left (its log's oldest entry), so the
    /// delete starts there instead of walking from 0 past every entry
    /// removed earlier (deletions stay in the overlay until a checkpoint).
    LogTrim {
        coll: CollectionId,
        from: u64,
        upto: u64,
    },
    MetaSet {
        coll: CollectionId,
        key: String,
        value: Bytes,
    },
    MetaRm {
        coll: CollectionId,
        key: String,
    },
}

impl Op {
    /// The collection the op reads or changes.
    pub fn collection(&self) -> &CollectionId {
        match self {
            Op::CreateCollection(c)
            | Op::RemoveCollection(c)
            | Op::Touch(c, _)
            | Op::Create(c, _)
            | Op::Remove(c, _)
            | Op::OmapClear(c, _) => c,
            Op::Write { coll, .. }
            | Op::Zero { coll, .. }
            | Op::Truncate { coll, .. }
            | Op::Clone { coll, .. }
            | Op::CloneRange { coll, .. }
            | Op::SetAttrs { coll, .. }
            | Op::RmAttr { coll, .. }
            | Op::OmapSet { coll, .. }
            | Op::OmapRm { coll, .. }
            | Op::OmapRmRange { coll, .. }
            | Op::LogAppend { coll, .. }
            | Op::LogTrim { coll, .. }
            | Op::MetaSet { coll, .. }
            | Op::MetaRm { coll, .. } => coll,
        }
    }
}

/// A batch of operations applied atomically and in order.
#[derive(Debug, Clone, Default)]
pub struct Transaction {
    pub(crate) ops: Vec<Op>,
    /// See [`Transaction::keep_data_cached`].
    pub(crate) keep_cached: bool,
}

impl Transaction {
    pub fn new() -> Self {
        Transaction::default()
    }
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
    /// Asks that the data of this transaction's large writes stay in the
    /// kernel's page cache (written through it, then synced: durability
    /// is unchanged) instead of bypassing it with O_DIRECT, because it is
    /// likely to be read soon; big reads take what the page cache holds
    /// from there. Memory the kernel takes back when it needs it; not
    /// counted in the process's RSS.
    pub fn keep_data_cached(&mut self) -> &mut Self {
        self.keep_cached = true;
        self
    }
    pub fn push(&mut self, op: Op) -> &mut Self {
        self.ops.push(op);
        self
    }
    /// The collections the transaction touches, each once, in first-use order.
    pub fn collections(&self) -> Vec<CollectionId> {
        let mut out: Vec<CollectionId> = Vec::new();
        for op in &self.ops {
            let c = op.collection();
            if !out.contains(c) {
                out.push(*c);
            }
        }
        out
    }
    /// Bytes of payload carried (what the in-flight throttle counts).
    pub fn payload_bytes(&self) -> u64 {
        self.ops
            .iter()
            .map(|op| match op {
                Op::Write { data, .. } => data.len() as u64,
                Op::SetAttrs { attrs, .. } => {
                    attrs.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum()
                }
                Op::OmapSet { entries, .. } => entries
                    .iter()
                    .map(|(k, v)| (k.len() + v.len()) as u64)
                    .sum(),
                Op::LogAppend { entry, .. } => entry.len() as u64,
                Op::MetaSet { value, .. } => value.len() as u64,
                _ => 64,
            })
            .sum()
    }
    pub fn create_collection(&mut self, c: CollectionId) -> &mut Self {
        self.push(Op::CreateCollection(c))
    }
    pub fn remove_collection(&mut self, c: CollectionId) -> &mut Self {
        self.push(Op::RemoveCollection(c))
    }
    pub fn touch(&mut self, c: CollectionId, o: ObjectId) -> &mut Self {
        self.push(Op::Touch(c, o))
    }
    pub fn create(&mut self, c: CollectionId, o: ObjectId) -> &mut Self {
        self.push(Op::Create(c, o))
    }
    pub fn write(
        &mut self,
        coll: CollectionId,
        obj: ObjectId,
        offset: u64,
        data: impl Into<Bytes>,
    ) -> &mut Self {
        self.push(Op::Write {
            coll,
            obj,
            offset,
            data: data.into(),
            crcs: None,
        })
    }
    /// [`Transaction::write`] of data whose block crcs are already known:
    /// `crcs[i]` is the crc32c of bytes `[i·4096, (i+1)·4096)` of `data`
    /// ([`CRC_BLOCK_BYTES`](cairn_types::crc::CRC_BLOCK_BYTES) blocks; a
    /// short tail has none), computed over the very bytes received and
    /// verified against the frame that carried them (a messenger's
    /// block-checked receive). The store keeps them instead of reading
    /// the data again for its per-block checksums where the write's blocks
    /// line up with its own (a block-aligned `offset`), and computes them
    /// elsewhere. Debug builds check them.
    pub fn write_verified(
        &mut self,
        coll: CollectionId,
        obj: ObjectId,
        offset: u64,
        data: Bytes,
        crcs: Arc<[u32]>,
    ) -> &mut Self {
        self.push(Op::Write {
            coll,
            obj,
            offset,
            data,
            crcs: Some(crcs),
        })
    }
    pub fn zero(&mut self, coll: CollectionId, obj: ObjectId, offset: u64, len: u64) -> &mut Self {
        self.push(Op::Zero {
            coll,
            obj,
            offset,
            len,
        })
    }
    pub fn truncate(&mut self, coll: CollectionId, obj: ObjectId, size: u64) -> &mut Self {
        self.push(Op::Truncate { coll, obj, size })
    }
    pub fn remove(&mut self, c: CollectionId, o: ObjectId) -> &mut Self {
        self.push(Op::Remove(c, o))
    }
    pub fn clone_object(&mut self, coll: CollectionId, src: ObjectId, dst: ObjectId) -> &mut Self {
        self.push(Op::Clone { coll, src, dst })
    }
    pub fn clone_range(
        &mut self,
        coll: CollectionId,
        src: ObjectId,
        dst: ObjectId,
        src_offset: u64,
        len: u64,
        dst_offset: u64,
    ) -> &mut Self {
        self.push(Op::CloneRange {
            coll,
            src,
            dst,
            src_offset,
            len,
            dst_offset,
        })
    }
    pub fn setattr(
        &mut self,
        coll: CollectionId,
        obj: ObjectId,
        name: impl Into<String>,
        value: impl Into<Bytes>,
    ) -> &mut Self {
        self.push(Op::SetAttrs {
            coll,
            obj,
            attrs: vec![(name.into(), value.into())],
        })
    }
    pub fn rmattr(
        &mut self,
        coll: CollectionId,
        obj: ObjectId,
        name: impl Into<String>,
    ) -> &mut Self {
        self.push(Op::RmAttr {
            coll,
            obj,
            name: name.into(),
        })
    }
    pub fn omap_set(
        &mut self,
        coll: CollectionId,
        obj: ObjectId,
        entries: Vec<(Bytes, Bytes)>,
    ) -> &mut Self {
        self.push(Op::OmapSet { coll, obj, entries })
    }
    pub fn omap_rm(&mut self, coll: CollectionId, obj: ObjectId, keys: Vec<Bytes>) -> &mut Self {
        self.push(Op::OmapRm { coll, obj, keys })
    }
    pub fn omap_clear(&mut self, coll: CollectionId, obj: ObjectId) -> &mut Self {
        self.push(Op::OmapClear(coll, obj))
    }
    pub fn omap_rm_range(
        &mut self,
        coll: CollectionId,
        obj: ObjectId,
        first: impl Into<Bytes>,
        last: impl Into<Bytes>,
    ) -> &mut Self {
        self.push(Op::OmapRmRange {
            coll,
            obj,
            first: first.into(),
            last: last.into(),
        })
    }
    pub fn log_append(
        &mut self,
        coll: CollectionId,
        index: u64,
        entry: impl Into<Bytes>,
    ) -> &mut Self {
        self.push(Op::LogAppend {
            coll,
            index,
            entry: entry.into(),
        })
    }
    /// Removes every log entry with index `<= upto`.
    pub fn log_trim(&mut self, coll: CollectionId, upto: u64) -> &mut Self {
        self.log_trim_from(coll, 0, upto)
    }
    /// Removes the log entries with index in `[from, upto]`, for a caller
    /// that knows none is left below `from`: the cost follows what is
    /// removed, not the log's history.
    pub fn log_trim_from(&mut self, coll: CollectionId, from: u64, upto: u64) -> &mut Self {
        self.push(Op::LogTrim { coll, from, upto })
    }
    pub fn meta_set(
        &mut self,
        coll: CollectionId,
        key: impl Into<String>,
        value: impl Into<Bytes>,
    ) -> &mut Self {
        self.push(Op::MetaSet {
            coll,
            key: key.into(),
            value: value.into(),
        })
    }
    pub fn meta_rm(&mut self, coll: CollectionId, key: impl Into<String>) -> &mut Self {
        self.push(Op::MetaRm {
            coll,
            key: key.into(),
        })
    }
}
