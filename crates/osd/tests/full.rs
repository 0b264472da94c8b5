//! A full OSD: writes that cannot commit fail at the client with a clear
//! "no space" error instead of hanging, deletes still go through and free
//! space, and the PG keeps serving afterwards.

mod common;

use cairn_ops::OpError;
use common::*;
use std::time::Duration;

/// Bound on any single client call in this test: a hang is the bug.
const OP_LIMIT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn full_store_fails_writes_and_accepts_deletes() {
    // 6 OSDs with 24 MiB data files; PGs spread unevenly, so one OSD fills
    // while it is a replica of PGs whose primary still has room.
    let c = Cluster::start(3, 2, 8, 24 << 20).await;
    let io = c.client().ioctx("rbd").expect("pool");

    // Fill with concurrent writers (several writes pass any pre-check at
    // once) until every writer has hit an error.
    let mut tasks = Vec::new();
    for w in 0..6u64 {
        let io = io.clone();
        tasks.push(tokio::spawn(async move {
            let mut written = Vec::new();
            for i in 0..200u64 {
                let name = format!("fill-{w}-{i}");
                let size = if i % 3 == 0 { 3000 } else { 192 << 10 };
                let r = tokio::time::timeout(
                    OP_LIMIT,
                    io.write_full(&name, pattern(w * 1000 + i, size)),
                )
                .await
                .unwrap_or_else(|_| panic!("write of {name} hung on a full OSD"));
                match r {
                    Ok(_) => written.push(name),
                    Err(e) => return (written, e),
                }
            }
            panic!("writer {w}: 200 writes never filled a 24 MiB store");
        }));
    }
    let mut written = Vec::new();
    for t in tasks {
        let (names, err) = t.await.expect("writer task");
        let msg = err.to_string();
        assert!(
            matches!(err.op_error(), Some(OpError::NoSpace(_))),
            "expected a no-space error, got: {msg}"
        );
        assert!(
            msg.contains("full"),
            "error should say the OSD is full: {msg}"
        );
        written.extend(names);
    }
    assert!(
        written.len() > 44,
        "only {} writes before full",
        written.len()
    );

    // Deletes work on the full OSD and free space. They run concurrently: a
    // PG whose replica refused a write re-peers and activates once deletes
    // on its other PGs made room there.
    let mut dels = Vec::new();
    for name in written.iter().take(24) {
        let (io, name) = (io.clone(), name.clone());
        dels.push(tokio::spawn(async move {
            tokio::time::timeout(OP_LIMIT, io.remove(&name))
                .await
                .unwrap_or_else(|_| panic!("delete of {name} hung"))
                .unwrap_or_else(|e| panic!("delete of {name} failed on a full OSD: {e}"));
        }));
    }
    for d in dels {
        d.await.expect("delete task");
    }
    // A small write succeeds now, including to an object on a PG that failed a write.
    for i in 0..4u64 {
        let name = format!("after-{i}");
        tokio::time::timeout(OP_LIMIT, io.write_full(&name, pattern(i, 4096)))
            .await
            .unwrap_or_else(|_| panic!("write of {name} hung after deletes"))
            .unwrap_or_else(|e| panic!("small write after deletes failed: {e}"));
        let back = tokio::time::timeout(OP_LIMIT, io.read(&name, 0, 0))
            .await
            .expect("read hung")
            .expect("read");
        assert_eq!(back, pattern(i, 4096));
    }
    // Every object written before the fill still reads back (nothing half-applied).
    for name in written.iter().skip(24).take(20) {
        tokio::time::timeout(OP_LIMIT, io.stat(name))
            .await
            .expect("stat hung")
            .unwrap_or_else(|e| panic!("stat {name}: {e}"));
    }
}
