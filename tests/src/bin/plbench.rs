//! `plbench datapath`: the tc classifier's cost per packet on each path, measured with
//! BPF_PROG_TEST_RUN against an empty classifier (the floor) in the same run.
//!
//! Each path runs `--repeat` packets per trial in the kernel (the kernel reports the mean time
//! per run); the figure is the median over `--trials` trials. Run by `cargo xtask bench
//! datapath`, which writes results/bench-datapath.json.

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use aya::{TestRun, TestRunOptions};
use clap::Parser;
use paceline::datapath::{Datapath, LoadOptions};
use paceline_common::maps::{
    CLASS_SET_PRIORITY, ClassConfig, LEVEL_SET_DSCP, LevelConfig, PolicyTable, Rule, v4_mapped,
};
use paceline_tests::{
    packet::{self, L4},
    skb::SkBuff,
};
use serde::Serialize;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(clap::Subcommand)]
enum Bench {
    /// ns per packet of the tc classifier, per path.
    Datapath {
        #[arg(long, default_value_t = 2_000_000)]
        repeat: u32,
        #[arg(long, default_value_t = 7)]
        trials: usize,
        /// Write the results as JSON here.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Serialize)]
struct Row {
    path: String,
    ns_per_packet: f64,
    over_floor: f64,
    min: f64,
    max: f64,
}

#[derive(Serialize)]
struct Report {
    kind: &'static str,
    kernel: String,
    cpu: String,
    repeat: u32,
    trials: usize,
    rows: Vec<Row>,
}

/// Mean ns per run over `repeat` runs in the kernel. `stack_ts`: the EDT timestamp TCP would
/// have set (0 for UDP or forwarded traffic).
fn measure(prog: &aya::programs::SchedClassifier, frame: &[u8], stack_ts: u64, repeat: u32) -> Result<f64> {
    let ctx = SkBuff {
        tstamp: stack_ts,
        ..SkBuff::default()
    };
    let r = prog
        .test_run(TestRunOptions {
            data_in: Some(frame),
            ctx_in: Some(ctx.as_bytes()),
            repeat,
            ..TestRunOptions::default()
        })
        .context("BPF_PROG_TEST_RUN")?;
    Ok(r.duration.as_nanos() as f64)
}

/// A policy shaped like the shipped memcached/web/bulk example: four rules, the matching one
/// first, per-flow + class + level clocks at rates the benchmark's packet rate does not
/// exceed (so the measured path is the send path, not the horizon drop), DSCP rewrite.
/// A policy table and its rules (first match wins).
#[derive(Clone)]
struct Policy {
    table: PolicyTable,
    rules: Vec<Rule>,
}

fn full_policy() -> Policy {
    let mut t = PolicyTable::empty();
    let rules = vec![
        Rule::any(1).with_proto(6).with_dport(11211, 11211),
        Rule::any(1).with_proto(17).with_dport(11211, 11211),
        Rule::any(2).with_proto(6).with_dport(80, 80),
        Rule::any(2).with_proto(6).with_dport(443, 443),
    ];
    t.n_classes = 3;
    t.default_class = 0;
    for (i, level) in [(0u32, 2u32), (1, 0), (2, 1)] {
        t.classes[i as usize] = ClassConfig {
            level,
            skb_priority: 7 - level,
            flags: CLASS_SET_PRIORITY,
            ..ClassConfig::zeroed()
        };
    }
    t.classes[1].flow_rate = 5_000_000_000; // 40 Gbit/s
    t.classes[1].class_rate = 10_000_000_000; // 80 Gbit/s
    t.levels[0] = LevelConfig {
        rate: 12_500_000_000,
        flags: LEVEL_SET_DSCP,
        dscp: 46,
        pcp: 0,
        _pad: [0; 2],
    };
    t.levels[1] = LevelConfig {
        rate: 0,
        flags: LEVEL_SET_DSCP,
        dscp: 26,
        pcp: 0,
        _pad: [0; 2],
    };
    Policy { table: t, rules }
}

fn classify_only_policy() -> Policy {
    let mut p = full_policy();
    let t = &mut p.table;
    for c in t.classes.iter_mut() {
        c.flow_rate = 0;
        c.class_rate = 0;
    }
    for l in t.levels.iter_mut() {
        *l = LevelConfig::zeroed();
    }
    p
}

/// 64 rules none of which matches.
fn worst_case_policy() -> Policy {
    let mut p = classify_only_policy();
    p.rules = (0..64)
        .map(|i| Rule::any(1).with_dst(v4_mapped(u32::from_ne_bytes([192, 0, 2, i as u8])), [u32::MAX; 4]))
        .collect();
    p
}

fn main() -> Result<()> {
    let Bench::Datapath { repeat, trials, out } = Cli::parse().bench;
    // A 64-byte TCP segment to the class with pacing and a DSCP level, with a DSCP and an
    // optional 802.1Q tag.
    let tcp4_with = |dscp: u8, vlan: Option<(u16, u8)>| {
        let l4 = L4::Tcp {
            sport: 40000,
            dport: 11211,
        };
        packet::ipv4([10, 0, 0, 1], [10, 0, 0, 2], l4, dscp, 0, &[], vlan, 64)
    };
    let tcp4 = tcp4_with(0, None);
    // The same segment with the level's DSCP already in it, as TCP sends it once sock_ops has
    // set the socket's IP_TOS: the classifier finds nothing to rewrite.
    let tcp4_tos = tcp4_with(46, None);
    let tcp4_vlan = tcp4_with(0, Some((100, 0)));
    let src6 = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    let udp6 = packet::ipv6(
        src6,
        src6,
        L4::Udp {
            sport: 40000,
            dport: 11211,
        },
        0,
        0,
        false,
        64,
    );
    let mut arp = vec![0xffu8; 6];
    arp.extend_from_slice(&packet::MAC_A);
    arp.extend_from_slice(&[0x08, 0x06]);
    arp.extend_from_slice(&[0u8; 28]);

    // Every trial runs every path once, in turn, so machine noise spreads over all paths alike.
    enum Prog {
        Floor,
        Clock,
        Full,
        CountOnly,
    }
    // TCP stamps its segments with its EDT departure, taken microseconds earlier.
    let tcp_ts = paceline_tests::skb::mono_now_ns();
    type Case<'a> = (&'a str, Prog, Policy, &'a [u8], u64);
    let cases: Vec<Case> = vec![
        (
            "floor: empty classifier, IPv4/TCP frame",
            Prog::Floor,
            full_policy(),
            &tcp4,
            0,
        ),
        (
            "reference: a classifier that only calls bpf_ktime_get_ns",
            Prog::Clock,
            full_policy(),
            &tcp4,
            0,
        ),
        (
            "IPv4/TCP full: classify, flow+class+level EDT, DSCP, priority",
            Prog::Full,
            full_policy(),
            &tcp4,
            tcp_ts,
        ),
        (
            "IPv4/TCP full path, DSCP already set by the socket",
            Prog::Full,
            full_policy(),
            &tcp4_tos,
            tcp_ts,
        ),
        (
            "IPv4/TCP in 802.1Q, full path",
            Prog::Full,
            full_policy(),
            &tcp4_vlan,
            tcp_ts,
        ),
        (
            "IPv4/TCP full path, no stack timestamp (reads the clock)",
            Prog::Full,
            full_policy(),
            &tcp4,
            0,
        ),
        (
            "IPv6/UDP full path (no stack timestamp: reads the clock)",
            Prog::Full,
            full_policy(),
            &udp6,
            0,
        ),
        (
            "IPv4/TCP classify + priority only (no pacing, no rewrite)",
            Prog::Full,
            classify_only_policy(),
            &tcp4,
            tcp_ts,
        ),
        (
            "IPv4/TCP, 64 rules, none matches",
            Prog::Full,
            worst_case_policy(),
            &tcp4,
            tcp_ts,
        ),
        (
            "non-IP frame (ARP): parse, count, pass",
            Prog::Full,
            classify_only_policy(),
            &arp,
            0,
        ),
        (
            "IPv4/TCP count-only build (parse, classify, count)",
            Prog::CountOnly,
            full_policy(),
            &tcp4,
            tcp_ts,
        ),
    ];
    let mut dp = Datapath::load(&LoadOptions::default())?;
    let mut count_only = Datapath::load(&LoadOptions {
        count_only: true,
        ..LoadOptions::default()
    })?;
    dp.bench_program(paceline::datapath::TC_FLOOR)?;
    dp.bench_program(paceline::datapath::TC_CLOCK)?;
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..trials {
        for (i, (_, prog, table, frame, ts)) in cases.iter().enumerate() {
            let (d, name) = match prog {
                Prog::Floor => (&mut dp, Some(paceline::datapath::TC_FLOOR)),
                Prog::Clock => (&mut dp, Some(paceline::datapath::TC_CLOCK)),
                Prog::Full => (&mut dp, None),
                Prog::CountOnly => (&mut count_only, None),
            };
            d.write_rules(&table.table, &table.rules)?;
            let p = match name {
                Some(n) => d.bench_program(n)?,
                None => d.tc_program()?,
            };
            samples[i].push(measure(p, frame, *ts, repeat)?);
        }
    }
    let rows: Vec<(String, (f64, f64, f64))> = cases
        .iter()
        .zip(samples)
        .map(|((name, ..), mut v)| {
            v.sort_by(f64::total_cmp);
            (name.to_string(), (v[v.len() / 2], v[0], v[v.len() - 1]))
        })
        .collect();
    let floor = rows[0].1;
    let floor_ns = floor.0;
    println!(
        "{:<64} {:>8} {:>11} {:>8} {:>8}",
        "path", "ns/pkt", "over floor", "min", "max"
    );
    let rows: Vec<Row> = rows
        .into_iter()
        .map(|(path, (med, min, max))| {
            println!(
                "{path:<64} {med:>8.1} {:>11.1} {min:>8.1} {max:>8.1}",
                med - floor_ns
            );
            Row {
                path,
                ns_per_packet: med,
                over_floor: med - floor_ns,
                min,
                max,
            }
        })
        .collect();
    let report = Report {
        kind: "bench-datapath",
        kernel: nix_uname(),
        cpu: cpu_model(),
        repeat,
        trials,
        rows,
    };
    if let Some(out) = out {
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&out, serde_json::to_vec_pretty(&report)?)?;
        println!("wrote {}", out.display());
    }
    Ok(())
}

fn nix_uname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default()
}
