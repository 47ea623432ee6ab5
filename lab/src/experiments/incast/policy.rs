//! The client's and the servers' policies for each mode.

use super::*;

/// The policy of a host in `mode` (None: no agent there). `share` is the paced mode's S.
pub(crate) fn policy(
    cfg: &Config,
    mode: Mode,
    client: bool,
    ifname: &str,
    fq: bool,
    share: usize,
) -> Option<String> {
    let enforcement = if fq { "auto" } else { "sockops" };
    let head = format!(
        "apiVersion: paceline/v1\nkind: Policy\nmetadata:\n  name: plexp-incast-{m}\n  description: incast study (the incast study and Dart), mode {m}\nspec:\n  interfaces: [{ifname}]\n  enforcement: {enforcement}\n  # veths report no speed\n  link_rate: 10Gbit\n  levels: [{{name: all, priority: 0}}]\n",
        m = mode.name()
    );
    let rules = format!(
        "  rules:\n    - {{class: svc, protocol: tcp, src_port: {PORT}}}\n    - {{class: svc, protocol: tcp, dst_port: {PORT}}}\n  default_class: other\n"
    );
    match mode {
        Mode::Tcp => None,
        Mode::TcpTuned => Some(format!(
            "{head}  classes:\n    - name: svc\n      level: all\n      tcp: {{rto_min: 5ms, delack_max: 5ms}}\n    - {{name: other, level: all}}\n{rules}"
        )),
        Mode::Paced if client => None,
        Mode::Paced => Some(format!(
            "{head}  classes:\n    - name: svc\n      level: all\n      flow_rate: {}B/s\n    - {{name: other, level: all}}\n  rules:\n    - {{class: svc, protocol: tcp, src_port: {PORT}}}\n    - {{class: svc, protocol: tcp, dst_port: {BULK_PORT}}}\n  default_class: other\n",
            cfg.rate_bps / 8 / share.max(1) as u64
        )),
        Mode::Dasr | Mode::DasrTuned => {
            let role = if client {
                format!(
                    "  dasr:\n    receiver: true\n    sender: false\n    line_rate: {}bit\n    rtt: {}us\n    active_rtts: 2\n",
                    cfg.dasr_line, cfg.dasr_rtt_us
                )
            } else {
                "  dasr: {receiver: false, sender: true}\n".to_string()
            };
            let classes = if mode == Mode::DasrTuned {
                format!(
                    "  classes:\n    - name: svc\n      level: all\n      tcp: {{rto_min: 5ms, delack_max: 5ms}}\n    - {{name: other, level: all}}\n{rules}"
                )
            } else {
                "  classes: [{name: all, level: all}]\n  default_class: all\n".to_string()
            };
            Some(format!("{head}  horizon: 1s\n{classes}{role}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_and_carry_the_mode() {
        let cfg = Config::new(false, false);
        for mode in Mode::ALL {
            for client in [false, true] {
                let Some(text) = policy(&cfg, mode, client, "veth0", false, 16) else {
                    assert!(mode == Mode::Tcp || (mode == Mode::Paced && client));
                    continue;
                };
                crate::experiments::harness::compile_offline(
                    &format!("{} client={client}", mode.name()),
                    &text,
                );
                match mode {
                    Mode::TcpTuned => assert!(text.contains("rto_min: 5ms")),
                    Mode::Paced => assert!(text.contains(&format!("flow_rate: {}B/s", 50_000_000 / 16))),
                    Mode::Dasr | Mode::DasrTuned if client => assert!(text.contains("receiver: true")),
                    Mode::Dasr | Mode::DasrTuned => assert!(text.contains("sender: true")),
                    Mode::Tcp => unreachable!(),
                }
            }
        }
    }
}
