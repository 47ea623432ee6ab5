//! Ready-made topologies ([`Star`]: N senders -> router -> 1 receiver, the dumbbell/incast
//! shape with the bottleneck on the router's egress toward the receiver) and the shortest-path
//! route computation used by [`super::Testbed::route_all`].

use super::Testbed;
use super::host::Host;
use super::link::{Iface, Link, LinkOpts};
use super::qdisc::{Bottleneck, BottleneckSpec};
use anyhow::Result;
use std::collections::{HashMap, VecDeque};

/// What [`Testbed::add_star`] builds.
#[derive(Clone, Debug)]
pub struct StarSpec {
    /// Number of sender hosts (`s0`, `s1`, ...).
    pub senders: usize,
    /// Bottleneck on the router's egress toward the receiver (`None`: line rate).
    pub bottleneck: Option<BottleneckSpec>,
    /// Options of every link.
    pub link: LinkOpts,
    /// Name of the router host (default `r`).
    pub router_name: String,
    /// Name of the receiver host (default `rx`).
    pub receiver_name: String,
}

impl Default for StarSpec {
    fn default() -> Self {
        StarSpec {
            senders: 1,
            bottleneck: None,
            link: LinkOpts::default(),
            router_name: "r".into(),
            receiver_name: "rx".into(),
        }
    }
}

/// N senders, each linked to one router, which is linked to one receiver. Routes are in place.
#[derive(Clone, Debug)]
pub struct Star {
    /// Sender hosts `s0..s{N-1}`.
    pub senders: Vec<Host>,
    /// The router (forwarding on).
    pub router: Host,
    /// The receiver.
    pub receiver: Host,
    /// `sender_links[i]`: end `a` in sender i, end `b` in the router.
    pub sender_links: Vec<Link>,
    /// End `a` in the router, end `b` in the receiver.
    pub receiver_link: Link,
    /// The bottleneck on `receiver_link.a` (router egress toward the receiver), if asked for.
    pub bottleneck: Option<Bottleneck>,
}

impl Star {
    /// The router's interface toward the receiver (where the bottleneck sits).
    pub fn bottleneck_iface(&self) -> &Iface {
        &self.receiver_link.a
    }
    /// Sender i's interface toward the router.
    pub fn sender_iface(&self, i: usize) -> &Iface {
        &self.sender_links[i].a
    }
}

impl Testbed {
    /// Builds a [`Star`] in this testbed and installs routes (see [`Testbed::route_all`]).
    pub fn add_star(&self, spec: &StarSpec) -> Result<Star> {
        anyhow::ensure!(spec.senders >= 1, "a star needs at least one sender");
        let router = self.add_router(&spec.router_name)?;
        let receiver = self.add_host(&spec.receiver_name)?;
        let mut senders = Vec::with_capacity(spec.senders);
        let mut sender_links = Vec::with_capacity(spec.senders);
        for i in 0..spec.senders {
            let s = self.add_host(&format!("s{i}"))?;
            sender_links.push(self.link_with(&s, &router, &spec.link)?);
            senders.push(s);
        }
        let receiver_link = self.link_with(&router, &receiver, &spec.link)?;
        self.route_all()?;
        let bottleneck = match &spec.bottleneck {
            Some(b) => Some(receiver_link.bottleneck_a_to_b(b)?),
            None => None,
        };
        Ok(Star {
            senders,
            router,
            receiver,
            sender_links,
            receiver_link,
            bottleneck,
        })
    }
}

/// `ip -batch` lines (`route replace ...`) that give `h` a route to every address of `links`
/// it is not directly attached to. BFS from `h`; only routers are expanded (a non-router host
/// does not forward). A subnet whose nearest end is a router is routed as a whole; otherwise
/// each reachable end's address gets a host route.
pub(crate) fn routes_for(h: &Host, hosts: &[Host], links: &[Link]) -> Vec<String> {
    let router: HashMap<&str, bool> = hosts.iter().map(|x| (x.name(), x.is_router())).collect();
    // first hop (neighbour's iface on the first link) and distance per reached host
    let mut reach: HashMap<String, (Iface, u32)> = HashMap::new();
    let mut q = VecDeque::new();
    // Expansion from h itself.
    let neighbours = |name: &str| -> Vec<(Iface, Iface)> {
        links
            .iter()
            .filter_map(|l| {
                if l.a.host == name {
                    Some((l.a.clone(), l.b.clone()))
                } else if l.b.host == name {
                    Some((l.b.clone(), l.a.clone()))
                } else {
                    None
                }
            })
            .collect()
    };
    for (_mine, theirs) in neighbours(h.name()) {
        if !reach.contains_key(&theirs.host) {
            reach.insert(theirs.host.clone(), (theirs.clone(), 1));
            q.push_back(theirs.host.clone());
        }
    }
    while let Some(n) = q.pop_front() {
        if !router.get(n.as_str()).copied().unwrap_or(false) {
            continue;
        }
        let (first, d) = reach[&n].clone();
        for (_m, t) in neighbours(&n) {
            if t.host != h.name() && !reach.contains_key(&t.host) {
                reach.insert(t.host.clone(), (first.clone(), d + 1));
                q.push_back(t.host.clone());
            }
        }
    }
    let mut lines = Vec::new();
    for l in links {
        if l.a.host == h.name() || l.b.host == h.name() {
            continue;
        }
        let ends: Vec<(&Iface, &(Iface, u32))> = [&l.a, &l.b]
            .into_iter()
            .filter_map(|e| reach.get(&e.host).map(|r| (e, r)))
            .collect();
        let Some(best) = ends.iter().min_by_key(|(_, (_, d))| *d) else {
            continue;
        };
        if router.get(best.0.host.as_str()).copied().unwrap_or(false) {
            let via = &best.1.0;
            lines.push(format!("route replace {} via {}", best.0.v4_cidr(), via.ipv4));
            if let (Some(c), Some(v6)) = (best.0.v6_cidr(), via.ipv6) {
                lines.push(format!("route replace {c} via {v6}"));
            }
        } else {
            for (e, (via, _)) in &ends {
                lines.push(format!("route replace {}/32 via {}", e.ipv4, via.ipv4));
                if let (Some(a), Some(v6)) = (e.ipv6, via.ipv6) {
                    lines.push(format!("route replace {a}/128 via {v6}"));
                }
            }
        }
    }
    lines
}
