//! Prometheus metrics, built at scrape time from the datapath's per-CPU counters (summed) and
//! the agent's status. Names carry units (`_total`, `_bytes`, `_seconds`); every name starts
//! with `paceline_`.

use anyhow::Result;
use prometheus::{CounterVec, Encoder as _, GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};

use crate::{datapath::Snapshot, status::Status};

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<IntCounterVec> {
    let c = IntCounterVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

fn fcounter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<CounterVec> {
    let c = CounterVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

fn gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<GaugeVec> {
    let g = GaugeVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

fn igauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<IntGaugeVec> {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

/// The Prometheus text exposition of `snap` labelled by `status`.
pub fn render(snap: &Snapshot, status: &Status) -> Result<String> {
    let r = Registry::new();
    let cl = &["class", "level"];
    let packets = counter(&r, "paceline_class_packets_total", "Packets classified into the class.", cl)?;
    let bytes = counter(&r, "paceline_class_bytes_total", "Bytes (skb->len) classified into the class.", cl)?;
    let delayed = counter(&r, "paceline_class_delayed_packets_total", "Packets whose departure the datapath moved later.", cl)?;
    let delay = fcounter(&r, "paceline_class_added_delay_seconds_total", "Sum of the delay the datapath added to departures, seconds.", cl)?;
    let drops = counter(&r, "paceline_class_dropped_packets_total", "Packets dropped by the datapath, by reason.", &["class", "level", "reason"])?;
    let tagged = counter(&r, "paceline_class_tagged_packets_total", "Packets whose DSCP or PCP was rewritten.", cl)?;
    let socks = counter(&r, "paceline_class_tcp_sockets_configured_total", "TCP connections the sock_ops program configured.", cl)?;
    let sockerr = counter(&r, "paceline_class_tcp_sockopt_errors_total", "Socket options the kernel refused (check the policy's TCP values).", cl)?;
    for c in &status.policy.classes {
        let Some(v) = snap.classes.get(c.index as usize) else { continue };
        let l = [c.name.as_str(), c.level.as_str()];
        packets.with_label_values(&l).inc_by(v.packets);
        bytes.with_label_values(&l).inc_by(v.bytes);
        delayed.with_label_values(&l).inc_by(v.delayed_packets);
        delay.with_label_values(&l).inc_by(v.delay_ns as f64 * 1e-9);
        drops.with_label_values(&[c.name.as_str(), c.level.as_str(), "horizon"]).inc_by(v.drops_horizon);
        tagged.with_label_values(&l).inc_by(v.tagged_packets);
        socks.with_label_values(&l).inc_by(v.tcp_sockets);
        sockerr.with_label_values(&l).inc_by(v.sockopt_errors);
    }

    let lv = &["level", "priority"];
    let lpackets = counter(&r, "paceline_level_packets_total", "Packets sent at the QJump level.", lv)?;
    let lbytes = counter(&r, "paceline_level_bytes_total", "Bytes sent at the QJump level.", lv)?;
    let ldelayed = counter(&r, "paceline_level_delayed_packets_total", "Packets of the level whose departure moved later.", lv)?;
    let ldrops = counter(&r, "paceline_level_dropped_packets_total", "Packets of the level dropped beyond the horizon.", lv)?;
    let lrate = gauge(&r, "paceline_level_rate_limit_bytes_per_second", "The level's rate limit on this host (absent when unlimited).", lv)?;
    let lepoch = gauge(&r, "paceline_level_epoch_seconds", "The level's QJump network epoch.", lv)?;
    for l in &status.policy.levels {
        let Some(v) = snap.levels.get(l.index as usize) else { continue };
        let p = l.priority.to_string();
        let lab = [l.name.as_str(), p.as_str()];
        lpackets.with_label_values(&lab).inc_by(v.packets);
        lbytes.with_label_values(&lab).inc_by(v.bytes);
        ldelayed.with_label_values(&lab).inc_by(v.delayed_packets);
        ldrops.with_label_values(&lab).inc_by(v.drops_horizon);
        if let Some(rate) = l.rate_bytes_per_second {
            lrate.with_label_values(&lab).set(rate as f64);
        }
        if let Some(e) = l.epoch_seconds {
            lepoch.with_label_values(&lab).set(e);
        }
    }

    let unparsed = counter(&r, "paceline_unparsed_packets_total", "Frames passed untouched because they could not be parsed.", &["reason"])?;
    unparsed.with_label_values(&["non_ip"]).inc_by(snap.global.non_ip);
    unparsed.with_label_values(&["truncated"]).inc_by(snap.global.truncated);
    unparsed.with_label_values(&["ipv6_extension_limit"]).inc_by(snap.global.ipv6_ext_limit);
    counter(&r, "paceline_rewrite_errors_total", "DSCP/PCP rewrites the kernel refused.", &[])?
        .with_label_values(&[] as &[&str])
        .inc_by(snap.global.rewrite_errors);

    let reloads = counter(&r, "paceline_policy_reloads_total", "Policy reloads, by result.", &["result"])?;
    reloads.with_label_values(&["applied"]).inc_by(status.reloads.applied);
    reloads.with_label_values(&["rejected"]).inc_by(status.reloads.rejected);
    let last_ok = status.reloads.last.as_ref().map(|e| e.applied).unwrap_or(true);
    igauge(&r, "paceline_policy_last_reload_success", "1 if the last reload was applied, 0 if it was rejected.", &[])?
        .with_label_values(&[] as &[&str])
        .set(last_ok as i64);
    let generation = status.policy.generation.to_string();
    igauge(&r, "paceline_policy_info", "The policy in force (value 1).", &["name", "hash", "generation"])?
        .with_label_values(&[status.policy.name.as_deref().unwrap_or(""), status.policy.hash.as_str(), generation.as_str()])
        .set(1);
    igauge(&r, "paceline_policy_loaded_timestamp_seconds", "When the policy in force was applied (unix time).", &[])?
        .with_label_values(&[] as &[&str])
        .set(status.policy.loaded_at as i64);

    let feat = igauge(&r, "paceline_kernel_feature", "Kernel features the agent found (1) or not (0).", &["feature"])?;
    let k = &status.kernel;
    for (name, on) in [
        ("tcx", k.tcx),
        ("sch_fq", k.sch_fq),
        ("sch_htb", k.sch_htb),
        ("clsact", k.clsact),
        ("btf", k.btf),
        ("cgroup2", k.cgroup2.is_some()),
    ] {
        feat.with_label_values(&[name]).set(on as i64);
    }
    igauge(&r, "paceline_enforcement_degraded", "1 when the kernel cannot enforce everything the policy asks.", &[])?
        .with_label_values(&[] as &[&str])
        .set(!status.degraded.is_empty() as i64);
    let iface = igauge(&r, "paceline_interface_info", "Managed interfaces and how they are enforced (value 1).", &["interface", "attach", "qdisc", "mode"])?;
    for i in &status.interfaces {
        let attach = serde_json::to_value(i.attach)?.as_str().unwrap_or("").to_string();
        iface
            .with_label_values(&[i.name.as_str(), attach.as_str(), i.qdisc.as_deref().unwrap_or("none"), status.enforcement.mode.as_str()])
            .set(1);
    }
    igauge(&r, "paceline_flow_table_capacity", "Entries of the per-flow LRU table.", &[])?
        .with_label_values(&[] as &[&str])
        .set(status.flow_table.capacity as i64);
    if let Some(m) = status.flow_table.memlock_bytes {
        igauge(&r, "paceline_flow_table_memory_bytes", "Kernel memory charged to the per-flow table.", &[])?
            .with_label_values(&[] as &[&str])
            .set(m as i64);
    }
    igauge(&r, "paceline_build_info", "The agent's version (value 1).", &["version"])?
        .with_label_values(&[status.version.as_str()])
        .set(1);

    let mut out = Vec::new();
    TextEncoder::new().encode(&r.gather(), &mut out)?;
    Ok(String::from_utf8(out)?)
}
