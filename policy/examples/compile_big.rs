//! Times the stages of compiling a large generated policy, without a kernel: parse and
//! validate, the policy compiler, and inside it the classifier's stages, with the peak RSS.
//!
//! ```sh
//! cargo run -p paceline-policy --release --example compile_big -- 100000 [per_rule] [classes]
//! cargo run -p paceline-policy --release --example compile_big -- edit 100000 [trials]
//! cargo run -p paceline-policy --release --example compile_big -- full 100000 [trials]
//! ```
//!
//! The policy has the shape of `paceline-tests`' `policygen::BigPolicy` (what `plbench apply`
//! writes into the datapath): `per_rule` /32 destinations under one UDP port per YAML rule,
//! `classes` tenant classes.
//!
//! `edit` times what `plbench apply` calls an address edit, without the write: the policy
//! (1,000 addresses a rule, 16 classes) compiled from nothing, then `trials + 1` edits, each
//! the policy with rule `p_k = (n/2 + 7919 k) mod (n - 1)`'s address replaced by
//! `10.200.x.y/32` (in no list, sorted after every other) compiled after the one before (the
//! first not counted), then as many edits of the probe rule's port (the first two not
//! counted). It prints the medians of the compile and its stages, and the peak RSS (VmHWM)
//! from before the first compile, the running policy held beside the new one as in the agent.
//!
//! `full` times what `plbench apply` calls a full apply, without the write: `trials` policies
//! parsed, validated and compiled from nothing one after the other in one process (each
//! dropped before the next), and prints the medians.

use std::fmt::Write as _;
use std::time::Instant;

use paceline_policy::{CompileContext, EnforcementMode, OfflineHost};

fn yaml(rules: u32, per_rule: u32, classes: u32) -> String {
    let tenants = rules.saturating_sub(1).div_ceil(per_rule);
    let mut out = String::from(
        "apiVersion: paceline/v1\nkind: Policy\nspec:\n  interfaces: [eth0]\n  enforcement: none\n  \
         levels:\n    - {name: high, priority: 6}\n    - {name: low, priority: 0}\n  classes:\n",
    );
    for c in 0..classes {
        let _ = writeln!(out, "    - {{name: tenant{c}, level: low}}");
    }
    out.push_str("    - {name: probe, level: high}\n    - {name: other, level: low}\n  rules:\n");
    let mut next = 0u32;
    for t in 0..tenants {
        let n = per_rule.min(rules - 1 - t * per_rule);
        let port = 20_000 + (t % 20_000);
        let _ = write!(
            out,
            "    - {{class: tenant{}, protocol: udp, dst_port: {port}, dst: [",
            t % classes
        );
        for k in 0..n {
            let sep = if k == 0 { "" } else { ", " };
            let _ = write!(
                out,
                "{sep}10.{}.{}.{}/32",
                100 + (next >> 16),
                (next >> 8) & 255,
                next & 255
            );
            next += 1;
        }
        out.push_str("]}\n");
    }
    out.push_str("    - {class: probe, protocol: udp, dst_port: 7001, dst: [192.0.2.1/32]}\n");
    out.push_str("  default_class: other\n");
    out
}

fn peak_rss_mb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024)
}

/// Starts the peak resident set over from the current one (`clear_refs` 5, Linux 4.0+).
fn reset_peak_rss() {
    if let Err(e) = std::fs::write("/proc/self/clear_refs", "5") {
        eprintln!("the peak RSS is not reset: /proc/self/clear_refs: {e}");
    }
}

/// The CPU time of the process (every thread, user and system), ms: on a busy machine the
/// wall-clock stages also count the time the compile waited for a CPU.
fn cpu_ms() -> f64 {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given.
    let u = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr());
        u.assume_init()
    };
    let t = |v: libc::timeval| v.tv_sec as f64 * 1e3 + v.tv_usec as f64 / 1e3;
    t(u.ru_utime) + t(u.ru_stime)
}

/// The compile's time (wall and CPU) and its stages, ms.
#[derive(Clone, Copy, Default)]
struct Stages([f64; 10]);

const STAGE_NAMES: [&str; 10] = [
    "compile",
    "cpu",
    "rules",
    "classifier",
    "normalize",
    "addresses",
    "phases",
    "rule table",
    "words",
    "shadow",
];

fn compile_after(text: &str, previous: &mut Option<paceline_policy::Compiled>) -> Stages {
    let v = paceline_policy::parse_str(text, "generated.yaml", &OfflineHost).expect("a valid policy");
    let slots = previous.as_ref().map(|c| c.slots());
    let ctx = CompileContext {
        mode: EnforcementMode::None,
        previous: slots.as_ref(),
        all_routes_managed: false,
    };
    let (t, cpu) = (Instant::now(), cpu_ms());
    let c = match previous {
        Some(p) => paceline_policy::compile_after(&v, &ctx, p),
        None => paceline_policy::compile(&v, &ctx),
    }
    .expect("compiles");
    let compile = t.elapsed();
    let cpu = cpu_ms() - cpu;
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let (ct, bt) = (c.times, c.ctab.times);
    let st = Stages([
        ms(compile),
        cpu,
        ms(ct.rules),
        ms(ct.classifier),
        ms(bt.normalize),
        ms(bt.addresses),
        ms(bt.phases),
        ms(bt.rule_table),
        ms(bt.words),
        ms(ct.shadow),
    ]);
    *previous = Some(c);
    st
}

