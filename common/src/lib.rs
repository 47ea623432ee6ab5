//! # paceline-common
//!
//! Shared by the eBPF datapath (`no_std`, compiled for the bpf target) and the user-side agent.
//!
//! # Layout
//! - [`abi`]: the kernel's constants both sides pass (helper and map flags), defined once.
//! - [`maps`]: every `#[repr(C)]` type that crosses a BPF map, with size assertions beside each.
//! - [`edt`]: Earliest-Departure-Time clock arithmetic (what the tc program computes per packet),
//!   and the log2 buckets of the delay histograms.
//! - [`codel`]: CoDel over an EDT departure queue (RFC 8289, decided at enqueue on the
//!   departure clock): parameters, state, the control law and the state machine.
//! - [`parse`]: the packet parser the tc program runs (generic over how bytes are read), so user
//!   space runs the same code as the reference (tests, fuzzing).
//! - [`classify`]: what the classifier looks at ([`classify::PacketInfo`]) and the linear
//!   first-match rule matcher, the reference the compiled classifier is tested against.
//! - [`ctab`]: the compiled classifier: the per-packet lookup both sides run, in a cost that
//!   does not grow with the number of rules.
//! - [`qjump`]: QJump network epoch and per-level rate limits (NSDI 2015).
//! - [`d3`]: D3 deadline-driven rate allocation (SIGCOMM 2011), cut by role: wire format,
//!   option scanning and checksum, units, host, router, capacity controller.
//! - [`trace`]: per-packet verdicts for `paceline trace` (the record, the filters, which clock bound).
//! - [`dasr`]: Dart's direct apportioning of sending rates for TCP: the option, counting the
//!   senders per local address in epochs, the share line / N.
#![no_std]
// The datapath cannot panic (there is no unwinding in BPF); tests may.
#![cfg_attr(not(test), deny(clippy::panic, clippy::unwrap_used, clippy::expect_used))]

pub mod abi;
pub mod classify;
pub mod codel;
pub mod ctab;
pub mod d3;
pub mod dasr;
pub mod edt;
pub mod maps;
pub mod parse;
pub mod qjump;
pub mod trace;
