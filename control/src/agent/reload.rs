//! Reload (file change, SIGHUP, a reload request, a rollback, a route change): a valid policy
//! is compiled with the previous one as context (classes keep their indices, so their clocks
//! and counters keep their meaning) and written to the inactive policy slot, which then
//! becomes live: flows keep their clocks and no packet is classified by a half-written policy.
//! An invalid policy is rejected, logged and counted; the running one stays in force. What
//! needs a restart (explicit interfaces, enforcement mode, `spec.d3`, flow_table_size:
//! [`Compiled::restart_needed`](paceline_policy::Compiled)) is refused with a message saying so;
//! with `interfaces: [auto]` on both sides, new interfaces are attached and old ones detached
//! instead ([`super::interfaces`]).
//!
//! A file that holds the policy already in force applies nothing; if the last reload had been
//! rejected (a bad edit, then the good file copied back), it is recorded as a success, so
//! `paceline_policy_last_reload_success` and the reload-rejected alert clear without a SIGHUP.

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::host::SystemHost;
use crate::{
    kernel::qdisc,
    runtime::shared::{Inner, Shared},
    status::{self, PolicyStatus, ReloadEvent, Reloads},
};
use paceline_policy::{self as policy, CompileContext, EnforcementMode, decide_mode, diff};

/// What a reload did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "lowercase")]
pub enum Outcome {
    /// Applied as `generation` (the agent's count) and history generation `history`.
    Applied {
        generation: u64,
        history: u64,
        hash: String,
        changes: Vec<String>,
    },
    /// The file holds the policy in force: nothing to apply.
    Unchanged { hash: String },
    /// Rejected: the running policy stays in force.
    Rejected { errors: Vec<String> },
}

impl Outcome {
    pub fn ok(&self) -> bool {
        !matches!(self, Outcome::Rejected { .. })
    }
}

/// Records `outcome` in the reload history of the status. Returns whether anything changed
/// (an unchanged file after an applied reload changes nothing).
pub fn record(reloads: &mut Reloads, outcome: &Outcome, now: u64) -> bool {
    match outcome {
        Outcome::Applied { .. } => {
            reloads.applied += 1;
            reloads.last = Some(ReloadEvent {
                at: now,
                applied: true,
                errors: vec![],
                unchanged: false,
            });
            true
        }
        Outcome::Unchanged { .. } => {
            // After a rejection, the file is good again: the last reload is no longer a
            // failure. Otherwise there is nothing to record.
            if reloads.last.as_ref().is_some_and(|l| !l.applied) {
                reloads.last = Some(ReloadEvent {
                    at: now,
                    applied: true,
                    errors: vec![],
                    unchanged: true,
                });
                true
            } else {
                false
            }
        }
        Outcome::Rejected { errors } => {
            reloads.rejected += 1;
            reloads.last = Some(ReloadEvent {
                at: now,
                applied: false,
                errors: errors.clone(),
                unchanged: false,
            });
            true
        }
    }
}

