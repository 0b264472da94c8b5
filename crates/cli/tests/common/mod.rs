//! Test harness: real `cairn` daemons on 127.0.0.x with free ports, in temp
//! dirs; every daemon started is killed by PID when the cluster is dropped
//! (also when a test fails), and waited for until every thread of it has
//! exited (`wait_gone`). `dev` is the same for the one-machine dev cluster.
#![allow(dead_code)]

pub mod dev;

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

pub const CAIRN: &str = env!("CARGO_BIN_EXE_cairn");

/// Each cluster in this test binary gets its own 127.0.0.x range so
/// parallel tests never collide.
static NEXT_HOST: AtomicU8 = AtomicU8::new(10);

pub fn free_addr(ip: &str) -> SocketAddr {
    let l = TcpListener::bind(format!("{ip}:0")).expect("bind a free port");
    l.local_addr().unwrap()
}

pub struct Node {
    pub name: String,
    pub dir: PathBuf,
    pub addr: SocketAddr,
}

impl Node {
    pub fn conf(&self) -> PathBuf {
        self.dir.join("cairn.conf")
    }
    pub fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.dir.join("cairn.pid"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }
}

pub struct Cluster {
    pub tmp: tempfile::TempDir,
    pub nodes: Vec<Node>,
    /// Every pid ever started, killed on drop.
    pids: std::sync::Mutex<Vec<u32>>,
    host_base: u8,
}

pub struct Run {
    pub ok: bool,
    /// How the process ended (exit code or the signal that killed it).
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ok={} ({}) after {:?}\n--stdout--\n{}\n--stderr--\n{}",
            self.ok, self.status, self.elapsed, self.stdout, self.stderr
        )
    }
}

/// Runs a command with its output in temp files, not pipes: a daemon it
/// starts may inherit stray descriptors (libfaketime leaves some open) and
/// must not keep the test waiting for end-of-file.
pub fn run_cmd(mut cmd: Command) -> Run {
    let out_f = tempfile::tempfile().expect("temp file");
    let err_f = tempfile::tempfile().expect("temp file");
    cmd.stdin(std::process::Stdio::null())
        .stdout(out_f.try_clone().unwrap())
        .stderr(err_f.try_clone().unwrap());
    let t0 = Instant::now();
    let status = cmd.status().expect("run cairn");
    let elapsed = t0.elapsed();
    let read = |mut f: std::fs::File| {
        use std::io::{Read, Seek};
        let mut s = String::new();
        let _ = f.seek(std::io::SeekFrom::Start(0));
        let _ = f.read_to_string(&mut s);
        s
    };
    Run {
        ok: status.success(),
        status,
        stdout: read(out_f),
        stderr: read(err_f),
        elapsed,
    }
}

pub fn faketime_available() -> bool {
    Command::new("faketime")
        .arg("--version")
        .output()
        .map(|o| o.status.success() || !o.stdout.is_empty() || !o.stderr.is_empty())
        .unwrap_or(false)
}

impl Cluster {
    /// Bootstraps mon `a`.
    pub fn bootstrap() -> Cluster {
        let host_base = NEXT_HOST.fetch_add(4, Ordering::SeqCst);
        let tmp = tempfile::tempdir().unwrap();
        let mut c = Cluster {
            tmp,
            nodes: Vec::new(),
            pids: std::sync::Mutex::new(Vec::new()),
            host_base,
        };
        let ip = c.ip(0);
        let addr = free_addr(&ip);
        let dir = c.tmp.path().join("a");
        let r = run_cmd({
            let mut cmd = Command::new(CAIRN);
            cmd.args(["bootstrap", "--mon-ip", &addr.to_string(), "--data"])
                .arg(&dir)
                .env_remove("CAIRN_CONF");
            cmd
        });
        let node = Node {
            name: "a".into(),
            dir,
            addr,
        };
        if let Some(p) = node.pid() {
            c.pids.lock().unwrap().push(p);
        }
        assert!(r.ok, "bootstrap failed: {r:?}");
        c.nodes.push(node);
        c
    }

