//! N* (where pacing stops helping), the table and the plots, from the points.

use crate::experiments::{Common, Document};
use crate::report::{self, PlotOpts, XySeries};
use anyhow::Result;
use serde_json::{Value, json};
use std::path::Path;

use super::*;

/// N* of one paced mode against unpaced for `metric` (lower is better), with the ratios
/// unpaced/paced at every N. Pacing "helps" at N when `unpaced >= (1 + TOLERANCE) * paced`;
/// N* is the smallest N at which it no longer does, after it helped at some smaller N.
pub(crate) fn n_star(points: &[Value], buf: u32, mode: Mode, metric: &str) -> (NStar, Vec<(u64, f64)>) {
    let get = |m: Mode, n: u64| {
        points.iter().find_map(|p| {
            (p["tags"]["mode"] == m.name()
                && p["tags"]["buffer_pkts"] == *buf.to_string()
                && p["tags"]["flows"] == *n.to_string())
            .then(|| p["summary"][metric].as_f64())
            .flatten()
        })
    };
    let mut ns: Vec<u64> = points
        .iter()
        .filter(|p| p["tags"]["buffer_pkts"] == *buf.to_string())
        .filter_map(|p| p["tags"]["flows"].as_str().and_then(|s| s.parse().ok()))
        .collect();
    ns.sort_unstable();
    ns.dedup();
    let mut ratios = Vec::new();
    for n in ns {
        if let (Some(u), Some(p)) = (get(Mode::Unpaced, n), get(mode, n))
            && p > 0.0
        {
            ratios.push((n, u / p));
        }
    }
    let helps = |r: f64| r >= 1.0 + TOLERANCE;
    let star = match ratios.iter().position(|&(_, r)| helps(r)) {
        None => NStar::NeverHelped,
        Some(i) => match ratios[i + 1..].iter().find(|&&(_, r)| !helps(r)) {
            Some(&(n, _)) => NStar::At(n),
            None => NStar::Beyond,
        },
    };
    (star, ratios)
}

/// Where pacing stopped helping.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum NStar {
    /// At this N (after helping at a smaller one).
    At(u64),
    /// Helped at every N from the first one where it helped up to the largest measured.
    Beyond,
    /// Never better by more than the tolerance.
    NeverHelped,
}

impl NStar {
    pub(crate) fn json(self) -> Value {
        match self {
            NStar::At(n) => json!(n),
            NStar::Beyond => json!("beyond"),
            NStar::NeverHelped => json!("never-helped"),
        }
    }
    pub(crate) fn text(self, max_n: usize) -> String {
        match self {
            NStar::At(n) => n.to_string(),
            NStar::Beyond => format!("> {max_n}"),
            NStar::NeverHelped => "never helped".into(),
        }
    }
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
    let max_n = cfg.flows.iter().max().copied().unwrap_or(0);
    let mut stars = Vec::new();
    for &buf in &cfg.buffers_pkts {
        for mode in [Mode::PerFlow, Mode::PerHost] {
            for metric in ["p99_fct_s", "mean_fct_s"] {
                let (s, ratios) = n_star(points, buf, mode, metric);
                stars.push(json!({
                    "buffer_pkts": buf,
                    "mode": mode.name(),
                    "metric": metric,
                    "n_star": s.json(),
                    "n_star_text": s.text(max_n),
                    "unpaced_over_paced": ratios,
                }));
            }
        }
    }
    Document::new(NAME, c, cfg, env, points, complete, elapsed_s)
        .with("n_star_definition", format!(
            "pacing helps at N when the unpaced value >= (1 + {TOLERANCE}) x the paced value (FCT: lower is better); N* is the smallest measured N at which pacing no longer helps, after it helped at a smaller N; \"beyond\": it helped from then on up to N = {max_n}; \"never-helped\": it helped at no N"
        ))
        .with("n_star", &stars)
        .write(out)?;
    std::fs::write(
        out.join(format!("{NAME}.md")),
        markdown(cfg, env, points, &stars, complete, elapsed_s),
    )?;
    for &buf in &cfg.buffers_pkts {
        let sel: Vec<(String, Value)> = points
            .iter()
            .filter(|p| p["tags"]["buffer_pkts"] == *buf.to_string())
            .map(|p| (String::new(), p.clone()))
            .collect();
        if sel.is_empty() {
            continue;
        }
        let series = |path: &str, scale: f64| -> Vec<XySeries> {
            let mut v = report::xy_series(&sel, "/tags/flows", path, Some("/tags/mode"));
            for s in &mut v {
                for p in &mut s.points {
                    p.1 *= scale;
                }
            }
            v
        };
        let bdp = env["bdp_frames"].as_f64().unwrap_or(0.0);
        let sub = format!(
            "buffer {buf} pkts ({:.0}% BDP), {} Mbit/s",
            buf as f64 / bdp.max(1e-9) * 100.0,
            cfg.rate_bps / 1_000_000
        );
        for (file, title, y, path, scale) in [
            (
                "p99-fct",
                "99th-percentile FCT",
                "p99 FCT (s)",
                "/summary/p99_fct_s",
                1.0,
            ),
            ("mean-fct", "mean FCT", "mean FCT (s)", "/summary/mean_fct_s", 1.0),
            (
                "utilisation",
                "bottleneck utilisation",
                "utilisation (%)",
                "/summary/utilisation",
                100.0,
            ),
            (
                "drops",
                "bottleneck drop rate",
                "drops (% of packets)",
                "/summary/drop_rate",
                100.0,
            ),
        ] {
            let opts =
                PlotOpts::new(&format!("{title} vs N, {sub}"), "concurrent flows N (log)", y).log_x(true);
            report::xy_plot(
                &out.join(format!("{NAME}-{file}-b{buf}.svg")),
                &opts,
                &series(path, scale),
            )?;
        }
    }
    Ok(())
}

