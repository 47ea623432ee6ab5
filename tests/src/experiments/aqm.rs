//! Issue 11's AQM benchmark: a class paced at R with 8 TCP flows offered to it, its queue the
//! EDT departure queue fq holds, with only the horizon against it (the default) or with CoDel
//! and ECN (`codel: {target, interval, ecn: true}`); for TCP cubic with ECN, cubic without
//! and DCTCP. Throughput against R, the delay pacing added (p50 and p99 from the class's delay
//! histogram, and the mean), drops (horizon, CoDel), CE marks and retransmissions.
//!
//! # Setup
//! Two namespaces on a veth pair; the sender runs the agent with `enforcement: fq` and a class
//! `paced` (`class_rate` [`Config::rate_bps`]) for the receiver's port; the receiver runs one
//! `plload serve`. Per (queue, congestion control): both ends' `tcp_congestion_control` and
//! `tcp_ecn` set (the server restarted after), the policy switched, [`Config::flows`] bulk flows for
//! [`Config::warmup_s`] + [`Config::duration_s`], measured over the last `duration_s` from
//! the agent's counters and `/metrics`. Needs sch_fq (the VM): the horizon and CoDel act on the
//! departures fq holds.
//!
//! # Aims (issue 11), reported, not asserted
//! With CoDel and ECN: no drops, throughput at least 95% of R, p99 added delay within target
//! plus one interval.
//!
//! # Outputs (in `--out`)
//! `aqm.json` (config, environment, one entry per point with the histogram deltas) and
//! `aqm.md`.

use super::Common;
use super::harness::{loadavg, sum_tcp};
use crate::agent::{Agent, Scratch};
use crate::testbed::{self, Host};
use crate::workload::{self, Tags, bulk, serve};
use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::{Value, json};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

const NAME: &str = "aqm";
const PORT: u16 = 5600;
const CLASS: &str = "paced";

/// What holds the class's queue down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Queue {
    /// Only the horizon (the agent's default): packets due beyond it are dropped.
    Horizon,
    /// CoDel on the departure delay, marking CE on ECN-capable packets.
    CodelEcn,
}

impl Queue {
    pub const ALL: [Queue; 2] = [Queue::Horizon, Queue::CodelEcn];
    pub fn name(self) -> &'static str {
        match self {
            Queue::Horizon => "horizon",
            Queue::CodelEcn => "codel-ecn",
        }
    }
}

/// The senders' congestion control.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cc {
    /// cubic, ECN negotiated.
    CubicEcn,
    /// cubic, no ECN (CoDel drops instead of marking).
    Cubic,
    /// DCTCP (ECN on; needs the kernel's tcp_dctcp).
    Dctcp,
}

impl Cc {
    pub const ALL: [Cc; 3] = [Cc::CubicEcn, Cc::Cubic, Cc::Dctcp];
    pub fn name(self) -> &'static str {
        match self {
            Cc::CubicEcn => "cubic+ecn",
            Cc::Cubic => "cubic",
            Cc::Dctcp => "dctcp",
        }
    }
    fn algorithm(self) -> &'static str {
        match self {
            Cc::CubicEcn | Cc::Cubic => "cubic",
            Cc::Dctcp => "dctcp",
        }
    }
    fn ecn(self) -> bool {
        !matches!(self, Cc::Cubic)
    }
}

/// The benchmark's knobs (all of them end up in the JSON).
#[derive(Clone, Debug, Serialize)]
pub struct Config {
    /// The class's rate, bit/s.
    pub rate_bps: u64,
    /// Bulk TCP flows offered to it.
    pub flows: u32,
    /// Seconds before measuring.
    pub warmup_s: f64,
    /// Seconds measured.
    pub duration_s: f64,
    /// CoDel's target, ms.
    pub target_ms: u64,
    /// CoDel's interval, ms.
    pub interval_ms: u64,
}

impl Config {
    pub fn new(quick: bool) -> Config {
        Config {
            // What the emulated VM sends without running out itself.
            rate_bps: 20_000_000,
            flows: 8,
            warmup_s: 2.0,
            duration_s: if quick { 4.0 } else { 10.0 },
            target_ms: 5,
            interval_ms: 100,
        }
    }
}

