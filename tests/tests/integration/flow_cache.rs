//! The per-flow cache of flows without a local socket, in the real program driven with
//! BPF_PROG_TEST_RUN: the flow table's entry (entered on a flow's second packet, its class
//! checked against the policy generation, mark and DSCP, an IPv6 entry against its addresses,
//! the key the agent computes) and the CPU's class memo. Which flows stay out of the table
//! altogether is `untracked.rs`.

use paceline::kernel::datapath::Datapath;
use paceline_common::{
    classify::Rule,
    edt::tx_time_ns,
    maps::{CLASS_SET_PRIORITY, ClassConfig, FlowKey, FlowState, FlowTableKey, PolicyTable, v4_mapped},
};
use paceline_tests::{
    packet::{self, L4},
    skb::SkBuff,
    tables::flow_table,
};

use crate::pacing::paced_table;
use crate::privileged;
use crate::test_run::{load, port_rule, run, table};

pub(crate) fn udp4(sport: u16, dport: u16, dscp: u8) -> Vec<u8> {
    packet::ipv4(
        [10, 0, 0, 1],
        [10, 0, 0, 2],
        L4::Udp { sport, dport },
        dscp,
        0,
        &[],
        None,
        1000,
    )
}

/// The class a flow-table entry holds for the policy of `generation`, if any.
pub(crate) fn cached_class(dp: &Datapath, dport: u16, generation: u64) -> Option<u32> {
    let (flows, _) = dp.flows(1024).expect("flow table");
    let (_, s) = flows.iter().find(|(k, _)| k.dport == dport)?;
    s.class_under(generation)
}

/// A flow without a local socket (UDP here; forwarded traffic and containers' traffic at the
/// host's device take the same path) enters the flow table on its second packet (its first
/// leaves its clock in the CPU's admission slot): its class goes into the table with the policy
/// generation, and the next policy reclassifies it on its next packet, with its flow clock
/// kept. Checked (2026-12-03): with the generation left out of the check
/// (`FlowState::class_for` comparing only the packet's fields), the packet after the reload
/// counted in the old policy's class and this failed.
#[test]
fn a_flow_without_a_socket_is_classified_once_and_again_after_a_reload() {
    if !privileged("a_flow_without_a_socket_is_classified_once_and_again_after_a_reload") {
        return;
    }
    let mut dp = load();
    // 1 kB/s per flow: the clock is still far ahead when the next packet comes.
    let rate = 1_000;
    let mut t = paced_table(rate, 0, 0, 0);
    t.classes[1] = t.classes[0];
    t.classes[2] = t.classes[0];
    let g1 = dp.write_rules(&t, &[port_rule(5300, 1).with_proto(17)]).unwrap();
    let f = udp4(4000, 5300, 0);
    let a = run(&mut dp, &f, SkBuff::default());
    assert_eq!(
        cached_class(&dp, 5300, g1),
        None,
        "the first packet waits in its slot"
    );
    run(&mut dp, &f, SkBuff::default());
    assert_eq!(
        cached_class(&dp, 5300, g1),
        Some(1),
        "the second packet entered the flow with its class"
    );
    let s = dp.snapshot().unwrap();
    assert_eq!(
        (
            s.classes[1].packets,
            s.global.flow_first_packets,
            s.global.flow_inserts
        ),
        (2, 1, 1),
        "one flow, one first packet, one entry"
    );
    // The same port now belongs to class 2.
    let g2 = dp.write_rules(&t, &[port_rule(5300, 2).with_proto(17)]).unwrap();
    let c = run(&mut dp, &f, SkBuff::default());
    let s = dp.snapshot().unwrap();
    assert_eq!(
        (s.classes[1].packets, s.classes[2].packets),
        (2, 1),
        "the packet after the reload counts in the new policy's class"
    );
    assert_eq!(cached_class(&dp, 5300, g2), Some(2));
    assert_eq!(s.global.flow_inserts, 1, "the entry was updated, not added again");
    assert_eq!(
        c.ctx.tstamp - a.ctx.tstamp,
        2 * tx_time_ns(f.len() as u64, rate),
        "the flow kept its clock through the reload"
    );
}

