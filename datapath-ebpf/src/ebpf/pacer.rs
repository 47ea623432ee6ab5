//! EDT pacing: the per-flow clock (a socket's or the LRU flow table's) and the class and level aggregate
//! clocks (shared by all CPUs, advanced with compare-and-swap). The arithmetic is
//! `paceline_common::edt`, the same code the unit tests cover.

use core::{
    intrinsics::{AtomicOrdering::Relaxed, atomic_cxchg, atomic_xadd},
    ptr::NonNull,
};

use paceline_common::{
    edt::{self, Verdict},
    trace::TraceClocks,
};

use super::maps::AGG_CLOCKS;

/// Reserves `len` bytes at `rate` on an aggregate clock; returns the start of the slot the
/// packet got. Each compare-and-swap that succeeds reserves one slot no other CPU holds, so the
/// aggregate rate is exact under concurrency. After eight lost races in a row (not seen in
/// practice) the packet takes the last slot it saw and adds its time to the clock without
/// checking, which can overlap one other packet's slot.
#[inline(always)]
fn reserve(clock: *mut u64, floor: u64, len: u64, rate: u64) -> u64 {
    let d = edt::tx_time_ns(len, rate);
    // The bpf target spec has no `atomic-cas`, so `AtomicU64::compare_exchange` is not offered;
    // the intrinsic lowers to BPF_CMPXCHG (kernel 5.12+). Fetch-add is deliberately not used:
    // rustc builds bpf code for the v1 ISA, where LLVM silently drops the FETCH of an add whose
    // result is used.
    // SAFETY: `clock` points into an array map value, 8-byte aligned, valid while the program runs.
    let mut cur = unsafe { clock.read_volatile() };
    let mut tries = 0;
    while tries < 8 {
        let slot = edt::slot_start(cur, floor);
        // SAFETY: as above.
        let (seen, ok) = unsafe { atomic_cxchg::<u64, { Relaxed }, { Relaxed }>(clock, cur, slot + d) };
        if ok {
            return slot;
        }
        cur = seen;
        tries += 1;
    }
    // SAFETY: as above; the result of the add is not used (plain BPF_XADD).
    unsafe { atomic_xadd::<u64, u64, { Relaxed }>(clock, d) };
    edt::slot_start(cur, floor)
}

pub struct Pacing {
    pub flow_rate: u64,
    pub class_rate: u64,
    pub class_slot: u32,
    pub level_rate: u64,
    pub level_slot: u32,
    pub horizon_ns: u64,
}

pub enum Outcome {
    /// No clock applies: leave the timestamp alone.
    Untouched,
    Send {
        depart: u64,
        added_delay: u64,
    },
    Drop,
}

/// Decides the departure of a `len`-byte packet, advancing the clocks that apply. The flow
/// clock is `flow_clock`: a local TCP or connected UDP socket's (socket storage), the flow
/// table's entry, or the per-CPU value the caller inserts into the table afterwards (a new
/// flow); null: none. A raw pointer rather than an enum: an enum's unused payload is
/// undefined, and LLVM may spill such a register, which the verifier refuses to read.
///
/// `trace` receives each clock's slot and the departure (for a horizon drop, the departure the
/// packet would have had), for `paceline trace`: five stores into the CPU's state and no
/// branch, whether a trace runs or not (a branch or a value kept for it made the verifier walk
/// the pacer more often).
#[inline(always)]
pub fn pace(
    len: u64,
    now: u64,
    stack_ts: u64,
    cfg: &Pacing,
    flow_clock: *mut u64,
    trace: &mut TraceClocks,
) -> Outcome {
    let flow_rate = cfg.flow_rate;
    // NonNull, not raw pointers, inside these Options: `Option<*mut T>` carries an undefined
    // payload when None, which LLVM may spill and the verifier refuses to read.
    let flow: Option<NonNull<u64>> = if flow_rate != 0 {
        NonNull::new(flow_clock)
    } else {
        None
    };
    let class_clock = if cfg.class_rate != 0 {
        AGG_CLOCKS
            .get_ptr_mut(cfg.class_slot)
            .and_then(|c| NonNull::new(c.cast::<u64>()))
    } else {
        None
    };
    let level_clock = if cfg.level_rate != 0 {
        AGG_CLOCKS
            .get_ptr_mut(cfg.level_slot)
            .and_then(|c| NonNull::new(c.cast::<u64>()))
    } else {
        None
    };
    if flow_rate == 0 && class_clock.is_none() && level_clock.is_none() {
        return Outcome::Untouched;
    }

    let floor = if stack_ts > now { stack_ts } else { now };
    // SAFETY (all three reads): map value pointers valid for this program run.
    let flow_slot = match flow {
        Some(f) => edt::slot_start(unsafe { f.as_ptr().read_volatile() }, floor),
        None => floor,
    };
    let class_slot = match class_clock {
        Some(c) => edt::slot_start(unsafe { c.as_ptr().read_volatile() }, floor),
        None => floor,
    };
    let level_slot = match level_clock {
        Some(c) => edt::slot_start(unsafe { c.as_ptr().read_volatile() }, floor),
        None => floor,
    };
    // For a trace record: the slots as read (a clock that does not apply reads as `floor`;
    // another CPU's reservation in between is not seen here), stored without a branch.
    trace.floor_ns = floor;
    trace.flow_ns = flow_slot;
    trace.class_ns = class_slot;
    trace.level_ns = level_slot;
    // Decide with the values read, before any clock moves: a drop advances nothing.
    let mut depart = match edt::decide(now, floor, [flow_slot, class_slot, level_slot], cfg.horizon_ns) {
        Verdict::Drop { depart } => {
            trace.depart_ns = depart;
            return Outcome::Drop;
        }
        Verdict::Send { depart, .. } => depart,
    };
    // Commit the aggregates; concurrent CPUs may have taken earlier slots meanwhile.
    if let Some(c) = class_clock {
        let s = reserve(c.as_ptr(), floor, len, cfg.class_rate);
        if s > depart {
            depart = s;
        }
    }
    if let Some(c) = level_clock {
        let s = reserve(c.as_ptr(), floor, len, cfg.level_rate);
        if s > depart {
            depart = s;
        }
    }
    trace.depart_ns = depart;
    if let Some(f) = flow {
        let t_next = edt::flow_clock_after(depart, len, flow_rate);
        // SAFETY: a map value (or per-CPU value) pointer valid for this program run.
        unsafe { f.as_ptr().write_volatile(t_next) };
    }
    Outcome::Send {
        depart,
        added_delay: depart - floor,
    }
}
