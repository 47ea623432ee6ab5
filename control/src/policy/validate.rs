//! Stage 2: the validated policy (ripgrep's `HiArgs`): units parsed, ranges checked, names
//! resolved to indices, address lists expanded, host facts resolved through [`HostFacts`].
//!
//! Validation never stops at the first problem: every error is collected with the path of the
//! field and, through the [`LineIndex`], its line. Problems that do not make the policy wrong
//! but probably not what the operator meant are warnings.

use std::collections::HashMap;
use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Net};
use paceline_common::maps::{MAX_CLASSES, MAX_LEVELS, MAX_RULES};
use paceline_common::qjump::Network;

use super::PolicyError;
use super::enforcement::EnforcementRequest;
use super::host::HostFacts;
use super::lines::LineIndex;
use super::protocols;
use super::raw::{self, Scalar};
use super::units::{self, UnitError};

/// Inclusive bounds of a quantity and how they are written in messages.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub min: u64,
    pub max: u64,
    pub text: &'static str,
}

/// Every rate (levels, classes, link rates): 1 kbit/s ..= 10 Tbit/s, in bytes/s.
pub const RATE: Bounds = Bounds {
    min: 125,
    max: 1_250_000_000_000,
    text: "1kbit..=10Tbit",
};
pub const HORIZON: Bounds = Bounds {
    min: 1_000_000,
    max: 10_000_000_000,
    text: "1ms..=10s",
};
pub const MAX_PACKET: Bounds = Bounds {
    min: 64,
    max: 65_536,
    text: "64B..=64KiB",
};
pub const SWITCH_DELAY: Bounds = Bounds {
    min: 0,
    max: 1_000_000_000,
    text: "0s..=1s",
};
/// TCP_BPF_RTO_MIN and TCP_BPF_DELACK_MAX: the kernel refuses more than 200 ms (TCP_RTO_MIN,
/// TCP_DELACK_MAX) and, after rounding up to jiffies, less than 2 jiffies (TCP_TIMEOUT_MIN).
pub const TCP_TIMER: Bounds = Bounds {
    min: 1_000,
    max: 200_000_000,
    text: "1us..=200ms",
};
pub const HOSTS: (i64, i64) = (1, 1_000_000);
pub const FLOW_TABLE: (i64, i64) = (1024, 16_777_216);

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
    /// Bytes/s; `None`: link rate / 1000.
    pub first_rtt_rate: Option<u64>,
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
}

pub const D3_INTERVAL: Bounds = Bounds {
    min: 100_000,
    max: 1_000_000_000,
    text: "100us..=1s",
};
pub const D3_DEADLINE: Bounds = Bounds {
    min: 100_000,
    max: 3_600_000_000_000,
    text: "100us..=1h",
};
pub const D3_SIZE: Bounds = Bounds {
    min: 1,
    max: 1 << 40,
    text: "1B..=1TiB",
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    fn of(n: &IpNet) -> Family {
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
    pub link_rate: Option<LinkRate>,
    pub qjump: Option<Network>,
    pub levels: Vec<Level>,
    pub classes: Vec<Class>,
    pub rules: Vec<RuleSpec>,
    /// Index into [`Validated::classes`].
    pub default_class: usize,
    pub d3: Option<D3Spec>,
    pub warnings: Vec<PolicyError>,
}

impl Validated {
    /// What the policy asks for (`spec.enforcement`).
    pub fn enforcement(&self) -> EnforcementRequest {
        self.enforcement
    }
}

/// Collects errors and warnings with their locations.
pub(crate) struct Diag<'a> {
    file: &'a str,
    lines: &'a LineIndex,
    pub errors: Vec<PolicyError>,
    pub warnings: Vec<PolicyError>,
}

impl<'a> Diag<'a> {
    pub fn new(file: &'a str, lines: &'a LineIndex) -> Self {
        Diag {
            file,
            lines,
            errors: Vec::new(),
            warnings: Vec::new(),
        }
    }
    fn make(&self, path: String, message: String) -> PolicyError {
        PolicyError {
            file: self.file.to_string(),
            line: self.lines.line(&path),
            path,
            message,
        }
    }
    pub fn error(&mut self, path: impl Into<String>, message: impl Into<String>) {
        let e = self.make(path.into(), message.into());
        self.errors.push(e);
    }
    pub fn warn(&mut self, path: impl Into<String>, message: impl Into<String>) {
        let w = self.make(path.into(), message.into());
        self.warnings.push(w);
    }
    /// `Ok` passes through; `Err` is recorded at `path`.
    fn check<T>(&mut self, path: &str, r: Result<T, String>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(m) => {
                self.error(path, m);
                None
            }
        }
    }
}

// ---- Scalars and units ----

/// `100 has no unit; write e.g. "100Mbit" ...`: `example` spells the number as `N`.
fn no_unit(s: &Scalar, example: &str) -> String {
    let n = match s {
        Scalar::Str(t) => t.trim().to_string(),
        other => other.to_string(),
    };
    format!("{s} has no unit; write e.g. {}", example.replace('N', &n))
}

