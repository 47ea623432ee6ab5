//! The agent's status: what `/status` serves, what `paceline status` prints, and what the
//! metrics' labels come from. Built by the agent, never by the datapath.

use serde::{Deserialize, Serialize};

use crate::{attach::AttachMode, features::Features};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    pub pid: u32,
    /// Unix seconds.
    pub started_at: u64,
    pub kernel: Features,
    /// What the kernel lacks and what that costs (empty when nothing is degraded).
    pub degraded: Vec<String>,
    pub enforcement: Enforcement,
    pub interfaces: Vec<IfaceStatus>,
    pub policy: PolicyStatus,
    /// D3 on this host (`spec.d3`), if on.
    pub d3: Option<D3Status>,
    pub reloads: Reloads,
    pub flow_table: FlowTable,
    pub metrics_addr: String,
}

/// How rates are enforced, by kind of traffic.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Enforcement {
    /// `fq` (EDT enforced by fq), `htb` (aggregates by HTB, TCP flows by TCP pacing),
    /// `sockops` (TCP flows by TCP pacing only) or `none` (classify, tag and count only).
    pub mode: String,
    pub tcp_flows: String,
    pub udp_flows: String,
    pub aggregates: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct IfaceStatus {
    pub name: String,
    pub attach: AttachMode,
    /// The root qdisc paceline installed, if any.
    pub qdisc: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PolicyStatus {
    pub file: String,
    pub name: Option<String>,
    pub hash: String,
    pub generation: u64,
    /// Unix seconds.
    pub loaded_at: u64,
    pub levels: Vec<LevelStatus>,
    pub classes: Vec<ClassStatus>,
    pub default_class: String,
    /// sock_ops sets TCP sockets' TOS to their level's DSCP (every route leaves through a
    /// managed interface and no rule matches on DSCP); otherwise the classifier rewrites it.
    #[serde(default)]
    pub tcp_dscp_by_socket: bool,
    pub warnings: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LevelStatus {
    pub index: u32,
    pub name: String,
    pub priority: u8,
    pub factor: Option<f64>,
    pub epoch_seconds: Option<f64>,
    /// The level's rate limit on this host; `None` = not rate-limited.
    pub rate_bytes_per_second: Option<u64>,
    pub dscp: Option<u8>,
    pub pcp: Option<u8>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClassStatus {
    pub index: u32,
    pub name: String,
    pub level: String,
    pub flow_rate_bytes_per_second: Option<u64>,
    pub class_rate_bytes_per_second: Option<u64>,
    pub tcp_rto_min_us: Option<u32>,
    pub tcp_delack_max_us: Option<u32>,
    /// The class's TCP flows speak D3.
    #[serde(default)]
    pub d3: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct D3Status {
    pub receiver: bool,
    /// The pinned map applications write sizes and deadlines into.
    pub app_map: String,
    pub router_links: Vec<String>,
    pub interval_us: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Reloads {
    pub applied: u64,
    pub rejected: u64,
    pub last: Option<ReloadEvent>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReloadEvent {
    /// Unix seconds.
    pub at: u64,
    pub applied: bool,
    pub errors: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FlowTable {
    pub capacity: u32,
    pub memlock_bytes: Option<u64>,
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
