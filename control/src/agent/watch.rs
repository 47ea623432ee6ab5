//! Watching: the policy file (its directory, and the one its symlinks resolve to), SIGHUP,
//! SIGTERM/SIGINT, route changes, the D3 router's controller timer and a one-second tick
//! (events from the counters, the systemd watchdog), in one event loop.

use std::{path::Path, time::Duration};

use anyhow::{Context as _, Result};
use serde_json::json;
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::reload::{digest, reload};
use crate::host::SystemHost;
use crate::runtime::shared::Shared;
use paceline_policy::HostFacts as _;

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

/// The event loop, until SIGTERM or SIGINT: reloads the policy when its file changes or on
/// SIGHUP, follows route changes (`interfaces: [auto]`), ticks the D3 router's capacity
/// controller when there is one, and once a second watches the counters for bursts of drops
/// and D3 quenches (events) and feeds the systemd watchdog while the agent is healthy.
pub async fn watch(shared: &Shared, host: &SystemHost, signals: Signals) -> Result<()> {
    let policy = shared.ctl.policy.clone();
    let Signals {
        mut term,
        mut int,
        mut hup,
    } = signals;
    let (tx, mut changes) = tokio::sync::mpsc::unbounded_channel();
    let _watcher = watch_file(&policy, tx)?;
    let (rtx, mut routes) = tokio::sync::mpsc::unbounded_channel();
    if let Err(e) = super::interfaces::watch_routes(rtx) {
        log::warn!("route notifications unavailable ({e}); interfaces: [auto] will not follow route changes");
    }
    // Raw bytes last looked at (by this loop, a SIGHUP or a reload request: the shared
    // `file_digest`): unrelated churn in the directory, or a rejected file that has not changed
    // since, must not trigger another parse (or another rejection).
    {
        let mut g = shared.lock();
        g.file_digest = Some(digest(g.policy_text.as_bytes()));
    }
    let interval_ns = shared.lock().router.as_ref().map(|r| r.interval_ns);
    let mut d3_timer = tokio::time::interval(Duration::from_nanos(interval_ns.unwrap_or(3_600_000_000_000)));
    d3_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut second = tokio::time::interval(Duration::from_secs(1));
    second.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let watchdog = sd_notify::watchdog_enabled();
    let mut last_ping = std::time::Instant::now();
    let mut watchers = Watchers::default();
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
            _ = second.tick() => {
                watchers.tick(shared);
                if let Some(period) = watchdog
                    && last_ping.elapsed() >= period / 2
                {
                    last_ping = std::time::Instant::now();
                    feed_watchdog(shared);
                }
            }
            _ = term.recv() => { log::info!("SIGTERM: shutting down"); return Ok(()); }
            _ = int.recv() => { log::info!("SIGINT: shutting down"); return Ok(()); }
            _ = hup.recv() => {
                // SIGHUP applies the file (and so ends a rollback).
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Reloading]);
                reload(shared, host, "SIGHUP", true, None);
                notify_ready(shared);
            }
            Some(()) = routes.recv() => {
                // Wait for the burst of notifications a change brings to settle.
                loop {
                    tokio::select! {
                        more = routes.recv() => if more.is_none() { break },
                        _ = tokio::time::sleep(super::interfaces::SETTLE) => break,
                    }
                }
                on_route_change(shared, host);
            }
            Some(()) = changes.recv() => {
                // Editors write in several steps: wait for the file to settle.
                tokio::time::sleep(Duration::from_millis(200)).await;
                while changes.try_recv().is_ok() {}
                let bytes = paceline_policy::bounds::read_file(&policy).ok();
                let now = bytes.as_deref().map(digest);
                let last = shared.lock().file_digest;
                if now != last {
                    shared.lock().file_digest = now;
                    // The reload reads the file again, and again while it does not validate
                    // and keeps changing (`read_settled`): a writer that truncates and then
                    // stalls must not make a torn read count as a bad policy.
                    reload(shared, host, "file change", false, None);
                }
            }
        }
    }
}

/// Tells systemd the agent is ready (or ready again after a reload), with a status line.
pub fn notify_ready(shared: &Shared) {
    let line = status_line(shared);
    if let Err(e) = sd_notify::notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&line),
    ]) {
        log::warn!("sd_notify READY=1: {e}");
    }
}

pub fn notify_stopping() {
    let _ = sd_notify::notify(&[
        sd_notify::NotifyState::Stopping,
        sd_notify::NotifyState::Status("stopping: detaching programs, removing qdiscs"),
    ]);
}

