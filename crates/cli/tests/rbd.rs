//! `cairn rbd` as a user drives it, on a real dev cluster (`cairn dev up
//! --detach` in a temp dir): the image verbs and their errors, `serve`
//! with third-party NBD clients (qemu-img, qemu-io, nbdinfo) including a
//! server killed mid-write, and the seed's own test — map, mkfs.xfs, dd,
//! rm, fstrim, du falls, unmap, map again, xfs_repair -n — through the
//! FUSE + loop mapping. Every process started is stopped by PID.

mod common;

use common::{run_cmd, wait_gone, Run, CAIRN};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

struct Dev {
    tmp: tempfile::TempDir,
    /// Children (serve processes) killed on drop.
    children: Vec<Child>,
}

impl Dev {
    fn up(osd_size: &str) -> Dev {
        let mut dev = Dev {
            tmp: tempfile::tempdir().unwrap(),
            children: Vec::new(),
        };
        std::fs::create_dir_all(dev.map_dir()).unwrap();
        let out = dev.ok(&["dev", "up", "--osd-size", osd_size, "--detach"]);
        assert!(out.contains("active+clean"), "{out}");
        dev.children.clear();
        dev
    }
    fn dir(&self) -> PathBuf {
        self.tmp.path().join("cairn").join("dev")
    }
    fn map_dir(&self) -> PathBuf {
        self.tmp.path().join("map")
    }
    fn path(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(CAIRN);
        cmd.args(args)
            .current_dir(self.tmp.path())
            .env_remove("CAIRN_CONF")
            .env("XDG_DATA_HOME", self.tmp.path())
            .env("CAIRN_RBD_MAP_DIR", self.map_dir());
        cmd
    }
    fn cairn(&self, args: &[&str]) -> Run {
        run_cmd(self.command(args))
    }
    fn ok(&self, args: &[&str]) -> String {
        let r = self.cairn(args);
        assert!(r.ok, "cairn {args:?}: {r:?}");
        r.stdout
    }
    /// Runs a command that must fail; returns its stderr.
    fn fails(&self, args: &[&str]) -> String {
        let r = self.cairn(args);
        assert!(!r.ok, "cairn {args:?} should have failed: {r:?}");
        r.stderr
    }
    fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.dir().join("cairn.pid"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }

    /// Starts `cairn rbd serve ARGS` and waits (20 s at most) for its
    /// "serving" line. Returns the child's index in `children`.
    fn serve(&mut self, args: &[&str]) -> usize {
        let out = self.path(&format!("serve{}.out", self.children.len()));
        let mut cmd = self.command(&[&["rbd", "serve"], args].concat());
        cmd.stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(out.with_extension("err")).unwrap());
        let mut child = cmd.spawn().unwrap();
        let t0 = Instant::now();
        loop {
            let text = std::fs::read_to_string(&out).unwrap_or_default();
            if text.contains("serving") {
                break;
            }
            if let Ok(Some(st)) = child.try_wait() {
                let err = std::fs::read_to_string(out.with_extension("err")).unwrap_or_default();
                panic!("rbd serve {args:?} exited {st}: {err}");
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "serve not ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        self.children.push(child);
        self.children.len() - 1
    }

    fn kill9(&mut self, i: usize) {
        let c = &mut self.children[i];
        let _ = c.kill();
        let _ = c.wait();
    }

    /// SIGTERM and wait (20 s) for a clean exit.
    fn stop(&mut self, i: usize) {
        let c = &mut self.children[i];
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let t0 = Instant::now();
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                assert!(st.success(), "serve exited {st}");
                return;
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "serve did not stop");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Mappings left by a failed test: undo them (device, helper, mount).
        for rec in std::fs::read_dir(self.map_dir())
            .into_iter()
            .flatten()
            .flatten()
        {
            let text = std::fs::read_to_string(rec.path()).unwrap_or_default();
            let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            if let Some(dev) = v["device"].as_str() {
                if let Some(mnt) = mounted_at(dev) {
                    let _ = Command::new("umount").arg("-l").arg(mnt).status();
                }
                let _ = self.cairn(&["rbd", "unmap", dev]);
            }
        }
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir().join("daemon.log")).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!("--- daemon.log (last 40 lines) ---");
            for l in &lines[lines.len().saturating_sub(40)..] {
                eprintln!("{l}");
            }
        }
        if let Some(p) = self.pid() {
            let _ = Command::new("kill").arg("-9").arg(p.to_string()).status();
            wait_gone(p);
        }
    }
}

fn mounted_at(dev: &str) -> Option<String> {
    let m = std::fs::read_to_string("/proc/self/mounts").ok()?;
    m.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next()? == dev).then(|| f.next().map(str::to_string))?
    })
}

fn ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// Whether `tool` runs; in CI a missing tool fails the test.
fn have(tool: &str, package: &str) -> bool {
    let found = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found {
        assert!(!ci(), "{tool} is required in CI (install {package})");
        eprintln!("SKIPPING the {tool} part: {tool} is not installed ({package})");
    }
    found
}

/// Runs a tool with a timeout; returns (success, stdout+stderr).
fn tool(program: &str, args: &[&str], timeout: Duration) -> (bool, String) {
    let out_f = tempfile::tempfile().unwrap();
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out_f.try_clone().unwrap())
        .stderr(out_f.try_clone().unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{program} {args:?} did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    use std::io::{Read, Seek};
    let mut f = out_f;
    let mut text = String::new();
    f.seek(std::io::SeekFrom::Start(0)).unwrap();
    f.read_to_string(&mut text).unwrap();
    (status.success(), text)
}

fn qemu_io(url: &str, cmds: &[&str]) -> String {
    let mut args = vec!["-f", "raw"];
    for c in cmds {
        args.extend(["-c", c]);
    }
    args.push(url);
    let (ok, text) = tool("qemu-io", &args, Duration::from_secs(60));
    let lower = text.to_lowercase();
    assert!(
        ok && !lower.contains("fail") && !lower.contains("error"),
        "qemu-io {cmds:?}: {text}"
    );
    text
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2654435761)
                .rotate_left(seed as u32 % 31) as u8
                ^ seed
        })
        .collect()
}

