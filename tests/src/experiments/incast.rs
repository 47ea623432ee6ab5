//! Seeds 002 (TCP incast) and 003 (Dart's DASR): a client asks S servers for one fragment each
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
//! A star ([`crate::testbed::Star`]) with [`Config::sender_hosts`] server hosts; the bottleneck
//! is the router's egress toward the client: HTB at [`Config::rate_bps`] with a bfifo of
//! [`Config::buffer_bytes`] (seed 002's shallow-buffered top-of-rack port). Each server host
//! runs one `plload serve` server on [`PORT`] (in this process, in the host's namespace); the S
//! servers of a point are S connections, server i on host `i % sender_hosts` (the machine has 2
//! cores: S namespaces with an agent each would be too heavy; the port and DASR count flows,
//! not hosts). The client (`plload incast`, [`incast::run`]) opens the S connections, then asks
//! every server for one [`Config::fragment_bytes`] fragment per block, [`Config::blocks`]
//! blocks.
//!
//! # Modes
//! - `tcp`: no agent anywhere: Linux defaults (200 ms minimum RTO, delayed ACKs up to 40 ms;
//!   the servers' veths keep `noqueue`, so TCP is not paced).
//! - `tcp-tuned`: an agent on every host (servers and client) whose class for the service's
//!   port sets seed 002's mitigations: `rto_min: 5ms` and `delack_max: 5ms` (the seed's 1 ms
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
//! # Micro-benchmark (seed 003)
//! Per mode and for each C in [`Config::micro_competitors`]: the client asks host 0's server
//! for one [`Config::micro_message_bytes`] message at a time (closed loop, one connection) for
//! [`Config::micro_duration_s`], while C bulk TCP flows from the other hosts upload to a server
//! on the client. Median and p99 message completion time. In `paced` the flows are paced at
//! rate / (C + 1).
//!
//! # Outputs (in `--out`)
//! `incast.json`, `incast.md` (tables), `incast-goodput.svg` (goodput vs S, the seed's shape),
//! `incast-p99.svg` (p99 block time vs S). Rewritten after every point.
//!
//! Development knobs (environment): `PLEXP_INCAST_MODES=tcp,dasr`, `PLEXP_INCAST_S=1,64`,
//! `PLEXP_INCAST_BLOCKS=20`, `PLEXP_INCAST_MICRO=0` (skip the micro-benchmark),
//! `PLEXP_INCAST_RATE_MBIT=400` (the port's rate; DASR advertises 95% of it),
//! `PLEXP_INCAST_BUFFER=65536` (bytes).

use super::Common;
use super::harness::{loadavg, sum_tcp};
use crate::agent::{Agent, Scratch};
use crate::report::{self, PlotOpts, XySeries};
use crate::testbed::{Bottleneck, BottleneckSpec, Host, Star, StarSpec, Testbed};
use crate::workload::{self, Tags, bulk, incast, rpc, serve, stats};
use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::{Value, json};
use std::net::{IpAddr, SocketAddr};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const NAME: &str = "incast";
/// The servers' port (fragments and short messages).
pub const PORT: u16 = 5500;
/// The client's bulk server (the micro-benchmark's competing senders).
pub const BULK_PORT: u16 = 5501;

/// The modes, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Linux defaults, no agent.
    Tcp,
    /// Agents with rto_min and delack_max of 5 ms for the service.
    TcpTuned,
    /// Agents pacing each flow at rate / S.
    Paced,
    /// DASR: the client counts, the servers cap at line / N.
    Dasr,
    /// DASR and the tcp-tuned settings together (what `policies/incast-dasr.yaml` ships).
    DasrTuned,
}

impl Mode {
    pub const ALL: [Mode; 5] = [
        Mode::Tcp,
        Mode::TcpTuned,
        Mode::Paced,
        Mode::Dasr,
        Mode::DasrTuned,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Mode::Tcp => "tcp",
            Mode::TcpTuned => "tcp-tuned",
            Mode::Paced => "paced",
            Mode::Dasr => "dasr",
            Mode::DasrTuned => "dasr-tuned",
        }
    }
    fn dasr(self) -> bool {
        matches!(self, Mode::Dasr | Mode::DasrTuned)
    }
}

