//! The `cairn` command: one binary for every daemon, admin verb and tool.
//! Each subcommand group lives in its own `cmd_*` module; this file only
//! parses global flags and dispatches.

use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

mod cmd_crush;
mod cmd_store;

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
    /// Cluster config file (default: $CAIRN_CONF, then ./cairn.conf, then the dev cluster's).
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
    propagate_version = true
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Crush(args) => cmd_crush::run(args, &cli.global),
        Command::Store(args) => cmd_store::run(args, &cli.global),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
