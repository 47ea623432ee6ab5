//! Root qdiscs on managed interfaces: fq (which enforces EDT timestamps), or an HTB tree for
//! aggregate rates where the kernel has no fq.
//!
//! Qdiscs are configured through iproute2's `tc`, the reference encoder of every qdisc's
//! netlink options (fq, mq, htb), present on every server; the agent reads its JSON output.
//! The agent only replaces a root qdisc that the kernel created by default (handle `0:`:
//! pfifo_fast, mq, noqueue, fq_codel, ...): deleting its own root on exit brings that default
//! back. A root someone configured on purpose is left alone and the interface is reported as
//! not enforcing aggregates.

use std::process::Command;

use anyhow::{Context as _, Result, anyhow, bail};
use serde::Deserialize;

use paceline_policy::HtbPlan;

/// Runs `tc` with `args`; the error names the command and carries tc's message.
pub fn tc(args: &[&str]) -> Result<String> {
    run("tc", args)
}

fn run(prog: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(prog)
        .args(args)
        .output()
        .with_context(|| format!("running `{prog}` (is iproute2 installed?)"))?;
    if !out.status.success() {
        bail!(
            "`{prog} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A root qdisc as `tc -j qdisc show` reports it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Qdisc {
    pub kind: String,
    pub handle: String,
}

impl Qdisc {
    /// A root qdisc the kernel created by itself (handle 0:), which deleting ours restores.
    pub fn is_kernel_default(&self) -> bool {
        self.handle == "0:"
    }
}

/// The root qdisc of `iface`.
pub fn root_qdisc(iface: &str) -> Result<Option<Qdisc>> {
    let out = tc(&["-j", "qdisc", "show", "dev", iface, "root"])?;
    let list: Vec<Qdisc> = serde_json::from_str(out.trim()).unwrap_or_default();
    Ok(list.into_iter().next())
}

/// What the qdiscs need to know of a link (from `ip -d -j link show`, valid in any netns).
#[derive(Deserialize)]
struct Link {
    num_tx_queues: Option<u32>,
    mtu: Option<u32>,
}

fn link(iface: &str) -> Result<Option<Link>> {
    let out = run("ip", &["-d", "-j", "link", "show", "dev", iface])?;
    let links: Vec<Link> = serde_json::from_str(out.trim()).context("parsing `ip -j link` output")?;
    Ok(links.into_iter().next())
}

/// Number of transmit queues of `iface`.
pub fn num_tx_queues(iface: &str) -> Result<u32> {
    Ok(link(iface)?.and_then(|l| l.num_tx_queues).unwrap_or(1).max(1))
}

/// fq settings derived from the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FqParams {
    /// Packets the whole qdisc may hold.
    pub limit: u32,
    /// Packets one flow may hold: must cover the policy's horizon at the flow's rate, or fq
    /// would drop before the datapath's horizon does.
    pub flow_limit: u32,
    /// fq's own horizon in ns: at least the datapath's, so the datapath decides drops.
    pub horizon_ns: u64,
}

impl FqParams {
    /// Sizes fq for a datapath horizon and the fastest paced rate of the policy (bytes/s).
    pub fn for_policy(horizon_ns: u64, fastest_rate: u64) -> FqParams {
        // Packets of 1500 bytes that fit in the horizon at the fastest paced rate.
        let backlog = (fastest_rate as u128 * horizon_ns as u128 / 1_000_000_000 / 1500) as u64;
        let flow_limit = backlog.clamp(100, 100_000) as u32;
        FqParams {
            limit: (flow_limit as u64 * 4).clamp(10_000, 1_000_000) as u32,
            flow_limit,
            horizon_ns: (horizon_ns * 2).max(1_000_000_000),
        }
    }
}

/// What the agent installed on an interface (recorded in the state file for recovery).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Installed {
    /// `fq` as root (single-queue device).
    Fq,
    /// `mq` as root with one `fq` per transmit queue.
    MqFq { queues: u32 },
    /// An HTB tree as root.
    Htb,
}

