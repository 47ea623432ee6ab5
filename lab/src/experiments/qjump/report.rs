//! The table and the plots, from the conditions' results.

use crate::report::{self, PlotOpts, Series, XySeries};
use anyhow::Result;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::*;

pub(crate) fn us(v: &Value) -> String {
    v.as_f64()
        .map(|x| format!("{x:.0}"))
        .unwrap_or_else(|| "-".into())
}

pub(crate) fn markdown(doc: &Value) -> String {
    let headers = [
        "condition",
        "bulk flows",
        "RPCs",
        "p50 us",
        "p90 us",
        "p99 us",
        "p99.9 us",
        "max us",
        "p99 / idle",
        "p99 per rep us",
        "lost",
        "bulk Mbit/s",
        "port util.",
        "port drops",
        "RPC pkts delayed by pacer",
        "stalls ms",
        "timer p99 late us",
    ];
    let mut rows = Vec::new();
    for v in doc["conditions"].as_array().into_iter().flatten() {
        let s = &v["summary"];
        let pkts = s["rpc_agent_packets"].as_f64().unwrap_or(0.0);
        rows.push(vec![
            v["tags"]["condition"].as_str().unwrap_or("").to_string(),
            v["tags"]["bulk_flows"].as_str().unwrap_or("").to_string(),
            s["count"].to_string(),
            us(&s["p50_us"]),
            us(&s["p90_us"]),
            us(&s["p99_us"]),
            us(&s["p999_us"]),
            us(&s["max_us"]),
            s["p99_vs_idle"]
                .as_f64()
                .map(|x| format!("{x:.2}"))
                .unwrap_or_default(),
            format!("{}-{}", us(&s["p99_rep_min_us"]), us(&s["p99_rep_max_us"])),
            format!("{:.0}", s["rpc_lost"].as_f64().unwrap_or(0.0)),
            format!("{:.2}", s["bulk_goodput_bps"].as_f64().unwrap_or(0.0) / 1e6),
            format!("{:.0}%", s["port_utilisation"].as_f64().unwrap_or(0.0) * 100.0),
            format!("{:.0}", s["port_drops"].as_f64().unwrap_or(0.0)),
            if pkts > 0.0 {
                format!(
                    "{:.1}% (mean {:.0} us)",
                    s["rpc_delayed_packets"].as_f64().unwrap_or(0.0) / pkts * 100.0,
                    s["rpc_added_delay_us"].as_f64().unwrap_or(0.0)
                )
            } else {
                "-".into()
            },
            format!(
                "{:.0} (max {:.0})",
                s["stalled_ms"].as_f64().unwrap_or(0.0),
                s["max_stall_ms"].as_f64().unwrap_or(0.0)
            ),
            format!("{:.0}", s["p99_timer_late_us"].as_f64().unwrap_or(0.0)),
        ]);
    }
    let t = &doc["tags"];
    let p = &doc["params"];
    let mut md = String::new();
    let _ = writeln!(md, "# QJump: RPC latency next to bulk traffic\n");
    let top = p["levels"]
        .as_array()
        .and_then(|l| l.first())
        .cloned()
        .unwrap_or(Value::Null);
    let _ = writeln!(
        md,
        "Kernel {} ({}), enforcement `{}`. Switch port: {:.0} Mbit/s, strict priority over 8 queues by DSCP \
         class selector, {} bytes per queue. RPCs: {} B requests/responses, TCP, open loop at {}/s from s0; \
         bulk: TCP uploads from s1-s3. QJump policy: n = {}, P = {}, R = {:.0} Mbit/s, eps = {}; top level \
         epoch {}, rate {} Mbit/s per host. {} repetition(s), {} s of RPCs each; percentiles over all repetitions.\n",
        t["kernel"].as_str().unwrap_or("?"),
        if t["in_vm"] == true { "VM" } else { "host" },
        t["enforcement"].as_str().unwrap_or("?"),
        p["rate_bps"].as_f64().unwrap_or(0.0) / 1e6,
        p["buffer_bytes_per_queue"],
        p["rpc_bytes"],
        p["rpc_rate"],
        p["senders"],
        p["max_packet"].as_str().unwrap_or(""),
        p["rate_bps"].as_f64().unwrap_or(0.0) / 1e6,
        p["switch_delay"].as_str().unwrap_or(""),
        top["epoch_seconds"]
            .as_f64()
            .map(|e| format!("{:.0} us", e * 1e6))
            .unwrap_or_else(|| "?".into()),
        top["rate_bytes_per_second"]
            .as_f64()
            .map(|r| format!("{:.2}", r * 8.0 / 1e6))
            .unwrap_or_else(|| "?".into()),
        p["reps"],
        p["rpc_s"],
    );
    md.push_str(&report::markdown_table(&headers, &rows));
    let _ = writeln!(md, "\n## The aim: p99 with levels within {AIM}x of idle\n");
    let ah = [
        "bulk flows",
        "idle p99 us",
        "no levels p99 us",
        "levels p99 us",
        "levels / idle",
        "no levels / idle",
        "levels, bulk elsewhere p99 us",
        "levels / bulk elsewhere",
        "aim holds",
        "stall-free: idle p99 us",
        "stall-free: levels p99 us",
        "stall-free: levels / idle",
        "stall-free: aim holds",
    ];
    let arows: Vec<Vec<String>> = doc["summary"]["aims"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            vec![
                a["bulk_flows"].to_string(),
                us(&a["idle_p99_us"]),
                us(&a["no_levels_p99_us"]),
                us(&a["levels_p99_us"]),
                format!("{:.2}", a["levels_vs_idle"].as_f64().unwrap_or(0.0)),
                format!("{:.1}", a["no_levels_vs_idle"].as_f64().unwrap_or(0.0)),
                us(&a["bulk_elsewhere_p99_us"]),
                format!("{:.2}", a["levels_vs_bulk_elsewhere"].as_f64().unwrap_or(0.0)),
                if a["aim_holds"] == true {
                    "yes".into()
                } else {
                    "**no**".into()
                },
                us(&a["idle_stall_free_p99_us"]),
                us(&a["levels_stall_free_p99_us"]),
                format!("{:.2}", a["levels_vs_idle_stall_free"].as_f64().unwrap_or(0.0)),
                if a["aim_holds_stall_free"] == true {
                    "yes".into()
                } else {
                    "**no**".into()
                },
            ]
        })
        .collect();
    md.push_str(&report::markdown_table(&ah, &arows));
    let _ = writeln!(
        md,
        "\n## Stall-free view\n\nThe same RPCs without those during which the machine stalled (the probe \
         thread woke more than 2 ms late at some point between the request's send and its response, with \
         1 ms of slack on both sides): what the network did while the emulator ran.\n"
    );
    let sh = [
        "condition",
        "bulk flows",
        "RPCs kept",
        "p50 us",
        "p90 us",
        "p99 us",
        "p99.9 us",
        "max us",
    ];
    let srows: Vec<Vec<String>> = doc["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| {
            let s = &v["summary"];
            vec![
                v["tags"]["condition"].as_str().unwrap_or("").to_string(),
                v["tags"]["bulk_flows"].as_str().unwrap_or("").to_string(),
                format!(
                    "{} ({:.0}%)",
                    s["stall_free_count"],
                    s["stall_free_share"].as_f64().unwrap_or(0.0) * 100.0
                ),
                us(&s["stall_free_p50_us"]),
                us(&s["stall_free_p90_us"]),
                us(&s["stall_free_p99_us"]),
                us(&s["stall_free_p999_us"]),
                us(&s["stall_free_max_us"]),
            ]
        })
        .collect();
    md.push_str(&report::markdown_table(&sh, &srows));
    let _ = writeln!(
        md,
        "\n`levels, bulk elsewhere`: the same bulk flows through the switch's other port (same CPU load, \
         no shared queue). `RPC pkts delayed by pacer`: share of s0's RPC-class packets the top level's \
         rate limit gave a later departure. `stalls`: how long the machine stood still during the RPC \
         windows (a probe thread sleeping 5 ms at a time; wake-ups more than 10 ms late, summed over the \
         repetitions) and the longest stall; `timer p99 late`: the probe's 99th percentile wake-up \
         lateness, a measure of how late any thread (the RPC client and server included) runs. Run time {:.0} s.",
        doc["summary"]["elapsed_s"].as_f64().unwrap_or(0.0)
    );
    md
}

