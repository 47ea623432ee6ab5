//! Bottlenecks on a link's egress (HTB with a bfifo leaf, TBF, or a strict-priority switch port
//! with 8 queues under a rate) and the qdisc counters parsed from `tc -s -j qdisc show`.
//!
//! # The strict-priority port ([`Shaper::StrictPriority`])
//! A model of a switch port with the 8 hardware queues QJump maps its levels to (QJump): the
//! port drains at `rate_bps` and always serves the highest-priority non-empty queue first.
//! Packets are sorted into queues by DSCP, the way many switches' default DSCP-to-queue map
//! does: a packet's priority is its DSCP's class-selector bits, `DSCP >> 3` (EF 46 -> 5, AF41
//! 34 -> 4, CS1 8 -> 1, unmarked 0 -> 0; see [`BottleneckSpec::dscp_priority`]). Built from
//! HTB and u32 only (both kernels the project runs on have them; the host's has no sch_prio):
//!
//! ```text
//! tc qdisc  add dev X root handle 1: htb default 10          # unmatched (non-IP) -> priority 0
//! tc class  add dev X parent 1:  classid 1:1  htb rate R ceil R
//! tc class  add dev X parent 1:1 classid 1:1p htb rate R/10000 ceil R prio 7-p   # p = 0..7
//! tc qdisc  add dev X parent 1:1p handle 10p: bfifo limit <buffer_bytes>          # per queue
//! tc filter add dev X parent 1: protocol ip   u32 match ip  dsfield  p<<5 0xe0 flowid 1:1p
//! tc filter add dev X parent 1: protocol ipv6 u32 match ip6 priority p<<5 0xe0 flowid 1:1p
//! ```
//! Every queue class borrows the whole rate from `1:1`; HTB lends in `prio` order, which makes
//! the port strict-priority. Each queue keeps a token floor of R/10000 (HTB needs a rate > 0):
//! a queue under its floor is served ahead of borrowers, so a low queue can jump ahead once per
//! ~`MTU / (R/10000)` (at most one frame every 1.2 s at 100 Mbit/s); that is the only departure
//! from strict priority. Service is non-preemptive, as on a switch: a high-priority packet
//! waits for the frame on the wire. `buffer_bytes` is each queue's limit (a switch's per-queue
//! threshold), so bulk traffic filling the lowest queue cannot take the buffer of a higher one.

use super::host::Host;
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

/// Which qdisc enforces the rate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Shaper {
    /// `htb` root with one class (rate = ceil) and a `bfifo` leaf (`limit` = buffer bytes);
    /// drops and backlog are counted by the leaf (handle `10:`).
    Htb,
    /// `tbf rate R burst B limit L`; `burst_bytes` defaults to max(2 MTU-sized packets, 1 ms at
    /// the rate).
    Tbf {
        /// Token bucket size in bytes.
        burst_bytes: Option<u32>,
    },
    /// A switch port: 8 queues by DSCP class selector (`DSCP >> 3`), served in strict priority
    /// under the rate; `buffer_bytes` is each queue's limit (see the module docs). Counters:
    /// [`Bottleneck::stats`] is the whole port (the HTB root counts every queue's drops and
    /// backlog), [`Bottleneck::queue_stats`] each queue.
    StrictPriority,
}

/// A bottleneck: a rate and a buffer in bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BottleneckSpec {
    /// Rate in bits per second.
    pub rate_bps: u64,
    /// Queue limit in bytes (the "switch buffer").
    pub buffer_bytes: u32,
    /// The qdisc that implements it.
    pub shaper: Shaper,
}

