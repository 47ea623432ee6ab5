//! The compiled classifier ("ctab"): what the datapath looks a packet's class up in, in a cost
//! that does not depend on the number of rules.
//!
//! The agent compiles a policy's first-match rule list into three structures, written into the
//! maps of the bank no packet reads (see `names::CTAB_*` in [`crate::maps`]; a reload changes
//! only the entries that differ from what that bank holds):
//!
//! - **words** (`Array<u32>`): per-dimension lookup tables that map a packet field to an
//!   *equivalence class* (EC): two values in one EC are treated alike by every rule.
//!   - the source and destination addresses, through multibit tries (strides [`V4_STRIDES`] and
//!     [`V6_STRIDES`], leaf-pushed): the EC of an address is the longest policy prefix that
//!     contains it (one EC namespace per packet family, so a rule's family folds into its
//!     address condition);
//!   - protocol x family x DSCP ([`p_index`], 65,536 entries), source port, destination port
//!     (65,536 entries each): the EC of a value is the set of rule conditions it satisfies;
//!   - per *selector* (the distinct non-address conditions of the rules, see below) a record
//!     of the first rule it can yield in each address shape ([`SEL_WORDS`]);
//!   - the selector lists ([`LIST_AT`]): for each set of selectors a packet can satisfy at
//!     once, the selectors with address conditions that could beat the set's first rule
//!     without them;
//!   - the phases' arrays, where they fit ([`CtabHeader::phase_off`]);
//!   - where everything fits the fast words, per selector its rules with one address condition
//!     as arrays over that dimension's ECs ([`CT_SHAPE_ARRAYS`]);
//!   - the class of every rule.
//! - **rules** (`HashMap<RuleKey, u32>`): per selector and address shape (source only,
//!   destination only, both), the first rule for each (source EC, destination EC); and the
//!   phases that combine the field ECs (below).
//! - **sel** (`HashMap<SelKey, u32>`): the last phase's result, when it is too large for an
//!   array: what the selectors the packet satisfies yield ([`LIST_AT`]: a rule, or a selector
//!   list in the words).
//!
//! The field ECs are combined in phases, as in Recursive Flow Classification: (protocol/DSCP,
//! destination port) -> EC of the selectors still satisfied; (that, source port) -> ...;
//! (that, mark) -> ...; (that, cgroup) -> the list. A phase's table is keyed by the previous
//! EC and one field's EC only, so a selector that leaves a field open does not multiply the
//! table by that field's ECs; phases over fields no rule reads are skipped ([`CtabHeader::phases`]).
//!
//! A packet costs: a few array reads for its ECs (a trie walk is one read per stride), one
//! array read per phase (a hash lookup instead for a phase too large for an array, see
//! [`CtabHeader::phase_off`]), the list's words when its selectors have address conditions,
//! and per listed selector at most three lookups, each skipped when the selector cannot beat
//! the best rule found so far: an array read for its rules with one address condition (where
//! the arrays and the words fit the fast words, [`CT_SHAPE_ARRAYS`]; a hash lookup elsewhere),
//! a hash lookup for those with both. There, only rules with both a source and a destination
//! condition (and a cgroup id) take a hash lookup. Where the fast words hold a tenant list
//! (one selector whose rules all have one address condition, in one dimension), the last
//! phase's word there names its array ([`LIST_DIRECT`]): one read instead of the selector's
//! record. None of this grows with the number of rules; the sizes of the structures do
//! (`paceline policy check` prints them).
//!
//! [`classify`] is that lookup, written once: the eBPF programs run it over the maps, the
//! agent's tests over the compiled structures in memory, against the linear reference
//! ([`crate::classify::classify_linear`]) on random policies and packets.
//!
//! The agent writes a new policy's structures into maps that no packet reads, then switches
//! every reader at once (see `PolicyTable::ctab` and the two banks in `maps`).

use crate::classify::{PacketInfo, UNKNOWN_DSCP, UNKNOWN_MARK};

