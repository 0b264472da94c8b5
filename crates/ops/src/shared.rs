//! Zero-copy decoding of bulk data fields. [`decode_shared`] decodes a
//! message from a received `Bytes` buffer; data fields marked
//! `#[serde(deserialize_with = "crate::shared::bytes")]` then become
//! slices of that buffer (reference-counted, no copy) instead of fresh
//! copies. Everything else decodes as with [`crate::decode`]; the wire
//! format is the same.

use bytes::Bytes;
use serde::de::{Deserializer, SeqAccess, Visitor};
use std::cell::RefCell;
use std::fmt;

thread_local! {
    /// The buffer [`decode_shared`] is decoding on this thread, if any.
    static SOURCE: RefCell<Option<Bytes>> = const { RefCell::new(None) };
}

/// Restores the previous source when a decode ends (also on panic).
struct SourceGuard(Option<Bytes>);

impl Drop for SourceGuard {
    fn drop(&mut self) {
        let prev = self.0.take();
        SOURCE.with(|s| *s.borrow_mut() = prev);
    }
}

/// Decodes a message like [`crate::decode`]; its marked data fields share
/// `buf`'s memory instead of copying it.
pub fn decode_shared<T: serde::de::DeserializeOwned>(
    what: &'static str,
    buf: &Bytes,
) -> Result<T, cairn_types::DecodeError> {
    let prev = SOURCE.with(|s| s.borrow_mut().replace(buf.clone()));
    let _guard = SourceGuard(prev);
    crate::decode(what, buf)
}

/// `v` as a slice of the buffer being decoded when it lies inside it,
/// else a copy.
fn share(v: &[u8]) -> Bytes {
    SOURCE.with(|s| match s.borrow().as_ref() {
        Some(src) if inside(src, v) => src.slice_ref(v),
        _ => Bytes::copy_from_slice(v),
    })
}

fn inside(src: &[u8], v: &[u8]) -> bool {
    let (s, e) = (src.as_ptr() as usize, src.as_ptr() as usize + src.len());
    let (a, b) = (v.as_ptr() as usize, v.as_ptr() as usize + v.len());
    !v.is_empty() && s <= a && b <= e
}

struct BytesVisitor;

impl<'de> Visitor<'de> for BytesVisitor {
    type Value = Bytes;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a byte string")
    }

    fn visit_borrowed_bytes<E: serde::de::Error>(self, v: &'de [u8]) -> Result<Bytes, E> {
        Ok(share(v))
    }

    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Bytes, E> {
        Ok(Bytes::copy_from_slice(v))
    }

    fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Bytes, E> {
        Ok(Bytes::from(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Bytes, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
        while let Some(b) = seq.next_element::<u8>()? {
            out.push(b);
        }
        Ok(Bytes::from(out))
    }
}

/// `deserialize_with` for a `Bytes` data field.
pub fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
    d.deserialize_bytes(BytesVisitor)
}

/// A `Bytes` that deserializes through [`bytes`] (for sequences).
struct SharedBytes(Bytes);

impl<'de> serde::Deserialize<'de> for SharedBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        bytes(d).map(SharedBytes)
    }
}

/// `deserialize_with` for a `Vec<Bytes>` of data buffers.
pub fn bytes_vec<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Bytes>, D::Error> {
    let v: Vec<SharedBytes> = serde::Deserialize::deserialize(d)?;
    Ok(v.into_iter().map(|b| b.0).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{encode, Mutation, ObjectName, OpRequest, ReqId, SubOp};
    use cairn_types::{EntityName, Epoch, PgId, PoolId};

    fn data_of(op: &SubOp) -> &[u8] {
        match op {
            SubOp::WriteFull { data } => data,
            _ => panic!("not a write"),
        }
    }

    #[test]
    fn data_fields_share_the_buffer_and_others_decode_as_before() {
        let req = OpRequest {
            reqid: ReqId {
                client: EntityName::client("t"),
                incarnation: 1,
                tid: 2,
            },
            epoch: Epoch(3),
            pgid: PgId {
                pool: PoolId(1),
                seed: 0,
            },
            oid: ObjectName::new("", "o"),
            ops: vec![SubOp::WriteFull {
                data: Bytes::from(vec![7u8; 100_000]),
            }],
            snapc: None,
            snap: crate::SNAP_HEAD,
        };
        let wire = encode(&req);
        let back: OpRequest = decode_shared("op request", &wire).unwrap();
        assert_eq!(back, req);
        assert!(inside(&wire, data_of(&back.ops[0])), "data was copied");
        // The plain decoder copies, and gives the same value.
        let copied: OpRequest = crate::decode("op request", &wire).unwrap();
        assert_eq!(copied, req);
        assert!(!inside(&wire, data_of(&copied.ops[0])));
        // The source is cleared after the decode.
        assert!(SOURCE.with(|s| s.borrow().is_none()));
        let m = Mutation::Write {
            offset: 5,
            data: Bytes::from_static(b"abc"),
        };
        let back: Mutation = decode_shared("mutation", &encode(&m)).unwrap();
        assert_eq!(back, m);
    }
}
