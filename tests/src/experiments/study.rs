//! Seed 001 (TCP pacing in data center networks, Ghobadi and Ganjali): N long-lived TCP flows
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
//! A point is (buffer, mode, N). Its N flows are spread round-robin over `min(S, N)` senders;
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
//! For each buffer and paced mode: the smallest measured N at which pacing is no longer better
//! than no pacing by more than [`TOLERANCE`] (5%): `p99_unpaced < (1 + 0.05) * p99_paced`
//! (also computed for the mean FCT). `None` ("> max N") when pacing helps at every N measured.
//!
//! # Outputs (in `--out`)
//! `pacing-study.json` (config, environment, one workload-shaped result per point, N*),
//! `pacing-study.md` (tables), and per buffer `pacing-study-{p99-fct,mean-fct,utilisation,
//! drops}-b<pkts>.svg`. The JSON is rewritten after every point, so an aborted run keeps what
//! it measured.

use super::Common;
use crate::agent::{Agent, Scratch};
use crate::report::{self, PlotOpts, XySeries};
use crate::testbed::{Bottleneck, BottleneckSpec, Host, QdiscStats, Star, StarSpec, Testbed};
use crate::workload::{self, Tags, bulk, serve, stats};
use anyhow::{Context, Result, anyhow, ensure};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use serde_json::{Value, json};
use std::net::{IpAddr, SocketAddr};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const NAME: &str = "pacing-study";
/// The study's TCP port (the agents' class rule matches it).
const PORT: u16 = 5301;
/// A full frame on the wire of the veths (MTU 1500 + Ethernet header): what HTB, bfifo and the
/// agent's rates count.
const FRAME: u32 = 1514;
/// TCP payload per full frame (MSS 1448 with timestamps).
const PAYLOAD: f64 = 1448.0;
/// Relative margin by which paced must beat unpaced to count as "helping" (N*).
pub const TOLERANCE: f64 = 0.05;

/// How the senders pace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Unpaced,
    PerFlow,
    PerHost,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Unpaced, Mode::PerFlow, Mode::PerHost];
    fn name(self) -> &'static str {
        match self {
            Mode::Unpaced => "unpaced",
            Mode::PerFlow => "per-flow",
            Mode::PerHost => "per-host+per-flow",
        }
    }
}

/// The experiment's knobs (all of them end up in the JSON).
#[derive(Clone, Debug, Serialize)]
pub struct Config {
    /// Bottleneck rate, bit/s.
    pub rate_bps: u64,
    /// netem delay on the ACK path, ms (the base RTT is this plus the testbed's own).
    pub delay_ms: f64,
    /// Sender hosts.
    pub senders: usize,
    /// Bytes per flow.
    pub flow_bytes: u64,
    /// Flows per point at least (rounds of N flows until reached).
    pub samples: usize,
    /// The N axis.
    pub flows: Vec<usize>,
    /// Bottleneck buffers, in full frames.
    pub buffers_pkts: Vec<u32>,
    /// Each flow starts after a seeded uniform offset in [0, this) ms.
    pub start_jitter_ms: f64,
    /// Pause between rounds, ms (lets the queue drain and the sockets close).
    pub round_gap_ms: u64,
    /// Paced rates as a fraction of the fair share (1.0: exactly rate / N and the host's
    /// share).
    pub pace_fraction: f64,
    /// The bottleneck qdisc: `netem` (`rate` + `limit` in packets) or `htb` (HTB + bfifo,
    /// the testbed's); netem falls back to HTB where the kernel has no sch_netem.
    pub shaper: String,
    /// HTB `burst`/`cburst` of the bottleneck class in bytes (None: tc's default, about one
    /// MTU with high-resolution timers).
    pub htb_burst_bytes: Option<u32>,
}

impl Config {
    /// The full run (VM budget ~15 minutes) or the quick smoke test.
    pub fn new(quick: bool) -> Config {
        // 10 Mbit/s: under TCG a late timer (typically 0.2 ms, at times several ms) is small
        // against a frame's 1.2 ms; at 20-50 Mbit/s the bottleneck forwarded well below its rate
        // in calibration runs. 40 ms of RTT make the BDP 50 KB (33 frames).
        if quick {
            Config {
                rate_bps: 10_000_000,
                delay_ms: 40.0,
                senders: 2,
                flow_bytes: 250_000,
                samples: 8,
                flows: vec![1, 8],
                buffers_pkts: vec![4],
                start_jitter_ms: 10.0,
                round_gap_ms: 50,
                pace_fraction: 1.0,
                shaper: "netem".into(),
                htb_burst_bytes: None,
            }
        } else {
            Config {
                rate_bps: 10_000_000,
                delay_ms: 40.0,
                senders: 4,
                flow_bytes: 500_000,
                samples: 24,
                flows: vec![1, 4, 8, 16, 32],
                buffers_pkts: vec![4, 16],
                start_jitter_ms: 10.0,
                round_gap_ms: 100,
                pace_fraction: 1.0,
                shaper: "netem".into(),
                htb_burst_bytes: None,
            }
        }
    }

