//! A real Prometheus (Debian's `prometheus`, installed by `scripts/bootstrap.sh --test`)
//! scraping three agents, each in its own network namespace, with `deploy/`'s recording and
//! alerting rules loaded: the reload-rejected alert fires when a bad policy reaches one agent
//! and clears when the file is fixed; the divergence alert fires during a staged rollout in a
//! group and clears when it completes; every Grafana panel's query returns data; `paceline
//! fleet status` reads the same inventory from Prometheus and from the agents' `/metrics`;
//! `paceline fleet report` over the test's period gives each host the times the test made:
//! the down time of an agent stopped for a known time, the rejected time of a bad policy left
//! in place for a known time, the policies applied, and ranks classes by drops and delay.
//!
//! To keep the run short, Prometheus scrapes and evaluates every second, and the rules' `for:`
//! durations are shortened to 2 s in the copy the test loads (the expressions are deploy/'s).

use std::{
    path::Path,
    time::{Duration, Instant},
};

use paceline_tests::{
    agent::{Agent, Scratch},
    testbed::{Host, Testbed},
};
use serde_json::Value;

use crate::privileged;

const AGENT: &str = env!("CARGO_BIN_EXE_plagent");

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// A policy with a rate-limited QJump level (level limit and epoch panels), DSCP, and, on the
/// router agent, a D3 class and a D3 router link (the D3 rows of the dashboard).
/// `interfaces: [auto]` (each node's default route leaves through its link to the monitor), so
/// the nodes of a group hold the very same file, as a rollout group does. A class rate, not a
/// per-flow rate: HTB enforces it where the kernel has no sch_fq, so no node is degraded.
fn policy(ifname: &str, class_rate: &str, d3: bool) -> String {
    let (class, d3spec) = if d3 {
        (
            "      d3:\n        deadline: 150ms\n        size: 400KB\n",
            format!("  d3:\n    router:\n      - interface: {ifname}\n        capacity: 100Mbit\n"),
        )
    } else {
        ("", String::new())
    };
    format!(
        r#"apiVersion: paceline/v1
kind: Policy
metadata:
  name: fleet
spec:
  interfaces: [auto]
  enforcement: auto
  link_rate: 1Gbit
  qjump: {{hosts: 4, max_packet: 9KB, link_rate: 1Gbit, switch_delay: 4us}}
  levels:
    - name: high
      priority: 6
      factor: 1
      dscp: 46
    - name: low
      priority: 0
  classes:
    - name: rpc
      level: high
      class_rate: {class_rate}
{class}    - name: other
      level: low
  rules:
    - class: rpc
      protocol: udp
      dst_port: 7001
  default_class: other
{d3spec}"#
    )
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'-' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

struct Prom<'a> {
    host: &'a Host,
}

