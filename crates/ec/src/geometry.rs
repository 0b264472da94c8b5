//! Stripe geometry: how an object's logical bytes map onto k data chunks.
//! Pure arithmetic on offsets; it knows nothing of coding or of parity
//! chunks (those have the same length and stripe layout as data chunks).
//!
//! Layout: stripe `s` covers logical bytes `[s*W, (s+1)*W)` with
//! `W = k * stripe_unit`; inside it data chunk `i` holds the stripe unit
//! `[s*W + i*su, s*W + (i+1)*su)`, stored at chunk offset `s*su`. The last
//! stripe is zero-padded to full width, so every chunk of an object is
//! `stripe_count * su` bytes long and the logical size is kept beside it.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::error::{EcError, Result};
use crate::format::{MAX_STRIPE_UNIT_BYTES, STRIPE_UNIT_ALIGN_BYTES};

/// Geometry of one EC pool's stripes: `k` data chunks of `stripe_unit_bytes`
/// each per stripe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StripeGeometry {
    k: u64,
    stripe_unit_bytes: u64,
}

/// Where one logical byte lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkPos {
    pub stripe: u64,
    /// Data chunk index, `0..k`.
    pub shard: usize,
    /// Offset inside the stripe unit, `0..stripe_unit`.
    pub offset_in_unit: u64,
    /// Offset inside the chunk: `stripe * stripe_unit + offset_in_unit`.
    pub chunk_offset: u64,
}

/// A piece of a logical extent that lies inside one stripe unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtentSegment {
    pub logical_offset: u64,
    pub shard: usize,
    pub chunk_offset: u64,
    pub len: u64,
}

impl StripeGeometry {
    /// `k` data chunks per stripe, `stripe_unit_bytes` per chunk per stripe.
    /// The stripe unit must be a non-zero multiple of
    /// [`STRIPE_UNIT_ALIGN_BYTES`] (the coding library works on 64-byte
    /// blocks; alignment keeps every stripe independently codable) and at
    /// most [`MAX_STRIPE_UNIT_BYTES`].
    pub fn new(k: usize, stripe_unit_bytes: u64) -> Result<Self> {
        if k == 0 {
            return Err(EcError::InvalidProfile {
                k,
                m: 0,
                reason: "k must be at least 1".into(),
            });
        }
        if stripe_unit_bytes == 0 || !stripe_unit_bytes.is_multiple_of(STRIPE_UNIT_ALIGN_BYTES) {
            return Err(EcError::InvalidStripeUnit {
                stripe_unit_bytes,
                reason: format!(
                    "must be a non-zero multiple of {STRIPE_UNIT_ALIGN_BYTES} bytes (4096 is the usual choice)"
                ),
            });
        }
        if stripe_unit_bytes > MAX_STRIPE_UNIT_BYTES {
            return Err(EcError::InvalidStripeUnit {
                stripe_unit_bytes,
                reason: format!("must be at most {MAX_STRIPE_UNIT_BYTES} bytes"),
            });
        }
        Ok(Self {
            k: k as u64,
            stripe_unit_bytes,
        })
    }

    pub fn k(&self) -> usize {
        self.k as usize
    }

    pub fn stripe_unit_bytes(&self) -> u64 {
        self.stripe_unit_bytes
    }

    /// Logical bytes per stripe: `k * stripe_unit`.
    pub fn stripe_width_bytes(&self) -> u64 {
        self.k * self.stripe_unit_bytes
    }

    /// Stripes needed to hold `logical_size` bytes (the last one padded).
    pub fn stripe_count(&self, logical_size: u64) -> u64 {
        logical_size.div_ceil(self.stripe_width_bytes())
    }

    /// Length of every chunk (data and parity) of an object of `logical_size`.
    pub fn chunk_len(&self, logical_size: u64) -> u64 {
        self.stripe_count(logical_size) * self.stripe_unit_bytes
    }

    /// Logical size rounded up to whole stripes (what the chunks encode).
    pub fn padded_size(&self, logical_size: u64) -> u64 {
        self.stripe_count(logical_size) * self.stripe_width_bytes()
    }

    /// Where logical byte `logical_offset` lives.
    pub fn locate(&self, logical_offset: u64) -> ChunkPos {
        let width = self.stripe_width_bytes();
        let stripe = logical_offset / width;
        let in_stripe = logical_offset % width;
        let shard = (in_stripe / self.stripe_unit_bytes) as usize;
        let offset_in_unit = in_stripe % self.stripe_unit_bytes;
        ChunkPos {
            stripe,
            shard,
            offset_in_unit,
            chunk_offset: stripe * self.stripe_unit_bytes + offset_in_unit,
        }
    }

