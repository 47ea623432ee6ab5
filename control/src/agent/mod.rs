//! The agent: start-up, reloads, shutdown, in stages.
//!
//! Start ([`run`]): take the state-directory lock; mount a BPF filesystem and a cgroup2 hierarchy
//! where this mount namespace has none ([`crate::kernel::mounts`]); find what a previous agent left
//! (after `kill -9` or a crash its pinned datapath is still running: it is adopted, see
//! [`crate::kernel::persist`]); probe the kernel, load and compile the policy (a bad policy stops
//! the start with every error listed, and a running datapath stays as it is), load the datapath
//! (reusing the pinned maps whose layout is unchanged), write the policy, then [`install`]: per
//! interface attach the classifier (or give a pinned link the new program) and install the qdisc
//! the enforcement mode needs; attach sock_ops; pin D3's map and attach its router links. Then
//! serve `/metrics` and `/status`.
//!
//! Then [`watch`]: [`reload`] the policy on a file change or SIGHUP (see that module for what
//! a reload may change), tick the D3 router's controller, until SIGTERM or SIGINT.
//!
//! Shutdown ([`install::uninstall`]): unpin and detach everything, delete the qdiscs paceline
//! installed (the kernel's default root comes back), remove a clsact qdisc paceline added,
//! clear the state; then unmount what the agent mounted.
//!
//! # Layout
//! - here: [`Options`], [`run`]: the stages in order, and the status they start from.
//! - [`install`]: the host changes and their undo (on failure, at the next start, at
//!   shutdown).
//! - [`reload`]: applying a changed policy live, or refusing it.
//! - [`watch`]: the event loop (file watcher, signals, D3 timer).
//! - [`http`]: the metrics and API listeners (the API's bearer token: [`crate::runtime::auth`]).

pub mod http;
pub mod install;
pub mod interfaces;
pub mod reload;
pub mod watch;

use std::{net::SocketAddr, path::PathBuf, sync::Arc};

use anyhow::{Result, anyhow, bail};
use paceline_common::maps::TABLE_SOCK_TOS;

use serde_json::json;

use crate::host::SystemHost;
use crate::{
    kernel::datapath::{Datapath, EBPF_OBJECT, LoadOptions},
    kernel::features::Features,
    kernel::persist::{self, Pins},
    runtime::events::Events,
    runtime::shared::{Ctl, Inner, Shared},
    runtime::state::StateDir,
    status::{self, Enforcement, PolicyStatus, Status},
};
use paceline_policy::{self as policy, CompileContext, Compiled, Slots, Validated, decide_mode};

/// The state directory's record of how the pins were made ([`persist::Record`]).
const PINS_FILE: &str = "pins.json";
/// The state directory's record of which class owns each slot ([`Slots`]).
pub(crate) const SLOTS_FILE: &str = "slots.json";

#[derive(Clone, Debug)]
pub struct Options {
    pub policy: PathBuf,
    /// `/metrics`, `/healthz`, `/readyz`.
    pub metrics_addr: SocketAddr,
    /// `/status`, `/policy`, `/events`, `/flows`, `/classify`, the policy history, reload and
    /// rollback requests (and `/healthz`, `/readyz`). May equal `metrics_addr`.
    pub api_addr: SocketAddr,
    pub state_dir: PathBuf,
    /// Where the maps and links are pinned (see [`crate::kernel::persist`]; the D3 application map
    /// is `<dir>/d3_app`).
    pub bpffs_dir: PathBuf,
    /// The group that may open the D3 application map (`None`: root alone).
    pub d3_app_group: Option<u32>,
    /// The API's bearer token (see [`crate::runtime::auth`]); `None`: the API listens on loopback only.
    pub api_token_file: Option<PathBuf>,
}

