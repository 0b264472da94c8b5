//! `cairn rbd …`: block images as a user drives them (Ceph's `rbd` verbs):
//! create/ls/info/resize/rm/du/cp/export/import/status/lock, `serve` over
//! NBD, and `map`/`unmap`/`showmapped` for a host block device. The image
//! logic lives in cairn-rbd; this module parses, prints, shows progress and
//! runs the detached map helper. `snap …`, `clone` and `flatten` drive
//! cairn-rbd's snapshots (ids allocated by the monitors); `export` and
//! `serve` take `IMAGE@SNAP`.

use crate::conn::{find_conf, Session};
use crate::{GlobalArgs, OutputFormat};
use anyhow::{anyhow, bail, Context, Result};
use cairn_nbd::{Export, NbdServer, ServerConfig};
use cairn_rbd::map::{self, MapKind, Mapping};
use cairn_rbd::{CreateOptions, Listener, Rbd, RbdError, ServeOptions};
use clap::{Args, Subcommand};
use serde_json::json;
use std::io::IsTerminal;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Pool used when an image spec names none (as in Ceph).
pub const DEFAULT_POOL: &str = "rbd";
/// Default NBD listen address of `rbd serve`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:10809";
/// How long `map` waits for its helper to have the image open and mounted.
const MAP_READY_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Args)]
#[command(
    after_help = "Images are named [POOL/]NAME (default pool 'rbd'). Sizes take K/M/G/T suffixes; \
a bare number is MiB, as in Ceph's rbd. Snapshots are IMAGE@SNAP (export, serve, snap …, clone)."
)]
pub struct RbdArgs {
    /// Pool of image names given without one (default: rbd).
    #[arg(short = 'p', long = "pool", global = true)]
    pool: Option<String>,
    #[command(subcommand)]
    cmd: RbdCmd,
}

#[derive(Debug, Subcommand)]
enum RbdCmd {
    /// Create an image: create [POOL/]NAME --size 10G [--object-size 4M] [--data-pool POOL].
    Create {
        /// [POOL/]NAME
        image: String,
        /// Image size: K/M/G/T suffix; a bare number is MiB.
        #[arg(short = 's', long)]
        size: String,
        /// Power of two, 4K..32M (default 4M).
        #[arg(long)]
        object_size: Option<String>,
        /// Pool for the data objects (default: the image's pool).
        #[arg(long)]
        data_pool: Option<String>,
    },
    /// List images: ls [POOL] [-l].
    #[command(alias = "list")]
    Ls {
        pool: Option<String>,
        /// Size, format and lock holder of each image.
        #[arg(short = 'l', long)]
        long: bool,
    },
    /// Show an image's size, object size, id and data pool.
    Info { image: String },
    /// Change an image's size; shrinking needs --allow-shrink.
    Resize {
        /// [POOL/]NAME
        image: String,
        /// Image size: K/M/G/T suffix; a bare number is MiB.
        #[arg(short = 's', long)]
        size: String,
        #[arg(long)]
        allow_shrink: bool,
    },
    /// Remove an image and its data (refused while it is open/locked).
    #[command(alias = "remove")]
    Rm { image: String },
    /// Provisioned and used space (allocated object bytes) of one or every image.
    Du { image: Option<String> },
    /// Copy an image (only written data is copied).
    #[command(alias = "copy")]
    Cp {
        src: String,
        dst: String,
        #[arg(long)]
        data_pool: Option<String>,
    },
    /// Export an image to FILE (sparse) or '-' (stdout).
    Export { image: String, path: String },
    /// Import FILE or '-' (stdin, needs --size) into a new image; zero ranges are skipped.
    Import {
        path: String,
        image: String,
        /// Image size (default: the file's size).
        #[arg(short = 's', long)]
        size: Option<String>,
        #[arg(long)]
        object_size: Option<String>,
        #[arg(long)]
        data_pool: Option<String>,
    },
    /// Who has the image open (its lock holder) and where it is mapped here.
    Status { image: String },
    /// The exclusive lock: lock ls IMAGE, lock break IMAGE.
    Lock {
        #[command(subcommand)]
        cmd: LockCmd,
    },
    /// Serve images over NBD until Ctrl-C: serve [POOL/]NAME... [--listen ADDR | --socket PATH].
    Serve {
        #[arg(required = true)]
        images: Vec<String>,
        /// TCP address (default 127.0.0.1:10809).
        #[arg(long, conflicts_with = "socket")]
        listen: Option<String>,
        /// Unix socket path instead of TCP.
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Take the lock even if another client holds it: that client is
        /// blocklisted first, so it cannot write any more.
        #[arg(long)]
        break_lock: bool,
    },
    /// Give this host a block device for the image; prints the device.
    Map {
        image: String,
        #[arg(long)]
        read_only: bool,
    },
    /// Undo a map: unmap DEVICE|[POOL/]NAME.
    Unmap { target: String },
    /// Images mapped on this host.
    Showmapped,
    /// Snapshots: snap create|ls|rm|rollback|protect|unprotect|purge.
    Snap {
        #[command(subcommand)]
        cmd: SnapCmd,
    },
    /// Clone a protected snapshot: clone [POOL/]IMAGE@SNAP [POOL/]CHILD.
    Clone {
        src: String,
        dst: String,
        /// Pool for the child's data objects (default: the parent's).
        #[arg(long)]
        data_pool: Option<String>,
    },
    /// Copy everything a clone reads from its parent into it and cut it loose.
    Flatten { image: String },
    /// Benchmark an image as Ceph's rbd bench does:
    /// bench [POOL/]NAME --io-type write|read [--io-size 4K] [--io-threads 16] [--io-total 1G] [--io-pattern seq|rand].
    Bench {
        image: String,
        /// write or read.
        #[arg(long)]
        io_type: String,
        /// Bytes per request (K/M/G suffix; a bare number is bytes).
        #[arg(long, default_value = "4K")]
        io_size: String,
        /// Requests in flight.
        #[arg(long, default_value_t = 16)]
        io_threads: usize,
        /// Bytes to move in all (K/M/G suffix; a bare number is bytes).
        #[arg(long, default_value = "1G")]
        io_total: String,
        /// seq or rand.
        #[arg(long, default_value = "seq")]
        io_pattern: String,
    },
    /// Internal: the detached process behind `map`.
    #[command(hide = true)]
    MapHelper {
        image: String,
        #[arg(long)]
        endpoint: PathBuf,
        #[arg(long)]
        nbd: bool,
        #[arg(long)]
        ready: PathBuf,
        #[arg(long)]
        read_only: bool,
    },
}

#[derive(Debug, Subcommand)]
enum SnapCmd {
    /// Take a snapshot: snap create [POOL/]IMAGE@SNAP (instant, consistent).
    #[command(alias = "add")]
    Create { snap: String },
    /// List an image's snapshots.
    #[command(alias = "list")]
    Ls { image: String },
    /// Remove a snapshot (refused while protected) and trim what only it kept.
    #[command(alias = "remove")]
    Rm { snap: String },
    /// Roll the image back to a snapshot (refused while the image is open).
    #[command(alias = "revert")]
    Rollback { snap: String },
    /// Protect a snapshot from removal (needed before cloning it).
    Protect { snap: String },
    /// Unprotect a snapshot (refused while clones of it exist).
    Unprotect { snap: String },
    /// Remove every unprotected snapshot of an image.
    Purge { image: String },
}