fn used_bytes(dev: &Dev, image: &str) -> u64 {
    let j = dev.ok(&["rbd", "du", image, "-f", "json"]);
    let v: serde_json::Value = serde_json::from_str(j.trim()).unwrap();
    v["images"][0]["used_size"].as_u64().unwrap()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn rbd_commands_and_nbd_clients() {
    let mut dev = Dev::up("1G");

    // create / ls / info / du, and errors that name image and pool.
    dev.ok(&[
        "rbd",
        "create",
        "vm1",
        "--size",
        "64M",
        "--object-size",
        "1M",
    ]);
    assert_eq!(dev.ok(&["rbd", "ls"]), "vm1\n");
    assert_eq!(dev.ok(&["rbd", "ls", "rbd"]), "vm1\n");
    let info = dev.ok(&["rbd", "info", "rbd/vm1"]);
    assert!(
        info.contains("rbd image 'vm1'") && info.contains("size 64 MiB in 64 objects"),
        "{info}"
    );
    assert!(info.contains("order 20 (1 MiB objects)"), "{info}");
    let e = dev.fails(&["rbd", "create", "vm1", "--size", "1G"]);
    assert!(e.contains("rbd/vm1") && e.contains("already exists"), "{e}");
    let e = dev.fails(&["rbd", "info", "nope"]);
    assert!(
        e.contains("rbd/nope") && e.contains("does not exist"),
        "{e}"
    );
    let e = dev.fails(&["rbd", "ls", "nopool"]);
    assert!(e.contains("nopool"), "{e}");
    let e = dev.fails(&["rbd", "create", "x", "--size", "10Q"]);
    assert!(e.contains("10Q"), "{e}");
    let e = dev.fails(&[
        "rbd",
        "create",
        "x",
        "--size",
        "1G",
        "--data-pool",
        "nopool",
    ]);
    assert!(e.contains("nopool"), "{e}");
    assert_eq!(used_bytes(&dev, "vm1"), 0);

    // Snapshot verbs name what is missing.
    let e = dev.fails(&["rbd", "snap", "rm", "vm1@nosuch"]);
    assert!(e.contains("no snapshot 'nosuch'"), "{e}");
    let e = dev.fails(&["rbd", "clone", "vm1", "vm2"]);
    assert!(e.contains("IMAGE@SNAP"), "{e}");
    let e = dev.fails(&["rbd", "flatten", "vm1"]);
    assert!(e.contains("not a clone"), "{e}");

    // import (sparse) / export (file and stdout) / cp / du.
    let mut data = vec![0u8; 5 * MIB as usize + 4096];
    data[..MIB as usize].copy_from_slice(&pattern(1, MIB as usize));
    data[3 * MIB as usize + 100..3 * MIB as usize + 5000].fill(0x5a);
    let input = dev.path("in.img");
    std::fs::write(&input, &data).unwrap();
    dev.ok(&["rbd", "import", input.to_str().unwrap(), "rbd/imp"]);
    let info = dev.ok(&["rbd", "info", "imp", "-f", "json"]);
    let v: serde_json::Value = serde_json::from_str(info.trim()).unwrap();
    assert_eq!(v["size"].as_u64(), Some(data.len() as u64));
    // Only the two non-zero 4 MiB chunks were written (default object size).
    let used = used_bytes(&dev, "imp");
    assert!(used > 0 && used <= 5 * MIB + 4096, "used {used}");
    let out = dev.path("out.img");
    dev.ok(&["rbd", "export", "imp", out.to_str().unwrap()]);
    assert!(std::fs::read(&out).unwrap() == data);
    // Sparse: the exported file has holes where the image is zero.
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&out).unwrap();
        assert!(
            m.blocks() * 512 < 2 * MIB,
            "export not sparse: {} blocks",
            m.blocks()
        );
    }
    let e = dev.fails(&["rbd", "export", "imp", out.to_str().unwrap()]);
    assert!(e.contains("already exists"), "{e}");
    let mut cmd = dev.command(&["rbd", "export", "imp", "-"]);
    let piped = cmd.stderr(Stdio::null()).output().unwrap();
    assert!(piped.status.success());
    assert!(piped.stdout == data);
    dev.ok(&["rbd", "cp", "imp", "imp2"]);
    let out2 = dev.path("out2.img");
    dev.ok(&["rbd", "export", "imp2", out2.to_str().unwrap()]);
    assert!(std::fs::read(&out2).unwrap() == data);
    let e = dev.fails(&["rbd", "import", "-", "fromstdin"]);
    assert!(e.contains("--size"), "{e}");

    // resize: grow, shrink refused without --allow-shrink, then allowed.
    dev.ok(&["rbd", "resize", "imp2", "--size", "16M"]);
    assert!(dev.ok(&["rbd", "info", "imp2"]).contains("size 16 MiB"));
    let e = dev.fails(&["rbd", "resize", "imp2", "--size", "1M"]);
    assert!(
        e.contains("--allow-shrink") && e.contains("rbd/imp2"),
        "{e}"
    );
    dev.ok(&["rbd", "resize", "imp2", "--size", "1M", "--allow-shrink"]);
    assert!(used_bytes(&dev, "imp2") <= MIB);
    let ls = dev.ok(&["rbd", "ls", "-l"]);
    assert!(ls.contains("imp2") && ls.contains("1 MiB"), "{ls}");
    dev.ok(&["rbd", "rm", "imp2"]);
    dev.ok(&["rbd", "rm", "imp"]);
    assert_eq!(dev.ok(&["rbd", "ls"]), "vm1\n");

    // serve: holds the lock; a second server gets a clear error.
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let s0 = dev.serve(&["vm1", "--listen", &listen]);
    let st = dev.ok(&["rbd", "status", "vm1"]);
    assert!(
        st.contains("/serve") && st.contains("exclusive lock"),
        "{st}"
    );
    assert!(dev
        .ok(&["rbd", "lock", "ls", "vm1"])
        .contains("1 exclusive lock"));
    let e = dev.fails(&["rbd", "serve", "vm1", "--listen", "127.0.0.1:0"]);
    assert!(e.contains("locked by"), "{e}");
    let e = dev.fails(&["rbd", "rm", "vm1"]);
    assert!(e.contains("locked"), "{e}");
    let url = format!("nbd://127.0.0.1:{port}/vm1");

    if have("nbdinfo", "libnbd-bin") {
        let (ok, text) = tool("nbdinfo", &["--json", &url], Duration::from_secs(30));
        assert!(ok, "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let e = &v["exports"][0];
        assert_eq!(e["export-size"].as_u64(), Some(64 * MIB), "{text}");
        assert_eq!(e["can_trim"].as_bool(), Some(true), "{text}");
        assert_eq!(e["can_flush"].as_bool(), Some(true), "{text}");
        assert_eq!(e["can_zero"].as_bool(), Some(true), "{text}");
    }

    if have("qemu-img", "qemu-utils") && have("qemu-io", "qemu-utils") {
        let (ok, text) = tool(
            "qemu-img",
            &["info", "--output=json", &url],
            Duration::from_secs(30),
        );
        assert!(ok, "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["virtual-size"].as_u64(), Some(64 * MIB), "{text}");

        // A raw file into the image over nbd://, and back out.
        let src = dev.path("src.raw");
        let mut img = vec![0u8; 64 * MIB as usize];
        img[MIB as usize - 3000..MIB as usize + 7000].copy_from_slice(&pattern(7, 10000));
        img[40 * MIB as usize..42 * MIB as usize].copy_from_slice(&pattern(9, 2 * MIB as usize));
        std::fs::write(&src, &img).unwrap();
        let (ok, text) = tool(
            "qemu-img",
            &[
                "convert",
                "-n",
                "-f",
                "raw",
                "-O",
                "raw",
                src.to_str().unwrap(),
                &url,
            ],
            Duration::from_secs(120),
        );
        assert!(ok, "{text}");
        let back = dev.path("back.raw");
        let (ok, text) = tool(
            "qemu-img",
            &[
                "convert",
                "-f",
                "raw",
                "-O",
                "raw",
                &url,
                back.to_str().unwrap(),
            ],
            Duration::from_secs(120),
        );
        assert!(ok, "{text}");
        assert!(
            std::fs::read(&back).unwrap() == img,
            "convert round trip differs"
        );
        // convert skipped zeros: only objects holding data exist.
        assert!(used_bytes(&dev, "vm1") <= 4 * MIB);

        // Patterns: aligned, unaligned, large, across 1 MiB objects,
        // trim then zeros, write-zeroes; then a flush.
        qemu_io(
            &url,
            &[
                "write -P 0xab 0 64k",
                "read -P 0xab 0 64k",
                "write -P 0x11 1048000 5000",
                "read -P 0x11 1048000 5000",
                "write -P 0x5a 2M 6M",
                "read -P 0x5a 2M 6M",
                "discard 3M 2M",
                "read -P 0 3M 2M",
                "read -P 0x5a 5M 3M",
                "write -z 6M 512k",
                "read -P 0 6M 512k",
                "write -z -u 7M 1M",
                "read -P 0 7M 1M",
                "write -P 0x42 16M 4M",
                "flush",
            ],
        );

        // fio's nbd engine: random 4 KiB writes at depth 32, verified.
        if have("fio", "fio") {
            let uri = format!("--uri={url}");
            let (ok, text) = tool(
                "fio",
                &[
                    "--name=cairn",
                    "--ioengine=nbd",
                    &uri,
                    "--rw=randwrite",
                    "--bs=4k",
                    "--iodepth=32",
                    "--size=2M",
                    "--offset=48M",
                    "--verify=crc32c",
                    "--verify_state_save=0",
                    "--do_verify=1",
                    "--verify_fatal=1",
                ],
                Duration::from_secs(120),
            );
            assert!(ok, "fio: {text}");
        }

        // Kill the server mid-write: what was flushed is intact; each
        // in-flight 64 KiB write (inside one object) landed whole or not.
        let mut writer = Command::new("qemu-io");
        writer.args(["-f", "raw"]);
        for i in 0..160u64 {
            writer.args(["-c", &format!("write -P 0x77 {} 64k", 24 * MIB + i * 65536)]);
        }
        let mut writer = writer
            .arg(&url)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(400));
        dev.kill9(s0);
        let t0 = Instant::now();
        while writer.try_wait().unwrap().is_none() {
            assert!(t0.elapsed() < Duration::from_secs(30), "qemu-io hangs");
            std::thread::sleep(Duration::from_millis(50));
        }
        // The dead server's lock stays; breaking it is explicit.
        let st = dev.ok(&["rbd", "status", "vm1"]);
        assert!(st.contains("/serve"), "{st}");
        let e = dev.fails(&["rbd", "serve", "vm1", "--listen", "127.0.0.1:0"]);
        assert!(e.contains("locked by"), "{e}");
        dev.ok(&["rbd", "lock", "break", "vm1"]);
        assert!(dev.ok(&["rbd", "lock", "ls", "vm1"]).contains("no locks"));
        // Breaking blocklisted the dead server's client instance.
        let bl = dev.ok(&["osd", "blocklist", "ls"]);
        assert!(
            bl.contains("client.admin/") && bl.contains("listed 1 entries"),
            "{bl}"
        );
        let e = dev.fails(&["osd", "blocklist", "add", "client.admin"]);
        assert!(e.contains("client.NAME/NONCE"), "{e}");
        let s1 = dev.serve(&["vm1", "--listen", &listen]);
        qemu_io(
            &url,
            &[
                "read -P 0xab 0 64k",
                "read -P 0x11 1048000 5000",
                "read -P 0x5a 2M 1M",
                "read -P 0 3M 2M",
                "read -P 0x42 16M 4M",
            ],
        );
        let after = dev.path("after.raw");
        let (ok, text) = tool(
            "qemu-img",
            &[
                "convert",
                "-f",
                "raw",
                "-O",
                "raw",
                &url,
                after.to_str().unwrap(),
            ],
            Duration::from_secs(120),
        );
        assert!(ok, "{text}");
        let a = std::fs::read(&after).unwrap();
        for i in 0..160usize {
            let at = 24 * MIB as usize + i * 65536;
            let chunk = &a[at..at + 65536];
            assert!(
                chunk.iter().all(|b| *b == 0x77) || chunk.iter().all(|b| *b == 0),
                "64 KiB write {i} was torn"
            );
        }
        dev.stop(s1);
        assert!(dev.ok(&["rbd", "lock", "ls", "vm1"]).contains("no locks"));
    } else {
        dev.stop(s0);
    }

    // Unix socket serving, two images.
    dev.ok(&["rbd", "create", "vm2", "--size", "8M"]);
    let sock = dev.path("nbd.sock");
    let s2 = dev.serve(&["vm1", "rbd/vm2", "--socket", sock.to_str().unwrap()]);
    if have("qemu-io", "qemu-utils") {
        let u = format!("nbd+unix:///vm2?socket={}", sock.display());
        qemu_io(&u, &["write -P 0x33 0 1M", "read -P 0x33 0 1M"]);
    }
    dev.stop(s2);
    assert!(!sock.exists(), "socket left behind");

    // rbd bench: rbd bench's output shape, counts, the lock released after.
    let out = dev.ok(&[
        "rbd",
        "bench",
        "vm2",
        "--io-type",
        "write",
        "--io-size",
        "4K",
        "--io-threads",
        "8",
        "--io-total",
        "256K",
        "--io-pattern",
        "rand",
    ]);
    assert!(
        out.starts_with("bench  type write io_size 4096 io_threads 8 bytes 262144 pattern random"),
        "{out}"
    );
    assert!(
        out.contains("ops: 64 ") && out.contains("ops/sec: ") && out.contains("bytes/sec: "),
        "{out}"
    );
    assert!(dev.ok(&["rbd", "lock", "ls", "vm2"]).contains("no locks"));
    let out = dev.ok(&[
        "rbd",
        "bench",
        "vm2",
        "--io-type",
        "read",
        "--io-size",
        "1M",
        "--io-total",
        "8M",
    ]);
    assert!(
        out.contains("pattern sequential") && out.contains("ops: 8 "),
        "{out}"
    );
    let err = dev.fails(&["rbd", "bench", "vm2", "--io-type", "trim"]);
    assert!(err.contains("use write or read"), "{err}");
    let err = dev.fails(&[
        "rbd",
        "bench",
        "vm2",
        "--io-type",
        "write",
        "--io-size",
        "16M",
    ]);
    assert!(err.contains("io-size") && err.contains("rbd/vm2"), "{err}");
    dev.ok(&["rbd", "rm", "vm2"]);
}

