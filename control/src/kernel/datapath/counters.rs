//! Reading the loaded object's counters and per-flow state: class and level counters summed
//! over CPUs (a level's from its classes' slots, [`crate::kernel::levels`]), a slot's reset,
//! CoDel's and the aggregate clocks' state, the flow table's entries.

use std::os::fd::AsFd;

use anyhow::{Context as _, Result, anyhow};
use aya::maps::{HashMap, MapData};
use paceline_common::{
    maps::{
        AggClock, CodelState, Counters, FlowKey, FlowState, FlowTableKey, GlobalCounters, Ledger,
        MAX_CLASSES, MAX_LEVELS, level_slot, names,
    },
    trace::TraceCpu,
};

use super::Datapath;
use crate::kernel::bpfsys;

/// Summed (over CPUs) counters of every class and level.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub classes: Vec<Counters>,
    pub levels: Vec<Counters>,
    pub global: GlobalCounters,
    /// `paceline trace`'s counters (records written, capped, lost).
    pub trace: TraceCpu,
    /// A trace is on in the datapath (its configuration's flags).
    pub tracing: bool,
    /// Entries in the flow table, counted at most every [`FLOW_COUNT_EVERY`] (`None` where
    /// nobody counted).
    pub flow_entries: Option<u64>,
}

impl Snapshot {
    /// Flows evicted from the full flow table: inserts minus the entries present (the datapath
    /// never deletes), as long as the two describe the same table.
    pub fn flow_evictions(&self) -> Option<u64> {
        self.flow_entries
            .map(|e| self.global.flow_inserts.saturating_sub(e))
    }
}

/// How long a count of the flow table's entries serves: counting walks the table with one
/// syscall per entry (about 0.5 s for a million), so scrapes and status share one count.
pub const FLOW_COUNT_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

impl Datapath {
    /// Counters of every class slot and level, summed over CPUs (a class's are its slot's
    /// beyond what the slot held when the class took it, a level's are its slots': see
    /// [`crate::kernel::levels`]).
    pub fn snapshot(&self) -> Result<Snapshot> {
        let slots = self.class_counters()?;
        let (ledger, _) = self.ledger_now(&slots)?;
        let (classes, levels) = crate::kernel::levels::view(&ledger, &slots);
        let mut s = Snapshot {
            classes,
            levels,
            global: GlobalCounters::default(),
            trace: TraceCpu::default(),
            tracing: self.trace_config().map(|c| c.flags != 0).unwrap_or(false),
            flow_entries: self.flow_entries(),
        };
        for cpu in self.cpu.get(&0, 0).context("reading PL_CPU")?.iter() {
            s.global.add(&cpu.global);
            s.trace.add(&cpu.trace);
        }
        Ok(s)
    }

    /// Every class slot's counters, summed over CPUs.
    pub(in crate::kernel) fn class_counters(&self) -> Result<Vec<Counters>> {
        (0..MAX_CLASSES as u32)
            .map(|slot| self.slot_counters(slot))
            .collect()
    }

    fn slot_counters(&self, slot: u32) -> Result<Counters> {
        let mut sum = Counters::default();
        for c in self.stats.get(&slot, 0).context("reading PL_STATS")?.iter() {
            sum.add(c);
        }
        Ok(sum)
    }

    /// The ledger as the next policy write starts from: the pinned one, or, where none was
    /// written yet (a fresh start, or the first start after an agent whose datapath counted
    /// levels per packet), one that puts the live policy's slots in their levels and carries
    /// on each level's totals from `PL_STATS`'s level slots (then `true`: adopted).
    pub(in crate::kernel) fn ledger_now(&self, slots: &[Counters]) -> Result<(Box<Ledger>, bool)> {
        let mut ledger = crate::kernel::levels::empty();
        bpfsys::lookup_into(self.ledger.fd().as_fd(), 0, &mut *ledger).context("reading PL_LEDGER")?;
        let adopted = ledger.written == 0;
        if adopted {
            let live = self.live_policy().ok().filter(|t| t.generation != 0);
            let legacy = (0..MAX_LEVELS as u32)
                .map(|l| self.slot_counters(level_slot(l)))
                .collect::<Result<Vec<_>>>()?;
            crate::kernel::levels::adopt(&mut ledger, live.as_ref(), slots, &legacy);
        }
        Ok((ledger, adopted))
    }

