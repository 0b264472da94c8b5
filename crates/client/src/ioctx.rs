//! One pool: every object op, compound ops with guards (compare-and-write),
//! and paginated pool listing that is stable across PGs.

use crate::{ClientError, Rados, SnapArgs, Target};
use bytes::Bytes;
use cairn_ops::{
    CmpOp, ListCursor, ObjStat, ObjectName, OpStatus, SnapContext, SubOp, SubOpOutput, Version,
    SNAP_HEAD,
};
use std::sync::Arc;

/// What a successful op returned: one output per sub-op (empty when the
/// OSD answered a resend from its log) and the object version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpResult {
    pub outputs: Vec<SubOpOutput>,
    pub version: Version,
}

/// Where a pool listing resumes: the PG seed and the position inside it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolCursor {
    pub seed: u32,
    pub after: Option<ListCursor>,
}

/// An I/O context on one pool (and namespace).
#[derive(Clone)]
pub struct IoCtx {
    rados: Rados,
    pool: u64,
    pool_name: String,
    namespace: String,
    snap: SnapArgs,
}

fn b(v: impl Into<Bytes>) -> Bytes {
    v.into()
}

impl IoCtx {
    pub(crate) fn new(rados: Rados, pool: u64, pool_name: String) -> IoCtx {
        IoCtx {
            rados,
            pool,
            pool_name,
            namespace: String::new(),
            snap: SnapArgs::default(),
        }
    }

    /// The same context, writing with snapshot context `snapc` (Ceph's
    /// self-managed snapshots): the first write to an object after a
    /// snapshot newer than its last write preserves its old content for
    /// the snapshots in `snapc.snaps` (newest first, all ≤ `snapc.seq`),
    /// and clones whose snapshots have all been dropped from the context
    /// are trimmed. Ids come from the monitors (`PoolSnapAllocate`).
    ///
    /// ```no_run
    /// # async fn demo(io: cairn_client::IoCtx) -> Result<(), cairn_client::ClientError> {
    /// use cairn_ops::SnapContext;
    /// io.write_full("disk.0", b"before".to_vec()).await?;
    /// // Snapshot 7 was allocated by the monitors; later writes carry it.
    /// let io = io.with_snap_context(SnapContext { seq: 7, snaps: vec![7] });
    /// io.write_full("disk.0", b"after".to_vec()).await?;
    /// assert_eq!(io.at_snap(7).read("disk.0", 0, 0).await?, b"before");
    /// assert_eq!(io.read("disk.0", 0, 0).await?, b"after");
    /// # Ok(()) }
    /// ```
    pub fn with_snap_context(&self, snapc: SnapContext) -> IoCtx {
        IoCtx {
            snap: SnapArgs {
                snapc: Some(Arc::new(snapc)),
                read_at: self.snap.read_at,
            },
            ..self.clone()
        }
    }

    /// The same context, reading at snapshot `snap` (read-only: writes are
    /// refused by the OSD). [`SNAP_HEAD`] reads the live objects.
    pub fn at_snap(&self, snap: u64) -> IoCtx {
        IoCtx {
            snap: SnapArgs {
                snapc: self.snap.snapc.clone(),
                read_at: snap,
            },
            ..self.clone()
        }
    }

    /// The snapshot reads go to ([`SNAP_HEAD`] = live objects).
    pub fn read_snap(&self) -> u64 {
        self.snap.read_at
    }

    /// Applies the context's snapshot context to `oid` without changing
    /// its data: clones no snapshot needs any more are removed.
    pub async fn snap_trim(&self, oid: &str) -> Result<(), ClientError> {
        if self.snap.read_at != SNAP_HEAD {
            return Err(ClientError::Protocol(
                "snap_trim on a snapshot context".into(),
            ));
        }
        self.operate(oid, vec![SubOp::SnapTrim]).await.map(|_| ())
    }

    /// The same pool, objects in namespace `ns`.
    pub fn with_namespace(&self, ns: &str) -> IoCtx {
        IoCtx {
            namespace: ns.to_string(),
            ..self.clone()
        }
    }

