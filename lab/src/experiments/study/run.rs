//! Running the rounds on the testbed: the bottleneck, the agents and the flows.

use crate::experiments::Common;
use anyhow::{Context, Result, anyhow, ensure};
use paceline_tests::agent::{Agent, Scratch};
use paceline_tests::testbed::{Bottleneck, BottleneckSpec, Host, QdiscStats, Star, StarSpec, Testbed};
use paceline_tests::workload::{self, Tags, bulk, serve, stats};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use serde_json::{Value, json};
use std::net::{IpAddr, SocketAddr};
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use super::*;

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
    let rtts = crate::experiments::harness::ping_rtts_ms(&star.senders[0], IpAddr::V4(rx_ip), 7, "receiver")?;
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
    let kernel = crate::experiments::harness::kernel_release();
    let buffers = cfg.buffers(bdp_bytes / FRAME as f64);
    let modes = cfg.modes();
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
        "buffers": buffers.iter().map(|&(b, r)| json!({"frames": b, "bytes": b * FRAME, "of_bdp": r})).collect::<Vec<_>>(),
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
            let bn = install_bottleneck(&star, &c2, buffers[0].0)?;
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
    let total = cfg.reps * buffers.len() * cfg.flows.len() * modes.len();
    let mut done = 0;
    // Repetitions outermost: an aborted run keeps whole ones, and the machine's drift over
    // the run spreads over every point alike.
    for rep in 0..cfg.reps {
        for &(buf, ratio) in &buffers {
            let bn = install_bottleneck(&star, &cfg, buf)?;
            if env["calibration"].is_null() {
                env["calibration"] = calibrate(&star, &bn, to, &cfg)?;
                eprintln!("{NAME}: calibration: {}", env["calibration"]);
            }
            for &n in &cfg.flows {
                let seed = c.seed ^ ((rep as u64) << 52) ^ ((buf as u64) << 40) ^ ((n as u64) << 20);
                for &mode in &modes {
                    let t0 = Instant::now();
                    let ag = (mode != Mode::Unpaced).then_some(&mut agents);
                    let mut p = run_point(&cfg, &star, &bn, ag, to, buf, mode, n, seed, bdp_bytes)
                        .with_context(|| {
                            format!("point rep={rep} buffer={buf} mode={} N={n}", mode.name())
                        })?;
                    p["tags"]["rep"] = json!(rep.to_string());
                    done += 1;
                    let s = &p["summary"];
                    eprintln!(
                        "{NAME}: [{done}/{total}] rep {rep} buf {buf:>2} ({:.1}% BDP) N {n:>3} {:<18} util {:.3} drops {:.4} mean {:.3}s p99 {:.3}s max {:.3}s retrans {} host drops {} ({:.0}s, total {:.0}s)",
                        ratio * 100.0,
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
pub(crate) enum Shaper {
    /// The testbed's HTB + bfifo.
    Htb(Bottleneck),
    /// netem `rate R limit <packets>` as the root.
    Netem { host: Host, ifname: String },
}

impl Shaper {
    /// Counters of the qdisc that queues and drops.
    pub(crate) fn stats(&self) -> Result<QdiscStats> {
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
pub(crate) fn install_bottleneck(star: &Star, cfg: &Config, buf: u32) -> Result<Shaper> {
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
pub(crate) fn calibrate(star: &Star, bn: &Shaper, to: SocketAddr, cfg: &Config) -> Result<Value> {
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
pub(crate) struct FlowRec {
    pub(crate) round: usize,
    pub(crate) flow_id: u32,
    pub(crate) sender: usize,
    /// Start offset within the round, s.
    pub(crate) start_s: f64,
    /// None when the flow failed (see `error`).
    pub(crate) fct_s: Option<f64>,
    pub(crate) bytes_sent: u64,
    pub(crate) retrans: u32,
    pub(crate) rtt_us: u32,
    pub(crate) cwnd: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

/// Drops at a sender's egress qdiscs: the root's counter (fq, or mq which sums its fq
/// children), or the leaves' for HTB (whose root does not see leaf drops).
pub(crate) fn sender_drops(host: &Host, ifname: &str) -> u64 {
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
pub(crate) struct Agents<'a> {
    pub(crate) list: Vec<Agent<'a>>,
    pub(crate) texts: Vec<String>,
}

/// Counters of the study class summed over the agents.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct AgentCounters {
    pub(crate) sockets: u64,
    pub(crate) sockopt_errors: u64,
    pub(crate) delayed: u64,
    pub(crate) horizon_drops: u64,
}

impl<'a> Agents<'a> {
    /// Starts them one after the other (in parallel they outlast `Agent::start`'s deadline
    /// under TCG), each with a per-flow policy; one retry each.
    pub(crate) fn start(star: &'a Star, scratch: &Scratch, cfg: &Config) -> Result<Agents<'a>> {
        let mut ag = Agents {
            list: Vec::new(),
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
            ag.texts.push(text);
        }
        Ok(ag)
    }

    /// Makes `text` sender j's policy and waits until its agent applied it (a SIGHUP after 5 s
    /// if the file watch missed it).
    pub(crate) fn apply(&mut self, j: usize, text: String) -> Result<()> {
        if self.texts[j] == text {
            return Ok(());
        }
        self.list[j].apply_policy(&text, Duration::from_secs(5))?;
        self.texts[j] = text;
        Ok(())
    }

    /// The enforcement mode the (first) agent uses.
    pub(crate) fn mode(&self) -> Option<String> {
        let st = self.list.first()?.status()?;
        st["enforcement"]["mode"].as_str().map(str::to_string)
    }

    pub(crate) fn counters(&self) -> AgentCounters {
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
pub(crate) fn run_point(
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
pub(crate) fn run_round(
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

pub(crate) fn one_flow(
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
