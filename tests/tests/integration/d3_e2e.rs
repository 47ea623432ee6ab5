//! D3 end to end on the testbed: two senders send deadline transfers through a D3 router (a
//! namespace running the agent in router mode) over a 100 Mbit/s bottleneck to a receiver that
//! echoes the grants. Requests reach the router, grants reach the senders, the senders pace at
//! them, the grants carry a share of the spare capacity, the deadlines are met,
//! and the router's counters return to zero when the flows end.
//!
//! Under emulation (the VMs of `cargo xtask test` run under TCG) the whole scenario runs
//! slowed down by a factor k ([`time_scale`]): every duration (deadline, controller interval)
//! times k, every rate (bottleneck, router capacity, the senders' line rate, the grant
//! threshold) divided by k, every byte count (transfer size, buffer) unchanged. Each flow then
//! needs the same share of the bottleneck for the same number of its own RTTs, so every
//! assertion keeps its meaning; only the emulated machine gets k times longer for its work.

use std::time::{Duration, Instant};

use paceline_tests::{
    agent::{Agent, Scratch},
    testbed::{BottleneckSpec, Star, StarSpec, Testbed},
};
use serde_json::Value;

use crate::{privileged, under_tcg as tcg};

const PLLOAD: &str = env!("CARGO_BIN_EXE_plload");

/// The time dilation k: `PACELINE_D3_E2E_SCALE` (a power of two, 1..=64), else 32 under TCG
/// emulation, else 2. Deadlines are 150 ms * k, the bottleneck and the router's capacity
/// 100 Mbit/s / k, the router's interval k ms (4k under TCG). A power of two keeps the grant threshold
/// (4 MB/s / k) on a bucket boundary of the granted-rate histogram (powers of two).
///
/// On the host, k = 1 (150 ms) finished both transfers in 94-114 ms on a quiet machine and
/// 109-135 ms beside three CPU burners, but a loaded CI machine took 208 ms and one flow
/// missed its deadline (2026-12-01). k = 2 (300 ms) took 185-226 ms quiet and 204-217 ms
/// beside three burners, every deadline met, grant shares 63-76% (above the 56% bound): the
/// stalls of a busy machine do not grow with k, so a larger k leaves them more room.
///
/// Under TCG (Debian's 6.1 and 6.12, 2 vCPUs): k = 1 missed the deadline in two of three runs
/// (process start-up and the emulated stack); k = 8 in 2 of 4; k = 16 (2.4 s) passed 8 of 8
/// until 2026-12-01, then missed in 2 of 5 runs on 6.1 (2.7 s). k = 32 (4.8 s) with the
/// router's interval at 4k ms ([`router_interval_ms`]) missed once in 11 runs (both transfers
/// done after 5.1 s); the test bounds such a miss under TCG where it asserts the deadlines.
fn time_scale() -> u64 {
    if let Ok(v) = std::env::var("PACELINE_D3_E2E_SCALE") {
        match v.parse::<u64>() {
            Ok(k) if k.is_power_of_two() && k <= 64 => return k,
            _ => panic!("PACELINE_D3_E2E_SCALE={v}: a power of two from 1 to 64"),
        }
    }
    if tcg() { 32 } else { 2 }
}

/// Each transfer's size, bytes: two in 150 ms * k ask for 43% of the link.
const TRANSFER_BYTES: u64 = 400_000;

/// The router's interval T, ms: k, and 4k under TCG. The router forgets its flows (N, D and
/// A) after 100 ms without a request, or 4 intervals if longer (`IDLE_RESET_NS`): at k = 32 and
/// T = 32 ms that is 128 ms, shorter than the emulated RTT once the bottleneck's 150 KB queue
/// (384 ms at 3.125 Mbit/s) fills: the router reset 8 times in one 200 KB run on 6.12 (the
/// leases restore N, D and A within 100 ms, docs/d3.md). T = 4k ms puts the reset at 512 ms:
/// 2 resets in a run after the change, though the deadline misses did not measurably change
/// (1 miss in 9 runs before, 1 in 11 after). In a datacenter the RTT is far below 100 ms; only the dilated
/// testbed stretches it.
fn router_interval_ms(k: u64) -> u64 {
    if tcg() { 4 * k } else { k }
}

/// `bits_per_s` as a policy rate (whole kbit/s).
fn rate(bits_per_s: u64) -> String {
    format!("{}kbit", bits_per_s / 1000)
}

/// Each transfer's deadline at k = 1, ms.
const DEADLINE_MS: u64 = 150;