    pub fn pool_id(&self) -> u64 {
        self.pool
    }

    pub fn pool_name(&self) -> &str {
        &self.pool_name
    }

    /// Runs sub-ops on `oid` as one atomic request.
    pub async fn operate(&self, oid: &str, ops: Vec<SubOp>) -> Result<OpResult, ClientError> {
        let name = ObjectName::new(self.namespace.clone(), oid);
        let reply = self
            .rados
            .submit(self.pool, Target::Hash(name.hash()), name, ops, &self.snap)
            .await?;
        match reply.status {
            OpStatus::Done(Ok(outputs)) => Ok(OpResult {
                outputs,
                version: reply.version,
            }),
            OpStatus::Done(Err(error)) => Err(ClientError::Op {
                object: oid.to_string(),
                error,
            }),
            other => Err(ClientError::Protocol(format!(
                "unexpected final status {other:?}"
            ))),
        }
    }

    async fn one(&self, oid: &str, op: SubOp) -> Result<(SubOpOutput, Version), ClientError> {
        let r = self.operate(oid, vec![op]).await?;
        Ok((
            r.outputs.into_iter().next().unwrap_or(SubOpOutput::None),
            r.version,
        ))
    }

    async fn write_op(&self, oid: &str, op: SubOp) -> Result<Version, ClientError> {
        Ok(self.one(oid, op).await?.1)
    }

    pub async fn write_full(
        &self,
        oid: &str,
        data: impl Into<Bytes>,
    ) -> Result<Version, ClientError> {
        self.write_op(oid, SubOp::WriteFull { data: data.into() })
            .await
    }

    pub async fn write(
        &self,
        oid: &str,
        offset: u64,
        data: impl Into<Bytes>,
    ) -> Result<Version, ClientError> {
        self.write_op(
            oid,
            SubOp::Write {
                offset,
                data: data.into(),
            },
        )
        .await
    }

    pub async fn append(&self, oid: &str, data: impl Into<Bytes>) -> Result<Version, ClientError> {
        self.write_op(oid, SubOp::Append { data: data.into() })
            .await
    }

    pub async fn truncate(&self, oid: &str, size: u64) -> Result<Version, ClientError> {
        self.write_op(oid, SubOp::Truncate { size }).await
    }

    pub async fn zero(&self, oid: &str, offset: u64, len: u64) -> Result<Version, ClientError> {
        self.write_op(oid, SubOp::Zero { offset, len }).await
    }

    pub async fn remove(&self, oid: &str) -> Result<Version, ClientError> {
        self.write_op(oid, SubOp::Remove).await
    }

    /// Creates `oid`; with `exclusive` it fails with `Exists` if it exists.
    pub async fn create(&self, oid: &str, exclusive: bool) -> Result<Version, ClientError> {
        self.write_op(oid, SubOp::Create { exclusive }).await
    }

    /// Reads `len` bytes at `offset` (`len` 0 = to the end).
    pub async fn read(&self, oid: &str, offset: u64, len: u64) -> Result<Vec<u8>, ClientError> {
        Ok(self.read_bytes(oid, offset, len).await?.to_vec())
    }

    /// [`IoCtx::read`] without the copy into a `Vec`: the bytes as they
    /// arrived from the OSD (block images hand them straight to NBD).
    pub async fn read_bytes(&self, oid: &str, offset: u64, len: u64) -> Result<Bytes, ClientError> {
        match self.one(oid, SubOp::Read { offset, len }).await?.0 {
            SubOpOutput::Data(d) => Ok(d),
            o => Err(ClientError::Protocol(format!("read answered with {o:?}"))),
        }
    }

    pub async fn stat(&self, oid: &str) -> Result<ObjStat, ClientError> {
        match self.one(oid, SubOp::Stat).await?.0 {
            SubOpOutput::Stat(s) => Ok(s),
            o => Err(ClientError::Protocol(format!("stat answered with {o:?}"))),
        }
    }

