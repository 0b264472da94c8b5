//! The fast path of the commonest rule shape, `take B; chooseleaf firstn N
//! type T; emit` (every replicated pool made by `add_replicated_rule` and
//! `cairn crush build`), under the tunables that make its inner search a
//! single draw: no local retries, no local fallback, chooseleaf descend
//! once (or chooseleaf tries 1) and chooseleaf stable. It gives the results of the general
//! interpreter in `mapper.rs` (Ceph's `crush_choose_firstn`), step for
//! step, but draws the first attempt of every replica at once (B's item ids
//! hashed for all attempts together) and the leaf draws inside the chosen
//! buckets side by side, before the sequential collision and reweight
//! checks. A draw is a pure function of (bucket, x, r), so drawing early
//! changes the cost, never the result. Every other shape goes to the
//! general interpreter.

use crate::map::{Bucket, CrushMap, Rule, RuleStep};
use crate::mapper::{is_out, MAX_NUM_REP};
use crate::straw2::{
    choose_small, straw2_choose, straw2_choose_attempts, SmallDraw, Straw2Scratch, SMALL_DRAWS,
};

/// Most replicas the fast path places (more go to the general interpreter).
pub(crate) const FAST_MAX_REPS: usize = 16;

/// A rule of the fast shape, as read from the map.
pub(crate) struct FastRule<'a> {
    take: &'a Bucket,
    /// The `chooseleaf firstn` count (<= 0: pool size minus |n|).
    n: i32,
    /// The failure-domain type (T).
    type_id: i32,
    /// Attempts per replica (choose_total_tries + 1, or the rule's).
    tries: u32,
    /// chooseleaf_vary_r.
    vary_r: u32,
}

/// The fast shape of `rule` on `map`, if it has it.
pub(crate) fn fast_rule<'a>(map: &'a CrushMap, rule: &Rule) -> Option<FastRule<'a>> {
    let t = &map.tunables;
    let [RuleStep::Take(take), RuleStep::ChooseLeafFirstN { n, type_id }, RuleStep::Emit] =
        rule.steps[..]
    else {
        return None;
    };
    let single_inner_draw = t.chooseleaf_descend_once != 0;
    if !single_inner_draw
        || t.choose_local_tries != 0
        || t.choose_local_fallback_tries != 0
        || t.chooseleaf_stable == 0
    {
        return None;
    }
    Some(FastRule {
        take: map.bucket(take)?,
        n,
        type_id,
        tries: t.choose_total_tries + 1,
        vary_r: t.chooseleaf_vary_r,
    })
}

/// Leaf draws made ahead of need: (bucket id, attempt r, item).
struct LeafDraws {
    drawn: [(i32, u32, i32); FAST_MAX_REPS],
    len: usize,
}

impl LeafDraws {
    fn find(&self, bucket: i32, r: u32) -> Option<i32> {
        self.drawn[..self.len]
            .iter()
            .find(|d| d.0 == bucket && d.1 == r)
            .map(|d| d.2)
    }
}

/// What the descent from the take bucket to a bucket of type T found.
enum Descent {
    Found(i32),
    /// An empty bucket on the way: this attempt is rejected.
    Reject,
    /// An item that cannot be placed (a device above T, a missing
    /// bucket, an id past the devices): the replica is skipped.
    Skip,
}

struct FastMapper<'a> {
    map: &'a CrushMap,
    reweights: &'a [u32],
    x: u32,
    max_devices: i32,
    straw2: &'a mut Straw2Scratch,
}

impl<'a> FastMapper<'a> {
    /// The type of `item`, or `None` for a missing bucket or an id past the
    /// devices (Ceph skips the replica in both cases).
    #[inline]
    fn type_of(&self, item: i32) -> Option<(i32, Option<&'a Bucket>)> {
        let map: &'a CrushMap = self.map;
        if item >= self.max_devices {
            None
        } else if item >= 0 {
            Some((0, None))
        } else {
            let b = map.bucket(item)?;
            Some((b.type_id, Some(b)))
        }
    }

    /// Goes down from `from` with attempt `r` until an item of type
    /// `type_id`; `first` is the draw already made in `from` for `r`.
    fn descend(&mut self, from: &'a Bucket, r: u32, first: Option<i32>, type_id: i32) -> Descent {
        let mut b = from;
        let mut ready = first;
        loop {
            if b.items.is_empty() {
                return Descent::Reject;
            }
            let item = match ready.take() {
                Some(item) => item,
                None => straw2_choose(&b.items, &b.weights, self.x, r, self.straw2),
            };
            let Some((t, bucket)) = self.type_of(item) else {
                return Descent::Skip;
            };
            if t == type_id {
                return Descent::Found(item);
            }
            match bucket {
                Some(next) => b = next,
                None => return Descent::Skip,
            }
        }
    }

