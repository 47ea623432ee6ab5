//! The agent: start-up, reloads, shutdown.
//!
//! Start: take the state-directory lock and undo what a previous agent left behind (after
//! `kill -9`), probe the kernel, load and compile the policy (a bad policy stops the start
//! with every error listed), load the datapath, write the policy, then per interface attach
//! the classifier and install the qdisc the enforcement mode needs; attach sock_ops; serve
//! `/metrics` and `/status`.
//!
//! Reload (file change or SIGHUP): a valid policy is compiled with the previous one as context
//! (classes keep their indices, so their clocks and counters keep their meaning) and written
//! to the inactive policy slot, which then becomes live: flows keep their clocks and no packet
//! is classified by a half-written policy. An invalid policy is rejected, logged and counted;
//! the running one stays in force. Fields that need a restart (interfaces, enforcement,
//! flow_table_size) are refused at reload with a message saying so.
//!
//! Shutdown (SIGTERM, SIGINT): detach everything, delete the qdiscs paceline installed (the
//! kernel's default root comes back), remove a clsact qdisc paceline added, clear the state.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context as _, Result, anyhow, bail};
use paceline_common::maps::TABLE_SOCK_TOS;
use tokio::signal::unix::{SignalKind, signal};

use crate::{
    attach::{self, AttachMode},
    d3router,
    datapath::{Datapath, LoadOptions},
    features::Features,
    http,
    policy::{self, CompileContext, Compiled, EnforcementMode, SystemHost, decide_mode},
    qdisc,
    shared::{Inner, Shared},
    state::{self, State, StateDir},
    status::{self, Enforcement, IfaceStatus, PolicyStatus, ReloadEvent, Status},
};

#[derive(Clone, Debug)]
pub struct Options {
    pub policy: PathBuf,
    pub metrics_addr: SocketAddr,
    pub state_dir: PathBuf,
    /// Where maps are pinned (the D3 application map: `<dir>/d3_app`).
    pub bpffs_dir: PathBuf,
}

/// The fastest rate any clock of the policy paces at (sizes fq's per-flow queue).
fn fastest_paced_rate(c: &Compiled) -> u64 {
    let classes = c.classes.iter().flat_map(|k| [k.flow_rate, k.class_rate]);
    let levels = c.levels.iter().map(|l| l.rate);
    classes
        .chain(levels)
        .flatten()
        .max()
        .unwrap_or(0)
        .max(125_000_000)
}

