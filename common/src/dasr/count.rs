//! Counting the senders currently sending to one local address, in epochs.
//!
//! **Currently sending**: a flow (a TCP connection) is counted while one of its data segments
//! arrived in the address's current epoch or in the one before it, so for between E and 2E
//! after its last segment. An epoch lasts
//!
//! ```text
//! E = max(active_rtts * rtt, 2 * burst_gap, N * per_sender)
//!     burst_gap = PACED_BURST_GAP_NS (~1 ms), per_sender = GAP_FRAMES frames at line rate
//! ```
//!
//! (N as the epoch starts). A flow limited by its window sends at least once per RTT, so the
//! first term keeps it counted; Linux paces a flow in TSO bursts of about a millisecond of data
//! at its rate, so a flow capped at its share arrives in bursts about 1 ms apart whatever N is,
//! which the second term covers twice; a slow flow sends a two-segment burst every N frame
//! times at least, which the third covers with room to spare. A new flow
//! counts from its first data segment (N grows at once: the ACK of that segment carries it); a
//! flow that stopped drops out within 2E.
//!
//! # The words the datapath keeps per address
//! Several CPUs count one address at once, without a lock:
//! - the **epoch word**: sequence number (high 32 bits) and end tick (low 32 bits). The CPU that
//!   finds the epoch over replaces it with compare-and-swap ([`roll`]); one CPU wins.
//! - two **slots**, one per epoch parity: a tag (the low 24 bits of the epoch's sequence
//!   number), the flows seen in that epoch, and how many of them had been seen in the epoch
//!   before (`moved`), 20 bits each ([`slot_after`]). A slot whose tag is not the epoch's holds
//!   an older epoch and reads as empty, so a new epoch needs no reset: its first count replaces
//!   the stale slot, with compare-and-swap.
//!
//! Each flow remembers the sequence number of the last epoch it was counted in ([`sighting`]).
//! N = seen(current) + seen(previous) - moved(current): the flows of either epoch, each once
//! ([`senders`]).
//!
//! Time is in ticks of 1024 ns ([`ticks`]), 32 bits, compared by wrapping difference (epochs
//! are far shorter than the 73 minutes a tick counter takes to wrap).

/// A tick is `1 << TICK_SHIFT` ns.
pub const TICK_SHIFT: u32 = 10;
/// Bits of a slot's seen and moved counters (a million senders to one address).
const FIELD_BITS: u32 = 20;
const FIELD_MAX: u64 = (1 << FIELD_BITS) - 1;
const TAG_BITS: u32 = 24;
const TAG_MASK: u32 = (1 << TAG_BITS) - 1;
/// The longest epoch, whatever N (1 s).
pub const MAX_WINDOW_NS: u64 = 1_000_000_000;

/// CLOCK_MONOTONIC ns as ticks.
#[inline(always)]
pub const fn ticks(ns: u64) -> u32 {
    (ns >> TICK_SHIFT) as u32
}

/// Ticks as ns.
#[inline(always)]
pub const fn ticks_ns(t: u32) -> u64 {
    (t as u64) << TICK_SHIFT
}

/// `a` is earlier than `b` (wrapping).
#[inline(always)]
const fn before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// The epoch word of epoch `seq`, which ends at tick `end`.
#[inline(always)]
pub const fn epoch_word(seq: u32, end: u32) -> u64 {
    ((seq as u64) << 32) | end as u64
}

#[inline(always)]
pub const fn epoch_seq(word: u64) -> u32 {
    (word >> 32) as u32
}

#[inline(always)]
pub const fn epoch_end(word: u64) -> u32 {
    word as u32
}

/// Index of epoch `seq`'s slot.
#[inline(always)]
pub const fn slot_index(seq: u32) -> usize {
    (seq & 1) as usize
}

#[inline(always)]
const fn slot(seq: u32, seen: u64, moved: u64) -> u64 {
    (((seq & TAG_MASK) as u64) << (2 * FIELD_BITS)) | (seen << FIELD_BITS) | moved
}

/// (seen, moved) of epoch `seq` in `slot`: zeros when the slot holds another epoch.
#[inline(always)]
pub const fn slot_counts(slot: u64, seq: u32) -> (u32, u32) {
    if (slot >> (2 * FIELD_BITS)) as u32 != seq & TAG_MASK {
        return (0, 0);
    }
    (
        ((slot >> FIELD_BITS) & FIELD_MAX) as u32,
        (slot & FIELD_MAX) as u32,
    )
}