/// Whether the FUSE + loop mapping can run here; prints why not.
fn map_prerequisites() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let mut missing = Vec::new();
    if !root {
        missing.push("root (losetup and mount)".to_string());
    }
    if !Path::new("/dev/fuse").exists() {
        missing.push("/dev/fuse".into());
    }
    for t in [
        "losetup",
        "mkfs.xfs",
        "xfs_repair",
        "fstrim",
        "mount",
        "umount",
    ] {
        let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .chain(["/sbin".into(), "/usr/sbin".into()])
            .any(|d: PathBuf| d.join(t).is_file());
        if !found {
            missing.push(t.into());
        }
    }
    if !missing.is_empty() {
        eprintln!(
            "SKIPPING rbd map test: missing {} (xfsprogs, mount, util-linux)",
            missing.join(", ")
        );
    }
    missing.is_empty()
}

fn sh(cmd: &str, args: &[&str]) -> String {
    let (ok, text) = tool(cmd, args, Duration::from_secs(300));
    assert!(ok, "{cmd} {args:?}: {text}");
    text
}

/// The seed's test on one image: map, mkfs.xfs, mount, dd N×4M direct,
/// rm, fstrim, du falls; umount, unmap, map again, xfs_repair -n, unmap.
fn seed_test(dev: &Dev, image: &str, count: u64) {
    let device = dev.ok(&["rbd", "map", image]).trim().to_string();
    assert!(device.starts_with("/dev/loop"), "{device}");
    let shown = dev.ok(&["rbd", "showmapped"]);
    assert!(
        shown.contains(&device) && shown.contains("fuse+loop"),
        "{shown}"
    );
    let e = dev.fails(&["rbd", "map", image]);
    assert!(e.contains("already mapped"), "{e}");
    sh("mkfs.xfs", &["-q", "-f", &device]);
    let mnt = dev.path(&format!("mnt-{}", image.replace('/', "_")));
    std::fs::create_dir_all(&mnt).unwrap();
    let mnt_s = mnt.to_str().unwrap();
    sh("mount", &[&device, mnt_s]);
    let after_mkfs = used_bytes(dev, image);
    let of = format!("of={mnt_s}/test.dd");
    let t0 = Instant::now();
    sh(
        "dd",
        &[
            "if=/dev/zero",
            &of,
            "bs=4M",
            &format!("count={count}"),
            "oflag=direct",
        ],
    );
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "{image}: dd {count}×4M oflag=direct: {:.1} MiB/s",
        (count * 4) as f64 / secs
    );
    // O_DIRECT is not a flush: what the loop device wrote may still be in
    // the image's write cache (written back within rbd_cache_max_dirty_age).
    // An fsync of the file makes XFS flush the device, which reaches the
    // image as a flush, so `du` below counts every byte dd wrote.
    sh("sync", &[&format!("{mnt_s}/test.dd")]);
    let full = used_bytes(dev, image);
    assert!(
        // XFS may place part of the file in objects mkfs already wrote
        // (its first and last object at least: 8 MiB; seen: 4.1 MiB).
        full + 8 * MIB >= after_mkfs + count * 4 * MIB,
        "du {full} after writing {count}×4M (after mkfs {after_mkfs})"
    );
    // Unmap refuses while mounted.
    let e = dev.fails(&["rbd", "unmap", &device]);
    assert!(e.contains("mounted"), "{e}");
    std::fs::remove_file(mnt.join("test.dd")).unwrap();
    // XFS does not trim extents whose free is not yet in its log.
    sh("sync", &[]);
    let trimmed = sh("fstrim", &["-v", mnt_s]);
    eprintln!("{image}: {}", trimmed.trim());
    let after_trim = used_bytes(dev, image);
    eprintln!("{image}: du after mkfs {after_mkfs}, after dd {full}, after rm+fstrim {after_trim}");
    assert!(
        // The objects the file shared with XFS metadata (its first and last
        // at most, as above) stay; seen: 16 KiB short of a 4 MiB margin.
        after_trim + count * 4 * MIB <= full + 8 * MIB,
        "fstrim gave back too little: {full} -> {after_trim}"
    );
    sh("umount", &[mnt_s]);
    dev.ok(&["rbd", "unmap", &device]);
    assert!(dev.ok(&["rbd", "showmapped"]).is_empty());
    assert!(dev.ok(&["rbd", "lock", "ls", image]).contains("no locks"));

    let device = dev.ok(&["rbd", "map", image]).trim().to_string();
    let repair = sh("xfs_repair", &["-n", &device]);
    assert!(!repair.contains("ERROR"), "{repair}");
    // Mounting again shows an empty, clean filesystem.
    sh("mount", &[&device, mnt_s]);
    assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0);
    sh("umount", &[mnt_s]);
    dev.ok(&["rbd", "unmap", image]);

    // A read-only map takes no lock and gives a read-only device.
    let device = dev
        .ok(&["rbd", "map", image, "--read-only"])
        .trim()
        .to_string();
    assert!(dev.ok(&["rbd", "lock", "ls", image]).contains("no locks"));
    assert_eq!(sh("blockdev", &["--getro", &device]).trim(), "1");
    let (ok, _) = tool(
        "dd",
        &[
            "if=/dev/zero",
            &format!("of={device}"),
            "bs=4k",
            "count=1",
            "oflag=direct",
        ],
        Duration::from_secs(30),
    );
    assert!(!ok, "wrote to a read-only mapping");
    dev.ok(&["rbd", "unmap", &device]);
    assert!(std::fs::read_dir(dev.map_dir())
        .unwrap()
        .flatten()
        .all(|e| e.path().extension().is_some_and(|x| x == "log")));
}

