//! The flow table's types (`names::FLOWS`, `names::ADMIT`): the key, the entry with its
//! cached class, and the admission slots a flow's first packet leaves its clock in. Re-exported
//! by [`crate::maps`], whose rules they follow.

use core::mem::size_of;

use super::MAX_CLASSES;

/// Entries of [`names::ADMIT`](super::names::ADMIT) (a power of two): 16,384 slots of 16 bytes, 256 KiB.
pub const ADMIT_SLOTS: u32 = 16_384;
const _: () = assert!(ADMIT_SLOTS.is_power_of_two());

/// A flow without a local TCP or connected UDP socket enters the flow table on its second
/// packet, not its first. Its first packet leaves its flow clock here, in the slot its key hashes to
/// ([`admit_index`]), tagged with the key's hash ([`admit_tag`]); the second (on any CPU)
/// finds it, continues from that clock and enters the table. A flood of one-packet flows (a
/// scan, a SYN or DNS flood, a burst of new connections through a router) then costs no insert
/// and evicts no established flow: each first packet overwrites one slot. A slot overwritten
/// between a flow's first and second packets only delays its entry by a packet, with its clock
/// started afresh (that packet may leave up to one packet time early). The slot's clock is
/// written before its tag and read after it; two CPUs writing one slot in the same few
/// nanoseconds can still pair one flow's tag with the other's clock, which gives that flow's
/// next packet the other's first-packet departure (no more than the horizon away).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AdmitSlot {
    /// [`admit_tag`] of the flow's key; 0: empty (a tag is never 0).
    pub tag: u64,
    /// The flow clock its first packet left (CLOCK_MONOTONIC ns).
    pub t_next: u64,
}
const _: () = assert!(size_of::<AdmitSlot>() == 16);

/// A 64-bit hash of a flow key, never 0: five 64-bit words, each folded in with a multiply and
/// a shift, then SplitMix64's finalizer. Cheap in BPF (no loop, no helper); two keys
/// share a tag with probability 2^-63, and then only one flow's entry starts from the other's
/// clock.
#[inline(always)]
pub fn admit_tag(k: &FlowKey) -> u64 {
    admit_tag_of(&k.src, &k.dst, k.sport, k.dport, k.proto)
}

/// [`admit_tag`] of the flow with these fields (what the datapath computes from the parsed
/// packet, without writing out a [`FlowKey`]).
#[inline(always)]
pub fn admit_tag_of(src: &[u32; 4], dst: &[u32; 4], sport: u16, dport: u16, proto: u8) -> u64 {
    let w = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
    let ports = u64::from(sport) | (u64::from(dport) << 16) | (u64::from(proto) << 32);
    let words = [
        w(src[0], src[1]),
        w(src[2], src[3]),
        w(dst[0], dst[1]),
        w(dst[2], dst[3]),
        ports,
    ];
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut i = 0;
    while i < words.len() {
        h = (h ^ words[i]).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 31;
        i += 1;
    }
    // SplitMix64's finalizer: every input bit reaches the high bits the slot index takes.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    h | 1
}

/// The [`names::ADMIT`](super::names::ADMIT) slot of a tag.
#[inline(always)]
pub fn admit_index(tag: u64) -> u32 {
    (tag >> 32) as u32 & (ADMIT_SLOTS - 1)
}

/// Values of the tc program's load-time global `PL_BENCH_FLOW_MISS` (the datapath benchmark
/// only; the agent leaves it 0): every flow-table lookup taken for a miss, the flow classified
/// and, its admission slot holding it since the first run, entered again, replacing the
/// previous run's entry: a flow's second packet (entry and bucket in cache, nothing evicted).
pub const BENCH_FLOW_REPLACE: u32 = 1;
/// Each run a new flow: the source address's first and last words are XORed with this CPU's
/// count of first packets and inserts (one of them counts every such run), so the lookup
/// misses and the admission slot never holds the flow: every run is a new flow's first packet,
/// as under a flood of new flows.
pub const BENCH_FLOW_NEW: u32 = 2;

/// Key of the per-flow table (defined beside the packet view it is cut from).
pub use crate::classify::FlowKey;

