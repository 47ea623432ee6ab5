//! A QJump level's counters, derived from its classes' (the datapath counts a packet in its
//! class slot only: a level's own per-CPU counters were one cache line more for every packet,
//! about 5-8 ns under real traffic, for sums the agent can make exactly).
//!
//! The [`Ledger`] (`names::LEDGER`, pinned) says which level each class slot counts in. A slot
//! keeps its level from the policy write that gives it a class until the write that gives it
//! another class or another level, whether or not the live policy still uses it, so a packet
//! classified by a policy just replaced (in flight at the flip) counts where that policy put
//! it. The compiler gives a new class, and a class that changes level, a slot the live policy
//! does not use; the datapath writes a policy only after the grace period of the previous
//! flip; so when a slot changes hands, nothing can count in it under its old owner any more,
//! and every level's totals are exact across reloads. Only where a policy uses every slot does
//! a class change level in place, and then packets in flight at that reload may count in its
//! new level.
//!
//! A class's counters are its slot's beyond the slot's mark (what it held when the class took
//! it); a level's are its base plus its slots' beyond their marks. Everything here is pure.

use paceline_common::maps::{Counters, Ledger, MAX_CLASSES, MAX_LEVELS, PolicyTable};

/// A ledger of zeroes (never written).
pub fn empty() -> Box<Ledger> {
    // SAFETY: `Ledger` is plain integers, for which all-zero bytes are a valid value.
    unsafe { Box::<Ledger>::new_zeroed().assume_init() }
}

/// The level of each class slot a policy uses (`None` past its classes).
fn class_level(t: &PolicyTable, class: usize) -> Option<usize> {
    (class < t.n_classes as usize && class < MAX_CLASSES)
        .then(|| (t.classes[class].level as usize) & (MAX_LEVELS - 1))
}

fn minus(a: &Counters, b: &Counters) -> Counters {
    let mut d = *a;
    d.sub(b);
    d
}

/// Each class slot's counters (`slots[s]` beyond its mark) and each level's, as the ledger
/// makes them up.
pub fn view(ledger: &Ledger, slots: &[Counters]) -> (Vec<Counters>, Vec<Counters>) {
    let classes: Vec<Counters> = slots
        .iter()
        .zip(ledger.marks.iter())
        .map(|(c, m)| minus(c, m))
        .collect();
    let mut levels = ledger.bases.to_vec();
    for (s, c) in classes.iter().enumerate() {
        if let Some(l) = ledger.slot_level.get(s).and_then(|l| l.checked_sub(1)) {
            levels[usize::from(l) & (MAX_LEVELS - 1)].add(c);
        }
    }
    (classes, levels)
}

/// The first write of a ledger, under an agent of an older build whose datapath counted levels
/// per packet (`legacy_levels`: `PL_STATS`'s level slots) or on a fresh start (all zero): the
/// live policy's slots count in their levels, and each level's totals carry on from what the
/// older datapath counted.
pub fn adopt(
    ledger: &mut Ledger,
    live: Option<&PolicyTable>,
    slots: &[Counters],
    legacy_levels: &[Counters],
) {
    *ledger = *empty();
    for (l, c) in legacy_levels.iter().take(MAX_LEVELS).enumerate() {
        ledger.bases[l] = *c;
    }
    if let Some(t) = live {
        for (s, c) in slots.iter().enumerate() {
            if let Some(l) = class_level(t, s) {
                ledger.slot_level[s] = l as u8 + 1;
                ledger.bases[l].sub(c);
            }
        }
    }
    ledger.written = 1;
}

