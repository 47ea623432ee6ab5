//! D3's metrics: each class's transfers, requests and grants (with the requested and granted
//! rates as histograms), and each router link's capacity controller.

use anyhow::Result;
use prometheus::Registry;

use paceline_common::maps::{D3_HIST_BUCKETS, D3ClassStats};

use super::{counter, igauge};
use crate::{d3router::LinkReport, status::Status};

pub(super) fn counters(r: &Registry, d3: &[D3ClassStats], status: &Status) -> Result<()> {
    let l = &["class"];
    let flows = counter(
        r,
        "paceline_d3_flows_total",
        "D3 transfers started (with or without a deadline).",
        l,
    )?;
    let dl = counter(
        r,
        "paceline_d3_deadline_flows_total",
        "D3 transfers with a deadline.",
        l,
    )?;
    let met = counter(
        r,
        "paceline_d3_deadlines_met_total",
        "Deadline transfers acknowledged in full before their deadline.",
        l,
    )?;
    let missed = counter(
        r,
        "paceline_d3_deadlines_missed_total",
        "Deadline transfers that passed their deadline unfinished.",
        l,
    )?;
    let quenched = counter(
        r,
        "paceline_d3_flows_quenched_total",
        "Flows that gave up a deadline they could no longer meet.",
        l,
    )?;
    let requests = counter(r, "paceline_d3_requests_total", "Rate requests sent.", l)?;
    let grants = counter(
        r,
        "paceline_d3_grants_total",
        "Grants received (feedback applied).",
        l,
    )?;
    let echoes = counter(
        r,
        "paceline_d3_echoes_total",
        "Feedback options this host sent as a receiver.",
        l,
    )?;
    let ignored = counter(
        r,
        "paceline_d3_feedback_ignored_total",
        "Feedback received but not applied (stale, or no D3 router on the path).",
        l,
    )?;
    for c in status.policy.classes.iter().filter(|c| c.d3) {
        let Some(v) = d3.get(c.index as usize) else {
            continue;
        };
        let lab = [c.name.as_str()];
        flows.with_label_values(&lab).inc_by(v.flows);
        dl.with_label_values(&lab).inc_by(v.deadline_flows);
        met.with_label_values(&lab).inc_by(v.met);
        missed.with_label_values(&lab).inc_by(v.missed);
        quenched.with_label_values(&lab).inc_by(v.quenched);
        requests.with_label_values(&lab).inc_by(v.requests);
        grants.with_label_values(&lab).inc_by(v.grants);
        ignored.with_label_values(&lab).inc_by(v.feedback_ignored);
    }
    // Echoes are counted on the receiving socket's class, whatever it is: every D3 class has
    // the series (0 until it echoes), other classes once they echo.
    for c in &status.policy.classes {
        if let Some(v) = d3.get(c.index as usize)
            && (v.echoes > 0 || c.d3)
        {
            echoes.with_label_values(&[c.name.as_str()]).inc_by(v.echoes);
        }
    }
    Ok(())
}

/// Requested and granted rates as Prometheus histograms (the kernel counts log2 buckets).
pub(super) fn histograms(d3: &[D3ClassStats], status: &Status) -> Vec<prometheus::proto::MetricFamily> {
    use prometheus::proto::{Bucket, Histogram, LabelPair, Metric, MetricFamily, MetricType};
    let mut out = Vec::new();
    for (name, help, pick) in [
        (
            "paceline_d3_requested_rate_bytes_per_second",
            "Rates D3 flows asked for.",
            (|s: &D3ClassStats| s.requested) as fn(&D3ClassStats) -> [u64; D3_HIST_BUCKETS],
        ),
        (
            "paceline_d3_granted_rate_bytes_per_second",
            "Rates D3 flows were granted (the path's smallest).",
            |s: &D3ClassStats| s.granted,
        ),
    ] {
        let mut fam = MetricFamily::default();
        fam.set_name(name.into());
        fam.set_help(help.into());
        fam.set_field_type(MetricType::HISTOGRAM);
        for c in status.policy.classes.iter().filter(|c| c.d3) {
            let Some(v) = d3.get(c.index as usize) else {
                continue;
            };
            let counts = pick(v);
            let mut h = Histogram::default();
            let mut cum = 0u64;
            let mut buckets = Vec::new();
            // The kernel's bucket i holds [2^(i+13), 2^(i+14)); the last one is open-ended.
            for (i, n) in counts.iter().enumerate().take(D3_HIST_BUCKETS - 1) {
                cum += n;
                let mut b = Bucket::default();
                b.set_upper_bound((1u64 << (i + 14)) as f64);
                b.set_cumulative_count(cum);
                buckets.push(b);
            }
            cum += counts[D3_HIST_BUCKETS - 1];
            h.set_bucket(buckets);
            h.set_sample_count(cum);
            // Bucket counts only: the sum is not kept in the kernel.
            h.set_sample_sum(f64::NAN);
            let mut m = Metric::default();
            let mut lp = LabelPair::default();
            lp.set_name("class".into());
            lp.set_value(c.name.clone());
            m.set_label(vec![lp]);
            m.set_histogram(h);
            fam.mut_metric().push(m);
        }
        if !fam.get_metric().is_empty() {
            out.push(fam);
        }
    }
    out
}

