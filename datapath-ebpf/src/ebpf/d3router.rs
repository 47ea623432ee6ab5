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
    helpers::{bpf_csum_diff, bpf_ktime_get_ns, bpf_l4_csum_replace, bpf_skb_load_bytes},
    macros::{classifier, map},
    maps::{HashMap, LruHashMap, PerCpuArray},
    programs::TcContext,
};
use core::intrinsics::{AtomicOrdering::Relaxed, atomic_xadd};
use paceline_common::{
    classify::PacketInfo,
    d3::{
        self, D3LinkConfig, D3LinkState, D3Request, FLAG_NEW, OUT_BASE_FLOOR, OUT_CLAMPED, OUT_FIN,
        OUT_HOP_OVERFLOW, OUT_INVALID, OUT_LEFT, OUT_NEW, REQ_LEN, TCP_OPTS_MAX, TCP_OPTS_OFFSET,
    },
    maps::{D3_SEEN_ENTRIES, D3LinkCounters, D3LinkCtl, D3Seen, FlowKey},
};

use super::parse;

#[map(name = "PL_D3_LINK_CTL")]
static PL_D3_LINK_CTL: HashMap<u32, D3LinkCtl> = HashMap::with_max_entries(64, 0);

#[map(name = "PL_D3_LINKS")]
static PL_D3_LINKS: HashMap<u32, D3LinkCounters> = HashMap::with_max_entries(64, 0);

/// The last request of each flow, to recognise its TSO/GSO copies. Per-flow soft state the
/// paper's routers do without: an eviction only lets one copy be counted twice.
#[map(name = "PL_D3_SEEN")]
static PL_D3_SEEN: LruHashMap<FlowKey, D3Seen> = LruHashMap::with_max_entries(D3_SEEN_ENTRIES, 0);

/// Copies of one request arrive back to back; a new request of the same flow, one RTT later.
const DUPLICATE_WINDOW_NS: u64 = 1_000_000;

#[inline(always)]
fn add(p: *mut u64, v: u64) {
    // SAFETY: `p` points into a map value that lives while the program runs; the result is not
    // used, so this is a plain BPF_XADD.
    unsafe { atomic_xadd::<u64, u64, { Relaxed }>(p, v) };
}

/// The router's working buffers: more than the 512-byte BPF stack holds, so they live in a
/// per-CPU map value.
#[repr(C)]
pub struct Scratch {
    opts: [u8; TCP_OPTS_MAX],
    old: [u8; REQ_LEN],
    new: [u8; REQ_LEN],
    calc: [u8; REQ_LEN],
    /// The option's offset, passed through map memory (see `try_router`).
    off: u32,
    key: FlowKey,
    seen: D3Seen,
    cfg: D3LinkConfig,
    before: D3LinkState,
    after: D3LinkState,
    pkt: PacketInfo,
}

