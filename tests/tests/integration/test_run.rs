//! The tc datapath driven directly with BPF_PROG_TEST_RUN: build a packet, fill the maps, run
//! the real entry point, check the verdict, the context (`tstamp`, `priority`), the bytes
//! (rewrites with valid checksums) and the counters. Here: the shared datapath every such test
//! loads ([`load`]), verification, classification, rewrites, unparsed frames, levels' counters
//! and policy swaps; pacing is `pacing.rs`, the cache of flows without a socket `flow_cache.rs`
//! and `untracked.rs`.

use aya::{TestRun, TestRunOptions};
use paceline::kernel::datapath::{Datapath, LoadOptions};
use paceline_common::{
    classify::Rule,
    maps::{
        CLASS_SET_PRIORITY, ClassConfig, LEVEL_SET_DSCP, LEVEL_SET_PCP, LevelConfig, PolicyTable, level_slot,
        v4_mapped,
    },
};
use paceline_tests::{
    packet::{self, L4},
    skb::SkBuff,
};
use std::cell::Cell;
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::privileged;

pub(crate) const TC_ACT_UNSPEC: i32 = -1;
pub(crate) const TC_ACT_SHOT: i32 = 2;

pub(crate) struct Out {
    pub ret: i32,
    pub ctx: SkBuff,
    pub data: Vec<u8>,
}

/// The test process's datapath (`LoadOptions::default()`, every program verified), emptied
/// for the caller as a fresh load is (`Datapath::clear`), and held until the guard drops: a
/// load is seconds of verification under emulation (7.6 s for each of this module's tests on
/// Linux 6.1 when each loaded its own), so the tests that drive it with BPF_PROG_TEST_RUN share
/// one. Tests that need other load options load their own. A thread that asks again while it
/// holds it panics (it would wait for itself). Checked: with `clear` made to do nothing, 23 of
/// the 45 tests that share the datapath failed.
pub(crate) fn load() -> Shared {
    static SHARED: OnceLock<Mutex<Datapath>> = OnceLock::new();
    if HOLDS.get() {
        panic!("this thread holds the shared datapath already: drop it before loading again");
    }
    let m = SHARED.get_or_init(|| {
        let mut dp = Datapath::load(&LoadOptions::default()).expect("load the datapath");
        // Every program, so that `clear` reaches every map a test may have written.
        dp.load_all().expect("verify the datapath's programs");
        Mutex::new(dp)
    });
    // A test that failed while holding it poisons the lock; the next one clears it anyway.
    let mut dp = m.lock().unwrap_or_else(|e| e.into_inner());
    dp.clear().expect("empty the shared datapath");
    HOLDS.set(true);
    Shared(dp)
}

thread_local! {
    static HOLDS: Cell<bool> = const { Cell::new(false) };
}

/// The shared datapath, held (see [`load`]).
pub(crate) struct Shared(MutexGuard<'static, Datapath>);

impl Drop for Shared {
    fn drop(&mut self) {
        HOLDS.set(false);
    }
}

impl std::ops::Deref for Shared {
    type Target = Datapath;
    fn deref(&self) -> &Datapath {
        &self.0
    }
}

impl std::ops::DerefMut for Shared {
    fn deref_mut(&mut self) -> &mut Datapath {
        &mut self.0
    }
}

pub(crate) fn run(dp: &mut Datapath, frame: &[u8], ctx_in: SkBuff) -> Out {
    let prog = dp.tc_program().expect("tc program");
    let mut data = vec![0u8; frame.len() + 64];
    let mut ctx = SkBuff::default();
    let r = prog
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut data),
            ctx_in: Some(ctx_in.as_bytes()),
            ctx_out: Some(ctx.as_bytes_mut()),
            ..TestRunOptions::default()
        })
        .expect("BPF_PROG_TEST_RUN");
    data.truncate(r.data_size_out as usize);
    Out {
        ret: r.return_value as i32,
        ctx,
        data,
    }
}

pub(crate) fn tcp4(sport: u16, dport: u16, payload: usize) -> Vec<u8> {
    packet::ipv4(
        [10, 0, 0, 1],
        [10, 0, 0, 2],
        L4::Tcp { sport, dport },
        0,
        0,
        &[],
        None,
        payload,
    )
}

/// A table with classes 0..n, all at level 0 unless changed, no rules.
pub(crate) fn table() -> PolicyTable {
    let mut t = PolicyTable::empty();
    t.n_classes = 4;
    t
}

