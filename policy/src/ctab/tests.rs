//! The compiled classifier against the linear reference: random rule lists with overlapping
//! prefixes, port ranges, wildcards, both families, DSCP, mark and cgroup, and random packets
//! (many of them on the rules' edges), compared packet by packet.

use paceline_common::classify::{PacketInfo, UNKNOWN_CGROUP, UNKNOWN_DSCP, UNKNOWN_MARK, first_match};
use paceline_common::ctab::{LIST_AT, PHASE_DPORT, PHASE_MARK, PHASE_SPORT, TAG_PHASE};
use paceline_common::{classify::Rule, maps::v4_mapped};
use rand::rngs::StdRng;
use rand::{Rng, RngExt, SeedableRng};

use super::addr::mask;
use super::*;

fn words(a: u128) -> [u32; 4] {
    let b = a.to_be_bytes();
    let mut w = [0u32; 4];
    for (i, c) in b.chunks_exact(4).enumerate() {
        w[i] = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
    }
    w
}

fn v4(a: [u8; 4]) -> u128 {
    (0xffff_u128 << 32) | u128::from(u32::from_be_bytes(a))
}

/// Prefix pools that nest and overlap: (address, length over 128 bits).
fn prefix_pool() -> Vec<(u128, u8)> {
    let v6 = |hi: u64, len| ((u128::from(hi)) << 64, len);
    vec![
        (v4([10, 0, 0, 0]), 104),
        (v4([10, 1, 0, 0]), 112),
        (v4([10, 1, 2, 0]), 120),
        (v4([10, 1, 2, 3]), 128),
        (v4([10, 1, 2, 128]), 121),
        (v4([10, 2, 0, 0]), 112),
        (v4([192, 168, 0, 0]), 112),
        (v4([192, 168, 7, 0]), 120),
        (v4([0, 0, 0, 0]), 96),
        (v4([0, 0, 0, 0]), 97),
        (v4([128, 0, 0, 0]), 97),
        (0, 0),
        (0, 80),
        v6(0xfd00_0000_0000_0000, 8),
        v6(0xfd00_0001_0000_0000, 32),
        v6(0xfd00_0001_0002_0000, 48),
        v6(0xfd00_0001_0002_0003, 64),
        ((u128::from(0xfd00_0001_0002_0003_u64) << 64) | 0x10, 128),
        v6(0x2001_0db8_0000_0000, 32),
    ]
}

fn port_pool() -> Vec<(u16, u16)> {
    vec![
        (80, 80),
        (443, 443),
        (0, 1023),
        (1024, 65535),
        (8000, 8100),
        (8080, 8080),
        (11211, 11211),
        (65535, 65535),
        (0, 0),
        (50, 60000),
    ]
}

fn random_rule(rng: &mut impl Rng, classes: u16) -> Rule {
    let pool = prefix_pool();
    let ports = port_pool();
    let mut r = Rule::any(rng.random_range(0..classes));
    if rng.random_bool(0.4) {
        r = r.with_proto([6, 17, 1, 58, 132][rng.random_range(0..5)]);
    }
    let mut fam: Option<bool> = None;
    if rng.random_bool(0.5) {
        let (a, l) = pool[rng.random_range(0..pool.len())];
        r = r.with_src(words(a), words(mask(l)));
        fam = Some(a >> 32 != 0xffff || l < 96);
    }
    if rng.random_bool(0.5) {
        let (a, l) = pool[rng.random_range(0..pool.len())];
        r = r.with_dst(words(a), words(mask(l)));
        fam = fam.or(Some(a >> 32 != 0xffff || l < 96));
    }
    // The policy compiler sets the family from the addresses; sometimes leave it unset or
    // set it alone, which the classifier must handle too.
    match rng.random_range(0..4) {
        0 | 1 => {
            if let Some(f) = fam {
                r = r.with_family(f);
            }
        }
        2 => r = r.with_family(rng.random_bool(0.5)),
        _ => {}
    }
    if rng.random_bool(0.3) {
        let (lo, hi) = ports[rng.random_range(0..ports.len())];
        r = r.with_sport(lo, hi);
    }
    if rng.random_bool(0.5) {
        let (lo, hi) = ports[rng.random_range(0..ports.len())];
        r = r.with_dport(lo, hi);
    }
    if rng.random_bool(0.15) {
        r = r.with_dscp([0, 10, 46][rng.random_range(0..3)]);
    }
    if rng.random_bool(0.1) {
        let (v, m) = [(0x100, 0xf00), (0x200, 0xf00), (0x1, 0xff), (0x101, u32::MAX)][rng.random_range(0..4)];
        r = r.with_mark(v, m);
    }
    if rng.random_bool(0.1) {
        r = r.with_cgroup([7, 9, 1 << 40][rng.random_range(0..3)]);
    }
    r
}

