//! # paceline
//!
//! The agent's library: the `paceline` binary only parses arguments and calls into it.
//!
//! # Layout
//! - [`cli`]: the subcommands (`agent`, `policy check|schema|diff|history|rollback`, `status`,
//!   `reload`, `top`, `flows`, `classify`, `events`, `fleet status`, `cleanup`), one per file.
//! - [`agent`]: the agent in stages: start-up ([`agent::run`]), host changes and their undo
//!   ([`agent::install`]), reloads ([`agent::reload`]), the event loop ([`agent::watch`]).
//! - The policy compiler (raw -> validated -> compiled, and the classifier compiler) is the
//!   crate `paceline_policy`; what it asks of the host it asks through
//!   [`paceline_policy::HostFacts`], which [`host::SystemHost`] answers for this machine.
//! - [`host`]: [`host::SystemHost`], the policy's host facts read from this machine
//!   (interfaces, routes, link speeds, cgroup ids).
//! - [`datapath`]: the loaded eBPF object, typed maps, policy writes and counter snapshots.
//! - [`bpfsys`]: the bpf(2) calls aya does not offer (inner maps, batch writes, RCU waits).
//! - [`attach`]: tc attachment (tcx or clsact) and sock_ops on the cgroup v2 root.
//! - [`qdisc`]: fq / mq+fq / HTB root qdiscs through `tc`, and their removal.
//! - [`d3router`]: the D3 router links: the capacity controller's loop (counters and the queue
//!   in, C out; [`qstats`] reads the queue); the controller is `paceline_common::d3`.
//! - [`d3app`]: what applications call to give a socket a size and a deadline (D3).
//! - [`persist`]: the maps and links pinned so the datapath outlives the agent, and their
//!   adoption by the next agent.
//! - [`mounts`]: the BPF filesystem and the cgroup2 hierarchy the agent mounts itself where
//!   they are missing (`ip netns exec`, containers), and their unmount at a clean stop.
//! - [`dasr`]: DASR's interface configuration, and its report (senders per local address,
//!   option counters, shares set) for `/status` and `/metrics`.
//! - [`features`]: what the running kernel offers, probed at start.
//! - [`state`]: the lock and the record of host changes that a start after `kill -9` undoes.
//! - [`status`]: the typed status model (`/status`, `status.json`, `paceline status`, the tests).
//! - [`metrics`]: the Prometheus text; the agent's `http` stage serves it with the API
//!   ([`agent::http`]: metrics and API listeners).
//! - [`shared`]: what the event loop, reloads and HTTP handlers share, behind one lock.
//! - [`health`]: `/healthz` and `/readyz` from the kernel's real state; the systemd watchdog.
//! - [`events`]: the structured event log (`/events`, `paceline events`).
//! - [`history`]: the policies applied, and rollback to one of them.
//! - [`classify`]: which class, level and rule a 5-tuple gets (`paceline classify`).
//! - [`flows`], [`sockdiag`]: the per-flow table as rows (`paceline flows`), with TCP sockets'
//!   bytes.
//! - [`fleet`]: the inventory of many agents, from Prometheus or their `/metrics`.
pub mod agent;
pub mod attach;
pub mod bpfsys;
pub mod classify;
pub mod cli;
pub mod d3app;
pub mod d3router;
pub mod dasr;
pub mod datapath;
pub mod events;
pub mod features;
pub mod fleet;
pub mod flows;
pub mod health;
pub mod history;
pub mod host;
pub mod metrics;
pub mod mounts;
pub mod persist;
pub mod qdisc;
pub mod qstats;
pub mod shared;
pub mod sockdiag;
pub mod state;
pub mod status;