/// "No entry": no rule, no offset, no selector.
pub const NONE: u32 = u32::MAX;
/// A trie entry with this bit set points at a child block (the word offset in the low bits);
/// otherwise it is an address EC.
pub const CHILD: u32 = 1 << 31;
/// Strides of the IPv4 trie (over the 32-bit address): /16 in one read, /24 in two, /32 in four.
pub const V4_STRIDES: [u32; 4] = [16, 8, 4, 4];
/// Strides of the IPv6 trie (over 128 bits): /48 in five reads, /64 in seven.
pub const V6_STRIDES: [u32; 15] = [16, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8];
/// Entries of the protocol x family x DSCP table ([`p_index`]).
pub const P_ENTRIES: u32 = 1 << 16;
/// Entries of each port table.
pub const PORT_ENTRIES: u32 = 1 << 16;
/// The most selectors with address conditions one packet may satisfy at once (after dropping
/// those that can never win); a policy that needs more is refused.
pub const MAX_SEL_MATCH: usize = 16;
/// Distinct mark conditions (value/mask pairs) a policy may use (the datapath evaluates all of
/// them on every packet of a policy with marks, without a branch each).
pub const MAX_MARK_CONDS: usize = 8;
/// Words of a selector record: [`SEL_FIRST`], [`SEL_ANY`], [`SEL_SRC`], [`SEL_DST`],
/// [`SEL_BOTH`].
pub const SEL_WORDS: u32 = 5;
/// The first rule the selector can yield in a shape with address conditions (the others are
/// folded into the selector lists' `any_best`).
pub const SEL_FIRST: u32 = 0;
/// The first rule of the selector with no address condition (it matches every packet the
/// selector matches), or [`NONE`].
pub const SEL_ANY: u32 = 1;
/// The first rule of the selector with only a source condition, or [`NONE`].
pub const SEL_SRC: u32 = 2;
/// The first rule of the selector with only a destination condition, or [`NONE`].
pub const SEL_DST: u32 = 3;
/// The first rule of the selector with both, or [`NONE`].
pub const SEL_BOTH: u32 = 4;
/// With [`CT_SHAPE_ARRAYS`]: of the two words [`shape_at`] names for a selector, the one that
/// says where its rules with only a source condition are an array over the source ECs (word
/// `at + EC`: the first such rule whose prefix holds the EC, or [`NONE`]); [`NONE`] when it has
/// none.
pub const SHAPE_AT_SRC: u32 = 0;
/// [`SHAPE_AT_SRC`] for the rules with only a destination condition.
pub const SHAPE_AT_DST: u32 = 1;

/// Where selector `sel`'s two [`SHAPE_AT_SRC`] / [`SHAPE_AT_DST`] words are: below the selector
/// records, the last selector's first (`sel_off - 2 * (sel + 1)`). Outside the records, whose
/// layout stays that of the programs before the one-address arrays: such a program, adopted
/// during an upgrade until the new one replaces it, reads a new image right (it ignores
/// [`CT_SHAPE_ARRAYS`] and takes those rules from the rule table, which holds them too).
#[inline(always)]
pub const fn shape_at(sel_off: u32, sel: u32) -> u32 {
    sel_off.wrapping_sub(sel.wrapping_add(1).wrapping_mul(2))
}

