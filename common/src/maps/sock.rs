//! What the tc program keeps per local socket in its storage (`names::SOCK`): the flow clock
//! and the class with the inputs it was computed from. Re-exported by [`crate::maps`], whose
//! rules it follows.

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
    /// Which limit held the socket's last paced packet (as [`crate::maps::FlowState::binding`]).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::PacketInfo;

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
}
