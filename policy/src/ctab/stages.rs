//! The stages a build can take from the build before ([`super::incremental::build_after`]):
//! an address dimension's ECs and tries ([`AddrStage`]), a function of each rule's prefix in
//! that dimension, and the field ECs with the phases that combine them ([`FieldStage`]), a
//! function of the selectors alone.

use std::sync::Arc;

use super::addr::{self, AddrEcs, Prefix};
use super::fields::{FieldEcs, MarkCond, PCond, Ports, mark_values, p_ecs, port_ecs};
use super::phases::{self, Bits};
use super::{BuildError, CgCond, Ids, Limits, Norm, Selector, limit};
use paceline_common::ctab::{CHILD, NONE};

/// Most rules with another prefix in one address dimension that [`AddrStage::after`] takes;
/// past them the stage is built from nothing.
const MAX_MOVED: usize = 64;

/// One address dimension's ECs and tries, and what they were built from: a build whose rules
/// have the same prefixes in this dimension as the image before takes them from it.
#[derive(Debug)]
pub(super) struct AddrStage {
    /// Each rule's prefix in this dimension, as its index in the ECs' prefixes
    /// ([`AddrEcs::prefixes`]), or [`NONE`]: 4 bytes a rule where the prefix took 32.
    pub(super) input: Vec<u32>,
    pub(super) ecs: AddrEcs,
    /// Some rule has a prefix here: the tries are looked up.
    pub(super) used: bool,
    /// The tries of IPv4 and IPv6 packets, as written at word `base`, their roots ([`NONE`]:
    /// no trie) and the ECs of addresses no trie prefix refines.
    pub(super) base: usize,
    pub(super) words: Vec<u32>,
    pub(super) roots: [u32; 2],
    pub(super) defaults: [u32; 2],
}

impl AddrStage {
    /// Rule `i`'s prefix.
    pub(super) fn prefix(&self, i: usize) -> Option<Prefix> {
        let at = self.input[i];
        (at != NONE).then(|| self.ecs.prefixes()[at as usize])
    }

    /// The stage of `prev` if it was built from `norms`' prefixes in dimension `dim`; else one
    /// built at word `base`: after `prev` when as many rules and at most [`MAX_MOVED`] of them
    /// have another prefix here ([`AddrStage::after`]), else from nothing.
    pub(super) fn reuse_or_build(
        prev: Option<&Arc<AddrStage>>,
        norms: &[Norm],
        dim: fn(&Norm) -> Option<Prefix>,
        base: usize,
    ) -> Result<Arc<AddrStage>, addr::TrieTooBig> {
        if let Some(p) = prev
            && p.input.len() == norms.len()
        {
            let mut changed = Vec::new();
            for (i, n) in norms.iter().enumerate() {
                if p.prefix(i) != dim(n) {
                    changed.push(i);
                    if changed.len() > MAX_MOVED {
                        break;
                    }
                }
            }
            if changed.is_empty() {
                return Ok(p.clone());
            }
            if changed.len() <= MAX_MOVED {
                return Ok(Arc::new(Self::after(p, norms, dim, base, &changed)?));
            }
        }
        Self::build(norms, dim, base).map(Arc::new)
    }

    /// The stage of `norms`' prefixes in dimension `dim` at word `base`, from nothing.
    pub(super) fn build(
        norms: &[Norm],
        dim: fn(&Norm) -> Option<Prefix>,
        base: usize,
    ) -> Result<AddrStage, addr::TrieTooBig> {
        let ecs = AddrEcs::new(norms.iter().filter_map(dim));
        // Rules come mostly in address order: the prefix after the last one found is tried
        // first.
        let all = ecs.prefixes();
        let mut next = 0usize;
        let input: Vec<u32> = norms
            .iter()
            .map(|n| match dim(n) {
                None => NONE,
                Some(p) => {
                    let at = if all.get(next) == Some(&p) {
                        next
                    } else {
                        all.binary_search(&p)
                            .expect("every rule's prefix is one of the ECs'")
                    };
                    next = at + 1;
                    at as u32
                }
            })
            .collect();
        Self::with_tries(ecs, input, base)
    }

