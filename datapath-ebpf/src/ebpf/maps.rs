//! The datapath's maps. Names, layouts and sizes come from `paceline_common::maps`; the agent
//! resizes `PL_FLOWS` at load time from the policy's `flow_table_size`.

use aya_ebpf::{
    macros::map,
    maps::{Array, LruHashMap, PerCpuArray},
};
use paceline_common::{classify::PacketInfo, maps::{
    AGG_SLOTS, AggClock, Counters, FlowKey, FlowState, GlobalCounters, PolicyTable,
}};

#[map(name = "PL_ACTIVE")]
pub static ACTIVE: Array<u32> = Array::with_max_entries(1, 0);

#[map(name = "PL_TABLES")]
pub static TABLES: Array<PolicyTable> = Array::with_max_entries(2, 0);

#[map(name = "PL_FLOWS")]
pub static FLOWS: LruHashMap<FlowKey, FlowState> = LruHashMap::with_max_entries(65_536, 0);

#[map(name = "PL_AGG_CLOCKS")]
pub static AGG_CLOCKS: Array<AggClock> = Array::with_max_entries(AGG_SLOTS as u32, 0);

#[map(name = "PL_STATS")]
pub static STATS: PerCpuArray<Counters> = PerCpuArray::with_max_entries(AGG_SLOTS as u32, 0);

/// Per-CPU scratch for the parsed packet. Parsing has many paths (VLAN or not, IPv4 or IPv6,
/// each extension header); passing the result through map memory makes the verifier see one
/// state afterwards instead of re-verifying classification and pacing once per parse path.
#[map(name = "PL_SCRATCH")]
pub static SCRATCH: PerCpuArray<PacketInfo> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "PL_GLOBAL_STATS")]
pub static GLOBAL_STATS: PerCpuArray<GlobalCounters> = PerCpuArray::with_max_entries(1, 0);

/// The live policy table, if the agent has written one.
#[inline(always)]
pub fn active_table() -> Option<&'static PolicyTable> {
    let idx = *ACTIVE.get(0)?;
    TABLES.get(idx & 1)
}

#[inline(always)]
pub fn global_stats() -> Option<&'static mut GlobalCounters> {
    // SAFETY: per-CPU slot; the program runs with preemption disabled on this CPU.
    GLOBAL_STATS.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

#[inline(always)]
pub fn stats(slot: u32) -> Option<&'static mut Counters> {
    // SAFETY: as above.
    STATS.get_ptr_mut(slot).map(|p| unsafe { &mut *p })
}

/// Stores `pkt` in the scratch slot and reads it back: the copy the caller gets is made of
/// values the verifier does not know, so every parse path converges into one verifier state.
#[inline(always)]
pub fn launder(pkt: &PacketInfo) -> Option<PacketInfo> {
    let p = SCRATCH.get_ptr_mut(0)?;
    // SAFETY: per-CPU slot of the right type; volatile so LLVM does not forward the stores.
    unsafe {
        p.write_volatile(*pkt);
        Some(p.read_volatile())
    }
}
