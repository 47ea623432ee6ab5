//! The compiler's warnings about rules an earlier rule covers (they can never match), and the
//! covered-rule search they come from: from nothing, or after the running policy's
//! ([`crate::ctab::shadow`]).

use paceline_common::classify::Rule;

/// The covered-rule search of `table` (normalized: `norms`): after the running policy's (its
/// rule table and what its search found), when the two have as many rules and differ in a few
/// (among `edited`: the others are the same), only for the rules those reach
/// ([`crate::ctab::shadow::search_after`]).
pub(crate) fn covered_rules(
    table: &[Rule],
    norms: &[crate::ctab::Norm],
    running: Option<(&[Rule], &crate::ctab::shadow::Covered)>,
    edited: &[usize],
) -> crate::ctab::shadow::Covered {
    use crate::ctab::shadow;
    let Some((run_table, run_covered)) = running.filter(|(t, _)| t.len() == table.len()) else {
        return shadow::search(norms);
    };
    let mut changed = Vec::new();
    for &i in edited {
        let before = &run_table[i];
        if table[i] == *before {
            continue;
        }
        match crate::ctab::normalize(i, before) {
            Ok(old) if old == norms[i] => {}
            Ok(old) if changed.len() < shadow::MAX_CHANGED => changed.push((i, old)),
            _ => return shadow::search(norms),
        }
    }
    shadow::search_after(norms, run_covered, &changed)
}

/// Most "can never match" warnings listed; the rest are counted.
const MAX_SHADOW_WARNINGS: usize = 20;

/// Warns about rules that an earlier rule covers: they can never match. `rules(i)`: rule i's
/// origin in the policy and what it matches; `located(at, path, message)`: the message with
/// the line of the policy it is about.
pub(crate) fn shadow_warnings<'a>(
    table: &[Rule],
    found: &crate::ctab::shadow::Covered,
    rules: impl Fn(usize) -> (&'a str, &'a str),
    warnings: &mut Vec<String>,
    located: impl Fn(&str, &str, String) -> String,
) {
    let (covered, complete) = (found.pairs.iter().copied(), found.complete);
    // Offline, cgroups are not resolved and every cgroup rule carries the placeholder id 0:
    // two rules on different cgroups would look alike. Such a pair says nothing.
    let unresolved = |i: usize| table[i].cgroup_mask != 0 && table[i].cgroup_id == 0;
    let covered: Vec<_> = covered
        .filter(|&(later, earlier)| {
            !(unresolved(later) && unresolved(earlier) && rules(later).1 != rules(earlier).1)
        })
        .collect();
    for (later, earlier) in covered.iter().take(MAX_SHADOW_WARNINGS) {
        let (origin, matches) = rules(*later);
        let (earlier_origin, earlier_matches) = rules(*earlier);
        // `spec.rules[2] (src[1], dst[0])`: the line is the rule's.
        let at = origin.split(' ').next().unwrap_or(origin);
        warnings.push(located(
            at,
            "",
            format!("{origin}: can never match: {earlier_origin} ({earlier_matches}) comes first and covers it ({matches})"),
        ));
    }
    if covered.len() > MAX_SHADOW_WARNINGS {
        warnings.push(located(
            "spec.rules",
            "spec.rules",
            format!(
                "{} more rules can never match (an earlier rule covers each)",
                covered.len() - MAX_SHADOW_WARNINGS
            ),
        ));
    }
    if !complete {
        warnings.push(located(
            "spec.rules",
            "spec.rules",
            "the search for rules that can never match stopped early (too many rules to compare)".into(),
        ));
    }
}