fn random_packet(rng: &mut impl Rng) -> PacketInfo {
    let pool = prefix_pool();
    let addr = |rng: &mut StdRng| -> u128 {
        let (a, l) = pool[rng.random_range(0..pool.len())];
        let host: u128 = rng.random();
        // Inside the prefix, on an edge of it, or anywhere.
        match rng.random_range(0..4) {
            0 => a,
            1 => a | !mask(l),
            2 => a | (host & !mask(l)),
            _ => host,
        }
    };
    let mut rng2 = StdRng::seed_from_u64(rng.random());
    let v6 = rng.random_bool(0.4);
    let (mut src, mut dst) = (addr(&mut rng2), addr(&mut rng2));
    if !v6 {
        src = (0xffff_u128 << 32) | (src & 0xffff_ffff);
        dst = (0xffff_u128 << 32) | (dst & 0xffff_ffff);
    }
    let ports = port_pool();
    let port = |rng: &mut StdRng| -> u16 {
        let (lo, hi) = ports[rng.random_range(0..ports.len())];
        match rng.random_range(0..5) {
            0 => lo,
            1 => hi,
            2 => lo.wrapping_sub(1),
            3 => hi.wrapping_add(1),
            _ => rng.random(),
        }
    };
    let unknown = if rng.random_bool(0.2) {
        UNKNOWN_DSCP | UNKNOWN_CGROUP | UNKNOWN_MARK
    } else {
        0
    };
    PacketInfo {
        src: words(src),
        dst: words(dst),
        cgroup_id: [0, 7, 9, 1 << 40, 12][rng.random_range(0..5)],
        mark: [0, 0x100, 0x1ff, 0x101, 0x201, 0x1][rng.random_range(0..6)],
        sport: port(&mut rng2),
        dport: port(&mut rng2),
        proto: [6, 17, 1, 58, 132, 0][rng.random_range(0..6)],
        dscp: [0, 10, 46, 63][rng.random_range(0..4)],
        is_v6: u8::from(v6),
        unknown,
        _pad: [0; 4],
    }
}

/// Compares the compiled lookup with the reference on every packet; false when the rules
/// passed a limit (too many overlapping selectors with addresses), which random policies may.
/// Also with little room for the one-address arrays (`Limits::shape_arrays`): some policies
/// read them, others the rule table.
fn check(rules: &[Rule], packets: &[PacketInfo]) -> bool {
    let few = Limits {
        shape_arrays: 1 + rules.len() % 24,
        ..LIMITS
    };
    for lim in [LIMITS, few] {
        let image = match build_with(rules, &lim) {
            Ok(i) => i,
            Err(BuildError::Limit { .. }) => return false,
            Err(e) => panic!("build failed: {e}\nrules: {rules:#?}"),
        };
        // As the words map's readers read it, and as the tc program reads the fast words.
        let t = MemTables::new(&image);
        let fast = MemTables::fast(&image);
        for p in packets {
            let want = first_match(rules, p);
            let got = t.first_rule(p);
            assert_eq!(got, want, "packet {p:#?}\nrules: {rules:#?}\nlimits: {lim:?}");
            if let Some(f) = &fast {
                let got = f.first_rule(p);
                assert_eq!(
                    got, want,
                    "fast words: packet {p:#?}\nrules: {rules:#?}\nlimits: {lim:?}"
                );
            }
        }
    }
    true
}

#[test]
fn random_policies_agree_with_the_reference() {
    let mut rng = StdRng::seed_from_u64(0x5eed_c7ab);
    let mut built = 0;
    for _ in 0..3000 {
        let n = rng.random_range(0..40);
        let rules: Vec<Rule> = (0..n).map(|_| random_rule(&mut rng, 16)).collect();
        let packets: Vec<PacketInfo> = (0..300).map(|_| random_packet(&mut rng)).collect();
        built += usize::from(check(&rules, &packets));
    }
    assert!(
        built > 2900,
        "only {built} of 3000 random policies fit the limits"
    );
}

#[test]
fn rules_built_by_hand_with_odd_fields_agree_too() {
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..500 {
        let n = rng.random_range(1..20);
        let rules: Vec<Rule> = (0..n)
            .map(|_| {
                let mut r = random_rule(&mut rng, 8);
                match rng.random_range(0..6) {
                    // Conditions the linear matcher skips (deep = 0).
                    0 => r.deep = 0,
                    // "needs" without the condition, or a condition without "needs".
                    1 => r.needs = rng.random_range(0..8),
                    // A port range that wraps.
                    2 => {
                        r.dport_min = 65000;
                        r.dport_span = 1000;
                    }
                    _ => {}
                }
                r
            })
            .collect();
        let packets: Vec<PacketInfo> = (0..300).map(|_| random_packet(&mut rng)).collect();
        assert!(check(&rules, &packets), "within the limits");
    }
}

#[test]
fn empty_and_catch_all() {
    let p = PacketInfo::default();
    let image = build(&[]).unwrap();
    assert_eq!(MemTables::new(&image).first_rule(&p), None);
    let rules = [Rule::any(3), Rule::any(4).with_proto(6)];
    let image = build(&rules).unwrap();
    assert_eq!(MemTables::new(&image).first_rule(&p), Some(0));
}

#[test]
fn a_wide_earlier_prefix_wins_over_nested_later_ones() {
    let net = |a: [u8; 4], l: u8| (words(v4(a)), words(mask(96 + l)));
    let (a8, m8) = net([10, 0, 0, 0], 8);
    let (a24, m24) = net([10, 1, 2, 0], 24);
    let rules = [
        Rule::any(1).with_dst(a8, m8).with_family(false),
        Rule::any(2).with_dst(a24, m24).with_family(false),
    ];
    let image = build(&rules).unwrap();
    let t = MemTables::new(&image);
    let p = PacketInfo {
        src: v4_mapped(u32::from_ne_bytes([1, 1, 1, 1])),
        dst: v4_mapped(u32::from_ne_bytes([10, 1, 2, 3])),
        ..PacketInfo::default()
    };
    assert_eq!(t.first_rule(&p), Some(0));
    let (shadowed, complete) = shadow::covered(
        &rules
            .iter()
            .enumerate()
            .map(|(i, r)| normalize(i, r).unwrap())
            .collect::<Vec<_>>(),
    );
    assert!(complete);
    assert_eq!(shadowed, vec![(1, 0)]);
}

