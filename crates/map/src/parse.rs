//! The command grammar: Ceph's admin verbs, from the words after `cairn` to
//! a `MonCommand`. Only syntax is checked here (numbers are numbers, flags
//! are known); whether the command makes sense for the map is `apply`'s job.
//! File arguments (`-o F`, `-i F`) are read and written by the CLI.

use crate::command::{MonCommand, OsdSelector};
use crate::error::ParseError;
use crate::model::{OsdFlag, PoolKind};
use cairn_types::EntityName;

/// Usage and description of every admin command, in documentation order.
const HELP: &[(&str, &str)] = &[
    ("status", "show the cluster's health, services and data summary (also: -s)"),
    ("health [detail]", "show HEALTH_OK/WARN/ERR and, with detail, every check's detail"),
    ("quorum_status", "show the monitor quorum and leader"),
    ("mon stat", "summarise the monitors"),
    ("mon dump", "list the monitors with their ranks and addresses"),
    ("mon add NAME ADDR", "add monitor NAME listening on ADDR (ip:port) to the map"),
    ("mon remove NAME", "remove monitor NAME from the map"),
    ("osd tree", "show the CRUSH hierarchy with OSD status and weights"),
    ("osd dump", "show the OSD map: flags, pools and every OSD"),
    ("osd ls", "list OSD ids"),
    ("osd stat", "summarise OSD up/in counts"),
    ("osd set FLAG", "set a cluster flag: noout, noin, noup, nodown, nobackfill, norecover, norebalance, noscrub, nodeep-scrub, pause"),
    ("osd unset FLAG", "clear a cluster flag"),
    ("osd down ID...", "mark OSDs down (they are marked up again when they boot)"),
    ("osd out ID...", "mark OSDs out: their data moves elsewhere"),
    ("osd in ID...", "mark OSDs in: they take data again"),
    ("osd purge ID --yes-i-really-mean-it", "remove a down OSD from the OSD map, CRUSH and auth"),
    ("osd lost ID --yes-i-really-mean-it", "give up the writes only a down OSD may hold, so its PGs stop waiting for it"),
    ("osd reweight ID WEIGHT", "set an OSD's override weight between 0.0 and 1.0"),
    ("osd set-nearfull-ratio RATIO", "usage above which an OSD is marked nearfull (OSD_NEARFULL; default 0.85)"),
    ("osd set-backfillfull-ratio RATIO", "usage above which an OSD is marked backfillfull: no backfill onto it (OSD_BACKFILLFULL; default 0.90)"),
    ("osd set-full-ratio RATIO", "usage above which an OSD is marked full: writes to its PGs are refused (OSD_FULL; default 0.95, at most 0.97)"),
    ("osd blocklist add CLIENT [--expire SECONDS]", "refuse every op of client instance CLIENT (client.NAME/NONCE, as 'cairn rbd lock ls' shows it) on every OSD, for SECONDS (default mon_osd_blocklist_default_expire, 1 h) counted by the monitor leader"),
    ("osd blocklist ls", "list blocklisted client instances"),
    ("osd blocklist rm CLIENT", "let a blocklisted client instance send ops again"),
    ("osd scrub ID|all", "scrub every PG whose primary is osd.ID (or any up OSD)"),
    ("osd deep-scrub ID|all", "deep-scrub every PG whose primary is osd.ID (or any up OSD)"),
    ("osd repair ID|all", "repair every PG whose primary is osd.ID (or any up OSD)"),
    ("osd crush rule create-replicated NAME ROOT FAILURE_DOMAIN [CLASS]", "create a replicated rule placing one copy per FAILURE_DOMAIN under ROOT"),
    ("osd crush rule create-erasure NAME [PROFILE]", "create an erasure rule from an EC profile (default: 'default')"),
    ("osd crush rule ls", "list CRUSH rules"),
    ("osd crush rule dump [NAME]", "show CRUSH rules and their steps"),
    ("osd crush rule rm NAME", "remove a CRUSH rule no pool uses"),
    ("osd crush set-device-class CLASS osd.N...|all", "set the device class of OSDs"),
    ("osd crush rm-device-class [CLASS] osd.N...|all", "remove the device class of OSDs"),
    ("osd crush reweight osd.N WEIGHT", "set an OSD's CRUSH weight in TiB"),
    ("osd getcrushmap -o FILE", "write the compiled CRUSH map to FILE"),
    ("osd setcrushmap -i FILE", "replace the CRUSH map with the compiled (or text) map in FILE"),
    ("osd erasure-code-profile set NAME [k=K] [m=M] [crush-failure-domain=T] [crush-device-class=C] [crush-root=R] [stripe_unit=S] [plugin=P] [technique=T] [--force]", "create an erasure-code profile"),
    ("osd erasure-code-profile ls", "list erasure-code profiles"),
    ("osd erasure-code-profile get NAME", "show an erasure-code profile"),
    ("osd erasure-code-profile rm NAME", "remove an erasure-code profile no pool uses"),
    ("osd pool create NAME [PG_NUM [PGP_NUM]] [replicated|erasure] [PROFILE] [RULE]", "create a pool (EC pools: PROFILE then RULE; replicated pools: RULE)"),
    ("osd pool set NAME KEY VALUE [--yes-i-really-mean-it]", "set size, min_size, pg_num, pgp_num, crush_rule, allow_ec_overwrites, bulk, target_size_ratio, quota_max_bytes or quota_max_objects"),
    ("osd pool set-quota NAME max_bytes|max_objects VALUE", "set a pool quota (0 = none)"),
    ("osd pool get NAME KEY|all", "show one or all settings of a pool"),
    ("osd pool ls [detail]", "list pools, with detail one Ceph-style line each"),
    ("osd pool application enable POOL APP", "tag a pool with the application using it (rbd, cephfs, rgw)"),
    ("osd pool delete NAME NAME --yes-i-really-really-mean-it", "delete a pool and all its data (needs mon_allow_pool_delete=true)"),
    ("pg map PGID", "show the up and acting OSDs of a PG such as 1.1f"),
    ("pg stat", "summarise PG states, objects and usage (from the OSDs' reports)"),
    ("pg dump [pgs_brief]", "list every PG with its state, version and OSDs (pgs_brief: state and OSDs only)"),
    ("pg ls", "same as 'pg dump pgs_brief'"),
    ("pg PGID query", "show a PG's placement and what its primary last reported"),
    ("pg scrub PGID", "have the PG's primary compare object lists and metadata across its copies now"),
    ("pg deep-scrub PGID", "like scrub, and also read every byte of every copy and compare data checksums"),
    ("pg repair PGID", "deep-scrub the PG and rewrite every bad copy from a good one"),
    ("rados list-inconsistent-obj PGID", "list the objects the PG's last scrub found inconsistent, with the OSDs holding bad copies"),
    ("osd df [tree]", "show each OSD's size, use and PG count (tree: grouped by host)"),
    ("auth ls", "list entities, their keys and caps"),
    ("auth get NAME", "show an entity's keyring"),
    ("auth print-key NAME", "print only an entity's key"),
    ("auth get-or-create NAME [SERVICE CAPS]...", "return an entity's keyring, creating it with these caps if missing"),
    ("auth caps NAME [SERVICE CAPS]...", "replace an entity's caps"),
    ("auth del NAME", "delete an entity"),
    ("config set WHO KEY VALUE [--force]", "set central config for WHO (global, mon, osd, mds, mgr, client or osd.N); --force stores an unknown key"),
    ("config get WHO [KEY]", "show the config WHO sees (one key, or every key set)"),
    ("config dump", "show every central config setting"),
    ("config rm WHO KEY", "remove a central config setting"),
    ("tell TYPE.*|TYPE.ID config set KEY VALUE", "set config for daemons of TYPE (same as config set TYPE KEY VALUE; persisted)"),
];

