//! The command line: one subcommand per file, each a thin shell over the library.
//!
//! Exit codes, the same for every command: 0 ok (same policy, healthy), 1 different or
//! degraded (or a runtime failure), 2 invalid input (a missing or invalid policy, a bad
//! argument) or an agent / Prometheus that cannot be reached.

pub mod agent;
pub mod classify;
pub mod cleanup;
pub mod client;
pub mod events;
pub mod fleet;
pub mod flows;
pub mod policy;
pub mod reload;
pub mod status;
pub mod top;
pub mod trace;

use clap::{Parser, Subcommand};

/// paceline: EDT pacing, QJump priority levels and D3 deadlines for datacenter servers, in eBPF.
#[derive(Parser, Debug)]
#[command(name = "paceline", version, about, long_about = None)]
pub struct Cli {
    /// Log level: error, warn, info, debug, trace (RUST_LOG overrides).
    #[arg(long, global = true, default_value = "info")]
    pub log_level: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the agent: load the datapath, apply the policy, serve metrics and the API, watch the
    /// policy file and the routes.
    Agent(agent::Args),
    /// Work with policy files (check, schema, diff: no root needed), and the running agent's
    /// policy history and rollback.
    #[command(subcommand)]
    Policy(policy::Command),
    /// Show the running agent's status and live counters. Exit 0 healthy, 1 degraded or last
    /// reload rejected, 2 unreachable.
    Status(status::Args),
    /// Ask the running agent to apply its policy file now; exit 1 (with the errors) when it is
    /// rejected, e.g. invalid or needing a restart (systemd's ExecReload).
    Reload(reload::Args),
    /// Live view of the running agent: rates, delays, drops and tags per level and class,
    /// refreshed each second.
    Top(top::Args),
    /// The running agent's flows (its flow table, local TCP connections and connected UDP
    /// sockets): 5-tuple, class, rate, next departure, bytes.
    Flows(flows::Args),
    /// Why packets were late or dropped: per-packet verdicts from the running agent's datapath
    /// (class, the clock that held each packet and for how long, drops, marks), as text, JSON
    /// lines or pcapng for Wireshark. Ctrl-C stops it and tracing with it.
    Trace(trace::Args),
    /// Which class and level a 5-tuple gets, and by which rule (from the running agent, or
    /// from a policy file with --policy).
    Classify(classify::Args),
    /// The running agent's event log: starts, reloads, rollbacks, degraded enforcement,
    /// interface and route changes, bursts of drops, D3 quenches.
    Events(events::Args),
    /// Many agents at once.
    #[command(subcommand)]
    Fleet(fleet::Command),
    /// Remove what an agent killed with SIGKILL left behind (qdiscs, filters, pins), or with
    /// --check report whether anything of paceline's is left on this host.
    Cleanup(cleanup::Args),
}

/// Parses the process's arguments, sets up logging, runs the command and exits with its code.
pub fn main() -> ! {
    let cli = Cli::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(&cli.log_level))
        .format_timestamp_millis()
        .init();
    std::process::exit(run(cli));
}

/// Runs a parsed command line; returns the exit code.
pub fn run(cli: Cli) -> i32 {
    let result = match cli.command {
        Command::Agent(a) => agent::run(a),
        Command::Policy(p) => policy::run(p),
        Command::Status(s) => status::run(s),
        Command::Reload(r) => reload::run(r),
        Command::Top(t) => top::run(t),
        Command::Flows(f) => flows::run(f),
        Command::Trace(t) => trace::run(t),
        Command::Classify(c) => classify::run(c),
        Command::Events(e) => events::run(e),
        Command::Fleet(f) => fleet::run(f),
        Command::Cleanup(c) => cleanup::run(c),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("paceline: {e:#}");
            1
        }
    }
}

/// The default `--api-addr` of the agent, and of the commands that ask it.
pub const DEFAULT_API_ADDR: &str = "127.0.0.1:9978";
/// The default `--metrics-addr`.
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9977";

