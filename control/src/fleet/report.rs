//! `paceline fleet report`: a period's availability, rejected and degraded time, convergence
//! and top classes, from Prometheus' range and instant queries.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::{Inventory, agent_http, from_prometheus, prom_api, prom_query};

/// One agent's figures over a report's period (`paceline fleet report`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostReport {
    pub instance: String,
    pub group: String,
    /// The share of the period's points (those at which Prometheus had it as a target) at
    /// which its scrape reached it (`up`), and the seconds it was not reached.
    pub availability: f64,
    pub down_seconds: f64,
    /// Seconds it was degraded, and seconds its last reload stood rejected.
    pub degraded_seconds: f64,
    pub rejected_seconds: f64,
    /// Policies applied in the period, and the hash in force at its end.
    pub policy_changes: u64,
    pub hash: String,
}

/// A class's figures over the period.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassReport {
    pub instance: String,
    pub class: String,
    pub value: f64,
}

/// `paceline fleet report`: inventory, availability, convergence and the top classes over a
/// period, from Prometheus.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    pub prometheus: String,
    pub period_seconds: u64,
    /// The range queries' step: each host's seconds are counted to this resolution.
    pub step_seconds: u64,
    /// Unix seconds of the end of the period.
    pub at: f64,
    pub inventory: Inventory,
    pub hosts: Vec<HostReport>,
    /// Per group: the policy hashes in force at the end (more than one: not converged).
    pub groups: BTreeMap<String, BTreeSet<String>>,
    /// The ten classes that dropped most packets, and that added most delay (seconds).
    pub top_drops: Vec<ClassReport>,
    pub top_delay: Vec<ClassReport>,
}

#[derive(Deserialize)]
struct PromRangeSeries {
    metric: BTreeMap<String, String>,
    values: Vec<(f64, String)>,
}

/// One series of a range query: its labels and its points (unix seconds, value).
#[derive(Clone, Debug, PartialEq)]
pub struct RangeSeries {
    pub labels: BTreeMap<String, String>,
    pub points: Vec<(f64, f64)>,
}

/// One range query against Prometheus' HTTP API, from `start` to `end` (unix seconds) every
/// `step` seconds.
pub fn prom_range(
    http: &ureq::Agent,
    base: &str,
    query: &str,
    start: f64,
    end: f64,
    step: f64,
) -> Result<Vec<RangeSeries>> {
    let params = [
        ("start", format!("{start:.3}")),
        ("end", format!("{end:.3}")),
        ("step", format!("{step}")),
    ];
    Ok(
        prom_api::<PromRangeSeries>(http, base, "/api/v1/query_range", query, &params)?
            .into_iter()
            .map(|s| RangeSeries {
                labels: s.metric,
                points: s
                    .values
                    .into_iter()
                    .map(|(t, v)| (t, v.parse().unwrap_or(f64::NAN)))
                    .collect(),
            })
            .collect(),
    )
}

/// The step of a report's range queries: about 2,000 points over the period (Prometheus
/// answers at most 11,000 per series), never finer than a second.
pub fn report_step(period_secs: u64) -> u64 {
    (period_secs / 2000).max(1)
}

/// What a host's range series say over a report's period, each point standing for `step`
/// seconds: seconds with `up` 1 and 0 (points where Prometheus had no sample of it are
/// neither: the host was not a target then), seconds degraded, seconds with the last reload
/// rejected (`paceline_policy_last_reload_success` 0), and how often the policy's load
/// time changed (policies applied; an agent's start is not a change).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostSeconds {
    pub up: f64,
    pub down: f64,
    pub degraded: f64,
    pub rejected: f64,
    pub changes: u64,
}

impl HostSeconds {
    /// Sums the points of one host's series.
    pub fn from_points(
        step: f64,
        up: &[(f64, f64)],
        degraded: &[(f64, f64)],
        success: &[(f64, f64)],
        loaded: &[(f64, f64)],
    ) -> Self {
        let count =
            |pts: &[(f64, f64)], f: fn(f64) -> bool| pts.iter().filter(|p| f(p.1)).count() as f64 * step;
        HostSeconds {
            up: count(up, |v| v >= 1.0),
            down: count(up, |v| v < 1.0),
            degraded: count(degraded, |v| v >= 1.0),
            rejected: count(success, |v| v < 1.0),
            changes: loaded.windows(2).filter(|w| w[0].1 != w[1].1).count() as u64,
        }
    }
}