    /// Zeroes `PL_STATS`' level slots on every CPU (after the first ledger took their totals).
    pub(in crate::kernel) fn zero_legacy_levels(&mut self) -> Result<()> {
        let n = aya::util::nr_cpus().map_err(|(p, e)| anyhow!("reading {p}: {e}"))?;
        for l in 0..MAX_LEVELS as u32 {
            let zero = aya::maps::PerCpuValues::try_from(vec![Counters::default(); n])?;
            self.stats
                .set(level_slot(l), zero, 0)
                .context("zeroing PL_STATS")?;
        }
        Ok(())
    }

    pub(in crate::kernel) fn write_ledger(&self, ledger: &Ledger) -> Result<()> {
        bpfsys::update_from(self.ledger.fd().as_fd(), 0, ledger).context("writing PL_LEDGER")
    }

    /// Starts a class or level slot over (the slot now names another class or level): zeroes
    /// its aggregate clock and CoDel state now, and its counters from the next policy write
    /// on ([`crate::kernel::levels::write`]), which leaves what a class slot counted so far in
    /// its old level and starts a level slot from zero.
    pub fn reset_slot(&mut self, slot: u32) -> Result<()> {
        if (slot as usize) < MAX_CLASSES {
            self.reassigned[slot as usize] = true;
        } else {
            self.levels_reset |= 1 << ((slot as usize - MAX_CLASSES) & (MAX_LEVELS - 1));
        }
        // Racy against packets on other CPUs at this instant; only used when a slot changes
        // hands at a reload, when its new class has not seen traffic yet.
        self.clocks
            .set(slot, AggClock::default(), 0)
            .context("zeroing PL_AGG_CLOCKS")?;
        self.codel
            .set(slot, CodelState::default(), 0)
            .context("zeroing PL_CODEL")?;
        Ok(())
    }

    /// An aggregate's CoDel state (tests and diagnostics).
    pub fn codel_state(&self, slot: u32) -> Result<CodelState> {
        Ok(self.codel.get(&slot, 0)?)
    }

    /// An aggregate clock's value (tests and diagnostics).
    pub fn agg_clock(&self, slot: u32) -> Result<u64> {
        Ok(self.clocks.get(&slot, 0)?.t_next)
    }

    /// The flow table's entries, counted again when the last count is older than
    /// [`FLOW_COUNT_EVERY`]; `None` if the table cannot be read.
    pub fn flow_entries(&self) -> Option<u64> {
        let mut cached = self.flow_count.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, n)) = *cached
            && at.elapsed() < FLOW_COUNT_EVERY
        {
            return Some(n);
        }
        let map = self.ebpf.map(names::FLOWS)?;
        let flows: HashMap<&MapData, FlowTableKey, FlowState> = HashMap::try_from(map).ok()?;
        // Keys only: a flow evicted mid-walk restarts the walk at the first key (the kernel's
        // rule for a missing key), so bound it by the capacity plus a margin.
        let n = flows
            .keys()
            .take(self.flow_capacity as usize * 2 + 16)
            .filter(|k| k.is_ok())
            .count() as u64;
        let n = n.min(self.flow_capacity as u64);
        *cached = Some((std::time::Instant::now(), n));
        Some(n)
    }

    /// The per-flow table's entries, at most `limit` (read-only; `paceline flows`), and how
    /// many entries the table holds in all.
    pub fn flows(&self, limit: usize) -> Result<(Vec<(FlowKey, FlowState)>, usize)> {
        let m = self
            .ebpf
            .map(names::FLOWS)
            .ok_or_else(|| anyhow!("map {} missing from the eBPF object", names::FLOWS))?;
        let h: HashMap<&MapData, FlowTableKey, FlowState> = HashMap::try_from(m)?;
        let mut out = Vec::new();
        let mut total = 0;
        // Entries evicted while we walk the table are skipped.
        for (k, v) in h.iter().take(self.flow_capacity as usize * 2 + 16).flatten() {
            total += 1;
            if out.len() < limit {
                out.push((k.flow(&v), v));
            }
        }
        Ok((out, total))
    }
}
