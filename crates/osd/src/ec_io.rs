//! The network side of erasure-coded PGs on the primary: reading chunk
//! ranges from the shards (its own from the store, the others with
//! `EcRead` calls, in parallel), client reads (direct from data chunks, or
//! decoded from any k when a shard is down or fails its checksum), and the
//! old-data reads of a read-modify-write. Decisions about what to read come
//! from `cairn-ec`; metadata and shard mutations from `ec_exec`.

use crate::ec_exec::{self, load_meta, run_meta_op, EcWritePlan, ShardMeta};
use crate::ec_pool::{EcPg, SHARD_HOLE};
use crate::exec;
use crate::runtime::{blocking_store_call, Shared};
use bytes::Bytes;
use cairn_ec::{ChunkRead, ShardWrite};
use cairn_ops::{
    decode_shared, encode, msg_type, EcRead, EcReadFail, EcReadReply, ObjectName, OpError, OpReply,
    OpRequest, OpStatus, SubOp, SubOpOutput, Version, SNAP_HEAD,
};
use cairn_store::CollectionId;
use cairn_types::{Epoch, PgId};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Per shard write, the crc32c of each 4 KiB block of its data, if known.
pub type ShardCrcs = Vec<Option<Arc<[u32]>>>;

/// The encode totals are logged (info) every this many calls.
const ENCODE_REPORT_EVERY_CALLS: u64 = 100;
static ENCODE_CALLS: AtomicU64 = AtomicU64::new(0);
static ENCODE_NANOS: AtomicU64 = AtomicU64::new(0);
static ENCODE_BYTES: AtomicU64 = AtomicU64::new(0);

/// Time this process spent building EC shard writes (encoding parity,
/// splitting data, re-encoding stripes of read-modify-writes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EcEncodeTotals {
    pub calls: u64,
    pub nanos: u64,
    /// Logical bytes written by those calls.
    pub bytes: u64,
}

/// Totals since the process started (all OSDs in it).
pub fn ec_encode_totals() -> EcEncodeTotals {
    EcEncodeTotals {
        calls: ENCODE_CALLS.load(Ordering::Relaxed),
        nanos: ENCODE_NANOS.load(Ordering::Relaxed),
        bytes: ENCODE_BYTES.load(Ordering::Relaxed),
    }
}

/// Attempts at a read whose shards fail or disagree, at most.
const READ_ATTEMPTS: usize = 8;
/// Pause between attempts when shards disagree on the object version.
const READ_RETRY_PAUSE: Duration = Duration::from_millis(25);

/// Why a client read failed.
#[derive(Debug)]
enum ReadErr {
    Op(OpError),
    /// Fewer than k shards of the acting set answered consistently (down
    /// or partitioned before the map says so, or mid-write): the client
    /// is told to retry after a map change, as for a PG that is not
    /// active, rather than given an I/O error.
    Unreachable(String),
}

impl From<OpError> for ReadErr {
    fn from(e: OpError) -> Self {
        ReadErr::Op(e)
    }
}

/// Where the primary's EC reads go.
#[derive(Clone)]
pub(crate) struct EcTarget {
    pub shared: Arc<Shared>,
    pub pgid: PgId,
    pub coll: CollectionId,
    pub ec: EcPg,
    pub epoch: Epoch,
}

/// A chunk range read from one shard: the object version there and bytes.
type ShardResult = Result<(Version, Bytes), EcReadFail>;

impl EcTarget {
    fn me(&self) -> i32 {
        self.shared.cfg.id
    }

