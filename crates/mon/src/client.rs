//! `MonClient`: how the CLI (and later OSDs and clients) talk to the
//! monitors. It authenticates with the entity's key, finds a mon in a
//! working quorum (following leader hints for mutations), runs commands and
//! subscribes to the map. Every call is bounded by the client's timeout:
//! without a quorum it fails with `no monitor quorum (N of M reachable)`,
//! it never hangs.

use crate::proto::*;
use cairn_map::{ClusterMap, MonCommand, Reply};
use cairn_msg::{connect, Connection, Credentials, Keyring, MsgConfig, MsgError};
use cairn_types::{Conf, EntityName};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::time::Instant;

/// Default per-call timeout of the CLI.
pub const DEFAULT_CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between rounds over all mons while none could answer.
const ROUND_PAUSE: Duration = Duration::from_millis(200);

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The mons refused the command (usage, validation, permissions).
    #[error("{0}")]
    Refused(String),
    #[error("authentication as {name} failed: {reason}; check the key in the keyring (cairn auth get {name} on an admin node)")]
    Auth { name: String, reason: String },
    #[error("no monitor quorum ({reachable} of {total} reachable) after {waited:?}: {detail}")]
    NoQuorum {
        reachable: usize,
        total: usize,
        waited: Duration,
        detail: String,
    },
    #[error("configuration: {0}")]
    Config(String),
    #[error("protocol error from a mon: {0}")]
    Protocol(String),
}

/// Finds the cluster config: `-c`, `$CAIRN_CONF`, `./cairn.conf`,
/// `/etc/cairn/cairn.conf`.
pub fn find_conf(explicit: Option<&Path>) -> Result<PathBuf, ClientError> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Ok(p) = std::env::var("CAIRN_CONF") {
        if !p.is_empty() {
            return Ok(PathBuf::from(p));
        }
    }
    for p in ["cairn.conf", "/etc/cairn/cairn.conf"] {
        if Path::new(p).exists() {
            return Ok(PathBuf::from(p));
        }
    }
    Err(ClientError::Config(
        "no cairn.conf found: pass -c FILE, set CAIRN_CONF, or run in a directory with cairn.conf (cairn bootstrap writes one into its data dir)".into(),
    ))
}

/// Parses `mon_host` (`a:port,b:port` or space separated).
pub fn parse_mon_host(text: &str) -> Result<Vec<SocketAddr>, ClientError> {
    let mut out = Vec::new();
    for part in text.split([',', ' ', ';']).filter(|s| !s.trim().is_empty()) {
        let part = part.trim();
        let with_port = if part.parse::<SocketAddr>().is_ok() || part.contains(':') {
            part.to_string()
        } else {
            format!("{part}:6789")
        };
        let addr = with_port
            .to_socket_addrs()
            .map_err(|e| ClientError::Config(format!("mon_host entry '{part}': {e}")))?
            .next()
            .ok_or_else(|| {
                ClientError::Config(format!("mon_host entry '{part}' resolves to nothing"))
            })?;
        out.push(addr);
    }
    if out.is_empty() {
        return Err(ClientError::Config("mon_host is empty".into()));
    }
    Ok(out)
}

/// A client of the monitors.
pub struct MonClient {
    addrs: Vec<SocketAddr>,
    creds: Credentials,
    timeout: Duration,
    state: tokio::sync::Mutex<Option<(SocketAddr, Connection)>>,
}

impl MonClient {
    pub fn new(addrs: Vec<SocketAddr>, creds: Credentials, timeout: Duration) -> MonClient {
        MonClient {
            addrs,
            creds,
            timeout,
            state: tokio::sync::Mutex::new(None),
        }
    }

