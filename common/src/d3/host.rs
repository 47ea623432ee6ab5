//! The sender's side: what a flow asks for ([`demand`], with quenching) and its per-flow state
//! ([`D3FlowState`]: one request outstanding, feedback turned into a pacing rate).

use super::units::{
    MAX_ENCODABLE_RATE, MAX_SCALE, bytes_per_second, choose_scale, desired_rate, rate_to_units_ceil,
    units_to_rate,
};
use super::wire::{D3Feedback, D3Request, FLAG_FIN, FLAG_NEW, FLAG_QUENCHED, HOPS};

/// Why a flow stopped asking for its deadline rate.
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub enum QuenchReason {
    /// The deadline has passed with bytes left.
    Expired,
    /// The rate needed exceeds the cap (the sender's line rate or the encodable maximum).
    AboveCap,
}

/// What a flow asks the network for in its next request.
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub enum Demand {
    /// No deadline, or nothing left to send: desire 0 and take the fair share.
    NoDeadline,
    /// A deadline flow needing this many bytes/s.
    Rate(u64),
    /// The deadline can no longer be met: stop asking (become a non-deadline flow).
    Quench(QuenchReason),
}

/// The paper's host rule plus quenching: `r = bytes_left / time_left`; a flow quenches when
/// `time_left_ns <= 0` with bytes left, or when `r` exceeds `cap` (`cap == 0` or above
/// [`MAX_ENCODABLE_RATE`] means [`MAX_ENCODABLE_RATE`]).
#[inline]
pub fn demand(has_deadline: bool, bytes_left: u64, time_left_ns: i64, cap: u64) -> Demand {
    if !has_deadline || bytes_left == 0 {
        return Demand::NoDeadline;
    }
    if time_left_ns <= 0 {
        return Demand::Quench(QuenchReason::Expired);
    }
    let cap = if cap == 0 || cap > MAX_ENCODABLE_RATE {
        MAX_ENCODABLE_RATE
    } else {
        cap
    };
    let r = desired_rate(bytes_left, time_left_ns as u64);
    if r > cap {
        Demand::Quench(QuenchReason::AboveCap)
    } else {
        Demand::Rate(r)
    }
}

/// The shortest RTT [`pause_rate`] divides by (and the least interval between a sender's
/// requests): 100 us.
pub const MIN_REQUEST_RTT_NS: u64 = 100_000;

/// What a sender granted 0 paces at: the paper's paused sender sends only its next request,
/// one per RTT. Here requests ride on data segments (a TCP option), so a paused flow sends one
/// segment (`segment_bytes` on the wire) per RTT (`srtt_ns`, at least
/// [`MIN_REQUEST_RTT_NS`]), and never more than the `first_rtt_rate` a flow starts with
/// (unless that is 0, "wait for the grant", which would stop the requests too). A small
/// `first_rtt_rate` makes paused flows ask less often: once per `segment_bytes /
/// first_rtt_rate`.
#[inline]
pub fn pause_rate(first_rtt_rate: u64, segment_bytes: u64, srtt_ns: u64) -> u64 {
    let rtt = if srtt_ns < MIN_REQUEST_RTT_NS {
        MIN_REQUEST_RTT_NS
    } else {
        srtt_ns
    };
    let per_rtt = bytes_per_second(segment_bytes, rtt);
    if per_rtt < first_rtt_rate || first_rtt_rate == 0 {
        per_rtt
    } else {
        first_rtt_rate
    }
}

/// The rate a sender paces at after feedback granting `grant` bytes/s: the grant, and at
/// least [`pause_rate`] (`pause`), so that a flow granted 0 or less than one segment per RTT
/// still asks again every RTT. The router accounts only the grant: each paused or
/// nearly-paused flow may send up to `pause` more (docs/d3.md, deviation 8).
#[inline]
pub fn paced_rate(grant: u64, pause: u64) -> u64 {
    if grant < pause { pause } else { grant }
}

/// [`D3FlowState::state`]: the first request has been sent.
pub const FLOW_STARTED: u8 = 0x01;
/// A request is outstanding (its feedback has not arrived).
pub const FLOW_AWAITING: u8 = 0x02;
/// The flow quenched; it asks as a non-deadline flow with `FLAG_QUENCHED` from now on.
pub const FLOW_QUENCHED: u8 = 0x04;
/// The FIN request has been sent; no more requests.
pub const FLOW_FIN_SENT: u8 = 0x08;
/// The last feedback had no filled slot: no D3 router on the path, D3 does not pace it.
pub const FLOW_UNMANAGED: u8 = 0x10;

