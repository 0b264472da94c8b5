//! Placement and PG views computed by the CLI: `cairn osd map POOL OBJ`
//! (from the map), `cairn pg stat|dump|PGID query` and `cairn osd df [tree]`
//! (from what this node's OSDs report in their status files, since PG
//! states do not reach the monitors yet). Other `pg`/`osd` words go to the
//! monitors (`cmd_admin`).

use crate::conn;
use crate::osdhost::{OsdStatus, PgSnap};
use anyhow::{anyhow, bail, Result};
use cairn_map::ClusterMap;
use cairn_mon::DEFAULT_CLIENT_TIMEOUT;
use cairn_types::EntityName;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// A status file older than this is stale (its OSD is not running).
const STALE_SECS: u64 = 10;

/// True when the words are a command this module answers.
pub fn handles(words: &[String]) -> bool {
    let w: Vec<&str> = words.iter().map(String::as_str).collect();
    matches!(
        w.as_slice(),
        ["osd", "map", _, _]
            | ["osd", "df"]
            | ["osd", "df", "tree"]
            | ["pg", "stat"]
            | ["pg", "dump"]
            | ["pg", "dump", "pgs_brief"]
            | ["pg", "ls"]
            | ["pg", _, "query"]
    )
}

struct Opts {
    conf: Option<PathBuf>,
    json: bool,
    /// Node data dirs whose OSD status files to read (default: the conf's dir).
    data: Vec<PathBuf>,
    words: Vec<String>,
}

fn parse(args: &[String]) -> Result<Opts> {
    let mut o = Opts {
        conf: None,
        json: false,
        data: Vec::new(),
        words: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-c" | "--conf" => {
                o.conf = Some(PathBuf::from(
                    it.next().ok_or_else(|| anyhow!("{a} needs a value"))?,
                ))
            }
            "--data" => o.data.push(PathBuf::from(
                it.next().ok_or_else(|| anyhow!("{a} needs a value"))?,
            )),
            "-f" | "--format" => {
                let v = it.next().ok_or_else(|| anyhow!("{a} needs a value"))?;
                o.json = v.starts_with("json");
            }
            _ => o.words.push(a.clone()),
        }
    }
    Ok(o)
}

/// The admin words of a command line (flags removed), for `handles`.
pub fn words(args: &[String]) -> Vec<String> {
    parse(args).map(|o| o.words).unwrap_or_default()
}

pub fn run(args: &[String]) -> Result<()> {
    let o = parse(args)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let conf = conn::find_conf(o.conf.as_deref())?;
        let creds = conn::credentials(&conf, &EntityName::client("admin"), None)?;
        let mon = conn::mon_client(&conf, creds, DEFAULT_CLIENT_TIMEOUT)?;
        let sub = mon.subscribe().await.map_err(|e| anyhow!("{e}"))?;
        let map = sub.map;
        let nodes = if o.data.is_empty() {
            vec![conn::conf_dir(&conf.canonicalize().unwrap_or(conf.clone()))]
        } else {
            o.data.clone()
        };
        let stats: Vec<OsdStatus> = nodes.iter().flat_map(|n| OsdStatus::load_all(n)).collect();
        let w: Vec<&str> = o.words.iter().map(String::as_str).collect();
        match w.as_slice() {
            ["osd", "map", pool, obj] => osd_map(&map, pool, obj, o.json),
            ["osd", "df", rest @ ..] => osd_df(&map, &stats, !rest.is_empty(), o.json),
            ["pg", "stat"] => pg_stat(&map, &stats, o.json),
            ["pg", "dump", rest @ ..] => pg_dump(&map, &stats, !rest.is_empty(), o.json),
            ["pg", "ls"] => pg_dump(&map, &stats, true, o.json),
            ["pg", id, "query"] => pg_query(&map, &stats, id),
            _ => bail!("not a pg/osd view command"),
        }
    })
}

