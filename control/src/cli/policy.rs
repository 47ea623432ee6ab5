//! `paceline policy check|schema`

use std::path::PathBuf;

use anyhow::Result;

use crate::policy::{self, CompileContext, EnforcementMode, HostFacts, OfflineHost, SystemHost};

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Validate a policy; print the QJump epoch and per-level rates, the classes and the rules.
    Check(CheckArgs),
    /// Print the JSON schema of policy files.
    Schema,
}

#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// The policy file.
    pub file: PathBuf,
    /// Do not consult this host (interfaces, routes, cgroups, link speeds): for checking
    /// policies meant for other machines.
    #[arg(long)]
    pub offline: bool,
    /// Print the compiled policy as JSON.
    #[arg(long)]
    pub json: bool,
    /// Compile for this enforcement mode (affects skb->priority values and the HTB plan);
    /// default: the policy's `enforcement`, or fq when it says `auto`.
    #[arg(long, value_enum)]
    pub mode: Option<Mode>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Mode {
    Fq,
    Htb,
    Sockops,
    None,
}

pub fn run(c: Command) -> Result<i32> {
    match c {
        Command::Schema => {
            print!("{}", policy::schema_json());
            Ok(0)
        }
        Command::Check(a) => check(a),
    }
}

fn check(a: CheckArgs) -> Result<i32> {
    let system;
    let offline;
    let host: &dyn HostFacts = if a.offline {
        offline = OfflineHost;
        &offline
    } else {
        system = SystemHost::new();
        &system
    };
    let validated = match policy::load(&a.file, host) {
        Ok(v) => v,
        Err(errors) => {
            for e in &errors {
                eprintln!("{e}");
            }
            eprintln!("{}: {} error(s); policy rejected", a.file.display(), errors.len());
            return Ok(2);
        }
    };
    let mode = match a.mode {
        Some(Mode::Fq) => EnforcementMode::Fq,
        Some(Mode::Htb) => EnforcementMode::Htb,
        Some(Mode::Sockops) => EnforcementMode::SockopsOnly,
        Some(Mode::None) => EnforcementMode::None,
        None => validated.enforcement().fixed().unwrap_or(EnforcementMode::Fq),
    };
    let compiled = policy::compile(&validated, &CompileContext { mode, previous: None });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&policy::render::json(&compiled))?);
    } else {
        print!("{}", policy::render::check_report(&compiled));
        println!("{}: OK", a.file.display());
    }
    Ok(0)
}
