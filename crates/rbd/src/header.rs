//! On-disk (in-object) formats of an image: the header record, the lock
//! record, and the object names. Pure; no I/O.

use serde::{Deserialize, Serialize};

/// Version byte of the header encoding (1: no snapshots; 2: snapshots,
/// snap seq and parent).
pub const HEADER_VERSION: u8 = 2;
/// Version byte of the lock record encoding (1: owner and cookie; 2: also
/// the holder's client instance, so a breaker can blocklist it).
pub const LOCK_VERSION: u8 = 2;
/// Largest header or lock record accepted when decoding.
pub const MAX_RECORD_BYTES: usize = 1 << 20;
/// Directory object (omap `name_<image>` -> id, `id_<id>` -> name).
pub const DIRECTORY_OBJECT: &str = "rbd_directory";
/// Smallest and largest object size (bytes), both powers of two.
pub const MIN_OBJECT_BYTES: u64 = 4096;
pub const MAX_OBJECT_BYTES: u64 = 32 * 1024 * 1024;
pub const DEFAULT_OBJECT_BYTES: u64 = 4 * 1024 * 1024;
/// Feature bit: exclusive lock (always set by this version).
pub const FEATURE_EXCLUSIVE_LOCK: u64 = 1 << 0;

/// What the header object stores (as its omap header).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageHeader {
    pub name: String,
    pub id: String,
    pub size_bytes: u64,
    pub object_size_bytes: u64,
    pub features: u64,
    /// Pool of the data objects (may be EC with allow_ec_overwrites).
    pub data_pool: String,
    /// Snapshots, oldest first (ids increase).
    pub snapshots: Vec<SnapInfo>,
    /// Newest snapshot id ever allocated for this image (the snap context's
    /// seq; never goes down, even when that snapshot is removed).
    pub snap_seq: u64,
    /// Set on a clone: the snapshot it reads through to.
    pub parent: Option<ParentSpec>,
}

/// One snapshot of an image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapInfo {
    /// Pool-wide snapshot id (from the monitors).
    pub id: u64,
    pub name: String,
    /// Image size when the snapshot was taken.
    pub size_bytes: u64,
    pub protected: bool,
    /// Clones made from this snapshot, as `POOL/IMAGE`.
    pub children: Vec<String>,
}

/// Where a clone's unwritten objects read from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentSpec {
    /// Metadata pool and name of the parent image.
    pub pool: String,
    pub image: String,
    pub image_id: String,
    /// Data pool of the parent image.
    pub data_pool: String,
    pub snap_id: u64,
    pub snap_name: String,
    /// Bytes of the child that may read from the parent (the parent
    /// snapshot's size, lowered by shrinking the child).
    pub overlap_bytes: u64,
}

/// The first header layout (kept to read images made before snapshots).
#[derive(Deserialize)]
struct ImageHeaderV1 {
    name: String,
    id: String,
    size_bytes: u64,
    object_size_bytes: u64,
    features: u64,
    data_pool: String,
    _snapshots: Vec<(u64, String)>,
}

impl ImageHeader {
    pub fn encode(&self) -> Vec<u8> {
        cairn_types::encode_versioned(HEADER_VERSION, self)
    }

    pub fn decode(buf: &[u8]) -> Result<ImageHeader, String> {
        if buf.first() == Some(&1) {
            let (_, v1): (u8, ImageHeaderV1) =
                cairn_types::decode_versioned("rbd image header", buf, 1, 1, MAX_RECORD_BYTES)
                    .map_err(|e| e.to_string())?;
            return Ok(ImageHeader {
                name: v1.name,
                id: v1.id,
                size_bytes: v1.size_bytes,
                object_size_bytes: v1.object_size_bytes,
                features: v1.features,
                data_pool: v1.data_pool,
                snapshots: Vec::new(),
                snap_seq: 0,
                parent: None,
            });
        }
        cairn_types::decode_versioned("rbd image header", buf, 2, HEADER_VERSION, MAX_RECORD_BYTES)
            .map(|(_, h)| h)
            .map_err(|e| e.to_string())
    }

    /// The snapshot named `name`.
    pub fn snap(&self, name: &str) -> Option<&SnapInfo> {
        self.snapshots.iter().find(|s| s.name == name)
    }

    /// The snapshot context writes to this image carry.
    pub fn snap_context(&self) -> cairn_ops::SnapContext {
        cairn_ops::SnapContext {
            seq: self.snap_seq,
            snaps: self.snapshots.iter().rev().map(|s| s.id).collect(),
        }
    }

