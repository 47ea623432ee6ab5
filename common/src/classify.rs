//! What the classifier looks at ([`PacketInfo`]) and the linear first-match matcher over a rule
//! list ([`classify_linear`]).
//!
//! The datapath does not scan rules: it looks packets up in the compiled classifier
//! ([`crate::ctab`]), whose cost does not grow with the number of rules. The linear matcher is
//! the definition of what that lookup must answer: the tests compile random rule lists and
//! compare the two on random packets, and `paceline classify` names the rule that decided.

/// [`PacketInfo::unknown`]: the caller cannot see the packet's DSCP (sock_ops).
pub const UNKNOWN_DSCP: u8 = 1 << 0;
/// [`PacketInfo::unknown`]: the caller cannot see the socket's cgroup (sock_ops).
pub const UNKNOWN_CGROUP: u8 = 1 << 1;
/// [`PacketInfo::unknown`]: the caller cannot see the mark.
pub const UNKNOWN_MARK: u8 = 1 << 2;

/// What the classifier looks at. Addresses in network byte order, IPv4 mapped
/// (see [`crate::maps::v4_mapped`]); ports in host byte order (0 without ports).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacketInfo {
    pub src: [u32; 4],
    pub dst: [u32; 4],
    pub cgroup_id: u64,
    pub mark: u32,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub dscp: u8,
    /// 1 for IPv6, 0 for IPv4.
    pub is_v6: u8,
    /// Fields the caller could not observe: a rule that needs one of them does not match.
    pub unknown: u8,
    pub _pad: [u8; 4],
}
const _: () = assert!(core::mem::size_of::<PacketInfo>() == 56);

/// A flow's 5-tuple as seen on egress: the key of the per-flow table
/// ([`crate::maps::names::FLOWS`]) and of a trace's flow filter.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FlowKey {
    pub src: [u32; 4],
    pub dst: [u32; 4],
    /// Host byte order; 0 for protocols without ports.
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(core::mem::size_of::<FlowKey>() == 40);

/// One classification rule, as the linear reference matcher reads it
/// (`classify::rule_matches`): every condition is a masked compare; a zero mask or a full port
/// span means "any". Build rules with the `with_*` methods, which keep the derived fields
/// (`cgroup_mask`, `family_mask`, `needs`) consistent. The datapath never sees rules: the agent
/// compiles them into the classifier of [`crate::ctab`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    pub src: [u32; 4],
    pub src_mask: [u32; 4],
    pub dst: [u32; 4],
    pub dst_mask: [u32; 4],
    /// cgroup v2 id (the inode number of the cgroup directory).
    pub cgroup_id: u64,
    /// All ones when the rule matches on cgroup, else 0.
    pub cgroup_mask: u64,
    pub mark: u32,
    pub mark_mask: u32,
    /// Port ranges in host byte order as `min` and `max - min`: a port matches when
    /// `port.wrapping_sub(min) <= span`. `0` and `65535` match any port.
    pub sport_min: u16,
    pub sport_span: u16,
    pub dport_min: u16,
    pub dport_span: u16,
    pub proto: u8,
    /// `0xff` to match [`Rule::proto`], `0` for any protocol.
    pub proto_mask: u8,
    /// DSCP (6 bits) to match, with `dscp_mask` `0x3f`, or `0` for any.
    pub dscp: u8,
    pub dscp_mask: u8,
    /// 0 for IPv4, 1 for IPv6; compared when `family_mask` is 1.
    pub family: u8,
    pub family_mask: u8,
    /// The `classify::UNKNOWN_*` fields this rule needs: it cannot match a caller that does not
    /// see them (sock_ops sees no DSCP, cgroup or mark).
    pub needs: u8,
    /// 1 when the rule has address, mark or cgroup conditions (the datapath checks those only
    /// after the cheap protocol/port/DSCP conditions matched).
    pub deep: u8,
    /// Index into [`PolicyTable::classes`](crate::maps::PolicyTable::classes).
    pub class: u16,
    pub _pad1: [u8; 6],
}
const _: () = assert!(core::mem::size_of::<Rule>() == 112);

impl Rule {
    /// A rule that matches every packet and puts it in `class`.
    pub const fn any(class: u16) -> Self {
        Rule {
            src: [0; 4],
            src_mask: [0; 4],
            dst: [0; 4],
            dst_mask: [0; 4],
            cgroup_id: 0,
            cgroup_mask: 0,
            mark: 0,
            mark_mask: 0,
            sport_min: 0,
            sport_span: u16::MAX,
            dport_min: 0,
            dport_span: u16::MAX,
            proto: 0,
            proto_mask: 0,
            dscp: 0,
            dscp_mask: 0,
            family: 0,
            family_mask: 0,
            needs: 0,
            deep: 0,
            class,
            _pad1: [0; 6],
        }
    }

    /// Source address/mask: 16 bytes each in network order (IPv4 mapped).
    pub const fn with_src(mut self, addr: [u32; 4], mask: [u32; 4]) -> Self {
        self.src = addr;
        self.src_mask = mask;
        self.deep = 1;
        self
    }

