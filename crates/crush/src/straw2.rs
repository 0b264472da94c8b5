//! The straw2 draw: which item of a bucket input `x` picks on attempt `r`.
//! Owns the vectorised item hashing (AVX-512 with explicit intrinsics, AVX2
//! and portable code through the autovectoriser) and the exact,
//! division-free choice of the winner. Results are Ceph's, bit for bit; the
//! rule interpreter in `mapper.rs` calls [`straw2_choose`].

use crate::hash::hash32_3;
use crate::ln::crush_ln;

/// `crush_ln(u) - 2^48`: the (non-positive) straw2 numerator.
#[inline(always)]
fn ln_draw(u: u32) -> i64 {
    crush_ln(u) as i64 - 0x1_0000_0000_0000
}

/// The straw2 choice over `items` with 16.16 `weights`: the first item with
/// the highest trunc(ln / weight) draw, as Ceph's `bucket_straw2_choose`.
/// `scratch` holds the item hashes (grown on demand, never shrunk).
///
/// Exact reformulation of Ceph's loop without a division per item: for a
/// non-positive `ln` and positive weight `w`, trunc(ln / w) > d (d an
/// integer) holds exactly when ln > d * w. With equal weights, ln only grows
/// with the hash (below 0xffff), so only the top hash and the few hashes just
/// below it need a logarithm.
#[inline]
pub(crate) fn straw2_choose(
    items: &[i32],
    weights: &[u32],
    x: u32,
    r: u32,
    scratch: &mut Vec<u32>,
) -> i32 {
    debug_assert_eq!(items.len(), weights.len());
    debug_assert!(!items.is_empty());
    if scratch.len() < items.len() {
        scratch.resize(items.len(), 0);
    }
    let hashes = &mut scratch[..items.len()];
    #[cfg(target_arch = "x86_64")]
    {
        if avx512::available() {
            // SAFETY: the CPU has AVX-512F (checked by `available`).
            return unsafe { avx512::choose(items, weights, x, r, hashes) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { choose_avx2(items, weights, x, r, hashes) };
        }
    }
    choose_portable(items, weights, x, r, hashes)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn choose_avx2(items: &[i32], weights: &[u32], x: u32, r: u32, hashes: &mut [u32]) -> i32 {
    choose_portable(items, weights, x, r, hashes)
}

/// Lanes the portable path hashes together (the last block zero-padded), so
/// the autovectoriser sees whole vectors even for small buckets.
const HASH_LANES: usize = 16;

#[inline(always)]
fn hash_block(x: u32, ids: &[i32; HASH_LANES], r: u32, out: &mut [u32; HASH_LANES]) {
    for k in 0..HASH_LANES {
        out[k] = hash32_3(x, ids[k] as u32, r) & 0xffff;
    }
}

#[inline(always)]
fn hash_items_portable(x: u32, items: &[i32], r: u32, out: &mut [u32]) {
    if cfg!(debug_assertions) {
        // Unoptimised builds gain nothing from padded blocks.
        for (o, &id) in out.iter_mut().zip(items.iter()) {
            *o = hash32_3(x, id as u32, r) & 0xffff;
        }
        return;
    }
    let mut ins = items.chunks_exact(HASH_LANES);
    let mut outs = out.chunks_exact_mut(HASH_LANES);
    for (i, o) in (&mut ins).zip(&mut outs) {
        let ids: &[i32; HASH_LANES] = i.try_into().expect("chunks_exact yields full blocks");
        let dst: &mut [u32; HASH_LANES] = o.try_into().expect("chunks_exact yields full blocks");
        hash_block(x, ids, r, dst);
    }
    let rest = ins.remainder();
    if !rest.is_empty() {
        let mut ids = [0i32; HASH_LANES];
        ids[..rest.len()].copy_from_slice(rest);
        let mut tmp = [0u32; HASH_LANES];
        hash_block(x, &ids, r, &mut tmp);
        outs.into_remainder().copy_from_slice(&tmp[..rest.len()]);
    }
}

#[inline(always)]
fn choose_portable(items: &[i32], weights: &[u32], x: u32, r: u32, hashes: &mut [u32]) -> i32 {
    hash_items_portable(x, items, r, hashes);
    let w0 = weights[0];
    // Folds rather than `all`/`max` with early exits so they vectorise.
    let equal = weights.iter().fold(true, |same, &w| same & (w == w0));
    let top = hashes.iter().copied().fold(0u32, u32::max);
    let lowest = if equal { winning_floor(top, w0) } else { None };
    match lowest {
        Some(lowest) => {
            let i = hashes
                .iter()
                .position(|&u| u >= lowest)
                .expect("the top hash reaches its own floor");
            items[i]
        }
        None => items[choose_general(hashes, weights)],
    }
}

/// Steps the equal-weight search may walk down from the top hash before it
/// hands over to the general loop (only very large weights need more).
const MAX_TIE_WALK: u32 = 64;

/// The smallest non-zero rise of the straw2 logarithm between neighbouring
/// hashes below 0xffff (checked by a test). Ceph's `crush_ln` is flat at
/// some 10000 places in its upper half, never twice in a row (also
/// checked); everywhere else it rises by at least this much. So with a
/// weight no larger than this (items up to about 856 TiB), trunc(ln/w)
/// only ties between the two hashes of a flat step.
const LN_MIN_RISE: i64 = 56_128_037;

/// Bit u is set when crush_ln(u) == crush_ln(u - 1) (8 KiB, built at
/// compile time).
static LN_FLAT: [u64; 1024] = {
    let mut bits = [0u64; 1024];
    let mut u = 1u32;
    while u < 0x10000 {
        if crush_ln(u) == crush_ln(u - 1) {
            bits[(u / 64) as usize] |= 1 << (u % 64);
        }
        u += 1;
    }
    bits
};

#[inline(always)]
fn ln_is_flat_at(u: u32) -> bool {
    LN_FLAT[(u / 64) as usize & 1023] >> (u % 64) & 1 != 0
}

/// For a bucket whose items all weigh `w` (> 0) and whose highest hash is
/// `top`: the smallest hash whose draw equals the top draw. Since the draw
/// trunc(ln(u)/w) only grows with u (below 0xffff), the winner is the first
/// item whose hash reaches it. `None` (rare: a zero weight, the non-monotone
/// top value 0xffff, or a long run of equal draws) means "use the general
/// loop".
#[inline]
fn winning_floor(top: u32, w: u32) -> Option<u32> {
    if w == 0 || top >= 0xffff {
        return None;
    }
    let wd = i64::from(w);
    if wd <= LN_MIN_RISE {
        // Only a flat step of the logarithm ties (see LN_MIN_RISE): for
        // ln(u) - ln(u - 1) >= w, trunc(ln(u - 1)/w) < trunc(ln(u)/w).
        let mut lowest = top;
        while lowest > 0 && ln_is_flat_at(lowest) {
            lowest -= 1;
        }
        return Some(lowest);
    }
    let d = ln_draw(top) / wd;
    // draw(u) >= d  <=>  ln(u) > (d - 1) * w
    let bound = i128::from(d - 1) * i128::from(wd);
    let mut lowest = top;
    while lowest > 0 && i128::from(ln_draw(lowest - 1)) > bound {
        lowest -= 1;
        if top - lowest > MAX_TIE_WALK {
            return None;
        }
    }
    Some(lowest)
}

/// The general straw2 loop over precomputed hashes (any weights), without
/// a division per item; returns the winning index.
#[inline(never)]
fn choose_general(hashes: &[u32], weights: &[u32]) -> usize {
    let w0 = weights[0];
    let mut best = 0;
    let mut best_draw = if w0 != 0 {
        ln_draw(hashes[0]) / i64::from(w0)
    } else {
        i64::MIN
    };
    for (i, (&u, &w)) in hashes.iter().zip(weights.iter()).enumerate().skip(1) {
        if w == 0 {
            continue;
        }
        let ln = ln_draw(u);
        if best_draw == i64::MIN || i128::from(ln) > i128::from(best_draw) * i128::from(w) {
            best_draw = ln / i64::from(w);
            best = i;
        }
    }
    best
}

/// AVX-512 straw2: two 16-lane blocks hashed side by side (the rjenkins mix
/// is one long dependency chain, so a single block leaves the vector units
/// idle), the running maximum kept in a register, and the bucket tail
/// hashed in the narrowest vectors that cover it (8 and 4 lanes cost a half
/// and a quarter of a 16-lane block), with masked loads and stores.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// rjenkins1 seed and the two constants Ceph mixes into `hash32_3`.
    const SEED: i32 = 1_315_423_911;
    const X0: i32 = 231_232;
    const Y0: i32 = 1_232;

    #[inline]
    pub(super) fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
    }

    /// The vector operations the hash needs, at one width. Every function
    /// is `unsafe`: the CPU must have AVX-512F and AVX-512VL; they are only
    /// called from (and inlined into) functions that enable both.
    macro_rules! lane_ops {
        ($module:ident, $vec:ty, $set1:ident, $sub:ident, $xor:ident, $and:ident, $srli:ident, $slli:ident, $imm:ty) => {
            mod $module {
                use std::arch::x86_64::*;
                pub(super) type V = $vec;
                #[inline(always)]
                pub(super) unsafe fn set1(v: i32) -> V {
                    $set1(v)
                }
                #[inline(always)]
                pub(super) unsafe fn sub(a: V, b: V) -> V {
                    $sub(a, b)
                }
                #[inline(always)]
                pub(super) unsafe fn xor(a: V, b: V) -> V {
                    $xor(a, b)
                }
                #[inline(always)]
                pub(super) unsafe fn and(a: V, b: V) -> V {
                    $and(a, b)
                }
                #[inline(always)]
                pub(super) unsafe fn right<const S: $imm>(a: V) -> V {
                    $srli::<S>(a)
                }
                #[inline(always)]
                pub(super) unsafe fn left<const S: $imm>(a: V) -> V {
                    $slli::<S>(a)
                }
            }
        };
    }
    lane_ops!(
        w16,
        __m512i,
        _mm512_set1_epi32,
        _mm512_sub_epi32,
        _mm512_xor_si512,
        _mm512_and_si512,
        _mm512_srli_epi32,
        _mm512_slli_epi32,
        u32
    );
    lane_ops!(
        w8,
        __m256i,
        _mm256_set1_epi32,
        _mm256_sub_epi32,
        _mm256_xor_si256,
        _mm256_and_si256,
        _mm256_srli_epi32,
        _mm256_slli_epi32,
        i32
    );
    lane_ops!(
        w4,
        __m128i,
        _mm_set1_epi32,
        _mm_sub_epi32,
        _mm_xor_si128,
        _mm_and_si128,
        _mm_srli_epi32,
        _mm_slli_epi32,
        i32
    );

    /// `a = (a - b - c) ^ shift(c)` over `N` vectors at once.
    macro_rules! step {
        ($w:ident, $a:ident, $b:ident, $c:ident, $dir:ident, $n:literal) => {
            for k in 0..N {
                $a[k] = $w::xor($w::sub($w::sub($a[k], $b[k]), $c[k]), $w::$dir::<$n>($c[k]));
            }
        };
    }

    /// Robert Jenkins' 96-bit mix, as in `hash.rs`, on `N` vectors.
    macro_rules! mix {
        ($w:ident, $a:ident, $b:ident, $c:ident) => {
            step!($w, $a, $b, $c, right, 13);
            step!($w, $b, $c, $a, left, 8);
            step!($w, $c, $a, $b, right, 13);
            step!($w, $a, $b, $c, right, 12);
            step!($w, $b, $c, $a, left, 16);
            step!($w, $c, $a, $b, right, 5);
            step!($w, $a, $b, $c, right, 3);
            step!($w, $b, $c, $a, left, 10);
            step!($w, $c, $a, $b, right, 15);
        };
    }

    /// Defines `$name::<N>(x, r, ids)`: `hash32_3(x, id, r) & 0xffff` for
    /// every lane of `N` vectors of ids.
    macro_rules! define_hash {
        ($name:ident, $w:ident) => {
            /// # Safety
            /// As the `lane_ops` functions: AVX-512F and AVX-512VL.
            #[inline(always)]
            unsafe fn $name<const N: usize>(x: u32, r: u32, ids: [$w::V; N]) -> [$w::V; N] {
                // SAFETY: the caller guarantees the CPU features.
                unsafe {
                    let seed_x_r = $w::set1(SEED ^ x as i32 ^ r as i32);
                    let mut a = [$w::set1(x as i32); N];
                    let mut b = ids;
                    let mut c = [$w::set1(r as i32); N];
                    let mut h = ids;
                    for v in h.iter_mut() {
                        *v = $w::xor(seed_x_r, *v);
                    }
                    let mut xs = [$w::set1(X0); N];
                    let mut ys = [$w::set1(Y0); N];
                    mix!($w, a, b, h);
                    mix!($w, c, xs, h);
                    mix!($w, ys, a, h);
                    mix!($w, b, xs, h);
                    mix!($w, ys, c, h);
                    let low16 = $w::set1(0xffff);
                    for v in h.iter_mut() {
                        *v = $w::and(*v, low16);
                    }
                    h
                }
            }
        };
    }

    define_hash!(hash16, w16);
    define_hash!(hash8, w8);
    define_hash!(hash4, w4);

    /// Hashes every item into `hashes` and returns the highest hash.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl")]
    fn hash_all(x: u32, r: u32, items: &[i32], hashes: &mut [u32]) -> u32 {
        let n = items.len();
        debug_assert!(hashes.len() >= n);
        let ip = items.as_ptr();
        let hp = hashes.as_mut_ptr();
        let mut top = _mm512_setzero_si512();
        let mut i = 0;
        // SAFETY (all loads and stores below): whole vectors are read and
        // written only while they end at or before n; partial ones use masks
        // that cover exactly the remaining lanes, and `hashes` holds >= n.
        unsafe {
            while i + 32 <= n {
                let ids = [
                    _mm512_loadu_si512(ip.add(i).cast()),
                    _mm512_loadu_si512(ip.add(i + 16).cast()),
                ];
                let [h0, h1] = hash16(x, r, ids);
                _mm512_storeu_si512(hp.add(i).cast(), h0);
                _mm512_storeu_si512(hp.add(i + 16).cast(), h1);
                top = _mm512_max_epu32(top, _mm512_max_epu32(h0, h1));
                i += 32;
            }
            let mut top8 = _mm256_setzero_si256();
            let rest = n - i;
            if rest > 12 {
                // 13..=31 lanes: a full block and a masked one, or one masked block.
                let m: __mmask16 = if rest >= 16 {
                    0xffff
                } else {
                    ((1u32 << rest) - 1) as u16
                };
                let m2: __mmask16 = if rest > 16 {
                    ((1u32 << (rest - 16)) - 1) as u16
                } else {
                    0
                };
                let ids = [
                    _mm512_maskz_loadu_epi32(m, ip.add(i)),
                    _mm512_maskz_loadu_epi32(m2, ip.add(i + 16)),
                ];
                let [h0, h1] = if m2 != 0 {
                    hash16(x, r, ids)
                } else {
                    let [h0] = hash16(x, r, [ids[0]]);
                    [h0, _mm512_setzero_si512()]
                };
                _mm512_mask_storeu_epi32(hp.add(i).cast(), m, h0);
                _mm512_mask_storeu_epi32(hp.add(i + 16).cast(), m2, h1);
                let h0 = _mm512_maskz_mov_epi32(m, h0);
                let h1 = _mm512_maskz_mov_epi32(m2, h1);
                top = _mm512_max_epu32(top, _mm512_max_epu32(h0, h1));
            } else if rest > 4 {
                // 5..=12 lanes: 8 lanes, then 4 more (masked) when needed.
                let m8: __mmask8 = if rest >= 8 {
                    0xff
                } else {
                    ((1u32 << rest) - 1) as u8
                };
                let m4: __mmask8 = if rest > 8 {
                    ((1u32 << (rest - 8)) - 1) as u8
                } else {
                    0
                };
                let [h8] = hash8(x, r, [_mm256_maskz_loadu_epi32(m8, ip.add(i))]);
                _mm256_mask_storeu_epi32(hp.add(i).cast(), m8, h8);
                top8 = _mm256_maskz_mov_epi32(m8, h8);
                if m4 != 0 {
                    let [h4] = hash4(x, r, [_mm_maskz_loadu_epi32(m4, ip.add(i + 8))]);
                    _mm_mask_storeu_epi32(hp.add(i + 8).cast(), m4, h4);
                    let h4 = _mm_maskz_mov_epi32(m4, h4);
                    top8 = _mm256_max_epu32(top8, _mm256_zextsi128_si256(h4));
                }
            } else if rest > 0 {
                let m4: __mmask8 = ((1u32 << rest) - 1) as u8;
                let [h4] = hash4(x, r, [_mm_maskz_loadu_epi32(m4, ip.add(i))]);
                _mm_mask_storeu_epi32(hp.add(i).cast(), m4, h4);
                top8 = _mm256_zextsi128_si256(_mm_maskz_mov_epi32(m4, h4));
            }
            top = _mm512_max_epu32(top, _mm512_zextsi256_si512(top8));
        }
        _mm512_reduce_max_epu32(top)
    }

    /// Whether every weight equals the first.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl")]
    fn all_equal(weights: &[u32]) -> bool {
        let n = weights.len();
        let w0 = _mm512_set1_epi32(weights[0] as i32);
        let p = weights.as_ptr();
        let mut i = 0;
        let mut differ: __mmask16 = 0;
        // SAFETY: as in `hash_all`.
        unsafe {
            while i + 16 <= n {
                let w = _mm512_loadu_si512(p.add(i).cast());
                differ |= _mm512_cmpneq_epu32_mask(w, w0);
                i += 16;
            }
            if i < n {
                let m: __mmask16 = ((1u32 << (n - i)) - 1) as u16;
                let w = _mm512_maskz_loadu_epi32(m, p.add(i).cast());
                differ |= _mm512_mask_cmpneq_epu32_mask(m, w, w0);
            }
        }
        differ == 0
    }

    /// The first index whose hash is at least `floor` (one exists).
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl")]
    fn first_at_least(hashes: &[u32], floor: u32) -> usize {
        let n = hashes.len();
        let f = _mm512_set1_epi32(floor as i32);
        let p = hashes.as_ptr();
        let mut i = 0;
        // SAFETY: as in `hash_all`.
        unsafe {
            while i < n {
                let m: __mmask16 = if n - i >= 16 {
                    0xffff
                } else {
                    ((1u32 << (n - i)) - 1) as u16
                };
                let h = _mm512_maskz_loadu_epi32(m, p.add(i).cast());
                let hit = _mm512_mask_cmpge_epu32_mask(m, h, f);
                if hit != 0 {
                    return i + hit.trailing_zeros() as usize;
                }
                i += 16;
            }
        }
        unreachable!("the top hash reaches its own floor")
    }

    /// [`super::straw2_choose`] on AVX-512.
    #[target_feature(enable = "avx512f,avx512vl")]
    pub(super) fn choose(
        items: &[i32],
        weights: &[u32],
        x: u32,
        r: u32,
        hashes: &mut [u32],
    ) -> i32 {
        let top = hash_all(x, r, items, hashes);
        if all_equal(weights) {
            if let Some(floor) = super::winning_floor(top, weights[0]) {
                return items[first_at_least(hashes, floor)];
            }
        }
        items[super::choose_general(hashes, weights)]
    }
}

