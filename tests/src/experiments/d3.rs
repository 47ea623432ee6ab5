//! Seed 000 (D3, "Better Never than Late", SIGCOMM 2011, section 6.1, Fig. 9 and 10):
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
//! A star ([`crate::testbed::Star`]) with [`Config::sender_hosts`] sender hosts. The
//! bottleneck is the router's egress toward the aggregator: HTB at 1 Gbit/s with a 100 KB bfifo
//! (the paper's switch buffer), or for the QJump mode a strict-priority port of the same rate
//! ([`crate::testbed::Shaper::StrictPriority`]) whose two used queues have 50 KB each (100 KB
//! in all). Offloads are off (one packet per skb), cubic everywhere.
//!
//! N workers are spread round-robin over the sender hosts (worker i on host `i % 8`): the
//! machine has 2 cores, so 40 namespaces each running an agent would be too heavy, and neither
//! the bottleneck nor D3's per-flow logic cares which host a flow comes from (the paper also
//! ran several workers per host). Each sender host runs one `plload serve` server (in this
//! process, inside the host's namespace) on port [`PORT`]; a worker is one persistent TCP
//! connection from the aggregator to it. The aggregator (`plload pa`, [`pa::run`]) sends a
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
//! - `paced`: an agent on every sender (`enforcement: sockops`): the workers' class has
//!   `flow_rate` = the fair share of the bottleneck, 1 Gbit/s / N (wire rate), which sock_ops
//!   sets as each connection's SO_MAX_PACING_RATE: TCP paces itself. Deadline-unaware
//!   explicit fair sharing, the counterpart of the paper's RCPdc (without RCP's re-division
//!   as flows finish).
//! - `qjump`: QJump levels with deadline-aware level choice, the counterpart of the paper's
//!   TCPpr (two priority classes, short deadlines high): the worker's hook
//!   ([`DeadlineMarkHook`]) marks a response urgent (SO_MARK 1) when its deadline is below the
//!   distribution's median (mean x ln 2); the agent puts marked packets in the top QJump level
//!   (factor [`Config::qjump_factor`], DSCP 46, so the switch's queue 5) and the rest in the
//!   lowest (unlimited, DSCP 0, queue 0). QJump parameters n = 8 hosts, P = 1514 B,
//!   R = 1 Gbit/s, eps = 10 us; the agent enforces the level's per-host rate with HTB
//!   (`enforcement: auto`, no sch_fq on this kernel).
//! - `d3`: the router runs the agent with `spec.d3.router` on the bottleneck interface
//!   (capacity 1 Gbit/s), the aggregator runs it as D3 receiver, the senders with a D3 class
//!   for the workers' port (`enforcement: sockops`, `link_rate: 1Gbit`, which sets the quench
//!   cap and the default first-RTT rate, 1% of it); the worker's [`D3Hook`] writes each
//!   response's size and deadline into the sender agent's pinned application map before
//!   writing it. Grants are enforced by TCP's own pacing (SO_MAX_PACING_RATE from sock_ops).
//! - variants `d3-first-*`: D3 with another first-RTT rate (`spec.d3.first_rtt_rate`).
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
//! background flows ([`Config::background_flows`]) during every point.

use super::Common;
use crate::agent::{Agent, Scratch};
use crate::report::{self, PlotOpts, XySeries};
use crate::testbed::{Bottleneck, BottleneckSpec, ChildGuard, Host, QdiscStats, Star, StarSpec, Testbed};
use crate::workload::hook::{D3Hook, DeadlineMarkHook, NoHook, ResponseHook};
use crate::workload::{self, Tags, pa, serve, stats};
use anyhow::{Context, Result, bail};
use paceline_common::edt::TCP_FRAME_OVERHEAD_V4;
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const NAME: &str = "d3";
/// The workers' port (the agents' class rule matches it as the source port).
pub const PORT: u16 = 5400;
/// The aggregator's port for background flows.
pub const BG_PORT: u16 = 5410;
/// SO_MARK of urgent responses in the QJump mode.
const MARK_URGENT: u32 = 1;
/// Period of the router status samples during D3 points.
pub const ROUTER_SAMPLE_MS: u64 = 50;
/// z of a 95% interval.
const Z95: f64 = 1.959964;

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
    fn aware(&self) -> bool {
        matches!(self.kind, Kind::Qjump | Kind::D3 { .. })
    }
    fn is_d3(&self) -> bool {
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
    fn with_env(mut self) -> Config {
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

    fn queries(&self, n: usize) -> u64 {
        self.responses_per_point.div_ceil(n as u64).max(self.min_queries) + self.warmup_queries
    }
}

/// Everything a point needs.
struct Ctx<'a> {
    cfg: &'a Config,
    star: &'a Star,
    scratch: &'a Scratch,
    seed: u64,
}

/// The agents of one mode.
#[derive(Default)]
struct Agents<'a> {
    senders: Vec<SenderAgent<'a>>,
    router: Option<Agent<'a>>,
    receiver: Option<Agent<'a>>,
}

struct SenderAgent<'a> {
    host: &'a Host,
    policy: PathBuf,
    agent: Agent<'a>,
}

