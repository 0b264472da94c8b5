//! crc32c (Castagnoli) arithmetic on checksums already known: the crc of a
//! concatenation from the crcs of its pieces, without reading their bytes.
//! Owns that arithmetic only; computing a crc over bytes is the `crc32c`
//! crate's job in the crates that checksum data.
//!
//! Why it is sound: a crc32c (initial value and final xor all ones) of
//! `A ‖ B` equals the crc of `A` advanced over `len(B)` zero bytes — a
//! multiplication by x^(8·len(B)) modulo the polynomial — xor the crc of
//! `B`; the all-ones conditioning cancels out. So a reader that has
//! verified a run of 4 KiB blocks against their stored crcs knows the
//! crc of the whole run, and a messenger can put it in a frame without a
//! second pass over the bytes (see `cairn-store`'s reads and
//! `cairn-msg`'s known segment crcs).

/// The block size of the crcs that travel with written data: a messenger
/// that verifies a received frame returns the crc32c of each block of this
/// size of its bulk segment, and the store takes them for a write instead
/// of computing them again (its own block size is a multiple of it).
pub const CRC_BLOCK_BYTES: usize = 4096;

/// The crc32c polynomial, bit-reflected (bit 31 is x^0).
const POLY: u32 = 0x82F6_3B78;

/// `a · b mod P` for polynomials in the reflected representation.
const fn mul(a: u32, mut b: u32) -> u32 {
    let mut p = 0u32;
    let mut m = 1u32 << 31;
    while m != 0 {
        if a & m != 0 {
            p ^= b;
        }
        m >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    p
}

/// `X8[k]` = x^(8·2^k) mod P: advancing a crc over 2^k zero bytes.
const X8: [u32; 64] = {
    let mut t = [0u32; 64];
    // x^1 is bit 30; x^8 = (x^1)^8.
    let x1 = 1u32 << 30;
    let x2 = mul(x1, x1);
    let x4 = mul(x2, x2);
    t[0] = mul(x4, x4);
    let mut k = 1;
    while k < 64 {
        t[k] = mul(t[k - 1], t[k - 1]);
        k += 1;
    }
    t
};

/// x^(8·n) mod P: the operator that advances a crc over `n` zero bytes.
fn zeros_operator(n: u64) -> u32 {
    let mut p = 1u32 << 31; // x^0
    let (mut n, mut k) = (n, 0);
    while n != 0 {
        if n & 1 != 0 {
            p = mul(X8[k], p);
        }
        n >>= 1;
        k += 1;
    }
    p
}

/// The crc32c of `A ‖ B` from `crc_a` = crc32c(A), `crc_b` = crc32c(B) and
/// `len_b` = len(B). About a microsecond; for many pieces of one length,
/// [`Crc32cAppender`] is faster.
pub fn crc32c_combine(crc_a: u32, crc_b: u32, len_b: u64) -> u32 {
    if len_b == 0 {
        return crc_a;
    }
    mul(zeros_operator(len_b), crc_a) ^ crc_b
}

/// Combines crcs of pieces that all have one fixed length (a store block)
/// with four table lookups each: [`Crc32cAppender::append`] is
/// `crc32c_combine(crc, piece_crc, len)` for that `len`. 4 KiB of tables.
#[derive(Clone)]
pub struct Crc32cAppender {
    len: u64,
    tables: Box<[[u32; 256]; 4]>,
}

impl Crc32cAppender {
    /// For pieces of `len` bytes.
    pub fn new(len: u64) -> Crc32cAppender {
        let op = zeros_operator(len);
        let mut tables = Box::new([[0u32; 256]; 4]);
        for (i, t) in tables.iter_mut().enumerate() {
            for (b, slot) in t.iter_mut().enumerate() {
                *slot = mul(op, (b as u32) << (8 * i));
            }
        }
        Crc32cAppender { len, tables }
    }

    /// The piece length this appender was made for.
    pub fn piece_len(&self) -> u64 {
        self.len
    }

    /// The crc of `A ‖ P` from `crc` = crc32c(A) and `piece_crc` =
    /// crc32c(P), `P` being `piece_len()` bytes long.
    pub fn append(&self, crc: u32, piece_crc: u32) -> u32 {
        let t = &self.tables;
        t[0][(crc & 0xFF) as usize]
            ^ t[1][((crc >> 8) & 0xFF) as usize]
            ^ t[2][((crc >> 16) & 0xFF) as usize]
            ^ t[3][(crc >> 24) as usize]
            ^ piece_crc
    }
}

/// The appender for pieces of [`CRC_BLOCK_BYTES`], built once.
pub fn block_appender() -> &'static Crc32cAppender {
    static APP: std::sync::OnceLock<Crc32cAppender> = std::sync::OnceLock::new();
    APP.get_or_init(|| Crc32cAppender::new(CRC_BLOCK_BYTES as u64))
}

