//! The deployment files in `deploy/` checked against the agent they deploy (no root, no
//! cluster, no Prometheus: structure and names; promtool/amtool add their own checks when
//! installed):
//! - every metric and label the Prometheus rules and the Grafana dashboard use is one the agent
//!   exports: the names come from `paceline::metrics::render` on a status that turns every
//!   optional family on (D3 classes, router links, rate-limited levels), cross-checked with the
//!   `paceline_*` literals of control/src/metrics/mod.rs;
//! - every alert has `for`, a severity, a summary, a description and a runbook section in
//!   docs/operations.md;
//! - the DaemonSet, the systemd unit and the Dockerfile run the agent with flags its command
//!   line accepts, mount or keep what it needs, and reload/stop it the way it expects;
//! - the policies shipped in deploy/ are valid, and their hash is the file's sha256.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
};

use clap::Parser as _;
use serde_json::{Value as Json, json};
use serde_yaml::Value as Yaml;

use paceline::{
    cli::{Cli, Command as Sub},
    d3router::LinkReport,
    kernel::datapath::Snapshot,
    status::Status,
};
use paceline_common::maps::{Counters, D3_HIST_BUCKETS, D3ClassStats, GlobalCounters};

// ------------------------------------------------------------------------------------------
// Files
// ------------------------------------------------------------------------------------------

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("control/ has a parent")
        .to_path_buf()
}

fn read(rel: &str) -> String {
    let p = repo().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

fn yaml(rel: &str) -> Yaml {
    serde_yaml::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel}: not YAML: {e}"))
}

/// Every YAML document of a file (kubectl-style `---` separators).
fn yaml_docs(rel: &str) -> Vec<Yaml> {
    let text = read(rel);
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| {
            <Yaml as serde::Deserialize>::deserialize(d).unwrap_or_else(|e| panic!("{rel}: not YAML: {e}"))
        })
        .filter(|v| !v.is_null())
        .collect()
}

fn s<'a>(v: &'a Yaml, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what}: expected a string, got {v:?}"))
}

fn seq<'a>(v: &'a Yaml, what: &str) -> &'a Vec<Yaml> {
    v.as_sequence()
        .unwrap_or_else(|| panic!("{what}: expected a list, got {v:?}"))
}

fn tool(name: &str) -> bool {
    Command::new(name)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

// ------------------------------------------------------------------------------------------
// What the agent exports
// ------------------------------------------------------------------------------------------

/// Labels Prometheus adds to every series of the paceline job: `job` and `instance`, and
/// `group`, which the shipped scrape configs set from the rollout group.
const TARGET_LABELS: &[&str] = &["job", "instance", "group"];

/// Metrics from other exporters that the rules may use, with their labels.
const FOREIGN: &[(&str, &[&str])] = &[
    ("up", &[]),
    (
        "kube_daemonset_status_desired_number_scheduled",
        &["namespace", "daemonset"],
    ),
    (
        "kube_daemonset_status_number_available",
        &["namespace", "daemonset"],
    ),
];

/// A status with every optional part on: two levels (one rate-limited with an epoch), three
/// classes (two with D3), D3 with a router link, a rejected last reload, the flow table's
/// memory known.
fn full_status() -> Status {
    serde_json::from_value(json!({
        "version": "0.1.0",
        "pid": 4242,
        "started_at": 1_700_000_000u64,
        "kernel": {
            "kernel_release": "6.1.0-test", "btf": true, "tcx": false, "sch_fq": true,
            "sch_htb": true, "clsact": true, "cgroup2": "/sys/fs/cgroup", "bpffs": "/sys/fs/bpf"
        },
        "degraded": ["no tcx: clsact"],
        "enforcement": {"mode": "fq", "tcp_flows": "fq", "udp_flows": "fq", "aggregates": "fq"},
        "interfaces": [{"name": "eth0", "attach": "clsact", "qdisc": "mq+fq"}],
        "policy": {
            "file": "/etc/paceline/policy.yaml", "name": "test", "hash": "ab".repeat(32),
            "generation": 3, "loaded_at": 1_700_000_100u64,
            "levels": [
                {"index": 0, "name": "latency", "priority": 5, "factor": 1.0, "epoch_seconds": 0.002,
                 "rate_bytes_per_second": 4_340_000u64, "dscp": 46, "pcp": 5},
                {"index": 1, "name": "bulk", "priority": 0, "factor": null, "epoch_seconds": null,
                 "rate_bytes_per_second": null, "dscp": null, "pcp": null}
            ],
            "classes": [
                {"index": 0, "name": "rpc", "level": "latency", "flow_rate_bytes_per_second": 12_500_000u64,
                 "class_rate_bytes_per_second": 125_000_000u64, "tcp_rto_min_us": 5000, "tcp_delack_max_us": 5000, "d3": true},
                {"index": 1, "name": "batch", "level": "bulk", "flow_rate_bytes_per_second": null,
                 "class_rate_bytes_per_second": null, "tcp_rto_min_us": null, "tcp_delack_max_us": null, "d3": true},
                {"index": 2, "name": "other", "level": "bulk", "flow_rate_bytes_per_second": null,
                 "class_rate_bytes_per_second": null, "tcp_rto_min_us": null, "tcp_delack_max_us": null, "d3": false}
            ],
            "default_class": "other",
            "warnings": []
        },
        "d3": {"receiver": true, "app_map": "/sys/fs/bpf/paceline/d3_app", "router_links": ["eth1"], "interval_us": 1000},
        "reloads": {"applied": 2, "rejected": 1, "last": {"at": 1_700_000_200u64, "applied": false, "errors": ["x"]}},
        "flow_table": {"capacity": 65536, "memlock_bytes": 7_000_000u64},
        "metrics_addr": "0.0.0.0:9977"
    }))
    .expect("a Status from JSON (did status.rs gain a required field?)")
}

/// `paceline::metrics::render` with every family populated.
fn rendered_metrics() -> String {
    let status = full_status();
    let c = Counters {
        packets: 10,
        bytes: 10_000,
        delayed_packets: 4,
        delay_ns: 4_000_000,
        drops_horizon: 1,
        tagged_packets: 3,
        tcp_sockets: 2,
        sockopt_errors: 1,
        drops_codel: 1,
        marks_codel: 2,
        delay_hist: {
            let mut h = [0; paceline_common::edt::DELAY_BUCKETS];
            h[0] = 6;
            h[12] = 4;
            h
        },
        held_by: [1, 2, 1],
    };
    let snap = Snapshot {
        classes: vec![c; 3],
        levels: vec![c; 2],
        global: GlobalCounters {
            non_ip: 1,
            truncated: 1,
            ipv6_ext_limit: 1,
            rewrite_errors: 1,
            flow_inserts: 9,
            ..Default::default()
        },
        trace: Default::default(),
        tracing: false,
        flow_entries: Some(4),
    };
    let mut d = D3ClassStats {
        flows: 5,
        deadline_flows: 4,
        met: 3,
        missed: 1,
        quenched: 1,
        requests: 9,
        grants: 8,
        echoes: 2,
        feedback_ignored: 1,
        ..Default::default()
    };
    d.requested = [1; D3_HIST_BUCKETS];
    d.granted = [1; D3_HIST_BUCKETS];
    let d3 = vec![d; 3];
    let links = vec![LinkReport {
        interface: "eth1".into(),
        capacity_bytes_per_second: 100_000_000,
        line_rate_bytes_per_second: 125_000_000,
        flows: 3,
        demand_bytes_per_second: 90_000_000,
        allocated_bytes_per_second: 80_000_000,
        requests: 100,
        fins: 2,
        new_flows: 3,
        clamped: 1,
        unprocessed: 1,
        base_floor: 0,
        short_grants: 2,
        duplicates: 4,
        sent_bytes: 1_000_000,
        idle_resets: 1,
        lease_renewals: 3,
        queue_bytes: 1500,
        standing_queue_bytes: 0,
    }];
    let ops = paceline::metrics::OpsMetrics {
        qdiscs: vec![(
            "eth0".into(),
            paceline::kernel::qstats::RootStats {
                kind: "mq".into(),
                backlog_bytes: 3000,
                qlen: 2,
                drops: 1,
                overlimits: 5,
                requeues: 1,
                throttled: Some(7),
            },
        )],
        interfaces_attached: 1,
        interfaces_detached: 1,
        history_generation: 4,
        sock_ops: true,
        api_refused: Some((2, 1)),
        kernel_memory: Some(paceline::kernel::memory::summarize([
            (1, "PL_FLOWS".to_string(), 9_962_368),
            (2, "PL_CTAB_FAST".to_string(), 8_392_704),
            (3, "PL_CPU".to_string(), 1_000_000),
        ])),
    };
    paceline::metrics::render_with(&snap, Some(&d3), &links, &status, &ops).expect("render")
}

/// Metric name -> label names, from the text exposition (histograms give their `_bucket`,
/// `_sum` and `_count` series as the encoder writes them).
fn exported() -> BTreeMap<String, BTreeSet<String>> {
    let text = rendered_metrics();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..end];
        let labels = out.entry(name.to_string()).or_default();
        if line[end..].starts_with('{') {
            let close = line.rfind('}').expect("closing brace");
            // Values are label values: they hold no `="` in these tests' data.
            for part in line[end + 1..close].split("\",") {
                if let Some((k, _)) = part.split_once("=\"") {
                    labels.insert(k.trim_matches(',').to_string());
                }
            }
        }
    }
    out
}

