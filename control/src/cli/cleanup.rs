//! `paceline cleanup`: removes what an agent that did not exit cleanly left: its pinned
//! datapath (links and maps, so its programs detach), its clsact filters, the qdiscs it
//! installed, its state.

use std::path::PathBuf;

use anyhow::Result;

use crate::state::{self, StateDir};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The state directory of the agent that was killed.
    #[arg(long, default_value = state::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Where that agent pinned its maps and links.
    #[arg(long, default_value = crate::persist::DEFAULT_BPFFS_DIR)]
    pub bpffs_dir: PathBuf,
}

pub fn run(a: Args) -> Result<i32> {
    let dir = StateDir::lock(&a.state_dir)?;
    // The pins first: removing the links detaches the programs.
    for line in crate::persist::Pins::new(&a.bpffs_dir).remove_all() {
        println!("{line}");
    }
    match dir.leftover()? {
        None => println!("no state left in {}", a.state_dir.display()),
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
