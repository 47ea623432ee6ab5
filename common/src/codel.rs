//! CoDel (Nichols and Jacobson, RFC 8289) over an EDT departure queue.
//!
//! A paced aggregate (a class or a QJump level with a rate) has no queue of packets: its clock
//! runs ahead of now by the time its backlog needs, and fq holds each packet until its
//! departure. That lead *is* the queue's delay: a packet that gets the slot starting at
//! `depart` waits `sojourn = depart - now` (now being the later of the clock read and the
//! stack's own timestamp). The tc program knows it when the packet arrives, so CoDel decides at
//! enqueue what it would decide at dequeue, and its signal reaches the sender one queue delay
//! earlier:
//!
//! - CoDel's clock is the departure time on the aggregate's own clock (`depart`): the time at
//!   which a dequeue-time CoDel would see the packet. Consecutive packets of a backlogged
//!   aggregate are `len / rate` apart on it, as at a real dequeue. (xdp-project's
//!   traffic-pacing-edt makes the same choice.)
//! - A queue is *above target* when `sojourn >= target` and more than the packet's own
//!   transmission time is ahead of it (RFC 8289's "more than one MTU queued").
//! - Above target for a whole `interval`: signal (mark CE, or drop), then signal again after
//!   `interval / sqrt(count)` ([`control_law`]), until the queue goes below target.
//! - Re-entering soon (within 16 intervals of the last episode's next signal) resumes at the
//!   previous episode's signal count minus where it started (RFC 8289, section 5.5).
//!
//! The state is shared by every CPU that sends the aggregate's packets. [`step`] is pure: the
//! datapath runs it on a copy, claims a signal by compare-and-swap on
//! [`CodelState::signal_next`] (two CPUs never both take the same signal) and writes the rest
//! back. Two packets racing otherwise move a transition by one packet.
//!
//! No floats, no `u128`, no division: `1 / sqrt(count)` comes from a 256-entry table of
//! `2^16 / sqrt(n)` with the count reduced by powers of 4 ([`inv_sqrt_q16`]).

use core::mem::size_of;

/// [`CodelParams::flags`]: CoDel runs on this aggregate's departure queue.
pub const CODEL_ON: u32 = 1 << 0;
/// [`CodelParams::flags`]: mark CE on ECN-capable packets (ECT(0), ECT(1), CE) instead of
/// dropping them; packets that are not ECN-capable are dropped.
pub const CODEL_ECN: u32 = 1 << 1;

/// CoDel's configuration for one aggregate (a field of `ClassConfig` and `LevelConfig`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CodelParams {
    /// Acceptable standing queue delay, ns.
    pub target_ns: u32,
    /// How long the delay may stay above target before CoDel signals, and the base of the
    /// signal spacing, ns.
    pub interval_ns: u32,
    /// `CODEL_*` bits; without [`CODEL_ON`] the aggregate has no CoDel.
    pub flags: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<CodelParams>() == 16);

impl CodelParams {
    /// CoDel off.
    pub const fn off() -> Self {
        CodelParams {
            target_ns: 0,
            interval_ns: 0,
            flags: 0,
            _pad: 0,
        }
    }

    /// CoDel on with `target` and `interval` (ns); `ecn`: mark instead of dropping.
    pub const fn on(target_ns: u32, interval_ns: u32, ecn: bool) -> Self {
        CodelParams {
            target_ns,
            interval_ns,
            flags: CODEL_ON | if ecn { CODEL_ECN } else { 0 },
            _pad: 0,
        }
    }

    #[inline(always)]
    pub const fn is_on(&self) -> bool {
        self.flags & CODEL_ON != 0
    }

    #[inline(always)]
    pub const fn ecn(&self) -> bool {
        self.flags & CODEL_ECN != 0
    }
}

/// One aggregate's CoDel state (value of `PL_CODEL`, shared by all CPUs). All times are on
/// the aggregate's departure clock (CLOCK_MONOTONIC ns). Alone in a cache line, as the
/// aggregates' clocks are (`AggClock`): two aggregates' states written from two CPUs would
/// otherwise move one line back and forth.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CodelState {
    /// While the delay is above target: when it will have been above for a whole interval
    /// (the first above-target departure plus the interval). 0 while below target.
    pub first_above: u64,
    /// While signalling: when the next signal is due. After an episode: when its next signal
    /// would have been (to tell whether a new episode follows closely).
    pub signal_next: u64,
    /// Signals of the current (or last) episode, as RFC 8289 counts them.
    pub count: u32,
    /// `count` when the current (or last) episode began.
    pub lastcount: u32,
    /// 1 while signalling, else 0.
    pub signalling: u32,
    pub _pad: [u32; 9],
}
const _: () = assert!(size_of::<CodelState>() == 64);

/// Entries of [`INV_SQRT_Q16`].
const TABLE: usize = 256;
/// `round(2^16 / sqrt(n))` for `n` in 0..256 (entry 0 is taken as `n = 1`).
const INV_SQRT_Q16: [u32; TABLE] = inv_sqrt_table();

