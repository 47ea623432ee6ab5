//! `cargo xtask test`: the project's whole test command.
//!
//! 1. Host (`--kernel host`): `cargo test --workspace` (minus the members that are not default
//!    members, i.e. the eBPF crate that only builds for the bpf target): unit tests (among them
//!    every fuzz seed replayed through its target's check, `fuzz/checks`) and the privileged
//!    integration tests, run as root on the host kernel.
//! 2. VMs (`--kernel 6.1`, `--kernel 6.12`): `paceline-tests`' integration test binaries (built
//!    by the same `cargo test --workspace --no-run`, so nothing is compiled twice) run inside a
//!    VM booting Debian 12's 6.1 kernel (clsact, sch_fq), then one booting its 6.12 kernel (tcx,
//!    sch_fq); see `vm.rs`. One boot per test binary and kernel. The modules in [`HOST_ONLY`]
//!    (a benefit in real time, such as D3's deadlines against TCP's, the agent's logic at
//!    scale and its handling of files and ports) are left out there, and the tests in
//!    [`NEWEST_VM_ONLY`] (operator workflows, the mechanisms' end-to-end runs) run on 6.12
//!    only: 6.1 checks what differs by kernel.
//!
//! 3. Fuzz (after step 1; `--no-fuzz` skips it): every cargo-fuzz target, all at once, for
//!    [`FUZZ_SECS`] seconds of a CPU each with a fixed libFuzzer seed, from its seed directories
//!    (`fuzz/seeds/<target>`, and the shipped policies and invalid-policy fixtures for `policy`;
//!    see `fuzz.rs`; building the targets with nightly takes a few minutes the first time).
//!
//! `--kernel` takes `host`, `6.1`, `6.12`, `vm` (both VMs), `all` (the default) or a
//! comma-separated list; `--no-vm`/`--host-only` and `--vm-only` are the older spellings of
//! `host` and `vm`.
//!
//! On each kernel, before its tests, the agent starts once in a throwaway network namespace
//! on a veth pair with `enforcement: auto` and its start-up log is kept: the feature probe
//! (`kernel R: tcx=.. sch_fq=..`), the attach mode and the root qdisc it chose. The summary
//! shows them, and they must agree with the kernel's build configuration (`CONFIG_NET_XGRESS`
//! for tcx, `CONFIG_NET_SCH_FQ`, `CONFIG_NET_SCH_HTB`, `CONFIG_NET_SCH_INGRESS` for clsact):
//! the tests that check the attach and enforcement modes expect what the agent's probe says,
//! so a probe that misjudged a kernel would otherwise go unnoticed.
//!
//! Arguments after `--` go to every test binary (filters, `--nocapture`, ...); `--show-output` is
//! added so that the `SKIPPED: <why>` lines of tests that skipped themselves can be counted (of the
//! output of passing tests only those lines are echoed). Prints a summary per kernel (passed,
//! skipped, failed, ignored, time), the ten slowest tests, and ends with `total: N passed, M
//! failed, K skipped`; exits non-zero if anything failed.

mod libtest;
mod probe;

use crate::vm::{self, SERIES, Series};
use anyhow::{Context, Result, bail};
use libtest::{Counts, LibtestEcho, run_group, run_streaming};
use probe::{Expected, PROBE_SCRIPT, Probe, host_config, probe_row};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Where the privileged suite runs: host, 6.1, 6.12, vm (both VMs), all (the default), or
    /// a comma-separated list (6.1 and 6.12 are Debian 12 kernels booted in qemu).
    #[arg(long, value_name = "host|6.1|6.12|vm|all", value_delimiter = ',')]
    kernel: Vec<String>,
    /// Run the integration tests in the VMs too (the default).
    #[arg(long, overrides_with_all = ["no_vm"])]
    vm: bool,
    /// Skip the VMs (host kernel only; same as `--kernel host`).
    #[arg(long = "no-vm", visible_alias = "host-only", overrides_with_all = ["vm"])]
    no_vm: bool,
    /// Only the VMs (skip `cargo test --workspace` on the host; same as `--kernel vm`).
    #[arg(long, conflicts_with = "no_vm")]
    vm_only: bool,
    /// Skip the short seeded fuzz run.
    #[arg(long)]
    no_fuzz: bool,
    /// Kill a VM test binary after this many seconds.
    #[arg(long, default_value_t = 1800)]
    vm_timeout: u64,
    /// VM memory in MiB.
    #[arg(long, default_value_t = 2048)]
    vm_mem: u32,
    /// VM vCPUs.
    #[arg(long, default_value_t = 2)]
    vm_smp: u32,
    /// Show the VM's whole kernel log.
    #[arg(long)]
    vm_verbose: bool,
    /// Arguments for the test binaries (after `--`), e.g. a name filter.
    #[arg(last = true)]
    test_args: Vec<String>,
}

