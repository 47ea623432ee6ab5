//! `paceline fleet status --prometheus URL | --targets FILE`, `paceline fleet diff`,
//! `paceline fleet backup`, `paceline fleet rollback`, `paceline fleet events`

use std::path::PathBuf;

use anyhow::Result;

use crate::fleet;

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// The inventory of the fleet's agents: host, group, version, kernel, enforcement, policy
    /// hash and generations, last reload, degraded, unreachable; groups whose agents run
    /// different policies are flagged. Exit 0 converged and healthy, 1 a group diverges or an
    /// agent is degraded or rejected its last reload, 2 invalid input or unreachable.
    Status(StatusArgs),
    /// What two agents enforce, compared as `policy diff` compares two files (their running
    /// policies compiled offline: levels, classes by name, rules); or, with `--group`, every
    /// agent of a group against the policy most of the group runs. Asks each agent's API
    /// (`/policy`), with the token of PACELINE_API_TOKEN_FILE. Exit 0 the same, 1 different
    /// (each change listed), 2 an agent unreachable or its policy invalid.
    Diff(DiffArgs),
    /// Writes every agent's running policy and its policy history into DIR
    /// (`<host>/policy.yaml`, `<host>/history/<generation>.yaml`) with `manifest.json` (host,
    /// group, hash, generation, time). Exit 0 all backed up, 2 an agent unreachable (the
    /// others still written).
    Backup(BackupArgs),
    /// Rolls a group back, one agent at a time, stopping at the first that fails: to the
    /// policy of `--to HASH` (a hash from a backup's manifest or `fleet status`, at least 6
    /// characters) where each agent's history holds it, else each to the newest policy of its
    /// history that differs from the one in force (`policy rollback`). An agent that runs that
    /// policy already is left alone. Exit 0 every agent rolled back (or already there), 1 one
    /// failed (the rest left as they were), 2 unreachable.
    Rollback(RollbackArgs),
    /// The agents' event logs merged in time order, each line with its host: starts, reloads
    /// (with their changes), rejections (with their errors), rollbacks, degraded, route
    /// changes, drops. Exit 0, 2 an agent unreachable (the others still shown).
    Events(EventsArgs),
    /// A report over a period, from Prometheus' range queries, as Markdown (or JSON): per
    /// host its availability (the share of the period its scrapes reached it) and down time,
    /// time degraded and with its last reload rejected, policies applied; per group whether
    /// it ended on one policy; the ten classes that dropped most and that added most delay.
    /// Exit 0, 2 Prometheus unreachable.
    Report(ReportArgs),
}

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// The Prometheus that scrapes the agents (e.g. http://prometheus:9090).
    #[arg(long, value_name = "URL")]
    pub prometheus: String,
    /// The scrape job of the agents.
    #[arg(long, default_value = "paceline")]
    pub job: String,
    /// The period: a duration up to now (`24h`, `7d`, `30m`).
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    pub since: std::time::Duration,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct EventsArgs {
    #[command(flatten)]
    pub agents: Agents,
    /// Only this group's agents.
    #[arg(long)]
    pub group: Option<String>,
    /// Only these agents (their API address, or the host part of it; repeatable).
    #[arg(long = "host", value_name = "HOST")]
    pub hosts: Vec<String>,
    /// Only events of these kinds (comma-separated: reload_applied,reload_rejected,...).
    #[arg(long, value_delimiter = ',')]
    pub kind: Vec<String>,
    /// Only events at or after this time: a duration before now (`1h`, `30m`, `2d`) or an RFC
    /// 3339 time (`2026-12-01T07:00:00Z`).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub since: Option<f64>,
    /// Only events before this time (as --since).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub until: Option<f64>,
    /// JSON lines: each event as the agent serves it, with `host` and `group` added.
    #[arg(long)]
    pub json: bool,
}

/// Unix seconds from a duration before now or an RFC 3339 time.
fn parse_time(s: &str) -> Result<f64, String> {
    let now = std::time::SystemTime::now();
    let t = match humantime::parse_duration(s) {
        Ok(d) => now.checked_sub(d).ok_or_else(|| format!("{s}: before 1970"))?,
        Err(_) => humantime::parse_rfc3339_weak(s).map_err(|e| {
            format!("{s}: neither a duration (1h, 30m, 2d) nor an RFC 3339 time (2026-12-01T07:00:00Z): {e}")
        })?,
    };
    Ok(t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0))
}

