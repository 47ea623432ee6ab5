//! Verdicts, the table and the plots, from the points in their JSON shape.

use crate::report::{self, PlotOpts, XySeries};
use anyhow::Result;
use paceline_tests::workload::{self};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::*;

/// Why a point met the aim or not. With EDT a flow can only fall short of its rate when its
/// clock falls behind the present (nothing queued: the sender, or the emulated machine, did
/// not keep up; a stall longer than what the flow has queued loses the rest of its time) or
/// when packets are dropped; it can only exceed the rate when the pacer undercounts what it
/// sends.
pub(crate) fn verdict(ratio: f64, drops: f64, stalled_ms: f64, window_s: f64) -> &'static str {
    if (ratio - 1.0).abs() <= AIM {
        "yes"
    } else if ratio > 1.0 {
        "no: over"
    } else if drops > 0.0 {
        "no: drops"
    } else if stalled_ms / 1e3 >= 0.5 * (1.0 - ratio) * window_s {
        // The machine stood still for at least half of the missing time.
        "no: stalls"
    } else {
        "no: short"
    }
}

pub(crate) fn mean(v: &[f64]) -> f64 {
    workload::stats::mean(v)
}

pub(crate) fn nums(reps: &[Value], key: &str) -> Vec<f64> {
    reps.iter().filter_map(|r| r[key].as_f64()).collect()
}

pub(crate) fn sum_u(reps: &[Value], key: &str) -> u64 {
    reps.iter().filter_map(|r| r[key].as_u64()).sum()
}

pub(crate) fn f(v: &Value) -> Option<f64> {
    v.as_f64()
}

pub(crate) fn mb(v: &Value) -> String {
    f(v).map(|x| format!("{:.2}", x / 1e6))
        .unwrap_or_else(|| "-".into())
}

