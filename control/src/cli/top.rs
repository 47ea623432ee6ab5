//! `paceline top`: the running agent's live view. Every interval (1 s) it reads `/status`
//! from the agent's API and shows, per QJump level and per class, the rates over the last
//! interval: bits and packets per second, the mean delay pacing added to a delayed packet,
//! drops beyond the horizon and DSCP/PCP rewrites per second, next to the configured rates.
//!
//! Keys: `q` (or Esc, Ctrl-C) quits; `s` moves the sort column (name, rate, packets, delay,
//! drops, tags), `r` reverses it; `n`, `b`, `p`, `d`, `x`, `t` pick a column directly.

use std::time::{Duration, Instant};

use anyhow::Result;
use ratatui::{
    Terminal,
    backend::CrosstermBackend,
    crossterm::{
        event::{self, Event, KeyCode, KeyEventKind, KeyModifiers},
        execute,
        terminal::{EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode},
    },
    layout::{Constraint, Layout},
    style::{Modifier, Style},
    text::Line,
    widgets::{Block, Borders, Cell, Paragraph, Row, Table},
};

use crate::status::{LiveStatus, NamedCounters};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub api: super::ApiAddr,
    /// Refresh interval, seconds.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// The column to sort by at start.
    #[arg(long, value_enum, default_value_t = SortBy::Rate)]
    pub sort: SortBy,
}

/// A sort column.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortBy {
    Name,
    Rate,
    Packets,
    Delay,
    Drops,
    Tags,
}

impl SortBy {
    const ALL: [SortBy; 6] = [
        SortBy::Name,
        SortBy::Rate,
        SortBy::Packets,
        SortBy::Delay,
        SortBy::Drops,
        SortBy::Tags,
    ];

    fn next(self) -> SortBy {
        let i = Self::ALL.iter().position(|s| *s == self).unwrap_or(0);
        Self::ALL[(i + 1) % Self::ALL.len()]
    }

    fn title(self) -> &'static str {
        match self {
            SortBy::Name => "name",
            SortBy::Rate => "rate",
            SortBy::Packets => "packets",
            SortBy::Delay => "delay",
            SortBy::Drops => "drops",
            SortBy::Tags => "tags",
        }
    }
}

/// One line of a table: a level or a class over the last interval.
#[derive(Clone, Debug, PartialEq)]
pub struct Rate {
    pub name: String,
    /// The class's level, or the level's priority.
    pub detail: String,
    pub bits_per_second: f64,
    pub packets_per_second: f64,
    /// Mean delay added to a delayed packet, seconds (0 when none was delayed).
    pub mean_delay: f64,
    pub delayed_share: f64,
    pub drops_per_second: f64,
    pub tags_per_second: f64,
    /// The clock that held most of the interval's delayed packets and its share of them
    /// (`class 97%`), `-` when none was held.
    pub held_by: String,
    /// The configured rate, as text (`-`, `unlimited`, `10.0 Mbit/s`).
    pub limit: String,
}

/// The clock that held most of `d` (flow, class, level counts) and its share.
fn held_by(d: [f64; 3]) -> String {
    let total: f64 = d.iter().sum();
    if total <= 0.0 {
        return "-".into();
    }
    let (i, n) = d.iter().enumerate().fold(
        (0, 0.0),
        |(bi, bn), (i, n)| if *n > bn { (i, *n) } else { (bi, bn) },
    );
    format!("{} {:.0}%", paceline_common::trace::HELD_BY[i], n / total * 100.0)
}

