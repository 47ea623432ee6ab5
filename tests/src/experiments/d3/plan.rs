//! What the experiment runs: its modes, points and parameters.

use serde::Serialize;

pub(crate) const NAME: &str = "d3";

/// The workers' port (the agents' class rule matches it as the source port).
pub const PORT: u16 = 5400;

/// The aggregator's port for background flows.
pub const BG_PORT: u16 = 5410;

/// SO_MARK of urgent responses in the QJump mode.
pub(crate) const MARK_URGENT: u32 = 1;

/// Period of the router status samples during D3 points.
pub const ROUTER_SAMPLE_MS: u64 = 50;

/// What a mode does at the senders.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Kind {
    /// Plain TCP, no agent on the senders.
    Tcp,
    /// Per-flow pacing at the fair share rate / N.
    Paced,
    /// Two QJump levels, urgent responses (deadline below the median) on top.
    Qjump,
    /// D3 with this first-RTT rate (bytes/s; None: the agent's default, 1% of link_rate).
    D3 {
        /// `spec.d3.first_rtt_rate`, bytes/s.
        first_rtt_rate: Option<u64>,
    },
}

/// One mode (a series of the plots).
#[derive(Clone, Debug, Serialize)]
pub struct ModeSpec {
    /// Series name.
    pub name: String,
    /// What it does.
    pub kind: Kind,
    /// Deadline means it runs at (the deadline-aware modes; the others run once and are scored
    /// at every mean).
    pub means_ms: Vec<f64>,
    /// Part of the main comparison (not a variant).
    pub main: bool,
    /// How the aggregator connects to the workers.
    pub conn: Conn,
    /// `net.ipv4.tcp_tso_rtt_log` on the senders (None: the kernel's default, 9).
    pub tso_rtt_log: Option<u32>,
}

/// How the aggregator talks to its workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Conn {
    /// A fresh TCP connection per (query, worker), opened and warmed up (one 24-byte exchange)
    /// just before the query: every response is a new flow, as in the paper.
    Fresh,
    /// One persistent connection per worker for the whole point (`plload pa` as it is).
    Persistent,
}

impl ModeSpec {
    pub(crate) fn aware(&self) -> bool {
        matches!(self.kind, Kind::Qjump | Kind::D3 { .. })
    }
    pub(crate) fn is_d3(&self) -> bool {
        matches!(self.kind, Kind::D3 { .. })
    }
}

/// The experiment's knobs (all of them end up in the JSON).
#[derive(Clone, Debug, Serialize)]
pub struct Config {
    /// Bottleneck rate, bit/s.
    pub rate_bps: u64,
    /// Bottleneck buffer, bytes (the QJump port splits it between its two used queues).
    pub buffer_bytes: u32,
    /// Sender hosts (namespaces); workers are spread over them round-robin.
    pub sender_hosts: usize,
    /// The N axis: concurrent senders (workers).
    pub senders: Vec<usize>,
    /// Means of the exponential deadline distribution, ms.
    pub deadline_means_ms: Vec<f64>,
    /// The mean of `d3.svg`.
    pub plot_mean_ms: f64,
    /// Scored responses per point at least (queries = max(min_queries, this / N)).
    pub responses_per_point: u64,
    /// Queries per point at least.
    pub min_queries: u64,
    /// Queries at the start of a point that are not scored.
    pub warmup_queries: u64,
    /// Pause after a query's last response, ms.
    pub interval_ms: f64,
    /// Response sizes, bytes.
    pub size_min: u64,
    /// Response sizes, bytes.
    pub size_max: u64,
    /// A query not complete after this long fails the point, s.
    pub query_timeout_s: f64,
    /// Throughput factor of the QJump top level.
    pub qjump_factor: f64,
    /// QJump's eps, microseconds.
    pub qjump_switch_delay_us: u64,
    /// The modes, in the order they run.
    pub modes: Vec<ModeSpec>,
    /// Long TCP flows from the sender hosts to the aggregator during every point (the
    /// paper's background traffic, section 6.1.3): in the D3 modes they are D3 flows without a
    /// deadline (a fair share), elsewhere plain TCP in the default class. 0: none.
    pub background_flows: usize,
}

