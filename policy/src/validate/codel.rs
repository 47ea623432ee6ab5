//! `codel` of classes and levels: target and interval (with their defaults, RFC 8289's) and
//! the checks across sections: CoDel needs a departure queue (a class rate, a rate-limited
//! level) and a horizon beyond its target.

use super::diag::Diag;
use super::fields::{Bounds, duration_in};
use super::model::{Class, Codel, Level};
use crate::raw;
use crate::units;

pub const CODEL_TARGET: Bounds = Bounds {
    min: 1_000,
    max: 1_000_000_000,
    text: "1us..=1s",
};
/// At most 4 s: the datapath keeps intervals in 32-bit nanoseconds.
pub const CODEL_INTERVAL: Bounds = Bounds {
    min: 100_000,
    max: 4_000_000_000,
    text: "100us..=4s",
};
/// RFC 8289's defaults.
pub const DEFAULT_TARGET_NS: u64 = 5_000_000;
pub const DEFAULT_INTERVAL_NS: u64 = 100_000_000;

/// One `codel` mapping at `path`.
pub(super) fn codel(d: &mut Diag, path: &str, c: &raw::Codel) -> Option<Codel> {
    let target = match &c.target {
        Some(t) => d.check(&format!("{path}.target"), duration_in(&t.0, CODEL_TARGET)),
        None => Some(DEFAULT_TARGET_NS),
    };
    let interval = match &c.interval {
        Some(t) => d.check(&format!("{path}.interval"), duration_in(&t.0, CODEL_INTERVAL)),
        None => Some(DEFAULT_INTERVAL_NS),
    };
    let (target, interval) = (target?, interval?);
    if target >= interval {
        d.error(
            path,
            format!(
                "target {} must be below interval {}: CoDel signals when the delay stays above target for a whole interval (RFC 8289 suggests a target of 5-10% of the interval)",
                units::fmt_ns(target),
                units::fmt_ns(interval)
            ),
        );
        return None;
    }
    Some(Codel {
        target_ns: target as u32,
        interval_ns: interval as u32,
        ecn: c.ecn,
    })
}

/// CoDel where it has a queue to act on, with a target the horizon leaves room for.
pub(super) fn cross_checks(d: &mut Diag, horizon_ns: u64, levels: &[Level], classes: &[Class]) {
    let target_vs_horizon = |d: &mut Diag, path: String, c: &Codel| {
        if horizon_ns != 0 && u64::from(c.target_ns) >= horizon_ns {
            d.error(
                path,
                format!(
                    "target {} is not below spec.horizon ({}): packets are dropped at the horizon before their delay reaches the target",
                    units::fmt_ns(u64::from(c.target_ns)),
                    units::fmt_ns(horizon_ns)
                ),
            );
        }
    };
    for (i, l) in levels.iter().enumerate() {
        let Some(c) = &l.codel else { continue };
        let p = format!("spec.levels[{i}].codel");
        if l.rate.is_none() {
            d.error(
                p.clone(),
                format!(
                    "level {:?} is not rate-limited, so it has no departure queue for CoDel to act on; give it a factor or a rate, or remove codel",
                    l.name
                ),
            );
        }
        target_vs_horizon(d, p, c);
    }
    for (i, k) in classes.iter().enumerate() {
        let Some(c) = &k.codel else { continue };
        let p = format!("spec.classes[{i}].codel");
        if k.class_rate.is_none() {
            d.error(
                p.clone(),
                format!(
                    "class {:?} has no class_rate, so it has no departure queue for CoDel to act on (a flow_rate paces each flow alone, and TCP already reacts to its own queue); set class_rate, or remove codel",
                    k.name
                ),
            );
        }
        target_vs_horizon(d, p, c);
    }
}

#[cfg(test)]
mod tests {
    use crate::tests::{errors, fake_host, ok};

    const BASE: &str = r#"
apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [eth0]
  levels:
    - {name: web, priority: 3, rate: 1Gbit, codel: {target: 1ms, interval: 20ms, ecn: false}}
    - {name: bulk, priority: 0}
  classes:
    - {name: x, level: web, class_rate: 100Mbit, codel: {}}
    - {name: y, level: bulk}
  rules: [{class: x, protocol: tcp, dst_port: 80}]
  default_class: y
"#;

    #[test]
    fn defaults_are_rfc_8289s_and_ecn_is_on() {
        let v = ok(BASE, &fake_host());
        let c = v.classes[0].codel.expect("codel");
        assert_eq!(
            (c.target_ns, c.interval_ns, c.ecn),
            (5_000_000, 100_000_000, true)
        );
        let l = v.levels[0].codel.expect("codel");
        assert_eq!(
            (l.target_ns, l.interval_ns, l.ecn),
            (1_000_000, 20_000_000, false)
        );
        assert_eq!(v.levels[1].codel, None, "off by default");
        assert_eq!(v.classes[1].codel, None);
    }

    #[test]
    fn codel_needs_a_queue_and_a_target_below_interval_and_horizon() {
        let text = BASE
            .replace(
                "{name: y, level: bulk}",
                "{name: y, level: bulk, codel: {target: 30ms, interval: 20ms}}",
            )
            .replace(
                "class_rate: 100Mbit, codel: {}",
                "class_rate: 100Mbit, codel: {target: 0s, interval: 5s}",
            )
            .replace("target: 1ms, interval: 20ms", "target: 200ms, interval: 20ms");
        assert_eq!(
            errors(&text, &fake_host()),
            [
                "test.yaml:7: spec.levels[0].codel: target 200ms must be below interval 20ms: CoDel signals when the delay stays above target for a whole interval (RFC 8289 suggests a target of 5-10% of the interval)",
                "test.yaml:10: spec.classes[0].codel.target: \"0s\" is out of range; valid: 1us..=1s",
                "test.yaml:10: spec.classes[0].codel.interval: \"5s\" is out of range; valid: 100us..=4s",
                "test.yaml:11: spec.classes[1].codel: target 30ms must be below interval 20ms: CoDel signals when the delay stays above target for a whole interval (RFC 8289 suggests a target of 5-10% of the interval)",
            ]
        );
        // Valid each, but without a queue or beyond the horizon.
        let text = BASE
            .replace(
                "{name: bulk, priority: 0}",
                "{name: bulk, priority: 0, codel: {}}",
            )
            .replace("{name: y, level: bulk}", "{name: y, level: bulk, codel: {}}")
            .replace("codel: {}}", "codel: {target: 50ms, interval: 1s}}")
            + "  horizon: 20ms\n";
        assert_eq!(
            errors(&text, &fake_host()),
            [
                "test.yaml:8: spec.levels[1].codel: level \"bulk\" is not rate-limited, so it has no departure queue for CoDel to act on; give it a factor or a rate, or remove codel",
                "test.yaml:8: spec.levels[1].codel: target 50ms is not below spec.horizon (20ms): packets are dropped at the horizon before their delay reaches the target",
                "test.yaml:10: spec.classes[0].codel: target 50ms is not below spec.horizon (20ms): packets are dropped at the horizon before their delay reaches the target",
                "test.yaml:11: spec.classes[1].codel: class \"y\" has no class_rate, so it has no departure queue for CoDel to act on (a flow_rate paces each flow alone, and TCP already reacts to its own queue); set class_rate, or remove codel",
                "test.yaml:11: spec.classes[1].codel: target 50ms is not below spec.horizon (20ms): packets are dropped at the horizon before their delay reaches the target",
            ]
        );
    }
}
