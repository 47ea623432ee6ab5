//! Rules that can never match because one earlier rule covers them: every condition of the
//! earlier rule contains the later rule's (same or wider protocol, ports, DSCP, mark, cgroup,
//! family and prefixes). A later rule covered only by several earlier rules together is not
//! found here.

use super::addr::Prefix;
use super::fields::{Ports, ports_contain};
use super::fx::FxMap;
use super::{CgCond, Norm, Selector};

/// What makes two rules' conditions the same shape for the search: their address prefixes,
/// selector and family.
type Shape<'a> = (Option<Prefix>, Option<Prefix>, &'a Selector, Option<bool>);

/// Most containment checks one policy gets; past it the search stops (and says so).
const BUDGET: usize = 20_000_000;

/// "No prefix" (any address) as a prefix id, and the end of a candidate list.
const NIL: u32 = u32::MAX;

/// What a search found: what the next policy's search takes for the rules an edit cannot
/// reach ([`search_after`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Covered {
    /// `(later, earlier)` pairs, by `later`: rule `later` never matches, rule `earlier` covers it.
    pub pairs: Vec<(usize, usize)>,
    /// False when the search stopped at its budget.
    pub complete: bool,
    /// At least the containment checks a search from nothing makes (exactly, after one).
    work: usize,
}

/// Most changed rules, and most rules an edit reaches, that [`search_after`] searches again
/// alone (each scans the rules before it); past them it searches from nothing.
pub const MAX_CHANGED: usize = 16;
const MAX_REACHED: usize = 64;

/// `(later, earlier)` pairs: rule `later` never matches, rule `earlier` covers it. The second
/// value is false when the search stopped at its budget.
pub fn covered(rules: &[Norm]) -> (Vec<(usize, usize)>, bool) {
    let c = search(rules);
    (c.pairs, c.complete)
}

/// Does `outer`'s address condition contain `inner`'s (is it one of the prefix pairs the search
/// for `inner` looks up)?
fn addresses_within(outer: &Norm, inner: &Norm) -> bool {
    let within = |o: &Option<Prefix>, i: &Option<Prefix>| match (o, i) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(o), Some(i)) => o.contains(i),
    };
    within(&outer.src, &inner.src) && within(&outer.dst, &inner.dst)
}

/// [`search`] of `rules`, which are `prev`'s rules (`prev` the search of them) but for
/// `changed`: each index (ascending) with the rule that was there. The result is [`search`]'s.
///
/// A rule's result depends only on the rules before it whose addresses contain its own: they
/// are its candidates, in the order the search looks them up. An edit reaches the changed rules
/// and the later rules whose addresses lie within a changed rule's old or new ones (a rule
/// within one of those lies within the changed rule too); every other rule keeps its result.
/// A reached rule is searched again over the rules before it. Past a few changed or reached
/// rules, after an incomplete search, or when the budget could be passed, it searches from
/// nothing.
pub fn search_after(rules: &[Norm], prev: &Covered, changed: &[(usize, Norm)]) -> Covered {
    if !prev.complete
        || changed.len() > MAX_CHANGED
        || changed.iter().any(|&(c, _)| c >= rules.len())
        || !changed.windows(2).all(|w| w[0].0 < w[1].0)
    {
        return search(rules);
    }
    let Some(first) = changed.first().map(|c| c.0) else {
        return prev.clone();
    };
    let mut reached = Vec::new();
    for (j, rj) in rules.iter().enumerate().skip(first) {
        let reach = changed.iter().any(|(c, old)| {
            *c == j || (*c < j && (addresses_within(old, rj) || addresses_within(&rules[*c], rj)))
        });
        if reach {
            if reached.len() == MAX_REACHED {
                return search(rules);
            }
            reached.push(j);
        }
    }
    let mut is_covered = vec![false; rules.len()];
    for &(later, _) in &prev.pairs {
        is_covered[later] = true;
    }
    let mut found: Vec<(usize, usize)> = Vec::new();
    let mut work = prev.work;
    let rank = |p: &Option<Prefix>| p.map_or(0, |p| 1 + u32::from(p.len));
    for &j in &reached {
        let rj = &rules[j];
        // The search's candidates for rule `j`: the rules before it not covered, first of their
        // addresses, selector and family, whose addresses contain `j`'s; looked up by source
        // prefix (shortest first), then destination prefix, then in rule order.
        let mut seen: FxMap<Shape<'_>, ()> = FxMap::default();
        let mut cands: Vec<usize> = Vec::new();
        for (i, ri) in rules[..j].iter().enumerate() {
            if !is_covered[i]
                && addresses_within(ri, rj)
                && seen
                    .insert((ri.src, ri.dst, &ri.sel, ri.addr_family), ())
                    .is_none()
            {
                cands.push(i);
            }
        }
        cands.sort_by_key(|&i| (rank(&rules[i].src), rank(&rules[i].dst)));
        let mut hit = None;
        for &i in &cands {
            work += 1;
            if covers(&rules[i], rj) {
                hit = Some(i);
                break;
            }
        }
        if work > BUDGET {
            return search(rules);
        }
        is_covered[j] = hit.is_some();
        if let Some(i) = hit {
            found.push((j, i));
        }
    }
    // The pairs of the rules not reached, with those found, in rule order.
    let mut pairs: Vec<(usize, usize)> = prev
        .pairs
        .iter()
        .copied()
        .filter(|(later, _)| reached.binary_search(later).is_err())
        .chain(found)
        .collect();
    pairs.sort_unstable();
    Covered {
        pairs,
        complete: true,
        work,
    }
}

