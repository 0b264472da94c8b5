//! `crush_do_rule` and its choose loops (firstn and indep), the legacy
//! permutation fallback and the reweight test, exactly as Ceph's mapper
//! computes them (the straw2 draw itself lives in `straw2.rs`). [`Workspace`] holds the scratch buffers so repeated
//! mappings do not allocate.

use crate::fastpath;
use crate::hash::{hash32_2, hash32_3};
use crate::map::{Bucket, CrushMap, RuleStep};
use crate::straw2::{choose_small, straw2_choose, SmallDraw, Straw2Scratch, SMALL_DRAWS};
use crate::CRUSH_ITEM_NONE;

/// Placeholder for a not-yet-chosen `indep` position (Ceph's CRUSH_ITEM_UNDEF).
const ITEM_UNDEF: i32 = 0x7fff_fffe;
/// Largest `num_rep` a single mapping computes (results are truncated to it).
pub const MAX_NUM_REP: usize = 1024;
/// Replicas whose first draws are made ahead of need in one batch.
const MAX_DRAW_AHEAD: usize = 16;
/// Levels of the hierarchy those draws go down.
const MAX_DRAW_AHEAD_LEVELS: usize = 4;
/// Buckets at least this large are drawn on their own, not in a batch.
const DRAW_IN_PLACE_ITEMS: usize = 32;
/// Draws made ahead of need kept per mapping (they are searched linearly).
const MAX_DRAWN: usize = 64;

#[derive(Debug, Clone, Default)]
struct PermState {
    x: u32,
    n: u32,
    perm: Vec<u32>,
}

/// Reusable scratch space for [`CrushMap::do_rule_into`]; one per thread.
#[derive(Debug, Clone)]
pub struct Workspace {
    a: Vec<i32>,
    b: Vec<i32>,
    c: Vec<i32>,
    straw2: Straw2Scratch,
    /// straw2 results of the current mapping made ahead of need:
    /// (bucket id, attempt r, item).
    drawn: Vec<(i32, u32, i32)>,
    /// Output of a batch of draws.
    batch_out: Vec<i32>,
    perm: Vec<PermState>,
    perm_touched: Vec<usize>,
    /// Whether rules of the shape `fastpath.rs` handles take that path
    /// (always, except in tests comparing it with the general one).
    fast_path: bool,
}

impl Default for Workspace {
    fn default() -> Self {
        Workspace {
            a: Vec::new(),
            b: Vec::new(),
            c: Vec::new(),
            straw2: Straw2Scratch::default(),
            drawn: Vec::new(),
            batch_out: Vec::new(),
            perm: Vec::new(),
            perm_touched: Vec::new(),
            fast_path: true,
        }
    }
}

impl Workspace {
    /// A workspace for `map` (its buffers grow on first use, for any map).
    pub fn new(_map: &CrushMap) -> Workspace {
        Workspace::default()
    }

    /// A workspace that always uses the general rule interpreter, never the
    /// fast path of `take; chooseleaf firstn; emit` rules (same results,
    /// slower; for tests and benchmarks that compare the two).
    pub fn general_only() -> Workspace {
        Workspace {
            fast_path: false,
            ..Workspace::default()
        }
    }

    fn reset(&mut self, result_max: usize, n_buckets: usize) {
        for v in [&mut self.a, &mut self.b, &mut self.c] {
            v.clear();
            v.resize(result_max, 0);
        }
        for &i in &self.perm_touched {
            if let Some(p) = self.perm.get_mut(i) {
                p.x = 0;
                p.n = 0;
            }
        }
        self.perm_touched.clear();
        self.drawn.clear();
        if self.perm.len() < n_buckets {
            self.perm.resize(n_buckets, PermState::default());
        }
    }
}

