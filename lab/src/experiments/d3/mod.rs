//! The D3 paper ("Better Never than Late", SIGCOMM 2011, section 6.1, Fig. 9 and 10):
//! partition-aggregate bursts through one bottleneck; application throughput (the share of
//! responses that arrive before their deadline) against the number of concurrent senders N,
//! for plain TCP, paced TCP, QJump levels and D3; and the largest N each supports at >= 99%
//! and >= 95%.
//!
//! # Setup
//! ```text
//!   s0 ─┐
//!   s1 ─┤                                       1 Gbit/s, 100 KB
//!   ..  ├── r (router, D3 router in the d3 modes) ──────────────── rx (aggregator)
//!   s7 ─┘
//! ```
//! A star ([`paceline_tests::testbed::Star`]) with [`Config::sender_hosts`] sender hosts. The
//! bottleneck is the router's egress toward the aggregator: HTB at 1 Gbit/s with a 100 KB bfifo
//! (the paper's switch buffer), or for the QJump mode a strict-priority port of the same rate
//! ([`paceline_tests::testbed::Shaper::StrictPriority`]) whose two used queues have 50 KB each (100 KB
//! in all). Offloads are off (one packet per skb), cubic everywhere.
//!
//! N workers are spread round-robin over the sender hosts (worker i on host `i % 8`): the
//! machine has 2 cores, so 40 namespaces each running an agent would be too heavy, and neither
//! the bottleneck nor D3's per-flow logic cares which host a flow comes from (the paper also
//! ran several workers per host). Each sender host runs one `plload serve` server (in this
//! process, inside the host's namespace) on port [`PORT`]; a worker is one persistent TCP
//! connection from the aggregator to it. The aggregator (`plload pa`, `pa::run`) sends a
//! query to all N workers at once; for each (query, worker) it draws a response size uniform in
//! [2 KB, 50 KB] and a deadline exponential with mean 20, 30 or 40 ms (seeded; the same draws
//! for every mode at a given N), the worker calls its response hook and writes the response,
//! and the response meets its deadline when its last byte reaches the aggregator within the
//! deadline from the moment the query was sent. The next query follows 10 ms after the last
//! response of the previous one. The first [`Config::warmup_queries`] queries of a point are
//! not scored.
//!
//! # Modes
//! - `tcp`: no agent on the senders; their veths keep `noqueue`, so TCP (cubic, initial window
//!   10, Linux's 200 ms minimum RTO) is not paced at all.
//! - `tcp-paper`: the same with the loss recovery of the paper's time: RACK and tail-loss
//!   probes off on the senders (`net.ipv4.tcp_recovery=0`, `net.ipv4.tcp_early_retrans=0`),
//!   so a lost tail waits for the retransmission timeout.
//! - `paced`: an agent on every sender (`enforcement: sockops`): the workers' class has
//!   `flow_rate` = the fair share of the bottleneck, 1 Gbit/s / N (wire rate), which sock_ops
//!   sets as each connection's SO_MAX_PACING_RATE: TCP paces itself. Deadline-unaware
//!   explicit fair sharing, the counterpart of the paper's RCPdc (without RCP's re-division
//!   as flows finish).
//! - `qjump`: QJump levels with deadline-aware level choice, the counterpart of the paper's
//!   TCPpr (two priority classes, short deadlines high): the worker's hook
//!   (`DeadlineMarkHook`) marks a response urgent (SO_MARK 1) when its deadline is below the
//!   distribution's median (mean x ln 2); the agent puts marked packets in the top QJump level
//!   (factor [`Config::qjump_factor`], DSCP 46, so the switch's queue 5) and the rest in the
//!   lowest (unlimited, DSCP 0, queue 0). QJump parameters n = 8 hosts, P = 1514 B,
//!   R = 1 Gbit/s, eps = 10 us; the agent enforces the level's per-host rate with HTB
//!   (`enforcement: auto`, no sch_fq on this kernel).
//! - `d3`: the router runs the agent with `spec.d3.router` on the bottleneck interface
//!   (capacity 1 Gbit/s), the aggregator runs it as D3 receiver, the senders with a D3 class
//!   for the workers' port (`enforcement: sockops`, `link_rate: 1Gbit`, which sets the quench
//!   cap and the scale of requests; the first RTT is the agent's default: one segment per RTT
//!   until the grant, a 2-segment initial window); the worker's `D3Hook` writes each
//!   response's size and deadline into the sender agent's pinned application map before
//!   writing it. Grants are enforced by TCP's own pacing (SO_MAX_PACING_RATE from sock_ops).
//! - variants: `d3-first-line` (the first RTT at the line rate), `d3-base-rate` (the defaults
//!   before 2026-12-02: the first RTT at 1% of the link, the kernel's initial window of 10)
//!   and `d3-iw10` (today's first RTT with the kernel's initial window).
//!
//! `tcp` and `paced` never look at deadlines, so each is run once per N and scored against all
//! three deadline means (the draws share their random numbers: the sizes are identical and the
//! deadlines scale with the mean, so these are exactly the draws the deadline-aware modes get).
//! `qjump` and `d3` are run once per (mean, N).
//!
//! # Measurements (per point)
//! App throughput with a 95% Wilson interval; response completion times; the bottleneck's
//! drops; the senders' TCP retransmissions, RTOs and tail-loss probes (`/proc/net/{snmp,
//! netstat}` of their namespaces); the sender agents' D3 counters (requests, grants, quenched,
//! met/missed, feedback_ignored) and the router link's (requests, new flows, FINs, duplicates,
//! idle resets, and C, N, D, A, queue sampled every [`ROUTER_SAMPLE_MS`] ms through its
//! `/status`); the load average.
//!
//! # Outputs (in `--out`)
//! `d3.json` (config, environment, one entry per (mode, mean, N), the supported-N table, the
//! raw completion times per measurement, the missed responses), `d3.md` (tables), `d3.svg`
//! (app throughput vs N at [`Config::plot_mean_ms`], the main modes and the computed ideal),
//! `d3-<mean>ms.svg` for each mean and `d3-variants.svg` (every series at the plot mean). The JSON and the table are
//! rewritten after every point, so an aborted run keeps what it measured.
//!
//! Development knobs (environment): `PLEXP_D3_MODES=tcp,d3` runs only these modes,
//! `PLEXP_D3_N=5,40` only these N, `PLEXP_D3_MEANS=30` only these means,
//! `PLEXP_D3_RESPONSES=100` about this many scored responses per point,
//! `PLEXP_D3_RATE_MBIT=400` another bottleneck rate (the policies' link rate, D3's capacity,
//! the paced share and QJump's R follow it), `PLEXP_D3_BACKGROUND=2` that many long
//! background flows ([`Config::background_flows`]) during every point, `PLEXP_D3_CAPTURE=1`
//! a packet capture at the aggregator (`tcpdump`) and each response's timeline
//! ([`timeline`]) in the point's `timeline`, with a table of where the missed deadlines'
//! time went in `d3.md`.

mod plan;
mod policy;
mod report;
mod run;
pub mod timeline;

pub use plan::*;
use policy::*;
use report::*;
pub use run::{run, run_with};