#[test]
fn covered_rules_never_match_a_random_packet() {
    // Whatever `shadow::covered` reports must indeed never be the first match.
    let mut rng = StdRng::seed_from_u64(99);
    for _ in 0..500 {
        let n = rng.random_range(1..30);
        let rules: Vec<Rule> = (0..n).map(|_| random_rule(&mut rng, 8)).collect();
        let norms: Vec<Norm> = rules
            .iter()
            .enumerate()
            .map(|(i, r)| normalize(i, r).unwrap())
            .collect();
        let (covered, _) = shadow::covered(&norms);
        for _ in 0..300 {
            let p = random_packet(&mut rng);
            if let Some(m) = first_match(&rules, &p) {
                assert!(
                    !covered.iter().any(|(later, _)| *later == m),
                    "rule {m} reported covered but matched {p:#?}\n{rules:#?}"
                );
            }
        }
    }
}

/// The array of phase `phase` (`PHASE_*`), or of the last phase (`None`).
fn phase_array(image: &Image, phase: Option<u32>) -> u32 {
    let h = &image.header;
    h.phase_off[phase.unwrap_or(31 - h.phases.leading_zeros()) as usize]
}

/// A policy without addresses takes its rule from the phases' arrays alone (the selector and
/// rule tables are left empty, so a wrong array fails here); one with address rules (beside
/// port rules, or a tenant list of one selector) takes its selector lists from the words, and
/// the selector table stays empty too. Checked (2026-12-06): with the last phase's rule words
/// off by one bit, a phase before the last's next EC off by one, or a list's first selector
/// off by one, this and the random policies above failed.
#[test]
fn small_phases_are_arrays_and_agree_with_the_reference() {
    let mut ports: Vec<Rule> = (0..4u16)
        .map(|i| Rule::any(1 + i).with_proto(17).with_dport(5000 + i, 5000 + i))
        .collect();
    ports.push(Rule::any(6).with_proto(17).with_sport(53, 53).with_dscp(46));
    ports.push(Rule::any(7).with_mark(0x100, 0xf00));
    let image = build(&ports).unwrap();
    assert_eq!(image.header.phases, 0b111);
    for phase in [PHASE_DPORT, PHASE_SPORT, PHASE_MARK] {
        assert_ne!(phase_array(&image, Some(phase)), NONE, "phase {phase}");
    }
    assert!(image.sels.is_empty(), "{:?}", image.sels);
    assert!(image.rules.is_empty(), "{:?}", image.rules);
    let mut rng = StdRng::seed_from_u64(11);
    let mut packets: Vec<PacketInfo> = (0..3000).map(|_| random_packet(&mut rng)).collect();
    for (i, p) in packets.iter_mut().enumerate().step_by(2) {
        p.proto = 17;
        p.dport = 4999 + (i % 6) as u16;
        p.sport = [53, 54][i % 4 / 2];
        p.dscp = [46, 0][i % 8 / 4];
    }
    assert!(check(&ports, &packets));

    let mut mixed = ports.clone();
    mixed.insert(
        1,
        Rule::any(7)
            .with_proto(17)
            .with_dport(5002, 5002)
            .with_dst(v4_mapped(0x0a00_0001u32.to_be()), words(mask(128))),
    );
    let image = build(&mixed).unwrap();
    assert_ne!(phase_array(&image, None), NONE);
    assert!(image.sels.is_empty(), "{:?}", image.sels);
    for p in packets.iter_mut().step_by(3) {
        p.is_v6 = 0;
        p.dst = v4_mapped(0x0a00_0001u32.to_be());
    }
    assert!(check(&mixed, &packets));

    // One selector, each rule with its own addresses (a tenant list).
    let tenants: Vec<Rule> = (0..50u32)
        .map(|i| {
            Rule::any(1 + (i % 3) as u16)
                .with_proto(6)
                .with_dport(11211, 11211)
                .with_dst(v4_mapped((0x0a00_0000 + i).to_be()), words(mask(128)))
        })
        .collect();
    let image = build(&tenants).unwrap();
    assert_ne!(phase_array(&image, None), NONE);
    assert!(image.sels.is_empty(), "{:?}", image.sels);
    for (i, p) in packets.iter_mut().enumerate() {
        p.is_v6 = 0;
        p.proto = [6, 17][i % 2];
        p.dport = [11211, 11212][i % 4 / 2];
        p.dst = v4_mapped((0x0a00_0000 + (i % 60) as u32).to_be());
    }
    assert!(check(&tenants, &packets));
}

