//! Object operations against the local store: resolving a client request's
//! sub-ops into replicated [`Mutation`]s (checking guards, fixing append
//! offsets), turning mutations into a store [`Transaction`], serving reads,
//! and whole-object state for recovery. Owns the store attribute naming
//! (`u.` user xattrs, `_v` version, `_h` omap header); not ordering or
//! replication (see `pg`).

use bytes::Bytes;
use cairn_ops::{
    LogOp, Mutation, ObjStat, ObjectName, ObjectState, OpError, SubOp, SubOpOutput, Version,
};
use cairn_store::{CollectionId, ObjectId, Store, StoreError, Transaction};

/// Store attribute holding the object version.
pub const ATTR_VERSION: &str = "_v";
/// Store attribute holding the omap header.
pub const ATTR_OMAP_HEADER: &str = "_h";
/// Prefix of user xattrs in the store.
pub const USER_ATTR_PREFIX: &str = "u.";
/// Most omap entries one `OmapList` returns.
pub const OMAP_LIST_MAX: u32 = 10_000;
/// Most objects one `ListObjects` returns.
pub const LIST_OBJECTS_MAX: u32 = 10_000;
/// Omap page size used when copying a whole object.
const OMAP_COPY_PAGE: usize = 4096;

pub fn store_oid(o: &ObjectName) -> ObjectId {
    ObjectId::new(o.hash(), o.name.clone()).with_namespace(o.namespace.clone())
}

pub fn map_store_err(e: StoreError) -> OpError {
    match e {
        StoreError::NoSuchObject { .. } => OpError::NoEnt,
        StoreError::ObjectExists { .. } => OpError::Exists,
        StoreError::StoreFull { .. } => OpError::NoSpace(e.to_string()),
        StoreError::ObjectTooLarge { .. } => OpError::TooBig(e.to_string()),
        StoreError::Invalid(m) => OpError::Invalid(m),
        other => OpError::Io(other.to_string()),
    }
}

pub fn encode_version(v: Version) -> Bytes {
    let mut b = Vec::with_capacity(16);
    b.extend_from_slice(&v.epoch.to_be_bytes());
    b.extend_from_slice(&v.seq.to_be_bytes());
    Bytes::from(b)
}

pub fn decode_version(b: &[u8]) -> Version {
    let part = |r: std::ops::Range<usize>| {
        b.get(r)
            .and_then(|s| <[u8; 8]>::try_from(s).ok())
            .map(u64::from_be_bytes)
            .unwrap_or(0)
    };
    Version {
        epoch: part(0..8),
        seq: part(8..16),
    }
}

/// What a request sees of its object before it runs.
struct View<'a> {
    store: &'a Store,
    coll: CollectionId,
    oid: ObjectId,
    exists: bool,
    size: u64,
    version: Version,
}

impl<'a> View<'a> {
    fn load(store: &'a Store, coll: CollectionId, oid: ObjectId) -> Result<Self, OpError> {
        let (exists, size, version) = match store.stat(&coll, &oid) {
            Ok(st) => {
                let v = store
                    .getattr(&coll, &oid, ATTR_VERSION)
                    .map_err(map_store_err)?
                    .map(|b| decode_version(&b))
                    .unwrap_or_default();
                (true, st.size, v)
            }
            Err(StoreError::NoSuchObject { .. }) => (false, 0, Version::default()),
            Err(e) => return Err(map_store_err(e)),
        };
        Ok(View {
            store,
            coll,
            oid,
            exists,
            size,
            version,
        })
    }

    fn need(&self) -> Result<(), OpError> {
        if self.exists {
            Ok(())
        } else {
            Err(OpError::NoEnt)
        }
    }

    fn getattr(&self, name: &str) -> Result<Option<Vec<u8>>, OpError> {
        if !self.exists {
            return Ok(None);
        }
        self.store
            .getattr(&self.coll, &self.oid, name)
            .map_err(map_store_err)
    }

    fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, OpError> {
        self.need()?;
        let len = if len == 0 {
            self.size.saturating_sub(offset)
        } else {
            len
        };
        self.store
            .read(&self.coll, &self.oid, offset, len)
            .map_err(map_store_err)
    }

    /// Runs one read or guard sub-op.
    fn run_read(&self, op: &SubOp) -> Result<SubOpOutput, OpError> {
        let (s, c, o) = (self.store, &self.coll, &self.oid);
        Ok(match op {
            SubOp::AssertExists => {
                self.need()?;
                SubOpOutput::None
            }
            SubOp::AssertVersion { version } => {
                if self.version != *version {
                    return Err(OpError::VersionMismatch {
                        actual: self.version,
                    });
                }
                SubOpOutput::None
            }
            SubOp::CmpXattr { name, op, value } => {
                match self.getattr(&format!("{USER_ATTR_PREFIX}{name}"))? {
                    Some(stored) if op.holds(&stored, value) => SubOpOutput::None,
                    Some(_) => return Err(OpError::Canceled),
                    None => return Err(OpError::NoData),
                }
            }
            SubOp::CmpExt { offset, expected } => {
                let mut have = if self.exists {
                    self.read(*offset, expected.len() as u64)?
                } else {
                    Vec::new()
                };
                have.resize(expected.len(), 0);
                if let Some(i) = have.iter().zip(expected.iter()).position(|(a, b)| a != b) {
                    return Err(OpError::CmpMismatch {
                        offset: offset + i as u64,
                    });
                }
                SubOpOutput::None
            }
            SubOp::Read { offset, len } => SubOpOutput::Data(self.read(*offset, *len)?.into()),
            SubOp::Stat => {
                self.need()?;
                SubOpOutput::Stat(ObjStat {
                    size: self.size,
                    version: self.version,
                })
            }
            SubOp::GetXattr { name } => {
                self.need()?;
                match self.getattr(&format!("{USER_ATTR_PREFIX}{name}"))? {
                    Some(v) => SubOpOutput::Data(v.into()),
                    None => return Err(OpError::NoData),
                }
            }
            SubOp::GetXattrs => {
                self.need()?;
                let all = s.getattrs(c, o).map_err(map_store_err)?;
                SubOpOutput::Xattrs(
                    all.into_iter()
                        .filter_map(|(k, v)| {
                            k.strip_prefix(USER_ATTR_PREFIX)
                                .map(|n| (n.to_string(), Bytes::from(v)))
                        })
                        .collect(),
                )
            }
            SubOp::OmapGetHeader => {
                self.need()?;
                SubOpOutput::Data(self.getattr(ATTR_OMAP_HEADER)?.unwrap_or_default().into())
            }
            SubOp::OmapGetVals { keys } => {
                self.need()?;
                let ks: Vec<&[u8]> = keys.iter().map(|k| k.as_ref()).collect();
                let got = s.omap_get(c, o, &ks).map_err(map_store_err)?;
                SubOpOutput::Omap {
                    entries: got.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
                    more: false,
                }
            }
            SubOp::OmapList {
                after,
                limit,
                values,
            } => {
                self.need()?;
                let limit = (*limit).clamp(1, OMAP_LIST_MAX) as usize;
                let mut got = s
                    .omap_range(c, o, after.as_deref(), limit + 1)
                    .map_err(map_store_err)?;
                let more = got.len() > limit;
                got.truncate(limit);
                SubOpOutput::Omap {
                    entries: got
                        .into_iter()
                        .map(|(k, v)| {
                            let v = if *values {
                                Bytes::from(v)
                            } else {
                                Bytes::new()
                            };
                            (Bytes::from(k), v)
                        })
                        .collect(),
                    more,
                }
            }
            other => {
                return Err(OpError::Invalid(format!(
                    "sub-op {other:?} is not a read or guard"
                )))
            }
        })
    }
}

