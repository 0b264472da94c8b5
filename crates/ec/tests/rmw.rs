//! Read-modify-write against simulated shard buffers: after every write the
//! shards equal a from-scratch encoding of the new object; rolling back an
//! interrupted (torn) write on every shard restores the old shards exactly;
//! rolling forward from any k shards that applied it completes it.

use bytes::Bytes;
use cairn_ec::rmw::{plan_truncate, plan_write_full};
use cairn_ec::{plan_write, ErasureCode, ShardRollback, ShardWrite, WritePlan};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Full { len: usize },
    Write { offset: usize, len: usize },
    Truncate { size: usize },
}

#[derive(Debug, Clone, Copy)]
enum Fate {
    /// Applied on every shard.
    Complete,
    /// Torn on some shards, then rolled back everywhere.
    RollBack {
        applied_mask: u32,
        torn_shard: usize,
        torn_len: usize,
    },
    /// Applied on the shards in the mask (at least k), the rest rebuilt.
    RollForward { applied_mask: u32 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0usize..1500).prop_map(|len| Op::Full { len }),
        4 => (0usize..2500, 0usize..1200).prop_map(|(offset, len)| Op::Write { offset, len }),
        1 => (0usize..2500).prop_map(|size| Op::Truncate { size }),
    ]
}

fn fate() -> impl Strategy<Value = Fate> {
    prop_oneof![
        2 => Just(Fate::Complete),
        1 => (any::<u32>(), 0usize..16, 0usize..4096)
            .prop_map(|(applied_mask, torn_shard, torn_len)| Fate::RollBack { applied_mask, torn_shard, torn_len }),
        1 => any::<u32>().prop_map(|applied_mask| Fate::RollForward { applied_mask }),
    ]
}

fn bytes_for(len: usize, seed: usize) -> Bytes {
    (0..len)
        .map(|i| (i.wrapping_mul(131) ^ seed.wrapping_mul(7919)) as u8 | 1)
        .collect::<Vec<u8>>()
        .into()
}

/// Serves the plan's reads from the shards; reads of the `down` shard are
/// decoded from k others (the degraded read-modify-write path).
fn serve_reads(
    code: &ErasureCode,
    shards: &[Vec<u8>],
    plan: &WritePlan,
    down: Option<usize>,
) -> Vec<Bytes> {
    let available: Vec<bool> = (0..code.total()).map(|i| Some(i) != down).collect();
    let ranged = code
        .plan_range_reads(plan.reads(), &available)
        .expect("range plan");
    let results: Vec<Bytes> = ranged
        .reads()
        .iter()
        .map(|r| {
            assert!(Some(r.shard) != down, "never reads a down shard");
            Bytes::copy_from_slice(&shards[r.shard][r.range.start as usize..r.range.end as usize])
        })
        .collect();
    ranged.assemble(code, &results).expect("assemble")
}

fn expected_shards(code: &ErasureCode, model: &[u8]) -> Vec<Vec<u8>> {
    code.encode(&Bytes::copy_from_slice(model))
        .expect("encode")
        .into_iter()
        .map(|c| c.to_vec())
        .collect()
}

fn roll_back(shards: &mut [Vec<u8>], writes: &[ShardWrite], old: &[Vec<u8>], fate: Fate) {
    let Fate::RollBack {
        applied_mask,
        torn_shard,
        torn_len,
    } = fate
    else {
        return;
    };
    let torn_shard = torn_shard % shards.len();
    let mut rollbacks: Vec<ShardRollback> = Vec::new();
    for (w, shard) in writes.iter().zip(shards.iter_mut()) {
        let rb = if applied_mask & (1 << w.shard) != 0 {
            w.apply_with_rollback(shard).expect("apply")
        } else {
            let r = w.rollback_range();
            w.rollback(Bytes::copy_from_slice(
                &shard[r.start as usize..r.end as usize],
            ))
            .expect("rollback record")
        };
        if w.shard == torn_shard {
            // A torn write: the length changed and only a prefix landed.
            shard.resize(w.new_chunk_len as usize, 0);
            let n = torn_len.min(w.data.len());
            let at = w.offset as usize;
            shard[at..at + n].copy_from_slice(&w.data[..n]);
        }
        // The record goes through its on-disk encoding, as in the PG log.
        rollbacks.push(ShardRollback::decode(rb.encode()).expect("decode rollback"));
    }
    for (rb, shard) in rollbacks.iter().zip(shards.iter_mut()) {
        rb.apply(shard).expect("rollback");
        rb.apply(shard).expect("rollback again"); // idempotent
    }
    assert_eq!(shards, old, "rollback restores every shard exactly");
}

