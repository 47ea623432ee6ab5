//! Policy history: the policies the agent applied (text, hash, time, source), kept in the
//! state directory (`history/`), the last [`KEEP`] of them, across restarts. `paceline policy
//! history` lists them; `paceline policy rollback [GENERATION]` applies one again.
//!
//! History generations count every policy applied on this state directory (1, 2, 3, ... across
//! restarts), unlike `/status`'s `policy.generation`, which counts the writes of one agent
//! process. A start with the policy already at the top of the history adds no entry.
//!
//! **A rollback and the file on disk.** A rollback applies the old text *instead of* the file
//! and says so (`policy.source` in `/status`, the `rollback` event, `paceline policy diff FILE
//! --running` shows the difference). It stays in force until the file changes (its bytes
//! differ from what the agent last read), a `SIGHUP` or `systemctl reload`, or a restart: each
//! of these applies the file again. The agent never writes the policy file (it belongs to
//! configuration management or a ConfigMap): to make a rollback permanent, revert the file.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, anyhow};
use serde::{Deserialize, Serialize};

/// Entries kept.
pub const KEEP: usize = 20;
const DIR: &str = "history";
const INDEX: &str = "index.json";

/// One applied policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub generation: u64,
    pub hash: String,
    pub name: Option<String>,
    /// Unix seconds.
    pub applied_at: u64,
    /// What applied it: `start`, `file change`, `SIGHUP`, `reload request`,
    /// `rollback to generation N`, `route change`.
    pub source: String,
    /// The policy file it was read from.
    pub file: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Index {
    next: u64,
    entries: Vec<Entry>,
}

/// The history of a state directory.
pub struct History {
    dir: PathBuf,
}

impl History {
    pub fn new(state_dir: &Path) -> History {
        History {
            dir: state_dir.join(DIR),
        }
    }

    fn index(&self) -> Index {
        std::fs::read(self.dir.join(INDEX))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Index {
                next: 1,
                entries: Vec::new(),
            })
    }

    fn text_path(&self, generation: u64) -> PathBuf {
        self.dir.join(format!("{generation:08}.yaml"))
    }

    /// Records a policy just applied; returns its generation (the top entry's when it is the
    /// same text, e.g. a restart with an unchanged file).
    pub fn record(
        &self,
        text: &str,
        hash: &str,
        name: Option<&str>,
        source: &str,
        file: &str,
    ) -> Result<u64> {
        std::fs::create_dir_all(&self.dir).with_context(|| format!("creating {}", self.dir.display()))?;
        let mut idx = self.index();
        if let Some(top) = idx.entries.last()
            && top.hash == hash
            && !source.starts_with("rollback")
        {
            return Ok(top.generation);
        }
        let generation = idx.next.max(1);
        crate::runtime::state::write_atomic(&self.text_path(generation), text.as_bytes())?;
        idx.next = generation + 1;
        idx.entries.push(Entry {
            generation,
            hash: hash.to_string(),
            name: name.map(String::from),
            applied_at: crate::status::unix_now(),
            source: source.to_string(),
            file: file.to_string(),
        });
        while idx.entries.len() > KEEP {
            let old = idx.entries.remove(0);
            let _ = std::fs::remove_file(self.text_path(old.generation));
        }
        crate::runtime::state::write_atomic(&self.dir.join(INDEX), &serde_json::to_vec_pretty(&idx)?)?;
        Ok(generation)
    }

    /// The entries, oldest first.
    pub fn entries(&self) -> Vec<Entry> {
        self.index().entries
    }

    /// An entry and its text.
    pub fn get(&self, generation: u64) -> Result<(Entry, String)> {
        let idx = self.index();
        let e = idx
            .entries
            .iter()
            .find(|e| e.generation == generation)
            .cloned()
            .ok_or_else(|| {
                anyhow!(
                    "no generation {generation} in the history (kept: {})",
                    idx.entries
                        .iter()
                        .map(|e| e.generation.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?;
        let text = std::fs::read_to_string(self.text_path(generation))
            .with_context(|| format!("reading generation {generation}'s text"))?;
        Ok((e, text))
    }

    /// The generation a plain `rollback` goes to: the newest entry whose policy differs from
    /// the one in force (`current_hash`).
    pub fn previous(&self, current_hash: &str) -> Result<u64> {
        self.index()
            .entries
            .iter()
            .rev()
            .find(|e| e.hash != current_hash)
            .map(|e| e.generation)
            .ok_or_else(|| anyhow!("the history holds no policy other than the one in force"))
    }
}

/// The history as `paceline policy history` prints it (`current`: the hash in force).
pub fn render(entries: &[Entry], current: &str) -> String {
    let mut o = format!(
        "{:>4}  {:<20}  {:<12}  {:<16}  {}\n",
        "GEN", "APPLIED (UTC)", "HASH", "NAME", "SOURCE"
    );
    for e in entries.iter().rev() {
        let (d, t) = crate::runtime::events::utc(e.applied_at as i64);
        o.push_str(&format!(
            "{:>4}  {:<20}  {:<12}  {:<16}  {}{}\n",
            e.generation,
            format!("{d} {t}"),
            e.hash.chars().take(12).collect::<String>(),
            e.name.as_deref().unwrap_or("-"),
            e.source,
            if e.hash == current { "  (in force)" } else { "" }
        ));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_dedups_bounds_and_finds_the_previous() {
        let dir = std::env::temp_dir().join(format!("pl-history-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let h = History::new(&dir);
        assert_eq!(h.record("a", "ha", Some("p"), "start", "/p.yaml").unwrap(), 1);
        assert_eq!(
            h.record("a", "ha", Some("p"), "start", "/p.yaml").unwrap(),
            1,
            "same text: same entry"
        );
        assert_eq!(h.record("b", "hb", None, "file change", "/p.yaml").unwrap(), 2);
        assert_eq!(h.previous("hb").unwrap(), 1);
        assert_eq!(h.get(1).unwrap().1, "a");
        // A rollback is an entry of its own, even to the text just before.
        assert_eq!(
            h.record("a", "ha", None, "rollback to generation 1", "/p.yaml")
                .unwrap(),
            3
        );
        assert_eq!(h.previous("ha").unwrap(), 2);
        for i in 0..(KEEP + 5) {
            h.record(&format!("t{i}"), &format!("h{i}"), None, "file change", "/p.yaml")
                .unwrap();
        }
        let e = h.entries();
        assert_eq!(e.len(), KEEP);
        assert!(h.get(1).is_err(), "the oldest are dropped");
        let files = std::fs::read_dir(dir.join(DIR)).unwrap().count();
        assert_eq!(files, KEEP + 1, "texts of dropped entries are removed");
        assert!(render(&e, "h24").contains("(in force)"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
