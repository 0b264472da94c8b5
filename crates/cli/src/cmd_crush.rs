//! `cairn crush …` (placeholder while the CRUSH crate is written; replaced by its owner).
use crate::GlobalArgs;

#[derive(Debug, clap::Args)]
pub struct CrushArgs {}

pub fn run(_args: CrushArgs, _global: &GlobalArgs) -> anyhow::Result<()> {
    anyhow::bail!("cairn crush is not built yet")
}