/// Under a policy whose classes keep nothing per flow (`TABLE_UNTRACKED_FLOWS`, as the
/// compiler flags one with `spec.track_flows: auto`), a flow without a local socket never
/// touches the flow table: no admission slot, no insert, no entry; its class still counts
/// every packet and follows a reload on its next packet (the CPU's class memo is checked
/// against the policy generation). The same flows under the same policy with the flag clear
/// enter the table on their second packet, in the same run. Checked (2026-12-06): with the
/// egress program's check of the flag patched out, the first flow took an admission slot and
/// an entry and this failed at its first assertion.
#[test]
fn a_policy_that_keeps_nothing_per_flow_leaves_its_flows_out_of_the_table() {
    if !privileged("a_policy_that_keeps_nothing_per_flow_leaves_its_flows_out_of_the_table") {
        return;
    }
    let mut dp = load();
    let mut t = table();
    t.classes[2] = t.classes[1];
    assert!(t.keeps_nothing_per_flow(), "no flow clock, no DASR");
    t.flags |= paceline_common::maps::TABLE_UNTRACKED_FLOWS;
    let g1 = dp.write_rules(&t, &[port_rule(5300, 1).with_proto(17)]).unwrap();
    let f = udp4(4000, 5300, 0);
    for _ in 0..3 {
        run(&mut dp, &f, SkBuff::default());
    }
    let s = dp.snapshot().unwrap();
    let (entries, _) = dp.flows(1024).unwrap();
    assert_eq!(
        (s.global.flow_first_packets, s.global.flow_inserts, entries.len()),
        (0, 0, 0),
        "an untracked flow takes no admission slot and no entry"
    );
    assert_eq!(s.classes[1].packets, 3, "every packet counted in its class");
    assert_eq!(cached_class(&dp, 5300, g1), None);
    // The same port now belongs to class 2: the next packet counts there.
    dp.write_rules(&t, &[port_rule(5300, 2).with_proto(17)]).unwrap();
    run(&mut dp, &f, SkBuff::default());
    let s = dp.snapshot().unwrap();
    assert_eq!(
        (s.classes[1].packets, s.classes[2].packets),
        (3, 1),
        "the packet after the reload counts in the new policy's class"
    );
    // Tracked: the same flow enters the table on its second packet.
    t.flags &= !paceline_common::maps::TABLE_UNTRACKED_FLOWS;
    let g3 = dp.write_rules(&t, &[port_rule(5300, 1).with_proto(17)]).unwrap();
    let g = udp4(4001, 5300, 0);
    run(&mut dp, &g, SkBuff::default());
    run(&mut dp, &g, SkBuff::default());
    let s = dp.snapshot().unwrap();
    assert_eq!(
        (s.global.flow_first_packets, s.global.flow_inserts),
        (1, 1),
        "a tracked flow: one first packet, one entry"
    );
    assert_eq!(cached_class(&dp, 5300, g3), Some(1));
}

/// Classes 0, 1 and 2 set the priority to 1, 2 and 3: a packet's priority says its class.
fn priority_table() -> PolicyTable {
    let mut t = table();
    for (c, prio) in [(0, 1), (1, 2), (2, 3)] {
        t.classes[c] = ClassConfig {
            skb_priority: prio,
            flags: CLASS_SET_PRIORITY,
            ..ClassConfig::zeroed()
        };
    }
    t
}

/// Sends `f` twice (its flow enters the flow table on its second packet) and returns the entry
/// of the flow to `dport`, as `paceline flows` reads it.
fn entered_flow(dp: &mut Datapath, f: &[u8], dport: u16) -> (FlowKey, FlowState) {
    flow_after(dp, f, 2, |k| k.dport == dport)
}

/// Plants `entry` under `key` in the flow table and sends `f` once: the packets it added to
/// classes 1 and 2, and the priority it left (`priority_table`: class c sets c + 1).
fn send_over_planted(dp: &mut Datapath, key: FlowTableKey, entry: FlowState, f: &[u8]) -> (u64, u64, u32) {
    flow_table(dp).unwrap().insert(key, entry, 0).unwrap();
    let before = dp.snapshot().unwrap();
    let o = run(dp, f, SkBuff::default());
    let after = dp.snapshot().unwrap();
    (
        after.classes[1].packets - before.classes[1].packets,
        after.classes[2].packets - before.classes[2].packets,
        o.ctx.priority,
    )
}

