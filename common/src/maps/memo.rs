//! Each CPU's class memo: the classes of the flows this CPU sent packets of lately, when a
//! flow's class keeps nothing per flow (no flow clock, no DASR share), so that their later
//! packets on this CPU take their class without the socket's storage or the flow table.
//! Re-exported by [`crate::maps`], whose rules it follows.
//!
//! A packet's class is a function of the policy and of the classifier's inputs alone (the
//! packet's addresses, ports, protocol, DSCP, mark, cgroup and unknown fields: `PacketInfo`),
//! so a memo that holds all of them, with the policy generation, answers exactly, whatever
//! carries the packet: a local socket, an unconnected socket's `sendto`, forwarded traffic, a
//! container's packets at the host's device. An IPv4 flow's inputs take a 32-byte way
//! ([`ClassMemo`]), an IPv6 flow's a 64-byte one ([`ClassMemo6`], in ways of their own). A
//! packet with fields its program cannot see (`PacketInfo::unknown`: sock_ops' view; tc sees
//! them all) is never held.

use core::mem::size_of;

use crate::classify::PacketInfo;

/// `sport << 16 | dport`.
#[inline(always)]
fn ports_of(pkt: &PacketInfo) -> u32 {
    (u32::from(pkt.sport) << 16) | u32::from(pkt.dport)
}

/// One way of a CPU's IPv4 class memo ([`ClassMemos`]): the class of an IPv4 flow and the
/// classifier's inputs it was computed for. 32 bytes: a way of 64 beside the parsed packet
/// cost 5-10 ns more a packet under real traffic.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ClassMemo {
    /// The source and destination addresses (network order, as `PacketInfo`'s last words).
    pub src: u32,
    pub dst: u32,
    /// 0 unless the policy reads cgroups.
    pub cgroup_id: u64,
    /// The low 32 bits of the policy generation `class` was computed under (0: empty).
    pub generation: u32,
    pub mark: u32,
    /// `sport << 16 | dport`.
    pub ports: u32,
    pub class: u16,
    pub dscp: u8,
    pub proto: u8,
}
const _: () = assert!(size_of::<ClassMemo>() == 32);

impl ClassMemo {
    /// Remembers `class`, computed under policy `generation` for the IPv4 packet `pkt`.
    #[inline(always)]
    pub fn set(&mut self, generation: u64, pkt: &PacketInfo, class: u32) {
        self.src = pkt.src[3];
        self.dst = pkt.dst[3];
        self.cgroup_id = pkt.cgroup_id;
        self.generation = generation as u32;
        self.mark = pkt.mark;
        self.ports = ports_of(pkt);
        self.class = class as u16;
        self.dscp = pkt.dscp;
        self.proto = pkt.proto;
    }

    /// The remembered class, if the IPv4 packet `pkt` has the classifier's inputs it was
    /// computed for, under the same policy.
    #[inline(always)]
    pub fn class_for(&self, generation: u64, pkt: &PacketInfo) -> Option<u16> {
        (self.src == pkt.src[3]
            && self.dst == pkt.dst[3]
            && self.generation == generation as u32
            && self.ports == ports_of(pkt)
            && self.proto == pkt.proto
            && self.mark == pkt.mark
            && self.dscp == pkt.dscp
            && self.cgroup_id == pkt.cgroup_id)
            .then_some(self.class)
    }
}

/// One way of a CPU's IPv6 class memo ([`ClassMemos6`]): [`ClassMemo`] with the addresses
/// whole.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ClassMemo6 {
    pub src: [u32; 4],
    pub dst: [u32; 4],
    pub cgroup_id: u64,
    /// The low 32 bits of the policy generation `class` was computed under (0: empty).
    pub generation: u32,
    pub mark: u32,
    pub ports: u32,
    pub class: u16,
    pub dscp: u8,
    pub proto: u8,
    pub _pad: [u32; 2],
}
const _: () = assert!(size_of::<ClassMemo6>() == 64);

impl ClassMemo6 {
    /// Remembers `class`, computed under policy `generation` for the IPv6 packet `pkt`.
    #[inline(always)]
    pub fn set(&mut self, generation: u64, pkt: &PacketInfo, class: u32) {
        self.src = pkt.src;
        self.dst = pkt.dst;
        self.cgroup_id = pkt.cgroup_id;
        self.generation = generation as u32;
        self.mark = pkt.mark;
        self.ports = ports_of(pkt);
        self.class = class as u16;
        self.dscp = pkt.dscp;
        self.proto = pkt.proto;
    }

    /// The remembered class, if the IPv6 packet `pkt` has the classifier's inputs it was
    /// computed for, under the same policy. (Word by word: an array's `==` may become a call
    /// of `bcmp`, which BPF has not.)
    #[inline(always)]
    pub fn class_for(&self, generation: u64, pkt: &PacketInfo) -> Option<u16> {
        let (s, d) = (&pkt.src, &pkt.dst);
        let addrs = (self.src[0] ^ s[0])
            | (self.src[1] ^ s[1])
            | (self.src[2] ^ s[2])
            | (self.src[3] ^ s[3])
            | (self.dst[0] ^ d[0])
            | (self.dst[1] ^ d[1])
            | (self.dst[2] ^ d[2])
            | (self.dst[3] ^ d[3]);
        (addrs == 0
            && self.generation == generation as u32
            && self.ports == ports_of(pkt)
            && self.proto == pkt.proto
            && self.mark == pkt.mark
            && self.dscp == pkt.dscp
            && self.cgroup_id == pkt.cgroup_id)
            .then_some(self.class)
    }
}

