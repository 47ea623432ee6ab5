//! `paceline flows`: the per-flow table (`PL_FLOWS`, an LRU hash of `FlowKey -> FlowState`) as
//! rows: the 5-tuple, the class its 5-tuple selects under the policy in force, the rate the
//! flow's clock runs at (a D3 grant overrides the class's `flow_rate`), its next departure
//! relative to now (positive: the clock runs ahead, packets wait; negative: idle that long),
//! and bytes sent where the kernel's TCP socket for the tuple is found (the flow table keeps
//! no byte count; UDP flows show none). Served by the agent at `/flows?top=N&class=C`.
//!
//! The class is what the 5-tuple alone selects: rules on DSCP, socket mark or cgroup cannot be
//! evaluated from the flow table, and are skipped.

use std::net::IpAddr;

use paceline_common::{
    classify::{PacketInfo, UNKNOWN_CGROUP, UNKNOWN_DSCP, UNKNOWN_MARK, first_match},
    maps::{FlowKey, FlowState},
};
use serde::{Deserialize, Serialize};

use crate::policy::{Compiled, protocols, units::fmt_rate};

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
    /// Next departure minus now, seconds.
    pub next_departure_seconds: f64,
    /// Bytes the local TCP socket of this tuple sent, when there is one.
    pub bytes: Option<u64>,
}

/// The flows document of `/flows`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Flows {
    /// Entries in the table.
    pub total: usize,
    /// The table's capacity.
    pub capacity: u32,
    pub flows: Vec<FlowRow>,
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

/// The row of one table entry; `now_ns`: CLOCK_MONOTONIC now.
pub fn row(c: &Compiled, k: &FlowKey, s: &FlowState, now_ns: u64) -> FlowRow {
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
    let class = c.classes.iter().find(|k| k.index == class_index);
    let ports = protocols::has_ports(k.proto);
    let (rate, grant) = if s.rate_override != 0 {
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
        next_departure_seconds: (s.t_next as i128 - now_ns as i128) as f64 * 1e-9,
        bytes: None,
    }
}

/// Picks and orders rows: those of `class` (if given), furthest-ahead departure first (the
/// flows pacing holds back most), at most `top`.
pub fn select(mut rows: Vec<FlowRow>, class: Option<&str>, top: usize) -> Vec<FlowRow> {
    if let Some(c) = class {
        rows.retain(|r| r.class == c);
    }
    rows.sort_by(|a, b| b.next_departure_seconds.total_cmp(&a.next_departure_seconds));
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
    let mut o = format!(
        "{} flows in the table (capacity {}); showing {}\n",
        f.total,
        f.capacity,
        f.flows.len()
    );
    o.push_str(&format!(
        "{:<5} {:<44} {:<44} {:<14} {:>14} {:>10} {:>12}\n",
        "PROTO", "SOURCE", "DESTINATION", "CLASS", "RATE", "NEXT", "BYTES"
    ));
    for r in &f.flows {
        let rate = match r.rate_bytes_per_second {
            Some(b) => format!("{}{}", fmt_rate(b), if r.d3_grant { "*" } else { "" }),
            None => "-".into(),
        };
        o.push_str(&format!(
            "{:<5} {:<44} {:<44} {:<14} {:>14} {:>10} {:>12}\n",
            r.proto,
            r.src,
            r.dst,
            r.class,
            rate,
            secs(r.next_departure_seconds),
            r.bytes.map_or("-".into(), |b| b.to_string())
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
    use crate::policy::tests::{fake_host, ok};
    use crate::policy::{CompileContext, EnforcementMode, compile};
    use paceline_common::maps::v4_mapped;

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
        let r = row(
            &c,
            &key,
            &FlowState {
                t_next: 1_002_000_000,
                rate_override: 0,
            },
            1_000_000_000,
        );
        assert_eq!(
            (r.src.as_str(), r.dst.as_str(), r.class.as_str()),
            ("10.0.0.1:40000", "10.0.0.2:443", "web")
        );
        assert_eq!(r.rate_bytes_per_second, Some(1_000_000));
        assert!((r.next_departure_seconds - 0.002).abs() < 1e-9);
        let other = FlowKey { dport: 80, ..key };
        let o = row(
            &c,
            &other,
            &FlowState {
                t_next: 0,
                rate_override: 5,
            },
            1_000_000_000,
        );
        assert_eq!(o.class, "other");
        assert!(o.d3_grant && o.next_departure_seconds < 0.0);
        let picked = select(vec![o.clone(), r.clone()], None, 1);
        assert_eq!(picked, std::slice::from_ref(&r), "furthest ahead first");
        assert_eq!(select(vec![o, r], Some("other"), 10).len(), 1);
        let text = render(&Flows {
            total: 2,
            capacity: 65536,
            flows: picked,
        });
        assert!(
            text.contains("10.0.0.2:443") && text.contains("+2.00ms"),
            "{text}"
        );
    }
}
