//! `cairn dev up --detach` from a temp dir (the CLI finds the dev cluster
//! through `$XDG_DATA_HOME` without `CAIRN_CONF`), object ops, the bench
//! output shape, `dev down` leaving no process, and a restart with data.

mod common;

use common::{run_cmd, wait_gone, Run, CAIRN};
use std::path::{Path, PathBuf};
use std::process::Command;

struct Dev {
    tmp: tempfile::TempDir,
}

impl Dev {
    fn dir(&self) -> PathBuf {
        self.tmp.path().join("cairn").join("dev")
    }
    fn cairn(&self, args: &[&str]) -> Run {
        let mut cmd = Command::new(CAIRN);
        cmd.args(args)
            .current_dir(self.tmp.path())
            .env_remove("CAIRN_CONF")
            .env("XDG_DATA_HOME", self.tmp.path());
        run_cmd(cmd)
    }
    fn ok(&self, args: &[&str]) -> String {
        let r = self.cairn(args);
        assert!(r.ok, "cairn {args:?}: {r:?}");
        r.stdout
    }
    fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.dir().join("cairn.pid"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir().join("daemon.log")).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!("--- daemon.log (last 60 lines) ---");
            for l in &lines[lines.len().saturating_sub(60)..] {
                eprintln!("{l}");
            }
        }
        if let Some(p) = self.pid() {
            let _ = Command::new("kill").arg("-9").arg(p.to_string()).status();
            wait_gone(p);
        }
    }
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .rsplit_once(')')
            .map(|(_, r)| r.trim_start().starts_with('Z'))
            .unwrap_or(true)
}

#[test]
fn dev_up_rados_bench_down_restart() {
    let dev = Dev {
        tmp: tempfile::tempdir().unwrap(),
    };
    let out = dev.ok(&["dev", "up", "--osd-size", "1G", "--detach"]);
    eprintln!("{out}");
    assert!(
        out.contains("active+clean") && out.contains("export CAIRN_CONF="),
        "{out}"
    );
    let pid = dev.pid().expect("daemon pid");

    let input = dev.tmp.path().join("in");
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(&input, &data).unwrap();
    dev.ok(&["rados", "-p", "rbd", "put", "o1", input.to_str().unwrap()]);
    let back = dev.tmp.path().join("back");
    dev.ok(&["rados", "-p", "rbd", "get", "o1", back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap() == data);
    dev.ok(&["rados", "-p", "rbd", "setomapval", "o1", "k", "v"]);
    assert_eq!(dev.ok(&["rados", "-p", "rbd", "listomapkeys", "o1"]), "k\n");
    let st = dev.ok(&["rados", "-p", "rbd", "stat", "o1"]);
    assert!(st.starts_with("rbd/o1 size 3000000"), "{st}");
    // The EC 2+1 pool ec21 serves objects too (but no omap).
    dev.ok(&["rados", "-p", "ec21", "put", "o1", input.to_str().unwrap()]);
    let back_ec = dev.tmp.path().join("back-ec");
    dev.ok(&[
        "rados",
        "-p",
        "ec21",
        "get",
        "o1",
        back_ec.to_str().unwrap(),
    ]);
    assert!(std::fs::read(&back_ec).unwrap() == data);
    let pg = dev.ok(&["pg", "stat"]);
    assert!(pg.starts_with("64 pgs: 64 active+clean"), "{pg}");
    // `cairn -s` from the monitors' PG statistics (the OSDs' beacons).
    let s = dev.ok(&["-s"]);
    assert!(
        s.contains("pgs:     64 active+clean") && s.contains("objects: ") && s.contains("usage:"),
        "{s}"
    );

    let b = dev.ok(&[
        "rados",
        "-p",
        "rbd",
        "bench",
        "2",
        "write",
        "-b",
        "65536",
        "-t",
        "4",
        "--no-cleanup",
    ]);
    for line in [
        "  sec Cur ops   started  finished  avg MB/s  cur MB/s last lat(s)  avg lat(s)",
        "Total time run:",
        "Total writes made:",
        "Write size:             65536",
        "Object size:            65536",
        "Bandwidth (MB/sec):",
        "Stddev Bandwidth:",
        "Max bandwidth (MB/sec):",
        "Min bandwidth (MB/sec):",
        "Average IOPS:",
        "Stddev IOPS:",
        "Max IOPS:",
        "Min IOPS:",
        "Average Latency(s):",
        "Stddev Latency(s):",
        "Max latency(s):",
        "Min latency(s):",
    ] {
        assert!(b.contains(line), "bench output lacks '{line}':\n{b}");
    }
    let j = dev.ok(&[
        "rados", "-p", "rbd", "bench", "1", "rand", "-t", "4", "-f", "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(j.trim()).unwrap();
    assert!(v["total_ops_made"].as_u64().unwrap() > 0, "{j}");
    assert_eq!(v["failed_ops"].as_u64(), Some(0));
    dev.ok(&["rados", "-p", "rbd", "cleanup"]);
    let ls = dev.ok(&["rados", "-p", "rbd", "ls"]);
    assert_eq!(ls, "o1\n");

    dev.ok(&["dev", "down"]);
    wait_gone(pid);
    assert!(!alive(pid), "daemon {pid} still running after dev down");

    // Restart with its data.
    let out = dev.ok(&["dev", "up", "--detach"]);
    assert!(out.contains("active+clean"), "{out}");
    dev.ok(&["rados", "-p", "rbd", "get", "o1", back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap() == data);
    let pid = dev.pid().expect("pid");
    dev.ok(&["dev", "down"]);
    wait_gone(pid);
    assert!(!alive(pid));
}

/// A dev cluster whose OSD files cannot fit on the disk is refused before
/// anything starts, with the sizes and a smaller `--osd-size` to try.
#[test]
fn dev_up_refuses_osd_files_larger_than_the_free_space() {
    let dev = Dev {
        tmp: tempfile::tempdir().unwrap(),
    };
    let r = dev.cairn(&["dev", "up", "--osd-size", "900T", "--detach"]);
    assert!(!r.ok, "{r:?}");
    assert!(
        r.stderr.contains("free but 3 OSDs of") && r.stderr.contains("--osd-size"),
        "{r:?}"
    );
    assert!(dev.pid().is_none(), "no daemon may be left running");
    assert!(!dev.dir().join("cairn.conf").exists(), "nothing created");
}
