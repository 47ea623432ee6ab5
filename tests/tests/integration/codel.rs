//! CoDel on the EDT departure queues, and ECN marking.
//!
//! BPF_PROG_TEST_RUN drives the real tc program with a stack timestamp as its clock: every
//! packet of a run carries the same timestamp `t0`, so a class (or level) paced at 1 MB/s with
//! 1000-byte frames holds packet `k` for exactly `k` ms, and its departure is `t0 + k ms`,
//! CoDel's clock. The state machine is then checked packet by packet: the first signal one
//! interval after the delay first reached the target, the next ones `interval / sqrt(count)`
//! apart on the departure clock, marks on ECN-capable packets and drops of the others, and the
//! episode's end once the queue is gone.

use paceline::kernel::datapath::Datapath;
use paceline_common::{
    codel::CodelParams,
    edt::{DELAY_BUCKETS, delay_bucket},
    maps::{ClassConfig, PolicyTable, level_slot},
};
use paceline_tests::{
    packet::{self, L4},
    skb::{SkBuff, mono_now_ns},
};

use crate::privileged;
use crate::test_run::{TC_ACT_SHOT, TC_ACT_UNSPEC, load, run};

const MS: u64 = 1_000_000;
/// 1 MB/s: a 1000-byte frame takes 1 ms.
const RATE: u64 = 1_000_000;
const FRAME: usize = 1000;
const TARGET_MS: u64 = 2;
const INTERVAL_MS: u64 = 20;

/// Which aggregate runs CoDel.
#[derive(Clone, Copy, Debug)]
enum Where {
    Class,
    Level,
}

/// Class 0 at level 1, paced at [`RATE`] (as a class or as a level), with CoDel on it.
fn table(at: Where, ecn: bool) -> PolicyTable {
    let mut t = PolicyTable::empty();
    t.n_classes = 1;
    t.horizon_ns = 10_000 * MS;
    t.classes[0] = ClassConfig {
        level: 1,
        ..ClassConfig::zeroed()
    };
    let codel = CodelParams::on((TARGET_MS * MS) as u32, (INTERVAL_MS * MS) as u32, ecn);
    match at {
        Where::Class => {
            t.classes[0].class_rate = RATE;
            t.classes[0].codel = codel;
        }
        Where::Level => {
            t.levels[1].rate = RATE;
            t.levels[1].codel = codel;
        }
    }
    t
}

fn slot(at: Where) -> u32 {
    match at {
        Where::Class => 0,
        Where::Level => level_slot(1),
    }
}

/// A 1000-byte Ethernet/IPv4/TCP frame with these ECN bits.
fn frame4(ecn: u8) -> Vec<u8> {
    let f = packet::ipv4(
        [10, 0, 0, 1],
        [10, 0, 0, 2],
        L4::Tcp {
            sport: 4000,
            dport: 5000,
        },
        10,
        ecn,
        &[],
        None,
        FRAME - 54,
    );
    assert_eq!(f.len(), FRAME);
    f
}

fn at(t: u64) -> SkBuff {
    SkBuff {
        tstamp: t,
        ..SkBuff::default()
    }
}

/// The departure offsets (ms after `t0`) CoDel signals at, for a backlog of packets 1 ms
/// apart that keep their slots (marked, not dropped), computed here with floats: the delay
/// first reaches the target at packet `TARGET_MS`, the first signal is an interval later, the
/// n-th next one `interval / sqrt(n)` after the previous one was due.
fn expected_signals(until_ms: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut due = (TARGET_MS + INTERVAL_MS) as f64;
    let mut n = 1.0f64;
    while due <= until_ms as f64 {
        out.push(due.ceil() as u64);
        due += INTERVAL_MS as f64 / n.sqrt();
        n += 1.0;
    }
    out
}

/// Sends `n` packets at `t0`; returns each one's (verdict, departure offset in ms, ECN bits).
fn backlog(dp: &mut Datapath, f: &[u8], t0: u64, n: u64) -> Vec<(i32, u64, u8)> {
    (0..n)
        .map(|_| {
            let o = run(dp, f, at(t0));
            let ecn = if o.ret == TC_ACT_SHOT {
                0
            } else {
                packet::inspect(&o.data).ecn
            };
            (o.ret, o.ctx.tstamp.saturating_sub(t0) / MS, ecn)
        })
        .collect()
}

