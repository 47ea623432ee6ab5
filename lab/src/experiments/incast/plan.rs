//! What the experiment runs: modes, numbers of servers, block and fragment sizes.

use serde::Serialize;

pub(crate) const NAME: &str = "incast";

/// The servers' port (fragments and short messages).
pub const PORT: u16 = 5500;

/// The client's bulk server (the micro-benchmark's competing senders).
pub const BULK_PORT: u16 = 5501;

/// The modes, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Linux defaults, no agent.
    Tcp,
    /// Agents with rto_min and delack_max of 5 ms for the service.
    TcpTuned,
    /// Agents pacing each flow at rate / S.
    Paced,
    /// DASR: the client counts, the servers cap at line / N.
    Dasr,
    /// DASR and the tcp-tuned settings together (what `policies/incast-dasr.yaml` ships).
    DasrTuned,
}

impl Mode {
    pub const ALL: [Mode; 5] = [
        Mode::Tcp,
        Mode::TcpTuned,
        Mode::Paced,
        Mode::Dasr,
        Mode::DasrTuned,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Mode::Tcp => "tcp",
            Mode::TcpTuned => "tcp-tuned",
            Mode::Paced => "paced",
            Mode::Dasr => "dasr",
            Mode::DasrTuned => "dasr-tuned",
        }
    }
    pub(crate) fn dasr(self) -> bool {
        matches!(self, Mode::Dasr | Mode::DasrTuned)
    }
}

/// The experiment's knobs (all of them end up in the JSON).
#[derive(Clone, Debug, Serialize)]
pub struct Config {
    /// Bottleneck rate, bit/s.
    pub rate_bps: u64,
    /// Bottleneck buffer, bytes.
    pub buffer_bytes: u32,
    /// Server hosts (namespaces); the S servers are spread over them round-robin.
    pub sender_hosts: usize,
    /// The S axis.
    pub servers: Vec<usize>,
    /// Bytes per fragment (the incast study: 256 KB).
    pub fragment_bytes: u64,
    /// Blocks per point (the incast study: 100).
    pub blocks: u64,
    /// The line rate the client advertises in `dasr`, bit/s (a few percent below the port's:
    /// shares that add up to exactly its rate keep a standing queue, docs/dasr.md).
    pub dasr_line: u64,
    /// DASR's `rtt` (the fabric's RTT without queueing), microseconds.
    pub dasr_rtt_us: u64,
    /// Micro-benchmark: message size, bytes.
    pub micro_message_bytes: u64,
    /// Micro-benchmark: competing bulk flows.
    pub micro_competitors: Vec<u32>,
    /// Micro-benchmark: seconds per measurement.
    pub micro_duration_s: f64,
    /// The modes.
    pub modes: Vec<Mode>,
}

impl Config {
    /// The host run (400 Mbit/s, the incast study's sizes) or the VM's scaled-down one (under TCG the
    /// emulated port forwards about 20 Mbit/s); `quick` for a smoke test of either.
    pub fn new(quick: bool, in_vm: bool) -> Config {
        let mut c = if in_vm {
            Config {
                rate_bps: 20_000_000,
                // 43 frames: the study's 64 KB, so a synchronized start of S <= 32 flows, one
                // frame each, fits (32 KB did not, even with every flow paced).
                buffer_bytes: 65_536,
                sender_hosts: 4,
                servers: vec![1, 4, 16, 32],
                fragment_bytes: 32_768,
                blocks: 10,
                dasr_line: 19_000_000,
                dasr_rtt_us: 2_000,
                micro_message_bytes: 8_192,
                micro_competitors: vec![0, 4],
                micro_duration_s: 8.0,
                modes: Mode::ALL.to_vec(),
            }
        } else {
            Config {
                // Not 1 Gbit/s: with offloads off, two cores forward about 650 Mbit/s through
                // the namespaces (one TCP flow at a 1 Gbit/s port reached 64-68%), so the
                // port would not be the bottleneck; at 400 Mbit/s it is (one flow: 94%).
                rate_bps: 400_000_000,
                buffer_bytes: 128 * 1024,
                sender_hosts: 8,
                servers: vec![1, 2, 4, 8, 16, 32, 48, 64],
                fragment_bytes: 256 * 1024,
                blocks: 40,
                dasr_line: 380_000_000,
                dasr_rtt_us: 200,
                micro_message_bytes: 32 * 1024,
                micro_competitors: vec![0, 8],
                micro_duration_s: 4.0,
                modes: Mode::ALL.to_vec(),
            }
        };
        if quick {
            c.servers = vec![1, 8, 32];
            c.blocks = 6;
            c.micro_competitors = vec![4];
            c.micro_duration_s = 2.0;
        }
        c
    }

    /// Applies the `PLEXP_INCAST_*` development overrides.
    pub(crate) fn with_env(mut self) -> Config {
        let var = |k: &str| std::env::var(k).ok().filter(|s| !s.trim().is_empty());
        if let Some(m) = var("PLEXP_INCAST_MODES") {
            let want: Vec<&str> = m.split(',').map(str::trim).collect();
            self.modes.retain(|x| want.contains(&x.name()));
        }
        if let Some(s) = var("PLEXP_INCAST_S") {
            self.servers = s.split(',').filter_map(|x| x.trim().parse().ok()).collect();
        }
        if let Some(b) = var("PLEXP_INCAST_BLOCKS").and_then(|b| b.trim().parse().ok()) {
            self.blocks = b;
        }
        if let Some(m) = var("PLEXP_INCAST_RATE_MBIT").and_then(|b| b.trim().parse::<u64>().ok()) {
            self.rate_bps = m * 1_000_000;
            self.dasr_line = m * 950_000;
        }
        if let Some(b) = var("PLEXP_INCAST_BUFFER").and_then(|b| b.trim().parse().ok()) {
            self.buffer_bytes = b;
        }
        if var("PLEXP_INCAST_MICRO").as_deref() == Some("0") {
            self.micro_competitors.clear();
        }
        self
    }
}

/// A block's completion time at the port's rate with nothing lost: its frames' wire bytes
/// (1448-byte segments of 1514-byte frames) over the rate.
pub(crate) fn ideal_block_ms(cfg: &Config, s: usize) -> f64 {
    let bytes = cfg.fragment_bytes as f64 * s as f64 * 1514.0 / 1448.0;
    bytes * 8.0 / cfg.rate_bps as f64 * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ideal_block_is_wire_bytes_over_rate() {
        let cfg = Config::new(false, false);
        // 64 x 256 KiB of payload in 1448-byte segments at 400 Mbit/s: 350.9 ms.
        let ms = ideal_block_ms(&cfg, 64);
        assert!((ms - 350.9).abs() < 0.1, "{ms}");
    }
}