/// What the last phase yields for a key (its array's word, or the selector table's value): a
/// rule (this bit clear: the first address-free rule of the selectors the packet satisfies, and
/// no selector with address conditions can beat it), [`NONE`] (no selector is satisfied), or,
/// with this bit set, the word offset (the bits below; but see [`LIST_ONE`]) of a selector
/// list in the words table:
/// [`LIST_ANY_BEST`], [`LIST_N`], then `n` selectors with address conditions that can still
/// beat that rule, sorted by the first rule each can yield (at most [`MAX_SEL_MATCH`]). Keys
/// that satisfy the same selectors share one list.
pub const LIST_AT: u32 = 1 << 31;
/// With [`LIST_AT`]: the list is one selector with address conditions and no address-free
/// rule, and the bits below are that selector (a tenant list: rules sharing one protocol and
/// port condition, each with its own addresses), so no list is read.
pub const LIST_ONE: u32 = 1 << 30;
/// With [`LIST_AT`] and [`LIST_ONE`], in the fast words only (`names::CTAB_FAST`: what the
/// agent writes there, [`Tables::direct_lists`]): the one selector's rules all have one address
/// condition, all of one dimension, and the bits under [`LIST_DIRECT_DST`] are the word offset
/// of their array over that dimension's ECs ([`shape_at`]'s array): the packet's rule is one
/// word there, without the selector's record or the word that names the array (a tenant list's
/// first packet, five word reads fewer). The words map keeps the selector (the
/// [`LIST_ONE`] word), which every other reader, and a program of an earlier agent, reads.
pub const LIST_DIRECT: u32 = 1 << 29;
/// With [`LIST_DIRECT`]: the array is over the destination ECs (clear: the source's).
pub const LIST_DIRECT_DST: u32 = 1 << 28;
/// With [`LIST_DIRECT`]: the bits that hold the array's word offset.
pub const LIST_DIRECT_AT: u32 = LIST_DIRECT_DST - 1;
/// Words of a selector list: its address-free rule (or [`NONE`]), its number of selectors.
pub const LIST_ANY_BEST: u32 = 0;
pub const LIST_N: u32 = 1;
/// Where a selector list's selectors begin.
pub const LIST_SELS: u32 = 2;
/// Most entries the phases' arrays may have together (256 KiB of words); a phase that would
/// pass it keeps its hash table alone.
pub const MAX_PHASE_ARRAY_WORDS: u64 = 1 << 16;

/// [`RuleKey::tag`] shapes (the low two bits; the selector id above them).
pub const SHAPE_SRC: u32 = 1;
pub const SHAPE_DST: u32 = 2;
pub const SHAPE_BOTH: u32 = 3;
/// [`RuleKey::tag`] of a cgroup id's EC (a = low 32 bits, b = high 32 bits).
pub const TAG_CGROUP: u32 = 0;
/// [`RuleKey::tag`] of a phase that is not the last: `TAG_PHASE + 4 * phase`, a = the
/// previous EC, b = the field's EC. (Rule tags always have shape bits set, so tags with the
/// low two bits clear are free.)
pub const TAG_PHASE: u32 = 4;

/// Phases ([`CtabHeader::phases`] bits): 0 combines protocol/DSCP with the destination port;
/// then the source port, the mark, the cgroup.
pub const PHASE_DPORT: u32 = 0;
pub const PHASE_SPORT: u32 = 1;
pub const PHASE_MARK: u32 = 2;
pub const PHASE_CGROUP: u32 = 3;
pub const PHASES: u32 = 4;

// ---- CtabHeader::flags ----
/// Some rule has a source address condition: compute the source EC.
pub const CT_SRC: u32 = 1 << 0;
/// Some rule has a destination address condition.
pub const CT_DST: u32 = 1 << 1;
/// Some selector has conditions: look the selector list up.
pub const CT_SEL: u32 = 1 << 2;
/// Some rule matches on cgroup: look the cgroup's EC up.
pub const CT_CGROUP: u32 = 1 << 3;
/// The datapath's, not the compiler's: the words fit [`crate::maps::CTAB_FAST_WORDS`], and the
/// agent wrote them into the bank's entry of `names::CTAB_FAST` as well, where the tc program
/// reads them with one array read each (set by the agent when it writes the bank, only with
/// [`CT_SHAPE_ARRAYS`]). Bits 4 and 6 meant the same for earlier agents, whose fast words had
/// other layouts (bit 4: 524,288 a bank in a map of their own; bit 6: a word to each 8-byte
/// entry of one array): they are never set now, so that such a program, adopted during an
/// upgrade until the new one replaces it, reads the words map (which this agent writes) and
/// not its own fast words (which it does not).
pub const CT_FAST: u32 = 1 << 7;
// An earlier agent's program reads its own fast words under those bits: never set them.
const _: () = assert!(CT_FAST & (1 << 4 | 1 << 6) == 0);
/// The compiler's: every selector's rules with one address condition are also arrays over
/// that dimension's ECs ([`shape_at`]; an array read instead of a hash lookup), and the words
/// fit [`crate::maps::CTAB_FAST_WORDS`]. Those rules stay in the rule
/// table too. The reader of the fast words reads the arrays, every other reader the rule table
/// ([`Tables::shape_arrays`]): one way each, no branch per selector (a branch there made the
/// verifier walk the selector loop twice: Linux 6.1's egress program went from 333,000
/// instructions verified to 459,000).
pub const CT_SHAPE_ARRAYS: u32 = 1 << 5;