fn rates(
    prev: &[NamedCounters],
    cur: &[NamedCounters],
    dt: f64,
    detail: impl Fn(&str) -> (String, String),
) -> Vec<Rate> {
    cur.iter()
        .map(|c| {
            let p = prev.iter().find(|p| p.name == c.name);
            let d = |f: fn(&NamedCounters) -> f64| f(c) - p.map(f).unwrap_or(f(c));
            let packets = d(|x| x.counters.packets as f64).max(0.0);
            let delayed = d(|x| x.counters.delayed_packets as f64).max(0.0);
            let delay = d(|x| x.counters.added_delay_seconds).max(0.0);
            let (det, limit) = detail(&c.name);
            Rate {
                name: c.name.clone(),
                detail: det,
                bits_per_second: d(|x| x.counters.bytes as f64).max(0.0) * 8.0 / dt,
                packets_per_second: packets / dt,
                mean_delay: if delayed > 0.0 { delay / delayed } else { 0.0 },
                delayed_share: if packets > 0.0 { delayed / packets } else { 0.0 },
                drops_per_second: d(|x| x.counters.dropped_horizon as f64).max(0.0) / dt,
                tags_per_second: d(|x| x.counters.tagged_packets as f64).max(0.0) / dt,
                held_by: held_by([
                    d(|x| x.counters.held_by.flow as f64).max(0.0),
                    d(|x| x.counters.held_by.class as f64).max(0.0),
                    d(|x| x.counters.held_by.level as f64).max(0.0),
                ]),
                limit,
            }
        })
        .collect()
}

/// The level and class lines between two status documents `dt` seconds apart.
pub fn compute(prev: &LiveStatus, cur: &LiveStatus, dt: f64) -> (Vec<Rate>, Vec<Rate>) {
    let p = &cur.status.policy;
    let fmt = |b: Option<u64>| b.map(paceline_policy::units::fmt_rate);
    let levels = rates(&prev.counters.levels, &cur.counters.levels, dt, |n| {
        let l = p.levels.iter().find(|l| l.name == n);
        (
            l.map(|l| format!("prio {}", l.priority)).unwrap_or_default(),
            l.map(|l| fmt(l.rate_bytes_per_second).unwrap_or_else(|| "unlimited".into()))
                .unwrap_or_default(),
        )
    });
    let classes = rates(&prev.counters.classes, &cur.counters.classes, dt, |n| {
        let c = p.classes.iter().find(|c| c.name == n);
        (
            c.map(|c| c.level.clone()).unwrap_or_default(),
            c.map(|c| {
                match (
                    fmt(c.flow_rate_bytes_per_second),
                    fmt(c.class_rate_bytes_per_second),
                ) {
                    (None, None) => "-".to_string(),
                    (f, k) => format!(
                        "{}{}",
                        f.map(|f| format!("flow {f} ")).unwrap_or_default(),
                        k.map(|k| format!("class {k}")).unwrap_or_default()
                    )
                    .trim()
                    .to_string(),
                }
            })
            .unwrap_or_default(),
        )
    });
    (levels, classes)
}

/// Sorts lines: by name ascending, by any figure descending; `reverse` flips it.
pub fn sort(rows: &mut [Rate], by: SortBy, reverse: bool) {
    let key = |r: &Rate| match by {
        SortBy::Name => 0.0,
        SortBy::Rate => r.bits_per_second,
        SortBy::Packets => r.packets_per_second,
        SortBy::Delay => r.mean_delay,
        SortBy::Drops => r.drops_per_second,
        SortBy::Tags => r.tags_per_second,
    };
    rows.sort_by(|a, b| {
        let o = if by == SortBy::Name {
            a.name.cmp(&b.name)
        } else {
            key(b).total_cmp(&key(a)).then(a.name.cmp(&b.name))
        };
        if reverse { o.reverse() } else { o }
    });
}

fn bits(b: f64) -> String {
    if b >= 1e9 {
        format!("{:.2} Gbit/s", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.2} Mbit/s", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} kbit/s", b / 1e3)
    } else {
        format!("{b:.0} bit/s")
    }
}

fn delay(s: f64) -> String {
    if s == 0.0 {
        "-".into()
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.0} us", s * 1e6)
    }
}