/// The `paceline_*` string literals of metrics.rs: what `render` can ever emit.
fn names_in_metrics_rs() -> BTreeSet<String> {
    let text = read("control/src/metrics/mod.rs");
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("\"paceline_") {
        let rest = &text[i + 1..];
        let end = rest.find('"').expect("closing quote");
        out.insert(rest[..end].to_string());
    }
    out
}

#[test]
fn rendered_metrics_cover_every_name_in_metrics_rs() {
    let exp = exported();
    let histograms = [
        "paceline_d3_requested_rate_bytes_per_second",
        "paceline_d3_granted_rate_bytes_per_second",
        "paceline_class_pacing_delay_seconds",
        "paceline_level_pacing_delay_seconds",
    ];
    for name in names_in_metrics_rs() {
        if histograms.contains(&name.as_str()) {
            for suffix in ["_bucket", "_count", "_sum"] {
                assert!(
                    exp.contains_key(&format!("{name}{suffix}")),
                    "{name}{suffix} not rendered"
                );
            }
        } else {
            assert!(
                exp.contains_key(&name),
                "{name} is in metrics.rs but the test's status does not render it: extend full_status()"
            );
        }
    }
    assert!(exp["paceline_class_dropped_packets_total"].contains("reason"));
    assert!(exp["paceline_level_dropped_packets_total"].contains("reason"));
    assert!(exp["paceline_class_pacing_delay_seconds_bucket"].contains("le"));
    assert!(exp["paceline_d3_granted_rate_bytes_per_second_bucket"].contains("le"));
}

// ------------------------------------------------------------------------------------------
// A small PromQL reader: metric names, their matchers, grouping labels
// ------------------------------------------------------------------------------------------

#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    Str,
    Num,
    Var,
    Punct(char),
}

fn lex(expr: &str) -> Vec<Tok> {
    let b: Vec<char> = expr.chars().collect();
    let mut i = 0;
    let mut out = Vec::new();
    while i < b.len() {
        let c = b[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '#' {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '"' || c == '\'' || c == '`' {
            i += 1;
            while i < b.len() && b[i] != c {
                if b[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push(Tok::Str);
        } else if c == '$' {
            // Grafana variables: $instance, ${var}, $__rate_interval.
            i += 1;
            if i < b.len() && b[i] == '{' {
                while i < b.len() && b[i] != '}' {
                    i += 1;
                }
                i += 1;
            } else {
                while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                    i += 1;
                }
            }
            out.push(Tok::Var);
        } else if c.is_ascii_digit() || (c == '.' && b.get(i + 1).is_some_and(|d| d.is_ascii_digit())) {
            // Numbers and durations (5m, 1e-3, 0.101).
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '.' || b[i] == '_') {
                if (b[i] == 'e' || b[i] == 'E') && matches!(b.get(i + 1), Some('-') | Some('+')) {
                    i += 1;
                }
                i += 1;
            }
            out.push(Tok::Num);
        } else if c.is_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_' || b[i] == ':') {
                i += 1;
            }
            out.push(Tok::Ident(b[start..i].iter().collect()));
        } else {
            out.push(Tok::Punct(c));
            i += 1;
        }
    }
    out
}

