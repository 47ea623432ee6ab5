//! The capacity controller, all of it: C, the capacity a router link hands out, moved once per
//! interval T. [`capacity_tick`] is the paper's soft state (under-use raises C, a queue lowers
//! it, an idle link resets); the agent runs it through [`control_step`], which feeds it the
//! standing queue ([`StandingQueue`]) instead of the sample at the tick and limits how far a
//! queue lowers C in one interval, on a link configured by [`agent_link_config`]. The agent's
//! loop (`control/src/d3router.rs`) only reads counters and queues and writes maps.

use super::router::{CAP_MODE_PAPER, D3LinkConfig, D3LinkState};
use super::units::{NS_PER_S, bytes_per_second, units_to_rate};
use super::wire::{D3Request, FLAG_FIN, REQ_LEN};

/// alpha = 1 / `ALPHA_DEN` (paper: 0.1). beta = 1.
pub const ALPHA_DEN: u64 = 10;

/// [`capacity_tick`] result: the idle reset fired (N, D, A zeroed, C = line rate).
pub const TICK_RESET: u32 = 1 << 0;
/// C was raised to `capacity_min`.
pub const TICK_AT_MIN: u32 = 1 << 1;
/// C was cut to `capacity_max`.
pub const TICK_AT_MAX: u32 = 1 << 2;

/// Soft-state capacity controller, run once per interval T (paper: 800 us, longer than an
/// RTT). `sent_bytes`: bytes sent on the link during the interval; `queue_bytes`: queue now;
/// `interval_ns`: T (0: no-op).
///
/// ```text
/// ref  = line_rate (CAP_MODE_LINE) or C (CAP_MODE_PAPER)
/// C'   = C + (ref - u/T) / 10 - q/T        (alpha = 1/10, beta = 1; u/T, q/T in bytes/s)
/// C'   = min(max(C', capacity_min), capacity_max)
/// ```
/// Idle reset: after `idle_reset_intervals` consecutive intervals without a request, N, D
/// and A are zeroed and C is set to the line rate (bounded) instead.
#[inline]
pub fn capacity_tick(
    st: &mut D3LinkState,
    cfg: &D3LinkConfig,
    sent_bytes: u64,
    queue_bytes: u64,
    interval_ns: u64,
) -> u32 {
    if interval_ns == 0 {
        return 0;
    }
    if st.requests == 0 {
        st.idle_intervals = st.idle_intervals.saturating_add(1);
    } else {
        st.idle_intervals = 0;
    }
    st.requests = 0;
    let k = cfg.idle_reset_intervals as u64;
    if k != 0 && st.idle_intervals >= k {
        st.flows = 0;
        st.demand = 0;
        st.allocated = 0;
        st.capacity = cfg.bound_capacity(cfg.line_rate);
        return if st.idle_intervals == k { TICK_RESET } else { 0 };
    }
    let util = bytes_per_second(sent_bytes, interval_ns);
    let qrate = bytes_per_second(queue_bytes, interval_ns);
    let reference = if cfg.capacity_mode == CAP_MODE_PAPER {
        st.capacity
    } else {
        cfg.line_rate
    };
    let raise = reference.saturating_sub(util) / ALPHA_DEN;
    let lower = util.saturating_sub(reference) / ALPHA_DEN;
    let c = st
        .capacity
        .saturating_add(raise)
        .saturating_sub(lower)
        .saturating_sub(qrate);
    let mut out = 0;
    if c < cfg.capacity_min {
        out |= TICK_AT_MIN;
    }
    if c > cfg.capacity_max {
        out |= TICK_AT_MAX;
    }
    st.capacity = cfg.bound_capacity(c);
    out
}

/// [`control_step`] lowers C by at most 1/`MAX_DECREASE_DEN` per interval.
pub const MAX_DECREASE_DEN: u64 = 5;

/// Quiet time after which the agent's links reset their counters ([`agent_link_config`]).
pub const IDLE_RESET_NS: u64 = 100_000_000;

/// The shortest lease: a router counts a flow that sends no request for at least this long.
/// A live flow asks about once per RTT, which a queue at a slow bottleneck stretches: 100 ms
/// was too short on the end-to-end test under emulation (150 KB of queue at 6.25 Mbit/s is
/// 190 ms; live flows lapsed, and two deadline flows in four missed).
pub const LEASE_NS: u64 = 1_000_000_000;