#[derive(Debug, Subcommand)]
enum LockCmd {
    /// Show the lock holder.
    #[command(alias = "list")]
    Ls { image: String },
    /// Break the lock: its holder's client instance is blocklisted first
    /// (`cairn osd blocklist ls`), so it cannot write any more.
    #[command(alias = "rm")]
    Break { image: String },
}

/// An image spec split into pool and name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Spec {
    pool: String,
    name: String,
}

impl std::fmt::Display for Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.pool, self.name)
    }
}

fn spec(text: &str, pool: Option<&str>) -> Result<Spec> {
    let (p, name) = match text.split_once('/') {
        Some((p, n)) => (p.to_string(), n.to_string()),
        None => (pool.unwrap_or(DEFAULT_POOL).to_string(), text.to_string()),
    };
    if p.is_empty() || name.is_empty() || name.contains('/') {
        bail!("image spec '{text}': expected [POOL/]NAME");
    }
    if name.contains('@') {
        bail!("image spec '{text}': this command takes an image, not a snapshot (NAME@SNAP)");
    }
    Ok(Spec { pool: p, name })
}

/// `[POOL/]IMAGE@SNAP` split into the image spec and the snapshot name.
fn snap_spec(text: &str, pool: Option<&str>) -> Result<(Spec, String)> {
    let Some((image, snap)) = text.rsplit_once('@') else {
        bail!("snapshot spec '{text}': expected [POOL/]IMAGE@SNAP");
    };
    if snap.is_empty() {
        bail!("snapshot spec '{text}': the snapshot name after '@' is empty");
    }
    Ok((spec(image, pool)?, snap.to_string()))
}

/// An image or snapshot spec; a snapshot keeps `@SNAP` in the name (what
/// cairn-rbd's read-only open takes).
fn spec_or_snap(text: &str, pool: Option<&str>) -> Result<Spec> {
    if text.contains('@') {
        let (s, snap) = snap_spec(text, pool)?;
        return Ok(Spec {
            name: format!("{}@{snap}", s.name),
            ..s
        });
    }
    spec(text, pool)
}

/// Image sizes: K/M/G/T suffixes; a bare number is MiB (as Ceph's rbd).
fn parse_image_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let bytes = if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit()) {
        t.parse::<u64>()
            .ok()
            .and_then(|m| m.checked_mul(1 << 20))
            .ok_or_else(|| anyhow!("size '{text}' is too large"))?
    } else {
        crate::cmd_disk::parse_size(t)?
    };
    if bytes == 0 || bytes % 512 != 0 {
        bail!("size '{text}' = {bytes} bytes: must be a positive multiple of 512 bytes");
    }
    Ok(bytes)
}

/// Ceph-style size: "10 GiB", "512 MiB", "4 KiB", "100 B".
fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 || v.fract() == 0.0 {
        format!("{} {}", v as u64, UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn rbd_err(spec: &Spec, e: RbdError) -> anyhow::Error {
    anyhow!("{spec}: {e}")
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

fn json_out(g: &GlobalArgs) -> bool {
    g.format != OutputFormat::Plain
}

fn print_json(g: &GlobalArgs, v: &serde_json::Value) -> Result<()> {
    let s = if g.format == OutputFormat::JsonPretty {
        serde_json::to_string_pretty(v)?
    } else {
        serde_json::to_string(v)?
    };
    println!("{s}");
    Ok(())
}

/// Blocklists clients through the monitors (`osd blocklist add`), for
/// breaking image locks.
struct MonFencer(Arc<cairn_mon::MonClient>);

impl cairn_rbd::Fencer for MonFencer {
    fn blocklist<'a>(
        &'a self,
        client: &'a cairn_map::ClientInstance,
    ) -> cairn_rbd::fence::BoxFuture<'a, std::result::Result<cairn_types::Epoch, String>> {
        Box::pin(async move {
            let cmd = cairn_map::MonCommand::OsdBlocklistAdd {
                client: client.clone(),
                expire_secs: None,
            };
            let reply = self.0.command(&cmd).await.map_err(|e| e.to_string())?;
            reply.json["epoch"]
                .as_u64()
                .map(cairn_types::Epoch)
                .ok_or_else(|| {
                    format!(
                        "the monitors answered 'osd blocklist add' with {}",
                        reply.json
                    )
                })
        })
    }
}

fn fencer(session: &Session) -> Arc<dyn cairn_rbd::Fencer> {
    Arc::new(MonFencer(session.mon_shared()))
}

/// Who this process is, for lock records: `client.admin@HOST:PID/ROLE`.
fn lock_owner(role: &str) -> String {
    format!(
        "client.admin@{}:{}/{role}",
        crate::cmd_disk::hostname(),
        std::process::id()
    )
}

/// A progress bar on stderr when it is a terminal, else nothing.
fn progress_bar(what: &str) -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let pb = indicatif::ProgressBar::new(0);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    ) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(what.to_string());
    Some(pb)
}

fn progress_fn(pb: &Option<indicatif::ProgressBar>) -> impl FnMut(u64, u64) + Send {
    let pb = pb.clone();
    move |done, total| {
        if let Some(pb) = &pb {
            pb.set_length(total);
            pb.set_position(done);
        }
    }
}

/// Runs `cairn rbd …`.
pub fn run(args: RbdArgs, g: &GlobalArgs) -> Result<()> {
    let pool = args.pool.as_deref();
    match args.cmd {
        RbdCmd::Showmapped => showmapped(g),
        RbdCmd::Unmap { target } => unmap(g, &target, pool),
        RbdCmd::Map { image, read_only } => map_image(g, &spec(&image, pool)?, read_only),
        RbdCmd::MapHelper {
            image,
            endpoint,
            nbd,
            ready,
            read_only,
        } => map_helper(g, &spec(&image, pool)?, &endpoint, nbd, &ready, read_only),
        cmd => runtime()?.block_on(run_async(cmd, pool, g)),
    }
}