/// Where the agents are and how to ask them (`--targets`, `--api-port`, the token).
#[derive(clap::Args, Debug)]
pub struct Agents {
    /// A Prometheus file_sd file listing the agents' metrics addresses (as for `fleet
    /// status`); each agent's API is asked on the same host at --api-port.
    #[arg(long, value_name = "FILE")]
    pub targets: PathBuf,
    /// The agents' API port.
    #[arg(long, default_value_t = 9978)]
    pub api_port: u16,
    /// A copy of the agents' --api-token-file (`PACELINE_API_TOKEN_FILE`).
    #[arg(long = "token-file", value_name = "FILE", env = "PACELINE_API_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct BackupArgs {
    #[command(flatten)]
    pub agents: Agents,
    /// Only this group's agents.
    #[arg(long)]
    pub group: Option<String>,
    /// The directory to write (created; an existing manifest in it is replaced).
    pub dir: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct RollbackArgs {
    #[command(flatten)]
    pub agents: Agents,
    /// The group to roll back.
    #[arg(long)]
    pub group: String,
    /// The policy to go back to: its hash, or the first 6 or more characters of it.
    #[arg(long, value_name = "HASH")]
    pub to: Option<String>,
}

#[derive(clap::Args, Debug)]
pub struct DiffArgs {
    /// Two agents' API addresses (their --api-addr, HOST:PORT).
    #[arg(value_name = "AGENT", num_args = 0..=2, required_unless_present = "group")]
    pub agents: Vec<String>,
    /// Compare every agent of this group (the `group` label of --targets) with the group's
    /// majority policy.
    #[arg(long, requires = "targets", conflicts_with = "agents")]
    pub group: Option<String>,
    /// A Prometheus file_sd file listing the agents' metrics addresses (as for `fleet status`);
    /// each agent's API is asked on the same host at --api-port.
    #[arg(long, value_name = "FILE")]
    pub targets: Option<PathBuf>,
    /// The agents' API port (with --targets).
    #[arg(long, default_value_t = 9978)]
    pub api_port: u16,
    /// A copy of the agents' --api-token-file (`PACELINE_API_TOKEN_FILE`).
    #[arg(long = "token-file", value_name = "FILE", env = "PACELINE_API_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
#[group(required = true, multiple = false)]
pub struct Source {
    /// Read the inventory from this Prometheus (e.g. http://prometheus:9090): the agents'
    /// info metrics of job --job.
    #[arg(long, value_name = "URL")]
    pub prometheus: Option<String>,
    /// Ask every agent listed in this Prometheus file_sd file (JSON or YAML; the `group`
    /// label names the group) for its /metrics, in parallel.
    #[arg(long, value_name = "FILE")]
    pub targets: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub source: Source,
    /// The scrape job of the agents (with --prometheus).
    #[arg(long, default_value = "paceline")]
    pub job: String,
    /// Print the inventory as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(c: Command) -> Result<i32> {
    match c {
        Command::Status(a) => status(a),
        Command::Diff(a) => diff(a),
        Command::Backup(a) => backup(a),
        Command::Rollback(a) => rollback(a),
        Command::Events(a) => events(a),
        Command::Report(a) => report(a),
    }
}

fn report(a: ReportArgs) -> Result<i32> {
    let secs = a.since.as_secs().max(1);
    match fleet::report(&a.prometheus, &a.job, secs) {
        Ok(r) => {
            if a.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                print!("{}", fleet::render_report(&r));
            }
            Ok(0)
        }
        Err(e) => {
            eprintln!("paceline: {e:#}");
            Ok(2)
        }
    }
}

fn events(a: EventsArgs) -> Result<i32> {
    use crate::runtime::events::Event;
    let groups = match fleet::read_targets(&a.agents.targets) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("paceline: {e:#}");
            return Ok(2);
        }
    };
    let hosts: Vec<(String, String)> = fleet::api_addrs(&groups, a.group.as_deref(), a.agents.api_port)
        .into_iter()
        .filter(|(addr, _)| {
            a.hosts.is_empty()
                || a.hosts.iter().any(|h| {
                    h == addr
                        || addr
                            .rsplit_once(':')
                            .map(|(host, _)| host.trim_matches(['[', ']']))
                            == Some(h.trim_matches(['[', ']']))
                })
        })
        .collect();
    if hosts.is_empty() {
        eprintln!("paceline: {}: no agent matches", a.agents.targets.display());
        return Ok(2);
    }
    let logs: Vec<Result<String, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = hosts
            .iter()
            .map(|(host, _)| s.spawn(|| get_ok(&api(host, &a.agents.token_file), "/events")))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("the request thread panicked".into()))
            })
            .collect()
    });
    let mut code = 0;
    let mut all: Vec<(&str, &str, Event, serde_json::Value)> = Vec::new();
    for ((host, group), log) in hosts.iter().zip(logs) {
        let body = match log {
            Ok(b) => b,
            Err(e) => {
                eprintln!("paceline: {e}");
                code = 2;
                continue;
            }
        };
        for line in body.lines() {
            let (Ok(e), Ok(raw)) = (serde_json::from_str::<Event>(line), serde_json::from_str(line)) else {
                continue;
            };
            let keep = (a.kind.is_empty() || a.kind.contains(&e.kind))
                && a.since.is_none_or(|t| e.at >= t)
                && a.until.is_none_or(|t| e.at < t);
            if keep {
                all.push((host, group, e, raw));
            }
        }
    }
    // By time; one agent's events keep their order (seq) when their times are equal.
    all.sort_by(|x, y| {
        x.2.at
            .total_cmp(&y.2.at)
            .then(x.0.cmp(y.0))
            .then(x.2.seq.cmp(&y.2.seq))
    });
    let width = hosts.iter().map(|(h, _)| h.len()).max().unwrap_or(0);
    for (host, group, e, mut raw) in all {
        if a.json {
            raw["host"] = host.into();
            raw["group"] = group.into();
            println!("{raw}");
        } else {
            println!(
                "{host:<width$} {}",
                crate::runtime::events::render(&e).replace('\n', &format!("\n{:width$} ", ""))
            );
        }
    }
    Ok(code)
}

