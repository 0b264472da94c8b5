//! Host block devices for images (`cairn rbd map/unmap/showmapped`): the
//! mapping records under the map directory, and the host tools that attach
//! and detach a device — `losetup` on a FUSE-exposed image file where the
//! kernel has no nbd module, `nbd-client` where it has one. Owns no image
//! I/O (the helper process serves that through [`crate::fuse`] or NBD) and
//! does not start the helper (the CLI does, as a detached `cairn` process).

use crate::error::RbdError;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Where mapping records, mountpoints, sockets and helper logs live.
pub const DEFAULT_MAP_DIR: &str = "/run/cairn/rbd";
/// Version of the mapping record's JSON.
pub const MAPPING_VERSION: u32 = 1;
/// How long a detached device may take to let go of its backing file.
pub const DETACH_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a helper may take to exit after SIGTERM before SIGKILL.
pub const HELPER_STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// `$CAIRN_RBD_MAP_DIR`, else [`DEFAULT_MAP_DIR`].
pub fn map_dir() -> PathBuf {
    std::env::var_os("CAIRN_RBD_MAP_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_MAP_DIR))
}

/// How a mapping reaches the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MapKind {
    /// The image is a file on a FUSE mount, attached with `losetup`.
    FuseLoop,
    /// The image is served on a unix socket and attached with `nbd-client`.
    Nbd,
}

/// One mapped image, as recorded in `<map dir>/<id>.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mapping {
    pub version: u32,
    pub pool: String,
    pub image: String,
    pub kind: MapKind,
    /// `/dev/loopN` or `/dev/nbdN`.
    pub device: String,
    /// The detached helper serving the image.
    pub helper_pid: u32,
    /// FUSE mountpoint (FuseLoop) or NBD socket (Nbd).
    pub endpoint: PathBuf,
    pub read_only: bool,
}

/// A mapping's file-name stem: image names never contain '/' or '@'.
pub fn mapping_id(pool: &str, image: &str) -> String {
    format!("{}@{image}", pool.replace('/', "_"))
}

fn record_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.json"))
}

fn io_err(what: String, e: std::io::Error) -> RbdError {
    RbdError::Stream(format!("{what}: {e}"))
}

impl Mapping {
    pub fn id(&self) -> String {
        mapping_id(&self.pool, &self.image)
    }

    /// Writes the record (atomically: temp file + rename).
    pub fn save(&self, dir: &Path) -> Result<(), RbdError> {
        let path = record_path(dir, &self.id());
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_vec_pretty(self)
            .map_err(|e| RbdError::Invalid(format!("encoding mapping record: {e}")))?;
        std::fs::write(&tmp, text).map_err(|e| io_err(format!("writing {}", tmp.display()), e))?;
        std::fs::rename(&tmp, &path).map_err(|e| io_err(format!("renaming {}", tmp.display()), e))
    }

    pub fn remove_record(&self, dir: &Path) {
        let _ = std::fs::remove_file(record_path(dir, &self.id()));
    }
}

/// Every record in `dir` (unreadable ones are skipped with a warning).
pub fn list_mappings(dir: &Path) -> Vec<Mapping> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let p = e.path();
        if p.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        match std::fs::read(&p).map(|b| serde_json::from_slice::<Mapping>(&b)) {
            Ok(Ok(m)) if m.version == MAPPING_VERSION => out.push(m),
            Ok(Ok(m)) => tracing::warn!("{}: record version {} unknown", p.display(), m.version),
            Ok(Err(e)) => tracing::warn!("{}: unreadable mapping record: {e}", p.display()),
            Err(e) => tracing::warn!("{}: {e}", p.display()),
        }
    }
    out.sort_by(|a, b| a.device.cmp(&b.device));
    out
}

