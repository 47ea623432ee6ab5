//! D3's benefit, not only its machinery: in the same run, the partition-aggregate workload of
//! the D3 paper (`cargo xtask bench d3`: responses of 2-50 KB with exponential deadlines from
//! N workers through one 100 KB bottleneck) beside two long background flows, once with plain
//! TCP and once with D3 (senders, router and aggregator running the agent), and D3 must meet
//! clearly more deadlines.
//!
//! Host only. Under emulation (the VMs of `cargo xtask test`, qemu TCG) the emulator sets the
//! timing, not the network: a 400 Mbit/s bottleneck is beyond it, and a slowed-down run needs
//! minutes per mode. It is the lab's test (it runs the D3 experiment), so `cargo xtask test`'s
//! VM runs, which take the test crate's suite, do not include it; run under TCG it says SKIPPED.

use paceline_lab::experiments::{Common, d3};
use serde_json::Value;

use paceline_tests::gate::{privileged, under_tcg};

/// The share of responses each mode met, from the experiment's `d3.json`.
fn app_throughput(doc: &Value, mode: &str) -> (f64, u64) {
    let r = doc["results"]
        .as_array()
        .and_then(|a| a.iter().find(|r| r["tags"]["mode"] == mode))
        .unwrap_or_else(|| panic!("no {mode} point in d3.json"));
    let s = &r["summary"];
    assert!(r.get("error").is_none(), "{mode} failed: {}", r["error"]);
    (
        s["app_throughput"].as_f64().expect("app_throughput"),
        s["responses"].as_u64().expect("responses"),
    )
}

/// N = 10 workers with deadlines of mean 30 ms at a 400 Mbit/s bottleneck: plain TCP's
/// background flows keep its 100 KB buffer full, and responses wait behind them or lose
/// packets (RTOs of 200 ms); D3's background flows ask for no more than the capacity the
/// deadline flows leave, at a rate TCP paces to.
///
/// Measured on this 2-core shared machine (2026-12-03), 1200 responses per mode: TCP met
/// 66.2% and 66.8%, D3 76.9% and 75.9% (about 10 points more). With 300 responses per mode the
/// gap ranged from 2 to 12 points between runs (TCP's share swings with when its RTOs fall and
/// with the machine's steal), so the test scores 1200; the assertion asks for 5 points, half
/// the measured gap. At N = 5 the gap was 1-4 points that day: about 13% of the deadlines
/// (those under 4 ms) are shorter than this machine's floor for a response, and both modes
/// miss them, so little is left to win there.
///
/// Checked to fail without the mechanism (2026-12-03): run with the mode `paced` in place of
/// `d3` (the same agents pacing the same flows, no rate requests), this test failed with
/// 66.7% against TCP's 65.2%. It does not catch D3's first RTT as it was before 2026-12-02
/// (mode `d3-base-rate`: 70.5% against 64.7%, passing at ten senders); the bench shows that
/// change at N = 5.
#[test]
fn d3_meets_more_deadlines_than_tcp_beside_background_flows() {
    let test = "d3_meets_more_deadlines_than_tcp_beside_background_flows";
    if !privileged(test) {
        return;
    }
    if under_tcg() {
        eprintln!(
            "SKIPPED: {test}: under emulation the emulator, not the bottleneck, sets the timing (host only)"
        );
        return;
    }
    let out = std::env::temp_dir().join(format!("paceline-d3-effect-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let mut cfg = d3::Config::new(true);
    cfg.rate_bps = 400_000_000;
    cfg.sender_hosts = 8;
    cfg.senders = vec![10];
    cfg.deadline_means_ms = vec![30.0];
    cfg.plot_mean_ms = 30.0;
    cfg.responses_per_point = 1200;
    cfg.min_queries = 1;
    cfg.background_flows = 2;
    cfg.modes.retain(|m| m.name == "tcp" || m.name == "d3");
    assert_eq!(cfg.modes.len(), 2, "the quick plan has the tcp and d3 modes");
    let c = Common {
        out: out.clone(),
        quick: true,
        seed: 1,
    };
    d3::run_with(&c, &cfg).expect("the D3 experiment ran");
    let text = std::fs::read_to_string(out.join("d3.json")).expect("d3.json");
    let doc: Value = serde_json::from_str(&text).expect("d3.json parses");
    let (tcp, n_tcp) = app_throughput(&doc, "tcp");
    let (d3, n_d3) = app_throughput(&doc, "d3");
    eprintln!(
        "{test}: deadlines met: tcp {:.1}% of {n_tcp}, d3 {:.1}% of {n_d3}",
        tcp * 100.0,
        d3 * 100.0
    );
    assert!(
        n_tcp >= 250 && n_d3 >= 250,
        "too few responses scored: {n_tcp}, {n_d3}"
    );
    assert!(
        d3 >= tcp + 0.05,
        "D3 met {:.1}% of the deadlines, plain TCP {:.1}%: D3 should meet at least 5 points more",
        d3 * 100.0,
        tcp * 100.0
    );
    let _ = std::fs::remove_dir_all(&out);
}
