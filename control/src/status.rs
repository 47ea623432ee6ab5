//! The agent's status, one typed model: what `/status` serves ([`LiveStatus`]: [`Status`]
//! plus live counters), what the agent writes to `status.json`, what `paceline status` and the
//! tests read back, and what the metrics' labels come from. Built by the agent from the
//! compiled policy and the datapath's counters, never by the datapath itself.
//!
//! Every type is `Serialize + Deserialize`: the document the agent writes is the document a
//! reader parses (a test round-trips a real one, `tests/fixtures/status/live.json`).

use std::path::Path;

use paceline_common::maps::{self, CLASS_D3, D3ClassStats, TABLE_SOCK_TOS};
use serde::{Deserialize, Serialize};

use crate::{
    d3router::LinkReport, kernel::attach::AttachMode, kernel::datapath::Snapshot, kernel::features::Features,
};
use paceline_policy::{Compiled, EnforcementMode};

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
    /// DASR on this host (`spec.dasr`), if on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dasr: Option<DasrStatus>,
    pub reloads: Reloads,
    pub flow_table: FlowTable,
    pub metrics_addr: String,
    /// Where `/status`, `/policy`, `/events`, `/flows`, `/classify` and the policy history are
    /// served (`--api-addr`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_addr: String,
    /// The filesystems the agent mounted itself because this mount namespace had none
    /// (`ip netns exec`, a container; see [`crate::kernel::mounts`]): unmounted at a clean stop. Absent
    /// when it mounted nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounted: Vec<crate::kernel::mounts::MountedFs>,
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

impl Enforcement {
    /// How `mode` enforces each kind of traffic.
    pub fn of(mode: EnforcementMode) -> Enforcement {
        let (m, tcp, udp, agg) = match mode {
            EnforcementMode::Fq => (
                "fq",
                "EDT timestamps held by fq; TCP also paces itself",
                "EDT timestamps held by fq",
                "EDT timestamps held by fq",
            ),
            EnforcementMode::Htb => (
                "htb",
                "TCP's own pacing at the class's flow rate (sock_ops SO_MAX_PACING_RATE)",
                "not enforced (needs sch_fq)",
                "HTB classes (skb->priority = HTB class id)",
            ),
            EnforcementMode::SockopsOnly => (
                "sockops",
                "TCP's own pacing (sock_ops SO_MAX_PACING_RATE)",
                "not enforced (needs sch_fq)",
                "not enforced",
            ),
            EnforcementMode::None => (
                "none",
                "not enforced (enforcement: none)",
                "not enforced (enforcement: none)",
                "not enforced (enforcement: none)",
            ),
        };
        Enforcement {
            mode: m.into(),
            tcp_flows: tcp.into(),
            udp_flows: udp.into(),
            aggregates: agg.into(),
        }
    }
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
    /// Rules after expansion, and what their compiled classifier takes.
    #[serde(default)]
    pub classifier: ClassifierStatus,
    /// Seconds the last apply took: compiling the policy and writing it into the datapath.
    #[serde(default)]
    pub apply_seconds: f64,
    /// What applied it: `start`, `file change`, `SIGHUP`, `reload request`, `route change`,
    /// `rollback to generation N` (the file on disk differs until it changes again).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// Its generation in the policy history (`paceline policy history`; counts across restarts).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub history_generation: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}

/// The compiled classifier of the policy in force (see `paceline policy check`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ClassifierStatus {
    pub rules: u64,
    pub words: u64,
    pub selector_entries: u64,
    pub rule_entries: u64,
    /// Estimated kernel memory of its maps.
    pub kernel_bytes: u64,
}

