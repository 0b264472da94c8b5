//! crc32c helpers for chunks at rest. A chunk (or chunk range) whose
//! checksum does not match is treated exactly like a missing chunk: the
//! caller drops it and decodes from the others, then repairs it. Storing
//! and scrubbing the checksums is the OSD's job, not this module's.

use bytes::Bytes;

use crate::error::{EcError, Result};

/// crc32c of a whole chunk (or of any byte range of one).
pub fn chunk_crc32c(chunk: &[u8]) -> u32 {
    crc32c::crc32c(chunk)
}

/// crc32c of each `block_bytes` block of `chunk` (the last may be short);
/// with `block_bytes = stripe_unit` this gives one checksum per stripe, so
/// partial reads and read-modify-writes verify and update only the stripes
/// they touch.
pub fn block_crc32c(chunk: &[u8], block_bytes: usize) -> Result<Vec<u32>> {
    if block_bytes == 0 {
        return Err(EcError::Malformed {
            what: "checksum block size",
            reason: "must be non-zero".into(),
        });
    }
    Ok(chunk.chunks(block_bytes).map(crc32c::crc32c).collect())
}

/// Replaces by `None` every chunk whose crc32c differs from `expected[i]`
/// (`None` in `expected` = no checksum known, keep the chunk). Returns the
/// indices dropped, so the caller can count them as missing and schedule
/// their repair.
pub fn drop_corrupt_chunks(
    chunks: &mut [Option<Bytes>],
    expected: &[Option<u32>],
) -> Result<Vec<usize>> {
    if chunks.len() != expected.len() {
        return Err(EcError::ChunkCount {
            count: expected.len(),
            expected: chunks.len(),
        });
    }
    let mut dropped = Vec::new();
    for (i, (slot, want)) in chunks.iter_mut().zip(expected).enumerate() {
        let bad = match (slot.as_ref(), want) {
            (Some(c), Some(w)) => chunk_crc32c(c) != *w,
            _ => false,
        };
        if bad {
            *slot = None;
            dropped.push(i);
        }
    }
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corrupt_chunk_counts_as_missing() {
        let a = Bytes::from_static(b"hello chunk zero");
        let b = Bytes::from_static(b"hello chunk one!");
        let crcs = [Some(chunk_crc32c(&a)), Some(chunk_crc32c(&b)), None];
        let mut flipped = b.to_vec();
        flipped[3] ^= 1;
        let mut chunks = vec![Some(a.clone()), Some(Bytes::from(flipped)), Some(a)];
        let dropped = drop_corrupt_chunks(&mut chunks, &crcs).unwrap();
        assert_eq!(dropped, vec![1]);
        assert!(chunks[0].is_some() && chunks[1].is_none() && chunks[2].is_some());
        assert!(drop_corrupt_chunks(&mut chunks, &crcs[..2]).is_err());
    }

    #[test]
    fn block_crcs_cover_the_chunk() {
        let data = vec![7u8; 200];
        let crcs = block_crc32c(&data, 64).unwrap();
        assert_eq!(crcs.len(), 4);
        assert_eq!(crcs[0], chunk_crc32c(&data[..64]));
        assert_eq!(crcs[3], chunk_crc32c(&data[192..]));
        assert!(block_crc32c(&data, 0).is_err());
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    }
}