/// `(usage, description)` of every admin command, for `cairn help` and docs.
pub fn command_help() -> Vec<(&'static str, &'static str)> {
    HELP.to_vec()
}

fn usage_err(prefix: &str, why: &str) -> ParseError {
    let usages: Vec<String> = HELP
        .iter()
        .filter(|(u, _)| u.starts_with(prefix))
        .map(|(u, _)| format!("  cairn {u}"))
        .collect();
    if usages.is_empty() || prefix.is_empty() {
        ParseError::new(format!("{why}; run 'cairn help' for the list of commands"))
    } else {
        ParseError::new(format!("{why}\nusage:\n{}", usages.join("\n")))
    }
}

/// Parses `3` or `osd.3`.
pub fn parse_osd_id(word: &str) -> Result<i32, String> {
    let digits = word.strip_prefix("osd.").unwrap_or(word);
    digits
        .parse::<i32>()
        .ok()
        .filter(|n| *n >= 0)
        .ok_or_else(|| format!("'{word}' is not an OSD id (expected N or osd.N)"))
}

fn parse_weight(word: &str) -> Result<f64, String> {
    word.parse::<f64>()
        .ok()
        .filter(|w| w.is_finite())
        .ok_or_else(|| format!("'{word}' is not a weight (expected a number such as 1.0)"))
}