    /// Builds a client from `cairn.conf` (`mon_host`, `keyring`) for `name`.
    /// A relative keyring path is taken relative to the conf file.
    pub fn from_conf(
        conf_path: &Path,
        name: &EntityName,
        timeout: Duration,
    ) -> Result<MonClient, ClientError> {
        let conf = Conf::load(conf_path).map_err(|e| ClientError::Config(e.to_string()))?;
        let who = name.to_string();
        let hosts = conf.get(&who, "mon_host").ok_or_else(|| {
            ClientError::Config(format!("{}: no mon_host in [global]", conf_path.display()))
        })?;
        let addrs = parse_mon_host(hosts)?;
        let keyring = conf
            .get(&who, "keyring")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(format!("{who}.keyring")));
        let keyring = if keyring.is_relative() {
            conf_path.parent().unwrap_or(Path::new(".")).join(keyring)
        } else {
            keyring
        };
        let ring = Keyring::load(&keyring).map_err(|e| ClientError::Config(e.to_string()))?;
        let entry = ring.get(name).ok_or_else(|| {
            ClientError::Config(format!(
                "keyring {} has no key for {name}",
                keyring.display()
            ))
        })?;
        Ok(MonClient::new(
            addrs,
            Credentials::Key {
                name: name.clone(),
                secret: entry.secret.clone(),
            },
            timeout,
        ))
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    async fn connect_to(&self, addr: SocketAddr, left: Duration) -> Result<Connection, MsgError> {
        let mut st = self.state.lock().await;
        if let Some((a, c)) = st.as_ref() {
            if *a == addr && !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let cfg = MsgConfig {
            connect_timeout: left
                .min(Duration::from_secs(2))
                .max(Duration::from_millis(10)),
            handshake_timeout: left
                .min(Duration::from_secs(3))
                .max(Duration::from_millis(10)),
            ..MsgConfig::default()
        };
        let c = connect(addr, &self.creds, None, &cfg).await?;
        *st = Some((addr, c.clone()));
        Ok(c)
    }

    /// Runs one command; the reply of a mon in quorum, within the timeout.
    pub async fn command(&self, cmd: &MonCommand) -> Result<Reply, ClientError> {
        let start = Instant::now();
        let deadline = start + self.timeout;
        let payload = encode(&CommandRequest { cmd: cmd.clone() });
        let mut addrs = self.addrs.clone();
        let mut preferred: Option<SocketAddr> = self.state.lock().await.as_ref().map(|(a, _)| *a);
        let mut last_detail = String::from("no mon answered");
        loop {
            let mut reachable = 0usize;
            let mut order: Vec<SocketAddr> = preferred.into_iter().collect();
            order.extend(addrs.iter().copied().filter(|a| Some(*a) != preferred));
            let mut hinted = false;
            for addr in order {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                let conn = match self.connect_to(addr, left).await {
                    Ok(c) => c,
                    Err(MsgError::AuthFailed { reason, .. }) => {
                        return Err(ClientError::Auth {
                            name: self.creds.name().to_string(),
                            reason: format!("mon at {addr}: {reason}"),
                        })
                    }
                    Err(e) => {
                        last_detail = format!("mon at {addr}: {e}");
                        continue;
                    }
                };
                reachable += 1;
                let left = deadline.saturating_duration_since(Instant::now());
                let msg = match conn.call(MSG_COMMAND, payload.clone(), left).await {
                    Ok(m) => m,
                    Err(e) => {
                        conn.close();
                        last_detail = format!("mon at {addr}: {e}");
                        continue;
                    }
                };
                let resp: CommandResponse =
                    decode("command reply", &msg.payload).map_err(ClientError::Protocol)?;
                for a in &resp.mon_addrs {
                    if let Ok(sa) = a.parse::<SocketAddr>() {
                        if !addrs.contains(&sa) {
                            addrs.push(sa);
                        }
                    }
                }
                match resp.result {
                    Ok(r) => return Ok(r),
                    Err(CommandFailure::Refused(e)) => return Err(ClientError::Refused(e)),
                    Err(CommandFailure::NotLeader {
                        leader_addr,
                        leader_name,
                    }) => {
                        last_detail = format!(
                            "mon at {addr} is not the leader (leader: {})",
                            leader_name.as_deref().unwrap_or("unknown")
                        );
                        if let Some(sa) = leader_addr.and_then(|a| a.parse::<SocketAddr>().ok()) {
                            if Some(sa) != preferred {
                                preferred = Some(sa);
                                if !addrs.contains(&sa) {
                                    addrs.push(sa);
                                }
                                hinted = true;
                                break;
                            }
                        }
                    }
                    Err(CommandFailure::NoQuorum(e)) => {
                        last_detail = format!("mon at {addr}: {e}");
                    }
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(ClientError::NoQuorum {
                    reachable,
                    total: addrs.len(),
                    waited: now - start,
                    detail: last_detail,
                });
            }
            if !hinted {
                let pause = ROUND_PAUSE.min(deadline - now);
                tokio::time::sleep(pause).await;
                if Instant::now() >= deadline {
                    return Err(ClientError::NoQuorum {
                        reachable,
                        total: addrs.len(),
                        waited: Instant::now() - start,
                        detail: last_detail,
                    });
                }
            }
        }
    }

    /// Subscribes to the cluster map: returns the current map; `next()`
    /// then yields each newer map, reconnecting to another mon as needed.
    pub async fn subscribe(&self) -> Result<MapSubscription, ClientError> {
        let deadline = Instant::now() + self.timeout;
        let (conn, update) = open_subscription(&self.addrs, &self.creds, 0, deadline).await?;
        let MapUpdate::Full { map, .. } = update else {
            return Err(ClientError::Protocol(format!(
                "expected a full map first, got {update:?}"
            )));
        };
        let map = ClusterMap::decode(&map).map_err(|e| ClientError::Protocol(e.to_string()))?;
        Ok(MapSubscription {
            addrs: self.addrs.clone(),
            creds: self.creds.clone(),
            conn: Some(conn),
            map,
        })
    }
}

/// Connects to the first mon that can serve a subscription from `have`.
async fn open_subscription(
    addrs: &[SocketAddr],
    creds: &Credentials,
    have: u64,
    deadline: Instant,
) -> Result<(Connection, MapUpdate), ClientError> {
    let start = Instant::now();
    let mut last = String::from("no mon answered");
    let mut reachable = 0;
    while Instant::now() < deadline {
        reachable = 0;
        for addr in addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let cfg = MsgConfig {
                connect_timeout: left.min(Duration::from_secs(2)),
                handshake_timeout: left.min(Duration::from_secs(3)),
                ..MsgConfig::default()
            };
            let conn = match connect(*addr, creds, None, &cfg).await {
                Ok(c) => c,
                Err(MsgError::AuthFailed { reason, .. }) => {
                    return Err(ClientError::Auth {
                        name: creds.name().to_string(),
                        reason,
                    })
                }
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            reachable += 1;
            let req = encode(&SubscribeRequest { have_epoch: have });
            let m = match conn.call(MSG_SUBSCRIBE, req, left).await {
                Ok(m) => m,
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            let update: MapUpdate =
                decode("map update", &m.payload).map_err(ClientError::Protocol)?;
            match update {
                MapUpdate::Unavailable(e) => last = format!("mon at {addr}: {e}"),
                u => return Ok((conn, u)),
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::sleep(ROUND_PAUSE.min(left)).await;
    }
    Err(ClientError::NoQuorum {
        reachable,
        total: addrs.len(),
        waited: Instant::now() - start,
        detail: last,
    })
}

/// A live map subscription. It follows pushes from one mon and moves to
/// another (asking for what it missed) when that connection breaks.
pub struct MapSubscription {
    addrs: Vec<SocketAddr>,
    creds: Credentials,
    conn: Option<Connection>,
    /// The latest map received.
    pub map: ClusterMap,
}

/// How long `next` waited without a new map.
#[derive(Debug, thiserror::Error)]
#[error("no new map within {0:?}")]
pub struct NoNewMap(pub Duration);

impl MapSubscription {
    /// Applies an update; true if the map moved forward.
    fn absorb(&mut self, update: MapUpdate) -> Result<bool, ClientError> {
        let before = self.map.epoch;
        match update {
            MapUpdate::Full { map, .. } => {
                let m =
                    ClusterMap::decode(&map).map_err(|e| ClientError::Protocol(e.to_string()))?;
                if m.epoch > self.map.epoch {
                    self.map = m;
                }
            }
            MapUpdate::Incrementals { incrementals, .. } => {
                for inc in &incrementals {
                    if inc.epoch.0 <= self.map.epoch.0 {
                        continue;
                    }
                    self.map
                        .apply_incremental(inc)
                        .map_err(|e| ClientError::Protocol(e.to_string()))?;
                }
            }
            MapUpdate::UpToDate { .. } => {}
            MapUpdate::Unavailable(e) => return Err(ClientError::Protocol(e)),
        }
        Ok(self.map.epoch > before)
    }

    /// Waits (up to `timeout`) for a map newer than the current one.
    pub async fn next(&mut self, timeout: Duration) -> Result<&ClusterMap, ClientError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ClientError::Protocol(NoNewMap(timeout).to_string()));
            }
            let conn = match &self.conn {
                Some(c) if !c.is_closed() => c.clone(),
                _ => {
                    let (c, update) =
                        open_subscription(&self.addrs, &self.creds, self.map.epoch.0, deadline)
                            .await?;
                    self.conn = Some(c);
                    if self.absorb(update)? {
                        return Ok(&self.map);
                    }
                    continue;
                }
            };
            let m = match conn.recv_timeout(left).await {
                Ok(m) => m,
                Err(MsgError::Timeout { .. }) => {
                    return Err(ClientError::Protocol(NoNewMap(timeout).to_string()))
                }
                Err(_) => {
                    self.conn = None;
                    continue;
                }
            };
            if m.msg_type != MSG_MAP_UPDATE {
                continue;
            }
            let update: MapUpdate =
                decode("map update", &m.payload).map_err(ClientError::Protocol)?;
            if self.absorb(update)? {
                return Ok(&self.map);
            }
        }
    }
}