/// Applies the policy file (or `text`, already read from it, or a history entry's text for a
/// rollback) if it is valid; otherwise keeps the running policy. Logs, counts and records the
/// outcome in the event log, the history and `status.json`. `why` names the trigger;
/// `force` applies an unchanged policy too (SIGHUP).
pub fn reload(shared: &Shared, host: &SystemHost, why: &str, force: bool, text: Option<String>) -> Outcome {
    let policy = shared.ctl.policy.clone();
    let outcome = try_reload(shared, host, why, force, text);
    let changed = {
        let mut g = shared.lock();
        let changed = record(&mut g.status.reloads, &outcome, status::unix_now());
        match &outcome {
            Outcome::Applied {
                generation,
                history,
                hash,
                changes,
            } => {
                log::info!("{why}: policy applied (generation {generation}, hash {hash})");
                shared.events.info(
                    if why.starts_with("rollback") {
                        "rollback"
                    } else {
                        "reload_applied"
                    },
                    format!(
                        "{why}: policy applied (generation {generation}, history {history}, hash {}): {}",
                        &hash[..12.min(hash.len())],
                        diff::one_line(changes)
                    ),
                    json!({"trigger": why, "hash": hash, "generation": generation, "history_generation": history, "changes": changes}),
                );
                // The next agent keeps these slots if it adopts the datapath.
                if let Err(e) = shared.ctl.dir.write_json(super::SLOTS_FILE, &g.compiled.slots()) {
                    log::warn!("recording the class slots: {e:#}");
                }
            }
            Outcome::Unchanged { hash } if changed => {
                shared.events.info(
                    "reload_applied",
                    format!(
                        "{why}: {} holds the policy in force again (hash {}); nothing to apply, the last rejection is cleared",
                        policy.display(),
                        &hash[..12.min(hash.len())]
                    ),
                    json!({"trigger": why, "hash": hash, "changes": []}),
                );
            }
            Outcome::Unchanged { .. } => {}
            Outcome::Rejected { errors } => {
                log::error!("{why}: policy rejected, the running policy stays in force:");
                for e in errors {
                    log::error!("  {e}");
                }
                shared.events.emit(
                    "reload_rejected",
                    crate::runtime::events::Severity::Error,
                    format!(
                        "{why}: policy rejected, the running policy stays in force: {}",
                        errors.first().cloned().unwrap_or_default()
                    ),
                    json!({"trigger": why, "errors": errors}),
                );
            }
        }
        changed
    };
    if changed {
        write_status(shared);
    }
    outcome
}

fn errs(v: Vec<policy::PolicyError>) -> Vec<String> {
    v.iter().map(|e| e.to_string()).collect()
}

/// Reads and validates the policy file. A file that does not validate is read again (up to
/// [`SETTLE_READS`] times, [`SETTLE_PAUSE`] apart) while what it holds keeps changing: a read
/// that races a replacement on a filesystem without atomic rename visibility (9p, NFS) can
/// return a torn or zero-filled file, which must not count as a bad policy. A file that
/// reads the same twice and does not validate is rejected.
fn read_settled(
    path: &std::path::Path,
    host: &SystemHost,
) -> Result<(String, policy::Validated), Vec<String>> {
    let name = path.display().to_string();
    let mut text = policy::read(path).map_err(errs)?;
    let mut tries = 1;
    loop {
        match policy::parse_str(&text, &name, host) {
            Ok(v) => return Ok((text, v)),
            Err(e) if tries >= SETTLE_READS => return Err(errs(e)),
            Err(e) => {
                std::thread::sleep(SETTLE_PAUSE);
                let again = policy::read(path).map_err(errs)?;
                tries += 1;
                if again == text {
                    return Err(errs(e));
                }
                log::debug!("{name} changed while it was read; reading it again");
                text = again;
            }
        }
    }
}

/// Reads of a policy file that does not validate, while it keeps changing.
const SETTLE_READS: u32 = 4;
const SETTLE_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

fn try_reload(shared: &Shared, host: &SystemHost, why: &str, force: bool, text: Option<String>) -> Outcome {
    match try_reload_inner(shared, host, why, force, text) {
        Ok(o) => o,
        Err(errors) => Outcome::Rejected { errors },
    }
}

