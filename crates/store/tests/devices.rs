//! Space given back to the disk (punched holes) and stores on a data file
//! of fixed size or a raw block device (a loop device, when the test runs as
//! root with `losetup`; otherwise that test says it is skipped).

use bytes::Bytes;
use cairn_store::*;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn cfg(dir: &Path) -> StoreConfig {
    let mut c = StoreConfig::new(dir);
    c.data_bytes = 64 << 20;
    c.cache_bytes = 8 << 20;
    c.meta_reserve_bytes = 0;
    c.wal_bytes = 4 << 20;
    // These tests are about giving space back (`bdev_enable_discard`).
    c.discard_freed_blocks = true;
    c
}

/// Bytes the filesystem has allocated to `path` (follows symlinks).
fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

/// Writes `mib` MiB to `o` in 1 MiB writes (the large, in-place path).
fn fill(s: &Store, c: CollectionId, o: &ObjectId, mib: u64, seed: u8) {
    for i in 0..mib {
        let mut t = Transaction::new();
        t.write(c, o.clone(), i << 20, pattern(seed ^ i as u8, 1 << 20));
        s.commit(t).unwrap();
    }
}

fn check(s: &Store, c: CollectionId, o: &ObjectId, mib: u64, seed: u8) {
    for i in 0..mib {
        let got = s.read(&c, o, i << 20, 1 << 20).unwrap();
        assert!(
            got == pattern(seed ^ i as u8, 1 << 20),
            "MiB {i} of {o} differs"
        );
    }
}

#[test]
fn zero_truncate_and_remove_give_space_back_to_the_filesystem() {
    let dir = tempfile::tempdir().unwrap();
    let block = dir.path().join(DATA_FILE);
    let s = Store::create(cfg(dir.path())).unwrap();
    let c = CollectionId::pg(1, 1);
    let (a, b) = (ObjectId::new(1, "a"), ObjectId::new(2, "b"));
    let mut t = Transaction::new();
    t.create_collection(c);
    s.commit(t).unwrap();
    fill(&s, c, &a, 8, 1);
    fill(&s, c, &b, 8, 2);
    s.checkpoint().unwrap();
    let start = allocated(&block);
    let used0 = s.statfs().unwrap().used_bytes;

    // zero the middle 4 MiB of a: 4 MiB leave the data file and statfs.
    let mut t = Transaction::new();
    t.zero(c, a.clone(), 2 << 20, 4 << 20);
    s.commit(t).unwrap();
    let after_zero = allocated(&block);
    assert!(
        start - after_zero >= 4 << 20,
        "zero freed only {} bytes on disk",
        start - after_zero
    );
    assert_eq!(used0 - s.statfs().unwrap().used_bytes, 4 << 20);
    // truncate b to 1 MiB, then remove a: 7 + 4 MiB more.
    let mut t = Transaction::new();
    t.truncate(c, b.clone(), 1 << 20);
    s.commit(t).unwrap();
    let mut t = Transaction::new();
    t.remove(c, a.clone());
    s.commit(t).unwrap();
    let end = allocated(&block);
    assert!(
        after_zero - end >= 11 << 20,
        "truncate + remove freed only {} bytes on disk",
        after_zero - end
    );
    assert_eq!(used0 - s.statfs().unwrap().used_bytes, 15 << 20);
    check(&s, c, &b, 1, 2);

    // Punched blocks are reused and read back intact, also after reopen.
    fill(&s, c, &a, 12, 3);
    check(&s, c, &a, 12, 3);
    drop(s);
    let s = Store::open(cfg(dir.path())).unwrap();
    check(&s, c, &a, 12, 3);
    check(&s, c, &b, 1, 2);
    assert!(s.deep_fsck().unwrap().is_clean());
}

