//! The router's side: per-link configuration and aggregate counters, and Snippet 1 of the paper
//! ([`process_request`], [`router_rewrite`]). The capacity controller that moves C is in
//! `controller.rs`.

use super::units::{MAX_ENCODABLE_RATE, rate_to_units_floor, units_to_rate};
use super::wire::{
    D3Request, FLAG_FIN, FLAG_NEW, FLAG_QUENCHED, HOPS, REQ_LEN, min_prefix, req_set_alloc, req_set_hop,
};

/// [`D3LinkConfig::capacity_mode`]: the capacity controller's utilisation term is
/// `alpha * (line_rate - u/T)` (RCP's form; the default, see `docs/d3.md`).
pub const CAP_MODE_LINE: u32 = 0;
/// Utilisation term `alpha * (C(t) - u/T)`, the paper's formula as printed.
pub const CAP_MODE_PAPER: u32 = 1;

/// Per-egress-link configuration (a map value; all rates bytes/s).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub struct D3LinkConfig {
    /// Physical rate of the link.
    pub line_rate: u64,
    /// Floor of the capacity controller.
    pub capacity_min: u64,
    /// Ceiling of the capacity controller.
    pub capacity_max: u64,
    /// Smallest allocation (before encoding) a request gets, and a new flow's fair share.
    pub base_rate: u64,
    /// Per-flow cap on desired rates (0: the line rate). Desired rates above
    /// `min(line_rate, flow_cap)` are clamped and flagged `OUT_CLAMPED`.
    pub flow_cap: u64,
    /// Reset N, D, A and C after this many controller intervals without a request (0: never).
    pub idle_reset_intervals: u32,
    /// `CAP_MODE_LINE` or `CAP_MODE_PAPER`.
    pub capacity_mode: u32,
}
const _: () = assert!(core::mem::size_of::<D3LinkConfig>() == 48);

impl D3LinkConfig {
    /// Defaults for a link of `line_rate` bytes/s: capacity in [line/10, 2 x line], base rate
    /// line/1000, no per-flow cap beyond the line rate, idle reset after 4 intervals, RCP-form
    /// controller.
    #[inline]
    pub const fn for_line_rate(line_rate: u64) -> Self {
        Self {
            line_rate,
            capacity_min: line_rate / 10,
            capacity_max: if line_rate > u64::MAX / 2 {
                u64::MAX
            } else {
                line_rate << 1
            },
            base_rate: line_rate / 1000,
            flow_cap: 0,
            idle_reset_intervals: 4,
            capacity_mode: CAP_MODE_LINE,
        }
    }

    /// The largest desired rate the router accounts for one flow.
    #[inline]
    pub const fn request_cap(&self) -> u64 {
        let cap = if self.flow_cap != 0 && self.flow_cap < self.line_rate {
            self.flow_cap
        } else {
            self.line_rate
        };
        if cap == 0 { MAX_ENCODABLE_RATE } else { cap }
    }

    /// `c` bounded to [capacity_min, capacity_max] (the ceiling wins if they cross).
    #[inline]
    pub const fn bound_capacity(&self, c: u64) -> u64 {
        let c = if c < self.capacity_min {
            self.capacity_min
        } else {
            c
        };
        if c > self.capacity_max {
            self.capacity_max
        } else {
            c
        }
    }
}

/// Per-egress-link router state (a map value): the paper's aggregate counters, nothing per
/// flow. The datapath updates it from several CPUs without a lock (a snapshot, then atomic
/// adds; `datapath-ebpf/src/ebpf/d3router.rs`).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub struct D3LinkState {
    /// C: capacity handed out, bytes/s (moved by the capacity controller).
    pub capacity: u64,
    /// D: sum of desired rates, bytes/s.
    pub demand: u64,
    /// A: sum of allocations, bytes/s.
    pub allocated: u64,
    /// N: number of flows.
    pub flows: u64,
    /// Requests processed since the last controller tick.
    pub requests: u64,
    /// Consecutive controller ticks without a request.
    pub idle_intervals: u64,
}
const _: () = assert!(core::mem::size_of::<D3LinkState>() == 48);

impl D3LinkState {
    /// Empty counters with C = the line rate (bounded).
    #[inline]
    pub const fn new(cfg: &D3LinkConfig) -> Self {
        Self {
            capacity: cfg.bound_capacity(cfg.line_rate),
            demand: 0,
            allocated: 0,
            flows: 0,
            requests: 0,
            idle_intervals: 0,
        }
    }
}

