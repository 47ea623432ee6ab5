//! The datapath's maps. Names, layouts and sizes come from `paceline_common::maps`; the agent
//! resizes `PL_FLOWS` at load time from the policy's `flow_table_size`.

use aya_ebpf::{
    btf_maps::{Array as BtfArray, ArrayOfMaps, HashMap as BtfHashMap},
    macros::{btf_map, map},
    maps::{Array, LruHashMap, PerCpuArray, ProgramArray, RingBuf},
};
use paceline_common::{
    abi,
    classify::PacketInfo,
    ctab::{CT_FAST, NONE, RuleKey, SelKey, Tables},
    maps::{
        ADMIT_SLOTS, AGG_SLOTS, AdmitSlot, AggClock, CTAB_FAST_WORDS, Counters, CpuState,
        DEFAULT_FLOW_TABLE_SIZE, FastWords, FlowState, FlowTableKey, Ledger, PolicyTable,
    },
    trace::{TRACE_RING_BYTES, TraceConfig},
};

#[map(name = "PL_ACTIVE")]
pub static ACTIVE: Array<u32> = Array::with_max_entries(1, 0);

#[map(name = "PL_TABLES")]
pub static TABLES: Array<PolicyTable> = Array::with_max_entries(2, 0);

#[map(name = "PL_FLOWS")]
pub static FLOWS: LruHashMap<FlowTableKey, FlowState> =
    LruHashMap::with_max_entries(DEFAULT_FLOW_TABLE_SIZE, 0);

/// Flows seen once (see `paceline_common::maps::AdmitSlot`), shared by all CPUs.
#[map(name = "PL_ADMIT")]
pub static ADMIT: Array<AdmitSlot> = Array::with_max_entries(ADMIT_SLOTS, 0);

#[map(name = "PL_AGG_CLOCKS")]
pub static AGG_CLOCKS: Array<AggClock> = Array::with_max_entries(AGG_SLOTS as u32, 0);

/// Global counters and the scratch slot, one value per CPU.
#[map(name = "PL_CPU")]
pub static CPU: PerCpuArray<CpuState> = PerCpuArray::with_max_entries(1, 0);

/// `paceline trace`: what to record (the agent writes it; flags 0: off).
#[map(name = "PL_TRACE_CFG")]
pub static TRACE_CFG: Array<TraceConfig> = Array::with_max_entries(1, 0);

/// `paceline trace`: the program the egress program tail-calls while a trace runs (index 0;
/// the agent installs it when a trace starts).
#[map(name = "PL_TRACE_PROG")]
pub static TRACE_PROG: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// `paceline trace`: the records, for the agent to read.
#[map(name = "PL_TRACE_RING")]
pub static TRACE_RING: RingBuf = RingBuf::with_byte_size(TRACE_RING_BYTES, 0);

/// Per class counters, one value per CPU (the level slots are no longer written: see
/// `names::STATS`).
#[map(name = "PL_STATS")]
pub static STATS: PerCpuArray<Counters> = PerCpuArray::with_max_entries(AGG_SLOTS as u32, 0);

/// The agent's: which level each class slot's counters count in (see `names::LEDGER`). No
/// program reads it; it is declared here so that the agent creates and pins it with the rest.
#[map(name = "PL_LEDGER")]
pub static LEDGER: Array<Ledger> = Array::with_max_entries(1, 0);

/// Inner arrays of any size fit the outer map, and the agent fills the words with one copy
/// instead of a syscall per word.
const WORDS_FLAGS: usize = (abi::BPF_F_INNER_MAP | abi::BPF_F_MMAPABLE) as usize;

/// The compiled classifier's parts, one inner map per bank (see `paceline_common::ctab`).
/// The templates' sizes are placeholders: the agent creates each bank's maps at the size its
/// policy needs.
type Words = BtfArray<u32, 1, WORDS_FLAGS>;
type Sels = BtfHashMap<SelKey, u32, 1>;
type Rules = BtfHashMap<RuleKey, u32, 1>;

#[btf_map]
static PL_CTAB_WORDS: ArrayOfMaps<Words, 2> = ArrayOfMaps::new();
/// The words again, where they fit (`ctab::CT_FAST`), a bank to an entry: see
/// `names::CTAB_FAST`.
#[map(name = "PL_CTAB_FAST")]
static CTAB_FAST: Array<FastWords> = Array::with_max_entries(2, abi::BPF_F_MMAPABLE);
#[btf_map]
static PL_CTAB_SELS: ArrayOfMaps<Sels, 2> = ArrayOfMaps::new();
#[btf_map]
static PL_CTAB_RULES: ArrayOfMaps<Rules, 2> = ArrayOfMaps::new();

/// One bank's classifier maps; `FAST`: its words are read from `CTAB_FAST` (the policy's
/// header says they are there, `CT_FAST`). One type each, chosen once per packet ([`classify`]):
/// a choice made at every word read made the verifier walk the programs twice or more.
pub struct Ctab<const FAST: bool> {
    /// The bank's words map (not `FAST`; null otherwise: not looked up).
    words: *const Words,
    sels: &'static Sels,
    rules: &'static Rules,
    /// The bank's entry of `CTAB_FAST` (`FAST` only; null otherwise).
    fast: *const FastWords,
    /// This CPU's scratch words ([`CpuState::opaque`]), looked up once a packet: each fast
    /// word's index passes through the first, and [`Tables::opaque`]'s values through both.
    scratch: *mut [u32; 2],
}