fn parse_entity(word: &str) -> Result<EntityName, String> {
    word.parse::<EntityName>()
}

fn parse_ids(prefix: &str, words: &[&str]) -> Result<Vec<i32>, ParseError> {
    if words.is_empty() {
        return Err(usage_err(prefix, "no OSD ids given"));
    }
    words
        .iter()
        .map(|w| parse_osd_id(w).map_err(|e| usage_err(prefix, &e)))
        .collect()
}

fn parse_selector(prefix: &str, words: &[&str]) -> Result<OsdSelector, ParseError> {
    if matches!(words, ["all"] | ["any"] | ["*"]) {
        return Ok(OsdSelector::All);
    }
    parse_ids(prefix, words).map(OsdSelector::Ids)
}

fn parse_caps_pairs(prefix: &str, words: &[&str]) -> Result<Vec<(String, String)>, ParseError> {
    if !words.len().is_multiple_of(2) {
        return Err(usage_err(
            prefix,
            "caps come in pairs: SERVICE 'CAPS', e.g. mon 'allow r' osd 'allow rw pool=rbd'",
        ));
    }
    Ok(words
        .chunks(2)
        .map(|c| (c[0].to_string(), c[1].to_string()))
        .collect())
}

/// The path after `-i` (or `--in-file`), for commands that read a file.
pub fn input_file_arg(words: &[String]) -> Option<&str> {
    flag_value(words, &["-i", "--in-file"])
}

/// The path after `-o` (or `--out-file`), for commands that write a file.
pub fn output_file_arg(words: &[String]) -> Option<&str> {
    flag_value(words, &["-o", "--out-file"])
}

fn flag_value<'a>(words: &'a [String], names: &[&str]) -> Option<&'a str> {
    words
        .iter()
        .position(|w| names.contains(&w.as_str()))
        .and_then(|i| words.get(i + 1))
        .map(String::as_str)
}

/// Parses a command line (the words after `cairn`). `--format X` is
/// accepted and ignored (the caller picks plain or JSON from the reply).
/// `osd setcrushmap -i F` needs the file's bytes: use
/// [`parse_command_with_input`].
pub fn parse_command(words: &[String]) -> Result<MonCommand, ParseError> {
    parse_command_with_input(words, None)
}

/// Like [`parse_command`], with the contents of the `-i FILE` argument read
/// by the caller.
pub fn parse_command_with_input(
    words: &[String],
    input: Option<&[u8]>,
) -> Result<MonCommand, ParseError> {
    let mut w: Vec<&str> = Vec::with_capacity(words.len());
    let mut it = words.iter().map(String::as_str);
    while let Some(word) = it.next() {
        if word == "--format" {
            it.next();
        } else if !word.starts_with("--format=") {
            w.push(word);
        }
    }
    match w.first().copied() {
        None => Err(usage_err("", "no command given")),
        Some("status") | Some("-s") | Some("health") | Some("quorum_status") => parse_top(&w),
        Some("mon") => parse_mon(&w[1..]),
        Some("osd") => parse_osd(&w[1..], input),
        Some("auth") => parse_auth(&w[1..]),
        Some("config") => parse_config(&w[1..]),
        Some("tell") => parse_tell(&w[1..]),
        Some("pg") => match &w[1..] {
            ["map", pgid] => Ok(MonCommand::PgMap {
                pgid: pgid.parse().map_err(|e: String| usage_err("pg map", &e))?,
            }),
            ["stat"] => Ok(MonCommand::PgStat),
            ["dump"] => Ok(MonCommand::PgDump { brief: false }),
            ["dump", "pgs_brief"] | ["ls"] => Ok(MonCommand::PgDump { brief: true }),
            [pgid, "query"] => Ok(MonCommand::PgQuery {
                pgid: pgid
                    .parse()
                    .map_err(|e: String| usage_err("pg query", &e))?,
            }),
            [verb @ ("scrub" | "deep-scrub" | "repair"), pgid] => Ok(MonCommand::PgScrub {
                pgid: pgid
                    .parse()
                    .map_err(|e: String| usage_err(&format!("pg {verb}"), &e))?,
                kind: scrub_kind(verb),
            }),
            [verb @ ("scrub" | "deep-scrub" | "repair"), ..] => Err(usage_err(
                &format!("pg {verb}"),
                "give exactly one PG id, such as 1.1f",
            )),
            _ => Err(usage_err(
                "pg",
                "use 'pg map PGID', 'pg stat', 'pg dump [pgs_brief]', 'pg ls', 'pg PGID query' or 'pg scrub|deep-scrub|repair PGID'",
            )),
        },
        Some("rados") => match &w[1..] {
            ["list-inconsistent-obj", pgid] => Ok(MonCommand::PgListInconsistent {
                pgid: pgid
                    .parse()
                    .map_err(|e: String| usage_err("rados list-inconsistent-obj", &e))?,
            }),
            _ => Err(usage_err(
                "rados list-inconsistent-obj",
                "the monitors answer only 'rados list-inconsistent-obj PGID'",
            )),
        },
        Some(other) => Err(usage_err("", &format!("unknown command '{other}'"))),
    }
}