/// [`HostRequest::outcome`]: this is the flow's first request (`FLAG_NEW`).
pub const HOST_NEW: u32 = 1 << 0;
/// The flow quenched with this request (reported once per flow).
pub const HOST_QUENCHED_NOW: u32 = 1 << 1;
/// The previous request's feedback never came: its allocations cannot be returned exactly
/// (routers recover through the capacity controller).
pub const HOST_FEEDBACK_LOST: u32 = 1 << 2;
/// This is the FIN request.
pub const HOST_FIN: u32 = 1 << 3;

/// Per-flow sender state (a socket-storage map value): what the next request must carry.
/// One request is outstanding at a time: the next one is built after the feedback of the
/// previous one arrived (about one RTT), so `prev_*` always match what routers recorded.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub struct D3FlowState {
    /// Pacing rate, bytes/s: the path's smallest allocation from the last feedback (0 means
    /// paused: only the next header-only request), or the host's first-RTT rate before any.
    pub pace_rate: u64,
    /// Allocations of the last answered request (returned in the next request).
    pub prev_alloc: [u8; HOPS],
    /// Desired rate (units) of the last answered request.
    pub prev_desired: u8,
    /// Scale of the last answered request.
    pub prev_scale: u8,
    /// Desired rate (units) of the outstanding request.
    pub pending_desired: u8,
    /// Scale of the outstanding request.
    pub pending_scale: u8,
    /// `FLOW_*` bits.
    pub state: u8,
    /// Explicit padding, zero.
    pub _pad: [u8; 5],
}
const _: () = assert!(core::mem::size_of::<D3FlowState>() == 24);

/// Inputs for a flow's next request.
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub struct HostInput {
    /// The flow has a deadline.
    pub has_deadline: bool,
    /// Bytes still to send.
    pub bytes_left: u64,
    /// Nanoseconds until the deadline, measured from when the granted rate takes effect
    /// (about one RTT from now); negative once passed.
    pub time_left_ns: i64,
    /// Sender's line rate (or per-flow cap), bytes/s: quench threshold and scale ceiling.
    pub line_rate: u64,
    /// This is the flow's last request: return everything.
    pub fin: bool,
}

/// A request to send, with what happened (`HOST_*` bits) and the desired rate in bytes/s as
/// encoded (rounded up to the unit).
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub struct HostRequest {
    /// The request.
    pub req: D3Request,
    /// `HOST_*` bits.
    pub outcome: u32,
    /// `desired` in bytes/s.
    pub desired_rate: u64,
}

impl D3FlowState {
    /// A flow that has not sent a request yet; `first_rtt_rate` is the pacing rate until the
    /// first feedback (burst tolerance: a small base rate, or 0 for "wait for the grant").
    #[inline]
    pub const fn new(first_rtt_rate: u64) -> Self {
        Self {
            pace_rate: first_rtt_rate,
            prev_alloc: [0; HOPS],
            prev_desired: 0,
            prev_scale: 0,
            pending_desired: 0,
            pending_scale: 0,
            state: 0,
            _pad: [0; 5],
        }
    }

    /// True while a request is outstanding.
    #[inline]
    pub const fn awaiting_feedback(&self) -> bool {
        self.state & FLOW_AWAITING != 0
    }