/// Where everything is in the words table, and the small parts read on every packet. Part of
/// `PolicyTable`, so a packet reads it with the rest of its policy in one lookup.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtabHeader {
    /// `CT_*`.
    pub flags: u32,
    /// The selector with no condition (rules that have only address conditions, or none), or
    /// [`NONE`]: it is satisfied by every packet and not listed in the selector lists.
    pub any_sel: u32,
    /// Word offsets of the protocol/family/DSCP table and the port tables ([`NONE`]: every
    /// value's EC is 0).
    pub p_off: u32,
    pub sport_off: u32,
    pub dport_off: u32,
    /// Trie roots for IPv4 and IPv6 packets, source and destination ([`NONE`]: no prefix of
    /// that family; the EC is then the `*_default` one).
    pub src_root: [u32; 2],
    pub dst_root: [u32; 2],
    pub src_default: [u32; 2],
    pub dst_default: [u32; 2],
    /// Selector records, [`SEL_WORDS`] each.
    pub sel_off: u32,
    /// First rule of `any_sel` with only a source (destination) condition, per source
    /// (destination) EC; [`NONE`] when there are none.
    pub src_any_off: u32,
    pub dst_any_off: u32,
    /// The class of each rule.
    pub rule_class_off: u32,
    /// Number of rules (after expansion).
    pub n_rules: u32,
    /// The phases that combine field ECs (bit `PHASE_*`); the highest one set writes the
    /// selector table, the others the rule table.
    pub phases: u32,
    pub n_marks: u32,
    /// The mark conditions that need the mark to be visible (bit `i` for `marks[i]`).
    pub marks_known: u32,
    /// Each phase as an array, when its keys are few ([`NONE`]: none; the rule table's
    /// `TAG_PHASE` entries, or for the last phase the selector table, alone): word
    /// `phase_off[phase] + prev * phase_stride[phase] + val` for the phase's key. A phase
    /// before the last holds the next EC (or [`NONE`]); the last, what the key yields
    /// ([`LIST_AT`]): a packet whose selectors have no address conditions (every packet of a
    /// policy without addresses) then takes its rule from array reads alone.
    pub phase_off: [u32; PHASES as usize],
    /// Values of each phase's field (one row of its array per previous EC).
    pub phase_stride: [u32; PHASES as usize],
    pub _pad: u32,
    /// Mark conditions as (value, mask): a packet's mark EC is the bit set of those it
    /// satisfies (an unknown mark satisfies none of `marks_known`).
    pub marks: [[u32; 2]; MAX_MARK_CONDS],
}
const _: () = assert!(core::mem::size_of::<CtabHeader>() == 4 * 30 + 8 * MAX_MARK_CONDS);

impl CtabHeader {
    /// A classifier with no rules: every packet gets the default class.
    pub const fn empty() -> Self {
        CtabHeader {
            flags: 0,
            any_sel: NONE,
            p_off: NONE,
            sport_off: NONE,
            dport_off: NONE,
            src_root: [NONE; 2],
            dst_root: [NONE; 2],
            src_default: [0; 2],
            dst_default: [0; 2],
            sel_off: NONE,
            src_any_off: NONE,
            dst_any_off: NONE,
            rule_class_off: NONE,
            n_rules: 0,
            phases: 0,
            n_marks: 0,
            marks_known: 0,
            phase_off: [NONE; PHASES as usize],
            phase_stride: [0; PHASES as usize],
            _pad: 0,
            marks: [[0; 2]; MAX_MARK_CONDS],
        }
    }
}