/// A phase of more keys than the arrays have room for keeps its hash table, and agrees too:
/// distinct source and destination ports (the last phase's ECs multiply), and distinct DSCPs
/// and destination ports (the first phase's).
#[test]
fn phases_too_large_for_an_array_keep_their_hash_tables() {
    let rules: Vec<Rule> = (0..300u16)
        .map(|i| {
            Rule::any(i % 8)
                .with_proto(6)
                .with_sport(1000 + i, 1000 + i)
                .with_dport(2000 + 2 * i, 2000 + 2 * i)
        })
        .collect();
    let image = build(&rules).unwrap();
    assert_eq!(phase_array(&image, None), NONE);
    assert_ne!(phase_array(&image, Some(PHASE_DPORT)), NONE);
    // Every key of the last phase yields a rule here (no address conditions): in the table.
    assert!(!image.sels.is_empty() && image.sels.iter().all(|(_, y)| y & LIST_AT == 0));
    let mut rng = StdRng::seed_from_u64(12);
    let packets: Vec<PacketInfo> = (0..3000)
        .map(|i| {
            let mut p = random_packet(&mut rng);
            let j = (i % 310) as u16;
            p.proto = 6;
            p.sport = 1000 + j;
            p.dport = 2000 + 2 * (j ^ (i as u16 & 1));
            p
        })
        .collect();
    assert!(check(&rules, &packets));

    // The same with an address rule before every seventh: their lists, in the words, are what
    // the selector table yields for those keys.
    let dst = v4_mapped(0x0a00_0001u32.to_be());
    let with_addrs: Vec<Rule> = rules
        .iter()
        .enumerate()
        .flat_map(|(i, r)| {
            let a = (i % 7 == 0).then(|| {
                let mut x = *r;
                x.class = 9;
                x.with_dst(dst, words(mask(128)))
            });
            a.into_iter().chain([*r])
        })
        .collect();
    let image = build(&with_addrs).unwrap();
    assert_eq!(phase_array(&image, None), NONE);
    assert!(image.sels.iter().any(|(_, y)| *y != NONE && y & LIST_AT != 0));
    let packets: Vec<PacketInfo> = packets
        .iter()
        .enumerate()
        .map(|(i, p)| PacketInfo {
            is_v6: 0,
            dst: if i % 2 == 0 { dst } else { p.dst },
            ..*p
        })
        .collect();
    assert!(check(&with_addrs, &packets));

    let mut rules: Vec<Rule> = (0..1100u16)
        .map(|i| {
            Rule::any(i % 8)
                .with_proto(6)
                .with_dscp((i % 63 + 1) as u8)
                .with_dport(3000 + i, 3000 + i)
        })
        .collect();
    rules.push(Rule::any(9).with_proto(6).with_sport(7, 7));
    let image = build(&rules).unwrap();
    assert_eq!(phase_array(&image, Some(PHASE_DPORT)), NONE);
    assert_ne!(phase_array(&image, Some(PHASE_SPORT)), NONE);
    assert!(
        image
            .rules
            .iter()
            .any(|(k, _)| k.tag == TAG_PHASE + 4 * PHASE_DPORT)
    );
    let packets: Vec<PacketInfo> = (0..4000)
        .map(|i| {
            let mut p = random_packet(&mut rng);
            let j = (i % 1110) as u16;
            p.proto = 6;
            p.unknown = 0;
            p.dscp = (j % 63 + 1) as u8 ^ (i as u8 & 1);
            p.dport = 3000 + j;
            p.sport = [7, 8][i % 2];
            p
        })
        .collect();
    assert!(check(&rules, &packets));
}

/// The arrays never take the words a policy needs: one word fewer than the policy takes with
/// them, and it compiles without them, answering the same. Checked (2026-12-06): with the
/// arrays' room not bounded by the limit, the build failed on the words limit.
#[test]
fn phase_arrays_give_way_to_the_words_limit() {
    let rules: Vec<Rule> = (0..40u16)
        .map(|i| Rule::any(1 + i % 5).with_proto(6).with_dport(7000 + i, 7000 + i))
        .collect();
    let with = build(&rules).unwrap();
    assert_ne!(phase_array(&with, None), NONE);
    let lim = Limits {
        words: with.words.len() - 1,
        ..LIMITS
    };
    let without = build_with(&rules, &lim).expect("fits without the arrays");
    assert_eq!(phase_array(&without, None), NONE);
    let t = MemTables::new(&without);
    let mut rng = StdRng::seed_from_u64(13);
    for i in 0..2000u16 {
        let mut p = random_packet(&mut rng);
        p.proto = [6, 17][usize::from(i % 2)];
        p.dport = 6990 + i % 60;
        assert_eq!(t.first_rule(&p), first_match(&rules, &p), "{p:?}");
    }
}

#[test]
fn limits_are_reported_with_the_count() {
    let rules: Vec<Rule> = (0..100u16)
        .map(|i| Rule::any(1).with_proto(6).with_dport(1000 + i, 1000 + i))
        .collect();
    let lim = Limits { sels: 50, ..LIMITS };
    match build_with(&rules, &lim) {
        Err(BuildError::Limit { what, limit, .. }) => {
            assert_eq!(what, "field phases");
            assert_eq!(limit, 50);
        }
        other => panic!("expected a limit error, got {other:?}"),
    }
}

