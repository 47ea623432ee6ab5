//! The conditions to run: policies (flat or QJump levels) and numbers of bulk flows.

/// The switch port's default rate (bit/s; `--rate-mbit` sets another): well below what the
/// emulated VM forwards through two hops with everything else running (a 50 Mbit/s port ran at
/// a third of its rate under TCG, the CPUs being the bottleneck), so that the port, not the
/// CPU, is the bottleneck and its queue fills. The price: a full frame occupies the port for
/// 606 us, and a strict-priority port cannot preempt the frame it is sending, so an RPC
/// behind one waits up to that long whatever its level.
pub const DEFAULT_RATE_MBIT: u64 = 20;

/// Each switch queue's buffer (bytes): a shallow switch-like buffer of 33 full frames, 20 ms
/// at 20 Mbit/s.
pub(crate) const BUFFER: u32 = 50_000;

/// RPCs per second (open loop, fixed interval): light enough to leave the emulated CPUs idle
/// most of the time.
pub(crate) const RPC_RATE: f64 = 200.0;

/// Request and response sizes (bytes).
pub(crate) const RPC_SIZE: u32 = 64;

/// Sender hosts (s0 runs the RPC client, the others bulk flows): QJump's n.
pub(crate) const SENDERS: usize = 4;

/// QJump's P: one full frame (paceline's rates count whole frames).
pub(crate) const MAX_PACKET: &str = "1514B";

/// QJump's eps: one software switch hop.
pub(crate) const SWITCH_DELAY: &str = "10us";

pub(crate) const RPC_PORT: u16 = 5001;

pub(crate) const BULK_PORT: u16 = 5002;

/// The aim: p99 with levels within this factor of p99 idle.
pub(crate) const AIM: f64 = 1.5;

/// Which policy the senders run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Policy {
    Flat,
    QJump,
}

/// One experimental condition.
#[derive(Clone, Debug)]
pub(crate) struct Cond {
    pub(crate) name: &'static str,
    pub(crate) policy: Policy,
    /// Bulk flows.
    pub(crate) bulk: u32,
    /// Bulk flows go to `rx2` (another switch port) instead of `rx`.
    pub(crate) elsewhere: bool,
}

impl Cond {
    pub(crate) fn key(&self) -> String {
        format!("{}/{}", self.name, self.bulk)
    }
}

pub(crate) fn conditions(bulk_counts: &[u32]) -> Vec<Cond> {
    let mut v = vec![Cond {
        name: "idle",
        policy: Policy::Flat,
        bulk: 0,
        elsewhere: false,
    }];
    for &k in bulk_counts {
        v.push(Cond {
            name: "no-levels",
            policy: Policy::Flat,
            bulk: k,
            elsewhere: false,
        });
    }
    v.push(Cond {
        name: "idle-levels",
        policy: Policy::QJump,
        bulk: 0,
        elsewhere: false,
    });
    for &k in bulk_counts {
        v.push(Cond {
            name: "levels",
            policy: Policy::QJump,
            bulk: k,
            elsewhere: false,
        });
        v.push(Cond {
            name: "levels-bulk-elsewhere",
            policy: Policy::QJump,
            bulk: k,
            elsewhere: true,
        });
    }
    v
}

/// Durations of one condition.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    /// Bulk flows start this long before the RPCs.
    pub(crate) lead_s: f64,
    /// RPC run (its first `warmup_s` not sampled).
    pub(crate) rpc_s: f64,
    pub(crate) warmup_s: f64,
    /// Bulk flows go on this long after the RPCs end.
    pub(crate) tail_s: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference (idle), then every bulk count without and with levels, each condition
    /// under its own key.
    #[test]
    fn conditions_cover_every_bulk_count_with_and_without_levels() {
        let c = conditions(&[1, 4]);
        assert_eq!((c[0].name, c[0].bulk, c[0].policy), ("idle", 0, Policy::Flat));
        for k in [1, 4] {
            for (name, policy) in [("no-levels", Policy::Flat), ("levels", Policy::QJump)] {
                assert!(
                    c.iter()
                        .any(|x| x.name == name && x.bulk == k && x.policy == policy),
                    "{name} with {k} bulk flows"
                );
            }
        }
        let keys: std::collections::BTreeSet<String> = c.iter().map(Cond::key).collect();
        assert_eq!(keys.len(), c.len(), "keys are unique");
        assert!(c.iter().filter(|x| x.elsewhere).all(|x| x.bulk > 0));
    }
}
