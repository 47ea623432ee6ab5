//! `cargo xtask test`: the project's whole test command.
//!
//! 1. Host: `cargo test --workspace` (minus the members that are not default members, i.e. the
//!    eBPF crate that only builds for the bpf target): unit tests and the privileged
//!    integration tests, run as root on the host kernel.
//! 2. VM (default on; `--no-vm`/`--host-only` skip it, `--vm-only` skips step 1): builds
//!    `paceline-tests`' integration test binaries (`cargo test --no-run --message-format=json
//!    -p paceline-tests`) and runs each inside the VM (see `vm.rs`) on Debian's 6.1 kernel,
//!    where sch_fq enforces EDT. While the package has no integration test target yet, the VM
//!    harness self-test runs instead, so the VM kernel is still exercised.
//!
//! Arguments after `--` go to every test binary (filters, `--nocapture`, ...). Prints a summary
//! per kernel and ends with `total: N passed, M failed`; exits non-zero if anything failed.

use crate::vm;
use anyhow::{Context, Result, bail};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[derive(clap::Args)]
pub struct Args {
    /// Run the integration tests in the VM too (the default).
    #[arg(long, overrides_with_all = ["no_vm"])]
    vm: bool,
    /// Skip the VM (host kernel only).
    #[arg(long = "no-vm", visible_alias = "host-only", overrides_with_all = ["vm"])]
    no_vm: bool,
    /// Only the VM part (skip `cargo test --workspace` on the host).
    #[arg(long, conflicts_with = "no_vm")]
    vm_only: bool,
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

/// One line of the summary.
struct Row {
    kernel: String,
    what: String,
    counts: Counts,
    ok: bool,
    note: String,
}

#[derive(Default, Clone, Copy)]
struct Counts {
    passed: u64,
    failed: u64,
    ignored: u64,
    seen: bool,
}

impl Counts {
    /// Adds up libtest's `test result: ok. 3 passed; 0 failed; 1 ignored; ...` lines.
    fn add_line(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix("test result: ") else {
            return;
        };
        self.seen = true;
        for part in rest.split(';') {
            let words: Vec<&str> = part.split_whitespace().collect();
            let n = words
                .iter()
                .rev()
                .nth(1)
                .and_then(|w| w.parse::<u64>().ok())
                .unwrap_or(0);
            match words.last() {
                Some(&"passed") => self.passed += n,
                Some(&"failed") => self.failed += n,
                Some(&"ignored") => self.ignored += n,
                _ => {}
            }
        }
    }
    fn show(&self) -> String {
        if self.seen {
            format!(
                "{} passed, {} failed, {} ignored",
                self.passed, self.failed, self.ignored
            )
        } else {
            "no test results".into()
        }
    }
}

pub fn run(a: Args) -> Result<()> {
    if let Err(e) = run_inner(a) {
        eprintln!("xtask test: error: {e:#}");
        std::process::exit(1);
    }
    Ok(())
}

fn run_inner(a: Args) -> Result<()> {
    let use_vm = !a.no_vm;
    let root = vm::repo_root();
    let mut rows: Vec<Row> = Vec::new();
    let host_kernel = uname_r();

    if !a.vm_only {
        println!("==> host kernel {host_kernel}: cargo test --workspace");
        let excluded = non_default_members(&root)?;
        let mut cmd = Command::new(cargo());
        cmd.current_dir(&root).args(["test", "--workspace"]);
        // One test at a time within each test binary: the privileged tests measure rates and
        // deadlines on a 2-core machine, and two of them at once disturb each other (the
        // suite takes about 30 s longer this way).
        if std::env::var_os("RUST_TEST_THREADS").is_none() {
            cmd.env("RUST_TEST_THREADS", "1");
        }
        for p in &excluded {
            cmd.args(["--exclude", p]);
        }
        if !a.test_args.is_empty() {
            cmd.arg("--").args(&a.test_args);
        }
        let (ok, counts) = run_streaming(cmd)?;
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
        });
        stop_if_interrupted(&rows)?;
    }

    if use_vm {
        match vm_part(&a, &root, &mut rows) {
            Ok(()) => {}
            Err(e) => {
                eprintln!("xtask test: VM step failed: {e:#}");
                rows.push(Row {
                    kernel: "vm".into(),
                    what: "VM step".into(),
                    counts: Counts {
                        failed: 1,
                        ..Default::default()
                    },
                    ok: false,
                    note: format!("{e:#}"),
                });
            }
        }
    }

    // summary
    println!();
    println!("==> summary");
    let (mut p, mut f) = (0, 0);
    for r in &rows {
        println!(
            "  {:<8} {:<28} {:<40} {} {}",
            if r.ok { "ok" } else { "FAILED" },
            r.kernel,
            r.what,
            r.counts.show(),
            r.note
        );
        p += r.counts.passed;
        f += r.counts.failed;
        if !r.ok && r.counts.failed == 0 {
            f += 1; // a failed step without test counts (build error, VM failure) still counts
        }
    }
    if !use_vm {
        println!("  (VM kernel skipped: --no-vm/--host-only)");
    }
    let kernels: Vec<&str> = {
        let mut k: Vec<&str> = rows.iter().map(|r| r.kernel.as_str()).collect();
        k.dedup();
        k
    };
    println!("  kernels: {}", kernels.join(", "));
    println!("total: {p} passed, {f} failed");
    let _ = std::io::stdout().flush();
    if rows.iter().any(|r| !r.ok) {
        std::process::exit(1);
    }
    Ok(())
}

