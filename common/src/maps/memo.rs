//! Each CPU's class memo: the classes of the flows this CPU sent packets of lately, when a
//! flow's class keeps nothing per flow (no flow clock, no DASR share), so that their later
//! packets on this CPU take their class without the socket's storage or the flow table.
//! Re-exported by [`crate::maps`], whose rules it follows.

use core::mem::size_of;

/// One way of a CPU's class memo ([`ClassMemos`]).
///
/// A packet's class is a function of the policy and of the classifier's inputs alone (the
/// packet's addresses, ports, protocol, DSCP, mark, cgroup and unknown fields: `PacketInfo`),
/// so a memo that holds all of them answers exactly, whatever carries the packet:
/// - an **IPv4** packet's are held whole (its addresses take 8 bytes): a local socket's packet,
///   a forwarded or a container's packet (no socket), an unconnected socket's `sendto`, all the
///   same;
/// - an **IPv6** packet's addresses do not fit in 32 bytes: only a packet of a local socket that
///   is one flow with it is held, told by the socket's address (`skb->sk`, compared, never
///   dereferenced) and transmit hash (a socket freed and another made at that address draws a
///   new one), with its addresses folded ([`addr_fold`]: a connected UDP socket's `sendto` to
///   another destination with the same ports folds alike with odds of 1 in 2^32). Its cgroup is
///   the socket's, which does not change.
///
/// A packet with fields its program cannot see (`PacketInfo::unknown`: sock_ops' view; tc
/// sees them all) is never held.
/// 32 bytes: a memo of 64 (IPv6 addresses whole) cost 5-10 ns more a packet under real traffic.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ClassMemo {
    /// IPv4: the source address (high word) and the destination; IPv6: the socket's address.
    /// An empty way holds 0 and generation 0.
    pub who: u64,
    /// The low 32 bits of the policy generation `class` was computed under.
    pub generation: u32,
    /// IPv4: the packet's cgroup id (low word, high word; 0 unless the policy reads cgroups);
    /// IPv6: the socket's transmit hash and [`addr_fold`] of the packet's addresses.
    pub check: [u32; 2],
    pub mark: u32,
    /// `sport << 16 | dport`.
    pub ports: u32,
    pub class: u16,
    /// The DSCP, with [`MEMO_V6`] set in an IPv6 socket's way.
    pub dscp: u8,
    pub proto: u8,
}
const _: () = assert!(size_of::<ClassMemo>() == 32);

/// [`ClassMemo::dscp`]'s bit of an IPv6 socket's way (a DSCP has 6 bits): an IPv4 flow's way
/// never answers an IPv6 packet, nor the reverse, whatever `who` holds.
pub const MEMO_V6: u8 = 0x80;

/// What a way must hold for a packet beside its ports, protocol, mark and generation
/// ([`memo_key`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoKey {
    pub who: u64,
    pub check: [u32; 2],
    pub dscp: u8,
}

/// The memo's key of `pkt` (carried by the local socket at `sk` with transmit hash `txhash`,
/// `sk` 0 when it has none or it is not one flow with the packet): `None` when no way can hold
/// it (an IPv6 packet without such a socket, a packet with unknown fields).
#[inline(always)]
pub fn memo_key(pkt: &crate::classify::PacketInfo, sk: u64, txhash: u32) -> Option<MemoKey> {
    if pkt.unknown != 0 {
        return None;
    }
    if pkt.is_v6 == 0 {
        Some(MemoKey {
            who: (u64::from(pkt.src[3]) << 32) | u64::from(pkt.dst[3]),
            check: [pkt.cgroup_id as u32, (pkt.cgroup_id >> 32) as u32],
            dscp: pkt.dscp,
        })
    } else if sk != 0 {
        Some(MemoKey {
            who: sk,
            check: [txhash, addr_fold(&pkt.src, &pkt.dst)],
            dscp: pkt.dscp | MEMO_V6,
        })
    } else {
        None
    }
}