/// The outcome of resolving a write request.
pub struct Resolved {
    /// The object's version before the request.
    pub prior: Version,
    pub mutations: Vec<Mutation>,
    pub outputs: Vec<SubOpOutput>,
    pub log_op: LogOp,
}

fn check_extent(offset: u64, len: u64, max: u64) -> Result<(), OpError> {
    match offset.checked_add(len) {
        Some(end) if end <= max => Ok(()),
        _ => Err(OpError::TooBig(format!(
            "write ending at byte {} exceeds osd_max_object_size ({max} bytes)",
            offset.saturating_add(len)
        ))),
    }
}

/// Resolves a request's sub-ops against the object's current state into the
/// mutations every replica applies, stamping `version`. Guards and reads
/// see the object as it was before the request.
pub fn resolve_write(
    store: &Store,
    coll: CollectionId,
    name: &ObjectName,
    ops: &[SubOp],
    version: Version,
) -> Result<Resolved, OpError> {
    let view = View::load(store, coll, store_oid(name))?;
    let max = store.config().max_object_size;
    let existed = view.exists;
    let (mut exists, mut size) = (view.exists, view.size);
    let mut muts = Vec::new();
    let mut outputs = Vec::with_capacity(ops.len());
    let touch = |exists: &mut bool, muts: &mut Vec<Mutation>| {
        if !*exists {
            muts.push(Mutation::Touch);
            *exists = true;
        }
    };
    for op in ops {
        match op {
            SubOp::WriteFull { data } => {
                check_extent(0, data.len() as u64, max)?;
                muts.push(Mutation::Truncate { size: 0 });
                if !data.is_empty() {
                    muts.push(Mutation::Write {
                        offset: 0,
                        data: data.clone(),
                    });
                }
                exists = true;
                size = data.len() as u64;
            }
            SubOp::Write { offset, data } => {
                check_extent(*offset, data.len() as u64, max)?;
                touch(&mut exists, &mut muts);
                if !data.is_empty() {
                    muts.push(Mutation::Write {
                        offset: *offset,
                        data: data.clone(),
                    });
                    size = size.max(offset + data.len() as u64);
                }
            }
            SubOp::Append { data } => {
                check_extent(size, data.len() as u64, max)?;
                touch(&mut exists, &mut muts);
                if !data.is_empty() {
                    muts.push(Mutation::Write {
                        offset: size,
                        data: data.clone(),
                    });
                    size += data.len() as u64;
                }
            }
            SubOp::Truncate { size: s } => {
                check_extent(*s, 0, max)?;
                muts.push(Mutation::Truncate { size: *s });
                exists = true;
                size = *s;
            }
            SubOp::Zero { offset, len } => {
                if !exists {
                    return Err(OpError::NoEnt);
                }
                if *offset < size {
                    let len = (*len).min(size - offset);
                    muts.push(Mutation::Zero {
                        offset: *offset,
                        len,
                    });
                }
            }
            SubOp::Remove => {
                if !exists {
                    return Err(OpError::NoEnt);
                }
                muts.retain(|_| false);
                if existed {
                    muts.push(Mutation::Remove);
                }
                exists = false;
                size = 0;
            }
            SubOp::Create { exclusive } => {
                if exists && *exclusive {
                    return Err(OpError::Exists);
                }
                touch(&mut exists, &mut muts);
            }
            SubOp::SetXattr { name, value } => {
                touch(&mut exists, &mut muts);
                muts.push(Mutation::SetAttr {
                    name: format!("{USER_ATTR_PREFIX}{name}"),
                    value: value.clone(),
                });
            }
            SubOp::RmXattr { name } => {
                if !exists {
                    return Err(OpError::NoEnt);
                }
                muts.push(Mutation::RmAttr {
                    name: format!("{USER_ATTR_PREFIX}{name}"),
                });
            }
            SubOp::OmapSet { entries } => {
                touch(&mut exists, &mut muts);
                muts.push(Mutation::OmapSet {
                    entries: entries.clone(),
                });
            }
            SubOp::OmapRm { keys } => {
                if !exists {
                    return Err(OpError::NoEnt);
                }
                muts.push(Mutation::OmapRm { keys: keys.clone() });
            }
            SubOp::OmapClear => {
                if !exists {
                    return Err(OpError::NoEnt);
                }
                muts.push(Mutation::OmapClear);
                muts.push(Mutation::RmAttr {
                    name: ATTR_OMAP_HEADER.into(),
                });
            }
            SubOp::OmapSetHeader { header } => {
                touch(&mut exists, &mut muts);
                muts.push(Mutation::SetAttr {
                    name: ATTR_OMAP_HEADER.into(),
                    value: header.clone(),
                });
            }
            SubOp::ListObjects { .. } => {
                return Err(OpError::Invalid(
                    "ListObjects cannot be combined with writes".into(),
                ))
            }
            read => {
                outputs.push(view.run_read(read)?);
                continue;
            }
        }
        outputs.push(SubOpOutput::None);
    }
    let log_op = if exists {
        muts.push(Mutation::SetAttr {
            name: ATTR_VERSION.into(),
            value: encode_version(version),
        });
        LogOp::Modify
    } else {
        LogOp::Delete
    };
    Ok(Resolved {
        prior: view.version,
        mutations: muts,
        outputs,
        log_op,
    })
}