/// Runs the experiment.
pub fn run(c: &Common) -> Result<()> {
    let cfg = Config::new(c.quick).with_env();
    std::fs::create_dir_all(&c.out).with_context(|| format!("mkdir {}", c.out.display()))?;
    let t_begin = Instant::now();
    let tb = Testbed::new("d3_eval")?;
    let star = tb.add_star(&StarSpec {
        senders: cfg.sender_hosts,
        bottleneck: Some(BottleneckSpec::htb(cfg.rate_bps, cfg.buffer_bytes)),
        ..Default::default()
    })?;
    let rx_ip = IpAddr::V4(star.receiver.ipv4());
    let rtts = super::ping_rtts_ms(&star.senders[0], rx_ip, 9, "aggregator")?;
    let kernel = super::kernel_release();
    let fq = star.senders[0]
        .run(&["tc", "qdisc", "add", "dev", "lo", "root", "fq"])
        .map(|_| true)
        .unwrap_or(false);
    if fq {
        let _ = star.senders[0].run(&["tc", "qdisc", "del", "dev", "lo", "root"]);
    }
    let scratch = Scratch::new("d3-eval");
    let ctx = Ctx {
        cfg: &cfg,
        star: &star,
        scratch: &scratch,
        seed: c.seed,
    };
    let mut env = json!({
        "kernel": kernel,
        "in_vm": std::env::var_os("PACELINE_IN_VM").is_some(),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "sch_fq_available": fq,
        "rtt_ms_median": stats::percentile_sorted(&rtts, 50.0),
        "rtt_ms_samples": rtts,
        "load_at_start": loadavg(),
        "qemu_processes_at_start": qemu_processes(),
        "enforcement": {},
    });
    eprintln!(
        "{NAME}: kernel {} (sch_fq: {fq}), {} sender hosts, bottleneck {} Mbit/s / {} B, RTT {:.3} ms, load {}",
        env["kernel"].as_str().unwrap_or("?"),
        cfg.sender_hosts,
        cfg.rate_bps / 1_000_000,
        cfg.buffer_bytes,
        env["rtt_ms_median"].as_f64().unwrap_or(0.0),
        env["load_at_start"]
    );
    // The background flows' sink, for the whole run.
    let _bg_server = if cfg.background_flows > 0 {
        let opts = serve::ServeOpts {
            port: BG_PORT,
            ..Default::default()
        };
        Some(
            star.receiver
                .in_netns(move || serve::Server::start(&opts, Box::new(NoHook)))??,
        )
    } else {
        None
    };
    env["background_flows"] = json!(cfg.background_flows);
    let mut points: Vec<Value> = ideal_points(&cfg, c.seed)?;
    let mut measurements: Vec<Value> = Vec::new();
    let total: usize = cfg
        .modes
        .iter()
        .map(|m| cfg.senders.len() * if m.aware() { m.means_ms.len() } else { 1 })
        .sum();
    let mut done = 0usize;

    for mode in &cfg.modes {
        let t_mode = Instant::now();
        let bn = install_bottleneck(&star, &cfg, mode)?;
        let rtt_log = mode.tso_rtt_log.unwrap_or(9).to_string();
        for h in &star.senders {
            h.sysctl("net.ipv4.tcp_tso_rtt_log", &rtt_log)?;
        }
        let agents = start_agents(&ctx, mode)?;
        if let Some(a) = agents.senders.first() {
            let st = a.agent.status().context("sender agent status")?;
            env["enforcement"][&mode.name] = st["enforcement"].clone();
        } else {
            env["enforcement"][&mode.name] = json!({
                "mode": "no agent",
                "tcp_flows": "not paced (noqueue on the senders' veths, no SO_MAX_PACING_RATE)",
            });
        }
        eprintln!(
            "{NAME}: mode {}: agents up in {:.1} s; enforcement {}",
            mode.name,
            t_mode.elapsed().as_secs_f64(),
            env["enforcement"][&mode.name]
        );
        let means: Vec<f64> = if mode.aware() {
            mode.means_ms.clone()
        } else {
            vec![cfg.deadline_means_ms.first().copied().unwrap_or(30.0)]
        };
        for &mean in &means {
            let servers = start_servers(&ctx, mode, mean, &agents)?;
            for &n in &cfg.senders {
                let t0 = Instant::now();
                if mode.kind == Kind::Paced {
                    for s in &agents.senders {
                        switch_policy(
                            s,
                            &sender_policy(
                                &cfg,
                                mode,
                                n,
                                &s.host.iface_to(&star.router).context("iface")?.ifname,
                            ),
                        )?;
                    }
                }
                let r = run_point(&ctx, mode, mean, n, &agents, &bn, measurements.len());
                done += 1;
                match r {
                    Ok((pts, meas)) => {
                        for p in &pts {
                            let s = &p["summary"];
                            eprintln!(
                                "{NAME}: [{done}/{total}] {:<15} mean {:>2} ms N {:>2}: app throughput {:6.2}% ({} of {}) p99 fct {:.1} ms drops {} rto {} | {:.0}s, total {:.0}s, load {}",
                                mode.name,
                                p["tags"]["deadline_mean_ms"].as_str().unwrap_or(""),
                                n,
                                s["app_throughput"].as_f64().unwrap_or(0.0) * 100.0,
                                s["met"],
                                s["responses"],
                                s["p99_fct_ms"].as_f64().unwrap_or(0.0),
                                s["bottleneck_drops"],
                                s["tcp"]["timeouts"],
                                t0.elapsed().as_secs_f64(),
                                t_begin.elapsed().as_secs_f64(),
                                s["load_after"],
                            );
                            if mode.is_d3() {
                                eprintln!(
                                    "{NAME}:     d3 senders {} router {}",
                                    s["d3_senders"], s["d3_router"]
                                );
                            }
                        }
                        points.extend(pts);
                        measurements.push(meas);
                    }
                    Err(e) => {
                        eprintln!(
                            "{NAME}: [{done}/{total}] {} mean {mean} N {n}: FAILED: {e:#}",
                            mode.name
                        );
                        points.push(json!({
                            "kind": NAME,
                            "tags": {"mode": mode.name, "senders": n.to_string(), "deadline_mean_ms": fmt_mean(mean)},
                            "error": format!("{e:#}"),
                        }));
                    }
                }
                write_outputs(
                    &c.out,
                    &cfg,
                    c,
                    &env,
                    &points,
                    &measurements,
                    false,
                    t_begin.elapsed().as_secs_f64(),
                )?;
            }
            drop(servers);
        }
        stop_agents(agents);
        eprintln!(
            "{NAME}: mode {} done in {:.0} s",
            mode.name,
            t_mode.elapsed().as_secs_f64()
        );
    }
    env["load_at_end"] = json!(loadavg());
    env["qemu_processes_at_end"] = json!(qemu_processes());
    write_outputs(
        &c.out,
        &cfg,
        c,
        &env,
        &points,
        &measurements,
        true,
        t_begin.elapsed().as_secs_f64(),
    )?;
    eprintln!(
        "{NAME}: done in {:.0} s; results in {}",
        t_begin.elapsed().as_secs_f64(),
        c.out.display()
    );
    Ok(())
}

fn fmt_mean(m: f64) -> String {
    format!("{}", m)
}

pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Number of qemu processes on the machine (other engineers' VM runs load the CPUs).
fn qemu_processes() -> usize {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return 0;
    };
    rd.filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .chars()
                .all(|c| c.is_ascii_digit())
        })
        .filter(|e| {
            std::fs::read_to_string(e.path().join("comm"))
                .map(|c| c.trim().starts_with("qemu"))
                .unwrap_or(false)
        })
        .count()
}

/// The mode's bottleneck: HTB + bfifo, or a strict-priority port for QJump.
fn install_bottleneck(star: &Star, cfg: &Config, mode: &ModeSpec) -> Result<Bottleneck> {
    let spec = match mode.kind {
        Kind::Qjump => BottleneckSpec::strict_priority(cfg.rate_bps, cfg.buffer_bytes / 2),
        _ => BottleneckSpec::htb(cfg.rate_bps, cfg.buffer_bytes),
    };
    star.receiver_link.bottleneck_a_to_b(&spec)
}

fn sender_policy(cfg: &Config, mode: &ModeSpec, n: usize, ifname: &str) -> String {
    let head = format!(
        "apiVersion: paceline/v1\nkind: Policy\nmetadata:\n  name: plexp-d3-{}\n  description: D3 evaluation (seed 000), mode {}\nspec:\n  interfaces: [{ifname}]\n",
        mode.name, mode.name
    );
    let rule = format!("  rules:\n    - class: pa\n      protocol: tcp\n      src_port: {PORT}\n");
    let link = format!("{}kbit", cfg.rate_bps / 1000);
    match &mode.kind {
        Kind::Tcp => String::new(),
        Kind::Paced => {
            // The fair share of the bottleneck (wire bytes/s), rounded down.
            let rate = cfg.rate_bps / 8 / n.max(1) as u64;
            format!(
                "{head}  enforcement: sockops\n  link_rate: {link}\n  levels:\n    - name: all\n      priority: 0\n  classes:\n    - name: pa\n      level: all\n      flow_rate: {rate}B/s\n    - name: other\n      level: all\n{rule}  default_class: other\n"
            )
        }
        Kind::Qjump => format!(
            "{head}  enforcement: auto\n  # veths report no speed\n  link_rate: 10Gbit\n  qjump:\n    hosts: {hosts}\n    max_packet: 1514B\n    link_rate: {rate}bit\n    switch_delay: {eps}us\n  levels:\n    - name: urgent\n      priority: 5\n      factor: {f}\n      dscp: 46\n    - name: normal\n      priority: 0\n      factor: unlimited\n      dscp: 0\n  classes:\n    - name: pa\n      level: urgent\n    - name: other\n      level: normal\n  rules:\n    - class: pa\n      protocol: tcp\n      src_port: {PORT}\n      mark: {MARK_URGENT}\n  default_class: other\n",
            hosts = cfg.sender_hosts,
            rate = cfg.rate_bps,
            eps = cfg.qjump_switch_delay_us,
            f = cfg.qjump_factor,
        ),
        Kind::D3 { first_rtt_rate } => {
            let first = first_rtt_rate
                .map(|r| format!("\n    first_rtt_rate: {r}B/s"))
                .unwrap_or_default();
            let d3 = if first.is_empty() {
                "  d3: {}\n".to_string()
            } else {
                format!("  d3:{first}\n")
            };
            // Background flows are D3 flows without a deadline: they ask for a fair share.
            let (bg_class, bg_rule) = if cfg.background_flows > 0 {
                (
                    "    - name: background\n      level: all\n      d3: {}\n".to_string(),
                    format!("    - class: background\n      protocol: tcp\n      dst_port: {BG_PORT}\n"),
                )
            } else {
                (String::new(), String::new())
            };
            format!(
                "{head}  enforcement: sockops\n  # the bottleneck's rate: D3's quench cap and scale, and the default first-RTT rate (1%)\n  link_rate: {link}\n  levels:\n    - name: all\n      priority: 0\n  classes:\n    - name: pa\n      level: all\n      d3: {{}}\n{bg_class}    - name: other\n      level: all\n{rule}{bg_rule}  default_class: other\n{d3}"
            )
        }
    }
}

