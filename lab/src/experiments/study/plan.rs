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

    pub(crate) fn from_name(s: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.name() == s)
    }
}

/// A bottleneck buffer of `ratio` of the bandwidth-delay product, in whole frames (at least
/// one: a bfifo or netem limit below one frame holds nothing).
pub(crate) fn buffer_frames(ratio: f64, bdp_frames: f64) -> u32 {
    ((ratio * bdp_frames).round() as u32).max(1)
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
    /// Bottleneck buffers as fractions of the bandwidth-delay product measured at the start
    /// (the slides' regime: 1.7-6.8%), turned into whole frames with `buffer_frames`; unused
    /// when `buffers_pkts` is set.
    pub buffers_bdp: Vec<f64>,
    /// Bottleneck buffers in full frames, instead of `buffers_bdp`.
    pub buffers_pkts: Vec<u32>,
    /// The modes measured (names of `Mode`); unpaced must be among them (N* compares with it).
    pub modes: Vec<String>,
    /// Repetitions of the whole plan (outermost loop, so an aborted run keeps whole ones);
    /// N* is located in each and in their pooled results.
    pub reps: usize,
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
    /// The full run (about 70 minutes in the VM) or the quick smoke test.
    ///
    /// The slides' regime: buffers of 2, 4 and 7% of the bandwidth-delay product, up to 100
    /// flows. 10 Mbit/s is what TCG emulation forwards reliably (a late timer, typically 0.2 ms
    /// and at times several, is small against a frame's 1.2 ms; at 20-50 Mbit/s the
    /// bottleneck forwarded well below its rate in calibration runs), so the BDP is raised with
    /// the delay: 200 ms of RTT make it 250 KB, about 165 frames, and the buffers 3, 7 and 12
    /// frames. 34 flows per point and repetition make at least 102 over three repetitions, so
    /// the pooled p99 (nearest rank) is not the maximum.
    pub fn new(quick: bool) -> Config {
        if quick {
            Config {
                rate_bps: 10_000_000,
                delay_ms: 200.0,
                senders: 2,
                flow_bytes: 100_000,
                samples: 4,
                flows: vec![1, 8],
                buffers_bdp: vec![0.04],
                buffers_pkts: vec![],
                modes: vec!["unpaced".into(), "per-flow".into()],
                reps: 2,
                start_jitter_ms: 10.0,
                round_gap_ms: 50,
                pace_fraction: 1.0,
                shaper: "netem".into(),
                htb_burst_bytes: None,
            }
        } else {
            Config {
                rate_bps: 10_000_000,
                delay_ms: 200.0,
                senders: 4,
                flow_bytes: 150_000,
                samples: 34,
                flows: vec![1, 4, 8, 16, 32, 100],
                buffers_bdp: vec![0.02, 0.04, 0.07],
                buffers_pkts: vec![],
                modes: vec!["unpaced".into(), "per-flow".into()],
                reps: 3,
                start_jitter_ms: 10.0,
                round_gap_ms: 100,
                pace_fraction: 1.0,
                shaper: "netem".into(),
                htb_burst_bytes: None,
            }
        }
    }

    /// The buffers to measure, in frames, for a measured BDP of `bdp_frames`, each with its
    /// fraction of the BDP.
    pub(crate) fn buffers(&self, bdp_frames: f64) -> Vec<(u32, f64)> {
        let frames: Vec<u32> = if self.buffers_pkts.is_empty() {
            self.buffers_bdp
                .iter()
                .map(|&r| buffer_frames(r, bdp_frames))
                .collect()
        } else {
            self.buffers_pkts.clone()
        };
        let mut v: Vec<(u32, f64)> = Vec::new();
        for b in frames {
            if !v.iter().any(|x| x.0 == b) {
                v.push((b, b as f64 / bdp_frames));
            }
        }
        v
    }

    /// The modes, parsed (validated by [`Config::with_env`]).
    pub(crate) fn modes(&self) -> Vec<Mode> {
        self.modes.iter().filter_map(|m| Mode::from_name(m)).collect()
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
        if let Some(v) = list("BUFFERS_BDP")? {
            self.buffers_bdp = v;
            self.buffers_pkts.clear();
        }
        if let Some(v) = list::<String>("MODES")? {
            self.modes = v;
        }
        if let Some(v) = var("REPS")? {
            self.reps = v;
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
        self.check()?;
        Ok(self)
    }

    /// What a run needs: something to measure, buffers that exist, modes that do.
    pub(crate) fn check(&self) -> Result<()> {
        ensure!(
            self.senders >= 1 && !self.flows.is_empty() && self.samples >= 1 && self.reps >= 1,
            "senders, flows, samples and reps must not be empty or zero"
        );
        ensure!(
            !self.buffers_pkts.is_empty() || !self.buffers_bdp.is_empty(),
            "no buffer to measure (PACELINE_STUDY_BUFFERS or PACELINE_STUDY_BUFFERS_BDP)"
        );
        ensure!(
            self.buffers_bdp.iter().all(|&r| r > 0.0 && r <= 10.0)
                && self.buffers_pkts.iter().all(|&b| b >= 1),
            "buffers must be at least one frame and fractions of the BDP in (0, 10]"
        );
        for m in &self.modes {
            ensure!(
                Mode::from_name(m).is_some(),
                "PACELINE_STUDY_MODES: unknown mode {m:?} (unpaced, per-flow, per-host+per-flow)"
            );
        }
        ensure!(
            self.modes.iter().any(|m| m == "unpaced") && self.modes.len() >= 2,
            "PACELINE_STUDY_MODES must hold unpaced and at least one paced mode"
        );
        ensure!(
            self.pace_fraction > 0.0 && self.pace_fraction <= 2.0,
            "PACELINE_STUDY_PACE must be in (0, 2]"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The full plan is the slides' regime: buffers of 2, 4 and 7% of the BDP its delay and rate
    /// make (about 165 frames at 10 Mbit/s and 200 ms, as the run measures it), N up to 100,
    /// and enough flows per point over the repetitions that the pooled p99 (nearest rank) is
    /// not the maximum. The quick plan is runnable too.
    #[test]
    fn the_full_plan_is_in_the_seeds_regime() {
        let c = Config::new(false);
        c.check().unwrap();
        let bdp_frames = c.rate_bps as f64 / 8.0 * (c.delay_ms + 0.2) / 1e3 / FRAME as f64;
        let b = c.buffers(bdp_frames);
        assert_eq!(
            b.iter().map(|x| x.0).collect::<Vec<_>>(),
            vec![3, 7, 12],
            "{bdp_frames}"
        );
        for ((_, ratio), want) in b.iter().zip([0.02, 0.04, 0.07]) {
            assert!((ratio - want).abs() < 0.01, "{ratio} for {want}");
        }
        assert_eq!(c.flows.iter().max(), Some(&100));
        assert!(c.flows.windows(2).all(|w| w[0] < w[1]));
        for &n in &c.flows {
            let pooled = c.samples.div_ceil(n) * n * c.reps;
            assert!(
                pooled > 100,
                "N = {n}: {pooled} flows, so p99 would be the maximum"
            );
        }
        assert_eq!(c.modes()[0], Mode::Unpaced);
        Config::new(true).check().unwrap();
    }

    /// Buffers from fractions of the BDP round to whole frames, never below one, and a
    /// duplicate is measured once; frames given outright win.
    #[test]
    fn buffers_from_fractions_of_the_bdp() {
        assert_eq!(buffer_frames(0.02, 165.0), 3);
        assert_eq!(buffer_frames(0.001, 165.0), 1);
        let mut c = Config::new(false);
        c.buffers_bdp = vec![0.01, 0.012, 0.5];
        assert_eq!(
            c.buffers(100.0).iter().map(|x| x.0).collect::<Vec<_>>(),
            vec![1, 50]
        );
        c.buffers_pkts = vec![4, 16];
        assert_eq!(c.buffers(34.0), vec![(4, 4.0 / 34.0), (16, 16.0 / 34.0)]);
    }

    /// Modes are checked by name, and unpaced must be there to compare with.
    #[test]
    fn modes_are_checked() {
        let mut c = Config::new(true);
        c.modes = vec!["unpaced".into(), "per-host+per-flow".into()];
        assert_eq!(c.modes(), vec![Mode::Unpaced, Mode::PerHost]);
        c.check().unwrap();
        c.modes = vec!["per-flow".into(), "per-host+per-flow".into()];
        assert!(c.check().is_err());
        c.modes = vec!["unpaced".into(), "paced".into()];
        assert!(c.check().unwrap_err().to_string().contains("unknown mode"));
    }
}
