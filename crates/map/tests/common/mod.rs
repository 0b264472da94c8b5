//! Helpers shared by the cluster-map integration tests: a fresh cluster,
//! OSD registration, and running a command line as the CLI would.
#![allow(dead_code)]

use cairn_map::*;
use cairn_types::EntityName;

pub fn admin() -> EntityName {
    EntityName::client("admin")
}

pub fn actx_as(caller: EntityName, seed: u8) -> ApplyContext {
    ApplyContext {
        caller,
        generated_secret: Some([seed; 32]),
    }
}

pub fn actx() -> ApplyContext {
    actx_as(admin(), 7)
}

pub fn qctx_as(caller: EntityName) -> QueryContext {
    QueryContext {
        caller,
        runtime: RuntimeStatus {
            health: HealthInputs {
                quorum: vec!["a".into()],
                ..Default::default()
            },
            leader: Some("a".into()),
            quorum_age_secs: 7200,
        },
    }
}

pub fn qctx() -> QueryContext {
    qctx_as(admin())
}

pub fn new_map() -> ClusterMap {
    ClusterMap::new_cluster(
        "5afc28eb-61b3-45f1-b441-6f913fd70505",
        MonInfo {
            name: "a".into(),
            addr: "127.0.0.1:6789".into(),
            rank: 0,
        },
        AuthEntity::new(
            &[1; 32],
            &[("mon", "allow *"), ("osd", "allow *"), ("mgr", "allow *")],
        ),
    )
}

pub fn words(line: &str) -> Vec<String> {
    // Single-quoted groups stay one word, like a shell would pass them.
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in line.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                any = true;
            }
            ' ' if !quoted => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(cur);
    }
    out
}

/// Parses and runs a command line as client.admin.
pub fn run(map: &mut ClusterMap, line: &str) -> Result<Reply, String> {
    run_as(map, line, admin())
}

pub fn run_as(map: &mut ClusterMap, line: &str, caller: EntityName) -> Result<Reply, String> {
    let cmd = parse_command(&words(line)).map_err(|e| format!("parse: {e}"))?;
    exec_as(map, &cmd, caller)
}

pub fn exec_as(
    map: &mut ClusterMap,
    cmd: &MonCommand,
    caller: EntityName,
) -> Result<Reply, String> {
    if cmd.is_mutation() {
        map.apply(cmd, &actx_as(caller, 7))
            .map_err(|e| e.to_string())
    } else {
        map.query(cmd, &qctx_as(caller)).map_err(|e| e.to_string())
    }
}

/// Runs a line that must succeed; returns the plain output.
pub fn ok(map: &mut ClusterMap, line: &str) -> String {
    match run(map, line) {
        Ok(r) => r.plain,
        Err(e) => panic!("'{line}' failed: {e}"),
    }
}

/// Runs a line that must fail without changing the map; returns the error.
pub fn fails(map: &mut ClusterMap, line: &str) -> String {
    let before = map.clone();
    match run(map, line) {
        Ok(r) => panic!("'{line}' should fail but printed: {}", r.plain),
        Err(e) => {
            assert_eq!(*map, before, "failed command '{line}' changed the map");
            e
        }
    }
}

/// Registers and boots an OSD on `host`; returns its id.
pub fn add_osd(map: &mut ClusterMap, host: &str, class: Option<&str>) -> i32 {
    let n = map.epoch.0;
    let uuid = format!("00000000-0000-0000-0000-{n:012x}");
    let r = map
        .apply(
            &MonCommand::OsdNew {
                uuid: uuid.clone(),
                id: None,
                host: host.into(),
                weight: 1.0,
                class: class.map(str::to_string),
            },
            &actx(),
        )
        .expect("osd new");
    let id = r.json["osdid"].as_i64().expect("osdid") as i32;
    map.apply(
        &MonCommand::OsdBoot {
            id,
            uuid,
            addrs: vec![format!("127.0.0.1:{}", 6800 + id)],
            reported: OsdReported {
                total_bytes: 1 << 40,
                used_bytes: 1 << 30,
                state: "active".into(),
                boot_id: 1,
            },
        },
        &actx(),
    )
    .expect("osd boot");
    id
}

/// A cluster with `hosts` hosts of `per_host` hdd OSDs each, all up and in.
pub fn cluster(hosts: usize, per_host: usize) -> ClusterMap {
    let mut map = new_map();
    for h in 0..hosts {
        for _ in 0..per_host {
            add_osd(&mut map, &format!("node{h}"), Some("hdd"));
        }
    }
    map
}
