//! Read-modify-write planning for writes to erasure-coded objects: which old
//! chunk ranges to read, the new bytes of every shard's touched range, and
//! the rollback record each shard keeps (in its PG log entry) so that an
//! interrupted write can be undone on every shard. Deciding *when* to roll
//! back or forward, and storing the records, is the OSD's job.
//!
//! A [`ShardWrite`] means: set the chunk's length to `new_chunk_len`
//! (zero-extending or truncating), then write `data` at `offset`. A
//! [`ShardRollback`] means: set the length back to `old_chunk_len`, then
//! write the saved `old_bytes` at `offset`. Both are idempotent, and the
//! rollback is correct whether the write was not applied, applied, or torn
//! anywhere inside its range.

use std::ops::Range;

use bytes::{Buf, BufMut, Bytes};

use crate::error::{EcError, Result};
use crate::geometry::checked_end;
use crate::object::{check_results, ChunkRead, ErasureCode};

/// What kind of write a plan is; the pool's `allow_ec_overwrites` decides
/// which kinds are accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    /// Replaces the whole object (`write_full`): no reads.
    Full,
    /// Starts at or past the current end: never changes existing logical
    /// bytes (only the zero padding and the parity of the last stripe).
    /// Stripe-aligned appends need no reads.
    Append,
    /// Changes existing bytes: needs `allow_ec_overwrites`.
    Overwrite,
    /// Sets the logical size. Extending, or shrinking to a stripe boundary,
    /// only changes chunk lengths; shrinking into a stripe rewrites that
    /// stripe (its tail becomes zero padding) and needs `allow_ec_overwrites`.
    Truncate,
}

/// The plan of one write: what to read, then [`WritePlan::build`] makes the
/// per-shard writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WritePlan {
    code: ErasureCode,
    kind: WriteKind,
    old_size: u64,
    offset: u64,
    len: u64,
    new_size: u64,
    stripes: Range<u64>,
    reads: Vec<ChunkRead>,
}

/// Shard writes and, per write, its data's 4 KiB block crcs if known
/// (see [`WritePlan::build_with_crcs`]).
pub type ShardWritesWithCrcs = (Vec<ShardWrite>, Vec<Option<Vec<u32>>>);

/// New bytes for one shard's chunk. Sent to the OSD at `acting[shard]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardWrite {
    pub shard: usize,
    pub offset: u64,
    pub data: Bytes,
    pub old_chunk_len: u64,
    pub new_chunk_len: u64,
}

/// What a shard saves before applying a [`ShardWrite`]: enough to restore
/// its chunk exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardRollback {
    pub shard: usize,
    pub offset: u64,
    pub old_bytes: Bytes,
    pub old_chunk_len: u64,
}

/// Plans writing `len` bytes at `offset` into an object of `old_size` bytes.
/// Overwrites of existing bytes are refused unless `allow_overwrites`.
pub fn plan_write(
    code: &ErasureCode,
    old_size: u64,
    offset: u64,
    len: u64,
    allow_overwrites: bool,
) -> Result<WritePlan> {
    let end = checked_end(offset, len)?;
    checked_end(old_size, 0)?;
    let g = code.geometry();
    if len == 0 {
        return Ok(WritePlan {
            code: *code,
            kind: WriteKind::Append,
            old_size,
            offset,
            len,
            new_size: old_size,
            stripes: 0..0,
            reads: Vec::new(),
        });
    }
    let kind = if offset >= old_size {
        WriteKind::Append
    } else {
        WriteKind::Overwrite
    };
    if kind == WriteKind::Overwrite && !allow_overwrites {
        return Err(EcError::OverwritesDisabled {
            offset,
            end,
            old_size,
        });
    }
    let stripes = g.stripes_touched(offset, len)?;
    let su = g.stripe_unit_bytes();
    let width = g.stripe_width_bytes();
    let mut per_shard: Vec<Vec<Range<u64>>> = vec![Vec::new(); code.k()];
    let edge_stripes = [stripes.start, stripes.end - 1];
    for (n, &s) in edge_stripes.iter().enumerate() {
        if n == 1 && s == stripes.start {
            break;
        }
        for (shard, ranges) in per_shard.iter_mut().enumerate() {
            let unit = s * width + shard as u64 * su..s * width + (shard as u64 + 1) * su;
            let has_old_data = unit.start < old_size;
            let fully_written = offset <= unit.start && unit.end <= end;
            if has_old_data && !fully_written {
                let r = s * su..(s + 1) * su;
                match ranges.last_mut() {
                    Some(prev) if prev.end == r.start => prev.end = r.end,
                    _ => ranges.push(r),
                }
            }
        }
    }
    let reads = per_shard
        .into_iter()
        .enumerate()
        .flat_map(|(shard, rs)| rs.into_iter().map(move |range| ChunkRead { shard, range }))
        .collect();
    Ok(WritePlan {
        code: *code,
        kind,
        old_size,
        offset,
        len,
        new_size: old_size.max(end),
        stripes,
        reads,
    })
}

