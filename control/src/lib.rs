//! # paceline
//!
//! The agent's library: the `paceline` binary only parses arguments and calls into it.
//!
//! # Layout
//! - [`datapath`]: the loaded eBPF object, typed maps, policy writes and counter snapshots.
pub mod datapath;
