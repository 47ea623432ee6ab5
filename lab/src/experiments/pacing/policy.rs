//! The one policy the sender's agent runs for the whole experiment, a class per point.

use std::fmt::Write as _;

use super::*;

/// The policy with every point's classes.
pub(crate) fn policy(ifaces: &[&str], points: &[Point], level_rate: Option<u64>) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "apiVersion: paceline/v1\nkind: Policy\nmetadata:\n  name: plexp-pacing\n  \
         description: one class per measurement point of the pacing experiment\nspec:\n  \
         interfaces: [{}]\n  enforcement: auto\n  link_rate: 10Gbit\n  horizon: 1s\n  levels:",
        ifaces.join(", ")
    );
    if let Some(r) = level_rate {
        let _ = writeln!(s, "    - name: capped\n      priority: 1\n      rate: {r}bit");
    }
    let _ = writeln!(s, "    - name: free\n      priority: 0\n  classes:");
    for p in points {
        for g in &p.groups {
            let level = if p.kind == Kind::Level { "capped" } else { "free" };
            let _ = writeln!(s, "    - name: {}\n      level: {level}", g.class);
            match (p.kind, p.rate_bps) {
                (Kind::Flow, Some(r)) => {
                    let _ = writeln!(s, "      flow_rate: {r}bit");
                }
                (Kind::Class, Some(r)) => {
                    let _ = writeln!(s, "      class_rate: {r}bit");
                }
                _ => {}
            }
        }
    }
    let _ = writeln!(s, "    - name: other\n      level: free\n  rules:");
    for p in points {
        for g in &p.groups {
            let _ = writeln!(
                s,
                "    - class: {}\n      protocol: {}\n      dst_port: {}",
                g.class,
                p.proto.as_str(),
                g.port
            );
        }
    }
    let _ = writeln!(s, "  default_class: other");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The experiment's one policy passes the agent's validator, and each point's classes get
    /// the point's rate at the scope the point measures, and a rule on the point's port.
    #[test]
    fn the_policy_carries_every_point() {
        let (points, level_rate) = plan(false);
        let c = crate::experiments::harness::compile_offline(
            "pacing",
            &policy(&["veth0", "veth1"], &points, level_rate),
        );
        for p in &points {
            for g in &p.groups {
                let class = c
                    .classes
                    .iter()
                    .find(|k| k.name == g.class)
                    .unwrap_or_else(|| panic!("no class {}", g.class));
                let bytes = p.rate_bps.map(|r| r / 8);
                match p.kind {
                    Kind::Flow => assert_eq!(class.flow_rate, bytes, "{}", g.class),
                    Kind::Class => assert_eq!(class.class_rate, bytes, "{}", g.class),
                    Kind::Level => assert_eq!(c.levels[class.level].rate, bytes, "{}", g.class),
                    Kind::Unpaced => {
                        assert_eq!((class.flow_rate, class.class_rate), (None, None));
                        assert_eq!(c.levels[class.level].rate, None, "{}", g.class);
                    }
                }
                let rule = format!("{} dst_port {}", p.proto.as_str(), g.port);
                assert!(
                    c.rules
                        .iter()
                        .any(|r| *r.class == *g.class && r.matches.contains(&rule)),
                    "{}: no rule {rule}",
                    g.class
                );
            }
        }
    }
}