#[test]
fn rbd_map_mkfs_dd_fstrim_xfs_repair() {
    if !map_prerequisites() {
        return;
    }
    let soak = std::env::var("CAIRN_SOAK").as_deref() == Ok("1");
    let (count, osd_size, image_size) = if soak {
        (256, "4G", "2G")
    } else {
        (32, "1G", "1G")
    };
    let dev = Dev::up(osd_size);
    dev.ok(&["rbd", "create", "seed", "--size", image_size]);
    // A map that fails half-way (here: the helper cannot open the image)
    // says why and leaves nothing behind.
    let e = dev.fails(&["rbd", "map", "nope"]);
    assert!(
        e.contains("rbd/nope") && e.contains("does not exist"),
        "{e}"
    );
    let left: Vec<_> = std::fs::read_dir(dev.map_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| !n.ends_with(".log"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(dev.ok(&["rbd", "showmapped"]).is_empty());
    seed_test(&dev, "seed", count);

    // A helper killed with SIGKILL: showmapped says so, the next map cleans
    // up the stale mapping and releases the dead helper's lock; unmap too.
    let device = dev.ok(&["rbd", "map", "seed"]).trim().to_string();
    assert!(device.starts_with("/dev/"), "{device}");
    let rec = dev.map_dir().join("rbd@seed.json");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&rec).unwrap()).unwrap();
    let helper = v["helper_pid"].as_u64().unwrap() as u32;
    let _ = Command::new("kill")
        .args(["-9", &helper.to_string()])
        .status();
    wait_gone(helper);
    assert!(dev.ok(&["rbd", "showmapped"]).contains("(dead)"));
    let again = dev.cairn(&["rbd", "map", "seed"]);
    assert!(again.ok, "{again:?}");
    assert!(again.stderr.contains("stale"), "{again:?}");
    let device2 = again.stdout.trim().to_string();
    assert!(!dev.ok(&["rbd", "showmapped"]).contains("(dead)"));
    let (ok, text) = tool(
        "dd",
        &[
            &format!("if={device2}"),
            "of=/dev/null",
            "bs=1M",
            "count=4",
            "iflag=direct",
        ],
        Duration::from_secs(30),
    );
    assert!(ok, "{text}");
    let helper2 = {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&rec).unwrap()).unwrap();
        v["helper_pid"].as_u64().unwrap() as u32
    };
    let _ = Command::new("kill")
        .args(["-9", &helper2.to_string()])
        .status();
    wait_gone(helper2);
    dev.ok(&["rbd", "unmap", "seed"]);
    assert!(dev.ok(&["rbd", "lock", "ls", "seed"]).contains("no locks"));

    // The same with the data on an EC 2+1 pool.
    let ec = dev.cairn(&[
        "osd",
        "erasure-code-profile",
        "set",
        "ec21",
        "k=2",
        "m=1",
        "crush-failure-domain=osd",
    ]);
    let pool = ec
        .ok
        .then(|| dev.cairn(&["osd", "pool", "create", "ec21", "8", "8", "erasure", "ec21"]));
    let created = pool.as_ref().is_some_and(|r| r.ok);
    if created {
        let _ = dev.cairn(&["osd", "pool", "set", "ec21", "allow_ec_overwrites", "true"]);
    }
    // A probe write with a deadline: a pool that does not take writes
    // fails here, naming why, rather than somewhere inside the seed test.
    let probe = dev.path("probe");
    std::fs::write(&probe, b"probe").unwrap();
    let probe_err = dev.path("probe.err");
    let served: Result<(), String> = if !created {
        Err(match (&ec, &pool) {
            (e, _) if !e.ok => format!("erasure-code-profile set failed: {}", e.stderr.trim()),
            (_, Some(p)) => format!("pool create failed: {}", p.stderr.trim()),
            _ => "pool create was not tried".into(),
        })
    } else {
        let mut cmd = dev.command(&[
            "rados",
            "-p",
            "ec21",
            "put",
            "probe",
            probe.to_str().unwrap(),
        ]);
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&probe_err).unwrap())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                break if st.success() {
                    Ok(())
                } else {
                    Err(format!(
                        "a write to pool ec21 failed: {}",
                        std::fs::read_to_string(&probe_err)
                            .unwrap_or_default()
                            .trim()
                    ))
                };
            }
            if t0.elapsed() > Duration::from_secs(15) {
                let _ = child.kill();
                let _ = child.wait();
                break Err("a write to pool ec21 did not complete within 15 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    if let Err(why) = served {
        panic!("the EC 2+1 data-pool variant cannot start: {why}");
    }
    dev.ok(&[
        "rbd",
        "create",
        "seed-ec",
        "--size",
        image_size,
        "--data-pool",
        "ec21",
    ]);
    assert!(dev
        .ok(&["rbd", "info", "seed-ec"])
        .contains("data_pool: ec21"));
    seed_test(&dev, "seed-ec", count);
}

