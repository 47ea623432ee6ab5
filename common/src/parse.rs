//! The packet parser: the one the tc program runs, written once and generic over [`Frame`] (how
//! bytes are read), so the kernel (direct packet access and `bpf_skb_load_bytes`) and user space
//! (a byte slice: unit tests, fuzzing, the differential test that runs the real program) run the
//! same code.
//!
//! What it accepts, and what each refusal is counted as (`GlobalCounters`, exported as
//! `paceline_unparsed_packets_total{reason}`):
//! - Ethernet, then at most two VLAN tags in the data (802.1Q `0x8100`, 802.1ad `0x88a8`, the
//!   pre-standard `0x9100`, in any order: QinQ). The PCP the datapath rewrites is the outer
//!   tag's ([`Layout::vlan_tci_off`]), the one the next switch reads; a tag the NIC accelerates
//!   (in skb metadata, not in the data) is outside the first data tag, so it is that one.
//!   Another ethertype, or a third tag: [`Unparsed::NonIp`].
//! - IPv4: version 4, header length >= 20 bytes and <= the total length; the total length must
//!   fit the frame (a longer frame is Ethernet padding). IPv6: version 6, the payload length must
//!   fit the frame. A GSO packet with a zero length (BIG TCP, over 64 KB) takes the frame's.
//!   Contradictions: [`Unparsed::Malformed`]; too short: [`Unparsed::Truncated`].
//! - IPv6 extension headers: hop-by-hop, routing, destination options, fragment and AH, at most
//!   [`MAX_V6_EXT`] of them, the transport header starting within [`MAX_L4_OFF`] bytes; more:
//!   [`Unparsed::V6ExtLimit`]. Each must end within the payload length.
//! - Fragments (IPv4 MF or offset, IPv6 fragment header with M or offset; not an atomic IPv6
//!   fragment) are classified on their IP header alone, ports 0, all fragments of a datagram
//!   alike: only the first carries the ports, and fragments of one datagram put in different
//!   classes would get different DSCPs and clocks.
//! - Transport: TCP needs its whole header (20 bytes and its data offset, >= 5 words), UDP and
//!   UDP-Lite their 8 bytes, SCTP its 12-byte common header, all within the IP length; then
//!   the ports are read. Other protocols are classified without ports.
//!
//! A packet the parser refuses passes untouched: not classified, counted, not rewritten.

use crate::{classify::PacketInfo, maps::v4_mapped};

pub const ETH_HLEN: usize = 14;
pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const ETH_P_8021Q: u16 = 0x8100;
pub const ETH_P_8021AD: u16 = 0x88a8;
/// The pre-standard QinQ outer tag some switches still send.
pub const ETH_P_QINQ_9100: u16 = 0x9100;
/// VLAN tags in the data the parser steps over (QinQ).
pub const MAX_VLAN_TAGS: usize = 2;
/// IPv6 extension headers the parser follows; a packet with more is counted as
/// `ipv6_ext_limit` and passes unclassified.
pub const MAX_V6_EXT: usize = 6;
/// The transport header of an IPv6 packet must start within this many bytes of the frame (it
/// keeps the datapath's packet offsets bounded for the verifier); further: `ipv6_ext_limit`.
pub const MAX_L4_OFF: usize = 512;

/// Why a frame was not classified. Each is a counter in `GlobalCounters`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unparsed {
    /// Neither IPv4 nor IPv6 after at most two VLAN tags (ARP, LLDP, MPLS, ...).
    NonIp,
    /// Shorter than what its headers announce.
    Truncated,
    /// IP or TCP header fields that contradict each other or the ethertype.
    Malformed,
    /// More IPv6 extension headers than [`MAX_V6_EXT`], or past [`MAX_L4_OFF`].
    V6ExtLimit,
}

/// Where the headers the datapath may rewrite start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Offset of the outer VLAN tag's TCI in the data, if the frame has a tag in its data.
    pub vlan_tci_off: Option<usize>,
    pub l3_off: usize,
    /// Offset of the transport header (none for fragments).
    pub l4_off: Option<usize>,
}