/// The crc32c of consecutive [`CRC_BLOCK_BYTES`] blocks from their crcs.
pub fn crc32c_of_blocks(crcs: &[u32]) -> u32 {
    let app = block_appender();
    // crc32c of the empty string is 0.
    crcs.iter().fold(0, |acc, &c| app.append(acc, c))
}

/// Groups consecutive [`CRC_BLOCK_BYTES`] block crcs into the crcs of
/// blocks `factor` times as large (a store whose block is bigger).
pub fn regroup_block_crcs(crcs: &[u32], factor: usize) -> Vec<u32> {
    if factor <= 1 {
        return crcs.to_vec();
    }
    crcs.chunks(factor).map(crc32c_of_blocks).collect()
}

impl std::fmt::Debug for Crc32cAppender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Crc32cAppender")
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A plain bitwise crc32c, so this crate needs no crc dependency.
    fn crc(data: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in data {
            c ^= b as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            }
        }
        !c
    }

    #[test]
    fn known_vector() {
        // The standard check value of crc32c.
        assert_eq!(crc(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn combine_of_empty_pieces() {
        assert_eq!(crc32c_combine(0, crc(b"abc"), 3), crc(b"abc"));
        assert_eq!(crc32c_combine(crc(b"abc"), 0, 0), crc(b"abc"));
    }

    #[test]
    fn appender_matches_block_by_block() {
        let data: Vec<u8> = (0..4096 * 5).map(|i| (i * 7 + i / 13) as u8).collect();
        let app = Crc32cAppender::new(4096);
        let mut acc = 0u32;
        for blk in data.chunks(4096) {
            acc = app.append(acc, crc(blk));
        }
        assert_eq!(acc, crc(&data));
        assert_eq!(app.piece_len(), 4096);
    }

    #[test]
    fn blocks_combine_and_regroup() {
        let data: Vec<u8> = (0..CRC_BLOCK_BYTES * 6)
            .map(|i| (i * 31 + i / 7) as u8)
            .collect();
        let crcs: Vec<u32> = data.chunks(CRC_BLOCK_BYTES).map(crc).collect();
        assert_eq!(crc32c_of_blocks(&crcs), crc(&data));
        assert_eq!(crc32c_of_blocks(&[]), 0);
        let big: Vec<u32> = data.chunks(CRC_BLOCK_BYTES * 2).map(crc).collect();
        assert_eq!(regroup_block_crcs(&crcs, 2), big);
        assert_eq!(regroup_block_crcs(&crcs, 1), crcs);
    }

    proptest! {
        #[test]
        fn combine_equals_crc_of_concatenation(
            a in proptest::collection::vec(any::<u8>(), 0..300),
            b in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let mut ab = a.clone();
            ab.extend_from_slice(&b);
            prop_assert_eq!(crc32c_combine(crc(&a), crc(&b), b.len() as u64), crc(&ab));
        }

        #[test]
        fn appender_equals_combine(len in 1u64..5000, x in any::<u32>(), y in any::<u32>()) {
            prop_assert_eq!(Crc32cAppender::new(len).append(x, y), crc32c_combine(x, y, len));
        }

        #[test]
        fn a_flipped_bit_changes_the_combined_crc(
            a in proptest::collection::vec(any::<u8>(), 1..200),
            b in proptest::collection::vec(any::<u8>(), 1..200),
            bit in any::<usize>(),
        ) {
            let mut ab = a.clone();
            ab.extend_from_slice(&b);
            let i = bit % (ab.len() * 8);
            ab[i / 8] ^= 1 << (i % 8);
            prop_assert_ne!(crc32c_combine(crc(&a), crc(&b), b.len() as u64), crc(&ab));
        }
    }
}
