//! `cairn store …`: create, check and benchmark a per-disk object store.
//! Thin wrapper over `cairn_store`; owns argument parsing and printing only.

use crate::{GlobalArgs, OutputFormat};
use anyhow::Context;
use cairn_store::bench::{self, BenchOpts};
use cairn_store::{Store, StoreConfig};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct StoreArgs {
    #[command(subcommand)]
    cmd: StoreCmd,
}

#[derive(Debug, clap::Subcommand)]
enum StoreCmd {
    /// Create a new store (preallocates the data file).
    Mkfs {
        #[arg(long)]
        path: PathBuf,
        /// Data file size, e.g. 100G.
        #[arg(long, value_parser = parse_size)]
        data_bytes: u64,
        /// Checksum/allocation block size (4K..64K).
        #[arg(long, value_parser = parse_size, default_value = "4K")]
        block_size: u64,
        /// Put the metadata file in this directory (e.g. on an SSD).
        #[arg(long)]
        meta_path: Option<PathBuf>,
    },
    /// Check a store: metadata and extent map; --deep also verifies every block checksum.
    Fsck {
        #[arg(long)]
        path: PathBuf,
        #[arg(long)]
        deep: bool,
        #[arg(long)]
        meta_path: Option<PathBuf>,
    },
    /// Space usage of a store.
    Statfs {
        #[arg(long)]
        path: PathBuf,
        #[arg(long)]
        meta_path: Option<PathBuf>,
    },
    /// Write or read benchmark: N ops in flight, every write durable.
    Bench {
        /// Store directory (created if it holds no store).
        #[arg(long)]
        path: PathBuf,
        /// I/O size, e.g. 4M or 4K.
        #[arg(long, value_parser = parse_size, default_value = "4M")]
        size: u64,
        /// Operations in flight.
        #[arg(long, default_value_t = 16)]
        threads: usize,
        /// Threads that submit the writes, each keeping its share of the
        /// --threads commits in flight (as an OSD's few workers do);
        /// 0: one thread per operation, one blocking commit at a time (as
        /// fio's psync jobs). Reads always run one thread per operation.
        #[arg(long, default_value_t = 0)]
        drivers: usize,
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Random reads over a prefilled working set instead of writes.
        #[arg(long)]
        read: bool,
        /// store_cache_bytes.
        #[arg(long, value_parser = parse_size, default_value = "128M")]
        cache_bytes: u64,
        /// Data file size when the store is created.
        #[arg(long, value_parser = parse_size, default_value = "4G")]
        data_bytes: u64,
        #[arg(long, value_parser = parse_size, default_value = "4K")]
        block_size: u64,
    },
}

/// Parses `4096`, `4K`, `4M`, `1G`, `2T` (binary units; a trailing `B`/`iB` is allowed).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().trim_end_matches("iB").trim_end_matches(['B', 'b']);
    let (num, mult) = match t.chars().last() {
        Some(c @ ('k' | 'K' | 'm' | 'M' | 'g' | 'G' | 't' | 'T')) => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => 1 << 40,
            };
            (&t[..t.len() - 1], m)
        }
        _ => (t, 1),
    };
    let n: u64 = num.parse().map_err(|_| {
        format!("invalid size '{s}': use a number with an optional K, M, G or T suffix")
    })?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size '{s}' is too large"))
}

fn config(path: PathBuf, meta_path: Option<PathBuf>) -> StoreConfig {
    let mut c = StoreConfig::new(path);
    c.meta_path = meta_path;
    c
}

fn print<T: serde::Serialize>(
    global: &GlobalArgs,
    v: &T,
    plain: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    match global.format {
        OutputFormat::Plain => println!("{}", plain()),
        OutputFormat::Json => println!("{}", serde_json::to_string(v)?),
        OutputFormat::JsonPretty => println!("{}", serde_json::to_string_pretty(v)?),
    }
    Ok(())
}

pub fn run(args: StoreArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    match args.cmd {
        StoreCmd::Mkfs {
            path,
            data_bytes,
            block_size,
            meta_path,
        } => {
            let mut c = config(path.clone(), meta_path);
            c.data_bytes = data_bytes;
            c.block_size = u32::try_from(block_size).context("block size too large")?;
            let s = Store::create(c).with_context(|| format!("mkfs {}", path.display()))?;
            let st = s.statfs()?;
            print(global, &st, || {
                format!(
                    "created store at {} ({} bytes usable, block size {})",
                    path.display(),
                    st.total_bytes,
                    st.block_size
                )
            })
        }
        StoreCmd::Fsck {
            path,
            deep,
            meta_path,
        } => {
            let s = Store::open(config(path.clone(), meta_path))
                .with_context(|| format!("open {}", path.display()))?;
            let rep = if deep { s.deep_fsck()? } else { s.fsck()? };
            print(global, &rep, || {
                let mut out = format!(
                    "{} fsck of {}: {} collections, {} objects, {} extents, {} bytes mapped, {} bytes verified, {} issues",
                    if deep { "deep" } else { "shallow" },
                    path.display(),
                    rep.collections,
                    rep.objects,
                    rep.extents,
                    rep.data_bytes_mapped,
                    rep.data_bytes_verified,
                    rep.issues.len()
                );
                for i in &rep.issues {
                    out.push_str(&format!("\n  {}: {}", i.kind, i.detail));
                }
                out
            })?;
            if !rep.is_clean() {
                anyhow::bail!("fsck found {} issues", rep.issues.len());
            }
            Ok(())
        }
        StoreCmd::Statfs { path, meta_path } => {
            let s = Store::open(config(path.clone(), meta_path))
                .with_context(|| format!("open {}", path.display()))?;
            let st = s.statfs()?;
            print(global, &st, || {
                format!(
                    "total {} used {} available {} state {:?}",
                    st.total_bytes, st.used_bytes, st.available_bytes, st.state
                )
            })
        }
        StoreCmd::Bench {
            path,
            size,
            threads,
            drivers,
            seconds,
            read,
            cache_bytes,
            data_bytes,
            block_size,
        } => {
            if size == 0 || threads == 0 || seconds <= 0.0 {
                anyhow::bail!("--size, --threads and --seconds must be positive");
            }
            let opts = BenchOpts {
                path,
                io_bytes: size,
                threads,
                seconds,
                read,
                cache_bytes,
                data_bytes,
                block_size: u32::try_from(block_size).context("block size too large")?,
                drivers,
            };
            let r = bench::run(&opts).context("store bench")?;
            print(global, &r, || {
                format!(
                    "store bench {} size={} threads={} seconds={:.1}\n  {:.1} MB/s  {:.0} IOPS  lat p50 {} us  p99 {} us  max {} us\n  RSS peak {} MiB  end {} MiB  (store_cache_bytes {} MiB)",
                    r.mode,
                    r.io_bytes,
                    r.threads,
                    r.seconds,
                    r.mb_per_s,
                    r.iops,
                    r.lat_p50_us,
                    r.lat_p99_us,
                    r.lat_max_us,
                    r.rss_peak_bytes >> 20,
                    r.rss_end_bytes >> 20,
                    r.cache_bytes >> 20
                )
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("4M"), Ok(4 << 20));
        assert_eq!(parse_size("4MiB"), Ok(4 << 20));
        assert_eq!(parse_size("512"), Ok(512));
        assert!(parse_size("x").is_err());
    }
}
