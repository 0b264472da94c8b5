//! Admin commands through the real CLI against a one-mon cluster: good
//! arguments succeed with Ceph-shaped output, bad ones fail with a reason
//! (usage errors before any network traffic).

mod common;
use common::*;
use std::process::Command;

#[test]
fn usage_errors_need_no_cluster() {
    // No conf anywhere: parsing happens first, so the usage error wins.
    // HOME and XDG_DATA_HOME point into the temp dir too: a dev cluster
    // left in the default place on the test machine would be found.
    let tmp = tempfile::tempdir().unwrap();
    for args in [
        &["osd", "pool", "create"][..],
        &["osd", "set", "nosuchflag"][..],
        &["osd", "pool", "set", "rbd", "size"][..],
        &["mon", "frobnicate"][..],
    ] {
        let mut cmd = Command::new(CAIRN);
        cmd.args(args)
            .current_dir(tmp.path())
            .env("HOME", tmp.path())
            .env("XDG_DATA_HOME", tmp.path())
            .env_remove("CAIRN_CONF");
        let r = run_cmd(cmd);
        assert!(!r.ok, "{args:?}: {r:?}");
        assert!(
            !r.stderr.contains("cairn.conf"),
            "{args:?} should fail on usage: {r:?}"
        );
        assert!(r.elapsed.as_secs() < 2);
    }
    // A valid command without any conf says where it looked.
    let mut cmd = Command::new(CAIRN);
    cmd.args(["status"])
        .current_dir(tmp.path())
        .env("HOME", tmp.path())
        .env("XDG_DATA_HOME", tmp.path())
        .env_remove("CAIRN_CONF");
    let r = run_cmd(cmd);
    assert!(!r.ok && r.stderr.contains("no cairn.conf found"), "{r:?}");
}