pub(crate) fn port_rule(dport: u16, class: u16) -> Rule {
    Rule::any(class).with_dport(dport, dport)
}

/// The verifier's limit is 1,000,000 processed instructions per program; the programs must
/// keep a wide margin (their cost depends on the kernel's verifier, and on code added later).
#[test]
fn programs_verify_well_inside_the_verifier_limit() {
    if !privileged("programs_verify_well_inside_the_verifier_limit") {
        return;
    }
    let mut dp = load();
    // Only the egress classifier loads with the datapath, the others on first use; load them
    // here so that their cost is checked too (DASR's option walk once went past the limit on
    // Linux 6.12).
    dp.load_all().expect("sock_ops and the D3 router verify");
    if let Some(why) = dp.dasr_unavailable() {
        panic!("DASR's ingress program did not load: {why}");
    }
    // Every tested kernel (6.1, 6.12, the host's) reports the count (bpf_prog_info's
    // verified_insns, Linux 5.16). Until 2026-12-02 a program without one was skipped, so a
    // kernel that reported nothing passed this test with nothing asserted; now it fails.
    let counts = dp.verified_insns();
    assert_eq!(counts.len(), 5, "the datapath's five programs");
    for (name, n) in counts {
        println!("{name}: {n:?} instructions verified");
        let n = n.unwrap_or_else(|| {
            panic!("{name}: the kernel reports no verified instruction count (needs Linux 5.16)")
        });
        assert!(
            n < 600_000,
            "{name}: the verifier processed {n} instructions of its 1,000,000"
        );
    }
}

#[test]
fn no_policy_passes_and_counts() {
    if !privileged("no_policy_passes_and_counts") {
        return;
    }
    let mut dp = load();
    // The agent always writes a policy before attaching; a datapath without one must be inert.
    let f = tcp4(1000, 80, 100);
    let o = run(&mut dp, &f, SkBuff::default());
    assert_eq!(o.ret, TC_ACT_UNSPEC);
    assert_eq!(o.data, f, "packet must pass untouched");
    assert_eq!(o.ctx.tstamp, 0);
    assert_eq!(o.ctx.priority, 0);
    // Without a policy the classifier's maps are not there: the packet counts as seen without
    // a policy, and in no class or level.
    let s = dp.snapshot().unwrap();
    assert_eq!(s.global.no_policy, 1);
    assert_eq!(s.classes.iter().map(|c| c.packets).sum::<u64>(), 0);
    assert_eq!(s.levels.iter().map(|c| c.packets).sum::<u64>(), 0);
    assert_eq!(
        (
            s.global.non_ip,
            s.global.truncated,
            s.global.ipv6_ext_limit,
            s.global.rewrite_errors
        ),
        (0, 0, 0, 0)
    );
}

#[test]
fn ipv4_tcp_classified_by_port_sets_priority_and_counts() {
    if !privileged("ipv4_tcp_classified_by_port_sets_priority_and_counts") {
        return;
    }
    let mut dp = load();
    let mut t = table();
    let rules = vec![port_rule(11211, 1)];
    t.classes[1] = ClassConfig {
        skb_priority: 6,
        flags: CLASS_SET_PRIORITY,
        level: 2,
        ..ClassConfig::zeroed()
    };
    t.classes[0] = ClassConfig {
        skb_priority: 1,
        flags: CLASS_SET_PRIORITY,
        ..ClassConfig::zeroed()
    };
    dp.write_rules(&t, &rules).unwrap();

    let hit = tcp4(40000, 11211, 64);
    let o = run(&mut dp, &hit, SkBuff::default());
    assert_eq!(o.ret, TC_ACT_UNSPEC);
    assert_eq!(o.ctx.priority, 6);
    assert_eq!(o.data, hit, "classification must not change bytes");
    let miss = tcp4(40000, 11212, 64);
    assert_eq!(run(&mut dp, &miss, SkBuff::default()).ctx.priority, 1);

    let s = dp.snapshot().unwrap();
    assert_eq!(s.classes[1].packets, 1);
    assert_eq!(s.classes[1].bytes, hit.len() as u64);
    assert_eq!(s.classes[0].packets, 1);
    assert_eq!(s.levels[2].packets, 1, "class 1 counts in its level 2");
    assert_eq!(s.levels[0].packets, 1);
}