/// Runs the agent until SIGTERM/SIGINT.
pub async fn run(opts: Options) -> Result<()> {
    // From here on SIGTERM/SIGINT/SIGHUP are queued for the event loop instead of killing the
    // process half-way through the start (which would leave qdiscs behind).
    let signals = Signals {
        term: signal(SignalKind::terminate())?,
        int: signal(SignalKind::interrupt())?,
        hup: signal(SignalKind::hangup())?,
    };
    let dir = StateDir::lock(&opts.state_dir)?;
    if let Some(prev) = dir.leftover()? {
        let undone = state::clean_up(&prev);
        log::warn!(
            "a previous agent (pid {}) did not exit cleanly; {}",
            prev.pid,
            if undone.is_empty() {
                "it left nothing to undo"
            } else {
                "undoing what it left:"
            }
        );
        for line in undone {
            log::warn!("  {line}");
        }
        dir.clear()?;
    }

    let features = Features::probe();
    log::info!(
        "kernel {}: tcx={} sch_fq={} sch_htb={} clsact={} btf={} cgroup2={}",
        features.kernel_release,
        features.tcx,
        features.sch_fq,
        features.sch_htb,
        features.clsact,
        features.btf,
        features
            .cgroup2
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "none".into())
    );
    let degraded = features.degradations();
    for d in &degraded {
        log::warn!("degraded: {d}");
    }

    let host = SystemHost::new();
    let policy_file = opts.policy.display().to_string();
    let validated = policy::read(&opts.policy).and_then(|text| {
        let v = policy::parse_str(&text, &policy_file, &host)?;
        Ok((text, v))
    });
    let (policy_text, validated) = validated.map_err(|errs| {
        anyhow!(
            "policy rejected, nothing was loaded:\n  {}",
            errs.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n  ")
        )
    })?;
    let request = validated.enforcement();
    let mode = decide_mode(request, &features)?;
    let compiled = policy::compile(
        &validated,
        &CompileContext {
            mode,
            previous: None,
            all_routes_managed: policy::host::all_routes_managed(&host, &validated.interfaces),
        },
    );
    if compiled.table.flags & TABLE_SOCK_TOS != 0 {
        log::info!(
            "sock_ops marks TCP sockets with their level's DSCP (every route leaves through a managed interface)"
        );
    } else {
        log::info!(
            "sock_ops leaves TCP sockets' DSCP alone: the classifier rewrites it (some route leaves through an \
             interface the policy does not manage, or a rule matches on DSCP)"
        );
    }
    for w in &compiled.warnings {
        log::warn!("policy: {w}");
    }
    if compiled.interfaces.is_empty() {
        bail!("the policy selects no interface (spec.interfaces resolved to nothing on this host)");
    }

    let mut dp = Datapath::load(&LoadOptions {
        flow_table_size: compiled.flow_table_size,
        count_only: false,
    })?;
    let generation = dp.write_policy(&compiled.table)?;

    // Everything changed on the host is recorded before it is changed.
    let mut st = State {
        pid: std::process::id(),
        ..State::default()
    };
    dir.save(&st)?;
    let mut ifaces = Vec::new();
    let mut router = None;
    let result: Result<()> = (|| {
        for iface in &compiled.interfaces {
            let att = attach::attach_tc(&mut dp, iface, &features, |added| {
                let s = st.iface(iface);
                s.clsact_filter = true;
                s.clsact_added = added;
                dir.save(&st)
            })?;
            let installed = match mode {
                EnforcementMode::Fq => {
                    st.iface(iface).qdisc = Some(qdisc::Installed::Fq);
                    dir.save(&st)?;
                    let p = qdisc::FqParams::for_policy(compiled.horizon_ns, fastest_paced_rate(&compiled));
                    Some(qdisc::install_fq(iface, p)?)
                }
                EnforcementMode::Htb => {
                    st.iface(iface).qdisc = Some(qdisc::Installed::Htb);
                    dir.save(&st)?;
                    let plan = compiled.htb.as_ref().ok_or_else(|| {
                        anyhow!("no HTB plan: the link rate is unknown; set spec.link_rate")
                    })?;
                    Some(qdisc::install_htb(iface, plan, false)?)
                }
                EnforcementMode::SockopsOnly | EnforcementMode::None => None,
            };
            st.iface(iface).qdisc = installed.clone();
            dir.save(&st)?;
            log::info!(
                "{iface}: classifier attached ({}), root qdisc {}",
                match att.mode {
                    AttachMode::Tcx => "tcx",
                    AttachMode::Clsact => "clsact",
                },
                installed
                    .as_ref()
                    .map(|q| q.describe())
                    .unwrap_or_else(|| "unchanged".into())
            );
            ifaces.push(IfaceStatus {
                name: iface.clone(),
                attach: att.mode,
                qdisc: installed.map(|q| q.describe()),
            });
        }
        let needs_sockops = mode != EnforcementMode::None || compiled.d3.is_some();
        if needs_sockops && let Some(cg) = &features.cgroup2 {
            attach::attach_sock_ops(&mut dp, cg)?;
            log::info!("sock_ops attached to {}", cg.display());
        }
        if let Some(d3) = &compiled.d3 {
            let pin = opts.bpffs_dir.join("d3_app");
            st.pins.push(pin.clone());
            dir.save(&st)?;
            dp.pin_d3_app(&pin)?;
            log::info!(
                "D3 on: receiver {}, applications set deadlines through {}",
                if d3.receiver { "echoes requests" } else { "off" },
                pin.display()
            );
            if !d3.router.is_empty() {
                for l in &d3.router {
                    attach::attach_program(
                        &mut dp,
                        attach::TcProgram::D3Router,
                        &l.interface,
                        &features,
                        |_| {
                            st.iface(&l.interface).router_filter = true;
                            dir.save(&st)
                        },
                    )?;
                }
                router = Some(d3router::Router::new(&mut dp, &d3.router, d3.interval_ns)?);
                log::info!(
                    "D3 router on {} (capacity controller every {} us)",
                    d3.router
                        .iter()
                        .map(|l| l.interface.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    d3.interval_ns / 1000
                );
            }
        }
        Ok(())
    })();
    if let Err(e) = result {
        drop(dp);
        for line in state::clean_up(&st) {
            log::info!("undo: {line}");
        }
        dir.clear()?;
        return Err(e);
    }

    let status = Status {
        version: env!("CARGO_PKG_VERSION").into(),
        pid: std::process::id(),
        started_at: status::unix_now(),
        kernel: features.clone(),
        degraded,
        enforcement: Enforcement::of(mode),
        interfaces: ifaces,
        policy: PolicyStatus::of(&opts.policy, &compiled, generation),
        d3: compiled.d3.as_ref().map(|d| status::D3Status {
            receiver: d.receiver,
            app_map: opts.bpffs_dir.join("d3_app").display().to_string(),
            router_links: d.router.iter().map(|l| l.interface.clone()).collect(),
            interval_us: d.interval_ns / 1000,
        }),
        reloads: Default::default(),
        flow_table: status::FlowTable {
            capacity: compiled.flow_table_size,
            memlock_bytes: dp.flow_table_memlock(),
        },
        metrics_addr: opts.metrics_addr.to_string(),
    };
    let shared = Arc::new(Shared::new(Inner {
        policy_text,
        dp: Some(dp),
        router,
        status,
        compiled,
    }));
    write_status(&dir, &shared);

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut http_stop = stop_rx.clone();
    let server = http::serve(opts.metrics_addr, shared.clone(), async move {
        let _ = http_stop.wait_for(|s| *s).await;
    })
    .await;
    let server = match server {
        Ok(s) => s,
        Err(e) => {
            shutdown(&shared, &dir);
            return Err(e);
        }
    };
    let hash = shared.lock().compiled.hash.chars().take(12).collect::<String>();
    log::info!(
        "paceline running: policy {} (hash {hash}), metrics on http://{}/metrics",
        opts.policy.display(),
        opts.metrics_addr
    );

    let result = event_loop(&opts, &shared, &dir, &host, signals).await;
    let _ = stop_tx.send(true);
    let _ = server.await;
    shutdown(&shared, &dir);
    result
}

struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

async fn event_loop(
    opts: &Options,
    shared: &Arc<Shared>,
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
    let _watcher = watch_file(&opts.policy, tx)?;
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
            _ = hup.recv() => reload(opts, shared, dir, host, "SIGHUP", true, None),
            Some(()) = changes.recv() => {
                // Editors write in several steps: wait for the file to settle.
                tokio::time::sleep(Duration::from_millis(200)).await;
                while changes.try_recv().is_ok() {}
                let bytes = std::fs::read(&opts.policy).ok();
                let now = bytes.as_deref().map(digest);
                if now != last_bytes {
                    last_bytes = now;
                    // The bytes just read are the policy to check (text that is not UTF-8 is
                    // read again by the reload, which reports it).
                    let text = bytes.and_then(|b| String::from_utf8(b).ok());
                    reload(opts, shared, dir, host, "file change", false, text);
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

/// Applies the policy file if it is valid; otherwise keeps the running policy.
/// `text`: the policy file's content when the caller already read it (`None`: read it here).
fn reload(
    opts: &Options,
    shared: &Arc<Shared>,
    dir: &StateDir,
    host: &SystemHost,
    why: &str,
    force: bool,
    text: Option<String>,
) {
    let outcome = try_reload(opts, shared, host, force, text);
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
    opts: &Options,
    shared: &Arc<Shared>,
    host: &SystemHost,
    force: bool,
    text: Option<String>,
) -> Result<Option<u64>, Vec<String>> {
    let text = match text {
        Some(t) => t,
        None => policy::read(&opts.policy)
            .map_err(|errs| errs.iter().map(|e| e.to_string()).collect::<Vec<_>>())?,
    };
    let validated = policy::parse_str(&text, &opts.policy.display().to_string(), host)
        .map_err(|errs| errs.iter().map(|e| e.to_string()).collect::<Vec<_>>())?;
    let mut g = shared.lock();
    let mode = g.compiled.mode;
    let compiled = policy::compile(
        &validated,
        &CompileContext {
            mode,
            previous: Some(&g.compiled),
            all_routes_managed: policy::host::all_routes_managed(host, &validated.interfaces),
        },
    );
    if !force && compiled.hash == g.compiled.hash {
        return Ok(None);
    }
    let mut restart = Vec::new();
    if compiled.interfaces != g.compiled.interfaces {
        restart.push(format!(
            "spec.interfaces changed ({:?} -> {:?}): restart the agent to apply it",
            g.compiled.interfaces, compiled.interfaces
        ));
    }
    if decide_mode(validated.enforcement(), &g.status.kernel).ok() != Some(mode) {
        restart.push("spec.enforcement changed the enforcement mode: restart the agent to apply it".into());
    }
    if compiled.d3 != g.compiled.d3 {
        restart
            .push("spec.d3 changed (receiver, router links, interval): restart the agent to apply it".into());
    }
    if compiled.flow_table_size != g.compiled.flow_table_size {
        restart.push(format!(
            "spec.flow_table_size changed ({} -> {}): the flow table is sized at start; restart the agent",
            g.compiled.flow_table_size, compiled.flow_table_size
        ));
    }
    if !restart.is_empty() {
        return Err(restart);
    }
    // A slot that now names a different class or level starts from zero.
    for slot in compiled.slots_to_reset(Some(&g.compiled)) {
        g.dp_mut()
            .and_then(|dp| dp.reset_slot(slot))
            .map_err(|e| vec![format!("resetting counters slot {slot}: {e:#}")])?;
    }
    if mode == EnforcementMode::Htb
        && let Some(plan) = &compiled.htb
    {
        for iface in g.compiled.interfaces.clone() {
            qdisc::install_htb(&iface, plan, true)
                .map_err(|e| vec![format!("{iface}: updating HTB classes: {e:#}")])?;
        }
    }
    let generation = g
        .dp_mut()
        .and_then(|dp| dp.write_policy(&compiled.table))
        .map_err(|e| vec![format!("writing the policy map: {e:#}")])?;
    for w in &compiled.warnings {
        log::warn!("policy: {w}");
    }
    g.status.policy = PolicyStatus::of(&opts.policy, &compiled, generation);
    g.compiled = compiled;
    g.policy_text = text;
    Ok(Some(generation))
}

fn write_status(dir: &StateDir, shared: &Arc<Shared>) {
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

/// Detaches the programs (dropping the datapath closes tcx/cgroup links and deletes netlink
/// filters), removes the qdiscs paceline installed and the state file.
fn shutdown(shared: &Arc<Shared>, dir: &StateDir) {
    let st = dir.leftover().ok().flatten().unwrap_or_default();
    // Dropping the datapath detaches every program.
    {
        let mut g = shared.lock();
        g.router = None;
        drop(g.dp.take());
    }
    // The filters are gone with the programs; clsact and root qdiscs are paceline's to remove.
    let mut st = st;
    for i in &mut st.interfaces {
        i.clsact_filter = false;
        i.router_filter = false;
    }
    for line in state::clean_up(&st) {
        log::info!("shutdown: {line}");
    }
    if let Err(e) = dir.clear() {
        log::warn!("clearing the state file: {e:#}");
    }
    let _ = std::fs::remove_file(dir.path().join("status.json"));
    log::info!("paceline stopped; nothing left behind");
}
