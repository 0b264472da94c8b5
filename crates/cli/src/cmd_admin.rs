//! Admin verbs (`status`, `-s`, `-w` (watch), `health`, `quorum_status`, `mon`, `osd`,
//! `auth`, `config`, `tell`): the words go to `cairn_map::parse_command`
//! locally first (instant usage errors), then to the monitors over a
//! `MonClient`; the reply prints as Ceph-like text or JSON.
//! Flags understood anywhere among the words: `-c/--conf FILE`,
//! `-f/--format plain|json|json-pretty`, `-n/--name ENTITY`,
//! `-k/--keyring FILE`, `--connect-timeout SECS`.

use anyhow::{anyhow, bail, Context, Result};
use cairn_mon::{MonClient, DEFAULT_CLIENT_TIMEOUT};
use cairn_msg::{Credentials, Keyring};
use cairn_types::EntityName;
use std::path::PathBuf;
use std::time::Duration;

/// First words that make a command line an admin command.
pub const ADMIN_VERBS: &[&str] = &[
    "status",
    "-s",
    "-w",
    "health",
    "quorum_status",
    "mon",
    "osd",
    "auth",
    "config",
    "tell",
    "pg",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Plain,
    Json,
    JsonPretty,
}

struct AdminOpts {
    conf: Option<PathBuf>,
    format: Format,
    name: EntityName,
    keyring: Option<PathBuf>,
    timeout: Duration,
    words: Vec<String>,
    /// `-w`: print status changes and a recovery progress bar until Ctrl-C.
    watch: bool,
}

fn take_value(it: &mut std::slice::Iter<'_, String>, flag: &str) -> Result<String> {
    it.next()
        .cloned()
        .ok_or_else(|| anyhow!("{flag} needs a value"))
}

fn parse_opts(args: &[String]) -> Result<AdminOpts> {
    let mut o = AdminOpts {
        conf: std::env::var_os("CAIRN_CONF")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from),
        format: Format::Plain,
        name: EntityName::client("admin"),
        keyring: None,
        timeout: DEFAULT_CLIENT_TIMEOUT,
        words: Vec::new(),
        watch: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let value = |it: &mut std::slice::Iter<'_, String>| match &inline {
            Some(v) => Ok(v.clone()),
            None => take_value(it, flag),
        };
        match flag {
            "-c" | "--conf" => o.conf = Some(PathBuf::from(value(&mut it)?)),
            "-f" | "--format" => {
                o.format = match value(&mut it)?.as_str() {
                    "plain" => Format::Plain,
                    "json" => Format::Json,
                    "json-pretty" => Format::JsonPretty,
                    other => bail!("--format {other}: use plain, json or json-pretty"),
                }
            }
            "-n" | "--name" | "--id" => {
                let v = value(&mut it)?;
                let v = if v.contains('.') {
                    v
                } else {
                    format!("client.{v}")
                };
                o.name = v.parse().map_err(|e: String| anyhow!(e))?;
            }
            "-k" | "--keyring" => o.keyring = Some(PathBuf::from(value(&mut it)?)),
            "--connect-timeout" => {
                let v = value(&mut it)?;
                let secs: f64 = v
                    .parse()
                    .map_err(|_| anyhow!("--connect-timeout {v}: expected seconds"))?;
                if !(0.1..=3600.0).contains(&secs) {
                    bail!("--connect-timeout {v}: must be between 0.1 and 3600 seconds");
                }
                o.timeout = Duration::from_secs_f64(secs);
            }
            _ => o.words.push(a.clone()),
        }
    }
    if o.words.first().map(String::as_str) == Some("-s") {
        o.words[0] = "status".into();
    }
    if o.words.first().map(String::as_str) == Some("-w") {
        o.words[0] = "status".into();
        o.watch = true;
    }
    Ok(o)
}

