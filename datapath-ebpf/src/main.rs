//! # paceline datapath
//!
//! # Layout
//! - `ebpf::maps`: the maps, shared with the agent by name (`paceline_common::maps::names`).
//! - `ebpf::parse`: Ethernet/VLAN/IPv4/IPv6/L4 parsing with direct packet access.
//! - `ebpf::pacer`: EDT clocks (per flow, per class, per level).
//! - `ebpf::tag`: DSCP and PCP rewrites.
//! - `ebpf::sockops`: per-class TCP settings at connection time.
//! - `ebpf::tcp`: the socket helpers sock_ops shares (setsockopt wrappers, TCP's payload rate).
//! - `ebpf::d3host`, `ebpf::d3router`: D3 on end hosts (sock_ops callbacks) and routers (tc).
//! - `ebpf::dasr`: DASR: the tc ingress program (counting senders as a receiver, reading shares
//!   as a sender) and its sock_ops callbacks (writing the option, mirroring the share into
//!   SO_MAX_PACING_RATE).
//!
//! The benchmark's own programs are a separate object (`src/bench.rs`, `paceline-ebpf-bench`).
//!
//! Entry points are thin; the per-packet work is classify (`paceline_common::classify`),
//! pace, tag, count. Nothing logs per packet.
//!
//! Everything here is compiled for the bpf target only; on the host (`cargo build --workspace`)
//! this binary is an empty `main`.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// BPF compare-and-swap is reached through the intrinsics; see pacer::reserve.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[cfg(target_arch = "bpf")]
mod ebpf;
