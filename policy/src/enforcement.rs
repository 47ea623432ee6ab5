//! How rates are enforced: what a policy asks for ([`EnforcementRequest`], `spec.enforcement`),
//! what the agent uses on this kernel ([`EnforcementMode`]), and the choice between them
//! ([`decide_mode`]).

use anyhow::{Result, bail};

use super::raw;

/// What the running kernel offers for enforcement: the part of the agent's probe of the
/// kernel (`paceline::features::Features`) that [`decide_mode`] and [`degradations_for`] read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSupport {
    /// `uname -r`, for messages.
    pub kernel_release: String,
    /// sch_fq: the qdisc that enforces EDT timestamps.
    pub sch_fq: bool,
    /// sch_htb: rate limiting of aggregates when fq is missing.
    pub sch_htb: bool,
    /// A cgroup v2 mount (sock_ops attaches to its root).
    pub cgroup2: bool,
}

/// `spec.enforcement`: what the policy asks the agent to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnforcementRequest {
    /// The best the kernel offers (the agent decides).
    Auto,
    Fq,
    Htb,
    Sockops,
    None,
}

impl EnforcementRequest {
    pub fn as_str(self) -> &'static str {
        match self {
            EnforcementRequest::Auto => "auto",
            EnforcementRequest::Fq => "fq",
            EnforcementRequest::Htb => "htb",
            EnforcementRequest::Sockops => "sockops",
            EnforcementRequest::None => "none",
        }
    }

    /// The mode the policy insists on; `None` for `auto` (the agent picks).
    pub fn fixed(self) -> Option<EnforcementMode> {
        match self {
            EnforcementRequest::Auto => None,
            EnforcementRequest::Fq => Some(EnforcementMode::Fq),
            EnforcementRequest::Htb => Some(EnforcementMode::Htb),
            EnforcementRequest::Sockops => Some(EnforcementMode::SockopsOnly),
            EnforcementRequest::None => Some(EnforcementMode::None),
        }
    }
}

impl From<raw::Enforcement> for EnforcementRequest {
    fn from(e: raw::Enforcement) -> Self {
        match e {
            raw::Enforcement::Auto => EnforcementRequest::Auto,
            raw::Enforcement::Fq => EnforcementRequest::Fq,
            raw::Enforcement::Htb => EnforcementRequest::Htb,
            raw::Enforcement::Sockops => EnforcementRequest::Sockops,
            raw::Enforcement::None => EnforcementRequest::None,
        }
    }
}

/// How the agent enforces rates on this host (decided from `spec.enforcement` and the kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnforcementMode {
    /// EDT timestamps held by `fq`.
    Fq,
    /// An HTB hierarchy for the aggregates (see [`HtbPlan`](super::HtbPlan)).
    Htb,
    /// Only sock_ops' per-socket settings.
    SockopsOnly,
    /// Classify, tag and count only.
    None,
}

impl EnforcementMode {
    pub fn as_str(self) -> &'static str {
        match self {
            EnforcementMode::Fq => "fq",
            EnforcementMode::Htb => "htb",
            EnforcementMode::SockopsOnly => "sockops",
            EnforcementMode::None => "none",
        }
    }
}

/// Picks how the policy is enforced on this kernel: `auto` takes the best mode the kernel
/// offers (fq, then htb, then sockops, then none); a fixed request the kernel cannot give is
/// an error saying why.
pub fn decide_mode(req: EnforcementRequest, f: &KernelSupport) -> Result<EnforcementMode> {
    let sockops = f.cgroup2;
    Ok(match req {
        EnforcementRequest::Auto if f.sch_fq => EnforcementMode::Fq,
        EnforcementRequest::Auto if f.sch_htb => EnforcementMode::Htb,
        EnforcementRequest::Auto if sockops => EnforcementMode::SockopsOnly,
        EnforcementRequest::Auto => EnforcementMode::None,
        EnforcementRequest::Fq if !f.sch_fq => bail!(
            "the policy asks for `enforcement: fq` but this kernel has no sch_fq (kernel {}); \
             use `auto` to fall back to HTB and TCP pacing",
            f.kernel_release
        ),
        EnforcementRequest::Fq => EnforcementMode::Fq,
        EnforcementRequest::Htb if !f.sch_htb => {
            bail!("the policy asks for `enforcement: htb` but this kernel has no sch_htb")
        }
        EnforcementRequest::Htb => EnforcementMode::Htb,
        EnforcementRequest::Sockops if !sockops => {
            bail!("the policy asks for `enforcement: sockops` but no cgroup v2 is mounted")
        }
        EnforcementRequest::Sockops => EnforcementMode::SockopsOnly,
        EnforcementRequest::None => EnforcementMode::None,
    })
}