fn vm_part(a: &Args, root: &Path, rows: &mut Vec<Row>) -> Result<()> {
    let flags = vm::VmFlags {
        timeout: a.vm_timeout,
        mem: a.vm_mem,
        smp: a.vm_smp,
        verbose: a.vm_verbose,
    };
    println!("==> building the integration tests for the VM: cargo test --no-run -p paceline-tests");
    let bins = build_integration_tests(root)?;
    stop_if_interrupted(rows)?;
    let machine = vm::Vm::prepare()?;
    let label = format!("vm {} ({})", machine.kernel.release, machine.accel);
    if bins.is_empty() {
        println!(
            "==> {label}: paceline-tests has no integration test target yet; running the VM harness self-test"
        );
        let (passed, failed) = machine.selftest(&flags)?;
        rows.push(Row {
            kernel: label,
            what: "vm selftest (no integration tests yet)".into(),
            counts: Counts {
                passed: passed as u64,
                failed: failed as u64,
                ignored: 0,
                seen: true,
            },
            ok: failed == 0,
            note: String::new(),
        });
        return Ok(());
    }
    for b in bins {
        println!("==> {label}: {} {}", b.name, a.test_args.join(" "));
        let mut command = vec![b.exe.to_string_lossy().into_owned()];
        command.extend(a.test_args.iter().cloned());
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
                // Tests bound by wall-clock deadlines skip themselves under emulation.
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
        match machine.run(&req) {
            Ok(o) => {
                let mut counts = Counts::default();
                for line in String::from_utf8_lossy(&o.stdout).lines() {
                    counts.add_line(line);
                }
                rows.push(Row {
                    kernel: label.clone(),
                    what: format!("cargo test --test {}", b.name),
                    counts,
                    ok: o.status == 0,
                    note: if o.status != 0 {
                        format!("exit status {}", o.status)
                    } else {
                        String::new()
                    },
                });
            }
            Err(e) => {
                eprintln!("xtask test: {} in the VM: {e:#}", b.name);
                rows.push(Row {
                    kernel: label.clone(),
                    what: format!("cargo test --test {}", b.name),
                    counts: Counts::default(),
                    ok: false,
                    note: format!("{e:#}"),
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

/// Builds paceline-tests' test targets and returns its integration test executables.
fn build_integration_tests(root: &Path) -> Result<Vec<TestBin>> {
    let mut cmd = Command::new(cargo());
    cmd.current_dir(root).args([
        "test",
        "--no-run",
        "--message-format=json-render-diagnostics",
        "-p",
        "paceline-tests",
    ]);
    let mut bins = Vec::new();
    let ok = run_group(cmd, |line| {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            return;
        };
        if v["reason"] != "compiler-artifact" || !v["profile"]["test"].as_bool().unwrap_or(false) {
            return;
        }
        let kinds = v["target"]["kind"].as_array().cloned().unwrap_or_default();
        if !kinds.iter().any(|k| k == "test") {
            return; // lib/bin unit tests ran on the host already
        }
        let (Some(exe), Some(name)) = (v["executable"].as_str(), v["target"]["name"].as_str()) else {
            return;
        };
        let manifest_dir = v["manifest_path"]
            .as_str()
            .and_then(|m| Path::new(m).parent())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| root.join("tests"));
        bins.push(TestBin {
            name: name.to_string(),
            exe: PathBuf::from(exe),
            manifest_dir,
        });
    })?;
    if !ok {
        bail!("building paceline-tests' integration tests failed (cargo test --no-run -p paceline-tests)");
    }
    Ok(bins)
}

/// Runs a cargo command, copying its stdout through while counting libtest results.
fn run_streaming(cmd: Command) -> Result<(bool, Counts)> {
    let mut counts = Counts::default();
    let out = std::io::stdout();
    let ok = run_group(cmd, |line| {
        counts.add_line(line);
        let mut o = out.lock();
        let _ = writeln!(o, "{line}");
        let _ = o.flush();
    })?;
    Ok((ok, counts))
}

/// Runs `cmd` in its own process group, handing each stdout line to `on_line`. On Ctrl-C or
/// SIGTERM (caught by the handler shared with the VM runner) the whole group (cargo and the
/// test binaries it started) gets SIGTERM, then SIGKILL; if xtask itself dies, cargo gets
/// SIGTERM (PR_SET_PDEATHSIG).
fn run_group(mut cmd: Command, mut on_line: impl FnMut(&str)) -> Result<bool> {
    use std::os::unix::process::CommandExt;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    vm::install_signal_handlers();
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0);
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("running cargo")?;
    let pgid = child.id() as libc::pid_t;
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let done = done.clone();
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                if vm::interrupted().is_some() {
                    unsafe { libc::kill(-pgid, libc::SIGTERM) };
                    for _ in 0..40 {
                        if done.load(Ordering::SeqCst) {
                            return;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(50));
                    }
                    unsafe { libc::kill(-pgid, libc::SIGKILL) };
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        })
    };
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        match line {
            Ok(l) => on_line(&l),
            Err(_) => break,
        }
    }
    let st = child.wait()?;
    done.store(true, Ordering::SeqCst);
    let _ = watcher.join();
    // test binaries that outlived cargo (a hung test after cargo was killed) go too
    if vm::interrupted().is_some() {
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
    }
    Ok(st.success())
}

fn stop_if_interrupted(rows: &[Row]) -> Result<()> {
    if let Some(sig) = vm::interrupted() {
        for r in rows {
            println!(
                "  {:<8} {:<28} {} {}",
                if r.ok { "ok" } else { "FAILED" },
                r.kernel,
                r.what,
                r.counts.show()
            );
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
