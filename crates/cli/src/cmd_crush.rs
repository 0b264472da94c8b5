//! `cairn crush …`: compile, decompile, test and build CRUSH maps with
//! crushtool-compatible flags. All placement logic lives in `cairn-crush`;
//! this module only reads/writes files and maps flags to library calls.

use crate::{GlobalArgs, OutputFormat};
use anyhow::{anyhow, bail, Context};
use cairn_crush::tester::{reweight_from_float, run_test, TestOptions};
use cairn_crush::{build_from_hosts, CrushMap, HostSpec};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Largest map file `cairn crush` reads.
const MAX_MAP_FILE_BYTES: u64 = 256 << 20;

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct CrushArgs {
    #[command(subcommand)]
    cmd: Option<CrushCmd>,
    /// crushtool form: decompile IN (same as `cairn crush decompile IN`).
    #[arg(short = 'd', value_name = "IN")]
    decompile: Option<PathBuf>,
    /// Output file for `-d` (stdout when absent).
    #[arg(short = 'o', value_name = "OUT")]
    out: Option<PathBuf>,
}

#[derive(Debug, clap::Subcommand)]
enum CrushCmd {
    /// Compile crushtool text into Cairn's binary form (docs/crush.md).
    Compile {
        /// Text map (as printed by `crushtool -d` or `cairn crush decompile`).
        input: PathBuf,
        #[arg(short = 'o', value_name = "OUT")]
        out: PathBuf,
    },
    /// Print a compiled (or text) map in crushtool text form.
    Decompile {
        input: PathBuf,
        #[arg(short = 'o', value_name = "OUT")]
        out: Option<PathBuf>,
    },
    /// Map inputs through rules and print what crushtool --test prints.
    Test(TestArgs),
    /// Make a map from a short host description.
    Build {
        /// NAME:CLASS=COUNTxWEIGHT[,…], e.g. alecto:hdd=6x5.458,ssd=1x0.91 (repeatable).
        #[arg(long = "host", required = true)]
        hosts: Vec<String>,
        /// Failure domain of the default replicated rule.
        #[arg(long, default_value = "host")]
        failure_domain: String,
        /// Write here instead of stdout.
        #[arg(short = 'o', value_name = "OUT")]
        out: Option<PathBuf>,
        /// Write the compiled (binary) form instead of text.
        #[arg(long)]
        compiled: bool,
    },
}

#[derive(Debug, clap::Args)]
struct TestArgs {
    /// Accepted for crushtool compatibility (`crushtool --test -i …`).
    #[arg(long = "test", hide = true)]
    _test: bool,
    /// Map file, compiled or text.
    #[arg(short = 'i', value_name = "MAP")]
    input: PathBuf,
    #[arg(long)]
    rule: Option<i32>,
    #[arg(long = "num-rep")]
    num_rep: Option<i32>,
    #[arg(long = "min-rep")]
    min_rep: Option<i32>,
    #[arg(long = "max-rep")]
    max_rep: Option<i32>,
    #[arg(long)]
    x: Option<i32>,
    #[arg(long = "min-x")]
    min_x: Option<i32>,
    #[arg(long = "max-x")]
    max_x: Option<i32>,
    /// Hash inputs with this pool id, as Ceph maps PGs.
    #[arg(long = "pool-id")]
    pool_id: Option<i32>,
    /// Reweight OSD to W (0.0–1.0) for this test; repeatable.
    #[arg(long, num_args = 2, value_names = ["OSD", "W"], action = clap::ArgAction::Append)]
    weight: Vec<String>,
    #[arg(long = "show-mappings")]
    show_mappings: bool,
    #[arg(long = "show-bad-mappings")]
    show_bad_mappings: bool,
    #[arg(long = "show-statistics")]
    show_statistics: bool,
    #[arg(long = "show-utilization")]
    show_utilization: bool,
}

pub fn run(args: CrushArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    match args.cmd {
        Some(CrushCmd::Compile { input, out }) => {
            let text = read_text(&input)?;
            let map = CrushMap::parse_text(&text)
                .map_err(|e| parse_error(&input, &e))?;
            write_out(Some(&out), &map.encode())
        }
        Some(CrushCmd::Decompile { input, out }) => decompile(&input, out.as_deref(), global),
        Some(CrushCmd::Test(t)) => test(t),
        Some(CrushCmd::Build { hosts, failure_domain, out, compiled }) => {
            let specs = hosts
                .iter()
                .map(|h| HostSpec::parse(h))
                .collect::<Result<Vec<_>, _>>()?;
            let map = build_from_hosts(&specs, &failure_domain)?;
            let bytes = if compiled { map.encode() } else { render(&map, global)?.into_bytes() };
            write_out(out.as_deref(), &bytes)
        }
        None => match args.decompile {
            Some(input) => decompile(&input, args.out.as_deref(), global),
            None => bail!("say what to do: cairn crush compile|decompile|test|build (or -d IN); see 'cairn crush --help'"),
        },
    }
}

