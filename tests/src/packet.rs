//! Test packets: build them (etherparse computes every checksum) and check them after the
//! datapath rewrote headers.

use etherparse::{
    IpNumber, Ipv4Header, Ipv4Options, Ipv6Header, PacketBuilder, SlicedPacket, TransportSlice,
};

pub const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
pub const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];

#[derive(Clone, Copy, Debug)]
pub enum L4 {
    Tcp { sport: u16, dport: u16 },
    Udp { sport: u16, dport: u16 },
}

/// An Ethernet frame with an IPv4 packet: `dscp`/`ecn` in the TOS byte, optional IPv4 options,
/// an optional 802.1Q tag (`vid`, `pcp`), and `payload_len` bytes of payload.
#[allow(
    clippy::too_many_arguments,
    reason = "one argument per header field a test varies"
)]
pub fn ipv4(
    src: [u8; 4],
    dst: [u8; 4],
    l4: L4,
    dscp: u8,
    ecn: u8,
    options: &[u8],
    vlan: Option<(u16, u8)>,
    payload_len: usize,
) -> Vec<u8> {
    let payload = vec![0x5au8; payload_len];
    let eth = PacketBuilder::ethernet2(MAC_A, MAC_B);
    let mut ip = Ipv4Header::new(0, 64, IpNumber::TCP, src, dst).expect("ipv4 header");
    ip.dscp = etherparse::Ipv4Dscp::try_new(dscp).expect("dscp");
    ip.ecn = etherparse::Ipv4Ecn::try_new(ecn).expect("ecn");
    ip.options = Ipv4Options::try_from(options).expect("options must be a multiple of 4 bytes, <= 40");
    let mut out = Vec::new();
    match (vlan, l4) {
        (None, L4::Tcp { sport, dport }) => {
            let b = eth
                .ip(etherparse::IpHeaders::Ipv4(ip, Default::default()))
                .tcp(sport, dport, 1, 65535);
            b.write(&mut out, &payload).expect("write");
        }
        (None, L4::Udp { sport, dport }) => {
            let b = eth
                .ip(etherparse::IpHeaders::Ipv4(ip, Default::default()))
                .udp(sport, dport);
            b.write(&mut out, &payload).expect("write");
        }
        (Some((vid, pcp)), L4::Tcp { sport, dport }) => {
            let b = eth
                .vlan(vlan_header(vid, pcp))
                .ip(etherparse::IpHeaders::Ipv4(ip, Default::default()))
                .tcp(sport, dport, 1, 65535);
            b.write(&mut out, &payload).expect("write");
        }
        (Some((vid, pcp)), L4::Udp { sport, dport }) => {
            let b = eth
                .vlan(vlan_header(vid, pcp))
                .ip(etherparse::IpHeaders::Ipv4(ip, Default::default()))
                .udp(sport, dport);
            b.write(&mut out, &payload).expect("write");
        }
    }
    out
}

fn vlan_header(vid: u16, pcp: u8) -> etherparse::VlanHeader {
    etherparse::VlanHeader::Single(etherparse::SingleVlanHeader {
        pcp: etherparse::VlanPcp::try_new(pcp).expect("pcp"),
        drop_eligible_indicator: false,
        vlan_id: etherparse::VlanId::try_new(vid).expect("vid"),
        ether_type: etherparse::EtherType::IPV4, // replaced by the builder
    })
}

/// An Ethernet frame with an IPv6 packet; `ext` is a list of (next-header number, raw extension
/// header bytes) inserted between the fixed header and the transport header, in order.
pub fn ipv6(
    src: [u8; 16],
    dst: [u8; 16],
    l4: L4,
    dscp: u8,
    ecn: u8,
    hop_by_hop: bool,
    payload_len: usize,
) -> Vec<u8> {
    let payload = vec![0xa5u8; payload_len];
    let (proto, l4bytes) = match l4 {
        L4::Tcp { sport, dport } => {
            let mut h = etherparse::TcpHeader::new(sport, dport, 1, 65535);
            let ip = Ipv6Header {
                source: src,
                destination: dst,
                ..Default::default()
            };
            h.checksum = h.calc_checksum_ipv6(&ip, &payload).expect("csum");
            let mut v = h.to_bytes().to_vec();
            v.extend_from_slice(&payload);
            (IpNumber::TCP, v)
        }
        L4::Udp { sport, dport } => {
            let ip = Ipv6Header {
                source: src,
                destination: dst,
                ..Default::default()
            };
            let h = etherparse::UdpHeader::with_ipv6_checksum(sport, dport, &ip, &payload).expect("udp");
            let mut v = h.to_bytes().to_vec();
            v.extend_from_slice(&payload);
            (IpNumber::UDP, v)
        }
    };
    let mut body = Vec::new();
    let first_next = if hop_by_hop {
        // Hop-by-hop options: next header, length 0 (8 bytes), PadN filling the rest.
        body.extend_from_slice(&[proto.0, 0, 1, 4, 0, 0, 0, 0]);
        IpNumber::IPV6_HEADER_HOP_BY_HOP
    } else {
        proto
    };
    body.extend_from_slice(&l4bytes);
    let ip = Ipv6Header {
        traffic_class: (dscp << 2) | (ecn & 3),
        flow_label: Default::default(),
        payload_length: body.len() as u16,
        next_header: first_next,
        hop_limit: 64,
        source: src,
        destination: dst,
    };
    let mut out = Vec::new();
    out.extend_from_slice(&MAC_B);
    out.extend_from_slice(&MAC_A);
    out.extend_from_slice(&0x86ddu16.to_be_bytes());
    ip.write(&mut out).expect("ipv6");
    out.extend_from_slice(&body);
    out
}