/// Plans replacing an object of `old_size` bytes by `new_len` bytes.
pub fn plan_write_full(code: &ErasureCode, old_size: u64, new_len: u64) -> Result<WritePlan> {
    checked_end(old_size, 0)?;
    checked_end(new_len, 0)?;
    Ok(WritePlan {
        code: *code,
        kind: WriteKind::Full,
        old_size,
        offset: 0,
        len: new_len,
        new_size: new_len,
        stripes: 0..code.geometry().stripe_count(new_len),
        reads: Vec::new(),
    })
}

/// Plans setting the size of an object of `old_size` bytes to `new_size`.
pub fn plan_truncate(
    code: &ErasureCode,
    old_size: u64,
    new_size: u64,
    allow_overwrites: bool,
) -> Result<WritePlan> {
    checked_end(new_size, 0)?;
    checked_end(old_size, 0)?;
    let g = code.geometry();
    let width = g.stripe_width_bytes();
    let su = g.stripe_unit_bytes();
    let mut stripes = 0..0;
    let mut reads = Vec::new();
    if new_size < old_size && !new_size.is_multiple_of(width) {
        if !allow_overwrites {
            return Err(EcError::OverwritesDisabled {
                offset: new_size,
                end: old_size,
                old_size,
            });
        }
        let s = new_size / width;
        stripes = s..s + 1;
        for shard in 0..code.k() {
            if s * width + shard as u64 * su < new_size {
                reads.push(ChunkRead {
                    shard,
                    range: s * su..(s + 1) * su,
                });
            }
        }
    }
    Ok(WritePlan {
        code: *code,
        kind: WriteKind::Truncate,
        old_size,
        offset: new_size,
        len: 0,
        new_size,
        stripes,
        reads,
    })
}

impl WritePlan {
    pub fn kind(&self) -> WriteKind {
        self.kind
    }

    pub fn old_size(&self) -> u64 {
        self.old_size
    }

    /// Logical range of the new bytes (empty for a truncate).
    pub fn extent(&self) -> Range<u64> {
        self.offset..self.offset + self.len
    }

    /// Logical size after the write.
    pub fn new_size(&self) -> u64 {
        self.new_size
    }

    /// Stripes rewritten on every shard (empty when only chunk lengths
    /// change, or for a zero-length write).
    pub fn stripes(&self) -> Range<u64> {
        self.stripes.clone()
    }

    /// Old data-chunk ranges to read first (whole stripe units of partly
    /// overwritten stripes). When some chunks' OSDs are down, pass these to
    /// [`ErasureCode::plan_range_reads`], which decodes them from `k` others.
    pub fn reads(&self) -> &[ChunkRead] {
        &self.reads
    }

    /// Builds the `k + m` shard writes from the new bytes (`data.len() ==
    /// len`) and the old bytes read for [`WritePlan::reads`], in that order.
    /// Returns nothing for a zero-length extent write.
    pub fn build(&self, data: &Bytes, old_reads: &[Bytes]) -> Result<Vec<ShardWrite>> {
        Ok(self.build_with_crcs(data, old_reads, None)?.0)
    }

