//! The points to measure: scopes (flow, class, level, unpaced), protocols, rates and MTUs.

use paceline_common::edt::TCP_FRAME_OVERHEAD_V4;

/// The aim (docs/experiments/pacing.md): achieved within 1% of configured.
pub(crate) const AIM: f64 = 0.01;

/// UDP flows offer this many times their share of the configured rate.
pub(crate) const UDP_OVERLOAD: f64 = 1.5;

/// Bytes of headers below a UDP payload on the wire (Ethernet 14 + IPv4 20 + UDP 8).
pub(crate) const UDP_HDR: u64 = 42;

/// Bytes of headers below a TCP payload (Ethernet, IPv4, TCP with timestamps).
pub(crate) const TCP_HDR: u64 = TCP_FRAME_OVERHEAD_V4;

pub(crate) const M: u64 = 1_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

/// What the configured rate applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// One flow, `flow_rate`.
    Flow,
    /// Several flows of one class, `class_rate`.
    Class,
    /// Two classes of one level, the level's `rate`.
    Level,
    /// No rate anywhere: the control.
    Unpaced,
}

impl Kind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Flow => "flow",
            Kind::Class => "class",
            Kind::Level => "level",
            Kind::Unpaced => "unpaced",
        }
    }
}

/// One class of a point and its flows (all to one port of the receiver).
#[derive(Clone, Debug)]
pub(crate) struct Group {
    pub(crate) class: String,
    pub(crate) port: u16,
    pub(crate) flows: u32,
}

/// One measurement point.
#[derive(Clone, Debug)]
pub(crate) struct Point {
    pub(crate) name: String,
    pub(crate) kind: Kind,
    pub(crate) proto: Proto,
    pub(crate) mtu: u32,
    /// The configured wire rate that should limit the point (bit/s); `None` when unpaced.
    pub(crate) rate_bps: Option<u64>,
    /// UDP: the payload rate each flow offers (bit/s).
    pub(crate) udp_flow_payload_bps: u64,
    pub(crate) groups: Vec<Group>,
}

impl Point {
    pub(crate) fn flows(&self) -> u32 {
        self.groups.iter().map(|g| g.flows).sum()
    }
    pub(crate) fn udp_payload(&self) -> u64 {
        self.mtu as u64 - 28
    }
    /// Offered wire rate of all flows together (UDP), bit/s.
    pub(crate) fn udp_offered_wire_bps(&self) -> f64 {
        let p = self.udp_payload() as f64;
        self.udp_flow_payload_bps as f64 * self.flows() as f64 * (p + UDP_HDR as f64) / p
    }
}

pub(crate) fn mbit(bps: u64) -> String {
    if bps.is_multiple_of(1_000_000_000) {
        format!("{}G", bps / 1_000_000_000)
    } else {
        format!("{}M", bps / M)
    }
}

/// Durations of one point: warm-up skipped, the measured window, a tail skipped.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    pub(crate) warm_s: f64,
    pub(crate) window_s: f64,
    pub(crate) tail_s: f64,
}

impl Timing {
    pub(crate) fn duration_s(&self) -> f64 {
        self.warm_s + self.window_s + self.tail_s
    }
}