fn policy(cfg: &Config, ifname: &str, q: Queue) -> String {
    let codel = match q {
        Queue::Horizon => String::new(),
        Queue::CodelEcn => format!(
            "      codel: {{target: {}ms, interval: {}ms, ecn: true}}\n",
            cfg.target_ms, cfg.interval_ms
        ),
    };
    format!(
        "apiVersion: paceline/v1\nkind: Policy\nmetadata:\n  name: plexp-aqm-{q}\n  description: AQM benchmark (issue 11), queue {q}\nspec:\n  interfaces: [{ifname}]\n  enforcement: fq\n  # veths report no speed\n  link_rate: 10Gbit\n  levels: [{{name: bulk, priority: 0}}]\n  classes:\n    - name: {CLASS}\n      level: bulk\n      class_rate: {rate}bit\n{codel}    - {{name: other, level: bulk}}\n  rules:\n    - {{class: {CLASS}, protocol: tcp, dst_port: {PORT}}}\n  default_class: other\n",
        q = q.name(),
        rate = cfg.rate_bps,
    )
}

/// The class's counters from the agent's status ([`super::harness::agent_counters`]).
fn class_counters(agent: &Agent) -> Result<Value> {
    let s = agent.status().context("agent status")?;
    let c = super::harness::agent_counters(&s, "classes", CLASS);
    anyhow::ensure!(!c.is_null(), "no class {CLASS} in the status");
    Ok(c)
}

/// Cumulative buckets `(le seconds, count)` of the class's delay histogram in `/metrics`
/// (empty until the class has delayed a packet).
pub fn delay_buckets(metrics: &str, class: &str) -> Vec<(f64, u64)> {
    let want = format!("class=\"{class}\"");
    let mut v: Vec<(f64, u64)> = metrics
        .lines()
        .filter(|l| l.starts_with("paceline_class_pacing_delay_seconds_bucket{") && l.contains(&want))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            let n = l.rsplit(' ').next()?.parse::<f64>().ok()? as u64;
            Some((le, n))
        })
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

/// The upper bound of the bucket holding quantile `q` of the samples between two cumulative
/// histograms (`None` without samples).
pub fn quantile_between(before: &[(f64, u64)], after: &[(f64, u64)], q: f64) -> Option<f64> {
    let at = |h: &[(f64, u64)], le: f64| h.iter().find(|b| b.0 == le).map_or(0, |b| b.1);
    let deltas: Vec<(f64, u64)> = after
        .iter()
        .map(|&(le, n)| (le, n.saturating_sub(at(before, le))))
        .collect();
    let total = deltas.last()?.1;
    if total == 0 {
        return None;
    }
    let rank = (q * total as f64).ceil().max(1.0) as u64;
    deltas.iter().find(|b| b.1 >= rank).map(|b| b.0)
}

/// Runs the benchmark.
pub fn run(c: &Common) -> Result<()> {
    let cfg = Config::new(c.quick);
    if !paceline::features::Features::probe().sch_fq {
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
    let kernel = super::harness::kernel_release();
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
            write_outputs(&c.out, &cfg, c, &env, &points, t_begin.elapsed().as_secs_f64())?;
        }
    }
    agent.stop();
    env["load_at_end"] = json!(loadavg());
    write_outputs(&c.out, &cfg, c, &env, &points, t_begin.elapsed().as_secs_f64())?;
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
fn allow_in_namespaces(algo: &str) {
    let path = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";
    let Ok(cur) = std::fs::read_to_string(path) else {
        return;
    };
    if !cur.split_whitespace().any(|a| a == algo) {
        let _ = std::fs::write(path, format!("{} {algo}", cur.trim()));
    }
}

fn fmt_ms(v: &Value) -> String {
    v.as_f64().map_or("-".into(), |s| format!("<= {:.1} ms", s * 1e3))
}

