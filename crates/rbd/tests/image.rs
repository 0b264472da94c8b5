//! Image layer on a real in-process cluster (3 OSDs on loopback): lifecycle,
//! exclusive lock, thin provisioning, I/O across objects, discard freeing
//! space, resize; then qemu-io through cairn-nbd on top of an image.

// The OSD tests' in-process cluster harness, shared rather than copied.
#[path = "../../osd/tests/common/mod.rs"]
mod common;

use cairn_nbd::{Export, NbdServer, ServerConfig};
use cairn_rbd::{serve_images, CreateOptions, Listener, Rbd, RbdError, ServeOptions};
use common::*;
use std::sync::Arc;
use std::time::Duration;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

fn opts(size: u64, object: u64) -> CreateOptions {
    CreateOptions {
        size_bytes: size,
        object_size_bytes: Some(object),
        data_pool: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_lifecycle_lock_thin_discard_resize() {
    let cluster = Cluster::start(3, 1, 8, 256 * MIB).await;
    let rados = cluster.client();
    let rbd = Rbd::new(&rados, "rbd").unwrap();

    assert!(rbd.list().await.unwrap().is_empty());
    let h = rbd.create("vm1", &opts(4 * MIB, 64 * KIB)).await.unwrap();
    assert_eq!(h.object_count(), 64);
    assert!(matches!(
        rbd.create("vm1", &opts(MIB, 64 * KIB)).await,
        Err(RbdError::Exists(_))
    ));
    assert!(matches!(
        rbd.create("bad/name", &opts(MIB, 64 * KIB)).await,
        Err(RbdError::Invalid(_))
    ));
    assert!(matches!(
        rbd.create("x", &opts(MIB, 3000)).await,
        Err(RbdError::Invalid(_))
    ));
    rbd.create("vm2", &opts(MIB, 64 * KIB)).await.unwrap();
    assert_eq!(rbd.list().await.unwrap(), ["vm1", "vm2"]);
    assert_eq!(rbd.info("vm1").await.unwrap(), h);
    assert!(matches!(rbd.info("nope").await, Err(RbdError::NotFound(_))));

    // Thin: nothing written, nothing used, reads zeros.
    assert_eq!(rbd.du("vm1").await.unwrap().used_bytes, 0);
    let img = rbd.open("vm1", "client.test1", false).await.unwrap();
    assert!(img.read(0, 4 * MIB).await.unwrap().iter().all(|b| *b == 0));

    // Exclusive lock: a second opener gets a clear error.
    match rbd.open("vm1", "client.test2", false).await {
        Err(RbdError::Locked { owner, .. }) => assert_eq!(owner, "client.test1"),
        other => panic!("expected Locked, got {:?}", other.map(|_| ())),
    }
    assert_eq!(
        rbd.lock_status("vm1").await.unwrap().unwrap().owner,
        "client.test1"
    );
    assert!(matches!(
        rbd.remove("vm1").await,
        Err(RbdError::Locked { .. })
    ));

    // I/O across object boundaries, unaligned.
    let data = pattern(1, 200 * KIB as usize + 123);
    img.write(60 * KIB + 7, data.clone().into()).await.unwrap();
    let back = img.read(60 * KIB + 7, data.len() as u64).await.unwrap();
    assert_eq!(&back[..], &data[..]);
    let around = img.read(0, 512 * KIB).await.unwrap();
    assert!(around[..60 * KIB as usize + 7].iter().all(|b| *b == 0));
    assert!(around[60 * KIB as usize + 7 + data.len()..]
        .iter()
        .all(|b| *b == 0));
    let du = rbd.du("vm1").await.unwrap();
    assert_eq!(du.objects, 5, "{du:?}");
    // Beyond the end is refused.
    assert!(matches!(
        img.read(4 * MIB - 1, 2).await,
        Err(RbdError::Invalid(_))
    ));

    // Discard: whole objects removed, partial ones zeroed/truncated.
    img.discard(64 * KIB, 128 * KIB).await.unwrap();
    let du2 = rbd.du("vm1").await.unwrap();
    assert_eq!(du2.objects, 3, "{du2:?}");
    assert!(du2.used_bytes < du.used_bytes);
    let r = img.read(60 * KIB, 256 * KIB).await.unwrap();
    assert_eq!(&r[7..4 * KIB as usize], &data[..4 * KIB as usize - 7]);
    assert!(r[4 * KIB as usize..132 * KIB as usize]
        .iter()
        .all(|b| *b == 0));
    img.discard(200 * KIB, 10 * KIB).await.unwrap(); // partial, middle of an object
    assert!(img
        .read(200 * KIB, 10 * KIB)
        .await
        .unwrap()
        .iter()
        .all(|b| *b == 0));
    img.write_zeroes_allocated(0, 8 * KIB).await.unwrap();
    assert!(img.read(0, 8 * KIB).await.unwrap().iter().all(|b| *b == 0));

    // Resize: shrink frees objects past the end, grow reads zeros.
    img.write(3 * MIB, pattern(2, 64 * KIB as usize).into())
        .await
        .unwrap();
    img.resize(MIB + 100).await.unwrap();
    assert_eq!(rbd.info("vm1").await.unwrap().size_bytes, MIB + 100);
    img.resize(4 * MIB).await.unwrap();
    assert!(img
        .read(3 * MIB, 64 * KIB)
        .await
        .unwrap()
        .iter()
        .all(|b| *b == 0));

    // Close releases the lock; break_lock takes a dead holder's lock.
    img.close().await.unwrap();
    assert!(rbd.lock_status("vm1").await.unwrap().is_none());
    let dead = rbd.open("vm1", "client.dead", false).await.unwrap();
    drop(dead); // "crashes" holding the lock
    let img = rbd.open("vm1", "client.new", true).await.unwrap();
    assert_eq!(img.lock_record().unwrap().owner, "client.new");
    img.close().await.unwrap();

    // Read-only handles read without the lock and refuse writes.
    let ro = rbd.open_read_only("vm1").await.unwrap();
    assert!(matches!(
        ro.write(0, vec![1u8].into()).await,
        Err(RbdError::ReadOnly(_))
    ));
    assert_eq!(&ro.read(60 * KIB + 7, 100).await.unwrap()[..], &data[..100]);
    ro.close().await.unwrap();

    // export -> import -> copy round trip, thin on the way.
    let mut exported = Vec::new();
    let mut steps = 0;
    let n = rbd
        .export("vm1", &mut exported, &mut |_, _| steps += 1)
        .await
        .unwrap();
    assert_eq!(n, 4 * MIB);
    assert_eq!(exported.len() as u64, 4 * MIB);
    assert_eq!(steps, 64);
    let mut input = &exported[..];
    rbd.import("vm3", &opts(4 * MIB, 64 * KIB), &mut input, &mut |_, _| {})
        .await
        .unwrap();
    rbd.copy("vm3", "vm4", None, &mut |_, _| {}).await.unwrap();
    let mut again = Vec::new();
    rbd.export("vm4", &mut again, &mut |_, _| {}).await.unwrap();
    assert!(again == exported, "copy of import differs from export");
    let (du1, du4) = (rbd.du("vm1").await.unwrap(), rbd.du("vm4").await.unwrap());
    assert!(du4.objects <= du1.objects, "{du1:?} {du4:?}");
    let mut too_long = &vec![1u8; 2 * MIB as usize][..];
    assert!(matches!(
        rbd.import("vm5", &opts(MIB, 64 * KIB), &mut too_long, &mut |_, _| {})
            .await,
        Err(RbdError::Invalid(_))
    ));
    for n in ["vm3", "vm4", "vm5"] {
        rbd.remove(n).await.unwrap();
    }

    rbd.remove("vm1").await.unwrap();
    assert_eq!(rbd.list().await.unwrap(), ["vm2"]);
    assert!(matches!(rbd.info("vm1").await, Err(RbdError::NotFound(_))));
}

fn have_qemu_io() -> bool {
    let found = std::process::Command::new("qemu-io")
        .arg("--version")
        .output()
        .is_ok();
    if !found {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("qemu-io is required in CI (install qemu-utils)");
        }
        eprintln!("SKIPPING: qemu-io not installed");
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_io_through_nbd_on_an_image() {
    if !have_qemu_io() {
        return;
    }
    let cluster = Cluster::start(3, 1, 8, 256 * MIB).await;
    let rados = cluster.client();
    let rbd = Rbd::new(&rados, "rbd").unwrap();
    rbd.create("disk", &opts(16 * MIB, 256 * KIB))
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serve_opts = ServeOptions {
        owner: "client.nbd".into(),
        break_lock: false,
        server: ServerConfig::default(),
    };
    let rbd2 = rbd.clone();
    let srv = tokio::spawn(async move {
        serve_images(
            &rbd2,
            &["disk".to_string()],
            Listener::Tcp(listener),
            &serve_opts,
            async {
                let _ = stopped.await;
            },
        )
        .await
    });
    // Serving holds the lock.
    let t0 = std::time::Instant::now();
    while rbd.lock_status("disk").await.unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let url = format!("nbd://127.0.0.1:{port}/disk");
    let cmds = [
        "write -P 0xab 0 64k",
        "read -P 0xab 0 64k",
        "write -P 0x11 250k 20000", // across an object boundary, unaligned
        "read -P 0x11 250k 20000",
        "write -P 0x5a 1M 4M",
        "read -P 0x5a 1M 4M",
        "aio_write -P 0x21 8M 64k",
        "aio_write -P 0x22 9M 64k",
        "aio_flush",
        "read -P 0x21 8M 64k",
        "read -P 0x22 9M 64k",
        "flush",
        "discard 1M 2M",
        "read -P 0 1M 2M",
        "read -P 0x5a 3M 2M",
        "write -z 4M 256k",
        "read -P 0 4M 256k",
        "read -P 0 12M 4M",
    ];
    let mut args = vec!["-f", "raw"];
    for c in &cmds {
        args.push("-c");
        args.push(c);
    }
    args.push(&url);
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("qemu-io").args(&args).output(),
    )
    .await
    .unwrap()
    .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let lower = text.to_lowercase();
    assert!(
        !lower.contains("fail") && !lower.contains("error"),
        "{text}"
    );
    let du = rbd.du("disk").await.unwrap();
    // 0..64k, 250k..270k, 3M..5M minus the zeroed 4M..4.25M, 8M, 9M
    assert!(du.used_bytes <= 3 * MIB, "{du:?}");
    // fio's NBD engine: random 4 KiB writes at queue depth 32, verified.
    if std::process::Command::new("fio")
        .arg("--version")
        .output()
        .is_ok()
    {
        let uri = format!("--uri={url}");
        let out = tokio::process::Command::new("fio")
            .args([
                "--name=cairn",
                "--ioengine=nbd",
                &uri,
                "--rw=randwrite",
                "--bs=4k",
                "--iodepth=32",
                "--size=2M",
                "--offset=10M",
                "--verify=crc32c",
                "--verify_state_save=0",
                "--do_verify=1",
                "--verify_fatal=1",
            ])
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    } else if std::env::var("CI").as_deref() == Ok("true") {
        panic!("fio is required in CI");
    }
    // Shutdown closes the image and gives the lock back.
    let _ = stop.send(());
    srv.await.unwrap().unwrap();
    assert!(rbd.lock_status("disk").await.unwrap().is_none());
    // A holder that goes away without closing (a crash) leaves the lock:
    // a new opener must break it, and everything acknowledged is there.
    drop(rbd.open("disk", "client.crashed", false).await.unwrap());
    assert!(matches!(
        rbd.open("disk", "client.nbd2", false).await,
        Err(RbdError::Locked { .. })
    ));
    let img = rbd.open("disk", "client.nbd2", true).await.unwrap();
    assert!(img
        .read(0, 64 * KIB)
        .await
        .unwrap()
        .iter()
        .all(|b| *b == 0xab));
    assert!(img
        .read(250 * KIB, 20000)
        .await
        .unwrap()
        .iter()
        .all(|b| *b == 0x11));
    assert!(img
        .read(8 * MIB, 64 * KIB)
        .await
        .unwrap()
        .iter()
        .all(|b| *b == 0x21));
    assert!(img
        .read(3 * MIB, MIB)
        .await
        .unwrap()
        .iter()
        .all(|b| *b == 0x5a));
    img.close().await.unwrap();
}

/// `qemu-img bench` through NBD on an image (CAIRN_BENCH=1; prints figures).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_qemu_img_through_nbd() {
    if std::env::var("CAIRN_BENCH").as_deref() != Ok("1") || !have_qemu_io() {
        return;
    }
    let cluster = Cluster::start(3, 1, 32, 1024 * MIB).await;
    let rados = cluster.client();
    let rbd = Rbd::new(&rados, "rbd").unwrap();
    rbd.create("bench", &opts(512 * MIB, 4 * MIB))
        .await
        .unwrap();
    let img = Arc::new(rbd.open("bench", "client.bench", false).await.unwrap());
    let server = NbdServer::new(
        ServerConfig::default(),
        vec![Export {
            name: "bench".into(),
            description: String::new(),
            backend: img.clone(),
        }],
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { server.serve_tcp(listener, std::future::pending()).await });
    let url = format!("nbd://127.0.0.1:{port}/bench");
    for (label, args, bytes) in [
        (
            "4k write qd32",
            vec!["-w", "-c", "20000", "-d", "32", "-s", "4k", "-S", "1M"],
            20000 * 4 * KIB,
        ),
        (
            "4k read qd32",
            vec!["-c", "20000", "-d", "32", "-s", "4k", "-S", "1M"],
            20000 * 4 * KIB,
        ),
        (
            "1M write qd8",
            vec!["-w", "-c", "400", "-d", "8", "-s", "1M"],
            400 * MIB,
        ),
        (
            "1M read qd8",
            vec!["-c", "400", "-d", "8", "-s", "1M"],
            400 * MIB,
        ),
    ] {
        let mut a = vec!["bench", "-f", "raw", "-t", "none"];
        a.extend(args.iter());
        a.push(&url);
        let t0 = std::time::Instant::now();
        let out = tokio::process::Command::new("qemu-img")
            .args(&a)
            .output()
            .await
            .unwrap();
        let secs = t0.elapsed().as_secs_f64();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ops: f64 = a[a.iter().position(|x| *x == "-c").unwrap() + 1]
            .parse()
            .unwrap();
        eprintln!(
            "BENCH rbd-over-nbd {label}: {:.0} IOPS, {:.1} MiB/s ({secs:.2} s)",
            ops / secs,
            bytes as f64 / MIB as f64 / secs
        );
    }
    let uri = format!("--uri={url}");
    for (label, job) in [
        (
            "fio 4k randwrite qd32",
            ["--rw=randwrite", "--bs=4k", "--iodepth=32", "--size=64M"],
        ),
        (
            "fio 1M write qd8",
            ["--rw=write", "--bs=1M", "--iodepth=8", "--size=256M"],
        ),
        (
            "fio 1M read qd8",
            ["--rw=read", "--bs=1M", "--iodepth=8", "--size=256M"],
        ),
    ] {
        let mut args = vec![
            "--name=b",
            "--ioengine=nbd",
            &uri,
            "--runtime=20",
            "--time_based=0",
            "--output-format=terse",
        ];
        args.extend(job);
        let out = tokio::process::Command::new("fio")
            .args(&args)
            .output()
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let f: Vec<&str> = text
            .lines()
            .find(|l| l.starts_with("3;"))
            .unwrap_or("")
            .split(';')
            .collect();
        // terse v3: read bw KiB/s = 6, read iops = 7, write bw = 47, write iops = 48
        let (bw, iops) = if job[0].contains("read") {
            (f.get(6), f.get(7))
        } else {
            (f.get(47), f.get(48))
        };
        eprintln!(
            "BENCH rbd-over-nbd {label}: {} IOPS, {} KiB/s",
            iops.unwrap_or(&"?"),
            bw.unwrap_or(&"?")
        );
    }
}

/// Random writes, discards, write-zeroes and reads (seeded) against an
/// in-memory model of the image: every read and the final image match.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_ops_match_a_model() {
    random_ops(false).await;
}