/// The points of a run.
pub(crate) fn plan(quick: bool) -> (Vec<Point>, Option<u64>) {
    let mut points = Vec::new();
    let mut port = 5100u16;
    let mut next_port = || {
        port += 1;
        port
    };
    let udp_share = |rate: u64, mtu: u32, flows: u32| -> u64 {
        // Payload rate per flow so that all flows together offer UDP_OVERLOAD x rate on the wire.
        let p = (mtu - 28) as f64;
        (UDP_OVERLOAD * rate as f64 / flows as f64 * p / (p + UDP_HDR as f64)) as u64
    };
    let mut flow = |proto: Proto, mtu: u32, rate: u64, points: &mut Vec<Point>| {
        let name = format!("{}-flow-{}", proto.as_str(), mbit(rate));
        points.push(Point {
            name: name.clone(),
            kind: Kind::Flow,
            proto,
            mtu,
            rate_bps: Some(rate),
            udp_flow_payload_bps: udp_share(rate, mtu, 1),
            groups: vec![Group {
                class: name,
                port: next_port(),
                flows: 1,
            }],
        });
    };
    // What TCG emulation sustains (measured by the unpaced controls: about 120 Mbit/s of TCP
    // at MTU 1500 and 300 at MTU 9000, less for paced UDP, whose sender blocks on its send
    // buffer): 1500-byte points up to 100 Mbit/s, jumbo frames for 200 and 300 Mbit/s.
    let (rates_1500, rates_9000): (&[u64], &[u64]) = if quick {
        (&[20 * M], &[200 * M])
    } else {
        (&[10 * M, 20 * M, 50 * M, 100 * M], &[200 * M, 300 * M])
    };
    for proto in [Proto::Tcp, Proto::Udp] {
        for &r in rates_1500 {
            flow(proto, 1500, r, &mut points);
        }
        if !(quick && proto == Proto::Udp) {
            for &r in rates_9000 {
                flow(proto, 9000, r, &mut points);
            }
        }
    }
    let agg = 50 * M;
    let (class_protos, level_protos): (&[Proto], &[Proto]) = if quick {
        (&[Proto::Tcp], &[Proto::Udp])
    } else {
        (&[Proto::Tcp, Proto::Udp], &[Proto::Tcp, Proto::Udp])
    };
    for &proto in class_protos {
        let name = format!("{}-class-{}-4flows", proto.as_str(), mbit(agg));
        points.push(Point {
            name: name.clone(),
            kind: Kind::Class,
            proto,
            mtu: 1500,
            rate_bps: Some(agg),
            udp_flow_payload_bps: udp_share(agg, 1500, 4),
            groups: vec![Group {
                class: name,
                port: next_port(),
                flows: 4,
            }],
        });
    }
    for &proto in level_protos {
        let name = format!("{}-level-{}-2x2flows", proto.as_str(), mbit(agg));
        points.push(Point {
            name: name.clone(),
            kind: Kind::Level,
            proto,
            mtu: 1500,
            rate_bps: Some(agg),
            udp_flow_payload_bps: udp_share(agg, 1500, 4),
            groups: ["a", "b"]
                .iter()
                .map(|s| Group {
                    class: format!("{name}-{s}"),
                    port: next_port(),
                    flows: 2,
                })
                .collect(),
        });
    }
    // Controls: nothing paces these; UDP offers 1.5x the fastest paced rate of its MTU.
    let mut unpaced = |proto: Proto, mtu: u32, flows: u32, offered: u64, points: &mut Vec<Point>| {
        let name = format!(
            "{}-unpaced-mtu{mtu}-{flows}flow{}",
            proto.as_str(),
            if flows > 1 { "s" } else { "" }
        );
        points.push(Point {
            name: name.clone(),
            kind: Kind::Unpaced,
            proto,
            mtu,
            rate_bps: None,
            udp_flow_payload_bps: udp_share(offered, mtu, flows),
            groups: vec![Group {
                class: name,
                port: next_port(),
                flows,
            }],
        });
    };
    let top_1500 = *rates_1500.iter().max().unwrap();
    let top_9000 = *rates_9000.iter().max().unwrap();
    unpaced(Proto::Tcp, 1500, 1, 0, &mut points);
    if !quick {
        unpaced(Proto::Tcp, 1500, 4, 0, &mut points);
        unpaced(Proto::Tcp, 9000, 1, 0, &mut points);
        unpaced(Proto::Udp, 1500, 1, top_1500, &mut points);
        unpaced(Proto::Udp, 9000, 1, top_9000, &mut points);
    }
    let level_rate = points.iter().any(|p| p.kind == Kind::Level).then_some(agg);
    (points, level_rate)
}

/// The points of `--aggregates`: one class with `class_rate: R` carrying 1, 4 and 16 TCP flows,
/// at 10, 200 and 1,000 Mbit/s (MTU 1500), and the unpaced controls with 1 and 16 flows. Meant
/// for the host (`--host`), where HTB enforces the class: it asks whether an aggregate leaves
/// at its rate whatever the number of flows sharing it (the VM under emulation reaches about
/// 120 Mbit/s at MTU 1500).
pub(crate) fn plan_aggregates() -> Vec<Point> {
    let mut points = Vec::new();
    let mut port = 5300u16;
    for rate in [10 * M, 200 * M, 1000 * M] {
        for flows in [1u32, 4, 16] {
            let name = format!("tcp-class-{}-{flows}flows", mbit(rate));
            port += 1;
            points.push(Point {
                name: name.clone(),
                kind: Kind::Class,
                proto: Proto::Tcp,
                mtu: 1500,
                rate_bps: Some(rate),
                udp_flow_payload_bps: 0,
                groups: vec![Group {
                    class: name,
                    port,
                    flows,
                }],
            });
        }
    }
    for flows in [1u32, 16] {
        let name = format!("tcp-unpaced-mtu1500-{flows}flows");
        port += 1;
        points.push(Point {
            name: name.clone(),
            kind: Kind::Unpaced,
            proto: Proto::Tcp,
            mtu: 1500,
            rate_bps: None,
            udp_flow_payload_bps: 0,
            groups: vec![Group {
                class: name,
                port,
                flows,
            }],
        });
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every point has its own classes and ports (the policy tells points apart by port), paced
    /// points a rate, controls none, and UDP offers 1.5x the paced rate on the wire.
    #[test]
    fn points_are_distinct_and_rated() {
        for (quick, aggregates) in [(false, false), (true, false), (false, true)] {
            let (points, level_rate) = if aggregates {
                (plan_aggregates(), None)
            } else {
                plan(quick)
            };
            let mut ports = std::collections::BTreeSet::new();
            let mut classes = std::collections::BTreeSet::new();
            for p in &points {
                for g in &p.groups {
                    assert!(ports.insert(g.port), "port {} twice", g.port);
                    assert!(classes.insert(g.class.clone()), "class {} twice", g.class);
                }
                assert_eq!(p.rate_bps.is_none(), p.kind == Kind::Unpaced, "{}", p.name);
                if p.proto == Proto::Udp
                    && let Some(r) = p.rate_bps
                {
                    let offered = p.udp_offered_wire_bps();
                    assert!(
                        (offered / r as f64 - UDP_OVERLOAD).abs() < 0.01,
                        "{}: offers {offered} for {r}",
                        p.name
                    );
                }
            }
            assert_eq!(level_rate.is_some(), points.iter().any(|p| p.kind == Kind::Level));
            assert!(points.iter().any(|p| p.kind == Kind::Unpaced), "a control");
        }
    }
}
