//! Links: veth pairs created directly inside the two namespaces, with addresses (IPv4 /24 or
//! /30 per link, optional IPv6 /64), an MTU, and offloads off by default.

use super::host::Host;
use super::qdisc::{Bottleneck, BottleneckSpec};
use anyhow::Result;
use std::net::{Ipv4Addr, Ipv6Addr};

/// Options of one link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkOpts {
    /// MTU of both ends (default 1500).
    pub mtu: u32,
    /// Also give both ends an IPv6 address (`fd00:706c:0:<link>::1/64` and `::2`, no DAD).
    pub ipv6: bool,
    /// IPv4 prefix length: 24 (`10.<id/256>.<id%256>.1` and `.2`) or 30
    /// (`10.128.0.0 + 4*id + 1` and `+2`). Default 24.
    pub v4_prefix_len: u8,
    /// Turn TSO/GSO/GRO off on both ends (default true: experiments want per-packet behaviour).
    pub disable_offloads: bool,
}

impl Default for LinkOpts {
    fn default() -> Self {
        LinkOpts {
            mtu: 1500,
            ipv6: false,
            v4_prefix_len: 24,
            disable_offloads: true,
        }
    }
}

/// One end of a link.
#[derive(Clone, Debug)]
pub struct Iface {
    /// The host it lives in.
    pub host: String,
    /// Namespace of that host.
    pub netns: String,
    /// Interface name (unique across the process: `<prefix>l<id><a|b>`, at most 15 chars).
    pub ifname: String,
    /// IPv4 address.
    pub ipv4: Ipv4Addr,
    /// IPv4 prefix length.
    pub prefix_len: u8,
    /// IPv6 address (prefix length 64) when the link has one.
    pub ipv6: Option<Ipv6Addr>,
    /// MTU.
    pub mtu: u32,
    /// The host at the other end.
    pub peer_host: String,
    /// Link id within the testbed (1-based).
    pub link_id: u32,
}

impl Iface {
    /// The IPv4 subnet of the link (network address, prefix length).
    pub fn v4_subnet(&self) -> (Ipv4Addr, u8) {
        let mask = if self.prefix_len == 0 {
            0
        } else {
            u32::MAX << (32 - self.prefix_len)
        };
        (Ipv4Addr::from(u32::from(self.ipv4) & mask), self.prefix_len)
    }

    /// `a.b.c.d/len` of the subnet.
    pub fn v4_cidr(&self) -> String {
        let (n, l) = self.v4_subnet();
        format!("{n}/{l}")
    }

    /// `fd00:706c:0:<id>::/64` when the link has IPv6.
    pub fn v6_cidr(&self) -> Option<String> {
        self.ipv6.map(|a| {
            let s = a.segments();
            format!("{}/64", Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        })
    }
}

/// A veth pair between hosts `a` and `b`.
#[derive(Clone, Debug)]
pub struct Link {
    /// Link id (1-based, in creation order).
    pub id: u32,
    /// End in host `a`.
    pub a: Iface,
    /// End in host `b`.
    pub b: Iface,
    pub(crate) host_a: Host,
    pub(crate) host_b: Host,
    pub(crate) opts: LinkOpts,
}

impl Link {
    /// Host at end `a`.
    pub fn host_a(&self) -> &Host {
        &self.host_a
    }
    /// Host at end `b`.
    pub fn host_b(&self) -> &Host {
        &self.host_b
    }
    /// The options it was created with.
    pub fn opts(&self) -> &LinkOpts {
        &self.opts
    }
    /// Bottleneck on the egress of end `a` (traffic from `a` to `b`).
    pub fn bottleneck_a_to_b(&self, spec: &BottleneckSpec) -> Result<Bottleneck> {
        self.host_a.set_bottleneck(&self.a.ifname, spec)
    }
    /// Bottleneck on the egress of end `b` (traffic from `b` to `a`).
    pub fn bottleneck_b_to_a(&self, spec: &BottleneckSpec) -> Result<Bottleneck> {
        self.host_b.set_bottleneck(&self.b.ifname, spec)
    }
}

/// Addresses of link `id`: (a, b, prefix length).
pub(crate) fn v4_addrs(id: u32, prefix_len: u8) -> Result<(Ipv4Addr, Ipv4Addr, u8)> {
    match prefix_len {
        24 => {
            anyhow::ensure!(id < 65536, "too many /24 links");
            let base = u32::from(Ipv4Addr::new(10, 0, 0, 0)) | (id << 8);
            Ok((Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2), 24))
        }
        30 => {
            anyhow::ensure!(id < (1 << 20), "too many /30 links");
            let base = u32::from(Ipv4Addr::new(10, 128, 0, 0)) + 4 * id;
            Ok((Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2), 30))
        }
        other => anyhow::bail!("v4_prefix_len must be 24 or 30, not {other}"),
    }
}

/// IPv6 addresses of link `id` (prefix length 64).
pub(crate) fn v6_addrs(id: u32) -> (Ipv6Addr, Ipv6Addr) {
    let hi = (id >> 16) as u16;
    let lo = (id & 0xffff) as u16;
    (
        Ipv6Addr::new(0xfd00, 0x706c, hi, lo, 0, 0, 0, 1),
        Ipv6Addr::new(0xfd00, 0x706c, hi, lo, 0, 0, 0, 2),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_plan() {
        let (a, b, l) = v4_addrs(3, 24).unwrap();
        assert_eq!(
            (a, b, l),
            (Ipv4Addr::new(10, 0, 3, 1), Ipv4Addr::new(10, 0, 3, 2), 24)
        );
        let (a, b, _) = v4_addrs(300, 24).unwrap();
        assert_eq!((a, b), (Ipv4Addr::new(10, 1, 44, 1), Ipv4Addr::new(10, 1, 44, 2)));
        let (a, b, l) = v4_addrs(2, 30).unwrap();
        assert_eq!(
            (a, b, l),
            (Ipv4Addr::new(10, 128, 0, 9), Ipv4Addr::new(10, 128, 0, 10), 30)
        );
        assert!(v4_addrs(1, 16).is_err());
        let i = Iface {
            host: "h".into(),
            netns: "n".into(),
            ifname: "x".into(),
            ipv4: a,
            prefix_len: 30,
            ipv6: Some(v6_addrs(7).0),
            mtu: 1500,
            peer_host: "p".into(),
            link_id: 2,
        };
        assert_eq!(i.v4_cidr(), "10.128.0.8/30");
        assert_eq!(i.v6_cidr().unwrap(), "fd00:706c:0:7::/64");
    }
}
