//! Running the points on the testbed and measuring them.

use crate::experiments::Common;
use crate::experiments::harness::{
    Heartbeat, Stalls, agent_counters, counter_delta, read_snmp, selected, write_out,
};
use anyhow::{Context, Result};
use paceline_tests::agent::{Agent, Scratch};
use paceline_tests::testbed::{DevCounters, Host, LinkOpts, Testbed, read_dev};
use paceline_tests::workload::bulk::{self, BulkOpts, BulkReport};
use paceline_tests::workload::serve::{ServeOpts, ServeReport, Server};
use paceline_tests::workload::{self, mono_ns, sleep_until_ns};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::*;

/// Sums counter maps.
pub(crate) fn add_counters(a: &mut BTreeMap<String, f64>, b: &BTreeMap<String, f64>) {
    for (k, v) in b {
        *a.entry(k.clone()).or_default() += v;
    }
}

/// Bytes received so far per flow of a server's report: `(kind, peer, flow id) -> bytes`.
pub(crate) fn flow_bytes(r: &ServeReport, tag: usize) -> BTreeMap<(usize, String, u32), u64> {
    let mut m = BTreeMap::new();
    for f in &r.tcp_flows {
        m.insert((tag, f.peer.clone(), f.flow_id), f.bytes);
    }
    for f in &r.udp_flows {
        m.insert((tag, f.peer.clone(), f.flow_id), f.bytes);
    }
    m
}

/// Packets the sender's leaf qdiscs (fq) dropped so far.
pub(crate) fn qdisc_drops(host: &Host, ifname: &str) -> Result<u64> {
    Ok(host
        .qdisc_stats(ifname)?
        .iter()
        .filter(|q| q.kind != "mq" && q.kind != "clsact" && q.kind != "htb")
        .map(|q| q.drops)
        .sum())
}

/// The sampler reads the interface's counters this often.
pub(crate) const SAMPLE_NS: u64 = 250_000_000;

/// The wire rate over the parts of the window where the machine ran: the sample intervals
/// that no stall overlaps, nor ends within one interval before (a stall's end releases a
/// burst of overdue packets). Returns (rate in bit/s, share of the window counted).
pub(crate) fn stall_free_rate(series: &[(u64, u64)], stalls: &Stalls) -> (Option<f64>, f64) {
    let (mut bytes, mut ns, mut total) = (0u64, 0u64, 0u64);
    for w in series.windows(2) {
        let ((a, ba), (b, bb)) = (w[0], w[1]);
        total += b - a;
        if !stalls.overlaps(a.saturating_sub(SAMPLE_NS), b) {
            bytes += bb - ba;
            ns += b - a;
        }
    }
    let share = if total > 0 { ns as f64 / total as f64 } else { 0.0 };
    // At least a second of clean time, or no figure.
    let rate = (ns >= 1_000_000_000).then(|| bytes as f64 * 8.0 / (ns as f64 / 1e9));
    (rate, share)
}

/// What the sampler saw during one point.
pub(crate) struct Sampled {
    pub(crate) stalls: Stalls,
    pub(crate) t0_ns: u64,
    pub(crate) t1_ns: u64,
    pub(crate) c0: DevCounters,
    pub(crate) c1: DevCounters,
    /// Per flow payload bytes at t0 and t1.
    pub(crate) b0: BTreeMap<(usize, String, u32), u64>,
    pub(crate) b1: BTreeMap<(usize, String, u32), u64>,
    /// (t_ns, tx_bytes) every [`SAMPLE_NS`] through the window.
    pub(crate) series: Vec<(u64, u64)>,
}