async fn run_async(cmd: RbdCmd, pool: Option<&str>, g: &GlobalArgs) -> Result<()> {
    let session = Session::connect(g.conf.as_deref(), None).await?;
    let rados = &session.rados;
    let fence = fencer(&session);
    let open = |s: &Spec| -> Result<Rbd> {
        Rbd::new(rados, &s.pool)
            .map(|r| r.with_fencer(fence.clone()))
            .map_err(|e| anyhow!("pool '{}': {e}", s.pool))
    };
    match cmd {
        RbdCmd::Create {
            image,
            size,
            object_size,
            data_pool,
        } => {
            let s = spec(&image, pool)?;
            let opts = CreateOptions {
                size_bytes: parse_image_size(&size)?,
                object_size_bytes: object_size
                    .as_deref()
                    .map(crate::cmd_disk::parse_size)
                    .transpose()?,
                data_pool,
            };
            open(&s)?
                .create(&s.name, &opts)
                .await
                .map_err(|e| rbd_err(&s, e))?;
            Ok(())
        }
        RbdCmd::Ls { pool: p, long } => {
            let p = p
                .or(pool.map(str::to_string))
                .unwrap_or(DEFAULT_POOL.into());
            let rbd = Rbd::new(rados, &p).map_err(|e| anyhow!("pool '{p}': {e}"))?;
            ls(g, &rbd, long).await
        }
        RbdCmd::Info { image } => {
            let s = spec(&image, pool)?;
            info(g, &open(&s)?, &s).await
        }
        RbdCmd::Resize {
            image,
            size,
            allow_shrink,
        } => {
            let s = spec(&image, pool)?;
            resize(&open(&s)?, &s, parse_image_size(&size)?, allow_shrink).await
        }
        RbdCmd::Rm { image } => {
            let s = spec(&image, pool)?;
            open(&s)?
                .remove(&s.name)
                .await
                .map_err(|e| rbd_err(&s, e))?;
            eprintln!("Removing image: 100% complete...done.");
            Ok(())
        }
        RbdCmd::Du { image } => {
            let (rbd, names) = match image {
                Some(i) => {
                    let s = spec(&i, pool)?;
                    (open(&s)?, vec![s.name])
                }
                None => {
                    let p = pool.unwrap_or(DEFAULT_POOL);
                    let rbd = Rbd::new(rados, p).map_err(|e| anyhow!("pool '{p}': {e}"))?;
                    let names = rbd.list().await.map_err(|e| anyhow!("pool '{p}': {e}"))?;
                    (rbd, names)
                }
            };
            du(g, &rbd, &names).await
        }
        RbdCmd::Cp {
            src,
            dst,
            data_pool,
        } => {
            let (s, d) = (spec(&src, pool)?, spec(&dst, pool)?);
            let pb = progress_bar("Image copy");
            let mut cb = progress_fn(&pb);
            open(&s)?
                .copy_to(&s.name, &open(&d)?, &d.name, data_pool.as_deref(), &mut cb)
                .await
                .map_err(|e| anyhow!("copying {s} to {d}: {e}"))?;
            if let Some(pb) = &pb {
                pb.finish_and_clear();
            }
            Ok(())
        }
        RbdCmd::Snap { cmd } => snap_cmd(g, &session, pool, cmd).await,
        RbdCmd::Clone {
            src,
            dst,
            data_pool,
        } => {
            let (s, snap) = snap_spec(&src, pool)?;
            let d = spec(&dst, pool)?;
            open(&s)?
                .clone_image(&s.name, &snap, &open(&d)?, &d.name, data_pool.as_deref())
                .await
                .map_err(|e| anyhow!("cloning {s}@{snap} to {d}: {e}"))?;
            Ok(())
        }
        RbdCmd::Flatten { image } => {
            let s = spec(&image, pool)?;
            let pb = progress_bar("Image flatten");
            let mut cb = progress_fn(&pb);
            open(&s)?
                .flatten(&s.name, &mut cb)
                .await
                .map_err(|e| rbd_err(&s, e))?;
            if let Some(pb) = &pb {
                pb.finish_and_clear();
            }
            eprintln!("Image flatten: 100% complete...done.");
            Ok(())
        }
        RbdCmd::Export { image, path } => {
            let s = spec_or_snap(&image, pool)?;
            export(&open(&s)?, &s, &path).await
        }
        RbdCmd::Import {
            path,
            image,
            size,
            object_size,
            data_pool,
        } => {
            let s = spec(&image, pool)?;
            let object_size_bytes = object_size
                .as_deref()
                .map(crate::cmd_disk::parse_size)
                .transpose()?;
            import(&open(&s)?, &s, &path, size, object_size_bytes, data_pool).await
        }
        RbdCmd::Status { image } => {
            let s = spec(&image, pool)?;
            status(g, &open(&s)?, &s).await
        }
        RbdCmd::Lock { cmd } => match cmd {
            LockCmd::Ls { image } => {
                let s = spec(&image, pool)?;
                lock_ls(g, &open(&s)?, &s).await
            }
            LockCmd::Break { image } => {
                let s = spec(&image, pool)?;
                let rbd = open(&s)?;
                let broken = rbd.break_lock(&s.name).await.map_err(|e| rbd_err(&s, e))?;
                let Some(b) = broken else {
                    eprintln!("{s} was not locked");
                    return Ok(());
                };
                let owner = &b.holder.owner;
                match b.fenced {
                    cairn_rbd::Fenced::Blocklisted { client, epoch } => eprintln!(
                        "blocklisted {client} (osdmap epoch {}) and broke its lock on {s} (held by {owner});                          once that client is stopped, 'cairn osd blocklist rm {client}' lifts the blocklist",
                        epoch.0
                    ),
                    cairn_rbd::Fenced::OwnInstance => {
                        eprintln!("broke the lock of {owner} on {s} (this very client held it)")
                    }
                    cairn_rbd::Fenced::Unknown => eprintln!(
                        "broke the lock of {owner} on {s}; its lock record predates client instances,                          so it was NOT blocklisted: make sure that client is stopped"
                    ),
                }
                Ok(())
            }
        },
        RbdCmd::Serve {
            images,
            listen,
            socket,
            break_lock,
        } => serve(&session, pool, &images, listen, socket, break_lock).await,
        RbdCmd::Bench {
            image,
            io_type,
            io_size,
            io_threads,
            io_total,
            io_pattern,
        } => {
            let s = spec(&image, pool)?;
            let opts = bench_options(&io_type, &io_size, io_threads, &io_total, &io_pattern)?;
            bench(&open(&s)?, &s, &opts).await
        }
        _ => unreachable!("handled in run()"),
    }
}

async fn ls(g: &GlobalArgs, rbd: &Rbd, long: bool) -> Result<()> {
    let pool = rbd.pool_name().to_string();
    let names = rbd
        .list()
        .await
        .map_err(|e| anyhow!("pool '{pool}': {e}"))?;
    if !long {
        if json_out(g) {
            return print_json(g, &json!(names));
        }
        for n in names {
            println!("{n}");
        }
        return Ok(());
    }
    let mut rows = Vec::new();
    for n in &names {
        let h = match rbd.info(n).await {
            Ok(h) => h,
            // Removed between the listing and now.
            Err(RbdError::NotFound(_)) => continue,
            Err(e) => return Err(anyhow!("{pool}/{n}: {e}")),
        };
        let lock = rbd
            .lock_status(n)
            .await
            .map_err(|e| anyhow!("{pool}/{n}: {e}"))?;
        rows.push((h, lock));
    }
    let parent_of = |h: &cairn_rbd::ImageHeader| {
        h.parent
            .as_ref()
            .map(|p| format!("{}/{}@{}", p.pool, p.image, p.snap_name))
    };
    if json_out(g) {
        let mut v = Vec::new();
        for (h, l) in &rows {
            v.push(
                json!({"image": h.name, "id": h.id, "size": h.size_bytes, "format": 2,
                   "data_pool": h.data_pool, "parent": parent_of(h),
                   "lock_type": l.as_ref().map(|_| "exclusive"),
                   "locker": l.as_ref().map(|l| l.owner.clone())}),
            );
            for sn in &h.snapshots {
                v.push(
                    json!({"image": h.name, "snapshot": sn.name, "snapshot_id": sn.id,
                       "size": sn.size_bytes, "format": 2, "protected": sn.protected.to_string()}),
                );
            }
        }
        return print_json(g, &json!(v));
    }
    let w = rows
        .iter()
        .flat_map(|(h, _)| {
            std::iter::once(h.name.len()).chain(
                h.snapshots
                    .iter()
                    .map(|sn| h.name.len() + 1 + sn.name.len()),
            )
        })
        .max()
        .unwrap_or(4)
        .max(4);
    let pw = rows
        .iter()
        .filter_map(|(h, _)| parent_of(h).map(|p| p.len()))
        .max()
        .unwrap_or(6)
        .max(6);
    println!(
        "{:<w$}  {:>10}  {:<pw$}  FMT  PROT  LOCK",
        "NAME", "SIZE", "PARENT"
    );
    for (h, l) in rows {
        let lock = if l.is_some() { "excl" } else { "" };
        let parent = parent_of(&h).unwrap_or_default();
        println!(
            "{:<w$}  {:>10}  {parent:<pw$}  {:>3}        {lock}",
            h.name,
            human(h.size_bytes),
            2
        );
        for sn in &h.snapshots {
            let prot = if sn.protected { "yes" } else { "" };
            println!(
                "{:<w$}  {:>10}  {parent:<pw$}  {:>3}  {prot:<4}",
                format!("{}@{}", h.name, sn.name),
                human(sn.size_bytes),
                2
            );
        }
    }
    Ok(())
}