/// Ceph's `bucket_perm_choose`, used by the legacy local-fallback search.
fn perm_choose(b: &Bucket, st: &mut PermState, x: u32, r: u32) -> i32 {
    let size = b.items.len() as u32;
    let pr = r % size;
    if st.perm.len() < size as usize {
        st.perm.resize(size as usize, 0);
    }
    if st.x != x || st.n == 0 {
        st.x = x;
        if pr == 0 {
            let s = hash32_3(x, b.id as u32, 0) % size;
            st.perm[0] = s;
            st.n = 0xffff;
            return b.items[s as usize];
        }
        for i in 0..size {
            st.perm[i as usize] = i;
        }
        st.n = 0;
    } else if st.n == 0xffff {
        for i in 1..size {
            st.perm[i as usize] = i;
        }
        let p0 = st.perm[0] as usize;
        st.perm[p0] = 0;
        st.n = 1;
    }
    while st.n <= pr {
        let p = st.n;
        if p < size - 1 {
            let i = hash32_3(x, b.id as u32, p) % (size - p);
            if i != 0 {
                st.perm.swap((p + i) as usize, p as usize);
            }
        }
        st.n += 1;
    }
    b.items[st.perm[pr as usize] as usize]
}

/// Ceph's `is_out`: whether the reweight of device `item` (16.16, missing
/// entries count as 1.0) rejects it for input `x`.
#[inline]
pub(crate) fn is_out(reweights: &[u32], item: i32, x: u32) -> bool {
    let w = reweights.get(item as usize).copied().unwrap_or(0x10000);
    if w >= 0x10000 {
        return false;
    }
    if w == 0 {
        return true;
    }
    (hash32_2(x, item as u32) & 0xffff) >= w
}

struct Mapper<'a> {
    map: &'a CrushMap,
    reweights: &'a [u32],
    x: u32,
    max_devices: i32,
    straw2: &'a mut Straw2Scratch,
    drawn: &'a mut Vec<(i32, u32, i32)>,
    batch_out: &'a mut Vec<i32>,
    perm: &'a mut Vec<PermState>,
    perm_touched: &'a mut Vec<usize>,
}

struct FirstnArgs {
    tries: u32,
    recurse_tries: u32,
    local_retries: u32,
    local_fallback_retries: u32,
    recurse_to_leaf: bool,
    vary_r: u32,
    stable: u32,
}

