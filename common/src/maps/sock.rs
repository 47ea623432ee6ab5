//! What the tc program keeps per local socket: its storage (`names::SOCK`: the flow clock and
//! the class with the inputs it was computed from), and each CPU's socket memo (the classes of
//! sockets whose class keeps nothing in that storage, told by the socket's address). Re-exported
//! by [`crate::maps`], whose rules they follow.

use core::mem::size_of;

/// What the tc program keeps per local TCP or connected UDP socket (socket storage,
/// `names::SOCK`): the socket's flow clock, and its class with the inputs it was computed
/// from. A TCP socket is one flow while connected (one 5-tuple, one cgroup), a UDP socket for
/// the datagrams it sends to its peer while connected (the tc program checks the packet's
/// 5-tuple against the socket's), so its packets skip classification while the policy
/// generation, mark, DSCP and the socket's transmit hash are those of the cached answer, and
/// its flow clock needs no hash lookup.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SockState {
    /// Earliest departure (CLOCK_MONOTONIC ns) of the socket's next packet.
    pub t_next: u64,
    /// The policy generation `class` was computed under (0: none yet).
    pub generation: u64,
    /// The mark and DSCP `class` was computed for.
    pub mark: u32,
    pub class: u16,
    pub dscp: u8,
    /// Which limit held the socket's last paced packet (as [`FlowState::binding`]).
    pub binding: u8,
    /// DASR: the share its receiver advertised, line / N (wire bytes/s; 0: none), set by the
    /// ingress program from the receiver's ACKs; it caps the flow clock (`crate::dasr::cap`).
    pub dasr_rate: u64,
    /// When the receiver last advertised a share (CLOCK_MONOTONIC ns).
    pub dasr_seen_ns: u64,
    /// Since when the receiver has advertised a share higher than `dasr_rate` (0: it has not;
    /// see `crate::dasr::follow`).
    pub dasr_raise_ns: u64,
    /// The socket's transmit hash when `class` was computed (`skb->hash` of its packets, which
    /// the kernel sets from `sk_txhash`): connecting a socket draws a new one, so a UDP socket
    /// connected again to another peer, or a TCP socket disconnected (`AF_UNSPEC`) and
    /// connected again, is classified again. TCP also draws a new one after a retransmission
    /// timeout, which costs one classification more. Two draws alike: 1 in 2^32.
    pub txhash: u32,
    pub _pad: u32,
}
// 56 bytes: with the 8-byte header of socket storage's (cache-line aligned) data, one line.
const _: () = assert!(size_of::<SockState>() == 56);

impl SockState {
    /// Caches `class`, computed under policy `generation` for `pkt`, sent while the socket's
    /// transmit hash was `txhash`; the clock and the DASR share are kept.
    #[inline(always)]
    pub fn set_class(&mut self, generation: u64, pkt: &crate::classify::PacketInfo, class: u32, txhash: u32) {
        self.generation = generation;
        self.mark = pkt.mark;
        self.dscp = pkt.dscp;
        self.class = class as u16;
        self.txhash = txhash;
    }

    /// The cached class, if it was computed under policy `generation` for a packet with this
    /// mark and DSCP, sent while the socket's transmit hash was `txhash`.
    #[inline(always)]
    pub fn class_for(&self, generation: u64, pkt: &crate::classify::PacketInfo, txhash: u32) -> Option<u16> {
        (self.generation == generation
            && self.mark == pkt.mark
            && self.dscp == pkt.dscp
            && self.txhash == txhash)
            .then_some(self.class)
    }
}