fn roll_forward(code: &ErasureCode, shards: &mut [Vec<u8>], writes: &[ShardWrite], mask: u32) {
    let total = code.total();
    // Make sure at least k shards applied it.
    let mut applied: Vec<bool> = (0..total).map(|i| mask & (1 << i) != 0).collect();
    while applied.iter().filter(|x| **x).count() < code.k() {
        let i = applied
            .iter()
            .position(|x| !*x)
            .expect("some shard not applied");
        applied[i] = true;
    }
    for (w, shard) in writes.iter().zip(shards.iter_mut()) {
        if applied[w.shard] {
            w.apply(shard).expect("apply");
        }
    }
    let Some(w0) = writes.first() else { return };
    let (a, b) = (w0.offset as usize, (w0.offset as usize) + w0.data.len());
    let slots: Vec<Option<Bytes>> = (0..total)
        .map(|i| applied[i].then(|| Bytes::copy_from_slice(&shards[i][a..b])))
        .collect();
    let missing: Vec<usize> = (0..total).filter(|i| !applied[*i]).collect();
    let rebuilt = code
        .codec()
        .reconstruct(&slots, &missing)
        .expect("reconstruct");
    for (i, data) in missing.iter().zip(rebuilt) {
        let w = ShardWrite {
            data,
            ..writes[*i].clone()
        };
        w.apply(&mut shards[*i]).expect("apply rebuilt");
    }
}

proptest! {
    // CAIRN_SOAK=1 runs 50 times as many cases.
    #![proptest_config(ProptestConfig::with_cases(
        if std::env::var_os("CAIRN_SOAK").is_some() { 12_800 } else { 256 }
    ))]

    #[test]
    fn rmw_matches_fresh_encoding_and_rolls_back(
        k in 1usize..6, m in 1usize..4, su_blocks in 1u64..3,
        ops in prop::collection::vec((op(), fate(), prop::option::of(0usize..8)), 1..7),
    ) {
        let code = ErasureCode::new(k, m, su_blocks * 64).unwrap();
        let mut model: Vec<u8> = Vec::new();
        let mut shards = expected_shards(&code, &model);
        for (n, (op, fate, down)) in ops.into_iter().enumerate() {
            let old_shards = shards.clone();
            let old_size = model.len() as u64;
            let (plan, data) = match op {
                Op::Full { len } => (plan_write_full(&code, old_size, len as u64).unwrap(), bytes_for(len, n)),
                Op::Write { offset, len } => (
                    plan_write(&code, old_size, offset as u64, len as u64, true).unwrap(),
                    bytes_for(len, n),
                ),
                Op::Truncate { size } => (
                    plan_truncate(&code, old_size, size as u64, true).unwrap(),
                    Bytes::new(),
                ),
            };
            let down = down.filter(|d| *d < k);
            let reads = serve_reads(&code, &shards, &plan, down);
            let writes = plan.build(&data, &reads).unwrap();
            // Each shard receives its write through the wire encoding.
            let writes: Vec<ShardWrite> = writes
                .iter()
                .map(|w| ShardWrite::decode(w.encode()).unwrap())
                .collect();
            match fate {
                Fate::Complete => {
                    for (w, shard) in writes.iter().zip(shards.iter_mut()) {
                        w.apply(shard).unwrap();
                    }
                }
                Fate::RollBack { .. } => {
                    roll_back(&mut shards, &writes, &old_shards, fate);
                    continue;
                }
                Fate::RollForward { applied_mask } => {
                    roll_forward(&code, &mut shards, &writes, applied_mask)
                }
            }
            match op {
                Op::Full { .. } => model = data.to_vec(),
                Op::Truncate { size } => model.resize(size, 0),
                Op::Write { offset, len } => {
                    if len > 0 {
                        if model.len() < offset + len {
                            model.resize(offset + len, 0);
                        }
                        model[offset..offset + len].copy_from_slice(&data);
                    }
                }
            }
            prop_assert_eq!(plan.new_size(), model.len() as u64);
            prop_assert_eq!(&shards, &expected_shards(&code, &model));
            let slots: Vec<Option<Bytes>> = shards.iter().map(|s| Some(Bytes::copy_from_slice(s))).collect();
            prop_assert_eq!(&code.decode(&slots, model.len() as u64).unwrap()[..], &model[..]);
        }
    }
}
