//! Integration tests: third-party clients (nbdinfo, qemu-img, qemu-io)
//! against file-backed exports, and raw-socket protocol tests for the
//! handshake, malformed input and out-of-order completion.

mod common;

use cairn_nbd::proto::*;
use cairn_nbd::ServerConfig;
use common::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MIB: u64 = 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdinfo_reports_size_flags_and_block_sizes() {
    if !have_tool("nbdinfo") {
        return;
    }
    let fx = Fixture::start(
        &[("disk1", 64 * MIB), ("disk2", 3 * MIB + 512)],
        ServerConfig::default(),
    )
    .await;
    let out = run("nbdinfo", &["--json", &fx.url("disk1")]).await;
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let e = &v["exports"][0];
    assert_eq!(e["export-size"], 64 * MIB, "{out}");
    for (k, want) in [
        ("can_flush", true),
        ("can_fua", true),
        ("can_trim", true),
        ("can_zero", true),
        ("can_multi_conn", true),
        ("is_read_only", false),
    ] {
        assert_eq!(e[k], want, "{k} in {out}");
    }
    assert_eq!(e["block_size_minimum"], 1, "{out}");
    assert_eq!(e["block_size_preferred"], 4096, "{out}");
    assert_eq!(e["block_size_maximum"], 32 * MIB, "{out}");
    assert_eq!(v["protocol"], "newstyle-fixed", "{out}");

    let out = run(
        "nbdinfo",
        &["--list", "--json", &format!("nbd://127.0.0.1:{}", fx.port)],
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = v["exports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["export-name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["disk1", "disk2"], "{out}");
    let sizes: Vec<u64> = v["exports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["export-size"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [64 * MIB, 3 * MIB + 512]);

    // Unknown export: a clear failure, not a hang.
    let out = tokio::process::Command::new("nbdinfo")
        .arg(fx.url("nope"))
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nope"),
        "{out:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_io_patterns_verify() {
    if !have_tool("qemu-io") {
        return;
    }
    // A 1 MiB request limit makes qemu split the large writes.
    let cfg = ServerConfig {
        max_request_bytes: MIB as u32,
        max_inflight_bytes: 4 * MIB as u32,
        ..ServerConfig::default()
    };
    let fx = Fixture::start(&[("vm", 64 * MIB)], cfg).await;
    let url = fx.url("vm");
    qemu_io(
        &url,
        &[
            // aligned
            "write -P 0xab 0 64k",
            "read -P 0xab 0 64k",
            // unaligned, small, with FUA
            "write -f -P 0x11 1000 3000",
            "read -P 0x11 1000 3000",
            "read -P 0xab 0 1000",
            "read -P 0xab 4000 61536",
            // large, split by the client at the advertised maximum
            "write -P 0x5a 1M 9M",
            "read -P 0x5a 1M 9M",
            "flush",
            // trim then read zeros
            "discard 2M 1M",
            "read -P 0 2M 1M",
            "read -P 0x5a 1M 1M",
            // write-zeroes, with and without permission to unmap
            "write -z 4M 64k",
            "read -P 0 4M 64k",
            "write -z -u 5M 1M",
            "read -P 0 5M 1M",
            "read -P 0x5a 6M 4M",
            // the last byte of the device
            "write -P 0x77 67108863 1",
            "read -P 0x77 67108863 1",
        ],
    )
    .await;
    // The punched range costs nothing on disk any more.
    let file = std::fs::read(&fx.files[0]).unwrap();
    assert!(file[..1000].iter().all(|b| *b == 0xab));
    assert!(file[1000..4000].iter().all(|b| *b == 0x11));
    assert!(file[4000..64 * 1024].iter().all(|b| *b == 0xab));
    assert_eq!(file[64 * MIB as usize - 1], 0x77);
    let alloc = allocated_bytes(&fx.files[0]);
    assert!(
        alloc < 9 * MIB,
        "allocated {alloc} bytes after discarding 2 MiB of 9 MiB"
    );

    // Beyond the end: refused with an error, the connection survives.
    let out = tokio::process::Command::new("qemu-io")
        .args(["-f", "raw", "-c", "read 64M 4k", &url])
        .output()
        .await
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("Input/output error")
            || text.contains("Invalid argument")
            || text.contains("out of"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_io_concurrent_aio_and_unix_socket() {
    if !have_tool("qemu-io") {
        return;
    }
    let fx = Fixture::start(&[("a", 16 * MIB), ("b", 16 * MIB)], ServerConfig::default()).await;
    let mut cmds = Vec::new();
    for i in 0..32u64 {
        cmds.push(format!("aio_write -P {} {}k 60k", i + 1, i * 64 + 3));
    }
    cmds.push("aio_flush".to_string());
    for i in 0..32u64 {
        cmds.push(format!("aio_read -P {} {}k 60k", i + 1, i * 64 + 3));
    }
    cmds.push("aio_flush".to_string());
    let refs: Vec<&str> = cmds.iter().map(|s| s.as_str()).collect();
    qemu_io(&fx.url("a"), &refs).await;
    // Same export over the unix socket sees the same data; b is untouched.
    qemu_io(&fx.unix_url("a"), &["read -P 7 387k 60k"]).await;
    qemu_io(&fx.unix_url("b"), &["read -P 0 0 16M", "write -P 9 0 4k"]).await;
    qemu_io(&fx.url("b"), &["read -P 9 0 4k"]).await;

    // Two clients on two exports at once.
    let (ua, ub) = (fx.url("a"), fx.unix_url("b"));
    let (ra, rb) = tokio::join!(
        qemu_io(&ua, &["write -P 0xa1 8M 4M", "read -P 0xa1 8M 4M"]),
        qemu_io(&ub, &["write -P 0xb1 8M 4M", "read -P 0xb1 8M 4M"]),
    );
    drop((ra, rb));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_img_convert_round_trip() {
    if !have_tool("qemu-img") {
        return;
    }
    let fx = Fixture::start(&[("img", 8 * MIB)], ServerConfig::default()).await;
    let src = fx.dir.path().join("src.raw");
    let mut data = vec![0u8; 8 * MIB as usize];
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    // random data with holes (zeros) in between
    for (i, chunk) in data.chunks_mut(256 * 1024).enumerate() {
        if i % 3 != 1 {
            rng.fill(chunk);
        }
    }
    std::fs::write(&src, &data).unwrap();
    let info = run("qemu-img", &["info", "--output=json", &fx.url("img")]).await;
    let v: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(v["virtual-size"], 8 * MIB, "{info}");

    run(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            src.to_str().unwrap(),
            &fx.url("img"),
        ],
    )
    .await;
    assert_eq!(std::fs::read(&fx.files[0]).unwrap(), data);
    let back = fx.dir.path().join("back.raw");
    run(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &fx.url("img"),
            back.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(std::fs::read(&back).unwrap(), data);
    run(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            src.to_str().unwrap(),
            &fx.unix_url("img"),
        ],
    )
    .await;
}

// ---------- raw protocol tests ----------

async fn connect(port: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).await.unwrap();
    assert_eq!(&hello[0..8], &NBDMAGIC.to_be_bytes());
    assert_eq!(&hello[8..16], &IHAVEOPT.to_be_bytes());
    assert_eq!(
        u16::from_be_bytes([hello[16], hello[17]]),
        FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES
    );
    s
}

async fn send_option(s: &mut TcpStream, opt: u32, data: &[u8]) {
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    s.write_all(&b).await.unwrap();
}

/// Reads one option reply: (option, type, data).
async fn read_option_reply(s: &mut TcpStream) -> (u32, u32, Vec<u8>) {
    assert_eq!(s.read_u64().await.unwrap(), OPT_REPLY_MAGIC);
    let opt = s.read_u32().await.unwrap();
    let kind = s.read_u32().await.unwrap();
    let len = s.read_u32().await.unwrap();
    let mut d = vec![0u8; len as usize];
    s.read_exact(&mut d).await.unwrap();
    (opt, kind, d)
}

fn go_payload(name: &str) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&1u16.to_be_bytes());
    d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    d
}

/// Handshake + NBD_OPT_GO; returns the stream in transmission.
async fn go(port: u16, name: &str) -> TcpStream {
    let mut s = connect(port).await;
    s.write_u32(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
        .await
        .unwrap();
    send_option(&mut s, OPT_GO, &go_payload(name)).await;
    loop {
        let (opt, kind, _) = read_option_reply(&mut s).await;
        assert_eq!(opt, OPT_GO);
        if kind == REP_ACK {
            return s;
        }
        assert_eq!(kind, REP_INFO);
    }
}

async fn expect_closed(s: &mut TcpStream) {
    let mut buf = [0u8; 64];
    let r = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert!(r.is_ok(), "server did not close the connection");
}

async fn request(s: &mut TcpStream, kind: u16, flags: u16, cookie: u64, offset: u64, length: u32) {
    let h = RequestHeader {
        flags,
        kind,
        cookie,
        offset,
        length,
    };
    s.write_all(&h.encode()).await.unwrap();
}

async fn read_simple_reply(s: &mut TcpStream) -> (u32, u64) {
    assert_eq!(s.read_u32().await.unwrap(), SIMPLE_REPLY_MAGIC);
    let err = s.read_u32().await.unwrap();
    let cookie = s.read_u64().await.unwrap();
    (err, cookie)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_options_and_refusals() {
    let fx = Fixture::start(&[("d", MIB)], ServerConfig::default()).await;

    // Unknown client flags: closed.
    let mut s = connect(fx.port).await;
    s.write_u32(0x80).await.unwrap();
    expect_closed(&mut s).await;

    // Non-fixed newstyle: closed.
    let mut s = connect(fx.port).await;
    s.write_u32(0).await.unwrap();
    expect_closed(&mut s).await;

    let mut s = connect(fx.port).await;
    s.write_u32(FLAG_C_FIXED_NEWSTYLE).await.unwrap();
    // structured replies, TLS and unknown options are refused, connection stays.
    send_option(&mut s, OPT_STRUCTURED_REPLY, &[]).await;
    let (o, k, _) = read_option_reply(&mut s).await;
    assert_eq!((o, k), (OPT_STRUCTURED_REPLY, REP_ERR_UNSUP));
    send_option(&mut s, OPT_STARTTLS, &[]).await;
    assert_eq!(read_option_reply(&mut s).await.1, REP_ERR_POLICY);
    send_option(&mut s, 4242, b"xyz").await;
    assert_eq!(read_option_reply(&mut s).await.1, REP_ERR_UNSUP);
    // LIST with data is invalid; LIST without lists.
    send_option(&mut s, OPT_LIST, b"x").await;
    assert_eq!(read_option_reply(&mut s).await.1, REP_ERR_INVALID);
    send_option(&mut s, OPT_LIST, &[]).await;
    let (_, k, d) = read_option_reply(&mut s).await;
    assert_eq!(k, REP_SERVER);
    assert_eq!(&d[..5], &[0, 0, 0, 1, b'd']);
    assert_eq!(read_option_reply(&mut s).await.1, REP_ACK);
    // INFO on an unknown name / malformed payload.
    send_option(&mut s, OPT_INFO, &go_payload("zz")).await;
    assert_eq!(read_option_reply(&mut s).await.1, REP_ERR_UNKNOWN);
    send_option(&mut s, OPT_INFO, &[0, 0, 0, 9, b'd']).await;
    assert_eq!(read_option_reply(&mut s).await.1, REP_ERR_INVALID);
    // INFO that works: export info (size, flags) then block size, then ACK.
    send_option(&mut s, OPT_INFO, &go_payload("d")).await;
    let (_, k, d) = read_option_reply(&mut s).await;
    assert_eq!(k, REP_INFO);
    assert_eq!(u16::from_be_bytes([d[0], d[1]]), INFO_EXPORT);
    assert_eq!(u64::from_be_bytes(d[2..10].try_into().unwrap()), MIB);
    let (_, k, d) = read_option_reply(&mut s).await;
    assert_eq!(
        (k, u16::from_be_bytes([d[0], d[1]])),
        (REP_INFO, INFO_BLOCK_SIZE)
    );
    assert_eq!(read_option_reply(&mut s).await.1, REP_ACK);
    // Oversized option data is drained and refused.
    send_option(&mut s, OPT_INFO, &vec![0u8; MAX_OPTION_BYTES_T + 1]).await;
    assert_eq!(read_option_reply(&mut s).await.1, REP_ERR_TOO_BIG);
    // ABORT is acknowledged and the connection closes.
    send_option(&mut s, OPT_ABORT, &[]).await;
    assert_eq!(read_option_reply(&mut s).await.1, REP_ACK);
    expect_closed(&mut s).await;

    // Bad option magic: closed.
    let mut s = connect(fx.port).await;
    s.write_u32(FLAG_C_FIXED_NEWSTYLE).await.unwrap();
    s.write_all(&[0u8; 16]).await.unwrap();
    expect_closed(&mut s).await;

    // EXPORT_NAME with an unknown name: closed; with a known one: size + flags, 124 zeros.
    let mut s = connect(fx.port).await;
    s.write_u32(FLAG_C_FIXED_NEWSTYLE).await.unwrap();
    send_option(&mut s, OPT_EXPORT_NAME, b"nope").await;
    expect_closed(&mut s).await;
    let mut s = connect(fx.port).await;
    s.write_u32(FLAG_C_FIXED_NEWSTYLE).await.unwrap();
    send_option(&mut s, OPT_EXPORT_NAME, b"d").await;
    let mut b = [0u8; 8 + 2 + 124];
    s.read_exact(&mut b).await.unwrap();
    assert_eq!(u64::from_be_bytes(b[0..8].try_into().unwrap()), MIB);
    let flags = u16::from_be_bytes([b[8], b[9]]);
    assert_eq!(flags & TFLAG_HAS_FLAGS, TFLAG_HAS_FLAGS);
    assert!(b[10..].iter().all(|x| *x == 0));
    request(&mut s, CMD_DISC, 0, 1, 0, 0).await;
    expect_closed(&mut s).await;
}

const MAX_OPTION_BYTES_T: usize = cairn_nbd::server::MAX_OPTION_BYTES as usize;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_errors_and_out_of_order_completion() {
    let fx = Fixture::start_with(&[("d", MIB)], ServerConfig::default(), |b| {
        b.slow_first_read = Some(Duration::from_millis(300));
    })
    .await;
    let mut s = go(fx.port, "d").await;
    // write 4 KiB at 4096 with FUA
    request(&mut s, CMD_WRITE, CMD_FLAG_FUA, 10, 4096, 4096).await;
    s.write_all(&[0x42u8; 4096]).await.unwrap();
    assert_eq!(read_simple_reply(&mut s).await, (0, 10));
    // slow read at 0, then a fast read at 4096: the fast one answers first.
    request(&mut s, CMD_READ, 0, 20, 0, 512).await;
    request(&mut s, CMD_READ, 0, 21, 4096, 512).await;
    assert_eq!(read_simple_reply(&mut s).await, (0, 21));
    let mut d = [0u8; 512];
    s.read_exact(&mut d).await.unwrap();
    assert!(d.iter().all(|x| *x == 0x42));
    assert_eq!(read_simple_reply(&mut s).await, (0, 20));
    s.read_exact(&mut d).await.unwrap();
    assert!(d.iter().all(|x| *x == 0));
    // errors: read past the end, write past the end, unknown command, unknown flag
    request(&mut s, CMD_READ, 0, 30, MIB - 100, 200).await;
    assert_eq!(read_simple_reply(&mut s).await, (EINVAL, 30));
    request(&mut s, CMD_WRITE, 0, 31, MIB, 16).await;
    s.write_all(&[1u8; 16]).await.unwrap();
    assert_eq!(read_simple_reply(&mut s).await, (ENOSPC, 31));
    request(&mut s, 77, 0, 32, 0, 0).await;
    assert_eq!(read_simple_reply(&mut s).await, (EINVAL, 32));
    request(&mut s, CMD_READ, 0x4000, 33, 0, 1).await;
    assert_eq!(read_simple_reply(&mut s).await, (EINVAL, 33));
    request(&mut s, CMD_READ, 0, 34, u64::MAX - 1, 16).await;
    assert_eq!(read_simple_reply(&mut s).await, (EINVAL, 34));
    // flush, trim, write-zeroes (NO_HOLE) succeed
    request(&mut s, CMD_FLUSH, 0, 40, 0, 0).await;
    assert_eq!(read_simple_reply(&mut s).await, (0, 40));
    request(&mut s, CMD_TRIM, 0, 41, 0, 65536).await;
    assert_eq!(read_simple_reply(&mut s).await, (0, 41));
    request(
        &mut s,
        CMD_WRITE_ZEROES,
        CMD_FLAG_NO_HOLE | CMD_FLAG_FUA,
        42,
        65536,
        8192,
    )
    .await;
    assert_eq!(read_simple_reply(&mut s).await, (0, 42));
    // still alive after errors
    request(&mut s, CMD_READ, 0, 43, 4096, 4096).await;
    assert_eq!(read_simple_reply(&mut s).await, (0, 43));
    let mut d = vec![0u8; 4096];
    s.read_exact(&mut d).await.unwrap();
    assert!(d.iter().all(|x| *x == 0), "trimmed range reads zeros");

    // A write larger than the advertised maximum: connection closed.
    request(&mut s, CMD_WRITE, 0, 50, 0, 64 * 1024 * 1024).await;
    expect_closed(&mut s).await;

    // Bad request magic: connection closed, after in-flight requests are answered.
    let mut s = go(fx.port, "d").await;
    request(&mut s, CMD_READ, 0, 60, 0, 512).await; // slow
    s.write_all(&[0xffu8; REQUEST_HEADER_BYTES]).await.unwrap();
    assert_eq!(read_simple_reply(&mut s).await, (0, 60));
    let mut d = [0u8; 512];
    s.read_exact(&mut d).await.unwrap();
    expect_closed(&mut s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inflight_budget_bounds_requests_without_deadlock() {
    // Budget for ~2 max-size requests: 64 pipelined 256 KiB writes must all
    // complete (the reader waits for budget instead of buffering them all).
    let cfg = ServerConfig {
        max_request_bytes: 256 * 1024,
        max_inflight_bytes: 2 * (256 * 1024 + cairn_nbd::server::REQUEST_OVERHEAD_BYTES),
        ..ServerConfig::default()
    };
    let fx = Fixture::start(&[("d", 32 * MIB)], cfg).await;
    let s = go(fx.port, "d").await;
    let (mut rd, mut wr) = s.into_split();
    let writer = tokio::spawn(async move {
        for i in 0..64u64 {
            let h = RequestHeader {
                flags: 0,
                kind: CMD_WRITE,
                cookie: i,
                offset: i * 256 * 1024,
                length: 256 * 1024,
            };
            wr.write_all(&h.encode()).await.unwrap();
            wr.write_all(&vec![i as u8; 256 * 1024]).await.unwrap();
        }
        wr
    });
    let mut seen = std::collections::HashSet::new();
    for _ in 0..64 {
        assert_eq!(rd.read_u32().await.unwrap(), SIMPLE_REPLY_MAGIC);
        assert_eq!(rd.read_u32().await.unwrap(), 0);
        seen.insert(rd.read_u64().await.unwrap());
    }
    assert_eq!(seen.len(), 64);
    let _wr = writer.await.unwrap();
    let file = std::fs::read(&fx.files[0]).unwrap();
    for i in 0..64usize {
        assert!(file[i * 256 * 1024..(i + 1) * 256 * 1024]
            .iter()
            .all(|b| *b == i as u8));
    }
}

/// `qemu-img bench` through NBD on a file export (CAIRN_BENCH=1; prints figures).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_qemu_img_file_export() {
    if std::env::var("CAIRN_BENCH").as_deref() != Ok("1") || !have_tool("qemu-img") {
        return;
    }
    let fx = Fixture::start(&[("bench", 1024 * MIB)], ServerConfig::default()).await;
    let url = fx.url("bench");
    for (label, args, bytes) in [
        (
            "4k write qd32",
            vec!["-w", "-c", "50000", "-d", "32", "-s", "4k", "-S", "64k"],
            50000 * 4096u64,
        ),
        (
            "4k read qd32",
            vec!["-c", "50000", "-d", "32", "-s", "4k", "-S", "64k"],
            50000 * 4096,
        ),
        (
            "1M write qd8",
            vec!["-w", "-c", "1000", "-d", "8", "-s", "1M"],
            1000 * MIB,
        ),
        (
            "1M read qd8",
            vec!["-c", "1000", "-d", "8", "-s", "1M"],
            1000 * MIB,
        ),
    ] {
        let mut a = vec!["bench", "-f", "raw", "-t", "none"];
        a.extend(args.iter());
        a.push(&url);
        let t0 = std::time::Instant::now();
        run("qemu-img", &a).await;
        let secs = t0.elapsed().as_secs_f64();
        let ops: f64 = a[a.iter().position(|x| *x == "-c").unwrap() + 1]
            .parse()
            .unwrap();
        eprintln!(
            "BENCH file-over-nbd {label}: {:.0} IOPS, {:.1} MiB/s ({secs:.2} s)",
            ops / secs,
            bytes as f64 / MIB as f64 / secs
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_export_refuses_writes() {
    let fx = Fixture::start_with(&[("ro", MIB)], ServerConfig::default(), |b| {
        b.read_only = true
    })
    .await;
    let mut s = connect(fx.port).await;
    s.write_u32(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
        .await
        .unwrap();
    send_option(&mut s, OPT_GO, &go_payload("ro")).await;
    let (_, k, d) = read_option_reply(&mut s).await;
    assert_eq!(k, REP_INFO);
    let flags = u16::from_be_bytes([d[10], d[11]]);
    assert_eq!(flags & TFLAG_READ_ONLY, TFLAG_READ_ONLY);
    assert_eq!(flags & (TFLAG_SEND_TRIM | TFLAG_SEND_WRITE_ZEROES), 0);
    loop {
        if read_option_reply(&mut s).await.1 == REP_ACK {
            break;
        }
    }
    request(&mut s, CMD_WRITE, 0, 1, 0, 4).await;
    s.write_all(&[1, 2, 3, 4]).await.unwrap();
    assert_eq!(read_simple_reply(&mut s).await, (EPERM, 1));
    request(&mut s, CMD_TRIM, 0, 2, 0, 4096).await;
    assert_eq!(read_simple_reply(&mut s).await, (EPERM, 2));
    request(&mut s, CMD_READ, 0, 3, 0, 4).await;
    assert_eq!(read_simple_reply(&mut s).await, (0, 3));
    let mut d = [9u8; 4];
    s.read_exact(&mut d).await.unwrap();
    assert_eq!(d, [0; 4]);
    request(&mut s, CMD_DISC, 0, 4, 0, 0).await;
    expect_closed(&mut s).await;
}

/// fio's NBD engine (libnbd): random 4 KiB writes at queue depth 32 and
/// mixed-size sequential writes, each verified by reading back (crc32c).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fio_nbd_engine_verified_writes() {
    if !have_tool("fio") {
        return;
    }
    let fx = Fixture::start(&[("f", 64 * MIB)], ServerConfig::default()).await;
    let uri = format!("--uri={}", fx.url("f"));
    for job in [
        vec!["--rw=randwrite", "--bs=4k", "--iodepth=32", "--size=16M"],
        vec![
            "--rw=write",
            "--bsrange=512-256k",
            "--iodepth=8",
            "--size=32M",
            "--offset=16M",
        ],
    ] {
        let mut args = vec![
            "--name=cairn",
            "--ioengine=nbd",
            &uri,
            "--verify=crc32c",
            "--verify_state_save=0",
            "--do_verify=1",
            "--verify_fatal=1",
            "--output-format=terse",
        ];
        args.extend(job);
        let out = run("fio", &args).await;
        // terse v3: field 5 is the KiB read; verification reads everything back.
        let line = out
            .lines()
            .find(|l| l.starts_with("3;"))
            .expect("terse line");
        let read_kib: u64 = line.split(';').nth(5).unwrap().parse().unwrap();
        assert!(
            read_kib >= 16 * 1024,
            "fio verified only {read_kib} KiB: {line}"
        );
    }
}
