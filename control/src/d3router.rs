//! The D3 router side of the agent: attaches `pl_d3_router` to the egress of each router link
//! of the policy, owns each link's capacity C, and runs the soft-state capacity controller
//! every interval T (`paceline_common::d3::capacity_tick`): under-use raises C, a queue lowers
//! it, and when no request arrives for a few intervals the counters reset (what dead hosts
//! leaked washes out).

use anyhow::{Context as _, Result};
use paceline_common::{
    d3::{self, D3LinkConfig, D3LinkState, TICK_RESET},
    maps::{D3LinkCounters, D3LinkCtl},
};
use serde::Serialize;

use crate::{datapath::Datapath, policy::validate::D3Link, qstats::QdiscStats};

/// The controller lowers C by at most 1/5 per interval.
pub const MAX_DECREASE_DEN: u64 = 5;

/// Quiet time after which a link's counters reset.
pub const IDLE_RESET_NS: u64 = 100_000_000;

/// The largest burst a sender hands the link at once: a 64 KB TSO/GSO packet (and the GRO
/// packets a forwarding router sees are as large).
pub const MAX_BURST_BYTES: u64 = 65_536;

/// Most queue samples the standing-queue filter keeps.
const QUEUE_WINDOW_MAX: usize = 64;

/// The standing queue: the smallest of the queue samples of the last `window` intervals.
/// One sample per tick sees every burst in flight (on a 100 Mbit/s link a single 15 KB GRO
/// packet is 1.2 ms of queue, longer than the 1 ms tick), and `q/T` on such a sample cut C by
/// the 20% step limit on most ticks of a two-flow run: C hovered at 3-9 MB/s on a 12.5 MB/s
/// link, the fair share `(C - D)/N` was about 0 and deadline flows finished at their
/// deadline instead of early. A queue that persists through a whole window is one the flows
/// built; the window is long enough for the link to drain two maximal bursts.
#[derive(Clone, Debug)]
pub struct StandingQueue {
    samples: [u64; QUEUE_WINDOW_MAX],
    window: usize,
    next: usize,
}

impl StandingQueue {
    /// A filter for a link of `line_rate` bytes/s ticking every `interval_ns`: the window
    /// covers the drain time of two maximal bursts, and at least 4 intervals.
    pub fn new(line_rate: u64, interval_ns: u64) -> StandingQueue {
        let drain_ns = (2 * MAX_BURST_BYTES) as u128 * 1_000_000_000 / line_rate.max(1) as u128;
        let ticks = drain_ns.div_ceil(interval_ns.max(1) as u128);
        StandingQueue {
            samples: [0; QUEUE_WINDOW_MAX],
            window: (ticks as usize).clamp(4, QUEUE_WINDOW_MAX),
            next: 0,
        }
    }

    /// Intervals the filter looks back over.
    pub fn window(&self) -> usize {
        self.window
    }

    /// Records this interval's sample and returns the standing queue.
    pub fn push(&mut self, q: u64) -> u64 {
        self.samples[self.next] = q;
        self.next = (self.next + 1) % self.window;
        self.value()
    }

    /// The standing queue: the window's minimum. The window starts out empty (zeros): a queue
    /// counts once it has lasted a whole window.
    pub fn value(&self) -> u64 {
        self.samples[..self.window].iter().copied().min().unwrap_or(0)
    }
}

/// One router link as the agent tracks it.
pub struct Link {
    pub name: String,
    pub ifindex: u32,
    pub cfg: D3LinkConfig,
    /// The controller's view of C, D, A, N between ticks.
    state: D3LinkState,
    last_sent: u64,
    last_requests: u64,
    pub resets: u64,
    /// The last queue sample, and the filter that gives the standing queue the controller used.
    pub last_queue: u64,
    queue: StandingQueue,
}

/// A link's figures for metrics and status.
#[derive(Clone, Debug, Serialize)]
pub struct LinkReport {
    pub interface: String,
    pub capacity_bytes_per_second: u64,
    pub line_rate_bytes_per_second: u64,
    pub flows: u64,
    pub demand_bytes_per_second: u64,
    pub allocated_bytes_per_second: u64,
    pub requests: u64,
    pub fins: u64,
    pub new_flows: u64,
    pub clamped: u64,
    pub unprocessed: u64,
    pub base_floor: u64,
    pub short_grants: u64,
    pub duplicates: u64,
    pub sent_bytes: u64,
    pub idle_resets: u64,
    pub queue_bytes: u64,
    pub standing_queue_bytes: u64,
}

/// One controller interval of a link, without the datapath: the queue sample goes through the
/// standing-queue filter, `capacity_tick` updates C, and a queue lowers C by at most
/// 1/`MAX_DECREASE_DEN` per interval. beta * q / T with beta = 1 removes a whole queue's worth
/// of rate per interval: on a 100 Mbit/s link a 30 KB queue took C from the line rate to its
/// floor in one 1 ms tick and every grant went to 0 (the paper's constants suit 1 Gbit/s).
/// Returns `capacity_tick`'s `TICK_*` bits.
pub fn control_step(
    state: &mut D3LinkState,
    cfg: &D3LinkConfig,
    queue: &mut StandingQueue,
    sent: u64,
    q: u64,
    interval_ns: u64,
) -> u32 {
    let standing_queue = queue.push(q);
    let before = state.capacity;
    let tick = d3::capacity_tick(state, cfg, sent, standing_queue, interval_ns);
    let floor = before - before / MAX_DECREASE_DEN;
    if tick & TICK_RESET == 0 && state.capacity < floor {
        state.capacity = floor.max(cfg.capacity_min);
    }
    tick
}

