//! What differs between two compiled policies, as an operator reads a policy: levels and
//! classes matched by **name** (not by position or table index), rules in order (first match
//! wins, so order matters), rates with units (`10 Mbit/s`), no internal fields (table indices,
//! `skb->priority` values, classifier sizes, flags). Used by `paceline policy diff` and by the
//! event log's summary of each reload.
//!
//! Each change is one line: `classes.web.flow_rate: 10.0 Mbit/s -> 20.0 Mbit/s`,
//! `classes.bulk: removed`, `levels.latency: added (priority 5, rate 34.7 Mbit/s)`,
//! `rules[2]: tcp dst_port 443 -> web  =>  tcp dst_port 8443 -> web`.

use std::collections::BTreeMap;

use super::compile::{ClassInfo, Compiled, LevelInfo};
use super::units::{fmt_ns, fmt_rate, fmt_size};

/// The fields of a policy an operator compares, each as `(path, text)`, in a stable order.
fn view(c: &Compiled) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = Vec::new();
    let mut put = |k: String, val: String| v.push((k, val));
    put("name".into(), c.name.clone().unwrap_or_else(|| "-".into()));
    put(
        "interfaces".into(),
        if c.interfaces_auto {
            "auto".into()
        } else {
            c.interfaces.join(", ")
        },
    );
    put("enforcement".into(), c.enforcement.as_str().into());
    put("horizon".into(), fmt_ns(c.horizon_ns));
    put("flow_table_size".into(), c.flow_table_size.to_string());
    put("track_flows".into(), c.track_flows.as_str().into());
    put(
        "link_rate".into(),
        c.link_rate
            .as_ref()
            .map_or("unknown".into(), |l| fmt_rate(l.rate)),
    );
    if let Some(q) = &c.qjump {
        let n = &q.network;
        put("qjump.hosts".into(), n.hosts.to_string());
        put("qjump.max_packet".into(), fmt_size(n.max_packet));
        put("qjump.link_rate".into(), fmt_rate(n.link_rate));
        put("qjump.switch_delay".into(), fmt_ns(n.switch_delay_ns));
    }
    put(
        "default_class".into(),
        c.class_names
            .get(usize::from(c.default_class))
            .cloned()
            .flatten()
            .unwrap_or_default(),
    );
    match &c.d3 {
        None => put("d3".into(), "off".into()),
        Some(d) => {
            put("d3.receiver".into(), d.receiver.to_string());
            put("d3.interval".into(), fmt_ns(d.interval_ns));
            put(
                "d3.first_rtt_rate".into(),
                d.first_rtt_rate.map_or("default".into(), fmt_rate),
            );
            put(
                "d3.initial_window".into(),
                format!("{} segments", d.initial_window),
            );
            for l in &d.router {
                put(
                    format!("d3.router.{}", l.interface),
                    format!(
                        "capacity {}, base rate {}, flow cap {}, {} controller",
                        fmt_rate(l.capacity),
                        fmt_rate(l.base_rate),
                        fmt_rate(l.flow_cap),
                        if l.capacity_mode == paceline_common::d3::CAP_MODE_PAPER {
                            "paper's"
                        } else {
                            "line-referenced"
                        }
                    ),
                );
            }
        }
    }
    v
}

fn level_fields(l: &LevelInfo, position: usize) -> Vec<(&'static str, String)> {
    vec![
        ("position", position.to_string()),
        ("priority", l.priority.to_string()),
        ("factor", l.factor.map_or("-".into(), |f| format!("{f}"))),
        ("rate", l.rate.map_or("unlimited".into(), fmt_rate)),
        ("dscp", l.dscp.map_or("-".into(), |d| d.to_string())),
        ("pcp", l.pcp.map_or("-".into(), |d| d.to_string())),
    ]
}

