//! The block crcs of a received payload: what a connection that verified a
//! frame in crc mode computed on the way (see
//! [`crate::auth::FrameKey::verify_blocks`]), handed to the application so
//! that data it stores or forwards is not checksummed again. Owns the
//! lookup of a data slice's blocks; not the verification itself.

use bytes::Bytes;
use cairn_types::crc::{crc32c_of_blocks, CRC_BLOCK_BYTES};

/// Verified crc32c of the [`CRC_BLOCK_BYTES`] blocks of one received
/// payload, from payload offset `first` on. Every value was computed over
/// the bytes received and checked, combined, against the frame's crc: a
/// byte corrupted in transit fails the frame, so no crc of corrupted data
/// is ever handed out.
#[derive(Clone, PartialEq, Eq)]
pub struct BlockCrcs {
    /// The payload (kept so that a slice's address proves it is one of
    /// this payload's, not of a buffer that later took its memory).
    payload: Bytes,
    first: usize,
    crcs: Vec<u32>,
}

impl std::fmt::Debug for BlockCrcs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockCrcs")
            .field("payload_len", &self.payload.len())
            .field("first", &self.first)
            .field("blocks", &self.crcs.len())
            .finish()
    }
}

impl BlockCrcs {
    pub(crate) fn new(payload: Bytes, first: usize, crcs: Vec<u32>) -> BlockCrcs {
        BlockCrcs {
            payload,
            first,
            crcs,
        }
    }

    /// The crcs of the whole blocks `data` starts with, when `data` is a
    /// slice of this payload starting on one of its block boundaries
    /// (`data.len() / CRC_BLOCK_BYTES` of them; a short tail has none).
    /// `None` for any other slice, or one shorter than a block.
    pub fn of(&self, data: &[u8]) -> Option<&[u32]> {
        let base = self.payload.as_ptr() as usize;
        let at = (data.as_ptr() as usize).checked_sub(base)?;
        if data.len() < CRC_BLOCK_BYTES || at + data.len() > self.payload.len() || at < self.first {
            return None;
        }
        let off = at - self.first;
        if !off.is_multiple_of(CRC_BLOCK_BYTES) {
            return None;
        }
        let b0 = off / CRC_BLOCK_BYTES;
        self.crcs.get(b0..b0 + data.len() / CRC_BLOCK_BYTES)
    }

    /// The crc32c of all of `data` from its blocks' crcs (and a pass over
    /// its short tail only), when [`BlockCrcs::of`] knows its blocks.
    pub fn crc_of(&self, data: &[u8]) -> Option<u32> {
        crc_from_blocks(self.of(data)?, data)
    }
}

/// The crc32c of all of `data` from `crcs`, the crcs of its leading
/// [`CRC_BLOCK_BYTES`] blocks (and a pass over the rest only); `None` when
/// `crcs` name more blocks than `data` has.
pub fn crc_from_blocks(crcs: &[u32], data: &[u8]) -> Option<u32> {
    let tail = data.get(crcs.len() * CRC_BLOCK_BYTES..)?;
    Some(crc32c::crc32c_append(crc32c_of_blocks(crcs), tail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_need_a_block_boundary_of_this_payload() {
        let payload = Bytes::from((0..20_000u32).map(|i| (i * 7) as u8).collect::<Vec<_>>());
        let first = 100;
        let crcs: Vec<u32> = payload[first..]
            .chunks_exact(CRC_BLOCK_BYTES)
            .map(crc32c::crc32c)
            .collect();
        let b = BlockCrcs::new(payload.clone(), first, crcs.clone());
        let data = payload.slice(first + CRC_BLOCK_BYTES..first + 3 * CRC_BLOCK_BYTES + 10);
        assert_eq!(b.of(&data), Some(&crcs[1..3]));
        assert_eq!(b.crc_of(&data), Some(crc32c::crc32c(&data)));
        // Off a boundary, before `first`, too short, or another buffer.
        assert_eq!(b.of(&payload[first + 1..first + 1 + CRC_BLOCK_BYTES]), None);
        assert_eq!(b.of(&payload[..CRC_BLOCK_BYTES]), None);
        assert_eq!(b.of(&payload[first..first + 10]), None);
        let copy = data.to_vec();
        assert_eq!(b.of(&copy), None);
        // The last whole block is known, the tail is not.
        let end = first + 4 * CRC_BLOCK_BYTES;
        assert_eq!(b.of(&payload[end..]), None);
        assert_eq!(b.of(&payload[end - CRC_BLOCK_BYTES..]), Some(&crcs[3..4]));
    }
}
