//! Address equivalence classes and the multibit tries that find them.
//!
//! One dimension (source or destination) has a set of prefixes, the ones its rules name. The
//! EC of an address is the longest of them that contains it, in one of two namespaces:
//! IPv4 packets (whose addresses are IPv4-mapped, `::ffff:a.b.c.d`) and IPv6 packets. A rule
//! restricted to a family then covers ECs of that namespace only, which folds its family into
//! its address condition exactly.
//!
//! ECs are numbered in depth-first order of the prefix tree (each prefix under the longest
//! prefix that contains it), so the ECs a prefix covers (itself and every prefix nested in
//! it) are one contiguous range.

use paceline_common::ctab::{CHILD, NONE, V4_STRIDES, V6_STRIDES};

/// A prefix of the 128-bit address space (IPv4 as IPv4-mapped, /96 + length).
///
/// Packed: 17 bytes, where a `u128`'s alignment made it 32 (and an `Option` of it 48). A
/// policy's rules hold two each while it compiles, and its address ECs one per prefix and
/// namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(C, packed)]
pub struct Prefix {
    /// Host bits zeroed.
    pub addr: u128,
    pub len: u8,
}

/// `::ffff:0.0.0.0/96`: the IPv4-mapped range.
pub const V4_MAPPED: Prefix = Prefix {
    addr: 0xffff_u128 << 32,
    len: 96,
};

impl Prefix {
    pub fn new(addr: u128, len: u8) -> Self {
        Prefix {
            addr: addr & mask(len),
            len,
        }
    }

    pub fn contains(&self, other: &Prefix) -> bool {
        self.len <= other.len && other.addr & mask(self.len) == self.addr
    }

    pub fn contains_addr(&self, a: u128) -> bool {
        a & mask(self.len) == self.addr
    }

    /// Does it share addresses with `other` (one contains the other)?
    pub fn overlaps(&self, other: &Prefix) -> bool {
        self.contains(other) || other.contains(self)
    }
}

pub fn mask(len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(len))
    }
}

/// The 128-bit address of the datapath's `[u32; 4]` (network-order words in memory order).
pub fn words_to_u128(w: &[u32; 4]) -> u128 {
    let mut b = [0u8; 16];
    for (i, x) in w.iter().enumerate() {
        b[i * 4..i * 4 + 4].copy_from_slice(&x.to_ne_bytes());
    }
    u128::from_be_bytes(b)
}

/// A mask of the datapath's form as a prefix length, if it is one (contiguous ones).
pub fn prefix_len(mask_words: &[u32; 4]) -> Option<u8> {
    let m = words_to_u128(mask_words);
    let len = m.leading_ones();
    (m == mask(len as u8)).then_some(len as u8)
}

/// At most two EC ranges `[start, end)` (one per namespace), without an allocation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ranges {
    n: usize,
    r: [(u32, u32); 2],
}

impl Ranges {
    pub fn one(start: u32, end: u32) -> Self {
        Ranges {
            n: 1,
            r: [(start, end), (0, 0)],
        }
    }

    fn push(&mut self, start: u32, end: u32) {
        self.r[self.n] = (start, end);
        self.n += 1;
    }

    /// ECs covered, in all ranges.
    pub fn count(&self) -> usize {
        self.iter().map(|(s, e)| (e - s) as usize).sum()
    }
}

impl std::ops::Deref for Ranges {
    type Target = [(u32, u32)];

    fn deref(&self) -> &[(u32, u32)] {
        &self.r[..self.n]
    }
}

/// One namespace's tree: its prefixes with their EC ids and subtree sizes.
#[derive(Debug, Default)]
struct Namespace {
    /// EC id of the namespace's root (no prefix matched).
    base: u32,
    /// Prefixes in depth-first order, which is their sorted order (the EC of `order[i]` is
    /// `base + 1 + i`): a prefix's EC is found by binary search.
    order: Vec<Prefix>,
    /// The number of ECs in the subtree of `order[i]`.
    sizes: Vec<u32>,
}

impl Namespace {
    /// The EC id of `p` and the number of ECs in its subtree, if `p` is one of its prefixes.
    fn find(&self, p: &Prefix) -> Option<(u32, u32)> {
        let i = self.order.binary_search(p).ok()?;
        Some((self.base + 1 + i as u32, self.sizes[i]))
    }
}

