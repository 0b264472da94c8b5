//! `cairn disk add|ls|zap`: turning a directory, file or block device into an OSD of this
//! node (register with the monitors, create the store, record it so the
//! node daemon runs it), listing them, and wiping one. The daemon side
//! (running the recorded OSDs) is `osdhost`.

use crate::conn;
use crate::osdhost::{OsdRecord, OSDS_DIR};
use crate::GlobalArgs;
use anyhow::{anyhow, bail, Context, Result};
use cairn_map::MonCommand;
use cairn_mon::{MonClient, DEFAULT_CLIENT_TIMEOUT};
use cairn_msg::Keyring;
use cairn_store::Store;
use cairn_types::EntityName;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Data size of a new directory or file OSD when `--size` is not given.
pub const DEFAULT_OSD_BYTES: u64 = 10 << 30;
const TIB: f64 = (1u64 << 40) as f64;
/// How long `disk add` waits for a running daemon to bring the OSD up.
const UP_WAIT: Duration = Duration::from_secs(60);

#[derive(Debug, clap::Args)]
pub struct DiskArgs {
    #[command(subcommand)]
    pub action: DiskAction,
}

#[derive(Debug, clap::Subcommand)]
pub enum DiskAction {
    /// Create an OSD on a directory, file or block device and register it with the monitors.
    Add {
        /// A directory (created if missing), a file (created with --size if missing), or a
        /// block device (used whole; must hold no filesystem or partition table).
        path: PathBuf,
        /// Device class; detected from the device under PATH when not given.
        #[arg(long, value_parser = ["hdd", "ssd", "nvme"])]
        class: Option<String>,
        /// CRUSH weight in TiB (default: the data size in TiB).
        #[arg(long)]
        weight: Option<f64>,
        /// Data size, e.g. 10G (default 10G; an existing non-empty file is refused).
        #[arg(long)]
        size: Option<String>,
        /// CRUSH host of the OSD (default: this machine's host name).
        #[arg(long)]
        host: Option<String>,
        /// Node data dir whose daemon runs the OSD (default: the config file's directory).
        #[arg(long)]
        data: Option<PathBuf>,
        /// Make PATH a file of --size even when it does not exist yet.
        #[arg(long)]
        file: bool,
        /// Directory (created if missing) for the OSD's metadata and write-ahead log,
        /// e.g. on a faster device than PATH; the data stays on PATH.
        #[arg(long)]
        meta_path: Option<PathBuf>,
        /// Give space freed by deletes back to the device or the file's
        /// filesystem (discard / punch holes; Ceph's bdev_enable_discard), for
        /// thin-provisioned or sparse backing storage. Off by default: freed
        /// blocks stay written, which later writes find faster.
        #[arg(long)]
        discard: bool,
    },
    /// List this node's OSDs.
    Ls {
        #[arg(long)]
        data: Option<PathBuf>,
    },
    /// Wipe the OSD on PATH (refused while its OSD is in the map, unless purged).
    Zap {
        path: PathBuf,
        #[arg(long)]
        data: Option<PathBuf>,
    },
}

/// Parses `10G`, `512M`, `1T`, `4096` (binary units).
pub fn parse_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                'B' => 1,
                _ => bail!("size '{text}': unknown unit '{c}' (use K, M, G or T)"),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| anyhow!("size '{text}' is not a number with an optional K/M/G/T unit"))?;
    if !(n.is_finite() && n > 0.0) {
        bail!("size '{text}' must be positive");
    }
    Ok((n * mult as f64) as u64)
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().split('.').next().unwrap_or("").to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Class of the device holding `path` (a block device or anything on a filesystem).
pub fn detect_class(path: &Path) -> Option<String> {
    let md = std::fs::metadata(path).ok()?;
    let dev = if md.file_type().is_block_device() {
        md.rdev()
    } else {
        md.dev()
    };
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let link = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    let name = link.file_name()?.to_str()?.to_string();
    if name.starts_with("nvme") {
        return Some("nvme".into());
    }
    for c in [
        link.join("queue/rotational"),
        link.join("../queue/rotational"),
    ] {
        if let Ok(t) = std::fs::read_to_string(&c) {
            return Some(if t.trim() == "1" { "hdd" } else { "ssd" }.into());
        }
    }
    None
}

