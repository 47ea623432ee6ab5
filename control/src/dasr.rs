//! DASR on the agent's side (docs/dasr.md): what each managed interface's ingress program is
//! told (line rate, epochs, roles), and the report of what the datapath counted (senders per
//! local address, options written and read, the shares set on senders), for `/status` and
//! `/metrics` (its metric family is [`crate::metrics::dasr`]). The datapath's side is
//! `datapath-ebpf/src/ebpf/dasr.rs`, the arithmetic `paceline_common::dasr`.

use std::{collections::HashSet, net::IpAddr};

use anyhow::{Context as _, Result};
use paceline_common::dasr::{
    self, DasrIface, DasrStats, IFACE_RECEIVE, IFACE_SEND, encode_rate, per_sender_ns,
};
use serde::{Deserialize, Serialize};

use crate::kernel::datapath::Datapath;
use paceline_policy::validate::DasrSpec;

/// Ethernet header bytes on top of the MTU: the frame the per-sender epoch time counts.
const ETH_HLEN: u64 = 14;
/// The frame when the MTU cannot be read.
const DEFAULT_FRAME: u64 = 1514;

/// What the ingress program of `iface` is told: its line rate (`None`: the receiver role is
/// off), the epochs, the roles.
pub fn iface_config(spec: &DasrSpec, line_rate: Option<u64>, frame_bytes: u64) -> DasrIface {
    let mut flags = 0;
    let (line, code) = match line_rate.and_then(|r| encode_rate(r).map(|c| (r, c))) {
        Some((r, c)) if spec.receiver => {
            flags |= IFACE_RECEIVE;
            (r, c)
        }
        _ => (0, 0),
    };
    if spec.sender {
        flags |= IFACE_SEND;
    }
    DasrIface {
        line_rate: line,
        min_window_ns: spec.min_window_ns(),
        per_sender_ns: per_sender_ns(frame_bytes, line),
        flags,
        line_code: code,
        _pad: 0,
    }
}

/// The largest frame `iface` sends: its MTU plus the Ethernet header.
pub fn frame_bytes(iface: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/mtu"))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or(DEFAULT_FRAME, |m| m + ETH_HLEN)
}

/// Writes the configuration of every interface in `interfaces` (which the ingress program then
/// serves once attached).
pub fn configure(dp: &mut Datapath, spec: &DasrSpec, interfaces: &[String]) -> Result<()> {
    for i in interfaces {
        let ifindex =
            nix::net::if_::if_nametoindex(i.as_str()).with_context(|| format!("{i}: no such interface"))?;
        let line = spec
            .interfaces
            .iter()
            .find(|l| &l.interface == i)
            .map(|l| l.line_rate);
        let cfg = iface_config(spec, line, frame_bytes(i));
        dp.set_dasr_iface(ifindex, &cfg)
            .with_context(|| format!("{i}: writing PL_DASR_IFACES"))?;
    }
    Ok(())
}

/// One local address as the receiver counts it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddrReport {
    pub address: String,
    /// N: senders currently sending to it.
    pub senders: u32,
    /// The line rate advertised for it, wire bytes/s.
    pub line_rate_bytes_per_second: u64,
    /// line / N: what each of its senders is told to pace at.
    pub share_bytes_per_second: u64,
}

/// What the datapath counted: `/status`'s `counters.dasr` (the counters' fields inline).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DasrReport {
    /// Local addresses that received data, with N and the share each sender is told.
    pub addresses: Vec<AddrReport>,
    /// The datapath's counters summed over CPUs.
    #[serde(flatten)]
    pub stats: DasrStats,
}