fn router_policy(to_rx: &str, rate_bps: u64) -> String {
    format!(
        "apiVersion: paceline/v1\nkind: Policy\nmetadata:\n  name: plexp-d3-router\nspec:\n  interfaces: [{to_rx}]\n  enforcement: none\n  levels:\n    - name: all\n      priority: 0\n  classes:\n    - name: all\n      level: all\n  default_class: all\n  d3:\n    receiver: false\n    router:\n      - interface: {to_rx}\n        capacity: {rate_bps}bit\n"
    )
}

fn receiver_policy(ifname: &str) -> String {
    format!(
        "apiVersion: paceline/v1\nkind: Policy\nmetadata:\n  name: plexp-d3-aggregator\nspec:\n  interfaces: [{ifname}]\n  enforcement: none\n  levels:\n    - name: all\n      priority: 0\n  classes:\n    - name: all\n      level: all\n  default_class: all\n  d3: {{}}\n"
    )
}

fn start_agents<'a>(ctx: &Ctx<'a>, mode: &ModeSpec) -> Result<Agents<'a>> {
    let star = ctx.star;
    let mut agents = Agents::default();
    if mode.kind == Kind::Tcp {
        return Ok(agents);
    }
    let dir = |h: &str| ctx.scratch.path(&format!("{}-{h}", mode.name));
    if mode.is_d3() {
        let to_rx = star.bottleneck_iface().ifname.clone();
        let p = ctx.scratch.path(&format!("{}-router.yaml", mode.name));
        std::fs::write(&p, router_policy(&to_rx, ctx.cfg.rate_bps))?;
        agents.router = Some(Agent::start(&star.router, &p, &dir("router-state")));
        let rx_if = star
            .receiver
            .iface_to(&star.router)
            .context("aggregator iface")?
            .ifname;
        let p = ctx.scratch.path(&format!("{}-rx.yaml", mode.name));
        std::fs::write(&p, receiver_policy(&rx_if))?;
        agents.receiver = Some(Agent::start(&star.receiver, &p, &dir("rx-state")));
    }
    let first_n = ctx.cfg.senders.first().copied().unwrap_or(1);
    for (i, h) in star.senders.iter().enumerate() {
        let ifname = h.iface_to(&star.router).context("sender iface")?.ifname;
        let p = ctx.scratch.path(&format!("{}-s{i}.yaml", mode.name));
        std::fs::write(&p, sender_policy(ctx.cfg, mode, first_n, &ifname))?;
        let agent = Agent::start(h, &p, &dir(&format!("s{i}-state")));
        agents.senders.push(SenderAgent {
            host: h,
            policy: p,
            agent,
        });
    }
    Ok(agents)
}

fn stop_agents(a: Agents) {
    // Dropping an agent sends SIGTERM and waits; the senders first, then router and receiver.
    drop(a.senders);
    drop(a.router);
    drop(a.receiver);
}

/// Writes `text` as the agent's policy and waits until it runs it.
fn switch_policy(s: &SenderAgent, text: &str) -> Result<()> {
    super::pacing::switch_policy(&s.agent, s.host.name(), &s.policy, text, Duration::from_secs(2))
}

/// One server per sender host with the mode's hook.
fn start_servers(ctx: &Ctx, mode: &ModeSpec, mean: f64, agents: &Agents) -> Result<Vec<serve::Server>> {
    let mut v = Vec::new();
    for (i, h) in ctx.star.senders.iter().enumerate() {
        let hook: Box<dyn ResponseHook> = match &mode.kind {
            Kind::Tcp | Kind::Paced => Box::new(NoHook),
            Kind::Qjump => Box::new(DeadlineMarkHook {
                threshold: Duration::from_secs_f64(mean * std::f64::consts::LN_2 / 1e3),
                mark: MARK_URGENT,
            }),
            Kind::D3 { .. } => {
                let a = &agents.senders.get(i).context("no agent for the sender")?.agent;
                Box::new(D3Hook::open(&a.d3_app_map())?)
            }
        };
        let opts = serve::ServeOpts {
            port: PORT,
            ..Default::default()
        };
        v.push(h.in_netns(move || serve::Server::start(&opts, hook))??);
    }
    Ok(v)
}

/// TCP counters of a namespace: (RetransSegs, TCPTimeouts, TCPLossProbes, TCPLossProbeRecovery).
fn tcp_counters(h: &Host) -> [u64; 4] {
    let text = h
        .run(&["cat", "/proc/net/snmp", "/proc/net/netstat"])
        .unwrap_or_default();
    let mut map: BTreeMap<String, u64> = BTreeMap::new();
    let lines: Vec<&str> = text.lines().collect();
    for w in lines.windows(2) {
        let (a, b) = (w[0], w[1]);
        let (Some((pa_, names)), Some((pb, vals))) = (a.split_once(':'), b.split_once(':')) else {
            continue;
        };
        if pa_ != pb
            || names
                .split_whitespace()
                .next()
                .and_then(|x| x.parse::<i64>().ok())
                .is_some()
        {
            continue;
        }
        for (k, v) in names.split_whitespace().zip(vals.split_whitespace()) {
            if let Ok(v) = v.parse::<u64>() {
                map.insert(format!("{pa_}.{k}"), v);
            }
        }
    }
    let g = |k: &str| map.get(k).copied().unwrap_or(0);
    [
        g("Tcp.RetransSegs"),
        g("TcpExt.TCPTimeouts"),
        g("TcpExt.TCPLossProbes"),
        g("TcpExt.TCPLossProbeRecovery"),
    ]
}

pub(crate) fn sum_tcp(hosts: &[&Host]) -> [u64; 4] {
    let mut s = [0u64; 4];
    for h in hosts {
        let c = tcp_counters(h);
        for i in 0..4 {
            s[i] += c[i];
        }
    }
    s
}

/// The senders' D3 counters of class `pa`, summed.
fn d3_sender_counters(agents: &Agents) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for s in &agents.senders {
        let Some(st) = s.agent.status() else { continue };
        let Some(c) = st["counters"]["d3_classes"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["name"] == "pa"))
        else {
            continue;
        };
        if let Some(o) = c.as_object() {
            for (k, v) in o {
                if let Some(x) = v.as_u64() {
                    *m.entry(k.clone()).or_insert(0) += x;
                }
            }
        }
    }
    m
}

fn router_link(agents: &Agents) -> Option<Value> {
    let st = agents.router.as_ref()?.status()?;
    Some(st["counters"]["d3_router_links"][0].clone())
}

fn delta_map(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) -> Value {
    let mut o = serde_json::Map::new();
    for (k, v) in b {
        o.insert(k.clone(), json!(v.saturating_sub(a.get(k).copied().unwrap_or(0))));
    }
    Value::Object(o)
}

/// The router link's counters after the point, as deltas where they are cumulative.
fn router_delta(before: &Option<Value>, after: &Option<Value>) -> Value {
    let (Some(b), Some(a)) = (before, after) else {
        return Value::Null;
    };
    let mut o = serde_json::Map::new();
    for k in [
        "requests",
        "fins",
        "new_flows",
        "clamped",
        "unprocessed",
        "base_floor",
        "short_grants",
        "duplicates",
        "sent_bytes",
        "idle_resets",
    ] {
        o.insert(
            k.into(),
            json!(
                a[k].as_u64()
                    .unwrap_or(0)
                    .saturating_sub(b[k].as_u64().unwrap_or(0))
            ),
        );
    }
    for k in [
        "capacity_bytes_per_second",
        "flows",
        "demand_bytes_per_second",
        "allocated_bytes_per_second",
        "queue_bytes",
    ] {
        o.insert(format!("{k}_after"), a[k].clone());
    }
    Value::Object(o)
}

