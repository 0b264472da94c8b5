//! The PG-statistics queries (`pg stat`, `pg dump [pgs_brief]`, `osd df
//! [tree]`, `pg PGID query`) rendered as Ceph-shaped text and JSON from the
//! map plus the leader's [`PgMapView`]. Deriving states and totals is
//! `pgmap`'s; this module only formats.

use crate::error::CommandError;
use crate::model::{ClusterMap, QueryContext, Reply};
use crate::pgmap::{PgMapView, PgTotals};
use crate::query::{format_bytes, table, Align};
use cairn_types::PgId;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// `N state` lines, most common state first (as `ceph -s` prints them).
pub(crate) fn state_lines(t: &PgTotals) -> Vec<String> {
    let mut v: Vec<(&String, &usize)> = t.by_state.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    v.into_iter().map(|(s, n)| format!("{n} {s}")).collect()
}

/// The recovery part of `status`: degraded/misplaced/unfound lines for
/// the data section, the `recovery:` io line, and a progress bar with an
/// ETA (remaining copies over the leader's measured object rate).
pub(crate) struct RecoveryLines {
    pub data: Vec<String>,
    pub io: Option<String>,
    pub progress: Option<Vec<String>>,
    pub eta_secs: Option<u64>,
}

/// Width of the text progress bar in `status`.
const PROGRESS_BAR_WIDTH: usize = 30;

pub(crate) fn recovery_lines(
    t: &PgTotals,
    rate: Option<&crate::pgmap::RecoveryRate>,
) -> RecoveryLines {
    let base = t.object_copies.max(1);
    let pct = |n: u64| n as f64 * 100.0 / base as f64;
    let mut data = Vec::new();
    if t.degraded_objects > 0 {
        data.push(format!(
            "{}/{} objects degraded ({:.3}%)",
            t.degraded_objects,
            t.object_copies,
            pct(t.degraded_objects)
        ));
    }
    if t.misplaced_objects > 0 {
        data.push(format!(
            "{}/{} objects misplaced ({:.3}%)",
            t.misplaced_objects,
            t.object_copies,
            pct(t.misplaced_objects)
        ));
    }
    if t.unfound_objects > 0 {
        data.push(format!("{} objects unfound", t.unfound_objects));
    }
    let remaining = t.degraded_objects + t.misplaced_objects;
    let io = rate.map(|r| {
        format!(
            "{}/s, {:.0} objects/s",
            format_bytes(r.bytes_per_sec as u64),
            r.objects_per_sec
        )
    });
    let eta_secs = rate
        .filter(|r| r.objects_per_sec > 0.0 && remaining > 0)
        .map(|r| (remaining as f64 / r.objects_per_sec).ceil() as u64);
    let progress = (remaining > 0).then(|| {
        let done = 1.0 - remaining as f64 / base as f64;
        let filled = ((done * PROGRESS_BAR_WIDTH as f64).round() as usize).min(PROGRESS_BAR_WIDTH);
        let eta = eta_secs
            .map(|s| format!("ETA {}", crate::query::format_age(s)))
            .unwrap_or_else(|| "ETA unknown: no recovery rate yet".into());
        vec![
            format!("Global Recovery Event ({eta})"),
            format!(
                "  [{}{}] ({:.1}% of object copies in place)",
                "=".repeat(filled),
                ".".repeat(PROGRESS_BAR_WIDTH - filled),
                done * 100.0
            ),
        ]
    });
    RecoveryLines {
        data,
        io,
        progress,
        eta_secs,
    }
}

fn list(v: &[i32]) -> String {
    let items: Vec<String> = v.iter().map(|o| o.to_string()).collect();
    format!("[{}]", items.join(","))
}

fn view(ctx: &QueryContext) -> PgMapView {
    ctx.runtime.health.pgmap.clone().unwrap_or_default()
}