/// A flow sends a request only with a segment, at most one per segment at its pace: its lease
/// also covers [`LEASE_SEGMENTS`] segments of [`LEASE_SEGMENT_BYTES`] at its grant (or the
/// link's base rate, if more).
pub const LEASE_SEGMENTS: u64 = 4;
/// Two jumbo frames: what TCP sends at once at a low pacing rate (at least two segments).
pub const LEASE_SEGMENT_BYTES: u64 = 18_028;

/// How often the agent renews the leases ([`renew_leases`]).
pub const LEASE_RENEW_NS: u64 = 100_000_000;

/// The lease of a flow granted `granted` bytes/s on a link configured `cfg`: [`LEASE_NS`], or
/// [`LEASE_SEGMENTS`] segments at its pace if that is longer.
#[inline]
pub fn lease_ns(cfg: &D3LinkConfig, granted: u64) -> u64 {
    let rate = if granted > cfg.base_rate {
        granted
    } else {
        cfg.base_rate
    };
    let per_segments = (LEASE_SEGMENTS * LEASE_SEGMENT_BYTES)
        .saturating_mul(NS_PER_S)
        .checked_div(rate)
        .unwrap_or(u64::MAX);
    if per_segments > LEASE_NS {
        per_segments
    } else {
        LEASE_NS
    }
}

/// What the flows a router has heard from within their lease ([`lease_ns`]) hold at one link: the N, D and
/// A the link's counters should have. Built from the router's record of each flow's last
/// request (`PL_D3_SEEN`, as the router rewrote it) with [`LeaseTotals::add`].
#[derive(Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub struct LeaseTotals {
    pub flows: u64,
    pub demand: u64,
    pub allocated: u64,
}

impl LeaseTotals {
    /// Counts the flow whose last request this router rewrote into `rewritten` at `at_ns`,
    /// unless that was a FIN (it returned everything) or its lease ([`lease_ns`] of its grant)
    /// lapsed before `now_ns`. The flow holds its desired rate (clamped as
    /// [`process_request`](super::process_request) clamps it) in D and this hop's grant in A.
    pub fn add(&mut self, cfg: &D3LinkConfig, rewritten: &[u8; REQ_LEN], at_ns: u64, now_ns: u64) {
        let Ok(r) = D3Request::decode(rewritten) else {
            return;
        };
        if r.flags & FLAG_FIN != 0 || r.hop == 0 {
            return;
        }
        let granted = units_to_rate(r.alloc.get(r.hop as usize - 1).copied().unwrap_or(0), r.scale);
        if now_ns.saturating_sub(at_ns) >= lease_ns(cfg, granted) {
            return;
        }
        let desired = units_to_rate(r.desired, r.scale);
        let cap = cfg.request_cap();
        self.flows = self.flows.saturating_add(1);
        self.demand = self
            .demand
            .saturating_add(if desired > cap { cap } else { desired });
        self.allocated = self.allocated.saturating_add(granted);
    }
}

/// Renews the link's leases: N, D and A become what the flows heard from within the lease
/// hold. What a flow that stopped asking still held (its host died without a FIN, or the FIN
/// was lost) is released; so is any drift from concurrent updates. Returns true if anything
/// changed. Apply only when the router's record holds every flow (its LRU map evicted none).
pub fn renew_leases(st: &mut D3LinkState, live: &LeaseTotals) -> bool {
    let changed = (st.flows, st.demand, st.allocated) != (live.flows, live.demand, live.allocated);
    st.flows = live.flows;
    st.demand = live.demand;
    st.allocated = live.allocated;
    changed
}

/// The largest burst a sender hands the link at once: a 64 KB TSO/GSO packet (and the GRO
/// packets a forwarding router sees are as large).
pub const MAX_BURST_BYTES: u64 = 65_536;

/// Most queue samples the standing-queue filter keeps.
const QUEUE_WINDOW_MAX: usize = 64;