fn medians(runs: &[Stages]) -> String {
    (0..STAGE_NAMES.len())
        .map(|i| {
            let mut v: Vec<f64> = runs.iter().map(|s| s.0[i]).collect();
            v.sort_by(f64::total_cmp);
            format!(
                "{} {:.1}",
                STAGE_NAMES[i],
                v.get(v.len() / 2).copied().unwrap_or(0.0)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn edits(rules: u32, trials: u32) {
    let base = yaml(rules, 1000, 16);
    reset_peak_rss();
    let mut previous = None;
    let full = compile_after(&base, &mut previous);
    println!(
        "{rules} rules: full compile, ms: {} (peak RSS so far {} MB)",
        medians(&[full]),
        peak_rss_mb()
    );
    let mut addr = Vec::new();
    for k in 1..=trials + 1 {
        let at = (rules / 2 + 7919 * k) % (rules - 1);
        let from = format!("10.{}.{}.{}/32", 100 + (at >> 16), (at >> 8) & 255, at & 255);
        let to = format!("10.200.{}.{}/32", k >> 8, k & 255);
        let text = [", ", "["]
            .iter()
            .find(|sep| base.contains(&format!("{sep}{from}")))
            .map(|sep| base.replacen(&format!("{sep}{from}"), &format!("{sep}{to}"), 1))
            .expect("the rule's address is in the policy");
        let st = compile_after(&text, &mut previous);
        if k > 1 {
            addr.push(st);
        }
    }
    println!("{rules} rules: address edit, median ms: {}", medians(&addr));
    let mut port = Vec::new();
    for k in 1..=trials + 2 {
        let text = base.replacen("dst_port: 7001,", &format!("dst_port: {},", 7001 + k), 1);
        let st = compile_after(&text, &mut previous);
        if k > 2 {
            port.push(st);
        }
    }
    println!("{rules} rules: port edit, median ms: {}", medians(&port));
    println!(
        "{rules} rules: peak RSS {} MB (the full compile and the edits)",
        peak_rss_mb()
    );
}

/// `trials` policies of `rules` rules, each parsed, validated and compiled from nothing after
/// the one before was dropped, in one process (as `plbench apply`'s full applies): the medians
/// of parse+validate, the compile and its stages. The policies differ in their first
/// destination, so that no two are the same file.
fn fulls(rules: u32, trials: u32) {
    let base = yaml(rules, 1000, 16);
    let mut pv = Vec::new();
    let mut runs = Vec::new();
    for k in 0..trials {
        let text = base.replacen("[10.100.0.0/32", &format!("[10.250.0.{k}/32"), 1);
        let t = Instant::now();
        let v = paceline_policy::parse_str(&text, "generated.yaml", &OfflineHost).expect("a valid policy");
        pv.push(t.elapsed().as_secs_f64() * 1e3);
        drop(v);
        runs.push(compile_after(&text, &mut None));
    }
    pv.sort_by(f64::total_cmp);
    println!(
        "{rules} rules: full, median ms: parse+validate {:.1}, {}",
        pv[pv.len() / 2],
        medians(&runs)
    );
}

fn main() {
    let arg = |i: usize, d: u32| {
        std::env::args()
            .nth(i)
            .map_or(d, |a| a.parse().expect("a number"))
    };
    match std::env::args().nth(1).as_deref() {
        Some("edit") => return edits(arg(2, 100_000), arg(3, 5)),
        Some("full") => return fulls(arg(2, 100_000), arg(3, 5)),
        _ => {}
    }
    let args: Vec<u32> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a number"))
        .collect();
    let rules = args.first().copied().unwrap_or(100_000);
    let per_rule = args.get(1).copied().unwrap_or(1000);
    let classes = args.get(2).copied().unwrap_or(16);
    let text = yaml(rules, per_rule, classes);
    let t0 = Instant::now();
    let v = paceline_policy::parse_str(&text, "generated.yaml", &OfflineHost).expect("a valid policy");
    let t1 = Instant::now();
    let c = paceline_policy::compile(
        &v,
        &CompileContext {
            mode: EnforcementMode::None,
            previous: None,
            all_routes_managed: false,
        },
    )
    .expect("compiles");
    let t2 = Instant::now();
    println!(
        "{} rules, {} KB of YAML: parse+validate {:.3} s, compile {:.3} s; peak RSS {} MB",
        c.rule_table.len(),
        text.len() / 1000,
        (t1 - t0).as_secs_f64(),
        (t2 - t1).as_secs_f64(),
        peak_rss_mb()
    );
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let (ct, bt) = (c.times, c.ctab.times);
    println!(
        "  compile: rules {:.1} ms, classifier {:.1} ms (normalize {:.1}, addresses {:.1}, phases {:.1}, rule table {:.1}, words {:.1}), shadow {:.1} ms",
        ms(ct.rules),
        ms(ct.classifier),
        ms(bt.normalize),
        ms(bt.addresses),
        ms(bt.phases),
        ms(bt.rule_table),
        ms(bt.words),
        ms(ct.shadow)
    );
    println!("  {:?}", c.ctab.stats);
}