pub(crate) fn plots(
    out: &Path,
    samples: &BTreeMap<String, Vec<f64>>,
    clean_samples: &BTreeMap<String, Vec<f64>>,
    bulk_counts: &[u32],
    conds: &[Value],
) -> Result<()> {
    let k = *bulk_counts.iter().max().unwrap_or(&0);
    let series_of = |samples: &BTreeMap<String, Vec<f64>>, names: &[(&str, u32)]| -> Vec<Series> {
        names
            .iter()
            .filter_map(|(n, b)| {
                samples.get(&format!("{n}/{b}")).map(|v| Series {
                    name: if *b == 0 {
                        n.to_string()
                    } else {
                        format!("{n} ({b} bulk flows)")
                    },
                    values: v.clone(),
                })
            })
            .collect()
    };
    let series = |names: &[(&str, u32)]| series_of(samples, names);
    report::cdf_plot(
        &out.join("qjump-stall-free.svg"),
        &PlotOpts::new(
            "RPC latency without the RPCs the emulator stalled",
            "RPC latency (us, log)",
            "CDF",
        )
        .log_x(true),
        &series_of(clean_samples, &[("idle", 0), ("no-levels", k), ("levels", k)]),
    )?;
    report::cdf_plot(
        &out.join("qjump.svg"),
        &PlotOpts::new(
            "RPC latency: idle, next to bulk without levels, with QJump levels",
            "RPC latency (us, log)",
            "CDF",
        )
        .log_x(true),
        &series(&[("idle", 0), ("no-levels", k), ("levels", k)]),
    )?;
    report::cdf_plot(
        &out.join("qjump-controls.svg"),
        &PlotOpts::new(
            "RPC latency: controls (rate limit alone, CPU load alone)",
            "RPC latency (us, log)",
            "CDF",
        )
        .log_x(true),
        &series(&[
            ("idle", 0),
            ("idle-levels", 0),
            ("levels", k),
            ("levels-bulk-elsewhere", k),
        ]),
    )?;
    let mut xy: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for v in conds {
        let name = v["tags"]["condition"].as_str().unwrap_or("").to_string();
        let b: f64 = v["tags"]["bulk_flows"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0.0);
        if b == 0.0 {
            continue;
        }
        if let Some(p) = v["summary"]["p99_us"].as_f64() {
            xy.entry(name).or_default().push((b, p));
        }
    }
    let idle = conds
        .iter()
        .find(|v| v["tags"]["condition"] == "idle")
        .and_then(|v| v["summary"]["p99_us"].as_f64());
    let mut s: Vec<XySeries> = xy
        .into_iter()
        .map(|(name, mut points)| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            XySeries { name, points }
        })
        .collect();
    if let (Some(i), Some(lo), Some(hi)) = (idle, bulk_counts.iter().min(), bulk_counts.iter().max()) {
        s.push(XySeries {
            name: "idle".into(),
            points: vec![(*lo as f64, i), (*hi as f64, i)],
        });
        s.push(XySeries {
            name: format!("{AIM} x idle (the aim)"),
            points: vec![(*lo as f64, i * AIM), (*hi as f64, i * AIM)],
        });
    }
    report::xy_plot(
        &out.join("qjump-p99.svg"),
        &PlotOpts::new(
            "RPC p99 latency against bulk load",
            "bulk flows",
            "p99 latency (us)",
        ),
        &s,
    )?;
    Ok(())
}
