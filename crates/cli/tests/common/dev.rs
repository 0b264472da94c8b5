//! The one-machine dev cluster (`cairn dev up --detach`) in a temp dir, for
//! tests: admin commands run against it (each bounded by coreutils
//! `timeout`), and its daemon is killed by PID when the `Dev` is dropped,
//! with the tail of its log printed when a test fails. Owns no assertions
//! about what a test expects.

use super::{run_cmd, wait_gone, Run, CAIRN};
use std::path::PathBuf;
use std::process::Command;

/// Bound on one `cairn` command of a dev-cluster test.
const CMD_TIMEOUT_SECS: &str = "120";
/// Lines of the daemon's log printed when a test fails.
const LOG_TAIL_LINES: usize = 60;

/// How commands find the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Find {
    /// By themselves: `$XDG_DATA_HOME/cairn/dev`, no `CAIRN_CONF`.
    Default,
    /// Through `CAIRN_CONF` naming `<tmp>/dev/cairn.conf` (made with
    /// `dev up --dir <tmp>/dev`).
    Conf,
}

pub struct Dev {
    pub tmp: tempfile::TempDir,
    find: Find,
}

impl Dev {
    /// A dev cluster in the default place (`$XDG_DATA_HOME/cairn/dev`,
    /// with `XDG_DATA_HOME` the temp dir): the CLI finds it on its own.
    pub fn at_default_place() -> Dev {
        Dev {
            tmp: tempfile::tempdir().expect("temp dir"),
            find: Find::Default,
        }
    }

    /// A dev cluster in `<tmp>/dev` (the test passes `--dir`), reached
    /// through `CAIRN_CONF`.
    pub fn in_own_dir() -> Dev {
        Dev {
            tmp: tempfile::tempdir().expect("temp dir"),
            find: Find::Conf,
        }
    }

    /// The cluster's directory.
    pub fn dir(&self) -> PathBuf {
        match self.find {
            Find::Default => self.tmp.path().join("cairn").join("dev"),
            Find::Conf => self.tmp.path().join("dev"),
        }
    }

    /// Runs `cairn ARGS` against the cluster (bounded by `CMD_TIMEOUT_SECS`).
    pub fn cairn(&self, args: &[&str]) -> Run {
        let mut cmd = Command::new("timeout");
        cmd.arg(CMD_TIMEOUT_SECS)
            .arg(CAIRN)
            .args(args)
            .current_dir(self.tmp.path());
        match self.find {
            Find::Default => cmd
                .env_remove("CAIRN_CONF")
                .env("XDG_DATA_HOME", self.tmp.path()),
            Find::Conf => cmd.env("CAIRN_CONF", self.dir().join("cairn.conf")),
        };
        run_cmd(cmd)
    }

    /// Like `cairn`, asserting success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let r = self.cairn(args);
        assert!(r.ok, "cairn {args:?}: {r:?}");
        r.stdout
    }

    /// The daemon's pid, from its pid file.
    pub fn pid(&self) -> Option<u32> {
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
            eprintln!("--- daemon.log (last {LOG_TAIL_LINES} lines) ---");
            for l in &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..] {
                eprintln!("{l}");
            }
        }
        if let Some(p) = self.pid() {
            let _ = Command::new("kill").arg("-9").arg(p.to_string()).status();
            wait_gone(p);
        }
    }
}
