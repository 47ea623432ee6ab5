//! Earliest-Departure-Time clock arithmetic.
//!
//! A clock holds the earliest time (CLOCK_MONOTONIC ns) at which the next packet of its flow or
//! aggregate may leave. A packet of `len` bytes on a clock of rate `r` bytes/s takes the slot
//! `[max(clock, floor), max(clock, floor) + len * 1e9 / r)`: it departs at the start of its slot
//! and the clock moves to the slot's end, so consecutive packets of a backlogged clock leave
//! exactly `len * 1e9 / r` ns apart. `floor` is `max(now, the timestamp the stack already set)`:
//! a departure is never moved earlier than what TCP's own EDT asked for.
//!
//! A packet that several clocks apply to (its flow's, its class's, its level's) departs at the
//! latest of their slots. Each aggregate clock advances by its own reservation only, so one slow
//! flow never holds back the other flows of its class; the flow clock restarts from the actual
//! departure, so a flow never exceeds its own rate between real departures.
//!
//! These functions are called per packet by the tc program and by the unit tests.

pub const NSEC_PER_SEC: u64 = 1_000_000_000;

/// Bytes each TCP/IPv4 frame carries on the wire besides its payload: Ethernet 14 + IPv4 20 +
/// TCP 20 + the timestamp option 12 (Linux sends it on every segment). What turns a wire rate
/// into TCP's payload pacing rate, and a payload into the frames that carry it.
pub const TCP_FRAME_OVERHEAD_V4: u64 = 14 + 20 + 20 + 12;
/// The same over IPv6 (a 40-byte IP header).
pub const TCP_FRAME_OVERHEAD_V6: u64 = 14 + 40 + 20 + 12;
const _: () = assert!(TCP_FRAME_OVERHEAD_V4 == 66 && TCP_FRAME_OVERHEAD_V6 == 86);

/// [`TCP_FRAME_OVERHEAD_V4`] or [`TCP_FRAME_OVERHEAD_V6`].
#[inline(always)]
pub const fn tcp_frame_overhead(v6: bool) -> u64 {
    if v6 {
        TCP_FRAME_OVERHEAD_V6
    } else {
        TCP_FRAME_OVERHEAD_V4
    }
}

/// Time `len` bytes occupy at `rate` bytes/s, in ns (0 when `rate` is 0, i.e. unlimited).
///
/// Exact for `len` up to 18 GB, far above any packet (GSO super-packets are at most 64 KiB).
#[inline(always)]
pub fn tx_time_ns(len: u64, rate: u64) -> u64 {
    (len * NSEC_PER_SEC).checked_div(rate).unwrap_or(0)
}

/// Bytes a packet occupies on the wire: a GSO packet of `len` bytes (one set of headers of
/// `hdr_len` bytes, the payload of `segs` segments) leaves as `segs` frames, each with its own
/// headers. Charging `len` alone would let a paced TCP flow at MTU 1500 leave 4.6% faster than
/// its rate (66 header bytes per 1448 of payload), which is what the pacing experiment showed
/// before this was counted. `segs` of 0 or 1 is a plain packet.
#[inline(always)]
pub fn wire_len(len: u64, segs: u64, hdr_len: u64) -> u64 {
    if segs > 1 { len + (segs - 1) * hdr_len } else { len }
}

/// The start of the slot a packet would take on `clock` given the `floor`.
#[inline(always)]
pub fn slot_start(clock: u64, floor: u64) -> u64 {
    if clock > floor { clock } else { floor }
}

/// What happens to a packet, decided before any clock is advanced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Leave at `depart` (ns). `delayed` when `depart` > `floor`.
    Send { depart: u64, delayed: bool },
    /// The departure would lie beyond the horizon: drop, and advance no clock.
    Drop { depart: u64 },
}

/// Composes the slots of up to three clocks (pass `floor` for a clock that does not apply).
///
/// `now` is the current time and `horizon_ns` the furthest a departure may lie ahead of it
/// (0 disables the horizon).
#[inline(always)]
pub fn decide(now: u64, floor: u64, slots: [u64; 3], horizon_ns: u64) -> Verdict {
    let mut depart = floor;
    let mut i = 0;
    while i < 3 {
        if slots[i] > depart {
            depart = slots[i];
        }
        i += 1;
    }
    if horizon_ns != 0 && depart > now && depart - now > horizon_ns {
        Verdict::Drop { depart }
    } else {
        Verdict::Send {
            depart,
            delayed: depart > floor,
        }
    }
}

/// The new value of a flow clock after its packet departs at `depart`.
#[inline(always)]
pub fn flow_clock_after(depart: u64, len: u64, rate: u64) -> u64 {
    depart + tx_time_ns(len, rate)
}

/// The new value of an aggregate clock after a packet takes its slot (`reserve` semantics
/// without atomics; the datapath does the same with compare-and-swap).
#[inline(always)]
pub fn agg_clock_after(clock: u64, floor: u64, len: u64, rate: u64) -> u64 {
    slot_start(clock, floor) + tx_time_ns(len, rate)
}

/// Buckets of the added-delay histograms (per class and level, counted per CPU by the tc
/// program): bucket 0 holds delays below 2^10 ns (about 1 us, including 0), bucket `b` in
/// `1..DELAY_BUCKETS - 1` holds `[2^(9+b), 2^(10+b))` ns, the last one 2^32 ns (4.3 s) and more.
pub const DELAY_BUCKETS: usize = 24;