impl Installed {
    pub fn kind(&self) -> &'static str {
        match self {
            Installed::Fq => "fq",
            Installed::MqFq { .. } => "mq",
            Installed::Htb => "htb",
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Installed::Fq => "fq".into(),
            Installed::MqFq { queues } => format!("mq + {queues} x fq"),
            Installed::Htb => "htb".into(),
        }
    }
}

/// Checks that the agent may replace `iface`'s root qdisc.
pub fn check_replaceable(iface: &str) -> Result<()> {
    match root_qdisc(iface)? {
        Some(q) if !q.is_kernel_default() => Err(anyhow!(
            "{iface} has a configured root qdisc ({} {}); paceline replaces only the kernel's \
             default root. Remove it (`tc qdisc del dev {iface} root`) or set `enforcement: \
             sockops` or `none` in the policy",
            q.kind,
            q.handle
        )),
        _ => Ok(()),
    }
}

/// Installs fq (mq + fq per queue on multi-queue devices) as `iface`'s root. `ours`: the root
/// there is the one a previous paceline agent installed, which may be replaced (a `replace`
/// of fq by fq changes its parameters in place, keeping what it queues).
pub fn install_fq(iface: &str, p: FqParams, ours: bool) -> Result<Installed> {
    if !ours {
        check_replaceable(iface)?;
    }
    let limit = p.limit.to_string();
    let flow_limit = p.flow_limit.to_string();
    let horizon = format!("{}us", p.horizon_ns / 1000);
    let fq_args = [
        "fq",
        "limit",
        &limit,
        "flow_limit",
        &flow_limit,
        "horizon",
        &horizon,
        "horizon_drop",
    ];
    let queues = num_tx_queues(iface)?;
    if queues <= 1 {
        let mut args = vec!["qdisc", "replace", "dev", iface, "root", "handle", "1:"];
        args.extend(fq_args);
        tc(&args)?;
        return Ok(Installed::Fq);
    }
    tc(&["qdisc", "replace", "dev", iface, "root", "handle", "1:", "mq"])?;
    for q in 1..=queues {
        let parent = format!("1:{q:x}");
        let mut args = vec!["qdisc", "replace", "dev", iface, "parent", &parent];
        args.extend(fq_args);
        tc(&args)?;
    }
    Ok(Installed::MqFq { queues })
}

fn bits(rate_bytes: u64) -> String {
    format!("{}bit", rate_bytes.saturating_mul(8).max(8))
}

/// HTB's quantum for a class: what it may send per round; tc warns outside [1 MTU, 200 KB].
fn quantum(rate_bytes: u64) -> String {
    (rate_bytes / 10).clamp(1514, 200_000).to_string()
}

/// How long a class may bank tokens for: HTB's `burst` (and `cburst`) is the rate over this
/// time plus one frame ([`htb_burst`]).
pub const HTB_BURST_NS: u64 = 1_000_000;

/// HTB's burst (and cburst) in bytes for a class of `rate_bytes` bytes/s on a link whose frames
/// are at most `frame` bytes: the tokens the class may bank, a millisecond of its rate plus one
/// frame. A class that dequeues later than its tokens allow (the watchdog timer's or softirq's
/// latency) keeps what it banked up to its burst and loses the rest for good. iproute2's
/// default is rate / HZ + MTU with HZ read from /proc/net/psched, which says 1,000,000,000 on
/// kernels with high-resolution timers: a burst of one MTU, 64 us at 200 Mbit/s, so that every
/// late dequeue cost the class its rate (a 200 Mbit/s class with 4 TCP flows carried 3-6% less
/// than its rate). A millisecond is the burst that default gave at HZ = 1000, what HTB was
/// sized for; it lets a class send at most a millisecond of its rate back to back after idling.
pub fn htb_burst(rate_bytes: u64, frame: u32) -> u64 {
    (rate_bytes as u128 * HTB_BURST_NS as u128 / 1_000_000_000) as u64 + u64::from(frame)
}

