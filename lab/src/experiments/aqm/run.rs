//! Running the points on the testbed.

use crate::experiments::Common;
use crate::experiments::harness::{loadavg, sum_tcp};
use anyhow::{Context, Result, bail};
use paceline_tests::agent::{Agent, Scratch};
use paceline_tests::testbed::{self, Host};
use paceline_tests::workload::{Tags, bulk, serve};
use serde_json::{Value, json};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use super::*;

/// The class's counters from the agent's status ([`super::harness::agent_counters`]).
pub(crate) fn class_counters(agent: &Agent) -> Result<Value> {
    let s = agent.status().context("agent status")?;
    let c = crate::experiments::harness::agent_counters(&s, "classes", CLASS);
    anyhow::ensure!(!c.is_null(), "no class {CLASS} in the status");
    Ok(c)
}

/// Runs the benchmark.
pub fn run(c: &Common) -> Result<()> {
    let cfg = Config::new(c.quick);
    if !paceline::kernel::features::Features::probe().sch_fq {
        bail!(
            "{NAME}: this kernel has no sch_fq; the horizon and CoDel act on the departures fq holds. Run it in the VM: cargo xtask bench aqm"
        );
    }
    std::fs::create_dir_all(&c.out).with_context(|| format!("mkdir {}", c.out.display()))?;
    let t_begin = Instant::now();
    let (_tb, a, b, ifname) = testbed::two_hosts("aqm")?;
    let scratch = Scratch::new("aqm");
    let p = scratch.path("policy.yaml");
    std::fs::write(&p, policy(&cfg, &ifname, Queue::Horizon))?;
    let agent = Agent::start(&a, &p, &scratch.path("state"));
    let kernel = crate::experiments::harness::kernel_release();
    let mut env = json!({
        "kernel": kernel,
        "in_vm": std::env::var_os("PACELINE_IN_VM").is_some(),
        "load_at_start": loadavg(),
        "unavailable": {},
    });
    eprintln!(
        "{NAME}: kernel {kernel}, class at {} Mbit/s, {} flows, {} s measured",
        cfg.rate_bps / 1_000_000,
        cfg.flows,
        cfg.duration_s
    );
    let mut points = Vec::new();
    for cc in Cc::ALL {
        allow_in_namespaces(cc.algorithm());
        // Both ends: Linux negotiates ECN with a SYN that is itself ECN-capable (DCTCP sets ECT
        // on its SYN) only when the listener's congestion control needs ECN too
        // (`tcp_ecn_create_request`); a cubic receiver refuses, and DCTCP falls back to Reno
        // without ECT (`dctcp_init`). Until 2026-12-01 only the sender ran DCTCP, and CoDel
        // dropped its packets instead of marking them.
        if let Err(e) = a
            .sysctl("net.ipv4.tcp_congestion_control", cc.algorithm())
            .and_then(|_| b.sysctl("net.ipv4.tcp_congestion_control", cc.algorithm()))
        {
            eprintln!("{NAME}: {} unavailable: {e:#}", cc.name());
            env["unavailable"][cc.name()] = json!(format!("{e:#}"));
            continue;
        }
        let ecn = if cc.ecn() { "1" } else { "0" };
        a.sysctl("net.ipv4.tcp_ecn", ecn)?;
        b.sysctl("net.ipv4.tcp_ecn", ecn)?;
        // A listening socket takes the congestion control of its creation, and accepted ones
        // inherit it: the server starts after the switch.
        let _server = b.in_netns(|| {
            serve::Server::start_plain(&serve::ServeOpts {
                port: PORT,
                ..Default::default()
            })
        })??;
        for q in Queue::ALL {
            agent.apply_policy(&policy(&cfg, &ifname, q), Duration::from_secs(2))?;
            let pt = run_point(&cfg, &agent, &a, &b, q, cc).unwrap_or_else(
                |e| json!({"tags": {"queue": q.name(), "cc": cc.name()}, "error": format!("{e:#}")}),
            );
            let s = &pt["summary"];
            eprintln!(
                "{NAME}: {:<9} {:<10} throughput {:.3} of R, delay p50 {} p99 {} mean {:.1} ms, drops horizon {} codel {}, marks {}, retrans {}{}",
                cc.name(),
                q.name(),
                s["throughput_of_rate"].as_f64().unwrap_or(0.0),
                fmt_ms(&s["delay_p50_s"]),
                fmt_ms(&s["delay_p99_s"]),
                s["delay_mean_s"].as_f64().unwrap_or(0.0) * 1e3,
                s["dropped_horizon"],
                s["dropped_codel"],
                s["ce_marked"],
                s["retransmissions"],
                pt.get("error").map(|e| format!(" ERROR {e}")).unwrap_or_default(),
            );
            points.push(pt);
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
    agent.stop();
    env["load_at_end"] = json!(loadavg());
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

/// A namespace may only choose a congestion control that the initial namespace allows
/// (`tcp_allowed_congestion_control`); DCTCP is not allowed by default. This process runs in
/// the initial namespace: add `algo` there (best effort; the sysctl in the namespace says
/// whether it worked).
pub(crate) fn allow_in_namespaces(algo: &str) {
    let path = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";
    let Ok(cur) = std::fs::read_to_string(path) else {
        return;
    };
    if !cur.split_whitespace().any(|a| a == algo) {
        let _ = std::fs::write(path, format!("{} {algo}", cur.trim()));
    }
}

pub(crate) fn run_point(cfg: &Config, agent: &Agent, a: &Host, b: &Host, q: Queue, cc: Cc) -> Result<Value> {
    let to = SocketAddr::new(IpAddr::V4(b.ipv4()), PORT);
    let total = cfg.warmup_s + cfg.duration_s;
    let opts = bulk::BulkOpts::tcp(to, cfg.flows, total + 0.5);
    let (report, x, y, hx, hy, t0, t1) = std::thread::scope(|s| -> Result<_> {
        let h = s.spawn(|| a.in_netns(|| bulk::run(&opts, &Tags::new())));
        std::thread::sleep(Duration::from_secs_f64(cfg.warmup_s));
        let x = class_counters(agent)?;
        let hx = delay_buckets(&agent.metrics_listener("/metrics").1, CLASS);
        let t0 = Instant::now();
        let r0 = sum_tcp(&[a]);
        std::thread::sleep(Duration::from_secs_f64(cfg.duration_s));
        let y = class_counters(agent)?;
        let hy = delay_buckets(&agent.metrics_listener("/metrics").1, CLASS);
        let t1 = t0.elapsed().as_secs_f64();
        let r1 = sum_tcp(&[a]);
        let report = h
            .join()
            .map_err(|_| anyhow::anyhow!("bulk thread panicked"))???;
        Ok((report, x, y, hx, hy, r1[0] - r0[0], t1))
    })?;
    let d = |k: &str| {
        y[k].as_u64()
            .unwrap_or(0)
            .saturating_sub(x[k].as_u64().unwrap_or(0))
    };
    let delayed = d("delayed_packets");
    let delay_sum =
        y["added_delay_seconds"].as_f64().unwrap_or(0.0) - x["added_delay_seconds"].as_f64().unwrap_or(0.0);
    let bytes = d("bytes");
    let throughput = bytes as f64 * 8.0 / t1 / cfg.rate_bps as f64;
    let p99 = quantile_between(&hx, &hy, 0.99);
    let budget_s = (cfg.target_ms + cfg.interval_ms) as f64 / 1e3;
    let drops = d("dropped_horizon") + d("dropped_codel");
    Ok(json!({
        "kind": NAME,
        "tags": {"queue": q.name(), "cc": cc.name()},
        "summary": {
            "throughput_of_rate": throughput,
            "class_bytes": bytes,
            "delayed_packets": delayed,
            "delay_mean_s": if delayed > 0 { delay_sum / delayed as f64 } else { 0.0 },
            "delay_p50_s": quantile_between(&hx, &hy, 0.5),
            "delay_p99_s": p99,
            "dropped_horizon": d("dropped_horizon"),
            "dropped_codel": d("dropped_codel"),
            "ce_marked": d("ecn_marked_codel"),
            "retransmissions": t0,
            "sender_retrans_reported": report.summary.total_retrans,
            "aims": (q == Queue::CodelEcn).then(|| json!({
                "no_drops": drops == 0,
                "throughput_95": throughput >= 0.95,
                "p99_within_target_plus_interval": p99.is_some_and(|p| p <= budget_s),
            })),
        },
        "histogram_before": hx.iter().map(|(le, n)| json!([le.to_string(), n])).collect::<Vec<_>>(),
        "histogram_after": hy.iter().map(|(le, n)| json!([le.to_string(), n])).collect::<Vec<_>>(),
    }))
}