/// Builds the report for the last `period_secs` from Prometheus: range queries over the
/// period for the per-host figures (so time is counted where it passed, also for a host
/// added during the period), instant queries for the top classes.
pub fn report(base: &str, job: &str, period_secs: u64) -> Result<Report> {
    let inventory = from_prometheus(base, job)?;
    let http = agent_http();
    let end = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
        .floor();
    let step = report_step(period_secs);
    let start = end - period_secs as f64;
    let sel = format!("job={job:?}");
    let by_instance = |metric: &str| -> Result<BTreeMap<String, Vec<(f64, f64)>>> {
        let mut m: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for s in prom_range(
            &http,
            base,
            &format!("{metric}{{{sel}}}"),
            start,
            end,
            step as f64,
        )? {
            let instance = s.labels.get("instance").cloned().unwrap_or_default();
            m.entry(instance).or_default().extend(s.points);
        }
        for v in m.values_mut() {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        Ok(m)
    };
    let up = by_instance("up")?;
    let degraded = by_instance("paceline_enforcement_degraded")?;
    let success = by_instance("paceline_policy_last_reload_success")?;
    let loaded = by_instance("paceline_policy_loaded_timestamp_seconds")?;
    let r = format!("{period_secs}s");
    let top = |metric: &str| -> Result<Vec<ClassReport>> {
        let mut v: Vec<ClassReport> = prom_query(
            &http,
            base,
            &format!("topk(10, sum by (instance, class) (increase({metric}{{{sel}}}[{r}])) > 0)"),
        )?
        .into_iter()
        .map(|s| ClassReport {
            instance: s.labels.get("instance").cloned().unwrap_or_default(),
            class: s.labels.get("class").cloned().unwrap_or_default(),
            value: s.value,
        })
        .collect();
        v.sort_by(|a, b| b.value.total_cmp(&a.value).then(a.instance.cmp(&b.instance)));
        Ok(v)
    };
    let top_drops = top("paceline_class_dropped_packets_total")?;
    let top_delay = top("paceline_class_added_delay_seconds_total")?;
    let none: Vec<(f64, f64)> = Vec::new();
    let hosts = inventory
        .agents
        .iter()
        .map(|a| {
            let pts = |m: &BTreeMap<String, Vec<(f64, f64)>>| m.get(&a.instance).unwrap_or(&none).clone();
            let s = HostSeconds::from_points(
                step as f64,
                &pts(&up),
                &pts(&degraded),
                &pts(&success),
                &pts(&loaded),
            );
            HostReport {
                instance: a.instance.clone(),
                group: a.group.clone(),
                availability: if s.up + s.down > 0.0 {
                    s.up / (s.up + s.down)
                } else {
                    0.0
                },
                down_seconds: s.down,
                degraded_seconds: s.degraded,
                rejected_seconds: s.rejected,
                policy_changes: s.changes,
                hash: a.hash.clone(),
            }
        })
        .collect();
    let mut groups: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for a in inventory.agents.iter().filter(|a| !a.hash.is_empty()) {
        groups.entry(a.group.clone()).or_default().insert(a.hash.clone());
    }
    Ok(Report {
        prometheus: base.to_string(),
        period_seconds: period_secs,
        step_seconds: step,
        at: end,
        inventory,
        hosts,
        groups,
        top_drops,
        top_delay,
    })
}

fn dur(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// The report as Markdown.
pub fn render_report(r: &Report) -> String {
    let mut o = format!(
        "# paceline fleet report\n\nThe last {} up to {} UTC, from {} (times to {}).\n\n",
        dur(r.period_seconds as f64),
        {
            let (d, t) = crate::runtime::events::utc(r.at as i64);
            format!("{d} {t}")
        },
        r.prometheus,
        dur(r.step_seconds as f64)
    );
    o.push_str("## Availability\n\n| group | instance | up | down | degraded | last reload rejected | policies applied | policy |\n|---|---|---|---|---|---|---|---|\n");
    for h in &r.hosts {
        o.push_str(&format!(
            "| {} | {} | {:.1}% | {} | {} | {} | {} | {} |\n",
            h.group,
            h.instance,
            h.availability * 100.0,
            dur(h.down_seconds),
            dur(h.degraded_seconds),
            dur(h.rejected_seconds),
            h.policy_changes,
            h.hash.get(..12).unwrap_or(&h.hash)
        ));
    }
    o.push_str("\n## Convergence\n\n");
    for (g, hashes) in &r.groups {
        let short: Vec<&str> = hashes.iter().map(|h| h.get(..12).unwrap_or(h)).collect();
        if hashes.len() == 1 {
            o.push_str(&format!("- group {g}: converged on {}\n", short[0]));
        } else {
            o.push_str(&format!(
                "- group {g}: **{} policies in force**: {}\n",
                hashes.len(),
                short.join(", ")
            ));
        }
    }
    for (title, rows, unit) in [
        ("Top classes by dropped packets", &r.top_drops, "packets"),
        ("Top classes by added delay", &r.top_delay, "seconds"),
    ] {
        o.push_str(&format!("\n## {title}\n\n"));
        if rows.is_empty() {
            o.push_str("none\n");
            continue;
        }
        o.push_str(&format!("| instance | class | {unit} |\n|---|---|---|\n"));
        for c in rows {
            o.push_str(&format!("| {} | {} | {:.3} |\n", c.instance, c.class, c.value));
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hosts_seconds_count_the_points_of_each_state_and_the_changes_of_its_load_time() {
        // Every 2 s from t=0 to t=18: up except at 6 and 8; no samples after 16 (not a target).
        let up: Vec<(f64, f64)> = (0..9)
            .map(|i| (2.0 * i as f64, if i == 3 || i == 4 { 0.0 } else { 1.0 }))
            .collect();
        let degraded = [(0.0, 0.0), (2.0, 1.0), (4.0, 1.0), (10.0, 0.0)];
        let success = [(0.0, 1.0), (2.0, 0.0), (4.0, 1.0)];
        // Loaded at 100, then 200 twice (no change), then 300: two policies applied.
        let loaded = [(0.0, 100.0), (2.0, 200.0), (4.0, 200.0), (10.0, 300.0)];
        let s = HostSeconds::from_points(2.0, &up, &degraded, &success, &loaded);
        assert_eq!(
            s,
            HostSeconds {
                up: 14.0,
                down: 4.0,
                degraded: 4.0,
                rejected: 2.0,
                changes: 2
            }
        );
        assert_eq!(
            HostSeconds::from_points(1.0, &[], &[], &[], &[]),
            HostSeconds::default()
        );
    }

    #[test]
    fn the_step_keeps_a_report_within_prometheus_points_per_series() {
        assert_eq!(report_step(60), 1);
        assert_eq!(report_step(86_400), 43);
        assert!(30 * 86_400 / report_step(30 * 86_400) <= 11_000);
    }

    #[test]
    fn the_report_names_each_host_a_split_group_and_the_top_classes() {
        let r = Report {
            prometheus: "http://prom:9090".into(),
            period_seconds: 3600,
            step_seconds: 1,
            at: 1_700_000_000.0,
            hosts: vec![HostReport {
                instance: "10.0.0.1:9977".into(),
                group: "main".into(),
                availability: 0.75,
                down_seconds: 900.0,
                degraded_seconds: 61.0,
                rejected_seconds: 0.0,
                policy_changes: 2,
                hash: "0123456789abcdef".into(),
            }],
            groups: [(
                "main".to_string(),
                ["aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb"].map(String::from).into(),
            )]
            .into(),
            top_drops: vec![ClassReport {
                instance: "10.0.0.1:9977".into(),
                class: "bulk".into(),
                value: 42.0,
            }],
            ..Default::default()
        };
        let md = render_report(&r);
        assert!(
            md.contains("The last 1h00m up to 2023-11-14 22:13:20 UTC"),
            "{md}"
        );
        assert!(
            md.contains("| main | 10.0.0.1:9977 | 75.0% | 15m00s | 1m01s | 0s | 2 | 0123456789ab |"),
            "{md}"
        );
        assert!(
            md.contains("group main: **2 policies in force**: aaaaaaaaaaaa, bbbbbbbbbbbb"),
            "{md}"
        );
        assert!(md.contains("| 10.0.0.1:9977 | bulk | 42.000 |"), "{md}");
        assert!(md.contains("## Top classes by added delay\n\nnone"), "{md}");
    }
}
