//! The CRUSH map data model (devices, types, straw2 buckets, classes, rules,
//! tunables) and its editing and query API. Placement itself lives in
//! `mapper.rs`, the text format in `text.rs`, shadow trees in `shadow.rs`.

use crate::error::CrushError;
use crate::{fixed_to_weight, weight_to_fixed};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Bucket algorithm number of straw2 (the only one Cairn implements).
pub const ALG_STRAW2: u8 = 5;
/// Rule type number of replicated pools (as in Ceph).
pub const RULE_TYPE_REPLICATED: u8 = 1;
/// Rule type number of erasure-coded pools (as in Ceph).
pub const RULE_TYPE_ERASURE: u8 = 3;
/// Upper bound on buckets (ids -1 ..= -MAX_BUCKETS).
pub const MAX_BUCKETS: usize = 1 << 20;
/// Upper bound on device ids.
pub const MAX_DEVICES: i32 = 1 << 24;
/// Upper bound on rules.
pub const MAX_RULES: usize = 1 << 16;
/// Format version of [`CrushMap::encode`].
const ENCODING_VERSION: u8 = 1;
/// Largest encoded map [`CrushMap::decode`] accepts.
const MAX_ENCODED_BYTES: usize = 256 << 20;

/// The tunables of a map (Ceph's names and meanings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tunables {
    pub choose_local_tries: u32,
    pub choose_local_fallback_tries: u32,
    pub choose_total_tries: u32,
    pub chooseleaf_descend_once: u32,
    pub chooseleaf_vary_r: u32,
    pub chooseleaf_stable: u32,
    pub straw_calc_version: u32,
    pub allowed_bucket_algs: u32,
}

impl Tunables {
    /// Ceph's current "optimal" profile (the defaults of [`CrushMap::new`]).
    pub fn optimal() -> Tunables {
        Tunables {
            choose_local_tries: 0,
            choose_local_fallback_tries: 0,
            choose_total_tries: 50,
            chooseleaf_descend_once: 1,
            chooseleaf_vary_r: 1,
            chooseleaf_stable: 1,
            straw_calc_version: 1,
            allowed_bucket_algs: 54,
        }
    }

    /// The legacy (argonaut) values: what crushtool assumes for a text map
    /// that has no `tunable` lines.
    pub fn legacy() -> Tunables {
        Tunables {
            choose_local_tries: 2,
            choose_local_fallback_tries: 5,
            choose_total_tries: 19,
            chooseleaf_descend_once: 0,
            chooseleaf_vary_r: 0,
            chooseleaf_stable: 0,
            straw_calc_version: 0,
            allowed_bucket_algs: 14,
        }
    }
}

impl Default for Tunables {
    fn default() -> Self {
        Tunables::optimal()
    }
}

/// A device (OSD) entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    pub name: String,
    /// Device class id (see the map's class names).
    pub class: Option<i32>,
}

/// A straw2 bucket. Item weights are 16.16 fixed point; `weight` is their sum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    pub id: i32,
    pub name: String,
    pub type_id: i32,
    pub alg: u8,
    pub hash: u8,
    pub items: Vec<i32>,
    pub weights: Vec<u32>,
    pub weight: u32,
}

impl Bucket {
    pub(crate) fn new(id: i32, name: &str, type_id: i32) -> Bucket {
        Bucket {
            id,
            name: name.to_string(),
            type_id,
            alg: ALG_STRAW2,
            hash: 0,
            items: Vec::new(),
            weights: Vec::new(),
            weight: 0,
        }
    }

    pub(crate) fn push(&mut self, item: i32, weight: u32) {
        self.items.push(item);
        self.weights.push(weight);
        self.weight = self.weight.wrapping_add(weight);
    }

    pub(crate) fn recompute_weight(&mut self) {
        self.weight = self.weights.iter().fold(0u32, |a, w| a.wrapping_add(*w));
    }
}

/// One rule step, with Ceph's semantics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RuleStep {
    /// `take ITEM` (a shadow bucket id when the text says `take X class C`).
    Take(i32),
    ChooseFirstN {
        n: i32,
        type_id: i32,
    },
    ChooseIndep {
        n: i32,
        type_id: i32,
    },
    ChooseLeafFirstN {
        n: i32,
        type_id: i32,
    },
    ChooseLeafIndep {
        n: i32,
        type_id: i32,
    },
    Emit,
    SetChooseTries(i32),
    SetChooseLeafTries(i32),
    SetChooseLocalTries(i32),
    SetChooseLocalFallbackTries(i32),
    SetChooseLeafVaryR(i32),
    SetChooseLeafStable(i32),
}

/// A placement rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    pub id: i32,
    pub name: String,
    /// Ceph's rule type number (1 replicated, 3 erasure).
    pub rule_type: u8,
    pub min_size: i32,
    pub max_size: i32,
    pub steps: Vec<RuleStep>,
}

/// Pool kind a rule is meant for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RuleType {
    Replicated,
    Erasure,
}

/// Summary of a rule for listings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleInfo {
    pub id: i32,
    pub name: String,
    pub rule_type: RuleType,
    pub min_size: i32,
    pub max_size: i32,
    pub steps_text: Vec<String>,
}

/// One line of `ceph osd tree`-like output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TreeNode {
    pub id: i32,
    pub name: String,
    pub type_name: String,
    pub class: Option<String>,
    /// Crush weight in TiB.
    pub weight: f64,
    pub depth: usize,
}

