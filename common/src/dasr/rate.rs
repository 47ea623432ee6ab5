//! The rate arithmetic of DASR: the share a sender paces at, how it combines with a class's
//! own flow rate, when a sender stops trusting an old share, and the rate histogram.

use crate::edt::NSEC_PER_SEC;

/// Frames each sender adds to an epoch: a flow paced at line / N sends a frame (or a TSO burst
/// of two) every N frame times; four give a margin of two.
pub const GAP_FRAMES: u64 = 4;
/// How far apart a paced TCP flow's bursts arrive: Linux sizes a paced flow's TSO bursts to
/// `sk_pacing_rate >> sk_pacing_shift` bytes (shift 10 by default: 1/1024 s of data), so a
/// flow at any share sends a burst about every 0.98 ms, whatever N; `2^20` ns rounds it up.
pub const PACED_BURST_GAP_NS: u64 = 1 << 20;
/// Bursts each epoch covers at least: a margin of two, as for [`GAP_FRAMES`].
pub const BURST_GAPS: u64 = 2;

/// The shortest epoch for `active_rtts` RTTs of `rtt_ns`: the RTTs, and never less than
/// [`BURST_GAPS`] times a paced flow's burst gap, so a flow capped at its share (which sends
/// in bursts about a millisecond apart) stays counted between its bursts.
#[inline]
pub const fn min_window_ns(rtt_ns: u64, active_rtts: u32) -> u64 {
    let rtts = rtt_ns.saturating_mul(active_rtts as u64);
    let bursts = BURST_GAPS * PACED_BURST_GAP_NS;
    if rtts > bursts { rtts } else { bursts }
}

/// A sender takes a higher share only once its receiver advertised one for this long (a lower
/// one at once). When S flows start together, say the next block of an incast after an idle
/// gap, the receiver counts them as their first segments arrive: the first ACKs carry N = 1,
/// 2, ... and only an RTT later N = S. Taking those at once would release every window at up
/// to the line rate into the port the S flows share. One minimum epoch (two paced bursts) is
/// what the count needs to see every flow that is sending.
pub const RAISE_HOLD_NS: u64 = BURST_GAPS * PACED_BURST_GAP_NS;

/// The share a sender applies after its receiver advertised `advertised` at `now_ns`, with
/// `applied` in force (0: none) and a higher share advertised since `raise_since_ns` (0: none);
/// returns (applied, raise_since_ns). Cuts apply at once; rises after [`RAISE_HOLD_NS`].
#[inline(always)]
pub const fn follow(applied: u64, advertised: u64, raise_since_ns: u64, now_ns: u64) -> (u64, u64) {
    if applied == 0 || advertised <= applied {
        return (advertised, 0);
    }
    if raise_since_ns == 0 {
        return (applied, now_ns);
    }
    if now_ns.saturating_sub(raise_since_ns) >= RAISE_HOLD_NS {
        (advertised, 0)
    } else {
        (applied, raise_since_ns)
    }
}

/// A sender drops a share its receiver has not repeated for this many of its RTTs (the
/// receiver stamps every pure ACK of a flow it counts: ACKs arriving without the option mean
/// it stopped: its agent is gone or its policy changed).
pub const STALE_RTTS: u64 = 8;
/// ... and never sooner than this.
pub const STALE_MIN_NS: u64 = 2_000_000;
/// ... and only once the flow sent this many data segments since the share was last
/// confirmed: a flow that was idle (nothing sent, so no ACK to stamp) keeps its share and
/// resumes at it, instead of bursting a restarted window at the line rate into a port its N
/// peers are about to fill too (the synchronized next block of an incast).
pub const STALE_SEGS: u32 = 16;
/// Buckets of the histogram of rates set on senders: bucket `i` counts rates in
/// `[2^(i+16), 2^(i+17))` bytes/s (bucket 0 also takes smaller ones, the last larger ones):
/// 64 KB/s (0.5 Mbit/s) to 1 TB/s.
pub const RATE_BUCKETS: usize = 24;

/// line / N, in the units of `line` (N = 0 reads as 1).
#[inline(always)]
pub const fn share(line: u64, senders: u32) -> u64 {
    if senders <= 1 { line } else { line / senders as u64 }
}

/// The rate a flow is held to: the smaller of its class's flow rate and its DASR share, where 0
/// means "none" for either. DASR only ever lowers a rate.
#[inline(always)]
pub const fn cap(class_rate: u64, dasr_rate: u64) -> u64 {
    if dasr_rate == 0 || (class_rate != 0 && class_rate < dasr_rate) {
        class_rate
    } else {
        dasr_rate
    }
}

/// [`super::Window::per_sender_ns`]: [`GAP_FRAMES`] frames of `frame_bytes` at `line` bytes/s.
#[inline]
pub const fn per_sender_ns(frame_bytes: u64, line: u64) -> u64 {
    match (GAP_FRAMES * frame_bytes * NSEC_PER_SEC).checked_div(line) {
        Some(v) => v,
        None => 0,
    }
}

/// Whether a share last confirmed at `seen_ns` is stale at `now_ns` for a flow whose smoothed
/// RTT is `srtt_ns` and which sent `segs_since` data segments since: the receiver stopped
/// stamping the ACKs of a flow that kept sending.
#[inline(always)]
pub const fn stale(now_ns: u64, seen_ns: u64, srtt_ns: u64, segs_since: u32) -> bool {
    let limit = STALE_RTTS.saturating_mul(srtt_ns);
    let limit = if limit > STALE_MIN_NS { limit } else { STALE_MIN_NS };
    segs_since >= STALE_SEGS && now_ns.saturating_sub(seen_ns) > limit
}

