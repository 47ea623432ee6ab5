//! Kernel feature detection at start, so the agent can say what is degraded and why.
//!
//! Qdisc support is probed for real, in a throwaway network namespace on a helper thread:
//! `tc qdisc add` on that namespace's `lo`, which disappears with the thread. Nothing on the
//! host's interfaces is touched. Kernel modules may be loaded by the probe (the kernel asks
//! modprobe for a missing qdisc), exactly as the real install would.

use std::path::PathBuf;
use std::process::Command;

use serde::{Deserialize, Serialize};

/// What this kernel offers the agent.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Features {
    /// `uname -r`.
    pub kernel_release: String,
    /// BTF for the running kernel (/sys/kernel/btf/vmlinux).
    pub btf: bool,
    /// tcx attachment of tc programs (Linux 6.6+); clsact over netlink otherwise.
    pub tcx: bool,
    /// sch_fq: the qdisc that enforces EDT timestamps.
    pub sch_fq: bool,
    /// sch_htb: rate limiting of aggregates when fq is missing.
    pub sch_htb: bool,
    /// clsact, needed for netlink attachment on kernels without tcx.
    pub clsact: bool,
    /// Where cgroup v2 is mounted (sock_ops attaches to its root).
    pub cgroup2: Option<PathBuf>,
    /// Where a BPF filesystem is mounted.
    pub bpffs: Option<PathBuf>,
}

impl Features {
    /// Probes the running kernel.
    pub fn probe() -> Features {
        let kernel_release = nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_else(|_| "unknown".into());
        let qdiscs = probe_qdiscs();
        Features {
            tcx: aya::util::KernelVersion::current()
                .is_ok_and(|v| v >= aya::util::KernelVersion::new(6, 6, 0)),
            btf: std::path::Path::new("/sys/kernel/btf/vmlinux").exists(),
            sch_fq: qdiscs.fq,
            sch_htb: qdiscs.htb,
            clsact: qdiscs.clsact,
            cgroup2: mount_point("cgroup2"),
            bpffs: mount_point("bpf"),
            kernel_release,
        }
    }

    /// What the policy compiler reads of it: the qdiscs and cgroup v2 that enforcement needs.
    pub fn support(&self) -> paceline_policy::KernelSupport {
        paceline_policy::KernelSupport {
            kernel_release: self.kernel_release.clone(),
            sch_fq: self.sch_fq,
            sch_htb: self.sch_htb,
            cgroup2: self.cgroup2.is_some(),
        }
    }

    /// One line per missing feature and what it costs, for the start-up log and the status.
    pub fn degradations(&self) -> Vec<String> {
        let mut d = Vec::new();
        if !self.sch_fq {
            d.push(
                "no sch_fq: EDT timestamps are not enforced by this kernel; per-flow TCP rates are \
                 enforced by TCP's own pacing (sock_ops SO_MAX_PACING_RATE), class and level \
                 aggregates by HTB where available, UDP per-flow rates not at all"
                    .to_string(),
            );
            if !self.sch_htb {
                d.push("no sch_htb either: class and level rates are not enforced".to_string());
            }
        }
        if !self.tcx && !self.clsact {
            d.push("neither tcx nor clsact: the tc program cannot be attached".to_string());
        }
        if self.cgroup2.is_none() {
            d.push("no cgroup v2 mount: sock_ops (TCP settings, TCP pacing) is unavailable".to_string());
        }
        if !self.btf {
            d.push("no kernel BTF: loading may fail on kernels that need CO-RE".to_string());
        }
        d
    }
}

struct QdiscSupport {
    fq: bool,
    htb: bool,
    clsact: bool,
}

/// Tries each qdisc on `lo` of a fresh network namespace owned by a short-lived thread.
fn probe_qdiscs() -> QdiscSupport {
    let probe = std::thread::spawn(|| {
        // Network namespaces are per thread: this one ends with the thread.
        if nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).is_err() {
            return None;
        }
        let ok = |args: &[&str]| {
            Command::new("tc")
                .args(args)
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false)
        };
        let fq = ok(&["qdisc", "add", "dev", "lo", "root", "handle", "1:", "fq"]);
        // Another handle than fq's: replacing a qdisc by one of another kind under the same
        // handle is refused ("Invalid qdisc name"), which hid sch_htb wherever sch_fq exists.
        let htb = ok(&["qdisc", "replace", "dev", "lo", "root", "handle", "2:", "htb"]);
        let clsact = ok(&["qdisc", "add", "dev", "lo", "clsact"]);
        Some(QdiscSupport { fq, htb, clsact })
    });
    probe.join().ok().flatten().unwrap_or(QdiscSupport {
        fq: false,
        htb: false,
        clsact: false,
    })
}

/// The mount point of the first filesystem of type `fstype` in /proc/self/mountinfo.
pub fn mount_point(fstype: &str) -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|line| {
        // fields: id parent major:minor root mountpoint options ... - fstype source superopts
        let (pre, post) = line.split_once(" - ")?;
        let fs = post.split_whitespace().next()?;
        if fs != fstype {
            return None;
        }
        Some(PathBuf::from(pre.split_whitespace().nth(4)?))
    })
}