fn list(v: &[i32]) -> String {
    v.iter()
        .map(|o| o.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn osd_map(map: &ClusterMap, pool: &str, obj: &str, json: bool) -> Result<()> {
    let p =
        map.pools.values().find(|p| p.name == pool).ok_or_else(|| {
            anyhow!("pool '{pool}' does not exist; 'cairn osd pool ls' lists them")
        })?;
    let hash = cairn_ops::object_hash("", obj);
    let mask = p.pg_num.next_power_of_two() - 1;
    let seed = cairn_map::stable_mod(hash, p.pg_num, mask);
    let m = map.pg_to_up(p.id, seed).map_err(|e| anyhow!("{e}"))?;
    let prim = m
        .primary
        .map(|x| x.to_string())
        .unwrap_or_else(|| "-1".into());
    if json {
        println!(
            "{}",
            serde_json::json!({"epoch": map.epoch.0, "pool": pool, "pool_id": p.id, "objname": obj,
                "raw_pgid": format!("{}.{:08x}", p.id, hash), "pgid": format!("{}.{:x}", p.id, seed),
                "up": m.up, "up_primary": m.primary, "acting": m.up, "acting_primary": m.primary})
        );
    } else {
        println!(
            "osdmap e{} pool '{pool}' ({}) object '{obj}' -> pg {}.{:08x} ({}.{:x}) -> up ([{}], p{prim}) acting ([{}], p{prim})",
            map.epoch.0,
            p.id,
            p.id,
            hash,
            p.id,
            seed,
            list(&m.up),
            list(&m.up)
        );
    }
    Ok(())
}

fn fresh(stats: &[OsdStatus]) -> Vec<&OsdStatus> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    stats
        .iter()
        .filter(|s| now.saturating_sub(s.stamp) <= STALE_SECS)
        .collect()
}

/// A PG's reported state (if known), up set and primary.
pub type PgView = (Option<PgSnap>, Vec<i32>, Option<i32>);

/// Every PG of every pool with the state its primary reports, or
/// `unknown` when the primary's report is not available on this node.
pub fn pg_states(map: &ClusterMap, stats: &[OsdStatus]) -> BTreeMap<String, PgView> {
    let mut by_primary: BTreeMap<(i32, String), PgSnap> = BTreeMap::new();
    for s in fresh(stats) {
        for p in &s.pgs {
            if p.primary == Some(s.osd) {
                by_primary.insert((s.osd, p.pgid.clone()), p.clone());
            }
        }
    }
    let mut out = BTreeMap::new();
    for pool in map.pools.values() {
        let Ok(maps) = map.pool_pg_mappings(pool.id) else {
            continue;
        };
        for (seed, m) in maps.into_iter().enumerate() {
            let pgid = format!("{}.{:x}", pool.id, seed);
            let snap = m
                .primary
                .and_then(|p| by_primary.get(&(p, pgid.clone())).cloned())
                .filter(|s| s.up == m.up);
            out.insert(pgid, (snap, m.up, m.primary));
        }
    }
    out
}

/// `pg stat` summary: total PGs and counts by state.
pub fn pg_summary(map: &ClusterMap, stats: &[OsdStatus]) -> (usize, BTreeMap<String, usize>) {
    let states = pg_states(map, stats);
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    for (snap, _, _) in states.values() {
        let st = snap
            .as_ref()
            .map(|s| s.state.clone())
            .unwrap_or_else(|| "unknown".into());
        *by.entry(st).or_insert(0) += 1;
    }
    (states.len(), by)
}

fn pg_stat(map: &ClusterMap, stats: &[OsdStatus], json: bool) -> Result<()> {
    let (n, by) = pg_summary(map, stats);
    if json {
        println!(
            "{}",
            serde_json::json!({"num_pgs": n, "by_state": by, "epoch": map.epoch.0})
        );
        return Ok(());
    }
    let parts: Vec<String> = by.iter().map(|(s, c)| format!("{c} {s}")).collect();
    println!("{n} pgs: {}; osdmap e{}", parts.join(", "), map.epoch.0);
    if by.contains_key("unknown") {
        println!("(unknown = the PG's primary runs on another node or is down: PG states are read from this node's OSDs; the monitors do not collect them yet)");
    }
    Ok(())
}

fn pg_dump(map: &ClusterMap, stats: &[OsdStatus], brief: bool, json: bool) -> Result<()> {
    let states = pg_states(map, stats);
    if json {
        let v: Vec<_> = states
            .iter()
            .map(|(id, (s, up, p))| serde_json::json!({"pgid": id, "state": s.as_ref().map(|s| s.state.as_str()).unwrap_or("unknown"),
                "up": up, "up_primary": p, "acting": up, "acting_primary": p,
                "last_update": s.as_ref().map(|s| s.last_update.clone()), "log_size": s.as_ref().map(|s| s.log_entries)}))
            .collect();
        println!("{}", serde_json::json!({"pg_stats": v}));
        return Ok(());
    }
    if brief {
        println!(
            "{:<8} {:<28} {:<12} {:>10} {:<12} {:>14}",
            "PG_STAT", "STATE", "UP", "UP_PRIMARY", "ACTING", "ACTING_PRIMARY"
        );
    } else {
        println!(
            "{:<8} {:<28} {:<12} {:<12} {:>8} {:<12} {:<8}",
            "PG_STAT", "STATE", "VERSION", "LOG_TAIL", "LOG", "UP", "PRIMARY"
        );
    }
    for (id, (s, up, p)) in &states {
        let st = s.as_ref().map(|s| s.state.as_str()).unwrap_or("unknown");
        let pr = p.map(|x| x.to_string()).unwrap_or_else(|| "-1".into());
        let upl = format!("[{}]", list(up));
        if brief {
            println!("{id:<8} {st:<28} {upl:<12} {pr:>10} {upl:<12} {pr:>14}");
        } else {
            let (v, t, l) = s
                .as_ref()
                .map(|s| {
                    (
                        s.last_update.clone(),
                        s.log_tail.clone(),
                        s.log_entries.to_string(),
                    )
                })
                .unwrap_or_else(|| ("-".into(), "-".into(), "-".into()));
            println!("{id:<8} {st:<28} {v:<12} {t:<12} {l:>8} {upl:<12} {pr:<8}");
        }
    }
    Ok(())
}

fn pg_query(map: &ClusterMap, stats: &[OsdStatus], id: &str) -> Result<()> {
    let pgid: cairn_types::PgId = id.parse().map_err(|e: String| anyhow!("pg '{id}': {e}"))?;
    let m = map
        .pg_to_up(pgid.pool.0, pgid.seed)
        .map_err(|e| anyhow!("{e}"))?;
    let mut peers = Vec::new();
    for s in fresh(stats) {
        if let Some(p) = s.pgs.iter().find(|p| p.pgid == pgid.to_string()) {
            peers.push(serde_json::to_value(p)?);
        }
    }
    let state = peers
        .iter()
        .find(|p| p["role"] == "primary")
        .and_then(|p| p["state"].as_str().map(str::to_string))
        .unwrap_or_else(|| "unknown".into());
    let v = serde_json::json!({
        "pgid": pgid.to_string(), "epoch": map.epoch.0, "state": state,
        "up": m.up, "acting": m.up, "up_primary": m.primary, "acting_primary": m.primary,
        "info_by_osd_on_this_node": peers,
    });
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}

fn osd_df(map: &ClusterMap, stats: &[OsdStatus], tree: bool, json: bool) -> Result<()> {
    let states = pg_states(map, stats);
    let mut pgs: BTreeMap<i32, usize> = BTreeMap::new();
    for (_, up, _) in states.values() {
        for o in up {
            *pgs.entry(*o).or_insert(0) += 1;
        }
    }
    let by_id: BTreeMap<i32, &OsdStatus> = stats.iter().map(|s| (s.osd, s)).collect();
    let mut rows = Vec::new();
    for o in map.osds.values() {
        let s = by_id.get(&o.id);
        let size = s
            .map(|s| s.total_bytes)
            .or(o.last_reported.as_ref().map(|r| r.total_bytes))
            .unwrap_or(0);
        let used = s
            .map(|s| s.used_bytes_at_start)
            .or(o.last_reported.as_ref().map(|r| r.used_bytes))
            .unwrap_or(0);
        rows.push((o, size, used, pgs.get(&o.id).copied().unwrap_or(0)));
    }
    if json {
        let v: Vec<_> = rows
            .iter()
            .map(|(o, size, used, n)| {
                serde_json::json!({"id": o.id, "host": o.host,
            "device_class": o.device_class, "crush_weight": o.crush_weight, "reweight": o.reweight,
            "kb": size / 1024, "kb_used_at_boot": used / 1024, "pgs": n, "up": o.up, "in": o.is_in})
            })
            .collect();
        println!("{}", serde_json::json!({"nodes": v}));
        return Ok(());
    }
    println!(
        "{:>3} {:<6} {:>8} {:>8} {:>10} {:>10} {:>10} {:>7} {:>4} {:<8} NAME",
        "ID", "CLASS", "WEIGHT", "REWEIGHT", "SIZE", "USED*", "AVAIL*", "%USE*", "PGS", "STATUS"
    );
    let mut last_host = String::new();
    for (o, size, used, n) in &rows {
        if tree && o.host != last_host {
            println!(
                "{:>3} {:<6} {:>8} {:>8} {:>10} {:>10} {:>10} {:>7} {:>4} {:<8} host {}",
                "", "", "", "", "", "", "", "", "", "", o.host
            );
            last_host = o.host.clone();
        }
        let pct = if *size > 0 {
            *used as f64 * 100.0 / *size as f64
        } else {
            0.0
        };
        println!(
            "{:>3} {:<6} {:>8.5} {:>8.5} {:>10} {:>10} {:>10} {:>7.2} {:>4} {:<8} {}osd.{}",
            o.id,
            o.device_class.clone().unwrap_or_default(),
            o.crush_weight,
            o.reweight,
            crate::cmd_disk::human_bytes(*size),
            crate::cmd_disk::human_bytes(*used),
            crate::cmd_disk::human_bytes(size.saturating_sub(*used)),
            pct,
            n,
            if o.up { "up" } else { "down" },
            if tree { "    " } else { "" },
            o.id
        );
    }
    println!(
        "* USED/AVAIL/%USE are as of each OSD's last boot: running OSDs do not report usage yet."
    );
    Ok(())
}
