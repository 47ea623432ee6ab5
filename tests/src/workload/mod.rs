//! Workload generators: one server that serves every workload ([`serve`]) and four clients
//! ([`bulk`], [`rpc`], [`pa`] partition-aggregate, [`incast`]). They are plain blocking sockets
//! and threads (2 cores: no busy loops; timed sends sleep with 1 ns timer slack). Each is a
//! library function returning a serde report and a subcommand of the `plload` binary that
//! prints the same report as JSON (stdout, or `--out FILE`). Randomness comes from a seeded
//! RNG, so a run is reproducible given its `--seed`; timestamps are `CLOCK_MONOTONIC`, which
//! all namespaces share (so one-way delays between hosts of one machine are meaningful).
//!
//! # Wire protocol ([`proto`])
//! A TCP connection to the server starts with a 4-byte magic: `PLBK` + flow id + byte count
//! opens a bulk upload (the server counts bytes, acks a sized flow with one byte when complete,
//! and closes after the client's FIN); `PLRQ` starts a stream of 48-byte requests, each
//! answered by `resp_len` bytes that begin with a 24-byte header echoing the request's id and
//! timestamp. UDP datagrams to the same port are bulk data (`PLBU`, sequence-numbered and
//! timestamped), bulk end markers (`PLBF`) or requests (`PLRQ`, answered with one datagram).
//! A request can carry a size and a deadline: the server hands both to a [`hook::ResponseHook`]
//! with the socket fd right before it writes the response (the attach point for D3).
//!
//! # JSON results (schema version 1)
//! Every report has the same envelope, so that `plreport` can treat them alike:
//!
//! ```text
//! {
//!   "kind": "serve" | "bulk" | "rpc" | "pa" | "incast",
//!   "version": 1,
//!   "tags": { "<key>": "<value>", ... },   // free-form labels from --tag key=value
//!   "params": { ... },                     // the options the run used
//!   "summary": { "<metric>": number, ... },// flat scalars: what tables and xy plots read
//!   ...                                     // kind-specific details below
//! }
//! ```
//!
//! - `serve` ([`serve::ServeReport`]): summary `tcp_flows, udp_flows, total_bytes,
//!   aggregate_goodput_bps, mean_goodput_bps, min_goodput_bps, max_goodput_bps, jain_fairness,
//!   completed_flows, mean_fct_s, p99_fct_s, max_fct_s, udp_loss_rate, requests_served,
//!   hook_errors`; `tcp_flows[]`: `flow_id, peer, expected_bytes, bytes, complete, closed,
//!   accept_s, first_byte_s, last_byte_s, goodput_bps, fct_s` (times in seconds since the
//!   server started; goodput over first to last byte; fct: accept to last byte of a sized
//!   flow); `udp_flows[]`: `flow_id, peer, packets, bytes, sent_packets, lost_packets,
//!   loss_rate, first_s, last_s, goodput_bps, owd` (one-way delay summary, see below) and
//!   `owd_samples_us` with `--samples`.
//! - `bulk` ([`bulk::BulkReport`], the sender): summary `flows, total_bytes_sent,
//!   send_rate_bps, mean_fct_s, p50_fct_s, p99_fct_s, max_fct_s, total_retrans,
//!   udp_send_errors`; `flows[]`: `flow_id, local, bytes_sent, packets_sent, send_errors,
//!   duration_s, send_rate_bps, fct_s, tcp` (`TCP_INFO` at the end: `rtt_us, rttvar_us,
//!   snd_cwnd, total_retrans, lost, delivery_rate_bps, pacing_rate_bps`). The sender's rate
//!   counts bytes handed to the kernel; the receiver's goodput (`serve`) is the one to trust.
//! - `rpc` ([`rpc::RpcReport`]): summary `sent, received, lost, rate_rps` plus the latency
//!   summary flattened (`count, mean_us, min_us, p50_us, p90_us, p99_us, p999_us, max_us`);
//!   `latency` (same fields) and `samples_us[]` with `--samples`.
//! - `pa` ([`pa::PaReport`]): summary `queries, responses, met, missed, app_throughput`
//!   (share of responses that met their deadline), `mean_fct_ms, p50_fct_ms, p99_fct_ms,
//!   max_fct_ms, mean_query_ms, p99_query_ms, total_bytes, goodput_bps`; `responses[]`:
//!   `query, worker, size, deadline_ms, fct_ms, met` (omitted with `--no-records`).
//! - `incast` ([`incast::IncastReport`]): summary `servers, blocks, fragment_bytes,
//!   total_bytes, duration_s, goodput_bps, mean_block_ms, p50_block_ms, p99_block_ms,
//!   max_block_ms`; `block_ms[]`.
//!
//! `params` holds the run's options (the socket options `cc, pacing_rate_bps, mark, tos,
//! dscp, priority, nodelay` flattened in). Sizes are bytes, rates bits per second.
//!
//! A latency summary ([`stats::LatencySummary`]) is `count, mean_us, min_us, p50_us, p90_us,
//! p99_us, p999_us, max_us` (nearest-rank percentiles over all samples, exact).

