//! `plexp pacing`: pacing conformance. Does a flow, a class or a level configured at rate R
//! leave the host at R?
//!
//! # Setup
//! Two hosts, `tx` and `rx`, joined by two veth links: one at MTU 1500 and one at MTU 9000 (the
//! rates TCG emulation cannot reach with 1500-byte frames). No bottleneck: the only thing that
//! can hold a flow back is the agent on `tx`, which runs one policy for the whole experiment
//! with a class (or two) per measurement point, each matched by protocol and destination port:
//!
//! - `flow`: one flow in a class with `flow_rate: R` (TCP and UDP, 10 Mbit/s up to 200 Mbit/s
//!   at MTU 1500, 500 Mbit/s and 1 Gbit/s at MTU 9000);
//! - `class`: four flows in one class with `class_rate: R` (the EDT clock of the class);
//! - `level`: two classes of two flows each in a level with `rate: R` (the level's clock);
//! - `unpaced`: the same kind of flows in a class without any rate: the control, which shows
//!   what the sender reaches when nothing paces it (so that the paced points are limited by the
//!   pacer, not by the sender or the emulator).
//!
//! TCP flows are bulk uploads (cubic). UDP flows send datagrams of MTU - 28 bytes at 1.5x the
//! configured rate (split over the point's flows), so that the pacer, not the sender, limits
//! them. Points run one after the other (one at a time), `reps` times each.
//!
//! # What is measured, per point
//! - The wire rate: `tx_bytes` of the sender's veth (frames as the pacer counts them: the
//!   Ethernet header included, no FCS or preamble, which is what paceline's rates mean) over a
//!   steady-state window that skips the first seconds (slow start, the first queue) and the
//!   last one; read from `/proc/thread-self/net/dev` in the sender's namespace, so a sample
//!   costs microseconds, not a process. Also its spread: the lowest and highest 1-second rate.
//! - The goodput at the receiver over the same window (payload bytes counted by the in-process
//!   `plload serve` server), per flow and summed; Jain's index over the flows.
//! - UDP: the receiver's loss over the whole flow (datagrams sent minus received), with its two
//!   causes: the pacer's horizon drops on the sender and the receiver's socket-buffer overflows
//!   (`Udp: RcvbufErrors`).
//! - The agent's counters of the point's classes (and level): packets, packets it delayed, the
//!   delay it added, horizon drops; and the enforcement mode it chose.
//! - The sender's offered rate (what `plload bulk` handed to the kernel).
//!
//! Output: `pacing.json` (everything, per point and repetition), `pacing.md` (the table),
//! `pacing.svg` (achieved against configured, with y = x) and `pacing-ratio.svg` (achieved /
//! configured against configured, log x).

mod plan;
mod policy;
mod report;
mod run;

use plan::*;
use policy::*;
use report::*;
pub use run::*;
