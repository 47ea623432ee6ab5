//! The validated policy (ripgrep's `HiArgs`): what validation hands to compilation. Units
//! are parsed (bytes/s, ns, bytes), names resolved to indices, address lists expanded into
//! one [`RuleSpec`] per same-family pair, host facts looked up.

use ipnet::IpNet;
use paceline_common::qjump::Network;

use crate::enforcement::EnforcementRequest;
use crate::error::PolicyError;
use crate::lines::LineIndex;

/// Where the host's link rate came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkRateSource {
    /// `spec.link_rate`.
    Spec,
    /// The slowest of the policy's interfaces, as the kernel reports it.
    Interface(String),
    /// `spec.qjump.link_rate` (the network's slowest link).
    QJump,
}

impl std::fmt::Display for LinkRateSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkRateSource::Spec => f.write_str("spec.link_rate"),
            LinkRateSource::Interface(i) => write!(f, "speed of {i}"),
            LinkRateSource::QJump => f.write_str("spec.qjump.link_rate"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkRate {
    /// Bytes/s.
    pub rate: u64,
    pub source: LinkRateSource,
}

/// How a level is limited.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    /// A QJump throughput factor; the rate follows from `spec.qjump`.
    Factor(f64),
    /// An explicit rate (bytes/s).
    Rate(u64),
    /// Not rate-limited: line rate, no guarantee.
    Unlimited,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Level {
    pub name: String,
    pub priority: u8,
    pub limit: Limit,
    /// The rate limit on this host in bytes/s; `None` = unlimited.
    pub rate: Option<u64>,
    /// The level's QJump epoch in seconds (factor levels only).
    pub epoch_secs: Option<f64>,
    pub dscp: Option<u8>,
    pub pcp: Option<u8>,
    pub codel: Option<Codel>,
}

/// CoDel on an aggregate's departure queue (`codel` of a class or a level).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Codel {
    pub target_ns: u32,
    pub interval_ns: u32,
    /// Mark CE on ECN-capable packets instead of dropping them.
    pub ecn: bool,
}

/// TCP settings applied by sock_ops, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpSettings {
    pub rto_min_us: Option<u32>,
    pub delack_max_us: Option<u32>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Class {
    pub name: String,
    /// Index into [`Validated::levels`].
    pub level: usize,
    /// Bytes/s.
    pub flow_rate: Option<u64>,
    /// Bytes/s.
    pub class_rate: Option<u64>,
    pub tcp: Option<TcpSettings>,
    pub d3: Option<ClassD3>,
    pub codel: Option<Codel>,
}

/// A class's D3 defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassD3 {
    /// (deadline ns, size bytes) for transfers without an application deadline.
    pub default: Option<(u64, u64)>,
}

/// `spec.d3`, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct D3Spec {
    pub receiver: bool,
    /// Bytes/s; `None`: one segment per RTT until the first grant.
    pub first_rtt_rate: Option<u64>,
    /// Segments a D3 sender's connection starts with (TCP's initial window).
    pub initial_window: u32,
    pub interval_ns: u64,
    pub router: Vec<D3Link>,
}

/// A router link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct D3Link {
    pub interface: String,
    /// Bytes/s.
    pub capacity: u64,
    pub base_rate: u64,
    pub flow_cap: u64,
    /// `CAP_MODE_LINE` or `CAP_MODE_PAPER` (`paceline_common::d3`).
    pub capacity_mode: u32,
}

/// `spec.dasr`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DasrSpec {
    pub receiver: bool,
    pub sender: bool,
    /// Bytes/s as written; `None`: `auto`.
    pub line_rate: Option<u64>,
    pub rtt_ns: u64,
    pub active_rtts: u32,
    /// What each managed interface advertises (empty for `auto` offline).
    pub interfaces: Vec<DasrLine>,
}