async fn info(g: &GlobalArgs, rbd: &Rbd, s: &Spec) -> Result<()> {
    let h = rbd.info(&s.name).await.map_err(|e| rbd_err(s, e))?;
    let order = h.object_size_bytes.trailing_zeros();
    if json_out(g) {
        return print_json(
            g,
            &json!({"name": h.name, "id": h.id, "size": h.size_bytes,
                    "objects": h.object_count(), "order": order,
                    "object_size": h.object_size_bytes,
                    "block_name_prefix": format!("rbd_data.{}", h.id),
                    "format": 2, "features": ["exclusive-lock"],
                    "pool": rbd.pool_name(), "data_pool": h.data_pool,
                    "snapshot_count": h.snapshots.len(),
                    "snapshots": h.snapshots.iter().map(|sn| json!({"id": sn.id, "name": sn.name,
                        "size": sn.size_bytes, "protected": sn.protected,
                        "children": sn.children})).collect::<Vec<_>>(),
                    "parent": h.parent.as_ref().map(|p| json!({"pool": p.pool, "image": p.image,
                        "snapshot": p.snap_name, "overlap": p.overlap_bytes}))}),
        );
    }
    println!("rbd image '{}':", h.name);
    println!(
        "\tsize {} in {} objects",
        human(h.size_bytes),
        h.object_count()
    );
    println!("\torder {order} ({} objects)", human(h.object_size_bytes));
    println!("\tsnapshot_count: {}", h.snapshots.len());
    println!("\tid: {}", h.id);
    println!("\tblock_name_prefix: rbd_data.{}", h.id);
    if h.data_pool != rbd.pool_name() {
        println!("\tdata_pool: {}", h.data_pool);
    }
    println!("\tformat: 2");
    println!("\tfeatures: exclusive-lock");
    if let Some(p) = &h.parent {
        println!("\tparent: {}/{}@{}", p.pool, p.image, p.snap_name);
        println!("\toverlap: {}", human(p.overlap_bytes));
    }
    for sn in &h.snapshots {
        let prot = if sn.protected { ", protected" } else { "" };
        println!(
            "\tsnapshot {} (id {}): {}{prot}{}",
            sn.name,
            sn.id,
            human(sn.size_bytes),
            if sn.children.is_empty() {
                String::new()
            } else {
                format!(", children: {}", sn.children.join(" "))
            }
        );
    }
    Ok(())
}

async fn snap_cmd(
    g: &GlobalArgs,
    session: &Session,
    pool: Option<&str>,
    cmd: SnapCmd,
) -> Result<()> {
    let rados = &session.rados;
    let open = |s: &Spec| -> Result<Rbd> {
        Rbd::new(rados, &s.pool).map_err(|e| anyhow!("pool '{}': {e}", s.pool))
    };
    match cmd {
        SnapCmd::Create { snap } => {
            let (s, snap) = snap_spec(&snap, pool)?;
            let rbd = open(&s)?;
            let h = rbd.info(&s.name).await.map_err(|e| rbd_err(&s, e))?;
            let reply = session
                .mon()
                .command(&cairn_map::MonCommand::PoolSnapAllocate {
                    pool: h.data_pool.clone(),
                })
                .await
                .map_err(|e| {
                    anyhow!(
                        "{s}@{snap}: allocating a snapshot id in pool '{}': {e}",
                        h.data_pool
                    )
                })?;
            let id = reply.json["snap_id"].as_u64().ok_or_else(|| {
                anyhow!(
                    "the monitors answered the snapshot id request with {}",
                    reply.json
                )
            })?;
            rbd.snap_create(&s.name, &snap, id)
                .await
                .map_err(|e| anyhow!("{s}@{snap}: {e}"))?;
            eprintln!("Creating snap: 100% complete...done.");
            Ok(())
        }
        SnapCmd::Ls { image } => {
            let s = spec(&image, pool)?;
            let snaps = open(&s)?
                .snap_list(&s.name)
                .await
                .map_err(|e| rbd_err(&s, e))?;
            if json_out(g) {
                let v: Vec<_> = snaps
                    .iter()
                    .map(|sn| json!({"id": sn.id, "name": sn.name, "size": sn.size_bytes,
                                     "protected": sn.protected.to_string(), "children": sn.children}))
                    .collect();
                return print_json(g, &json!(v));
            }
            if snaps.is_empty() {
                return Ok(());
            }
            let w = snaps
                .iter()
                .map(|sn| sn.name.len())
                .max()
                .unwrap_or(4)
                .max(4);
            println!("{:>6}  {:<w$}  {:>10}  PROTECTED", "SNAPID", "NAME", "SIZE");
            for sn in &snaps {
                println!(
                    "{:>6}  {:<w$}  {:>10}  {}",
                    sn.id,
                    sn.name,
                    human(sn.size_bytes),
                    if sn.protected { "yes" } else { "no" }
                );
            }
            Ok(())
        }
        SnapCmd::Rm { snap } => {
            let (s, snap) = snap_spec(&snap, pool)?;
            open(&s)?
                .snap_remove(&s.name, &snap)
                .await
                .map_err(|e| anyhow!("{s}@{snap}: {e}"))?;
            eprintln!("Removing snap: 100% complete...done.");
            Ok(())
        }
        SnapCmd::Purge { image } => {
            let s = spec(&image, pool)?;
            let n = open(&s)?
                .snap_purge(&s.name)
                .await
                .map_err(|e| rbd_err(&s, e))?;
            eprintln!("Removing all snapshots ({n}): 100% complete...done.");
            Ok(())
        }
        SnapCmd::Rollback { snap } => {
            let (s, snap) = snap_spec(&snap, pool)?;
            let pb = progress_bar("Rolling back to snapshot");
            let mut cb = progress_fn(&pb);
            open(&s)?
                .snap_rollback(&s.name, &snap, &mut cb)
                .await
                .map_err(|e| anyhow!("{s}@{snap}: {e}"))?;
            if let Some(pb) = &pb {
                pb.finish_and_clear();
            }
            eprintln!("Rolling back to snapshot: 100% complete...done.");
            Ok(())
        }
        SnapCmd::Protect { snap } => {
            let (s, snap) = snap_spec(&snap, pool)?;
            open(&s)?
                .snap_set_protected(&s.name, &snap, true)
                .await
                .map_err(|e| anyhow!("{s}@{snap}: {e}"))
        }
        SnapCmd::Unprotect { snap } => {
            let (s, snap) = snap_spec(&snap, pool)?;
            open(&s)?
                .snap_set_protected(&s.name, &snap, false)
                .await
                .map_err(|e| anyhow!("{s}@{snap}: {e}"))
        }
    }
}