fn run_point(cfg: &Config, agent: &Agent, a: &Host, b: &Host, q: Queue, cc: Cc) -> Result<Value> {
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

fn write_outputs(
    out: &Path,
    cfg: &Config,
    c: &Common,
    env: &Value,
    points: &[Value],
    elapsed_s: f64,
) -> Result<()> {
    let doc = json!({
        "kind": NAME,
        "version": workload::SCHEMA_VERSION,
        "elapsed_s": elapsed_s,
        "quick": c.quick,
        "config": cfg,
        "environment": env,
        "results": points,
    });
    workload::write_json(&doc, Some(&out.join(format!("{NAME}.json"))))?;
    let mut s = format!(
        "# AQM: horizon only vs CoDel + ECN on a paced class\n\nKernel {}, class at {} Mbit/s, {} TCP flows, {} s measured after {} s; CoDel target {} ms, interval {} ms. Delay quantiles are the upper bounds of the histogram's log2 buckets.\n\n| cc | queue | throughput / R | delay p50 | delay p99 | delay mean (ms) | horizon drops | CoDel drops | CE marks | retransmissions |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        env["kernel"].as_str().unwrap_or("?"),
        cfg.rate_bps / 1_000_000,
        cfg.flows,
        cfg.duration_s,
        cfg.warmup_s,
        cfg.target_ms,
        cfg.interval_ms
    );
    for p in points {
        let (cc, q) = (
            p["tags"]["cc"].as_str().unwrap_or("?"),
            p["tags"]["queue"].as_str().unwrap_or("?"),
        );
        if let Some(e) = p.get("error") {
            s += &format!(
                "| {cc} | {q} | error: {} | | | | | | | |\n",
                e.as_str().unwrap_or("")
            );
            continue;
        }
        let x = &p["summary"];
        s += &format!(
            "| {cc} | {q} | {:.3} | {} | {} | {:.1} | {} | {} | {} | {} |\n",
            x["throughput_of_rate"].as_f64().unwrap_or(0.0),
            fmt_ms(&x["delay_p50_s"]),
            fmt_ms(&x["delay_p99_s"]),
            x["delay_mean_s"].as_f64().unwrap_or(0.0) * 1e3,
            x["dropped_horizon"],
            x["dropped_codel"],
            x["ce_marked"],
            x["retransmissions"]
        );
    }
    if let Some(u) = env["unavailable"].as_object().filter(|u| !u.is_empty()) {
        s += "\n";
        for (k, why) in u {
            s += &format!("`{k}` did not run: {}\n", why.as_str().unwrap_or(""));
        }
    }
    std::fs::write(out.join(format!("{NAME}.md")), s)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = "# TYPE paceline_class_pacing_delay_seconds histogram\n\
paceline_class_pacing_delay_seconds_bucket{class=\"paced\",level=\"bulk\",le=\"0.001\"} 10\n\
paceline_class_pacing_delay_seconds_bucket{class=\"paced\",level=\"bulk\",le=\"0.002\"} 60\n\
paceline_class_pacing_delay_seconds_bucket{class=\"paced\",level=\"bulk\",le=\"0.004\"} 99\n\
paceline_class_pacing_delay_seconds_bucket{class=\"paced\",level=\"bulk\",le=\"+Inf\"} 100\n\
paceline_class_pacing_delay_seconds_bucket{class=\"other\",level=\"bulk\",le=\"0.001\"} 5\n";

    #[test]
    fn buckets_are_read_for_the_class_only_and_sorted() {
        let b = delay_buckets(METRICS, "paced");
        assert_eq!(b.len(), 4);
        assert_eq!(b[0], (0.001, 10));
        assert!(b[3].0.is_infinite() && b[3].1 == 100);
        assert_eq!(delay_buckets(METRICS, "other"), vec![(0.001, 5)]);
    }

    #[test]
    fn quantiles_come_from_the_samples_between_two_scrapes() {
        let after = delay_buckets(METRICS, "paced");
        assert_eq!(quantile_between(&[], &after, 0.5), Some(0.002));
        assert_eq!(quantile_between(&[], &after, 0.99), Some(0.004));
        assert!(quantile_between(&[], &after, 1.0).unwrap().is_infinite());
        // Only what happened in between: the first 60 samples were before.
        let before = vec![(0.001, 10), (0.002, 60), (0.004, 60), (f64::INFINITY, 60)];
        assert_eq!(quantile_between(&before, &after, 0.5), Some(0.004));
        assert_eq!(quantile_between(&after, &after, 0.5), None);
    }

    #[test]
    fn policies_validate_without_warnings() {
        let cfg = Config::new(false);
        for q in Queue::ALL {
            let text = policy(&cfg, "veth0", q);
            match paceline::policy::parse_str(&text, "aqm.yaml", &paceline::policy::OfflineHost) {
                Err(e) => panic!("{}: {e:?}\n{text}", q.name()),
                Ok(v) => assert!(v.warnings.is_empty(), "{}: {:?}", q.name(), v.warnings),
            }
            assert_eq!(text.contains("codel:"), q == Queue::CodelEcn);
        }
    }
}
