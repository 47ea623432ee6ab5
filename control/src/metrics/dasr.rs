//! DASR's metric family: senders per local address, the options written and read, the shares
//! set on senders (from [`crate::dasr::report`]), appended to the agent's `/metrics`.

use anyhow::Result;
use paceline_common::dasr::{self, DasrStats, RATE_BUCKETS};
use prometheus::{
    Encoder as _, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
    proto::{Bucket, Histogram, Metric, MetricFamily, MetricType},
};

use crate::dasr::DasrReport;

/// The Prometheus text of `r` (appended to the agent's `/metrics`).
pub fn render(r: &DasrReport) -> Result<String> {
    let reg = Registry::new();
    let gauge = |name: &str, help: &str| -> Result<IntGaugeVec> {
        let g = IntGaugeVec::new(Opts::new(name, help), &["address"])?;
        reg.register(Box::new(g.clone()))?;
        Ok(g)
    };
    let senders = gauge(
        "paceline_dasr_senders",
        "N: senders currently sending to the local address (DASR receiver).",
    )?;
    let line = gauge(
        "paceline_dasr_line_rate_bytes_per_second",
        "The line rate advertised for the local address.",
    )?;
    for a in &r.addresses {
        senders
            .with_label_values(&[a.address.as_str()])
            .set(a.senders as i64);
        line.with_label_values(&[a.address.as_str()])
            .set(a.line_rate_bytes_per_second as i64);
    }
    let s = &r.stats;
    let options = IntCounterVec::new(
        Opts::new(
            "paceline_dasr_options_total",
            "DASR options: written on pure ACKs (receiver), read, malformed or truncated (ignored), without a local socket (sender), or not written for lack of room (receiver).",
        ),
        &["result"],
    )?;
    reg.register(Box::new(options.clone()))?;
    for (k, v) in [
        ("written", s.options_written),
        ("read", s.options_read),
        ("malformed", s.options_malformed),
        ("no_socket", s.options_no_socket),
        ("no_room", s.options_no_room),
    ] {
        options.with_label_values(&[k]).inc_by(v);
    }
    for (name, help, v) in [
        (
            "paceline_dasr_data_segments_total",
            "Data segments the receiver counted.",
            s.data_segments,
        ),
        (
            "paceline_dasr_epochs_total",
            "Counting epochs started (all local addresses).",
            s.epochs,
        ),
        (
            "paceline_dasr_rates_set_total",
            "Shares set on sending sockets (each change).",
            s.rates_set,
        ),
        (
            "paceline_dasr_pacing_updates_total",
            "SO_MAX_PACING_RATE updates that followed a share.",
            s.pacing_updates,
        ),
        (
            "paceline_dasr_stale_resets_total",
            "Shares dropped because the receiver stopped repeating them.",
            s.stale_resets,
        ),
        (
            "paceline_dasr_sockopt_errors_total",
            "SO_MAX_PACING_RATE updates the kernel refused.",
            s.sockopt_errors,
        ),
    ] {
        let c = IntCounterVec::new(Opts::new(name, help), &[] as &[&str])?;
        reg.register(Box::new(c.clone()))?;
        c.with_label_values(&[] as &[&str]).inc_by(v);
    }
    let mut families = reg.gather();
    families.push(rate_histogram(s));
    let mut out = Vec::new();
    TextEncoder::new().encode(&families, &mut out)?;
    Ok(String::from_utf8(out)?)
}

/// The shares set on senders as a Prometheus histogram (the kernel counts log2 buckets).
fn rate_histogram(s: &DasrStats) -> MetricFamily {
    let mut fam = MetricFamily::default();
    fam.set_name("paceline_dasr_share_bytes_per_second".into());
    fam.set_help("Shares (line / N) set on sending sockets.".into());
    fam.set_field_type(MetricType::HISTOGRAM);
    let mut h = Histogram::default();
    let mut cum = 0u64;
    let mut buckets = Vec::new();
    for (i, n) in s.rate_hist.iter().enumerate().take(RATE_BUCKETS - 1) {
        cum += n;
        let mut b = Bucket::default();
        b.set_upper_bound(dasr::bucket_upper(i) as f64);
        b.set_cumulative_count(cum);
        buckets.push(b);
    }
    cum += s.rate_hist[RATE_BUCKETS - 1];
    h.set_bucket(buckets);
    h.set_sample_count(cum);
    // Bucket counts only: the sum is not kept in the kernel.
    h.set_sample_sum(f64::NAN);
    let mut m = Metric::default();
    m.set_histogram(h);
    fam.mut_metric().push(m);
    fam
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dasr::one_address_report;

    #[test]
    fn metrics_name_every_counter_and_the_histogram() {
        let mut stats = DasrStats {
            options_written: 5,
            ..Default::default()
        };
        stats.rate_hist[4] = 3;
        let r = one_address_report(stats);
        let text = render(&r).unwrap();
        assert!(
            text.contains("paceline_dasr_senders{address=\"10.0.0.2\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("paceline_dasr_options_total{result=\"written\"} 5"),
            "{text}"
        );
        assert!(
            text.contains("paceline_dasr_share_bytes_per_second_bucket{le=\"2097152\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("paceline_dasr_share_bytes_per_second_count 3"),
            "{text}"
        );
    }
}
