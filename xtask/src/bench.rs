//! placeholder, filled in by its owner
#[derive(clap::Args)]
pub struct Args {}
pub fn run(_a: Args) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