/// One way of a CPU's socket memo ([`SockMemos`]): the class of a socket this CPU sent a packet
/// of, when that class keeps nothing in the socket's storage per packet (no flow clock, no DASR
/// share): the socket's next packet on this CPU takes it from here without touching the socket
/// or its storage (a helper call and three dependent loads through the socket, which the stack
/// has usually evicted from the cache since the socket's last packet: 5-10 ns a packet under
/// real traffic for one socket, `plbench traffic`).
///
/// The socket is told by its address in the kernel (`skb->sk`, compared, never dereferenced)
/// and its transmit hash (a socket freed and another made at the same address draws a new
/// one); the packet must be the socket's flow as the packet that filled the memo was (the same
/// protocol, ports and addresses: a connected UDP socket may `sendto` elsewhere), and the
/// class must hold for it as [`SockState::class_for`] checks (policy generation, mark, DSCP).
/// 32 bytes: a memo of 64 (the addresses whole) cost 5-10 ns more a packet under real traffic.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SockMemo {
    /// The socket's address (an identity only; 0: empty).
    pub sk: u64,
    /// The low 32 bits of the policy generation `class` was computed under.
    pub generation: u32,
    pub txhash: u32,
    pub mark: u32,
    /// `sport << 16 | dport`.
    pub ports: u32,
    /// [`addr_fold`] of the packet's addresses.
    pub addrs: u32,
    pub class: u16,
    pub dscp: u8,
    pub proto: u8,
}
const _: () = assert!(size_of::<SockMemo>() == 32);

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

impl SockMemo {
    #[inline(always)]
    fn ports_of(pkt: &crate::classify::PacketInfo) -> u32 {
        (u32::from(pkt.sport) << 16) | u32::from(pkt.dport)
    }

    /// Remembers `class`, computed under policy `generation`, for the packets like `pkt` of the
    /// socket at `sk` while its transmit hash is `txhash`.
    #[inline(always)]
    pub fn set(
        &mut self,
        generation: u64,
        pkt: &crate::classify::PacketInfo,
        class: u32,
        sk: u64,
        txhash: u32,
    ) {
        self.sk = sk;
        self.generation = generation as u32;
        self.txhash = txhash;
        self.mark = pkt.mark;
        self.ports = Self::ports_of(pkt);
        self.addrs = addr_fold(&pkt.src, &pkt.dst);
        self.class = class as u16;
        self.dscp = pkt.dscp;
        self.proto = pkt.proto;
    }

    /// The remembered class, if `pkt`, sent by the socket at `sk` (nonzero) with transmit hash
    /// `txhash`, is another packet of the remembered socket's flow, under the same policy, mark
    /// and DSCP.
    #[inline(always)]
    pub fn class_for(
        &self,
        generation: u64,
        pkt: &crate::classify::PacketInfo,
        sk: u64,
        txhash: u32,
    ) -> Option<u16> {
        (sk != 0
            && self.sk == sk
            && self.txhash == txhash
            && self.generation == generation as u32
            && self.ports == Self::ports_of(pkt)
            && self.proto == pkt.proto
            && self.mark == pkt.mark
            && self.dscp == pkt.dscp
            && self.addrs == addr_fold(&pkt.src, &pkt.dst))
        .then_some(self.class)
    }
}

/// Ways of a CPU's socket memo (a power of two).
pub const SOCK_MEMO_WAYS: usize = 256;
const _: () = assert!(SOCK_MEMO_WAYS.is_power_of_two());

/// A CPU's socket memo beyond its last socket: [`SOCK_MEMO_WAYS`] ways of [`SockMemo`], one
/// socket a way, chosen by the packet's ports (a server's sockets differ in their peers' ports,
/// a client's in their own), so that a CPU that sends for many sockets in turn keeps each one's
/// class (the last socket alone missed every packet of 64 sockets in turn). 8 KiB a CPU, at
/// the end of its state: a packet reads one way, and only when the last socket is not its own
/// ([`memo_class`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SockMemos {
    pub ways: [SockMemo; SOCK_MEMO_WAYS],
}

impl Default for SockMemos {
    fn default() -> Self {
        SockMemos {
            ways: [SockMemo::default(); SOCK_MEMO_WAYS],
        }
    }
}

