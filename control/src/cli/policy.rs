//! `paceline policy check|schema|diff|history|rollback`

use std::path::PathBuf;

use anyhow::Result;

use crate::host::SystemHost;
use paceline_policy::{
    self as policy, CompileContext, EnforcementMode, HostFacts, OfflineHost, host::all_routes_managed,
};

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Validate a policy; print the QJump epoch and per-level rates, the classes and the rules.
    Check(CheckArgs),
    /// Print the JSON schema of policy files.
    Schema,
    /// Compare two policies as compiled (levels, rates, classes by name, rules in order), or a
    /// file with the policy a running agent enforces. Exit status 0: same, 1: different,
    /// 2: a file missing or invalid, or the agent unreachable.
    Diff(DiffArgs),
    /// The policies the running agent applied (kept in its state directory, across restarts).
    History(HistoryArgs),
    /// Apply a policy of the history again (default: the newest that differs from the one in
    /// force). It stays in force until the policy file changes, a SIGHUP or `paceline reload`,
    /// or a restart: each applies the file again. Revert the file to make it permanent.
    Rollback(RollbackArgs),
}

#[derive(clap::Args, Debug)]
pub struct HistoryArgs {
    #[command(flatten)]
    pub api: super::ApiAddr,
    /// Print a history entry's policy text instead of the list.
    #[arg(long, value_name = "GENERATION")]
    pub show: Option<u64>,
    /// Print the list as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct RollbackArgs {
    /// The history generation to apply (`paceline policy history`); default: the newest one
    /// whose policy differs from the one in force.
    pub generation: Option<u64>,
    #[command(flatten)]
    pub api: super::ApiAddr,
}

#[derive(clap::Args, Debug)]
pub struct DiffArgs {
    /// The policy file to compare.
    pub file: PathBuf,
    /// The other policy file (or use --running).
    #[arg(required_unless_present = "running", conflicts_with = "running")]
    pub other: Option<PathBuf>,
    /// Compare with the policy the agent at --addr runs.
    #[arg(long)]
    pub running: bool,
    #[command(flatten)]
    pub api: super::ApiAddr,
}

#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// The policy file.
    pub file: PathBuf,
    /// Do not consult this host (interfaces, routes, cgroups, link speeds): for checking
    /// policies meant for other machines. What needs no host is still refused (e.g. a cgroup
    /// path with `..`, a NUL byte, or longer than 4000 bytes); cgroups are not resolved.
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
        Command::Diff(a) => diff(a),
        Command::History(a) => history(a),
        Command::Rollback(a) => rollback(a),
    }
}

fn history(a: HistoryArgs) -> Result<i32> {
    if let Some(g) = a.show {
        return match a.api.get(&format!("/history/{g}")) {
            Ok((200, text)) => {
                print!("{text}");
                Ok(0)
            }
            Ok((_, e)) => {
                eprintln!("paceline: {}", e.trim());
                Ok(2)
            }
            Err(u) => Ok(super::unreachable(u)),
        };
    }
    let (code, body) = match a.api.get("/history") {
        Ok(r) => r,
        Err(u) => return Ok(super::unreachable(u)),
    };
    if code != 200 {
        eprintln!("paceline: the agent answered HTTP {code}: {}", body.trim());
        return Ok(2);
    }
    if a.json {
        println!("{}", body.trim());
        return Ok(0);
    }
    let v: serde_json::Value = serde_json::from_str(&body)?;
    let entries: Vec<crate::runtime::history::Entry> = serde_json::from_value(v["entries"].clone())?;
    print!(
        "{}",
        crate::runtime::history::render(&entries, v["current_hash"].as_str().unwrap_or(""))
    );
    Ok(0)
}

fn rollback(a: RollbackArgs) -> Result<i32> {
    let path = match a.generation {
        Some(g) => format!("/rollback?generation={g}"),
        None => "/rollback".into(),
    };
    let (code, body) = match a.api.post(&path) {
        Ok(r) => r,
        Err(u) => return Ok(super::unreachable(u)),
    };
    match serde_json::from_str::<crate::agent::reload::Outcome>(&body) {
        Ok(o) => {
            let code = super::reload::print_outcome("rollback", &o);
            if code == 0 {
                println!(
                    "the policy file is unchanged: it applies again when it changes, on SIGHUP or `paceline reload`, and at a restart"
                );
            }
            Ok(code)
        }
        Err(_) => {
            eprintln!("paceline: the agent answered HTTP {code}: {}", body.trim());
            Ok(1)
        }
    }
}

