//! The TCP pacing study ("TCP Pacing in Data Center Networks", Ghobadi and Ganjali): N long-lived TCP flows
//! through a small-buffer bottleneck, unpaced, paced per flow, and paced per host plus per
//! flow; bottleneck utilisation, drop rate, mean / p99 / worst flow completion time against N,
//! and the point of inflection N* past which pacing stops helping.
//!
//! # Setup
//! A star (dumbbell): `S` sender hosts -> router -> receiver. The bottleneck is the router's
//! egress toward the receiver: HTB at [`Config::rate_bps`] with a bfifo leaf of
//! `buffer_pkts` full frames (1514 bytes each). The ACK path (receiver egress) carries a netem
//! delay, which sets the RTT and so the bandwidth-delay product. Offloads are off (one packet
//! per skb), congestion control is cubic everywhere.
//!
//! The buffers are fractions of the bandwidth-delay product measured at the start
//! ([`Config::buffers_bdp`], the slides' 2-7%), in whole frames. A point is (repetition,
//! buffer, mode, N); the repetitions are the outermost loop. Its N flows are spread round-robin over `min(S, N)` senders;
//! they start together (each after a seeded random offset in `[0, start_jitter_ms)`), each
//! uploads [`Config::flow_bytes`] to one server on the receiver, and the round ends when the
//! last one completes. Rounds repeat until the point has at least [`Config::samples`] flows.
//! The modes:
//! - `unpaced`: no agent; the senders' veths keep their `noqueue` root, so TCP is not paced at
//!   all (no fq, no SO_MAX_PACING_RATE): windows leave back to back.
//! - `per-flow`: an agent on every sender with a class for the study's port whose `flow_rate`
//!   is the fair share `rate / N` (rounded down to whole bytes/s).
//! - `per-host`: the same plus a `rate` on the class's level: the host's share of the
//!   bottleneck, `rate * n_h / N` for a host with `n_h` of the N flows (`rate / S` when S
//!   divides N).
//!
//! Each agent runs in its sender's namespace with its own state directory and enforces with
//! what the kernel offers (`enforcement: auto`): fq + EDT in the VM, HTB + TCP's own pacing on
//! a kernel without sch_fq.
//!
//! # Measurements (per point)
//! - FCT: the client's view, from `connect()` to the receiver's one-byte acknowledgement of
//!   the whole flow (so it includes the handshake and half an RTT for the acknowledgement).
//!   Mean, nearest-rank p50/p99 and max over all flows of all rounds.
//! - Utilisation: bytes the bottleneck qdisc dequeued during the point (frames, retransmissions
//!   included) / (rate x active time), active time being the sum over rounds of first flow
//!   start to last flow completion.
//! - Drop rate: drops of the bottleneck's bfifo / packets offered to it (sent + dropped).
//! - Also: TCP retransmissions (TCP_INFO), drops at the senders' own qdiscs and the agents'
//!   horizon drops (pacing must not simply move the losses to the host).
//!
//! # N*
//! For each buffer, paced mode and metric (p99 FCT, mean FCT, drop rate): the smallest
//! measured N at which pacing is no longer better than no pacing by more than [`TOLERANCE`]
//! (5%), e.g. `p99_unpaced < (1 + 0.05) * p99_paced`, after it was better at a smaller N;
//! "> max N" when it helps up to the largest N. Located on the pooled results (FCTs of every
//! repetition's flows, mean drop rate) and in each repetition, whose spread is its
//! uncertainty; the report sets it next to the slides' 8 (Aggarwal) and 9 (Kulik).
//!
//! # Outputs (in `--out`)
//! `pacing-study.json` (config, environment, one workload-shaped result per point, the pooled
//! cells, N*), `pacing-study.md` (tables), and per buffer the slides' four panels
//! `pacing-study-{utilisation,drops,mean-fct,p99-fct}-b<pkts>.svg`. The JSON is rewritten after every point, so an aborted run keeps what
//! it measured.

mod plan;
mod policy;
mod report;
mod run;

pub use plan::*;
use policy::*;
use report::*;
pub use run::*;
