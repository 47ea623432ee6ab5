//! `plbench`: the repository's benchmarks, one module each.
//!
//! - `plbench datapath` ([`datapath`]): the tc classifier's cost per packet on each path, with
//!   BPF_PROG_TEST_RUN, against an empty classifier and a reference that does what Cilium's
//!   bandwidth manager does; at 1 to 100,000 rules.
//! - `plbench traffic` ([`traffic`]): the same programs' cost per packet under real TCP and
//!   UDP traffic through a veth pair, from the kernel's per-program statistics.
//! - `plbench apply` ([`apply`]): parsing, compiling and writing generated policies into the
//!   datapath, as the agent does on a reload, whole and after a one-rule edit.

mod apply;
mod datapath;
mod testrun;
mod traffic;

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;
use serde::Serialize;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(clap::Subcommand)]
enum Bench {
    /// ns per packet of the tc classifier, per path.
    Datapath {
        #[arg(long, default_value_t = 1_000_000)]
        repeat: u32,
        #[arg(long, default_value_t = 15)]
        trials: usize,
        /// The largest rule count of the scale rows (1, 64, 1k, 10k, 100k up to it).
        #[arg(long, default_value_t = 100_000)]
        max_rules: u32,
        /// Only the rows whose path contains one of these (comma-separated), besides the
        /// floor and the reference (for profiling one path).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// Write the results as JSON here.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// ns per packet of the tc programs under real traffic through a veth pair (the kernel's
    /// per-program statistics), paceline's against the floor and the reference.
    Traffic {
        #[arg(long, default_value_t = 5)]
        trials: usize,
        /// Seconds of traffic per program, traffic kind and trial.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// Only the kinds of traffic whose name contains one of these (e.g. "sendto x 64").
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Seconds to parse, validate, compile and write generated policies, whole and after a
    /// one-rule edit, and peak memory.
    Apply {
        /// Rule counts (after expansion), one row each.
        #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000,262144")]
        rules: Vec<u32>,
        /// Full applies per row, and measured edits per row.
        #[arg(long, default_value_t = 5)]
        trials: usize,
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

fn write_report(report: &impl Serialize, out: Option<PathBuf>) -> Result<()> {
    if let Some(out) = out {
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&out, serde_json::to_vec_pretty(report)?)?;
        println!("wrote {}", out.display());
    }
    Ok(())
}

fn main() -> Result<()> {
    match Cli::parse().bench {
        Bench::Datapath {
            repeat,
            trials,
            max_rules,
            only,
            out,
        } => datapath::datapath(repeat, trials, max_rules, only, out),
        Bench::Traffic {
            trials,
            seconds,
            only,
            out,
        } => traffic::traffic(trials, seconds, &only, out),
        Bench::Apply { rules, trials, out } => apply::apply(rules, trials, out),
    }
}

fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default()
}
