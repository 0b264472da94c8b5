//! Erasure-coding maths for Cairn's EC pools: a `k + m` Reed-Solomon code
//! over `reed-solomon-simd`, the stripe geometry that lays an object's bytes
//! into chunks, read planning, the read-modify-write planner for partial
//! overwrites with per-shard rollback records, and chunk checksums.
//!
//! It does no I/O and holds no policy: which OSD holds which chunk, min_size,
//! when to recover, and where rollback records are kept belong to the OSD.
//! `docs/erasure-coding.md` describes the API and the availability rules.

pub mod chunkpool;
pub mod codec;
pub mod crc;
pub mod error;
pub mod format;
pub mod geometry;
pub mod object;
pub mod ranges;
pub mod rmw;
mod work;

pub use codec::Codec;
pub use crc::{block_crc32c, chunk_crc32c, drop_corrupt_chunks};
pub use error::{EcError, Result};
pub use format::{ChunkInfo, EC_FORMAT_VERSION, EC_LIBRARY, EC_LIBRARY_VERSION};
pub use geometry::{ChunkPos, ExtentSegment, StripeGeometry};
pub use object::{ChunkRead, ErasureCode, ReadMode, ReadPlan};
pub use ranges::RangeReadPlan;
pub use rmw::{
    plan_truncate, plan_write, plan_write_full, ShardRollback, ShardWrite, WriteKind, WritePlan,
};
pub use work::WORK_CACHE_MAX_BYTES;