/// The experiment's knobs (all of them end up in the JSON).
#[derive(Clone, Debug, Serialize)]
pub struct Config {
    /// Bottleneck rate, bit/s.
    pub rate_bps: u64,
    /// Bottleneck buffer, bytes.
    pub buffer_bytes: u32,
    /// Server hosts (namespaces); the S servers are spread over them round-robin.
    pub sender_hosts: usize,
    /// The S axis.
    pub servers: Vec<usize>,
    /// Bytes per fragment (seed 002: 256 KB).
    pub fragment_bytes: u64,
    /// Blocks per point (seed 002: 100).
    pub blocks: u64,
    /// The line rate the client advertises in `dasr`, bit/s (a few percent below the port's:
    /// shares that add up to exactly its rate keep a standing queue, docs/dasr.md).
    pub dasr_line: u64,
    /// DASR's `rtt` (the fabric's RTT without queueing), microseconds.
    pub dasr_rtt_us: u64,
    /// Micro-benchmark: message size, bytes.
    pub micro_message_bytes: u64,
    /// Micro-benchmark: competing bulk flows.
    pub micro_competitors: Vec<u32>,
    /// Micro-benchmark: seconds per measurement.
    pub micro_duration_s: f64,
    /// The modes.
    pub modes: Vec<Mode>,
}

impl Config {
    /// The host run (400 Mbit/s, seed 002's sizes) or the VM's scaled-down one (under TCG the
    /// emulated port forwards about 20 Mbit/s); `quick` for a smoke test of either.
    pub fn new(quick: bool, in_vm: bool) -> Config {
        let mut c = if in_vm {
            Config {
                rate_bps: 20_000_000,
                // 43 frames: the seed's 64 KB, so a synchronized start of S <= 32 flows, one
                // frame each, fits (32 KB did not, even with every flow paced).
                buffer_bytes: 65_536,
                sender_hosts: 4,
                servers: vec![1, 4, 16, 32],
                fragment_bytes: 32_768,
                blocks: 10,
                dasr_line: 19_000_000,
                dasr_rtt_us: 2_000,
                micro_message_bytes: 8_192,
                micro_competitors: vec![0, 4],
                micro_duration_s: 8.0,
                modes: Mode::ALL.to_vec(),
            }
        } else {
            Config {
                // Not 1 Gbit/s: with offloads off, two cores forward about 650 Mbit/s through
                // the namespaces (one TCP flow at a 1 Gbit/s port reached 64-68%), so the
                // port would not be the bottleneck; at 400 Mbit/s it is (one flow: 94%).
                rate_bps: 400_000_000,
                buffer_bytes: 128 * 1024,
                sender_hosts: 8,
                servers: vec![1, 2, 4, 8, 16, 32, 48, 64],
                fragment_bytes: 256 * 1024,
                blocks: 40,
                dasr_line: 380_000_000,
                dasr_rtt_us: 200,
                micro_message_bytes: 32 * 1024,
                micro_competitors: vec![0, 8],
                micro_duration_s: 4.0,
                modes: Mode::ALL.to_vec(),
            }
        };
        if quick {
            c.servers = vec![1, 8, 32];
            c.blocks = 6;
            c.micro_competitors = vec![4];
            c.micro_duration_s = 2.0;
        }
        c
    }

    /// Applies the `PLEXP_INCAST_*` development overrides.
    fn with_env(mut self) -> Config {
        let var = |k: &str| std::env::var(k).ok().filter(|s| !s.trim().is_empty());
        if let Some(m) = var("PLEXP_INCAST_MODES") {
            let want: Vec<&str> = m.split(',').map(str::trim).collect();
            self.modes.retain(|x| want.contains(&x.name()));
        }
        if let Some(s) = var("PLEXP_INCAST_S") {
            self.servers = s.split(',').filter_map(|x| x.trim().parse().ok()).collect();
        }
        if let Some(b) = var("PLEXP_INCAST_BLOCKS").and_then(|b| b.trim().parse().ok()) {
            self.blocks = b;
        }
        if let Some(m) = var("PLEXP_INCAST_RATE_MBIT").and_then(|b| b.trim().parse::<u64>().ok()) {
            self.rate_bps = m * 1_000_000;
            self.dasr_line = m * 950_000;
        }
        if let Some(b) = var("PLEXP_INCAST_BUFFER").and_then(|b| b.trim().parse().ok()) {
            self.buffer_bytes = b;
        }
        if var("PLEXP_INCAST_MICRO").as_deref() == Some("0") {
            self.micro_competitors.clear();
        }
        self
    }
}

