//! Real-process fault tests (issue 6 §6): three hosts, each one `cairn
//! daemon` (its mon and two OSDs) on an address of its own with its own
//! `host=` CRUSH location; pool `rbd`, size 3 / min_size 2, 32 PGs;
//! heartbeat grace 3 s. A cairn-client writer writes objects the whole
//! time and every write it got acknowledged is read back and compared at
//! the end. The faults: a host killed with SIGKILL and restarted (log-based
//! recovery), one OSD lost and marked out (backfill elsewhere), a new OSD
//! added (its share of PGs moves), `noout` during a host restart, and one
//! host cut off by a network partition (network namespaces); and (issue 7)
//! an EC 2+1 pool, failure domain host, with a host killed during writes.
//! Every daemon
//! is killed by PID and every namespace deleted when a test ends, also
//! when it fails. `recovery_figures` (ignored; `bench/recovery.sh`) prints
//! the recovery timings and throughput.

mod common;
#[path = "common/hosts.rs"]
mod hosts;
#[path = "common/netns.rs"]
mod netns;

use hosts::{Acked, Hosts, Opts, Writer, WriterOpts};
use netns::Netns;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// Objects recovered by log and by backfill over every PG, from the
/// primaries' reports (`pg dump`).
fn recovery_totals(c: &Hosts) -> (u64, u64) {
    c.pg_dump().iter().fold((0, 0), |(l, b), p| {
        (
            l + p["recovery"]["log_objects"].as_u64().unwrap_or(0),
            b + p["recovery"]["backfill_objects"].as_u64().unwrap_or(0),
        )
    })
}

/// Up set of every PG, by PG id.
fn up_sets(c: &Hosts) -> BTreeMap<String, Vec<i64>> {
    c.pg_dump()
        .iter()
        .filter_map(|p| {
            let up = p["up"]
                .as_array()?
                .iter()
                .filter_map(|o| o.as_i64())
                .collect();
            Some((p["pgid"].as_str()?.to_string(), up))
        })
        .collect()
}

