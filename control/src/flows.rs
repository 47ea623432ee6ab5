//! `paceline flows`: the flows the agent paces, as rows, from two places:
//!
//! - the per-flow table (`PL_FLOWS`, an LRU hash of `FlowKey -> FlowState`): every flow without
//!   a local TCP or connected UDP socket from its second packet on (unconnected UDP, forwarded
//!   traffic; a flow of a single
//!   packet is not listed; its class cached for its later packets, its
//!   clock kept only with fq): the 5-tuple, the class (see below), the rate the flow's clock
//!   runs at (a D3 grant overrides the class's `flow_rate`), its next departure relative to now
//!   (positive: the clock runs ahead, packets wait; negative: idle that long); the table keeps
//!   no byte count;
//! - this host's established TCP connections and connected UDP sockets
//!   ([`crate::kernel::sockdiag`]): such a socket keeps its class and clock in socket storage,
//!   not in the table; TCP rows carry the bytes sent and the pacing rate the kernel applies, and
//!   no row a departure.
//!
//! Served by the agent at `/flows?top=N&class=C`.
//!
//! A table row's class is the one the datapath cached for the flow under the policy in force;
//! for an entry not yet seen under it (and for socket rows), what the 5-tuple alone selects:
//! rules on DSCP, socket mark or cgroup cannot be evaluated from the 5-tuple, and are skipped.

use std::net::IpAddr;

use paceline_common::{
    classify::{PacketInfo, UNKNOWN_CGROUP, UNKNOWN_DSCP, UNKNOWN_MARK, first_match},
    maps::{FlowKey, FlowState},
};
use serde::{Deserialize, Serialize};

use paceline_policy::{Compiled, protocols, units::fmt_rate};

/// One flow.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlowRow {
    pub proto: String,
    pub src: String,
    pub dst: String,
    pub class: String,
    /// Bytes/s of the flow's clock; `None`: the flow is not paced.
    pub rate_bytes_per_second: Option<u64>,
    /// The rate is a D3 grant (not the class's flow rate).
    pub d3_grant: bool,
    /// Next departure minus now, seconds (flow table rows).
    pub next_departure_seconds: Option<f64>,
    /// Bytes sent (socket rows).
    pub bytes: Option<u64>,
    /// Which limit held the flow's last paced packet: `flow`, `class` or `level` (its clock),
    /// `not-held` (clocks apply, none held it); absent: no packet of it paced yet (or a socket
    /// whose storage the agent could not read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<String>,
    /// `table` (PL_FLOWS) or `socket` (a local TCP connection or connected UDP socket).
    pub source: String,
}

/// The flows document of `/flows`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Flows {
    /// Entries in the flow table.
    pub total: usize,
    /// Local established TCP connections and connected UDP sockets (rows of their own).
    #[serde(default)]
    pub sockets: usize,
    /// The table's capacity.
    pub capacity: u32,
    /// Whether the policy in force enters flows without a local socket in the table
    /// (`TABLE_UNTRACKED_FLOWS` clear); when it does not, no table row is listed.
    #[serde(default = "tracked_by_default")]
    pub tracked: bool,
    /// Whether flows without a local socket whose class keeps nothing per flow stay out of the
    /// table (`TABLE_UNTRACKED_CLASSES`): then only the classes with flow clocks are listed.
    #[serde(default)]
    pub untracked_classes: bool,
    pub flows: Vec<FlowRow>,
}

/// An agent from before `spec.track_flows` tracked every flow.
fn tracked_by_default() -> bool {
    true
}

fn addr(w: [u32; 4]) -> IpAddr {
    let mut b = [0u8; 16];
    for (i, x) in w.iter().enumerate() {
        b[i * 4..i * 4 + 4].copy_from_slice(&x.to_ne_bytes());
    }
    let v6 = std::net::Ipv6Addr::from(b);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

fn endpoint(ip: IpAddr, port: u16, has_ports: bool) -> String {
    match (ip, has_ports) {
        (IpAddr::V6(v), true) => format!("[{v}]:{port}"),
        (ip, true) => format!("{ip}:{port}"),
        (ip, false) => ip.to_string(),
    }
}

/// The name of a flow's `binding` byte (`FlowState::binding`, `SockState::binding`); `None`
/// for 0 (no packet paced yet).
pub fn binding_of(b: u8) -> Option<String> {
    (b != paceline_common::trace::binding::NONE).then(|| paceline_common::trace::binding_name(b).to_string())
}

/// The class a 5-tuple selects (rules on DSCP, mark or cgroup skipped).
pub fn class_of<'a>(c: &'a Compiled, k: &FlowKey) -> Option<&'a paceline_policy::ClassInfo> {
    let p = PacketInfo {
        src: k.src,
        dst: k.dst,
        sport: k.sport,
        dport: k.dport,
        proto: k.proto,
        is_v6: matches!(addr(k.src), IpAddr::V6(_)) as u8,
        unknown: UNKNOWN_DSCP | UNKNOWN_CGROUP | UNKNOWN_MARK,
        ..Default::default()
    };
    let class_index = first_match(&c.rule_table, &p).map_or(c.default_class, |i| c.rule_table[i].class);
    c.classes.iter().find(|k| k.index == class_index)
}

