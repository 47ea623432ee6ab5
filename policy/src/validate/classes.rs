//! `spec.classes`: names, levels, flow and class rates, TCP timers (what the kernel accepts),
//! and a class's D3 defaults.

use std::collections::HashMap;

use paceline_common::maps::MAX_CLASSES;

use super::d3::{D3_DEADLINE, D3_SIZE};
use super::diag::Diag;
use super::fields::{Bounds, RATE, TransposeOk as _, check_name, duration_in, lookup, rate_in, size_in};
use super::model::{Class, ClassD3, Level, TcpSettings};
use crate::raw::{self, Scalar};
use crate::units;

/// TCP_BPF_RTO_MIN and TCP_BPF_DELACK_MAX: the kernel refuses more than 200 ms (TCP_RTO_MIN,
/// TCP_DELACK_MAX) and, after rounding up to jiffies, less than 2 jiffies (TCP_TIMEOUT_MIN).
pub const TCP_TIMER: Bounds = Bounds {
    min: 1_000,
    max: 200_000_000,
    text: "1us..=200ms",
};

fn tcp_timer(d: &mut Diag, path: &str, s: &Scalar) -> Option<u32> {
    let ns = d.check(path, duration_in(s, TCP_TIMER))?;
    if ns % 1_000 != 0 {
        d.error(
            path,
            format!("{s} is not a whole number of microseconds (the kernel takes microseconds)"),
        );
        return None;
    }
    if ns <= 1_000_000 {
        d.warn(
            path,
            format!("{s} is at most one jiffy even at HZ=1000; the kernel rejects values below 2 jiffies (counted in sockopt_errors); use more than 1ms, or more than 4ms for HZ=250 kernels"),
        );
    } else if ns <= 4_000_000 {
        d.warn(
            path,
            format!("{s} is below 2 jiffies on kernels with HZ=250, which reject it (counted in sockopt_errors); it works with HZ=1000"),
        );
    }
    Some((ns / 1_000) as u32)
}

pub(super) fn classes(
    d: &mut Diag,
    raw: &[raw::Class],
    level_names: &[&str],
    levels: &Option<Vec<Level>>,
) -> Option<Vec<Class>> {
    if raw.is_empty() || raw.len() > MAX_CLASSES {
        d.error(
            "spec.classes",
            format!("{} classes; valid: 1..={MAX_CLASSES}", raw.len()),
        );
        return None;
    }
    let mut out = Vec::new();
    let mut ok = true;
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, c) in raw.iter().enumerate() {
        let p = format!("spec.classes[{i}]");
        let mut good = true;
        if let Err(m) = check_name(&c.name) {
            d.error(format!("{p}.name"), m);
            good = false;
        } else if let Some(j) = seen.insert(&c.name, i) {
            d.error(
                format!("{p}.name"),
                format!(
                    "{:?} is already the name of spec.classes[{j}]; class names must be unique",
                    c.name
                ),
            );
            good = false;
        }
        let level = lookup(d, &format!("{p}.level"), &c.level, level_names, "level", "levels");
        let flow_rate = c
            .flow_rate
            .as_ref()
            .map(|r| d.check(&format!("{p}.flow_rate"), rate_in(&r.0, RATE)));
        let class_rate = c
            .class_rate
            .as_ref()
            .map(|r| d.check(&format!("{p}.class_rate"), rate_in(&r.0, RATE)));
        let tcp = c.tcp.as_ref().map(|t| {
            let rto = t
                .rto_min
                .as_ref()
                .map(|v| tcp_timer(d, &format!("{p}.tcp.rto_min"), &v.0));
            let del = t
                .delack_max
                .as_ref()
                .map(|v| tcp_timer(d, &format!("{p}.tcp.delack_max"), &v.0));
            Some(TcpSettings {
                rto_min_us: rto.transpose_ok()?,
                delack_max_us: del.transpose_ok()?,
            })
        });
        let (Some(level), Some(flow_rate), Some(class_rate), Some(tcp), true) = (
            level,
            flow_rate.transpose_ok(),
            class_rate.transpose_ok(),
            tcp.transpose_ok(),
            good,
        ) else {
            ok = false;
            continue;
        };
        if let (Some(f), Some(c)) = (flow_rate, class_rate)
            && f > c
        {
            d.warn(
                format!("{p}.flow_rate"),
                format!(
                    "{} is above the class_rate {}: a single flow can never reach it",
                    units::fmt_rate(f),
                    units::fmt_rate(c)
                ),
            );
        }
        if let (Some(cr), Some(levels)) = (class_rate, levels)
            && let Some(lr) = levels.get(level).and_then(|l| l.rate)
            && cr > lr
        {
            d.warn(
                format!("{p}.class_rate"),
                format!(
                    "{} is above the rate of level {:?} ({}); the level's rate binds",
                    units::fmt_rate(cr),
                    levels[level].name,
                    units::fmt_rate(lr)
                ),
            );
        }
        if let Some(f) = flow_rate
            && f > u64::from(u32::MAX)
        {
            d.warn(
                    format!("{p}.flow_rate"),
                    format!(
                        "{}: sock_ops sets SO_MAX_PACING_RATE, a 32-bit byte rate, so TCP sockets are paced at most at {} (the tc clock applies the full rate)",
                        units::fmt_rate(f),
                        units::fmt_rate(u64::from(u32::MAX))
                    ),
                );
        }
        if tcp.is_some_and(|t| t.rto_min_us.is_none() && t.delack_max_us.is_none()) {
            d.warn(
                format!("{p}.tcp"),
                "is empty; remove it or set rto_min / delack_max",
            );
        }
        let d3 = match &c.d3 {
            None => None,
            Some(k) => {
                let dl = k
                    .deadline
                    .as_ref()
                    .map(|v| d.check(&format!("{p}.d3.deadline"), duration_in(&v.0, D3_DEADLINE)));
                let sz = k
                    .size
                    .as_ref()
                    .map(|v| d.check(&format!("{p}.d3.size"), size_in(&v.0, D3_SIZE)));
                match (dl, sz) {
                    (None, None) => Some(ClassD3 { default: None }),
                    (Some(Some(dl)), Some(Some(sz))) => Some(ClassD3 {
                        default: Some((dl, sz)),
                    }),
                    (Some(_), None) | (None, Some(_)) => {
                        d.error(format!("{p}.d3"), "deadline and size go together: a deadline needs the transfer's size to compute the rate it requires");
                        ok = false;
                        continue;
                    }
                    _ => {
                        ok = false;
                        continue;
                    }
                }
            }
        };
        let codel = match &c.codel {
            None => None,
            Some(k) => match super::codel::codel(d, &format!("{p}.codel"), k) {
                Some(k) => Some(k),
                None => {
                    ok = false;
                    continue;
                }
            },
        };
        out.push(Class {
            name: c.name.clone(),
            level,
            flow_rate,
            class_rate,
            tcp,
            d3,
            codel,
        });
    }
    ok.then_some(out)
}

