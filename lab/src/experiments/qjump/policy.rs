//! The senders' policies: one flat class, or QJump levels for the RPCs and the bulk.

use super::*;

/// The policy text for one sender.
pub(crate) fn policy_text(p: Policy, ifname: &str, rate_bps: u64) -> String {
    let head = format!(
        "apiVersion: paceline/v1\nkind: Policy\nmetadata:\n  name: plexp-qjump-{}\nspec:\n  \
         interfaces: [{ifname}]\n  enforcement: auto\n  link_rate: 10Gbit\n",
        match p {
            Policy::Flat => "flat",
            Policy::QJump => "levels",
        }
    );
    let body = match p {
        Policy::Flat => "  levels:\n    - name: best-effort\n      priority: 0\n  classes:\n    \
             - name: rpc\n      level: best-effort\n    - name: bulk\n      level: best-effort\n"
            .to_string(),
        Policy::QJump => format!(
            "  qjump:\n    hosts: {SENDERS}\n    max_packet: {MAX_PACKET}\n    link_rate: {rate_bps}bit\n    \
             switch_delay: {SWITCH_DELAY}\n  levels:\n    - name: latency\n      priority: 5\n      \
             factor: 1\n      dscp: 46\n    - name: bulk\n      priority: 0\n      factor: unlimited\n      \
             dscp: 0\n  classes:\n    - name: rpc\n      level: latency\n    - name: bulk\n      \
             level: bulk\n"
        ),
    };
    format!(
        "{head}{body}  rules:\n    - class: rpc\n      protocol: tcp\n      dst_port: {RPC_PORT}\n  \
         default_class: bulk\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both policies pass the agent's validator; with levels, the RPCs' level is limited to
    /// QJump's per-host rate (factor 1: one packet per network epoch, below the port's rate)
    /// and the bulk's is not; RPCs are selected by their port.
    #[test]
    fn both_policies_validate_and_levels_limit_the_rpcs() {
        let rate = DEFAULT_RATE_MBIT * 1_000_000;
        let flat =
            crate::experiments::harness::compile_offline("flat", &policy_text(Policy::Flat, "veth0", rate));
        assert!(flat.levels.iter().all(|l| l.rate.is_none()));
        let q =
            crate::experiments::harness::compile_offline("qjump", &policy_text(Policy::QJump, "veth0", rate));
        let level = |class: &str| {
            let c = q.classes.iter().find(|c| c.name == class).unwrap();
            &q.levels[c.level]
        };
        let rpc = level("rpc").rate.expect("the latency level is limited");
        assert!(rpc > 0 && rpc < rate / 8, "{rpc} B/s");
        assert_eq!(level("rpc").dscp, Some(46));
        assert_eq!(level("bulk").rate, None);
        assert!(
            q.rules[0].matches.contains(&format!("tcp dst_port {RPC_PORT}")),
            "{:?}",
            q.rules
        );
    }
}
