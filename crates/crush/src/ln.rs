//! The fixed-point log2 straw2 draws with (`crush_ln`): for a 16-bit input
//! `u` it returns about 2^44 * log2(u + 1), computed exactly as Ceph does
//! with three lookup tables. Owns nothing else.

use crate::ln_tables::{LH, LL};

/// `RH[k]` = 2^48 / (1 + k/128), rounded up (computed at compile time).
const RH: [i64; 129] = {
    let mut t = [0i64; 129];
    let mut k = 0;
    while k < 129 {
        let d = 128 + k as i64;
        t[k] = ((1i64 << 55) + d - 1) / d;
        k += 1;
    }
    t
};

/// `crush_ln(xin)`: the 2^44-scaled log2 of `xin + 1`, for `xin` in 0..=0xffff.
/// A `const fn` so that tables derived from it are built at compile time.
#[inline]
pub const fn crush_ln(xin: u32) -> u64 {
    let mut x = xin + 1;
    let mut iexpon: u64 = 15;
    if x & 0x18000 == 0 {
        let bits = (x & 0x1ffff).leading_zeros() - 16;
        x <<= bits;
        iexpon = 15 - bits as u64;
    }
    let index1 = ((x >> 8) << 1) as usize;
    let k = (index1 - 256) / 2;
    let rh = RH[k];
    let lh = LH[k];
    let xl64 = ((x as i64).wrapping_mul(rh) as u64) >> 48;
    let mut result = iexpon << (12 + 32);
    let index2 = (xl64 & 0xff) as usize;
    let ll = LL[index2];
    let lh = (lh.wrapping_add(ll) as u64) >> (48 - 12 - 32);
    result = result.wrapping_add(lh);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ln_endpoints_and_monotone() {
        // log2(0x10000) = 16 -> 16 << 44 = 2^48 (Ceph's last LH entry is
        // 0xffff00000000 rather than 2^48, so the top value falls just short).
        let top = crush_ln(0xffff);
        assert!(top < 1 << 48 && (1u64 << 48) - top < 1 << 29, "{top:#x}");
        assert_eq!(crush_ln(0), 0);
        let mut prev = 0;
        for u in 0..0xffffu32 {
            let v = crush_ln(u);
            assert!(v >= prev, "crush_ln not monotone at {u}"); // (u = 0xffff is not: see above)
            prev = v;
        }
    }

    #[test]
    fn rh_matches_ceph_first_entries() {
        assert_eq!(RH[0], 0x0001_0000_0000_0000);
        assert_eq!(RH[1], 0x0000_fe03_f80f_e040);
        assert_eq!(RH[128], 0x0000_8000_0000_0000);
    }
}