fn scrub_kind(verb: &str) -> crate::scrub::ScrubKind {
    match verb {
        "deep-scrub" => crate::scrub::ScrubKind::Deep,
        "repair" => crate::scrub::ScrubKind::Repair,
        _ => crate::scrub::ScrubKind::Scrub,
    }
}

fn parse_top(w: &[&str]) -> Result<MonCommand, ParseError> {
    match w {
        ["status"] | ["-s"] => Ok(MonCommand::Status),
        ["health"] => Ok(MonCommand::Health { detail: false }),
        ["health", "detail"] => Ok(MonCommand::Health { detail: true }),
        ["quorum_status"] => Ok(MonCommand::QuorumStatus),
        [first, ..] => Err(usage_err(first, "unexpected arguments")),
        [] => Err(usage_err("", "no command given")),
    }
}

fn parse_mon(w: &[&str]) -> Result<MonCommand, ParseError> {
    match w {
        ["stat"] => Ok(MonCommand::MonStat),
        ["dump"] => Ok(MonCommand::MonDump),
        ["add", name, addr] => Ok(MonCommand::MonAdd {
            name: name.to_string(),
            addr: addr.to_string(),
        }),
        ["remove" | "rm", name] => Ok(MonCommand::MonRemove {
            name: name.to_string(),
        }),
        [verb @ ("stat" | "dump" | "add" | "remove" | "rm"), ..] => {
            let v = if *verb == "rm" { "remove" } else { verb };
            Err(usage_err(&format!("mon {v}"), "wrong number of arguments"))
        }
        _ => Err(usage_err("mon", "unknown mon command")),
    }
}