impl BottleneckSpec {
    /// HTB + bfifo with `rate_bps` and a `buffer_bytes` queue.
    pub fn htb(rate_bps: u64, buffer_bytes: u32) -> Self {
        BottleneckSpec {
            rate_bps,
            buffer_bytes,
            shaper: Shaper::Htb,
        }
    }
    /// TBF with `rate_bps`, a `buffer_bytes` limit and the default burst.
    pub fn tbf(rate_bps: u64, buffer_bytes: u32) -> Self {
        BottleneckSpec {
            rate_bps,
            buffer_bytes,
            shaper: Shaper::Tbf { burst_bytes: None },
        }
    }
    /// A strict-priority switch port ([`Shaper::StrictPriority`]): `rate_bps`, 8 queues of
    /// `buffer_bytes` each, DSCP class selector to queue.
    pub fn strict_priority(rate_bps: u64, buffer_bytes: u32) -> Self {
        BottleneckSpec {
            rate_bps,
            buffer_bytes,
            shaper: Shaper::StrictPriority,
        }
    }
    /// The queue (0 = lowest, 7 = highest priority) a [`Shaper::StrictPriority`] port puts a
    /// packet with `dscp` in: its class-selector bits, `dscp >> 3`.
    pub const fn dscp_priority(dscp: u8) -> u8 {
        (dscp & 0x3f) >> 3
    }
    /// TBF with an explicit burst.
    pub fn tbf_with_burst(rate_bps: u64, buffer_bytes: u32, burst_bytes: u32) -> Self {
        BottleneckSpec {
            rate_bps,
            buffer_bytes,
            shaper: Shaper::Tbf {
                burst_bytes: Some(burst_bytes),
            },
        }
    }
}

/// Counters of one qdisc (`tc -s -j qdisc show`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QdiscStats {
    /// `htb`, `bfifo`, `tbf`, `clsact`, `noqueue`, ...
    pub kind: String,
    /// Handle, e.g. `1:` or `10:`.
    pub handle: String,
    /// Parent handle (`None` for the root).
    pub parent: Option<String>,
    /// Bytes dequeued (sent).
    pub bytes: u64,
    /// Packets dequeued (sent).
    pub packets: u64,
    /// Packets dropped.
    pub drops: u64,
    /// Overlimit events (the shaper had to hold a packet).
    pub overlimits: u64,
    /// Requeues.
    pub requeues: u64,
    /// Bytes queued right now.
    pub backlog_bytes: u64,
    /// Packets queued right now.
    pub qlen: u64,
}

/// Parses the JSON that `tc -s -j qdisc show` prints.
pub fn parse_qdisc_json(json: &str) -> Result<Vec<QdiscStats>> {
    let v: serde_json::Value = serde_json::from_str(json.trim()).context("parse tc -j output")?;
    let arr = v.as_array().context("tc -j output is not an array")?;
    let num = |o: &serde_json::Value, k: &str| o.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
    Ok(arr
        .iter()
        .map(|o| QdiscStats {
            kind: o.get("kind").and_then(|x| x.as_str()).unwrap_or("").to_string(),
            handle: o.get("handle").and_then(|x| x.as_str()).unwrap_or("").to_string(),
            parent: o.get("parent").and_then(|x| x.as_str()).map(str::to_string),
            bytes: num(o, "bytes"),
            packets: num(o, "packets"),
            drops: num(o, "drops"),
            overlimits: num(o, "overlimits"),
            requeues: num(o, "requeues"),
            backlog_bytes: num(o, "backlog"),
            qlen: num(o, "qlen"),
        })
        .collect())
}

/// A bottleneck installed on `ifname` in `host`. This is a handle, not an owning guard: the
/// qdisc stays until [`Bottleneck::remove`] or until the [`super::Testbed`] is dropped (which
/// deletes it, then the namespaces). Dropping the handle does not remove it, so
/// `let _ = iface.set_bottleneck(..)` keeps the bottleneck.
#[derive(Clone, Debug)]
pub struct Bottleneck {
    pub(crate) host: Host,
    pub(crate) ifname: String,
    pub(crate) spec: BottleneckSpec,
    pub(crate) mtu: u32,
}

pub(crate) const LEAF_HANDLE: &str = "10:";

