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

use std::io;
use std::os::fd::RawFd;
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
    fn before_response(
        &self,
        _fd: RawFd,
        _size: u64,
        _deadline: Option<Duration>,
    ) -> io::Result<()> {
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

/// Parses a `--hook` value: `none`, `log`, or `sockopt:LEVEL:OPTNAME` (decimal or 0x hex).
pub fn parse_hook(s: &str) -> Result<Box<dyn ResponseHook>, String> {
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
        _ => Err(format!(
            "hook {s:?}: expected none, log or sockopt:LEVEL:OPTNAME"
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
        assert_eq!(std::mem::size_of::<DeadlineSockopt>(), 16);
    }
}
