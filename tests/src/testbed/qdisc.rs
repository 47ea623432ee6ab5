//! Bottlenecks on a link's egress (HTB with a bfifo leaf, or TBF) and the qdisc counters parsed
//! from `tc -s -j qdisc show`.

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
            kind: o
                .get("kind")
                .and_then(|x| x.as_str())
                .unwrap_or("")
                .to_string(),
            handle: o
                .get("handle")
                .and_then(|x| x.as_str())
                .unwrap_or("")
                .to_string(),
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
    pub(crate) fn install(
        host: &Host,
        ifname: &str,
        spec: &BottleneckSpec,
        mtu: u32,
    ) -> Result<Bottleneck> {
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
                        "-n", ns, "qdisc", "add", "dev", ifname, "root", "handle", "1:", "htb",
                        "default", "1",
                    ],
                )?;
                super::util::run(
                    "tc",
                    &[
                        "-n", ns, "class", "add", "dev", ifname, "parent", "1:", "classid", "1:1",
                        "htb", "rate", &rate, "ceil", &rate, "quantum", &quantum,
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
            Shaper::Tbf { .. } => "1:",
        };
        all.into_iter().find(|q| q.handle == want).with_context(|| {
            format!(
                "qdisc {want} not found on {} in {}",
                self.ifname,
                self.host.netns()
            )
        })
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

#[cfg(test)]
mod tests {
    use super::*;

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