fn api(addr: &str, token_file: &Option<PathBuf>) -> super::ApiAddr {
    super::ApiAddr {
        addr: addr.to_string(),
        token_file: token_file.clone(),
    }
}

/// GET `path` from the agent at `addr`: the body of a 200, else why not.
fn get_ok(a: &super::ApiAddr, path: &str) -> Result<String, String> {
    match a.get_limited(path, paceline_policy::bounds::MAX_POLICY_BYTES) {
        Ok((200, body)) => Ok(body),
        Ok((code, body)) => Err(format!("{}{path}: HTTP {code}: {}", a.addr, body.trim())),
        Err(u) => Err(u.to_string()),
    }
}

/// An agent's policy history as `/history` serves it.
#[derive(serde::Deserialize)]
struct History {
    current_hash: String,
    entries: Vec<crate::runtime::history::Entry>,
}

fn history_of(a: &super::ApiAddr) -> Result<History, String> {
    let body = get_ok(a, "/history")?;
    serde_json::from_str(&body).map_err(|e| format!("{}/history: not a policy history: {e}", a.addr))
}

/// One agent's backup: its files written under `dir/<host>/`, its manifest entry returned.
fn backup_one(
    dir: &std::path::Path,
    host: &str,
    group: &str,
    token: &Option<PathBuf>,
) -> Result<fleet::BackedUp, String> {
    let a = api(host, token);
    let policy = get_ok(&a, "/policy")?;
    let h = history_of(&a)?;
    let name = fleet::backup_dir_name(host);
    let hdir = dir.join(&name).join("history");
    std::fs::create_dir_all(&hdir).map_err(|e| format!("creating {}: {e}", hdir.display()))?;
    let write = |rel: &str, text: &str| {
        let p = dir.join(rel);
        std::fs::write(&p, text).map_err(|e| format!("writing {}: {e}", p.display()))
    };
    let policy_rel = format!("{name}/policy.yaml");
    write(&policy_rel, &policy)?;
    let mut history = Vec::new();
    for e in &h.entries {
        let text = get_ok(&a, &format!("/history/{}", e.generation))?;
        let rel = format!("{name}/history/{}.yaml", e.generation);
        write(&rel, &text)?;
        history.push(fleet::BackedUpEntry {
            generation: e.generation,
            hash: e.hash.clone(),
            applied_at: e.applied_at,
            source: e.source.clone(),
            file: rel,
        });
    }
    let hash = paceline_policy::hash(policy.as_bytes());
    Ok(fleet::BackedUp {
        host: host.to_string(),
        group: group.to_string(),
        generation: fleet::find_in_history(&h.entries, &h.current_hash).map(|e| e.generation),
        hash,
        policy: policy_rel,
        history,
    })
}