/// Key of the selector table: the EC of the phases before the last, and the last phase's
/// field EC.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct SelKey {
    pub prev: u32,
    pub val: u32,
}
const _: () = assert!(core::mem::size_of::<SelKey>() == 8);

/// Key of the rule table: `tag` = selector << 2 | shape (or [`TAG_CGROUP`]), and the source
/// and destination ECs (0 where the shape has no such condition).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct RuleKey {
    pub tag: u32,
    pub a: u32,
    pub b: u32,
}
const _: () = assert!(core::mem::size_of::<RuleKey>() == 12);

/// The `tag` of a rule-table key.
#[inline(always)]
pub const fn rule_tag(sel: u32, shape: u32) -> u32 {
    (sel << 2) | shape
}

/// Read access to a compiled classifier: the eBPF side reads maps, the tests read memory.
pub trait Tables {
    /// Word `i` of the words table; [`NONE`] past its end.
    fn word(&self, i: u32) -> u32;
    /// What the last phase yields for `key` (see [`LIST_AT`]); [`NONE`] when absent.
    fn sel(&self, key: &SelKey) -> u32;
    /// The rule (or cgroup EC) stored under `key`; [`NONE`] when absent.
    fn rule(&self, key: &RuleKey) -> u32;
    /// Whether to read a selector's one-address rules from their arrays ([`CT_SHAPE_ARRAYS`])
    /// rather than the rule table. The datapath answers by which words it reads (a constant
    /// for the verifier); memory, by the flag.
    fn shape_arrays(&self, h: &CtabHeader) -> bool {
        h.flags & CT_SHAPE_ARRAYS != 0
    }
    /// Whether these words are the fast words, where a last phase's word may be a
    /// [`LIST_DIRECT`] one (a constant for the verifier).
    fn direct_lists(&self) -> bool {
        false
    }
    /// `v` unchanged, but unknown to the eBPF verifier: the paths that computed it (a trie
    /// walk ends at one of several levels) then continue as one (see the datapath's
    /// `maps::read_back`).
    fn opaque(&self, v: [u32; 2]) -> [u32; 2] {
        v
    }
}

/// Index of the protocol x family x DSCP table: protocol (8 bits), IPv6 (1), DSCP unknown (1),
/// DSCP (6).
#[inline(always)]
pub const fn p_index(proto: u8, v6: bool, dscp_unknown: bool, dscp: u8) -> u32 {
    ((proto as u32) << 8) | ((v6 as u32) << 7) | ((dscp_unknown as u32) << 6) | (dscp as u32 & 0x3f)
}

/// Bits `[pos, pos + n)` of a 128-bit address held as four network-order words in memory
/// order (`n` at most 16, never crossing a word). The word is picked by comparisons, not by
/// indexing: the verifier of older kernels refuses variable-offset stack reads.
#[inline(always)]
fn chunk(addr: &[u32; 4], pos: u32, n: u32) -> u32 {
    let w = match pos / 32 {
        0 => addr[0],
        1 => addr[1],
        2 => addr[2],
        _ => addr[3],
    };
    let shift = 32 - (pos % 32) - n;
    (u32::from_be(w) >> shift) & ((1u32 << n) - 1)
}

/// The stride of trie level `level` ([`V4_STRIDES`], [`V6_STRIDES`]), computed rather than
/// read from a table; 0 past the last level.
#[inline(always)]
pub const fn stride(v6: bool, level: usize) -> u32 {
    match (v6, level) {
        (_, 0) => 16,
        (true, 1..=14) => 8,
        (false, 1) => 8,
        (false, 2..=3) => 4,
        _ => 0,
    }
}