const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "group",
];
const GROUPING: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];
const KEYWORDS: &[&str] = &[
    "and", "or", "unless", "bool", "offset", "inf", "nan", "Inf", "NaN",
];

/// A selector `name{label op "value", ...}` found in an expression.
#[derive(Debug)]
struct Selector {
    name: String,
    labels: Vec<String>,
}

#[derive(Debug, Default)]
struct Parsed {
    selectors: Vec<Selector>,
    /// Labels named in by/without/on/ignoring/group_left/group_right.
    grouping: Vec<String>,
}

fn parse_promql(expr: &str) -> Parsed {
    let t = lex(expr);
    let mut p = Parsed::default();
    let mut i = 0;
    while i < t.len() {
        match &t[i] {
            Tok::Ident(id) if GROUPING.contains(&id.as_str()) => {
                i += 1;
                if t.get(i) == Some(&Tok::Punct('(')) {
                    i += 1;
                    while i < t.len() && t[i] != Tok::Punct(')') {
                        if let Tok::Ident(l) = &t[i] {
                            p.grouping.push(l.clone());
                        }
                        i += 1;
                    }
                }
            }
            Tok::Ident(id) if AGGREGATIONS.contains(&id.as_str()) || KEYWORDS.contains(&id.as_str()) => {
                i += 1
            }
            // A function call.
            Tok::Ident(_) if t.get(i + 1) == Some(&Tok::Punct('(')) => i += 1,
            Tok::Ident(name) => {
                let mut sel = Selector {
                    name: name.clone(),
                    labels: Vec::new(),
                };
                i += 1;
                if t.get(i) == Some(&Tok::Punct('{')) {
                    i += 1;
                    while i < t.len() && t[i] != Tok::Punct('}') {
                        if let Tok::Ident(l) = &t[i]
                            && matches!(t.get(i + 1), Some(Tok::Punct('=' | '!')))
                        {
                            sel.labels.push(l.clone());
                        }
                        i += 1;
                    }
                }
                p.selectors.push(sel);
            }
            Tok::Punct('{') => panic!("{expr}: a selector without a metric name"),
            _ => i += 1,
        }
    }
    p
}

#[test]
fn the_promql_reader_finds_names_labels_and_grouping() {
    let p = parse_promql(
        r#"sum by (job, instance) (rate(paceline_class_packets_total{class=~"$class", level!="x"}[$__rate_interval])) / on (instance) group_left () max(up{job="paceline"}) > 0.5e-3 and instance_x:y:rate5m"#,
    );
    let names: Vec<&str> = p.selectors.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["paceline_class_packets_total", "up", "instance_x:y:rate5m"]
    );
    assert_eq!(p.selectors[0].labels, ["class", "level"]);
    assert_eq!(p.grouping, ["job", "instance", "instance"]);
}

/// Checks one expression; `records` maps recording-rule names to the labels their series
/// may carry. Returns the metric names it uses.
fn check_expr(
    where_: &str,
    expr: &str,
    exp: &BTreeMap<String, BTreeSet<String>>,
    records: &BTreeMap<String, BTreeSet<String>>,
) -> BTreeSet<String> {
    let p = parse_promql(expr);
    assert!(!p.selectors.is_empty(), "{where_}: no metric in {expr:?}");
    let mut available: BTreeSet<String> = TARGET_LABELS.iter().map(|s| s.to_string()).collect();
    let mut used = BTreeSet::new();
    for sel in &p.selectors {
        let labels: BTreeSet<String> = if let Some(l) = exp.get(&sel.name) {
            l.clone()
        } else if let Some(l) = records.get(&sel.name) {
            l.clone()
        } else if let Some((_, l)) = FOREIGN.iter().find(|(n, _)| *n == sel.name) {
            l.iter().map(|s| s.to_string()).collect()
        } else if sel.name.starts_with("paceline_") {
            panic!(
                "{where_}: {} is not a metric the agent exports (control/src/metrics/mod.rs)",
                sel.name
            )
        } else if sel.name.contains(':') {
            panic!(
                "{where_}: recording rule {} is not defined in deploy/prometheus/paceline.rules.yaml",
                sel.name
            )
        } else {
            panic!(
                "{where_}: {} is neither an agent metric nor a known foreign one",
                sel.name
            )
        };
        for l in &sel.labels {
            assert!(
                labels.contains(l) || TARGET_LABELS.contains(&l.as_str()) || l == "__name__",
                "{where_}: {} has no label {l:?} (it has {labels:?} plus {TARGET_LABELS:?})",
                sel.name
            );
        }
        // The d3 histograms carry no sum (the kernel keeps none): _sum is NaN.
        assert!(
            !(sel.name.starts_with("paceline_d3_") && sel.name.ends_with("_sum")),
            "{where_}: {} is always NaN; use _bucket or _count",
            sel.name
        );
        available.extend(labels);
        used.insert(sel.name.clone());
    }
    for l in &p.grouping {
        assert!(
            available.contains(l),
            "{where_}: groups by {l:?}, which none of {used:?} carries"
        );
    }
    used
}

// ------------------------------------------------------------------------------------------
// Prometheus rules
// ------------------------------------------------------------------------------------------

const RULES: &str = "deploy/prometheus/paceline.rules.yaml";

/// GitHub's anchor of a Markdown heading.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn doc_anchors() -> BTreeSet<String> {
    read("docs/operations.md")
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect()
}

/// Recording rule name -> the labels of what it records (those of the metrics it reads).
fn recording_rules(exp: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    for g in seq(&yaml(RULES)["groups"], "groups") {
        for r in seq(&g["rules"], "rules") {
            if let Some(name) = r["record"].as_str() {
                let p = parse_promql(s(&r["expr"], name));
                let mut labels = BTreeSet::new();
                for sel in p.selectors {
                    labels.extend(exp.get(&sel.name).cloned().unwrap_or_default());
                }
                out.insert(name.to_string(), labels);
            }
        }
    }
    out
}

