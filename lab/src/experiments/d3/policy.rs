//! The policies of the senders, the router and the receiver, as YAML the agent parses.

use super::*;

pub(crate) fn sender_policy(cfg: &Config, mode: &ModeSpec, n: usize, ifname: &str) -> String {
    let head = format!(
        "apiVersion: paceline/v1\nkind: Policy\nmetadata:\n  name: plexp-d3-{}\n  description: D3 evaluation (the D3 paper), mode {}\nspec:\n  interfaces: [{ifname}]\n",
        mode.name, mode.name
    );
    let rule = format!("  rules:\n    - class: pa\n      protocol: tcp\n      src_port: {PORT}\n");
    let link = format!("{}kbit", cfg.rate_bps / 1000);
    match &mode.kind {
        Kind::Tcp => String::new(),
        Kind::Paced => {
            // The fair share of the bottleneck (wire bytes/s), rounded down.
            let rate = cfg.rate_bps / 8 / n.max(1) as u64;
            format!(
                "{head}  enforcement: sockops\n  link_rate: {link}\n  levels:\n    - name: all\n      priority: 0\n  classes:\n    - name: pa\n      level: all\n      flow_rate: {rate}B/s\n    - name: other\n      level: all\n{rule}  default_class: other\n"
            )
        }
        Kind::Qjump => format!(
            "{head}  enforcement: auto\n  # veths report no speed\n  link_rate: 10Gbit\n  qjump:\n    hosts: {hosts}\n    max_packet: 1514B\n    link_rate: {rate}bit\n    switch_delay: {eps}us\n  levels:\n    - name: urgent\n      priority: 5\n      factor: {f}\n      dscp: 46\n    - name: normal\n      priority: 0\n      factor: unlimited\n      dscp: 0\n  classes:\n    - name: pa\n      level: urgent\n    - name: other\n      level: normal\n  rules:\n    - class: pa\n      protocol: tcp\n      src_port: {PORT}\n      mark: {MARK_URGENT}\n  default_class: other\n",
            hosts = cfg.sender_hosts,
            rate = cfg.rate_bps,
            eps = cfg.qjump_switch_delay_us,
            f = cfg.qjump_factor,
        ),
        Kind::D3 {
            first_rtt_rate,
            initial_window,
        } => {
            let first = first_rtt_rate
                .map(|r| format!("\n    first_rtt_rate: {r}B/s"))
                .unwrap_or_default()
                + &initial_window
                    .map(|w| format!("\n    initial_window: {w}"))
                    .unwrap_or_default();
            let d3 = if first.is_empty() {
                "  d3: {}\n".to_string()
            } else {
                format!("  d3:{first}\n")
            };
            // Background flows are D3 flows without a deadline: they ask for a fair share.
            let (bg_class, bg_rule) = if cfg.background_flows > 0 {
                (
                    "    - name: background\n      level: all\n      d3: {}\n".to_string(),
                    format!("    - class: background\n      protocol: tcp\n      dst_port: {BG_PORT}\n"),
                )
            } else {
                (String::new(), String::new())
            };
            format!(
                "{head}  enforcement: sockops\n  # the bottleneck's rate: D3's quench cap and scale, and the default first-RTT rate (1%)\n  link_rate: {link}\n  levels:\n    - name: all\n      priority: 0\n  classes:\n    - name: pa\n      level: all\n      d3: {{}}\n{bg_class}    - name: other\n      level: all\n{rule}{bg_rule}  default_class: other\n{d3}"
            )
        }
    }
}

pub(crate) fn router_policy(to_rx: &str, rate_bps: u64) -> String {
    format!(
        "apiVersion: paceline/v1\nkind: Policy\nmetadata:\n  name: plexp-d3-router\nspec:\n  interfaces: [{to_rx}]\n  enforcement: none\n  levels:\n    - name: all\n      priority: 0\n  classes:\n    - name: all\n      level: all\n  default_class: all\n  d3:\n    receiver: false\n    router:\n      - interface: {to_rx}\n        capacity: {rate_bps}bit\n"
    )
}

pub(crate) fn receiver_policy(ifname: &str) -> String {
    format!(
        "apiVersion: paceline/v1\nkind: Policy\nmetadata:\n  name: plexp-d3-aggregator\nspec:\n  interfaces: [{ifname}]\n  enforcement: none\n  levels:\n    - name: all\n      priority: 0\n  classes:\n    - name: all\n      level: all\n  default_class: all\n  d3: {{}}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every policy the experiment writes passes the agent's validator and compiles (offline:
    /// the interfaces are the testbed's), and the senders' first rule selects the responses.
    #[test]
    fn policies_validate_and_compile() {
        let compiled = crate::experiments::harness::compile_offline;
        let cfg = Config::new(false);
        for m in cfg.modes.iter().filter(|m| m.kind != Kind::Tcp) {
            let c = compiled(&m.name, &sender_policy(&cfg, m, 10, "eth0"));
            assert!(
                c.rules[0].matches.contains(&format!("src_port {PORT}")),
                "{}: {:?}",
                m.name,
                c.rules[0]
            );
        }
        compiled("router", &router_policy("veth0", 1_000_000_000));
        compiled("receiver", &receiver_policy("veth1"));
    }
}
