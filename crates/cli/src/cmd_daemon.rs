//! Node lifecycle: `cairn bootstrap` (new cluster, first mon), `cairn join`
//! (a new mon node from a join token), `cairn daemon` (runs this node's
//! roles — for now its mon — in the background or foreground) and
//! `cairn daemon stop` (clean stop through the pid file).
//!
//! Files in a node's data dir: `cairn.conf`, `client.admin.keyring`
//! (bootstrap node only), `mon.keyring`, `mon/` (the mon store),
//! `join-token`, `cairn.pid`, `daemon.log`. Keyrings and the token are 0600.

use crate::GlobalArgs;
use anyhow::{anyhow, bail, Context, Result};
use cairn_map::{AuthEntity, ClusterMap, MonCommand, MonInfo};
use cairn_mon::service::{write_file_atomic, MsgTransport};
use cairn_mon::{
    mon_id_for, parse_mon_host, JoinToken, MonClient, MonConfig, MonPeer, MonService, RaftMon,
    RaftTiming,
};
use cairn_msg::{Credentials, Keyring, KeyringEntry, Secret};
use cairn_types::{Conf, EntityName};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Default data dir of a node.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cairn";
/// Default mon port (Ceph's v1 port).
pub const DEFAULT_MON_PORT: u16 = 6789;
/// How long `bootstrap`/`join`/`daemon` wait for the started daemon.
const DAEMON_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `daemon stop` waits for the process to exit.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

const CONF_FILE: &str = "cairn.conf";
const PID_FILE: &str = "cairn.pid";
const ADMIN_KEYRING: &str = "client.admin.keyring";
const MON_KEYRING: &str = "mon.keyring";
const TOKEN_FILE: &str = "join-token";
const LOG_FILE: &str = "daemon.log";

#[derive(Debug, clap::Args)]
pub struct BootstrapArgs {
    /// This node's IP (or IP:PORT) for its monitor; port 6789 by default.
    #[arg(long = "mon-ip")]
    pub mon_ip: String,
    /// Data dir for the config, keyrings and the mon store.
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    pub data: PathBuf,
    /// Name of the first monitor.
    #[arg(long, default_value = "a")]
    pub name: String,
    /// Run the daemon in the foreground (for a systemd unit) instead of
    /// starting it in the background.
    #[arg(long)]
    pub foreground: bool,
}

#[derive(Debug, clap::Args)]
pub struct JoinArgs {
    /// The token printed by `cairn bootstrap` (also in its data dir's `join-token`).
    pub token: String,
    /// This node's IP (or IP:PORT) for its monitor.
    #[arg(long = "mon-ip")]
    pub mon_ip: String,
    /// Name of this monitor (default: the host name).
    #[arg(long)]
    pub name: Option<String>,
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    pub data: PathBuf,
    #[arg(long)]
    pub foreground: bool,
}

#[derive(Debug, clap::Args)]
pub struct DaemonArgs {
    #[command(subcommand)]
    pub action: Option<DaemonAction>,
    /// Stay in the foreground (for systemd); otherwise start in the background.
    #[arg(long)]
    pub foreground: bool,
}

#[derive(Debug, clap::Subcommand)]
pub enum DaemonAction {
    /// Stop the node's daemon cleanly (SIGTERM via the pid file) and wait.
    Stop {
        /// Data dir of the node (default: the directory of the config file).
        #[arg(long)]
        data: Option<PathBuf>,
    },
}

/// `IP` or `IP:PORT` -> socket address.
pub fn parse_mon_ip(text: &str) -> Result<SocketAddr> {
    if let Ok(a) = text.parse::<SocketAddr>() {
        return Ok(a);
    }
    let ip: std::net::IpAddr = text
        .parse()
        .map_err(|_| anyhow!("--mon-ip '{text}' is not an IP address or IP:PORT"))?;
    Ok(SocketAddr::new(ip, DEFAULT_MON_PORT))
}