/// The EC of `addr` in the trie at `root` (a packet of family `v6`).
#[inline(always)]
pub fn addr_ec<T: Tables>(t: &T, root: u32, default: u32, addr: &[u32; 4], v6: bool) -> u32 {
    if root == NONE {
        return default;
    }
    let mut off = root;
    // IPv4 addresses are IPv4-mapped: the v4 trie walks the last word only.
    let mut pos: u32 = if v6 { 0 } else { 96 };
    let mut level = 0;
    while level < V6_STRIDES.len() {
        let s = stride(v6, level);
        if s == 0 {
            return NONE;
        }
        let e = t.word(off.wrapping_add(chunk(addr, pos, s)));
        if e & CHILD == 0 {
            return e;
        }
        off = e & !CHILD;
        pos += s;
        level += 1;
    }
    NONE
}

/// The mark EC: the bit set of the mark conditions `mark` satisfies. Branch-free: a branch per
/// condition would multiply the paths the verifier walks by two per condition.
#[inline(always)]
pub fn mark_ec(h: &CtabHeader, mark: u32, unknown: bool) -> u32 {
    let mut bits: u32 = 0;
    let mut i = 0;
    while i < MAX_MARK_CONDS {
        let c = &h.marks[i];
        let x = (mark & c[1]) ^ c[0];
        // 1 when x == 0: (x | -x) has its top bit set exactly when x != 0.
        bits |= (((x | x.wrapping_neg()) >> 31) ^ 1) << i;
        i += 1;
    }
    // The policy's conditions only; an unknown mark meets none of those that need it.
    let used = ((1u64 << (h.n_marks & 63)) - 1) as u32;
    bits & used & !((unknown as u32).wrapping_neg() & h.marks_known)
}

#[inline(always)]
fn min(a: u32, b: u32) -> u32 {
    if b < a { b } else { a }
}

/// The cgroup EC: 2 x (the id's index among the policy's cgroups, from 1; 0 for another id) +
/// 1 when the cgroup is unknown.
#[inline(always)]
fn cgroup_ec<T: Tables>(h: &CtabHeader, t: &T, p: &PacketInfo) -> u32 {
    if h.flags & CT_CGROUP == 0 {
        return 0;
    }
    let idx = match t.rule(&RuleKey {
        tag: TAG_CGROUP,
        a: p.cgroup_id as u32,
        b: (p.cgroup_id >> 32) as u32,
    }) {
        NONE => 0,
        i => i,
    };
    (idx << 1) | (p.unknown & crate::classify::UNKNOWN_CGROUP != 0) as u32
}

