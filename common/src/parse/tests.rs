//! The parser on hand-built frames: one test per rule in the module docs, each named after the
//! defect it guards against.

extern crate std;
use std::vec::Vec;

use super::*;

const TCP: u8 = 6;
const UDP: u8 = 17;

fn eth(tags: &[u16], ethertype: u16) -> Vec<u8> {
    let mut f = std::vec![0x02, 0, 0, 0, 0, 0x0b, 0x02, 0, 0, 0, 0, 0x0a];
    for &t in tags {
        f.extend_from_slice(&t.to_be_bytes());
        // PCP 3, VID 100
        f.extend_from_slice(&(0x6000u16 | 100).to_be_bytes());
    }
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

fn tcp_hdr(sport: u16, dport: u16) -> Vec<u8> {
    let mut t = Vec::new();
    t.extend_from_slice(&sport.to_be_bytes());
    t.extend_from_slice(&dport.to_be_bytes());
    t.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x10, 0xff, 0xff, 0, 0, 0, 0]);
    t
}

fn udp_hdr(sport: u16, dport: u16, payload: usize) -> Vec<u8> {
    let mut t = Vec::new();
    t.extend_from_slice(&sport.to_be_bytes());
    t.extend_from_slice(&dport.to_be_bytes());
    t.extend_from_slice(&((8 + payload) as u16).to_be_bytes());
    t.extend_from_slice(&[0, 0]);
    t.resize(8 + payload, 0x5a);
    t
}

