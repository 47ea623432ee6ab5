//! `paceline agent`

use std::{net::SocketAddr, path::PathBuf};

use anyhow::Result;

use crate::{agent, runtime::state};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The policy file (YAML). Reloaded when it changes and on SIGHUP.
    #[arg(long, short)]
    pub policy: PathBuf,
    /// Where /metrics, /healthz and /readyz are served (what Prometheus scrapes).
    #[arg(long, default_value = super::DEFAULT_METRICS_ADDR)]
    pub metrics_addr: SocketAddr,
    /// Where the API is served: /status, /policy, /events, /flows, /classify, the policy
    /// history, reload and rollback requests (and /healthz, /readyz). It reveals the policy and
    /// the flows and changes state: keep it on loopback or a management address. May equal
    /// --metrics-addr (one listener then serves both).
    #[arg(long, default_value = super::DEFAULT_API_ADDR)]
    pub api_addr: SocketAddr,
    /// A file holding the API's bearer token (at least 16 visible ASCII characters, mode 0600,
    /// root's): every API request but /healthz and /readyz must then carry `Authorization:
    /// Bearer <token>` (the commands send it from PACELINE_API_TOKEN_FILE). Read for each
    /// request: replace the file to rotate the token. Without it the API listens on loopback
    /// only. /metrics is never guarded.
    #[arg(long, value_name = "FILE", env = "PACELINE_API_TOKEN_FILE")]
    pub api_token_file: Option<PathBuf>,
    /// Lock, state (for cleanup after a crash), status, event log and policy history. Where no
    /// cgroup2 hierarchy is mounted (e.g. under `ip netns exec`), the agent mounts one at
    /// `<dir>/cgroup2` for sock_ops and unmounts it at a clean stop.
    #[arg(long, default_value = state::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Directory in a BPF filesystem where paceline pins its maps and links (so the datapath
    /// outlives the agent; the D3 application map is `<dir>/d3_app`). When it is in none (e.g.
    /// under `ip netns exec`, which mounts its own /sys), the agent mounts a BPF filesystem at
    /// it, or at /sys/fs/bpf for a directory below that, and unmounts it at a clean stop.
    #[arg(long, default_value = crate::kernel::persist::DEFAULT_BPFFS_DIR)]
    pub bpffs_dir: PathBuf,
    /// A group (name or number) whose members may open the D3 application map
    /// (`<bpffs-dir>/d3_app`, mode 0660) and so set deadlines for their sockets. Without it the
    /// pin is root's alone (mode 0600). A deadline claims a share of every D3 link: grant it
    /// to the services whose deadlines the policy's D3 classes are for, not to every user.
    #[arg(long, value_name = "GROUP", value_parser = parse_group)]
    pub d3_app_group: Option<u32>,
}

/// A group name from the group database, or a numeric gid.
fn parse_group(s: &str) -> Result<u32, String> {
    if let Ok(gid) = s.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(s) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        Ok(None) => Err(format!(
            "no group named {s:?} (give a name from /etc/group or a number)"
        )),
        Err(e) => Err(format!("looking up group {s:?}: {e}")),
    }
}

pub fn run(a: Args) -> Result<i32> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(agent::run(agent::Options {
        policy: a.policy,
        metrics_addr: a.metrics_addr,
        api_addr: a.api_addr,
        state_dir: a.state_dir,
        bpffs_dir: a.bpffs_dir,
        d3_app_group: a.d3_app_group,
        api_token_file: a.api_token_file,
    }))?;
    Ok(0)
}