    pub async fn set_xattr(
        &self,
        oid: &str,
        name: &str,
        value: impl Into<Bytes>,
    ) -> Result<Version, ClientError> {
        self.write_op(
            oid,
            SubOp::SetXattr {
                name: name.into(),
                value: value.into(),
            },
        )
        .await
    }

    pub async fn rm_xattr(&self, oid: &str, name: &str) -> Result<Version, ClientError> {
        self.write_op(oid, SubOp::RmXattr { name: name.into() })
            .await
    }

    pub async fn get_xattr(&self, oid: &str, name: &str) -> Result<Vec<u8>, ClientError> {
        match self
            .one(oid, SubOp::GetXattr { name: name.into() })
            .await?
            .0
        {
            SubOpOutput::Data(d) => Ok(d.to_vec()),
            o => Err(ClientError::Protocol(format!(
                "getxattr answered with {o:?}"
            ))),
        }
    }

    pub async fn list_xattrs(&self, oid: &str) -> Result<Vec<(String, Vec<u8>)>, ClientError> {
        match self.one(oid, SubOp::GetXattrs).await?.0 {
            SubOpOutput::Xattrs(v) => Ok(v.into_iter().map(|(k, v)| (k, v.to_vec())).collect()),
            o => Err(ClientError::Protocol(format!(
                "getxattrs answered with {o:?}"
            ))),
        }
    }