/// The flow key of a socket's 5-tuple of protocol `proto` (addresses as the datapath keeps
/// them).
pub fn socket_key(proto: u8, src: IpAddr, sport: u16, dst: IpAddr, dport: u16) -> FlowKey {
    FlowKey {
        src: crate::classify::words(src),
        dst: crate::classify::words(dst),
        sport,
        dport,
        proto,
        _pad: [0; 3],
    }
}

/// Where a table row's class and clock come from: the policy in force, the datapath
/// generation it was written as, and whether the datapath keeps flow clocks (only where fq
/// enforces them; elsewhere an entry holds the flow's class alone).
#[derive(Clone, Copy)]
pub struct TableView<'a> {
    pub compiled: &'a Compiled,
    pub generation: u64,
    pub clocks: bool,
}

/// The row of one table entry; `now_ns`: CLOCK_MONOTONIC now. The class is the one the
/// datapath cached for the flow under the policy in force (its answer, DSCP, mark and cgroup
/// included), else what the 5-tuple selects; without flow clocks the row has no rate and no
/// departure.
pub fn row(view: TableView<'_>, k: &FlowKey, s: &FlowState, now_ns: u64) -> FlowRow {
    let (c, generation) = (view.compiled, view.generation);
    let cached = s
        .class_under(generation)
        .and_then(|i| c.classes.iter().find(|k| u32::from(k.index) == i));
    let class = cached.or_else(|| class_of(c, k));
    let ports = protocols::has_ports(k.proto);
    let (rate, grant) = if !view.clocks {
        (None, false)
    } else if s.rate_override != 0 {
        (Some(s.rate_override), true)
    } else {
        (class.and_then(|k| k.flow_rate), false)
    };
    FlowRow {
        proto: protocols::name(k.proto)
            .map(String::from)
            .unwrap_or_else(|| k.proto.to_string()),
        src: endpoint(addr(k.src), k.sport, ports),
        dst: endpoint(addr(k.dst), k.dport, ports),
        class: class.map(|k| k.name.clone()).unwrap_or_else(|| "?".into()),
        rate_bytes_per_second: rate,
        d3_grant: grant,
        next_departure_seconds: view
            .clocks
            .then_some((s.t_next as i128 - now_ns as i128) as f64 * 1e-9),
        bytes: None,
        binding: binding_of(s.binding),
        source: "table".into(),
    }
}

/// Picks and orders rows: those of `class` (if given); table rows furthest-ahead departure
/// first (the flows pacing holds back most), then socket rows by bytes; at most `top`.
pub fn select(mut rows: Vec<FlowRow>, class: Option<&str>, top: usize) -> Vec<FlowRow> {
    if let Some(c) = class {
        rows.retain(|r| r.class == c);
    }
    rows.sort_by(
        |a, b| match (a.next_departure_seconds, b.next_departure_seconds) {
            (Some(x), Some(y)) => y.total_cmp(&x),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => b.bytes.cmp(&a.bytes),
        },
    );
    rows.truncate(top);
    rows
}

/// CLOCK_MONOTONIC now, ns (the datapath's clock).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn secs(s: f64) -> String {
    let a = s.abs();
    let v = if a >= 1.0 {
        format!("{a:.2}s")
    } else if a >= 1e-3 {
        format!("{:.2}ms", a * 1e3)
    } else {
        format!("{:.0}us", a * 1e6)
    };
    if s < 0.0 { format!("-{v}") } else { format!("+{v}") }
}

