//! # Layout
//!
//! What the fuzz targets check, on stable Rust: the cargo-fuzz targets (`fuzz/fuzz_targets/*`,
//! nightly) hand each input's bytes to one function here, and this crate's tests
//! (`tests/seeds.rs`) replay the checked-in seeds through the same functions in a plain
//! `cargo test`.
//!
//! - [`policy()`]: any bytes as a policy file: the pipeline never panics, answers within the
//!   input bounds, what validates compiles in every enforcement mode (deterministically), and
//!   the compiled table holds its invariants ([`table_invariants`]).
//! - [`packet`]: any bytes as a frame through the parser the tc program runs: never panics,
//!   offsets within the frame, every header it read whole, a frame cut anywhere inside the
//!   headers it used is refused, and rewriting DSCP/PCP (what the datapath does) never changes
//!   what it parses.
//! - [`classify`]: rules built from arbitrary parameters through the `Rule::with_*` builders
//!   ([`ClassifyInput`], read from the bytes by `arbitrary`): the reference matcher
//!   (`classify_linear`) and the compiled classifier the datapath looks packets up in agree with
//!   a plain first-match reading of the parameters.
//!
//! The compiled classifier is built and read only in [`compiled_first_rule`] and
//! [`table_invariants`], so a change of its type is a change there.
//!
//! Each target's seeds are [`SEED_DIRS`].

use arbitrary::{Arbitrary, Unstructured};
use paceline_common::{
    classify::Rule,
    classify::{PacketInfo, UNKNOWN_CGROUP, UNKNOWN_DSCP, UNKNOWN_MARK, classify_linear},
    maps::{MAX_CLASSES, MAX_LEVELS},
    parse::{ETH_P_IPV6, Layout, SliceFrame, Unparsed, parse},
};
use paceline_policy::{self as policy, CompileContext, Compiled, EnforcementMode, FakeHost};

/// Each target's seeds, as directories from the repository's root: its named seeds and
/// regression inputs in `fuzz/seeds/<target>/`, and for `policy` the shipped policies and the
/// invalid-policy fixtures, read where they are rather than copied. `cargo xtask fuzz` hands
/// the same directories to cargo-fuzz (`xtask/src/fuzz.rs`, `seed_dirs`); what a run finds
/// goes elsewhere (`target/fuzz-corpus/`, or `fuzz/corpus/`, ignored by git).
pub const SEED_DIRS: [(&str, &[&str]); 3] = [
    (
        "policy",
        &["fuzz/seeds/policy", "policies", "policy/tests/fixtures/invalid"],
    ),
    ("packet", &["fuzz/seeds/packet"]),
    ("classify", &["fuzz/seeds/classify"]),
];

// ---- policy ----

/// The host the policy target validates against: a 10 Gbit/s eth0 with the default route, an
/// eth1 of unknown speed, and one cgroup.
fn host() -> FakeHost {
    FakeHost::new()
        .with_interface("eth0", Some(1_250_000_000))
        .with_interface("eth1", None)
        .with_default_route("eth0")
        .with_cgroup("/system.slice/memcached.service", 7)
}

/// The policy target: the bytes as a policy file (UTF-8, else no input) on `host`.
pub fn policy(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let v = match policy::parse_str(text, "fuzz.yaml", &host()) {
        Ok(v) => v,
        Err(errors) => {
            assert!(!errors.is_empty(), "a refusal names at least one error");
            for e in &errors {
                assert!(!e.to_string().is_empty());
            }
            return;
        }
    };
    for mode in [
        EnforcementMode::Fq,
        EnforcementMode::Htb,
        EnforcementMode::SockopsOnly,
        EnforcementMode::None,
    ] {
        for all_routes_managed in [false, true] {
            let ctx = CompileContext {
                mode,
                previous: None,
                all_routes_managed,
            };
            // Compiling may refuse what cannot fit the tables (with an error), never panic.
            let Ok(c) = policy::compile(&v, &ctx) else {
                continue;
            };
            table_invariants(&c);
            let again = policy::compile(&v, &ctx).expect("compiles twice");
            assert_eq!(c.table, again.table, "compiling is deterministic");
            assert_eq!(c.rule_table, again.rule_table);
            // Recompiling against itself (a reload of the same file) keeps the rules.
            let slots = c.slots();
            let reload = policy::compile(
                &v,
                &CompileContext {
                    previous: Some(&slots),
                    ..ctx
                },
            )
            .expect("a reload of the same policy compiles");
            assert_eq!(c.rule_table, reload.rule_table);
            let _ = policy::render::check_report(&c);
            let _ = policy::render::json(&c);
        }
    }
}

