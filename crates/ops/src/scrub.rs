//! OSD <-> OSD messages of scrub: the primary asks each acting member (or
//! EC shard) for a *scrub map* of one chunk of the PG — every object whose
//! placement hash falls in a range of the store's listing order, with its
//! size, version, attribute and omap digests and, for a deep scrub, the
//! crc32c of its data read back through the store (which verifies every
//! block checksum). Comparing the maps and repairing is the OSD's job.

use crate::op::{ObjectName, Version};
use cairn_types::{Epoch, PgId};
use serde::{Deserialize, Serialize};

/// End of the listing order (exclusive bound past every object).
pub const SCRUB_RANGE_END: u64 = 1 << 32;

/// Most objects one scrub map carries; a member holding more in the range
/// answers with `truncated` set.
pub const SCRUB_MAP_MAX_OBJECTS: usize = 4096;

/// A chunk of a PG: objects whose bit-reversed placement hash `h` has
/// `start <= h < end` (the store lists objects in that order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubRange {
    pub start: u64,
    pub end: u64,
}

impl ScrubRange {
    /// Whether an object with placement hash `hash` is in the chunk.
    pub fn contains_hash(&self, hash: u32) -> bool {
        let k = u64::from(hash.reverse_bits());
        k >= self.start && k < self.end
    }
}

/// primary -> member (call): build the scrub map of `range`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubMapRequest {
    pub pgid: PgId,
    /// EC pools: the shard the member holds; None for replicated pools.
    pub shard: Option<u8>,
    pub from: i32,
    pub epoch: Epoch,
    pub range: ScrubRange,
    /// Read every byte and report data checksums.
    pub deep: bool,
}

/// What one member holds of one object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubObject {
    pub name: ObjectName,
    /// Data bytes stored here (an EC shard: its chunk's length).
    pub size: u64,
    /// Logical object size (EC: from the chunk info; replicated: `size`).
    pub logical_size: u64,
    pub version: Version,
    /// crc32c over the object's attributes (name and value, in order),
    /// except the version and, on EC shards, the shard's chunk info.
    pub attrs_digest: u32,
    /// crc32c over the omap header and entries.
    pub omap_digest: u32,
    /// Deep scrub: crc32c of the data (an EC shard: of its chunk).
    pub data_digest: Option<u32>,
    /// The object could not be read here (checksum or I/O error).
    pub read_error: Option<String>,
}

/// A member's answer: its objects in the range, in listing order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ScrubMap {
    pub objects: Vec<ScrubObject>,
    /// More objects were in the range than [`SCRUB_MAP_MAX_OBJECTS`].
    pub truncated: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubMapReply {
    pub pgid: PgId,
    pub from: i32,
    pub result: Result<ScrubMap, String>,
}
