//! Partition-aggregate (D3): an aggregator keeps one connection to each of N workers
//! and repeatedly sends a query to all of them at once. For every (query, worker) it draws a
//! response size, uniform in `[size_min, size_max]`, and a deadline, exponential with mean
//! `deadline_mean_ms` (floored at `deadline_min_ms`), from one seeded RNG (for each query, for
//! each worker in order: size, then deadline), and puts both in the query. The worker (`plload
//! serve`) hands them to its [`super::hook::ResponseHook`] with the socket fd, then sends that
//! many bytes. A response meets its deadline when its last byte arrives within the deadline
//! from the moment its query was sent; application throughput is the share that did.

use super::fanout::{Fanout, Timing};
use super::sockopt::SockOpts;
use super::stats;
use super::{SCHEMA_VERSION, Tags, mono_ns, proto};
use anyhow::{Context, Result, ensure};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Exp};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// Options of `plload pa`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct PaOpts {
    /// Worker addresses, comma-separated (`ip:port,ip:port`); each runs `plload serve`.
    #[arg(long, value_delimiter = ',', required = true)]
    pub workers: Vec<SocketAddr>,
    /// Number of queries.
    #[arg(long, default_value_t = 100)]
    pub queries: u64,
    /// Smallest response in bytes (default 2 KiB).
    #[arg(long, default_value_t = 2048)]
    pub size_min: u64,
    /// Largest response in bytes (default 50 KiB).
    #[arg(long, default_value_t = 51200)]
    pub size_max: u64,
    /// Mean of the exponential deadline distribution (ms); D3 uses 20, 30 and 40.
    #[arg(long, default_value_t = 30.0)]
    pub deadline_mean_ms: f64,
    /// Lower bound on a drawn deadline (ms; 0 = none).
    #[arg(long, default_value_t = 0.0)]
    pub deadline_min_ms: f64,
    /// Pause between the last response of a query and the next query (ms).
    #[arg(long, default_value_t = 10.0)]
    pub interval_ms: f64,
    /// A query whose responses are not all in after this long fails the run (s).
    #[arg(long, default_value_t = 30.0)]
    pub query_timeout_s: f64,
    /// RNG seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Leave the per-response records out of the report.
    #[arg(long)]
    pub no_records: bool,
    /// Socket options.
    #[command(flatten)]
    #[serde(flatten)]
    pub sock: SockOpts,
}

impl PaOpts {
    /// Defaults of the D3 evaluation for `workers` and a deadline mean.
    pub fn new(workers: Vec<SocketAddr>, deadline_mean_ms: f64) -> PaOpts {
        PaOpts {
            workers,
            queries: 100,
            size_min: 2048,
            size_max: 51200,
            deadline_mean_ms,
            deadline_min_ms: 0.0,
            interval_ms: 10.0,
            query_timeout_s: 30.0,
            seed: 1,
            no_records: false,
            sock: SockOpts::default(),
        }
    }
}

/// One response.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PaResponse {
    /// Query number (0-based).
    pub query: u64,
    /// Worker index (position in `--workers`).
    pub worker: u32,
    /// Response bytes.
    pub size: u64,
    /// Deadline (ms after the query was sent).
    pub deadline_ms: f64,
    /// Query sent to last byte received (ms).
    pub fct_ms: f64,
    /// fct_ms <= deadline_ms.
    pub met: bool,
}

/// Flat summary.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PaSummary {
    /// Queries issued.
    pub queries: u64,
    /// Responses received.
    pub responses: u64,
    /// Responses within their deadline.
    pub met: u64,
    /// Responses past their deadline.
    pub missed: u64,
    /// met / responses.
    pub app_throughput: f64,
    /// Mean response completion time (ms).
    pub mean_fct_ms: f64,
    /// Median (ms).
    pub p50_fct_ms: f64,
    /// 99th percentile (ms).
    pub p99_fct_ms: f64,
    /// Largest (ms).
    pub max_fct_ms: f64,
    /// Mean time until a query's last response (ms).
    pub mean_query_ms: f64,
    /// 99th percentile of that (ms).
    pub p99_query_ms: f64,
    /// Response bytes received.
    pub total_bytes: u64,
    /// total_bytes * 8 / time spent in queries (pauses excluded).
    pub goodput_bps: f64,
}

/// What `plload pa` prints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PaReport {
    /// `"pa"`.
    pub kind: String,
    /// Schema version.
    pub version: u32,
    /// Labels.
    pub tags: Tags,
    /// Options.
    pub params: PaOpts,
    /// Summary.
    pub summary: PaSummary,
    /// Per response (unless `--no-records`).
    #[serde(default)]
    pub responses: Vec<PaResponse>,
}

/// The requests of query `q`, one per worker: (response size, deadline in us) from [`draws`].
pub fn requests(q: usize, draws: &[(u64, u64)]) -> Vec<proto::Request> {
    draws
        .iter()
        .map(|&(size, deadline_us)| proto::Request {
            req_len: proto::REQ_HDR as u32,
            id: q as u64,
            ts_ns: 0,
            resp_len: size,
            deadline_us,
        })
        .collect()
}