/// What every compiled table must satisfy for the datapath to read it as the report says.
pub fn table_invariants(c: &Compiled) {
    let t = &c.table;
    let n_rules = c.rule_table.len();
    let n_classes = t.n_classes as usize;
    assert!(n_rules == c.rules.len(), "rule count");
    assert!(
        n_classes <= MAX_CLASSES && n_classes == c.class_names.len(),
        "class count"
    );
    assert!(
        c.levels.len() <= MAX_LEVELS && !c.levels.is_empty(),
        "level count"
    );
    let used = |i: usize| i < n_classes && c.class_names[i].is_some();
    assert!(used(t.default_class as usize), "the default class exists");
    assert_eq!(t.default_class, c.default_class as u32);
    assert_eq!(t.horizon_ns, c.horizon_ns);
    for (i, r) in c.rule_table.iter().enumerate() {
        let ctx = format!("rule {i}: {r:?}");
        assert!(used(r.class as usize), "{ctx}: its class exists");
        assert_eq!(r.class, c.rules[i].class_index, "{ctx}: as reported");
        assert!(
            r.sport_min as u32 + r.sport_span as u32 <= 65535,
            "{ctx}: sport range"
        );
        assert!(
            r.dport_min as u32 + r.dport_span as u32 <= 65535,
            "{ctx}: dport range"
        );
        assert!(
            matches!(r.proto_mask, 0 | 0xff) && matches!(r.dscp_mask, 0 | 0x3f),
            "{ctx}"
        );
        assert!(r.family_mask <= 1 && r.family <= 1 && r.dscp <= 0x3f, "{ctx}");
        assert!(matches!(r.cgroup_mask, 0 | u64::MAX), "{ctx}");
        assert_eq!(r.mark & !r.mark_mask, 0, "{ctx}: mark bits outside the mask");
        for (a, m) in [(r.src, r.src_mask), (r.dst, r.dst_mask)] {
            for w in 0..4 {
                assert_eq!(a[w] & !m[w], 0, "{ctx}: address bits outside the prefix");
            }
        }
        let deep_fields =
            r.src_mask != [0; 4] || r.dst_mask != [0; 4] || r.mark_mask != 0 || r.cgroup_mask != 0;
        assert!(!deep_fields || r.deep == 1, "{ctx}: deep conditions are checked");
        assert_eq!(r.needs & UNKNOWN_DSCP != 0, r.dscp_mask != 0, "{ctx}: needs dscp");
        assert_eq!(
            r.needs & UNKNOWN_CGROUP != 0,
            r.cgroup_mask != 0,
            "{ctx}: needs cgroup"
        );
        assert_eq!(r.needs & UNKNOWN_MARK != 0, r.mark_mask != 0, "{ctx}: needs mark");
    }
    for (i, name) in c.class_names.iter().enumerate() {
        if name.is_some() {
            assert!(
                (t.classes[i].level as usize) < c.levels.len(),
                "class {i}: its level exists"
            );
        }
    }
    for (i, l) in t.levels[..c.levels.len()].iter().enumerate() {
        assert!(l.dscp <= 63 && l.pcp <= 7, "level {i}: {l:?}");
    }
}

// ---- packet ----

