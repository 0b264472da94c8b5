//! `docs/commands.md` is generated from `command_help()` and the config
//! option table; this test fails when they drift apart. Regenerate with
//! `CAIRN_REGEN_DOCS=1 cargo test -p cairn-map --test docs`.

use cairn_map::config::{OptKind, CONFIG_OPTIONS};
use cairn_map::*;
use std::fmt::Write as _;

fn kind_text(k: &OptKind) -> String {
    match k {
        OptKind::Bool => "bool".into(),
        OptKind::Uint { min, max } => format!("integer {min}..={max}"),
        OptKind::Int { min, max } => format!("integer {min}..={max}"),
        OptKind::Float { min, max } => format!("number {min}..={max}"),
        OptKind::Size { min, max } => format!("bytes {min}..={max} (K/M/G/T suffixes)"),
        OptKind::Secs { min, max } => format!("seconds {min}..={max} (s/m/h/d suffixes)"),
        OptKind::Choice(c) => format!("one of {}", c.join(", ")),
        OptKind::ChoiceList(c) => format!("list of {} in order of preference", c.join(", ")),
        OptKind::Str => "text".into(),
    }
}

fn render() -> String {
    let mut s = String::new();
    s.push_str("# Cairn admin commands\n\n");
    s.push_str("<!-- Generated from cairn-map's command_help() and config table by\n");
    s.push_str("     `CAIRN_REGEN_DOCS=1 cargo test -p cairn-map --test docs`; do not edit by hand. -->\n\n");
    s.push_str(
        "Every command is `cairn <words>`, with Ceph's verbs. Each prints plain text shaped like \
Ceph's output; add `--format json` for the same facts as JSON. Errors name the cause and the \
next step, and exit non-zero.\n\n",
    );
    s.push_str(
        "Permissions: read commands need `mon 'allow r'`; commands that change the map need \
`mon 'allow rw'`; `auth ls`/`auth get` need `mon 'allow rx'`; creating, changing or deleting \
keys, `mon add`/`mon remove` and `osd purge` need `mon 'allow rwx'` (or `allow *`). Caps are \
written `allow r`, `allow rw`, `allow rwx`, `allow *`, and for OSDs `allow rw pool=NAME`; \
`profile …` caps are not supported yet.\n\n",
    );
    let mut group = "";
    for (usage, desc) in command_help() {
        let first = usage.split_whitespace().next().unwrap_or("");
        let g = match first {
            "status" | "health" | "quorum_status" => "Cluster",
            "mon" => "Monitors",
            "osd" if usage.starts_with("osd crush") || usage.contains("crushmap") => "CRUSH",
            "osd" if usage.starts_with("osd erasure-code-profile") => "Erasure-code profiles",
            "osd" if usage.starts_with("osd pool") => "Pools",
            "osd" => "OSDs",
            "auth" => "Auth",
            "pg" | "rados" => "Pools",
            _ => "Config",
        };
        if g != group {
            let _ = write!(s, "\n## {g}\n\n");
            group = g;
        }
        let _ = writeln!(s, "- `cairn {usage}`  \n  {desc}");
    }
    s.push_str("\n## Central config options\n\n");
    s.push_str(
        "`cairn config set WHO KEY VALUE` checks these options' types and ranges; other keys \
are refused unless `--force` is given. Spaces and dashes in keys equal underscores.\n\n",
    );
    s.push_str("| option | type | default | meaning |\n|---|---|---|---|\n");
    let mut opts: Vec<_> = CONFIG_OPTIONS.iter().collect();
    opts.sort_by_key(|o| o.name);
    for o in opts {
        let _ = writeln!(
            s,
            "| `{}` | {} | `{}` | {} |",
            o.name,
            kind_text(&o.kind),
            o.default,
            o.description
        );
    }
    s.push_str("\n## Health checks\n\n");
    for (code, what) in [
        ("MON_DOWN", "a monitor in the map is not in quorum"),
        ("MON_CLOCK_SKEW", "a monitor's measured clock offset exceeds `mon_clock_drift_allowed` (reported only; Cairn does not depend on synchronised clocks)"),
        ("OSD_DOWN", "an OSD that is `in` is down"),
        ("OSD_HOST_DOWN", "every OSD of a host is down"),
        ("OSDMAP_FLAGS", "cluster flags such as `noout` are set"),
        ("POOL_NO_REDUNDANCY", "a replicated pool has size 1"),
        ("TOO_FEW_OSDS", "fewer OSDs than `osd_pool_default_size`"),
        ("AUTH_INSECURE", "a key file is readable by other users"),
        ("POOL_PLACEMENT_UNDERSIZED", "a pool's CRUSH rule cannot place `size` OSDs in distinct failure domains on the current map (WARN)"),
        ("POOL_PLACEMENT_INACTIVE", "… cannot even place `min_size` OSDs, so I/O to those PGs blocks (ERR)"),
    ] {
        let _ = writeln!(s, "- `{code}`: {what}");
    }
    s
}

