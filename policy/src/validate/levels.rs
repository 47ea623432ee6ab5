//! `spec.levels`: names, priorities (unique, decreasing down the list), factors or rates
//! (factors need `spec.qjump` and must not decrease), DSCP/PCP; and whether the rate-limited
//! levels fit the host's link ([`fits`]).

use std::collections::HashMap;

use paceline_common::maps::MAX_LEVELS;
use paceline_common::qjump::Network;

use super::diag::Diag;
use super::fields::{RATE, TransposeOk as _, check_name, factor, int_range, rate_in};
use super::model::{Level, Limit, LinkRate};
use crate::raw;
use crate::units;

pub(super) fn levels(
    d: &mut Diag,
    raw: &[raw::Level],
    has_qjump: bool,
    net: Option<&Network>,
) -> Option<Vec<Level>> {
    if raw.is_empty() || raw.len() > MAX_LEVELS {
        d.error(
            "spec.levels",
            format!(
                "{} levels; valid: 1..={MAX_LEVELS} (one per hardware priority)",
                raw.len()
            ),
        );
        return None;
    }
    let mut out = Vec::new();
    let mut ok = true;
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, l) in raw.iter().enumerate() {
        let p = format!("spec.levels[{i}]");
        let mut good = true;
        if let Err(m) = check_name(&l.name) {
            d.error(format!("{p}.name"), m);
            good = false;
        } else if let Some(j) = seen.insert(&l.name, i) {
            d.error(
                format!("{p}.name"),
                format!(
                    "{:?} is already the name of spec.levels[{j}]; level names must be unique",
                    l.name
                ),
            );
            good = false;
        }
        let priority = d.check(&format!("{p}.priority"), int_range(l.priority, 0, 7));
        let dscp = l.dscp.map(|v| d.check(&format!("{p}.dscp"), int_range(v, 0, 63)));
        let pcp = l.pcp.map(|v| d.check(&format!("{p}.pcp"), int_range(v, 0, 7)));
        let limit = match (&l.factor, &l.rate) {
            (Some(_), Some(_)) => {
                d.error(p.clone(), "set either factor or rate, not both");
                None
            }
            (Some(f), None) => match d.check(&format!("{p}.factor"), factor(&f.0)) {
                Some(None) => Some(Limit::Unlimited),
                Some(Some(f)) => {
                    if !has_qjump {
                        d.error(
                            format!("{p}.factor"),
                            "a factor needs spec.qjump (hosts, max_packet, link_rate, switch_delay) to compute the level's rate; add it or give the level an explicit rate",
                        );
                        None
                    } else if let Some(n) = net.filter(|n| f > n.hosts as f64) {
                        d.error(
                            format!("{p}.factor"),
                            format!(
                                "{} is out of range; valid: > 0 and <= spec.qjump.hosts ({}); a level that may use the whole link is \"unlimited\"",
                                f, n.hosts
                            ),
                        );
                        None
                    } else {
                        Some(Limit::Factor(f))
                    }
                }
                None => None,
            },
            (None, Some(r)) => d
                .check(&format!("{p}.rate"), rate_in(&r.0, RATE))
                .map(Limit::Rate),
            (None, None) => Some(Limit::Unlimited),
        };
        let codel = l
            .codel
            .as_ref()
            .map(|k| super::codel::codel(d, &format!("{p}.codel"), k));
        let (Some(priority), Some(limit), Some(dscp), Some(pcp), Some(codel), true) = (
            priority,
            limit,
            dscp.transpose_ok(),
            pcp.transpose_ok(),
            codel.transpose_ok(),
            good,
        ) else {
            ok = false;
            continue;
        };
        let (rate, epoch_secs) = match limit {
            Limit::Factor(f) => match net {
                Some(n) => (Some(n.level_rate(f)), Some(n.epoch_secs(f))),
                // qjump present but invalid: already reported.
                None => {
                    ok = false;
                    continue;
                }
            },
            Limit::Rate(r) => (Some(r), None),
            Limit::Unlimited => (None, None),
        };
        out.push(Level {
            name: l.name.clone(),
            priority: priority as u8,
            limit,
            rate,
            epoch_secs,
            dscp: dscp.map(|v| v as u8),
            pcp: pcp.map(|v| v as u8),
            codel,
        });
    }
    if !ok {
        return None;
    }
    // Order: the list runs from the highest level to the lowest.
    for i in 1..out.len() {
        let p = format!("spec.levels[{i}]");
        let (cur, prev) = (&out[i], &out[i - 1]);
        if let Some(j) = out[..i].iter().position(|l| l.priority == cur.priority) {
            d.error(
                format!("{p}.priority"),
                format!(
                    "{} is already the priority of level {:?} (spec.levels[{j}]); switches could not tell the two levels apart",
                    cur.priority, out[j].name
                ),
            );
        } else if cur.priority > prev.priority {
            d.error(
                format!("{p}.priority"),
                format!(
                    "{} is above the priority {} of level {:?} listed before it; levels are listed from the highest to the lowest, so priorities must decrease",
                    cur.priority, prev.priority, prev.name
                ),
            );
        }
        if let Limit::Factor(f) = cur.limit
            && let Some(above) = out[..i].iter().rev().find_map(|l| match l.limit {
                Limit::Factor(g) => Some((g, &l.name)),
                _ => None,
            })
            && f < above.0
        {
            d.error(
                        format!("{p}.factor"),
                        format!(
                            "{f} is below the factor {} of level {:?} above it; factors must not decrease down the list (a lower level has at least the throughput of a higher one)",
                            above.0, above.1
                        ),
                    );
        }
        if cur.rate.is_some()
            && let Some(u) = out[..i].iter().find(|l| l.rate.is_none())
        {
            d.error(
                    p.clone(),
                    format!(
                        "level {:?} is rate-limited but level {:?} above it is unlimited: a higher level that may use the whole link voids the guarantee of the levels below; list unlimited levels last",
                        cur.name, u.name
                    ),
                );
        }
        if let Some(ds) = cur.dscp
            && let Some(o) = out[..i].iter().find(|l| l.dscp == Some(ds))
        {
            d.warn(
                    format!("{p}.dscp"),
                    format!("{ds} is also the DSCP of level {:?}; switches that classify by DSCP cannot tell the levels apart", o.name),
                );
        }
    }
    for (i, l) in out.iter().enumerate() {
        if let (Limit::Factor(f), Some(n), Some(r)) = (l.limit, net, l.rate)
            && r >= n.link_rate
        {
            d.warn(
                format!("spec.levels[{i}].factor"),
                format!(
                    "factor {f} gives the full link rate ({}); \"unlimited\" says so directly",
                    units::fmt_rate(r)
                ),
            );
        }
    }
    Some(out)
}