impl SockMemos {
    /// The way a packet's socket takes: the top bits of its ports times the golden ratio
    /// (Fibonacci hashing: ports that run in sequence on either side, or on both, spread over
    /// the ways; an XOR of the two ports put `(p, q)` and `(p + 1, q + 1)` in one way).
    #[inline(always)]
    pub fn way(pkt: &crate::classify::PacketInfo) -> usize {
        let ports = (u32::from(pkt.sport) << 16) | u32::from(pkt.dport);
        (ports.wrapping_mul(0x9e37_79b1) >> (32 - SOCK_MEMO_WAYS.trailing_zeros())) as usize
            & (SOCK_MEMO_WAYS - 1)
    }
}

/// The class a CPU's socket memo holds for `pkt` (sent by the socket at `sk` with transmit hash
/// `txhash`, under policy `generation`): the last socket's ([`CpuState::sock_memo`], beside
/// the parsed packet), else its way's, which then becomes the last socket's (a CPU sending
/// for one socket reads no line more than the packet's own).
#[inline(always)]
pub fn memo_class(
    last: &mut SockMemo,
    ways: &SockMemos,
    generation: u64,
    pkt: &crate::classify::PacketInfo,
    sk: u64,
    txhash: u32,
) -> Option<u16> {
    // A packet without a socket (forwarded, a container's) reads no way.
    if sk == 0 {
        return None;
    }
    if let Some(c) = last.class_for(generation, pkt, sk, txhash) {
        return Some(c);
    }
    let c = ways.ways[SockMemos::way(pkt)].class_for(generation, pkt, sk, txhash)?;
    last.set(generation, pkt, u32::from(c), sk, txhash);
    Some(c)
}