/// [`Grant::outcome`]: the request had `FLAG_NEW` (N += 1, fair share = base rate).
pub const OUT_NEW: u32 = 1 << 0;
/// The request had `FLAG_FIN`: allocation and demand returned, N -= 1, slot written as 0.
pub const OUT_FIN: u32 = 1 << 1;
/// The request had `FLAG_QUENCHED`.
pub const OUT_QUENCHED: u32 = 1 << 2;
/// Enough capacity was left: granted desired + fair share.
pub const OUT_DESIRED_MET: u32 = 1 << 3;
/// Not enough capacity left for the desired rate: granted what was left.
pub const OUT_LEFT: u32 = 1 << 4;
/// Raised to the base rate.
pub const OUT_BASE_FLOOR: u32 = 1 << 5;
/// Lowered to the smallest allocation of a previous hop.
pub const OUT_UPSTREAM_CAP: u32 = 1 << 6;
/// The desired rate (or previous desired rate) exceeded the per-flow cap and was clamped.
pub const OUT_CLAMPED: u32 = 1 << 7;
/// The allocation exceeded 255 units at the request's scale and was cut to 255 units.
pub const OUT_SATURATED: u32 = 1 << 8;
/// All slots were already filled (hop = 6): request not processed, option untouched.
pub const OUT_HOP_OVERFLOW: u32 = 1 << 9;
/// The bytes were not a valid request: not processed, untouched.
pub const OUT_INVALID: u32 = 1 << 10;
/// Less than the desired rate was left, but the deadlines fit the capacity: granted the
/// desired rate out of the fair shares other flows hold, which they give back with their
/// next request ([`process_request`]).
pub const OUT_PREEMPTED: u32 = 1 << 11;

/// A router's answer to one request.
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub struct Grant {
    /// Units written into `alloc[hop]` (at the request's scale).
    pub units: u8,
    /// The same in bytes/s: exactly what was added to A.
    pub rate: u64,
    /// `OUT_*` bits.
    pub outcome: u32,
}

impl Grant {
    const fn none(outcome: u32) -> Self {
        Self {
            units: 0,
            rate: 0,
            outcome,
        }
    }
}