pub(super) fn links(r: &Registry, links: &[LinkReport]) -> Result<()> {
    if links.is_empty() {
        return Ok(());
    }
    let l = &["interface"];
    let cap = igauge(
        r,
        "paceline_d3_link_capacity_bytes_per_second",
        "C: the capacity the router hands out (moved by the controller).",
        l,
    )?;
    let line = igauge(
        r,
        "paceline_d3_link_line_rate_bytes_per_second",
        "The link's configured rate.",
        l,
    )?;
    let flows = igauge(r, "paceline_d3_link_flows", "N: flows the router counts.", l)?;
    let demand = igauge(
        r,
        "paceline_d3_link_demand_bytes_per_second",
        "D: the sum of desired rates.",
        l,
    )?;
    let alloc = igauge(
        r,
        "paceline_d3_link_allocated_bytes_per_second",
        "A: the sum of allocations.",
        l,
    )?;
    let queue = igauge(
        r,
        "paceline_d3_link_queue_bytes",
        "The link's queue at the last controller tick.",
        l,
    )?;
    let standing = igauge(
        r,
        "paceline_d3_link_standing_queue_bytes",
        "The smallest queue of the controller's recent ticks: the q it acts on.",
        l,
    )?;
    let req = counter(
        r,
        "paceline_d3_link_requests_total",
        "Rate requests processed.",
        l,
    )?;
    let clamped = counter(
        r,
        "paceline_d3_link_clamped_requests_total",
        "Requests for more than the link (or the per-flow cap): clamped.",
        l,
    )?;
    let unproc = counter(
        r,
        "paceline_d3_link_unprocessed_requests_total",
        "Requests left alone (invalid, or every slot already filled).",
        l,
    )?;
    let resets = counter(
        r,
        "paceline_d3_link_idle_resets_total",
        "Idle resets of N, D, A.",
        l,
    )?;
    let leases = counter(
        r,
        "paceline_d3_link_lease_renewals_total",
        "Lease renewals that changed N, D or A: flows that stopped asking without a FIN \
         released, or drift corrected.",
        l,
    )?;
    let short = counter(
        r,
        "paceline_d3_link_short_grants_total",
        "Requests granted at most their desired rate: no spare capacity was left.",
        l,
    )?;
    let dups = counter(
        r,
        "paceline_d3_link_duplicate_requests_total",
        "TSO/GSO copies of a request, rewritten alike and counted once.",
        l,
    )?;
    for k in links {
        let lab = [k.interface.as_str()];
        cap.with_label_values(&lab)
            .set(k.capacity_bytes_per_second as i64);
        line.with_label_values(&lab)
            .set(k.line_rate_bytes_per_second as i64);
        flows.with_label_values(&lab).set(k.flows as i64);
        demand
            .with_label_values(&lab)
            .set(k.demand_bytes_per_second as i64);
        alloc
            .with_label_values(&lab)
            .set(k.allocated_bytes_per_second as i64);
        queue.with_label_values(&lab).set(k.queue_bytes as i64);
        standing
            .with_label_values(&lab)
            .set(k.standing_queue_bytes as i64);
        req.with_label_values(&lab).inc_by(k.requests);
        clamped.with_label_values(&lab).inc_by(k.clamped);
        unproc.with_label_values(&lab).inc_by(k.unprocessed);
        resets.with_label_values(&lab).inc_by(k.idle_resets);
        leases.with_label_values(&lab).inc_by(k.lease_renewals);
        dups.with_label_values(&lab).inc_by(k.duplicates);
        short.with_label_values(&lab).inc_by(k.short_grants);
    }
    Ok(())
}
