//! A full OSD: writes that cannot commit fail at the client with a clear
//! "no space" error instead of hanging, deletes still go through and free
//! space, and the PG keeps serving afterwards. A write that was in flight
//! when a *replica* refused it for space is in doubt (the primary and other
//! members may hold it): it is not refused but waits for room, and then
//! ends as it really went — applied, or refused with nothing changed.

mod common;

use cairn_ops::OpError;
use common::*;
use std::time::Duration;

/// Bound on any single client call in this test: a hang is the bug.
const OP_LIMIT: Duration = Duration::from_secs(20);
/// A fill write still unanswered after this is taken as in doubt (a replica
/// refused it); it must end once deletes made room.
const IN_DOUBT_AFTER: Duration = Duration::from_secs(8);

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
                let (io2, n2) = (io.clone(), name.clone());
                let data = pattern(w * 1000 + i, size);
                let mut write = tokio::spawn(async move { io2.write_full(&n2, data).await });
                let r = match tokio::time::timeout(IN_DOUBT_AFTER, &mut write).await {
                    Ok(r) => r.expect("write task"),
                    Err(_) => return (written, Err((name, write))),
                };
                match r {
                    Ok(_) => written.push(name),
                    Err(e) => return (written, Ok(e)),
                }
            }
            panic!("writer {w}: 200 writes never filled a 24 MiB store");
        }));
    }
    let mut written = Vec::new();
    let mut in_doubt = Vec::new();
    let mut refused = 0;
    for t in tasks {
        let (names, end) = t.await.expect("writer task");
        written.extend(names);
        let err = match end {
            Ok(e) => e,
            Err(w) => {
                in_doubt.push(w);
                continue;
            }
        };
        refused += 1;
        let msg = err.to_string();
        assert!(
            matches!(err.op_error(), Some(OpError::NoSpace(_))),
            "expected a no-space error, got: {msg}"
        );
        assert!(
            msg.contains("full"),
            "error should say the OSD is full: {msg}"
        );
    }
    assert!(refused > 0, "no writer was refused for space");
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
    // Writes in doubt end once there is room: applied (and readable) or
    // refused with nothing changed.
    for (name, w) in in_doubt {
        let r = tokio::time::timeout(OP_LIMIT, w)
            .await
            .unwrap_or_else(|_| panic!("in-doubt write of {name} still hangs after deletes"))
            .expect("write task");
        match r {
            Ok(_) => {
                tokio::time::timeout(OP_LIMIT, io.stat(&name))
                    .await
                    .expect("stat hung")
                    .unwrap_or_else(|e| panic!("{name} was acknowledged but: {e}"));
            }
            Err(e) => {
                assert!(
                    matches!(e.op_error(), Some(OpError::NoSpace(_))),
                    "in-doubt write of {name}: {e}"
                );
                let st = tokio::time::timeout(OP_LIMIT, io.stat(&name))
                    .await
                    .expect("stat hung");
                assert!(
                    st.as_ref().is_err_and(|e| e.is_not_found()),
                    "{name} was refused but exists: {st:?}"
                );
            }
        }
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