/// The search from nothing ([`covered`]).
pub fn search(rules: &[Norm]) -> Covered {
    let srcs = PrefixTree::new(rules.iter().filter_map(|r| r.src));
    let dsts = PrefixTree::new(rules.iter().filter_map(|r| r.dst));
    // Per address condition (a pair of prefix ids), the first rule of each distinct selector
    // (a later rule with the same selector and addresses is covered by that one), in rule
    // order: a list threaded through `nodes` (rule, next), its first and last node.
    let mut index: FxMap<u64, (u32, u32)> = FxMap::default();
    let mut nodes: Vec<(u32, u32)> = Vec::new();
    let key = |s: u32, d: u32| (u64::from(s) << 32) | u64::from(d);
    let mut out = Vec::new();
    let mut work = 0usize;
    let (mut src_up, mut dst_up) = (Vec::new(), Vec::new());
    for (j, rj) in rules.iter().enumerate() {
        let (sj, dj) = (srcs.id(rj.src), dsts.id(rj.dst));
        srcs.ancestors(sj, &mut src_up);
        dsts.ancestors(dj, &mut dst_up);
        let mut found = None;
        'search: for &s in &src_up {
            for &d in &dst_up {
                let Some(&(mut n, _)) = index.get(&key(s, d)) else {
                    continue;
                };
                while n != NIL {
                    let (i, next) = nodes[n as usize];
                    work += 1;
                    if work > BUDGET {
                        return Covered {
                            pairs: out,
                            complete: false,
                            work,
                        };
                    }
                    if covers(&rules[i as usize], rj) {
                        found = Some(i as usize);
                        break 'search;
                    }
                    n = next;
                }
            }
        }
        match found {
            Some(i) => out.push((j, i)),
            None => {
                let node = nodes.len() as u32;
                match index.get_mut(&key(sj, dj)) {
                    None => {
                        nodes.push((j as u32, NIL));
                        index.insert(key(sj, dj), (node, node));
                    }
                    Some((first, last)) => {
                        let mut n = *first;
                        while n != NIL {
                            let ri = &rules[nodes[n as usize].0 as usize];
                            if ri.sel == rj.sel && ri.addr_family == rj.addr_family {
                                break;
                            }
                            n = nodes[n as usize].1;
                        }
                        if n == NIL {
                            nodes.push((j as u32, NIL));
                            nodes[*last as usize].1 = node;
                            *last = node;
                        }
                    }
                }
            }
        }
    }
    Covered {
        pairs: out,
        complete: true,
        work,
    }
}