pub mod bulk;
#[cfg(test)]
mod e2e;
pub mod fanout;
pub mod hook;
pub mod incast;
pub mod pa;
pub mod proto;
pub mod rpc;
pub mod serve;
pub mod sockopt;
pub mod stats;

pub use hook::{NoHook, ResponseHook, SockoptHook};
pub use sockopt::SockOpts;
pub use stats::LatencySummary;

use anyhow::{Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// Version of the JSON result schema described in the module docs.
pub const SCHEMA_VERSION: u32 = 1;

/// Free-form labels copied into a report (`--tag key=value`).
pub type Tags = BTreeMap<String, String>;

/// Parses `key=value` into a pair (for `--tag`).
pub fn parse_tag(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("tag {s:?} is not key=value"))?;
    Ok((k.trim().to_string(), v.trim().to_string()))
}

/// Nanoseconds of `CLOCK_MONOTONIC` (shared by all namespaces and processes of the machine).
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sleeps until `CLOCK_MONOTONIC` reaches `t_ns` (absolute `clock_nanosleep`, so no drift).
pub fn sleep_until_ns(t_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (t_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (t_ns % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: valid timespec; absolute sleep, no remainder needed.
        let r = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        if r != libc::EINTR {
            break;
        }
    }
}

/// Sets this thread's timer slack to 1 ns so timed sends wake when asked, not up to 50 us
/// later (the default slack).
pub fn precise_timers() {
    // SAFETY: PR_SET_TIMERSLACK takes an unsigned long.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
}

/// Seconds as a `Duration` (negative or NaN become zero).
pub fn secs(s: f64) -> Duration {
    if s.is_finite() && s > 0.0 {
        Duration::from_secs_f64(s)
    } else {
        Duration::ZERO
    }
}

/// Writes a report as pretty JSON to `out` (atomically: temp file + rename), or to stdout.
pub fn write_json<T: Serialize>(report: &T, out: Option<&Path>) -> Result<()> {
    let s = serde_json::to_string_pretty(report).context("serialize report")?;
    match out {
        Some(p) => {
            let tmp = p.with_extension("json.tmp");
            std::fs::write(&tmp, s.as_bytes()).with_context(|| format!("write {}", tmp.display()))?;
            std::fs::rename(&tmp, p).with_context(|| format!("rename to {}", p.display()))?;
        }
        None => println!("{s}"),
    }
    Ok(())
}

/// Parses a comma-separated list of `ip:port` / `[v6]:port` addresses.
pub fn parse_addrs(s: &str) -> Result<Vec<std::net::SocketAddr>, String> {
    s.split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| x.trim().parse().map_err(|e| format!("{x:?}: {e}")))
        .collect()
}