fn node_dir(global: &GlobalArgs, data: Option<PathBuf>) -> Result<(PathBuf, PathBuf)> {
    let conf = conn::find_conf(global.conf.as_deref())?;
    let conf = conf
        .canonicalize()
        .with_context(|| format!("config file {}", conf.display()))?;
    let dir = match data {
        Some(d) => d
            .canonicalize()
            .with_context(|| format!("node data dir {}", d.display()))?,
        None => conn::conf_dir(&conf),
    };
    Ok((conf, dir))
}

pub fn run(args: DiskArgs, global: &GlobalArgs) -> Result<()> {
    match args.action {
        DiskAction::Add {
            path,
            class,
            weight,
            size,
            host,
            data,
            file,
            meta_path,
            discard,
        } => {
            let (conf, dir) = node_dir(global, data)?;
            let size = size.as_deref().map(parse_size).transpose()?;
            let opts = AddOpts {
                path,
                class,
                weight,
                size,
                host: host.unwrap_or_else(hostname),
                file,
                meta_path,
                discard,
            };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let rec = rt.block_on(add(&conf, &dir, opts, true))?;
            println!(
                "osd.{} created on {} ({}, {} class {}, weight {:.4})",
                rec.id,
                rec.device.display(),
                rec.kind,
                human_bytes(rec.data_bytes),
                rec.class,
                rec.weight
            );
            Ok(())
        }
        DiskAction::Ls { data } => {
            let (_, dir) = node_dir(global, data)?;
            ls(&dir, global.format != crate::OutputFormat::Plain)
        }
        DiskAction::Zap { path, data } => {
            let (conf, dir) = node_dir(global, data)?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(zap(&conf, &dir, &path))
        }
    }
}

pub fn human_bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

pub struct AddOpts {
    pub path: PathBuf,
    pub class: Option<String>,
    pub weight: Option<f64>,
    pub size: Option<u64>,
    pub host: String,
    pub file: bool,
    /// Where the store's metadata and WAL go (default: beside the data).
    pub meta_path: Option<PathBuf>,
    /// Punch/discard freed space (`--discard`).
    pub discard: bool,
}

/// What kind of disk PATH is, and its data size.
fn classify(o: &AddOpts) -> Result<(String, u64)> {
    match std::fs::metadata(&o.path) {
        Ok(md) if md.is_dir() => {
            if o.path.join(cairn_store::DATA_FILE).exists() {
                bail!(
                    "{} already holds a store; 'cairn disk zap {}' wipes it",
                    o.path.display(),
                    o.path.display()
                );
            }
            Ok(("dir".into(), o.size.unwrap_or(DEFAULT_OSD_BYTES)))
        }
        Ok(md) if md.file_type().is_block_device() => {
            if o.size.is_some() {
                bail!(
                    "{} is a block device: the store takes all of it; drop --size",
                    o.path.display()
                );
            }
            // Opened exclusively: fails while it is mounted or in use.
            use cairn_store::device::StoreFile;
            let dev = cairn_store::device::OsFile::open(&o.path, false)
                .with_context(|| format!("opening {}", o.path.display()))?;
            let bytes = dev
                .len()
                .with_context(|| format!("size of {}", o.path.display()))?;
            Ok(("device".into(), bytes))
        }
        Ok(md) if md.is_file() => {
            if md.len() > 0 {
                bail!(
                    "{} is a non-empty file; 'cairn disk zap {}' it first, or give a new path",
                    o.path.display(),
                    o.path.display()
                );
            }
            Ok(("file".into(), o.size.unwrap_or(DEFAULT_OSD_BYTES)))
        }
        Ok(_) => bail!("{} is neither a directory nor a file", o.path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let kind = if o.file { "file" } else { "dir" };
            Ok((kind.into(), o.size.unwrap_or(DEFAULT_OSD_BYTES)))
        }
        Err(e) => Err(e).with_context(|| format!("inspecting {}", o.path.display())),
    }
}

fn absolute(p: &Path) -> Result<PathBuf> {
    if p.is_absolute() {
        Ok(p.to_path_buf())
    } else {
        Ok(std::env::current_dir()?.join(p))
    }
}