/// The ECs of one address dimension.
#[derive(Debug, Default)]
pub struct AddrEcs {
    /// Index 0: IPv4 packets, 1: IPv6 packets.
    ns: [Namespace; 2],
    /// Total ECs (both namespaces).
    pub count: u32,
}

impl AddrEcs {
    /// Numbers the ECs of `prefixes` (duplicates allowed).
    pub fn new(prefixes: impl IntoIterator<Item = Prefix>) -> Self {
        let mut all: Vec<Prefix> = prefixes.into_iter().collect();
        all.sort();
        all.dedup();
        Self::from_sorted(all)
    }

    /// Numbers the ECs of `all`, sorted and without duplicates.
    pub fn from_sorted(all: Vec<Prefix>) -> Self {
        debug_assert!(all.windows(2).all(|w| w[0] < w[1]));
        let v4: Vec<Prefix> = all.iter().copied().filter(|p| p.overlaps(&V4_MAPPED)).collect();
        let mut out = AddrEcs::default();
        let mut next = 0u32;
        for (i, list) in [v4, all].into_iter().enumerate() {
            let ns = &mut out.ns[i];
            ns.base = next;
            next += 1;
            // Sorted by (addr, len): a prefix comes right after the prefixes that contain it,
            // so a stack of open ancestors gives the depth-first order directly.
            ns.sizes = vec![0; list.len()];
            let mut stack: Vec<(Prefix, u32)> = Vec::new();
            for (i, p) in list.iter().enumerate() {
                while let Some((top, _)) = stack.last() {
                    if top.contains(p) {
                        break;
                    }
                    let (_, at) = stack.pop().expect("non-empty");
                    ns.sizes[at as usize] = next - (ns.base + 1 + at);
                }
                next += 1;
                stack.push((*p, i as u32));
            }
            while let Some((_, at)) = stack.pop() {
                ns.sizes[at as usize] = next - (ns.base + 1 + at);
            }
            ns.order = list;
        }
        out.count = next;
        out
    }

    /// The same ECs (namespaces, their prefixes and subtree sizes).
    #[cfg(test)]
    pub fn same_as(&self, o: &AddrEcs) -> bool {
        self.count == o.count
            && self
                .ns
                .iter()
                .zip(&o.ns)
                .all(|(a, b)| a.base == b.base && a.order == b.order && a.sizes == b.sizes)
    }

    /// Every prefix, sorted, once (the IPv6 namespace's: it has them all).
    pub fn prefixes(&self) -> &[Prefix] {
        &self.ns[1].order
    }

    /// The EC ranges `[start, end)` a prefix covers for packets of `family` (`None`: both), or
    /// for every address when `prefix` is `None` (only with a family).
    pub fn ranges(&self, prefix: Option<&Prefix>, family: Option<bool>) -> Ranges {
        let fams: &[usize] = match family {
            Some(false) => &[0],
            Some(true) => &[1],
            None => &[0, 1],
        };
        let mut out = Ranges::default();
        for &f in fams {
            let ns = &self.ns[f];
            match prefix {
                None => {
                    let end = ns.base + 1 + ns.order.len() as u32;
                    out.push(ns.base, end);
                }
                Some(p) => {
                    if let Some((id, size)) = ns.find(p) {
                        out.push(id, id + size);
                    }
                }
            }
        }
        out
    }

    /// The EC of an address in a packet of family `v6` (what the trie walk returns).
    pub fn ec_of(&self, addr: u128, v6: bool) -> u32 {
        let ns = &self.ns[usize::from(v6)];
        let mut best: Option<(u8, u32)> = None;
        for (i, p) in ns.order.iter().enumerate() {
            if p.contains_addr(addr) && best.is_none_or(|(l, _)| p.len > l) {
                best = Some((p.len, ns.base + 1 + i as u32));
            }
        }
        best.map_or(ns.base, |(_, id)| id)
    }