/// The configuration the agent runs a router link of `line_rate` bytes/s with, ticking every
/// `interval_ns`: [`D3LinkConfig::for_line_rate`] with the policy's base rate and per-flow cap,
/// and two changes measured on the testbed (`docs/d3.md`, "What the agent configures"):
/// - no overbooking: the controller may lower C under a queue and raise it back, but not
///   above the link. Above it, an idle link's first flow is granted more than the link
///   (measured: 13.7 MB/s on 12.5 MB/s) and the next ones wait.
/// - "idle" means no request for about [`IDLE_RESET_NS`]: a flow paced at the base rate sends
///   a request only every ~10-20 ms (one per segment-carrying RTT), and resetting under live
///   flows forgets their allocations.
#[inline]
pub fn agent_link_config(line_rate: u64, base_rate: u64, flow_cap: u64, interval_ns: u64) -> D3LinkConfig {
    let mut cfg = D3LinkConfig::for_line_rate(line_rate);
    cfg.base_rate = base_rate;
    cfg.flow_cap = flow_cap;
    cfg.capacity_max = line_rate;
    let idle = IDLE_RESET_NS.checked_div(interval_ns).unwrap_or(IDLE_RESET_NS);
    cfg.idle_reset_intervals = idle.clamp(4, u32::MAX as u64) as u32;
    cfg
}

/// The standing queue: the smallest of the queue samples of the last `window` intervals.
/// One sample per tick sees every burst in flight (on a 100 Mbit/s link a single 15 KB GRO
/// packet is 1.2 ms of queue, longer than the 1 ms tick), and `q/T` on such a sample cut C by
/// the 20% step limit on most ticks of a two-flow run: C hovered at 3-9 MB/s on a 12.5 MB/s
/// link, the fair share `(C - D)/N` was about 0 and deadline flows finished at their
/// deadline instead of early. A queue that persists through a whole window is one the flows
/// built; the window is long enough for the link to drain two maximal bursts.
#[derive(Clone)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub struct StandingQueue {
    samples: [u64; QUEUE_WINDOW_MAX],
    window: usize,
    next: usize,
}

impl StandingQueue {
    /// A filter for a link of `line_rate` bytes/s ticking every `interval_ns`: the window
    /// covers the drain time of two maximal bursts, and at least 4 intervals.
    pub fn new(line_rate: u64, interval_ns: u64) -> StandingQueue {
        // Two bursts' bytes times 1e9 is 1.3e14: no overflow, no u128.
        const TWO_BURSTS_X_NS: u64 = 2 * MAX_BURST_BYTES * NS_PER_S;
        let drain_ns = TWO_BURSTS_X_NS.checked_div(line_rate.max(1)).unwrap_or(0);
        let interval = interval_ns.max(1);
        let whole = drain_ns.checked_div(interval).unwrap_or(0);
        let ticks = if drain_ns.checked_rem(interval).unwrap_or(0) != 0 {
            whole + 1
        } else {
            whole
        };
        StandingQueue {
            samples: [0; QUEUE_WINDOW_MAX],
            window: ticks.clamp(4, QUEUE_WINDOW_MAX as u64) as usize,
            next: 0,
        }
    }

    /// Intervals the filter looks back over.
    pub fn window(&self) -> usize {
        self.window
    }

    /// Records this interval's sample and returns the standing queue.
    pub fn push(&mut self, q: u64) -> u64 {
        if let Some(s) = self.samples.get_mut(self.next) {
            *s = q;
        }
        self.next = if self.next + 1 >= self.window {
            0
        } else {
            self.next + 1
        };
        self.value()
    }

    /// The standing queue: the window's minimum. The window starts out empty (zeros): a queue
    /// counts once it has lasted a whole window.
    pub fn value(&self) -> u64 {
        let mut m: Option<u64> = None;
        let mut i = 0;
        while i < self.window && i < QUEUE_WINDOW_MAX {
            if let Some(v) = self.samples.get(i) {
                m = match m {
                    Some(x) if x <= *v => Some(x),
                    _ => Some(*v),
                };
            }
            i += 1;
        }
        m.unwrap_or(0)
    }
}

/// One controller interval of a link: the queue sample `q` goes through the standing-queue
/// filter, [`capacity_tick`] updates C, and a queue lowers C by at most 1/[`MAX_DECREASE_DEN`]
/// per interval. beta * q / T with beta = 1 removes a whole queue's worth of rate per
/// interval: on a 100 Mbit/s link a 30 KB queue took C from the line rate to its floor in one
/// 1 ms tick and every grant went to 0 (the paper's constants suit 1 Gbit/s). Returns
/// [`capacity_tick`]'s `TICK_*` bits.
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
    let tick = capacity_tick(state, cfg, sent, standing_queue, interval_ns);
    let floor = before - before / MAX_DECREASE_DEN;
    if tick & TICK_RESET == 0 && state.capacity < floor {
        state.capacity = floor.max(cfg.capacity_min);
    }
    tick
}

