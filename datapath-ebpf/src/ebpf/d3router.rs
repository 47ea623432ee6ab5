//! The D3 router (docs/d3.md): a tc egress program that makes any Linux box a D3 router. Per
//! egress link it keeps only the paper's aggregate counters; each rate request passing through
//! gets Snippet 1 (`paceline_common::d3::router_rewrite`), never more than a previous hop
//! granted, and the TCP checksum is fixed incrementally. The agent runs the capacity
//! controller (it owns C) and resets the counters when the link is idle.
//!
//! Several CPUs serve one link. Instead of a lock, each request is computed on a snapshot of
//! D, A and N and its changes are added atomically: exact when requests do not race, and a
//! race only misjudges that one grant (soft state the controller and the next RTT correct).

use aya_ebpf::{
    bindings::TC_ACT_UNSPEC,
    helpers::{bpf_csum_diff, bpf_l4_csum_replace, bpf_skb_load_bytes},
    macros::{classifier, map},
    maps::HashMap,
    programs::TcContext,
};
use core::intrinsics::{AtomicOrdering::Relaxed, atomic_xadd};
use paceline_common::{
    classify::PacketInfo,
    d3::{
        self, D3LinkState, OUT_BASE_FLOOR, OUT_CLAMPED, OUT_FIN, OUT_HOP_OVERFLOW, OUT_INVALID, OUT_NEW,
        REQ_LEN, TCP_OPTS_MAX,
    },
    maps::{D3LinkCounters, D3LinkCtl},
};

use super::parse;

#[map(name = "PL_D3_LINK_CTL")]
static PL_D3_LINK_CTL: HashMap<u32, D3LinkCtl> = HashMap::with_max_entries(64, 0);

#[map(name = "PL_D3_LINKS")]
static PL_D3_LINKS: HashMap<u32, D3LinkCounters> = HashMap::with_max_entries(64, 0);

#[inline(always)]
fn add(p: *mut u64, v: u64) {
    // SAFETY: `p` points into a map value that lives while the program runs; the result is not
    // used, so this is a plain BPF_XADD.
    unsafe { atomic_xadd::<u64, u64, { Relaxed }>(p, v) };
}

#[classifier]
pub fn pl_d3_router(ctx: TcContext) -> i32 {
    let _ = try_router(&ctx);
    TC_ACT_UNSPEC
}

#[inline(always)]
fn try_router(ctx: &TcContext) -> Option<()> {
    // SAFETY: reading __sk_buff fields allowed for tc programs.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    let ctl = PL_D3_LINK_CTL.get_ptr(&ifindex)?;
    let counters = PL_D3_LINKS.get_ptr_mut(&ifindex)?;
    // SAFETY: map value pointers valid for this program run.
    add(unsafe { core::ptr::addr_of_mut!((*counters).sent_bytes) }, ctx.len() as u64);

    let mut pkt = PacketInfo::default();
    let layout = parse::parse(ctx, &mut pkt).ok()?;
    if pkt.proto != 6 {
        return None;
    }
    let l4 = layout.l4_off?;
    let doff = ctx.load::<u8>(l4 + 12).ok()?;
    let opts_len = (((doff >> 4) as usize) * 4).saturating_sub(20);
    if opts_len < REQ_LEN {
        return None;
    }
    let mut opts = [0u8; TCP_OPTS_MAX];
    // Constant lengths only (the verifier cannot follow a computed one through LLVM's range
    // checks): the whole option area, else what a pure ACK with timestamps and a request
    // holds, else a bare request.
    let base = (l4 + 20) as u32;
    let p = opts.as_mut_ptr().cast();
    // SAFETY: the program's context; `opts` has room for 40 bytes.
    let loaded = unsafe {
        if bpf_skb_load_bytes(ctx.skb.skb.cast(), base, p, 40) == 0 {
            40
        } else if bpf_skb_load_bytes(ctx.skb.skb.cast(), base, p, 32) == 0 {
            32
        } else if bpf_skb_load_bytes(ctx.skb.skb.cast(), base, p, 20) == 0 {
            20
        } else {
            return None;
        }
    };
    let n = if opts_len < loaded { opts_len } else { loaded };
    let found = d3::find_d3_option(&opts, n)?;
    if found.len != REQ_LEN {
        return None; // feedback travels to the sender untouched
    }
    let old: [u8; REQ_LEN] = d3::copy_option(&opts, found.offset)?;
    let mut new = old;

    // SAFETY: map value pointers valid for this program run.
    let (cfg, capacity, c) = unsafe { ((*ctl).cfg, (*ctl).capacity, *counters) };
    let before = D3LinkState {
        capacity,
        demand: D3LinkCounters::clamp(c.demand),
        allocated: D3LinkCounters::clamp(c.allocated),
        flows: D3LinkCounters::clamp(c.flows),
        requests: 0,
        idle_intervals: 0,
    };
    let mut after = before;
    let g = d3::router_rewrite(&mut new, &mut after, &cfg);
    // SAFETY: as above.
    unsafe {
        if g.outcome & (OUT_INVALID | OUT_HOP_OVERFLOW) != 0 {
            add(core::ptr::addr_of_mut!((*counters).unprocessed), 1);
            return None;
        }
        add(core::ptr::addr_of_mut!((*counters).requests), 1);
        add(core::ptr::addr_of_mut!((*counters).demand), after.demand.wrapping_sub(before.demand));
        add(core::ptr::addr_of_mut!((*counters).allocated), after.allocated.wrapping_sub(before.allocated));
        add(core::ptr::addr_of_mut!((*counters).flows), after.flows.wrapping_sub(before.flows));
        if g.outcome & OUT_FIN != 0 {
            add(core::ptr::addr_of_mut!((*counters).fins), 1);
        }
        if g.outcome & OUT_NEW != 0 {
            add(core::ptr::addr_of_mut!((*counters).news), 1);
        }
        if g.outcome & OUT_CLAMPED != 0 {
            add(core::ptr::addr_of_mut!((*counters).clamped), 1);
        }
        if g.outcome & OUT_BASE_FLOOR != 0 {
            add(core::ptr::addr_of_mut!((*counters).base_floor), 1);
        }
    }

    // Write the option back, then fix the TCP checksum by the difference of the 20 bytes.
    let off = l4 + 20 + found.offset;
    ctx.store(off, &new, 0).ok()?;
    let mut o = old;
    let mut w = new;
    // SAFETY: two live stack buffers of REQ_LEN (a multiple of 4) bytes.
    let diff = unsafe {
        bpf_csum_diff(o.as_mut_ptr().cast(), REQ_LEN as u32, w.as_mut_ptr().cast(), REQ_LEN as u32, 0)
    };
    if diff < 0 {
        return None;
    }
    let mut d = diff as u64 as u32;
    if found.offset & 1 != 0 {
        // The option starts at an odd offset of the TCP header: its bytes sit in the other
        // halves of the checksum's 16-bit words.
        let f = (d & 0xffff) + (d >> 16);
        let f = ((f & 0xffff) + (f >> 16)) as u16;
        d = f.swap_bytes() as u32;
    }
    // Size 0 in the flags: `to` is a checksum difference. For CHECKSUM_PARTIAL packets the
    // helper leaves the field alone (the device checksums the new bytes).
    // SAFETY: the program's own context.
    unsafe { bpf_l4_csum_replace(ctx.skb.skb, (l4 + 16) as u32, 0, d as u64, 0) };
    Some(())
}
