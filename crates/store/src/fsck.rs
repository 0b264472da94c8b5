//! Consistency walks over a store: `fsck` checks the metadata graph and the
//! extent map; `deep_fsck` also reads every data block and verifies its
//! crc32c. Both only report; repair is the OSD's job (from replicas).

use crate::apply::verify_blocks;
use crate::error::{Result, StoreError};
use crate::ids::{CollectionId, ObjectId};
use crate::meta::*;
use crate::store::Store;
use redb::{ReadTransaction, ReadableTable};
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};

/// One problem found by a walk.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FsckIssue {
    /// `checksum`, `orphan_extent`, `orphan_omap`, `overlap`, `out_of_range`,
    /// `beyond_eof`, `no_collection`, `bad_record`, `io`.
    pub kind: &'static str,
    pub coll: Option<CollectionId>,
    pub object: Option<ObjectId>,
    /// Logical byte offset inside the object, where it applies.
    pub offset: Option<u64>,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct FsckReport {
    pub deep: bool,
    pub collections: u64,
    pub objects: u64,
    pub extents: u64,
    pub data_bytes_mapped: u64,
    pub data_bytes_verified: u64,
    pub issues: Vec<FsckIssue>,
}

impl FsckReport {
    pub fn is_clean(&self) -> bool {
        self.issues.is_empty()
    }
}

/// Stop listing after this many issues (the count of what was seen keeps going).
const MAX_ISSUES: usize = 10_000;

impl Store {
    /// Shallow check: metadata references and extent map (no data reads).
    pub fn fsck(&self) -> Result<FsckReport> {
        self.walk(false)
    }

    /// Deep check: everything `fsck` does plus every block's checksum.
    pub fn deep_fsck(&self) -> Result<FsckReport> {
        self.walk(true)
    }

    /// Checkpoints first (every acknowledged group into redb), then walks
    /// that redb snapshot.
    fn walk(&self, deep: bool) -> Result<FsckReport> {
        self.checkpoint()?;
        self.with_read(|r| walk_in(self, r.redb(), deep))
    }
}

fn issue(
    rep: &mut FsckReport,
    kind: &'static str,
    coll: Option<CollectionId>,
    object: Option<ObjectId>,
    offset: Option<u64>,
    detail: String,
) {
    if rep.issues.len() < MAX_ISSUES {
        rep.issues.push(FsckIssue {
            kind,
            coll,
            object,
            offset,
            detail,
        });
    }
}

