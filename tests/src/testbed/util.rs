//! Small helpers shared by the testbed modules: running `ip`/`tc` from the test process with
//! readable errors, and formatting command lines for messages.

use anyhow::{Context, Result, bail};
use std::ffi::OsStr;
use std::process::{Command, Output, Stdio};

/// Renders a command line for error messages (`prog arg1 arg2`).
pub(crate) fn cmdline(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        let a = a.to_string_lossy();
        if a.is_empty() || a.contains(char::is_whitespace) {
            s.push('\'');
            s.push_str(&a);
            s.push('\'');
        } else {
            s.push_str(&a);
        }
    }
    s
}

/// Runs `cmd` to completion and returns its output; an error (with the command line, exit
/// status, stderr and stdout) when it cannot start or exits non-zero. `where_` says where it
/// ran ("root netns", "host s1 (netns pl1234a-s1)").
pub(crate) fn check_output(cmd: &mut Command, where_: &str) -> Result<Output> {
    cmd.stdin(Stdio::null());
    let line = cmdline(cmd);
    let out = cmd
        .output()
        .with_context(|| format!("{where_}: cannot start `{line}`"))?;
    if !out.status.success() {
        bail!(
            "{where_}: `{line}` failed ({}){}{}",
            out.status,
            fmt_stream("stderr", &out.stderr),
            fmt_stream("stdout", &out.stdout)
        );
    }
    Ok(out)
}

fn fmt_stream(name: &str, bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    let s = s.trim();
    if s.is_empty() {
        String::new()
    } else {
        format!("\n  {name}: {}", s.replace('\n', "\n    "))
    }
}

/// Runs a program from the root namespace (e.g. `ip -n NS ...`), returning stdout.
pub(crate) fn run<S: AsRef<OsStr>>(prog: &str, args: &[S]) -> Result<String> {
    let mut cmd = Command::new(prog);
    cmd.args(args);
    let out = check_output(&mut cmd, "root netns")?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Like [`run`] but ignores failures (used on teardown paths, which must not fail).
pub(crate) fn run_quiet<S: AsRef<OsStr>>(prog: &str, args: &[S]) -> bool {
    Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// 32-bit FNV-1a, used to derive a short stable prefix from a testbed name.
pub(crate) fn fnv1a(s: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// True when the effective uid is 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
