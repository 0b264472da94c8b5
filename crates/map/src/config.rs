//! Central config: the options the monitors know (Ceph's names), their
//! types, ranges and defaults, and how values are checked and normalised.
//! Storage of the values is the `config` table of `ClusterMap`.

use cairn_types::EntityName;
use serde::Serialize;

/// Longest config value we store.
pub const CONFIG_VALUE_MAX_LEN: usize = 4096;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;
const TIB: u64 = 1024 * GIB;

/// The type (and range) of an option's value.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum OptKind {
    Bool,
    Uint {
        min: u64,
        max: u64,
    },
    Int {
        min: i64,
        max: i64,
    },
    Float {
        min: f64,
        max: f64,
    },
    /// Bytes; accepts suffixes K/M/G/T (binary, as Ceph does) and KiB/MiB/….
    Size {
        min: u64,
        max: u64,
    },
    /// Seconds; accepts suffixes s/m/h/d.
    Secs {
        min: u64,
        max: u64,
    },
    Choice(&'static [&'static str]),
    /// One or more of the choices, each at most once, in order of
    /// preference, separated by spaces or commas (Ceph's `ms_*_mode`
    /// lists: `crc secure`); stored space-separated.
    ChoiceList(&'static [&'static str]),
    Str,
}

/// One known option.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ConfigOption {
    pub name: &'static str,
    pub kind: OptKind,
    pub default: &'static str,
    pub description: &'static str,
}

const fn opt(
    name: &'static str,
    kind: OptKind,
    default: &'static str,
    description: &'static str,
) -> ConfigOption {
    ConfigOption {
        name,
        kind,
        default,
        description,
    }
}

const FAILURE_DOMAINS: &[&str] = &[
    "osd",
    "host",
    "chassis",
    "rack",
    "row",
    "pdu",
    "pod",
    "room",
    "datacenter",
    "zone",
    "region",
    "root",
];