/// A packet's source and destination addresses folded into 32 bits, as a sum of their words
/// times distinct odd constants (mod 2^32): two address pairs that differ in one word never
/// fold alike (an odd multiplier is invertible), and pairs that differ in more do with odds of
/// 1 in 2^32.
#[inline(always)]
pub const fn addr_fold(src: &[u32; 4], dst: &[u32; 4]) -> u32 {
    src[0]
        .wrapping_mul(0x9e37_79b1)
        .wrapping_add(src[1].wrapping_mul(0x85eb_ca77))
        .wrapping_add(src[2].wrapping_mul(0xc2b2_ae3d))
        .wrapping_add(src[3].wrapping_mul(0x27d4_eb2f))
        .wrapping_add(dst[0].wrapping_mul(0x1656_67b1))
        .wrapping_add(dst[1].wrapping_mul(0xd3a2_646d))
        .wrapping_add(dst[2].wrapping_mul(0xfd70_46c5))
        .wrapping_add(dst[3].wrapping_mul(0xb55a_4f09))
}

impl ClassMemo {
    #[inline(always)]
    fn ports_of(pkt: &crate::classify::PacketInfo) -> u32 {
        (u32::from(pkt.sport) << 16) | u32::from(pkt.dport)
    }

    /// Remembers `class`, computed under policy `generation`, for packets like `pkt` with key
    /// `key`.
    #[inline(always)]
    pub fn set(&mut self, generation: u64, pkt: &crate::classify::PacketInfo, class: u32, key: &MemoKey) {
        self.who = key.who;
        self.generation = generation as u32;
        self.check = key.check;
        self.mark = pkt.mark;
        self.ports = Self::ports_of(pkt);
        self.class = class as u16;
        self.dscp = key.dscp;
        self.proto = pkt.proto;
    }

    /// The remembered class, if `pkt` (with key `key`) has the classifier's inputs the class
    /// was computed for, under the same policy.
    #[inline(always)]
    pub fn class_for(
        &self,
        generation: u64,
        pkt: &crate::classify::PacketInfo,
        key: &MemoKey,
    ) -> Option<u16> {
        (self.who == key.who
            && self.generation == generation as u32
            && self.check[0] == key.check[0]
            && self.check[1] == key.check[1]
            && self.ports == Self::ports_of(pkt)
            && self.proto == pkt.proto
            && self.mark == pkt.mark
            && self.dscp == key.dscp)
            .then_some(self.class)
    }
}

/// Ways of a CPU's class memo (a power of two).
pub const CLASS_MEMO_WAYS: usize = 256;
const _: () = assert!(CLASS_MEMO_WAYS.is_power_of_two());

/// A CPU's class memo beyond its last flow: [`CLASS_MEMO_WAYS`] ways of [`ClassMemo`], one flow
/// a way, chosen by the packet's ports (a server's flows differ in their peers' ports, a
/// client's in their own), so that a CPU that sends for many flows in turn keeps each one's
/// class (the last flow alone missed every packet of 64 sockets in turn). 8 KiB a CPU, at the
/// end of its state: a packet reads one way, and only when the last flow is not its own
/// ([`memo_class`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassMemos {
    pub ways: [ClassMemo; CLASS_MEMO_WAYS],
}

impl Default for ClassMemos {
    fn default() -> Self {
        ClassMemos {
            ways: [ClassMemo::default(); CLASS_MEMO_WAYS],
        }
    }
}

impl ClassMemos {
    /// The way a packet's flow takes: the top bits of its ports times the golden ratio
    /// (Fibonacci hashing: ports that run in sequence on either side, or on both, spread over
    /// the ways; an XOR of the two ports put `(p, q)` and `(p + 1, q + 1)` in one way).
    #[inline(always)]
    pub fn way(pkt: &crate::classify::PacketInfo) -> usize {
        let ports = (u32::from(pkt.sport) << 16) | u32::from(pkt.dport);
        (ports.wrapping_mul(0x9e37_79b1) >> (32 - CLASS_MEMO_WAYS.trailing_zeros())) as usize
            & (CLASS_MEMO_WAYS - 1)
    }
}

/// The class a CPU's memo holds for `pkt` (carried by the socket at `sk` with transmit hash
/// `txhash`, see [`memo_key`], under policy `generation`): the last flow's
/// ([`CpuState::memo`](super::CpuState::memo), beside the parsed packet), else its way's,
/// which then becomes the last flow's (a CPU sending one flow reads no line more than the
/// packet's own).
#[inline(always)]
pub fn memo_class(
    last: &mut ClassMemo,
    ways: &ClassMemos,
    generation: u64,
    pkt: &crate::classify::PacketInfo,
    sk: u64,
    txhash: u32,
) -> Option<u16> {
    let key = memo_key(pkt, sk, txhash)?;
    if let Some(c) = last.class_for(generation, pkt, &key) {
        return Some(c);
    }
    let c = ways.ways[ClassMemos::way(pkt)].class_for(generation, pkt, &key)?;
    last.set(generation, pkt, u32::from(c), &key);
    Some(c)
}

