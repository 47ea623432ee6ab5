//! # D3: deadline-driven rate allocation (Wilson et al., SIGCOMM 2011) and its wire format
//!
//! Pure, allocation-free, float-free integer math, called from both the eBPF programs and the
//! agent. `docs/d3.md` has the byte diagrams, the units, the exact router math and the
//! deviations from the paper; every number there comes from the constants in these modules.
//!
//! # Layout
//! Cut by role; everything is re-exported here, so callers write `d3::X`.
//! - `wire`: a 20-byte *request* option on data segments ([`D3Request`]) and a 12-byte
//!   *feedback* option on ACKs ([`D3Feedback`]), both TCP option kind 253 with the 16-bit
//!   ExID [`D3_EXID`] (RFC 6994), so stacks and routers that do not speak D3 skip them.
//!   Encode/decode over `[u8; N]` and fixed-offset accessors (`req_*`) for in-place rewriting.
//! - `segment`: the option inside a TCP segment: the option-list scanner
//!   ([`find_d3_option`]), copies in and out of the option area, and the incremental checksum
//!   update ([`csum_replace`], [`fold`]).
//! - `units`: rates are 1-byte unit counts; the unit is `2^(UNIT_SHIFT + scale)` bytes/s with
//!   a 4-bit per-request scale chosen by the sender ([`choose_scale`]); [`desired_rate`] and
//!   [`bytes_per_second`] divide without `u128`.
//! - `host`: the sender: [`demand`] (including quenching), [`D3FlowState`] (one request
//!   outstanding per flow; it turns feedback into a pacing rate).
//! - `router`: [`D3LinkConfig`], the [`D3LinkState`] aggregate counters, [`process_request`]
//!   (Snippet 1 of the paper plus burst tolerance, hop chaining and request caps) and
//!   [`router_rewrite`] (the same, in place on the option bytes).
//! - `controller`: the soft-state capacity controller, all of it: [`capacity_tick`] (the
//!   paper's formula), the step limit and standing-queue filter the agent runs it with
//!   ([`control_step`], [`StandingQueue`]) and the agent's link configuration
//!   ([`agent_link_config`]).
//!
//! Rules for the bpf target, kept throughout (outside the tests): no floats, no `u128`, no
//! allocation, no recursion, loops bounded by constants, no runtime-indexed `[]` and no
//! `enumerate()` (index loops with `.get()`: core's iterator counter keeps an overflow-panic
//! path when built with overflow checks), no `/` or `%` by runtime values (only `checked_*`),
//! saturating or wrapping arithmetic on anything that comes from a packet or a counter, no
//! `saturating_mul` / `checked_mul` on `u64` (LLVM lowers them to a 128-bit libcall the bpf
//! target lacks), no `core::fmt` on bpf (`Debug` is derived only off bpf).

mod controller;
mod host;
pub mod maps;
mod router;
mod segment;
mod units;
mod wire;

pub use controller::*;
pub use host::*;
pub use router::*;
pub use segment::*;
pub use units::*;
pub use wire::*;

#[cfg(test)]
mod simulation;
#[cfg(test)]
mod testutil;
