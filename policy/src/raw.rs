//! Stage 1: serde types that mirror a policy file exactly (ripgrep's `LowArgs`).
//!
//! Nothing here is interpreted: quantities stay text ([`Scalar`]) so that validation can say
//! precisely what is wrong with each of them and report all problems at once. Unknown fields are
//! refused everywhere (`deny_unknown_fields`): a misspelt key must not silently fall back to a
//! default. The JSON schema (`policies/schema.json`) is generated from these types.

use std::{borrow::Cow, fmt};

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

use super::{protocols, units};

/// The `apiVersion` this agent reads.
pub const API_VERSION: &str = "paceline/v1";
/// The `kind` this agent reads.
pub const KIND: &str = "Policy";

/// A paceline policy file.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(
    title = "paceline policy",
    description = "A paceline policy: QJump levels, traffic classes, classification rules. See policy/src/lib.rs."
)]
pub struct PolicyFile {
    /// Always `paceline/v1`.
    #[serde(rename = "apiVersion")]
    #[schemars(extend("const" = "paceline/v1"))]
    pub api_version: String,
    /// Always `Policy`.
    #[schemars(extend("const" = "Policy"))]
    pub kind: String,
    /// Default: no name and no description; status then shows the file name.
    #[serde(default)]
    pub metadata: Metadata,
    pub spec: Spec,
}

#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// Shown in `paceline status` and in metrics labels. Default: none.
    #[serde(default)]
    pub name: Option<String>,
    /// Free text for humans. Default: none.
    #[serde(default)]
    pub description: Option<String>,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// Interfaces to attach to, by name; the single entry `auto` means the interfaces that carry
    /// the default routes (IPv4 and IPv6). Required: an agent must never guess where to attach.
    #[schemars(length(min = 1))]
    pub interfaces: Vec<String>,
    /// What the agent should use for aggregate and per-flow enforcement.
    /// Default `auto`: the best the kernel offers.
    #[serde(default)]
    pub enforcement: Enforcement,
    /// Packets whose departure lies further out than this are dropped. Default `100ms`: long
    /// enough for a 64 KiB TSO burst at 10 Mbit/s, short enough to bound queueing.
    #[serde(default = "default_horizon")]
    pub horizon: DurationText,
    /// Entries of the per-flow LRU table (a flow with no local TCP or connected UDP socket). Default 65536.
    #[serde(default = "default_flow_table_size")]
    #[schemars(range(min = 1024, max = 16777216))]
    pub flow_table_size: i64,
    /// Which flows without a local TCP or connected UDP socket (UDP sent with `sendto`,
    /// forwarded traffic, containers' packets at the host's device) enter the flow table, which
    /// `paceline flows` lists. Default `auto`: only under a policy where some class keeps
    /// something per flow (a `flow_rate` under fq enforcement, or a DASR sender); under any
    /// other, such a flow's class is cached on each CPU alone, and a new flow costs no table
    /// lookup and no insert. `all`: every such flow, listed by `paceline flows`.
    #[serde(default)]
    pub track_flows: TrackFlows,
    /// This host's uplink rate when the kernel does not report one (veth). Default: none (use
    /// the interface speed the kernel reports, else `qjump.link_rate`).
    #[serde(default)]
    pub link_rate: Option<RateText>,
    /// QJump network parameters. Default: none; required when a level has a `factor`.
    #[serde(default)]
    pub qjump: Option<QJump>,
    /// QJump levels from the highest (lowest latency, smallest factor) to the lowest.
    #[schemars(length(min = 1, max = paceline_common::maps::MAX_LEVELS))]
    pub levels: Vec<Level>,
    /// Traffic classes.
    #[schemars(length(min = 1, max = paceline_common::maps::MAX_CLASSES))]
    pub classes: Vec<Class>,
    /// Classification rules, first match wins. Default: none (all traffic in `default_class`).
    #[serde(default)]
    // The validator's limit is on the rules after expanding address lists: no file with more
    // entries than that can be valid.
    #[schemars(length(max = paceline_common::maps::MAX_RULES))]
    pub rules: Vec<Rule>,
    /// The class of traffic that no rule matches.
    pub default_class: String,
    /// D3 deadline-driven delivery on this host: receiving, sending (classes with `d3`) and
    /// routing. Default: none (D3 off; classes with `d3` need it).
    #[serde(default)]
    pub d3: Option<D3>,
    /// DASR, Dart's direct apportioning of sending rates (docs/dasr.md): as a receiver, count the
    /// senders currently sending to this host's addresses and tell each of them N and the
    /// line rate in its ACKs; as a sender, pace each flow at the line rate / N its receiver
    /// advertises. Default: none (DASR off).
    #[serde(default)]
    pub dasr: Option<Dasr>,
}