/// Every option the monitors validate.
pub const CONFIG_OPTIONS: &[ConfigOption] = &[
    opt(
        "debug_mon",
        OptKind::Str,
        "1/5",
        "log level of the monitor (Ceph's N/M form)",
    ),
    opt("debug_ms", OptKind::Str, "0/0", "log level of messaging"),
    opt("debug_osd", OptKind::Str, "1/5", "log level of the OSDs"),
    opt(
        "mds_cache_memory_limit",
        OptKind::Size {
            min: 64 * MIB,
            max: TIB,
        },
        "1073741824",
        "MDS cache budget in bytes",
    ),
    opt(
        "mon_allow_pool_delete",
        OptKind::Bool,
        "false",
        "allow 'osd pool delete'",
    ),
    opt(
        "mon_allow_pool_size_one",
        OptKind::Bool,
        "false",
        "allow pools with a single replica",
    ),
    opt(
        "mon_clock_drift_allowed",
        OptKind::Float {
            min: 0.0,
            max: 86400.0,
        },
        "0.05",
        "clock offset between monitors (seconds) above which MON_CLOCK_SKEW is reported",
    ),
    opt(
        "mon_max_pg_per_osd",
        OptKind::Uint {
            min: 1,
            max: 100_000,
        },
        "250",
        "refuse pool changes that would put more PGs per OSD than this",
    ),
    opt(
        "mon_osd_auto_mark_in",
        OptKind::Bool,
        "false",
        "mark any booting OSD in",
    ),
    opt(
        "mon_osd_auto_mark_new_in",
        OptKind::Bool,
        "true",
        "mark a new OSD in on its first boot",
    ),
    opt(
        "mon_osd_blocklist_default_expire",
        OptKind::Secs {
            min: 1,
            max: crate::blocklist::BLOCKLIST_EXPIRE_MAX_SECS,
        },
        "3600",
        "seconds a blocklist entry lasts when 'osd blocklist add' gives no --expire (counted by the monitor leader's own clock from when it saw the entry)",
    ),
    opt(
        "mon_osd_down_out_interval",
        OptKind::Secs {
            min: 0,
            max: 365 * 86400,
        },
        "600",
        "seconds an OSD may stay down before it is marked out (0 = never)",
    ),
    opt(
        "mon_osd_down_out_subtree_limit",
        OptKind::Choice(FAILURE_DOMAINS),
        "host",
        "CRUSH subtree type (e.g. host) whose OSDs are not marked out automatically when all of them are down (Ceph defaults to rack; a small cluster wants host)",
    ),
    opt(
        "mon_osd_min_down_reporters",
        OptKind::Uint { min: 1, max: 1000 },
        "2",
        "distinct OSDs that must report a peer down",
    ),
    opt(
        "mon_osd_min_in_ratio",
        OptKind::Float { min: 0.0, max: 1.0 },
        "0.75",
        "do not mark OSDs out automatically below this fraction of OSDs in",
    ),
    opt(
        "mon_osd_reporter_subtree_level",
        OptKind::Choice(FAILURE_DOMAINS),
        "host",
        "CRUSH level whose distinct subtrees count as separate failure reporters",
    ),
    opt(
        "mon_osd_report_timeout",
        OptKind::Secs { min: 1, max: 86400 },
        "900",
        "seconds without an OSD's beacon before the monitors mark it down",
    ),
    opt(
        "mon_target_pg_per_osd",
        OptKind::Uint {
            min: 1,
            max: 10_000,
        },
        "100",
        "PGs per OSD the autoscaler aims for",
    ),
    opt(
        "ms_client_mode",
        OptKind::ChoiceList(&["crc", "secure"]),
        "crc secure",
        "frame modes a client offers OSDs, most preferred first (each OSD takes the first its ms_service_mode allows): secure = keyed MAC over every payload, crc = MACed headers and a payload crc32c (corruption only, not tampering); a single mode is a list of one",
    ),
    opt(
        "ms_cluster_mode",
        OptKind::ChoiceList(&["crc", "secure"]),
        "crc secure",
        "frame modes between OSDs (replication, recovery, heartbeats), most preferred first: offered when connecting, allowed when accepting; crc trusts the cluster network not to tamper with payloads (read at OSD start)",
    ),
    opt(
        "ms_service_mode",
        OptKind::ChoiceList(&["crc", "secure"]),
        "crc secure",
        "frame modes an OSD allows from clients (order does not matter: the client's list picks); unset, an OSD takes ms_client_mode if that is set for it (read at OSD start)",
    ),
    opt(
        "osd_beacon_report_interval",
        OptKind::Secs { min: 1, max: 3600 },
        "5",
        "seconds between an OSD's beacons to the monitors (they carry its PG statistics and usage, so Cairn sends them more often than Ceph's 300)",
    ),
    opt(
        "osd_class_update_on_start",
        OptKind::Bool,
        "true",
        "set the detected device class when an OSD starts",
    ),
    opt(
        "osd_client_op_pause_wait",
        OptKind::Secs { min: 1, max: 3600 },
        "30",
        "how long a client op waits while the pause flag is set before it fails",
    ),
    opt(
        "osd_crush_chooseleaf_type",
        OptKind::Uint { min: 0, max: 11 },
        "1",
        "failure domain type id of the default rule (0 = osd, 1 = host)",
    ),
    opt(
        "osd_crush_update_on_start",
        OptKind::Bool,
        "true",
        "move an OSD to host=<hostname> in CRUSH when it starts",
    ),
    opt(
        "osd_cache_written_data",
        OptKind::Bool,
        "false",
        "the copy client reads come from (replicated primary, EC data chunks) writes big data through the page cache so reads soon after are served from memory (read at OSD start)",
    ),
    opt(
        "osd_zero_unwritten",
        OptKind::Bool,
        "false",
        "an OSD on a data file writes zeros, while idle, over free space the filesystem still holds as unwritten (preallocated), so later writes need no extent conversion; writes the whole file once (read at OSD start; `dev up` turns it on)",
    ),
    opt(
        "osd_data_cache_bytes",
        OptKind::Size {
            min: 0,
            max: 64 * TIB,
        },
        "41943040",
        "bytes of whole objects an OSD keeps cached for reads (default 1/8 of osd_memory_target, at most 1/4; 0 = off; read at OSD start)",
    ),
    opt(
        "osd_deep_scrub_interval",
        OptKind::Secs {
            min: 60,
            max: 365 * 86400,
        },
        "604800",
        "seconds between deep scrubs of a PG",
    ),
    opt(
        "osd_heartbeat_grace",
        OptKind::Secs { min: 1, max: 3600 },
        "20",
        "seconds without heartbeat before a peer is reported down",
    ),
    opt(
        "osd_heartbeat_interval",
        OptKind::Secs { min: 1, max: 60 },
        "6",
        "seconds between heartbeats to peers",
    ),
    opt(
        "osd_max_backfills",
        OptKind::Uint { min: 1, max: 1000 },
        "1",
        "concurrent backfills per OSD",
    ),
    opt(
        "osd_max_scrubs",
        OptKind::Uint { min: 1, max: 16 },
        "1",
        "PGs one OSD scrubs at once (as primary)",
    ),
    opt(
        "osd_max_object_size",
        OptKind::Size {
            min: MIB,
            max: 4 * GIB,
        },
        "134217728",
        "largest object in bytes",
    ),
    opt(
        "osd_memory_target",
        OptKind::Size {
            min: 128 * MIB,
            max: 64 * TIB,
        },
        "335544320",
        "memory budget of one OSD in bytes (store cache, in-flight client bytes, PG logs; read at OSD start)",
    ),
    opt(
        "osd_pool_default_crush_rule",
        OptKind::Int { min: -1, max: 255 },
        "-1",
        "rule id for new replicated pools (-1 = the first replicated rule)",
    ),
    opt(
        "osd_pool_default_min_size",
        OptKind::Uint { min: 0, max: 10 },
        "0",
        "min_size of new replicated pools (0 = size - size/2)",
    ),
    opt(
        "osd_pool_default_pg_autoscale_mode",
        OptKind::Choice(&["on", "off", "warn"]),
        "on",
        "autoscale mode of new pools",
    ),
    opt(
        "osd_pool_default_pg_num",
        OptKind::Uint {
            min: 1,
            max: 65_536,
        },
        "32",
        "pg_num of new pools",
    ),
    opt(
        "osd_pool_default_pgp_num",
        OptKind::Uint {
            min: 0,
            max: 65_536,
        },
        "0",
        "pgp_num of new pools (0 = pg_num)",
    ),
    opt(
        "osd_pool_default_size",
        OptKind::Uint { min: 1, max: 10 },
        "3",
        "replicas of new replicated pools",
    ),
    opt(
        "osd_pool_erasure_code_stripe_unit",
        OptKind::Size {
            min: 4 * KIB,
            max: 16 * MIB,
        },
        "4096",
        "stripe unit of EC profiles that do not set one",
    ),
    opt(
        "osd_recovery_max_active",
        OptKind::Uint { min: 1, max: 1000 },
        "3",
        "concurrent recovery ops per OSD",
    ),
    opt(
        "osd_recovery_max_bytes_per_sec",
        OptKind::Size {
            min: 0,
            max: TIB,
        },
        "0",
        "bytes per second one OSD sends for recovery and backfill, at most (0 = unlimited)",
    ),
    opt(
        "osd_recovery_sleep",
        OptKind::Float {
            min: 0.0,
            max: 60.0,
        },
        "0",
        "seconds to sleep between recovery ops",
    ),
    opt(
        "osd_scrub_begin_hour",
        OptKind::Uint { min: 0, max: 23 },
        "0",
        "hour scrubbing may start",
    ),
    opt(
        "osd_scrub_end_hour",
        OptKind::Uint { min: 0, max: 23 },
        "0",
        "hour scrubbing must end (equal to begin = any time)",
    ),
    opt(
        "osd_scrub_chunk_max",
        OptKind::Uint { min: 1, max: 1000 },
        "25",
        "objects compared per scrub chunk (writes to a chunk wait while it is compared)",
    ),
    opt(
        "osd_scrub_max_interval",
        OptKind::Secs {
            min: 60,
            max: 365 * 86400,
        },
        "604800",
        "longest time between scrubs of a PG",
    ),
    opt(
        "osd_scrub_min_interval",
        OptKind::Secs {
            min: 60,
            max: 365 * 86400,
        },
        "86400",
        "shortest time between scrubs of a PG",
    ),
    opt(
        "osd_scrub_sleep",
        OptKind::Float {
            min: 0.0,
            max: 60.0,
        },
        "0.05",
        "seconds a scrub sleeps between chunks (yields to client I/O)",
    ),
    opt(
        "public_network",
        OptKind::Str,
        "",
        "network daemons listen on (CIDR)",
    ),
    opt(
        "cluster_network",
        OptKind::Str,
        "",
        "network for replication traffic (CIDR)",
    ),
    opt(
        "rados_osd_op_timeout",
        OptKind::Secs { min: 1, max: 86400 },
        "60",
        "bound on one client op, every retry included; a longer op fails naming its object, PG and OSD (read by clients at each op)",
    ),
    opt(
        "rbd_cache",
        OptKind::Bool,
        "true",
        "image client write cache on (false = every write durable when acknowledged)",
    ),
    opt(
        "rbd_cache_max_dirty",
        OptKind::Size { min: 0, max: GIB },
        "25165824",
        "dirty bytes an open image may hold; writers wait beyond it (0 = write-through)",
    ),
    opt(
        "rbd_cache_max_dirty_age",
        OptKind::Float {
            min: 0.0,
            max: 3600.0,
        },
        "1.0",
        "seconds dirty image data may stay cached before it is written back",
    ),
    opt(
        "rbd_cache_policy",
        OptKind::Choice(&["writeback", "writethrough"]),
        "writeback",
        "image write cache: writeback (acknowledge when cached, durable at flush/FUA) or writethrough",
    ),
    opt(
        "rbd_cache_target_dirty",
        OptKind::Size { min: 0, max: GIB },
        "16777216",
        "dirty bytes above which an open image writes back its oldest data",
    ),
    opt(
        "rbd_cache_writethrough_until_flush",
        OptKind::Bool,
        "true",
        "keep the image cache write-through until the user's first flush",
    ),
];

