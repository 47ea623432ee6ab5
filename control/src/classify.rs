//! `paceline classify`: which class and level a packet gets, and which rule decided, answered
//! from a compiled policy with the reference matcher (`paceline_common::classify::first_match`,
//! the definition the datapath's compiled classifier is tested against). The running agent
//! answers at `/classify` from the policy in force; `paceline classify --policy FILE` answers
//! offline.
//!
//! The query is a 5-tuple: protocol, source and destination address with optional ports
//! (`10.0.0.1:40000`, `[fd00::1]:443`), plus what some rules also match on: DSCP, socket
//! mark, cgroup id (each 0 unless given).

use std::net::{IpAddr, SocketAddr};

use anyhow::{Result, anyhow, bail};
use paceline_common::{
    classify::{PacketInfo, first_match},
    maps::v4_mapped,
};
use serde::{Deserialize, Serialize};

use paceline_policy::{Compiled, protocols, units::fmt_rate};

/// What to classify.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Query {
    /// `tcp`, `udp`, ... or a protocol number.
    pub proto: String,
    /// `ADDR` or `ADDR:PORT` (`[V6]:PORT`).
    pub src: String,
    pub dst: String,
    #[serde(default)]
    pub dscp: Option<u8>,
    #[serde(default)]
    pub mark: Option<u32>,
    #[serde(default)]
    pub cgroup_id: Option<u64>,
}

/// The answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    pub class: String,
    pub level: String,
    /// The level's priority.
    pub priority: u8,
    /// The rule that decided (first match), or `None`: no rule matched, the default class.
    pub rule: Option<RuleHit>,
    /// The class's rates, as the policy writes them (`-` for none).
    pub flow_rate: String,
    pub class_rate: String,
    pub level_rate: String,
    /// The level's DSCP the packet leaves with, if the level sets one.
    pub dscp: Option<u8>,
    /// The policy that answered (its hash).
    pub policy_hash: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleHit {
    /// Position in the compiled rule list (after address lists are expanded).
    pub index: usize,
    /// Where it comes from in the file: `spec.rules[2]` or `spec.rules[2] (src[1], dst[0])`.
    pub origin: String,
    /// Its conditions, e.g. `tcp dst_port 11211 dst 10.1.0.0/16`.
    pub matches: String,
}

fn endpoint(s: &str) -> Result<(IpAddr, u16)> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok((a.ip(), a.port()));
    }
    let t = s.trim_start_matches('[').trim_end_matches(']');
    t.parse::<IpAddr>()
        .map(|ip| (ip, 0))
        .map_err(|_| anyhow!("{s:?} is not an address or address:port (e.g. 10.0.0.1:443, [fd00::1]:443)"))
}

/// An address as the datapath keeps it (IPv4 mapped), in network-order words.
pub fn words(ip: IpAddr) -> [u32; 4] {
    match ip {
        IpAddr::V4(v) => v4_mapped(u32::from_ne_bytes(v.octets())),
        IpAddr::V6(v) => {
            let b = v.octets();
            let mut w = [0u32; 4];
            for (i, c) in b.chunks_exact(4).enumerate() {
                w[i] = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
            }
            w
        }
    }
}

impl Query {
    /// The packet the classifier would see.
    pub fn packet(&self) -> Result<PacketInfo> {
        let proto = match protocols::by_name(&self.proto) {
            Some(p) => p,
            None => self.proto.parse::<u8>().map_err(|_| {
                anyhow!(
                    "{:?} is not a protocol; use one of {} or a number",
                    self.proto,
                    protocols::names()
                )
            })?,
        };
        let (src, sport) = endpoint(&self.src)?;
        let (dst, dport) = endpoint(&self.dst)?;
        let v6 = |ip: IpAddr| matches!(ip, IpAddr::V6(v) if v.to_ipv4_mapped().is_none());
        if v6(src) != v6(dst) {
            bail!("source and destination are of different address families");
        }
        if !protocols::has_ports(proto) && (sport != 0 || dport != 0) {
            bail!("protocol {} has no ports", self.proto);
        }
        Ok(PacketInfo {
            src: words(src),
            dst: words(dst),
            cgroup_id: self.cgroup_id.unwrap_or(0),
            mark: self.mark.unwrap_or(0),
            sport,
            dport,
            proto,
            dscp: self.dscp.unwrap_or(0) & 0x3f,
            is_v6: v6(src) as u8,
            unknown: 0,
            _pad: [0; 4],
        })
    }
}