/// Where the running agent's API is (`--api-addr` of `paceline agent`).
#[derive(clap::Args, Debug, Clone)]
pub struct ApiAddr {
    /// The agent's --api-addr (`PACELINE_API` in the environment).
    #[arg(long = "addr", env = "PACELINE_API", default_value = DEFAULT_API_ADDR)]
    pub addr: String,
    /// The agent's --api-token-file, when its API asks for a token (`PACELINE_API_TOKEN_FILE`
    /// in the environment).
    #[arg(long = "token-file", value_name = "FILE", env = "PACELINE_API_TOKEN_FILE")]
    pub token_file: Option<std::path::PathBuf>,
}

/// An agent that could not be asked (exit status 2).
#[derive(Debug)]
pub struct Unreachable(pub String);

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl ApiAddr {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn unreachable(&self, e: anyhow::Error) -> Unreachable {
        Unreachable(format!(
            "cannot reach the agent: {e:#} (is `paceline agent` running with --api-addr {}? set --addr or PACELINE_API)",
            self.addr
        ))
    }

    /// The token to send: the file's, read as the agent reads it (less the ownership and mode
    /// checks: this is the caller's own copy).
    fn token(&self) -> Result<Option<String>, Unreachable> {
        let Some(p) = &self.token_file else {
            return Ok(None);
        };
        let raw = std::fs::read(p).map_err(|e| {
            Unreachable(format!(
                "cannot read the API token file {} (PACELINE_API_TOKEN_FILE): {e}",
                p.display()
            ))
        })?;
        crate::runtime::auth::parse_token(&raw)
            .map(Some)
            .map_err(|e| Unreachable(format!("the API token file {}: {e:#}", p.display())))
    }

    /// A 401 is an agent that could not be asked: say how to give the token.
    fn refused(&self, answer: (u16, String)) -> Result<(u16, String), Unreachable> {
        if answer.0 != 401 {
            return Ok(answer);
        }
        let how = if self.token_file.is_some() {
            "the token in --token-file (PACELINE_API_TOKEN_FILE) is not the agent's"
        } else {
            "set PACELINE_API_TOKEN_FILE (or --token-file) to a copy of the agent's --api-token-file"
        };
        Err(Unreachable(format!(
            "the agent at {} refused the request (401): {}; {how}",
            self.addr,
            answer.1.trim()
        )))
    }

    /// GET `path`: (HTTP status, body), the body at most [`client::MAX_ANSWER`] bytes.
    pub fn get(&self, path: &str) -> Result<(u16, String), Unreachable> {
        self.get_limited(path, client::MAX_ANSWER)
    }

    /// GET `path` as a stream of lines (see [`client::get_lines`]).
    pub fn get_lines(
        &self,
        path: &str,
        line: impl FnMut(&str) -> bool,
    ) -> Result<(u16, String), Unreachable> {
        let token = self.token()?;
        client::get_lines(&self.url(path), token.as_deref(), line)
            .map_err(|e| self.unreachable(e))
            .and_then(|a| self.refused(a))
    }

    /// GET `path`: (HTTP status, body), the body at most `limit` bytes.
    pub fn get_limited(&self, path: &str, limit: usize) -> Result<(u16, String), Unreachable> {
        let token = self.token()?;
        client::get_as(&self.url(path), limit, token.as_deref())
            .map_err(|e| self.unreachable(e))
            .and_then(|a| self.refused(a))
    }

    /// POST `path` with an empty body: (HTTP status, body).
    pub fn post(&self, path: &str) -> Result<(u16, String), Unreachable> {
        let token = self.token()?;
        client::post(&self.url(path), client::MAX_ANSWER, token.as_deref())
            .map_err(|e| self.unreachable(e))
            .and_then(|a| self.refused(a))
    }
}

/// Prints an unreachable agent and returns exit status 2.
pub fn unreachable(u: Unreachable) -> i32 {
    eprintln!("paceline: {u}");
    2
}
