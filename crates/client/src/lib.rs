//! cairn-client: the object client (librados-like). A [`Rados`] handle
//! follows the cluster map (a watch channel of `Arc<ClusterMap>`, fed by
//! the monitor client's subscription or by tests), computes placement
//! itself (object -> PG -> primary, no lookup service), sends ops to the
//! primary, and retries on map changes, wrong-primary answers and broken
//! connections — a resend carries the same request id, so the OSD applies
//! it once. Every op has a deadline; a timeout names the PG and the OSD it
//! waited on. [`IoCtx`] is one pool; [`Striper`] spreads large data over
//! many objects.
//!
//! A handle is one client *instance*: its entity name plus the random
//! nonce it picks at start ([`Rados::instance`]; every request id carries
//! it). Once the instance is blocklisted (the map lists it, or an OSD
//! refused an op as blocklisted) the handle is fenced for good: every
//! later op fails at once with [`cairn_ops::OpError::Blocklisted`], even
//! after the entry expires — a new handle (a new nonce) is needed.
//!
//! ```no_run
//! # async fn demo(map: tokio::sync::watch::Receiver<std::sync::Arc<cairn_map::ClusterMap>>,
//! #               creds: cairn_msg::Credentials) -> Result<(), cairn_client::ClientError> {
//! use cairn_client::{ClientConfig, Rados};
//! let rados = Rados::new(ClientConfig::new(creds), map);
//! let io = rados.ioctx("rbd")?;
//! io.write_full("greeting", b"hello".to_vec()).await?;
//! assert_eq!(io.read("greeting", 0, 0).await?, b"hello");
//! io.omap_set("index", vec![(b"k".to_vec(), b"v".to_vec())]).await?;
//! let (entries, _more) = io.omap_list("index", None, 100).await?;
//! assert_eq!(entries[0].0, b"k");
//! # Ok(()) }
//! ```

mod error;
mod ioctx;
mod striper;

pub use error::ClientError;
pub use ioctx::{IoCtx, OpResult, PoolCursor};

/// The snapshot side of a request: the writer's context and the snapshot
/// reads go to.
#[derive(Debug, Clone)]
pub(crate) struct SnapArgs {
    pub snapc: Option<std::sync::Arc<cairn_ops::SnapContext>>,
    pub read_at: u64,
}

impl Default for SnapArgs {
    fn default() -> Self {
        SnapArgs {
            snapc: None,
            read_at: cairn_ops::SNAP_HEAD,
        }
    }
}
pub use striper::{Extent, Striper};

use cairn_map::{ClientInstance, ClusterMap};
use cairn_msg::{
    connect, Connection, Credentials, FrameModes, MsgConfig, MsgError, DEFAULT_CLIENT_MODES,
};
use cairn_ops::{decode_shared, encode_parts, msg_type, OpReply, OpRequest, OpStatus, ReqId};
use cairn_types::{EntityName, Epoch, PgId};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Why [`Rados::conn`] found no connection.
enum ConnFailure {
    /// A later attempt may succeed (the OSD is down, restarting, unknown).
    Retry(String),
    /// A setting must change first: give up at once.
    Fatal(String),
}

/// Wait before resending to a PG that is peering or to a primary that said
/// it is not one (when no new map arrives sooner).
const RETRY_BACKOFF: Duration = Duration::from_millis(50);
/// The backoff doubles per retry up to this.
const RETRY_BACKOFF_MAX: Duration = Duration::from_millis(500);

/// The bound on one op of client `who`: central config
/// `rados_osd_op_timeout` (seconds) when it is set for `who` or a section
/// above it (`client`, `global`), else `fallback` (the handle's
/// [`ClientConfig::op_timeout`], 60 s unless the program chose another).
/// A stored 0 or unreadable value (from a version that allowed 0 = wait
/// for ever) counts as unset: every op stays bounded.
pub fn op_timeout_for(map: &ClusterMap, who: &str, fallback: Duration) -> Duration {
    map.config_set_value(who, "rados_osd_op_timeout")
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|secs| *secs > 0)
        .map_or(fallback, Duration::from_secs)
}

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub creds: Credentials,
    pub msg: MsgConfig,
    /// Bound on one op including every retry, unless the central config
    /// sets `rados_osd_op_timeout` for this client (that wins; see
    /// [`op_timeout_for`]).
    pub op_timeout: Duration,
    /// `ms_client_mode`: the frame modes offered to OSDs, most preferred
    /// first (each OSD picks the first one its `ms_service_mode` allows).
    /// `None` follows the cluster's central config (`cairn config set
    /// global ms_client_mode "crc secure"`), read from the map at each
    /// connect, and else [`DEFAULT_CLIENT_MODES`] (`crc secure`).
    pub client_mode: Option<FrameModes>,
}