#[test]
fn ipv6_udp_behind_hop_by_hop_is_classified() {
    if !privileged("ipv6_udp_behind_hop_by_hop_is_classified") {
        return;
    }
    let mut dp = load();
    let mut t = table();
    let rules = vec![port_rule(53, 2).with_proto(17).with_family(true)];
    t.classes[2] = ClassConfig {
        skb_priority: 4,
        flags: CLASS_SET_PRIORITY,
        ..ClassConfig::zeroed()
    };
    dp.write_rules(&t, &rules).unwrap();
    let src = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    let dst = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
    for hbh in [false, true] {
        let f = packet::ipv6(
            src,
            dst,
            L4::Udp {
                sport: 5353,
                dport: 53,
            },
            0,
            0,
            hbh,
            32,
        );
        assert_eq!(
            run(&mut dp, &f, SkBuff::default()).ctx.priority,
            4,
            "hop-by-hop: {hbh}"
        );
        let tcp = packet::ipv6(
            src,
            dst,
            L4::Tcp {
                sport: 5353,
                dport: 53,
            },
            0,
            0,
            hbh,
            32,
        );
        assert_eq!(
            run(&mut dp, &tcp, SkBuff::default()).ctx.priority,
            0,
            "TCP is not the UDP rule"
        );
    }
    // The same rule never matches IPv4.
    let v4 = packet::ipv4(
        [1, 1, 1, 1],
        [2, 2, 2, 2],
        L4::Udp { sport: 1, dport: 53 },
        0,
        0,
        &[],
        None,
        8,
    );
    assert_eq!(run(&mut dp, &v4, SkBuff::default()).ctx.priority, 0);
}

#[test]
fn ipv4_cidr_rule_matches_mapped_addresses() {
    if !privileged("ipv4_cidr_rule_matches_mapped_addresses") {
        return;
    }
    let mut dp = load();
    let mut t = table();
    // ::ffff:10.0.0.0/104 is 10.0.0.0/8.
    let mask = [u32::MAX, u32::MAX, u32::MAX, u32::from_ne_bytes([0xff, 0, 0, 0])];
    let rules = vec![Rule::any(3).with_dst(v4_mapped(u32::from_ne_bytes([10, 0, 0, 0])), mask)];
    t.classes[3] = ClassConfig {
        skb_priority: 3,
        flags: CLASS_SET_PRIORITY,
        ..ClassConfig::zeroed()
    };
    dp.write_rules(&t, &rules).unwrap();
    let inside = packet::ipv4(
        [192, 168, 0, 1],
        [10, 9, 8, 7],
        L4::Tcp { sport: 1, dport: 2 },
        0,
        0,
        &[],
        None,
        8,
    );
    let outside = packet::ipv4(
        [192, 168, 0, 1],
        [11, 9, 8, 7],
        L4::Tcp { sport: 1, dport: 2 },
        0,
        0,
        &[],
        None,
        8,
    );
    assert_eq!(run(&mut dp, &inside, SkBuff::default()).ctx.priority, 3);
    assert_eq!(run(&mut dp, &outside, SkBuff::default()).ctx.priority, 0);
}

pub(crate) fn tagging_table(dscp: Option<u8>, pcp: Option<u8>) -> PolicyTable {
    let mut t = table();
    let mut flags = 0;
    if dscp.is_some() {
        flags |= LEVEL_SET_DSCP;
    }
    if pcp.is_some() {
        flags |= LEVEL_SET_PCP;
    }
    t.levels[1] = LevelConfig {
        rate: 0,
        flags,
        dscp: dscp.unwrap_or(0),
        pcp: pcp.unwrap_or(0),
        _pad: [0; 2],
        ..LevelConfig::zeroed()
    };
    t.classes[0].level = 1;
    t
}