/// `disk add`: register, create the store, record it; with `wait`, wait for
/// a running daemon to bring it up.
pub async fn add(conf: &Path, node: &Path, o: AddOpts, wait: bool) -> Result<OsdRecord> {
    let (kind, data_bytes) = classify(&o)?;
    let device = absolute(&o.path)?;
    let meta_path = o.meta_path.as_deref().map(check_meta_path).transpose()?;
    let probe = if kind == "dir" {
        std::fs::create_dir_all(&device)
            .with_context(|| format!("creating {}", device.display()))?;
        device.clone()
    } else if kind == "device" {
        device.clone()
    } else {
        device
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/"))
    };
    let class = o
        .class
        .clone()
        .or_else(|| detect_class(&probe))
        .unwrap_or_else(|| "hdd".into());
    let weight = o.weight.unwrap_or(data_bytes as f64 / TIB);
    if !(weight.is_finite() && weight > 0.0) {
        bail!("weight {weight} must be positive");
    }
    let admin = conn::credentials(conf, &EntityName::client("admin"), None)?;
    let mon = MonClient::new(conn::mon_addrs(conf)?, admin, DEFAULT_CLIENT_TIMEOUT);
    let uuid = crate::cmd_daemon::new_fsid();
    let r = mon
        .command(&MonCommand::OsdNew {
            uuid: uuid.clone(),
            id: None,
            host: o.host.clone(),
            weight,
            class: Some(class.clone()),
        })
        .await
        .map_err(|e| anyhow!("registering the OSD with the monitors: {e}"))?;
    let id = r.json["osdid"]
        .as_i64()
        .ok_or_else(|| anyhow!("the monitors answered 'osd new' without an id: {}", r.json))?
        as i32;
    let target = StoreTarget {
        kind: &kind,
        device: &device,
        meta_path: meta_path.as_deref(),
        data_bytes,
        discard: o.discard,
    };
    match create_store(
        conf, node, &mon, id, &uuid, &target, &class, weight, &o.host,
    )
    .await
    {
        Ok(rec) => {
            if wait && daemon_running(node) {
                wait_up(&mon, id).await?;
            } else if wait {
                eprintln!(
                    "osd.{id} will start with the node daemon ('cairn daemon -c {}')",
                    conf.display()
                );
            }
            Ok(rec)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(OsdRecord::dir(node, id));
            // check_meta_path saw no metadata there: whatever is now is ours.
            if let Some(m) = &meta_path {
                for f in [cairn_store::META_FILE, cairn_store::WAL_FILE] {
                    let _ = std::fs::remove_file(m.join(f));
                }
            }
            let purge = MonCommand::OsdPurge { id, sure: true };
            let undo = match mon.command(&purge).await {
                Ok(_) => format!("osd.{id} was purged again"),
                Err(pe) => format!(
                    "purging osd.{id} failed too ({pe}); run 'cairn osd purge {id} --yes-i-really-mean-it'"
                ),
            };
            Err(e.context(undo))
        }
    }
}

