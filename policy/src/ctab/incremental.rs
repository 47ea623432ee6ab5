//! The build itself ([`build_after`]): rules normalized in, an [`Image`] out, and what an
//! image keeps for the next build ([`Memo`]): the stages whose inputs an edit leaves unchanged
//! (an address dimension's ECs and tries, the field ECs and phases, a group's rule-table
//! entries) are taken from the image before instead of built again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use paceline_common::classify::Rule;
use paceline_common::ctab::{
    CT_CGROUP, CT_DST, CT_SEL, CT_SHAPE_ARRAYS, CT_SRC, CtabHeader, LIST_AT, LIST_DIRECT, LIST_DIRECT_AT,
    LIST_DIRECT_DST, LIST_ONE, MAX_PHASE_ARRAY_WORDS, MAX_SEL_MATCH, NONE, PHASES, RuleKey, SEL_ANY,
    SEL_BOTH, SEL_DST, SEL_FIRST, SEL_SRC, SEL_WORDS, SHAPE_AT_DST, SHAPE_AT_SRC, SHAPE_BOTH, SHAPE_DST,
    SHAPE_SRC, SelKey, TAG_CGROUP, TAG_PHASE, rule_tag, shape_at,
};
use paceline_common::maps::CTAB_FAST_WORDS;

use super::addr::{self, Ranges};
use super::fields::FieldEcs;
use super::stages::{AddrStage, FieldStage};
use super::{BuildError, BuildTimes, Ids, Image, Limits, Norm, SelList, Selector, Stats, limit};

/// What a build keeps for the next one ([`build_after`]).
#[derive(Debug, Default)]
pub(super) struct Memo {
    pub(super) src: Option<Arc<AddrStage>>,
    pub(super) dst: Option<Arc<AddrStage>>,
    pub(super) fields: Option<Arc<FieldStage>>,
    /// Per selector and shape (any, src, dst, both), its rules; and the most address-EC pairs
    /// one of them covers.
    groups: Vec<[Vec<u32>; 4]>,
    group_max: Vec<[usize; 4]>,
    /// The selector without conditions: its one-address rules are arrays, not rule-table
    /// entries, so another selector of its id takes nothing from it.
    any_sel: Option<u32>,
    /// Each rule's family when it has addresses.
    families: Vec<Option<bool>>,
}