#[test]
fn dscp_rewrite_ipv4_with_options_keeps_ecn_and_checksum() {
    if !privileged("dscp_rewrite_ipv4_with_options_keeps_ecn_and_checksum") {
        return;
    }
    let mut dp = load();
    dp.write_rules(&tagging_table(Some(46), None), &[]).unwrap();
    // Router-alert option (4 bytes) so the transport header is not at offset 20.
    let opts = [0x94, 0x04, 0x00, 0x00];
    for ecn in 0..4 {
        let f = packet::ipv4(
            [10, 0, 0, 1],
            [10, 0, 0, 2],
            L4::Tcp { sport: 1, dport: 2 },
            10,
            ecn,
            &opts,
            None,
            40,
        );
        assert!(packet::inspect(&f).ip_csum_ok);
        let o = run(&mut dp, &f, SkBuff::default());
        let seen = packet::inspect(&o.data);
        assert_eq!(seen.dscp, 46);
        assert_eq!(seen.ecn, ecn, "ECN bits must survive the rewrite");
        assert!(
            seen.ip_csum_ok,
            "IPv4 header checksum must be valid after the rewrite"
        );
        // Only the TOS byte and the header checksum changed.
        let diff: Vec<usize> = (0..f.len()).filter(|&i| f[i] != o.data[i]).collect();
        assert!(
            diff.iter().all(|&i| i == 15 || i == 24 || i == 25),
            "changed bytes {diff:?}"
        );
    }
    assert_eq!(dp.snapshot().unwrap().classes[0].tagged_packets, 4);
}

#[test]
fn dscp_rewrite_ipv6_keeps_ecn_and_flow_label() {
    if !privileged("dscp_rewrite_ipv6_keeps_ecn_and_flow_label") {
        return;
    }
    let mut dp = load();
    dp.write_rules(&tagging_table(Some(34), None), &[]).unwrap();
    let src = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    let dst = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
    let mut f = packet::ipv6(src, dst, L4::Udp { sport: 9, dport: 9 }, 0, 1, false, 16);
    // A flow label of 0xabcde that must survive.
    f[15] |= 0x0a;
    f[16] = 0xbc;
    f[17] = 0xde;
    let o = run(&mut dp, &f, SkBuff::default());
    let seen = packet::inspect(&o.data);
    assert_eq!((seen.dscp, seen.ecn), (34, 1));
    assert_eq!(o.data[15] & 0x0f, 0x0a);
    assert_eq!(&o.data[16..18], &[0xbc, 0xde]);
    assert_eq!(
        &o.data[18..],
        &f[18..],
        "nothing after the first word changes (no IPv6 checksum)"
    );
}

#[test]
fn vlan_tagged_frame_gets_pcp_and_dscp() {
    if !privileged("vlan_tagged_frame_gets_pcp_and_dscp") {
        return;
    }
    let mut dp = load();
    let mut t = tagging_table(Some(26), Some(5));
    let rules = vec![port_rule(443, 1)];
    t.classes[1] = ClassConfig {
        level: 1,
        ..ClassConfig::zeroed()
    };
    t.classes[0].level = 0;
    dp.write_rules(&t, &rules).unwrap();
    let f = packet::ipv4(
        [10, 0, 0, 1],
        [10, 0, 0, 2],
        L4::Tcp {
            sport: 999,
            dport: 443,
        },
        0,
        2,
        &[],
        Some((100, 1)),
        60,
    );
    let o = run(&mut dp, &f, SkBuff::default());
    let seen = packet::inspect(&o.data);
    assert_eq!(seen.pcp, Some(5));
    assert_eq!((seen.dscp, seen.ecn), (26, 2));
    assert!(seen.ip_csum_ok);
    // VLAN id untouched.
    assert_eq!(u16::from_be_bytes([o.data[14], o.data[15]]) & 0x0fff, 100);
    // Not port 443: class 0 at level 0, no tagging.
    let g = packet::ipv4(
        [10, 0, 0, 1],
        [10, 0, 0, 2],
        L4::Tcp {
            sport: 999,
            dport: 80,
        },
        0,
        2,
        &[],
        Some((100, 1)),
        60,
    );
    assert_eq!(run(&mut dp, &g, SkBuff::default()).data, g);
}

