//! EDT pacing in the real program, driven with BPF_PROG_TEST_RUN: a flow's departures exactly
//! len/rate apart (a GSO packet charged every segment's headers), a class clock across flows,
//! composed clocks taking the latest, the stack's timestamp honoured (and a realtime one
//! ignored) and used as the time base, horizon drops that advance no clock, flow clocks kept
//! across a policy swap, and the benchmark's hook that makes a packet read the clock.

use paceline::kernel::datapath::{Datapath, LoadOptions};
use paceline_common::{
    edt::tx_time_ns,
    maps::{CLASS_SET_PRIORITY, ClassConfig, PolicyTable, level_slot},
};
use paceline_tests::skb::{SkBuff, mono_now_ns};

use crate::privileged;
use crate::test_run::{TC_ACT_SHOT, TC_ACT_UNSPEC, load, run, table, tcp4};

pub(crate) fn paced_table(flow_rate: u64, class_rate: u64, level_rate: u64, horizon_ns: u64) -> PolicyTable {
    let mut t = table();
    t.classes[0] = ClassConfig {
        flow_rate,
        class_rate,
        level: 1,
        ..ClassConfig::zeroed()
    };
    t.levels[1].rate = level_rate;
    t.horizon_ns = horizon_ns;
    t
}

/// A flow's packets leave exactly len/rate apart; its second continues from the clock its
/// first left in its admission slot (the flow enters the table on its second packet). Checked (2026-12-05): with that clock not read, the second packet left
/// at once and this failed.
#[test]
fn flow_departures_are_spaced_len_over_rate_exactly() {
    if !privileged("flow_departures_are_spaced_len_over_rate_exactly") {
        return;
    }
    let mut dp = load();
    // 10 kB/s: a 1054-byte frame takes 105 ms, far longer than the gap between two test runs
    // even in an emulated VM, so the clock stays backlogged.
    let rate = 10_000;
    dp.write_rules(&paced_table(rate, 0, 0, 0), &[]).unwrap();
    let f = tcp4(5000, 6000, 1000);
    let len = f.len() as u64;
    let before = mono_now_ns();
    let a = run(&mut dp, &f, SkBuff::default());
    let after = mono_now_ns();
    let b = run(&mut dp, &f, SkBuff::default());
    let c = run(&mut dp, &f, SkBuff::default());
    assert!(
        a.ctx.tstamp >= before && a.ctx.tstamp <= after,
        "an idle flow leaves now"
    );
    assert_eq!(b.ctx.tstamp - a.ctx.tstamp, tx_time_ns(len, rate));
    assert_eq!(c.ctx.tstamp - b.ctx.tstamp, len * 1_000_000_000 / rate);
    // A different flow has its own clock.
    let other = tcp4(5001, 6000, 1000);
    let d = run(&mut dp, &other, SkBuff::default());
    assert!(
        d.ctx.tstamp < b.ctx.tstamp,
        "another flow is not held by this flow's clock"
    );
    let s = dp.snapshot().unwrap();
    assert_eq!(s.classes[0].delayed_packets, 2);
    assert!(
        s.classes[0].delay_ns >= tx_time_ns(len, rate),
        "added delay is accounted"
    );
}

#[test]
fn gso_packet_is_charged_every_segments_headers() {
    if !privileged("gso_packet_is_charged_every_segments_headers") {
        return;
    }
    let mut dp = load();
    let rate = 10_000;
    dp.write_rules(&paced_table(rate, 0, 0, 0), &[]).unwrap();
    // A TSO packet of two 1448-byte segments (BPF_PROG_TEST_RUN takes at most about 3.5 KB
    // of data): one set of headers in the skb, two on the wire.
    let payload = 2 * 1448;
    let f = tcp4(5000, 6000, payload);
    let hdr = (f.len() - payload) as u64;
    let gso = SkBuff {
        gso_segs: 2,
        gso_size: 1448,
        ..SkBuff::default()
    };
    let a = run(&mut dp, &f, gso);
    let b = run(&mut dp, &f, gso);
    assert_eq!(
        b.ctx.tstamp - a.ctx.tstamp,
        tx_time_ns(f.len() as u64 + hdr, rate),
        "spaced by the two frames' bytes, not skb->len"
    );
    let s = dp.snapshot().unwrap();
    assert_eq!(
        s.classes[0].bytes,
        2 * (f.len() as u64 + hdr),
        "bytes counted as on the wire"
    );
}

#[test]
fn class_clock_spaces_packets_of_different_flows() {
    if !privileged("class_clock_spaces_packets_of_different_flows") {
        return;
    }
    let mut dp = load();
    let class_rate = 10_000;
    dp.write_rules(&paced_table(0, class_rate, 0, 0), &[]).unwrap();
    let mut last = 0;
    for i in 0..5u16 {
        let f = tcp4(7000 + i, 80, 500);
        let o = run(&mut dp, &f, SkBuff::default());
        if i > 0 {
            assert_eq!(
                o.ctx.tstamp - last,
                tx_time_ns(f.len() as u64, class_rate),
                "packet {i}"
            );
        }
        last = o.ctx.tstamp;
    }
    assert_eq!(
        dp.agg_clock(0).unwrap(),
        last + tx_time_ns(tcp4(0, 0, 500).len() as u64, class_rate)
    );
}