/// Ways of a CPU's IPv4 class memo (a power of two).
pub const CLASS_MEMO_WAYS: usize = 256;
/// Ways of a CPU's IPv6 class memo (a power of two).
pub const CLASS_MEMO6_WAYS: usize = 128;
const _: () = assert!(CLASS_MEMO_WAYS.is_power_of_two() && CLASS_MEMO6_WAYS.is_power_of_two());

/// The way of `n` (a power of two) a packet's flow takes: the top bits of its ports times the
/// golden ratio (Fibonacci hashing: ports that run in sequence on either side, or on both,
/// spread over the ways; an XOR of the two ports put `(p, q)` and `(p + 1, q + 1)` in one way).
/// A server's flows differ in their peers' ports, a client's in their own.
#[inline(always)]
fn way_of(pkt: &PacketInfo, n: usize) -> usize {
    (ports_of(pkt).wrapping_mul(0x9e37_79b1) >> (32 - n.trailing_zeros())) as usize & (n - 1)
}

/// `N` ways of a CPU's class memo (`N` a power of two), one flow a way, chosen by the packet's
/// ports ([`Ways::way`]), so that a CPU that sends for many flows in turn keeps each one's
/// class (the last flow alone missed every packet of 64 sockets in turn). A packet reads one
/// way.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ways<T, const N: usize> {
    pub ways: [T; N],
}

impl<T: Default + Copy, const N: usize> Default for Ways<T, N> {
    fn default() -> Self {
        Ways {
            ways: [T::default(); N],
        }
    }
}

impl<T, const N: usize> Ways<T, N> {
    /// The way a packet's flow takes.
    #[inline(always)]
    pub fn way(pkt: &PacketInfo) -> usize {
        way_of(pkt, N)
    }
}

/// A CPU's IPv4 ways beyond its last flow: 8 KiB, near the end of its state; read only when
/// the last flow is not the packet's ([`Memo::class`]).
pub type ClassMemos = Ways<ClassMemo, CLASS_MEMO_WAYS>;
/// A CPU's IPv6 ways (8 KiB); no last flow beside the parsed packet (its 64 bytes would make
/// every packet's first lines one more).
pub type ClassMemos6 = Ways<ClassMemo6, CLASS_MEMO6_WAYS>;

/// A CPU's class memo: the last IPv4 flow (beside the parsed packet), the IPv4 ways and the
/// IPv6 ways.
pub struct Memo<'a> {
    pub last: &'a mut ClassMemo,
    pub ways: &'a mut ClassMemos,
    pub ways6: &'a mut ClassMemos6,
}

