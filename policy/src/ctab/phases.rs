//! The phases that combine the field ECs into selector lists (Recursive Flow Classification):
//! each phase maps (the previous EC, one field's EC) to the EC of the set of selectors still
//! satisfied, so a selector that leaves a field open costs nothing in that field's phase.

use paceline_common::ctab::{
    PHASE_CGROUP, PHASE_DPORT, PHASE_MARK, PHASE_SPORT, PHASES, RuleKey, SelKey, TAG_PHASE,
};

use super::fx::FxMap;
use super::{BuildError, limit};

/// A set of selectors.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Bits(Vec<u64>);

impl Bits {
    pub fn empty(n: usize) -> Self {
        Bits(vec![0; n.div_ceil(64)])
    }

    pub fn set(&mut self, i: u32) {
        self.0[i as usize / 64] |= 1 << (i % 64);
    }

    fn and(&self, o: &Bits) -> Bits {
        Bits(self.0.iter().zip(&o.0).map(|(a, b)| a & b).collect())
    }

    fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().enumerate().flat_map(|(wi, &w)| {
            (0..64)
                .filter(move |b| w & (1 << b) != 0)
                .map(move |b| (wi * 64 + b) as u32)
        })
    }
}

/// Per field, the selectors each of its ECs satisfies (index = the EC the datapath computes).
pub struct Fields {
    pub p: Vec<Bits>,
    pub dport: Vec<Bits>,
    /// `None`: no selector reads the field (its phase is skipped).
    pub sport: Option<Vec<Bits>>,
    /// Indexed through `mark_values` (the bit sets the datapath can produce).
    pub mark: Option<(Vec<u32>, Vec<Bits>)>,
    pub cgroup: Option<Vec<Bits>>,
}

/// The phases' entries.
#[derive(Debug)]
pub struct Phases {
    /// `CtabHeader::phases`.
    pub mask: u32,
    /// Rule-table entries of the phases before the last.
    pub rule_entries: Vec<(RuleKey, u32)>,
    /// The last phase's keys and the set of selectors each leaves satisfied.
    pub last: Vec<(SelKey, u32)>,
    /// The sets `last` refers to.
    pub sets: Vec<Bits>,
    /// Each phase's key space, by phase (`PHASE_*`; zero for a phase not run): previous ECs
    /// (`prev` below the first) and field values (`val` below the second), for its array
    /// (`CtabHeader::phase_off`).
    pub dims: [(u32, u32); PHASES as usize],
}

/// Runs the phases; `max_entries` bounds the entries of all phases together.
pub fn run(f: &Fields, max_entries: usize) -> Result<Phases, BuildError> {
    // Each phase: the field's values (as the datapath computes them) and their sets.
    let mut order: Vec<(u32, Vec<(u32, &Bits)>)> = vec![(
        PHASE_DPORT,
        f.dport.iter().enumerate().map(|(i, b)| (i as u32, b)).collect(),
    )];
    if let Some(v) = &f.sport {
        order.push((
            PHASE_SPORT,
            v.iter().enumerate().map(|(i, b)| (i as u32, b)).collect(),
        ));
    }
    if let Some((vals, bits)) = &f.mark {
        order.push((PHASE_MARK, vals.iter().copied().zip(bits.iter()).collect()));
    }
    if let Some(v) = &f.cgroup {
        order.push((
            PHASE_CGROUP,
            v.iter().enumerate().map(|(i, b)| (i as u32, b)).collect(),
        ));
    }
    let mask = order.iter().fold(0, |m, (p, _)| m | (1 << p));
    // The inputs of the first phase: the protocol/DSCP ECs.
    let mut inputs: Vec<(u32, Bits)> =
        f.p.iter()
            .enumerate()
            .map(|(i, b)| (i as u32, b.clone()))
            .collect();
    let mut rule_entries = Vec::new();
    let mut entries = 0usize;
    let n_phases = order.len();
    let mut dims = [(0, 0); PHASES as usize];
    for (k, (phase, vals)) in order.iter().enumerate() {
        let last = k + 1 == n_phases;
        dims[*phase as usize] = (
            inputs.iter().map(|(p, _)| p + 1).max().unwrap_or(0),
            vals.iter().map(|(v, _)| v + 1).max().unwrap_or(0),
        );
        let mut ids: FxMap<Bits, u32> = FxMap::default();
        let mut sets: Vec<Bits> = Vec::new();
        let mut out: Vec<(SelKey, u32)> = Vec::new();
        for (prev, set) in &inputs {
            for (val, bits) in vals {
                let s = set.and(bits);
                if s.is_empty() {
                    continue;
                }
                entries += 1;
                limit("field phases", entries, max_entries, || {
                    format!(
                        "protocol/DSCP, ports, mark and cgroup classes combine into more than {max_entries} entries"
                    )
                })?;
                let next = *ids.entry(s.clone()).or_insert_with(|| {
                    sets.push(s);
                    sets.len() as u32 - 1
                });
                out.push((
                    SelKey {
                        prev: *prev,
                        val: *val,
                    },
                    next,
                ));
            }
        }
        if last {
            return Ok(Phases {
                mask,
                rule_entries,
                last: out,
                sets,
                dims,
            });
        }
        rule_entries.extend(out.into_iter().map(|(k, next)| {
            (
                RuleKey {
                    tag: TAG_PHASE + 4 * phase,
                    a: k.prev,
                    b: k.val,
                },
                next,
            )
        }));
        inputs = sets.into_iter().enumerate().map(|(i, b)| (i as u32, b)).collect();
    }
    unreachable!("the destination-port phase always runs")
}