    /// [`AddrStage::build`] after `prev`, whose rules are `norms`' but for `changed` (ascending):
    /// those rules have another prefix in dimension `dim` than in `prev`. The sorted prefixes
    /// are `prev`'s with the prefixes no rule has any more taken out and the new ones merged
    /// in, and each rule's index in them is its index before, moved (a sort of every rule's
    /// prefix and a search for each was most of an address edit's address stage); the ECs'
    /// numbering and the tries are made from them as from nothing. The stage is the one
    /// [`AddrStage::build`] makes (`tests::address_stages_after_edits_equal_stages_from_nothing`).
    pub(super) fn after(
        prev: &AddrStage,
        norms: &[Norm],
        dim: fn(&Norm) -> Option<Prefix>,
        base: usize,
        changed: &[usize],
    ) -> Result<AddrStage, addr::TrieTooBig> {
        let old = prev.ecs.prefixes();
        // The changed rules' prefixes before (as indices into `old`) and now.
        let mut gone: Vec<u32> = changed
            .iter()
            .map(|&i| prev.input[i])
            .filter(|&at| at != NONE)
            .collect();
        gone.sort_unstable();
        gone.dedup();
        let mut now: Vec<Prefix> = changed.iter().filter_map(|&i| dim(&norms[i])).collect();
        now.sort_unstable();
        now.dedup();
        // A prefix the changed rules had stays when a rule that did not change has it too, or
        // a changed rule has it now.
        let mut stays: Vec<bool> = gone
            .iter()
            .map(|&at| now.binary_search(&old[at as usize]).is_ok())
            .collect();
        if let (Some(&lo), Some(&hi)) = (gone.first(), gone.last()) {
            let mut next_changed = changed.iter().copied().peekable();
            for (i, &at) in prev.input.iter().enumerate() {
                if next_changed.peek() == Some(&i) {
                    next_changed.next();
                    continue;
                }
                if at >= lo
                    && at <= hi
                    && let Ok(k) = gone.binary_search(&at)
                {
                    stays[k] = true;
                }
            }
        }
        let removed: Vec<u32> = gone
            .iter()
            .zip(&stays)
            .filter(|(_, s)| !**s)
            .map(|(&at, _)| at)
            .collect();
        let added: Vec<Prefix> = now
            .into_iter()
            .filter(|p| old.binary_search(p).is_err())
            .collect();
        // Merged, with each old prefix's new index.
        let mut all = Vec::with_capacity(old.len() - removed.len() + added.len());
        let mut moved = vec![NONE; old.len()];
        let (mut r, mut a) = (0, 0);
        for (j, q) in old.iter().enumerate() {
            while a < added.len() && added[a] < *q {
                all.push(added[a]);
                a += 1;
            }
            if removed.get(r) == Some(&(j as u32)) {
                r += 1;
                continue;
            }
            moved[j] = all.len() as u32;
            all.push(*q);
        }
        all.extend_from_slice(&added[a..]);
        let mut input: Vec<u32> = prev
            .input
            .iter()
            .map(|&at| if at == NONE { NONE } else { moved[at as usize] })
            .collect();
        for &i in changed {
            input[i] = dim(&norms[i]).map_or(NONE, |p| {
                all.binary_search(&p)
                    .expect("every rule's prefix is one of the ECs'") as u32
            });
        }
        Self::with_tries(AddrEcs::from_sorted(all), input, base)
    }

    /// The stage of these ECs and rules' prefixes, with its tries built at word `base`.
    pub(super) fn with_tries(
        ecs: AddrEcs,
        input: Vec<u32>,
        base: usize,
    ) -> Result<AddrStage, addr::TrieTooBig> {
        let used = input.iter().any(|&i| i != NONE);
        let mut words = Vec::new();
        let mut roots = [NONE; 2];
        let mut defaults = [0; 2];
        if used {
            for v6 in [false, true] {
                let f = usize::from(v6);
                defaults[f] = ecs.default_ec(v6);
                roots[f] = ecs.build_trie(v6, base, &mut words)?.unwrap_or(NONE);
            }
        }
        Ok(AddrStage {
            input,
            ecs,
            used,
            base,
            words,
            roots,
            defaults,
        })
    }

