//! Running the experiment on the testbed: agents, servers, the aggregator, and the points
//! measured.

use crate::experiments::Common;
use crate::experiments::harness::*;
use anyhow::{Context, Result, bail};
use paceline_common::edt::TCP_FRAME_OVERHEAD_V4;
use paceline_tests::agent::{Agent, Scratch};
use paceline_tests::testbed::{
    Bottleneck, BottleneckSpec, ChildGuard, Host, QdiscStats, Star, StarSpec, Testbed,
};
use paceline_tests::workload::hook::{D3Hook, DeadlineMarkHook, NoHook, ResponseHook};
use paceline_tests::workload::{self, Tags, pa, serve, stats};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::*;

/// Everything a point needs.
pub(crate) struct Ctx<'a> {
    cfg: &'a Config,
    star: &'a Star,
    scratch: &'a Scratch,
    seed: u64,
}

/// The agents of one mode.
#[derive(Default)]
pub(crate) struct Agents<'a> {
    senders: Vec<SenderAgent<'a>>,
    router: Option<Agent<'a>>,
    receiver: Option<Agent<'a>>,
}

pub(crate) struct SenderAgent<'a> {
    host: &'a Host,
    agent: Agent<'a>,
}

/// Runs the experiment (`plexp d3`): the full or quick plan, narrowed by the environment.
pub fn run(c: &Common) -> Result<()> {
    run_with(c, &Config::new(c.quick).with_env())
}

/// Runs the experiment with `cfg`; `<c.out>/d3.json` holds the results.
pub fn run_with(c: &Common, cfg: &Config) -> Result<()> {
    let cfg = cfg.clone();
    std::fs::create_dir_all(&c.out).with_context(|| format!("mkdir {}", c.out.display()))?;
    let t_begin = Instant::now();
    let tb = Testbed::new("d3_eval")?;
    let star = tb.add_star(&StarSpec {
        senders: cfg.sender_hosts,
        bottleneck: Some(BottleneckSpec::htb(cfg.rate_bps, cfg.buffer_bytes)),
        ..Default::default()
    })?;
    let rx_ip = IpAddr::V4(star.receiver.ipv4());
    let rtts = ping_rtts_ms(&star.senders[0], rx_ip, 9, "aggregator")?;
    let kernel = kernel_release();
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
        let (recovery, early_retrans) = if mode.paper_recovery {
            ("0", "0")
        } else {
            ("1", "3")
        };
        for h in &star.senders {
            h.sysctl("net.ipv4.tcp_tso_rtt_log", &rtt_log)?;
            h.sysctl("net.ipv4.tcp_recovery", recovery)?;
            h.sysctl("net.ipv4.tcp_early_retrans", early_retrans)?;
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
                        s.agent.apply_policy(
                            &sender_policy(
                                &cfg,
                                mode,
                                n,
                                &s.host.iface_to(&star.router).context("iface")?.ifname,
                            ),
                            Duration::from_secs(2),
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

/// The mode's bottleneck: HTB + bfifo, or a strict-priority port for QJump.
pub(crate) fn install_bottleneck(star: &Star, cfg: &Config, mode: &ModeSpec) -> Result<Bottleneck> {
    let spec = match mode.kind {
        Kind::Qjump => BottleneckSpec::strict_priority(cfg.rate_bps, cfg.buffer_bytes / 2),
        _ => BottleneckSpec::htb(cfg.rate_bps, cfg.buffer_bytes),
    };
    star.receiver_link.bottleneck_a_to_b(&spec)
}

pub(crate) fn start_agents<'a>(ctx: &Ctx<'a>, mode: &ModeSpec) -> Result<Agents<'a>> {
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
        agents.senders.push(SenderAgent { host: h, agent });
    }
    Ok(agents)
}

pub(crate) fn stop_agents(a: Agents) {
    // Dropping an agent sends SIGTERM and waits; the senders first, then router and receiver.
    drop(a.senders);
    drop(a.router);
    drop(a.receiver);
}

