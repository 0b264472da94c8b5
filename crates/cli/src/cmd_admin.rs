//! Admin verbs (`status`, `-s`, `health`, `quorum_status`, `mon`, `osd`,
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