#[test]
fn commands_md_matches_command_help() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/commands.md");
    let want = render();
    if std::env::var("CAIRN_REGEN_DOCS").as_deref() == Ok("1") {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/commands.md is out of date with command_help(); regenerate it with \
         CAIRN_REGEN_DOCS=1 cargo test -p cairn-map --test docs"
    );
}

#[test]
fn every_help_usage_parses() {
    // Each usage, with placeholders filled in, must parse.
    for (usage, _) in command_help() {
        let line = usage
            .replace("CLIENT [--expire SECONDS]", "client.x/1f --expire 60")
            .replace("CLIENT", "client.x/1f")
            .replace("[detail]", "detail")
            .replace("PGID", "1.1f")
            .replace("FLAG", "noout")
            .replace("NAME ADDR", "b 127.0.0.2:6789")
            .replace("ID...", "1 2")
            .replace("osd.N...|all", "osd.1")
            .replace("[CLASS] ", "")
            .replace("osd.N WEIGHT", "osd.1 1.5")
            .replace("ID WEIGHT", "1 0.5")
            .replace("RATIO", "0.9")
            .replace("ID --yes", "1 --yes")
            .replace("ID|all", "1")
            .replace("-o FILE", "-o f")
            .replace(
                "[PG_NUM [PGP_NUM]] [replicated|erasure] [PROFILE] [RULE]",
                "8 8 erasure default",
            )
            .replace("NAME NAME --yes", "p p --yes")
            .replace("KEY VALUE [--yes-i-really-mean-it]", "size 3")
            .replace("max_bytes|max_objects VALUE", "max_bytes 1G")
            .replace("KEY|all", "all")
            .replace("[detail]", "")
            .replace("[pgs_brief]", "pgs_brief")
            .replace("[tree]", "tree")
            .replace("POOL APP", "p rbd")
            .replace("[SERVICE CAPS]...", "mon allow")
            .replace("WHO KEY VALUE [--force]", "osd osd_max_backfills 2")
            .replace("WHO [KEY]", "osd")
            .replace("WHO KEY", "osd osd_max_backfills")
            .replace(
                "TYPE.*|TYPE.ID config set KEY VALUE",
                "mon.* config set mon_allow_pool_delete true",
            )
            .replace("ROOT FAILURE_DOMAIN [CLASS]", "default host")
            .replace("[PROFILE]", "default")
            .replace("[NAME]", "")
            .replace(" NAME", " x")
            .replace(" CLASS", " ssd");
        let line = if line.starts_with("osd erasure-code-profile set") {
            "osd erasure-code-profile set x k=2 m=1".to_string()
        } else if line.starts_with("auth ") {
            line.replacen(" x", " client.x", 1)
        } else {
            line
        };
        let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        let input: &[u8] = b"x";
        parse_command_with_input(&words, Some(input))
            .unwrap_or_else(|e| panic!("usage '{usage}' as '{line}' does not parse: {e}"));
    }
}