    /// The inner `chooseleaf` search of one replica: a single attempt `r`
    /// down from bucket `from` to a device that is neither in `leaves` nor
    /// out. `None` rejects the outer attempt.
    fn leaf(&mut self, from: i32, r: u32, leaves: &[i32], ahead: &LeafDraws) -> Option<i32> {
        let map: &'a CrushMap = self.map;
        let b = map.bucket(from)?;
        let first = ahead.find(from, r);
        let Descent::Found(leaf) = self.descend(b, r, first, 0) else {
            return None;
        };
        if leaves.contains(&leaf) || is_out(self.reweights, leaf, self.x) {
            return None;
        }
        Some(leaf)
    }

    /// Draws ahead the leaf draw of each replica's first attempt (the
    /// bucket `first[rep]` with attempt `sub_r(rep)`), for buckets of type T
    /// with at most 16 items, up to four side by side.
    fn draw_leaves_ahead(&mut self, first: &[i32], type_id: i32, vary_r: u32) -> LeafDraws {
        let mut ahead = LeafDraws {
            drawn: [(0, 0, 0); FAST_MAX_REPS],
            len: 0,
        };
        let mut small = [SmallDraw {
            items: &[],
            weights: &[],
            r: 0,
        }; SMALL_DRAWS];
        let mut ids = [0i32; SMALL_DRAWS];
        let mut n = 0;
        let mut got = [0i32; SMALL_DRAWS];
        let map = self.map;
        for (rep, &item) in first.iter().enumerate() {
            if item >= 0 || first[..rep].contains(&item) {
                continue;
            }
            let Some(b) = map.bucket(item) else { continue };
            if b.type_id != type_id || b.items.is_empty() || b.items.len() > 16 {
                continue;
            }
            small[n] = SmallDraw {
                items: &b.items,
                weights: &b.weights,
                r: sub_r(rep as u32, vary_r),
            };
            ids[n] = item;
            n += 1;
            if n == SMALL_DRAWS {
                if !choose_small(&small[..n], self.x, &mut got) {
                    return ahead;
                }
                for k in 0..n {
                    ahead.drawn[ahead.len] = (ids[k], small[k].r, got[k]);
                    ahead.len += 1;
                }
                n = 0;
            }
        }
        if n > 0 && choose_small(&small[..n], self.x, &mut got) {
            for k in 0..n {
                ahead.drawn[ahead.len] = (ids[k], small[k].r, got[k]);
                ahead.len += 1;
            }
        }
        ahead
    }
}

/// The attempt the inner search starts from (Ceph's `sub_r`).
#[inline]
fn sub_r(r: u32, vary_r: u32) -> u32 {
    if vary_r != 0 {
        r.checked_shr(vary_r - 1).unwrap_or(0)
    } else {
        0
    }
}

/// Maps `x` by a rule of the fast shape into `out` (cleared first), as
/// `do_rule_into` would. Returns false, having done nothing, when the
/// replica count is beyond the fast path.
pub(crate) fn map_fast(
    map: &CrushMap,
    rule: &FastRule<'_>,
    straw2: &mut Straw2Scratch,
    x: u32,
    num_rep: usize,
    reweights: &[u32],
    out: &mut Vec<i32>,
) -> bool {
    let result_max = num_rep.min(MAX_NUM_REP);
    let mut numrep = rule.n;
    if numrep <= 0 {
        numrep += result_max as i32;
    }
    if numrep <= 0 || result_max == 0 {
        out.clear();
        return true;
    }
    let numrep = numrep as usize;
    if numrep > FAST_MAX_REPS {
        return false;
    }
    out.clear();
    let mut m = FastMapper {
        map,
        reweights,
        x,
        max_devices: map.max_devices(),
        straw2,
    };
    let take = rule.take;
    // First attempts of the replicas that can be placed: r = rep.
    let ahead_reps = numrep.min(result_max);
    let mut first = [0i32; FAST_MAX_REPS];
    let first = &mut first[..ahead_reps];
    if take.items.is_empty() {
        return true; // every attempt is rejected
    }
    straw2_choose_attempts(&take.items, &take.weights, x, 0, first, m.straw2);
    let leaves_ahead = m.draw_leaves_ahead(first, rule.type_id, rule.vary_r);

    let mut chosen = [0i32; FAST_MAX_REPS];
    let mut leaves = [0i32; FAST_MAX_REPS];
    let mut placed = 0;
    for rep in 0..numrep {
        if placed == result_max {
            break;
        }
        let mut ftotal = 0u32;
        loop {
            let r = (rep as u32).wrapping_add(ftotal);
            let drawn = first.get(r as usize).copied();
            let leaf = match m.descend(take, r, drawn, rule.type_id) {
                Descent::Skip => break,
                Descent::Reject => None,
                Descent::Found(item) if chosen[..placed].contains(&item) => None,
                Descent::Found(item) if item >= 0 => {
                    // T is the device type: the item is its own leaf.
                    (!is_out(reweights, item, x)).then_some((item, item))
                }
                Descent::Found(item) => {
                    let inner_r = sub_r(r, rule.vary_r);
                    m.leaf(item, inner_r, &leaves[..placed], &leaves_ahead)
                        .map(|leaf| (item, leaf))
                }
            };
            if let Some((item, leaf)) = leaf {
                chosen[placed] = item;
                leaves[placed] = leaf;
                placed += 1;
                break;
            }
            ftotal += 1;
            if ftotal >= rule.tries {
                break;
            }
        }
    }
    out.extend_from_slice(&leaves[..placed]);
    true
}