#[test]
fn codel_marks_after_an_interval_above_target_then_every_interval_over_sqrt_count() {
    if !privileged("codel_marks_after_an_interval_above_target_then_every_interval_over_sqrt_count") {
        return;
    }
    for w in [Where::Class, Where::Level] {
        let mut dp = load();
        dp.write_rules(&table(w, true), &[]).unwrap();
        let t0 = mono_now_ns() + 1_000 * MS;
        let f = frame4(2); // ECT(0)
        let out = backlog(&mut dp, &f, t0, 150);
        let marked: Vec<u64> = out.iter().filter(|o| o.2 == 3).map(|o| o.1).collect();
        assert!(out.iter().all(|o| o.0 == TC_ACT_UNSPEC), "{w:?}: nothing dropped");
        for (k, o) in out.iter().enumerate() {
            assert_eq!(o.1, k as u64, "{w:?}: packet {k} leaves k ms after t0");
        }
        assert_eq!(marked, expected_signals(149), "{w:?}: CE marks (departure, ms)");
        let st = dp.codel_state(slot(w)).unwrap();
        assert_eq!(
            (st.signalling, st.count as usize),
            (1, marked.len()),
            "{w:?}: still signalling"
        );
        let s = dp.snapshot().unwrap();
        for c in [&s.classes[0], &s.levels[1]] {
            assert_eq!(
                c.marks_codel,
                marked.len() as u64,
                "{w:?}: counted in class and level"
            );
            assert_eq!(c.drops_codel, 0);
            // The delay histogram: one packet per ms of delay, 0..149.
            let mut want = [0u64; DELAY_BUCKETS];
            for k in 0..150 {
                want[delay_bucket(k * MS)] += 1;
            }
            assert_eq!(c.delay_hist, want, "{w:?}: delay histogram");
        }
    }
}

#[test]
fn codel_drops_what_is_not_ecn_capable_and_never_marks_it() {
    if !privileged("codel_drops_what_is_not_ecn_capable_and_never_marks_it") {
        return;
    }
    for (ecn_bits, ecn_on) in [(0u8, true), (2u8, false)] {
        let mut dp = load();
        dp.write_rules(&table(Where::Class, ecn_on), &[]).unwrap();
        let t0 = mono_now_ns() + 1_000 * MS;
        let f = frame4(ecn_bits);
        let mut dropped_at = Vec::new();
        for _ in 0..150 {
            let o = run(&mut dp, &f, at(t0));
            if o.ret == TC_ACT_SHOT {
                // A dropped packet takes no slot: the class clock says where it would have left.
                dropped_at.push((dp.agg_clock(0).unwrap() - t0) / MS);
            } else {
                assert_eq!(o.ret, TC_ACT_UNSPEC);
                assert_eq!(o.data, f, "ecn {ecn_bits}, ecn on {ecn_on}: passed untouched");
            }
        }
        // The same departures as the marks of an ECN-capable backlog: a drop leaves its slot
        // to the next packet, so the clock (CoDel's time) is where the marked run had it.
        let last = *dropped_at.last().expect("some drops");
        assert_eq!(
            dropped_at,
            expected_signals(last),
            "ecn {ecn_bits}, ecn on {ecn_on}: drops"
        );
        assert!(
            last + 15 > 150 - dropped_at.len() as u64,
            "signals to the end: {dropped_at:?}"
        );
        let s = dp.snapshot().unwrap();
        assert_eq!(
            (s.classes[0].drops_codel, s.classes[0].marks_codel),
            (dropped_at.len() as u64, 0)
        );
        assert_eq!(s.classes[0].drops_horizon, 0);
        assert_eq!(s.levels[1].drops_codel, dropped_at.len() as u64);
    }
}

#[test]
fn codel_episode_ends_below_target_and_the_next_waits_an_interval() {
    if !privileged("codel_episode_ends_below_target_and_the_next_waits_an_interval") {
        return;
    }
    let mut dp = load();
    dp.write_rules(&table(Where::Class, true), &[]).unwrap();
    let f = frame4(1); // ECT(1)
    let t0 = mono_now_ns() + 1_000 * MS;
    let first = backlog(&mut dp, &f, t0, 60);
    let marks: Vec<u64> = first.iter().filter(|o| o.2 == 3).map(|o| o.1).collect();
    assert_eq!(marks, expected_signals(59));
    let before = dp.codel_state(0).unwrap();
    assert_eq!(before.signalling, 1);
    // The queue drains: a packet stamped after the clock finds no delay.
    let t1 = t0 + 100 * MS;
    let o = run(&mut dp, &f, at(t1));
    assert_eq!(
        (o.ret, o.ctx.tstamp, packet::inspect(&o.data).ecn),
        (TC_ACT_UNSPEC, t1, 1)
    );
    let st = dp.codel_state(0).unwrap();
    assert_eq!((st.signalling, st.first_above), (0, 0), "the episode ended");
    // A new backlog from t1: a whole interval above target before the next mark, and since
    // the last episode ended recently, it starts at that episode's count less where it began.
    let again = backlog(&mut dp, &f, t1, 40);
    let marks: Vec<u64> = again.iter().filter(|o| o.2 == 3).map(|o| o.1).collect();
    // Packet j of this run leaves at t1 + (j + 1) ms (the drained packet took t1): the delay
    // reaches the target at t1 + 2 ms, the first mark is an interval later.
    assert_eq!(marks.first(), Some(&(TARGET_MS + INTERVAL_MS)), "{marks:?}");
    let st = dp.codel_state(0).unwrap();
    assert_eq!(st.lastcount, before.count - before.lastcount, "resumed count");
    assert!(first.iter().chain(again.iter()).all(|o| o.0 == TC_ACT_UNSPEC));
}

