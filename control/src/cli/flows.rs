//! `paceline flows [--top N] [--class C]`

use anyhow::Result;

use crate::flows::{self, Flows};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Show at most N flows (those whose next departure is furthest ahead first).
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    /// Only the flows of this class.
    #[arg(long)]
    pub class: Option<String>,
    /// Print the JSON document.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub api: super::ApiAddr,
}

pub fn run(a: Args) -> Result<i32> {
    let mut path = format!("/flows?top={}", a.top);
    if let Some(c) = &a.class {
        path.push_str(&format!("&class={}", super::classify::enc(c)));
    }
    let (code, body) = match a.api.get(&path) {
        Ok(r) => r,
        Err(u) => return Ok(super::unreachable(u)),
    };
    if code != 200 {
        eprintln!("paceline: the agent answered HTTP {code}: {}", body.trim());
        return Ok(2);
    }
    if a.json {
        println!("{}", body.trim());
        return Ok(0);
    }
    let f: Flows = serde_json::from_str(&body)?;
    print!("{}", flows::render(&f));
    Ok(0)
}
