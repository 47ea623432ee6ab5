//! Header parsing: the parser is `paceline_common::parse` (the same code user space tests and
//! fuzzes); this module gives it the packet: fixed and bounded offsets by direct packet access,
//! IPv6 extension headers through `bpf_skb_load_bytes`.

use core::mem::size_of;

use aya_ebpf::programs::TcContext;
pub use paceline_common::parse::{Layout, Unparsed};
use paceline_common::{classify::PacketInfo, parse::Frame};

struct Skb<'a>(&'a TcContext);

impl Frame for Skb<'_> {
    #[inline(always)]
    fn frame_len(&self) -> usize {
        self.0.len() as usize
    }

    #[inline(always)]
    fn is_gso(&self) -> bool {
        // SAFETY: reading __sk_buff fields allowed for tc programs.
        unsafe { (*self.0.skb.skb).gso_segs > 1 }
    }

    #[inline(always)]
    fn read<const N: usize>(&self, off: usize) -> Option<&[u8; N]> {
        let start = self.0.data();
        let end = self.0.data_end();
        if start + off + size_of::<[u8; N]>() > end {
            return None;
        }
        // SAFETY: N bytes bounds-checked above; the packet outlives the program's run, and
        // `[u8; N]` has alignment 1.
        Some(unsafe { &*((start + off) as *const [u8; N]) })
    }

    #[inline(always)]
    fn load<const N: usize>(&self, off: usize) -> Option<[u8; N]> {
        self.0.load::<[u8; N]>(off).ok()
    }
}

/// Parses the packet into `pkt` (addresses, ports, protocol, DSCP, family).
#[inline(always)]
pub fn parse(ctx: &TcContext, pkt: &mut PacketInfo) -> Result<Layout, Unparsed> {
    paceline_common::parse::parse(&Skb(ctx), pkt)
}
