//! `spec.rules`: each rule's conditions (class, protocol, family, addresses, ports, DSCP,
//! mark, cgroup) checked against each other, then address lists expanded into one
//! [`RuleSpec`] per same-family (src, dst) pair, at most `MAX_RULES` in all.

use ipnet::IpNet;
use paceline_common::maps::MAX_RULES;

use super::diag::Diag;
use super::fields::{TransposeOk as _, int_range, lookup, mark, net, port, protocol, protocol_name};
use super::model::{Cgroup, Family, RuleSpec};
use crate::host::HostFacts;
use crate::protocols;
use crate::raw::{self, Scalar};

/// One rule's conditions before expansion.
struct RuleParts {
    class: usize,
    protocol: Option<u8>,
    family: Option<Family>,
    src: Option<Vec<(Option<usize>, IpNet)>>,
    dst: Option<Vec<(Option<usize>, IpNet)>>,
    src_port: Option<(u16, u16)>,
    dst_port: Option<(u16, u16)>,
    dscp: Option<u8>,
    cgroup: Option<Cgroup>,
    mark: Option<(u32, u32)>,
}

fn addresses(d: &mut Diag, path: &str, a: &raw::Addresses) -> Option<Vec<(Option<usize>, IpNet)>> {
    let entries: Vec<(Option<usize>, &Scalar)> = match a {
        raw::Addresses::One(s) => vec![(None, s)],
        raw::Addresses::Many(v) if v.is_empty() => {
            d.error(
                path,
                "an empty list matches nothing; remove the field to match any address",
            );
            return None;
        }
        raw::Addresses::Many(v) => v.iter().enumerate().map(|(i, s)| (Some(i), s)).collect(),
    };
    let mut out = Vec::new();
    let mut ok = true;
    for (i, s) in entries {
        let p = match i {
            Some(i) => format!("{path}[{i}]"),
            None => path.to_string(),
        };
        match net(s) {
            Ok((n, w)) => {
                if let Some(w) = w {
                    d.warn(p, w);
                }
                out.push((i, n));
            }
            Err(m) => {
                d.error(p, m);
                ok = false;
            }
        }
    }
    ok.then_some(out)
}

fn entry_path(base: &str, i: Option<usize>) -> String {
    match i {
        Some(i) => format!("{base}[{i}]"),
        None => base.to_string(),
    }
}