/// A minimal NBD client (fixed newstyle, NBD_OPT_EXPORT_NAME, simple
/// replies, one request at a time) so the tests know exactly when each
/// write was acknowledged.
struct NbdClient {
    s: std::net::TcpStream,
    handle: u64,
}

impl NbdClient {
    fn connect(addr: &str, export: &str) -> NbdClient {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(&hello[..8], b"NBDMAGIC");
        s.write_all(&3u32.to_be_bytes()).unwrap(); // fixed newstyle + no zeroes
        let mut opt = b"IHAVEOPT".to_vec();
        opt.extend_from_slice(&1u32.to_be_bytes()); // NBD_OPT_EXPORT_NAME
        opt.extend_from_slice(&(export.len() as u32).to_be_bytes());
        opt.extend_from_slice(export.as_bytes());
        s.write_all(&opt).unwrap();
        let mut info = [0u8; 10];
        s.read_exact(&mut info).unwrap();
        NbdClient { s, handle: 0 }
    }

    fn request(&mut self, kind: u16, offset: u64, len: u32, data: &[u8]) -> std::io::Result<u32> {
        use std::io::{Read, Write};
        self.handle += 1;
        let mut r = 0x2560_9513u32.to_be_bytes().to_vec();
        r.extend_from_slice(&0u16.to_be_bytes());
        r.extend_from_slice(&kind.to_be_bytes());
        r.extend_from_slice(&self.handle.to_be_bytes());
        r.extend_from_slice(&offset.to_be_bytes());
        r.extend_from_slice(&len.to_be_bytes());
        r.extend_from_slice(data);
        self.s.write_all(&r)?;
        let mut rep = [0u8; 16];
        self.s.read_exact(&mut rep)?;
        assert_eq!(&rep[..4], &0x6744_6698u32.to_be_bytes());
        assert_eq!(&rep[8..], &self.handle.to_be_bytes());
        Ok(u32::from_be_bytes(rep[4..8].try_into().unwrap()))
    }