impl DasrSpec {
    /// The shortest epoch: `active_rtts * rtt`, and at least two of a paced flow's burst gaps
    /// (see `paceline_common::dasr::count` and [`paceline_common::dasr::min_window_ns`]).
    pub fn min_window_ns(&self) -> u64 {
        paceline_common::dasr::min_window_ns(self.rtt_ns, self.active_rtts)
    }
}

/// The line rate one interface advertises.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DasrLine {
    pub interface: String,
    /// Wire bytes/s, rounded down to what the option holds (whole Mbit/s, 12 significant bits).
    pub line_rate: u64,
    /// Where it came from (`spec.dasr.line_rate`, `speed of eth0`, `spec.link_rate`).
    pub source: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub(super) fn of(n: &IpNet) -> Family {
        match n {
            IpNet::V4(_) => Family::V4,
            IpNet::V6(_) => Family::V6,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

/// A cgroup condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cgroup {
    pub path: String,
    /// The cgroup id; 0 when not resolved (offline check).
    pub id: u64,
}

/// One rule after expansion of address lists. Conditions that are `None` match anything.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleSpec {
    /// Index of the rule in `spec.rules`.
    pub origin: usize,
    /// Which list entries this expansion took (`None` = the field is absent or a single value).
    pub src_entry: Option<usize>,
    pub dst_entry: Option<usize>,
    /// Index into [`Validated::classes`].
    pub class: usize,
    pub protocol: Option<u8>,
    pub family: Option<Family>,
    pub src: Option<IpNet>,
    pub dst: Option<IpNet>,
    /// Inclusive ranges.
    pub src_port: Option<(u16, u16)>,
    pub dst_port: Option<(u16, u16)>,
    pub dscp: Option<u8>,
    pub cgroup: Option<Cgroup>,
    /// (value, mask).
    pub mark: Option<(u32, u32)>,
}

impl RuleSpec {
    /// The path of the rule in the file, with the list entries it came from.
    pub fn path(&self) -> String {
        format!("spec.rules[{}]", self.origin)
    }

    /// Matches on something sock_ops cannot see (DSCP, cgroup, mark).
    pub fn invisible_to_sockops(&self) -> bool {
        self.dscp.is_some() || self.cgroup.is_some() || self.mark.is_some()
    }

    /// Has no condition at all.
    pub fn matches_everything(&self) -> bool {
        self.protocol.is_none()
            && self.family.is_none()
            && self.src.is_none()
            && self.dst.is_none()
            && self.src_port.is_none()
            && self.dst_port.is_none()
            && !self.invisible_to_sockops()
    }
}

/// A policy that passed validation.
#[derive(Clone, Debug)]
pub struct Validated {
    pub file: String,
    /// sha256 of the file's bytes, hex.
    pub hash: String,
    pub name: Option<String>,
    pub description: Option<String>,
    /// Resolved interface names (`auto` already replaced).
    pub interfaces: Vec<String>,
    /// The file said `auto`.
    pub interfaces_auto: bool,
    pub enforcement: EnforcementRequest,
    pub horizon_ns: u64,
    pub flow_table_size: u32,
    pub track_flows: crate::raw::TrackFlows,
    pub link_rate: Option<LinkRate>,
    pub qjump: Option<Network>,
    pub levels: Vec<Level>,
    pub classes: Vec<Class>,
    /// Shared: a compiled policy keeps them (to reuse the reports of unchanged rules on a
    /// reload) without a copy.
    pub rules: std::sync::Arc<[RuleSpec]>,
    /// Index into [`Validated::classes`].
    pub default_class: usize,
    pub d3: Option<D3Spec>,
    pub dasr: Option<DasrSpec>,
    pub warnings: Vec<PolicyError>,
    /// Where each field is in the file, so that what compilation warns about names its line.
    pub lines: std::sync::Arc<LineIndex>,
}

impl Validated {
    /// What the policy asks for (`spec.enforcement`).
    pub fn enforcement(&self) -> EnforcementRequest {
        self.enforcement
    }
}