fn try_reload_inner(
    shared: &Shared,
    host: &SystemHost,
    why: &str,
    force: bool,
    text: Option<String>,
) -> Result<Outcome, Vec<String>> {
    let policy = &shared.ctl.policy;
    let from_file = text.is_none();
    let (text, validated) = match text {
        Some(t) => {
            let v = policy::parse_str(&t, &policy.display().to_string(), host).map_err(errs)?;
            (t, v)
        }
        None => read_settled(policy, host)?,
    };
    if from_file {
        // What this reload saw of the file: the watcher compares the next change with it.
        shared.lock().file_digest = Some(digest(text.as_bytes()));
    }
    let started = std::time::Instant::now();
    let mut g = shared.lock();
    let mode = g.compiled.mode;
    let compiled = policy::compile_after(
        &validated,
        &CompileContext {
            mode,
            previous: Some(&g.compiled.slots()),
            all_routes_managed: policy::host::all_routes_managed(host, &validated.interfaces),
        },
        &g.compiled,
    )
    .map_err(|e| vec![e.to_string()])?;
    let same_interfaces = compiled.interfaces == g.compiled.interfaces;
    if !force && compiled.hash == g.compiled.hash && same_interfaces {
        return Ok(Outcome::Unchanged { hash: compiled.hash });
    }
    let wanted = decide_mode(validated.enforcement(), &g.status.kernel.support()).ok();
    let follow_auto = compiled.interfaces_auto && g.compiled.interfaces_auto;
    let restart: Vec<String> = compiled
        .restart_needed(&g.compiled, wanted)
        .into_iter()
        // `auto` on both sides: the interfaces follow the routes live.
        .filter(|m| !(follow_auto && m.starts_with("spec.interfaces")))
        .collect();
    if !restart.is_empty() {
        return Err(restart);
    }
    if compiled.interfaces.is_empty() {
        return Err(vec![
            "the policy selects no interface (spec.interfaces resolved to nothing on this host)".into(),
        ]);
    }
    if !same_interfaces {
        super::interfaces::sync(&mut g, shared, &compiled, why)?;
    }
    // A slot that now names a different class or level starts from zero.
    for slot in compiled.slots_to_reset(Some(&g.compiled.slots())) {
        g.dp_mut()
            .and_then(|dp| dp.reset_slot(slot))
            .map_err(|e| vec![format!("resetting counters slot {slot}: {e:#}")])?;
    }
    if mode == EnforcementMode::Htb
        && let Some(plan) = &compiled.htb
    {
        for iface in &compiled.interfaces {
            qdisc::install_htb(iface, plan, true, true)
                .map_err(|e| vec![format!("{iface}: updating HTB classes: {e:#}")])?;
        }
    }
    let generation = g
        .dp_mut()
        .and_then(|dp| dp.write_policy(&compiled.table, &compiled.ctab))
        .map_err(|e| vec![format!("writing the policy map: {e:#}")])?;
    let apply = started.elapsed().as_secs_f64();
    super::log_applied(&compiled, generation, apply);
    for w in &compiled.warnings {
        log::warn!("policy: {w}");
    }
    let changes = diff::diff(&g.compiled, &compiled);
    let history = shared
        .history
        .record(
            &text,
            &compiled.hash,
            compiled.name.as_deref(),
            why,
            &policy.display().to_string(),
        )
        .unwrap_or_else(|e| {
            log::warn!("recording the policy history: {e:#}");
            0
        });
    let sock_ops = g.sock_ops;
    g.status.policy = PolicyStatus::of(policy, &compiled, generation);
    g.status.policy.tcp_dscp_by_socket &= sock_ops;
    g.status.policy.apply_seconds = apply;
    g.status.policy.source = why.to_string();
    g.status.policy.history_generation = history;
    g.history_generation = history;
    update_degraded(&mut g, shared, &compiled);
    let hash = compiled.hash.clone();
    g.compiled = compiled;
    g.policy_text = text;
    Ok(Outcome::Applied {
        generation,
        history,
        hash,
        changes,
    })
}

/// Recomputes what the policy asks for that this host does not enforce; a change is an event.
fn update_degraded(g: &mut Inner, shared: &Shared, c: &policy::Compiled) {
    let now = paceline_policy::degradations_for(&g.status.kernel.support(), c, g.sock_ops);
    for d in now.iter().filter(|d| !g.status.degraded.contains(d)) {
        shared.events.warn("degraded", d.clone(), json!(null));
    }
    if now.is_empty() && !g.status.degraded.is_empty() {
        shared.events.info(
            "degraded",
            "the policy in force asks for nothing this host lacks",
            json!(null),
        );
    }
    g.status.degraded = now;
}

/// Writes the live status to `status.json` in the state directory (what `paceline status`
/// would show, for a reader without HTTP access).
pub fn write_status(shared: &Shared) {
    let body = match shared
        .live_status()
        .and_then(|s| Ok(serde_json::to_vec_pretty(&s)?))
    {
        Ok(b) => b,
        Err(e) => {
            log::warn!("building the status document: {e:#}");
            return;
        }
    };
    let dir = &shared.ctl.dir;
    if let Err(e) = dir.write("status.json", &body) {
        log::warn!("writing {}/status.json: {e:#}", dir.path().display());
    }
}

