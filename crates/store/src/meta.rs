//! Metadata records and table layout in the KV engine (redb). Owns the byte
//! formats of keys and values; knows nothing about transactions.
//!
//! Tables (all `&[u8] -> &[u8]`):
//! - `super`:   "super" -> [`Superblock`], "next_id" -> u64 BE,
//!   "wal_applied" -> u64 BE (last WAL record whose effects this state holds),
//!   "wal_head" -> u64 BE (WAL file offset where the record after it starts)
//! - `colls`:   coll(13) -> [`CollMeta`]
//! - `objects`: coll(13) ++ object sort key -> [`Onode`]
//! - `extents`: onode id BE ++ logical block BE -> [`ExtentRec`]
//! - `omap`:    onode id BE ++ user key -> value
//! - `pgmeta`:  coll(13) ++ key -> value
//! - `pglog`:   coll(13) ++ index BE -> entry

use crate::error::{Result, StoreError};
use crate::ids::{CollectionId, ObjectId};
use redb::TableDefinition;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub(crate) type Tbl = TableDefinition<'static, &'static [u8], &'static [u8]>;
pub(crate) const T_SUPER: Tbl = TableDefinition::new("super");
pub(crate) const T_COLLS: Tbl = TableDefinition::new("colls");
pub(crate) const T_OBJECTS: Tbl = TableDefinition::new("objects");
pub(crate) const T_EXTENTS: Tbl = TableDefinition::new("extents");
pub(crate) const T_OMAP: Tbl = TableDefinition::new("omap");
pub(crate) const T_PGMETA: Tbl = TableDefinition::new("pgmeta");
pub(crate) const T_PGLOG: Tbl = TableDefinition::new("pglog");

/// On-disk format version of the store (label, superblock, records, WAL).
/// 2: adds the write-ahead log (`wal` file, `wal_applied` in `super`).
pub const FORMAT_VERSION: u32 = 2;
/// Key in `super` of the last WAL sequence number applied durably.
pub(crate) const KEY_WAL_APPLIED: &[u8] = b"wal_applied";
/// Key in `super` of the WAL file offset where replay starts.
pub(crate) const KEY_WAL_HEAD: &[u8] = b"wal_head";
const REC_V1: u8 = 1;
/// Largest metadata record we will decode.
const REC_LIMIT_BYTES: usize = 64 << 20;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Superblock {
    pub format_version: u32,
    pub store_id: [u8; 16],
    pub block_size: u32,
    pub data_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub(crate) struct CollMeta {
    pub created: bool,
}

/// Per-object metadata ("onode"): internal id, logical size and xattrs.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub(crate) struct Onode {
    pub id: u64,
    pub size: u64,
    pub attrs: BTreeMap<String, Vec<u8>>,
}

/// A run of logical blocks stored contiguously at `pblock`, one crc32c per block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExtentRec {
    pub pblock: u64,
    pub crcs: Vec<u32>,
}

pub(crate) fn enc<T: Serialize>(v: &T) -> Vec<u8> {
    cairn_types::encode_versioned(REC_V1, v)
}

pub(crate) fn dec<T: serde::de::DeserializeOwned>(what: &'static str, b: &[u8]) -> Result<T> {
    Ok(cairn_types::decode_versioned(what, b, REC_V1, REC_V1, REC_LIMIT_BYTES)?.1)
}

impl ExtentRec {
    pub fn blocks(&self) -> u64 {
        self.crcs.len() as u64
    }
    /// `[version][pblock u64 LE][crc u32 LE]*` — hand-rolled: this is the hottest record.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(9 + 4 * self.crcs.len());
        v.push(REC_V1);
        v.extend_from_slice(&self.pblock.to_le_bytes());
        for c in &self.crcs {
            v.extend_from_slice(&c.to_le_bytes());
        }
        v
    }
    pub fn decode(b: &[u8]) -> Result<ExtentRec> {
        if b.len() < 9 || b[0] != REC_V1 || !(b.len() - 9).is_multiple_of(4) || b.len() == 9 {
            return Err(StoreError::Corrupt(format!(
                "extent record of {} bytes is malformed",
                b.len()
            )));
        }
        let mut pb = [0u8; 8];
        pb.copy_from_slice(&b[1..9]);
        let crcs = b[9..]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(ExtentRec {
            pblock: u64::from_le_bytes(pb),
            crcs,
        })
    }
}

pub(crate) fn obj_key(c: &CollectionId, o: &ObjectId) -> Vec<u8> {
    let mut k = c.key().to_vec();
    k.extend_from_slice(&o.sort_key());
    k
}

pub(crate) fn id_key(id: u64, suffix: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + suffix.len());
    k.extend_from_slice(&id.to_be_bytes());
    k.extend_from_slice(suffix);
    k
}

pub(crate) fn ext_key(id: u64, lblock: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&id.to_be_bytes());
    k[8..].copy_from_slice(&lblock.to_be_bytes());
    k
}

pub(crate) fn ext_key_parse(k: &[u8]) -> Option<(u64, u64)> {
    if k.len() != 16 {
        return None;
    }
    Some((
        u64::from_be_bytes(k[..8].try_into().ok()?),
        u64::from_be_bytes(k[8..].try_into().ok()?),
    ))
}