#[cfg(test)]
mod tests {
    use crate::tests::{errors, fake_host, ok};

    const BASE: &str = r#"
apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [eth0]
  levels: [{name: all, priority: 0}]
  classes:
    - {name: x, level: all, tcp: {rto_min: 3ms, delack_max: 10ms}, flow_rate: 2Gbit, class_rate: 1Gbit}
  default_class: x
"#;

    #[test]
    fn tcp_timers_and_rates() {
        let v = ok(BASE, &fake_host());
        let tcp = v.classes[0].tcp.expect("tcp");
        assert_eq!((tcp.rto_min_us, tcp.delack_max_us), (Some(3_000), Some(10_000)));
        let w: Vec<String> = v.warnings.iter().map(|w| w.to_string()).collect();
        assert_eq!(
            w,
            [
                "test.yaml:8: spec.classes[0].tcp.rto_min: \"3ms\" is below 2 jiffies on kernels with HZ=250, which reject it (counted in sockopt_errors); it works with HZ=1000",
                "test.yaml:8: spec.classes[0].flow_rate: 2.00 Gbit/s is above the class_rate 1.00 Gbit/s: a single flow can never reach it",
            ]
        );
        let e = errors(
            &BASE.replace("3ms", "1500ns").replace("10ms", "300ms"),
            &fake_host(),
        );
        assert_eq!(
            e,
            [
                "test.yaml:8: spec.classes[0].tcp.rto_min: \"1500ns\" is not a whole number of microseconds (the kernel takes microseconds)",
                "test.yaml:8: spec.classes[0].tcp.delack_max: \"300ms\" is out of range; valid: 1us..=200ms",
            ]
        );
    }

    #[test]
    fn a_d3_deadline_needs_a_size() {
        let text =
            BASE.replace("class_rate: 1Gbit}", "class_rate: 1Gbit, d3: {deadline: 20ms}}") + "  d3: {}\n";
        assert_eq!(
            errors(&text, &fake_host()),
            [
                "test.yaml:8: spec.classes[0].d3: deadline and size go together: a deadline needs the transfer's size to compute the rate it requires"
            ]
        );
    }
}
