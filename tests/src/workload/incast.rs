//! Incast (the incast study): a client asks S servers for one fragment each (default 256 KiB) of a
//! block, waits for all fragments, then asks for the next block; k blocks (default 100). The
//! servers are `plload serve`. Reports goodput and each block's completion time (request sent
//! to last byte of the last fragment).

use super::fanout::Fanout;
use super::sockopt::SockOpts;
use super::stats;
use super::{SCHEMA_VERSION, Tags, mono_ns, proto};
use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// Options of `plload incast`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct IncastOpts {
    /// Server addresses, comma-separated (`ip:port,ip:port`).
    #[arg(long, value_delimiter = ',', required = true)]
    pub servers: Vec<SocketAddr>,
    /// Bytes each server sends per block (SRU).
    #[arg(long, default_value_t = 262_144)]
    pub fragment: u64,
    /// Number of blocks.
    #[arg(long, default_value_t = 100)]
    pub blocks: u64,
    /// A block not complete after this long fails the run (s).
    #[arg(long, default_value_t = 60.0)]
    pub block_timeout_s: f64,
    /// Socket options.
    #[command(flatten)]
    #[serde(flatten)]
    pub sock: SockOpts,
}

impl IncastOpts {
    /// The study's defaults (256 KiB fragments, 100 blocks) for `servers`.
    pub fn new(servers: Vec<SocketAddr>) -> IncastOpts {
        IncastOpts {
            servers,
            fragment: 262_144,
            blocks: 100,
            block_timeout_s: 60.0,
            sock: SockOpts::default(),
        }
    }
}

/// Flat summary.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct IncastSummary {
    /// Servers (S).
    pub servers: u64,
    /// Blocks (k).
    pub blocks: u64,
    /// Fragment size (bytes).
    pub fragment_bytes: u64,
    /// Bytes received.
    pub total_bytes: u64,
    /// First request to last byte (s).
    pub duration_s: f64,
    /// total_bytes * 8 / duration_s.
    pub goodput_bps: f64,
    /// Mean block completion time (ms).
    pub mean_block_ms: f64,
    /// Median (ms).
    pub p50_block_ms: f64,
    /// 99th percentile (ms).
    pub p99_block_ms: f64,
    /// Largest (ms).
    pub max_block_ms: f64,
}

/// What `plload incast` prints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IncastReport {
    /// `"incast"`.
    pub kind: String,
    /// Schema version.
    pub version: u32,
    /// Labels.
    pub tags: Tags,
    /// Options.
    pub params: IncastOpts,
    /// Summary.
    pub summary: IncastSummary,
    /// Completion time of each block (ms), in order.
    pub block_ms: Vec<f64>,
}

/// Runs the incast client.
pub fn run(opts: &IncastOpts, tags: &Tags) -> Result<IncastReport> {
    ensure!(!opts.servers.is_empty(), "no servers");
    ensure!(
        opts.fragment >= proto::RESP_HDR as u64,
        "--fragment must be >= {}",
        proto::RESP_HDR
    );
    let mut fan = Fanout::connect(&opts.servers, &opts.sock).context("connect to the servers")?;
    let timeout = super::secs(opts.block_timeout_s);
    let mut block_ms = Vec::with_capacity(opts.blocks as usize);
    let t0 = mono_ns();
    for b in 0..opts.blocks {
        let reqs: Vec<proto::Request> = (0..fan.len())
            .map(|_| proto::Request {
                req_len: proto::REQ_HDR as u32,
                id: b,
                ts_ns: 0,
                resp_len: opts.fragment,
                deadline_us: 0,
            })
            .collect();
        let t = fan.round(&reqs, timeout).with_context(|| format!("block {b}"))?;
        let start = t.iter().map(|x| x.send_ns).min().unwrap_or(0);
        let end = t.iter().map(|x| x.done_ns).max().unwrap_or(start);
        block_ms.push((end - start) as f64 / 1e6);
    }
    let duration_s = (mono_ns() - t0) as f64 / 1e9;
    let total_bytes = opts.fragment * opts.blocks * opts.servers.len() as u64;
    let s = stats::sorted(block_ms.clone());
    let summary = IncastSummary {
        servers: opts.servers.len() as u64,
        blocks: opts.blocks,
        fragment_bytes: opts.fragment,
        total_bytes,
        duration_s,
        goodput_bps: if duration_s > 0.0 {
            total_bytes as f64 * 8.0 / duration_s
        } else {
            0.0
        },
        mean_block_ms: stats::mean(&s),
        p50_block_ms: stats::percentile_sorted(&s, 50.0),
        p99_block_ms: stats::percentile_sorted(&s, 99.0),
        max_block_ms: s.last().copied().unwrap_or(0.0),
    };
    Ok(IncastReport {
        kind: "incast".into(),
        version: SCHEMA_VERSION,
        tags: tags.clone(),
        params: opts.clone(),
        summary,
        block_ms,
    })
}