/// Ethernet (with `tags`) + IPv4 (DSCP 10) + `l4` bytes, lengths consistent.
fn v4(tags: &[u16], proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut f = eth(tags, ETH_P_IP);
    let total = (20 + l4.len()) as u16;
    f.extend_from_slice(&[0x45, 10 << 2]);
    f.extend_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&[0, 1, 0x40, 0, 64, proto, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
    f.extend_from_slice(l4);
    f
}

/// Ethernet + IPv6 with extension headers `ext` (each: its next-header value is patched in) +
/// `l4` of protocol `proto`.
fn v6(tags: &[u16], ext: &[(u8, Vec<u8>)], proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut f = eth(tags, ETH_P_IPV6);
    let payload: usize = ext.iter().map(|(_, e)| e.len()).sum::<usize>() + l4.len();
    f.extend_from_slice(&[0x60 | (46 >> 2), (46 & 3) << 6, 0, 0]);
    f.extend_from_slice(&(payload as u16).to_be_bytes());
    f.push(ext.first().map_or(proto, |e| e.0));
    f.push(64);
    f.extend_from_slice(&[0xfd; 16]);
    f.extend_from_slice(&[0xfe; 16]);
    for (i, (_, e)) in ext.iter().enumerate() {
        let mut e = e.clone();
        e[0] = ext.get(i + 1).map_or(proto, |n| n.0);
        f.extend_from_slice(&e);
    }
    f.extend_from_slice(l4);
    f
}

fn opts(len8: u8) -> Vec<u8> {
    let mut e = std::vec![0u8; (len8 as usize + 1) * 8];
    e[1] = len8;
    e
}

fn run(f: &[u8]) -> Result<(PacketInfo, Layout), Unparsed> {
    let mut p = PacketInfo::default();
    parse(&SliceFrame::new(f), &mut p).map(|l| (p, l))
}

#[test]
fn whole_ipv4_tcp_and_udp_parse() {
    let (p, l) = run(&v4(&[], TCP, &tcp_hdr(1000, 80))).unwrap();
    assert_eq!(
        (p.proto, p.sport, p.dport, p.dscp, p.is_v6),
        (TCP, 1000, 80, 10, 0)
    );
    assert_eq!(p.dst, v4_mapped(u32::from_ne_bytes([10, 0, 0, 2])));
    assert_eq!((l.vlan_tci_off, l.l3_off, l.l4_off), (None, 14, Some(34)));
    let (p, _) = run(&v4(&[], UDP, &udp_hdr(53, 5353, 0))).unwrap();
    assert_eq!((p.proto, p.sport, p.dport), (UDP, 53, 5353));
}

#[test]
fn tcp_header_cut_short_is_truncated_not_classified() {
    // Regression: the ports were read from a frame that ends inside the TCP header.
    let full = v4(&[], TCP, &tcp_hdr(1, 2));
    for cut in [4, 12, 19] {
        let mut f = full[..14 + 20 + cut].to_vec();
        // The IPv4 total length says so too: still truncated.
        let total = (20 + cut) as u16;
        f[16..18].copy_from_slice(&total.to_be_bytes());
        assert_eq!(run(&f).unwrap_err(), Unparsed::Truncated, "{cut} bytes of TCP");
        // With the original total length, the frame is shorter than the IP packet.
        assert_eq!(run(&full[..14 + 20 + cut]).unwrap_err(), Unparsed::Truncated);
    }
    let v6f = v6(&[], &[], TCP, &tcp_hdr(1, 2));
    assert_eq!(run(&v6f[..v6f.len() - 1]).unwrap_err(), Unparsed::Truncated);
    let mut short = v6(&[], &[], TCP, &tcp_hdr(1, 2)[..10]);
    assert_eq!(run(&short).unwrap_err(), Unparsed::Truncated);
    short.extend_from_slice(&[0; 10]); // bytes past the payload length are not the header's
    assert_eq!(run(&short).unwrap_err(), Unparsed::Truncated);
}

#[test]
fn tcp_data_offset_must_fit() {
    let mut t = tcp_hdr(1, 2);
    t[12] = 0x80; // 32 bytes of header, 20 present
    assert_eq!(run(&v4(&[], TCP, &t)).unwrap_err(), Unparsed::Truncated);
    t.extend_from_slice(&[1; 12]);
    assert!(run(&v4(&[], TCP, &t)).is_ok());
    t[12] = 0x40; // 16 bytes: below the minimum
    assert_eq!(run(&v4(&[], TCP, &t)).unwrap_err(), Unparsed::Malformed);
}

#[test]
fn udp_and_sctp_need_their_whole_header() {
    let u = udp_hdr(1, 2, 0);
    assert_eq!(run(&v4(&[], UDP, &u[..6])).unwrap_err(), Unparsed::Truncated);
    assert_eq!(run(&v4(&[], 132, &u[..8])).unwrap_err(), Unparsed::Truncated);
    let (p, _) = run(&v4(&[], 132, &[0, 1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0])).unwrap();
    assert_eq!((p.sport, p.dport), (1, 2));
    // ICMP has no ports and needs nothing past the IP header.
    let (p, _) = run(&v4(&[], 1, &[])).unwrap();
    assert_eq!((p.proto, p.sport, p.dport), (1, 0, 0));
}

#[test]
fn ipv4_lengths_must_agree_with_the_frame() {
    let full = v4(&[], UDP, &udp_hdr(1, 2, 10));
    // Total length beyond the frame.
    let mut f = full.clone();
    f[16..18].copy_from_slice(&100u16.to_be_bytes());
    assert_eq!(run(&f).unwrap_err(), Unparsed::Truncated);
    // Total length below the header length.
    f[16..18].copy_from_slice(&19u16.to_be_bytes());
    assert_eq!(run(&f).unwrap_err(), Unparsed::Malformed);
    // Header length beyond the total length.
    let mut f = full.clone();
    f[14] = 0x4f; // 60 bytes of header, total 38
    assert_eq!(run(&f).unwrap_err(), Unparsed::Malformed);
    // Header length below 20 bytes.
    f[14] = 0x44;
    assert_eq!(run(&f).unwrap_err(), Unparsed::Malformed);
    // Ethernet padding after the IP packet is fine.
    let mut f = full.clone();
    f.extend_from_slice(&[0; 20]);
    assert_eq!(run(&f).unwrap().0.dport, 2);
    // A zero total length means "the whole frame" only for GSO packets (BIG TCP).
    let mut f = full.clone();
    f[16..18].copy_from_slice(&[0, 0]);
    assert_eq!(run(&f).unwrap_err(), Unparsed::Malformed);
    let mut p = PacketInfo::default();
    assert!(parse(&SliceFrame { data: &f, gso: true }, &mut p).is_ok());
}

#[test]
fn ip_version_must_match_the_ethertype() {
    // Regression: an IPv4 ethertype with version 6 or 0 was parsed as IPv4.
    for version in [0u8, 6, 15] {
        let mut f = v4(&[], TCP, &tcp_hdr(1, 2));
        f[14] = (version << 4) | 5;
        assert_eq!(run(&f).unwrap_err(), Unparsed::Malformed, "version {version}");
    }
    for version in [0u8, 4] {
        let mut f = v6(&[], &[], UDP, &udp_hdr(1, 2, 0));
        f[14] = (version << 4) | (f[14] & 0x0f);
        assert_eq!(run(&f).unwrap_err(), Unparsed::Malformed, "version {version}");
    }
}

#[test]
fn qinq_frames_are_parsed_through_both_tags() {
    // Regression: 802.1ad + 802.1Q (and two 802.1Q tags) were counted as non-IP.
    for tags in [
        [ETH_P_8021AD, ETH_P_8021Q],
        [ETH_P_8021Q, ETH_P_8021Q],
        [ETH_P_QINQ_9100, ETH_P_8021Q],
    ] {
        let (p, l) = run(&v4(&tags, TCP, &tcp_hdr(7, 8))).unwrap();
        assert_eq!((p.sport, p.dport), (7, 8));
        assert_eq!(
            (l.vlan_tci_off, l.l3_off),
            (Some(14), 22),
            "the outer tag is the one to rewrite"
        );
        let (p, l) = run(&v6(&tags, &[], UDP, &udp_hdr(9, 10, 0))).unwrap();
        assert_eq!((p.sport, l.l4_off), (9, Some(22 + 40)));
    }
    let (_, l) = run(&v4(&[ETH_P_8021Q], TCP, &tcp_hdr(7, 8))).unwrap();
    assert_eq!((l.vlan_tci_off, l.l3_off), (Some(14), 18));
    // A third tag is more than the parser steps over.
    let f = v4(&[ETH_P_8021AD, ETH_P_8021Q, ETH_P_8021Q], TCP, &tcp_hdr(7, 8));
    assert_eq!(run(&f).unwrap_err(), Unparsed::NonIp);
    // A second tag cut short.
    let f = eth(&[ETH_P_8021AD], ETH_P_8021Q);
    assert_eq!(run(&f).unwrap_err(), Unparsed::Truncated);
}

#[test]
fn ipv6_follows_exactly_max_v6_ext_headers() {
    // Regression: documented as 6, the parser followed 5.
    let chain = |n: usize| -> Vec<(u8, Vec<u8>)> {
        (0..n)
            .map(|i| match i {
                0 => (0, opts(0)),
                _ if i % 2 == 1 => (60, opts(1)),
                _ => (43, opts(0)),
            })
            .collect()
    };
    let at = v6(&[], &chain(MAX_V6_EXT), UDP, &udp_hdr(1, 53, 0));
    let (p, l) = run(&at).unwrap();
    assert_eq!((p.proto, p.dport), (UDP, 53));
    assert_eq!(l.l4_off, Some(14 + 40 + 8 * 3 + 16 * 3));
    let past = v6(&[], &chain(MAX_V6_EXT + 1), UDP, &udp_hdr(1, 53, 0));
    assert_eq!(run(&past).unwrap_err(), Unparsed::V6ExtLimit);
}

#[test]
fn ipv6_extension_headers_must_fit_the_payload() {
    let mut f = v6(&[], &[(0, opts(0))], UDP, &udp_hdr(1, 2, 0));
    f[14 + 40 + 1] = 200;
    assert_eq!(run(&f).unwrap_err(), Unparsed::Truncated);
    // An AH header's own length unit (4-byte words, minus 2).
    let mut ah = std::vec![0u8; 16];
    ah[1] = 2;
    let (p, l) = run(&v6(&[], &[(51, ah)], TCP, &tcp_hdr(1, 2))).unwrap();
    assert_eq!((p.proto, l.l4_off), (TCP, Some(14 + 40 + 16)));
    // Past MAX_L4_OFF: the limit, not truncation.
    let big = v6(&[], &[(60, opts(63)), (60, opts(0))], UDP, &udp_hdr(1, 2, 0));
    assert_eq!(run(&big).unwrap_err(), Unparsed::V6ExtLimit);
}

#[test]
fn fragments_are_classified_on_the_ip_header_alone() {
    // IPv4: the first fragment (MF) and a later one (offset) both without ports.
    for frag in [0x2000u16, 0x0010, 0x2010] {
        let mut f = v4(&[], UDP, &udp_hdr(1, 53, 8));
        f[20..22].copy_from_slice(&frag.to_be_bytes());
        let (p, l) = run(&f).unwrap();
        assert_eq!(
            (p.proto, p.sport, p.dport, l.l4_off),
            (UDP, 0, 0, None),
            "{frag:#x}"
        );
    }
    // DF alone is a whole datagram.
    let mut f = v4(&[], UDP, &udp_hdr(1, 53, 8));
    f[20..22].copy_from_slice(&0x4000u16.to_be_bytes());
    assert_eq!(run(&f).unwrap().0.dport, 53);
    // IPv6: M set, or an offset, stops at the fragment header; an atomic fragment goes on.
    for (fo, whole) in [(0x0001u16, false), (0x0008, false), (0x0000, true)] {
        let mut fh = std::vec![0u8; 8];
        fh[2..4].copy_from_slice(&fo.to_be_bytes());
        let (p, l) = run(&v6(&[], &[(44, fh)], UDP, &udp_hdr(1, 53, 0))).unwrap();
        assert_eq!(p.proto, UDP);
        assert_eq!((p.dport == 53, l.l4_off.is_some()), (whole, whole), "{fo:#x}");
    }
    // A tiny first fragment (RFC 1858) has no ports to match and is not truncated.
    let mut f = v4(&[], TCP, &tcp_hdr(1, 2)[..8]);
    f[20..22].copy_from_slice(&0x2000u16.to_be_bytes());
    assert_eq!(run(&f).unwrap().1.l4_off, None);
}

#[test]
fn non_ip_and_short_frames() {
    assert_eq!(run(&eth(&[], 0x0806)).unwrap_err(), Unparsed::NonIp);
    assert_eq!(run(&eth(&[], 0x8847)).unwrap_err(), Unparsed::NonIp);
    assert_eq!(run(&[0u8; 13]).unwrap_err(), Unparsed::Truncated);
    let f = v4(&[], TCP, &tcp_hdr(1, 2));
    assert_eq!(run(&f[..14 + 19]).unwrap_err(), Unparsed::Truncated);
}
