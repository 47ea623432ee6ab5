//! # paceline
//!
//! The agent's library: the `paceline` binary only parses arguments and calls into it.
//!
//! # Layout
//! - [`cli`]: the subcommands (`agent`, `policy check|schema|diff|history|rollback`, `status`,
//!   `reload`, `top`, `flows`, `trace`, `classify`, `events`, `fleet status`, `cleanup`), one per file.
//! - [`agent`]: the agent in stages: start-up ([`agent::run`]), host changes and their undo
//!   ([`agent::install`]), reloads ([`agent::reload`]), the event loop ([`agent::watch`]), the
//!   HTTP listeners ([`agent::http`]).
//! - [`kernel`]: the kernel side: the loaded datapath and its maps, the bpf(2) calls aya does
//!   not offer, tc and sock_ops attachment, root qdiscs and their statistics, pins and their
//!   adoption, the mounts the agent makes itself, the feature probe, sock_diag.
//! - [`runtime`]: what a running agent keeps: the shared state behind one lock, the record of
//!   host changes a start after `kill -9` undoes, health, the event log, the policy history.
//! - The policy compiler (raw -> validated -> compiled, and the classifier compiler) is the
//!   crate `paceline_policy`; what it asks of the host it asks through
//!   [`paceline_policy::HostFacts`], which [`host::SystemHost`] answers for this machine
//!   (interfaces, routes, link speeds, cgroup ids).
//! - Mechanisms' user side: [`d3router`] (the D3 router links: the capacity controller's loop,
//!   counters and the queue in, C out; the controller is `paceline_common::d3`), [`d3app`]
//!   (what applications call to give a socket a size and a deadline), [`dasr`] (DASR's
//!   interface configuration and its report).
//! - What the agent shows: [`status`] (the typed status model: `/status`, `status.json`,
//!   `paceline status`), [`metrics`] (the Prometheus text, one module per family),
//!   [`classify`] (which class, level and rule a 5-tuple gets), [`flows`] (the per-flow table
//!   as rows), [`trace`] (per-packet verdicts as lines, text and pcapng), [`fleet`] (the
//!   inventory of many agents, from Prometheus or their `/metrics`).
pub mod agent;
pub mod classify;
pub mod cli;
pub mod d3app;
pub mod d3router;
pub mod dasr;
pub mod fleet;
pub mod flows;
pub mod host;
pub mod kernel;
pub mod metrics;
pub mod runtime;
pub mod status;
pub mod trace;