    /// Builds the next request. Call once per RTT, after the previous feedback arrived; if it
    /// did not arrive, calling again returns the previous desired rate with zero allocations
    /// (`HOST_FEEDBACK_LOST`). `None` after the FIN request.
    #[inline]
    pub fn next_request(&mut self, inp: &HostInput) -> Option<HostRequest> {
        if self.state & FLOW_FIN_SENT != 0 {
            return None;
        }
        let mut out = 0u32;
        let mut req = D3Request::EMPTY;
        if self.state & FLOW_STARTED == 0 {
            req.flags |= FLAG_NEW;
            out |= HOST_NEW;
        } else if self.state & FLOW_AWAITING != 0 {
            req.prev_desired = self.pending_desired;
            req.prev_scale = self.pending_scale;
            out |= HOST_FEEDBACK_LOST;
        } else {
            req.prev_desired = self.prev_desired;
            req.prev_scale = self.prev_scale;
            req.prev_alloc = self.prev_alloc;
        }
        if inp.fin {
            req.flags |= FLAG_FIN;
            req.scale = req.prev_scale;
            if self.state & FLOW_QUENCHED != 0 {
                req.flags |= FLAG_QUENCHED;
            }
            self.state = (self.state | FLOW_STARTED | FLOW_FIN_SENT) & !FLOW_AWAITING;
            return Some(HostRequest {
                req,
                outcome: out | HOST_FIN,
                desired_rate: 0,
            });
        }
        let mut rate = 0u64;
        if self.state & FLOW_QUENCHED == 0 {
            match demand(inp.has_deadline, inp.bytes_left, inp.time_left_ns, inp.line_rate) {
                Demand::NoDeadline => {}
                Demand::Rate(r) => rate = r,
                Demand::Quench(_) => {
                    self.state |= FLOW_QUENCHED;
                    out |= HOST_QUENCHED_NOW;
                }
            }
        }
        let mut scale_units = (0u8, 0u8);
        if rate > 0 {
            match choose_scale(rate, inp.line_rate) {
                Some(s) => {
                    let u = rate_to_units_ceil(rate, s);
                    scale_units = (s, if u > 255 { 255 } else { u as u8 });
                }
                None => {
                    // Not representable (demand() already caps at MAX_ENCODABLE_RATE).
                    self.state |= FLOW_QUENCHED;
                    out |= HOST_QUENCHED_NOW;
                }
            }
        }
        if scale_units.1 == 0 {
            scale_units = (choose_scale(0, inp.line_rate).unwrap_or(MAX_SCALE), 0);
        }
        if self.state & FLOW_QUENCHED != 0 {
            req.flags |= FLAG_QUENCHED;
        }
        // A paused flow (granted 0) asks with the same bytes every RTT, and receivers echo a
        // request once (its TSO/GSO copies carry the same bytes): it would never hear again
        // that capacity freed up. Its request that repeats the last one's scale and desired
        // units is encoded one scale up (down at the largest), so that consecutive requests
        // differ. Only a paused flow's: a flow with a rate that repeats itself keeps it, and
        // the late echo of its last request stays usable (same scale) after a retry; measured
        // on the end-to-end test under emulation, alternating every flow's scale left more
        // feedback stale and two deadline flows in four missed.
        if self.state & FLOW_STARTED != 0
            && self.pace_rate == 0
            && scale_units.0 == req.prev_scale
            && scale_units.1 == req.prev_desired
        {
            let (s, u) = scale_units;
            let alt = if s < MAX_SCALE { s + 1 } else { s - 1 };
            let au = if u == 0 {
                0
            } else {
                let v = rate_to_units_ceil(rate, alt);
                if v > 255 { 255 } else { v as u8 }
            };
            scale_units = (alt, au);
        }
        let (scale, units) = scale_units;
        req.scale = scale;
        req.desired = units;
        self.pending_desired = units;
        self.pending_scale = scale;
        self.state |= FLOW_STARTED | FLOW_AWAITING;
        Some(HostRequest {
            req,
            outcome: out,
            desired_rate: units_to_rate(units, scale),
        })
    }

    /// Takes the feedback for the outstanding request: remembers the allocations (returned by
    /// the next request) and sets `pace_rate` to the path's smallest allocation. Returns that
    /// rate; `None` if nothing was outstanding, the scale does not match the outstanding
    /// request (stale), or no D3 router is on the path (then `FLOW_UNMANAGED` is set).
    #[inline]
    pub fn apply_feedback(&mut self, fb: &D3Feedback) -> Option<u64> {
        if self.state & FLOW_AWAITING == 0 || fb.scale != self.pending_scale {
            return None;
        }
        self.state &= !FLOW_AWAITING;
        self.prev_desired = self.pending_desired;
        self.prev_scale = self.pending_scale;
        let hops = if fb.hops as usize > HOPS {
            HOPS
        } else {
            fb.hops as usize
        };
        let mut i = 0;
        while i < HOPS {
            let v = if i < hops {
                fb.alloc.get(i).copied().unwrap_or(0)
            } else {
                0
            };
            if let Some(dst) = self.prev_alloc.get_mut(i) {
                *dst = v;
            }
            i += 1;
        }
        match fb.min_rate() {
            Some(r) => {
                self.pace_rate = r;
                self.state &= !FLOW_UNMANAGED;
                Some(r)
            }
            None => {
                self.state |= FLOW_UNMANAGED;
                None
            }
        }
    }
}

#[cfg(feature = "user")]
// SAFETY: `#[repr(C)]`, integer fields only, no implicit padding (size asserted above).
unsafe impl aya::Pod for D3FlowState {}

#[cfg(test)]
#[allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests panic with a message"
)]
mod tests {
    use crate::d3::testutil::*;
    use crate::d3::*;