#[test]
fn rules_use_only_exported_metrics_and_labels() {
    let exp = exported();
    let records = recording_rules(&exp);
    let mut used = BTreeSet::new();
    let mut alerts = 0;
    for g in seq(&yaml(RULES)["groups"], "groups") {
        for r in seq(&g["rules"], "rules") {
            let name = r["alert"]
                .as_str()
                .or(r["record"].as_str())
                .expect("a rule is an alert or a record");
            used.extend(check_expr(name, s(&r["expr"], name), &exp, &records));
            alerts += r["alert"].is_string() as usize;
        }
    }
    assert!(alerts >= 10, "{alerts} alerts");
    for m in [
        "up",
        "paceline_policy_last_reload_success",
        "paceline_enforcement_degraded",
        "paceline_class_dropped_packets_total",
        "paceline_unparsed_packets_total",
        "paceline_class_tcp_sockopt_errors_total",
        "paceline_d3_deadlines_missed_total",
        "paceline_d3_link_queue_bytes",
        "paceline_d3_link_capacity_bytes_per_second",
    ] {
        assert!(used.contains(m), "no rule watches {m}");
    }
}

#[test]
fn every_alert_has_for_severity_summary_and_a_runbook() {
    let anchors = doc_anchors();
    let mut names = BTreeSet::new();
    for g in seq(&yaml(RULES)["groups"], "groups") {
        for r in seq(&g["rules"], "rules") {
            let Some(name) = r["alert"].as_str() else { continue };
            assert!(names.insert(name.to_string()), "alert {name} defined twice");
            let f = s(&r["for"], &format!("{name}: for"));
            let (n, unit) = f.split_at(f.len() - 1);
            assert!(
                n.parse::<u32>().is_ok_and(|n| n > 0) && ["s", "m", "h"].contains(&unit),
                "{name}: for: {f:?}"
            );
            let sev = s(&r["labels"]["severity"], &format!("{name}: labels.severity"));
            assert!(
                ["critical", "warning", "info"].contains(&sev),
                "{name}: severity {sev:?}"
            );
            for a in ["summary", "description"] {
                assert!(
                    !s(&r["annotations"][a], &format!("{name}: annotations.{a}"))
                        .trim()
                        .is_empty(),
                    "{name}: empty {a}"
                );
            }
            let rb = s(
                &r["annotations"]["runbook_url"],
                &format!("{name}: annotations.runbook_url"),
            );
            let frag = rb
                .strip_prefix("docs/operations.md#")
                .unwrap_or_else(|| panic!("{name}: runbook_url {rb:?} is not docs/operations.md#..."));
            assert_eq!(
                frag,
                name.to_lowercase(),
                "{name}: the runbook anchor is the alert's name"
            );
            assert!(
                anchors.contains(frag),
                "{name}: docs/operations.md has no heading for #{frag}"
            );
        }
    }
}

#[test]
fn prometheusrule_holds_the_same_groups_as_the_rules_file() {
    let cr = yaml("deploy/kubernetes/monitoring/prometheusrule.yaml");
    assert_eq!(cr["kind"], "PrometheusRule");
    assert_eq!(
        cr["spec"]["groups"],
        yaml(RULES)["groups"],
        "deploy/kubernetes/monitoring/prometheusrule.yaml is stale: regenerate it (command in its header)"
    );
}

#[test]
fn promtool_checks_and_unit_tests_the_rules() {
    if !tool("promtool") {
        println!("SKIPPED: promtool not installed (apt-get install prometheus)");
        return;
    }
    let dir = repo().join("deploy/prometheus");
    for args in [
        &["check", "rules", "paceline.rules.yaml"][..],
        &["test", "rules", "paceline.rules.test.yaml"],
        &["check", "config", "prometheus.example.yaml"],
    ] {
        let o = Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("promtool");
        assert!(
            o.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // The dashboard's queries too, as recording rules with the Grafana variables filled in.
    let mut rules = Vec::new();
    for (i, (_, expr)) in dashboard_exprs().iter().enumerate() {
        if expr.starts_with("label_values(") {
            continue;
        }
        let e = expr.replace("$__rate_interval", "5m").replace(['$'], "var_");
        rules.push(json!({"record": format!("dashboard:query:{i}"), "expr": e}));
    }
    let file = std::env::temp_dir().join(format!("paceline-dashboard-rules-{}.yaml", std::process::id()));
    std::fs::write(
        &file,
        serde_yaml::to_string(&json!({"groups": [{"name": "dashboard", "rules": rules}]})).unwrap(),
    )
    .unwrap();
    let o = Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(&file)
        .output()
        .expect("promtool");
    let _ = std::fs::remove_file(&file);
    assert!(
        o.status.success(),
        "dashboard queries:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn alertmanager_example_groups_by_alertname_and_instance() {
    let am = yaml("deploy/alertmanager/example.yaml");
    let receivers: BTreeSet<&str> = seq(&am["receivers"], "receivers")
        .iter()
        .map(|r| s(&r["name"], "receiver name"))
        .collect();
    fn walk<'a>(route: &'a Yaml, out: &mut Vec<&'a Yaml>) {
        out.push(route);
        for r in route["routes"].as_sequence().into_iter().flatten() {
            walk(r, out);
        }
    }
    let mut routes = Vec::new();
    walk(&am["route"], &mut routes);
    for r in &routes {
        if let Some(rcv) = r["receiver"].as_str() {
            assert!(receivers.contains(rcv), "route to undefined receiver {rcv}");
        }
    }
    let gb: Vec<&str> = seq(&am["route"]["group_by"], "group_by")
        .iter()
        .map(|v| s(v, "group_by"))
        .collect();
    assert!(
        gb.contains(&"alertname") && gb.contains(&"instance"),
        "group_by {gb:?}"
    );
    let paceline = routes
        .iter()
        .find(|r| r["receiver"] == "paceline-oncall")
        .expect("a route for paceline's alerts");
    assert!(
        seq(&paceline["matchers"], "matchers")
            .iter()
            .any(|m| s(m, "matcher").contains("Paceline"))
    );
    if tool("amtool") {
        let o = Command::new("amtool")
            .args(["check-config", "example.yaml"])
            .current_dir(repo().join("deploy/alertmanager"))
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "amtool:\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    } else {
        println!("SKIPPED: amtool not installed (apt-get install prometheus-alertmanager)");
    }
}

// ------------------------------------------------------------------------------------------
// Grafana
// ------------------------------------------------------------------------------------------

const DASHBOARD: &str = "deploy/grafana/paceline-dashboard.json";

fn dashboard() -> Json {
    serde_json::from_str(&read(DASHBOARD)).unwrap_or_else(|e| panic!("{DASHBOARD}: not JSON: {e}"))
}

fn all_panels(d: &Json) -> Vec<&Json> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        out.push(p);
        out.extend(p["panels"].as_array().into_iter().flatten());
    }
    out
}