/// A policy write: each slot `new` uses counts in the level it gives it from now on.
/// `reassigned[s]`: slot `s` now holds another class (which starts from zero); `levels_reset`
/// (bit `l`): level slot `l` now names another level (which starts from zero). A slot that
/// changes level or owner leaves what it counted so far in its old level.
pub fn write(
    ledger: &mut Ledger,
    new: &PolicyTable,
    slots: &[Counters],
    reassigned: &[bool],
    levels_reset: u32,
) {
    for (s, c) in slots.iter().enumerate() {
        let Some(l) = class_level(new, s) else {
            continue;
        };
        let fresh = reassigned.get(s).copied().unwrap_or(false);
        let was = ledger.slot_level[s];
        if !fresh && usize::from(was) == l + 1 {
            continue;
        }
        let so_far = minus(c, &ledger.marks[s]);
        if let Some(old) = was.checked_sub(1) {
            ledger.bases[usize::from(old) & (MAX_LEVELS - 1)].add(&so_far);
        }
        if fresh {
            ledger.marks[s] = *c;
        } else {
            // The class keeps its counters; its new level starts with none of them.
            ledger.bases[l].sub(&so_far);
        }
        ledger.slot_level[s] = l as u8 + 1;
    }
    if levels_reset != 0 {
        let (_, totals) = view(ledger, slots);
        for (l, total) in totals.iter().enumerate() {
            if levels_reset & (1 << l) != 0 {
                ledger.bases[l].sub(total);
            }
        }
    }
    ledger.written = 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(packets: u64) -> Counters {
        let mut c = Counters {
            packets,
            bytes: packets * 1000,
            ..Counters::default()
        };
        c.held_by[1] = packets / 2;
        c.delay_hist[3] = packets;
        c
    }

    fn policy(levels: &[u32]) -> PolicyTable {
        let mut t = PolicyTable::empty();
        t.n_classes = levels.len() as u32;
        for (c, l) in levels.iter().enumerate() {
            t.classes[c].level = *l;
        }
        t
    }

    fn slots(packets: &[u64]) -> Vec<Counters> {
        let mut v: Vec<Counters> = packets.iter().map(|p| counts(*p)).collect();
        v.resize(MAX_CLASSES, Counters::default());
        v
    }

    fn bump(slots: &mut [Counters], s: usize, packets: u64) {
        slots[s].add(&counts(packets));
    }

    fn no_reassign() -> Vec<bool> {
        vec![false; MAX_CLASSES]
    }

    /// A level counts what its slots count; a class what its slot counts.
    #[test]
    fn a_level_is_its_base_and_its_slots() {
        let mut lg = empty();
        let mut s = slots(&[0, 0, 0]);
        write(&mut lg, &policy(&[1, 2, 1]), &s, &no_reassign(), 0);
        bump(&mut s, 0, 5);
        bump(&mut s, 1, 7);
        bump(&mut s, 2, 11);
        let (classes, levels) = view(&lg, &s);
        assert_eq!(levels[1].packets, 5 + 11);
        assert_eq!(levels[1].bytes, (5 + 11) * 1000);
        assert_eq!(levels[1].delay_hist[3], 5 + 11);
        assert_eq!(levels[2].packets, 7);
        assert_eq!(levels[0].packets, 0);
        assert_eq!(classes[2].packets, 11);
    }

    /// A slot the new policy no longer uses keeps counting in its level (packets in flight
    /// at the flip), and a new class in a fresh slot starts from zero.
    #[test]
    fn a_removed_classs_late_packets_still_count_in_its_level() {
        let mut lg = empty();
        let mut s = slots(&[0, 0, 0]);
        write(&mut lg, &policy(&[0, 1]), &s, &no_reassign(), 0);
        bump(&mut s, 1, 10);
        // Slot 1's class is removed (a policy of one class)...
        write(&mut lg, &policy(&[0]), &s, &no_reassign(), 0);
        // ...and packets the old policy classified, in flight at the flip, count in slot 1.
        bump(&mut s, 1, 3);
        // The next policy gives slot 2 a new class of level 1.
        let mut fresh = no_reassign();
        fresh[2] = true;
        bump(&mut s, 2, 50); // what an earlier owner of slot 2 left there
        write(&mut lg, &policy(&[0, 0, 1]), &s, &fresh, 0);
        let (classes, levels) = view(&lg, &s);
        assert_eq!(
            levels[1].packets, 13,
            "late packets count where their policy put them"
        );
        assert_eq!(classes[2].packets, 0, "the new class starts from zero");
    }

    /// A slot given to another class: the old class's history stays in its level, the new
    /// class (and the level it joins) start from what happens from now on.
    #[test]
    fn a_slot_given_to_another_class_leaves_its_history_behind() {
        let mut lg = empty();
        let mut s = slots(&[0, 0]);
        write(&mut lg, &policy(&[0, 1]), &s, &no_reassign(), 0);
        bump(&mut s, 1, 10);
        let mut fresh = no_reassign();
        fresh[1] = true;
        write(&mut lg, &policy(&[0, 2]), &s, &fresh, 0);
        let (classes, levels) = view(&lg, &s);
        assert_eq!(classes[1], Counters::default(), "the new class starts from zero");
        assert_eq!((levels[1].packets, levels[2].packets), (10, 0));
        bump(&mut s, 1, 4);
        let (classes, levels) = view(&lg, &s);
        assert_eq!(classes[1].packets, 4);
        assert_eq!((levels[1].packets, levels[2].packets), (10, 4));
        assert_eq!(levels[1].held_by[1], 5);
    }

    /// A class that changes level in its slot (a policy that uses every slot) keeps its own
    /// counters; its old level keeps its history, its new level counts it from now on.
    #[test]
    fn a_class_moved_in_place_keeps_its_counters_and_its_levels_theirs() {
        let mut lg = empty();
        let mut s = slots(&[0, 0]);
        write(&mut lg, &policy(&[1, 1]), &s, &no_reassign(), 0);
        bump(&mut s, 0, 2);
        bump(&mut s, 1, 1);
        write(&mut lg, &policy(&[1, 2]), &s, &no_reassign(), 0);
        let (classes, levels) = view(&lg, &s);
        assert_eq!(
            (levels[1].packets, levels[2].packets),
            (3, 0),
            "the reload moved no count"
        );
        bump(&mut s, 0, 1);
        bump(&mut s, 1, 1);
        let (classes2, levels) = view(&lg, &s);
        assert_eq!((levels[1].packets, levels[2].packets), (4, 1));
        assert_eq!((classes[1].packets, classes2[1].packets), (1, 2));
    }

    /// A level slot that now names another level starts from zero; its slots count in it
    /// from then on.
    #[test]
    fn a_renamed_level_starts_from_zero() {
        let mut lg = empty();
        let mut s = slots(&[0, 0]);
        write(&mut lg, &policy(&[0, 1]), &s, &no_reassign(), 0);
        bump(&mut s, 0, 6);
        bump(&mut s, 1, 9);
        write(&mut lg, &policy(&[0, 1]), &s, &no_reassign(), 1 << 1);
        let (_, levels) = view(&lg, &s);
        assert_eq!((levels[0].packets, levels[1].packets), (6, 0));
        bump(&mut s, 1, 2);
        assert_eq!(view(&lg, &s).1[1].packets, 2);
    }

    /// The first write after an older datapath (levels counted per packet): every level's
    /// totals carry on from what it counted, and from then on they follow the slots.
    #[test]
    fn adopting_an_older_datapaths_levels_keeps_their_totals() {
        let live = policy(&[0, 1]);
        let s = slots(&[4, 6]);
        let mut legacy = vec![Counters::default(); MAX_LEVELS];
        legacy[0] = counts(4 + 100); // 100 from classes since removed
        legacy[1] = counts(6);
        let mut lg = empty();
        adopt(&mut lg, Some(&live), &s, &legacy);
        let (_, levels) = view(&lg, &s);
        assert_eq!((levels[0].packets, levels[1].packets), (104, 6));
        assert_eq!(levels[0].bytes, 104_000);
        let mut fresh = empty();
        adopt(&mut fresh, None, &slots(&[]), &[]);
        assert_eq!(fresh.written, 1);
        assert_eq!(view(&fresh, &slots(&[])).1[0], Counters::default());
    }
}