pub struct Router {
    pub links: Vec<Link>,
    pub interval_ns: u64,
    qstats: Option<QdiscStats>,
}

impl Router {
    /// Configures the links in the datapath (C = the line rate, zero counters). Attaching the
    /// program is the caller's (it records attachments for cleanup).
    pub fn new(dp: &mut Datapath, links: &[D3Link], interval_ns: u64) -> Result<Router> {
        let mut out = Vec::new();
        for l in links {
            let ifindex = nix::net::if_::if_nametoindex(l.interface.as_str())
                .with_context(|| format!("D3 router link {}: no such interface", l.interface))?;
            let mut cfg = D3LinkConfig::for_line_rate(l.capacity);
            cfg.base_rate = l.base_rate;
            cfg.flow_cap = l.flow_cap;
            // No overbooking: the controller may lower C under a queue and raise it back,
            // but not above the link. Above it, an idle link's first flow is granted more
            // than the link (measured: 13.7 MB/s on 12.5 MB/s) and the next ones wait.
            cfg.capacity_max = l.capacity;
            // "Idle" means no request for about 100 ms: a flow paced at the base rate sends
            // a request only every ~10-20 ms (one per segment-carrying RTT), and resetting
            // under live flows forgets their allocations.
            cfg.idle_reset_intervals = (IDLE_RESET_NS / interval_ns.max(1)).clamp(4, u32::MAX as u64) as u32;
            let state = D3LinkState::new(&cfg);
            dp.set_d3_link_ctl(
                ifindex,
                &D3LinkCtl {
                    cfg,
                    capacity: state.capacity,
                },
            )?;
            dp.set_d3_link_counters(ifindex, &D3LinkCounters::default())?;
            out.push(Link {
                name: l.interface.clone(),
                ifindex,
                cfg,
                state,
                last_sent: 0,
                last_requests: 0,
                resets: 0,
                last_queue: 0,
                queue: StandingQueue::new(l.capacity, interval_ns),
            });
        }
        let qstats = match QdiscStats::new() {
            Ok(q) => Some(q),
            Err(e) => {
                log::warn!("D3 router: cannot read queue lengths ({e:#}); the controller runs without q");
                None
            }
        };
        Ok(Router {
            links: out,
            interval_ns,
            qstats,
        })
    }

    /// One controller interval for every link.
    pub fn tick(&mut self, dp: &mut Datapath) -> Result<()> {
        for l in &mut self.links {
            let c = dp.d3_link_counters(l.ifindex)?;
            let sent = c.sent_bytes.wrapping_sub(l.last_sent);
            l.last_sent = c.sent_bytes;
            l.state.requests = c.requests.wrapping_sub(l.last_requests);
            l.last_requests = c.requests;
            l.state.demand = D3LinkCounters::clamp(c.demand);
            l.state.allocated = D3LinkCounters::clamp(c.allocated);
            l.state.flows = D3LinkCounters::clamp(c.flows);
            let q = match &mut self.qstats {
                Some(s) => s.root_backlog(l.ifindex).unwrap_or(0),
                None => 0,
            };
            l.last_queue = q;
            let before = l.state.capacity;
            let out = control_step(&mut l.state, &l.cfg, &mut l.queue, sent, q, self.interval_ns);
            if q > 0 || l.state.flows > 0 {
                log::trace!(
                    "D3 {}: C {} -> {} B/s, D {}, A {}, N {}, sent {} B, queue {} B (standing {} B)",
                    l.name,
                    before,
                    l.state.capacity,
                    l.state.demand,
                    l.state.allocated,
                    l.state.flows,
                    sent,
                    q,
                    l.queue.value()
                );
            }
            dp.set_d3_link_ctl(
                l.ifindex,
                &D3LinkCtl {
                    cfg: l.cfg,
                    capacity: l.state.capacity,
                },
            )?;
            if out & TICK_RESET != 0 {
                // No request for a while: nothing adds concurrently, so zeroing is safe.
                let mut z = c;
                z.demand = 0;
                z.allocated = 0;
                z.flows = 0;
                dp.set_d3_link_counters(l.ifindex, &z)?;
                l.resets += 1;
            }
        }
        Ok(())
    }

