//! `cairn disk add` on a raw block device (a loop device over a sparse
//! file): the OSD comes up on it, `disk ls` shows it, a device holding a
//! filesystem is refused, and `disk zap` makes the device reusable. Needs
//! root and `losetup`; otherwise the test says it is skipped. Also
//! `disk add --meta-path` (metadata and WAL in another directory).

mod common;

use common::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A loop device over `backing`, detached on drop.
struct Loop {
    dev: PathBuf,
}

impl Loop {
    fn attach(backing: &Path) -> Option<Loop> {
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(backing)
            .output()
            .ok()?;
        if !out.status.success() {
            eprintln!("losetup: {}", String::from_utf8_lossy(&out.stderr).trim());
            return None;
        }
        let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        Some(Loop { dev })
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let until = Instant::now() + Duration::from_secs(10);
        while Command::new("losetup")
            .arg("-d")
            .arg(&self.dev)
            .status()
            .map(|s| !s.success())
            .unwrap_or(false)
            && Instant::now() < until
        {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn sparse_file(path: &Path, bytes: u64) {
    std::fs::File::create(path).unwrap().set_len(bytes).unwrap();
}

#[test]
fn disk_add_on_a_block_device() {
    if !is_root() {
        eprintln!("skipped: attaching loop devices needs root");
        return;
    }
    let disks = tempfile::tempdir().unwrap();
    let (img, fs_img) = (disks.path().join("osd.img"), disks.path().join("fs.img"));
    sparse_file(&img, 512 << 20);
    sparse_file(&fs_img, 64 << 20);
    // A "filesystem": the ext2/3/4 magic where mkfs puts it.
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&fs_img)
            .unwrap();
        use std::io::Seek;
        f.seek(std::io::SeekFrom::Start(1080)).unwrap();
        f.write_all(&[0x53, 0xEF]).unwrap();
    }
    let (Some(lo), Some(lo_fs)) = (Loop::attach(&img), Loop::attach(&fs_img)) else {
        eprintln!("skipped: no loop device available");
        return;
    };
    let dev = lo.dev.to_str().unwrap().to_string();
    // Declared after the loop devices: its daemons stop before they detach.
    let c = Cluster::bootstrap();
    let node = c.nodes[0].dir.to_str().unwrap().to_string();
    let add = |d: &str| c.cairn(&["disk", "add", d, "--host", "node-a", "--data", &node]);

    let r = add(lo_fs.dev.to_str().unwrap());
    assert!(
        !r.ok && r.stderr.contains("ext2/3/4"),
        "a device holding a filesystem must be refused: {r:?}"
    );
    let r = add(&dev);
    assert!(r.ok, "disk add {dev}: {r:?}");
    let ls = c.ok(&["disk", "ls", "--data", &node]);
    assert!(ls.contains("device") && ls.contains(&dev), "{ls}");
    assert!(
        ls.contains("512.0 MiB"),
        "the whole device is the OSD: {ls}"
    );
    let tree = c.ok(&["osd", "tree"]);
    assert!(tree.contains(" up "), "{tree}");
    // A second OSD on the same device is refused (it holds a store now,
    // and the running OSD holds it exclusively).
    let r = add(&dev);
    assert!(!r.ok, "{r:?}");

    // Retire it: mark it down and purge it (the daemon boots a downed OSD
    // again after a few seconds, so retry the pair), then zap and reuse.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        c.cairn(&["osd", "down", "0"]);
        if c.cairn(&["osd", "purge", "0", "--yes-i-really-mean-it"]).ok {
            break;
        }
        assert!(Instant::now() < until, "osd.0 could not be purged");
        std::thread::sleep(Duration::from_millis(200));
    }
    let r = c.cairn(&["disk", "zap", &dev, "--data", &node]);
    let r = if r.ok {
        r
    } else {
        // The daemon may still be closing the OSD's store.
        std::thread::sleep(Duration::from_secs(3));
        c.cairn(&["disk", "zap", &dev, "--data", &node])
    };
    assert!(r.ok, "disk zap: {r:?}");
    let r = add(&dev);
    assert!(r.ok, "disk add after zap: {r:?}");
}

#[test]
fn disk_add_with_metadata_and_wal_in_another_directory() {
    let disks = tempfile::tempdir().unwrap();
    // Declared after the disks: its daemons stop before they go.
    let c = Cluster::bootstrap();
    let node = c.nodes[0].dir.to_str().unwrap().to_string();
    let path = |n: &str| disks.path().join(n).to_str().unwrap().to_string();
    let add = |data: &str, meta: &str| {
        c.cairn(&[
            "disk",
            "add",
            data,
            "--meta-path",
            meta,
            "--size",
            "256M",
            "--host",
            "node-a",
            "--data",
            &node,
        ])
    };
    // Bad input: refused before anything is registered.
    std::fs::write(path("not-a-dir"), b"x").unwrap();
    let r = add(&path("data0"), &path("not-a-dir"));
    assert!(
        !r.ok && r.stderr.contains("not a directory"),
        "a --meta-path that is a file must be refused: {r:?}"
    );
    assert!(
        !c.ok(&["osd", "tree"]).contains("osd.0"),
        "nothing registered"
    );

    let r = add(&path("data0"), &path("meta0"));
    assert!(r.ok, "disk add --meta-path: {r:?}");
    let (data, meta) = (disks.path().join("data0"), disks.path().join("meta0"));
    assert!(data.join("block").exists(), "the data stays on PATH");
    assert!(
        meta.join("meta.redb").exists() && meta.join("wal").exists(),
        "metadata and WAL go to --meta-path"
    );
    assert!(!data.join("meta.redb").exists() && !data.join("wal").exists());
    let ls = c.ok(&["disk", "ls", "--data", &node]);
    assert!(
        ls.contains(&format!("metadata and WAL in {}", meta.display())),
        "{ls}"
    );
    let tree = c.ok(&["osd", "tree"]);
    assert!(tree.contains("osd.0") && tree.contains(" up "), "{tree}");
    // Another OSD cannot share the metadata directory.
    let r = add(&path("data1"), &path("meta0"));
    assert!(
        !r.ok && r.stderr.contains("already holds"),
        "a --meta-path holding a store must be refused: {r:?}"
    );
}