impl<const FAST: bool> Tables for Ctab<FAST> {
    #[inline(always)]
    fn word(&self, i: u32) -> u32 {
        if FAST {
            // One read into the bank's entry, which is looked up once a packet, at an index
            // masked to the bank's size: no lookup, bound check or null test a word (a branch
            // more per word cost the verifier a walk more of what follows a NONE). The index
            // passes through this CPU's memory first, so that the verifier, which checks the
            // read's offset, takes it as any value under the mask: read straight from `i`, it
            // tracked every word the index came from precisely and walked the egress program
            // past a million instructions.
            // SAFETY: `fast` is the bank's map value and `scratch` this CPU's scratch words,
            // both valid for this program run; volatile so LLVM keeps the round trip.
            unsafe {
                let index = self.scratch.cast::<u32>();
                index.write_volatile(i);
                let j = index.read_volatile() & (CTAB_FAST_WORDS - 1);
                (*self.fast)[j as usize]
            }
        } else {
            // SAFETY: not `FAST`: the bank's words map, valid for this program run.
            unsafe { (*self.words).get(i) }.copied().unwrap_or(NONE)
        }
    }

    #[inline(always)]
    fn sel(&self, key: &SelKey) -> u32 {
        // SAFETY: the selector maps are only written before their bank goes live.
        unsafe { self.sels.get(key) }.copied().unwrap_or(NONE)
    }

    #[inline(always)]
    fn rule(&self, key: &RuleKey) -> u32 {
        // SAFETY: as above.
        unsafe { self.rules.get(key) }.copied().unwrap_or(NONE)
    }

    /// The fast words hold the one-address arrays (the agent sets `CT_FAST` only with
    /// `CT_SHAPE_ARRAYS`); the words map's readers take the rule table. A constant: the
    /// verifier walks one way.
    #[inline(always)]
    fn shape_arrays(&self, _: &paceline_common::ctab::CtabHeader) -> bool {
        FAST
    }

    /// The fast words are written with their direct lists (`ctab::LIST_DIRECT`).
    #[inline(always)]
    fn direct_lists(&self) -> bool {
        FAST
    }

    #[inline(always)]
    fn opaque(&self, v: [u32; 2]) -> [u32; 2] {
        // SAFETY: this CPU's scratch words, valid for this program run; volatile so LLVM keeps
        // the round trip.
        unsafe {
            self.scratch.write_volatile(v);
            self.scratch.read_volatile()
        }
    }
}

/// The live policy's table and bank (one read of the bank number: a packet sees one policy);
/// `None` before the agent wrote a policy (generation 0).
#[inline(always)]
pub fn active() -> Option<(&'static PolicyTable, u32)> {
    let bank = *ACTIVE.get(0)? & 1;
    let table = TABLES.get(bank)?;
    (table.generation != 0).then_some((table, bank))
}

/// The classifier's maps of `bank` (looked up only by packets that need classifying).
#[inline(always)]
fn ctab<const FAST: bool>(bank: u32) -> Option<Ctab<FAST>> {
    Some(Ctab {
        words: if FAST {
            core::ptr::null()
        } else {
            PL_CTAB_WORDS.get(bank)?
        },
        sels: PL_CTAB_SELS.get(bank)?,
        rules: PL_CTAB_RULES.get(bank)?,
        fast: if FAST {
            CTAB_FAST.get_ptr(bank & 1)?
        } else {
            core::ptr::null()
        },
        scratch: &mut cpu()?.opaque,
    })
}

/// [`classify`] reading the words from their map alone, for a program that classifies once a
/// connection (sock_ops): a helper call a word costs little there, and the verifier walks one
/// classifier, not two (Linux 6.1 verified sock_ops in 285,601 instructions with both, 215,934
/// with this one; an agent's start under emulation spent about 8 s verifying it).
#[inline(always)]
pub fn classify_once(table: &PolicyTable, bank: u32, p: &PacketInfo) -> (u32, u32) {
    ctab::<false>(bank).map_or((table.default_class, NONE), |t| {
        paceline_common::ctab::classify_rule(&table.ctab, &t, p, table.default_class)
    })
}

/// The class of `p` under the policy `table` in `bank`, and the rule that gave it
/// (`ctab::classify_rule`); the default class when the bank's maps are missing.
#[inline(always)]
pub fn classify(table: &PolicyTable, bank: u32, p: &PacketInfo) -> (u32, u32) {
    let h = &table.ctab;
    let fallback = (table.default_class, NONE);
    if h.flags & CT_FAST != 0 {
        ctab::<true>(bank).map_or(fallback, |t| {
            paceline_common::ctab::classify_rule(h, &t, p, table.default_class)
        })
    } else {
        ctab::<false>(bank).map_or(fallback, |t| {
            paceline_common::ctab::classify_rule(h, &t, p, table.default_class)
        })
    }
}

/// This CPU's counters of a class or level slot.
#[inline(always)]
pub fn stats(slot: u32) -> Option<&'static mut Counters> {
    // SAFETY: per-CPU slot; the program runs with preemption disabled on this CPU.
    STATS.get_ptr_mut(slot).map(|p| unsafe { &mut *p })
}

/// This CPU's global counters and scratch slot.
#[inline(always)]
pub fn cpu() -> Option<&'static mut CpuState> {
    // SAFETY: per-CPU slot; the program runs with preemption disabled on this CPU.
    CPU.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

/// Reads back the packet the parser wrote into this CPU's scratch value: the copy the caller
/// gets is made of values the verifier does not know, so every parse path (VLAN or not, IPv4
/// or IPv6, each extension header) converges into one verifier state instead of re-verifying
/// classification and pacing once per parse path.
#[inline(always)]
pub fn read_back(cpu: &CpuState) -> PacketInfo {
    // SAFETY: a field of this CPU's map value; volatile so LLVM does not forward the parser's
    // stores.
    unsafe { core::ptr::addr_of!(cpu.scratch).read_volatile() }
}
