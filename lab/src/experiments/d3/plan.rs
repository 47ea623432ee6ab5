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
    /// D3 with this first-RTT rate and initial window (None: the agent's defaults, one
    /// segment per RTT until the grant, and 2 segments).
    D3 {
        /// `spec.d3.first_rtt_rate`, bytes/s.
        first_rtt_rate: Option<u64>,
        /// `spec.d3.initial_window`, segments.
        initial_window: Option<u32>,
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
    /// TCP's loss recovery as in the paper's time: RACK and tail-loss probes off on the senders
    /// (`net.ipv4.tcp_recovery=0`, `net.ipv4.tcp_early_retrans=0`), so a lost tail waits for
    /// the retransmission timeout (200 ms at least) as it did in 2011.
    pub paper_recovery: bool,
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
    /// Capture the workers' packets at the aggregator (`tcpdump`) and write each response's
    /// timeline ([`super::timeline`]); `PLEXP_D3_CAPTURE=1`. Fresh connections only.
    pub capture: bool,
}

impl Config {
    /// The full run (~15 minutes on the host) or the quick smoke test (~5 minutes).
    pub fn new(quick: bool) -> Config {
        let means = vec![20.0, 30.0, 40.0];
        let d3 = |first_rtt_rate, initial_window| Kind::D3 {
            first_rtt_rate,
            initial_window,
        };
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
            paper_recovery: name == "tcp-paper",
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
                capture: false,
                modes: vec![
                    mode("tcp", Kind::Tcp, vec![], true),
                    mode("tcp-paper", Kind::Tcp, vec![], true),
                    mode("paced", Kind::Paced, vec![], true),
                    mode("qjump", Kind::Qjump, vec![30.0], true),
                    mode("d3", d3(None, None), vec![30.0], true),
                    // The first RTT at the line rate.
                    mode("d3-first-line", d3(Some(125_000_000), None), vec![30.0], false),
                    // The defaults until 2026-12-02: 1% of the line rate until the first grant,
                    // the kernel's initial window (10).
                    mode("d3-base-rate", d3(Some(1_250_000), Some(10)), vec![30.0], false),
                    // Today's first RTT with the kernel's initial window.
                    mode("d3-iw10", d3(None, Some(10)), vec![30.0], false),
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
                capture: false,
                modes: vec![
                    mode("tcp", Kind::Tcp, vec![], true),
                    mode("tcp-paper", Kind::Tcp, vec![], true),
                    mode("paced", Kind::Paced, vec![], true),
                    mode("qjump", Kind::Qjump, means.clone(), true),
                    mode("d3", d3(None, None), means.clone(), true),
                    // The first RTT at the line rate.
                    mode("d3-first-line", d3(Some(125_000_000), None), means.clone(), false),
                    // The defaults until 2026-12-02: 1% of the line rate until the first grant,
                    // the kernel's initial window (10).
                    mode(
                        "d3-base-rate",
                        d3(Some(1_250_000), Some(10)),
                        means.clone(),
                        false,
                    ),
                    // Today's first RTT with the kernel's initial window.
                    mode("d3-iw10", d3(None, Some(10)), means, false),
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
                    ..
                } = &mut md.kind
                {
                    if *f == old {
                        *f = self.rate_bps / 8;
                    } else if *f == old / 100 {
                        *f = self.rate_bps / 800;
                    }
                }
            }
        }
        if let Some(b) = list("PLEXP_D3_BACKGROUND").and_then(|b| b.trim().parse().ok()) {
            self.background_flows = b;
        }
        if list("PLEXP_D3_CAPTURE").is_some_and(|v| v != "0") {
            self.capture = true;
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
