//! Reed-Solomon coding of equal-length chunk buffers: parity from data,
//! data from any k chunks, and rebuilding chosen chunks. Knows nothing of
//! stripes or logical sizes (see `geometry` and `object`); every buffer it
//! takes is one chunk (or the same byte range of every chunk).

use bytes::Bytes;
use reed_solomon_simd::ReedSolomonEncoder;

use crate::error::{EcError, Result};
use crate::format::{MAX_CHUNKS, STRIPE_UNIT_ALIGN_BYTES};
use crate::work::{lib_err, with_decoder, with_encoder};

/// A `k + m` Reed-Solomon code: chunks `0..k` carry data, `k..k+m` parity.
/// Any `k` of the `k + m` chunks determine all the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Codec {
    k: usize,
    m: usize,
}

impl Codec {
    /// `1 <= k`, `1 <= m`, `k + m <= 32`.
    pub fn new(k: usize, m: usize) -> Result<Self> {
        let invalid = |reason: &str| EcError::InvalidProfile {
            k,
            m,
            reason: reason.to_string(),
        };
        if k == 0 {
            return Err(invalid("k (data chunks) must be at least 1"));
        }
        if m == 0 {
            return Err(invalid(
                "m (coding chunks) must be at least 1; use a replicated pool for no redundancy",
            ));
        }
        if k + m > MAX_CHUNKS {
            return Err(invalid(&format!(
                "k+m must be at most {MAX_CHUNKS} (each chunk needs its own failure domain)"
            )));
        }
        if !ReedSolomonEncoder::supports(k, m) {
            return Err(invalid("not supported by the Reed-Solomon library"));
        }
        Ok(Self { k, m })
    }

    pub fn k(&self) -> usize {
        self.k
    }

    pub fn m(&self) -> usize {
        self.m
    }

    /// `k + m`.
    pub fn total(&self) -> usize {
        self.k + self.m
    }

    /// Computes the `m` parity chunks of `k` equal-length data chunks. The
    /// length must be a multiple of 64 bytes; it may be 0.
    pub fn encode_parity<T: AsRef<[u8]>>(&self, data: &[T]) -> Result<Vec<Bytes>> {
        if data.len() != self.k {
            return Err(EcError::ChunkCount {
                count: data.len(),
                expected: self.k,
            });
        }
        let len = data.first().map_or(0, |d| d.as_ref().len());
        for (index, d) in data.iter().enumerate() {
            check_len(index, d.as_ref().len(), len)?;
        }
        if len == 0 {
            return Ok(vec![Bytes::new(); self.m]);
        }
        with_encoder(self.k, self.m, len, |encoder| {
            for d in data {
                encoder.add_original_shard(d).map_err(lib_err)?;
            }
            let result = encoder.encode().map_err(lib_err)?;
            Ok(result.recovery_iter().map(Bytes::copy_from_slice).collect())
        })
    }

    /// Which chunks to read when `available[i]` says chunk `i` can be read:
    /// `k` of them, data chunks first (no decoding when all are there).
    pub fn choose_read_shards(&self, available: &[bool]) -> Result<Vec<usize>> {
        if available.len() != self.total() {
            return Err(EcError::ChunkCount {
                count: available.len(),
                expected: self.total(),
            });
        }
        let chosen: Vec<usize> = (0..self.total())
            .filter(|&i| available[i])
            .take(self.k)
            .collect();
        if chosen.len() < self.k {
            return Err(self.insufficient(available));
        }
        Ok(chosen)
    }

    /// Returns the `k` data chunks given any `k` of the `k + m` chunks
    /// (`None` = missing or failed its checksum). When every data chunk is
    /// present this is free: the buffers are returned as they are.
    pub fn decode_data(&self, chunks: &[Option<Bytes>]) -> Result<Vec<Bytes>> {
        let len = self.check_chunks(chunks)?;
        if chunks[..self.k].iter().all(Option::is_some) {
            return Ok(chunks[..self.k].iter().flatten().cloned().collect());
        }
        let available: Vec<bool> = chunks.iter().map(Option::is_some).collect();
        let chosen = self.choose_read_shards(&available)?;
        if len == 0 {
            return Ok(vec![Bytes::new(); self.k]);
        }
        with_decoder(self.k, self.m, len, |decoder| {
            for &i in &chosen {
                if let Some(c) = &chunks[i] {
                    if i < self.k {
                        decoder.add_original_shard(i, c).map_err(lib_err)?;
                    } else {
                        decoder.add_recovery_shard(i - self.k, c).map_err(lib_err)?;
                    }
                }
            }
            let restored = decoder.decode().map_err(lib_err)?;
            let mut out = Vec::with_capacity(self.k);
            for (i, chunk) in chunks[..self.k].iter().enumerate() {
                match chunk {
                    Some(c) => out.push(c.clone()),
                    None => {
                        let r = restored.restored_original(i).ok_or_else(|| {
                            EcError::Library(format!("decoder did not restore data chunk {i}"))
                        })?;
                        out.push(Bytes::copy_from_slice(r));
                    }
                }
            }
            Ok(out)
        })
    }

