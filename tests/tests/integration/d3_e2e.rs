//! D3 end to end on the testbed: two senders send deadline transfers through a D3 router (a
//! namespace running the agent in router mode) over a 100 Mbit/s bottleneck to a receiver that
//! echoes the grants. Requests reach the router, grants reach the senders, the senders pace at
//! them, the grants carry a share of the spare capacity, the deadlines are met,
//! and the router's counters return to zero when the flows end.

use std::time::{Duration, Instant};

use paceline_tests::{
    agent::{Agent, Scratch},
    testbed::{BottleneckSpec, StarSpec, Testbed},
};
use serde_json::Value;

use crate::privileged;

const PLLOAD: &str = env!("CARGO_BIN_EXE_plload");

fn sender_policy(ifname: &str) -> String {
    format!(
        r#"apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [{ifname}]
  enforcement: auto
  link_rate: 1Gbit
  levels:
    - name: all
      priority: 0
  classes:
    - name: rpc
      level: all
      d3:
        # 400 KB in 150 ms needs about 21 Mbit/s; two such flows fit a 100 Mbit/s link.
        deadline: 150ms
        size: 400KB
    - name: other
      level: all
  rules:
    - class: rpc
      protocol: tcp
      dst_port: 5600
  default_class: other
  d3: {{}}
"#
    )
}

fn router_policy(to_receiver: &str) -> String {
    format!(
        r#"apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [{to_receiver}]
  enforcement: none
  levels:
    - name: all
      priority: 0
  classes:
    - name: all
      level: all
  default_class: all
  d3:
    receiver: false
    router:
      - interface: {to_receiver}
        capacity: 100Mbit
"#
    )
}

fn receiver_policy(ifname: &str) -> String {
    format!(
        r#"apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [{ifname}]
  enforcement: none
  levels:
    - name: all
      priority: 0
  classes:
    - name: all
      level: all
  default_class: all
  d3: {{}}
"#
    )
}

/// A histogram's cumulative count at bucket `le` (as printed, e.g. "4194304" or "+Inf").
fn bucket(metrics: &str, name: &str, le: &str) -> u64 {
    let key = format!("le=\"{le}\"}}");
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}_bucket{{")) && l.contains(&key))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn d3_class<'a>(s: &'a Value, class: &str) -> &'a Value {
    s["counters"]["d3_classes"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == class))
        .unwrap_or_else(|| panic!("no D3 class {class}: {s:#}"))
}

