//! The results as tables, supported N and plots, from the points in their JSON shape.

use crate::experiments::{Common, Document};
use crate::report::{self, PlotOpts, XySeries};
use anyhow::Result;
use serde_json::{Value, json};
use std::path::Path;

use super::*;

/// z of a 95% interval.
pub(crate) const Z95: f64 = 1.959964;

/// Wilson score interval of `k` successes in `n`.
pub(crate) fn wilson(k: u64, n: u64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let (k, n) = (k as f64, n as f64);
    let p = k / n;
    let z2 = Z95 * Z95;
    let den = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / den;
    let half = Z95 * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / den;
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// Name of the computed upper bound.
pub(crate) const IDEAL: &str = "ideal";

/// The series of tables and plots: the measured modes, then the computed upper bound.
pub(crate) fn series_names(cfg: &Config) -> Vec<String> {
    let mut v: Vec<String> = cfg.modes.iter().map(|m| m.name.clone()).collect();
    v.push(IDEAL.into());
    v
}

/// App throughput of (mode, mean) at each N, sorted by N.
pub(crate) fn curve(points: &[Value], mode: &str, mean: f64) -> Vec<(usize, f64, u64)> {
    let mut v: Vec<(usize, f64, u64)> = points
        .iter()
        .filter(|p| {
            p["tags"]["mode"] == mode
                && p["tags"]["deadline_mean_ms"] == fmt_mean(mean).as_str()
                && p.get("error").is_none()
        })
        .filter_map(|p| {
            Some((
                p["tags"]["senders"].as_str()?.parse().ok()?,
                p["summary"]["app_throughput"].as_f64()?,
                p["summary"]["responses"].as_u64()?,
            ))
        })
        .collect();
    v.sort_by_key(|x| x.0);
    v
}

/// The largest measured N such that every measured N up to it reaches `thr` (0: not even the
/// smallest), whether every measured N reached it, and the crossing interpolated linearly
/// between the last N that reached it and the first that did not.
pub(crate) fn supported(curve: &[(usize, f64, u64)], thr: f64) -> (usize, bool, Option<f64>) {
    let mut last = 0usize;
    let mut last_v = None;
    for &(n, v, _) in curve {
        if v >= thr {
            last = n;
            last_v = Some(v);
        } else {
            let interp = match last_v {
                Some(a) if a > v => Some(last as f64 + (a - thr) / (a - v) * (n - last) as f64),
                _ => None,
            };
            return (last, false, interp);
        }
    }
    (last, !curve.is_empty(), None)
}

pub(crate) fn supported_text(s: (usize, bool, Option<f64>), smallest: usize, largest: usize) -> String {
    match s {
        (0, _, _) => format!("< {smallest}"),
        (n, true, _) if n == largest => format!(">= {n}"),
        (n, _, Some(x)) => format!("{n} (~{x:.1})"),
        (n, _, None) => n.to_string(),
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn write_outputs(
    out: &Path,
    cfg: &Config,
    c: &Common,
    env: &Value,
    points: &[Value],
    measurements: &[Value],
    complete: bool,
    elapsed_s: f64,
) -> Result<()> {
    let smallest = cfg.senders.iter().min().copied().unwrap_or(0);
    let largest = cfg.senders.iter().max().copied().unwrap_or(0);
    let mut support = Vec::new();
    for m in series_names(cfg) {
        for &mean in &cfg.deadline_means_ms {
            let cv = curve(points, &m, mean);
            if cv.is_empty() {
                continue;
            }
            let mut row = json!({"mode": m, "deadline_mean_ms": mean});
            for (k, thr) in [("99", 0.99), ("95", 0.95)] {
                let s = supported(&cv, thr);
                row[format!("n_at_{k}")] = json!(s.0);
                row[format!("n_at_{k}_all_measured")] = json!(s.1);
                row[format!("n_at_{k}_interpolated")] = json!(s.2);
                row[format!("n_at_{k}_text")] = json!(supported_text(s, smallest, largest));
            }
            support.push(row);
        }
    }
    Document::new(NAME, c, cfg, env, points, complete, elapsed_s)
        .with("supported_definition", "n_at_99 / n_at_95: the largest measured N such that app throughput >= 99% / 95% at every measured N up to it (0: not at the smallest N); interpolated: linear crossing between that N and the next measured one")
        .with("supported", &support)
        .with("measurements", measurements)
        .write(out)?;
    // The figures a document quotes, small enough to commit beside it: each point's tags and
    // summary (no per-response records or timelines), the supported-N table, the setup.
    let summary: Vec<Value> = points
        .iter()
        .map(|p| {
            let mut p = p.clone();
            if let Some(o) = p.as_object_mut() {
                o.remove("missed");
                if let Some(t) = o.get_mut("timeline").and_then(|t| t.as_object_mut()) {
                    t.remove("responses");
                }
            }
            p
        })
        .collect();
    std::fs::write(
        out.join(format!("{NAME}-summary.json")),
        serde_json::to_string_pretty(&json!({
            "kind": NAME,
            "complete": complete,
            "elapsed_s": elapsed_s,
            "seed": c.seed,
            "config": cfg,
            "environment": env,
            "results": summary,
            "supported": support,
        }))?,
    )?;
    std::fs::write(
        out.join(format!("{NAME}.md")),
        markdown(cfg, env, points, &support, complete, elapsed_s),
    )?;
    for &mean in &cfg.deadline_means_ms {
        let series: Vec<XySeries> = series_names(cfg)
            .into_iter()
            .map(|m| XySeries {
                points: curve(points, &m, mean)
                    .iter()
                    .map(|&(n, v, _)| (n as f64, v * 100.0))
                    .collect(),
                name: if m == IDEAL {
                    "ideal (optimal schedule, no latency)".into()
                } else {
                    m
                },
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        if series.is_empty() {
            continue;
        }
        let mut opts = PlotOpts::new(
            &format!(
                "D3 evaluation: application throughput, deadlines exp. mean {mean} ms, {} Mbit/s, {} KB",
                cfg.rate_bps / 1_000_000,
                cfg.buffer_bytes / 1000
            ),
            "concurrent senders N",
            "application throughput (% of responses meeting their deadline)",
        );
        opts.y_from_zero = false;
        // The main comparison; the variants (persistent connections, small TSO) in their own plot.
        let is_main = |name: &str| {
            name.starts_with("ideal")
                || cfg
                    .modes
                    .iter()
                    .any(|m| m.name == name && m.conn == Conn::Fresh && m.tso_rtt_log.is_none())
        };
        let main: Vec<XySeries> = series.iter().filter(|s| is_main(&s.name)).cloned().collect();
        report::xy_plot(
            &out.join(format!("{NAME}-{}ms.svg", fmt_mean(mean))),
            &opts,
            &main,
        )?;
        if mean == cfg.plot_mean_ms {
            report::xy_plot(&out.join(format!("{NAME}.svg")), &opts, &main)?;
            if main.len() < series.len() {
                let mut o = opts.clone();
                o.title = format!("D3 evaluation, variants: deadlines exp. mean {mean} ms");
                report::xy_plot(&out.join(format!("{NAME}-variants.svg")), &o, &series)?;
            }
        }
    }
    Ok(())
}

pub(crate) fn markdown(
    cfg: &Config,
    env: &Value,
    points: &[Value],
    support: &[Value],
    complete: bool,
    elapsed_s: f64,
) -> String {
    use std::fmt::Write as _;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# D3 evaluation (the D3 paper, section 6.1): application throughput vs concurrent senders\n\n{}Kernel {} ({}; sch_fq {}), {} CPUs. \
         Bottleneck {} Mbit/s with a {} B buffer (HTB + bfifo; QJump: strict-priority port, {} B per used queue); {} sender hosts, workers round-robin; \
         responses uniform in [{}, {}] B, deadlines exponential; RTT {:.3} ms idle. Load average at start {} ({} qemu processes), at end {} ({}). Run took {:.0} s.\n",
        if complete {
            ""
        } else {
            "**Incomplete run (partial results).** "
        },
        env["kernel"].as_str().unwrap_or("?"),
        if env["in_vm"].as_bool().unwrap_or(false) {
            "VM"
        } else {
            "host"
        },
        if env["sch_fq_available"].as_bool().unwrap_or(false) {
            "available"
        } else {
            "not available"
        },
        env["cpus"],
        cfg.rate_bps / 1_000_000,
        cfg.buffer_bytes,
        cfg.buffer_bytes / 2,
        cfg.sender_hosts,
        cfg.size_min,
        cfg.size_max,
        env["rtt_ms_median"].as_f64().unwrap_or(0.0),
        env["load_at_start"].as_str().unwrap_or("?"),
        env["qemu_processes_at_start"],
        env["load_at_end"].as_str().unwrap_or("?"),
        env["qemu_processes_at_end"],
        elapsed_s,
    );
    if cfg.background_flows > 0 {
        let _ = writeln!(
            md,
            "{} long background flows from the sender hosts to the aggregator during every point (D3 modes: D3 flows without a deadline; others: plain TCP). The details' `bottleneck_mbit` is everything the bottleneck sent.\n",
            cfg.background_flows
        );
    }
    let _ = writeln!(
        md,
        "Modes, with the enforcement each used (the sender agents' status `enforcement`):\n"
    );
    for m in &cfg.modes {
        let e = &env["enforcement"][&m.name];
        let what = match &m.kind {
            Kind::Tcp if m.paper_recovery => {
                "TCP as in the paper: cubic, no agent, RACK and tail-loss probes off on the senders"
                    .to_string()
            }
            Kind::Tcp => "plain TCP (cubic), no agent on the senders".to_string(),
            Kind::Paced => format!(
                "per-flow pacing at the fair share {} Mbit/s / N",
                cfg.rate_bps / 1_000_000
            ),
            Kind::Qjump => format!(
                "QJump levels: responses with a deadline below the median (mean x ln 2) at the top level (factor {}, DSCP 46, switch queue 5), the rest at the lowest (queue 0)",
                cfg.qjump_factor
            ),
            Kind::D3 {
                first_rtt_rate,
                initial_window,
            } => format!(
                "D3, first-RTT rate {}, initial window {}",
                first_rtt_rate
                    .map(|r| format!("{} Mbit/s", r * 8 / 1_000_000))
                    .unwrap_or_else(|| "default (one segment per RTT until the grant)".into()),
                initial_window
                    .map(|w| format!("{w} segments"))
                    .unwrap_or_else(|| "default (2 segments)".into())
            ),
        };
        let _ = writeln!(
            md,
            "- `{}` ({what}; {} connections{}): {}",
            m.name,
            match m.conn {
                Conn::Fresh => "fresh",
                Conn::Persistent => "persistent",
            },
            m.tso_rtt_log
                .map(|v| format!("; senders' tcp_tso_rtt_log = {v}"))
                .unwrap_or_default(),
            if e.is_null() {
                "-".to_string()
            } else {
                format!(
                    "mode `{}`, TCP flows: {}{}",
                    e["mode"].as_str().unwrap_or("?"),
                    e["tcp_flows"].as_str().unwrap_or("?"),
                    e["aggregates"]
                        .as_str()
                        .map(|a| format!(", aggregates: {a}"))
                        .unwrap_or_default()
                )
            }
        );
    }
    let ns: Vec<usize> = cfg.senders.clone();
    for &mean in &cfg.deadline_means_ms {
        let rows: Vec<Vec<String>> = series_names(cfg)
            .into_iter()
            .filter_map(|m| {
                let cv = curve(points, &m, mean);
                if cv.is_empty() {
                    return None;
                }
                let mut row = vec![m];
                for &n in &ns {
                    row.push(
                        cv.iter()
                            .find(|x| x.0 == n)
                            .map(|x| format!("{:.1}", x.1 * 100.0))
                            .unwrap_or_else(|| "-".into()),
                    );
                }
                Some(row)
            })
            .collect();
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(md, "\n## Application throughput (%), deadline mean {mean} ms\n");
        let mut headers = vec!["mode \\ N".to_string()];
        headers.extend(ns.iter().map(|n| n.to_string()));
        md.push_str(&report::markdown_table(&headers, &rows));
    }
    let _ = writeln!(
        md,
        "\nResponses scored per point (after {} warm-up queries):",
        cfg.warmup_queries
    );
    let counts: Vec<String> = ns
        .iter()
        .map(|&n| format!("N={n}: {}", (cfg.queries(n) - cfg.warmup_queries) * n as u64))
        .collect();
    let _ = writeln!(md, "{}.", counts.join(", "));

    let _ = writeln!(md, "\n## Senders supported\n");
    let headers = ["mode", "deadline mean (ms)", "N at >= 99%", "N at >= 95%"];
    let rows: Vec<Vec<String>> = support
        .iter()
        .map(|s| {
            vec![
                s["mode"].as_str().unwrap_or("").to_string(),
                s["deadline_mean_ms"].to_string(),
                s["n_at_99_text"].as_str().unwrap_or("").to_string(),
                s["n_at_95_text"].as_str().unwrap_or("").to_string(),
            ]
        })
        .collect();
    md.push_str(&report::markdown_table(&headers, &rows));
    let _ = writeln!(
        md,
        "\nThe largest measured N at which every measured N up to it reaches the threshold; in parentheses the crossing \
         interpolated linearly to the next measured N. `< {}`: not even the smallest N.\n",
        ns.iter().min().copied().unwrap_or(0)
    );
    // Ratios of D3 to the others: senders supported, and app throughput at each N.
    let est = |mode: &str, mean: f64, k: &str| -> Option<(f64, &'static str)> {
        let s = support
            .iter()
            .find(|s| s["mode"] == mode && s["deadline_mean_ms"].as_f64() == Some(mean))?;
        let n = s[format!("n_at_{k}")].as_u64().unwrap_or(0) as f64;
        if let Some(x) = s[format!("n_at_{k}_interpolated")].as_f64() {
            Some((x, ""))
        } else if n == 0.0 {
            Some((0.0, "<"))
        } else if s[format!("n_at_{k}_all_measured")].as_bool() == Some(true) {
            Some((n, ">="))
        } else {
            Some((n, ""))
        }
    };
    let smallest = ns.iter().min().copied().unwrap_or(0);
    let fmt_est = |e: (f64, &str)| {
        if e.1 == "<" {
            format!("< {smallest}")
        } else {
            format!("{}{:.1}", if e.1.is_empty() { "" } else { ">= " }, e.0)
        }
    };
    let mut rows = Vec::new();
    let d3_series: Vec<&str> = cfg
        .modes
        .iter()
        .filter(|m| m.is_d3() && m.conn == Conn::Fresh)
        .map(|m| m.name.as_str())
        .collect();
    for &mean in &cfg.deadline_means_ms {
        for d in &d3_series {
            for base in ["tcp", "tcp-paper", "paced", "qjump"] {
                let (cd, cb) = (curve(points, d, mean), curve(points, base, mean));
                if cd.is_empty() || cb.is_empty() {
                    continue;
                }
                let mut row = vec![format!("{d} / {base}"), mean.to_string()];
                for k in ["99", "95"] {
                    row.push(match (est(d, mean, k), est(base, mean, k)) {
                        (Some(x), Some(y)) if x.1 != "<" && y.1 != "<" && y.0 > 0.0 => {
                            format!("{:.2} ({} / {})", x.0 / y.0, fmt_est(x), fmt_est(y))
                        }
                        (Some(x), Some(y)) => format!("- ({} / {})", fmt_est(x), fmt_est(y)),
                        _ => "-".into(),
                    });
                }
                let ratios: Vec<String> = cd
                    .iter()
                    .filter_map(|&(n, v, _)| {
                        cb.iter()
                            .find(|x| x.0 == n)
                            .filter(|x| x.1 > 0.0)
                            .map(|x| format!("{n}: {:.2}", v / x.1))
                    })
                    .collect();
                row.push(ratios.join(", "));
                rows.push(row);
            }
        }
    }
    if !rows.is_empty() {
        let _ = writeln!(md, "## Ratios (D3 / other)\n");
        let headers = [
            "ratio",
            "deadline mean (ms)",
            "senders at >= 99%",
            "senders at >= 95%",
            "app throughput ratio at each N",
        ];
        md.push_str(&report::markdown_table(&headers, &rows));
        let _ = writeln!(
            md,
            "\nSenders supported: the interpolated crossing where there is one, else the largest measured N (`>=`: reached at every measured N; `< {smallest}`: not even at the smallest); no ratio when either is below the smallest N.\n"
        );
    }

    // Details per point.
    let _ = writeln!(md, "\n## Details per point\n");
    let headers = [
        "mode",
        "mean ms",
        "N",
        "app thr %",
        "95% CI",
        "responses",
        "p50 fct ms",
        "p99 fct ms",
        "drops",
        "RTOs",
        "TLPs",
        "retrans",
        "D3 req/grants/quenched/fb ignored",
        "router C/line mean (min)",
        "router N max",
        "load after",
    ];
    let rows: Vec<Vec<String>> = points
        .iter()
        .filter(|p| p.get("error").is_none() && p["tags"]["mode"] != IDEAL)
        .map(|p| {
            let s = &p["summary"];
            let ci = &s["app_throughput_ci95"];
            let d3 = &s["d3_senders"];
            let rs = &s["d3_router_samples"];
            vec![
                p["tags"]["mode"].as_str().unwrap_or("").into(),
                p["tags"]["deadline_mean_ms"].as_str().unwrap_or("").into(),
                p["tags"]["senders"].as_str().unwrap_or("").into(),
                format!("{:.2}", s["app_throughput"].as_f64().unwrap_or(0.0) * 100.0),
                format!(
                    "{:.1}-{:.1}",
                    ci[0].as_f64().unwrap_or(0.0) * 100.0,
                    ci[1].as_f64().unwrap_or(0.0) * 100.0
                ),
                s["responses"].to_string(),
                format!("{:.2}", s["p50_fct_ms"].as_f64().unwrap_or(0.0)),
                format!("{:.2}", s["p99_fct_ms"].as_f64().unwrap_or(0.0)),
                s["bottleneck_drops"].to_string(),
                s["tcp"]["timeouts"].to_string(),
                s["tcp"]["loss_probes"].to_string(),
                s["tcp"]["retrans_segs"].to_string(),
                if d3.is_null() {
                    String::new()
                } else {
                    format!(
                        "{}/{}/{}/{}",
                        d3["requests"], d3["grants"], d3["quenched"], d3["feedback_ignored"]
                    )
                },
                if rs.is_null() {
                    String::new()
                } else {
                    format!(
                        "{:.2} ({:.2})",
                        rs["capacity_over_line_mean"].as_f64().unwrap_or(0.0),
                        rs["capacity_over_line_min"].as_f64().unwrap_or(0.0)
                    )
                },
                if rs.is_null() {
                    String::new()
                } else {
                    format!("{}", rs["flows_max"].as_f64().unwrap_or(0.0))
                },
                s["load_after"].as_str().unwrap_or("").into(),
            ]
        })
        .collect();
    md.push_str(&report::markdown_table(&headers, &rows));
    // Where the missed deadlines' time went (capture runs, PLEXP_D3_CAPTURE=1).
    let rows: Vec<Vec<String>> = points
        .iter()
        .filter(|p| p["timeline"]["missed"].is_object())
        .map(|p| {
            let t = &p["timeline"]["missed"];
            let f = |k: &str| format!("{:.2}", t[k].as_f64().unwrap_or(0.0));
            vec![
                p["tags"]["mode"].as_str().unwrap_or("").into(),
                p["tags"]["deadline_mean_ms"].as_str().unwrap_or("").into(),
                p["tags"]["senders"].as_str().unwrap_or("").into(),
                format!("{} of {}", t["missed_timed"], t["responses_timed"]),
                t["missed_late_at_first_byte"].to_string(),
                f("mean_deadline_ms"),
                f("mean_first_byte_ms"),
                f("mean_to_first_grant_ms"),
                f("mean_paused_ms"),
                f("mean_last_byte_ms"),
                t["retransmissions"].to_string(),
                format!("{} ({} met)", t["missed_quenched"], t["met_quenched"]),
                {
                    let e = &t["after_a_quench_others_grant_rose_fell_same"];
                    format!("{}/{}/{}", e[0], e[1], e[2])
                },
            ]
        })
        .collect();
    if !rows.is_empty() {
        let _ = writeln!(
            md,
            "\n## Where the time of missed deadlines went\n\nFrom the capture at the aggregator: per missed response, ms after its query left. \
             `late at first byte`: its first byte arrived after its deadline (the worker's start and the bottleneck's queue), which no rate allocation can win back.\n"
        );
        let headers = [
            "mode",
            "mean ms",
            "N",
            "missed (timed)",
            "late at first byte",
            "deadline",
            "first byte",
            "first byte to grant",
            "paused",
            "last byte",
            "retransmissions",
            "quenched: missed (met)",
            "others' grants after a quench: rose/fell/same",
        ];
        md.push_str(&report::markdown_table(&headers, &rows));
    }
    let failed: Vec<String> = points
        .iter()
        .filter(|p| p.get("error").is_some())
        .map(|p| {
            format!(
                "- {} mean {} N {}: {}",
                p["tags"]["mode"], p["tags"]["deadline_mean_ms"], p["tags"]["senders"], p["error"]
            )
        })
        .collect();
    if !failed.is_empty() {
        let _ = writeln!(md, "\n## Failed points\n\n{}", failed.join("\n"));
    }
    let _ = writeln!(
        md,
        "\n`tcp` and `paced` are measured once per N (at the first mean) and scored against every mean: they never see \
         deadlines, and the draws of the three means share their random numbers (same sizes, deadlines scaled). \
         RTOs, TLPs, retrans: the active senders' TCPTimeouts, TCPLossProbes and RetransSegs during the point. \
         D3 counters: the sender agents' `d3_classes` (class `pa`), the router's C sampled every {ROUTER_SAMPLE_MS} ms."
    );
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supported_n() {
        let c = vec![(5, 1.0, 100), (10, 0.995, 100), (15, 0.98, 100), (20, 0.999, 100)];
        assert_eq!(supported(&c, 0.99).0, 10);
        let (n, all, x) = supported(&c, 0.99);
        assert!(!all);
        assert!(
            (x.unwrap() - (10.0 + 0.005 / 0.015 * 5.0)).abs() < 1e-9,
            "{n} {x:?}"
        );
        assert_eq!(supported(&c, 0.95), (20, true, None));
        assert_eq!(supported(&[(5, 0.5, 10)], 0.95).0, 0);
        assert_eq!(supported_text((0, false, None), 5, 40), "< 5");
        assert_eq!(supported_text((40, true, None), 5, 40), ">= 40");
    }

    #[test]
    fn wilson_interval() {
        let (lo, hi) = wilson(990, 1000);
        assert!(lo > 0.98 && lo < 0.99 && hi > 0.99 && hi < 0.996, "{lo} {hi}");
        assert_eq!(wilson(0, 0), (0.0, 1.0));
    }
}
