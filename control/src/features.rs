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

/// What the policy `c` asks for that this host does not enforce, one line each: the meaning of
/// `paceline_enforcement_degraded` and of `degraded` in `/status`. Nothing is degraded when the
/// policy asks for nothing the kernel lacks: a policy with `enforcement: none` asks for no rate
/// to be enforced, and a policy without rates needs no qdisc. `sock_ops`: whether the agent
/// attached sock_ops (the TCP settings, TCP pacing and D3 need it).
pub fn degradations_for(f: &Features, c: &crate::policy::Compiled, sock_ops: bool) -> Vec<String> {
    use crate::policy::{EnforcementMode, EnforcementRequest};
    let asked_none = c.enforcement == EnforcementRequest::None;
    let flow = !asked_none && c.classes.iter().any(|k| k.flow_rate.is_some());
    let aggregate = !asked_none
        && (c.levels.iter().any(|l| l.rate.is_some()) || c.classes.iter().any(|k| k.class_rate.is_some()));
    let tcp_settings = c.classes.iter().any(|k| {
        k.tcp
            .is_some_and(|t| t.rto_min_us.is_some() || t.delack_max_us.is_some())
    });
    let mut d = Vec::new();
    match c.mode {
        EnforcementMode::Fq => {}
        EnforcementMode::Htb => {
            if flow {
                d.push(
                    "no sch_fq: per-flow rates of UDP and other non-TCP flows are not enforced (TCP flows pace \
                     themselves at their flow rate through sock_ops; class and level rates are enforced by HTB)"
                        .to_string(),
                );
            }
        }
        EnforcementMode::SockopsOnly => {
            if flow {
                d.push(
                    "no sch_fq: per-flow rates of UDP and other non-TCP flows are not enforced (TCP flows pace \
                     themselves through sock_ops)"
                        .to_string(),
                );
            }
            if aggregate {
                d.push("no sch_fq and no sch_htb: class and level rates are not enforced".to_string());
            }
        }
        EnforcementMode::None => {
            if flow || aggregate {
                d.push(
                    "no sch_fq, no sch_htb and no cgroup v2: the policy's rates are not enforced at all"
                        .to_string(),
                );
            }
        }
    }
    let needs_sock_ops = tcp_settings || c.d3.is_some() || (flow && c.mode != EnforcementMode::Fq);
    if needs_sock_ops && !sock_ops {
        d.push(if f.cgroup2.is_none() {
            "no cgroup v2 mount: sock_ops is unavailable, so the classes' TCP settings (rto_min, delack_max), \
             TCP pacing and D3 do not apply"
                .to_string()
        } else {
            "sock_ops is not attached (enforcement: none): the classes' TCP settings (rto_min, delack_max) do not apply"
                .to_string()
        });
    }
    d
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::tests::{fake_host, ok};
    use crate::policy::{CompileContext, EnforcementMode, compile, decide_mode};

    fn kernel(fq: bool, htb: bool, cgroup2: bool) -> Features {
        Features {
            kernel_release: "test".into(),
            btf: true,
            tcx: true,
            sch_fq: fq,
            sch_htb: htb,
            clsact: true,
            cgroup2: cgroup2.then(|| PathBuf::from("/sys/fs/cgroup")),
            bpffs: None,
        }
    }

    fn degraded(policy: &str, f: &Features) -> Vec<String> {
        let v = ok(policy, &fake_host());
        let mode = decide_mode(v.enforcement(), f).unwrap();
        let c = compile(
            &v,
            &CompileContext {
                mode,
                previous: None,
                all_routes_managed: false,
            },
        )
        .unwrap();
        let sock_ops = f.cgroup2.is_some() && (mode != EnforcementMode::None || c.d3.is_some());
        degradations_for(f, &c, sock_ops)
    }

    /// The shipped default policy: `enforcement: none`, no rates. Nothing it asks for is missing
    /// on a kernel without sch_fq (PacelineEnforcementDegraded fired there before).
    #[test]
    fn enforcement_none_is_never_degraded_by_missing_qdiscs() {
        let default =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../policies/default.yaml"))
                .unwrap()
                .replace("[auto]", "[eth0]");
        for f in [
            kernel(false, true, true),
            kernel(false, false, false),
            kernel(true, true, true),
        ] {
            assert!(
                degraded(&default, &f).is_empty(),
                "{f:?}: {:?}",
                degraded(&default, &f)
            );
        }
    }

    #[test]
    fn degraded_against_what_the_policy_asks() {
        let flows = r#"
apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [eth0]
  link_rate: 1Gbit
  levels: [{name: lo, priority: 0}]
  classes: [{name: a, level: lo, flow_rate: 10Mbit}]
  default_class: a
"#;
        assert!(
            degraded(flows, &kernel(true, true, true)).is_empty(),
            "fq enforces everything"
        );
        let d = degraded(flows, &kernel(false, true, true));
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(d[0].contains("UDP"));
        let none = flows.replace("link_rate: 1Gbit", "link_rate: 1Gbit\n  enforcement: none");
        assert!(
            degraded(&none, &kernel(false, false, false)).is_empty(),
            "rates not asked to be enforced"
        );
        let aggregate = flows.replace("flow_rate: 10Mbit", "class_rate: 10Mbit");
        assert!(
            degraded(&aggregate, &kernel(false, true, true)).is_empty(),
            "HTB enforces aggregates"
        );
        assert_eq!(degraded(&aggregate, &kernel(false, false, true)).len(), 1);
        let tcp = flows.replace("flow_rate: 10Mbit", "tcp: {rto_min: 5ms}");
        let d = degraded(&tcp, &kernel(true, true, false));
        assert!(d.len() == 1 && d[0].contains("cgroup v2"), "{d:?}");
    }
}
