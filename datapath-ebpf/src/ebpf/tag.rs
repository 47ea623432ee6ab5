//! Tagging: DSCP rewrite (ECN bits kept, IPv4 header checksum fixed incrementally) and the
//! 802.1p PCP of a VLAN tag, whether the tag is in the packet data or in skb metadata
//! (hardware-accelerated tags, rewritten with vlan_pop/vlan_push).

use aya_ebpf::{
    helpers::{bpf_skb_vlan_pop, bpf_skb_vlan_push},
    programs::TcContext,
};

/// Rewrites the DSCP of the IP header at `l3` (IPv4 when `!v6`). Returns whether it changed.
#[inline(always)]
pub fn set_dscp(ctx: &TcContext, l3: usize, v6: bool, dscp: u8) -> Result<bool, ()> {
    if v6 {
        let w: u32 = ctx.load::<u32>(l3).map_err(|_| ())?;
        let h = u32::from_be(w);
        let tc = ((h >> 20) & 0xff) as u8;
        let new_tc = (dscp << 2) | (tc & 0x03);
        if new_tc == tc {
            return Ok(false);
        }
        let h2 = (h & !(0xff << 20)) | ((new_tc as u32) << 20);
        // IPv6 has no header checksum and the pseudo-header has no traffic class.
        ctx.store(l3, &h2.to_be(), 0).map_err(|_| ())?;
        Ok(true)
    } else {
        let w: u16 = ctx.load::<u16>(l3).map_err(|_| ())?; // version/IHL + TOS, as in memory
        let b = w.to_ne_bytes();
        let tos = b[1];
        let new_tos = (dscp << 2) | (tos & 0x03);
        if new_tos == tos {
            return Ok(false);
        }
        let w2 = u16::from_ne_bytes([b[0], new_tos]);
        ctx.store(l3 + 1, &new_tos, 0).map_err(|_| ())?;
        // Incremental checksum update over the 16-bit word that holds the TOS byte.
        ctx.l3_csum_replace(l3 + 10, w as u64, w2 as u64, 2)
            .map_err(|_| ())?;
        Ok(true)
    }
}

/// Rewrites the PCP of the outer VLAN tag: the one in skb metadata (a tag the NIC inserts on
/// transmit, outside any tag in the data), else the first tag in the data at `tci_off`. On QinQ
/// frames that is the service tag, the one the next switch reads; the customer's inner tag
/// keeps its PCP.
#[inline(always)]
pub fn set_pcp(ctx: &TcContext, tci_off: Option<usize>, pcp: u8) -> Result<bool, ()> {
    let skb = ctx.skb.skb;
    // SAFETY: reading __sk_buff fields the verifier allows for tc programs.
    let (present, tci, proto) = unsafe { ((*skb).vlan_present, (*skb).vlan_tci, (*skb).vlan_proto) };
    if present != 0 {
        let t = tci as u16;
        let new = (t & 0x1fff) | ((pcp as u16 & 7) << 13);
        if new == t {
            return Ok(false);
        }
        // SAFETY: helpers take the context pointer; the tag is re-pushed with the new PCP.
        unsafe {
            if bpf_skb_vlan_pop(skb) != 0 {
                return Err(());
            }
            if bpf_skb_vlan_push(skb, proto as u16, new) != 0 {
                return Err(());
            }
        }
        return Ok(true);
    }
    let Some(off) = tci_off else { return Ok(false) };
    let t = u16::from_be(ctx.load::<u16>(off).map_err(|_| ())?);
    let new = (t & 0x1fff) | ((pcp as u16 & 7) << 13);
    if new == t {
        return Ok(false);
    }
    // Ethernet has no checksum the datapath must fix (the FCS is computed on transmit).
    ctx.store(off, &new.to_be(), 0).map_err(|_| ())?;
    Ok(true)
}