/// The flow table's key: 16 bytes, where a [`FlowKey`] has 40, because the table's lookup
/// hashes and compares its whole key. With the key written as four word stores
/// ([`FlowTableKey::words_for`]) a later packet from the table cost 9-10 ns less over the floor
/// (58 against 67, alternated builds); the 40-byte key written as words, or this key written
/// field by field, gained nothing. An IPv4 flow's key holds its addresses
/// and is exact. An IPv6 flow's holds a 64-bit hash of its 5-tuple instead ([`admit_tag`]'s),
/// and its entry holds the addresses ([`FlowState::src`], [`FlowState::dst`]), which the
/// datapath compares on every hit: two IPv6 flows whose hashes meet (with the same ports and
/// protocol) take turns in one entry, each classified again when it finds the other's, and
/// neither ever takes the other's class or clock.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FlowTableKey {
    /// IPv4: the source and destination addresses (network order); IPv6: the 5-tuple's hash,
    /// low and high words.
    pub a: u32,
    pub b: u32,
    /// Host byte order; 0 for protocols without ports.
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    /// 1 for IPv6.
    pub v6: u8,
    pub _pad: [u8; 2],
}
const _: () = assert!(size_of::<FlowTableKey>() == 16);

impl FlowTableKey {
    /// The table key of the flow `k` (`v6`: an IPv6 flow; an IPv4 flow's addresses are
    /// IPv4-mapped in `k`).
    #[inline(always)]
    pub fn of(k: &FlowKey, v6: bool) -> FlowTableKey {
        let [a, b, ..] = Self::words_of(k, v6);
        FlowTableKey {
            a,
            b,
            sport: k.sport,
            dport: k.dport,
            proto: k.proto,
            v6: v6 as u8,
            _pad: [0; 2],
        }
    }

    /// [`FlowTableKey::of`] as the four 32-bit words of its layout, built with arithmetic:
    /// the datapath writes the key as four word stores, so that the map's hash, which reads
    /// it a word at a time, does not wait for byte and half-word stores to reach the cache
    /// (a store cannot be forwarded to a wider load). Little-endian layout (x86, arm64, bpfel).
    #[inline(always)]
    pub fn words_of(k: &FlowKey, v6: bool) -> [u32; 4] {
        Self::words_for(&k.src, &k.dst, k.sport, k.dport, k.proto, v6)
    }

    /// [`FlowTableKey::words_of`] of the flow with these fields (what the datapath computes
    /// from the parsed packet): an IPv4 flow's addresses (the last words of their IPv4-mapped
    /// form), an IPv6 flow's 5-tuple hash; then ports, protocol and family.
    #[inline(always)]
    pub fn words_for(
        src: &[u32; 4],
        dst: &[u32; 4],
        sport: u16,
        dport: u16,
        proto: u8,
        v6: bool,
    ) -> [u32; 4] {
        let (a, b) = if v6 {
            let h = admit_tag_of(src, dst, sport, dport, proto);
            (h as u32, (h >> 32) as u32)
        } else {
            (src[3], dst[3])
        };
        [
            a,
            b,
            u32::from(sport) | (u32::from(dport) << 16),
            u32::from(proto) | (u32::from(v6) << 8),
        ]
    }

    /// The flow an entry belongs to: its ports and protocol from the key, its addresses from
    /// the entry (both families store them there).
    pub fn flow(&self, s: &FlowState) -> FlowKey {
        FlowKey {
            src: s.src,
            dst: s.dst,
            sport: self.sport,
            dport: self.dport,
            proto: self.proto,
            _pad: [0; 3],
        }
    }
}

/// Per-flow state of traffic without a local TCP or connected UDP socket (unconnected UDP,
/// forwarded traffic, a container's packets at the host's device): the flow clock, and the flow's class with the
/// inputs it was computed from, so that the flow's later packets skip classification
/// ([`FlowState::class_for`]). The class is keyed like [`SockState`](super::SockState)'s, and also on the cgroup
/// and on the fields the packet did not show: the 5-tuple alone does not fix them.
///
/// Several CPUs may send one flow's packets at once, and nothing locks an entry. The class and
/// the generation of the policy it belongs to share one word ([`FlowState::class_gen`]),
/// written and read in one access, so a packet never takes one policy's class index into
/// another policy's table. The other inputs are written before that word; a flow whose packets
/// carry two marks (or DSCPs, or cgroups) on two CPUs at the same instant may have one packet
/// take the class computed for the other's, a class of the policy in force.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FlowState {
    /// Earliest departure (CLOCK_MONOTONIC ns) of the flow's next packet.
    pub t_next: u64,
    /// A rate that overrides the class's per-flow rate (bytes/s), e.g. a D3 grant; 0 = none.
    pub rate_override: u64,
    /// `generation << 16 | class`: the class and the policy generation (its low 48 bits) it
    /// was computed under; 0: none.
    pub class_gen: u64,
    /// The cgroup id the class was computed for (0 when the policy matches no cgroup).
    pub cgroup_id: u64,
    /// The mark, DSCP and unknown-field bits (`PacketInfo::unknown`) the class was computed for.
    pub mark: u32,
    pub dscp: u8,
    pub unknown: u8,
    /// Which limit held the flow's last paced packet (a `crate::trace::binding` value, from
    /// `crate::trace::held_binding`; 0: none paced yet), for `paceline flows`.
    pub binding: u8,
    pub _pad: u8,
    /// The flow's addresses (IPv4-mapped for IPv4), written when the entry is made: an IPv6
    /// flow's key holds only their hash (see [`FlowTableKey`]), and `paceline flows` reads
    /// them back from here for both families.
    pub src: [u32; 4],
    pub dst: [u32; 4],
}
const _: () = assert!(size_of::<FlowState>() == 72);
const _: () = assert!(MAX_CLASSES <= 1 << 16);

