//! Full disks and disk errors. A full OSD's store: writes that cannot
//! commit fail at the client with a clear "no space" error instead of
//! hanging, deletes still go through and free space, and the PG keeps
//! serving afterwards. A write that was in flight when a *replica* refused
//! it for space is in doubt (the primary and other members may hold it): it
//! is not refused but waits for room, and then ends as it really went —
//! applied, or refused with nothing changed. The monitors' full marks: a
//! PG with a member marked full refuses writes that add data at once
//! (reads, deletes and truncates work), beacons set and clear the marks,
//! and backfill waits (`backfill_toofull`) for a target marked
//! backfillfull. A backfill target that fails to commit a client write is
//! dropped from the PG's writes without failing them. (An OSD whose own
//! commit fails with EIO: `fail_stop.rs`.)

mod common;

use cairn_map::{FullRatioKind, MonCommand, OsdBeacon};
use cairn_ops::OpError;
use common::*;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

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

/// What the monitor leader proposes for a beacon showing `used` of `total`.
fn mark(c: &mut Cluster, id: i32, used: u64, total: u64) {
    let beacon = OsdBeacon {
        epoch: 0,
        total_bytes: total,
        used_bytes: used,
        available_bytes: total - used,
        pgs: Vec::new(),
    };
    if let Some(cmd) = c.current().fullness_change(id, &beacon) {
        c.apply(cmd);
    }
}

