//! `interfaces: [auto]` follows the host: the agent listens to rtnetlink's route and link
//! notifications (RTNLGRP_IPV4_ROUTE, RTNLGRP_IPV6_ROUTE, RTNLGRP_LINK) and, when the
//! interfaces of the default routes change, applies the policy again for the new set: the
//! classifier is attached (and the mode's root qdisc installed) on the new interfaces and
//! detached (qdisc removed) from the old ones, each step logged, counted
//! (`paceline_interface_changes_total`), recorded in the state file and in the event log.
//! Without any default route the agent keeps the interfaces it has (and says so).

use std::time::Duration;

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use serde_json::json;

use super::install;
use crate::runtime::shared::{Inner, Shared};
use paceline_policy::Compiled;

const RTNLGRP_LINK: u32 = 1;
const RTNLGRP_IPV4_ROUTE: u32 = 7;
const RTNLGRP_IPV6_ROUTE: u32 = 11;

/// Brings the attachments in line with `compiled.interfaces`: attaches to new interfaces,
/// detaches from gone ones. On an error what was done stays recorded (status, state file) and
/// the error is returned.
pub fn sync(g: &mut Inner, shared: &Shared, compiled: &Compiled, why: &str) -> Result<(), Vec<String>> {
    let wanted = &compiled.interfaces;
    let dir = shared.ctl.dir.clone();
    // Detach first: an interface that went away must not keep its state entry.
    let gone: Vec<String> = g
        .attachments
        .iter()
        .map(|a| a.iface.clone())
        .filter(|i| !wanted.contains(i))
        .collect();
    for iface in &gone {
        let pos = g
            .attachments
            .iter()
            .position(|a| &a.iface == iface)
            .expect("listed above");
        let att = g.attachments.remove(pos);
        let done = install::uninstall_iface(att, &dir, &mut g.state, &shared.ctl.pins);
        g.status.interfaces.retain(|i| &i.name != iface);
        g.iface_changes.detached += 1;
        shared.events.info(
            "interface_detached",
            format!("{why}: {iface} is no longer managed: {}", done.join("; ")),
            json!({"interface": iface, "trigger": why, "done": done}),
        );
    }
    let features = g.status.kernel.clone();
    for iface in wanted {
        if g.attachments.iter().any(|a| &a.iface == iface) {
            continue;
        }
        let Inner { dp, state, .. } = &mut *g;
        let Some(dp) = dp.as_mut() else {
            return Err(vec!["the agent is shutting down".into()]);
        };
        let before = crate::runtime::state::IfaceState::default();
        match install::install_iface(
            dp,
            iface,
            compiled,
            &features,
            &dir,
            state,
            &shared.ctl.pins,
            &before,
        ) {
            Ok((st, att)) => {
                let msg = format!(
                    "{why}: {iface} is managed: classifier attached ({}), root qdisc {}",
                    st.attach.as_str(),
                    st.qdisc.as_deref().unwrap_or("unchanged")
                );
                g.status.interfaces.push(st);
                g.attachments.push(att);
                g.iface_changes.attached += 1;
                shared.events.info(
                    "interface_attached",
                    msg,
                    json!({"interface": iface, "trigger": why}),
                );
            }
            Err(e) => {
                let m = format!("{iface}: attaching: {e:#}");
                shared.events.warn(
                    "interface_attached",
                    format!("{why}: {m}"),
                    json!({"interface": iface, "error": m}),
                );
                return Err(vec![m]);
            }
        }
    }
    Ok(())
}

/// A thread that blocks on rtnetlink route and link notifications and wakes `tx` for each
/// batch. Ends when the receiver is gone.
pub fn watch_routes(tx: tokio::sync::mpsc::UnboundedSender<()>) -> std::io::Result<()> {
    let mut sock = Socket::new(NETLINK_ROUTE)?;
    let groups = [RTNLGRP_LINK, RTNLGRP_IPV4_ROUTE, RTNLGRP_IPV6_ROUTE]
        .iter()
        .fold(0u32, |m, g| m | (1 << (g - 1)));
    sock.bind(&SocketAddr::new(0, groups))?;
    std::thread::Builder::new()
        .name("paceline-routes".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match sock.recv(&mut &mut buf[..], 0) {
                    Ok(_) => {
                        if tx.send(()).is_err() {
                            return;
                        }
                    }
                    // ENOBUFS: notifications were lost; re-resolve anyway.
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                        if tx.send(()).is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        log::warn!("route notifications stopped: {e}");
                        return;
                    }
                }
            }
        })?;
    Ok(())
}

/// How long route notifications must be quiet before the agent re-resolves (a route change is
/// often several messages: link up, address, routes).
pub const SETTLE: Duration = Duration::from_millis(500);
