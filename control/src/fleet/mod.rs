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

mod report;
pub use report::*;

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

pub(crate) fn agent_http() -> ureq::Agent {
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
pub(crate) fn prom_api<S: serde::de::DeserializeOwned>(
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
