//! Running the conditions on the testbed: the senders' agents, RPCs and bulk flows.

use crate::experiments::Common;
use crate::experiments::harness::{Heartbeat, agent_counters, counter_delta, selected, write_out};
use anyhow::{Context, Result};
use paceline_tests::agent::{Agent, Scratch};
use paceline_tests::testbed::{Bottleneck, BottleneckSpec, Host, QdiscStats, Testbed};
use paceline_tests::workload::bulk::{self, BulkOpts, BulkReport};
use paceline_tests::workload::rpc::{self, RpcOpts, RpcReport};
use paceline_tests::workload::serve::{ServeOpts, ServeReport, Server};
use paceline_tests::workload::stats::{self, LatencySummary};
use paceline_tests::workload::{self, Tags};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::*;

pub(crate) struct Sender<'a> {
    pub(crate) host: &'a Host,
    pub(crate) ifname: String,
    pub(crate) agent: Agent<'a>,
}

/// Writes `p` for every sender (by rename) and waits until each agent runs it (file watch;
/// SIGHUP when the watch is slow).
pub(crate) fn switch_policy(senders: &[Sender], p: Policy, rate_bps: u64) -> Result<()> {
    for s in senders {
        let text = policy_text(p, &s.ifname, rate_bps);
        s.agent.apply_policy(&text, Duration::from_secs(3))?;
    }
    Ok(())
}

/// Sum of the counters of a list of qdisc stats.
pub(crate) fn queue_delta(a: &[QdiscStats], b: &[QdiscStats]) -> Vec<Value> {
    a.iter()
        .zip(b)
        .enumerate()
        .map(|(p, (x, y))| {
            json!({
                "queue": p,
                "packets": y.packets.saturating_sub(x.packets),
                "bytes": y.bytes.saturating_sub(x.bytes),
                "drops": y.drops.saturating_sub(x.drops),
            })
        })
        .collect()
}

pub(crate) fn bulk_bytes(r: &ServeReport) -> u64 {
    r.tcp_flows.iter().map(|f| f.bytes).sum()
}