impl Mapper<'_> {
    #[inline]
    fn bucket(&self, id: i32) -> Option<&Bucket> {
        self.map.bucket(id)
    }

    fn is_out(&self, item: i32, x: u32) -> bool {
        is_out(self.reweights, item, x)
    }

    fn item_type(&self, item: i32) -> Option<i32> {
        if item >= 0 {
            Some(0)
        } else {
            self.bucket(item).map(|b| b.type_id)
        }
    }

    fn choose_in(&mut self, bid: i32, r: u32, flocal: u32, fallback: u32) -> i32 {
        let map = self.map;
        let Some(b) = map.bucket(bid) else {
            return CRUSH_ITEM_NONE;
        };
        let size = b.items.len() as u32;
        if fallback > 0 && flocal >= (size >> 1) && flocal > fallback {
            let idx = (-1 - bid) as usize;
            if idx >= self.perm.len() {
                self.perm.resize(idx + 1, PermState::default());
            }
            self.perm_touched.push(idx);
            perm_choose(b, &mut self.perm[idx], self.x, r)
        } else {
            match self.drawn.iter().find(|d| d.0 == bid && d.1 == r) {
                Some(d) => d.2,
                None => straw2_choose(&b.items, &b.weights, self.x, r, self.straw2),
            }
        }
    }

    /// Makes ahead of need, in one batch per level, the straw2 draws the
    /// first attempt of each of `reps` replicas will ask for when choosing
    /// from `take` (attempt r = rep, descending with the same r through
    /// buckets of other types down to `type_id`, then, for chooseleaf, the
    /// leaf draw inside the chosen bucket). Draws are a pure function of
    /// (bucket, x, r), so a guess that the choose loop does not use (a
    /// collision, a rejected item) costs time, never correctness.
    #[allow(clippy::too_many_arguments)]
    fn draw_ahead(
        &mut self,
        take: i32,
        reps: usize,
        firstn: bool,
        leaf: bool,
        type_id: i32,
        vary_r: u32,
        stable: u32,
    ) {
        let reps = reps.min(MAX_DRAW_AHEAD);
        if reps < 2 || self.drawn.len() > MAX_DRAWN {
            return;
        }
        let map = self.map;
        // Per replica: the bucket its next draw is in, that draw's r, and
        // whether that draw is the leaf draw (the last one guessed).
        let mut next: [(i32, u32, bool); MAX_DRAW_AHEAD] = [(0, 0, false); MAX_DRAW_AHEAD];
        for (rep, n) in next.iter_mut().enumerate().take(reps) {
            *n = (take, rep as u32, false);
        }
        let mut live = reps;
        for _level in 0..MAX_DRAW_AHEAD_LEVELS {
            if live == 0 {
                break;
            }
            // Large buckets keep vectors busy on their own and are drawn
            // in place; small ones share vectors: a few of at most 16
            // items in registers, others in one batch.
            let mut direct = [None; MAX_DRAW_AHEAD];
            let mut small = [SmallDraw {
                items: &[],
                weights: &[],
                r: 0,
            }; SMALL_DRAWS];
            let mut n_small = 0;
            let mut all_small = true;
            for &(bid, r, _) in next.iter().take(reps) {
                if let Some(b) = map.bucket(bid).filter(|b| !b.items.is_empty()) {
                    if b.items.len() < DRAW_IN_PLACE_ITEMS {
                        if b.items.len() <= 16 && n_small < SMALL_DRAWS {
                            small[n_small] = SmallDraw {
                                items: &b.items,
                                weights: &b.weights,
                                r,
                            };
                            n_small += 1;
                        } else {
                            all_small = false;
                        }
                    }
                }
            }
            let mut small_out = [0i32; SMALL_DRAWS];
            let use_small =
                all_small && n_small > 0 && choose_small(&small[..n_small], self.x, &mut small_out);
            self.straw2.clear_batch();
            for (&(bid, r, _), d) in next.iter().zip(direct.iter_mut()).take(reps) {
                if let Some(b) = map.bucket(bid).filter(|b| !b.items.is_empty()) {
                    if b.items.len() >= DRAW_IN_PLACE_ITEMS {
                        *d = Some(straw2_choose(&b.items, &b.weights, self.x, r, self.straw2));
                    } else if !use_small {
                        self.straw2.push_draw(&b.items, &b.weights, r);
                    }
                }
            }
            self.batch_out.clear();
            if use_small {
                self.batch_out.extend_from_slice(&small_out[..n_small]);
            } else {
                self.straw2.run_batch(self.x, self.batch_out);
            }
            let mut got = self.batch_out.iter();
            live = 0;
            for (rep, n) in next.iter_mut().enumerate().take(reps) {
                let (bid, r, was_leaf) = *n;
                if map.bucket(bid).is_none_or(|b| b.items.is_empty()) {
                    *n = (0, 0, false);
                    continue;
                }
                let item = match direct[rep] {
                    Some(item) => item,
                    None => *got.next().expect("one result per batched draw"),
                };
                self.drawn.push((bid, r, item));
                *n = (0, 0, false);
                if was_leaf || item >= 0 {
                    continue;
                }
                let Some(ib) = map.bucket(item) else { continue };
                if ib.type_id != type_id {
                    *n = (item, r, false); // descend with the same r
                    live += 1;
                } else if leaf {
                    let leaf_r = if firstn {
                        let sub_r = if vary_r != 0 {
                            r.checked_shr(vary_r - 1).unwrap_or(0)
                        } else {
                            0
                        };
                        let first = if stable != 0 { 0 } else { rep as u32 };
                        first.wrapping_add(sub_r)
                    } else {
                        (rep as u32).wrapping_add(r)
                    };
                    *n = (item, leaf_r, true);
                    live += 1;
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn choose_firstn(
        &mut self,
        bucket: i32,
        numrep: i32,
        type_id: i32,
        out: &mut [i32],
        mut outpos: usize,
        out_size: usize,
        a: &FirstnArgs,
        mut out2: Option<&mut [i32]>,
        parent_r: i32,
    ) -> usize {
        let mut count = out_size;
        let start = if a.stable != 0 { 0 } else { outpos as i32 };
        let mut rep = start;
        while rep < numrep && count > 0 {
            let mut ftotal: u32 = 0;
            let mut skip_rep = false;
            let mut item = 0;
            loop {
                let mut retry_descent = false;
                let mut inb = bucket;
                let mut flocal: u32 = 0;
                loop {
                    let mut retry_bucket = false;
                    let mut collide = false;
                    let r = ((rep + parent_r) as u32).wrapping_add(ftotal);
                    let in_size = self.bucket(inb).map_or(0, |b| b.items.len() as u32);
                    let reject;
                    if in_size == 0 {
                        reject = true;
                    } else {
                        item = self.choose_in(inb, r, flocal, a.local_fallback_retries);
                        if item >= self.max_devices {
                            skip_rep = true;
                            break;
                        }
                        let Some(itemtype) = self.item_type(item) else {
                            skip_rep = true;
                            break;
                        };
                        if itemtype != type_id {
                            if item >= 0 {
                                skip_rep = true;
                                break;
                            }
                            inb = item;
                            continue;
                        }
                        collide = out[..outpos].contains(&item);
                        let mut rej = false;
                        if !collide && a.recurse_to_leaf {
                            if item < 0 {
                                let sub_r = if a.vary_r != 0 {
                                    (r >> (a.vary_r - 1)) as i32
                                } else {
                                    0
                                };
                                let inner = FirstnArgs {
                                    tries: a.recurse_tries,
                                    recurse_tries: 0,
                                    recurse_to_leaf: false,
                                    ..*a
                                };
                                let n = if a.stable != 0 { 1 } else { outpos as i32 + 1 };
                                let got = match out2.as_deref_mut() {
                                    Some(o2) => self.choose_firstn(
                                        item, n, 0, o2, outpos, count, &inner, None, sub_r,
                                    ),
                                    None => outpos,
                                };
                                if got <= outpos {
                                    rej = true;
                                }
                            } else if let Some(o2) = out2.as_deref_mut() {
                                o2[outpos] = item;
                            }
                        }
                        if !rej && !collide && itemtype == 0 {
                            rej = self.is_out(item, self.x);
                        }
                        reject = rej;
                    }
                    if reject || collide {
                        ftotal += 1;
                        flocal += 1;
                        let local = collide && flocal <= a.local_retries;
                        let fallback = a.local_fallback_retries > 0
                            && flocal <= in_size + a.local_fallback_retries;
                        if local || fallback {
                            retry_bucket = true;
                        } else if ftotal < a.tries {
                            retry_descent = true;
                        } else {
                            skip_rep = true;
                        }
                    }
                    if !retry_bucket {
                        break;
                    }
                }
                if !retry_descent {
                    break;
                }
            }
            if !skip_rep {
                out[outpos] = item;
                outpos += 1;
                count -= 1;
            }
            rep += 1;
        }
        outpos
    }

    #[allow(clippy::too_many_arguments)]
    fn choose_indep(
        &mut self,
        bucket: i32,
        left: usize,
        numrep: i32,
        type_id: i32,
        out: &mut [i32],
        outpos: usize,
        tries: u32,
        recurse_tries: u32,
        recurse_to_leaf: bool,
        mut out2: Option<&mut [i32]>,
        parent_r: i32,
    ) {
        let endpos = outpos + left;
        let mut left = left;
        for rep in outpos..endpos {
            out[rep] = ITEM_UNDEF;
            if let Some(o2) = out2.as_deref_mut() {
                o2[rep] = ITEM_UNDEF;
            }
        }
        let mut ftotal: u32 = 0;
        while left > 0 && ftotal < tries {
            for rep in outpos..endpos {
                if out[rep] != ITEM_UNDEF {
                    continue;
                }
                let mut inb = bucket;
                loop {
                    let r = ((rep as i32).wrapping_add(parent_r) as u32)
                        .wrapping_add((numrep as u32).wrapping_mul(ftotal));
                    let r = r as i32;
                    let empty = self.bucket(inb).is_none_or(|b| b.items.is_empty());
                    if empty {
                        break;
                    }
                    let item = self.choose_in(inb, r as u32, 0, 0);
                    let itemtype = if item >= self.max_devices {
                        None
                    } else {
                        self.item_type(item)
                    };
                    let Some(itemtype) = itemtype else {
                        out[rep] = CRUSH_ITEM_NONE;
                        if let Some(o2) = out2.as_deref_mut() {
                            o2[rep] = CRUSH_ITEM_NONE;
                        }
                        left -= 1;
                        break;
                    };
                    if itemtype != type_id {
                        if item >= 0 {
                            out[rep] = CRUSH_ITEM_NONE;
                            if let Some(o2) = out2.as_deref_mut() {
                                o2[rep] = CRUSH_ITEM_NONE;
                            }
                            left -= 1;
                            break;
                        }
                        inb = item;
                        continue;
                    }
                    if out[outpos..endpos].contains(&item) {
                        break;
                    }
                    if recurse_to_leaf {
                        if let Some(o2) = out2.as_deref_mut() {
                            if item < 0 {
                                self.choose_indep(
                                    item,
                                    1,
                                    numrep,
                                    0,
                                    o2,
                                    rep,
                                    recurse_tries,
                                    0,
                                    false,
                                    None,
                                    r,
                                );
                                if o2[rep] == CRUSH_ITEM_NONE {
                                    break;
                                }
                            } else {
                                o2[rep] = item;
                            }
                        }
                    }
                    if itemtype == 0 && self.is_out(item, self.x) {
                        break;
                    }
                    out[rep] = item;
                    left -= 1;
                    break;
                }
            }
            ftotal += 1;
        }
        for rep in outpos..endpos {
            if out[rep] == ITEM_UNDEF {
                out[rep] = CRUSH_ITEM_NONE;
            }
            if let Some(o2) = out2.as_deref_mut() {
                if o2[rep] == ITEM_UNDEF {
                    o2[rep] = CRUSH_ITEM_NONE;
                }
            }
        }
    }
}

impl CrushMap {
    /// [`CrushMap::do_rule`] without allocating: results go to `out`
    /// (cleared first), scratch space comes from `ws`.
    pub fn do_rule_into(
        &self,
        ws: &mut Workspace,
        rule_id: i32,
        x: u32,
        num_rep: usize,
        reweights: &[u32],
        out: &mut Vec<i32>,
    ) {
        out.clear();
        let Some(rule) = self.rule(rule_id) else {
            return;
        };
        if ws.fast_path {
            if let Some(fast) = fastpath::fast_rule(self, rule) {
                if fastpath::map_fast(self, &fast, &mut ws.straw2, x, num_rep, reweights, out) {
                    return;
                }
            }
        }
        let result_max = num_rep.min(MAX_NUM_REP);
        ws.reset(result_max, self.buckets.len());
        let t = &self.tunables;
        let mut choose_tries = t.choose_total_tries + 1;
        let mut choose_leaf_tries: u32 = 0;
        let mut local_retries = t.choose_local_tries;
        let mut local_fallback = t.choose_local_fallback_tries;
        let mut vary_r = t.chooseleaf_vary_r;
        let mut stable = t.chooseleaf_stable;
        let max_devices = self.max_devices();
        let max_buckets = self.max_buckets();

        let mut w = std::mem::take(&mut ws.a);
        let mut o = std::mem::take(&mut ws.b);
        let mut c = std::mem::take(&mut ws.c);
        let mut wsize = 0usize;
        let mut m = Mapper {
            map: self,
            reweights,
            x,
            max_devices,
            straw2: &mut ws.straw2,
            drawn: &mut ws.drawn,
            batch_out: &mut ws.batch_out,
            perm: &mut ws.perm,
            perm_touched: &mut ws.perm_touched,
        };
        for step in &rule.steps {
            let (firstn, leaf, n, type_id) = match *step {
                RuleStep::Take(item) => {
                    let ok = (item >= 0 && item < max_devices) || self.bucket(item).is_some();
                    if ok && result_max > 0 {
                        w[0] = item;
                        wsize = 1;
                    }
                    continue;
                }
                RuleStep::SetChooseTries(n) => {
                    if n > 0 {
                        choose_tries = n as u32;
                    }
                    continue;
                }
                RuleStep::SetChooseLeafTries(n) => {
                    if n > 0 {
                        choose_leaf_tries = n as u32;
                    }
                    continue;
                }
                RuleStep::SetChooseLocalTries(n) => {
                    if n >= 0 {
                        local_retries = n as u32;
                    }
                    continue;
                }
                RuleStep::SetChooseLocalFallbackTries(n) => {
                    if n >= 0 {
                        local_fallback = n as u32;
                    }
                    continue;
                }
                RuleStep::SetChooseLeafVaryR(n) => {
                    if n >= 0 {
                        vary_r = n as u32;
                    }
                    continue;
                }
                RuleStep::SetChooseLeafStable(n) => {
                    if n >= 0 {
                        stable = n as u32;
                    }
                    continue;
                }
                RuleStep::Emit => {
                    for &item in &w[..wsize] {
                        if out.len() >= result_max {
                            break;
                        }
                        out.push(item);
                    }
                    wsize = 0;
                    continue;
                }
                RuleStep::ChooseFirstN { n, type_id } => (true, false, n, type_id),
                RuleStep::ChooseIndep { n, type_id } => (false, false, n, type_id),
                RuleStep::ChooseLeafFirstN { n, type_id } => (true, true, n, type_id),
                RuleStep::ChooseLeafIndep { n, type_id } => (false, true, n, type_id),
            };
            if wsize == 0 {
                continue;
            }
            let mut osize = 0usize;
            for &take in &w[..wsize] {
                let mut numrep = n;
                if numrep <= 0 {
                    numrep += result_max as i32;
                    if numrep <= 0 {
                        continue;
                    }
                }
                let bno = -1i64 - i64::from(take);
                if bno < 0 || bno >= i64::from(max_buckets) || self.bucket(take).is_none() {
                    continue;
                }
                if firstn {
                    let recurse_tries = if choose_leaf_tries > 0 {
                        choose_leaf_tries
                    } else if t.chooseleaf_descend_once != 0 {
                        1
                    } else {
                        choose_tries
                    };
                    let args = FirstnArgs {
                        tries: choose_tries,
                        recurse_tries,
                        local_retries,
                        local_fallback_retries: local_fallback,
                        recurse_to_leaf: leaf,
                        vary_r,
                        stable,
                    };
                    let reps = (numrep as usize).min(result_max - osize);
                    m.draw_ahead(take, reps, true, leaf, type_id, vary_r, stable);
                    osize += m.choose_firstn(
                        take,
                        numrep,
                        type_id,
                        &mut o[osize..],
                        0,
                        result_max - osize,
                        &args,
                        Some(&mut c[osize..]),
                        0,
                    );
                } else {
                    let out_size = (numrep as usize).min(result_max - osize);
                    m.draw_ahead(take, out_size, false, leaf, type_id, vary_r, stable);
                    m.choose_indep(
                        take,
                        out_size,
                        numrep,
                        type_id,
                        &mut o[osize..],
                        0,
                        choose_tries,
                        if choose_leaf_tries > 0 {
                            choose_leaf_tries
                        } else {
                            1
                        },
                        leaf,
                        Some(&mut c[osize..]),
                        0,
                    );
                    osize += out_size;
                }
            }
            if leaf {
                o[..osize].copy_from_slice(&c[..osize]);
            }
            std::mem::swap(&mut w, &mut o);
            wsize = osize;
        }
        ws.a = w;
        ws.b = o;
        ws.c = c;
    }
}