fn parse_osd(w: &[&str], input: Option<&[u8]>) -> Result<MonCommand, ParseError> {
    match w {
        ["tree"] => Ok(MonCommand::OsdTree),
        ["dump"] => Ok(MonCommand::OsdDump),
        ["ls"] => Ok(MonCommand::OsdLs),
        ["stat"] => Ok(MonCommand::OsdStat),
        ["df"] => Ok(MonCommand::OsdDf { tree: false }),
        ["df", "tree"] => Ok(MonCommand::OsdDf { tree: true }),
        ["set" | "unset", flag] => {
            let flag: OsdFlag = flag.parse().map_err(|e: String| usage_err("osd set", &e))?;
            Ok(if w[0] == "set" {
                MonCommand::OsdSetFlag { flag }
            } else {
                MonCommand::OsdUnsetFlag { flag }
            })
        }
        ["down", ids @ ..] => Ok(MonCommand::OsdDown {
            ids: parse_ids("osd down", ids)?,
        }),
        ["out", ids @ ..] => Ok(MonCommand::OsdOut {
            ids: parse_ids("osd out", ids)?,
        }),
        ["in", ids @ ..] => Ok(MonCommand::OsdIn {
            ids: parse_ids("osd in", ids)?,
        }),
        ["purge", id, rest @ ..] => {
            let id = parse_osd_id(id).map_err(|e| usage_err("osd purge", &e))?;
            let sure = match rest {
                [] => false,
                ["--yes-i-really-mean-it"] => true,
                _ => return Err(usage_err("osd purge", "unexpected arguments")),
            };
            Ok(MonCommand::OsdPurge { id, sure })
        }
        ["lost", id, rest @ ..] => {
            let id = parse_osd_id(id).map_err(|e| usage_err("osd lost", &e))?;
            let sure = match rest {
                [] => false,
                ["--yes-i-really-mean-it"] => true,
                _ => return Err(usage_err("osd lost", "unexpected arguments")),
            };
            Ok(MonCommand::OsdLost { id, sure })
        }
        ["reweight", id, weight] => Ok(MonCommand::OsdReweight {
            osd: parse_osd_id(id).map_err(|e| usage_err("osd reweight", &e))?,
            weight: parse_weight(weight).map_err(|e| usage_err("osd reweight", &e))?,
        }),
        [verb @ ("set-nearfull-ratio" | "set-backfillfull-ratio" | "set-full-ratio"), ratio] => {
            let which = match *verb {
                "set-nearfull-ratio" => crate::fullness::FullRatioKind::Nearfull,
                "set-backfillfull-ratio" => crate::fullness::FullRatioKind::Backfillfull,
                _ => crate::fullness::FullRatioKind::Full,
            };
            let ratio: f64 = ratio.parse().map_err(|_| {
                usage_err(
                    &format!("osd {verb}"),
                    &format!("'{ratio}' is not a number (a ratio such as 0.95)"),
                )
            })?;
            Ok(MonCommand::OsdSetFullRatio { which, ratio })
        }
        ["getcrushmap"] | ["getcrushmap", "-o" | "--out-file", _] => Ok(MonCommand::GetCrushMap),
        ["setcrushmap", "-i" | "--in-file", path] => match input {
            Some(bytes) => Ok(MonCommand::SetCrushMap {
                encoded: bytes.to_vec(),
            }),
            None => Err(ParseError::new(format!(
                "osd setcrushmap: the contents of '{path}' were not supplied (the CLI reads -i FILE and passes its bytes)"
            ))),
        },
        [verb @ ("scrub" | "deep-scrub" | "repair"), who] => Ok(MonCommand::OsdScrub {
            osds: if *who == "all" || *who == "*" {
                OsdSelector::All
            } else {
                OsdSelector::Ids(vec![
                    parse_osd_id(who).map_err(|e| usage_err(&format!("osd {verb}"), &e))?
                ])
            },
            kind: scrub_kind(verb),
        }),
        ["blocklist" | "blacklist", rest @ ..] => parse_blocklist(rest),
        ["crush", rest @ ..] => parse_crush(rest),
        ["erasure-code-profile", rest @ ..] => parse_ec_profile(rest),
        ["pool", rest @ ..] => parse_pool(rest),
        [verb @ ("tree" | "dump" | "ls" | "stat" | "set" | "unset" | "purge" | "lost" | "reweight"
        | "getcrushmap" | "setcrushmap" | "scrub" | "deep-scrub" | "repair"
        | "set-nearfull-ratio" | "set-backfillfull-ratio" | "set-full-ratio"), ..] => Err(usage_err(
            &format!("osd {verb}"),
            "wrong number of arguments",
        )),
        _ => Err(usage_err("osd", "unknown osd command")),
    }
}

fn parse_blocklist(w: &[&str]) -> Result<MonCommand, ParseError> {
    let client = |prefix: &str, word: &str| {
        word.parse::<crate::blocklist::ClientInstance>()
            .map_err(|e| usage_err(prefix, &e))
    };
    match w {
        ["ls"] => Ok(MonCommand::OsdBlocklistLs),
        ["add", c] => Ok(MonCommand::OsdBlocklistAdd {
            client: client("osd blocklist add", c)?,
            expire_secs: None,
        }),
        ["add", c, "--expire", secs] | ["add", c, secs] => {
            let secs: u64 = secs.parse().map_err(|_| {
                usage_err(
                    "osd blocklist add",
                    &format!("'{secs}' is not a whole number of seconds"),
                )
            })?;
            Ok(MonCommand::OsdBlocklistAdd {
                client: client("osd blocklist add", c)?,
                expire_secs: Some(secs),
            })
        }
        ["rm", c] => Ok(MonCommand::OsdBlocklistRm {
            client: client("osd blocklist rm", c)?,
        }),
        [verb @ ("ls" | "add" | "rm"), ..] => Err(usage_err(
            &format!("osd blocklist {verb}"),
            "wrong number of arguments",
        )),
        _ => Err(usage_err("osd blocklist", "unknown osd blocklist command")),
    }
}