    #[test]
    fn a_zero_grant_pauses_to_one_segment_per_rtt_at_most_the_first_rtt_rate() {
        // 1514-byte segments every 1 ms: 1.514 MB/s, below a 12.5 MB/s first-RTT rate.
        let pause = pause_rate(12_500_000, 1514, 1_000_000);
        assert_eq!(pause, 1_514_000);
        assert_eq!(paced_rate(0, pause), pause, "granted 0: one segment per RTT");
        assert_eq!(paced_rate(1_000, pause), pause, "less than a segment per RTT");
        assert_eq!(
            paced_rate(5_000_000, pause),
            5_000_000,
            "a grant above it as granted"
        );
        // Short RTTs: one segment per RTT would exceed the first-RTT rate, which caps it.
        assert_eq!(pause_rate(1_250_000, 1514, 50_000), 1_250_000);
        // The RTT is taken as at least 100 us (before the first sample, srtt is 0).
        assert_eq!(pause_rate(u64::MAX, 1514, 0), 15_140_000);
        assert_eq!(pause_rate(u64::MAX, 1514, 10_000), 15_140_000);
        // No first-RTT rate (0: "wait for the grant") does not stop the requests.
        assert_eq!(pause_rate(0, 1514, 1_000_000), 1_514_000);
    }

    #[test]
    fn a_paused_flows_consecutive_requests_differ_and_a_flow_with_a_rate_keeps_its_scale() {
        // A flow without a deadline granted 0 every RTT: each request differs from the one
        // before, so a receiver that echoes a request once echoes every one.
        let nd = HostInput {
            has_deadline: false,
            ..input(0, 0)
        };
        let mut f = D3FlowState::new(1_000_000);
        let mut last = f.next_request(&nd).unwrap().req;
        for i in 0..6 {
            let fb = D3Feedback {
                hops: 1,
                scale: last.scale,
                alloc: [0; HOPS],
            };
            assert_eq!(f.apply_feedback(&fb), Some(0), "granted 0");
            let r = f.next_request(&nd).unwrap().req;
            assert_ne!(r.encode(), last.encode(), "request {i} repeats the last");
            assert_eq!(r.desired, 0);
            last = r;
        }
        // Granted a rate again: back to its own scale, and a steady demand keeps it.
        let fb = D3Feedback {
            hops: 1,
            scale: last.scale,
            alloc: [5, 0, 0, 0, 0, 0],
        };
        assert!(f.apply_feedback(&fb).unwrap() > 0);
        let a = f.next_request(&nd).unwrap().req;
        let fb = D3Feedback {
            hops: 1,
            scale: a.scale,
            alloc: [5, 0, 0, 0, 0, 0],
        };
        f.apply_feedback(&fb);
        let b = f.next_request(&nd).unwrap().req;
        assert_eq!(a.scale, b.scale, "a flow with a rate keeps its scale");
    }

    #[test]
    fn quench_decisions() {
        assert_eq!(demand(false, 1_000_000, 1_000, GBPS), Demand::NoDeadline);
        assert_eq!(demand(true, 0, 1_000, GBPS), Demand::NoDeadline);
        assert_eq!(demand(true, 1, 0, GBPS), Demand::Quench(QuenchReason::Expired));
        assert_eq!(demand(true, 1, -5, GBPS), Demand::Quench(QuenchReason::Expired));
        // 1 MB in 1 ms = 1 GB/s, above a 1 Gbit/s line.
        assert_eq!(
            demand(true, 1_000_000, 1_000_000, GBPS),
            Demand::Quench(QuenchReason::AboveCap)
        );
        // 100 KB in 1 ms = 100 MB/s fits.
        assert_eq!(demand(true, 100_000, 1_000_000, GBPS), Demand::Rate(100_000_000));
        // Exactly the line rate is still feasible.
        assert_eq!(demand(true, 125_000, 1_000_000, GBPS), Demand::Rate(GBPS));
        // No cap given: the encodable maximum.
        assert_eq!(
            demand(true, 20_000_000, 1_000_000, 0),
            Demand::Quench(QuenchReason::AboveCap)
        );
    }