/// The agents of one mode (dropping them stops them).
#[derive(Default)]
struct Agents<'a> {
    /// (host, policy file, interface, agent).
    servers: Vec<(&'a Host, PathBuf, String, Agent<'a>)>,
    client: Option<Agent<'a>>,
}

/// Runs the experiment.
pub fn run(c: &Common) -> Result<()> {
    let in_vm = std::env::var_os("PACELINE_IN_VM").is_some();
    let cfg = Config::new(c.quick, in_vm).with_env();
    std::fs::create_dir_all(&c.out).with_context(|| format!("mkdir {}", c.out.display()))?;
    let t_begin = Instant::now();
    let tb = Testbed::new("incast")?;
    let star = tb.add_star(&StarSpec {
        senders: cfg.sender_hosts,
        bottleneck: None,
        ..Default::default()
    })?;
    let bn = star
        .receiver_link
        .bottleneck_a_to_b(&BottleneckSpec::htb(cfg.rate_bps, cfg.buffer_bytes))?;
    let rx_ip = IpAddr::V4(star.receiver.ipv4());
    let rtts = super::harness::ping_rtts_ms(&star.senders[0], rx_ip, 9, "client")?;
    let fq = paceline::features::Features::probe().sch_fq;
    let kernel = super::harness::kernel_release();
    let mut env = json!({
        "kernel": kernel,
        "in_vm": in_vm,
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "sch_fq_available": fq,
        "rtt_ms_median": stats::percentile_sorted(&rtts, 50.0),
        "rtt_ms_samples": rtts,
        "load_at_start": loadavg(),
        "enforcement": {},
        "unavailable": {},
    });
    eprintln!(
        "{NAME}: kernel {} (sch_fq: {fq}), {} server hosts, port {} Mbit/s / {} B, RTT {:.3} ms",
        env["kernel"].as_str().unwrap_or("?"),
        cfg.sender_hosts,
        cfg.rate_bps / 1_000_000,
        cfg.buffer_bytes,
        env["rtt_ms_median"].as_f64().unwrap_or(0.0),
    );
    let scratch = Scratch::new("incast");
    let mut servers = Vec::new();
    for h in &star.senders {
        let opts = serve::ServeOpts {
            port: PORT,
            ..Default::default()
        };
        servers.push(h.in_netns(|| serve::Server::start_plain(&opts))??);
    }
    let bulk_server = star.receiver.in_netns(|| {
        serve::Server::start_plain(&serve::ServeOpts {
            port: BULK_PORT,
            ..Default::default()
        })
    })??;

    let mut points: Vec<Value> = Vec::new();
    let mut micro: Vec<Value> = Vec::new();
    for &mode in &cfg.modes {
        let t_mode = Instant::now();
        let first_share = cfg.servers.first().copied().unwrap_or(1);
        let agents = match start_agents(&cfg, &star, &scratch, mode, fq, first_share) {
            Ok(a) => a,
            Err(e) => {
                eprintln!("{NAME}: mode {}: UNAVAILABLE: {e:#}", mode.name());
                env["unavailable"][mode.name()] = json!(format!("{e:#}"));
                continue;
            }
        };
        env["enforcement"][mode.name()] = match agents.servers.first() {
            Some((_, _, _, a)) => a
                .status()
                .map(|s| s["enforcement"].clone())
                .unwrap_or(Value::Null),
            None => json!({"mode": "no agent"}),
        };
        eprintln!(
            "{NAME}: mode {}: agents up in {:.1} s; enforcement {}",
            mode.name(),
            t_mode.elapsed().as_secs_f64(),
            env["enforcement"][mode.name()]
        );
        for &s in &cfg.servers {
            let t0 = Instant::now();
            if mode == Mode::Paced {
                set_share(&cfg, &agents, fq, s)?;
            }
            let p = run_point(&cfg, &star, &bn, &agents, mode, s)
                .unwrap_or_else(|e| json!({"kind": NAME, "tags": tags(mode, s), "error": format!("{e:#}")}));
            let sm = &p["summary"];
            eprintln!(
                "{NAME}: {:<9} S {:>2}: goodput {:7.1} Mbit/s ({:5.1}%) block p50 {:7.2} ms p99 {:7.2} ms rto {} drops {}{} | {:.0}s, total {:.0}s",
                mode.name(),
                s,
                sm["goodput_bps"].as_f64().unwrap_or(0.0) / 1e6,
                sm["goodput_fraction"].as_f64().unwrap_or(0.0) * 100.0,
                sm["p50_block_ms"].as_f64().unwrap_or(0.0),
                sm["p99_block_ms"].as_f64().unwrap_or(0.0),
                sm["rtos"],
                sm["drops"],
                p.get("error").map(|e| format!(" ERROR {e}")).unwrap_or_default(),
                t0.elapsed().as_secs_f64(),
                t_begin.elapsed().as_secs_f64(),
            );
            points.push(p);
            write_outputs(
                &c.out,
                &cfg,
                c,
                &env,
                &points,
                &micro,
                false,
                t_begin.elapsed().as_secs_f64(),
            )?;
        }
        for &k in &cfg.micro_competitors {
            if mode == Mode::Paced {
                set_share(&cfg, &agents, fq, k as usize + 1)?;
            }
            let m = run_micro(&cfg, &star, &bn, mode, k).unwrap_or_else(
                |e| json!({"kind": "incast-micro", "tags": {"mode": mode.name(), "competitors": k.to_string()}, "error": format!("{e:#}")}),
            );
            eprintln!(
                "{NAME}: micro {:<9} C {:>2}: message p50 {:.3} ms p99 {:.3} ms ({} messages){}",
                mode.name(),
                k,
                m["summary"]["p50_ms"].as_f64().unwrap_or(0.0),
                m["summary"]["p99_ms"].as_f64().unwrap_or(0.0),
                m["summary"]["messages"],
                m.get("error").map(|e| format!(" ERROR {e}")).unwrap_or_default(),
            );
            micro.push(m);
            write_outputs(
                &c.out,
                &cfg,
                c,
                &env,
                &points,
                &micro,
                false,
                t_begin.elapsed().as_secs_f64(),
            )?;
        }
        drop(agents);
    }
    drop(servers);
    drop(bulk_server);
    env["load_at_end"] = json!(loadavg());
    write_outputs(
        &c.out,
        &cfg,
        c,
        &env,
        &points,
        &micro,
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

fn tags(mode: Mode, s: usize) -> Value {
    json!({"mode": mode.name(), "servers": s.to_string()})
}

/// The policy of a host in `mode` (None: no agent there). `share` is the paced mode's S.
fn policy(cfg: &Config, mode: Mode, client: bool, ifname: &str, fq: bool, share: usize) -> Option<String> {
    let enforcement = if fq { "auto" } else { "sockops" };
    let head = format!(
        "apiVersion: paceline/v1\nkind: Policy\nmetadata:\n  name: plexp-incast-{m}\n  description: incast study (seeds 002 and 003), mode {m}\nspec:\n  interfaces: [{ifname}]\n  enforcement: {enforcement}\n  # veths report no speed\n  link_rate: 10Gbit\n  levels: [{{name: all, priority: 0}}]\n",
        m = mode.name()
    );
    let rules = format!(
        "  rules:\n    - {{class: svc, protocol: tcp, src_port: {PORT}}}\n    - {{class: svc, protocol: tcp, dst_port: {PORT}}}\n  default_class: other\n"
    );
    match mode {
        Mode::Tcp => None,
        Mode::TcpTuned => Some(format!(
            "{head}  classes:\n    - name: svc\n      level: all\n      tcp: {{rto_min: 5ms, delack_max: 5ms}}\n    - {{name: other, level: all}}\n{rules}"
        )),
        Mode::Paced if client => None,
        Mode::Paced => Some(format!(
            "{head}  classes:\n    - name: svc\n      level: all\n      flow_rate: {}B/s\n    - {{name: other, level: all}}\n  rules:\n    - {{class: svc, protocol: tcp, src_port: {PORT}}}\n    - {{class: svc, protocol: tcp, dst_port: {BULK_PORT}}}\n  default_class: other\n",
            cfg.rate_bps / 8 / share.max(1) as u64
        )),
        Mode::Dasr | Mode::DasrTuned => {
            let role = if client {
                format!(
                    "  dasr:\n    receiver: true\n    sender: false\n    line_rate: {}bit\n    rtt: {}us\n    active_rtts: 2\n",
                    cfg.dasr_line, cfg.dasr_rtt_us
                )
            } else {
                "  dasr: {receiver: false, sender: true}\n".to_string()
            };
            let classes = if mode == Mode::DasrTuned {
                format!(
                    "  classes:\n    - name: svc\n      level: all\n      tcp: {{rto_min: 5ms, delack_max: 5ms}}\n    - {{name: other, level: all}}\n{rules}"
                )
            } else {
                "  classes: [{name: all, level: all}]\n  default_class: all\n".to_string()
            };
            Some(format!("{head}  horizon: 1s\n{classes}{role}"))
        }
    }
}

fn start_agents<'a>(
    cfg: &Config,
    star: &'a Star,
    scratch: &Scratch,
    mode: Mode,
    fq: bool,
    share: usize,
) -> Result<Agents<'a>> {
    let mut agents = Agents::default();
    let dir = |h: &str| scratch.path(&format!("{}-{h}", mode.name()));
    let rx_if = star
        .receiver
        .iface_to(&star.router)
        .context("client iface")?
        .ifname;
    if let Some(text) = policy(cfg, mode, true, &rx_if, fq, share) {
        let p = scratch.path(&format!("{}-client.yaml", mode.name()));
        std::fs::write(&p, text)?;
        // A kernel that cannot load DASR's program makes the agent refuse a DASR policy; at
        // start that is fatal, and Agent::start panics with the agent's output.
        let a = std::panic::catch_unwind(AssertUnwindSafe(|| {
            Agent::start(&star.receiver, &p, &dir("client-state"))
        }))
        .map_err(|e| {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            anyhow::anyhow!("the client's agent did not start: {}", last_lines(&msg, 6))
        })?;
        if mode.dasr()
            && let Some(why) = dasr_unavailable(&a)
        {
            bail!("DASR: {why}");
        }
        agents.client = Some(a);
    }
    for (i, h) in star.senders.iter().enumerate() {
        let ifname = h.iface_to(&star.router).context("server iface")?.ifname;
        let Some(text) = policy(cfg, mode, false, &ifname, fq, share) else {
            continue;
        };
        let p = scratch.path(&format!("{}-s{i}.yaml", mode.name()));
        std::fs::write(&p, text)?;
        let a = Agent::start(h, &p, &dir(&format!("s{i}-state")));
        agents.servers.push((h, p, ifname, a));
    }
    Ok(agents)
}