/// The table as `paceline flows` prints it.
pub fn render(f: &Flows) -> String {
    let mut o = if f.tracked {
        format!(
            "{} flows in the flow table (capacity {}){}, {} local sockets; showing {}\n",
            f.total,
            f.capacity,
            if f.untracked_classes {
                " of classes with a flow clock (the others' flows without a local socket are not \
                 tracked; spec.track_flows: all tracks them)"
            } else {
                ""
            },
            f.sockets,
            f.flows.len()
        )
    } else {
        format!(
            "flows without a local socket are not tracked: no class keeps anything per flow \
             (spec.track_flows: all tracks them); {} local sockets; showing {}\n",
            f.sockets,
            f.flows.len()
        )
    };
    o.push_str(&format!(
        "{:<5} {:<44} {:<44} {:<14} {:>14} {:>10} {:>12} {:<8}\n",
        "PROTO", "SOURCE", "DESTINATION", "CLASS", "RATE", "NEXT", "BYTES", "HELD BY"
    ));
    for r in &f.flows {
        let rate = match r.rate_bytes_per_second {
            Some(b) => format!("{}{}", fmt_rate(b), if r.d3_grant { "*" } else { "" }),
            None => "-".into(),
        };
        o.push_str(&format!(
            "{:<5} {:<44} {:<44} {:<14} {:>14} {:>10} {:>12} {:<8}\n",
            r.proto,
            r.src,
            r.dst,
            r.class,
            rate,
            r.next_departure_seconds.map_or("-".into(), secs),
            r.bytes.map_or("-".into(), |b| b.to_string()),
            r.binding.as_deref().unwrap_or("-")
        ));
    }
    if f.flows.iter().any(|r| r.d3_grant) {
        o.push_str("* a D3 grant\n");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use paceline_common::maps::v4_mapped;
    use paceline_policy::testing::{fake_host, ok};
    use paceline_policy::{CompileContext, EnforcementMode, compile};

    #[test]
    fn rows_name_the_class_rate_and_departure() {
        let text = r#"
apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [eth0]
  levels: [{name: lo, priority: 0}]
  classes: [{name: web, level: lo, flow_rate: 8Mbit}, {name: other, level: lo}]
  rules: [{class: web, protocol: tcp, dst_port: 443}]
  default_class: other
"#;
        let c = compile(
            &ok(text, &fake_host()),
            &CompileContext {
                mode: EnforcementMode::Fq,
                previous: None,
                all_routes_managed: false,
            },
        )
        .unwrap();
        let key = FlowKey {
            src: v4_mapped(u32::from_ne_bytes([10, 0, 0, 1])),
            dst: v4_mapped(u32::from_ne_bytes([10, 0, 0, 2])),
            sport: 40000,
            dport: 443,
            proto: 6,
            _pad: [0; 3],
        };
        let view = TableView {
            compiled: &c,
            generation: 3,
            clocks: true,
        };
        let r = row(
            view,
            &key,
            &FlowState {
                t_next: 1_002_000_000,
                binding: paceline_common::trace::binding::CLASS,
                ..FlowState::default()
            },
            1_000_000_000,
        );
        assert_eq!(r.binding.as_deref(), Some("class"));
        assert_eq!(
            (r.src.as_str(), r.dst.as_str(), r.class.as_str()),
            ("10.0.0.1:40000", "10.0.0.2:443", "web")
        );
        assert_eq!(r.rate_bytes_per_second, Some(1_000_000));
        assert!((r.next_departure_seconds.unwrap() - 0.002).abs() < 1e-9);
        let other = FlowKey { dport: 80, ..key };
        let o = row(
            view,
            &other,
            &FlowState {
                rate_override: 5,
                ..FlowState::default()
            },
            1_000_000_000,
        );
        assert_eq!(o.class, "other");
        assert_eq!(o.binding, None, "no packet of it paced yet");
        // The class the datapath cached under the policy in force wins over the 5-tuple's (a
        // DSCP or mark rule may have chosen it); a class cached under another policy does not.
        let web = c.classes.iter().find(|k| k.name == "web").unwrap().index;
        let cached = FlowState {
            class_gen: FlowState::class_gen(3, web.into()),
            ..FlowState::default()
        };
        assert_eq!(row(view, &other, &cached, 0).class, "web");
        let next = TableView {
            generation: 4,
            ..view
        };
        assert_eq!(row(next, &other, &cached, 0).class, "other");
        // Without flow clocks (no fq) an entry holds the class alone.
        let classes_only = TableView {
            clocks: false,
            ..view
        };
        let n = row(classes_only, &key, &cached, 0);
        assert_eq!(
            (
                n.class.as_str(),
                n.rate_bytes_per_second,
                n.next_departure_seconds
            ),
            ("web", None, None)
        );
        assert!(o.d3_grant && o.next_departure_seconds.unwrap() < 0.0);
        let sock = FlowRow {
            source: "socket".into(),
            next_departure_seconds: None,
            bytes: Some(100),
            ..r.clone()
        };
        let picked = select(vec![sock.clone(), o.clone(), r.clone()], None, 2);
        assert_eq!(
            picked,
            [r.clone(), o.clone()],
            "table rows first, furthest ahead first"
        );
        assert_eq!(select(vec![sock.clone(), o.clone()], None, 3)[1], sock);
        assert_eq!(select(vec![o, r], Some("other"), 10).len(), 1);
        let mut flows = Flows {
            total: 2,
            capacity: 65536,
            sockets: 0,
            tracked: true,
            untracked_classes: false,
            flows: picked,
        };
        let text = render(&flows);
        assert!(
            text.contains("10.0.0.2:443") && text.contains("+2.00ms"),
            "{text}"
        );
        assert!(!text.contains("not tracked"), "{text}");
        // Under a policy whose classes without a flow clock keep their flows out, the header
        // says so (and how to list them all).
        flows.untracked_classes = true;
        let text = render(&flows);
        assert!(
            text.contains("of classes with a flow clock") && text.contains("spec.track_flows: all"),
            "{text}"
        );
        // An agent from before `untracked_classes` sends no such field: every flow tracked.
        let old: Flows = serde_json::from_str(r#"{"total": 0, "capacity": 1, "flows": []}"#).unwrap();
        assert!(old.tracked && !old.untracked_classes);
    }
}