    /// [`WritePlan::build`] that also returns, per shard write, the crc32c
    /// of each 4 KiB block of its data when the encoder produced them (a
    /// full-object write whose stripe unit is a multiple of 4 KiB; see
    /// [`ErasureCode::encode_with_crcs`]), `None` otherwise. `data_crcs`:
    /// the verified crcs of `data`'s own 4 KiB blocks, if known.
    pub fn build_with_crcs(
        &self,
        data: &Bytes,
        old_reads: &[Bytes],
        data_crcs: Option<&[u32]>,
    ) -> Result<ShardWritesWithCrcs> {
        let none = |n: usize| vec![None; n];
        if data.len() as u64 != self.len {
            return Err(EcError::PlanMismatch {
                reason: format!("plan is for {} bytes, {} given", self.len, data.len()),
            });
        }
        check_results(&self.reads, old_reads)?;
        let g = self.code.geometry();
        let old_chunk_len = g.chunk_len(self.old_size);
        let new_chunk_len = g.chunk_len(self.new_size);
        if self.stripes.is_empty() {
            if self.kind == WriteKind::Append || self.kind == WriteKind::Overwrite {
                return Ok((Vec::new(), Vec::new())); // zero-length write
            }
            // Only the chunk length changes (empty full write, or a
            // truncate that rewrites no stripe).
            let total = self.code.total();
            return Ok((
                self.shard_writes(
                    old_chunk_len.min(new_chunk_len),
                    vec![Bytes::new(); total],
                    old_chunk_len,
                    new_chunk_len,
                ),
                none(total),
            ));
        }
        let (chunks, crcs) = if self.kind == WriteKind::Full {
            let (chunks, crcs) = self.code.encode_with_crcs(data, data_crcs)?;
            let crcs = match crcs {
                Some(c) => c.into_iter().map(Some).collect(),
                None => none(chunks.len()),
            };
            (chunks, crcs)
        } else {
            let chunks = self.rewrite_stripes(data, old_reads)?;
            let n = chunks.len();
            (chunks, none(n))
        };
        let start = g.chunk_range_of_stripes(&self.stripes).start;
        // Shard writes start on stripe-unit boundaries, so per-unit
        // checksums (`block_crc32c` with block = stripe_unit) line up.
        debug_assert!(start.is_multiple_of(g.stripe_unit_bytes()));
        Ok((
            self.shard_writes(start, chunks, old_chunk_len, new_chunk_len),
            crcs,
        ))
    }

    /// New chunks for the stripes of an extent write or truncate: old bytes
    /// read, new bytes laid over them, everything past the new size zero.
    fn rewrite_stripes(&self, data: &Bytes, old_reads: &[Bytes]) -> Result<Vec<Bytes>> {
        let g = self.code.geometry();
        let range = g.chunk_range_of_stripes(&self.stripes);
        let span = (range.end - range.start) as usize;
        let mut bufs: Vec<Vec<u8>> = vec![vec![0u8; span]; self.code.k()];
        for (read, bytes) in self.reads.iter().zip(old_reads) {
            let at = (read.range.start - range.start) as usize;
            bufs[read.shard][at..at + bytes.len()].copy_from_slice(bytes);
        }
        for seg in g.map_extent(self.offset, self.len)? {
            let at = (seg.chunk_offset - range.start) as usize;
            let from = (seg.logical_offset - self.offset) as usize;
            bufs[seg.shard][at..at + seg.len as usize]
                .copy_from_slice(&data[from..from + seg.len as usize]);
        }
        // Bytes at or past the new size are padding: zero (a shrinking
        // truncate read old data there).
        let new_end = g
            .padded_size(self.new_size)
            .min(self.stripes.end * g.stripe_width_bytes());
        if self.new_size < new_end {
            for seg in g.map_extent(self.new_size, new_end - self.new_size)? {
                let at = (seg.chunk_offset - range.start) as usize;
                bufs[seg.shard][at..at + seg.len as usize].fill(0);
            }
        }
        let parity = self.code.codec().encode_parity(&bufs)?;
        Ok(bufs.into_iter().map(Bytes::from).chain(parity).collect())
    }