/// A CRUSH map. See the crate documentation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrushMap {
    pub(crate) tunables: Tunables,
    pub(crate) types: BTreeMap<i32, String>,
    pub(crate) devices: BTreeMap<i32, Device>,
    /// Indexed by `-1 - id`.
    pub(crate) buckets: Vec<Option<Bucket>>,
    pub(crate) class_names: BTreeMap<i32, String>,
    /// original bucket id -> class id -> shadow bucket id.
    pub(crate) class_bucket: BTreeMap<i32, BTreeMap<i32, i32>>,
    /// Indexed by rule id.
    pub(crate) rules: Vec<Option<Rule>>,
    /// Ceph's `max_buckets` (the bucket array size, grown by doubling as
    /// buckets are added and never shrunk). Placement does not depend on it;
    /// crushtool's utilisation report does.
    pub(crate) ceph_max_buckets: u32,
}

impl Default for CrushMap {
    fn default() -> Self {
        CrushMap::new()
    }
}

const DEFAULT_TYPES: [&str; 12] = [
    "osd",
    "host",
    "chassis",
    "rack",
    "row",
    "pdu",
    "pod",
    "room",
    "datacenter",
    "zone",
    "region",
    "root",
];

pub(crate) fn check_name(name: &str) -> Result<(), CrushError> {
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
    if ok {
        Ok(())
    } else {
        Err(CrushError::BadName(name.to_string()))
    }
}

fn check_weight(weight: f64, what: &str) -> Result<u32, CrushError> {
    if !weight.is_finite() || !(0.0..65535.0).contains(&weight) {
        return Err(CrushError::BadWeight(weight, what.to_string()));
    }
    Ok(weight_to_fixed(weight))
}

impl CrushMap {
    /// An empty map with Ceph's default types and optimal tunables.
    pub fn new() -> CrushMap {
        let mut m = CrushMap::empty(Tunables::optimal());
        for (i, t) in DEFAULT_TYPES.iter().enumerate() {
            m.types.insert(i as i32, (*t).to_string());
        }
        m
    }

    /// A map with no types, items or rules.
    pub(crate) fn empty(tunables: Tunables) -> CrushMap {
        CrushMap {
            tunables,
            types: BTreeMap::new(),
            devices: BTreeMap::new(),
            buckets: Vec::new(),
            class_names: BTreeMap::new(),
            class_bucket: BTreeMap::new(),
            rules: Vec::new(),
            ceph_max_buckets: 0,
        }
    }

    // ----- encoding -------------------------------------------------------

    /// The compiled form: one version byte + postcard (see docs/crush.md).
    pub fn encode(&self) -> Vec<u8> {
        cairn_types::encode_versioned(ENCODING_VERSION, self)
    }

    /// Decodes [`CrushMap::encode`] output and validates it.
    pub fn decode(buf: &[u8]) -> Result<CrushMap, CrushError> {
        let (_, map): (u8, CrushMap) = cairn_types::decode_versioned(
            "CRUSH map",
            buf,
            ENCODING_VERSION,
            ENCODING_VERSION,
            MAX_ENCODED_BYTES,
        )
        .map_err(|e| CrushError::Decode(e.to_string()))?;
        map.validate()?;
        Ok(map)
    }

    /// Checks internal consistency (ids in range, items exist, straw2 only).
    pub fn validate(&self) -> Result<(), CrushError> {
        if self.buckets.len() > MAX_BUCKETS || self.rules.len() > MAX_RULES {
            return Err(CrushError::TooMany("buckets or rules".into()));
        }
        for (&id, _) in self.devices.iter() {
            if !(0..MAX_DEVICES).contains(&id) {
                return Err(CrushError::Invalid(format!("device id {id} out of range")));
            }
        }
        for (idx, b) in self.buckets.iter().enumerate() {
            let Some(b) = b else { continue };
            if b.id != -1 - idx as i32 {
                return Err(CrushError::Invalid(format!(
                    "bucket '{}' has a wrong id",
                    b.name
                )));
            }
            if b.alg != ALG_STRAW2 {
                return Err(CrushError::UnsupportedAlg {
                    bucket: b.name.clone(),
                    alg: alg_name(b.alg).to_string(),
                });
            }
            if b.items.len() != b.weights.len() {
                return Err(CrushError::Invalid(format!(
                    "bucket '{}' items/weights differ",
                    b.name
                )));
            }
            if !self.types.contains_key(&b.type_id) {
                return Err(CrushError::Invalid(format!(
                    "bucket '{}' has unknown type {}",
                    b.name, b.type_id
                )));
            }
            for &it in &b.items {
                let ok = if it >= 0 {
                    self.devices.contains_key(&it)
                } else {
                    self.bucket(it).is_some() && it != b.id
                };
                if !ok {
                    return Err(CrushError::Invalid(format!(
                        "bucket '{}' holds unknown item {it}",
                        b.name
                    )));
                }
            }
        }
        for (idx, r) in self.rules.iter().enumerate() {
            let Some(r) = r else { continue };
            if r.id != idx as i32 {
                return Err(CrushError::Invalid(format!(
                    "rule '{}' has a wrong id",
                    r.name
                )));
            }
        }
        if self.has_cycle() {
            return Err(CrushError::Invalid(
                "the bucket hierarchy has a cycle".into(),
            ));
        }
        Ok(())
    }

