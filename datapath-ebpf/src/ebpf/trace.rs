//! `paceline trace`: one record per traced packet into the ring buffer (see
//! `paceline_common::trace`). Off, a packet pays one load of the config's flags word
//! ([`on`]) at its exit. On, the egress program leaves what it decided in the CPU's
//! `TracePending` and tail-calls [`pl_tc_trace`], which runs the filters and the per-second
//! cap, writes the record and returns the egress program's verdict. A program of its own: the
//! verifier walks it once, not once for every path of the egress program that reaches an
//! exit (inlined there, the records took the egress program from 263,000 verified
//! instructions to 613,000).

use core::ffi::c_void;

use aya_ebpf::{
    bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC},
    helpers::{bpf_ktime_get_ns, bpf_skb_load_bytes},
    macros::classifier,
    programs::TcContext,
};
use paceline_common::{
    maps::CpuState,
    trace::{
        NO_RULE, TP_PACED, TR_CACHED, TR_SOCKET, TR_UNPARSED, TR_VLAN, TRACE_CLASS, TRACE_DROPS_ONLY,
        TRACE_FLOW, TRACE_HEAD, TRACE_ON, TraceConfig, TraceRecord, is_drop_or_mark,
    },
};

use super::maps::{self, TRACE_CFG, TRACE_PROG, TRACE_RING};

/// Nonzero while a trace runs: a global the agent flips (the `.bss` map), so that a packet
/// pays one load for it at each point that asks, where a map lookup would cost several
/// instructions. The trace program checks `PL_TRACE_CFG` itself.
#[unsafe(no_mangle)]
static mut PL_TRACE_ON: u32 = 0;

/// Read-only at load: 1 only in the benchmark's build that measures what tracing costs while
/// off. Every trace branch and every store made only for a record then test a load-time
/// constant, which the verifier prunes, as if tracing were not built in; the agent leaves it 0.
#[unsafe(no_mangle)]
static PL_BENCH_NO_TRACE: u32 = 0;

/// Whether tracing is built into this load (see [`PL_BENCH_NO_TRACE`]): the stores a record
/// needs from the egress program's path are made only then.
#[inline(always)]
pub fn built() -> bool {
    // SAFETY: volatile read of a load-time constant.
    unsafe { core::ptr::read_volatile(&PL_BENCH_NO_TRACE) == 0 }
}

/// Whether a trace runs (one load).
#[inline(always)]
pub fn on() -> bool {
    // SAFETY: a plain load of a 4-byte global; the agent's writes are whole words.
    built() && unsafe { core::ptr::read_volatile(core::ptr::addr_of!(PL_TRACE_ON)) != 0 }
}

/// Hands the packet to [`pl_tc_trace`] (its facts in `CpuState::trace.pending`); returns only
/// when the agent has not installed it, and the caller then returns its own verdict.
#[inline(always)]
pub fn hand_over(ctx: &TcContext) {
    // SAFETY: the program array holds tc programs only (the agent's).
    unsafe { TRACE_PROG.tail_call(ctx, 0) };
}

/// The tail of the egress program while a trace runs: records the packet if the trace wants
/// it, then returns the verdict the egress program decided.
#[classifier]
pub fn pl_tc_trace(ctx: TcContext) -> i32 {
    let Some(cpu) = maps::cpu() else {
        return TC_ACT_UNSPEC;
    };
    // SAFETY: a field of this CPU's map value.
    let action = unsafe { core::ptr::addr_of!(cpu.trace.pending.action).read_volatile() };
    let flags = cpu.trace.pending.flags;
    if let Some(cfg) = TRACE_CFG.get(0)
        && cfg.flags & TRACE_ON != 0
    {
        if flags & TR_UNPARSED != 0 {
            unparsed(&ctx, cfg, cpu, action);
        } else {
            decided(&ctx, cfg, cpu);
        }
    }
    if action == paceline_common::trace::action::DROP_CODEL
        || action == paceline_common::trace::action::DROP_HORIZON
    {
        TC_ACT_SHOT
    } else {
        TC_ACT_UNSPEC
    }
}

/// Records one decided packet if the trace wants it: its facts are in `cpu.trace.pending`
/// (see `TracePending`), its parsed headers in `cpu.scratch`, its clocks in
/// `cpu.trace.clocks` when the pacer ran. Everything is read back from memory (volatile): the
/// verifier then walks this code once for all the paths that reach it.
#[inline(always)]
fn decided(ctx: &TcContext, cfg: &TraceConfig, cpu: &mut CpuState) {
    // SAFETY: fields of this CPU's map value.
    let (d, p) = unsafe {
        (
            core::ptr::addr_of!(cpu.trace.pending).read_volatile(),
            core::ptr::addr_of!(cpu.scratch).read_volatile(),
        )
    };
    let f = cfg.flags;
    if f & TRACE_DROPS_ONLY != 0 && !is_drop_or_mark(d.action) {
        return;
    }
    if f & TRACE_CLASS != 0 && cfg.class != u32::from(d.class) {
        return;
    }
    if f & TRACE_FLOW != 0 {
        let k = &cfg.flow;
        let mut diff = (k.proto ^ p.proto) as u32 | (k.sport ^ p.sport) as u32 | (k.dport ^ p.dport) as u32;
        let mut i = 0;
        while i < 4 {
            diff |= (k.src[i] ^ p.src[i]) | (k.dst[i] ^ p.dst[i]);
            i += 1;
        }
        if diff != 0 {
            return;
        }
    }
    // A pointer, not a copy: a packet sampled out or capped pays nothing for it.
    let clocks = core::ptr::addr_of!(cpu.trace.clocks);
    record(ctx, cfg, cpu, |r| {
        // SAFETY: the reserved record `record` hands over.
        unsafe {
            if d.flags & TP_PACED != 0 {
                (*r).clocks = *clocks;
            }
            (*r).dasr_rate = d.dasr_rate;
            (*r).flow_rate = d.flow_rate;
            if d.flags & TR_SOCKET != 0
                && let Some(sk) = super::sock::tcp_sock(ctx)
            {
                (*r).d3_rate = super::d3host::applied_rate(sk);
            }
            (*r).key.src = p.src;
            (*r).key.dst = p.dst;
            (*r).key.sport = p.sport;
            (*r).key.dport = p.dport;
            (*r).key.proto = p.proto;
            (*r).class = d.class;
            (*r).level = d.level;
            (*r).action = d.action;
            (*r).dscp_before = p.dscp;
            (*r).flags = d.flags & !TP_PACED;
            (*r).wire_len = d.wire_len;
            // The classifier's rule, when it ran for this packet (a cached class has none).
            (*r).rule = if d.flags & TR_CACHED != 0 { NO_RULE } else { d.rule };
        }
    });
}

