//! The agent's structured event log: starts and stops, reloads (with a summary of what changed,
//! or the errors), degraded enforcement, interface and route changes, bursts of drops, D3
//! quenches, rollbacks.
//!
//! Each event is one JSON object ([`Event`]) with a sequence number that keeps growing across
//! restarts. It is logged (the journal or the container log gets the same line, prefixed
//! `event <kind>:`), kept in memory (the last [`MEMORY`]) and appended to `events.jsonl` in the
//! state directory, which is trimmed to the last [`ON_DISK`] events, so the log survives a
//! crash or a restart and stays bounded. `/events?since=N` serves the events after `N` as JSON
//! lines; `paceline events [--follow]` reads them.

use std::{
    collections::VecDeque,
    io::Write as _,
    path::{Path, PathBuf},
    sync::Mutex,
};

use serde::{Deserialize, Serialize};

/// Events kept in memory.
pub const MEMORY: usize = 1000;
/// Events kept in `events.jsonl` (the file is rewritten with the last `ON_DISK` once it holds
/// twice as many).
pub const ON_DISK: usize = 1000;
const FILE: &str = "events.jsonl";

/// How much an event matters (also the log level it is written at).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Error,
}

/// One event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Grows by one per event, across restarts of the agent on the same state directory.
    pub seq: u64,
    /// Unix time, seconds (with milliseconds).
    pub at: f64,
    /// What happened: `start`, `restart`, `stop`, `reload_applied`, `reload_rejected`,
    /// `rollback`, `degraded`, `interface_attached`, `interface_detached`, `route_change`,
    /// `drops`, `d3_quench`.
    pub kind: String,
    pub severity: Severity,
    /// One line for people.
    pub message: String,
    /// Details for machines (the errors of a rejection, the changes of a reload, ...).
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub data: serde_json::Value,
}

/// The event log (cheap to share: one lock, never held while logging elsewhere).
pub struct Events {
    inner: Mutex<Inner>,
}

struct Inner {
    ring: VecDeque<Event>,
    next: u64,
    file: Option<PathBuf>,
    lines_on_disk: usize,
}

impl Events {
    /// A log kept in memory only (tests, tools).
    pub fn in_memory() -> Events {
        Events {
            inner: Mutex::new(Inner {
                ring: VecDeque::new(),
                next: 1,
                file: None,
                lines_on_disk: 0,
            }),
        }
    }