    pub async fn omap_set(
        &self,
        oid: &str,
        entries: Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Result<Version, ClientError> {
        let entries = entries.into_iter().map(|(k, v)| (b(k), b(v))).collect();
        self.write_op(oid, SubOp::OmapSet { entries }).await
    }

    pub async fn omap_rm_keys(
        &self,
        oid: &str,
        keys: Vec<Vec<u8>>,
    ) -> Result<Version, ClientError> {
        let keys = keys.into_iter().map(b).collect();
        self.write_op(oid, SubOp::OmapRm { keys }).await
    }

    pub async fn omap_clear(&self, oid: &str) -> Result<Version, ClientError> {
        self.write_op(oid, SubOp::OmapClear).await
    }

    pub async fn omap_set_header(
        &self,
        oid: &str,
        header: impl Into<Bytes>,
    ) -> Result<Version, ClientError> {
        self.write_op(
            oid,
            SubOp::OmapSetHeader {
                header: header.into(),
            },
        )
        .await
    }

    pub async fn omap_get_header(&self, oid: &str) -> Result<Vec<u8>, ClientError> {
        match self.one(oid, SubOp::OmapGetHeader).await?.0 {
            SubOpOutput::Data(d) => Ok(d.to_vec()),
            o => Err(ClientError::Protocol(format!(
                "omap header answered with {o:?}"
            ))),
        }
    }

    pub async fn omap_get_vals_by_keys(
        &self,
        oid: &str,
        keys: Vec<Vec<u8>>,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, ClientError> {
        let keys = keys.into_iter().map(b).collect();
        match self.one(oid, SubOp::OmapGetVals { keys }).await?.0 {
            SubOpOutput::Omap { entries, .. } => Ok(entries
                .into_iter()
                .map(|(k, v)| (k.to_vec(), v.to_vec()))
                .collect()),
            o => Err(ClientError::Protocol(format!(
                "omap get answered with {o:?}"
            ))),
        }
    }

    /// Up to `limit` entries strictly after `after`, in key order, and whether more follow.
    pub async fn omap_list(
        &self,
        oid: &str,
        after: Option<&[u8]>,
        limit: u32,
    ) -> Result<(Vec<(Vec<u8>, Vec<u8>)>, bool), ClientError> {
        let op = SubOp::OmapList {
            after: after.map(Bytes::copy_from_slice),
            limit,
            values: true,
        };
        match self.one(oid, op).await?.0 {
            SubOpOutput::Omap { entries, more } => Ok((
                entries
                    .into_iter()
                    .map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .collect(),
                more,
            )),
            o => Err(ClientError::Protocol(format!(
                "omap list answered with {o:?}"
            ))),
        }
    }

    /// Writes `data` at `offset` only if the object is at `version`.
    pub async fn write_if_version(
        &self,
        oid: &str,
        version: Version,
        offset: u64,
        data: impl Into<Bytes>,
    ) -> Result<Version, ClientError> {
        let ops = vec![
            SubOp::AssertVersion { version },
            SubOp::Write {
                offset,
                data: data.into(),
            },
        ];
        Ok(self.operate(oid, ops).await?.version)
    }

    /// Compare-and-write: writes `data` at `offset` only if the bytes there equal `expected`.
    pub async fn compare_and_write(
        &self,
        oid: &str,
        offset: u64,
        expected: impl Into<Bytes>,
        data: impl Into<Bytes>,
    ) -> Result<Version, ClientError> {
        let ops = vec![
            SubOp::CmpExt {
                offset,
                expected: expected.into(),
            },
            SubOp::Write {
                offset,
                data: data.into(),
            },
        ];
        Ok(self.operate(oid, ops).await?.version)
    }

    /// Sets xattr `name` to `value` only if `stored OP cmp_value` holds.
    pub async fn set_xattr_if(
        &self,
        oid: &str,
        name: &str,
        op: CmpOp,
        cmp_value: impl Into<Bytes>,
        value: impl Into<Bytes>,
    ) -> Result<Version, ClientError> {
        let ops = vec![
            SubOp::CmpXattr {
                name: name.into(),
                op,
                value: cmp_value.into(),
            },
            SubOp::SetXattr {
                name: name.into(),
                value: value.into(),
            },
        ];
        Ok(self.operate(oid, ops).await?.version)
    }

    /// Up to `limit` object names from `cursor` on (PG by PG, each in hash
    /// order), and the cursor to resume from (None = done). Stable while
    /// the pool's pg_num does not change.
    pub async fn list_objects(
        &self,
        cursor: &PoolCursor,
        limit: u32,
    ) -> Result<(Vec<ObjectName>, Option<PoolCursor>), ClientError> {
        let pg_num = self
            .rados
            .map()
            .pools
            .get(&self.pool)
            .map(|p| p.pg_num)
            .ok_or_else(|| ClientError::NoSuchPool(self.pool_name.clone()))?;
        let mut out = Vec::new();
        let mut cur = cursor.clone();
        while cur.seed < pg_num && (out.len() as u32) < limit {
            let want = limit - out.len() as u32;
            let reply = self
                .rados
                .submit(
                    self.pool,
                    Target::Seed(cur.seed),
                    ObjectName::new("", ""),
                    vec![SubOp::ListObjects {
                        after: cur.after.clone(),
                        limit: want,
                    }],
                    &SnapArgs::default(),
                )
                .await?;
            let (objects, next) = match reply.status {
                OpStatus::Done(Ok(mut v)) => match v.pop() {
                    Some(SubOpOutput::Objects { objects, next }) => (objects, next),
                    o => {
                        return Err(ClientError::Protocol(format!(
                            "listing answered with {o:?}"
                        )))
                    }
                },
                OpStatus::Done(Err(error)) => {
                    return Err(ClientError::Op {
                        object: format!("pg {}.{:x}", self.pool, cur.seed),
                        error,
                    })
                }
                other => {
                    return Err(ClientError::Protocol(format!(
                        "unexpected final status {other:?}"
                    )))
                }
            };
            out.extend(
                objects
                    .into_iter()
                    .filter(|o| o.namespace == self.namespace),
            );
            match next {
                Some(c) => cur.after = Some(c),
                None => {
                    cur.seed += 1;
                    cur.after = None;
                }
            }
        }
        let next = (cur.seed < pg_num).then_some(cur);
        Ok((out, next))
    }

    /// Every object name in the pool (namespace of this context).
    pub async fn list_all(&self) -> Result<Vec<ObjectName>, ClientError> {
        let mut all = Vec::new();
        let mut cur = PoolCursor::default();
        loop {
            let (objs, next) = self.list_objects(&cur, 1000).await?;
            all.extend(objs);
            match next {
                Some(c) => cur = c,
                None => return Ok(all),
            }
        }
    }
}
