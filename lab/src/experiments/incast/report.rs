//! The table and the plots, from the points in their JSON shape.

use crate::experiments::{Common, Document};
use crate::report::{self, PlotOpts, XySeries};
use anyhow::Result;
use serde_json::Value;
use std::path::Path;

use super::*;

pub(crate) fn curve(points: &[Value], mode: &str, key: &str, scale: f64) -> Vec<(f64, f64)> {
    points
        .iter()
        .filter(|p| p["tags"]["mode"] == mode && p.get("error").is_none())
        .filter_map(|p| {
            Some((
                p["summary"]["servers"].as_f64()?,
                p["summary"][key].as_f64()? * scale,
            ))
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn write_outputs(
    out: &Path,
    cfg: &Config,
    c: &Common,
    env: &Value,
    points: &[Value],
    micro: &[Value],
    complete: bool,
    elapsed_s: f64,
) -> Result<()> {
    Document::new(NAME, c, cfg, env, points, complete, elapsed_s)
        .with("micro", micro)
        .write(out)?;
    std::fs::write(out.join(format!("{NAME}.md")), markdown(cfg, env, points, micro))?;
    for (file, key, title, ylabel, scale) in [
        (
            "goodput",
            "goodput_bps",
            "Incast goodput",
            "goodput (Mbit/s)",
            1e-6,
        ),
        (
            "p99",
            "p99_block_ms",
            "Incast block completion, p99",
            "p99 block time (ms)",
            1.0,
        ),
    ] {
        let series: Vec<XySeries> = cfg
            .modes
            .iter()
            .map(|m| XySeries {
                name: m.name().into(),
                points: curve(points, m.name(), key, scale),
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        if !series.is_empty() {
            let opts = PlotOpts::new(
                &format!(
                    "{title}: {} Mbit/s port, {} KB buffer, {} KB fragments",
                    cfg.rate_bps / 1_000_000,
                    cfg.buffer_bytes / 1024,
                    cfg.fragment_bytes / 1024
                ),
                "servers (S)",
                ylabel,
            );
            report::xy_plot(&out.join(format!("{NAME}-{file}.svg")), &opts, &series)?;
        }
    }
    Ok(())
}

pub(crate) fn markdown(cfg: &Config, env: &Value, points: &[Value], micro: &[Value]) -> String {
    let mut s = format!(
        "# Incast (the incast study and Dart)\n\nKernel {}, sch_fq {}, port {} Mbit/s with a {} B buffer, RTT {:.3} ms, {} KB fragments, {} blocks per point.\n\n",
        env["kernel"].as_str().unwrap_or("?"),
        env["sch_fq_available"],
        cfg.rate_bps / 1_000_000,
        cfg.buffer_bytes,
        env["rtt_ms_median"].as_f64().unwrap_or(0.0),
        cfg.fragment_bytes / 1024,
        cfg.blocks
    );
    if let Some(u) = env["unavailable"].as_object().filter(|u| !u.is_empty()) {
        for (m, why) in u {
            s += &format!("Mode `{m}` did not run: {}\n\n", why.as_str().unwrap_or(""));
        }
    }
    s += "| mode | S | goodput (Mbit/s) | of the port | block p50 (ms) | block p99 (ms) | ideal (ms) | RTOs | drops |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for p in points {
        let m = p["tags"]["mode"].as_str().unwrap_or("?");
        let n = p["tags"]["servers"].as_str().unwrap_or("?");
        if let Some(e) = p.get("error") {
            s += &format!(
                "| {m} | {n} | error: {} | | | | | | |\n",
                e.as_str().unwrap_or("")
            );
            continue;
        }
        let x = &p["summary"];
        let f = |k: &str| x[k].as_f64().unwrap_or(0.0);
        s += &format!(
            "| {m} | {n} | {:.1} | {:.1}% | {:.2} | {:.2} | {:.2} | {} | {} |\n",
            f("goodput_bps") / 1e6,
            f("goodput_fraction") * 100.0,
            f("p50_block_ms"),
            f("p99_block_ms"),
            f("ideal_block_ms"),
            x["rtos"],
            x["drops"]
        );
    }
    // The study's aims (docs/experiments/incast.md), as ratios of this run's own points.
    let at = |m: &str, n: usize| {
        points.iter().find(|p| {
            p["tags"]["mode"] == m
                && p["tags"]["servers"] == n.to_string().as_str()
                && p.get("error").is_none()
        })
    };
    let big: Vec<usize> = cfg.servers.iter().copied().filter(|&n| n >= 16).collect();
    if !big.is_empty() {
        s += "\n## p99 block time of tcp / of the mode (S >= 16; aim for dasr: >= 2.5)\n\n| mode |";
        for n in &big {
            s += &format!(" S = {n} |");
        }
        s += "\n|---|";
        s += &"---:|".repeat(big.len());
        s += "\n";
        for m in &cfg.modes {
            s += &format!("| {} |", m.name());
            for &n in &big {
                let r = match (at("tcp", n), at(m.name(), n)) {
                    (Some(t), Some(x)) => {
                        let (a, b) = (
                            t["summary"]["p99_block_ms"].as_f64().unwrap_or(0.0),
                            x["summary"]["p99_block_ms"].as_f64().unwrap_or(0.0),
                        );
                        if b > 0.0 {
                            format!(" {:.2} |", a / b)
                        } else {
                            " - |".into()
                        }
                    }
                    _ => " - |".into(),
                };
                s += &r;
            }
            s += "\n";
        }
    }
    if !micro.is_empty() {
        s += &format!(
            "\n## Short messages (Dart's micro-benchmark)\n\n{} B messages, closed loop, next to C bulk uploads to the same client.\n\n| mode | C | messages | p50 (ms) | p99 (ms) | ideal (ms) | port drops |\n|---|---:|---:|---:|---:|---:|---:|\n",
            cfg.micro_message_bytes
        );
        for m in micro {
            let md = m["tags"]["mode"].as_str().unwrap_or("?");
            let k = m["tags"]["competitors"].as_str().unwrap_or("?");
            if let Some(e) = m.get("error") {
                s += &format!("| {md} | {k} | error: {} | | | | |\n", e.as_str().unwrap_or(""));
                continue;
            }
            let x = &m["summary"];
            let f = |k: &str| x[k].as_f64().unwrap_or(0.0);
            s += &format!(
                "| {md} | {k} | {} | {:.3} | {:.3} | {:.3} | {} |\n",
                x["messages"],
                f("p50_ms"),
                f("p99_ms"),
                f("ideal_ms"),
                x["drops"]
            );
        }
    }
    s
}