impl Prom<'_> {
    fn get(&self, path: &str) -> Value {
        let (code, body) = Agent::request(self.host, "127.0.0.1:9090", "GET", path);
        assert_eq!(code, 200, "Prometheus {path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
    }

    fn query(&self, q: &str) -> Vec<Value> {
        let v = self.get(&format!("/api/v1/query?query={}", enc(q)));
        assert_eq!(v["status"], "success", "{q}: {v}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// Firing alerts named `name`: their labels.
    fn firing(&self, name: &str) -> Vec<Value> {
        let v = self.get("/api/v1/alerts");
        v["data"]["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["labels"]["alertname"] == name && a["state"] == "firing")
            .map(|a| a["labels"].clone())
            .collect()
    }

    fn wait(&self, what: &str, secs: u64, f: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !f(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

#[test]
fn prometheus_scrapes_agents_fires_and_clears_alerts_and_feeds_every_panel() {
    if !privileged("prometheus_scrapes_agents_fires_and_clears_alerts_and_feeds_every_panel") {
        return;
    }
    let Ok(prom_bin) = which("prometheus") else {
        crate::skip(
            "prometheus_scrapes_agents...",
            "Debian's prometheus is not installed (scripts/bootstrap.sh --test)",
        );
        return;
    };
    let test_start = Instant::now();
    let tb = Testbed::new("prom").expect("testbed");
    let m = tb.add_host("m").expect("monitor");
    let nodes: Vec<Host> = (1..=3)
        .map(|i| tb.add_host(&format!("n{i}")).expect("node"))
        .collect();
    for n in &nodes {
        tb.link(&m, n).expect("link");
        let via = m.iface_to(n).unwrap().ipv4.to_string();
        let dev = n.iface_to(&m).unwrap().ifname;
        n.run(&["ip", "route", "replace", "default", "via", &via, "dev", &dev])
            .expect("default route");
    }
    let scratch = Scratch::local("prom");
    // n1, n2: group main; n3: group canary, with D3 and a router link.
    let groups = ["main", "main", "canary"];
    let mut agents = Vec::new();
    let mut files = Vec::new();
    // n3's API asks for a token (the refused-requests panel has its series).
    let token = scratch.path("api-token");
    std::fs::write(&token, "0123456789abcdef0123456789abcdef").unwrap();
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    for (i, n) in nodes.iter().enumerate() {
        let ifname = n.iface_to(&m).unwrap().ifname;
        let file = scratch.path(&format!("n{}.yaml", i + 1));
        std::fs::write(&file, policy(&ifname, "10Mbit", i == 2)).unwrap();
        let state = scratch.path(&format!("state{}", i + 1));
        let mut extra = vec!["--metrics-addr", "0.0.0.0:9977"];
        if i == 2 {
            extra.extend(["--api-token-file", token.to_str().unwrap()]);
        }
        agents.push(Agent::start_with(n, &file, &state, &extra));
        files.push((file, ifname));
    }
    let target = |i: usize| format!("{}:9977", nodes[i].iface_to(&m).unwrap().ipv4);
    let sd: Vec<Value> = ["main", "canary"]
        .iter()
        .map(|g| {
            serde_json::json!({
                "targets": (0..3).filter(|i| groups[*i] == *g).map(target).collect::<Vec<_>>(),
                "labels": {"group": g},
            })
        })
        .collect();
    std::fs::write(
        scratch.path("targets.json"),
        serde_json::to_vec_pretty(&sd).unwrap(),
    )
    .unwrap();
    // deploy/'s rules, with every `for:` shortened.
    let rules = std::fs::read_to_string(repo().join("deploy/prometheus/paceline.rules.yaml")).unwrap();
    let rules: String = rules
        .lines()
        .map(|l| match l.trim_start().strip_prefix("for: ") {
            Some(_) => format!("{}for: 2s", &l[..l.len() - l.trim_start().len()]),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(scratch.path("rules.yaml"), rules).unwrap();
    // A second job, `synthetic`, scrapes an exporter of the test's own (see `Synthetic`).
    let synthetic = Synthetic::start(&m);
    let config = format!(
        r#"global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ["{rules}"]
scrape_configs:
  - job_name: paceline
    scrape_timeout: 1s
    file_sd_configs:
      - files: ["{targets}"]
        refresh_interval: 1s
  - job_name: synthetic
    scrape_timeout: 1s
    static_configs:
      - targets: ["{SYNTHETIC_ADDR}"]
"#,
        rules = scratch.path("rules.yaml").display(),
        targets = scratch.path("targets.json").display()
    );
    std::fs::write(scratch.path("prometheus.yml"), config).unwrap();
    let check = std::process::Command::new("promtool")
        .args(["check", "config"])
        .arg(scratch.path("prometheus.yml"))
        .output()
        .expect("promtool");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let _prometheus = m
        .spawn(&[
            prom_bin.as_str(),
            &format!("--config.file={}", scratch.path("prometheus.yml").display()),
            &format!("--storage.tsdb.path={}", scratch.path("tsdb").display()),
            "--web.listen-address=127.0.0.1:9090",
            "--log.level=warn",
        ])
        .expect("prometheus");
    let p = Prom { host: &m };
    let ready = Instant::now() + Duration::from_secs(30);
    while Agent::request_opt(&m, "127.0.0.1:9090", "/-/ready").is_none_or(|c| c != 200) {
        assert!(Instant::now() < ready, "Prometheus did not become ready");
        std::thread::sleep(Duration::from_millis(300));
    }
    p.wait("three agents up", 30, |p| {
        p.query("up{job=\"paceline\"} == 1").len() == 3
    });
    // Traffic in the rpc class of every node, so the rates have something to show.
    for n in &nodes {
        let to = m.iface_to(n).unwrap().ipv4;
        n.in_netns(move || {
            let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
            for _ in 0..200 {
                let _ = s.send_to(&[0u8; 300], (to, 7001));
            }
        })
        .unwrap();
    }
    // A few scrapes, so every rate and increase has two samples.
    std::thread::sleep(Duration::from_secs(5));

    // Every Grafana panel's query returns data.
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("deploy/grafana/paceline-dashboard.json")).unwrap(),
    )
    .unwrap();
    // Series that only some qdiscs have: fq's throttled count (this kernel may have no sch_fq,
    // and then the root qdisc is htb). The panel's other queries must still answer.
    // Likewise the pacing-delay histograms: without fq the agent enforces class and level rates
    // with HTB and runs no EDT clock in the datapath, so no packet has a pacing delay.
    let fq_only =
        |e: &str| e.contains("paceline_qdisc_throttled_total") || e.contains("_pacing_delay_seconds");
    let mut empty = Vec::new();
    let mut n_queries = 0;
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "15s")
                .replace("$instance", ".*")
                .replace("$class", ".*")
                .replace("$level", ".*")
                .replace("$interface", ".*")
                .replace("$group", ".*");
            n_queries += 1;
            if fq_only(&expr) && !paceline::kernel::features::Features::probe().sch_fq {
                continue;
            }
            if p.query(&expr).is_empty() {
                empty.push(format!("{}: {expr}", panel["title"]));
            }
        }
    }
    assert!(empty.is_empty(), "panels without data:\n{}", empty.join("\n"));
    eprintln!("{n_queries} panel queries, every one with data");
    // The recording rules evaluate.
    p.wait("the recording rules", 20, |p| {
        !p.query("hash:paceline_policy_info:count").is_empty()
    });

    // A bad policy reaches n2: the reload-rejected alert fires for n2 only, and clears when
    // the file is fixed.
    let (f2, if2) = &files[1];
    let good2 = std::fs::read_to_string(f2).unwrap();
    std::fs::write(f2, good2.replace("link_rate", "lnk_rate")).unwrap();
    let bad_written = Instant::now();
    p.wait("PacelinePolicyReloadRejected firing", 30, |p| {
        let f = p.firing("PacelinePolicyReloadRejected");
        f.len() == 1 && f[0]["instance"] == target(1).as_str()
    });
    std::fs::write(f2, &good2).unwrap();
    let rejected_for = bad_written.elapsed().as_secs_f64();
    p.wait("PacelinePolicyReloadRejected to clear", 30, |p| {
        p.firing("PacelinePolicyReloadRejected").is_empty()
    });

    // Group main holds one policy (n1 and n2 the same file): no divergence so far.
    assert!(
        p.firing("PacelinePolicyDivergent").is_empty(),
        "{:?}",
        p.firing("PacelinePolicyDivergent")
    );
    let (code, out) = m
        .command(AGENT)
        .args(["fleet", "status", "--prometheus", "http://127.0.0.1:9090"])
        .output()
        .map(|o| (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned()))
        .unwrap();
    assert_eq!(code, Some(0), "converged and healthy before the rollout:\n{out}");

    // A staged rollout in group main: n1 first. The group runs two policies: the divergence
    // alert fires for group main (not canary), and fleet status flags it with exit 1.
    let (f1, if1) = &files[0];
    std::fs::write(f1, policy(if1, "20Mbit", false)).unwrap();
    p.wait("PacelinePolicyDivergent firing", 30, |p| {
        let f = p.firing("PacelinePolicyDivergent");
        f.len() == 1 && f[0]["group"] == "main"
    });
    let fleet = |args: &[&str]| {
        let o = m
            .command(AGENT)
            .args(["fleet", "status"])
            .args(args)
            .output()
            .unwrap();
        (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let (code, out) = fleet(&["--prometheus", "http://127.0.0.1:9090"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("group main: 2 policies in force"), "{out}");
    let targets = scratch.path("targets.json");
    let (code, out) = fleet(&["--targets", targets.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("group main: 2 policies in force"), "{out}");
    // The rollout completes: one policy per group again.
    std::fs::write(f2, policy(if2, "20Mbit", false)).unwrap();
    p.wait("PacelinePolicyDivergent to clear", 30, |p| {
        p.firing("PacelinePolicyDivergent").is_empty()
    });
    p.wait("fleet status to converge", 20, |_| {
        fleet(&["--prometheus", "http://127.0.0.1:9090"]).0 == Some(0)
    });
    let (code, out) = fleet(&["--targets", targets.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(out.lines().filter(|l| l.contains(":9977")).count(), 3, "{out}");
    // An agent that stops is unreachable: exit 2.
    agents.remove(0).stop();
    let stopped = Instant::now();
    let (code, out) = fleet(&["--targets", targets.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("UNREACHABLE"), "{out}");

    // The report over the whole test: n1 down since it stopped, n2 rejected for as long as the
    // bad file stood, one policy applied on n1 (the rollout), none on n3, and the synthetic
    // exporter's classes ranked. Prometheus scrapes every second and the report counts to a
    // second: each time is allowed 3 s (a scrape's timeout, the agent's reaction to the file,
    // the step) either way. Checked once: with the report's down count patched to 0, this
    // failed at "n1's down time: 0 s in the report, 6.0 s in the test".
    synthetic.serve_counters();
    std::thread::sleep(Duration::from_secs(6));
    let down_for = stopped.elapsed().as_secs_f64();
    let since = format!("{}s", test_start.elapsed().as_secs() + 10);
    let report = |args: &[&str]| {
        let o = m
            .command(AGENT)
            .args([
                "fleet",
                "report",
                "--prometheus",
                "http://127.0.0.1:9090",
                "--since",
                &since,
            ])
            .args(args)
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, json, err) = report(&["--json"]);
    assert_eq!(code, Some(0), "{json}{err}");
    let r: Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    let host = |i: usize| -> Value {
        r["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["instance"] == target(i).as_str())
            .unwrap_or_else(|| panic!("no n{} in the report: {json}", i + 1))
            .clone()
    };
    let near = |what: &str, got: &Value, want: f64| {
        let got = got.as_f64().unwrap_or_else(|| panic!("{what}: {got}"));
        assert!(
            (got - want).abs() <= 3.0,
            "{what}: {got} s in the report, {want:.1} s in the test\n{json}"
        );
    };
    assert_eq!(r["hosts"].as_array().unwrap().len(), 3, "{json}");
    near("n1's down time", &host(0)["down_seconds"], down_for);
    near("n2's rejected time", &host(1)["rejected_seconds"], rejected_for);
    near("n2's down time", &host(1)["down_seconds"], 0.0);
    near("n3's down time", &host(2)["down_seconds"], 0.0);
    near("n3's rejected time", &host(2)["rejected_seconds"], 0.0);
    assert_eq!(
        host(0)["policy_changes"],
        1,
        "n1 applied the rollout's policy once: {json}"
    );
    assert_eq!(host(2)["policy_changes"], 0, "n3's policy never changed: {json}");
    assert!(host(2)["availability"].as_f64().unwrap() > 0.99, "{json}");
    assert!(host(0)["availability"].as_f64().unwrap() < 1.0, "{json}");
    assert_eq!(r["groups"]["canary"].as_array().map(Vec::len), Some(1), "{json}");
    // The agents dropped nothing (this kernel's classes are HTB's): no top classes in job
    // paceline; the synthetic job's are ranked by what Prometheus computed from its counters.
    assert_eq!(r["top_drops"].as_array().map(Vec::len), Some(0), "{json}");
    let (code, json, err) = report(&["--json", "--job", "synthetic"]);
    assert_eq!(code, Some(0), "{json}{err}");
    let r: Value = serde_json::from_str(&json).unwrap();
    let classes = |k: &str| -> Vec<String> {
        r[k].as_array()
            .unwrap()
            .iter()
            .map(|c| c["class"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(classes("top_drops"), ["bulk", "web"], "{json}");
    assert_eq!(classes("top_delay"), ["web", "bulk"], "{json}");
    // The Markdown names every host; an unreachable Prometheus is exit 2.
    let (code, md, err) = report(&[]);
    assert_eq!(code, Some(0), "{md}{err}");
    for i in 0..3 {
        assert!(md.contains(&target(i)), "{md}");
    }
    assert!(
        md.contains("## Availability") && md.contains("group canary: converged"),
        "{md}"
    );
    let o = m
        .command(AGENT)
        .args(["fleet", "report", "--prometheus", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
    // The synthetic exporter's names are the agent's own (they would drift unseen otherwise).
    let (code, metrics) = Agent::request(&nodes[1], "127.0.0.1:9977", "GET", "/metrics");
    assert_eq!(code, 200);
    for name in Synthetic::NAMES {
        assert!(
            metrics.contains(&format!("# TYPE {name} counter")),
            "the agent exports no {name}"
        );
    }
    for a in agents {
        a.stop();
    }
}

/// Where the synthetic exporter listens, in the monitor's namespace.
const SYNTHETIC_ADDR: &str = "127.0.0.1:9979";

/// An exporter of the test's own, scraped as job `synthetic`: the report's top classes need
/// drops and added delay, and this host's agents make none (without sch_fq, classes are HTB's
/// and the datapath runs no clock that could drop or delay). It serves nothing until
/// [`Synthetic::serve_counters`], so the alerting rules see no drops while the test checks
/// them; then two classes' counters that grow at every scrape: `bulk` drops 50 and delays
/// 0.01 s, `web` drops 5 and delays 0.2 s.
struct Synthetic {
    on: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Synthetic {
    const NAMES: [&str; 2] = [
        "paceline_class_dropped_packets_total",
        "paceline_class_added_delay_seconds_total",
    ];

    fn start(m: &Host) -> Self {
        use std::io::{Read as _, Write as _};
        let listener = m
            .in_netns(|| std::net::TcpListener::bind(SYNTHETIC_ADDR))
            .unwrap()
            .expect("the synthetic exporter's port");
        let on = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let serving = on.clone();
        std::thread::spawn(move || {
            let mut scrapes = 0u64;
            for conn in listener.incoming() {
                let Ok(mut c) = conn else { continue };
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                let body = if serving.load(std::sync::atomic::Ordering::Relaxed) {
                    scrapes += 1;
                    let n = scrapes as f64;
                    format!(
                        "# TYPE {d} counter\n{d}{{class=\"bulk\",level=\"low\",reason=\"horizon\"}} {}\n{d}{{class=\"web\",level=\"high\",reason=\"codel\"}} {}\n# TYPE {a} counter\n{a}{{class=\"bulk\",level=\"low\"}} {}\n{a}{{class=\"web\",level=\"high\"}} {}\n",
                        50.0 * n,
                        5.0 * n,
                        0.01 * n,
                        0.2 * n,
                        d = Self::NAMES[0],
                        a = Self::NAMES[1],
                    )
                } else {
                    String::new()
                };
                let _ = write!(
                    c,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Synthetic { on }
    }

    fn serve_counters(&self) {
        self.on.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

fn which(name: &str) -> Result<String, ()> {
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return Ok(p.display().to_string());
        }
    }
    Err(())
}
