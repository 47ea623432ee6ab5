//! The privileged integration suite: one binary, a flat list of modules.
//!
//! Every test that needs root or a kernel feature checks first and prints `SKIPPED: <why>`
//! when it cannot run. CI runs as root, on the host kernel and in the VM (`cargo xtask test`).

mod agent;
mod agent_scale;
mod classify_scale;
mod codel;
mod codel_e2e;
mod d3_e2e;
mod d3_effect;
mod d3_router;
mod dasr;
mod dasr_e2e;
mod netns_exec;
mod ops;
mod parse;
mod prometheus;
mod soak;
mod test_run;
mod trace;

/// True when the test can use BPF and netlink; otherwise prints why it is skipped (and under
/// CI fails: CI runs as root).
pub fn privileged(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip(test, "needs root (BPF_PROG_TEST_RUN, netlink, namespaces)");
        return false;
    }
    true
}

/// A test that cannot run for a reason other than the kernel (a missing tool, no terminal, not
/// root) says SKIPPED and why; under CI (`CI` set) it fails instead, since CI installs
/// everything the suite needs (`scripts/bootstrap.sh --test`) and runs as root. A kernel that
/// lacks the feature a test needs prints SKIPPED directly: that holds under CI too.
pub fn skip(test: &str, why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("{test} cannot run under CI: {why}");
    }
    eprintln!("SKIPPED: {test}: {why}");
}

/// True inside a VM under qemu's TCG emulation (set by `cargo xtask test`), where timing
/// follows the emulator and the machine's load.
pub fn under_tcg() -> bool {
    std::env::var("PACELINE_VM_ACCEL").as_deref() == Ok("TCG")
}
