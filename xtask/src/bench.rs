//! `cargo xtask bench <name>`: benchmarks. They print figures and write JSON (and plots) under
//! `results/`; they never pass or fail on speed.
//!
//! - `datapath`: the tc classifier's ns/packet per path against an empty classifier, via
//!   BPF_PROG_TEST_RUN on this machine's kernel (`plbench datapath`).
//! - `pacing`, `qjump`, `pacing-study`: the papers' experiments (`plexp <name>`), run inside the
//!   VM (Debian 6.1 with sch_fq, so EDT is enforced; `--kernel 6.12` boots 6.12 instead, into
//!   `results/<name>-6.12/`); results, tables and plots land in `results/<name>/`. `--host` runs them on this machine's kernel instead (no fq: HTB and
//!   TCP's own pacing enforce), into `results/<name>-host/`.
//! - `d3`: the D3 evaluation (partition-aggregate); meant for `--host` (see its help).
//! - `incast`: the incast study and Dart (`plexp incast`): goodput and block times against S servers,
//!   and short messages next to bulk senders; in the VM (fq, scaled down) or `--host`.
//! - `aqm`: a paced class's queue, horizon only vs CoDel + ECN (`plexp aqm`; VM only: fq).
//! - `apply`: parsing, compiling and writing generated policies of 1,000 to 262,144 rules into
//!   the datapath, whole and after a one-rule edit, with the peak RSS (`plbench apply`).

use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::vm::{self, repo_root};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(clap::Args, Clone)]
struct ExpArgs {
    /// Run on this machine's kernel instead of the VM.
    #[arg(long)]
    host: bool,
    /// A quicker, smaller run (smoke test of the harness).
    #[arg(long)]
    quick: bool,
    /// Give up after this many seconds (VM runs).
    #[arg(long, default_value_t = 3600)]
    timeout: u64,
    /// VM memory in MiB.
    #[arg(long, default_value_t = 3072)]
    mem: u32,
    /// The VM's kernel: 6.1 (the published figures) or 6.12; results of 6.12 go to
    /// `results/<name>-6.12/`.
    #[arg(long, default_value = "6.1", value_name = "6.1|6.12", value_parser = parse_one_kernel)]
    kernel: vm::Series,
}

fn parse_one_kernel(s: &str) -> Result<vm::Series, String> {
    match vm::parse_series(s)?.as_slice() {
        [one] => Ok(*one),
        _ => Err("one kernel: 6.1 or 6.12".into()),
    }
}

#[derive(clap::Subcommand)]
enum Bench {
    /// Pacing conformance in the VM (fq): configured vs achieved rates.
    Pacing {
        #[command(flatten)]
        exp: ExpArgs,
        /// Only classes of 10, 200 and 1,000 Mbit/s carrying 1, 4 and 16 TCP flows (use with
        /// --host, where HTB enforces them); results in results/pacing-host-aggregates/.
        #[arg(long)]
        aggregates: bool,
    },
    /// QJump in the VM: RPC latency with and without levels next to bulk flows.
    Qjump {
        #[command(flatten)]
        exp: ExpArgs,
        /// The switch port's rate in Mbit/s (default 20, what the emulated VM forwards). Another
        /// rate writes to `results/qjump[-host]-<N>mbit/`.
        #[arg(long)]
        rate_mbit: Option<u64>,
    },
    /// The TCP pacing study in the VM: N flows through a small-buffer bottleneck.
    PacingStudy(ExpArgs),
    /// The D3 paper: partition-aggregate deadlines against N senders (use --host: 1 Gbit/s is
    /// beyond the emulated VM; this kernel's TCP pacing enforces the grants). PLEXP_D3_* narrow
    /// the run (docs/experiments/d3.md); PLEXP_D3_CAPTURE=1 needs tcpdump (bootstrap --test).
    D3(ExpArgs),
    /// The incast study and Dart (DASR): a client reads blocks from S servers at once through a
    /// shallow-buffered port; modes tcp, tcp-tuned, paced and dasr; plus short messages next to
    /// bulk senders. --host: 400 Mbit/s and the incast study's sizes; the VM: 20 Mbit/s, scaled down.
    Incast(ExpArgs),
    /// AQM in the VM (fq): a class paced at 20 Mbit/s with 8 TCP flows (cubic with and
    /// without ECN, DCTCP), its queue held by the horizon only or by CoDel + ECN.
    Aqm(ExpArgs),
    /// ns/packet of the tc classifier per path, against an empty classifier (host kernel).
    Datapath {
        /// Packets per trial (the kernel reports the mean per packet).
        #[arg(long, default_value_t = 1_000_000)]
        repeat: u32,
        /// Trials; the median is reported.
        #[arg(long, default_value_t = 15)]
        trials: u32,
    },
    /// ns/packet of the tc programs under real TCP and UDP traffic through a veth pair, from
    /// the kernel's per-program statistics: paceline against the floor and the reference,
    /// attached in turn (host kernel).
    Traffic {
        /// Trials; the median is reported.
        #[arg(long, default_value_t = 5)]
        trials: u32,
        /// Seconds of traffic per program, traffic kind and trial.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
    },
    /// Seconds to parse, compile and write generated policies into the datapath (host kernel),
    /// whole and after a one-rule edit, and the peak RSS.
    Apply {
        /// Rule counts, one row each.
        #[arg(long, default_value = "1000,10000,100000,262144")]
        rules: String,
        #[arg(long, default_value_t = 5)]
        trials: u32,
    },
}