/// The covered-rule search as it was before prefix trees (hashed prefix pairs, ancestors looked
/// up at every length the policy has): the reference the faster search must answer like.
fn covered_reference(rules: &[Norm]) -> Vec<(usize, usize)> {
    use std::collections::{HashMap, HashSet};
    let lens_and_set = |ps: Vec<addr::Prefix>| {
        let set: HashSet<addr::Prefix> = ps.into_iter().collect();
        let mut lens: Vec<u8> = set.iter().map(|p| p.len).collect();
        lens.sort_unstable();
        lens.dedup();
        (set, lens)
    };
    let srcs = lens_and_set(rules.iter().filter_map(|r| r.src).collect());
    let dsts = lens_and_set(rules.iter().filter_map(|r| r.dst).collect());
    let ancestors = |p: Option<addr::Prefix>, (set, lens): &(HashSet<addr::Prefix>, Vec<u8>)| {
        let mut out = vec![None];
        if let Some(p) = p {
            for &len in lens.iter().take_while(|&&l| l <= p.len) {
                let a = addr::Prefix::new(p.addr, len);
                if set.contains(&a) {
                    out.push(Some(a));
                }
            }
        }
        out
    };
    let mut index: HashMap<(Option<addr::Prefix>, Option<addr::Prefix>), Vec<usize>> = HashMap::new();
    let mut out = Vec::new();
    for (j, rj) in rules.iter().enumerate() {
        let mut found = None;
        'search: for s in ancestors(rj.src, &srcs) {
            for d in ancestors(rj.dst, &dsts) {
                for &i in index.get(&(s, d)).into_iter().flatten() {
                    if shadow::covers(&rules[i], rj) {
                        found = Some(i);
                        break 'search;
                    }
                }
            }
        }
        match found {
            Some(i) => out.push((j, i)),
            None => {
                let v = index.entry((rj.src, rj.dst)).or_default();
                if !v
                    .iter()
                    .any(|&i| rules[i].sel == rj.sel && rules[i].addr_family == rj.addr_family)
                {
                    v.push(j);
                }
            }
        }
    }
    out
}

#[test]
fn the_covered_rule_search_answers_like_the_reference() {
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..2000 {
        let n = rng.random_range(1..60);
        let rules: Vec<Rule> = (0..n).map(|_| random_rule(&mut rng, 8)).collect();
        let norms: Vec<Norm> = rules
            .iter()
            .enumerate()
            .map(|(i, r)| normalize(i, r).unwrap())
            .collect();
        let (covered, complete) = shadow::covered(&norms);
        assert!(complete);
        assert_eq!(covered, covered_reference(&norms), "{rules:#?}");
    }
}

/// One random edit of a rule list: a class, an address, a port, a rule replaced, inserted or
/// removed, or nothing.
fn random_edit(rng: &mut StdRng, rules: &mut Vec<Rule>) {
    let pool = prefix_pool();
    let at = rng.random_range(0..rules.len().max(1));
    match rng.random_range(0..7) {
        0 if !rules.is_empty() => rules[at].class = rng.random_range(0..8),
        1 if !rules.is_empty() => {
            let (a, l) = pool[rng.random_range(0..pool.len())];
            rules[at] = rules[at].with_dst(words(a), words(mask(l)));
        }
        2 if !rules.is_empty() => {
            let (lo, hi) = port_pool()[rng.random_range(0..port_pool().len())];
            rules[at] = rules[at].with_dport(lo, hi);
        }
        3 if !rules.is_empty() => rules[at] = random_rule(rng, 8),
        4 => rules.insert(at.min(rules.len()), random_rule(rng, 8)),
        5 if !rules.is_empty() => {
            rules.remove(at);
        }
        _ => {}
    }
}

/// `build_after` the image before, against a build from nothing: the same image, or the same
/// error.
fn incremental_matches_full(rules: &[Rule], prev: Option<&Image>, lim: &Limits) -> Option<Image> {
    let norms = normalize_all(rules).unwrap();
    let inc = build_after(rules, &norms, lim, prev);
    let full = build_with(rules, lim);
    match (inc, full) {
        (Ok(inc), Ok(full)) => {
            assert!(
                inc.same_tables(&full),
                "incremental != full for {rules:#?}\n{:?} {:?}\n{:?} {:?}\n{:?}",
                inc.header,
                full.header,
                inc.stats,
                full.stats,
                lim
            );
            Some(inc)
        }
        (Err(a), Err(b)) => {
            assert_eq!(a, b);
            None
        }
        (a, b) => panic!(
            "incremental {:?} vs full {:?}",
            a.map(|i| i.stats),
            b.map(|i| i.stats)
        ),
    }
}

#[test]
fn incremental_builds_after_random_edits_equal_full_builds() {
    let mut rng = StdRng::seed_from_u64(2026);
    for _ in 0..40 {
        let n = rng.random_range(0..80);
        let mut rules: Vec<Rule> = (0..n).map(|_| random_rule(&mut rng, 8)).collect();
        // Now and then a rule-table limit a reused group could pass, or little room for the
        // one-address arrays (they come and go as the ECs grow and shrink).
        let lim = match rng.random_range(0..10) {
            0 | 1 => Limits {
                rules: rng.random_range(1..200),
                ..LIMITS
            },
            2..=4 => Limits {
                shape_arrays: rng.random_range(0..40),
                ..LIMITS
            },
            _ => LIMITS,
        };
        let mut prev = incremental_matches_full(&rules, None, &lim);
        for _ in 0..12 {
            random_edit(&mut rng, &mut rules);
            if let Some(image) = incremental_matches_full(&rules, prev.as_ref(), &lim) {
                prev = Some(image);
            }
        }
    }
}