    pub const fn with_dst(mut self, addr: [u32; 4], mask: [u32; 4]) -> Self {
        self.dst = addr;
        self.dst_mask = mask;
        self.deep = 1;
        self
    }

    /// Inclusive source port range (`lo <= hi`).
    pub const fn with_sport(mut self, lo: u16, hi: u16) -> Self {
        self.sport_min = lo;
        self.sport_span = hi.wrapping_sub(lo);
        self
    }

    /// Inclusive destination port range (`lo <= hi`).
    pub const fn with_dport(mut self, lo: u16, hi: u16) -> Self {
        self.dport_min = lo;
        self.dport_span = hi.wrapping_sub(lo);
        self
    }

    pub const fn with_proto(mut self, proto: u8) -> Self {
        self.proto = proto;
        self.proto_mask = 0xff;
        self
    }

    pub const fn with_dscp(mut self, dscp: u8) -> Self {
        self.dscp = dscp & 0x3f;
        self.dscp_mask = 0x3f;
        self.needs |= UNKNOWN_DSCP;
        self
    }

    pub const fn with_mark(mut self, mark: u32, mask: u32) -> Self {
        self.mark = mark & mask;
        self.mark_mask = mask;
        if mask != 0 {
            self.needs |= UNKNOWN_MARK;
            self.deep = 1;
        }
        self
    }

    pub const fn with_cgroup(mut self, id: u64) -> Self {
        self.cgroup_id = id;
        self.cgroup_mask = u64::MAX;
        self.needs |= UNKNOWN_CGROUP;
        self.deep = 1;
        self
    }

    /// Restrict to one family: `false` = IPv4, `true` = IPv6.
    pub const fn with_family(mut self, v6: bool) -> Self {
        self.family = v6 as u8;
        self.family_mask = 1;
        self
    }

    /// Does this rule look at the cgroup id (the datapath then fetches it)?
    pub const fn uses_cgroup(&self) -> bool {
        self.cgroup_mask != 0
    }
}

/// Does `r` match `p`? The cheap conditions (protocol, DSCP, family, ports: where the rules of
/// a policy usually differ) come first; addresses, mark and cgroup only for rules that have
/// them. Every condition is a masked compare folded into one OR, so a rule costs a handful of
/// branches whatever it contains (a branch per condition made 64 rules exceed the verifier's
/// budget).
#[inline(always)]
pub fn rule_matches(r: &Rule, p: &PacketInfo) -> bool {
    let scalars = ((p.proto ^ r.proto) & r.proto_mask)
        | ((p.dscp ^ r.dscp) & r.dscp_mask)
        | ((p.is_v6 ^ r.family) & r.family_mask)
        // A rule that needs a field the caller could not see does not match.
        | (p.unknown & r.needs);
    if scalars != 0
        || p.sport.wrapping_sub(r.sport_min) > r.sport_span
        || p.dport.wrapping_sub(r.dport_min) > r.dport_span
    {
        return false;
    }
    if r.deep == 0 {
        return true;
    }
    let w = |a: &[u32; 4], i: usize| (a[2 * i] as u64) | ((a[2 * i + 1] as u64) << 32);
    let mut diff = (p.cgroup_id ^ r.cgroup_id) & r.cgroup_mask;
    diff |= ((p.mark ^ r.mark) & r.mark_mask) as u64;
    let mut i = 0;
    while i < 2 {
        diff |= (w(&p.src, i) ^ w(&r.src, i)) & w(&r.src_mask, i);
        diff |= (w(&p.dst, i) ^ w(&r.dst, i)) & w(&r.dst_mask, i);
        i += 1;
    }
    diff == 0
}

/// The index of the first rule in `rules` that matches `p`, if any.
pub fn first_match(rules: &[Rule], p: &PacketInfo) -> Option<usize> {
    rules.iter().position(|r| rule_matches(r, p))
}

