//! [`ChildGuard`]: a spawned process (usually inside a host's namespace) that is killed with its
//! whole process group when the guard is dropped, with its piped stdout/stderr drained by
//! background threads so that a chatty child never blocks on a full pipe.

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use std::io::Read;
use std::process::{Child, ExitStatus};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a finished (or stopped) child printed.
#[derive(Debug, Clone)]
pub struct CapturedOutput {
    /// Exit status; `None` if it could not be collected.
    pub status: Option<ExitStatus>,
    /// Captured stdout (empty if stdout was not piped).
    pub stdout: String,
    /// Captured stderr (empty if stderr was not piped).
    pub stderr: String,
}

impl CapturedOutput {
    /// True when the process exited with status 0.
    pub fn success(&self) -> bool {
        self.status.map(|s| s.success()).unwrap_or(false)
    }
}

/// A running child process. On drop it gets SIGTERM (to its process group), then SIGKILL after
/// [`ChildGuard::grace`], and is reaped. Drop never panics.
pub struct ChildGuard {
    child: Option<Child>,
    desc: String,
    stdout: Option<JoinHandle<Vec<u8>>>,
    stderr: Option<JoinHandle<Vec<u8>>>,
    grace: Duration,
    own_group: bool,
}

fn drain<R: Read + Send + 'static>(mut r: R) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        buf
    })
}

impl ChildGuard {
    /// Wraps a spawned child. `own_group` says the child was started with `process_group(0)`,
    /// so signals go to its whole group. Piped stdout/stderr are drained in the background.
    pub fn new(mut child: Child, desc: impl Into<String>, own_group: bool) -> ChildGuard {
        let stdout = child.stdout.take().map(drain);
        let stderr = child.stderr.take().map(drain);
        ChildGuard {
            child: Some(child),
            desc: desc.into(),
            stdout,
            stderr,
            grace: Duration::from_secs(2),
            own_group,
        }
    }

    /// Sets how long a stop/drop waits after SIGTERM before SIGKILL (default 2 s).
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Description used in messages (the command line and where it runs).
    pub fn description(&self) -> &str {
        &self.desc
    }

    /// Sends a signal to the child (its process group when it has one). No-op once reaped.
    pub fn signal(&mut self, sig: Signal) -> Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        let pid = Pid::from_raw(child.id() as i32);
        let r = if self.own_group {
            killpg(pid, sig)
        } else {
            nix::sys::signal::kill(pid, sig)
        };
        r.with_context(|| format!("signal {sig} to {}", self.desc))
    }

    /// Non-blocking: the exit status if the child has exited.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        match self.child.as_mut() {
            Some(c) => Ok(c.try_wait()?),
            None => bail!("{}: already collected", self.desc),
        }
    }

    /// Waits up to `timeout` for the child to exit (polling every 10 ms).
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<Option<ExitStatus>> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(s) = self.try_wait()? {
                return Ok(Some(s));
            }
            if Instant::now() >= end {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the child to exit on its own within `timeout` and returns what it printed.
    /// Errors (after killing it) on timeout, and when it exits non-zero (stderr included).
    pub fn wait_output(mut self, timeout: Duration) -> Result<CapturedOutput> {
        match self.wait_timeout(timeout)? {
            Some(_) => {}
            None => {
                let out = self.finish(true);
                bail!(
                    "{}: still running after {:?}; killed.\n  stderr: {}",
                    self.desc,
                    timeout,
                    out.stderr.trim()
                );
            }
        }
        let out = self.finish(false);
        if !out.success() {
            bail!(
                "{}: exited with {:?}\n  stderr: {}\n  stdout: {}",
                self.desc,
                out.status,
                out.stderr.trim(),
                out.stdout.trim()
            );
        }
        Ok(out)
    }

    /// Stops the child (SIGTERM, then SIGKILL after the grace period) and returns what it
    /// printed, whatever its exit status.
    pub fn stop(mut self) -> CapturedOutput {
        self.finish(true)
    }

    /// Like [`ChildGuard::stop`] but sends `sig` first (e.g. SIGINT) instead of SIGTERM.
    pub fn stop_with(mut self, sig: Signal) -> CapturedOutput {
        let _ = self.signal(sig);
        self.finish(true)
    }

    fn finish(&mut self, kill: bool) -> CapturedOutput {
        let mut status = None;
        if let Some(mut child) = self.child.take() {
            if kill && let Ok(None) = child.try_wait() {
                let pid = Pid::from_raw(child.id() as i32);
                let send = |sig| {
                    let _ = if self.own_group {
                        killpg(pid, sig)
                    } else {
                        nix::sys::signal::kill(pid, sig)
                    };
                };
                send(Signal::SIGTERM);
                let end = Instant::now() + self.grace;
                loop {
                    match child.try_wait() {
                        Ok(Some(s)) => {
                            status = Some(s);
                            break;
                        }
                        Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(10)),
                        _ => {
                            send(Signal::SIGKILL);
                            break;
                        }
                    }
                }
            }
            if status.is_none() {
                status = child.wait().ok();
            }
            // Kill stragglers of the group (children of a shell, say) that keep pipes open.
            if self.own_group {
                let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            }
        }
        let join = |h: Option<JoinHandle<Vec<u8>>>| {
            h.and_then(|h| h.join().ok())
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default()
        };
        CapturedOutput {
            status,
            stdout: join(self.stdout.take()),
            stderr: join(self.stderr.take()),
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if self.child.is_some() {
            let grace = self.grace.min(Duration::from_millis(500));
            self.grace = grace;
            let _ = self.finish(true);
        }
    }
}

impl std::fmt::Debug for ChildGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildGuard")
            .field("pid", &self.pid())
            .field("desc", &self.desc)
            .finish()
    }
}