/// "A policy whose guaranteed rates cannot fit the link is refused with the numbers."
pub(super) fn fits(d: &mut Diag, levels: &[Level], link: Option<&LinkRate>) {
    let limited: Vec<&Level> = levels.iter().filter(|l| l.rate.is_some()).collect();
    if limited.is_empty() {
        return;
    }
    let Some(link) = link else {
        d.warn(
            "spec.levels",
            "no link rate is known (spec.link_rate, an interface speed or spec.qjump.link_rate), so the level rates cannot be checked against the link",
        );
        return;
    };
    let sum: u128 = limited.iter().map(|l| u128::from(l.rate.unwrap_or(0))).sum();
    if sum > u128::from(link.rate) {
        let terms: Vec<String> = limited
            .iter()
            .map(|l| format!("{} {}", l.name, units::fmt_rate(l.rate.unwrap_or(0))))
            .collect();
        d.error(
            "spec.levels",
            format!(
                "the guaranteed rates do not fit the link: {} = {} > {} ({})",
                terms.join(" + "),
                units::fmt_rate(u64::try_from(sum).unwrap_or(u64::MAX)),
                units::fmt_rate(link.rate),
                link.source
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::tests::{errors, fake_host};

    #[test]
    fn levels_run_from_the_highest_to_the_lowest() {
        let text = r#"
apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [eth0]
  qjump: {hosts: 10, max_packet: 1500B, link_rate: 1Gbit, switch_delay: 1us}
  levels:
    - {name: a, priority: 5, factor: 2}
    - {name: b, priority: 6, factor: 1}
    - {name: c, priority: 1}
    - {name: d, priority: 0, rate: 1Mbit}
  classes: [{name: x, level: a}]
  default_class: x
"#;
        assert_eq!(
            errors(text, &fake_host()),
            [
                "test.yaml:9: spec.levels[1].priority: 6 is above the priority 5 of level \"a\" listed before it; levels are listed from the highest to the lowest, so priorities must decrease",
                "test.yaml:9: spec.levels[1].factor: 1 is below the factor 2 of level \"a\" above it; factors must not decrease down the list (a lower level has at least the throughput of a higher one)",
                "test.yaml:11: spec.levels[3]: level \"d\" is rate-limited but level \"c\" above it is unlimited: a higher level that may use the whole link voids the guarantee of the levels below; list unlimited levels last",
            ]
        );
    }

    #[test]
    fn guaranteed_rates_must_fit_the_link() {
        let text = r#"
apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [eth0]
  link_rate: 1Gbit
  levels: [{name: a, priority: 5, rate: 600Mbit}, {name: b, priority: 1, rate: 500Mbit}]
  classes: [{name: x, level: a}]
  default_class: x
"#;
        assert_eq!(
            errors(text, &fake_host()),
            [
                "test.yaml:7: spec.levels: the guaranteed rates do not fit the link: a 600 Mbit/s + b 500 Mbit/s = 1.10 Gbit/s > 1.00 Gbit/s (spec.link_rate)"
            ]
        );
    }
}
