//! Prometheus metrics, built at scrape time from the datapath's per-CPU counters (summed) and
//! the agent's status. Names carry units (`_total`, `_bytes`, `_seconds`); every name starts
//! with `paceline_`.
//!
//! One module per family: the core families (classes, levels, flows, drops, delays, qdiscs,
//! the policy) here, D3's router links in `d3`, DASR's in `dasr` (appended by the caller
//! where DASR is on).

mod d3;
pub mod dasr;

use anyhow::Result;
use prometheus::{
    CounterVec, Encoder as _, GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

use paceline_common::{
    edt::delay_bucket_bound_ns,
    maps::{Counters, D3ClassStats},
};

use crate::{
    d3router::LinkReport,
    kernel::{datapath::Snapshot, qstats::RootStats},
    status::Status,
};

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

/// What the metrics take from the host rather than the datapath.
#[derive(Clone, Debug, Default)]
pub struct OpsMetrics {
    /// Each managed interface's root qdisc statistics.
    pub qdiscs: Vec<(String, RootStats)>,
    /// Interfaces attached and detached since the start (`interfaces: [auto]` following the
    /// routes).
    pub interfaces_attached: u64,
    pub interfaces_detached: u64,
    /// The policy history's generation of the policy in force.
    pub history_generation: u64,
    /// sock_ops is attached.
    pub sock_ops: bool,
    /// API requests refused for no token and for a wrong one (`None`: no token file).
    pub api_refused: Option<(u64, u64)>,
    /// The maps' kernel memory (`None`: not read).
    pub kernel_memory: Option<crate::status::KernelMemory>,
}

/// The Prometheus text exposition of `snap` (and the D3 counters and router links, when D3 is
/// on) labelled by `status`.
pub fn render(
    snap: &Snapshot,
    d3: Option<&[D3ClassStats]>,
    links: &[LinkReport],
    status: &Status,
) -> Result<String> {
    render_with(snap, d3, links, status, &OpsMetrics::default())
}

/// [`render`] plus the host's side ([`OpsMetrics`]).
pub fn render_with(
    snap: &Snapshot,
    d3: Option<&[D3ClassStats]>,
    links: &[LinkReport],
    status: &Status,
    ops: &OpsMetrics,
) -> Result<String> {
    let r = Registry::new();
    let cl = &["class", "level"];
    let packets = counter(
        &r,
        "paceline_class_packets_total",
        "Packets classified into the class.",
        cl,
    )?;
    let bytes = counter(
        &r,
        "paceline_class_bytes_total",
        "Bytes (skb->len) classified into the class.",
        cl,
    )?;
    let delayed = counter(
        &r,
        "paceline_class_delayed_packets_total",
        "Packets whose departure the datapath moved later.",
        cl,
    )?;
    let delay = fcounter(
        &r,
        "paceline_class_added_delay_seconds_total",
        "Sum of the delay the datapath added to departures, seconds.",
        cl,
    )?;
    let drops = counter(
        &r,
        "paceline_class_dropped_packets_total",
        "Packets dropped by the datapath, by reason.",
        &["class", "level", "reason"],
    )?;
    let marked = counter(
        &r,
        "paceline_class_ecn_marked_packets_total",
        "Packets marked CE by the datapath instead of dropped, by reason (codel: the class's or its level's CoDel).",
        &["class", "level", "reason"],
    )?;
    let tagged = counter(
        &r,
        "paceline_class_tagged_packets_total",
        "Packets whose DSCP or PCP the classifier rewrote (TCP sockets of a DSCP level are marked by sock_ops and need none).",
        cl,
    )?;
    let socks = counter(
        &r,
        "paceline_class_tcp_sockets_configured_total",
        "TCP connections the sock_ops program configured.",
        cl,
    )?;
    let sockerr = counter(
        &r,
        "paceline_class_tcp_sockopt_errors_total",
        "Socket options the kernel refused (check the policy's TCP values).",
        cl,
    )?;
    let held = counter(
        &r,
        "paceline_class_held_packets_total",
        "Delayed packets by the clock that set their departure: flow, class or level (the binding limit).",
        &["class", "level", "clock"],
    )?;
    for c in &status.policy.classes {
        let Some(v) = snap.classes.get(c.index as usize) else {
            continue;
        };
        let l = [c.name.as_str(), c.level.as_str()];
        for (clock, n) in paceline_common::trace::HELD_BY.iter().zip(v.held_by) {
            held.with_label_values(&[c.name.as_str(), c.level.as_str(), clock])
                .inc_by(n);
        }
        packets.with_label_values(&l).inc_by(v.packets);
        bytes.with_label_values(&l).inc_by(v.bytes);
        delayed.with_label_values(&l).inc_by(v.delayed_packets);
        delay.with_label_values(&l).inc_by(v.delay_ns as f64 * 1e-9);
        drops
            .with_label_values(&[c.name.as_str(), c.level.as_str(), "horizon"])
            .inc_by(v.drops_horizon);
        drops
            .with_label_values(&[c.name.as_str(), c.level.as_str(), "codel"])
            .inc_by(v.drops_codel);
        marked
            .with_label_values(&[c.name.as_str(), c.level.as_str(), "codel"])
            .inc_by(v.marks_codel);
        tagged.with_label_values(&l).inc_by(v.tagged_packets);
        socks.with_label_values(&l).inc_by(v.tcp_sockets);
        sockerr.with_label_values(&l).inc_by(v.sockopt_errors);
    }

    let lv = &["level", "priority"];
    let lpackets = counter(
        &r,
        "paceline_level_packets_total",
        "Packets sent at the QJump level.",
        lv,
    )?;
    let lbytes = counter(
        &r,
        "paceline_level_bytes_total",
        "Bytes sent at the QJump level.",
        lv,
    )?;
    let ldelayed = counter(
        &r,
        "paceline_level_delayed_packets_total",
        "Packets of the level whose departure moved later.",
        lv,
    )?;
    let ldrops = counter(
        &r,
        "paceline_level_dropped_packets_total",
        "Packets of the level dropped, by reason (horizon: beyond the horizon; codel: by the level's or the class's CoDel).",
        &["level", "priority", "reason"],
    )?;
    let lmarked = counter(
        &r,
        "paceline_level_ecn_marked_packets_total",
        "Packets of the level marked CE instead of dropped, by reason (codel).",
        &["level", "priority", "reason"],
    )?;
    let lrate = gauge(
        &r,
        "paceline_level_rate_limit_bytes_per_second",
        "The level's rate limit on this host (absent when unlimited).",
        lv,
    )?;
    let lepoch = gauge(
        &r,
        "paceline_level_epoch_seconds",
        "The level's QJump network epoch.",
        lv,
    )?;
    let lheld = counter(
        &r,
        "paceline_level_held_packets_total",
        "Delayed packets of the level by the clock that set their departure: flow, class or level.",
        &["level", "priority", "clock"],
    )?;
    for l in &status.policy.levels {
        let Some(v) = snap.levels.get(l.index as usize) else {
            continue;
        };
        let p = l.priority.to_string();
        let lab = [l.name.as_str(), p.as_str()];
        for (clock, n) in paceline_common::trace::HELD_BY.iter().zip(v.held_by) {
            lheld
                .with_label_values(&[l.name.as_str(), p.as_str(), clock])
                .inc_by(n);
        }
        lpackets.with_label_values(&lab).inc_by(v.packets);
        lbytes.with_label_values(&lab).inc_by(v.bytes);
        ldelayed.with_label_values(&lab).inc_by(v.delayed_packets);
        ldrops
            .with_label_values(&[l.name.as_str(), p.as_str(), "horizon"])
            .inc_by(v.drops_horizon);
        ldrops
            .with_label_values(&[l.name.as_str(), p.as_str(), "codel"])
            .inc_by(v.drops_codel);
        lmarked
            .with_label_values(&[l.name.as_str(), p.as_str(), "codel"])
            .inc_by(v.marks_codel);
        if let Some(rate) = l.rate_bytes_per_second {
            lrate.with_label_values(&lab).set(rate as f64);
        }
        if let Some(e) = l.epoch_seconds {
            lepoch.with_label_values(&lab).set(e);
        }
    }

    let unparsed = counter(
        &r,
        "paceline_unparsed_packets_total",
        "Frames passed untouched because they could not be parsed.",
        &["reason"],
    )?;
    unparsed.with_label_values(&["non_ip"]).inc_by(snap.global.non_ip);
    unparsed
        .with_label_values(&["truncated"])
        .inc_by(snap.global.truncated);
    unparsed
        .with_label_values(&["ipv6_extension_limit"])
        .inc_by(snap.global.ipv6_ext_limit);
    unparsed
        .with_label_values(&["malformed"])
        .inc_by(snap.global.malformed);
    counter(
        &r,
        "paceline_rewrite_errors_total",
        "DSCP/PCP rewrites the kernel refused.",
        &[],
    )?
    .with_label_values(&[] as &[&str])
    .inc_by(snap.global.rewrite_errors);

    let reloads = counter(
        &r,
        "paceline_policy_reloads_total",
        "Policy reloads, by result.",
        &["result"],
    )?;
    reloads
        .with_label_values(&["applied"])
        .inc_by(status.reloads.applied);
    reloads
        .with_label_values(&["rejected"])
        .inc_by(status.reloads.rejected);
    let last_ok = status.reloads.last.as_ref().map(|e| e.applied).unwrap_or(true);
    igauge(
        &r,
        "paceline_policy_last_reload_success",
        "1 if the last reload was applied, 0 if it was rejected.",
        &[],
    )?
    .with_label_values(&[] as &[&str])
    .set(last_ok as i64);
    let generation = status.policy.generation.to_string();
    igauge(
        &r,
        "paceline_policy_info",
        "The policy in force (value 1).",
        &["name", "hash", "generation"],
    )?
    .with_label_values(&[
        status.policy.name.as_deref().unwrap_or(""),
        status.policy.hash.as_str(),
        generation.as_str(),
    ])
    .set(1);
    gauge(
        &r,
        "paceline_policy_apply_seconds",
        "How long applying the policy in force took: compiling it and writing it into the datapath.",
        &[],
    )?
    .with_label_values(&[] as &[&str])
    .set(status.policy.apply_seconds);
    igauge(
        &r,
        "paceline_policy_rules",
        "Rules of the policy in force, after address lists are expanded.",
        &[],
    )?
    .with_label_values(&[] as &[&str])
    .set(status.policy.classifier.rules as i64);
    igauge(
        &r,
        "paceline_policy_classifier_bytes",
        "Kernel memory of the compiled classifier's maps (estimated).",
        &[],
    )?
    .with_label_values(&[] as &[&str])
    .set(status.policy.classifier.kernel_bytes as i64);
    igauge(
        &r,
        "paceline_policy_loaded_timestamp_seconds",
        "When the policy in force was applied (unix time).",
        &[],
    )?
    .with_label_values(&[] as &[&str])
    .set(status.policy.loaded_at as i64);

    let feat = igauge(
        &r,
        "paceline_kernel_feature",
        "Kernel features the agent found (1) or not (0).",
        &["feature"],
    )?;
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
    igauge(
        &r,
        "paceline_kernel_info",
        "The running kernel's release (value 1).",
        &["release"],
    )?
    .with_label_values(&[status.kernel.kernel_release.as_str()])
    .set(1);
    igauge(
        &r,
        "paceline_enforcement_degraded",
        "1 when this host does not enforce something the policy asks for (a rate without the qdisc that enforces it, TCP settings without sock_ops); 0 when it enforces all the policy asks, e.g. always under enforcement: none.",
        &[],
    )?
    .with_label_values(&[] as &[&str])
    .set(!status.degraded.is_empty() as i64);
    let iface = igauge(
        &r,
        "paceline_interface_info",
        "Managed interfaces and how they are enforced (value 1).",
        &["interface", "attach", "qdisc", "mode"],
    )?;
    for i in &status.interfaces {
        let attach = serde_json::to_value(i.attach)?.as_str().unwrap_or("").to_string();
        iface
            .with_label_values(&[
                i.name.as_str(),
                attach.as_str(),
                i.qdisc.as_deref().unwrap_or("none"),
                status.enforcement.mode.as_str(),
            ])
            .set(1);
    }
    igauge(
        &r,
        "paceline_flow_table_capacity",
        "Entries of the per-flow LRU table.",
        &[],
    )?
    .with_label_values(&[] as &[&str])
    .set(status.flow_table.capacity as i64);
    if let Some(entries) = snap.flow_entries {
        igauge(
            &r,
            "paceline_flow_table_entries",
            "Flows in the per-flow LRU table (counted at most every 5 s).",
            &[],
        )?
        .with_label_values(&[] as &[&str])
        .set(entries as i64);
        counter(
            &r,
            "paceline_flow_table_evictions_total",
            "Flows evicted from the full per-flow table by newer ones (their next packet starts a fresh clock).",
            &[],
        )?
        .with_label_values(&[] as &[&str])
        .inc_by(snap.flow_evictions().unwrap_or(0));
    }
    counter(
        &r,
        "paceline_flow_table_inserts_total",
        "Flows the datapath entered in the per-flow table (a flow without a local TCP or connected UDP socket, on its second packet: its class and clock; none of a class that keeps nothing per flow, see spec.track_flows).",
        &[],
    )?
    .with_label_values(&[] as &[&str])
    .inc_by(snap.global.flow_inserts);
    counter(
        &r,
        "paceline_flow_first_packets_total",
        "First packets of flows without a local TCP socket, which left their clock in an admission slot instead of entering the per-flow table (far above the inserts: many one-packet flows, such as a scan or a flood).",
        &[],
    )?
    .with_label_values(&[] as &[&str])
    .inc_by(snap.global.flow_first_packets);
    for (name, help, v) in [
        (
            "paceline_trace_records_total",
            "Records `paceline trace` sessions received from the datapath.",
            snap.trace.emitted,
        ),
        (
            "paceline_trace_capped_total",
            "Packets a trace wanted but its per-second cap left out.",
            snap.trace.capped,
        ),
        (
            "paceline_trace_lost_total",
            "Trace records the ring buffer had no room for (the reader fell behind).",
            snap.trace.lost,
        ),
    ] {
        counter(&r, name, help, &[])?
            .with_label_values(&[] as &[&str])
            .inc_by(v);
    }
    igauge(
        &r,
        "paceline_trace_running",
        "1 while a `paceline trace` session has the datapath recording.",
        &[],
    )?
    .with_label_values(&[] as &[&str])
    .set(snap.tracing as i64);
    if let Some(m) = &ops.kernel_memory {
        let g = igauge(
            &r,
            "paceline_kernel_memory_bytes",
            "Kernel memory charged to the datapath's maps (memlock), by part: the per-flow table, the classifier (both banks: the fixed fast words and each bank's maps, which follow the policy's size), and the rest.",
            &["part"],
        )?;
        for (part, v) in [
            ("flow_table", m.flow_table_bytes),
            ("classifier", m.classifier_bytes),
            ("other", m.other_bytes),
        ] {
            g.with_label_values(&[part]).set(v as i64);
        }
    }
    if let Some(m) = status.flow_table.memlock_bytes {
        igauge(
            &r,
            "paceline_flow_table_memory_bytes",
            "Kernel memory charged to the per-flow table.",
            &[],
        )?
        .with_label_values(&[] as &[&str])
        .set(m as i64);
    }
    igauge(
        &r,
        "paceline_policy_history_generation",
        "The policy history's generation of the policy in force (counts across restarts; paceline policy history).",
        &[],
    )?
    .with_label_values(&[] as &[&str])
    .set(ops.history_generation as i64);
    let changes = counter(
        &r,
        "paceline_interface_changes_total",
        "Interfaces attached and detached since the start (interfaces: [auto] following the default routes).",
        &["change"],
    )?;
    changes
        .with_label_values(&["attached"])
        .inc_by(ops.interfaces_attached);
    changes
        .with_label_values(&["detached"])
        .inc_by(ops.interfaces_detached);
    igauge(
        &r,
        "paceline_sock_ops_attached",
        "1 when sock_ops is attached (TCP settings, TCP pacing, socket DSCP, D3).",
        &[],
    )?
    .with_label_values(&[] as &[&str])
    .set(ops.sock_ops as i64);
    if let Some((missing, wrong)) = ops.api_refused {
        let refused = counter(
            &r,
            "paceline_api_requests_refused_total",
            "API requests refused with 401 (--api-token-file): without a bearer token (missing) or with another one (wrong).",
            &["reason"],
        )?;
        refused.with_label_values(&["missing"]).inc_by(missing);
        refused.with_label_values(&["wrong"]).inc_by(wrong);
    }
    qdisc_metrics(&r, &ops.qdiscs)?;
    igauge(
        &r,
        "paceline_build_info",
        "The agent's version (value 1).",
        &["version"],
    )?
    .with_label_values(&[status.version.as_str()])
    .set(1);

    if let Some(d3) = d3 {
        d3::counters(&r, d3, status)?;
    }
    d3::links(&r, links)?;

    let mut families = r.gather();
    families.extend(delay_histograms(snap, status));
    if let Some(d3) = d3 {
        families.extend(d3::histograms(d3, status));
    }
    let mut out = Vec::new();
    TextEncoder::new().encode(&families, &mut out)?;
    Ok(String::from_utf8(out)?)
}

/// One added-delay histogram from the kernel's log2 buckets (`edt::delay_bucket`), in seconds.
fn delay_histogram(c: &Counters, labels: &[(&str, &str)]) -> prometheus::proto::Metric {
    use prometheus::proto::{Bucket, Histogram, LabelPair, Metric};
    let mut h = Histogram::default();
    let mut cum = 0u64;
    let mut buckets = Vec::new();
    for (i, n) in c.delay_hist.iter().enumerate() {
        cum += n;
        if let Some(bound) = delay_bucket_bound_ns(i) {
            let mut b = Bucket::default();
            b.set_upper_bound(bound as f64 * 1e-9);
            b.set_cumulative_count(cum);
            buckets.push(b);
        }
    }
    h.set_bucket(buckets);
    h.set_sample_count(cum);
    // Undelayed packets add 0: the sum of all is the sum of the delayed ones.
    h.set_sample_sum(c.delay_ns as f64 * 1e-9);
    let mut m = Metric::default();
    m.set_label(
        labels
            .iter()
            .map(|(k, v)| {
                let mut lp = LabelPair::default();
                lp.set_name((*k).into());
                lp.set_value((*v).into());
                lp
            })
            .collect(),
    );
    m.set_histogram(h);
    m
}

/// The delay pacing added, per class and per level: every packet a pacing clock applied to
/// (0 when its clocks let it leave at once), for the classes and levels that paced any.
fn delay_histograms(snap: &Snapshot, status: &Status) -> Vec<prometheus::proto::MetricFamily> {
    use prometheus::proto::{MetricFamily, MetricType};
    let paced = |c: &Counters| c.delay_hist.iter().any(|n| *n != 0);
    let family = |name: &str, help: &str, metrics: Vec<prometheus::proto::Metric>| {
        let mut fam = MetricFamily::default();
        fam.set_name(name.into());
        fam.set_help(help.into());
        fam.set_field_type(MetricType::HISTOGRAM);
        for m in metrics {
            fam.mut_metric().push(m);
        }
        fam
    };
    let classes: Vec<_> = status
        .policy
        .classes
        .iter()
        .filter_map(|c| {
            let v = snap.classes.get(c.index as usize).filter(|v| paced(v))?;
            Some(delay_histogram(v, &[("class", &c.name), ("level", &c.level)]))
        })
        .collect();
    let levels: Vec<_> = status
        .policy
        .levels
        .iter()
        .filter_map(|l| {
            let v = snap.levels.get(l.index as usize).filter(|v| paced(v))?;
            let p = l.priority.to_string();
            Some(delay_histogram(v, &[("level", &l.name), ("priority", &p)]))
        })
        .collect();
    let mut out = Vec::new();
    if !classes.is_empty() {
        out.push(family(
            "paceline_class_pacing_delay_seconds",
            "Delay pacing added to the class's packets (departure minus the later of now and the stack's timestamp), over every packet a pacing clock applied to; log2 buckets from 1.024 us, counted per CPU in the kernel.",
            classes,
        ));
    }
    if !levels.is_empty() {
        out.push(family(
            "paceline_level_pacing_delay_seconds",
            "Delay pacing added to the level's packets, over every packet a pacing clock applied to; log2 buckets from 1.024 us.",
            levels,
        ));
    }
    out
}

/// Each managed interface's root qdisc (labels `interface`, `qdisc`): what `tc -s qdisc show`
/// reports, so the queues pacing builds are visible next to the classes.
fn qdisc_metrics(r: &Registry, qdiscs: &[(String, RootStats)]) -> Result<()> {
    if qdiscs.is_empty() {
        return Ok(());
    }
    let l = &["interface", "qdisc"];
    let backlog = igauge(
        r,
        "paceline_qdisc_backlog_bytes",
        "Bytes queued in the managed interface's root qdisc.",
        l,
    )?;
    let qlen = igauge(
        r,
        "paceline_qdisc_backlog_packets",
        "Packets queued in the managed interface's root qdisc.",
        l,
    )?;
    let drops = counter(
        r,
        "paceline_qdisc_dropped_packets_total",
        "Packets the root qdisc dropped (queue full, fq's flow limit or horizon).",
        l,
    )?;
    let over = counter(
        r,
        "paceline_qdisc_overlimits_total",
        "Times the root qdisc held packets back over a limit (HTB: a class over its rate).",
        l,
    )?;
    let requeues = counter(
        r,
        "paceline_qdisc_requeues_total",
        "Packets the driver handed back to the root qdisc.",
        l,
    )?;
    let throttled = counter(
        r,
        "paceline_qdisc_throttled_total",
        "fq: times a flow was throttled until its packets' departure times (summed over the fq qdiscs).",
        l,
    )?;
    for (iface, s) in qdiscs {
        let lab = [iface.as_str(), s.kind.as_str()];
        backlog.with_label_values(&lab).set(s.backlog_bytes as i64);
        qlen.with_label_values(&lab).set(s.qlen as i64);
        drops.with_label_values(&lab).inc_by(s.drops);
        over.with_label_values(&lab).inc_by(s.overlimits);
        requeues.with_label_values(&lab).inc_by(s.requeues);
        if let Some(t) = s.throttled {
            throttled.with_label_values(&lab).inc_by(t);
        }
    }
    Ok(())
}