/// Runs one condition once.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_cond(
    senders: &[Sender],
    rx: &Host,
    rx2: &Host,
    ports: (&Bottleneck, &Bottleneck),
    cond: &Cond,
    t: Timing,
    seed: u64,
    rate_bps: u64,
) -> Result<(Value, Vec<f64>, Vec<f64>)> {
    let sink = if cond.elsewhere { rx2 } else { rx };
    let port = if cond.elsewhere { ports.1 } else { ports.0 };
    let bulk_server = sink.in_netns(|| {
        Server::start_plain(&ServeOpts {
            port: BULK_PORT,
            ..ServeOpts::default()
        })
    })??;
    let statuses0: Vec<Value> = senders
        .iter()
        .map(|s| s.agent.status_retry())
        .collect::<Result<_>>()?;
    // Bulk flows, round robin over s1..: (host index, flows).
    let mut per_host = vec![0u32; senders.len()];
    for i in 0..cond.bulk as usize {
        per_host[1 + i % (senders.len() - 1)] += 1;
    }
    let bulk_dur = t.lead_s + t.rpc_s + t.tail_s;
    let dst = SocketAddr::new(sink.ipv4().into(), BULK_PORT);
    let mut clients = Vec::new();
    let mut first_id = 0;
    for (i, &n) in per_host.iter().enumerate() {
        if n == 0 {
            continue;
        }
        let mut o = BulkOpts::tcp(dst, n, bulk_dur);
        o.first_flow_id = first_id;
        first_id += n;
        let host = senders[i].host.clone();
        let tags: Tags = [("cond".to_string(), cond.key())].into_iter().collect();
        clients.push(std::thread::spawn(move || -> Result<BulkReport> {
            host.in_netns(|| bulk::run(&o, &tags))?
        }));
    }
    if cond.bulk > 0 {
        std::thread::sleep(Duration::from_secs_f64(t.lead_s));
    }
    let q0 = (ports.0.queue_stats()?, ports.1.queue_stats()?);
    let p0 = port.stats()?;
    let b0 = bulk_bytes(&bulk_server.report(&Default::default()));
    let hb = Heartbeat::start();
    let t0 = Instant::now();
    let opts = RpcOpts {
        rate: Some(RPC_RATE),
        req_size: RPC_SIZE,
        resp_size: RPC_SIZE as u64,
        duration: t.rpc_s,
        warmup: t.warmup_s,
        samples: true,
        seed,
        ..RpcOpts::closed_loop(SocketAddr::new(rx.ipv4().into(), RPC_PORT), t.rpc_s)
    };
    let tags: Tags = [("cond".to_string(), cond.key())].into_iter().collect();
    // rpc::run starts its clock 1 ms after it is called; requests then leave at fixed
    // intervals from there, and the samples come in request order (one connection).
    let rpc_start_ns = workload::mono_ns() + 1_000_000;
    let rpc_report: Result<RpcReport> = senders[0].host.in_netns(|| rpc::run(&opts, &tags))?;
    let dt = t0.elapsed().as_secs_f64();
    let stalls = hb.stop();
    let b1 = bulk_bytes(&bulk_server.report(&Default::default()));
    let p1 = port.stats()?;
    let q1 = (ports.0.queue_stats()?, ports.1.queue_stats()?);
    let mut bulk_reports = Vec::new();
    for c in clients {
        bulk_reports.push(
            c.join()
                .map_err(|_| anyhow::anyhow!("bulk client thread panicked"))??,
        );
    }
    drop(bulk_server);
    let statuses1: Vec<Value> = senders
        .iter()
        .map(|s| s.agent.status_retry())
        .collect::<Result<_>>()?;
    let rpc_report = rpc_report?;
    let samples = rpc_report.samples_us.clone().unwrap_or_default();
    // The RPCs during which the machine did not stall: request j of the samples was sent at
    // start + (k0 + j) / rate, k0 being the requests of the warm-up; keep it when no stall
    // overlaps its send-to-response interval (with a millisecond of slack on both sides).
    let interval_ns = 1e9 / RPC_RATE;
    let k0 = (t.warmup_s * RPC_RATE).ceil() as u64;
    let clean: Vec<f64> = samples
        .iter()
        .enumerate()
        .filter(|(j, lat)| {
            let send = rpc_start_ns + ((k0 + *j as u64) as f64 * interval_ns) as u64;
            let end = send + (**lat * 1e3) as u64;
            !stalls.overlaps(send.saturating_sub(1_000_000), end + 1_000_000)
        })
        .map(|(_, l)| *l)
        .collect();
    let clean_lat = LatencySummary::from_us(clean.clone());
    // The agents' counters: the RPC class on s0, the bulk class summed over the others.
    let rpc_agent = counter_delta(
        &agent_counters(&statuses0[0], "classes", "rpc"),
        &agent_counters(&statuses1[0], "classes", "rpc"),
    );
    let mut bulk_agent: BTreeMap<String, f64> = BTreeMap::new();
    for (a, b) in statuses0.iter().zip(&statuses1).skip(1) {
        for (k, v) in counter_delta(
            &agent_counters(a, "classes", "bulk"),
            &agent_counters(b, "classes", "bulk"),
        ) {
            *bulk_agent.entry(k).or_default() += v;
        }
    }
    let rec = json!({
        "rpc": rpc_report.summary,
        "bulk_goodput_bps": (b1.saturating_sub(b0)) as f64 * 8.0 / dt,
        "bulk_retrans": bulk_reports.iter().map(|r| r.summary.total_retrans).sum::<u64>(),
        "port": {
            "sent_bytes": p1.bytes.saturating_sub(p0.bytes),
            "drops": p1.drops.saturating_sub(p0.drops),
            "utilisation": (p1.bytes.saturating_sub(p0.bytes)) as f64 * 8.0 / dt / rate_bps as f64,
        },
        "queues_rx": queue_delta(&q0.0, &q1.0),
        "queues_rx2": queue_delta(&q0.1, &q1.1),
        "agent_rpc": rpc_agent,
        "agent_bulk": bulk_agent,
        "stalls": stalls,
        "stall_free": {
            "count": clean_lat.count,
            "share": if samples.is_empty() { 0.0 } else { clean.len() as f64 / samples.len() as f64 },
            "p50_us": clean_lat.p50_us,
            "p99_us": clean_lat.p99_us,
            "p999_us": clean_lat.p999_us,
        },
    });
    Ok((rec, samples, clean))
}