fn cargo_build_release(bins: &[&str]) -> Result<()> {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(repo_root()).args([
        "build",
        "--release",
        "--quiet",
        "-p",
        "paceline-tests",
        "-p",
        "paceline-lab",
    ]);
    for b in bins {
        c.args(["--bin", b]);
    }
    if !c.status().context("running cargo build")?.success() {
        bail!("building {bins:?} failed");
    }
    Ok(())
}

/// The programs an experiment runs (the testbed turns offloads off with ethtool, shapes with
/// tc; the VM runs need qemu; the D3 timelines tcpdump): each present, or the error names it
/// and the command that installs it, before anything is built.
fn needs(name: &str, host: bool) -> Result<()> {
    let mut tools = vec![("ip", "iproute2"), ("tc", "iproute2"), ("ethtool", "ethtool")];
    if !host {
        tools.push(("qemu-system-x86_64", "qemu-system-x86"));
    }
    if name == "d3" && std::env::var("PLEXP_D3_CAPTURE").is_ok_and(|v| !v.is_empty() && v != "0") {
        tools.push(("tcpdump", "tcpdump"));
    }
    let on_path = |t: &str| {
        std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(t).is_file()))
    };
    let missing: Vec<String> = tools
        .iter()
        .filter(|(t, _)| !on_path(t))
        .map(|(t, pkg)| format!("{t} (Debian package {pkg})"))
        .collect();
    if !missing.is_empty() {
        bail!(
            "cargo xtask bench {name} needs {}: install what the benchmarks need with `bash scripts/bootstrap.sh --test`",
            missing.join(", ")
        );
    }
    Ok(())
}