fn rule_parts(
    d: &mut Diag,
    i: usize,
    r: &raw::Rule,
    class_names: &[&str],
    host: &dyn HostFacts,
) -> Option<RuleParts> {
    let p = format!("spec.rules[{i}]");
    let class = lookup(
        d,
        &format!("{p}.class"),
        &r.class,
        class_names,
        "class",
        "classes",
    );
    let protocol = r
        .protocol
        .as_ref()
        .map(|s| d.check(&format!("{p}.protocol"), protocol(&s.0)))
        .transpose_ok();
    let family = r.family.map(|f| match f {
        raw::Family::Ipv4 => Family::V4,
        raw::Family::Ipv6 => Family::V6,
    });
    let src = r
        .src
        .as_ref()
        .map(|a| addresses(d, &format!("{p}.src"), a))
        .transpose_ok();
    let dst = r
        .dst
        .as_ref()
        .map(|a| addresses(d, &format!("{p}.dst"), a))
        .transpose_ok();
    let src_port = r
        .src_port
        .as_ref()
        .map(|s| d.check(&format!("{p}.src_port"), port(&s.0)))
        .transpose_ok();
    let dst_port = r
        .dst_port
        .as_ref()
        .map(|s| d.check(&format!("{p}.dst_port"), port(&s.0)))
        .transpose_ok();
    let dscp = r
        .dscp
        .map(|v| {
            d.check(&format!("{p}.dscp"), int_range(v, 0, 63))
                .map(|v| v as u8)
        })
        .transpose_ok();
    let mark = r
        .mark
        .as_ref()
        .map(|s| d.check(&format!("{p}.mark"), mark(&s.0)))
        .transpose_ok();
    let cgroup = r.cgroup.as_ref().map(|c| {
        let cp = format!("{p}.cgroup");
        let path = c.trim();
        if path.is_empty() || path == "/" {
            d.error(cp, format!("{c:?} is not a cgroup; write a path below the cgroup2 mount, e.g. \"/system.slice/memcached.service\""));
            return None;
        }
        if let Err(e) = crate::host::check_cgroup_path(path) {
            d.error(cp, format!("{c:?} {e}"));
            return None;
        }
        if host.is_offline() {
            d.warn(cp, format!("{c:?} is not resolved offline; compiled with cgroup id 0 (the agent resolves it on the host)"));
            return Some(Cgroup { path: path.to_string(), id: 0 });
        }
        match host.cgroup_id(path) {
            Ok(id) => Some(Cgroup { path: path.to_string(), id }),
            Err(e) => {
                d.error(cp, format!("{c:?}: {e}"));
                None
            }
        }
    });
    let cgroup = cgroup.transpose_ok();

    let (
        Some(class),
        Some(protocol),
        Some(src),
        Some(dst),
        Some(src_port),
        Some(dst_port),
        Some(dscp),
        Some(mark),
        Some(cgroup),
    ) = (class, protocol, src, dst, src_port, dst_port, dscp, mark, cgroup)
    else {
        return None;
    };

    let mut ok = true;
    // Ports need a protocol with ports.
    if let Some(proto) = protocol {
        if !protocols::has_ports(proto) {
            for (field, v) in [("src_port", src_port), ("dst_port", dst_port)] {
                if v.is_some() {
                    d.error(
                        format!("{p}.{field}"),
                        format!(
                            "{} has no ports; ports are matched for {}",
                            protocol_name(proto),
                            protocols::with_ports()
                        ),
                    );
                    ok = false;
                }
            }
        }
    } else {
        for (field, v) in [("src_port", src_port), ("dst_port", dst_port)] {
            if let Some((0, hi)) = v {
                d.warn(
                    format!("{p}.{field}"),
                    format!("0-{hi} also matches packets without ports (icmp, ...), whose ports read as 0; add a protocol to avoid that"),
                );
            }
        }
    }
    // Families: explicit, implied by icmp/icmpv6, and of every address must agree.
    let implied = match protocol {
        Some(1) => Some((Family::V4, "protocol icmp is IPv4-only".to_string())),
        Some(58) => Some((Family::V6, "protocol icmpv6 is IPv6-only".to_string())),
        _ => None,
    };
    if let (Some(f), Some((g, _))) = (family, &implied)
        && f != *g
    {
        let (name, want) = if *g == Family::V4 {
            ("icmp", "icmpv6")
        } else {
            ("icmpv6", "icmp")
        };
        d.error(
            format!("{p}.protocol"),
            format!(
                "{name} is {}-only but family is {}; use {want}",
                g.name(),
                f.name().to_lowercase()
            ),
        );
        ok = false;
    }
    let family_by = family
        .map(|f| (f, format!("family is {}", f.name().to_lowercase())))
        .or(implied);
    if let Some((f, by)) = &family_by {
        for (field, list) in [("src", &src), ("dst", &dst)] {
            for (idx, n) in list.iter().flatten() {
                if Family::of(n) != *f {
                    d.error(
                        entry_path(&format!("{p}.{field}"), *idx),
                        format!("{n} is {} but {by}; no packet could match", Family::of(n).name()),
                    );
                    ok = false;
                }
            }
        }
    }
    if ok && let (Some(s), Some(t)) = (&src, &dst) {
        let fam = |l: &Vec<(Option<usize>, IpNet)>, f| l.iter().any(|(_, n)| Family::of(n) == f);
        let common: Vec<Family> = [Family::V4, Family::V6]
            .into_iter()
            .filter(|f| fam(s, *f) && fam(t, *f))
            .collect();
        if common.is_empty() {
            let sf = Family::of(&s[0].1);
            let tf = Family::of(&t[0].1);
            d.error(
                format!("{p}.dst"),
                format!(
                    "dst is {} but src is {}; no packet has both",
                    tf.name(),
                    sf.name()
                ),
            );
            ok = false;
        } else {
            for (field, list, other) in [("src", s, "dst"), ("dst", t, "src")] {
                for (idx, n) in list {
                    if !common.contains(&Family::of(n)) {
                        d.error(
                            entry_path(&format!("{p}.{field}"), *idx),
                            format!(
                                "{n} is {} but every {other} is {}; no packet could match this entry",
                                Family::of(n).name(),
                                common[0].name()
                            ),
                        );
                        ok = false;
                    }
                }
            }
        }
    }
    ok.then_some(RuleParts {
        class,
        protocol,
        family: family_by.map(|(f, _)| f),
        src,
        dst,
        src_port,
        dst_port,
        dscp,
        cgroup,
        mark,
    })
}

fn list_len(l: &Option<Vec<(Option<usize>, IpNet)>>) -> usize {
    l.as_ref().map_or(1, Vec::len)
}

