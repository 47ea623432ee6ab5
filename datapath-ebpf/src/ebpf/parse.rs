//! Header parsing: the parser is `paceline_common::parse` (the same code user space tests and
//! fuzzes); this module gives it the packet: fixed and bounded offsets by direct packet access,
//! IPv6 extension headers through `bpf_skb_load_bytes`.

use core::mem::size_of;

use aya_ebpf::{macros::map, maps::PerCpuArray, programs::TcContext};
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

/// Where [`round_trip`] passes the layout through for the programs without a `CpuState` (the D3
/// router, DASR).
#[map(name = "PL_PARSE_SCRATCH")]
static SCRATCH: PerCpuArray<[u32; 4]> = PerCpuArray::with_max_entries(1, 0);

/// Clears, store by store, what the parser leaves unwritten for some packets (the ports, the
/// unknown fields) and what the programs write only after it or not at all (the mark, the
/// cgroup): `*pkt = PacketInfo::default()` becomes a call of BPF's `memset`, a loop over the 56
/// bytes one at a time (the D3 router paid it on every packet it forwarded).
#[inline(always)]
pub fn clear_unwritten(pkt: *mut PacketInfo) {
    // SAFETY: the caller's packet, in its map value; volatile so that LLVM keeps these the
    // stores they are (not a `memset` call, which Linux 6.1's verifier refuses on a map value).
    unsafe {
        core::ptr::addr_of_mut!((*pkt).sport).write_volatile(0);
        core::ptr::addr_of_mut!((*pkt).dport).write_volatile(0);
        core::ptr::addr_of_mut!((*pkt).unknown).write_volatile(0);
        core::ptr::addr_of_mut!((*pkt).cgroup_id).write_volatile(0);
        core::ptr::addr_of_mut!((*pkt).mark).write_volatile(0);
    }
}

/// Parses the packet into `pkt` (addresses, ports, protocol, DSCP, family).
#[inline(always)]
pub fn parse(ctx: &TcContext, pkt: &mut PacketInfo) -> Result<Layout, Unparsed> {
    // The map is looked up after parsing, as before the egress program's `parse_with`: looked
    // up first, LLVM turned the D3 router's zeroing of its packet (in a map value) into a call
    // of a `memset` function, which Linux 6.1's verifier refuses for a map value.
    //
    // The layout is encoded before the lookup: its `Option` offsets carry an undefined payload
    // when `None`, and a layout kept across the helper call is a register LLVM may copy, which
    // the verifier refuses to read (Linux 6.1 refused DASR's program so under one build). Encoded
    // first, DASR's program also verifies in a third of the instructions on 6.1.
    paceline_common::parse::parse(&Skb(ctx), pkt).map(|l| {
        let enc = encode(l);
        match SCRATCH.get_ptr_mut(0) {
            Some(p) => decode(round_trip(enc, p)),
            None => decode(enc),
        }
    })
}

/// [`parse`], the layout passed through `scratch` (the egress program's slot in its CPU
/// state, in the cache line it reads the packet back from).
#[inline(always)]
pub fn parse_with(ctx: &TcContext, pkt: &mut PacketInfo, scratch: *mut [u32; 4]) -> Result<Layout, Unparsed> {
    paceline_common::parse::parse(&Skb(ctx), pkt).map(|l| decode(round_trip(encode(l), scratch)))
}

/// The layout, passed through a per-CPU map value so that the verifier sees offsets it does
/// not know (as the datapath's `maps::read_back` does for the packet): every parse path (no tag,
/// one or two, IPv4 options, each IPv6 extension chain) then continues as one verifier state
/// instead of re-verifying classification and pacing once per layout. The offsets are only
/// used with helpers that check them at run time (`bpf_skb_load_bytes`, `bpf_skb_store_bytes`,
/// `bpf_l3_csum_replace`).
#[inline(always)]
fn round_trip(enc: [u32; 4], p: *mut [u32; 4]) -> [u32; 4] {
    // SAFETY: this CPU's slot of an array map (or a field of this CPU's map value); volatile
    // so LLVM does not forward the stores.
    unsafe {
        p.write_volatile(enc);
        p.read_volatile()
    }
}

/// A layout's absent offsets, in [`encode`]'s words.
const NONE: u32 = u32::MAX;

/// The layout as four words, absent offsets as [`NONE`] (defined values, unlike an `Option`'s
/// payload).
#[inline(always)]
fn encode(l: Layout) -> [u32; 4] {
    [
        l.l3_off as u32,
        l.l4_off.map_or(NONE, |o| o as u32),
        l.vlan_tci_off.map_or(NONE, |o| o as u32),
        0,
    ]
}

#[inline(always)]
fn decode(d: [u32; 4]) -> Layout {
    Layout {
        l3_off: d[0] as usize,
        l4_off: (d[1] != NONE).then_some(d[1] as usize),
        vlan_tci_off: (d[2] != NONE).then_some(d[2] as usize),
    }
}
