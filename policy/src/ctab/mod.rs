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
//! - `stages`: the address stages and the field stage, each with what it was built from, so
//!   that a build can take them from the one before.
//! - `incremental`: the build ([`build_after`]): the stages, the phases' arrays, the
//!   selector lists, the rule tables, the words layout; and what an image keeps so that the
//!   next build takes the stages an edit leaves unchanged from it.
//! - this file: the images, rules normalized into selectors and address shapes, the limits.
//! - [`shadow`]: rules that an earlier rule covers (never match), for warnings.

pub mod addr;
pub mod fields;
mod fx;
mod incremental;
pub mod phases;
pub mod shadow;
mod stages;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use fx::FxMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use incremental::Memo;
pub use incremental::build_after;
use paceline_common::classify::Rule;
use paceline_common::classify::{UNKNOWN_CGROUP, UNKNOWN_DSCP, UNKNOWN_MARK};
use paceline_common::ctab::{CtabHeader, MAX_MARK_CONDS, MAX_SEL_MATCH, NONE, RuleKey, SelKey, Tables};
use paceline_common::maps::CTAB_FAST_WORDS;

use addr::{Prefix, prefix_len, words_to_u128};
use fields::{MarkCond, PCond, Ports, port_set};

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
    /// Words the selectors' one-address arrays may take together (`ctab::CT_SHAPE_ARRAYS`:
    /// all of them or none; they must also fit the fast words with the rest).
    pub shape_arrays: usize,
}

pub const LIMITS: Limits = Limits {
    words: 1 << 23,
    sels: 1 << 20,
    rules: 1 << 22,
    marks: MAX_MARK_CONDS,
    mark_values: 4096,
    shape_arrays: CTAB_FAST_WORDS as usize,
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
                    std::mem::size_of::<u32>() as u64,
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
    /// The one-address arrays, selector records, the address-only arrays, the rule classes.
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
    /// Where the fast words differ from `words` (`ctab::LIST_DIRECT`): (word, value), by word.
    pub fast: Vec<(u32, u32)>,
    pub sels: Vec<(SelKey, u32)>,
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
            && self.fast == o.fast
            && self.sels == o.sels
            && self.rules == o.rules
            && self.stats == o.stats
    }
}

impl Image {
    /// The words as the fast words hold them (`names::CTAB_FAST`): `words` with `fast` in.
    pub fn fast_words(&self) -> Vec<u32> {
        let mut w = self.words.clone();
        for &(i, v) in &self.fast {
            w[i as usize] = v;
        }
        w
    }

    /// No tables at all: what a bank holds before its first policy.
    pub fn empty() -> Self {
        Image {
            header: CtabHeader::empty(),
            words: Vec::new(),
            fast: Vec::new(),
            sels: Vec::new(),
            rules: Vec::new(),
            stats: Stats::default(),
            times: BuildTimes::default(),
            memo: Arc::default(),
        }
    }
}

/// What the selectors a packet satisfies yield, as the compiler builds it: the first of their
/// rules without address conditions (those match every such packet), and the selectors with
/// address conditions that can still beat it, sorted by the first rule each can yield. Written
/// into the words as a list (`ctab::LIST_AT`) when it has any such selectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SelList {
    /// The first rule without address conditions among the satisfied selectors, or [`NONE`].
    pub any_best: u32,
    pub n: u32,
    pub sel: [u32; MAX_SEL_MATCH],
}

impl Default for SelList {
    fn default() -> Self {
        SelList {
            any_best: NONE,
            n: 0,
            sel: [0; MAX_SEL_MATCH],
        }
    }
}

/// An [`Image`] with its tables indexed, to run the common lookup in memory.
pub struct MemTables<'a> {
    pub image: &'a Image,
    sels: HashMap<SelKey, u32>,
    rules: HashMap<RuleKey, u32>,
    /// The fast words ([`Image::fast_words`]) when read as the tc program reads them there.
    fast: Option<Vec<u32>>,
    /// Words read so far (what a packet's lookup costs, in the tests).
    pub reads: std::cell::Cell<u32>,
}

impl<'a> MemTables<'a> {
    /// Read as the words map's readers read it.
    pub fn new(image: &'a Image) -> Self {
        MemTables {
            image,
            sels: image.sels.iter().copied().collect(),
            rules: image.rules.iter().copied().collect(),
            fast: None,
            reads: std::cell::Cell::new(0),
        }
    }

    /// Read as the tc program reads the fast words, where the agent writes them (the image
    /// has its one-address arrays, `CT_SHAPE_ARRAYS`); `None` where it does not.
    pub fn fast(image: &'a Image) -> Option<Self> {
        (image.header.flags & paceline_common::ctab::CT_SHAPE_ARRAYS != 0).then(|| MemTables {
            fast: Some(image.fast_words()),
            ..MemTables::new(image)
        })
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
        self.reads.set(self.reads.get() + 1);
        self.fast
            .as_deref()
            .unwrap_or(&self.image.words)
            .get(i as usize)
            .copied()
            .unwrap_or(NONE)
    }

    fn direct_lists(&self) -> bool {
        self.fast.is_some()
    }

    fn sel(&self, key: &SelKey) -> u32 {
        self.sels.get(key).copied().unwrap_or(NONE)
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
    // Sized up front: collecting the results grew the vector by copies, half the time it took.
    let mut out = Vec::with_capacity(rules.len());
    for (i, r) in rules.iter().enumerate() {
        out.push(normalize(i, r)?);
    }
    Ok(out)
}

/// [`build_with`] of rules already normalized (`norms[i]` is `rules[i]`'s): the policy
/// compiler normalizes once for this and for the covered-rule search.
pub fn build_normalized(rules: &[Rule], norms: &[Norm], lim: &Limits) -> Result<Image, BuildError> {
    build_after(rules, norms, lim, None)
}
