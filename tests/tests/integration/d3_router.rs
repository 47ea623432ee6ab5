//! The D3 router (`pl_d3_router`) driven with BPF_PROG_TEST_RUN: requests in TCP options are
//! granted by Snippet 1 against the link's counters, written back with a valid TCP checksum,
//! and everything that is not a request passes untouched.

use aya::{TestRun, TestRunOptions};
use paceline::kernel::datapath::Datapath;
use paceline_common::{
    d3::{self, D3LinkConfig, D3LinkState, D3Request, FLAG_FIN, FLAG_NEW, REQ_LEN},
    maps::{D3LinkCounters, D3LinkCtl},
};
use paceline_tests::{packet, skb::SkBuff};

use crate::privileged;

/// BPF_PROG_TEST_RUN runs on the loopback device.
const LO: u32 = 1;
/// 1 Gbit/s.
const LINE: u64 = 125_000_000;

fn router() -> crate::test_run::Shared {
    let mut dp = crate::test_run::load();
    let cfg = D3LinkConfig::for_line_rate(LINE);
    dp.set_d3_link_ctl(LO, &D3LinkCtl { cfg, capacity: LINE })
        .unwrap();
    dp.set_d3_link_counters(LO, &D3LinkCounters::default()).unwrap();
    dp
}

fn run(dp: &mut Datapath, frame: &[u8]) -> Vec<u8> {
    let prog = dp.d3_router_program().unwrap();
    let mut out = vec![0u8; frame.len() + 64];
    let ctx = SkBuff {
        ifindex: LO,
        ..SkBuff::default()
    };
    let r = prog
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in: Some(ctx.as_bytes()),
            ..TestRunOptions::default()
        })
        .expect("test run");
    assert_eq!(r.return_value as i32, -1, "the router never drops");
    out.truncate(r.data_size_out as usize);
    out
}

/// A data segment carrying NOP NOP timestamps and `req`.
fn segment(req: &D3Request) -> Vec<u8> {
    segment_from(40000, req)
}

/// A data segment of the flow from port `sport` carrying `req`.
fn segment_from(sport: u16, req: &D3Request) -> Vec<u8> {
    let mut opts = vec![1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2];
    opts.extend_from_slice(&req.encode());
    packet::tcp4_with_options([10, 0, 0, 1], [10, 0, 0, 2], sport, 5600, &opts, 200)
}

/// The request a flow sends after `prev` was granted `granted` units at slot 0.
fn follow_up(prev: &D3Request, granted: u8, desired: u8) -> D3Request {
    let mut r = D3Request {
        scale: prev.scale,
        desired,
        prev_scale: prev.scale,
        prev_desired: prev.desired,
        ..D3Request::EMPTY
    };
    r.prev_alloc[0] = granted;
    r
}

/// The request option of a rewritten segment.
fn request_of(frame: &[u8]) -> (D3Request, bool) {
    let (opts, csum_ok) = packet::tcp4_options(frame);
    let mut b = [0u8; REQ_LEN];
    b.copy_from_slice(&opts[12..12 + REQ_LEN]);
    (D3Request::decode(&b).expect("a valid request"), csum_ok)
}

/// A new flow asking for `desired` units at `scale`.
fn new_request(desired: u8, scale: u8) -> D3Request {
    D3Request {
        flags: FLAG_NEW,
        scale,
        desired,
        ..D3Request::EMPTY
    }
}

#[test]
fn router_grants_a_new_deadline_flow_and_fixes_the_checksum() {
    if !privileged("router_grants_a_new_deadline_flow_and_fixes_the_checksum") {
        return;
    }
    let mut dp = router();
    // 50 KB in 20 ms = 2.5 MB/s: 39 units of 64 KiB/s at scale 5.
    let req = new_request(39, 5);
    let (out, csum_ok) = request_of(&run(&mut dp, &segment(&req)));
    assert!(csum_ok, "TCP checksum valid after the rewrite");
    assert_eq!(out.hop, 1, "the router took slot 0");
    // Snippet 1 for a new flow on an empty link: desired + base rate (line/1000), floored to
    // whole units of the request's scale.
    let unit = d3::unit_rate(5);
    let expected = ((39 * unit + LINE / 1000) / unit).min(255) as u8;
    assert_eq!(out.alloc[0], expected);
    let c = dp.d3_link_counters(LO).unwrap();
    assert_eq!((c.flows, c.requests, c.news), (1, 1, 1));
    assert_eq!(c.demand, 39 * unit);
    assert_eq!(c.allocated, expected as u64 * unit);
    // The same request computed by the pure function agrees.
    let cfg = D3LinkConfig::for_line_rate(LINE);
    let mut st = D3LinkState::new(&cfg);
    assert_eq!(d3::process_request(&mut st, &cfg, &req).units, expected);
}