/// Runs `plexp <name> [extra...]` in the VM (or on the host) and leaves its output in
/// `results/<name>[-host][-<suffix>]/`.
fn experiment(name: &str, a: &ExpArgs, extra: &[String], suffix: Option<&str>) -> Result<()> {
    needs(name, a.host)?;
    cargo_build_release(&["plexp", "plload", "plagent", "plreport"])?;
    let root = repo_root();
    let exe = root.join("target/release/plexp");
    let mut args = vec![name.to_string()];
    if a.quick {
        args.push("--quick".into());
    }
    args.extend(extra.iter().cloned());
    let dir = format!(
        "{name}{}{}{}",
        if a.host { "-host" } else { "" },
        if !a.host && a.kernel != vm::SERIES[0] {
            format!("-{}", a.kernel.name)
        } else {
            String::new()
        },
        suffix.map(|s| format!("-{s}")).unwrap_or_default()
    );
    if a.host {
        let out = root.join(format!("results/{dir}"));
        std::fs::create_dir_all(&out)?;
        let status = Command::new(&exe)
            .args(&args)
            .arg("--out")
            .arg(&out)
            .status()
            .context("running plexp")?;
        if !status.success() {
            bail!("plexp {name} failed on the host");
        }
        println!("results in {}", out.display());
        return Ok(());
    }
    // In the VM only the share is writable; results come back through it.
    let share = vm::share_dir().join(format!("bench-{name}"));
    let _ = std::fs::remove_dir_all(&share);
    std::fs::create_dir_all(&share)?;
    args.push("--out".into());
    args.push(share.display().to_string());
    let machine = vm::Vm::prepare(a.kernel)?;
    let mut command = vec![exe.display().to_string()];
    command.extend(args);
    let outcome = machine.run(&vm::Request {
        flags: vm::VmFlags {
            timeout: a.timeout,
            mem: a.mem,
            smp: 2,
            verbose: false,
        },
        command,
        cwd: Some(root.clone()),
        // The experiments' `PLEXP_*` knobs reach plexp inside the VM as on the host (the VM
        // passes every `PACELINE_*` variable on its own, `PACELINE_STUDY_*` among them).
        env: std::env::vars()
            .filter(|(k, _)| k.starts_with("PLEXP_"))
            .collect(),
        // DCTCP is a module in Debian's kernels.
        modules: if name == "aqm" {
            vec!["tcp_dctcp".into()]
        } else {
            vec![]
        },
        capture_stdout: false,
    })?;
    if outcome.status != 0 {
        bail!("plexp {name} failed in the VM (exit status {})", outcome.status);
    }
    let out = root.join(format!("results/{dir}"));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    for e in std::fs::read_dir(&share)? {
        let e = e?;
        std::fs::copy(e.path(), out.join(e.file_name()))?;
    }
    println!(
        "results in {} (kernel {}, {})",
        out.display(),
        machine.kernel.release,
        machine.accel
    );
    Ok(())
}

pub fn run(a: Args) -> Result<()> {
    match a.bench {
        Bench::Pacing { exp, aggregates } => match aggregates {
            true => experiment("pacing", &exp, &["--aggregates".into()], Some("aggregates")),
            false => experiment("pacing", &exp, &[], None),
        },
        Bench::Qjump { exp, rate_mbit } => match rate_mbit {
            Some(r) => experiment(
                "qjump",
                &exp,
                &["--rate-mbit".into(), r.to_string()],
                Some(&format!("{r}mbit")),
            ),
            None => experiment("qjump", &exp, &[], None),
        },
        Bench::PacingStudy(e) => experiment("pacing-study", &e, &[], None),
        Bench::D3(e) => experiment("d3", &e, &[], None),
        Bench::Incast(e) => experiment("incast", &e, &[], None),
        Bench::Aqm(e) => experiment("aqm", &e, &[], None),
        Bench::Datapath { repeat, trials } => plbench(
            "datapath",
            &[
                "--repeat".into(),
                repeat.to_string(),
                "--trials".into(),
                trials.to_string(),
            ],
        ),
        Bench::Traffic { trials, seconds } => plbench(
            "traffic",
            &[
                "--trials".into(),
                trials.to_string(),
                "--seconds".into(),
                seconds.to_string(),
            ],
        ),
        Bench::Apply { rules, trials } => plbench(
            "apply",
            &["--rules".into(), rules, "--trials".into(), trials.to_string()],
        ),
    }
}

/// Runs `plbench <bench> <args> --out results/bench-<bench>.json` (release build; as root: it
/// loads BPF programs).
fn plbench(bench: &str, args: &[String]) -> Result<()> {
    cargo_build_release(&["plbench"])?;
    let root = repo_root();
    let out = root.join(format!("results/bench-{bench}.json"));
    let status = Command::new(root.join("target/release/plbench"))
        .arg(bench)
        .args(args)
        .arg("--out")
        .arg(&out)
        .status()
        .context("running plbench (as root: it loads BPF programs)")?;
    if !status.success() {
        bail!("plbench {bench} failed");
    }
    Ok(())
}