    fn has_cycle(&self) -> bool {
        // 0 = unvisited, 1 = in progress, 2 = done
        let mut state = vec![0u8; self.buckets.len()];
        fn visit(m: &CrushMap, idx: usize, state: &mut [u8]) -> bool {
            match state[idx] {
                1 => return true,
                2 => return false,
                _ => {}
            }
            state[idx] = 1;
            if let Some(b) = &m.buckets[idx] {
                for &it in &b.items {
                    if it < 0 {
                        let c = (-1 - it) as usize;
                        if c < state.len() && visit(m, c, state) {
                            return true;
                        }
                    }
                }
            }
            state[idx] = 2;
            false
        }
        (0..self.buckets.len()).any(|i| visit(self, i, &mut state))
    }

    // ----- low-level accessors -------------------------------------------

    /// The bucket with id `id` (negative), if any.
    pub fn bucket(&self, id: i32) -> Option<&Bucket> {
        if id >= 0 {
            return None;
        }
        self.buckets
            .get((-1 - id) as usize)
            .and_then(|b| b.as_ref())
    }

    pub(crate) fn bucket_mut(&mut self, id: i32) -> Option<&mut Bucket> {
        if id >= 0 {
            return None;
        }
        self.buckets
            .get_mut((-1 - id) as usize)
            .and_then(|b| b.as_mut())
    }

    /// All buckets including shadow buckets, by id descending (-1 first).
    pub fn buckets(&self) -> impl Iterator<Item = &Bucket> {
        self.buckets.iter().flatten()
    }

    /// One more than the largest device id (Ceph's `max_devices`).
    pub fn max_devices(&self) -> i32 {
        self.devices.keys().next_back().map_or(0, |&d| d + 1)
    }

    /// Number of bucket slots (Ceph's `max_buckets`).
    pub fn max_buckets(&self) -> i32 {
        self.buckets.len() as i32
    }

    pub fn tunables(&self) -> &Tunables {
        &self.tunables
    }

    pub fn set_tunables(&mut self, t: Tunables) {
        self.tunables = t;
    }

    /// The rule with id `id`.
    pub fn rule(&self, id: i32) -> Option<&Rule> {
        if id < 0 {
            return None;
        }
        self.rules.get(id as usize).and_then(|r| r.as_ref())
    }

    /// Type id of a type name.
    pub fn type_id(&self, name: &str) -> Option<i32> {
        self.types
            .iter()
            .find(|(_, n)| n.as_str() == name)
            .map(|(&i, _)| i)
    }

    /// Name of a type id.
    pub fn type_name(&self, id: i32) -> Option<&str> {
        self.types.get(&id).map(|s| s.as_str())
    }

    /// Adds or renames a type.
    pub fn set_type(&mut self, id: i32, name: &str) -> Result<(), CrushError> {
        check_name(name)?;
        self.types.insert(id, name.to_string());
        Ok(())
    }

    pub(crate) fn type_id_or_err(&self, name: &str) -> Result<i32, CrushError> {
        self.type_id(name).ok_or_else(|| {
            let known: Vec<&str> = self.types.values().map(|s| s.as_str()).collect();
            CrushError::NoSuchType(name.to_string(), known.join(", "))
        })
    }

    /// Class id of a class name.
    pub fn class_id(&self, name: &str) -> Option<i32> {
        self.class_names
            .iter()
            .find(|(_, n)| n.as_str() == name)
            .map(|(&i, _)| i)
    }

    /// Name of a class id.
    pub fn class_name(&self, id: i32) -> Option<&str> {
        self.class_names.get(&id).map(|s| s.as_str())
    }

    /// Class id of `name`, creating it (next free id, as Ceph does) when missing.
    pub(crate) fn get_or_create_class(&mut self, name: &str) -> Result<i32, CrushError> {
        check_name(name)?;
        if let Some(c) = self.class_id(name) {
            return Ok(c);
        }
        let id = self.class_names.keys().next_back().map_or(0, |&c| c + 1);
        self.class_names.insert(id, name.to_string());
        Ok(id)
    }

    /// True if `id` is a shadow (per-class) bucket.
    pub fn is_shadow(&self, id: i32) -> bool {
        self.shadow_origin(id).is_some()
    }

    /// For a shadow bucket: (original bucket id, class id).
    pub fn shadow_origin(&self, id: i32) -> Option<(i32, i32)> {
        if id >= 0 {
            return None;
        }
        for (&orig, per_class) in &self.class_bucket {
            for (&class, &shadow) in per_class {
                if shadow == id {
                    return Some((orig, class));
                }
            }
        }
        None
    }

    /// The shadow bucket of `orig` for class `class`, if built.
    pub fn shadow_of(&self, orig: i32, class: i32) -> Option<i32> {
        self.class_bucket
            .get(&orig)
            .and_then(|m| m.get(&class))
            .copied()
    }

    /// Id of a named item (device or bucket, shadow buckets included).
    pub fn item_id(&self, name: &str) -> Option<i32> {
        if let Some(b) = self.buckets().find(|b| b.name == name) {
            return Some(b.id);
        }
        self.devices
            .iter()
            .find(|(_, d)| d.name == name)
            .map(|(&i, _)| i)
    }

    /// Lowest free bucket id (-1, -2, …) not in `avoid`.
    pub(crate) fn free_bucket_id(&self, avoid: &dyn Fn(i32) -> bool) -> i32 {
        let mut id = -1;
        while self.bucket(id).is_some() || avoid(id) {
            id -= 1;
        }
        id
    }