/// A rate in bytes/s within `b`.
pub fn rate(s: &Scalar, b: Bounds) -> Result<u64, String> {
    let examples = units::RATE_EXAMPLES;
    let v = match s {
        Scalar::Str(t) => units::parse_rate(t),
        Scalar::Int(_) | Scalar::Float(_) => Err(UnitError::NoUnit),
        Scalar::Bool(_) => Err(UnitError::Invalid(String::new())),
    };
    match v {
        Ok(v) if v < b.min || v > b.max => Err(format!("{s} is out of range; valid: {}", b.text)),
        Ok(v) => Ok(v),
        Err(UnitError::NoUnit) => Err(no_unit(s, r#""NMbit" (bits/s) or "NMB/s" (bytes/s)"#)),
        Err(UnitError::Overflow) => Err(format!("{s} is too large; valid: {}", b.text)),
        Err(UnitError::Invalid(h)) if !h.is_empty() => {
            Err(format!("{s} is not a rate; write e.g. {examples} ({h})"))
        }
        Err(_) => Err(format!(
            "{s} is not a rate; write e.g. {examples} (units: {})",
            units::rate_unit_names()
        )),
    }
}

/// A size in bytes within `b`.
pub fn size(s: &Scalar, b: Bounds) -> Result<u64, String> {
    let examples = units::SIZE_EXAMPLES;
    let v = match s {
        Scalar::Str(t) => units::parse_size(t),
        Scalar::Int(_) | Scalar::Float(_) => Err(UnitError::NoUnit),
        Scalar::Bool(_) => Err(UnitError::Invalid(String::new())),
    };
    match v {
        Ok(v) if v < b.min || v > b.max => Err(format!("{s} is out of range; valid: {}", b.text)),
        Ok(v) => Ok(v),
        Err(UnitError::NoUnit) => Err(no_unit(s, r#""NB""#)),
        Err(UnitError::Overflow) => Err(format!("{s} is too large; valid: {}", b.text)),
        Err(UnitError::Fraction) => Err(format!("{s} is not a whole number of bytes")),
        Err(UnitError::Invalid(h)) if !h.is_empty() => {
            Err(format!("{s} is not a size; write e.g. {examples} ({h})"))
        }
        Err(_) => Err(format!(
            "{s} is not a size; write e.g. {examples} (units: B, KB, KiB, MB, MiB, GB, GiB)"
        )),
    }
}

/// A duration in nanoseconds within `b`.
pub fn duration(s: &Scalar, b: Bounds) -> Result<u64, String> {
    let examples = units::DURATION_EXAMPLES;
    let v = match s {
        Scalar::Str(t) => units::parse_duration(t),
        Scalar::Int(_) | Scalar::Float(_) => Err(UnitError::NoUnit),
        Scalar::Bool(_) => Err(UnitError::Invalid(String::new())),
    };
    match v {
        Ok(v) if v < b.min || v > b.max => Err(format!("{s} is out of range; valid: {}", b.text)),
        Ok(v) => Ok(v),
        Err(UnitError::NoUnit) => Err(no_unit(s, r#""Nms" or "Nus""#)),
        Err(UnitError::Overflow) => Err(format!("{s} is too large; valid: {}", b.text)),
        Err(UnitError::Fraction) => Err(format!("{s} is not a whole number of nanoseconds")),
        Err(UnitError::Invalid(_)) => Err(format!(
            "{s} is not a duration; write e.g. {examples} (units: ns, us, ms, s)"
        )),
    }
}

fn int_range(v: i64, lo: i64, hi: i64) -> Result<i64, String> {
    if v < lo || v > hi {
        Err(format!("{v} is out of range; valid: {lo}..={hi}"))
    } else {
        Ok(v)
    }
}

/// Names become metric labels and HTB class names.
fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid name; use 1 to 64 letters, digits, \"-\", \"_\" or \".\""
        ))
    }
}

fn factor(s: &Scalar) -> Result<Option<f64>, String> {
    let bad = || format!("{s} is not a factor; write a number > 0 (e.g. 1, 1.44, 7.2) or \"unlimited\"");
    match s {
        Scalar::Str(t) if t.trim() == "unlimited" => Ok(None),
        Scalar::Int(i) => {
            if *i > 0 {
                Ok(Some(*i as f64))
            } else {
                Err(format!(
                    "{s} is out of range; valid: a number > 0 or \"unlimited\""
                ))
            }
        }
        Scalar::Float(f) => {
            if f.is_finite() && *f > 0.0 {
                Ok(Some(*f))
            } else {
                Err(format!(
                    "{s} is out of range; valid: a number > 0 or \"unlimited\""
                ))
            }
        }
        _ => Err(bad()),
    }
}

pub fn protocol(s: &Scalar) -> Result<u8, String> {
    let bad = || {
        format!(
            "{s} is not a protocol; write {} or a number 0..=255",
            protocols::names()
        )
    };
    match s {
        Scalar::Int(i) if (0..=255).contains(i) => Ok(*i as u8),
        Scalar::Int(i) => Err(format!("{i} is out of range; valid: 0..=255 or a name")),
        Scalar::Str(t) => protocols::by_name(t).ok_or_else(bad),
        _ => Err(bad()),
    }
}

fn protocol_name(p: u8) -> String {
    protocols::name(p)
        .map(String::from)
        .unwrap_or_else(|| format!("protocol {p}"))
}

pub fn port(s: &Scalar) -> Result<(u16, u16), String> {
    let one = |t: &str| -> Option<u32> {
        let t = t.trim();
        if t.is_empty() || t.len() > 5 || !t.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        t.parse().ok()
    };
    let bad = || format!("{s} is not a port; write e.g. 443 or \"8000-8100\"");
    let (lo, hi) = match s {
        Scalar::Int(i) => {
            if (0..=65535).contains(i) {
                return Ok((*i as u16, *i as u16));
            }
            return Err(format!("{s} is out of range; valid: 0..=65535"));
        }
        Scalar::Str(t) => match t.split_once('-') {
            Some((a, b)) => (one(a).ok_or_else(bad)?, one(b).ok_or_else(bad)?),
            None => {
                let p = one(t).ok_or_else(bad)?;
                (p, p)
            }
        },
        _ => return Err(bad()),
    };
    if lo > 65535 || hi > 65535 {
        return Err(format!("{s} is out of range; valid: 0..=65535"));
    }
    if lo > hi {
        return Err(format!("{s} is reversed; write \"{hi}-{lo}\""));
    }
    Ok((lo as u16, hi as u16))
}

pub fn mark(s: &Scalar) -> Result<(u32, u32), String> {
    let bad = || format!("{s} is not a mark; write e.g. 16, \"0x10\" or \"0x10/0xff\"");
    let num = |t: &str| -> Result<u64, String> {
        let t = t.trim();
        let r = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
            Some(h) => u64::from_str_radix(h, 16),
            None => t.parse::<u64>(),
        };
        match r {
            Ok(v) if v <= u64::from(u32::MAX) => Ok(v),
            Ok(_) => Err(format!("{s} is out of range; marks are 32 bits (0..=0xffffffff)")),
            Err(_) => Err(bad()),
        }
    };
    let (v, m) = match s {
        Scalar::Int(i) => {
            if (0..=i128::from(u32::MAX)).contains(i) {
                (*i as u64, u64::from(u32::MAX))
            } else {
                return Err(format!("{s} is out of range; marks are 32 bits (0..=0xffffffff)"));
            }
        }
        Scalar::Str(t) => match t.split_once('/') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(t)?, u64::from(u32::MAX)),
        },
        _ => return Err(bad()),
    };
    let (v, m) = (v as u32, m as u32);
    if m == 0 {
        return Err(format!(
            "{s}: a mask of 0 matches every packet; remove the field to match any mark"
        ));
    }
    if v & !m != 0 {
        return Err(format!(
            "{s}: the value {v:#x} has bits outside the mask {m:#x}, so it can never match"
        ));
    }
    Ok((v, m))
}

/// An address or CIDR; returns the network and, when host bits were set, a warning.
pub fn net(s: &Scalar) -> Result<(IpNet, Option<String>), String> {
    let bad = || {
        format!(
            "{s} is not an address; write a CIDR (\"10.0.0.0/8\", \"fd00::/8\") or an address (\"10.1.2.3\")"
        )
    };
    let Scalar::Str(t) = s else { return Err(bad()) };
    let t = t.trim();
    let n = if let Ok(n) = t.parse::<IpNet>() {
        n
    } else if let Ok(a) = t.parse::<IpAddr>() {
        IpNet::from(a)
    } else {
        return Err(bad());
    };
    // IPv4-mapped IPv6 (::ffff:a.b.c.d/p, p >= 96) is IPv4: that is how the datapath sees v4.
    let n = match n {
        IpNet::V6(v6) if v6.prefix_len() >= 96 && v6.addr().to_ipv4_mapped().is_some() => {
            let a = v6.addr().to_ipv4_mapped().expect("checked");
            IpNet::V4(Ipv4Net::new(a, v6.prefix_len() - 96).expect("prefix <= 32"))
        }
        n => n,
    };
    let t2 = n.trunc();
    let warn = (t2 != n).then(|| format!("{s} has host bits set; it matches {t2}"));
    Ok((t2, warn))
}

// ---- The validation ----