/// (where, expression) of every panel target and query variable.
fn dashboard_exprs() -> Vec<(String, String)> {
    let d = dashboard();
    let mut out = Vec::new();
    for p in all_panels(&d) {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(e) = t["expr"].as_str() {
                out.push((format!("panel {:?} {}", p["title"], t["refId"]), e.to_string()));
            }
        }
    }
    for a in d["annotations"]["list"].as_array().into_iter().flatten() {
        if let Some(e) = a["expr"].as_str() {
            out.push((format!("annotation {}", a["name"]), e.to_string()));
        }
    }
    for v in d["templating"]["list"].as_array().expect("templating.list") {
        if v["type"] == "query" {
            let q = v["query"]["query"]
                .as_str()
                .or(v["query"].as_str())
                .expect("query variable");
            out.push((format!("variable {}", v["name"]), q.to_string()));
        }
    }
    out
}

#[test]
fn dashboard_queries_use_only_exported_metrics_and_labels() {
    let exp = exported();
    let records = recording_rules(&exp);
    let mut used = BTreeSet::new();
    for (where_, expr) in dashboard_exprs() {
        if let Some(inner) = expr
            .strip_prefix("label_values(")
            .and_then(|e| e.strip_suffix(')'))
        {
            let (sel, label) = inner.rsplit_once(',').expect("label_values(selector, label)");
            let names = check_expr(&where_, sel, &exp, &records);
            let label = label.trim();
            let name = names.iter().next().unwrap();
            assert!(
                exp[name].contains(label) || TARGET_LABELS.contains(&label),
                "{where_}: {name} has no label {label}"
            );
            used.extend(names);
        } else {
            used.extend(check_expr(&where_, &expr, &exp, &records));
        }
    }
    // Every family the agent exports is on the dashboard somewhere.
    for name in exp.keys() {
        let family = ["_bucket", "_count", "_sum"]
            .iter()
            .fold(name.as_str(), |n, s| n.strip_suffix(s).unwrap_or(n));
        assert!(
            used.iter().any(|u| u.starts_with(family)),
            "the dashboard shows nothing of {family}"
        );
    }
}

#[test]
fn dashboard_structure() {
    let d = dashboard();
    let schema = d["schemaVersion"].as_u64().expect("schemaVersion");
    assert!((36..=41).contains(&schema), "schemaVersion {schema}");
    let vars: BTreeMap<&str, &Json> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["name"].as_str().unwrap(), v))
        .collect();
    assert_eq!(vars["DS_PROMETHEUS"]["type"], "datasource");
    assert_eq!(vars["DS_PROMETHEUS"]["query"], "prometheus");
    for v in ["instance", "class", "level"] {
        assert_eq!(
            vars.get(v).map(|v| &v["type"]),
            Some(&json!("query")),
            "variable {v}"
        );
    }
    let mut ids = BTreeSet::new();
    for p in all_panels(&d) {
        assert!(
            ids.insert(p["id"].as_u64().expect("panel id")),
            "duplicate panel id {}",
            p["id"]
        );
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(
            p["datasource"]["uid"], "${DS_PROMETHEUS}",
            "panel {:?}: datasource",
            p["title"]
        );
        for t in p["targets"].as_array().expect("targets") {
            assert_eq!(
                t["datasource"]["uid"], "${DS_PROMETHEUS}",
                "panel {:?}: target datasource",
                p["title"]
            );
        }
        let g = &p["gridPos"];
        assert!(
            g["x"].as_u64().unwrap() + g["w"].as_u64().unwrap() <= 24,
            "panel {:?} overflows the grid",
            p["title"]
        );
    }
    for a in d["annotations"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["expr"].is_string())
    {
        assert_eq!(
            a["datasource"]["uid"], "${DS_PROMETHEUS}",
            "annotation {:?}: datasource",
            a["name"]
        );
    }
    let exprs: Vec<String> = dashboard_exprs().into_iter().map(|(_, e)| e).collect();
    let has = |needle: &str| exprs.iter().any(|e| e.contains(needle));
    assert!(has("histogram_quantile(") && has("_bucket"), "grant histograms");
    assert!(
        has("paceline_class_added_delay_seconds_total") && has("paceline_class_delayed_packets_total"),
        "average delay"
    );
    assert!(has("paceline_level_rate_limit_bytes_per_second"), "level limits");
}

// ------------------------------------------------------------------------------------------
// Kubernetes
// ------------------------------------------------------------------------------------------

const DAEMONSET: &str = "deploy/kubernetes/agent/daemonset.yaml";

/// `paceline <args>` as the agent's own command line parses it.
fn agent_args(argv: &[&str]) -> paceline::cli::agent::Args {
    let cli =
        Cli::try_parse_from(std::iter::once("paceline").chain(argv.iter().copied())).unwrap_or_else(|e| {
            panic!(
                "`paceline {}` is refused by the agent's command line:\n{e}",
                argv.join(" ")
            )
        });
    match cli.command {
        Sub::Agent(a) => a,
        other => panic!("not `paceline agent`: {other:?}"),
    }
}

fn strs(v: &Yaml) -> Vec<&str> {
    v.as_sequence()
        .into_iter()
        .flatten()
        .map(|x| s(x, "string list"))
        .collect()
}

