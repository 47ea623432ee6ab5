//! `plbench apply`: parsing, compiling and writing generated policies of 1,000 to 262,144
//! rules into the datapath, as the agent does on a reload, whole and after a one-rule edit,
//! with each stage's time and the peak memory of each size.

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use paceline::kernel::datapath::{Datapath, LoadOptions};
use paceline_tests::policygen;
use serde::Serialize;

use super::{cpu_model, read_trim, write_report};

#[derive(Serialize)]
struct ApplyReport {
    kind: &'static str,
    kernel: String,
    cpu: String,
    trials: usize,
    /// What `full` and `edit` apply.
    full_is: &'static str,
    edit_is: &'static str,
    edit_port_is: &'static str,
    rows: Vec<ApplyRow>,
}

#[derive(Serialize)]
struct ApplyRow {
    rules: u32,
    yaml_bytes: usize,
    full: Stages,
    edit: Stages,
    edit_port: Stages,
    /// The peak resident set of the full applies and of the edits (VmHWM, reset before
    /// each): the edits hold the running policy's compiled form beside the new one, as the
    /// agent does.
    full_peak_rss_bytes: u64,
    edit_peak_rss_bytes: u64,
    classifier_kernel_bytes: u64,
}

/// Medians over the trials, seconds (`apply_max`: the slowest apply).
#[derive(Serialize, Default)]
struct Stages {
    parse_validate: f64,
    /// The policy compiler, of which: the rule table and what is reported of each rule; the
    /// classifier's stages; the covered-rule search.
    compile: f64,
    rules: f64,
    normalize: f64,
    addresses: f64,
    phases: f64,
    rule_table: f64,
    words: f64,
    shadow: f64,
    write: f64,
    /// compile + write: what the agent reports as `paceline_policy_apply_seconds`.
    apply: f64,
    apply_max: f64,
}

impl Stages {
    /// Medians of each field over `runs`.
    fn median(runs: &[Stages]) -> Stages {
        let m = |f: fn(&Stages) -> f64| {
            let mut v: Vec<f64> = runs.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        };
        Stages {
            parse_validate: m(|s| s.parse_validate),
            compile: m(|s| s.compile),
            rules: m(|s| s.rules),
            normalize: m(|s| s.normalize),
            addresses: m(|s| s.addresses),
            phases: m(|s| s.phases),
            rule_table: m(|s| s.rule_table),
            words: m(|s| s.words),
            shadow: m(|s| s.shadow),
            write: m(|s| s.write),
            apply: m(|s| s.apply),
            apply_max: runs.iter().map(|s| s.apply).fold(0.0, f64::max),
        }
    }
}

/// What the generated policies' rules are and how the edit changes one (the report says it).
const FULL_IS: &str = "policygen::BigPolicy (tenant lists of 1,000 /32 destinations under one UDP port each, \
    16 tenant classes, one probe rule), variant 1..=trials, each compiled from nothing and written \
    into a freshly loaded datapath (both banks empty), as at the agent's start";
const EDIT_IS: &str = "the running policy with one rule's address replaced: the address of expanded rule \
    p_k = (n/2 + 7919 k) mod (n - 1) becomes 10.200.x.y/32, an address in no list (sorted after \
    every other, so the address classes between move); edit k follows edit k-1, so the standby bank \
    holds edit k-2; the first edit after the full applies (into a bank holding another policy) is not \
    counted";

const EDIT_PORT_IS: &str = "the running policy (variant 0 after the address edits) with the probe rule's \
    port changed (7001 + k), edit k after edit k-1: no address changes; the first two (written into \
    banks holding an address edit) are not counted";

/// One apply: parse and validate `text`, compile it after `previous`, write it.
fn apply_once(
    dp: &mut Datapath,
    text: &str,
    previous: &mut Option<paceline_policy::Compiled>,
) -> Result<Stages> {
    use paceline_policy::{self as policy, CompileContext, EnforcementMode, OfflineHost};
    use std::time::Instant;
    // The previous apply's grace period, if it still runs, is not this apply's: an agent's
    // reloads come seconds apart (one within a grace period of the last waits the rest).
    dp.settle();
    let t0 = Instant::now();
    let v = policy::parse_str(text, "generated.yaml", &OfflineHost)
        .map_err(|e| anyhow::anyhow!("the generated policy is invalid: {e:?}"))?;
    let t1 = Instant::now();
    let slots = previous.as_ref().map(|c| c.slots());
    let ctx = CompileContext {
        mode: EnforcementMode::None,
        previous: slots.as_ref(),
        all_routes_managed: false,
    };
    // As the agent compiles a reload: after the running policy.
    let c = match previous {
        Some(p) => policy::compile_after(&v, &ctx, p)?,
        None => policy::compile(&v, &ctx)?,
    };
    let t2 = Instant::now();
    dp.write_policy(&c.table, &c.ctab)?;
    let t3 = Instant::now();
    let (ct, bt) = (c.times, c.ctab.times);
    let st = Stages {
        parse_validate: (t1 - t0).as_secs_f64(),
        compile: (t2 - t1).as_secs_f64(),
        rules: ct.rules.as_secs_f64(),
        normalize: bt.normalize.as_secs_f64(),
        addresses: bt.addresses.as_secs_f64(),
        phases: bt.phases.as_secs_f64(),
        rule_table: bt.rule_table.as_secs_f64(),
        words: bt.words.as_secs_f64(),
        shadow: ct.shadow.as_secs_f64(),
        write: (t3 - t2).as_secs_f64(),
        apply: (t3 - t1).as_secs_f64(),
        apply_max: 0.0,
    };
    *previous = Some(c);
    Ok(st)
}

