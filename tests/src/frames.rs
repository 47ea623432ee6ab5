//! Frames for the differential test of the datapath's parser and classifier: seeded random
//! frames (IPv4/IPv6, up to three VLAN tags, IPv4 options, IPv6 extension chains, fragments,
//! TCP/UDP/SCTP/ICMP) and mutations of them (truncations, flipped header fields, bad versions
//! and lengths), and what the datapath must make of each according to the reference in
//! `paceline_common` ([`expect`]).
//!
//! The policy and the reference classification go through [`policy`] and [`reference_class`]
//! only, so a change of the policy table's type is a change here.

use paceline_common::{
    classify::Rule,
    classify::{PacketInfo, classify_linear},
    maps::{ClassConfig, LEVEL_SET_DSCP, LEVEL_SET_PCP, LevelConfig, MAX_LEVELS, PolicyTable, v4_mapped},
    parse::{Layout, SliceFrame, Unparsed, parse},
};
use rand::{RngExt, rngs::StdRng};

/// Classes of [`policy`]; class [`PACED_CLASS`] has a class clock and a horizon, so it drops.
pub const CLASSES: usize = 8;
pub const PACED_CLASS: usize = 7;

fn mask(prefix: u32) -> [u32; 4] {
    let mut m = [0u32; 4];
    for (w, word) in m.iter_mut().enumerate() {
        let bits = prefix.saturating_sub(32 * w as u32).min(32);
        *word = if bits == 0 {
            0
        } else {
            (u32::MAX << (32 - bits)).to_be()
        };
    }
    m
}

fn v6(a: [u8; 16]) -> [u32; 4] {
    let w = |i: usize| u32::from_ne_bytes([a[i], a[i + 1], a[i + 2], a[i + 3]]);
    [w(0), w(4), w(8), w(12)]
}

/// A table and the rules (first match wins) its classifier is compiled from.
pub struct Policy {
    pub table: PolicyTable,
    pub rules: Vec<Rule>,
}

/// The differential test's policy: rules on every field the parser fills, levels that rewrite
/// DSCP, PCP or both, one paced class that drops beyond its horizon.
pub fn policy() -> Policy {
    let rules = [
        Rule::any(1).with_proto(6).with_dport(80, 80),
        Rule::any(2).with_proto(17).with_dport(53, 53).with_family(true),
        Rule::any(3).with_dst(v4_mapped(u32::from_ne_bytes([10, 1, 0, 0])), mask(96 + 16)),
        Rule::any(4)
            .with_src(v6([0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]), mask(8))
            .with_dport(443, 1000),
        Rule::any(5).with_dscp(34),
        Rule::any(1).with_proto(132).with_sport(9, 9),
        Rule::any(3).with_proto(1),
        Rule::any(PACED_CLASS as u16).with_proto(17).with_sport(0, 0),
        Rule::any(6).with_proto(136),
    ];
    let mut t = PolicyTable::empty();
    t.n_classes = CLASSES as u32;
    t.default_class = 0;
    let level = |flags, dscp, pcp| LevelConfig {
        rate: 0,
        flags,
        dscp,
        pcp,
        ..LevelConfig::zeroed()
    };
    t.levels[1] = level(LEVEL_SET_DSCP | LEVEL_SET_PCP, 46, 5);
    t.levels[2] = level(LEVEL_SET_DSCP, 10, 0);
    t.levels[3] = level(LEVEL_SET_PCP, 0, 2);
    for (class, lvl) in [(1, 1), (2, 2), (3, 3), (4, 1), (5, 2), (6, 0), (PACED_CLASS, 1)] {
        t.classes[class] = ClassConfig {
            level: lvl,
            ..ClassConfig::zeroed()
        };
    }
    // 1 kB/s with a 1 s horizon: about the tenth packet of this class is dropped.
    t.classes[PACED_CLASS].class_rate = 1000;
    t.horizon_ns = 1_000_000_000;
    Policy {
        table: t,
        rules: rules.to_vec(),
    }
}