/// Records a packet the parser gave up on (`action` says why), if the trace wants it: only
/// without a class or flow filter.
#[inline(always)]
fn unparsed(ctx: &TcContext, cfg: &TraceConfig, cpu: &mut CpuState, action: u8) {
    if cfg.flags & (TRACE_DROPS_ONLY | TRACE_CLASS | TRACE_FLOW) != 0 {
        return;
    }
    record(ctx, cfg, cpu, |r| {
        // SAFETY: the reserved record `record` hands over.
        unsafe {
            (*r).action = action;
            (*r).flags = TR_UNPARSED;
        }
    });
}

/// The sampling and the cap, then a record reserved, cleared, stamped with the time and the
/// session, filled by `fill`, finished (`finish`) and submitted; a full ring is counted.
#[inline(always)]
fn record(ctx: &TcContext, cfg: &TraceConfig, cpu: &mut CpuState, fill: impl FnOnce(*mut TraceRecord)) {
    let Some(now) = admit(cpu, cfg) else {
        return;
    };
    let Some(mut e) = TRACE_RING.reserve::<TraceRecord>(0) else {
        cpu.trace.lost += 1;
        return;
    };
    let r = e.as_mut_ptr();
    // SAFETY: a reserved record of this size, written field by field before it is submitted.
    unsafe {
        clear(r);
        (*r).time_ns = now;
        (*r).session = cfg.session;
    }
    fill(r);
    finish(ctx, cpu, r);
    e.submit(0);
}

/// Zeroes every field but the packet bytes (a ring buffer's memory is not cleared, and a
/// whole-record copy would be a memcpy the bpf target cannot call).
///
/// # Safety
/// `r` is a reserved record.
#[inline(always)]
unsafe fn clear(r: *mut TraceRecord) {
    // SAFETY: the caller's.
    unsafe {
        (*r).clocks = paceline_common::trace::TraceClocks::default();
        (*r).dasr_rate = 0;
        (*r).d3_rate = 0;
        (*r).flow_rate = 0;
        (*r).key = paceline_common::maps::FlowKey::default();
        (*r).ifindex = 0;
        (*r).wire_len = 0;
        (*r).pkt_len = 0;
        (*r).class = 0;
        (*r).level = 0;
        (*r).action = 0;
        (*r).binding = 0;
        (*r).dscp_before = 0;
        (*r)._pad1 = 0;
        (*r).flags = 0;
        (*r).head_len = 0;
        (*r).vlan_tci = 0;
        (*r).rule = NO_RULE;
        (*r)._pad = 0;
    }
}

/// The sampling, then (reading the clock only for the packets sampled in) the cap.
#[inline(always)]
fn admit(cpu: &mut CpuState, cfg: &TraceConfig) -> Option<u64> {
    if !cpu.trace.gate.sampled(cfg.sample) {
        return None;
    }
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    if !cpu.trace.gate.within_cap(now, cfg.per_sec) {
        cpu.trace.capped += 1;
        return None;
    }
    Some(now)
}

/// The fields every record has: the interface, the lengths and the packet's first bytes.
#[inline(always)]
fn finish(ctx: &TcContext, cpu: &mut CpuState, r: *mut TraceRecord) {
    let skb = ctx.skb.skb;
    // SAFETY: reading __sk_buff fields allowed for tc programs; `r` is the reserved record.
    unsafe {
        (*r).ifindex = (*skb).ifindex;
        // A tag the stack keeps outside the bytes (to be inserted by the device or the
        // driver); one inside them is in `head`.
        if (*skb).vlan_present != 0 {
            (*r).vlan_tci = (*skb).vlan_tci as u16;
            (*r).flags |= TR_VLAN;
        }
        let len = (*skb).len;
        (*r).pkt_len = len;
        let mut n = len;
        if n > TRACE_HEAD as u32 {
            n = TRACE_HEAD as u32;
        }
        // In 1..=128 in a form the verifier can bound (Linux 6.1 refuses a length that may be
        // 0, and LLVM's own bounds of `n` do not reach it): through memory, so that LLVM
        // cannot fold the expression back to `n`. A packet of 0 bytes asks for 128, which
        // the helper refuses, and no bytes are recorded.
        let p = core::ptr::addr_of_mut!(cpu.opaque[1]);
        p.write_volatile(n);
        let n = ((p.read_volatile().wrapping_sub(1)) & (TRACE_HEAD as u32 - 1)) + 1;
        if bpf_skb_load_bytes(
            skb as *const c_void,
            0,
            core::ptr::addr_of_mut!((*r).head).cast::<c_void>(),
            n,
        ) == 0
        {
            (*r).head_len = n as u16;
        }
    }
    cpu.trace.emitted += 1;
}
