//! The per-response hook of the server: the attach point for deadline-aware transports (D3).
//!
//! Before the server writes a response it calls [`ResponseHook::before_response`] with the
//! socket's fd, the response size in bytes and the deadline the request carried (relative to
//! when the request arrived; `None` when it had none), and [`ResponseHook::after_response`]
//! once the last byte was handed to the kernel. A D3 integration implements the trait (e.g. by
//! writing `(socket cookie, size, deadline)` into a BPF map), or uses the built-in
//! [`SockoptHook`] from the command line:
//!
//! `plload serve --hook sockopt:LEVEL:OPTNAME` calls
//! `setsockopt(fd, LEVEL, OPTNAME, &DeadlineSockopt { size_bytes, deadline_ns }, 16)`
//! before each response: a `cgroup/setsockopt` BPF program can catch that (level, optname)
//! pair and keep the values in socket storage. `--hook log` prints one line per response on
//! stderr. Hook errors are counted (`hook_errors` in the server's summary) and otherwise
//! ignored, so a missing BPF program does not stop the workload.
//!
//! Two more hooks serve the D3 evaluation (`plexp d3`):
//! - `--hook d3:PATH` ([`D3Hook`]): announces every response with a deadline to D3 through
//!   the application map the agent pins at `PATH` (`paceline::d3app::D3Sockets`; the agent's
//!   default is `/sys/fs/bpf/paceline/d3_app`): size = the response's bytes, deadline = the
//!   request's deadline from now. The socket's class must have `d3` in the agent's policy.
//!   Responses without a deadline are not announced (the socket keeps its previous transfer).
//! - `--hook deadline-mark:THRESHOLD_US:MARK` ([`DeadlineMarkHook`]): sets `SO_MARK` to
//!   `MARK` on the socket before a response whose deadline is shorter than `THRESHOLD_US`
//!   microseconds, and to 0 before any other, so a policy rule on the mark can put urgent
//!   responses in a higher (QJump) level: deadline-aware priorities in the spirit of the D3
//!   paper's TCPpr. Needs CAP_NET_ADMIN.

use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// Called around every response the server sends.
pub trait ResponseHook: Send + Sync {
    /// Before the first byte of a response of `size` bytes with `deadline` is written on `fd`.
    fn before_response(&self, fd: RawFd, size: u64, deadline: Option<Duration>) -> io::Result<()>;
    /// After the last byte was written.
    fn after_response(&self, _fd: RawFd) -> io::Result<()> {
        Ok(())
    }
}

/// Does nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoHook;

impl ResponseHook for NoHook {
    fn before_response(&self, _fd: RawFd, _size: u64, _deadline: Option<Duration>) -> io::Result<()> {
        Ok(())
    }
}

/// The value [`SockoptHook`] passes to `setsockopt` (16 bytes, native endian).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeadlineSockopt {
    /// Bytes the response will carry.
    pub size_bytes: u64,
    /// Deadline in nanoseconds from now (0 = no deadline).
    pub deadline_ns: u64,
}

/// `setsockopt(fd, level, optname, &DeadlineSockopt)` before each response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SockoptHook {
    /// Socket option level.
    pub level: i32,
    /// Option name.
    pub optname: i32,
}