fn class_fields(c: &Compiled, k: &ClassInfo) -> Vec<(&'static str, String)> {
    let opt_rate = |r: Option<u64>| r.map_or("-".into(), fmt_rate);
    let us = |u: Option<u32>| u.map_or("-".into(), |u| fmt_ns(u64::from(u) * 1000));
    vec![
        ("level", c.level_names.get(k.level).cloned().unwrap_or_default()),
        ("flow_rate", opt_rate(k.flow_rate)),
        ("class_rate", opt_rate(k.class_rate)),
        ("tcp.rto_min", us(k.tcp.and_then(|t| t.rto_min_us))),
        ("tcp.delack_max", us(k.tcp.and_then(|t| t.delack_max_us))),
        (
            "d3",
            if c.table.classes[usize::from(k.index)].flags & paceline_common::maps::CLASS_D3 != 0 {
                "on".into()
            } else {
                "off".into()
            },
        ),
    ]
}

fn summary(fields: &[(&'static str, String)]) -> String {
    fields
        .iter()
        .filter(|(k, v)| *k != "position" && v != "-" && v != "off")
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every difference from `old` to `new`, one line each (empty: the same policy).
pub fn diff(old: &Compiled, new: &Compiled) -> Vec<String> {
    let mut out = Vec::new();
    let (a, b) = (view(old), view(new));
    let am: BTreeMap<&str, &str> = a.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let bm: BTreeMap<&str, &str> = b.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut keys: Vec<&str> = a.iter().map(|(k, _)| k.as_str()).collect();
    keys.extend(b.iter().map(|(k, _)| k.as_str()).filter(|k| !am.contains_key(k)));
    for k in keys {
        match (am.get(k), bm.get(k)) {
            (Some(x), Some(y)) if x != y => out.push(format!("{k}: {x} -> {y}")),
            (Some(x), None) => out.push(format!("{k}: {x} -> (none)")),
            (None, Some(y)) => out.push(format!("{k}: (none) -> {y}")),
            _ => {}
        }
    }

    // Levels by name.
    let lv = |c: &Compiled| -> Vec<(String, Vec<(&'static str, String)>)> {
        c.levels
            .iter()
            .enumerate()
            .map(|(i, l)| (l.name.clone(), level_fields(l, i)))
            .collect()
    };
    named("levels", &lv(old), &lv(new), &mut out);
    // Classes by name.
    let cl = |c: &Compiled| -> Vec<(String, Vec<(&'static str, String)>)> {
        c.classes
            .iter()
            .map(|k| (k.name.clone(), class_fields(c, k)))
            .collect()
    };
    named("classes", &cl(old), &cl(new), &mut out);

    // Rules in order: a rule is its conditions and its class.
    let rules = |c: &Compiled| -> Vec<String> {
        c.rules
            .iter()
            .map(|r| format!("{} -> {}", r.matches, r.class))
            .collect()
    };
    let (ra, rb) = (rules(old), rules(new));
    if ra != rb {
        if ra.len() == rb.len() {
            for (i, (x, y)) in ra.iter().zip(&rb).enumerate() {
                if x != y {
                    out.push(format!("rules[{i}]: {x}  =>  {y}"));
                }
            }
        } else {
            // Insertions shift every later rule: list what is only on one side.
            for (i, x) in ra.iter().enumerate() {
                if !rb.contains(x) {
                    out.push(format!("rules: removed [{i}] {x}"));
                }
            }
            for (i, y) in rb.iter().enumerate() {
                if !ra.contains(y) {
                    out.push(format!("rules: added [{i}] {y}"));
                }
            }
            if out.iter().all(|l| !l.starts_with("rules")) {
                out.push(format!("rules: reordered ({} -> {} rules)", ra.len(), rb.len()));
            }
        }
    }
    out
}

type Fields = Vec<(&'static str, String)>;

fn named(section: &str, a: &[(String, Fields)], b: &[(String, Fields)], out: &mut Vec<String>) {
    let bm: BTreeMap<&str, &Fields> = b.iter().map(|(n, f)| (n.as_str(), f)).collect();
    let am: BTreeMap<&str, &Fields> = a.iter().map(|(n, f)| (n.as_str(), f)).collect();
    for (name, fa) in a {
        match bm.get(name.as_str()) {
            None => out.push(format!("{section}.{name}: removed")),
            Some(fb) => {
                for ((k, x), (_, y)) in fa.iter().zip(fb.iter()) {
                    if x != y {
                        out.push(format!("{section}.{name}.{k}: {x} -> {y}"));
                    }
                }
            }
        }
    }
    for (name, fb) in b {
        if !am.contains_key(name.as_str()) {
            out.push(format!("{section}.{name}: added ({})", summary(fb)));
        }
    }
}

/// A short summary of a change list for one log line: `3 changes: classes.web: added, ...`.
pub fn one_line(changes: &[String]) -> String {
    match changes.len() {
        0 => "no change to what is enforced".into(),
        1 => changes[0].clone(),
        n => format!(
            "{n} changes: {}{}",
            changes[..n.min(3)].join("; "),
            if n > 3 { "; ..." } else { "" }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{fake_host, ok};
    use crate::{CompileContext, EnforcementMode, compile};

    const BASE: &str = r#"
apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [eth0]
  levels: [{name: hi, priority: 5, rate: 100Mbit}, {name: lo, priority: 0}]
  classes:
    - {name: a, level: hi, flow_rate: 10Mbit}
    - {name: b, level: lo}
  rules: [{class: a, protocol: tcp, dst_port: 80}]
  default_class: b
"#;

    fn c(text: &str) -> Compiled {
        let ctx = CompileContext {
            mode: EnforcementMode::Fq,
            previous: None,
            all_routes_managed: false,
        };
        compile(&ok(text, &fake_host()), &ctx).unwrap()
    }

    #[test]
    fn same_policy_in_another_layout_is_the_same() {
        let other = BASE.replace("  rules:", "  # a comment\n  rules:");
        assert!(diff(&c(BASE), &c(&other)).is_empty());
    }

    #[test]
    fn classes_are_matched_by_name_not_position() {
        // The same two classes listed the other way round: nothing changed.
        let swapped = BASE.replace(
            "    - {name: a, level: hi, flow_rate: 10Mbit}\n    - {name: b, level: lo}",
            "    - {name: b, level: lo}\n    - {name: a, level: hi, flow_rate: 10Mbit}",
        );
        assert!(
            diff(&c(BASE), &c(&swapped)).is_empty(),
            "{:?}",
            diff(&c(BASE), &c(&swapped))
        );
        // A rate change names the class and shows units, never bytes/s or indices.
        let faster = BASE.replace("flow_rate: 10Mbit", "flow_rate: 20Mbit");
        assert_eq!(
            diff(&c(BASE), &c(&faster)),
            ["classes.a.flow_rate: 10.0 Mbit/s -> 20.0 Mbit/s"]
        );
    }

    #[test]
    fn added_removed_and_rule_changes() {
        let new = BASE
            .replace(
                "    - {name: b, level: lo}",
                "    - {name: b, level: lo}\n    - {name: web, level: lo, class_rate: 1Gbit}",
            )
            .replace("dst_port: 80}", "dst_port: 8080}");
        let d = diff(&c(BASE), &c(&new));
        assert_eq!(
            d,
            [
                "classes.web: added (level lo, class_rate 1.00 Gbit/s)",
                "rules[0]: tcp dst_port 80 -> a  =>  tcp dst_port 8080 -> a",
            ]
        );
        let back = diff(&c(&new), &c(BASE));
        assert!(back.contains(&"classes.web: removed".to_string()), "{back:?}");
        for line in d.iter().chain(&back) {
            assert!(!line.contains("skb_priority") && !line.contains("index") && !line.contains("bytes"));
        }
    }
}
