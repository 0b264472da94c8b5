//! Reading chosen chunk ranges while some chunks are unavailable: ranges on
//! available chunks are read directly; the others are rebuilt from the same
//! range of any `k` available chunks, one decode per distinct range. The
//! degraded read-modify-write uses this for its old-data reads, and recovery
//! can use it for partial chunk repairs.

use std::ops::Range;

use bytes::Bytes;

use crate::error::{EcError, Result};
use crate::format::STRIPE_UNIT_ALIGN_BYTES;
use crate::object::{check_results, ChunkRead, ErasureCode};

/// Reads that produce the wanted chunk ranges; see
/// [`ErasureCode::plan_range_reads`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeReadPlan {
    wanted: Vec<ChunkRead>,
    reads: Vec<ChunkRead>,
    sources: Vec<Source>,
    groups: Vec<DecodeGroup>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    /// `reads[i]` is the wanted range itself.
    Direct(usize),
    /// Rebuilt by decode group `g`.
    Decoded(usize),
}

/// One decode: the same range read from `k` chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DecodeGroup {
    range: Range<u64>,
    /// Indices into `reads`.
    reads: Vec<usize>,
    /// Shards to rebuild from this range.
    shards: Vec<usize>,
}

impl ErasureCode {
    /// Plans reading `wanted` chunk ranges given which chunks are available.
    /// Ranges that need decoding must be 64-byte aligned (stripe-aligned
    /// ranges always are).
    pub fn plan_range_reads(
        &self,
        wanted: &[ChunkRead],
        available: &[bool],
    ) -> Result<RangeReadPlan> {
        if available.len() != self.total() {
            return Err(EcError::ChunkCount {
                count: available.len(),
                expected: self.total(),
            });
        }
        let mut plan = RangeReadPlan {
            wanted: wanted.to_vec(),
            reads: Vec::new(),
            sources: Vec::with_capacity(wanted.len()),
            groups: Vec::new(),
        };
        for w in wanted {
            if w.shard >= self.total() {
                return Err(EcError::ChunkIndex {
                    index: w.shard,
                    total: self.total(),
                });
            }
            if available[w.shard] {
                let i = plan.read_index(w.shard, &w.range);
                plan.sources.push(Source::Direct(i));
                continue;
            }
            for edge in [w.range.start, w.range.end] {
                if !edge.is_multiple_of(STRIPE_UNIT_ALIGN_BYTES) {
                    return Err(EcError::ChunkAlignment {
                        len: edge,
                        align: STRIPE_UNIT_ALIGN_BYTES,
                    });
                }
            }
            let g = match plan.groups.iter().position(|g| g.range == w.range) {
                Some(g) => g,
                None => {
                    let sources = self.codec().choose_read_shards(available)?;
                    let reads = sources
                        .into_iter()
                        .map(|s| plan.read_index(s, &w.range))
                        .collect();
                    plan.groups.push(DecodeGroup {
                        range: w.range.clone(),
                        reads,
                        shards: Vec::new(),
                    });
                    plan.groups.len() - 1
                }
            };
            if !plan.groups[g].shards.contains(&w.shard) {
                plan.groups[g].shards.push(w.shard);
            }
            plan.sources.push(Source::Decoded(g));
        }
        Ok(plan)
    }
}

impl RangeReadPlan {
    /// Chunk ranges to read (each once); their bytes go to
    /// [`assemble`](Self::assemble) in this order.
    pub fn reads(&self) -> &[ChunkRead] {
        &self.reads
    }

    /// Whether any wanted range has to be decoded.
    pub fn is_degraded(&self) -> bool {
        !self.groups.is_empty()
    }

