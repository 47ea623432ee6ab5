//! `paceline classify PROTO SRC[:PORT] DST[:PORT]`

use std::path::PathBuf;

use anyhow::Result;

use crate::classify::{self, Answer, Query};
use crate::host::SystemHost;
use paceline_policy::{
    self as policy, CompileContext, EnforcementMode, HostFacts, OfflineHost, host::all_routes_managed,
};

// The help text shows addresses as [V6ADDR]:PORT, which rustdoc would take for links.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  paceline classify tcp 10.0.0.1:40000 10.1.2.3:11211\n  paceline classify udp '[fd00::1]:5000' '[fd00::2]:53' --policy policies/default.yaml"
)]
pub struct Args {
    /// tcp, udp, icmp, icmpv6, sctp, udplite, or a protocol number.
    pub proto: String,
    /// The source: ADDR or ADDR:PORT ([V6ADDR]:PORT).
    pub src: String,
    /// The destination: ADDR or ADDR:PORT ([V6ADDR]:PORT).
    pub dst: String,
    /// The packet's DSCP (rules may match on it; default 0).
    #[arg(long)]
    pub dscp: Option<u8>,
    /// The socket mark (default 0).
    #[arg(long)]
    pub mark: Option<u32>,
    /// The sending socket's cgroup v2 id (the inode of its directory; default 0).
    #[arg(long)]
    pub cgroup_id: Option<u64>,
    /// Answer from this policy file instead of the running agent.
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// With --policy: do not consult this host (interfaces, routes, cgroups).
    #[arg(long, requires = "policy")]
    pub offline: bool,
    /// Print the answer as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub api: super::ApiAddr,
}

pub fn run(a: Args) -> Result<i32> {
    let q = Query {
        proto: a.proto.clone(),
        src: a.src.clone(),
        dst: a.dst.clone(),
        dscp: a.dscp,
        mark: a.mark,
        cgroup_id: a.cgroup_id,
    };
    if let Err(e) = q.packet() {
        eprintln!("paceline: {e:#}");
        return Ok(2);
    }
    let answer: Answer = match &a.policy {
        Some(file) => {
            let system = SystemHost::new();
            let host: &dyn HostFacts = if a.offline { &OfflineHost } else { &system };
            let v = match policy::load(file, host) {
                Ok(v) => v,
                Err(errors) => {
                    for e in &errors {
                        eprintln!("{e}");
                    }
                    return Ok(2);
                }
            };
            let mode = v.enforcement().fixed().unwrap_or(EnforcementMode::Fq);
            let c = match policy::compile(
                &v,
                &CompileContext {
                    mode,
                    previous: None,
                    all_routes_managed: all_routes_managed(host, &v.interfaces),
                },
            ) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{e}");
                    return Ok(2);
                }
            };
            classify::explain(&c, &q)?
        }
        None => {
            let mut path = format!(
                "/classify?proto={}&src={}&dst={}",
                enc(&q.proto),
                enc(&q.src),
                enc(&q.dst)
            );
            for (k, v) in [
                ("dscp", q.dscp.map(|v| v.to_string())),
                ("mark", q.mark.map(|v| v.to_string())),
                ("cgroup_id", q.cgroup_id.map(|v| v.to_string())),
            ] {
                if let Some(v) = v {
                    path.push_str(&format!("&{k}={v}"));
                }
            }
            match a.api.get(&path) {
                Ok((200, body)) => serde_json::from_str(&body)?,
                Ok((code, body)) => {
                    eprintln!("paceline: the agent answered HTTP {code}: {}", body.trim());
                    return Ok(2);
                }
                Err(u) => return Ok(super::unreachable(u)),
            }
        }
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
    } else {
        print!("{}", classify::render(&q, &answer));
    }
    Ok(0)
}

/// Percent-encodes a query value (addresses hold `:`, `[`, `]`).
pub fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'-' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