    fn shard_writes(
        &self,
        offset: u64,
        chunks: Vec<Bytes>,
        old_chunk_len: u64,
        new_chunk_len: u64,
    ) -> Vec<ShardWrite> {
        chunks
            .into_iter()
            .enumerate()
            .map(|(shard, data)| ShardWrite {
                shard,
                offset,
                data,
                old_chunk_len,
                new_chunk_len,
            })
            .collect()
    }
}

impl ShardWrite {
    fn end(&self) -> u64 {
        self.offset.saturating_add(self.data.len() as u64)
    }

    /// The range of the current (old) chunk the shard must save before
    /// applying this write: everything the write changes or truncates.
    pub fn rollback_range(&self) -> Range<u64> {
        let start = self.offset.min(self.new_chunk_len).min(self.old_chunk_len);
        let mut end = self.end();
        if self.new_chunk_len < self.old_chunk_len {
            end = end.max(self.old_chunk_len);
        }
        start..end.min(self.old_chunk_len).max(start)
    }

    /// Makes the rollback record from the old bytes of
    /// [`rollback_range`](Self::rollback_range).
    pub fn rollback(&self, old_bytes: Bytes) -> Result<ShardRollback> {
        let range = self.rollback_range();
        if old_bytes.len() as u64 != range.end - range.start {
            return Err(EcError::PlanMismatch {
                reason: format!(
                    "shard {}: rollback needs old bytes {:?} ({} bytes), {} given",
                    self.shard,
                    range,
                    range.end - range.start,
                    old_bytes.len()
                ),
            });
        }
        Ok(ShardRollback {
            shard: self.shard,
            offset: range.start,
            old_bytes,
            old_chunk_len: self.old_chunk_len,
        })
    }

    /// Convenience for in-memory chunks: saves the rollback, then applies.
    pub fn apply_with_rollback(&self, chunk: &mut Vec<u8>) -> Result<ShardRollback> {
        self.check_old_len(chunk)?;
        let r = self.rollback_range();
        let old = Bytes::copy_from_slice(&chunk[r.start as usize..r.end as usize]);
        let rollback = self.rollback(old)?;
        self.apply(chunk)?;
        Ok(rollback)
    }

    /// Applies the write to an in-memory chunk of `old_chunk_len` bytes
    /// (or `new_chunk_len`, when re-applying).
    pub fn apply(&self, chunk: &mut Vec<u8>) -> Result<()> {
        if chunk.len() as u64 != self.new_chunk_len {
            self.check_old_len(chunk)?;
        }
        if self.end() > self.new_chunk_len {
            return Err(EcError::Malformed {
                what: "EC shard write",
                reason: format!(
                    "shard {}: bytes {}..{} lie past the new chunk length {}",
                    self.shard,
                    self.offset,
                    self.end(),
                    self.new_chunk_len
                ),
            });
        }
        chunk.resize(self.new_chunk_len as usize, 0);
        chunk[self.offset as usize..self.end() as usize].copy_from_slice(&self.data);
        Ok(())
    }

    /// crc32c of each `block_bytes` block of the new data, and the index of
    /// the first block in the chunk. With `block_bytes = stripe_unit` these
    /// replace the shard's stored per-unit checksums from that index on;
    /// blocks at or past `new_chunk_len / block_bytes` no longer exist.
    pub fn block_crc32c(&self, block_bytes: u64) -> Result<(u64, Vec<u32>)> {
        if block_bytes == 0 || !self.offset.is_multiple_of(block_bytes) {
            return Err(EcError::Malformed {
                what: "checksum block size",
                reason: format!(
                    "{block_bytes} bytes does not divide the write offset {}",
                    self.offset
                ),
            });
        }
        let crcs = crate::crc::block_crc32c(&self.data, block_bytes as usize)?;
        Ok((self.offset / block_bytes, crcs))
    }