/// The same with the write cache taking writes back (Image::flush now and
/// then; after each flush a second, read-only handle — which sees only
/// what reached the OSDs — must read the model too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_ops_match_a_model_through_the_write_cache() {
    random_ops(true).await;
}

async fn random_ops(write_back: bool) {
    use rand::{Rng, SeedableRng};
    let cluster = Cluster::start(3, 1, 8, 256 * MIB).await;
    let rados = cluster.client();
    let rbd = Rbd::new(&rados, "rbd").unwrap();
    let size = MIB + 3 * KIB; // last object partial
    rbd.create("m", &opts(size, 16 * KIB)).await.unwrap();
    let img = rbd.open("m", "client.model", false).await.unwrap();
    if write_back {
        img.assume_flushing_user();
    }
    let mut model = vec![0u8; size as usize];
    let seed: u64 = std::env::var("CAIRN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let steps = if soak() { 2000 } else { 150 };
    for step in 0..steps {
        let off = rng.gen_range(0..size);
        let len = rng.gen_range(1..=(size - off).min(80 * KIB));
        let (o, l) = (off as usize, len as usize);
        match rng.gen_range(0..10) {
            0..=3 => {
                let d = pattern(step, l);
                img.write(off, d.clone().into()).await.unwrap();
                model[o..o + l].copy_from_slice(&d);
            }
            4 | 5 => {
                img.discard(off, len).await.unwrap();
                model[o..o + l].fill(0);
            }
            6 => {
                img.write_zeroes_allocated(off, len).await.unwrap();
                model[o..o + l].fill(0);
            }
            7 if write_back => {
                img.flush().await.unwrap();
                let ro = rbd.open_read_only("m").await.unwrap();
                let on_osds = ro.read(0, size).await.unwrap();
                assert!(
                    on_osds[..] == model[..],
                    "seed {seed} step {step}: after a flush the OSDs' data differs from the model"
                );
            }
            _ => {
                let got = img.read(off, len).await.unwrap();
                assert!(
                    got[..] == model[o..o + l],
                    "seed {seed} step {step}: read {off}+{len} differs"
                );
            }
        }
    }
    let all = img.read(0, size).await.unwrap();
    assert!(
        all[..] == model[..],
        "seed {seed}: final image differs from the model"
    );
    img.close().await.unwrap();
    // Closing flushed: the OSDs hold the model.
    let ro = rbd.open_read_only("m").await.unwrap();
    assert!(ro.read(0, size).await.unwrap()[..] == model[..]);
}

/// With the write cache on, a write of `WRITE_AROUND_MIN_BYTES` or more
/// goes around it: the cached writes of its object land first, it is on
/// the OSDs when it returns (a read-only handle sees only the OSDs), and a
/// cached write after it wins over it in reads and on the OSDs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_writes_go_around_the_write_cache_in_order() {
    use cairn_rbd::image::WRITE_AROUND_MIN_BYTES;
    let cluster = Cluster::start(3, 1, 8, 256 * MIB).await;
    let rados = cluster.client();
    let rbd = Rbd::new(&rados, "rbd").unwrap();
    let size = 4 * MIB;
    rbd.create("w", &opts(size, 4 * MIB)).await.unwrap();
    let img = rbd.open("w", "client.around", false).await.unwrap();
    img.assume_flushing_user();
    assert!(img.cache_config().writeback);
    let on_osds = |off: u64, len: u64| {
        let rbd = &rbd;
        async move {
            let ro = rbd.open_read_only("w").await.unwrap();
            ro.read(off, len).await.unwrap()
        }
    };
    let mut model = vec![0u8; size as usize];
    // Cached small writes inside, beside and far from the big write.
    for (off, b) in [
        (0, 1u8),
        (MIB - 4 * KIB, 2),
        (MIB + 8 * KIB, 3),
        (3 * MIB, 4),
    ] {
        img.write(off, vec![b; 8 * KIB as usize].into())
            .await
            .unwrap();
        model[off as usize..(off + 8 * KIB) as usize].fill(b);
    }
    assert!(
        on_osds(3 * MIB, 8 * KIB).await.iter().all(|b| *b == 0),
        "small writes stay cached"
    );
    let big = WRITE_AROUND_MIN_BYTES as usize;
    img.write(MIB, vec![9u8; big].into()).await.unwrap();
    model[MIB as usize..MIB as usize + big].fill(9);
    assert!(
        on_osds(0, size).await[..] == model[..],
        "the big write and the cached writes of its object before it are on the OSDs"
    );
    // A cached write over it wins.
    img.write(MIB + 64 * KIB, vec![5u8; 4 * KIB as usize].into())
        .await
        .unwrap();
    model[(MIB + 64 * KIB) as usize..(MIB + 68 * KIB) as usize].fill(5);
    assert!(img.read(0, size).await.unwrap()[..] == model[..]);
    img.flush().await.unwrap();
    assert!(on_osds(0, size).await[..] == model[..]);
    img.close().await.unwrap();
}