/// The first byte says whether the frame is GSO; the rest is the frame.
pub fn packet(data: &[u8]) {
    let Some((&flags, frame)) = data.split_first() else {
        return;
    };
    let gso = flags & 1 != 0;
    let f = SliceFrame { data: frame, gso };
    let mut p = PacketInfo::default();
    let Ok(l) = parse(&f, &mut p) else {
        return;
    };
    let len = frame.len();
    let ctx = format!("{l:?} {p:?} {frame:02x?}");
    assert!(matches!(l.l3_off, 14 | 18 | 22), "{ctx}");
    assert_eq!(l.vlan_tci_off.is_some(), l.l3_off > 14, "{ctx}");
    let ethertype = u16::from_be_bytes([frame[l.l3_off - 2], frame[l.l3_off - 1]]);
    assert_eq!(p.is_v6 == 1, ethertype == ETH_P_IPV6, "{ctx}");
    assert_eq!(frame[l.l3_off] >> 4, if p.is_v6 == 1 { 6 } else { 4 }, "{ctx}");
    assert!(l.l3_off + if p.is_v6 == 1 { 40 } else { 20 } <= len, "{ctx}");
    // The transport header the datapath (GSO accounting) and the classifier used is whole.
    let l4_end = match l.l4_off {
        Some(l4) => {
            assert!(l4 <= len, "{ctx}");
            match p.proto {
                6 => {
                    let doff = (frame[l4 + 12] >> 4) as usize * 4;
                    assert!(doff >= 20 && l4 + doff <= len, "{ctx}");
                    Some(l4 + 20)
                }
                17 | 136 => {
                    assert!(l4 + 8 <= len, "{ctx}");
                    Some(l4 + 8)
                }
                132 => {
                    assert!(l4 + 12 <= len, "{ctx}");
                    Some(l4 + 12)
                }
                _ => None,
            }
        }
        None => {
            assert_eq!((p.sport, p.dport), (0, 0), "no transport header, no ports: {ctx}");
            None
        }
    };
    // Cut anywhere inside the headers it used: refused, never classified with what is left.
    if let Some(end) = l4_end
        && !gso
    {
        for cut in [end - 1, end - 2, l.l3_off + 1] {
            let mut q = PacketInfo::default();
            let r = parse(&SliceFrame::new(&frame[..cut]), &mut q);
            assert!(
                matches!(r, Err(Unparsed::Truncated)),
                "cut at {cut} of {end}: {r:?}; {ctx}"
            );
        }
    }
    // What the datapath rewrites does not change what the parser sees (but the DSCP).
    let mut w = frame.to_vec();
    rewrite(&mut w, &l, p.is_v6 == 1, flags >> 2, flags >> 5);
    let mut q = PacketInfo::default();
    let l2 = parse(&SliceFrame { data: &w, gso }, &mut q).expect("a rewritten frame parses");
    assert_eq!(l2, l, "{ctx}");
    assert_eq!(q.dscp, (flags >> 2) & 0x3f, "{ctx}");
    assert_eq!(PacketInfo { dscp: 0, ..q }, PacketInfo { dscp: 0, ..p }, "{ctx}");
}

/// The datapath's rewrites: DSCP (ECN kept, IPv4 checksum updated) and the outer tag's PCP.
fn rewrite(f: &mut [u8], l: &Layout, v6: bool, dscp: u8, pcp: u8) {
    let (dscp, pcp, l3) = (dscp & 0x3f, pcp & 7, l.l3_off);
    if v6 {
        let tc = (dscp << 2) | ((f[l3 + 1] >> 4) & 3);
        f[l3] = (f[l3] & 0xf0) | (tc >> 4);
        f[l3 + 1] = (f[l3 + 1] & 0x0f) | (tc << 4);
    } else {
        f[l3 + 1] = (dscp << 2) | (f[l3 + 1] & 3);
        f[l3 + 10] = 0;
        f[l3 + 11] = 0;
    }
    if let Some(o) = l.vlan_tci_off {
        f[o] = (f[o] & 0x1f) | (pcp << 5);
    }
}

// ---- classify ----