/// Remembers `class` for the socket's later packets on this CPU: as the last socket, and in its
/// way (the socket that held the way before is forgotten).
#[inline(always)]
pub fn memo_set(
    last: &mut SockMemo,
    ways: &mut SockMemos,
    generation: u64,
    pkt: &crate::classify::PacketInfo,
    class: u32,
    sk: u64,
    txhash: u32,
) {
    last.set(generation, pkt, class, sk, txhash);
    ways.ways[SockMemos::way(pkt)].set(generation, pkt, class, sk, txhash);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::PacketInfo;
    use crate::maps::v4_mapped;

    /// The cached class holds for the generation, mark, DSCP and transmit hash it was computed
    /// for, and for nothing else (a socket connected again has a new hash).
    #[test]
    fn a_socket_state_holds_for_what_it_was_computed_for() {
        let p = PacketInfo {
            mark: 9,
            dscp: 10,
            ..PacketInfo::default()
        };
        let mut st = SockState::default();
        assert_eq!(st.class_for(7, &p, 0x1234), None, "an empty state holds nothing");
        st.set_class(7, &p, 3, 0x1234);
        assert_eq!(st.class_for(7, &p, 0x1234), Some(3));
        assert_eq!(st.class_for(8, &p, 0x1234), None, "another policy");
        assert_eq!(st.class_for(7, &p, 0x1235), None, "connected again");
        assert_eq!(st.class_for(7, &PacketInfo { mark: 8, ..p }, 0x1234), None);
        assert_eq!(st.class_for(7, &PacketInfo { dscp: 0, ..p }, 0x1234), None);
    }

    /// The socket memo holds for the socket, flow, policy, mark and DSCP it was filled for, and
    /// for nothing else: another socket (address or transmit hash), another destination or
    /// source of the same socket (a connected UDP socket's `sendto`), other ports or protocol.
    /// Checked (2026-12-06): with the address fold's check patched out, "another destination"
    /// failed.
    #[test]
    fn a_socket_memo_holds_for_that_socket_and_flow_only() {
        let p = PacketInfo {
            src: v4_mapped(u32::from_ne_bytes([10, 0, 0, 1])),
            dst: v4_mapped(u32::from_ne_bytes([10, 0, 0, 2])),
            mark: 9,
            dscp: 10,
            proto: 17,
            sport: 4000,
            dport: 5000,
            ..PacketInfo::default()
        };
        let (sk, hash) = (0xffff_8880_1234_5600, 0xabcd);
        let mut m = SockMemo::default();
        assert_eq!(m.class_for(7, &p, sk, hash), None, "an empty memo holds nothing");
        assert_eq!(
            m.class_for(7, &p, 0, 0),
            None,
            "nor for a packet without a socket"
        );
        m.set(7, &p, 3, sk, hash);
        assert_eq!(m.class_for(7, &p, sk, hash), Some(3));
        assert_eq!(m.class_for(8, &p, sk, hash), None, "another policy");
        assert_eq!(m.class_for(7, &p, sk + 64, hash), None, "another socket");
        assert_eq!(
            m.class_for(7, &p, sk, hash + 1),
            None,
            "a socket made again at that address"
        );
        assert_eq!(m.class_for(7, &p, 0, hash), None, "no socket");
        for (what, q) in [
            ("mark", PacketInfo { mark: 8, ..p }),
            ("DSCP", PacketInfo { dscp: 0, ..p }),
            ("protocol", PacketInfo { proto: 6, ..p }),
            ("source port", PacketInfo { sport: 4001, ..p }),
            ("destination port", PacketInfo { dport: 5001, ..p }),
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
        ] {
            assert_eq!(m.class_for(7, &q, sk, hash), None, "another {what}");
        }
        // IPv6 destinations that differ only in a high word (same low word, same ports).
        let v6 = |w1: u32| PacketInfo {
            src: [0x2001_0db8u32.to_be(), 0, 0, 1u32.to_be()],
            dst: [0x2001_0db8u32.to_be(), w1.to_be(), 0, 5u32.to_be()],
            is_v6: 1,
            ..p
        };
        m.set(7, &v6(1), 4, sk, hash);
        assert_eq!(m.class_for(7, &v6(1), sk, hash), Some(4));
        assert_eq!(m.class_for(7, &v6(2), sk, hash), None, "another IPv6 destination");
    }

    /// A CPU's memo holds its last socket and one socket a way: sockets whose ports fold to
    /// other ways are all held, one whose ports fold to a held socket's way takes its place
    /// (unless it is the last socket).
    #[test]
    fn the_memo_holds_a_socket_a_way() {
        let p = |sport: u16, dport: u16| PacketInfo {
            proto: 6,
            sport,
            dport,
            ..PacketInfo::default()
        };
        let sk = |i: u16| 0x1000 + u64::from(i) * 2048;
        let (mut last, mut ways) = (SockMemo::default(), SockMemos::default());
        // A server's sockets: one local port, many peers' ports.
        for i in 0..64u16 {
            memo_set(
                &mut last,
                &mut ways,
                1,
                &p(443, 40000 + i),
                u32::from(i),
                sk(i),
                7,
            );
        }
        for i in (0..64u16).rev() {
            assert_eq!(
                memo_class(&mut last, &ways, 1, &p(443, 40000 + i), sk(i), 7),
                Some(i),
                "socket {i}"
            );
            assert_eq!(last.sk, sk(i), "a way's hit becomes the last socket");
        }
        let a = p(443, 40000);
        let other = (0..u16::MAX)
            .map(|d| p(443, d))
            .find(|q| q.dport != a.dport && SockMemos::way(q) == SockMemos::way(&a))
            .expect("ports in the same way");
        memo_set(&mut last, &mut ways, 1, &other, 99, 0x9000, 7);
        assert_eq!(
            memo_class(&mut last, &ways, 1, &a, sk(0), 7),
            None,
            "its way taken"
        );
        assert_eq!(memo_class(&mut last, &ways, 1, &other, 0x9000, 7), Some(99));
        assert_eq!(
            memo_class(&mut last, &ways, 2, &other, 0x9000, 7),
            None,
            "another policy"
        );
        assert!((0..u16::MAX).all(|d| SockMemos::way(&p(d, 80)) < SOCK_MEMO_WAYS));
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