    /// Number of data objects that cover the image.
    pub fn object_count(&self) -> u64 {
        self.size_bytes.div_ceil(self.object_size_bytes)
    }
}

/// Who holds the exclusive lock (stored as the lock object's data).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockRecord {
    pub owner: String,
    pub cookie: String,
    /// The holder's client instance (`client.NAME/NONCE`), which breaking
    /// the lock blocklists; empty in records of version 1 (unknown).
    pub client: String,
}

/// The first lock record layout (no client instance).
#[derive(Deserialize)]
struct LockRecordV1 {
    owner: String,
    cookie: String,
}

impl LockRecord {
    pub fn encode(&self) -> Vec<u8> {
        cairn_types::encode_versioned(LOCK_VERSION, self)
    }
    pub fn decode(buf: &[u8]) -> Result<LockRecord, String> {
        if buf.first() == Some(&1) {
            let (_, v1): (u8, LockRecordV1) =
                cairn_types::decode_versioned("rbd lock record", buf, 1, 1, MAX_RECORD_BYTES)
                    .map_err(|e| e.to_string())?;
            return Ok(LockRecord {
                owner: v1.owner,
                cookie: v1.cookie,
                client: String::new(),
            });
        }
        cairn_types::decode_versioned("rbd lock record", buf, 2, LOCK_VERSION, MAX_RECORD_BYTES)
            .map(|(_, l)| l)
            .map_err(|e| e.to_string())
    }
    /// The holder's client instance, when the record names one.
    pub fn instance(&self) -> Option<cairn_map::ClientInstance> {
        self.client.parse().ok()
    }
}

pub fn header_object(id: &str) -> String {
    format!("rbd_header.{id}")
}

pub fn lock_object(id: &str) -> String {
    format!("rbd_lock.{id}")
}

pub fn data_object(id: &str, objno: u64) -> String {
    format!("rbd_data.{id}.{objno:016x}")
}

/// One piece of an image I/O that falls inside one data object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectExtent {
    pub objno: u64,
    /// Offset inside the object.
    pub offset: u64,
    pub len: u64,
    /// Offset of this piece inside the caller's buffer.
    pub buf_offset: u64,
}

/// Splits `[offset, offset+len)` of the image into per-object pieces.
pub fn split(object_bytes: u64, offset: u64, len: u64) -> Vec<ObjectExtent> {
    debug_assert!(object_bytes > 0);
    let mut out = Vec::new();
    let mut pos = offset;
    let end = offset.saturating_add(len);
    while pos < end {
        let objno = pos / object_bytes;
        let in_obj = pos % object_bytes;
        let n = (object_bytes - in_obj).min(end - pos);
        out.push(ObjectExtent {
            objno,
            offset: in_obj,
            len: n,
            buf_offset: pos - offset,
        });
        pos += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn header_round_trips_and_rejects_garbage() {
        let h = ImageHeader {
            name: "vm1".into(),
            id: "abc".into(),
            size_bytes: 10 << 30,
            object_size_bytes: DEFAULT_OBJECT_BYTES,
            features: FEATURE_EXCLUSIVE_LOCK,
            data_pool: "ecdata".into(),
            snapshots: vec![SnapInfo {
                id: 4,
                name: "s1".into(),
                size_bytes: 1 << 30,
                protected: true,
                children: vec!["rbd/child".into()],
            }],
            snap_seq: 4,
            parent: None,
        };
        assert_eq!(ImageHeader::decode(&h.encode()), Ok(h.clone()));
        assert_eq!(h.object_count(), 2560);
        assert!(ImageHeader::decode(&[]).is_err());
        assert!(ImageHeader::decode(&[99, 1, 2]).is_err());
        assert_eq!(h.snap_context().snaps, vec![4]);
        assert_eq!(data_object("abc", 0x1f), "rbd_data.abc.000000000000001f");
    }

    proptest! {
        #[test]
        fn split_covers_range_exactly(shift in 12u32..26, offset in 0u64..1 << 40, len in 0u64..1 << 28) {
            let os = 1u64 << shift;
            let ex = split(os, offset, len);
            let mut pos = offset;
            let mut buf = 0;
            for e in &ex {
                prop_assert!(e.len > 0 && e.offset + e.len <= os);
                prop_assert_eq!(e.objno * os + e.offset, pos);
                prop_assert_eq!(e.buf_offset, buf);
                pos += e.len;
                buf += e.len;
            }
            prop_assert_eq!(pos, offset + len);
        }
    }
}