/// The slot after counting one more flow in epoch `seq` (`moved`: it was counted in the
/// epoch before). A slot of an older epoch starts over. Counters saturate.
#[inline(always)]
pub const fn slot_after(old: u64, seq: u32, moved: bool) -> u64 {
    let (seen, m) = slot_counts(old, seq);
    let seen = if (seen as u64) < FIELD_MAX {
        seen as u64 + 1
    } else {
        FIELD_MAX
    };
    let m = if moved && (m as u64) < FIELD_MAX {
        m as u64 + 1
    } else {
        m as u64
    };
    slot(seq, seen, m)
}

/// How long epochs are for one interface.
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub struct Window {
    /// `active_rtts * rtt`, ns.
    pub min_ns: u64,
    /// What each sender adds, ns (see [`crate::dasr::per_sender_ns`]).
    pub per_sender_ns: u64,
}

impl Window {
    /// The length of an epoch that starts with `n` senders, in ticks (at least 1).
    #[inline(always)]
    pub const fn len_ticks(&self, n: u32) -> u32 {
        // Both factors bounded, so the product fits (and needs no 128-bit multiply, which
        // the bpf target lacks): at most 2^20 * 1e9.
        let n = if (n as u64) > FIELD_MAX {
            FIELD_MAX
        } else {
            n as u64
        };
        let per = if self.per_sender_ns > MAX_WINDOW_NS {
            MAX_WINDOW_NS
        } else {
            self.per_sender_ns
        };
        let by_n = n * per;
        let ns = if by_n > self.min_ns { by_n } else { self.min_ns };
        let ns = if ns > MAX_WINDOW_NS { MAX_WINDOW_NS } else { ns };
        let t = ticks(ns);
        if t == 0 { 1 } else { t }
    }
}

/// An address's counting state as read from its map value.
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub struct AddrView {
    pub word: u64,
    pub slots: [u64; 2],
    /// The current epoch's length, ticks.
    pub len: u32,
}

/// Senders in the current epoch and the one before (as long as the current one lasts).
#[inline(always)]
const fn union(v: &AddrView) -> u32 {
    let seq = epoch_seq(v.word);
    let (seen, moved) = slot_counts(v.slots[slot_index(seq)], seq);
    let prev = seq.wrapping_sub(1);
    let (seen_prev, _) = slot_counts(v.slots[slot_index(prev)], prev);
    (seen + seen_prev).saturating_sub(moved)
}

/// N at tick `now`: the flows counted in the current epoch or the one before. After the
/// current epoch's end (no packet has rolled it yet) only its own flows count, for one more
/// epoch length; then none.
#[inline(always)]
pub const fn senders(v: &AddrView, now: u32) -> u32 {
    let end = epoch_end(v.word);
    if before(now, end) {
        union(v)
    } else if before(now, end.wrapping_add(v.len)) {
        let seq = epoch_seq(v.word);
        slot_counts(v.slots[slot_index(seq)], seq).0
    } else {
        0
    }
}

/// Whether a flow last counted in epoch `flow_seq` is one of the [`senders`] at tick `now`.
#[inline(always)]
pub const fn counted(v: &AddrView, flow_seq: u32, now: u32) -> bool {
    let seq = epoch_seq(v.word);
    let end = epoch_end(v.word);
    if before(now, end) {
        flow_seq == seq || flow_seq == seq.wrapping_sub(1)
    } else if before(now, end.wrapping_add(v.len)) {
        flow_seq == seq
    } else {
        false
    }
}

/// The epoch word and length that follow at tick `now`, when the current epoch is over. A
/// whole epoch length without any packet skips a sequence number, so the flows of the
/// finished epoch do not count as the previous epoch's.
#[inline(always)]
pub const fn roll(v: &AddrView, now: u32, w: &Window) -> Option<(u64, u32)> {
    let seq = epoch_seq(v.word);
    let end = epoch_end(v.word);
    if before(now, end) {
        return None;
    }
    let idle = !before(now, end.wrapping_add(v.len));
    let (next, n) = if idle {
        (seq.wrapping_add(2), 0)
    } else {
        (seq.wrapping_add(1), union(v))
    };
    let len = w.len_ticks(n);
    Some((epoch_word(next, now.wrapping_add(len)), len))
}

/// A new address's state at tick `now`: epoch 1, empty.
#[inline(always)]
pub const fn first_epoch(now: u32, w: &Window) -> AddrView {
    let len = w.len_ticks(0);
    AddrView {
        word: epoch_word(1, now.wrapping_add(len)),
        slots: [0, 0],
        len,
    }
}