/// The markdown report: the table and the facts needed to read it.
pub(crate) fn markdown(doc: &Value, points: &[Point]) -> String {
    let strs = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<String>>();
    let main_headers = strs(&[
        "point",
        "scope",
        "proto",
        "MTU",
        "flows",
        "configured Mbit/s",
        "wire Mbit/s",
        "ratio",
        "ratio range",
        "reps within 1%",
        "verdict (worst rep)",
        "stall-free ratio",
        "stall-free range",
        "stall-free time",
    ]);
    let detail_headers = strs(&[
        "point",
        "1 s min-max Mbit/s",
        "goodput Mbit/s",
        "sent Mbit/s",
        "UDP loss",
        "delayed pkts",
        "drops",
        "counted / wire bytes",
        "stalls ms",
    ]);
    let ratio_range = |a: &Value, b: &Value| match (f(a), f(b)) {
        (Some(a), Some(b)) => format!("{a:.4}-{b:.4}"),
        _ => "-".into(),
    };
    let (mut rows, mut details) = (Vec::new(), Vec::new());
    for (v, p) in doc["points"].as_array().into_iter().flatten().zip(points) {
        let s = &v["summary"];
        let paced = p.rate_bps.is_some();
        rows.push(vec![
            p.name.clone(),
            p.kind.as_str().into(),
            p.proto.as_str().into(),
            p.mtu.to_string(),
            p.flows().to_string(),
            p.rate_bps
                .map(|r| format!("{:.0}", r as f64 / 1e6))
                .unwrap_or_else(|| "-".into()),
            mb(&s["wire_bps"]),
            f(&s["ratio"])
                .map(|x| format!("{x:.4}"))
                .unwrap_or_else(|| "-".into()),
            ratio_range(&s["ratio_min"], &s["ratio_max"]),
            if paced {
                format!(
                    "{}/{}",
                    s["reps_within_aim"],
                    v["reps"].as_array().map(|a| a.len()).unwrap_or(0)
                )
            } else {
                "-".into()
            },
            match s["verdict"].as_str() {
                Some("yes") => "yes".into(),
                Some(v) => format!("**{v}**"),
                None => "-".into(),
            },
            if paced {
                f(&s["stall_free_ratio"])
                    .map(|x| format!("{x:.4}"))
                    .unwrap_or_else(|| "-".into())
            } else {
                "-".into()
            },
            if paced {
                ratio_range(&s["stall_free_ratio_min"], &s["stall_free_ratio_max"])
            } else {
                "-".into()
            },
            format!("{:.0}%", f(&s["stall_free_share"]).unwrap_or(0.0) * 100.0),
        ]);
        details.push(vec![
            p.name.clone(),
            format!("{}-{}", mb(&s["min_1s_bps"]), mb(&s["max_1s_bps"])),
            mb(&s["goodput_bps"]),
            mb(&s["offered_bps"]),
            f(&s["udp_loss"])
                .map(|x| format!("{:.2}%", x * 100.0))
                .unwrap_or_else(|| "-".into()),
            format!("{:.0}%", f(&s["agent_delayed_share"]).unwrap_or(0.0) * 100.0),
            format!(
                "{:.0}",
                f(&s["agent_horizon_drops"]).unwrap_or(0.0) + f(&s["qdisc_drops"]).unwrap_or(0.0)
            ),
            format!("{:.4}", f(&s["datapath_bytes_share"]).unwrap_or(0.0)),
            format!(
                "{:.0} (max {:.0})",
                f(&s["stalled_ms"]).unwrap_or(0.0),
                f(&s["max_stall_ms"]).unwrap_or(0.0)
            ),
        ]);
    }
    let mut md = String::new();
    let t = &doc["tags"];
    let pr = &doc["params"];
    let sm = &doc["summary"];
    let _ = writeln!(md, "# Pacing conformance\n");
    let _ = writeln!(
        md,
        "Kernel {} ({}), enforcement `{}`: TCP flows {}, UDP flows {}, aggregates {}. {} repetition(s) per point; \
         wire rate = sender veth `tx_bytes` over a {} s window after {} s of warm-up. \
         Rates are L2 frame rates (Ethernet header included), as in paceline policies.\n",
        t["kernel"].as_str().unwrap_or("?"),
        if t["in_vm"] == true { "VM" } else { "host" },
        t["enforcement"].as_str().unwrap_or("?"),
        pr["enforcement"]["tcp_flows"].as_str().unwrap_or("?"),
        pr["enforcement"]["udp_flows"].as_str().unwrap_or("?"),
        pr["enforcement"]["aggregates"].as_str().unwrap_or("?"),
        pr["reps"],
        pr["window_s"],
        pr["warm_s"],
    );
    md.push_str(&report::markdown_table(&main_headers, &rows));
    md.push_str("\nDetails (means over the repetitions; drops and stalls summed):\n\n");
    md.push_str(&report::markdown_table(&detail_headers, &details));
    let mut verdicts: BTreeMap<String, usize> = BTreeMap::new();
    for v in doc["points"].as_array().into_iter().flatten() {
        if let Some(x) = v["summary"]["verdict"].as_str() {
            *verdicts.entry(x.to_string()).or_default() += 1;
        }
    }
    let sf_within = doc["points"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["summary"]["stall_free_within_aim"] == true)
        .count();
    let _ = writeln!(
        md,
        "\n{} of {} paced points within 1% in every repetition (worst mean error {:.2}%); verdicts: {}. \
         Over the stall-free parts of the windows: {} of {} within 1% in every repetition.\n\n\
         Columns: `wire` is the rate of frames leaving the sender's veth over the window (the mean of the \
         repetitions), `ratio` wire / configured, `1 s min-max` the lowest and highest one-second rate seen. \
         `goodput` is payload received over the same window; `sent` what the sender handed to its sockets \
         (UDP asks for 1.5x the configured rate, but a blocking socket sends only as fast as the qdisc \
         drains). `delayed pkts` is the share of the point's packets the pacer gave a later departure. \
         `drops`: the pacer's horizon drops plus the qdisc's drops. `stalls`: how long the machine stood \
         still during the windows (summed over repetitions; a probe thread sleeping 5 ms at a time, counting \
         wake-ups more than 10 ms late) and the longest stall. With EDT a flow can only fall short of its \
         rate when its clock falls behind the present (nothing queued: a stall longer than the flow's queue \
         loses the rest of its time) or when packets are dropped; the verdict says `stalls` when the stalls \
         add up to at least half of the missing time, `drops` when packets were dropped, `over` when the \
         flow left faster than configured. `stall-free ratio`: the wire rate over only the 250 ms sample \
         intervals during which the probe saw no stall (a wake-up more than 2 ms late) and that do not \
         follow one (a stall's end releases a burst of overdue packets), against the configured rate; \
         `stall-free time` is the share of the window those intervals cover. It shows what the pacer does \
         while the machine runs; the plain `ratio` is what a user of this machine got. `counted / wire bytes`: \
         what the datapath charged its clocks (skb->len at tc egress) against what left the interface, over \
         the whole point; below 1 when the stack hands the qdisc GSO packets (one set of headers for several \
         segments, split after the qdisc): those flows leave faster than configured by the same factor. \
         Run time {:.0} s.",
        sm["within_aim"],
        sm["paced_points"],
        f(&sm["worst_abs_error"]).unwrap_or(0.0) * 100.0,
        verdicts
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect::<Vec<_>>()
            .join(", "),
        sf_within,
        sm["paced_points"],
        f(&sm["elapsed_s"]).unwrap_or(0.0),
    );
    md
}