impl PolicyStatus {
    /// The policy `c`, loaded from `file`, written as generation `generation`.
    pub fn of(file: &Path, c: &Compiled, generation: u64) -> PolicyStatus {
        let level_name = |i: u32| {
            c.levels
                .get(i as usize)
                .map(|l| l.name.clone())
                .unwrap_or_default()
        };
        PolicyStatus {
            file: file.display().to_string(),
            name: c.name.clone(),
            hash: c.hash.clone(),
            generation,
            loaded_at: unix_now(),
            levels: c
                .levels
                .iter()
                .enumerate()
                .map(|(i, l)| LevelStatus {
                    index: i as u32,
                    name: l.name.clone(),
                    priority: l.priority,
                    factor: l.factor,
                    epoch_seconds: l.epoch_secs,
                    rate_bytes_per_second: l.rate,
                    dscp: l.dscp,
                    pcp: l.pcp,
                    codel: codel_status(l.codel, c.mode),
                })
                .collect(),
            classes: c
                .classes
                .iter()
                .map(|k| ClassStatus {
                    index: k.index as u32,
                    name: k.name.clone(),
                    level: level_name(k.level as u32),
                    flow_rate_bytes_per_second: k.flow_rate,
                    class_rate_bytes_per_second: k.class_rate,
                    tcp_rto_min_us: k.tcp.as_ref().and_then(|t| t.rto_min_us),
                    tcp_delack_max_us: k.tcp.as_ref().and_then(|t| t.delack_max_us),
                    d3: c.table.classes[k.index as usize].flags & CLASS_D3 != 0,
                    codel: codel_status(k.codel, c.mode),
                })
                .collect(),
            tcp_dscp_by_socket: c.table.flags & TABLE_SOCK_TOS != 0,
            default_class: c
                .class_names
                .get(c.table.default_class as usize)
                .cloned()
                .flatten()
                .unwrap_or_default(),
            warnings: c.warnings.clone(),
            classifier: ClassifierStatus {
                rules: c.ctab.stats.rules as u64,
                words: c.ctab.stats.words as u64,
                selector_entries: c.ctab.stats.sel_entries as u64,
                rule_entries: c.ctab.stats.rule_entries as u64,
                kernel_bytes: c.ctab.stats.kernel_bytes(),
            },
            apply_seconds: 0.0,
            source: String::new(),
            history_generation: 0,
        }
    }
}

/// A class's or level's CoDel, when in force (the policy asks for it and the mode is `fq`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CodelStatus {
    pub target_seconds: f64,
    pub interval_seconds: f64,
    /// Marks CE on ECN-capable packets instead of dropping them.
    pub ecn: bool,
}

fn codel_status(c: Option<paceline_policy::validate::Codel>, mode: EnforcementMode) -> Option<CodelStatus> {
    c.filter(|_| mode == EnforcementMode::Fq).map(|c| CodelStatus {
        target_seconds: f64::from(c.target_ns) * 1e-9,
        interval_seconds: f64::from(c.interval_ns) * 1e-9,
        ecn: c.ecn,
    })
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
    /// CoDel on the level's departure queue, when in force.
    #[serde(default)]
    pub codel: Option<CodelStatus>,
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
    /// CoDel on the class's departure queue, when in force.
    #[serde(default)]
    pub codel: Option<CodelStatus>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct D3Status {
    pub receiver: bool,
    /// The pinned map applications write sizes and deadlines into.
    pub app_map: String,
    pub router_links: Vec<String>,
    pub interval_us: u64,
}

/// DASR on this host: its roles, what "currently sending" means, the line rates advertised.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DasrStatus {
    pub receiver: bool,
    pub sender: bool,
    pub rtt_ns: u64,
    pub active_rtts: u32,
    pub interfaces: Vec<DasrLineStatus>,
}

/// The line rate an interface advertises.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DasrLineStatus {
    pub interface: String,
    pub line_rate_bytes_per_second: u64,
}

impl DasrStatus {
    pub fn of(d: &paceline_policy::validate::DasrSpec) -> DasrStatus {
        DasrStatus {
            receiver: d.receiver,
            sender: d.sender,
            rtt_ns: d.rtt_ns,
            active_rtts: d.active_rtts,
            interfaces: d
                .interfaces
                .iter()
                .map(|l| DasrLineStatus {
                    interface: l.interface.clone(),
                    line_rate_bytes_per_second: l.line_rate,
                })
                .collect(),
        }
    }
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
    /// The file held the policy already in force (e.g. a bad edit reverted): nothing to
    /// apply, but the last reload is no longer a rejection.
    #[serde(default, skip_serializing_if = "is_false")]
    pub unchanged: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FlowTable {
    pub capacity: u32,
    pub memlock_bytes: Option<u64>,
}

pub use crate::kernel::memory::{KernelMemory, MapMemory};

/// `/status`: the status document with live counters per class and level.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LiveStatus {
    #[serde(flatten)]
    pub status: Status,
    pub counters: LiveCounters,
    /// Absent from an agent that does not report it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_memory: Option<KernelMemory>,
}

