//! What the agent changed on the host, written down before it changes it, so that a start
//! after `kill -9` (or a crash) can undo it: **the next start cleans up and then starts fresh**
//! (`paceline cleanup` does the same by hand). tcx and cgroup links vanish with the process; a
//! clsact filter, a clsact qdisc paceline added, and a root qdisc it installed do not.
//!
//! A lock file keeps a second agent from starting while one runs.

use std::{
    fs::File,
    io::Write as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use serde::{Deserialize, Serialize};

use crate::kernel::{attach, qdisc};

pub const DEFAULT_STATE_DIR: &str = "/run/paceline";

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct IfaceState {
    pub name: String,
    /// A clsact filter may exist at [`attach::NL_PRIORITY`].
    #[serde(default)]
    pub clsact_filter: bool,
    /// A clsact filter of the D3 router may exist (its own priority).
    #[serde(default)]
    pub router_filter: bool,
    /// A clsact ingress filter of DASR may exist.
    #[serde(default)]
    pub ingress_filter: bool,
    /// paceline added the clsact qdisc.
    #[serde(default)]
    pub clsact_added: bool,
    /// The root qdisc paceline installed.
    #[serde(default)]
    pub qdisc: Option<qdisc::Installed>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct State {
    pub pid: u32,
    pub interfaces: Vec<IfaceState>,
    /// Files paceline pinned in a BPF filesystem.
    #[serde(default)]
    pub pins: Vec<PathBuf>,
}

impl State {
    pub fn iface(&mut self, name: &str) -> &mut IfaceState {
        if let Some(i) = self.interfaces.iter().position(|i| i.name == name) {
            return &mut self.interfaces[i];
        }
        self.interfaces.push(IfaceState {
            name: name.into(),
            ..Default::default()
        });
        self.interfaces.last_mut().expect("just pushed")
    }
}

/// The state directory, held by a running agent.
pub struct StateDir {
    dir: PathBuf,
    /// Held for the agent's lifetime: dropping a `Flock` releases the lock.
    _lock: nix::fcntl::Flock<File>,
}

impl StateDir {
    /// Takes the lock; fails if another agent holds it.
    pub fn lock(dir: &Path) -> Result<StateDir> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("lock");
        let f = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let lock = match nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(l) => l,
            Err((_, e)) => bail!(
                "another paceline agent holds {} ({e}); stop it first, or point --state-dir elsewhere",
                path.display()
            ),
        };
        Ok(StateDir {
            dir: dir.to_path_buf(),
            _lock: lock,
        })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn state_file(&self) -> PathBuf {
        self.dir.join("state.json")
    }

    /// State a previous agent left (it did not exit cleanly), if any.
    pub fn leftover(&self) -> Result<Option<State>> {
        match std::fs::read(self.state_file()) {
            Ok(b) => Ok(Some(
                serde_json::from_slice(&b).context("parsing the previous state file")?,
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes `state` atomically (temp file + rename).
    pub fn save(&self, state: &State) -> Result<()> {
        write_atomic(&self.state_file(), &serde_json::to_vec_pretty(state)?)
    }

    /// Removes the state file after a clean exit.
    pub fn clear(&self) -> Result<()> {
        match std::fs::remove_file(self.state_file()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }

    /// Writes a file in the state directory (the status document).
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<()> {
        write_atomic(&self.dir.join(name), bytes)
    }

    /// Writes `v` as JSON to a file in the state directory.
    pub fn write_json<T: Serialize>(&self, name: &str, v: &T) -> Result<()> {
        self.write(name, &serde_json::to_vec_pretty(v)?)
    }

    /// Reads a JSON file of the state directory; `None` when absent or unreadable.
    pub fn read_json<T: serde::de::DeserializeOwned>(&self, name: &str) -> Option<T> {
        let bytes = std::fs::read(self.dir.join(name)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// Undoes what `state` records. Returns one line per action, for the log.
pub fn clean_up(state: &State) -> Vec<String> {
    let mut done = Vec::new();
    for i in &state.interfaces {
        let exists = nix::net::if_::if_nametoindex(i.name.as_str()).is_ok();
        if !exists {
            done.push(format!("{}: interface gone, nothing to undo", i.name));
            continue;
        }
        for (on, which, what) in [
            (i.clsact_filter, attach::TcProgram::Egress, "clsact egress filter"),
            (i.router_filter, attach::TcProgram::D3Router, "D3 router filter"),
            (
                i.ingress_filter,
                attach::TcProgram::DasrIngress,
                "clsact ingress filter",
            ),
        ] {
            if on {
                match attach::remove_stale_filter(&i.name, which) {
                    Ok(()) => done.push(format!("{}: removed paceline's {what}", i.name)),
                    Err(e) => done.push(format!("{}: no {what} to remove ({e})", i.name)),
                }
            }
        }
        if i.clsact_added {
            match qdisc::remove_clsact(&i.name) {
                Ok(()) => done.push(format!("{}: removed the clsact qdisc paceline added", i.name)),
                Err(e) => done.push(format!("{}: clsact already gone ({e})", i.name)),
            }
        }
        if let Some(q) = &i.qdisc {
            match qdisc::remove_root(&i.name, q) {
                Ok(true) => done.push(format!(
                    "{}: removed root {} (kernel default restored)",
                    i.name,
                    q.describe()
                )),
                Ok(false) => done.push(format!(
                    "{}: root qdisc is no longer paceline's; left alone",
                    i.name
                )),
                Err(e) => done.push(format!("{}: removing root qdisc failed: {e}", i.name)),
            }
        }
    }
    for p in &state.pins {
        match std::fs::remove_file(p) {
            Ok(()) => done.push(format!("unpinned {}", p.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => done.push(format!("unpinning {} failed: {e}", p.display())),
        }
        // The pin directory paceline created goes too, once empty.
        if let Some(dir) = p.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
    done
}