/// `spec.dasr`.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Dasr {
    /// Count the senders of data arriving on the managed interfaces and advertise N and the
    /// line rate in ACKs (be a DASR receiver). Default true.
    #[serde(default = "default_true")]
    pub receiver: bool,
    /// Cap each TCP flow at the share its receiver advertises (be a DASR sender). Default true.
    #[serde(default = "default_true")]
    pub sender: bool,
    /// The line rate advertised for this host's addresses: `auto` (each interface's speed as
    /// the kernel reports it, else `spec.link_rate`) or a rate. Default `auto`.
    #[serde(default)]
    pub line_rate: Option<LineRateText>,
    /// The network's round-trip time without queueing, 1us..=100ms. Default `100us`.
    #[serde(default)]
    pub rtt: Option<DurationText>,
    /// A flow counts as sending while one of its data segments arrived within the last
    /// `active_rtts` to 2 x `active_rtts` RTTs (never under 2 to 4 ms: a paced flow arrives in
    /// bursts about 1 ms apart; longer for many senders: at least 4 frame times per sender),
    /// 1..=64. Default 2.
    #[serde(default = "default_active_rtts")]
    #[schemars(range(min = 1, max = 64))]
    pub active_rtts: i64,
}

fn default_active_rtts() -> i64 {
    2
}

/// `spec.d3`.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct D3 {
    /// Echo the allocations of rate requests this host receives in its ACKs (be a D3
    /// receiver). Default true.
    #[serde(default = "default_true")]
    pub receiver: bool,
    /// Pacing rate of a new D3 flow until its first grant, and the most a paused flow
    /// (granted 0) sends. Default: none, one segment per RTT: the request goes out and the
    /// rest of the transfer waits about one RTT for its grant.
    #[serde(default)]
    pub first_rtt_rate: Option<RateText>,
    /// Congestion window, in segments, that a D3 sender's connection starts with (TCP's
    /// initial window, which TCP sends unpaced): the first RTT of a fresh connection, before
    /// any grant. 1..=64. Default 2.
    #[serde(default)]
    #[schemars(range(min = 1, max = 64))]
    pub initial_window: Option<u32>,
    /// Links whose egress this host serves as a D3 router. Default: none.
    #[serde(default)]
    pub router: Vec<D3RouterLink>,
    /// The router's capacity-controller interval T (paper: 800us; longer than an RTT),
    /// 100us..=1s. Default `1ms`.
    #[serde(default)]
    pub interval: Option<DurationText>,
}

fn default_true() -> bool {
    true
}

/// `spec.d3.router[]`.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct D3RouterLink {
    /// The interface whose egress this router serves.
    pub interface: String,
    /// The link's rate (C starts here; the controller moves it within [C/10, 2C]).
    pub capacity: RateText,
    /// Smallest grant and a new flow's fair share. Default: capacity / 1000.
    #[serde(default)]
    pub base_rate: Option<RateText>,
    /// Requests above this rate are clamped and counted as absurd. Default: the capacity.
    #[serde(default)]
    pub flow_cap: Option<RateText>,
    /// The capacity controller's utilisation term: `line` (the default) or `paper`.
    #[serde(default)]
    pub controller: D3Controller,
}

/// `spec.d3.router[].controller` (docs/d3.md, "Capacity controller" and deviation 4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum D3Controller {
    /// `alpha * (line_rate - u/T)`: RCP's form, which recovers from a queue spike.
    #[default]
    Line,
    /// `alpha * (C - u/T)`: the paper's formula as printed, for comparisons (C can stay at
    /// its floor once a queue spike has cut it).
    Paper,
}

impl D3Controller {
    /// The datapath's `D3LinkConfig::capacity_mode`.
    pub fn capacity_mode(self) -> u32 {
        match self {
            D3Controller::Line => paceline_common::d3::CAP_MODE_LINE,
            D3Controller::Paper => paceline_common::d3::CAP_MODE_PAPER,
        }
    }
}

/// `spec.classes[].d3`.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClassD3 {
    /// Deadline of a transfer when the application sets none (from the connection's start).
    /// Default: none (only deadlines set by applications; flows without one ask for a fair
    /// share).
    #[serde(default)]
    pub deadline: Option<DurationText>,
    /// Size of a transfer for the default deadline; required with `deadline`.
    #[serde(default)]
    pub size: Option<SizeText>,
}

