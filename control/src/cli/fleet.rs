//! `paceline fleet status --prometheus URL | --targets FILE`

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
    let Command::Status(a) = c;
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
