//! Every seed through its fuzz target's check, on stable: what `cargo xtask fuzz` starts from
//! ([`paceline_fuzz_checks::SEED_DIRS`]) must pass before any fuzzing, so a change that breaks
//! one of them (a regression seed among them) fails a plain `cargo test`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use paceline_fuzz_checks::{SEED_DIRS, classify, packet, policy};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `check` on every file of `target`'s seed directories; panics naming each file whose
/// check failed (the checks' own messages are printed above), or if a directory is empty.
fn replay(target: &str, check: fn(&[u8])) {
    let (_, dirs) = SEED_DIRS
        .iter()
        .find(|(t, _)| *t == target)
        .unwrap_or_else(|| panic!("no seed directories for {target}"));
    let mut failed = Vec::new();
    for dir in dirs.iter() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .map(|e| e.expect("a directory entry").path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "{dir} holds no seeds");
        for f in files {
            let data = std::fs::read(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            if catch_unwind(AssertUnwindSafe(|| check(&data))).is_err() {
                failed.push(f.strip_prefix(root()).unwrap_or(&f).display().to_string());
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{target}: these seeds fail its check: {failed:#?}"
    );
}

#[test]
fn policy_seeds_pass_the_policy_check() {
    replay("policy", policy);
}

#[test]
fn packet_seeds_pass_the_packet_check() {
    replay("packet", packet);
}

#[test]
fn classify_seeds_pass_the_classify_check() {
    replay("classify", classify);
}