#[test]
fn daemonset_runs_the_agent_with_what_it_needs() {
    let docs = yaml_docs(DAEMONSET);
    let ds = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("a DaemonSet");
    let spec = &ds["spec"];
    assert_eq!(spec["updateStrategy"]["type"], "RollingUpdate");
    assert!(
        !spec["updateStrategy"]["rollingUpdate"]["maxUnavailable"].is_null(),
        "maxUnavailable"
    );
    assert_eq!(
        spec["updateStrategy"]["rollingUpdate"]["maxSurge"], 0,
        "two agents on one node would fight"
    );
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_ne!(pod["hostPID"], true, "hostPID is not needed");
    let selector = &spec["selector"]["matchLabels"];
    for (k, v) in selector.as_mapping().expect("matchLabels") {
        assert_eq!(
            &spec["template"]["metadata"]["labels"][k], v,
            "the pod template carries the selector's labels"
        );
    }

    let containers = seq(&pod["containers"], "containers");
    // components/privileged patches containers/0 and its volumeMounts/0 by index.
    let agent = &containers[0];
    assert_eq!(
        agent["name"], "agent",
        "the agent is containers[0] (components/privileged patches it by index)"
    );
    assert_eq!(
        agent["volumeMounts"][0]["mountPath"], "/sys/fs/bpf",
        "volumeMounts[0] is the bpffs (patched by index)"
    );

    let argv: Vec<&str> = strs(&agent["command"])
        .into_iter()
        .skip(1)
        .chain(strs(&agent["args"]))
        .collect();
    assert_eq!(strs(&agent["command"]), ["/usr/local/bin/paceline"]);
    let a = agent_args(&argv);
    assert_eq!(a.policy, Path::new("/etc/paceline/policy.yaml"));
    assert_eq!(a.state_dir, Path::new("/run/paceline"));
    assert!(a.bpffs_dir.starts_with("/sys/fs/bpf"));
    assert_eq!(a.metrics_addr.port(), 9977);
    assert!(
        !a.metrics_addr.ip().is_loopback(),
        "kubelet probes the node IP: the agent must not listen on loopback only"
    );
    // /status, /policy, /events, /flows and the rollback requests stay off the node's
    // interfaces: the API listens on loopback, apart from /metrics.
    assert!(
        a.api_addr.ip().is_loopback() && a.api_addr != a.metrics_addr,
        "the API must not be exposed with the metrics: {}",
        a.api_addr
    );
    let port = seq(&agent["ports"], "ports")
        .iter()
        .find(|p| p["name"] == "metrics")
        .expect("a port named metrics");
    assert_eq!(port["containerPort"], 9977);
    // Liveness: the datapath is attached and live (a failure restarts the pod, whose start
    // reattaches); readiness also needs the last reload applied (a rejected policy stops a
    // rollout at the node without restarting the agent that keeps the previous policy).
    for (probe, path) in [
        ("livenessProbe", "/healthz"),
        ("startupProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ] {
        assert_eq!(agent[probe]["httpGet"]["path"], path, "{probe}");
        assert_eq!(agent[probe]["httpGet"]["port"], "metrics", "{probe}");
    }
    assert!(
        !agent["resources"]["requests"].is_null() && !agent["resources"]["limits"]["memory"].is_null(),
        "resources"
    );

    let sc = &agent["securityContext"];
    if sc["privileged"] != true {
        let caps: BTreeSet<&str> = strs(&sc["capabilities"]["add"]).into_iter().collect();
        for c in ["BPF", "PERFMON", "NET_ADMIN", "SYS_ADMIN"] {
            assert!(caps.contains(c), "capability {c} missing");
        }
        assert_ne!(
            sc["allowPrivilegeEscalation"], false,
            "the API refuses allowPrivilegeEscalation: false with SYS_ADMIN"
        );
    }

    // Mounts -> volumes.
    let volumes: BTreeMap<&str, &Yaml> = seq(&pod["volumes"], "volumes")
        .iter()
        .map(|v| (s(&v["name"], "volume name"), v))
        .collect();
    let mounts: BTreeMap<&str, &Yaml> = seq(&agent["volumeMounts"], "volumeMounts")
        .iter()
        .map(|m| (s(&m["mountPath"], "mountPath"), m))
        .collect();
    for (path, host) in [
        ("/sys/fs/bpf", "/sys/fs/bpf"),
        ("/sys/fs/cgroup", "/sys/fs/cgroup"),
        ("/run/paceline", "/run/paceline"),
    ] {
        let m = mounts
            .get(path)
            .unwrap_or_else(|| panic!("the agent does not mount {path}"));
        let v = volumes[s(&m["name"], "mount name")];
        assert_eq!(v["hostPath"]["path"], host, "{path} must be the host's");
    }
    assert_ne!(
        mounts["/sys/fs/bpf"]["mountPropagation"],
        Yaml::Null,
        "bpffs mount propagation"
    );

    // The policy: the group's ConfigMap mounted at /etc/paceline as the kubelet lays it out
    // (the agent follows its ..data symlink swaps), and no helper container or init step
    // between the ConfigMap and the agent.
    let pmount = mounts
        .get("/etc/paceline")
        .expect("the agent mounts /etc/paceline");
    assert_eq!(pmount["readOnly"], true, "the policy mount is read-only");
    let pvol = volumes[s(&pmount["name"], "policy mount")];
    assert_eq!(
        pvol["configMap"]["name"], "paceline-policy",
        "/etc/paceline is the group's ConfigMap"
    );
    assert_eq!(containers.len(), 1, "the agent is the pod's only container");
    assert!(pod["initContainers"].is_null(), "no init containers");
}

/// Applies one RFC 6902 operation of the kinds the shipped components use (`add` at the end
/// of a list, `replace` of an existing index or key), as kustomize would.
fn json_patch(doc: &mut Yaml, op: &str, path: &str, value: Yaml) {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (last, parents) = parts.split_last().expect("a path");
    let mut cur = doc;
    for p in parents {
        cur = match p.parse::<usize>() {
            Ok(i) => cur.get_mut(i).unwrap_or_else(|| panic!("{path}: no element {i}")),
            Err(_) => cur.get_mut(*p).unwrap_or_else(|| panic!("{path}: no key {p}")),
        };
    }
    match (op, last.parse::<usize>()) {
        ("add", _) if *last == "-" => cur.as_sequence_mut().expect("add to a list").push(value),
        ("replace", Ok(i)) => {
            let list = cur.as_sequence_mut().expect("replace in a list");
            assert!(i < list.len(), "{path}: replace past the end");
            list[i] = value;
        }
        ("replace", Err(_)) => {
            let slot = cur
                .get_mut(*last)
                .unwrap_or_else(|| panic!("{path}: replace of a missing key"));
            *slot = value;
        }
        _ => panic!("{op} {path}: not an operation the components use"),
    }
}

#[test]
fn the_api_token_component_moves_the_api_behind_the_secrets_token() {
    let comp = yaml("deploy/kubernetes/components/api-token/kustomization.yaml");
    let ops: Yaml =
        serde_yaml::from_str(s(&comp["patches"][0]["patch"], "patch")).expect("the patch is YAML");
    let mut ds = yaml_docs(DAEMONSET)
        .into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("a DaemonSet");
    let before = strs(&ds["spec"]["template"]["spec"]["containers"][0]["args"])
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
    assert_eq!(
        before[5], "--api-addr",
        "the component replaces args/6, --api-addr's value"
    );
    for op in seq(&ops, "the patch's operations") {
        json_patch(
            &mut ds,
            s(&op["op"], "op"),
            s(&op["path"], "path"),
            op["value"].clone(),
        );
    }
    let pod = &ds["spec"]["template"]["spec"];
    let agent = &pod["containers"][0];
    // The kubelet substitutes $(NODE_IP).
    let argv: Vec<String> = strs(&agent["command"])
        .into_iter()
        .skip(1)
        .chain(strs(&agent["args"]))
        .map(|a| a.replace("$(NODE_IP)", "10.0.0.7"))
        .collect();
    let a = agent_args(&argv.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(a.api_addr, "10.0.0.7:9978".parse().unwrap());
    let token = a.api_token_file.expect("--api-token-file");
    // The file is in the Secret's volume, mounted read-only, mode 0400 (the agent refuses a
    // file others can read).
    let mount = seq(&agent["volumeMounts"], "volumeMounts")
        .iter()
        .find(|m| token.starts_with(s(&m["mountPath"], "mountPath")) && m["mountPath"] != "/")
        .expect("a mount holding the token file");
    assert_eq!(mount["readOnly"], true);
    let vol = seq(&pod["volumes"], "volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the token's volume");
    assert_eq!(vol["secret"]["secretName"], "paceline-api-token");
    assert_eq!(vol["secret"]["defaultMode"].as_u64(), Some(0o400), "{vol:?}");
    assert!(
        token.ends_with("token"),
        "the Secret's key is `token`: {}",
        token.display()
    );
    // `kubectl exec ... paceline status` finds the API and its token in the environment.
    let env: BTreeMap<&str, &str> = seq(&agent["env"], "env")
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?, e["value"].as_str()?)))
        .collect();
    assert_eq!(env.get("PACELINE_API_TOKEN_FILE"), token.to_str().as_ref());
    assert_eq!(env.get("PACELINE_API"), Some(&"$(NODE_IP):9978"));
}