/// The upper bound (exclusive, ns) of delay bucket `b`; `None` for the last, open-ended one.
#[inline(always)]
pub const fn delay_bucket_bound_ns(b: usize) -> Option<u64> {
    if b + 1 >= DELAY_BUCKETS {
        None
    } else {
        Some(1u64 << (10 + b))
    }
}

/// The histogram bucket of a delay in ns: the bit length of `delay >> 10`, capped.
#[inline(always)]
pub const fn delay_bucket(delay_ns: u64) -> usize {
    let b = (64 - (delay_ns >> 10).leading_zeros()) as usize;
    if b >= DELAY_BUCKETS { DELAY_BUCKETS - 1 } else { b }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_buckets_are_log2_from_one_microsecond() {
        assert_eq!(delay_bucket(0), 0);
        assert_eq!(delay_bucket(1023), 0);
        assert_eq!(delay_bucket(1024), 1);
        assert_eq!(delay_bucket(2047), 1);
        assert_eq!(delay_bucket(2048), 2);
        assert_eq!(delay_bucket(5_000_000), 13, "5 ms is in [2^22, 2^23) ns");
        assert_eq!(delay_bucket((1 << 32) - 1), DELAY_BUCKETS - 2);
        assert_eq!(delay_bucket(1 << 32), DELAY_BUCKETS - 1);
        assert_eq!(delay_bucket(u64::MAX), DELAY_BUCKETS - 1);
        // Every delay lies below its bucket's bound and at or above the previous one's.
        for d in [
            0,
            1,
            999,
            1024,
            70_000,
            1_000_000,
            123_456_789,
            4_000_000_000,
            9_000_000_000,
        ] {
            let b = delay_bucket(d);
            if let Some(hi) = delay_bucket_bound_ns(b) {
                assert!(d < hi, "{d} in bucket {b}");
            }
            if b > 0 {
                assert!(
                    d >= delay_bucket_bound_ns(b - 1).unwrap_or(0),
                    "{d} in bucket {b}"
                );
            }
        }
    }

    #[test]
    fn gso_packets_are_charged_every_segments_headers() {
        // 3 segments of 1448 bytes of payload behind 66 bytes of Ethernet/IPv4/TCP headers:
        // skb->len counts the headers once, the wire carries them three times.
        let len = 66 + 3 * 1448;
        assert_eq!(wire_len(len, 3, 66), 3 * (66 + 1448));
        assert_eq!(wire_len(1514, 1, 66), 1514);
        assert_eq!(wire_len(1514, 0, 66), 1514);
    }

    #[test]
    fn tx_time_is_len_times_1e9_over_rate() {
        // 1500 bytes at 12.5 MB/s (100 Mbit/s) = 120 us.
        assert_eq!(tx_time_ns(1500, 12_500_000), 120_000);
        // 64 KiB GSO packet at 1.25 GB/s (10 Gbit/s).
        assert_eq!(tx_time_ns(65_536, 1_250_000_000), 52_428);
        assert_eq!(tx_time_ns(1500, 0), 0);
    }

    #[test]
    fn backlogged_clock_spaces_packets_by_len_over_rate() {
        let rate = 1_250_000; // 10 Mbit/s
        let now = 1_000_000_000;
        let mut clock = 0;
        let mut departs = [0u64; 4];
        for d in departs.iter_mut() {
            let s = slot_start(clock, now);
            *d = s;
            clock = agg_clock_after(clock, now, 1000, rate);
        }
        assert_eq!(departs[0], now, "an idle clock sends at once");
        for w in departs.windows(2) {
            assert_eq!(w[1] - w[0], 800_000, "1000 B at 1.25 MB/s is 800 us");
        }
    }

    #[test]
    fn never_earlier_than_stack_timestamp() {
        let now = 100;
        let stack_ts = 5_000;
        let floor = stack_ts.max(now);
        match decide(now, floor, [0, 200, floor], 0) {
            Verdict::Send { depart, delayed } => {
                assert_eq!(depart, 5_000);
                assert!(!delayed);
            }
            v => panic!("unexpected {v:?}"),
        }
    }

    #[test]
    fn latest_clock_wins() {
        let v = decide(1_000, 1_000, [3_000, 9_000, 4_000], 0);
        assert_eq!(
            v,
            Verdict::Send {
                depart: 9_000,
                delayed: true
            }
        );
    }

    #[test]
    fn beyond_horizon_drops() {
        let now = 1_000;
        assert_eq!(
            decide(now, now, [now + 10_001, 0, 0], 10_000),
            Verdict::Drop { depart: now + 10_001 }
        );
        assert_eq!(
            decide(now, now, [now + 10_000, 0, 0], 10_000),
            Verdict::Send {
                depart: now + 10_000,
                delayed: true
            }
        );
        // Horizon 0 = disabled.
        assert!(matches!(
            decide(now, now, [u64::MAX / 2, 0, 0], 0),
            Verdict::Send { .. }
        ));
    }

    #[test]
    fn flow_clock_restarts_from_actual_departure() {
        // Held by an aggregate until 50_000, the flow's next slot is 50_000 + len/rate.
        assert_eq!(flow_clock_after(50_000, 1_000, 1_000_000_000), 51_000);
    }
}