    /// Inverse of [`locate`](Self::locate): the logical offset of byte
    /// `chunk_offset` of data chunk `shard`.
    pub fn logical_offset(&self, shard: usize, chunk_offset: u64) -> Result<u64> {
        if shard as u64 >= self.k {
            return Err(EcError::ChunkIndex {
                index: shard,
                total: self.k(),
            });
        }
        let stripe = chunk_offset / self.stripe_unit_bytes;
        let in_unit = chunk_offset % self.stripe_unit_bytes;
        stripe
            .checked_mul(self.stripe_width_bytes())
            .and_then(|base| base.checked_add(shard as u64 * self.stripe_unit_bytes + in_unit))
            .ok_or(EcError::ExtentOverflow {
                offset: chunk_offset,
                len: 0,
            })
    }

    /// Stripes that the extent `[offset, offset+len)` touches (empty when
    /// `len == 0`).
    pub fn stripes_touched(&self, offset: u64, len: u64) -> Result<Range<u64>> {
        let end = checked_end(offset, len)?;
        if len == 0 {
            let s = offset / self.stripe_width_bytes();
            return Ok(s..s);
        }
        let width = self.stripe_width_bytes();
        Ok(offset / width..(end - 1) / width + 1)
    }

    /// Chunk byte range covering whole stripes `stripes`.
    pub fn chunk_range_of_stripes(&self, stripes: &Range<u64>) -> Range<u64> {
        stripes.start * self.stripe_unit_bytes..stripes.end * self.stripe_unit_bytes
    }

    /// Splits `[offset, offset+len)` into pieces that each lie inside one
    /// stripe unit, in logical order.
    pub fn map_extent(&self, offset: u64, len: u64) -> Result<Vec<ExtentSegment>> {
        let end = checked_end(offset, len)?;
        let su = self.stripe_unit_bytes;
        let mut out = Vec::with_capacity((len / su + 2) as usize);
        let mut pos = offset;
        while pos < end {
            let at = self.locate(pos);
            let piece = (su - at.offset_in_unit).min(end - pos);
            out.push(ExtentSegment {
                logical_offset: pos,
                shard: at.shard,
                chunk_offset: at.chunk_offset,
                len: piece,
            });
            pos += piece;
        }
        Ok(out)
    }

    /// For each data chunk, the contiguous chunk byte range holding its part
    /// of `[offset, offset+len)`, or `None` when the extent misses it.
    pub fn chunk_ranges(&self, offset: u64, len: u64) -> Result<Vec<Option<Range<u64>>>> {
        let end = checked_end(offset, len)?;
        let mut out: Vec<Option<Range<u64>>> = vec![None; self.k()];
        if len == 0 {
            return Ok(out);
        }
        let su = self.stripe_unit_bytes;
        let width = self.stripe_width_bytes();
        let first = self.locate(offset);
        let last = self.locate(end - 1);
        for (shard, slot) in out.iter_mut().enumerate() {
            let unit_start = shard as u64 * su;
            // First chunk byte: in the first stripe if the extent reaches this
            // unit there, else at the start of the unit in the next stripe.
            let start_logical = first.stripe * width + unit_start;
            let start = if offset < start_logical + su {
                let from = offset.max(start_logical);
                self.locate(from).chunk_offset
            } else {
                (first.stripe + 1) * su
            };
            let end_logical_unit = last.stripe * width + unit_start;
            let stop = if end > end_logical_unit {
                let to = end.min(end_logical_unit + su);
                last.stripe * su + (to - end_logical_unit)
            } else {
                last.stripe * su
            };
            if start < stop {
                *slot = Some(start..stop);
            }
        }
        Ok(out)
    }
}

/// Ends of extents are kept below this so that stripe arithmetic (which
/// rounds up to whole stripes) can never overflow.
pub const MAX_LOGICAL_OFFSET_BYTES: u64 = 1 << 60;