/// The first rule (in policy order) that matches `p`, or [`NONE`]: the same answer as
/// [`crate::classify::classify_linear`] over the rules the structures were compiled from.
#[inline(always)]
pub fn first_rule<T: Tables>(h: &CtabHeader, t: &T, p: &PacketInfo) -> u32 {
    let v6 = p.is_v6 != 0;
    let fam = v6 as usize;
    let a = if h.flags & CT_SRC != 0 {
        addr_ec(t, h.src_root[fam & 1], h.src_default[fam & 1], &p.src, v6)
    } else {
        0
    };
    let b = if h.flags & CT_DST != 0 {
        addr_ec(t, h.dst_root[fam & 1], h.dst_default[fam & 1], &p.dst, v6)
    } else {
        0
    };
    let [a, b] = t.opaque([a, b]);
    let mut best = NONE;
    if h.any_sel != NONE {
        let rec = h.sel_off.wrapping_add(h.any_sel.wrapping_mul(SEL_WORDS));
        best = t.word(rec + SEL_ANY);
        if t.word(rec + SEL_SRC) < best {
            best = min(best, t.word(h.src_any_off.wrapping_add(a)));
        }
        if t.word(rec + SEL_DST) < best {
            best = min(best, t.word(h.dst_any_off.wrapping_add(b)));
        }
        if t.word(rec + SEL_BOTH) < best {
            best = min(
                best,
                t.rule(&RuleKey {
                    tag: rule_tag(h.any_sel, SHAPE_BOTH),
                    a,
                    b,
                }),
            );
        }
    }
    if h.flags & CT_SEL == 0 {
        return best;
    }
    let word_or_zero = |off: u32, i: u32| {
        if off == NONE {
            0
        } else {
            t.word(off.wrapping_add(i))
        }
    };
    // The phases, each keyed by the previous EC and one field's EC.
    let mut prev = word_or_zero(
        h.p_off,
        p_index(p.proto, v6, p.unknown & UNKNOWN_DSCP != 0, p.dscp),
    );
    let mut key = SelKey { prev, val: 0 };
    // The last phase's array and stride.
    let mut last = (NONE, 0);
    let mut phase = 0;
    while phase < PHASES {
        if h.phases & (1 << phase) != 0 {
            let val = match phase {
                PHASE_DPORT => word_or_zero(h.dport_off, p.dport as u32),
                PHASE_SPORT => word_or_zero(h.sport_off, p.sport as u32),
                PHASE_MARK => mark_ec(h, p.mark, p.unknown & UNKNOWN_MARK != 0),
                _ => cgroup_ec(h, t, p),
            };
            key = SelKey { prev, val };
            if h.phases >> (phase + 1) == 0 {
                last = (h.phase_off[phase as usize], h.phase_stride[phase as usize]);
                break;
            }
            let (off, stride) = (h.phase_off[phase as usize], h.phase_stride[phase as usize]);
            prev = if off != NONE && val < stride {
                t.word(off.wrapping_add(prev.wrapping_mul(stride)).wrapping_add(val))
            } else {
                t.rule(&RuleKey {
                    tag: TAG_PHASE + 4 * phase,
                    a: prev,
                    b: val,
                })
            };
            if prev == NONE {
                // No selector is still satisfied.
                return best;
            }
        }
        phase += 1;
    }
    let (off, stride) = last;
    let [prev, val] = t.opaque([key.prev, key.val]);
    let w = if off != NONE && val < stride {
        t.word(off.wrapping_add(prev.wrapping_mul(stride)).wrapping_add(val))
    } else {
        t.sel(&SelKey { prev, val })
    };
    if w == NONE {
        return best;
    }
    if w & LIST_AT == 0 {
        return min(best, w);
    }
    if t.direct_lists() && w & LIST_DIRECT != 0 {
        let ec = if w & LIST_DIRECT_DST != 0 { b } else { a };
        return min(best, t.word((w & LIST_DIRECT_AT).wrapping_add(ec)));
    }
    // A list of one selector and no address-free rule is named in the word itself (a tenant
    // list: no list to read); any other is read from the words.
    let (n, first, list) = if w & LIST_ONE != 0 {
        (1, w & (LIST_ONE - 1), NONE)
    } else {
        let list = w & !LIST_AT;
        best = min(best, t.word(list + LIST_ANY_BEST));
        (t.word(list + LIST_N), t.word(list + LIST_SELS), list)
    };
    // Both ways continue as one (see `Tables::opaque`).
    let [n, first] = t.opaque([n, first]);
    let [list, best_now] = t.opaque([list, best]);
    best = best_now;
    let mut i = 0;
    while i < MAX_SEL_MATCH as u32 {
        if i >= n {
            break;
        }
        let sel = if i == 0 {
            first
        } else {
            t.word(list.wrapping_add(LIST_SELS + i))
        };
        let rec = h.sel_off.wrapping_add(sel.wrapping_mul(SEL_WORDS));
        // Sorted by first rule: nothing further down can beat what was found.
        if t.word(rec + SEL_FIRST) >= best {
            break;
        }
        if t.word(rec + SEL_SRC) < best {
            best = min(best, one_address(h, t, sel, SHAPE_SRC, a));
        }
        if t.word(rec + SEL_DST) < best {
            best = min(best, one_address(h, t, sel, SHAPE_DST, b));
        }
        if t.word(rec + SEL_BOTH) < best {
            best = min(
                best,
                t.rule(&RuleKey {
                    tag: rule_tag(sel, SHAPE_BOTH),
                    a,
                    b,
                }),
            );
        }
        i += 1;
    }
    best
}