pub(crate) fn markdown(
    cfg: &Config,
    env: &Value,
    points: &[Value],
    stars: &[Value],
    complete: bool,
    elapsed_s: f64,
) -> String {
    use report::fmt_num;
    let f = |v: &Value| v.as_f64().map(fmt_num).unwrap_or_default();
    let pct = |v: &Value| {
        v.as_f64()
            .map(|x| format!("{:.1}", x * 100.0))
            .unwrap_or_default()
    };
    let pct2 = |v: &Value| {
        v.as_f64()
            .map(|x| format!("{:.2}", x * 100.0))
            .unwrap_or_default()
    };
    let s3 = |v: &Value| v.as_f64().map(|x| format!("{x:.3}")).unwrap_or_default();
    let mut md = String::new();
    md.push_str(&format!(
        "# Pacing study (seed 001)\n\n{}Kernel {} ({}), agent enforcement `{}`. Bottleneck {} Mbit/s ({}) on the router; \
         RTT {:.2} ms (netem delay on the ACK path: {} ms), BDP {:.0} frames; {} senders per mode; flows of {} bytes; \
         at least {} flows per point; pacing at {}x the fair share. Calibration: the bottleneck dequeued {:.1}% of its rate \
         under a UDP overload. Run took {:.0} s.\n\n",
        if complete { "" } else { "**Incomplete run (partial results).** " },
        env["kernel"].as_str().unwrap_or("?"),
        if env["in_vm"].as_bool().unwrap_or(false) { "VM" } else { "host" },
        env["agent_enforcement"].as_str().unwrap_or("?"),
        cfg.rate_bps as f64 / 1e6,
        match cfg.shaper.as_str() {
            "netem" => "netem rate, buffer = netem limit in packets".to_string(),
            _ => format!(
                "HTB + bfifo, buffer = bfifo limit of N x 1514 bytes, burst {}",
                cfg.htb_burst_bytes.map(|b| format!("{b} B")).unwrap_or_else(|| "tc default".into())
            ),
        },
        env["rtt_ms_median"].as_f64().unwrap_or(0.0),
        env["netem_delay_ms"].as_f64().map(|d| d.to_string()).unwrap_or_else(|| "none".into()),
        env["bdp_frames"].as_f64().unwrap_or(0.0),
        cfg.senders,
        cfg.flow_bytes,
        cfg.samples,
        cfg.pace_fraction,
        env["calibration"]["dequeued_over_rate"].as_f64().unwrap_or(f64::NAN) * 100.0,
        elapsed_s,
    ));
    let headers: Vec<String> = [
        "buffer (pkts)",
        "N",
        "mode",
        "util %",
        "drop %",
        "mean FCT s",
        "p99 FCT s",
        "max FCT s",
        "ideal s",
        "p99/ideal",
        "retrans/flow",
        "host drops",
        "flows",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|p| {
            let s = &p["summary"];
            vec![
                p["tags"]["buffer_pkts"].as_str().unwrap_or("").to_string(),
                p["tags"]["flows"].as_str().unwrap_or("").to_string(),
                p["tags"]["mode"].as_str().unwrap_or("").to_string(),
                pct(&s["utilisation"]),
                pct2(&s["drop_rate"]),
                s3(&s["mean_fct_s"]),
                s3(&s["p99_fct_s"]),
                s3(&s["max_fct_s"]),
                s3(&s["ideal_fct_s"]),
                f(&s["p99_slowdown"]),
                f(&s["retrans_per_flow"]),
                format!(
                    "{}",
                    s["host_qdisc_drops"].as_u64().unwrap_or(0)
                        + s["agent"]["dropped_horizon"].as_u64().unwrap_or(0)
                ),
                format!(
                    "{}{}",
                    s["flows_completed"],
                    match s["flows_failed"].as_u64() {
                        Some(0) | None => String::new(),
                        Some(k) => format!(" ({k} failed)"),
                    }
                ),
            ]
        })
        .collect();
    md.push_str(&report::markdown_table(&headers, &rows));
    md.push_str(
        "\nutil: bytes dequeued by the bottleneck / (rate x active time); drop: bottleneck drops / packets offered; \
         FCT: connect to the receiver's acknowledgement of the last byte; ideal: N flows' payload at the full rate; \
         host drops: drops at the senders' qdiscs plus the agents' horizon drops.\n\n## Point of inflection N*\n\n",
    );
    let headers: Vec<String> = [
        "buffer (pkts)",
        "paced mode",
        "metric",
        "N*",
        "unpaced/paced at each N",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let max_n = cfg.flows.iter().max().copied().unwrap_or(0);
    let rows: Vec<Vec<String>> = stars
        .iter()
        .map(|s| {
            let ratios = s["unpaced_over_paced"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|x| format!("{}: {:.2}", x[0], x[1].as_f64().unwrap_or(0.0)))
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            vec![
                s["buffer_pkts"].to_string(),
                s["mode"].as_str().unwrap_or("").to_string(),
                s["metric"].as_str().unwrap_or("").to_string(),
                s["n_star_text"].as_str().unwrap_or("").to_string(),
                ratios,
            ]
        })
        .collect();
    md.push_str(&report::markdown_table(&headers, &rows));
    md.push_str(&format!(
        "\nPacing helps at N when unpaced >= (1 + {TOLERANCE}) x paced (ratios above {:.2} in the last column). \
         N*: the smallest measured N at which it no longer helps, after it helped at a smaller N \
         (\"> {max_n}\": it helped up to the largest N measured).\n",
        1.0 + TOLERANCE
    ));
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Points of one buffer: the metric of each mode at each N.
    fn points(buf: u32, rows: &[(u64, f64, f64)]) -> Vec<Value> {
        let mut v = Vec::new();
        for &(n, unpaced, paced) in rows {
            for (mode, x) in [(Mode::Unpaced, unpaced), (Mode::PerFlow, paced)] {
                v.push(json!({
                    "tags": {"mode": mode.name(), "flows": n.to_string(), "buffer_pkts": buf.to_string()},
                    "summary": {"p99_fct_s": x},
                }));
            }
        }
        v
    }

    /// N* is the first N at which pacing stops beating unpaced by the tolerance, after it did
    /// at a smaller N; other buffers' points do not count.
    #[test]
    fn n_star_is_where_pacing_stops_helping() {
        let mut p = points(4, &[(1, 3.0, 1.0), (4, 2.0, 1.0), (8, 1.02, 1.0), (16, 2.0, 1.0)]);
        p.extend(points(16, &[(8, 5.0, 1.0)]));
        let (star, ratios) = n_star(&p, 4, Mode::PerFlow, "p99_fct_s");
        assert_eq!(star, NStar::At(8));
        assert_eq!(ratios.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1, 4, 8, 16]);
        assert!((ratios[0].1 - 3.0).abs() < 1e-12);
        // Helping from the second N on, up to the last: beyond the range.
        let p = points(4, &[(1, 1.0, 1.0), (4, 1.5, 1.0), (8, 1.2, 1.0)]);
        assert_eq!(n_star(&p, 4, Mode::PerFlow, "p99_fct_s").0, NStar::Beyond);
        assert_eq!(NStar::Beyond.text(8), "> 8");
        // Within the tolerance everywhere (or worse): never helped.
        let p = points(4, &[(1, 1.0 + TOLERANCE / 2.0, 1.0), (4, 0.5, 1.0)]);
        assert_eq!(n_star(&p, 4, Mode::PerFlow, "p99_fct_s").0, NStar::NeverHelped);
        // No paced point of that mode: nothing to compare.
        assert_eq!(
            n_star(&p, 4, Mode::PerHost, "p99_fct_s"),
            (NStar::NeverHelped, vec![])
        );
    }
}