pub(super) fn apply(rule_counts: Vec<u32>, trials: usize, out: Option<PathBuf>) -> Result<()> {
    let mut dp = Datapath::load(&LoadOptions::default())?;
    let mut rows = Vec::new();
    let policy = |rules: u32, variant: u32| {
        policygen::BigPolicy {
            interfaces: "[eth0]".into(),
            rules,
            per_rule: 1000,
            variant,
            probe: ("probe".into(), 7001, "192.0.2.1/32".into()),
            probe_first: false,
        }
        .yaml()
    };
    for n in rule_counts {
        reset_peak_rss();
        // Full applies, as at the agent's start: a fresh datapath (both banks empty) each.
        let mut full = Vec::new();
        for trial in 0..trials {
            let mut fresh = Datapath::load(&LoadOptions::default())?;
            let st = apply_once(&mut fresh, &policy(n, 1 + trial as u32), &mut None)?;
            println!(
                "{n} rules, full apply {trial}: parse+validate {:.3} s, compile {:.3} s, write {:.3} s",
                st.parse_validate, st.compile, st.write
            );
            full.push(st);
        }
        let full_peak = peak_rss();
        reset_peak_rss();
        // Edits of variant 0 (whose rule i has the address tenant_v4(i)): one address each.
        let base = policy(n, 0);
        let yaml_bytes = base.len();
        let mut previous = None;
        apply_once(&mut dp, &base, &mut previous)?;
        let mut edits = Vec::new();
        for k in 1..=trials as u32 + 1 {
            let at = (n / 2 + 7919 * k) % (n - 1);
            let [a, b, c, d] = policygen::tenant_v4(at);
            let from = format!("{a}.{b}.{c}.{d}/32");
            let to = format!("10.200.{}.{}/32", k >> 8, k & 255);
            let text = [", ", "["]
                .iter()
                .find(|sep| base.contains(&format!("{sep}{from}")))
                .map(|sep| base.replacen(&format!("{sep}{from}"), &format!("{sep}{to}"), 1))
                .with_context(|| format!("rule {at}'s address {from} is not in the generated policy"))?;
            let st = apply_once(&mut dp, &text, &mut previous)?;
            println!(
                "{n} rules, edit {k} (rule {at}: {from} -> {to}): compile {:.4} s, write {:.4} s",
                st.compile, st.write
            );
            if k > 1 {
                edits.push(st);
            }
        }
        // Edits of one rule's port (the probe, last): no address class moves.
        let mut port_edits = Vec::new();
        for k in 1..=trials as u32 + 2 {
            let text = base.replacen("dst_port: 7001,", &format!("dst_port: {},", 7001 + k), 1);
            let st = apply_once(&mut dp, &text, &mut previous)?;
            println!(
                "{n} rules, port edit {k}: compile {:.4} s, write {:.4} s",
                st.compile, st.write
            );
            // The first two wrote banks that held an address edit.
            if k > 2 {
                port_edits.push(st);
            }
        }
        let row = ApplyRow {
            rules: n,
            yaml_bytes,
            full: Stages::median(&full),
            edit: Stages::median(&edits),
            edit_port: Stages::median(&port_edits),
            full_peak_rss_bytes: full_peak,
            edit_peak_rss_bytes: peak_rss(),
            classifier_kernel_bytes: previous.as_ref().map_or(0, |c| c.ctab.stats.kernel_bytes()),
        };
        println!(
            "{n} rules ({} KB of YAML): full apply {:.3} s (compile {:.3} s, write {:.3} s; max {:.3} s), \
             parse+validate {:.3} s; one-rule edit {:.4} s (compile {:.4} s, write {:.4} s); peak RSS {} MB \
             (full), {} MB (edits); classifier {:.1} MiB of kernel memory",
            yaml_bytes / 1000,
            row.full.apply,
            row.full.compile,
            row.full.write,
            row.full.apply_max,
            row.full.parse_validate,
            row.edit.apply,
            row.edit.compile,
            row.edit.write,
            row.full_peak_rss_bytes / 1_000_000,
            row.edit_peak_rss_bytes / 1_000_000,
            row.classifier_kernel_bytes as f64 / 1048576.0
        );
        rows.push(row);
    }
    let report = ApplyReport {
        kind: "bench-apply",
        kernel: read_trim("/proc/sys/kernel/osrelease"),
        cpu: cpu_model(),
        trials,
        full_is: FULL_IS,
        edit_is: EDIT_IS,
        edit_port_is: EDIT_PORT_IS,
        rows,
    };
    write_report(&report, out)
}

/// Starts the peak resident set over from the current one (`clear_refs` 5, Linux 4.0+).
fn reset_peak_rss() {
    if let Err(e) = std::fs::write("/proc/self/clear_refs", "5") {
        eprintln!("the peak RSS is not reset between rows: /proc/self/clear_refs: {e}");
    }
}

/// The process's peak resident set (VmHWM), bytes.
fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}