#[test]
fn deadline_flows_get_grants_through_a_d3_router_and_meet_their_deadlines() {
    if !privileged("deadline_flows_get_grants_through_a_d3_router_and_meet_their_deadlines") {
        return;
    }
    if std::env::var("PACELINE_VM_ACCEL").as_deref() == Ok("TCG") {
        // Measured: under TCG the two 400 KB transfers took 1.0-1.2 s against their 150 ms
        // deadline in two of three runs (process start-up and the emulated stack, not the
        // grants: 13-26 grants per flow arrived). The D3 router's verification and rewrite on
        // this kernel are covered by the d3_router tests; enforcement of grants is TCP's own
        // pacing, the same on both kernels, and this test runs on the host.
        eprintln!(
            "SKIPPED: deadline_flows_get_grants_through_a_d3_router_and_meet_their_deadlines: \
             150 ms deadlines are not a fair test under TCG emulation (runs on the host kernel)"
        );
        return;
    }
    let tb = Testbed::new("d3_e2e").expect("testbed");
    let star = tb
        .add_star(&StarSpec {
            senders: 2,
            bottleneck: Some(BottleneckSpec::htb(100_000_000, 150_000)),
            ..StarSpec::default()
        })
        .expect("star");
    let scratch = Scratch::new("d3e2e");
    let to_rx = star.bottleneck_iface().ifname.clone();
    let rx_if = star.receiver.iface_to(&star.router).expect("rx iface").ifname;
    std::fs::write(scratch.path("router.yaml"), router_policy(&to_rx)).unwrap();
    std::fs::write(scratch.path("rx.yaml"), receiver_policy(&rx_if)).unwrap();
    let router = Agent::start(
        &star.router,
        &scratch.path("router.yaml"),
        &scratch.path("router-state"),
    );
    let receiver = Agent::start(
        &star.receiver,
        &scratch.path("rx.yaml"),
        &scratch.path("rx-state"),
    );
    let mut senders = Vec::new();
    for (i, s) in star.senders.iter().enumerate() {
        let ifname = s.iface_to(&star.router).expect("sender iface").ifname;
        let p = scratch.path(&format!("s{i}.yaml"));
        std::fs::write(&p, sender_policy(&ifname)).unwrap();
        senders.push(Agent::start(s, &p, &scratch.path(&format!("s{i}-state"))));
    }

    let _server = star
        .receiver
        .spawn(&[PLLOAD, "serve", "--port", "5600"])
        .expect("server");
    std::thread::sleep(Duration::from_millis(500));
    let to = format!("{}:5600", star.receiver.ipv4());
    let started = Instant::now();
    let clients: Vec<_> = star
        .senders
        .iter()
        .map(|s| {
            s.spawn(&[PLLOAD, "bulk", "--to", &to, "--flows", "1", "--bytes", "400000"])
                .expect("client")
        })
        .collect();
    for c in clients {
        let out = c.wait_output(Duration::from_secs(30)).expect("client finished");
        assert!(out.success(), "client failed: {}", out.stderr);
    }
    eprintln!("both transfers done after {:?}", started.elapsed());
    let rx_metrics = receiver.http_get("/metrics");
    // The receiver echoed the requests (counted on its receiving sockets' class).
    let echoes: u64 = rx_metrics
        .lines()
        .filter(|l| l.starts_with("paceline_d3_echoes_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(
        echoes >= 2,
        "the receiver echoed {echoes} requests:\n{rx_metrics}"
    );

    // Senders: requests went out, grants came back, the deadline was met.
    let (mut above, mut grants) = (0, 0);
    for (i, a) in senders.iter().enumerate() {
        let s = a.wait_for("the sender's D3 verdict", |s| {
            let c = d3_class(s, "rpc");
            c["deadlines_met"].as_u64().unwrap_or(0) + c["deadlines_missed"].as_u64().unwrap_or(0) >= 1
        });
        let c = d3_class(&s, "rpc");
        eprintln!("sender {i}: {c}");
        assert!(
            c["requests"].as_u64().unwrap() >= 1,
            "sender {i} sent no request: {c}"
        );
        assert!(c["grants"].as_u64().unwrap() >= 1, "sender {i} got no grant: {c}");
        assert_eq!(c["deadline_flows"], 1, "{c}");
        assert_eq!(c["deadlines_met"], 1, "sender {i} missed its deadline: {c}");
        let m = a.http_get("/metrics");
        let g = "paceline_d3_granted_rate_bytes_per_second";
        let (upto4, all) = (bucket(&m, g, "4194304"), bucket(&m, g, "+Inf"));
        eprintln!("sender {i}: {} of {all} grants above 4 MB/s", all - upto4);
        above += all - upto4;
        grants += all;
    }
    // Each flow desires about 2.7 MB/s (400 KB in 150 ms); with two such flows on a 12.5 MB/s
    // link the router adds a fair share of the spare capacity, (C - D)/N, about 3.6 MB/s while
    // C holds near the line rate, so most grants exceed 4 MB/s (not the last ones: as a flow
    // gets ahead its desired rate falls, and a grant is at most 255 units of the request's
    // scale). Measured: 62-76% of the grants of both flows with the standing-queue filter;
    // 39-52% when the controller cut C on every burst it sampled in the queue, and the flows
    // finished at their deadline instead of a quarter early. The bound sits between; the
    // controller itself is pinned down on a recorded trace by the tests of
    // `common/src/d3/controller.rs`.
    eprintln!("{above} of {grants} grants above 4 MB/s");
    assert!(
        grants > 0 && above * 100 >= grants * 56,
        "only {above} of {grants} grants carried a share of the spare capacity"
    );
    // The router granted and, once the flows returned their allocations, holds nothing.
    let s = router.wait_for("the router's counters to drain", |s| {
        let l = &s["counters"]["d3_router_links"][0];
        l["flows"] == 0 && l["allocated_bytes_per_second"] == 0
    });
    let l = &s["counters"]["d3_router_links"][0];
    eprintln!("router link: {l}");
    assert!(
        l["requests"].as_u64().unwrap() >= 4,
        "requests seen by the router: {l}"
    );
    assert!(l["new_flows"].as_u64().unwrap() >= 2, "{l}");
    assert!(
        l["fins"].as_u64().unwrap() >= 2,
        "both flows returned their allocation: {l}"
    );
    drop(senders);
    drop(receiver);
    router.stop();
}