/// The addresses of this network namespace's interfaces.
fn local_addresses() -> HashSet<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return HashSet::new();
    };
    addrs
        .filter_map(|a| a.address)
        .filter_map(|s| {
            if let Some(v4) = s.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect()
}

/// A datapath address (16 bytes in network order, IPv4-mapped) as an IP address.
pub fn ip_of(words: &[u32; 4]) -> IpAddr {
    let mut b = [0u8; 16];
    for (i, w) in words.iter().enumerate() {
        b[4 * i..4 * i + 4].copy_from_slice(&w.to_ne_bytes());
    }
    let v6 = std::net::Ipv6Addr::from(b);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// The senders per local address now, and the counters. Addresses that are not this host's
/// (a router forwarding traffic through a managed interface) are left out.
pub fn report(dp: &Datapath) -> Result<DasrReport> {
    let now = dasr::ticks(crate::flows::monotonic_ns());
    let local = local_addresses();
    let mut addresses: Vec<AddrReport> = dp
        .dasr_addrs()?
        .into_iter()
        .map(|(k, v)| (ip_of(&k), v))
        .filter(|(ip, _)| local.contains(ip))
        .map(|(ip, v)| {
            let n = dasr::senders(&v.view(), now);
            AddrReport {
                address: ip.to_string(),
                senders: n,
                line_rate_bytes_per_second: v.line_rate,
                share_bytes_per_second: dasr::share(v.line_rate, n),
            }
        })
        .collect();
    addresses.sort_by(|a, b| a.address.cmp(&b.address));
    Ok(DasrReport {
        addresses,
        stats: dp.dasr_stats()?,
    })
}

/// A report of one local address, 10.0.0.2, with N = 2 senders on a 125 MB/s line (62.5 MB/s
/// each) and `stats`: the fixture the tests of the status document and of the metric family
/// share.
#[cfg(test)]
pub(crate) fn one_address_report(stats: DasrStats) -> DasrReport {
    DasrReport {
        addresses: vec![AddrReport {
            address: "10.0.0.2".into(),
            senders: 2,
            line_rate_bytes_per_second: 125_000_000,
            share_bytes_per_second: 62_500_000,
        }],
        stats,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paceline_policy::validate::DasrLine;

    fn spec() -> DasrSpec {
        DasrSpec {
            receiver: true,
            sender: true,
            line_rate: None,
            rtt_ns: 100_000,
            active_rtts: 2,
            interfaces: vec![DasrLine {
                interface: "eth0".into(),
                line_rate: 125_000_000,
                source: "speed of eth0".into(),
            }],
        }
    }

    #[test]
    fn an_interface_gets_its_line_rate_epochs_and_roles() {
        let c = iface_config(&spec(), Some(125_000_000), 1514);
        assert_eq!(c.flags, IFACE_RECEIVE | IFACE_SEND);
        assert_eq!(c.line_rate, 125_000_000);
        assert_eq!(dasr::decode_rate(c.line_code), Some(125_000_000));
        // 2 x 100 us, raised to two of a paced flow's ~1 ms burst gaps.
        assert_eq!(c.min_window_ns, 2 * dasr::PACED_BURST_GAP_NS);
        assert_eq!(c.per_sender_ns, 48_448);
        let sender_only = DasrSpec {
            receiver: false,
            ..spec()
        };
        let c = iface_config(&sender_only, None, 1514);
        assert_eq!((c.flags, c.line_rate), (IFACE_SEND, 0));
    }

    #[test]
    fn addresses_print_as_ip() {
        let v4 = paceline_common::maps::v4_mapped(u32::from_ne_bytes([10, 0, 0, 2]));
        assert_eq!(ip_of(&v4).to_string(), "10.0.0.2");
        let mut b = [0u32; 4];
        b[0] = u32::from_ne_bytes([0xfd, 0, 0, 0]);
        b[3] = u32::from_ne_bytes([0, 0, 0, 1]);
        assert_eq!(ip_of(&b).to_string(), "fd00::1");
    }

    /// `/status`'s `counters.dasr` as agents have always written it (what `paceline status`,
    /// the lab and older readers parse): the counters inline, the histogram as `shares_set`;
    /// and it reads back to the same figures.
    #[test]
    fn the_status_document_of_dasr_counters_is_unchanged_and_round_trips() {
        let mut stats = DasrStats {
            data_segments: 1,
            sightings: 2,
            epochs: 3,
            options_written: 4,
            options_no_room: 5,
            options_read: 6,
            options_malformed: 7,
            options_no_socket: 8,
            rates_set: 9,
            pacing_updates: 10,
            stale_resets: 11,
            sockopt_errors: 12,
            ..Default::default()
        };
        stats.rate_hist[4] = 2;
        stats.rate_hist[dasr::RATE_BUCKETS - 1] = 1;
        let r = one_address_report(stats);
        let text = serde_json::to_string(&r).expect("serializes");
        assert_eq!(
            text,
            concat!(
                r#"{"addresses":[{"address":"10.0.0.2","senders":2,"line_rate_bytes_per_second":125000000,"#,
                r#""share_bytes_per_second":62500000}],"data_segments":1,"sightings":2,"epochs":3,"#,
                r#""options_written":4,"options_no_room":5,"options_read":6,"options_malformed":7,"#,
                r#""options_no_socket":8,"rates_set":9,"pacing_updates":10,"stale_resets":11,"#,
                r#""sockopt_errors":12,"shares_set":[{"below_bytes_per_second":2097152,"count":2},"#,
                r#"{"below_bytes_per_second":null,"count":1}]}"#
            )
        );
        assert_eq!(serde_json::from_str::<DasrReport>(&text).expect("parses"), r);
        let bad = text.replace("2097152", "2097153");
        assert!(
            serde_json::from_str::<DasrReport>(&bad).is_err(),
            "no bucket ends there"
        );
    }
}
