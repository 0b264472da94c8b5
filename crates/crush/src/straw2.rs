//! The straw2 draw: which item of a bucket input `x` picks on attempt `r`.
//! Owns the vectorised item hashing (AVX-512 with explicit intrinsics, AVX2
//! and portable code through the autovectoriser) and the exact,
//! division-free choice of the winner, one draw at a time or as a batch of
//! draws hashed together. Results are Ceph's, bit for bit; the rule
//! interpreter in `mapper.rs` calls [`straw2_choose`] and
//! [`Straw2Scratch::run_batch`].

use crate::hash::hash32_3;
use crate::ln::crush_ln;

/// `crush_ln(u) - 2^48`: the (non-positive) straw2 numerator.
#[inline(always)]
fn ln_draw(u: u32) -> i64 {
    crush_ln(u) as i64 - 0x1_0000_0000_0000
}

/// Scratch space of the straw2 draws: the lanes (item ids, attempt numbers,
/// weights) of a batch of draws and their hashes. Grown on demand, never
/// shrunk; one per [`crate::Workspace`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Straw2Scratch {
    ids: Vec<i32>,
    rs: Vec<u32>,
    weights: Vec<u32>,
    hashes: Vec<u32>,
    /// (first lane, lane count) of each draw of the batch.
    draws: Vec<(usize, usize)>,
}

impl Straw2Scratch {
    /// Starts a new batch of draws.
    pub(crate) fn clear_batch(&mut self) {
        self.ids.clear();
        self.rs.clear();
        self.weights.clear();
        self.draws.clear();
    }

    /// Adds the draw of attempt `r` over a bucket's `items` and `weights`
    /// (non-empty, same length) to the batch.
    pub(crate) fn push_draw(&mut self, items: &[i32], weights: &[u32], r: u32) {
        debug_assert_eq!(items.len(), weights.len());
        debug_assert!(!items.is_empty());
        self.draws.push((self.ids.len(), items.len()));
        self.ids.extend_from_slice(items);
        self.weights.extend_from_slice(weights);
        self.rs.resize(self.rs.len() + items.len(), r);
    }

    /// Makes every draw of the batch for input `x`, hashing all their
    /// lanes in one stream (so short buckets share vectors and the long
    /// dependency chains of several draws overlap); `out[i]` is the item
    /// draw `i` picks. Same results as [`straw2_choose`] draw by draw.
    pub(crate) fn run_batch(&mut self, x: u32, out: &mut Vec<i32>) {
        out.clear();
        let n = self.ids.len();
        if self.hashes.len() < n {
            self.hashes.resize(n, 0);
        }
        #[cfg(target_arch = "x86_64")]
        {
            if avx512::available() {
                let hashes = &mut self.hashes[..n];
                // SAFETY: the CPU has AVX-512F and AVX-512VL (checked by `available`).
                unsafe {
                    avx512::hash_lanes(x, &self.ids, avx512::Attempts::Each(&self.rs), hashes)
                };
                for &(first, len) in &self.draws {
                    let lanes = first..first + len;
                    // SAFETY: as above.
                    let i = unsafe {
                        avx512::pick(&self.weights[lanes.clone()], &self.hashes[lanes.clone()])
                    };
                    out.push(self.ids[first + i]);
                }
                return;
            }
        }
        for &(first, len) in &self.draws {
            let lanes = first..first + len;
            let (items, weights) = (&self.ids[lanes.clone()], &self.weights[lanes.clone()]);
            let r = self.rs[first];
            out.push(choose_dispatch(
                items,
                weights,
                x,
                r,
                &mut self.hashes[lanes],
            ));
        }
    }
}

/// One draw of a small batch: attempt `r` over a bucket's items.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SmallDraw<'a> {
    pub(crate) items: &'a [i32],
    pub(crate) weights: &'a [u32],
    pub(crate) r: u32,
}

/// Most draws [`choose_small`] takes at once.
pub(crate) const SMALL_DRAWS: usize = 4;