/// `pacing.svg` (achieved against configured with y = x) and `pacing-ratio.svg`.
pub(crate) fn plots(out: &Path, doc: &Value) -> Result<()> {
    let mut by: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut ratio: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut hi: f64 = 0.0;
    for v in doc["points"].as_array().into_iter().flatten() {
        let s = &v["summary"];
        let (Some(cfg), Some(w), Some(r)) = (f(&s["configured_bps"]), f(&s["wire_bps"]), f(&s["ratio"]))
        else {
            continue;
        };
        let name = format!(
            "{} {} (MTU {})",
            v["tags"]["proto"].as_str().unwrap_or(""),
            v["tags"]["scope"].as_str().unwrap_or(""),
            v["tags"]["mtu"].as_str().unwrap_or("")
        );
        by.entry(name.clone()).or_default().push((cfg / 1e6, w / 1e6));
        ratio.entry(name).or_default().push((cfg / 1e6, r));
        hi = hi.max(cfg / 1e6).max(w / 1e6);
    }
    let to_series = |m: BTreeMap<String, Vec<(f64, f64)>>| -> Vec<XySeries> {
        m.into_iter()
            .map(|(name, mut points)| {
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                XySeries { name, points }
            })
            .collect()
    };
    let mut s = vec![XySeries {
        name: "y = x (configured)".into(),
        points: vec![(0.0, 0.0), (hi, hi)],
    }];
    s.extend(to_series(by));
    report::xy_plot(
        &out.join("pacing.svg"),
        &PlotOpts::new(
            "Pacing conformance: achieved wire rate vs configured",
            "configured rate (Mbit/s)",
            "achieved wire rate (Mbit/s)",
        ),
        &s,
    )?;
    let mut r = to_series(ratio);
    let xs: Vec<f64> = r.iter().flat_map(|s| s.points.iter().map(|p| p.0)).collect();
    if let (Some(lo), Some(hi)) = (
        xs.iter().copied().reduce(f64::min),
        xs.iter().copied().reduce(f64::max),
    ) {
        for (name, y) in [("+1%", 1.0 + AIM), ("-1%", 1.0 - AIM)] {
            r.push(XySeries {
                name: name.into(),
                points: vec![(lo, y), (hi, y)],
            });
        }
    }
    let mut o = PlotOpts::new(
        "Pacing conformance: achieved / configured",
        "configured rate (Mbit/s, log)",
        "achieved / configured",
    )
    .log_x(true);
    o.y_from_zero = false;
    report::xy_plot(&out.join("pacing-ratio.svg"), &o, &r)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within the aim is "yes" whatever else happened; a shortfall is blamed on drops first,
    /// then on the machine's stalls when they cover half the missing time, else on the pacer.
    #[test]
    fn verdicts() {
        assert_eq!(verdict(1.0 + AIM / 2.0, 5.0, 1e6, 10.0), "yes");
        assert_eq!(verdict(1.0 - AIM / 2.0, 0.0, 0.0, 10.0), "yes");
        assert_eq!(verdict(1.1, 0.0, 0.0, 10.0), "no: over");
        assert_eq!(verdict(0.9, 3.0, 0.0, 10.0), "no: drops");
        // 10% of a 10 s window is 1 s missing: 500 ms of stalls explain it, 400 ms do not.
        assert_eq!(verdict(0.9, 0.0, 500.0, 10.0), "no: stalls");
        assert_eq!(verdict(0.9, 0.0, 400.0, 10.0), "no: short");
    }
}
