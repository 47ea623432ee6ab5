//! Compiles a first-match rule list into the classifier the datapath reads
//! ([`paceline_common::ctab`] describes the structures and the lookup).
//!
//! [`build`] is pure: rules in, an [`Image`] out (the header, the words, the two hash tables'
//! entries and their sizes), or a [`BuildError`] naming the limit passed. The agent writes an
//! image into fresh maps (`paceline::datapath`); the tests run the common lookup over the image
//! in memory ([`MemTables`]) against the linear reference matcher.
//!
//! # Layout
//! - [`addr`]: address ECs (prefix trees, two namespaces) and the multibit tries.
//! - [`fields`]: ECs of protocol/family/DSCP, ports, marks.
//! - [`phases`]: the field ECs combined, phase by phase, into the selectors a packet meets.
//! - this file: rules normalized into selectors and address shapes, the selector lists, the
//!   rule tables, the words layout, the limits.
//! - [`shadow`]: rules that an earlier rule covers (never match), for warnings.

pub mod addr;
pub mod fields;
mod fx;
pub mod phases;
pub mod shadow;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use fx::FxMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use paceline_common::classify::Rule;
use paceline_common::classify::{UNKNOWN_CGROUP, UNKNOWN_DSCP, UNKNOWN_MARK};
use paceline_common::ctab::{
    CHILD, CT_CGROUP, CT_DST, CT_SEL, CT_SRC, CtabHeader, MAX_MARK_CONDS, MAX_SEL_MATCH, NONE, RuleKey,
    SEL_ANY, SEL_BOTH, SEL_DST, SEL_FIRST, SEL_SRC, SEL_WORDS, SHAPE_BOTH, SHAPE_DST, SHAPE_SRC, SelKey,
    SelList, TAG_CGROUP, Tables, rule_tag,
};

use addr::{AddrEcs, Prefix, Ranges, prefix_len, words_to_u128};
use fields::{FieldEcs, MarkCond, PCond, Ports, mark_values, p_ecs, port_ecs, port_set};
use phases::Bits;

/// What one policy's classifier may hold. Each bounds kernel memory (and the agent's while it
/// builds); a policy past one is refused with the limit and the count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Words of the array table (8 bytes of kernel memory each: array entries are 8-byte
    /// aligned).
    pub words: usize,
    /// Entries of the selector table.
    pub sels: usize,
    /// Entries of the rule table.
    pub rules: usize,
    /// Distinct mark conditions.
    pub marks: usize,
    /// Mark ECs (combinations of mark conditions a packet can meet).
    pub mark_values: usize,
}

pub const LIMITS: Limits = Limits {
    words: 1 << 23,
    sels: 1 << 20,
    rules: 1 << 22,
    marks: MAX_MARK_CONDS,
    mark_values: 4096,
};

/// Why a rule list does not compile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BuildError {
    /// A table would pass its limit.
    Limit {
        what: &'static str,
        count: u64,
        limit: u64,
        /// Which rules make it large, if one can be named.
        hint: String,
    },
    /// A rule with a condition the classifier cannot express (never produced by the policy
    /// compiler: non-prefix address masks, partial protocol masks).
    Unsupported { rule: usize, why: String },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Limit {
                what,
                count,
                limit,
                hint,
            } => {
                write!(
                    f,
                    "the classifier's {what} would hold {count}, past its limit of {limit}"
                )?;
                if !hint.is_empty() {
                    write!(f, " ({hint})")?;
                }
                Ok(())
            }
            BuildError::Unsupported { rule, why } => write!(f, "rule {rule}: {why}"),
        }
    }
}

impl std::error::Error for BuildError {}

/// Sizes of a compiled classifier, for `policy check` and the agent's log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub rules: usize,
    /// Distinct non-address conditions.
    pub selectors: usize,
    pub src_ecs: u32,
    pub dst_ecs: u32,
    pub p_ecs: u32,
    pub sport_ecs: u32,
    pub dport_ecs: u32,
    pub mark_ecs: usize,
    pub cgroups: usize,
    pub words: usize,
    pub sel_entries: usize,
    pub rule_entries: usize,
}