impl ClusterMap {
    pub(crate) fn q_pg_stat(&self, ctx: &QueryContext) -> Reply {
        let t = self.pg_totals(&view(ctx));
        let mut plain = format!(
            "{} pgs: {}; {} data, {} used, {} / {} avail",
            t.num_pgs,
            state_lines(&t).join(", "),
            format_bytes(t.data_bytes),
            format_bytes(t.used_bytes),
            format_bytes(t.available_bytes),
            format_bytes(t.total_bytes)
        );
        if t.degraded_objects > 0 && t.object_copies > 0 {
            let _ = write!(
                plain,
                "; {}/{} objects degraded ({:.3}%)",
                t.degraded_objects,
                t.object_copies,
                t.degraded_objects as f64 * 100.0 / t.object_copies as f64
            );
        }
        plain.push('\n');
        let json = json!({
            "num_pgs": t.num_pgs,
            "by_state": t.by_state,
            "num_objects": t.objects,
            "data_bytes": t.data_bytes,
            "bytes_used": t.used_bytes,
            "bytes_avail": t.available_bytes,
            "bytes_total": t.total_bytes,
            "degraded_objects": t.degraded_objects,
            "misplaced_objects": t.misplaced_objects,
            "epoch": self.epoch.0,
        });
        Reply::new(plain, json)
    }

    pub(crate) fn q_pg_dump(&self, ctx: &QueryContext, brief: bool) -> Reply {
        let entries = self.pg_entries(&view(ctx));
        let mut rows = Vec::new();
        let mut js = Vec::new();
        for e in &entries {
            let acting = e.acting.clone();
            let primary = e
                .primary
                .map(|p| p.to_string())
                .unwrap_or_else(|| "-1".into());
            let acting_primary = e
                .acting_primary
                .map(|p| p.to_string())
                .unwrap_or_else(|| "-1".into());
            let r = e.report.as_ref();
            if brief {
                rows.push(vec![
                    e.pgid.to_string(),
                    e.state.clone(),
                    list(&e.up),
                    primary.clone(),
                    list(&acting),
                    acting_primary.clone(),
                ]);
            } else {
                let num = |f: fn(&crate::pgmap::PgReport) -> u64| {
                    r.map(|r| f(r).to_string()).unwrap_or_else(|| "0".into())
                };
                rows.push(vec![
                    e.pgid.to_string(),
                    num(|r| r.objects),
                    num(|r| r.degraded_objects),
                    num(|r| r.misplaced_objects),
                    num(|r| r.bytes),
                    num(|r| r.log_entries),
                    e.state.clone(),
                    r.map(|r| r.last_update.clone())
                        .unwrap_or_else(|| "0'0".into()),
                    list(&e.up),
                    primary.clone(),
                    list(&acting),
                    acting_primary.clone(),
                    crate::scrub::format_stamp(r.map(|r| r.scrub.last_scrub_stamp).unwrap_or(0)),
                    crate::scrub::format_stamp(
                        r.map(|r| r.scrub.last_deep_scrub_stamp).unwrap_or(0),
                    ),
                ]);
            }
            js.push(json!({
                "pgid": e.pgid.to_string(), "state": e.state,
                "up": e.up, "up_primary": e.primary, "acting": acting, "acting_primary": e.acting_primary,
                "last_update": r.map(|r| r.last_update.clone()), "log_tail": r.map(|r| r.log_tail.clone()),
                "log_size": r.map(|r| r.log_entries),
                "num_objects": r.map(|r| r.objects), "num_bytes": r.map(|r| r.bytes),
                "num_objects_degraded": r.map(|r| r.degraded_objects),
                "num_objects_misplaced": r.map(|r| r.misplaced_objects),
                "reported_epoch": r.map(|r| r.epoch),
                "recovery": r.map(|r| r.recovery),
                "last_scrub_stamp": r.map(|r| crate::scrub::format_stamp(r.scrub.last_scrub_stamp)),
                "last_deep_scrub_stamp": r.map(|r| crate::scrub::format_stamp(r.scrub.last_deep_scrub_stamp)),
                "scrub_errors": r.map(|r| r.scrub.errors),
            }));
        }
        let headers: Vec<(&str, Align)> = if brief {
            vec![
                ("PG_STAT", Align::Left),
                ("STATE", Align::Left),
                ("UP", Align::Left),
                ("UP_PRIMARY", Align::Right),
                ("ACTING", Align::Left),
                ("ACTING_PRIMARY", Align::Right),
            ]
        } else {
            vec![
                ("PG_STAT", Align::Left),
                ("OBJECTS", Align::Right),
                ("DEGRADED", Align::Right),
                ("MISPLACED", Align::Right),
                ("BYTES", Align::Right),
                ("LOG", Align::Right),
                ("STATE", Align::Left),
                ("VERSION", Align::Left),
                ("UP", Align::Left),
                ("UP_PRIMARY", Align::Right),
                ("ACTING", Align::Left),
                ("ACTING_PRIMARY", Align::Right),
                ("SCRUB_STAMP", Align::Left),
                ("DEEP_SCRUB_STAMP", Align::Left),
            ]
        };
        Reply::new(table(&headers, &rows), json!({ "pg_stats": js }))
    }