fn last_lines(s: &str, n: usize) -> String {
    let v: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    v[v.len().saturating_sub(n)..].join(" / ")
}

/// Why the agent runs without DASR, if it does (its policy asked for DASR; a kernel that
/// cannot load DASR's program refuses the policy, so the agent then runs no policy at all).
fn dasr_unavailable(a: &Agent) -> Option<String> {
    let st = a.status()?;
    if st["dasr"].is_null() {
        let errs = st["reloads"]["last"]["errors"].clone();
        return Some(format!("the agent did not take the DASR policy: {errs}"));
    }
    None
}

/// The paced mode's flow rate for `share` concurrent flows.
fn set_share(cfg: &Config, agents: &Agents, fq: bool, share: usize) -> Result<()> {
    for (_h, _p, ifname, a) in &agents.servers {
        let text = policy(cfg, Mode::Paced, false, ifname, fq, share).expect("a paced policy");
        a.apply_policy(&text, Duration::from_secs(2))?;
    }
    Ok(())
}

/// Sums `counters.dasr` fields over agents.
fn dasr_counters<'x>(agents: impl Iterator<Item = &'x Agent<'x>>) -> Value {
    let mut sum = serde_json::Map::new();
    for a in agents {
        let Some(st) = a.status() else { continue };
        let Some(o) = st["counters"]["dasr"].as_object().cloned() else {
            continue;
        };
        for (k, v) in o {
            if let Some(x) = v.as_u64() {
                let e = sum.entry(k).or_insert(json!(0));
                *e = json!(e.as_u64().unwrap_or(0) + x);
            }
        }
    }
    Value::Object(sum)
}