/// The same-family (src, dst) pairs of a rule; `None` entries mean "any".
#[allow(clippy::type_complexity)]
fn pairs(r: &RuleParts) -> Vec<(Option<(Option<usize>, IpNet)>, Option<(Option<usize>, IpNet)>)> {
    let src: Vec<Option<(Option<usize>, IpNet)>> = match &r.src {
        Some(v) => v.iter().map(|x| Some(*x)).collect(),
        None => vec![None],
    };
    let dst: Vec<Option<(Option<usize>, IpNet)>> = match &r.dst {
        Some(v) => v.iter().map(|x| Some(*x)).collect(),
        None => vec![None],
    };
    let mut out = Vec::new();
    for s in &src {
        for t in &dst {
            if let (Some((_, a)), Some((_, b))) = (s, t)
                && Family::of(a) != Family::of(b)
            {
                continue;
            }
            out.push((*s, *t));
        }
    }
    out
}

pub(super) fn rules(
    d: &mut Diag,
    raw: &[raw::Rule],
    class_names: &[&str],
    host: &dyn HostFacts,
) -> Option<Vec<RuleSpec>> {
    let parts: Vec<Option<RuleParts>> = raw
        .iter()
        .enumerate()
        .map(|(i, r)| rule_parts(d, i, r, class_names, host))
        .collect();
    if parts.iter().any(Option::is_none) {
        return None;
    }
    let parts: Vec<RuleParts> = parts.into_iter().flatten().collect();
    let counts: Vec<usize> = parts
        .iter()
        .map(|r| {
            // Counted without building: lists can be long.
            let n = |l: &Option<Vec<(Option<usize>, IpNet)>>, f: Family| {
                l.as_ref()
                    .map(|v| v.iter().filter(|(_, n)| Family::of(n) == f).count())
            };
            match (&r.src, &r.dst) {
                (Some(_), Some(_)) => {
                    n(&r.src, Family::V4).unwrap_or(0) * n(&r.dst, Family::V4).unwrap_or(0)
                        + n(&r.src, Family::V6).unwrap_or(0) * n(&r.dst, Family::V6).unwrap_or(0)
                }
                (Some(v), None) | (None, Some(v)) => v.len(),
                (None, None) => 1,
            }
        })
        .collect();
    let total: usize = counts.iter().sum();
    if total > MAX_RULES {
        let big: Vec<String> = counts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 1)
            .map(|(i, c)| {
                let r = &parts[i];
                format!(
                    "rules[{i}] -> {c} ({} src x {} dst)",
                    list_len(&r.src),
                    list_len(&r.dst)
                )
            })
            .collect();
        let m = if big.is_empty() {
            format!("{total} rules; at most {MAX_RULES} fit the table")
        } else {
            format!(
                "{total} rules after expanding the src/dst lists; at most {MAX_RULES} fit the table ({})",
                big.join(", ")
            )
        };
        d.error("spec.rules", m);
        return None;
    }
    let mut out = Vec::new();
    for (i, r) in parts.iter().enumerate() {
        for (s, t) in pairs(r) {
            let fam = r
                .family
                .or(s.map(|(_, n)| Family::of(&n)))
                .or(t.map(|(_, n)| Family::of(&n)));
            out.push(RuleSpec {
                origin: i,
                src_entry: s.and_then(|(i, _)| i),
                dst_entry: t.and_then(|(i, _)| i),
                class: r.class,
                protocol: r.protocol,
                family: fam,
                src: s.map(|(_, n)| n),
                dst: t.map(|(_, n)| n),
                src_port: r.src_port,
                dst_port: r.dst_port,
                dscp: r.dscp,
                cgroup: r.cgroup.clone(),
                mark: r.mark,
            });
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use crate::tests::{errors, fake_host, policy_with_classes};

    #[test]
    fn ports_need_a_protocol_with_ports() {
        let text = policy_with_classes(&["a", "b"]).replace(
            "{class: b, dscp: 1}",
            "{class: b, protocol: icmp, dst_port: 7}\n    - {class: b, protocol: 47, src_port: 7}",
        );
        assert_eq!(
            errors(&text, &fake_host()),
            [
                "test.yaml:10: spec.rules[0].dst_port: icmp has no ports; ports are matched for tcp, udp, sctp and udplite",
                "test.yaml:11: spec.rules[1].src_port: protocol 47 has no ports; ports are matched for tcp, udp, sctp and udplite",
            ]
        );
    }
}
