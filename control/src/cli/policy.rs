//! `paceline policy check|schema`

use std::path::PathBuf;

use anyhow::Result;

use crate::policy::{
    self, CompileContext, EnforcementMode, HostFacts, OfflineHost, SystemHost, host::all_routes_managed,
};

#[cfg(test)]
mod tests {
    use super::json_diff;
    use serde_json::json;

    #[test]
    fn diff_lists_changed_paths_only() {
        let a = json!({"levels": [{"name": "hi", "rate": 5}], "horizon_ns": 100});
        let b = json!({"levels": [{"name": "hi", "rate": 7}, {"name": "lo"}], "horizon_ns": 100});
        let mut out = Vec::new();
        json_diff("", &a, &b, &mut out);
        assert_eq!(
            out,
            vec![
                "levels[0].rate: 5 -> 7".to_string(),
                "levels[1]: null -> {\"name\":\"lo\"}".to_string()
            ]
        );
        out.clear();
        json_diff("", &a, &a, &mut out);
        assert!(out.is_empty());
    }
}

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Validate a policy; print the QJump epoch and per-level rates, the classes and the rules.
    Check(CheckArgs),
    /// Print the JSON schema of policy files.
    Schema,
    /// Compare two policies as compiled (levels, rates, classes, rules...), or a file with the
    /// policy a running agent enforces. Exit status 0: same, 1: different, 2: invalid.
    Diff(DiffArgs),
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
    /// The running agent's --metrics-addr.
    #[arg(long, default_value = "127.0.0.1:9977")]
    pub addr: std::net::SocketAddr,
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
        Command::Diff(a) => diff(a),
    }
}

/// Compiles a policy text for comparison: offline (host facts differ between machines, so
/// routes are unknown and sock_ops marks no socket) and for the mode the policy asks for.
fn compile_text(text: &str, name: &str) -> Result<serde_json::Value, i32> {
    let v = policy::parse_str(text, name, &OfflineHost).map_err(|errors| {
        for e in &errors {
            eprintln!("{e}");
        }
        2
    })?;
    let mode = v.enforcement().fixed().unwrap_or(EnforcementMode::Fq);
    let compiled = policy::compile(
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
    })?;
    let mut j = policy::render::json(&compiled);
    // Where the policy came from is not part of what it says.
    if let Some(o) = j.as_object_mut() {
        for k in ["file", "sha256", "warnings"] {
            o.remove(k);
        }
    }
    Ok(j)
}

fn diff(a: DiffArgs) -> Result<i32> {
    // Both sides are read within the policy size limit (the parse then reports it by name).
    let read = |p: &std::path::Path| {
        policy::read(p).map_err(|errs| {
            for e in &errs {
                eprintln!("{e}");
            }
        })
    };
    let Ok(left_text) = read(&a.file) else {
        return Ok(2);
    };
    let (right_name, right_text) = match &a.other {
        Some(p) => {
            let Ok(t) = read(p) else { return Ok(2) };
            (p.display().to_string(), t)
        }
        None => {
            let url = format!("http://{}/policy", a.addr);
            let text = super::client::get_text(&url, policy::bounds::MAX_POLICY_BYTES)?;
            (format!("running agent at {}", a.addr), text)
        }
    };
    let left_name = a.file.display().to_string();
    let (l, r) = match (
        compile_text(&left_text, &left_name),
        compile_text(&right_text, &right_name),
    ) {
        (Ok(l), Ok(r)) => (l, r),
        _ => return Ok(2),
    };
    let mut changes = Vec::new();
    json_diff("", &l, &r, &mut changes);
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

/// The paths where two JSON values differ, one line each: `path: left -> right`.
pub fn json_diff(path: &str, l: &serde_json::Value, r: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value;
    match (l, r) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                json_diff(
                    &p,
                    a.get(k).unwrap_or(&Value::Null),
                    b.get(k).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for i in 0..a.len().max(b.len()) {
                json_diff(
                    &format!("{path}[{i}]"),
                    a.get(i).unwrap_or(&Value::Null),
                    b.get(i).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        (a, b) if a != b => out.push(format!("{path}: {a} -> {b}")),
        _ => {}
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
