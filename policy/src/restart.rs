//! What a reload cannot change: [`Compiled::restart_needed`].

use super::compile::Compiled;
use super::enforcement::EnforcementMode;

impl Compiled {
    /// What differs from `old`, the policy in force, that only a restart applies, one message
    /// each (empty: this policy can replace `old` live). The interfaces, the enforcement mode,
    /// `spec.d3`, `spec.dasr` and the flow table are set up at start. `mode` is the mode this policy's
    /// `spec.enforcement` gets on this kernel ([`decide_mode`](super::decide_mode)); `None`
    /// when the kernel cannot give it one.
    pub fn restart_needed(&self, old: &Compiled, mode: Option<EnforcementMode>) -> Vec<String> {
        let mut restart = Vec::new();
        if self.interfaces != old.interfaces {
            restart.push(format!(
                "spec.interfaces changed ({:?} -> {:?}): restart the agent to apply it",
                old.interfaces, self.interfaces
            ));
        }
        if mode != Some(old.mode) {
            restart
                .push("spec.enforcement changed the enforcement mode: restart the agent to apply it".into());
        }
        if self.d3 != old.d3 {
            restart.push(
                "spec.d3 changed (receiver, router links, interval): restart the agent to apply it".into(),
            );
        }
        if self.dasr != old.dasr {
            restart.push(
                "spec.dasr changed (roles, line rate, RTT, window): restart the agent to apply it".into(),
            );
        }
        if self.flow_table_size != old.flow_table_size {
            restart.push(format!(
                "spec.flow_table_size changed ({} -> {}): the flow table is sized at start; restart the agent",
                old.flow_table_size, self.flow_table_size
            ));
        }
        restart
    }
}

#[cfg(test)]
mod tests {
    use crate::tests::{fake_host, ok};
    use crate::{CompileContext, Compiled, EnforcementMode, compile};

    const BASE: &str = r#"
apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [eth0]
  levels: [{name: all, priority: 0, rate: 1Gbit}]
  classes: [{name: a, level: all}, {name: b, level: all, flow_rate: 10Mbit}]
  rules: [{class: a, protocol: tcp, dst_port: 80}]
  default_class: b
"#;

    fn fq(text: &str, previous: Option<&Compiled>) -> Compiled {
        let slots = previous.map(Compiled::slots);
        let ctx = CompileContext {
            mode: EnforcementMode::Fq,
            previous: slots.as_ref(),
            all_routes_managed: false,
        };
        compile(&ok(text, &fake_host()), &ctx).unwrap()
    }

    #[test]
    fn rates_and_rules_apply_live() {
        let old = fq(BASE, None);
        let new = fq(&BASE.replace("10Mbit", "20Mbit").replace("80", "443"), Some(&old));
        assert!(new.restart_needed(&old, Some(EnforcementMode::Fq)).is_empty());
    }

    #[test]
    fn interfaces_mode_d3_dasr_and_flow_table_need_a_restart() {
        let old = fq(BASE, None);
        let new = fq(
            &BASE.replace("[eth0]", "[eth0, eth1]").replace(
                "default_class: b",
                "default_class: b\n  flow_table_size: 4096\n  d3: {}\n  dasr: {line_rate: 1Gbit}",
            ),
            Some(&old),
        );
        assert_eq!(
            new.restart_needed(&old, Some(EnforcementMode::Htb)),
            [
                r#"spec.interfaces changed (["eth0"] -> ["eth0", "eth1"]): restart the agent to apply it"#,
                "spec.enforcement changed the enforcement mode: restart the agent to apply it",
                "spec.d3 changed (receiver, router links, interval): restart the agent to apply it",
                "spec.dasr changed (roles, line rate, RTT, window): restart the agent to apply it",
                "spec.flow_table_size changed (65536 -> 4096): the flow table is sized at start; restart the agent",
            ]
        );
        // A mode the kernel cannot give is a change of mode too.
        assert_eq!(fq(BASE, Some(&old)).restart_needed(&old, None).len(), 1);
    }
}