    pub(crate) fn q_osd_df(&self, ctx: &QueryContext, tree: bool) -> Reply {
        let v = view(ctx);
        let pgs = self.pgs_per_osd();
        struct Row {
            id: i32,
            size: u64,
            used: u64,
            avail: u64,
            reported: bool,
        }
        let mut rows_data = Vec::new();
        for o in self.osds.values() {
            let b = v.osds.get(&o.id).filter(|e| !e.stale).map(|e| &e.beacon);
            rows_data.push(Row {
                id: o.id,
                size: b.map(|b| b.total_bytes).unwrap_or(0),
                used: b.map(|b| b.used_bytes).unwrap_or(0),
                avail: b.map(|b| b.available_bytes).unwrap_or(0),
                reported: b.is_some(),
            });
        }
        let (tot_size, tot_used, tot_avail) = rows_data.iter().fold((0u64, 0u64, 0u64), |a, r| {
            (a.0 + r.size, a.1 + r.used, a.2 + r.avail)
        });
        let avg = if tot_size > 0 {
            tot_used as f64 / tot_size as f64
        } else {
            0.0
        };
        let util = |r: &Row| {
            if r.size > 0 {
                r.used as f64 / r.size as f64
            } else {
                0.0
            }
        };
        let mut by_host: BTreeMap<String, Vec<&Row>> = BTreeMap::new();
        for r in &rows_data {
            let host = self
                .crush
                .parent_of_type(r.id, "host")
                .or_else(|| self.osds.get(&r.id).map(|o| o.host.clone()))
                .unwrap_or_default();
            by_host
                .entry(if tree { host } else { String::new() })
                .or_default()
                .push(r);
        }
        let mut rows = Vec::new();
        let mut js = Vec::new();
        for (host, rs) in &by_host {
            if tree {
                let (s, u, a) = rs.iter().fold((0u64, 0u64, 0u64), |x, r| {
                    (x.0 + r.size, x.1 + r.used, x.2 + r.avail)
                });
                let p: usize = rs
                    .iter()
                    .map(|r| pgs.get(&r.id).copied().unwrap_or(0))
                    .sum();
                let pct = if s > 0 {
                    u as f64 * 100.0 / s as f64
                } else {
                    0.0
                };
                rows.push(vec![
                    "-".into(),
                    String::new(),
                    String::new(),
                    String::new(),
                    format_bytes(s),
                    format_bytes(u),
                    format_bytes(a),
                    format!("{pct:.2}"),
                    String::new(),
                    p.to_string(),
                    String::new(),
                    format!("host {host}"),
                ]);
            }
            for r in rs {
                let Some(o) = self.osds.get(&r.id) else {
                    continue;
                };
                let u = util(r);
                let var = if avg > 0.0 { u / avg } else { 0.0 };
                let n = pgs.get(&r.id).copied().unwrap_or(0);
                let mut status = if o.up { "up" } else { "down" }.to_string();
                let full = self.full_state(o.id);
                if full != crate::fullness::FullState::Ok {
                    status = format!("{status},{}", full.as_str());
                }
                let (size, used, avail, pct) = if r.reported {
                    (
                        format_bytes(r.size),
                        format_bytes(r.used),
                        format_bytes(r.avail),
                        format!("{:.2}", u * 100.0),
                    )
                } else {
                    ("-".into(), "-".into(), "-".into(), "-".into())
                };
                rows.push(vec![
                    o.id.to_string(),
                    o.device_class.clone().unwrap_or_default(),
                    format!("{:.5}", o.crush_weight),
                    format!("{:.5}", o.reweight),
                    size,
                    used,
                    avail,
                    pct,
                    format!("{var:.2}"),
                    n.to_string(),
                    status.clone(),
                    format!("{}osd.{}", if tree { "    " } else { "" }, o.id),
                ]);
                js.push(json!({
                    "id": o.id, "name": format!("osd.{}", o.id), "host": o.host,
                    "device_class": o.device_class, "crush_weight": o.crush_weight, "reweight": o.reweight,
                    "kb": r.size / 1024, "kb_used": r.used / 1024, "kb_avail": r.avail / 1024,
                    "utilization": u * 100.0, "var": var, "pgs": n, "status": status,
                    "reported": r.reported,
                }));
            }
        }
        let headers = [
            ("ID", Align::Right),
            ("CLASS", Align::Left),
            ("WEIGHT", Align::Right),
            ("REWEIGHT", Align::Right),
            ("SIZE", Align::Right),
            ("RAW USE", Align::Right),
            ("AVAIL", Align::Right),
            ("%USE", Align::Right),
            ("VAR", Align::Right),
            ("PGS", Align::Right),
            ("STATUS", Align::Left),
            ("NAME", Align::Left),
        ];
        let mut plain = table(&headers, &rows);
        let _ = writeln!(
            plain,
            "TOTAL  {}  {}  {}  {:.2}",
            format_bytes(tot_size),
            format_bytes(tot_used),
            format_bytes(tot_avail),
            avg * 100.0
        );
        if rows_data.iter().any(|r| !r.reported) {
            plain.push_str(
                "(- = no recent beacon from that OSD: it is down or cannot reach the monitors)\n",
            );
        }
        let json = json!({
            "nodes": js,
            "summary": { "total_kb": tot_size / 1024, "total_kb_used": tot_used / 1024,
                "total_kb_avail": tot_avail / 1024, "average_utilization": avg * 100.0 },
        });
        Reply::new(plain, json)
    }