impl Stats {
    /// Kernel memory the three maps take, estimated: 8 bytes a word; a hash entry its key and
    /// value rounded to 8 bytes plus the kernel's per-element header (about 48 bytes) and its
    /// bucket (8 bytes per entry).
    pub fn kernel_bytes(&self) -> u64 {
        let elem = |k: u64, v: u64| 48 + k.div_ceil(8) * 8 + v.div_ceil(8) * 8 + 8;
        self.words as u64 * 8
            + self.sel_entries as u64
                * elem(
                    std::mem::size_of::<SelKey>() as u64,
                    std::mem::size_of::<SelList>() as u64,
                )
            + self.rule_entries as u64 * elem(12, 4)
    }
}

/// Where a build spent its time, stage by stage (the apply benchmark prints them).
#[derive(Clone, Copy, Debug, Default)]
pub struct BuildTimes {
    /// Rules normalized into selectors and prefixes (zero when given normalized).
    pub normalize: Duration,
    /// Address ECs and the tries.
    pub addresses: Duration,
    /// Selectors, field ECs, the phases and the selector lists.
    pub phases: Duration,
    /// The rule table.
    pub rule_table: Duration,
    /// Selector records, the address-only arrays, the rule classes.
    pub words: Duration,
}

impl BuildTimes {
    pub fn total(&self) -> Duration {
        self.normalize + self.addresses + self.phases + self.rule_table + self.words
    }
}

/// A compiled classifier: what the datapath's maps of one bank hold.
#[derive(Clone, Debug)]
pub struct Image {
    pub header: CtabHeader,
    pub words: Vec<u32>,
    pub sels: Vec<(SelKey, SelList)>,
    pub rules: Vec<(RuleKey, u32)>,
    pub stats: Stats,
    /// How long building it took (not part of what it holds).
    pub times: BuildTimes,
    /// What the next build may take from this one ([`build_after`]).
    memo: Arc<Memo>,
}

impl Image {
    /// The same tables, header and sizes (what a bank holds; not the times or the memo).
    pub fn same_tables(&self, o: &Image) -> bool {
        self.header == o.header
            && self.words == o.words
            && self.sels == o.sels
            && self.rules == o.rules
            && self.stats == o.stats
    }
}

/// What a build keeps for the next one ([`build_after`]).
#[derive(Debug, Default)]
struct Memo {
    src: Option<Arc<AddrStage>>,
    dst: Option<Arc<AddrStage>>,
    fields: Option<Arc<FieldStage>>,
    /// Per selector and shape (any, src, dst, both), its rules; and the most address-EC pairs
    /// one of them covers.
    groups: Vec<[Vec<u32>; 4]>,
    group_max: Vec<[usize; 4]>,
    /// Each rule's family when it has addresses.
    families: Vec<Option<bool>>,
}

impl Image {
    /// No tables at all: what a bank holds before its first policy.
    pub fn empty() -> Self {
        Image {
            header: CtabHeader::empty(),
            words: Vec::new(),
            sels: Vec::new(),
            rules: Vec::new(),
            stats: Stats::default(),
            times: BuildTimes::default(),
            memo: Arc::default(),
        }
    }
}

/// An [`Image`] with its tables indexed, to run the common lookup in memory.
pub struct MemTables<'a> {
    pub image: &'a Image,
    sels: HashMap<SelKey, SelList>,
    rules: HashMap<RuleKey, u32>,
}

impl<'a> MemTables<'a> {
    pub fn new(image: &'a Image) -> Self {
        MemTables {
            image,
            sels: image.sels.iter().copied().collect(),
            rules: image.rules.iter().copied().collect(),
        }
    }

    /// The first rule that matches `p`, by the datapath's lookup.
    pub fn first_rule(&self, p: &paceline_common::classify::PacketInfo) -> Option<usize> {
        match paceline_common::ctab::first_rule(&self.image.header, self, p) {
            NONE => None,
            r => Some(r as usize),
        }
    }
}

