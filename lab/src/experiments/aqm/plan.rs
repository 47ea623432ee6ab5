//! What the experiment runs: the queue disciplines, congestion controls and the class's rate.

use serde::Serialize;

pub(crate) const NAME: &str = "aqm";

pub(crate) const PORT: u16 = 5600;

pub(crate) const CLASS: &str = "paced";

/// What holds the class's queue down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Queue {
    /// Only the horizon (the agent's default): packets due beyond it are dropped.
    Horizon,
    /// CoDel on the departure delay, marking CE on ECN-capable packets.
    CodelEcn,
}

impl Queue {
    pub const ALL: [Queue; 2] = [Queue::Horizon, Queue::CodelEcn];
    pub fn name(self) -> &'static str {
        match self {
            Queue::Horizon => "horizon",
            Queue::CodelEcn => "codel-ecn",
        }
    }
}

/// The senders' congestion control.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cc {
    /// cubic, ECN negotiated.
    CubicEcn,
    /// cubic, no ECN (CoDel drops instead of marking).
    Cubic,
    /// DCTCP (ECN on; needs the kernel's tcp_dctcp).
    Dctcp,
}

impl Cc {
    pub const ALL: [Cc; 3] = [Cc::CubicEcn, Cc::Cubic, Cc::Dctcp];
    pub fn name(self) -> &'static str {
        match self {
            Cc::CubicEcn => "cubic+ecn",
            Cc::Cubic => "cubic",
            Cc::Dctcp => "dctcp",
        }
    }
    pub(crate) fn algorithm(self) -> &'static str {
        match self {
            Cc::CubicEcn | Cc::Cubic => "cubic",
            Cc::Dctcp => "dctcp",
        }
    }
    pub(crate) fn ecn(self) -> bool {
        !matches!(self, Cc::Cubic)
    }
}

/// The benchmark's knobs (all of them end up in the JSON).
#[derive(Clone, Debug, Serialize)]
pub struct Config {
    /// The class's rate, bit/s.
    pub rate_bps: u64,
    /// Bulk TCP flows offered to it.
    pub flows: u32,
    /// Seconds before measuring.
    pub warmup_s: f64,
    /// Seconds measured.
    pub duration_s: f64,
    /// CoDel's target, ms.
    pub target_ms: u64,
    /// CoDel's interval, ms.
    pub interval_ms: u64,
}

impl Config {
    pub fn new(quick: bool) -> Config {
        Config {
            // What the emulated VM sends without running out itself.
            rate_bps: 20_000_000,
            flows: 8,
            warmup_s: 2.0,
            duration_s: if quick { 4.0 } else { 10.0 },
            target_ms: 5,
            interval_ms: 100,
        }
    }
}
