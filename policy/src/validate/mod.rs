//! Stage 2: the validated policy (ripgrep's `HiArgs`): units parsed, ranges checked, names
//! resolved to indices, address lists expanded, host facts resolved through [`HostFacts`].
//!
//! Validation never stops at the first problem: every error is collected with the path of the
//! field and, through the [`LineIndex`], its line. Problems that do not make the policy wrong
//! but probably not what the operator meant are warnings.
//!
//! # Layout
//! - [`model`]: the validated policy ([`Validated`]) and its parts.
//! - `diag`: `Diag`, which collects every error and warning with its line.
//! - [`fields`]: parsers of single values (rates, sizes, durations, ports, marks, addresses,
//!   names, factors, protocols) with the bounds they are checked against.
//! - `levels`, `classes`, `rules`, `d3`, `dasr`: one section of `spec` each; `codel`: the `codel`
//!   mapping of classes and levels, and where CoDel has a queue to act on.
//! - here: `validate`, the top-level fields (interfaces, horizon, flow table, link rate,
//!   QJump network) and the checks across sections.

mod classes;
mod codel;
mod d3;
mod dasr;
mod diag;
pub mod fields;
mod levels;
pub mod model;
mod rules;

pub use model::*;

use paceline_common::qjump::Network;

use super::enforcement::EnforcementRequest;
use super::error::PolicyError;
use super::host::HostFacts;
use super::lines::LineIndex;
use super::raw;
use super::units;
use diag::Diag;
use fields::{Bounds, RATE, check_name, duration_in, int_range, lookup, rate_in, size_in};

pub const HORIZON: Bounds = Bounds {
    min: 1_000_000,
    max: 10_000_000_000,
    text: "1ms..=10s",
};
pub const MAX_PACKET: Bounds = Bounds {
    min: 64,
    max: 65_536,
    text: "64B..=64KiB",
};
pub const SWITCH_DELAY: Bounds = Bounds {
    min: 0,
    max: 1_000_000_000,
    text: "0s..=1s",
};
pub const HOSTS: (i64, i64) = (1, 1_000_000);
pub const FLOW_TABLE: (i64, i64) = (1024, 16_777_216);

/// Validates a parsed file. `file`, `hash` and `lines` describe its text.
pub(crate) fn validate(
    f: &raw::PolicyFile,
    file: &str,
    hash: String,
    lines: &LineIndex,
    host: &dyn HostFacts,
) -> Result<Validated, Vec<PolicyError>> {
    let mut d = Diag::new(file, lines);
    let r = validate_into(&mut d, f, file, hash, host);
    // In file order (stable: problems on one line keep the order they were found in).
    let by_line = |e: &PolicyError| e.line.unwrap_or(usize::MAX);
    d.errors.sort_by_key(by_line);
    d.warnings.sort_by_key(by_line);
    match r {
        Some(mut v) if d.errors.is_empty() => {
            v.warnings = d.warnings;
            Ok(v)
        }
        _ => Err(d.errors),
    }
}