/// The class of `p`: the class of the first matching rule, else `default_class`.
pub fn classify_linear(rules: &[Rule], default_class: u32, p: &PacketInfo) -> u32 {
    first_match(rules, p).map_or(default_class, |i| u32::from(rules[i].class))
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use crate::maps::v4_mapped;

    fn v4(a: [u8; 4]) -> [u32; 4] {
        v4_mapped(u32::from_ne_bytes(a))
    }

    fn pkt_v4(src: [u8; 4], dst: [u8; 4], proto: u8, sport: u16, dport: u16) -> PacketInfo {
        PacketInfo {
            src: v4(src),
            dst: v4(dst),
            proto,
            sport,
            dport,
            ..Default::default()
        }
    }

    fn mask_v4(prefix: u32) -> [u32; 4] {
        // IPv4-mapped prefix /p is /(96+p) over the 128-bit address.
        let bits = 96 + prefix;
        let mut m = [0u32; 4];
        for (w, word) in m.iter_mut().enumerate() {
            let mut bytes = [0u8; 4];
            for (b, byte) in bytes.iter_mut().enumerate() {
                let start = (w * 32 + b * 8) as u32;
                *byte = if bits >= start + 8 {
                    0xff
                } else if bits > start {
                    0xffu8 << (8 - (bits - start))
                } else {
                    0
                };
            }
            *word = u32::from_ne_bytes(bytes);
        }
        m
    }

    struct Table {
        rules: Vec<Rule>,
        default_class: u32,
    }

    fn table(rules: &[Rule], default_class: u32) -> Table {
        Table {
            rules: rules.to_vec(),
            default_class,
        }
    }

    fn classify(t: &Table, p: &PacketInfo) -> u32 {
        classify_linear(&t.rules, t.default_class, p)
    }

    #[test]
    fn first_match_wins_and_default_applies() {
        let memcached = Rule::any(1).with_proto(6).with_dport(11211, 11211);
        let subnet = Rule::any(2).with_dst(v4([10, 1, 0, 0]), mask_v4(16));
        let t = table(&[memcached, subnet], 3);

        assert_eq!(
            classify(&t, &pkt_v4([10, 0, 0, 1], [10, 1, 2, 3], 6, 4000, 11211)),
            1
        );
        assert_eq!(
            classify(&t, &pkt_v4([10, 0, 0, 1], [10, 1, 2, 3], 17, 4000, 11211)),
            2
        );
        assert_eq!(
            classify(&t, &pkt_v4([10, 0, 0, 1], [10, 2, 2, 3], 17, 4000, 11211)),
            3
        );
    }

    #[test]
    fn v4_cidr_never_matches_v6() {
        let r = Rule::any(1).with_src(v4([0, 0, 0, 0]), mask_v4(0)); // 0.0.0.0/0 = "any IPv4"
        let t = table(&[r], 0);
        assert_eq!(classify(&t, &pkt_v4([1, 2, 3, 4], [5, 6, 7, 8], 6, 1, 2)), 1);
        let v6 = PacketInfo {
            src: [0x20010db8u32.to_be(), 0, 0, 1],
            is_v6: 1,
            ..Default::default()
        };
        assert_eq!(classify(&t, &v6), 0);
    }

    #[test]
    fn family_flags() {
        let r = Rule::any(1).with_family(true);
        let t = table(&[r], 0);
        assert_eq!(
            classify(
                &t,
                &PacketInfo {
                    is_v6: 1,
                    ..Default::default()
                }
            ),
            1
        );
        assert_eq!(
            classify(
                &t,
                &PacketInfo {
                    is_v6: 0,
                    ..Default::default()
                }
            ),
            0
        );
    }

    #[test]
    fn dscp_mark_cgroup() {
        let r = Rule::any(5).with_dscp(46).with_mark(0x100, 0xf00).with_cgroup(77);
        let t = table(&[r], 0);
        let p = PacketInfo {
            dscp: 46,
            mark: 0x1ff,
            cgroup_id: 77,
            ..Default::default()
        };
        assert_eq!(classify(&t, &p), 5);
        assert_eq!(classify(&t, &PacketInfo { cgroup_id: 78, ..p }), 0);
        assert_eq!(classify(&t, &PacketInfo { mark: 0x2ff, ..p }), 0);
        assert_eq!(classify(&t, &PacketInfo { dscp: 0, ..p }), 0);
    }

    #[test]
    fn unknown_fields_do_not_match_rules_that_need_them() {
        let needs_cgroup = Rule::any(1).with_cgroup(9);
        let port = Rule::any(2).with_dport(80, 80);
        let t = table(&[needs_cgroup, port], 0);
        let sock = PacketInfo {
            dport: 80,
            cgroup_id: 9,
            unknown: UNKNOWN_CGROUP | UNKNOWN_DSCP,
            ..Default::default()
        };
        assert_eq!(classify(&t, &sock), 2);
    }

    #[test]
    fn port_ranges_are_inclusive() {
        let r = Rule::any(1).with_sport(1000, 2000);
        let t = table(&[r], 0);
        for (port, class) in [(999, 0), (1000, 1), (2000, 1), (2001, 0)] {
            assert_eq!(
                classify(&t, &pkt_v4([0; 4], [0; 4], 6, port, 1)),
                class,
                "port {port}"
            );
        }
    }

    #[test]
    fn full_and_single_port_ranges() {
        let t = table(&[Rule::any(1).with_dport(0, 65535)], 0);
        for port in [0, 1, 80, 65535] {
            assert_eq!(classify(&t, &pkt_v4([0; 4], [0; 4], 6, 1, port)), 1);
        }
        let t = table(&[Rule::any(1).with_dport(65535, 65535)], 0);
        assert_eq!(classify(&t, &pkt_v4([0; 4], [0; 4], 6, 1, 65535)), 1);
        assert_eq!(classify(&t, &pkt_v4([0; 4], [0; 4], 6, 1, 0)), 0);
    }

    #[test]
    fn v4_only_rule() {
        let t = table(&[Rule::any(1).with_family(false)], 0);
        assert_eq!(classify(&t, &PacketInfo::default()), 1);
        assert_eq!(
            classify(
                &t,
                &PacketInfo {
                    is_v6: 1,
                    ..Default::default()
                }
            ),
            0
        );
    }
}