/// Samples the sender's interface and the servers through the window (call in the sender's
/// namespace).
pub(crate) fn sample(ifname: &str, servers: &[Server], start_ns: u64, t: Timing) -> Result<Sampled> {
    let t0_want = start_ns + (t.warm_s * 1e9) as u64;
    let t1_want = t0_want + (t.window_s * 1e9) as u64;
    let snap = |servers: &[Server]| {
        let mut m = BTreeMap::new();
        for (i, s) in servers.iter().enumerate() {
            m.extend(flow_bytes(&s.report(&Default::default()), i));
        }
        m
    };
    sleep_until_ns(t0_want);
    let hb = Heartbeat::start();
    let t0_ns = mono_ns();
    let c0 = read_dev(ifname)?;
    let b0 = snap(servers);
    let mut series = vec![(t0_ns, c0.tx_bytes)];
    let mut next = t0_ns + SAMPLE_NS;
    while next < t1_want {
        sleep_until_ns(next);
        series.push((mono_ns(), read_dev(ifname)?.tx_bytes));
        next += SAMPLE_NS;
    }
    sleep_until_ns(t1_want);
    let t1_ns = mono_ns();
    let c1 = read_dev(ifname)?;
    let b1 = snap(servers);
    let stalls = hb.stop();
    series.push((t1_ns, c1.tx_bytes));
    Ok(Sampled {
        stalls,
        t0_ns,
        t1_ns,
        c0,
        c1,
        b0,
        b1,
        series,
    })
}

/// The testbed of the experiment.
pub(crate) struct Bed {
    pub(crate) _tb: Testbed,
    pub(crate) tx: Host,
    pub(crate) rx: Host,
    /// (sender ifname, receiver address) per MTU.
    pub(crate) links: BTreeMap<u32, (String, IpAddr)>,
}

pub(crate) fn build_bed() -> Result<Bed> {
    let tb = Testbed::new("plexp_pacing")?;
    let tx = tb.add_host("tx")?;
    let rx = tb.add_host("rx")?;
    let mut links = BTreeMap::new();
    for mtu in [1500u32, 9000] {
        let l = tb.link_with(
            &tx,
            &rx,
            &LinkOpts {
                mtu,
                ..LinkOpts::default()
            },
        )?;
        links.insert(mtu, (l.a.ifname.clone(), IpAddr::V4(l.b.ipv4)));
    }
    Ok(Bed {
        _tb: tb,
        tx,
        rx,
        links,
    })
}