#[test]
fn composed_clocks_take_the_latest() {
    if !privileged("composed_clocks_take_the_latest") {
        return;
    }
    let mut dp = load();
    // Flow 100 kB/s, class 50 kB/s, level 10 kB/s: the level binds (a packet: 105 ms).
    dp.write_rules(&paced_table(100_000, 50_000, 10_000, 0), &[])
        .unwrap();
    let f = tcp4(1, 2, 1000);
    let len = f.len() as u64;
    let a = run(&mut dp, &f, SkBuff::default());
    let b = run(&mut dp, &f, SkBuff::default());
    assert_eq!(b.ctx.tstamp - a.ctx.tstamp, tx_time_ns(len, 10_000));
    // The flow clock restarts from the real departure; the class clock advanced by its own
    // reservations only (two slots from the first departure).
    assert_eq!(
        dp.agg_clock(level_slot(1)).unwrap(),
        b.ctx.tstamp + tx_time_ns(len, 10_000)
    );
    assert_eq!(
        dp.agg_clock(0).unwrap(),
        a.ctx.tstamp + 2 * tx_time_ns(len, 50_000)
    );

    // Now the flow binds: flow 10 kB/s, aggregates faster.
    drop(dp);
    let mut dp = load();
    dp.write_rules(&paced_table(10_000, 50_000, 100_000, 0), &[])
        .unwrap();
    let a = run(&mut dp, &f, SkBuff::default());
    let b = run(&mut dp, &f, SkBuff::default());
    assert_eq!(b.ctx.tstamp - a.ctx.tstamp, tx_time_ns(len, 10_000));
}

#[test]
fn departure_never_earlier_than_stack_timestamp() {
    if !privileged("departure_never_earlier_than_stack_timestamp") {
        return;
    }
    let mut dp = load();
    dp.write_rules(&paced_table(1_000_000_000, 0, 0, 0), &[]).unwrap();
    let f = tcp4(1, 2, 100);
    let stack = mono_now_ns() + 50_000_000; // TCP asked for 50 ms from now
    let o = run(
        &mut dp,
        &f,
        SkBuff {
            tstamp: stack,
            ..SkBuff::default()
        },
    );
    assert_eq!(o.ctx.tstamp, stack);
    assert_eq!(
        dp.snapshot().unwrap().classes[0].delayed_packets,
        0,
        "the stack's own delay is not ours"
    );
}

#[test]
fn realtime_stack_timestamp_is_ignored_not_honoured() {
    if !privileged("realtime_stack_timestamp_is_ignored_not_honoured") {
        return;
    }
    let mut dp = load();
    dp.write_rules(&paced_table(1_000_000_000, 0, 0, 100_000_000), &[])
        .unwrap();
    let f = tcp4(1, 2, 100);
    // SO_TXTIME with CLOCK_REALTIME: ~1.7e18 ns, decades ahead of CLOCK_MONOTONIC.
    let realtime = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let before = mono_now_ns();
    let o = run(
        &mut dp,
        &f,
        SkBuff {
            tstamp: realtime,
            ..SkBuff::default()
        },
    );
    let after = mono_now_ns();
    assert_eq!(o.ret, TC_ACT_UNSPEC, "not dropped as 'beyond the horizon'");
    assert!(
        o.ctx.tstamp >= before && o.ctx.tstamp <= after,
        "departs now on the monotonic clock"
    );
    assert_eq!(dp.snapshot().unwrap().global.foreign_tstamp, 1);
}

#[test]
fn stack_timestamp_serves_as_time_base() {
    if !privileged("stack_timestamp_serves_as_time_base") {
        return;
    }
    let mut dp = load();
    // Horizon 1 ms; TCP stamped the segment 2 ms ahead (its own pacing). Measured from the
    // stack's departure, paceline adds nothing, so the packet is sent, not dropped.
    dp.write_rules(&paced_table(1_000_000_000, 0, 0, 1_000_000), &[])
        .unwrap();
    let f = tcp4(1, 2, 100);
    let ts = mono_now_ns() + 2_000_000;
    let o = run(
        &mut dp,
        &f,
        SkBuff {
            tstamp: ts,
            ..SkBuff::default()
        },
    );
    assert_eq!((o.ret, o.ctx.tstamp), (TC_ACT_UNSPEC, ts));
    let s = dp.snapshot().unwrap();
    assert_eq!((s.global.foreign_tstamp, s.classes[0].delayed_packets), (0, 0));
}