fn delta(a: &Value, b: &Value) -> Value {
    let mut out = serde_json::Map::new();
    if let Some(o) = b.as_object() {
        for (k, v) in o {
            let x = v.as_u64().unwrap_or(0).saturating_sub(a[k].as_u64().unwrap_or(0));
            out.insert(k.clone(), json!(x));
        }
    }
    Value::Object(out)
}

/// One (mode, S) point.
fn run_point(
    cfg: &Config,
    star: &Star,
    bn: &Bottleneck,
    agents: &Agents,
    mode: Mode,
    s: usize,
) -> Result<Value> {
    let addrs: Vec<SocketAddr> = (0..s)
        .map(|i| SocketAddr::new(IpAddr::V4(star.senders[i % cfg.sender_hosts].ipv4()), PORT))
        .collect();
    let active: Vec<&Host> = star.senders.iter().take(s.min(cfg.sender_hosts)).collect();
    let mut opts = incast::IncastOpts::new(addrs);
    opts.fragment = cfg.fragment_bytes;
    opts.blocks = cfg.blocks;
    opts.block_timeout_s = 60.0;
    let dasr_on = mode.dasr();
    let (rx0, tx0) = if dasr_on {
        (
            dasr_counters(agents.client.iter()),
            dasr_counters(agents.servers.iter().map(|x| &x.3)),
        )
    } else {
        (Value::Null, Value::Null)
    };
    let q0 = bn.stats()?;
    let tcp0 = sum_tcp(&active);
    let tg: Tags = [
        ("mode".to_string(), mode.name().to_string()),
        ("servers".to_string(), s.to_string()),
    ]
    .into_iter()
    .collect();
    let r = star.receiver.in_netns(|| incast::run(&opts, &tg))??;
    std::thread::sleep(Duration::from_millis(50));
    let q1 = bn.stats()?;
    let tcp1 = sum_tcp(&active);
    let sm = &r.summary;
    let mut summary = json!({
        "servers": s,
        "blocks": sm.blocks,
        "fragment_bytes": sm.fragment_bytes,
        "goodput_bps": sm.goodput_bps,
        "goodput_fraction": sm.goodput_bps / cfg.rate_bps as f64,
        "mean_block_ms": sm.mean_block_ms,
        "p50_block_ms": sm.p50_block_ms,
        "p99_block_ms": sm.p99_block_ms,
        "max_block_ms": sm.max_block_ms,
        "ideal_block_ms": ideal_block_ms(cfg, s),
        "rtos": tcp1[1] - tcp0[1],
        "retransmissions": tcp1[0] - tcp0[0],
        "loss_probes": tcp1[2] - tcp0[2],
        "drops": q1.drops - q0.drops,
        "port_packets": q1.packets - q0.packets,
        "duration_s": sm.duration_s,
    });
    if dasr_on {
        summary["dasr_client"] = delta(&rx0, &dasr_counters(agents.client.iter()));
        summary["dasr_servers"] = delta(&tx0, &dasr_counters(agents.servers.iter().map(|x| &x.3)));
    }
    Ok(json!({
        "kind": NAME,
        "tags": tags(mode, s),
        "summary": summary,
        "block_ms": r.block_ms,
    }))
}