/// Waits until every PG is active again; returns how long it took.
fn wait_active(c: &Hosts, what: &str, within: Duration) -> Duration {
    let t0 = Instant::now();
    while !c.all_active() {
        assert!(
            t0.elapsed() < within,
            "{what}: PGs not active within {within:?}: {:?}",
            c.pg_states().1
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    t0.elapsed()
}

/// kill -9 of host `victim`, then waits until its OSDs are marked down and
/// every PG is active again; returns both times, counted from the kill.
fn kill_host_until_active(c: &Hosts, victim: usize, what: &str) -> (Duration, Duration) {
    let osds = c.host_osds(victim);
    c.kill9(victim);
    let killed = Instant::now();
    let down_after = c.wait_osds(
        &format!("{what}: the OSDs marked down"),
        Duration::from_secs(30),
        |s| osds.iter().all(|o| s.get(o).is_some_and(|(up, _)| !up)),
    );
    let active_after = killed.elapsed()
        + wait_active(
            c,
            &format!("{what}: every PG active"),
            Duration::from_secs(30),
        );
    (down_after, active_after)
}

/// Stops the writer and checks every acknowledged object.
fn stop_and_verify(c: &Hosts, w: Writer, what: &str) -> Vec<Acked> {
    let (acked, errors) = w.stop();
    eprintln!(
        "{what}: {} writes acknowledged, {} failed or timed out{}",
        acked.len(),
        errors.len(),
        errors
            .first()
            .map(|e| format!(" (first: {e})"))
            .unwrap_or_default()
    );
    if let Err(e) = c.verify(&acked) {
        panic!("{what}: {e}");
    }
    acked
}

/// Erasure coding across separate daemon processes: an EC 2+1 pool with
/// failure domain host over the three `cairn daemon` hosts (min_size 2, k,
/// as m = 1). kill -9 of a host during writes: every PG keeps two of its
/// three chunks, so writes and reads go on, degraded; everything
/// acknowledged reads back while the host is down and again after it
/// restarted and every PG is active+clean.
#[test]
fn ec21_host_killed_during_writes_loses_nothing() {
    let mut c = Hosts::start(&Opts::default());
    c.ok(&[
        "osd",
        "erasure-code-profile",
        "set",
        "ec21host",
        "k=2",
        "m=1",
        "crush-failure-domain=host",
    ]);
    c.ok(&[
        "osd", "pool", "create", "ec21", "16", "16", "erasure", "ec21host",
    ]);
    c.wait_clean(Duration::from_secs(60));
    c.pool = "ec21".into();
    let w = c.writer("ec", 4);
    assert!(
        w.wait_acked(20, Duration::from_secs(30)),
        "no EC writes acknowledged: {:?}",
        w.errors()
    );
    let victim = 2;
    let (_, active_after) = kill_host_until_active(&c, victim, "EC: kill -9 of host c");
    eprintln!(
        "EC 2+1: kill -9 of host c, every PG active after {:.1} s",
        active_after.as_secs_f64()
    );
    let n = w.acked_count();
    assert!(
        w.wait_acked(n + 20, Duration::from_secs(30)),
        "EC writes stalled with host c down: {:?}",
        w.errors()
    );
    let acked = stop_and_verify(&c, w, "EC 2+1 with host c down (degraded reads)");
    let r = c.start_host(victim);
    assert!(r.ok, "restarting host c: {r:?}");
    c.wait_osds("host c's OSDs up again", Duration::from_secs(30), |s| {
        s.values().all(|(up, _)| *up)
    });
    c.wait_clean(Duration::from_secs(90));
    if let Err(e) = c.verify(&acked) {
        panic!("EC 2+1 after host c's return: {e}");
    }
}

/// kill -9 of a whole host for about 5 s, then a restart: its OSDs are
/// marked down by heartbeats, every PG goes active on the two others and
/// writes continue; after the restart every PG is active+clean again,
/// the restarted OSDs were caught up from the PG logs (no backfill), and
/// nothing acknowledged is lost.
#[test]
fn host_killed_and_restarted_recovers_from_the_log() {
    let c = Hosts::start(&Opts::default());
    let w = c.writer("kill", 4);
    assert!(
        w.wait_acked(20, Duration::from_secs(30)),
        "no writes acknowledged: {:?}",
        w.errors()
    );
    let victim = 2;
    let (log0, backfill0) = recovery_totals(&c);
    let killed = Instant::now();
    let (down_after, active_after) = kill_host_until_active(&c, victim, "kill -9 of host c");
    eprintln!(
        "kill -9 of host c: its OSDs marked down after {:.1} s, every PG active after {:.1} s (grace 3 s)",
        down_after.as_secs_f64(),
        active_after.as_secs_f64()
    );
    let n = w.acked_count();
    assert!(
        w.wait_acked(n + 20, Duration::from_secs(30)),
        "writes stalled with host c down: {:?}",
        w.errors()
    );
    std::thread::sleep(Duration::from_secs(5).saturating_sub(killed.elapsed()));
    let r = c.start_host(victim);
    assert!(r.ok, "restarting host c: {r:?}");
    c.wait_osds("host c's OSDs up again", Duration::from_secs(30), |s| {
        s.values().all(|(up, _)| *up)
    });
    let clean_after = c.wait_clean(Duration::from_secs(60));
    eprintln!(
        "restart of host c: active+clean {:.1} s after its OSDs were up",
        clean_after.as_secs_f64()
    );
    let n = w.acked_count();
    assert!(
        w.wait_acked(n + 10, Duration::from_secs(30)),
        "writes stalled after the restart"
    );
    stop_and_verify(&c, w, "kill -9 and restart of host c");
    let (log, backfill) = recovery_totals(&c);
    eprintln!(
        "recovered objects: {} by log, {} by backfill",
        log - log0,
        backfill - backfill0
    );
    assert!(
        log > log0,
        "the restarted OSDs were not caught up from the log (log {log0}->{log})"
    );
    assert_eq!(backfill, backfill0, "a short outage must not need backfill");
}

/// One OSD lost (the daemon stops it as a dead disk; the daemon cannot
/// kill a single OSD with a signal) and marked out after
/// `mon_osd_down_out_interval`: its PGs are copied onto the other OSD of
/// its host, every acknowledged object has three copies on three hosts
/// (`cairn osd map` and the stores themselves), reads return them, and
/// writes go on meanwhile. While a PG's log still reaches back to its
/// creation (fewer than `osd_min_pg_log_entries` writes, as here) the new
/// member is caught up from the log rather than by a backfill scan; the
/// counts of both are printed.
#[test]
fn lost_osd_marked_out_is_backfilled_elsewhere() {
    let c = Hosts::start(&Opts::default().set("mon", "mon_osd_down_out_interval", "3"));
    let w = c.writer("out", 4);
    assert!(
        w.wait_acked(100, Duration::from_secs(40)),
        "no writes acknowledged: {:?}",
        w.errors()
    );
    let host_c = c.host_osds(2);
    let (victim, sibling) = (host_c[1], host_c[0]);
    let moved: BTreeSet<String> = up_sets(&c)
        .into_iter()
        .filter(|(_, up)| up.contains(&(victim as i64)))
        .map(|(pg, _)| pg)
        .collect();
    let (log0, backfill0) = recovery_totals(&c);
    c.take_osd_away(victim);
    let t0 = Instant::now();
    c.wait_osds(
        "the lost OSD marked down and out",
        Duration::from_secs(30),
        |s| s.get(&victim) == Some(&(false, false)),
    );
    let out_after = t0.elapsed();
    // Writes continue while the backfill runs.
    let n = w.acked_count();
    assert!(
        w.wait_acked(n + 20, Duration::from_secs(30)),
        "writes stalled during the backfill: {:?}",
        w.errors()
    );
    let clean_after = c.wait_clean(Duration::from_secs(60));
    eprintln!(
        "osd.{victim} lost: down and out after {:.1} s, {} PGs active+clean again {:.1} s later",
        out_after.as_secs_f64(),
        moved.len(),
        clean_after.as_secs_f64()
    );
    let after = up_sets(&c);
    for pg in &moved {
        assert!(
            after[pg].contains(&(sibling as i64)) && !after[pg].contains(&(victim as i64)),
            "pg {pg} should have moved from osd.{victim} to osd.{sibling}: {:?}",
            after[pg]
        );
    }
    let acked = stop_and_verify(&c, w, "osd lost and marked out");
    let (log, backfill) = recovery_totals(&c);
    eprintln!(
        "copied to osd.{sibling}: {} objects by log, {} by backfill",
        log - log0,
        backfill - backfill0
    );
    assert!(
        log + backfill > log0 + backfill0,
        "nothing was copied to osd.{sibling}"
    );
    check_three_copies(&c, &acked, victim);
}

/// Three copies of every acknowledged object: `cairn osd map` names three
/// acting OSDs on three hosts (none of them `gone`), and with the daemons
/// stopped each of those OSDs' stores holds the object with the
/// acknowledged content.
fn check_three_copies(c: &Hosts, acked: &[Acked], gone: i32) {
    let mut placed = Vec::new();
    for a in acked.iter().step_by((acked.len() / 40).max(1)) {
        let out = c.ok(&["osd", "map", &c.pool, &a.name]);
        let acting = out
            .split("acting (")
            .nth(1)
            .and_then(|s| s.split(']').next())
            .map(|s| s.trim_start_matches('['))
            .unwrap_or_else(|| panic!("no acting set in {out}"));
        let osds: Vec<i32> = acting
            .split(',')
            .filter_map(|o| o.trim().parse().ok())
            .collect();
        let hosts: BTreeSet<usize> = osds.iter().map(|o| c.host_of(*o)).collect();
        assert!(
            osds.len() == 3 && hosts.len() == 3 && !osds.contains(&gone),
            "{}: acting {osds:?} (hosts {hosts:?}); want three OSDs on three hosts without osd.{gone}: {out}",
            a.name
        );
        placed.push((a, osds));
    }
    c.kill_all();
    let stores = c.read_stores();
    for (a, osds) in placed {
        for o in osds {
            let got = stores.get(&o).and_then(|m| m.get(&a.name));
            assert_eq!(
                got,
                Some(&a.hash),
                "{}: osd.{o}'s store lacks the acknowledged copy (hash {:x}, found {got:?})",
                a.name,
                a.hash
            );
        }
    }
    // Every object: good copies on three hosts, not counting `gone`.
    for a in acked {
        let hosts: BTreeSet<usize> = stores
            .iter()
            .filter(|(o, m)| **o != gone && m.get(&a.name) == Some(&a.hash))
            .map(|(o, _)| c.host_of(*o))
            .collect();
        assert!(
            hosts.len() == 3,
            "{}: good copies on hosts {hosts:?} only",
            a.name
        );
    }
    eprintln!(
        "{} objects: good copies on three hosts each, read from the stores",
        acked.len()
    );
}

/// A new OSD on host a: about its share of PGs (a third of host a's, the
/// hosts being the failure domain) move to it, misplaced objects go back
/// to 0, every PG is active+clean and nothing acknowledged is lost.
#[test]
fn new_osd_takes_its_share() {
    let c = Hosts::start(&Opts::default());
    let w = c.writer("add", 4);
    assert!(
        w.wait_acked(100, Duration::from_secs(40)),
        "no writes acknowledged: {:?}",
        w.errors()
    );
    let before = up_sets(&c);
    let t0 = Instant::now();
    let new = c.add_disk(0, "256M");
    let after = up_sets(&c);
    // Copies that move: OSDs in a PG's new up set that were not in its old.
    let mut to_new = 0usize;
    let mut elsewhere = Vec::new();
    for (pg, b) in &before {
        for o in after[pg].iter().filter(|o| !b.contains(o)) {
            if *o == new as i64 {
                to_new += 1;
            } else {
                elsewhere.push(format!("{pg}: {b:?} -> {:?}", after[pg]));
            }
        }
    }
    // Equal weights, hosts as failure domain: the new OSD takes a third of
    // host a's PGs. CRUSH moves some other copies too: a host drawn twice
    // for one PG is drawn again with another r, and that r also picks the
    // OSD inside the host, so when host a's weight changes the retries of
    // a few PGs change (Ceph's CRUSH does the same; with 3 hosts for 3
    // copies retries are frequent). The placement is deterministic here
    // (same ids and weights every run): 11 PGs to osd.6, 8 other copies.
    let share = before.len() as f64 / 3.0;
    eprintln!(
        "osd.{new} added: {to_new} of {} PGs moved to it (its share {share:.1}); {} other copies moved: {elsewhere:?}",
        before.len(),
        elsewhere.len()
    );
    assert!(
        (to_new as f64) > share * 0.4 && (to_new as f64) < share * 1.8,
        "{to_new} PGs moved to osd.{new}; about {share:.1} expected"
    );
    assert!(
        (elsewhere.len() as f64) <= share,
        "too many copies moved between old OSDs: {elsewhere:?}"
    );
    let n = w.acked_count();
    assert!(
        w.wait_acked(n + 20, Duration::from_secs(30)),
        "writes stalled during the backfill: {:?}",
        w.errors()
    );
    c.wait_clean(Duration::from_secs(60));
    eprintln!(
        "active+clean {:.1} s after disk add",
        t0.elapsed().as_secs_f64()
    );
    let stat = c.pg_stat();
    assert_eq!(
        stat["misplaced_objects"].as_u64(),
        Some(0),
        "misplaced objects left: {stat}"
    );
    let acked = stop_and_verify(&c, w, "new OSD");
    check_three_copies(&c, &acked, -1);
}

/// `noout` during a host outage longer than `mon_osd_down_out_interval`:
/// no OSD is marked out and no backfill starts; the restart catches the
/// host up from the logs. After `osd unset noout` the same outage gets an
/// OSD of the host marked out again. The subtree limit is raised to
/// `rack` (there are no racks), so that only `noout` keeps a whole host
/// in.
#[test]
fn noout_during_host_restart() {
    let c = Hosts::start(
        &Opts::default()
            .set("mon", "mon_osd_down_out_interval", "2")
            .set("mon", "mon_osd_down_out_subtree_limit", "rack"),
    );
    let w = c.writer("noout", 4);
    assert!(
        w.wait_acked(20, Duration::from_secs(30)),
        "no writes acknowledged: {:?}",
        w.errors()
    );
    c.ok(&["osd", "set", "noout"]);
    let victim = 2;
    let osds = c.host_osds(victim);
    let (log0, backfill0) = recovery_totals(&c);
    c.kill9(victim);
    c.wait_osds("host c's OSDs marked down", Duration::from_secs(30), |s| {
        osds.iter().all(|o| s.get(o).is_some_and(|(up, _)| !up))
    });
    // Three times the down-out interval: nobody goes out, nothing moves.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(6) {
        let s = c.osd_states();
        assert!(
            s.values().all(|(_, is_in)| *is_in),
            "an OSD was marked out under noout: {s:?}"
        );
        let (_, by) = c.pg_states();
        assert!(
            !by.keys()
                .any(|k| k.contains("backfill") || k.contains("remapped")),
            "backfill under noout: {by:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let h = c.ok(&["health", "detail"]);
    assert!(h.contains("noout"), "{h}");
    let r = c.start_host(victim);
    assert!(r.ok, "restarting host c: {r:?}");
    c.wait_clean(Duration::from_secs(60));
    assert!(c.osd_states().values().all(|(up, is_in)| *up && *is_in));
    let (log, backfill) = recovery_totals(&c);
    assert!(log > log0, "host c was not caught up from the log");
    assert_eq!(backfill, backfill0, "backfill ran under noout");

    // Without noout the same outage marks an OSD out after the interval
    // (only one: `mon_osd_min_in_ratio` 0.75 keeps 5 of 6 in).
    c.ok(&["osd", "unset", "noout"]);
    c.kill9(victim);
    let t0 = Instant::now();
    c.wait_osds(
        "an OSD of host c marked out without noout",
        Duration::from_secs(30),
        |s| osds.iter().any(|o| s.get(o) == Some(&(false, false))),
    );
    eprintln!(
        "without noout: an OSD of host c out {:.1} s after the kill",
        t0.elapsed().as_secs_f64()
    );
    let r = c.start_host(victim);
    assert!(r.ok, "restarting host c: {r:?}");
    c.wait_osds(
        "host c's OSDs up and in again",
        Duration::from_secs(30),
        |s| s.values().all(|(up, is_in)| *up && *is_in),
    );
    c.wait_clean(Duration::from_secs(60));
    stop_and_verify(&c, w, "noout");
}

/// Namespaces, or why the test cannot run (it then fails unless
/// `CAIRN_SKIP_NETNS=1`).
fn netns_or_skip() -> bool {
    match Netns::unavailable() {
        None => true,
        Some(why) if std::env::var("CAIRN_SKIP_NETNS").as_deref() == Ok("1") => {
            eprintln!("skipped: network namespaces unavailable ({why}) and CAIRN_SKIP_NETNS=1");
            false
        }
        Some(why) => panic!(
            "network namespaces are unavailable ({why}); this test needs root and 'ip netns'. Set CAIRN_SKIP_NETNS=1 to skip it"
        ),
    }
}

/// Host c cut off from hosts a and b (each host in a network namespace;
/// its switch port goes down) while two clients write: one beside a and b
/// (all mons), one on host c's side of the cut (only mon c). The
/// majority marks c's OSDs down and keeps acknowledging writes; the
/// minority side acknowledges nothing sent during the cut (its PGs cannot
/// reach the other members). After the heal every PG is active+clean and
/// every acknowledged write of either client reads back.
#[test]
fn partition_of_one_host() {
    if !netns_or_skip() {
        return;
    }
    let c = Hosts::start(&Opts {
        netns: true,
        ..Opts::default()
    });
    let major = c.writer("major", 4);
    let minor = Writer::start(WriterOpts {
        mons: vec![c.hosts[2].mon_addr],
        ns: c.hosts[2].ns.clone(),
        ..c.writer_opts("minor", 4)
    });
    for (w, who) in [(&major, "majority"), (&minor, "minority")] {
        assert!(
            w.wait_acked(20, Duration::from_secs(30)),
            "{who} writer: nothing acknowledged: {:?}",
            w.errors()
        );
    }
    let victim = 2;
    let osds = c.host_osds(victim);
    let net = c.net.as_ref().unwrap();
    net.cut(victim).unwrap();
    let cut_at = Instant::now();
    let down_after = c.wait_osds(
        "host c's OSDs marked down by the majority",
        Duration::from_secs(30),
        |s| osds.iter().all(|o| s.get(o).is_some_and(|(up, _)| !up)),
    );
    let active_after =
        cut_at.elapsed() + wait_active(&c, "majority after the cut", Duration::from_secs(30));
    eprintln!(
        "host c cut off: its OSDs marked down after {:.1} s, every PG active on a and b after {:.1} s",
        down_after.as_secs_f64(),
        active_after.as_secs_f64()
    );
    let n = major.acked_count();
    assert!(
        major.wait_acked(n + 20, Duration::from_secs(30)),
        "majority writes stalled during the partition: {:?}",
        major.errors()
    );
    std::thread::sleep(Duration::from_secs(10).saturating_sub(cut_at.elapsed()));
    net.heal(victim).unwrap();
    let healed_at = Instant::now();
    c.wait_osds(
        "host c's OSDs up after the heal",
        Duration::from_secs(60),
        |s| s.values().all(|(up, _)| *up),
    );
    let clean_after = c.wait_clean(Duration::from_secs(60));
    eprintln!(
        "healed: active+clean {:.1} s later",
        healed_at
            .elapsed()
            .as_secs_f64()
            .max(clean_after.as_secs_f64())
    );
    let m = minor.acked_count();
    assert!(
        minor.wait_acked(m + 5, Duration::from_secs(30)),
        "minority-side writer did not recover after the heal: {:?}",
        minor.errors()
    );
    let major_acked = stop_and_verify(&c, major, "partition, majority writer");
    let minor_acked = stop_and_verify(&c, minor, "partition, minority writer");
    // Split brain: a write sent after the cut (plus one second for
    // writes already on the wire) and acknowledged before the heal.
    let margin = Duration::from_secs(1);
    let split: Vec<&Acked> = minor_acked
        .iter()
        .filter(|a| a.sent > cut_at + margin && a.acked < healed_at)
        .collect();
    assert!(
        split.is_empty(),
        "the minority side acknowledged {} writes during the partition: {:?}",
        split.len(),
        split.iter().take(5).map(|a| &a.name).collect::<Vec<_>>()
    );
    let during = major_acked
        .iter()
        .filter(|a| a.sent > cut_at && a.acked < healed_at)
        .count();
    eprintln!("during the partition: {during} majority writes acknowledged, 0 minority");
}

/// The raw write bandwidth of the disk under `dir` (bytes/s): fio,
/// sequential 4 MiB direct writes of 1 GiB with a final fsync.
fn fio_write_bandwidth(dir: &std::path::Path) -> Result<f64, String> {
    let file = dir.join("fio.dat");
    let out = std::process::Command::new("fio")
        .args([
            "--name=raw-write",
            "--rw=write",
            "--bs=4M",
            "--size=1G",
            "--direct=1",
            "--ioengine=libaio",
            "--iodepth=8",
            "--end_fsync=1",
            "--output-format=json",
        ])
        .arg(format!("--filename={}", file.display()))
        .output()
        .map_err(|e| format!("running fio: {e}"))?;
    let _ = std::fs::remove_file(&file);
    if !out.status.success() {
        return Err(format!(
            "fio failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("fio output: {e}"))?;
    v["jobs"][0]["write"]["bw_bytes"]
        .as_f64()
        .ok_or_else(|| "fio output has no write bandwidth".to_string())
}

/// Bytes of the PGs in `pgs` (`pg dump`).
fn pg_bytes(c: &Hosts, pgs: &BTreeSet<String>) -> u64 {
    c.pg_dump()
        .iter()
        .filter(|p| p["pgid"].as_str().is_some_and(|id| pgs.contains(id)))
        .filter_map(|p| p["num_bytes"].as_u64())
        .sum()
}

const MB: f64 = 1e6;

fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// The copy phase of a recovery: the copy episodes the OSDs logged
/// (`recovery copy: osd.N moved B bytes (n objects) in T s, from S to E
/// ms`, one line per OSD per burst of copying, written once it has been
/// idle 1 s) that began at or after `since_ms`, summed: (bytes, seconds
/// from the first copy sent to the last one durable on any OSD).
fn copy_phase(c: &Hosts, since_ms: u128) -> Option<(u64, f64)> {
    let (mut bytes, mut first, mut last) = (0u64, u128::MAX, 0u128);
    for h in &c.hosts {
        let text = std::fs::read_to_string(h.dir.join("daemon.log")).unwrap_or_default();
        for line in text.lines() {
            let Some(rest) = line.split("recovery copy: ").nth(1) else {
                continue;
            };
            let w: Vec<&str> = rest.split_whitespace().collect();
            let Some(at) = w.iter().position(|x| *x == "from") else {
                continue;
            };
            let num = |i: usize| w.get(i).and_then(|x| x.parse::<u128>().ok());
            let (Some(b), Some(start), Some(end)) = (num(2), num(at + 1), num(at + 3)) else {
                continue;
            };
            if start < since_ms {
                continue;
            }
            bytes += b as u64;
            first = first.min(start);
            last = last.max(end);
        }
    }
    (bytes > 0).then(|| (bytes, (last.saturating_sub(first)) as f64 / 1000.0))
}

/// Prints a copy phase's figures (after the OSDs had time to log it).
fn report_copy_phase(c: &Hosts, what: &str, since_ms: u128, raw: f64) {
    std::thread::sleep(Duration::from_secs(2));
    match copy_phase(c, since_ms) {
        Some((bytes, secs)) => println!(
            "{what} copy phase: {:.0} MB in {secs:.2} s from the first copy sent to the last durable = {:.1} MB/s = {:.2}x raw (load {})",
            bytes as f64 / MB,
            bytes as f64 / MB / secs.max(1e-3),
            bytes as f64 / secs.max(1e-3) / raw,
            load_average()
        ),
        None => println!("{what} copy phase: no copy logged"),
    }
}

/// The 1-minute load average (the machine is shared: say it with a figure).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// Recovery figures for bench/README.md (`bench/recovery.sh` runs it in a
/// release build): time from kill -9 of a host to every PG active again
/// (three runs), log-based recovery throughput after an outage with 4 MiB
/// writes meanwhile, and backfill throughput after an OSD is lost and
/// marked out, against fio's sequential write bandwidth of the same disk
/// in the same run. Throttles lifted (`osd_max_backfills`,
/// `osd_recovery_max_active` 64, `osd_recovery_sleep` 0).
#[test]
#[ignore = "benchmark: bench/recovery.sh"]
fn recovery_figures() {
    let c = Hosts::start(
        &Opts {
            disk_size: "2G".into(),
            ..Opts::default()
        }
        .set("osd", "osd_max_backfills", "64")
        .set("osd", "osd_recovery_max_active", "64")
        .set("osd", "osd_recovery_sleep", "0")
        .set("mon", "mon_osd_down_out_interval", "1"),
    );
    let raw = fio_write_bandwidth(c.tmp.path()).unwrap_or_else(|e| panic!("{e}"));
    println!(
        "raw disk: {:.0} MB/s sequential 4 MiB direct writes (fio)",
        raw / MB
    );
    let victim = 2;
    let osds = c.host_osds(victim);

    // 1. kill -9 of a host -> every PG active again (grace 3 s).
    for run in 1..=3 {
        let w = c.writer(&format!("t{run}-"), 4);
        assert!(w.wait_acked(10, Duration::from_secs(30)));
        c.kill9(victim);
        let t0 = Instant::now();
        let down = c.wait_osds("down", Duration::from_secs(30), |s| {
            osds.iter().all(|o| s.get(o).is_some_and(|(up, _)| !up))
        });
        let active = t0.elapsed() + wait_active(&c, "after kill", Duration::from_secs(30));
        println!(
            "run {run}: kill -9 of host c -> its OSDs down after {:.2} s, every PG active after {:.2} s (grace 3 s, target <= 5 s)",
            down.as_secs_f64(),
            active.as_secs_f64()
        );
        assert!(c.start_host(victim).ok);
        c.wait_clean(Duration::from_secs(120));
        stop_and_verify(&c, w, "timing run");
    }

    // 2. Log-based recovery: 4 MiB writes while host c is down.
    c.kill9(victim);
    c.wait_osds("down", Duration::from_secs(30), |s| {
        osds.iter().all(|o| s.get(o).is_some_and(|(up, _)| !up))
    });
    wait_active(&c, "after kill", Duration::from_secs(30));
    let w = Writer::start(WriterOpts {
        object_bytes: Some(4 << 20),
        ..c.writer_opts("log-", 8)
    });
    w.wait_acked(60, Duration::from_secs(120));
    let (acked, _) = w.stop();
    let bytes = acked.len() as f64 * (4 << 20) as f64;
    let (log0, _) = recovery_totals(&c);
    let since = unix_ms();
    assert!(c.start_host(victim).ok);
    let t0 = Instant::now();
    c.wait_clean(Duration::from_secs(300));
    let took = t0.elapsed().as_secs_f64();
    let (log1, backfill1) = recovery_totals(&c);
    println!(
        "log recovery: {} objects ({:.0} MB) to host c's 2 OSDs in {took:.1} s from restart to active+clean: {:.1} MB/s = {:.2}x raw ({} by log, {backfill1} by backfill in total)",
        acked.len(),
        bytes / MB,
        bytes / MB / took,
        bytes / took / raw,
        log1 - log0
    );
    report_copy_phase(&c, "log recovery", since, raw);
    c.verify(&acked).unwrap();

    // 3. Backfill: one OSD lost and marked out; its PGs move to the other
    // OSD of its host.
    let lost = osds[1];
    let moved: BTreeSet<String> = up_sets(&c)
        .into_iter()
        .filter(|(_, up)| up.contains(&(lost as i64)))
        .map(|(pg, _)| pg)
        .collect();
    let moved_bytes = pg_bytes(&c, &moved) as f64;
    let since = unix_ms();
    c.take_osd_away(lost);
    c.wait_osds("out", Duration::from_secs(60), |s| {
        s.get(&lost) == Some(&(false, false))
    });
    let t0 = Instant::now();
    c.wait_clean(Duration::from_secs(300));
    let took = t0.elapsed().as_secs_f64();
    println!(
        "backfill: {} PGs ({:.0} MB) onto osd.{} in {took:.1} s from out to active+clean: {:.1} MB/s = {:.2}x raw",
        moved.len(),
        moved_bytes / MB,
        osds[0],
        moved_bytes / MB / took,
        moved_bytes / took / raw
    );
    report_copy_phase(&c, "lost-OSD copy", since, raw);
    c.verify(&acked).unwrap();
}