fn walk_in(store: &Store, r: &ReadTransaction, deep: bool) -> Result<FsckReport> {
    let inner = store.inner();
    let bs = inner.block_size;
    let mut rep = FsckReport {
        deep,
        ..Default::default()
    };
    let mut colls = BTreeSet::new();
    for e in r.open_table(T_COLLS)?.iter()? {
        let (k, _) = e?;
        match CollectionId::from_key(k.value()) {
            Some(c) => {
                colls.insert(c);
            }
            None => issue(
                &mut rep,
                "bad_record",
                None,
                None,
                None,
                "bad collection key".into(),
            ),
        }
    }
    rep.collections = colls.len() as u64;
    // onode id -> (collection, object, size)
    let mut objs: HashMap<u64, (CollectionId, ObjectId, u64)> = HashMap::new();
    for e in r.open_table(T_OBJECTS)?.iter()? {
        let (k, v) = e?;
        let kb = k.value();
        let (Some(c), Some(o)) = (
            CollectionId::from_key(kb),
            kb.get(13..).and_then(ObjectId::from_sort_key),
        ) else {
            issue(
                &mut rep,
                "bad_record",
                None,
                None,
                None,
                "undecodable object key".into(),
            );
            continue;
        };
        let on: Onode = match dec("onode", v.value()) {
            Ok(on) => on,
            Err(e) => {
                issue(
                    &mut rep,
                    "bad_record",
                    Some(c),
                    Some(o),
                    None,
                    e.to_string(),
                );
                continue;
            }
        };
        if !colls.contains(&c) {
            issue(
                &mut rep,
                "no_collection",
                Some(c),
                Some(o.clone()),
                None,
                "object in a collection that does not exist".into(),
            );
        }
        rep.objects += 1;
        objs.insert(on.id, (c, o, on.size));
    }
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let total_blocks = inner.first_block + inner.usable_blocks;
    for e in r.open_table(T_EXTENTS)?.iter()? {
        let (k, v) = e?;
        let Some((id, lb)) = ext_key_parse(k.value()) else {
            issue(
                &mut rep,
                "bad_record",
                None,
                None,
                None,
                "bad extent key".into(),
            );
            continue;
        };
        let ext = match ExtentRec::decode(v.value()) {
            Ok(x) => x,
            Err(e) => {
                issue(
                    &mut rep,
                    "bad_record",
                    None,
                    None,
                    None,
                    format!("extent of onode {id}: {e}"),
                );
                continue;
            }
        };
        rep.extents += 1;
        rep.data_bytes_mapped += ext.blocks() * bs;
        let Some((c, o, size)) = objs.get(&id).cloned() else {
            issue(
                &mut rep,
                "orphan_extent",
                None,
                None,
                Some(lb * bs),
                format!("extent of missing onode {id} at data block {}", ext.pblock),
            );
            continue;
        };
        if ext.pblock < inner.first_block || ext.pblock + ext.blocks() > total_blocks {
            issue(
                &mut rep,
                "out_of_range",
                Some(c),
                Some(o.clone()),
                Some(lb * bs),
                format!(
                    "data blocks {}+{} outside the data file",
                    ext.pblock,
                    ext.blocks()
                ),
            );
            continue;
        }
        if (lb + ext.blocks()) * bs > size.div_ceil(bs) * bs {
            issue(
                &mut rep,
                "beyond_eof",
                Some(c),
                Some(o.clone()),
                Some(lb * bs),
                format!("extent extends past object size {size}"),
            );
        }
        runs.push((ext.pblock, ext.blocks()));
        if deep {
            deep_check(store, &mut rep, &c, &o, lb, &ext)?;
        }
    }
    runs.sort_unstable();
    for w in runs.windows(2) {
        if w[0].0 + w[0].1 > w[1].0 {
            issue(
                &mut rep,
                "overlap",
                None,
                None,
                None,
                format!("data block {} is mapped twice", w[1].0),
            );
        }
    }
    let mut last_orphan = None;
    for e in r.open_table(T_OMAP)?.iter()? {
        let (k, _) = e?;
        let id = k
            .value()
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes);
        if let Some(id) = id {
            if !objs.contains_key(&id) && last_orphan != Some(id) {
                last_orphan = Some(id);
                issue(
                    &mut rep,
                    "orphan_omap",
                    None,
                    None,
                    None,
                    format!("omap keys of missing onode {id}"),
                );
            }
        }
    }
    Ok(rep)
}

fn deep_check(
    store: &Store,
    rep: &mut FsckReport,
    c: &CollectionId,
    o: &ObjectId,
    lb: u64,
    ext: &ExtentRec,
) -> Result<()> {
    let inner = store.inner();
    let bs = inner.block_size;
    let mut buf = vec![0u8; (ext.blocks() * bs) as usize];
    if let Err(e) = inner.data.read_at(&mut buf, ext.pblock * bs) {
        issue(
            rep,
            "io",
            Some(*c),
            Some(o.clone()),
            Some(lb * bs),
            format!("read failed: {e}"),
        );
        return Ok(());
    }
    // Check block by block so every damaged block is listed.
    for i in 0..ext.blocks() {
        let one = ExtentRec {
            pblock: ext.pblock + i,
            crcs: vec![ext.crcs[i as usize]],
        };
        let blk = &buf[(i * bs) as usize..((i + 1) * bs) as usize];
        match verify_blocks(inner, c, o, lb + i, &one, blk) {
            Ok(()) => rep.data_bytes_verified += bs,
            Err(e @ StoreError::Checksum { .. }) => issue(
                rep,
                "checksum",
                Some(*c),
                Some(o.clone()),
                Some((lb + i) * bs),
                e.to_string(),
            ),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
