//! The experiments of the seeds, run on the testbed with the agent (`plexp <name>`, normally
//! through `cargo xtask bench <name>`, which runs them inside the VM whose kernel has sch_fq).
//! Each writes `<out>/<name>.json` (results in the workload JSON shape), a markdown table
//! `<out>/<name>.md` and SVG plots into `<out>/`.
//!
//! # Layout
//! - [`pacing`]: pacing conformance (configured vs achieved, per flow and aggregate, TCP/UDP).
//! - [`qjump`]: seed 004: RPC latency at a high QJump level next to bulk traffic.
//! - [`study`]: seed 001: N flows through a small-buffer bottleneck, paced or not; N*.
//! - [`d3`]: seed 000 (D3): partition-aggregate deadlines vs senders, TCP / paced / QJump / D3.
//! - [`aqm`]: issue 11: a paced class's queue held by the horizon or by CoDel + ECN.
//! - [`incast`]: seeds 002 and 003: synchronized reads from S servers (TCP, tuned TCP, paced,
//!   DASR) and short messages next to bulk senders.

pub mod aqm;
pub mod d3;
pub mod harness;
pub mod incast;
pub mod pacing;
pub mod qjump;
pub mod study;

use std::path::PathBuf;

/// Options every experiment takes.
#[derive(clap::Args, Clone, Debug)]
pub struct Common {
    /// Where results, tables and plots go.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// A quicker, smaller run (fewer points, shorter durations) for smoke-testing the harness.
    #[arg(long)]
    pub quick: bool,
    /// Seed for every random draw.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}