/// What the policy `c` asks for that this host does not enforce, one line each: the meaning of
/// `paceline_enforcement_degraded` and of `degraded` in `/status`. Nothing is degraded when the
/// policy asks for nothing the kernel lacks: a policy with `enforcement: none` asks for no rate
/// to be enforced, and a policy without rates needs no qdisc. `sock_ops`: whether the agent
/// attached sock_ops (the TCP settings, TCP pacing and D3 need it).
pub fn degradations_for(f: &KernelSupport, c: &super::Compiled, sock_ops: bool) -> Vec<String> {
    let asked_none = c.enforcement == EnforcementRequest::None;
    let flow = !asked_none && c.classes.iter().any(|k| k.flow_rate.is_some());
    // Only fq paces flows that are not TCP: without it, a per-flow rate is lost only on
    // classes that such flows can reach, the default class (whatever no rule matches) or a
    // class with a rule that does not restrict the protocol to TCP.
    let non_tcp_flow = !asked_none
        && c.classes
            .iter()
            .any(|k| k.flow_rate.is_some() && receives_non_tcp(c, k.index));
    let aggregate = !asked_none
        && (c.levels.iter().any(|l| l.rate.is_some()) || c.classes.iter().any(|k| k.class_rate.is_some()));
    let tcp_settings = c.classes.iter().any(|k| {
        k.tcp
            .is_some_and(|t| t.rto_min_us.is_some() || t.delack_max_us.is_some())
    });
    let mut d = Vec::new();
    match c.mode {
        EnforcementMode::Fq => {}
        EnforcementMode::Htb => {
            if non_tcp_flow {
                d.push(
                    "no sch_fq: per-flow rates of UDP and other non-TCP flows are not enforced (TCP flows pace \
                     themselves at their flow rate through sock_ops; class and level rates are enforced by HTB)"
                        .to_string(),
                );
            }
        }
        EnforcementMode::SockopsOnly => {
            if non_tcp_flow {
                d.push(
                    "no sch_fq: per-flow rates of UDP and other non-TCP flows are not enforced (TCP flows pace \
                     themselves through sock_ops)"
                        .to_string(),
                );
            }
            if aggregate {
                d.push("no sch_fq and no sch_htb: class and level rates are not enforced".to_string());
            }
        }
        EnforcementMode::None => {
            if flow || aggregate {
                d.push(
                    "no sch_fq, no sch_htb and no cgroup v2: the policy's rates are not enforced at all"
                        .to_string(),
                );
            }
        }
    }
    let needs_sock_ops = tcp_settings || c.d3.is_some() || (flow && c.mode != EnforcementMode::Fq);
    if needs_sock_ops && !sock_ops {
        d.push(if !f.cgroup2 {
            "no cgroup v2 mount: sock_ops is unavailable, so the classes' TCP settings (rto_min, delack_max), \
             TCP pacing and D3 do not apply"
                .to_string()
        } else {
            "sock_ops is not attached (enforcement: none): the classes' TCP settings (rto_min, delack_max) do not apply"
                .to_string()
        });
    }
    d
}

