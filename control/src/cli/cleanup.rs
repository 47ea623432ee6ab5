//! `paceline cleanup`

use std::path::PathBuf;

use anyhow::Result;

use crate::state::{self, StateDir};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The state directory of the agent that was killed.
    #[arg(long, default_value = state::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
}

pub fn run(a: Args) -> Result<i32> {
    let dir = StateDir::lock(&a.state_dir)?;
    match dir.leftover()? {
        None => println!("nothing to clean up: no state left in {}", a.state_dir.display()),
        Some(st) => {
            for line in state::clean_up(&st) {
                println!("{line}");
            }
            dir.clear()?;
            let _ = std::fs::remove_file(a.state_dir.join("status.json"));
        }
    }
    Ok(0)
}