/// The reference classification (what the datapath must agree with): the linear first-match
/// matcher of `paceline_common::classify`.
pub fn reference_class(pol: &Policy, p: &PacketInfo) -> usize {
    classify_linear(&pol.rules, pol.table.default_class, p) as usize
}

/// What the datapath must do with a frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Expect {
    /// Passed untouched and counted under this reason.
    Unparsed(Unparsed),
    /// Classified into `class`; the bytes after the rewrites are `out`, except the IPv4 header
    /// checksum at `csum` (checked for validity instead).
    Class {
        class: usize,
        out: Vec<u8>,
        csum: Option<usize>,
        layout: Layout,
    },
}

/// The reference: the parser and classifier from `paceline_common`, and the rewrites the
/// datapath's level applies (DSCP with ECN kept, the outer tag's PCP).
pub fn expect(pol: &Policy, frame: &[u8]) -> Expect {
    let t = &pol.table;
    let mut p = PacketInfo::default();
    let layout = match parse(&SliceFrame::new(frame), &mut p) {
        Ok(l) => l,
        Err(r) => return Expect::Unparsed(r),
    };
    let class = reference_class(pol, &p);
    let level = &t.levels[t.classes[class].level as usize % MAX_LEVELS];
    let mut out = frame.to_vec();
    let l3 = layout.l3_off;
    let mut csum = None;
    if level.flags & LEVEL_SET_DSCP != 0 {
        if p.is_v6 != 0 {
            let tc = (out[l3] << 4) | (out[l3 + 1] >> 4);
            let tc = (level.dscp << 2) | (tc & 3);
            out[l3] = (out[l3] & 0xf0) | (tc >> 4);
            out[l3 + 1] = (out[l3 + 1] & 0x0f) | (tc << 4);
        } else {
            out[l3 + 1] = (level.dscp << 2) | (out[l3 + 1] & 3);
            csum = Some(l3 + 10);
        }
    }
    if level.flags & LEVEL_SET_PCP != 0
        && let Some(o) = layout.vlan_tci_off
    {
        out[o] = (out[o] & 0x1f) | (level.pcp << 5);
    }
    Expect::Class {
        class,
        out,
        csum,
        layout,
    }
}