async fn resize(rbd: &Rbd, s: &Spec, size: u64, allow_shrink: bool) -> Result<()> {
    let h = rbd.info(&s.name).await.map_err(|e| rbd_err(s, e))?;
    if size < h.size_bytes && !allow_shrink {
        bail!(
            "{s}: shrinking from {} to {} discards the data past the new end; \
             add --allow-shrink if that is what you want",
            human(h.size_bytes),
            human(size)
        );
    }
    let img = rbd
        .open(&s.name, &lock_owner("resize"), false)
        .await
        .map_err(|e| rbd_err(s, e))?;
    let r = img.resize(size).await;
    let closed = img.close().await;
    r.map_err(|e| rbd_err(s, e))?;
    closed.map_err(|e| rbd_err(s, e))?;
    eprintln!("Resizing image: 100% complete...done.");
    Ok(())
}

async fn du(g: &GlobalArgs, rbd: &Rbd, names: &[String]) -> Result<()> {
    let mut rows = Vec::new();
    for n in names {
        let u = rbd
            .du(n)
            .await
            .map_err(|e| anyhow!("{}/{n}: {e}", rbd.pool_name()))?;
        rows.push((n.clone(), u));
    }
    if json_out(g) {
        let v: Vec<_> = rows
            .iter()
            .map(|(n, u)| {
                json!({"name": n, "provisioned_size": u.provisioned_bytes,
                       "used_size": u.used_bytes, "objects": u.objects})
            })
            .collect();
        let total_p: u64 = rows.iter().map(|(_, u)| u.provisioned_bytes).sum();
        let total_u: u64 = rows.iter().map(|(_, u)| u.used_bytes).sum();
        return print_json(
            g,
            &json!({"images": v, "total_provisioned_size": total_p, "total_used_size": total_u}),
        );
    }
    let w = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(4).max(5);
    println!("{:<w$}  {:>12}  {:>12}", "NAME", "PROVISIONED", "USED");
    for (n, u) in &rows {
        println!(
            "{n:<w$}  {:>12}  {:>12}",
            human(u.provisioned_bytes),
            human(u.used_bytes)
        );
    }
    if rows.len() > 1 {
        let p: u64 = rows.iter().map(|(_, u)| u.provisioned_bytes).sum();
        let used: u64 = rows.iter().map(|(_, u)| u.used_bytes).sum();
        println!("{:<w$}  {:>12}  {:>12}", "<TOTAL>", human(p), human(used));
    }
    Ok(())
}

async fn export(rbd: &Rbd, s: &Spec, path: &str) -> Result<()> {
    let pb = progress_bar("Exporting image");
    let mut cb = progress_fn(&pb);
    if path == "-" {
        let mut out = tokio::io::stdout();
        rbd.export(&s.name, &mut out, &mut cb)
            .await
            .map_err(|e| rbd_err(s, e))?;
    } else {
        if Path::new(path).exists() {
            bail!("{path} already exists; remove it first or export to another path");
        }
        let mut f = tokio::fs::File::create(path)
            .await
            .with_context(|| format!("creating {path}"))?;
        if let Err(e) = rbd.export_to_file(&s.name, &mut f, &mut cb).await {
            drop(f);
            let _ = std::fs::remove_file(path);
            return Err(rbd_err(s, e));
        }
    }
    if let Some(pb) = &pb {
        pb.finish_and_clear();
    }
    eprintln!("Exporting image: 100% complete...done.");
    Ok(())
}

async fn import(
    rbd: &Rbd,
    s: &Spec,
    path: &str,
    size: Option<String>,
    object_size_bytes: Option<u64>,
    data_pool: Option<String>,
) -> Result<()> {
    let explicit = size.as_deref().map(parse_image_size).transpose()?;
    let pb = progress_bar("Importing image");
    let mut cb = progress_fn(&pb);
    let result = if path == "-" {
        let size_bytes =
            explicit.ok_or_else(|| anyhow!("import from stdin needs --size (the image's size)"))?;
        let opts = CreateOptions {
            size_bytes,
            object_size_bytes,
            data_pool,
        };
        rbd.import(&s.name, &opts, &mut tokio::io::stdin(), &mut cb)
            .await
    } else {
        let mut f = tokio::fs::File::open(path)
            .await
            .with_context(|| format!("opening {path}"))?;
        let len = f.metadata().await?.len();
        if len == 0 && explicit.is_none() {
            bail!("{path} is empty; give the image a --size");
        }
        let size_bytes = match explicit {
            Some(sz) => sz,
            None => len.div_ceil(512) * 512,
        };
        let opts = CreateOptions {
            size_bytes,
            object_size_bytes,
            data_pool,
        };
        rbd.import(&s.name, &opts, &mut f, &mut cb).await
    };
    if let Some(pb) = &pb {
        pb.finish_and_clear();
    }
    match result {
        Ok(_) => {
            eprintln!("Importing image: 100% complete...done.");
            Ok(())
        }
        // The image exists but is incomplete: say so rather than leave a
        // half-filled image looking whole.
        Err(e @ RbdError::Exists(_)) => Err(rbd_err(s, e)),
        Err(e) => Err(anyhow!(
            "{s}: import failed: {e}; the image was created and is incomplete — \
             remove it with 'cairn rbd rm {s}'"
        )),
    }
}

async fn status(g: &GlobalArgs, rbd: &Rbd, s: &Spec) -> Result<()> {
    // Confirms the image exists before reporting on it.
    rbd.info(&s.name).await.map_err(|e| rbd_err(s, e))?;
    let lock = rbd.lock_status(&s.name).await.map_err(|e| rbd_err(s, e))?;
    let mapped: Vec<Mapping> = map::list_mappings(&map::map_dir())
        .into_iter()
        .filter(|m| m.pool == s.pool && m.image == s.name)
        .collect();
    if json_out(g) {
        return print_json(
            g,
            &json!({"watchers": lock.iter().map(|l| json!({"owner": l.owner, "cookie": l.cookie, "address": l.client})).collect::<Vec<_>>(),
                    "mapped_here": mapped.iter().map(|m| json!({"device": m.device, "pid": m.helper_pid})).collect::<Vec<_>>()}),
        );
    }
    match &lock {
        Some(l) => {
            println!("Watchers:");
            let addr = if l.client.is_empty() { "?" } else { &l.client };
            println!(
                "\twatcher={} address={addr} cookie={} (holds the exclusive lock)",
                l.owner, l.cookie
            );
        }
        None => println!("Watchers: none"),
    }
    for m in mapped {
        println!(
            "Mapped here: {} (helper pid {}{})",
            m.device,
            m.helper_pid,
            if map::pid_alive(m.helper_pid) {
                ""
            } else {
                ", DEAD: run 'cairn rbd unmap' to clean up"
            }
        );
    }
    Ok(())
}