pub fn new_fsid() -> String {
    let b: [u8; 16] = rand::random();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

fn save_keyring(
    path: &Path,
    name: EntityName,
    secret: &Secret,
    caps: &[(&str, &str)],
) -> Result<()> {
    let ring = Keyring {
        entries: vec![KeyringEntry {
            name,
            secret: secret.clone(),
            caps: caps
                .iter()
                .map(|(s, c)| (s.to_string(), c.to_string()))
                .collect::<BTreeMap<_, _>>(),
        }],
    };
    ring.save(path)
        .with_context(|| format!("writing keyring {}", path.display()))
}

pub fn prepare_dir(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating data dir {}", dir.display()))?;
    let dir = dir
        .canonicalize()
        .with_context(|| format!("resolving {}", dir.display()))?;
    if dir.join(CONF_FILE).exists() {
        bail!(
            "{} already holds a node ({CONF_FILE} exists); start it with 'cairn daemon -c {}' or pick another --data",
            dir.display(),
            dir.join(CONF_FILE).display()
        );
    }
    Ok(dir)
}

fn write_node_conf(
    dir: &Path,
    fsid: &str,
    mon_host: &[String],
    name: &str,
    addr: SocketAddr,
    admin: bool,
) -> Result<PathBuf> {
    let mut conf = Conf::new();
    conf.set("global", "fsid", fsid);
    conf.set("global", "mon_host", mon_host.join(","));
    if admin {
        conf.set("global", "keyring", ADMIN_KEYRING);
    }
    conf.set("mon", "mon_name", name);
    conf.set("mon", "mon_addr", addr.to_string());
    conf.set("mon", "mon_data", dir.join("mon").display().to_string());
    conf.set("mon", "mon_keyring", MON_KEYRING);
    let path = dir.join(CONF_FILE);
    write_file_atomic(&path, conf.to_text().as_bytes(), 0o644)?;
    Ok(path)
}

/// Writes a new cluster's conf, keyrings, genesis map (mon store) and join
/// token into `dir`; returns (fsid, conf path, token). Starts nothing.
pub fn create_cluster(
    dir: &Path,
    name: &str,
    addr: SocketAddr,
    failure_domain: &str,
) -> Result<(String, PathBuf, String)> {
    let fsid = new_fsid();
    let admin_secret = Secret::generate();
    let mon_secret = Secret::generate();
    let admin_caps = [
        ("mon", "allow *"),
        ("osd", "allow *"),
        ("mds", "allow *"),
        ("mgr", "allow *"),
    ];
    let map = ClusterMap::new_cluster_with_failure_domain(
        &fsid,
        MonInfo {
            name: name.to_string(),
            addr: addr.to_string(),
            rank: 0,
        },
        AuthEntity::new(admin_secret.as_bytes(), &admin_caps),
        failure_domain,
    )
    .map_err(|e| anyhow!("creating the first map: {e}"))?;
    save_keyring(
        &dir.join(ADMIN_KEYRING),
        EntityName::client("admin"),
        &admin_secret,
        &admin_caps,
    )?;
    save_keyring(
        &dir.join(MON_KEYRING),
        EntityName::mon(name),
        &mon_secret,
        &[("mon", "allow *")],
    )?;
    let conf_path = write_node_conf(dir, &fsid, &[addr.to_string()], name, addr, true)?;
    // Commit the genesis map before any daemon runs.
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let transport = Arc::new(MsgTransport::new(name, mon_secret.clone()));
        let mon = RaftMon::<ClusterMap>::open(
            &dir.join("mon"),
            mon_id_for(name),
            transport,
            RaftTiming::default(),
        )
        .await
        .map_err(|e| anyhow!("opening the mon store: {e}"))?;
        let peer = MonPeer {
            name: name.to_string(),
            addr: addr.to_string(),
        };
        let r = mon
            .bootstrap(peer, map.encode(), Duration::from_secs(10))
            .await
            .map_err(|e| anyhow!("creating the first map: {e}"))?;
        if let Err(e) = r.outcome {
            bail!("creating the first map: {e}");
        }
        mon.shutdown().await;
        Ok(())
    })?;
    drop(rt);
    let token = JoinToken {
        fsid: fsid.clone(),
        mon_host: vec![addr.to_string()],
        mon_secret,
    }
    .encode();
    write_file_atomic(
        &dir.join(TOKEN_FILE),
        format!("{token}\n").as_bytes(),
        0o600,
    )?;
    Ok((fsid, conf_path, token))
}

