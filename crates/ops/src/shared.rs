//! Zero-copy decoding of bulk data fields. [`decode_shared`] decodes a
//! message from a received `Bytes` buffer; data fields marked
//! `#[serde(deserialize_with = "crate::shared::bytes")]` then become
//! slices of that buffer (reference-counted, no copy) instead of fresh
//! copies. Everything else decodes as with [`crate::decode`]; the wire
//! format is the same.
//!
//! The sending side mirrors it: [`encode_parts`] encodes a message as a list
//! of segments in which the marked data fields (at least
//! [`MIN_PART_BYTES`] long) are the caller's own buffers, not copies; the
//! messenger sends the segments back to back as one payload.

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

thread_local! {
    /// Data fields [`ser_bytes`] met during an [`encode_parts`] on this
    /// thread and not yet taken by its output.
    static SINK: RefCell<Option<Vec<Bytes>>> = const { RefCell::new(None) };
}

/// Data fields at least this long travel as their own segment; shorter
/// ones are copied into the surrounding segment (a copy is cheaper than
/// one more I/O vector).
pub const MIN_PART_BYTES: usize = 16 << 10;

/// Ends an [`encode_parts`] on this thread (also on panic).
struct SinkGuard(Option<Vec<Bytes>>);

impl Drop for SinkGuard {
    fn drop(&mut self) {
        let prev = self.0.take();
        SINK.with(|s| *s.borrow_mut() = prev);
    }
}

/// Encodes a message like [`crate::encode`], as consecutive segments whose
/// concatenation is exactly `crate::encode(v)`: marked data fields of at
/// least [`MIN_PART_BYTES`] are shared with `v` (reference-counted), the
/// bytes around them are copied into small segments.
pub fn encode_parts<T: serde::Serialize>(v: &T) -> Vec<Bytes> {
    // Sized before any field is registered: a message shorter than a part
    // is one segment, allocated once (see `crate::encode`).
    let size = 1 + crate::encoded_size(v);
    let mut cur = Vec::with_capacity(if size <= MIN_PART_BYTES { size } else { 0 });
    cur.push(crate::OPS_WIRE_VERSION);
    let prev = SINK.with(|s| s.borrow_mut().replace(Vec::new()));
    let _guard = SinkGuard(prev);
    let flavor = Parts {
        parts: Vec::new(),
        cur,
    };
    // postcard only fails on serializer errors that our plain data types never raise.
    postcard::serialize_with_flavor(v, flavor).expect("postcard encoding of plain data cannot fail")
}

/// A postcard output that keeps registered data fields as their own segments.
struct Parts {
    parts: Vec<Bytes>,
    cur: Vec<u8>,
}

impl postcard::ser_flavors::Flavor for Parts {
    type Output = Vec<Bytes>;

    fn try_push(&mut self, b: u8) -> postcard::Result<()> {
        self.cur.push(b);
        Ok(())
    }

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        if data.len() >= MIN_PART_BYTES {
            if let Some(field) = take_registered(data) {
                if !self.cur.is_empty() {
                    self.parts.push(Bytes::from(std::mem::take(&mut self.cur)));
                }
                self.parts.push(field);
                return Ok(());
            }
        }
        self.cur.extend_from_slice(data);
        Ok(())
    }

    fn finalize(mut self) -> postcard::Result<Vec<Bytes>> {
        if !self.cur.is_empty() || self.parts.is_empty() {
            self.parts.push(Bytes::from(self.cur));
        }
        Ok(self.parts)
    }
}

/// The registered field that is exactly `data` (same memory), removed.
fn take_registered(data: &[u8]) -> Option<Bytes> {
    SINK.with(|s| {
        let mut s = s.borrow_mut();
        let fields = s.as_mut()?;
        let i = fields
            .iter()
            .rposition(|f| f.as_ptr() == data.as_ptr() && f.len() == data.len())?;
        Some(fields.swap_remove(i))
    })
}

/// `serialize_with` for a `Bytes` data field: serialized as usual (the same
/// bytes on the wire); inside [`encode_parts`] a big one is registered so
/// that the output shares it instead of copying it.
pub fn ser_bytes<S: serde::Serializer>(b: &Bytes, s: S) -> Result<S::Ok, S::Error> {
    if b.len() >= MIN_PART_BYTES {
        SINK.with(|k| {
            if let Some(fields) = k.borrow_mut().as_mut() {
                fields.push(b.clone());
            }
        });
    }
    s.serialize_bytes(b)
}

/// `serialize_with` for a `Vec<Bytes>` of data buffers (see [`ser_bytes`]).
pub fn ser_bytes_vec<S: serde::Serializer>(v: &[Bytes], s: S) -> Result<S::Ok, S::Error> {
    struct One<'a>(&'a Bytes);
    impl serde::Serialize for One<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            ser_bytes(self.0, s)
        }
    }
    s.collect_seq(v.iter().map(One))
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

    #[test]
    fn parts_concatenate_to_the_plain_encoding_and_share_big_fields() {
        let big = Bytes::from(vec![9u8; MIN_PART_BYTES + 5]);
        let reply = crate::OpReply {
            reqid: ReqId {
                client: EntityName::client("t"),
                incarnation: 1,
                tid: 2,
            },
            status: crate::OpStatus::Done(Ok(vec![
                crate::SubOpOutput::Data(Bytes::from_static(b"small")),
                crate::SubOpOutput::Data(big.clone()),
                crate::SubOpOutput::None,
            ])),
            version: Default::default(),
            epoch: Epoch(4),
        };
        let parts = encode_parts(&reply);
        assert_eq!(parts.concat(), encode(&reply).to_vec());
        assert!(
            parts.iter().any(|p| p.as_ptr() == big.as_ptr()),
            "the big field was copied"
        );
        assert!(SINK.with(|s| s.borrow().is_none()));
        // A message without big fields is one segment.
        let m = Mutation::Write {
            offset: 5,
            data: Bytes::from_static(b"abc"),
        };
        assert_eq!(encode_parts(&m), vec![encode(&m)]);
        // EC chunk lists share every big buffer.
        let chunks = vec![big.clone(), Bytes::from_static(b"x"), big.clone()];
        let r = crate::EcReadReply {
            result: Ok(crate::EcChunkData {
                version: Default::default(),
                attrs: vec![],
                data: chunks,
            }),
        };
        let parts = encode_parts(&r);
        assert_eq!(parts.concat(), encode(&r).to_vec());
        let shared = parts.iter().filter(|p| p.as_ptr() == big.as_ptr()).count();
        assert_eq!(shared, 2);
    }

    #[test]
    fn encodings_sized_up_front_are_the_versioned_encoding_in_one_allocation() {
        let m = Mutation::Write {
            offset: 5,
            data: Bytes::from(vec![3u8; 4096]),
        };
        let plain = cairn_types::encode_versioned(crate::OPS_WIRE_VERSION, &m);
        assert_eq!(encode(&m).to_vec(), plain);
        let parts = encode_parts(&m);
        assert_eq!(parts, vec![Bytes::from(plain.clone())]);
        // Vec -> Bytes keeps the allocation only when it is exactly full.
        let mut v = Vec::with_capacity(1 + crate::encoded_size(&m));
        v.extend_from_slice(&plain);
        assert_eq!(v.capacity(), v.len(), "sized exactly");
    }
}