/// Processes one request at one egress link (Snippet 1 of the paper, with burst tolerance,
/// hop chaining and caps); updates the counters and returns the allocation to write into
/// `alloc[hop]`. The caller then advances `hop` (see [`router_rewrite`]).
///
/// ```text
/// cap  = min(line_rate, flow_cap)            r_t, r_t1 clamped to cap (OUT_CLAMPED)
/// a_t  = prev_alloc[hop] at prev_scale       (exactly what this hop added last time)
/// if NEW: N += 1
/// A -= a_t
/// if FIN: D -= r_t; N -= 1; grant 0; done
/// D = D - r_t + r_t1
/// left = C - A
/// fs = NEW ? base_rate : (C - D) / max(N, 1)
/// a = left > r_t1 ? r_t1 + fs                (OUT_DESIRED_MET)
///   : r_t1 > 0 && D <= C ? r_t1               (OUT_PREEMPTED)
///   : left                                    (OUT_LEFT)
/// a = max(a, base_rate)
/// units = min(floor(a / unit(scale)), 255, min(alloc[0..hop]))
/// A += units * unit(scale)
/// ```
/// All subtractions saturate at 0, additions at `u64::MAX`.
#[inline]
pub fn process_request(st: &mut D3LinkState, cfg: &D3LinkConfig, req: &D3Request) -> Grant {
    let hop = req.hop as usize;
    if hop >= HOPS {
        return Grant::none(OUT_HOP_OVERFLOW);
    }
    st.requests = st.requests.saturating_add(1);
    let mut out = 0u32;
    let new = req.flags & FLAG_NEW != 0;
    let fin = req.flags & FLAG_FIN != 0;
    if req.flags & FLAG_QUENCHED != 0 {
        out |= OUT_QUENCHED;
    }
    let cap = cfg.request_cap();
    let mut r_t = units_to_rate(req.prev_desired, req.prev_scale);
    if r_t > cap {
        r_t = cap;
        out |= OUT_CLAMPED;
    }
    let mut r_t1 = units_to_rate(req.desired, req.scale);
    if r_t1 > cap {
        r_t1 = cap;
        out |= OUT_CLAMPED;
    }
    let a_t = match req.prev_alloc.get(hop) {
        Some(u) => units_to_rate(*u, req.prev_scale),
        None => 0,
    };

    if new {
        st.flows = st.flows.saturating_add(1);
        out |= OUT_NEW;
    }
    st.allocated = st.allocated.saturating_sub(a_t);
    if fin {
        st.demand = st.demand.saturating_sub(r_t);
        st.flows = st.flows.saturating_sub(1);
        return Grant::none(out | OUT_FIN);
    }
    st.demand = st.demand.saturating_sub(r_t).saturating_add(r_t1);

    let left = st.capacity.saturating_sub(st.allocated);
    let fs = if new {
        cfg.base_rate
    } else {
        let n = if st.flows == 0 { 1 } else { st.flows };
        st.capacity.saturating_sub(st.demand).checked_div(n).unwrap_or(0)
    };
    // Deadlines preempt fair shares. What is not left may be held as other flows' fair
    // shares (a long flow alone holds the whole link), which they hold until their next
    // request, about an RTT. A deadline flow that waits that long paused misses a short
    // deadline; so while the desired rates together fit the capacity (D, which now counts
    // this flow's, is at most C), it is granted its desired rate out of those shares. A may
    // exceed C until the holders ask again and find nothing left. docs/d3.md, deviation 15.
    let mut a = if left > r_t1 {
        out |= OUT_DESIRED_MET;
        r_t1.saturating_add(fs)
    } else if r_t1 > 0 && st.demand <= st.capacity {
        out |= OUT_PREEMPTED;
        r_t1
    } else {
        out |= OUT_LEFT;
        left
    };
    if a < cfg.base_rate {
        a = cfg.base_rate;
        out |= OUT_BASE_FLOOR;
    }
    let mut units = rate_to_units_floor(a, req.scale);
    if a > units_to_rate(255, req.scale) {
        out |= OUT_SATURATED;
    }
    if let Some(up) = min_prefix(&req.alloc, hop)
        && units > up
    {
        units = up;
        out |= OUT_UPSTREAM_CAP;
    }
    let rate = units_to_rate(units, req.scale);
    st.allocated = st.allocated.saturating_add(rate);
    Grant {
        units,
        rate,
        outcome: out,
    }
}

/// The router's in-place step on the request option bytes: validate, [`process_request`],
/// write `alloc[hop]` and advance `hop`. Invalid options (`OUT_INVALID`) and full vectors
/// (`OUT_HOP_OVERFLOW`) are left untouched. The changed bytes are in the words given by
/// [`rewritten_words`](super::rewritten_words); fix the TCP checksum with
/// [`csum_replace`](super::csum_replace) (old vs new bytes).
#[inline]
pub fn router_rewrite(opt: &mut [u8; REQ_LEN], st: &mut D3LinkState, cfg: &D3LinkConfig) -> Grant {
    let req = match D3Request::decode(opt) {
        Ok(r) => r,
        Err(_) => return Grant::none(OUT_INVALID),
    };
    let g = process_request(st, cfg, &req);
    if g.outcome & OUT_HOP_OVERFLOW == 0 {
        req_set_alloc(opt, req.hop as usize, g.units);
        req_set_hop(opt, req.hop.saturating_add(1));
    }
    g
}

#[cfg(feature = "user")]
// SAFETY: `#[repr(C)]`, integer fields only, no implicit padding (sizes asserted above).
unsafe impl aya::Pod for D3LinkConfig {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl aya::Pod for D3LinkState {}

#[cfg(test)]
#[allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests panic with a message"
)]
mod tests {
    extern crate std;
    use crate::d3::testutil::*;
    use crate::d3::*;
    use std::vec::Vec;

