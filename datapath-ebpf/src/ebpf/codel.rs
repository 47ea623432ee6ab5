//! CoDel on the class and level departure queues, and ECN marking. The state machine and the
//! control law are `paceline_common::codel` (what the unit tests cover); here they run on the
//! shared per-aggregate state in `PL_CODEL`, and the packet gets its CE mark.
//!
//! The state machines run in a *global* BPF function ([`pl_codel_check`]): the verifier checks
//! it once, for any arguments, instead of once per verifier state that reaches the pacer (about
//! 150 on this program), which would have cost some 100,000 instructions of its budget. Its
//! arguments go through a per-CPU map value: the tc program's stack has no room left for them
//! next to the function's own frame (512 bytes for both).

use core::intrinsics::{AtomicOrdering::Relaxed, atomic_cxchg};

use aya_ebpf::{
    macros::map,
    maps::{Array, PerCpuArray},
    programs::TcContext,
};
use paceline_common::{
    codel::{self, CodelParams, CodelState, ecn_capable},
    edt,
    maps::{AGG_SLOTS, ClassConfig, LevelConfig},
};

use super::maps::AGG_CLOCKS;

/// CoDel per class at `[0, MAX_CLASSES)`, per level after them (the slots of `PL_AGG_CLOCKS`).
#[map(name = "PL_CODEL")]
static CODEL: Array<CodelState> = Array::with_max_entries(AGG_SLOTS as u32, 0);

/// [`judge`]'s verdict bits: a signal to mark CE.
pub const MARK: u32 = 1;
/// A signal on a packet that cannot carry a mark (not ECN-capable, or `ecn` off): drop it.
pub const DROP: u32 = 2;

/// One aggregate (a class or a level) as a packet sees it.
#[repr(C)]
pub struct Aggregate {
    /// Its slot in `PL_AGG_CLOCKS` and `PL_CODEL`.
    pub slot: u32,
    /// Its rate, bytes/s (0: no clock, so no queue).
    pub rate: u64,
    pub codel: CodelParams,
}

/// [`pl_codel_check`]'s arguments.
#[repr(C)]
pub struct Args {
    pub class: Aggregate,
    pub level: Aggregate,
    /// What the packet's delay is measured from: the later of now and its stack timestamp.
    pub floor: u64,
    /// Its wire length.
    pub len: u64,
}

#[map(name = "PL_CODEL_ARGS")]
static ARGS: PerCpuArray<Args> = PerCpuArray::with_max_entries(1, 0);

/// Runs the CoDel of the packet's class and of its level (those that are on) for a `len`-byte
/// packet whose delay is measured from `floor`, before any clock moves: a packet CoDel drops
/// takes no slot. Returns 0, [`MARK`] (the packet is ECN-capable and every CoDel that
/// signalled marks) or [`DROP`].
#[allow(
    clippy::too_many_arguments,
    reason = "written field by field into the map value"
)]
#[inline(always)]
pub fn check(
    ctx: &TcContext,
    l3: usize,
    v6: bool,
    class: (u32, &ClassConfig),
    level: (u32, &LevelConfig),
    floor: u64,
    len: u64,
) -> u32 {
    let Some(args) = ARGS.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's value of a per-CPU map, valid while the program runs. Written field
    // by field: an `Args` built on the stack first would not fit next to the function's frame.
    unsafe {
        (*args).class.slot = class.0;
        (*args).class.rate = class.1.class_rate;
        copy_params(&mut (*args).class.codel, &class.1.codel);
        (*args).level.slot = level.0;
        (*args).level.rate = level.1.rate;
        copy_params(&mut (*args).level.codel, &level.1.codel);
        (*args).floor = floor;
        (*args).len = len;
    }
    let mut signal = pl_codel_check(args);
    // Only a packet with a signal to carry has its ECN bits read.
    if signal == MARK && !ecn_capable(ecn_bits(ctx, l3, v6)) {
        signal = DROP;
    }
    signal
}

/// The CoDel of a packet's class and level: 0, [`MARK`] (every CoDel that signalled marks) or
/// [`DROP`]. A global function: verified once, on its own (see the module's docs).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pl_codel_check(args: *const Args) -> u32 {
    if args.is_null() {
        return 0;
    }
    // SAFETY: the verifier checked that `args` points to an `Args`-sized readable region.
    let a = unsafe { &*args };
    let mut signal = 0;
    if a.class.rate != 0 && a.class.codel.is_on() {
        signal |= judge(&a.class, a.floor, a.len);
    }
    if a.level.rate != 0 && a.level.codel.is_on() {
        signal |= judge(&a.level, a.floor, a.len);
    }
    signal
}