#[cfg(test)]
#[allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests panic with a message"
)]
mod tests {
    extern crate std;
    use super::QUEUE_WINDOW_MAX;
    use crate::d3::testutil::*;
    use crate::d3::*;
    use std::vec::Vec;

    const T_NS: u64 = 800_000;

    #[test]
    fn capacity_controller_moves_and_stays_bounded() {
        let cfg = cfg_1g();
        let mut st = D3LinkState::new(&cfg);
        st.requests = 1;
        // Full use, no queue: C stays.
        let full = GBPS * T_NS / 1_000_000_000; // 100_000 bytes per interval
        assert_eq!(capacity_tick(&mut st, &cfg, full, 0, T_NS), 0);
        assert_eq!(st.capacity, GBPS);
        // Half use: C rises by (line - u/T) / 10.
        st.requests = 1;
        capacity_tick(&mut st, &cfg, full / 2, 0, T_NS);
        assert_eq!(st.capacity, GBPS + GBPS / 20);
        // Idle for long (requests keep arriving, nothing is sent): bounded by 2x line.
        for _ in 0..100 {
            st.requests = 1;
            capacity_tick(&mut st, &cfg, 0, 0, T_NS);
        }
        assert_eq!(st.capacity, 2 * GBPS);
        // A 100 KB queue drains at 125 MB/s over 800 us: C drops by that, to the floor.
        st.requests = 1;
        let out = capacity_tick(&mut st, &cfg, full, 100_000, T_NS);
        assert_eq!(st.capacity, 2 * GBPS - GBPS);
        assert_eq!(out, 0);
        st.requests = 1;
        let out = capacity_tick(&mut st, &cfg, full, 200_000, T_NS);
        assert_eq!(out, TICK_AT_MIN);
        assert_eq!(st.capacity, GBPS / 10);
        // T = 0 is a no-op.
        assert_eq!(capacity_tick(&mut st, &cfg, 1, 1, 0), 0);
        assert_eq!(st.capacity, GBPS / 10);
    }

    #[test]
    fn line_reference_recovers_from_the_floor_where_the_literal_formula_sticks() {
        // After a queue spike C sits at the floor and flows use exactly what they are given
        // (u/T = C). The paper's literal term alpha * (C - u/T) is then 0: C never recovers.
        // The RCP form alpha * (line - u/T) brings it back to the line rate.
        for (mode, expect_recovered) in [(CAP_MODE_PAPER, false), (CAP_MODE_LINE, true)] {
            let cfg = D3LinkConfig {
                capacity_mode: mode,
                ..cfg_1g()
            };
            let mut st = D3LinkState {
                capacity: cfg.capacity_min,
                ..D3LinkState::new(&cfg)
            };
            for _ in 0..60 {
                st.requests = 1;
                let used = st.capacity.min(GBPS) * T_NS / 1_000_000_000;
                capacity_tick(&mut st, &cfg, used, 0, T_NS);
            }
            if expect_recovered {
                assert!(st.capacity >= GBPS * 99 / 100, "recovered: {}", st.capacity);
            } else {
                assert_eq!(st.capacity, cfg.capacity_min);
            }
        }
    }

    /// Two deadline flows whose desired rates take the link (119 units each at 1 Gbit/s), then
    /// their hosts die without a FIN: their desired rates and allocations stay counted. (A
    /// leaked fair share alone would not starve a deadline flow, which preempts it.)
    fn leak_two_long_flows(st: &mut D3LinkState, cfg: &D3LinkConfig) {
        let reqs: Vec<D3Request> = (0..2).map(|_| request(FLAG_NEW, 8, 119)).collect();
        let units: Vec<u8> = reqs.iter().map(|r| process_request(st, cfg, r).units).collect();
        for (r, u) in reqs.iter().zip(units) {
            process_request(st, cfg, &follow_up(r, u, 119));
        }
    }