/// One server per sender host with the mode's hook.
pub(crate) fn start_servers(
    ctx: &Ctx,
    mode: &ModeSpec,
    mean: f64,
    agents: &Agents,
) -> Result<Vec<serve::Server>> {
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

/// The senders' D3 counters of class `pa`, summed.
pub(crate) fn d3_sender_counters(agents: &Agents) -> BTreeMap<String, u64> {
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

pub(crate) fn router_link(agents: &Agents) -> Option<Value> {
    let st = agents.router.as_ref()?.status()?;
    Some(st["counters"]["d3_router_links"][0].clone())
}

pub(crate) fn delta_map(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) -> Value {
    let mut o = serde_json::Map::new();
    for (k, v) in b {
        o.insert(k.clone(), json!(v.saturating_sub(a.get(k).copied().unwrap_or(0))));
    }
    Value::Object(o)
}

/// The router link's counters after the point, as deltas where they are cumulative.
pub(crate) fn router_delta(before: &Option<Value>, after: &Option<Value>) -> Value {
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
pub(crate) fn http_status() -> Option<Value> {
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
pub(crate) fn sample_router(router: &Host, stop: &AtomicBool) -> Vec<[u64; 5]> {
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

pub(crate) fn summarize_samples(v: &[[u64; 5]], line: u64) -> Value {
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

/// Runs one (mode, mean, N) measurement; returns its scored point(s) (one per mean for the
/// deadline-unaware modes) and the raw measurement.
pub(crate) fn run_point(
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
                paceline_tests::agent::bin("plload").as_os_str(),
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
    // The capture for the timelines: tcpdump in the aggregator's namespace, first 128 bytes.
    let pcap = ctx
        .scratch
        .path(&format!("{}-{}-{n}.pcap", mode.name, fmt_mean(mean)));
    let capture_on = cfg.capture && mode.conn == Conn::Fresh;
    let capture = if capture_on {
        let p = pcap.to_string_lossy().into_owned();
        let c = star.receiver.spawn(&[
            "tcpdump",
            "-i",
            "any",
            "-s",
            "128",
            "-U",
            "-w",
            &p,
            "tcp",
            "port",
            &PORT.to_string(),
        ])?;
        std::thread::sleep(Duration::from_millis(500));
        Some(c)
    } else {
        None
    };
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
    if let Some(c) = capture {
        std::thread::sleep(Duration::from_millis(200));
        drop(c);
    }
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
    // Each scored response's timeline, at the measured mean's deadlines.
    let timeline_json = if capture_on && pcap.exists() {
        let addrs: Vec<std::net::Ipv4Addr> = (0..n)
            .map(|i| star.senders[i % cfg.sender_hosts].ipv4())
            .collect();
        let t = timeline::timelines(&pcap, PORT, n, &addrs, &responses).map(|t| {
            t.into_iter()
                .filter(|r| r.query >= cfg.warmup_queries)
                .collect::<Vec<_>>()
        });
        let _ = std::fs::remove_file(&pcap);
        match t {
            Ok(t) => json!({"missed": timeline::missed_summary(&t), "responses": t}),
            Err(e) => json!({"error": format!("{e:#}")}),
        }
    } else {
        Value::Null
    };
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
            "timeline": if m == mean { timeline_json.clone() } else { Value::Null },
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
pub(crate) fn query_times(responses: &[pa::PaResponse]) -> Vec<f64> {
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
pub(crate) fn run_pa_fresh(opts: &pa::PaOpts) -> Result<(Vec<pa::PaResponse>, Vec<f64>)> {
    use paceline_tests::workload::{fanout::Fanout, proto};
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
pub(crate) fn wire_bytes(size: u64) -> u64 {
    size + size.div_ceil(1448) * TCP_FRAME_OVERHEAD_V4
}

/// Responses (of the scored queries) an ideal scheduler meets: all of a query's responses
/// released at once at one 1 Gbit/s bottleneck, no latency, no loss, preemptive; the most
/// deadlines any single-link schedule meets (Moore-Hodgson, optimal for 1||sum U_j).
pub(crate) fn ideal_met(opts: &pa::PaOpts, warmup: u64, rate_bps: u64) -> Result<(u64, u64)> {
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
pub(crate) fn ideal_points(cfg: &Config, seed: u64) -> Result<Vec<Value>> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