impl LiveStatus {
    /// `status` with the counters of `snap`, the D3 counters `d3` (when D3 is on) and the
    /// router links `links`, named after the status's classes and levels.
    pub fn new(
        status: Status,
        snap: &Snapshot,
        d3: Option<&[D3ClassStats]>,
        links: &[LinkReport],
    ) -> LiveStatus {
        let policy = &status.policy;
        let named = |name: &str, c: &maps::Counters| NamedCounters {
            name: name.to_string(),
            counters: c.into(),
        };
        let counters = LiveCounters {
            classes: policy
                .classes
                .iter()
                .map(|c| named(&c.name, &snap.classes[c.index as usize]))
                .collect(),
            levels: policy
                .levels
                .iter()
                .map(|l| named(&l.name, &snap.levels[l.index as usize]))
                .collect(),
            unparsed: Unparsed {
                non_ip: snap.global.non_ip,
                truncated: snap.global.truncated,
                ipv6_extension_limit: snap.global.ipv6_ext_limit,
                malformed: snap.global.malformed,
            },
            flow_table: snap.flow_entries.map(|entries| FlowTableCounters {
                entries,
                inserts: snap.global.flow_inserts,
                first_packets: snap.global.flow_first_packets,
                evictions: snap.flow_evictions().unwrap_or(0),
            }),
            d3_classes: d3
                .map(|d| {
                    policy
                        .classes
                        .iter()
                        .filter(|c| c.d3)
                        .map(|c| NamedD3Counters {
                            name: c.name.clone(),
                            counters: d[c.index as usize],
                        })
                        .collect()
                })
                .unwrap_or_default(),
            d3_router_links: links.to_vec(),
            dasr: None,
        };
        LiveStatus {
            status,
            counters,
            kernel_memory: None,
        }
    }

    /// With the maps' kernel memory.
    pub fn with_kernel_memory(mut self, m: Option<KernelMemory>) -> LiveStatus {
        self.kernel_memory = m;
        self
    }

    /// With DASR's figures (when DASR is on).
    pub fn with_dasr(mut self, r: Option<&crate::dasr::DasrReport>) -> LiveStatus {
        self.counters.dasr = r.cloned();
        self
    }
}

/// The live counters of `/status`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LiveCounters {
    pub classes: Vec<NamedCounters>,
    pub levels: Vec<NamedCounters>,
    pub unparsed: Unparsed,
    /// D3 counters of the classes that speak D3.
    pub d3_classes: Vec<NamedD3Counters>,
    /// C, N, D, A and counters of the D3 router links.
    pub d3_router_links: Vec<LinkReport>,
    /// The flow table's fill and churn (absent from older agents' status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_table: Option<FlowTableCounters>,
    /// DASR: senders per local address and the option counters, when DASR is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dasr: Option<crate::dasr::DasrReport>,
}

/// The per-flow table as the datapath fills it (see [`maps::GlobalCounters::flow_inserts`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowTableCounters {
    /// Entries present (counted at most every few seconds).
    pub entries: u64,
    /// Flows the datapath entered in the table (on their second packet) since it was created.
    pub inserts: u64,
    /// First packets of flows without a local TCP or connected UDP socket, which left their
    /// clock in an admission slot instead of entering the table (absent from agents before admission).
    #[serde(default)]
    pub first_packets: u64,
    /// Flows evicted by newer ones because the table was full.
    pub evictions: u64,
}

/// A class's or level's counters, under its name.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NamedCounters {
    pub name: String,
    #[serde(flatten)]
    pub counters: TrafficCounters,
}

/// A class's or level's traffic counters (the datapath's [`maps::Counters`], summed over CPUs).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrafficCounters {
    pub packets: u64,
    pub bytes: u64,
    pub delayed_packets: u64,
    pub added_delay_seconds: f64,
    pub dropped_horizon: u64,
    pub tagged_packets: u64,
    pub tcp_sockets_configured: u64,
    pub tcp_sockopt_errors: u64,
    /// Dropped by CoDel (the class's or its level's).
    #[serde(default)]
    pub dropped_codel: u64,
    /// Marked CE by CoDel instead of dropped.
    #[serde(default)]
    pub ecn_marked_codel: u64,
    /// Delayed packets by the clock that set their departure: flow, class, level.
    #[serde(default)]
    pub held_by: HeldBy,
}

/// Delayed packets by the clock that held them (the binding limit).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct HeldBy {
    pub flow: u64,
    pub class: u64,
    pub level: u64,
}