/// One aggregate's CoDel: 0, [`MARK`] (a signal, and this CoDel marks) or [`DROP`].
#[inline(always)]
fn judge(a: &Aggregate, floor: u64, len: u64) -> u32 {
    let Some(clock) = AGG_CLOCKS.get(a.slot) else {
        return 0;
    };
    // SAFETY: an array map value; concurrent CPUs move it with atomics.
    let depart = edt::slot_start(unsafe { core::ptr::read_volatile(&clock.t_next) }, floor);
    let Some(ptr) = CODEL.get_ptr_mut(a.slot) else {
        return 0;
    };
    // SAFETY: an array map value, valid while the program runs; other CPUs may write it
    // concurrently, which the claim below accounts for.
    let old = unsafe { ptr.read_volatile() };
    let mut s = old;
    let signal = codel::step(
        &mut s,
        &a.codel,
        depart - floor,
        edt::tx_time_ns(len, a.rate),
        depart,
    );
    // SAFETY (the accesses below): fields of the map value above.
    unsafe {
        if signal {
            // Claim the signal: a signal always moves `signal_next`, so of CPUs that read the
            // same state only one wins it.
            let (_, won) = atomic_cxchg::<u64, { Relaxed }, { Relaxed }>(
                core::ptr::addr_of_mut!((*ptr).signal_next),
                old.signal_next,
                s.signal_next,
            );
            if !won {
                return 0;
            }
            core::ptr::addr_of_mut!((*ptr).count).write_volatile(s.count);
            core::ptr::addr_of_mut!((*ptr).lastcount).write_volatile(s.lastcount);
        }
        if signal || s.first_above != old.first_above || s.signalling != old.signalling {
            core::ptr::addr_of_mut!((*ptr).first_above).write_volatile(s.first_above);
            core::ptr::addr_of_mut!((*ptr).signalling).write_volatile(s.signalling);
        }
    }
    if !signal {
        0
    } else if a.codel.ecn() {
        MARK
    } else {
        DROP
    }
}

/// `v` through this CPU's scratch word: a value the verifier does not know. The packets that
/// skip CoDel (0) and those that ran it (the global function's unknown result) then continue
/// as one verifier state through the pacer, instead of two.
/// Copies CoDel parameters field by field: a whole-struct assignment becomes a call of BPF's
/// `memmove`, a byte loop.
#[inline(always)]
fn copy_params(to: &mut CodelParams, from: &CodelParams) {
    to.target_ns = from.target_ns;
    to.interval_ns = from.interval_ns;
    to.flags = from.flags;
    to._pad = 0;
}

#[inline(always)]
pub fn opaque(scratch: *mut u32, v: u32) -> u32 {
    // SAFETY: a word of this CPU's map value; volatile so LLVM keeps the round trip.
    unsafe {
        scratch.write_volatile(v);
        scratch.read_volatile()
    }
}

/// The ECN bits of the IP header at `l3` (0 when it cannot be read).
#[inline(always)]
fn ecn_bits(ctx: &TcContext, l3: usize, v6: bool) -> u8 {
    // IPv4: the TOS byte is the second; IPv6: the traffic class straddles the first two bytes,
    // its ECN bits are bits 4-5 of the second.
    match ctx.load::<u8>(l3 + 1) {
        Ok(b) if v6 => (b >> 4) & 3,
        Ok(b) => b & 3,
        Err(_) => 0,
    }
}

/// Marks CE in the IP header at `l3` (IPv4 with an incremental header checksum update; IPv6
/// has no header checksum, and the traffic class is not in the pseudo-header).
#[inline(always)]
pub fn set_ce(ctx: &TcContext, l3: usize, v6: bool) -> Result<(), ()> {
    let w: u16 = ctx.load::<u16>(l3).map_err(|_| ())?; // the first two bytes, as in memory
    let b = w.to_ne_bytes();
    let ce = if v6 { 3 << 4 } else { 3 };
    if b[1] & ce == ce {
        return Ok(());
    }
    let new = b[1] | ce;
    ctx.store(l3 + 1, &new, 0).map_err(|_| ())?;
    if !v6 {
        let w2 = u16::from_ne_bytes([b[0], new]);
        ctx.l3_csum_replace(l3 + 10, w as u64, w2 as u64, 2)
            .map_err(|_| ())?;
    }
    Ok(())
}
