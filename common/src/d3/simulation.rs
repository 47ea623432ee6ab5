//! All of D3 in one loop: senders, the wire format, a router, receivers' echoes and the
//! capacity controller, over simulated RTTs (a test only).
#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests panic with a message"
)]

extern crate std;
use crate::d3::testutil::*;
use crate::d3::*;
use std::vec::Vec;

struct SimFlow {
    st: D3FlowState,
    deadline_ns: Option<u64>,
    start_round: u64,
    bytes_left: u64,
    done_ns: Option<u64>,
    fin_sent: bool,
}

/// Deadline flows (2-50 KB, 20-40 ms) and two long non-deadline flows share one 1 Gbit/s
/// link with 300 us RTTs. Every request goes through the wire format, the router, the
/// receiver's echo and the sender's feedback handling; the controller runs every 3 RTTs.
#[test]
fn simulation_deadline_flows_share_a_link() {
    const RTT: u64 = 300_000;
    let cfg = cfg_1g();
    let mut link = D3LinkState::new(&cfg);
    let ms = 1_000_000u64;
    let deadline_flows: [(u64, u64, u64); 10] = [
        (2_000, 20, 0),
        (10_000, 25, 0),
        (20_000, 30, 1),
        (30_000, 40, 2),
        (40_000, 20, 3),
        (50_000, 30, 3),
        (25_000, 22, 5),
        (45_000, 35, 8),
        (50_000, 20, 8),
        (2_000, 40, 9),
    ];
    let mut flows: Vec<SimFlow> = deadline_flows
        .iter()
        .map(|(size, dl, start)| SimFlow {
            st: D3FlowState::new(0),
            deadline_ns: Some(start * RTT + dl * ms),
            start_round: *start,
            bytes_left: *size,
            done_ns: None,
            fin_sent: false,
        })
        .collect();
    for start in [0, 4] {
        flows.push(SimFlow {
            st: D3FlowState::new(0),
            deadline_ns: None,
            start_round: start,
            bytes_left: 3_000_000,
            done_ns: None,
            fin_sent: false,
        });
    }
    let last_arrival = flows.iter().map(|f| f.start_round).max().unwrap_or(0);
    let mut queue = 0u64;
    let mut served_in_interval = 0u64;
    let mut t = 0u64;
    while flows.iter().any(|f| !f.fin_sent) {
        assert!(t < 2_000, "simulation did not finish");
        let now = t * RTT;
        // 1. Requests (one per flow per RTT), through router and receiver, back to sender.
        let mut grants_sum = 0u64;
        let mut any_new = false;
        for f in flows.iter_mut() {
            if t < f.start_round || f.fin_sent {
                continue;
            }
            let inp = HostInput {
                has_deadline: f.deadline_ns.is_some(),
                bytes_left: f.bytes_left,
                time_left_ns: f.deadline_ns.map_or(0, |d| d as i64 - (now + RTT) as i64),
                line_rate: GBPS,
                fin: f.done_ns.is_some(),
            };
            let hr = f.st.next_request(&inp).expect("request");
            assert_eq!(
                hr.outcome & (HOST_QUENCHED_NOW | HOST_FEEDBACK_LOST),
                0,
                "flow {t}"
            );
            any_new |= hr.outcome & HOST_NEW != 0;
            let mut wire = hr.req.encode();
            let g = router_rewrite(&mut wire, &mut link, &cfg);
            assert_eq!(g.outcome & (OUT_INVALID | OUT_HOP_OVERFLOW | OUT_CLAMPED), 0);
            if hr.outcome & HOST_FIN != 0 {
                f.fin_sent = true;
                continue;
            }
            let echo = feedback_for(&wire).expect("receiver echoes");
            let fb = D3Feedback::decode(&echo).expect("sender parses");
            let pace = f.st.apply_feedback(&fb).expect("one D3 hop");
            if let Some(dl) = f.deadline_ns {
                // After its first RTT a deadline flow always gets at least what it asked.
                if hr.outcome & HOST_NEW == 0 && link.demand <= link.capacity {
                    assert!(pace >= hr.desired_rate, "round {t}: {pace} < {}", hr.desired_rate);
                }
                assert!(now < dl, "still sending after the deadline");
            }
            grants_sum += pace;
        }
        // Grants never exceed what the router hands out once arrivals have settled.
        if t > last_arrival + 2 && !any_new {
            assert!(
                grants_sum <= link.capacity,
                "round {t}: {grants_sum} > {}",
                link.capacity
            );
        }
        // 2. Data for this RTT at the paced rate (the grant came back with the feedback).
        let mut arrivals = 0u64;
        for f in flows.iter_mut() {
            if t < f.start_round || f.done_ns.is_some() || f.fin_sent || f.st.awaiting_feedback() {
                continue;
            }
            let sent = f.bytes_left.min(f.st.pace_rate * RTT / 1_000_000_000);
            f.bytes_left -= sent;
            arrivals += sent;
        }
        let capacity_bytes = GBPS * RTT / 1_000_000_000;
        let served = (queue + arrivals).min(capacity_bytes);
        queue = queue + arrivals - served;
        served_in_interval += served;
        for f in flows.iter_mut() {
            if f.done_ns.is_none() && f.bytes_left == 0 {
                // Last byte leaves the link after the queue ahead of it drains.
                f.done_ns = Some(now + RTT + queue * 1_000_000_000 / GBPS);
            }
        }
        // 3. Capacity controller every 3 RTTs.
        if t % 3 == 2 {
            capacity_tick(&mut link, &cfg, served_in_interval, queue, 3 * RTT);
            served_in_interval = 0;
            assert!(link.capacity >= cfg.capacity_min && link.capacity <= cfg.capacity_max);
        }
        t += 1;
    }
    for (i, f) in flows.iter().enumerate() {
        let done = f.done_ns.expect("finished");
        if let Some(dl) = f.deadline_ns {
            assert!(done <= dl, "flow {i} missed its deadline: {done} > {dl}");
        }
    }
    // Every flow sent a FIN and the router's counters are exactly back to zero.
    assert_eq!((link.flows, link.demand, link.allocated), (0, 0, 0));
}
