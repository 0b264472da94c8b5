//! cairn-ops: the words OSDs and clients speak about objects. Client op
//! requests (a vector of sub-ops on one object, or a PG-level listing),
//! replies with per-sub-op results, the primary -> replica replication
//! sub-op and its commit ack, and the small peering/recovery messages the
//! primary uses before a PG goes active, and the scrub-map exchange.
//! Every message is encoded with a version byte
//! (`cairn_types::encode_versioned`). No I/O here.

mod ec;
mod msgs;
mod op;
mod scrub;
pub mod shared;

pub use ec::*;
pub use msgs::*;
pub use op::*;
pub use scrub::*;
pub use shared::{decode_shared, encode_parts};

/// Message type numbers on a `cairn-msg` connection (0x05xx = OSD family).
pub mod msg_type {
    /// client -> primary: [`crate::OpRequest`]; answered with [`OP_REPLY`].
    pub const OP: u16 = 0x0501;
    /// primary -> client: [`crate::OpReply`].
    pub const OP_REPLY: u16 = 0x0502;
    /// primary -> replica, one-way, in version order: [`crate::RepOp`].
    pub const REPOP: u16 = 0x0503;
    /// replica -> primary, one-way: [`crate::RepOpAck`] once durable.
    pub const REPOP_ACK: u16 = 0x0504;
    /// primary -> member (call): [`crate::PgQuery`]; answered with [`PG_NOTIFY`].
    pub const PG_QUERY: u16 = 0x0505;
    pub const PG_NOTIFY: u16 = 0x0506;
    /// primary -> member (call): [`crate::PgPull`] (fetch log entries and objects).
    pub const PG_PULL: u16 = 0x0507;
    pub const PG_PULL_REPLY: u16 = 0x0508;
    /// primary -> member (call): [`crate::PgPush`] (install log entries and objects).
    pub const PG_PUSH: u16 = 0x0509;
    pub const PG_PUSH_REPLY: u16 = 0x050a;
    /// primary -> EC shard (call): [`crate::EcRead`]; answered with [`EC_READ_REPLY`].
    pub const EC_READ: u16 = 0x0521;
    pub const EC_READ_REPLY: u16 = 0x0522;
    /// primary -> EC shard (call): [`crate::EcRollback`]; answered with [`EC_ROLLBACK_REPLY`].
    pub const EC_ROLLBACK: u16 = 0x0523;
    pub const EC_ROLLBACK_REPLY: u16 = 0x0524;
    /// primary -> backfill target, one-way: [`crate::PgBackfill`].
    pub const PG_BACKFILL: u16 = 0x0531;
    /// backfill target -> primary, one-way: [`crate::PgBackfillAck`].
    pub const PG_BACKFILL_ACK: u16 = 0x0532;
    /// primary -> stray copy, one-way: [`crate::PgRemove`].
    pub const PG_REMOVE: u16 = 0x0533;
    /// stray copy -> acting primary, one-way: [`crate::PgStray`].
    pub const PG_STRAY: u16 = 0x0534;
    /// primary -> member (call): [`crate::ScrubMapRequest`]; answered with [`SCRUB_MAP_REPLY`].
    pub const SCRUB_MAP: u16 = 0x0541;
    pub const SCRUB_MAP_REPLY: u16 = 0x0542;
}

/// Wire format version of every message in this crate.
pub const OPS_WIRE_VERSION: u8 = 1;

/// Largest message this crate decodes (a 128 MiB object plus headers).
pub const OPS_MAX_MESSAGE_BYTES: usize = (128 << 20) + (1 << 20);

/// Encodes a message with the version byte (the same bytes as
/// `cairn_types::encode_versioned`), into a buffer allocated once at its
/// size: grown from one byte, a 4 KiB write's sub-op was reallocated a
/// dozen times.
pub fn encode<T: serde::Serialize>(v: &T) -> bytes::Bytes {
    let mut out = Vec::with_capacity(1 + encoded_size(v));
    out.push(OPS_WIRE_VERSION);
    // postcard only fails on serializer errors that our plain data types never raise.
    let out = postcard::to_extend(v, out).expect("postcard encoding of plain data cannot fail");
    bytes::Bytes::from(out)
}