    /// Reads `reads` of the head (`snap` = [`SNAP_HEAD`]) or of clone
    /// `snap` (grouped into one call per shard, all shards at once).
    /// Results are in the order of `reads`.
    pub async fn read_ranges(
        &self,
        oid: &ObjectName,
        snap: u64,
        reads: &[ChunkRead],
    ) -> Vec<ShardResult> {
        let mut per_shard: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, r) in reads.iter().enumerate() {
            per_shard.entry(r.shard).or_default().push(i);
        }
        let mut out: Vec<ShardResult> = (0..reads.len())
            .map(|_| Err(EcReadFail::Other("not read".into())))
            .collect();
        let mut set = tokio::task::JoinSet::new();
        for (shard, idxs) in per_shard {
            let req = EcRead {
                pgid: self.pgid,
                shard: shard as u8,
                from: self.me(),
                epoch: self.epoch,
                oid: oid.clone(),
                ranges: idxs
                    .iter()
                    .map(|&i| (reads[i].range.start, reads[i].len()))
                    .collect(),
                with_attrs: false,
                snap,
            };
            let osd = self.ec.shards.get(shard).copied().unwrap_or(SHARD_HOLE);
            let shared = self.shared.clone();
            set.spawn(async move { (idxs, call_read(&shared, osd, &req).await) });
        }
        while let Some(j) = set.join_next().await {
            let Ok((idxs, reply)) = j else { continue };
            for (n, i) in idxs.into_iter().enumerate() {
                out[i] = match &reply {
                    Ok(d) => Ok((d.version, d.data.get(n).cloned().unwrap_or_default())),
                    Err(e) => Err(e.clone()),
                };
            }
        }
        out
    }

    /// Shards that are up in the acting set and have not failed this read.
    fn usable_shards(&self, failed: &[bool]) -> Vec<bool> {
        self.ec
            .available()
            .iter()
            .zip(failed)
            .map(|(a, f)| *a && !f)
            .collect()
    }

    /// Reads `[offset, offset+len)` of an object (its head or the clone
    /// `meta` describes) whose metadata (on this primary's shard) is
    /// `meta`: directly from the data chunks when they
    /// are there, else decoded from any k; shards that fail (down, bad
    /// checksum, another version) are dropped and the read is replanned.
    async fn read_extent(
        &self,
        oid: &ObjectName,
        meta: &ShardMeta,
        offset: u64,
        len: u64,
    ) -> Result<Bytes, ReadErr> {
        let mut failed = vec![false; self.ec.code.total()];
        let mut last = String::new();
        for attempt in 0..READ_ATTEMPTS {
            let available = self.usable_shards(&failed);
            let plan = match self.ec.code.plan_read(meta.size, offset, len, &available) {
                Ok(p) => p,
                // Shards of the acting set failed this read: they may be
                // mid-write or just unreachable; try them all again.
                Err(e) if failed.iter().any(|&f| f) => {
                    last = format!("{e}; last shard failure: {last}");
                    tokio::time::sleep(READ_RETRY_PAUSE).await;
                    failed.iter_mut().for_each(|f| *f = false);
                    continue;
                }
                Err(e) => {
                    return Err(ReadErr::Op(OpError::Io(format!(
                        "object {oid}: {e}; last shard failure: {last}"
                    ))))
                }
            };
            if plan.reads().is_empty() {
                return Ok(Bytes::new());
            }
            let got = self.read_ranges(oid, meta.snap, plan.reads()).await;
            let mut bytes = Vec::with_capacity(got.len());
            let mut retry = false;
            for (r, res) in plan.reads().iter().zip(got) {
                match res {
                    Ok((v, b)) if v == meta.version => bytes.push(b),
                    Ok((v, _)) => {
                        last = format!(
                            "shard {} has version {v}, expected {}",
                            r.shard, meta.version
                        );
                        failed[r.shard] = true;
                        retry = true;
                    }
                    Err(e) => {
                        if let EcReadFail::Checksum(m) = &e {
                            tracing::warn!(
                                "pg {} shard {}: object {oid}: {m}; serving a degraded read (recovery rebuilds the chunk)",
                                self.pgid,
                                r.shard
                            );
                        }
                        last = format!("shard {}: {e:?}", r.shard);
                        failed[r.shard] = true;
                        retry = true;
                    }
                }
            }
            if !retry {
                return self
                    .ec
                    .code
                    .assemble_read(&plan, &bytes)
                    .map_err(|e| ReadErr::Op(OpError::Io(format!("object {oid}: {e}"))));
            }
            if attempt + 1 >= READ_ATTEMPTS / 2 {
                // Shards may simply be mid-write: start over with all of them.
                tokio::time::sleep(READ_RETRY_PAUSE).await;
                failed.iter_mut().for_each(|f| *f = false);
            }
        }
        Err(ReadErr::Unreachable(format!(
            "object {oid}: could not read enough consistent chunks after {READ_ATTEMPTS} attempts: {last}"
        )))
    }

    /// Serves a client read on an EC PG (run outside the PG actor).
    pub async fn client_read(&self, req: &OpRequest) -> OpReply {
        let (status, version) = match self.client_read_inner(req).await {
            Ok((out, v)) => (OpStatus::Done(Ok(out)), v),
            Err(ReadErr::Op(e)) => (OpStatus::Done(Err(e)), Version::default()),
            Err(ReadErr::Unreachable(why)) => (
                OpStatus::NotActive {
                    state: format!("degraded: {why}"),
                },
                Version::default(),
            ),
        };
        OpReply {
            reqid: req.reqid.clone(),
            status,
            version,
            epoch: self.epoch,
        }
    }

    async fn client_read_inner(
        &self,
        req: &OpRequest,
    ) -> Result<(Vec<SubOpOutput>, Version), ReadErr> {
        let store = &self.shared.store;
        if let [SubOp::ListObjects { after, limit }] = req.ops.as_slice() {
            let (objs, next) = exec::list_client_objects(store, self.coll, after.as_ref(), *limit)?;
            return Ok((
                vec![SubOpOutput::Objects {
                    objects: objs.into_iter().map(|(_, n)| n).collect(),
                    next,
                }],
                Version::default(),
            ));
        }
        let meta = ec_exec::load_meta_at(store, self.coll, &req.oid, req.snap)?;
        let mut out = Vec::with_capacity(req.ops.len());
        for op in &req.ops {
            if let Some(r) = run_meta_op(store, self.coll, &self.ec, &req.oid, &meta, op) {
                out.push(r?);
                continue;
            }
            if !meta.exists {
                return Err(OpError::NoEnt.into());
            }
            match op {
                SubOp::Read { offset, len } => {
                    let len = if *len == 0 {
                        meta.size.saturating_sub(*offset)
                    } else {
                        *len
                    };
                    out.push(SubOpOutput::Data(
                        self.read_extent(&req.oid, &meta, *offset, len).await?,
                    ));
                }
                SubOp::CmpExt { offset, expected } => {
                    let have = self
                        .read_extent(&req.oid, &meta, *offset, expected.len() as u64)
                        .await?;
                    let mut have = have.to_vec();
                    have.resize(expected.len(), 0);
                    if let Some(i) = have.iter().zip(expected.iter()).position(|(a, b)| a != b) {
                        return Err(OpError::CmpMismatch {
                            offset: offset + i as u64,
                        }
                        .into());
                    }
                    out.push(SubOpOutput::None);
                }
                other => {
                    return Err(OpError::Invalid(format!("sub-op {other:?} is not a read")).into())
                }
            }
        }
        Ok((out, meta.version))
    }

    /// Resolves a client write: the plan, and (for a data change) the
    /// `k + m` shard writes, after reading the old stripes it needs, with
    /// the 4 KiB block crcs of each shard write's data when the encoder
    /// made them. `blocks`: the verified block crcs of the request's
    /// message, so data chunks are not checksummed again.
    pub async fn prepare_write(
        &self,
        req: &OpRequest,
        blocks: Option<&cairn_msg::BlockCrcs>,
    ) -> Result<(EcWritePlan, Vec<ShardWrite>, ShardCrcs), OpError> {
        ec_exec::refuse_snapshot_write(req)?;
        let plan = ec_exec::plan_ops(
            &self.shared.store,
            self.coll,
            &self.ec,
            &req.oid,
            &req.ops,
            req.snapc.as_ref(),
        )?;
        let Some((wp, data)) = plan.data_plan() else {
            return Ok((plan, Vec::new(), Vec::new()));
        };
        let old = if wp.reads().is_empty() {
            Vec::new()
        } else {
            let meta = load_meta(&self.shared.store, self.coll, &req.oid)?;
            self.read_old(&req.oid, meta.version, wp.reads()).await?
        };
        let t0 = std::time::Instant::now();
        let (writes, crcs) = wp
            .build_with_crcs(data, &old, blocks.and_then(|b| b.of(data)))
            .map_err(|e| OpError::Invalid(format!("object {}: {e}", req.oid)))?;
        let calls = ENCODE_CALLS.fetch_add(1, Ordering::Relaxed) + 1;
        ENCODE_NANOS.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        ENCODE_BYTES.fetch_add(data.len() as u64, Ordering::Relaxed);
        if calls.is_multiple_of(ENCODE_REPORT_EVERY_CALLS) {
            let t = ec_encode_totals();
            tracing::info!(
                "ec encode totals: {} calls, {} MB in {:.3} s of CPU",
                t.calls,
                t.bytes / 1_000_000,
                t.nanos as f64 / 1e9
            );
        }
        let crcs = crcs.into_iter().map(|c| c.map(Arc::from)).collect();
        Ok((plan, writes, crcs))
    }

    /// The old data-chunk ranges a read-modify-write needs, decoding those
    /// on missing shards from k others.
    async fn read_old(
        &self,
        oid: &ObjectName,
        version: Version,
        wanted: &[ChunkRead],
    ) -> Result<Vec<Bytes>, OpError> {
        let mut failed = vec![false; self.ec.code.total()];
        let mut last = String::new();
        for _ in 0..READ_ATTEMPTS {
            let available = self.usable_shards(&failed);
            let plan = self
                .ec
                .code
                .plan_range_reads(wanted, &available)
                .map_err(|e| OpError::Io(format!("object {oid}: {e}; {last}")))?;
            let got = self.read_ranges(oid, SNAP_HEAD, plan.reads()).await;
            let mut bytes = Vec::with_capacity(got.len());
            let mut retry = false;
            for (r, res) in plan.reads().iter().zip(got) {
                match res {
                    Ok((v, b)) if v == version => bytes.push(b),
                    other => {
                        last = format!("shard {}: {other:?}", r.shard);
                        failed[r.shard] = true;
                        retry = true;
                    }
                }
            }
            if !retry {
                return plan
                    .assemble(&self.ec.code, &bytes)
                    .map_err(|e| OpError::Io(format!("object {oid}: {e}")));
            }
        }
        Err(OpError::Io(format!(
            "object {oid}: could not read the old stripes: {last}"
        )))
    }
}

/// One `EcRead` to `osd` (this OSD's own shard is read from the store).
pub(crate) async fn call_read(
    shared: &Arc<Shared>,
    osd: i32,
    req: &EcRead,
) -> Result<cairn_ops::EcChunkData, EcReadFail> {
    if osd == SHARD_HOLE {
        return Err(EcReadFail::Other(format!("shard {} has no OSD", req.shard)));
    }
    if osd == shared.cfg.id {
        // This shard's own chunk: a store read that may block on the disk.
        return blocking_store_call(|| ec_exec::serve_read(&shared.store, req)).result;
    }
    let (_, conn) = shared
        .peer(osd)
        .await
        .map_err(|e| EcReadFail::Other(format!("osd.{osd}: {e}")))?;
    let m = conn
        .call(msg_type::EC_READ, encode(req), shared.cfg.peer_timeout)
        .await
        .map_err(|e| EcReadFail::Other(format!("osd.{osd}: {e}")))?;
    let r: EcReadReply = decode_shared("ec read reply", &m.payload)
        .map_err(|e| EcReadFail::Other(format!("osd.{osd}: {e}")))?;
    r.result
}