pub(crate) fn checked_end(offset: u64, len: u64) -> Result<u64> {
    offset
        .checked_add(len)
        .filter(|end| *end <= MAX_LOGICAL_OFFSET_BYTES)
        .ok_or(EcError::ExtentOverflow { offset, len })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rejects_bad_stripe_units() {
        assert!(StripeGeometry::new(2, 0).is_err());
        assert!(StripeGeometry::new(2, 100).is_err());
        assert!(StripeGeometry::new(0, 4096).is_err());
        assert!(StripeGeometry::new(2, MAX_STRIPE_UNIT_BYTES * 2).is_err());
        assert!(StripeGeometry::new(2, 64).is_ok());
    }

    #[test]
    fn sizes_and_padding() {
        let g = StripeGeometry::new(4, 4096).unwrap();
        assert_eq!(g.stripe_width_bytes(), 16384);
        assert_eq!(g.stripe_count(0), 0);
        assert_eq!(g.chunk_len(0), 0);
        assert_eq!(g.stripe_count(1), 1);
        assert_eq!(g.chunk_len(1), 4096);
        assert_eq!(g.chunk_len(16384), 4096);
        assert_eq!(g.chunk_len(16385), 8192);
        assert_eq!(g.padded_size(16385), 32768);
        assert_eq!(g.chunk_len(4 << 20), 1 << 20);
    }

    #[test]
    fn locate_examples() {
        let g = StripeGeometry::new(3, 64).unwrap();
        let p = g.locate(64 * 3 + 70);
        assert_eq!(
            (p.stripe, p.shard, p.offset_in_unit, p.chunk_offset),
            (1, 1, 6, 70)
        );
        assert_eq!(g.logical_offset(1, 70).unwrap(), 64 * 3 + 70);
        assert!(g.logical_offset(3, 0).is_err());
    }

    #[test]
    fn stripes_touched_examples() {
        let g = StripeGeometry::new(2, 64).unwrap();
        assert_eq!(g.stripes_touched(0, 0).unwrap(), 0..0);
        assert_eq!(g.stripes_touched(0, 128).unwrap(), 0..1);
        assert_eq!(g.stripes_touched(127, 2).unwrap(), 0..2);
        assert_eq!(g.stripes_touched(128, 1).unwrap(), 1..2);
        assert!(g.stripes_touched(u64::MAX, 2).is_err());
    }

    proptest! {
        #[test]
        fn locate_roundtrips(k in 1usize..9, su_blocks in 1u64..5, off in 0u64..1_000_000) {
            let g = StripeGeometry::new(k, su_blocks * 64).unwrap();
            let p = g.locate(off);
            prop_assert!(p.shard < k);
            prop_assert!(p.offset_in_unit < g.stripe_unit_bytes());
            prop_assert_eq!(g.logical_offset(p.shard, p.chunk_offset).unwrap(), off);
        }

        /// An extent maps to chunk pieces and back: pieces are contiguous,
        /// cover the extent exactly, stay inside one unit, agree with
        /// `locate`, lie inside the per-chunk ranges, and fill them.
        #[test]
        fn extent_maps_to_chunks_and_back(
            k in 1usize..9, su_blocks in 1u64..5, off in 0u64..50_000, len in 0u64..20_000,
        ) {
            let g = StripeGeometry::new(k, su_blocks * 64).unwrap();
            let segs = g.map_extent(off, len).unwrap();
            let ranges = g.chunk_ranges(off, len).unwrap();
            let mut pos = off;
            let mut per_shard = vec![0u64; k];
            for s in &segs {
                prop_assert_eq!(s.logical_offset, pos);
                prop_assert!(s.len > 0);
                let back = g.logical_offset(s.shard, s.chunk_offset).unwrap();
                prop_assert_eq!(back, pos);
                let last = g.locate(pos + s.len - 1);
                prop_assert_eq!(last.shard, s.shard);
                prop_assert_eq!(last.chunk_offset, s.chunk_offset + s.len - 1);
                let r = ranges[s.shard].clone().unwrap();
                prop_assert!(r.start <= s.chunk_offset && s.chunk_offset + s.len <= r.end);
                per_shard[s.shard] += s.len;
                pos += s.len;
            }
            prop_assert_eq!(pos, off + len);
            for (shard, r) in ranges.iter().enumerate() {
                let covered = r.as_ref().map_or(0, |r| r.end - r.start);
                prop_assert_eq!(covered, per_shard[shard]);
            }
            let stripes = g.stripes_touched(off, len).unwrap();
            if len > 0 {
                prop_assert_eq!(stripes.start, segs[0].logical_offset / g.stripe_width_bytes());
                prop_assert_eq!(stripes.end - 1, (off + len - 1) / g.stripe_width_bytes());
            } else {
                prop_assert!(stripes.is_empty());
            }
        }
    }
}
