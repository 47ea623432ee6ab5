//! What the agent's event loop, its reloads and the HTTP handlers share: the loaded datapath,
//! the D3 router, the compiled policy in force and its text, the status, what is attached
//! where. One lock guards them all (a scrape, a reload and a controller tick never
//! interleave). The event log and the policy history have their own (they are written while
//! the lock is held, and read by the HTTP handlers without it).

use std::{
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard},
};

use anyhow::{Result, anyhow};
use aya::programs::tc::TcAttachType;

use crate::{
    d3router::Router,
    flows::{self, Flows},
    kernel::attach::{AttachMode, TcAttachment, TcProgram},
    kernel::datapath::{self, Datapath},
    kernel::qstats::QdiscStats,
    metrics::{self, OpsMetrics},
    runtime::events::Events,
    runtime::health::{Check, Health},
    runtime::history::History,
    runtime::state::{State, StateDir},
    status::{LiveStatus, Status},
};
use paceline_policy::Compiled;

pub struct Shared {
    inner: Mutex<Inner>,
    pub events: Events,
    pub history: History,
    /// The policy file, the state directory, where maps are pinned.
    pub ctl: Ctl,
    /// The API's token guard, when `--api-token-file` is given (its refusals are metrics).
    api_auth: std::sync::OnceLock<Arc<crate::runtime::auth::ApiAuth>>,
    /// The alerts the webhook acted on (each acts once).
    pub alerts: crate::runtime::alerts::Alerts,
}

/// What the agent was started with that reloads and requests need.
pub struct Ctl {
    pub policy: PathBuf,
    pub dir: Arc<StateDir>,
    /// Where the maps and links are pinned (an interface `auto` leaves has its link unpinned).
    pub pins: crate::kernel::persist::Pins,
}

/// Interfaces attached and detached since the start (`auto` following the routes).
#[derive(Clone, Copy, Debug, Default)]
pub struct IfaceChanges {
    pub attached: u64,
    pub detached: u64,
}

/// The shared state, behind [`Shared::lock`].
pub struct Inner {
    /// The text of the policy in force (served at `/policy`, for `paceline policy diff`).
    pub policy_text: String,
    /// `None` once shutdown has detached the programs.
    pub dp: Option<Datapath>,
    pub router: Option<Router>,
    pub status: Status,
    /// The policy in force, compiled for the running mode and interfaces.
    pub compiled: Compiled,
    /// The classifier's attachment on each managed interface (detached when `auto` moves away
    /// from an interface).
    pub attachments: Vec<TcAttachment>,
    /// sock_ops is attached.
    pub sock_ops: bool,
    /// What is recorded in `state.json` (what a start after a crash undoes).
    pub state: State,
    /// Netlink for the qdisc statistics and the health check's filter lookups.
    pub netlink: Option<QdiscStats>,
    pub iface_changes: IfaceChanges,
    /// The history generation of the policy in force.
    pub history_generation: u64,
    /// A digest of the policy file's bytes as last read by any reload of the file (the file
    /// watcher, SIGHUP, a reload request): the watcher reloads only when the file differs.
    pub file_digest: Option<u64>,
}

/// The maps' kernel memory for `/status` and a scrape, read each time (a reload may have grown
/// a bank's maps) and before the agent's lock is taken: it reads `/proc`, not the agent's state.
fn kernel_memory() -> Option<crate::status::KernelMemory> {
    crate::kernel::memory::of_this_process()
        .map_err(|e| log::debug!("reading the maps' kernel memory: {e}"))
        .ok()
}

impl Shared {
    pub fn new(inner: Inner, events: Events, ctl: Ctl) -> Shared {
        Shared {
            inner: Mutex::new(inner),
            history: History::new(ctl.dir.path()),
            events,
            ctl,
            api_auth: std::sync::OnceLock::new(),
            alerts: Default::default(),
        }
    }