impl ClientConfig {
    pub fn new(creds: Credentials) -> ClientConfig {
        ClientConfig {
            creds,
            msg: MsgConfig::default(),
            op_timeout: Duration::from_secs(60),
            client_mode: None,
        }
    }
}

type Slot = Arc<tokio::sync::Mutex<Option<Connection>>>;

/// A cached connection's key: the OSD and the tokio runtime of the callers
/// that use it. A connection's I/O runs on the runtime that opened it, so
/// a handle used from several runtimes (say a short-lived current-thread
/// one and the application's) keeps one connection per OSD for each: a
/// connection opened by a runtime that is no longer driven would stall
/// every other caller.
type ConnKey = (i32, tokio::runtime::Id);

struct Inner {
    cfg: ClientConfig,
    map: watch::Receiver<Arc<ClusterMap>>,
    conns: Mutex<HashMap<ConnKey, Slot>>,
    incarnation: u64,
    next_tid: AtomicU64,
    /// Set once this instance is known to be blocklisted: (why, epoch).
    fenced: watch::Sender<Option<(String, u64)>>,
}

/// A cluster handle. Cheap to clone.
#[derive(Clone)]
pub struct Rados {
    inner: Arc<Inner>,
}

/// Where an op goes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target {
    /// An object with this placement hash.
    Hash(u32),
    /// A PG by seed (PG-level ops such as listing).
    Seed(u32),
}

impl Rados {
    /// A handle following `map`.
    pub fn new(cfg: ClientConfig, map: watch::Receiver<Arc<ClusterMap>>) -> Rados {
        Rados {
            inner: Arc::new(Inner {
                cfg,
                map,
                conns: Mutex::new(HashMap::new()),
                incarnation: rand::random::<u64>(),
                next_tid: AtomicU64::new(1),
                fenced: watch::Sender::new(None),
            }),
        }
    }

    /// The current map.
    pub fn map(&self) -> Arc<ClusterMap> {
        self.inner.map.borrow().clone()
    }

    pub fn name(&self) -> &EntityName {
        self.inner.cfg.creds.name()
    }

    /// This handle's client instance (what `osd blocklist add` names).
    pub fn instance(&self) -> ClientInstance {
        ClientInstance {
            name: self.inner.cfg.creds.name().clone(),
            nonce: self.inner.incarnation,
        }
    }

    /// Waits until this handle's map has at least `epoch` (e.g. the epoch
    /// that blocklisted another client: every op sent afterwards carries
    /// it, so OSDs that have not seen it yet fetch it first).
    pub async fn wait_for_epoch(&self, epoch: Epoch, timeout: Duration) -> Result<(), ClientError> {
        let mut rx = self.inner.map.clone();
        let reached = matches!(
            tokio::time::timeout(timeout, rx.wait_for(|m| m.epoch >= epoch)).await,
            Ok(Ok(_))
        );
        if reached {
            Ok(())
        } else {
            Err(ClientError::Invalid(format!(
                "the cluster map did not reach epoch {} within {timeout:?} (still at e{}); is the monitor subscription alive?",
                epoch.0,
                self.map().epoch.0
            )))
        }
    }

    /// Why this instance is fenced (blocklisted), if it is: the error every
    /// op now fails with.
    pub fn fenced_error(&self) -> Option<cairn_ops::OpError> {
        self.inner
            .fenced
            .borrow()
            .as_ref()
            .map(|(client, epoch)| cairn_ops::OpError::Blocklisted {
                client: client.clone(),
                epoch: *epoch,
            })
    }

    /// Resolves once this instance is fenced: an OSD refused one of its ops
    /// as blocklisted, or the map lists it. Returns the error ops now fail
    /// with. Servers use it to stop serving.
    pub async fn fenced(&self) -> cairn_ops::OpError {
        let mut latch = self.inner.fenced.subscribe();
        let mut maps = self.inner.map.clone();
        loop {
            let map = maps.borrow_and_update().clone();
            self.check_map_fence(&map);
            if let Some(e) = self.fenced_error() {
                return e;
            }
            tokio::select! {
                r = latch.changed() => { if r.is_err() { std::future::pending::<()>().await } }
                r = maps.changed() => { if r.is_err() { std::future::pending::<()>().await } }
            }
        }
    }