/// Where the suite runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Target {
    Host,
    Vm(Series),
}

fn targets(a: &Args) -> Result<Vec<Target>> {
    fn add(t: &mut Vec<Target>, x: Target) {
        if !t.contains(&x) {
            t.push(x);
        }
    }
    let mut t: Vec<Target> = Vec::new();
    let names: Vec<&str> = if a.kernel.is_empty() {
        vec!["all"]
    } else {
        a.kernel.iter().map(|s| s.trim()).collect()
    };
    for n in names {
        match n {
            "host" => add(&mut t, Target::Host),
            "all" | "vm" => {
                if n == "all" {
                    add(&mut t, Target::Host);
                }
                for s in SERIES {
                    add(&mut t, Target::Vm(*s));
                }
            }
            other => {
                let series = vm::parse_series(other)
                    .map_err(|e| anyhow::anyhow!("--kernel: {e}, or host, vm (both VMs)"))?;
                for s in series {
                    add(&mut t, Target::Vm(s));
                }
            }
        }
    }
    if a.no_vm {
        t.retain(|x| *x == Target::Host);
    }
    if a.vm_only {
        t.retain(|x| *x != Target::Host);
    }
    // a custom PACELINE_VM_KERNEL directory is one kernel, booted once
    if vm::boot_list(SERIES).len() < SERIES.len() {
        let mut seen_vm = false;
        t.retain(|x| match x {
            Target::Host => true,
            Target::Vm(_) => !std::mem::replace(&mut seen_vm, true),
        });
    }
    if t.is_empty() {
        bail!("--kernel/--no-vm/--vm-only select no kernel");
    }
    Ok(t)
}

/// How many of the slowest tests the summary names (where CI's time goes).
const SLOWEST_SHOWN: usize = 10;

/// One line of the summary.
struct Row {
    kernel: String,
    what: String,
    counts: Counts,
    ok: bool,
    note: String,
    secs: Option<f64>,
}

pub fn run(a: Args) -> Result<()> {
    if let Err(e) = run_inner(a) {
        eprintln!("xtask test: error: {e:#}");
        std::process::exit(1);
    }
    Ok(())
}