fn validate_into(
    d: &mut Diag,
    f: &raw::PolicyFile,
    file: &str,
    hash: String,
    host: &dyn HostFacts,
) -> Option<Validated> {
    let spec = &f.spec;

    if f.api_version != raw::API_VERSION {
        d.error(
            "apiVersion",
            format!(
                "{:?} is not supported; valid: {:?}",
                f.api_version,
                raw::API_VERSION
            ),
        );
    }
    if f.kind != raw::KIND {
        d.error(
            "kind",
            format!("{:?} is not supported; valid: {:?}", f.kind, raw::KIND),
        );
    }
    if let Some(n) = &f.metadata.name
        && let Err(m) = check_name(n)
    {
        d.error("metadata.name", m);
    }

    let (interfaces, interfaces_auto) = interfaces(d, &spec.interfaces, host);
    let horizon_ns = d
        .check("spec.horizon", duration_in(&spec.horizon.0, HORIZON))
        .unwrap_or(0);
    let flow_table_size = d
        .check(
            "spec.flow_table_size",
            int_range(spec.flow_table_size, FLOW_TABLE.0, FLOW_TABLE.1),
        )
        .unwrap_or(0) as u32;
    let spec_link_rate = spec
        .link_rate
        .as_ref()
        .and_then(|r| d.check("spec.link_rate", rate_in(&r.0, RATE)));

    let qjump = spec.qjump.as_ref().and_then(|q| {
        let n = d.check("spec.qjump.hosts", int_range(q.hosts, HOSTS.0, HOSTS.1));
        let p = d.check("spec.qjump.max_packet", size_in(&q.max_packet.0, MAX_PACKET));
        let r = d.check("spec.qjump.link_rate", rate_in(&q.link_rate.0, RATE));
        let e = d.check(
            "spec.qjump.switch_delay",
            duration_in(&q.switch_delay.0, SWITCH_DELAY),
        );
        Some(Network {
            hosts: n? as u64,
            max_packet: p?,
            link_rate: r?,
            switch_delay_ns: e?,
        })
    });

    let levels = levels::levels(d, &spec.levels, spec.qjump.is_some(), qjump.as_ref());
    let level_names: Vec<&str> = spec.levels.iter().map(|l| l.name.as_str()).collect();

    let classes = classes::classes(d, &spec.classes, &level_names, &levels);
    let class_names: Vec<&str> = spec.classes.iter().map(|c| c.name.as_str()).collect();
    let default_class = lookup(
        d,
        "spec.default_class",
        &spec.default_class,
        &class_names,
        "class",
        "classes",
    );

    let rules = rules::rules(d, &spec.rules, &class_names, host);

    // The host's link rate: spec.link_rate, else the slowest interface, else QJump's R.
    let iface_rate = interfaces
        .iter()
        .filter_map(|i| host.link_rate(i).map(|r| (r, i.clone())))
        .min_by_key(|(r, _)| *r);
    let link_rate = match (spec_link_rate, &iface_rate, &qjump) {
        (Some(r), _, _) => Some(LinkRate {
            rate: r,
            source: LinkRateSource::Spec,
        }),
        (None, Some((r, i)), _) => Some(LinkRate {
            rate: *r,
            source: LinkRateSource::Interface(i.clone()),
        }),
        (None, None, Some(q)) => Some(LinkRate {
            rate: q.link_rate,
            source: LinkRateSource::QJump,
        }),
        _ => None,
    };
    if let (Some(r), Some((ir, i))) = (spec_link_rate, &iface_rate)
        && r > *ir
    {
        d.warn(
            "spec.link_rate",
            format!(
                "{} is above the speed {i} reports ({}); guarantees computed against it may not hold",
                units::fmt_rate(r),
                units::fmt_rate(*ir)
            ),
        );
    }

    let enforcement = EnforcementRequest::from(spec.enforcement);
    if enforcement == EnforcementRequest::Htb && link_rate.is_none() {
        let m = "htb needs the link rate for its root class; set spec.link_rate (the kernel reports no speed for these interfaces)";
        if host.is_offline() {
            d.warn("spec.enforcement", m)
        } else {
            d.error("spec.enforcement", m)
        }
    }

    let d3 = d3::d3_spec(d, spec, host);
    let dasr = dasr::dasr_spec(d, spec, &interfaces, spec_link_rate, host);

    // Everything below needs the parts above to be valid.
    let (Some(levels), Some(classes), Some(default_class), Some(rules), Some(d3), Some(dasr)) =
        (levels, classes, default_class, rules, d3, dasr)
    else {
        return None;
    };
    if d3.is_none() {
        for (i, c) in classes.iter().enumerate() {
            if c.d3.is_some() {
                d.error(
                    format!("spec.classes[{i}].d3"),
                    "needs spec.d3 (add `d3: {}` to spec to turn D3 on for this host)",
                );
            }
        }
    }
    levels::fits(d, &levels, link_rate.as_ref());
    cross_checks(d, &levels, &classes, &rules, default_class);
    codel::cross_checks(d, horizon_ns, &levels, &classes);

    Some(Validated {
        lines: Default::default(),
        file: file.to_string(),
        hash,
        name: f.metadata.name.clone(),
        description: f.metadata.description.clone(),
        interfaces,
        interfaces_auto,
        enforcement,
        horizon_ns,
        flow_table_size,
        track_flows: spec.track_flows,
        link_rate,
        qjump,
        levels,
        classes,
        rules: rules.into(),
        default_class,
        d3,
        dasr,
        warnings: Vec::new(),
    })
}

