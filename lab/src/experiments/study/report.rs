//! The results as typed records, pooled over the repetitions; N* (where pacing stops
//! helping) per repetition and pooled; the tables and the plots in the slides' shape.

use crate::experiments::{Common, Document};
use crate::report::{self, PlotOpts, XySeries};
use anyhow::Result;
use paceline_tests::workload::stats;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;

use super::*;

/// The slides' points of inflection: Aggarwal et al. and Kulik et al., as the slides quote them.
pub(crate) const SEED_N_STAR: [(&str, u64); 2] = [("Aggarwal", 8), ("Kulik", 9)];

/// One measured point as `run_point` writes it (the fields the report reads).
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct PointRec {
    pub(crate) tags: PointTags,
    pub(crate) summary: PointSummary,
    #[serde(default)]
    pub(crate) fct_s: Vec<f64>,
}

#[derive(Clone, Debug, Deserialize)]
pub(crate) struct PointTags {
    pub(crate) mode: String,
    pub(crate) flows: String,
    pub(crate) buffer_pkts: String,
    /// Absent in runs from before repetitions: one repetition, 0.
    #[serde(default)]
    pub(crate) rep: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub(crate) struct PointSummary {
    pub(crate) utilisation: f64,
    pub(crate) drop_rate: f64,
    pub(crate) mean_fct_s: f64,
    pub(crate) p99_fct_s: f64,
    pub(crate) ideal_fct_s: f64,
    pub(crate) retrans_per_flow: f64,
    pub(crate) flows_failed: u64,
    pub(crate) host_qdisc_drops: u64,
    #[serde(default)]
    pub(crate) agent: AgentDrops,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct AgentDrops {
    #[serde(default)]
    pub(crate) dropped_horizon: u64,
}

impl PointRec {
    fn n(&self) -> u64 {
        self.tags.flows.parse().unwrap_or(0)
    }
    fn buffer(&self) -> u32 {
        self.tags.buffer_pkts.parse().unwrap_or(0)
    }
    fn rep(&self) -> usize {
        self.tags.rep.as_deref().and_then(|r| r.parse().ok()).unwrap_or(0)
    }
}

/// The points that parse (an errored point has no summary and is left out).
pub(crate) fn records(points: &[Value]) -> Vec<PointRec> {
    points
        .iter()
        .filter_map(|p| serde_json::from_value(p.clone()).ok())
        .collect()
}

/// Mean and range of a value over the repetitions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub(crate) struct Spread {
    pub(crate) mean: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

impl Spread {
    pub(crate) fn of(v: &[f64]) -> Spread {
        if v.is_empty() {
            return Spread::default();
        }
        Spread {
            mean: stats::mean(v),
            min: v.iter().copied().fold(f64::INFINITY, f64::min),
            max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

/// One (buffer, mode, N) over the repetitions that ran: FCTs pooled over all of their flows,
/// the rest as mean and range over the repetitions.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Cell {
    pub(crate) buffer_pkts: u32,
    pub(crate) mode: String,
    pub(crate) n: u64,
    pub(crate) reps: usize,
    /// Completed flows over the repetitions.
    pub(crate) flows: usize,
    pub(crate) failed: u64,
    pub(crate) mean_fct_s: f64,
    /// Nearest rank over the pooled flows.
    pub(crate) p99_fct_s: f64,
    pub(crate) max_fct_s: f64,
    /// With 100 flows or fewer, the nearest-rank p99 is the largest one.
    pub(crate) p99_is_max: bool,
    pub(crate) ideal_fct_s: f64,
    pub(crate) utilisation: Spread,
    pub(crate) drop_rate: Spread,
    /// Each repetition's own p99 FCT.
    pub(crate) p99_fct_by_rep: Spread,
    pub(crate) retrans_per_flow: f64,
    /// Drops at the senders' qdiscs and the agents' horizon drops, summed.
    pub(crate) host_drops: u64,
}

/// The cells of `recs`, by buffer, N and mode as measured.
pub(crate) fn cells(recs: &[PointRec]) -> Vec<Cell> {
    let mut keys: Vec<(u32, u64, String)> = Vec::new();
    for r in recs {
        let k = (r.buffer(), r.n(), r.tags.mode.clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.sort_by_key(|k| (k.0, k.1));
    keys.into_iter()
        .map(|(buf, n, mode)| {
            let sel: Vec<&PointRec> = recs
                .iter()
                .filter(|r| r.buffer() == buf && r.n() == n && r.tags.mode == mode)
                .collect();
            let fcts = stats::sorted(sel.iter().flat_map(|r| r.fct_s.iter().copied()).collect());
            let of = |f: &dyn Fn(&PointRec) -> f64| Spread::of(&sel.iter().map(|r| f(r)).collect::<Vec<_>>());
            Cell {
                buffer_pkts: buf,
                mode,
                n,
                reps: sel.len(),
                flows: fcts.len(),
                failed: sel.iter().map(|r| r.summary.flows_failed).sum(),
                mean_fct_s: stats::mean(&fcts),
                p99_fct_s: stats::percentile_sorted(&fcts, 99.0),
                max_fct_s: fcts.last().copied().unwrap_or(0.0),
                p99_is_max: fcts.len() <= 100,
                ideal_fct_s: sel.first().map_or(0.0, |r| r.summary.ideal_fct_s),
                utilisation: of(&|r| r.summary.utilisation),
                drop_rate: of(&|r| r.summary.drop_rate),
                p99_fct_by_rep: of(&|r| r.summary.p99_fct_s),
                retrans_per_flow: of(&|r| r.summary.retrans_per_flow).mean,
                host_drops: sel
                    .iter()
                    .map(|r| r.summary.host_qdisc_drops + r.summary.agent.dropped_horizon)
                    .sum(),
            }
        })
        .collect()
}

/// What N* is judged on: lower is better for each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) enum Metric {
    #[serde(rename = "p99_fct")]
    P99Fct,
    #[serde(rename = "mean_fct")]
    MeanFct,
    #[serde(rename = "drop_rate")]
    Drops,
}

impl Metric {
    pub(crate) const ALL: [Metric; 3] = [Metric::P99Fct, Metric::MeanFct, Metric::Drops];
    pub(crate) fn name(self) -> &'static str {
        match self {
            Metric::P99Fct => "p99 FCT",
            Metric::MeanFct => "mean FCT",
            Metric::Drops => "drop rate",
        }
    }
    fn of_rec(self, r: &PointRec) -> f64 {
        match self {
            Metric::P99Fct => r.summary.p99_fct_s,
            Metric::MeanFct => r.summary.mean_fct_s,
            Metric::Drops => r.summary.drop_rate,
        }
    }
    fn of_cell(self, c: &Cell) -> f64 {
        match self {
            Metric::P99Fct => c.p99_fct_s,
            Metric::MeanFct => c.mean_fct_s,
            Metric::Drops => c.drop_rate.mean,
        }
    }
}

/// unpaced / paced for a lower-is-better value; `None` (infinitely better) when paced is zero
/// and unpaced is not, 1 when both are zero.
pub(crate) fn ratio(unpaced: f64, paced: f64) -> Option<f64> {
    match (unpaced > 0.0, paced > 0.0) {
        (_, true) => Some(unpaced / paced),
        (true, false) => None,
        (false, false) => Some(1.0),
    }
}

/// N* from `(N, unpaced, paced)` rows in increasing N, with the ratio at each N. Pacing
/// "helps" at N when `unpaced >= (1 + TOLERANCE) * paced`; N* is the smallest N at which it no
/// longer does, after it helped at some smaller N.
pub(crate) fn n_star(rows: &[(u64, f64, f64)]) -> (NStar, Vec<(u64, Option<f64>)>) {
    let ratios: Vec<(u64, Option<f64>)> = rows.iter().map(|&(n, u, p)| (n, ratio(u, p))).collect();
    let helps = |r: Option<f64>| r.is_none_or(|r| r >= 1.0 + TOLERANCE);
    if ratios.is_empty() {
        return (NStar::NotMeasured, ratios);
    }
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
    /// No N measured in both modes (a repetition that did not reach this buffer).
    NotMeasured,
}

impl NStar {
    pub(crate) fn json(self) -> Value {
        match self {
            NStar::At(n) => serde_json::json!(n),
            NStar::Beyond => serde_json::json!("beyond"),
            NStar::NeverHelped => serde_json::json!("never-helped"),
            NStar::NotMeasured => Value::Null,
        }
    }
    pub(crate) fn text(self, max_n: u64) -> String {
        match self {
            NStar::At(n) => n.to_string(),
            NStar::Beyond => format!("> {max_n}"),
            NStar::NeverHelped => "never helped".into(),
            NStar::NotMeasured => "-".into(),
        }
    }
}

/// N* of one paced mode against unpaced on one buffer: pooled over the repetitions and in each.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct StarRow {
    pub(crate) buffer_pkts: u32,
    pub(crate) buffer_bdp: f64,
    pub(crate) mode: String,
    pub(crate) metric: Metric,
    #[serde(serialize_with = "ser_star")]
    pub(crate) pooled: NStar,
    pub(crate) pooled_text: String,
    /// unpaced / paced at each N, pooled (null: paced had none, unpaced some).
    pub(crate) unpaced_over_paced: Vec<(u64, Option<f64>)>,
    #[serde(serialize_with = "ser_stars")]
    pub(crate) by_rep: Vec<NStar>,
    pub(crate) by_rep_text: String,
}

fn ser_star<S: serde::Serializer>(s: &NStar, ser: S) -> Result<S::Ok, S::Error> {
    s.json().serialize(ser)
}

fn ser_stars<S: serde::Serializer>(s: &[NStar], ser: S) -> Result<S::Ok, S::Error> {
    s.iter().map(|x| x.json()).collect::<Vec<_>>().serialize(ser)
}

/// N* for every buffer, paced mode and metric measured.
pub(crate) fn stars(recs: &[PointRec], cells: &[Cell], ratio_of: &dyn Fn(u32) -> f64) -> Vec<StarRow> {
    let max_n = cells.iter().map(|c| c.n).max().unwrap_or(0);
    let mut bufs: Vec<u32> = cells.iter().map(|c| c.buffer_pkts).collect();
    bufs.dedup();
    let mut reps: Vec<usize> = recs.iter().map(PointRec::rep).collect();
    reps.sort_unstable();
    reps.dedup();
    let mut out = Vec::new();
    for &buf in &bufs {
        let mut modes: Vec<String> = Vec::new();
        for c in cells
            .iter()
            .filter(|c| c.buffer_pkts == buf && c.mode != Mode::Unpaced.name())
        {
            if !modes.contains(&c.mode) {
                modes.push(c.mode.clone());
            }
        }
        for mode in &modes {
            for metric in Metric::ALL {
                let cell = |m: &str, n: u64| {
                    cells
                        .iter()
                        .find(|c| c.buffer_pkts == buf && c.mode == m && c.n == n)
                };
                let mut ns: Vec<u64> = cells
                    .iter()
                    .filter(|c| c.buffer_pkts == buf)
                    .map(|c| c.n)
                    .collect();
                ns.sort_unstable();
                ns.dedup();
                let rows: Vec<(u64, f64, f64)> = ns
                    .iter()
                    .filter_map(|&n| {
                        Some((
                            n,
                            metric.of_cell(cell(Mode::Unpaced.name(), n)?),
                            metric.of_cell(cell(mode, n)?),
                        ))
                    })
                    .collect();
                let (pooled, ratios) = n_star(&rows);
                let by_rep: Vec<NStar> = reps
                    .iter()
                    .map(|&rep| {
                        let rec = |m: &str, n: u64| {
                            recs.iter().find(|r| {
                                r.rep() == rep && r.buffer() == buf && r.tags.mode == m && r.n() == n
                            })
                        };
                        let rows: Vec<(u64, f64, f64)> = ns
                            .iter()
                            .filter_map(|&n| {
                                Some((
                                    n,
                                    metric.of_rec(rec(Mode::Unpaced.name(), n)?),
                                    metric.of_rec(rec(mode, n)?),
                                ))
                            })
                            .collect();
                        n_star(&rows).0
                    })
                    .collect();
                out.push(StarRow {
                    buffer_pkts: buf,
                    buffer_bdp: ratio_of(buf),
                    mode: mode.clone(),
                    metric,
                    pooled,
                    pooled_text: pooled.text(max_n),
                    unpaced_over_paced: ratios,
                    by_rep_text: by_rep
                        .iter()
                        .map(|s| s.text(max_n))
                        .collect::<Vec<_>>()
                        .join(", "),
                    by_rep,
                });
            }
        }
    }
    out
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
    let bdp = env["bdp_frames"].as_f64().unwrap_or(0.0).max(1e-9);
    let ratio_of = |b: u32| b as f64 / bdp;
    let recs = records(points);
    let cells = cells(&recs);
    let stars = stars(&recs, &cells, &ratio_of);
    let max_n = cfg.flows.iter().max().copied().unwrap_or(0);
    Document::new(NAME, c, cfg, env, points, complete, elapsed_s)
        .with("n_star_definition", format!(
            "pacing helps at N when the unpaced value >= (1 + {TOLERANCE}) x the paced value (FCT and drop rate: lower is better); N* is the smallest measured N at which pacing no longer helps, after it helped at a smaller N; \"beyond\": it helped from then on up to N = {max_n}; \"never-helped\": it helped at no N. Pooled: on the FCTs of all repetitions' flows and the mean drop rate; by_rep: in each repetition"
        ))
        .with("seed_n_star", SEED_N_STAR)
        .with("cells", &cells)
        .with("n_star", &stars)
        .write(out)?;
    std::fs::write(
        out.join(format!("{NAME}.md")),
        markdown(cfg, env, &cells, &stars, complete, elapsed_s),
    )?;
    plots(out, cfg, &cells, &ratio_of)
}

/// Per buffer, the slides' four panels against N: utilisation, drop rate, mean and p99 FCT,
/// one line per mode (the mean over the repetitions; FCTs pooled).
fn plots(out: &Path, cfg: &Config, cells: &[Cell], ratio_of: &dyn Fn(u32) -> f64) -> Result<()> {
    let mut bufs: Vec<u32> = cells.iter().map(|c| c.buffer_pkts).collect();
    bufs.dedup();
    for buf in bufs {
        let sel: Vec<&Cell> = cells.iter().filter(|c| c.buffer_pkts == buf).collect();
        let mut modes: Vec<&str> = Vec::new();
        for c in &sel {
            if !modes.contains(&c.mode.as_str()) {
                modes.push(&c.mode);
            }
        }
        let sub = format!(
            "buffer {buf} pkts ({:.1}% of the BDP), {} Mbit/s",
            ratio_of(buf) * 100.0,
            cfg.rate_bps / 1_000_000
        );
        type Get = fn(&Cell) -> f64;
        let panels: [(&str, &str, &str, Get); 4] = [
            ("utilisation", "bottleneck utilisation", "utilisation (%)", |c| {
                c.utilisation.mean * 100.0
            }),
            ("drops", "bottleneck drop rate", "drops (% of packets)", |c| {
                c.drop_rate.mean * 100.0
            }),
            ("mean-fct", "mean FCT", "mean FCT (s)", |c| c.mean_fct_s),
            ("p99-fct", "99th-percentile FCT", "p99 FCT (s)", |c| c.p99_fct_s),
        ];
        for (file, title, y, get) in panels {
            let series: Vec<XySeries> = modes
                .iter()
                .map(|m| XySeries {
                    name: (*m).to_string(),
                    points: sel
                        .iter()
                        .filter(|c| c.mode == *m)
                        .map(|c| (c.n as f64, get(c)))
                        .collect(),
                })
                .collect();
            let opts =
                PlotOpts::new(&format!("{title} vs N, {sub}"), "concurrent flows N (log)", y).log_x(true);
            report::xy_plot(&out.join(format!("{NAME}-{file}-b{buf}.svg")), &opts, &series)?;
        }
    }
    Ok(())
}

pub(crate) fn markdown(
    cfg: &Config,
    env: &Value,
    cells: &[Cell],
    stars: &[StarRow],
    complete: bool,
    elapsed_s: f64,
) -> String {
    let bdp = env["bdp_frames"].as_f64().unwrap_or(0.0).max(1e-9);
    let pct_range = |s: Spread, digits: usize| {
        if s.max - s.min < 0.5 * 10f64.powi(-(digits as i32)) / 100.0 {
            format!("{:.*}", digits, s.mean * 100.0)
        } else {
            format!(
                "{:.*} ({:.*}-{:.*})",
                digits,
                s.mean * 100.0,
                digits,
                s.min * 100.0,
                digits,
                s.max * 100.0
            )
        }
    };
    let mut md = String::new();
    md.push_str(&format!(
        "# Pacing study (the TCP pacing study)\n\n{}Kernel {} ({}), agent enforcement `{}`. Bottleneck {} Mbit/s ({}) on the router; \
         RTT {:.2} ms (netem delay on the ACK path: {} ms), BDP {:.0} frames; buffers {}; {} senders per mode; flows of {} bytes; \
         at least {} flows per point in each of {} repetitions; pacing at {}x the fair share. Calibration: the bottleneck dequeued \
         {:.1}% of its rate under a UDP overload. Run took {:.0} s.\n\n",
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
        bdp,
        env["buffers"]
            .as_array()
            .map(|a| a
                .iter()
                .map(|b| format!(
                    "{} frames ({:.1}% of the BDP)",
                    b["frames"],
                    b["of_bdp"].as_f64().unwrap_or(0.0) * 100.0
                ))
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default(),
        cfg.senders,
        cfg.flow_bytes,
        cfg.samples,
        cfg.reps,
        cfg.pace_fraction,
        env["calibration"]["dequeued_over_rate"].as_f64().unwrap_or(f64::NAN) * 100.0,
        elapsed_s,
    ));
    let headers = [
        "buffer",
        "N",
        "mode",
        "reps",
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
    ];
    let rows: Vec<Vec<String>> = cells
        .iter()
        .map(|c| {
            vec![
                format!("{} ({:.1}%)", c.buffer_pkts, c.buffer_pkts as f64 / bdp * 100.0),
                c.n.to_string(),
                c.mode.clone(),
                c.reps.to_string(),
                pct_range(c.utilisation, 1),
                pct_range(c.drop_rate, 2),
                format!("{:.3}", c.mean_fct_s),
                format!("{:.3}{}", c.p99_fct_s, if c.p99_is_max { " (max)" } else { "" }),
                format!("{:.3}", c.max_fct_s),
                format!("{:.3}", c.ideal_fct_s),
                report::fmt_num(c.p99_fct_s / c.ideal_fct_s.max(1e-9)),
                report::fmt_num(c.retrans_per_flow),
                c.host_drops.to_string(),
                format!(
                    "{}{}",
                    c.flows,
                    if c.failed > 0 {
                        format!(" ({} failed)", c.failed)
                    } else {
                        String::new()
                    }
                ),
            ]
        })
        .collect();
    md.push_str(&report::markdown_table(&headers, &rows));
    md.push_str(
        "\nbuffer: frames (% of the BDP); util: bytes dequeued by the bottleneck / (rate x active time), mean over the \
         repetitions (their range in brackets); drop: bottleneck drops / packets offered, likewise; FCT: connect to the \
         receiver's acknowledgement of the last byte, pooled over the repetitions' flows (p99 by nearest rank: \"(max)\" \
         where 100 flows or fewer make it the largest); ideal: N flows' payload at the full rate; host drops: drops at the \
         senders' qdiscs plus the agents' horizon drops.\n\n## Point of inflection N*\n\n",
    );
    let headers = [
        "buffer",
        "paced mode",
        "metric",
        "N* pooled",
        "N* by repetition",
        "unpaced/paced at each N (pooled)",
    ];
    let rows: Vec<Vec<String>> = stars
        .iter()
        .map(|s| {
            vec![
                format!("{} ({:.1}%)", s.buffer_pkts, s.buffer_bdp * 100.0),
                s.mode.clone(),
                s.metric.name().to_string(),
                s.pooled_text.clone(),
                s.by_rep_text.clone(),
                s.unpaced_over_paced
                    .iter()
                    .map(|(n, r)| match r {
                        Some(r) => format!("{n}: {r:.2}"),
                        None => format!("{n}: paced 0"),
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            ]
        })
        .collect();
    md.push_str(&report::markdown_table(&headers, &rows));
    let max_n = cfg.flows.iter().max().copied().unwrap_or(0);
    md.push_str(&format!(
        "\nPacing helps at N when unpaced >= (1 + {TOLERANCE}) x paced (ratios above {:.2}; \"paced 0\": paced had no \
         drops, unpaced some). N*: the smallest measured N at which it no longer helps, after it helped at a smaller N \
         (\"> {max_n}\": it helped up to the largest N measured; \"-\": a repetition that did not reach this buffer). The slides quote N* = {} ({}) and {} ({}).\n",
        1.0 + TOLERANCE,
        SEED_N_STAR[0].1,
        SEED_N_STAR[0].0,
        SEED_N_STAR[1].1,
        SEED_N_STAR[1].0,
    ));
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A point as `run_point` writes it, with `fcts` as its flows' completion times.
    fn point(rep: usize, buf: u32, mode: Mode, n: u64, fcts: &[f64], drop_rate: f64) -> Value {
        let sorted = stats::sorted(fcts.to_vec());
        json!({
            "kind": NAME,
            "tags": {"mode": mode.name(), "flows": n.to_string(), "buffer_pkts": buf.to_string(), "rep": rep.to_string()},
            "summary": {
                "utilisation": 0.9, "drop_rate": drop_rate, "mean_fct_s": stats::mean(&sorted),
                "p99_fct_s": stats::percentile_sorted(&sorted, 99.0), "max_fct_s": sorted.last().copied().unwrap_or(0.0),
                "ideal_fct_s": 1.0, "retrans_per_flow": 0.0, "flows_failed": 0, "host_qdisc_drops": 0,
                "agent": {"dropped_horizon": 0},
            },
            "fct_s": sorted,
        })
    }

    /// N* is the first N at which pacing stops beating unpaced by the tolerance, after it did
    /// at a smaller N; a paced value of zero against a positive one helps.
    #[test]
    fn n_star_is_where_pacing_stops_helping() {
        let (star, ratios) = n_star(&[(1, 3.0, 1.0), (4, 2.0, 1.0), (8, 1.02, 1.0), (16, 2.0, 1.0)]);
        assert_eq!(star, NStar::At(8));
        assert_eq!(ratios[0], (1, Some(3.0)));
        assert_eq!(
            n_star(&[(1, 1.0, 1.0), (4, 1.5, 1.0), (8, 1.2, 1.0)]).0,
            NStar::Beyond
        );
        assert_eq!(NStar::Beyond.text(8), "> 8");
        assert_eq!(
            n_star(&[(1, 1.0 + TOLERANCE / 2.0, 1.0), (4, 0.5, 1.0)]).0,
            NStar::NeverHelped
        );
        // Drops: none paced against some unpaced helps; none in both does not.
        let (star, ratios) = n_star(&[(1, 0.02, 0.0), (4, 0.0, 0.0), (8, 0.05, 0.01)]);
        assert_eq!(star, NStar::At(4));
        assert_eq!(ratios, vec![(1, None), (4, Some(1.0)), (8, Some(5.0))]);
        assert_eq!(ratio(0.0, 0.5), Some(0.0));
        // Nothing measured in both modes (a repetition cut short): not "never helped".
        assert_eq!(n_star(&[]).0, NStar::NotMeasured);
        assert_eq!(NStar::NotMeasured.text(8), "-");
    }

    /// Cells pool the repetitions' flows for the FCTs (so the pooled p99 is not the maximum
    /// past 100 flows), average the rest with its range, and N* comes out pooled and per
    /// repetition; another buffer's points stay apart.
    #[test]
    fn repetitions_pool_and_n_star_per_repetition() {
        let fcts = |base: f64, k: usize| (0..k).map(|i| base + i as f64 * 0.001).collect::<Vec<_>>();
        let fcts_rep = |base: f64, rep: usize| fcts(base + rep as f64 * 1e-4, 40);
        let mut pts = Vec::new();
        for rep in 0..3 {
            // rep 2: pacing stops helping already at N = 4.
            let at4 = if rep == 2 { 1.0 } else { 2.0 };
            for (n, u, p) in [(1, 3.0, 1.0), (4, at4, 1.0), (8, 1.0, 1.0)] {
                pts.push(point(
                    rep,
                    3,
                    Mode::Unpaced,
                    n,
                    &fcts_rep(u, rep),
                    0.01 * (rep + 1) as f64,
                ));
                pts.push(point(rep, 3, Mode::PerFlow, n, &fcts_rep(p, rep), 0.0));
            }
        }
        pts.push(point(0, 12, Mode::Unpaced, 1, &fcts(9.0, 5), 0.0));
        pts.push(json!({"kind": NAME, "tags": {"mode": "unpaced"}, "error": "failed"}));
        let recs = records(&pts);
        assert_eq!(recs.len(), 19, "the errored point is left out");
        let cells = cells(&recs);
        let c = cells
            .iter()
            .find(|c| c.buffer_pkts == 3 && c.n == 1 && c.mode == "unpaced")
            .unwrap();
        assert_eq!((c.reps, c.flows), (3, 120));
        assert!(!c.p99_is_max && c.p99_fct_s < c.max_fct_s, "{c:?}");
        assert!((c.drop_rate.mean - 0.02).abs() < 1e-12, "{c:?}");
        assert_eq!((c.drop_rate.min, c.drop_rate.max), (0.01, 0.03));
        let small = cells.iter().find(|c| c.buffer_pkts == 12).unwrap();
        assert!(small.p99_is_max && small.flows == 5);
        let stars = stars(&recs, &cells, &|b| b as f64 / 165.0);
        let p99 = stars
            .iter()
            .find(|s| s.buffer_pkts == 3 && s.metric == Metric::P99Fct)
            .unwrap();
        assert_eq!(p99.pooled, NStar::At(8));
        assert_eq!(p99.by_rep, vec![NStar::At(8), NStar::At(8), NStar::At(4)]);
        assert_eq!(p99.by_rep_text, "8, 8, 4");
        let drops = stars.iter().find(|s| s.metric == Metric::Drops).unwrap();
        assert_eq!(drops.pooled, NStar::Beyond, "paced never dropped");
        assert!(
            stars.iter().all(|s| s.buffer_pkts == 3),
            "buffer 12 has no paced points"
        );
        let md = markdown(
            &Config::new(true),
            &json!({"bdp_frames": 165.0}),
            &cells,
            &stars,
            true,
            1.0,
        );
        assert!(md.contains("| 3 (1.8%)") && md.contains("8, 8, 4"), "{md}");
    }
}
