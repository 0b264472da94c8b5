//! Read-only commands: status, trees, dumps, listings, auth and config
//! reads. Each builds plain text shaped like Ceph's output and the same
//! facts as JSON. Nothing here changes the map.

use crate::command::MonCommand;
use crate::error::CommandError;
use crate::model::{AuthEntity, ClusterMap, Pool, PoolKind, QueryContext, Reply};
use cairn_types::EntityName;
use serde_json::{json, Value};
use std::fmt::Write as _;

/// Column alignment in plain tables.
#[derive(Clone, Copy)]
pub(crate) enum Align {
    Left,
    Right,
}

/// Renders rows under headers, columns separated by two spaces, trailing
/// blanks trimmed.
pub(crate) fn table(headers: &[(&str, Align)], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|(h, _)| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
    }
    let mut out = String::new();
    let header_row: Vec<String> = headers.iter().map(|(h, _)| h.to_string()).collect();
    for row in std::iter::once(&header_row).chain(rows.iter()) {
        let mut line = String::new();
        for (i, (_, align)) in headers.iter().enumerate() {
            let cell = row.get(i).map(String::as_str).unwrap_or("");
            let pad = widths[i].saturating_sub(cell.chars().count());
            if i > 0 {
                line.push_str("  ");
            }
            match align {
                Align::Left => {
                    line.push_str(cell);
                    line.push_str(&" ".repeat(pad));
                }
                Align::Right => {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(cell);
                }
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Bytes the way Ceph prints them: `0 B`, `3.9 KiB`, `22 GiB`.
pub fn format_bytes(n: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 || v >= 10.0 {
        format!("{} {}", v.round() as u64, UNITS[u])
    } else {
        format!("{:.1} {}", v, UNITS[u])
    }
}

/// Durations like Ceph's ages: `45s`, `12m`, `2h`, `3d`.
pub fn format_age(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

fn weight5(w: f64) -> String {
    format!("{w:.5}")
}

/// The keyring text and JSON for one entity (`auth get`, `get-or-create`).
pub(crate) fn keyring_reply(entity: &EntityName, ent: &AuthEntity) -> Reply {
    let mut plain = format!("[{entity}]\n\tkey = {}\n", ent.key);
    for (svc, caps) in &ent.caps {
        let _ = writeln!(plain, "\tcaps {svc} = \"{caps}\"");
    }
    Reply::new(
        plain,
        json!([{ "entity": entity.to_string(), "key": ent.key, "caps": ent.caps }]),
    )
}

fn pretty(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string());
    s.push('\n');
    s
}

impl ClusterMap {
    /// Runs a read-only command.
    pub fn query(&self, cmd: &MonCommand, ctx: &QueryContext) -> Result<Reply, CommandError> {
        self.authorize(&ctx.caller, cmd)?;
        use MonCommand::*;
        match cmd {
            Status => Ok(self.q_status(ctx)),
            Health { detail } => {
                let report = self.health(&ctx.runtime.health);
                Ok(Reply::new(
                    report.to_plain(*detail),
                    report.to_json(*detail),
                ))
            }
            QuorumStatus => Ok(self.q_quorum_status(ctx)),
            MonStat => Ok(self.q_mon_stat(ctx)),
            MonDump => Ok(self.q_mon_dump()),
            OsdTree => Ok(self.q_osd_tree()),
            OsdDump => Ok(self.q_osd_dump()),
            OsdLs => {
                let ids: Vec<i32> = self.osds.keys().copied().collect();
                let plain: String = ids.iter().map(|i| format!("{i}\n")).collect();
                Ok(Reply::new(plain, json!(ids)))
            }
            OsdStat => Ok(self.q_osd_stat()),
            CrushRuleLs => {
                let names: Vec<String> = self.crush.rules().into_iter().map(|r| r.name).collect();
                let plain: String = names.iter().map(|n| format!("{n}\n")).collect();
                Ok(Reply::new(plain, json!(names)))
            }
            CrushRuleDump { name } => self.q_rule_dump(name.as_deref()),
            GetCrushMap => {
                let data = self.crush.encode();
                let mut r = Reply::new(
                    format!("got crush map from osdmap epoch {}\n", self.epoch.0),
                    json!({ "epoch": self.epoch.0, "bytes": data.len() }),
                );
                r.data = data;
                Ok(r)
            }
            EcProfileLs => {
                let names: Vec<&String> = self.ec_profiles.keys().collect();
                let plain: String = names.iter().map(|n| format!("{n}\n")).collect();
                Ok(Reply::new(plain, json!(names)))
            }
            EcProfileGet { name } => {
                let p = self.ec_profiles.get(name).ok_or_else(|| {
                    CommandError::not_found(format!(
                        "erasure-code profile '{name}' does not exist; 'cairn osd erasure-code-profile ls' lists them"
                    ))
                })?;
                let params = p.to_params();
                let plain: String = params.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
                Ok(Reply::new(plain, json!(params)))
            }
            PoolLs { detail } => Ok(self.q_pool_ls(*detail)),
            PoolGet { pool, key } => self.q_pool_get(pool, key),
            AuthLs => Ok(self.q_auth_ls()),
            AuthGet { entity } => {
                let ent = self.auth.get(entity).ok_or_else(|| {
                    CommandError::not_found(format!(
                        "entity {entity} does not exist; 'cairn auth ls' lists them"
                    ))
                })?;
                Ok(keyring_reply(entity, ent))
            }
            AuthPrintKey { entity } => {
                let ent = self.auth.get(entity).ok_or_else(|| {
                    CommandError::not_found(format!(
                        "entity {entity} does not exist; 'cairn auth ls' lists them"
                    ))
                })?;
                Ok(Reply::new(format!("{}\n", ent.key), json!(ent.key)))
            }
            PgMap { pgid } => self.q_pg_map(*pgid),
            PgStat => Ok(self.q_pg_stat(ctx)),
            PgDump { brief } => Ok(self.q_pg_dump(ctx, *brief)),
            OsdDf { tree } => Ok(self.q_osd_df(ctx, *tree)),
            PgQuery { pgid } => self.q_pg_query(ctx, *pgid),
            PgListInconsistent { pgid } => self
                .q_list_inconsistent(&ctx.runtime.health.pgmap.clone().unwrap_or_default(), *pgid),
            OsdBeacon { .. } | OsdFailureReport { .. } => Err(CommandError::invalid(format!(
                "'{}' is an OSD report for the monitor leader's runtime, not a query of the map",
                cmd.verb()
            ))),
            ConfigGet { who, key } => self.q_config_get(who, key.as_deref()),
            ConfigDump => Ok(self.q_config_dump()),
            OsdBlocklistLs => Ok(self.q_blocklist_ls()),
            _ => Err(CommandError::invalid(format!(
                "'{}' changes the map: submit it through the monitors (apply), not as a query",
                cmd.verb()
            ))),
        }
    }

    fn q_status(&self, ctx: &QueryContext) -> Reply {
        let rt = &ctx.runtime;
        let report = self.health(&rt.health);
        let mut s = String::new();
        let _ = writeln!(s, "  cluster:");
        let _ = writeln!(s, "    id:     {}", self.fsid);
        let _ = writeln!(s, "    health: {}", report.status.as_str());
        for c in &report.checks {
            let _ = writeln!(s, "            {}", c.summary);
        }
        let _ = writeln!(s, " ");
        let _ = writeln!(s, "  services:");
        let quorum = if rt.health.quorum.is_empty() {
            "unknown".to_string()
        } else {
            rt.health.quorum.join(",")
        };
        let _ = writeln!(
            s,
            "    mon: {} daemons, quorum {} (age {})",
            self.mons.len(),
            quorum,
            format_age(rt.quorum_age_secs)
        );
        let (n, up, inn) = self.osd_counts();
        let blocklisted = match self.blocklist.len() {
            0 => String::new(),
            1 => "; 1 blocklisted client".to_string(),
            b => format!("; {b} blocklisted clients"),
        };
        let _ = writeln!(s, "    osd: {n} osds: {up} up, {inn} in{blocklisted}");
        let _ = writeln!(s, " ");
        let _ = writeln!(s, "  data:");
        let pgs: u64 = self.pools.values().map(|p| u64::from(p.pg_num)).sum();
        let _ = writeln!(s, "    pools:   {} pools, {pgs} pgs", self.pools.len());
        let totals = rt.health.pgmap.as_ref().map(|v| self.pg_totals(v));
        let (used, total, avail) = match &totals {
            Some(t) => (t.used_bytes, t.total_bytes, t.available_bytes),
            None => {
                let (u, t) = self.usage_bytes();
                (u, t, t.saturating_sub(u))
            }
        };
        if let Some(t) = &totals {
            let _ = writeln!(
                s,
                "    objects: {} objects, {}",
                t.objects,
                format_bytes(t.data_bytes)
            );
        }
        let _ = writeln!(
            s,
            "    usage:   {} used, {} / {} avail",
            format_bytes(used),
            format_bytes(avail),
            format_bytes(total)
        );
        match &totals {
            Some(t) if pgs > 0 => {
                for (i, line) in crate::pgquery::state_lines(t).iter().enumerate() {
                    let head = if i == 0 {
                        "    pgs:     "
                    } else {
                        "             "
                    };
                    let _ = writeln!(s, "{head}{line}");
                }
            }
            None if pgs > 0 => {
                let _ = writeln!(s, "    pgs:     {pgs} unknown (no PG states reported yet)");
            }
            _ => {}
        }
        let recovery = totals.as_ref().map(|t| {
            crate::pgquery::recovery_lines(
                t,
                rt.health.pgmap.as_ref().and_then(|v| v.recovery.as_ref()),
            )
        });
        if let Some(r) = &recovery {
            for line in &r.data {
                let _ = writeln!(s, "             {line}");
            }
            if let Some(io) = &r.io {
                let _ = writeln!(s, " ");
                let _ = writeln!(s, "  io:");
                let _ = writeln!(s, "    recovery: {io}");
            }
            if let Some(p) = &r.progress {
                let _ = writeln!(s, " ");
                let _ = writeln!(s, "  progress:");
                for line in p {
                    let _ = writeln!(s, "    {line}");
                }
            }
        }
        let pgs_by_state: Vec<Value> = totals
            .as_ref()
            .map(|t| {
                t.by_state
                    .iter()
                    .map(|(k, v)| json!({ "state_name": k, "count": v }))
                    .collect()
            })
            .unwrap_or_default();
        let (objects, data_bytes) = totals
            .as_ref()
            .map(|t| (t.objects, t.data_bytes))
            .unwrap_or((0, 0));
        let json = json!({
            "fsid": self.fsid,
            "health": report.to_json(false),
            "election_epoch": self.epoch.0,
            "quorum_names": rt.health.quorum,
            "quorum_age": rt.quorum_age_secs,
            "monmap": { "epoch": self.epoch.0, "num_mons": self.mons.len() },
            "osdmap": { "epoch": self.epoch.0, "num_osds": n, "num_up_osds": up, "num_in_osds": inn,
                "num_blocklisted_clients": self.blocklist.len() },
            "pgmap": { "num_pools": self.pools.len(), "num_pgs": pgs, "pgs_by_state": pgs_by_state,
                "num_objects": objects, "data_bytes": data_bytes,
                "degraded_objects": totals.as_ref().map(|t| t.degraded_objects),
                "degraded_total": totals.as_ref().map(|t| t.object_copies),
                "misplaced_objects": totals.as_ref().map(|t| t.misplaced_objects),
                "unfound_objects": totals.as_ref().map(|t| t.unfound_objects),
                "recovering_bytes_per_sec": rt.health.pgmap.as_ref().and_then(|v| v.recovery.as_ref()).map(|r| r.bytes_per_sec),
                "recovering_objects_per_sec": rt.health.pgmap.as_ref().and_then(|v| v.recovery.as_ref()).map(|r| r.objects_per_sec),
                "recovery_eta_secs": recovery.as_ref().and_then(|r| r.eta_secs),
                "bytes_used": used, "bytes_avail": avail, "bytes_total": total },
        });
        Reply::new(s, json)
    }

    fn osd_counts(&self) -> (usize, usize, usize) {
        let n = self.osds.len();
        let up = self.osds.values().filter(|o| o.up).count();
        let inn = self.osds.values().filter(|o| o.is_in).count();
        (n, up, inn)
    }

    /// (used, total) bytes from what up OSDs reported at boot.
    fn usage_bytes(&self) -> (u64, u64) {
        self.osds
            .values()
            .filter(|o| o.up)
            .filter_map(|o| o.last_reported.as_ref())
            .fold((0, 0), |(u, t), r| (u + r.used_bytes, t + r.total_bytes))
    }

    fn q_quorum_status(&self, ctx: &QueryContext) -> Reply {
        let rt = &ctx.runtime;
        let ranks: Vec<u32> = self
            .mons
            .iter()
            .filter(|m| rt.health.quorum.contains(&m.name))
            .map(|m| m.rank)
            .collect();
        let json = json!({
            "quorum": ranks,
            "quorum_names": rt.health.quorum,
            "quorum_leader_name": rt.leader,
            "quorum_age": rt.quorum_age_secs,
            "monmap": self.monmap_json(),
        });
        Reply::new(pretty(&json), json)
    }

    fn monmap_json(&self) -> Value {
        json!({
            "epoch": self.epoch.0,
            "fsid": self.fsid,
            "mons": self.mons.iter().map(|m| json!({ "rank": m.rank, "name": m.name, "addr": m.addr })).collect::<Vec<_>>(),
        })
    }

    fn q_mon_stat(&self, ctx: &QueryContext) -> Reply {
        let rt = &ctx.runtime;
        let addrs: Vec<String> = self
            .mons
            .iter()
            .map(|m| format!("{}={}", m.name, m.addr))
            .collect();
        let in_q: Vec<&crate::model::MonInfo> = self
            .mons
            .iter()
            .filter(|m| rt.health.quorum.contains(&m.name))
            .collect();
        let leader = rt
            .leader
            .as_ref()
            .and_then(|l| self.mons.iter().find(|m| &m.name == l))
            .map(|m| format!("{} {}", m.rank, m.name))
            .unwrap_or_else(|| "unknown".into());
        let plain = format!(
            "e{}: {} mons at {{{}}}, leader {leader}, quorum {} {}\n",
            self.epoch.0,
            self.mons.len(),
            addrs.join(","),
            in_q.iter()
                .map(|m| m.rank.to_string())
                .collect::<Vec<_>>()
                .join(","),
            in_q.iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>()
                .join(","),
        );
        let json = json!({
            "epoch": self.epoch.0,
            "num_mons": self.mons.len(),
            "leader": rt.leader,
            "quorum": in_q.iter().map(|m| json!({ "rank": m.rank, "name": m.name })).collect::<Vec<_>>(),
            "mons": self.monmap_json()["mons"].clone(),
        });
        Reply::new(plain, json)
    }

    fn q_mon_dump(&self) -> Reply {
        let mut s = format!("epoch {}\nfsid {}\n", self.epoch.0, self.fsid);
        for m in &self.mons {
            let _ = writeln!(s, "{}: {} mon.{}", m.rank, m.addr, m.name);
        }
        Reply::new(s, self.monmap_json())
    }

    fn osd_status_cells(&self, id: i32) -> (String, String) {
        match self.osds.get(&id) {
            Some(o) => (
                if o.up { "up" } else { "down" }.to_string(),
                weight5(if o.is_in { o.reweight } else { 0.0 }),
            ),
            None => ("DNE".to_string(), weight5(0.0)),
        }
    }

    fn q_osd_tree(&self) -> Reply {
        let mut rows = Vec::new();
        let mut nodes = Vec::new();
        let tree = self.crush.tree();
        let mut shown = std::collections::BTreeSet::new();
        for n in &tree {
            let indent = "    ".repeat(n.depth);
            if n.id >= 0 {
                shown.insert(n.id);
                let (status, rew) = self.osd_status_cells(n.id);
                rows.push(vec![
                    n.id.to_string(),
                    n.class.clone().unwrap_or_default(),
                    weight5(n.weight),
                    format!("{indent}{}", n.name),
                    status.clone(),
                    rew.clone(),
                    weight5(1.0),
                ]);
                nodes.push(json!({ "id": n.id, "name": n.name, "type": "osd", "device_class": n.class,
                    "crush_weight": n.weight, "depth": n.depth, "status": status,
                    "reweight": self.osds.get(&n.id).map(|o| if o.is_in { o.reweight } else { 0.0 }).unwrap_or(0.0) }));
            } else {
                rows.push(vec![
                    n.id.to_string(),
                    String::new(),
                    weight5(n.weight),
                    format!("{indent}{} {}", n.type_name, n.name),
                    String::new(),
                    String::new(),
                    String::new(),
                ]);
                nodes.push(json!({ "id": n.id, "name": n.name, "type": n.type_name, "crush_weight": n.weight, "depth": n.depth }));
            }
        }
        // OSDs in the OSD map but not placed in the CRUSH hierarchy.
        for o in self.osds.values().filter(|o| !shown.contains(&o.id)) {
            let (status, rew) = self.osd_status_cells(o.id);
            rows.push(vec![
                o.id.to_string(),
                o.device_class.clone().unwrap_or_default(),
                weight5(0.0),
                format!("osd.{}", o.id),
                status.clone(),
                rew,
                weight5(1.0),
            ]);
            nodes.push(json!({ "id": o.id, "name": format!("osd.{}", o.id), "type": "osd", "crush_weight": 0.0, "depth": 0, "status": status }));
        }
        use Align::*;
        let plain = table(
            &[
                ("ID", Right),
                ("CLASS", Right),
                ("WEIGHT", Left),
                ("TYPE NAME", Left),
                ("STATUS", Right),
                ("REWEIGHT", Right),
                ("PRI-AFF", Right),
            ],
            &rows,
        );
        Reply::new(plain, json!({ "nodes": nodes }))
    }

    /// One `osd pool ls detail` / `osd dump` line, shaped like Ceph's.
    pub fn pool_line(&self, p: &Pool) -> String {
        let mut s = format!("pool {} '{}' {}", p.id, p.name, p.kind.as_str());
        if let Some(prof) = &p.ec_profile {
            let _ = write!(s, " profile {prof}");
        }
        let autoscale = self
            .config_value("mon", "osd_pool_default_pg_autoscale_mode")
            .unwrap_or_else(|| "on".into());
        let _ = write!(
            s,
            " size {} min_size {} crush_rule {} object_hash rjenkins pg_num {} pgp_num {} autoscale_mode {autoscale} last_change {}",
            p.size, p.min_size, p.crush_rule, p.pg_num, p.pgp_num, p.last_change.0
        );
        let mut flags = vec!["hashpspool"];
        if p.allow_ec_overwrites {
            flags.push("ec_overwrites");
        }
        if p.bulk {
            flags.push("bulk");
        }
        let _ = write!(s, " flags {}", flags.join(","));
        if p.quota_max_bytes > 0 {
            let _ = write!(s, " max_bytes {}", p.quota_max_bytes);
        }
        if p.quota_max_objects > 0 {
            let _ = write!(s, " max_objects {}", p.quota_max_objects);
        }
        if p.target_size_ratio > 0.0 {
            let _ = write!(s, " target_size_ratio {}", p.target_size_ratio);
        }
        let _ = write!(s, " stripe_width {}", p.stripe_width);
        if !p.applications.is_empty() {
            let apps: Vec<&str> = p.applications.keys().map(String::as_str).collect();
            let _ = write!(s, " application {}", apps.join(","));
        }
        s
    }

    fn pool_json(&self, p: &Pool) -> Value {
        let mut v = serde_json::to_value(p).unwrap_or(Value::Null);
        v["type"] = json!(p.kind.as_str());
        v["pool_name"] = json!(p.name);
        v["crush_rule_name"] = json!(self
            .crush
            .rules()
            .into_iter()
            .find(|r| r.id == p.crush_rule)
            .map(|r| r.name));
        v
    }

    fn osd_line(&self, o: &crate::model::OsdInfo) -> String {
        let full = match self.full_state(o.id) {
            crate::fullness::FullState::Ok => String::new(),
            s => format!(" {}", s.as_str()),
        };
        format!(
            "osd.{} {} {}{full} weight {} up_from {} up_thru {} down_at {} [{}] {} host {}",
            o.id,
            if o.up { "up  " } else { "down" },
            if o.is_in { "in " } else { "out" },
            weight5(o.reweight),
            o.up_from.0,
            o.up_thru.0,
            o.down_at.0,
            o.addrs.join(","),
            o.uuid,
            o.host,
        )
    }

    fn q_osd_dump(&self) -> Reply {
        let mut s = format!(
            "epoch {}\nfsid {}\ncreated e{}\n",
            self.epoch.0, self.fsid, self.created.0
        );
        let mut flags: Vec<&str> = self.flags.iter().map(|f| f.as_str()).collect();
        flags.extend(self.fullness_flags());
        let _ = writeln!(s, "flags {}", flags.join(","));
        let (ratios, ratios_json) = self.full_ratio_lines();
        s.push_str(&ratios);
        for p in self.pools.values() {
            let _ = writeln!(s, "{}", self.pool_line(p));
        }
        let max_osd = self.osds.keys().next_back().map(|m| m + 1).unwrap_or(0);
        let _ = writeln!(s, "max_osd {max_osd}");
        for o in self.osds.values() {
            let _ = writeln!(s, "{}", self.osd_line(o));
        }
        for (c, e) in &self.blocklist {
            let _ = writeln!(
                s,
                "blocklist {c} expires {} s after the leader saw it (added e{})",
                e.expire_secs, e.added.0
            );
        }
        let json = json!({
            "epoch": self.epoch.0,
            "fsid": self.fsid,
            "flags": flags.join(","),
            "pools": self.pools.values().map(|p| self.pool_json(p)).collect::<Vec<_>>(),
            "max_osd": max_osd,
            "osds": self.osds.values().collect::<Vec<_>>(),
            "full_ratio": ratios_json["full_ratio"],
            "backfillfull_ratio": ratios_json["backfillfull_ratio"],
            "nearfull_ratio": ratios_json["nearfull_ratio"],
            "osd_fullness": self.osd_fullness.iter().map(|(id, f)| json!({
                "osd": id, "state": f.state.as_str(), "used_bytes": f.used_bytes,
                "total_bytes": f.total_bytes, "percent": f.percent(),
            })).collect::<Vec<_>>(),
            "blocklist": self.blocklist.iter().map(|(c, e)| json!({
                "addr": c.to_string(), "added_epoch": e.added.0, "expire_secs": e.expire_secs,
            })).collect::<Vec<_>>(),
        });
        Reply::new(s, json)
    }

    fn q_osd_stat(&self) -> Reply {
        let (n, up, inn) = self.osd_counts();
        let mut flags: Vec<&str> = self.flags.iter().map(|f| f.as_str()).collect();
        flags.extend(self.fullness_flags());
        let mut plain = format!("{n} osds: {up} up, {inn} in; epoch: e{}", self.epoch.0);
        if !flags.is_empty() {
            let _ = write!(plain, "\n            flags {}", flags.join(","));
        }
        plain.push('\n');
        Reply::new(
            plain,
            json!({ "epoch": self.epoch.0, "num_osds": n, "num_up_osds": up, "num_in_osds": inn, "flags": flags.join(",") }),
        )
    }

    fn q_rule_dump(&self, name: Option<&str>) -> Result<Reply, CommandError> {
        let rule_json = |r: &cairn_crush::RuleInfo| {
            json!({
                "rule_id": r.id,
                "rule_name": r.name,
                "type": match r.rule_type { cairn_crush::RuleType::Replicated => "replicated", cairn_crush::RuleType::Erasure => "erasure" },
                "min_size": r.min_size,
                "max_size": r.max_size,
                "steps": r.steps_text,
            })
        };
        let json = match name {
            Some(n) => rule_json(&self.resolve_rule(n)?),
            None => Value::Array(self.crush.rules().iter().map(rule_json).collect()),
        };
        Ok(Reply::new(pretty(&json), json))
    }

    fn q_pg_map(&self, pgid: cairn_types::PgId) -> Result<Reply, CommandError> {
        let m = self.pg_to_up(pgid.pool.0, pgid.seed)?;
        let list = |v: &[i32]| {
            v.iter()
                .map(|o| o.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let plain = format!(
            "osdmap e{} pg {pgid} ({pgid}) -> up [{}] acting [{}]\n",
            self.epoch.0,
            list(&m.up),
            list(&m.acting)
        );
        let json = json!({
            "epoch": self.epoch.0,
            "pgid": pgid.to_string(),
            "raw": m.raw,
            "up": m.up,
            "up_primary": m.primary,
            "acting": m.acting,
            "acting_primary": m.acting_primary,
            "pg_temp": self.pg_temp.get(&pgid),
        });
        Ok(Reply::new(plain, json))
    }

    fn q_pool_ls(&self, detail: bool) -> Reply {
        if detail {
            let plain: String = self
                .pools
                .values()
                .map(|p| format!("{}\n", self.pool_line(p)))
                .collect();
            let json = Value::Array(self.pools.values().map(|p| self.pool_json(p)).collect());
            Reply::new(plain, json)
        } else {
            let names: Vec<&str> = self.pools.values().map(|p| p.name.as_str()).collect();
            let plain: String = names.iter().map(|n| format!("{n}\n")).collect();
            Reply::new(plain, json!(names))
        }
    }

    fn pool_value(&self, p: &Pool, key: &str) -> Option<Value> {
        Some(match key {
            "size" => json!(p.size),
            "min_size" => json!(p.min_size),
            "pg_num" => json!(p.pg_num),
            "pgp_num" => json!(p.pgp_num),
            "crush_rule" => json!(self
                .crush
                .rules()
                .into_iter()
                .find(|r| r.id == p.crush_rule)
                .map(|r| r.name)
                .unwrap_or_else(|| p.crush_rule.to_string())),
            "allow_ec_overwrites" if p.kind == PoolKind::Erasure => json!(p.allow_ec_overwrites),
            "erasure_code_profile" if p.kind == PoolKind::Erasure => json!(p.ec_profile),
            "bulk" => json!(p.bulk),
            "target_size_ratio" => json!(p.target_size_ratio),
            "quota_max_bytes" => json!(p.quota_max_bytes),
            "quota_max_objects" => json!(p.quota_max_objects),
            _ => return None,
        })
    }

    fn q_pool_get(&self, name: &str, key: &str) -> Result<Reply, CommandError> {
        let p = self.pool_by_name(name)?;
        let mut keys: Vec<&str> = crate::apply::POOL_SET_KEYS.to_vec();
        keys.push("erasure_code_profile");
        let wanted: Vec<&str> = if key == "all" {
            keys.clone()
        } else {
            vec![key]
        };
        let mut plain = String::new();
        let mut json = json!({ "pool": p.name, "pool_id": p.id });
        for k in wanted {
            match self.pool_value(p, k) {
                Some(v) => {
                    let shown = match &v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    let _ = writeln!(plain, "{k}: {shown}");
                    json[k] = v;
                }
                None if key == "all" => {}
                None => {
                    return Err(CommandError::invalid(format!(
                        "'{k}' is not a setting of pool '{name}'; known: {}",
                        keys.join(", ")
                    )))
                }
            }
        }
        Ok(Reply::new(plain, json))
    }

    fn q_auth_ls(&self) -> Reply {
        let mut plain = String::new();
        let mut list = Vec::new();
        for (name, ent) in &self.auth {
            let _ = writeln!(plain, "{name}\n\tkey: {}", ent.key);
            for (svc, caps) in &ent.caps {
                let _ = writeln!(plain, "\tcaps: [{svc}] {caps}");
            }
            list.push(json!({ "entity": name.to_string(), "key": ent.key, "caps": ent.caps }));
        }
        Reply::new(plain, json!({ "auth_dump": list }))
    }

    fn q_config_get(&self, who: &str, key: Option<&str>) -> Result<Reply, CommandError> {
        let who = crate::config::validate_section(who).map_err(CommandError::invalid)?;
        if let Some(key) = key {
            let key = crate::config::normalize_key(key);
            let value = self.config_value(&who, &key).ok_or_else(|| {
                CommandError::not_found(format!(
                    "option '{key}' is not set for {who} and is not a known option; 'cairn config dump' shows what is set"
                ))
            })?;
            return Ok(Reply::new(format!("{value}\n"), json!(value)));
        }
        // Every key set in a section `who` sees; the most specific wins.
        let mut seen = std::collections::BTreeMap::new();
        for section in crate::config::section_chain(&who).into_iter().rev() {
            for ((s, k), v) in &self.config {
                if *s == section {
                    seen.insert(k.clone(), (v.clone(), s.clone()));
                }
            }
        }
        let rows: Vec<Vec<String>> = seen
            .iter()
            .map(|(k, (v, s))| vec![k.clone(), v.clone(), s.clone()])
            .collect();
        let plain = table(
            &[
                ("OPTION", Align::Left),
                ("VALUE", Align::Left),
                ("FROM", Align::Left),
            ],
            &rows,
        );
        let json: serde_json::Map<String, Value> =
            seen.into_iter().map(|(k, (v, _))| (k, json!(v))).collect();
        Ok(Reply::new(plain, Value::Object(json)))
    }

    fn q_config_dump(&self) -> Reply {
        let rows: Vec<Vec<String>> = self
            .config
            .iter()
            .map(|((s, k), v)| vec![s.clone(), k.clone(), v.clone()])
            .collect();
        let plain = table(
            &[
                ("WHO", Align::Left),
                ("OPTION", Align::Left),
                ("VALUE", Align::Left),
            ],
            &rows,
        );
        let json: Vec<Value> = self
            .config
            .iter()
            .map(|((s, k), v)| json!({ "section": s, "name": k, "value": v }))
            .collect();
        Reply::new(plain, Value::Array(json))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_ages_format_like_ceph() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(3994), "3.9 KiB");
        assert_eq!(format_bytes(22 * 1024 * 1024 * 1024), "22 GiB");
        assert_eq!(format_age(30), "30s");
        assert_eq!(format_age(7200), "2h");
    }

    #[test]
    fn table_aligns_columns() {
        let t = table(
            &[("ID", Align::Right), ("NAME", Align::Left)],
            &[
                vec!["-1".into(), "root".into()],
                vec!["10".into(), "osd.10".into()],
            ],
        );
        assert_eq!(t, "ID  NAME\n-1  root\n10  osd.10\n");
    }
}
