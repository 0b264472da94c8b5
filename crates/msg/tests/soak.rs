//! Soak run (only with CAIRN_SOAK=1): several clients with many concurrent
//! callers push random-sized payloads through small in-flight windows for a
//! minute and check every echo. In CI (no CAIRN_SOAK) it returns at once.

mod common;
use bytes::Bytes;
use cairn_msg::{connect, Credentials, Listener, MsgConfig, Secret};
use cairn_types::EntityName;
use common::*;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_random_traffic() {
    if std::env::var("CAIRN_SOAK").map_or(true, |v| v != "1") {
        eprintln!("soak_random_traffic: set CAIRN_SOAK=1 to run it");
        return;
    }
    let secs: u64 = std::env::var("CAIRN_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let cfg = MsgConfig {
        max_inflight_bytes: 4 << 20,
        ..fast_cfg()
    };
    let keys = Keys::default();
    let mut creds = Vec::new();
    for i in 0..4 {
        let name = EntityName::client(&format!("soak{i}"));
        let s = Secret::generate();
        keys.secrets.lock().unwrap().insert(name.clone(), s.clone());
        creds.push(Credentials::Key { name, secret: s });
    }
    let l = Listener::bind(any_port(), mon_a(), Arc::new(keys), cfg.clone())
        .await
        .unwrap();
    let addr = l.local_addr();
    let _server = echo_server(l);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut set = tokio::task::JoinSet::new();
    for (ci, c) in creds.into_iter().enumerate() {
        let conn = connect(addr, &c, Some(&mon_a()), &cfg).await.unwrap();
        for t in 0..8u64 {
            let conn = conn.clone();
            set.spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(ci as u64 * 100 + t);
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let len = if rng.gen_bool(0.9) {
                        rng.gen_range(0..8192)
                    } else {
                        rng.gen_range(0..(1 << 20))
                    };
                    let p: Bytes = payload(len, rng.gen());
                    let r = conn
                        .call(1, p.clone(), Duration::from_secs(30))
                        .await
                        .unwrap();
                    assert_eq!(r.payload, p);
                    n += 1;
                }
                n
            });
        }
    }
    let mut total = 0;
    while let Some(r) = set.join_next().await {
        total += r.unwrap();
    }
    eprintln!("soak: {total} calls in {secs} s, all echoes intact");
}