#[test]
fn a_data_file_of_fixed_size_is_taken_whole() {
    let dir = tempfile::tempdir().unwrap();
    let block = dir.path().join(DATA_FILE);
    std::fs::File::create(&block)
        .unwrap()
        .set_len(48 << 20)
        .unwrap();
    let mut c = cfg(dir.path());
    c.data_bytes = 10 << 30; // ignored: the file's size wins
    let s = Store::create(c.clone()).unwrap();
    assert_eq!(s.statfs().unwrap().total_bytes, (48 << 20) - 4096);
    assert_eq!(std::fs::metadata(&block).unwrap().len(), 48 << 20);
    let col = CollectionId::pg(1, 2);
    let o = ObjectId::new(5, "o");
    let mut t = Transaction::new();
    t.create_collection(col);
    s.commit(t).unwrap();
    fill(&s, col, &o, 4, 9);
    drop(s);
    let s = Store::open(c.clone()).unwrap();
    check(&s, col, &o, 4, 9);
    drop(s);
    // mkfs again over it (metadata removed, label still there): refused.
    std::fs::remove_file(dir.path().join(META_FILE)).unwrap();
    let e = Store::create(c).err().expect("mkfs over a store must fail");
    assert!(e.to_string().contains("holds a cairn store"), "{e}");
}

#[test]
fn mkfs_refuses_a_file_holding_a_filesystem() {
    let dir = tempfile::tempdir().unwrap();
    let block = dir.path().join(DATA_FILE);
    let mut img = vec![0u8; 1 << 20];
    img[1080] = 0x53;
    img[1081] = 0xEF;
    std::fs::write(&block, &img).unwrap();
    let e = Store::create(cfg(dir.path())).err().expect("must refuse");
    assert!(e.to_string().contains("ext2/3/4"), "{e}");
    // Nothing changed.
    assert_eq!(std::fs::read(&block).unwrap(), img);
    assert!(!dir.path().join(META_FILE).exists());
}

/// A loop device over a sparse file, detached on drop.
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
            eprintln!(
                "losetup failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return None;
        }
        let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        Some(Loop { dev })
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        // The store may still be closing the device: retry briefly (bounded).
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

#[test]
fn store_on_a_raw_block_device() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: attaching a loop device needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("disk.img");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(96 << 20)
        .unwrap();
    let Some(lo) = Loop::attach(&backing) else {
        eprintln!("skipped: no loop device available");
        return;
    };
    let store_dir = dir.path().join("store");
    std::fs::create_dir(&store_dir).unwrap();
    std::os::unix::fs::symlink(&lo.dev, store_dir.join(DATA_FILE)).unwrap();
    let c = cfg(&store_dir);
    let s = Store::create(c.clone()).unwrap();
    assert_eq!(s.statfs().unwrap().total_bytes, (96 << 20) - 4096);
    let col = CollectionId::pg(1, 3);
    let (a, b) = (ObjectId::new(1, "a"), ObjectId::new(2, "b"));
    let mut t = Transaction::new();
    t.create_collection(col)
        .write(col, b.clone(), 100, Bytes::from_static(b"small"));
    s.commit(t).unwrap();
    fill(&s, col, &a, 16, 4);
    // While the store has it open, nobody else gets the device exclusively.
    assert!(device::OsFile::open(&lo.dev, false).is_err());
    drop(s);
    let s = Store::open(c.clone()).unwrap();
    check(&s, col, &a, 16, 4);
    assert_eq!(s.read(&col, &b, 100, 5).unwrap(), b"small");
    s.checkpoint().unwrap();
    std::fs::File::open(&lo.dev).unwrap().sync_all().unwrap();
    let before = allocated(&backing);
    let mut t = Transaction::new();
    t.remove(col, a.clone());
    s.commit(t).unwrap();
    // The discard reaches the loop device's backing file as a hole.
    std::fs::File::open(&lo.dev).unwrap().sync_all().unwrap();
    let after = allocated(&backing);
    assert!(
        before - after >= 15 << 20,
        "removing 16 MiB freed only {} bytes of the backing file",
        before - after
    );
    assert!(s.deep_fsck().unwrap().is_clean());
    drop(s);
    // mkfs over the device again is refused: it holds a store.
    std::fs::remove_file(store_dir.join(META_FILE)).unwrap();
    let e = Store::create(c).err().expect("must refuse");
    assert!(e.to_string().contains("holds a cairn store"), "{e}");
}