/// The first of selector `sel`'s rules with only a source (`shape` [`SHAPE_SRC`]) or only a
/// destination ([`SHAPE_DST`]) condition that holds address EC `ec`, or [`NONE`]: from its
/// array where the reader takes them ([`Tables::shape_arrays`]), else from the rule table.
#[inline(always)]
fn one_address<T: Tables>(h: &CtabHeader, t: &T, sel: u32, shape: u32, ec: u32) -> u32 {
    if t.shape_arrays(h) {
        let at = if shape == SHAPE_SRC {
            SHAPE_AT_SRC
        } else {
            SHAPE_AT_DST
        };
        t.word(t.word(shape_at(h.sel_off, sel) + at).wrapping_add(ec))
    } else {
        let (a, b) = if shape == SHAPE_SRC { (ec, 0) } else { (0, ec) };
        t.rule(&RuleKey {
            tag: rule_tag(sel, shape),
            a,
            b,
        })
    }
}

/// The class of `p`: its first matching rule's class, else `default_class`.
#[inline(always)]
pub fn classify<T: Tables>(h: &CtabHeader, t: &T, p: &PacketInfo, default_class: u32) -> u32 {
    classify_rule(h, t, p, default_class).0
}

/// [`classify`], and the index of the rule that matched ([`NONE`]: none did).
#[inline(always)]
pub fn classify_rule<T: Tables>(h: &CtabHeader, t: &T, p: &PacketInfo, default_class: u32) -> (u32, u32) {
    match first_rule(h, t, p) {
        NONE => (default_class, NONE),
        r => match t.word(h.rule_class_off.wrapping_add(r)) {
            NONE => (default_class, r),
            c => (c, r),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_of_an_address() {
        // 10.1.2.3 as an IPv4-mapped address.
        let a = crate::maps::v4_mapped(u32::from_ne_bytes([10, 1, 2, 3]));
        assert_eq!(chunk(&a, 96, 16), 0x0a01);
        assert_eq!(chunk(&a, 112, 8), 0x02);
        assert_eq!(chunk(&a, 120, 4), 0x0);
        assert_eq!(chunk(&a, 124, 4), 0x3);
        assert_eq!(chunk(&a, 80, 16), 0xffff);
        assert_eq!(chunk(&a, 0, 16), 0);
    }

    #[test]
    fn strides_cover_the_addresses() {
        for (i, s) in V4_STRIDES.iter().enumerate() {
            assert_eq!(stride(false, i), *s);
        }
        assert_eq!(stride(false, V4_STRIDES.len()), 0);
        for (i, s) in V6_STRIDES.iter().enumerate() {
            assert_eq!(stride(true, i), *s);
        }
        assert_eq!(stride(true, V6_STRIDES.len()), 0);
        assert_eq!(V4_STRIDES.iter().sum::<u32>(), 32);
        assert_eq!(V6_STRIDES.iter().sum::<u32>(), 128);
        // No stride crosses a 32-bit word (chunk() reads one word).
        for strides in [&V4_STRIDES[..], &V6_STRIDES[..]] {
            let mut pos = 0;
            for s in strides {
                assert_eq!(pos / 32, (pos + s - 1) / 32);
                pos += s;
            }
        }
    }

    #[test]
    fn mark_bits() {
        let mut h = CtabHeader::empty();
        h.n_marks = 2;
        h.marks[0] = [0x100, 0xf00];
        h.marks[1] = [0x1ff, 0xffff_ffff];
        h.marks_known = 0b01;
        assert_eq!(mark_ec(&h, 0x1ff, false), 0b11);
        assert_eq!(mark_ec(&h, 0x123, false), 0b01);
        assert_eq!(mark_ec(&h, 0x200, false), 0);
        assert_eq!(mark_ec(&h, 0x1ff, true), 0b10);
    }
}
