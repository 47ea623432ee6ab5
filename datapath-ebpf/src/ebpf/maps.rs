//! The datapath's maps. Names, layouts and sizes come from `paceline_common::maps`; the agent
//! resizes `PL_FLOWS` at load time from the policy's `flow_table_size`.

use aya_ebpf::{
    macros::map,
    maps::{Array, LruHashMap, PerCpuArray},
};
use paceline_common::{
    classify::PacketInfo,
    maps::{AGG_SLOTS, AggClock, CpuState, DEFAULT_FLOW_TABLE_SIZE, FlowKey, FlowState, PolicyTable},
};

#[map(name = "PL_ACTIVE")]
pub static ACTIVE: Array<u32> = Array::with_max_entries(1, 0);

#[map(name = "PL_TABLES")]
pub static TABLES: Array<PolicyTable> = Array::with_max_entries(2, 0);

#[map(name = "PL_FLOWS")]
pub static FLOWS: LruHashMap<FlowKey, FlowState> = LruHashMap::with_max_entries(DEFAULT_FLOW_TABLE_SIZE, 0);

#[map(name = "PL_AGG_CLOCKS")]
pub static AGG_CLOCKS: Array<AggClock> = Array::with_max_entries(AGG_SLOTS as u32, 0);

/// Counters and the scratch slot, one value per CPU (one lookup per packet).
#[map(name = "PL_CPU")]
pub static CPU: PerCpuArray<CpuState> = PerCpuArray::with_max_entries(1, 0);

/// The live policy table, if the agent has written one.
#[inline(always)]
pub fn active_table() -> Option<&'static PolicyTable> {
    let idx = *ACTIVE.get(0)?;
    TABLES.get(idx & 1)
}

/// This CPU's counters and scratch slot.
#[inline(always)]
pub fn cpu() -> Option<&'static mut CpuState> {
    // SAFETY: per-CPU slot; the program runs with preemption disabled on this CPU.
    CPU.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

/// Stores `pkt` in the scratch slot and reads it back: the copy the caller gets is made of
/// values the verifier does not know, so every parse path (VLAN or not, IPv4 or IPv6, each
/// extension header) converges into one verifier state instead of re-verifying
/// classification and pacing once per parse path.
#[inline(always)]
pub fn launder(cpu: &mut CpuState, pkt: &PacketInfo) -> PacketInfo {
    let p: *mut PacketInfo = &mut cpu.scratch;
    // SAFETY: a field of this CPU's map value; volatile so LLVM does not forward the stores.
    unsafe {
        p.write_volatile(*pkt);
        p.read_volatile()
    }
}
