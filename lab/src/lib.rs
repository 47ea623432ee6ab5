//! # paceline-lab
//!
//! What the repository measures, apart from what it tests: the papers' experiments and the
//! benchmarks, on the test crate's namespace testbed and workload generators. Nothing here
//! is part of the agent, and no test depends on it except the D3 effect test, which runs the
//! D3 experiment's workload at a small scale.
//!
//! # Layout
//! - [`experiments`]: one folder per experiment (`plan`, `policy`, `run`, `report`), run by
//!   `plexp`, normally in the VM through `cargo xtask bench <name>`.
//! - [`report`]: result JSON to markdown tables and SVG plots (`plreport`).
//! - `bin/plbench/`: the datapath benchmark (`datapath.rs`: BPF_PROG_TEST_RUN against the same
//!   run's reference), the same costs under real traffic (`traffic.rs`: the kernel's
//!   per-program statistics) and the policy apply benchmark (`apply.rs`).

pub mod experiments;
pub mod report;