/// The postcard size of `v` (0 if it cannot be encoded, which `encode`
/// then reports).
fn encoded_size<T: serde::Serialize>(v: &T) -> usize {
    postcard::experimental::serialized_size(v).unwrap_or(0)
}

/// Decodes a message; the error names what was being decoded.
pub fn decode<T: serde::de::DeserializeOwned>(
    what: &'static str,
    buf: &[u8],
) -> Result<T, cairn_types::DecodeError> {
    cairn_types::decode_versioned(
        what,
        buf,
        OPS_WIRE_VERSION,
        OPS_WIRE_VERSION,
        OPS_MAX_MESSAGE_BYTES,
    )
    .map(|(_, v)| v)
}

/// The 32-bit placement hash of an object name (namespace-qualified), the
/// same on every client and OSD: FNV-1a over `namespace \0 name`, then a
/// murmur3 finaliser for avalanche so that `stable_mod` spreads well.
pub fn object_hash(namespace: &str, name: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    let mut eat = |b: u8| {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    };
    for &b in namespace.as_bytes() {
        eat(b);
    }
    eat(0);
    for &b in name.as_bytes() {
        eat(b);
    }
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_types::{EntityName, Epoch, PgId, PoolId};
    use proptest::prelude::*;

    #[test]
    fn hash_is_stable_and_namespace_matters() {
        assert_eq!(object_hash("", "a"), object_hash("", "a"));
        assert_ne!(object_hash("", "a"), object_hash("a", ""));
        assert_ne!(object_hash("", "obj1"), object_hash("", "obj2"));
    }

    proptest! {
        #[test]
        fn op_request_round_trips(tid in any::<u64>(), data in proptest::collection::vec(any::<u8>(), 0..64), off in any::<u64>()) {
            let req = OpRequest {
                reqid: ReqId { client: EntityName::client("x"), incarnation: 3, tid },
                epoch: Epoch(9),
                pgid: PgId { pool: PoolId(1), seed: 7 },
                oid: ObjectName::new("", "o"),
                ops: vec![
                    SubOp::Write { offset: off, data: data.clone().into() },
                    SubOp::Read { offset: 0, len: 10 },
                    SubOp::OmapList { after: None, limit: 5, values: true },
                    SubOp::CmpXattr { name: "k".into(), op: CmpOp::Eq, value: data.into() },
                ],
                snapc: Some(SnapContext { seq: off, snaps: vec![off / 2, 1] }),
                snap: SNAP_HEAD,
            };
            let b = encode(&req);
            let back: OpRequest = decode("op request", &b).unwrap();
            prop_assert_eq!(back, req);
        }
    }

    #[test]
    fn snap_context_shape_is_checked() {
        assert!(SnapContext {
            seq: 5,
            snaps: vec![5, 3, 1]
        }
        .validate()
        .is_ok());
        assert!(SnapContext::default().validate().is_ok());
        assert!(SnapContext {
            seq: 4,
            snaps: vec![5]
        }
        .validate()
        .is_err());
        assert!(SnapContext {
            seq: 5,
            snaps: vec![3, 3]
        }
        .validate()
        .is_err());
        assert!(SnapContext {
            seq: 5,
            snaps: vec![2, 3]
        }
        .validate()
        .is_err());
        assert!(SnapContext {
            seq: 5,
            snaps: vec![0]
        }
        .validate()
        .is_err());
    }

    #[test]
    fn decode_refuses_garbage_and_other_versions() {
        assert!(decode::<OpReply>("op reply", &[]).is_err());
        assert!(decode::<OpReply>("op reply", &[9, 1, 2]).is_err());
        assert!(decode::<OpReply>("op reply", &[1, 0xff, 0xff, 0xff]).is_err());
    }
}