#[test]
fn incremental_builds_take_what_an_edit_leaves_unchanged() {
    // 2,000 /32 destinations under 20 ports: a class edit keeps every part, an address edit
    // rebuilds the destinations and the rule table but keeps the field phases.
    let rules: Vec<Rule> = (0..2000u32)
        .map(|i| {
            Rule::any(1 + (i % 8) as u16)
                .with_proto(17)
                .with_dport(20000 + (i / 100) as u16, 20000 + (i / 100) as u16)
                .with_family(false)
                .with_dst(
                    v4_mapped(u32::from_ne_bytes([10, 100, (i >> 8) as u8, i as u8])),
                    [u32::MAX; 4],
                )
        })
        .collect();
    let first = incremental_matches_full(&rules, None, &LIMITS).unwrap();
    let mut class_edit = rules.clone();
    class_edit[1000].class = 9;
    let second = incremental_matches_full(&class_edit, Some(&first), &LIMITS).unwrap();
    let (a, b) = (&first.memo, &second.memo);
    assert!(Arc::ptr_eq(a.dst.as_ref().unwrap(), b.dst.as_ref().unwrap()));
    assert!(Arc::ptr_eq(
        a.fields.as_ref().unwrap(),
        b.fields.as_ref().unwrap()
    ));
    let mut addr_edit = class_edit.clone();
    addr_edit[1500] = addr_edit[1500].with_dst(v4_mapped(u32::from_ne_bytes([10, 200, 0, 1])), [u32::MAX; 4]);
    let third = incremental_matches_full(&addr_edit, Some(&second), &LIMITS).unwrap();
    let c = &third.memo;
    assert!(!Arc::ptr_eq(b.dst.as_ref().unwrap(), c.dst.as_ref().unwrap()));
    assert!(Arc::ptr_eq(b.src.as_ref().unwrap(), c.src.as_ref().unwrap()));
    assert!(Arc::ptr_eq(
        b.fields.as_ref().unwrap(),
        c.fields.as_ref().unwrap()
    ));
}

/// An edit that keeps the rule count: a class, a destination, a source, a port or a whole rule
/// replaced (so rules become covered, or stop being, and coverers change).
fn same_length_edit(rng: &mut StdRng, rules: &mut [Rule]) {
    let pool = prefix_pool();
    let at = rng.random_range(0..rules.len());
    let (a, l) = pool[rng.random_range(0..pool.len())];
    rules[at] = match rng.random_range(0..5) {
        0 => Rule {
            class: rng.random_range(0..8),
            ..rules[at]
        },
        1 => rules[at].with_dst(words(a), words(mask(l))),
        2 => rules[at].with_src(words(a), words(mask(l))),
        3 => {
            let (lo, hi) = port_pool()[rng.random_range(0..port_pool().len())];
            rules[at].with_dport(lo, hi)
        }
        _ => random_rule(rng, 8),
    };
}

#[test]
fn covered_rule_searches_after_random_edits_equal_searches_from_nothing() {
    let mut rng = StdRng::seed_from_u64(2027);
    for _ in 0..300 {
        let n = rng.random_range(1..70);
        let mut rules: Vec<Rule> = (0..n).map(|_| random_rule(&mut rng, 8)).collect();
        let mut prev = shadow::search(&normalize_all(&rules).unwrap());
        for _ in 0..10 {
            let before = normalize_all(&rules).unwrap();
            for _ in 0..rng.random_range(1..4) {
                same_length_edit(&mut rng, &mut rules);
            }
            let norms = normalize_all(&rules).unwrap();
            let changed: Vec<(usize, Norm)> = (0..rules.len())
                .filter(|&i| before[i] != norms[i])
                .map(|i| (i, before[i].clone()))
                .collect();
            let after = shadow::search_after(&norms, &prev, &changed);
            let full = shadow::search(&norms);
            assert_eq!(
                (&after.pairs, after.complete),
                (&full.pairs, full.complete),
                "after {changed:#?}\n{norms:#?}"
            );
            prev = after;
        }
    }
}

/// `10.a.b.c` as the address words of a rule.
fn host10(a: u8, b: u8, c: u8) -> [u32; 4] {
    words(v4([10, a, b, c]))
}

/// A prefix an address edit puts in: mostly a /32 of `10.{1,100,101,200,255}.0-3.x`, else the
/// /24 or /16 around one, and with `with_any` sometimes none (`0/0`).
fn random_prefix(rng: &mut StdRng, with_any: bool) -> ([u32; 4], [u32; 4]) {
    let a = [1, 100, 101, 200, 255][rng.random_range(0..5)];
    let (b, c) = (rng.random_range(0..4), rng.random_range(0..=255));
    match rng.random_range(0..if with_any { 8 } else { 6 }) {
        0 => (host10(a, b, 0), words(mask(120))),
        1 => (host10(a, 0, 0), words(mask(112))),
        2 if with_any => ([0; 4], [0; 4]),
        _ => (host10(a, b, c), words(mask(128))),
    }
}