/// Scores answered query `q` (its `draws` and the [`Fanout::round`] timings `t`, worker by
/// worker): appends one [`PaResponse`] per worker and returns the query's span in ns, from the
/// first request sent to the last response done.
pub fn score(q: usize, draws: &[(u64, u64)], t: &[Timing], responses: &mut Vec<PaResponse>) -> u64 {
    let start = t.iter().map(|x| x.send_ns).min().unwrap_or(0);
    let end = t.iter().map(|x| x.done_ns).max().unwrap_or(start);
    for (w, (&(size, deadline_us), tm)) in draws.iter().zip(t).enumerate() {
        let fct_ms = (tm.done_ns - tm.send_ns) as f64 / 1e6;
        let deadline_ms = deadline_us as f64 / 1000.0;
        responses.push(PaResponse {
            query: q as u64,
            worker: w as u32,
            size,
            deadline_ms,
            fct_ms,
            met: fct_ms <= deadline_ms,
        });
    }
    end - start
}

/// The (size, deadline in us) pairs a run with `opts` draws, query by query, worker by worker.
pub fn draws(opts: &PaOpts) -> Result<Vec<Vec<(u64, u64)>>> {
    ensure!(
        opts.size_min >= proto::RESP_HDR as u64,
        "--size-min must be >= {}",
        proto::RESP_HDR
    );
    ensure!(opts.size_max >= opts.size_min, "--size-max must be >= --size-min");
    ensure!(opts.deadline_mean_ms > 0.0, "--deadline-mean-ms must be > 0");
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let exp = Exp::new(1.0 / opts.deadline_mean_ms).context("deadline distribution")?;
    Ok((0..opts.queries)
        .map(|_| {
            (0..opts.workers.len())
                .map(|_| {
                    let size = rng.random_range(opts.size_min..=opts.size_max);
                    let d_ms = exp.sample(&mut rng).max(opts.deadline_min_ms);
                    (size, ((d_ms * 1000.0).round() as u64).max(1))
                })
                .collect()
        })
        .collect())
}

/// Runs the aggregator.
pub fn run(opts: &PaOpts, tags: &Tags) -> Result<PaReport> {
    ensure!(!opts.workers.is_empty(), "no workers");
    let plan = draws(opts)?;
    let mut fan = Fanout::connect(&opts.workers, &opts.sock).context("connect to the workers")?;
    let timeout = super::secs(opts.query_timeout_s);
    let mut responses = Vec::with_capacity(plan.len() * fan.len());
    let mut query_ms = Vec::with_capacity(plan.len());
    let mut busy_ns = 0u64;
    for (q, draws) in plan.iter().enumerate() {
        let reqs = requests(q, draws);
        let t = fan.round(&reqs, timeout).with_context(|| format!("query {q}"))?;
        let span_ns = score(q, draws, &t, &mut responses);
        busy_ns += span_ns;
        query_ms.push(span_ns as f64 / 1e6);
        if opts.interval_ms > 0.0 && q + 1 < plan.len() {
            super::sleep_until_ns(mono_ns() + (opts.interval_ms * 1e6) as u64);
        }
    }
    let fcts = stats::sorted(responses.iter().map(|r| r.fct_ms).collect());
    let qs = stats::sorted(query_ms);
    let met = responses.iter().filter(|r| r.met).count() as u64;
    let total_bytes: u64 = responses.iter().map(|r| r.size).sum();
    let summary = PaSummary {
        queries: plan.len() as u64,
        responses: responses.len() as u64,
        met,
        missed: responses.len() as u64 - met,
        app_throughput: if responses.is_empty() {
            0.0
        } else {
            met as f64 / responses.len() as f64
        },
        mean_fct_ms: stats::mean(&fcts),
        p50_fct_ms: stats::percentile_sorted(&fcts, 50.0),
        p99_fct_ms: stats::percentile_sorted(&fcts, 99.0),
        max_fct_ms: fcts.last().copied().unwrap_or(0.0),
        mean_query_ms: stats::mean(&qs),
        p99_query_ms: stats::percentile_sorted(&qs, 99.0),
        total_bytes,
        goodput_bps: if busy_ns > 0 {
            total_bytes as f64 * 8.0 / (busy_ns as f64 / 1e9)
        } else {
            0.0
        },
    };
    Ok(PaReport {
        kind: "pa".into(),
        version: SCHEMA_VERSION,
        tags: tags.clone(),
        params: opts.clone(),
        summary,
        responses: if opts.no_records { Vec::new() } else { responses },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_deterministic_and_in_range() {
        let mut o = PaOpts::new(vec!["127.0.0.1:1".parse().unwrap(); 4], 20.0);
        o.queries = 500;
        let a = draws(&o).unwrap();
        let b = draws(&o).unwrap();
        assert_eq!(a, b);
        let flat: Vec<(u64, u64)> = a.into_iter().flatten().collect();
        assert_eq!(flat.len(), 2000);
        assert!(flat.iter().all(|&(s, _)| (2048..=51200).contains(&s)));
        let mean_ms = flat.iter().map(|&(_, d)| d as f64 / 1000.0).sum::<f64>() / flat.len() as f64;
        assert!((mean_ms - 20.0).abs() < 2.0, "mean deadline {mean_ms}");
        o.seed = 2;
        assert_ne!(draws(&o).unwrap()[0], b[0]);
        o.deadline_min_ms = 5.0;
        assert!(draws(&o).unwrap().iter().flatten().all(|&(_, d)| d >= 5000));
    }
}