    #[test]
    fn host_flow_life_cycle() {
        // Before any feedback the flow paces at its first-RTT (base) rate.
        let mut f = D3FlowState::new(12_345);
        assert_eq!(f.pace_rate, 12_345);
        assert!(!f.awaiting_feedback());
        let r1 = f.next_request(&input(50_000, 20_000_000)).expect("first");
        assert_eq!(r1.outcome, HOST_NEW);
        assert_eq!(r1.req, request(FLAG_NEW, 5, 39));
        assert_eq!(r1.desired_rate, 39 * 65_536);
        assert!(f.awaiting_feedback());

        // Two hops granted 60 and 45 units: pace at the smaller.
        let fb = D3Feedback {
            hops: 2,
            scale: 5,
            alloc: [60, 45, 0, 0, 0, 0],
        };
        assert_eq!(f.apply_feedback(&fb), Some(45 * 65_536));
        assert_eq!(f.pace_rate, 45 * 65_536);
        assert!(!f.awaiting_feedback());
        // A duplicate feedback is ignored.
        assert_eq!(f.apply_feedback(&fb), None);

        let r2 = f.next_request(&input(30_000, 10_000_000)).expect("second");
        assert_eq!(r2.outcome, 0);
        assert_eq!(r2.req.prev_desired, 39);
        assert_eq!(r2.req.prev_scale, 5);
        assert_eq!(r2.req.prev_alloc, [60, 45, 0, 0, 0, 0]);
        assert_eq!(r2.req.flags, 0);
        // 3 MB/s -> scale 5 (65_536 B/s), 46 units.
        assert_eq!((r2.req.scale, r2.req.desired), (5, 46));

        // Feedback for r2 lost: the next request returns r2's demand but no allocations.
        let r3 = f.next_request(&input(30_000, 9_000_000)).expect("third");
        assert_eq!(r3.outcome, HOST_FEEDBACK_LOST);
        assert_eq!((r3.req.prev_desired, r3.req.prev_scale), (46, 5));
        assert_eq!(r3.req.prev_alloc, [0; HOPS]);
        // 30 KB in 9 ms = 3.33 MB/s -> scale 5, 51 units. Feedback at another scale is stale.
        assert_eq!((r3.req.scale, r3.req.desired), (5, 51));
        let stale = D3Feedback {
            hops: 1,
            scale: 2,
            alloc: [9, 0, 0, 0, 0, 0],
        };
        assert_eq!(f.apply_feedback(&stale), None);
        assert!(f.awaiting_feedback());
        // No D3 router on the path: not managed, pace unchanged.
        let empty = D3Feedback {
            hops: 0,
            scale: r3.req.scale,
            alloc: [0; HOPS],
        };
        assert_eq!(f.apply_feedback(&empty), None);
        assert_ne!(f.state & FLOW_UNMANAGED, 0);
        assert_eq!(f.pace_rate, 45 * 65_536);

        // FIN returns the last answered request's desired rate and allocations.
        let fin = f
            .next_request(&HostInput {
                fin: true,
                ..input(0, 1)
            })
            .expect("fin");
        assert_eq!(fin.outcome, HOST_FIN);
        assert_eq!(fin.req.flags, FLAG_FIN);
        assert_eq!(fin.req.prev_desired, r3.req.desired);
        assert_eq!(fin.req.desired, 0);
        assert!(f.next_request(&input(0, 1)).is_none());
    }

    #[test]
    fn host_quenches_once_and_becomes_non_deadline() {
        let mut f = D3FlowState::new(0);
        let r1 = f.next_request(&input(10_000, 10_000_000)).expect("first");
        assert_eq!(r1.req.desired, rate_to_units_ceil(1_000_000, r1.req.scale) as u8);
        f.apply_feedback(&D3Feedback {
            hops: 1,
            scale: r1.req.scale,
            alloc: [1, 0, 0, 0, 0, 0],
        });
        // Deadline passed with bytes left: quench.
        let r2 = f.next_request(&input(9_000, -1)).expect("second");
        assert_eq!(r2.outcome, HOST_QUENCHED_NOW);
        assert_eq!(r2.req.flags, FLAG_QUENCHED);
        assert_eq!(r2.req.desired, 0);
        assert_eq!(r2.req.scale, 8, "non-deadline scale for a 1G sender");
        assert_eq!(r2.req.prev_desired, r1.req.desired, "returns the old demand");
        f.apply_feedback(&D3Feedback {
            hops: 1,
            scale: 8,
            alloc: [10, 0, 0, 0, 0, 0],
        });
        // Later requests stay quenched, reported once.
        let r3 = f.next_request(&input(8_000, 50_000_000)).expect("third");
        assert_eq!(r3.outcome, 0);
        assert_eq!(r3.req.flags, FLAG_QUENCHED);
        assert_eq!(r3.req.desired, 0);
        // Above the line rate from the start.
        let mut g = D3FlowState::new(0);
        let q = g.next_request(&input(10_000_000, 1_000_000)).expect("first");
        assert_eq!(q.outcome, HOST_NEW | HOST_QUENCHED_NOW);
        assert_eq!(q.req.flags, FLAG_NEW | FLAG_QUENCHED);
        assert_eq!(q.req.desired, 0);
    }
}
