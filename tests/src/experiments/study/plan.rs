//! What the study runs: buffers, numbers of flows, modes, rates and repetitions.

use anyhow::{Result, anyhow, ensure};
use serde::Serialize;

pub(crate) const NAME: &str = "pacing-study";

/// The study's TCP port (the agents' class rule matches it).
pub(crate) const PORT: u16 = 5301;

/// A full frame on the wire of the veths (MTU 1500 + Ethernet header): what HTB, bfifo and the
/// agent's rates count.
pub(crate) const FRAME: u32 = 1514;

/// TCP payload per full frame (MSS 1448 with timestamps).
pub(crate) const PAYLOAD: f64 = 1448.0;

/// Relative margin by which paced must beat unpaced to count as "helping" (N*).
pub const TOLERANCE: f64 = 0.05;

/// How the senders pace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Unpaced,
    PerFlow,
    PerHost,
}

impl Mode {
    pub(crate) const ALL: [Mode; 3] = [Mode::Unpaced, Mode::PerFlow, Mode::PerHost];
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Unpaced => "unpaced",
            Mode::PerFlow => "per-flow",
            Mode::PerHost => "per-host+per-flow",
        }
    }
}

/// The experiment's knobs (all of them end up in the JSON).
#[derive(Clone, Debug, Serialize)]
pub struct Config {
    /// Bottleneck rate, bit/s.
    pub rate_bps: u64,
    /// netem delay on the ACK path, ms (the base RTT is this plus the testbed's own).
    pub delay_ms: f64,
    /// Sender hosts.
    pub senders: usize,
    /// Bytes per flow.
    pub flow_bytes: u64,
    /// Flows per point at least (rounds of N flows until reached).
    pub samples: usize,
    /// The N axis.
    pub flows: Vec<usize>,
    /// Bottleneck buffers, in full frames.
    pub buffers_pkts: Vec<u32>,
    /// Each flow starts after a seeded uniform offset in [0, this) ms.
    pub start_jitter_ms: f64,
    /// Pause between rounds, ms (lets the queue drain and the sockets close).
    pub round_gap_ms: u64,
    /// Paced rates as a fraction of the fair share (1.0: exactly rate / N and the host's
    /// share).
    pub pace_fraction: f64,
    /// The bottleneck qdisc: `netem` (`rate` + `limit` in packets) or `htb` (HTB + bfifo,
    /// the testbed's); netem falls back to HTB where the kernel has no sch_netem.
    pub shaper: String,
    /// HTB `burst`/`cburst` of the bottleneck class in bytes (None: tc's default, about one
    /// MTU with high-resolution timers).
    pub htb_burst_bytes: Option<u32>,
}

impl Config {
    /// The full run (VM budget ~15 minutes) or the quick smoke test.
    pub fn new(quick: bool) -> Config {
        // 10 Mbit/s: under TCG a late timer (typically 0.2 ms, at times several ms) is small
        // against a frame's 1.2 ms; at 20-50 Mbit/s the bottleneck forwarded well below its rate
        // in calibration runs. 40 ms of RTT make the BDP 50 KB (33 frames).
        if quick {
            Config {
                rate_bps: 10_000_000,
                delay_ms: 40.0,
                senders: 2,
                flow_bytes: 250_000,
                samples: 8,
                flows: vec![1, 8],
                buffers_pkts: vec![4],
                start_jitter_ms: 10.0,
                round_gap_ms: 50,
                pace_fraction: 1.0,
                shaper: "netem".into(),
                htb_burst_bytes: None,
            }
        } else {
            Config {
                rate_bps: 10_000_000,
                delay_ms: 40.0,
                senders: 4,
                flow_bytes: 500_000,
                samples: 24,
                flows: vec![1, 4, 8, 16, 32],
                buffers_pkts: vec![4, 16],
                start_jitter_ms: 10.0,
                round_gap_ms: 100,
                pace_fraction: 1.0,
                shaper: "netem".into(),
                htb_burst_bytes: None,
            }
        }
    }

    /// Overrides from `PACELINE_STUDY_*` variables (they reach the VM), for exploring the
    /// parameter space without editing code; the JSON records what ran.
    pub fn with_env(mut self) -> Result<Config> {
        fn var<T: std::str::FromStr>(k: &str) -> Result<Option<T>> {
            match std::env::var(format!("PACELINE_STUDY_{k}")) {
                Ok(v) => v
                    .trim()
                    .parse()
                    .map(Some)
                    .map_err(|_| anyhow!("PACELINE_STUDY_{k}={v:?} does not parse")),
                Err(_) => Ok(None),
            }
        }
        fn list<T: std::str::FromStr>(k: &str) -> Result<Option<Vec<T>>> {
            match std::env::var(format!("PACELINE_STUDY_{k}")) {
                Ok(v) => v
                    .split(',')
                    .map(|x| {
                        x.trim()
                            .parse()
                            .map_err(|_| anyhow!("PACELINE_STUDY_{k}={v:?} does not parse"))
                    })
                    .collect::<Result<Vec<T>>>()
                    .map(Some),
                Err(_) => Ok(None),
            }
        }
        if let Some(m) = var::<f64>("RATE_MBIT")? {
            self.rate_bps = (m * 1e6) as u64;
        }
        if let Some(v) = var("DELAY_MS")? {
            self.delay_ms = v;
        }
        if let Some(v) = var("SENDERS")? {
            self.senders = v;
        }
        if let Some(v) = var("FLOW_BYTES")? {
            self.flow_bytes = v;
        }
        if let Some(v) = var("SAMPLES")? {
            self.samples = v;
        }
        if let Some(v) = list("FLOWS")? {
            self.flows = v;
        }
        if let Some(v) = list("BUFFERS")? {
            self.buffers_pkts = v;
        }
        if let Some(v) = var("JITTER_MS")? {
            self.start_jitter_ms = v;
        }
        if let Some(v) = var("PACE")? {
            self.pace_fraction = v;
        }
        if let Some(v) = var::<String>("SHAPER")? {
            ensure!(
                v == "netem" || v == "htb",
                "PACELINE_STUDY_SHAPER must be netem or htb"
            );
            self.shaper = v;
        }
        if let Some(v) = var("HTB_BURST")? {
            self.htb_burst_bytes = Some(v);
        }
        ensure!(
            self.senders >= 1 && !self.flows.is_empty() && !self.buffers_pkts.is_empty() && self.samples >= 1
        );
        ensure!(
            self.pace_fraction > 0.0 && self.pace_fraction <= 2.0,
            "PACELINE_STUDY_PACE must be in (0, 2]"
        );
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The full and the quick plan are runnable as they stand: flows and buffers to measure,
    /// samples to collect, and buffers below the bandwidth-delay product (the seed's regime).
    #[test]
    fn both_plans_run_below_the_bdp() {
        for quick in [false, true] {
            let c = Config::new(quick);
            assert!(!c.flows.is_empty() && c.flows.windows(2).all(|w| w[0] < w[1]));
            assert!(c.samples >= 1 && c.senders >= 1 && c.flow_bytes > 0);
            let bdp_frames = c.rate_bps as f64 / 8.0 * c.delay_ms / 1e3 / FRAME as f64;
            for &b in &c.buffers_pkts {
                assert!(
                    (b as f64) < bdp_frames,
                    "buffer {b} frames against a BDP of {bdp_frames:.1}"
                );
            }
        }
    }
}