impl Memo<'_> {
    /// The class the memo holds for `pkt` under policy `generation`: an IPv4 packet's from the
    /// last flow, else from its way, which then becomes the last flow (a CPU sending one flow
    /// reads no line more than the packet's own); an IPv6 packet's from its way.
    #[inline(always)]
    pub fn class(&mut self, generation: u64, pkt: &PacketInfo) -> Option<u16> {
        if pkt.unknown != 0 {
            return None;
        }
        if pkt.is_v6 != 0 {
            return self.ways6.ways[ClassMemos6::way(pkt)].class_for(generation, pkt);
        }
        if let Some(c) = self.last.class_for(generation, pkt) {
            return Some(c);
        }
        let c = self.ways.ways[ClassMemos::way(pkt)].class_for(generation, pkt)?;
        self.last.set(generation, pkt, u32::from(c));
        Some(c)
    }

    /// Remembers `class` for the flow's later packets on this CPU (an IPv4 flow as the last
    /// flow too); the flow that held its way before is forgotten.
    #[inline(always)]
    pub fn set(&mut self, generation: u64, pkt: &PacketInfo, class: u32) {
        if pkt.unknown != 0 {
            return;
        }
        if pkt.is_v6 != 0 {
            self.ways6.ways[ClassMemos6::way(pkt)].set(generation, pkt, class);
        } else {
            self.last.set(generation, pkt, class);
            self.ways.ways[ClassMemos::way(pkt)].set(generation, pkt, class);
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::maps::v4_mapped;
    use std::{
        boxed::Box,
        format,
        string::{String, ToString},
        vec,
        vec::Vec,
    };

    fn udp4() -> PacketInfo {
        PacketInfo {
            src: v4_mapped(u32::from_ne_bytes([10, 0, 0, 1])),
            dst: v4_mapped(u32::from_ne_bytes([10, 0, 0, 2])),
            mark: 9,
            dscp: 10,
            proto: 17,
            sport: 4000,
            dport: 5000,
            ..PacketInfo::default()
        }
    }

    fn udp6() -> PacketInfo {
        PacketInfo {
            src: [0x2001_0db8u32.to_be(), 0, 0, 1u32.to_be()],
            dst: [0x2001_0db8u32.to_be(), 1u32.to_be(), 0, 5u32.to_be()],
            is_v6: 1,
            ..udp4()
        }
    }

    /// The packets that differ from `p` in one classifier input each.
    fn others(p: PacketInfo) -> Vec<(String, PacketInfo)> {
        let mut v = vec![
            ("mark".to_string(), PacketInfo { mark: 8, ..p }),
            ("DSCP".into(), PacketInfo { dscp: 0, ..p }),
            ("protocol".into(), PacketInfo { proto: 6, ..p }),
            ("source port".into(), PacketInfo { sport: 4001, ..p }),
            ("destination port".into(), PacketInfo { dport: 5001, ..p }),
            (
                "cgroup".into(),
                PacketInfo {
                    cgroup_id: 1 << 40,
                    ..p
                },
            ),
            ("unknown fields".into(), PacketInfo { unknown: 1, ..p }),
        ];
        for w in 0..4 {
            let mut q = p;
            q.src[w] ^= 0x0100_0000;
            v.push((format!("source word {w}"), q));
            let mut q = p;
            q.dst[w] ^= 0x0100_0000;
            v.push((format!("destination word {w}"), q));
        }
        v
    }

    fn memo() -> (ClassMemo, Box<ClassMemos>, Box<ClassMemos6>) {
        Default::default()
    }

    /// A flow's way holds for its classifier inputs and policy, and for nothing else, in
    /// either family (an IPv4 packet's addresses are its last words: the others are the same
    /// for every IPv4 packet). Checked (2026-12-06): with the cgroup's check left out of
    /// `ClassMemo::class_for`, "another cgroup" failed for IPv4; with the third source word
    /// left out of `ClassMemo6::class_for`, "another source word 2" failed for IPv6.
    #[test]
    fn a_way_holds_for_its_classifier_inputs_only() {
        for p in [udp4(), udp6()] {
            let (mut last, mut ways, mut ways6) = memo();
            let mut m = Memo {
                last: &mut last,
                ways: &mut ways,
                ways6: &mut ways6,
            };
            assert_eq!(m.class(7, &p), None, "an empty memo holds nothing");
            m.set(7, &p, 3);
            assert_eq!(m.class(7, &p), Some(3));
            assert_eq!(m.class(8, &p), None, "another policy");
            for (what, q) in others(p) {
                if p.is_v6 == 0 && what.starts_with("source word") && what != "source word 3" {
                    continue; // not an IPv4 packet's
                }
                if p.is_v6 == 0 && what.starts_with("destination word") && what != "destination word 3" {
                    continue;
                }
                assert_eq!(m.class(7, &q), None, "another {what} (IPv6: {})", p.is_v6);
            }
            // A packet with fields its program cannot see is never held.
            let q = PacketInfo { unknown: 1, ..p };
            m.set(7, &q, 4);
            assert_eq!(m.class(7, &q), None);
        }
    }

    /// A CPU's memo holds its last IPv4 flow and one flow a way: flows whose ports fold to
    /// other ways are all held, one whose ports fold to a held flow's way takes its place
    /// (unless it is the last flow); the same for IPv6 flows, in their own ways.
    #[test]
    fn the_memo_holds_a_flow_a_way() {
        for base in [udp4(), udp6()] {
            let p = |sport: u16, dport: u16| PacketInfo {
                proto: 6,
                sport,
                dport,
                ..base
            };
            let (mut last, mut ways, mut ways6) = memo();
            let mut m = Memo {
                last: &mut last,
                ways: &mut ways,
                ways6: &mut ways6,
            };
            let way = |q: &PacketInfo| {
                if q.is_v6 != 0 {
                    ClassMemos6::way(q)
                } else {
                    ClassMemos::way(q)
                }
            };
            // A server's flows: one local port, many peers' ports (64: fewer than the ways).
            for i in 0..64u16 {
                m.set(1, &p(443, 40000 + i), u32::from(i));
            }
            for i in (0..64u16).rev() {
                let q = p(443, 40000 + i);
                assert_eq!(m.class(1, &q), Some(i), "flow {i} (IPv6: {})", base.is_v6);
                if base.is_v6 == 0 {
                    assert_eq!(m.last.ports, ports_of(&q), "a way's hit becomes the last flow");
                }
            }
            let a = p(443, 40000);
            let other = (0..u16::MAX)
                .map(|d| p(443, d))
                .find(|q| q.dport != a.dport && way(q) == way(&a))
                .expect("ports in the same way");
            m.set(1, &other, 99);
            assert_eq!(m.class(1, &a), None, "its way taken");
            assert_eq!(m.class(1, &other), Some(99));
            assert_eq!(m.class(2, &other), None, "another policy");
        }
        let p = |d: u16| PacketInfo { dport: d, ..udp4() };
        assert!((0..u16::MAX).all(|d| ClassMemos::way(&p(d)) < CLASS_MEMO_WAYS));
        assert!((0..u16::MAX).all(|d| ClassMemos6::way(&p(d)) < CLASS_MEMO6_WAYS));
    }
}