/// `cairn bootstrap`.
pub fn bootstrap(args: BootstrapArgs, _global: &GlobalArgs) -> Result<()> {
    let addr = parse_mon_ip(&args.mon_ip)?;
    let dir = prepare_dir(&args.data)?;
    let (fsid, conf_path, token) = create_cluster(&dir, &args.name, addr, "host")?;
    println!("Created cluster {fsid} with mon.{} at {addr}.", args.name);
    println!("  config:         {}", conf_path.display());
    println!(
        "  admin keyring:  {} (mode 0600)",
        dir.join(ADMIN_KEYRING).display()
    );
    if args.foreground {
        return run_daemon_foreground(&conf_path);
    }
    let pid = start_background(&conf_path)?;
    wait_ready(&conf_path, &EntityName::client("admin"))?;
    println!(
        "  daemon:         running, pid {pid} (log {})",
        dir.join(LOG_FILE).display()
    );
    println!();
    println!("Next steps:");
    println!("  export CAIRN_CONF={}", conf_path.display());
    println!("  cairn status");
    println!("  To add a monitor on another node (keep this token secret, it holds the mon key):");
    println!("    cairn join {token} --mon-ip <THAT_NODE_IP> --name <NAME>");
    println!(
        "  Stop this node: cairn daemon stop --data {}",
        dir.display()
    );
    Ok(())
}

/// `cairn join TOKEN`.
pub fn join(args: JoinArgs, _global: &GlobalArgs) -> Result<()> {
    let token = JoinToken::decode(&args.token).map_err(|e| anyhow!(e))?;
    let addr = parse_mon_ip(&args.mon_ip)?;
    let name = match args.name {
        Some(n) => n,
        None => std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|h| h.trim().split('.').next().unwrap_or("").to_string())
            .filter(|h| !h.is_empty())
            .ok_or_else(|| anyhow!("cannot read the host name; pass --name NAME"))?,
    };
    let dir = prepare_dir(&args.data)?;
    save_keyring(
        &dir.join(MON_KEYRING),
        EntityName::mon(&name),
        &token.mon_secret,
        &[("mon", "allow *")],
    )?;
    let mut mon_host = token.mon_host.clone();
    if !mon_host.contains(&addr.to_string()) {
        mon_host.push(addr.to_string());
    }
    let conf_path = write_node_conf(&dir, &token.fsid, &mon_host, &name, addr, false)?;
    write_file_atomic(
        &dir.join(TOKEN_FILE),
        format!("{}\n", args.token.trim()).as_bytes(),
        0o600,
    )?;
    println!("Joining cluster {} as mon.{name} at {addr}.", token.fsid);
    if args.foreground {
        return run_daemon_foreground(&conf_path);
    }
    let pid = start_background(&conf_path)?;
    wait_ready(&conf_path, &EntityName::mon(&name))?;
    println!(
        "mon.{name} is in the monitor quorum; daemon pid {pid} (log {}).",
        dir.join(LOG_FILE).display()
    );
    println!(
        "Admin nodes pick up the new mon address automatically in their data dir's cairn.conf;"
    );
    println!("copy client.admin.keyring here to run admin commands from this node.");
    Ok(())
}

/// `cairn daemon [stop]`.
pub fn run(args: DaemonArgs, global: &GlobalArgs) -> Result<()> {
    match args.action {
        Some(DaemonAction::Stop { data }) => {
            let dir = match data {
                Some(d) => d,
                None => conf_dir(&conf_path(global)?),
            };
            stop(&dir)
        }
        None => {
            let conf = conf_path(global)?;
            if args.foreground {
                run_daemon_foreground(&conf)
            } else {
                let pid = start_background(&conf)?;
                let c = Conf::load(&conf)?;
                let name = c.get("mon", "mon_name").unwrap_or("a").to_string();
                wait_ready(&conf, &EntityName::mon(&name))?;
                println!("cairn daemon started, pid {pid}");
                Ok(())
            }
        }
    }
}

fn conf_path(global: &GlobalArgs) -> Result<PathBuf> {
    let p = crate::conn::find_conf(global.conf.as_deref())?;
    p.canonicalize()
        .with_context(|| format!("config file {}", p.display()))
}