impl Config {
    /// The full run (~15 minutes on the host) or the quick smoke test (~5 minutes).
    pub fn new(quick: bool) -> Config {
        let means = vec![20.0, 30.0, 40.0];
        let mode = |name: &str, kind: Kind, means_ms: Vec<f64>, main: bool| ModeSpec {
            name: name.into(),
            kind,
            means_ms,
            main,
            conn: if name.ends_with("-persistent") {
                Conn::Persistent
            } else {
                Conn::Fresh
            },
            tso_rtt_log: None,
        };
        if quick {
            Config {
                rate_bps: 1_000_000_000,
                buffer_bytes: 100_000,
                sender_hosts: 4,
                senders: vec![5, 20, 40],
                deadline_means_ms: vec![30.0],
                plot_mean_ms: 30.0,
                responses_per_point: 300,
                min_queries: 12,
                warmup_queries: 2,
                interval_ms: 10.0,
                size_min: 2048,
                size_max: 51_200,
                query_timeout_s: 20.0,
                qjump_factor: 2.0,
                qjump_switch_delay_us: 10,
                background_flows: 0,
                modes: vec![
                    mode("tcp", Kind::Tcp, vec![], true),
                    mode("paced", Kind::Paced, vec![], true),
                    mode("qjump", Kind::Qjump, vec![30.0], true),
                    mode("d3", Kind::D3 { first_rtt_rate: None }, vec![30.0], true),
                    mode(
                        "d3-first-line",
                        Kind::D3 {
                            first_rtt_rate: Some(125_000_000),
                        },
                        vec![30.0],
                        false,
                    ),
                ],
            }
        } else {
            Config {
                rate_bps: 1_000_000_000,
                buffer_bytes: 100_000,
                sender_hosts: 8,
                senders: vec![5, 10, 20, 30, 40],
                deadline_means_ms: means.clone(),
                plot_mean_ms: 30.0,
                responses_per_point: 800,
                min_queries: 20,
                warmup_queries: 2,
                interval_ms: 10.0,
                size_min: 2048,
                size_max: 51_200,
                query_timeout_s: 20.0,
                qjump_factor: 2.0,
                qjump_switch_delay_us: 10,
                background_flows: 0,
                modes: vec![
                    mode("tcp", Kind::Tcp, vec![], true),
                    mode("paced", Kind::Paced, vec![], true),
                    mode("qjump", Kind::Qjump, means.clone(), true),
                    mode("d3", Kind::D3 { first_rtt_rate: None }, means.clone(), true),
                    // The first-RTT rate at the line rate (the default is 1% of it).
                    mode(
                        "d3-first-line",
                        Kind::D3 {
                            first_rtt_rate: Some(125_000_000),
                        },
                        means,
                        false,
                    ),
                ],
            }
        }
    }

    /// Applies the `PLEXP_D3_*` development overrides.
    pub(crate) fn with_env(mut self) -> Config {
        let list = |k: &str| std::env::var(k).ok().filter(|s| !s.trim().is_empty());
        if let Some(m) = list("PLEXP_D3_MODES") {
            let want: Vec<&str> = m.split(',').map(str::trim).collect();
            self.modes.retain(|x| want.contains(&x.name.as_str()));
        }
        if let Some(r) = list("PLEXP_D3_RESPONSES").and_then(|r| r.trim().parse().ok()) {
            self.responses_per_point = r;
            self.min_queries = 1;
        }
        if let Some(r) = list("PLEXP_D3_RATE_MBIT").and_then(|r| r.trim().parse::<u64>().ok()) {
            let old = self.rate_bps / 8;
            self.rate_bps = r * 1_000_000;
            // A first-RTT rate at the line rate follows it.
            for md in &mut self.modes {
                if let Kind::D3 {
                    first_rtt_rate: Some(f),
                } = &mut md.kind
                    && *f == old
                {
                    *f = self.rate_bps / 8;
                }
            }
        }
        if let Some(b) = list("PLEXP_D3_BACKGROUND").and_then(|b| b.trim().parse().ok()) {
            self.background_flows = b;
        }
        if let Some(n) = list("PLEXP_D3_N") {
            self.senders = n.split(',').filter_map(|x| x.trim().parse().ok()).collect();
        }
        if let Some(m) = list("PLEXP_D3_MEANS") {
            let means: Vec<f64> = m.split(',').filter_map(|x| x.trim().parse().ok()).collect();
            self.deadline_means_ms.retain(|x| means.contains(x));
            for md in &mut self.modes {
                md.means_ms.retain(|x| means.contains(x));
            }
            if !self.deadline_means_ms.contains(&self.plot_mean_ms) {
                self.plot_mean_ms = self.deadline_means_ms.first().copied().unwrap_or(30.0);
            }
        }
        self
    }

    pub(crate) fn queries(&self, n: usize) -> u64 {
        self.responses_per_point.div_ceil(n as u64).max(self.min_queries) + self.warmup_queries
    }
}

pub(crate) fn fmt_mean(m: f64) -> String {
    format!("{}", m)
}