/// Installs (or, with `update`, changes in place the classes of) the HTB tree of `plan` as
/// `iface`'s root: root qdisc `1:` whose unclassified traffic goes to `plan.default_minor`, and
/// its classes (parents before children), each with the burst of [`htb_burst`]. `ours`: the
/// root there is the one a previous paceline agent installed, which may be replaced.
pub fn install_htb(iface: &str, plan: &HtbPlan, update: bool, ours: bool) -> Result<Installed> {
    if !update {
        if !ours {
            check_replaceable(iface)?;
        }
        let default = format!("{:x}", plan.default_minor);
        tc(&[
            "qdisc", "replace", "dev", iface, "root", "handle", "1:", "htb", "default", &default,
        ])?;
    }
    // The largest frame: the MTU and an Ethernet header with a VLAN tag.
    let frame = link(iface)?.and_then(|l| l.mtu).unwrap_or(1500) + 18;
    for c in &plan.classes {
        let parent = if c.parent_minor == 0 {
            "1:".to_string()
        } else {
            format!("1:{:x}", c.parent_minor)
        };
        let classid = format!("1:{:x}", c.classid_minor);
        let (rate, ceil, prio, quantum) = (bits(c.rate), bits(c.ceil), c.prio.to_string(), quantum(c.rate));
        let (burst, cburst) = (
            htb_burst(c.rate, frame).to_string(),
            htb_burst(c.ceil, frame).to_string(),
        );
        tc(&[
            "class", "replace", "dev", iface, "parent", &parent, "classid", &classid, "htb", "rate", &rate,
            "ceil", &ceil, "prio", &prio, "quantum", &quantum, "burst", &burst, "cburst", &cburst,
        ])?;
    }
    Ok(Installed::Htb)
}

/// Deletes `iface`'s root qdisc if it is the one paceline installed (same kind, handle 1:);
/// the kernel then puts its default back.
pub fn remove_root(iface: &str, installed: &Installed) -> Result<bool> {
    match root_qdisc(iface)? {
        Some(q) if q.kind == installed.kind() && q.handle == "1:" => {
            tc(&["qdisc", "del", "dev", iface, "root"])?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Whether `iface` has a clsact qdisc.
pub fn has_clsact(iface: &str) -> Result<bool> {
    let out = tc(&["-j", "qdisc", "show", "dev", iface])?;
    let list: Vec<Qdisc> = serde_json::from_str(out.trim()).unwrap_or_default();
    Ok(list.iter().any(|q| q.kind == "clsact"))
}

pub fn remove_clsact(iface: &str) -> Result<()> {
    tc(&["qdisc", "del", "dev", iface, "clsact"]).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fq_sized_for_horizon_and_rate() {
        // 1 Gbit/s for 100 ms is 12.5 MB, about 8333 full-size packets.
        let p = FqParams::for_policy(100_000_000, 125_000_000);
        assert_eq!(p.flow_limit, 8_333);
        assert_eq!(p.limit, 33_332);
        assert_eq!(p.horizon_ns, 1_000_000_000);
        // Slow policies keep fq's own minimums.
        let p = FqParams::for_policy(10_000_000, 125_000);
        assert_eq!((p.flow_limit, p.limit), (100, 10_000));
    }

    #[test]
    fn tc_units_are_bits() {
        assert_eq!(bits(125_000_000), "1000000000bit");
        assert_eq!(bits(0), "8bit");
        assert_eq!(quantum(1_000), "1514");
        assert_eq!(quantum(125_000_000), "200000");
    }

    #[test]
    fn htb_banks_a_millisecond_of_its_rate_and_a_frame() {
        // 200 Mbit/s: 25,000 bytes a millisecond.
        assert_eq!(htb_burst(25_000_000, 1518), 26_518);
        // A slow class still sends a whole frame.
        assert_eq!(htb_burst(125, 1518), 1518);
        // 400 Gbit/s does not overflow.
        assert_eq!(htb_burst(50_000_000_000, 9018), 50_009_018);
    }

    #[test]
    fn default_root_detection() {
        assert!(
            Qdisc {
                kind: "pfifo_fast".into(),
                handle: "0:".into()
            }
            .is_kernel_default()
        );
        assert!(
            !Qdisc {
                kind: "htb".into(),
                handle: "1:".into()
            }
            .is_kernel_default()
        );
    }
}
