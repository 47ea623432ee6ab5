//! `cargo xtask bench <name>`: benchmarks. They print figures and write JSON (and plots) under
//! `results/`; they never pass or fail on speed.
//!
//! - `datapath`: the tc classifier's ns/packet per path against an empty classifier, via
//!   BPF_PROG_TEST_RUN on this machine's kernel (`plbench datapath`).

use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::vm::repo_root;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(clap::Subcommand)]
enum Bench {
    /// ns/packet of the tc classifier per path, against an empty classifier (host kernel).
    Datapath {
        /// Packets per trial (the kernel reports the mean per packet).
        #[arg(long, default_value_t = 1_000_000)]
        repeat: u32,
        /// Trials; the median is reported.
        #[arg(long, default_value_t = 15)]
        trials: u32,
    },
}

fn cargo_build_release(bins: &[&str]) -> Result<()> {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(repo_root()).args(["build", "--release", "--quiet", "-p", "paceline-tests"]);
    for b in bins {
        c.args(["--bin", b]);
    }
    if !c.status().context("running cargo build")?.success() {
        bail!("building {bins:?} failed");
    }
    Ok(())
}

pub fn run(a: Args) -> Result<()> {
    match a.bench {
        Bench::Datapath { repeat, trials } => {
            cargo_build_release(&["plbench"])?;
            let root = repo_root();
            let out = root.join("results/bench-datapath.json");
            let status = Command::new(root.join("target/release/plbench"))
                .args(["datapath", "--repeat", &repeat.to_string(), "--trials", &trials.to_string(), "--out"])
                .arg(&out)
                .status()
                .context("running plbench (as root: it loads BPF programs)")?;
            if !status.success() {
                bail!("plbench datapath failed");
            }
            Ok(())
        }
    }
}