    pub fn ip(&self, i: usize) -> String {
        format!("127.0.{}.{}", self.host_base, i + 1)
    }

    pub fn token(&self) -> String {
        std::fs::read_to_string(self.nodes[0].dir.join("join-token"))
            .unwrap()
            .trim()
            .to_string()
    }

    /// Joins a new mon; `wrapper` (e.g. `["faketime", "+1h"]`) prefixes the command.
    pub fn join(&mut self, name: &str, wrapper: &[&str]) {
        let i = self.nodes.len();
        let addr = free_addr(&self.ip(i));
        let dir = self.tmp.path().join(name);
        let token = self.token();
        let mut cmd = if wrapper.is_empty() {
            Command::new(CAIRN)
        } else {
            let mut c = Command::new(wrapper[0]);
            c.args(&wrapper[1..]).arg(CAIRN);
            c
        };
        cmd.args([
            "join",
            &token,
            "--mon-ip",
            &addr.to_string(),
            "--name",
            name,
            "--data",
        ])
        .arg(&dir)
        .env_remove("CAIRN_CONF");
        let r = run_cmd(cmd);
        let node = Node {
            name: name.into(),
            dir,
            addr,
        };
        if let Some(p) = node.pid() {
            self.pids.lock().unwrap().push(p);
        }
        assert!(r.ok, "join {name} failed: {r:?}");
        self.nodes.push(node);
    }

    pub fn node(&self, name: &str) -> &Node {
        self.nodes.iter().find(|n| n.name == name).unwrap()
    }

    /// Runs an admin command with the bootstrap node's conf and admin key.
    pub fn cairn(&self, args: &[&str]) -> Run {
        let mut cmd = Command::new(CAIRN);
        cmd.arg("-c")
            .arg(self.nodes[0].conf())
            .args(args)
            .env_remove("CAIRN_CONF");
        run_cmd(cmd)
    }