/// Can traffic other than TCP be put in class `index` of `c`? Yes for the default class and
/// for a class with a rule that matches any protocol or one other than TCP.
fn receives_non_tcp(c: &super::Compiled, index: u16) -> bool {
    const TCP: u8 = 6;
    index == c.default_class
        || c.rule_table
            .iter()
            .any(|r| r.class == index && !(r.proto_mask == 0xff && r.proto == TCP))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{fake_host, ok};
    use crate::{CompileContext, compile};

    fn kernel(fq: bool, htb: bool, cgroup2: bool) -> KernelSupport {
        KernelSupport {
            kernel_release: "6.1.0-test".into(),
            sch_fq: fq,
            sch_htb: htb,
            cgroup2,
        }
    }

    #[test]
    fn auto_takes_the_best_the_kernel_offers() {
        let auto = |f: &KernelSupport| decide_mode(EnforcementRequest::Auto, f).unwrap();
        assert_eq!(auto(&kernel(true, true, true)), EnforcementMode::Fq);
        assert_eq!(auto(&kernel(false, true, true)), EnforcementMode::Htb);
        assert_eq!(auto(&kernel(false, false, true)), EnforcementMode::SockopsOnly);
        assert_eq!(auto(&kernel(false, false, false)), EnforcementMode::None);
    }

    #[test]
    fn a_fixed_request_the_kernel_cannot_give_is_refused() {
        let bare = kernel(false, false, false);
        let e = decide_mode(EnforcementRequest::Fq, &bare)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no sch_fq (kernel 6.1.0-test)"), "{e}");
        assert!(decide_mode(EnforcementRequest::Htb, &bare).is_err());
        assert!(decide_mode(EnforcementRequest::Sockops, &bare).is_err());
        assert_eq!(
            decide_mode(EnforcementRequest::None, &bare).unwrap(),
            EnforcementMode::None
        );
        for req in [
            EnforcementRequest::Fq,
            EnforcementRequest::Htb,
            EnforcementRequest::Sockops,
            EnforcementRequest::None,
        ] {
            assert_eq!(
                decide_mode(req, &kernel(true, true, true)).ok(),
                req.fixed(),
                "{req:?}"
            );
        }
    }

    fn degraded(policy: &str, f: &KernelSupport) -> Vec<String> {
        let v = ok(policy, &fake_host());
        let mode = decide_mode(v.enforcement(), f).unwrap();
        let c = compile(
            &v,
            &CompileContext {
                mode,
                previous: None,
                all_routes_managed: false,
            },
        )
        .unwrap();
        let sock_ops = f.cgroup2 && (mode != EnforcementMode::None || c.d3.is_some());
        degradations_for(f, &c, sock_ops)
    }

    /// The shipped default policy: `enforcement: none`, no rates. Nothing it asks for is missing
    /// on a kernel without sch_fq (PacelineEnforcementDegraded fired there before).
    #[test]
    fn enforcement_none_is_never_degraded_by_missing_qdiscs() {
        let default =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../policies/default.yaml"))
                .unwrap()
                .replace("[auto]", "[eth0]");
        for f in [
            kernel(false, true, true),
            kernel(false, false, false),
            kernel(true, true, true),
        ] {
            assert!(
                degraded(&default, &f).is_empty(),
                "{f:?}: {:?}",
                degraded(&default, &f)
            );
        }
    }

    #[test]
    fn degraded_against_what_the_policy_asks() {
        let flows = r#"
apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [eth0]
  link_rate: 1Gbit
  levels: [{name: lo, priority: 0}]
  classes: [{name: a, level: lo, flow_rate: 10Mbit}]
  default_class: a
"#;
        assert!(
            degraded(flows, &kernel(true, true, true)).is_empty(),
            "fq enforces everything"
        );
        let d = degraded(flows, &kernel(false, true, true));
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(d[0].contains("UDP"));
        let none = flows.replace("link_rate: 1Gbit", "link_rate: 1Gbit\n  enforcement: none");
        assert!(
            degraded(&none, &kernel(false, false, false)).is_empty(),
            "rates not asked to be enforced"
        );
        let aggregate = flows.replace("flow_rate: 10Mbit", "class_rate: 10Mbit");
        assert!(
            degraded(&aggregate, &kernel(false, true, true)).is_empty(),
            "HTB enforces aggregates"
        );
        assert_eq!(degraded(&aggregate, &kernel(false, false, true)).len(), 1);
        let tcp = flows.replace("flow_rate: 10Mbit", "tcp: {rto_min: 5ms}");
        let d = degraded(&tcp, &kernel(true, true, false));
        assert!(d.len() == 1 && d[0].contains("cgroup v2"), "{d:?}");
    }

    /// A per-flow rate is degraded without fq only where flows other than TCP can arrive.
    /// Checked to fail: with `non_tcp_flow` replaced by `flow` (as before) the TCP-only class
    /// was reported degraded ("per-flow rates of UDP ... not enforced").
    #[test]
    fn degraded_only_for_traffic_that_can_reach_the_class() {
        let tcp_only = r#"
apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [eth0]
  link_rate: 1Gbit
  levels: [{name: lo, priority: 0}]
  classes: [{name: web, level: lo, flow_rate: 10Mbit}, {name: other, level: lo}]
  rules: [{class: web, protocol: tcp, dst_port: 443}, {class: web, protocol: tcp, src_port: 443}]
  default_class: other
"#;
        let htb = kernel(false, true, true);
        let sockops = kernel(false, false, true);
        assert!(
            degraded(tcp_only, &htb).is_empty(),
            "{:?}",
            degraded(tcp_only, &htb)
        );
        assert!(
            degraded(tcp_only, &sockops).is_empty(),
            "{:?}",
            degraded(tcp_only, &sockops)
        );
        // The default class gets whatever no rule matches, UDP too, even with no rule of its own.
        let default = tcp_only.replace("default_class: other", "default_class: web");
        let d = degraded(&default, &htb);
        assert!(d.len() == 1 && d[0].contains("UDP"), "{d:?}");
        // A rule that does not restrict the protocol, or names another one, lets UDP in.
        for rule in ["{class: web, dst_port: 53}", "{class: web, protocol: udp}"] {
            let any = tcp_only.replace("{class: web, protocol: tcp, src_port: 443}", rule);
            let d = degraded(&any, &htb);
            assert!(d.len() == 1 && d[0].contains("UDP"), "{rule}: {d:?}");
        }
    }
}