fn sender_policy(ifname: &str, k: u64) -> String {
    let link_rate = rate(1_000_000_000 / k);
    let deadline = DEADLINE_MS * k;
    let size_kb = TRANSFER_BYTES / 1000;
    format!(
        r#"apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [{ifname}]
  enforcement: auto
  link_rate: {link_rate}
  levels:
    - name: all
      priority: 0
  classes:
    - name: rpc
      level: all
      d3:
        # 400 KB in 150 ms needs about 21 Mbit/s; two such flows fit a 100 Mbit/s link
        # (k = 1; with k, 150*k ms and 100/k Mbit/s).
        deadline: {deadline}ms
        size: {size_kb}KB
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

fn router_policy(to_receiver: &str, k: u64) -> String {
    router_policy_at(to_receiver, 100_000_000 / k, router_interval_ms(k))
}

/// A router serving `to_receiver` with a D3 capacity of `capacity` bits/s, ticking every
/// `interval_ms`.
fn router_policy_at(to_receiver: &str, capacity: u64, interval_ms: u64) -> String {
    let capacity = rate(capacity);
    let interval = interval_ms;
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
    interval: {interval}ms
    router:
      - interface: {to_receiver}
        capacity: {capacity}
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

/// Starts the star's router (with `router_policy` of its interface toward the receiver) and
/// the receiver, each running the agent.
fn router_and_receiver<'a>(
    star: &'a Star,
    scratch: &Scratch,
    router_policy: impl Fn(&str) -> String,
) -> (Agent<'a>, Agent<'a>) {
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
    (router, receiver)
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
    let k = time_scale();
    eprintln!(
        "time scale k = {k}: deadline {} ms, bottleneck and router capacity {} Mbit/s, transfers of {TRANSFER_BYTES} bytes",
        DEADLINE_MS * k,
        100.0 / k as f64
    );
    let tb = Testbed::new("d3_e2e").expect("testbed");
    let star = tb
        .add_star(&StarSpec {
            senders: 2,
            bottleneck: Some(BottleneckSpec::htb(100_000_000 / k, 150_000)),
            ..StarSpec::default()
        })
        .expect("star");
    let scratch = Scratch::new("d3e2e");
    let (router, receiver) = router_and_receiver(&star, &scratch, |to_rx| router_policy(to_rx, k));
    let mut senders = Vec::new();
    for (i, s) in star.senders.iter().enumerate() {
        let ifname = s.iface_to(&star.router).expect("sender iface").ifname;
        let p = scratch.path(&format!("s{i}.yaml"));
        std::fs::write(&p, sender_policy(&ifname, k)).unwrap();
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
            s.spawn(&[
                PLLOAD,
                "bulk",
                "--to",
                &to,
                "--flows",
                "1",
                "--bytes",
                &TRANSFER_BYTES.to_string(),
            ])
            .expect("client")
        })
        .collect();
    for c in clients {
        let out = c
            .wait_output(Duration::from_secs(30 * k))
            .expect("client finished");
        assert!(out.success(), "client failed: {}", out.stderr);
    }
    let done = started.elapsed();
    eprintln!("both transfers done after {done:?}");
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
        let m = a.http_get("/metrics");
        let g = "paceline_d3_granted_rate_bytes_per_second";
        let threshold = (4u64 << 20) / k;
        let (upto, all) = (bucket(&m, g, &threshold.to_string()), bucket(&m, g, "+Inf"));
        assert!(
            m.contains(&format!("le=\"{threshold}\"")),
            "no histogram bucket at {threshold} B/s:\n{m}"
        );
        eprintln!("sender {i}: {} of {all} grants above {threshold} B/s", all - upto);
        eprintln!(
            "sender {i}: grants by bucket (B/s: cumulative count): {:?}",
            m.lines()
                .filter(|l| l.starts_with(&format!("{g}_bucket{{")))
                .filter_map(|l| Some((l.split("le=\"").nth(1)?.split('"').next()?, l.rsplit(' ').next()?)))
                .collect::<Vec<_>>()
        );
        assert!(
            c["requests"].as_u64().unwrap() >= 1,
            "sender {i} sent no request: {c}"
        );
        assert!(c["grants"].as_u64().unwrap() >= 1, "sender {i} got no grant: {c}");
        assert_eq!(c["deadline_flows"], 1, "{c}");
        // Under TCG a flow may miss its deadline by a little: the emulator stalls, and its bursts
        // in the bottleneck queue cut the router's C and bring zero grants, which pause a flow
        // (measured with k = 32: a miss in 3 of 27 runs, both transfers done 5.1-5.3 s after the
        // clients started against a 4.8 s deadline; with k = 16, 2.7 s against 2.4 s). There a
        // miss passes if both transfers were done within 1.25 deadlines of the clients' start,
        // their process start-up included; on the host every deadline must be met.
        if tcg() && c["deadlines_missed"] == 1 {
            let limit = Duration::from_millis(DEADLINE_MS * k * 5 / 4);
            eprintln!("sender {i} missed its deadline under TCG; both done after {done:?} (limit {limit:?})");
            assert!(
                done <= limit,
                "sender {i} missed its deadline and the transfers took {done:?} (over {limit:?}): {c}"
            );
        } else {
            assert_eq!(c["deadlines_met"], 1, "sender {i} missed its deadline: {c}");
        }
        above += all - upto;
        grants += all;
    }
    // Each flow desires about 2.7 MB/s (400 KB in 150 ms); with two such flows on a 12.5 MB/s
    // link the router adds a fair share of the spare capacity, (C - D)/N, about 3.6 MB/s while
    // C holds near the line rate, so most grants exceed 4 MB/s (all divided by k; under TCG,
    // k = 32: 83 KB/s desired on a 390 KB/s link, a spare share of about 110 KB/s, grants
    // above 128 KB/s) (not the last ones: as a flow
    // gets ahead its desired rate falls, and a grant is at most 255 units of the request's
    // scale). Measured on the host (k = 1): 62-76% of the grants of both flows with the standing-queue filter;
    // 39-52% when the controller cut C on every burst it sampled in the queue, and the flows
    // finished at their deadline instead of a quarter early. The bound sits between; the
    // controller itself is pinned down on a recorded trace by the tests of
    // `common/src/d3/controller.rs`.
    //
    // Under emulation the bound is a plain majority: there the share also follows the
    // emulator's bursts, which the controller sees as queue. Measured with k = 16 (2.4 s
    // deadline): 52-85% on 6.1 (52, 74, 82, 85), 58-78% on 6.12 (58, 58, 73, 78); 52% in the run
    // that took twice as long as the others (the 2-core host at its busiest). With k = 32:
    // 52-97% on 6.1 and 6.12 (18 runs), and 44% (7 of 16) in one CI run on 6.12; so under
    // emulation a third of the grants must carry a share. The host keeps the 56% bound
    // (k = 2: 63-76%). Checked: with the fair share patched out of `process_request` (a
    // deadline flow granted r_t1 alone), 0 of 28 and 0 of 31 grants were above the bound
    // (host, PACELINE_D3_E2E_SCALE=32, the emulator's scale), and the test failed.
    let bound = if tcg() { 34 } else { 56 };
    eprintln!("{above} of {grants} grants above 4 MB/s / {k} (at least {bound}% wanted)");
    assert!(
        grants > 0 && above * 100 >= grants * bound,
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
    // One flow per transfer: a segment sent after a flow's FIN request (the TCP FIN, a
    // retransmission) must not register it again (until 2026-12-01 one did, and the closing
    // connection never returned it: 3 new flows here, and in the D3 experiment 1373 against
    // 813 FINs, which held N up and the fair share down).
    assert_eq!(l["new_flows"], 2, "one new flow per transfer: {l}");
    // Under TCG one run in eight saw one FIN request of two at the router, the other flow's
    // allocation returned by its lease (the counters drained above); the host requires both.
    let fins_wanted = if tcg() { 1 } else { 2 };
    assert!(
        l["fins"].as_u64().unwrap() >= fins_wanted,
        "{fins_wanted} or more flows returned their allocation with a FIN request: {l}"
    );
    drop(senders);
    drop(receiver);
    router.stop();
}

/// A rate as `ss` prints it (`1.2Mbps`, `980kbps`, `12bps`), bits/s.
fn ss_bps(v: &str) -> f64 {
    let v = v.strip_suffix("bps").unwrap_or_else(|| panic!("not a rate: {v}"));
    let (num, mult) = match v.chars().last() {
        Some('k') => (&v[..v.len() - 1], 1e3),
        Some('M') => (&v[..v.len() - 1], 1e6),
        Some('G') => (&v[..v.len() - 1], 1e9),
        Some('T') => (&v[..v.len() - 1], 1e12),
        _ => (v, 1.0),
    };
    num.parse::<f64>().unwrap_or_else(|_| panic!("not a rate: {v}")) * mult
}

/// A flow granted 0 pauses: it paces at one segment per RTT (each carrying its next request),
/// not at the first-RTT rate it started with (docs/d3.md, "Host side" and deviation 8).
///
/// The sender's line is 1 Gbit/s, so a flow without a deadline asks at the scale whose 255
/// units reach it: one unit is 524,288 bytes/s. The router's D3 capacity is 2 Mbit/s (250 KB/s):
/// every fair share, and the base rate, round down to 0 units, so every grant is 0. The
/// sender's first-RTT rate is 400 Mbit/s; until 2026-12-01 a zero grant was raised to it.
#[test]
fn a_zero_grant_pauses_the_sender_to_one_segment_per_rtt() {
    if !privileged("a_zero_grant_pauses_the_sender_to_one_segment_per_rtt") {
        return;
    }
    let sender = |ifname: &str| {
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
    - name: bulk
      level: all
      d3: {{}}
    - name: other
      level: all
  rules:
    - class: bulk
      protocol: tcp
      dst_port: 5601
  default_class: other
  d3:
    first_rtt_rate: 400Mbit
"#
        )
    };
    let tb = Testbed::new("d3_pause").expect("testbed");
    let star = tb
        .add_star(&StarSpec {
            senders: 1,
            bottleneck: Some(BottleneckSpec::htb(100_000_000, 150_000)),
            ..StarSpec::default()
        })
        .expect("star");
    let scratch = Scratch::new("d3pause");
    let (router, receiver) =
        router_and_receiver(&star, &scratch, |to_rx| router_policy_at(to_rx, 2_000_000, 1));
    let tx_if = star.senders[0].iface_to(&star.router).expect("tx iface").ifname;
    std::fs::write(scratch.path("tx.yaml"), sender(&tx_if)).unwrap();
    let tx = Agent::start(
        &star.senders[0],
        &scratch.path("tx.yaml"),
        &scratch.path("tx-state"),
    );
    let _server = star
        .receiver
        .spawn(&[PLLOAD, "serve", "--port", "5601"])
        .expect("server");
    std::thread::sleep(Duration::from_millis(500));
    let to = format!("{}:5601", star.receiver.ipv4());
    let client = star.senders[0]
        .spawn(&[PLLOAD, "bulk", "--to", &to, "--flows", "1", "--duration", "6"])
        .expect("client");
    // Grants arrive within a few RTTs; wait for some, then read the socket.
    tx.wait_for("grants to the bulk class", |s| {
        d3_class(s, "bulk")["grants"].as_u64().unwrap_or(0) >= 5
    });
    std::thread::sleep(Duration::from_millis(500));
    let ss = star.senders[0].run(&["ss", "-tin", "dport", "5601"]).expect("ss");
    drop(client);
    let s = tx.status().expect("status");
    let c = d3_class(&s, "bulk");
    let m = tx.http_get("/metrics");
    let g = "paceline_d3_granted_rate_bytes_per_second";
    let (zero, all) = (bucket(&m, g, "16384"), bucket(&m, g, "+Inf"));
    eprintln!("bulk class: {c}\ngrants below 16 KB/s: {zero} of {all}\nss: {ss}");
    assert!(all >= 5, "grants arrived: {c}");
    assert_eq!(zero, all, "every grant was 0 (below one unit):\n{m}");
    // `pacing_rate <current>/<max>`: the max is what sock_ops set.
    let pacing = ss
        .split_whitespace()
        .skip_while(|w| *w != "pacing_rate")
        .nth(1)
        .unwrap_or_else(|| panic!("no pacing_rate in ss output: {ss}"));
    let max = pacing
        .split_once('/')
        .map(|(_, m)| ss_bps(m))
        .unwrap_or_else(|| panic!("no max pacing rate in ss output: {ss}"));
    let mss: f64 = ss
        .split_whitespace()
        .find_map(|w| w.strip_prefix("mss:"))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no mss in ss output: {ss}"));
    // One segment per RTT, the RTT taken as at least 100 us: at most (mss + headers) * 8 bits
    // per 100 us, about 121 Mbit/s. The first-RTT rate would be 400 Mbit/s (383 of payload).
    let ceiling = (mss + 66.0) * 8.0 / 100e-6;
    eprintln!(
        "max pacing rate {:.1} Mbit/s, one segment per 100 us {:.1} Mbit/s",
        max / 1e6,
        ceiling / 1e6
    );
    assert!(
        max > 0.0 && max <= ceiling,
        "a flow granted 0 paces at one segment per RTT (at most {:.1} Mbit/s), not at the \
         first-RTT rate: max pacing rate {:.1} Mbit/s\n{ss}",
        ceiling / 1e6,
        max / 1e6
    );
    drop(tx);
    drop(receiver);
    router.stop();
}
