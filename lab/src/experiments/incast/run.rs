//! Running the points on the testbed: agents, synchronized reads and the micro-benchmark.

use crate::experiments::Common;
use crate::experiments::harness::{loadavg, sum_tcp};
use anyhow::{Context, Result, bail};
use paceline_tests::agent::{Agent, Scratch};
use paceline_tests::testbed::{Bottleneck, BottleneckSpec, Host, Star, StarSpec, Testbed};
use paceline_tests::workload::{Tags, bulk, incast, rpc, serve, stats};
use serde_json::{Value, json};
use std::net::{IpAddr, SocketAddr};
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::*;

/// The agents of one mode (dropping them stops them).
#[derive(Default)]
pub(crate) struct Agents<'a> {
    /// (host, policy file, interface, agent).
    pub(crate) servers: Vec<(&'a Host, PathBuf, String, Agent<'a>)>,
    pub(crate) client: Option<Agent<'a>>,
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
    let rtts = crate::experiments::harness::ping_rtts_ms(&star.senders[0], rx_ip, 9, "client")?;
    let fq = paceline::kernel::features::Features::probe().sch_fq;
    let kernel = crate::experiments::harness::kernel_release();
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

pub(crate) fn tags(mode: Mode, s: usize) -> Value {
    json!({"mode": mode.name(), "servers": s.to_string()})
}

pub(crate) fn start_agents<'a>(
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

pub(crate) fn last_lines(s: &str, n: usize) -> String {
    let v: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    v[v.len().saturating_sub(n)..].join(" / ")
}

/// Why the agent runs without DASR, if it does (its policy asked for DASR; a kernel that
/// cannot load DASR's program refuses the policy, so the agent then runs no policy at all).
pub(crate) fn dasr_unavailable(a: &Agent) -> Option<String> {
    let st = a.status()?;
    if st["dasr"].is_null() {
        let errs = st["reloads"]["last"]["errors"].clone();
        return Some(format!("the agent did not take the DASR policy: {errs}"));
    }
    None
}

/// The paced mode's flow rate for `share` concurrent flows.
pub(crate) fn set_share(cfg: &Config, agents: &Agents, fq: bool, share: usize) -> Result<()> {
    for (_h, _p, ifname, a) in &agents.servers {
        let text = policy(cfg, Mode::Paced, false, ifname, fq, share).expect("a paced policy");
        a.apply_policy(&text, Duration::from_secs(2))?;
    }
    Ok(())
}

/// Sums `counters.dasr` fields over agents.
pub(crate) fn dasr_counters<'x>(agents: impl Iterator<Item = &'x Agent<'x>>) -> Value {
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

pub(crate) fn delta(a: &Value, b: &Value) -> Value {
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
pub(crate) fn run_point(
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

/// One micro-benchmark measurement: short messages from host 0 next to `k` bulk uploads.
pub(crate) fn run_micro(cfg: &Config, star: &Star, bn: &Bottleneck, mode: Mode, k: u32) -> Result<Value> {
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