fn interfaces(d: &mut Diag, list: &[String], host: &dyn HostFacts) -> (Vec<String>, bool) {
    if list.is_empty() {
        d.error(
            "spec.interfaces",
            "the list is empty; name the interfaces (e.g. [eth0]) or write [auto]",
        );
        return (Vec::new(), false);
    }
    if list.iter().any(|i| i == "auto") {
        if list.len() > 1 {
            d.error(
                "spec.interfaces",
                "\"auto\" must be the only entry; write [auto] or name every interface",
            );
            return (Vec::new(), true);
        }
        let found = host.default_route_interfaces();
        if found.is_empty() {
            if host.is_offline() {
                d.warn("spec.interfaces", "auto is resolved on the host (the interfaces of the default routes); offline it is empty");
            } else {
                d.error(
                    "spec.interfaces",
                    "auto: this host has no default route (IPv4 or IPv6); name the interfaces instead",
                );
            }
        }
        return (found, true);
    }
    let mut out: Vec<String> = Vec::new();
    for (i, name) in list.iter().enumerate() {
        let path = format!("spec.interfaces[{i}]");
        let valid = !name.is_empty()
            && name.len() < 16
            && !name
                .chars()
                .any(|c| c == '/' || c == ':' || c.is_whitespace() || c == '\0');
        if !valid {
            d.error(
                path,
                format!("{name:?} is not an interface name (1 to 15 characters, no \"/\", \":\" or spaces)"),
            );
        } else if out.contains(name) {
            d.error(path, format!("{name:?} is listed twice"));
        } else if !host.interface_exists(name) {
            d.error(path, format!("no interface named {name:?} on this host (in this network namespace); check the name or use --offline"));
        } else {
            out.push(name.clone());
        }
    }
    (out, false)
}

fn cross_checks(d: &mut Diag, levels: &[Level], classes: &[Class], rules: &[RuleSpec], default_class: usize) {
    // Per class, its rules and those sock_ops can see, in one pass over the rules (a pass per
    // class was most of validating 1,000 classes' 100,000 rules).
    let mut used = vec![(0usize, 0usize); classes.len()];
    for r in rules {
        used[r.class].0 += 1;
        if !r.invisible_to_sockops() {
            used[r.class].1 += 1;
        }
    }
    // Unused classes and levels.
    for (i, c) in classes.iter().enumerate() {
        if i != default_class && used[i].0 == 0 {
            d.warn(
                format!("spec.classes[{i}]"),
                format!(
                    "class {:?} is used by no rule and is not the default class",
                    c.name
                ),
            );
        }
    }
    for (i, l) in levels.iter().enumerate() {
        if !classes.iter().any(|c| c.level == i) {
            d.warn(
                format!("spec.levels[{i}]"),
                format!("level {:?} has no class", l.name),
            );
        }
    }
    // Settings applied by sock_ops to a class it can never select.
    for (i, c) in classes.iter().enumerate() {
        let sockops = c.flow_rate.is_some() || c.tcp.is_some();
        let (mine, visible) = used[i];
        if sockops && i != default_class && mine > 0 && visible == 0 {
            let what = match (c.tcp.is_some(), c.flow_rate.is_some()) {
                (true, true) => "tcp settings and flow_rate",
                (true, false) => "tcp settings",
                _ => "flow_rate",
            };
            d.warn(
                format!("spec.classes[{i}]"),
                format!(
                    "class {:?}: its {what} are applied by sock_ops at connection start, but every rule of the class matches on dscp, cgroup or mark, which sock_ops cannot see; there its connections fall through to later rules or the default class",
                    c.name
                ),
            );
        }
    }
    // Rules after a rule that matches everything.
    if let Some(first) = rules.iter().position(RuleSpec::matches_everything) {
        let origin = rules[first].origin;
        let mut warned = Vec::new();
        for r in &rules[first + 1..] {
            if !warned.contains(&r.origin) && r.origin != origin {
                warned.push(r.origin);
                d.warn(
                    r.path(),
                    format!("is never reached: spec.rules[{origin}] matches all traffic before it"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::tests::{fake_host, ok};

    #[test]
    fn rules_after_a_rule_that_matches_everything_are_never_reached() {
        let text = r#"
apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [eth0]
  levels: [{name: all, priority: 0}]
  classes: [{name: a, level: all}, {name: b, level: all}]
  rules: [{class: a}, {class: b, protocol: tcp}]
  default_class: b
"#;
        let w: Vec<String> = ok(text, &fake_host())
            .warnings
            .iter()
            .map(|w| w.to_string())
            .collect();
        assert_eq!(
            w,
            ["test.yaml:8: spec.rules[1]: is never reached: spec.rules[0] matches all traffic before it"]
        );
    }
}
