//! Equivalence classes of the non-address fields: protocol x family x DSCP, source and
//! destination ports, mark, cgroup. Two values share an EC when they satisfy the same set of
//! the policy's conditions on that field.

use std::collections::{BTreeSet, HashMap};

use paceline_common::ctab::{P_ENTRIES, PORT_ENTRIES, p_index};

use super::fx::FxMap;

/// A condition on protocol, family and DSCP (each `None` = any). `dscp_known`: the rule
/// needs the DSCP to be visible (sock_ops cannot see it); a DSCP value alone compares with
/// whatever the caller passed, as the linear matcher does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PCond {
    pub proto: Option<u8>,
    pub v6: Option<bool>,
    pub dscp: Option<u8>,
    pub dscp_known: bool,
}

impl PCond {
    pub fn is_any(&self) -> bool {
        self.proto.is_none() && self.v6.is_none() && self.dscp.is_none() && !self.dscp_known
    }

    fn matches(&self, proto: u8, v6: bool, dscp_unknown: bool, dscp: u8) -> bool {
        self.proto.is_none_or(|p| p == proto)
            && self.v6.is_none_or(|f| f == v6)
            && !(self.dscp_known && dscp_unknown)
            && self.dscp.is_none_or(|d| d == dscp)
    }

    pub fn contains(&self, o: &PCond) -> bool {
        (self.proto.is_none() || self.proto == o.proto)
            && (self.v6.is_none() || self.v6 == o.v6)
            && (self.dscp.is_none() || self.dscp == o.dscp)
            && (!self.dscp_known || o.dscp_known)
    }
}

/// A set of ports as sorted, disjoint, inclusive intervals (`None` in a condition = any): one,
/// or two when a rule's range wraps. Held inline: a vector was an allocation per normalized
/// rule (262,144 of them compiling the largest benchmark policy). Compares, orders and derefs
/// as the slice of its intervals.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ports {
    n: u8,
    /// The intervals, then `(0, 0)`: equal sets are equal values.
    r: [(u16, u16); 2],
}

impl Ports {
    /// At most two intervals.
    pub fn new(intervals: &[(u16, u16)]) -> Self {
        assert!(intervals.len() <= 2, "a port condition has one or two intervals");
        let mut r = [(0, 0); 2];
        r[..intervals.len()].copy_from_slice(intervals);
        Ports {
            n: intervals.len() as u8,
            r,
        }
    }
}

impl std::ops::Deref for Ports {
    type Target = [(u16, u16)];

    fn deref(&self) -> &[(u16, u16)] {
        &self.r[..usize::from(self.n)]
    }
}

impl PartialOrd for Ports {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ports {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (**self).cmp(&**other)
    }
}

/// The set of ports a datapath rule's `(min, span)` matches (`port - min` wrapping at 2^16, at
/// most `span`): one interval, or two when it wraps.
pub fn port_set(min: u16, span: u16) -> Option<Ports> {
    if span == u16::MAX {
        return None;
    }
    let hi = u32::from(min) + u32::from(span);
    Some(if hi <= 0xffff {
        Ports::new(&[(min, hi as u16)])
    } else {
        Ports::new(&[(0, (hi - 0x1_0000) as u16), (min, 0xffff)])
    })
}

pub fn ports_contain(outer: &Ports, inner: &Ports) -> bool {
    inner
        .iter()
        .all(|&(lo, hi)| outer.iter().any(|&(a, b)| a <= lo && hi <= b))
}

/// ECs over a field's values, and which ECs satisfy each condition.
#[derive(Debug, Default)]
pub struct FieldEcs {
    /// The EC of each value (the table the datapath reads).
    pub table: Vec<u32>,
    /// Per EC, the conditions it satisfies (sorted).
    pub sigs: Vec<Vec<u32>>,
    /// Per condition, the ECs that satisfy it.
    pub members: Vec<Vec<u32>>,
}

impl FieldEcs {
    fn from_signatures(table: Vec<u32>, sigs: Vec<Vec<u32>>, n_conds: usize) -> Self {
        let mut members = vec![Vec::new(); n_conds];
        for (ec, s) in sigs.iter().enumerate() {
            for &c in s {
                members[c as usize].push(ec as u32);
            }
        }
        FieldEcs { table, sigs, members }
    }

