//! The benchmark's policies, frames and rows: what `plbench datapath` measures (its
//! [`super::datapath`] runs them and reports).

use std::sync::Arc;

use paceline_common::{
    classify::Rule,
    maps::{CLASS_SET_PRIORITY, ClassConfig, LEVEL_SET_DSCP, LevelConfig, PolicyTable},
};
use paceline_policy::ctab::{self, Image};
use paceline_tests::{
    packet::{self, L4},
    policygen::{self, tenant_v4, tenant_v6},
};

use super::{Case, Prog, UNSTAMPED_MARK};

/// A policy table, its rules (first match wins) and their compiled classifier.
#[derive(Clone)]
pub(crate) struct Policy {
    pub(crate) table: PolicyTable,
    pub(crate) image: Arc<Image>,
}

impl Policy {
    pub(crate) fn new(table: PolicyTable, rules: &[Rule]) -> Policy {
        Policy {
            table,
            image: Arc::new(ctab::build(rules).expect("the benchmark's rules compile")),
        }
    }
}

/// A policy whose one class does what the reference does: one aggregate clock per class (no
/// per-flow clock, no level rate, no DSCP or priority), the class every bench rule matches;
/// its flows without a local socket are not tracked in the flow table.
pub(crate) fn table_one_clock() -> PolicyTable {
    let mut t = table(false);
    for c in 0..9usize {
        t.classes[c].flags = 0;
        if c > 0 {
            t.classes[c].class_rate = 10_000_000_000; // 80 Gbit/s
        }
    }
    // As the compiler flags such a policy (`spec.track_flows: auto`): its flows without a
    // local socket stay out of the flow table.
    assert!(t.keeps_nothing_per_flow());
    t.flags |= paceline_common::maps::TABLE_UNTRACKED_FLOWS;
    t
}

/// [`table`]`(true)` with class 1 (the benchmark's port 11211) without its flow clock while the
/// other classes keep theirs; `untracked`: as the compiler flags it under `spec.track_flows:
/// auto` (class 1's flows stay out of the flow table once classified).
pub(crate) fn table_mixed(untracked: bool) -> PolicyTable {
    let mut t = table(true);
    t.classes[1].flow_rate = 0;
    assert!(t.class_keeps_nothing_per_flow(1) && !t.keeps_nothing_per_flow());
    if untracked {
        t.flags |= paceline_common::maps::TABLE_UNTRACKED_CLASSES;
    }
    t
}

/// Classes 1..=8 at level 0 (every class the bench rules use), class 0 the default at level 1.
/// `paced`: every class has a per-flow and a class clock and level 0 a rate and a DSCP at rates
/// the benchmark's packet rate does not exceed (the measured path is the send path, not the
/// horizon drop); otherwise classify and set the priority only.
pub(crate) fn table(paced: bool) -> PolicyTable {
    let mut t = PolicyTable::empty();
    t.n_classes = 9;
    for c in 0..9usize {
        t.classes[c] = ClassConfig {
            level: u32::from(c == 0),
            skb_priority: 7 - u32::from(c == 0),
            flags: CLASS_SET_PRIORITY,
            ..ClassConfig::zeroed()
        };
        if paced && c > 0 {
            t.classes[c].flow_rate = 5_000_000_000; // 40 Gbit/s
            t.classes[c].class_rate = 10_000_000_000; // 80 Gbit/s
        }
    }
    if paced {
        t.levels[0] = LevelConfig {
            rate: 12_500_000_000,
            flags: LEVEL_SET_DSCP,
            dscp: 46,
            pcp: 0,
            _pad: [0; 2],
            ..LevelConfig::zeroed()
        };
        t.levels[1] = LevelConfig {
            rate: 0,
            flags: LEVEL_SET_DSCP,
            dscp: 26,
            pcp: 0,
            _pad: [0; 2],
            ..LevelConfig::zeroed()
        };
    }
    t
}