/// The histogram bucket of a rate in bytes/s.
#[inline(always)]
pub const fn rate_bucket(rate: u64) -> usize {
    let lz = rate.leading_zeros() as usize; // 64 for 0
    let log2 = if lz >= 64 { 0 } else { 63 - lz };
    if log2 <= 16 {
        0
    } else if log2 - 16 >= RATE_BUCKETS {
        RATE_BUCKETS - 1
    } else {
        log2 - 16
    }
}

/// The upper bound (bytes/s) of bucket `i` (the last is open-ended).
#[inline]
pub const fn bucket_upper(i: usize) -> u64 {
    1u64 << (i + 17)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_divides_the_line_and_never_exceeds_it() {
        assert_eq!(share(125_000_000, 0), 125_000_000);
        assert_eq!(share(125_000_000, 1), 125_000_000);
        assert_eq!(share(125_000_000, 2), 62_500_000);
        assert_eq!(share(125_000_000, 64), 1_953_125);
        assert_eq!(share(125_000_000, 3) * 3, 124_999_998, "rounded down");
        // Summed over the N senders, never above the line.
        for n in 1..200u32 {
            assert!(share(1_250_000_000, n) * n as u64 <= 1_250_000_000);
        }
    }

    #[test]
    fn dasr_only_ever_lowers_a_rate() {
        assert_eq!(cap(0, 0), 0, "no limit at all");
        assert_eq!(cap(0, 5), 5, "DASR alone");
        assert_eq!(cap(7, 0), 7, "the class alone");
        assert_eq!(cap(7, 5), 5);
        assert_eq!(cap(3, 5), 3, "a lower class rate stays");
    }

    #[test]
    fn shortest_epoch_covers_two_paced_bursts() {
        // 2 RTTs of 100 us are shorter than two bursts of a flow TCP paces (about 1 ms each).
        assert_eq!(min_window_ns(100_000, 2), 2 * PACED_BURST_GAP_NS);
        // Long RTTs win.
        assert_eq!(min_window_ns(5_000_000, 2), 10_000_000);
        assert_eq!(min_window_ns(u64::MAX, 64), u64::MAX);
    }

    #[test]
    fn per_sender_time_is_four_frames() {
        // 4 * 1514 B at 1 Gbit/s = 48.448 us.
        assert_eq!(per_sender_ns(1514, 125_000_000), 48_448);
        assert_eq!(per_sender_ns(1514, 0), 0);
    }

    #[test]
    fn a_share_goes_stale_after_eight_rtts_and_at_least_two_ms() {
        let busy = STALE_SEGS;
        assert!(
            !stale(10_000_000, 9_000_000, 100_000, busy),
            "1 ms: under the 2 ms floor"
        );
        assert!(
            stale(10_000_000, 7_000_000, 100_000, busy),
            "3 ms > max(0.8 ms, 2 ms)"
        );
        assert!(
            !stale(10_000_000, 3_000_000, 1_000_000, busy),
            "7 ms < 8 RTTs of 1 ms"
        );
        assert!(stale(20_000_000, 3_000_000, 1_000_000, busy));
        assert!(!stale(1, 5, 0, busy), "a time before the last sighting");
        assert!(!stale(u64::MAX, 0, u64::MAX, busy), "no overflow");
    }

    #[test]
    fn cuts_apply_at_once_and_rises_after_the_hold() {
        let ms = 1_000_000;
        // The first share, and a cut, at once.
        assert_eq!(follow(0, 500, 0, 10 * ms), (500, 0));
        assert_eq!(follow(500, 250, 0, 10 * ms), (250, 0));
        // A rise waits: the synchronized start of S flows advertises N = 1, 2, ... first.
        assert_eq!(follow(250, 1000, 0, 10 * ms), (250, 10 * ms));
        assert_eq!(follow(250, 1000, 10 * ms, 11 * ms), (250, 10 * ms));
        // A cut in the meantime ends the wait.
        assert_eq!(follow(250, 125, 10 * ms, 11 * ms), (125, 0));
        // Held long enough: taken.
        assert_eq!(follow(250, 1000, 10 * ms, 10 * ms + RAISE_HOLD_NS), (1000, 0));
        // The same share again is no rise.
        assert_eq!(follow(250, 250, 0, 10 * ms), (250, 0));
    }

    #[test]
    fn an_idle_flow_keeps_its_share() {
        // A second later, but the flow sent only a restarted window's first segments since.
        assert!(!stale(1_000_000_000, 0, 100_000, STALE_SEGS - 1));
        assert!(stale(1_000_000_000, 0, 100_000, STALE_SEGS));
    }

    #[test]
    fn rate_buckets_are_powers_of_two() {
        assert_eq!(rate_bucket(0), 0);
        assert_eq!(rate_bucket(131_071), 0);
        assert_eq!(rate_bucket(131_072), 1);
        assert_eq!(rate_bucket(1_953_125), 4, "1 Gbit/s / 64");
        assert!(1_953_125 < bucket_upper(4) && 1_953_125 >= bucket_upper(3));
        assert_eq!(rate_bucket(u64::MAX), RATE_BUCKETS - 1);
    }
}