fn conf_dir(conf: &Path) -> PathBuf {
    conf.parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

pub fn pid_alive(pid: u32) -> bool {
    // A zombie still has /proc/PID; treat it as gone.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

pub fn read_pid(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join(PID_FILE))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

pub fn stop(dir: &Path) -> Result<()> {
    let Some(pid) = read_pid(dir) else {
        bail!(
            "no cairn daemon is running from {} (no {PID_FILE})",
            dir.display()
        );
    };
    if !pid_alive(pid) {
        let _ = std::fs::remove_file(dir.join(PID_FILE));
        bail!(
            "the daemon of {} (pid {pid}) is not running; removed the stale pid file",
            dir.display()
        );
    }
    let status = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status()
        .context("running kill")?;
    if !status.success() {
        bail!("could not signal pid {pid} (kill exited with {status})");
    }
    let start = Instant::now();
    while pid_alive(pid) {
        if start.elapsed() > STOP_TIMEOUT {
            bail!(
                "pid {pid} is still running {STOP_TIMEOUT:?} after SIGTERM; check {}",
                dir.join(LOG_FILE).display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "stopped cairn daemon (pid {pid}) in {:.1}s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

pub fn start_background(conf: &Path) -> Result<u32> {
    use std::os::unix::process::CommandExt;
    let dir = conf_dir(conf);
    if let Some(pid) = read_pid(&dir) {
        if pid_alive(pid) {
            bail!(
                "a cairn daemon already runs from {} (pid {pid})",
                dir.display()
            );
        }
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(LOG_FILE))
        .with_context(|| format!("opening {}", dir.join(LOG_FILE).display()))?;
    let exe = std::env::current_exe().context("finding the cairn binary")?;
    let child = std::process::Command::new(exe)
        .arg("-c")
        .arg(conf)
        .arg("daemon")
        .arg("--foreground")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("starting the daemon")?;
    Ok(child.id())
}

/// Waits until the node's mon answers `mon stat` as `who`.
pub fn wait_ready(conf: &Path, who: &EntityName) -> Result<()> {
    let c = Conf::load(conf)?;
    let addr = c
        .get("mon", "mon_addr")
        .ok_or_else(|| anyhow!("{}: no mon_addr in [mon]", conf.display()))?;
    let addrs = parse_mon_host(addr).map_err(|e| anyhow!("{e}"))?;
    let secret = if who.kind == cairn_types::EntityKind::Mon {
        mon_secret(conf, &c)?
    } else {
        let ring = Keyring::load(&conf_dir(conf).join(ADMIN_KEYRING))?;
        ring.get(who)
            .map(|e| e.secret.clone())
            .ok_or_else(|| anyhow!("no key for {who}"))?
    };
    let client = MonClient::new(
        addrs,
        Credentials::Key {
            name: who.clone(),
            secret,
        },
        DAEMON_READY_TIMEOUT,
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let deadline = Instant::now() + DAEMON_READY_TIMEOUT;
    let me = c.get("mon", "mon_name").unwrap_or("a").to_string();
    // Ready = this mon answers and counts itself and a majority in quorum
    // (the peers it heard from within the last pings).
    loop {
        let reply = rt
            .block_on(client.command(&MonCommand::QuorumStatus))
            .map_err(|e| {
                anyhow!(
                    "the daemon did not become ready: {e}; see {}",
                    conf_dir(conf).join(LOG_FILE).display()
                )
            })?;
        let names = reply.json["quorum_names"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mons = reply.json["monmap"]["mons"]
            .as_array()
            .map(Vec::len)
            .unwrap_or(0);
        let in_quorum = names.iter().any(|n| n.as_str() == Some(me.as_str()));
        if in_quorum && names.len() * 2 > mons {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "mon.{me} answers but is not in a quorum after {DAEMON_READY_TIMEOUT:?}; see {}",
                conf_dir(conf).join(LOG_FILE).display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn mon_secret(conf_path: &Path, conf: &Conf) -> Result<Secret> {
    let name = conf.get("mon", "mon_name").unwrap_or("a");
    let ring_path = conf_dir(conf_path).join(conf.get("mon", "mon_keyring").unwrap_or(MON_KEYRING));
    let ring = Keyring::load(&ring_path)?;
    ring.get(&EntityName::mon(name))
        .map(|e| e.secret.clone())
        .ok_or_else(|| anyhow!("{} has no key for mon.{name}", ring_path.display()))
}

/// Closes descriptors above stderr inherited from whoever started us (a
/// wrapper such as `faketime` leaves pipes open and waits for them to
/// close). Called first thing in the daemon, before anything opens a file.
fn close_inherited_fds() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let fds: Vec<i32> = match std::fs::read_dir("/proc/self/fd") {
        Ok(dir) => dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter(|fd| *fd > 2)
            .collect(),
        Err(_) => return,
    };
    // The directory handle used for the listing is closed by now; closing
    // its number fails harmlessly (EBADF) only if it was not reused.
    for fd in fds {
        if std::fs::read_link(format!("/proc/self/fd/{fd}")).is_ok() {
            // SAFETY: nothing in this process owns these descriptors yet:
            // they were inherited across exec and no code has opened files.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
}

/// Runs this node's roles until SIGTERM/SIGINT.
fn run_daemon_foreground(conf_path: &Path) -> Result<()> {
    close_inherited_fds();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CAIRN_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
    let conf = Conf::load(conf_path)?;
    let dir = conf_dir(conf_path);
    let name = conf
        .get("mon", "mon_name")
        .ok_or_else(|| {
            anyhow!(
                "{}: this node runs no role (no mon_name in [mon])",
                conf_path.display()
            )
        })?
        .to_string();
    let addr = parse_mon_ip(
        conf.get("mon", "mon_addr")
            .ok_or_else(|| anyhow!("no mon_addr in [mon]"))?,
    )?;
    let data = conf
        .get("mon", "mon_data")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.join("mon"));
    let join_via = conf
        .get("global", "mon_host")
        .map(|h| parse_mon_host(h).unwrap_or_default())
        .unwrap_or_default();
    let mut key_files = vec![dir.join(MON_KEYRING)];
    if dir.join(ADMIN_KEYRING).exists() {
        key_files.push(dir.join(ADMIN_KEYRING));
    }
    let cfg = MonConfig {
        name,
        addr,
        data_dir: data,
        mon_secret: mon_secret(conf_path, &conf)?,
        join_via,
        conf_path: Some(conf_path.to_path_buf()),
        key_files,
        timing: RaftTiming::default(),
    };
    let pid_path = dir.join(PID_FILE);
    write_file_atomic(
        &pid_path,
        format!("{}\n", std::process::id()).as_bytes(),
        0o644,
    )?;
    let osd_ip = crate::osdhost::bind_ip(&conf);
    let mon_client = Arc::new(MonClient::new(
        cfg.join_via.iter().copied().chain([addr]).collect(),
        Credentials::Key {
            name: EntityName::mon(&cfg.name),
            secret: cfg.mon_secret.clone(),
        },
        Duration::from_secs(10),
    ));
    let rt = tokio::runtime::Runtime::new()?;
    let res = rt.block_on(async {
        let (svc, listener) = MonService::start(cfg).await?;
        tracing::info!(
            "cairn daemon pid {} serving mon on {}",
            std::process::id(),
            listener.local_addr()
        );
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mon_addrs = conf
            .get("global", "mon_host")
            .and_then(|h| parse_mon_host(h).ok())
            .unwrap_or_else(|| vec![addr]);
        let osds = tokio::spawn(crate::osdhost::run(
            dir.clone(),
            Arc::new(conf.clone()),
            osd_ip,
            mon_addrs,
            mon_client,
            stop_rx,
        ));
        // OSDs stop (and are marked down) before the mon goes away.
        let shutdown = async move {
            shutdown_signal().await;
            tracing::info!("stopping: OSDs first, then the mon");
            let _ = stop_tx.send(true);
            let _ = tokio::time::timeout(Duration::from_secs(20), osds).await;
        };
        svc.run(listener, shutdown).await
    });
    if read_pid(&dir) == Some(std::process::id()) {
        let _ = std::fs::remove_file(&pid_path);
    }
    res
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers, run until killed.
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