/// Runs the agent until SIGTERM/SIGINT.
pub async fn run(opts: Options) -> Result<()> {
    // From here on SIGTERM/SIGINT/SIGHUP are queued for the event loop instead of killing the
    // process half-way through the start (which would leave qdiscs behind).
    let signals = watch::Signals::new()?;
    // Who may use the API is settled before anything on the host changes.
    crate::runtime::auth::check_listen(opts.api_addr, opts.api_token_file.as_deref())?;
    let api_auth = match &opts.api_token_file {
        Some(p) => Some(Arc::new(crate::runtime::auth::ApiAuth::open(p)?)),
        None => None,
    };
    let dir = Arc::new(StateDir::lock(&opts.state_dir)?);
    // A BPF filesystem for the pins and a cgroup2 hierarchy for sock_ops, mounted here where
    // this mount namespace has none (`ip netns exec`, a container); unmounted when `mounts` is
    // released at the end, or dropped on a failed start.
    let mounts = crate::kernel::mounts::Mounts::ensure(&opts.bpffs_dir, dir.path())?;
    let events = Events::open(dir.path());
    let pins = Pins::new(&opts.bpffs_dir).with_app_group(opts.d3_app_group);
    let recovered = install::recover(&dir, &pins)?;
    let previous = recovered.adopt();

    let features = probe();
    log::info!(
        "mounted by the agent: {}",
        if mounts.mounted().is_empty() {
            "nothing (the BPF filesystem and cgroup2 were there)".to_string()
        } else {
            mounts
                .mounted()
                .iter()
                .map(|m| m.describe())
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    let host = SystemHost::new();
    let (policy_text, validated) = load_policy(&opts, &host)?;
    let mode = decide_mode(validated.enforcement(), &features.support())?;
    let started = std::time::Instant::now();
    // A previous agent's classes keep their counter and clock slots (its datapath is adopted).
    let slots = previous.as_ref().and_then(|_| dir.read_json::<Slots>(SLOTS_FILE));
    let compiled = policy::compile(
        &validated,
        &CompileContext {
            mode,
            previous: slots.as_ref(),
            all_routes_managed: policy::host::all_routes_managed(&host, &validated.interfaces),
        },
    )
    .map_err(|e| anyhow::anyhow!("policy rejected, nothing was loaded:\n  {e}"))?;
    let compile_secs = started.elapsed().as_secs_f64();
    if compiled.interfaces.is_empty() {
        bail!("the policy selects no interface (spec.interfaces resolved to nothing on this host)");
    }

    // The maps a previous agent pinned are reused where their layout is this build's.
    let load = LoadOptions {
        flow_table_size: compiled.flow_table_size,
        dasr_maps: compiled.dasr.is_some(),
        pins: Some(pins.clone()),
        ..LoadOptions::default()
    };
    let expected = persist::expected_layouts(EBPF_OBJECT, &load.map_sizes())?;
    let adoption = pins.prepare(&expected, dir.read_json::<persist::Record>(PINS_FILE).as_ref())?;
    if !adoption.kept.is_empty() {
        log::info!("kept the previous agent's maps: {}", adoption.kept.join(", "));
    }
    for (name, why) in &adoption.reset {
        log::warn!("reset {name}: {why}");
    }
    let mut dp = Datapath::load(&load)?;
    dir.write_json(PINS_FILE, &persist::Record::of_this_build(expected))?;
    for slot in compiled.slots_to_reset(slots.as_ref()) {
        dp.reset_slot(slot)?;
    }
    // What `paceline_policy_apply_seconds` says, as a reload's: compile and write. Loading
    // (verifying) the datapath between them is not the policy's time.
    let write_started = std::time::Instant::now();
    let generation = dp.write_policy(&compiled.table, &compiled.ctab)?;
    let apply = compile_secs + write_started.elapsed().as_secs_f64();
    dir.write_json(SLOTS_FILE, &compiled.slots())?;
    log_applied(&compiled, generation, apply);
    let installed = install::install(dp, &compiled, &features, &dir, &pins, previous)?;
    log_compiled(&compiled, installed.sock_ops);

    let mut status = start_status(&opts, features.clone(), &compiled, generation, &installed);
    status.mounted = mounts.mounted().to_vec();
    status.policy.apply_seconds = apply;
    status.policy.source = "start".into();
    let degraded = paceline_policy::degradations_for(&features.support(), &compiled, installed.sock_ops);
    status.degraded = degraded.clone();
    let shared = Arc::new(Shared::new(
        Inner {
            policy_text: policy_text.clone(),
            dp: Some(installed.dp),
            router: installed.router,
            status,
            compiled,
            attachments: installed.attachments,
            sock_ops: installed.sock_ops,
            state: installed.state,
            netlink: crate::kernel::qstats::QdiscStats::new()
                .map_err(|e| log::warn!("no netlink socket for qdisc statistics: {e:#}"))
                .ok(),
            iface_changes: Default::default(),
            history_generation: 0,
            file_digest: None,
        },
        events,
        Ctl {
            policy: opts.policy.clone(),
            dir: dir.clone(),
            pins: pins.clone(),
        },
    ));
    record_start(&shared, &policy_text, recovered, &degraded);
    reload::write_status(&shared);

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server = http::serve(
        opts.metrics_addr,
        opts.api_addr,
        api_auth,
        shared.clone(),
        stop_rx,
    )
    .await;
    let servers = match server {
        Ok(s) => s,
        Err(e) => {
            install::uninstall(&shared, &dir, &pins);
            mounts.release();
            return Err(e);
        }
    };
    let hash = shared.lock().compiled.hash.chars().take(12).collect::<String>();
    log::info!(
        "paceline running: policy {} (hash {hash}), metrics on http://{}/metrics, API on http://{}",
        opts.policy.display(),
        opts.metrics_addr,
        opts.api_addr
    );
    watch::notify_ready(&shared);

    let result = watch::watch(&shared, &host, signals).await;
    watch::notify_stopping();
    let _ = stop_tx.send(true);
    for s in servers {
        let _ = s.await;
    }
    shared.events.info(
        "stop",
        "the agent stops: programs detached, qdiscs removed",
        json!(null),
    );
    install::uninstall(&shared, &dir, &pins);
    // After the pins and links are gone: the BPF filesystem is empty, sock_ops detached.
    mounts.release();
    result
}

/// The start in the event log and the policy history.
fn record_start(shared: &Shared, text: &str, recovered: install::Recovered, degraded: &[String]) {
    let mut g = shared.lock();
    let c = &g.compiled;
    let hist = shared
        .history
        .record(
            text,
            &c.hash,
            c.name.as_deref(),
            "start",
            &shared.ctl.policy.display().to_string(),
        )
        .unwrap_or_else(|e| {
            log::warn!("recording the policy history: {e:#}");
            0
        });
    let data = json!({
        "hash": c.hash,
        "interfaces": c.interfaces,
        "mode": c.mode.as_str(),
        "history_generation": hist,
    });
    let msg = format!(
        "agent {} started: policy {} (hash {}), {} on {}",
        env!("CARGO_PKG_VERSION"),
        shared.ctl.policy.display(),
        &c.hash[..12.min(c.hash.len())],
        c.mode.as_str(),
        c.interfaces.join(", ")
    );
    g.history_generation = hist;
    g.status.policy.history_generation = hist;
    drop(g);
    match recovered {
        install::Recovered::Undone(undone) => {
            let mut data = data;
            data["undone"] = json!(undone);
            shared.events.warn(
                "restart",
                format!("{msg}, after an agent that did not exit cleanly (its leftovers undone first)"),
                data,
            );
        }
        install::Recovered::Adopted(prev) => {
            let mut data = data;
            data["adopted_from_pid"] = json!(prev.pid);
            shared.events.warn(
                "restart",
                format!(
                    "{msg}, adopting the datapath of agent pid {} that did not exit cleanly (its pinned links and maps)",
                    prev.pid
                ),
                data,
            );
        }
        install::Recovered::Clean => {
            shared.events.info("start", msg, data);
        }
    }
    for d in degraded {
        shared.events.warn("degraded", d.clone(), json!(null));
    }
}

/// Probes the kernel and logs what it offers and what is degraded.
fn probe() -> Features {
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
    // What the kernel lacks is logged here; what that costs *this policy* is the `degraded`
    // event after the policy is compiled (policy::degradations_for).
    for d in &features.degradations() {
        log::info!("kernel: {d}");
    }
    features
}

/// Reads the policy once and validates what it read (the text kept is the text applied); an
/// invalid policy stops the start with every error listed.
fn load_policy(opts: &Options, host: &SystemHost) -> Result<(String, Validated)> {
    let policy_file = opts.policy.display().to_string();
    let validated = policy::read(&opts.policy).and_then(|text| {
        let v = policy::parse_str(&text, &policy_file, host)?;
        Ok((text, v))
    });
    validated.map_err(|errs| {
        anyhow!(
            "policy rejected, nothing was loaded:\n  {}",
            errs.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n  ")
        )
    })
}

/// What applying a policy took, in the log (and in `/status` and the metrics).
pub(crate) fn log_applied(c: &Compiled, generation: u64, seconds: f64) {
    let st = &c.ctab.stats;
    log::info!(
        "policy generation {generation} applied in {:.0} ms: {} rules, classifier {} words, {} selector and {} rule entries (about {:.1} MiB of kernel memory)",
        seconds * 1e3,
        st.rules,
        st.words,
        st.sel_entries,
        st.rule_entries,
        st.kernel_bytes() as f64 / 1048576.0
    );
}

/// Logs whether sock_ops marks sockets, and the policy's warnings.
pub(crate) fn log_compiled(compiled: &Compiled, sock_ops: bool) {
    if !sock_ops {
        log::info!(
            "sock_ops is not attached (no cgroup v2, or enforcement: none): TCP sockets are not marked; \
             the classifier rewrites their DSCP"
        );
    } else if compiled.table.flags & TABLE_SOCK_TOS != 0 {
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
}

/// The status at start: the kernel, the enforcement, what [`install`] set up, the policy.
fn start_status(
    opts: &Options,
    features: Features,
    compiled: &Compiled,
    generation: u64,
    installed: &install::Installed,
) -> Status {
    Status {
        version: env!("CARGO_PKG_VERSION").into(),
        pid: std::process::id(),
        started_at: status::unix_now(),
        degraded: Vec::new(),
        kernel: features,
        enforcement: Enforcement::of(compiled.mode),
        interfaces: installed.interfaces.clone(),
        policy: {
            let mut p = PolicyStatus::of(&opts.policy, compiled, generation);
            // sock_ops marks sockets only where it is attached.
            p.tcp_dscp_by_socket &= installed.sock_ops;
            p
        },
        d3: compiled.d3.as_ref().map(|d| status::D3Status {
            receiver: d.receiver,
            app_map: opts.bpffs_dir.join("d3_app").display().to_string(),
            router_links: d.router.iter().map(|l| l.interface.clone()).collect(),
            interval_us: d.interval_ns / 1000,
        }),
        dasr: compiled.dasr.as_ref().map(status::DasrStatus::of),
        reloads: Default::default(),
        flow_table: status::FlowTable {
            capacity: compiled.flow_table_size,
            memlock_bytes: installed.dp.flow_table_memlock(),
        },
        metrics_addr: opts.metrics_addr.to_string(),
        api_addr: opts.api_addr.to_string(),
        mounted: Vec::new(),
    }
}
