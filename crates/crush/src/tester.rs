//! `crushtool --test` as a library: runs a rule over a range of inputs and
//! prints the same lines crushtool prints (`CRUSH rule 1 x 1 [9,16,8,13,5,0]`,
//! `bad mapping …`, statistics and utilisation). The CLI and the tests use it.

use crate::map::{CrushMap, RuleStep};
use crate::mapper::Workspace;
use crate::CRUSH_ITEM_NONE;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// What to run and what to print (crushtool's flags).
#[derive(Debug, Clone)]
pub struct TestOptions {
    /// `--rule N`; all rules when `None`.
    pub rule: Option<i32>,
    /// `--num-rep R` (min and max); the rule's min_size..max_size when `None`.
    pub num_rep: Option<(i32, i32)>,
    /// `--min-x` / `--max-x` (or `--x`); crushtool's default is 0..=1023.
    pub min_x: i32,
    pub max_x: i32,
    /// `--weight OSD W` overrides as 16.16 reweights.
    pub weights: BTreeMap<i32, u32>,
    /// `--pool-id P`: inputs are hashed with the pool id as Ceph does for PGs.
    pub pool_id: Option<i32>,
    pub show_mappings: bool,
    pub show_bad_mappings: bool,
    pub show_statistics: bool,
    pub show_utilization: bool,
}

impl Default for TestOptions {
    fn default() -> Self {
        TestOptions {
            rule: None,
            num_rep: None,
            min_x: 0,
            max_x: 1023,
            weights: BTreeMap::new(),
            pool_id: None,
            show_mappings: false,
            show_bad_mappings: false,
            show_statistics: false,
            show_utilization: false,
        }
    }
}

/// crushtool's `--weight OSD W`: single precision, truncated, clamped to 0..=1.
pub fn reweight_from_float(w: f64) -> u32 {
    let f = (w as f32) * 65536.0f32;
    if f.is_nan() || f <= 0.0 {
        0
    } else if f >= 65536.0 {
        0x10000
    } else {
        f as u32
    }
}

/// The reweight vector crushtool tests with: overrides, else 0x10000 for
/// devices placed in the hierarchy, else 0.
pub fn test_weight_vector(map: &CrushMap, overrides: &BTreeMap<i32, u32>) -> Vec<u32> {
    let mut present = vec![false; map.max_devices().max(0) as usize];
    for b in map.buckets() {
        for &it in &b.items {
            if it >= 0 && (it as usize) < present.len() {
                present[it as usize] = true;
            }
        }
    }
    (0..map.max_devices())
        .map(|o| match overrides.get(&o) {
            Some(&w) => w,
            None if present[o as usize] => 0x10000,
            None => 0,
        })
        .collect()
}

/// crushtool's heuristic bound on how many items a rule can place (used for
/// the "expected" column of the utilisation report).
fn maximum_affected_by_rule(map: &CrushMap, rule_id: i32) -> i32 {
    let Some(rule) = map.rule(rule_id) else {
        return 0;
    };
    let mut affected: Vec<i32> = Vec::new();
    let mut repl: BTreeMap<i32, i32> = BTreeMap::new();
    for s in &rule.steps {
        let (arg1, arg2) = match *s {
            RuleStep::Take(_) | RuleStep::Emit => continue,
            RuleStep::ChooseFirstN { n, type_id }
            | RuleStep::ChooseIndep { n, type_id }
            | RuleStep::ChooseLeafFirstN { n, type_id }
            | RuleStep::ChooseLeafIndep { n, type_id } => (n, type_id),
            RuleStep::SetChooseTries(n)
            | RuleStep::SetChooseLeafTries(n)
            | RuleStep::SetChooseLocalTries(n)
            | RuleStep::SetChooseLocalFallbackTries(n)
            | RuleStep::SetChooseLeafVaryR(n)
            | RuleStep::SetChooseLeafStable(n) => (n, 0),
        };
        affected.push(arg2);
        repl.insert(arg2, arg1);
    }
    let mut max_of_type: BTreeMap<i32, i32> = BTreeMap::new();
    for &t in &affected {
        let n = map.buckets().filter(|b| b.type_id == t).count() as i32;
        *max_of_type.entry(t).or_insert(0) += n;
    }
    for &t in &affected {
        let r = repl.get(&t).copied().unwrap_or(0);
        let m = max_of_type.entry(t).or_insert(0);
        if r > 0 && r < *m {
            *m = r;
        }
    }
    let mut max_affected = map.ceph_max_buckets().max(map.max_devices());
    for &t in &affected {
        let m = max_of_type.get(&t).copied().unwrap_or(0);
        if m > 0 && m < max_affected {
            max_affected = m;
        }
    }
    max_affected
}