#[test]
fn ce_marks_keep_checksums_dscp_and_flow_label() {
    if !privileged("ce_marks_keep_checksums_dscp_and_flow_label") {
        return;
    }
    let mut dp = load();
    // A target and interval of one packet each: from the third packet on, every packet that
    // sits behind two others is signalled.
    let mut t = table(Where::Class, true);
    t.classes[0].codel = CodelParams::on(1_000, 100_000, true);
    dp.write_rules(&t, &[]).unwrap();
    let src6 = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    let dst6 = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
    let tcp = L4::Tcp {
        sport: 4000,
        dport: 5000,
    };
    let t0 = mono_now_ns() + 1_000 * MS;
    // Build a queue first.
    for _ in 0..5 {
        run(&mut dp, &frame4(2), at(t0));
    }
    for ecn in [1u8, 2, 3] {
        // IPv4 with options, so the checksum covers more than the fixed header.
        let f = packet::ipv4(
            [10, 0, 0, 1],
            [10, 0, 0, 2],
            tcp,
            46,
            ecn,
            &[1, 1, 1, 1],
            None,
            200,
        );
        let o = run(&mut dp, &f, at(t0));
        assert_eq!(o.ret, TC_ACT_UNSPEC);
        let seen = packet::inspect(&o.data);
        assert_eq!(
            (seen.dscp, seen.ecn, seen.ip_csum_ok),
            (46, 3, true),
            "IPv4 ECN {ecn}"
        );
        assert_eq!(o.data[..15], f[..15]);
        assert_eq!(
            o.data[16..24],
            f[16..24],
            "only the TOS byte and the checksum change"
        );
        assert_eq!(o.data[26..], f[26..]);

        let mut g = packet::ipv6(src6, dst6, tcp, 46, ecn, false, 200);
        g[15] |= 0x0a; // flow label 0xabcde
        g[16] = 0xbc;
        g[17] = 0xde;
        let o = run(&mut dp, &g, at(t0));
        assert_eq!(o.ret, TC_ACT_UNSPEC);
        let seen = packet::inspect(&o.data);
        assert_eq!((seen.dscp, seen.ecn), (46, 3), "IPv6 ECN {ecn}");
        assert_eq!(o.data[15] & 0x0f, 0x0a, "flow label kept");
        assert_eq!(
            o.data[16..],
            g[16..],
            "nothing else changes (no IPv6 header checksum)"
        );
    }
    // Not ECN-capable: dropped, never marked.
    for v6 in [false, true] {
        let f = if v6 {
            packet::ipv6(src6, dst6, tcp, 46, 0, false, 200)
        } else {
            packet::ipv4([10, 0, 0, 1], [10, 0, 0, 2], tcp, 46, 0, &[], None, 200)
        };
        assert_eq!(run(&mut dp, &f, at(t0)).ret, TC_ACT_SHOT, "Not-ECT (IPv6: {v6})");
    }
    // Two marks while the queue built (the 4th and 5th packet), six on the packets above, two
    // drops.
    let s = dp.snapshot().unwrap();
    assert_eq!((s.classes[0].marks_codel, s.classes[0].drops_codel), (8, 2));
}

#[test]
fn without_codel_nothing_is_marked_and_the_horizon_drops() {
    if !privileged("without_codel_nothing_is_marked_and_the_horizon_drops") {
        return;
    }
    let mut dp = load();
    let mut t = table(Where::Class, true);
    t.classes[0].codel = CodelParams::off();
    t.horizon_ns = 100 * MS;
    dp.write_rules(&t, &[]).unwrap();
    let t0 = mono_now_ns() + 1_000 * MS;
    let f = frame4(2);
    let out = backlog(&mut dp, &f, t0, 150);
    assert!(out.iter().all(|o| o.2 != 3), "no marks without CoDel");
    let dropped = out.iter().filter(|o| o.0 == TC_ACT_SHOT).count();
    assert_eq!(dropped, 49, "beyond the 100 ms horizon");
    let s = dp.snapshot().unwrap();
    assert_eq!(
        (
            s.classes[0].drops_horizon,
            s.classes[0].drops_codel,
            s.classes[0].marks_codel
        ),
        (49, 0, 0)
    );
}