/// Appends `muts` for object `name` to `txn`.
pub fn apply_mutations(
    txn: &mut Transaction,
    coll: CollectionId,
    name: &ObjectName,
    muts: &[Mutation],
) {
    let o = store_oid(name);
    for m in muts {
        match m {
            Mutation::Touch => txn.touch(coll, o.clone()),
            Mutation::Remove => txn.remove(coll, o.clone()),
            Mutation::Write { offset, data } => txn.write(coll, o.clone(), *offset, data.clone()),
            Mutation::Truncate { size } => txn.truncate(coll, o.clone(), *size),
            Mutation::Zero { offset, len } => txn.zero(coll, o.clone(), *offset, *len),
            Mutation::SetAttr { name, value } => {
                txn.setattr(coll, o.clone(), name.clone(), value.clone())
            }
            Mutation::RmAttr { name } => txn.rmattr(coll, o.clone(), name.clone()),
            Mutation::OmapSet { entries } => txn.omap_set(coll, o.clone(), entries.clone()),
            Mutation::OmapRm { keys } => txn.omap_rm(coll, o.clone(), keys.clone()),
            Mutation::OmapClear => txn.omap_clear(coll, o.clone()),
        };
    }
}

/// Serves a read-only request; returns the outputs and the object version.
pub fn execute_read(
    store: &Store,
    coll: CollectionId,
    name: &ObjectName,
    ops: &[SubOp],
) -> Result<(Vec<SubOpOutput>, Version), OpError> {
    let view = View::load(store, coll, store_oid(name))?;
    let mut out = Vec::with_capacity(ops.len());
    for op in ops {
        out.push(view.run_read(op)?);
    }
    Ok((out, view.version))
}

/// A page of a PG listing: (hash, name) pairs and the resume point.
pub type ListPage = (Vec<(u32, ObjectName)>, Option<cairn_ops::ListCursor>);

/// Lists up to `limit` objects of a PG strictly after `after`.
pub fn list_objects(
    store: &Store,
    coll: CollectionId,
    after: Option<&cairn_ops::ListCursor>,
    limit: u32,
) -> Result<ListPage, OpError> {
    let limit = limit.clamp(1, LIST_OBJECTS_MAX) as usize;
    let start = match after {
        Some(c) => cairn_store::ListStart::After(
            ObjectId::new(c.hash, c.name.clone()).with_namespace(c.namespace.clone()),
        ),
        None => cairn_store::ListStart::Beginning,
    };
    let mut got = store
        .list_objects(&coll, &start, limit + 1)
        .map_err(map_store_err)?;
    let more = got.len() > limit;
    got.truncate(limit);
    let next = if more {
        got.last().map(|o| cairn_ops::ListCursor {
            hash: o.hash,
            namespace: o.namespace.clone(),
            name: o.name.clone(),
        })
    } else {
        None
    };
    Ok((
        got.into_iter()
            // EC rollback stashes are internal objects.
            .filter(|o| !crate::ec_exec::is_internal_ns(&o.namespace))
            .map(|o| (o.hash, ObjectName::new(o.namespace, o.name)))
            .collect(),
        next,
    ))
}