/// Address edits of a policy of /32 lists under ports (the apply benchmark's shape), with /24s
/// and a /16 among them: an address replaced by one sorted before, between or after the
/// others, inside a /24 of another rule or not, or a /24 or /16 (covering other rules' ECs);
/// the address classes move and most groups are taken moved from the image before.
#[test]
fn incremental_builds_after_address_edits_equal_full_builds() {
    let mut rng = StdRng::seed_from_u64(2028);
    for round in 0..30 {
        let mut rules: Vec<Rule> = (0..400u32)
            .map(|i| {
                let r = Rule::any(1 + (i % 8) as u16)
                    .with_proto(17)
                    .with_dport(20000 + (i / 40) as u16, 20000 + (i / 40) as u16);
                let r = if i % 50 == 7 {
                    r.with_dst(host10(100, (i >> 8) as u8, 0), words(mask(120)))
                } else {
                    r.with_dst(host10(100, (i >> 8) as u8, i as u8), words(mask(128)))
                };
                // Some rules of both families, some with a source too.
                let r = if i % 3 == 0 { r } else { r.with_family(false) };
                if round % 2 == 1 && i % 40 < 5 {
                    r.with_src(host10(1, 0, i as u8), words(mask(128)))
                } else {
                    r
                }
            })
            .collect();
        let mut prev = incremental_matches_full(&rules, None, &LIMITS);
        for _ in 0..12 {
            for _ in 0..rng.random_range(1..3) {
                let at = rng.random_range(0..rules.len());
                let (a, m) = random_prefix(&mut rng, false);
                rules[at] = if rng.random_bool(0.8) {
                    rules[at].with_dst(a, m)
                } else {
                    rules[at].with_src(a, m)
                };
            }
            if let Some(image) = incremental_matches_full(&rules, prev.as_ref(), &LIMITS) {
                prev = Some(image);
            }
        }
    }
}

/// An address stage built after the one before (`AddrStage::after`: the sorted prefixes
/// merged, each rule's index moved) is the stage built from nothing: its rules' prefix indices,
/// ECs and tries. Edits of one to four rules: a prefix replaced by a new one, by another
/// rule's (so the old one may stay or go), taken away, or given to a rule without one; in
/// both dimensions, lists of /32s with /24s and a /16 among them, of both families.
/// Checked to fail: with every prefix the changed rules had taken out (whether another rule
/// still had it), and with the changed rules' indices left as they were before.
#[test]
fn address_stages_after_edits_equal_stages_from_nothing() {
    use super::stages::AddrStage;
    let mut rng = StdRng::seed_from_u64(2029);
    let dims: [fn(&Norm) -> Option<super::addr::Prefix>; 2] = [|n| n.src, |n| n.dst];
    for round in 0..40 {
        let mut rules: Vec<Rule> = (0..300u32)
            .map(|i| {
                let r = Rule::any(1 + (i % 8) as u16).with_proto(17);
                let r = if i % 50 == 7 {
                    r.with_dst(host10(100, (i >> 8) as u8, 0), words(mask(120)))
                } else if i % 60 == 11 {
                    r
                } else {
                    r.with_dst(host10(100, (i >> 8) as u8, i as u8), words(mask(128)))
                };
                let r = if i % 3 == 0 { r } else { r.with_family(false) };
                if round % 2 == 1 && i % 30 < 4 {
                    r.with_src(host10(1, 0, (i % 7) as u8), words(mask(128)))
                } else {
                    r
                }
            })
            .collect();
        let base = if round % 3 == 0 { 0 } else { 1000 };
        let norms = normalize_all(&rules).unwrap();
        let mut prev: Vec<AddrStage> = dims
            .iter()
            .map(|&d| AddrStage::build(&norms, d, base).unwrap())
            .collect();
        for _ in 0..15 {
            let before = normalize_all(&rules).unwrap();
            for _ in 0..rng.random_range(1..5) {
                let at = rng.random_range(0..rules.len());
                let (a, m) = if rng.random_bool(0.3) {
                    // Another rule's destination.
                    let o = rules[rng.random_range(0..rules.len())];
                    (o.dst, o.dst_mask)
                } else {
                    random_prefix(&mut rng, true)
                };
                rules[at] = if rng.random_bool(0.7) {
                    rules[at].with_dst(a, m)
                } else {
                    rules[at].with_src(a, m)
                };
            }
            let norms = normalize_all(&rules).unwrap();
            for (k, &d) in dims.iter().enumerate() {
                let changed: Vec<usize> = (0..rules.len())
                    .filter(|&i| d(&before[i]) != d(&norms[i]))
                    .collect();
                let after = AddrStage::after(&prev[k], &norms, d, base, &changed).unwrap();
                let full = AddrStage::build(&norms, d, base).unwrap();
                assert!(after.same_as(&full), "dimension {k}, changed {changed:?}");
                prev[k] = after;
            }
        }
    }
}