impl FlowState {
    /// [`FlowState::class_gen`] of `class` under policy `generation`.
    #[inline(always)]
    pub const fn class_gen(generation: u64, class: u32) -> u64 {
        (generation << 16) | (class as u64 & 0xffff)
    }

    /// The cached class, if it was computed under policy `generation` (whatever packet it was
    /// computed for: `paceline flows` reads it this way).
    #[inline(always)]
    pub fn class_under(&self, generation: u64) -> Option<u32> {
        // One load of the word: class and generation from the same write.
        let cg = self.class_gen;
        (cg >> 16 == generation & ((1 << 48) - 1) && generation != 0).then_some((cg & 0xffff) as u32)
    }

    /// The cached class, if it was computed under policy `generation` for a packet with
    /// `pkt`'s mark, DSCP, cgroup and unknown fields (the 5-tuple is the table's key).
    #[inline(always)]
    pub fn class_for(&self, generation: u64, pkt: &crate::classify::PacketInfo) -> Option<u32> {
        let class = self.class_under(generation)?;
        (self.mark == pkt.mark
            && self.dscp == pkt.dscp
            && self.unknown == pkt.unknown
            && self.cgroup_id == pkt.cgroup_id)
            .then_some(class)
    }

    /// Caches `class`, computed under policy `generation` for `pkt` (the inputs first, the
    /// class last); the clock is kept.
    #[inline(always)]
    pub fn set_class(&mut self, generation: u64, pkt: &crate::classify::PacketInfo, class: u32) {
        self.cgroup_id = pkt.cgroup_id;
        self.mark = pkt.mark;
        self.dscp = pkt.dscp;
        self.unknown = pkt.unknown;
        // SAFETY: a field of a live value; volatile keeps the store one access, and last.
        unsafe { core::ptr::write_volatile(&mut self.class_gen, Self::class_gen(generation, class)) };
    }
}

#[cfg(test)]
mod flow_state_tests {
    use super::*;
    use crate::classify::PacketInfo;
    use crate::maps::v4_mapped;

    /// Every field of the key moves the tag; a tag is never 0 (an empty slot); 100,000 flows
    /// that differ in their ports spread over the slots about evenly. Checked (2026-12-05):
    /// without the finalizer, 22% of the slots stayed empty and this failed.
    #[test]
    fn admission_tags_tell_keys_apart_and_spread_over_the_slots() {
        let k = FlowKey {
            src: [0, 0, 0xffff_0000u32.to_be(), 0x0a00_0001u32.to_be()],
            dst: [0, 0, 0xffff_0000u32.to_be(), 0x0a00_0002u32.to_be()],
            sport: 40000,
            dport: 53,
            proto: 17,
            _pad: [0; 3],
        };
        let t = admit_tag(&k);
        assert_eq!(t, admit_tag(&k.clone()), "a function of the key");
        let variants = [
            FlowKey {
                src: [1, 0, 0xffff_0000u32.to_be(), 0x0a00_0001u32.to_be()],
                ..k
            },
            FlowKey {
                src: [0, 0, 0xffff_0000u32.to_be(), 0x0a00_0003u32.to_be()],
                ..k
            },
            FlowKey {
                dst: [0, 0, 0xffff_0000u32.to_be(), 0x0a00_0001u32.to_be()],
                ..k
            },
            FlowKey { sport: 40001, ..k },
            FlowKey { dport: 54, ..k },
            FlowKey { proto: 6, ..k },
        ];
        for v in variants {
            assert_ne!(admit_tag(&v), t, "{v:?}");
        }
        let mut per_slot = [0u32; ADMIT_SLOTS as usize];
        let n = 100_000u32;
        for i in 0..n {
            let tag = admit_tag(&FlowKey {
                sport: i as u16,
                dport: (i >> 16) as u16,
                ..k
            });
            assert_ne!(tag, 0);
            per_slot[admit_index(tag) as usize] += 1;
        }
        let mean = n as f64 / ADMIT_SLOTS as f64;
        let max = *per_slot.iter().max().unwrap() as f64;
        let empty = per_slot.iter().filter(|c| **c == 0).count() as f64 / ADMIT_SLOTS as f64;
        // A uniform spread: about e^-mean of the slots empty (0.2%), none far above the mean.
        assert!(max < 4.0 * mean, "max {max} against a mean of {mean}");
        assert!(empty < 0.01, "{empty} of the slots empty");
    }

