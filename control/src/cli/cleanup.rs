//! `paceline cleanup [--check]`: removes what an agent that did not exit cleanly left: its
//! pinned datapath (links and maps, so its programs detach), its clsact filters, the qdiscs it
//! installed, its state; or, with `--check`, reports what is left without changing anything.

use std::path::PathBuf;

use anyhow::Result;
use aya::programs::tc::TcAttachType;

use crate::{
    kernel::attach::TcProgram,
    runtime::state::{self, StateDir},
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The state directory of the agent that was killed.
    #[arg(long, default_value = state::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Change nothing: report what of paceline's is still on this host (a running agent, a
    /// crashed agent's state, the classifier on an interface's tcx or clsact egress, pins), and
    /// note paceline's BPF links held by running agents elsewhere. Exit 0 clean, 1 something
    /// found. tcx attachments are invisible to `tc filter show` and to Debian 12's bpftool; this
    /// sees them.
    #[arg(long)]
    pub check: bool,
    /// Where that agent pinned its maps and links.
    #[arg(long, default_value = crate::kernel::persist::DEFAULT_BPFFS_DIR)]
    pub bpffs_dir: PathBuf,
}

pub fn run(a: Args) -> Result<i32> {
    if a.check {
        let (found, notes) = check(&a);
        for f in &found {
            println!("{f}");
        }
        if found.is_empty() {
            println!("clean: nothing of paceline's on this host's interfaces or in its state");
        }
        for n in &notes {
            println!("note: {n}");
        }
        return Ok(if found.is_empty() { 0 } else { 1 });
    }
    let dir = StateDir::lock(&a.state_dir)?;
    // The pins first: removing the links detaches the programs.
    for line in crate::kernel::persist::Pins::new(&a.bpffs_dir).remove_all() {
        println!("{line}");
    }
    match dir.leftover()? {
        None => println!("no state left in {}", a.state_dir.display()),
        Some(st) => {
            for line in state::clean_up(&st) {
                println!("{line}");
            }
            dir.clear()?;
            let _ = std::fs::remove_file(a.state_dir.join("status.json"));
        }
    }
    Ok(0)
}

/// paceline's program names in the kernel (truncated to 15 bytes there).
const PROGRAMS: [&str; 3] = ["pl_tc_egress", "pl_sock_ops", "pl_d3_router"];

/// What is left (counts against a clean node) and notes (paceline's links held by live
/// processes elsewhere: another agent, in another network namespace or state directory).
fn check(a: &Args) -> (Vec<String>, Vec<String>) {
    let mut found = Vec::new();
    let mut notes = Vec::new();
    match StateDir::lock(&a.state_dir) {
        Err(_) => found.push(format!(
            "an agent is running: it holds {}/lock (stop it first: systemctl stop paceline)",
            a.state_dir.display()
        )),
        Ok(dir) => {
            if let Ok(Some(st)) = dir.leftover() {
                found.push(format!(
                    "{}/state.json: agent pid {} did not exit cleanly; `paceline cleanup` undoes what it lists: {}",
                    a.state_dir.display(),
                    st.pid,
                    st.interfaces
                        .iter()
                        .map(|i| i.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
    }
    // paceline's programs by id.
    let ours: Vec<(u32, String)> = aya::programs::loaded_programs()
        .flatten()
        .filter_map(|p| {
            let name = p.name_as_str()?.to_string();
            PROGRAMS.contains(&name.as_str()).then(|| (p.id(), name))
        })
        .collect();
    let name_of = |id: u32| ours.iter().find(|(i, _)| *i == id).map(|(_, n)| n.clone());
    // Interfaces of this network namespace: tcx egress and clsact filters.
    let mut nl = crate::kernel::qstats::QdiscStats::new().ok();
    for (idx, name) in nix::net::if_::if_nameindex()
        .map(|l| {
            l.iter()
                .map(|i| (i.index(), i.name().to_string_lossy().into_owned()))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
    {
        if let Ok((_, progs)) = aya::programs::SchedClassifier::query_tcx(&name, TcAttachType::Egress) {
            for p in progs {
                if let Some(n) = name_of(p.id()) {
                    found.push(format!("{name}: tcx egress runs {n} (program id {})", p.id()));
                }
            }
        }
        if let Some(nl) = nl.as_mut() {
            for which in [TcProgram::Egress, TcProgram::D3Router] {
                if nl
                    .has_egress_bpf_filter(idx, which.nl_priority())
                    .unwrap_or(false)
                {
                    found.push(format!(
                        "{name}: clsact egress filter at pref {} (paceline's)",
                        which.nl_priority()
                    ));
                }
            }
        }
    }
    let links = aya::programs::loaded_links()
        .flatten()
        .filter_map(|l| name_of(l.program_id()).map(|n| (l.id(), n)))
        .collect::<Vec<_>>();
    // A link lives as long as a process holds it or a pin keeps it: these belong to running
    // agents (this host's, or others in other network namespaces or state directories) or to
    // pins, which are reported below when they are under --bpffs-dir.
    if !links.is_empty() {
        notes.push(format!(
            "BPF links of paceline's programs held by running agents or pins (this host's cgroup or any network namespace): {}",
            links
                .iter()
                .map(|(id, n)| format!("{n} (link {id})"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    // Pins: the maps and links a running or crashed agent keeps (a crashed agent's datapath
    // goes on through them until the next start adopts it or `paceline cleanup` removes it).
    let mut pinned = Vec::new();
    let mut dirs = vec![a.bpffs_dir.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                pinned.push(p.display().to_string());
            }
        }
    }
    if !pinned.is_empty() {
        pinned.sort();
        found.push(format!(
            "pinned under {}: {}",
            a.bpffs_dir.display(),
            pinned.join(", ")
        ));
    }
    (found, notes)
}