fn table<'a>(title: String, first: &'a str, rows: &[Rate], by: SortBy) -> Table<'a> {
    let head = [
        first, "", "RATE", "PKT/S", "DELAY", "DELAYED", "HELD BY", "DROP/S", "TAG/S", "LIMIT",
    ];
    let marked: Vec<Cell> = head
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let sorted = matches!(
                (i, by),
                (0, SortBy::Name)
                    | (2, SortBy::Rate)
                    | (3, SortBy::Packets)
                    | (4, SortBy::Delay)
                    | (7, SortBy::Drops)
                    | (8, SortBy::Tags)
            );
            let text = if sorted { format!("{h}*") } else { h.to_string() };
            Cell::from(text)
        })
        .collect();
    let body: Vec<Row> = rows
        .iter()
        .map(|r| {
            Row::new(vec![
                Cell::from(r.name.clone()),
                Cell::from(r.detail.clone()),
                Cell::from(bits(r.bits_per_second)),
                Cell::from(format!("{:.0}", r.packets_per_second)),
                Cell::from(delay(r.mean_delay)),
                Cell::from(format!("{:.0}%", r.delayed_share * 100.0)),
                Cell::from(r.held_by.clone()),
                Cell::from(format!("{:.1}", r.drops_per_second)),
                Cell::from(format!("{:.0}", r.tags_per_second)),
                Cell::from(r.limit.clone()),
            ])
        })
        .collect();
    Table::new(
        body,
        [
            Constraint::Length(16),
            Constraint::Length(10),
            Constraint::Length(14),
            Constraint::Length(9),
            Constraint::Length(10),
            Constraint::Length(8),
            Constraint::Length(11),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Min(10),
        ],
    )
    .header(Row::new(marked).style(Style::default().add_modifier(Modifier::BOLD)))
    .block(Block::default().borders(Borders::ALL).title(title))
}

struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = disable_raw_mode();
        let _ = execute!(std::io::stdout(), LeaveAlternateScreen);
    }
}

fn fetch(api: &super::ApiAddr) -> std::result::Result<LiveStatus, String> {
    match api.get("/status") {
        Ok((200, body)) => serde_json::from_str(&body).map_err(|e| format!("parsing /status: {e}")),
        Ok((code, body)) => Err(format!("HTTP {code}: {}", body.trim())),
        Err(u) => Err(u.to_string()),
    }
}