    /// Latches the fence if `map` blocklists this instance.
    fn check_map_fence(&self, map: &ClusterMap) {
        if let Some(e) = map.blocklisted(self.name(), self.inner.incarnation) {
            self.fence(e.added.0);
        }
    }

    fn fence(&self, epoch: u64) {
        let who = self.instance().to_string();
        self.inner.fenced.send_if_modified(|f| {
            if f.is_some() {
                return false;
            }
            tracing::warn!("client instance {who} is blocklisted (osdmap epoch {epoch}): every further op fails");
            *f = Some((who.clone(), epoch));
            true
        });
    }

    /// An I/O context on pool `pool` (by name).
    pub fn ioctx(&self, pool: &str) -> Result<IoCtx, ClientError> {
        let map = self.map();
        let p = map
            .pools
            .values()
            .find(|p| p.name == pool)
            .ok_or_else(|| ClientError::NoSuchPool(pool.to_string()))?;
        Ok(IoCtx::new(self.clone(), p.id, p.name.clone()))
    }

    pub(crate) fn new_reqid(&self) -> ReqId {
        ReqId {
            client: self.inner.cfg.creds.name().clone(),
            incarnation: self.inner.incarnation,
            tid: self.inner.next_tid.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The connection to `osd` (made if needed). `Err(Fatal)` is a
    /// configuration mismatch no retry cures (no common frame mode);
    /// `Err(Retry)` anything a later attempt may get past.
    async fn conn(&self, osd: i32, map: &ClusterMap) -> Result<Connection, ConnFailure> {
        let key = (osd, tokio::runtime::Handle::current().id());
        let slot = {
            let mut g = self.inner.conns.lock().unwrap_or_else(|p| p.into_inner());
            if !g.contains_key(&key) {
                // Slots of runtimes that shut down hold closed connections.
                g.retain(|_, s| {
                    s.try_lock()
                        .map(|c| c.as_ref().is_some_and(|c| !c.is_closed()))
                        .unwrap_or(true)
                });
            }
            g.entry(key).or_default().clone()
        };
        let mut g = slot.lock().await;
        if let Some(c) = g.as_ref() {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let addr: SocketAddr = map
            .osds
            .get(&osd)
            .and_then(|o| o.addrs.first())
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| {
                ConnFailure::Retry(format!("osd.{osd} has no address in map e{}", map.epoch.0))
            })?;
        let mode = match self.inner.cfg.client_mode {
            Some(m) => m,
            None => {
                let who = self.inner.cfg.creds.name().to_string();
                match map.config_value(&who, "ms_client_mode") {
                    Some(v) => v.parse().map_err(|e| {
                        ConnFailure::Fatal(format!(
                            "ms_client_mode of {who} in the central config: {e}"
                        ))
                    })?,
                    None => DEFAULT_CLIENT_MODES,
                }
            }
        };
        let msg = MsgConfig {
            modes: mode,
            ..self.inner.cfg.msg.clone()
        };
        let c = connect(
            addr,
            &self.inner.cfg.creds,
            Some(&EntityName::osd(osd)),
            &msg,
        )
        .await
        .map_err(|e| match e {
            MsgError::NoCommonMode { .. } => ConnFailure::Fatal(e.to_string()),
            e => ConnFailure::Retry(e.to_string()),
        })?;
        *g = Some(c.clone());
        Ok(c)
    }

    fn drop_conn(&self, osd: i32) {
        let key = (osd, tokio::runtime::Handle::current().id());
        self.inner
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
    }

    /// Waits (until `deadline`) for a map newer than `epoch`; false on timeout.
    async fn wait_newer_map(&self, epoch: u64, deadline: Instant, at_most: Duration) -> bool {
        let mut rx = self.inner.map.clone();
        let until = deadline.min(Instant::now() + at_most);
        let r = tokio::time::timeout_at(until, rx.wait_for(|m| m.epoch.0 > epoch)).await;
        matches!(r, Ok(Ok(_)))
    }

    /// Sends `ops` until the primary answers `Done`, following map changes.
    pub(crate) async fn submit(
        &self,
        pool: u64,
        target: Target,
        oid: cairn_ops::ObjectName,
        ops: Vec<cairn_ops::SubOp>,
        snap: &SnapArgs,
    ) -> Result<OpReply, ClientError> {
        let timeout = op_timeout_for(
            &self.map(),
            &self.name().to_string(),
            self.inner.cfg.op_timeout,
        );
        let deadline = Instant::now() + timeout;
        let reqid = self.new_reqid();
        let mut backoff = RETRY_BACKOFF;
        let mut last = String::from("nothing was sent yet");
        let mut waited: (Option<PgId>, Option<i32>) = (None, None);
        loop {
            if Instant::now() >= deadline {
                return Err(ClientError::Timeout {
                    object: oid.to_string(),
                    pg: waited
                        .0
                        .map(|p| p.to_string())
                        .unwrap_or_else(|| "?".into()),
                    osd: waited.1,
                    after: timeout,
                    last,
                });
            }
            let map = self.map();
            self.check_map_fence(&map);
            if let Some(error) = self.fenced_error() {
                return Err(ClientError::Op {
                    object: oid.to_string(),
                    error,
                });
            }
            let p = map
                .pools
                .get(&pool)
                .ok_or_else(|| ClientError::NoSuchPool(format!("id {pool}")))?;
            let seed = match target {
                Target::Hash(h) => {
                    cairn_map::stable_mod(h, p.pg_num, p.pg_num.max(1).next_power_of_two() - 1)
                }
                Target::Seed(s) => s,
            };
            let pgid = PgId {
                pool: cairn_types::PoolId(pool),
                seed,
            };
            waited.0 = Some(pgid);
            let primary = map.pg_to_up(pool, seed).ok().and_then(|m| m.acting_primary);
            let Some(osd) = primary else {
                last = format!("pg {pgid} has no up OSD in map e{}", map.epoch.0);
                self.wait_newer_map(map.epoch.0, deadline, timeout).await;
                continue;
            };
            waited.1 = Some(osd);
            let req = OpRequest {
                reqid: reqid.clone(),
                epoch: map.epoch,
                pgid,
                oid: oid.clone(),
                ops: ops.clone(),
                snapc: snap.snapc.as_deref().cloned(),
                snap: snap.read_at,
            };
            let conn = match self.conn(osd, &map).await {
                Ok(c) => c,
                Err(ConnFailure::Fatal(e)) => {
                    return Err(ClientError::Connect(format!("osd.{osd}: {e}")));
                }
                Err(ConnFailure::Retry(e)) => {
                    last = format!("connecting to osd.{osd}: {e}");
                    self.wait_newer_map(map.epoch.0, deadline, backoff).await;
                    backoff = (backoff * 2).min(RETRY_BACKOFF_MAX);
                    continue;
                }
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let call = conn.call_parts(msg_type::OP, encode_parts(&req), left);
            // A new map that moves the PG's primary abandons the call and
            // resends (same reqid: applied once).
            let moved = async {
                let mut rx = self.inner.map.clone();
                let _ = rx
                    .wait_for(|m| {
                        m.epoch > map.epoch
                            && m.pg_to_up(pool, seed).ok().and_then(|x| x.acting_primary)
                                != Some(osd)
                    })
                    .await;
            };
            let m = tokio::select! {
                r = call => r,
                _ = moved => {
                    last = format!("pg {pgid} moved away from osd.{osd}");
                    continue;
                }
            };
            let m = match m {
                Ok(m) => m,
                Err(e) => {
                    last = format!("osd.{osd}: {e}");
                    if e.is_connection_error() {
                        self.drop_conn(osd);
                    }
                    self.wait_newer_map(map.epoch.0, deadline, backoff).await;
                    backoff = (backoff * 2).min(RETRY_BACKOFF_MAX);
                    continue;
                }
            };
            let reply: OpReply = decode_shared("op reply", &m.payload)
                .map_err(|e| ClientError::Protocol(format!("osd.{osd}: {e}")))?;
            match &reply.status {
                OpStatus::Done(Err(cairn_ops::OpError::Blocklisted { epoch, .. })) => {
                    self.fence(*epoch);
                    return Ok(reply);
                }
                OpStatus::Done(_) => return Ok(reply),
                OpStatus::MapTooOld { need } => {
                    last = format!("osd.{osd} has map e{}, ours is e{}", need.0, map.epoch.0);
                    let mut rx = self.inner.map.clone();
                    let need = *need;
                    let _ =
                        tokio::time::timeout_at(deadline, rx.wait_for(|m| m.epoch >= need)).await;
                }
                OpStatus::MapTooNew { osd_epoch } => {
                    last = format!("osd.{osd} is still at map e{}", osd_epoch.0);
                    tokio::time::sleep(
                        backoff.min(deadline.saturating_duration_since(Instant::now())),
                    )
                    .await;
                    backoff = (backoff * 2).min(RETRY_BACKOFF_MAX);
                }
                OpStatus::NotPrimary { osd_epoch } => {
                    last = format!(
                        "osd.{osd} (map e{}) is not primary of pg {pgid}",
                        osd_epoch.0
                    );
                    self.wait_newer_map(map.epoch.0, deadline, backoff).await;
                    backoff = (backoff * 2).min(RETRY_BACKOFF_MAX);
                }
                OpStatus::NotActive { state } => {
                    last = format!("pg {pgid} on osd.{osd} is not active ({state})");
                    self.wait_newer_map(map.epoch.0, deadline, backoff).await;
                    backoff = (backoff * 2).min(RETRY_BACKOFF_MAX);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use cairn_msg::{
        FrameModes, DEFAULT_CLIENT_MODES, DEFAULT_CLUSTER_MODES, DEFAULT_SERVICE_MODES,
    };

    /// The central config's documented defaults are the ones the code uses
    /// when a setting is absent.
    #[test]
    fn messenger_mode_defaults_match_the_config_table() {
        for (key, code) in [
            ("ms_client_mode", DEFAULT_CLIENT_MODES),
            ("ms_cluster_mode", DEFAULT_CLUSTER_MODES),
            ("ms_service_mode", DEFAULT_SERVICE_MODES),
        ] {
            let opt = cairn_map::config::known_option(key).unwrap();
            assert_eq!(opt.default.parse::<FrameModes>().unwrap(), code, "{key}");
        }
    }

    /// Every op is bounded: the central config's `rados_osd_op_timeout`
    /// wins when set for the client, the handle's own bound otherwise (the
    /// table's default is that same 60 s), and 0 is never "wait for ever".
    #[test]
    fn op_timeout_comes_from_the_central_config_and_is_never_unbounded() {
        use super::{op_timeout_for, ClientConfig};
        use std::time::Duration;
        let mon = cairn_map::MonInfo {
            name: "a".into(),
            addr: "127.0.0.1:1".into(),
            rank: 0,
        };
        let admin = cairn_map::AuthEntity::new(&[7; 32], &[("mon", "allow *")]);
        let mut map = cairn_map::ClusterMap::new_cluster("fsid", mon, admin);
        let sixty = Duration::from_secs(60);
        let creds = cairn_msg::Credentials::Key {
            name: cairn_types::EntityName::client("admin"),
            secret: cairn_msg::Secret::from_bytes([7; 32]),
        };
        assert_eq!(ClientConfig::new(creds).op_timeout, sixty);
        let opt = cairn_map::config::known_option("rados_osd_op_timeout").unwrap();
        assert_eq!(opt.default, "60", "the table says what the code does");
        assert_eq!(op_timeout_for(&map, "client.admin", sixty), sixty);
        let set = |map: &mut cairn_map::ClusterMap, who: &str, v: &str| {
            map.config
                .insert((who.into(), "rados_osd_op_timeout".into()), v.into());
        };
        set(&mut map, "client", "5");
        assert_eq!(
            op_timeout_for(&map, "client.admin", sixty),
            Duration::from_secs(5)
        );
        set(&mut map, "client.admin", "7");
        assert_eq!(
            op_timeout_for(&map, "client.admin", sixty),
            Duration::from_secs(7)
        );
        assert_eq!(
            op_timeout_for(&map, "client.other", sixty),
            Duration::from_secs(5)
        );
        // A 0 stored by an older version does not mean "wait for ever".
        set(&mut map, "client.admin", "0");
        assert_eq!(op_timeout_for(&map, "client.admin", sixty), sixty);
        // And the monitors refuse to store 0 now.
        assert!(cairn_map::config::validate_value(opt, "0").is_err());
        assert_eq!(
            cairn_map::config::validate_value(opt, "2m").as_deref(),
            Ok("120")
        );
    }
}
