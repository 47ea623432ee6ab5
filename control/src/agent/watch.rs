//! Watching: the policy file (its directory, and the one its symlinks resolve to), SIGHUP,
//! SIGTERM/SIGINT, and the D3 router's controller timer, in one event loop.

use std::{path::Path, time::Duration};

use anyhow::{Context as _, Result};
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::reload::reload;
use crate::{policy::SystemHost, shared::Shared, state::StateDir};

/// The signals the agent handles, queued from [`Signals::new`] on (taken first thing at start,
/// so a SIGTERM during the start waits for the event loop instead of killing the process half
/// way through, which would leave qdiscs behind).
pub struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

impl Signals {
    pub fn new() -> Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

/// The event loop, until SIGTERM or SIGINT: reloads `policy` when it changes or on SIGHUP, and
/// ticks the D3 router's capacity controller when there is one.
pub async fn watch(
    policy: &Path,
    shared: &Shared,
    dir: &StateDir,
    host: &SystemHost,
    signals: Signals,
) -> Result<()> {
    let Signals {
        mut term,
        mut int,
        mut hup,
    } = signals;
    let (tx, mut changes) = tokio::sync::mpsc::unbounded_channel();
    let _watcher = watch_file(policy, tx)?;
    // Raw bytes last looked at: unrelated churn in the directory, or a rejected file that
    // has not changed since, must not trigger another parse (or another rejection).
    let mut last_bytes = Some(digest(shared.lock().policy_text.as_bytes()));
    let interval_ns = shared.lock().router.as_ref().map(|r| r.interval_ns);
    let mut d3_timer = tokio::time::interval(Duration::from_nanos(interval_ns.unwrap_or(3_600_000_000_000)));
    d3_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut tick_errors = 0u64;
    loop {
        tokio::select! {
            _ = d3_timer.tick(), if interval_ns.is_some() => {
                if let Err(e) = shared.d3_tick() {
                    tick_errors += 1;
                    if tick_errors.is_power_of_two() {
                        log::warn!("D3 capacity controller: {e:#} ({tick_errors} errors so far)");
                    }
                }
            }
            _ = term.recv() => { log::info!("SIGTERM: shutting down"); return Ok(()); }
            _ = int.recv() => { log::info!("SIGINT: shutting down"); return Ok(()); }
            _ = hup.recv() => reload(policy, shared, dir, host, "SIGHUP", true, None),
            Some(()) = changes.recv() => {
                // Editors write in several steps: wait for the file to settle.
                tokio::time::sleep(Duration::from_millis(200)).await;
                while changes.try_recv().is_ok() {}
                let bytes = crate::policy::bounds::read_file(policy).ok();
                let now = bytes.as_deref().map(digest);
                if now != last_bytes {
                    last_bytes = now;
                    // The bytes just read are the policy to check (text that is not UTF-8 is
                    // read again by the reload, which reports it).
                    let text = bytes.and_then(|b| String::from_utf8(b).ok());
                    reload(policy, shared, dir, host, "file change", false, text);
                }
            }
        }
    }
}

/// A digest of the policy file's bytes.
fn digest(bytes: &[u8]) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

/// Watches the directory that holds the policy, and the directory its symlinks resolve to.
///
/// Editors replace files by rename, and Kubernetes ConfigMap volumes swap a `..data` symlink
/// without touching the policy's own name, so any change in those directories wakes the
/// reload path; the watch loop then compares the file's digest and ignores unrelated churn.
fn watch_file(path: &Path, tx: tokio::sync::mpsc::UnboundedSender<()>) -> Result<notify::RecommendedWatcher> {
    use notify::Watcher as _;
    let parent = |p: &Path| {
        p.parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf()
    };
    let mut dirs = vec![parent(path)];
    if let Ok(real) = std::fs::canonicalize(path) {
        let real_dir = parent(&real);
        if std::fs::canonicalize(&dirs[0]).ok().as_ref() != Some(&real_dir) {
            dirs.push(real_dir);
        }
    }
    let mut w = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if let Ok(ev) = ev
            && !ev.kind.is_access()
        {
            let _ = tx.send(());
        }
    })?;
    for dir in &dirs {
        w.watch(dir, notify::RecursiveMode::NonRecursive)
            .with_context(|| format!("watching {} for policy changes", dir.display()))?;
    }
    Ok(w)
}