    /// Rebuilds the chunks listed in `wanted` (e.g. for a new acting member)
    /// from any `k` present ones; returned in the order of `wanted`.
    pub fn reconstruct(&self, chunks: &[Option<Bytes>], wanted: &[usize]) -> Result<Vec<Bytes>> {
        self.check_chunks(chunks)?;
        for &index in wanted {
            if index >= self.total() {
                return Err(EcError::ChunkIndex {
                    index,
                    total: self.total(),
                });
            }
        }
        if wanted.iter().all(|&i| chunks[i].is_some()) {
            return Ok(wanted.iter().flat_map(|&i| chunks[i].clone()).collect());
        }
        let data = self.decode_data(chunks)?;
        let parity = if wanted.iter().any(|&i| i >= self.k && chunks[i].is_none()) {
            self.encode_parity(&data)?
        } else {
            Vec::new()
        };
        Ok(wanted
            .iter()
            .map(|&i| match &chunks[i] {
                Some(c) => c.clone(),
                None if i < self.k => data[i].clone(),
                None => parity[i - self.k].clone(),
            })
            .collect())
    }

    /// Scrub: recomputes parity from the data chunks of `chunks` (all
    /// `k + m`, same byte range of each) and returns the indices of parity
    /// chunks that differ. A corrupt data chunk typically shows as every
    /// parity chunk differing; per-chunk checksums say which chunk is bad.
    pub fn parity_mismatches(&self, chunks: &[Bytes]) -> Result<Vec<usize>> {
        if chunks.len() != self.total() {
            return Err(EcError::ChunkCount {
                count: chunks.len(),
                expected: self.total(),
            });
        }
        let parity = self.encode_parity(&chunks[..self.k])?;
        let mut bad = Vec::new();
        for (j, p) in parity.iter().enumerate() {
            let stored = &chunks[self.k + j];
            check_len(self.k + j, stored.len(), p.len())?;
            if stored != p {
                bad.push(self.k + j);
            }
        }
        Ok(bad)
    }

    /// Checks slot count and equal, aligned lengths; returns the length.
    fn check_chunks(&self, chunks: &[Option<Bytes>]) -> Result<usize> {
        if chunks.len() != self.total() {
            return Err(EcError::ChunkCount {
                count: chunks.len(),
                expected: self.total(),
            });
        }
        let len = chunks.iter().flatten().map(Bytes::len).next().unwrap_or(0);
        for (index, c) in chunks.iter().enumerate() {
            if let Some(c) = c {
                check_len(index, c.len(), len)?;
            }
        }
        Ok(len)
    }

    fn insufficient(&self, available: &[bool]) -> EcError {
        EcError::InsufficientChunks {
            available: available.iter().filter(|a| **a).count(),
            needed: self.k,
            total: self.total(),
            missing: (0..self.total()).filter(|&i| !available[i]).collect(),
        }
    }
}