    #[test]
    fn enough_capacity_grants_desired_plus_fair_share() {
        let cfg = cfg_1g();
        let mut st = D3LinkState::new(&cfg);
        let desired = [20u8, 30, 40];
        // Round 1: new flows get desired + base rate (base < one unit, so exactly desired).
        let mut reqs: Vec<D3Request> = desired.iter().map(|d| request(FLAG_NEW, 8, *d)).collect();
        let mut grants = Vec::new();
        for r in &reqs {
            let g = process_request(&mut st, &cfg, r);
            assert_eq!(g.outcome, OUT_NEW | OUT_DESIRED_MET);
            assert_eq!(g.units, r.desired);
            grants.push(g.units);
        }
        assert_eq!(st.flows, 3);
        assert_eq!(st.demand, 90 * U8);
        assert_eq!(st.allocated, 90 * U8);
        // Round 2: fs = (C - D) / 3 = 25_938_026 (49.47 units) on top of each desired rate.
        reqs = reqs
            .iter()
            .zip(&grants)
            .map(|(r, g)| follow_up(r, *g, r.desired))
            .collect();
        let mut units = Vec::new();
        for r in &reqs {
            let g = process_request(&mut st, &cfg, r);
            assert_eq!(g.outcome, OUT_DESIRED_MET);
            assert!(g.rate >= units_to_rate(r.desired, 8));
            units.push(g.units);
        }
        assert_eq!(units, [69, 79, 89]);
        assert_eq!(st.allocated, (69 + 79 + 89) * U8);
        assert_eq!(st.allocated, 124_256_256);
        assert!(st.allocated <= st.capacity);
        assert!(
            st.capacity - st.allocated < 3 * U8,
            "only rounding is left unallocated"
        );
        assert_eq!(st.demand, 90 * U8);
    }

    #[test]
    fn not_enough_capacity_is_greedy_first_come() {
        // Five flows each wanting 60 units (31.5 MB/s) of a 125 MB/s link: D > C.
        let cfg = cfg_1g();
        let mut st = D3LinkState::new(&cfg);
        let mut reqs: Vec<D3Request> = (0..5).map(|_| request(FLAG_NEW, 8, 60)).collect();
        let mut units = Vec::new();
        let mut outs = Vec::new();
        for r in &reqs {
            let g = process_request(&mut st, &cfg, r);
            units.push(g.units);
            outs.push(g.outcome & (OUT_DESIRED_MET | OUT_LEFT | OUT_BASE_FLOOR));
        }
        // First three get their rate; the fourth what is left (30_628_160 -> 58 units); the
        // fifth is left 219_456 B/s (above the 125_000 base), under one unit: paused.
        assert_eq!(units, [60, 60, 60, 58, 0]);
        assert_eq!(
            outs,
            [
                OUT_DESIRED_MET,
                OUT_DESIRED_MET,
                OUT_DESIRED_MET,
                OUT_LEFT,
                OUT_LEFT
            ]
        );
        assert!(st.allocated <= st.capacity);
        // Steady state keeps the same order: fs = 0 because D > C.
        for _ in 0..3 {
            reqs = reqs
                .iter()
                .zip(&units)
                .map(|(r, g)| follow_up(r, *g, 60))
                .collect();
            units = reqs
                .iter()
                .map(|r| process_request(&mut st, &cfg, r).units)
                .collect();
            assert_eq!(units, [60, 60, 60, 58, 0]);
            assert!(st.allocated <= st.capacity);
        }
        assert_eq!(st.demand, 5 * 60 * U8);

        // Same with a base rate of two units: the fifth flow gets the floor.
        let cfg = D3LinkConfig {
            base_rate: 2 * U8,
            ..cfg_1g()
        };
        let mut st = D3LinkState::new(&cfg);
        let g: Vec<Grant> = (0..5)
            .map(|_| process_request(&mut st, &cfg, &request(FLAG_NEW, 8, 60)))
            .collect();
        assert_eq!(g[4].units, 2);
        assert_eq!(g[4].outcome, OUT_NEW | OUT_LEFT | OUT_BASE_FLOOR);
    }