/// Validates a parsed file. `file`, `hash` and `lines` describe its text.
pub(crate) fn validate(
    f: &raw::PolicyFile,
    file: &str,
    hash: String,
    lines: &LineIndex,
    host: &dyn HostFacts,
) -> Result<Validated, Vec<PolicyError>> {
    let mut d = Diag::new(file, lines);
    let r = validate_into(&mut d, f, file, hash, host);
    // In file order (stable: problems on one line keep the order they were found in).
    let by_line = |e: &PolicyError| e.line.unwrap_or(usize::MAX);
    d.errors.sort_by_key(by_line);
    d.warnings.sort_by_key(by_line);
    match r {
        Some(mut v) if d.errors.is_empty() => {
            v.warnings = d.warnings;
            Ok(v)
        }
        _ => Err(d.errors),
    }
}

fn validate_into(
    d: &mut Diag,
    f: &raw::PolicyFile,
    file: &str,
    hash: String,
    host: &dyn HostFacts,
) -> Option<Validated> {
    let spec = &f.spec;

    if f.api_version != raw::API_VERSION {
        d.error(
            "apiVersion",
            format!(
                "{:?} is not supported; valid: {:?}",
                f.api_version,
                raw::API_VERSION
            ),
        );
    }
    if f.kind != raw::KIND {
        d.error(
            "kind",
            format!("{:?} is not supported; valid: {:?}", f.kind, raw::KIND),
        );
    }
    if let Some(n) = &f.metadata.name
        && let Err(m) = check_name(n)
    {
        d.error("metadata.name", m);
    }

    let (interfaces, interfaces_auto) = interfaces(d, &spec.interfaces, host);
    let horizon_ns = d
        .check("spec.horizon", duration(&spec.horizon.0, HORIZON))
        .unwrap_or(0);
    let flow_table_size = d
        .check(
            "spec.flow_table_size",
            int_range(spec.flow_table_size, FLOW_TABLE.0, FLOW_TABLE.1),
        )
        .unwrap_or(0) as u32;
    let spec_link_rate = spec
        .link_rate
        .as_ref()
        .and_then(|r| d.check("spec.link_rate", rate(&r.0, RATE)));

    let qjump = spec.qjump.as_ref().and_then(|q| {
        let n = d.check("spec.qjump.hosts", int_range(q.hosts, HOSTS.0, HOSTS.1));
        let p = d.check("spec.qjump.max_packet", size(&q.max_packet.0, MAX_PACKET));
        let r = d.check("spec.qjump.link_rate", rate(&q.link_rate.0, RATE));
        let e = d.check(
            "spec.qjump.switch_delay",
            duration(&q.switch_delay.0, SWITCH_DELAY),
        );
        Some(Network {
            hosts: n? as u64,
            max_packet: p?,
            link_rate: r?,
            switch_delay_ns: e?,
        })
    });

    let levels = levels(d, &spec.levels, spec.qjump.is_some(), qjump.as_ref());
    let level_names: Vec<&str> = spec.levels.iter().map(|l| l.name.as_str()).collect();

    let classes = classes(d, &spec.classes, &level_names, &levels);
    let class_names: Vec<&str> = spec.classes.iter().map(|c| c.name.as_str()).collect();
    let default_class = lookup(
        d,
        "spec.default_class",
        &spec.default_class,
        &class_names,
        "class",
        "classes",
    );

    let rules = rules(d, &spec.rules, &class_names, host);

    // The host's link rate: spec.link_rate, else the slowest interface, else QJump's R.
    let iface_rate = interfaces
        .iter()
        .filter_map(|i| host.link_rate(i).map(|r| (r, i.clone())))
        .min_by_key(|(r, _)| *r);
    let link_rate = match (spec_link_rate, &iface_rate, &qjump) {
        (Some(r), _, _) => Some(LinkRate {
            rate: r,
            source: LinkRateSource::Spec,
        }),
        (None, Some((r, i)), _) => Some(LinkRate {
            rate: *r,
            source: LinkRateSource::Interface(i.clone()),
        }),
        (None, None, Some(q)) => Some(LinkRate {
            rate: q.link_rate,
            source: LinkRateSource::QJump,
        }),
        _ => None,
    };
    if let (Some(r), Some((ir, i))) = (spec_link_rate, &iface_rate)
        && r > *ir
    {
        d.warn(
            "spec.link_rate",
            format!(
                "{} is above the speed {i} reports ({}); guarantees computed against it may not hold",
                units::fmt_rate(r),
                units::fmt_rate(*ir)
            ),
        );
    }

    let enforcement = EnforcementRequest::from(spec.enforcement);
    if enforcement == EnforcementRequest::Htb && link_rate.is_none() {
        let m = "htb needs the link rate for its root class; set spec.link_rate (the kernel reports no speed for these interfaces)";
        if host.is_offline() {
            d.warn("spec.enforcement", m)
        } else {
            d.error("spec.enforcement", m)
        }
    }

    let d3 = d3_spec(d, spec, host);

    // Everything below needs the parts above to be valid.
    let (Some(levels), Some(classes), Some(default_class), Some(rules), Some(d3)) =
        (levels, classes, default_class, rules, d3)
    else {
        return None;
    };
    if d3.is_none() {
        for (i, c) in classes.iter().enumerate() {
            if c.d3.is_some() {
                d.error(
                    format!("spec.classes[{i}].d3"),
                    "needs spec.d3 (add `d3: {}` to spec to turn D3 on for this host)",
                );
            }
        }
    }
    fits(d, &levels, link_rate.as_ref());
    cross_checks(d, &levels, &classes, &rules, default_class);

    Some(Validated {
        file: file.to_string(),
        hash,
        name: f.metadata.name.clone(),
        description: f.metadata.description.clone(),
        interfaces,
        interfaces_auto,
        enforcement,
        horizon_ns,
        flow_table_size,
        link_rate,
        qjump,
        levels,
        classes,
        rules,
        default_class,
        d3,
        warnings: Vec::new(),
    })
}