#[test]
fn groups_select_disjoint_nodes_and_ship_valid_policies() {
    let main = yaml("deploy/kubernetes/groups/main/kustomization.yaml");
    let canary = yaml("deploy/kubernetes/groups/canary/kustomization.yaml");
    for (g, k) in [("main", &main), ("canary", &canary)] {
        let generator = &seq(&k["configMapGenerator"], "configMapGenerator")[0];
        assert_eq!(generator["name"], "paceline-policy", "{g}");
        assert_eq!(strs(&generator["files"]), ["policy.yaml"], "{g}");
        assert_eq!(
            k["labels"][0]["pairs"]["paceline/group"], g,
            "{g}: pods carry their group"
        );
        assert_eq!(
            k["labels"][0]["includeSelectors"], true,
            "{g}: distinct DaemonSet selectors"
        );
    }
    assert_eq!(canary["nameSuffix"], "-canary");
    let patch: Yaml = serde_yaml::from_str(s(&canary["patches"][0]["patch"], "patch")).unwrap();
    assert_eq!(
        patch["spec"]["template"]["spec"]["nodeSelector"]["paceline/group"],
        "canary"
    );
    let patch: Yaml = serde_yaml::from_str(s(&main["patches"][0]["patch"], "patch")).unwrap();
    let expr = &patch["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"][0]["matchExpressions"][0];
    assert_eq!(expr["key"], "paceline/group");
    assert_eq!(expr["operator"], "NotIn");
    assert!(
        strs(&expr["values"]).contains(&"canary"),
        "main excludes the canary nodes"
    );

    let top = yaml("deploy/kubernetes/kustomization.yaml");
    let res = strs(&top["resources"]);
    for r in ["namespace.yaml", "service.yaml", "groups/main", "groups/canary"] {
        assert!(res.contains(&r), "kustomization.yaml lists {r}");
        assert!(repo().join("deploy/kubernetes").join(r).exists(), "{r} exists");
    }

    for g in ["main", "canary"] {
        let rel = format!("deploy/kubernetes/groups/{g}/policy.yaml");
        let text = read(&rel);
        let v = paceline_policy::parse_str(&text, &rel, &paceline_policy::OfflineHost)
            .unwrap_or_else(|e| panic!("{rel} is not a valid policy: {e:?}"));
        // `sha256sum policy.yaml` is what paceline_policy_info{hash} shows (docs/operations.md).
        use sha2::Digest as _;
        let sum: String = sha2::Sha256::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(v.hash, sum, "{rel}: the policy hash is the file's sha256");
    }
}

#[test]
fn monitoring_scrapes_the_agents_as_job_paceline() {
    let svc = yaml("deploy/kubernetes/service.yaml");
    assert_eq!(svc["spec"]["clusterIP"], "None");
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "metrics");
    assert_eq!(
        svc["metadata"]["name"], "paceline",
        "the ServiceMonitor's job label is the Service's name"
    );
    let sm = yaml("deploy/kubernetes/monitoring/servicemonitor.yaml");
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");
    assert_eq!(sm["spec"]["selector"]["matchLabels"], svc["spec"]["selector"]);
    let sc = yaml("deploy/kubernetes/monitoring/prometheus-scrape-config.yaml");
    assert_eq!(sc["scrape_configs"][0]["job_name"], "paceline");
    let pe = yaml("deploy/prometheus/prometheus.example.yaml");
    assert_eq!(pe["scrape_configs"][0]["job_name"], "paceline");
    assert!(strs(&pe["rule_files"]).contains(&"paceline.rules.yaml"));
}