    #[test]
    fn burst_of_new_flows_pauses_non_deadline_and_serves_deadlines() {
        let cfg = cfg_1g();
        let mut st = D3LinkState::new(&cfg);
        // 30 new flows, alternating: 20 non-deadline (scale 8, desire 0) and 10 deadline
        // flows of 2.5 MB/s (scale 5, 39 units).
        let mut reqs = Vec::new();
        for i in 0..30 {
            reqs.push(if i % 3 == 2 {
                request(FLAG_NEW, 5, 39)
            } else {
                request(FLAG_NEW, 8, 0)
            });
        }
        let mut units = Vec::new();
        for r in &reqs {
            let g = process_request(&mut st, &cfg, r);
            if r.desired == 0 {
                // Fair share of a new flow = base rate (125 KB/s) < one unit: pause one RTT.
                assert_eq!(g.units, 0);
            } else {
                // Desired + base rate: 2_680_904 B/s -> 40 units.
                assert_eq!(g.units, 40);
                assert!(g.rate >= 39 * 65_536);
            }
            units.push(g.units);
        }
        assert_eq!(st.flows, 30);
        assert_eq!(
            st.allocated,
            10 * 40 * 65_536,
            "only the deadline flows hold capacity"
        );
        // Without burst tolerance each new flow would take (C - D) / N at arrival: the sum
        // over the burst would exceed C. Next RTT everyone gets the normal fair share.
        reqs = reqs
            .iter()
            .zip(&units)
            .map(|(r, u)| follow_up(r, *u, r.desired))
            .collect();
        let mut sum = 0;
        for r in &reqs {
            let g = process_request(&mut st, &cfg, r);
            assert_eq!(g.outcome & OUT_DESIRED_MET, OUT_DESIRED_MET);
            if r.desired == 0 {
                assert!(g.units > 0, "non-deadline flows resume");
            } else {
                assert!(g.rate > 39 * 65_536, "deadline flows keep desired + fair share");
            }
            sum += g.rate;
        }
        assert_eq!(sum, st.allocated);
        assert!(st.allocated <= st.capacity);
    }

    /// Deadlines preempt fair shares: a burst of deadline flows onto a link a long flow holds
    /// gets its desired rates in its first RTT, and A is back within C once the long flow asked
    /// again. Checked (2026-12-03): without the preemption branch in `process_request` the
    /// burst got `[3, 1, 1, ...]` units (what was left, then the base rate), as in the paper,
    /// and this test failed.
    #[test]
    fn burst_onto_busy_link_gets_its_deadline_rates_in_the_first_rtt() {
        let cfg = cfg_1g();
        let mut st = D3LinkState::new(&cfg);
        // A long non-deadline flow holds (almost) the whole link as its fair share.
        let long = request(FLAG_NEW, 8, 0);
        let g = process_request(&mut st, &cfg, &long);
        let long = follow_up(&long, g.units, 0);
        let g = process_request(&mut st, &cfg, &long);
        assert_eq!(g.units, 238);
        let long_units = g.units;
        // Ten new deadline flows arrive (39 units at scale 5 each, 20% of the link together):
        // nothing is left, but their desired rates fit, so each is granted its rate out of the
        // long flow's share.
        let dl: Vec<D3Request> = (0..10).map(|_| request(FLAG_NEW, 5, 39)).collect();
        let grants: Vec<Grant> = dl.iter().map(|r| process_request(&mut st, &cfg, r)).collect();
        assert!(
            grants
                .iter()
                .all(|g| g.units == 39 && g.outcome & OUT_PREEMPTED != 0),
            "{:?}",
            grants.iter().map(|g| g.units).collect::<Vec<_>>()
        );
        assert!(
            st.allocated > st.capacity,
            "overbooked until the long flow asks again"
        );
        // The long flow's next request returns its share and takes the fair share of what the
        // deadlines leave, (C - D) / N = 9_039_232 B/s (17 units at scale 8): A is within C
        // again.
        let g = process_request(&mut st, &cfg, &follow_up(&long, long_units, 0));
        assert_eq!(
            g.outcome & OUT_PREEMPTED,
            0,
            "a flow without a deadline never preempts"
        );
        assert_eq!(g.units, 17, "the long flow yields");
        assert!(st.allocated <= st.capacity);
        assert_eq!(st.demand, 10 * 39 * 65_536);
        // The deadline flows keep their rates (and now a fair share of what is spare).
        for (r, g) in dl.iter().zip(&grants) {
            let next = process_request(&mut st, &cfg, &follow_up(r, g.units, 39));
            assert!(next.units >= 39, "{} units", next.units);
        }
    }

    /// Preemption only while the deadlines fit: when the desired rates exceed C, a deadline
    /// flow gets what is left, first come first served, as in the paper.
    #[test]
    fn deadlines_beyond_the_capacity_get_what_is_left() {
        let cfg = cfg_1g();
        let mut st = D3LinkState::new(&cfg);
        // Two deadline flows desire the whole link (119 units at scale 8 each).
        for _ in 0..2 {
            let g = process_request(&mut st, &cfg, &request(FLAG_NEW, 8, 119));
            assert_eq!(g.units, 119);
        }
        let g = process_request(&mut st, &cfg, &request(FLAG_NEW, 5, 39));
        assert_eq!(g.outcome & OUT_PREEMPTED, 0);
        assert_ne!(g.outcome & OUT_LEFT, 0);
        assert_eq!(g.units, 3, "219_456 B/s were left: 3 units at scale 5");
        assert!(st.allocated <= st.capacity);
    }

