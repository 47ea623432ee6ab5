//! `paceline status`

use std::net::SocketAddr;

use anyhow::{Context as _, Result};
use serde_json::Value;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The agent's --metrics-addr.
    #[arg(long, default_value = "127.0.0.1:9977")]
    pub addr: SocketAddr,
    /// Print the raw JSON document.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<i32> {
    let url = format!("http://{}/status", a.addr);
    let body: Value = ureq::get(&url)
        .call()
        .with_context(|| {
            format!("asking the agent at {url} (is `paceline agent` running with that --metrics-addr?)")
        })?
        .body_mut()
        .read_json()
        .context("parsing the agent's status")?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&body)?);
    } else {
        print!("{}", render(&body));
    }
    Ok(0)
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        v => v.to_string(),
    }
}

fn yes(v: &Value) -> &'static str {
    if v.as_bool().unwrap_or(false) { "yes" } else { "no" }
}

/// Human units: bytes/s as bits/s.
pub fn rate(bytes_per_sec: Option<u64>) -> String {
    match bytes_per_sec {
        None => "unlimited".into(),
        Some(b) => {
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
            format!("{} {u}", sig3(v))
        }
    }
}

/// Three significant digits.
pub fn sig3(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn render(b: &Value) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let now = crate::status::unix_now();
    let up = now.saturating_sub(b["started_at"].as_u64().unwrap_or(now));
    let _ = writeln!(
        o,
        "paceline {}, pid {}, up {}s",
        s(&b["version"]),
        s(&b["pid"]),
        up
    );
    let k = &b["kernel"];
    let _ = writeln!(
        o,
        "kernel {}: tcx {}, sch_fq {}, sch_htb {}, clsact {}, btf {}, cgroup2 {}",
        s(&k["kernel_release"]),
        yes(&k["tcx"]),
        yes(&k["sch_fq"]),
        yes(&k["sch_htb"]),
        yes(&k["clsact"]),
        yes(&k["btf"]),
        s(&k["cgroup2"])
    );
    let e = &b["enforcement"];
    let _ = writeln!(o, "enforcement: {}", s(&e["mode"]));
    let _ = writeln!(o, "  TCP flows:  {}", s(&e["tcp_flows"]));
    let _ = writeln!(o, "  UDP flows:  {}", s(&e["udp_flows"]));
    let _ = writeln!(o, "  aggregates: {}", s(&e["aggregates"]));
    let _ = writeln!(
        o,
        "  TCP DSCP:   {}",
        if b["policy"]["tcp_dscp_by_socket"] == Value::Bool(true) {
            "set on the socket by sock_ops"
        } else {
            "rewritten by the classifier"
        }
    );
    for d in b["degraded"].as_array().into_iter().flatten() {
        let _ = writeln!(o, "degraded: {}", s(d));
    }
    for i in b["interfaces"].as_array().into_iter().flatten() {
        let _ = writeln!(
            o,
            "interface {}: attach {}, root qdisc {}",
            s(&i["name"]),
            s(&i["attach"]),
            s(&i["qdisc"])
        );
    }
    let p = &b["policy"];
    let _ = writeln!(
        o,
        "policy {} ({}), hash {}, generation {}",
        s(&p["name"]),
        s(&p["file"]),
        s(&p["hash"]).chars().take(12).collect::<String>(),
        s(&p["generation"])
    );
    let r = &b["reloads"];
    let _ = write!(
        o,
        "reloads: {} applied, {} rejected",
        s(&r["applied"]),
        s(&r["rejected"])
    );
    if r["last"]["applied"] == Value::Bool(false) {
        let _ = write!(o, "; LAST RELOAD REJECTED (running policy kept):");
        for err in r["last"]["errors"].as_array().into_iter().flatten() {
            let _ = write!(o, "\n  {}", s(err));
        }
    }
    let _ = writeln!(o);
    let counters = &b["counters"];
    let _ = writeln!(
        o,
        "\n{:<16} {:>4} {:>14} {:>12} {:>14} {:>10} {:>10}",
        "LEVEL", "PRIO", "RATE", "PACKETS", "BYTES", "DELAYED", "DROPPED"
    );
    for (l, c) in p["levels"]
        .as_array()
        .into_iter()
        .flatten()
        .zip(counters["levels"].as_array().into_iter().flatten())
    {
        let _ = writeln!(
            o,
            "{:<16} {:>4} {:>14} {:>12} {:>14} {:>10} {:>10}",
            s(&l["name"]),
            s(&l["priority"]),
            rate(l["rate_bytes_per_second"].as_u64()),
            s(&c["packets"]),
            s(&c["bytes"]),
            s(&c["delayed_packets"]),
            s(&c["dropped_horizon"])
        );
    }
    let _ = writeln!(
        o,
        "\n{:<16} {:<12} {:>12} {:>14} {:>10} {:>10} {:>9} {:>9}",
        "CLASS", "LEVEL", "PACKETS", "BYTES", "DELAYED", "DROPPED", "TAGGED", "TCP-SOCK"
    );
    for (cl, c) in p["classes"]
        .as_array()
        .into_iter()
        .flatten()
        .zip(counters["classes"].as_array().into_iter().flatten())
    {
        let _ = writeln!(
            o,
            "{:<16} {:<12} {:>12} {:>14} {:>10} {:>10} {:>9} {:>9}",
            s(&cl["name"]),
            s(&cl["level"]),
            s(&c["packets"]),
            s(&c["bytes"]),
            s(&c["delayed_packets"]),
            s(&c["dropped_horizon"]),
            s(&c["tagged_packets"]),
            s(&c["tcp_sockets_configured"])
        );
    }
    let u = &counters["unparsed"];
    let _ = writeln!(
        o,
        "\nunparsed (passed untouched): non-IP {}, truncated {}, IPv6 extension limit {}",
        s(&u["non_ip"]),
        s(&u["truncated"]),
        s(&u["ipv6_extension_limit"])
    );
    for w in p["warnings"].as_array().into_iter().flatten() {
        let _ = writeln!(o, "policy warning: {}", s(w));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_in_bits() {
        assert_eq!(rate(Some(625_000)), "5.00 Mbit/s");
        assert_eq!(rate(Some(1_250_000_000)), "10.0 Gbit/s");
        assert_eq!(rate(Some(90_000_000)), "720 Mbit/s");
        assert_eq!(rate(None), "unlimited");
    }
}