/// The prefixes of one address dimension as a tree: each one's nearest enclosing prefix, so a
/// prefix's ancestors are a walk up, not a lookup per length (a lookup per length, and a
/// hashed index of prefix pairs, were most of compiling 100,000 /32 rules, `plbench apply`).
struct PrefixTree {
    /// Sorted, distinct: a prefix's id is its index.
    order: Vec<Prefix>,
    /// The nearest prefix of `order` that contains `order[i]`, or [`NIL`].
    parent: Vec<u32>,
}

impl PrefixTree {
    fn new(prefixes: impl IntoIterator<Item = Prefix>) -> Self {
        let mut order: Vec<Prefix> = prefixes.into_iter().collect();
        order.sort_unstable();
        order.dedup();
        // Sorted by (addr, len), a prefix comes right after those that contain it: a stack of
        // open ancestors holds its parent on top.
        let mut parent = vec![NIL; order.len()];
        let mut stack: Vec<u32> = Vec::new();
        for (i, p) in order.iter().enumerate() {
            while let Some(&top) = stack.last() {
                if order[top as usize].contains(p) {
                    parent[i] = top;
                    break;
                }
                stack.pop();
            }
            stack.push(i as u32);
        }
        PrefixTree { order, parent }
    }

    /// The id of a rule's prefix ([`NIL`] for none).
    fn id(&self, p: Option<Prefix>) -> u32 {
        p.map_or(NIL, |p| {
            self.order
                .binary_search(&p)
                .expect("every rule's prefix is in the tree") as u32
        })
    }

    /// Into `out`: [`NIL`] (any address), then the prefixes that contain prefix `id`, itself
    /// last (shortest first).
    fn ancestors(&self, id: u32, out: &mut Vec<u32>) {
        out.clear();
        let mut n = id;
        while n != NIL {
            out.push(n);
            n = self.parent[n as usize];
        }
        out.push(NIL);
        out.reverse();
    }
}

/// Does every packet `inner` matches also match `outer`?
pub fn covers(outer: &Norm, inner: &Norm) -> bool {
    let fam = |n: &Norm| n.addr_family.or(n.sel.p.and_then(|p| p.v6));
    let addr = |o: &Option<Prefix>, i: &Option<Prefix>| match (o, i) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(o), Some(i)) => o.contains(i),
    };
    (fam(outer).is_none() || fam(outer) == fam(inner))
        && addr(&outer.src, &inner.src)
        && addr(&outer.dst, &inner.dst)
        && selector_covers(&outer.sel, &inner.sel)
}

fn selector_covers(o: &Selector, i: &Selector) -> bool {
    let p = match (&o.p, &i.p) {
        (None, _) => true,
        (Some(a), None) => a.proto.is_none() && a.dscp.is_none() && !a.dscp_known,
        (Some(a), Some(b)) => {
            a.proto.is_none_or(|x| Some(x) == b.proto)
                && a.dscp.is_none_or(|x| Some(x) == b.dscp)
                && (!a.dscp_known || b.dscp_known)
        }
    };
    let ports = |a: &Option<Ports>, b: &Option<Ports>| match (a, b) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(a), Some(b)) => ports_contain(a, b),
    };
    let mark = match (&o.mark, &i.mark) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(a), Some(b)) => {
            a.mask & b.mask == a.mask && b.value & a.mask == a.value && (!a.known || b.known)
        }
    };
    let cgroup = match (&o.cgroup, &i.cgroup) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(CgCond::Known), Some(CgCond::Known)) => true,
        (Some(CgCond::Known), Some(CgCond::Id { known, .. })) => *known,
        (Some(CgCond::Id { .. }), Some(CgCond::Known)) => false,
        (Some(CgCond::Id { id: a, known: ka }), Some(CgCond::Id { id: b, known: kb })) => {
            a == b && (!ka || *kb)
        }
    };
    p && ports(&o.sport, &i.sport) && ports(&o.dport, &i.dport) && mark && cgroup
}
