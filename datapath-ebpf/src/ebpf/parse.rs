//! Header parsing with direct packet access: Ethernet (one 802.1Q/802.1ad tag), IPv4 (with
//! options), IPv6 (skipping hop-by-hop, routing, destination-options, fragment and AH headers),
//! then TCP/UDP/SCTP ports. Anything else is reported as unparsed and passes untouched.

use core::mem::size_of;

use aya_ebpf::programs::TcContext;
use paceline_common::{classify::PacketInfo, maps::v4_mapped};

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
/// IPv6 extension headers the parser follows before giving up.
const MAX_V6_EXT: usize = 6;

pub enum Unparsed {
    NonIp,
    Truncated,
    V6ExtLimit,
}

/// Where the headers the datapath may rewrite start.
pub struct Layout {
    /// Offset of the 802.1Q tag's TCI in the packet data, if the tag is in the data.
    pub vlan_tci_off: Option<usize>,
    pub l3_off: usize,
    /// Offset of the transport header (none for non-first fragments and unfollowed headers).
    pub l4_off: Option<usize>,
}

#[inline(always)]
fn ptr_at<T>(ctx: &TcContext, off: usize) -> Option<*const T> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + off + size_of::<T>() > end {
        return None;
    }
    Some((start + off) as *const T)
}

#[inline(always)]
fn be16_at(ctx: &TcContext, off: usize) -> Option<u16> {
    // SAFETY: bounds checked; unaligned read of packet bytes.
    ptr_at::<u16>(ctx, off).map(|p| u16::from_be(unsafe { p.read_unaligned() }))
}

#[inline(always)]
fn load_be16(ctx: &TcContext, off: usize) -> Result<u16, Unparsed> {
    ctx.load::<[u8; 2]>(off)
        .map(u16::from_be_bytes)
        .map_err(|_| Unparsed::Truncated)
}

/// Parses the packet into `pkt` (addresses, ports, protocol, DSCP, family).
#[inline(always)]
pub fn parse(ctx: &TcContext, pkt: &mut PacketInfo) -> Result<Layout, Unparsed> {
    let mut l3 = ETH_HLEN;
    let mut proto = be16_at(ctx, 12).ok_or(Unparsed::Truncated)?;
    let mut vlan_tci_off = None;
    if proto == ETH_P_8021Q || proto == ETH_P_8021AD {
        vlan_tci_off = Some(ETH_HLEN);
        proto = be16_at(ctx, ETH_HLEN + 2).ok_or(Unparsed::Truncated)?;
        l3 = ETH_HLEN + 4;
    }
    let l4 = match proto {
        ETH_P_IP => {
            // One bounds check for the fixed header; options are skipped by IHL.
            let h = ptr_at::<[u8; 20]>(ctx, l3).ok_or(Unparsed::Truncated)?;
            // SAFETY: 20 bytes bounds-checked above.
            let h = unsafe { &*h };
            let ihl = ((h[0] & 0x0f) as usize) * 4;
            if ihl < 20 {
                return Err(Unparsed::Truncated);
            }
            let frag = u16::from_be_bytes([h[6], h[7]]);
            pkt.proto = h[9];
            pkt.src = v4_mapped(u32::from_ne_bytes([h[12], h[13], h[14], h[15]]));
            pkt.dst = v4_mapped(u32::from_ne_bytes([h[16], h[17], h[18], h[19]]));
            pkt.dscp = h[1] >> 2;
            pkt.is_v6 = 0;
            if frag & 0x1fff != 0 {
                // A non-first fragment has no transport header: classify on L3 only.
                None
            } else {
                Some(l3 + (ihl & 0x3c))
            }
        }
        ETH_P_IPV6 => {
            let h = ptr_at::<[u8; 40]>(ctx, l3).ok_or(Unparsed::Truncated)?;
            // SAFETY: 40 bytes bounds-checked above; addresses stay in network byte order.
            let h = unsafe { &*h };
            let mut next = h[6];
            // SAFETY: as above; unaligned reads of the two addresses.
            pkt.src = unsafe { h.as_ptr().add(8).cast::<[u32; 4]>().read_unaligned() };
            pkt.dst = unsafe { h.as_ptr().add(24).cast::<[u32; 4]>().read_unaligned() };
            pkt.dscp = ((h[0] & 0x0f) << 2) | (h[1] >> 6);
            pkt.is_v6 = 1;
            let mut off = l3 + 40;
            let mut l4 = None;
            let mut done = false;
            let mut i = 0;
            while i < MAX_V6_EXT {
                // Extension headers sit at offsets only known at run time; LLVM turns direct
                // bounds checks at such offsets into forms the verifier rejects (arithmetic on
                // pkt_end, or `p >= end` with a zero fixed offset), so this rare path reads
                // with bpf_skb_load_bytes, which checks at run time.
                match next {
                    // hop-by-hop, routing, destination options
                    0 | 43 | 60 => {
                        let w = load_be16(ctx, off)?;
                        next = (w >> 8) as u8;
                        off += ((w & 0xff) as usize + 1) * 8;
                    }
                    // fragment
                    44 => {
                        let w = load_be16(ctx, off)?;
                        let fo = load_be16(ctx, off + 2)?;
                        next = (w >> 8) as u8;
                        off += 8;
                        if fo & 0xfff8 != 0 {
                            done = true;
                            break;
                        }
                    }
                    // authentication header
                    51 => {
                        let w = load_be16(ctx, off)?;
                        next = (w >> 8) as u8;
                        off += ((w & 0xff) as usize + 2) * 4;
                    }
                    _ => {
                        l4 = Some(off);
                        done = true;
                        break;
                    }
                }
                if off > ctx.len() as usize {
                    return Err(Unparsed::Truncated);
                }
                // Keep the offset provably bounded for the verifier.
                if off > 512 {
                    return Err(Unparsed::V6ExtLimit);
                }
                i += 1;
            }
            if !done {
                return Err(Unparsed::V6ExtLimit);
            }
            pkt.proto = next;
            l4
        }
        _ => return Err(Unparsed::NonIp),
    };
    if let Some(l4) = l4 {
        match pkt.proto {
            // TCP, UDP, UDP-Lite, SCTP: ports are the first four bytes.
            6 | 17 | 136 | 132 => {
                pkt.sport = be16_at(ctx, l4).ok_or(Unparsed::Truncated)?;
                pkt.dport = be16_at(ctx, l4 + 2).ok_or(Unparsed::Truncated)?;
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