/// GET /status from the agent in `host`'s namespace (cheaper than `plagent status`): the
/// API listener (`--api-addr`, 127.0.0.1:9978 by default), apart from `/metrics`.
fn http_status() -> Option<Value> {
    use std::io::{Read as _, Write as _};
    let mut c =
        std::net::TcpStream::connect_timeout(&"127.0.0.1:9978".parse().ok()?, Duration::from_millis(200))
            .ok()?;
    c.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    c.write_all(b"GET /status HTTP/1.0\r\n\r\n").ok()?;
    let mut b = String::new();
    c.read_to_string(&mut b).ok()?;
    let body = b.split_once("\r\n\r\n")?.1;
    serde_json::from_str(body).ok()
}

/// Samples the router link's C, N, D, A and queue until `stop`.
fn sample_router(router: &Host, stop: &AtomicBool) -> Vec<[u64; 5]> {
    router
        .in_netns(|| {
            let mut v = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if let Some(s) = http_status() {
                    let l = &s["counters"]["d3_router_links"][0];
                    let g = |k: &str| l[k].as_u64().unwrap_or(0);
                    v.push([
                        g("capacity_bytes_per_second"),
                        g("flows"),
                        g("demand_bytes_per_second"),
                        g("allocated_bytes_per_second"),
                        g("queue_bytes"),
                    ]);
                }
                std::thread::sleep(Duration::from_millis(ROUTER_SAMPLE_MS));
            }
            v
        })
        .unwrap_or_default()
}

fn summarize_samples(v: &[[u64; 5]], line: u64) -> Value {
    if v.is_empty() {
        return Value::Null;
    }
    let col = |i: usize| -> Vec<f64> { v.iter().map(|s| s[i] as f64).collect() };
    let mean = |x: &[f64]| stats::mean(x);
    let max = |x: &[f64]| x.iter().copied().fold(0.0, f64::max);
    let min = |x: &[f64]| x.iter().copied().fold(f64::INFINITY, f64::min);
    let c = col(0);
    json!({
        "samples": v.len(),
        "capacity_over_line_mean": mean(&c) / line as f64,
        "capacity_over_line_min": min(&c) / line as f64,
        "capacity_below_line_share": c.iter().filter(|&&x| x < line as f64 * 0.99).count() as f64 / c.len() as f64,
        "flows_max": max(&col(1)),
        "flows_mean": mean(&col(1)),
        "demand_over_line_max": max(&col(2)) / line as f64,
        "allocated_over_line_max": max(&col(3)) / line as f64,
        "queue_bytes_max": max(&col(4)),
        "queue_bytes_mean": mean(&col(4)),
    })
}

