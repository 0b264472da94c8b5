//! The rjenkins1 hash CRUSH uses (Robert Jenkins' 96-bit mix, seeded as Ceph
//! seeds it). Owns only the hash functions; no placement logic.

/// Seed Ceph mixes into every rjenkins1 hash.
const HASH_SEED: u32 = 1_315_423_911;

#[inline(always)]
fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *a = a.wrapping_sub(*b).wrapping_sub(*c) ^ (*c >> 13);
    *b = b.wrapping_sub(*c).wrapping_sub(*a) ^ (*a << 8);
    *c = c.wrapping_sub(*a).wrapping_sub(*b) ^ (*b >> 13);
    *a = a.wrapping_sub(*b).wrapping_sub(*c) ^ (*c >> 12);
    *b = b.wrapping_sub(*c).wrapping_sub(*a) ^ (*a << 16);
    *c = c.wrapping_sub(*a).wrapping_sub(*b) ^ (*b >> 5);
    *a = a.wrapping_sub(*b).wrapping_sub(*c) ^ (*c >> 3);
    *b = b.wrapping_sub(*c).wrapping_sub(*a) ^ (*a << 10);
    *c = c.wrapping_sub(*a).wrapping_sub(*b) ^ (*b >> 15);
}

/// rjenkins1 of two 32-bit words (used by the reweight "is out" test and by
/// crushtool's `--pool-id` input mangling).
#[inline]
pub fn hash32_2(a: u32, b: u32) -> u32 {
    let (mut a, mut b) = (a, b);
    let mut h = HASH_SEED ^ a ^ b;
    let mut x: u32 = 231_232;
    let mut y: u32 = 1_232;
    mix(&mut a, &mut b, &mut h);
    mix(&mut x, &mut a, &mut h);
    mix(&mut b, &mut y, &mut h);
    h
}

/// rjenkins1 of three 32-bit words (the straw2 draw and permutation hash).
#[inline(always)]
pub fn hash32_3(a: u32, b: u32, c: u32) -> u32 {
    let (mut a, mut b, mut c) = (a, b, c);
    let mut h = HASH_SEED ^ a ^ b ^ c;
    let mut x: u32 = 231_232;
    let mut y: u32 = 1_232;
    mix(&mut a, &mut b, &mut h);
    mix(&mut c, &mut x, &mut h);
    mix(&mut y, &mut a, &mut h);
    mix(&mut b, &mut x, &mut h);
    mix(&mut y, &mut c, &mut h);
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_deterministic_and_mix_all_inputs() {
        assert_eq!(hash32_3(1, 2, 3), hash32_3(1, 2, 3));
        assert_ne!(hash32_3(1, 2, 3), hash32_3(1, 2, 4));
        assert_ne!(hash32_3(1, 2, 3), hash32_3(2, 1, 3));
        assert_ne!(hash32_2(7, 9), hash32_2(9, 7));
    }
}