fn default_horizon() -> DurationText {
    DurationText(Scalar::Str("100ms".into()))
}
fn default_flow_table_size() -> i64 {
    paceline_common::maps::DEFAULT_FLOW_TABLE_SIZE as i64
}

/// `spec.track_flows`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TrackFlows {
    /// Where a class keeps something per flow (a flow clock, a DASR share).
    #[default]
    Auto,
    /// Every flow without a local socket, listed by `paceline flows`.
    All,
}

impl TrackFlows {
    pub fn as_str(self) -> &'static str {
        match self {
            TrackFlows::Auto => "auto",
            TrackFlows::All => "all",
        }
    }
}

/// `spec.enforcement`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Enforcement {
    /// The best the kernel offers.
    #[default]
    Auto,
    /// EDT timestamps held by the `fq` qdisc.
    Fq,
    /// Aggregates in an HTB hierarchy (per-flow pacing in fq leaves).
    Htb,
    /// Only the per-socket settings of sock_ops (pacing rate, TCP options).
    Sockops,
    /// Classify, count and tag only.
    None,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QJump {
    /// `n`: hosts that can send into the network, 1..=1000000.
    #[schemars(range(min = 1, max = 1000000))]
    pub hosts: i64,
    /// `P`: the largest packet a host sends per epoch, 64B..=64KiB.
    pub max_packet: SizeText,
    /// `R`: the rate of the slowest link.
    pub link_rate: RateText,
    /// `eps`: cumulative switch processing delay along the longest path, 0s..=1s.
    pub switch_delay: DurationText,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Level {
    pub name: String,
    /// `skb->priority` / hardware priority, 0..=7 (7 = highest); unique per level.
    #[schemars(range(min = 0, max = 7))]
    pub priority: i64,
    /// QJump throughput factor (a number > 0) or `unlimited`. Default: none; with neither
    /// `factor` nor `rate` the level is unlimited.
    #[serde(default)]
    pub factor: Option<FactorText>,
    /// An explicit rate limit instead of a factor. Default: none.
    #[serde(default)]
    pub rate: Option<RateText>,
    /// DSCP written into the level's packets, 0..=63 (ECN kept). Default: none (left alone).
    #[serde(default)]
    #[schemars(range(min = 0, max = 63))]
    pub dscp: Option<i64>,
    /// 802.1p PCP written into VLAN-tagged packets, 0..=7. Default: none (left alone).
    #[serde(default)]
    #[schemars(range(min = 0, max = 7))]
    pub pcp: Option<i64>,
    /// CoDel on the level's departure queue (a rate-limited level, `fq` enforcement).
    /// Default: none (only the horizon bounds the queue).
    #[serde(default)]
    pub codel: Option<Codel>,
}

/// `codel` of a class or a level: CoDel (RFC 8289) over the aggregate's EDT departure queue,
/// whose delay is how far its clock runs ahead of now. With `ecn`, ECN-capable packets are
/// marked CE instead of dropped; the others are dropped.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Codel {
    /// The queue delay CoDel lets stand, 1us..=1s. Default `5ms` (RFC 8289; a datacenter
    /// class wants far less, e.g. `500us` with an `interval` of `10ms`).
    #[serde(default)]
    pub target: Option<DurationText>,
    /// How long the delay may stay above target before the first signal, and the spacing of
    /// the signals after it (interval / sqrt(count)), 100us..=4s: about the flows' worst RTT.
    /// Default `100ms`.
    #[serde(default)]
    pub interval: Option<DurationText>,
    /// Mark CE on ECN-capable packets (ECT(0), ECT(1)) instead of dropping them. Default true.
    #[serde(default = "default_true")]
    pub ecn: bool,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Class {
    pub name: String,
    /// The name of a level.
    pub level: String,
    /// Per-flow pacing rate. Default: none (flows are not paced individually).
    #[serde(default)]
    pub flow_rate: Option<RateText>,
    /// Aggregate pacing rate of the whole class on this host. Default: none.
    #[serde(default)]
    pub class_rate: Option<RateText>,
    /// TCP settings applied by sock_ops when a connection starts. Default: none.
    #[serde(default)]
    pub tcp: Option<Tcp>,
    /// The class's TCP flows speak D3 (rate requests, paced at the grants). Needs `spec.d3`.
    /// Default: none.
    #[serde(default)]
    pub d3: Option<ClassD3>,
    /// CoDel on the class's departure queue (needs `class_rate` and `fq` enforcement).
    /// Default: none (only the horizon bounds the queue).
    #[serde(default)]
    pub codel: Option<Codel>,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Tcp {
    /// Minimum retransmission timeout (TCP_BPF_RTO_MIN), 1us..=200ms. Default: the kernel's.
    #[serde(default)]
    pub rto_min: Option<DurationText>,
    /// Delayed-ACK ceiling (TCP_BPF_DELACK_MAX), 1us..=200ms. Default: the kernel's.
    #[serde(default)]
    pub delack_max: Option<DurationText>,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// The name of the class matching traffic goes to.
    pub class: String,
    /// Default: any protocol.
    #[serde(default)]
    pub protocol: Option<ProtocolText>,
    /// Default: both families (or the family of `src`/`dst`).
    #[serde(default)]
    pub family: Option<Family>,
    /// Source CIDR or address, or a list of them (one rule per entry). Default: any.
    #[serde(default)]
    pub src: Option<Addresses>,
    /// Destination CIDR or address, or a list of them. Default: any.
    #[serde(default)]
    pub dst: Option<Addresses>,
    /// Source port or range `"8000-8100"`. Default: any.
    #[serde(default)]
    pub src_port: Option<PortText>,
    /// Destination port or range. Default: any.
    #[serde(default)]
    pub dst_port: Option<PortText>,
    /// DSCP of the packet as sent by the application, 0..=63. Default: any.
    #[serde(default)]
    #[schemars(range(min = 0, max = 63))]
    pub dscp: Option<i64>,
    /// cgroup v2 path relative to the cgroup2 mount. Default: any.
    #[serde(default)]
    pub cgroup: Option<String>,
    /// Socket mark, `value` or `value/mask`, hex or decimal. Default: any.
    #[serde(default)]
    pub mark: Option<MarkText>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Ipv4,
    Ipv6,
}

/// A scalar exactly as written, so validation can quote it back. Integers outside i64 are
/// kept as text.
#[derive(Clone, Debug, PartialEq)]
pub enum Scalar {
    Str(String),
    Int(i128),
    Float(f64),
    Bool(bool),
}

impl fmt::Display for Scalar {
    /// Strings quoted, numbers bare: `"10 Gbits"`, `9000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Str(s) => write!(f, "{s:?}"),
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::Float(x) => write!(f, "{x}"),
            Scalar::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// Serialized as written (used for the defaults shown in the schema).
impl Serialize for Scalar {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Scalar::Str(v) => s.serialize_str(v),
            Scalar::Int(v) => match i64::try_from(*v) {
                Ok(i) => s.serialize_i64(i),
                Err(_) => s.serialize_str(&v.to_string()),
            },
            Scalar::Float(v) => s.serialize_f64(*v),
            Scalar::Bool(v) => s.serialize_bool(*v),
        }
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a single value (a string or a number)")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar::Str(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar::Int(v.into()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar::Int(v.into()))
            }
            fn visit_i128<E: de::Error>(self, v: i128) -> Result<Scalar, E> {
                Ok(Scalar::Int(v))
            }
            fn visit_u128<E: de::Error>(self, v: u128) -> Result<Scalar, E> {
                Ok(i128::try_from(v)
                    .map(Scalar::Int)
                    .unwrap_or(Scalar::Str(v.to_string())))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar::Float(v))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar::Bool(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// Declares a newtype over [`Scalar`] with its own JSON schema.
macro_rules! scalar_newtype {
    ($(#[$doc:meta])* $name:ident, $schema_name:literal, $schema:expr) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
        #[serde(transparent)]
        pub struct $name(pub Scalar);

        impl JsonSchema for $name {
            fn schema_name() -> Cow<'static, str> {
                $schema_name.into()
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                $schema
            }
        }
    };
}

scalar_newtype!(
    /// A rate with its unit: `"10Gbit"`, `"250Mbit"`, `"125MB/s"` (see `units`).
    RateText,
    "Rate",
    json_schema!({
        "type": "string",
        "pattern": units::rate_pattern(),
        "description": "A rate with its unit. Bits/s: bit, kbit, Mbit, Gbit, Tbit (prefix case-insensitive), bps, Kbps, Mbps, Gbps, Tbps. Bytes/s: B/s, KB/s, MB/s, GB/s, TB/s, KiB/s, MiB/s, GiB/s, TiB/s. Decimals allowed.",
        "examples": ["10Gbit", "250Mbit", "1.5Gbit", "125MB/s"]
    })
);

scalar_newtype!(
    /// A rate with its unit, or `"auto"`.
    LineRateText,
    "LineRate",
    json_schema!({
        "description": "A rate with its unit (see Rate), or \"auto\": the interface's speed as the kernel reports it.",
        "anyOf": [
            { "type": "string", "pattern": units::rate_pattern() },
            { "const": "auto" }
        ],
        "examples": ["auto", "10Gbit", "25Gbit"]
    })
);

scalar_newtype!(
    /// A size with its unit: `"9KB"`, `"1500B"`, `"64KiB"`.
    SizeText,
    "Size",
    json_schema!({
        "type": "string",
        "pattern": units::size_pattern(),
        "description": "A size with its unit: B, KB (1000), KiB (1024), MB, MiB, GB, GiB.",
        "examples": ["9KB", "1500B", "64KiB"]
    })
);

scalar_newtype!(
    /// A duration with its unit: `"100ms"`, `"4us"`.
    DurationText,
    "Duration",
    json_schema!({
        "type": "string",
        "pattern": units::duration_pattern(),
        "description": "A duration with its unit: ns, us (or µs), ms, s; decimals allowed. Zero is written 0s.",
        "examples": ["100ms", "4us", "1.5ms"]
    })
);

scalar_newtype!(
    /// A QJump throughput factor (number > 0) or `"unlimited"`.
    FactorText,
    "Factor",
    json_schema!({
        "description": "QJump throughput factor: a number > 0 (1 = the top level), or \"unlimited\" (line rate, no guarantee).",
        "anyOf": [
            { "type": "number", "exclusiveMinimum": 0 },
            { "const": "unlimited" }
        ]
    })
);

scalar_newtype!(
    /// An IP protocol: a name or a number 0..=255.
    ProtocolText,
    "Protocol",
    json_schema!({
        "description": format!("IP protocol: {}, or a number 0..=255.", protocols::names()),
        "anyOf": [
            { "enum": protocols::NAMES },
            { "type": "integer", "minimum": 0, "maximum": 255 }
        ]
    })
);

scalar_newtype!(
    /// A port (`443`, `"443"`) or an inclusive range (`"8000-8100"`).
    PortText,
    "Port",
    json_schema!({
        "description": "A port 0..=65535 or an inclusive range \"8000-8100\".",
        "anyOf": [
            { "type": "integer", "minimum": 0, "maximum": 65535 },
            { "type": "string", "pattern": "^\\s*[0-9]{1,5}\\s*(-\\s*[0-9]{1,5}\\s*)?$" }
        ]
    })
);

scalar_newtype!(
    /// A socket mark: `16`, `"0x10"`, `"0x10/0xff"`.
    MarkText,
    "Mark",
    json_schema!({
        "description": "Socket mark: value or value/mask, each decimal or 0x-hex.",
        "anyOf": [
            { "type": "integer", "minimum": 0, "maximum": 4294967295u64 },
            { "type": "string", "pattern": "^\\s*(0[xX][0-9a-fA-F]+|[0-9]+)\\s*(/\\s*(0[xX][0-9a-fA-F]+|[0-9]+)\\s*)?$" }
        ]
    })
);

/// One address/CIDR or a list of them (the rule is expanded once per entry).
#[derive(Clone, Debug, PartialEq)]
pub enum Addresses {
    One(Scalar),
    Many(Vec<Scalar>),
}

impl<'de> Deserialize<'de> for Addresses {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = Addresses;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a CIDR (\"10.0.0.0/8\"), an address, or a list of them")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Addresses, E> {
                Ok(Addresses::One(Scalar::Str(v.to_string())))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Addresses, E> {
                Ok(Addresses::One(Scalar::Int(v.into())))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Addresses, E> {
                Ok(Addresses::One(Scalar::Int(v.into())))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Addresses, E> {
                Ok(Addresses::One(Scalar::Float(v)))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Addresses, A::Error> {
                let mut v = Vec::new();
                while let Some(s) = seq.next_element::<Scalar>()? {
                    v.push(s);
                }
                Ok(Addresses::Many(v))
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for Addresses {
    fn schema_name() -> Cow<'static, str> {
        "Addresses".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "An IPv4/IPv6 CIDR or address, or a list of them (one rule per entry; with lists on both src and dst, one rule per same-family pair).",
            "anyOf": [
                { "type": "string" },
                { "type": "array", "items": { "type": "string" }, "minItems": 1 }
            ]
        })
    }
}

/// The JSON schema of a policy file, pretty-printed with a trailing newline.
pub fn schema_json() -> String {
    let schema = schemars::schema_for!(PolicyFile);
    let mut s = serde_json::to_string_pretty(&schema).expect("a schema serializes");
    s.push('\n');
    s
}