pub(crate) fn coll_key(c: &CollectionId, suffix: &[u8]) -> Vec<u8> {
    let mut k = c.key().to_vec();
    k.extend_from_slice(suffix);
    k
}

/// Smallest key greater than every key starting with `prefix` (prefix of all 0xFF has none).
pub(crate) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut k = prefix.to_vec();
    while let Some(last) = k.pop() {
        if last != 0xFF {
            k.push(last + 1);
            return Some(k);
        }
    }
    None
}

/// Data-file label written in the first 4 KiB.
pub(crate) const LABEL_BYTES: usize = 4096;
const LABEL_MAGIC: &[u8; 16] = b"cairn-store-data";

pub(crate) fn encode_label(sb: &Superblock) -> Vec<u8> {
    let mut v = vec![0u8; LABEL_BYTES];
    v[..16].copy_from_slice(LABEL_MAGIC);
    v[16..20].copy_from_slice(&sb.format_version.to_le_bytes());
    v[20..36].copy_from_slice(&sb.store_id);
    v[36..40].copy_from_slice(&sb.block_size.to_le_bytes());
    v[40..48].copy_from_slice(&sb.data_bytes.to_le_bytes());
    let crc = crc32c::crc32c(&v[..48]);
    v[48..52].copy_from_slice(&crc.to_le_bytes());
    v
}

/// Bytes of a device's start that [`existing_signature`] looks at.
pub(crate) const SIGNATURE_PROBE_BYTES: usize = 68 << 10;

/// What an existing data device or file already holds, judged by the
/// on-disk signatures of common formats in `head` (its first bytes): a
/// cairn store, a filesystem, a partition table, a volume. None if none of
/// them is there. Used at mkfs so that a store is never laid over data.
pub(crate) fn existing_signature(head: &[u8]) -> Option<&'static str> {
    let at = |off: usize, sig: &[u8]| head.get(off..off + sig.len()) == Some(sig);
    if at(0, LABEL_MAGIC) {
        return Some("a cairn store");
    }
    let sigs: [(usize, &[u8], &'static str); 8] = [
        (1080, &[0x53, 0xEF], "an ext2/3/4 filesystem"),
        (0, b"XFSB", "an XFS filesystem"),
        (65600, b"_BHRfS_M", "a btrfs filesystem"),
        (0, b"LUKS\xba\xbe", "a LUKS volume"),
        (512, b"EFI PART", "a GPT partition table"),
        (512, b"LABELONE", "an LVM physical volume"),
        (4086, b"SWAPSPACE2", "swap space"),
        (510, &[0x55, 0xAA], "a DOS partition table or boot sector"),
    ];
    sigs.iter().find(|(o, sig, _)| at(*o, sig)).map(|s| s.2)
}

pub(crate) fn decode_label(v: &[u8]) -> std::result::Result<Superblock, String> {
    if v.len() < 52 || &v[..16] != LABEL_MAGIC {
        return Err("data file has no cairn-store label (not a store, or wrong file)".into());
    }
    let crc = u32::from_le_bytes([v[48], v[49], v[50], v[51]]);
    if crc != crc32c::crc32c(&v[..48]) {
        return Err("data file label checksum mismatch".into());
    }
    let u32_at = |o: usize| u32::from_le_bytes([v[o], v[o + 1], v[o + 2], v[o + 3]]);
    let mut id = [0u8; 16];
    id.copy_from_slice(&v[20..36]);
    let mut db = [0u8; 8];
    db.copy_from_slice(&v[40..48]);
    Ok(Superblock {
        format_version: u32_at(16),
        store_id: id,
        block_size: u32_at(36),
        data_bytes: u64::from_le_bytes(db),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_of_existing_formats() {
        let mut head = vec![0u8; SIGNATURE_PROBE_BYTES];
        assert_eq!(existing_signature(&head), None);
        head[1080] = 0x53;
        head[1081] = 0xEF;
        assert_eq!(existing_signature(&head), Some("an ext2/3/4 filesystem"));
        head[..16].copy_from_slice(LABEL_MAGIC);
        assert_eq!(existing_signature(&head), Some("a cairn store"));
        let mut head = vec![0u8; 600];
        head[512..520].copy_from_slice(b"EFI PART");
        assert_eq!(existing_signature(&head), Some("a GPT partition table"));
        // A short head cannot match signatures beyond its end.
        assert_eq!(existing_signature(&[0u8; 16]), None);
    }

    #[test]
    fn extent_round_trip_and_label() {
        let e = ExtentRec {
            pblock: 77,
            crcs: vec![1, 2, 0xdeadbeef],
        };
        assert_eq!(ExtentRec::decode(&e.encode()).unwrap(), e);
        assert!(ExtentRec::decode(&[1, 2, 3]).is_err());
        let sb = Superblock {
            format_version: FORMAT_VERSION,
            store_id: [9; 16],
            block_size: 4096,
            data_bytes: 1 << 30,
        };
        let mut l = encode_label(&sb);
        assert_eq!(decode_label(&l).unwrap(), sb);
        l[37] ^= 1;
        assert!(decode_label(&l).is_err());
        assert_eq!(prefix_end(&[1, 0xFF]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xFF]), None);
    }
}
