//! Whether a privileged test can run here, and what it says when it cannot: shared by the
//! integration suite and the lab's tests.

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
