//! `paceline fleet status`: the inventory of many agents, built on what operators already run.
//!
//! - `--prometheus URL`: from the agents' info metrics as Prometheus holds them (one instant
//!   query per metric, job `paceline`);
//! - `--targets FILE`: where there is no Prometheus, from each agent's own `/metrics`, asked in
//!   parallel. FILE is in Prometheus' file_sd format (a list of `{targets: [...], labels:
//!   {...}}`, JSON or YAML), the same files a Prometheus would read. `/metrics` and not
//!   `/status`: the metrics listener is the one a fleet can reach; `/status` lives on the API
//!   listener, loopback unless configured otherwise.
//!
//! Both print the same table: host, group, version, kernel, enforcement mode, policy hash and
//! generations, last reload, degraded, unreachable; and flag each group whose agents run more
//! than one policy hash (a staged rollout in progress, or stuck). Exit status: 0 all reachable,
//! converged and healthy; 1 a group diverges, an agent is degraded or its last reload was
//! rejected; 2 invalid input, Prometheus unreachable, or an agent unreachable.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context as _, Result, anyhow, bail};
use serde::{Deserialize, Serialize};

/// One sample of the Prometheus text format or of an instant query.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses the Prometheus text exposition format (the lines that are samples).
pub fn parse_exposition(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name_end, mut labels) = match line.find('{') {
            Some(i)
                if line[..i]
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') =>
            {
                (i, BTreeMap::new())
            }
            _ => match line.find(' ') {
                Some(i) => (i, BTreeMap::new()),
                None => continue,
            },
        };
        let name = line[..name_end].to_string();
        let mut rest = &line[name_end..];
        if rest.starts_with('{') {
            // label="value" pairs; values may hold escaped quotes and commas.
            let b = rest.as_bytes();
            let mut i = 1;
            loop {
                while i < b.len() && (b[i] == b' ' || b[i] == b',') {
                    i += 1;
                }
                if i >= b.len() || b[i] == b'}' {
                    i += 1;
                    break;
                }
                let k0 = i;
                while i < b.len() && b[i] != b'=' {
                    i += 1;
                }
                let key = rest[k0..i].trim().to_string();
                i += 1; // '='
                if i >= b.len() || b[i] != b'"' {
                    break;
                }
                i += 1;
                let mut val = String::new();
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' && i + 1 < b.len() {
                        val.push(match b[i + 1] {
                            b'n' => '\n',
                            c => c as char,
                        });
                        i += 2;
                    } else {
                        let ch = rest[i..].chars().next().expect("in bounds");
                        val.push(ch);
                        i += ch.len_utf8();
                    }
                }
                i += 1;
                labels.insert(key, val);
            }
            rest = rest.get(i..).unwrap_or("");
        }
        let Some(v) = rest.split_whitespace().next() else {
            continue;
        };
        let value = match v {
            "NaN" => f64::NAN,
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => match v.parse() {
                Ok(x) => x,
                Err(_) => continue,
            },
        };
        out.push(Sample { name, labels, value });
    }
    out
}

/// One agent in the inventory.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Agent {
    pub instance: String,
    pub group: String,
    /// Why it could not be asked (connection refused, `up == 0`, ...).
    pub unreachable: Option<String>,
    pub version: String,
    pub kernel: String,
    pub mode: String,
    pub interfaces: Vec<String>,
    pub policy_name: String,
    pub hash: String,
    /// The agent's policy generation (since it started) and history generation (since the
    /// state directory was created).
    pub generation: String,
    pub history_generation: String,
    pub last_reload_ok: Option<bool>,
    /// Unix seconds the policy in force was applied.
    pub loaded_at: Option<f64>,
    pub degraded: bool,
    /// Kernel features the agent reports missing.
    pub missing_features: Vec<String>,
}

/// A group whose agents run more than one policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    pub group: String,
    /// hash -> agents running it.
    pub hashes: BTreeMap<String, Vec<String>>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Inventory {
    pub agents: Vec<Agent>,
    pub divergent: Vec<Divergence>,
}