    pub fn count(&self) -> u32 {
        self.sigs.len() as u32
    }
}

/// Interns signatures: EC 0 is the empty signature.
#[derive(Default)]
struct Interner {
    ids: FxMap<Vec<u32>, u32>,
    sigs: Vec<Vec<u32>>,
}

impl Interner {
    fn new() -> Self {
        let mut i = Interner::default();
        i.id(Vec::new());
        i
    }

    fn id(&mut self, sig: Vec<u32>) -> u32 {
        if let Some(&id) = self.ids.get(&sig) {
            return id;
        }
        let id = self.sigs.len() as u32;
        self.sigs.push(sig.clone());
        self.ids.insert(sig, id);
        id
    }
}

/// ECs of protocol x family x DSCP (indexed by [`p_index`]).
pub fn p_ecs(conds: &[PCond]) -> FieldEcs {
    // Values no condition names behave alike: evaluate one representative of them, so the
    // work is (named protocols + 1) x 2 x 2 x (named DSCPs + 1) evaluations.
    let protos: BTreeSet<u8> = conds.iter().filter_map(|c| c.proto).collect();
    let dscps: BTreeSet<u8> = conds.iter().filter_map(|c| c.dscp).collect();
    let rep = |named: &BTreeSet<u8>, n: usize| -> (Vec<u8>, Vec<usize>) {
        // The representatives, and each value's index among them.
        let other = (0..n).map(|v| v as u8).find(|v| !named.contains(v));
        let mut reps: Vec<u8> = named.iter().copied().collect();
        reps.extend(other);
        let idx = (0..n)
            .map(|v| reps.iter().position(|&r| r == v as u8).unwrap_or(reps.len() - 1))
            .collect();
        (reps, idx)
    };
    let (rprotos, pidx) = rep(&protos, 256);
    let (rdscps, didx) = rep(&dscps, 64);
    let mut interner = Interner::new();
    let nd = rdscps.len();
    let mut ecs = vec![0u32; rprotos.len() * 4 * nd];
    for (pi, &rp) in rprotos.iter().enumerate() {
        for (fu, (v6, unknown)) in [(false, false), (false, true), (true, false), (true, true)]
            .into_iter()
            .enumerate()
        {
            for (di, &rd) in rdscps.iter().enumerate() {
                let sig: Vec<u32> = conds
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.matches(rp, v6, unknown, rd))
                    .map(|(i, _)| i as u32)
                    .collect();
                ecs[(pi * 4 + fu) * nd + di] = interner.id(sig);
            }
        }
    }
    let mut table = vec![0u32; P_ENTRIES as usize];
    for proto in 0..=255u8 {
        for (fu, (v6, unknown)) in [(false, false), (false, true), (true, false), (true, true)]
            .into_iter()
            .enumerate()
        {
            let base = (pidx[proto as usize] * 4 + fu) * nd;
            let at = p_index(proto, v6, unknown, 0) as usize;
            for dscp in 0..64usize {
                table[at + dscp] = ecs[base + didx[dscp]];
            }
        }
    }
    FieldEcs::from_signatures(table, interner.sigs, conds.len())
}

/// ECs of a port field for the given port sets.
pub fn port_ecs(conds: &[Ports]) -> FieldEcs {
    // A sweep over interval boundaries: each elementary interval's signature is the set of
    // conditions open over it.
    let mut starts: HashMap<u32, Vec<u32>> = HashMap::new();
    let mut ends: HashMap<u32, Vec<u32>> = HashMap::new();
    let mut bounds: BTreeSet<u32> = BTreeSet::from([0, PORT_ENTRIES]);
    for (i, set) in conds.iter().enumerate() {
        for &(lo, hi) in set.iter() {
            starts.entry(u32::from(lo)).or_default().push(i as u32);
            ends.entry(u32::from(hi) + 1).or_default().push(i as u32);
            bounds.insert(u32::from(lo));
            bounds.insert(u32::from(hi) + 1);
        }
    }
    let mut interner = Interner::new();
    let mut open: BTreeSet<u32> = BTreeSet::new();
    let mut table = vec![0u32; PORT_ENTRIES as usize];
    let b: Vec<u32> = bounds.into_iter().collect();
    for w in b.windows(2) {
        let (lo, hi) = (w[0], w[1]);
        for c in ends.get(&lo).into_iter().flatten() {
            open.remove(c);
        }
        for c in starts.get(&lo).into_iter().flatten() {
            open.insert(*c);
        }
        let ec = interner.id(open.iter().copied().collect());
        for v in &mut table[lo as usize..hi as usize] {
            *v = ec;
        }
    }
    FieldEcs::from_signatures(table, interner.sigs, conds.len())
}