fn fmt_secs(s: f64) -> String {
    let s = s.round() as u64;
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

fn run_inner(a: Args) -> Result<()> {
    let t_all = Instant::now();
    let targets = targets(&a)?;
    let root = vm::repo_root();
    let mut rows: Vec<Row> = Vec::new();
    let host_kernel = uname_r();
    let excluded = non_default_members(&root)?;
    let mut test_args = a.test_args.clone();
    if !test_args
        .iter()
        .any(|x| x == "--show-output" || x == "--nocapture")
    {
        test_args.push("--show-output".into());
    }

    if targets.contains(&Target::Host) {
        println!("==> host kernel {host_kernel}: cargo test --workspace");
        let t0 = Instant::now();
        let mut cmd = Command::new(cargo());
        // --no-fail-fast: a failing test binary (say the deploy tests) must not keep the
        // privileged suite from running and being counted.
        cmd.current_dir(&root)
            .args(["test", "--workspace", "--no-fail-fast"]);
        // One test at a time within each test binary: the privileged tests measure rates and
        // deadlines on a 2-core machine, and two of them at once disturb each other (the
        // suite takes about 30 s longer this way).
        if std::env::var_os("RUST_TEST_THREADS").is_none() {
            cmd.env("RUST_TEST_THREADS", "1");
        }
        for p in &excluded {
            cmd.args(["--exclude", p]);
        }
        cmd.arg("--").args(&test_args);
        let (ok, counts) = run_streaming(cmd, "host")?;
        rows.push(Row {
            kernel: format!("host {host_kernel}"),
            what: "cargo test --workspace".into(),
            counts,
            ok: ok && counts.failed == 0,
            note: if excluded.is_empty() {
                String::new()
            } else {
                format!("(excluded {})", excluded.join(", "))
            },
            secs: Some(t0.elapsed().as_secs_f64()),
        });
        stop_if_interrupted(&rows)?;
        if !a.no_fuzz {
            rows.push(fuzz_row(&root, &host_kernel));
            stop_if_interrupted(&rows)?;
        }
    }

    let vms: Vec<Series> = targets
        .iter()
        .filter_map(|t| match t {
            Target::Vm(s) => Some(*s),
            Target::Host => None,
        })
        .collect();
    println!("==> the integration tests and the agent for the probes: cargo test --workspace --no-run");
    let built = match build_integration_tests(&root, &excluded) {
        Ok(b) => Some(b),
        Err(e) => {
            rows.push(failed_row("build", "cargo test --no-run", &e));
            None
        }
    };
    stop_if_interrupted(&rows)?;

    if targets.contains(&Target::Host)
        && let Some(b) = &built
    {
        println!("==> host kernel {host_kernel}: the agent's feature probe");
        let expected = Expected::from_config(&host_config());
        let out = Command::new("sh")
            .args(["-c", PROBE_SCRIPT, "sh"])
            .arg(&b.agent)
            .stderr(Stdio::inherit())
            .output()
            .context("running the agent's feature probe")?;
        let text = String::from_utf8_lossy(&out.stdout);
        print!("{text}");
        rows.push(probe_row(
            &format!("host {host_kernel}"),
            &Probe::parse(&text),
            &expected,
        ));
    }

    if let Some(b) = &built {
        for series in &vms {
            let t0 = Instant::now();
            if let Err(e) = vm_part(&a, series, b, &test_args, &mut rows) {
                eprintln!("xtask test: VM step on {} failed: {e:#}", series.name);
                let mut r = failed_row(&format!("vm {}", series.name), "VM step", &e);
                r.secs = Some(t0.elapsed().as_secs_f64());
                rows.push(r);
            }
            stop_if_interrupted(&rows)?;
        }
    }

    // summary
    println!();
    println!("==> summary");
    let (mut p, mut f, mut sk) = (0, 0, 0);
    for r in &rows {
        print_row(r);
        p += r.counts.ran();
        sk += r.counts.skipped;
        f += r.counts.failed;
        if !r.ok && r.counts.failed == 0 {
            f += 1; // a failed step without test counts (build error, VM failure) still counts
        }
    }
    let not_run: Vec<&str> = [("host", Target::Host)]
        .into_iter()
        .chain(SERIES.iter().map(|s| (s.name, Target::Vm(*s))))
        .filter(|(_, t)| !targets.contains(t))
        .map(|(n, _)| n)
        .collect();
    if !not_run.is_empty() {
        println!("  (not run: {}; see --kernel)", not_run.join(", "));
    }
    let kernels: Vec<&str> = {
        let mut k: Vec<&str> = rows.iter().map(|r| r.kernel.as_str()).collect();
        k.dedup();
        k
    };
    println!("  kernels: {}", kernels.join(", "));
    let slow = libtest::slowest(SLOWEST_SHOWN);
    if !slow.is_empty() {
        println!("  slowest tests:");
        for (kernel, name, secs) in slow {
            println!("    {secs:7.1} s  {kernel}  {name}");
        }
    }
    println!("  time: {}", fmt_secs(t_all.elapsed().as_secs_f64()));
    println!("total: {p} passed, {f} failed, {sk} skipped");
    let _ = std::io::stdout().flush();
    if rows.iter().any(|r| !r.ok) {
        std::process::exit(1);
    }
    Ok(())
}

fn print_row(r: &Row) {
    println!(
        "  {:<7} {:<32} {:<28} {}{}{}",
        if r.ok { "ok" } else { "FAILED" },
        r.kernel,
        r.what,
        if r.counts.seen {
            format!("{} ", r.counts.show())
        } else {
            String::new()
        },
        r.secs.map(|s| format!("[{}] ", fmt_secs(s))).unwrap_or_default(),
        r.note
    );
}

fn failed_row(kernel: &str, what: &str, e: &anyhow::Error) -> Row {
    Row {
        kernel: kernel.into(),
        what: what.into(),
        counts: Counts {
            failed: 1,
            ..Default::default()
        },
        ok: false,
        note: format!("{e:#}"),
        secs: None,
    }
}

/// Seconds of a CPU each cargo-fuzz target gets in `cargo xtask test` (they run at once).
pub const FUZZ_SECS: u64 = 20;

/// Integration tests the VM runs leave out (`--skip`): D3's and DASR's benefit, whose claims
/// are benefits in real time, which the emulator does not keep; and the agent's own logic at scale or over
/// time (a real Prometheus scraping three agents, 100,000-rule policies replaced under
/// traffic, a minute of reloads and a SIGHUP storm): what they ask of the kernel (loading,
/// attaching, map swaps) the other tests check on every kernel, and under emulation they took
/// 94 s, 79 s and 73 s on 6.12 (2026-12-02). Likewise the fleet's workflows over the API
/// (`fleet diff`, backup and rollback, events, the API's token, Alertmanager's webhook):
/// HTTP between agents, which asks nothing of the kernel that the agent tests do not; they
/// took 46 s, 21 s and 16 s on 6.1 under emulation (2026-12-05).
///
/// The agent's handling of its files, ports and peers is left to the host as well (a second
/// agent on the same state directory, the metrics port taken, the policy file deleted or
/// swapped as a ConfigMap does, a rejection cleared, history and rollback, `paceline top`,
/// interfaces following the default route): the agent's own logic, whose kernel side (load,
/// attach, a policy written and swapped) every VM test exercises. Under emulation they took
/// 88 s on 6.1 and 109 s on 6.12 (2026-12-05).
///
/// Running the two VMs side by side instead was tried (2026-12-05): each emulated machine
/// uses both of this machine's cores, so together they took as long as one after the other,
/// and an agent's start on 6.1 (verifying the egress program) went from 16 s to over 45 s.
const HOST_ONLY: &[&str] = &[
    "dasr_e2e::against_plain_tcp",
    "prometheus::",
    "agent_scale::",
    "soak::a_reload_soak",
    "fleet::",
    "alerts::",
    "api_token::",
    "agent::second_agent_with_same_state_dir",
    "agent::reload_follows_a_configmap_style_symlink_swap",
    "soak::a_metrics_port_already_taken",
    "soak::a_policy_file_deleted",
    "ops::auto_interfaces_follow_the_default_route",
    "ops::top_shows_live_rates",
    "ops::a_bad_policy_then_the_good_file_back",
    "ops::reload_diff_history_rollback",
];

/// Tests that run on the host and on the newest VM kernel, not on every one. Linux 6.1 is
/// the oldest kernel supported: there the suite checks what differs by kernel (the programs
/// through its verifier, the clsact attach and its adoption after kill -9, EDT enforced by fq
/// behind a clsact classifier, health checks, cleanup, the feature probe and what it
/// degrades, `ip netns exec`), and leaves to 6.12 (and the host):
/// - the agent's operator workflows (a reload, `classify`, `flows` and `cleanup --check`, a
///   running `paceline trace`): what they ask of the kernel the tests above check on each
///   (the trace program itself: the BPF_PROG_TEST_RUN trace tests);
/// - the mechanisms' end-to-end runs (D3 through a router, DASR, CoDel, the flow-table flood,
///   the D3 application map's permissions): the same programs and maps, whose kernel-side parts
///   the BPF_PROG_TEST_RUN tests check on 6.1 too;
/// - an upgrade that resets the generation-keyed maps with a changed policy table: the agent's
///   own bookkeeping of its pins, whose adoption on 6.1 the kill -9 tests check (22-25 s there
///   under emulation, each agent start verifying the egress program again).
///
/// Under emulation on 6.1 the end-to-end runs took 364 s of a 923-s run (2026-12-02).
const NEWEST_VM_ONLY: &[&str] = &[
    "agent::a_policy_table_of_another_type",
    "soak::new_flows_four_times",
    "soak::the_d3_application_map",
    "ops::classify_flows_and_cleanup_check",
    "ops::flows_that_nothing_is_kept_for",
    "agent::reload_applies_a_good_policy",
    "trace::trace_shows_a_running_agents_packets",
    "d3_e2e::",
    "dasr_e2e::",
    "codel_e2e::",
];

fn fuzz_row(root: &Path, host_kernel: &str) -> Row {
    println!("==> fuzz: every cargo-fuzz target at once, {FUZZ_SECS} s of a CPU each, seed 1");
    let what = format!("cargo fuzz (seeded, {FUZZ_SECS} CPU s/target)");
    let t0 = Instant::now();
    match crate::fuzz::short_run(root, FUZZ_SECS) {
        Ok(outs) => {
            let failed = outs.iter().filter(|o| !o.ok).count() as u64;
            Row {
                kernel: format!("host {host_kernel}"),
                what,
                counts: Counts {
                    passed: outs.len() as u64 - failed,
                    failed,
                    seen: true,
                    ..Counts::default()
                },
                ok: failed == 0,
                note: outs
                    .iter()
                    .map(|o| format!("{}: {}", o.target, o.note))
                    .collect::<Vec<_>>()
                    .join("; "),
                secs: Some(t0.elapsed().as_secs_f64()),
            }
        }
        Err(e) => Row {
            kernel: format!("host {host_kernel}"),
            what,
            counts: Counts::default(),
            ok: false,
            note: format!("{e:#}"),
            secs: Some(t0.elapsed().as_secs_f64()),
        },
    }
}

fn vm_part(
    a: &Args,
    series: &Series,
    built: &Built,
    test_args: &[String],
    rows: &mut Vec<Row>,
) -> Result<()> {
    let flags = vm::VmFlags {
        timeout: a.vm_timeout,
        mem: a.vm_mem,
        smp: a.vm_smp,
        verbose: a.vm_verbose,
    };
    let machine = vm::Vm::prepare(*series)?;
    let label = format!("vm {} ({})", machine.kernel.release, machine.accel);
    let expected = Expected::from_config(&machine.kernel.config());
    if built.bins.is_empty() {
        bail!("paceline-tests has no integration test binary");
    }
    for (i, b) in built.bins.iter().enumerate() {
        println!("==> {label}: {} {}", b.name, a.test_args.join(" "));
        // The agent's probe runs once per kernel, in the first binary's boot.
        let mut command: Vec<String> = if i == 0 {
            vec![
                "sh".into(),
                "-c".into(),
                format!("( {PROBE_SCRIPT} )\nshift\nexec \"$@\"\n"),
                "sh".into(),
                built.agent.to_string_lossy().into_owned(),
            ]
        } else {
            Vec::new()
        };
        command.push(b.exe.to_string_lossy().into_owned());
        command.extend(test_args.iter().cloned());
        // Claims of a timing benefit (D3's deadlines against TCP's) hold on real time only:
        // under TCG the emulator sets the timing. They run on the host. Some run on the newest
        // VM kernel only (see NEWEST_VM_ONLY).
        let newest = SERIES.last() == Some(series);
        command.extend(
            HOST_ONLY
                .iter()
                .chain(if newest { &[][..] } else { NEWEST_VM_ONLY })
                .flat_map(|m| ["--skip".to_string(), (*m).to_string()]),
        );
        let req = vm::Request {
            flags: flags.clone(),
            command,
            cwd: Some(b.manifest_dir.clone()),
            env: vec![
                (
                    "CARGO_MANIFEST_DIR".into(),
                    b.manifest_dir.to_string_lossy().into_owned(),
                ),
                ("CARGO_PKG_NAME".into(), "paceline-tests".into()),
                // Tests bound by wall-clock deadlines adapt to (or skip under) emulation.
                ("PACELINE_VM_ACCEL".into(), machine.accel.to_string()),
                // One test at a time: two emulated CPUs under TCG are too few for two rate
                // measurements (or a D3 deadline) to share without stalling each other.
                (
                    "RUST_TEST_THREADS".into(),
                    std::env::var("RUST_TEST_THREADS").unwrap_or_else(|_| "1".into()),
                ),
            ],
            modules: vec![],
            capture_stdout: true,
        };
        let t0 = Instant::now();
        let what = format!("cargo test --test {}", b.name);
        // An emulator fault (a guest kernel killed by a stale breakpoint, see
        // `vm::EmulatorFault`) is not the tests' doing: the run starts again in a new VM, once,
        // and the summary says so. Any other failure, or a second fault, stands.
        let mut retried: Option<String> = None;
        let result = loop {
            let mut echo = LibtestEcho::new(&label);
            let sink: vm::StdoutSink = Box::new(move |data: &[u8]| {
                let mut o = std::io::stdout().lock();
                echo.feed(data, &mut |b| {
                    let _ = o.write_all(b);
                });
                let _ = o.flush();
            });
            match machine.run_with(&req, Some(sink)) {
                Err(e) if retried.is_none() && e.downcast_ref::<vm::EmulatorFault>().is_some() => {
                    eprintln!(
                        "xtask test: {} in the VM: {e:#}; running it again in a new VM",
                        b.name
                    );
                    retried = Some(format!("{e:#}"));
                    stop_if_interrupted(rows)?;
                }
                r => break r,
            }
        };
        let again = |note: String| match &retried {
            Some(f) => format!("{note}; run again after: {f}"),
            None => note,
        };
        match result {
            Ok(o) => {
                let mut counts = Counts::default();
                let stdout = String::from_utf8_lossy(&o.stdout);
                for line in stdout.lines() {
                    counts.add_line(line);
                }
                let boot = o
                    .boot_secs
                    .map(|s| format!("{s:.1} s"))
                    .unwrap_or_else(|| "?".into());
                rows.push(Row {
                    kernel: label.clone(),
                    what,
                    counts,
                    ok: o.status == 0,
                    note: again(format!(
                        "(boot {boot}{}){}",
                        if newest {
                            String::new()
                        } else {
                            format!(
                                "; {} groups of tests left to the newest kernel (NEWEST_VM_ONLY)",
                                NEWEST_VM_ONLY.len()
                            )
                        },
                        if o.status != 0 {
                            format!(" exit status {}", o.status)
                        } else {
                            String::new()
                        }
                    )),
                    secs: Some(t0.elapsed().as_secs_f64()),
                });
                if i == 0 {
                    rows.push(probe_row(&label, &Probe::parse(&stdout), &expected));
                }
            }
            Err(e) => {
                eprintln!("xtask test: {} in the VM: {e:#}", b.name);
                rows.push(Row {
                    kernel: label.clone(),
                    what,
                    counts: Counts::default(),
                    ok: false,
                    note: again(format!("{e:#}")),
                    secs: Some(t0.elapsed().as_secs_f64()),
                });
            }
        }
        stop_if_interrupted(rows)?;
    }
    Ok(())
}

struct TestBin {
    name: String,
    exe: PathBuf,
    manifest_dir: PathBuf,
}

/// What the VMs and the probes run.
struct Built {
    bins: Vec<TestBin>,
    /// The `plagent` binary (the agent's CLI, built for the tests).
    agent: PathBuf,
}

/// Builds the workspace's tests as the host step does (same packages and features, so
/// nothing is compiled twice) and returns paceline-tests' integration test executables and
/// its agent binary.
fn build_integration_tests(root: &Path, excluded: &[String]) -> Result<Built> {
    let mut cmd = Command::new(cargo());
    cmd.current_dir(root).args([
        "test",
        "--workspace",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]);
    for p in excluded {
        cmd.args(["--exclude", p]);
    }
    let tests_dir = root.join("tests");
    let mut bins = Vec::new();
    let mut agent = None;
    let ok = run_group(cmd, |line| {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            return;
        };
        if v["reason"] != "compiler-artifact" {
            return;
        }
        let manifest_dir = v["manifest_path"]
            .as_str()
            .and_then(|m| Path::new(m).parent())
            .map(Path::to_path_buf)
            .unwrap_or_default();
        if manifest_dir != tests_dir {
            return; // other packages' tests are unit tests: they ran on the host
        }
        let kinds = v["target"]["kind"].as_array().cloned().unwrap_or_default();
        let (Some(exe), Some(name)) = (v["executable"].as_str(), v["target"]["name"].as_str()) else {
            return;
        };
        let is_test = v["profile"]["test"].as_bool().unwrap_or(false);
        if !is_test && name == "plagent" && kinds.iter().any(|k| k == "bin") {
            agent = Some(PathBuf::from(exe));
        }
        if is_test && kinds.iter().any(|k| k == "test") {
            bins.push(TestBin {
                name: name.to_string(),
                exe: PathBuf::from(exe),
                manifest_dir: manifest_dir.clone(),
            });
        }
    })?;
    if !ok {
        bail!("building the tests failed (cargo test --workspace --no-run)");
    }
    let agent = agent.context("cargo built no plagent binary (paceline-tests)")?;
    Ok(Built { bins, agent })
}