const fn isqrt(v: u64) -> u64 {
    if v < 2 {
        return v;
    }
    // Newton's iteration from above converges to floor(sqrt(v)).
    let mut x = v;
    let mut y = x.div_ceil(2);
    while y < x {
        x = y;
        y = (x + v / x) / 2;
    }
    x
}

const fn inv_sqrt_table() -> [u32; TABLE] {
    let mut t = [0u32; TABLE];
    t[0] = 1 << 16;
    let mut n = 1;
    while n < TABLE {
        // 2^17 / sqrt(n), then halved with rounding: round(2^16 / sqrt(n)).
        let twice = isqrt((1u64 << 34) / n as u64);
        t[n] = twice.div_ceil(2) as u32;
        n += 1;
    }
    t
}

/// `2^16 / sqrt(count)`, within 1% (exact to rounding for counts below 256; above, the count
/// is divided by `4^k` until it is below 256, losing less than 1/64 of it, and the result
/// divided by `2^k`). A count of 0 is taken as 1.
#[inline(always)]
pub fn inv_sqrt_q16(count: u32) -> u32 {
    let bits = 32 - count.leading_zeros();
    let k = bits.saturating_sub(7) >> 1;
    let m = (count >> (2 * k)) & (TABLE as u32 - 1);
    INV_SQRT_Q16[m as usize] >> k
}

/// The control law: the next signal `interval / sqrt(count)` after `t`.
#[inline(always)]
pub fn control_law(t: u64, interval_ns: u32, count: u32) -> u64 {
    t.wrapping_add((interval_ns as u64 * inv_sqrt_q16(count) as u64) >> 16)
}

/// One packet through CoDel: `sojourn` is the delay the aggregate's queue adds to it (its
/// departure on the aggregate's clock minus now), `one_packet_ns` its own transmission time at
/// the aggregate's rate, `depart` its departure on the aggregate's clock (CoDel's time).
/// Updates `st` and returns whether this packet carries a congestion signal (mark or drop).
#[inline(always)]
pub fn step(st: &mut CodelState, p: &CodelParams, sojourn: u64, one_packet_ns: u64, depart: u64) -> bool {
    let interval = p.interval_ns as u64;
    let above = sojourn >= p.target_ns as u64 && sojourn > one_packet_ns;
    // RFC 8289's ok_to_drop: above target, and for at least an interval.
    let mut ok = false;
    if !above {
        st.first_above = 0;
    } else if st.first_above == 0 {
        // At least 1: a first_above of 0 means "below target".
        st.first_above = depart.wrapping_add(interval).max(1);
    } else if depart >= st.first_above {
        ok = true;
    }
    if st.signalling != 0 {
        if !ok {
            st.signalling = 0;
            return false;
        }
        if depart < st.signal_next {
            return false;
        }
        st.count = st.count.saturating_add(1);
        st.signal_next = control_law(st.signal_next, p.interval_ns, st.count);
        return true;
    }
    if !ok {
        return false;
    }
    // A new episode. If the last one ended recently, its signal rate is a good start.
    st.signalling = 1;
    let delta = st.count.wrapping_sub(st.lastcount);
    let recent = depart < st.signal_next.wrapping_add(16 * interval);
    st.count = if delta > 1 && recent { delta } else { 1 };
    st.lastcount = st.count;
    st.signal_next = control_law(depart, p.interval_ns, st.count);
    true
}

