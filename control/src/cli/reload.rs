//! `paceline reload`: asks the running agent to apply its policy file now (`POST /reload`) and
//! reports the outcome, so `systemctl reload` fails for a policy the agent rejects (invalid,
//! or a change that needs a restart), which a plain SIGHUP cannot report.

use anyhow::Result;

use crate::agent::reload::Outcome;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub api: super::ApiAddr,
}

pub fn run(a: Args) -> Result<i32> {
    let (code, body) = match a.api.post("/reload") {
        Ok(r) => r,
        Err(u) => return Ok(super::unreachable(u)),
    };
    let outcome: Outcome = match serde_json::from_str(&body) {
        Ok(o) => o,
        Err(_) => {
            eprintln!("paceline: the agent answered HTTP {code}: {}", body.trim());
            return Ok(1);
        }
    };
    Ok(print_outcome("reload", &outcome))
}

/// Prints what a reload or rollback did; the exit status: 0 applied or unchanged, 1 rejected.
pub fn print_outcome(what: &str, o: &Outcome) -> i32 {
    match o {
        Outcome::Applied {
            generation,
            history,
            hash,
            changes,
        } => {
            println!(
                "{what}: policy applied (generation {generation}, history {history}, hash {})",
                &hash[..12.min(hash.len())]
            );
            if changes.is_empty() {
                println!("  no change to what is enforced");
            }
            for c in changes {
                println!("  {c}");
            }
            0
        }
        Outcome::Unchanged { hash } => {
            println!(
                "{what}: the policy in force already (hash {})",
                &hash[..12.min(hash.len())]
            );
            0
        }
        Outcome::Rejected { errors } => {
            eprintln!("{what}: rejected, the running policy stays in force:");
            for e in errors {
                eprintln!("  {e}");
            }
            1
        }
    }
}