/// An IPv6 flow's table key holds a hash of its 5-tuple, not its addresses
/// (`FlowTableKey`); its entry holds them, and the datapath compares them on every hit. An
/// entry planted at a flow's key with another flow's addresses and another class (as if the
/// two hashes met) gives the packet nothing: it is classified by the policy, and its flow
/// takes the entry over. Checked (2026-12-05): with the comparison taken out of the datapath,
/// the packet counted in the planted entry's class and this failed.
#[test]
fn an_ipv6_flow_never_takes_the_entry_of_another_whose_key_it_shares() {
    if !privileged("an_ipv6_flow_never_takes_the_entry_of_another_whose_key_it_shares") {
        return;
    }
    let mut dp = load();
    let t = priority_table();
    let g = dp.write_rules(&t, &[port_rule(5300, 1).with_proto(17)]).unwrap();
    let src = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    let dst = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
    let f = packet::ipv6(
        src,
        dst,
        L4::Udp {
            sport: 4000,
            dport: 5300,
        },
        0,
        0,
        false,
        16,
    );
    let (key, entry) = entered_flow(&mut dp, &f, 5300);
    assert_eq!(entry.class_under(g), Some(1));
    // Another flow's addresses, cached in class 2, at this flow's key.
    let other = |last: u8| {
        let mut a = [0u8; 16];
        a[0] = 0xfd;
        a[15] = last;
        let w = |i: usize| u32::from_ne_bytes([a[i], a[i + 1], a[i + 2], a[i + 3]]);
        [w(0), w(4), w(8), w(12)]
    };
    let planted = FlowState {
        class_gen: FlowState::class_gen(g, 2),
        src: other(7),
        dst: other(8),
        ..entry
    };
    assert_eq!(
        send_over_planted(&mut dp, FlowTableKey::of(&key, true), planted, &f),
        (1, 0, 2),
        "the packet is classified by the policy, not given the planted entry's class"
    );
    let (flows, _) = dp.flows(1024).unwrap();
    let (k, e) = flows
        .iter()
        .find(|(k, _)| k.dport == 5300)
        .expect("the flow's entry");
    assert_eq!(
        (*k, e.class_under(g)),
        (key, Some(1)),
        "the flow took its entry back, its own addresses and class"
    );
}

/// The datapath builds an IPv4 flow's table key from the parsed packet's fields, the agent
/// from a `FlowKey` (`FlowTableKey::of`): the two must name the same entry, or `paceline
/// flows` and a planted entry miss the flow. An entry planted under the agent's key, with
/// another class, must decide the flow's next packet. Checked (2026-12-05): with the datapath's
/// key taking the addresses the other way round, the packet kept its own class and this failed.
#[test]
fn an_ipv4_flow_finds_its_entry_under_the_key_the_agent_computes() {
    if !privileged("an_ipv4_flow_finds_its_entry_under_the_key_the_agent_computes") {
        return;
    }
    let mut dp = load();
    let t = priority_table();
    let g = dp.write_rules(&t, &[port_rule(5301, 1).with_proto(17)]).unwrap();
    let f = udp4(4001, 5301, 0);
    let (key, entry) = entered_flow(&mut dp, &f, 5301);
    assert_eq!(
        (key.src, key.dst, key.sport, key.proto),
        (
            v4_mapped(u32::from_ne_bytes([10, 0, 0, 1])),
            v4_mapped(u32::from_ne_bytes([10, 0, 0, 2])),
            4001,
            17
        ),
        "the entry gives its flow back"
    );
    assert_eq!(entry.class_under(g), Some(1));
    let planted = FlowState {
        class_gen: FlowState::class_gen(g, 2),
        ..entry
    };
    assert_eq!(
        send_over_planted(&mut dp, FlowTableKey::of(&key, false), planted, &f),
        (0, 1, 3),
        "the packet took the class of the entry planted under the agent's key"
    );
}