impl Tables for MemTables<'_> {
    fn word(&self, i: u32) -> u32 {
        self.image.words.get(i as usize).copied().unwrap_or(NONE)
    }

    fn sels(&self, key: &SelKey) -> Option<&SelList> {
        self.sels.get(key)
    }

    fn rule(&self, key: &RuleKey) -> u32 {
        self.rules.get(key).copied().unwrap_or(NONE)
    }
}

/// A cgroup condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CgCond {
    /// This cgroup id (`known`: and the cgroup must be visible).
    Id { id: u64, known: bool },
    /// Any cgroup, as long as it is visible.
    Known,
}

/// The non-address conditions of a rule: rules with equal selectors share tables.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Selector {
    pub p: Option<PCond>,
    pub sport: Option<Ports>,
    pub dport: Option<Ports>,
    pub mark: Option<MarkCond>,
    pub cgroup: Option<CgCond>,
}

impl Selector {
    pub fn is_any(&self) -> bool {
        self.p.is_none()
            && self.sport.is_none()
            && self.dport.is_none()
            && self.mark.is_none()
            && self.cgroup.is_none()
    }
}

/// A rule in the classifier's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Norm {
    pub sel: Selector,
    pub src: Option<Prefix>,
    pub dst: Option<Prefix>,
    /// The rule's family when it has an address condition (it then restricts the address
    /// ECs); otherwise the family is part of the selector.
    pub addr_family: Option<bool>,
}

impl Norm {
    fn shape(&self) -> usize {
        usize::from(self.src.is_some()) | (usize::from(self.dst.is_some()) << 1)
    }
}

/// A rule as the classifier reads it (the same matches as `classify::rule_matches`).
pub fn normalize(i: usize, r: &Rule) -> Result<Norm, BuildError> {
    let bad = |why: &str| BuildError::Unsupported {
        rule: i,
        why: why.to_string(),
    };
    let proto = match r.proto_mask {
        0 => None,
        0xff => Some(r.proto),
        _ => return Err(bad("a partial protocol mask")),
    };
    let dscp = match r.dscp_mask & 0x3f {
        0 => None,
        0x3f => Some(r.dscp & 0x3f),
        _ => return Err(bad("a partial DSCP mask")),
    };
    if r.family_mask & !1 != 0 {
        return Err(bad("a family mask other than 0 or 1"));
    }
    let family = (r.family_mask & 1 != 0).then_some(r.family & 1 == 1);
    let deep = r.deep != 0;
    let prefix = |addr: &[u32; 4], m: &[u32; 4]| -> Result<Option<Prefix>, BuildError> {
        match prefix_len(m) {
            Some(0) => Ok(None),
            Some(len) => Ok(Some(Prefix::new(words_to_u128(addr), len))),
            None => Err(bad("an address mask that is not a prefix")),
        }
    };
    let (src, dst) = if deep {
        (prefix(&r.src, &r.src_mask)?, prefix(&r.dst, &r.dst_mask)?)
    } else {
        (None, None)
    };
    let mark = (deep && r.mark_mask != 0)
        .then_some(MarkCond {
            value: r.mark & r.mark_mask,
            mask: r.mark_mask,
            known: r.needs & UNKNOWN_MARK != 0,
        })
        .or((r.needs & UNKNOWN_MARK != 0).then_some(MarkCond {
            value: 0,
            mask: 0,
            known: true,
        }));
    let cgroup = match (deep, r.cgroup_mask) {
        (true, u64::MAX) => Some(CgCond::Id {
            id: r.cgroup_id,
            known: r.needs & UNKNOWN_CGROUP != 0,
        }),
        (_, 0) | (false, _) => (r.needs & UNKNOWN_CGROUP != 0).then_some(CgCond::Known),
        _ => return Err(bad("a partial cgroup mask")),
    };
    let has_addr = src.is_some() || dst.is_some();
    let pc = PCond {
        proto,
        v6: if has_addr { None } else { family },
        dscp,
        dscp_known: r.needs & UNKNOWN_DSCP != 0,
    };
    Ok(Norm {
        sel: Selector {
            p: (!pc.is_any()).then_some(pc),
            sport: port_set(r.sport_min, r.sport_span),
            dport: port_set(r.dport_min, r.dport_span),
            mark,
            cgroup,
        },
        src,
        dst,
        addr_family: if has_addr { family } else { None },
    })
}

