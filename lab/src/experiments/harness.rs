//! What every experiment uses: the agent's status and policy, the machine's load and
//! timeliness, the kernel's counters, and output files.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use paceline_tests::testbed::Host;
use paceline_tests::workload::{self, mono_ns, sleep_until_ns};

/// A counter of `/proc/thread-self/net/snmp` (e.g. `Udp`, `RcvbufErrors`) in the calling
/// thread's namespace.
pub(crate) fn read_snmp(group: &str, field: &str) -> Result<u64> {
    let text =
        std::fs::read_to_string("/proc/thread-self/net/snmp").context("read /proc/thread-self/net/snmp")?;
    let prefix = format!("{group}:");
    let mut lines = text.lines().filter(|l| l.starts_with(&prefix));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        bail!("no {group} in /proc/net/snmp");
    };
    let i = names
        .split_whitespace()
        .position(|n| n == field)
        .with_context(|| format!("no {group} {field} in /proc/net/snmp"))?;
    values
        .split_whitespace()
        .nth(i)
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("bad {group} {field} in /proc/net/snmp"))
}

/// Live counters of one class or level from the agent's status (`counters.classes[]` or
/// `counters.levels[]`), as a JSON object; zeros when absent.
pub(crate) fn agent_counters(status: &Value, section: &str, name: &str) -> Value {
    status["counters"][section]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == name))
        .cloned()
        .unwrap_or(Value::Null)
}

/// `after - before` for the numeric counters of [`agent_counters`].
pub(crate) fn counter_delta(before: &Value, after: &Value) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    for k in [
        "packets",
        "bytes",
        "delayed_packets",
        "added_delay_seconds",
        "dropped_horizon",
        "tagged_packets",
        "tcp_sockets_configured",
        "tcp_sockopt_errors",
    ] {
        let a = after[k].as_f64().unwrap_or(0.0);
        let b = before[k].as_f64().unwrap_or(0.0);
        m.insert(k.to_string(), a - b);
    }
    m
}

/// The points to run, from `PACELINE_PLEXP_POINTS` (comma-separated substrings of point or
/// condition names; unset: all). For debugging runs only; never set by `cargo xtask bench`.
pub(crate) fn selected(name: &str) -> bool {
    match std::env::var("PACELINE_PLEXP_POINTS") {
        Ok(v) if !v.trim().is_empty() => v.split(',').any(|p| name.contains(p.trim())),
        _ => true,
    }
}

/// Writes `text` to `dir/name`.
pub(crate) fn write_out(dir: &Path, name: &str, text: &str) -> Result<()> {
    let p = dir.join(name);
    std::fs::write(&p, text).with_context(|| format!("write {}", p.display()))
}

/// A probe of the machine's timeliness: a thread that sleeps `PERIOD` at a time (absolute
/// deadlines, 1 ns timer slack) and records how late it wakes. Under emulation a late wake-up
/// means the guest's CPUs were busy or the emulator was not scheduled on the host; either way
/// the pacer's timers and the senders were late by as much. A thread wake-up costs little, so
/// the probe itself loads the machine by well under 1%.
pub(crate) struct Heartbeat {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<Vec<(u64, u64)>>,
}

/// What a [`Heartbeat`] saw.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub(crate) struct Stalls {
    /// Wake-ups.
    pub wakeups: u64,
    /// Median lateness (us).
    pub p50_late_us: f64,
    /// 99th percentile lateness (us).
    pub p99_late_us: f64,
    /// Largest lateness (ms).
    pub max_late_ms: f64,
    /// Sum of the lateness of wake-ups more than 10 ms late (ms): time the machine stood still.
    pub stalled_ms: f64,
    /// Wake-ups more than [`Heartbeat::STALL_NS`] late, as `(start, end)` in `CLOCK_MONOTONIC`
    /// ns: the stretches during which the machine did not run this thread.
    #[serde(skip)]
    pub events: Vec<(u64, u64)>,
}

impl Stalls {
    /// Does `[a, b]` (ns) overlap a stall?
    pub(crate) fn overlaps(&self, a: u64, b: u64) -> bool {
        self.events.iter().any(|&(s, e)| s <= b && e >= a)
    }
}

impl Heartbeat {
    const PERIOD_NS: u64 = 5_000_000;
    /// A wake-up this late counts as a stall.
    pub(crate) const STALL_NS: u64 = 2_000_000;

    pub(crate) fn start() -> Heartbeat {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let st = stop.clone();
        let handle = std::thread::spawn(move || {
            workload::precise_timers();
            let mut late = Vec::new();
            let mut next = mono_ns() + Self::PERIOD_NS;
            while !st.load(std::sync::atomic::Ordering::Relaxed) {
                sleep_until_ns(next);
                let now = mono_ns();
                late.push((now, now.saturating_sub(next)));
                // After a stall, resume from now: one sample per stall, not one per period.
                next = now.max(next) + Self::PERIOD_NS;
            }
            late
        });
        Heartbeat { stop, handle }
    }