/// A mark condition: `mark & mask == value`, and when `known`, the mark must be visible.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MarkCond {
    pub value: u32,
    pub mask: u32,
    pub known: bool,
}

/// The mark ECs the datapath can produce: bit sets over `marks`, where conditions under one
/// mask with different values exclude each other, and an unknown mark clears the conditions
/// that need it. A superset of what packets produce; `None` past `limit`.
pub fn mark_values(marks: &[MarkCond], limit: usize) -> Option<Vec<u32>> {
    let mut masks: Vec<u32> = marks.iter().map(|c| c.mask).collect();
    masks.sort_unstable();
    masks.dedup();
    let mut out: Vec<u32> = vec![0];
    for m in masks {
        // This mask's options: no condition met, or one value met (with or without the
        // conditions that need a known mark).
        let mut values: Vec<u32> = marks.iter().filter(|c| c.mask == m).map(|c| c.value).collect();
        values.sort_unstable();
        values.dedup();
        let mut options = vec![0u32];
        for v in values {
            for known in [true, false] {
                let bits = marks
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.mask == m && c.value == v && (known || !c.known))
                    .fold(0u32, |b, (i, _)| b | (1 << i));
                if !options.contains(&bits) {
                    options.push(bits);
                }
            }
        }
        let mut next = Vec::with_capacity(out.len() * options.len());
        for &bits in &out {
            for &o in &options {
                next.push(bits | o);
            }
        }
        if next.len() > limit {
            return None;
        }
        out = next;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_ecs_split_at_boundaries() {
        let e = port_ecs(&[
            Ports::new(&[(80, 80)]),
            Ports::new(&[(0, 1023)]),
            Ports::new(&[(80, 80)]),
        ]);
        let ec80 = e.table[80];
        assert_eq!(e.sigs[ec80 as usize], vec![0, 1, 2]);
        assert_eq!(e.sigs[e.table[79] as usize], vec![1]);
        assert_eq!(e.table[79], e.table[81]);
        assert_eq!(e.table[1024], 0);
        assert_eq!(e.table[65535], 0);
    }

    #[test]
    fn wrapping_port_ranges() {
        assert_eq!(
            port_set(65000, 1000),
            Some(Ports::new(&[(0, 464), (65000, 65535)]))
        );
        assert_eq!(port_set(0, u16::MAX), None);
        assert_eq!(port_set(80, 0), Some(Ports::new(&[(80, 80)])));
    }

    #[test]
    fn p_ecs_respect_unknown_dscp() {
        let conds = [
            PCond {
                proto: Some(6),
                v6: None,
                dscp: None,
                dscp_known: false,
            },
            PCond {
                proto: None,
                v6: None,
                dscp: Some(46),
                dscp_known: false,
            },
        ];
        let e = p_ecs(&conds);
        let sig = |p, v6, u, d| &e.sigs[e.table[p_index(p, v6, u, d) as usize] as usize];
        assert_eq!(sig(6, false, false, 46), &vec![0, 1]);
        assert_eq!(
            sig(6, true, true, 46),
            &vec![0, 1],
            "no dscp_known: the value decides"
        );
        assert_eq!(sig(17, false, false, 46), &vec![1]);
        assert!(sig(17, false, false, 0).is_empty());
    }

    #[test]
    fn mark_values_take_one_per_mask() {
        let c = |value, mask| MarkCond {
            value,
            mask,
            known: true,
        };
        let conds = [c(1, 0xff), c(2, 0xff), c(0x100, 0xf00)];
        let v = mark_values(&conds, 100).unwrap();
        // (none, c0, c1) x (none, c2)
        assert_eq!(v.len(), 6);
        assert!(v.contains(&0b101) && !v.contains(&0b011));
        assert!(mark_values(&conds, 5).is_none());
    }
}