fn parse_crush(w: &[&str]) -> Result<MonCommand, ParseError> {
    let s = |x: &&str| x.to_string();
    match w {
        ["rule", "create-replicated", name, root, fd] => {
            Ok(MonCommand::CrushRuleCreateReplicated {
                name: s(name),
                root: s(root),
                failure_domain: s(fd),
                class: None,
            })
        }
        ["rule", "create-replicated", name, root, fd, class] => {
            Ok(MonCommand::CrushRuleCreateReplicated {
                name: s(name),
                root: s(root),
                failure_domain: s(fd),
                class: Some(s(class)),
            })
        }
        ["rule", "create-erasure", name] => Ok(MonCommand::CrushRuleCreateErasure {
            name: s(name),
            profile: "default".into(),
        }),
        ["rule", "create-erasure", name, profile] => Ok(MonCommand::CrushRuleCreateErasure {
            name: s(name),
            profile: s(profile),
        }),
        ["rule", "ls" | "list"] => Ok(MonCommand::CrushRuleLs),
        ["rule", "dump"] => Ok(MonCommand::CrushRuleDump { name: None }),
        ["rule", "dump", name] => Ok(MonCommand::CrushRuleDump {
            name: Some(s(name)),
        }),
        ["rule", "rm", name] => Ok(MonCommand::CrushRuleRm { name: s(name) }),
        ["rule", verb, ..] => Err(usage_err(
            &format!("osd crush rule {verb}"),
            "wrong arguments",
        )),
        ["set-device-class", class, ids @ ..] => Ok(MonCommand::CrushSetDeviceClass {
            class: s(class),
            osds: parse_selector("osd crush set-device-class", ids)?,
        }),
        ["rm-device-class", first, rest @ ..] => {
            let looks_like_osd =
                parse_osd_id(first).is_ok() || matches!(*first, "all" | "any" | "*");
            if looks_like_osd {
                let mut all = vec![*first];
                all.extend_from_slice(rest);
                Ok(MonCommand::CrushRmDeviceClass {
                    class: None,
                    osds: parse_selector("osd crush rm-device-class", &all)?,
                })
            } else {
                Ok(MonCommand::CrushRmDeviceClass {
                    class: Some(s(first)),
                    osds: parse_selector("osd crush rm-device-class", rest)?,
                })
            }
        }
        ["reweight", osd, weight] => Ok(MonCommand::CrushReweight {
            osd: parse_osd_id(osd).map_err(|e| usage_err("osd crush reweight", &e))?,
            weight: parse_weight(weight).map_err(|e| usage_err("osd crush reweight", &e))?,
        }),
        [verb @ ("set-device-class" | "rm-device-class" | "reweight"), ..] => Err(usage_err(
            &format!("osd crush {verb}"),
            "wrong number of arguments",
        )),
        _ => Err(usage_err("osd crush", "unknown osd crush command")),
    }
}

fn parse_ec_profile(w: &[&str]) -> Result<MonCommand, ParseError> {
    const P: &str = "osd erasure-code-profile";
    match w {
        ["set", name, rest @ ..] => {
            let mut params = Vec::new();
            let mut force = false;
            for word in rest {
                if *word == "--force" || *word == "--yes-i-really-mean-it" {
                    force = true;
                    continue;
                }
                let (k, v) = word.split_once('=').ok_or_else(|| {
                    usage_err(
                        &format!("{P} set"),
                        &format!("'{word}' is not KEY=VALUE (e.g. k=4 m=2)"),
                    )
                })?;
                params.push((k.to_string(), v.to_string()));
            }
            Ok(MonCommand::EcProfileSet {
                name: name.to_string(),
                params,
                force,
            })
        }
        ["ls"] => Ok(MonCommand::EcProfileLs),
        ["get", name] => Ok(MonCommand::EcProfileGet {
            name: name.to_string(),
        }),
        ["rm", name] => Ok(MonCommand::EcProfileRm {
            name: name.to_string(),
        }),
        [verb, ..] if ["set", "ls", "get", "rm"].contains(verb) => Err(usage_err(
            &format!("{P} {verb}"),
            "wrong number of arguments",
        )),
        _ => Err(usage_err(P, "unknown erasure-code-profile command")),
    }
}

