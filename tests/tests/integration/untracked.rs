//! Which flows without a local socket stay out of the flow table under `spec.track_flows:
//! auto`, in the real program (BPF_PROG_TEST_RUN): the whole policy's
//! (`TABLE_UNTRACKED_FLOWS`, in `test_run`) or, under a policy whose other classes keep flow
//! clocks there, one class's (`TABLE_UNTRACKED_CLASSES`, here).

use paceline_common::maps::{ClassConfig, TABLE_UNTRACKED_CLASSES};
use paceline_tests::skb::SkBuff;

use crate::flow_cache::{cached_class, udp4};
use crate::privileged;
use crate::test_run::{load, port_rule, run, table};

/// Under a policy where class 1 keeps a flow clock and class 2 nothing, with
/// `TABLE_UNTRACKED_CLASSES` (as the compiler flags it under `spec.track_flows: auto`), a flow
/// of class 2 takes no admission slot and no entry: its first packet looks the table up and is
/// classified, and its class goes into the CPU's class memo; every packet counts in its class,
/// and a reload moves the next one. A flow of class 1 enters the table on its second packet.
/// With the flag clear, a flow of class 2 enters too, in the same run. Checked (2026-12-07):
/// with the egress program's test of the flag patched out, the class-2 flow took an admission
/// slot and an entry and this failed at its first assertion.
#[test]
fn flows_of_a_class_that_keeps_nothing_stay_out_of_a_table_that_other_classes_use() {
    if !privileged("flows_of_a_class_that_keeps_nothing_stay_out_of_a_table_that_other_classes_use") {
        return;
    }
    let mut dp = load();
    let mut t = table();
    // Class 1: a flow clock (1 GB/s: no packet here waits); class 2: none.
    t.classes[1] = ClassConfig {
        flow_rate: 1_000_000_000,
        ..ClassConfig::zeroed()
    };
    assert!(!t.class_keeps_nothing_per_flow(1) && t.class_keeps_nothing_per_flow(2));
    t.flags |= TABLE_UNTRACKED_CLASSES;
    let rules = |a: u16, b: u16| {
        [
            port_rule(5301, a).with_proto(17),
            port_rule(5302, b).with_proto(17),
        ]
    };
    let g1 = dp.write_rules(&t, &rules(1, 2)).unwrap();
    let memo_flow = udp4(4000, 5302, 0);
    for _ in 0..3 {
        run(&mut dp, &memo_flow, SkBuff::default());
    }
    let s = dp.snapshot().unwrap();
    let (entries, _) = dp.flows(1024).unwrap();
    assert_eq!(
        (s.global.flow_first_packets, s.global.flow_inserts, entries.len()),
        (0, 0, 0),
        "a flow of the class that keeps nothing takes no admission slot and no entry"
    );
    assert_eq!(s.classes[2].packets, 3, "every packet counted in its class");
    // The class with the flow clock: its flow enters the table on its second packet.
    let clocked = udp4(4000, 5301, 0);
    run(&mut dp, &clocked, SkBuff::default());
    run(&mut dp, &clocked, SkBuff::default());
    let s = dp.snapshot().unwrap();
    assert_eq!((s.global.flow_first_packets, s.global.flow_inserts), (1, 1));
    assert_eq!(cached_class(&dp, 5301, g1), Some(1));
    assert_eq!(cached_class(&dp, 5302, g1), None);
    // A reload that swaps the ports' classes: the memo's flow counts in class 1 at once (and,
    // now with a flow clock, takes an admission slot).
    dp.write_rules(&t, &rules(2, 1)).unwrap();
    run(&mut dp, &memo_flow, SkBuff::default());
    let s2 = dp.snapshot().unwrap();
    assert_eq!(
        (
            s2.classes[1].packets - s.classes[1].packets,
            s2.classes[2].packets - s.classes[2].packets
        ),
        (1, 0),
        "the packet after the reload counts in the new policy's class"
    );
    assert_eq!(s2.global.flow_first_packets, 2);
    // The flag clear: a flow of class 2 enters the table like any other.
    t.flags &= !TABLE_UNTRACKED_CLASSES;
    let g3 = dp.write_rules(&t, &rules(1, 2)).unwrap();
    let tracked = udp4(4001, 5302, 0);
    run(&mut dp, &tracked, SkBuff::default());
    run(&mut dp, &tracked, SkBuff::default());
    let s3 = dp.snapshot().unwrap();
    assert_eq!(
        s3.global.flow_inserts - s2.global.flow_inserts,
        1,
        "tracked: one entry"
    );
    assert_eq!(cached_class(&dp, 5302, g3), Some(2));
}