fn backup(a: BackupArgs) -> Result<i32> {
    let groups = match fleet::read_targets(&a.agents.targets) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("paceline: {e:#}");
            return Ok(2);
        }
    };
    let hosts = fleet::api_addrs(&groups, a.group.as_deref(), a.agents.api_port);
    if hosts.is_empty() {
        eprintln!("paceline: {}: no agent to back up", a.agents.targets.display());
        return Ok(2);
    }
    if let Err(e) = std::fs::create_dir_all(&a.dir) {
        eprintln!("paceline: creating {}: {e}", a.dir.display());
        return Ok(2);
    }
    let results: Vec<Result<fleet::BackedUp, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = hosts
            .iter()
            .map(|(host, group)| s.spawn(|| backup_one(&a.dir, host, group, &a.agents.token_file)))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("the backup thread panicked".into()))
            })
            .collect()
    });
    let mut manifest = fleet::Manifest {
        taken_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        agents: Vec::new(),
        unreachable: Vec::new(),
    };
    for ((host, _), r) in hosts.iter().zip(results) {
        match r {
            Ok(b) => {
                println!(
                    "{host}: policy {} (generation {}), {} history entries",
                    &b.hash[..12],
                    b.generation.map_or("?".to_string(), |g| g.to_string()),
                    b.history.len()
                );
                manifest.agents.push(b);
            }
            Err(e) => {
                eprintln!("paceline: {e}");
                manifest.unreachable.push((host.clone(), e));
            }
        }
    }
    let path = a.dir.join("manifest.json");
    std::fs::write(&path, serde_json::to_string_pretty(&manifest)? + "\n")
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    println!(
        "{}: {} agents backed up, {} unreachable",
        path.display(),
        manifest.agents.len(),
        manifest.unreachable.len()
    );
    Ok(if manifest.unreachable.is_empty() { 0 } else { 2 })
}

fn rollback(a: RollbackArgs) -> Result<i32> {
    let groups = match fleet::read_targets(&a.agents.targets) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("paceline: {e:#}");
            return Ok(2);
        }
    };
    let hosts = fleet::group_api_addrs(&groups, &a.group, a.agents.api_port);
    if hosts.is_empty() {
        eprintln!(
            "paceline: {}: no target has group {:?}",
            a.agents.targets.display(),
            a.group
        );
        return Ok(2);
    }
    if let Some(h) = &a.to
        && (h.len() < 6 || !h.chars().all(|c| c.is_ascii_hexdigit()))
    {
        eprintln!("paceline: --to {h}: give the policy's hash, or at least its first 6 hex digits");
        return Ok(2);
    }
    for (i, host) in hosts.iter().enumerate() {
        let api = api(host, &a.agents.token_file);
        let stop = |why: String, code: i32| {
            eprintln!("paceline: {host}: {why}");
            if i + 1 < hosts.len() {
                eprintln!(
                    "paceline: stopped: not rolled back: {}",
                    hosts[i + 1..].join(", ")
                );
            }
            Ok(code)
        };
        let path = match &a.to {
            None => "/rollback".to_string(),
            Some(h) => match history_of(&api) {
                Ok(hist) if hist.current_hash.starts_with(h.as_str()) => {
                    println!("{host}: runs policy {h} already");
                    continue;
                }
                Ok(hist) => match fleet::find_in_history(&hist.entries, h) {
                    Some(e) => format!("/rollback?generation={}", e.generation),
                    None => {
                        return stop(
                            format!(
                                "policy {h} is not in its history (the policies it applied last): restore that policy's file from the backup instead"
                            ),
                            1,
                        );
                    }
                },
                Err(e) => return stop(e, 2),
            },
        };
        let (code, body) = match api.post(&path) {
            Ok(r) => r,
            Err(u) => return stop(u.to_string(), 2),
        };
        match serde_json::from_str::<crate::agent::reload::Outcome>(&body) {
            Ok(o) => {
                if super::reload::print_outcome(host, &o) != 0 {
                    return stop("the rollback was rejected".into(), 1);
                }
            }
            Err(_) => return stop(format!("HTTP {code}: {}", body.trim()), 1),
        }
    }
    println!(
        "group {}: {} agents rolled back; their policy files are unchanged (each applies again when it changes, on SIGHUP or `paceline reload`, and at a restart)",
        a.group,
        hosts.len()
    );
    Ok(0)
}