#[test]
fn beyond_horizon_drops_and_advances_no_clock() {
    if !privileged("beyond_horizon_drops_and_advances_no_clock") {
        return;
    }
    let mut dp = load();
    // 1000-byte packets at 10 kB/s take 100 ms each; horizon 250 ms: the 4th packet is dropped
    // (packet times dwarf the gaps between test runs, even in an emulated VM).
    dp.write_rules(&paced_table(0, 10_000, 0, 250_000_000), &[])
        .unwrap();
    let f = tcp4(1, 2, 946); // 1000 bytes on the wire
    assert_eq!(f.len(), 1000);
    let mut rets = Vec::new();
    let mut clock_before_drop = 0;
    for _ in 0..4 {
        clock_before_drop = dp.agg_clock(0).unwrap();
        rets.push(run(&mut dp, &f, SkBuff::default()).ret);
    }
    assert_eq!(rets, [TC_ACT_UNSPEC, TC_ACT_UNSPEC, TC_ACT_UNSPEC, TC_ACT_SHOT]);
    assert_eq!(
        dp.agg_clock(0).unwrap(),
        clock_before_drop,
        "a dropped packet advances no clock"
    );
    let s = dp.snapshot().unwrap();
    assert_eq!(s.classes[0].drops_horizon, 1);
    assert_eq!(s.classes[0].packets, 4);
}

#[test]
fn policy_swap_keeps_flow_clocks() {
    if !privileged("policy_swap_keeps_flow_clocks") {
        return;
    }
    let mut dp = load();
    // 1 kB/s: the frame's slot is a second long, far longer than a policy write (which waits
    // for the programs that may read the old policy) even on a loaded machine, so the flow
    // clock is still backlogged when the second packet comes.
    let rate = 1_000;
    let mut t = paced_table(rate, 0, 0, 0);
    dp.write_rules(&t, &[]).unwrap();
    let f = tcp4(1, 2, 1000);
    let a = run(&mut dp, &f, SkBuff::default());
    // New policy: same class keeps pacing, priority now set.
    t.classes[0].flags = CLASS_SET_PRIORITY;
    t.classes[0].skb_priority = 7;
    let g = dp.write_rules(&t, &[]).unwrap();
    assert_eq!(dp.live_policy().unwrap().generation, g);
    let b = run(&mut dp, &f, SkBuff::default());
    assert_eq!(b.ctx.priority, 7, "the new policy is live");
    assert_eq!(
        b.ctx.tstamp - a.ctx.tstamp,
        tx_time_ns(f.len() as u64, rate),
        "the flow kept its clock"
    );
}

/// The benchmark's unstamped mark (`LoadOptions::bench_unstamped_mark`): BPF_PROG_TEST_RUN's
/// skb keeps the departure its previous run wrote, so the benchmark marks the rows of packets
/// that carry no stamp in real traffic (UDP, forwarded), and the datapath must take their
/// packets as unstamped: read the clock, depart now. A packet of another mark keeps honouring
/// its stamp, and the agent's load (mark 0) honours the stamp whatever the mark. Checked: with
/// the hook's branch patched out of the datapath (the stamp always read), the marked packet
/// departed at the stamp and this test failed.
#[test]
fn the_benchmarks_unstamped_mark_reads_the_clock_whatever_the_stamp() {
    if !privileged("the_benchmarks_unstamped_mark_reads_the_clock_whatever_the_stamp") {
        return;
    }
    const MARK: u32 = 0x5eed;
    let table = paced_table(1_000_000_000, 0, 0, 0);
    // A departure 50 ms ahead, as the previous run of a reused skb would have left it.
    let send = |dp: &mut Datapath, frame: &[u8], mark: u32| {
        let stamp = mono_now_ns() + 50_000_000;
        let before = mono_now_ns();
        let o = run(
            dp,
            frame,
            SkBuff {
                tstamp: stamp,
                mark,
                ..SkBuff::default()
            },
        );
        let after = mono_now_ns();
        assert_eq!(o.ret, TC_ACT_UNSPEC);
        (o.ctx.tstamp, stamp, before, after)
    };
    let f = tcp4(1, 2, 100);
    let mut bench = Datapath::load(&LoadOptions {
        bench_unstamped_mark: MARK,
        ..LoadOptions::default()
    })
    .expect("load the datapath with the benchmark's mark");
    bench.write_rules(&table, &[]).unwrap();
    let (depart, _, before, after) = send(&mut bench, &f, MARK);
    assert!(
        (before..=after).contains(&depart),
        "a packet of the mark departs now ({before}..={after}), not at its stamp: {depart}"
    );
    // A fresh flow clock for the control: another flow (ports) of another mark.
    let (depart, stamp, _, _) = send(&mut bench, &tcp4(3, 4, 100), MARK + 1);
    assert_eq!(depart, stamp, "a packet of another mark keeps its stamp");
    drop(bench);
    let mut agent = load();
    agent.write_rules(&table, &[]).unwrap();
    let (depart, stamp, _, _) = send(&mut agent, &f, MARK);
    assert_eq!(
        depart, stamp,
        "the agent's load honours the stamp whatever the mark"
    );
}