pub fn run(a: Args) -> Result<i32> {
    // The first read before the screen changes: an unreachable agent is an error message and
    // exit 2, not an empty screen.
    let mut prev = match fetch(&a.api) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("paceline: {e}");
            return Ok(2);
        }
    };
    let mut prev_at = Instant::now();
    let interval = Duration::from_secs_f64(a.interval.max(0.1));
    enable_raw_mode()?;
    let _restore = Restore;
    execute!(std::io::stdout(), EnterAlternateScreen)?;
    let mut term = Terminal::new(CrosstermBackend::new(std::io::stdout()))?;
    let mut by = a.sort;
    let mut reverse = false;
    let mut lines: (Vec<Rate>, Vec<Rate>) = compute(&prev, &prev, 1.0);
    let mut cur = prev.clone();
    let mut error: Option<String> = None;
    let mut next = Instant::now();
    loop {
        if Instant::now() >= next {
            next = Instant::now() + interval;
            match fetch(&a.api) {
                Ok(s) => {
                    let dt = prev_at.elapsed().as_secs_f64().max(1e-3);
                    lines = compute(&prev, &s, dt);
                    prev = s.clone();
                    prev_at = Instant::now();
                    cur = s;
                    error = None;
                }
                Err(e) => error = Some(e),
            }
        }
        let (mut levels, mut classes) = lines.clone();
        sort(&mut levels, by, reverse);
        sort(&mut classes, by, reverse);
        let st = &cur.status;
        let head = vec![
            Line::from(format!(
                "paceline {} on {}  policy {} (hash {}, generation {})  enforcement {}  interfaces {}",
                st.version,
                a.api.addr,
                st.policy.name.as_deref().unwrap_or("-"),
                st.policy.hash.chars().take(12).collect::<String>(),
                st.policy.generation,
                st.enforcement.mode,
                st.interfaces
                    .iter()
                    .map(|i| i.name.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            )),
            Line::from(match (&error, st.reloads.last.as_ref().filter(|l| !l.applied)) {
                (Some(e), _) => format!("NOT UPDATING: {e}"),
                (None, Some(_)) => "LAST RELOAD REJECTED: the previous policy stays in force".into(),
                (None, None) if !st.degraded.is_empty() => format!("degraded: {}", st.degraded.join("; ")),
                _ => format!(
                    "sorted by {}{}   keys: q quit, s next column, r reverse, n/b/p/d/x/t pick",
                    by.title(),
                    if reverse { " (reversed)" } else { "" }
                ),
            }),
        ];
        let nl = levels.len() as u16;
        term.draw(|f| {
            let areas = Layout::vertical([
                Constraint::Length(2),
                Constraint::Length(nl + 3),
                Constraint::Min(4),
            ])
            .split(f.area());
            f.render_widget(Paragraph::new(head.clone()), areas[0]);
            f.render_widget(table("QJump levels".into(), "LEVEL", &levels, by), areas[1]);
            f.render_widget(table("Classes".into(), "CLASS", &classes, by), areas[2]);
        })?;
        let wait = next.saturating_duration_since(Instant::now());
        if event::poll(wait)?
            && let Event::Key(k) = event::read()?
            && k.kind == KeyEventKind::Press
        {
            match k.code {
                KeyCode::Char('q') | KeyCode::Esc => break,
                KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => break,
                KeyCode::Char('s') | KeyCode::Right => by = by.next(),
                KeyCode::Char('r') => reverse = !reverse,
                KeyCode::Char('n') => by = SortBy::Name,
                KeyCode::Char('b') => by = SortBy::Rate,
                KeyCode::Char('p') => by = SortBy::Packets,
                KeyCode::Char('d') => by = SortBy::Delay,
                KeyCode::Char('x') => by = SortBy::Drops,
                KeyCode::Char('t') => by = SortBy::Tags,
                _ => {}
            }
        }
    }
    drop(term);
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_over_an_interval_and_sorting() {
        let a: LiveStatus = serde_json::from_str(crate::status::tests::LIVE).expect("status");
        let mut b = a.clone();
        // 2 s later: class "other" sent 1,000,000 bytes in 1000 packets, 100 of them delayed
        // by 0.1 s in all; "rpc" sent 10 packets, 2 dropped.
        let other = b.counters.classes.iter_mut().find(|c| c.name == "other").unwrap();
        other.counters.bytes += 1_000_000;
        other.counters.packets += 1000;
        other.counters.delayed_packets += 100;
        other.counters.added_delay_seconds += 0.1;
        // 90 of the 100 held by the class clock, 10 by the flow's.
        other.counters.held_by.class += 90;
        other.counters.held_by.flow += 10;
        let rpc = b.counters.classes.iter_mut().find(|c| c.name == "rpc").unwrap();
        rpc.counters.packets += 10;
        rpc.counters.dropped_horizon += 2;
        let (_, mut classes) = compute(&a, &b, 2.0);
        sort(&mut classes, SortBy::Rate, false);
        assert_eq!(classes[0].name, "other");
        assert_eq!(classes[0].bits_per_second, 4e6);
        assert_eq!(classes[0].packets_per_second, 500.0);
        assert!((classes[0].mean_delay - 0.001).abs() < 1e-12);
        assert!((classes[0].delayed_share - 0.1).abs() < 1e-12);
        assert_eq!(classes[0].detail, "bulk");
        assert_eq!(classes[0].held_by, "class 90%");
        sort(&mut classes, SortBy::Drops, false);
        assert_eq!(classes[0].name, "rpc");
        assert_eq!(classes[0].drops_per_second, 1.0);
        assert!(
            classes[0].limit.contains("flow") && classes[0].limit.contains("class"),
            "{}",
            classes[0].limit
        );
        sort(&mut classes, SortBy::Name, true);
        assert_eq!(classes[0].name, "rpc");
        assert_eq!(SortBy::Tags.next(), SortBy::Name);
    }
}
