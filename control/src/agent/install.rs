//! The agent's changes to the host and their undo: each interface's classifier and root qdisc,
//! sock_ops, DASR's ingress program, the D3 application map's pin and the D3 router's links.
//!
//! Every change is recorded in the state directory before it is made ([`crate::runtime::state`]).
//! The programs' links and the maps are pinned ([`crate::kernel::persist`]): after `kill -9` or a
//! crash the datapath goes on with the last policy, and the next start adopts it (the same links
//! get the new programs, the maps with an unchanged layout are kept) rather than undoing it. A
//! failed install undoes what it did; [`uninstall`] (a clean stop) and `paceline cleanup` remove
//! everything.

use anyhow::{Result, anyhow};

use crate::{
    d3router::Router,
    kernel::attach,
    kernel::datapath::Datapath,
    kernel::features::Features,
    kernel::persist::Pins,
    kernel::qdisc,
    runtime::shared::Shared,
    runtime::state::{self, IfaceState, State, StateDir},
    status::IfaceStatus,
};
use paceline_policy::{Compiled, EnforcementMode};

/// What [`install`] set up: the datapath (attached), each interface's attach mode and qdisc,
/// and the D3 router when the policy has router links.
pub struct Installed {
    pub dp: Datapath,
    pub interfaces: Vec<IfaceStatus>,
    pub router: Option<Router>,
    /// The classifier's attachment on each interface (to detach one when `auto` moves away).
    pub attachments: Vec<attach::TcAttachment>,
    /// sock_ops is attached.
    pub sock_ops: bool,
    /// What `state.json` records.
    pub state: State,
}

/// What a previous agent on this state directory left behind (it did not exit cleanly).
pub enum Recovered {
    /// Nothing: the previous agent stopped cleanly, or there was none.
    Clean,
    /// Its links are pinned, so its datapath is still running: [`install`] adopts it.
    Adopted(State),
    /// No pins (an older agent, or pins removed by hand): what it left was undone.
    Undone(Vec<String>),
}

impl Recovered {
    /// The state for [`install`] to adopt.
    pub fn adopt(&self) -> Option<State> {
        match self {
            Recovered::Adopted(s) => Some(s.clone()),
            _ => None,
        }
    }
}

/// What a previous agent on this state directory left behind (it did not exit cleanly). With
/// its links pinned, its datapath is still running: the state is returned for [`install`] to
/// adopt. Without (an older agent, or pins removed by hand) it is undone, each step logged.
pub fn recover(dir: &StateDir, pins: &Pins) -> Result<Recovered> {
    let Some(prev) = dir.leftover()? else {
        return Ok(Recovered::Clean);
    };
    if pins.has_links() {
        log::warn!(
            "a previous agent (pid {}) did not exit cleanly; its datapath is still running: adopting it",
            prev.pid
        );
        return Ok(Recovered::Adopted(prev));
    }
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
    for line in &undone {
        log::warn!("  {line}");
    }
    dir.clear()?;
    Ok(Recovered::Undone(undone))
}