/// A flow without a local socket whose class keeps nothing per flow (no flow clock) enters the
/// flow table on its second packet as every flow does, and from its third takes its class from
/// the CPU's class memo, without the table: an entry planted behind the datapath's back with
/// another class changes nothing, until a flow whose ports fold to the same way takes the
/// memo's place (the table decides again) or a reload (the packet is classified again). An
/// IPv6 flow is held the same way, in ways of its own.
///
/// Checked (2026-12-06, host 6.18): with the memo's lookup patched out of the egress program
/// (`Memo::class` never answering), the packet over the planted entry took its class and this
/// failed at "served by the memo"; with the memo's generation check patched out
/// (`ClassMemo::class_for` ignoring the generation), the packet after the reload kept the
/// memo's class and it failed at "after a reload"; with IPv6 packets never held, it failed at
/// "an IPv6 flow, served by the memo".
#[test]
fn a_flow_without_a_socket_takes_its_class_from_the_memo_until_another_in_its_way_or_a_reload() {
    if !privileged(
        "a_flow_without_a_socket_takes_its_class_from_the_memo_until_another_in_its_way_or_a_reload",
    ) {
        return;
    }
    use paceline_common::{classify::PacketInfo, maps::ClassMemos};
    // The memo is per CPU: every run on one.
    let _pinned = paceline_tests::PinnedCpu::first();
    let mut dp = load();
    let t = priority_table();
    let rules = [port_rule(5302, 1).with_proto(17)];
    let g = dp.write_rules(&t, &rules).unwrap();
    let f = udp4(4002, 5302, 0);
    let (key, entry) = entered_flow(&mut dp, &f, 5302);
    assert_eq!(entry.class_under(g), Some(1));
    assert_eq!(
        run(&mut dp, &f, SkBuff::default()).ctx.priority,
        2,
        "the third packet, from the table"
    );
    let planted = FlowState {
        class_gen: FlowState::class_gen(g, 2),
        ..entry
    };
    let tkey = FlowTableKey::of(&key, false);
    assert_eq!(
        send_over_planted(&mut dp, tkey, planted, &f),
        (1, 0, 2),
        "served by the memo: the planted entry is not read"
    );
    // Another flow whose ports fold to the same way, to its third packet.
    let way = |sport: u16| {
        ClassMemos::way(&PacketInfo {
            sport,
            dport: 5302,
            ..PacketInfo::default()
        })
    };
    let sport = (4100..8000)
        .find(|s| way(*s) == way(4002))
        .expect("ports in the same way");
    let other = udp4(sport, 5302, 0);
    for _ in 0..3 {
        run(&mut dp, &other, SkBuff::default());
    }
    assert_eq!(
        send_over_planted(&mut dp, tkey, planted, &f),
        (0, 1, 3),
        "its way taken: the table's entry decides"
    );
    // The memo now holds the planted class 2 for the flow; a reload (the same rules) classifies
    // it again.
    dp.write_rules(&t, &rules).unwrap();
    assert_eq!(
        run(&mut dp, &f, SkBuff::default()).ctx.priority,
        2,
        "after a reload"
    );
    // An IPv6 flow: the same from its third packet.
    let v6 = packet::ipv6(
        [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
        L4::Udp {
            sport: 4003,
            dport: 5302,
        },
        0,
        0,
        false,
        16,
    );
    let g = dp.write_rules(&t, &rules).unwrap();
    let (key, entry) = flow_after(&mut dp, &v6, 3, |k| k.sport == 4003);
    let planted = FlowState {
        class_gen: FlowState::class_gen(g, 2),
        ..entry
    };
    assert_eq!(
        send_over_planted(&mut dp, FlowTableKey::of(&key, true), planted, &v6),
        (1, 0, 2),
        "an IPv6 flow, served by the memo"
    );
}

/// Sends `f` `n` times and returns the table's entry of the flow `which` picks.
fn flow_after(
    dp: &mut Datapath,
    f: &[u8],
    n: usize,
    which: impl Fn(&FlowKey) -> bool,
) -> (FlowKey, FlowState) {
    for _ in 0..n {
        run(dp, f, SkBuff::default());
    }
    let (flows, _) = dp.flows(1024).unwrap();
    *flows.iter().find(|(k, _)| which(k)).expect("the flow's entry")
}

/// The 5-tuple does not fix a packet's mark or DSCP: a cached class holds only for the fields
/// it was computed for, so one 5-tuple whose packets alternate between two marks and two DSCPs
/// gets each packet's own class. Checked (2026-12-03): with the mark and DSCP left out of the
/// check, the second packet took the first one's class and this failed.
#[test]
fn a_cached_class_holds_only_for_the_mark_and_dscp_it_was_computed_for() {
    if !privileged("a_cached_class_holds_only_for_the_mark_and_dscp_it_was_computed_for") {
        return;
    }
    let mut dp = load();
    let t = priority_table();
    let rules = [Rule::any(1).with_mark(0x10, 0xff), Rule::any(2).with_dscp(46)];
    dp.write_rules(&t, &rules).unwrap();
    let plain = udp4(4000, 5300, 0);
    let ef = udp4(4000, 5300, 46);
    let marked = SkBuff {
        mark: 0x10,
        ..SkBuff::default()
    };
    for round in 0..3 {
        assert_eq!(
            run(&mut dp, &plain, SkBuff::default()).ctx.priority,
            1,
            "round {round}: default"
        );
        assert_eq!(
            run(&mut dp, &plain, marked).ctx.priority,
            2,
            "round {round}: marked"
        );
        assert_eq!(
            run(&mut dp, &ef, SkBuff::default()).ctx.priority,
            3,
            "round {round}: EF"
        );
    }
}
