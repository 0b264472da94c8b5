//! Golden vectors for the on-disk chunk format (EC_FORMAT_VERSION 1): the
//! parity of fixed inputs must never change, or chunks written by an older
//! Cairn would no longer decode. If this fails after a dependency bump, the
//! new library computes different parity: keep the old one for format 1 and
//! introduce a new format version instead of changing these numbers.

use bytes::Bytes;
use cairn_ec::{chunk_crc32c, ErasureCode, EC_FORMAT_VERSION, EC_LIBRARY, EC_LIBRARY_VERSION};

fn input(len: usize) -> Bytes {
    (0..len)
        .map(|i| ((i * 7 + (i >> 8) * 13) % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// (k, m, stripe_unit, object bytes, crc32c of each parity chunk)
const GOLDEN: &[(usize, usize, u64, usize, &[u32])] = &[
    (1, 1, 64, 64, &[0xaaa0bfca]),
    (2, 1, 4096, 100_000, &[0x194b2bac]),
    (3, 2, 64, 1000, &[0x85e40261, 0x66764c0c]),
    (4, 2, 4096, 1 << 20, &[0xfcb6a483, 0xa81ef76a]),
    (8, 3, 65536, 3 << 20, &[0x481cfe79, 0xc71d49ef, 0xcaf081ee]),
    (
        8,
        4,
        128,
        5000,
        &[0xbe3459aa, 0x554ebaaa, 0xf2bcd078, 0xa1550015],
    ),
    (
        16,
        16,
        64,
        4096,
        &[
            0x666f0157, 0x91dc396d, 0x485587f5, 0xaf5f74a8, 0xb337aec8, 0x45c42129, 0x98dd085f,
            0xb2891dd0, 0xf5eb37fc, 0x9fc7e662, 0x88719db5, 0x531aa3ef, 0xbd3ccfee, 0x0a7d552b,
            0x3bca80cc, 0xf4324ceb,
        ],
    ),
    (31, 1, 64, 1984, &[0x58ae821e]),
];

#[test]
fn parity_bytes_are_stable() {
    assert_eq!(EC_FORMAT_VERSION, 1);
    assert_eq!(EC_LIBRARY, "reed-solomon-simd");
    assert_eq!(EC_LIBRARY_VERSION, "3.1.0");
    let mut printed = String::new();
    for &(k, m, su, size, crcs) in GOLDEN {
        let code = ErasureCode::new(k, m, su).expect("profile");
        let chunks = code.encode(&input(size)).expect("encode");
        let got: Vec<u32> = chunks[k..].iter().map(|c| chunk_crc32c(c)).collect();
        printed.push_str(&format!("({k}, {m}, {su}, {size}, &{got:#010x?}),\n"));
        assert_eq!(got, crcs, "parity of {k}+{m} su={su} changed:\n{printed}");
    }
}

/// The parity must not depend on the CPU the chunk was written on (AVX2 on
/// a PC, NEON on a Raspberry Pi): compare with the portable engine.
#[test]
fn parity_is_the_same_with_the_portable_engine() {
    use reed_solomon_simd::engine::NoSimd;
    use reed_solomon_simd::rate::{DefaultRate, Rate, RateEncoder};
    for &(k, m, su, size, _) in GOLDEN {
        let code = ErasureCode::new(k, m, su).expect("profile");
        let chunks = code.encode(&input(size)).expect("encode");
        let len = chunks[0].len();
        let mut enc =
            DefaultRate::<NoSimd>::encoder(k, m, len, NoSimd::new(), None).expect("encoder");
        for c in &chunks[..k] {
            enc.add_original_shard(c).expect("add");
        }
        let result = enc.encode().expect("encode");
        for (j, p) in result.recovery_iter().enumerate() {
            assert_eq!(p, &chunks[k + j][..], "{k}+{m} parity {j}");
        }
    }
}