#[test]
fn next_request_returns_the_previous_allocation_and_fin_returns_everything() {
    if !privileged("next_request_returns_the_previous_allocation_and_fin_returns_everything") {
        return;
    }
    let mut dp = router();
    let first = request_of(&run(&mut dp, &segment(&new_request(39, 5)))).0;
    let granted = first.alloc[0];
    // One RTT later: same desired rate, returning what this hop granted.
    let mut again = D3Request {
        scale: 5,
        desired: 39,
        prev_scale: 5,
        prev_desired: 39,
        ..D3Request::EMPTY
    };
    again.prev_alloc[0] = granted;
    let second = request_of(&run(&mut dp, &segment(&again))).0;
    let c = dp.d3_link_counters(LO).unwrap();
    let unit = d3::unit_rate(5);
    assert_eq!(c.flows, 1, "not a new flow");
    assert_eq!(c.demand, 39 * unit, "demand replaced, not added");
    assert_eq!(
        c.allocated,
        second.alloc[0] as u64 * unit,
        "A holds only the latest grant"
    );
    // FIN: everything back.
    let mut fin = D3Request {
        flags: FLAG_FIN,
        scale: 5,
        prev_scale: 5,
        prev_desired: 39,
        ..D3Request::EMPTY
    };
    fin.prev_alloc[0] = second.alloc[0];
    let out = request_of(&run(&mut dp, &segment(&fin))).0;
    assert_eq!(out.alloc[0], 0);
    let c = dp.d3_link_counters(LO).unwrap();
    assert_eq!((c.flows, c.demand, c.allocated, c.fins), (0, 0, 0, 1));
}

#[test]
fn absurd_request_is_capped_and_counted() {
    if !privileged("absurd_request_is_capped_and_counted") {
        return;
    }
    let mut dp = router();
    // 255 units at scale 15: 17 GB/s asked of a 125 MB/s link.
    let out = request_of(&run(&mut dp, &segment(&new_request(255, 15)))).0;
    let c = dp.d3_link_counters(LO).unwrap();
    assert_eq!(c.clamped, 1);
    assert!(
        out.alloc[0] as u64 * d3::unit_rate(15) <= LINE,
        "never more than the link"
    );
    assert!(c.demand <= LINE, "demand clamped to the link");
}

#[test]
fn never_grants_more_than_a_previous_hop() {
    if !privileged("never_grants_more_than_a_previous_hop") {
        return;
    }
    let mut dp = router();
    let mut req = new_request(39, 5);
    req.hop = 1;
    req.alloc[0] = 3; // the first router granted 3 units
    let out = request_of(&run(&mut dp, &segment(&req))).0;
    assert_eq!(out.hop, 2);
    assert_eq!(out.alloc[0], 3, "slot 0 untouched");
    assert!(
        out.alloc[1] <= 3,
        "slot 1 {} above the upstream grant",
        out.alloc[1]
    );
}

#[test]
fn other_packets_pass_untouched() {
    if !privileged("other_packets_pass_untouched") {
        return;
    }
    let mut dp = router();
    // Plain TCP, timestamps only.
    let plain = packet::tcp4_with_options(
        [10, 0, 0, 1],
        [10, 0, 0, 2],
        1,
        2,
        &[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2],
        100,
    );
    assert_eq!(run(&mut dp, &plain), plain);
    // Feedback travels back to the sender untouched.
    let fb = d3::D3Feedback::from_request(&new_request(39, 5)).encode();
    let mut opts = fb.to_vec();
    opts.extend_from_slice(&[1, 1, 1, 1]);
    let f = packet::tcp4_with_options([10, 0, 0, 2], [10, 0, 0, 1], 5600, 40000, &opts, 0);
    assert_eq!(run(&mut dp, &f), f);
    // UDP.
    let u = packet::ipv4(
        [10, 0, 0, 1],
        [10, 0, 0, 2],
        packet::L4::Udp { sport: 1, dport: 2 },
        0,
        0,
        &[],
        None,
        50,
    );
    assert_eq!(run(&mut dp, &u), u);
    let c = dp.d3_link_counters(LO).unwrap();
    assert_eq!(c.requests, 0);
    assert!(
        c.sent_bytes >= (plain.len() + f.len() + u.len()) as u64,
        "every byte counted for the controller"
    );
}