#[test]
fn truncated_and_unknown_frames_pass_untouched_and_count() {
    if !privileged("truncated_and_unknown_frames_pass_untouched_and_count") {
        return;
    }
    let mut dp = load();
    let mut t = tagging_table(Some(46), None);
    t.classes[0].flow_rate = 1000;
    dp.write_rules(&t, &[]).unwrap();
    // (BPF_PROG_TEST_RUN itself refuses IPv4/IPv6 frames shorter than their fixed header, so
    // the truncated frames here are ones the kernel accepts and the parser must refuse.)
    let full = tcp4(1, 2, 0);
    let mut truncated: Vec<Vec<u8>> = Vec::new();
    // IPv4 header complete, TCP ports cut off.
    truncated.push(full[..14 + 20 + 2].to_vec());
    // IHL says 24 bytes of header: the ports would lie beyond the end.
    let mut ihl6 = full[..14 + 20 + 2].to_vec();
    ihl6[14] = 0x46;
    truncated.push(ihl6);
    // A VLAN tag whose inner IPv4 header is cut short.
    let tagged = packet::ipv4(
        [10, 0, 0, 1],
        [10, 0, 0, 2],
        L4::Tcp { sport: 1, dport: 2 },
        0,
        0,
        &[],
        Some((7, 0)),
        0,
    );
    truncated.push(tagged[..14 + 4 + 10].to_vec());
    // IPv6 whose hop-by-hop header claims more bytes than there are.
    let src = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    let mut v6 = packet::ipv6(src, src, L4::Udp { sport: 1, dport: 2 }, 0, 0, true, 0);
    v6[14 + 40 + 1] = 200; // hdr ext len: (200 + 1) * 8 bytes
    truncated.push(v6);
    for f in &truncated {
        let o = run(&mut dp, f, SkBuff::default());
        assert_eq!(
            (o.ret, &o.data, o.ctx.tstamp),
            (TC_ACT_UNSPEC, f, 0),
            "frame {f:02x?}"
        );
    }
    // ARP.
    let mut arp = vec![0xffu8; 6];
    arp.extend_from_slice(&packet::MAC_A);
    arp.extend_from_slice(&[0x08, 0x06]);
    arp.extend_from_slice(&[0u8; 28]);
    let o = run(&mut dp, &arp, SkBuff::default());
    assert_eq!((o.ret, o.data), (TC_ACT_UNSPEC, arp.clone()));

    let s = dp.snapshot().unwrap();
    assert_eq!(s.global.truncated, truncated.len() as u64);
    assert_eq!(s.global.non_ip, 1);
    assert_eq!(s.classes[0].packets, 0, "unparsed packets are not classified");
}

/// A level's counters are its classes' (the datapath counts classes only), and a reload that
/// moves a class to another level leaves the class's history in its old level: every level's
/// totals carry on, and the class counts in its new level from then on.
///
/// Checked (2026-12-06, host 6.18): with the ledger's bases left as they were when a class
/// moves level in its slot (`levels::write`), class 1's two packets moved with it at the
/// reload (level 1 fell from 3 to 1, level 2 rose to 2) and this failed.
#[test]
fn a_levels_counters_are_its_classes_and_carry_on_across_a_reload() {
    if !privileged("a_levels_counters_are_its_classes_and_carry_on_across_a_reload") {
        return;
    }
    let mut dp = load();
    let mut t = table();
    t.classes[1].level = 1;
    t.classes[2].level = 1;
    let rules = vec![port_rule(80, 1), port_rule(81, 2)];
    dp.write_rules(&t, &rules).unwrap();
    for dport in [80, 80, 81] {
        run(&mut dp, &tcp4(1000, dport, 100), SkBuff::default());
    }
    let s = dp.snapshot().unwrap();
    assert_eq!((s.levels[1].packets, s.levels[2].packets), (3, 0));
    assert_eq!(s.levels[1].bytes, s.classes[1].bytes + s.classes[2].bytes);
    // Class 1 moves to level 2.
    t.classes[1].level = 2;
    dp.write_rules(&t, &rules).unwrap();
    let s = dp.snapshot().unwrap();
    assert_eq!(
        (s.levels[1].packets, s.levels[2].packets),
        (3, 0),
        "the reload moved no count"
    );
    run(&mut dp, &tcp4(1000, 80, 100), SkBuff::default());
    run(&mut dp, &tcp4(1000, 81, 100), SkBuff::default());
    let s = dp.snapshot().unwrap();
    assert_eq!(
        (s.levels[1].packets, s.levels[2].packets, s.classes[1].packets),
        (4, 1, 3),
        "class 1 counts in level 2 from the reload on"
    );
}