/// Wilson score interval of `k` successes in `n`.
fn wilson(k: u64, n: u64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let (k, n) = (k as f64, n as f64);
    let p = k / n;
    let z2 = Z95 * Z95;
    let den = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / den;
    let half = Z95 * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / den;
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// Runs one (mode, mean, N) measurement; returns its scored point(s) (one per mean for the
/// deadline-unaware modes) and the raw measurement.
fn run_point(
    ctx: &Ctx,
    mode: &ModeSpec,
    mean: f64,
    n: usize,
    agents: &Agents,
    bn: &Bottleneck,
    meas_id: usize,
) -> Result<(Vec<Value>, Value)> {
    let cfg = ctx.cfg;
    let star = ctx.star;
    let workers: Vec<SocketAddr> = (0..n)
        .map(|i| SocketAddr::new(IpAddr::V4(star.senders[i % cfg.sender_hosts].ipv4()), PORT))
        .collect();
    let active: Vec<&Host> = star.senders.iter().take(n.min(cfg.sender_hosts)).collect();
    let seed = ctx.seed ^ ((n as u64) << 20);
    let mut opts = pa::PaOpts::new(workers, mean);
    opts.queries = cfg.queries(n);
    opts.size_min = cfg.size_min;
    opts.size_max = cfg.size_max;
    opts.interval_ms = cfg.interval_ms;
    opts.query_timeout_s = cfg.query_timeout_s;
    opts.seed = seed;

    // Background flows from the last sender hosts, given a second to leave slow start.
    let to_bg = format!("{}:{BG_PORT}", star.receiver.ipv4());
    let bg: Vec<ChildGuard> = (0..cfg.background_flows)
        .map(|j| {
            let h = &star.senders[cfg.sender_hosts - 1 - j % cfg.sender_hosts];
            h.spawn(&[
                crate::agent::bin("plload").as_os_str(),
                "bulk".as_ref(),
                "--to".as_ref(),
                to_bg.as_ref(),
                "--duration".as_ref(),
                "3600".as_ref(),
            ])
        })
        .collect::<Result<_>>()?;
    if !bg.is_empty() {
        std::thread::sleep(Duration::from_secs(1));
    }
    let q0 = bn.stats()?;
    let qq0 = if mode.kind == Kind::Qjump {
        bn.queue_stats().ok()
    } else {
        None
    };
    let tcp0 = sum_tcp(&active);
    let d3s0 = if mode.is_d3() {
        d3_sender_counters(agents)
    } else {
        BTreeMap::new()
    };
    let rl0 = if mode.is_d3() { router_link(agents) } else { None };
    let load_before = loadavg();
    let t0 = Instant::now();
    let stop = AtomicBool::new(false);
    // The responses with their queries' completion times (ms), and the router's samples.
    type Run = ((Vec<pa::PaResponse>, Vec<f64>), Vec<[u64; 5]>);
    let ((responses, query_ms), samples) = std::thread::scope(|s| -> Result<Run> {
        let sampler =
            (mode.is_d3() && agents.router.is_some()).then(|| s.spawn(|| sample_router(&star.router, &stop)));
        let r = star.receiver.in_netns(|| match mode.conn {
            Conn::Fresh => run_pa_fresh(&opts),
            Conn::Persistent => pa::run(&opts, &Tags::new()).map(|r| {
                let q = query_times(&r.responses);
                (r.responses, q)
            }),
        });
        stop.store(true, Ordering::Relaxed);
        let samples = sampler.map(|h| h.join().unwrap_or_default()).unwrap_or_default();
        Ok((r??, samples))
    })?;
    let wall_s = t0.elapsed().as_secs_f64();
    drop(bg);
    // Let the last FINs and the controller settle before reading the counters.
    std::thread::sleep(Duration::from_millis(if mode.is_d3() { 150 } else { 20 }));
    let q1 = bn.stats()?;
    let tcp1 = sum_tcp(&active);
    let d3_senders = if mode.is_d3() {
        delta_map(&d3s0, &d3_sender_counters(agents))
    } else {
        Value::Null
    };
    let d3_router = if mode.is_d3() {
        router_delta(&rl0, &router_link(agents))
    } else {
        Value::Null
    };
    let load_after = loadavg();
    let qd = |a: &QdiscStats, b: &QdiscStats| json!({"drops": b.drops - a.drops, "packets": b.packets - a.packets, "bytes": b.bytes - a.bytes});
    // Per queue of the strict-priority port: 5 = urgent (DSCP 46), 0 = the rest.
    let qjump_queues = match (qq0, if mode.kind == Kind::Qjump { bn.queue_stats().ok() } else { None }) {
        (Some(a), Some(b)) => Some(
            a.iter()
                .zip(&b)
                .enumerate()
                .filter(|(_, (x, y))| y.packets + y.drops > x.packets + x.drops)
                .map(|(i, (x, y))| json!({"queue": i, "packets": y.packets - x.packets, "drops": y.drops - x.drops}))
                .collect::<Vec<_>>(),
        ),
        _ => None,
    };

    let scored: Vec<&pa::PaResponse> = responses
        .iter()
        .filter(|r| r.query >= cfg.warmup_queries)
        .collect();
    let qs = stats::sorted(
        query_ms
            .iter()
            .skip(cfg.warmup_queries as usize)
            .copied()
            .collect(),
    );
    let bytes: u64 = scored.iter().map(|r| r.size).sum();
    let fct_ms: Vec<f64> = scored
        .iter()
        .map(|r| (r.fct_ms * 1000.0).round() / 1000.0)
        .collect();
    let means: Vec<f64> = if mode.aware() {
        vec![mean]
    } else {
        cfg.deadline_means_ms.clone()
    };
    let mut pts = Vec::new();
    for &m in &means {
        // The deadlines of mean m: the same random numbers (the sizes must agree).
        let mut o = opts.clone();
        o.deadline_mean_ms = m;
        let plan = pa::draws(&o)?;
        let mut met = 0u64;
        let mut late_by = Vec::new();
        let mut missed_records = Vec::new();
        for r in &scored {
            let (size, d_us) = plan[r.query as usize][r.worker as usize];
            if size != r.size {
                bail!(
                    "draws disagree: query {} worker {} size {} vs {}",
                    r.query,
                    r.worker,
                    size,
                    r.size
                );
            }
            let d = d_us as f64 / 1000.0;
            if r.fct_ms <= d {
                met += 1;
            } else {
                late_by.push(r.fct_ms / d);
                missed_records.push(json!([
                    r.query,
                    r.worker,
                    r.size,
                    d,
                    (r.fct_ms * 1000.0).round() / 1000.0
                ]));
            }
        }
        let total = scored.len() as u64;
        let (lo, hi) = wilson(met, total);
        let fs = stats::sorted(fct_ms.clone());
        let late = stats::sorted(late_by);
        pts.push(json!({
            "kind": NAME,
            "version": workload::SCHEMA_VERSION,
            "tags": {
                "mode": mode.name,
                "senders": n.to_string(),
                "deadline_mean_ms": fmt_mean(m),
            },
            "params": {
                "measurement": meas_id,
                "connections": mode.conn,
                "measured_at_mean_ms": mean,
                "rescored": !mode.aware() && m != mean,
                "queries": opts.queries,
                "warmup_queries": cfg.warmup_queries,
                "seed": seed,
                "sender_hosts_active": active.len(),
                "workers_per_host_max": n.div_ceil(cfg.sender_hosts),
                "flow_rate_bps": if mode.kind == Kind::Paced { json!(cfg.rate_bps / n as u64) } else { Value::Null },
                "qjump_urgent_below_ms": if mode.kind == Kind::Qjump { json!(m * std::f64::consts::LN_2) } else { Value::Null },
            },
            "summary": {
                "responses": total,
                "met": met,
                "missed": total - met,
                "app_throughput": if total > 0 { met as f64 / total as f64 } else { 0.0 },
                "app_throughput_ci95": [lo, hi],
                "mean_fct_ms": stats::mean(&fs),
                "p50_fct_ms": stats::percentile_sorted(&fs, 50.0),
                "p99_fct_ms": stats::percentile_sorted(&fs, 99.0),
                "max_fct_ms": fs.last().copied().unwrap_or(0.0),
                "missed_lateness_p50": stats::percentile_sorted(&late, 50.0),
                "missed_lateness_p95": stats::percentile_sorted(&late, 95.0),
                "mean_query_ms": stats::mean(&qs),
                "p99_query_ms": stats::percentile_sorted(&qs, 99.0),
                "goodput_bps": if qs.is_empty() { 0.0 } else { bytes as f64 * 8.0 / (qs.iter().sum::<f64>() / 1e3) },
                "bottleneck_drops": q1.drops - q0.drops,
                "bottleneck": qd(&q0, &q1),
                // Everything the bottleneck sent (responses, background, ACKs of neither),
                // over the point's wall time.
                "bottleneck_mbit": (q1.bytes - q0.bytes) as f64 * 8.0 / wall_s.max(1e-9) / 1e6,
                "background_flows": cfg.background_flows,
                "qjump_queues": qjump_queues,
                "tcp": {
                    "retrans_segs": tcp1[0] - tcp0[0],
                    "timeouts": tcp1[1] - tcp0[1],
                    "loss_probes": tcp1[2] - tcp0[2],
                    "loss_probe_recoveries": tcp1[3] - tcp0[3],
                },
                "d3_senders": d3_senders,
                "d3_router": d3_router,
                "d3_router_samples": summarize_samples(&samples, cfg.rate_bps / 8),
                "wall_s": wall_s,
                "load_before": load_before,
                "load_after": load_after,
            },
            "missed": {"fields": ["query", "worker", "size", "deadline_ms", "fct_ms"], "records": missed_records},
        }));
    }
    let meas = json!({
        "id": meas_id,
        "mode": mode.name,
        "senders": n,
        "mean_ms": mean,
        "connections": mode.conn,
        "seed": seed,
        "queries": opts.queries,
        "warmup_queries": cfg.warmup_queries,
        "fct_ms": fct_ms,
    });
    Ok((pts, meas))
}

/// Query durations (first send to last byte, ms) from per-response records: the aggregator
/// sends a query's requests back to back, so its earliest send is close to each one's.
fn query_times(responses: &[pa::PaResponse]) -> Vec<f64> {
    let mut by_q: BTreeMap<u64, f64> = BTreeMap::new();
    for r in responses {
        let e = by_q.entry(r.query).or_insert(0.0);
        *e = e.max(r.fct_ms);
    }
    by_q.into_values().collect()
}

/// `plload pa` with a fresh connection per (query, worker): for each query, connect to every
/// worker, exchange one 24-byte request/response on each (so the workers have accepted and the
/// connections are past the handshake), then send the query's requests back to back and time
/// each response from its request's send to its last byte, then close. The draws are
/// [`pa::draws`]'s, so they match `plload pa`'s for the same options. Returns the responses
/// and each query's duration (ms).
fn run_pa_fresh(opts: &pa::PaOpts) -> Result<(Vec<pa::PaResponse>, Vec<f64>)> {
    use crate::workload::{fanout::Fanout, proto};
    let plan = pa::draws(opts)?;
    let timeout = Duration::from_secs_f64(opts.query_timeout_s.max(0.1));
    let mut responses = Vec::with_capacity(plan.len() * opts.workers.len());
    let mut query_ms = Vec::with_capacity(plan.len());
    for (q, draws) in plan.iter().enumerate() {
        let mut fan =
            Fanout::connect(&opts.workers, &opts.sock).with_context(|| format!("query {q}: connect"))?;
        let warm: Vec<proto::Request> = draws
            .iter()
            .map(|_| proto::Request {
                req_len: proto::REQ_HDR as u32,
                id: u64::MAX,
                ts_ns: 0,
                resp_len: proto::RESP_HDR as u64,
                deadline_us: 0,
            })
            .collect();
        fan.round(&warm, timeout)
            .with_context(|| format!("query {q}: warm-up"))?;
        let t = fan
            .round(&pa::requests(q, draws), timeout)
            .with_context(|| format!("query {q}"))?;
        drop(fan);
        query_ms.push(pa::score(q, draws, &t, &mut responses) as f64 / 1e6);
        if opts.interval_ms > 0.0 && q + 1 < plan.len() {
            workload::sleep_until_ns(workload::mono_ns() + (opts.interval_ms * 1e6) as u64);
        }
    }
    Ok((responses, query_ms))
}

/// Frames on the wire for a response of `size` bytes: MSS 1448 (timestamps), 66 bytes of
/// Ethernet, IPv4 and TCP headers per frame.
fn wire_bytes(size: u64) -> u64 {
    size + size.div_ceil(1448) * TCP_FRAME_OVERHEAD_V4
}

/// Responses (of the scored queries) an ideal scheduler meets: all of a query's responses
/// released at once at one 1 Gbit/s bottleneck, no latency, no loss, preemptive; the most
/// deadlines any single-link schedule meets (Moore-Hodgson, optimal for 1||sum U_j).
fn ideal_met(opts: &pa::PaOpts, warmup: u64, rate_bps: u64) -> Result<(u64, u64)> {
    let plan = pa::draws(opts)?;
    let (mut met, mut total) = (0u64, 0u64);
    for q in plan.iter().skip(warmup as usize) {
        let mut jobs: Vec<(f64, f64)> = q
            .iter()
            .map(|&(size, d_us)| (wire_bytes(size) as f64 * 8.0 / rate_bps as f64, d_us as f64 / 1e6))
            .collect();
        jobs.sort_by(|a, b| a.1.total_cmp(&b.1));
        let mut kept: Vec<f64> = Vec::new();
        let mut t = 0.0;
        for (p, d) in jobs {
            kept.push(p);
            t += p;
            if t > d {
                let (i, &m) = kept
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .expect("non-empty");
                t -= m;
                kept.swap_remove(i);
            }
        }
        met += kept.len() as u64;
        total += q.len() as u64;
    }
    Ok((met, total))
}

/// The `ideal` pseudo-mode's points: every N and mean.
fn ideal_points(cfg: &Config, seed: u64) -> Result<Vec<Value>> {
    let mut v = Vec::new();
    for &mean in &cfg.deadline_means_ms {
        for &n in &cfg.senders {
            let mut o = pa::PaOpts::new(vec![SocketAddr::from(([127, 0, 0, 1], PORT)); n], mean);
            o.queries = cfg.queries(n);
            o.size_min = cfg.size_min;
            o.size_max = cfg.size_max;
            o.seed = seed ^ ((n as u64) << 20);
            let (met, total) = ideal_met(&o, cfg.warmup_queries, cfg.rate_bps)?;
            let (lo, hi) = wilson(met, total);
            v.push(json!({
                "kind": NAME,
                "version": workload::SCHEMA_VERSION,
                "tags": {"mode": IDEAL, "senders": n.to_string(), "deadline_mean_ms": fmt_mean(mean)},
                "params": {"computed": "Moore-Hodgson on the drawn sizes and deadlines: one bottleneck at the configured rate, all responses of a query released together, no latency", "seed": o.seed, "queries": o.queries},
                "summary": {"responses": total, "met": met, "missed": total - met, "app_throughput": met as f64 / total.max(1) as f64, "app_throughput_ci95": [lo, hi]},
            }));
        }
    }
    Ok(v)
}

/// Name of the computed upper bound.
const IDEAL: &str = "ideal";

/// The series of tables and plots: the measured modes, then the computed upper bound.
fn series_names(cfg: &Config) -> Vec<String> {
    let mut v: Vec<String> = cfg.modes.iter().map(|m| m.name.clone()).collect();
    v.push(IDEAL.into());
    v
}

/// App throughput of (mode, mean) at each N, sorted by N.
fn curve(points: &[Value], mode: &str, mean: f64) -> Vec<(usize, f64, u64)> {
    let mut v: Vec<(usize, f64, u64)> = points
        .iter()
        .filter(|p| {
            p["tags"]["mode"] == mode
                && p["tags"]["deadline_mean_ms"] == fmt_mean(mean).as_str()
                && p.get("error").is_none()
        })
        .filter_map(|p| {
            Some((
                p["tags"]["senders"].as_str()?.parse().ok()?,
                p["summary"]["app_throughput"].as_f64()?,
                p["summary"]["responses"].as_u64()?,
            ))
        })
        .collect();
    v.sort_by_key(|x| x.0);
    v
}

/// The largest measured N such that every measured N up to it reaches `thr` (0: not even the
/// smallest), whether every measured N reached it, and the crossing interpolated linearly
/// between the last N that reached it and the first that did not.
fn supported(curve: &[(usize, f64, u64)], thr: f64) -> (usize, bool, Option<f64>) {
    let mut last = 0usize;
    let mut last_v = None;
    for &(n, v, _) in curve {
        if v >= thr {
            last = n;
            last_v = Some(v);
        } else {
            let interp = match last_v {
                Some(a) if a > v => Some(last as f64 + (a - thr) / (a - v) * (n - last) as f64),
                _ => None,
            };
            return (last, false, interp);
        }
    }
    (last, !curve.is_empty(), None)
}

fn supported_text(s: (usize, bool, Option<f64>), smallest: usize, largest: usize) -> String {
    match s {
        (0, _, _) => format!("< {smallest}"),
        (n, true, _) if n == largest => format!(">= {n}"),
        (n, _, Some(x)) => format!("{n} (~{x:.1})"),
        (n, _, None) => n.to_string(),
    }
}

#[allow(clippy::too_many_arguments)]
fn write_outputs(
    out: &Path,
    cfg: &Config,
    c: &Common,
    env: &Value,
    points: &[Value],
    measurements: &[Value],
    complete: bool,
    elapsed_s: f64,
) -> Result<()> {
    let smallest = cfg.senders.iter().min().copied().unwrap_or(0);
    let largest = cfg.senders.iter().max().copied().unwrap_or(0);
    let mut support = Vec::new();
    for m in series_names(cfg) {
        for &mean in &cfg.deadline_means_ms {
            let cv = curve(points, &m, mean);
            if cv.is_empty() {
                continue;
            }
            let mut row = json!({"mode": m, "deadline_mean_ms": mean});
            for (k, thr) in [("99", 0.99), ("95", 0.95)] {
                let s = supported(&cv, thr);
                row[format!("n_at_{k}")] = json!(s.0);
                row[format!("n_at_{k}_all_measured")] = json!(s.1);
                row[format!("n_at_{k}_interpolated")] = json!(s.2);
                row[format!("n_at_{k}_text")] = json!(supported_text(s, smallest, largest));
            }
            support.push(row);
        }
    }
    let doc = json!({
        "kind": NAME,
        "version": workload::SCHEMA_VERSION,
        "complete": complete,
        "elapsed_s": elapsed_s,
        "seed": c.seed,
        "quick": c.quick,
        "config": cfg,
        "environment": env,
        "supported_definition": "n_at_99 / n_at_95: the largest measured N such that app throughput >= 99% / 95% at every measured N up to it (0: not at the smallest N); interpolated: linear crossing between that N and the next measured one",
        "supported": support,
        "results": points,
        "measurements": measurements,
    });
    workload::write_json(&doc, Some(&out.join(format!("{NAME}.json"))))?;
    std::fs::write(
        out.join(format!("{NAME}.md")),
        markdown(cfg, env, points, &support, complete, elapsed_s),
    )?;
    for &mean in &cfg.deadline_means_ms {
        let series: Vec<XySeries> = series_names(cfg)
            .into_iter()
            .map(|m| XySeries {
                points: curve(points, &m, mean)
                    .iter()
                    .map(|&(n, v, _)| (n as f64, v * 100.0))
                    .collect(),
                name: if m == IDEAL {
                    "ideal (optimal schedule, no latency)".into()
                } else {
                    m
                },
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        if series.is_empty() {
            continue;
        }
        let mut opts = PlotOpts::new(
            &format!(
                "D3 evaluation: application throughput, deadlines exp. mean {mean} ms, 1 Gbit/s, 100 KB"
            ),
            "concurrent senders N",
            "application throughput (% of responses meeting their deadline)",
        );
        opts.y_from_zero = false;
        // The main comparison; the variants (persistent connections, small TSO) in their own plot.
        let is_main = |name: &str| {
            name.starts_with("ideal")
                || cfg
                    .modes
                    .iter()
                    .any(|m| m.name == name && m.conn == Conn::Fresh && m.tso_rtt_log.is_none())
        };
        let main: Vec<XySeries> = series.iter().filter(|s| is_main(&s.name)).cloned().collect();
        report::xy_plot(
            &out.join(format!("{NAME}-{}ms.svg", fmt_mean(mean))),
            &opts,
            &main,
        )?;
        if mean == cfg.plot_mean_ms {
            report::xy_plot(&out.join(format!("{NAME}.svg")), &opts, &main)?;
            if main.len() < series.len() {
                let mut o = opts.clone();
                o.title = format!("D3 evaluation, variants: deadlines exp. mean {mean} ms");
                report::xy_plot(&out.join(format!("{NAME}-variants.svg")), &o, &series)?;
            }
        }
    }
    Ok(())
}

fn markdown(
    cfg: &Config,
    env: &Value,
    points: &[Value],
    support: &[Value],
    complete: bool,
    elapsed_s: f64,
) -> String {
    use std::fmt::Write as _;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# D3 evaluation (seed 000, section 6.1): application throughput vs concurrent senders\n\n{}Kernel {} ({}; sch_fq {}), {} CPUs. \
         Bottleneck {} Mbit/s with a {} B buffer (HTB + bfifo; QJump: strict-priority port, {} B per used queue); {} sender hosts, workers round-robin; \
         responses uniform in [{}, {}] B, deadlines exponential; RTT {:.3} ms idle. Load average at start {} ({} qemu processes), at end {} ({}). Run took {:.0} s.\n",
        if complete {
            ""
        } else {
            "**Incomplete run (partial results).** "
        },
        env["kernel"].as_str().unwrap_or("?"),
        if env["in_vm"].as_bool().unwrap_or(false) {
            "VM"
        } else {
            "host"
        },
        if env["sch_fq_available"].as_bool().unwrap_or(false) {
            "available"
        } else {
            "not available"
        },
        env["cpus"],
        cfg.rate_bps / 1_000_000,
        cfg.buffer_bytes,
        cfg.buffer_bytes / 2,
        cfg.sender_hosts,
        cfg.size_min,
        cfg.size_max,
        env["rtt_ms_median"].as_f64().unwrap_or(0.0),
        env["load_at_start"].as_str().unwrap_or("?"),
        env["qemu_processes_at_start"],
        env["load_at_end"].as_str().unwrap_or("?"),
        env["qemu_processes_at_end"],
        elapsed_s,
    );
    if cfg.background_flows > 0 {
        let _ = writeln!(
            md,
            "{} long background flows from the sender hosts to the aggregator during every point (D3 modes: D3 flows without a deadline; others: plain TCP). The details' `bottleneck_mbit` is everything the bottleneck sent.\n",
            cfg.background_flows
        );
    }
    let _ = writeln!(
        md,
        "Modes, with the enforcement each used (the sender agents' status `enforcement`):\n"
    );
    for m in &cfg.modes {
        let e = &env["enforcement"][&m.name];
        let what = match &m.kind {
            Kind::Tcp => "plain TCP (cubic), no agent on the senders".to_string(),
            Kind::Paced => format!(
                "per-flow pacing at the fair share {} Mbit/s / N",
                cfg.rate_bps / 1_000_000
            ),
            Kind::Qjump => format!(
                "QJump levels: responses with a deadline below the median (mean x ln 2) at the top level (factor {}, DSCP 46, switch queue 5), the rest at the lowest (queue 0)",
                cfg.qjump_factor
            ),
            Kind::D3 { first_rtt_rate } => format!(
                "D3, first-RTT rate {}",
                first_rtt_rate
                    .map(|r| format!("{} Mbit/s", r * 8 / 1_000_000))
                    .unwrap_or_else(|| "default (1% of link_rate = 10 Mbit/s)".into())
            ),
        };
        let _ = writeln!(
            md,
            "- `{}` ({what}; {} connections{}): {}",
            m.name,
            match m.conn {
                Conn::Fresh => "fresh",
                Conn::Persistent => "persistent",
            },
            m.tso_rtt_log
                .map(|v| format!("; senders' tcp_tso_rtt_log = {v}"))
                .unwrap_or_default(),
            if e.is_null() {
                "-".to_string()
            } else {
                format!(
                    "mode `{}`, TCP flows: {}{}",
                    e["mode"].as_str().unwrap_or("?"),
                    e["tcp_flows"].as_str().unwrap_or("?"),
                    e["aggregates"]
                        .as_str()
                        .map(|a| format!(", aggregates: {a}"))
                        .unwrap_or_default()
                )
            }
        );
    }
    let ns: Vec<usize> = cfg.senders.clone();
    for &mean in &cfg.deadline_means_ms {
        let rows: Vec<Vec<String>> = series_names(cfg)
            .into_iter()
            .filter_map(|m| {
                let cv = curve(points, &m, mean);
                if cv.is_empty() {
                    return None;
                }
                let mut row = vec![m];
                for &n in &ns {
                    row.push(
                        cv.iter()
                            .find(|x| x.0 == n)
                            .map(|x| format!("{:.1}", x.1 * 100.0))
                            .unwrap_or_else(|| "-".into()),
                    );
                }
                Some(row)
            })
            .collect();
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(md, "\n## Application throughput (%), deadline mean {mean} ms\n");
        let mut headers = vec!["mode \\ N".to_string()];
        headers.extend(ns.iter().map(|n| n.to_string()));
        md.push_str(&report::markdown_table(&headers, &rows));
    }
    let _ = writeln!(
        md,
        "\nResponses scored per point (after {} warm-up queries):",
        cfg.warmup_queries
    );
    let counts: Vec<String> = ns
        .iter()
        .map(|&n| format!("N={n}: {}", (cfg.queries(n) - cfg.warmup_queries) * n as u64))
        .collect();
    let _ = writeln!(md, "{}.", counts.join(", "));

    let _ = writeln!(md, "\n## Senders supported\n");
    let headers: Vec<String> = ["mode", "deadline mean (ms)", "N at >= 99%", "N at >= 95%"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let rows: Vec<Vec<String>> = support
        .iter()
        .map(|s| {
            vec![
                s["mode"].as_str().unwrap_or("").to_string(),
                s["deadline_mean_ms"].to_string(),
                s["n_at_99_text"].as_str().unwrap_or("").to_string(),
                s["n_at_95_text"].as_str().unwrap_or("").to_string(),
            ]
        })
        .collect();
    md.push_str(&report::markdown_table(&headers, &rows));
    let _ = writeln!(
        md,
        "\nThe largest measured N at which every measured N up to it reaches the threshold; in parentheses the crossing \
         interpolated linearly to the next measured N. `< {}`: not even the smallest N.\n",
        ns.iter().min().copied().unwrap_or(0)
    );
    // Ratios of D3 to the others: senders supported, and app throughput at each N.
    let est = |mode: &str, mean: f64, k: &str| -> Option<(f64, &'static str)> {
        let s = support
            .iter()
            .find(|s| s["mode"] == mode && s["deadline_mean_ms"].as_f64() == Some(mean))?;
        let n = s[format!("n_at_{k}")].as_u64().unwrap_or(0) as f64;
        if let Some(x) = s[format!("n_at_{k}_interpolated")].as_f64() {
            Some((x, ""))
        } else if n == 0.0 {
            Some((0.0, "<"))
        } else if s[format!("n_at_{k}_all_measured")].as_bool() == Some(true) {
            Some((n, ">="))
        } else {
            Some((n, ""))
        }
    };
    let smallest = ns.iter().min().copied().unwrap_or(0);
    let fmt_est = |e: (f64, &str)| {
        if e.1 == "<" {
            format!("< {smallest}")
        } else {
            format!("{}{:.1}", if e.1.is_empty() { "" } else { ">= " }, e.0)
        }
    };
    let mut rows = Vec::new();
    let d3_series: Vec<&str> = cfg
        .modes
        .iter()
        .filter(|m| m.is_d3() && m.conn == Conn::Fresh)
        .map(|m| m.name.as_str())
        .collect();
    for &mean in &cfg.deadline_means_ms {
        for d in &d3_series {
            for base in ["tcp", "paced", "qjump"] {
                let (cd, cb) = (curve(points, d, mean), curve(points, base, mean));
                if cd.is_empty() || cb.is_empty() {
                    continue;
                }
                let mut row = vec![format!("{d} / {base}"), mean.to_string()];
                for k in ["99", "95"] {
                    row.push(match (est(d, mean, k), est(base, mean, k)) {
                        (Some(x), Some(y)) if x.1 != "<" && y.1 != "<" && y.0 > 0.0 => {
                            format!("{:.2} ({} / {})", x.0 / y.0, fmt_est(x), fmt_est(y))
                        }
                        (Some(x), Some(y)) => format!("- ({} / {})", fmt_est(x), fmt_est(y)),
                        _ => "-".into(),
                    });
                }
                let ratios: Vec<String> = cd
                    .iter()
                    .filter_map(|&(n, v, _)| {
                        cb.iter()
                            .find(|x| x.0 == n)
                            .filter(|x| x.1 > 0.0)
                            .map(|x| format!("{n}: {:.2}", v / x.1))
                    })
                    .collect();
                row.push(ratios.join(", "));
                rows.push(row);
            }
        }
    }
    if !rows.is_empty() {
        let _ = writeln!(md, "## Ratios (D3 / other)\n");
        let headers: Vec<String> = [
            "ratio",
            "deadline mean (ms)",
            "senders at >= 99%",
            "senders at >= 95%",
            "app throughput ratio at each N",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        md.push_str(&report::markdown_table(&headers, &rows));
        let _ = writeln!(
            md,
            "\nSenders supported: the interpolated crossing where there is one, else the largest measured N (`>=`: reached at every measured N; `< {smallest}`: not even at the smallest); no ratio when either is below the smallest N.\n"
        );
    }

    // Details per point.
    let _ = writeln!(md, "\n## Details per point\n");
    let headers: Vec<String> = [
        "mode",
        "mean ms",
        "N",
        "app thr %",
        "95% CI",
        "responses",
        "p50 fct ms",
        "p99 fct ms",
        "drops",
        "RTOs",
        "TLPs",
        "retrans",
        "D3 req/grants/quenched/fb ignored",
        "router C/line mean (min)",
        "router N max",
        "load after",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows: Vec<Vec<String>> = points
        .iter()
        .filter(|p| p.get("error").is_none() && p["tags"]["mode"] != IDEAL)
        .map(|p| {
            let s = &p["summary"];
            let ci = &s["app_throughput_ci95"];
            let d3 = &s["d3_senders"];
            let rs = &s["d3_router_samples"];
            vec![
                p["tags"]["mode"].as_str().unwrap_or("").into(),
                p["tags"]["deadline_mean_ms"].as_str().unwrap_or("").into(),
                p["tags"]["senders"].as_str().unwrap_or("").into(),
                format!("{:.2}", s["app_throughput"].as_f64().unwrap_or(0.0) * 100.0),
                format!(
                    "{:.1}-{:.1}",
                    ci[0].as_f64().unwrap_or(0.0) * 100.0,
                    ci[1].as_f64().unwrap_or(0.0) * 100.0
                ),
                s["responses"].to_string(),
                format!("{:.2}", s["p50_fct_ms"].as_f64().unwrap_or(0.0)),
                format!("{:.2}", s["p99_fct_ms"].as_f64().unwrap_or(0.0)),
                s["bottleneck_drops"].to_string(),
                s["tcp"]["timeouts"].to_string(),
                s["tcp"]["loss_probes"].to_string(),
                s["tcp"]["retrans_segs"].to_string(),
                if d3.is_null() {
                    String::new()
                } else {
                    format!(
                        "{}/{}/{}/{}",
                        d3["requests"], d3["grants"], d3["quenched"], d3["feedback_ignored"]
                    )
                },
                if rs.is_null() {
                    String::new()
                } else {
                    format!(
                        "{:.2} ({:.2})",
                        rs["capacity_over_line_mean"].as_f64().unwrap_or(0.0),
                        rs["capacity_over_line_min"].as_f64().unwrap_or(0.0)
                    )
                },
                if rs.is_null() {
                    String::new()
                } else {
                    format!("{}", rs["flows_max"].as_f64().unwrap_or(0.0))
                },
                s["load_after"].as_str().unwrap_or("").into(),
            ]
        })
        .collect();
    md.push_str(&report::markdown_table(&headers, &rows));
    let failed: Vec<String> = points
        .iter()
        .filter(|p| p.get("error").is_some())
        .map(|p| {
            format!(
                "- {} mean {} N {}: {}",
                p["tags"]["mode"], p["tags"]["deadline_mean_ms"], p["tags"]["senders"], p["error"]
            )
        })
        .collect();
    if !failed.is_empty() {
        let _ = writeln!(md, "\n## Failed points\n\n{}", failed.join("\n"));
    }
    let _ = writeln!(
        md,
        "\n`tcp` and `paced` are measured once per N (at the first mean) and scored against every mean: they never see \
         deadlines, and the draws of the three means share their random numbers (same sizes, deadlines scaled). \
         RTOs, TLPs, retrans: the active senders' TCPTimeouts, TCPLossProbes and RetransSegs during the point. \
         D3 counters: the sender agents' `d3_classes` (class `pa`), the router's C sampled every {ROUTER_SAMPLE_MS} ms."
    );
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supported_n() {
        let c = vec![(5, 1.0, 100), (10, 0.995, 100), (15, 0.98, 100), (20, 0.999, 100)];
        assert_eq!(supported(&c, 0.99).0, 10);
        let (n, all, x) = supported(&c, 0.99);
        assert!(!all);
        assert!(
            (x.unwrap() - (10.0 + 0.005 / 0.015 * 5.0)).abs() < 1e-9,
            "{n} {x:?}"
        );
        assert_eq!(supported(&c, 0.95), (20, true, None));
        assert_eq!(supported(&[(5, 0.5, 10)], 0.95).0, 0);
        assert_eq!(supported_text((0, false, None), 5, 40), "< 5");
        assert_eq!(supported_text((40, true, None), 5, 40), ">= 40");
    }

    #[test]
    fn wilson_interval() {
        let (lo, hi) = wilson(990, 1000);
        assert!(lo > 0.98 && lo < 0.99 && hi > 0.99 && hi < 0.996, "{lo} {hi}");
        assert_eq!(wilson(0, 0), (0.0, 1.0));
    }

    #[test]
    fn draws_scale_with_the_mean() {
        // The rescoring of deadline-unaware modes relies on this.
        let mut o = pa::PaOpts::new(vec!["127.0.0.1:1".parse().unwrap(); 5], 20.0);
        o.queries = 50;
        let a = pa::draws(&o).unwrap();
        o.deadline_mean_ms = 40.0;
        let b = pa::draws(&o).unwrap();
        for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
            assert_eq!(x.0, y.0);
            assert!((y.1 as f64 - 2.0 * x.1 as f64).abs() <= 1.0, "{x:?} {y:?}");
        }
    }

    /// Every policy the experiment writes passes the agent's validator and compiles (offline:
    /// the interfaces are the testbed's), and the senders' first rule selects the responses.
    #[test]
    fn policies_validate_and_compile() {
        use paceline::policy::{self, CompileContext, EnforcementMode, OfflineHost};
        let compiled = |name: &str, text: &str| {
            let v = policy::parse_str(text, name, &OfflineHost).unwrap_or_else(|errors| {
                panic!(
                    "{name}: rejected:\n{}\n{text}",
                    errors
                        .iter()
                        .map(|e| e.to_string())
                        .collect::<Vec<_>>()
                        .join("\n")
                )
            });
            let ctx = CompileContext {
                mode: v.enforcement().fixed().unwrap_or(EnforcementMode::Fq),
                previous: None,
                all_routes_managed: false,
            };
            policy::compile(&v, &ctx).unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        let cfg = Config::new(false);
        for m in cfg.modes.iter().filter(|m| m.kind != Kind::Tcp) {
            let c = compiled(&m.name, &sender_policy(&cfg, m, 10, "eth0"));
            assert!(
                c.rules[0].matches.contains(&format!("src_port {PORT}")),
                "{}: {:?}",
                m.name,
                c.rules[0]
            );
        }
        compiled("router", &router_policy("veth0", 1_000_000_000));
        compiled("receiver", &receiver_policy("veth1"));
    }
}
