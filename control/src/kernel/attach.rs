//! Attaching the programs: the tc classifier on each managed interface's egress (tcx on 6.6+,
//! clsact over netlink otherwise), DASR's program on their ingress, and sock_ops on the cgroup
//! v2 root.
//!
//! tcx and cgroup links are pinned ([`crate::kernel::persist`]), so they outlive the agent's
//! process (`kill -9`, a crash, an upgrade); a netlink (clsact) filter outlives it anyway. An agent
//! that finds its predecessor's link or filter replaces the program in it atomically, so packets
//! are never left unclassified. Both are recorded in the state file (see
//! [`crate::runtime::state`]).

use std::os::fd::AsFd as _;
use std::path::Path;

use anyhow::{Context as _, Result, anyhow};
use aya::programs::{
    CgroupAttachMode, LinkOrder,
    links::{FdLink, PinnedLink},
    tc::{NlOptions, SchedClassifierLink, SchedClassifierLinkId, TcAttachOptions, TcAttachType},
};
use serde::{Deserialize, Serialize};

use crate::{
    kernel::bpfsys, kernel::datapath::Datapath, kernel::features::Features, kernel::persist::Pins,
    kernel::qdisc,
};

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
    /// The agent added the clsact qdisc (and removes it on exit).
    pub clsact_added: bool,
    /// A previous agent's link or filter was there: its program was replaced in place.
    pub adopted: bool,
}

/// Which tc program to attach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcProgram {
    /// The classifier/pacer of a host's interfaces.
    Egress,
    /// The D3 router of a router link.
    D3Router,
    /// DASR's ingress program (tc ingress of the managed interfaces).
    DasrIngress,
}

impl TcProgram {
    fn prog(self, dp: &mut Datapath) -> Result<&mut aya::programs::SchedClassifier> {
        match self {
            TcProgram::Egress => dp.tc_program(),
            TcProgram::D3Router => dp.d3_router_program(),
            TcProgram::DasrIngress => dp.ingress_program(),
        }
    }

    /// The name of its link pins (`<name>-<interface>`).
    pub fn pin_name(self, iface: &str) -> String {
        match self {
            TcProgram::Egress => format!("egress-{iface}"),
            TcProgram::D3Router => format!("router-{iface}"),
            TcProgram::DasrIngress => format!("ingress-{iface}"),
        }
    }

    /// The clsact filter priority (distinct, so both can sit on one interface).
    pub fn nl_priority(self) -> u16 {
        match self {
            TcProgram::Egress => NL_PRIORITY,
            TcProgram::D3Router => NL_PRIORITY + 1,
            TcProgram::DasrIngress => NL_PRIORITY + 2,
        }
    }

    /// Where it attaches.
    pub fn attach_type(self) -> TcAttachType {
        match self {
            TcProgram::Egress | TcProgram::D3Router => TcAttachType::Egress,
            TcProgram::DasrIngress => TcAttachType::Ingress,
        }
    }

    /// `egress` or `ingress`, as `tc filter` names the hook.
    pub fn direction(self) -> &'static str {
        match self.attach_type() {
            TcAttachType::Ingress => "ingress",
            _ => "egress",
        }
    }
}

/// Attaches the classifier to `iface` egress: tcx where the kernel has it, else clsact.
/// `on_clsact` runs just before a clsact filter is created, so the caller can record it;
/// `had_filter`: a previous agent's clsact filter is there to be replaced.
pub fn attach_tc(
    dp: &mut Datapath,
    iface: &str,
    features: &Features,
    pins: &Pins,
    had_filter: bool,
    on_clsact: impl FnMut(bool) -> Result<()>,
) -> Result<TcAttachment> {
    attach_program(
        dp,
        TcProgram::Egress,
        iface,
        features,
        pins,
        had_filter,
        on_clsact,
    )
}

