//! `plexp <experiment>`: the papers' experiments on the namespace testbed (see
//! `paceline_lab::experiments`). Needs root; run through `cargo xtask bench <experiment>` to
//! get a kernel that enforces EDT (the VM).

use clap::Parser;
use paceline_lab::experiments::{self, Common};

#[derive(Parser)]
#[command(about = "paceline experiments on the namespace testbed")]
enum Cli {
    /// Pacing conformance: configured vs achieved rates, per flow and aggregate, TCP and UDP.
    Pacing {
        #[command(flatten)]
        common: Common,
        /// Only classes of 10, 200 and 1,000 Mbit/s carrying 1, 4 and 16 TCP flows (for the
        /// host, where HTB enforces them).
        #[arg(long)]
        aggregates: bool,
    },
    /// QJump: RPC latency at a high level sharing a bottleneck with bulk traffic.
    Qjump {
        #[command(flatten)]
        common: Common,
        /// The switch port's rate in Mbit/s.
        #[arg(long, default_value_t = experiments::qjump::DEFAULT_RATE_MBIT)]
        rate_mbit: u64,
    },
    /// The TCP pacing study: N flows through a small-buffer bottleneck, paced or not.
    PacingStudy(Common),
    /// The D3 paper: application throughput of partition-aggregate deadlines against N.
    D3(Common),
    /// The incast study and Dart (DASR): goodput and block times against S servers.
    Incast(Common),
    /// AQM: a paced class's queue held by the horizon or by CoDel + ECN (needs sch_fq).
    Aqm(Common),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse() {
        Cli::Pacing { common, aggregates } => experiments::pacing::run(&common, aggregates),
        Cli::Qjump { common, rate_mbit } => experiments::qjump::run(&common, rate_mbit),
        Cli::PacingStudy(c) => experiments::study::run(&c),
        Cli::D3(c) => experiments::d3::run(&c),
        Cli::Incast(c) => experiments::incast::run(&c),
        Cli::Aqm(c) => experiments::aqm::run(&c),
    }
}