/// Interns values into dense ids.
struct Ids<T> {
    ids: FxMap<T, u32>,
    list: Vec<T>,
}

impl<T: Clone + Eq + std::hash::Hash> Ids<T> {
    fn new() -> Self {
        Ids {
            ids: FxMap::default(),
            list: Vec::new(),
        }
    }

    fn id(&mut self, v: &T) -> u32 {
        if let Some(&i) = self.ids.get(v) {
            return i;
        }
        let i = self.list.len() as u32;
        self.list.push(v.clone());
        self.ids.insert(v.clone(), i);
        i
    }
}

fn limit(
    what: &'static str,
    count: usize,
    lim: usize,
    hint: impl FnOnce() -> String,
) -> Result<(), BuildError> {
    if count > lim {
        Err(BuildError::Limit {
            what,
            count: count as u64,
            limit: lim as u64,
            hint: hint(),
        })
    } else {
        Ok(())
    }
}

/// One address dimension's ECs and tries, and what they were built from: a build whose rules
/// have the same prefixes in this dimension as the image before takes them from it.
#[derive(Debug)]
struct AddrStage {
    /// Each rule's prefix in this dimension.
    input: Vec<Option<Prefix>>,
    ecs: AddrEcs,
    /// Some rule has a prefix here: the tries are looked up.
    used: bool,
    /// The tries of IPv4 and IPv6 packets, as written at word `base`, their roots ([`NONE`]:
    /// no trie) and the ECs of addresses no trie prefix refines.
    base: usize,
    words: Vec<u32>,
    roots: [u32; 2],
    defaults: [u32; 2],
}

impl AddrStage {
    /// The stage of `prev` if it was built from `input`, else a new one built at word `base`.
    fn reuse_or_build(
        prev: Option<&Arc<AddrStage>>,
        input: Vec<Option<Prefix>>,
        base: usize,
    ) -> Result<Arc<AddrStage>, addr::TrieTooBig> {
        if let Some(p) = prev
            && p.input == input
        {
            return Ok(p.clone());
        }
        let ecs = AddrEcs::new(input.iter().flatten().copied());
        let used = input.iter().any(Option::is_some);
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
        Ok(Arc::new(AddrStage {
            input,
            ecs,
            used,
            base,
            words,
            roots,
            defaults,
        }))
    }