/// Classifies `q` with the policy `c`.
pub fn explain(c: &Compiled, q: &Query) -> Result<Answer> {
    let p = q.packet()?;
    let hit = first_match(&c.rule_table, &p);
    let class_index = match hit {
        Some(i) => c.rule_table[i].class,
        None => c.default_class,
    };
    let class = c
        .classes
        .iter()
        .find(|k| k.index == class_index)
        .ok_or_else(|| anyhow!("class index {class_index} is not in the policy"))?;
    let level = &c.levels[class.level];
    let opt = |r: Option<u64>| r.map_or("-".to_string(), fmt_rate);
    Ok(Answer {
        class: class.name.clone(),
        level: level.name.clone(),
        priority: level.priority,
        rule: hit.map(|i| RuleHit {
            index: i,
            origin: c.rules[i].origin.to_string(),
            matches: c.rules[i].matches.to_string(),
        }),
        flow_rate: opt(class.flow_rate),
        class_rate: opt(class.class_rate),
        level_rate: level.rate.map_or("unlimited".into(), fmt_rate),
        dscp: level.dscp,
        policy_hash: c.hash.clone(),
    })
}

/// The answer as `paceline classify` prints it.
pub fn render(q: &Query, a: &Answer) -> String {
    let mut o = format!(
        "{} {} -> {}\n  class  {}\n  level  {} (priority {}{})\n",
        q.proto,
        q.src,
        q.dst,
        a.class,
        a.level,
        a.priority,
        a.dscp.map(|d| format!(", DSCP {d}")).unwrap_or_default()
    );
    match &a.rule {
        Some(r) => o.push_str(&format!("  rule   #{} {}: {}\n", r.index, r.origin, r.matches)),
        None => o.push_str("  rule   none matched: the default class\n"),
    }
    o.push_str(&format!(
        "  rates  flow {}, class {}, level {}\n",
        a.flow_rate, a.class_rate, a.level_rate
    ));
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use paceline_policy::testing::{fake_host, ok};
    use paceline_policy::{CompileContext, EnforcementMode, compile};

    const POLICY: &str = r#"
apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [eth0]
  levels: [{name: hi, priority: 5, rate: 100Mbit, dscp: 46}, {name: lo, priority: 0}]
  classes:
    - {name: cache, level: hi, flow_rate: 10Mbit}
    - {name: web, level: lo}
    - {name: other, level: lo}
  rules:
    - {class: cache, protocol: tcp, dst_port: 11211, dst: [10.1.0.0/16, "fd00::/8"]}
    - {class: web, protocol: tcp, dst_port: 443}
  default_class: other
"#;

    fn compiled() -> Compiled {
        let ctx = CompileContext {
            mode: EnforcementMode::Fq,
            previous: None,
            all_routes_managed: false,
        };
        compile(&ok(POLICY, &fake_host()), &ctx).unwrap()
    }

    fn q(proto: &str, src: &str, dst: &str) -> Query {
        Query {
            proto: proto.into(),
            src: src.into(),
            dst: dst.into(),
            ..Default::default()
        }
    }

    #[test]
    fn names_the_class_level_and_rule() {
        let c = compiled();
        let a = explain(&c, &q("tcp", "10.0.0.1:40000", "10.1.2.3:11211")).unwrap();
        assert_eq!((a.class.as_str(), a.level.as_str()), ("cache", "hi"));
        let r = a.rule.as_ref().unwrap();
        assert_eq!(r.index, 0);
        assert!(r.origin.starts_with("spec.rules[0]"), "{r:?}");
        assert_eq!(a.flow_rate, "10.0 Mbit/s");
        // The IPv6 half of the address list is its own expanded rule.
        let a6 = explain(&c, &q("tcp", "[fd00::1]:40000", "[fd00::2]:11211")).unwrap();
        assert_eq!(a6.class, "cache");
        assert_eq!(a6.rule.unwrap().index, 1);
        let web = explain(&c, &q("tcp", "10.0.0.1:40000", "192.0.2.1:443")).unwrap();
        assert_eq!(web.class, "web");
        assert!(web.rule.unwrap().origin.starts_with("spec.rules[1]"));
    }

    #[test]
    fn no_match_is_the_default_class() {
        let a = explain(&compiled(), &q("udp", "10.0.0.1:5000", "10.1.2.3:11211")).unwrap();
        assert_eq!(a.class, "other");
        assert!(a.rule.is_none());
        assert!(render(&q("udp", "a", "b"), &a).contains("none matched"));
    }

    #[test]
    fn bad_queries_say_why() {
        let c = compiled();
        assert!(
            explain(&c, &q("tcpp", "10.0.0.1", "10.0.0.2"))
                .unwrap_err()
                .to_string()
                .contains("not a protocol")
        );
        assert!(explain(&c, &q("tcp", "10.0.0.1", "fd00::1")).is_err());
        assert!(explain(&c, &q("icmp", "10.0.0.1:5", "10.0.0.2")).is_err());
        assert!(explain(&c, &q("tcp", "nohost:80", "10.0.0.2")).is_err());
    }
}