impl Bottleneck {
    pub(crate) fn install(host: &Host, ifname: &str, spec: &BottleneckSpec, mtu: u32) -> Result<Bottleneck> {
        if spec.rate_bps == 0 {
            bail!("bottleneck rate must be > 0");
        }
        let ns = host.netns();
        let rate = format!("{}bit", spec.rate_bps);
        let frame = mtu as u64 + 14;
        // Start from a clean root (noqueue on a fresh veth, or a previous bottleneck).
        super::util::run_quiet("tc", &["-n", ns, "qdisc", "del", "dev", ifname, "root"]);
        match &spec.shaper {
            Shaper::Htb => {
                // One class: quantum only matters between classes; keep it in the range HTB
                // accepts without warnings.
                let quantum = (spec.rate_bps / 8 / 10).clamp(frame, 200_000).to_string();
                super::util::run(
                    "tc",
                    &[
                        "-n", ns, "qdisc", "add", "dev", ifname, "root", "handle", "1:", "htb", "default",
                        "1",
                    ],
                )?;
                super::util::run(
                    "tc",
                    &[
                        "-n", ns, "class", "add", "dev", ifname, "parent", "1:", "classid", "1:1", "htb",
                        "rate", &rate, "ceil", &rate, "quantum", &quantum,
                    ],
                )?;
                super::util::run(
                    "tc",
                    &[
                        "-n",
                        ns,
                        "qdisc",
                        "add",
                        "dev",
                        ifname,
                        "parent",
                        "1:1",
                        "handle",
                        LEAF_HANDLE,
                        "bfifo",
                        "limit",
                        &spec.buffer_bytes.to_string(),
                    ],
                )?;
            }
            Shaper::StrictPriority => install_strict_priority(ns, ifname, spec, frame)?,
            Shaper::Tbf { burst_bytes } => {
                let burst = burst_bytes
                    .map(|b| b as u64)
                    .unwrap_or_else(|| (2 * frame).max(spec.rate_bps / 8 / 1000));
                super::util::run(
                    "tc",
                    &[
                        "-n",
                        ns,
                        "qdisc",
                        "add",
                        "dev",
                        ifname,
                        "root",
                        "handle",
                        "1:",
                        "tbf",
                        "rate",
                        &rate,
                        "burst",
                        &burst.to_string(),
                        "limit",
                        &spec.buffer_bytes.to_string(),
                    ],
                )?;
            }
        }
        Ok(Bottleneck {
            host: host.clone(),
            ifname: ifname.to_string(),
            spec: spec.clone(),
            mtu,
        })
    }

    /// The spec it was installed with (rate updated by [`Bottleneck::set_rate`]).
    pub fn spec(&self) -> &BottleneckSpec {
        &self.spec
    }

    /// The interface it shapes.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The host whose egress it shapes.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// Counters of the qdisc that queues and drops: the bfifo leaf for HTB, the tbf for TBF.
    pub fn stats(&self) -> Result<QdiscStats> {
        let all = self.all_stats()?;
        let want = match self.spec.shaper {
            Shaper::Htb => LEAF_HANDLE,
            Shaper::Tbf { .. } | Shaper::StrictPriority => "1:",
        };
        all.into_iter().find(|q| q.handle == want).with_context(|| {
            format!(
                "qdisc {want} not found on {} in {}",
                self.ifname,
                self.host.netns()
            )
        })
    }

    /// Counters of each queue of a [`Shaper::StrictPriority`] port, indexed by priority (0 =
    /// lowest); an error for the other shapers.
    pub fn queue_stats(&self) -> Result<Vec<QdiscStats>> {
        if self.spec.shaper != Shaper::StrictPriority {
            bail!("{}: queue_stats needs a strict-priority bottleneck", self.ifname);
        }
        let all = self.all_stats()?;
        (0..SP_QUEUES)
            .map(|p| {
                let h = sp_leaf_handle(p);
                all.iter().find(|q| q.handle == h).cloned().with_context(|| {
                    format!(
                        "queue {p} (qdisc {h}) not found on {} in {}",
                        self.ifname,
                        self.host.netns()
                    )
                })
            })
            .collect()
    }

    /// Counters of every qdisc on the interface.
    pub fn all_stats(&self) -> Result<Vec<QdiscStats>> {
        self.host.qdisc_stats(&self.ifname)
    }