/// Runs one point once; returns its record.
pub(crate) fn run_point(bed: &Bed, agent: &Agent, p: &Point, t: Timing, seed: u64) -> Result<Value> {
    let (ifname, dst) = bed.links[&p.mtu].clone();
    // Servers first (in the receiver's namespace, in this process: live byte counts).
    let mut servers = Vec::new();
    for g in &p.groups {
        let opts = ServeOpts {
            port: g.port,
            ..ServeOpts::default()
        };
        servers.push(bed.rx.in_netns(|| Server::start_plain(&opts))??);
    }
    let rcvbuf0 = bed.rx.in_netns(|| read_snmp("Udp", "RcvbufErrors"))??;
    let st0 = agent.status_retry()?;
    let whole0 = bed.tx.in_netns(|| read_dev(&ifname))??;
    let qdrops0 = qdisc_drops(&bed.tx, &ifname)?;
    let start_ns = mono_ns();
    let mut clients = Vec::new();
    for (i, g) in p.groups.iter().enumerate() {
        let mut o = BulkOpts::tcp(SocketAddr::new(dst, g.port), g.flows, t.duration_s());
        if p.proto == Proto::Udp {
            o.udp = true;
            o.rate_bps = Some(p.udp_flow_payload_bps);
            o.msg_size = Some(p.udp_payload() as usize);
        }
        let tags: workload::Tags = [
            ("point".to_string(), p.name.clone()),
            ("class".to_string(), g.class.clone()),
            ("seed".to_string(), (seed + i as u64).to_string()),
        ]
        .into_iter()
        .collect();
        let host = bed.tx.clone();
        clients.push(std::thread::spawn(move || -> Result<BulkReport> {
            host.in_netns(|| bulk::run(&o, &tags))?
        }));
    }
    let sampled = bed.tx.in_netns(|| sample(&ifname, &servers, start_ns, t))?;
    let mut reports = Vec::new();
    for c in clients {
        reports.push(
            c.join()
                .map_err(|_| anyhow::anyhow!("bulk client thread panicked"))??,
        );
    }
    // Let the last datagrams and end markers arrive before the final reports.
    std::thread::sleep(Duration::from_millis(500));
    let finals: Vec<ServeReport> = servers.iter().map(|s| s.report(&Default::default())).collect();
    drop(servers);
    let rcvbuf1 = bed.rx.in_netns(|| read_snmp("Udp", "RcvbufErrors"))??;
    let whole1 = bed.tx.in_netns(|| read_dev(&ifname))??;
    let qdrops1 = qdisc_drops(&bed.tx, &ifname)?;
    let st1 = agent.status_retry()?;
    let s = sampled?;

    // Wire rate and its spread.
    let dt = (s.t1_ns - s.t0_ns) as f64 / 1e9;
    let wire_bytes = s.c1.tx_bytes - s.c0.tx_bytes;
    let wire_pkts = s.c1.tx_packets - s.c0.tx_packets;
    let wire_bps = wire_bytes as f64 * 8.0 / dt;
    let stride = (1_000_000_000 / SAMPLE_NS) as usize;
    let per_sec: Vec<f64> = s
        .series
        .iter()
        .step_by(stride)
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|w| w[1].0 > w[0].0)
        .map(|w| (w[1].1 - w[0].1) as f64 * 8.0 / ((w[1].0 - w[0].0) as f64 / 1e9))
        .collect();
    let (clean_bps, clean_share) = stall_free_rate(&s.series, &s.stalls);
    let min_1s = per_sec.iter().copied().fold(f64::INFINITY, f64::min);
    let max_1s = per_sec.iter().copied().fold(0.0, f64::max);
    // Goodput per flow over the same window.
    let flow_goodput: Vec<f64> =
        s.b1.iter()
            .map(|(k, b1)| (b1 - s.b0.get(k).copied().unwrap_or(0)) as f64 * 8.0 / dt)
            .collect();
    let goodput_bps: f64 = flow_goodput.iter().sum();
    let hdr = match p.proto {
        Proto::Tcp => TCP_HDR,
        Proto::Udp => UDP_HDR,
    };
    // Payload share of the frames that left (headers counted from the frames seen).
    let payload_share = if wire_bytes > 0 {
        1.0 - (wire_pkts * hdr) as f64 / wire_bytes as f64
    } else {
        0.0
    };
    // UDP loss over the whole flows.
    let (mut sent, mut lost) = (0u64, 0u64);
    for r in &finals {
        for f in &r.udp_flows {
            let s = f.sent_packets.unwrap_or(f.packets + f.lost_packets);
            sent += s;
            lost += s.saturating_sub(f.packets);
        }
    }
    let offered_bps: f64 = reports.iter().map(|r| r.summary.send_rate_bps).sum();
    let retrans: u64 = reports.iter().map(|r| r.summary.total_retrans).sum();
    // Agent counters of the point's classes (and of its level).
    let mut counters = BTreeMap::new();
    for g in &p.groups {
        let d = counter_delta(
            &agent_counters(&st0, "classes", &g.class),
            &agent_counters(&st1, "classes", &g.class),
        );
        add_counters(&mut counters, &d);
    }
    let level_counters = (p.kind == Kind::Level).then(|| {
        counter_delta(
            &agent_counters(&st0, "levels", "capped"),
            &agent_counters(&st1, "levels", "capped"),
        )
    });
    // For the level point: each class's share of the goodput.
    let class_goodput: Vec<f64> = (0..p.groups.len())
        .map(|i| {
            s.b1.iter()
                .filter(|(k, _)| k.0 == i)
                .map(|(k, b1)| (b1 - s.b0.get(k).copied().unwrap_or(0)) as f64 * 8.0 / dt)
                .sum()
        })
        .collect();
    let ratio = p.rate_bps.map(|r| wire_bps / r as f64);
    // What the datapath counted (skb->len at tc egress) against what left the interface, over
    // the whole point: below 1 when the stack hands the qdisc GSO packets (one set of headers
    // for several segments) that are segmented after it.
    let whole_bytes = whole1.tx_bytes.saturating_sub(whole0.tx_bytes) as f64;
    let whole_pkts = whole1.tx_packets.saturating_sub(whole0.tx_packets) as f64;
    // The class counters include the packets the pacer dropped: leave them out (at the mean size).
    let dp_all_pkts = counters.get("packets").copied().unwrap_or(0.0);
    let dp_drops = counters.get("dropped_horizon").copied().unwrap_or(0.0);
    let dp_pkts = dp_all_pkts - dp_drops;
    let dp_bytes = if dp_all_pkts > 0.0 {
        counters.get("bytes").copied().unwrap_or(0.0) * dp_pkts / dp_all_pkts
    } else {
        0.0
    };
    let pkts = counters.get("packets").copied().unwrap_or(0.0);
    let delayed = counters.get("delayed_packets").copied().unwrap_or(0.0);
    Ok(json!({
        "window_s": dt,
        "stalls": s.stalls,
        "stall_free_bps": clean_bps,
        "stall_free_ratio": p.rate_bps.zip(clean_bps).map(|(r, c)| c / r as f64),
        "stall_free_share": clean_share,
        "wire_bps": wire_bps,
        "wire_packets": wire_pkts,
        "mean_frame_bytes": if wire_pkts > 0 { wire_bytes as f64 / wire_pkts as f64 } else { 0.0 },
        "ratio": ratio,
        "min_1s_bps": if per_sec.is_empty() { Value::Null } else { json!(min_1s) },
        "max_1s_bps": if per_sec.is_empty() { Value::Null } else { json!(max_1s) },
        "per_second_bps": per_sec,
        "goodput_bps": goodput_bps,
        "flow_goodput_bps": flow_goodput,
        "class_goodput_bps": class_goodput,
        "jain_fairness": workload::stats::jain(&flow_goodput),
        "payload_share": payload_share,
        "offered_bps": offered_bps,
        "tcp_retrans": retrans,
        "udp_sent": sent,
        "udp_lost": lost,
        "udp_loss": if sent > 0 { lost as f64 / sent as f64 } else { 0.0 },
        "rx_socket_drops": rcvbuf1.saturating_sub(rcvbuf0),
        "qdisc_drops": qdrops1.saturating_sub(qdrops0),
        "point_wire_bytes": whole_bytes,
        "point_wire_packets": whole_pkts,
        "datapath_bytes_share": if whole_bytes > 0.0 { dp_bytes / whole_bytes } else { 0.0 },
        "datapath_packets_share": if whole_pkts > 0.0 { dp_pkts / whole_pkts } else { 0.0 },
        "agent": counters,
        "agent_level": level_counters,
        "delayed_share": if pkts > 0.0 { delayed / pkts } else { 0.0 },
        "senders": reports.iter().map(|r| json!(r.summary)).collect::<Vec<_>>(),
    }))
}