/// How the parser reads a frame.
pub trait Frame {
    /// The frame's length (`skb->len`), which the IP lengths are checked against.
    fn frame_len(&self) -> usize;
    /// Whether the packet is a GSO super-packet (the kernel then may leave an IP length 0).
    fn is_gso(&self) -> bool;
    /// `N` bytes at `off`; the kernel side reads them in place (direct packet access), so `off`
    /// must be a constant or bounded by a constant the verifier can see.
    fn read<const N: usize>(&self, off: usize) -> Option<&[u8; N]>;
    /// `N` bytes at an offset only known at run time (a copy; `bpf_skb_load_bytes` in the kernel).
    fn load<const N: usize>(&self, off: usize) -> Option<[u8; N]>;
}

/// A frame in a byte slice (user space: tests, fuzzing, the reference for the datapath).
#[derive(Clone, Copy, Debug)]
pub struct SliceFrame<'a> {
    pub data: &'a [u8],
    pub gso: bool,
}

impl<'a> SliceFrame<'a> {
    pub const fn new(data: &'a [u8]) -> Self {
        SliceFrame { data, gso: false }
    }
}

impl Frame for SliceFrame<'_> {
    fn frame_len(&self) -> usize {
        self.data.len()
    }
    fn is_gso(&self) -> bool {
        self.gso
    }
    fn read<const N: usize>(&self, off: usize) -> Option<&[u8; N]> {
        self.data.get(off..off.checked_add(N)?)?.try_into().ok()
    }
    fn load<const N: usize>(&self, off: usize) -> Option<[u8; N]> {
        self.read::<N>(off).copied()
    }
}

#[inline(always)]
const fn be16(a: u8, b: u8) -> u16 {
    ((a as u16) << 8) | b as u16
}

#[inline(always)]
const fn is_vlan(ethertype: u16) -> bool {
    ethertype == ETH_P_8021Q || ethertype == ETH_P_8021AD || ethertype == ETH_P_QINQ_9100
}

/// An IPv6 extension header the parser steps over.
#[inline(always)]
pub const fn is_v6_ext(next: u8) -> bool {
    matches!(next, 0 | 43 | 44 | 51 | 60)
}

/// Parses `f` into `pkt` (addresses, ports, protocol, DSCP, family) and says where its headers
/// are. On error `pkt` may be partly filled and must not be used.
#[inline(always)]
pub fn parse<F: Frame>(f: &F, pkt: &mut PacketInfo) -> Result<Layout, Unparsed> {
    let eth = f.read::<ETH_HLEN>(0).ok_or(Unparsed::Truncated)?;
    let mut proto = be16(eth[12], eth[13]);
    let mut l3 = ETH_HLEN;
    let mut vlan_tci_off = None;
    if is_vlan(proto) {
        let t = f.read::<4>(ETH_HLEN).ok_or(Unparsed::Truncated)?;
        vlan_tci_off = Some(ETH_HLEN);
        proto = be16(t[2], t[3]);
        l3 = ETH_HLEN + 4;
        if is_vlan(proto) {
            let t = f.read::<4>(ETH_HLEN + 4).ok_or(Unparsed::Truncated)?;
            proto = be16(t[2], t[3]);
            l3 = ETH_HLEN + 8;
        }
    }
    let len = f.frame_len();
    // `end`: where the IP packet ends, as its header says; `l4`: the transport header.
    let (end, l4) = match proto {
        ETH_P_IP => {
            let h = f.read::<20>(l3).ok_or(Unparsed::Truncated)?;
            if h[0] >> 4 != 4 {
                return Err(Unparsed::Malformed);
            }
            let ihl = ((h[0] & 0x0f) as usize) * 4;
            if ihl < 20 {
                return Err(Unparsed::Malformed);
            }
            let total = be16(h[2], h[3]) as usize;
            let end = if total == 0 && f.is_gso() {
                len
            } else if total < ihl {
                return Err(Unparsed::Malformed);
            } else {
                l3 + total
            };
            if end > len || l3 + ihl > end {
                return Err(Unparsed::Truncated);
            }
            let frag = be16(h[6], h[7]);
            pkt.proto = h[9];
            pkt.src = v4_mapped(u32::from_ne_bytes([h[12], h[13], h[14], h[15]]));
            pkt.dst = v4_mapped(u32::from_ne_bytes([h[16], h[17], h[18], h[19]]));
            pkt.dscp = h[1] >> 2;
            pkt.is_v6 = 0;
            // More fragments, or a fragment offset: classified on the IP header alone.
            if frag & 0x3fff != 0 {
                (end, None)
            } else {
                (end, Some(l3 + (ihl & 0x3c)))
            }
        }
        ETH_P_IPV6 => {
            let h = f.read::<40>(l3).ok_or(Unparsed::Truncated)?;
            if h[0] >> 4 != 6 {
                return Err(Unparsed::Malformed);
            }
            let payload = be16(h[4], h[5]) as usize;
            let end = if payload == 0 && f.is_gso() {
                len
            } else {
                l3 + 40 + payload
            };
            if end > len {
                return Err(Unparsed::Truncated);
            }
            let w = |i: usize| u32::from_ne_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
            pkt.src = [w(8), w(12), w(16), w(20)];
            pkt.dst = [w(24), w(28), w(32), w(36)];
            pkt.dscp = ((h[0] & 0x0f) << 2) | (h[1] >> 6);
            pkt.is_v6 = 1;
            let (next, l4) = v6_chain(f, h[6], l3 + 40, end)?;
            pkt.proto = next;
            (end, l4)
        }
        _ => return Err(Unparsed::NonIp),
    };
    if let Some(l4) = l4 {
        // The transport header must lie whole within the IP packet (and so within the frame).
        match pkt.proto {
            6 => {
                let t = f.read::<20>(l4).ok_or(Unparsed::Truncated)?;
                if l4 + 20 > end {
                    return Err(Unparsed::Truncated);
                }
                let doff = ((t[12] >> 4) as usize) * 4;
                if doff < 20 {
                    return Err(Unparsed::Malformed);
                }
                if l4 + doff > end {
                    return Err(Unparsed::Truncated);
                }
                pkt.sport = be16(t[0], t[1]);
                pkt.dport = be16(t[2], t[3]);
            }
            // UDP, UDP-Lite: 8 bytes.
            17 | 136 => {
                let t = f.read::<8>(l4).ok_or(Unparsed::Truncated)?;
                if l4 + 8 > end {
                    return Err(Unparsed::Truncated);
                }
                pkt.sport = be16(t[0], t[1]);
                pkt.dport = be16(t[2], t[3]);
            }
            // SCTP: the 12-byte common header.
            132 => {
                let t = f.read::<12>(l4).ok_or(Unparsed::Truncated)?;
                if l4 + 12 > end {
                    return Err(Unparsed::Truncated);
                }
                pkt.sport = be16(t[0], t[1]);
                pkt.dport = be16(t[2], t[3]);
            }
            _ => {}
        }
    }
    Ok(Layout {
        vlan_tci_off,
        l3_off: l3,
        l4_off: l4,
    })
}

