//! The policy banks: writing a policy into the bank of maps the datapath is not reading, then
//! switching banks ([`Datapath::write_policy`], [`Datapath::settle`]), and the diffing that
//! makes a policy a few rules apart cost a few map writes (`words_into`, `hash_into`). The
//! state a bank keeps between writes (`Bank`, `BankMap`) is a field of [`Datapath`], so its
//! types stand beside it in `datapath.rs`.

use std::os::fd::AsFd;
use std::sync::Arc;

use anyhow::{Context as _, Result, anyhow};
use paceline_common::{
    classify::Rule,
    ctab::{CT_FAST, CT_SHAPE_ARRAYS},
    maps::{CTAB_FAST_WORDS, CodelState, PolicyTable},
};

use crate::kernel::bpfsys;
use crate::kernel::datapath::{Bank, BankMap, Datapath};
use paceline_policy::ctab::Image;

/// Logs a grace period the kernel would not wait (`membarrier` refused, as on nohz_full
/// CPUs): [`bpfsys::wait_for_readers`] slept instead.
fn settled(membarrier: bool) {
    if !membarrier {
        log::debug!("membarrier(MEMBARRIER_CMD_GLOBAL) refused (nohz_full?); waited 50 ms instead");
    }
}

impl Datapath {
    /// Writes a policy into the bank that is not live (its table and its classifier maps),
    /// then makes that bank live with one write, in force from then on, and returns while the
    /// grace period after it runs in the background: the next call (and [`Datapath::settle`])
    /// waits until no program can still be reading the other bank before writing into it.
    /// Packets in flight see the old or the new policy, never a mix; flow and aggregate clocks
    /// are untouched.
    ///
    /// Both banks keep their maps. A bank this process wrote holds a known image, so the next
    /// policy written into it changes only the words and entries that differ (a policy that
    /// changes a few rules writes a few entries); a table that does not fit its map, or that
    /// differs in more entries than it has, goes into a fresh map instead.
    pub fn write_policy(&mut self, table: &PolicyTable, image: &Arc<Image>) -> Result<u64> {
        self.settle();
        let live = self.active.get(&0, 0).context("reading PL_ACTIVE")? & 1;
        let next = live ^ 1;
        // What the standby bank holds, if this process wrote it and its maps are still the
        // installed ones (a test may put other maps there).
        let old = self.banks[next as usize]
            .take()
            .filter(|b| self.bank_installed(next, b));
        let (old_image, [old_words, old_sels, old_rules], old_fast) = match old {
            Some(b) => (Some(b.image), b.maps.map(Some), b.fast),
            None => (None, [None, None, None], false),
        };
        let empty = Image::empty();
        let was = old_image.as_deref().unwrap_or(&empty);
        let words =
            words_into(old_words, &was.words, &image.words).context("writing the classifier's word table")?;
        let sels = hash_into(old_sels, &was.sels, &image.sels, "pl_ctab_sels")
            .context("writing the classifier's selector table")?;
        let rules = hash_into(old_rules, &was.rules, &image.rules, "pl_ctab_rules")
            .context("writing the classifier's rule table")?;
        // Words that fit are written again where the tc program reads them without a helper
        // call (`ctab::CT_FAST`); the words map keeps them too, for the next policy's diff.
        // That reader takes the one-address rules from their arrays, which the compiler adds
        // only where everything fits (`CT_SHAPE_ARRAYS`).
        let fast = image.words.len() <= CTAB_FAST_WORDS as usize && image.header.flags & CT_SHAPE_ARRAYS != 0;
        if fast {
            // With their direct lists (`ctab::LIST_DIRECT`), which only that reader reads.
            let held = (old_fast && old_image.is_some()).then(|| was.fast_words());
            bpfsys::patch_words(
                self.ctab_fast.fd().as_fd(),
                bpfsys::WordLayout::Packed,
                next as usize * CTAB_FAST_WORDS as usize,
                CTAB_FAST_WORDS as usize,
                held.as_deref(),
                &image.fast_words(),
                paceline_common::ctab::NONE,
            )
            .context("writing PL_CTAB_FAST")?;
        }
        for ((map, outer), what) in [&words, &sels, &rules]
            .into_iter()
            .zip([&mut self.ctab_words, &mut self.ctab_sels, &mut self.ctab_rules])
            .zip(["word", "selector", "rule"])
        {
            if map.fresh {
                outer
                    .set(next, &map.map.data, 0)
                    .with_context(|| format!("installing the {what} table"))?;
            }
        }
        // A CoDel whose parameters change starts over: state built under other parameters (or
        // left from before CoDel was turned off) is not this CoDel's.
        if let Ok(old) = self.tables.get(&live, 0) {
            let classes = old
                .classes
                .iter()
                .zip(table.classes.iter())
                .map(|(a, b)| (a.codel, b.codel));
            let levels = old
                .levels
                .iter()
                .zip(table.levels.iter())
                .map(|(a, b)| (a.codel, b.codel));
            for (slot, (before, after)) in classes.chain(levels).enumerate() {
                if before != after {
                    self.codel
                        .set(slot as u32, CodelState::default(), 0)
                        .context("resetting PL_CODEL")?;
                }
            }
        }
        // From the flip on, each slot of this policy counts in the level it gives it
        // (`levels::write`). Written before the flip, after the grace period of the last one
        // (`settle` above): a slot that changes hands here is one no program can still count
        // in under its old owner, so no level gains or loses a packet at the switch.
        let slots = self.class_counters()?;
        let (before, adopted) = self.ledger_now(&slots)?;
        let mut ledger = before.clone();
        crate::kernel::levels::write(&mut ledger, table, &slots, &self.reassigned, self.levels_reset);
        self.write_ledger(&ledger)?;
        let generation = self.generation + 1;
        let mut t = *table;
        t.ctab = image.header;
        if fast {
            t.ctab.flags |= CT_FAST;
        }
        t.generation = generation;
        let flipped = self
            .tables
            .set(next, t, 0)
            .context("writing PL_TABLES")
            .and_then(|()| self.active.set(0, next, 0).context("flipping PL_ACTIVE"));
        if let Err(e) = flipped {
            // The live policy stays: so do the levels its slots count in.
            if let Err(undo) = self.write_ledger(&before) {
                log::warn!("restoring PL_LEDGER after a failed policy write: {undo:#}");
            }
            return Err(e);
        }
        self.generation = generation;
        self.reassigned.fill(false);
        self.levels_reset = 0;
        if adopted {
            // The first ledger carries the levels' totals an older datapath kept in `PL_STATS`'s
            // level slots; zeroed once it is written, so that a ledger started again later (its
            // type changed) starts them from zero, not from those old totals again.
            if let Err(e) = self.zero_legacy_levels() {
                log::warn!("zeroing PL_STATS' level slots: {e:#}");
            }
        }
        // The policy is in force from the flip on. Programs that read the old bank number may
        // still look its maps up: they are waited out (an RCU grace period, 9-26 ms) in the
        // background, and the next policy, written into that bank, waits for the end first.
        self.grace = match std::thread::Builder::new()
            .name("pl-grace".into())
            .spawn(bpfsys::wait_for_readers)
        {
            Ok(h) => Some(h),
            Err(_) => {
                settled(bpfsys::wait_for_readers());
                None
            }
        };
        self.banks[next as usize] = Some(Bank {
            image: image.clone(),
            maps: [words, sels, rules].map(|m| m.map),
            fast,
        });
        Ok(self.generation)
    }

