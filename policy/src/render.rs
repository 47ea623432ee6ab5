//! Output of `paceline policy check`: an aligned report for people ([`check_report`], fits in
//! 100 columns) and JSON for machines ([`json()`]).

use serde_json::{Value, json};

use super::compile::Compiled;
use super::htb::HTB_MAJOR;
use super::units::{fmt_ns, fmt_rate, fmt_secs, fmt_size};
use super::validate::TcpSettings;

const WIDTH: usize = 100;
/// Rules listed in the report (the JSON lists every rule).
const MAX_RULE_ROWS: usize = 200;

/// Columns of text, left- or right-aligned, the last one not padded.
struct Table {
    header: Vec<&'static str>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(header: &[(&'static str, bool)]) -> Self {
        Table {
            header: header.iter().map(|h| h.0).collect(),
            right: header.iter().map(|h| h.1).collect(),
            rows: Vec::new(),
        }
    }
    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }
    fn render(&self, out: &mut String) {
        let n = self.header.len();
        let mut w = vec![0; n];
        for r in
            std::iter::once(&self.header.iter().map(|h| h.to_string()).collect::<Vec<_>>()).chain(&self.rows)
        {
            for (i, c) in r.iter().enumerate() {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let line = |cells: &[String], out: &mut String| {
            let mut s = String::from("  ");
            for (i, c) in cells.iter().enumerate() {
                let pad = w[i] - c.chars().count();
                if i > 0 {
                    s.push_str("  ");
                }
                if self.right[i] {
                    s.push_str(&" ".repeat(pad));
                    s.push_str(c);
                } else {
                    s.push_str(c);
                    if i + 1 < n {
                        s.push_str(&" ".repeat(pad));
                    }
                }
            }
            out.push_str(s.trim_end());
            out.push('\n');
        };
        line(
            &self.header.iter().map(|h| h.to_string()).collect::<Vec<_>>(),
            out,
        );
        for r in &self.rows {
            line(r, out);
        }
    }
}

/// Wraps `text` at [`WIDTH`] columns: the first line starts with `first`, the others with
/// `rest`.
fn wrap(text: &str, first: &str, rest: &str, out: &mut String) {
    let mut line = first.to_string();
    let mut empty = true;
    for word in text.split(' ') {
        if !empty && line.chars().count() + 1 + word.chars().count() > WIDTH {
            out.push_str(line.trim_end());
            out.push('\n');
            line = rest.to_string();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(line.trim_end());
    out.push('\n');
}

fn opt_rate(r: Option<u64>) -> String {
    r.map_or("-".into(), fmt_rate)
}

fn tcp_text(t: &Option<TcpSettings>) -> String {
    let Some(t) = t else { return "-".into() };
    let mut parts = Vec::new();
    if let Some(us) = t.rto_min_us {
        parts.push(format!("rto_min {}", fmt_ns(u64::from(us) * 1_000)));
    }
    if let Some(us) = t.delack_max_us {
        parts.push(format!("delack_max {}", fmt_ns(u64::from(us) * 1_000)));
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

fn kv(out: &mut String, k: &str, v: impl AsRef<str>) {
    out.push_str(&format!("  {k:<13}{}\n", v.as_ref()));
}

/// The human-readable report of `paceline policy check`.
pub fn check_report(c: &Compiled) -> String {
    let mut out = String::new();
    match &c.name {
        Some(n) => out.push_str(&format!("Policy {n:?} ({})\n", c.file)),
        None => out.push_str(&format!("Policy {}\n", c.file)),
    }
    if let Some(d) = &c.description {
        wrap(d, "  ", "  ", &mut out);
    }
    kv(&mut out, "sha256", &c.hash);
    let ifs = if c.interfaces.is_empty() {
        "(none)".to_string()
    } else {
        c.interfaces.join(", ")
    };
    kv(
        &mut out,
        "interfaces",
        if c.interfaces_auto {
            format!("{ifs} (auto: the default routes' interfaces)")
        } else {
            ifs
        },
    );
    kv(
        &mut out,
        "enforcement",
        format!(
            "{} requested, compiled for {}",
            c.enforcement.as_str(),
            c.mode.as_str()
        ),
    );
    kv(&mut out, "horizon", fmt_ns(c.horizon_ns));
    kv(
        &mut out,
        "flow table",
        format!(
            "{} entries; {}",
            c.flow_table_size,
            match flows_tracked_for(c) {
                "none" => "flows without a local socket untracked (track_flows: all)",
                "classes with a flow clock" => {
                    "flows without a local socket tracked for classes with a flow clock"
                }
                _ => "flows without a local socket tracked",
            }
        ),
    );
    kv(
        &mut out,
        "link rate",
        c.link_rate.as_ref().map_or("unknown".into(), |l| {
            format!("{} ({})", fmt_rate(l.rate), l.source)
        }),
    );

    if let Some(q) = &c.qjump {
        let n = &q.network;
        out.push_str("\nQJump network\n");
        kv(&mut out, "hosts", format!("n = {}", n.hosts));
        kv(&mut out, "max packet", format!("P = {}", fmt_size(n.max_packet)));
        kv(&mut out, "slowest link", format!("R = {}", fmt_rate(n.link_rate)));
        kv(
            &mut out,
            "switch delay",
            format!("eps = {}", fmt_secs(n.switch_delay_ns as f64 * 1e-9)),
        );
        kv(
            &mut out,
            "worst delay",
            format!(
                "{} = n*P/R + eps (an idle network, one packet per host)",
                fmt_secs(q.worst_case_delay_secs)
            ),
        );
        kv(
            &mut out,
            "epoch",
            format!(
                "{} = 2*n*P/R + eps (factor f: 2*(n/f)*P/R + eps)",
                fmt_secs(q.epoch_secs)
            ),
        );
    }

    out.push_str("\nLevels (highest first)\n");
    let mut t = Table::new(&[
        ("#", true),
        ("LEVEL", false),
        ("PRIO", true),
        ("FACTOR", true),
        ("EPOCH", true),
        ("RATE", true),
        ("DSCP", true),
        ("PCP", true),
    ]);
    for (i, l) in c.levels.iter().enumerate() {
        t.row(vec![
            i.to_string(),
            l.name.clone(),
            l.priority.to_string(),
            l.factor.map_or("-".into(), |f| f.to_string()),
            l.epoch_secs.map_or("-".into(), fmt_secs),
            l.rate.map_or("unlimited".into(), fmt_rate),
            l.dscp.map_or("-".into(), |d| d.to_string()),
            l.pcp.map_or("-".into(), |p| p.to_string()),
        ]);
    }
    t.render(&mut out);
    let sum: u64 = c.levels.iter().filter_map(|l| l.rate).sum();
    if c.levels.iter().any(|l| l.rate.is_some()) {
        let of = c.link_rate.as_ref().map_or(String::new(), |l| {
            format!(
                " of {} ({:.1}%)",
                fmt_rate(l.rate),
                sum as f64 * 100.0 / l.rate as f64
            )
        });
        out.push_str(&format!("  rate-limited levels take {}{of}\n", fmt_rate(sum)));
    }

    out.push_str("\nClasses\n");
    let mut t = Table::new(&[
        ("IDX", true),
        ("CLASS", false),
        ("LEVEL", false),
        ("FLOW RATE", true),
        ("CLASS RATE", true),
        ("RULES", true),
        ("TCP", false),
    ]);
    for cl in &c.classes {
        let rules = if cl.index == c.default_class {
            format!("{}+dflt", cl.rules)
        } else {
            cl.rules.to_string()
        };
        t.row(vec![
            cl.index.to_string(),
            cl.name.clone(),
            c.level_names[cl.level].clone(),
            opt_rate(cl.flow_rate),
            opt_rate(cl.class_rate),
            rules,
            tcp_text(&cl.tcp),
        ]);
    }
    t.render(&mut out);

    out.push_str("\nRules (first match wins)\n");
    let mut t = Table::new(&[("#", true), ("CLASS", false), ("FROM", false), ("MATCH", false)]);
    for (i, r) in c.rules.iter().enumerate().take(MAX_RULE_ROWS) {
        t.row(vec![
            i.to_string(),
            r.class.to_string(),
            r.origin.trim_start_matches("spec.").to_string(),
            r.matches.to_string(),
        ]);
    }
    if c.rules.len() > MAX_RULE_ROWS {
        t.row(vec![
            "...".into(),
            String::new(),
            String::new(),
            format!(
                "{} more rules (--json lists them all)",
                c.rules.len() - MAX_RULE_ROWS
            ),
        ]);
    }
    let default = c
        .class_names
        .get(usize::from(c.default_class))
        .cloned()
        .flatten()
        .unwrap_or_default();
    t.row(vec![
        "-".into(),
        default,
        "default_class".into(),
        "everything else".into(),
    ]);
    t.render(&mut out);

    classifier_report(&c.ctab.stats, &mut out);
    codel_report(c, &mut out);

    if let Some(h) = &c.htb {
        out.push_str(&format!(
            "\nHTB plan (root qdisc {HTB_MAJOR}: htb, default class {HTB_MAJOR}:{:x})\n",
            h.default_minor
        ));
        out.push_str(
            "  skb->priority carries the HTB class id: levels reach switches only through DSCP/PCP\n",
        );
        let mut t = Table::new(&[
            ("CLASSID", false),
            ("PARENT", false),
            ("RATE", true),
            ("CEIL", true),
            ("PRIO", true),
            ("NAME", false),
        ]);
        for k in &h.classes {
            let parent = if k.parent_minor == 0 {
                format!("{HTB_MAJOR}:")
            } else {
                format!("{HTB_MAJOR}:{:x}", k.parent_minor)
            };
            t.row(vec![
                format!("{HTB_MAJOR}:{:x}", k.classid_minor),
                parent,
                fmt_rate(k.rate),
                fmt_rate(k.ceil),
                k.prio.to_string(),
                k.name.clone(),
            ]);
        }
        t.render(&mut out);
    }

    if let Some(d) = &c.dasr {
        dasr_report(d, &mut out);
    }

    if c.warnings.is_empty() {
        out.push_str("\nNo warnings.\n");
    } else {
        out.push_str(&format!("\nWarnings ({})\n", c.warnings.len()));
        for w in &c.warnings {
            wrap(w, "  - ", "    ", &mut out);
        }
    }
    out
}

/// The aggregates with CoDel (nothing when none has it).
fn codel_report(c: &Compiled, out: &mut String) {
    let mut t = Table::new(&[
        ("AGGREGATE", false),
        ("TARGET", true),
        ("INTERVAL", true),
        ("SIGNAL", false),
    ]);
    let rows = c
        .levels
        .iter()
        .map(|l| (format!("level {}", l.name), l.codel))
        .chain(c.classes.iter().map(|k| (format!("class {}", k.name), k.codel)));
    for (name, codel) in rows {
        if let Some(k) = codel {
            t.row(vec![
                name,
                fmt_ns(u64::from(k.target_ns)),
                fmt_ns(u64::from(k.interval_ns)),
                if k.ecn {
                    "CE mark (drop if not ECN-capable)".into()
                } else {
                    "drop".into()
                },
            ]);
        }
    }
    if t.rows.is_empty() {
        return;
    }
    out.push_str(
        "
CoDel on departure queues
",
    );
    t.render(out);
}

fn codel_json(c: Option<super::validate::Codel>) -> Value {
    match c {
        Some(k) => json!({
            "target_ns": k.target_ns,
            "interval_ns": k.interval_ns,
            "ecn": k.ecn,
        }),
        None => Value::Null,
    }
}

/// Machine-readable output of `paceline policy check --json`. Rates are bytes/s, durations
/// nanoseconds or seconds as the key says.
/// The compiled classifier's sizes: entries per table and the kernel memory they take.
/// `spec.dasr`: the roles, what "currently sending" means here, each interface's line rate.
fn dasr_report(d: &super::validate::DasrSpec, out: &mut String) {
    let yes = |b: bool| if b { "on" } else { "off" };
    out.push_str("\nDASR (docs/dasr.md)\n");
    kv(
        out,
        "receiver",
        format!(
            "{} (counts senders at ingress, advertises N in pure ACKs)",
            yes(d.receiver)
        ),
    );
    kv(
        out,
        "sender",
        format!("{} (caps each flow at line / N)", yes(d.sender)),
    );
    kv(
        out,
        "sending",
        format!(
            "data in the last {}..{} ({} x rtt {}; longer with many senders)",
            fmt_ns(d.min_window_ns()),
            fmt_ns(2 * d.min_window_ns()),
            d.active_rtts,
            fmt_ns(d.rtt_ns)
        ),
    );
    for l in &d.interfaces {
        kv(
            out,
            "line rate",
            format!("{}: {} ({})", l.interface, fmt_rate(l.line_rate), l.source),
        );
    }
}

fn classifier_report(st: &crate::ctab::Stats, out: &mut String) {
    out.push_str("\nClassifier (its cost per packet does not grow with the number of rules)\n");
    let mut t = Table::new(&[("TABLE", false), ("ENTRIES", true), ("HOLDS", false)]);
    t.row(vec![
        "words".into(),
        st.words.to_string(),
        format!(
            "tries of {} src / {} dst classes, field tables, {} selectors",
            st.src_ecs, st.dst_ecs, st.selectors
        ),
    ]);
    t.row(vec![
        "selectors".into(),
        st.sel_entries.to_string(),
        format!(
            "proto/DSCP x sport x dport x mark x cgroup: {} x {} x {} x {} x {}",
            st.p_ecs.max(1),
            st.sport_ecs.max(1),
            st.dport_ecs.max(1),
            st.mark_ecs.max(1),
            2 * st.cgroups + 2
        ),
    ]);
    t.row(vec![
        "rules".into(),
        st.rule_entries.to_string(),
        format!("(selector, src class, dst class) of {} rules", st.rules),
    ]);
    t.render(out);
    out.push_str(&format!(
        "  kernel memory: about {:.1} MiB in each of the two banks, beside {} MiB of fixed fast words\n",
        st.kernel_bytes() as f64 / (1024.0 * 1024.0),
        paceline_common::maps::CTAB_FAST_BYTES >> 20
    ));
}

fn classifier_json(st: &crate::ctab::Stats) -> Value {
    json!({
        "rules": st.rules,
        "selectors": st.selectors,
        "src_classes": st.src_ecs,
        "dst_classes": st.dst_ecs,
        "words": st.words,
        "selector_entries": st.sel_entries,
        "rule_entries": st.rule_entries,
        "kernel_bytes": st.kernel_bytes(),
    })
}

pub fn json(c: &Compiled) -> Value {
    let t = &c.table;
    json!({
        "file": c.file,
        "name": c.name,
        "description": c.description,
        "sha256": c.hash,
        "interfaces": c.interfaces,
        "interfaces_auto": c.interfaces_auto,
        "enforcement_requested": c.enforcement.as_str(),
        "enforcement_mode": c.mode.as_str(),
        "horizon_ns": c.horizon_ns,
        "flow_table_size": c.flow_table_size,
        "track_flows": c.track_flows.as_str(),
        "flows_tracked": c.table.flags & paceline_common::maps::TABLE_UNTRACKED_FLOWS == 0,
        "flows_tracked_for": flows_tracked_for(c),
        "link_rate_bytes_per_second": c.link_rate.as_ref().map(|l| l.rate),
        "link_rate_source": c.link_rate.as_ref().map(|l| l.source.to_string()),
        "qjump": c.qjump.as_ref().map(|q| json!({
            "hosts": q.network.hosts,
            "max_packet_bytes": q.network.max_packet,
            "link_rate_bytes_per_second": q.network.link_rate,
            "switch_delay_ns": q.network.switch_delay_ns,
            "worst_case_delay_seconds": q.worst_case_delay_secs,
            "epoch_seconds": q.epoch_secs,
        })),
        "levels": c.levels.iter().enumerate().map(|(i, l)| json!({
            "index": i,
            "name": l.name,
            "priority": l.priority,
            "factor": l.factor,
            "epoch_seconds": l.epoch_secs,
            "rate_bytes_per_second": l.rate,
            "limited": l.is_limited(),
            "dscp": l.dscp,
            "pcp": l.pcp,
            "codel": codel_json(l.codel),
        })).collect::<Vec<_>>(),
        "classes": c.classes.iter().map(|k| json!({
            "index": k.index,
            "name": k.name,
            "level": c.level_names[k.level],
            "flow_rate_bytes_per_second": k.flow_rate,
            "class_rate_bytes_per_second": k.class_rate,
            "rto_min_us": k.tcp.and_then(|t| t.rto_min_us),
            "delack_max_us": k.tcp.and_then(|t| t.delack_max_us),
            "rules": k.rules,
            "skb_priority": t.classes[usize::from(k.index)].skb_priority,
            "codel": codel_json(k.codel),
        })).collect::<Vec<_>>(),
        "default_class": c.class_names.get(usize::from(c.default_class)).cloned().flatten(),
        "rules": c.rules.iter().map(|r| json!({
            "origin": &*r.origin,
            "class": &*r.class,
            "class_index": r.class_index,
            "match": &*r.matches,
        })).collect::<Vec<_>>(),
        "classifier": classifier_json(&c.ctab.stats),
        "table": {
            "n_rules": c.rule_table.len(),
            "n_classes": t.n_classes,
            "default_class": t.default_class,
            "flags": t.flags,
            "horizon_ns": t.horizon_ns,
        },
        "htb": c.htb.as_ref().map(|h| json!({
            "root_rate_bytes_per_second": h.root_rate,
            "default_minor": h.default_minor,
            "classes": h.classes.iter().map(|k| json!({
                "classid": format!("{HTB_MAJOR}:{:x}", k.classid_minor),
                "parent": if k.parent_minor == 0 { format!("{HTB_MAJOR}:") } else { format!("{HTB_MAJOR}:{:x}", k.parent_minor) },
                "rate_bytes_per_second": k.rate,
                "ceil_bytes_per_second": k.ceil,
                "prio": k.prio,
                "name": k.name,
            })).collect::<Vec<_>>(),
        })),
        "dasr": c.dasr.as_ref().map(|d| json!({
            "receiver": d.receiver,
            "sender": d.sender,
            "rtt_ns": d.rtt_ns,
            "active_rtts": d.active_rtts,
            "line_rate_bytes_per_second": d.line_rate,
            "interfaces": d.interfaces.iter().map(|l| json!({
                "interface": l.interface,
                "line_rate_bytes_per_second": l.line_rate,
                "source": l.source,
            })).collect::<Vec<_>>(),
        })),
        "warnings": c.warnings,
    })
}

/// Which flows without a local socket the flow table keeps: "every class", "classes with a
/// flow clock" (`TABLE_UNTRACKED_CLASSES`) or "none" (`TABLE_UNTRACKED_FLOWS`).
fn flows_tracked_for(c: &Compiled) -> &'static str {
    use paceline_common::maps::{TABLE_UNTRACKED_CLASSES, TABLE_UNTRACKED_FLOWS};
    if c.table.flags & TABLE_UNTRACKED_FLOWS != 0 {
        "none"
    } else if c.table.flags & TABLE_UNTRACKED_CLASSES != 0 {
        "classes with a flow clock"
    } else {
        "every class"
    }
}
