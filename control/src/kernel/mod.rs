//! The kernel side: everything the agent asks of the running kernel.
//!
//! - [`datapath`]: the loaded eBPF object, typed maps and counter snapshots; [`banks`] writes a
//!   policy into the standby bank (changing only what differs) and switches banks; [`levels`]
//!   derives a level's counters from its classes'.
//! - [`bpfsys`]: the bpf(2) calls aya does not offer (inner maps, batch writes, RCU waits).
//! - [`attach`]: tc attachment (tcx or clsact) and sock_ops on the cgroup v2 root.
//! - [`qdisc`]: fq / mq+fq / HTB root qdiscs through `tc`, and their removal; [`qstats`] reads
//!   their queues and counters.
//! - [`persist`]: the maps and links pinned so the datapath outlives the agent, and their
//!   adoption by the next agent (a map's types fingerprinted by `build.rs`, whose
//!   `build/map_types.rs` is compiled here too for its tests).
//! - [`mounts`]: the BPF filesystem and the cgroup2 hierarchy the agent mounts itself where
//!   they are missing (`ip netns exec`, containers), and their unmount at a clean stop.
//! - [`features`]: what the running kernel offers, probed at start.
//! - [`sockdiag`]: TCP sockets' byte counters (sock_diag netlink) for `paceline flows`.
//! - [`memory`]: the kernel memory the datapath's maps take, from the kernel's own accounting.
pub mod attach;
pub mod banks;
pub mod bpfsys;
pub mod datapath;
pub mod features;
pub mod levels;
/// `build.rs`'s fingerprints of the maps' types, compiled here only for its tests.
#[cfg(test)]
#[path = "../../build/map_types.rs"]
mod map_types;
pub mod memory;
pub mod mounts;
pub mod persist;
pub mod qdisc;
pub mod qstats;
pub mod sockdiag;