/// One rule's conditions, each there or not: what a policy rule can say, before the compiler's
/// normalisation (`build`).
#[derive(Clone, Debug, Arbitrary)]
pub struct RuleParams {
    pub class: u8,
    pub proto: Option<u8>,
    pub sport: Option<(u16, u16)>,
    pub dport: Option<(u16, u16)>,
    pub dscp: Option<u8>,
    pub family: Option<bool>,
    pub src: Option<([u8; 16], u8)>,
    pub dst: Option<([u8; 16], u8)>,
    pub mark: Option<(u32, u32)>,
    pub cgroup: Option<u64>,
}

/// What the classify target reads from its bytes: rules (the first 256 count), a default
/// class, and a packet with the fields the parser could not read (`unknown`).
#[derive(Clone, Debug, Arbitrary)]
pub struct ClassifyInput {
    pub rules: Vec<RuleParams>,
    pub default_class: u8,
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub dscp: u8,
    pub is_v6: bool,
    pub mark: u32,
    pub cgroup: u64,
    pub unknown: u8,
}

fn words(a: &[u8; 16]) -> [u32; 4] {
    std::array::from_fn(|i| u32::from_ne_bytes([a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3]]))
}

fn prefix_mask(prefix: u8) -> [u8; 16] {
    let bits = prefix.min(128) as usize;
    std::array::from_fn(|i| {
        let b = bits.saturating_sub(8 * i).min(8);
        if b == 0 { 0 } else { 0xffu8 << (8 - b) }
    })
}

fn masked(a: &[u8; 16], m: &[u8; 16]) -> [u8; 16] {
    std::array::from_fn(|i| a[i] & m[i])
}

/// The policy compiler's domain: an IPv4 network (the prefix byte's top bit) is IPv4-mapped
/// with a prefix of 96 + 0..=32 bits; an IPv6 one has 0..=128 bits.
fn net((a, p): &([u8; 16], u8)) -> ([u8; 16], u8, bool) {
    if p & 0x80 != 0 {
        (mapped(a), 96 + (p & 0x7f) % 33, false)
    } else {
        (*a, p % 129, true)
    }
}

/// `::ffff:a.b.c.d` from the last four bytes.
fn mapped(a: &[u8; 16]) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[10] = 0xff;
    m[11] = 0xff;
    m[12..].copy_from_slice(&a[12..]);
    m
}

/// The family a rule has: its addresses' (the compiler sets it from them), else its own.
fn family(r: &RuleParams) -> Option<bool> {
    r.src.as_ref().or(r.dst.as_ref()).map(|n| net(n).2).or(r.family)
}

fn sorted((a, b): (u16, u16)) -> (u16, u16) {
    (a.min(b), a.max(b))
}

/// The rule the policy compiler would build from these parameters.
fn build(r: &RuleParams) -> Rule {
    let mut rule = Rule::any(r.class as u16 % MAX_CLASSES as u16);
    if let Some(p) = r.proto {
        rule = rule.with_proto(p);
    }
    if let Some(s) = r.sport {
        let (lo, hi) = sorted(s);
        rule = rule.with_sport(lo, hi);
    }
    if let Some(s) = r.dport {
        let (lo, hi) = sorted(s);
        rule = rule.with_dport(lo, hi);
    }
    if let Some(d) = r.dscp {
        rule = rule.with_dscp(d);
    }
    if let Some(v6) = family(r) {
        rule = rule.with_family(v6);
    }
    if let Some(n) = &r.src {
        let (a, p, _) = net(n);
        let m = prefix_mask(p);
        rule = rule.with_src(words(&masked(&a, &m)), words(&m));
    }
    if let Some(n) = &r.dst {
        let (a, p, _) = net(n);
        let m = prefix_mask(p);
        rule = rule.with_dst(words(&masked(&a, &m)), words(&m));
    }
    if let Some((mark, mask)) = r.mark {
        rule = rule.with_mark(mark, mask);
    }
    if let Some(id) = r.cgroup {
        rule = rule.with_cgroup(id);
    }
    rule
}