/// Runs an admin command line (everything after `cairn`).
pub fn run(args: &[String]) -> Result<()> {
    let o = parse_opts(args)?;
    if o.words.is_empty() {
        bail!("no command given; 'cairn help' lists the commands");
    }
    let input = match cairn_map::input_file_arg(&o.words) {
        Some(p) => Some(std::fs::read(p).with_context(|| format!("reading input file {p}"))?),
        None => None,
    };
    let cmd = cairn_map::parse_command_with_input(&o.words, input.as_deref())
        .map_err(|e| anyhow!("{e}"))?;
    let conf = crate::conn::find_conf(o.conf.as_deref())?;
    let client = match &o.keyring {
        None => MonClient::from_conf(&conf, &o.name, o.timeout).map_err(|e| anyhow!("{e}"))?,
        Some(k) => {
            let ring = Keyring::load(k)?;
            let entry = ring
                .get(&o.name)
                .ok_or_else(|| anyhow!("keyring {} has no key for {}", k.display(), o.name))?;
            let c = cairn_types::Conf::load(&conf)?;
            let hosts = c
                .get(&o.name.to_string(), "mon_host")
                .ok_or_else(|| anyhow!("{}: no mon_host", conf.display()))?;
            let addrs = cairn_mon::parse_mon_host(hosts).map_err(|e| anyhow!("{e}"))?;
            MonClient::new(
                addrs,
                Credentials::Key {
                    name: o.name.clone(),
                    secret: entry.secret.clone(),
                },
                o.timeout,
            )
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if o.watch {
        return rt.block_on(watch(&client, &cmd));
    }
    let reply = rt
        .block_on(client.command(&cmd))
        .map_err(|e| anyhow!("{e}"))?;
    if let Some(out) = cairn_map::output_file_arg(&o.words) {
        std::fs::write(out, &reply.data).with_context(|| format!("writing {out}"))?;
        eprint!("{}", reply.plain);
        return Ok(());
    }
    match o.format {
        Format::Plain => {
            print!("{}", reply.plain);
            if !reply.plain.is_empty() && !reply.plain.ends_with('\n') {
                println!();
            }
        }
        Format::Json => println!("{}", reply.json),
        Format::JsonPretty => println!(
            "{}",
            serde_json::to_string_pretty(&reply.json).unwrap_or_default()
        ),
    }
    Ok(())
}

/// `cairn help`: every admin command with its usage.
pub fn help() {
    println!("Admin commands (run 'cairn --help' for daemon and tool commands):");
    for (usage, what) in cairn_map::command_help() {
        println!("  cairn {usage}\n      {what}");
    }
}

/// How often `cairn -w` asks for the status.
const WATCH_INTERVAL: Duration = Duration::from_secs(2);

/// One line summarising a `status` reply's JSON: health, PG states and
/// degraded/misplaced counts (printed when it changes).
fn watch_line(j: &serde_json::Value) -> String {
    let health = j["health"]["status"].as_str().unwrap_or("?");
    let pg = &j["pgmap"];
    let mut states: Vec<(u64, String)> = pg["pgs_by_state"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    (
                        s["count"].as_u64().unwrap_or(0),
                        s["state_name"].as_str().unwrap_or("?").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    states.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let states: Vec<String> = states.iter().map(|(n, s)| format!("{n} {s}")).collect();
    let mut line = format!("{health}; pgs: {}", states.join(", "));
    for (key, what) in [
        ("degraded_objects", "degraded"),
        ("misplaced_objects", "misplaced"),
    ] {
        if let Some(n) = pg[key].as_u64().filter(|n| *n > 0) {
            line.push_str(&format!(
                "; {n}/{} objects {what}",
                pg["degraded_total"].as_u64().unwrap_or(0)
            ));
        }
    }
    line
}

/// `cairn -w`: prints the status once, then a line whenever the summary
/// changes, with an indicatif progress bar while objects are degraded or
/// misplaced (rate and ETA from the monitor leader). Runs until Ctrl-C.
async fn watch(client: &MonClient, cmd: &cairn_map::MonCommand) -> Result<()> {
    let first = client.command(cmd).await.map_err(|e| anyhow!("{e}"))?;
    print!("{}", first.plain);
    let mut last = String::new();
    let mut bar: Option<indicatif::ProgressBar> = None;
    loop {
        let reply = tokio::select! {
            r = client.command(cmd) => r.map_err(|e| anyhow!("{e}"))?,
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        let line = watch_line(&reply.json);
        let pg = &reply.json["pgmap"];
        let copies = pg["degraded_total"].as_u64().unwrap_or(0);
        let remaining = pg["degraded_objects"].as_u64().unwrap_or(0)
            + pg["misplaced_objects"].as_u64().unwrap_or(0);
        if line != last {
            match &bar {
                Some(b) => b.println(format!("{}  {line}", now_hms())),
                None => println!("{}  {line}", now_hms()),
            }
            last = line;
        }
        if remaining > 0 && copies > 0 {
            let b = bar.get_or_insert_with(|| {
                let b = indicatif::ProgressBar::new(copies);
                if let Ok(style) = indicatif::ProgressStyle::with_template(
                    "recovery [{bar:30}] {percent:>3}% {msg}",
                ) {
                    b.set_style(style.progress_chars("=> "));
                }
                b
            });
            b.set_length(copies);
            b.set_position(copies.saturating_sub(remaining));
            let rate = match (
                pg["recovering_bytes_per_sec"].as_f64(),
                pg["recovering_objects_per_sec"].as_f64(),
            ) {
                (Some(bps), Some(ops)) => format!(
                    "{}/s, {ops:.0} objects/s",
                    cairn_map::format_bytes(bps as u64)
                ),
                _ => "measuring".into(),
            };
            let eta = pg["recovery_eta_secs"]
                .as_u64()
                .map(|s| format!(", ETA {}", cairn_map::format_age(s)))
                .unwrap_or_default();
            b.set_message(format!("{rate}{eta}"));
        } else if let Some(b) = bar.take() {
            b.finish_and_clear();
        }
        tokio::select! {
            _ = tokio::time::sleep(WATCH_INTERVAL) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

/// The local wall-clock time of day (display only).
fn now_hms() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let d = secs % 86_400;
    format!("{:02}:{:02}:{:02}", d / 3600, (d / 60) % 60, d % 60)
}