    /// Writes the trie of namespace `v6` into `words`, whose first word is word `base` of the
    /// table; returns its root offset, or `None` when every address of the family has the same
    /// EC (then [`AddrEcs::default_ec`]).
    pub fn build_trie(&self, v6: bool, base: usize, words: &mut Vec<u32>) -> Result<Option<u32>, TrieTooBig> {
        let ns = &self.ns[usize::from(v6)];
        let (start, strides): (u8, &[u32]) = if v6 { (0, &V6_STRIDES) } else { (96, &V4_STRIDES) };
        // Prefixes no longer than the trie's start apply to every address: the default. They
        // come first in the order (`::/0` in the IPv6 namespace; in the IPv4 one, the prefixes
        // that contain the whole IPv4-mapped range sort before every prefix inside it), so
        // the deeper ones are the rest: a slice, where a vector of them with their ECs was a
        // copy of every prefix, twice an address edit.
        let at = ns.order.partition_point(|p| p.len <= start);
        debug_assert!(ns.order[at..].iter().all(|p| p.len > start));
        let deeper = &ns.order[at..];
        if deeper.is_empty() {
            return Ok(None);
        }
        let default = self.default_ec(v6);
        let root = block(
            words,
            base,
            deeper,
            ns.base + 1 + at as u32,
            default,
            start,
            strides,
        )?;
        Ok(Some(root))
    }

    /// The EC of the family's addresses that no trie prefix refines: the longest prefix that
    /// contains the whole family range, or the namespace's root.
    pub fn default_ec(&self, v6: bool) -> u32 {
        let ns = &self.ns[usize::from(v6)];
        let start = if v6 { 0 } else { 96 };
        ns.order
            .iter()
            .enumerate()
            .filter(|(_, p)| p.len <= start)
            .max_by_key(|(_, p)| p.len)
            .map_or(ns.base, |(i, _)| ns.base + 1 + i as u32)
    }
}

/// How the ECs of one address dimension moved from one numbering to the next: a prefix in both
/// keeps its place among the others, so the ECs that stay keep their order.
#[derive(Debug)]
pub struct EcMoves {
    /// Per old EC, its new one ([`NONE`]: its prefix is gone).
    map: Vec<u32>,
    /// Old ECs whose prefix is gone, and new ECs of prefixes not there before, ascending.
    removed: Vec<u32>,
    added: Vec<u32>,
}

impl EcMoves {
    pub fn new(old: &AddrEcs, new: &AddrEcs) -> Self {
        let mut map = vec![NONE; old.count as usize];
        let (mut removed, mut added) = (Vec::new(), Vec::new());
        for (o, n) in old.ns.iter().zip(&new.ns) {
            map[o.base as usize] = n.base;
            let (mut i, mut j) = (0, 0);
            while i < o.order.len() || j < n.order.len() {
                let (oe, ne) = (o.base + 1 + i as u32, n.base + 1 + j as u32);
                match (o.order.get(i), n.order.get(j)) {
                    (Some(a), Some(b)) if a == b => {
                        map[oe as usize] = ne;
                        i += 1;
                        j += 1;
                    }
                    (Some(a), b) if b.is_none_or(|b| a < b) => {
                        removed.push(oe);
                        i += 1;
                    }
                    _ => {
                        added.push(ne);
                        j += 1;
                    }
                }
            }
        }
        EcMoves { map, removed, added }
    }

    /// Do the old ECs `lo..=hi` all stay, with no new EC among them or right after them? Then
    /// a prefix whose ECs lie there covers their new ECs, as many and contiguous.
    pub fn keeps(&self, lo: u32, hi: u32) -> bool {
        let none_in = |v: &[u32], lo: u32, hi: u32| {
            let at = v.partition_point(|&e| e < lo);
            v.get(at).is_none_or(|&e| e > hi)
        };
        lo <= hi
            && (hi as usize) < self.map.len()
            && none_in(&self.removed, lo, hi)
            && none_in(&self.added, self.map[lo as usize], self.map[hi as usize] + 1)
    }

    /// The new EC of old EC `e` (one [`EcMoves::keeps`] says stays).
    pub fn get(&self, e: u32) -> u32 {
        self.map[e as usize]
    }
}

/// The words table would pass its limit while building a trie.
#[derive(Debug)]
pub struct TrieTooBig;

/// Most words the tries of one policy may take (with the other tables' limit checked after).
pub const TRIE_WORD_LIMIT: usize = 1 << 23;