/// Makes up to [`SMALL_DRAWS`] draws over buckets of at most 16 items side
/// by side, without copying their items (`out[i]` is draw i's pick).
/// Returns false, having done nothing, when the draws do not fit or the
/// CPU lacks AVX-512; the caller then uses a batch or single draws.
pub(crate) fn choose_small(draws: &[SmallDraw<'_>], x: u32, out: &mut [i32]) -> bool {
    let fits = draws.len() <= SMALL_DRAWS
        && out.len() >= draws.len()
        && draws
            .iter()
            .all(|d| (1..=16).contains(&d.items.len()) && d.items.len() == d.weights.len());
    if !fits {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if avx512::available() {
            // SAFETY: the CPU has AVX-512F and AVX-512VL, and the draws fit
            // (checked above).
            unsafe {
                match draws.len() {
                    1 => avx512::choose_small::<1>(draws, x, out),
                    2 => avx512::choose_small::<2>(draws, x, out),
                    3 => avx512::choose_small::<3>(draws, x, out),
                    4 => avx512::choose_small::<4>(draws, x, out),
                    _ => return draws.is_empty(),
                }
            }
            return true;
        }
    }
    let _ = x;
    false
}

/// The straw2 choice over `items` with 16.16 `weights`: the first item with
/// the highest trunc(ln / weight) draw, as Ceph's `bucket_straw2_choose`.
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
    scratch: &mut Straw2Scratch,
) -> i32 {
    debug_assert_eq!(items.len(), weights.len());
    debug_assert!(!items.is_empty());
    let n = items.len();
    if scratch.hashes.len() < n {
        scratch.hashes.resize(n, 0);
    }
    #[cfg(target_arch = "x86_64")]
    {
        if avx512::available() {
            let hashes = &mut scratch.hashes[..n];
            // SAFETY: the CPU has AVX-512F and AVX-512VL (checked by `available`).
            return unsafe { avx512::choose_one(items, weights, x, r, hashes) };
        }
    }
    choose_dispatch(items, weights, x, r, &mut scratch.hashes[..n])
}

/// Most attempts [`straw2_choose_attempts`] hashes side by side.
const ATTEMPTS_AT_ONCE: usize = 4;

/// The draws of consecutive attempts over one bucket: `out[k]` is what
/// [`straw2_choose`] picks for attempt `r0 + k`. On AVX-512 each block of
/// item ids is loaded once and hashed for up to four attempts side by side
/// (independent dependency chains, no padding lanes between draws).
pub(crate) fn straw2_choose_attempts(
    items: &[i32],
    weights: &[u32],
    x: u32,
    r0: u32,
    out: &mut [i32],
    scratch: &mut Straw2Scratch,
) {
    debug_assert_eq!(items.len(), weights.len());
    debug_assert!(!items.is_empty());
    #[cfg(target_arch = "x86_64")]
    {
        if avx512::available() {
            let need = ATTEMPTS_AT_ONCE * items.len();
            if scratch.hashes.len() < need {
                scratch.hashes.resize(need, 0);
            }
            let hashes = &mut scratch.hashes[..need];
            // SAFETY: the CPU has AVX-512F and AVX-512VL (checked by
            // `available`); `hashes` holds ATTEMPTS_AT_ONCE hashes per item
            // and `items` is non-empty with as many weights.
            unsafe {
                let equal = avx512::weights_equal(weights);
                let mut r = r0;
                for got in out.chunks_mut(ATTEMPTS_AT_ONCE) {
                    let rs = [r, r.wrapping_add(1), r.wrapping_add(2), r.wrapping_add(3)];
                    match got.len() {
                        1 => avx512::choose_attempts::<1>(
                            items,
                            weights,
                            x,
                            &[rs[0]],
                            equal,
                            hashes,
                            got,
                        ),
                        2 => avx512::choose_attempts::<2>(
                            items,
                            weights,
                            x,
                            &[rs[0], rs[1]],
                            equal,
                            hashes,
                            got,
                        ),
                        3 => avx512::choose_attempts::<3>(
                            items,
                            weights,
                            x,
                            &[rs[0], rs[1], rs[2]],
                            equal,
                            hashes,
                            got,
                        ),
                        _ => {
                            avx512::choose_attempts::<4>(items, weights, x, &rs, equal, hashes, got)
                        }
                    }
                    r = r.wrapping_add(got.len() as u32);
                }
            }
            return;
        }
    }
    for (k, o) in out.iter_mut().enumerate() {
        *o = straw2_choose(items, weights, x, r0.wrapping_add(k as u32), scratch);
    }
}