/// The option named `name` (already normalised), if the monitors know it.
pub fn known_option(name: &str) -> Option<&'static ConfigOption> {
    CONFIG_OPTIONS.iter().find(|o| o.name == name)
}

/// Normalises a key the way `cairn.conf` does (`osd pool default size` ==
/// `osd_pool_default_size`).
pub fn normalize_key(key: &str) -> String {
    cairn_types::conf::normalize_key(key)
}

/// Checks a section name: `global`, a daemon type, or one entity (`osd.3`).
pub fn validate_section(who: &str) -> Result<String, String> {
    match who {
        "global" | "mon" | "mgr" | "osd" | "mds" | "client" => Ok(who.to_string()),
        _ if who.contains('/') => Err(format!(
            "section '{who}': config masks (like osd/class:ssd) are not supported; use global, mon, mgr, osd, mds, client or one daemon such as osd.3"
        )),
        _ => who.parse::<EntityName>().map(|e| e.to_string()).map_err(|e| {
            format!("section '{who}' is neither global, mon, mgr, osd, mds, client nor a daemon name: {e}")
        }),
    }
}

/// The sections consulted for `who`, most specific first.
pub fn section_chain(who: &str) -> Vec<String> {
    let mut out = vec![who.to_string()];
    if let Some((kind, _)) = who.split_once('.') {
        out.push(kind.to_string());
    }
    if who != "global" {
        out.push("global".to_string());
    }
    out
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Some(true),
        "false" | "0" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// Parses a boolean the way Ceph's CLI does (true/false, 1/0, yes/no, on/off).
pub fn parse_bool_value(v: &str) -> Result<bool, String> {
    parse_bool(v).ok_or_else(|| format!("'{v}' is not a boolean (use true or false)"))
}

/// Parses a byte size: `4096`, `4K`, `4KiB`, `1G`, `1.5T`… (binary units).
pub fn parse_size(v: &str) -> Result<u64, String> {
    let t = v.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("'{v}' is not a size (e.g. 4096, 64K, 1G)"));
    }
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => KIB,
        "m" | "mb" | "mib" => MIB,
        "g" | "gb" | "gib" => GIB,
        "t" | "tb" | "tib" => TIB,
        other => {
            return Err(format!(
                "'{v}': unknown size unit '{other}' (use K, M, G or T)"
            ))
        }
    };
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(mult)
            .ok_or_else(|| format!("'{v}' is too large"));
    }
    let f: f64 = num
        .parse()
        .map_err(|_| format!("'{v}' is not a size (e.g. 4096, 64K, 1G)"))?;
    let bytes = f * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("'{v}' is out of range"));
    }
    Ok(bytes.round() as u64)
}

