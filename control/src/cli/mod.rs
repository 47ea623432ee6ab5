//! The command line: one subcommand per file, each a thin shell over the library.

pub mod agent;
pub mod cleanup;
pub mod client;
pub mod policy;
pub mod status;

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
    /// Run the agent: load the datapath, apply the policy, serve metrics, watch the policy file.
    Agent(agent::Args),
    /// Work with policy files (no root needed).
    #[command(subcommand)]
    Policy(policy::Command),
    /// Show the running agent's status and live counters.
    Status(status::Args),
    /// Remove what an agent killed with SIGKILL left behind (qdiscs, filters, pins).
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

/// Exit codes: 0 ok, 1 runtime failure, 2 invalid policy or usage.
pub fn run(cli: Cli) -> i32 {
    let result = match cli.command {
        Command::Agent(a) => agent::run(a),
        Command::Policy(p) => policy::run(p),
        Command::Status(s) => status::run(s),
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