// ------------------------------------------------------------------------------------------
// systemd and the image
// ------------------------------------------------------------------------------------------

/// `[Section]` -> (key, value) in order (repeated keys kept), comments dropped.
fn unit(rel: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let mut out: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut section = String::new();
    for line in read(rel).lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(sec) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = sec.to_string();
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{rel}: not key=value: {line}"));
        out.entry(section.clone())
            .or_default()
            .push((k.trim().to_string(), v.trim().to_string()));
    }
    out
}

#[test]
fn systemd_unit_starts_reloads_and_stops_the_agent_as_it_expects() {
    let u = unit("deploy/systemd/paceline.service");
    let svc = &u["Service"];
    let all = |k: &str| {
        svc.iter()
            .filter(|(kk, _)| kk == k)
            .map(|(_, v)| v.as_str())
            .collect::<Vec<_>>()
    };
    let one = |k: &str| {
        let v = all(k);
        assert_eq!(v.len(), 1, "{k}: {v:?}");
        v[0]
    };
    let start: Vec<&str> = one("ExecStart")
        .split_whitespace()
        .filter(|w| !w.starts_with('$'))
        .collect();
    assert_eq!(start[0], "/usr/local/bin/paceline");
    let a = agent_args(&start[1..]);
    assert_eq!(a.policy, Path::new("/etc/paceline/policy.yaml"));
    assert_eq!(a.state_dir, Path::new("/run/paceline"));

    // `systemctl reload` asks the agent and fails when the agent rejects the policy (invalid,
    // or a change that needs a restart); a bare SIGHUP always "succeeded".
    let reload = all("ExecReload");
    assert_eq!(reload.len(), 1, "{reload:?}");
    let argv: Vec<&str> = reload[0].split_whitespace().collect();
    assert_eq!(argv[0], "/usr/local/bin/paceline");
    let cli = Cli::try_parse_from(std::iter::once("paceline").chain(argv[1..].iter().copied()))
        .unwrap_or_else(|e| panic!("ExecReload={}: {e}", reload[0]));
    assert!(
        matches!(cli.command, Sub::Reload(_)),
        "ExecReload runs `paceline reload`"
    );
    // Readiness and the watchdog: the agent sends READY=1 once attached and WATCHDOG=1 while
    // healthy.
    assert_eq!(one("Type"), "notify");
    assert!(
        one("WatchdogSec")
            .trim_end_matches('s')
            .parse::<u32>()
            .is_ok_and(|t| t >= 10),
        "WatchdogSec"
    );
    assert_eq!(one("NotifyAccess"), "main");
    assert_eq!(one("KillSignal"), "SIGTERM");
    assert!(
        one("TimeoutStopSec")
            .trim_end_matches('s')
            .parse::<u32>()
            .is_ok_and(|t| t >= 10),
        "TimeoutStopSec"
    );
    assert_eq!(one("Restart"), "on-failure");
    assert!(all("User").iter().all(|u| *u == "root"), "runs as root");

    // The state survives a crash and a failed unit, for the next start to clean up.
    assert_eq!(one("RuntimeDirectory"), "paceline");
    assert_eq!(one("RuntimeDirectoryPreserve"), "yes");

    // Hardening that would break bpf(), netlink, /sys/fs/bpf or /sys/fs/cgroup is absent.
    for (k, bad) in [
        ("ProtectKernelTunables", "yes"),
        ("ProtectControlGroups", "yes"),
        ("PrivateNetwork", "yes"),
        ("PrivateUsers", "yes"),
    ] {
        assert!(!all(k).contains(&bad), "{k}={bad} blocks what the agent needs");
    }
    for f in all("SystemCallFilter") {
        assert!(
            f.starts_with('~') || f.split_whitespace().any(|w| w == "bpf"),
            "SystemCallFilter={f} drops bpf()"
        );
        assert!(
            !(f.starts_with('~') && f.contains("@debug")),
            "@debug holds perf_event_open"
        );
    }
    for f in all("RestrictAddressFamilies") {
        assert!(
            f.contains("AF_NETLINK") && f.contains("AF_INET"),
            "RestrictAddressFamilies={f}"
        );
    }
    for f in all("RestrictNamespaces") {
        assert!(
            f == "no" || f.split_whitespace().any(|w| w == "net"),
            "the feature probe unshares a netns: {f}"
        );
    }
    for f in all("ReadOnlyPaths").iter().chain(all("InaccessiblePaths").iter()) {
        assert!(!f.contains("/sys/fs/bpf") && !f.contains("/sys/fs/cgroup"), "{f}");
    }
    let caps = one("CapabilityBoundingSet");
    for c in ["CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN", "CAP_SYS_ADMIN"] {
        assert!(
            caps.split_whitespace().any(|w| w == c),
            "CapabilityBoundingSet lacks {c}"
        );
    }
    assert!(
        u["Install"]
            .iter()
            .any(|(k, v)| k == "WantedBy" && v == "multi-user.target")
    );

    if tool("systemd-analyze") {
        // verify wants the binary at its path: point ExecStart at one that exists here.
        let text = read("deploy/systemd/paceline.service")
            .replace("/usr/local/bin/paceline", env!("CARGO_BIN_EXE_paceline"));
        let dir = std::env::temp_dir().join(format!("paceline-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("paceline.service");
        std::fs::write(&f, text).unwrap();
        let o = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&f)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let err = String::from_utf8_lossy(&o.stderr);
        let relevant: Vec<&str> = err.lines().filter(|l| l.contains("paceline.service")).collect();
        assert!(relevant.is_empty(), "systemd-analyze verify:\n{err}");
    }
}

#[test]
fn dockerfile_carries_tc_and_runs_the_agent() {
    let text = read("deploy/container/Dockerfile");
    assert!(text.contains("iproute2"), "the agent runs `tc`");
    assert!(text.contains("COPY target/release/paceline /usr/local/bin/paceline"));
    let cmd = text.lines().find_map(|l| l.strip_prefix("CMD ")).expect("CMD");
    let argv: Vec<String> = serde_json::from_str(cmd).expect("CMD in exec form");
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let a = agent_args(&argv);
    assert_eq!(a.policy, Path::new("/etc/paceline/policy.yaml"));
}