    pub(crate) fn insert_bucket(&mut self, b: Bucket) -> Result<(), CrushError> {
        let idx = (-1 - b.id) as usize;
        if idx >= MAX_BUCKETS {
            return Err(CrushError::TooMany(format!(
                "bucket id {} beyond the limit",
                b.id
            )));
        }
        if self.buckets.len() <= idx {
            self.buckets.resize(idx + 1, None);
        }
        if self.buckets[idx].is_some() {
            return Err(CrushError::Invalid(format!(
                "bucket id {} used twice",
                b.id
            )));
        }
        self.buckets[idx] = Some(b);
        let pos = idx as u32;
        if pos >= self.ceph_max_buckets {
            self.ceph_max_buckets = if self.ceph_max_buckets == 0 {
                8
            } else {
                self.ceph_max_buckets * 2
            };
            if pos >= self.ceph_max_buckets {
                self.ceph_max_buckets = pos + 1;
            }
        }
        Ok(())
    }

    /// Ceph's `max_buckets` for this map (see the field's documentation).
    pub fn ceph_max_buckets(&self) -> i32 {
        self.ceph_max_buckets as i32
    }

    pub(crate) fn trim_bucket_slots(&mut self) {
        while matches!(self.buckets.last(), Some(None)) {
            self.buckets.pop();
        }
    }

    /// Non-shadow buckets that hold `item`.
    fn parents(&self, item: i32) -> Vec<i32> {
        self.buckets()
            .filter(|b| b.items.contains(&item) && !self.is_shadow(b.id))
            .map(|b| b.id)
            .collect()
    }

    /// Sets the weight of `item` inside every (non-shadow) bucket holding it
    /// and propagates the change to their ancestors.
    fn set_item_weight_everywhere(&mut self, item: i32, weight: u32) {
        for p in self.parents(item) {
            let new_w = {
                let Some(b) = self.bucket_mut(p) else {
                    continue;
                };
                for (it, w) in b.items.iter().zip(b.weights.iter_mut()) {
                    if *it == item {
                        *w = weight;
                    }
                }
                b.recompute_weight();
                b.weight
            };
            self.set_item_weight_everywhere(p, new_w);
        }
    }

    // ----- editing API ------------------------------------------------------

    /// Adds an empty straw2 bucket, optionally inside `parent`; returns its id.
    pub fn add_bucket(
        &mut self,
        name: &str,
        type_name: &str,
        parent: Option<&str>,
    ) -> Result<i32, CrushError> {
        check_name(name)?;
        if self.item_id(name).is_some() {
            return Err(CrushError::NameExists(name.to_string()));
        }
        let type_id = self.type_id_or_err(type_name)?;
        let parent_id = match parent {
            Some(p) => Some(
                self.item_id(p)
                    .filter(|&id| id < 0 && !self.is_shadow(id))
                    .ok_or_else(|| CrushError::NoSuchItem(p.to_string()))?,
            ),
            None => None,
        };
        let id = self.free_bucket_id(&|_| false);
        self.insert_bucket(Bucket::new(id, name, type_id))?;
        if let Some(p) = parent_id {
            if let Some(b) = self.bucket_mut(p) {
                b.push(id, 0);
            }
        }
        self.rebuild_shadows()?;
        Ok(id)
    }

    /// Removes an empty bucket (not referenced by a rule).
    pub fn remove_bucket(&mut self, name: &str) -> Result<(), CrushError> {
        let id = self
            .item_id(name)
            .filter(|&id| id < 0 && !self.is_shadow(id))
            .ok_or_else(|| CrushError::NoSuchItem(name.to_string()))?;
        if self.bucket(id).is_some_and(|b| !b.items.is_empty()) {
            return Err(CrushError::BucketNotEmpty(name.to_string()));
        }
        let shadows: Vec<i32> = self
            .class_bucket
            .get(&id)
            .map(|m| m.values().copied().collect())
            .unwrap_or_default();
        for r in self.rules.iter().flatten() {
            for s in &r.steps {
                if let RuleStep::Take(t) = s {
                    if *t == id || shadows.contains(t) {
                        return Err(CrushError::Invalid(format!(
                            "bucket '{name}' is used by rule '{}'; remove the rule first",
                            r.name
                        )));
                    }
                }
            }
        }
        for p in self.parents(id) {
            if let Some(b) = self.bucket_mut(p) {
                let keep: Vec<(i32, u32)> = b
                    .items
                    .iter()
                    .zip(b.weights.iter())
                    .filter(|(it, _)| **it != id)
                    .map(|(a, b)| (*a, *b))
                    .collect();
                b.items = keep.iter().map(|x| x.0).collect();
                b.weights = keep.iter().map(|x| x.1).collect();
                b.recompute_weight();
            }
        }
        self.buckets[(-1 - id) as usize] = None;
        self.class_bucket.remove(&id);
        self.rebuild_shadows()?;
        Ok(())
    }