    #[test]
    fn fin_returns_everything() {
        let cfg = cfg_1g();
        let mut st = D3LinkState::new(&cfg);
        let a = request(FLAG_NEW, 8, 40);
        let ga = process_request(&mut st, &cfg, &a);
        let b = request(FLAG_NEW, 5, 39);
        let gb = process_request(&mut st, &cfg, &b);
        let a2 = follow_up(&a, ga.units, 50);
        let ga2 = process_request(&mut st, &cfg, &a2);
        let before = st;
        // Flow a ends: returns its second request's demand and allocation.
        let fin = D3Request {
            flags: FLAG_FIN,
            ..follow_up(&a2, ga2.units, 0)
        };
        let g = process_request(&mut st, &cfg, &fin);
        assert_eq!(
            g,
            Grant {
                units: 0,
                rate: 0,
                outcome: OUT_FIN
            }
        );
        assert_eq!(st.flows, 1);
        assert_eq!(st.demand, before.demand - 50 * U8);
        assert_eq!(st.allocated, before.allocated - ga2.rate);
        // Flow b ends: the link is exactly empty again.
        let fin_b = D3Request {
            flags: FLAG_FIN,
            ..follow_up(&b, gb.units, 0)
        };
        process_request(&mut st, &cfg, &fin_b);
        assert_eq!((st.flows, st.demand, st.allocated), (0, 0, 0));
        // A one-request flow (NEW and FIN together) leaves nothing behind.
        process_request(&mut st, &cfg, &request(FLAG_NEW | FLAG_FIN, 8, 0));
        assert_eq!((st.flows, st.demand, st.allocated), (0, 0, 0));
        // A FIN from a flow the router forgot (after a reset) does not underflow.
        process_request(&mut st, &cfg, &fin_b);
        assert_eq!((st.flows, st.demand, st.allocated), (0, 0, 0));
    }

    #[test]
    fn absurd_requests_are_capped_and_flagged() {
        let cfg = cfg_1g();
        let mut st = D3LinkState::new(&cfg);
        // 255 units at scale 15 = 17 GB/s on a 125 MB/s link.
        let r = request(FLAG_NEW, 15, 255);
        let g = process_request(&mut st, &cfg, &r);
        assert_ne!(g.outcome & OUT_CLAMPED, 0);
        assert_eq!(st.demand, GBPS, "demand counts the clamped rate");
        assert!(g.rate <= GBPS);
        // Its return is clamped the same way: demand goes back to exactly 0.
        let fin = D3Request {
            flags: FLAG_FIN,
            ..follow_up(&r, g.units, 0)
        };
        let g2 = process_request(&mut st, &cfg, &fin);
        assert_ne!(g2.outcome & OUT_CLAMPED, 0);
        assert_eq!((st.flows, st.demand, st.allocated), (0, 0, 0));
        // A per-flow cap of 10 MB/s: 40 units at scale 8 (20.9 MB/s) is clamped to it.
        let cfg = D3LinkConfig {
            flow_cap: 10_000_000,
            ..cfg_1g()
        };
        let mut st = D3LinkState::new(&cfg);
        let g = process_request(&mut st, &cfg, &request(FLAG_NEW, 8, 40));
        assert_eq!(g.outcome, OUT_NEW | OUT_CLAMPED | OUT_DESIRED_MET);
        assert_eq!(st.demand, 10_000_000);
        assert_eq!(g.units, 19, "10 MB/s + base rate, floored to units");
        // Within the cap: no flag.
        let g = process_request(&mut st, &cfg, &request(FLAG_NEW, 8, 19));
        assert_eq!(g.outcome & OUT_CLAMPED, 0);
    }

    #[test]
    fn allocation_saturates_at_255_units() {
        // A deadline flow on an empty 100G link with a small scale: desired + fair share
        // exceeds 255 units and is cut (accounting only what was written).
        let cfg = D3LinkConfig::for_line_rate(100 * GBPS);
        let mut st = D3LinkState::new(&cfg);
        let r = request(0, 0, 25); // 51_200 B/s, not new: fair share is the whole link
        let g = process_request(&mut st, &cfg, &r);
        assert_eq!(g.units, 255);
        assert_ne!(g.outcome & OUT_SATURATED, 0);
        assert_eq!(st.allocated, 255 * 2048);
    }