fn parse_secs(v: &str) -> Result<u64, String> {
    let t = v.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 's')) => (&t[..i], 1),
        Some((i, 'm')) => (&t[..i], 60),
        Some((i, 'h')) => (&t[..i], 3600),
        Some((i, 'd')) => (&t[..i], 86400),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("'{v}' is not a duration in seconds (e.g. 600, 10m, 2h)"))
}

fn range_err<T: std::fmt::Display>(name: &str, v: &str, min: T, max: T) -> String {
    format!("{name} = {v} is out of range: it must be between {min} and {max}")
}

/// Checks `value` against the option's type and range; returns the value in
/// canonical form (booleans as true/false, sizes and durations as integers).
pub fn validate_value(opt: &ConfigOption, value: &str) -> Result<String, String> {
    let v = value.trim();
    let name = opt.name;
    let bad = |what: &str| format!("{name} = '{v}': {what}");
    match opt.kind {
        OptKind::Bool => parse_bool(v)
            .map(|b| b.to_string())
            .ok_or_else(|| bad("expected true or false")),
        OptKind::Uint { min, max } => {
            let n: u64 = v.parse().map_err(|_| bad("expected a whole number"))?;
            if n < min || n > max {
                return Err(range_err(name, v, min, max));
            }
            Ok(n.to_string())
        }
        OptKind::Int { min, max } => {
            let n: i64 = v.parse().map_err(|_| bad("expected a whole number"))?;
            if n < min || n > max {
                return Err(range_err(name, v, min, max));
            }
            Ok(n.to_string())
        }
        OptKind::Float { min, max } => {
            let f: f64 = v.parse().map_err(|_| bad("expected a number"))?;
            if !f.is_finite() || f < min || f > max {
                return Err(range_err(name, v, min, max));
            }
            Ok(v.to_string())
        }
        OptKind::Size { min, max } => {
            let n = parse_size(v).map_err(|e| format!("{name}: {e}"))?;
            if n < min || n > max {
                return Err(range_err(name, v, min, max));
            }
            Ok(n.to_string())
        }
        OptKind::Secs { min, max } => {
            let n = parse_secs(v).map_err(|e| format!("{name}: {e}"))?;
            if n < min || n > max {
                return Err(range_err(name, v, min, max));
            }
            Ok(n.to_string())
        }
        OptKind::Choice(choices) => {
            if choices.contains(&v) {
                Ok(v.to_string())
            } else {
                Err(bad(&format!("expected one of {}", choices.join(", "))))
            }
        }
        OptKind::ChoiceList(choices) => {
            let mut out: Vec<&str> = Vec::new();
            for w in v
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|w| !w.is_empty())
            {
                if !choices.contains(&w) {
                    return Err(bad(&format!(
                        "'{w}' is not one of {} (list them in order of preference, e.g. '{}')",
                        choices.join(", "),
                        choices.join(" ")
                    )));
                }
                if out.contains(&w) {
                    return Err(bad(&format!("'{w}' is listed twice")));
                }
                out.push(w);
            }
            if out.is_empty() {
                return Err(bad(&format!(
                    "expected one or more of {} in order of preference",
                    choices.join(", ")
                )));
            }
            Ok(out.join(" "))
        }
        OptKind::Str => validate_free_text(name, v),
    }
}