/// Attaches `which` to `iface` (egress, or ingress for DASR; see [`attach_tc`]). With
/// tcx the link is pinned at `pins.link(which.pin_name(iface))`; a link already pinned there (a
/// previous agent's) gets this program atomically instead.
pub fn attach_program(
    dp: &mut Datapath,
    which: TcProgram,
    iface: &str,
    features: &Features,
    pins: &Pins,
    had_filter: bool,
    mut on_clsact: impl FnMut(bool) -> Result<()>,
) -> Result<TcAttachment> {
    let pin = pins.link(&which.pin_name(iface));
    if pin.exists() {
        match adopt_tcx(dp, which, &pin) {
            Ok(()) => {
                return Ok(TcAttachment {
                    iface: iface.into(),
                    mode: AttachMode::Tcx,
                    clsact_added: false,
                    adopted: true,
                });
            }
            Err(e) => {
                log::warn!(
                    "{iface}: the pinned link {} cannot be reused ({e:#}); attaching anew",
                    pin.display()
                );
                let _ = std::fs::remove_file(&pin);
            }
        }
    }
    if features.tcx {
        let prog = which.prog(dp)?;
        match prog.attach_with_options(
            iface,
            which.attach_type(),
            TcAttachOptions::TcxOrder(LinkOrder::default()),
        ) {
            Ok(id) => {
                pin_tc_link(dp, which, id, &pin)?;
                return Ok(TcAttachment {
                    iface: iface.into(),
                    mode: AttachMode::Tcx,
                    clsact_added: false,
                    adopted: false,
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
    // A previous agent's filter is replaced in place (netlink without NLM_F_EXCL).
    if had_filter && !clsact_added {
        let old = SchedClassifierLink::attached(
            iface,
            which.attach_type(),
            which.nl_priority(),
            NL_HANDLE.into(),
            None,
        )?;
        if prog.attach_to_link(old).is_ok() {
            return Ok(TcAttachment {
                iface: iface.into(),
                mode: AttachMode::Clsact,
                clsact_added,
                adopted: true,
            });
        }
    }
    prog.attach_with_options(
        iface,
        which.attach_type(),
        TcAttachOptions::Netlink(NlOptions {
            priority: which.nl_priority(),
            handle: NL_HANDLE.into(),
            classid: None,
        }),
    )
    .with_context(|| format!("{iface}: attaching {which:?} to clsact {}", which.direction()))?;
    Ok(TcAttachment {
        iface: iface.into(),
        mode: AttachMode::Clsact,
        clsact_added,
        adopted: false,
    })
}

/// Gives the tcx link pinned at `pin` this agent's program (BPF_LINK_UPDATE: no gap).
fn adopt_tcx(dp: &mut Datapath, which: TcProgram, pin: &Path) -> Result<()> {
    let fd: FdLink = PinnedLink::from_pin(pin)?.into();
    let link = SchedClassifierLink::try_from(fd)?;
    which.prog(dp)?.attach_to_link(link)?;
    Ok(())
}

/// Pins the tcx link `id` of `which` at `pin` (the pin keeps it attached past the process).
fn pin_tc_link(dp: &mut Datapath, which: TcProgram, id: SchedClassifierLinkId, pin: &Path) -> Result<()> {
    let link = which.prog(dp)?.take_link(id)?;
    let fd: FdLink = link
        .try_into()
        .map_err(|e| anyhow!("a tcx link that is not an fd link ({e})"))?;
    fd.pin(pin)
        .with_context(|| format!("pinning {}", pin.display()))?;
    Ok(())
}

/// Removes a clsact filter paceline left behind (after a crash).
pub fn remove_stale_filter(iface: &str, which: TcProgram) -> Result<()> {
    let pref = which.nl_priority().to_string();
    qdisc::tc(&["filter", "del", "dev", iface, which.direction(), "pref", &pref]).map(|_| ())
}

/// Attaches sock_ops to the cgroup v2 root through a pinned link (5.7+: a bpf link, which
/// always coexists with other programs on the cgroup and takes no attach flags); a link a
/// previous agent pinned gets this program atomically instead. Returns whether it adopted one.
pub fn attach_sock_ops(dp: &mut Datapath, cgroup_root: &Path, pins: &Pins) -> Result<bool> {
    let pin = pins.link("sock_ops");
    if pin.exists() {
        let adopted = (|| -> Result<()> {
            let link = bpfsys::obj_get(&pin)?;
            let prog = dp.sock_ops_program()?;
            let prog_fd = prog.fd()?;
            bpfsys::link_update(link.as_fd(), prog_fd.as_fd())?;
            Ok(())
        })();
        match adopted {
            Ok(()) => return Ok(true),
            Err(e) => {
                log::warn!("the pinned sock_ops link cannot be reused ({e:#}); attaching anew");
                let _ = std::fs::remove_file(&pin);
            }
        }
    }
    let cg = std::fs::File::open(cgroup_root)
        .with_context(|| format!("opening the cgroup v2 root {}", cgroup_root.display()))?;
    let prog = dp.sock_ops_program()?;
    let id = prog
        .attach(cg, CgroupAttachMode::Single)
        .with_context(|| format!("attaching sock_ops to {}", cgroup_root.display()))?;
    let link: FdLink = prog
        .take_link(id)?
        .try_into()
        .map_err(|e| anyhow!("a sock_ops link that is not an fd link ({e})"))?;
    link.pin(&pin)
        .with_context(|| format!("pinning {}", pin.display()))?;
    Ok(false)
}