    /// Like `cairn`, asserting success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let r = self.cairn(args);
        assert!(r.ok, "cairn {args:?} failed: {r:?}");
        r.stdout
    }

    /// Three 256 MiB OSDs on the bootstrap node, each as its own CRUSH host
    /// (so size 3 places), and pool `rbd` with 4 PGs, waited to
    /// active+clean (60 s).
    pub fn three_osds_and_rbd_pool(&self) {
        let dir = self.nodes[0].dir.clone();
        for i in 0..3 {
            let path = dir.join(format!("disk{i}"));
            let r = self.cairn(&[
                "disk",
                "add",
                path.to_str().unwrap(),
                "--size",
                "256M",
                "--host",
                &format!("host-{i}"),
                "--data",
                dir.to_str().unwrap(),
            ]);
            assert!(r.ok, "disk add: {r:?}");
        }
        self.ok(&["osd", "pool", "create", "rbd", "4"]);
        let t0 = Instant::now();
        while !self.ok(&["pg", "stat"]).contains("4 active+clean") {
            assert!(t0.elapsed() < Duration::from_secs(60), "PGs not clean");
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Runs a command until it succeeds or `within` passes.
    pub fn until_ok(&self, args: &[&str], within: Duration) -> Run {
        let t0 = Instant::now();
        loop {
            let r = self.cairn(args);
            if r.ok || t0.elapsed() > within {
                return Run {
                    elapsed: t0.elapsed(),
                    ..r
                };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits (up to 10 s) until `mon stat` shows `n` mons in quorum.
    pub fn until_quorum(&self, n: usize) -> Run {
        let want = format!(
            "quorum {}",
            (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(",")
        );
        let t0 = Instant::now();
        loop {
            let r = self.cairn(&["mon", "stat"]);
            if r.ok && r.stdout.contains(&want) {
                return r;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "no quorum of {n}: {r:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn leader(&self) -> String {
        let out = self.ok(&["quorum_status", "-f", "json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["quorum_leader_name"].as_str().unwrap().to_string()
    }

    pub fn kill9(&self, name: &str) {
        let n = self.node(name);
        let pid = n.pid().expect("pid file");
        let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
        wait_gone(pid);
        let _ = std::fs::remove_file(n.dir.join("cairn.pid"));
    }

    pub fn stop(&self, name: &str) -> Run {
        let mut cmd = Command::new(CAIRN);
        cmd.args(["daemon", "stop", "--data"])
            .arg(&self.node(name).dir);
        run_cmd(cmd)
    }

    pub fn start(&self, name: &str) -> Run {
        let n = self.node(name);
        let mut cmd = Command::new(CAIRN);
        cmd.arg("-c")
            .arg(n.conf())
            .arg("daemon")
            .env_remove("CAIRN_CONF");
        let r = run_cmd(cmd);
        if let Some(p) = n.pid() {
            self.pids.lock().unwrap().push(p);
        }
        r
    }

    pub fn epoch(&self) -> u64 {
        let out = self.ok(&["mon", "stat"]);
        out.trim_start_matches('e')
            .split(':')
            .next()
            .and_then(|e| e.parse().ok())
            .unwrap_or_else(|| panic!("cannot read the epoch from {out}"))
    }
}

/// Bound on waiting for a killed process to be gone.
pub const GONE_WAIT: Duration = Duration::from_secs(10);

/// Waits (up to `GONE_WAIT`) until every thread of process `pid` has
/// exited; true when it has. A killed process's main thread can show as a
/// zombie while its other threads are still exiting and still hold its
/// files (a store's lock among them); the kernel releases those before the
/// last thread's exit is reported, which is what a pidfd signals
/// (readable once the whole thread group has exited). Without pidfds
/// (Linux < 5.3) it polls `/proc/PID/task` instead.
pub fn wait_gone(pid: u32) -> bool {
    wait_gone_within(pid, GONE_WAIT)
}

/// `wait_gone` with its own bound.
pub fn wait_gone_within(pid: u32, within: Duration) -> bool {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if fd < 0 {
        return match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ESRCH) => true,
            _ => poll_thread_group_gone(pid, within),
        };
    }
    let fd = fd as libc::c_int;
    let deadline = Instant::now() + within;
    let gone = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, a bounded timeout.
        let n = unsafe { libc::poll(&mut p, 1, left.as_millis().max(1) as libc::c_int) };
        if n > 0 {
            break true;
        }
        let interrupted =
            n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR);
        if !interrupted || left.is_zero() {
            break false;
        }
    };
    // SAFETY: fd is ours and closed once.
    unsafe { libc::close(fd) };
    gone
}

/// `wait_gone` without pidfds: gone when `/proc/PID` is, or when it is a
/// zombie whose thread list holds nothing but itself.
fn poll_thread_group_gone(pid: u32, within: Duration) -> bool {
    let t0 = Instant::now();
    loop {
        if thread_group_gone(pid) {
            return true;
        }
        if t0.elapsed() > within {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// True when no thread of `pid` runs any more (see `poll_thread_group_gone`).
pub fn thread_group_gone(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    let zombie = stat
        .rsplit_once(')')
        .is_some_and(|(_, r)| r.trim_start().starts_with(['Z', 'X']));
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0);
    zombie && threads <= 1
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let mut pids = self.pids.lock().map(|p| p.clone()).unwrap_or_default();
        for n in &self.nodes {
            if let Some(p) = n.pid() {
                pids.push(p);
            }
        }
        pids.sort();
        pids.dedup();
        for p in pids {
            // Only our own daemons: check the command line names this cluster's dir.
            let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            if cmdline.contains(&*self.tmp.path().to_string_lossy()) {
                let _ = Command::new("kill").arg("-9").arg(p.to_string()).status();
                wait_gone(p);
            }
        }
    }
}