    #[test]
    fn leaked_allocations_wash_out() {
        let cfg = cfg_1g();
        let mut st = D3LinkState::new(&cfg);
        // Two deadline flows take the link (119 units each, all but 219_456 B/s), then their
        // hosts die without a FIN.
        leak_two_long_flows(&mut st, &cfg);
        assert_eq!(st.allocated, 238 * U8);
        let leaked = st.allocated;
        // A deadline flow (2.5 MB/s) now finds nothing left.
        let mut f = request(FLAG_NEW, 5, 39);
        let mut g = process_request(&mut st, &cfg, &f);
        assert_eq!(g.units, 3);
        // The link is nearly idle (only this flow sends), so the controller raises C; within
        // two intervals the flow gets its rate, while C stays within its bounds.
        let mut rounds = 0;
        while g.units < 39 {
            st.requests = st.requests.max(1);
            let sent = g.rate * T_NS / 1_000_000_000;
            capacity_tick(&mut st, &cfg, sent, 0, T_NS);
            f = follow_up(&f, g.units, 39);
            g = process_request(&mut st, &cfg, &f);
            rounds += 1;
            assert!(rounds <= 2, "still starved after {rounds} intervals");
        }
        assert!(st.capacity <= cfg.capacity_max);
        assert!(st.allocated >= leaked, "the leak is still counted, C absorbed it");
        // Then the last flow leaves too; after idle_reset_intervals quiet intervals the
        // counters reset exactly once.
        let fin = D3Request {
            flags: FLAG_FIN,
            ..follow_up(&f, g.units, 0)
        };
        process_request(&mut st, &cfg, &fin);
        assert_eq!(
            capacity_tick(&mut st, &cfg, 0, 0, T_NS),
            0,
            "a request this interval"
        );
        let mut resets = 0;
        for i in 1..=6 {
            let out = capacity_tick(&mut st, &cfg, 0, 0, T_NS);
            if out & TICK_RESET != 0 {
                resets += 1;
                assert_eq!(i, cfg.idle_reset_intervals as usize);
            }
        }
        assert_eq!(resets, 1);
        assert_eq!((st.flows, st.demand, st.allocated, st.capacity), (0, 0, 0, GBPS));
    }

    /// The leak scenario on the configuration the agent deploys (C bounded by the line rate,
    /// not twice it): the controller alone cannot absorb two leaked line-rate allocations
    /// (measured before the leases: 3 of 39 units after 1000 intervals). The router's record
    /// of each flow's last request renews the leases every [`LEASE_RENEW_NS`]: the dead flows'
    /// hold lapses and the deadline flow gets its rate at the first renewal after the lease.
    #[test]
    fn leaked_allocations_on_the_deployed_ceiling_lapse_with_their_lease() {
        let cfg = agent_link_config(GBPS, GBPS / 1000, 0, T_NS);
        let mut st = D3LinkState::new(&cfg);
        // The router's record: each flow's last request as rewritten, and when.
        let mut records: Vec<(u64, [u8; REQ_LEN])> = Vec::new();
        let mut now = 0u64;
        let rewrite = |st: &mut D3LinkState, req: &D3Request, now: u64, records: &mut Vec<_>, i: usize| {
            let mut b = req.encode();
            let g = router_rewrite(&mut b, st, &cfg);
            if records.len() <= i {
                records.push((now, b));
            } else {
                records[i] = (now, b);
            }
            g
        };
        // Two deadline flows whose desired rates take the link, then their hosts die without a
        // FIN.
        for i in 0..2 {
            let r = request(FLAG_NEW, 8, 119);
            let g = rewrite(&mut st, &r, now, &mut records, i);
            rewrite(&mut st, &follow_up(&r, g.units, 119), now, &mut records, i);
        }
        let leaked = st.allocated;
        assert!(leaked > GBPS * 9 / 10, "the two flows hold the link: {leaked}");
        // A deadline flow (39 units at scale 5) asks every interval.
        let mut f = request(FLAG_NEW, 5, 39);
        let mut g = rewrite(&mut st, &f, now, &mut records, 2);
        assert!(
            g.units < 39,
            "starved while the leak is counted: {} units",
            g.units
        );
        let mut last_renewal = 0;
        let mut renewed_at = None;
        let mut rounds = 0;
        while g.units < 39 && rounds < 2000 {
            now += T_NS;
            st.requests = st.requests.max(1);
            capacity_tick(&mut st, &cfg, g.rate * T_NS / 1_000_000_000, 0, T_NS);
            if now - last_renewal >= LEASE_RENEW_NS {
                last_renewal = now;
                let mut live = LeaseTotals::default();
                for (at, b) in &records {
                    live.add(&cfg, b, *at, now);
                }
                if renew_leases(&mut st, &live) && renewed_at.is_none() {
                    renewed_at = Some(now);
                    assert_eq!(live.flows, 1, "only the deadline flow is live");
                }
            }
            f = follow_up(&f, g.units, 39);
            g = rewrite(&mut st, &f, now, &mut records, 2);
            rounds += 1;
        }
        std::eprintln!(
            "deployed ceiling: {} units after {rounds} intervals, leases renewed at {renewed_at:?} ns",
            g.units
        );
        assert!(
            g.units >= 39,
            "still starved after {rounds} intervals: {} units",
            g.units
        );
        let at = renewed_at.expect("the renewal released the leak");
        assert!(
            (LEASE_NS..=LEASE_NS + LEASE_RENEW_NS).contains(&at),
            "released at the first renewal after the lease: {at} ns"
        );
        assert_eq!(
            (st.flows, st.allocated),
            (1, g.rate),
            "A holds the live flow's grant alone"
        );
    }

