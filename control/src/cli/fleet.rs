//! `paceline fleet status --prometheus URL | --targets FILE`, `paceline fleet diff`

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
    }
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
