//! CRUSH placement, bit for bit as Ceph computes it: a typed bucket hierarchy
//! of `straw2` buckets with 16.16 fixed-point weights, device classes with
//! shadow trees, rules (`take`/`choose`/`chooseleaf`/`emit`), tunables, the
//! per-OSD reweight vector, and the `crushtool -d` text format.
//!
//! Pure: no I/O. The `cairn crush` CLI, the monitors and the clients build on
//! [`CrushMap`]. Bucket algorithms other than straw2 are rejected with an error.

mod build;
mod error;
mod fastpath;
mod hash;
mod ln;
mod ln_tables;
mod map;
mod mapper;
mod shadow;
mod straw2;
pub mod tester;
mod text;

pub use build::{build_from_hosts, HostSpec};
pub use error::{CrushError, ParseError};
pub use hash::{hash32_2, hash32_3};
pub use ln::crush_ln;
pub use map::{
    Bucket, CrushMap, Device, Rule, RuleInfo, RuleStep, RuleType, TreeNode, Tunables,
    RULE_TYPE_ERASURE, RULE_TYPE_REPLICATED,
};
pub use mapper::Workspace;

/// A hole in an `indep` result (no item could be placed at that position).
pub const CRUSH_ITEM_NONE: i32 = 0x7fff_ffff;

/// 16.16 fixed-point one: a reweight of 1.0 ("in"), or a crush weight of 1 TiB.
pub const WEIGHT_ONE: u32 = 0x10000;

/// Converts a weight in TiB (or a 0.0..=1.0 reweight) to 16.16 fixed point the
/// way Ceph does: single precision, truncated.
pub fn weight_to_fixed(weight: f64) -> u32 {
    let w = (weight as f32) * 65536.0f32;
    if w <= 0.0 {
        0
    } else if w >= u32::MAX as f32 {
        u32::MAX
    } else {
        w as u32
    }
}

/// Converts a 16.16 fixed-point weight to a float (TiB or reweight).
pub fn fixed_to_weight(w: u32) -> f64 {
    f64::from(w) / 65536.0
}
