//! `cargo xtask <task>`: the project's tasks that are not a plain `cargo build`/`cargo test`.
//!
//! # Layout
//! - [`mod@test`]: the full test suite on the host kernel and, with `--vm`, inside a VM (kernel matrix).
//! - [`vm`]: boots Debian's stock kernel in qemu with the host filesystem shared over 9p.
//! - [`mod@bench`]: benchmarks that print figures and write results (never pass/fail on speed).
//! - [`fuzz`]: the cargo-fuzz targets and the differential run through the real datapath.

mod bench;
mod fuzz;
mod test;
mod vm;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "paceline project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Run the test suite (unit, privileged, and with --vm the same suite inside a VM).
    Test(test::Args),
    /// Boot the test VM and run a command in it.
    Vm(vm::Args),
    /// Run a benchmark; prints figures and writes JSON (and plots) under results/.
    Bench(bench::Args),
    /// Run every fuzzer (cargo-fuzz targets, the datapath differential) for --time seconds each.
    Fuzz(fuzz::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Test(a) => test::run(a),
        Task::Vm(a) => vm::run(a),
        Task::Bench(a) => bench::run(a),
        Task::Fuzz(a) => fuzz::run(a),
    }
}
