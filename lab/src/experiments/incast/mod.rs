//! The incast study ("Understanding TCP Incast Throughput Collapse") and Dart's DASR: a client asks S servers for one fragment each
//! and asks for the next block when all have arrived, through one shallow-buffered port in front
//! of the client; goodput, block completion time (median, p99), RTOs and drops against S, for
//! plain TCP, TCP with paceline's incast settings, static per-flow pacing and DASR. Then Dart's
//! micro-benchmark: the completion time of short fixed-size messages to the same client, alone
//! and next to competing bulk senders.
//!
//! # Setup
//! ```text
//!   s0 ─┐
//!   s1 ─┤                      rate, shallow bfifo
//!   ..  ├── r (router) ─────────────────────────── rx (client)
//!   s7 ─┘
//! ```
//! A star ([`paceline_tests::testbed::Star`]) with [`Config::sender_hosts`] server hosts; the bottleneck
//! is the router's egress toward the client: HTB at [`Config::rate_bps`] with a bfifo of
//! [`Config::buffer_bytes`] (the incast study's shallow-buffered top-of-rack port). Each server host
//! runs one `plload serve` server on [`PORT`] (in this process, in the host's namespace); the S
//! servers of a point are S connections, server i on host `i % sender_hosts` (the machine has 2
//! cores: S namespaces with an agent each would be too heavy; the port and DASR count flows,
//! not hosts). The client (`plload incast`, `incast::run`) opens the S connections, then asks
//! every server for one [`Config::fragment_bytes`] fragment per block, [`Config::blocks`]
//! blocks.
//!
//! # Modes
//! - `tcp`: no agent anywhere: Linux defaults (200 ms minimum RTO, delayed ACKs up to 40 ms;
//!   the servers' veths keep `noqueue`, so TCP is not paced).
//! - `tcp-tuned`: an agent on every host (servers and client) whose class for the service's
//!   port sets the incast study's mitigations: `rto_min: 5ms` and `delack_max: 5ms` (the study's 1 ms
//!   is below the two jiffies Linux takes at HZ=250; the policy validator warns about it).
//! - `paced`: an agent on every server with `flow_rate` = the fair share rate / S (wire rate).
//! - `dasr`: an agent on the client in DASR's receiver role (line rate [`Config::dasr_line`] of
//!   the port, RTT [`Config::dasr_rtt_us`]) and on every server in the sender role: each flow
//!   is capped at line / N, N being the flows the client counts as sending.
//! - `dasr-tuned`: both (what `policies/incast-dasr.yaml` ships).
//!
//! Agents enforce with `enforcement: sockops` on a kernel without sch_fq (TCP's own pacing at
//! SO_MAX_PACING_RATE) and `auto` with it (fq, EDT).
//!
//! # Measurements (per point)
//! Goodput (fragment bytes / time from the first request to the last byte), block completion
//! times (mean, median, p99, max), the servers' RTOs and retransmissions (`/proc/net/netstat`
//! of their namespaces) and the port's drops; in `dasr`, the client agent's counters (senders
//! counted, options written) and the servers' (options read, shares set).
//!
//! # Micro-benchmark
//! Per mode and for each C in [`Config::micro_competitors`]: the client asks host 0's server
//! for one [`Config::micro_message_bytes`] message at a time (closed loop, one connection) for
//! [`Config::micro_duration_s`], while C bulk TCP flows from the other hosts upload to a server
//! on the client. Median and p99 message completion time. In `paced` the flows are paced at
//! rate / (C + 1).
//!
//! # Outputs (in `--out`)
//! `incast.json`, `incast.md` (tables), `incast-goodput.svg` (goodput vs S, the study's shape),
//! `incast-p99.svg` (p99 block time vs S). Rewritten after every point.
//!
//! Development knobs (environment): `PLEXP_INCAST_MODES=tcp,dasr`, `PLEXP_INCAST_S=1,64`,
//! `PLEXP_INCAST_BLOCKS=20`, `PLEXP_INCAST_MICRO=0` (skip the micro-benchmark),
//! `PLEXP_INCAST_RATE_MBIT=400` (the port's rate; DASR advertises 95% of it),
//! `PLEXP_INCAST_BUFFER=65536` (bytes).

mod plan;
mod policy;
mod report;
mod run;

pub use plan::*;
use policy::*;
use report::*;
pub use run::*;