/// A block's completion time at the port's rate with nothing lost: its frames' wire bytes
/// (1448-byte segments of 1514-byte frames) over the rate.
fn ideal_block_ms(cfg: &Config, s: usize) -> f64 {
    let bytes = cfg.fragment_bytes as f64 * s as f64 * 1514.0 / 1448.0;
    bytes * 8.0 / cfg.rate_bps as f64 * 1e3
}

/// One micro-benchmark measurement: short messages from host 0 next to `k` bulk uploads.
fn run_micro(cfg: &Config, star: &Star, bn: &Bottleneck, mode: Mode, k: u32) -> Result<Value> {
    let to = SocketAddr::new(IpAddr::V4(star.senders[0].ipv4()), PORT);
    let mut o = rpc::RpcOpts::closed_loop(to, cfg.micro_duration_s);
    o.resp_size = cfg.micro_message_bytes;
    o.warmup = 0.3;
    o.samples = true;
    o.timeout_ms = 5000;
    let bulk_to = SocketAddr::new(IpAddr::V4(star.receiver.ipv4()), BULK_PORT);
    let others: Vec<&Host> = star.senders.iter().skip(1).collect();
    let q0 = bn.stats()?;
    let report = std::thread::scope(|sc| -> Result<rpc::RpcReport> {
        let mut handles = Vec::new();
        if k > 0 && !others.is_empty() {
            for (i, h) in others.iter().enumerate() {
                let n = k / others.len() as u32 + u32::from((i as u32) < k % others.len() as u32);
                if n == 0 {
                    continue;
                }
                // Start the bulk flows first and keep them up past the messages' end.
                let bo = bulk::BulkOpts::tcp(bulk_to, n, cfg.micro_duration_s + 1.0);
                handles.push(sc.spawn(move || h.in_netns(|| bulk::run(&bo, &Tags::new()))));
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        let r = star.receiver.in_netns(|| rpc::run(&o, &Tags::new()))??;
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("bulk thread panicked"))???;
        }
        Ok(r)
    })?;
    let q1 = bn.stats()?;
    let lat = &report.latency;
    Ok(json!({
        "kind": "incast-micro",
        "tags": {"mode": mode.name(), "competitors": k.to_string()},
        "summary": {
            "competitors": k,
            "messages": lat.count,
            "p50_ms": lat.p50_us / 1e3,
            "p99_ms": lat.p99_us / 1e3,
            "mean_ms": lat.mean_us / 1e3,
            "max_ms": lat.max_us / 1e3,
            "lost": report.summary.lost,
            "ideal_ms": cfg.micro_message_bytes as f64 * 1514.0 / 1448.0 * 8.0 / cfg.rate_bps as f64 * 1e3,
            "drops": q1.drops - q0.drops,
        },
    }))
}