/// `spec.d3`: `Some(None)` when absent, `None` when invalid.
fn d3_spec(d: &mut Diag, spec: &raw::Spec, host: &dyn HostFacts) -> Option<Option<D3Spec>> {
    let Some(s) = &spec.d3 else { return Some(None) };
    let mut ok = true;
    let first = match &s.first_rtt_rate {
        Some(r) => match d.check("spec.d3.first_rtt_rate", rate(&r.0, RATE)) {
            Some(v) => Some(v),
            None => {
                ok = false;
                None
            }
        },
        None => None,
    };
    let interval_ns = match &s.interval {
        Some(v) => d
            .check("spec.d3.interval", duration(&v.0, D3_INTERVAL))
            .unwrap_or_else(|| {
                ok = false;
                0
            }),
        None => 1_000_000,
    };
    let mut router = Vec::new();
    for (i, l) in s.router.iter().enumerate() {
        let p = format!("spec.d3.router[{i}]");
        if !host.is_offline() && !host.interface_exists(&l.interface) {
            d.error(
                format!("{p}.interface"),
                format!("no interface named {:?} on this host", l.interface),
            );
            ok = false;
        }
        if router.iter().any(|r: &D3Link| r.interface == l.interface) {
            d.error(
                format!("{p}.interface"),
                format!("{:?} is listed twice", l.interface),
            );
            ok = false;
        }
        let cap = d.check(&format!("{p}.capacity"), rate(&l.capacity.0, RATE));
        let base = l
            .base_rate
            .as_ref()
            .map(|r| d.check(&format!("{p}.base_rate"), rate(&r.0, RATE)));
        let fcap = l
            .flow_cap
            .as_ref()
            .map(|r| d.check(&format!("{p}.flow_cap"), rate(&r.0, RATE)));
        let (Some(cap), Some(base), Some(fcap)) = (cap, base.transpose_ok(), fcap.transpose_ok()) else {
            ok = false;
            continue;
        };
        let base = base.unwrap_or(cap / 1000);
        if base >= cap {
            d.error(
                format!("{p}.base_rate"),
                format!(
                    "{} must be below the capacity {}",
                    units::fmt_rate(base),
                    units::fmt_rate(cap)
                ),
            );
            ok = false;
        }
        router.push(D3Link {
            interface: l.interface.clone(),
            capacity: cap,
            base_rate: base,
            flow_cap: fcap.unwrap_or(0),
        });
    }
    ok.then_some(Some(D3Spec {
        receiver: s.receiver,
        first_rtt_rate: first,
        interval_ns,
        router,
    }))
}

/// Index of `name` in `names`, or an error listing the valid names.
fn lookup(d: &mut Diag, path: &str, name: &str, names: &[&str], what: &str, plural: &str) -> Option<usize> {
    let found = names.iter().position(|n| *n == name);
    if found.is_none() {
        d.error(
            path,
            format!("no {what} named {name:?}; {plural}: {}", names.join(", ")),
        );
    }
    found
}

fn interfaces(d: &mut Diag, list: &[String], host: &dyn HostFacts) -> (Vec<String>, bool) {
    if list.is_empty() {
        d.error(
            "spec.interfaces",
            "the list is empty; name the interfaces (e.g. [eth0]) or write [auto]",
        );
        return (Vec::new(), false);
    }
    if list.iter().any(|i| i == "auto") {
        if list.len() > 1 {
            d.error(
                "spec.interfaces",
                "\"auto\" must be the only entry; write [auto] or name every interface",
            );
            return (Vec::new(), true);
        }
        let found = host.default_route_interfaces();
        if found.is_empty() {
            if host.is_offline() {
                d.warn("spec.interfaces", "auto is resolved on the host (the interfaces of the default routes); offline it is empty");
            } else {
                d.error(
                    "spec.interfaces",
                    "auto: this host has no default route (IPv4 or IPv6); name the interfaces instead",
                );
            }
        }
        return (found, true);
    }
    let mut out: Vec<String> = Vec::new();
    for (i, name) in list.iter().enumerate() {
        let path = format!("spec.interfaces[{i}]");
        let valid = !name.is_empty()
            && name.len() < 16
            && !name
                .chars()
                .any(|c| c == '/' || c == ':' || c.is_whitespace() || c == '\0');
        if !valid {
            d.error(
                path,
                format!("{name:?} is not an interface name (1 to 15 characters, no \"/\", \":\" or spaces)"),
            );
        } else if out.contains(name) {
            d.error(path, format!("{name:?} is listed twice"));
        } else if !host.interface_exists(name) {
            d.error(path, format!("no interface named {name:?} on this host (in this network namespace); check the name or use --offline"));
        } else {
            out.push(name.clone());
        }
    }
    (out, false)
}

fn levels(d: &mut Diag, raw: &[raw::Level], has_qjump: bool, net: Option<&Network>) -> Option<Vec<Level>> {
    if raw.is_empty() || raw.len() > MAX_LEVELS {
        d.error(
            "spec.levels",
            format!(
                "{} levels; valid: 1..={MAX_LEVELS} (one per hardware priority)",
                raw.len()
            ),
        );
        return None;
    }
    let mut out = Vec::new();
    let mut ok = true;
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, l) in raw.iter().enumerate() {
        let p = format!("spec.levels[{i}]");
        let mut good = true;
        if let Err(m) = check_name(&l.name) {
            d.error(format!("{p}.name"), m);
            good = false;
        } else if let Some(j) = seen.insert(&l.name, i) {
            d.error(
                format!("{p}.name"),
                format!(
                    "{:?} is already the name of spec.levels[{j}]; level names must be unique",
                    l.name
                ),
            );
            good = false;
        }
        let priority = d.check(&format!("{p}.priority"), int_range(l.priority, 0, 7));
        let dscp = l.dscp.map(|v| d.check(&format!("{p}.dscp"), int_range(v, 0, 63)));
        let pcp = l.pcp.map(|v| d.check(&format!("{p}.pcp"), int_range(v, 0, 7)));
        let limit = match (&l.factor, &l.rate) {
            (Some(_), Some(_)) => {
                d.error(p.clone(), "set either factor or rate, not both");
                None
            }
            (Some(f), None) => match d.check(&format!("{p}.factor"), factor(&f.0)) {
                Some(None) => Some(Limit::Unlimited),
                Some(Some(f)) => {
                    if !has_qjump {
                        d.error(
                            format!("{p}.factor"),
                            "a factor needs spec.qjump (hosts, max_packet, link_rate, switch_delay) to compute the level's rate; add it or give the level an explicit rate",
                        );
                        None
                    } else if let Some(n) = net.filter(|n| f > n.hosts as f64) {
                        d.error(
                            format!("{p}.factor"),
                            format!(
                                "{} is out of range; valid: > 0 and <= spec.qjump.hosts ({}); a level that may use the whole link is \"unlimited\"",
                                f, n.hosts
                            ),
                        );
                        None
                    } else {
                        Some(Limit::Factor(f))
                    }
                }
                None => None,
            },
            (None, Some(r)) => d.check(&format!("{p}.rate"), rate(&r.0, RATE)).map(Limit::Rate),
            (None, None) => Some(Limit::Unlimited),
        };
        let (Some(priority), Some(limit), Some(dscp), Some(pcp), true) =
            (priority, limit, dscp.transpose_ok(), pcp.transpose_ok(), good)
        else {
            ok = false;
            continue;
        };
        let (rate, epoch_secs) = match limit {
            Limit::Factor(f) => match net {
                Some(n) => (Some(n.level_rate(f)), Some(n.epoch_secs(f))),
                // qjump present but invalid: already reported.
                None => {
                    ok = false;
                    continue;
                }
            },
            Limit::Rate(r) => (Some(r), None),
            Limit::Unlimited => (None, None),
        };
        out.push(Level {
            name: l.name.clone(),
            priority: priority as u8,
            limit,
            rate,
            epoch_secs,
            dscp: dscp.map(|v| v as u8),
            pcp: pcp.map(|v| v as u8),
        });
    }
    if !ok {
        return None;
    }
    // Order: the list runs from the highest level to the lowest.
    for i in 1..out.len() {
        let p = format!("spec.levels[{i}]");
        let (cur, prev) = (&out[i], &out[i - 1]);
        if let Some(j) = out[..i].iter().position(|l| l.priority == cur.priority) {
            d.error(
                format!("{p}.priority"),
                format!(
                    "{} is already the priority of level {:?} (spec.levels[{j}]); switches could not tell the two levels apart",
                    cur.priority, out[j].name
                ),
            );
        } else if cur.priority > prev.priority {
            d.error(
                format!("{p}.priority"),
                format!(
                    "{} is above the priority {} of level {:?} listed before it; levels are listed from the highest to the lowest, so priorities must decrease",
                    cur.priority, prev.priority, prev.name
                ),
            );
        }
        if let Limit::Factor(f) = cur.limit
            && let Some(above) = out[..i].iter().rev().find_map(|l| match l.limit {
                Limit::Factor(g) => Some((g, &l.name)),
                _ => None,
            })
            && f < above.0
        {
            d.error(
                        format!("{p}.factor"),
                        format!(
                            "{f} is below the factor {} of level {:?} above it; factors must not decrease down the list (a lower level has at least the throughput of a higher one)",
                            above.0, above.1
                        ),
                    );
        }
        if cur.rate.is_some()
            && let Some(u) = out[..i].iter().find(|l| l.rate.is_none())
        {
            d.error(
                    p.clone(),
                    format!(
                        "level {:?} is rate-limited but level {:?} above it is unlimited: a higher level that may use the whole link voids the guarantee of the levels below; list unlimited levels last",
                        cur.name, u.name
                    ),
                );
        }
        if let Some(ds) = cur.dscp
            && let Some(o) = out[..i].iter().find(|l| l.dscp == Some(ds))
        {
            d.warn(
                    format!("{p}.dscp"),
                    format!("{ds} is also the DSCP of level {:?}; switches that classify by DSCP cannot tell the levels apart", o.name),
                );
        }
    }
    for (i, l) in out.iter().enumerate() {
        if let (Limit::Factor(f), Some(n), Some(r)) = (l.limit, net, l.rate)
            && r >= n.link_rate
        {
            d.warn(
                format!("spec.levels[{i}].factor"),
                format!(
                    "factor {f} gives the full link rate ({}); \"unlimited\" says so directly",
                    units::fmt_rate(r)
                ),
            );
        }
    }
    Some(out)
}

