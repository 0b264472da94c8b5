//! Per-class shadow trees: for every root and every device class, a copy of
//! the hierarchy holding only that class's devices (`default~hdd`), so that
//! `step take default class hdd` is an ordinary take of the shadow root.
//! Ids are kept from the previous build (or from `id -4 class hdd` lines);
//! new ones are the lowest free ids, assigned depth first, children before
//! parents, roots in ascending id order and classes in class-id order, which
//! is how Ceph assigns them.

use crate::error::CrushError;
use crate::map::{Bucket, CrushMap};
use std::collections::{BTreeMap, BTreeSet};

impl CrushMap {
    /// Drops every shadow bucket and builds them again, keeping known ids.
    pub(crate) fn rebuild_shadows(&mut self) -> Result<(), CrushError> {
        let old = std::mem::take(&mut self.class_bucket);
        for per_class in old.values() {
            for &sid in per_class.values() {
                if let Some(slot) = self.buckets.get_mut((-1 - sid) as usize) {
                    *slot = None;
                }
            }
        }
        self.populate_shadows(&old)
    }

    /// Builds shadow trees for all roots and classes; `wanted` gives ids to
    /// use (original id -> class id -> shadow id).
    pub(crate) fn populate_shadows(
        &mut self,
        wanted: &BTreeMap<i32, BTreeMap<i32, i32>>,
    ) -> Result<(), CrushError> {
        let used: BTreeSet<i32> = wanted.values().flat_map(|m| m.values().copied()).collect();
        let mut roots = self.roots();
        roots.sort_unstable();
        let classes: Vec<i32> = self.class_names.keys().copied().collect();
        for &r in &roots {
            for &c in &classes {
                self.clone_for_class(r, c, wanted, &used, 0)?;
            }
        }
        self.trim_bucket_slots();
        Ok(())
    }

    fn clone_for_class(
        &mut self,
        orig: i32,
        class: i32,
        wanted: &BTreeMap<i32, BTreeMap<i32, i32>>,
        used: &BTreeSet<i32>,
        depth: usize,
    ) -> Result<i32, CrushError> {
        if depth > 64 {
            return Err(CrushError::Invalid(
                "bucket hierarchy deeper than 64 levels".into(),
            ));
        }
        if let Some(id) = self.shadow_of(orig, class) {
            return Ok(id);
        }
        let (name, type_id, alg, hash, items, weights) = {
            let b = self
                .bucket(orig)
                .ok_or_else(|| CrushError::Invalid(format!("bucket {orig} vanished")))?;
            (
                b.name.clone(),
                b.type_id,
                b.alg,
                b.hash,
                b.items.clone(),
                b.weights.clone(),
            )
        };
        let class_name = self.class_name(class).unwrap_or("?").to_string();
        let mut copy = Bucket::new(0, &format!("{name}~{class_name}"), type_id);
        copy.alg = alg;
        copy.hash = hash;
        for (&it, &w) in items.iter().zip(weights.iter()) {
            if it >= 0 {
                if self.devices.get(&it).and_then(|d| d.class) == Some(class) {
                    copy.push(it, w);
                }
            } else {
                let child = self.clone_for_class(it, class, wanted, used, depth + 1)?;
                let cw = self.bucket(child).map_or(0, |b| b.weight);
                copy.push(child, cw);
            }
        }
        let id = match wanted.get(&orig).and_then(|m| m.get(&class)) {
            Some(&id) if self.bucket(id).is_none() => id,
            _ => self.free_bucket_id(&|id| used.contains(&id)),
        };
        copy.id = id;
        self.insert_bucket(copy)?;
        self.class_bucket.entry(orig).or_default().insert(class, id);
        Ok(id)
    }
}