/// Follows the IPv6 extension headers from `next` at `off` (the packet ends at `end`): the
/// transport protocol and where its header starts (none for a fragment).
#[inline(always)]
fn v6_chain<F: Frame>(
    f: &F,
    mut next: u8,
    mut off: usize,
    end: usize,
) -> Result<(u8, Option<usize>), Unparsed> {
    let mut i = 0;
    while i < MAX_V6_EXT {
        // Extension headers sit at offsets only known at run time; LLVM turns direct bounds
        // checks at such offsets into forms the verifier rejects (arithmetic on pkt_end, or
        // `p >= end` with a zero fixed offset), so this rare path reads with a copy
        // (bpf_skb_load_bytes), which checks at run time.
        if !is_v6_ext(next) {
            break;
        }
        if off + 8 > end {
            return Err(Unparsed::Truncated);
        }
        let w = f.load::<4>(off).ok_or(Unparsed::Truncated)?;
        let this = next;
        next = w[0];
        match this {
            // fragment: 8 bytes; offset in bits 15..3, M in bit 0
            44 => {
                off += 8;
                if be16(w[2], w[3]) & 0xfff9 != 0 {
                    return if off > end {
                        Err(Unparsed::Truncated)
                    } else {
                        Ok((next, None))
                    };
                }
            }
            // authentication header: length in 4-byte words, minus 2
            51 => off += (w[1] as usize + 2) * 4,
            // hop-by-hop, routing, destination options: length in 8-byte words, minus 1
            _ => off += (w[1] as usize + 1) * 8,
        }
        if off > end {
            return Err(Unparsed::Truncated);
        }
        // Keeps the offset provably bounded for the verifier.
        if off > MAX_L4_OFF {
            return Err(Unparsed::V6ExtLimit);
        }
        i += 1;
    }
    if is_v6_ext(next) {
        return Err(Unparsed::V6ExtLimit);
    }
    Ok((next, Some(off)))
}

#[cfg(test)]
mod tests;
