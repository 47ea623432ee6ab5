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