    /// The same stage: what it was built from, its ECs and its tries.
    #[cfg(test)]
    pub(super) fn same_as(&self, o: &AddrStage) -> bool {
        self.input == o.input
            && self.ecs.same_as(&o.ecs)
            && self.used == o.used
            && self.base == o.base
            && self.words == o.words
            && self.roots == o.roots
            && self.defaults == o.defaults
    }

    /// Appends the tries to `words` (moving their child offsets when they were built elsewhere)
    /// and sets the header's roots and defaults.
    pub(super) fn place(
        &self,
        words: &mut Vec<u32>,
        roots: &mut [u32; 2],
        defaults: &mut [u32; 2],
    ) -> Result<(), addr::TrieTooBig> {
        if !self.used {
            return Ok(());
        }
        let at = words.len();
        // Building at `at` would have stopped at the same limit.
        if at + self.words.len() > addr::TRIE_WORD_LIMIT {
            return Err(addr::TrieTooBig);
        }
        let moved = |v: u32| v.wrapping_sub(self.base as u32).wrapping_add(at as u32);
        if at == self.base {
            words.extend_from_slice(&self.words);
        } else {
            words.extend(self.words.iter().map(|&w| {
                if w & CHILD != 0 {
                    CHILD | moved(w & !CHILD)
                } else {
                    w
                }
            }));
        }
        *roots = self.roots.map(|r| if r == NONE { NONE } else { moved(r) });
        *defaults = self.defaults;
        Ok(())
    }
}

/// The field ECs of a policy's selectors and the phases that combine them: a function of the
/// selectors (in id order) alone, so a build whose selectors are those of the image before
/// takes them from it.
#[derive(Debug)]
pub(super) struct FieldStage {
    /// What it was built from.
    pub(super) sels: Vec<Selector>,
    pub(super) lim: Limits,
    pub(super) p: FieldEcs,
    pub(super) sp: FieldEcs,
    pub(super) dp: FieldEcs,
    /// Some selector has a condition on protocol/DSCP, source port, destination port.
    pub(super) used: [bool; 3],
    pub(super) marks: Vec<MarkCond>,
    pub(super) mark_ecs: usize,
    pub(super) cgroups: Vec<u64>,
    pub(super) any_cgroup: bool,
    /// `None` when no selector has a condition.
    pub(super) phases: Option<phases::Phases>,
}

