//! Test support: a real file-backed `BlockBackend` (sparse file, positional
//! I/O, fsync on flush/FUA, hole punching for trim) and helpers to run the
//! third-party NBD clients.
#![allow(dead_code)]

use bytes::Bytes;
use cairn_nbd::{
    BlockBackend, BlockError, BlockResult, BoxFuture, Export, NbdServer, ServerConfig,
};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub struct FileBackend {
    file: Arc<File>,
    size: u64,
    /// Delay applied to reads at offset 0 (to force out-of-order completion).
    pub slow_first_read: Option<Duration>,
    /// Export the file read-only.
    pub read_only: bool,
}

impl FileBackend {
    pub fn create(path: &Path, size: u64) -> FileBackend {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .unwrap();
        file.set_len(size).unwrap();
        FileBackend {
            file: Arc::new(file),
            size,
            slow_first_read: None,
            read_only: false,
        }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&File) -> std::io::Result<T> + Send + 'static,
    ) -> BlockResult<T> {
        let file = self.file.clone();
        tokio::task::spawn_blocking(move || f(&file))
            .await
            .map_err(|e| BlockError::Io(e.to_string()))?
            .map_err(BlockError::from)
    }
}

fn fallocate(f: &File, mode: libc::c_int, offset: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: plain syscall on an open fd with integer arguments.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            mode,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl BlockBackend for FileBackend {
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn multi_conn_safe(&self) -> bool {
        // One file, one page cache: fsync covers every connection's writes.
        true
    }
    fn read(&self, offset: u64, len: u32) -> BoxFuture<'_, BlockResult<Bytes>> {
        Box::pin(async move {
            if offset == 0 {
                if let Some(d) = self.slow_first_read {
                    tokio::time::sleep(d).await;
                }
            }
            self.blocking(move |f| {
                let mut buf = vec![0u8; len as usize];
                f.read_exact_at(&mut buf, offset)?;
                Ok(Bytes::from(buf))
            })
            .await
        })
    }
    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<'_, BlockResult<()>> {
        Box::pin(self.blocking(move |f| {
            f.write_all_at(&data, offset)?;
            if fua {
                f.sync_data()?;
            }
            Ok(())
        }))
    }
    fn flush(&self) -> BoxFuture<'_, BlockResult<()>> {
        Box::pin(self.blocking(|f| f.sync_data()))
    }
    fn trim(&self, offset: u64, len: u32, fua: bool) -> BoxFuture<'_, BlockResult<()>> {
        Box::pin(self.blocking(move |f| {
            fallocate(
                f,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                len as u64,
            )?;
            if fua {
                f.sync_data()?;
            }
            Ok(())
        }))
    }
    fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        may_punch: bool,
        fua: bool,
    ) -> BoxFuture<'_, BlockResult<()>> {
        Box::pin(self.blocking(move |f| {
            if may_punch {
                fallocate(
                    f,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset,
                    len as u64,
                )?;
            } else {
                let zeros = vec![0u8; (len as usize).min(1 << 20)];
                let mut done = 0u64;
                while done < len as u64 {
                    let n = (len as u64 - done).min(zeros.len() as u64) as usize;
                    f.write_all_at(&zeros[..n], offset + done)?;
                    done += n as u64;
                }
            }
            if fua {
                f.sync_data()?;
            }
            Ok(())
        }))
    }
}

/// Allocated bytes of a file (st_blocks * 512).
pub fn allocated_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().blocks() * 512
}

/// True when `tool` is on PATH. Absent tools fail the test under CI=true,
/// otherwise the caller skips (and says so).
pub fn have_tool(tool: &str) -> bool {
    let found = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !found {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{tool} is required in CI (install qemu-utils and libnbd-bin)");
        }
        eprintln!("SKIPPING: {tool} not installed");
    }
    found
}

/// A running server with file-backed exports in a temp dir.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub port: u16,
    pub socket: PathBuf,
    pub files: Vec<PathBuf>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    stop_unix: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Fixture {
    /// Starts a server with exports `(name, size)` on TCP and a unix socket.
    pub async fn start(exports: &[(&str, u64)], cfg: ServerConfig) -> Fixture {
        Self::start_with(exports, cfg, |_| {}).await
    }

    pub async fn start_with(
        exports: &[(&str, u64)],
        cfg: ServerConfig,
        tweak: impl Fn(&mut FileBackend),
    ) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let mut list = Vec::new();
        let mut files = Vec::new();
        for (name, size) in exports {
            let path = dir.path().join(format!("{name}.img"));
            let mut b = FileBackend::create(&path, *size);
            tweak(&mut b);
            files.push(path);
            list.push(Export {
                name: name.to_string(),
                description: format!("test disk {name}"),
                backend: Arc::new(b),
            });
        }
        let server = NbdServer::new(cfg, list).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let s = server.clone();
        tokio::spawn(async move {
            s.serve_tcp(listener, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        let socket = dir.path().join("nbd.sock");
        let ul = tokio::net::UnixListener::bind(&socket).unwrap();
        let (stop_unix, stopped_unix) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            server
                .serve_unix(ul, async {
                    let _ = stopped_unix.await;
                })
                .await
                .unwrap();
        });
        Fixture {
            dir,
            port,
            socket,
            files,
            stop: Some(stop),
            stop_unix: Some(stop_unix),
        }
    }

    pub fn url(&self, export: &str) -> String {
        format!("nbd://127.0.0.1:{}/{export}", self.port)
    }

    pub fn unix_url(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket.display())
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(s) = self.stop_unix.take() {
            let _ = s.send(());
        }
    }
}

/// Runs a command to completion; panics with its output if it fails.
pub async fn run(cmd: &str, args: &[&str]) -> String {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(cmd).args(args).output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{cmd} {args:?} timed out"))
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}\n{stdout}\n{stderr}",
        out.status
    );
    stdout + &stderr
}

/// Runs qemu-io commands against `url` and checks none failed.
pub async fn qemu_io(url: &str, cmds: &[&str]) -> String {
    let mut args = vec!["-f", "raw"];
    for c in cmds {
        args.push("-c");
        args.push(c);
    }
    args.push(url);
    let out = run("qemu-io", &args).await;
    let lower = out.to_lowercase();
    assert!(
        !lower.contains("fail") && !lower.contains("error") && !lower.contains("mismatch"),
        "qemu-io {cmds:?} reported a problem:\n{out}"
    );
    out
}