/// Is a packet whose IP header has these ECN bits (the low two bits of the TOS / traffic
/// class) ECN-capable? ECT(1) = 01, ECT(0) = 10, CE = 11; 00 is Not-ECT.
#[inline(always)]
pub const fn ecn_capable(ecn: u8) -> bool {
    ecn & 3 != 0
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with a message")]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    const MS: u64 = 1_000_000;

    fn params() -> CodelParams {
        CodelParams::on(5 * MS as u32, 100 * MS as u32, true)
    }

    #[test]
    fn inverse_square_roots_are_within_one_percent() {
        for n in (1u32..1_000_000).chain([u32::MAX / 3, u32::MAX - 1]) {
            let exact = 65536.0 / f64::from(n).sqrt();
            let got = f64::from(inv_sqrt_q16(n));
            assert!(
                (got - exact).abs() <= exact * 0.01 + 1.0,
                "n = {n}: {got} against {exact}"
            );
        }
        assert_eq!(inv_sqrt_q16(1), 65536);
        assert_eq!(inv_sqrt_q16(4), 32768);
        assert_eq!(inv_sqrt_q16(16), 16384);
        assert_eq!(inv_sqrt_q16(64), 8192);
        assert_eq!(inv_sqrt_q16(0), 65536, "0 is taken as 1");
        assert_eq!(inv_sqrt_q16(u32::MAX), 1, "no overflow at the top");
    }

    #[test]
    fn control_law_spaces_signals_by_interval_over_sqrt_count() {
        let i = 100 * MS as u32;
        assert_eq!(control_law(1_000, i, 1), 1_000 + 100 * MS);
        assert_eq!(control_law(0, i, 4), 50 * MS);
        let hundred = control_law(0, i, 100);
        assert!(hundred.abs_diff(10 * MS) < 1_000, "{hundred}");
        let two = control_law(0, i, 2) as f64;
        assert!((two - 100e6 / 2f64.sqrt()).abs() < 2_000.0, "{two}");
    }

    /// Feeds packets `gap` ns apart on the departure clock, each with `sojourn(i)`; returns
    /// the departures that were signalled.
    fn run(
        st: &mut CodelState,
        p: &CodelParams,
        from: u64,
        n: u64,
        gap: u64,
        sojourn: impl Fn(u64) -> u64,
    ) -> Vec<u64> {
        let mut out = Vec::new();
        for i in 0..n {
            let t = from + i * gap;
            if step(st, p, sojourn(i), 1_000, t) {
                out.push(t);
            }
        }
        out
    }

    #[test]
    fn below_target_never_signals() {
        let mut st = CodelState::default();
        let s = run(&mut st, &params(), 1_000 * MS, 10_000, 100_000, |_| 4 * MS);
        assert!(s.is_empty());
        assert_eq!(st, CodelState::default());
    }

    #[test]
    fn a_queue_of_one_packet_is_not_a_standing_queue() {
        // A slow aggregate: one packet takes 12 ms, above the 5 ms target on its own.
        let mut st = CodelState::default();
        let p = params();
        for i in 0..1_000 {
            assert!(!step(&mut st, &p, 12 * MS, 12 * MS, 1_000 * MS + i * 12 * MS));
        }
    }

    #[test]
    fn first_signal_after_a_whole_interval_above_target_then_interval_over_sqrt_count() {
        let mut st = CodelState::default();
        let p = params();
        let t0 = 1_000 * MS;
        // 10 ms of queue, packets 1 ms apart for 400 ms.
        let s = run(&mut st, &p, t0, 400, MS, |_| 10 * MS);
        // First above target at t0: the first signal one interval later.
        assert_eq!(s[0], t0 + 100 * MS);
        // Then 100/sqrt(1), 100/sqrt(2), ... ms apart: the gap after the k-th signal is
        // interval/sqrt(k) (each signal on the first packet at or after its due time).
        let mut due = s[0] as f64;
        for (k, w) in s.windows(2).enumerate() {
            due += 100e6 / ((k + 1) as f64).sqrt();
            assert_eq!(
                w[1],
                t0 + ((due - t0 as f64) / 1e6).ceil() as u64 * MS,
                "signal {}",
                k + 2
            );
        }
        assert!(s.len() >= 4, "{s:?}");
        assert_eq!(st.signalling, 1);
        assert_eq!(st.count as usize, s.len());
    }

    #[test]
    fn going_below_target_ends_the_episode_and_restarts_the_wait() {
        let mut st = CodelState::default();
        let p = params();
        let t0 = 1_000 * MS;
        let first = run(&mut st, &p, t0, 150, MS, |_| 10 * MS);
        assert_eq!(first, [t0 + 100 * MS]);
        // One packet below target: the episode ends.
        assert!(!step(&mut st, &p, MS, 1_000, t0 + 150 * MS));
        assert_eq!((st.signalling, st.first_above), (0, 0));
        // Above again: a whole interval before the next signal.
        let again = run(&mut st, &p, t0 + 151 * MS, 200, MS, |_| 10 * MS);
        assert_eq!(again[0], t0 + 251 * MS);
    }

    #[test]
    fn an_episode_soon_after_the_last_resumes_its_signal_rate() {
        let mut st = CodelState::default();
        let p = params();
        let t0 = 1_000 * MS;
        // A long episode: many signals.
        let s = run(&mut st, &p, t0, 1_000, MS, |_| 10 * MS);
        let count = st.count;
        assert!(count >= 8, "{count}");
        assert!(!step(&mut st, &p, 0, 1_000, t0 + 1_000 * MS));
        // Back above target shortly after: the new episode starts at count - lastcount.
        let again = run(&mut st, &p, t0 + 1_001 * MS, 300, MS, |_| 10 * MS);
        assert_eq!(again[0], t0 + 1_101 * MS);
        assert_eq!(
            st.lastcount,
            count - 1,
            "delta of the last episode ({} signals)",
            s.len()
        );
        // Long after (more than 16 intervals): from 1.
        let mut late = st;
        late.signalling = 0;
        late.first_above = 0;
        let far = t0 + 10_000 * MS;
        run(&mut late, &p, far, 101, MS, |_| 10 * MS);
        assert_eq!(late.count, 1);
    }

    #[test]
    fn ecn_capable_codepoints() {
        assert!(!ecn_capable(0));
        assert!(ecn_capable(1) && ecn_capable(2) && ecn_capable(3));
        assert!(!ecn_capable(0b1000_0100), "only the low two bits");
    }
}
