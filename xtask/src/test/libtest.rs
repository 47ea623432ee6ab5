//! Running libtest binaries: their output echoed with the passing tests' output dropped
//! (`SKIPPED:` lines kept), and their result lines counted.

use super::*;

#[derive(Default, Clone, Copy)]
pub(super) struct Counts {
    pub(super) passed: u64,
    pub(super) failed: u64,
    pub(super) ignored: u64,
    /// Tests that passed by skipping themselves (`SKIPPED: ...` in their output).
    pub(super) skipped: u64,
    pub(super) seen: bool,
}

impl Counts {
    /// Adds up libtest's `test result: ok. 3 passed; 0 failed; 1 ignored; ...` lines and the
    /// `SKIPPED:` lines of the tests that skipped themselves.
    pub(super) fn add_line(&mut self, line: &str) {
        if line.trim_start().starts_with("SKIPPED: ") {
            self.skipped += 1;
            return;
        }
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
    /// Passed without skipping.
    pub(super) fn ran(&self) -> u64 {
        self.passed.saturating_sub(self.skipped)
    }
    pub(super) fn show(&self) -> String {
        if self.seen {
            format!(
                "{} passed, {} skipped, {} failed, {} ignored",
                self.ran(),
                self.skipped,
                self.failed,
                self.ignored
            )
        } else {
            "no test results".into()
        }
    }
}

/// Echoes libtest's output except what `--show-output` adds for passing tests, of which only
/// the `SKIPPED:` lines are kept. Partial lines go out as they come (the name of the running
/// test), except inside that section. Each `test NAME ... ok` line gets the seconds since the
/// previous one (the tests run one at a time), to show where the time goes.
/// Each `(kernel, test, seconds)` the echoes timed, for the summary's slowest tests.
static TIMED: std::sync::Mutex<Vec<(String, String, f64)>> = std::sync::Mutex::new(Vec::new());

/// The `n` slowest tests timed so far, slowest first.
pub(super) fn slowest(n: usize) -> Vec<(String, String, f64)> {
    let mut t = TIMED.lock().map(|t| t.clone()).unwrap_or_default();
    t.sort_by(|a, b| b.2.total_cmp(&a.2));
    t.truncate(n);
    t
}

pub(super) struct LibtestEcho {
    in_successes: bool,
    line: Vec<u8>,
    last: Instant,
    /// The kernel the tests run on, for [`slowest`].
    kernel: String,
}

impl LibtestEcho {
    pub(super) fn new(kernel: &str) -> Self {
        LibtestEcho {
            in_successes: false,
            line: Vec::new(),
            last: Instant::now(),
            kernel: kernel.to_string(),
        }
    }

    /// Feeds bytes; calls `out` with what is to be shown.
    pub(super) fn feed(&mut self, mut data: &[u8], out: &mut dyn FnMut(&[u8])) {
        while !data.is_empty() {
            let (seg, done) = match data.iter().position(|&b| b == b'\n') {
                Some(i) => (&data[..=i], true),
                None => (data, false),
            };
            data = &data[seg.len()..];
            self.line.extend_from_slice(seg);
            let line = String::from_utf8_lossy(&self.line).trim_end().to_string();
            let result = done
                && line.starts_with("test ")
                && [" ok", " FAILED", " ignored"].iter().any(|e| line.ends_with(e));
            // the header of the section left out says nothing by itself
            let header = done && line == "successes:" && self.line.len() == seg.len();
            if !self.in_successes && !header {
                if result {
                    let secs = self.last.elapsed().as_secs_f64();
                    out(&seg[..seg.len() - 1]);
                    out(format!(" ({secs:.1} s)\n").as_bytes());
                    let name = line["test ".len()..].split(" ... ").next().unwrap_or("");
                    if let Ok(mut t) = TIMED.lock() {
                        t.push((self.kernel.clone(), name.to_string(), secs));
                    }
                } else {
                    out(seg);
                }
            }
            if done && (result || line.starts_with("running ")) {
                self.last = Instant::now();
            }
            if done {
                self.line.clear();
                if self.in_successes {
                    if line == "failures:" || line.starts_with("test result: ") {
                        self.in_successes = false;
                        out(format!("\n{line}\n").as_bytes());
                    } else if line.trim_start().starts_with("SKIPPED: ") {
                        out(format!("{line}\n").as_bytes());
                    }
                } else if line == "successes:" {
                    self.in_successes = true;
                }
            }
        }
    }
}

/// Runs a cargo command, copying its stdout through while counting libtest results.
pub(super) fn run_streaming(cmd: Command, kernel: &str) -> Result<(bool, Counts)> {
    let mut counts = Counts::default();
    let out = std::io::stdout();
    let mut echo = LibtestEcho::new(kernel);
    let ok = run_group(cmd, |line| {
        counts.add_line(line);
        let mut o = out.lock();
        echo.feed(format!("{line}\n").as_bytes(), &mut |b| {
            let _ = o.write_all(b);
        });
        let _ = o.flush();
    })?;
    Ok((ok, counts))
}

/// Runs `cmd` in its own process group, handing each stdout line to `on_line`. On Ctrl-C or
/// SIGTERM (caught by the handler shared with the VM runner) the whole group (cargo and the
/// test binaries it started) gets SIGTERM, then SIGKILL; if xtask itself dies, cargo gets
/// SIGTERM (PR_SET_PDEATHSIG).
pub(super) fn run_group(mut cmd: Command, mut on_line: impl FnMut(&str)) -> Result<bool> {
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
