//! The `cairn` command: one binary for every daemon, admin verb and tool.
//! Each subcommand group lives in its own `cmd_*` module; this file only
//! parses global flags and dispatches.

use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

mod bench_pattern;
mod cmd_admin;
mod cmd_crush;
mod cmd_daemon;
mod cmd_dev;
mod cmd_disk;
mod cmd_pg;
mod cmd_rados;
mod cmd_rbd;
mod cmd_store;
mod conn;
mod heap;
mod osdhost;

/// Output shape shared by every command: Ceph-like plain text or JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum OutputFormat {
    #[default]
    Plain,
    Json,
    #[value(name = "json-pretty")]
    JsonPretty,
}

/// Flags every subcommand understands.
#[derive(Debug, Clone, clap::Args)]
pub struct GlobalArgs {
    /// Cluster config file (default: $CAIRN_CONF, then ./cairn.conf, then /etc/cairn/cairn.conf).
    #[arg(short = 'c', long = "conf", global = true, env = "CAIRN_CONF")]
    pub conf: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'f', long = "format", global = true, value_enum, default_value_t = OutputFormat::Plain)]
    pub format: OutputFormat,
}

#[derive(Debug, Parser)]
#[command(
    name = "cairn",
    version,
    about = "Cairn: distributed object, block, file and S3 storage for small clusters that grow",
    propagate_version = true,
    after_help = "Admin commands (sent to the monitors): status (-s), health [detail], quorum_status, \
mon ..., osd ..., auth ..., config ..., tell ... -- 'cairn help' lists them all.\n\
Admin flags: -c FILE, -f json|json-pretty, -n ENTITY, -k KEYRING, --connect-timeout SECS."
)]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// CRUSH maps: compile, decompile, test and build (crushtool-compatible flags).
    Crush(cmd_crush::CrushArgs),
    /// The per-disk object store: benchmark and consistency checks.
    Store(cmd_store::StoreArgs),
    /// Create a new cluster: fsid, admin key, first monitor; start the node daemon.
    Bootstrap(cmd_daemon::BootstrapArgs),
    /// Add this node as a monitor of an existing cluster, with a token from `cairn bootstrap`.
    Join(cmd_daemon::JoinArgs),
    /// Run this node's daemon (its mon and OSDs), or `daemon stop` it.
    Daemon(cmd_daemon::DaemonArgs),
    /// This node's disks: `disk add PATH`, `disk ls`, `disk zap PATH`.
    Disk(cmd_disk::DiskArgs),
    /// A one-machine dev cluster: `dev up [--dir D] [--osds 3] [--osd-size 10G] [--detach]`, `dev down`.
    Dev(cmd_dev::DevArgs),
    /// Block images: create, ls, info, resize, rm, du, cp, export, import, status, lock, serve (NBD), map/unmap.
    Rbd(cmd_rbd::RbdArgs),
}

/// Flags that take a value, so the verb detection can skip their values.
const VALUE_FLAGS: &[&str] = &[
    "-c",
    "--conf",
    "-f",
    "--format",
    "-n",
    "--name",
    "--id",
    "-k",
    "--keyring",
    "--connect-timeout",
];

/// The first word that is not a flag (or a flag's value).
fn first_verb(args: &[String]) -> Option<&str> {
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        if a == "-s" || a == "-w" {
            return Some(a);
        }
        if VALUE_FLAGS.contains(&a) {
            i += 2;
            continue;
        }
        if a.starts_with('-') {
            i += 1;
            continue;
        }
        return Some(a);
    }
    None
}

/// `cairn pg dump | head` closes stdout early: leave quietly with the
/// shell's broken-pipe status instead of a panic message. (SIGPIPE stays
/// ignored, as Rust sets it, so a closed socket is an error the daemons and
/// clients handle, never a silent death.)
fn exit_quietly_on_broken_stdout() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.contains("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default_hook(info);
    }));
}

fn main() -> ExitCode {
    exit_quietly_on_broken_stdout();
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let result = match first_verb(&raw) {
        // Scrub findings come from the monitors, not from a pool.
        Some("rados") if raw.iter().any(|a| a == "list-inconsistent-obj") => cmd_admin::run(&raw),
        Some("rados") => cmd_rados::run(&raw),
        Some("osd" | "pg") if cmd_pg::handles(&cmd_pg::words(&raw)) => cmd_pg::run(&raw),
        Some(v) if cmd_admin::ADMIN_VERBS.contains(&v) => cmd_admin::run(&raw),
        Some("help") if raw.len() == 1 => {
            cmd_admin::help();
            Ok(())
        }
        _ => {
            let cli = Cli::parse();
            match cli.command {
                Command::Crush(args) => cmd_crush::run(args, &cli.global),
                Command::Store(args) => cmd_store::run(args, &cli.global),
                Command::Bootstrap(args) => cmd_daemon::bootstrap(args, &cli.global),
                Command::Join(args) => cmd_daemon::join(args, &cli.global),
                Command::Daemon(args) => cmd_daemon::run(args, &cli.global),
                Command::Disk(args) => cmd_disk::run(args, &cli.global),
                Command::Dev(args) => cmd_dev::run(args, &cli.global),
                Command::Rbd(args) => cmd_rbd::run(args, &cli.global),
            }
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