    /// Adds OSD `osd` with a crush weight in TiB at `location` (innermost
    /// first, e.g. `[("host","node1"),("root","default")]`); missing buckets
    /// are created and linked.
    pub fn add_device(
        &mut self,
        osd: i32,
        class: Option<&str>,
        weight: f64,
        location: &[(&str, &str)],
    ) -> Result<(), CrushError> {
        if !(0..MAX_DEVICES).contains(&osd) {
            return Err(CrushError::Invalid(format!("osd id {osd} out of range")));
        }
        let w = check_weight(weight, &format!("osd.{osd}"))?;
        if !self.parents(osd).is_empty() {
            return Err(CrushError::DeviceExists(osd));
        }
        let dev_name = format!("osd.{osd}");
        if let Some(other) = self.item_id(&dev_name) {
            if other != osd {
                return Err(CrushError::NameExists(dev_name));
            }
        }
        // Validate the location before changing anything.
        for (t, n) in location {
            let tid = self.type_id_or_err(t)?;
            check_name(n)?;
            if let Some(id) = self.item_id(n) {
                if id >= 0 || self.is_shadow(id) {
                    return Err(CrushError::NameExists((*n).to_string()));
                }
                if self.bucket(id).map(|b| b.type_id) != Some(tid) {
                    return Err(CrushError::Invalid(format!(
                        "bucket '{n}' exists but is not of type '{t}'"
                    )));
                }
            }
        }
        // Like a booting Ceph OSD: the class is set first (a new class gets
        // its shadow trees right away), then the OSD is placed.
        let class_is_new = class.is_some_and(|c| self.class_id(c).is_none());
        let class_id = match class {
            Some(c) => Some(self.get_or_create_class(c)?),
            None => None,
        };
        self.devices.insert(
            osd,
            Device {
                name: dev_name,
                class: class_id,
            },
        );
        if class_is_new {
            self.rebuild_shadows()?;
        }
        let mut cur = osd;
        let mut cur_w = w;
        for (t, n) in location {
            let tid = self.type_id_or_err(t)?;
            if let Some(id) = self.item_id(n) {
                let new_w = {
                    let Some(b) = self.bucket_mut(id) else { break };
                    b.push(cur, cur_w);
                    b.weight
                };
                self.set_item_weight_everywhere(id, new_w);
                break;
            }
            let id = self.free_bucket_id(&|_| false);
            let mut b = Bucket::new(id, n, tid);
            b.push(cur, cur_w);
            cur_w = b.weight;
            self.insert_bucket(b)?;
            cur = id;
        }
        self.rebuild_shadows()
    }

    /// Removes an OSD from the hierarchy and the device list.
    pub fn remove_device(&mut self, osd: i32) -> Result<(), CrushError> {
        if !self.devices.contains_key(&osd) {
            return Err(CrushError::NoSuchDevice(osd));
        }
        for p in self.parents(osd) {
            let new_w = {
                let Some(b) = self.bucket_mut(p) else {
                    continue;
                };
                let keep: Vec<(i32, u32)> = b
                    .items
                    .iter()
                    .zip(b.weights.iter())
                    .filter(|(it, _)| **it != osd)
                    .map(|(a, b)| (*a, *b))
                    .collect();
                b.items = keep.iter().map(|x| x.0).collect();
                b.weights = keep.iter().map(|x| x.1).collect();
                b.recompute_weight();
                b.weight
            };
            self.set_item_weight_everywhere(p, new_w);
        }
        self.devices.remove(&osd);
        self.rebuild_shadows()
    }

    /// Sets an OSD's device class (creating the class) and rebuilds shadow trees.
    pub fn set_device_class(&mut self, osd: i32, class: &str) -> Result<(), CrushError> {
        if !self.devices.contains_key(&osd) {
            return Err(CrushError::NoSuchDevice(osd));
        }
        let c = self.get_or_create_class(class)?;
        if let Some(d) = self.devices.get_mut(&osd) {
            d.class = Some(c);
        }
        self.rebuild_shadows()
    }

    /// Clears an OSD's device class and rebuilds shadow trees.
    pub fn rm_device_class(&mut self, osd: i32) -> Result<(), CrushError> {
        let d = self
            .devices
            .get_mut(&osd)
            .ok_or(CrushError::NoSuchDevice(osd))?;
        d.class = None;
        self.rebuild_shadows()
    }

    /// The class name of an OSD.
    pub fn device_class(&self, osd: i32) -> Option<&str> {
        self.devices
            .get(&osd)
            .and_then(|d| d.class)
            .and_then(|c| self.class_name(c))
    }

    /// Sets an OSD's crush weight (TiB); ancestors' weights follow.
    pub fn reweight_device(&mut self, osd: i32, weight: f64) -> Result<(), CrushError> {
        if !self.devices.contains_key(&osd) {
            return Err(CrushError::NoSuchDevice(osd));
        }
        let w = check_weight(weight, &format!("osd.{osd}"))?;
        if self.parents(osd).is_empty() {
            return Err(CrushError::Invalid(format!(
                "osd.{osd} is not inside any bucket; add it with a location first"
            )));
        }
        self.set_item_weight_everywhere(osd, w);
        self.rebuild_shadows()
    }

    fn lowest_free_rule_id(&self) -> i32 {
        self.rules
            .iter()
            .position(|r| r.is_none())
            .unwrap_or(self.rules.len()) as i32
    }

    pub(crate) fn insert_rule(&mut self, rule: Rule) -> Result<(), CrushError> {
        let idx = usize::try_from(rule.id)
            .ok()
            .filter(|&i| i < MAX_RULES)
            .ok_or_else(|| CrushError::Invalid(format!("rule id {} out of range", rule.id)))?;
        if self.rules.iter().flatten().any(|r| r.name == rule.name) {
            return Err(CrushError::RuleExists(rule.name));
        }
        if self.rules.len() <= idx {
            self.rules.resize(idx + 1, None);
        }
        if self.rules[idx].is_some() {
            return Err(CrushError::Invalid(format!(
                "rule id {} used twice",
                rule.id
            )));
        }
        self.rules[idx] = Some(rule);
        Ok(())
    }