fn parse_pool_create(name: &str, rest: &[&str]) -> Result<MonCommand, ParseError> {
    const P: &str = "osd pool create";
    let mut i = 0;
    let mut nums = Vec::new();
    while i < rest.len() && nums.len() < 2 && rest[i].chars().all(|c| c.is_ascii_digit()) {
        let n: u32 = rest[i]
            .parse()
            .map_err(|_| usage_err(P, &format!("'{}' is too large for a PG count", rest[i])))?;
        nums.push(n);
        i += 1;
    }
    let mut kind = PoolKind::Replicated;
    match rest.get(i) {
        Some(&"replicated") => i += 1,
        Some(&"erasure") => {
            kind = PoolKind::Erasure;
            i += 1;
        }
        _ => {}
    }
    let tail = &rest[i..];
    let (profile, rule) = match (kind, tail) {
        (_, []) => (None, None),
        (PoolKind::Replicated, [rule]) => (None, Some(rule.to_string())),
        (PoolKind::Erasure, [profile]) => (Some(profile.to_string()), None),
        (PoolKind::Erasure, [profile, rule]) => (Some(profile.to_string()), Some(rule.to_string())),
        _ => {
            return Err(usage_err(
                P,
                &format!("unexpected arguments '{}'", tail.join(" ")),
            ))
        }
    };
    Ok(MonCommand::PoolCreate {
        name: name.to_string(),
        pg_num: nums.first().copied(),
        pgp_num: nums.get(1).copied(),
        kind,
        profile,
        rule,
    })
}

fn parse_pool(w: &[&str]) -> Result<MonCommand, ParseError> {
    let s = |x: &&str| x.to_string();
    match w {
        ["create", name, rest @ ..] => parse_pool_create(name, rest),
        ["set", pool, key, value] => Ok(MonCommand::PoolSet {
            pool: s(pool),
            key: s(key),
            value: s(value),
            sure: false,
        }),
        ["set", pool, key, value, "--yes-i-really-mean-it"] => Ok(MonCommand::PoolSet {
            pool: s(pool),
            key: s(key),
            value: s(value),
            sure: true,
        }),
        ["set-quota", pool, which @ ("max_bytes" | "max_objects"), value] => {
            Ok(MonCommand::PoolSet {
                pool: s(pool),
                key: format!("quota_{which}"),
                value: s(value),
                sure: false,
            })
        }
        ["get", pool, key] => Ok(MonCommand::PoolGet {
            pool: s(pool),
            key: s(key),
        }),
        ["ls" | "list"] => Ok(MonCommand::PoolLs { detail: false }),
        ["ls" | "list", "detail"] => Ok(MonCommand::PoolLs { detail: true }),
        ["application", "enable", pool, app]
        | ["application", "enable", pool, app, "--yes-i-really-mean-it"] => {
            Ok(MonCommand::PoolApplicationEnable {
                pool: s(pool),
                app: s(app),
            })
        }
        ["delete" | "rm", pool, rest @ ..] => {
            let mut confirm = String::new();
            let mut sure = false;
            for word in rest {
                match *word {
                    "--yes-i-really-really-mean-it" => sure = true,
                    wd if wd.starts_with("--") => {
                        return Err(usage_err(
                            "osd pool delete",
                            &format!("unknown option '{wd}'"),
                        ))
                    }
                    wd if confirm.is_empty() => confirm = wd.to_string(),
                    _ => return Err(usage_err("osd pool delete", "too many arguments")),
                }
            }
            Ok(MonCommand::PoolDelete {
                pool: s(pool),
                confirm,
                sure,
            })
        }
        [verb @ ("create" | "set" | "set-quota" | "get" | "ls" | "list" | "delete" | "rm"), ..] => {
            let verb = match *verb {
                "list" => "ls",
                "rm" => "delete",
                v => v,
            };
            Err(usage_err(
                &format!("osd pool {verb}"),
                "wrong number of arguments",
            ))
        }
        ["application", ..] => Err(usage_err("osd pool application", "wrong arguments")),
        _ => Err(usage_err("osd pool", "unknown osd pool command")),
    }
}