/// The first policy written after an agent whose datapath counted levels per packet (its totals
/// in `PL_STATS`' level slots; a fresh start finds them zero) carries each level's totals on
/// into the ledger, then zeroes those slots: a ledger started again later (its type changed)
/// must not carry the same old totals on a second time. Checked (2026-12-06, host 6.18): with
/// the zeroing left out of `write_policy`, the level slot still held the planted totals and
/// this failed at "zeroed".
#[test]
fn the_first_ledger_carries_the_old_level_totals_on_and_zeroes_their_slots() {
    if !privileged("the_first_ledger_carries_the_old_level_totals_on_and_zeroes_their_slots") {
        return;
    }
    // `load` clears every map, the ledger too: as after an older agent.
    let mut dp = load();
    let mut stats = paceline_tests::tables::stats(&mut dp).unwrap();
    let n = aya::util::nr_cpus().unwrap();
    let mut old = vec![paceline_common::maps::Counters::default(); n];
    old[0].packets = 1000;
    old[0].bytes = 64_000;
    stats
        .set(level_slot(1), aya::maps::PerCpuValues::try_from(old).unwrap(), 0)
        .unwrap();
    let mut t = table();
    t.classes[1].level = 1;
    dp.write_rules(&t, &[port_rule(80, 1)]).unwrap();
    let s = dp.snapshot().unwrap();
    assert_eq!(
        (s.levels[1].packets, s.levels[1].bytes),
        (1000, 64_000),
        "carried on"
    );
    let slot: u64 = stats
        .get(&level_slot(1), 0)
        .unwrap()
        .iter()
        .map(|c| c.packets)
        .sum();
    assert_eq!(slot, 0, "zeroed");
    run(&mut dp, &tcp4(1000, 80, 100), SkBuff::default());
    dp.write_rules(&t, &[port_rule(80, 1)]).unwrap();
    assert_eq!(dp.snapshot().unwrap().levels[1].packets, 1001, "and counting on");
}

