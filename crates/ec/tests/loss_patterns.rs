//! Every loss pattern of at most m chunks, for every k <= 8 and m <= 4:
//! decoding gives back the object and reconstructing gives back the lost
//! chunks bit for bit; losing m+1 chunks is refused with counts.

use bytes::Bytes;
use cairn_ec::{chunk_crc32c, drop_corrupt_chunks, EcError, ErasureCode};

fn object(len: usize, seed: u64) -> Bytes {
    let mut x = seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

/// Calls `f` with every subset of `0..n` that has at most `max` members, as
/// a bit mask.
fn for_each_subset(n: usize, max: usize, mut f: impl FnMut(u32)) {
    for mask in 0u32..(1 << n) {
        if mask.count_ones() as usize <= max {
            f(mask);
        }
    }
}

/// Checks every loss pattern for k = 1..=8 with this m; returns how many.
fn every_loss_pattern_for_m(m: usize) -> usize {
    let mut patterns = 0usize;
    for k in 1..=8usize {
        {
            let code = ErasureCode::new(k, m, 64).expect("valid profile");
            // Two full stripes and a partial third: padding is exercised too.
            let size = 2 * 64 * k + 64 * k / 2 + 7;
            let data = object(size, (k * 10 + m) as u64);
            let chunks = code.encode(&data).expect("encode");
            assert_eq!(chunks.len(), k + m);
            for_each_subset(k + m, m, |lost| {
                patterns += 1;
                let slots: Vec<Option<Bytes>> = chunks
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (lost & (1 << i) == 0).then(|| c.clone()))
                    .collect();
                let decoded = code.decode(&slots, size as u64).expect("decode");
                assert_eq!(decoded, data, "k={k} m={m} lost={lost:b}");
                let wanted: Vec<usize> = (0..k + m).filter(|i| lost & (1 << i) != 0).collect();
                let rebuilt = code
                    .codec()
                    .reconstruct(&slots, &wanted)
                    .expect("reconstruct");
                for (i, c) in wanted.iter().zip(&rebuilt) {
                    assert_eq!(c, &chunks[*i], "k={k} m={m} lost={lost:b} chunk {i}");
                }
            });
        }
    }
    patterns
}

// One test per m so the test harness spreads them over the cores. The
// pattern counts are sum over k = 1..=8 of sum_{j<=m} C(k+m, j).
#[test]
fn every_loss_pattern_m1() {
    assert_eq!(every_loss_pattern_for_m(1), 52);
}

#[test]
fn every_loss_pattern_m2() {
    assert_eq!(every_loss_pattern_for_m(2), 224);
}

#[test]
fn every_loss_pattern_m3() {
    assert_eq!(every_loss_pattern_for_m(3), 778);
}

#[test]
fn every_loss_pattern_m4() {
    assert_eq!(every_loss_pattern_for_m(4), 2348);
}

#[test]
fn more_than_m_losses_name_available_and_needed() {
    for k in 1..=8usize {
        for m in 1..=4usize {
            let code = ErasureCode::new(k, m, 64).expect("valid profile");
            let data = object(64 * k, 1);
            let chunks = code.encode(&data).expect("encode");
            // Lose the first m+1 chunks (data first: the worst case).
            let slots: Vec<Option<Bytes>> = chunks
                .iter()
                .enumerate()
                .map(|(i, c)| (i > m).then(|| c.clone()))
                .collect();
            let err = code
                .decode(&slots, data.len() as u64)
                .expect_err("too few chunks");
            assert_eq!(
                err,
                EcError::InsufficientChunks {
                    available: k - 1,
                    needed: k,
                    total: k + m,
                    missing: (0..=m).collect(),
                }
            );
            let msg = err.to_string();
            assert!(
                msg.contains(&format!(
                    "{} of {} chunks available, {k} needed",
                    k - 1,
                    k + m
                )),
                "{msg}"
            );
        }
    }
}

/// A chunk failing its checksum counts as missing: it is dropped, the
/// object still decodes, and reconstruction gives the repaired chunk.
#[test]
fn corrupt_chunks_count_as_missing_and_are_repaired() {
    let code = ErasureCode::new(4, 2, 64).expect("valid profile");
    let data = object(1000, 42);
    let chunks = code.encode(&data).expect("encode");
    let crcs: Vec<Option<u32>> = chunks.iter().map(|c| Some(chunk_crc32c(c))).collect();
    let mut slots: Vec<Option<Bytes>> = chunks.iter().cloned().map(Some).collect();
    for i in [1usize, 4] {
        let mut bad = chunks[i].to_vec();
        bad[17] ^= 0x80;
        slots[i] = Some(Bytes::from(bad));
    }
    let dropped = drop_corrupt_chunks(&mut slots, &crcs).expect("same length");
    assert_eq!(dropped, vec![1, 4]);
    assert_eq!(code.decode(&slots, 1000).expect("decode"), data);
    let repaired = code.codec().reconstruct(&slots, &dropped).expect("repair");
    assert_eq!(repaired, vec![chunks[1].clone(), chunks[4].clone()]);
    // A third bad chunk is one too many for m = 2.
    let mut bad = chunks[0].to_vec();
    bad[0] ^= 1;
    slots[0] = Some(Bytes::from(bad));
    drop_corrupt_chunks(&mut slots, &crcs).expect("same length");
    let err = code.decode(&slots, 1000).expect_err("3 of 6 missing");
    assert!(
        err.to_string()
            .contains("3 of 6 chunks available, 4 needed"),
        "{err}"
    );
}