impl FieldStage {
    pub(super) fn new(sels: &[Selector], any_sel: Option<u32>, lim: &Limits) -> Result<Self, BuildError> {
        let mut pconds: Ids<PCond> = Ids::new();
        let mut sports: Ids<Ports> = Ids::new();
        let mut dports: Ids<Ports> = Ids::new();
        let mut marks: Ids<MarkCond> = Ids::new();
        let mut cgroups: Ids<u64> = Ids::new();
        struct SelConds {
            p: Option<u32>,
            sport: Option<u32>,
            dport: Option<u32>,
            mark: Option<u32>,
            cgroup: Option<CgCond>,
        }
        let sel_conds: Vec<SelConds> = sels
            .iter()
            .map(|s| SelConds {
                p: s.p.map(|c| pconds.id(&c)),
                sport: s.sport.as_ref().map(|c| sports.id(c)),
                dport: s.dport.as_ref().map(|c| dports.id(c)),
                mark: s.mark.map(|c| marks.id(&c)),
                cgroup: s.cgroup.inspect(|c| {
                    if let CgCond::Id { id, .. } = c {
                        cgroups.id(id);
                    }
                }),
            })
            .collect();
        limit("mark conditions", marks.list.len(), lim.marks, String::new)?;
        let mut out = FieldStage {
            sels: sels.to_vec(),
            lim: *lim,
            p: FieldEcs::default(),
            sp: FieldEcs::default(),
            dp: FieldEcs::default(),
            used: [
                !pconds.list.is_empty(),
                !sports.list.is_empty(),
                !dports.list.is_empty(),
            ],
            marks: Vec::new(),
            mark_ecs: 0,
            cgroups: Vec::new(),
            any_cgroup: false,
            phases: None,
        };
        if !sels.iter().any(|s| !s.is_any()) {
            return Ok(out);
        }
        let p = p_ecs(&pconds.list);
        let sp = port_ecs(&sports.list);
        let dp = port_ecs(&dports.list);
        let mvals = mark_values(&marks.list, lim.mark_values).ok_or_else(|| BuildError::Limit {
            what: "mark combinations",
            count: lim.mark_values as u64 + 1,
            limit: lim.mark_values as u64,
            hint: format!("{} mark conditions under overlapping masks", marks.list.len()),
        })?;
        // Cgroup ECs: 2 x (index among the policy's ids, from 1; 0 = another id) + unknown.
        let any_cgroup = sels.iter().any(|s| s.cgroup.is_some());
        let n_cg = if any_cgroup {
            2 * (cgroups.list.len() as u32 + 1)
        } else {
            1
        };
        let cg_members = |c: &Option<CgCond>| -> Vec<u32> {
            match c {
                None => (0..n_cg).collect(),
                Some(CgCond::Known) => (0..n_cg).step_by(2).collect(),
                Some(CgCond::Id { id, known }) => {
                    let idx = (cgroups.ids[id] + 1) << 1;
                    if *known { vec![idx] } else { vec![idx, idx | 1] }
                }
            }
        };
        // Per field EC, the selectors it satisfies (a selector without a condition on the
        // field: every EC).
        let n_sel = sels.len();
        let alive =
            |count: u32, cond: &dyn Fn(&SelConds) -> Option<u32>, members: &[Vec<u32>]| -> Vec<Bits> {
                let mut v = vec![Bits::empty(n_sel); count as usize];
                for (si, sc) in sel_conds.iter().enumerate() {
                    if Some(si as u32) == any_sel {
                        continue;
                    }
                    match cond(sc) {
                        None => v.iter_mut().for_each(|b| b.set(si as u32)),
                        Some(c) => members[c as usize]
                            .iter()
                            .for_each(|&e| v[e as usize].set(si as u32)),
                    }
                }
                v
            };
        let fields = phases::Fields {
            p: alive(p.count(), &|sc| sc.p, &p.members),
            dport: alive(dp.count(), &|sc| sc.dport, &dp.members),
            sport: (!sports.list.is_empty()).then(|| alive(sp.count(), &|sc| sc.sport, &sp.members)),
            mark: (!marks.list.is_empty()).then(|| {
                let bits = mvals
                    .iter()
                    .map(|&v| {
                        let mut b = Bits::empty(n_sel);
                        for (si, sc) in sel_conds.iter().enumerate() {
                            if Some(si as u32) != any_sel && sc.mark.is_none_or(|m| v & (1 << m) != 0) {
                                b.set(si as u32);
                            }
                        }
                        b
                    })
                    .collect();
                (mvals.clone(), bits)
            }),
            cgroup: any_cgroup.then(|| {
                let mut v = vec![Bits::empty(n_sel); n_cg as usize];
                for (si, sc) in sel_conds.iter().enumerate() {
                    if Some(si as u32) == any_sel {
                        continue;
                    }
                    for e in cg_members(&sc.cgroup) {
                        v[e as usize].set(si as u32);
                    }
                }
                v
            }),
        };
        out.phases = Some(phases::run(&fields, lim.sels)?);
        out.p = p;
        out.sp = sp;
        out.dp = dp;
        out.marks = marks.list;
        out.mark_ecs = mvals.len();
        out.cgroups = cgroups.list;
        out.any_cgroup = any_cgroup;
        Ok(out)
    }
}