/// Ceph's straw2 loop, division by division (the reference for tests).
#[cfg(test)]
pub(crate) fn straw2_choose_reference(items: &[i32], weights: &[u32], x: u32, r: u32) -> i32 {
    let mut best = 0;
    let mut best_draw = i64::MIN;
    for (i, (&id, &w)) in items.iter().zip(weights.iter()).enumerate() {
        let draw = if w != 0 {
            ln_draw(hash32_3(x, id as u32, r) & 0xffff) / i64::from(w)
        } else {
            i64::MIN
        };
        if i == 0 || draw > best_draw {
            best = i;
            best_draw = draw;
        }
    }
    items[best]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(items: &[i32], weights: &[u32], x: u32, r: u32) -> Result<(), TestCaseError> {
        let want = straw2_choose_reference(items, weights, x, r);
        let mut scratch = Vec::new();
        prop_assert_eq!(straw2_choose(items, weights, x, r, &mut scratch), want);
        let mut hashes = vec![0; items.len()];
        prop_assert_eq!(choose_portable(items, weights, x, r, &mut hashes), want);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, failure_persistence: None, ..ProptestConfig::default() })]

        /// Every straw2 path (AVX-512 or AVX2 as the CPU allows, and the
        /// portable one) picks what Ceph's loop picks, for bucket sizes
        /// around the 16- and 32-lane block edges.
        #[test]
        fn straw2_fast_paths_equal_reference(
            items in prop::collection::vec((-50i32..2000, prop::sample::select(vec![0u32, 1, 0x8000, 0x10000, 0x10000, 0x57530, 0xffff_ffff, 3])), 1..70),
            equal in any::<bool>(),
            x in any::<u32>(),
            r in 0u32..200,
        ) {
            let ids: Vec<i32> = items.iter().map(|p| p.0).collect();
            let w_first = items[0].1;
            let weights: Vec<u32> = items.iter().map(|p| if equal { w_first } else { p.1 }).collect();
            check(&ids, &weights, x, r)?;
        }
    }

    /// The constants the equal-weight shortcut relies on.
    #[test]
    fn ln_rise_and_flat_table() {
        let steps: Vec<(u32, i64)> = (1..0xffffu32)
            .map(|u| (u, crush_ln(u) as i64 - crush_ln(u - 1) as i64))
            .collect();
        let min_rise = steps.iter().map(|s| s.1).filter(|&s| s > 0).min();
        assert_eq!(min_rise, Some(LN_MIN_RISE));
        assert!(
            steps.iter().all(|s| s.1 >= 0),
            "crush_ln decreases below 0xffff"
        );
        let mut flats = 0;
        for &(u, s) in &steps {
            assert_eq!(ln_is_flat_at(u), s == 0, "flat bit of {u}");
            flats += usize::from(s == 0);
        }
        assert!(
            flats > 9000,
            "expected Ceph's ~10000 flat steps, found {flats}"
        );
        assert!(
            steps.windows(2).all(|p| p[0].1 != 0 || p[1].1 != 0),
            "two flat steps in a row"
        );
    }

    /// `winning_floor` against the definition, for every top hash and
    /// weights on both sides of LN_MIN_RISE.
    #[test]
    fn winning_floor_exhaustive() {
        let draw = |u: u32, w: u32| ln_draw(u) / i64::from(w);
        for w in [
            1u32,
            0x10000,
            0x40000,
            0x300000,
            LN_MIN_RISE as u32,
            LN_MIN_RISE as u32 + 1,
            0x1000_0000,
        ] {
            for top in 0..0xffffu32 {
                let mut want = top;
                while want > 0 && draw(want - 1, w) == draw(top, w) {
                    want -= 1;
                }
                match winning_floor(top, w) {
                    Some(got) => assert_eq!(got, want, "top {top} weight {w:#x}"),
                    None => assert!(top - want > MAX_TIE_WALK, "top {top} weight {w:#x}"),
                }
            }
        }
    }

    /// Hash values of 0xffff (where the logarithm is not monotone) and
    /// buckets of every size from 1 to 100 with equal weights.
    #[test]
    fn straw2_sizes_and_top_hash() {
        let mut found_top = 0;
        for n in 1..=100usize {
            let ids: Vec<i32> = (0..n as i32).collect();
            let weights = vec![0x40000u32; n];
            for x in 0..300u32 {
                for r in 0..3 {
                    if ids
                        .iter()
                        .any(|&id| hash32_3(x, id as u32, r) & 0xffff == 0xffff)
                    {
                        found_top += 1;
                    }
                    check(&ids, &weights, x, r).expect("paths agree");
                }
            }
        }
        assert!(found_top > 0, "no input reached the 0xffff hash");
    }
}