/// Compiles a policy text for comparison: offline (host facts differ between machines, so
/// routes are unknown and sock_ops marks no socket) and for the mode the policy asks for.
/// Errors are printed; `Err` is exit status 2.
pub(super) fn compile_text(text: &str, name: &str) -> Result<policy::Compiled, i32> {
    let v = policy::parse_str(text, name, &OfflineHost).map_err(|errors| {
        for e in &errors {
            eprintln!("{e}");
        }
        2
    })?;
    let mode = v.enforcement().fixed().unwrap_or(EnforcementMode::Fq);
    policy::compile(
        &v,
        &CompileContext {
            mode,
            previous: None,
            all_routes_managed: all_routes_managed(&OfflineHost, &v.interfaces),
        },
    )
    .map_err(|e| {
        eprintln!("{e}");
        2
    })
}

/// Exit status 0: the same policy; 1: different (each change listed); 2: a file cannot be
/// read or is not a valid policy, or the running agent cannot be reached.
fn diff(a: DiffArgs) -> Result<i32> {
    // Both sides are read within the policy size limit (the parse then reports it by name).
    let read = |p: &std::path::Path| {
        policy::read(p).map_err(|errs| {
            for e in &errs {
                eprintln!("{e}");
            }
            2
        })
    };
    let left_text = match read(&a.file) {
        Ok(t) => t,
        Err(c) => return Ok(c),
    };
    let (right_name, right_text) = match &a.other {
        Some(p) => match read(p) {
            Ok(t) => (p.display().to_string(), t),
            Err(c) => return Ok(c),
        },
        None => match a.api.get_limited("/policy", policy::bounds::MAX_POLICY_BYTES) {
            Ok((200, text)) => (format!("the running agent at {}", a.api.addr), text),
            Ok((code, body)) => {
                eprintln!("paceline: the agent answered HTTP {code}: {}", body.trim());
                return Ok(2);
            }
            Err(u) => return Ok(super::unreachable(u)),
        },
    };
    let left_name = a.file.display().to_string();
    let (l, r) = match (
        compile_text(&left_text, &left_name),
        compile_text(&right_text, &right_name),
    ) {
        (Ok(l), Ok(r)) => (l, r),
        _ => return Ok(2),
    };
    let mut changes = policy::diff::diff(&l, &r);
    if a.running
        && let Some(line) = resolved_interfaces(&a, &left_text, &left_name)
    {
        changes.push(line);
    }
    if changes.is_empty() {
        println!("{left_name} and {right_name}: same policy");
        return Ok(0);
    }
    println!("--- {left_name}\n+++ {right_name}");
    for c in &changes {
        println!("{c}");
    }
    Ok(1)
}

/// With `--running` on the agent's host: the interfaces the file resolves to here (`auto`: the
/// default routes' now) against those the agent manages, when they differ (an agent that did
/// not follow a route change shows here, although the texts are the same).
fn resolved_interfaces(a: &DiffArgs, text: &str, name: &str) -> Option<String> {
    let v = policy::parse_str(text, name, &SystemHost::new()).ok()?;
    let (code, body) = a.api.get("/status").ok()?;
    if code != 200 {
        return None;
    }
    let st: crate::status::LiveStatus = serde_json::from_str(&body).ok()?;
    let running: Vec<String> = st.status.interfaces.iter().map(|i| i.name.clone()).collect();
    let mut want = v.interfaces.clone();
    let mut have = running.clone();
    want.sort();
    have.sort();
    (want != have).then(|| {
        format!(
            "interfaces (resolved on this host): {} -> {} (what the file resolves to now -> what the agent manages)",
            v.interfaces.join(", "),
            running.join(", ")
        )
    })
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
    let compiled = match policy::compile(
        &validated,
        &CompileContext {
            mode,
            previous: None,
            all_routes_managed: all_routes_managed(host, &validated.interfaces),
        },
    ) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            eprintln!("{}: 1 error(s); policy rejected", a.file.display());
            return Ok(2);
        }
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&policy::render::json(&compiled))?
        );
    } else {
        print!("{}", policy::render::check_report(&compiled));
        println!("{}: OK", a.file.display());
    }
    Ok(0)
}