/// A tenant list (`tcp dst <address> dst_port 11211` for many addresses) has its rules also as
/// an array over the destination ECs, for the reader of the fast words (an array read instead
/// of a hash lookup), and answers the same read either way, and read as a program from before
/// the arrays reads it; with no room for the arrays it has none, and the fast words are not
/// used (`CT_SHAPE_ARRAYS`).
#[test]
fn one_address_rules_are_also_an_array_where_everything_fits_the_fast_words() {
    use paceline_common::ctab::{CT_SHAPE_ARRAYS, SHAPE_AT_DST, shape_at};
    let rules: Vec<Rule> = (0..1000u32)
        .map(|i| {
            let a = u32::from_be_bytes([10, 1, (i >> 8) as u8, i as u8]);
            Rule::any(1 + (i % 7) as u16)
                .with_proto(6)
                .with_dport(11211, 11211)
                .with_dst(v4_mapped(a.to_be()), words(mask(128)))
        })
        .collect();
    let with = build(&rules).unwrap();
    let without = build_with(
        &rules,
        &Limits {
            shape_arrays: 0,
            ..LIMITS
        },
    )
    .unwrap();
    assert_ne!(with.header.flags & CT_SHAPE_ARRAYS, 0);
    assert_eq!(without.header.flags & CT_SHAPE_ARRAYS, 0);
    assert_eq!(with.rules, without.rules, "the rule table holds them either way");
    // The one selector (tcp, port 11211) is selector 0.
    assert_ne!(
        with.words[(shape_at(with.header.sel_off, 0) + SHAPE_AT_DST) as usize],
        NONE
    );
    // A program from before the arrays (adopted during an upgrade until the new one replaces
    // it) ignores the flag, and reads the records and the rule table as they were.
    let mut before = with.clone();
    before.header.flags &= !CT_SHAPE_ARRAYS;
    let tb = MemTables::new(&before);
    let (tw, to) = (MemTables::new(&with), MemTables::new(&without));
    let mut rng = StdRng::seed_from_u64(11);
    for i in 0..3000u32 {
        let mut p = random_packet(&mut rng);
        p.proto = 6;
        p.is_v6 = 0;
        p.dport = [11211, 11212][(i % 2) as usize];
        p.dst = v4_mapped(u32::from_be_bytes([10, 1, (i >> 8) as u8 & 7, i as u8]).to_be());
        let want = first_match(&rules, &p);
        assert_eq!(tw.first_rule(&p), want, "{p:?}");
        assert_eq!(to.first_rule(&p), want, "{p:?}");
        assert_eq!(tb.first_rule(&p), want, "{p:?}");
    }
}

/// A tenant list's fast words name its array in the last phase's word (`LIST_DIRECT`): the tc
/// program reads the packet's rule there, five words fewer than through the selector's record
/// and the word that names the array, and the same rule. A selector with rules in both
/// dimensions keeps its record. (Checked with the reader's direct lists turned off: it took the
/// direct word for a selector and missed the rule, and this failed.)
#[test]
fn a_tenant_lists_fast_words_name_its_array_directly() {
    let tenant = |i: u32| {
        let a = u32::from_be_bytes([10, 1, (i >> 8) as u8, i as u8]);
        Rule::any(1 + (i % 7) as u16)
            .with_proto(6)
            .with_dport(11211, 11211)
            .with_dst(v4_mapped(a.to_be()), words(mask(128)))
    };
    let rules: Vec<Rule> = (0..1000u32).map(tenant).collect();
    let image = build(&rules).unwrap();
    assert!(!image.fast.is_empty(), "the tenant list is a direct list");
    let (map, fast) = (MemTables::new(&image), MemTables::fast(&image).unwrap());
    let mut rng = StdRng::seed_from_u64(12);
    let mut fewer = 0;
    for i in 0..2000u32 {
        let mut p = random_packet(&mut rng);
        p.proto = 6;
        p.is_v6 = 0;
        p.unknown = 0;
        p.dport = [11211, 11212][(i % 2) as usize];
        p.dst = v4_mapped(u32::from_be_bytes([10, 1, (i >> 8) as u8 & 7, i as u8]).to_be());
        let want = first_match(&rules, &p);
        map.reads.set(0);
        fast.reads.set(0);
        assert_eq!(map.first_rule(&p), want, "{p:?}");
        assert_eq!(fast.first_rule(&p), want, "{p:?}");
        if p.dport == 11211 {
            assert_eq!(fast.reads.get() + 5, map.reads.get(), "{p:?}");
            fewer += 1;
        }
    }
    assert_eq!(fewer, 1000);
    // The same selector with a source rule as well: its record stays in the way.
    let mut mixed = rules.clone();
    mixed.push(Rule::any(3).with_proto(6).with_dport(11211, 11211).with_src(
        v4_mapped(u32::from_be_bytes([192, 0, 2, 1]).to_be()),
        words(mask(128)),
    ));
    assert!(build(&mixed).unwrap().fast.is_empty());
}

/// A rule with only a source prefix gains a port: its selector takes the id the selector
/// without conditions had, with the same rules in the same shape. The one-address rules of that
/// selector were arrays, not rule-table entries, so the new one has nothing to take from the
/// image before. Checked (2026-12-06): without the memo's `any_sel`, the edited rule's entries
/// were missing from the incremental build (a random edit sequence found it).
#[test]
fn incremental_build_after_the_unconditioned_selector_gained_a_port() {
    let src = |a: [u8; 4], len: u8| (v4_mapped(u32::from_ne_bytes(a)), words(mask(96 + len)));
    let (s8, m8) = src([10, 0, 0, 0], 8);
    let (s16, m16) = src([10, 1, 0, 0], 16);
    let before = vec![
        Rule::any(1).with_proto(6).with_dport(80, 80).with_src(s8, m8),
        Rule::any(2).with_src(s16, m16),
    ];
    let prev = incremental_matches_full(&before, None, &LIMITS).unwrap();
    let mut after = before.clone();
    after[1] = after[1].with_dport(443, 443);
    let image = incremental_matches_full(&after, Some(&prev), &LIMITS).unwrap();
    let t = MemTables::new(&image);
    let mut p = random_packet(&mut StdRng::seed_from_u64(3));
    p.is_v6 = 0;
    p.src = v4_mapped(u32::from_ne_bytes([10, 1, 2, 3]));
    p.dport = 443;
    assert_eq!(t.first_rule(&p), first_match(&after, &p));
    assert_eq!(t.first_rule(&p), Some(1));
}
