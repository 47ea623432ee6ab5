//! `paceline status`

use anyhow::Result;

use crate::{runtime::health::Health, status::LiveStatus};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub api: super::ApiAddr,
    /// Print the JSON document.
    #[arg(long)]
    pub json: bool,
}

/// Exit status: 0 healthy and the last reload applied, nothing degraded; 1 degraded,
/// unhealthy or the last reload rejected; 2 the agent cannot be reached.
pub fn run(a: Args) -> Result<i32> {
    let (code, body) = match a.api.get("/status") {
        Ok(r) => r,
        Err(u) => return Ok(super::unreachable(u)),
    };
    if code != 200 {
        eprintln!("paceline: the agent answered HTTP {code}: {}", body.trim());
        return Ok(2);
    }
    let status: LiveStatus = match serde_json::from_str(&body) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("paceline: parsing the agent's status: {e}");
            return Ok(2);
        }
    };
    let health: Option<Health> = a
        .api
        .get("/readyz")
        .ok()
        .and_then(|(_, b)| serde_json::from_str(&b).ok());
    if a.json {
        // Through a JSON value: keys in sorted order, as this command has always printed them.
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::to_value(&status)?)?
        );
    } else {
        print!("{}", render(&status, crate::status::unix_now()));
        if let Some(h) = &health {
            if h.reasons.is_empty() {
                println!("health: ok");
            } else {
                for r in &h.reasons {
                    println!("health: {}: {r}", h.status);
                }
            }
        }
    }
    let bad = !status.status.degraded.is_empty() || health.as_ref().is_some_and(|h| !h.healthy());
    Ok(if bad { 1 } else { 0 })
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// An optional text, `-` when absent.
fn or_dash(v: Option<impl ToString>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

/// A level's rate limit in bits/s for the RATE column, `unlimited` for none: three significant
/// digits without carrying into the next unit (unlike `units::fmt_rate`, whose reports round
/// 999.7 Mbit/s up to 1.00 Gbit/s).
fn rate_column(bytes_per_sec: Option<u64>) -> String {
    let Some(b) = bytes_per_sec else {
        return "unlimited".into();
    };
    let bits = b as f64 * 8.0;
    let (v, u) = if bits >= 1e9 {
        (bits / 1e9, "Gbit/s")
    } else if bits >= 1e6 {
        (bits / 1e6, "Mbit/s")
    } else if bits >= 1e3 {
        (bits / 1e3, "kbit/s")
    } else {
        (bits, "bit/s")
    };
    let digits = if v >= 100.0 {
        0
    } else if v >= 10.0 {
        1
    } else {
        2
    };
    format!("{v:.digits$} {u}")
}

/// The human-readable status; `now` (Unix seconds) gives the uptime.
fn render(b: &LiveStatus, now: u64) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let st = &b.status;
    let up = now.saturating_sub(st.started_at);
    let _ = writeln!(o, "paceline {}, pid {}, up {}s", st.version, st.pid, up);
    let k = &st.kernel;
    let _ = writeln!(
        o,
        "kernel {}: tcx {}, sch_fq {}, sch_htb {}, clsact {}, btf {}, cgroup2 {}",
        k.kernel_release,
        yes(k.tcx),
        yes(k.sch_fq),
        yes(k.sch_htb),
        yes(k.clsact),
        yes(k.btf),
        or_dash(k.cgroup2.as_ref().map(|p| p.display()))
    );
    if !st.mounted.is_empty() {
        let _ = writeln!(
            o,
            "mounted by the agent (none was mounted in its mount namespace): {}",
            st.mounted
                .iter()
                .map(|m| m.describe())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let e = &st.enforcement;
    let _ = writeln!(o, "enforcement: {}", e.mode);
    let _ = writeln!(o, "  TCP flows:  {}", e.tcp_flows);
    let _ = writeln!(o, "  UDP flows:  {}", e.udp_flows);
    let _ = writeln!(o, "  aggregates: {}", e.aggregates);
    let _ = writeln!(
        o,
        "  TCP DSCP:   {}",
        if st.policy.tcp_dscp_by_socket {
            "set on the socket by sock_ops"
        } else {
            "rewritten by the classifier"
        }
    );
    for d in &st.degraded {
        let _ = writeln!(o, "degraded: {d}");
    }
    for i in &st.interfaces {
        let _ = writeln!(
            o,
            "interface {}: attach {}, root qdisc {}",
            i.name,
            i.attach.as_str(),
            or_dash(i.qdisc.as_ref())
        );
    }
    let p = &st.policy;
    let _ = writeln!(
        o,
        "policy {} ({}), hash {}, generation {}",
        or_dash(p.name.as_ref()),
        p.file,
        p.hash.chars().take(12).collect::<String>(),
        p.generation
    );
    if p.source.starts_with("rollback") {
        let _ = writeln!(
            o,
            "  in force by {} instead of the file (until the file changes, SIGHUP, `paceline reload` or a restart)",
            p.source
        );
    }
    let r = &st.reloads;
    let _ = write!(o, "reloads: {} applied, {} rejected", r.applied, r.rejected);
    if let Some(last) = r.last.as_ref().filter(|l| !l.applied) {
        let _ = write!(o, "; LAST RELOAD REJECTED (running policy kept):");
        for err in &last.errors {
            let _ = write!(o, "\n  {err}");
        }
    }
    let _ = writeln!(o);
    let counters = &b.counters;
    let _ = writeln!(
        o,
        "\n{:<16} {:>4} {:>14} {:>12} {:>14} {:>10} {:>12} {:>10} {:>10}",
        "LEVEL", "PRIO", "RATE", "PACKETS", "BYTES", "DELAYED", "HORIZON-DROP", "CODEL-DROP", "CE-MARKED"
    );
    for (l, c) in p.levels.iter().zip(&counters.levels) {
        let c = &c.counters;
        let _ = writeln!(
            o,
            "{:<16} {:>4} {:>14} {:>12} {:>14} {:>10} {:>12} {:>10} {:>10}",
            l.name,
            l.priority,
            rate_column(l.rate_bytes_per_second),
            c.packets,
            c.bytes,
            c.delayed_packets,
            c.dropped_horizon,
            c.dropped_codel,
            c.ecn_marked_codel
        );
    }
    let _ = writeln!(
        o,
        "\n{:<16} {:<12} {:>12} {:>14} {:>10} {:>12} {:>10} {:>10} {:>9} {:>9}",
        "CLASS",
        "LEVEL",
        "PACKETS",
        "BYTES",
        "DELAYED",
        "HORIZON-DROP",
        "CODEL-DROP",
        "CE-MARKED",
        "TAGGED",
        "TCP-SOCK"
    );
    for (cl, c) in p.classes.iter().zip(&counters.classes) {
        let c = &c.counters;
        let _ = writeln!(
            o,
            "{:<16} {:<12} {:>12} {:>14} {:>10} {:>12} {:>10} {:>10} {:>9} {:>9}",
            cl.name,
            cl.level,
            c.packets,
            c.bytes,
            c.delayed_packets,
            c.dropped_horizon,
            c.dropped_codel,
            c.ecn_marked_codel,
            c.tagged_packets,
            c.tcp_sockets_configured
        );
    }
    if let (Some(d), Some(c)) = (&st.dasr, &counters.dasr) {
        render_dasr(&mut o, d, c);
    }
    let codels = p
        .levels
        .iter()
        .map(|l| ("level", &l.name, &l.codel))
        .chain(p.classes.iter().map(|c| ("class", &c.name, &c.codel)));
    for (kind, name, codel) in codels {
        if let Some(k) = codel {
            let _ = writeln!(
                o,
                "codel on {kind} {name}: target {}, interval {}, {}",
                paceline_policy::units::fmt_ns((k.target_seconds * 1e9).round() as u64),
                paceline_policy::units::fmt_ns((k.interval_seconds * 1e9).round() as u64),
                if k.ecn {
                    "marks CE (drops what is not ECN-capable)"
                } else {
                    "drops"
                }
            );
        }
    }
    let u = &counters.unparsed;
    let _ = writeln!(
        o,
        "\nunparsed (passed untouched): non-IP {}, truncated {}, malformed {}, IPv6 extension limit {}",
        u.non_ip, u.truncated, u.malformed, u.ipv6_extension_limit
    );
    if let Some(m) = &b.kernel_memory {
        let _ = writeln!(o, "{}", kernel_memory_line(m));
    }
    for w in &p.warnings {
        let _ = writeln!(o, "policy warning: {w}");
    }
    o
}

/// One line: the total and its parts, in MiB.
fn kernel_memory_line(m: &crate::status::KernelMemory) -> String {
    let mib = |b: u64| b as f64 / 1_048_576.0;
    format!(
        "kernel memory (maps): {:.1} MiB: flow table {:.1}, classifier {:.1} (both banks), other {:.1}",
        mib(m.total_bytes),
        mib(m.flow_table_bytes),
        mib(m.classifier_bytes),
        mib(m.other_bytes)
    )
}

/// DASR: the roles, N per local address, the options and the shares set on senders.
fn render_dasr(o: &mut String, d: &crate::status::DasrStatus, r: &crate::dasr::DasrReport) {
    use std::fmt::Write as _;
    let _ = writeln!(
        o,
        "\nDASR: receiver {}, sender {}; sending = data in the last {}..{} us (at least {} x rtt {} us and two paced bursts)",
        if d.receiver { "on" } else { "off" },
        if d.sender { "on" } else { "off" },
        paceline_common::dasr::min_window_ns(d.rtt_ns, d.active_rtts) / 1000,
        2 * paceline_common::dasr::min_window_ns(d.rtt_ns, d.active_rtts) / 1000,
        d.active_rtts,
        d.rtt_ns / 1000
    );
    let c = &r.stats;
    if !r.addresses.is_empty() {
        let _ = writeln!(
            o,
            "{:<40} {:>7} {:>14} {:>14}",
            "ADDRESS", "SENDERS", "LINE", "SHARE"
        );
        for a in &r.addresses {
            let _ = writeln!(
                o,
                "{:<40} {:>7} {:>14} {:>14}",
                a.address,
                a.senders,
                rate_column(Some(a.line_rate_bytes_per_second)),
                rate_column(Some(a.share_bytes_per_second))
            );
        }
    }
    let _ = writeln!(
        o,
        "options: written {}, no room {} | read {}, malformed {}, no socket {}",
        c.options_written, c.options_no_room, c.options_read, c.options_malformed, c.options_no_socket
    );
    let shares: Vec<_> = paceline_common::dasr::shares_set::buckets(&c.rate_hist).collect();
    let _ = writeln!(
        o,
        "shares set on senders {} (pacing updates {}, stale resets {}, refused {}){}",
        c.rates_set,
        c.pacing_updates,
        c.stale_resets,
        c.sockopt_errors,
        if shares.is_empty() { "" } else { ":" }
    );
    for b in &shares {
        let _ = writeln!(
            o,
            "  {:>8} below {}",
            b.count,
            b.below_bytes_per_second
                .map_or("(no bound)".to_string(), |r| rate_column(Some(r)))
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_in_bits() {
        assert_eq!(rate_column(Some(625_000)), "5.00 Mbit/s");
        assert_eq!(rate_column(Some(1_250_000_000)), "10.0 Gbit/s");
        assert_eq!(rate_column(Some(90_000_000)), "720 Mbit/s");
        assert_eq!(rate_column(None), "unlimited");
    }

    #[test]
    fn renders_dasr_when_it_is_on() {
        let mut s: LiveStatus = serde_json::from_str(crate::status::tests::LIVE).expect("status");
        s.status.dasr = Some(crate::status::DasrStatus {
            receiver: true,
            sender: true,
            rtt_ns: 100_000,
            active_rtts: 2,
            interfaces: vec![],
        });
        let mut stats = paceline_common::dasr::DasrStats {
            options_written: 7,
            ..Default::default()
        };
        stats.rate_hist[4] = 2;
        let report = crate::dasr::DasrReport {
            addresses: vec![crate::dasr::AddrReport {
                address: "10.0.0.2".into(),
                senders: 2,
                line_rate_bytes_per_second: 125_000_000,
                share_bytes_per_second: 62_500_000,
            }],
            stats,
        };
        s.counters.dasr = Some(report);
        let text = render(&s, s.status.started_at);
        assert!(
            text.contains(
                "DASR: receiver on, sender on; sending = data in the last 2097..4194 us (at least 2 x rtt 100 us and two paced bursts)"
            ),
            "{text}"
        );
        assert!(
            text.contains("10.0.0.2                                       2    1.00 Gbit/s     500 Mbit/s"),
            "{text}"
        );
        assert!(
            text.contains("options: written 7, no room 0 | read 0, malformed 0, no socket 0"),
            "{text}"
        );
        assert!(text.contains("       2 below 16.8 Mbit/s"), "{text}");
    }

    #[test]
    fn renders_codel_settings_and_counters() {
        let mut s: LiveStatus = serde_json::from_str(crate::status::tests::LIVE).expect("status");
        s.status.policy.classes[0].codel = Some(crate::status::CodelStatus {
            target_seconds: 0.0005,
            interval_seconds: 0.01,
            ecn: true,
        });
        s.status.policy.levels[1].codel = Some(crate::status::CodelStatus {
            target_seconds: 0.005,
            interval_seconds: 0.1,
            ecn: false,
        });
        s.counters.classes[0].counters.dropped_codel = 7;
        s.counters.classes[0].counters.ecn_marked_codel = 11;
        s.counters.levels[0].counters.ecn_marked_codel = 11;
        let text = render(&s, s.status.started_at + 3);
        assert!(
            text.contains("latency             5    30.9 Mbit/s            3            222          0            0          0         11\n"),
            "{text}"
        );
        assert!(
            text.contains("rpc              latency                 3            222          0            0          7         11         3         0\n"),
            "{text}"
        );
        assert!(
            text.contains("codel on level bulk: target 5ms, interval 100ms, drops\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "codel on class rpc: target 500us, interval 10ms, marks CE (drops what is not ECN-capable)\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn says_what_the_agent_mounted() {
        let mut s: LiveStatus = serde_json::from_str(crate::status::tests::LIVE).expect("status");
        assert!(!render(&s, s.status.started_at).contains("mounted by the agent"));
        s.status.mounted = vec![
            crate::kernel::mounts::MountedFs {
                fstype: "bpf".into(),
                path: "/sys/fs/bpf".into(),
                adopted: false,
            },
            crate::kernel::mounts::MountedFs {
                fstype: "cgroup2".into(),
                path: "/run/paceline/cgroup2".into(),
                adopted: true,
            },
        ];
        let text = render(&s, s.status.started_at);
        assert!(
            text.contains(
                "mounted by the agent (none was mounted in its mount namespace): bpf at /sys/fs/bpf, \
                 cgroup2 at /run/paceline/cgroup2 (mounted by a previous agent)\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn renders_the_maps_kernel_memory_when_the_agent_reports_it() {
        let mut s: LiveStatus = serde_json::from_str(crate::status::tests::LIVE).expect("status");
        s.kernel_memory = Some(crate::kernel::memory::summarize([
            (1, "PL_FLOWS".to_string(), 9 << 20),
            (2, "PL_CTAB_FAST".to_string(), 16 << 20),
            (3, "pl_ctab_words".to_string(), 1 << 19),
            (4, "PL_CPU".to_string(), 3 << 19),
        ]));
        let text = render(&s, s.status.started_at);
        assert!(
            text.contains(
                "kernel memory (maps): 27.0 MiB: flow table 9.0, classifier 16.5 (both banks), other 1.5\n"
            ),
            "{text}"
        );
        // Through JSON as the CLI receives it; an agent without the field renders no line.
        let back: LiveStatus = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back.kernel_memory, s.kernel_memory);
        s.kernel_memory = None;
        assert!(!render(&s, 0).contains("kernel memory"));
    }

    #[test]
    fn renders_a_real_status() {
        let s: LiveStatus = serde_json::from_str(crate::status::tests::LIVE).expect("status");
        let text = render(&s, s.status.started_at + 3);
        // What the untyped renderer printed for this document (captured with it).
        let expected = r#"paceline 0.1.0, pid 8450, up 3s
kernel 6.18.44-fc-v669: tcx yes, sch_fq no, sch_htb yes, clsact yes, btf yes, cgroup2 /sys/fs/cgroup/unified
enforcement: htb
  TCP flows:  TCP's own pacing at the class's flow rate (sock_ops SO_MAX_PACING_RATE)
  UDP flows:  not enforced (needs sch_fq)
  aggregates: HTB classes (skb->priority = HTB class id)
  TCP DSCP:   rewritten by the classifier
degraded: no sch_fq: EDT timestamps are not enforced by this kernel; per-flow TCP rates are enforced by TCP's own pacing (sock_ops SO_MAX_PACING_RATE), class and level aggregates by HTB where available, UDP per-flow rates not at all
interface h1a: attach tcx, root qdisc htb
policy status-capture (/tmp/h1cap/policy.yaml), hash 1b30767275a5, generation 2
reloads: 1 applied, 1 rejected; LAST RELOAD REJECTED (running policy kept):
  /tmp/h1cap/policy.yaml:23: spec.default_class: no class named "nosuch"; classes: rpc, other

LEVEL            PRIO           RATE      PACKETS          BYTES    DELAYED HORIZON-DROP CODEL-DROP  CE-MARKED
latency             5    30.9 Mbit/s            3            222          0            0          0          0
bulk                0      unlimited            5            426          0            0          0          0

CLASS            LEVEL             PACKETS          BYTES    DELAYED HORIZON-DROP CODEL-DROP  CE-MARKED    TAGGED  TCP-SOCK
rpc              latency                 3            222          0            0          0          0         3         0
other            bulk                    5            426          0            0          0          0         5         0

unparsed (passed untouched): non-IP 1, truncated 0, malformed 0, IPv6 extension limit 0
policy warning: /tmp/h1cap/policy.yaml:16: spec.classes[0].class_rate: 200 Mbit/s is above the rate of level "latency" (30.9 Mbit/s); the level's rate binds
"#;
        assert_eq!(text, expected);
    }
}