/// Everything `name` holds, or None if it does not exist.
pub fn get_object_state(
    store: &Store,
    coll: CollectionId,
    name: &ObjectName,
) -> Result<Option<ObjectState>, StoreError> {
    let o = store_oid(name);
    let st = match store.stat(&coll, &o) {
        Ok(st) => st,
        Err(StoreError::NoSuchObject { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let data = store.read(&coll, &o, 0, st.size)?;
    let attrs = store
        .getattrs(&coll, &o)?
        .into_iter()
        .map(|(k, v)| (k, Bytes::from(v)))
        .collect();
    let mut omap = Vec::new();
    loop {
        let after = omap.last().map(|(k, _): &(Bytes, Bytes)| k.clone());
        let page = store.omap_range(&coll, &o, after.as_deref(), OMAP_COPY_PAGE)?;
        let n = page.len();
        omap.extend(
            page.into_iter()
                .map(|(k, v)| (Bytes::from(k), Bytes::from(v))),
        );
        if n < OMAP_COPY_PAGE {
            break;
        }
    }
    Ok(Some(ObjectState {
        data: data.into(),
        attrs,
        omap,
    }))
}

/// Appends to `txn` what makes `name` hold exactly `state` (or not exist).
/// `exists_now` says whether it exists in the store before `txn`.
pub fn put_object_state(
    txn: &mut Transaction,
    coll: CollectionId,
    name: &ObjectName,
    exists_now: bool,
    state: Option<&ObjectState>,
) {
    let o = store_oid(name);
    if exists_now {
        txn.remove(coll, o.clone());
    }
    let Some(st) = state else { return };
    txn.touch(coll, o.clone());
    if !st.data.is_empty() {
        txn.write(coll, o.clone(), 0, st.data.clone());
    }
    if !st.attrs.is_empty() {
        txn.push(cairn_store::Op::SetAttrs {
            coll,
            obj: o.clone(),
            attrs: st.attrs.clone(),
        });
    }
    if !st.omap.is_empty() {
        txn.omap_set(coll, o, st.omap.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_object_state_replaces_an_existing_object() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = cairn_store::StoreConfig::new(dir.path());
        cfg.data_bytes = 64 << 20;
        cfg.meta_reserve_bytes = 1 << 20;
        let store = Store::create(cfg).unwrap();
        let coll = CollectionId::pg(1, 0);
        let name = ObjectName::new("", "o");
        let mut t = Transaction::new();
        t.create_collection(coll);
        put_object_state(
            &mut t,
            coll,
            &name,
            false,
            Some(&ObjectState {
                data: Bytes::from(vec![1u8; 40960]),
                attrs: vec![("_v".into(), encode_version(Version { epoch: 1, seq: 1 }))],
                omap: vec![],
            }),
        );
        store.commit(t).unwrap();
        let new = ObjectState {
            data: Bytes::from(vec![2u8; 32768]),
            attrs: vec![("_v".into(), encode_version(Version { epoch: 2, seq: 5 }))],
            omap: vec![(Bytes::from_static(b"k"), Bytes::from_static(b"v"))],
        };
        let mut t = Transaction::new();
        put_object_state(&mut t, coll, &name, true, Some(&new));
        store.commit(t).unwrap();
        assert_eq!(get_object_state(&store, coll, &name).unwrap(), Some(new));
    }
}
