//! `paceline events [--follow]`

use std::time::Duration;

use anyhow::Result;

use crate::runtime::events::{self, Event};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Keep printing new events as they come (polls every second; Ctrl-C to stop).
    #[arg(long, short)]
    pub follow: bool,
    /// Only the last N events (of those the agent keeps).
    #[arg(long, short = 'n')]
    pub last: Option<usize>,
    /// Only events of these kinds (comma-separated: reload_applied,reload_rejected,...).
    #[arg(long, value_delimiter = ',')]
    pub kind: Vec<String>,
    /// Print JSON lines, as the agent serves them.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub api: super::ApiAddr,
}

pub fn run(a: Args) -> Result<i32> {
    let mut since = 0u64;
    let mut first = true;
    loop {
        let mut path = format!("/events?since={since}");
        if first && let Some(n) = a.last {
            path.push_str(&format!("&limit={n}"));
        }
        let body = match a.api.get(&path) {
            Ok((200, b)) => b,
            Ok((code, b)) => {
                eprintln!("paceline: the agent answered HTTP {code}: {}", b.trim());
                return Ok(2);
            }
            // While following, an agent restarting is waited for.
            Err(_) if a.follow && !first => {
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
            Err(u) => return Ok(super::unreachable(u)),
        };
        for line in body.lines() {
            let Ok(e) = serde_json::from_str::<Event>(line) else {
                continue;
            };
            since = since.max(e.seq);
            if !a.kind.is_empty() && !a.kind.contains(&e.kind) {
                continue;
            }
            if a.json {
                println!("{line}");
            } else {
                println!("{}", events::render(&e));
            }
        }
        if !a.follow {
            return Ok(0);
        }
        first = false;
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        std::thread::sleep(Duration::from_secs(1));
    }
}