/// Applies history generation `generation` (default: the newest entry that differs from the policy
/// in force) instead of the file; see [`crate::runtime::history`] for how it and the file on disk
/// interact.
pub fn rollback(shared: &Shared, host: &SystemHost, generation: Option<u64>) -> Outcome {
    rollback_for(shared, host, generation, None)
}

/// [`rollback`], recording what asked for it (`alert PacelineDropsAfterReload`) in the event
/// log and the history's source.
pub fn rollback_for(
    shared: &Shared,
    host: &SystemHost,
    generation: Option<u64>,
    cause: Option<&str>,
) -> Outcome {
    let current = shared.lock().compiled.hash.clone();
    let target = match generation {
        Some(g) => Ok(g),
        None => shared.history.previous(&current),
    };
    let picked = target.and_then(|g| shared.history.get(g));
    match picked {
        Ok((entry, text)) => reload(
            shared,
            host,
            &match cause {
                Some(c) => format!("rollback to generation {} ({c})", entry.generation),
                None => format!("rollback to generation {}", entry.generation),
            },
            true,
            Some(text),
        ),
        Err(e) => Outcome::Rejected {
            errors: vec![format!("rollback: {e:#}")],
        },
    }
}

/// A digest of the policy file's bytes.
pub(crate) fn digest(bytes: &[u8]) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "apiVersion: paceline/v1\nkind: Policy\nspec:\n  interfaces: [lo]\n  enforcement: none\n  levels: [{name: all, priority: 0}]\n  classes: [{name: all, level: all}]\n  default_class: all\n";

    /// A read that races a replacement (9p, NFS) can see zeros where the new text goes: read
    /// again while the file changes, reject only what reads the same twice.
    #[test]
    fn a_torn_read_is_read_again_and_a_stable_bad_file_is_rejected() {
        let dir = std::env::temp_dir().join(format!("pl-settle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("p.yaml");
        let mut torn = GOOD.as_bytes().to_vec();
        let n = torn.len();
        torn[n - 20..].fill(0);
        std::fs::write(&p, &torn).unwrap();
        let writer = {
            let p = p.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(20));
                std::fs::write(&p, GOOD).unwrap();
            })
        };
        let (text, _) = read_settled(&p, &SystemHost).expect("the settled file validates");
        writer.join().unwrap();
        assert_eq!(text, GOOD);
        // Zeros that stay: a bad file, rejected with the validator's message.
        std::fs::write(&p, &torn).unwrap();
        let e = read_settled(&p, &SystemHost).unwrap_err();
        assert!(e[0].contains("control characters"), "{e:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A bad policy, then the good file copied back (the hash of the policy in force): the
    /// last reload must read as a success again (it stayed a rejection, and the alert fired,
    /// until a SIGHUP).
    #[test]
    fn an_unchanged_file_after_a_rejection_clears_it() {
        let mut r = Reloads::default();
        assert!(record(
            &mut r,
            &Outcome::Rejected {
                errors: vec!["p.yaml:3: spec: bad".into()]
            },
            10
        ));
        assert!(!r.last.as_ref().unwrap().applied);
        assert!(record(&mut r, &Outcome::Unchanged { hash: "h".into() }, 11));
        let last = r.last.as_ref().unwrap();
        assert!(last.applied && last.unchanged, "{last:?}");
        assert_eq!((r.applied, r.rejected), (0, 1), "no policy was applied");
        // Unchanged again: nothing to record.
        assert!(!record(&mut r, &Outcome::Unchanged { hash: "h".into() }, 12));
        assert_eq!(r.last.as_ref().unwrap().at, 11);
    }

    #[test]
    fn applied_and_rejected_are_counted() {
        let mut r = Reloads::default();
        record(
            &mut r,
            &Outcome::Applied {
                generation: 2,
                history: 2,
                hash: "h".into(),
                changes: vec![],
            },
            1,
        );
        record(&mut r, &Outcome::Rejected { errors: vec![] }, 2);
        assert_eq!((r.applied, r.rejected), (1, 1));
        assert!(!r.last.unwrap().applied);
    }
}