#[test]
fn commands_with_good_and_bad_arguments() {
    let c = Cluster::bootstrap();
    // (args, should succeed, text expected in stdout (ok) or stderr (error))
    let cases: &[(&[&str], bool, &str)] = &[
        (&["status"], true, "cluster:"),
        (&["-s"], true, "services:"),
        (&["health"], true, "HEALTH_"),
        (&["health", "detail"], true, "TOO_FEW_OSDS"),
        (&["quorum_status"], true, "quorum_leader_name"),
        (&["mon", "stat"], true, "1 mons"),
        (&["mon", "dump"], true, "mon.a"),
        (&["osd", "tree"], true, "default"),
        (&["osd", "ls"], true, ""),
        (&["osd", "stat"], true, "0 osds"),
        (&["osd", "dump"], true, "epoch"),
        (&["osd", "set", "noout"], true, "noout is set"),
        (&["health"], true, "noout"),
        (&["osd", "unset", "noout"], true, "noout is unset"),
        (&["osd", "set", "bogus"], false, "unknown flag"),
        (
            &[
                "osd",
                "erasure-code-profile",
                "set",
                "ec42",
                "k=4",
                "m=2",
                "crush-failure-domain=osd",
            ],
            true,
            "",
        ),
        (&["osd", "erasure-code-profile", "ls"], true, "ec42"),
        (&["osd", "erasure-code-profile", "get", "ec42"], true, "k=4"),
        (
            &["osd", "erasure-code-profile", "set", "bad", "k=30", "m=3"],
            false,
            "32",
        ),
        (
            &[
                "osd",
                "erasure-code-profile",
                "set",
                "bad",
                "k=2",
                "m=1",
                "colour=red",
            ],
            false,
            "colour",
        ),
        (
            &[
                "osd",
                "crush",
                "rule",
                "create-replicated",
                "fast",
                "default",
                "host",
            ],
            true,
            "",
        ),
        (&["osd", "crush", "rule", "ls"], true, "fast"),
        (&["osd", "crush", "rule", "dump", "fast"], true, "fast"),
        (
            &[
                "osd",
                "crush",
                "rule",
                "create-replicated",
                "bad",
                "nosuchroot",
                "host",
            ],
            false,
            "nosuchroot",
        ),
        (
            &["osd", "crush", "rule", "create-erasure", "ecrule", "ec42"],
            true,
            "",
        ),
        (&["osd", "crush", "rule", "rm", "fast"], true, ""),
        (&["osd", "pool", "create", "rbd", "16"], true, "created"),
        (
            &[
                "osd", "pool", "create", "ecpool", "8", "8", "erasure", "ec42",
            ],
            true,
            "created",
        ),
        (&["osd", "pool", "create", "rbd", "16"], true, "exists"),
        (&["osd", "pool", "create", "bad", "notanumber"], false, ""),
        (&["osd", "pool", "set", "rbd", "size", "2"], true, ""),
        (&["osd", "pool", "get", "rbd", "size"], true, "size: 2"),
        (&["osd", "pool", "set", "rbd", "size", "0"], false, "size"),
        (
            &["osd", "pool", "set", "rbd", "nosuchkey", "1"],
            false,
            "nosuchkey",
        ),
        (
            &["osd", "pool", "set", "nopool", "size", "2"],
            false,
            "nopool",
        ),
        (
            &["osd", "pool", "application", "enable", "rbd", "rbd"],
            true,
            "",
        ),
        (
            &["osd", "pool", "ls", "detail"],
            true,
            "'rbd' replicated size 2",
        ),
        (
            &[
                "osd",
                "pool",
                "delete",
                "rbd",
                "rbd",
                "--yes-i-really-really-mean-it",
            ],
            false,
            "mon_allow_pool_delete",
        ),
        (
            &["config", "set", "mon", "mon_allow_pool_delete", "true"],
            true,
            "",
        ),
        (
            &["config", "get", "mon", "mon_allow_pool_delete"],
            true,
            "true",
        ),
        (&["config", "dump"], true, "mon_allow_pool_delete"),
        (
            &["config", "set", "global", "no_such_option_xyz", "1"],
            false,
            "no_such_option_xyz",
        ),
        (
            &[
                "osd",
                "pool",
                "delete",
                "rbd",
                "rbd",
                "--yes-i-really-really-mean-it",
            ],
            true,
            "",
        ),
        (
            &[
                "osd",
                "pool",
                "delete",
                "ecpool",
                "other",
                "--yes-i-really-really-mean-it",
            ],
            false,
            "",
        ),
        (&["config", "rm", "mon", "mon_allow_pool_delete"], true, ""),
        (
            &[
                "tell",
                "mon.*",
                "config",
                "set",
                "mon_clock_drift_allowed",
                "0.5",
            ],
            true,
            "",
        ),
        (
            &["config", "get", "mon", "mon_clock_drift_allowed"],
            true,
            "0.5",
        ),
        (&["auth", "ls"], true, "client.admin"),
        (&["auth", "get", "client.admin"], true, "[client.admin]"),
        (
            &["auth", "get-or-create", "client.x", "mon", "allow r"],
            true,
            "[client.x]",
        ),
        (&["auth", "caps", "client.x", "mon", "allow rw"], true, ""),
        (&["auth", "get", "client.x"], true, "allow rw"),
        (&["auth", "caps", "client.x", "mon", "allow zz"], false, ""),
        (&["auth", "del", "client.x"], true, ""),
        (&["auth", "get", "client.x"], false, "client.x"),
        (
            &["osd", "crush", "set-device-class", "ssd", "osd.99"],
            false,
            "99",
        ),
        (&["osd", "reweight", "99", "0.5"], false, "99"),
        (
            &["mon", "add", "z", "127.0.0.1:1"],
            false,
            "cannot reach mon.z",
        ),
        (
            &["mon", "add", "bad name", "127.0.0.1:1"],
            false,
            "invalid monitor name",
        ),
        (&["mon", "remove", "nosuchmon"], false, "nosuchmon"),
        (&["mon", "remove", "a"], false, "last monitor"),
    ];
    let mut failures = Vec::new();
    for (args, good, want) in cases {
        let r = c.cairn(args);
        let text = if *good { &r.stdout } else { &r.stderr };
        if r.ok != *good || !text.contains(want) {
            failures.push(format!(
                "cairn {}: expected ok={good} with '{want}': {r:?}",
                args.join(" ")
            ));
        }
    }
    // JSON everywhere.
    for args in [
        &["status"][..],
        &["osd", "pool", "ls"][..],
        &["health"][..],
        &["osd", "tree"][..],
    ] {
        let mut a = args.to_vec();
        a.extend(["--format", "json"]);
        let out = c.ok(&a);
        if serde_json::from_str::<serde_json::Value>(&out).is_err() {
            failures.push(format!("cairn {a:?}: not JSON: {out}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn crush_map_files_round_trip() {
    let c = Cluster::bootstrap();
    let f = c.tmp.path().join("crush.bin");
    let r = c.cairn(&["osd", "getcrushmap", "-o", f.to_str().unwrap()]);
    assert!(r.ok, "{r:?}");
    assert!(r.stderr.contains("got crush map"), "{r:?}");
    let bytes = std::fs::read(&f).unwrap();
    assert!(!bytes.is_empty());
    let before = c.epoch();
    let r = c.cairn(&["osd", "setcrushmap", "-i", f.to_str().unwrap()]);
    assert!(r.ok, "{r:?}");
    assert!(c.epoch() >= before);
    let garbage = c.tmp.path().join("garbage.bin");
    std::fs::write(&garbage, b"not a crush map").unwrap();
    let r = c.cairn(&["osd", "setcrushmap", "-i", garbage.to_str().unwrap()]);
    assert!(!r.ok, "{r:?}");
    let r = c.cairn(&["osd", "setcrushmap", "-i", "/nonexistent/file"]);
    assert!(!r.ok && r.stderr.contains("/nonexistent/file"), "{r:?}");
}