/// `Option<Option<T>>` from `opt.map(check)`: `Some(None)` means the check failed.
trait TransposeOk<T> {
    fn transpose_ok(self) -> Option<Option<T>>;
}
impl<T> TransposeOk<T> for Option<Option<T>> {
    fn transpose_ok(self) -> Option<Option<T>> {
        match self {
            None => Some(None),
            Some(Some(v)) => Some(Some(v)),
            Some(None) => None,
        }
    }
}

fn tcp_timer(d: &mut Diag, path: &str, s: &Scalar) -> Option<u32> {
    let ns = d.check(path, duration(s, TCP_TIMER))?;
    if ns % 1_000 != 0 {
        d.error(
            path,
            format!("{s} is not a whole number of microseconds (the kernel takes microseconds)"),
        );
        return None;
    }
    if ns <= 1_000_000 {
        d.warn(
            path,
            format!("{s} is at most one jiffy even at HZ=1000; the kernel rejects values below 2 jiffies (counted in sockopt_errors); use more than 1ms, or more than 4ms for HZ=250 kernels"),
        );
    } else if ns <= 4_000_000 {
        d.warn(
            path,
            format!("{s} is below 2 jiffies on kernels with HZ=250, which reject it (counted in sockopt_errors); it works with HZ=1000"),
        );
    }
    Some((ns / 1_000) as u32)
}

fn classes(
    d: &mut Diag,
    raw: &[raw::Class],
    level_names: &[&str],
    levels: &Option<Vec<Level>>,
) -> Option<Vec<Class>> {
    if raw.is_empty() || raw.len() > MAX_CLASSES {
        d.error(
            "spec.classes",
            format!("{} classes; valid: 1..={MAX_CLASSES}", raw.len()),
        );
        return None;
    }
    let mut out = Vec::new();
    let mut ok = true;
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, c) in raw.iter().enumerate() {
        let p = format!("spec.classes[{i}]");
        let mut good = true;
        if let Err(m) = check_name(&c.name) {
            d.error(format!("{p}.name"), m);
            good = false;
        } else if let Some(j) = seen.insert(&c.name, i) {
            d.error(
                format!("{p}.name"),
                format!(
                    "{:?} is already the name of spec.classes[{j}]; class names must be unique",
                    c.name
                ),
            );
            good = false;
        }
        let level = lookup(d, &format!("{p}.level"), &c.level, level_names, "level", "levels");
        let flow_rate = c
            .flow_rate
            .as_ref()
            .map(|r| d.check(&format!("{p}.flow_rate"), rate(&r.0, RATE)));
        let class_rate = c
            .class_rate
            .as_ref()
            .map(|r| d.check(&format!("{p}.class_rate"), rate(&r.0, RATE)));
        let tcp = c.tcp.as_ref().map(|t| {
            let rto = t
                .rto_min
                .as_ref()
                .map(|v| tcp_timer(d, &format!("{p}.tcp.rto_min"), &v.0));
            let del = t
                .delack_max
                .as_ref()
                .map(|v| tcp_timer(d, &format!("{p}.tcp.delack_max"), &v.0));
            Some(TcpSettings {
                rto_min_us: rto.transpose_ok()?,
                delack_max_us: del.transpose_ok()?,
            })
        });
        let (Some(level), Some(flow_rate), Some(class_rate), Some(tcp), true) = (
            level,
            flow_rate.transpose_ok(),
            class_rate.transpose_ok(),
            tcp.transpose_ok(),
            good,
        ) else {
            ok = false;
            continue;
        };
        if let (Some(f), Some(c)) = (flow_rate, class_rate)
            && f > c
        {
            d.warn(
                format!("{p}.flow_rate"),
                format!(
                    "{} is above the class_rate {}: a single flow can never reach it",
                    units::fmt_rate(f),
                    units::fmt_rate(c)
                ),
            );
        }
        if let (Some(cr), Some(levels)) = (class_rate, levels)
            && let Some(lr) = levels.get(level).and_then(|l| l.rate)
            && cr > lr
        {
            d.warn(
                format!("{p}.class_rate"),
                format!(
                    "{} is above the rate of level {:?} ({}); the level's rate binds",
                    units::fmt_rate(cr),
                    levels[level].name,
                    units::fmt_rate(lr)
                ),
            );
        }
        if let Some(f) = flow_rate
            && f > u64::from(u32::MAX)
        {
            d.warn(
                    format!("{p}.flow_rate"),
                    format!(
                        "{}: sock_ops sets SO_MAX_PACING_RATE, a 32-bit byte rate, so TCP sockets are paced at most at {} (the tc clock applies the full rate)",
                        units::fmt_rate(f),
                        units::fmt_rate(u64::from(u32::MAX))
                    ),
                );
        }
        if tcp.is_some_and(|t| t.rto_min_us.is_none() && t.delack_max_us.is_none()) {
            d.warn(
                format!("{p}.tcp"),
                "is empty; remove it or set rto_min / delack_max",
            );
        }
        let d3 = match &c.d3 {
            None => None,
            Some(k) => {
                let dl = k
                    .deadline
                    .as_ref()
                    .map(|v| d.check(&format!("{p}.d3.deadline"), duration(&v.0, D3_DEADLINE)));
                let sz = k
                    .size
                    .as_ref()
                    .map(|v| d.check(&format!("{p}.d3.size"), size(&v.0, D3_SIZE)));
                match (dl, sz) {
                    (None, None) => Some(ClassD3 { default: None }),
                    (Some(Some(dl)), Some(Some(sz))) => Some(ClassD3 {
                        default: Some((dl, sz)),
                    }),
                    (Some(_), None) | (None, Some(_)) => {
                        d.error(format!("{p}.d3"), "deadline and size go together: a deadline needs the transfer's size to compute the rate it requires");
                        ok = false;
                        continue;
                    }
                    _ => {
                        ok = false;
                        continue;
                    }
                }
            }
        };
        out.push(Class {
            name: c.name.clone(),
            level,
            flow_rate,
            class_rate,
            tcp,
            d3,
        });
    }
    ok.then_some(out)
}