/// Checks a value of an option the monitors do not know (stored with --force).
pub fn validate_free_text(name: &str, v: &str) -> Result<String, String> {
    if v.len() > CONFIG_VALUE_MAX_LEN {
        return Err(format!(
            "{name}: value is longer than {CONFIG_VALUE_MAX_LEN} characters"
        ));
    }
    if v.contains(['\n', '\r', '\0']) {
        return Err(format!("{name}: value may not contain line breaks"));
    }
    Ok(v.to_string())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The known option closest to an unknown name, for "did you mean" hints.
pub fn suggest_option(name: &str) -> Option<&'static str> {
    CONFIG_OPTIONS
        .iter()
        .map(|o| (edit_distance(name, o.name), o.name))
        .filter(|(d, _)| *d <= 4)
        .min()
        .map(|(_, n)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_sorted_unique_and_defaults_valid() {
        for o in CONFIG_OPTIONS {
            if !o.default.is_empty() {
                validate_value(o, o.default).unwrap_or_else(|e| panic!("{}: {e}", o.name));
            }
            assert_eq!(
                CONFIG_OPTIONS.iter().filter(|p| p.name == o.name).count(),
                1
            );
        }
    }

    #[test]
    fn values_are_checked_and_normalised() {
        let size = known_option("osd_memory_target").unwrap();
        assert_eq!(validate_value(size, "2G").unwrap(), "2147483648");
        assert!(validate_value(size, "1K")
            .unwrap_err()
            .contains("out of range"));
        assert!(validate_value(size, "lots").is_err());
        let b = known_option("mon_allow_pool_delete").unwrap();
        assert_eq!(validate_value(b, "yes").unwrap(), "true");
        assert!(validate_value(b, "maybe").is_err());
        let n = known_option("osd_pool_default_size").unwrap();
        assert!(validate_value(n, "0").is_err());
        assert!(validate_value(n, "11").is_err());
        assert_eq!(validate_value(n, "2").unwrap(), "2");
        let s = known_option("mon_osd_down_out_interval").unwrap();
        assert_eq!(validate_value(s, "10m").unwrap(), "600");
        let c = known_option("mon_osd_down_out_subtree_limit").unwrap();
        assert!(validate_value(c, "galaxy").is_err());
        assert_eq!(parse_size("1.5K").unwrap(), 1536);
        let l = known_option("ms_client_mode").unwrap();
        assert_eq!(validate_value(l, "secure").unwrap(), "secure");
        assert_eq!(validate_value(l, " secure,crc ").unwrap(), "secure crc");
        assert!(validate_value(l, "crc crc").unwrap_err().contains("twice"));
        assert!(validate_value(l, "crc tls").unwrap_err().contains("'tls'"));
        assert!(validate_value(l, " ").is_err());
    }

    #[test]
    fn sections_and_suggestions() {
        assert_eq!(validate_section("osd.3").unwrap(), "osd.3");
        assert!(validate_section("osd/class:ssd").is_err());
        assert!(validate_section("disk").is_err());
        assert_eq!(section_chain("osd.3"), vec!["osd.3", "osd", "global"]);
        assert_eq!(
            suggest_option("osd_pool_default_sise"),
            Some("osd_pool_default_size")
        );
    }
}