    /// The table key's words are its layout (the datapath writes the words, user space reads
    /// the struct); an IPv4 key holds its addresses and tells every field apart, an IPv6 key
    /// its hash; an entry gives back its flow. Checked (2026-12-05): with the ports swapped in
    /// `words_of`, this failed.
    #[test]
    fn flow_table_keys_are_their_words_and_give_their_flow_back() {
        let v4 = FlowKey {
            src: v4_mapped(u32::from_ne_bytes([10, 0, 0, 1])),
            dst: v4_mapped(u32::from_ne_bytes([10, 0, 0, 2])),
            sport: 40000,
            dport: 53,
            proto: 17,
            _pad: [0; 3],
        };
        let mut v6 = v4;
        v6.src = [0xfd, 0, 0, 1u32.to_be()];
        v6.dst = [0xfd, 0, 0, 2u32.to_be()];
        for (k, is6) in [(v4, false), (v6, true)] {
            let t = FlowTableKey::of(&k, is6);
            // SAFETY: 16 bytes of integers, every bit pattern valid.
            let words: [u32; 4] = unsafe { core::mem::transmute(t) };
            assert_eq!(words, FlowTableKey::words_of(&k, is6), "{k:?}");
            let s = FlowState {
                src: k.src,
                dst: k.dst,
                ..FlowState::default()
            };
            assert_eq!(t.flow(&s), k);
        }
        let t = FlowTableKey::of(&v4, false);
        assert_eq!((t.a, t.b, t.v6), (v4.src[3], v4.dst[3], 0));
        assert_eq!(FlowTableKey::of(&v6, true).v6, 1);
        let variants = [
            FlowKey {
                src: v4_mapped(u32::from_ne_bytes([10, 0, 0, 3])),
                ..v4
            },
            FlowKey {
                dst: v4_mapped(u32::from_ne_bytes([10, 0, 0, 1])),
                ..v4
            },
            FlowKey { sport: 40001, ..v4 },
            FlowKey { dport: 54, ..v4 },
            FlowKey { proto: 6, ..v4 },
        ];
        for k in variants {
            assert_ne!(FlowTableKey::of(&k, false), t, "{k:?}");
        }
        let t6 = FlowTableKey::of(&v6, true);
        let variants6 = [
            FlowKey {
                src: [0xfd, 0, 0, 3u32.to_be()],
                ..v6
            },
            FlowKey {
                dst: [0xfd, 0, 0, 1u32.to_be()],
                ..v6
            },
            FlowKey { sport: 40001, ..v6 },
            FlowKey { dport: 54, ..v6 },
            FlowKey { proto: 6, ..v6 },
        ];
        for k in variants6 {
            assert_ne!(FlowTableKey::of(&k, true), t6, "{k:?}");
        }
    }

    #[test]
    fn a_cached_class_holds_only_for_its_policy_and_its_packet_fields() {
        let pkt = PacketInfo {
            mark: 7,
            dscp: 46,
            cgroup_id: 99,
            ..Default::default()
        };
        let mut f = FlowState {
            t_next: 123,
            ..Default::default()
        };
        assert_eq!(f.class_for(1, &pkt), None, "nothing cached yet");
        f.set_class(5, &pkt, 1023);
        assert_eq!(f.class_for(5, &pkt), Some(1023));
        assert_eq!(f.t_next, 123, "the clock is kept");
        assert_eq!(f.class_for(6, &pkt), None, "another policy");
        for other in [
            PacketInfo { mark: 8, ..pkt },
            PacketInfo { dscp: 0, ..pkt },
            PacketInfo { cgroup_id: 0, ..pkt },
            PacketInfo { unknown: 1, ..pkt },
        ] {
            assert_eq!(f.class_for(5, &other), None, "{other:?}");
        }
        // Generations beyond 48 bits compare on their low 48 (2^48 policy writes apart).
        f.set_class(1 << 48 | 5, &pkt, 2);
        assert_eq!(f.class_for(5, &pkt), Some(2));
    }
}