/// The IPv4 header checksum over `hdr` (valid when the result is 0).
pub fn ip_checksum(hdr: &[u8]) -> u16 {
    let mut sum = 0u32;
    for c in hdr.chunks(2) {
        sum += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Sets the IPv4 header checksum of the header at `l3` (when the frame has IHL bytes there).
pub fn fix_ip_checksum(f: &mut [u8], l3: usize) {
    let Some(&b0) = f.get(l3) else { return };
    let ihl = ((b0 & 0x0f) as usize) * 4;
    if ihl < 20 || f.len() < l3 + ihl {
        return;
    }
    f[l3 + 10] = 0;
    f[l3 + 11] = 0;
    let c = ip_checksum(&f[l3..l3 + ihl]);
    f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
}

/// Whether the IPv4 header at `l3` has a valid checksum.
pub fn ip_checksum_ok(f: &[u8], l3: usize) -> bool {
    let ihl = ((f[l3] & 0x0f) as usize) * 4;
    ihl >= 20 && f.len() >= l3 + ihl && ip_checksum(&f[l3..l3 + ihl]) == 0
}

fn pick<T: Copy>(rng: &mut StdRng, xs: &[T]) -> T {
    xs[rng.random_range(0..xs.len())]
}

const V4_ADDRS: [[u8; 4]; 4] = [[10, 1, 2, 3], [10, 2, 0, 1], [192, 168, 1, 1], [10, 1, 255, 255]];
const V6_ADDRS: [[u8; 16]; 3] = [
    [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
    [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
    [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3],
];
const PORTS: [u16; 8] = [80, 53, 443, 999, 1000, 9, 0, 40000];

/// A well-formed frame: random family, tags, options or extension chain, transport.
/// Returns the frame and the offset of its IP header.
pub fn random_frame(rng: &mut StdRng) -> (Vec<u8>, usize) {
    let mut f = vec![0x02, 0, 0, 0, 0, 0x0b, 0x02, 0, 0, 0, 0, 0x0a];
    let tags = pick(rng, &[0usize, 0, 1, 1, 2, 2, 3]);
    for _ in 0..tags {
        f.extend_from_slice(&pick(rng, &[0x8100u16, 0x88a8, 0x9100]).to_be_bytes());
        f.extend_from_slice(&rng.random::<u16>().to_be_bytes());
    }
    let v6 = rng.random_bool(0.5);
    f.extend_from_slice(&(if v6 { 0x86ddu16 } else { 0x0800 }).to_be_bytes());
    let l3 = f.len();
    let proto = pick(rng, &[6u8, 6, 17, 17, 132, 1, 136, 47, 59]);
    let (sport, dport) = (pick(rng, &PORTS), pick(rng, &PORTS));
    let mut l4 = Vec::new();
    match proto {
        6 => {
            let doff = pick(rng, &[5u8, 5, 6, 8, 15]);
            l4.extend_from_slice(&sport.to_be_bytes());
            l4.extend_from_slice(&dport.to_be_bytes());
            l4.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, doff << 4, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
            l4.resize(doff as usize * 4, 1); // NOP options
        }
        17 | 136 => {
            l4.extend_from_slice(&sport.to_be_bytes());
            l4.extend_from_slice(&dport.to_be_bytes());
            l4.extend_from_slice(&[0, 8, 0, 0]);
        }
        132 => {
            l4.extend_from_slice(&sport.to_be_bytes());
            l4.extend_from_slice(&dport.to_be_bytes());
            l4.extend_from_slice(&[0; 8]);
        }
        1 => l4.extend_from_slice(&[8, 0, 0, 0, 0, 1, 0, 1]),
        _ => {}
    }
    let payload = rng.random_range(0..64usize);
    l4.extend(std::iter::repeat_n(0x5a, payload));
    let dscp = pick(rng, &[0u8, 34, 46, 10, 63]);
    let ecn = rng.random_range(0..4u8);
    if v6 {
        let mut ext: Vec<(u8, Vec<u8>)> = Vec::new();
        for _ in 0..pick(rng, &[0usize, 0, 0, 1, 2, 5, 6, 7, 8]) {
            let kind = pick(rng, &[0u8, 43, 60, 60, 44, 51]);
            let h = match kind {
                44 => {
                    let mut h = vec![0u8; 8];
                    let fo: u16 = pick(rng, &[0, 0, 1, 8, 9]);
                    h[2..4].copy_from_slice(&fo.to_be_bytes());
                    h
                }
                51 => {
                    let words = rng.random_range(1..5usize); // 12..24 bytes
                    let mut h = vec![0u8; (words + 2) * 4];
                    h[1] = words as u8;
                    h
                }
                _ => {
                    let len8 = pick(rng, &[0u8, 0, 1, 3]);
                    let mut h = vec![0u8; (len8 as usize + 1) * 8];
                    h[1] = len8;
                    h
                }
            };
            ext.push((kind, h));
        }
        let payload_len = ext.iter().map(|(_, h)| h.len()).sum::<usize>() + l4.len();
        let tc = (dscp << 2) | ecn;
        f.extend_from_slice(&[0x60 | (tc >> 4), (tc << 4) | 0x0a, 0xbc, 0xde]);
        f.extend_from_slice(&(payload_len as u16).to_be_bytes());
        f.push(ext.first().map_or(proto, |e| e.0));
        f.push(64);
        f.extend_from_slice(&pick(rng, &V6_ADDRS));
        f.extend_from_slice(&pick(rng, &V6_ADDRS));
        for i in 0..ext.len() {
            let next = ext.get(i + 1).map_or(proto, |e| e.0);
            ext[i].1[0] = next;
            f.extend_from_slice(&ext[i].1);
        }
    } else {
        let opts = rng.random_range(0..11usize) * 4 * usize::from(rng.random_bool(0.3));
        let ihl = 20 + opts;
        let total = (ihl + l4.len()) as u16;
        f.extend_from_slice(&[0x40 | (ihl / 4) as u8, (dscp << 2) | ecn]);
        f.extend_from_slice(&total.to_be_bytes());
        let frag: u16 = pick(rng, &[0x4000, 0x4000, 0, 0x2000, 0x0010, 0x2010]);
        f.extend_from_slice(&[0x12, 0x34]);
        f.extend_from_slice(&frag.to_be_bytes());
        f.extend_from_slice(&[64, proto, 0, 0]);
        f.extend_from_slice(&pick(rng, &V4_ADDRS));
        f.extend_from_slice(&pick(rng, &V4_ADDRS));
        f.extend(std::iter::repeat_n(1u8, opts)); // NOP options
        fix_ip_checksum(&mut f, l3);
    }
    f.extend_from_slice(&l4);
    // Ethernet padding to the 60-byte minimum, sometimes.
    if f.len() < 60 && rng.random_bool(0.3) {
        f.resize(60, 0);
    }
    (f, l3)
}

/// A random frame, mutated with probability `p_mutate`: truncated, a header field flipped
/// (version, IHL, lengths, ethertype, next header, data offset, any byte of the headers), the
/// IPv4 checksum fixed again most of the time.
pub fn mutated_frame(rng: &mut StdRng, p_mutate: f64) -> Vec<u8> {
    let (mut f, l3) = random_frame(rng);
    if !rng.random_bool(p_mutate) {
        return f;
    }
    for _ in 0..rng.random_range(1..3) {
        let hdr_end = f.len().min(l3 + 120);
        match rng.random_range(0..10) {
            // truncate anywhere past the Ethernet header
            0 | 1 => {
                let at = rng.random_range(14..=f.len());
                f.truncate(at);
            }
            // version nibble
            2 if f.len() > l3 => f[l3] = (rng.random_range(0..16u8) << 4) | (f[l3] & 0x0f),
            // IHL / traffic class nibble
            3 if f.len() > l3 => f[l3] = (f[l3] & 0xf0) | rng.random_range(0..16u8),
            // IPv4 total length / IPv6 flow label and payload length
            4 if f.len() > l3 + 5 => {
                let i = l3 + pick(rng, &[2usize, 3, 4, 5]);
                f[i] = pick(rng, &[0u8, 1, 0xff, f[i].wrapping_add(1), f[i].wrapping_sub(1)]);
            }
            // ethertype of the last tag / the frame
            5 if f.len() >= l3 => {
                let et = pick(rng, &[0x0800u16, 0x86dd, 0x8100, 0x88a8, 0x0806, 0x8847]);
                f[l3 - 2..l3].copy_from_slice(&et.to_be_bytes());
            }
            // IPv4 fragment field / IPv6 next header
            6 if f.len() > l3 + 7 => f[l3 + pick(rng, &[6usize, 7])] = rng.random(),
            // any header byte
            _ if hdr_end > 12 => {
                let i = rng.random_range(12..hdr_end);
                f[i] ^= 1 << rng.random_range(0..8);
            }
            _ => {}
        }
    }
    if rng.random_bool(0.9) && f.len() > l3 && f[l3] >> 4 == 4 {
        fix_ip_checksum(&mut f, l3);
    }
    f
}

/// A generator reproducible from its seed.
pub fn rng(seed: u64) -> StdRng {
    use rand::SeedableRng;
    StdRng::seed_from_u64(seed)
}