fn parse_auth(w: &[&str]) -> Result<MonCommand, ParseError> {
    let ent = |prefix: &str, word: &str| parse_entity(word).map_err(|e| usage_err(prefix, &e));
    match w {
        ["ls" | "list"] => Ok(MonCommand::AuthLs),
        ["get", name] => Ok(MonCommand::AuthGet {
            entity: ent("auth get", name)?,
        }),
        ["get-or-create", name, caps @ ..] => Ok(MonCommand::AuthGetOrCreate {
            entity: ent("auth get-or-create", name)?,
            caps: parse_caps_pairs("auth get-or-create", caps)?,
        }),
        ["caps", name, caps @ ..] => Ok(MonCommand::AuthCaps {
            entity: ent("auth caps", name)?,
            caps: parse_caps_pairs("auth caps", caps)?,
        }),
        ["print-key" | "get-key", name] => Ok(MonCommand::AuthPrintKey {
            entity: ent("auth print-key", name)?,
        }),
        ["del" | "rm", name] => Ok(MonCommand::AuthDel {
            entity: ent("auth del", name)?,
        }),
        [verb @ ("ls" | "list" | "get" | "get-or-create" | "caps" | "del" | "rm" | "print-key"), ..] =>
        {
            let verb = match *verb {
                "list" => "ls",
                "rm" => "del",
                v => v,
            };
            Err(usage_err(
                &format!("auth {verb}"),
                "wrong number of arguments",
            ))
        }
        _ => Err(usage_err("auth", "unknown auth command")),
    }
}

fn parse_config(w: &[&str]) -> Result<MonCommand, ParseError> {
    let s = |x: &&str| x.to_string();
    match w {
        ["set", who, key, value] => Ok(MonCommand::ConfigSet {
            who: s(who),
            key: s(key),
            value: s(value),
            force: false,
        }),
        ["set", who, key, value, "--force"] => Ok(MonCommand::ConfigSet {
            who: s(who),
            key: s(key),
            value: s(value),
            force: true,
        }),
        ["get", who] => Ok(MonCommand::ConfigGet {
            who: s(who),
            key: None,
        }),
        ["get", who, key] => Ok(MonCommand::ConfigGet {
            who: s(who),
            key: Some(s(key)),
        }),
        ["dump"] => Ok(MonCommand::ConfigDump),
        ["rm", who, key] => Ok(MonCommand::ConfigRm {
            who: s(who),
            key: s(key),
        }),
        [verb @ ("set" | "get" | "dump" | "rm"), ..] => Err(usage_err(
            &format!("config {verb}"),
            "wrong number of arguments",
        )),
        _ => Err(usage_err("config", "unknown config command")),
    }
}

fn parse_tell(w: &[&str]) -> Result<MonCommand, ParseError> {
    match w {
        [target, "config", "set", key, value] => {
            let who = match target.strip_suffix(".*") {
                Some(kind) => kind.to_string(),
                None if *target == "*" => "global".to_string(),
                None => target.to_string(),
            };
            Ok(MonCommand::ConfigSet {
                who,
                key: key.to_string(),
                value: value.to_string(),
                force: false,
            })
        }
        _ => Err(usage_err(
            "tell",
            "only 'tell TARGET config set KEY VALUE' is supported",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(line: &str) -> Result<MonCommand, ParseError> {
        let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        parse_command(&words)
    }

    #[test]
    fn parses_pool_create_forms() {
        assert_eq!(
            p("osd pool create rbd 32").unwrap(),
            MonCommand::PoolCreate {
                name: "rbd".into(),
                pg_num: Some(32),
                pgp_num: None,
                kind: PoolKind::Replicated,
                profile: None,
                rule: None
            }
        );
        assert_eq!(
            p("osd pool create ec 128 128 erasure ec42 ec-rule").unwrap(),
            MonCommand::PoolCreate {
                name: "ec".into(),
                pg_num: Some(128),
                pgp_num: Some(128),
                kind: PoolKind::Erasure,
                profile: Some("ec42".into()),
                rule: Some("ec-rule".into())
            }
        );
        assert!(matches!(
            p("osd pool create r replicated fast").unwrap(),
            MonCommand::PoolCreate {
                rule: Some(_),
                profile: None,
                ..
            }
        ));
        let e = p("osd pool create r 1 2 replicated a b").unwrap_err();
        assert!(e.to_string().contains("usage:"), "{e}");
        assert!(p("osd pool create").is_err());
        assert!(p("osd pool create x 99999999999").is_err());
    }

    #[test]
    fn format_flag_is_ignored_and_errors_show_usage() {
        assert_eq!(p("osd tree --format json").unwrap(), MonCommand::OsdTree);
        assert_eq!(p("-s").unwrap(), MonCommand::Status);
        let e = p("osd set nothing").unwrap_err();
        assert!(e.to_string().contains("unknown flag 'nothing'"), "{e}");
        let e = p("frobnicate").unwrap_err();
        assert!(e.to_string().contains("cairn help"), "{e}");
        assert!(p("").is_err());
    }
}
