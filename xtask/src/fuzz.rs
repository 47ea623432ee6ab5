//! `cargo xtask fuzz [--time S] [--seed N] [--only T]`: every fuzzer, each for S seconds of a
//! CPU (the cargo-fuzz targets run at once, so on fewer CPUs than targets each runs longer).
//!
//! 1. The cargo-fuzz targets in `fuzz/` (their own workspace, built with nightly and no
//!    sanitizer: the code under test is safe Rust): `policy` (the policy pipeline), `packet`
//!    (the parser the tc program runs), `classify` (the classifier against a plain reading of
//!    its rules). What they check is `fuzz/checks` (a workspace crate, so a plain `cargo test`
//!    replays every seed through the same checks on stable). Each starts from its seeds
//!    ([`seed_dirs`]: the named seeds and regression inputs in `fuzz/seeds/<target>/`, and for
//!    `policy` the shipped policies and the invalid-policy fixtures where they are), read only;
//!    what it finds new goes to `target/fuzz-corpus/<target>` (never checked in: an input worth
//!    keeping goes to `fuzz/seeds/<target>/` under a name that says what it is), crashes to
//!    `fuzz/artifacts/<target>` (`cargo +nightly fuzz run <target> <crash file>` replays one).
//! 2. `differential`: random and mutated frames through the real program with
//!    BPF_PROG_TEST_RUN against the reference parser and classifier (needs root; run it under
//!    the privileged-test lock when others share the machine).
//!
//! `cargo xtask test` runs step 1 for a few seconds per target with a fixed seed
//! ([`short_run`]); the integration suite runs the differential test on a fixed seed.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context as _, Result, bail};

use crate::vm;

pub const TARGETS: [&str; 3] = ["policy", "packet", "classify"];

/// `target`'s seed directories, from the repository's root: the same list as
/// `paceline_fuzz_checks::SEED_DIRS` (`fuzz/checks/src/lib.rs`), whose tests replay them.
fn seed_dirs(target: &str) -> &'static [&'static str] {
    match target {
        "policy" => &["fuzz/seeds/policy", "policies", "policy/tests/fixtures/invalid"],
        "packet" => &["fuzz/seeds/packet"],
        "classify" => &["fuzz/seeds/classify"],
        _ => &[],
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// Seconds of a CPU per target (the targets run at once: the wall time is this times the
    /// targets over the CPUs, when they are more).
    #[arg(long, default_value_t = 60)]
    time: u64,
    /// libFuzzer's seed and the differential run's; 0 picks one from the clock.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Only these targets (policy, packet, classify, differential); repeatable.
    #[arg(long)]
    only: Vec<String>,
}

/// One target's outcome.
pub struct Outcome {
    pub target: String,
    pub ok: bool,
    pub note: String,
}

pub fn run(a: Args) -> Result<()> {
    let seed = if a.seed == 0 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs() % 1_000_000 + 1)
    } else {
        a.seed
    };
    let wanted = |t: &str| a.only.is_empty() || a.only.iter().any(|o| o == t);
    let root = vm::repo_root();
    let mut outcomes = Vec::new();
    let libfuzzer: Vec<&str> = TARGETS.iter().copied().filter(|t| wanted(t)).collect();
    if !libfuzzer.is_empty() {
        outcomes.extend(libfuzzer_targets(&root, &libfuzzer, a.time, seed)?);
    }
    if wanted("differential") {
        outcomes.push(differential(&root, a.time, seed)?);
    }
    println!("==> fuzz summary (seed {seed}, {} s per target)", a.time);
    for o in &outcomes {
        println!(
            "  {:<8} {:<14} {}",
            if o.ok { "ok" } else { "FAILED" },
            o.target,
            o.note
        );
    }
    let failed = outcomes.iter().filter(|o| !o.ok).count();
    println!("{} passed, {} failed", outcomes.len() - failed, failed);
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}

/// What `cargo xtask test` runs: every cargo-fuzz target for `secs` seconds from a fixed seed.
pub fn short_run(root: &Path, secs: u64) -> Result<Vec<Outcome>> {
    libfuzzer_targets(root, &TARGETS, secs, 1)
}

fn cargo_fuzz(root: &Path) -> Command {
    let mut c = Command::new("cargo");
    c.current_dir(root).args(["+nightly", "fuzz"]);
    c
}

