//! Delay quantiles from the agent's histogram, and the table.

use crate::experiments::{Common, Document};
use anyhow::Result;
use serde_json::Value;
use std::path::Path;

use super::*;

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

pub(crate) fn fmt_ms(v: &Value) -> String {
    v.as_f64().map_or("-".into(), |s| format!("<= {:.1} ms", s * 1e3))
}

pub(crate) fn write_outputs(
    out: &Path,
    cfg: &Config,
    c: &Common,
    env: &Value,
    points: &[Value],
    complete: bool,
    elapsed_s: f64,
) -> Result<()> {
    Document::new(NAME, c, cfg, env, points, complete, elapsed_s).write(out)?;
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
}