    /// Overrides from `PACELINE_STUDY_*` variables (they reach the VM), for exploring the
    /// parameter space without editing code; the JSON records what ran.
    pub fn with_env(mut self) -> Result<Config> {
        fn var<T: std::str::FromStr>(k: &str) -> Result<Option<T>> {
            match std::env::var(format!("PACELINE_STUDY_{k}")) {
                Ok(v) => v
                    .trim()
                    .parse()
                    .map(Some)
                    .map_err(|_| anyhow!("PACELINE_STUDY_{k}={v:?} does not parse")),
                Err(_) => Ok(None),
            }
        }
        fn list<T: std::str::FromStr>(k: &str) -> Result<Option<Vec<T>>> {
            match std::env::var(format!("PACELINE_STUDY_{k}")) {
                Ok(v) => v
                    .split(',')
                    .map(|x| {
                        x.trim()
                            .parse()
                            .map_err(|_| anyhow!("PACELINE_STUDY_{k}={v:?} does not parse"))
                    })
                    .collect::<Result<Vec<T>>>()
                    .map(Some),
                Err(_) => Ok(None),
            }
        }
        if let Some(m) = var::<f64>("RATE_MBIT")? {
            self.rate_bps = (m * 1e6) as u64;
        }
        if let Some(v) = var("DELAY_MS")? {
            self.delay_ms = v;
        }
        if let Some(v) = var("SENDERS")? {
            self.senders = v;
        }
        if let Some(v) = var("FLOW_BYTES")? {
            self.flow_bytes = v;
        }
        if let Some(v) = var("SAMPLES")? {
            self.samples = v;
        }
        if let Some(v) = list("FLOWS")? {
            self.flows = v;
        }
        if let Some(v) = list("BUFFERS")? {
            self.buffers_pkts = v;
        }
        if let Some(v) = var("JITTER_MS")? {
            self.start_jitter_ms = v;
        }
        if let Some(v) = var("PACE")? {
            self.pace_fraction = v;
        }
        if let Some(v) = var::<String>("SHAPER")? {
            ensure!(
                v == "netem" || v == "htb",
                "PACELINE_STUDY_SHAPER must be netem or htb"
            );
            self.shaper = v;
        }
        if let Some(v) = var("HTB_BURST")? {
            self.htb_burst_bytes = Some(v);
        }
        ensure!(
            self.senders >= 1 && !self.flows.is_empty() && !self.buffers_pkts.is_empty() && self.samples >= 1
        );
        ensure!(
            self.pace_fraction > 0.0 && self.pace_fraction <= 2.0,
            "PACELINE_STUDY_PACE must be in (0, 2]"
        );
        Ok(self)
    }
}