    /// The bytes of each wanted range, in the order they were asked for.
    pub fn assemble(&self, code: &ErasureCode, results: &[Bytes]) -> Result<Vec<Bytes>> {
        check_results(&self.reads, results)?;
        let mut rebuilt: Vec<Vec<Bytes>> = Vec::with_capacity(self.groups.len());
        for g in &self.groups {
            let mut slots = vec![None; code.total()];
            for &i in &g.reads {
                slots[self.reads[i].shard] = Some(results[i].clone());
            }
            rebuilt.push(code.codec().reconstruct(&slots, &g.shards)?);
        }
        Ok(self
            .wanted
            .iter()
            .zip(&self.sources)
            .map(|(w, source)| match source {
                Source::Direct(i) => results[*i].clone(),
                Source::Decoded(g) => {
                    let group = &self.groups[*g];
                    let at = group.shards.iter().position(|s| *s == w.shard).unwrap_or(0);
                    rebuilt[*g][at].clone()
                }
            })
            .collect())
    }

    fn read_index(&mut self, shard: usize, range: &Range<u64>) -> usize {
        if let Some(i) = self
            .reads
            .iter()
            .position(|r| r.shard == shard && r.range == *range)
        {
            return i;
        }
        self.reads.push(ChunkRead {
            shard,
            range: range.clone(),
        });
        self.reads.len() - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (ErasureCode, Vec<Bytes>) {
        let code = ErasureCode::new(3, 2, 64).unwrap();
        let data: Bytes = (0..3 * 64 * 4)
            .map(|i| (i * 7 % 253) as u8)
            .collect::<Vec<u8>>()
            .into();
        let chunks = code.encode(&data).unwrap();
        (code, chunks)
    }

    fn serve(chunks: &[Bytes], plan: &RangeReadPlan) -> Vec<Bytes> {
        plan.reads()
            .iter()
            .map(|r| chunks[r.shard].slice(r.range.start as usize..r.range.end as usize))
            .collect()
    }

    #[test]
    fn healthy_ranges_are_read_directly() {
        let (code, chunks) = setup();
        let wanted = vec![
            ChunkRead {
                shard: 0,
                range: 0..64,
            },
            ChunkRead {
                shard: 2,
                range: 10..20,
            },
            ChunkRead {
                shard: 0,
                range: 0..64,
            },
        ];
        let plan = code.plan_range_reads(&wanted, &[true; 5]).unwrap();
        assert!(!plan.is_degraded());
        assert_eq!(plan.reads().len(), 2, "duplicate reads are merged");
        let got = plan.assemble(&code, &serve(&chunks, &plan)).unwrap();
        assert_eq!(got[1], chunks[2].slice(10..20));
        assert_eq!(got[2], chunks[0].slice(0..64));
    }

    #[test]
    fn down_chunks_are_decoded_once_per_range() {
        let (code, chunks) = setup();
        let available = [false, true, false, true, true];
        let wanted = vec![
            ChunkRead {
                shard: 0,
                range: 64..192,
            },
            ChunkRead {
                shard: 1,
                range: 64..192,
            },
            ChunkRead {
                shard: 2,
                range: 64..192,
            },
            ChunkRead {
                shard: 4,
                range: 0..64,
            },
        ];
        let plan = code.plan_range_reads(&wanted, &available).unwrap();
        assert!(plan.is_degraded());
        assert!(plan.reads().iter().all(|r| available[r.shard]));
        let got = plan.assemble(&code, &serve(&chunks, &plan)).unwrap();
        for (w, g) in wanted.iter().zip(&got) {
            let (a, b) = (w.range.start as usize, w.range.end as usize);
            assert_eq!(g, &chunks[w.shard].slice(a..b), "{w:?}");
        }
    }

    #[test]
    fn refusals() {
        let (code, _) = setup();
        let odd = [ChunkRead {
            shard: 0,
            range: 3..64,
        }];
        assert!(matches!(
            code.plan_range_reads(&odd, &[false, true, true, true, true]),
            Err(EcError::ChunkAlignment { .. })
        ));
        let two_down = [ChunkRead {
            shard: 0,
            range: 0..64,
        }];
        let err = code
            .plan_range_reads(&two_down, &[false, false, false, true, true])
            .unwrap_err();
        assert!(matches!(
            err,
            EcError::InsufficientChunks {
                available: 2,
                needed: 3,
                ..
            }
        ));
        let bad = [ChunkRead {
            shard: 9,
            range: 0..64,
        }];
        assert!(code.plan_range_reads(&bad, &[true; 5]).is_err());
    }
}