/// `osd set-nearfull-ratio`, `set-backfillfull-ratio`, `set-full-ratio`,
/// in an order that keeps them ordered at every step.
fn set_ratios(c: &mut Cluster, near: f64, backfill: f64, full: f64) {
    let now = c.current().full_ratios;
    let mut steps = vec![
        (FullRatioKind::Nearfull, near),
        (FullRatioKind::Backfillfull, backfill),
        (FullRatioKind::Full, full),
    ];
    if full > now.full || backfill > now.backfillfull {
        steps.reverse();
    }
    for (which, ratio) in steps {
        c.apply(MonCommand::OsdSetFullRatio { which, ratio });
    }
}

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(OP_LIMIT, f)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_marked_full_fails_writes_at_once_but_reads_and_deletes_work() {
    // 3 OSDs, size 3: osd.1 is a member of every PG (a replica of most).
    let mut c = Cluster::start(3, 1, 4, 64 << 20).await;
    let io = c.client().ioctx("rbd").expect("pool");
    for i in 0..8u64 {
        io.write_full(&format!("obj-{i}"), pattern(i, 8192))
            .await
            .expect("write");
    }
    mark(&mut c, 1, 96, 100);
    for (i, name) in ["new", "obj-3"].iter().enumerate() {
        let t0 = Instant::now();
        let err = within(
            "write to a full pool",
            io.write_full(name, pattern(90 + i as u64, 8192)),
        )
        .await
        .expect_err("a write to a PG with a full member must be refused");
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "refused only after {:?}",
            t0.elapsed()
        );
        assert!(matches!(err.op_error(), Some(OpError::NoSpace(_))), "{err}");
        assert!(
            err.to_string().contains(
                "pool 'rbd' is full: osd.1 is 96% used (full ratio 0.95); delete data or add disks"
            ),
            "{err}"
        );
    }
    let err = within("append", io.append("obj-4", pattern(7, 100)))
        .await
        .expect_err("append adds data");
    assert!(matches!(err.op_error(), Some(OpError::NoSpace(_))), "{err}");
    // Nothing of the refused writes happened.
    let st = within("stat", io.stat("new")).await;
    assert!(
        st.is_err_and(|e| e.is_not_found()),
        "refused write created 'new'"
    );
    assert_eq!(
        within("read", io.read("obj-3", 0, 0)).await.expect("read"),
        pattern(3, 8192)
    );
    // Reads, removes, truncates and zeroing (they free space) work.
    within("remove", io.remove("obj-0"))
        .await
        .expect("remove on a full pool");
    within("truncate", io.truncate("obj-1", 100))
        .await
        .expect("truncate on a full pool");
    within("zero", io.zero("obj-2", 0, 4096))
        .await
        .expect("zero on a full pool");
    assert_eq!(
        within("read", io.read("obj-1", 0, 0)).await.expect("read"),
        pattern(1, 8192)[..100].to_vec()
    );
    // Room again (the next beacon is below every ratio): writes work.
    mark(&mut c, 1, 10, 100);
    within("write after room", io.write_full("new", pattern(99, 8192)))
        .await
        .expect("write once the OSD has room");
    assert_eq!(
        within("read", io.read("new", 0, 0)).await.expect("read"),
        pattern(99, 8192)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn beacons_mark_osds_full_and_deletes_clear_the_mark() {
    let config = vec![("osd_beacon_report_interval", "1")];
    let mut c = Cluster::start_with(3, 1, 4, 32 << 20, config, true).await;
    // Low ratios so the monitors' mark comes long before the stores' own limit.
    for (which, r) in [
        (FullRatioKind::Nearfull, 0.3),
        (FullRatioKind::Backfillfull, 0.4),
        (FullRatioKind::Full, 0.5),
    ] {
        c.apply(MonCommand::OsdSetFullRatio { which, ratio: r });
    }
    let io = c.client().ioctx("rbd").expect("pool");
    let mut written = Vec::new();
    let refusal = loop {
        assert!(
            written.len() < 200,
            "200 writes of 256 KiB never filled 32 MiB stores"
        );
        let name = format!("fill-{}", written.len());
        match within(
            "fill write",
            io.write_full(&name, pattern(written.len() as u64, 256 << 10)),
        )
        .await
        {
            Ok(_) => written.push(name),
            Err(e) => break e,
        }
        // Slower than the beacons, so the mark comes well before the stores' own limit.
        tokio::time::sleep(Duration::from_millis(40)).await;
    };
    let msg = refusal.to_string();
    assert!(
        matches!(refusal.op_error(), Some(OpError::NoSpace(_))),
        "{msg}"
    );
    assert!(
        msg.contains("pool 'rbd' is full: osd.") && msg.contains("(full ratio 0.5)"),
        "{msg}"
    );
    let h = c.current().health(&Default::default());
    let full = h.check("OSD_FULL").expect("OSD_FULL raised");
    assert!(
        full.detail.iter().all(|d| d.contains("is full")),
        "{:?}",
        full.detail
    );
    // Deleting data clears the marks (next beacons), then writes work.
    for name in &written {
        within("delete", io.remove(name))
            .await
            .expect("delete on a full pool");
    }
    let t0 = Instant::now();
    while !c.current().osd_fullness.is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "marks stayed after deletes: {:?}",
            c.current().osd_fullness
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    within(
        "write after deletes",
        io.write_full("after", pattern(1, 4096)),
    )
    .await
    .expect("write after the marks cleared");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backfill_waits_while_its_target_is_backfillfull() {
    // Monitored: backfill runs in the background through pg_temp, and the
    // stand-in monitor marks OSDs from their beacons.
    let config = vec![("osd_beacon_report_interval", "1")];
    let mut c = Cluster::start_with(4, 1, 4, 256 << 20, config, true).await;
    let io = c.client().ioctx("rbd").expect("pool");
    // More objects per PG than the clean log keeps (250, at most 313): new members
    // need a backfill, not log recovery.
    preload(&io, 1400, 4096).await;
    c.wait_clean(Duration::from_secs(30)).await;
    // Ratios so low that every OSD's real use (about 2 %) is backfillfull
    // (not full); wait for the beacons to mark them.
    set_ratios(&mut c, 0.001, 0.002, 0.95);
    let t0 = Instant::now();
    while (0..4).any(|id| c.current().full_state(id) != cairn_map::FullState::Backfillfull) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "beacons did not mark the OSDs backfillfull: {:?}",
            c.current().osd_fullness
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.apply(MonCommand::OsdOut { ids: vec![0] });
    let t0 = Instant::now();
    let toofull = loop {
        let waits: Vec<String> = c
            .osds
            .values()
            .flatten()
            .flat_map(|o| o.pg_stats())
            .filter(|s| s.state.contains("backfill_toofull"))
            .filter_map(|s| s.backfill.and_then(|b| b.waiting))
            .collect();
        if let Some(w) = waits.first() {
            break w.clone();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no PG showed backfill_toofull: {:?}",
            c.primary_states()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        toofull.starts_with("backfill_toofull: osd.")
            && toofull.contains("(backfillfull ratio 0.002)"),
        "{toofull}"
    );
    // It stays waiting (nothing copied) while the marks hold; writes go on.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let copied: u64 = c
        .osds
        .values()
        .flatten()
        .flat_map(|o| o.pg_stats())
        .filter_map(|s| s.backfill.map(|b| b.copied_objects))
        .sum();
    assert_eq!(copied, 0, "backfill copied onto a backfillfull OSD");
    within("write", io.write_full("during", pattern(5, 4096)))
        .await
        .expect("backfillfull does not stop writes");
    // Room again (the ratio raised; marks are re-judged at once):
    // backfill runs and the PGs get clean.
    set_ratios(&mut c, 0.85, 0.9, 0.95);
    assert!(c.current().backfill_toofull(&[1, 2, 3]).is_none());
    c.wait_clean(Duration::from_secs(45)).await;
    for i in (0..1400).step_by(97) {
        assert_eq!(
            within("read", io.read(&format!("pre-{i}"), 0, 0))
                .await
                .expect("read"),
            pattern(i, 4096)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backfill_target_that_cannot_commit_a_write_is_dropped_not_the_write() {
    // Three OSDs hold 400 small objects in one PG (more than the clean
    // log keeps, so a new member is backfilled in the background); a
    // fourth, with a 4 MiB store, is backfilled slowly (a bandwidth cap)
    // when osd.0 goes out. Once it holds the first objects (store order),
    // those are overwritten with 512 KiB each: every such write goes to the
    // target too, until its store refuses one. Those writes must succeed
    // (the target is not an acting member: it is dropped from the PG's
    // writes and resumes later) and the PG must never go down.
    //
    // The writes are larger than a backfill batch (64 x 4 KiB) and come
    // much faster than batches under the cap, so the store refuses a client
    // write before it refuses a batch (a refused batch would drop the
    // target from the writes first, and the set-up would prove nothing).
    const OBJ: usize = 512 << 10;
    const PRELOAD: u64 = 400;
    // Monitored: backfill runs in the background through pg_temp.
    let config = vec![("osd_recovery_max_bytes_per_sec", "100000")];
    let mut c = Cluster::start_with(3, 1, 1, 128 << 20, config, true).await;
    // Ratios above the test stores' own limit (0.95): the monitors never
    // mark the small OSD, so its store's refusal is what the PG sees.
    set_ratios(&mut c, 0.96, 0.97, 0.97);
    let io = c.client().ioctx("rbd").expect("pool");
    preload(&io, PRELOAD, 4096).await;
    let secret = [0x7e; 32];
    let r = c.apply_with(
        MonCommand::OsdNew {
            uuid: "00000000-0000-0000-0000-00000000fff3".into(),
            id: None,
            host: "node3".into(),
            weight: 1.0,
            class: Some("hdd".into()),
        },
        Some(secret),
    );
    let small = r.json["osdid"].as_i64().expect("osdid") as i32;
    c.secrets.insert(small, secret);
    let mut cfg = c.store_cfg(small);
    cfg.data_bytes = 4 << 20;
    c.boot(small, cairn_store::Store::create(cfg).expect("small store"))
        .await;
    c.apply(MonCommand::OsdOut { ids: vec![0] });

    // Wait until the target durably holds some objects: the first ones in
    // store order (bit-reversed hash, then name).
    let copied = |c: &Cluster| -> u64 {
        c.osds
            .values()
            .flatten()
            .flat_map(|o| o.pg_stats())
            .filter_map(|s| s.backfill.map(|b| b.copied_objects))
            .max()
            .unwrap_or(0)
    };
    let t0 = Instant::now();
    while copied(&c) < 24 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "backfill copied no objects to the new OSD in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held = copied(&c) as usize;
    let mut in_store_order: Vec<(u32, String)> = (0..PRELOAD)
        .map(|i| {
            let name = format!("pre-{i}");
            let o = cairn_ops::ObjectName::new("", name.clone());
            (o.hash().reverse_bits(), name)
        })
        .collect();
    in_store_order.sort();
    let targets: Vec<String> = in_store_order
        .into_iter()
        .take(held)
        .map(|(_, n)| n)
        .collect();

    // After each write, look at the primaries: the waits they report, and
    // that no PG went down over a member's failed commit.
    let failed_write = |seen: &BTreeSet<String>| {
        seen.iter()
            .any(|w| w.contains(": write ") && w.contains(" failed: "))
    };
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut acked = Vec::new();
    // Polled every 10 ms while a write is in flight and up to 1 s after
    // it: a refused write shows as the target's stall reason for at least
    // the back-off (500 ms) before it resumes with another reason.
    let observe = |c: &Cluster, seen: &mut BTreeSet<String>| {
        for s in c.osds.values().flatten().flat_map(|o| o.pg_stats()) {
            let why = s.down_reason.as_deref().unwrap_or("");
            if why.contains("failed to commit") {
                seen.insert(format!("DOWN {} {}: {why}", s.pgid, s.state));
            }
            if let Some(w) = s.backfill.and_then(|b| b.waiting) {
                seen.insert(w);
            }
        }
    };
    for (k, n) in targets.iter().enumerate() {
        if failed_write(&seen) {
            break;
        }
        let seed = 1000 + k as u64;
        let write = within("write", io.write_full(n, pattern(seed, OBJ)));
        tokio::pin!(write);
        let result = loop {
            tokio::select! {
                r = &mut write => break r,
                _ = tokio::time::sleep(Duration::from_millis(10)) => observe(&c, &mut seen),
            }
        };
        result
            .unwrap_or_else(|e| panic!("write of {n} failed while a backfill target is full: {e}"));
        acked.push((n.clone(), seed));
        let t = Instant::now();
        while !failed_write(&seen) && t.elapsed() < Duration::from_secs(1) {
            observe(&c, &mut seen);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert!(
        !seen.iter().any(|w| w.starts_with("DOWN")),
        "a PG went down because a backfill target failed a write: {seen:?}"
    );
    assert!(
        failed_write(&seen),
        "the backfill target never refused a client write (test set-up): {seen:?}"
    );
    for (n, seed) in &acked {
        assert_eq!(
            within("read", io.read(n, 0, 0)).await.expect("read"),
            pattern(*seed, OBJ),
            "{n}"
        );
    }
}
