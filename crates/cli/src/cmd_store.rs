//! `cairn store …` (placeholder while the store crate is written; replaced by its owner).
use crate::GlobalArgs;

#[derive(Debug, clap::Args)]
pub struct StoreArgs {}

pub fn run(_args: StoreArgs, _global: &GlobalArgs) -> anyhow::Result<()> {
    anyhow::bail!("cairn store is not built yet")
}
