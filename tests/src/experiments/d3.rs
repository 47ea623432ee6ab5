//! placeholder: written by its owner.

/// Runs the experiment.
pub fn run(_c: &super::Common) -> anyhow::Result<()> {
    anyhow::bail!("not written yet")
}