/// [`super::build_normalized`] for the policy after `prev`'s: the parts whose inputs are those `prev`
/// was built from are taken from it, not built again: an address dimension's ECs and tries
/// (when every rule has the same prefix there), the field ECs and phases (the same
/// selectors), a selector's rule-table entries in an address shape (the same rules, prefixes
/// and ECs). The image is the one [`super::build_normalized`] makes (`tests::incremental_*`).
pub fn build_after(
    rules: &[Rule],
    norms: &[Norm],
    lim: &Limits,
    prev: Option<&Image>,
) -> Result<Image, BuildError> {
    let memo = prev.map(|p| &*p.memo);
    let mut times = BuildTimes::default();
    let mut clock = Instant::now();
    let mut lap = |d: &mut Duration| {
        let now = Instant::now();
        *d = now - clock;
        clock = now;
    };
    let mut st = Stats {
        rules: rules.len(),
        ..Stats::default()
    };
    let mut h = CtabHeader::empty();
    h.n_rules = rules.len() as u32;
    let mut words: Vec<u32> = Vec::new();

    // ---- address ECs and tries ----
    let too_big = || BuildError::Limit {
        what: "words",
        count: lim.words as u64 + 1,
        limit: lim.words as u64,
        hint: "address tries".into(),
    };
    let src = AddrStage::reuse_or_build(memo.and_then(|m| m.src.as_ref()), norms, |n| n.src, words.len())
        .map_err(|_| too_big())?;
    src.place(&mut words, &mut h.src_root, &mut h.src_default)
        .map_err(|_| too_big())?;
    let dst = AddrStage::reuse_or_build(memo.and_then(|m| m.dst.as_ref()), norms, |n| n.dst, words.len())
        .map_err(|_| too_big())?;
    dst.place(&mut words, &mut h.dst_root, &mut h.dst_default)
        .map_err(|_| too_big())?;
    if src.used {
        h.flags |= CT_SRC;
    }
    if dst.used {
        h.flags |= CT_DST;
    }
    let (src_ecs, dst_ecs) = (&src.ecs, &dst.ecs);
    st.src_ecs = src_ecs.count;
    st.dst_ecs = dst_ecs.count;
    limit("words", words.len(), lim.words, || "address tries".into())?;
    lap(&mut times.addresses);

    // ---- selectors ----
    let mut sel_ids: Ids<Selector> = Ids::new();
    // A YAML rule's address list expands into consecutive rules of one selector: the one before
    // is compared first, and hashed only when it differs.
    let mut last: Option<(&Selector, u32)> = None;
    let rule_sel: Vec<u32> = norms
        .iter()
        .map(|n| match last {
            Some((s, id)) if *s == n.sel => id,
            _ => {
                let id = sel_ids.id(&n.sel);
                last = Some((&n.sel, id));
                id
            }
        })
        .collect();
    let sels = sel_ids.list;
    st.selectors = sels.len();
    // Per selector, per shape (any, src, dst, both): the rules, in order.
    let mut groups: Vec<[Vec<u32>; 4]> = vec![Default::default(); sels.len()];
    for (i, n) in norms.iter().enumerate() {
        groups[rule_sel[i] as usize][n.shape()].push(i as u32);
    }
    let first_of = |v: &Vec<u32>| v.first().copied().unwrap_or(NONE);
    let any_sel = sels.iter().position(Selector::is_any).map(|i| i as u32);
    h.any_sel = any_sel.unwrap_or(NONE);

    // ---- field ECs over the selectors that have conditions ----
    let has_conds = sels.iter().any(|s| !s.is_any());
    let mut sel_entries: Vec<(SelKey, u32)> = Vec::new();
    // The last phase's array words that name one selector (`LIST_ONE`), and the selector.
    let mut one_sel_words: Vec<(u32, u32)> = Vec::new();
    let mut rule_entries: Vec<(RuleKey, u32)> = Vec::new();
    let fields = match memo.and_then(|m| m.fields.as_ref()) {
        Some(f) if f.sels == sels && f.lim == *lim => f.clone(),
        _ => Arc::new(FieldStage::new(&sels, any_sel, lim)?),
    };
    if has_conds {
        let f = &*fields;
        h.flags |= CT_SEL;
        st.p_ecs = f.p.count();
        st.sport_ecs = f.sp.count();
        st.dport_ecs = f.dp.count();
        let mut table = |e: &FieldEcs, used: bool| -> u32 {
            if used && e.count() > 1 {
                let off = words.len() as u32;
                words.extend_from_slice(&e.table);
                off
            } else {
                NONE
            }
        };
        h.p_off = table(&f.p, f.used[0]);
        h.sport_off = table(&f.sp, f.used[1]);
        h.dport_off = table(&f.dp, f.used[2]);
        st.mark_ecs = f.mark_ecs;
        h.n_marks = f.marks.len() as u32;
        for (i, m) in f.marks.iter().enumerate() {
            h.marks[i] = [m.value, m.mask];
            if m.known {
                h.marks_known |= 1 << i;
            }
        }
        st.cgroups = f.cgroups.len();
        if f.any_cgroup {
            h.flags |= CT_CGROUP;
            for (i, id) in f.cgroups.iter().enumerate() {
                rule_entries.push((
                    RuleKey {
                        tag: TAG_CGROUP,
                        a: *id as u32,
                        b: (*id >> 32) as u32,
                    },
                    i as u32 + 1,
                ));
            }
        }
        let ph = f.phases.as_ref().expect("built for selectors with conditions");
        h.phases = ph.mask;
        // Each phase as an array while they fit together (see `CtabHeader::phase_off`); a
        // phase before the last that has one leaves the rule table.
        // Only in the words the limit leaves after what must follow (at most: the selector
        // lists, the selector records, the address-only arrays, the rule classes): a policy
        // that fits without arrays still compiles, its phases through their hash tables.
        let rest = ph.sets.len() * (2 + MAX_SEL_MATCH)
            + sels.len() * SEL_WORDS as usize
            + (src_ecs.count + dst_ecs.count) as usize
            + norms.len();
        let mut room = MAX_PHASE_ARRAY_WORDS.min(lim.words.saturating_sub(words.len() + rest) as u64);
        let mut arrays = [false; PHASES as usize];
        for (i, &(prevs, vals)) in ph.dims.iter().enumerate() {
            let n = u64::from(prevs) * u64::from(vals);
            if ph.mask & (1 << i) != 0 && n <= room {
                room -= n;
                arrays[i] = true;
                h.phase_off[i] = words.len() as u32;
                h.phase_stride[i] = vals;
                words.resize(words.len() + n as usize, NONE);
            }
        }
        let last_phase = (31 - ph.mask.leading_zeros()) as usize;
        for &(k, next) in &ph.rule_entries {
            let phase = ((k.tag - TAG_PHASE) / 4) as usize;
            if arrays[phase] {
                let (off, stride) = (h.phase_off[phase], h.phase_stride[phase]);
                words[(off + k.a * stride + k.b) as usize] = next;
            } else {
                rule_entries.push((k, next));
            }
        }
        // What each final set yields: the first address-free rule of its selectors (they match
        // every packet that reaches the set), and, sorted by their first address rule, the
        // selectors whose address rules could still come before it.
        let any_first = any_sel.map_or(NONE, |s| first_of(&groups[s as usize][0]));
        let addr_first = |g: &[Vec<u32>; 4]| {
            g[1..]
                .iter()
                .filter_map(|v| v.first().copied())
                .min()
                .unwrap_or(NONE)
        };
        let mut lists: Vec<Option<SelList>> = Vec::with_capacity(ph.sets.len());
        for set in &ph.sets {
            let any_best = set
                .iter()
                .map(|s| first_of(&groups[s as usize][0]))
                .min()
                .unwrap_or(NONE);
            let cut = any_best.min(any_first);
            let mut addr: Vec<u32> = set
                .iter()
                .filter(|&s| addr_first(&groups[s as usize]) < cut)
                .collect();
            addr.sort_by_key(|&s| addr_first(&groups[s as usize]));
            if addr.len() > MAX_SEL_MATCH {
                return Err(BuildError::Limit {
                    what: "selectors with address conditions one packet can match",
                    count: addr.len() as u64,
                    limit: MAX_SEL_MATCH as u64,
                    hint: format!(
                        "rules {} overlap in protocol, ports, DSCP, mark or cgroup, each with addresses",
                        addr.iter()
                            .map(|&s| addr_first(&groups[s as usize]).to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                });
            }
            let mut kept = SelList {
                any_best,
                n: addr.len() as u32,
                ..SelList::default()
            };
            kept.sel[..addr.len()].copy_from_slice(&addr);
            lists.push((any_best != NONE || kept.n > 0).then_some(kept));
        }
        // What each set yields (`LIST_AT`): its rule, or a list in the words, one per set.
        let yields: Vec<u32> = lists
            .iter()
            .map(|l| match l {
                None => NONE,
                Some(l) if l.n == 0 => {
                    debug_assert!(l.any_best & LIST_AT == 0);
                    l.any_best
                }
                Some(l) if l.n == 1 && l.any_best == NONE => {
                    debug_assert!(l.sel[0] < LIST_ONE);
                    LIST_AT | LIST_ONE | l.sel[0]
                }
                Some(l) => {
                    let at = words.len() as u32;
                    debug_assert!(at < LIST_ONE);
                    words.extend_from_slice(&[l.any_best, l.n]);
                    words.extend_from_slice(&l.sel[..l.n as usize]);
                    LIST_AT | at
                }
            })
            .collect();
        // The last phase's array, or else the selector table, holds what each key yields.
        let direct = arrays[last_phase];
        for &(key, set) in &ph.last {
            let y = yields[set as usize];
            if direct {
                let (off, stride) = (h.phase_off[last_phase], h.phase_stride[last_phase]);
                let at = off + key.prev * stride + key.val;
                words[at as usize] = y;
                if y != NONE && y & (LIST_AT | LIST_ONE) == LIST_AT | LIST_ONE {
                    one_sel_words.push((at, y & (LIST_ONE - 1)));
                }
            } else if y != NONE {
                sel_entries.push((key, y));
            }
        }
        sel_entries.sort_by_key(|(k, _)| *k);
    }
    st.sel_entries = sel_entries.len();
    lap(&mut times.phases);

    // ---- rule tables ----
    let mut src_any = if any_sel.is_some_and(|s| !groups[s as usize][SHAPE_SRC as usize].is_empty()) {
        Some(vec![NONE; src_ecs.count as usize])
    } else {
        None
    };
    let mut dst_any = if any_sel.is_some_and(|s| !groups[s as usize][SHAPE_DST as usize].is_empty()) {
        Some(vec![NONE; dst_ecs.count as usize])
    } else {
        None
    };
    // Per group (selector and shape), its rules' entries, the first rule winning a key: sorted
    // by (key, rule) and deduplicated. `done` counts the entries of the groups before.
    let mut rule_list: Vec<(RuleKey, u32)> = rule_entries;
    let mut done = 0usize;
    let mut group: Vec<(RuleKey, u32)> = Vec::new();
    let dedup = |group: &mut Vec<(RuleKey, u32)>| {
        group.sort_unstable();
        group.dedup_by_key(|(k, _)| *k);
    };
    // A group's entries are those of the image before when its rules are (the same indices,
    // prefixes and families, under the same selector id and address ECs): what the selector
    // itself is does not enter them.
    let families: Vec<Option<bool>> = norms.iter().map(|n| n.addr_family).collect();
    // When a dimension's ECs were built again (a prefix came or went), the ECs that stay keep
    // their order: a group whose rules kept their prefixes and whose ECs all stay, with none
    // added among them, has the entries before with the ECs moved (`EcMoves::keeps`). A group
    // with a rule whose prefix changed is built again.
    let moves = memo.and_then(|m| {
        let (ps, pd) = (m.src.as_ref()?, m.dst.as_ref()?);
        let n = norms.len();
        (ps.input.len() == n && pd.input.len() == n).then(|| {
            let moves = |p: &Arc<AddrStage>, s: &Arc<AddrStage>| {
                (!Arc::ptr_eq(p, s)).then(|| (addr::EcMoves::new(&p.ecs, &s.ecs), p.clone()))
            };
            [moves(ps, &src), moves(pd, &dst)]
        })
    });
    let mut dirty: Vec<[bool; 4]> = vec![[false; 4]; groups.len()];
    if let Some(mv) = &moves {
        for (m, now) in mv.iter().zip([&src, &dst]) {
            if let Some((_, before)) = m {
                for i in 0..norms.len() {
                    if before.prefix(i) != now.prefix(i) {
                        dirty[rule_sel[i] as usize][norms[i].shape()] = true;
                    }
                }
            }
        }
    }
    let mut group_max: Vec<[usize; 4]> = vec![[0; 4]; groups.len()];
    for (si, g) in groups.iter().enumerate() {
        let is_any = Some(si as u32) == any_sel;
        for shape in [SHAPE_SRC, SHAPE_DST, SHAPE_BOTH] {
            let tag = rule_tag(si as u32, shape);
            let rules_of = &g[shape as usize];
            if let Some([src_mv, dst_mv]) = &moves
                && !((is_any || memo.is_some_and(|m| m.any_sel == Some(si as u32))) && shape != SHAPE_BOTH)
                && !dirty[si][shape as usize]
            {
                let (m, prev) = (memo.expect("moves"), prev.expect("a memo is an image's"));
                let max = m.group_max.get(si).map_or(0, |g| g[shape as usize]);
                let start = prev.rules.partition_point(|(k, _)| k.tag < tag);
                let len = prev.rules[start..].partition_point(|(k, _)| k.tag == tag);
                let entries = &prev.rules[start..start + len];
                // The ECs the entries cover, per dimension the group uses: sorted by (a, b).
                let (uses_src, uses_dst) = (shape != SHAPE_DST, shape != SHAPE_SRC);
                let span_a = entries.first().zip(entries.last()).map(|(f, l)| (f.0.a, l.0.a));
                let span_b = entries
                    .iter()
                    .map(|(k, _)| k.b)
                    .fold(None, |s: Option<(u32, u32)>, b| {
                        Some(s.map_or((b, b), |(lo, hi)| (lo.min(b), hi.max(b))))
                    });
                let stays =
                    |mv: &Option<(addr::EcMoves, Arc<AddrStage>)>, span: Option<(u32, u32)>, used: bool| {
                        !used
                            || mv.is_none()
                            || span.is_none_or(|(lo, hi)| mv.as_ref().is_some_and(|m| m.0.keeps(lo, hi)))
                    };
                if m.groups.get(si).is_some_and(|pg| pg[shape as usize] == *rules_of)
                    && rules_of
                        .iter()
                        .all(|&ri| m.families[ri as usize] == families[ri as usize])
                    && done + len + max <= lim.rules
                    && stays(src_mv, span_a, uses_src)
                    && stays(dst_mv, span_b, uses_dst)
                {
                    // No rule of it could pass the limit: each checks at most this.
                    let moved = |mv: &Option<(addr::EcMoves, Arc<AddrStage>)>, e: u32, used: bool| match mv {
                        Some((m, _)) if used => m.get(e),
                        _ => e,
                    };
                    if src_mv.is_none() && dst_mv.is_none() {
                        rule_list.extend_from_slice(entries);
                    } else {
                        rule_list.extend(entries.iter().map(|&(k, r)| {
                            let a = moved(src_mv, k.a, uses_src);
                            (
                                RuleKey {
                                    tag,
                                    a,
                                    b: moved(dst_mv, k.b, uses_dst),
                                },
                                r,
                            )
                        }));
                    }
                    done += len;
                    group_max[si][shape as usize] = max;
                    continue;
                }
            }
            group.clear();
            for &ri in rules_of {
                let n = &norms[ri as usize];
                let a_box = n
                    .src
                    .map_or(Ranges::one(0, 1), |p| src_ecs.ranges(Some(&p), n.addr_family));
                let b_box = n
                    .dst
                    .map_or(Ranges::one(0, 1), |p| dst_ecs.ranges(Some(&p), n.addr_family));
                let size = a_box.count() * b_box.count();
                group_max[si][shape as usize] = group_max[si][shape as usize].max(size);
                if is_any && shape != SHAPE_BOTH {
                    let arr = if shape == SHAPE_SRC {
                        &mut src_any
                    } else {
                        &mut dst_any
                    };
                    let arr = arr.as_mut().expect("allocated for this shape");
                    claim(arr, if shape == SHAPE_SRC { &a_box } else { &b_box }, ri);
                    continue;
                }
                // The limit is on distinct entries: count the group's exactly only when its
                // entries with repeats would pass it.
                if done + group.len() + size > lim.rules {
                    dedup(&mut group);
                }
                limit("rule table", done + group.len() + size, lim.rules, || {
                    format!(
                        "rule {ri}'s addresses cover {size} address classes (prefixes of other rules nested inside its own)"
                    )
                })?;
                for &(a0, a1) in a_box.iter() {
                    for a in a0..a1 {
                        for &(b0, b1) in b_box.iter() {
                            for b in b0..b1 {
                                let (a, b) = match shape {
                                    SHAPE_SRC => (a, 0),
                                    SHAPE_DST => (0, b),
                                    _ => (a, b),
                                };
                                group.push((RuleKey { tag, a, b }, ri));
                            }
                        }
                    }
                }
            }
            dedup(&mut group);
            done += group.len();
            rule_list.extend_from_slice(&group);
        }
    }
    // The groups come in tag order; the cgroup and phase entries go among them.
    rule_list.sort_unstable_by_key(|(k, _)| *k);
    st.rule_entries = rule_list.len();
    lap(&mut times.rule_table);

    // ---- the one-address arrays ----
    // For the tc program where it reads the words without a helper call: every selector's
    // rules with one address condition also as an array over that dimension's ECs (an array
    // read instead of a hash lookup per packet), when all of them fit with the rest of the
    // words in the fast words (`CT_SHAPE_ARRAYS`). The rule table keeps those rules too, for
    // the readers of the words map (sock_ops; a policy too large for the fast words).
    let ec_count = |shape: u32| {
        (if shape == SHAPE_SRC {
            src_ecs.count
        } else {
            dst_ecs.count
        }) as usize
    };
    let one_addr: Vec<(usize, u32)> = (0..groups.len())
        .filter(|&si| Some(si as u32) != any_sel)
        .flat_map(|si| [SHAPE_SRC, SHAPE_DST].map(|shape| (si, shape)))
        .filter(|&(si, shape)| !groups[si][shape as usize].is_empty())
        .collect();
    let need: usize = one_addr.iter().map(|&(_, shape)| ec_count(shape)).sum();
    // The records, and the two words per selector that name its arrays (`shape_at`).
    let after = sels.len() * (SEL_WORDS as usize + 2)
        + src_any.as_ref().map_or(0, Vec::len)
        + dst_any.as_ref().map_or(0, Vec::len)
        + rules.len();
    let mut arrays_at: Vec<[u32; 2]> = vec![[NONE; 2]; groups.len()];
    if need <= lim.shape_arrays && words.len() + need + after <= lim.words.min(CTAB_FAST_WORDS as usize) {
        h.flags |= CT_SHAPE_ARRAYS;
        for &(si, shape) in &one_addr {
            let off = words.len();
            words.resize(off + ec_count(shape), NONE);
            arrays_at[si][shape as usize - 1] = off as u32;
            let arr = &mut words[off..];
            for &ri in &groups[si][shape as usize] {
                let n = &norms[ri as usize];
                let bx = if shape == SHAPE_SRC {
                    src_ecs.ranges(n.src.as_ref(), n.addr_family)
                } else {
                    dst_ecs.ranges(n.dst.as_ref(), n.addr_family)
                };
                claim(arr, &bx, ri);
            }
        }
    }

    // ---- the rest of the words ----
    let push = |words: &mut Vec<u32>, v: &[u32]| {
        let off = words.len() as u32;
        words.extend_from_slice(v);
        off
    };
    let mut recs = Vec::with_capacity(sels.len() * SEL_WORDS as usize);
    for g in &groups {
        let mut r = [NONE; SEL_WORDS as usize];
        // The loop over a packet's listed selectors compares this with the best rule so far:
        // only their address shapes remain to be looked up.
        r[SEL_FIRST as usize] = g[1..]
            .iter()
            .filter_map(|v| v.first().copied())
            .min()
            .unwrap_or(NONE);
        r[SEL_ANY as usize] = first_of(&g[0]);
        r[SEL_SRC as usize] = first_of(&g[SHAPE_SRC as usize]);
        r[SEL_DST as usize] = first_of(&g[SHAPE_DST as usize]);
        r[SEL_BOTH as usize] = first_of(&g[SHAPE_BOTH as usize]);
        recs.extend_from_slice(&r);
    }
    if !recs.is_empty() {
        // With the arrays, each selector's two words that name them, just below the records
        // (`shape_at`: the last selector's first).
        if h.flags & CT_SHAPE_ARRAYS != 0 {
            let start = words.len() as u32;
            words.resize(words.len() + 2 * arrays_at.len(), NONE);
            let sel_off = start + 2 * arrays_at.len() as u32;
            for (s, at) in arrays_at.iter().enumerate() {
                let w = shape_at(sel_off, s as u32);
                words[(w + SHAPE_AT_SRC) as usize] = at[0];
                words[(w + SHAPE_AT_DST) as usize] = at[1];
            }
        }
        h.sel_off = push(&mut words, &recs);
    }
    if let Some(v) = &src_any {
        h.src_any_off = push(&mut words, v);
    }
    if let Some(v) = &dst_any {
        h.dst_any_off = push(&mut words, v);
    }
    if !rules.is_empty() {
        let classes: Vec<u32> = rules.iter().map(|r| u32::from(r.class)).collect();
        h.rule_class_off = push(&mut words, &classes);
    }
    // ---- the fast words' direct lists ----
    // Where a last phase's word names one selector whose rules all have one address
    // condition, in one dimension, with their array: the fast words name the array instead
    // (`LIST_DIRECT`).
    let mut fast = Vec::new();
    if h.flags & CT_SHAPE_ARRAYS != 0 {
        for &(at, sel) in &one_sel_words {
            let g = &groups[sel as usize];
            let direct = match (g[SHAPE_SRC as usize].is_empty(), g[SHAPE_DST as usize].is_empty()) {
                _ if !g[0].is_empty() || !g[SHAPE_BOTH as usize].is_empty() => None,
                (false, true) => Some((SHAPE_SRC, 0)),
                (true, false) => Some((SHAPE_DST, LIST_DIRECT_DST)),
                _ => None,
            };
            if let Some((shape, bit)) = direct {
                let arr = arrays_at[sel as usize][shape as usize - 1];
                if arr != NONE && arr <= LIST_DIRECT_AT {
                    fast.push((at, LIST_AT | LIST_ONE | LIST_DIRECT | bit | arr));
                }
            }
        }
        fast.sort_unstable();
    }
    limit("words", words.len(), lim.words, || {
        "address tries, field tables and rule classes".into()
    })?;
    st.words = words.len();
    lap(&mut times.words);
    Ok(Image {
        header: h,
        words,
        fast,
        sels: sel_entries,
        rules: rule_list,
        stats: st,
        times,
        memo: Arc::new(Memo {
            src: Some(src),
            dst: Some(dst),
            fields: Some(fields),
            groups,
            group_max,
            any_sel,
            families,
        }),
    })
}

/// Rule `ri` into every word of `arr` over `ranges` that no earlier rule took (the rules come
/// in policy order: the first that holds an EC is its rule).
fn claim(arr: &mut [u32], ranges: &Ranges, ri: u32) {
    for &(s, e) in ranges.iter() {
        for v in &mut arr[s as usize..e as usize] {
            if *v == NONE {
                *v = ri;
            }
        }
    }
}
