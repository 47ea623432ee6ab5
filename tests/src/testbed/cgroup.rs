//! cgroup v2 directories for the tests: find the cgroup2 mount, create a directory, move a
//! spawned child into it (from `pre_exec`, so the child is inside before it runs a single
//! instruction of the program), and remove it again (killing what is left inside) on drop.

use anyhow::{Context, Result, bail};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The directory, under the cgroup2 mount, that holds every cgroup the testbed creates.
pub const CGROUP_PARENT: &str = "paceline-tests";

/// The cgroup2 mount point, from `/proc/mounts` (first `cgroup2` entry): `/sys/fs/cgroup` on a
/// pure v2 system, `/sys/fs/cgroup/unified` on a hybrid one.
pub fn cgroup2_mount() -> Result<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").context("read /proc/mounts")?;
    parse_cgroup2_mount(&mounts).context("no cgroup2 filesystem in /proc/mounts")
}

pub(crate) fn parse_cgroup2_mount(mounts: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_dev, dir, fstype) = (f.next()?, f.next()?, f.next()?);
        // /proc/mounts escapes spaces as \040; cgroup mounts never have them in practice.
        (fstype == "cgroup2").then(|| PathBuf::from(dir.replace("\\040", " ")))
    })
}

/// A cgroup v2 directory, removed on drop (its processes are killed first).
#[derive(Debug)]
pub struct Cgroup {
    path: PathBuf,
    procs: CString,
}

impl Cgroup {
    /// Creates (or reuses) `<cgroup2 mount>/<rel>`, creating parents as needed.
    pub fn create(rel: impl AsRef<Path>) -> Result<Cgroup> {
        let path = cgroup2_mount()?.join(rel.as_ref());
        std::fs::create_dir_all(&path).with_context(|| format!("mkdir {}", path.display()))?;
        let procs = CString::new(path.join("cgroup.procs").as_os_str().as_bytes())
            .context("cgroup path contains NUL")?;
        Ok(Cgroup { path, procs })
    }

    /// The directory (what `bpf_prog_attach`/aya's `CgroupSockOps::attach` want opened).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves an existing process into this cgroup.
    pub fn add_pid(&self, pid: u32) -> Result<()> {
        std::fs::write(self.path.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("move pid {pid} into {}", self.path.display()))
    }

    /// Makes `cmd`'s child join this cgroup right after fork, before exec (a `pre_exec` hook
    /// writing the child's pid to `cgroup.procs`; it runs before or after the host's setns,
    /// which does not matter for cgroupfs).
    pub fn attach(&self, cmd: &mut Command) {
        let procs = self.procs.clone();
        // SAFETY: the hook only calls async-signal-safe functions (getpid, open, write, close)
        // and does not allocate.
        unsafe {
            cmd.pre_exec(move || {
                let mut buf = [0u8; 16];
                let mut n = libc::getpid() as u32;
                let mut i = buf.len();
                loop {
                    i -= 1;
                    buf[i] = b'0' + (n % 10) as u8;
                    n /= 10;
                    if n == 0 {
                        break;
                    }
                }
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let w = libc::write(fd, buf[i..].as_ptr().cast(), buf.len() - i);
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if w < 0 { Err(err) } else { Ok(()) }
            });
        }
    }

    /// Pids currently in the cgroup (not its descendants).
    pub fn procs(&self) -> Result<Vec<u32>> {
        let s = std::fs::read_to_string(self.path.join("cgroup.procs"))
            .with_context(|| format!("read {}/cgroup.procs", self.path.display()))?;
        Ok(s.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// Removes the cgroup now (same as drop, but reports errors).
    pub fn remove(self) -> Result<()> {
        let r = remove_tree(&self.path);
        std::mem::forget(self);
        r
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if let Err(e) = remove_tree(&self.path) {
            eprintln!("testbed: cgroup cleanup: {e:#}");
        }
    }
}

/// Kills everything in `dir` and its descendants and removes the directories, deepest first.
pub(crate) fn remove_tree(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_tree(&e.path())?;
            }
        }
    }
    let kill = dir.join("cgroup.kill");
    if kill.exists() {
        let _ = std::fs::write(&kill, "1");
    }
    let end = Instant::now() + Duration::from_secs(3);
    loop {
        let pids: Vec<i32> = std::fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        let me = std::process::id() as i32;
        for &p in &pids {
            if p != me {
                // SAFETY: plain kill(2).
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if Instant::now() >= end => {
                bail!("rmdir {}: {e} (pids still inside: {pids:?})", dir.display())
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_hybrid_and_pure_mounts() {
        let hybrid = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\ncgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n";
        assert_eq!(
            parse_cgroup2_mount(hybrid).unwrap(),
            PathBuf::from("/sys/fs/cgroup/unified")
        );
        let pure = "proc /proc proc rw 0 0\ncgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n";
        assert_eq!(
            parse_cgroup2_mount(pure).unwrap(),
            PathBuf::from("/sys/fs/cgroup")
        );
        assert!(parse_cgroup2_mount("proc /proc proc rw 0 0\n").is_none());
    }
}