impl Inventory {
    /// The agents (unordered), with the divergent groups found.
    pub fn new(mut agents: Vec<Agent>) -> Inventory {
        agents.sort_by(|a, b| (&a.group, &a.instance).cmp(&(&b.group, &b.instance)));
        let mut by_group: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
        for a in agents
            .iter()
            .filter(|a| a.unreachable.is_none() && !a.hash.is_empty())
        {
            by_group
                .entry(a.group.clone())
                .or_default()
                .entry(a.hash.clone())
                .or_default()
                .push(a.instance.clone());
        }
        let divergent = by_group
            .into_iter()
            .filter(|(_, h)| h.len() > 1)
            .map(|(group, hashes)| Divergence { group, hashes })
            .collect();
        Inventory { agents, divergent }
    }

    /// 2: an agent unreachable; 1: a group diverges, or an agent is degraded or rejected its
    /// last reload; 0: all converged and healthy.
    pub fn exit_code(&self) -> i32 {
        if self.agents.iter().any(|a| a.unreachable.is_some()) {
            2
        } else if !self.divergent.is_empty()
            || self
                .agents
                .iter()
                .any(|a| a.degraded || a.last_reload_ok == Some(false))
        {
            1
        } else {
            0
        }
    }
}

/// The agent of `instance` from its samples (its own `/metrics`, or Prometheus' series).
pub fn agent_from_samples(instance: &str, group: &str, samples: &[Sample]) -> Agent {
    let mut a = Agent {
        instance: instance.to_string(),
        group: group.to_string(),
        ..Default::default()
    };
    let label = |s: &Sample, k: &str| s.labels.get(k).cloned().unwrap_or_default();
    let mut ifaces = BTreeSet::new();
    for s in samples {
        match s.name.as_str() {
            "paceline_build_info" => a.version = label(s, "version"),
            "paceline_kernel_info" => a.kernel = label(s, "release"),
            "paceline_policy_info" => {
                a.policy_name = label(s, "name");
                a.hash = label(s, "hash");
                a.generation = label(s, "generation");
            }
            "paceline_policy_history_generation" => a.history_generation = format!("{}", s.value),
            "paceline_policy_last_reload_success" => a.last_reload_ok = Some(s.value == 1.0),
            "paceline_policy_loaded_timestamp_seconds" => a.loaded_at = Some(s.value),
            "paceline_enforcement_degraded" => a.degraded = s.value == 1.0,
            "paceline_interface_info" => {
                a.mode = label(s, "mode");
                ifaces.insert(label(s, "interface"));
            }
            "paceline_kernel_feature" if s.value == 0.0 => a.missing_features.push(label(s, "feature")),
            _ => {}
        }
    }
    a.interfaces = ifaces.into_iter().collect();
    a
}

/// One target group of a file_sd file.
#[derive(Clone, Debug, Deserialize)]
pub struct TargetGroup {
    pub targets: Vec<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// Reads a Prometheus file_sd file (JSON or YAML).
pub fn read_targets(path: &std::path::Path) -> Result<Vec<TargetGroup>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let groups: Vec<TargetGroup> = serde_yaml::from_str(&text).with_context(|| {
        format!(
            "{}: not a Prometheus file_sd list of {{targets, labels}}",
            path.display()
        )
    })?;
    if groups.iter().all(|g| g.targets.is_empty()) {
        bail!("{}: no targets", path.display());
    }
    Ok(groups)
}

/// The API addresses of a group's agents in a file_sd file: each target's host with the
/// API's port (the targets are the agents' metrics addresses).
pub fn group_api_addrs(groups: &[TargetGroup], group: &str, api_port: u16) -> Vec<String> {
    api_addrs(groups, Some(group), api_port)
        .into_iter()
        .map(|(addr, _)| addr)
        .collect()
}

