//! The privileged integration suite: one binary, a flat list of modules.
//!
//! Every test that needs root or a kernel feature checks first and prints `SKIPPED: <why>`
//! when it cannot run. CI runs as root, on the host kernel and in the VM (`cargo xtask test`).

mod agent;
mod agent_scale;
mod alerts;
mod api_token;
mod classify_scale;
mod codel;
mod codel_e2e;
mod d3_e2e;
mod d3_router;
mod dasr;
mod dasr_e2e;
mod fleet;
mod flow_cache;
mod netns_exec;
mod ops;
mod pacing;
mod parse;
mod prometheus;
mod soak;
mod test_run;
mod trace;
mod untracked;

pub use paceline_tests::gate::{privileged, skip, under_tcg};