    /// `[version][shard u8][offset u64][old_chunk_len u64][new_chunk_len u64]
    /// [len u64][data]`, little-endian: the message body the primary sends
    /// to `acting[shard]`.
    pub fn encode(&self) -> Bytes {
        encode_record(
            WRITE_FORMAT_VERSION,
            self.shard,
            self.offset,
            &[self.old_chunk_len, self.new_chunk_len],
            &self.data,
        )
    }

    /// Decodes [`encode`](Self::encode)'s output without copying the data,
    /// checking that the write fits in its new chunk length.
    pub fn decode(buf: Bytes) -> Result<Self> {
        let (shard, offset, [old_chunk_len, new_chunk_len], data) =
            decode_record(buf, "EC shard write", WRITE_FORMAT_VERSION, "new")?;
        Ok(Self {
            shard,
            offset,
            data,
            old_chunk_len,
            new_chunk_len,
        })
    }

    fn check_old_len(&self, chunk: &[u8]) -> Result<()> {
        if chunk.len() as u64 != self.old_chunk_len {
            return Err(EcError::ChunkLength {
                index: self.shard,
                len: chunk.len() as u64,
                expected: self.old_chunk_len,
            });
        }
        Ok(())
    }
}

/// Version byte of the encoded [`ShardWrite`].
const WRITE_FORMAT_VERSION: u8 = 1;

/// Version byte of the encoded [`ShardRollback`].
const ROLLBACK_FORMAT_VERSION: u8 = 1;

/// `[version][shard u8][offset u64][lens: u64 each][len u64][payload]`,
/// little-endian: the layout [`ShardWrite`] and [`ShardRollback`] share.
fn encode_record(version: u8, shard: usize, offset: u64, lens: &[u64], payload: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(1 + 1 + 8 * (lens.len() + 2) + payload.len());
    out.put_u8(version);
    out.put_u8(shard as u8);
    out.put_u64_le(offset);
    for l in lens {
        out.put_u64_le(*l);
    }
    out.put_u64_le(payload.len() as u64);
    out.extend_from_slice(payload);
    Bytes::from(out)
}

/// Decodes [`encode_record`]'s output without copying the payload: the
/// shard, the offset, the `N` lengths and the payload, checking the version
/// and that `offset + len` fits in the last length (the `limit` chunk).
fn decode_record<const N: usize>(
    buf: Bytes,
    what: &'static str,
    version: u8,
    limit: &str,
) -> Result<(usize, u64, [u64; N], Bytes)> {
    let header = 1 + 1 + 8 * (N + 2);
    let malformed = |reason: String| EcError::Malformed { what, reason };
    if buf.len() < header {
        return Err(malformed(format!(
            "{} bytes, header needs {header}",
            buf.len()
        )));
    }
    let mut b = buf.clone();
    let found = b.get_u8();
    if found != version {
        return Err(EcError::UnsupportedFormat {
            what,
            found,
            min: version,
            max: version,
        });
    }
    let shard = b.get_u8() as usize;
    let offset = b.get_u64_le();
    let mut lens = [0u64; N];
    for l in lens.iter_mut() {
        *l = b.get_u64_le();
    }
    let len = b.get_u64_le();
    if len != b.remaining() as u64 {
        return Err(malformed(format!(
            "says {len} bytes follow, {} do",
            b.remaining()
        )));
    }
    let chunk = lens.last().copied().unwrap_or(0);
    if offset.checked_add(len).is_none_or(|end| end > chunk) {
        return Err(malformed(format!(
            "range {offset}+{len} lies outside the {limit} chunk of {chunk} bytes"
        )));
    }
    Ok((shard, offset, lens, buf.slice(header..)))
}