/// Every agent of a file_sd file (or of one group) as (API address, group).
pub fn api_addrs(groups: &[TargetGroup], group: Option<&str>, api_port: u16) -> Vec<(String, String)> {
    groups
        .iter()
        .filter(|g| group.is_none() || g.labels.get("group").map(String::as_str) == group)
        .flat_map(|g| {
            let name = g.labels.get("group").cloned().unwrap_or_default();
            g.targets.iter().map(move |t| (t, name.clone()))
        })
        .map(|(t, group)| {
            let host = match t.rsplit_once(':') {
                // [v6]:port or host:port; a bare v6 address has more colons than one.
                Some((h, p)) if p.parse::<u16>().is_ok() && (h.starts_with('[') || !h.contains(':')) => h,
                _ => t.as_str(),
            };
            let addr = if host.contains(':') && !host.starts_with('[') {
                format!("[{host}]:{api_port}")
            } else {
                format!("{host}:{api_port}")
            };
            (addr, group)
        })
        .collect()
}

/// One agent in a backup's manifest (`paceline fleet backup`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackedUp {
    /// The agent's API address.
    pub host: String,
    pub group: String,
    /// The running policy's hash (sha256 of its text) and history generation.
    pub hash: String,
    pub generation: Option<u64>,
    /// The running policy's file, relative to the backup directory.
    pub policy: String,
    /// Its history (newest first), each entry's text in `file`.
    pub history: Vec<BackedUpEntry>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackedUpEntry {
    pub generation: u64,
    pub hash: String,
    pub applied_at: u64,
    pub source: String,
    pub file: String,
}

/// A backup's `manifest.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Unix seconds.
    pub taken_at: u64,
    pub agents: Vec<BackedUp>,
    /// Agents that could not be backed up, with why.
    pub unreachable: Vec<(String, String)>,
}

/// A host's directory name in a backup (its API address with `:`, `[` and `]` replaced).
pub fn backup_dir_name(host: &str) -> String {
    host.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The newest history entry whose hash starts with `prefix` (at least 6 characters).
pub fn find_in_history<'a>(
    entries: &'a [crate::runtime::history::Entry],
    prefix: &str,
) -> Option<&'a crate::runtime::history::Entry> {
    if prefix.len() < 6 {
        return None;
    }
    entries
        .iter()
        .filter(|e| e.hash.starts_with(prefix))
        .max_by_key(|e| e.generation)
}

/// The policy most agents run: its hash, how many run it, and the first of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Majority<'a> {
    pub hash: String,
    pub count: usize,
    pub agent: &'a str,
}

/// The majority of (agent, policy text) pairs, by the policy's hash; a tie goes to the hash
/// whose first agent comes first. `None` for no agents.
pub fn majority<'a>(texts: impl Iterator<Item = (&'a str, &'a str)>) -> Option<Majority<'a>> {
    let mut by_hash: Vec<Majority<'a>> = Vec::new();
    for (agent, text) in texts {
        let h = paceline_policy::hash(text.as_bytes());
        match by_hash.iter_mut().find(|m| m.hash == h) {
            Some(m) => m.count += 1,
            None => by_hash.push(Majority {
                hash: h,
                count: 1,
                agent,
            }),
        }
    }
    // max_by_key keeps the last of equals: reverse so that the first seen wins a tie.
    by_hash.into_iter().rev().max_by_key(|m| m.count)
}

fn agent_http() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(std::time::Duration::from_secs(5)))
        .http_status_as_error(false)
        .build()
        .into()
}

