//! `plexp qjump`: QJump ("Queues don't matter when you can JUMP them!"). A
//! latency-sensitive RPC flow at the top QJump level shares a switch port with bulk flows at the
//! lowest level: its latency idle, next to bulk traffic without levels, and with levels.
//!
//! # Setup
//! ```text
//!   s0 (RPC client) ─┐
//!   s1 (bulk)      ──┤                  ┌── rx   (RPC server, bulk sink)   <- the bottleneck
//!   s2 (bulk)      ──┼── sw (switch) ───┤
//!   s3 (bulk)      ──┘                  └── rx2  (bulk sink of the control run)
//! ```
//! `sw` is a router namespace whose ports toward `rx` and `rx2` are strict-priority switch ports
//! ([`paceline_tests::testbed::Shaper::StrictPriority`]): 20 Mbit/s (`--rate-mbit`), 8 queues of `BUFFER` bytes each,
//! a packet's queue chosen by its DSCP class selector (`DSCP >> 3`). Every sender runs the
//! agent. Two policies, switched by reloading the agents:
//!
//! - `flat`: one level, no rates, no DSCP rewrite: everything best effort, in queue 0;
//! - `qjump`: the RPC class (TCP to port 5001) at the top level (factor 1, DSCP 46 = EF, so
//!   queue 5 of the switch), everything else at the lowest level (factor `unlimited`, DSCP 0,
//!   queue 0). QJump parameters: n = 4 senders, P = 1514 B (one full frame), R = the port's
//!   rate, eps = 10 us; the agent computes the epoch `2nP/R + eps` and the top level's
//!   per-host rate `P / epoch` from them.
//!
//! The RPC client sends 64-byte requests for 64-byte responses over one TCP connection,
//! open loop at a fixed `RPC_RATE` per second (latency from the intended send time, so a
//! stalled connection shows up as latency). Bulk flows are long-lived TCP (cubic) uploads from
//! s1..s3 (round robin), started two seconds before the RPCs so the switch queue is full when
//! they begin.
//!
//! # Conditions
//! - `idle`: RPCs alone, `flat` policy: the reference.
//! - `no-levels`: RPCs and `k` bulk flows, `flat` policy: what bulk traffic does to them.
//! - `levels`: RPCs and `k` bulk flows, `qjump` policy: what QJump's levels give back.
//! - `idle-levels`: RPCs alone with the `qjump` policy: what the top level's rate limit alone
//!   costs.
//! - `levels-bulk-elsewhere`: `qjump` policy, the same `k` bulk flows sent to `rx2` through the
//!   switch's other port, so they load the (emulated) CPUs exactly as in `levels` but share no
//!   queue with the RPCs. Comparing it with `idle` separates what the machine adds to RPC
//!   latency under load (CPU contention, softirq work of the bulk packets) from what queueing
//!   at the switch adds.
//!
//! # Output
//! `qjump.json` (per condition: latency summary over all repetitions, per-repetition p99, bulk
//! goodput over the RPC window, switch queue counters, the agents' counters), `qjump-samples.json`
//! (every latency sample, compact), `qjump.md` (the table, the p99 ratio levels / idle and
//! whether the aim, within 1.5x, holds), `qjump.svg` (latency CDFs of idle, no-levels and
//! levels at the largest bulk load, log x), `qjump-controls.svg` (the CDFs of the controls) and
//! `qjump-p99.svg` (p99 against the number of bulk flows).

mod plan;
mod policy;
mod report;
mod run;

pub use plan::*;
use policy::*;
use report::*;
pub use run::*;
