//! QJump's network epoch and per-level rate limits (Grosvenor et al., NSDI 2015; QJump).
//!
//! With `n` hosts, each sending at most one `P`-byte packet per epoch into a network whose
//! slowest link runs at `R` bytes/s and whose switches add `eps` along the longest path, a packet
//! waits at most `n*P/R + eps`. The network epoch is `2*n*P/R + eps`. A level with throughput
//! factor `f` behaves as if only `n/f` hosts shared it:
//!
//! ```text
//! epoch_f = 2 * (n/f) * P / R + eps        rate_f = min(P / epoch_f, R)
//! ```
//!
//! The lowest level (factor `n`, "unlimited") is not rate-limited. User side only (floats).

/// The network-wide parameters of a QJump deployment.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Network {
    /// `n`: hosts that can send into the network.
    pub hosts: u64,
    /// `P`: largest packet a host sends per epoch, bytes.
    pub max_packet: u64,
    /// `R`: rate of the slowest link, bytes/s.
    pub link_rate: u64,
    /// `eps`: cumulative switch processing delay along the longest path, ns.
    pub switch_delay_ns: u64,
}

impl Network {
    /// The epoch of a level with throughput factor `f`, in seconds.
    pub fn epoch_secs(&self, factor: f64) -> f64 {
        2.0 * (self.hosts as f64 / factor) * self.max_packet as f64 / self.link_rate as f64
            + self.switch_delay_ns as f64 * 1e-9
    }

    /// The worst-case servicing delay of a packet in an idle network, `n*P/R + eps`, seconds.
    pub fn worst_case_delay_secs(&self) -> f64 {
        self.hosts as f64 * self.max_packet as f64 / self.link_rate as f64
            + self.switch_delay_ns as f64 * 1e-9
    }

    /// The rate limit of a level with throughput factor `f` on one host, bytes/s (whole bytes,
    /// rounded down, never above the link rate and never 0).
    pub fn level_rate(&self, factor: f64) -> u64 {
        let r = self.max_packet as f64 / self.epoch_secs(factor);
        let r = r.min(self.link_rate as f64);
        if r < 1.0 { 1 } else { r as u64 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The paper's simulation: P = 9 KB, R = 10 Gb/s.
    fn paper(n: u64) -> Network {
        Network {
            hosts: n,
            max_packet: 9_000,
            link_rate: 1_250_000_000,
            switch_delay_ns: 0,
        }
    }

    #[test]
    fn top_level_is_one_packet_per_epoch() {
        let net = paper(1000);
        // epoch = 2 * 1000 * 9000 / 1.25e9 = 14.4 ms
        assert!((net.epoch_secs(1.0) - 0.0144).abs() < 1e-12);
        // rate = 9000 B / 14.4 ms = 625 000 B/s = 5 Mbit/s
        assert_eq!(net.level_rate(1.0), 625_000);
    }

    #[test]
    fn factor_scales_rate_linearly_without_eps() {
        let net = paper(1000);
        let base = net.level_rate(1.0) as f64;
        for f in [1.44, 7.2, 14.4, 28.8, 48.0, 72.0, 144.0] {
            let r = net.level_rate(f) as f64;
            assert!((r / base - f).abs() < 1e-6 * f, "factor {f}: {r} vs {base}");
        }
    }

    #[test]
    fn eps_lengthens_the_epoch() {
        let mut net = paper(100);
        let no_eps = net.level_rate(1.0);
        net.switch_delay_ns = 4_000;
        // epoch = 2*100*9000/1.25e9 + 4us = 1.44 ms + 4 us
        assert!((net.epoch_secs(1.0) - 0.001444).abs() < 1e-12);
        assert!(net.level_rate(1.0) < no_eps);
        assert_eq!(net.level_rate(1.0), (9_000.0 / 0.001444) as u64);
    }

    #[test]
    fn capped_at_link_rate() {
        let net = paper(10);
        // factor n and beyond: epoch shorter than one packet time would exceed R.
        assert_eq!(net.level_rate(1_000.0), 1_250_000_000);
    }

    #[test]
    fn worst_case_delay() {
        let net = Network {
            hosts: 1000,
            max_packet: 9_000,
            link_rate: 1_250_000_000,
            switch_delay_ns: 4_000,
        };
        assert!((net.worst_case_delay_secs() - (0.0072 + 0.000004)).abs() < 1e-12);
    }
}
