//! The FUSE exposure of an image (what `cairn rbd map` attaches with
//! losetup), on a real in-process cluster: file I/O through the mount
//! reaches the image, fsync succeeds, fallocate PUNCH_HOLE frees objects,
//! ZERO_RANGE writes zeros, size changes and writes past the end are
//! refused, and a read-only image gives a read-only file. Skipped (with a
//! printed reason) when not root or without /dev/fuse.

#[path = "../../osd/tests/common/mod.rs"]
mod common;

use cairn_rbd::{fuse::mount_image, CreateOptions, Rbd};
use common::*;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::sync::Arc;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

fn fuse_usable() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let dev = std::path::Path::new("/dev/fuse").exists();
    if !(root && dev) {
        eprintln!(
            "SKIPPING: mounting FUSE needs root and /dev/fuse (root {root}, /dev/fuse {dev})"
        );
    }
    root && dev
}

fn fallocate(f: &std::fs::File, mode: i32, offset: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: a valid open fd and plain integers.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, len as i64) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_as_a_file_on_fuse() {
    if !fuse_usable() {
        return;
    }
    let cluster = Cluster::start(3, 1, 8, 256 * MIB).await;
    let rados = cluster.client();
    let rbd = Rbd::new(&rados, "rbd").unwrap();
    rbd.create(
        "disk",
        &CreateOptions {
            size_bytes: 8 * MIB,
            object_size_bytes: Some(MIB),
            data_pool: None,
        },
    )
    .await
    .unwrap();
    let img = Arc::new(rbd.open("disk", "client.fuse-test", false).await.unwrap());
    let dir = tempfile::tempdir().unwrap();
    let mounted = mount_image(img.clone(), dir.path(), tokio::runtime::Handle::current()).unwrap();
    let file = dir.path().join("disk");

    let rbd2 = rbd.clone();
    let path = file.clone();
    let rt = tokio::runtime::Handle::current();
    // Blocking file I/O runs off the runtime that serves the requests.
    tokio::task::spawn_blocking(move || {
        let t0 = std::time::Instant::now();
        while !path.exists() {
            assert!(t0.elapsed().as_secs() < 10, "mount did not come up");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 8 * MIB);
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["disk"]);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .unwrap();
        // Across an object boundary, 4 KiB aligned (O_DIRECT).
        let data: Vec<u8> = (0..3 * MIB as usize).map(|i| (i % 251) as u8).collect();
        f.write_all_at(&data, MIB - 64 * KIB).unwrap();
        f.sync_all().unwrap();
        let mut back = vec![0u8; data.len()];
        f.read_exact_at(&mut back, MIB - 64 * KIB).unwrap();
        assert!(back == data);
        // On the test's runtime: a connection opened from a temporary
        // runtime would go dead with it (and with it later ops).
        let used = |rt: &tokio::runtime::Handle| rt.block_on(rbd2.du("disk")).unwrap();
        assert_eq!(used(&rt).objects, 4);

        // PUNCH_HOLE|KEEP_SIZE (a loop device's discard) frees objects.
        fallocate(
            &f,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            MIB,
            2 * MIB,
        )
        .unwrap();
        assert_eq!(used(&rt).objects, 2);
        let mut z = vec![1u8; 2 * MIB as usize];
        f.read_exact_at(&mut z, MIB).unwrap();
        assert!(z.iter().all(|b| *b == 0));
        // ZERO_RANGE writes zeros in place.
        fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, 3 * MIB, 64 * KIB).unwrap();
        let mut z = vec![1u8; 64 * KIB as usize];
        f.read_exact_at(&mut z, 3 * MIB).unwrap();
        assert!(z.iter().all(|b| *b == 0));
        let mut rest = vec![0u8; 64 * KIB as usize];
        f.read_exact_at(&mut rest, 3 * MIB + 64 * KIB).unwrap();
        let off = (3 * MIB + 64 * KIB - (MIB - 64 * KIB)) as usize;
        assert!(rest[..] == data[off..off + 64 * KIB as usize]);
        // Plain allocation, size changes and writes past the end: refused.
        assert!(fallocate(&f, 0, 0, 4096).is_err());
        assert!(f.set_len(4 * MIB).is_err());
        assert!(f.write_all_at(&[0u8; 4096], 8 * MIB).is_err());
        // Reads at the end are short.
        let mut tail = vec![0u8; 8192];
        assert_eq!(f.read_at(&mut tail, 8 * MIB - 4096).unwrap(), 4096);
    })
    .await
    .unwrap();
    tokio::task::spawn_blocking(move || mounted.unmount())
        .await
        .unwrap()
        .unwrap();
    Arc::try_unwrap(img)
        .ok()
        .expect("the session released the image")
        .close()
        .await
        .unwrap();

    // Read-only image: the file is read-only.
    let ro = Arc::new(rbd.open_read_only("disk").await.unwrap());
    let mounted = mount_image(ro.clone(), dir.path(), tokio::runtime::Handle::current()).unwrap();
    let path = file.clone();
    tokio::task::spawn_blocking(move || {
        let t0 = std::time::Instant::now();
        while !path.exists() {
            assert!(t0.elapsed().as_secs() < 10, "mount did not come up");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(std::fs::OpenOptions::new().write(true).open(&path).is_err());
        let f = std::fs::File::open(&path).unwrap();
        let mut b = vec![0u8; 4096];
        f.read_exact_at(&mut b, 2 * MIB).unwrap();
        assert!(b.iter().all(|x| *x == 0));
    })
    .await
    .unwrap();
    tokio::task::spawn_blocking(move || mounted.unmount())
        .await
        .unwrap()
        .unwrap();
}
