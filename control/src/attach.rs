//! Attaching the programs: the tc classifier on each managed interface's egress (tcx on 6.6+,
//! clsact over netlink otherwise), and sock_ops on the cgroup v2 root.
//!
//! tcx and cgroup links belong to the agent's file descriptors: they go away with the process,
//! even after `kill -9`. A netlink (clsact) filter outlives the process, so it is recorded in the
//! state file and removed by the next start (see [`crate::state`]).

use std::path::Path;

use anyhow::{Context as _, Result};
use aya::programs::{
    CgroupAttachMode, LinkOrder,
    tc::{NlOptions, SchedClassifierLinkId, TcAttachOptions, TcAttachType},
};
use serde::{Deserialize, Serialize};

use crate::{datapath::Datapath, features::Features, qdisc};

/// The netlink filter priority paceline uses on clsact egress (so it can find its own filter).
pub const NL_PRIORITY: u16 = 0xc0de;
pub const NL_HANDLE: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttachMode {
    Tcx,
    Clsact,
}

impl AttachMode {
    /// As the status and the logs write it (`tcx`, `clsact`).
    pub fn as_str(self) -> &'static str {
        match self {
            AttachMode::Tcx => "tcx",
            AttachMode::Clsact => "clsact",
        }
    }
}

pub struct TcAttachment {
    pub iface: String,
    pub mode: AttachMode,
    pub link: SchedClassifierLinkId,
    /// The agent added the clsact qdisc (and removes it on exit).
    pub clsact_added: bool,
}

/// Which tc program to attach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcProgram {
    /// The classifier/pacer of a host's interfaces.
    Egress,
    /// The D3 router of a router link.
    D3Router,
}

impl TcProgram {
    fn prog(self, dp: &mut Datapath) -> Result<&mut aya::programs::SchedClassifier> {
        match self {
            TcProgram::Egress => dp.tc_program(),
            TcProgram::D3Router => dp.d3_router_program(),
        }
    }

    /// The clsact filter priority (distinct, so both can sit on one interface).
    pub fn nl_priority(self) -> u16 {
        match self {
            TcProgram::Egress => NL_PRIORITY,
            TcProgram::D3Router => NL_PRIORITY + 1,
        }
    }
}

/// Attaches the classifier to `iface` egress: tcx where the kernel has it, else clsact.
/// `on_clsact` runs just before a clsact filter is created, so the caller can record it.
pub fn attach_tc(
    dp: &mut Datapath,
    iface: &str,
    features: &Features,
    on_clsact: impl FnMut(bool) -> Result<()>,
) -> Result<TcAttachment> {
    attach_program(dp, TcProgram::Egress, iface, features, on_clsact)
}

/// Attaches `which` to `iface` egress (see [`attach_tc`]).
pub fn attach_program(
    dp: &mut Datapath,
    which: TcProgram,
    iface: &str,
    features: &Features,
    mut on_clsact: impl FnMut(bool) -> Result<()>,
) -> Result<TcAttachment> {
    let prog = which.prog(dp)?;
    if features.tcx {
        match prog.attach_with_options(
            iface,
            TcAttachType::Egress,
            TcAttachOptions::TcxOrder(LinkOrder::default()),
        ) {
            Ok(link) => {
                return Ok(TcAttachment {
                    iface: iface.into(),
                    mode: AttachMode::Tcx,
                    link,
                    clsact_added: false,
                });
            }
            Err(e) => log::warn!("{iface}: tcx attach failed ({e}); falling back to clsact"),
        }
    }
    let clsact_added = !qdisc::has_clsact(iface)?;
    on_clsact(clsact_added)?;
    if clsact_added {
        aya::programs::tc::qdisc_add_clsact(iface).with_context(|| format!("{iface}: adding clsact"))?;
    }
    let prog = which.prog(dp)?;
    let link = prog
        .attach_with_options(
            iface,
            TcAttachType::Egress,
            TcAttachOptions::Netlink(NlOptions {
                priority: which.nl_priority(),
                handle: NL_HANDLE.into(),
                classid: None,
            }),
        )
        .with_context(|| format!("{iface}: attaching the classifier to clsact egress"))?;
    Ok(TcAttachment {
        iface: iface.into(),
        mode: AttachMode::Clsact,
        link,
        clsact_added,
    })
}

/// Removes a clsact egress filter paceline left behind (after a crash).
pub fn remove_stale_filter(iface: &str, which: TcProgram) -> Result<()> {
    let pref = which.nl_priority().to_string();
    qdisc::tc(&["filter", "del", "dev", iface, "egress", "pref", &pref]).map(|_| ())
}

/// Attaches sock_ops to the cgroup v2 root. On 5.7+ this is a bpf link, which always coexists
/// with other programs on the cgroup (and takes no attach flags: `AllowMultiple` would be
/// refused with EINVAL); the link goes away with the agent's process.
pub fn attach_sock_ops(dp: &mut Datapath, cgroup_root: &Path) -> Result<()> {
    let cg = std::fs::File::open(cgroup_root)
        .with_context(|| format!("opening the cgroup v2 root {}", cgroup_root.display()))?;
    dp.sock_ops_program()?
        .attach(cg, CgroupAttachMode::Single)
        .with_context(|| format!("attaching sock_ops to {}", cgroup_root.display()))?;
    Ok(())
}
