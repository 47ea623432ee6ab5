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

/// True when the test can use BPF and netlink; otherwise prints why it is skipped.
pub fn privileged(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: {test}: needs root (BPF_PROG_TEST_RUN, netlink, namespaces)");
        return false;
    }
    true
}

/// True inside a VM under qemu's TCG emulation (set by `cargo xtask test`), where timing
/// follows the emulator and the machine's load.
pub fn under_tcg() -> bool {
    std::env::var("PACELINE_VM_ACCEL").as_deref() == Ok("TCG")
}