impl ResponseHook for SockoptHook {
    fn before_response(&self, fd: RawFd, size: u64, deadline: Option<Duration>) -> io::Result<()> {
        let v = DeadlineSockopt {
            size_bytes: size,
            deadline_ns: deadline.map(|d| d.as_nanos() as u64).unwrap_or(0),
        };
        // SAFETY: v is a live 16-byte repr(C) value.
        let r = unsafe {
            libc::setsockopt(
                fd,
                self.level,
                self.optname,
                (&v as *const DeadlineSockopt).cast(),
                std::mem::size_of::<DeadlineSockopt>() as libc::socklen_t,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// Prints `hook fd=.. size=.. deadline_us=..` on stderr for each response (debugging).
#[derive(Clone, Copy, Debug, Default)]
pub struct LogHook;

impl ResponseHook for LogHook {
    fn before_response(&self, fd: RawFd, size: u64, deadline: Option<Duration>) -> io::Result<()> {
        eprintln!(
            "hook fd={fd} size={size} deadline_us={}",
            deadline.map(|d| d.as_micros()).unwrap_or(0)
        );
        Ok(())
    }
}

/// D3: before each response with a deadline, writes `(size, now + deadline, generation + 1)`
/// for the socket into the agent's pinned D3 application map (see `paceline::d3app`).
pub struct D3Hook {
    path: PathBuf,
    socks: Mutex<paceline::d3app::D3Sockets>,
}

impl D3Hook {
    /// Opens the map the agent pinned at `path`.
    pub fn open(path: &Path) -> anyhow::Result<D3Hook> {
        Ok(D3Hook {
            path: path.to_path_buf(),
            socks: Mutex::new(paceline::d3app::D3Sockets::open(path)?),
        })
    }

    /// Where the map is pinned.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl std::fmt::Debug for D3Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("D3Hook").field("path", &self.path).finish()
    }
}

impl ResponseHook for D3Hook {
    fn before_response(&self, fd: RawFd, size: u64, deadline: Option<Duration>) -> io::Result<()> {
        let Some(deadline) = deadline else {
            return Ok(());
        };
        // SAFETY: the server holds the socket open for the whole call.
        let sock = unsafe { BorrowedFd::borrow_raw(fd) };
        let mut socks = self.socks.lock().unwrap_or_else(|e| e.into_inner());
        socks
            .set(&sock, size, deadline)
            .map_err(|e| io::Error::other(format!("{e:#}")))
    }
}

/// `SO_MARK = mark` before a response whose deadline is below `threshold`, 0 before others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeadlineMarkHook {
    /// Deadlines strictly shorter than this are urgent.
    pub threshold: Duration,
    /// The mark of urgent responses.
    pub mark: u32,
}

impl DeadlineMarkHook {
    /// The mark this hook gives a response with `deadline`.
    pub fn mark_for(&self, deadline: Option<Duration>) -> u32 {
        match deadline {
            Some(d) if d < self.threshold => self.mark,
            _ => 0,
        }
    }
}

impl ResponseHook for DeadlineMarkHook {
    fn before_response(&self, fd: RawFd, _size: u64, deadline: Option<Duration>) -> io::Result<()> {
        let v: u32 = self.mark_for(deadline);
        // SAFETY: v is a live u32.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_MARK,
                (&v as *const u32).cast(),
                std::mem::size_of::<u32>() as libc::socklen_t,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// Parses a `--hook` value: `none`, `log`, `sockopt:LEVEL:OPTNAME` (decimal or 0x hex),
/// `d3:PATH` or `deadline-mark:THRESHOLD_US:MARK`.
pub fn parse_hook(s: &str) -> Result<Box<dyn ResponseHook>, String> {
    if let Some(path) = s.strip_prefix("d3:") {
        if path.is_empty() {
            return Err(format!("hook {s:?}: d3 needs the path of the agent's d3_app map"));
        }
        return D3Hook::open(Path::new(path))
            .map(|h| Box::new(h) as Box<dyn ResponseHook>)
            .map_err(|e| format!("hook {s:?}: {e:#}"));
    }
    let num = |x: &str| -> Result<i32, String> {
        let x = x.trim();
        let r = if let Some(h) = x.strip_prefix("0x") {
            i64::from_str_radix(h, 16)
        } else {
            x.parse::<i64>()
        };
        r.map_err(|e| format!("{x:?}: {e}"))
            .and_then(|v| i32::try_from(v).map_err(|e| e.to_string()))
    };
    match s.split(':').collect::<Vec<_>>().as_slice() {
        ["none"] => Ok(Box::new(NoHook)),
        ["log"] => Ok(Box::new(LogHook)),
        ["sockopt", level, opt] => Ok(Box::new(SockoptHook {
            level: num(level)?,
            optname: num(opt)?,
        })),
        ["deadline-mark", threshold_us, mark] => {
            let t: u64 = threshold_us
                .trim()
                .parse()
                .map_err(|e| format!("{threshold_us:?}: {e}"))?;
            Ok(Box::new(DeadlineMarkHook {
                threshold: Duration::from_micros(t),
                mark: num(mark)? as u32,
            }))
        }
        _ => Err(format!(
            "hook {s:?}: expected none, log, sockopt:LEVEL:OPTNAME, d3:PATH or deadline-mark:THRESHOLD_US:MARK"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hooks() {
        assert!(parse_hook("none").is_ok());
        assert!(parse_hook("log").is_ok());
        assert!(parse_hook("sockopt:0x1234:7").is_ok());
        assert!(parse_hook("sockopt:1").is_err());
        assert!(parse_hook("bpf").is_err());
        assert!(parse_hook("deadline-mark:14000:0x1").is_ok());
        assert!(parse_hook("deadline-mark:x:1").is_err());
        assert!(parse_hook("d3:").is_err());
        // No agent pinned a map there: the error names the path.
        let e = parse_hook("d3:/nonexistent/d3_app").err().unwrap();
        assert!(e.contains("/nonexistent/d3_app"), "{e}");
        assert_eq!(std::mem::size_of::<DeadlineSockopt>(), 16);
    }

    #[test]
    fn deadline_mark_splits_at_the_threshold() {
        let h = DeadlineMarkHook {
            threshold: Duration::from_millis(14),
            mark: 1,
        };
        assert_eq!(h.mark_for(Some(Duration::from_millis(13))), 1);
        assert_eq!(h.mark_for(Some(Duration::from_millis(14))), 0);
        assert_eq!(h.mark_for(None), 0);
    }
}