    pub fn report(&self, dp: &Datapath) -> Vec<LinkReport> {
        self.links
            .iter()
            .filter_map(|l| {
                let c = dp.d3_link_counters(l.ifindex).ok()?;
                let ctl = dp.d3_link_ctl(l.ifindex).ok()?;
                Some(LinkReport {
                    interface: l.name.clone(),
                    capacity_bytes_per_second: ctl.capacity,
                    line_rate_bytes_per_second: l.cfg.line_rate,
                    flows: D3LinkCounters::clamp(c.flows),
                    demand_bytes_per_second: D3LinkCounters::clamp(c.demand),
                    allocated_bytes_per_second: D3LinkCounters::clamp(c.allocated),
                    requests: c.requests,
                    fins: c.fins,
                    new_flows: c.news,
                    clamped: c.clamped,
                    unprocessed: c.unprocessed,
                    base_floor: c.base_floor,
                    short_grants: c.short,
                    duplicates: c.duplicates,
                    sent_bytes: c.sent_bytes,
                    idle_resets: l.resets,
                    queue_bytes: l.last_queue,
                    standing_queue_bytes: l.queue.value(),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_covers_two_bursts_and_at_least_four_ticks() {
        // 100 Mbit/s: 128 KB drain in 10.5 ms, 11 ticks of 1 ms.
        assert_eq!(StandingQueue::new(12_500_000, 1_000_000).window(), 11);
        // 10 Gbit/s: 105 us, below the 4-tick floor.
        assert_eq!(StandingQueue::new(1_250_000_000, 1_000_000).window(), 4);
        // 1 Mbit/s: 1 s, capped.
        assert_eq!(StandingQueue::new(125_000, 1_000_000).window(), QUEUE_WINDOW_MAX);
    }

    /// (sent bytes, queue sample) per 1 ms tick, from a trace of the end-to-end test
    /// (`RUST_LOG=paceline::d3router=trace`): two deadline flows through a 100 Mbit/s HTB
    /// bottleneck arrive as 15 KB GRO packets, so the queue sampled at a tick is usually a
    /// burst draining, and it empties every few ticks.
    #[rustfmt::skip]
    const BURSTY: [(u64, u64); 48] = [
        (15_398, 1568), (86, 0), (15_022, 0), (15_140, 1514), (0, 0), (15_140, 0),
        (15_140, 12_112), (15_140, 10_598), (0, 9084), (15_140, 9084), (0, 0), (15_140, 9084),
        (0, 6056), (0, 0), (15_140, 6056), (0, 0), (0, 0), (15_140, 3028),
        (0, 0), (30_280, 16_654), (0, 15_140), (0, 0), (30_280, 15_140), (0, 0),
        (0, 0), (30_280, 12_112), (15_140, 12_112), (15_140, 12_112), (15_140, 10_598), (0, 9084),
        (15_140, 9084), (15_140, 10_598), (15_140, 10_598), (0, 0), (15_140, 12_112), (4542, 10_598),
        (10_598, 0), (15_140, 0), (0, 0), (15_140, 1514), (15_140, 1514), (30_280, 19_682),
        (0, 18_168), (0, 3028), (30_280, 18_168), (0, 3028), (0, 1514), (30_280, 18_168),
    ];

    fn mean_capacity(filter: impl Fn() -> StandingQueue) -> f64 {
        let cfg = D3LinkConfig {
            capacity_max: 12_500_000,
            ..D3LinkConfig::for_line_rate(12_500_000)
        };
        let mut st = D3LinkState::new(&cfg);
        let mut f = filter();
        let mut sum = 0u64;
        let mut n = 0u64;
        for _ in 0..10 {
            for &(sent, q) in &BURSTY {
                st.requests = 1;
                control_step(&mut st, &cfg, &mut f, sent, q, 1_000_000);
                sum += st.capacity;
                n += 1;
            }
        }
        sum as f64 / n as f64
    }

    #[test]
    fn bursts_in_flight_leave_capacity_near_the_line_rate() {
        // With the filter of a 100 Mbit/s link C stays near the line rate (11.7 MB/s here):
        // the queue emptied within every window.
        let filtered = mean_capacity(|| StandingQueue::new(12_500_000, 1_000_000));
        assert!(
            filtered > 11_500_000.0,
            "mean C {filtered:.0} B/s with the filter"
        );
        // Acting on every sample (a window of one tick), C averaged 2.7 MB/s, a fifth of the
        // line: below the two flows' demand, so the fair share (C - D)/N was 0.
        let mut raw = StandingQueue::new(12_500_000, 1_000_000);
        raw.window = 1;
        let unfiltered = mean_capacity(|| raw.clone());
        assert!(
            unfiltered < 8_000_000.0,
            "mean C {unfiltered:.0} B/s without the filter"
        );
    }

    #[test]
    fn bursts_are_not_a_standing_queue_but_a_persistent_queue_is() {
        let mut f = StandingQueue::new(1_250_000_000, 1_000_000);
        // Samples that catch bursts in flight, with an empty queue in between.
        for q in [15_000, 18_000, 0, 9_000, 16_000, 1_500] {
            assert!(f.push(q) <= 1_500, "a burst pattern read as standing");
        }
        // A queue that never drains below 20 KB for a whole window.
        let mut last = 0;
        for q in [30_000, 20_000, 25_000, 40_000] {
            last = f.push(q);
        }
        assert_eq!(last, 20_000);
        // It is reported until a sample below it arrives; then at once.
        assert_eq!(f.push(50_000), 20_000);
        assert_eq!(f.push(0), 0);
    }
}