    /// Writes; Ok(()) only when the server acknowledged it without error.
    fn write(&mut self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        match self.request(1, offset, data.len() as u32, data)? {
            0 => Ok(()),
            e => Err(std::io::Error::other(format!("NBD error {e}"))),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self.request(3, 0, 0, &[])? {
            0 => Ok(()),
            e => Err(std::io::Error::other(format!("NBD error {e}"))),
        }
    }
}

const BLOCK: usize = 64 * 1024;

/// Block `block` as written by write number `seq`: the seq in the first 8
/// bytes, the block number in the next 8, then a fill byte.
fn stamped(seq: u64, block: u64) -> Vec<u8> {
    let mut b = vec![(seq % 251) as u8 + 1; BLOCK];
    b[..8].copy_from_slice(&seq.to_be_bytes());
    b[8..16].copy_from_slice(&block.to_be_bytes());
    b
}

/// The write numbers found in an image file (0 = never written), checking
/// each block is whole.
fn stamps(image: &[u8]) -> Vec<u64> {
    image
        .chunks(BLOCK)
        .enumerate()
        .map(|(i, b)| {
            if b.iter().all(|x| *x == 0) {
                return 0;
            }
            let seq = u64::from_be_bytes(b[..8].try_into().unwrap());
            assert!(
                b == stamped(seq, i as u64).as_slice(),
                "block {i} is torn or foreign"
            );
            seq
        })
        .collect()
}

/// Write `seq` goes to block `seq * 7 % blocks` (every block, scattered
/// over the objects).
fn block_of(seq: u64, blocks: u64) -> u64 {
    seq * 7 % blocks
}

#[test]
fn rbd_snapshots_are_consistent_points_in_time_and_clones_copy_on_write() {
    snapshots_and_clones(None);
}

/// The same with the image's data in the dev cluster's EC 2+1 pool: the
/// OSDs clone each shard's chunk and decode the clones on snapshot reads.
#[test]
fn rbd_snapshots_and_clones_with_data_on_ec_2_1() {
    snapshots_and_clones(Some("ec21"));
}

/// Snapshots under load (a point in time), snapshot reads over NBD,
/// protect, clone (copy-up on write), flatten, rollback and removal, with
/// the images' data in `data_pool` (None = the image's replicated pool).
fn snapshots_and_clones(data_pool: Option<&str>) {
    let mut dev = Dev::up("1G");
    let blocks = 256u64; // 16 MiB in 64 KiB blocks, 1 MiB objects
    let mut create = vec![
        "rbd",
        "create",
        "vm",
        "--size",
        "16M",
        "--object-size",
        "1M",
    ];
    if let Some(p) = data_pool {
        // Block images overwrite parts of objects: refused, with the fix
        // named, until the pool allows it.
        let mut refused = create.clone();
        refused.extend(["--data-pool", p]);
        let r = dev.cairn(&refused);
        assert!(
            !r.ok && r.stderr.contains("allow_ec_overwrites true"),
            "{r:?}"
        );
        assert!(!dev.ok(&["rbd", "ls"]).contains("vm"));
        dev.ok(&["osd", "pool", "set", p, "allow_ec_overwrites", "true"]);
        create.extend(["--data-pool", p]);
    }
    dev.ok(&create);
    if let Some(p) = data_pool {
        let info = dev.ok(&["rbd", "info", "vm"]);
        assert!(info.contains(p), "{info}");
    }
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let s0 = dev.serve(&["vm", "--listen", &listen]);

    // A writer stamps blocks one write at a time, noting when each was
    // sent and acknowledged; a snapshot is taken while it runs.
    type Log = Vec<(u64, Instant, Option<Instant>)>;
    let log: std::sync::Arc<std::sync::Mutex<Log>> = Default::default();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (log, stop, listen) = (log.clone(), stop.clone(), listen.clone());
        std::thread::spawn(move || {
            let mut c = NbdClient::connect(&listen, "vm");
            let mut seq = 1u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && seq < 100_000 {
                let b = block_of(seq, blocks);
                let sent = Instant::now();
                log.lock().unwrap().push((seq, sent, None));
                c.write(b * BLOCK as u64, &stamped(seq, b)).unwrap();
                log.lock().unwrap().last_mut().unwrap().2 = Some(Instant::now());
                seq += 1;
            }
            c.flush().unwrap();
        })
    };
    let t_wait = Instant::now();
    while log.lock().unwrap().len() < 300 {
        assert!(
            t_wait.elapsed() < Duration::from_secs(60),
            "writer too slow"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = Instant::now();
    dev.ok(&["rbd", "snap", "create", "vm@s1"]);
    let after = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    let log = log.lock().unwrap().clone();
    // Acked before the snapshot call began / sent after it returned.
    let acked_before = log
        .iter()
        .filter(|(_, _, a)| a.is_some_and(|a| a < before))
        .map(|(s, _, _)| *s)
        .max()
        .unwrap();
    let sent_after = log
        .iter()
        .filter(|(_, s, _)| *s > after)
        .map(|(s, _, _)| *s)
        .min()
        .expect("no write was sent after the snapshot");
    let snap_file = dev.path("s1.img");
    dev.ok(&["rbd", "export", "vm@s1", snap_file.to_str().unwrap()]);
    let found = stamps(&std::fs::read(&snap_file).unwrap());
    let newest = *found.iter().max().unwrap();
    assert!(
        newest >= acked_before && newest < sent_after,
        "snapshot holds writes up to {newest}; acked before it: {acked_before}, sent after: {sent_after}"
    );
    // Exactly the image after write `newest`: a point in time.
    let mut expect = vec![0u64; blocks as usize];
    for seq in 1..=newest {
        expect[block_of(seq, blocks) as usize] = seq;
    }
    assert_eq!(found, expect, "the snapshot is not a point in time");
    eprintln!(
        "snapshot under load: holds writes 1..={newest} (acked before the call: {acked_before}, \
         first sent after it returned: {sent_after}; the call took {:?})",
        after - before
    );

    // The head kept going; snapshot lists and the info show it.
    let head_file = dev.path("head.img");
    dev.stop(s0);
    dev.ok(&["rbd", "export", "vm", head_file.to_str().unwrap()]);
    let head = stamps(&std::fs::read(&head_file).unwrap());
    assert!(head.iter().max().unwrap() > &newest);
    let ls = dev.ok(&["rbd", "snap", "ls", "vm"]);
    assert!(ls.contains("s1") && ls.contains("16 MiB"), "{ls}");
    assert!(dev.ok(&["rbd", "info", "vm"]).contains("snapshot_count: 1"));
    assert!(dev.ok(&["rbd", "ls", "-l"]).contains("vm@s1"));
    let e = dev.fails(&["rbd", "snap", "create", "vm@s1"]);
    assert!(e.contains("already has a snapshot named 's1'"), "{e}");
    let e = dev.fails(&["rbd", "rm", "vm"]);
    assert!(e.contains("has snapshots"), "{e}");

    // A snapshot served over NBD is read-only and reads the snapshot.
    let s1 = dev.serve(&["vm@s1", "--listen", &listen]);
    {
        let mut c = NbdClient::connect(&listen, "vm@s1");
        assert!(
            c.write(0, &[1u8; 512]).is_err(),
            "a snapshot accepted a write"
        );
    }
    if have("qemu-img", "qemu-utils") {
        let out = dev.path("s1-nbd.img");
        let url = format!("nbd://{listen}/vm@s1");
        let (ok, text) = tool(
            "qemu-img",
            &[
                "convert",
                "-f",
                "raw",
                "-O",
                "raw",
                &url,
                out.to_str().unwrap(),
            ],
            Duration::from_secs(60),
        );
        assert!(ok, "{text}");
        assert_eq!(stamps(&std::fs::read(&out).unwrap()), expect);
    }
    dev.stop(s1);

    // Protect, clone (reads fall through, writes copy up), unprotect refused.
    let e = dev.fails(&["rbd", "clone", "vm@s1", "child"]);
    assert!(e.contains("not protected"), "{e}");
    dev.ok(&["rbd", "snap", "protect", "vm@s1"]);
    let e = dev.fails(&["rbd", "snap", "rm", "vm@s1"]);
    assert!(e.contains("protected from removal"), "{e}");
    let mut clone = vec!["rbd", "clone", "vm@s1", "child"];
    if let Some(p) = data_pool {
        clone.extend(["--data-pool", p]);
    }
    dev.ok(&clone);
    let info = dev.ok(&["rbd", "info", "child"]);
    assert!(info.contains("parent: rbd/vm@s1"), "{info}");
    let e = dev.fails(&["rbd", "snap", "unprotect", "vm@s1"]);
    assert!(e.contains("child(ren)") && e.contains("rbd/child"), "{e}");
    let s2 = dev.serve(&["child", "--listen", &listen]);
    {
        let mut c = NbdClient::connect(&listen, "child");
        c.write(BLOCK as u64, &stamped(999_999, 1)).unwrap();
        c.flush().unwrap();
    }
    dev.stop(s2);
    let child_file = dev.path("child.img");
    dev.ok(&["rbd", "export", "child", child_file.to_str().unwrap()]);
    let mut child_expect = expect.clone();
    child_expect[1] = 999_999;
    assert_eq!(stamps(&std::fs::read(&child_file).unwrap()), child_expect);
    // Only the written object was copied up.
    assert_eq!(used_bytes(&dev, "child"), 1 << 20);
    dev.ok(&["rbd", "flatten", "child"]);
    assert!(!dev.ok(&["rbd", "info", "child"]).contains("parent:"));
    std::fs::remove_file(&child_file).unwrap();
    dev.ok(&["rbd", "export", "child", child_file.to_str().unwrap()]);
    assert_eq!(stamps(&std::fs::read(&child_file).unwrap()), child_expect);
    dev.ok(&["rbd", "snap", "unprotect", "vm@s1"]);

    // Rollback: the head becomes the snapshot again.
    dev.ok(&["rbd", "snap", "rollback", "vm@s1"]);
    std::fs::remove_file(&head_file).unwrap();
    dev.ok(&["rbd", "export", "vm", head_file.to_str().unwrap()]);
    assert_eq!(stamps(&std::fs::read(&head_file).unwrap()), expect);

    // Removing the snapshot trims its clones; then the image can go.
    dev.ok(&["rbd", "snap", "rm", "vm@s1"]);
    assert_eq!(dev.ok(&["rbd", "snap", "ls", "vm"]), "");
    dev.ok(&["rbd", "rm", "vm"]);
    dev.ok(&["rbd", "rm", "child"]);
}

/// Issue 8's crash test on three real node daemons (mon + one OSD each,
/// pool size 3 / min_size 2): while a client streams flushed writes through
/// `rbd serve`, node c (its OSD and mon) is SIGKILLed and then the NBD
/// server too. After breaking the lock and serving again, every write
/// flushed before the kill reads back (each block whole: the flushed
/// write or a newer acknowledged one), also after node c is back and the
/// PGs are clean again.
#[test]
fn rbd_nbd_server_and_an_osd_killed_mid_write() {
    let mut c = common::Cluster::bootstrap();
    c.join("b", &[]);
    c.join("c", &[]);
    c.until_quorum(3);
    for (k, v) in [
        ("osd_heartbeat_interval", "1"),
        ("osd_heartbeat_grace", "3"),
        ("osd_beacon_report_interval", "1"),
    ] {
        c.ok(&["config", "set", "osd", k, v]);
    }
    for n in &c.nodes {
        let path = n.dir.join("disk0");
        c.ok(&[
            "disk",
            "add",
            path.to_str().unwrap(),
            "--size",
            "256M",
            "--host",
            &format!("node-{}", n.name),
            "--data",
            n.dir.to_str().unwrap(),
        ]);
    }
    c.ok(&["osd", "pool", "create", "rbd", "16"]);
    let clean = |within: Duration| {
        let t0 = Instant::now();
        loop {
            let r = c.cairn(&["pg", "stat", "-f", "json"]);
            let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap_or_default();
            let total = v["num_pgs"].as_u64().unwrap_or(0);
            let clean = v["by_state"]["active+clean"].as_u64().unwrap_or(0);
            if total > 0 && clean == total {
                return;
            }
            assert!(t0.elapsed() < within, "PGs not clean: {}", r.stdout);
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    clean(Duration::from_secs(60));
    let blocks = 512u64; // 32 MiB in 64 KiB blocks, 1 MiB objects
    c.ok(&[
        "rbd",
        "create",
        "vm",
        "--size",
        "32M",
        "--object-size",
        "1M",
    ]);

    let conf = c.nodes[0].conf();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let serve = |extra: &[&str], tag: &str| -> Child {
        let out = c.tmp.path().join(format!("serve-{tag}.out"));
        let mut child = Command::new(CAIRN)
            .arg("-c")
            .arg(&conf)
            .args(["rbd", "serve", "vm", "--listen", &listen])
            .args(extra)
            .env_remove("CAIRN_CONF")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(out.with_extension("err")).unwrap())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while !std::fs::read_to_string(&out)
            .unwrap_or_default()
            .contains("serving")
        {
            if let Ok(Some(st)) = child.try_wait() {
                let err = std::fs::read_to_string(out.with_extension("err")).unwrap_or_default();
                panic!("rbd serve exited {st}: {err}");
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "serve not ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        child
    };
    let mut server = serve(&[], "first");

    // The writer: stamped 64 KiB writes, a flush after every fourth; it
    // notes the last write covered by a successful flush.
    let flushed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writer = {
        let (flushed, sent, listen) = (flushed.clone(), sent.clone(), listen.clone());
        std::thread::spawn(move || {
            let mut cl = NbdClient::connect(&listen, "vm");
            for seq in 1..1_000_000u64 {
                let b = block_of(seq, blocks);
                sent.store(seq, std::sync::atomic::Ordering::SeqCst);
                if cl.write(b * BLOCK as u64, &stamped(seq, b)).is_err() {
                    return;
                }
                if seq % 4 == 0 {
                    if cl.flush().is_err() {
                        return;
                    }
                    flushed.store(seq, std::sync::atomic::Ordering::SeqCst);
                }
            }
        })
    };
    let t0 = Instant::now();
    while flushed.load(std::sync::atomic::Ordering::SeqCst) < 200 {
        assert!(t0.elapsed() < Duration::from_secs(90), "writer too slow");
        std::thread::sleep(Duration::from_millis(20));
    }
    c.kill9("c");
    std::thread::sleep(Duration::from_millis(1500));
    let _ = server.kill();
    let _ = server.wait();
    let t0 = Instant::now();
    while !writer.is_finished() {
        assert!(t0.elapsed() < Duration::from_secs(30), "writer hangs");
        std::thread::sleep(Duration::from_millis(50));
    }
    writer.join().unwrap();
    let flushed = flushed.load(std::sync::atomic::Ordering::SeqCst);
    let sent = sent.load(std::sync::atomic::Ordering::SeqCst);

    let check = |tag: &str| {
        let file = c.tmp.path().join(format!("{tag}.img"));
        let r = c.cairn(&["rbd", "export", "vm", file.to_str().unwrap()]);
        assert!(r.ok, "export: {r:?}");
        let found = stamps(&std::fs::read(&file).unwrap());
        let mut need = vec![0u64; blocks as usize];
        for seq in 1..=flushed {
            need[block_of(seq, blocks) as usize] = seq;
        }
        for (b, (have, need)) in found.iter().zip(&need).enumerate() {
            // (sent + 1: the write made after reconnecting.)
            assert!(
                *have >= *need && *have <= sent + 1,
                "{tag}: block {b} holds write {have}; flushed {need}, last sent {sent}"
            );
        }
        found
    };
    // Reconnect: the dead server's lock must be broken explicitly.
    let r = c.cairn(&["rbd", "serve", "vm", "--listen", "127.0.0.1:0"]);
    assert!(!r.ok && r.stderr.contains("locked by"), "{r:?}");
    let mut server = serve(&["--break-lock"], "second");
    {
        let mut cl = NbdClient::connect(&listen, "vm");
        cl.write(0, &stamped(sent + 1, 0)).unwrap();
        cl.flush().unwrap();
    }
    let _ = server.kill();
    let _ = server.wait();
    let degraded = check("degraded");
    assert_eq!(degraded[0], sent + 1);
    eprintln!(
        "killed node c and the NBD server after {flushed} flushed writes ({sent} sent): \
         everything flushed reads back"
    );
    let r = c.start("c");
    assert!(r.ok, "restart c: {r:?}");
    clean(Duration::from_secs(90));
    assert_eq!(check("recovered"), degraded);
}

/// The write cache as a disk's: through NBD, writes acknowledged from the
/// cache, a flush every 32nd write, then `kill -9` of the server with
/// unflushed writes in its cache. Every write covered by a flush reads
/// back; every block holds one whole write (the flushed one or a later
/// one), never a torn or foreign block.
#[test]
fn rbd_nbd_server_killed_with_unflushed_writes_in_its_cache() {
    let mut dev = Dev::up("1G");
    let blocks = 512u64; // 32 MiB in 64 KiB blocks, 1 MiB objects
    dev.ok(&[
        "rbd",
        "create",
        "vm",
        "--size",
        "32M",
        "--object-size",
        "1M",
    ]);
    let listen = format!("127.0.0.1:{}", free_port());
    let server = dev.serve(&["vm", "--listen", &listen]);
    let flushed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writer = {
        let (flushed, sent, listen) = (flushed.clone(), sent.clone(), listen.clone());
        std::thread::spawn(move || {
            let mut cl = NbdClient::connect(&listen, "vm");
            for seq in 1..1_000_000u64 {
                let b = block_of(seq, blocks);
                sent.store(seq, std::sync::atomic::Ordering::SeqCst);
                if cl.write(b * BLOCK as u64, &stamped(seq, b)).is_err() {
                    return;
                }
                if seq % 32 == 0 {
                    if cl.flush().is_err() {
                        return;
                    }
                    flushed.store(seq, std::sync::atomic::Ordering::SeqCst);
                }
            }
        })
    };
    let t0 = Instant::now();
    while flushed.load(std::sync::atomic::Ordering::SeqCst) < 640 {
        assert!(t0.elapsed() < Duration::from_secs(120), "writer too slow");
        std::thread::sleep(Duration::from_millis(5));
    }
    dev.kill9(server);
    let t0 = Instant::now();
    while !writer.is_finished() {
        assert!(t0.elapsed() < Duration::from_secs(30), "writer hangs");
        std::thread::sleep(Duration::from_millis(50));
    }
    writer.join().unwrap();
    let flushed = flushed.load(std::sync::atomic::Ordering::SeqCst);
    let sent = sent.load(std::sync::atomic::Ordering::SeqCst);
    let file = dev.path("after-kill.img");
    dev.ok(&["rbd", "export", "vm", file.to_str().unwrap()]);
    let found = stamps(&std::fs::read(&file).unwrap());
    let mut need = vec![0u64; blocks as usize];
    let mut last = vec![0u64; blocks as usize];
    for seq in 1..=sent {
        if seq <= flushed {
            need[block_of(seq, blocks) as usize] = seq;
        }
        last[block_of(seq, blocks) as usize] = seq;
    }
    let mut lost = 0;
    for (b, have) in found.iter().enumerate() {
        assert!(
            *have >= need[b]
                && *have <= sent
                && (*have == 0 || block_of(*have, blocks) == b as u64),
            "block {b} holds write {have}; flushed {}, last sent {sent}",
            need[b]
        );
        lost += usize::from(*have < last[b]);
    }
    eprintln!(
        "killed the NBD server after {flushed} flushed writes ({sent} sent): everything \
         flushed reads back; {lost} blocks kept an older write (unflushed writes lost)"
    );
}
