//! A policy's rules in the forms the rest of compilation takes: the datapath's [`Rule`] (its
//! addresses as the datapath's words) and the text and origin `policy check` and traces print.

use ipnet::IpNet;
use paceline_common::classify::Rule;

use crate::protocols;
use crate::validate::{Family, RuleSpec};

/// 16 bytes of address and mask in network order, as the datapath's `[u32; 4]` (memory order
/// words). IPv4 is IPv4-mapped: `::ffff:a.b.c.d` with the prefix moved by 96 bits.
pub fn net_words(n: &IpNet) -> ([u32; 4], [u32; 4]) {
    let (bytes, prefix) = match n {
        IpNet::V4(v) => {
            let mut b = [0u8; 16];
            b[10] = 0xff;
            b[11] = 0xff;
            b[12..].copy_from_slice(&v.network().octets());
            (b, 96 + u32::from(v.prefix_len()))
        }
        IpNet::V6(v) => (v.network().octets(), u32::from(v.prefix_len())),
    };
    let mut mask = [0u8; 16];
    for (i, m) in mask.iter_mut().enumerate() {
        let start = i as u32 * 8;
        *m = if prefix >= start + 8 {
            0xff
        } else if prefix > start {
            0xffu8 << (8 - (prefix - start))
        } else {
            0
        };
    }
    let words = |b: [u8; 16]| {
        let mut w = [0u32; 4];
        for (i, c) in b.chunks_exact(4).enumerate() {
            w[i] = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
        }
        w
    };
    (words(bytes), words(mask))
}

pub(super) fn table_rule(r: &RuleSpec, class: u16) -> Rule {
    let mut t = Rule::any(class);
    if let Some(p) = r.protocol {
        t = t.with_proto(p);
    }
    if let Some(f) = r.family {
        t = t.with_family(f == Family::V6);
    }
    if let Some(n) = &r.src {
        let (a, m) = net_words(n);
        t = t.with_src(a, m);
    }
    if let Some(n) = &r.dst {
        let (a, m) = net_words(n);
        t = t.with_dst(a, m);
    }
    if let Some((lo, hi)) = r.src_port {
        t = t.with_sport(lo, hi);
    }
    if let Some((lo, hi)) = r.dst_port {
        t = t.with_dport(lo, hi);
    }
    if let Some(d) = r.dscp {
        t = t.with_dscp(d);
    }
    if let Some((v, m)) = r.mark {
        t = t.with_mark(v, m);
    }
    if let Some(c) = &r.cgroup {
        t = t.with_cgroup(c.id);
    }
    t
}

/// A rule's conditions as `policy check` and traces print them (`udp dst_port 80 dst
/// 10.0.0.0/8`), written into one string: a vector of formatted parts per rule was a third of
/// compiling 100,000 rules.
pub(super) fn rule_text(r: &RuleSpec) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let mut part = |args: std::fmt::Arguments| {
        if !out.is_empty() {
            out.push(' ');
        }
        let _ = out.write_fmt(args);
    };
    if let Some(p) = r.protocol {
        match protocols::name(p) {
            Some(name) => part(format_args!("{name}")),
            None => part(format_args!("proto {p}")),
        }
    }
    if let Some(f) = r.family
        && r.src.is_none()
        && r.dst.is_none()
        && !matches!(r.protocol, Some(1 | 58))
    {
        part(format_args!("{}", f.name()));
    }
    if let Some(n) = &r.src {
        part(format_args!("src {n}"));
    }
    // A port condition: one port, or a range.
    let ports = |part: &mut dyn FnMut(std::fmt::Arguments), name: &str, (lo, hi): (u16, u16)| {
        if lo == hi {
            part(format_args!("{name} {lo}"));
        } else {
            part(format_args!("{name} {lo}-{hi}"));
        }
    };
    if let Some(p) = r.src_port {
        ports(&mut part, "src_port", p);
    }
    if let Some(n) = &r.dst {
        part(format_args!("dst {n}"));
    }
    if let Some(p) = r.dst_port {
        ports(&mut part, "dst_port", p);
    }
    if let Some(d) = r.dscp {
        part(format_args!("dscp {d}"));
    }
    if let Some(c) = &r.cgroup {
        if c.id == 0 {
            part(format_args!("cgroup {} (unresolved)", c.path));
        } else {
            part(format_args!("cgroup {} (id {})", c.path, c.id));
        }
    }
    if let Some((v, m)) = r.mark {
        if m == u32::MAX {
            part(format_args!("mark {v:#x}"));
        } else {
            part(format_args!("mark {v:#x}/{m:#x}"));
        }
    }
    if out.is_empty() {
        out.push_str("any");
    }
    out
}

pub(super) fn rule_origin(r: &RuleSpec) -> String {
    let o = r.origin;
    match (r.src_entry, r.dst_entry) {
        (None, None) => format!("spec.rules[{o}]"),
        (Some(s), None) => format!("spec.rules[{o}] (src[{s}])"),
        (None, Some(d)) => format!("spec.rules[{o}] (dst[{d}])"),
        (Some(s), Some(d)) => format!("spec.rules[{o}] (src[{s}], dst[{d}])"),
    }
}
