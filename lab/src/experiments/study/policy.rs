//! The senders' policies: one paced class per flow rate, or none.

use super::*;

/// The paced modes' policy for one sender.
pub(crate) fn policy_yaml(mode: Mode, ifname: &str, flow_rate: u64, host_rate: Option<u64>) -> String {
    let level_rate = host_rate
        .map(|r| format!("      rate: {r}B/s\n"))
        .unwrap_or_default();
    let name = match mode {
        Mode::PerHost => "study-per-host",
        _ => "study-per-flow",
    };
    format!(
        r#"apiVersion: paceline/v1
kind: Policy
metadata:
  name: {name}
  description: pacing study (the TCP pacing study), {mode}
spec:
  interfaces: [{ifname}]
  enforcement: auto
  # veths report no speed
  link_rate: 10Gbit
  # a flow paced at 10 Mbit/s / 32 sends a frame every 39 ms: the default 100ms would drop
  # its third queued frame at the host
  horizon: 1s
  levels:
    - name: host
      priority: 0
{level_rate}  classes:
    - name: study
      level: host
      flow_rate: {flow_rate}B/s
    - name: other
      level: host
  rules:
    - class: study
      protocol: tcp
      dst_port: {PORT}
  default_class: other
"#,
        mode = mode.name()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both paced modes' policies pass the agent's validator and carry the flow's rate, and the
    /// per-host mode the host's share on the level.
    #[test]
    fn paced_policies_validate_and_carry_their_rates() {
        let c = crate::experiments::harness::compile_offline(
            "per-flow",
            &policy_yaml(Mode::PerFlow, "veth0", 39_062, None),
        );
        let study = c.classes.iter().find(|k| k.name == "study").unwrap();
        assert_eq!(study.flow_rate, Some(39_062));
        assert_eq!(c.levels[study.level].rate, None);
        assert!(
            c.rules[0].matches.contains(&format!("tcp dst_port {PORT}")),
            "{:?}",
            c.rules
        );
        let c = crate::experiments::harness::compile_offline(
            "per-host",
            &policy_yaml(Mode::PerHost, "veth0", 39_062, Some(312_500)),
        );
        let study = c.classes.iter().find(|k| k.name == "study").unwrap();
        assert_eq!(c.levels[study.level].rate, Some(312_500));
    }
}
