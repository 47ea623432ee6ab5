//! The capacity controller: C, the capacity a router link hands out, moved once per interval T
//! ([`capacity_tick`], the paper's soft state): under-use raises C, a queue lowers it, an idle
//! link resets.

use super::router::{CAP_MODE_PAPER, D3LinkConfig, D3LinkState};
use super::units::bytes_per_second;

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

    #[test]
    fn leaked_allocations_wash_out() {
        let cfg = cfg_1g();
        let mut st = D3LinkState::new(&cfg);
        // Two long flows take the link (119 units each, all but 219_456 B/s), then their hosts
        // die without a FIN.
        let reqs: Vec<D3Request> = (0..2).map(|_| request(FLAG_NEW, 8, 0)).collect();
        for r in &reqs {
            process_request(&mut st, &cfg, r);
        }
        for r in &reqs {
            process_request(&mut st, &cfg, &follow_up(r, 0, 0));
        }
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
}