/// `STATUS=` for systemctl status: the policy and the health.
fn status_line(shared: &Shared) -> String {
    let live = shared.health(false);
    let h = if live.healthy() { shared.health(true) } else { live };
    let g = shared.lock();
    let p = &g.status.policy;
    let base = format!(
        "policy {} (hash {}, generation {}), {} on {}",
        p.name.as_deref().unwrap_or("-"),
        p.hash.chars().take(12).collect::<String>(),
        p.generation,
        g.status.enforcement.mode,
        g.status
            .interfaces
            .iter()
            .map(|i| i.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    match h.reasons.first() {
        None => base,
        Some(r) => format!("{}: {r}; {base}", h.status),
    }
}

/// WATCHDOG=1 while healthy (programs attached, maps live); otherwise only STATUS= with the
/// reason, so systemd restarts an agent whose datapath stays broken for WatchdogSec.
fn feed_watchdog(shared: &Shared) {
    let h = shared.health(false);
    let line = status_line(shared);
    let r = if h.healthy() {
        sd_notify::notify(&[
            sd_notify::NotifyState::Watchdog,
            sd_notify::NotifyState::Status(&line),
        ])
    } else {
        log::warn!("unhealthy, not feeding the watchdog: {}", h.reasons.join("; "));
        sd_notify::notify(&[sd_notify::NotifyState::Status(&line)])
    };
    if let Err(e) = r {
        log::warn!("sd_notify: {e}");
    }
}

/// Per-second watches of the counters that become events.
#[derive(Default)]
struct Watchers {
    drops: Option<u64>,
    quenched: Option<u64>,
    healthy: Option<bool>,
}

/// Drops beyond the horizon in one second that make a `drops` event.
const DROP_BURST: u64 = 100;

impl Watchers {
    fn tick(&mut self, shared: &Shared) {
        let (drops, quenched) = {
            let g = shared.lock();
            let Ok(dp) = g.dp() else { return };
            let drops = dp
                .snapshot()
                .map(|s| s.classes.iter().map(|c| c.drops_horizon).sum::<u64>())
                .ok();
            let quenched = if g.status.d3.is_some() {
                dp.d3_snapshot()
                    .ok()
                    .map(|d| d.iter().map(|c| c.quenched).sum::<u64>())
            } else {
                None
            };
            (drops, quenched)
        };
        if let (Some(now), Some(before)) = (drops, self.drops)
            && now.saturating_sub(before) >= DROP_BURST
        {
            shared.events.warn(
                "drops",
                format!(
                    "{} packets dropped beyond the horizon in the last second (senders above their rates)",
                    now - before
                ),
                json!({"dropped": now - before}),
            );
        }
        if let (Some(now), Some(before)) = (quenched, self.quenched)
            && now > before
        {
            shared.events.info(
                "d3_quench",
                format!(
                    "{} D3 flows gave up a deadline they could no longer meet",
                    now - before
                ),
                json!({"quenched": now - before}),
            );
        }
        self.drops = drops.or(self.drops);
        self.quenched = quenched.or(self.quenched);
        let h = shared.health(false);
        if self.healthy.is_some_and(|was| was != h.healthy()) {
            if h.healthy() {
                shared.events.info("health", "healthy again", json!(null));
            } else {
                shared.events.emit(
                    "health",
                    crate::runtime::events::Severity::Error,
                    format!("unhealthy: {}", h.reasons.join("; ")),
                    json!({"reasons": h.reasons}),
                );
            }
        }
        self.healthy = Some(h.healthy());
    }
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

/// After route notifications settle: re-resolves `auto` and applies the policy in force for
/// the new interfaces when they changed.
fn on_route_change(shared: &Shared, host: &SystemHost) {
    let (auto, current, text) = {
        let g = shared.lock();
        (
            g.compiled.interfaces_auto,
            g.compiled.interfaces.clone(),
            g.policy_text.clone(),
        )
    };
    if !auto {
        return;
    }
    let now = host.default_route_interfaces();
    if now == current {
        return;
    }
    if now.is_empty() {
        shared.events.warn(
            "route_change",
            format!(
                "no default route any more; keeping the interfaces {} until one comes back",
                current.join(", ")
            ),
            json!({"before": current, "after": now}),
        );
        return;
    }
    shared.events.info(
        "route_change",
        format!(
            "the default routes now leave through {} (before: {})",
            now.join(", "),
            current.join(", ")
        ),
        json!({"before": current, "after": now}),
    );
    let outcome = reload(shared, host, "route change", true, Some(text));
    if !outcome.ok() {
        log::error!("route change: the interfaces could not follow: {outcome:?}");
    }
}