/// A plain reading of the parameters: every condition present must hold.
fn naive_matches(r: &RuleParams, i: &ClassifyInput) -> bool {
    let dscp = i.dscp & 0x3f;
    let in_range = |port: u16, range: Option<(u16, u16)>| {
        range.is_none_or(|r| {
            let (lo, hi) = sorted(r);
            lo <= port && port <= hi
        })
    };
    let (src, dst) = addresses(i);
    let in_net = |addr: &[u8; 16], n: &Option<([u8; 16], u8)>| {
        n.as_ref().is_none_or(|n| {
            let (a, p, _) = net(n);
            let m = prefix_mask(p);
            masked(addr, &m) == masked(&a, &m)
        })
    };
    r.proto.is_none_or(|p| p == i.proto)
        && in_range(i.sport, r.sport)
        && in_range(i.dport, r.dport)
        && r.dscp
            .is_none_or(|d| i.unknown & UNKNOWN_DSCP == 0 && d & 0x3f == dscp)
        && family(r).is_none_or(|v6| v6 == i.is_v6)
        && in_net(&src, &r.src)
        && in_net(&dst, &r.dst)
        && r.mark.is_none_or(|(mark, mask)| {
            mask == 0 || (i.unknown & UNKNOWN_MARK == 0 && mark & mask == i.mark & mask)
        })
        && r.cgroup
            .is_none_or(|id| i.unknown & UNKNOWN_CGROUP == 0 && id == i.cgroup)
}

/// The packet's addresses as a parser gives them: IPv4 ones are mapped.
fn addresses(i: &ClassifyInput) -> ([u8; 16], [u8; 16]) {
    if i.is_v6 {
        (i.src, i.dst)
    } else {
        (mapped(&i.src), mapped(&i.dst))
    }
}

/// The first matching rule by the compiled classifier's lookup (what the datapath runs), or
/// `Err` when the rules do not compile (too large). One place to change with its type.
pub fn compiled_first_rule(rules: &[Rule], p: &PacketInfo) -> Result<Option<usize>, String> {
    let image = paceline_policy::ctab::build(rules).map_err(|e| e.to_string())?;
    let got = paceline_policy::ctab::MemTables::new(&image).first_rule(p);
    // The fast words, as the tc program reads them, give the same rule.
    if let Some(fast) = paceline_policy::ctab::MemTables::fast(&image) {
        assert_eq!(
            fast.first_rule(p),
            got,
            "the fast words and the words map disagree"
        );
    }
    Ok(got)
}

/// The classify target: the bytes as a [`ClassifyInput`] (as libFuzzer's typed targets read
/// them: all of the bytes, the last field taking the rest), then [`classify_input`]. Bytes too
/// few for an input are no input.
pub fn classify(data: &[u8]) {
    if let Ok(input) = ClassifyInput::arbitrary_take_rest(Unstructured::new(data)) {
        classify_input(&input);
    }
}

/// The reference matcher and the compiled classifier against `naive_matches` on one input.
pub fn classify_input(input: &ClassifyInput) {
    let params = &input.rules[..input.rules.len().min(256)];
    let rules: Vec<Rule> = params.iter().map(build).collect();
    let default = input.default_class as u32 % MAX_CLASSES as u32;
    let (src, dst) = addresses(input);
    let p = PacketInfo {
        src: words(&src),
        dst: words(&dst),
        cgroup_id: input.cgroup,
        mark: input.mark,
        sport: input.sport,
        dport: input.dport,
        proto: input.proto,
        dscp: input.dscp & 0x3f,
        is_v6: input.is_v6 as u8,
        unknown: input.unknown & (UNKNOWN_DSCP | UNKNOWN_CGROUP | UNKNOWN_MARK),
        _pad: [0; 4],
    };
    let want = params.iter().position(|r| naive_matches(r, input));
    let want_class = want.map_or(default, |i| rules[i].class as u32);
    assert_eq!(
        classify_linear(&rules, default, &p),
        want_class,
        "reference: {input:?}"
    );
    if let Ok(got) = compiled_first_rule(&rules, &p) {
        assert_eq!(got, want, "compiled: {input:?}");
    }
}