    /// Appends the tries to `words` (moving their child offsets when they were built elsewhere)
    /// and sets the header's roots and defaults.
    fn place(
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
struct FieldStage {
    /// What it was built from.
    sels: Vec<Selector>,
    lim: Limits,
    p: FieldEcs,
    sp: FieldEcs,
    dp: FieldEcs,
    /// Some selector has a condition on protocol/DSCP, source port, destination port.
    used: [bool; 3],
    marks: Vec<MarkCond>,
    mark_ecs: usize,
    cgroups: Vec<u64>,
    any_cgroup: bool,
    /// `None` when no selector has a condition.
    phases: Option<phases::Phases>,
}

impl FieldStage {
    fn new(sels: &[Selector], any_sel: Option<u32>, lim: &Limits) -> Result<Self, BuildError> {
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

/// Compiles `rules` (in first-match order; a rule's `class` is its class index).
pub fn build(rules: &[Rule]) -> Result<Image, BuildError> {
    build_with(rules, &LIMITS)
}

pub fn build_with(rules: &[Rule], lim: &Limits) -> Result<Image, BuildError> {
    let t = Instant::now();
    let norms = normalize_all(rules)?;
    let mut image = build_normalized(rules, &norms, lim)?;
    image.times.normalize = t.elapsed() - image.times.total();
    Ok(image)
}

/// Every rule normalized ([`normalize`]).
pub fn normalize_all(rules: &[Rule]) -> Result<Vec<Norm>, BuildError> {
    rules.iter().enumerate().map(|(i, r)| normalize(i, r)).collect()
}

/// [`build_with`] of rules already normalized (`norms[i]` is `rules[i]`'s): the policy
/// compiler normalizes once for this and for the covered-rule search.
pub fn build_normalized(rules: &[Rule], norms: &[Norm], lim: &Limits) -> Result<Image, BuildError> {
    build_after(rules, norms, lim, None)
}

/// [`build_normalized`] for the policy after `prev`'s: the parts whose inputs are those `prev`
/// was built from are taken from it, not built again: an address dimension's ECs and tries
/// (when every rule has the same prefix there), the field ECs and phases (the same
/// selectors), a selector's rule-table entries in an address shape (the same rules, prefixes
/// and ECs). The image is the one [`build_normalized`] makes (`tests::incremental_*`).
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
    let src_in: Vec<Option<Prefix>> = norms.iter().map(|n| n.src).collect();
    let src = AddrStage::reuse_or_build(memo.and_then(|m| m.src.as_ref()), src_in, words.len())
        .map_err(|_| too_big())?;
    src.place(&mut words, &mut h.src_root, &mut h.src_default)
        .map_err(|_| too_big())?;
    let dst_in: Vec<Option<Prefix>> = norms.iter().map(|n| n.dst).collect();
    let dst = AddrStage::reuse_or_build(memo.and_then(|m| m.dst.as_ref()), dst_in, words.len())
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
    let rule_sel: Vec<u32> = norms.iter().map(|n| sel_ids.id(&n.sel)).collect();
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
    let mut sel_entries: Vec<(SelKey, SelList)> = Vec::new();
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
        rule_entries.extend(ph.rule_entries.iter().copied());
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
        for &(key, set) in &ph.last {
            if let Some(l) = lists[set as usize] {
                sel_entries.push((key, l));
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
    let same_ecs = memo.is_some_and(|m| {
        m.src.as_ref().is_some_and(|p| Arc::ptr_eq(p, &src))
            && m.dst.as_ref().is_some_and(|p| Arc::ptr_eq(p, &dst))
    });
    let mut group_max: Vec<[usize; 4]> = vec![[0; 4]; groups.len()];
    for (si, g) in groups.iter().enumerate() {
        let is_any = Some(si as u32) == any_sel;
        for shape in [SHAPE_SRC, SHAPE_DST, SHAPE_BOTH] {
            let tag = rule_tag(si as u32, shape);
            let rules_of = &g[shape as usize];
            if same_ecs && !(is_any && shape != SHAPE_BOTH) {
                let (m, prev) = (memo.expect("same_ecs"), prev.expect("a memo is an image's"));
                let max = m.group_max.get(si).map_or(0, |g| g[shape as usize]);
                let start = prev.rules.partition_point(|(k, _)| k.tag < tag);
                let len = prev.rules[start..].partition_point(|(k, _)| k.tag == tag);
                if m.groups.get(si).is_some_and(|pg| pg[shape as usize] == *rules_of)
                    && rules_of
                        .iter()
                        .all(|&ri| m.families[ri as usize] == families[ri as usize])
                    && done + len + max <= lim.rules
                {
                    // No rule of it could pass the limit: each checks at most this.
                    rule_list.extend_from_slice(&prev.rules[start..start + len]);
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
                    let bx = if shape == SHAPE_SRC { &a_box } else { &b_box };
                    for &(s, e) in bx.iter() {
                        for v in &mut arr[s as usize..e as usize] {
                            if *v == NONE {
                                *v = ri;
                            }
                        }
                    }
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
    limit("words", words.len(), lim.words, || {
        "address tries, field tables and rule classes".into()
    })?;
    st.words = words.len();
    lap(&mut times.words);
    Ok(Image {
        header: h,
        words,
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
            families,
        }),
    })
}