    pub(crate) fn stop(self) -> Stalls {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let late = self.handle.join().unwrap_or_default();
        let us: Vec<f64> = late.iter().map(|&(_, n)| n as f64 / 1e3).collect();
        let sorted = workload::stats::sorted(us);
        Stalls {
            wakeups: late.len() as u64,
            p50_late_us: workload::stats::percentile_sorted(&sorted, 50.0),
            p99_late_us: workload::stats::percentile_sorted(&sorted, 99.0),
            max_late_ms: sorted.last().copied().unwrap_or(0.0) / 1e3,
            // (+ 0.0: an empty float sum is -0.0.)
            stalled_ms: late
                .iter()
                .filter(|&&(_, n)| n > 10_000_000)
                .map(|&(_, n)| n as f64 / 1e6)
                .sum::<f64>()
                + 0.0,
            events: late
                .iter()
                .filter(|&&(_, n)| n > Self::STALL_NS)
                .map(|&(w, n)| (w - n, w))
                .collect(),
        }
    }
}

/// The machine's load averages (1, 5 and 15 minutes), as `/proc/loadavg` shows them.
pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Number of qemu processes on the machine (other engineers' VM runs load the CPUs).
pub(crate) fn qemu_processes() -> usize {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return 0;
    };
    rd.filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .chars()
                .all(|c| c.is_ascii_digit())
        })
        .filter(|e| {
            std::fs::read_to_string(e.path().join("comm"))
                .map(|c| c.trim().starts_with("qemu"))
                .unwrap_or(false)
        })
        .count()
}

/// TCP counters of a namespace: (RetransSegs, TCPTimeouts, TCPLossProbes, TCPLossProbeRecovery).
pub(crate) fn tcp_counters(h: &Host) -> [u64; 4] {
    let text = h
        .run(&["cat", "/proc/net/snmp", "/proc/net/netstat"])
        .unwrap_or_default();
    let mut map: BTreeMap<String, u64> = BTreeMap::new();
    let lines: Vec<&str> = text.lines().collect();
    for w in lines.windows(2) {
        let (a, b) = (w[0], w[1]);
        let (Some((pa_, names)), Some((pb, vals))) = (a.split_once(':'), b.split_once(':')) else {
            continue;
        };
        if pa_ != pb
            || names
                .split_whitespace()
                .next()
                .and_then(|x| x.parse::<i64>().ok())
                .is_some()
        {
            continue;
        }
        for (k, v) in names.split_whitespace().zip(vals.split_whitespace()) {
            if let Ok(v) = v.parse::<u64>() {
                map.insert(format!("{pa_}.{k}"), v);
            }
        }
    }
    let g = |k: &str| map.get(k).copied().unwrap_or(0);
    [
        g("Tcp.RetransSegs"),
        g("TcpExt.TCPTimeouts"),
        g("TcpExt.TCPLossProbes"),
        g("TcpExt.TCPLossProbeRecovery"),
    ]
}

/// [`tcp_counters`] summed over `hosts`.
pub(crate) fn sum_tcp(hosts: &[&Host]) -> [u64; 4] {
    let mut s = [0u64; 4];
    for h in hosts {
        let c = tcp_counters(h);
        for i in 0..4 {
            s[i] += c[i];
        }
    }
    s
}

/// The kernel release (`uname -r`).
pub(crate) fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// `n` pings from `from` to `to` without load, in ms, sorted; an error naming `what` when none
/// is answered.
pub(crate) fn ping_rtts_ms(
    from: &paceline_tests::testbed::Host,
    to: std::net::IpAddr,
    n: usize,
    what: &str,
) -> anyhow::Result<Vec<f64>> {
    let mut rtts = Vec::new();
    for _ in 0..n {
        if let Ok(d) = from.ping(to, std::time::Duration::from_secs(1)) {
            rtts.push(d.as_secs_f64() * 1e3);
        }
    }
    anyhow::ensure!(!rtts.is_empty(), "no ping reply from the {what}");
    Ok(paceline_tests::workload::stats::sorted(rtts))
}

/// For the experiments' unit tests: `text` parsed by the agent's own validator (offline: the
/// interfaces are the testbed's) and compiled as the agent would; panics, naming the policy and
/// printing it, if it is rejected or draws a warning.
#[cfg(test)]
pub(crate) fn compile_offline(name: &str, text: &str) -> paceline_policy::Compiled {
    use paceline_policy::{self as policy, CompileContext, EnforcementMode, OfflineHost};
    let v = policy::parse_str(text, name, &OfflineHost).unwrap_or_else(|errors| {
        panic!(
            "{name}: rejected:\n{}\n{text}",
            errors
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        )
    });
    assert!(v.warnings.is_empty(), "{name}: warnings {:?}\n{text}", v.warnings);
    let ctx = CompileContext {
        mode: v.enforcement().fixed().unwrap_or(EnforcementMode::Fq),
        previous: None,
        all_routes_managed: false,
    };
    policy::compile(&v, &ctx).unwrap_or_else(|e| panic!("{name}: {e}\n{text}"))
}