    // ---------------------------------------------------------------- router: hops

    fn pass_chain(links: &mut [(D3LinkState, D3LinkConfig)], req: &mut [u8; REQ_LEN]) -> Vec<Grant> {
        links
            .iter_mut()
            .map(|(st, cfg)| router_rewrite(req, st, cfg))
            .collect()
    }

    #[test]
    fn hop_chain_never_grants_more_than_a_previous_hop() {
        let big = D3LinkConfig::for_line_rate(GBPS);
        let small = D3LinkConfig::for_line_rate(GBPS / 10);
        // Not new, non-deadline, sender scale 8: each hop alone would grant its whole link.
        let base = request(0, 8, 0).encode();

        let mut links = [(D3LinkState::new(&big), big), (D3LinkState::new(&small), small)];
        let mut b = base;
        let g = pass_chain(&mut links, &mut b);
        assert_eq!((g[0].units, g[1].units), (238, 23));
        assert_eq!(g[1].outcome & OUT_UPSTREAM_CAP, 0);
        assert_eq!(req_hop(&b), 2);

        let mut links = [
            (D3LinkState::new(&small), small),
            (D3LinkState::new(&big), big),
            (D3LinkState::new(&big), big),
        ];
        let mut b = base;
        let g = pass_chain(&mut links, &mut b);
        assert_eq!((g[0].units, g[1].units, g[2].units), (23, 23, 23));
        assert_ne!(g[1].outcome & OUT_UPSTREAM_CAP, 0);
        assert_ne!(g[2].outcome & OUT_UPSTREAM_CAP, 0);
        // The capped hops account only what they granted.
        assert_eq!(links[1].0.allocated, 23 * U8);
        let fb = D3Feedback::decode(&feedback_for(&b).expect("valid")).expect("valid");
        assert_eq!(fb.hops, 3);
        assert_eq!(fb.alloc, [23, 23, 23, 0, 0, 0]);
        assert_eq!(fb.min_rate(), Some(23 * U8));

        // Next request from this flow returns each hop's own allocation exactly.
        // (The flow's request above was a non-deadline one at scale 8, as a 1G sender builds.)
        let mut f = D3FlowState::new(0);
        let first = f
            .next_request(&HostInput {
                has_deadline: false,
                ..input(1, 1)
            })
            .expect("r");
        assert_eq!((first.req.scale, first.req.desired), (8, 0));
        assert_eq!(f.apply_feedback(&fb), Some(23 * U8));
        let mut next = f
            .next_request(&HostInput {
                fin: true,
                ..input(0, 1)
            })
            .expect("fin")
            .req
            .encode();
        pass_chain(&mut links, &mut next);
        for (st, _) in &links {
            assert_eq!((st.demand, st.allocated), (0, 0));
        }
    }

    #[test]
    fn full_vector_and_invalid_options_are_left_alone() {
        let cfg = cfg_1g();
        let mut st = D3LinkState::new(&cfg);
        let mut b = D3Request {
            hop: 6,
            ..request(0, 8, 10)
        }
        .encode();
        let orig = b;
        let g = router_rewrite(&mut b, &mut st, &cfg);
        assert_eq!(g.outcome, OUT_HOP_OVERFLOW);
        assert_eq!(b, orig);
        assert_eq!(st, D3LinkState::new(&cfg));
        // A feedback option is not a request.
        let f = D3Feedback {
            hops: 1,
            scale: 0,
            alloc: [0; HOPS],
        }
        .encode();
        let mut as_req = [0u8; REQ_LEN];
        as_req[..FB_LEN].copy_from_slice(&f);
        assert_eq!(router_rewrite(&mut as_req, &mut st, &cfg).outcome, OUT_INVALID);
        // A future version (reserved bit) is left alone.
        let mut r = request(0, 8, 10).encode();
        r[4] |= FLAG_RESERVED;
        let orig = r;
        assert_eq!(router_rewrite(&mut r, &mut st, &cfg).outcome, OUT_INVALID);
        assert_eq!(r, orig);
        assert_eq!(st.requests, 0);
    }
}