impl From<&maps::Counters> for TrafficCounters {
    fn from(c: &maps::Counters) -> Self {
        TrafficCounters {
            packets: c.packets,
            bytes: c.bytes,
            delayed_packets: c.delayed_packets,
            added_delay_seconds: c.delay_ns as f64 * 1e-9,
            dropped_horizon: c.drops_horizon,
            tagged_packets: c.tagged_packets,
            tcp_sockets_configured: c.tcp_sockets,
            tcp_sockopt_errors: c.sockopt_errors,
            dropped_codel: c.drops_codel,
            ecn_marked_codel: c.marks_codel,
            held_by: HeldBy {
                flow: c.held_by[0],
                class: c.held_by[1],
                level: c.held_by[2],
            },
        }
    }
}

/// A D3 class's counters, under its name (the datapath's [`D3ClassStats`], summed over CPUs,
/// without the histograms).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NamedD3Counters {
    pub name: String,
    #[serde(flatten)]
    pub counters: D3ClassStats,
}

/// Packets the classifier passed untouched, by reason.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Unparsed {
    pub non_ip: u64,
    pub truncated: u64,
    pub ipv6_extension_limit: u64,
    /// Absent from the status of agents older than this counter.
    #[serde(default)]
    pub malformed: u64,
}

/// Unix seconds now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `/status` byte for byte as an agent served it before the model was typed (htb mode on
    /// tcx, D3 with a router link, a class with every rate and TCP setting, one applied and
    /// one rejected reload, traffic in both classes).
    pub(crate) const LIVE: &str = include_str!("../tests/fixtures/status/live.json");

    #[test]
    fn a_real_status_document_round_trips() {
        let typed: LiveStatus = serde_json::from_str(LIVE).expect("the document fits the model");
        assert_eq!(
            serde_json::to_string(&typed).expect("serializes"),
            LIVE,
            "the model writes the same bytes, fields in the same order"
        );
        let value: serde_json::Value = serde_json::from_str(LIVE).expect("JSON");
        assert_eq!(serde_json::to_value(&typed).expect("value"), value);
        // Every optional part is exercised.
        let s = &typed.status;
        assert!(s.d3.is_some() && s.reloads.last.as_ref().is_some_and(|l| !l.applied));
        assert_eq!(typed.counters.d3_router_links.len(), 1);
        assert_eq!(typed.counters.d3_classes.len(), 1);
    }

    #[test]
    fn live_counters_are_named_after_the_status() {
        let typed: LiveStatus = serde_json::from_str(LIVE).expect("status");
        let mut snap = Snapshot {
            classes: vec![maps::Counters::default(); maps::MAX_CLASSES],
            levels: vec![maps::Counters::default(); maps::MAX_LEVELS],
            global: Default::default(),
            trace: Default::default(),
            tracing: false,
            flow_entries: Some(3),
        };
        snap.classes[1].packets = 5;
        snap.classes[1].delay_ns = 1_500_000_000;
        snap.levels[1].bytes = 426;
        snap.global.non_ip = 1;
        let mut d3 = vec![D3ClassStats::default(); maps::MAX_CLASSES];
        d3[0].met = 2;
        let live = LiveStatus::new(typed.status.clone(), &snap, Some(&d3), &[]);
        let c = &live.counters;
        assert_eq!(c.classes[1].name, "other");
        assert_eq!(c.classes[1].counters.packets, 5);
        assert_eq!(c.classes[1].counters.added_delay_seconds, 1.5);
        assert_eq!(
            (c.levels[1].name.as_str(), c.levels[1].counters.bytes),
            ("bulk", 426)
        );
        assert_eq!(c.unparsed.non_ip, 1);
        assert_eq!(c.d3_classes.len(), 1, "only the classes that speak D3");
        let ft = c.flow_table.as_ref().expect("flow table counted");
        assert_eq!((ft.entries, ft.inserts, ft.evictions), (3, 0, 0));
        snap.global.flow_inserts = 10;
        let live = LiveStatus::new(typed.status.clone(), &snap, Some(&d3), &[]);
        let ft = live.counters.flow_table.expect("flow table counted");
        assert_eq!((ft.entries, ft.inserts, ft.evictions), (3, 10, 7));
        assert_eq!(
            (c.d3_classes[0].name.as_str(), c.d3_classes[0].counters.met),
            ("rpc", 2)
        );
        assert!(c.d3_router_links.is_empty());
        let without_d3 = LiveStatus::new(typed.status, &snap, None, &[]);
        assert!(without_d3.counters.d3_classes.is_empty());
    }
}
