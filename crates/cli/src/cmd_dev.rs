//! `cairn dev up|down`: a one-machine cluster for trying Cairn — one mon
//! and N OSDs on files in one directory, failure domain `osd`, a
//! replicated pool `rbd` — run by one background node daemon. `dev up` on
//! an existing directory restarts it with its data.

use crate::cmd_daemon;
use crate::cmd_disk::{self, AddOpts};
use crate::conn;
use crate::GlobalArgs;
use anyhow::{anyhow, bail, Context, Result};
use cairn_map::{MonCommand, PoolKind};
use cairn_mon::{MonClient, DEFAULT_CLIENT_TIMEOUT};
use cairn_types::EntityName;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// PGs of the dev cluster's `rbd` pool.
const DEV_PG_NUM: u32 = 32;
/// How long `dev up` waits for every PG to be active+clean.
const CLEAN_TIMEOUT: Duration = Duration::from_secs(120);
/// How often `dev up` asks the monitors for PG states while it waits.
const CLEAN_POLL: Duration = Duration::from_millis(100);

#[derive(Debug, clap::Args)]
pub struct DevArgs {
    #[command(subcommand)]
    pub action: DevAction,
}

#[derive(Debug, clap::Subcommand)]
pub enum DevAction {
    /// Start (or restart) a one-machine cluster in DIR.
    Up {
        /// Directory of the dev cluster (default $XDG_DATA_HOME/cairn/dev, else ~/.local/share/cairn/dev).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Number of OSDs (only when creating).
        #[arg(long, default_value_t = 3)]
        osds: u32,
        /// Size of each OSD's data file (only when creating).
        #[arg(long, default_value = "10G")]
        osd_size: String,
        /// Return once the cluster is up instead of showing a live status line.
        #[arg(long)]
        detach: bool,
    },
    /// Stop the dev cluster's daemon.
    Down {
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

pub fn run(args: DevArgs, _global: &GlobalArgs) -> Result<()> {
    match args.action {
        DevAction::Up {
            dir,
            osds,
            osd_size,
            detach,
        } => up(
            &dir.unwrap_or_else(conn::default_dev_dir),
            osds,
            &osd_size,
            detach,
        ),
        DevAction::Down { dir } => {
            let dir = dir.unwrap_or_else(conn::default_dev_dir);
            cmd_daemon::stop(&dir)
        }
    }
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

fn admin(conf: &Path) -> Result<MonClient> {
    let creds = conn::credentials(conf, &EntityName::client("admin"), None)?;
    conn::mon_client(conf, creds, DEFAULT_CLIENT_TIMEOUT)
}

fn up(dir: &Path, osds: u32, osd_size: &str, detach: bool) -> Result<()> {
    let t0 = Instant::now();
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir
        .canonicalize()
        .with_context(|| format!("resolving {}", dir.display()))?;
    let conf = dir.join("cairn.conf");
    let fresh = !conf.exists();
    if !fresh && cmd_disk::daemon_running(&dir) {
        bail!(
            "the dev cluster in {} is already running; 'cairn dev down --dir {}' stops it",
            dir.display(),
            dir.display()
        );
    }
    let size = cmd_disk::parse_size(osd_size)?;
    if fresh {
        if !(1..=64).contains(&osds) {
            bail!("--osds {osds}: use 1..64");
        }
        check_free_space(&dir, osds, size)?;
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()?));
        cmd_daemon::create_cluster(&dir, "a", addr, "osd")?;
    }
    let pid = cmd_daemon::start_background(&conf)?;
    let stop_on_err = |e: anyhow::Error| {
        let _ = cmd_daemon::stop(&dir);
        e
    };
    cmd_daemon::wait_ready(&conf, &EntityName::client("admin")).map_err(stop_on_err)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if fresh {
        rt.block_on(create_osds_and_pools(&conf, &dir, osds, size))
            .map_err(stop_on_err)?;
    }
    let clean = rt.block_on(wait_clean(&conf, CLEAN_TIMEOUT));
    if clean.is_ok() {
        // Reported states are the OSDs' own; prove them by writing to every
        // PG of `rbd` once, and say plainly if some PG does not serve I/O.
        let stuck = rt.block_on(probe_pgs(&conf)).unwrap_or_default();
        if !stuck.is_empty() {
            println!(
                "  warning: {} PGs report active+clean but did not answer a probe write within {}s ({}…); \
                 ops on them will time out; see {}",
                stuck.len(),
                PROBE_TIMEOUT.as_secs(),
                stuck.iter().take(4).cloned().collect::<Vec<_>>().join(", "),
                dir.join("daemon.log").display()
            );
        }
    }
    let pid = cmd_disk::daemon_pid(&dir).unwrap_or(pid);
    let took = t0.elapsed().as_secs_f64();
    match &clean {
        Ok(n) => println!(
            "dev cluster up: {n} PGs active+clean {took:.1}s after 'dev up' (daemon pid {pid})"
        ),
        Err(e) => {
            println!("dev cluster started (daemon pid {pid}) but not clean after {took:.1}s: {e:#}")
        }
    }
    println!("  data:    {}", dir.display());
    println!("  log:     {}", dir.join("daemon.log").display());
    println!("  talk to it:  export CAIRN_CONF={}", conf.display());
    if dir == conn::default_dev_dir().canonicalize().unwrap_or_default() {
        println!("               (without CAIRN_CONF the CLI finds this dev cluster by itself)");
    }
    println!("  try:     cairn -s; cairn rados -p rbd put hello /etc/hostname; cairn rados -p rbd bench 10 write");
    if detach {
        println!("  stop:    cairn dev down --dir {}", dir.display());
        return Ok(());
    }
    println!("Ctrl-C stops the cluster.");
    rt.block_on(status_loop(&conf, &dir));
    println!();
    cmd_daemon::stop(&dir)
}

/// How long one PG may take to answer the probe write.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Writes and removes one object in every PG of `rbd` and (when it exists)
/// `ec21`; returns the PGs that did not answer within `PROBE_TIMEOUT`.
async fn probe_pgs(conf: &Path) -> Result<Vec<String>> {
    let s = conn::Session::connect(Some(conf), None).await?;
    let map = s.rados.map();
    let mut stuck = Vec::new();
    for pool in map
        .pools
        .values()
        .filter(|p| p.name == "rbd" || p.name == "ec21")
    {
        let io = s.rados.ioctx(&pool.name)?;
        stuck.extend(probe_pool(&io, pool.pg_num, pool.id).await);
    }
    Ok(stuck)
}

/// Writes and removes one object in every PG of one pool.
async fn probe_pool(io: &cairn_client::IoCtx, pg_num: u32, pool_id: u64) -> Vec<String> {
    let mask = pg_num.next_power_of_two() - 1;
    let mut names: Vec<Option<String>> = vec![None; pg_num as usize];
    let mut i = 0u64;
    while names.iter().any(Option::is_none) && i < 1_000_000 {
        let n = format!("cairn-dev-probe.{i}");
        let seed = cairn_map::stable_mod(cairn_ops::object_hash("", &n), pg_num, mask);
        if let Some(slot) = names.get_mut(seed as usize) {
            slot.get_or_insert(n);
        }
        i += 1;
    }
    let mut tasks = Vec::new();
    for (seed, name) in names.into_iter().enumerate() {
        let Some(name) = name else { continue };
        let io = io.clone();
        tasks.push(tokio::spawn(async move {
            let ok = tokio::time::timeout(PROBE_TIMEOUT, async {
                io.write_full(&name, b"probe".to_vec()).await?;
                io.remove(&name).await
            })
            .await
            .map(|r| r.is_ok())
            .unwrap_or(false);
            (seed, ok)
        }));
    }
    let mut stuck = Vec::new();
    for t in tasks {
        if let Ok((seed, false)) = t.await {
            stuck.push(format!("{pool_id}.{seed:x}"));
        }
    }
    stuck
}

/// Registers the OSDs and creates their stores one after the other (so
/// `osd-N.img` holds osd.N) without waiting for each to boot (the daemon
/// starts each as soon as its record appears), then waits until all are up.
/// Each OSD file reserves its whole size up front (so a full disk shows up
/// as a clean "pool full" error, not as failed writes), so a fresh dev
/// cluster needs `osds × size` free bytes: say so before creating anything.
fn check_free_space(dir: &Path, osds: u32, size: u64) -> Result<()> {
    let need = u64::from(osds) * size;
    let free = free_bytes(dir)?;
    if free < need {
        bail!(
            "{} has {} free but {osds} OSDs of {} need {} (each OSD file reserves its size); \
             pass a smaller --osd-size (e.g. --osd-size {}G) or another --dir",
            dir.display(),
            cmd_disk::human_bytes(free),
            cmd_disk::human_bytes(size),
            cmd_disk::human_bytes(need),
            ((free / u64::from(osds) / 2) >> 30).max(1),
        );
    }
    Ok(())
}

/// Bytes an unprivileged writer may still use on the filesystem of `dir`.
fn free_bytes(dir: &Path) -> Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .with_context(|| format!("{} contains a NUL byte", dir.display()))?;
    // SAFETY: statvfs writes into a zeroed struct we own; the path is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("statvfs {}", dir.display()));
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

async fn create_osds(conf: &Path, dir: &Path, osds: u32, size: u64) -> Result<()> {
    let mut ids = Vec::new();
    for i in 0..osds {
        let opts = AddOpts {
            path: dir.join(format!("osd-{i}.img")),
            class: None,
            weight: None,
            size: Some(size),
            host: cmd_disk::hostname(),
            file: true,
            meta_path: None,
            discard: false,
        };
        let rec = cmd_disk::add(conf, dir, opts, false).await?;
        println!("  osd.{} on {}", rec.id, rec.device.display());
        ids.push(rec.id);
    }
    cmd_disk::wait_all_up(&admin(conf)?, &ids).await
}

async fn create_osds_and_pools(conf: &Path, dir: &Path, osds: u32, size: u64) -> Result<()> {
    // The OSD files are preallocated, never written: let the OSDs zero them
    // while idle, so writes land on written blocks (read at OSD start).
    admin(conf)?
        .command(&MonCommand::ConfigSet {
            who: "osd".into(),
            key: "osd_zero_unwritten".into(),
            value: "true".into(),
            force: false,
        })
        .await
        .map_err(|e| anyhow!("config set osd_zero_unwritten: {e}"))?;
    create_osds(conf, dir, osds, size).await?;
    let mon = admin(conf)?;
    let size_n = osds.min(3);
    // Set the defaults before creating the pool: changing size right after
    // creation makes every PG re-peer at once.
    if size_n < 3 {
        for (k, v) in [
            ("osd_pool_default_size", size_n),
            ("osd_pool_default_min_size", size_n.min(2)),
        ] {
            mon.command(&MonCommand::ConfigSet {
                who: "global".into(),
                key: k.into(),
                value: v.to_string(),
                force: false,
            })
            .await
            .map_err(|e| anyhow!("config set {k}: {e}"))?;
        }
    }
    mon.command(&MonCommand::PoolCreate {
        name: "rbd".into(),
        pg_num: Some(DEV_PG_NUM),
        pgp_num: None,
        kind: PoolKind::Replicated,
        profile: None,
        rule: None,
    })
    .await
    .map_err(|e| anyhow!("creating pool rbd: {e}"))?;
    println!("  pool 'rbd': replicated size {size_n}, {DEV_PG_NUM} PGs");
    if osds < 3 {
        println!(
            "  pool 'ec21' not created: erasure coding 2+1 needs 3 OSDs, this cluster has {osds}"
        );
        return Ok(());
    }
    mon.command(&MonCommand::EcProfileSet {
        name: "ec21".into(),
        params: vec![
            ("k".into(), "2".into()),
            ("m".into(), "1".into()),
            ("crush-failure-domain".into(), "osd".into()),
        ],
        force: false,
    })
    .await
    .map_err(|e| anyhow!("creating erasure-code profile ec21: {e}"))?;
    mon.command(&MonCommand::PoolCreate {
        name: "ec21".into(),
        pg_num: Some(DEV_PG_NUM),
        pgp_num: None,
        kind: PoolKind::Erasure,
        profile: Some("ec21".into()),
        rule: None,
    })
    .await
    .map_err(|e| anyhow!("creating pool ec21: {e}"))?;
    println!("  pool 'ec21': erasure-coded k=2 m=1 (failure domain osd), {DEV_PG_NUM} PGs");
    Ok(())
}

/// One status line: epoch, OSDs up/in, PG states (from the monitors' PG
/// statistics).
async fn status_line(mon: &MonClient) -> Result<(String, usize, usize)> {
    let sub = mon.subscribe().await.map_err(|e| anyhow!("{e}"))?;
    let map = sub.map;
    let stat = mon
        .command(&cairn_map::MonCommand::PgStat)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let n = stat.json["num_pgs"].as_u64().unwrap_or(0) as usize;
    let by: std::collections::BTreeMap<String, usize> =
        serde_json::from_value(stat.json["by_state"].clone()).unwrap_or_default();
    let up = map.osds.values().filter(|o| o.up).count();
    let inn = map.osds.values().filter(|o| o.is_in).count();
    let clean = by.get("active+clean").copied().unwrap_or(0);
    let parts: Vec<String> = by.iter().map(|(s, c)| format!("{c} {s}")).collect();
    Ok((
        format!(
            "e{} osd: {}/{} up, {inn} in; pgs: {n}{}{}",
            map.epoch.0,
            up,
            map.osds.len(),
            if parts.is_empty() { "" } else { " " },
            parts.join(", ")
        ),
        n,
        clean,
    ))
}

async fn wait_clean(conf: &Path, timeout: Duration) -> Result<usize> {
    let mon = admin(conf)?;
    let start = Instant::now();
    let mut last;
    loop {
        match status_line(&mon).await {
            Ok((_, n, clean)) if n > 0 && clean == n => return Ok(n),
            Ok((line, _, _)) => last = line,
            Err(e) => last = e.to_string(),
        }
        if start.elapsed() > timeout {
            bail!("after {timeout:?}: {last}");
        }
        tokio::time::sleep(CLEAN_POLL).await;
    }
}

async fn status_loop(conf: &Path, dir: &Path) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return;
    };
    let Ok(mon) = admin(conf) else {
        return;
    };
    loop {
        let line = match status_line(&mon).await {
            Ok((l, _, _)) => l,
            Err(e) => format!("status: {e}"),
        };
        print!("\r\x1b[2K[cairn dev] {line}");
        let _ = std::io::stdout().flush();
        if !cmd_disk::daemon_running(dir) {
            println!(
                "\nthe daemon stopped; see {}",
                dir.join("daemon.log").display()
            );
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = int.recv() => return,
            _ = term.recv() => return,
        }
    }
}