/// Asks every target's `/metrics`, in parallel.
pub fn from_targets(groups: &[TargetGroup]) -> Inventory {
    let jobs: Vec<(String, String)> = groups
        .iter()
        .flat_map(|g| {
            let group = g.labels.get("group").cloned().unwrap_or_default();
            g.targets.iter().map(move |t| (t.clone(), group.clone()))
        })
        .collect();
    let http = agent_http();
    let agents = std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|(target, group)| {
                let http = http.clone();
                s.spawn(move || {
                    let url = format!("http://{target}/metrics");
                    let got = http
                        .get(&url)
                        .call()
                        .map_err(|e| e.to_string())
                        .and_then(|mut r| {
                            if r.status() != 200 {
                                return Err(format!("HTTP {}", r.status()));
                            }
                            r.body_mut().read_to_string().map_err(|e| e.to_string())
                        });
                    match got {
                        Ok(text) => {
                            let a = agent_from_samples(target, group, &parse_exposition(&text));
                            if a.hash.is_empty() {
                                Agent {
                                    unreachable: Some("answers, but not with paceline's metrics".into()),
                                    ..a
                                }
                            } else {
                                a
                            }
                        }
                        Err(e) => Agent {
                            instance: target.clone(),
                            group: group.clone(),
                            unreachable: Some(e),
                            ..Default::default()
                        },
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a target thread panicked"))
            .collect::<Vec<_>>()
    });
    Inventory::new(agents)
}

/// The metrics asked from Prometheus, one instant query each.
const QUERIES: &[&str] = &[
    "paceline_build_info",
    "paceline_kernel_info",
    "paceline_policy_info",
    "paceline_policy_history_generation",
    "paceline_policy_last_reload_success",
    "paceline_policy_loaded_timestamp_seconds",
    "paceline_enforcement_degraded",
    "paceline_interface_info",
    "paceline_kernel_feature",
];

/// An answer of Prometheus' query API: `result` holds series of `S` (instant or range).
#[derive(Deserialize)]
struct PromResponse<S> {
    status: String,
    #[serde(default)]
    error: Option<String>,
    #[serde(default = "Option::default")]
    data: Option<PromData<S>>,
}

#[derive(Deserialize)]
struct PromData<S> {
    result: Vec<S>,
}

#[derive(Deserialize)]
struct PromSeries {
    metric: BTreeMap<String, String>,
    value: (f64, String),
}

/// Asks Prometheus' API at `path` (`/api/v1/query`, `/api/v1/query_range`) for `query` with
/// the other parameters `params`; the series of its result.
fn prom_api<S: serde::de::DeserializeOwned>(
    http: &ureq::Agent,
    base: &str,
    path: &str,
    query: &str,
    params: &[(&str, String)],
) -> Result<Vec<S>> {
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let mut req = http.get(&url).query("query", query);
    for (k, v) in params {
        req = req.query(*k, v);
    }
    let mut r = req
        .call()
        .with_context(|| format!("asking Prometheus at {url}"))?;
    let body: PromResponse<S> = r
        .body_mut()
        .read_json()
        .with_context(|| format!("{url}: not a Prometheus API answer"))?;
    if body.status != "success" {
        bail!("Prometheus: {query}: {}", body.error.unwrap_or_default());
    }
    Ok(body.data.map(|d| d.result).unwrap_or_default())
}

/// One instant query against Prometheus' HTTP API.
pub fn prom_query(http: &ureq::Agent, base: &str, query: &str) -> Result<Vec<Sample>> {
    Ok(prom_api::<PromSeries>(http, base, "/api/v1/query", query, &[])?
        .into_iter()
        .map(|s| Sample {
            name: s
                .metric
                .get("__name__")
                .cloned()
                .unwrap_or_else(|| query.to_string()),
            value: s.value.1.parse().unwrap_or(f64::NAN),
            labels: s.metric,
        })
        .collect())
}

/// The inventory from Prometheus: `up{job="paceline"}` lists the agents, the info metrics
/// describe them.
pub fn from_prometheus(base: &str, job: &str) -> Result<Inventory> {
    let http = agent_http();
    let up = prom_query(&http, base, &format!("up{{job={job:?}}}"))?;
    if up.is_empty() {
        return Err(anyhow!(
            "Prometheus at {base} has no target in job {job:?} (is the scrape job named {job}?)"
        ));
    }
    let mut samples: Vec<Sample> = Vec::new();
    for q in QUERIES {
        samples.extend(prom_query(&http, base, &format!("{q}{{job={job:?}}}"))?);
    }
    let agents = up
        .iter()
        .map(|u| {
            let instance = u.labels.get("instance").cloned().unwrap_or_default();
            let group = u.labels.get("group").cloned().unwrap_or_default();
            let mine: Vec<Sample> = samples
                .iter()
                .filter(|s| s.labels.get("instance") == Some(&instance))
                .cloned()
                .collect();
            let mut a = agent_from_samples(&instance, &group, &mine);
            if u.value != 1.0 {
                a.unreachable = Some("down in Prometheus (up == 0)".into());
            }
            a
        })
        .collect();
    Ok(Inventory::new(agents))
}

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

/// The inventory as `paceline fleet status` prints it.
pub fn render(inv: &Inventory, now: f64) -> String {
    let mut o = format!(
        "{:<10} {:<24} {:<8} {:<22} {:<7} {:<14} {:<12} {:>4} {:>5} {:<16} {}\n",
        "GROUP",
        "INSTANCE",
        "VERSION",
        "KERNEL",
        "MODE",
        "POLICY",
        "HASH",
        "GEN",
        "HIST",
        "LAST RELOAD",
        "STATE"
    );
    for a in &inv.agents {
        if let Some(why) = &a.unreachable {
            o.push_str(&format!(
                "{:<10} {:<24} {:<8} {:<22} {:<7} {:<14} {:<12} {:>4} {:>5} {:<16} UNREACHABLE: {why}\n",
                or_dash(&a.group),
                a.instance,
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-"
            ));
            continue;
        }
        let last = match (a.last_reload_ok, a.loaded_at) {
            (Some(false), _) => "REJECTED".to_string(),
            (_, Some(t)) => format!("ok {} ago", ago(now - t)),
            _ => "-".into(),
        };
        let mut state = Vec::new();
        if a.degraded {
            state.push("DEGRADED".to_string());
        }
        if !a.missing_features.is_empty() {
            state.push(format!("kernel lacks {}", a.missing_features.join(",")));
        }
        if inv.divergent.iter().any(|d| d.group == a.group) {
            state.push("group diverges".into());
        }
        o.push_str(&format!(
            "{:<10} {:<24} {:<8} {:<22} {:<7} {:<14} {:<12} {:>4} {:>5} {:<16} {}\n",
            or_dash(&a.group),
            a.instance,
            or_dash(&a.version),
            or_dash(&a.kernel),
            or_dash(&a.mode),
            or_dash(&a.policy_name),
            a.hash.chars().take(12).collect::<String>(),
            or_dash(&a.generation),
            or_dash(&a.history_generation),
            last,
            if state.is_empty() {
                "ok".into()
            } else {
                state.join("; ")
            }
        ));
    }
    for d in &inv.divergent {
        o.push_str(&format!(
            "\ngroup {}: {} policies in force (a staged rollout in progress, or stuck):\n",
            or_dash(&d.group),
            d.hashes.len()
        ));
        for (h, who) in &d.hashes {
            o.push_str(&format!(
                "  {} on {}: {}\n",
                h.chars().take(12).collect::<String>(),
                who.len(),
                who.join(", ")
            ));
        }
    }
    let unreachable = inv.agents.iter().filter(|a| a.unreachable.is_some()).count();
    o.push_str(&format!(
        "\n{} agents, {} unreachable, {} divergent groups\n",
        inv.agents.len(),
        unreachable,
        inv.divergent.len()
    ));
    o
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

fn ago(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    if s < 120 {
        format!("{s}s")
    } else if s < 7200 {
        format!("{}m", s / 60)
    } else if s < 172_800 {
        format!("{}h", s / 3600)
    } else {
        format!("{}d", s / 86_400)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_groups_api_addresses_are_its_targets_hosts_at_the_api_port() {
        let groups: Vec<TargetGroup> = serde_yaml::from_str(
            "- targets: ['10.0.0.1:9977', 'node-b:9977', '[fd00::3]:9977']\n  labels: {group: main}\n- targets: ['10.0.0.9:9977']\n  labels: {group: canary}\n",
        )
        .unwrap();
        assert_eq!(
            group_api_addrs(&groups, "main", 9978),
            ["10.0.0.1:9978", "node-b:9978", "[fd00::3]:9978"]
        );
        assert_eq!(group_api_addrs(&groups, "canary", 1234), ["10.0.0.9:1234"]);
        assert!(group_api_addrs(&groups, "other", 9978).is_empty());
    }

    #[test]
    fn the_majority_is_the_most_run_policy_and_a_tie_goes_to_the_first() {
        let m = majority([("a", "x"), ("b", "y"), ("c", "y")].into_iter()).unwrap();
        assert_eq!((m.agent, m.count), ("b", 2));
        assert_eq!(m.hash, paceline_policy::hash(b"y"));
        let m = majority([("a", "x"), ("b", "y")].into_iter()).unwrap();
        assert_eq!((m.agent, m.count), ("a", 1));
        assert!(majority(std::iter::empty()).is_none());
    }

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

    const METRICS: &str = r#"# HELP paceline_build_info The agent's version (value 1).
# TYPE paceline_build_info gauge
paceline_build_info{version="0.1.0"} 1
paceline_kernel_info{release="6.1.0-18-amd64"} 1
paceline_policy_info{generation="3",hash="abcdef0123456789",name="web, \"edge\""} 1
paceline_policy_last_reload_success 0
paceline_policy_loaded_timestamp_seconds 1700000000
paceline_enforcement_degraded 1
paceline_interface_info{attach="tcx",interface="eth0",mode="htb",qdisc="htb"} 1
paceline_kernel_feature{feature="sch_fq"} 0
paceline_kernel_feature{feature="tcx"} 1
paceline_class_added_delay_seconds_total{class="a",level="b"} NaN
"#;

    #[test]
    fn parses_the_exposition_format() {
        let s = parse_exposition(METRICS);
        assert_eq!(s.len(), 10);
        assert_eq!(s[2].labels["name"], "web, \"edge\"");
        assert_eq!(s[3].value, 0.0);
        assert!(s[9].value.is_nan());
        let a = agent_from_samples("n1:9977", "canary", &s);
        assert_eq!(a.hash, "abcdef0123456789");
        assert_eq!(
            (a.version.as_str(), a.kernel.as_str(), a.mode.as_str()),
            ("0.1.0", "6.1.0-18-amd64", "htb")
        );
        assert_eq!(a.last_reload_ok, Some(false));
        assert!(a.degraded);
        assert_eq!(a.missing_features, ["sch_fq"]);
        assert_eq!(a.interfaces, ["eth0"]);
    }

    fn agent(i: &str, g: &str, h: &str) -> Agent {
        Agent {
            instance: i.into(),
            group: g.into(),
            hash: h.into(),
            last_reload_ok: Some(true),
            ..Default::default()
        }
    }

    #[test]
    fn divergent_groups_and_exit_codes() {
        let inv = Inventory::new(vec![
            agent("a", "main", "h1"),
            agent("b", "main", "h1"),
            agent("c", "canary", "h2"),
        ]);
        assert!(inv.divergent.is_empty(), "groups may differ from each other");
        assert_eq!(inv.exit_code(), 0);
        let inv = Inventory::new(vec![agent("a", "main", "h1"), agent("b", "main", "h2")]);
        assert_eq!(inv.divergent.len(), 1);
        assert_eq!(inv.divergent[0].hashes["h2"], ["b"]);
        assert_eq!(inv.exit_code(), 1);
        assert!(render(&inv, 0.0).contains("group main: 2 policies in force"));
        let mut down = agent("d", "main", "");
        down.unreachable = Some("connection refused".into());
        let inv = Inventory::new(vec![agent("a", "main", "h1"), down]);
        assert_eq!(inv.exit_code(), 2);
        assert!(render(&inv, 0.0).contains("UNREACHABLE: connection refused"));
    }

    #[test]
    fn unreachable_targets_are_listed_not_fatal() {
        // Port 1 on loopback: nothing listens.
        let inv = from_targets(&[TargetGroup {
            targets: vec!["127.0.0.1:1".into()],
            labels: [("group".to_string(), "g".to_string())].into(),
        }]);
        assert_eq!(inv.agents.len(), 1);
        assert!(inv.agents[0].unreachable.is_some());
        assert_eq!(inv.exit_code(), 2);
    }
}
