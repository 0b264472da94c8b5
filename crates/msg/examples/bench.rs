//! Loopback request/response throughput of cairn-msg (signed frames, one
//! connection). Run with:
//!     cargo run --release -p cairn-msg --example bench -- [SECONDS]
//! Each case runs for SECONDS (default 3) with 1 and 8 concurrent callers:
//! "write" sends SIZE bytes and gets an empty reply; "read" sends an empty
//! request and gets SIZE bytes back.

use bytes::Bytes;
use cairn_msg::{connect, Credentials, KeyServer, Listener, MsgConfig, Secret};
use cairn_types::EntityName;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WRITE: u16 = 1;
const READ: u16 = 2;

struct OneKey(EntityName, Secret);
impl KeyServer for OneKey {
    fn secret_for(&self, name: &EntityName) -> Option<Secret> {
        (name == &self.0).then(|| self.1.clone())
    }
    fn service_secret(&self, _generation: u64) -> Option<Secret> {
        None
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secs: u64 = match std::env::args().nth(1) {
        Some(s) => s.parse()?,
        None => 3,
    };
    let key = Secret::generate();
    let client_name = EntityName::client("bench");
    let cfg = MsgConfig::default();
    let l = Listener::bind(
        "127.0.0.1:0".parse()?,
        EntityName::osd(0),
        Arc::new(OneKey(client_name.clone(), key.clone())),
        cfg.clone(),
    )
    .await?;
    let addr = l.local_addr();
    // Read replies share one pre-built buffer (Bytes clones are free), so
    // the numbers measure the messenger, not the server's memset.
    let read_data = Bytes::from(vec![0x5au8; 4 << 20]);
    tokio::spawn(async move {
        while let Ok(conn) = l.accept().await {
            let read_data = read_data.clone();
            tokio::spawn(async move {
                while let Ok(m) = conn.recv().await {
                    let conn = conn.clone();
                    let read_data = read_data.clone();
                    tokio::spawn(async move {
                        let body = if m.msg_type == READ {
                            let len =
                                u32::from_le_bytes(m.payload[..4].try_into().unwrap_or([0; 4]))
                                    as usize;
                            read_data.slice(..len.min(read_data.len()))
                        } else {
                            Bytes::new()
                        };
                        let _ = conn.reply(&m, m.msg_type, body).await;
                    });
                }
            });
        }
    });
    let creds = Credentials::Key {
        name: client_name,
        secret: key,
    };
    let conn = connect(addr, &creds, None, &cfg).await?;
    println!("cairn-msg loopback benchmark, {secs} s per case, keyed-BLAKE3 signed frames");
    {
        let k = cairn_msg::auth::FrameKey::new(&Secret::generate());
        let buf = vec![7u8; 64 << 20];
        let (t, c) = (Instant::now(), cpu_seconds());
        let mut mac = [0u8; 16];
        for _ in 0..4 {
            mac = k.sign(b"header", &buf);
        }
        let (el, cpu) = (t.elapsed().as_secs_f64(), cpu_seconds() - c);
        println!(
            "frame MAC alone: {:.0} MiB/s wall, {:.0} MiB per CPU-second (mac {:02x})",
            256.0 / el,
            256.0 / cpu.max(0.01),
            mac[0]
        );
    }
    println!(
        "{:<6} {:>8} {:>6} {:>10} {:>10} {:>12} {:>12}",
        "op", "size", "conc", "ops/s", "MiB/s", "avg lat", "CPU us/op"
    );
    for size in [4usize << 10, 4 << 20] {
        for kind in [WRITE, READ] {
            for conc in [1usize, 8] {
                let ops = Arc::new(AtomicU64::new(0));
                let deadline = Instant::now() + Duration::from_secs(secs);
                let start = Instant::now();
                let cpu0 = cpu_seconds();
                let mut tasks = Vec::new();
                for _ in 0..conc {
                    let (conn, ops) = (conn.clone(), ops.clone());
                    let req = if kind == WRITE {
                        Bytes::from(vec![0xa5u8; size])
                    } else {
                        Bytes::copy_from_slice(&(size as u32).to_le_bytes())
                    };
                    tasks.push(tokio::spawn(async move {
                        while Instant::now() < deadline {
                            conn.call(kind, req.clone(), Duration::from_secs(30))
                                .await?;
                            ops.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok::<(), cairn_msg::MsgError>(())
                    }));
                }
                for t in tasks {
                    t.await??;
                }
                let el = start.elapsed().as_secs_f64();
                let cpu = cpu_seconds() - cpu0;
                let n = ops.load(Ordering::Relaxed) as f64;
                let label = if size >= 1 << 20 {
                    format!("{}MiB", size >> 20)
                } else {
                    format!("{}KiB", size >> 10)
                };
                println!(
                    "{:<6} {:>8} {:>6} {:>10.0} {:>10.1} {:>10.3}ms {:>12.1}",
                    if kind == WRITE { "write" } else { "read" },
                    label,
                    conc,
                    n / el,
                    n * size as f64 / el / (1 << 20) as f64,
                    el * 1000.0 * conc as f64 / n.max(1.0),
                    cpu * 1e6 / n.max(1.0)
                );
            }
        }
    }
    Ok(())
}

/// User + system CPU time of this process (client and server both run
/// here), from /proc; 0 where unavailable. Load-independent cost measure.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the ")" closing the command name; utime and stime are
    // fields 14 and 15 of the whole line, in clock ticks (100 per second).
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}
