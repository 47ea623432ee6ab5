//! The sender's policy for each queue discipline.

use super::*;

pub(crate) fn policy(cfg: &Config, ifname: &str, q: Queue) -> String {
    let codel = match q {
        Queue::Horizon => String::new(),
        Queue::CodelEcn => format!(
            "      codel: {{target: {}ms, interval: {}ms, ecn: true}}\n",
            cfg.target_ms, cfg.interval_ms
        ),
    };
    format!(
        "apiVersion: paceline/v1\nkind: Policy\nmetadata:\n  name: plexp-aqm-{q}\n  description: AQM benchmark, queue {q}\nspec:\n  interfaces: [{ifname}]\n  enforcement: fq\n  # veths report no speed\n  link_rate: 10Gbit\n  levels: [{{name: bulk, priority: 0}}]\n  classes:\n    - name: {CLASS}\n      level: bulk\n      class_rate: {rate}bit\n{codel}    - {{name: other, level: bulk}}\n  rules:\n    - {{class: {CLASS}, protocol: tcp, dst_port: {PORT}}}\n  default_class: other\n",
        q = q.name(),
        rate = cfg.rate_bps,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_validate_without_warnings() {
        let cfg = Config::new(false);
        for q in Queue::ALL {
            let text = policy(&cfg, "veth0", q);
            crate::experiments::harness::compile_offline(q.name(), &text);
            assert_eq!(text.contains("codel:"), q == Queue::CodelEcn);
        }
    }
}