/// The shipped memcached/web/bulk example's shape: four port rules, the matching one first.
pub(crate) fn port_rules() -> Vec<Rule> {
    vec![
        Rule::any(1).with_proto(6).with_dport(11211, 11211),
        Rule::any(1).with_proto(17).with_dport(11211, 11211),
        Rule::any(2).with_proto(6).with_dport(80, 80),
        Rule::any(2).with_proto(6).with_dport(443, 443),
    ]
}

fn tcp4_to(dst: [u8; 4], dscp: u8, vlan: Option<(u16, u8)>) -> Vec<u8> {
    let l4 = L4::Tcp {
        sport: 40000,
        dport: 11211,
    };
    packet::ipv4([10, 0, 0, 1], dst, l4, dscp, 0, &[], vlan, 64)
}

fn tcp6_to(dst: [u8; 16]) -> Vec<u8> {
    let src = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    let l4 = L4::Tcp {
        sport: 40000,
        dport: 11211,
    };
    packet::ipv6(src, dst, l4, 0, 0, false, 64)
}

/// Every row at up to `max_rules` rules, and the policies they name by index.
pub(crate) fn cases(max_rules: u32) -> (Vec<Policy>, Vec<Case>) {
    let tcp4 = tcp4_to([10, 0, 0, 2], 0, None);
    let udp4 = packet::ipv4(
        [10, 0, 0, 1],
        [10, 0, 0, 2],
        L4::Udp {
            sport: 40000,
            dport: 11211,
        },
        0,
        0,
        &[],
        None,
        64,
    );
    let udp6 = packet::ipv6(
        [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
        L4::Udp {
            sport: 40000,
            dport: 11211,
        },
        0,
        0,
        false,
        64,
    );
    // TCP stamps its segments with its EDT departure, taken microseconds earlier.
    let tcp_ts = paceline_tests::skb::mono_now_ns();
    let mut policies: Vec<Policy> = vec![
        Policy::new(table(true), &port_rules()),
        Policy::new(table(false), &port_rules()),
        Policy::new(table_one_clock(), &port_rules()),
        Policy::new(table_mixed(false), &port_rules()),
        Policy::new(table_mixed(true), &port_rules()),
    ];
    let (full4, classify4, one4, mixed_tracked, mixed) = (0, 1, 2, 3, 4);
    let case = |name: &str, prog, policy, frame: &[u8], ts| Case {
        name: name.into(),
        prog,
        policy,
        frame: frame.to_vec(),
        ts,
        mark: if ts == 0 { UNSTAMPED_MARK } else { 0 },
        pair: None,
    };
    let mut cases = vec![
        case(
            "floor: empty classifier, IPv4/TCP frame",
            Prog::Floor,
            full4,
            &tcp4,
            0,
        ),
        case(
            "clock: a classifier that only calls bpf_ktime_get_ns",
            Prog::Clock,
            full4,
            &tcp4,
            0,
        ),
        Case {
            mark: 1,
            ..case(
                "reference: Cilium's EDT per packet (hash lookup, clock, departure, tstamp)",
                Prog::Reference,
                full4,
                &tcp4,
                tcp_ts,
            )
        },
        case(
            "IPv4/TCP full: classify, flow+class+level EDT, DSCP, priority",
            Prog::Full,
            full4,
            &tcp4,
            tcp_ts,
        ),
        case(
            "IPv4/TCP full, later packets without a local socket (flow table: forwarded, a container's)",
            Prog::Table,
            full4,
            &tcp4,
            tcp_ts,
        ),
        case(
            "IPv4/UDP full, a flow's later packets (class and flow clock in the flow table)",
            Prog::Table,
            full4,
            &udp4,
            0,
        ),
        case(
            "IPv4/UDP full, a flow's later packets, tracing not built in (what tracing off costs: the row above less this)",
            Prog::NoTrace,
            full4,
            &udp4,
            0,
        ),
        case(
            "IPv4/UDP later packets, a trace running for another class (tail call, filter)",
            Prog::TraceFiltered,
            full4,
            &udp4,
            0,
        ),
        case(
            "IPv4/UDP later packets, a trace recording 1 packet in 1,000",
            Prog::TraceSampled,
            full4,
            &udp4,
            0,
        ),
        case(
            "IPv4/UDP later packets, a trace recording every packet",
            Prog::TraceEvery,
            full4,
            &udp4,
            0,
        ),
        case(
            "IPv4/UDP full path: a flow's second packet (classified, entered in the flow table)",
            Prog::Full,
            full4,
            &udp4,
            0,
        ),
        case(
            "IPv4/UDP full path: a new flow's first packet (classified, its clock left in an admission slot)",
            Prog::NewFlow,
            full4,
            &udp4,
            0,
        ),
        case(
            "IPv4/UDP full path: a new flow's first packet, the flow table full of other flows",
            Prog::NewFlowFullTable,
            full4,
            &udp4,
            0,
        ),
        // A class without a flow clock under a policy whose other classes keep them in the
        // flow table: tracked (`spec.track_flows: all`), against left out once classified
        // (`auto`: the class memo).
        case(
            "IPv4/UDP a class without a flow clock beside classes with one: a new flow's first packet, tracked (admission slot)",
            Prog::NewFlow,
            mixed_tracked,
            &udp4,
            0,
        ),
        case(
            "IPv4/UDP a class without a flow clock beside classes with one: a new flow's first packet, untracked (class memo)",
            Prog::NewFlow,
            mixed,
            &udp4,
            0,
        ),
        case(
            "IPv4/UDP a class without a flow clock beside classes with one: a flow's second packet, tracked (entered in the table)",
            Prog::Full,
            mixed_tracked,
            &udp4,
            0,
        ),
        case(
            "IPv4/UDP a class without a flow clock beside classes with one: a flow's second packet, untracked (class memo)",
            Prog::Full,
            mixed,
            &udp4,
            0,
        ),
        case(
            "IPv4/TCP full, a TCP flow's later packets (class and flow clock in the socket)",
            Prog::Cached,
            full4,
            &tcp4,
            tcp_ts,
        ),
        // Like for like: the reference's work (one aggregate clock) on each of paceline's paths.
        case(
            "IPv4/UDP one class clock (what the reference does): a flow's later packets (class memo)",
            Prog::Table,
            one4,
            &udp4,
            0,
        ),
        case(
            "IPv6/UDP one class clock (what the reference does): a flow's later packets (class memo)",
            Prog::Table,
            one4,
            &udp6,
            0,
        ),
        case(
            "IPv4/TCP one class clock (what the reference does): later packets (socket)",
            Prog::Cached,
            one4,
            &tcp4,
            tcp_ts,
        ),
        case(
            "IPv4/UDP one class clock (what the reference does): a new flow's first packet",
            Prog::NewFlow,
            one4,
            &udp4,
            0,
        ),
        case(
            "IPv4/TCP full, later packets, DSCP already set by the socket",
            Prog::Cached,
            full4,
            &tcp4_to([10, 0, 0, 2], 46, None),
            tcp_ts,
        ),
        case(
            "IPv4/TCP full path, DSCP already set by the socket",
            Prog::Full,
            full4,
            &tcp4_to([10, 0, 0, 2], 46, None),
            tcp_ts,
        ),
        case(
            "IPv4/TCP in 802.1Q, full path",
            Prog::Full,
            full4,
            &tcp4_to([10, 0, 0, 2], 0, Some((100, 0))),
            tcp_ts,
        ),
        case(
            "IPv4/TCP full path, no stack timestamp (reads the clock)",
            Prog::Full,
            full4,
            &tcp4,
            0,
        ),
        case(
            "IPv4/TCP classify + priority only (no pacing, no rewrite)",
            Prog::Full,
            classify4,
            &tcp4,
            tcp_ts,
        ),
        case(
            "non-IP frame (ARP): parse, count, pass",
            Prog::Full,
            classify4,
            &arp(),
            0,
        ),
        case(
            "IPv4/TCP count-only build (parse, classify, count)",
            Prog::CountOnly,
            full4,
            &tcp4,
            tcp_ts,
        ),
    ];
    // Two CPUs at once, each sending one TCP flow's later packets without a local socket
    // (forwarded traffic: their class from the CPU's class memo), one class clock each: both flows in one class (one
    // clock, truly shared: the price of exact aggregates), in two neighbouring classes (1 and
    // 2) and in two classes apart (1 and 64). TCP packets with a stack timestamp, so that no
    // clock is read: a virtual machine's clock read may itself be shared by all CPUs (the
    // pvclock's last value, advanced with an atomic when the TSC is not stable).
    let pair4 = policies.len();
    let mut apart = table_one_clock();
    apart.n_classes = 65;
    apart.classes[64] = apart.classes[1];
    policies.push(Policy::new(
        apart,
        &[
            Rule::any(1).with_proto(6).with_dport(11211, 11211),
            Rule::any(2).with_proto(6).with_dport(11212, 11212),
            Rule::any(64).with_proto(6).with_dport(11218, 11218),
        ],
    ));
    let tcp_to = |sport: u16, dport: u16| {
        packet::ipv4(
            [10, 0, 0, 1],
            [10, 0, 0, 2],
            L4::Tcp { sport, dport },
            0,
            0,
            &[],
            None,
            64,
        )
    };
    cases.push(Case {
        pair: Some(tcp_to(40001, 11211)),
        ..case(
            "floor: empty classifier, two CPUs at once",
            Prog::Floor,
            pair4,
            &tcp_to(40000, 11211),
            tcp_ts,
        )
    });
    let rows = [
        ("one CPU: class 1 alone", None),
        (
            "two CPUs at once: two flows of class 1 (one clock)",
            Some(tcp_to(40001, 11211)),
        ),
        (
            "two CPUs at once: classes 1 and 2 (neighbouring clocks)",
            Some(tcp_to(40001, 11212)),
        ),
        (
            "two CPUs at once: classes 1 and 64 (clocks 504 bytes apart)",
            Some(tcp_to(40001, 11218)),
        ),
    ];
    let stamped = rows.iter().map(|r| (r, "", tcp_ts));
    // Then the first two without a stack timestamp (as forwarded traffic or UDP: the clock is
    // read on every packet, as the reference reads it): alone, and one class on two CPUs.
    let unstamped = rows[..2]
        .iter()
        .map(|r| (r, " or a stack timestamp (reads the clock)", 0));
    for ((name, other), how, ts) in stamped.chain(unstamped) {
        cases.push(Case {
            pair: other.clone(),
            ..case(
                &format!(
                    "IPv4/TCP one class clock, later packets without a local socket{how} (class memo), {name}"
                ),
                Prog::Table,
                pair4,
                &tcp_to(40000, 11211),
                ts,
            )
        });
    }
    // The reference on two CPUs at once, both packets of one aggregate (its departure clock
    // written by both, without an atomic): what sharing an aggregate costs Cilium's algorithm,
    // beside paceline's one shared class clock above. It reads the clock on every packet, and
    // two CPUs reading it at once may contend (see above): the clock's own row on two CPUs says
    // how much of the reference's row that is.
    cases.push(Case {
        pair: Some(tcp_to(40001, 11211)),
        ..case(
            "clock: a classifier that only calls bpf_ktime_get_ns, two CPUs at once",
            Prog::Clock,
            pair4,
            &tcp_to(40000, 11211),
            tcp_ts,
        )
    });
    cases.push(Case {
        mark: 1,
        pair: Some(tcp_to(40001, 11211)),
        ..case(
            "reference, two CPUs at once: two flows of one aggregate (one departure clock)",
            Prog::Reference,
            pair4,
            &tcp_to(40000, 11211),
            tcp_ts,
        )
    });
    // The scale rows: n rules of `tcp dst <address> dst_port 11211` (IPv4 /32, IPv6 /64), a
    // packet to the last rule's address and one to none. "Classify only" is a policy without
    // pacing or rewrites, on a new flow's first packet: classification's cost against the rule
    // count, without the flow table's insert (a flow's second packet) blurring it.
    for n in [1u32, 64, 1_000, 10_000, 100_000]
        .into_iter()
        .filter(|n| *n <= max_rules)
    {
        let last4 = tenant_v4(n - 1);
        let mut last6 = tenant_v6(n - 1);
        last6[15] = 1;
        let none6 = [0x20, 1, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let p4 = policies.len();
        policies.push(Policy::new(table(false), &policygen::bench_rules(n, false)));
        let p6 = policies.len();
        policies.push(Policy::new(table(false), &policygen::bench_rules(n, true)));
        let pf = policies.len();
        policies.push(Policy::new(table(true), &policygen::bench_rules(n, false)));
        let (o4, o6) = (policies.len(), policies.len() + 1);
        policies.push(Policy::new(table_one_clock(), &policygen::bench_rules(n, false)));
        policies.push(Policy::new(table_one_clock(), &policygen::bench_rules(n, true)));
        // Like for like with the reference at this rule count: its work (one class clock, the
        // clock read: no stack timestamp), on a new flow's first packet.
        cases.push(case(
            &format!("IPv4/TCP one class clock, {n} rules, the last matches, no stack timestamp: a new flow's first packet"),
            Prog::NewFlow,
            o4,
            &tcp4_to(last4, 0, None),
            0,
        ));
        cases.push(case(
            &format!("IPv6/TCP one class clock, {n} rules, the last matches, no stack timestamp: a new flow's first packet"),
            Prog::NewFlow,
            o6,
            &tcp6_to(last6),
            0,
        ));
        cases.push(case(
            &format!("classify only, IPv4, {n} rules, the last matches (a new flow's first packet)"),
            Prog::NewFlow,
            p4,
            &tcp4_to(last4, 0, None),
            tcp_ts,
        ));
        cases.push(case(
            &format!("classify only, IPv4, {n} rules, none matches (a new flow's first packet)"),
            Prog::NewFlow,
            p4,
            &tcp4_to([192, 0, 2, 1], 0, None),
            tcp_ts,
        ));
        cases.push(case(
            &format!("classify only, IPv6, {n} rules, the last matches (a new flow's first packet)"),
            Prog::NewFlow,
            p6,
            &tcp6_to(last6),
            tcp_ts,
        ));
        cases.push(case(
            &format!("classify only, IPv6, {n} rules, none matches (a new flow's first packet)"),
            Prog::NewFlow,
            p6,
            &tcp6_to(none6),
            tcp_ts,
        ));
        cases.push(case(
            &format!("IPv4/TCP full path, {n} rules, the last matches: second packet (entered in the table)"),
            Prog::Full,
            pf,
            &tcp4_to(last4, 0, None),
            tcp_ts,
        ));
        cases.push(case(
            &format!("IPv4/TCP full path, {n} rules, the last matches: a new flow's first packet"),
            Prog::NewFlow,
            pf,
            &tcp4_to(last4, 0, None),
            tcp_ts,
        ));
        cases.push(case(
            &format!("IPv4/TCP full path, {n} rules, the last matches: later packets"),
            Prog::Cached,
            pf,
            &tcp4_to(last4, 0, None),
            tcp_ts,
        ));
        cases.push(case(
            &format!("IPv4/TCP full path, {n} rules, the last matches: later packets, no local socket"),
            Prog::Table,
            pf,
            &tcp4_to(last4, 0, None),
            tcp_ts,
        ));
    }
    (policies, cases)
}

fn arp() -> Vec<u8> {
    let mut arp = vec![0xffu8; 6];
    arp.extend_from_slice(&packet::MAC_A);
    arp.extend_from_slice(&[0x08, 0x06]);
    arp.extend_from_slice(&[0u8; 28]);
    arp
}