/// What a test wants to know about a frame after the datapath ran.
#[derive(Debug, PartialEq, Eq)]
pub struct Seen {
    pub dscp: u8,
    pub ecn: u8,
    pub pcp: Option<u8>,
    /// IPv4 header checksum valid (always true for IPv6).
    pub ip_csum_ok: bool,
}

/// Parses `frame` and verifies the IPv4 header checksum.
pub fn inspect(frame: &[u8]) -> Seen {
    let p = SlicedPacket::from_ethernet(frame).expect("parse frame");
    let pcp = match &p.vlan {
        Some(etherparse::VlanSlice::SingleVlan(v)) => Some(v.priority_code_point().value()),
        Some(etherparse::VlanSlice::DoubleVlan(v)) => Some(v.outer().priority_code_point().value()),
        None => None,
    };
    let (dscp, ecn, ok) = match p.net.expect("net layer") {
        etherparse::NetSlice::Ipv4(s) => {
            let h = s.header().to_header();
            let ok = h.calc_header_checksum() == h.header_checksum;
            (h.dscp.value(), h.ecn.value(), ok)
        }
        etherparse::NetSlice::Ipv6(s) => {
            let tc = s.header().traffic_class();
            (tc >> 2, tc & 3, true)
        }
    };
    let _ = matches!(
        p.transport,
        Some(TransportSlice::Tcp(_)) | Some(TransportSlice::Udp(_))
    );
    Seen {
        dscp,
        ecn,
        pcp,
        ip_csum_ok: ok,
    }
}

/// An Ethernet/IPv4/TCP frame whose TCP header carries `options` (raw bytes, a multiple of 4,
/// at most 40), with a valid TCP checksum.
pub fn tcp4_with_options(
    src: [u8; 4],
    dst: [u8; 4],
    sport: u16,
    dport: u16,
    options: &[u8],
    payload_len: usize,
) -> Vec<u8> {
    let payload = vec![0x42u8; payload_len];
    let mut tcp = etherparse::TcpHeader::new(sport, dport, 1000, 65535);
    tcp.set_options_raw(options)
        .expect("options: a multiple of 4 bytes, at most 40");
    tcp.ack = true;
    let ip = Ipv4Header::new(
        (tcp.header_len() + payload.len()) as u16,
        64,
        IpNumber::TCP,
        src,
        dst,
    )
    .expect("ipv4");
    tcp.checksum = tcp.calc_checksum_ipv4(&ip, &payload).expect("csum");
    let mut out = Vec::new();
    out.extend_from_slice(&MAC_B);
    out.extend_from_slice(&MAC_A);
    out.extend_from_slice(&0x0800u16.to_be_bytes());
    ip.write(&mut out).expect("ip");
    tcp.write(&mut out).expect("tcp");
    out.extend_from_slice(&payload);
    out
}

/// The TCP options and whether the TCP checksum of an Ethernet/IPv4/TCP frame is valid.
pub fn tcp4_options(frame: &[u8]) -> (Vec<u8>, bool) {
    let p = SlicedPacket::from_ethernet(frame).expect("parse frame");
    let Some(etherparse::NetSlice::Ipv4(ip)) = p.net else {
        panic!("not IPv4")
    };
    let Some(TransportSlice::Tcp(tcp)) = p.transport else {
        panic!("not TCP")
    };
    let h = tcp.to_header();
    let ok = h
        .calc_checksum_ipv4(&ip.header().to_header(), tcp.payload())
        .expect("csum")
        == h.checksum;
    (tcp.options().to_vec(), ok)
}
