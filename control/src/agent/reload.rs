//! Reload (file change or SIGHUP): a valid policy is compiled with the previous one as context
//! (classes keep their indices, so their clocks and counters keep their meaning) and written
//! to the inactive policy slot, which then becomes live: flows keep their clocks and no packet
//! is classified by a half-written policy. An invalid policy is rejected, logged and counted;
//! the running one stays in force. What needs a restart (interfaces, enforcement mode,
//! `spec.d3`, flow_table_size: [`Compiled::restart_needed`](crate::policy::Compiled)) is
//! refused at reload with a message saying so.

use std::path::Path;

use crate::{
    policy::{self, CompileContext, EnforcementMode, SystemHost, decide_mode},
    qdisc,
    shared::Shared,
    state::StateDir,
    status::{self, PolicyStatus, ReloadEvent},
};

/// Applies the policy file `policy` if it is valid; otherwise keeps the running policy. Logs
/// and counts the outcome and rewrites `status.json`. `why` names the trigger in the log;
/// `force` applies an unchanged file too (SIGHUP). `text`: the policy file's content when the
/// caller already read it (`None`: read it here).
pub fn reload(
    policy: &Path,
    shared: &Shared,
    dir: &StateDir,
    host: &SystemHost,
    why: &str,
    force: bool,
    text: Option<String>,
) {
    let outcome = try_reload(policy, shared, host, force, text);
    {
        let mut g = shared.lock();
        match &outcome {
            Ok(None) => return,
            Ok(Some(generation)) => {
                g.status.reloads.applied += 1;
                g.status.reloads.last = Some(ReloadEvent {
                    at: status::unix_now(),
                    applied: true,
                    errors: vec![],
                });
                log::info!(
                    "{why}: policy applied (generation {generation}, hash {})",
                    g.compiled.hash
                );
                // The next agent keeps these slots if it adopts the datapath.
                if let Err(e) = dir.write_json(super::SLOTS_FILE, &g.compiled.slots()) {
                    log::warn!("recording the class slots: {e:#}");
                }
            }
            Err(errors) => {
                g.status.reloads.rejected += 1;
                g.status.reloads.last = Some(ReloadEvent {
                    at: status::unix_now(),
                    applied: false,
                    errors: errors.clone(),
                });
                log::error!("{why}: policy rejected, the running policy stays in force:");
                for e in errors {
                    log::error!("  {e}");
                }
            }
        }
    }
    write_status(dir, shared);
}

/// `Ok(None)`: unchanged file, nothing to do. `Ok(Some(gen))`: applied. `Err`: rejected.
fn try_reload(
    policy: &Path,
    shared: &Shared,
    host: &SystemHost,
    force: bool,
    text: Option<String>,
) -> Result<Option<u64>, Vec<String>> {
    let text = match text {
        Some(t) => t,
        None => {
            policy::read(policy).map_err(|errs| errs.iter().map(|e| e.to_string()).collect::<Vec<_>>())?
        }
    };
    let validated = policy::parse_str(&text, &policy.display().to_string(), host)
        .map_err(|errs| errs.iter().map(|e| e.to_string()).collect::<Vec<_>>())?;
    let started = std::time::Instant::now();
    let mut g = shared.lock();
    let mode = g.compiled.mode;
    let compiled = policy::compile(
        &validated,
        &CompileContext {
            mode,
            previous: Some(&g.compiled.slots()),
            all_routes_managed: policy::host::all_routes_managed(host, &validated.interfaces),
        },
    )
    .map_err(|e| vec![e.to_string()])?;
    if !force && compiled.hash == g.compiled.hash {
        return Ok(None);
    }
    let wanted = decide_mode(validated.enforcement(), &g.status.kernel).ok();
    let restart = compiled.restart_needed(&g.compiled, wanted);
    if !restart.is_empty() {
        return Err(restart);
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
    g.status.policy = PolicyStatus::of(policy, &compiled, generation);
    g.status.policy.apply_seconds = apply;
    g.compiled = compiled;
    g.policy_text = text;
    Ok(Some(generation))
}

/// Writes the live status to `status.json` in the state directory (what `paceline status`
/// would show, for a reader without HTTP access).
pub fn write_status(dir: &StateDir, shared: &Shared) {
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
    if let Err(e) = dir.write("status.json", &body) {
        log::warn!("writing {}/status.json: {e:#}", dir.path().display());
    }
}