    /// The log of the state directory `dir`: what a previous agent wrote there is read back
    /// (so `/events` shows the history before this start, and the numbering goes on).
    pub fn open(dir: &Path) -> Events {
        let file = dir.join(FILE);
        let old = read_file(&file);
        let next = old.last().map(|e| e.seq + 1).unwrap_or(1);
        let lines_on_disk = old.len();
        let ring: VecDeque<Event> = old.into_iter().rev().take(MEMORY).rev().collect();
        Events {
            inner: Mutex::new(Inner {
                ring,
                next,
                file: Some(file),
                lines_on_disk,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records an event: logs it, keeps it, appends it to the file. Returns it.
    pub fn emit(
        &self,
        kind: &str,
        severity: Severity,
        message: impl Into<String>,
        data: serde_json::Value,
    ) -> Event {
        let message = message.into();
        let mut g = self.lock();
        let ev = Event {
            seq: g.next,
            at: now(),
            kind: kind.to_string(),
            severity,
            message,
            data,
        };
        g.next += 1;
        let line = serde_json::to_string(&ev).unwrap_or_default();
        match severity {
            Severity::Info => log::info!("event {kind}: {}", ev.message),
            Severity::Warning => log::warn!("event {kind}: {}", ev.message),
            Severity::Error => log::error!("event {kind}: {}", ev.message),
        }
        g.ring.push_back(ev.clone());
        while g.ring.len() > MEMORY {
            g.ring.pop_front();
        }
        if let Some(file) = g.file.clone() {
            if g.lines_on_disk >= 2 * ON_DISK {
                // Rewrite with the newest ON_DISK events (the ring holds at least that many).
                let keep: Vec<String> = g
                    .ring
                    .iter()
                    .rev()
                    .take(ON_DISK)
                    .rev()
                    .map(|e| serde_json::to_string(e).unwrap_or_default() + "\n")
                    .collect();
                match crate::runtime::state::write_atomic(&file, keep.concat().as_bytes()) {
                    Ok(()) => g.lines_on_disk = keep.len(),
                    Err(e) => log::warn!("rewriting {}: {e:#}", file.display()),
                }
            } else {
                let r = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&file)
                    .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
                match r {
                    Ok(()) => g.lines_on_disk += 1,
                    Err(e) => log::warn!("appending to {}: {e}", file.display()),
                }
            }
        }
        ev
    }

    pub fn info(&self, kind: &str, message: impl Into<String>, data: serde_json::Value) -> Event {
        self.emit(kind, Severity::Info, message, data)
    }

    pub fn warn(&self, kind: &str, message: impl Into<String>, data: serde_json::Value) -> Event {
        self.emit(kind, Severity::Warning, message, data)
    }

    /// The events after `since` (all with 0), oldest first, at most `limit`, newest kept.
    pub fn since(&self, since: u64, limit: usize) -> Vec<Event> {
        let g = self.lock();
        let after: Vec<&Event> = g.ring.iter().filter(|e| e.seq > since).collect();
        let skip = after.len().saturating_sub(limit);
        after.into_iter().skip(skip).cloned().collect()
    }
}

fn read_file(path: &Path) -> Vec<Event> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    // A line cut short by a crash is skipped.
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| (d.as_millis() as f64) / 1000.0)
        .unwrap_or(0.0)
}

/// JSON lines, one event per line (what `/events` serves).
pub fn to_json_lines(events: &[Event]) -> String {
    events
        .iter()
        .map(|e| serde_json::to_string(e).unwrap_or_default() + "\n")
        .collect()
}

/// One event as `paceline events` prints it: local-free UTC time, severity, kind, message.
pub fn render(e: &Event) -> String {
    let secs = e.at as i64;
    let (date, time) = utc(secs);
    let sev = match e.severity {
        Severity::Info => "info",
        Severity::Warning => "WARN",
        Severity::Error => "ERROR",
    };
    let mut line = format!(
        "{date} {time}Z #{:<5} {sev:<5} {:<19} {}",
        e.seq, e.kind, e.message
    );
    if let Some(list) = e.data.get("changes").and_then(|c| c.as_array()) {
        for c in list.iter().filter_map(|c| c.as_str()) {
            line.push_str(&format!("\n    {c}"));
        }
    }
    if let Some(list) = e.data.get("errors").and_then(|c| c.as_array()) {
        for c in list.iter().filter_map(|c| c.as_str()) {
            line.push_str(&format!("\n    {c}"));
        }
    }
    line
}

/// (YYYY-MM-DD, HH:MM:SS) of a Unix time, UTC (civil-from-days, Howard Hinnant's algorithm).
pub fn utc(secs: i64) -> (String, String) {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    (
        format!("{y:04}-{m:02}-{d:02}"),
        format!("{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_are_numbered_kept_and_filtered() {
        let ev = Events::in_memory();
        ev.info("start", "up", json!(null));
        ev.warn(
            "reload_rejected",
            "bad",
            json!({"errors": ["x.yaml:3: spec: no"]}),
        );
        let all = ev.since(0, 100);
        assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(ev.since(1, 100).len(), 1);
        assert_eq!(ev.since(0, 1)[0].seq, 2, "a limit keeps the newest");
        for i in 0..(MEMORY + 5) {
            ev.info("drops", format!("{i}"), json!(null));
        }
        assert_eq!(ev.since(0, usize::MAX).len(), MEMORY, "memory is bounded");
    }

    #[test]
    fn the_file_survives_a_restart_and_stays_bounded() {
        let dir = std::env::temp_dir().join(format!("pl-events-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        {
            let ev = Events::open(&dir);
            ev.info("start", "first agent", json!(null));
            ev.info("stop", "first agent stops", json!(null));
        }
        let ev = Events::open(&dir);
        let e = ev.info("restart", "second agent", json!(null));
        assert_eq!(e.seq, 3, "numbering goes on");
        assert_eq!(ev.since(0, 10).len(), 3, "the previous agent's events are served");
        for i in 0..(2 * ON_DISK + 10) {
            ev.info("drops", format!("{i}"), json!(null));
        }
        let lines = std::fs::read_to_string(dir.join(FILE)).unwrap().lines().count();
        assert!(lines <= 2 * ON_DISK, "the file is trimmed: {lines} lines");
        assert!(lines >= ON_DISK);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn renders_utc_and_details() {
        assert_eq!(utc(0), ("1970-01-01".into(), "00:00:00".into()));
        assert_eq!(utc(1_796_110_210), ("2026-12-01".into(), "07:30:10".into()));
        let e = Event {
            seq: 7,
            at: 1_796_110_210.5,
            kind: "reload_applied".into(),
            severity: Severity::Info,
            message: "policy applied (hash 1b30767275a5)".into(),
            data: json!({"changes": ["classes.web: added"]}),
        };
        assert_eq!(
            render(&e),
            "2026-12-01 07:30:10Z #7     info  reload_applied      policy applied (hash 1b30767275a5)\n    classes.web: added"
        );
    }
}
