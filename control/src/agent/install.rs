//! The agent's changes to the host and their undo: each interface's classifier and root qdisc,
//! sock_ops, the D3 application map's pin and the D3 router's links.
//!
//! Every change is recorded in the state directory before it is made ([`crate::state`]), so
//! whatever stops the agent half-way (an error here, `kill -9` later) can be undone: by
//! [`install`] itself when a step fails, by [`recover`] at the next start, by [`uninstall`] at
//! shutdown.

use std::path::Path;

use anyhow::{Result, anyhow};

use crate::{
    attach,
    d3router::Router,
    datapath::Datapath,
    features::Features,
    policy::{Compiled, EnforcementMode},
    qdisc,
    shared::Shared,
    state::{self, State, StateDir},
    status::IfaceStatus,
};

/// What [`install`] set up: the datapath (attached), each interface's attach mode and qdisc,
/// and the D3 router when the policy has router links.
pub struct Installed {
    pub dp: Datapath,
    pub interfaces: Vec<IfaceStatus>,
    pub router: Option<Router>,
}

/// Undoes what a previous agent on this state directory left behind (it did not exit cleanly),
/// logging each step.
pub fn recover(dir: &StateDir) -> Result<()> {
    let Some(prev) = dir.leftover()? else {
        return Ok(());
    };
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
    dir.clear()
}

/// Attaches `dp` for the policy `compiled` in its mode: per interface the classifier and the
/// root qdisc the mode needs, then sock_ops, then D3's pin and router links (the pin under
/// `bpffs_dir`). On failure everything done so far is undone and the state cleared.
pub fn install(
    mut dp: Datapath,
    compiled: &Compiled,
    features: &Features,
    dir: &StateDir,
    bpffs_dir: &Path,
) -> Result<Installed> {
    // Everything changed on the host is recorded before it is changed.
    let mut st = State {
        pid: std::process::id(),
        ..State::default()
    };
    dir.save(&st)?;
    let mut ifaces = Vec::new();
    let mut router = None;
    let mode = compiled.mode;
    let result: Result<()> = (|| {
        for iface in &compiled.interfaces {
            let att = attach::attach_tc(&mut dp, iface, features, |added| {
                let s = st.iface(iface);
                s.clsact_filter = true;
                s.clsact_added = added;
                dir.save(&st)
            })?;
            let installed = match mode {
                EnforcementMode::Fq => {
                    st.iface(iface).qdisc = Some(qdisc::Installed::Fq);
                    dir.save(&st)?;
                    let p = qdisc::FqParams::for_policy(compiled.horizon_ns, fastest_paced_rate(compiled));
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
                att.mode.as_str(),
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
            let pin = bpffs_dir.join("d3_app");
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
                        features,
                        |_| {
                            st.iface(&l.interface).router_filter = true;
                            dir.save(&st)
                        },
                    )?;
                }
                router = Some(Router::new(&mut dp, &d3.router, d3.interval_ns)?);
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
    Ok(Installed {
        dp,
        interfaces: ifaces,
        router,
    })
}

/// Detaches the programs (dropping the datapath closes tcx/cgroup links and deletes netlink
/// filters), removes the qdiscs paceline installed and the state file.
pub fn uninstall(shared: &Shared, dir: &StateDir) {
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