impl ShardRollback {
    /// Restores an in-memory chunk to its state before the write.
    pub fn apply(&self, chunk: &mut Vec<u8>) -> Result<()> {
        let end = self.offset.checked_add(self.old_bytes.len() as u64);
        if end.is_none_or(|end| end > self.old_chunk_len) {
            return Err(EcError::Malformed {
                what: "EC rollback record",
                reason: format!(
                    "shard {}: {} bytes at {} lie past the old chunk length {}",
                    self.shard,
                    self.old_bytes.len(),
                    self.offset,
                    self.old_chunk_len
                ),
            });
        }
        chunk.resize(self.old_chunk_len as usize, 0);
        let at = self.offset as usize;
        chunk[at..at + self.old_bytes.len()].copy_from_slice(&self.old_bytes);
        Ok(())
    }

    /// `[version][shard u8][offset u64][old_chunk_len u64][len u64][bytes]`,
    /// little-endian, for the PG log.
    pub fn encode(&self) -> Bytes {
        encode_record(
            ROLLBACK_FORMAT_VERSION,
            self.shard,
            self.offset,
            &[self.old_chunk_len],
            &self.old_bytes,
        )
    }

    /// Decodes [`encode`](Self::encode)'s output without copying the bytes.
    pub fn decode(buf: Bytes) -> Result<Self> {
        let (shard, offset, [old_chunk_len], old_bytes) =
            decode_record(buf, "EC rollback record", ROLLBACK_FORMAT_VERSION, "old")?;
        Ok(Self {
            shard,
            offset,
            old_bytes,
            old_chunk_len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code() -> ErasureCode {
        ErasureCode::new(2, 1, 64).unwrap()
    }

    #[test]
    fn overwrite_needs_the_flag() {
        let err = plan_write(&code(), 1000, 10, 5, false).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("allow_ec_overwrites"), "{msg}");
        assert!(plan_write(&code(), 1000, 1000, 5, false).is_ok());
        assert!(plan_write(&code(), 1000, 2000, 5, false).is_ok());
        assert!(plan_write(&code(), 1000, 10, 5, true).is_ok());
    }

    #[test]
    fn absurd_sizes_are_refused_not_overflowed() {
        let big = u64::MAX - 3;
        assert!(plan_write(&code(), big, 0, 1, true).is_err());
        assert!(plan_write(&code(), 0, big, 1, true).is_err());
        assert!(plan_write_full(&code(), big, 1).is_err());
        assert!(plan_truncate(&code(), 0, big, true).is_err());
        assert!(code().plan_read(big, 0, 1, &[true; 3]).is_err());
    }

    #[test]
    fn truncate_rules() {
        // 2+1, su 64: stripe width 128.
        let extend = plan_truncate(&code(), 100, 1000, false).unwrap();
        assert!(extend.stripes.is_empty() && extend.reads.is_empty());
        let aligned = plan_truncate(&code(), 1000, 256, false).unwrap();
        assert!(aligned.stripes.is_empty());
        let err = plan_truncate(&code(), 1000, 300, false).unwrap_err();
        assert!(err.to_string().contains("allow_ec_overwrites"), "{err}");
        let cut = plan_truncate(&code(), 1000, 300, true).unwrap();
        assert_eq!(cut.stripes, 2..3);
        // 300 = 2*128 + 44: only shard 0 of stripe 2 keeps data.
        assert_eq!(
            cut.reads,
            vec![ChunkRead {
                shard: 0,
                range: 128..192
            }]
        );
        let writes = cut
            .build(&Bytes::new(), &[Bytes::from(vec![5u8; 64])])
            .unwrap();
        assert_eq!(writes.len(), 3);
        assert!(writes
            .iter()
            .all(|w| w.new_chunk_len == 192 && w.offset == 128));
        assert_eq!(&writes[0].data[..44], &[5u8; 44][..]);
        assert!(writes[0].data[44..].iter().all(|b| *b == 0));
    }

    #[test]
    fn aligned_append_reads_nothing() {
        let plan = plan_write(&code(), 256, 256, 300, false).unwrap();
        assert_eq!(plan.kind, WriteKind::Append);
        assert!(plan.reads.is_empty());
        assert_eq!(plan.stripes, 2..5);
        assert_eq!(plan.new_size, 556);
    }

    #[test]
    fn unaligned_append_reads_last_stripe_units() {
        // old size 100: stripe 0 has shard 0 full (64) and shard 1 partly (36).
        let plan = plan_write(&code(), 100, 100, 10, false).unwrap();
        assert_eq!(
            plan.reads,
            vec![
                ChunkRead {
                    shard: 0,
                    range: 0..64
                },
                ChunkRead {
                    shard: 1,
                    range: 0..64
                }
            ]
        );
    }

    #[test]
    fn middle_stripes_are_not_read() {
        let plan = plan_write(&code(), 10_000, 100, 1000, true).unwrap();
        assert_eq!(plan.stripes, 0..9);
        for r in &plan.reads {
            assert!(r.range.start == 0 || r.range.start == 8 * 64, "{r:?}");
        }
    }

    #[test]
    fn rollback_record_roundtrip_and_checks() {
        let rb = ShardRollback {
            shard: 3,
            offset: 64,
            old_bytes: Bytes::from_static(b"0123456789"),
            old_chunk_len: 128,
        };
        let enc = rb.encode();
        assert_eq!(ShardRollback::decode(enc.clone()).unwrap(), rb);
        assert!(ShardRollback::decode(enc.slice(..10)).is_err());
        assert!(ShardRollback::decode(enc.slice(..enc.len() - 1)).is_err());
        let mut bad = enc.to_vec();
        bad[0] = 9;
        assert!(matches!(
            ShardRollback::decode(Bytes::from(bad)),
            Err(EcError::UnsupportedFormat { found: 9, .. })
        ));
    }

    #[test]
    fn shard_write_roundtrip_and_block_crcs() {
        let plan = plan_write(&code(), 0, 0, 300, false).unwrap();
        let writes = plan.build(&Bytes::from(vec![9u8; 300]), &[]).unwrap();
        for w in &writes {
            let enc = w.encode();
            let back = ShardWrite::decode(enc.clone()).unwrap();
            assert_eq!(&back, w);
            assert!(ShardWrite::decode(enc.slice(..enc.len() - 1)).is_err());
            let (first, crcs) = w.block_crc32c(64).unwrap();
            assert_eq!(first, 0);
            assert_eq!(crcs.len(), 3);
            assert_eq!(crcs[1], crate::chunk_crc32c(&w.data[64..128]));
        }
        assert!(writes[0].block_crc32c(0).is_err());
        let mut bad = writes[0].encode().to_vec();
        bad[0] = 7;
        assert!(matches!(
            ShardWrite::decode(Bytes::from(bad)),
            Err(EcError::UnsupportedFormat { found: 7, .. })
        ));
        let past_end = ShardWrite {
            new_chunk_len: 10,
            ..writes[0].clone()
        };
        assert!(ShardWrite::decode(past_end.encode()).is_err());
    }

    #[test]
    fn build_checks_its_inputs() {
        let plan = plan_write(&code(), 100, 10, 5, true).unwrap();
        assert!(plan.build(&Bytes::from_static(b"abc"), &[]).is_err());
        assert!(plan.build(&Bytes::from_static(b"abcde"), &[]).is_err());
        let w = ShardWrite {
            shard: 0,
            offset: 0,
            data: Bytes::from_static(&[1; 64]),
            old_chunk_len: 64,
            new_chunk_len: 64,
        };
        assert!(w.apply(&mut vec![0u8; 3]).is_err());
        assert!(w.rollback(Bytes::new()).is_err());
        let past_end = ShardWrite {
            new_chunk_len: 32,
            ..w
        };
        assert!(past_end.apply(&mut vec![0u8; 64]).is_err());
        let rb = ShardRollback {
            shard: 0,
            offset: 60,
            old_bytes: Bytes::from_static(&[0; 8]),
            old_chunk_len: 64,
        };
        assert!(rb.apply(&mut Vec::new()).is_err());
    }
}