    /// Records the API's token guard (once, when the listeners start).
    pub fn set_api_auth(&self, a: Arc<crate::runtime::auth::ApiAuth>) {
        let _ = self.api_auth.set(a);
    }

    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves data that is still consistent enough to read.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `/metrics`: the Prometheus text of the counters, labelled by the status.
    pub fn metrics(&self) -> Result<String> {
        let memory = kernel_memory();
        let mut g = self.lock();
        let mut ops = g.ops_metrics();
        ops.api_refused = self.api_auth.get().map(|a| a.refused());
        ops.kernel_memory = memory;
        let dp = g.dp()?;
        let d3 = if g.status.d3.is_some() {
            Some(dp.d3_snapshot()?)
        } else {
            None
        };
        let links = g.router.as_ref().map(|r| r.report(dp)).unwrap_or_default();
        let mut text = metrics::render_with(&dp.snapshot()?, d3.as_deref(), &links, &g.status, &ops)?;
        if g.status.dasr.is_some() {
            text.push_str(&crate::metrics::dasr::render(&crate::dasr::report(dp)?)?);
        }
        Ok(text)
    }

    /// The text of the policy in force.
    pub fn policy_text(&self) -> String {
        self.lock().policy_text.clone()
    }

    /// One tick of the D3 router's capacity controller.
    pub fn d3_tick(&self) -> Result<()> {
        let mut g = self.lock();
        let Inner { dp, router, .. } = &mut *g;
        if let (Some(dp), Some(router)) = (dp.as_mut(), router.as_mut()) {
            router.tick(dp)?;
        }
        Ok(())
    }

    /// `/status`: the status with live counters.
    pub fn live_status(&self) -> Result<LiveStatus> {
        let memory = kernel_memory();
        let g = self.lock();
        let dp = g.dp()?;
        let snap = dp.snapshot()?;
        let d3 = if g.status.d3.is_some() {
            Some(dp.d3_snapshot()?)
        } else {
            None
        };
        let links = g.router.as_ref().map(|r| r.report(dp)).unwrap_or_default();
        let dasr = match g.status.dasr {
            Some(_) => Some(crate::dasr::report(dp)?),
            None => None,
        };
        Ok(LiveStatus::new(g.status.clone(), &snap, d3.as_deref(), &links)
            .with_dasr(dasr.as_ref())
            .with_kernel_memory(memory))
    }

    /// `/healthz` (`readiness` false) and `/readyz` (true).
    pub fn health(&self, readiness: bool) -> Health {
        let mut g = self.lock();
        Health::of(g.checks(), readiness)
    }

    /// `/flows`: the flow table, at most `top` flows (of `class`, if given).
    pub fn flows(&self, top: usize, class: Option<&str>) -> Result<Flows> {
        let g = self.lock();
        let dp = g.dp()?;
        // A policy that tracks no flow without a local socket (`TABLE_UNTRACKED_FLOWS`) lists
        // none from the table: what it holds is left from an earlier policy.
        let flags = dp.live_policy().map(|t| t.flags).unwrap_or(0);
        let tracked = flags & paceline_common::maps::TABLE_UNTRACKED_FLOWS == 0;
        // Every entry is read to filter by class and order by departure; the table is bounded
        // (spec.flow_table_size).
        let (entries, total) = if tracked {
            dp.flows(usize::MAX)?
        } else {
            (Vec::new(), 0)
        };
        let now = flows::monotonic_ns();
        let view = flows::TableView {
            compiled: &g.compiled,
            generation: dp.generation(),
            clocks: dp
                .live_policy()
                .map(|t| t.flags & paceline_common::maps::TABLE_NO_FLOW_CLOCKS == 0)
                .unwrap_or(true),
        };
        let mut rows: Vec<flows::FlowRow> =
            entries.iter().map(|(k, s)| flows::row(view, k, s, now)).collect();
        let generation = dp.generation();
        let sockets = crate::kernel::sockdiag::socket_rows(Some(dp.sock_storage_fd()), |proto, t, st| {
            let cached = st
                .filter(|s| s.generation == generation && generation != 0)
                .and_then(|s| g.compiled.classes.iter().find(|k| k.index == s.class));
            cached
                .or_else(|| flows::class_of(&g.compiled, &flows::socket_key(proto, t.0, t.1, t.2, t.3)))
                .map(|c| c.name.clone())
                .unwrap_or_else(|| "?".into())
        });
        let n_sockets = sockets.len();
        rows.extend(sockets);
        Ok(Flows {
            total,
            capacity: g.status.flow_table.capacity,
            sockets: n_sockets,
            tracked,
            untracked_classes: flags & paceline_common::maps::TABLE_UNTRACKED_CLASSES != 0,
            flows: flows::select(rows, class, top),
        })
    }
}