/// Whether process `pid` is running (not a zombie).
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// SIGTERM, then SIGKILL after `timeout`; returns once `pid` is gone.
pub fn stop_pid(pid: u32, timeout: Duration) {
    let Ok(p) = i32::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) with a concrete pid has no memory-safety preconditions.
    unsafe { libc::kill(p, libc::SIGTERM) };
    let t0 = Instant::now();
    while pid_alive(pid) {
        if t0.elapsed() > timeout {
            tracing::warn!(pid, "helper did not exit after SIGTERM; killing it");
            // SAFETY: as above.
            unsafe { libc::kill(p, libc::SIGKILL) };
            let t1 = Instant::now();
            while pid_alive(pid) && t1.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(50));
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether the kernel has the nbd driver (loaded, or loadable now) and
/// `nbd-client` is installed.
pub fn kernel_nbd_available() -> bool {
    if !tool_exists("nbd-client") {
        return false;
    }
    if Path::new("/sys/module/nbd").exists() {
        return true;
    }
    let loaded = Command::new("modprobe")
        .arg("nbd")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    loaded && Path::new("/sys/block/nbd0").exists()
}

/// Whether FUSE and loop devices can be used.
pub fn fuse_loop_available() -> Result<(), RbdError> {
    if !Path::new("/dev/fuse").exists() {
        return Err(RbdError::Unsupported(
            "neither the kernel's nbd driver (with nbd-client) nor /dev/fuse is available; \
             serve the image with 'cairn rbd serve' and attach it with an NBD client instead"
                .into(),
        ));
    }
    if !tool_exists("losetup") {
        return Err(RbdError::Unsupported(
            "losetup is not installed (Debian: apt-get install mount)".into(),
        ));
    }
    Ok(())
}

fn tool_exists(name: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/sbin", "/usr/sbin"].map(PathBuf::from))
        .any(|d| d.join(name).is_file())
}

fn run(cmd: &mut Command, what: &str) -> Result<String, RbdError> {
    let out = cmd
        .output()
        .map_err(|e| io_err(format!("running {what}"), e))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(RbdError::Stream(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Attaches `file` to a free loop device (direct I/O when the kernel
/// allows it; read-only if asked) and returns the device path.
pub fn attach_loop(file: &Path, read_only: bool) -> Result<String, RbdError> {
    let attach = |direct: bool| {
        let mut cmd = Command::new("losetup");
        cmd.args(["--find", "--show"]);
        if direct {
            cmd.arg("--direct-io=on");
        }
        if read_only {
            cmd.arg("--read-only");
        }
        run(cmd.arg(file), "losetup --find --show")
    };
    let dev = match attach(true) {
        Ok(dev) => dev,
        Err(e) => {
            tracing::info!("direct I/O loop device refused ({e}); trying buffered");
            attach(false)?
        }
    };
    if !dev.starts_with("/dev/") {
        return Err(RbdError::Stream(format!(
            "losetup printed '{dev}' instead of a device"
        )));
    }
    Ok(dev)
}

/// The loop device's sysfs name (`loop3` for `/dev/loop3`).
fn block_name(device: &str) -> &str {
    device.rsplit('/').next().unwrap_or(device)
}

/// Whether the loop device uses direct I/O on its backing file.
pub fn loop_direct_io(device: &str) -> bool {
    std::fs::read_to_string(format!("/sys/block/{}/loop/dio", block_name(device)))
        .map(|s| s.trim() == "1")
        .unwrap_or(false)
}

/// Where `device` is mounted, if anywhere (so unmap can refuse).
pub fn mounted_at(device: &str) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (src, dst) = (f.next()?, f.next()?);
        (src == device).then(|| dst.to_string())
    })
}

/// Whether `dir` is a mountpoint.
pub fn is_mountpoint(dir: &Path) -> bool {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return false;
    };
    let want = dir.to_string_lossy();
    mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(want.as_ref()))
}

/// Detaches a loop device and waits until it has let go of its file.
pub fn detach_loop(device: &str) -> Result<(), RbdError> {
    let backing = format!("/sys/block/{}/loop/backing_file", block_name(device));
    if Path::new(&backing).exists() {
        run(
            Command::new("losetup").args(["-d", device]),
            &format!("losetup -d {device}"),
        )?;
    }
    let t0 = Instant::now();
    while Path::new(&backing).exists() {
        if t0.elapsed() > DETACH_TIMEOUT {
            return Err(RbdError::Stream(format!(
                "{device} still holds its backing file {:?}s after losetup -d; is it open?",
                DETACH_TIMEOUT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// A free `/dev/nbdN` (size 0 and no client attached).
pub fn free_nbd_device() -> Result<String, RbdError> {
    for i in 0..256 {
        let sys = format!("/sys/block/nbd{i}");
        if !Path::new(&sys).exists() {
            break;
        }
        let size = std::fs::read_to_string(format!("{sys}/size")).unwrap_or_default();
        if size.trim() == "0" && !Path::new(&format!("{sys}/pid")).exists() {
            return Ok(format!("/dev/nbd{i}"));
        }
    }
    Err(RbdError::Stream(
        "no free /dev/nbdN device (load nbd with more devices: modprobe nbd nbds_max=64)".into(),
    ))
}

/// Attaches export `name` on unix socket `socket` to `device` with nbd-client.
pub fn attach_nbd(socket: &Path, name: &str, device: &str) -> Result<(), RbdError> {
    run(
        Command::new("nbd-client")
            .arg("-unix")
            .arg(socket)
            .arg(device)
            .args(["-N", name, "-block-size", "4096"]),
        "nbd-client",
    )
    .map(|_| ())
}

pub fn detach_nbd(device: &str) -> Result<(), RbdError> {
    run(
        Command::new("nbd-client").args(["-d", device]),
        &format!("nbd-client -d {device}"),
    )
    .map(|_| ())
}

/// Unmounts a FUSE mountpoint left behind (lazily, so it never blocks).
pub fn fuse_unmount(dir: &Path) {
    if !is_mountpoint(dir) {
        return;
    }
    let ok = Command::new("fusermount")
        .args(["-u", "-z"])
        .arg(dir)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        let _ = Command::new("umount").arg("-l").arg(dir).output();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_list() {
        let dir = tempfile::tempdir().unwrap();
        let m = Mapping {
            version: MAPPING_VERSION,
            pool: "rbd".into(),
            image: "vm1".into(),
            kind: MapKind::FuseLoop,
            device: "/dev/loop3".into(),
            helper_pid: 42,
            endpoint: "/run/cairn/rbd/rbd@vm1.mnt".into(),
            read_only: false,
        };
        m.save(dir.path()).unwrap();
        std::fs::write(dir.path().join("junk.json"), b"{").unwrap();
        assert_eq!(list_mappings(dir.path()), vec![m.clone()]);
        m.remove_record(dir.path());
        assert!(list_mappings(dir.path()).is_empty());
        assert_eq!(mapping_id("rbd", "vm1"), "rbd@vm1");
        assert!(pid_alive(std::process::id()));
        assert!(!pid_alive(u32::MAX));
    }
}