#[test]
fn request_at_an_odd_offset_keeps_the_checksum_valid() {
    if !privileged("request_at_an_odd_offset_keeps_the_checksum_valid") {
        return;
    }
    let mut dp = router();
    // NOP, the request (20), then NOP padding to 24 bytes: the request starts at offset 1.
    let mut opts = vec![1u8];
    opts.extend_from_slice(&new_request(39, 5).encode());
    opts.extend_from_slice(&[1, 1, 0]);
    let f = packet::tcp4_with_options([10, 0, 0, 1], [10, 0, 0, 2], 40000, 5600, &opts, 77);
    let out = run(&mut dp, &f);
    let (o, csum_ok) = packet::tcp4_options(&out);
    assert!(csum_ok, "TCP checksum valid with an odd-offset option");
    let mut b = [0u8; REQ_LEN];
    b.copy_from_slice(&o[1..1 + REQ_LEN]);
    assert_eq!(D3Request::decode(&b).unwrap().hop, 1);
}

#[test]
fn no_link_configured_no_rewrite() {
    if !privileged("no_link_configured_no_rewrite") {
        return;
    }
    let mut dp = crate::test_run::load();
    let f = segment(&new_request(39, 5));
    assert_eq!(run(&mut dp, &f), f, "not a D3 link: untouched");
}

/// A flow that stops asking without a FIN (its host died) holds its allocation only until its
/// lease lapses: the agent's router renews each link's N, D and A from its record of every
/// flow's last request (docs/d3.md, "Leases"). Two long flows take the link and go silent; a
/// deadline flow keeps asking every 20 ms and, after the lease (1 s) and within a renewal
/// period (100 ms), the link counts it alone.
#[test]
fn a_flow_that_stops_asking_releases_its_allocation_when_its_lease_lapses() {
    if !privileged("a_flow_that_stops_asking_releases_its_allocation_when_its_lease_lapses") {
        return;
    }
    let mut dp = crate::test_run::load();
    let link = paceline_policy::validate::D3Link {
        interface: "lo".into(),
        capacity: LINE,
        base_rate: LINE / 1000,
        flow_cap: 0,
        capacity_mode: d3::CAP_MODE_LINE,
    };
    let mut router = paceline::d3router::Router::new(&mut dp, &[link], 1_000_000).expect("router");
    for sport in [41001, 41002] {
        let first = new_request(0, 8);
        let g = request_of(&run(&mut dp, &segment_from(sport, &first))).0.alloc[0];
        request_of(&run(&mut dp, &segment_from(sport, &follow_up(&first, g, 0))));
    }
    let held = dp.d3_link_counters(LO).unwrap();
    assert_eq!(held.flows, 2);
    assert!(
        held.allocated > LINE / 2,
        "the long flows hold the link: {held:?}"
    );
    let mut req = new_request(39, 5);
    let mut granted = request_of(&run(&mut dp, &segment_from(41003, &req))).0.alloc[0];
    let start = std::time::Instant::now();
    let mut released = None;
    while start.elapsed() < std::time::Duration::from_millis(2000) {
        std::thread::sleep(std::time::Duration::from_millis(20));
        req = follow_up(&req, granted, 39);
        granted = request_of(&run(&mut dp, &segment_from(41003, &req))).0.alloc[0];
        router.tick(&mut dp).expect("tick");
        let c = dp.d3_link_counters(LO).unwrap();
        if c.flows == 1 && released.is_none() {
            released = Some(start.elapsed());
        }
    }
    let c = dp.d3_link_counters(LO).unwrap();
    let report = &router.report(&dp)[0];
    eprintln!(
        "released after {released:?}; counters {c:?}; renewals {}",
        report.lease_renewals
    );
    let after = released.expect("the silent flows' leases lapsed");
    // Not before the lease (1 s); within a renewal period (100 ms) after it, with room for
    // an emulated machine's slow ticks.
    assert!(
        after >= std::time::Duration::from_millis(900) && after < std::time::Duration::from_millis(1500),
        "released after the lease, at the next renewal: {after:?}"
    );
    assert_eq!(c.flows, 1, "only the deadline flow counts");
    assert_eq!(c.demand, 39 * d3::unit_rate(5), "its desired rate alone");
    assert_eq!(
        c.allocated,
        granted as u64 * d3::unit_rate(5),
        "its latest grant alone"
    );
    assert!(report.lease_renewals >= 1);
}