fn stop_if_interrupted(rows: &[Row]) -> Result<()> {
    if let Some(sig) = vm::interrupted() {
        for r in rows {
            print_row(r);
        }
        eprintln!("xtask test: interrupted by signal {sig}");
        std::process::exit(130);
    }
    Ok(())
}

/// Workspace members that are not default members (the bpf-only crate): `--workspace` would
/// try to build them for the host.
fn non_default_members(root: &Path) -> Result<Vec<String>> {
    let out = Command::new(cargo())
        .current_dir(root)
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed");
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let defaults: Vec<&str> = v["workspace_default_members"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x.as_str()).collect())
        .unwrap_or_default();
    if defaults.is_empty() {
        return Ok(Vec::new());
    }
    let mut res = Vec::new();
    for id in v["workspace_members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|x| x.as_str())
    {
        if !defaults.contains(&id)
            && let Some(n) = v["packages"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["id"] == id)
                .and_then(|p| p["name"].as_str())
        {
            res.push(n.to_string());
        }
    }
    Ok(res)
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

fn uname_r() -> String {
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut u) } != 0 {
        return "unknown".into();
    }
    unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = "running 2 tests\ntest a ... ok\ntest b ... ok\n\nsuccesses:\n\n---- b stdout ----\nsome output\nSKIPPED: b: needs root\n\n\nsuccesses:\n    a\n    b\n\ntest result: ok. 2 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s\n";

    #[test]
    fn echo_keeps_results_and_skips_and_drops_passing_tests_output() {
        let mut e = LibtestEcho::new("host");
        let mut shown = Vec::new();
        // in pieces, as a pipe delivers them
        for piece in OUT.as_bytes().chunks(7) {
            e.feed(piece, &mut |b| shown.extend_from_slice(b));
        }
        let shown = String::from_utf8(shown).unwrap();
        assert!(shown.contains("test a ... ok ("), "{shown}");
        assert!(shown.contains("SKIPPED: b: needs root\n"), "{shown}");
        assert!(!shown.contains("some output"), "{shown}");
        assert!(!shown.contains("    a\n"), "{shown}");
        assert!(shown.contains("\ntest result: ok. 2 passed"), "{shown}");
        let timed = libtest::slowest(usize::MAX);
        assert!(timed.iter().any(|(k, n, _)| k == "host" && n == "a"), "{timed:?}");
        assert!(timed.iter().any(|(_, n, _)| n == "b"), "{timed:?}");
    }

    #[test]
    fn counts_subtract_skipped_tests_from_passed() {
        let mut c = Counts::default();
        for l in OUT.lines() {
            c.add_line(l);
        }
        assert_eq!((c.ran(), c.skipped, c.failed, c.ignored), (1, 1, 0, 1));
        assert_eq!(c.show(), "1 passed, 1 skipped, 0 failed, 1 ignored");
    }

    #[test]
    fn probe_log_is_checked_against_the_kernel_config() {
        let log = "paceline-probe: [2026-12-01T07:48:03Z INFO  paceline::agent] kernel 6.12.117+deb12-amd64: tcx=true sch_fq=true sch_htb=false clsact=true btf=true cgroup2=/sys/fs/cgroup\n\
                   paceline-probe: [2026-12-01T07:48:03Z INFO  paceline::agent] plprobe0: classifier attached (tcx), root qdisc mq + 2 x fq\n\
                   paceline-probe: [2026-12-01T07:48:03Z INFO  paceline::agent] paceline running: policy p.yaml\n";
        let p = Probe::parse(log);
        assert_eq!(p.attach.as_deref(), Some("tcx"));
        assert_eq!(p.root_qdisc.as_deref(), Some("mq"));
        let config: HashMap<String, String> = [
            ("CONFIG_NET_XGRESS", "y"),
            ("CONFIG_NET_SCH_FQ", "m"),
            ("CONFIG_NET_SCH_HTB", "m"),
            ("CONFIG_NET_SCH_INGRESS", "m"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let row = probe_row("vm", &p, &Expected::from_config(&config));
        assert!(
            !row.ok,
            "sch_htb=false against CONFIG_NET_SCH_HTB=m: {}",
            row.note
        );
        assert!(row.note.contains("sch_htb=false"), "{}", row.note);
        let fixed = Probe::parse(&log.replace("sch_htb=false", "sch_htb=true"));
        let row = probe_row("vm", &fixed, &Expected::from_config(&config));
        assert!(row.ok, "{}", row.note);
        // 6.1: no tcx in its config, so the agent must attach with clsact
        let mut c61 = config.clone();
        c61.remove("CONFIG_NET_XGRESS");
        let row = probe_row("vm", &fixed, &Expected::from_config(&c61));
        assert!(!row.ok && row.note.contains("expected clsact"), "{}", row.note);
    }
}