async fn lock_ls(g: &GlobalArgs, rbd: &Rbd, s: &Spec) -> Result<()> {
    let lock = rbd.lock_status(&s.name).await.map_err(|e| rbd_err(s, e))?;
    if json_out(g) {
        let v: Vec<_> = lock
            .iter()
            .map(|l| json!({"locker": l.owner, "id": l.cookie, "type": "exclusive", "address": l.client}))
            .collect();
        return print_json(g, &json!(v));
    }
    match lock {
        None => println!("There are no locks on {s}."),
        Some(l) => {
            println!("There is 1 exclusive lock on this image.");
            println!("Locker\tID\tAddress");
            let addr = if l.client.is_empty() { "?" } else { &l.client };
            println!("{}\t{}\t{addr}", l.owner, l.cookie);
        }
    }
    Ok(())
}

/// Bench sizes: K/M/G/T suffixes (powers of 1024), a bare number is bytes
/// (as rbd bench takes them).
fn parse_bench_bytes(what: &str, text: &str) -> Result<u64> {
    let t = text.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'B' => 1,
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => bail!("{what} '{text}': unknown suffix '{c}' (use K, M, G or T)"),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| anyhow!("{what} '{text}': not a number of bytes (e.g. 4096, 4K, 1M)"))?;
    n.checked_mul(mult)
        .ok_or_else(|| anyhow!("{what} '{text}' is too large"))
}

fn bench_options(
    io_type: &str,
    io_size: &str,
    io_threads: usize,
    io_total: &str,
    io_pattern: &str,
) -> Result<cairn_rbd::bench::BenchOptions> {
    use cairn_rbd::bench::{IoPattern, IoType};
    let io_type = match io_type {
        "write" => IoType::Write,
        "read" => IoType::Read,
        t => bail!("--io-type '{t}': use write or read"),
    };
    let pattern = match io_pattern {
        "seq" | "sequential" => IoPattern::Seq,
        "rand" | "random" => IoPattern::Rand,
        p => bail!("--io-pattern '{p}': use seq or rand"),
    };
    Ok(cairn_rbd::bench::BenchOptions {
        io_type,
        io_size: parse_bench_bytes("--io-size", io_size)?,
        io_threads,
        io_total: parse_bench_bytes("--io-total", io_total)?,
        pattern,
    })
}

/// Bytes per second in rbd bench's style: whole units of 1024.
fn per_sec_units(bytes_per_sec: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes_per_sec;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.0} {}/s", units[u])
}