#[map(name = "PL_D3_SCRATCH")]
static PL_D3_SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

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
    add(
        unsafe { core::ptr::addr_of_mut!((*counters).sent_bytes) },
        ctx.len() as u64,
    );
    // SAFETY: per-CPU slot; preemption is disabled while the program runs.
    let sc = unsafe { &mut *PL_D3_SCRATCH.get_ptr_mut(0)? };

    parse::clear_unwritten(&mut sc.pkt);
    let layout = parse::parse(ctx, &mut sc.pkt).ok()?;
    if sc.pkt.proto != 6 {
        return None;
    }
    let l4 = layout.l4_off?;
    let doff = ctx.load::<u8>(l4 + 12).ok()?;
    let opts_len = (((doff >> 4) as usize) * 4).saturating_sub(TCP_OPTS_OFFSET);
    if opts_len < REQ_LEN {
        return None;
    }
    // Constant lengths only (the verifier cannot follow a computed one through LLVM's range
    // checks): the whole option area, else what a pure ACK with timestamps and a request
    // holds, else a bare request.
    let base = (l4 + TCP_OPTS_OFFSET) as u32;
    let p = sc.opts.as_mut_ptr().cast();
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
    // The walk runs over all 40 bytes loaded, a constant length: an unknown end bound in
    // every comparison of the walk multiplies the states older verifiers (6.1) explore past
    // their limit. Within the option area the walk is exact, so a request found there is the
    // first one; one that starts or ends past the area (payload) is refused below.
    let found = d3::find_d3_option(&sc.opts, TCP_OPTS_MAX)?;
    if found.len != REQ_LEN {
        return None; // feedback travels to the sender untouched
    }
    // The scan leaves the offset as an exact constant on each of its ~40 exits, so the
    // verifier would walk the rest of the program once per offset (6.1 gives up at 1M
    // instructions). A round trip through map memory turns it into one bounded unknown.
    // The mask bounds the value itself (a later check on one register does not bound a copy
    // LLVM spilled before it, on 6.1); offsets past 20 are then refused below.
    // SAFETY: a field of the per-CPU scratch value.
    let offset = unsafe {
        core::ptr::write_volatile(&mut sc.off, found.offset as u32);
        (core::ptr::read_volatile(&sc.off) & 0x3f) as usize
    };
    if offset > TCP_OPTS_MAX - REQ_LEN || offset + REQ_LEN > n {
        return None; // past the end, or running past the option area
    }
    sc.old = d3::copy_option(&sc.opts, offset)?;
    sc.key = FlowKey {
        src: sc.pkt.src,
        dst: sc.pkt.dst,
        sport: sc.pkt.sport,
        dport: sc.pkt.dport,
        proto: 6,
        _pad: [0; 3],
    };
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let arriving = D3Request::decode(&sc.old).ok()?;
    let hop = arriving.hop as usize;
    sc.calc = sc.old;
    if let Some(seen) = PL_D3_SEEN.get_ptr(&sc.key) {
        // SAFETY: map value pointer valid for this program run.
        sc.seen = unsafe { *seen };
        if now.wrapping_sub(sc.seen.at) < DUPLICATE_WINDOW_NS && same(&sc.seen.arrived, &sc.old) {
            // A TSO/GSO copy of the request just processed: the same rewrite, counted once.
            // SAFETY: as above.
            add(unsafe { core::ptr::addr_of_mut!((*counters).duplicates) }, 1);
            sc.new = sc.seen.rewritten;
            return write_back(ctx, l4, offset, sc);
        }
        // The request as this router computes it: the previous desired rate and this hop's
        // previous allocation are what the router itself recorded for the flow (exact even
        // when feedback was lost). A new flow, or one it forgot, is taken at its word. The
        // bytes are patched in the scratch map value: a variable-offset write to the stack
        // is refused by older verifiers (6.1: "invalid size of register fill").
        let recorded = &sc.seen.rewritten;
        if arriving.flags & FLAG_NEW == 0 && d3::req_hop(recorded) as usize == hop + 1 && hop < d3::HOPS {
            d3::req_set_prev_desired(&mut sc.calc, d3::req_desired(recorded));
            d3::req_set_prev_scale(&mut sc.calc, d3::req_scale(recorded));
            if let Some(a) = d3::req_alloc(recorded, hop) {
                d3::req_set_prev_alloc(&mut sc.calc, hop, a);
            }
        }
    }

    // SAFETY: map value pointers valid for this program run.
    unsafe {
        sc.cfg = (*ctl).cfg;
        sc.before = D3LinkState {
            capacity: (*ctl).capacity,
            demand: D3LinkCounters::clamp((*counters).demand),
            allocated: D3LinkCounters::clamp((*counters).allocated),
            flows: D3LinkCounters::clamp((*counters).flows),
            requests: 0,
            idle_intervals: 0,
        };
    }
    sc.after = sc.before;
    let g = d3::router_rewrite(&mut sc.calc, &mut sc.after, &sc.cfg);
    // SAFETY: as above.
    unsafe {
        if g.outcome & (OUT_INVALID | OUT_HOP_OVERFLOW) != 0 {
            add(core::ptr::addr_of_mut!((*counters).unprocessed), 1);
            return None;
        }
        add(core::ptr::addr_of_mut!((*counters).requests), 1);
        add(
            core::ptr::addr_of_mut!((*counters).demand),
            sc.after.demand.wrapping_sub(sc.before.demand),
        );
        add(
            core::ptr::addr_of_mut!((*counters).allocated),
            sc.after.allocated.wrapping_sub(sc.before.allocated),
        );
        add(
            core::ptr::addr_of_mut!((*counters).flows),
            sc.after.flows.wrapping_sub(sc.before.flows),
        );
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
        if g.outcome & OUT_LEFT != 0 && arriving.desired != 0 {
            add(core::ptr::addr_of_mut!((*counters).short), 1);
        }
    }
    // On the wire only this hop's slot and the hop index change.
    sc.new = sc.old;
    d3::req_set_alloc(&mut sc.new, hop, g.units);
    d3::req_set_hop(&mut sc.new, arriving.hop.saturating_add(1));
    sc.seen = D3Seen {
        arrived: sc.old,
        rewritten: sc.new,
        at: now,
        ifindex,
        _pad: 0,
    };
    let _ = PL_D3_SEEN.insert(&sc.key, &sc.seen, 0);
    write_back(ctx, l4, offset, sc)
}

#[inline(always)]
fn same(a: &[u8; REQ_LEN], b: &[u8; REQ_LEN]) -> bool {
    let mut d = 0u8;
    let mut i = 0;
    while i < REQ_LEN {
        d |= a[i] ^ b[i];
        i += 1;
    }
    d == 0
}

/// Writes `sc.new` at `offset` of the option area and fixes the TCP checksum by the difference
/// between `sc.old` and `sc.new`.
#[inline(always)]
fn write_back(ctx: &TcContext, l4: usize, offset: usize, sc: &mut Scratch) -> Option<()> {
    let off = l4 + TCP_OPTS_OFFSET + offset;
    ctx.store(off, &sc.new, 0).ok()?;
    // SAFETY: two buffers of REQ_LEN (a multiple of 4) bytes in the scratch map value.
    let diff = unsafe {
        bpf_csum_diff(
            sc.old.as_mut_ptr().cast(),
            REQ_LEN as u32,
            sc.new.as_mut_ptr().cast(),
            REQ_LEN as u32,
            0,
        )
    };
    if diff < 0 {
        return None;
    }
    let mut d = diff as u64 as u32;
    if offset & 1 != 0 {
        // The option starts at an odd offset of the TCP header: its bytes sit in the other
        // halves of the checksum's 16-bit words.
        d = d3::fold(d).swap_bytes() as u32;
    }
    // Size 0 in the flags: `to` is a checksum difference. For CHECKSUM_PARTIAL packets the
    // helper leaves the field alone (the device checksums the new bytes).
    // SAFETY: the program's own context.
    unsafe { bpf_l4_csum_replace(ctx.skb.skb, (l4 + 16) as u32, 0, d as u64, 0) };
    Some(())
}