/// One rule's conditions before expansion.
struct RuleParts {
    class: usize,
    protocol: Option<u8>,
    family: Option<Family>,
    src: Option<Vec<(Option<usize>, IpNet)>>,
    dst: Option<Vec<(Option<usize>, IpNet)>>,
    src_port: Option<(u16, u16)>,
    dst_port: Option<(u16, u16)>,
    dscp: Option<u8>,
    cgroup: Option<Cgroup>,
    mark: Option<(u32, u32)>,
}

fn addresses(d: &mut Diag, path: &str, a: &raw::Addresses) -> Option<Vec<(Option<usize>, IpNet)>> {
    let entries: Vec<(Option<usize>, &Scalar)> = match a {
        raw::Addresses::One(s) => vec![(None, s)],
        raw::Addresses::Many(v) if v.is_empty() => {
            d.error(
                path,
                "an empty list matches nothing; remove the field to match any address",
            );
            return None;
        }
        raw::Addresses::Many(v) => v.iter().enumerate().map(|(i, s)| (Some(i), s)).collect(),
    };
    let mut out = Vec::new();
    let mut ok = true;
    for (i, s) in entries {
        let p = match i {
            Some(i) => format!("{path}[{i}]"),
            None => path.to_string(),
        };
        match net(s) {
            Ok((n, w)) => {
                if let Some(w) = w {
                    d.warn(p, w);
                }
                out.push((i, n));
            }
            Err(m) => {
                d.error(p, m);
                ok = false;
            }
        }
    }
    ok.then_some(out)
}

fn entry_path(base: &str, i: Option<usize>) -> String {
    match i {
        Some(i) => format!("{base}[{i}]"),
        None => base.to_string(),
    }
}

fn rule_parts(
    d: &mut Diag,
    i: usize,
    r: &raw::Rule,
    class_names: &[&str],
    host: &dyn HostFacts,
) -> Option<RuleParts> {
    let p = format!("spec.rules[{i}]");
    let class = lookup(
        d,
        &format!("{p}.class"),
        &r.class,
        class_names,
        "class",
        "classes",
    );
    let protocol = r
        .protocol
        .as_ref()
        .map(|s| d.check(&format!("{p}.protocol"), protocol(&s.0)))
        .transpose_ok();
    let family = r.family.map(|f| match f {
        raw::Family::Ipv4 => Family::V4,
        raw::Family::Ipv6 => Family::V6,
    });
    let src = r
        .src
        .as_ref()
        .map(|a| addresses(d, &format!("{p}.src"), a))
        .transpose_ok();
    let dst = r
        .dst
        .as_ref()
        .map(|a| addresses(d, &format!("{p}.dst"), a))
        .transpose_ok();
    let src_port = r
        .src_port
        .as_ref()
        .map(|s| d.check(&format!("{p}.src_port"), port(&s.0)))
        .transpose_ok();
    let dst_port = r
        .dst_port
        .as_ref()
        .map(|s| d.check(&format!("{p}.dst_port"), port(&s.0)))
        .transpose_ok();
    let dscp = r
        .dscp
        .map(|v| {
            d.check(&format!("{p}.dscp"), int_range(v, 0, 63))
                .map(|v| v as u8)
        })
        .transpose_ok();
    let mark = r
        .mark
        .as_ref()
        .map(|s| d.check(&format!("{p}.mark"), mark(&s.0)))
        .transpose_ok();
    let cgroup = r.cgroup.as_ref().map(|c| {
        let cp = format!("{p}.cgroup");
        let path = c.trim();
        if path.is_empty() || path == "/" {
            d.error(cp, format!("{c:?} is not a cgroup; write a path below the cgroup2 mount, e.g. \"/system.slice/memcached.service\""));
            return None;
        }
        if host.is_offline() {
            d.warn(cp, format!("{c:?} is not resolved offline; compiled with cgroup id 0 (the agent resolves it on the host)"));
            return Some(Cgroup { path: path.to_string(), id: 0 });
        }
        match host.cgroup_id(path) {
            Ok(id) => Some(Cgroup { path: path.to_string(), id }),
            Err(e) => {
                d.error(cp, format!("{c:?}: {e}"));
                None
            }
        }
    });
    let cgroup = cgroup.transpose_ok();

    let (
        Some(class),
        Some(protocol),
        Some(src),
        Some(dst),
        Some(src_port),
        Some(dst_port),
        Some(dscp),
        Some(mark),
        Some(cgroup),
    ) = (class, protocol, src, dst, src_port, dst_port, dscp, mark, cgroup)
    else {
        return None;
    };

    let mut ok = true;
    // Ports need a protocol with ports.
    if let Some(proto) = protocol {
        if !protocols::has_ports(proto) {
            for (field, v) in [("src_port", src_port), ("dst_port", dst_port)] {
                if v.is_some() {
                    d.error(
                        format!("{p}.{field}"),
                        format!(
                            "{} has no ports; ports are matched for {}",
                            protocol_name(proto),
                            protocols::with_ports()
                        ),
                    );
                    ok = false;
                }
            }
        }
    } else {
        for (field, v) in [("src_port", src_port), ("dst_port", dst_port)] {
            if let Some((0, hi)) = v {
                d.warn(
                    format!("{p}.{field}"),
                    format!("0-{hi} also matches packets without ports (icmp, ...), whose ports read as 0; add a protocol to avoid that"),
                );
            }
        }
    }
    // Families: explicit, implied by icmp/icmpv6, and of every address must agree.
    let implied = match protocol {
        Some(1) => Some((Family::V4, "protocol icmp is IPv4-only".to_string())),
        Some(58) => Some((Family::V6, "protocol icmpv6 is IPv6-only".to_string())),
        _ => None,
    };
    if let (Some(f), Some((g, _))) = (family, &implied)
        && f != *g
    {
        let (name, want) = if *g == Family::V4 {
            ("icmp", "icmpv6")
        } else {
            ("icmpv6", "icmp")
        };
        d.error(
            format!("{p}.protocol"),
            format!(
                "{name} is {}-only but family is {}; use {want}",
                g.name(),
                f.name().to_lowercase()
            ),
        );
        ok = false;
    }
    let family_by = family
        .map(|f| (f, format!("family is {}", f.name().to_lowercase())))
        .or(implied);
    if let Some((f, by)) = &family_by {
        for (field, list) in [("src", &src), ("dst", &dst)] {
            for (idx, n) in list.iter().flatten() {
                if Family::of(n) != *f {
                    d.error(
                        entry_path(&format!("{p}.{field}"), *idx),
                        format!("{n} is {} but {by}; no packet could match", Family::of(n).name()),
                    );
                    ok = false;
                }
            }
        }
    }
    if ok && let (Some(s), Some(t)) = (&src, &dst) {
        let fam = |l: &Vec<(Option<usize>, IpNet)>, f| l.iter().any(|(_, n)| Family::of(n) == f);
        let common: Vec<Family> = [Family::V4, Family::V6]
            .into_iter()
            .filter(|f| fam(s, *f) && fam(t, *f))
            .collect();
        if common.is_empty() {
            let sf = Family::of(&s[0].1);
            let tf = Family::of(&t[0].1);
            d.error(
                format!("{p}.dst"),
                format!(
                    "dst is {} but src is {}; no packet has both",
                    tf.name(),
                    sf.name()
                ),
            );
            ok = false;
        } else {
            for (field, list, other) in [("src", s, "dst"), ("dst", t, "src")] {
                for (idx, n) in list {
                    if !common.contains(&Family::of(n)) {
                        d.error(
                            entry_path(&format!("{p}.{field}"), *idx),
                            format!(
                                "{n} is {} but every {other} is {}; no packet could match this entry",
                                Family::of(n).name(),
                                common[0].name()
                            ),
                        );
                        ok = false;
                    }
                }
            }
        }
    }
    ok.then_some(RuleParts {
        class,
        protocol,
        family: family_by.map(|(f, _)| f),
        src,
        dst,
        src_port,
        dst_port,
        dscp,
        cgroup,
        mark,
    })
}