fn curve(points: &[Value], mode: &str, key: &str, scale: f64) -> Vec<(f64, f64)> {
    points
        .iter()
        .filter(|p| p["tags"]["mode"] == mode && p.get("error").is_none())
        .filter_map(|p| {
            Some((
                p["summary"]["servers"].as_f64()?,
                p["summary"][key].as_f64()? * scale,
            ))
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn write_outputs(
    out: &Path,
    cfg: &Config,
    c: &Common,
    env: &Value,
    points: &[Value],
    micro: &[Value],
    complete: bool,
    elapsed_s: f64,
) -> Result<()> {
    let doc = json!({
        "kind": NAME,
        "version": workload::SCHEMA_VERSION,
        "complete": complete,
        "elapsed_s": elapsed_s,
        "seed": c.seed,
        "quick": c.quick,
        "config": cfg,
        "environment": env,
        "results": points,
        "micro": micro,
    });
    workload::write_json(&doc, Some(&out.join(format!("{NAME}.json"))))?;
    std::fs::write(out.join(format!("{NAME}.md")), markdown(cfg, env, points, micro))?;
    for (file, key, title, ylabel, scale) in [
        (
            "goodput",
            "goodput_bps",
            "Incast goodput",
            "goodput (Mbit/s)",
            1e-6,
        ),
        (
            "p99",
            "p99_block_ms",
            "Incast block completion, p99",
            "p99 block time (ms)",
            1.0,
        ),
    ] {
        let series: Vec<XySeries> = cfg
            .modes
            .iter()
            .map(|m| XySeries {
                name: m.name().into(),
                points: curve(points, m.name(), key, scale),
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        if !series.is_empty() {
            let opts = PlotOpts::new(
                &format!(
                    "{title}: {} Mbit/s port, {} KB buffer, {} KB fragments",
                    cfg.rate_bps / 1_000_000,
                    cfg.buffer_bytes / 1024,
                    cfg.fragment_bytes / 1024
                ),
                "servers (S)",
                ylabel,
            );
            report::xy_plot(&out.join(format!("{NAME}-{file}.svg")), &opts, &series)?;
        }
    }
    Ok(())
}

fn markdown(cfg: &Config, env: &Value, points: &[Value], micro: &[Value]) -> String {
    let mut s = format!(
        "# Incast (seeds 002, 003)\n\nKernel {}, sch_fq {}, port {} Mbit/s with a {} B buffer, RTT {:.3} ms, {} KB fragments, {} blocks per point.\n\n",
        env["kernel"].as_str().unwrap_or("?"),
        env["sch_fq_available"],
        cfg.rate_bps / 1_000_000,
        cfg.buffer_bytes,
        env["rtt_ms_median"].as_f64().unwrap_or(0.0),
        cfg.fragment_bytes / 1024,
        cfg.blocks
    );
    if let Some(u) = env["unavailable"].as_object().filter(|u| !u.is_empty()) {
        for (m, why) in u {
            s += &format!("Mode `{m}` did not run: {}\n\n", why.as_str().unwrap_or(""));
        }
    }
    s += "| mode | S | goodput (Mbit/s) | of the port | block p50 (ms) | block p99 (ms) | ideal (ms) | RTOs | drops |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for p in points {
        let m = p["tags"]["mode"].as_str().unwrap_or("?");
        let n = p["tags"]["servers"].as_str().unwrap_or("?");
        if let Some(e) = p.get("error") {
            s += &format!(
                "| {m} | {n} | error: {} | | | | | | |\n",
                e.as_str().unwrap_or("")
            );
            continue;
        }
        let x = &p["summary"];
        let f = |k: &str| x[k].as_f64().unwrap_or(0.0);
        s += &format!(
            "| {m} | {n} | {:.1} | {:.1}% | {:.2} | {:.2} | {:.2} | {} | {} |\n",
            f("goodput_bps") / 1e6,
            f("goodput_fraction") * 100.0,
            f("p50_block_ms"),
            f("p99_block_ms"),
            f("ideal_block_ms"),
            x["rtos"],
            x["drops"]
        );
    }
    // The issue's aims, as ratios of this run's own points.
    let at = |m: &str, n: usize| {
        points.iter().find(|p| {
            p["tags"]["mode"] == m
                && p["tags"]["servers"] == n.to_string().as_str()
                && p.get("error").is_none()
        })
    };
    let big: Vec<usize> = cfg.servers.iter().copied().filter(|&n| n >= 16).collect();
    if !big.is_empty() {
        s += "\n## p99 block time of tcp / of the mode (S >= 16; aim for dasr: >= 2.5)\n\n| mode |";
        for n in &big {
            s += &format!(" S = {n} |");
        }
        s += "\n|---|";
        s += &"---:|".repeat(big.len());
        s += "\n";
        for m in &cfg.modes {
            s += &format!("| {} |", m.name());
            for &n in &big {
                let r = match (at("tcp", n), at(m.name(), n)) {
                    (Some(t), Some(x)) => {
                        let (a, b) = (
                            t["summary"]["p99_block_ms"].as_f64().unwrap_or(0.0),
                            x["summary"]["p99_block_ms"].as_f64().unwrap_or(0.0),
                        );
                        if b > 0.0 {
                            format!(" {:.2} |", a / b)
                        } else {
                            " - |".into()
                        }
                    }
                    _ => " - |".into(),
                };
                s += &r;
            }
            s += "\n";
        }
    }
    if !micro.is_empty() {
        s += &format!(
            "\n## Short messages (seed 003's micro-benchmark)\n\n{} B messages, closed loop, next to C bulk uploads to the same client.\n\n| mode | C | messages | p50 (ms) | p99 (ms) | ideal (ms) | port drops |\n|---|---:|---:|---:|---:|---:|---:|\n",
            cfg.micro_message_bytes
        );
        for m in micro {
            let md = m["tags"]["mode"].as_str().unwrap_or("?");
            let k = m["tags"]["competitors"].as_str().unwrap_or("?");
            if let Some(e) = m.get("error") {
                s += &format!("| {md} | {k} | error: {} | | | | |\n", e.as_str().unwrap_or(""));
                continue;
            }
            let x = &m["summary"];
            let f = |k: &str| x[k].as_f64().unwrap_or(0.0);
            s += &format!(
                "| {md} | {k} | {} | {:.3} | {:.3} | {:.3} | {} |\n",
                x["messages"],
                f("p50_ms"),
                f("p99_ms"),
                f("ideal_ms"),
                x["drops"]
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_and_carry_the_mode() {
        let cfg = Config::new(false, false);
        for mode in Mode::ALL {
            for client in [false, true] {
                let Some(text) = policy(&cfg, mode, client, "veth0", false, 16) else {
                    assert!(mode == Mode::Tcp || (mode == Mode::Paced && client));
                    continue;
                };
                match paceline::policy::parse_str(&text, "incast.yaml", &paceline::policy::OfflineHost) {
                    Err(e) => panic!("{} client={client}: {e:?}\n{text}", mode.name()),
                    Ok(v) => assert!(v.warnings.is_empty(), "{}: {:?}", mode.name(), v.warnings),
                }
                match mode {
                    Mode::TcpTuned => assert!(text.contains("rto_min: 5ms")),
                    Mode::Paced => assert!(text.contains(&format!("flow_rate: {}B/s", 50_000_000 / 16))),
                    Mode::Dasr | Mode::DasrTuned if client => assert!(text.contains("receiver: true")),
                    Mode::Dasr | Mode::DasrTuned => assert!(text.contains("sender: true")),
                    Mode::Tcp => unreachable!(),
                }
            }
        }
    }

    #[test]
    fn ideal_block_is_wire_bytes_over_rate() {
        let cfg = Config::new(false, false);
        // 64 x 256 KiB of payload in 1448-byte segments at 400 Mbit/s: 350.9 ms.
        let ms = ideal_block_ms(&cfg, 64);
        assert!((ms - 350.9).abs() < 0.1, "{ms}");
    }
}