fn render(map: &CrushMap, global: &GlobalArgs) -> anyhow::Result<String> {
    Ok(match global.format {
        OutputFormat::Plain => map.to_text(),
        OutputFormat::Json => serde_json::to_string(map)? + "\n",
        OutputFormat::JsonPretty => serde_json::to_string_pretty(map)? + "\n",
    })
}

fn decompile(input: &Path, out: Option<&Path>, global: &GlobalArgs) -> anyhow::Result<()> {
    let map = load_map(input)?;
    write_out(out, render(&map, global)?.as_bytes())
}

fn read_bytes(path: &Path) -> anyhow::Result<Vec<u8>> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("cannot read '{}'", path.display()))?;
    if meta.len() > MAX_MAP_FILE_BYTES {
        bail!(
            "'{}' is {} bytes, larger than the {} byte limit for a CRUSH map",
            path.display(),
            meta.len(),
            MAX_MAP_FILE_BYTES
        );
    }
    std::fs::read(path).with_context(|| format!("cannot read '{}'", path.display()))
}

fn read_text(path: &Path) -> anyhow::Result<String> {
    let bytes = read_bytes(path)?;
    String::from_utf8(bytes).map_err(|_| {
        anyhow!(
            "'{}' is not UTF-8 text; is it a compiled map? (use decompile)",
            path.display()
        )
    })
}

/// Loads a compiled map, or a text map when the file is not our binary form.
fn load_map(path: &Path) -> anyhow::Result<CrushMap> {
    let bytes = read_bytes(path)?;
    match CrushMap::decode(&bytes) {
        Ok(m) => Ok(m),
        Err(decode_err) => match std::str::from_utf8(&bytes) {
            Ok(text) => CrushMap::parse_text(text)
                .map_err(|e| parse_error(path, &e)),
            Err(_) => Err(anyhow!(
                "'{}' is neither a Cairn compiled map ({decode_err}) nor crushtool text; Ceph's binary maps must be decompiled with 'crushtool -d' first",
                path.display()
            )),
        },
    }
}

fn parse_error(path: &Path, e: &cairn_crush::ParseError) -> anyhow::Error {
    anyhow!(
        "{}:{}:{}: expected {}, found {}",
        path.display(),
        e.line,
        e.column,
        e.expected,
        e.found
    )
}

fn write_out(out: Option<&Path>, bytes: &[u8]) -> anyhow::Result<()> {
    match out {
        Some(p) if p != Path::new("-") => {
            std::fs::write(p, bytes).with_context(|| format!("cannot write '{}'", p.display()))
        }
        _ => {
            let mut so = std::io::stdout().lock();
            so.write_all(bytes)?;
            so.flush()?;
            Ok(())
        }
    }
}

fn test(t: TestArgs) -> anyhow::Result<()> {
    let map = load_map(&t.input)?;
    let mut opts = TestOptions {
        rule: t.rule,
        pool_id: t.pool_id,
        ..TestOptions::default()
    };
    if let Some(x) = t.x {
        opts.min_x = x;
        opts.max_x = x;
    }
    if let Some(a) = t.min_x {
        opts.min_x = a;
    }
    if let Some(b) = t.max_x {
        opts.max_x = b;
    }
    if opts.max_x < opts.min_x {
        bail!("--max-x {} is below --min-x {}", opts.max_x, opts.min_x);
    }
    opts.num_rep = match (t.num_rep, t.min_rep, t.max_rep) {
        (Some(n), _, _) => Some((n, n)),
        (None, Some(a), Some(b)) => Some((a, b)),
        (None, None, None) => None,
        _ => bail!("give --num-rep R, or both --min-rep and --max-rep"),
    };
    let mut weights = BTreeMap::new();
    for pair in t.weight.chunks(2) {
        let [osd, w] = pair else {
            bail!("--weight takes two values: OSD W")
        };
        let osd: i32 = osd
            .parse()
            .map_err(|_| anyhow!("--weight: '{osd}' is not an OSD id"))?;
        let w: f64 = w
            .parse()
            .map_err(|_| anyhow!("--weight: '{w}' is not a number"))?;
        weights.insert(osd, reweight_from_float(w));
    }
    opts.weights = weights;
    opts.show_mappings = t.show_mappings;
    opts.show_bad_mappings = t.show_bad_mappings;
    opts.show_statistics = t.show_statistics;
    opts.show_utilization = t.show_utilization;
    if !(opts.show_mappings
        || opts.show_bad_mappings
        || opts.show_statistics
        || opts.show_utilization)
    {
        bail!("nothing to show: add --show-mappings, --show-bad-mappings, --show-statistics or --show-utilization");
    }
    let text = run_test(&map, &opts);
    write_out(None, text.as_bytes())
}