fn list_len(l: &Option<Vec<(Option<usize>, IpNet)>>) -> usize {
    l.as_ref().map_or(1, Vec::len)
}

/// The same-family (src, dst) pairs of a rule; `None` entries mean "any".
#[allow(clippy::type_complexity)]
fn pairs(r: &RuleParts) -> Vec<(Option<(Option<usize>, IpNet)>, Option<(Option<usize>, IpNet)>)> {
    let src: Vec<Option<(Option<usize>, IpNet)>> = match &r.src {
        Some(v) => v.iter().map(|x| Some(*x)).collect(),
        None => vec![None],
    };
    let dst: Vec<Option<(Option<usize>, IpNet)>> = match &r.dst {
        Some(v) => v.iter().map(|x| Some(*x)).collect(),
        None => vec![None],
    };
    let mut out = Vec::new();
    for s in &src {
        for t in &dst {
            if let (Some((_, a)), Some((_, b))) = (s, t)
                && Family::of(a) != Family::of(b)
            {
                continue;
            }
            out.push((*s, *t));
        }
    }
    out
}

fn rules(
    d: &mut Diag,
    raw: &[raw::Rule],
    class_names: &[&str],
    host: &dyn HostFacts,
) -> Option<Vec<RuleSpec>> {
    let parts: Vec<Option<RuleParts>> = raw
        .iter()
        .enumerate()
        .map(|(i, r)| rule_parts(d, i, r, class_names, host))
        .collect();
    if parts.iter().any(Option::is_none) {
        return None;
    }
    let parts: Vec<RuleParts> = parts.into_iter().flatten().collect();
    let counts: Vec<usize> = parts
        .iter()
        .map(|r| {
            // Counted without building: lists can be long.
            let n = |l: &Option<Vec<(Option<usize>, IpNet)>>, f: Family| {
                l.as_ref()
                    .map(|v| v.iter().filter(|(_, n)| Family::of(n) == f).count())
            };
            match (&r.src, &r.dst) {
                (Some(_), Some(_)) => {
                    n(&r.src, Family::V4).unwrap_or(0) * n(&r.dst, Family::V4).unwrap_or(0)
                        + n(&r.src, Family::V6).unwrap_or(0) * n(&r.dst, Family::V6).unwrap_or(0)
                }
                (Some(v), None) | (None, Some(v)) => v.len(),
                (None, None) => 1,
            }
        })
        .collect();
    let total: usize = counts.iter().sum();
    if total > MAX_RULES {
        let big: Vec<String> = counts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 1)
            .map(|(i, c)| {
                let r = &parts[i];
                format!(
                    "rules[{i}] -> {c} ({} src x {} dst)",
                    list_len(&r.src),
                    list_len(&r.dst)
                )
            })
            .collect();
        let m = if big.is_empty() {
            format!("{total} rules; at most {MAX_RULES} fit the table")
        } else {
            format!(
                "{total} rules after expanding the src/dst lists; at most {MAX_RULES} fit the table ({})",
                big.join(", ")
            )
        };
        d.error("spec.rules", m);
        return None;
    }
    let mut out = Vec::new();
    for (i, r) in parts.iter().enumerate() {
        for (s, t) in pairs(r) {
            let fam = r
                .family
                .or(s.map(|(_, n)| Family::of(&n)))
                .or(t.map(|(_, n)| Family::of(&n)));
            out.push(RuleSpec {
                origin: i,
                src_entry: s.and_then(|(i, _)| i),
                dst_entry: t.and_then(|(i, _)| i),
                class: r.class,
                protocol: r.protocol,
                family: fam,
                src: s.map(|(_, n)| n),
                dst: t.map(|(_, n)| n),
                src_port: r.src_port,
                dst_port: r.dst_port,
                dscp: r.dscp,
                cgroup: r.cgroup.clone(),
                mark: r.mark,
            });
        }
    }
    Some(out)
}

/// "A policy whose guaranteed rates cannot fit the link is refused with the numbers."
fn fits(d: &mut Diag, levels: &[Level], link: Option<&LinkRate>) {
    let limited: Vec<&Level> = levels.iter().filter(|l| l.rate.is_some()).collect();
    if limited.is_empty() {
        return;
    }
    let Some(link) = link else {
        d.warn(
            "spec.levels",
            "no link rate is known (spec.link_rate, an interface speed or spec.qjump.link_rate), so the level rates cannot be checked against the link",
        );
        return;
    };
    let sum: u128 = limited.iter().map(|l| u128::from(l.rate.unwrap_or(0))).sum();
    if sum > u128::from(link.rate) {
        let terms: Vec<String> = limited
            .iter()
            .map(|l| format!("{} {}", l.name, units::fmt_rate(l.rate.unwrap_or(0))))
            .collect();
        d.error(
            "spec.levels",
            format!(
                "the guaranteed rates do not fit the link: {} = {} > {} ({})",
                terms.join(" + "),
                units::fmt_rate(u64::try_from(sum).unwrap_or(u64::MAX)),
                units::fmt_rate(link.rate),
                link.source
            ),
        );
    }
}