/// Runs the experiment.
/// `aggregates`: the points of `plan_aggregates` instead of the conformance plan.
pub fn run(c: &Common, aggregates: bool) -> Result<()> {
    std::fs::create_dir_all(&c.out).with_context(|| format!("create {}", c.out.display()))?;
    let (mut points, level_rate) = if aggregates {
        (plan_aggregates(), None)
    } else {
        plan(c.quick)
    };
    points.retain(|p| selected(&p.name));
    let level_rate = level_rate.filter(|_| points.iter().any(|p| p.kind == Kind::Level));
    let timing = if c.quick {
        Timing {
            warm_s: 1.5,
            window_s: 3.0,
            tail_s: 0.5,
        }
    } else {
        Timing {
            warm_s: 3.0,
            window_s: 8.0,
            tail_s: 1.0,
        }
    };
    let reps = if c.quick { 1 } else { 2 };
    let started = std::time::Instant::now();
    let bed = build_bed()?;
    let ifaces: Vec<&str> = bed.links.values().map(|(i, _)| i.as_str()).collect();
    let scratch = Scratch::new("plexp-pacing");
    let policy_text = policy(&ifaces, &points, level_rate);
    let policy_path = scratch.path("pacing.yaml");
    std::fs::write(&policy_path, &policy_text).context("write the policy")?;
    write_out(&c.out, "pacing-policy.yaml", &policy_text)?;
    eprintln!(
        "pacing: {} points x {reps} reps, {:.0} s each; kernel {}",
        points.len(),
        timing.duration_s(),
        crate::experiments::harness::kernel_release()
    );
    let agent = Agent::start(&bed.tx, &policy_path, &scratch.path("state"));
    let status = agent.status_retry()?;
    let enforcement = status["enforcement"].clone();
    let qdiscs: Vec<Value> = status["interfaces"].as_array().cloned().unwrap_or_default();
    eprintln!("pacing: agent enforcement {enforcement}");

    let mut records: Vec<Vec<Value>> = vec![Vec::new(); points.len()];
    for rep in 0..reps {
        for (i, p) in points.iter().enumerate() {
            let r = run_point(&bed, &agent, p, timing, c.seed + rep as u64)
                .with_context(|| format!("point {} (rep {rep})", p.name))?;
            eprintln!(
                "pacing: rep {rep} {:<28} wire {:>8.2} Mbit/s  ratio {}  goodput {:.2} Mbit/s  delayed {:.0}%  horizon drops {}",
                p.name,
                r["wire_bps"].as_f64().unwrap_or(0.0) / 1e6,
                r["ratio"]
                    .as_f64()
                    .map(|x| format!("{x:.4}"))
                    .unwrap_or_else(|| "-".into()),
                r["goodput_bps"].as_f64().unwrap_or(0.0) / 1e6,
                r["delayed_share"].as_f64().unwrap_or(0.0) * 100.0,
                r["agent"]["dropped_horizon"].as_f64().unwrap_or(0.0),
            );
            eprintln!(
                "pacing:       datapath counted {:.4} of the wire bytes, {:.4} of the wire packets; sent {:.2} Mbit/s; stalls {:.0} ms (max {:.0} ms)",
                r["datapath_bytes_share"].as_f64().unwrap_or(0.0),
                r["datapath_packets_share"].as_f64().unwrap_or(0.0),
                r["offered_bps"].as_f64().unwrap_or(0.0) / 1e6,
                r["stalls"]["stalled_ms"].as_f64().unwrap_or(0.0),
                r["stalls"]["max_late_ms"].as_f64().unwrap_or(0.0),
            );
            records[i].push(r);
        }
    }
    if !agent.stop_patiently() {
        eprintln!("pacing: the agent did not exit within a minute of SIGTERM");
    }
    let elapsed = started.elapsed().as_secs_f64();

    // Per point summaries.
    let mut out_points = Vec::new();
    for (p, reps_v) in points.iter().zip(&records) {
        let wire = nums(reps_v, "wire_bps");
        let ratios = nums(reps_v, "ratio");
        let sum = |k: &str| -> f64 {
            reps_v
                .iter()
                .map(|r| r["agent"][k].as_f64().unwrap_or(0.0))
                .sum::<f64>()
                + 0.0
        };
        let sf = nums(reps_v, "stall_free_ratio");
        let sf_mean = (!sf.is_empty()).then(|| mean(&sf));
        let sf_within = (!sf.is_empty()).then(|| sf.iter().all(|r| (r - 1.0).abs() <= AIM));
        let summary = json!({
            "configured_bps": p.rate_bps,
            "wire_bps": mean(&wire),
            "ratio": if ratios.is_empty() { Value::Null } else { json!(mean(&ratios)) },
            "ratio_min": ratios.iter().copied().reduce(f64::min),
            "ratio_max": ratios.iter().copied().reduce(f64::max),
            "within_aim": if ratios.is_empty() { Value::Null } else {
                json!(ratios.iter().all(|r| (r - 1.0).abs() <= AIM))
            },
            "reps_within_aim": ratios.iter().filter(|r| (*r - 1.0).abs() <= AIM).count(),
            "stall_free_ratio": sf_mean,
            "stall_free_ratio_min": sf.iter().copied().reduce(f64::min),
            "stall_free_ratio_max": sf.iter().copied().reduce(f64::max),
            "stall_free_share": mean(&nums(reps_v, "stall_free_share")),
            "stall_free_within_aim": sf_within,
            "verdict": if ratios.is_empty() { Value::Null } else {
                // The worst repetition decides.
                let worst = reps_v
                    .iter()
                    .filter_map(|r| Some((r["ratio"].as_f64()?, r)))
                    .max_by(|a, b| (a.0 - 1.0).abs().total_cmp(&(b.0 - 1.0).abs()))
                    .map(|(x, r)| {
                        let drops = r["agent"]["dropped_horizon"].as_f64().unwrap_or(0.0)
                            + r["qdisc_drops"].as_f64().unwrap_or(0.0);
                        verdict(
                            x,
                            drops,
                            r["stalls"]["stalled_ms"].as_f64().unwrap_or(0.0),
                            r["window_s"].as_f64().unwrap_or(1.0),
                        )
                    });
                json!(worst)
            },
            "qdisc_drops": sum_u(reps_v, "qdisc_drops"),
            "stalled_ms": reps_v.iter().filter_map(|r| r["stalls"]["stalled_ms"].as_f64()).sum::<f64>() + 0.0,
            "max_stall_ms": reps_v.iter().filter_map(|r| r["stalls"]["max_late_ms"].as_f64()).reduce(f64::max),
            "min_1s_bps": nums(reps_v, "min_1s_bps").into_iter().reduce(f64::min),
            "max_1s_bps": nums(reps_v, "max_1s_bps").into_iter().reduce(f64::max),
            "goodput_bps": mean(&nums(reps_v, "goodput_bps")),
            "payload_share": mean(&nums(reps_v, "payload_share")),
            "jain_fairness": mean(&nums(reps_v, "jain_fairness")),
            "offered_bps": mean(&nums(reps_v, "offered_bps")),
            "udp_offered_wire_bps": (p.proto == Proto::Udp).then(|| p.udp_offered_wire_bps()),
            "udp_loss": (p.proto == Proto::Udp).then(|| mean(&nums(reps_v, "udp_loss"))),
            "rx_socket_drops": sum_u(reps_v, "rx_socket_drops"),
            "tcp_retrans": sum_u(reps_v, "tcp_retrans"),
            "agent_packets": sum("packets"),
            "agent_delayed_packets": sum("delayed_packets"),
            "agent_delayed_share": if sum("packets") > 0.0 { sum("delayed_packets") / sum("packets") } else { 0.0 },
            "agent_mean_added_delay_us": if sum("delayed_packets") > 0.0 { sum("added_delay_seconds") / sum("delayed_packets") * 1e6 } else { 0.0 },
            "agent_horizon_drops": sum("dropped_horizon"),
            "datapath_bytes_share": mean(&nums(reps_v, "datapath_bytes_share")),
            "datapath_packets_share": mean(&nums(reps_v, "datapath_packets_share")),
        });
        out_points.push(json!({
            "kind": "pacing-point",
            "version": workload::SCHEMA_VERSION,
            "tags": {
                "point": p.name,
                "scope": p.kind.as_str(),
                "proto": p.proto.as_str(),
                "mtu": p.mtu.to_string(),
                "flows": p.flows().to_string(),
            },
            "params": {
                "classes": p.groups.iter().map(|g| json!({"class": g.class, "port": g.port, "flows": g.flows})).collect::<Vec<_>>(),
                "udp_flow_payload_bps": (p.proto == Proto::Udp).then_some(p.udp_flow_payload_bps),
                "udp_datagram_bytes": (p.proto == Proto::Udp).then(|| p.udp_payload()),
            },
            "summary": summary,
            "reps": reps_v,
        }));
    }
    let paced: Vec<&Value> = out_points
        .iter()
        .filter(|v| v["summary"]["ratio"].is_f64())
        .collect();
    let within = paced
        .iter()
        .filter(|v| v["summary"]["within_aim"] == true)
        .count();
    let worst = paced
        .iter()
        .map(|v| (v["summary"]["ratio"].as_f64().unwrap_or(0.0) - 1.0).abs())
        .fold(0.0, f64::max);
    let doc = json!({
        "kind": "pacing",
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
            "warm_s": timing.warm_s,
            "window_s": timing.window_s,
            "tail_s": timing.tail_s,
            "udp_overload": UDP_OVERLOAD,
            "aim": AIM,
            "enforcement": enforcement,
            "interfaces": qdiscs,
        },
        "summary": {
            "points": out_points.len(),
            "paced_points": paced.len(),
            "within_aim": within,
            "worst_abs_error": worst,
            "elapsed_s": elapsed,
        },
        "points": out_points,
    });
    workload::write_json(&doc, Some(&c.out.join("pacing.json")))?;
    let md = markdown(&doc, &points);
    write_out(&c.out, "pacing.md", &md)?;
    plots(&c.out, &doc)?;
    print!("{md}");
    Ok(())
}
