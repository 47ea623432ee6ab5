//! # paceline
//!
//! The agent's library: the `paceline` binary only parses arguments and calls into it.
//!
//! # Layout
//! - [`cli`]: the subcommands (`agent`, `policy check|schema`, `status`, `cleanup`), one per file.
//! - [`agent`]: start-up, reload on file change or SIGHUP, clean shutdown.
//! - [`policy`]: YAML policy: raw (mirrors the file) -> validated -> compiled (map entries).
//! - [`datapath`]: the loaded eBPF object, typed maps, policy writes and counter snapshots.
//! - [`attach`]: tc attachment (tcx or clsact) and sock_ops on the cgroup v2 root.
//! - [`qdisc`]: fq / mq+fq / HTB root qdiscs through `tc`, and their removal.
//! - [`d3router`]: the D3 router links: the capacity controller's loop (counters and the queue
//!   in, C out; [`qstats`] reads the queue); the controller is `paceline_common::d3`.
//! - [`d3app`]: what applications call to give a socket a size and a deadline (D3).
//! - [`features`]: what the running kernel offers, probed at start.
//! - [`state`]: the lock and the record of host changes that a start after `kill -9` undoes.
//! - [`status`], [`metrics`], [`http`]: what the agent reports and how.
pub mod agent;
pub mod attach;
pub mod cli;
pub mod d3app;
pub mod d3router;
pub mod datapath;
pub mod features;
pub mod http;
pub mod metrics;
pub mod policy;
pub mod qdisc;
pub mod qstats;
pub mod state;
pub mod status;