    #[test]
    fn a_lease_counts_live_requests_and_skips_fins_lapsed_and_invalid_ones() {
        let cfg = cfg_1g();
        let mut st = D3LinkState::new(&cfg);
        let mut b = request(FLAG_NEW, 5, 39).encode();
        let g = router_rewrite(&mut b, &mut st, &cfg);
        let mut live = LeaseTotals::default();
        live.add(&cfg, &b, 1_000, 1_000 + LEASE_NS - 1);
        assert_eq!(
            lease_ns(&cfg, g.rate),
            LEASE_NS,
            "a fast flow's lease is the shortest"
        );
        assert_eq!(
            live,
            LeaseTotals {
                flows: 1,
                demand: 39 * unit_rate(5),
                allocated: g.rate
            }
        );
        assert!(!renew_leases(&mut st, &live), "the counters already agree");
        // Lapsed, not yet rewritten (hop 0), a FIN, not a request: not counted.
        let mut none = LeaseTotals::default();
        none.add(&cfg, &b, 1_000, 1_000 + LEASE_NS);
        none.add(&cfg, &request(FLAG_NEW, 5, 39).encode(), 0, 0);
        let mut fin = request(FLAG_FIN, 5, 0).encode();
        router_rewrite(&mut fin, &mut st, &cfg);
        none.add(&cfg, &fin, 0, 0);
        none.add(&cfg, &[0u8; REQ_LEN], 0, 0);
        assert_eq!(none, LeaseTotals::default());
        // A slow flow asks less often: its lease covers four segments at its pace (the base
        // rate's, for a flow granted less, or 0).
        let mut slow = cfg;
        slow.base_rate = 7_000;
        assert_eq!(lease_ns(&slow, 0), 4 * 18_028 * 1_000_000_000 / 7_000);
        assert_eq!(lease_ns(&slow, 14_000), 4 * 18_028 * 1_000_000_000 / 14_000);
        slow.base_rate = 0;
        assert_eq!(
            lease_ns(&slow, 0),
            u64::MAX,
            "a flow paused with no base rate never lapses"
        );
        // A desired rate above the flow cap counts as the cap, as the router clamps it.
        let mut capped = cfg;
        capped.flow_cap = unit_rate(5) * 10;
        let mut c = LeaseTotals::default();
        c.add(&capped, &b, 0, 0);
        assert_eq!(c.demand, unit_rate(5) * 10);
    }

    // ---------------------------------------------------------------- the agent's step

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

    #[test]
    fn agent_links_do_not_overbook_and_reset_after_100_ms_quiet() {
        let cfg = agent_link_config(12_500_000, 12_500, 0, 1_000_000);
        assert_eq!(cfg.capacity_max, cfg.line_rate);
        assert_eq!(cfg.idle_reset_intervals, 100);
        assert_eq!(
            (cfg.base_rate, cfg.flow_cap, cfg.capacity_min),
            (12_500, 0, 1_250_000)
        );
        // At least 4 intervals, and an interval of 0 is taken as 1 ns.
        assert_eq!(
            agent_link_config(12_500_000, 0, 0, 50_000_000).idle_reset_intervals,
            4
        );
        assert_eq!(
            agent_link_config(12_500_000, 0, 0, 0).idle_reset_intervals,
            100_000_000
        );
    }
}