/// Runs the experiment.
pub fn run(c: &Common, rate_mbit: u64) -> Result<()> {
    anyhow::ensure!(rate_mbit > 0, "--rate-mbit must be at least 1");
    let rate_bps = rate_mbit * 1_000_000;
    std::fs::create_dir_all(&c.out).with_context(|| format!("create {}", c.out.display()))?;
    let (bulk_counts, reps, t): (&[u32], u32, Timing) = if c.quick {
        (
            &[4],
            1,
            Timing {
                lead_s: 2.0,
                rpc_s: 5.0,
                warmup_s: 0.5,
                tail_s: 0.5,
            },
        )
    } else {
        (
            &[4, 8],
            2,
            Timing {
                lead_s: 2.0,
                rpc_s: 12.0,
                warmup_s: 1.0,
                tail_s: 0.5,
            },
        )
    };
    let started = Instant::now();
    let mut conds = conditions(bulk_counts);
    conds.retain(|c| c.bulk == 0 && c.name == "idle" || selected(&c.key()));
    eprintln!(
        "qjump: {} conditions x {reps} reps, RPCs for {} s each; kernel {}",
        conds.len(),
        t.rpc_s,
        crate::experiments::harness::kernel_release()
    );

    // Topology.
    let tb = Testbed::new("plexp_qjump")?;
    let sw = tb.add_router("sw")?;
    let rx = tb.add_host("rx")?;
    let rx2 = tb.add_host("rx2")?;
    let mut hosts = Vec::new();
    for i in 0..SENDERS {
        let h = tb.add_host(&format!("s{i}"))?;
        tb.link(&h, &sw)?;
        hosts.push(h);
    }
    let l_rx = tb.link(&sw, &rx)?;
    let l_rx2 = tb.link(&sw, &rx2)?;
    tb.route_all()?;
    let spec = BottleneckSpec::strict_priority(rate_bps, BUFFER);
    let port_rx = l_rx.bottleneck_a_to_b(&spec)?;
    let port_rx2 = l_rx2.bottleneck_a_to_b(&spec)?;
    for h in &hosts {
        h.ping_ok(rx.ipv4().into(), 5)?;
        h.ping_ok(rx2.ipv4().into(), 5)?;
    }

    // Agents, flat policy first.
    let scratch = Scratch::new("plexp-qjump");
    let mut senders = Vec::new();
    for h in &hosts {
        let ifname = h.iface_to(&sw).context("sender interface")?.ifname;
        let dir = scratch.path(h.name());
        std::fs::create_dir_all(&dir)?;
        let policy_path = dir.join("policy.yaml");
        std::fs::write(&policy_path, policy_text(Policy::Flat, &ifname, rate_bps))?;
        let agent = Agent::start(h, &policy_path, &dir.join("state"));
        senders.push(Sender {
            host: h,
            ifname,
            agent,
        });
    }
    for p in [Policy::Flat, Policy::QJump] {
        write_out(
            &c.out,
            &format!(
                "qjump-policy-{}.yaml",
                if p == Policy::Flat { "flat" } else { "levels" }
            ),
            &policy_text(p, "<sender interface>", rate_bps),
        )?;
    }
    let enforcement = senders[0].agent.status_retry()?["enforcement"].clone();
    eprintln!("qjump: agent enforcement {enforcement}");

    // The RPC server stays up for the whole run.
    let rpc_server = rx.in_netns(|| {
        Server::start_plain(&ServeOpts {
            port: RPC_PORT,
            ..ServeOpts::default()
        })
    })??;

    let mut records: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut samples: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut clean_samples: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut levels_status = Value::Null;
    let mut current = Policy::Flat;
    for rep in 0..reps {
        // Odd repetitions run the levels policy's conditions first, so that slow drifts of the
        // emulator's speed (other load on the host) do not always hit the same conditions.
        let mut order: Vec<&Cond> = conds.iter().collect();
        if rep % 2 == 1 {
            order.sort_by_key(|c| c.policy == Policy::Flat);
        }
        for cond in order {
            if cond.policy != current {
                switch_policy(&senders, cond.policy, rate_bps)?;
                current = cond.policy;
                if current == Policy::QJump && levels_status.is_null() {
                    levels_status = senders[0].agent.status_retry()?["policy"]["levels"].clone();
                }
            }
            let seed = c.seed + rep as u64;
            let (rec, s, clean) = run_cond(
                &senders,
                &rx,
                &rx2,
                (&port_rx, &port_rx2),
                cond,
                t,
                seed,
                rate_bps,
            )
            .with_context(|| format!("condition {} (rep {rep})", cond.key()))?;
            let r = &rec["rpc"];
            eprintln!(
                "qjump: rep {rep} {:<26} p50 {:>8.0} us  p99 {:>8.0} us  p99.9 {:>8.0} us  lost {}  bulk {:>6.2} Mbit/s  port drops {}",
                cond.key(),
                r["p50_us"].as_f64().unwrap_or(0.0),
                r["p99_us"].as_f64().unwrap_or(0.0),
                r["p999_us"].as_f64().unwrap_or(0.0),
                r["lost"],
                rec["bulk_goodput_bps"].as_f64().unwrap_or(0.0) / 1e6,
                rec["port"]["drops"],
            );
            eprintln!(
                "qjump:       stalls {:.0} ms (max {:.1} ms, timer p99 late {:.0} us)",
                rec["stalls"]["stalled_ms"].as_f64().unwrap_or(0.0),
                rec["stalls"]["max_late_ms"].as_f64().unwrap_or(0.0),
                rec["stalls"]["p99_late_us"].as_f64().unwrap_or(0.0),
            );
            records.entry(cond.key()).or_default().push(rec);
            samples.entry(cond.key()).or_default().extend(s);
            clean_samples.entry(cond.key()).or_default().extend(clean);
        }
    }
    drop(rpc_server);
    for s in senders {
        if !s.agent.stop_patiently() {
            eprintln!(
                "qjump: the agent of {} did not exit within a minute of SIGTERM",
                s.host.name()
            );
        }
    }
    let elapsed = started.elapsed().as_secs_f64();

    // Summaries per condition (samples of all repetitions together).
    let idle_p99 = LatencySummary::from_us(samples.get("idle/0").cloned().unwrap_or_default()).p99_us;
    let idle_clean_p99 =
        LatencySummary::from_us(clean_samples.get("idle/0").cloned().unwrap_or_default()).p99_us;
    let mut out_conds = Vec::new();
    for cond in &conds {
        let key = cond.key();
        let recs = &records[&key];
        let lat = LatencySummary::from_us(samples[&key].clone());
        let clean = LatencySummary::from_us(clean_samples[&key].clone());
        let clean_share = if lat.count > 0 {
            clean.count as f64 / lat.count as f64
        } else {
            0.0
        };
        let per_rep_p99: Vec<f64> = recs.iter().filter_map(|r| r["rpc"]["p99_us"].as_f64()).collect();
        let mean_of =
            |f: &dyn Fn(&Value) -> Option<f64>| stats::mean(&recs.iter().filter_map(f).collect::<Vec<_>>());
        // (+ 0.0: an empty float sum is -0.0.)
        let sum_of = |f: &dyn Fn(&Value) -> Option<f64>| recs.iter().filter_map(f).sum::<f64>() + 0.0;
        let queues: Vec<Value> = (0..8)
            .map(|q| {
                let side = if cond.elsewhere { "queues_rx2" } else { "queues_rx" };
                json!({
                    "queue": q,
                    "packets": sum_of(&|r| r[side][q]["packets"].as_f64()),
                    "drops": sum_of(&|r| r[side][q]["drops"].as_f64()),
                })
            })
            .collect();
        let bulk_to = if cond.bulk == 0 {
            "-"
        } else if cond.elsewhere {
            "rx2"
        } else {
            "rx"
        };
        let delayed = sum_of(&|r| r["agent_rpc"]["delayed_packets"].as_f64());
        let added_delay_us = if delayed > 0.0 {
            sum_of(&|r| r["agent_rpc"]["added_delay_seconds"].as_f64()) / delayed * 1e6
        } else {
            0.0
        };
        let policy = if cond.policy == Policy::Flat {
            "flat"
        } else {
            "levels"
        };
        let p99_vs_idle = if idle_p99 > 0.0 {
            lat.p99_us / idle_p99
        } else {
            0.0
        };
        out_conds.push(json!({
            "kind": "qjump-condition",
            "version": workload::SCHEMA_VERSION,
            "tags": {
                "condition": cond.name,
                "bulk_flows": cond.bulk.to_string(),
                "policy": policy,
                "bulk_to": bulk_to,
            },
            "summary": {
                "count": lat.count,
                "p50_us": lat.p50_us,
                "p90_us": lat.p90_us,
                "p99_us": lat.p99_us,
                "p999_us": lat.p999_us,
                "max_us": lat.max_us,
                "mean_us": lat.mean_us,
                "p99_rep_min_us": per_rep_p99.iter().copied().reduce(f64::min),
                "p99_rep_max_us": per_rep_p99.iter().copied().reduce(f64::max),
                "p99_vs_idle": p99_vs_idle,
                "rpc_sent": sum_of(&|r| r["rpc"]["sent"].as_f64()),
                "rpc_lost": sum_of(&|r| r["rpc"]["lost"].as_f64()),
                "bulk_goodput_bps": mean_of(&|r| r["bulk_goodput_bps"].as_f64()),
                "bulk_retrans": sum_of(&|r| r["bulk_retrans"].as_f64()),
                "port_utilisation": mean_of(&|r| r["port"]["utilisation"].as_f64()),
                "port_drops": sum_of(&|r| r["port"]["drops"].as_f64()),
                "rpc_delayed_packets": delayed,
                "rpc_agent_packets": sum_of(&|r| r["agent_rpc"]["packets"].as_f64()),
                "rpc_added_delay_us": added_delay_us,
                "rpc_horizon_drops": sum_of(&|r| r["agent_rpc"]["dropped_horizon"].as_f64()),
                "rpc_tagged_packets": sum_of(&|r| r["agent_rpc"]["tagged_packets"].as_f64()),
                "stalled_ms": sum_of(&|r| r["stalls"]["stalled_ms"].as_f64()),
                "max_stall_ms": recs.iter().filter_map(|r| r["stalls"]["max_late_ms"].as_f64()).reduce(f64::max),
                "p99_timer_late_us": mean_of(&|r| r["stalls"]["p99_late_us"].as_f64()),
                "stall_free_count": clean.count,
                "stall_free_share": clean_share,
                "stall_free_p50_us": clean.p50_us,
                "stall_free_p90_us": clean.p90_us,
                "stall_free_p99_us": clean.p99_us,
                "stall_free_p999_us": clean.p999_us,
                "stall_free_max_us": clean.max_us,
            },
            "queues": queues,
            "reps": recs,
        }));
    }
    // The aim, per bulk load.
    let get = |name: &str, k: u32| {
        out_conds
            .iter()
            .find(|v| v["tags"]["condition"] == name && v["tags"]["bulk_flows"] == k.to_string().as_str())
            .map(|v| v["summary"].clone())
    };
    let mut aims = Vec::new();
    for &k in bulk_counts {
        let (Some(l), Some(n), Some(e)) = (
            get("levels", k),
            get("no-levels", k),
            get("levels-bulk-elsewhere", k),
        ) else {
            continue;
        };
        let ratio = l["p99_us"].as_f64().unwrap_or(0.0) / idle_p99;
        let clean_ratio = l["stall_free_p99_us"].as_f64().unwrap_or(0.0) / idle_clean_p99;
        aims.push(json!({
            "bulk_flows": k,
            "idle_p99_us": idle_p99,
            "levels_p99_us": l["p99_us"],
            "no_levels_p99_us": n["p99_us"],
            "bulk_elsewhere_p99_us": e["p99_us"],
            "levels_vs_idle": ratio,
            "no_levels_vs_idle": n["p99_us"].as_f64().unwrap_or(0.0) / idle_p99,
            "levels_vs_bulk_elsewhere": l["p99_us"].as_f64().unwrap_or(0.0) / e["p99_us"].as_f64().unwrap_or(f64::NAN),
            "aim_holds": ratio <= AIM,
            "idle_stall_free_p99_us": idle_clean_p99,
            "levels_stall_free_p99_us": l["stall_free_p99_us"],
            "no_levels_stall_free_p99_us": n["stall_free_p99_us"],
            "levels_vs_idle_stall_free": clean_ratio,
            "aim_holds_stall_free": clean_ratio <= AIM,
        }));
    }
    let doc = json!({
        "kind": "qjump",
        "version": workload::SCHEMA_VERSION,
        "tags": {
            "kernel": crate::experiments::harness::kernel_release(),
            "in_vm": std::env::var_os("PACELINE_IN_VM").is_some(),
            "enforcement": enforcement["mode"],
            "quick": c.quick,
        },
        "params": {
            "seed": c.seed,
            "reps": reps,
            "rate_bps": rate_bps,
            "buffer_bytes_per_queue": BUFFER,
            "rpc_rate": RPC_RATE,
            "rpc_bytes": RPC_SIZE,
            "senders": SENDERS,
            "max_packet": MAX_PACKET,
            "switch_delay": SWITCH_DELAY,
            "lead_s": t.lead_s,
            "rpc_s": t.rpc_s,
            "warmup_s": t.warmup_s,
            "aim": AIM,
            "enforcement": enforcement,
            "levels": levels_status,
        },
        "summary": {
            "aims": aims,
            "elapsed_s": elapsed,
        },
        "conditions": out_conds,
    });
    workload::write_json(&doc, Some(&c.out.join("qjump.json")))?;
    let compact: BTreeMap<&String, Vec<f64>> = samples
        .iter()
        .map(|(k, v)| (k, v.iter().map(|x| (x * 10.0).round() / 10.0).collect()))
        .collect();
    write_out(
        &c.out,
        "qjump-samples.json",
        &serde_json::to_string(&json!({"unit": "us", "samples": compact}))?,
    )?;
    let md = markdown(&doc);
    write_out(&c.out, "qjump.md", &md)?;
    plots(&c.out, &samples, &clean_samples, bulk_counts, &out_conds)?;
    print!("{md}");
    Ok(())
}