/// Policy swaps while every CPU runs the classifier: every probe packet is classified wholly
/// by the old policy or wholly by the new one. The two policies are built so that a mixed read
/// is visible: policy A sends the probe to class 1 (level 1) and gives class 2 level 3; policy
/// B sends it to class 2 (level 2) and gives class 1 level 3. A table of one policy with the
/// classifier of the other puts the probe at level 3, a classifier already released puts it
/// at the default class (level 0); only levels 1 and 2 are one policy's answer. The datapath
/// counts classes only, so the level shows in what it does to the packet: levels 1 and 2
/// pace it (at a rate that never delays), level 3 does not, and a probe of class 1 or 2 left
/// unpaced is a mix.
///
/// Two phases under the same readers:
/// - Swaps (`write_policy`: the standby bank's classifier patched where it differs, flip,
///   grace period) for 8 s, in turn to A, B and a third policy C that classifies the probe as
///   A does through another rule (so every swap patches the words and rule entries of the
///   policy the bank held two swaps before).
/// - Up to 200,000 flips of the live bank in 4 s between the last two policies, both banks
///   whole (each keeps its maps): the instant a program reads the bank moves many times a
///   packet time.
///
/// Checked on the host (6.18, one reader on the second CPU): with the program reading the
/// live bank a second time for the classifier's maps (`maps::ctab` given a fresh
/// `maps::active()` instead of the bank it read once), 34,781 of 32.8 million probes came out
/// at level 3 and this failed (and again on 2026-12-06, when levels began to show through
/// pacing: 685 of 52.6 million unpaced). Removing the grace period after the flip is not caught (it
/// passed, 126 swaps, no mix): the kernel itself waits a grace period after every update of a
/// map of maps and frees released maps only after one, and what is left, a program that read
/// the old bank looking its maps up after the release, is a window of about 100 ns against a
/// release microseconds later. The probe is UDP, so its class is cached in the flow table after
/// its first packet: with that cache ignoring the policy generation (2026-12-03), 10.6 million
/// of 20.8 million probes came out mixed and this failed.
#[test]
fn a_policy_swapped_thousands_of_times_under_traffic_classifies_every_packet_by_one_policy() {
    use aya::maps::{Array, Map, MapData, MapInfo};
    use paceline_common::maps::names;
    use std::os::fd::AsFd as _;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::{Duration, Instant};
    if !privileged("a_policy_swapped_thousands_of_times_under_traffic_classifies_every_packet_by_one_policy")
    {
        return;
    }
    let mut dp = load();
    // Which policy classified a packet shows in its class's counters: levels 1 and 2 have a
    // clock (a rate so high that it never delays) and level 3 has none, so a packet of class 1
    // or 2 goes unpaced only when its class came from one policy's classifier and its level
    // from the other's table.
    let policy = |probe_class: u16, level_of: [u32; 2]| {
        let mut t = table();
        t.classes[1].level = level_of[0];
        t.classes[2].level = level_of[1];
        for l in [1, 2] {
            t.levels[l].rate = 1 << 50;
        }
        (
            t,
            vec![Rule::any(probe_class).with_dport(9000, 9000).with_proto(17)],
        )
    };
    let a = policy(1, [1, 3]);
    let b = policy(2, [3, 2]);
    let c = {
        let (t, _) = policy(1, [1, 3]);
        (t, vec![Rule::any(1).with_dport(8999, 9000).with_proto(17)])
    };
    // In turn after A: B, C, A, ...
    let turn = |swaps: u32| [&b, &c, &a][swaps as usize % 3];
    dp.write_rules(&a.0, &a.1).unwrap();
    let prog = dp.tc_program().unwrap();
    // The program's own maps, by name (object names are cut to 15 bytes).
    let map_ids = prog
        .info()
        .unwrap()
        .map_ids()
        .unwrap()
        .expect("the kernel lists a program's maps");
    let find = |name: &str| {
        let name = &name[..name.len().min(15)];
        let id = map_ids
            .iter()
            .copied()
            .find(|&id| MapInfo::from_id(id).unwrap().name_as_str() == Some(name))
            .unwrap_or_else(|| panic!("the tc program uses no map {name}"));
        Map::from_map_data(MapData::from_id(id).unwrap()).unwrap()
    };
    let mut active: Array<MapData, u32> = find(names::ACTIVE).try_into().unwrap();
    let prog = prog.fd().unwrap().as_fd().try_clone_to_owned().unwrap();
    let probe = packet::ipv4(
        [10, 0, 0, 1],
        [10, 0, 0, 2],
        L4::Udp {
            sport: 40000,
            dport: 9000,
        },
        0,
        0,
        &[],
        None,
        64,
    );
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let stop = AtomicBool::new(false);
    let runs = AtomicU64::new(0);
    let (swaps, flips) = std::thread::scope(|s| {
        let _stop = paceline_tests::StopOnDrop(&stop);
        // A reader on every CPU but the first, which the writer keeps (on one CPU, one reader).
        for cpu in 1..cpus.max(2) {
            let (prog, probe, stop, runs) = (&prog, &probe, &stop, &runs);
            s.spawn(move || {
                let _pinned = paceline_tests::PinnedCpu::to(cpu % cpus);
                while !stop.load(Ordering::Relaxed) {
                    paceline_tests::skb::test_run_fd(prog.as_fd(), probe, 16).expect("BPF_PROG_TEST_RUN");
                    runs.fetch_add(16, Ordering::Relaxed);
                    // A CPU that forwards packets leaves softirq between bursts; a test-run
                    // loop never does, and each grace period would last until RCU forces one.
                    std::thread::yield_now();
                }
            });
        }
        let start = Instant::now();
        let mut swaps = 0u32;
        while start.elapsed() < Duration::from_secs(8) {
            let (t, rules) = turn(swaps);
            dp.write_rules(t, rules).unwrap();
            swaps += 1;
        }
        // Both banks are whole: each holds its policy's table and classifier.
        let start = Instant::now();
        let mut flips = 0u32;
        while flips < 200_000 && start.elapsed() < Duration::from_secs(4) {
            let live = active.get(&0, 0).unwrap() & 1;
            active.set(0, live ^ 1, 0).unwrap();
            flips += 1;
        }
        stop.store(true, Ordering::Relaxed);
        (swaps, flips)
    });
    let runs = runs.into_inner();
    let s = dp.snapshot().unwrap();
    let c = |i: usize| &s.classes[i];
    // Policy A's packets, B's, a mix of both, none (the default class).
    let paced = |i: usize| c(i).delay_hist.iter().sum::<u64>();
    let at = |l: usize| match l {
        1 => paced(1),
        2 => paced(2),
        3 => (c(1).packets - paced(1)) + (c(2).packets - paced(2)),
        _ => c(0).packets,
    };
    let msg = format!(
        "{swaps} swaps and {flips} flips, {runs} probe packets on {cpus} CPUs: policy A {}, policy \
         B {}, a mix of both {}, no classifier {}",
        at(1),
        at(2),
        at(3),
        at(0)
    );
    eprintln!("{msg}");
    assert!(swaps >= 10, "swaps under traffic: {msg}");
    assert!(flips >= 5_000, "thousands of flips: {msg}");
    assert_eq!((at(3), at(0)), (0, 0), "every packet saw one policy: {msg}");
    assert_eq!(at(1) + at(2), runs, "every packet counted: {msg}");
    assert!(at(1) > 0 && at(2) > 0, "packets ran under both policies: {msg}");
}