/// Whether a flow last counted in epoch `flow_seq` (`None`: never) is counted in epoch `seq`:
/// `None` when it already is, else `Some(moved)`, `moved` when it was counted in the epoch
/// before.
#[inline(always)]
pub const fn sighting(flow_seq: Option<u32>, seq: u32) -> Option<bool> {
    match flow_seq {
        Some(s) if s == seq => None,
        Some(s) => Some(s == seq.wrapping_sub(1)),
        None => Some(false),
    }
}

/// The whole counting step for one data segment, on plain values: the single-CPU model of what
/// the datapath does with atomics. Returns the flow's new epoch.
#[inline]
pub fn observe(v: &mut AddrView, flow_seq: Option<u32>, now: u32, w: &Window) -> u32 {
    if let Some((word, len)) = roll(v, now, w) {
        v.word = word;
        v.len = len;
    }
    let seq = epoch_seq(v.word);
    if let Some(moved) = sighting(flow_seq, seq) {
        let i = slot_index(seq);
        v.slots[i] = slot_after(v.slots[i], seq, moved);
    }
    seq
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic, reason = "tests panic with a message")]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    const US: u64 = 1000;

    fn w() -> Window {
        // 2 RTTs of 100 us; 4 frames of 1514 B at 1 Gbit/s per sender.
        Window {
            min_ns: 200 * US,
            per_sender_ns: 48_448,
        }
    }

    /// Flows that each send a data segment every `gap[i]` ns from `start[i]` to `stop[i]`;
    /// returns N sampled every `step` ns over `[0, until)`.
    fn simulate(flows: &[(u64, u64, u64)], until: u64, step: u64) -> Vec<(u64, u32)> {
        let mut v = first_epoch(0, &w());
        let mut seqs: Vec<Option<u32>> = std::vec![None; flows.len()];
        let mut next: Vec<u64> = flows.iter().map(|f| f.0).collect();
        let mut out = Vec::new();
        let mut t = 0;
        while t < until {
            for (i, f) in flows.iter().enumerate() {
                while next[i] <= t && next[i] < f.1 {
                    seqs[i] = Some(observe(&mut v, seqs[i], ticks(next[i]), &w()));
                    next[i] += f.2;
                }
            }
            out.push((t, senders(&v, ticks(t))));
            t += step;
        }
        out
    }

    #[test]
    fn slots_count_their_own_epoch_and_start_over_for_a_new_one() {
        let s = slot_after(0, 7, false);
        assert_eq!(slot_counts(s, 7), (1, 0));
        let s = slot_after(s, 7, true);
        assert_eq!(slot_counts(s, 7), (2, 1));
        assert_eq!(slot_counts(s, 9), (0, 0), "another epoch's slot reads empty");
        assert_eq!(slot_counts(slot_after(s, 9, false), 9), (1, 0));
        // Tags compare on 24 bits, across the wrap of the sequence number.
        let s = slot_after(0, u32::MAX, false);
        assert_eq!(slot_counts(s, u32::MAX), (1, 0));
        let full = slot(3, FIELD_MAX, FIELD_MAX);
        assert_eq!(
            slot_counts(slot_after(full, 3, true), 3),
            (FIELD_MAX as u32, FIELD_MAX as u32)
        );
    }

    #[test]
    fn windows_grow_with_the_senders_and_stay_bounded() {
        let w = w();
        assert_eq!(w.len_ticks(0), ticks(200 * US));
        assert_eq!(w.len_ticks(4), ticks(200 * US), "RTTs dominate for a few senders");
        assert_eq!(w.len_ticks(64), ticks(64 * 48_448));
        assert_eq!(w.len_ticks(u32::MAX), ticks(MAX_WINDOW_NS));
        let zero = Window {
            min_ns: 0,
            per_sender_ns: 0,
        };
        assert_eq!(zero.len_ticks(0), 1, "an epoch is never empty");
    }

    #[test]
    fn a_flow_counts_from_its_first_segment_and_once_per_epoch() {
        let w = w();
        let mut v = first_epoch(0, &w);
        let s = observe(&mut v, None, 10, &w);
        assert_eq!(senders(&v, 10), 1);
        let s = observe(&mut v, Some(s), 20, &w);
        let _ = observe(&mut v, Some(s), 30, &w);
        assert_eq!(senders(&v, 30), 1, "the same flow again");
        let _ = observe(&mut v, None, 40, &w);
        assert_eq!(senders(&v, 40), 2, "a second flow, at once");
    }

    #[test]
    fn steady_flows_are_counted_once_across_epochs() {
        // 3 flows, each a segment every 50 us, for 5 ms: N = 3 throughout.
        let flows = [
            (0, 5_000 * US, 50 * US),
            (7 * US, 5_000 * US, 50 * US),
            (13 * US, 5_000 * US, 50 * US),
        ];
        let n = simulate(&flows, 5_000 * US, 10 * US);
        for (t, k) in n.iter().filter(|(t, _)| *t > 20 * US) {
            assert_eq!(*k, 3, "at {t} ns");
        }
    }

    #[test]
    fn paced_flows_are_not_lost_between_their_segments() {
        // 64 flows paced at line/64 on 1 Gbit/s: a 1514-byte frame each every 64 * 12.1 us.
        let gap = 64 * 12_112;
        let flows: Vec<(u64, u64, u64)> = (0..64).map(|i| (i * 12_112, 50_000 * US, gap)).collect();
        let n = simulate(&flows, 50_000 * US, 100 * US);
        for (t, k) in n.iter().filter(|(t, _)| *t > gap) {
            assert_eq!(*k, 64, "at {t} ns");
        }
    }

    #[test]
    fn a_flow_that_stops_drops_out_within_two_epochs() {
        // Two flows every 20 us; the second stops at 3 ms.
        let flows = [(0, 10_000 * US, 20 * US), (5 * US, 3_000 * US, 20 * US)];
        let n = simulate(&flows, 10_000 * US, 10 * US);
        let two_epochs = 2 * ticks_ns(w().len_ticks(2)) + 20 * US;
        for (t, k) in &n {
            if *t > 10 * US && *t < 3_000 * US {
                assert_eq!(*k, 2, "at {t} ns");
            }
            if *t > 3_000 * US + two_epochs {
                assert_eq!(*k, 1, "at {t} ns, {two_epochs} ns after the second flow stopped");
            }
        }
    }

    #[test]
    fn a_flow_is_counted_exactly_while_it_is_one_of_the_senders() {
        let w = w();
        let mut v = first_epoch(0, &w);
        let a = observe(&mut v, None, 0, &w);
        let len = v.len;
        assert!(counted(&v, a, 1));
        assert!(
            counted(&v, a, len + 1),
            "the finished epoch's flows, one epoch on"
        );
        assert!(!counted(&v, a, 2 * len + 1));
        let b = observe(&mut v, None, len + 2, &w);
        assert_eq!(b, a + 1);
        assert!(counted(&v, a, len + 3) && counted(&v, b, len + 3));
        assert_eq!(senders(&v, len + 3), 2);
        assert!(!counted(&v, a.wrapping_sub(1), len + 3), "an older epoch");
    }

    #[test]
    fn an_idle_address_forgets_its_senders() {
        let w = w();
        let mut v = first_epoch(0, &w);
        let s = observe(&mut v, None, 0, &w);
        let _ = observe(&mut v, None, 1, &w);
        assert_eq!(senders(&v, 1), 2);
        let len = v.len;
        assert_eq!(
            senders(&v, len + 1),
            2,
            "one epoch on, the finished epoch's flows count"
        );
        assert_eq!(senders(&v, 2 * len + 1), 0, "two epochs on, none");
        // The next segment after a long pause rolls past the stale epoch: the old flows are
        // not the previous epoch's.
        let s2 = observe(&mut v, Some(s), 10 * len, &w);
        assert_eq!(senders(&v, 10 * len), 1);
        assert_eq!(epoch_seq(v.word), s + 2);
        assert_eq!(s2, s + 2);
    }

    #[test]
    fn an_epoch_that_ended_without_packets_counts_its_flows_until_the_next_ends() {
        let w = w();
        let mut v = first_epoch(0, &w);
        let a = observe(&mut v, None, 0, &w);
        let len = v.len;
        // One flow keeps going just into the next epoch; the other does not.
        let _b = observe(&mut v, None, 5, &w);
        let a = observe(&mut v, Some(a), len + 5, &w);
        assert_eq!(senders(&v, len + 5), 2, "b is still in the previous epoch");
        let _ = observe(&mut v, Some(a), 2 * len + 10, &w);
        assert_eq!(senders(&v, 2 * len + 10), 1, "b dropped out after two epochs");
    }

    #[test]
    fn the_tick_clock_wraps() {
        let w = w();
        let start = u32::MAX - 10;
        let mut v = first_epoch(start, &w);
        let a = observe(&mut v, None, start, &w);
        let b = observe(&mut v, None, start.wrapping_add(5), &w);
        assert_eq!(senders(&v, start.wrapping_add(6)), 2);
        let t = start.wrapping_add(v.len + 3);
        let _ = observe(&mut v, Some(a), t, &w);
        let _ = observe(&mut v, Some(b), t, &w);
        assert_eq!(senders(&v, t), 2);
    }
}
