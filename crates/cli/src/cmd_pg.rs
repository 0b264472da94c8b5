//! `cairn osd map POOL OBJ`, computed by the CLI from the map (the object
//! name hash is the OSDs' and clients', which the monitors do not link).
//! Every other `pg`/`osd` view (`pg stat|dump|ls|PGID query`, `osd df`) is
//! answered by the monitors from their PG statistics (`cmd_admin`).

use crate::conn;
use anyhow::{anyhow, bail, Result};
use cairn_map::ClusterMap;
use cairn_mon::DEFAULT_CLIENT_TIMEOUT;
use cairn_types::EntityName;
use std::path::PathBuf;

/// True when the words are a command this module answers.
pub fn handles(words: &[String]) -> bool {
    let w: Vec<&str> = words.iter().map(String::as_str).collect();
    matches!(w.as_slice(), ["osd", "map", _, _])
}

struct Opts {
    conf: Option<PathBuf>,
    json: bool,
    words: Vec<String>,
}

fn parse(args: &[String]) -> Result<Opts> {
    let mut o = Opts {
        conf: None,
        json: false,
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
        let w: Vec<&str> = o.words.iter().map(String::as_str).collect();
        match w.as_slice() {
            ["osd", "map", pool, obj] => osd_map(&map, pool, obj, o.json),
            _ => bail!("not an 'osd map POOL OBJECT' command"),
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
    let acting_prim = m
        .acting_primary
        .map(|x| x.to_string())
        .unwrap_or_else(|| "-1".into());
    if json {
        println!(
            "{}",
            serde_json::json!({"epoch": map.epoch.0, "pool": pool, "pool_id": p.id, "objname": obj,
                "raw_pgid": format!("{}.{:08x}", p.id, hash), "pgid": format!("{}.{:x}", p.id, seed),
                "up": m.up, "up_primary": m.primary, "acting": m.acting, "acting_primary": m.acting_primary})
        );
    } else {
        println!(
            "osdmap e{} pool '{pool}' ({}) object '{obj}' -> pg {}.{:08x} ({}.{:x}) -> up ([{}], p{prim}) acting ([{}], p{acting_prim})",
            map.epoch.0,
            p.id,
            p.id,
            hash,
            p.id,
            seed,
            list(&m.up),
            list(&m.acting)
        );
    }
    Ok(())
}
