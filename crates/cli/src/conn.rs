//! Connecting the CLI to a cluster: finding the config (including the dev
//! cluster's), the admin credentials, a `MonClient`, and a `Rados` handle
//! fed by a map subscription. Owns no command logic.

use anyhow::{anyhow, Context, Result};
use cairn_client::{ClientConfig, Rados};
use cairn_map::ClusterMap;
use cairn_mon::{MonClient, DEFAULT_CLIENT_TIMEOUT};
use cairn_msg::{Credentials, Keyring};
use cairn_types::{Conf, EntityName};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The dev cluster's default directory: `$XDG_DATA_HOME/cairn/dev`, else
/// `$HOME/.local/share/cairn/dev`, else `./.cairn-dev`.
pub fn default_dev_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("cairn").join("dev");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(h)
            .join(".local")
            .join("share")
            .join("cairn")
            .join("dev");
    }
    PathBuf::from(".cairn-dev")
}

/// `-c`, `$CAIRN_CONF`, `./cairn.conf`, `/etc/cairn/cairn.conf`, then the
/// dev cluster's conf (`cairn dev up` writes it into its directory).
pub fn find_conf(explicit: Option<&Path>) -> Result<PathBuf> {
    match cairn_mon::find_conf(explicit) {
        Ok(p) => Ok(p),
        Err(e) => {
            let dev = default_dev_dir().join("cairn.conf");
            if dev.exists() {
                Ok(dev)
            } else {
                Err(anyhow!("{e}; or start a dev cluster with 'cairn dev up'"))
            }
        }
    }
}

/// The directory holding a config file.
pub fn conf_dir(conf: &Path) -> PathBuf {
    match conf.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The credentials of `name` from the conf's keyring (or `keyring` if given).
pub fn credentials(conf: &Path, name: &EntityName, keyring: Option<&Path>) -> Result<Credentials> {
    let c = Conf::load(conf).with_context(|| format!("reading {}", conf.display()))?;
    let who = name.to_string();
    let path = match keyring {
        Some(k) => k.to_path_buf(),
        None => {
            let k = c
                .get(&who, "keyring")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(format!("{who}.keyring")));
            if k.is_relative() {
                conf_dir(conf).join(k)
            } else {
                k
            }
        }
    };
    let ring =
        Keyring::load(&path).with_context(|| format!("loading keyring {}", path.display()))?;
    let entry = ring
        .get(name)
        .ok_or_else(|| anyhow!("keyring {} has no key for {name}", path.display()))?;
    Ok(Credentials::Key {
        name: name.clone(),
        secret: entry.secret.clone(),
    })
}

/// The monitor addresses in a conf.
pub fn mon_addrs(conf: &Path) -> Result<Vec<std::net::SocketAddr>> {
    let c = Conf::load(conf).with_context(|| format!("reading {}", conf.display()))?;
    let hosts = c
        .get("global", "mon_host")
        .ok_or_else(|| anyhow!("{}: no mon_host in [global]", conf.display()))?;
    cairn_mon::parse_mon_host(hosts).map_err(|e| anyhow!("{e}"))
}

/// A monitor client as `creds`.
pub fn mon_client(conf: &Path, creds: Credentials, timeout: Duration) -> Result<MonClient> {
    Ok(MonClient::new(mon_addrs(conf)?, creds, timeout))
}

/// A map followed through a monitor subscription (a background task keeps
/// the watch channel current and reconnects as needed).
pub async fn follow_map(mon: &MonClient) -> Result<watch::Receiver<Arc<ClusterMap>>> {
    let mut sub = mon.subscribe().await.map_err(|e| anyhow!("{e}"))?;
    let (tx, rx) = watch::channel(Arc::new(sub.map.clone()));
    tokio::spawn(async move {
        loop {
            match sub.next(Duration::from_secs(30)).await {
                Ok(m) => {
                    let m = Arc::new(m.clone());
                    if tx.send(m).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    if tx.is_closed() {
                        return;
                    }
                    tracing::debug!("map subscription: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    });
    Ok(rx)
}

/// An admin session: the conf, a monitor client and an object client.
pub struct Session {
    pub rados: Rados,
    /// Keeps the monitor session that feeds the map alive.
    _mon: Arc<MonClient>,
}

impl Session {
    /// Connects as `client.admin` (or `name`) with the conf's keyring.
    pub async fn connect(conf: Option<&Path>, name: Option<&EntityName>) -> Result<Session> {
        let conf = find_conf(conf)?;
        let admin = EntityName::client("admin");
        let name = name.unwrap_or(&admin);
        let creds = credentials(&conf, name, None)?;
        let mon = mon_client(&conf, creds.clone(), DEFAULT_CLIENT_TIMEOUT)?;
        let rx = follow_map(&mon).await?;
        let mut cfg = ClientConfig::new(creds);
        // cairn.conf wins over the central config (which the client reads
        // from the map when it connects to an OSD).
        let c = Conf::load(&conf).with_context(|| format!("reading {}", conf.display()))?;
        if let Some(v) = c.get(&name.to_string(), "ms_client_mode") {
            cfg.client_mode =
                Some(v.parse().map_err(|e: String| {
                    anyhow!("ms_client_mode '{v}' in {}: {e}", conf.display())
                })?);
        }
        let rados = Rados::new(cfg, rx);
        Ok(Session {
            rados,
            _mon: Arc::new(mon),
        })
    }

    /// The monitor client (for commands such as snapshot id allocation).
    pub fn mon(&self) -> &MonClient {
        &self._mon
    }

    /// The monitor client, shared (for helpers that outlive a borrow, such
    /// as the lock breaker's blocklisting).
    pub fn mon_shared(&self) -> Arc<MonClient> {
        self._mon.clone()
    }
}