    /// Changes the rate in place (keeps the queue and counters).
    pub fn set_rate(&mut self, rate_bps: u64) -> Result<()> {
        let ns = self.host.netns().to_string();
        let rate = format!("{rate_bps}bit");
        match &self.spec.shaper {
            Shaper::StrictPriority => {
                let frame = self.mtu as u64 + 14;
                for (classid, parent, r) in sp_classes(rate_bps) {
                    let q = sp_quantum(r, frame);
                    super::util::run(
                        "tc",
                        &[
                            "-n",
                            &ns,
                            "class",
                            "change",
                            "dev",
                            &self.ifname,
                            "parent",
                            &parent,
                            "classid",
                            &classid,
                            "htb",
                            "rate",
                            &format!("{r}bit"),
                            "ceil",
                            &rate,
                            "quantum",
                            &q,
                        ],
                    )?;
                }
            }
            Shaper::Htb => {
                super::util::run(
                    "tc",
                    &[
                        "-n",
                        &ns,
                        "class",
                        "change",
                        "dev",
                        &self.ifname,
                        "parent",
                        "1:",
                        "classid",
                        "1:1",
                        "htb",
                        "rate",
                        &rate,
                        "ceil",
                        &rate,
                    ],
                )?;
            }
            Shaper::Tbf { burst_bytes } => {
                let frame = self.mtu as u64 + 14;
                let burst = burst_bytes
                    .map(|b| b as u64)
                    .unwrap_or_else(|| (2 * frame).max(rate_bps / 8 / 1000));
                super::util::run(
                    "tc",
                    &[
                        "-n",
                        &ns,
                        "qdisc",
                        "change",
                        "dev",
                        &self.ifname,
                        "root",
                        "handle",
                        "1:",
                        "tbf",
                        "rate",
                        &rate,
                        "burst",
                        &burst.to_string(),
                        "limit",
                        &self.spec.buffer_bytes.to_string(),
                    ],
                )?;
            }
        }
        self.spec.rate_bps = rate_bps;
        Ok(())
    }

    /// Deletes the root qdisc (the interface goes back to its default).
    pub fn remove(self) -> Result<()> {
        super::util::run(
            "tc",
            &[
                "-n",
                self.host.netns(),
                "qdisc",
                "del",
                "dev",
                &self.ifname,
                "root",
            ],
        )
        .map(drop)
    }
}

/// Queues of a strict-priority port.
const SP_QUEUES: u8 = 8;

/// Class of queue `p` of a strict-priority port: `1:1p` (hex minor 0x10 + p).
fn sp_classid(p: u8) -> String {
    format!("1:{:x}", 0x10 + p as u32)
}

/// Leaf qdisc handle of queue `p`: `10p:` (hex major 0x100 + p).
fn sp_leaf_handle(p: u8) -> String {
    format!("{:x}:", 0x100 + p as u32)
}

/// (classid, parent, rate in bit/s) of the port class `1:1` and of the 8 queue classes.
fn sp_classes(rate_bps: u64) -> Vec<(String, String, u64)> {
    let floor = (rate_bps / 10_000).max(8_000);
    let mut v = vec![("1:1".to_string(), "1:".to_string(), rate_bps)];
    v.extend((0..SP_QUEUES).map(|p| (sp_classid(p), "1:1".to_string(), floor)));
    v
}

/// HTB quantum (bytes per DRR round; only matters between classes of one prio): one frame for
/// the queues, a tenth of a second's worth (within tc's accepted range) for the port class.
fn sp_quantum(rate_bps: u64, frame: u64) -> String {
    (rate_bps / 8 / 10).clamp(frame, 200_000).to_string()
}

/// The `u32` matches that send DSCP class selector `p` (`dsfield` / IPv6 traffic class with
/// mask 0xe0) to queue `p`: one filter for IPv4 and one for IPv6.
fn sp_filters(p: u8) -> [(&'static str, &'static str, String); 2] {
    let v = format!("0x{:02x}", (p as u32) << 5);
    [("ip", "ip dsfield", v.clone()), ("ipv6", "ip6 priority", v)]
}