/// Formats a float like C++ `ostream << float` (6 significant digits, %g).
pub fn fmt_g(v: f64) -> String {
    if v == 0.0 {
        return "0".to_string();
    }
    if !v.is_finite() {
        return format!("{v}");
    }
    let exp = v.abs().log10().floor() as i32;
    // Round to 6 significant digits first; rounding may bump the exponent.
    let s = format!("{:.5e}", v);
    let (mant, e) = s.split_once('e').unwrap_or((s.as_str(), "0"));
    let e: i32 = e.parse().unwrap_or(exp);
    if !(-5..6).contains(&e) {
        let mant = trim_zeros(mant);
        let sign = if e < 0 { '-' } else { '+' };
        return format!("{mant}e{sign}{:02}", e.abs());
    }
    let decimals = (5 - e).max(0) as usize;
    trim_zeros(&format!("{:.*}", decimals, v)).to_string()
}

fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

fn fmt_vec(v: &[i32]) -> String {
    let parts: Vec<String> = v.iter().map(|i| i.to_string()).collect();
    format!("[{}]", parts.join(","))
}

/// Runs the test and returns crushtool's output text.
pub fn run_test(map: &CrushMap, opts: &TestOptions) -> String {
    let mut out = String::new();
    let statistics = opts.show_statistics || opts.show_utilization;
    let weight = test_weight_vector(map, &opts.weights);
    let max_rules = map.rules.len() as i32;
    let (min_rule, max_rule) = match opts.rule {
        Some(r) => (r, r),
        None => (0, max_rules - 1),
    };
    let mut ws = Workspace::new(map);
    let mut result = Vec::new();
    let mut r = min_rule.max(0);
    while r < max_rules && r <= max_rule {
        let Some(rule) = map.rule(r) else {
            if statistics {
                let _ = writeln!(out, "rule {r} dne");
            }
            r += 1;
            continue;
        };
        let (minr, maxr) = opts.num_rep.unwrap_or((rule.min_size, rule.max_size));
        if statistics {
            let _ = writeln!(
                out,
                "rule {r} ({}), x = {}..{}, numrep = {minr}..{maxr}",
                rule.name, opts.min_x, opts.max_x
            );
        }
        for nr in minr..=maxr {
            let total_weight: i64 = weight.iter().map(|&w| i64::from(w)).sum();
            if total_weight == 0 {
                continue;
            }
            let mut per = vec![0u64; weight.len()];
            let mut sizes: BTreeMap<usize, u64> = BTreeMap::new();
            let num_objects = i64::from(opts.max_x) - i64::from(opts.min_x) + 1;
            let max_aff = maximum_affected_by_rule(map, r);
            let expected_objects = (nr.min(max_aff) as f32) * (num_objects as f32);
            let mut x = opts.min_x;
            while x <= opts.max_x {
                let real_x = match opts.pool_id {
                    Some(p) => crate::hash::hash32_2(x as u32, p as u32),
                    None => x as u32,
                };
                map.do_rule_into(&mut ws, r, real_x, nr.max(0) as usize, &weight, &mut result);
                if opts.show_mappings {
                    let _ = writeln!(out, "CRUSH rule {r} x {x} {}", fmt_vec(&result));
                }
                let mut has_none = false;
                for &item in &result {
                    if item == CRUSH_ITEM_NONE {
                        has_none = true;
                    } else if item >= 0 && (item as usize) < per.len() {
                        per[item as usize] += 1;
                    }
                }
                *sizes.entry(result.len()).or_insert(0) += 1;
                if opts.show_bad_mappings && (result.len() != nr.max(0) as usize || has_none) {
                    let _ = writeln!(
                        out,
                        "bad mapping rule {r} x {x} num_rep {nr} result {}",
                        fmt_vec(&result)
                    );
                }
                if x == i32::MAX {
                    break;
                }
                x += 1;
            }
            if statistics {
                for (size, n) in &sizes {
                    let _ = writeln!(
                        out,
                        "rule {r} ({}) num_rep {nr} result size == {size}:\t{n}/{num_objects}",
                        rule.name
                    );
                }
            }
            if opts.show_utilization {
                for (i, &stored) in per.iter().enumerate() {
                    let prop = weight[i] as f32 / total_weight as f32;
                    let expected = prop * expected_objects;
                    if expected > 0.0 && stored > 0 {
                        let _ = writeln!(
                            out,
                            "  device {i}:\t\t stored : {stored}\t expected : {}",
                            fmt_g(f64::from(expected))
                        );
                    }
                }
            }
        }
        r += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g_format_matches_cpp_ostream() {
        assert_eq!(fmt_g(0.5), "0.5");
        assert_eq!(fmt_g(3.0), "3");
        assert_eq!(fmt_g(12.345678), "12.3457");
        assert_eq!(fmt_g(1_000_000.0), "1e+06");
        assert_eq!(fmt_g(123_456.0), "123456");
        assert_eq!(fmt_g(0.0001234), "0.0001234");
    }

    #[test]
    fn reweight_conversion_truncates_like_crushtool() {
        assert_eq!(reweight_from_float(1.0), 0x10000);
        assert_eq!(reweight_from_float(0.5), 0x8000);
        assert_eq!(reweight_from_float(0.1), 6553);
        assert_eq!(reweight_from_float(2.0), 0x10000);
        assert_eq!(reweight_from_float(-1.0), 0);
    }
}