/// Attaches `dp` for the policy `compiled` in its mode: per interface the classifier and the
/// root qdisc the mode needs, then sock_ops, then D3's pin and router links (the pin under
/// `bpffs_dir`). On failure everything done so far is undone and the state cleared.
pub fn install(
    mut dp: Datapath,
    compiled: &Compiled,
    features: &Features,
    dir: &StateDir,
    pins: &Pins,
    previous: Option<State>,
) -> Result<Installed> {
    // Everything changed on the host is recorded before it is changed. A previous agent's
    // interfaces stay recorded until they are adopted or undone.
    let previous = previous.unwrap_or_default();
    let mut st = State {
        pid: std::process::id(),
        interfaces: previous.interfaces.clone(),
        pins: previous.pins.clone(),
    };
    dir.save(&st)?;
    let was = |name: &str| {
        previous
            .interfaces
            .iter()
            .find(|i| i.name == name)
            .cloned()
            .unwrap_or_default()
    };
    // Interfaces the previous agent managed that this policy does not: undone.
    for old in previous
        .interfaces
        .iter()
        .filter(|i| !compiled.interfaces.contains(&i.name))
    {
        for which in [
            attach::TcProgram::Egress,
            attach::TcProgram::D3Router,
            attach::TcProgram::DasrIngress,
        ] {
            let _ = std::fs::remove_file(pins.link(&which.pin_name(&old.name)));
        }
        for line in state::clean_up(&State {
            interfaces: vec![old.clone()],
            ..State::default()
        }) {
            log::info!("{line}");
        }
        st.interfaces.retain(|i| i.name != old.name);
        dir.save(&st)?;
    }
    let mut ifaces = Vec::new();
    let mut attachments = Vec::new();
    let mut sock_ops = false;
    let mut router = None;
    let mode = compiled.mode;
    let result: Result<()> = (|| {
        for iface in &compiled.interfaces {
            let before: IfaceState = was(iface);
            let (status, att) =
                install_iface(&mut dp, iface, compiled, features, dir, &mut st, pins, &before)?;
            ifaces.push(status);
            attachments.push(att);
        }
        let needs_sockops = mode != EnforcementMode::None || compiled.d3.is_some() || compiled.dasr.is_some();
        if needs_sockops && let Some(cg) = &features.cgroup2 {
            let adopted = attach::attach_sock_ops(&mut dp, cg, pins)?;
            sock_ops = true;
            log::info!(
                "sock_ops {} {}",
                if adopted { "adopted on" } else { "attached to" },
                cg.display()
            );
        } else {
            let _ = std::fs::remove_file(pins.link("sock_ops"));
        }
        if let Some(d) = &compiled.dasr {
            crate::dasr::configure(&mut dp, d, &compiled.interfaces)?;
            for iface in &compiled.interfaces {
                let had = was(iface).ingress_filter;
                attach::attach_program(
                    &mut dp,
                    attach::TcProgram::DasrIngress,
                    iface,
                    features,
                    pins,
                    had,
                    |added| {
                        let s = st.iface(iface);
                        s.ingress_filter = true;
                        s.clsact_added |= added;
                        dir.save(&st)
                    },
                )?;
            }
            log::info!(
                "DASR on {}: receiver {}, sender {}; a flow counts as sending for {} us to {} us after its last data segment",
                compiled.interfaces.join(", "),
                if d.receiver {
                    d.interfaces
                        .iter()
                        .map(|l| {
                            format!(
                                "{} advertises {}",
                                l.interface,
                                paceline_policy::units::fmt_rate(l.line_rate)
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                } else {
                    "off".into()
                },
                if d.sender { "on" } else { "off" },
                d.min_window_ns() / 1000,
                2 * d.min_window_ns() / 1000
            );
        }
        if compiled.dasr.is_none() {
            // A previous agent's DASR ingress program is not adopted: its link or filter goes.
            for iface in &compiled.interfaces {
                let _ = std::fs::remove_file(pins.link(&attach::TcProgram::DasrIngress.pin_name(iface)));
                if was(iface).ingress_filter {
                    if let Err(e) = attach::remove_stale_filter(iface, attach::TcProgram::DasrIngress) {
                        log::warn!("{iface}: removing the previous agent's DASR ingress filter: {e:#}");
                    }
                    st.iface(iface).ingress_filter = false;
                    dir.save(&st)?;
                }
            }
        }
        if let Some(d3) = &compiled.d3 {
            let pin = pins.root().join("d3_app");
            st.pins.push(pin.clone());
            dir.save(&st)?;
            dp.pin_d3_app(&pin, pins.app_group())?;
            log::info!(
                "D3 on: receiver {}, applications set deadlines through {}",
                if d3.receiver { "echoes requests" } else { "off" },
                pin.display()
            );
            if !d3.router.is_empty() {
                for l in &d3.router {
                    let had = was(&l.interface).router_filter;
                    attach::attach_program(
                        &mut dp,
                        attach::TcProgram::D3Router,
                        &l.interface,
                        features,
                        pins,
                        had,
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
        for line in pins.remove_all() {
            log::info!("undo: {line}");
        }
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
        attachments,
        sock_ops,
        state: st,
    })
}

/// Attaches the classifier to `iface` (or gives a previous agent's pinned link or filter the
/// new program) and installs the root qdisc `compiled`'s mode needs, recording each step in
/// `st` (saved in `dir`) before it is taken. `before`: what a previous agent recorded there.
#[allow(clippy::too_many_arguments)] // reason: the install's context, passed through as it is
pub fn install_iface(
    dp: &mut Datapath,
    iface: &str,
    compiled: &Compiled,
    features: &Features,
    dir: &StateDir,
    st: &mut State,
    pins: &Pins,
    before: &IfaceState,
) -> Result<(IfaceStatus, attach::TcAttachment)> {
    let att = attach::attach_tc(dp, iface, features, pins, before.clsact_filter, |added| {
        let s = st.iface(iface);
        s.clsact_filter = true;
        s.clsact_added |= added;
        dir.save(st)
    })?;
    // A root qdisc the previous agent installed is ours to replace.
    let ours = before.qdisc.is_some();
    let installed = match compiled.mode {
        EnforcementMode::Fq => {
            st.iface(iface).qdisc = Some(qdisc::Installed::Fq);
            dir.save(st)?;
            let p = qdisc::FqParams::for_policy(compiled.horizon_ns, fastest_paced_rate(compiled));
            Some(qdisc::install_fq(iface, p, ours)?)
        }
        EnforcementMode::Htb => {
            st.iface(iface).qdisc = Some(qdisc::Installed::Htb);
            dir.save(st)?;
            let plan = compiled
                .htb
                .as_ref()
                .ok_or_else(|| anyhow!("no HTB plan: the link rate is unknown; set spec.link_rate"))?;
            // HTB has no "change" of its root: an HTB root a previous agent installed keeps its
            // qdisc and gets this plan's classes.
            let htb_root =
                ours && qdisc::root_qdisc(iface)?.is_some_and(|q| q.kind == "htb" && q.handle == "1:");
            Some(qdisc::install_htb(iface, plan, htb_root, ours)?)
        }
        EnforcementMode::SockopsOnly | EnforcementMode::None => None,
    };
    st.iface(iface).qdisc = installed.clone();
    dir.save(st)?;
    log::info!(
        "{iface}: classifier {} ({}), root qdisc {}",
        if att.adopted {
            "adopted from the previous agent"
        } else {
            "attached"
        },
        att.mode.as_str(),
        installed
            .as_ref()
            .map(|q| q.describe())
            .unwrap_or_else(|| "unchanged".into())
    );
    Ok((
        IfaceStatus {
            name: iface.to_string(),
            attach: att.mode,
            qdisc: installed.map(|q| q.describe()),
        },
        att,
    ))
}

/// Detaches the classifier from `att`'s interface (its pinned tcx link removed, or its clsact
/// filter deleted) and removes what paceline installed there (its root qdisc, a clsact it
/// added), then forgets the interface in `st`. Returns what was done, one line each.
pub fn uninstall_iface(
    att: attach::TcAttachment,
    dir: &StateDir,
    st: &mut State,
    pins: &Pins,
) -> Vec<String> {
    let iface = att.iface.clone();
    let mut done = Vec::new();
    // The pin holds the tcx link: removing it detaches the program.
    let pin = pins.link(&attach::TcProgram::Egress.pin_name(&iface));
    match std::fs::remove_file(&pin) {
        Ok(()) => done.push(format!("{iface}: classifier detached (link unpinned)")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => done.push(format!("{iface}: unpinning {}: {e}", pin.display())),
    }
    if let Some(pos) = st.interfaces.iter().position(|i| i.name == iface) {
        let mut rec = st.interfaces.remove(pos);
        // A clsact filter is deleted by clean_up; a tcx link went with its pin.
        rec.clsact_filter = att.mode == attach::AttachMode::Clsact;
        done.extend(state::clean_up(&State {
            pid: st.pid,
            interfaces: vec![rec],
            pins: vec![],
        }));
    }
    if let Err(e) = dir.save(st) {
        done.push(format!("saving the state: {e:#}"));
    }
    done
}

/// Detaches the programs (the pins removed, dropping the datapath closes tcx/cgroup links and
/// deletes netlink filters), removes the qdiscs paceline installed, the maps' pins and the
/// state file.
pub fn uninstall(shared: &Shared, dir: &StateDir, pins: &Pins) {
    let st = dir.leftover().ok().flatten().unwrap_or_default();
    for line in pins.remove_all() {
        log::debug!("shutdown: {line}");
    }
    // Dropping the datapath detaches every program.
    {
        let mut g = shared.lock();
        g.router = None;
        g.attachments.clear();
        drop(g.dp.take());
    }
    // The filters are gone with the programs; clsact and root qdiscs are paceline's to remove.
    let mut st = st;
    for i in &mut st.interfaces {
        i.clsact_filter = false;
        i.router_filter = false;
        i.ingress_filter = false;
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