/// Remembers `class` for the flow's later packets on this CPU: as the last flow, and in its
/// way (the flow that held the way before is forgotten). `sk`: the packet's local socket when
/// it is one flow with the packet, else 0 (an IPv6 packet is then not remembered).
#[inline(always)]
pub fn memo_set(
    last: &mut ClassMemo,
    ways: &mut ClassMemos,
    generation: u64,
    pkt: &crate::classify::PacketInfo,
    class: u32,
    sk: u64,
    txhash: u32,
) {
    if let Some(key) = memo_key(pkt, sk, txhash) {
        last.set(generation, pkt, class, &key);
        ways.ways[ClassMemos::way(pkt)].set(generation, pkt, class, &key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::PacketInfo;
    use crate::maps::v4_mapped;

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

    /// The ways that differ from `p` in one classifier input each.
    fn others(p: PacketInfo) -> [(&'static str, PacketInfo); 9] {
        [
            ("mark", PacketInfo { mark: 8, ..p }),
            ("DSCP", PacketInfo { dscp: 0, ..p }),
            ("protocol", PacketInfo { proto: 6, ..p }),
            ("source port", PacketInfo { sport: 4001, ..p }),
            ("destination port", PacketInfo { dport: 5001, ..p }),
            (
                "cgroup",
                PacketInfo {
                    cgroup_id: 1 << 40,
                    ..p
                },
            ),
            ("unknown fields", PacketInfo { unknown: 1, ..p }),
            (
                "destination",
                PacketInfo {
                    dst: v4_mapped(u32::from_ne_bytes([10, 0, 0, 3])),
                    ..p
                },
            ),
            (
                "source",
                PacketInfo {
                    src: v4_mapped(u32::from_ne_bytes([10, 0, 0, 9])),
                    ..p
                },
            ),
        ]
    }

    /// An IPv4 flow's way holds for its classifier inputs and policy, and for nothing else,
    /// whichever socket (or none) carries its packets. Checked (2026-12-06): with the cgroup's
    /// check left out of the key, "another cgroup" failed.
    #[test]
    fn an_ipv4_way_holds_for_its_classifier_inputs_only() {
        let p = udp4();
        let mut m = ClassMemo::default();
        let key = |q: &PacketInfo, sk| memo_key(q, sk, 0xabcd);
        assert_eq!(
            m.class_for(7, &p, &key(&p, 0).unwrap()),
            None,
            "an empty way holds nothing"
        );
        m.set(7, &p, 3, &key(&p, 0).unwrap());
        assert_eq!(m.class_for(7, &p, &key(&p, 0).unwrap()), Some(3));
        assert_eq!(
            m.class_for(7, &p, &key(&p, 0xffff_8880_1234_5600).unwrap()),
            Some(3),
            "a socket's packet of the same flow"
        );
        assert_eq!(m.class_for(8, &p, &key(&p, 0).unwrap()), None, "another policy");
        for (what, q) in others(p) {
            let held = key(&q, 0).and_then(|k| m.class_for(7, &q, &k));
            assert_eq!(held, None, "another {what}");
        }
        // A packet with fields its program cannot see is never held.
        assert_eq!(memo_key(&PacketInfo { unknown: 1, ..p }, 0, 0), None);
    }

    /// An IPv6 packet is held only for a socket (address and transmit hash), its flow, policy,
    /// mark and DSCP; never for a packet without a socket, nor across families.
    #[test]
    fn an_ipv6_way_holds_for_its_socket_and_flow_only() {
        let v6 = |w1: u32| PacketInfo {
            src: [0x2001_0db8u32.to_be(), 0, 0, 1u32.to_be()],
            dst: [0x2001_0db8u32.to_be(), w1.to_be(), 0, 5u32.to_be()],
            is_v6: 1,
            ..udp4()
        };
        let p = v6(1);
        let (sk, hash) = (0xffff_8880_1234_5600, 0xabcd);
        assert_eq!(memo_key(&p, 0, 0), None, "no socket, no way");
        let mut m = ClassMemo::default();
        m.set(7, &p, 4, &memo_key(&p, sk, hash).unwrap());
        let held = |q: &PacketInfo, sk, hash| memo_key(q, sk, hash).and_then(|k| m.class_for(7, q, &k));
        assert_eq!(held(&p, sk, hash), Some(4));
        assert_eq!(held(&p, sk + 64, hash), None, "another socket");
        assert_eq!(
            held(&p, sk, hash + 1),
            None,
            "a socket made again at that address"
        );
        assert_eq!(held(&v6(2), sk, hash), None, "another IPv6 destination");
        for (what, q) in others(p) {
            if what == "cgroup" {
                continue; // a socket's cgroup does not change: not checked
            }
            let q = PacketInfo { is_v6: 1, ..q };
            assert_eq!(held(&q, sk, hash), None, "another {what}");
        }
        // An IPv4 packet whose key words happen to equal the socket's way never takes it.
        let mut v4 = udp4();
        v4.src[3] = (sk >> 32) as u32;
        v4.dst[3] = sk as u32;
        v4.cgroup_id = u64::from(hash) | (u64::from(addr_fold(&p.src, &p.dst)) << 32);
        assert_eq!(
            memo_key(&v4, 0, 0).map(|k| (k.who, k.check)),
            memo_key(&p, sk, hash).map(|k| (k.who, k.check))
        );
        assert_eq!(held(&v4, 0, 0), None, "an IPv4 packet in an IPv6 way");
    }

    /// A CPU's memo holds its last flow and one flow a way: flows whose ports fold to other ways
    /// are all held, one whose ports fold to a held flow's way takes its place (unless it is the
    /// last flow).
    #[test]
    fn the_memo_holds_a_flow_a_way() {
        let p = |sport: u16, dport: u16| PacketInfo {
            proto: 6,
            sport,
            dport,
            ..udp4()
        };
        let (mut last, mut ways) = (ClassMemo::default(), ClassMemos::default());
        // A server's flows: one local port, many peers' ports.
        for i in 0..64u16 {
            memo_set(&mut last, &mut ways, 1, &p(443, 40000 + i), u32::from(i), 0, 0);
        }
        for i in (0..64u16).rev() {
            let q = p(443, 40000 + i);
            assert_eq!(memo_class(&mut last, &ways, 1, &q, 0, 0), Some(i), "flow {i}");
            assert_eq!(
                last.ports,
                ClassMemo::ports_of(&q),
                "a way's hit becomes the last flow"
            );
        }
        let a = p(443, 40000);
        let other = (0..u16::MAX)
            .map(|d| p(443, d))
            .find(|q| q.dport != a.dport && ClassMemos::way(q) == ClassMemos::way(&a))
            .expect("ports in the same way");
        memo_set(&mut last, &mut ways, 1, &other, 99, 0, 0);
        assert_eq!(memo_class(&mut last, &ways, 1, &a, 0, 0), None, "its way taken");
        assert_eq!(memo_class(&mut last, &ways, 1, &other, 0, 0), Some(99));
        assert_eq!(
            memo_class(&mut last, &ways, 2, &other, 0, 0),
            None,
            "another policy"
        );
        // An IPv6 packet without a socket is not remembered.
        let v6 = PacketInfo {
            is_v6: 1,
            ..p(443, 1)
        };
        memo_set(&mut last, &mut ways, 1, &v6, 5, 0, 0);
        assert_eq!(memo_class(&mut last, &ways, 1, &v6, 0x9000, 0), None);
        assert!((0..u16::MAX).all(|d| ClassMemos::way(&p(d, 80)) < CLASS_MEMO_WAYS));
    }

    /// Address pairs that differ in one word never fold alike (each word's multiplier is odd).
    #[test]
    fn address_pairs_one_word_apart_fold_apart() {
        let base = ([1u32, 2, 3, 4], [5u32, 6, 7, 8]);
        let f0 = addr_fold(&base.0, &base.1);
        for word in 0..8 {
            for delta in [1u32, 2, 0x8000_0000, 0xffff_ffff, 0x1234_5678] {
                let (mut s, mut d) = base;
                if word < 4 {
                    s[word] = s[word].wrapping_add(delta);
                } else {
                    d[word - 4] = d[word - 4].wrapping_add(delta);
                }
                assert_ne!(addr_fold(&s, &d), f0, "word {word} moved by {delta:#x}");
            }
        }
        // Source and destination swapped fold apart too.
        assert_ne!(addr_fold(&base.1, &base.0), f0);
    }
}