/// `rbd bench`: writes take the image's lock (refused while it is served
/// or mapped), reads open it read-only. Output has rbd bench's shape: a
/// header line, a line per second, and `elapsed: … ops: … ops/sec: …
/// bytes/sec: …`.
async fn bench(rbd: &Rbd, s: &Spec, opts: &cairn_rbd::bench::BenchOptions) -> Result<()> {
    use cairn_rbd::bench::{run_bench, IoPattern, IoType};
    let image = match opts.io_type {
        IoType::Write => rbd.open(&s.name, &lock_owner("bench"), false).await,
        IoType::Read => rbd.open_read_only(&s.name).await,
    }
    .map_err(|e| rbd_err(s, e))?;
    // Like Ceph's `rbd` tool (which turns rbd_cache_writethrough_until_flush
    // off for its commands): the bench ends with a flush, counted in its
    // time, so the cache may take writes back from the first one.
    image.assume_flushing_user();
    let image = Arc::new(image);
    println!(
        "bench  type {} io_size {} io_threads {} bytes {} pattern {}",
        match opts.io_type {
            IoType::Write => "write",
            IoType::Read => "read",
        },
        opts.io_size,
        opts.io_threads,
        opts.io_total,
        match opts.pattern {
            IoPattern::Seq => "sequential",
            IoPattern::Rand => "random",
        }
    );
    println!("  SEC       OPS   OPS/SEC   BYTES/SEC");
    let mut last = (Duration::ZERO, 0u64);
    let result = run_bench(image.clone(), opts, |now| {
        let dt = (now.elapsed - last.0).as_secs_f64().max(1e-9);
        let dops = now.ops - last.1;
        println!(
            "{:>5} {:>9} {:>9.2} {:>12}",
            now.elapsed.as_secs(),
            now.ops,
            dops as f64 / dt,
            per_sec_units(dops as f64 * opts.io_size as f64 / dt)
        );
        last = (now.elapsed, now.ops);
    })
    .await;
    let closed = match Arc::try_unwrap(image) {
        Ok(img) => img.close().await.map_err(|e| rbd_err(s, e)),
        Err(_) => Err(anyhow!(
            "{s}: bench still holds the image; lock not released"
        )),
    };
    let r = result.map_err(|e| rbd_err(s, e))?;
    closed?;
    println!(
        "elapsed: {:.2}   ops: {}   ops/sec: {:.2}   bytes/sec: {}",
        r.elapsed.as_secs_f64(),
        r.ops,
        r.ops_per_sec(),
        per_sec_units(r.bytes_per_sec())
    );
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers, run until killed.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

async fn serve(
    session: &Session,
    pool: Option<&str>,
    images: &[String],
    listen: Option<String>,
    socket: Option<PathBuf>,
    break_lock: bool,
) -> Result<()> {
    let specs: Vec<Spec> = images
        .iter()
        .map(|i| spec_or_snap(i, pool))
        .collect::<Result<_>>()?;
    let p = &specs[0].pool;
    if specs.iter().any(|s| &s.pool != p) {
        bail!("rbd serve: every image must be in one pool (got several); run one serve per pool");
    }
    let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
    if names
        .iter()
        .enumerate()
        .any(|(i, n)| names[..i].contains(n))
    {
        bail!("rbd serve: an image is named twice");
    }
    let rbd = Rbd::new(&session.rados, p)
        .map_err(|e| anyhow!("pool '{p}': {e}"))?
        .with_fencer(fencer(session));
    let (listener, shown) = match socket {
        Some(path) => {
            if path.exists() {
                bail!(
                    "{} exists; if no server uses it, remove it first",
                    path.display()
                );
            }
            let l = tokio::net::UnixListener::bind(&path)
                .with_context(|| format!("binding unix socket {}", path.display()))?;
            let url = format!("nbd+unix:///{}?socket={}", names[0], path.display());
            (Listener::Unix(l), url)
        }
        None => {
            let addr = listen.unwrap_or_else(|| DEFAULT_LISTEN.to_string());
            let l = tokio::net::TcpListener::bind(&addr)
                .await
                .with_context(|| format!("listening on {addr}"))?;
            let url = format!("nbd://{}/{}", l.local_addr()?, names[0]);
            (Listener::Tcp(l), url)
        }
    };
    let opts = ServeOptions {
        owner: lock_owner("serve"),
        break_lock,
        server: ServerConfig::default(),
    };
    let served = {
        let shown = shown.clone();
        let listed = names.join(", ");
        let pool = p.clone();
        let announce = async move {
            // serve_images opens the images first; the announcement follows
            // the first poll of the server, i.e. after the opens succeeded.
            tokio::task::yield_now().await;
            println!(
                "serving {listed} from pool '{pool}' at {shown} (export names = image names); Ctrl-C stops"
            );
        };
        let shutdown = async move {
            announce.await;
            shutdown_signal().await;
        };
        cairn_rbd::serve_images(&rbd, &names, listener, &opts, shutdown).await
    };
    if let Some(path) = socket_path_of(&shown) {
        let _ = std::fs::remove_file(path);
    }
    served.map_err(|e| anyhow!("serving {}: {e}", specs[0]))?;
    eprintln!("stopped; locks released");
    Ok(())
}

fn socket_path_of(url: &str) -> Option<&str> {
    url.split_once("?socket=").map(|(_, p)| p)
}

// ---- map / unmap / showmapped ----------------------------------------------

fn map_image(g: &GlobalArgs, s: &Spec, read_only: bool) -> Result<()> {
    let dir = map::map_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let id = map::mapping_id(&s.pool, &s.name);
    if let Some(m) = map::list_mappings(&dir).into_iter().find(|m| m.id() == id) {
        if map::pid_alive(m.helper_pid) {
            bail!("{s} is already mapped at {}", m.device);
        }
        eprintln!(
            "cleaning up a stale mapping of {s} at {} (helper gone)",
            m.device
        );
        undo_mapping(g, &m)?;
    }
    let nbd = map::kernel_nbd_available();
    if !nbd {
        map::fuse_loop_available().map_err(|e| anyhow!("rbd map {s}: {e}"))?;
    }
    let endpoint = dir.join(if nbd {
        format!("{id}.sock")
    } else {
        format!("{id}.mnt")
    });
    if nbd {
        let _ = std::fs::remove_file(&endpoint);
    } else {
        map::fuse_unmount(&endpoint);
        std::fs::create_dir_all(&endpoint)
            .with_context(|| format!("creating {}", endpoint.display()))?;
    }
    let ready = dir.join(format!("{id}.ready"));
    let _ = std::fs::remove_file(&ready);
    let log_path = dir.join(format!("{id}.log"));
    // Removes the socket or FUSE mountpoint and the ready marker.
    let remove_endpoint = || {
        if nbd {
            let _ = std::fs::remove_file(&endpoint);
        } else {
            map::fuse_unmount(&endpoint);
            let _ = std::fs::remove_dir(&endpoint);
        }
        let _ = std::fs::remove_file(&ready);
    };
    let helper_pid = match spawn_helper(g, s, &endpoint, nbd, &ready, read_only, &log_path) {
        Ok(pid) => pid,
        Err(e) => {
            remove_endpoint();
            return Err(e);
        }
    };
    let cleanup = |device: Option<&str>| {
        if let Some(d) = device {
            let _ = if nbd {
                map::detach_nbd(d)
            } else {
                map::detach_loop(d)
            };
        }
        map::stop_pid(helper_pid, map::HELPER_STOP_TIMEOUT);
        remove_endpoint();
    };
    let device = if nbd {
        map::free_nbd_device().and_then(|d| map::attach_nbd(&endpoint, &s.name, &d).map(|_| d))
    } else {
        map::attach_loop(&endpoint.join(&s.name), read_only)
    };
    let device = match device {
        Ok(d) => d,
        Err(e) => {
            cleanup(None);
            bail!(
                "rbd map {s}: {e} (undone; helper log {})",
                log_path.display()
            );
        }
    };
    let m = Mapping {
        version: map::MAPPING_VERSION,
        pool: s.pool.clone(),
        image: s.name.clone(),
        kind: if nbd { MapKind::Nbd } else { MapKind::FuseLoop },
        device: device.clone(),
        helper_pid,
        endpoint: endpoint.clone(),
        read_only,
    };
    if let Err(e) = m.save(&dir) {
        cleanup(Some(&device));
        bail!("rbd map {s}: {e} (undone)");
    }
    if !nbd && !map::loop_direct_io(&device) {
        eprintln!("note: {device} uses buffered I/O (the kernel refused direct I/O on the FUSE file); flushes still reach the image");
    }
    println!("{device}");
    Ok(())
}

/// Starts the detached helper (new session, output to `log`) and waits
/// until it has the image open and exposed, or failed.
fn spawn_helper(
    g: &GlobalArgs,
    s: &Spec,
    endpoint: &Path,
    nbd: bool,
    ready: &Path,
    read_only: bool,
    log: &Path,
) -> Result<u32> {
    let conf = find_conf(g.conf.as_deref())?;
    let exe = std::env::current_exe().context("finding the cairn executable")?;
    let log_file =
        std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = Command::new(exe);
    cmd.arg("-c")
        .arg(&conf)
        .args(["rbd", "map-helper", &s.to_string(), "--endpoint"])
        .arg(endpoint)
        .arg("--ready")
        .arg(ready)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file);
    if nbd {
        cmd.arg("--nbd");
    }
    if read_only {
        cmd.arg("--read-only");
    }
    // SAFETY: setsid() is async-signal-safe and touches no memory of ours;
    // it detaches the helper from our terminal and process group.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the map helper")?;
    let pid = child.id();
    let t0 = Instant::now();
    loop {
        if ready.exists() {
            return Ok(pid);
        }
        if let Some(status) = child.try_wait()? {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(5).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!(
                "rbd map {s}: the helper exited ({status}): {}",
                tail.join("\n")
            );
        }
        if t0.elapsed() > MAP_READY_TIMEOUT {
            map::stop_pid(pid, map::HELPER_STOP_TIMEOUT);
            let _ = child.wait();
            bail!(
                "rbd map {s}: the helper was not ready after {}s (log {}); stopped it",
                MAP_READY_TIMEOUT.as_secs(),
                log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Detaches the device, stops the helper, removes mountpoint/socket and
/// record. Refuses while the device is mounted.
fn undo_mapping(g: &GlobalArgs, m: &Mapping) -> Result<()> {
    let helper_was_dead = !map::pid_alive(m.helper_pid);
    if let Some(at) = map::mounted_at(&m.device) {
        bail!(
            "{} ({}/{}) is mounted at {at}; unmount it first",
            m.device,
            m.pool,
            m.image
        );
    }
    let detached = match m.kind {
        MapKind::FuseLoop => map::detach_loop(&m.device),
        MapKind::Nbd => map::detach_nbd(&m.device),
    };
    if let Err(e) = detached {
        // A device we cannot let go of must keep its helper: stop here.
        if map::pid_alive(m.helper_pid) {
            bail!("{}: {e}", m.device);
        }
        eprintln!("warning: {}: {e}", m.device);
    }
    if map::pid_alive(m.helper_pid) {
        map::stop_pid(m.helper_pid, map::HELPER_STOP_TIMEOUT);
    }
    match m.kind {
        MapKind::FuseLoop => {
            map::fuse_unmount(&m.endpoint);
            let _ = std::fs::remove_dir(&m.endpoint);
        }
        MapKind::Nbd => {
            let _ = std::fs::remove_file(&m.endpoint);
        }
    }
    let dir = map::map_dir();
    let _ = std::fs::remove_file(dir.join(format!("{}.ready", m.id())));
    m.remove_record(&dir);
    if helper_was_dead && !m.read_only {
        release_dead_helpers_lock(g, m);
    }
    Ok(())
}

/// A helper that died (SIGKILL, OOM) leaves the image locked. Its lock
/// record names it (`…@HOST:PID/map`); since that process is known dead,
/// the lock is broken — only that exact record, nobody else's.
fn release_dead_helpers_lock(g: &GlobalArgs, m: &Mapping) {
    let owner = format!(
        "client.admin@{}:{}/map",
        crate::cmd_disk::hostname(),
        m.helper_pid
    );
    let s = Spec {
        pool: m.pool.clone(),
        name: m.image.clone(),
    };
    let result = runtime().and_then(|rt| {
        rt.block_on(async {
            let session = Session::connect(g.conf.as_deref(), None).await?;
            let rbd = Rbd::new(&session.rados, &s.pool)?;
            let dead_helpers = rbd.lock_status(&s.name).await?.filter(|l| l.owner == owner);
            if let Some(l) = dead_helpers {
                if rbd.break_lock_if(&s.name, &l).await? {
                    eprintln!("released the lock {owner} held by the dead map helper on {s}");
                }
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        eprintln!(
            "warning: {s}: could not release the dead map helper's lock ({e:#}); \
             'cairn rbd lock break {s}' does it"
        );
    }
}

fn unmap(g: &GlobalArgs, target: &str, pool: Option<&str>) -> Result<()> {
    let all = map::list_mappings(&map::map_dir());
    let found = if target.starts_with("/dev/") {
        all.into_iter().find(|m| m.device == target)
    } else {
        let s = spec(target, pool)?;
        all.into_iter()
            .find(|m| m.pool == s.pool && m.image == s.name)
    };
    let m = found.ok_or_else(|| {
        anyhow!("{target} is not mapped on this host ('cairn rbd showmapped' lists mappings)")
    })?;
    undo_mapping(g, &m)
}

fn showmapped(g: &GlobalArgs) -> Result<()> {
    let all = map::list_mappings(&map::map_dir());
    if json_out(g) {
        let v: Vec<_> = all
            .iter()
            .map(|m| {
                json!({"pool": m.pool, "name": m.image, "device": m.device,
                       "kind": m.kind, "pid": m.helper_pid, "alive": map::pid_alive(m.helper_pid),
                       "read_only": m.read_only})
            })
            .collect();
        return print_json(g, &json!(v));
    }
    if all.is_empty() {
        return Ok(());
    }
    println!(
        "{:<8} {:<12} {:<20} {:<12} {:<10} PID",
        "ID", "POOL", "IMAGE", "DEVICE", "KIND"
    );
    for (i, m) in all.iter().enumerate() {
        let kind = match m.kind {
            MapKind::FuseLoop => "fuse+loop",
            MapKind::Nbd => "nbd",
        };
        let dead = if map::pid_alive(m.helper_pid) {
            ""
        } else {
            " (dead)"
        };
        println!(
            "{:<8} {:<12} {:<20} {:<12} {:<10} {}{dead}",
            i, m.pool, m.image, m.device, kind, m.helper_pid
        );
    }
    Ok(())
}

/// The detached process behind `map`: opens the image (taking its lock),
/// exposes it on a FUSE mount or an NBD unix socket, signals readiness by
/// creating `ready`, and serves until SIGTERM (or its mount disappears);
/// then it unmounts and releases the lock.
fn map_helper(
    g: &GlobalArgs,
    s: &Spec,
    endpoint: &Path,
    nbd: bool,
    ready: &Path,
    read_only: bool,
) -> Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
    let rt = runtime()?;
    rt.block_on(async {
        let session = Session::connect(g.conf.as_deref(), None).await?;
        let rbd = Rbd::new(&session.rados, &s.pool).map_err(|e| anyhow!("pool '{}': {e}", s.pool))?;
        let image = if read_only {
            rbd.open_read_only(&s.name).await
        } else {
            rbd.open(&s.name, &lock_owner("map"), false).await
        }
        .map_err(|e| rbd_err(s, e))?;
        let image = Arc::new(image);
        let served = if nbd {
            helper_serve_nbd(s, image.clone(), endpoint, ready).await
        } else {
            helper_serve_fuse(s, image.clone(), endpoint, ready).await
        };
        // Written back even if something still holds the image.
        let flushed = image.write_back().await.map_err(|e| rbd_err(s, e));
        let closed = match Arc::try_unwrap(image) {
            Ok(img) => img.close().await.map_err(|e| rbd_err(s, e)),
            Err(_) => Err(anyhow!(
                "{s}: the image is still in use at exit; its lock stays held \
                 (break it with 'cairn rbd lock break {s}')"
            )),
        };
        let closed = flushed.and(closed);
        tracing::info!(image = %s, "helper stopping: {:?} / {:?}", served.as_ref().err(), closed.as_ref().err());
        served.and(closed)
    })
}

async fn helper_serve_fuse(
    s: &Spec,
    image: Arc<cairn_rbd::Image>,
    mountpoint: &Path,
    ready: &Path,
) -> Result<()> {
    let mounted =
        cairn_rbd::fuse::mount_image(image, mountpoint, tokio::runtime::Handle::current())
            .map_err(|e| rbd_err(s, e))?;
    // The mount is live once the file is visible through it.
    let file = mountpoint.join(&s.name);
    let t0 = Instant::now();
    while !file.exists() {
        if t0.elapsed() > MAP_READY_TIMEOUT || mounted.is_finished() {
            let _ = tokio::task::spawn_blocking(move || mounted.unmount()).await;
            bail!(
                "{s}: the FUSE mount at {} did not come up",
                mountpoint.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    std::fs::write(ready, b"ready\n").with_context(|| format!("writing {}", ready.display()))?;
    tracing::info!(image = %s, mountpoint = %mountpoint.display(), "serving the image over FUSE");
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let stop = shutdown_signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {
                if mounted.is_finished() {
                    tracing::warn!("the FUSE mount went away from outside");
                    break;
                }
            }
        }
    }
    tokio::task::spawn_blocking(move || mounted.unmount())
        .await
        .map_err(|e| anyhow!("unmount task: {e}"))?
        .map_err(|e| rbd_err(s, e))
}

async fn helper_serve_nbd(
    s: &Spec,
    image: Arc<cairn_rbd::Image>,
    socket: &Path,
    ready: &Path,
) -> Result<()> {
    let listener = tokio::net::UnixListener::bind(socket)
        .with_context(|| format!("binding {}", socket.display()))?;
    let export = Export {
        name: s.name.clone(),
        description: format!("cairn image {s}"),
        backend: image,
    };
    let server =
        NbdServer::new(ServerConfig::default(), vec![export]).map_err(|e| anyhow!("{s}: {e}"))?;
    std::fs::write(ready, b"ready\n").with_context(|| format!("writing {}", ready.display()))?;
    let r = server.serve_unix(listener, shutdown_signal()).await;
    drop(server);
    let _ = std::fs::remove_file(socket);
    r.map_err(|e| anyhow!("{s}: NBD server: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_and_sizes() {
        assert_eq!(
            spec("vm1", None).unwrap(),
            Spec {
                pool: "rbd".into(),
                name: "vm1".into()
            }
        );
        assert_eq!(spec("vms/a", Some("x")).unwrap().pool, "vms");
        assert_eq!(spec("a", Some("x")).unwrap().pool, "x");
        assert!(spec("a/b/c", None).is_err());
        assert!(spec("a@snap", None).is_err());
        assert!(spec("/a", None).is_err());
        assert_eq!(parse_image_size("10G").unwrap(), 10 << 30);
        assert_eq!(parse_image_size("1024").unwrap(), 1 << 30);
        assert_eq!(parse_image_size("4K").unwrap(), 4096);
        assert!(parse_image_size("0").is_err());
        assert!(parse_image_size("100B").is_err());
        assert!(parse_image_size("ten").is_err());
        assert_eq!(human(10 << 30), "10 GiB");
        assert_eq!(human(1536 << 20), "1.5 GiB");
        assert_eq!(human(0), "0 B");
    }
}
