//! `paceline trace [--count N] [--seconds S] [--class C] [--flow PROTO SRC DST] [--drops]
//! [--sample N] [--per-sec N] [--json] [--pcap FILE]`: the running agent's per-packet
//! verdicts (see `crate::runtime::trace`).

use anyhow::{Context as _, Result};

use crate::trace::{Msg, PcapWriter};

// The help text shows addresses as [V6ADDR]:PORT, which rustdoc would take for links.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Stop after N packets.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after S seconds.
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Only the packets of this class.
    #[arg(long)]
    pub class: Option<String>,
    /// Only this flow as it leaves: protocol (tcp, udp, icmp or a number), source and
    /// destination (ADDR:PORT, [ADDR6]:PORT, or an address for protocols without ports).
    #[arg(long, num_args = 3, value_names = ["PROTO", "SRC", "DST"])]
    pub flow: Option<Vec<String>>,
    /// Only packets dropped (by the horizon or CoDel) or CE-marked.
    #[arg(long)]
    pub drops: bool,
    /// Record one packet in N of those that pass the filters.
    #[arg(long, default_value_t = 1)]
    pub sample: u32,
    /// At most this many records a second on each CPU (the trace's cost bound; 1..=100000).
    #[arg(long, default_value_t = crate::runtime::trace::DEFAULT_PER_SEC)]
    pub per_sec: u32,
    /// One JSON object a line per packet (the agent's record, named).
    #[arg(long)]
    pub json: bool,
    /// Also write the packets (their first 128 bytes) to FILE as pcapng, each with its verdict
    /// as the packet comment (Wireshark: pkt_comment; tshark -T fields -e frame.comment).
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub api: super::ApiAddr,
}

fn query(a: &Args) -> String {
    use super::classify::enc;
    let mut q = vec![format!("sample={}", a.sample), format!("per_sec={}", a.per_sec)];
    if let Some(n) = a.count {
        q.push(format!("count={n}"));
    }
    if let Some(s) = a.seconds {
        q.push(format!("seconds={s}"));
    }
    if let Some(c) = &a.class {
        q.push(format!("class={}", enc(c)));
    }
    if let Some(f) = &a.flow
        && let [p, s, d] = f.as_slice()
    {
        q.push(format!("proto={}&src={}&dst={}", enc(p), enc(s), enc(d)));
    }
    if a.drops {
        q.push("drops=1".into());
    }
    format!("/trace?{}", q.join("&"))
}

pub fn run(a: Args) -> Result<i32> {
    let mut pcap = match &a.pcap {
        Some(p) => {
            let f = std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
            Some(PcapWriter::new(std::io::BufWriter::new(f))?)
        }
        None => None,
    };
    let mut failed: Option<anyhow::Error> = None;
    let mut end = None;
    let res = a.api.get_lines(&query(&a), |l| {
        let m: Msg = match serde_json::from_str(l) {
            Ok(m) => m,
            Err(e) => {
                failed = Some(anyhow::anyhow!(
                    "the agent sent a line this command cannot read ({e}): {l}"
                ));
                return false;
            }
        };
        match m {
            Msg::Start(s) => {
                if !a.json {
                    eprintln!(
                        "paceline: tracing {} (at most {} a second on each CPU); Ctrl-C stops",
                        s.filter, s.per_sec
                    );
                }
            }
            Msg::Record(r) => {
                if a.json {
                    println!("{}", serde_json::to_string(&r).unwrap_or_default());
                } else {
                    println!("{}", r.text());
                }
                if let Some(w) = pcap.as_mut()
                    && let Err(e) = w.write(&r)
                {
                    failed = Some(e);
                    return false;
                }
            }
            Msg::Heartbeat(_) => {}
            Msg::End(e) => {
                end = Some(e);
                return false;
            }
        }
        true
    });
    if let Some(w) = pcap {
        use std::io::Write as _;
        w.into_inner().flush().context("writing the pcapng file")?;
    }
    match res {
        Err(u) => return Ok(super::unreachable(u)),
        Ok((200, _)) => {}
        Ok((409, body)) => {
            eprintln!("paceline: {}", body.trim());
            return Ok(1);
        }
        Ok((code, body)) => {
            eprintln!("paceline: the agent answered HTTP {code}: {}", body.trim());
            return Ok(2);
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    match end {
        Some(e) => {
            eprintln!(
                "paceline: trace ended ({}): {} packets, {} left out by the per-second cap, {} lost",
                e.reason, e.totals.records, e.totals.capped, e.totals.lost
            );
            Ok(0)
        }
        None => {
            eprintln!("paceline: the agent ended the trace without saying why");
            Ok(1)
        }
    }
}
