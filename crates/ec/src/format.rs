//! The on-disk format of erasure-coded chunks: which library and code
//! produce the parity bytes, how logical bytes are laid out in chunks, and
//! the per-chunk metadata record the OSD keeps beside each chunk. Chunks
//! written under a format version must decode under every later build; the
//! golden-vector test (`tests/golden.rs`) pins the parity bytes.

use serde::{Deserialize, Serialize};

use cairn_types::{decode_versioned, encode_versioned, DecodeError};

use crate::error::{EcError, Result};

/// Version of the chunk format described by the constants below. Bump it
/// (and keep decoding the old one) if any of them changes meaning.
pub const EC_FORMAT_VERSION: u8 = 1;

/// Library that computes parity in format version 1.
pub const EC_LIBRARY: &str = "reed-solomon-simd";

/// Exact library version format version 1 was written and tested with.
pub const EC_LIBRARY_VERSION: &str = "3.1.0";

/// The code and layout of format version 1, in words.
pub const EC_LAYOUT_V1: &str = "systematic Reed-Solomon over GF(2^16) (Leopard-RS FFT construction as \
implemented by reed-solomon-simd's DefaultRate for the given k,m); chunks 0..k are the data chunks, \
chunks k..k+m are recovery shards 0..m; chunk i holds stripe unit i of every stripe, stripe s at chunk \
offset s*stripe_unit; the last stripe is zero-padded to full width; stripe_unit is a multiple of 64 bytes \
so each 64-byte block of a chunk is coded independently of the others";

/// Stripe units are multiples of this (the library's coding block).
pub const STRIPE_UNIT_ALIGN_BYTES: u64 = 64;

/// Largest stripe unit accepted (bounds per-stripe buffers).
pub const MAX_STRIPE_UNIT_BYTES: u64 = 16 << 20;

/// Largest k+m (the limit; placement rarely has more failure domains).
pub const MAX_CHUNKS: usize = 32;

/// Default stripe unit for new profiles (Ceph's default too).
pub const DEFAULT_STRIPE_UNIT_BYTES: u64 = 4096;

/// Upper bound for an encoded [`ChunkInfo`] (it is a few dozen bytes).
const CHUNK_INFO_LIMIT_BYTES: usize = 256;

/// Per-chunk record the OSD stores with each chunk (e.g. as an xattr): which
/// code wrote it, where it sits, the object's logical size, and the crc32c
/// of the whole chunk. Encoded as `[EC_FORMAT_VERSION][postcard]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkInfo {
    pub k: u8,
    pub m: u8,
    pub stripe_unit_bytes: u32,
    /// Which chunk of the object this is, `0..k+m` (= position in acting set).
    pub shard: u8,
    /// The object's logical size (the chunks are padded to whole stripes).
    pub logical_size_bytes: u64,
    /// crc32c of the whole chunk as stored.
    pub chunk_crc32c: u32,
}

impl ChunkInfo {
    /// The code that wrote this chunk (to decode it, whatever the pool's
    /// profile says today).
    pub fn erasure_code(&self) -> Result<crate::ErasureCode> {
        crate::ErasureCode::new(
            self.k as usize,
            self.m as usize,
            u64::from(self.stripe_unit_bytes),
        )
    }

    pub fn encode(&self) -> Vec<u8> {
        encode_versioned(EC_FORMAT_VERSION, self)
    }

    pub fn decode(buf: &[u8]) -> Result<Self> {
        let (_, info): (u8, ChunkInfo) = decode_versioned(
            "EC chunk info",
            buf,
            1,
            EC_FORMAT_VERSION,
            CHUNK_INFO_LIMIT_BYTES,
        )
        .map_err(|e| match e {
            DecodeError::UnsupportedVersion {
                what,
                found,
                min,
                max,
            } => EcError::UnsupportedFormat {
                what,
                found,
                min,
                max,
            },
            other => EcError::Malformed {
                what: "EC chunk info",
                reason: other.to_string(),
            },
        })?;
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_info_roundtrip_and_version_check() {
        let info = ChunkInfo {
            k: 4,
            m: 2,
            stripe_unit_bytes: 4096,
            shard: 5,
            logical_size_bytes: 123_456,
            chunk_crc32c: 0xdead_beef,
        };
        let buf = info.encode();
        assert_eq!(buf[0], EC_FORMAT_VERSION);
        assert_eq!(ChunkInfo::decode(&buf).unwrap(), info);
        let code = info.erasure_code().unwrap();
        assert_eq!((code.k(), code.m()), (4, 2));
        let mut future = buf.clone();
        future[0] = EC_FORMAT_VERSION + 1;
        let err = ChunkInfo::decode(&future).unwrap_err();
        assert!(matches!(err, EcError::UnsupportedFormat { .. }), "{err}");
        assert!(ChunkInfo::decode(&[]).is_err());
        assert!(ChunkInfo::decode(&buf[..3]).is_err());
    }
}
