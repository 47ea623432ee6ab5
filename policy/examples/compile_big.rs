//! Times the stages of compiling a large generated policy, without a kernel: parse and
//! validate, the policy compiler, and inside it the classifier's stages, with the peak RSS.
//!
//! ```sh
//! cargo run -p paceline-policy --release --example compile_big -- 100000 [per_rule] [classes]
//! ```
//!
//! The policy has the shape of `paceline-tests`' `policygen::BigPolicy` (what `plbench apply`
//! writes into the datapath): `per_rule` /32 destinations under one UDP port per YAML rule,
//! `classes` tenant classes.

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

fn main() {
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