/// `disk add --meta-path`: an absolute directory (created if missing) that
/// holds no store metadata or WAL yet. Checked before anything is
/// registered, so a bad path changes nothing.
fn check_meta_path(p: &Path) -> Result<PathBuf> {
    let dir = absolute(p)?;
    match std::fs::metadata(&dir) {
        Ok(md) if !md.is_dir() => bail!("--meta-path {} is not a directory", dir.display()),
        Ok(_) => {
            for f in [cairn_store::META_FILE, cairn_store::WAL_FILE] {
                if dir.join(f).exists() {
                    bail!(
                        "--meta-path {} already holds a store's {f}; give each OSD its own directory",
                        dir.display()
                    );
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("inspecting {}", dir.display())),
    }
    Ok(dir)
}

/// Where a new OSD's store goes.
struct StoreTarget<'a> {
    kind: &'a str,
    device: &'a Path,
    meta_path: Option<&'a Path>,
    data_bytes: u64,
    discard: bool,
}

#[allow(clippy::too_many_arguments)]
async fn create_store(
    _conf: &Path,
    node: &Path,
    mon: &MonClient,
    id: i32,
    uuid: &str,
    target: &StoreTarget<'_>,
    class: &str,
    weight: f64,
    host: &str,
) -> Result<OsdRecord> {
    let (kind, device, data_bytes) = (target.kind, target.device, target.data_bytes);
    let r = mon
        .command(&MonCommand::AuthGet {
            entity: EntityName::osd(id),
        })
        .await
        .map_err(|e| anyhow!("fetching the key of osd.{id}: {e}"))?;
    let ring = Keyring::parse(&r.plain).map_err(|e| anyhow!("key of osd.{id}: {e}"))?;
    let osd_dir = OsdRecord::dir(node, id);
    std::fs::create_dir_all(&osd_dir).with_context(|| format!("creating {}", osd_dir.display()))?;
    let store_path = if kind == "dir" {
        device.to_path_buf()
    } else {
        let sp = osd_dir.join("store");
        std::fs::create_dir_all(&sp)?;
        // A device stays as it is (the store checks it holds nothing);
        // an empty file is replaced by the one the store preallocates.
        if kind == "file" && device.exists() {
            std::fs::remove_file(device)
                .with_context(|| format!("replacing empty file {}", device.display()))?;
        }
        std::os::unix::fs::symlink(device, sp.join(cairn_store::DATA_FILE))
            .with_context(|| format!("linking {}", device.display()))?;
        sp
    };
    let rec = OsdRecord {
        id,
        uuid: uuid.to_string(),
        device: device.to_path_buf(),
        kind: kind.to_string(),
        store_path,
        class: class.to_string(),
        weight,
        data_bytes,
        host: host.to_string(),
        meta_path: target.meta_path.map(Path::to_path_buf),
        discard: target.discard,
    };
    let cfg = rec.store_config();
    let store = tokio::task::spawn_blocking(move || Store::create(cfg))
        .await
        .map_err(|e| anyhow!("store task: {e}"))?
        .with_context(|| format!("creating the store of osd.{id} on {}", device.display()))?;
    drop(store);
    ring.save(&rec.keyring_path(node))
        .map_err(|e| anyhow!("saving the key of osd.{id}: {e}"))?;
    rec.save(node)?;
    Ok(rec)
}

/// The pid of the node's daemon if it runs.
pub fn daemon_pid(node: &Path) -> Option<u32> {
    std::fs::read_to_string(node.join("cairn.pid"))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .filter(|p| crate::cmd_daemon::pid_alive(*p))
}

pub fn daemon_running(node: &Path) -> bool {
    std::fs::read_to_string(node.join("cairn.pid"))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .map(crate::cmd_daemon::pid_alive)
        .unwrap_or(false)
}

async fn wait_up(mon: &MonClient, id: i32) -> Result<()> {
    wait_all_up(mon, &[id]).await
}

/// How often [`wait_all_up`] asks the monitors.
const UP_POLL: Duration = Duration::from_millis(100);

/// Waits (up to `UP_WAIT`) until every OSD of `ids` is up in the map.
pub async fn wait_all_up(mon: &MonClient, ids: &[i32]) -> Result<()> {
    let start = Instant::now();
    loop {
        let mut down: Vec<i32> = ids.to_vec();
        if let Ok(r) = mon.command(&MonCommand::OsdDump).await {
            let is_up = |id: i32| {
                r.json["osds"]
                    .as_array()
                    .and_then(|a| a.iter().find(|o| o["id"].as_i64() == Some(id as i64)))
                    .map(|o| o["up"].as_i64() == Some(1) || o["up"].as_bool() == Some(true))
                    .unwrap_or(false)
            };
            down.retain(|&id| !is_up(id));
            if down.is_empty() {
                return Ok(());
            }
        }
        if start.elapsed() > UP_WAIT {
            let names: Vec<String> = down.iter().map(|id| format!("osd.{id}")).collect();
            bail!(
                "{} created but not up after {UP_WAIT:?}; see the node's daemon.log",
                names.join(", ")
            );
        }
        tokio::time::sleep(UP_POLL).await;
    }
}

fn ls(node: &Path, json: bool) -> Result<()> {
    let recs = OsdRecord::load_all(node)?;
    if json {
        println!(
            "{}",
            serde_json::to_string(&recs.values().collect::<Vec<_>>())?
        );
        return Ok(());
    }
    println!(
        "{:<8} {:<6} {:<6} {:>10} {:>8}  {:<12} DEVICE",
        "OSD", "KIND", "CLASS", "SIZE", "WEIGHT", "HOST"
    );
    for r in recs.values() {
        println!(
            "{:<8} {:<6} {:<6} {:>10} {:>8.4}  {:<12} {}",
            format!("osd.{}", r.id),
            r.kind,
            r.class,
            human_bytes(r.data_bytes),
            r.weight,
            r.host,
            r.device.display()
        );
        if let Some(m) = &r.meta_path {
            println!("{:<8} metadata and WAL in {}", "", m.display());
        }
    }
    if recs.is_empty() {
        println!("(no disks under {}/{OSDS_DIR})", node.display());
    }
    Ok(())
}

async fn zap(conf: &Path, node: &Path, path: &Path) -> Result<()> {
    let device = absolute(path)?;
    let recs = OsdRecord::load_all(node)?;
    let rec = recs.values().find(|r| r.device == device).cloned();
    let admin = conn::credentials(conf, &EntityName::client("admin"), None)?;
    let mon = MonClient::new(conn::mon_addrs(conf)?, admin, DEFAULT_CLIENT_TIMEOUT);
    if let Some(r) = &rec {
        let dump = mon
            .command(&MonCommand::OsdDump)
            .await
            .map_err(|e| anyhow!("asking the monitors whether osd.{} still exists: {e}", r.id))?;
        let exists = dump.json["osds"]
            .as_array()
            .map(|a| a.iter().any(|o| o["id"].as_i64() == Some(r.id as i64)))
            .unwrap_or(true);
        if exists {
            bail!(
                "{} belongs to osd.{}, which is still in the cluster map; run 'cairn osd out {1}', wait until 'cairn -s' shows every PG active+clean, then 'cairn osd down {1}' and 'cairn osd purge {1} --yes-i-really-mean-it'",
                device.display(),
                r.id
            );
        }
    }
    // Remove the record first so a running daemon stops the OSD.
    if let Some(r) = &rec {
        std::fs::remove_dir_all(OsdRecord::dir(node, r.id))
            .with_context(|| format!("removing the record of osd.{}", r.id))?;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    if let Some(meta) = rec.as_ref().and_then(|r| r.meta_path.as_ref()) {
        for f in [cairn_store::META_FILE, cairn_store::WAL_FILE] {
            let p = meta.join(f);
            if p.exists() {
                std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
            }
        }
    }
    let md = std::fs::metadata(&device).with_context(|| format!("{}", device.display()))?;
    if md.is_dir() {
        for f in [
            cairn_store::DATA_FILE,
            cairn_store::META_FILE,
            cairn_store::WAL_FILE,
            "lock",
            "LOCK",
        ] {
            let p = device.join(f);
            if p.exists() {
                std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
            }
        }
    } else if md.file_type().is_block_device() {
        wipe_device_label(&device)?;
    } else if md.is_file() {
        std::fs::File::options()
            .write(true)
            .open(&device)?
            .set_len(0)
            .with_context(|| format!("truncating {}", device.display()))?;
    } else {
        bail!(
            "{} is not a directory, file or block device",
            device.display()
        );
    }
    match rec {
        Some(r) => println!("zapped {} (was osd.{})", device.display(), r.id),
        None => println!("zapped {}", device.display()),
    }
    Ok(())
}

/// Bytes at the start of a device that `disk zap` zeroes: the store's label
/// and every signature mkfs looks for.
const ZAP_DEVICE_BYTES: usize = 1 << 20;

/// Zeroes the start of a block device so that a new store can be made on
/// it. Opened exclusively: refused while the OSD (or anything) still has it.
fn wipe_device_label(device: &Path) -> Result<()> {
    use cairn_store::device::{OsFile, StoreFile};
    let dev = OsFile::open(device, false).with_context(|| {
        format!(
            "opening {} (if its OSD is still stopping, retry in a moment)",
            device.display()
        )
    })?;
    let n = (dev.len()? as usize).min(ZAP_DEVICE_BYTES);
    dev.write_at(&vec![0u8; n], 0)
        .and_then(|_| dev.sync_data())
        .with_context(|| format!("zeroing the start of {}", device.display()))
}