fn cross_checks(d: &mut Diag, levels: &[Level], classes: &[Class], rules: &[RuleSpec], default_class: usize) {
    // Unused classes and levels.
    for (i, c) in classes.iter().enumerate() {
        if i != default_class && !rules.iter().any(|r| r.class == i) {
            d.warn(
                format!("spec.classes[{i}]"),
                format!(
                    "class {:?} is used by no rule and is not the default class",
                    c.name
                ),
            );
        }
    }
    for (i, l) in levels.iter().enumerate() {
        if !classes.iter().any(|c| c.level == i) {
            d.warn(
                format!("spec.levels[{i}]"),
                format!("level {:?} has no class", l.name),
            );
        }
    }
    // Settings applied by sock_ops to a class it can never select.
    for (i, c) in classes.iter().enumerate() {
        let sockops = c.flow_rate.is_some() || c.tcp.is_some();
        let mine: Vec<&RuleSpec> = rules.iter().filter(|r| r.class == i).collect();
        if sockops && i != default_class && !mine.is_empty() && mine.iter().all(|r| r.invisible_to_sockops())
        {
            let what = match (c.tcp.is_some(), c.flow_rate.is_some()) {
                (true, true) => "tcp settings and flow_rate",
                (true, false) => "tcp settings",
                _ => "flow_rate",
            };
            d.warn(
                format!("spec.classes[{i}]"),
                format!(
                    "class {:?}: its {what} are applied by sock_ops at connection start, but every rule of the class matches on dscp, cgroup or mark, which sock_ops cannot see; there its connections fall through to later rules or the default class",
                    c.name
                ),
            );
        }
    }
    // Rules after a rule that matches everything.
    if let Some(first) = rules.iter().position(RuleSpec::matches_everything) {
        let origin = rules[first].origin;
        let mut warned = Vec::new();
        for r in &rules[first + 1..] {
            if !warned.contains(&r.origin) && r.origin != origin {
                warned.push(r.origin);
                d.warn(
                    r.path(),
                    format!("is never reached: spec.rules[{origin}] matches all traffic before it"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(t: &str) -> Scalar {
        Scalar::Str(t.into())
    }

    #[test]
    fn rate_messages() {
        assert_eq!(rate(&s("10Gbit"), RATE), Ok(1_250_000_000));
        assert_eq!(
            rate(&s("10 Gbits"), RATE).unwrap_err(),
            r#""10 Gbits" is not a rate; write e.g. "10Gbit", "250Mbit", "1.5Gbit" (write the unit without the plural s: "Gbit")"#
        );
        assert_eq!(
            rate(&Scalar::Int(100), RATE).unwrap_err(),
            r#"100 has no unit; write e.g. "100Mbit" (bits/s) or "100MB/s" (bytes/s)"#
        );
        assert_eq!(
            rate(&s("20Tbit"), RATE).unwrap_err(),
            r#""20Tbit" is out of range; valid: 1kbit..=10Tbit"#
        );
        assert_eq!(
            rate(&s("100bit"), RATE).unwrap_err(),
            r#""100bit" is out of range; valid: 1kbit..=10Tbit"#
        );
        assert!(
            rate(&s("99999999999999999999999Tbit"), RATE)
                .unwrap_err()
                .contains("is too large")
        );
        assert!(rate(&s("fast"), RATE).unwrap_err().contains("units: bit, kbit"));
    }

    #[test]
    fn ports() {
        assert_eq!(port(&Scalar::Int(443)), Ok((443, 443)));
        assert_eq!(port(&s("11211")), Ok((11211, 11211)));
        assert_eq!(port(&s("8000-8100")), Ok((8000, 8100)));
        assert_eq!(port(&s(" 0 - 65535 ")), Ok((0, 65535)));
        assert_eq!(
            port(&s("9000-8000")).unwrap_err(),
            r#""9000-8000" is reversed; write "8000-9000""#
        );
        assert_eq!(
            port(&Scalar::Int(70000)).unwrap_err(),
            "70000 is out of range; valid: 0..=65535"
        );
        assert_eq!(
            port(&s("1-70000")).unwrap_err(),
            r#""1-70000" is out of range; valid: 0..=65535"#
        );
        assert!(port(&s("http")).unwrap_err().contains("is not a port"));
        assert!(port(&s("1-2-3")).is_err());
    }

    #[test]
    fn marks() {
        assert_eq!(mark(&Scalar::Int(16)), Ok((16, u32::MAX)));
        assert_eq!(mark(&s("0x10/0xff")), Ok((0x10, 0xff)));
        assert_eq!(mark(&s("16/255")), Ok((16, 255)));
        assert_eq!(mark(&s("0xFFFFFFFF")), Ok((u32::MAX, u32::MAX)));
        assert!(mark(&s("0x100000000")).unwrap_err().contains("32 bits"));
        assert!(
            mark(&s("0x110/0xff"))
                .unwrap_err()
                .contains("bits outside the mask")
        );
        assert!(mark(&s("1/0")).unwrap_err().contains("mask of 0"));
        assert!(mark(&Scalar::Int(-1)).is_err());
        assert!(mark(&s("x10")).is_err());
    }

    #[test]
    fn protocols() {
        assert_eq!(protocol(&s("tcp")), Ok(6));
        assert_eq!(protocol(&s("UDP")), Ok(17));
        assert_eq!(protocol(&s("icmpv6")), Ok(58));
        assert_eq!(protocol(&Scalar::Int(47)), Ok(47));
        assert!(protocol(&Scalar::Int(256)).is_err());
        assert!(protocol(&s("gre")).unwrap_err().contains("write tcp, udp"));
    }

    #[test]
    fn nets() {
        assert_eq!(
            net(&s("10.0.0.0/8")).unwrap(),
            ("10.0.0.0/8".parse().unwrap(), None)
        );
        assert_eq!(
            net(&s("10.1.2.3")).unwrap().0,
            "10.1.2.3/32".parse::<IpNet>().unwrap()
        );
        assert_eq!(
            net(&s("fd00::1")).unwrap().0,
            "fd00::1/128".parse::<IpNet>().unwrap()
        );
        let (n, w) = net(&s("10.1.2.3/16")).unwrap();
        assert_eq!(n, "10.1.0.0/16".parse::<IpNet>().unwrap());
        assert_eq!(
            w.unwrap(),
            r#""10.1.2.3/16" has host bits set; it matches 10.1.0.0/16"#
        );
        assert_eq!(
            net(&s("::ffff:10.0.0.0/104")).unwrap().0,
            "10.0.0.0/8".parse::<IpNet>().unwrap()
        );
        assert!(net(&s("10.0.0.0/33")).is_err());
        assert!(net(&Scalar::Int(10)).is_err());
    }

    #[test]
    fn factors() {
        assert_eq!(factor(&Scalar::Int(1)), Ok(Some(1.0)));
        assert_eq!(factor(&Scalar::Float(1.44)), Ok(Some(1.44)));
        assert_eq!(factor(&s("unlimited")), Ok(None));
        assert!(factor(&Scalar::Int(0)).unwrap_err().contains("out of range"));
        assert!(factor(&Scalar::Float(-2.0)).is_err());
        assert!(factor(&s("1.44")).unwrap_err().contains("is not a factor"));
    }

    #[test]
    fn names() {
        assert!(check_name("memcached-1.a_b").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("has space").unwrap_err().contains("letters, digits"));
        assert!(check_name(&"x".repeat(65)).is_err());
    }
}