    /// Waits until no program can still be reading the bank the last policy flip left (the
    /// grace period [`Datapath::write_policy`] leaves running), if one is still running.
    pub fn settle(&mut self) {
        if let Some(h) = self.grace.take() {
            // A panicked wait (it cannot: a syscall) is waited again here.
            settled(h.join().unwrap_or_else(|_| bpfsys::wait_for_readers()));
        }
    }

    /// Does slot `bank` of each outer map still hold the map `b` names?
    fn bank_installed(&self, bank: u32, b: &Bank) -> bool {
        [&self.ctab_words, &self.ctab_sels, &self.ctab_rules]
            .into_iter()
            .zip(&b.maps)
            .all(|(outer, m)| {
                outer
                    .get(&bank, 0)
                    .ok()
                    .and_then(|d| d.info().ok())
                    .is_some_and(|i| i.id() == m.id)
            })
    }

    /// Compiles `rules` (first match wins) into `table`'s classifier and writes both (tests and
    /// benchmarks that build tables by hand).
    pub fn write_rules(&mut self, table: &PolicyTable, rules: &[Rule]) -> Result<u64> {
        let image = paceline_policy::ctab::build(rules).map_err(|e| anyhow!("compiling the rules: {e}"))?;
        self.write_policy(table, &Arc::new(image))
    }
}