/// An agent's running policy: its text, or why it could not be had (printed; exit 2).
fn running_policy(addr: &str, token_file: &Option<PathBuf>) -> Result<String, String> {
    let api = super::ApiAddr {
        addr: addr.to_string(),
        token_file: token_file.clone(),
    };
    match api.get_limited("/policy", paceline_policy::bounds::MAX_POLICY_BYTES) {
        Ok((200, text)) => Ok(text),
        Ok((code, body)) => Err(format!("{addr}: the agent answered HTTP {code}: {}", body.trim())),
        Err(u) => Err(u.to_string()),
    }
}

fn diff(a: DiffArgs) -> Result<i32> {
    let agents: Vec<String> = match (&a.group, &a.targets) {
        (Some(g), Some(file)) => {
            let groups = match fleet::read_targets(file) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("paceline: {e:#}");
                    return Ok(2);
                }
            };
            let members = fleet::group_api_addrs(&groups, g, a.api_port);
            if members.is_empty() {
                eprintln!("paceline: {}: no target has group {g:?}", file.display());
                return Ok(2);
            }
            members
        }
        _ if a.agents.len() == 2 => a.agents.clone(),
        _ => {
            eprintln!("paceline: fleet diff compares two agents (AGENT AGENT), or --group G --targets FILE");
            return Ok(2);
        }
    };
    // Ask every agent at once: a fleet's group is asked in the time of its slowest member.
    let texts: Vec<Result<String, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = agents
            .iter()
            .map(|addr| s.spawn(|| running_policy(addr, &a.token_file)))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("the request thread panicked".into()))
            })
            .collect()
    });
    let mut code = 0;
    let mut got: Vec<(&str, String)> = Vec::new();
    for (addr, t) in agents.iter().zip(texts) {
        match t {
            Ok(text) => got.push((addr.as_str(), text)),
            Err(e) => {
                eprintln!("paceline: {e}");
                code = 2;
            }
        }
    }
    let Some(reference) = fleet::majority(got.iter().map(|(addr, t)| (*addr, t.as_str()))) else {
        return Ok(2);
    };
    let (ref_addr, ref_text) = got
        .iter()
        .find(|(addr, _)| *addr == reference.agent)
        .expect("the majority's agent is one of those asked");
    let ref_name = format!("the running agent at {ref_addr}");
    let Ok(ref_compiled) = super::policy::compile_text(ref_text, &ref_name) else {
        return Ok(2);
    };
    if a.group.is_some() {
        println!(
            "group {}: {} agents asked, {} answered; the majority runs policy {} ({} of them, e.g. {ref_addr})",
            a.group.as_deref().unwrap_or_default(),
            agents.len(),
            got.len(),
            &reference.hash[..reference.hash.len().min(12)],
            reference.count
        );
    }
    for (addr, text) in &got {
        if addr == ref_addr {
            continue;
        }
        let name = format!("the running agent at {addr}");
        let Ok(c) = super::policy::compile_text(text, &name) else {
            code = 2;
            continue;
        };
        let changes = paceline_policy::diff::diff(&ref_compiled, &c);
        if changes.is_empty() {
            if a.group.is_none() {
                println!("{ref_name} and {name}: same policy");
            }
            continue;
        }
        println!("--- {ref_name}\n+++ {name}");
        for ch in &changes {
            println!("{ch}");
        }
        if code == 0 {
            code = 1;
        }
    }
    if a.group.is_some() && code == 0 {
        println!("every agent that answered runs the majority's policy");
    }
    Ok(code)
}

fn status(a: StatusArgs) -> Result<i32> {
    let inv = match (&a.source.prometheus, &a.source.targets) {
        (Some(url), _) => match fleet::from_prometheus(url, &a.job) {
            Ok(i) => i,
            Err(e) => {
                eprintln!("paceline: {e:#}");
                return Ok(2);
            }
        },
        (None, Some(file)) => match fleet::read_targets(file) {
            Ok(groups) => fleet::from_targets(&groups),
            Err(e) => {
                eprintln!("paceline: {e:#}");
                return Ok(2);
            }
        },
        (None, None) => unreachable!("clap requires one source"),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&inv)?);
    } else {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        print!("{}", fleet::render(&inv, now));
    }
    Ok(inv.exit_code())
}
