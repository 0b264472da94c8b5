//! Object and collection identity, and the order-preserving byte encodings
//! used as metadata keys. Owns key layout only; no I/O.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Snapshot id of the head (writable) version of an object, like Ceph's CEPH_NOSNAP.
pub const SNAP_HEAD: u64 = u64::MAX;
/// Shard id of a collection that belongs to a replicated (not erasure-coded) pool.
pub const NO_SHARD: u8 = u8::MAX;
/// Longest object name or namespace accepted, in bytes.
pub const OBJECT_NAME_MAX_BYTES: usize = 4096;

/// One collection per PG shard: pool, placement seed and EC shard
/// ([`NO_SHARD`] for replicated pools).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CollectionId {
    pub pool: u64,
    pub seed: u32,
    pub shard: u8,
}

pub(crate) const COLL_KEY_LEN: usize = 13;

impl CollectionId {
    pub fn new(pool: u64, seed: u32, shard: u8) -> Self {
        CollectionId { pool, seed, shard }
    }
    /// A replicated pool's PG collection.
    pub fn pg(pool: u64, seed: u32) -> Self {
        CollectionId::new(pool, seed, NO_SHARD)
    }
    pub(crate) fn key(&self) -> [u8; COLL_KEY_LEN] {
        let mut k = [0u8; COLL_KEY_LEN];
        k[..8].copy_from_slice(&self.pool.to_be_bytes());
        k[8..12].copy_from_slice(&self.seed.to_be_bytes());
        k[12] = self.shard;
        k
    }
    pub(crate) fn from_key(k: &[u8]) -> Option<Self> {
        if k.len() < COLL_KEY_LEN {
            return None;
        }
        Some(CollectionId {
            pool: u64::from_be_bytes(k[..8].try_into().ok()?),
            seed: u32::from_be_bytes(k[8..12].try_into().ok()?),
            shard: k[12],
        })
    }
}

impl fmt::Display for CollectionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.shard == NO_SHARD {
            write!(f, "{}.{:x}_head", self.pool, self.seed)
        } else {
            write!(f, "{}.{:x}s{}_head", self.pool, self.seed, self.shard)
        }
    }
}

/// An object inside a collection. `hash` is the caller's 32-bit placement
/// hash of the name (the same one that chose the PG); listing is ordered by
/// the bit-reversed hash, then namespace, name and snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ObjectId {
    pub hash: u32,
    pub namespace: String,
    pub name: String,
    /// [`SNAP_HEAD`] for the head object, otherwise the snapshot id of a clone.
    pub snap: u64,
}

impl ObjectId {
    /// The head version of `name` in the default namespace.
    pub fn new(hash: u32, name: impl Into<String>) -> Self {
        ObjectId {
            hash,
            namespace: String::new(),
            name: name.into(),
            snap: SNAP_HEAD,
        }
    }
    pub fn with_snap(mut self, snap: u64) -> Self {
        self.snap = snap;
        self
    }
    pub fn with_namespace(mut self, ns: impl Into<String>) -> Self {
        self.namespace = ns.into();
        self
    }
    /// The sort key inside a collection: bit-reversed hash, namespace, name, snap.
    pub(crate) fn sort_key(&self) -> Vec<u8> {
        let mut k = Vec::with_capacity(4 + self.namespace.len() + self.name.len() + 12);
        k.extend_from_slice(&self.hash.reverse_bits().to_be_bytes());
        push_escaped(&mut k, self.namespace.as_bytes());
        push_escaped(&mut k, self.name.as_bytes());
        k.extend_from_slice(&self.snap.to_be_bytes());
        k
    }
    pub(crate) fn from_sort_key(k: &[u8]) -> Option<Self> {
        let hash = u32::from_be_bytes(k.get(..4)?.try_into().ok()?).reverse_bits();
        let (ns, rest) = take_escaped(&k[4..])?;
        let (name, rest) = take_escaped(rest)?;
        let snap = u64::from_be_bytes(rest.get(..8)?.try_into().ok()?);
        if rest.len() != 8 {
            return None;
        }
        Some(ObjectId {
            hash,
            namespace: String::from_utf8(ns).ok()?,
            name: String::from_utf8(name).ok()?,
            snap,
        })
    }
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.name.len() > OBJECT_NAME_MAX_BYTES || self.namespace.len() > OBJECT_NAME_MAX_BYTES {
            return Err(format!(
                "object name or namespace longer than {OBJECT_NAME_MAX_BYTES} bytes"
            ));
        }
        Ok(())
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}:", self.hash)?;
        if !self.namespace.is_empty() {
            write!(f, "{}/", self.namespace)?;
        }
        write!(f, "{}", self.name)?;
        if self.snap == SNAP_HEAD {
            write!(f, ":head")
        } else {
            write!(f, ":{:x}", self.snap)
        }
    }
}

/// Order-preserving escape: 0x00 -> 0x00 0xFF, terminator 0x00 0x01.
fn push_escaped(out: &mut Vec<u8>, s: &[u8]) {
    for &b in s {
        out.push(b);
        if b == 0 {
            out.push(0xFF);
        }
    }
    out.extend_from_slice(&[0, 1]);
}

fn take_escaped(k: &[u8]) -> Option<(Vec<u8>, &[u8])> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < k.len() {
        if k[i] == 0 {
            match *k.get(i + 1)? {
                0xFF => out.push(0),
                1 => return Some((out, &k[i + 2..])),
                _ => return None,
            }
            i += 2;
        } else {
            out.push(k[i]);
            i += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn oid() -> impl Strategy<Value = ObjectId> {
        (
            any::<u32>(),
            "[a\\x00b]{0,4}",
            "[\\x00-\\x02a-c]{0,6}",
            prop_oneof![Just(SNAP_HEAD), any::<u64>()],
        )
            .prop_map(|(hash, namespace, name, snap)| ObjectId {
                hash,
                namespace,
                name,
                snap,
            })
    }

    proptest! {
        #[test]
        fn sort_key_round_trips(o in oid()) {
            prop_assert_eq!(ObjectId::from_sort_key(&o.sort_key()), Some(o));
        }

        #[test]
        fn sort_key_orders_like_tuple(a in oid(), b in oid()) {
            let ta = (a.hash.reverse_bits(), a.namespace.as_bytes(), a.name.as_bytes(), a.snap);
            let tb = (b.hash.reverse_bits(), b.namespace.as_bytes(), b.name.as_bytes(), b.snap);
            prop_assert_eq!(a.sort_key().cmp(&b.sort_key()), ta.cmp(&tb));
        }
    }

    #[test]
    fn collection_key_round_trips() {
        let c = CollectionId::new(7, 0x1f, 2);
        assert_eq!(CollectionId::from_key(&c.key()), Some(c));
        assert_eq!(c.to_string(), "7.1fs2_head");
        assert_eq!(CollectionId::pg(3, 0xa).to_string(), "3.a_head");
    }
}
