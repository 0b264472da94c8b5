//! Crash consistency under SIGKILL: a child process (this test binary,
//! re-executed with CAIRN_STORE_CRASH_DIR set) runs a random transaction
//! workload from several threads and prints each committed transaction; the
//! parent kills it at a random moment, reopens the store and checks that
//! every acknowledged transaction is fully present and none partly visible.
//! CI runs 50 kills; CAIRN_SOAK=1 runs 500.

mod common;

use cairn_store::{Store, StoreConfig, Transaction};
use common::*;
use rand::{Rng, SeedableRng};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const WORKERS: usize = 4;
const ENV_DIR: &str = "CAIRN_STORE_CRASH_DIR";
const ENV_SEED: &str = "CAIRN_STORE_CRASH_SEED";

fn cfg(dir: &std::path::Path) -> StoreConfig {
    let mut c = StoreConfig::new(dir);
    c.data_bytes = 512 << 20;
    c.cache_bytes = 16 << 20;
    c.meta_reserve_bytes = 0;
    c
}

/// The child side: does nothing unless started by `crash_kill_loop`.
#[test]
fn crash_child() {
    let Ok(dir) = std::env::var(ENV_DIR) else {
        return;
    };
    let seed: u64 = std::env::var(ENV_SEED)
        .expect("seed")
        .parse()
        .expect("seed");
    let dir = std::path::PathBuf::from(dir);
    let store = if dir.join(cairn_store::DATA_FILE).exists() {
        Store::open(cfg(&dir)).expect("open")
    } else {
        let s = Store::create(cfg(&dir)).expect("create");
        let mut t = Transaction::new();
        for w in 0..WORKERS {
            t.create_collection(coll(w));
        }
        s.commit(t).expect("mkcoll");
        s
    };
    let store = std::sync::Arc::new(store);
    println!("READY");
    let mut hs = Vec::new();
    for w in 0..WORKERS {
        let s = store.clone();
        hs.push(std::thread::spawn(move || {
            let mut m = Model::default();
            let last = last_applied(&s, w);
            advance(seed, w, &mut m, last);
            loop {
                let idx = m.idx + 1;
                let ops = gen(seed, w, idx, &m);
                s.commit(to_txn(coll(w), &ops)).expect("commit");
                println!("C {w} {idx}");
                apply(&mut m, &ops);
                m.idx = idx;
            }
        }));
    }
    for h in hs {
        let _ = h.join();
    }
}

#[test]
fn crash_kill_loop() {
    if std::env::var(ENV_DIR).is_ok() {
        return;
    }
    let soak = std::env::var("CAIRN_SOAK").is_ok_and(|v| v == "1");
    let kills = if soak { 500 } else { 50 };
    let seed: u64 = std::env::var("CAIRN_STORE_CRASH_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("crash test seed {seed} (set CAIRN_STORE_CRASH_TEST_SEED to replay the workload)");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let exe = std::env::current_exe().expect("current exe");
    let mut models: Vec<Model> = (0..WORKERS).map(|_| Model::default()).collect();
    let mut total_acked = 0u64;
    for kill in 0..kills {
        let mut child = Command::new(&exe)
            .args(["crash_child", "--exact", "--nocapture", "--test-threads=1"])
            .env(ENV_DIR, dir.path())
            .env(ENV_SEED, seed.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(l) = line else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        // Wait for the child to open the store, then let it run a random while.
        loop {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(l) if l.ends_with("READY") => break,
                Ok(_) => continue,
                Err(e) => panic!("child never became ready (kill {kill}): {e}"),
            }
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(20..400)));
        child.kill().expect("SIGKILL child");
        let _ = child.wait();
        let _ = reader.join();
        let mut acked = [0u64; WORKERS];
        for l in rx.try_iter() {
            let mut it = l.split_whitespace();
            if it.next() == Some("C") {
                let w: usize = it.next().and_then(|x| x.parse().ok()).expect("worker");
                let i: u64 = it.next().and_then(|x| x.parse().ok()).expect("idx");
                acked[w] = acked[w].max(i);
                total_acked += 1;
            }
        }
        let s = Store::open(cfg(dir.path())).expect("reopen after SIGKILL");
        for w in 0..WORKERS {
            let last = last_applied(&s, w);
            let floor = acked[w].max(models[w].idx);
            assert!(
                last >= floor && last <= floor + 1,
                "kill {kill} worker {w}: store has txn {last}, acknowledged up to {floor} (seed {seed})"
            );
            advance(seed, w, &mut models[w], last);
            check(&s, w, &models[w]);
        }
        let rep = s.fsck().expect("fsck");
        assert!(
            rep.is_clean(),
            "kill {kill}: fsck {:?} (seed {seed})",
            rep.issues
        );
        if kill % 10 == 9 {
            let rep = s.deep_fsck().expect("deep fsck");
            assert!(
                rep.is_clean(),
                "kill {kill}: deep fsck {:?} (seed {seed})",
                rep.issues
            );
        }
    }
    println!("{kills} kills, {total_acked} acknowledged transactions verified");
    assert!(total_acked > 0, "child never committed anything");
}