#[cfg(test)]
mod tests {
    use crate::map::RuleStep;
    use crate::{CrushMap, Tunables, Workspace};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// A random root -> [rack ->] host -> osd map (empty hosts, hosts
    /// larger than 16 items, zero and unequal weights) with replicated
    /// rules at every level.
    fn random_map(rng: &mut StdRng) -> (CrushMap, Vec<i32>) {
        let mut map = CrushMap::new();
        map.add_bucket("default", "root", None).expect("root");
        let racks = rng.gen_range(0..4);
        for r in 0..racks {
            map.add_bucket(&format!("rack{r}"), "rack", Some("default"))
                .expect("rack");
        }
        let equal = rng.gen_bool(0.5);
        let mut osd = 0;
        for h in 0..rng.gen_range(1..30) {
            let host = format!("host{h}");
            let parent = if racks > 0 {
                format!("rack{}", rng.gen_range(0..racks))
            } else {
                "default".to_string()
            };
            map.add_bucket(&host, "host", Some(&parent)).expect("host");
            for _ in 0..rng.gen_range(0..20) {
                let w = if equal {
                    1.0
                } else {
                    [0.0, 0.5, 1.0, 3.7, 5.458][rng.gen_range(0..5)]
                };
                map.add_device(osd, Some("hdd"), w, &[("host", &host)])
                    .expect("osd");
                osd += 1;
            }
        }
        let mut rules = vec![
            map.add_replicated_rule("by_host", "default", "host", None)
                .expect("rule"),
            map.add_replicated_rule("by_osd", "default", "osd", None)
                .expect("rule"),
        ];
        if racks > 0 {
            rules.push(
                map.add_replicated_rule("by_rack", "default", "rack", None)
                    .expect("rule"),
            );
        }
        (map, rules)
    }

    /// The fast path gives what the general interpreter gives, for random
    /// maps, rule counts, tunables and reweights.
    #[test]
    fn fast_path_equals_general_interpreter() {
        let mut compared = 0u64;
        let mut fast_taken = 0u64;
        for seed in 0..60u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let (mut map, rules) = random_map(&mut rng);
            let mut t = Tunables::optimal();
            match seed % 4 {
                1 => t.chooseleaf_vary_r = 0,
                2 => t.chooseleaf_vary_r = 2,
                3 => t.choose_total_tries = rng.gen_range(0..3),
                _ => {}
            }
            map.set_tunables(t);
            let n = [0, 0, -1, 2, 5][rng.gen_range(0..5)];
            for &rid in &rules {
                if let Some(Some(rule)) = map.rules.get_mut(rid as usize) {
                    for s in rule.steps.iter_mut() {
                        if let RuleStep::ChooseLeafFirstN { n: count, .. } = s {
                            *count = n;
                        }
                    }
                }
            }
            let devices = map.max_devices().max(0) as usize;
            let reweights: Vec<u32> = (0..devices)
                .map(|_| [0x10000, 0x10000, 0, 0x8000, 0xc000][rng.gen_range(0..5)])
                .collect();
            let (mut fast, mut general) = (Workspace::new(&map), Workspace::general_only());
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for &rid in &rules {
                let rule = map.rule(rid).expect("rule exists");
                fast_taken += u64::from(super::fast_rule(&map, rule).is_some());
                for num_rep in [1usize, 2, 3, 4, 6, 20] {
                    for x in 0..300u32 {
                        let x = x.wrapping_mul(2_654_435_761);
                        map.do_rule_into(&mut fast, rid, x, num_rep, &reweights, &mut a);
                        map.do_rule_into(&mut general, rid, x, num_rep, &reweights, &mut b);
                        assert_eq!(
                            a,
                            b,
                            "seed {seed} rule {rid} x {x} num_rep {num_rep}\n{}",
                            map.to_text()
                        );
                        compared += 1;
                    }
                }
            }
        }
        assert!(
            fast_taken > 100,
            "the fast path was taken {fast_taken} times"
        );
        assert!(compared > 100_000);
    }
}