    fn take_target(&self, root: &str, class: Option<&str>) -> Result<i32, CrushError> {
        let root_id = self
            .item_id(root)
            .filter(|&id| !self.is_shadow(id))
            .ok_or_else(|| CrushError::NoSuchItem(root.to_string()))?;
        match class {
            None => Ok(root_id),
            Some(c) => {
                let cid = self
                    .class_id(c)
                    .ok_or_else(|| CrushError::NoSuchClass(c.to_string()))?;
                self.shadow_of(root_id, cid).ok_or_else(|| {
                    CrushError::Invalid(format!(
                        "bucket '{root}' has no shadow tree for class '{c}'"
                    ))
                })
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn add_simple_rule(
        &mut self,
        name: &str,
        root: &str,
        failure_domain: &str,
        class: Option<&str>,
        indep: bool,
        min_size: i32,
        max_size: i32,
    ) -> Result<i32, CrushError> {
        check_name(name)?;
        if self.rule_id(name).is_some() {
            return Err(CrushError::RuleExists(name.to_string()));
        }
        let take = self.take_target(root, class)?;
        let fd = self.type_id_or_err(failure_domain)?;
        let mut steps = Vec::new();
        if indep {
            steps.push(RuleStep::SetChooseLeafTries(5));
            steps.push(RuleStep::SetChooseTries(100));
        }
        steps.push(RuleStep::Take(take));
        steps.push(match (fd == 0, indep) {
            (true, false) => RuleStep::ChooseFirstN { n: 0, type_id: 0 },
            (true, true) => RuleStep::ChooseIndep { n: 0, type_id: 0 },
            (false, false) => RuleStep::ChooseLeafFirstN { n: 0, type_id: fd },
            (false, true) => RuleStep::ChooseLeafIndep { n: 0, type_id: fd },
        });
        steps.push(RuleStep::Emit);
        let id = self.lowest_free_rule_id();
        let rule_type = if indep {
            RULE_TYPE_ERASURE
        } else {
            RULE_TYPE_REPLICATED
        };
        self.insert_rule(Rule {
            id,
            name: name.to_string(),
            rule_type,
            min_size,
            max_size,
            steps,
        })?;
        Ok(id)
    }

    /// `take root [class]; chooseleaf firstn 0 type fd; emit` (min 1, max 10).
    pub fn add_replicated_rule(
        &mut self,
        name: &str,
        root: &str,
        failure_domain: &str,
        class: Option<&str>,
    ) -> Result<i32, CrushError> {
        self.add_simple_rule(name, root, failure_domain, class, false, 1, 10)
    }

    /// Ceph's erasure rule: `set_chooseleaf_tries 5; set_choose_tries 100;
    /// take root [class]; chooseleaf indep 0 type fd; emit` (min_size 3 or
    /// `size` if smaller, max_size `size`).
    pub fn add_erasure_rule(
        &mut self,
        name: &str,
        root: &str,
        failure_domain: &str,
        class: Option<&str>,
        size: u32,
    ) -> Result<i32, CrushError> {
        let max = i32::try_from(size)
            .map_err(|_| CrushError::Invalid(format!("rule size {size} too large")))?;
        self.add_simple_rule(name, root, failure_domain, class, true, max.min(3), max)
    }

    /// Removes a rule by name.
    pub fn remove_rule(&mut self, name: &str) -> Result<(), CrushError> {
        let id = self
            .rule_id(name)
            .ok_or_else(|| CrushError::NoSuchRule(name.to_string()))?;
        self.rules[id as usize] = None;
        while matches!(self.rules.last(), Some(None)) {
            self.rules.pop();
        }
        Ok(())
    }

    /// Id of a named rule.
    pub fn rule_id(&self, name: &str) -> Option<i32> {
        self.rules
            .iter()
            .flatten()
            .find(|r| r.name == name)
            .map(|r| r.id)
    }

    /// All rules, by id.
    pub fn rules(&self) -> Vec<RuleInfo> {
        self.rules
            .iter()
            .flatten()
            .map(|r| RuleInfo {
                id: r.id,
                name: r.name.clone(),
                rule_type: if r.rule_type == RULE_TYPE_ERASURE {
                    RuleType::Erasure
                } else {
                    RuleType::Replicated
                },
                min_size: r.min_size,
                max_size: r.max_size,
                steps_text: r.steps.iter().map(|s| self.step_text(s)).collect(),
            })
            .collect()
    }

    /// Name of an item, falling back to its id.
    pub(crate) fn item_label(&self, id: i32) -> String {
        self.item_name(id)
            .map_or_else(|| id.to_string(), |s| s.to_string())
    }

    fn type_label(&self, t: i32) -> String {
        self.type_name(t)
            .map_or_else(|| t.to_string(), |s| s.to_string())
    }

    /// A step as written in crushtool text (without the `step ` prefix).
    pub fn step_text(&self, s: &RuleStep) -> String {
        match *s {
            RuleStep::Take(id) => match self.shadow_origin(id) {
                Some((orig, class)) => format!(
                    "take {} class {}",
                    self.item_label(orig),
                    self.class_name(class).unwrap_or("?")
                ),
                None => format!("take {}", self.item_label(id)),
            },
            RuleStep::ChooseFirstN { n, type_id } => {
                format!("choose firstn {n} type {}", self.type_label(type_id))
            }
            RuleStep::ChooseIndep { n, type_id } => {
                format!("choose indep {n} type {}", self.type_label(type_id))
            }
            RuleStep::ChooseLeafFirstN { n, type_id } => {
                format!("chooseleaf firstn {n} type {}", self.type_label(type_id))
            }
            RuleStep::ChooseLeafIndep { n, type_id } => {
                format!("chooseleaf indep {n} type {}", self.type_label(type_id))
            }
            RuleStep::Emit => "emit".to_string(),
            RuleStep::SetChooseTries(n) => format!("set_choose_tries {n}"),
            RuleStep::SetChooseLeafTries(n) => format!("set_chooseleaf_tries {n}"),
            RuleStep::SetChooseLocalTries(n) => format!("set_choose_local_tries {n}"),
            RuleStep::SetChooseLocalFallbackTries(n) => {
                format!("set_choose_local_fallback_tries {n}")
            }
            RuleStep::SetChooseLeafVaryR(n) => format!("set_chooseleaf_vary_r {n}"),
            RuleStep::SetChooseLeafStable(n) => format!("set_chooseleaf_stable {n}"),
        }
    }

    /// Non-shadow buckets that no non-shadow bucket contains, by id descending.
    pub(crate) fn roots(&self) -> Vec<i32> {
        let mut contained = std::collections::BTreeSet::new();
        for b in self.buckets() {
            if self.is_shadow(b.id) {
                continue;
            }
            for &it in &b.items {
                contained.insert(it);
            }
        }
        let mut roots: Vec<i32> = self
            .buckets()
            .filter(|b| !self.is_shadow(b.id) && !contained.contains(&b.id))
            .map(|b| b.id)
            .collect();
        roots.sort_unstable_by(|a, b| b.cmp(a));
        roots
    }

    /// Depth-first listing like `ceph osd tree` (shadow buckets left out).
    pub fn tree(&self) -> Vec<TreeNode> {
        let mut out = Vec::new();
        for r in self.roots() {
            let w = self.bucket(r).map_or(0, |b| b.weight);
            self.tree_walk(r, w, 0, &mut out);
        }
        out
    }

    fn tree_walk(&self, id: i32, weight: u32, depth: usize, out: &mut Vec<TreeNode>) {
        if depth > 64 {
            return;
        }
        if id >= 0 {
            out.push(TreeNode {
                id,
                name: self.item_label(id),
                type_name: self.type_label(0),
                class: self.device_class(id).map(|s| s.to_string()),
                weight: fixed_to_weight(weight),
                depth,
            });
            return;
        }
        let Some(b) = self.bucket(id) else { return };
        out.push(TreeNode {
            id,
            name: b.name.clone(),
            type_name: self.type_label(b.type_id),
            class: None,
            weight: fixed_to_weight(b.weight),
            depth,
        });
        for (&it, &w) in b.items.iter().zip(b.weights.iter()) {
            self.tree_walk(it, w, depth + 1, out);
        }
    }

    /// Ids of all devices, ascending.
    pub fn device_ids(&self) -> Vec<i32> {
        self.devices.keys().copied().collect()
    }

    /// Device entry by id.
    pub fn device(&self, osd: i32) -> Option<&Device> {
        self.devices.get(&osd)
    }

    /// Name of a device or bucket.
    pub fn item_name(&self, id: i32) -> Option<&str> {
        if id >= 0 {
            self.devices.get(&id).map(|d| d.name.as_str())
        } else {
            self.bucket(id).map(|b| b.name.as_str())
        }
    }

    /// An OSD's crush weight in TiB (from the first bucket holding it).
    pub fn device_weight(&self, osd: i32) -> Option<f64> {
        self.buckets()
            .filter(|b| !self.is_shadow(b.id))
            .find_map(|b| b.items.iter().position(|&i| i == osd).map(|p| b.weights[p]))
            .map(fixed_to_weight)
    }

    /// Name of the ancestor of `osd` of type `type_name` (e.g. its host).
    pub fn parent_of_type(&self, osd: i32, type_name: &str) -> Option<String> {
        let t = self.type_id(type_name)?;
        let mut cur = osd;
        for _ in 0..64 {
            let p = *self.parents(cur).first()?;
            let b = self.bucket(p)?;
            if b.type_id == t {
                return Some(b.name.clone());
            }
            cur = p;
        }
        None
    }

    /// True if the device sits in some (non-shadow) bucket.
    pub fn device_in_tree(&self, osd: i32) -> bool {
        self.buckets()
            .any(|b| !self.is_shadow(b.id) && b.items.contains(&osd))
    }

    /// Ceph's `crush_do_rule`: the items rule `rule_id` picks for input `x`
    /// with `num_rep` replicas. `reweights[osd]` is the 16.16 reweight
    /// (0x10000 = in, 0 = out); missing entries mean 0x10000.
    pub fn do_rule(&self, rule_id: i32, x: u32, num_rep: usize, reweights: &[u32]) -> Vec<i32> {
        let mut ws = crate::mapper::Workspace::new(self);
        let mut out = Vec::with_capacity(num_rep);
        self.do_rule_into(&mut ws, rule_id, x, num_rep, reweights, &mut out);
        out
    }
}

pub(crate) fn alg_name(alg: u8) -> &'static str {
    match alg {
        1 => "uniform",
        2 => "list",
        3 => "tree",
        4 => "straw",
        5 => "straw2",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three_hosts() -> CrushMap {
        let mut m = CrushMap::new();
        m.add_bucket("default", "root", None).unwrap();
        for (h, name) in ["alecto", "megaera", "tisiphone"].iter().enumerate() {
            for d in 0..2 {
                let osd = (h * 2 + d) as i32;
                m.add_device(
                    osd,
                    Some("hdd"),
                    5.458,
                    &[("host", name), ("root", "default")],
                )
                .unwrap();
            }
        }
        m
    }

    #[test]
    fn shadow_ids_follow_ceph_boot_order() {
        let m = three_hosts();
        let hdd = m.class_id("hdd").unwrap();
        assert_eq!(m.item_id("default"), Some(-1));
        assert_eq!(m.shadow_of(-1, hdd), Some(-2));
        assert_eq!(m.item_id("alecto"), Some(-3));
        assert_eq!(m.shadow_of(-3, hdd), Some(-4));
        assert_eq!(m.item_id("megaera"), Some(-5));
        assert_eq!(m.item_name(-4), Some("alecto~hdd"));
    }

    #[test]
    fn weights_propagate_and_tree_lists_non_shadow_items() {
        let mut m = three_hosts();
        let host_w = m.bucket(-3).unwrap().weight;
        assert_eq!(host_w, 2 * weight_to_fixed(5.458));
        assert_eq!(m.bucket(-1).unwrap().weight, 3 * host_w);
        m.reweight_device(0, 1.0).unwrap();
        assert_eq!(
            m.bucket(-3).unwrap().weight,
            weight_to_fixed(5.458) + 0x10000
        );
        let hdd = m.class_id("hdd").unwrap();
        let shadow_root = m.shadow_of(-1, hdd).unwrap();
        assert_eq!(
            m.bucket(shadow_root).unwrap().weight,
            m.bucket(-1).unwrap().weight
        );
        let tree = m.tree();
        assert_eq!(tree.len(), 1 + 3 + 6);
        assert_eq!((tree[0].name.as_str(), tree[0].depth), ("default", 0));
        assert_eq!((tree[1].name.as_str(), tree[1].depth), ("alecto", 1));
        assert_eq!(tree[2].class.as_deref(), Some("hdd"));
        assert!((m.device_weight(0).unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(m.parent_of_type(3, "host").as_deref(), Some("megaera"));
        assert_eq!(m.parent_of_type(3, "root").as_deref(), Some("default"));
    }

    #[test]
    fn classes_rules_and_removal() {
        let mut m = three_hosts();
        m.add_device(
            6,
            Some("ssd"),
            0.91,
            &[("host", "alecto"), ("root", "default")],
        )
        .unwrap();
        assert_eq!(m.device_class(6), Some("ssd"));
        let rep = m
            .add_replicated_rule("ssd-only", "default", "host", Some("ssd"))
            .unwrap();
        let ec = m
            .add_erasure_rule("ec", "default", "host", Some("hdd"), 3)
            .unwrap();
        assert_eq!((rep, ec), (0, 1));
        let rules = m.rules();
        assert_eq!(
            rules[0].steps_text,
            vec![
                "take default class ssd",
                "chooseleaf firstn 0 type host",
                "emit"
            ]
        );
        assert_eq!(rules[1].rule_type, RuleType::Erasure);
        assert_eq!(rules[1].steps_text[0], "set_chooseleaf_tries 5");
        assert_eq!(m.do_rule(rep, 7, 3, &[]), vec![6]);
        let got = m.do_rule(ec, 7, 3, &[]);
        assert_eq!(got.len(), 3);
        assert!(got.iter().all(|&o| m.device_class(o) == Some("hdd")));
        // Reweight vector: OSD 6 out -> nothing left for the ssd rule.
        let mut rw = vec![0x10000; 7];
        rw[6] = 0;
        assert_eq!(m.do_rule(rep, 7, 3, &rw), Vec::<i32>::new());
        m.set_device_class(6, "hdd").unwrap();
        assert_eq!(m.do_rule(rep, 7, 3, &[]), Vec::<i32>::new());
        m.rm_device_class(6).unwrap();
        assert_eq!(m.device_class(6), None);
        m.remove_device(6).unwrap();
        assert!(!m.device_ids().contains(&6));
        assert_eq!(m.bucket(-3).unwrap().weight, 2 * weight_to_fixed(5.458));
        m.remove_rule("ssd-only").unwrap();
        assert_eq!(m.rule_id("ssd-only"), None);
        assert!(matches!(
            m.add_device(0, None, 1.0, &[("host", "x")]),
            Err(CrushError::DeviceExists(0))
        ));
        assert!(matches!(
            m.add_bucket("r2", "nosuchtype", None),
            Err(CrushError::NoSuchType(..))
        ));
        assert!(matches!(
            m.remove_device(42),
            Err(CrushError::NoSuchDevice(42))
        ));
    }

    #[test]
    fn encode_decode_round_trip_and_rejects_garbage() {
        let m = three_hosts();
        let buf = m.encode();
        assert_eq!(buf[0], ENCODING_VERSION);
        assert_eq!(CrushMap::decode(&buf).unwrap(), m);
        assert!(CrushMap::decode(&[]).is_err());
        assert!(CrushMap::decode(&[9, 1, 2]).is_err());
        assert!(CrushMap::decode(&buf[..buf.len() / 2]).is_err());
    }

    #[test]
    fn text_round_trip_of_built_map() {
        let mut m = three_hosts();
        m.add_replicated_rule("replicated_rule", "default", "host", None)
            .unwrap();
        let text = m.to_text();
        let back = CrushMap::parse_text(&text).unwrap();
        assert_eq!(back.to_text(), text);
        for x in 0..200 {
            assert_eq!(back.do_rule(0, x, 3, &[]), m.do_rule(0, x, 3, &[]));
        }
    }
}