    pub(crate) fn q_pg_query(&self, ctx: &QueryContext, pgid: PgId) -> Result<Reply, CommandError> {
        let m = self.pg_to_up(pgid.pool.0, pgid.seed)?;
        let entry = self
            .pg_entries(&view(ctx))
            .into_iter()
            .find(|e| e.pgid == pgid);
        let state = entry
            .as_ref()
            .map(|e| e.state.clone())
            .unwrap_or_else(|| "unknown".into());
        let scrub = entry.as_ref().and_then(|e| e.report.as_ref()).map(|r| {
            json!({
                "last_scrub_stamp": crate::scrub::format_stamp(r.scrub.last_scrub_stamp),
                "last_deep_scrub_stamp": crate::scrub::format_stamp(r.scrub.last_deep_scrub_stamp),
                "scrubbing": r.scrub.scrubbing,
                "errors": r.scrub.errors,
                "last_failure": r.scrub.last_failure,
                "pending_order": self.scrub_order(pgid).map(|o| {
                    if o.repair { "repair" } else if o.deep { "deep-scrub" } else { "scrub" }
                }),
            })
        });
        let report: Value = entry
            .and_then(|e| e.report)
            .map(|r| serde_json::to_value(r).unwrap_or(Value::Null))
            .unwrap_or(Value::Null);
        let json = json!({
            "pgid": pgid.to_string(), "epoch": self.epoch.0, "state": state,
            "up": m.up, "acting": m.acting, "up_primary": m.primary, "acting_primary": m.acting_primary,
            "pg_temp": self.pg_temp.get(&pgid),
            "scrub": scrub.unwrap_or(Value::Null),
            "primary_report": report,
        });
        let plain = serde_json::to_string_pretty(&json).unwrap_or_default() + "\n";
        Ok(Reply::new(plain, json))
    }
}