impl Inner {
    pub fn dp(&self) -> Result<&Datapath> {
        self.dp
            .as_ref()
            .ok_or_else(|| anyhow!("the agent is shutting down"))
    }

    pub fn dp_mut(&mut self) -> Result<&mut Datapath> {
        self.dp
            .as_mut()
            .ok_or_else(|| anyhow!("the agent is shutting down"))
    }

    /// The metrics that come from the host rather than the datapath: each managed interface's
    /// root qdisc, interface changes, the history generation.
    pub fn ops_metrics(&mut self) -> OpsMetrics {
        let mut qdiscs = Vec::new();
        if let Some(nl) = self.netlink.as_mut() {
            for i in &self.status.interfaces {
                let Ok(idx) = nix::net::if_::if_nametoindex(i.name.as_str()) else {
                    continue;
                };
                if let Ok(Some(s)) = nl.root_stats(idx) {
                    qdiscs.push((i.name.clone(), s));
                }
            }
        }
        OpsMetrics {
            qdiscs,
            interfaces_attached: self.iface_changes.attached,
            interfaces_detached: self.iface_changes.detached,
            history_generation: self.history_generation,
            sock_ops: self.sock_ops,
            api_refused: None,
            kernel_memory: None,
        }
    }

    /// The health checks (see [`crate::runtime::health`]).
    pub fn checks(&mut self) -> Vec<Check> {
        let mut out = Vec::new();
        let Some(dp) = self.dp.as_ref() else {
            out.push(Check::fail(
                "datapath",
                "the agent is shutting down: programs detached",
            ));
            return out;
        };
        out.push(Check::ok("datapath", "programs and maps loaded"));
        let expected = dp.generation();
        out.push(match dp.live_policy() {
            Ok(t) if t.generation == expected => {
                Check::ok("policy_map", format!("generation {expected} live"))
            }
            Ok(t) => Check::fail(
                "policy_map",
                format!(
                    "the datapath reads generation {}, the agent wrote {expected}",
                    t.generation
                ),
            ),
            Err(e) => Check::fail("policy_map", format!("reading the policy map: {e:#}")),
        });
        let tc_id = dp.program_id(datapath::TC_EGRESS);
        let so_id = dp.program_id(datapath::SOCK_OPS);
        for a in &self.attachments {
            let name = format!("attached:{}", a.iface);
            let Ok(idx) = nix::net::if_::if_nametoindex(a.iface.as_str()) else {
                out.push(Check::fail(name, format!("interface {} is gone", a.iface)));
                continue;
            };
            let found = match a.mode {
                AttachMode::Tcx => aya::programs::SchedClassifier::query_tcx(&a.iface, TcAttachType::Egress)
                    .map(|(_, progs)| progs.iter().any(|p| Some(p.id()) == tc_id))
                    .map_err(|e| anyhow!("{e}")),
                AttachMode::Clsact => match self.netlink.as_mut() {
                    Some(nl) => nl.has_egress_bpf_filter(idx, TcProgram::Egress.nl_priority()),
                    None => Err(anyhow!("no netlink socket")),
                },
            };
            out.push(match found {
                Ok(true) => Check::ok(name, format!("classifier attached ({})", a.mode.as_str())),
                Ok(false) => Check::fail(
                    name,
                    format!(
                        "the classifier is no longer attached to {} ({})",
                        a.iface,
                        a.mode.as_str()
                    ),
                ),
                Err(e) => Check::fail(name, format!("querying {}: {e:#}", a.iface)),
            });
        }
        if self.sock_ops {
            let found = aya::programs::loaded_links()
                .flatten()
                .any(|l| Some(l.program_id()) == so_id);
            out.push(if found {
                Check::ok("sock_ops", "attached to the cgroup v2 root")
            } else {
                Check::fail("sock_ops", "the sock_ops link is gone")
            });
        }
        out.push(match &self.status.reloads.last {
            Some(l) if !l.applied => Check::fail(
                "last_reload",
                format!(
                    "rejected, the previous policy stays in force: {}",
                    l.errors.first().cloned().unwrap_or_default()
                ),
            ),
            _ => Check::ok("last_reload", "applied"),
        });
        out
    }
}