/// Writes one trie block covering bits `[pos, pos + strides[0])` for `prefixes` (all longer than
/// `pos`, sorted depth-first, consecutive ECs from `ec0`), leaf-pushed under `inherited`, into
/// `words` (word `base` of the table first). Returns its offset in the table.
fn block(
    words: &mut Vec<u32>,
    base: usize,
    prefixes: &[Prefix],
    ec0: u32,
    inherited: u32,
    pos: u8,
    strides: &[u32],
) -> Result<u32, TrieTooBig> {
    let stride = strides[0] as u8;
    let size = 1usize << stride;
    if base + words.len() + size > TRIE_WORD_LIMIT {
        return Err(TrieTooBig);
    }
    let off = words.len();
    words.resize(off + size, inherited);
    let end = pos + stride;
    let entry_of = |a: u128| ((a >> (128 - u32::from(end))) as usize) & (size - 1);
    // Prefixes ending inside this block set their entries (shorter first, so longer ones win);
    // depth-first order puts a prefix before those nested in it.
    let mut i = 0;
    let mut children: Vec<(usize, usize, usize)> = Vec::new(); // (entry, from, to)
    // Sorted, the prefixes between the first and the last share the bits those two share: when
    // the first is deeper than the block and both agree up to its end, so does every prefix,
    // all under one entry (none shorter could sort between them). Long runs of IPv4-mapped
    // prefixes through the IPv6 trie's top blocks skip the walk below.
    if let (Some(&first), Some(&last)) = (prefixes.first(), prefixes.last())
        && first.len > end
        && (first.addr ^ last.addr) >> (128 - u32::from(end)) == 0
    {
        children.push((entry_of(first.addr), 0, prefixes.len()));
        i = prefixes.len();
    }
    while i < prefixes.len() {
        let (p, ec) = (prefixes[i], ec0 + i as u32);
        if p.len <= end {
            let first = entry_of(p.addr);
            let count = 1usize << (end - p.len);
            for w in &mut words[off + first..off + first + count] {
                *w = ec;
            }
            i += 1;
        } else {
            // A run of prefixes deeper than this block under one entry.
            let e = entry_of(p.addr);
            let from = i;
            while i < prefixes.len() && prefixes[i].len > end && entry_of(prefixes[i].addr) == e {
                i += 1;
            }
            children.push((e, from, i));
        }
    }
    for (e, from, to) in children {
        // The entry's value now is the EC of the longest prefix covering it: the child
        // inherits it.
        let inherit = words[off + e];
        let child = block(
            words,
            base,
            &prefixes[from..to],
            ec0 + from as u32,
            inherit,
            end,
            &strides[1..],
        )?;
        words[off + e] = CHILD | child;
    }
    Ok((base + off) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(a: [u8; 4], len: u8) -> Prefix {
        Prefix::new((0xffff_u128 << 32) | u128::from(u32::from_be_bytes(a)), 96 + len)
    }

    fn v4addr(a: [u8; 4]) -> u128 {
        (0xffff_u128 << 32) | u128::from(u32::from_be_bytes(a))
    }

    #[test]
    fn nested_prefixes_get_contiguous_ranges() {
        let e = AddrEcs::new([v4([10, 0, 0, 0], 8), v4([10, 1, 0, 0], 16), v4([10, 2, 0, 0], 16)]);
        let r8 = e.ranges(Some(&v4([10, 0, 0, 0], 8)), Some(false));
        let r16 = e.ranges(Some(&v4([10, 1, 0, 0], 16)), Some(false));
        assert_eq!(r8.len(), 1);
        assert_eq!(r8[0].1 - r8[0].0, 3, "the /8 and both /16s");
        assert!(r8[0].0 <= r16[0].0 && r16[0].1 <= r8[0].1);
        assert_eq!(e.ec_of(v4addr([10, 1, 2, 3]), false), r16[0].0);
        assert_eq!(e.ec_of(v4addr([10, 3, 2, 3]), false), r8[0].0);
        // An IPv4 prefix covers nothing of the IPv6 namespace's packets with other addresses,
        // but IPv6 packets carrying IPv4-mapped addresses have their own ECs.
        let v6r = e.ranges(Some(&v4([10, 0, 0, 0], 8)), Some(true));
        assert_eq!(v6r[0].1 - v6r[0].0, 3);
        assert_ne!(v6r[0].0, r8[0].0);
    }

    #[test]
    fn prefix_lengths_of_masks() {
        assert_eq!(prefix_len(&[0; 4]), Some(0));
        assert_eq!(prefix_len(&[u32::MAX; 4]), Some(128));
        let m = [u32::MAX, 0, u32::from_ne_bytes([0xff, 0, 0, 0]), 0];
        assert_eq!(prefix_len(&m), None);
    }
}