/// Runs the experiment.
pub fn run(c: &Common) -> Result<()> {
    let mut cfg = Config::new(c.quick).with_env()?;
    std::fs::create_dir_all(&c.out).with_context(|| format!("mkdir {}", c.out.display()))?;
    let t_begin = Instant::now();
    let tb = Testbed::new("pacing_study")?;
    // Senders 0..S run agents (the paced modes); S..2S none (unpaced). Modes can then alternate
    // at every point without restarting agents.
    let star = tb.add_star(&StarSpec {
        senders: 2 * cfg.senders,
        bottleneck: None,
        ..Default::default()
    })?;
    let rx_if = star.receiver_link.b.ifname.clone();
    let delay = format!("{}ms", cfg.delay_ms);
    // Kernels without sch_netem (this project's host kernel) run with the testbed's own RTT
    // and an HTB bottleneck.
    let netem = star.receiver.run(&[
        "tc", "qdisc", "replace", "dev", &rx_if, "root", "netem", "delay", &delay, "limit", "100000",
    ]);
    if let Err(e) = &netem {
        eprintln!("{NAME}: WARNING: no netem ({e:#}); the RTT is the testbed's own and the bottleneck HTB");
        cfg.shaper = "htb".into();
    }
    let rx_ip = star.receiver.ipv4();
    let to = SocketAddr::new(IpAddr::V4(rx_ip), PORT);

    // RTT without load, from the first sender.
    let rtts = super::harness::ping_rtts_ms(&star.senders[0], IpAddr::V4(rx_ip), 7, "receiver")?;
    let rtt_ms = stats::percentile_sorted(&rtts, 50.0);
    let bdp_bytes = cfg.rate_bps as f64 / 8.0 * rtt_ms / 1e3;
    let unpaced_qdisc = star.senders[cfg.senders]
        .run(&[
            "tc",
            "qdisc",
            "show",
            "dev",
            &star.sender_iface(cfg.senders).ifname,
        ])
        .unwrap_or_default();
    let kernel = super::harness::kernel_release();
    eprintln!(
        "{NAME}: kernel {kernel}, bottleneck {} Mbit/s ({}), RTT {rtt_ms:.2} ms (median of {} pings), BDP {:.0} bytes = {:.1} frames",
        cfg.rate_bps as f64 / 1e6,
        cfg.shaper,
        rtts.len(),
        bdp_bytes,
        bdp_bytes / FRAME as f64
    );

    // One server on the receiver for the whole run (inside its namespace).
    let server = star.receiver.in_netns(|| {
        serve::Server::start_plain(&serve::ServeOpts {
            port: PORT,
            ..Default::default()
        })
    })??;
    let scratch = Scratch::new("pacing-study");

    let mut env = json!({
        "kernel": kernel,
        "in_vm": std::env::var_os("PACELINE_IN_VM").is_some(),
        "rtt_ms_median": rtt_ms,
        "rtt_ms_samples": rtts,
        "bdp_bytes": bdp_bytes,
        "bdp_frames": bdp_bytes / FRAME as f64,
        "unpaced_sender_qdisc": unpaced_qdisc.trim(),
        "netem_delay_ms": if netem.is_ok() { json!(cfg.delay_ms) } else { Value::Null },
        "shaper": cfg.shaper,
        "agent_enforcement": Value::Null,
        "paced_sender_qdisc": Value::Null,
        "calibration": Value::Null,
    });

    // Diagnostics: PACELINE_STUDY_CALIBRATE=netem,htb,htb:30280@20,...: calibrate each
    // bottleneck variant (htb:<burst bytes>, @<rate in Mbit/s>) and stop.
    if let Ok(v) = std::env::var("PACELINE_STUDY_CALIBRATE") {
        let mut out = Vec::new();
        for spec in v.split(',') {
            let mut c2 = cfg.clone();
            let (spec2, rate) = spec.trim().split_once('@').unwrap_or((spec.trim(), ""));
            let (kind, burst) = spec2.split_once(':').unwrap_or((spec2, ""));
            c2.shaper = kind.to_string();
            c2.htb_burst_bytes = burst.parse().ok();
            if let Ok(m) = rate.parse::<f64>() {
                c2.rate_bps = (m * 1e6) as u64;
            }
            let bn = install_bottleneck(&star, &c2, cfg.buffers_pkts[0])?;
            let r = calibrate(&star, &bn, to, &c2)?;
            eprintln!("{NAME}: calibration of {spec}: {r}");
            out.push(json!({"bottleneck": spec, "result": r}));
        }
        env["calibrations"] = json!(out);
        workload::write_json(
            &json!({"config": cfg, "environment": env}),
            Some(&c.out.join(format!("{NAME}-calibration.json"))),
        )?;
        return Ok(());
    }

    // The agents, up for the whole run (starting one takes tens of seconds under TCG); each
    // point rewrites their policies and waits for the reloads.
    let t0 = Instant::now();
    let mut agents = Agents::start(&star, &scratch, &cfg)?;
    env["agent_enforcement"] = json!(agents.mode());
    env["paced_sender_qdisc"] = json!(
        star.senders[0]
            .run(&["tc", "qdisc", "show", "dev", &star.sender_iface(0).ifname])
            .unwrap_or_default()
            .trim()
    );
    eprintln!(
        "{NAME}: {} agents up in {:.0} s, enforcement {}",
        cfg.senders,
        t0.elapsed().as_secs_f64(),
        env["agent_enforcement"]
    );

    let mut points: Vec<Value> = Vec::new();
    let total = cfg.buffers_pkts.len() * cfg.flows.len() * Mode::ALL.len();
    let mut done = 0;
    for &buf in &cfg.buffers_pkts {
        let bn = install_bottleneck(&star, &cfg, buf)?;
        if env["calibration"].is_null() {
            env["calibration"] = calibrate(&star, &bn, to, &cfg)?;
            eprintln!("{NAME}: calibration: {}", env["calibration"]);
        }
        for &n in &cfg.flows {
            let seed = c.seed ^ ((buf as u64) << 40) ^ ((n as u64) << 20);
            for mode in Mode::ALL {
                let t0 = Instant::now();
                let ag = (mode != Mode::Unpaced).then_some(&mut agents);
                let p = run_point(&cfg, &star, &bn, ag, to, buf, mode, n, seed, bdp_bytes)
                    .with_context(|| format!("point buffer={buf} mode={} N={n}", mode.name()))?;
                done += 1;
                let s = &p["summary"];
                eprintln!(
                    "{NAME}: [{done}/{total}] buf {buf:>2} N {n:>2} {:<18} util {:.3} drops {:.4} mean {:.3}s p99 {:.3}s max {:.3}s retrans {} host drops {} ({:.0}s, total {:.0}s)",
                    mode.name(),
                    s["utilisation"].as_f64().unwrap_or(0.0),
                    s["drop_rate"].as_f64().unwrap_or(0.0),
                    s["mean_fct_s"].as_f64().unwrap_or(0.0),
                    s["p99_fct_s"].as_f64().unwrap_or(0.0),
                    s["max_fct_s"].as_f64().unwrap_or(0.0),
                    s["total_retrans"],
                    s["host_qdisc_drops"].as_u64().unwrap_or(0)
                        + s["agent"]["dropped_horizon"].as_u64().unwrap_or(0),
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
                    false,
                    t_begin.elapsed().as_secs_f64(),
                )?;
            }
        }
    }
    drop(agents);
    drop(server);
    write_outputs(
        &c.out,
        &cfg,
        c,
        &env,
        &points,
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

/// The bottleneck qdisc on the router's egress toward the receiver.
enum Shaper {
    /// The testbed's HTB + bfifo.
    Htb(Bottleneck),
    /// netem `rate R limit <packets>` as the root.
    Netem { host: Host, ifname: String },
}

impl Shaper {
    /// Counters of the qdisc that queues and drops.
    fn stats(&self) -> Result<QdiscStats> {
        match self {
            Shaper::Htb(b) => b.stats(),
            Shaper::Netem { host, ifname } => host
                .qdisc_stats(ifname)?
                .into_iter()
                .find(|q| q.kind == "netem" && q.parent.is_none())
                .with_context(|| format!("no netem root on {ifname}")),
        }
    }
}

/// (Re)installs the bottleneck with a `buf`-frame buffer. netem's schedule is an EDT one
/// (each packet leaves `len / rate` after the previous one's departure time), so a late timer
/// delays packets but costs no capacity; HTB loses the time a late timer costs beyond its
/// burst, which under TCG makes it forward well below its rate (see [`calibrate`]).
fn install_bottleneck(star: &Star, cfg: &Config, buf: u32) -> Result<Shaper> {
    let ifname = star.bottleneck_iface().ifname.clone();
    let rate = format!("{}bit", cfg.rate_bps);
    if cfg.shaper == "netem" {
        let ns = star.router.netns().to_string();
        let _ = star.router.run(&["tc", "qdisc", "del", "dev", &ifname, "root"]);
        star.router
            .run(&[
                "tc",
                "qdisc",
                "add",
                "dev",
                &ifname,
                "root",
                "handle",
                "1:",
                "netem",
                "rate",
                &rate,
                "limit",
                &buf.to_string(),
            ])
            .with_context(|| format!("netem bottleneck on {ifname} in {ns}"))?;
        return Ok(Shaper::Netem {
            host: star.router.clone(),
            ifname,
        });
    }
    let bn = star
        .receiver_link
        .bottleneck_a_to_b(&BottleneckSpec::htb(cfg.rate_bps, buf * FRAME))?;
    if let Some(b) = cfg.htb_burst_bytes {
        let quantum = (cfg.rate_bps / 8 / 10).clamp(FRAME as u64, 200_000).to_string();
        let burst = b.to_string();
        star.router
            .run(&[
                "tc", "class", "change", "dev", &ifname, "parent", "1:", "classid", "1:1", "htb", "rate",
                &rate, "ceil", &rate, "burst", &burst, "cburst", &burst, "quantum", &quantum,
            ])
            .context("setting the bottleneck's HTB burst")?;
    }
    Ok(Shaper::Htb(bn))
}

/// What the bottleneck really forwards here: one UDP flow (from an unpaced sender) offered at
/// 1.2x its rate for 3 s, and the rate at which the bottleneck qdisc dequeued.
fn calibrate(star: &Star, bn: &Shaper, to: SocketAddr, cfg: &Config) -> Result<Value> {
    let q0 = bn.stats()?;
    let mut o = bulk::BulkOpts::tcp(to, 1, 3.0);
    o.udp = true;
    o.rate_bps = Some(cfg.rate_bps * 6 / 5);
    o.msg_size = Some(1400);
    let r = star.senders[cfg.senders].in_netns(|| bulk::run(&o, &Tags::new()))??;
    std::thread::sleep(Duration::from_millis(300));
    let q1 = bn.stats()?;
    let dur = r.flows.first().map(|f| f.duration_s).unwrap_or(3.0);
    let sent_frames = r.flows.first().map(|f| f.packets_sent).unwrap_or(0);
    let dequeued = (q1.bytes - q0.bytes) as f64 * 8.0 / dur;
    Ok(json!({
        "offered_payload_bps": r.summary.send_rate_bps,
        "offered_frames": sent_frames,
        "dequeued_bps": dequeued,
        "dequeued_over_rate": dequeued / cfg.rate_bps as f64,
        "drops": q1.drops - q0.drops,
    }))
}

/// One flow's outcome.
#[derive(Clone, Debug, Serialize)]
struct FlowRec {
    round: usize,
    flow_id: u32,
    sender: usize,
    /// Start offset within the round, s.
    start_s: f64,
    /// None when the flow failed (see `error`).
    fct_s: Option<f64>,
    bytes_sent: u64,
    retrans: u32,
    rtt_us: u32,
    cwnd: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// The paced modes' policy for one sender.
fn policy_yaml(mode: Mode, ifname: &str, flow_rate: u64, host_rate: Option<u64>) -> String {
    let level_rate = host_rate
        .map(|r| format!("      rate: {r}B/s\n"))
        .unwrap_or_default();
    let name = match mode {
        Mode::PerHost => "study-per-host",
        _ => "study-per-flow",
    };
    format!(
        r#"apiVersion: paceline/v1
kind: Policy
metadata:
  name: {name}
  description: pacing study (seed 001), {mode}
spec:
  interfaces: [{ifname}]
  enforcement: auto
  # veths report no speed
  link_rate: 10Gbit
  # a flow paced at 10 Mbit/s / 32 sends a frame every 39 ms: the default 100ms would drop
  # its third queued frame at the host
  horizon: 1s
  levels:
    - name: host
      priority: 0
{level_rate}  classes:
    - name: study
      level: host
      flow_rate: {flow_rate}B/s
    - name: other
      level: host
  rules:
    - class: study
      protocol: tcp
      dst_port: {PORT}
  default_class: other
"#,
        mode = mode.name()
    )
}

/// Drops at a sender's egress qdiscs: the root's counter (fq, or mq which sums its fq
/// children), or the leaves' for HTB (whose root does not see leaf drops).
fn sender_drops(host: &Host, ifname: &str) -> u64 {
    let Ok(qs) = host.qdisc_stats(ifname) else {
        return 0;
    };
    let egress = |q: &&QdiscStats| !q.parent.as_deref().is_some_and(|p| p.starts_with("ffff:"));
    let root = qs.iter().filter(egress).find(|q| q.parent.is_none());
    match root {
        Some(r) if r.kind == "htb" => qs
            .iter()
            .filter(egress)
            .filter(|q| q.parent.is_some())
            .map(|q| q.drops)
            .sum(),
        Some(r) => r.drops,
        None => 0,
    }
}

/// The agents of every sender, kept running through the paced points; a point changes their
/// policies by reload.
struct Agents<'a> {
    list: Vec<Agent<'a>>,
    paths: Vec<PathBuf>,
    texts: Vec<String>,
}

/// Counters of the study class summed over the agents.
#[derive(Clone, Copy, Debug, Default)]
struct AgentCounters {
    sockets: u64,
    sockopt_errors: u64,
    delayed: u64,
    horizon_drops: u64,
}

impl<'a> Agents<'a> {
    /// Starts them one after the other (in parallel they outlast `Agent::start`'s deadline
    /// under TCG), each with a per-flow policy; one retry each.
    fn start(star: &'a Star, scratch: &Scratch, cfg: &Config) -> Result<Agents<'a>> {
        let mut ag = Agents {
            list: Vec::new(),
            paths: Vec::new(),
            texts: Vec::new(),
        };
        for j in 0..cfg.senders {
            let text = policy_yaml(
                Mode::PerFlow,
                &star.sender_iface(j).ifname,
                cfg.rate_bps / 8,
                None,
            );
            let p = scratch.path(&format!("s{j}.yaml"));
            std::fs::write(&p, &text).with_context(|| format!("write {}", p.display()))?;
            let st = scratch.path(&format!("state-s{j}"));
            let host = &star.senders[j];
            let mut agent = None;
            for attempt in 1..=2 {
                match std::panic::catch_unwind(AssertUnwindSafe(|| Agent::start(host, &p, &st))) {
                    Ok(a) => {
                        agent = Some(a);
                        break;
                    }
                    Err(_) => eprintln!("{NAME}: the agent on s{j} did not come up (attempt {attempt})"),
                }
            }
            ag.list
                .push(agent.with_context(|| format!("starting the agent on s{j}"))?);
            ag.paths.push(p);
            ag.texts.push(text);
        }
        Ok(ag)
    }

    /// Makes `text` sender j's policy and waits until its agent applied it (a SIGHUP after 5 s
    /// if the file watch missed it).
    fn apply(&mut self, j: usize, text: String) -> Result<()> {
        if self.texts[j] == text {
            return Ok(());
        }
        self.list[j].apply_policy(&text, Duration::from_secs(5))?;
        self.texts[j] = text;
        Ok(())
    }

    /// The enforcement mode the (first) agent uses.
    fn mode(&self) -> Option<String> {
        let st = self.list.first()?.status()?;
        st["enforcement"]["mode"].as_str().map(str::to_string)
    }

    fn counters(&self) -> AgentCounters {
        let mut c = AgentCounters::default();
        for a in &self.list {
            let Some(st) = a.status() else { continue };
            let Some(cl) = st["counters"]["classes"]
                .as_array()
                .and_then(|v| v.iter().find(|c| c["name"] == "study"))
            else {
                continue;
            };
            let g = |k: &str| cl[k].as_u64().unwrap_or(0);
            c.sockets += g("tcp_sockets_configured");
            c.sockopt_errors += g("tcp_sockopt_errors");
            c.delayed += g("delayed_packets");
            c.horizon_drops += g("dropped_horizon");
        }
        c
    }
}

#[allow(clippy::too_many_arguments)]
fn run_point(
    cfg: &Config,
    star: &Star,
    bn: &Shaper,
    mut agents: Option<&mut Agents<'_>>,
    to: SocketAddr,
    buf: u32,
    mode: Mode,
    n: usize,
    seed: u64,
    bdp_bytes: f64,
) -> Result<Value> {
    let active = cfg.senders.min(n);
    // the paced group (with agents) or the unpaced one
    let base = if mode == Mode::Unpaced { cfg.senders } else { 0 };
    let senders = &star.senders[base..base + active];
    // flows per sender, round-robin
    let per_host: Vec<usize> = (0..active)
        .map(|j| (0..n).filter(|i| i % active == j).count())
        .collect();
    let rate_bytes = cfg.rate_bps as f64 / 8.0 * cfg.pace_fraction;
    let flow_rate = (rate_bytes / n as f64) as u64;
    let host_rates: Vec<u64> = per_host
        .iter()
        .map(|&k| (rate_bytes * k as f64 / n as f64) as u64)
        .collect();

    // The paced modes' policies (senders without flows keep theirs).
    let mut policy_s0 = String::new();
    let mut agent_mode = None;
    let mut c0 = None;
    if let Some(ag) = agents.as_deref_mut() {
        ensure!(mode != Mode::Unpaced, "unpaced points run without agents");
        for (j, &rate) in host_rates.iter().enumerate() {
            let host_rate = (mode == Mode::PerHost).then_some(rate);
            let text = policy_yaml(mode, &star.sender_iface(base + j).ifname, flow_rate, host_rate);
            if j == 0 {
                policy_s0 = text.clone();
            }
            ag.apply(j, text)?;
        }
        agent_mode = ag.mode();
        c0 = Some(ag.counters());
    } else {
        ensure!(mode == Mode::Unpaced, "paced points need the agents");
    }

    let host_drops0: Vec<u64> = (0..active)
        .map(|j| sender_drops(&senders[j], &star.sender_iface(base + j).ifname))
        .collect();
    let q0 = bn.stats()?;
    let rounds = cfg.samples.div_ceil(n).max(1);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut flows: Vec<FlowRec> = Vec::new();
    let mut active_s = 0.0;
    for r in 0..rounds {
        // flow i of the round goes to sender i % active, ids unique over the whole run
        let mut assign: Vec<Vec<(u32, f64)>> = vec![Vec::new(); active];
        for i in 0..n {
            let id = (seed as u32 & 0xfff) << 20 | (r as u32) << 8 | i as u32;
            let off = rng.random_range(0.0..cfg.start_jitter_ms.max(1e-6)) / 1e3;
            assign[i % active].push((id, off));
        }
        let recs = run_round(senders, &assign, to, cfg.flow_bytes, r)?;
        let start = recs.iter().map(|f| f.start_s).fold(f64::INFINITY, f64::min);
        let end = recs
            .iter()
            .map(|f| f.start_s + f.fct_s.unwrap_or(0.0))
            .fold(0.0, f64::max);
        if end > start {
            active_s += end - start;
        }
        flows.extend(recs);
        std::thread::sleep(Duration::from_millis(cfg.round_gap_ms));
    }
    let q1 = bn.stats()?;
    let host_drops: u64 = (0..active)
        .map(|j| {
            sender_drops(&senders[j], &star.sender_iface(base + j).ifname).saturating_sub(host_drops0[j])
        })
        .sum();

    // The agents' own counters for the study class, over this point.
    let agent_counters = match (agents, c0) {
        (Some(ag), Some(c0)) => {
            let c1 = ag.counters();
            json!({
                "tcp_sockets_configured": c1.sockets.saturating_sub(c0.sockets),
                "tcp_sockopt_errors": c1.sockopt_errors.saturating_sub(c0.sockopt_errors),
                "delayed_packets": c1.delayed.saturating_sub(c0.delayed),
                "dropped_horizon": c1.horizon_drops.saturating_sub(c0.horizon_drops),
            })
        }
        _ => json!({}),
    };

    let fcts = stats::sorted(flows.iter().filter_map(|f| f.fct_s).collect());
    let failed = flows.iter().filter(|f| f.fct_s.is_none()).count();
    let d_bytes = q1.bytes.saturating_sub(q0.bytes);
    let d_pkts = q1.packets.saturating_sub(q0.packets);
    let d_drops = q1.drops.saturating_sub(q0.drops);
    let util = if active_s > 0.0 {
        d_bytes as f64 * 8.0 / (cfg.rate_bps as f64 * active_s)
    } else {
        0.0
    };
    let drop_rate = if d_pkts + d_drops > 0 {
        d_drops as f64 / (d_pkts + d_drops) as f64
    } else {
        0.0
    };
    // N flows' payload through the bottleneck at full rate (frames of 1448 payload bytes)
    let ideal = n as f64 * cfg.flow_bytes as f64 * 8.0 / (cfg.rate_bps as f64 * PAYLOAD / FRAME as f64);
    let mean = stats::mean(&fcts);
    let p99 = stats::percentile_sorted(&fcts, 99.0);
    let retrans: u64 = flows.iter().map(|f| f.retrans as u64).sum();
    Ok(json!({
        "kind": NAME,
        "version": workload::SCHEMA_VERSION,
        "tags": {
            "mode": mode.name(),
            "flows": n.to_string(),
            "buffer_pkts": buf.to_string(),
        },
        "params": {
            "rate_bps": cfg.rate_bps,
            "shaper": cfg.shaper,
            "senders": senders.iter().map(|h| h.name().to_string()).collect::<Vec<_>>(),
            "buffer_bytes": buf * FRAME,
            "buffer_bdp": (buf * FRAME) as f64 / bdp_bytes,
            "flow_bytes": cfg.flow_bytes,
            "rounds": rounds,
            "active_senders": active,
            "flows_per_sender": per_host,
            "flow_rate_bps": if mode == Mode::Unpaced { Value::Null } else { json!(flow_rate * 8) },
            "host_rate_bps": if mode == Mode::PerHost { json!(host_rates.iter().map(|r| r * 8).collect::<Vec<_>>()) } else { Value::Null },
            "agent_enforcement": agent_mode,
            "policy_s0": if policy_s0.is_empty() { Value::Null } else { json!(policy_s0) },
            "seed": seed,
        },
        "summary": {
            "utilisation": util,
            "drop_rate": drop_rate,
            "drops": d_drops,
            "bottleneck_packets": d_pkts,
            "bottleneck_bytes": d_bytes,
            "active_s": active_s,
            "flows_completed": fcts.len(),
            "flows_failed": failed,
            "mean_fct_s": mean,
            "p50_fct_s": stats::percentile_sorted(&fcts, 50.0),
            "p99_fct_s": p99,
            "max_fct_s": fcts.last().copied().unwrap_or(0.0),
            "ideal_fct_s": ideal,
            "mean_slowdown": mean / ideal,
            "p99_slowdown": p99 / ideal,
            "total_retrans": retrans,
            "retrans_per_flow": retrans as f64 / flows.len().max(1) as f64,
            "host_qdisc_drops": host_drops,
            "agent": agent_counters,
        },
        "fct_s": fcts,
        "flows": flows,
    }))
}

/// One round: every flow of `assign[j]` from sender j, all starting at a common instant plus
/// their offsets; returns when all completed (or failed).
fn run_round(
    senders: &[Host],
    assign: &[Vec<(u32, f64)>],
    to: SocketAddr,
    bytes: u64,
    round: usize,
) -> Result<Vec<FlowRec>> {
    // far enough ahead that every thread has entered its namespace
    let t_start = workload::mono_ns() + 100_000_000;
    let mut out = Vec::new();
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = assign
            .iter()
            .enumerate()
            .filter(|(_, f)| !f.is_empty())
            .map(|(j, flows)| {
                let host = &senders[j];
                s.spawn(move || -> Result<Vec<FlowRec>> {
                    host.in_netns(|| {
                        std::thread::scope(|s2| {
                            let hs: Vec<_> = flows
                                .iter()
                                .map(|&(id, off)| {
                                    s2.spawn(move || one_flow(to, bytes, id, j, round, t_start, off))
                                })
                                .collect();
                            hs.into_iter()
                                .map(|h| h.join().map_err(|_| anyhow!("flow thread panicked")))
                                .collect::<Result<Vec<_>>>()
                        })
                    })?
                })
            })
            .collect();
        for h in handles {
            out.extend(h.join().map_err(|_| anyhow!("sender thread panicked"))??);
        }
        Ok(())
    })?;
    Ok(out)
}

fn one_flow(
    to: SocketAddr,
    bytes: u64,
    id: u32,
    sender: usize,
    round: usize,
    t_start: u64,
    off: f64,
) -> FlowRec {
    workload::precise_timers();
    workload::sleep_until_ns(t_start + (off * 1e9) as u64);
    let mut opts = bulk::BulkOpts::tcp(to, 1, 0.0);
    opts.duration = None;
    opts.bytes = Some(bytes);
    opts.first_flow_id = id;
    let mut rec = FlowRec {
        round,
        flow_id: id,
        sender,
        start_s: off,
        fct_s: None,
        bytes_sent: 0,
        retrans: 0,
        rtt_us: 0,
        cwnd: 0,
        error: None,
    };
    match bulk::run(&opts, &Tags::new()) {
        Ok(r) => {
            if let Some(f) = r.flows.first() {
                rec.fct_s = f.fct_s;
                rec.bytes_sent = f.bytes_sent;
                if let Some(t) = &f.tcp {
                    rec.retrans = t.total_retrans;
                    rec.rtt_us = t.rtt_us;
                    rec.cwnd = t.snd_cwnd;
                }
                if f.fct_s.is_none() {
                    rec.error = Some("no completion".into());
                }
            }
        }
        Err(e) => rec.error = Some(format!("{e:#}")),
    }
    rec
}

/// N* of one paced mode against unpaced for `metric` (lower is better), with the ratios
/// unpaced/paced at every N. Pacing "helps" at N when `unpaced >= (1 + TOLERANCE) * paced`;
/// N* is the smallest N at which it no longer does, after it helped at some smaller N.
fn n_star(points: &[Value], buf: u32, mode: Mode, metric: &str) -> (NStar, Vec<(u64, f64)>) {
    let get = |m: Mode, n: u64| {
        points.iter().find_map(|p| {
            (p["tags"]["mode"] == m.name()
                && p["tags"]["buffer_pkts"] == *buf.to_string()
                && p["tags"]["flows"] == *n.to_string())
            .then(|| p["summary"][metric].as_f64())
            .flatten()
        })
    };
    let mut ns: Vec<u64> = points
        .iter()
        .filter(|p| p["tags"]["buffer_pkts"] == *buf.to_string())
        .filter_map(|p| p["tags"]["flows"].as_str().and_then(|s| s.parse().ok()))
        .collect();
    ns.sort_unstable();
    ns.dedup();
    let mut ratios = Vec::new();
    for n in ns {
        if let (Some(u), Some(p)) = (get(Mode::Unpaced, n), get(mode, n))
            && p > 0.0
        {
            ratios.push((n, u / p));
        }
    }
    let helps = |r: f64| r >= 1.0 + TOLERANCE;
    let star = match ratios.iter().position(|&(_, r)| helps(r)) {
        None => NStar::NeverHelped,
        Some(i) => match ratios[i + 1..].iter().find(|&&(_, r)| !helps(r)) {
            Some(&(n, _)) => NStar::At(n),
            None => NStar::Beyond,
        },
    };
    (star, ratios)
}

/// Where pacing stopped helping.
#[derive(Clone, Copy, Debug, PartialEq)]
enum NStar {
    /// At this N (after helping at a smaller one).
    At(u64),
    /// Helped at every N from the first one where it helped up to the largest measured.
    Beyond,
    /// Never better by more than the tolerance.
    NeverHelped,
}

impl NStar {
    fn json(self) -> Value {
        match self {
            NStar::At(n) => json!(n),
            NStar::Beyond => json!("beyond"),
            NStar::NeverHelped => json!("never-helped"),
        }
    }
    fn text(self, max_n: usize) -> String {
        match self {
            NStar::At(n) => n.to_string(),
            NStar::Beyond => format!("> {max_n}"),
            NStar::NeverHelped => "never helped".into(),
        }
    }
}

fn write_outputs(
    out: &Path,
    cfg: &Config,
    c: &Common,
    env: &Value,
    points: &[Value],
    complete: bool,
    elapsed_s: f64,
) -> Result<()> {
    let max_n = cfg.flows.iter().max().copied().unwrap_or(0);
    let mut stars = Vec::new();
    for &buf in &cfg.buffers_pkts {
        for mode in [Mode::PerFlow, Mode::PerHost] {
            for metric in ["p99_fct_s", "mean_fct_s"] {
                let (s, ratios) = n_star(points, buf, mode, metric);
                stars.push(json!({
                    "buffer_pkts": buf,
                    "mode": mode.name(),
                    "metric": metric,
                    "n_star": s.json(),
                    "n_star_text": s.text(max_n),
                    "unpaced_over_paced": ratios,
                }));
            }
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
        "n_star_definition": format!(
            "pacing helps at N when the unpaced value >= (1 + {TOLERANCE}) x the paced value (FCT: lower is better); N* is the smallest measured N at which pacing no longer helps, after it helped at a smaller N; \"beyond\": it helped from then on up to N = {max_n}; \"never-helped\": it helped at no N"
        ),
        "n_star": stars,
        "results": points,
    });
    workload::write_json(&doc, Some(&out.join(format!("{NAME}.json"))))?;
    std::fs::write(
        out.join(format!("{NAME}.md")),
        markdown(cfg, env, points, &stars, complete, elapsed_s),
    )?;
    for &buf in &cfg.buffers_pkts {
        let sel: Vec<(String, Value)> = points
            .iter()
            .filter(|p| p["tags"]["buffer_pkts"] == *buf.to_string())
            .map(|p| (String::new(), p.clone()))
            .collect();
        if sel.is_empty() {
            continue;
        }
        let series = |path: &str, scale: f64| -> Vec<XySeries> {
            let mut v = report::xy_series(&sel, "/tags/flows", path, Some("/tags/mode"));
            for s in &mut v {
                for p in &mut s.points {
                    p.1 *= scale;
                }
            }
            v
        };
        let bdp = env["bdp_frames"].as_f64().unwrap_or(0.0);
        let sub = format!(
            "buffer {buf} pkts ({:.0}% BDP), {} Mbit/s",
            buf as f64 / bdp.max(1e-9) * 100.0,
            cfg.rate_bps / 1_000_000
        );
        for (file, title, y, path, scale) in [
            (
                "p99-fct",
                "99th-percentile FCT",
                "p99 FCT (s)",
                "/summary/p99_fct_s",
                1.0,
            ),
            ("mean-fct", "mean FCT", "mean FCT (s)", "/summary/mean_fct_s", 1.0),
            (
                "utilisation",
                "bottleneck utilisation",
                "utilisation (%)",
                "/summary/utilisation",
                100.0,
            ),
            (
                "drops",
                "bottleneck drop rate",
                "drops (% of packets)",
                "/summary/drop_rate",
                100.0,
            ),
        ] {
            let opts =
                PlotOpts::new(&format!("{title} vs N, {sub}"), "concurrent flows N (log)", y).log_x(true);
            report::xy_plot(
                &out.join(format!("{NAME}-{file}-b{buf}.svg")),
                &opts,
                &series(path, scale),
            )?;
        }
    }
    Ok(())
}

fn markdown(
    cfg: &Config,
    env: &Value,
    points: &[Value],
    stars: &[Value],
    complete: bool,
    elapsed_s: f64,
) -> String {
    use report::fmt_num;
    let f = |v: &Value| v.as_f64().map(fmt_num).unwrap_or_default();
    let pct = |v: &Value| {
        v.as_f64()
            .map(|x| format!("{:.1}", x * 100.0))
            .unwrap_or_default()
    };
    let pct2 = |v: &Value| {
        v.as_f64()
            .map(|x| format!("{:.2}", x * 100.0))
            .unwrap_or_default()
    };
    let s3 = |v: &Value| v.as_f64().map(|x| format!("{x:.3}")).unwrap_or_default();
    let mut md = String::new();
    md.push_str(&format!(
        "# Pacing study (seed 001)\n\n{}Kernel {} ({}), agent enforcement `{}`. Bottleneck {} Mbit/s ({}) on the router; \
         RTT {:.2} ms (netem delay on the ACK path: {} ms), BDP {:.0} frames; {} senders per mode; flows of {} bytes; \
         at least {} flows per point; pacing at {}x the fair share. Calibration: the bottleneck dequeued {:.1}% of its rate \
         under a UDP overload. Run took {:.0} s.\n\n",
        if complete { "" } else { "**Incomplete run (partial results).** " },
        env["kernel"].as_str().unwrap_or("?"),
        if env["in_vm"].as_bool().unwrap_or(false) { "VM" } else { "host" },
        env["agent_enforcement"].as_str().unwrap_or("?"),
        cfg.rate_bps as f64 / 1e6,
        match cfg.shaper.as_str() {
            "netem" => "netem rate, buffer = netem limit in packets".to_string(),
            _ => format!(
                "HTB + bfifo, buffer = bfifo limit of N x 1514 bytes, burst {}",
                cfg.htb_burst_bytes.map(|b| format!("{b} B")).unwrap_or_else(|| "tc default".into())
            ),
        },
        env["rtt_ms_median"].as_f64().unwrap_or(0.0),
        env["netem_delay_ms"].as_f64().map(|d| d.to_string()).unwrap_or_else(|| "none".into()),
        env["bdp_frames"].as_f64().unwrap_or(0.0),
        cfg.senders,
        cfg.flow_bytes,
        cfg.samples,
        cfg.pace_fraction,
        env["calibration"]["dequeued_over_rate"].as_f64().unwrap_or(f64::NAN) * 100.0,
        elapsed_s,
    ));
    let headers: Vec<String> = [
        "buffer (pkts)",
        "N",
        "mode",
        "util %",
        "drop %",
        "mean FCT s",
        "p99 FCT s",
        "max FCT s",
        "ideal s",
        "p99/ideal",
        "retrans/flow",
        "host drops",
        "flows",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|p| {
            let s = &p["summary"];
            vec![
                p["tags"]["buffer_pkts"].as_str().unwrap_or("").to_string(),
                p["tags"]["flows"].as_str().unwrap_or("").to_string(),
                p["tags"]["mode"].as_str().unwrap_or("").to_string(),
                pct(&s["utilisation"]),
                pct2(&s["drop_rate"]),
                s3(&s["mean_fct_s"]),
                s3(&s["p99_fct_s"]),
                s3(&s["max_fct_s"]),
                s3(&s["ideal_fct_s"]),
                f(&s["p99_slowdown"]),
                f(&s["retrans_per_flow"]),
                format!(
                    "{}",
                    s["host_qdisc_drops"].as_u64().unwrap_or(0)
                        + s["agent"]["dropped_horizon"].as_u64().unwrap_or(0)
                ),
                format!(
                    "{}{}",
                    s["flows_completed"],
                    match s["flows_failed"].as_u64() {
                        Some(0) | None => String::new(),
                        Some(k) => format!(" ({k} failed)"),
                    }
                ),
            ]
        })
        .collect();
    md.push_str(&report::markdown_table(&headers, &rows));
    md.push_str(
        "\nutil: bytes dequeued by the bottleneck / (rate x active time); drop: bottleneck drops / packets offered; \
         FCT: connect to the receiver's acknowledgement of the last byte; ideal: N flows' payload at the full rate; \
         host drops: drops at the senders' qdiscs plus the agents' horizon drops.\n\n## Point of inflection N*\n\n",
    );
    let headers: Vec<String> = [
        "buffer (pkts)",
        "paced mode",
        "metric",
        "N*",
        "unpaced/paced at each N",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let max_n = cfg.flows.iter().max().copied().unwrap_or(0);
    let rows: Vec<Vec<String>> = stars
        .iter()
        .map(|s| {
            let ratios = s["unpaced_over_paced"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|x| format!("{}: {:.2}", x[0], x[1].as_f64().unwrap_or(0.0)))
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            vec![
                s["buffer_pkts"].to_string(),
                s["mode"].as_str().unwrap_or("").to_string(),
                s["metric"].as_str().unwrap_or("").to_string(),
                s["n_star_text"].as_str().unwrap_or("").to_string(),
                ratios,
            ]
        })
        .collect();
    md.push_str(&report::markdown_table(&headers, &rows));
    md.push_str(&format!(
        "\nPacing helps at N when unpaced >= (1 + {TOLERANCE}) x paced (ratios above {:.2} in the last column). \
         N*: the smallest measured N at which it no longer helps, after it helped at a smaller N \
         (\"> {max_n}\": it helped up to the largest N measured).\n",
        1.0 + TOLERANCE
    ));
    md
}