fn libfuzzer_targets(root: &Path, targets: &[&str], secs: u64, seed: u64) -> Result<Vec<Outcome>> {
    let version = cargo_fuzz(root).arg("--version").output();
    if !version.is_ok_and(|o| o.status.success()) {
        bail!(
            "cargo-fuzz is missing: `cargo install cargo-fuzz --locked` (scripts/bootstrap.sh --test does)"
        );
    }
    println!("==> building the fuzz targets: cargo +nightly fuzz build -s none");
    let st = cargo_fuzz(root)
        .args(["build", "-s", "none"])
        .status()
        .context("running cargo fuzz build")?;
    if !st.success() {
        bail!("cargo +nightly fuzz build failed");
    }
    let scratch = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), Into::into)
        .join("fuzz-corpus");
    // The targets run at once, each for as long as gives it about `secs` seconds of a CPU:
    // one after another they left a CPU idle (each fuzzer is one process on one CPU).
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let n = targets.len() as u64;
    let wall = if n > cpus { (secs * n).div_ceil(cpus) } else { secs };
    println!(
        "==> fuzz {}: at once, {wall} s each ({secs} s of a CPU each on {cpus} CPUs), seed {seed}",
        targets.join(", ")
    );
    let scratch = &scratch;
    std::thread::scope(|scope| {
        let runs: Vec<_> = targets
            .iter()
            .map(|&t| scope.spawn(move || fuzz_one(root, &scratch.join(t), t, wall, seed)))
            .collect();
        runs.into_iter()
            .map(|h| h.join().expect("a fuzz runner thread panicked"))
            .collect()
    })
}

/// Runs libFuzzer on `target` for `secs` seconds (wall) from `seed`; what it finds new goes to
/// `corpus`.
fn fuzz_one(root: &Path, corpus: &Path, target: &str, secs: u64, seed: u64) -> Result<Outcome> {
    let t = target;
    std::fs::create_dir_all(corpus).with_context(|| format!("creating {}", corpus.display()))?;
    let mut args = vec![
        format!("-max_total_time={secs}"),
        format!("-seed={seed}"),
        "-timeout=10".into(),
        "-rss_limit_mb=4096".into(),
        "-print_final_stats=1".into(),
    ];
    if t == "policy" {
        args.push(format!("-dict={}", root.join("fuzz/policy.dict").display()));
        args.push("-max_len=16384".into());
    }
    let started = Instant::now();
    // Its own output is captured (three fuzzers' progress lines interleaved would say nothing);
    // a failure prints the end of it.
    let o = cargo_fuzz(root)
        .args(["run", "-s", "none", t])
        .arg(corpus)
        .args(seed_dirs(t).iter().map(|d| root.join(d)))
        .arg("--")
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("running cargo fuzz run {t}"))?;
    let log = String::from_utf8_lossy(&o.stderr);
    let runs = log
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("Done ").and_then(|r| r.split_whitespace().next()))
        .unwrap_or("?")
        .to_string();
    let ok = o.status.success();
    if !ok {
        // The crash report and its reproducer path.
        let tail: Vec<&str> = log.lines().rev().take(60).collect();
        let text: Vec<&str> = tail.into_iter().rev().collect();
        eprintln!("==> fuzz {t} failed:\n{}", text.join("\n"));
    }
    Ok(Outcome {
        target: t.to_string(),
        ok,
        note: if ok {
            format!(
                "{runs} runs in {:.0} s, no failure",
                started.elapsed().as_secs_f64()
            )
        } else {
            format!("failed after {runs} runs: see fuzz/artifacts/{t}/")
        },
    })
}

fn differential(root: &Path, secs: u64, seed: u64) -> Result<Outcome> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(Outcome {
            target: "differential".into(),
            ok: true,
            note: "SKIPPED: needs root (BPF_PROG_TEST_RUN)".into(),
        });
    }
    println!("==> fuzz differential: {secs} s, seed {seed}");
    let name = "parse::differential_frames_match_the_reference_parser_and_classifier";
    let o = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root)
        .args([
            "test",
            "-p",
            "paceline-tests",
            "--test",
            "integration",
            "--",
            "--exact",
            name,
        ])
        .arg("--nocapture")
        .env("PACELINE_DIFF_SECS", secs.to_string())
        .env("PACELINE_DIFF_SEED", seed.to_string())
        .stderr(Stdio::inherit())
        .output()
        .context("running the differential test")?;
    let stdout = String::from_utf8_lossy(&o.stdout);
    print!("{stdout}");
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("differential: "))
        .unwrap_or("no figures")
        .to_string();
    Ok(Outcome {
        target: "differential".into(),
        ok: o.status.success(),
        note: line,
    })
}
