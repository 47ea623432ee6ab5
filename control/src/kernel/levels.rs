//! A QJump level's counters, derived from its classes' (the datapath counts classes only: a
//! level's own per-CPU counters were one cache line more for every packet, about 5-8 ns under
//! real traffic, for sums the agent can make).
//!
//! A level's totals are its base (`names::LEVEL_BASE`, pinned, so they outlive the agent)
//! plus the counters of the classes the live policy puts in it. A reload that moves a class to
//! another level, removes it, or gives its slot to another class would move that class's
//! history with it; instead the bases take it over, so that each level's totals carry on
//! across the reload as counters should ([`carry`]). A level whose slot now names another
//! level starts from zero, as its clock does.

use paceline_common::maps::{Counters, MAX_CLASSES, MAX_LEVELS, PolicyTable};

/// The level of each class slot a policy uses (`None` past its classes).
pub fn class_level(t: &PolicyTable, class: usize) -> Option<usize> {
    (class < t.n_classes as usize && class < MAX_CLASSES)
        .then(|| (t.classes[class].level as usize) & (MAX_LEVELS - 1))
}

/// Each level's totals under the live policy `live` (`None`: none loaded, the bases alone).
pub fn totals(live: Option<&PolicyTable>, classes: &[Counters], bases: &[Counters]) -> Vec<Counters> {
    let mut out: Vec<Counters> = (0..MAX_LEVELS)
        .map(|l| bases.get(l).copied().unwrap_or_default())
        .collect();
    if let Some(t) = live {
        for (c, counts) in classes.iter().enumerate() {
            if let Some(l) = class_level(t, c) {
                out[l].add(counts);
            }
        }
    }
    out
}

/// The bases that keep each level's totals across a switch from policy `old` to `new`:
/// `classes` are the class counters the new policy starts from (a slot given to another class
/// already zeroed), `moved_out[l]` the counters zeroed that way of classes of level `l`, and
/// `reset` the levels (bit `l`) whose slot now names another level, which start from zero.
pub fn carry(
    old: Option<&PolicyTable>,
    new: &PolicyTable,
    classes: &[Counters],
    bases: &[Counters],
    moved_out: &[Counters],
    reset: u32,
) -> Vec<Counters> {
    let before = totals(old, classes, bases);
    let from_classes = totals(Some(new), classes, &[]);
    (0..MAX_LEVELS)
        .map(|l| {
            let mut want = if reset & (1 << l) != 0 {
                Counters::default()
            } else {
                let mut w = before[l];
                if let Some(m) = moved_out.get(l) {
                    w.add(m);
                }
                w
            };
            want.sub(&from_classes[l]);
            want
        })
        .collect()
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

    /// A level counts what its classes count, beyond its base.
    #[test]
    fn a_level_is_its_base_and_its_classes() {
        let t = policy(&[1, 2, 1]);
        let classes = [counts(5), counts(7), counts(11), counts(100)];
        let mut bases = vec![Counters::default(); MAX_LEVELS];
        bases[1] = counts(3);
        let l = totals(Some(&t), &classes, &bases);
        assert_eq!(l[1].packets, 3 + 5 + 11);
        assert_eq!(l[1].bytes, (3 + 5 + 11) * 1000);
        assert_eq!(l[1].delay_hist[3], 3 + 5 + 11);
        assert_eq!(l[2].packets, 7);
        assert_eq!(l[0].packets, 0, "slot 3 is past the policy's classes");
        assert_eq!(
            totals(None, &classes, &bases)[1].packets,
            3,
            "no policy: the bases"
        );
    }

    /// A class moved to another level, a class removed, a class slot given to another class,
    /// a level slot given to another level: every level's totals carry on (or start from zero),
    /// and the moved class counts in its new level from then on.
    #[test]
    fn a_reload_keeps_each_levels_totals() {
        let old = policy(&[0, 0, 1, 1]);
        let mut classes = vec![counts(10), counts(20), counts(30), counts(40)];
        let bases = vec![Counters::default(); MAX_LEVELS];
        let before = totals(Some(&old), &classes, &bases);
        // Class 1 moves to level 2, class 3 is removed (policy of three classes), class 2's
        // slot goes to a new class of level 1 (zeroed by the caller, its 30 moved out of
        // level 1).
        let new = policy(&[0, 2, 1]);
        classes[2] = Counters::default();
        let mut moved_out = vec![Counters::default(); MAX_LEVELS];
        moved_out[1] = counts(30);
        let bases = carry(Some(&old), &new, &classes, &bases, &moved_out, 0);
        let after = totals(Some(&new), &classes, &bases);
        for l in 0..MAX_LEVELS {
            assert_eq!(after[l], before[l], "level {l}");
        }
        // Traffic after the reload: class 1 counts in level 2.
        classes[1].add(&counts(5));
        let later = totals(Some(&new), &classes, &bases);
        assert_eq!(later[2].packets, 5, "the moved class counts in its new level");
        assert_eq!(later[0].packets, 10 + 20, "its history stays in its old level");
        assert_eq!(
            later[1].packets,
            30 + 40,
            "as do the removed and replaced classes'"
        );
        // Level 1's slot now names another level: it starts from zero, its classes' history
        // left behind.
        let bases = carry(Some(&new), &new, &classes, &bases, &[], 1 << 1);
        let reset = totals(Some(&new), &classes, &bases);
        assert_eq!(reset[1], Counters::default());
        assert_eq!(reset[2].packets, 5);
    }

    /// With no policy live before it, every level starts from zero, whatever its classes'
    /// slots hold.
    #[test]
    fn with_no_policy_before_every_level_starts_from_zero() {
        let new = policy(&[0, 1]);
        let classes = [counts(4), counts(6)];
        let bases = carry(None, &new, &classes, &[], &[], 0);
        let l = totals(Some(&new), &classes, &bases);
        assert_eq!((l[0].packets, l[1].packets), (0, 0));
    }
}