/// `rbd bench`'s load generator: counts, invalid options refused before
/// any I/O, sequential writes land where they should, reads see them, and
/// a read-only handle refuses a write bench.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbd_bench_moves_what_it_reports() {
    use cairn_rbd::bench::{run_bench, BenchOptions, IoPattern, IoType};
    let cluster = Cluster::start(3, 1, 8, 256 * MIB).await;
    let rados = cluster.client();
    let rbd = Rbd::new(&rados, "rbd").unwrap();
    rbd.create("b", &opts(2 * MIB, 256 * KIB)).await.unwrap();
    let img = Arc::new(rbd.open("b", "client.bench", false).await.unwrap());
    let write = BenchOptions {
        io_type: IoType::Write,
        io_size: 64 * KIB,
        io_threads: 8,
        io_total: 3 * MIB,
        pattern: IoPattern::Seq,
    };
    for bad in [
        BenchOptions {
            io_size: 0,
            ..write.clone()
        },
        BenchOptions {
            io_size: 4 * MIB,
            ..write.clone()
        },
        BenchOptions {
            io_threads: 0,
            ..write.clone()
        },
        BenchOptions {
            io_total: KIB,
            ..write.clone()
        },
    ] {
        assert!(matches!(
            run_bench(img.clone(), &bad, |_| {}).await,
            Err(RbdError::Invalid(_))
        ));
    }
    assert_eq!(
        rbd.du("b").await.unwrap().used_bytes,
        0,
        "refused options wrote nothing"
    );
    let r = run_bench(img.clone(), &write, |_| {}).await.unwrap();
    assert_eq!((r.ops, r.bytes), (48, 3 * MIB));
    // 48 sequential 64 KiB writes wrapped around a 2 MiB image: all of it.
    assert_eq!(rbd.du("b").await.unwrap().used_bytes, 2 * MIB);
    let all = img.read(0, 2 * MIB).await.unwrap();
    assert!(all
        .chunks(64 * KIB as usize)
        .all(|c| c == &all[..64 * KIB as usize]));
    assert!(
        all.iter().any(|b| *b != 0),
        "the bench payload is not zeros"
    );
    let read = BenchOptions {
        io_type: IoType::Read,
        io_size: 4 * KIB,
        pattern: IoPattern::Rand,
        io_total: MIB,
        ..write.clone()
    };
    let r = run_bench(img.clone(), &read, |_| {}).await.unwrap();
    assert_eq!(r.ops, 256);
    Arc::try_unwrap(img).ok().unwrap().close().await.unwrap();

    let ro = Arc::new(rbd.open_read_only("b").await.unwrap());
    assert!(matches!(
        run_bench(ro.clone(), &write, |_| {}).await,
        Err(RbdError::ReadOnly(_))
    ));
    assert_eq!(run_bench(ro, &read, |_| {}).await.unwrap().ops, 256);
}