fn install_strict_priority(ns: &str, ifname: &str, spec: &BottleneckSpec, frame: u64) -> Result<()> {
    use super::util::run;
    let default = format!("{:x}", 0x10);
    run(
        "tc",
        &[
            "-n", ns, "qdisc", "add", "dev", ifname, "root", "handle", "1:", "htb", "default", &default,
        ],
    )?;
    let ceil = format!("{}bit", spec.rate_bps);
    for (i, (classid, parent, r)) in sp_classes(spec.rate_bps).into_iter().enumerate() {
        let rate = format!("{r}bit");
        let q = if i == 0 {
            sp_quantum(r, frame)
        } else {
            frame.to_string()
        };
        let mut args = vec![
            "-n", ns, "class", "add", "dev", ifname, "parent", &parent, "classid", &classid, "htb", "rate",
            &rate, "ceil", &ceil, "quantum", &q,
        ];
        // HTB serves prio 0 first: queue p gets prio 7 - p.
        let prio = if i == 0 {
            None
        } else {
            Some((SP_QUEUES - i as u8).to_string())
        };
        if let Some(pr) = &prio {
            args.extend(["prio", pr.as_str()]);
        }
        run("tc", &args)?;
    }
    let limit = spec.buffer_bytes.to_string();
    for p in 0..SP_QUEUES {
        let (classid, handle) = (sp_classid(p), sp_leaf_handle(p));
        run(
            "tc",
            &[
                "-n", ns, "qdisc", "add", "dev", ifname, "parent", &classid, "handle", &handle, "bfifo",
                "limit", &limit,
            ],
        )?;
        for (proto, field, value) in sp_filters(p) {
            let mut args = vec![
                "-n",
                ns,
                "filter",
                "add",
                "dev",
                ifname,
                "parent",
                "1:",
                "protocol",
                proto,
                "prio",
                if proto == "ip" { "1" } else { "2" },
                "u32",
                "match",
            ];
            args.extend(field.split(' '));
            args.extend([value.as_str(), "0xe0", "flowid", &classid]);
            run("tc", &args)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_priority_plan() {
        assert_eq!(BottleneckSpec::dscp_priority(46), 5);
        assert_eq!(BottleneckSpec::dscp_priority(8), 1);
        assert_eq!(BottleneckSpec::dscp_priority(0), 0);
        assert_eq!(BottleneckSpec::dscp_priority(63), 7);
        assert_eq!((sp_classid(0), sp_classid(7)), ("1:10".into(), "1:17".into()));
        assert_eq!(
            (sp_leaf_handle(0), sp_leaf_handle(7)),
            ("100:".into(), "107:".into())
        );
        let c = sp_classes(100_000_000);
        assert_eq!(c.len(), 9);
        assert_eq!(c[0], ("1:1".into(), "1:".into(), 100_000_000));
        assert_eq!(c[8], ("1:17".into(), "1:1".into(), 10_000));
        assert_eq!(sp_filters(5)[0].2, "0xa0");
    }

    #[test]
    fn parses_tc_json() {
        let j = r#"[{"kind":"htb","handle":"1:","root":true,"refcnt":3,"options":{"r2q":10},"bytes":10,"packets":1,"drops":2,"overlimits":3,"requeues":0,"backlog":0,"qlen":0},{"kind":"bfifo","handle":"10:","parent":"1:1","options":{"limit":100000},"bytes":1514,"packets":1,"drops":7,"overlimits":0,"requeues":0,"backlog":3000,"qlen":2}]"#;
        let q = parse_qdisc_json(j).unwrap();
        assert_eq!(q.len(), 2);
        assert_eq!(q[0].kind, "htb");
        assert_eq!(q[0].parent, None);
        assert_eq!(q[1].handle, "10:");
        assert_eq!(q[1].parent.as_deref(), Some("1:1"));
        assert_eq!(
            (q[1].bytes, q[1].drops, q[1].backlog_bytes, q[1].qlen),
            (1514, 7, 3000, 2)
        );
    }
}