fn check_len(index: usize, len: usize, expected: usize) -> Result<()> {
    if len != expected {
        return Err(EcError::ChunkLength {
            index,
            len: len as u64,
            expected: expected as u64,
        });
    }
    if !(len as u64).is_multiple_of(STRIPE_UNIT_ALIGN_BYTES) {
        return Err(EcError::ChunkAlignment {
            len: len as u64,
            align: STRIPE_UNIT_ALIGN_BYTES,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(codec: &Codec, len: usize, seed: u8) -> Vec<Option<Bytes>> {
        let data: Vec<Bytes> = (0..codec.k())
            .map(|i| {
                (0..len)
                    .map(|b| (b as u8).wrapping_mul(31).wrapping_add(seed ^ i as u8))
                    .collect::<Vec<u8>>()
                    .into()
            })
            .collect();
        let parity = codec.encode_parity(&data).unwrap();
        data.into_iter().chain(parity).map(Some).collect()
    }

    #[test]
    fn profile_limits() {
        assert!(Codec::new(0, 1)
            .unwrap_err()
            .to_string()
            .contains("k (data chunks)"));
        assert!(Codec::new(1, 0)
            .unwrap_err()
            .to_string()
            .contains("m (coding chunks)"));
        assert!(Codec::new(20, 13)
            .unwrap_err()
            .to_string()
            .contains("at most 32"));
        assert!(Codec::new(1, 1).is_ok());
        assert!(Codec::new(16, 16).is_ok());
        assert!(Codec::new(31, 1).is_ok());
    }

    /// `ErasureCode::encode` codes `k + 1` profiles without the library,
    /// as the XOR of the data units: it must be the library's parity.
    #[test]
    fn one_parity_is_the_xor_of_the_data() {
        for k in 1..=31 {
            let codec = Codec::new(k, 1).unwrap();
            for len in [64, 4096, 65536] {
                let c = chunks(&codec, len, k as u8);
                let mut xor = vec![0u8; len];
                for d in &c[..k] {
                    for (x, b) in xor.iter_mut().zip(d.as_ref().unwrap().iter()) {
                        *x ^= b;
                    }
                }
                assert_eq!(c[k].as_deref(), Some(&xor[..]), "k {k} len {len}");
            }
        }
    }

    #[test]
    fn all_data_present_returns_same_buffers() {
        let codec = Codec::new(3, 2).unwrap();
        let full = chunks(&codec, 128, 7);
        let data = codec.decode_data(&full).unwrap();
        for i in 0..3 {
            let original = full[i].as_ref().unwrap();
            assert_eq!(
                data[i].as_ptr(),
                original.as_ptr(),
                "no copy when data is whole"
            );
        }
    }

    #[test]
    fn too_many_losses_say_how_many() {
        let codec = Codec::new(4, 2).unwrap();
        let mut c = chunks(&codec, 64, 1);
        c[0] = None;
        c[2] = None;
        c[5] = None;
        let err = codec.decode_data(&c).unwrap_err();
        assert_eq!(
            err,
            EcError::InsufficientChunks {
                available: 3,
                needed: 4,
                total: 6,
                missing: vec![0, 2, 5]
            }
        );
        let msg = err.to_string();
        assert!(msg.contains("3 of 6 chunks available, 4 needed"), "{msg}");
        assert!(codec.reconstruct(&c, &[0]).is_err());
    }

    #[test]
    fn length_and_count_errors() {
        let codec = Codec::new(2, 1).unwrap();
        let a = Bytes::from(vec![0u8; 64]);
        let b = Bytes::from(vec![0u8; 128]);
        assert!(matches!(
            codec.decode_data(&[Some(a.clone()), Some(b.clone()), None]),
            Err(EcError::ChunkLength { index: 1, .. })
        ));
        assert!(matches!(
            codec.decode_data(&[Some(a.clone()), None]),
            Err(EcError::ChunkCount { .. })
        ));
        let odd = Bytes::from(vec![0u8; 10]);
        assert!(matches!(
            codec.encode_parity(&[odd.clone(), odd]),
            Err(EcError::ChunkAlignment { .. })
        ));
        assert!(matches!(
            codec.reconstruct(&[Some(a.clone()), Some(a), None], &[3]),
            Err(EcError::ChunkIndex { index: 3, total: 3 })
        ));
    }

    #[test]
    fn empty_chunks_are_fine() {
        let codec = Codec::new(2, 2).unwrap();
        let parity = codec.encode_parity(&[Bytes::new(), Bytes::new()]).unwrap();
        assert_eq!(parity.len(), 2);
        let data = codec
            .decode_data(&[None, None, Some(Bytes::new()), Some(Bytes::new())])
            .unwrap();
        assert!(data.iter().all(Bytes::is_empty));
    }

    #[test]
    fn scrub_finds_parity_mismatch() {
        let codec = Codec::new(3, 2).unwrap();
        let mut full: Vec<Bytes> = chunks(&codec, 128, 9).into_iter().flatten().collect();
        assert!(codec.parity_mismatches(&full).unwrap().is_empty());
        let mut p = full[4].to_vec();
        p[100] ^= 0x40;
        full[4] = p.into();
        assert_eq!(codec.parity_mismatches(&full).unwrap(), vec![4]);
        let mut d = full[0].to_vec();
        d[3] ^= 1;
        full[0] = d.into();
        assert_eq!(codec.parity_mismatches(&full).unwrap(), vec![3, 4]);
    }

    #[test]
    fn reconstruct_parity_and_data() {
        let codec = Codec::new(3, 2).unwrap();
        let full = chunks(&codec, 192, 3);
        let mut holes = full.clone();
        holes[1] = None;
        holes[4] = None;
        let got = codec.reconstruct(&holes, &[4, 1, 0]).unwrap();
        assert_eq!(Some(got[0].clone()), full[4]);
        assert_eq!(Some(got[1].clone()), full[1]);
        assert_eq!(Some(got[2].clone()), full[0]);
    }
}