/// A table written: its map, and whether that map is new (to be installed in the bank).
struct Written {
    map: BankMap,
    fresh: bool,
}

/// Room a fresh map gets past its image's entries, so that the policies after it, a few rules
/// apart, fit in the same map.
fn with_room(n: usize) -> usize {
    n + n / 16 + 256
}

/// The words table `new` for a bank whose map is `old` (holding `was`): patched in place when
/// it fits, else a fresh mmap-able inner array of `u32`.
fn words_into(old: Option<BankMap>, was: &[u32], new: &[u32]) -> Result<Written> {
    if let Some(m) = old
        && m.capacity >= new.len()
    {
        bpfsys::patch_mmapable(m.fd(), was, new)?;
        return Ok(Written { map: m, fresh: false });
    }
    let capacity = with_room(new.len());
    let fd = bpfsys::map_create(
        bpfsys::BPF_MAP_TYPE_ARRAY,
        4,
        4,
        capacity as u32,
        bpfsys::BPF_F_INNER_MAP | bpfsys::BPF_F_MMAPABLE,
        "pl_ctab_words",
    )?;
    bpfsys::patch_mmapable(fd.as_fd(), &[], new)?;
    Ok(Written {
        map: BankMap::new(fd, capacity)?,
        fresh: true,
    })
}

/// The hash table `new` (sorted by key) for a bank whose map is `old` (holding `was`, sorted
/// by key): the keys gone deleted and the entries new or changed written, in batches, when the
/// table fits and that is less than writing it whole; else a fresh inner hash map.
fn hash_into<K: Copy + Ord, V: Copy + PartialEq>(
    old: Option<BankMap>,
    was: &[(K, V)],
    new: &[(K, V)],
    name: &str,
) -> Result<Written> {
    if let Some(m) = old
        && m.capacity >= new.len()
    {
        let (gone, set) = sorted_diff(was, new);
        if gone.len() + set.len() <= new.len() {
            bpfsys::delete_batch(m.fd(), &gone)?;
            let (keys, values): (Vec<K>, Vec<V>) = set.into_iter().unzip();
            bpfsys::update_batch(m.fd(), &keys, &values)?;
            return Ok(Written { map: m, fresh: false });
        }
    }
    let capacity = with_room(new.len());
    let fd = bpfsys::map_create(
        bpfsys::BPF_MAP_TYPE_HASH,
        std::mem::size_of::<K>() as u32,
        std::mem::size_of::<V>() as u32,
        capacity as u32,
        0,
        name,
    )?;
    let keys: Vec<K> = new.iter().map(|e| e.0).collect();
    let values: Vec<V> = new.iter().map(|e| e.1).collect();
    bpfsys::update_batch(fd.as_fd(), &keys, &values)?;
    Ok(Written {
        map: BankMap::new(fd, capacity)?,
        fresh: true,
    })
}

/// Between two tables sorted by key: the keys of `was` that `new` lacks, and the entries of
/// `new` that `was` lacks or holds with another value.
fn sorted_diff<K: Copy + Ord, V: Copy + PartialEq>(was: &[(K, V)], new: &[(K, V)]) -> (Vec<K>, Vec<(K, V)>) {
    let (mut gone, mut set) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < was.len() || j < new.len() {
        match (was.get(i), new.get(j)) {
            (Some(a), Some(b)) if a.0 == b.0 => {
                if a.1 != b.1 {
                    set.push(*b);
                }
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) if a.0 < b.0 => {
                gone.push(a.0);
                i += 1;
            }
            (Some(a), None) => {
                gone.push(a.0);
                i += 1;
            }
            (_, Some(b)) => {
                set.push(*b);
                j += 1;
            }
            (None, None) => unreachable!("the loop runs while one is left"),
        }
    }
    (gone, set)
}

#[cfg(test)]
mod tests {
    use super::sorted_diff;

    #[test]
    fn a_sorted_diff_names_the_keys_gone_and_the_entries_new_or_changed() {
        let was = [(1, 'a'), (2, 'b'), (4, 'd'), (6, 'f')];
        let new = [(2, 'b'), (3, 'c'), (4, 'e'), (7, 'g')];
        assert_eq!(
            sorted_diff(&was, &new),
            (vec![1, 6], vec![(3, 'c'), (4, 'e'), (7, 'g')])
        );
        assert_eq!(sorted_diff(&was, &was), (vec![], vec![]));
        assert_eq!(sorted_diff::<u32, char>(&[], &new[..1]), (vec![], vec![(2, 'b')]));
    }
}