/// straw2 without AVX-512: AVX2 when the CPU has it, else portable code.
#[inline]
fn choose_dispatch(items: &[i32], weights: &[u32], x: u32, r: u32, hashes: &mut [u32]) -> i32 {
    #[cfg(target_arch = "x86_64")]
    {
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
#[inline(always)]
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

/// AVX-512 straw2. The lanes of one or several draws are hashed as one
/// stream, two 16-lane vectors side by side (the rjenkins mix is one long
/// dependency chain, so a single vector leaves the units idle); the last
/// few lanes go in 8- and 4-lane vectors (a half and a quarter of the work
/// of a 16-lane one) stepped together with the last pair, so that their
/// chains overlap too. Partial vectors use masked loads and stores.
#[cfg(target_arch = "x86_64")]
// Parallel arrays of vectors are stepped in lockstep by index on purpose.
#[allow(clippy::needless_range_loop)]
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

    /// `a = (a - b - c) ^ shift(c)` on every vector of the three groups
    /// (`.0` 16 lanes x P, `.1` 8 lanes x Q, `.2` 4 lanes x S).
    macro_rules! step {
        ($a:ident, $b:ident, $c:ident, $dir:ident, $n:literal) => {
            for k in 0..P {
                $a.0[k] = w16::xor(
                    w16::sub(w16::sub($a.0[k], $b.0[k]), $c.0[k]),
                    w16::$dir::<$n>($c.0[k]),
                );
            }
            for k in 0..Q {
                $a.1[k] = w8::xor(
                    w8::sub(w8::sub($a.1[k], $b.1[k]), $c.1[k]),
                    w8::$dir::<$n>($c.1[k]),
                );
            }
            for k in 0..S {
                $a.2[k] = w4::xor(
                    w4::sub(w4::sub($a.2[k], $b.2[k]), $c.2[k]),
                    w4::$dir::<$n>($c.2[k]),
                );
            }
        };
    }

    /// Robert Jenkins' 96-bit mix, as in `hash.rs`, on every vector.
    macro_rules! mix {
        ($a:ident, $b:ident, $c:ident) => {
            step!($a, $b, $c, right, 13);
            step!($b, $c, $a, left, 8);
            step!($c, $a, $b, right, 13);
            step!($a, $b, $c, right, 12);
            step!($b, $c, $a, left, 16);
            step!($c, $a, $b, right, 5);
            step!($a, $b, $c, right, 3);
            step!($b, $c, $a, left, 10);
            step!($c, $a, $b, right, 15);
        };
    }

    /// Vectors of the three widths: P of 16 lanes, Q of 8, S of 4.
    type Group<const P: usize, const Q: usize, const S: usize> =
        ([w16::V; P], [w8::V; Q], [w4::V; S]);

    /// A group with every lane set to `v`.
    #[inline(always)]
    unsafe fn splat<const P: usize, const Q: usize, const S: usize>(v: i32) -> Group<P, Q, S> {
        // SAFETY: the caller guarantees the CPU features.
        unsafe { ([w16::set1(v); P], [w8::set1(v); Q], [w4::set1(v); S]) }
    }

    /// `hash32_3(x, id, r) & 0xffff` on every lane (ids and attempts lane
    /// by lane).
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX-512VL; only called from (and
    /// inlined into) functions that enable them.
    #[inline(always)]
    unsafe fn hash_group<const P: usize, const Q: usize, const S: usize>(
        x: u32,
        ids: Group<P, Q, S>,
        rs: Group<P, Q, S>,
    ) -> Group<P, Q, S> {
        // SAFETY: the caller guarantees the CPU features.
        unsafe {
            let seed_x = SEED ^ x as i32;
            let mut h = ids;
            for k in 0..P {
                h.0[k] = w16::xor(w16::xor(w16::set1(seed_x), ids.0[k]), rs.0[k]);
            }
            for k in 0..Q {
                h.1[k] = w8::xor(w8::xor(w8::set1(seed_x), ids.1[k]), rs.1[k]);
            }
            for k in 0..S {
                h.2[k] = w4::xor(w4::xor(w4::set1(seed_x), ids.2[k]), rs.2[k]);
            }
            let mut a = splat::<P, Q, S>(x as i32);
            let mut b = ids;
            let mut c = rs;
            let mut xs = splat::<P, Q, S>(X0);
            let mut ys = splat::<P, Q, S>(Y0);
            mix!(a, b, h);
            mix!(c, xs, h);
            mix!(ys, a, h);
            mix!(b, xs, h);
            mix!(ys, c, h);
            let low16 = splat::<P, Q, S>(0xffff);
            for k in 0..P {
                h.0[k] = w16::and(h.0[k], low16.0[k]);
            }
            for k in 0..Q {
                h.1[k] = w8::and(h.1[k], low16.1[k]);
            }
            for k in 0..S {
                h.2[k] = w4::and(h.2[k], low16.2[k]);
            }
            h
        }
    }

    /// Mask of the first `lanes` lanes (saturating at 16).
    #[inline(always)]
    fn mask16(lanes: usize) -> u16 {
        if lanes >= 16 {
            0xffff
        } else {
            ((1u32 << lanes) - 1) as u16
        }
    }

    /// Hashes lanes `at .. at + lanes` (lanes <= 16P + 8Q + 4S; the groups
    /// cover them in order: 16-lane vectors, then 8, then 4).
    ///
    /// # Safety
    /// AVX-512F and AVX-512VL; `at + lanes` <= the length of all three
    /// slices.
    /// `rs` is either one attempt for every lane (`Attempts::Same`) or one
    /// per lane. Returns `best` updated with these lanes.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn chunk<const P: usize, const Q: usize, const S: usize>(
        x: u32,
        ids: &[i32],
        rs: Attempts<'_>,
        hashes: &mut [u32],
        at: usize,
        lanes: usize,
        best: &Best,
    ) -> Best {
        debug_assert!(at + lanes <= ids.len() && ids.len() <= hashes.len());
        let (same_r, rs) = match rs {
            Attempts::Same(r) => (Some(r), &[][..]),
            Attempts::Each(rs) => {
                debug_assert!(rs.len() >= ids.len());
                (None, rs)
            }
        };
        debug_assert!(lanes <= 16 * P + 8 * Q + 4 * S);
        let (ip, rp, hp) = (
            ids.as_ptr(),
            rs.as_ptr().cast::<i32>(),
            hashes.as_mut_ptr().cast::<i32>(),
        );
        // SAFETY: every load and store is masked to lanes below at + lanes,
        // which the caller guarantees are inside the slices; the CPU
        // features are the caller's guarantee too.
        unsafe {
            let mut m16 = [0u16; P];
            let mut id = splat::<P, Q, S>(0);
            let mut r = splat::<P, Q, S>(same_r.unwrap_or(0) as i32);
            let mut off = at;
            let mut left = lanes;
            for k in 0..P {
                m16[k] = mask16(left);
                id.0[k] = _mm512_maskz_loadu_epi32(m16[k], ip.add(off));
                if same_r.is_none() {
                    r.0[k] = _mm512_maskz_loadu_epi32(m16[k], rp.add(off));
                }
                off += 16;
                left = left.saturating_sub(16);
            }
            let m8 = [mask16(left) as u8; Q];
            for k in 0..Q {
                id.1[k] = _mm256_maskz_loadu_epi32(m8[k], ip.add(off));
                if same_r.is_none() {
                    r.1[k] = _mm256_maskz_loadu_epi32(m8[k], rp.add(off));
                }
                off += 8;
                left = left.saturating_sub(8);
            }
            let m4 = [(mask16(left) & 0xf) as u8; S];
            for k in 0..S {
                id.2[k] = _mm_maskz_loadu_epi32(m4[k], ip.add(off));
                if same_r.is_none() {
                    r.2[k] = _mm_maskz_loadu_epi32(m4[k], rp.add(off));
                }
                off += 4;
            }
            let h = hash_group::<P, Q, S>(x, id, r);
            let mut off = at;
            let mut best = *best;
            let lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
            // Lanes are visited in index order and only a strictly higher
            // hash replaces a lane's best, so each lane keeps the first
            // index of its highest hash.
            let mut keep = |v: __m512i, off: usize| {
                let higher = _mm512_cmpgt_epu32_mask(v, best.0);
                best.0 = _mm512_max_epu32(best.0, v);
                let at = _mm512_add_epi32(_mm512_set1_epi32(off as i32), lane);
                best.1 = _mm512_mask_mov_epi32(best.1, higher, at);
            };
            for k in 0..P {
                _mm512_mask_storeu_epi32(hp.add(off), m16[k], h.0[k]);
                keep(_mm512_maskz_mov_epi32(m16[k], h.0[k]), off);
                off += 16;
            }
            for k in 0..Q {
                _mm256_mask_storeu_epi32(hp.add(off), m8[k], h.1[k]);
                keep(
                    _mm512_zextsi256_si512(_mm256_maskz_mov_epi32(m8[k], h.1[k])),
                    off,
                );
                off += 8;
            }
            for k in 0..S {
                _mm_mask_storeu_epi32(hp.add(off), m4[k], h.2[k]);
                keep(
                    _mm512_zextsi128_si512(_mm_maskz_mov_epi32(m4[k], h.2[k])),
                    off,
                );
                off += 4;
            }
            best
        }
    }

    /// Lane by lane: the highest hash seen and the first index holding it.
    type Best = (__m512i, __m512i);

    /// The attempt number r of each lane.
    #[derive(Clone, Copy)]
    pub(super) enum Attempts<'a> {
        Same(u32),
        Each(&'a [u32]),
    }

    /// `hashes[i] = hash32_3(x, ids[i], r_i) & 0xffff` for every lane;
    /// returns the highest hash and the first index holding it.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX-512VL.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl")]
    pub(super) unsafe fn hash_lanes(
        x: u32,
        ids: &[i32],
        rs: Attempts<'_>,
        hashes: &mut [u32],
    ) -> (u32, usize) {
        let n = ids.len();
        assert!(hashes.len() >= n, "hash buffer too short");
        if let Attempts::Each(rs) = rs {
            assert!(rs.len() >= n, "attempt buffer too short");
        }
        let mut i = 0;
        let mut best: Best = (_mm512_setzero_si512(), _mm512_setzero_si512());
        // SAFETY (every `chunk` call): it covers lanes i .. i + lanes <= n.
        unsafe {
            // Whole pairs while more than a pair and a 12-lane tail remain.
            while n - i >= 32 + 13 {
                best = chunk::<2, 0, 0>(x, ids, rs, hashes, i, 32, &best);
                i += 32;
            }
            let rest = n - i;
            let tail = if rest >= 32 { rest - 32 } else { rest };
            let pair = if rest >= 32 { 2 } else { 0 };
            best = match (pair, tail) {
                (_, 0) if pair == 2 => chunk::<2, 0, 0>(x, ids, rs, hashes, i, rest, &best),
                (2, 1..=4) => chunk::<2, 0, 1>(x, ids, rs, hashes, i, rest, &best),
                (2, 5..=8) => chunk::<2, 1, 0>(x, ids, rs, hashes, i, rest, &best),
                (2, _) => chunk::<2, 1, 1>(x, ids, rs, hashes, i, rest, &best),
                (_, 0) => best,
                (_, 1..=4) => chunk::<0, 0, 1>(x, ids, rs, hashes, i, rest, &best),
                (_, 5..=8) => chunk::<0, 1, 0>(x, ids, rs, hashes, i, rest, &best),
                (_, 9..=12) => chunk::<0, 1, 1>(x, ids, rs, hashes, i, rest, &best),
                (_, 13..=16) => chunk::<1, 0, 0>(x, ids, rs, hashes, i, rest, &best),
                _ => chunk::<2, 0, 0>(x, ids, rs, hashes, i, rest, &best),
            };
        }
        let top = _mm512_reduce_max_epu32(best.0);
        let holders = _mm512_cmpeq_epu32_mask(best.0, _mm512_set1_epi32(top as i32));
        let first = _mm512_mask_reduce_min_epu32(holders, best.1);
        (top, first as usize)
    }

    /// The lanes of one bucket hashed for `K` attempts at once: every
    /// block of item ids is loaded once and hashed with each attempt side
    /// by side (K independent chains). `hashes[k * n + i]` receives
    /// `hash32_3(x, ids[i], rs[k]) & 0xffff`; returns, per attempt, the
    /// highest hash and the first index holding it. A tail of at most 8
    /// (4) lanes is hashed in 256-bit (128-bit) vectors.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX-512VL; `hashes.len() >= K * ids.len()`
    /// (asserted).
    #[target_feature(enable = "avx512f,avx512vl")]
    pub(super) unsafe fn hash_attempts<const K: usize>(
        x: u32,
        ids: &[i32],
        rs: &[u32; K],
        hashes: &mut [u32],
    ) -> [(u32, usize); K] {
        let n = ids.len();
        assert!(hashes.len() >= K * n, "hash buffer too short");
        let (ip, hp) = (ids.as_ptr(), hashes.as_mut_ptr().cast::<i32>());
        let lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        let mut best: [Best; K] = [(_mm512_setzero_si512(), _mm512_setzero_si512()); K];
        let keep = |best: &mut Best, v: __m512i, off: usize| {
            let higher = _mm512_cmpgt_epu32_mask(v, best.0);
            best.0 = _mm512_max_epu32(best.0, v);
            let at = _mm512_add_epi32(_mm512_set1_epi32(off as i32), lane);
            best.1 = _mm512_mask_mov_epi32(best.1, higher, at);
        };
        let mut i = 0;
        // SAFETY: every load and store is masked to lanes below n (ids)
        // and below K * n (hashes); the CPU features are the caller's
        // guarantee.
        unsafe {
            while i + 8 < n {
                let m = mask16(n - i);
                let id = _mm512_maskz_loadu_epi32(m, ip.add(i));
                let mut r = splat::<K, 0, 0>(0);
                for k in 0..K {
                    r.0[k] = _mm512_set1_epi32(rs[k] as i32);
                }
                let (h, _, _) = hash_group::<K, 0, 0>(x, ([id; K], [], []), r);
                for k in 0..K {
                    _mm512_mask_storeu_epi32(hp.add(k * n + i), m, h[k]);
                    keep(&mut best[k], _mm512_maskz_mov_epi32(m, h[k]), i);
                }
                i += 16;
            }
            // Here i >= n (the last block was partial) or 1..=8 lanes are left.
            if i + 4 < n {
                let m = mask16(n - i) as u8;
                let id = _mm256_maskz_loadu_epi32(m, ip.add(i));
                let mut r = splat::<0, K, 0>(0);
                for k in 0..K {
                    r.1[k] = _mm256_set1_epi32(rs[k] as i32);
                }
                let (_, h, _) = hash_group::<0, K, 0>(x, ([], [id; K], []), r);
                for k in 0..K {
                    _mm256_mask_storeu_epi32(hp.add(k * n + i), m, h[k]);
                    let v = _mm512_zextsi256_si512(_mm256_maskz_mov_epi32(m, h[k]));
                    keep(&mut best[k], v, i);
                }
            } else if i < n {
                let m = mask16(n - i) as u8;
                let id = _mm_maskz_loadu_epi32(m, ip.add(i));
                let mut r = splat::<0, 0, K>(0);
                for k in 0..K {
                    r.2[k] = _mm_set1_epi32(rs[k] as i32);
                }
                let (_, _, h) = hash_group::<0, 0, K>(x, ([], [], [id; K]), r);
                for k in 0..K {
                    _mm_mask_storeu_epi32(hp.add(k * n + i), m, h[k]);
                    let v = _mm512_zextsi128_si512(_mm_maskz_mov_epi32(m, h[k]));
                    keep(&mut best[k], v, i);
                }
            }
        }
        let mut found = [(0u32, 0usize); K];
        for k in 0..K {
            let top = _mm512_reduce_max_epu32(best[k].0);
            let holders = _mm512_cmpeq_epu32_mask(best[k].0, _mm512_set1_epi32(top as i32));
            found[k] = (
                top,
                _mm512_mask_reduce_min_epu32(holders, best[k].1) as usize,
            );
        }
        found
    }

    /// [`super::straw2_choose_attempts`] on AVX-512 for `K` attempts.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX-512VL; `hashes.len() >= K * items.len()`,
    /// `items` non-empty with as many weights.
    #[target_feature(enable = "avx512f,avx512vl")]
    pub(super) unsafe fn choose_attempts<const K: usize>(
        items: &[i32],
        weights: &[u32],
        x: u32,
        rs: &[u32; K],
        equal: bool,
        hashes: &mut [u32],
        out: &mut [i32],
    ) {
        let n = items.len();
        // SAFETY: same CPU features; the buffer length is asserted inside.
        let found = unsafe { hash_attempts::<K>(x, items, rs, hashes) };
        for (k, &(top, first_top)) in found.iter().enumerate() {
            let hs = &hashes[k * n..(k + 1) * n];
            out[k] = if equal {
                match super::winning_floor(top, weights[0]) {
                    Some(floor) if floor == top => items[first_top],
                    Some(floor) => match first_at_least_if_equal(weights, hs, floor) {
                        Some(i) => items[i],
                        None => items[super::choose_general(hs, weights)],
                    },
                    None => items[super::choose_general(hs, weights)],
                }
            } else {
                items[super::choose_general(hs, weights)]
            };
        }
    }

    /// Whether every weight equals the first (public to the module's parent).
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX-512VL; `weights` non-empty.
    #[target_feature(enable = "avx512f,avx512vl")]
    pub(super) unsafe fn weights_equal(weights: &[u32]) -> bool {
        all_equal(weights)
    }

    /// [`super::choose_small`] on AVX-512 for `K` draws: one masked
    /// 16-lane vector per draw, all hashed side by side and picked from
    /// registers.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX-512VL; `draws.len() == K`, every
    /// draw has 1..=16 items and as many weights, `out.len() >= K`.
    #[target_feature(enable = "avx512f,avx512vl")]
    pub(super) unsafe fn choose_small<const K: usize>(
        draws: &[super::SmallDraw<'_>],
        x: u32,
        out: &mut [i32],
    ) {
        debug_assert!(draws.len() == K && out.len() >= K);
        let mut masks = [0u16; K];
        let mut ids = [_mm512_setzero_si512(); K];
        let mut rs = [_mm512_setzero_si512(); K];
        for (k, d) in draws.iter().enumerate().take(K) {
            debug_assert!((1..=16).contains(&d.items.len()) && d.items.len() == d.weights.len());
            masks[k] = mask16(d.items.len());
            // SAFETY: masked to the draw's items.
            ids[k] = unsafe { _mm512_maskz_loadu_epi32(masks[k], d.items.as_ptr()) };
            rs[k] = _mm512_set1_epi32(d.r as i32);
        }
        // SAFETY: same CPU features.
        let (h, _, _) = unsafe { hash_group::<K, 0, 0>(x, (ids, [], []), (rs, [], [])) };
        for (k, d) in draws.iter().enumerate().take(K) {
            let m = masks[k];
            let hv = _mm512_maskz_mov_epi32(m, h[k]);
            let top = _mm512_reduce_max_epu32(hv);
            let w0 = d.weights[0];
            // SAFETY: masked to the draw's weights.
            let w = unsafe { _mm512_maskz_loadu_epi32(m, d.weights.as_ptr().cast()) };
            let differ = _mm512_mask_cmpneq_epu32_mask(m, w, _mm512_set1_epi32(w0 as i32));
            if differ == 0 {
                if let Some(floor) = super::winning_floor(top, w0) {
                    let hit = _mm512_mask_cmpge_epu32_mask(m, hv, _mm512_set1_epi32(floor as i32));
                    out[k] = d.items[hit.trailing_zeros() as usize];
                    continue;
                }
            }
            let mut buf = [0u32; 16];
            // SAFETY: buf holds 16 lanes.
            unsafe { _mm512_storeu_si512(buf.as_mut_ptr().cast(), hv) };
            let n = d.items.len();
            out[k] = d.items[super::choose_general(&buf[..n], d.weights)];
        }
    }

    /// One straw2 draw: [`super::straw2_choose`] on AVX-512.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX-512VL.
    #[target_feature(enable = "avx512f,avx512vl")]
    pub(super) unsafe fn choose_one(
        items: &[i32],
        weights: &[u32],
        x: u32,
        r: u32,
        hashes: &mut [u32],
    ) -> i32 {
        // SAFETY: same CPU features.
        let equal = all_equal(weights);
        let (top, first_top) = unsafe { hash_lanes(x, items, Attempts::Same(r), hashes) };
        if equal {
            match super::winning_floor(top, weights[0]) {
                Some(floor) if floor == top => return items[first_top],
                Some(floor) => {
                    if let Some(i) = first_at_least_if_equal(weights, hashes, floor) {
                        return items[i];
                    }
                }
                None => {}
            }
        }
        items[super::choose_general(hashes, weights)]
    }

    /// The highest hash.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl")]
    fn top_hash(hashes: &[u32]) -> u32 {
        let n = hashes.len();
        let p = hashes.as_ptr().cast::<i32>();
        let mut top = _mm512_setzero_si512();
        let mut i = 0;
        // SAFETY: masked loads of lanes below n.
        unsafe {
            while i < n {
                let h = _mm512_maskz_loadu_epi32(mask16(n - i), p.add(i));
                top = _mm512_max_epu32(top, h);
                i += 16;
            }
        }
        _mm512_reduce_max_epu32(top)
    }

    /// Whether every weight equals the first.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl")]
    fn all_equal(weights: &[u32]) -> bool {
        let n = weights.len();
        let w0 = _mm512_set1_epi32(weights[0] as i32);
        let p = weights.as_ptr().cast::<i32>();
        let mut differ: __mmask16 = 0;
        let mut i = 0;
        // SAFETY: masked loads of lanes below n.
        unsafe {
            while i < n {
                let m = mask16(n - i);
                let w = _mm512_maskz_loadu_epi32(m, p.add(i));
                differ |= _mm512_mask_cmpneq_epu32_mask(m, w, w0);
                i += 16;
            }
        }
        differ == 0
    }

    /// With every weight equal to the first, the first index whose hash is
    /// at least `floor` (one exists); `None` when the weights differ. One
    /// pass with no data-dependent branch: the comparison masks of all
    /// blocks are gathered into a bit set and the first bit taken.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl")]
    fn first_at_least_if_equal(weights: &[u32], hashes: &[u32], floor: u32) -> Option<usize> {
        let n = hashes.len();
        debug_assert_eq!(n, weights.len());
        let f = _mm512_set1_epi32(floor as i32);
        let w0 = _mm512_set1_epi32(weights[0] as i32);
        let hp = hashes.as_ptr().cast::<i32>();
        let wp = weights.as_ptr().cast::<i32>();
        let mut differ: __mmask16 = 0;
        let mut i = 0;
        // SAFETY: masked loads of lanes below n.
        unsafe {
            while i < n {
                // Up to 64 lanes per word of hits.
                let mut hits = 0u64;
                let word_start = i;
                let end = n.min(i + 64);
                let mut shift = 0;
                while i < end {
                    let m = mask16(n - i);
                    let (h, w) = if m == 0xffff {
                        (
                            _mm512_loadu_si512(hp.add(i).cast()),
                            _mm512_loadu_si512(wp.add(i).cast()),
                        )
                    } else {
                        (
                            _mm512_maskz_loadu_epi32(m, hp.add(i)),
                            _mm512_maskz_loadu_epi32(m, wp.add(i)),
                        )
                    };
                    differ |= _mm512_mask_cmpneq_epu32_mask(m, w, w0);
                    hits |= u64::from(_mm512_mask_cmpge_epu32_mask(m, h, f)) << shift;
                    shift += 16;
                    i += 16;
                }
                if differ != 0 {
                    return None;
                }
                if hits != 0 {
                    return Some(word_start + hits.trailing_zeros() as usize);
                }
            }
        }
        if differ != 0 {
            return None;
        }
        unreachable!("the top hash reaches its own floor")
    }

    /// The index straw2 picks, given the item hashes of one draw and the
    /// highest of them.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl")]
    fn pick_with_top(weights: &[u32], hashes: &[u32], top: u32) -> usize {
        if let Some(floor) = super::winning_floor(top, weights[0]) {
            if let Some(i) = first_at_least_if_equal(weights, hashes, floor) {
                return i;
            }
        }
        super::choose_general(hashes, weights)
    }

    /// The index straw2 picks, given the item hashes of one draw.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX-512VL.
    #[target_feature(enable = "avx512f,avx512vl")]
    pub(super) unsafe fn pick(weights: &[u32], hashes: &[u32]) -> usize {
        pick_with_top(weights, hashes, top_hash(hashes))
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
        let mut scratch = Straw2Scratch::default();
        prop_assert_eq!(straw2_choose(items, weights, x, r, &mut scratch), want);
        let mut hashes = vec![0; items.len()];
        prop_assert_eq!(choose_portable(items, weights, x, r, &mut hashes), want);
        // Attempts r .. r + k drawn together (k = 6: a group of four and
        // one of two), each as drawn alone.
        let mut together = [0i32; 6];
        straw2_choose_attempts(items, weights, x, r, &mut together, &mut scratch);
        for (k, &got) in together.iter().enumerate() {
            let alone = straw2_choose_reference(items, weights, x, r + k as u32);
            prop_assert_eq!(
                got,
                alone,
                "attempt {} of {} items",
                r + k as u32,
                items.len()
            );
        }
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

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

        /// A batch of draws (buckets of assorted sizes, attempts) gives what
        /// the draws give one by one.
        #[test]
        fn straw2_batch_equals_reference(
            draws in prop::collection::vec((1usize..70, any::<bool>(), 0u32..200), 1..8),
            small_sizes in any::<bool>(),
            x in any::<u32>(),
            seed in any::<i32>(),
        ) {
            let mut scratch = Straw2Scratch::default();
            scratch.clear_batch();
            let mut want = Vec::new();
            for (d, &(n, equal, r)) in draws.iter().enumerate() {
                let n = if small_sizes { (n - 1) % 16 + 1 } else { n };
                let items: Vec<i32> = (0..n as i32).map(|i| seed.wrapping_add(i * 7 + d as i32)).collect();
                let weights: Vec<u32> = (0..n as u32).map(|i| if equal { 0x40000 } else { 0x8000 + i * 0x1357 }).collect();
                want.push(straw2_choose_reference(&items, &weights, x, r));
                scratch.push_draw(&items, &weights, r);
            }
            let mut got = Vec::new();
            scratch.run_batch(x, &mut got);
            prop_assert_eq!(&got, &want);
            // The same draws through `choose_small` when they fit.
            let kept: Vec<(Vec<i32>, Vec<u32>, u32)> = draws
                .iter()
                .enumerate()
                .map(|(d, &(n, equal, r))| {
                    let n = if small_sizes { (n - 1) % 16 + 1 } else { n };
                    let items: Vec<i32> = (0..n as i32).map(|i| seed.wrapping_add(i * 7 + d as i32)).collect();
                    let weights: Vec<u32> = (0..n as u32).map(|i| if equal { 0x40000 } else { 0x8000 + i * 0x1357 }).collect();
                    (items, weights, r)
                })
                .collect();
            let small: Vec<SmallDraw<'_>> = kept.iter().map(|(i, w, r)| SmallDraw { items: i, weights: w, r: *r }).collect();
            let mut out = vec![0; small.len()];
            if choose_small(&small, x, &mut out) {
                prop_assert_eq!(out, want);
            }
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
