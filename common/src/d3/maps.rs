//! D3's map types (same rules as `crate::maps`: `#[repr(C)]`, no `bool`, explicit padding,
//! sizes asserted), re-exported by `crate::maps` beside the others. The map names are in
//! `crate::maps::names`; the mechanism is the rest of `crate::d3` and docs/d3.md.

use core::mem::size_of;

/// Sizes and deadlines an application attaches to its socket (value of [`crate::maps::names::D3_APP`],
/// keyed by the socket): the current transfer has `size` bytes and must finish by
/// `deadline_ns` (CLOCK_MONOTONIC). Writing a new `generation` starts a new transfer on the
/// same connection (a new response on a persistent connection).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct D3App {
    pub size: u64,
    pub deadline_ns: u64,
    pub generation: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<D3App>() == 24);

/// [`D3Sock::flags`]: this socket sends D3 requests (its class speaks D3).
pub const D3S_SENDER: u32 = 1 << 0;
/// A request is prepared in [`D3Sock::req`] and space was reserved for it.
pub const D3S_REQ_DUE: u32 = 1 << 1;
/// A feedback option is prepared in [`D3Sock::fb`] (this socket received a request).
pub const D3S_FB_PENDING: u32 = 1 << 2;
/// The current transfer finished (acked) or was given up; it was counted.
pub const D3S_DONE: u32 = 1 << 3;
/// The current transfer has a deadline (counted in `deadline_flows`).
pub const D3S_DEADLINE: u32 = 1 << 4;
/// The flow must return its allocation with its next request (FIN request).
pub const D3S_FIN_DUE: u32 = 1 << 5;
/// The current transfer missed its deadline (counted once).
pub const D3S_MISSED: u32 = 1 << 6;
/// The flow returned its allocation (FIN request) and asks nothing until the application
/// starts another transfer: a segment sent after it (the TCP FIN, a retransmission) would
/// otherwise register a new flow at every router, which the closing connection never returns.
pub const D3S_RETURNED: u32 = 1 << 7;

/// The kernel's per-socket D3 state (value of [`crate::maps::names::D3_SOCK`]).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct D3Sock {
    pub flow: crate::d3::D3FlowState,
    /// Bytes of the current transfer (0: no deadline).
    pub size: u64,
    /// Deadline of the current transfer, CLOCK_MONOTONIC ns (0: none).
    pub deadline_ns: u64,
    /// `bytes_acked` when the current transfer started.
    pub base_acked: u64,
    /// When the last request was written (ns).
    pub last_req_ns: u64,
    /// The pacing rate last applied to the socket (bytes/s, wire).
    pub applied_rate: u64,
    /// Generation of the [`D3App`] value the current transfer came from.
    pub app_generation: u32,
    /// `D3S_*` bits.
    pub flags: u32,
    /// Class index of the socket.
    pub class: u32,
    pub _pad: u32,
    /// The request written at the next WRITE_HDR_OPT callback.
    pub req: [u8; crate::d3::REQ_LEN],
    /// The feedback written at the next WRITE_HDR_OPT callback.
    pub fb: [u8; crate::d3::FB_LEN],
    /// The last request this socket echoed: its TSO/GSO copies are not echoed again.
    pub echoed: [u8; crate::d3::REQ_LEN],
    pub _pad2: [u8; 4],
}
const _: () = assert!(size_of::<D3Sock>() == 24 + 5 * 8 + 4 * 4 + 20 + 12 + 20 + 4);

/// Number of buckets of the D3 rate histograms: bucket `i` counts rates in
/// `[2^(i+13), 2^(i+14))` bytes/s (bucket 0 also takes smaller rates, the last larger ones):
/// 8 KB/s ... 128 MB/s (1 Gbit/s) and above.
pub const D3_HIST_BUCKETS: usize = 16;

/// The histogram bucket of a rate in bytes/s.
#[inline(always)]
pub const fn d3_hist_bucket(rate: u64) -> usize {
    let lz = rate.leading_zeros() as usize; // 64 for 0
    let log2 = if lz >= 64 { 0 } else { 63 - lz };
    if log2 <= 13 {
        0
    } else if log2 - 13 >= D3_HIST_BUCKETS {
        D3_HIST_BUCKETS - 1
    } else {
        log2 - 13
    }
}

/// Per-CPU D3 counters of one class (value of [`crate::maps::names::D3_STATS`]). On the user side (feature
/// `user`) also a D3 class's counters in `/status` (`counters.d3_classes`, summed over CPUs),
/// which leaves the histograms to the metrics.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize, serde::Deserialize))]
pub struct D3ClassStats {
    /// Transfers started (with or without a deadline).
    pub flows: u64,
    /// Transfers with a deadline.
    pub deadline_flows: u64,
    /// Deadline transfers acked in full before their deadline.
    #[cfg_attr(feature = "user", serde(rename = "deadlines_met"))]
    pub met: u64,
    /// Deadline transfers that passed their deadline before being acked in full.
    #[cfg_attr(feature = "user", serde(rename = "deadlines_missed"))]
    pub missed: u64,
    /// Flows that gave up their deadline (quenched: it could no longer be met).
    pub quenched: u64,
    /// Requests sent.
    pub requests: u64,
    /// Feedback options received and applied.
    pub grants: u64,
    /// Feedback options this host (as receiver) sent.
    pub echoes: u64,
    /// Feedback options received but not applied: stale (not for the outstanding request),
    /// or from a path without D3 routers.
    pub feedback_ignored: u64,
    /// D3 options seen in received segments (requests and feedback).
    pub options_seen: u64,
    /// Rates requested, by [`d3_hist_bucket`].
    #[cfg_attr(feature = "user", serde(skip))]
    pub requested: [u64; D3_HIST_BUCKETS],
    /// Rates granted, by [`d3_hist_bucket`].
    #[cfg_attr(feature = "user", serde(skip))]
    pub granted: [u64; D3_HIST_BUCKETS],
}
const _: () = assert!(size_of::<D3ClassStats>() == 10 * 8 + 2 * 8 * D3_HIST_BUCKETS);

impl Default for D3ClassStats {
    fn default() -> Self {
        D3ClassStats {
            flows: 0,
            deadline_flows: 0,
            met: 0,
            missed: 0,
            quenched: 0,
            requests: 0,
            grants: 0,
            echoes: 0,
            feedback_ignored: 0,
            options_seen: 0,
            requested: [0; D3_HIST_BUCKETS],
            granted: [0; D3_HIST_BUCKETS],
        }
    }
}

impl D3ClassStats {
    pub fn add(&mut self, o: &D3ClassStats) {
        self.flows += o.flows;
        self.deadline_flows += o.deadline_flows;
        self.met += o.met;
        self.missed += o.missed;
        self.quenched += o.quenched;
        self.requests += o.requests;
        self.grants += o.grants;
        self.echoes += o.echoes;
        self.feedback_ignored += o.feedback_ignored;
        self.options_seen += o.options_seen;
        for i in 0..D3_HIST_BUCKETS {
            self.requested[i] += o.requested[i];
            self.granted[i] += o.granted[i];
        }
    }
}

/// A router link's configuration and capacity (value of [`crate::maps::names::D3_LINK_CTL`]), written only
/// by the agent: at start, and C at every capacity-controller tick.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub struct D3LinkCtl {
    pub cfg: crate::d3::D3LinkConfig,
    /// C, bytes/s.
    pub capacity: u64,
}
const _: () = assert!(size_of::<D3LinkCtl>() == 56);

/// A router link's counters (value of [`crate::maps::names::D3_LINKS`]), written by the datapath with atomic
/// adds (several CPUs serve one link); the agent only reads them, and zeroes D, A, N at an idle
/// reset (when no request arrives, so nothing adds concurrently).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct D3LinkCounters {
    /// D, A, N as the paper's router keeps them (wrapping adds of signed deltas: read them
    /// through [`D3LinkCounters::clamped`]).
    pub demand: u64,
    pub allocated: u64,
    pub flows: u64,
    /// Requests processed (monotonic).
    pub requests: u64,
    /// Bytes the link sent (monotonic): the capacity controller's `u`.
    pub sent_bytes: u64,
    /// Requests with FIN, with NEW; requests clamped (absurd rates); not processed (full
    /// vector, invalid); grants raised to the base rate.
    pub fins: u64,
    pub news: u64,
    pub clamped: u64,
    pub unprocessed: u64,
    pub base_floor: u64,
    /// Copies of a request already processed (TSO/GSO copies the option into every segment):
    /// rewritten with the same grant, not counted again.
    pub duplicates: u64,
    /// Requests with a desired rate that got no share of spare capacity: the link had no more
    /// than the desired rate left (`OUT_LEFT`), so the grant is what was left.
    pub short: u64,
}
const _: () = assert!(size_of::<D3LinkCounters>() == 96);

/// What a router remembers of the last request of a flow (value of [`crate::maps::names::D3_SEEN`]): enough
/// to recognise the copies of one request that TSO/GSO puts in every segment.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct D3Seen {
    /// The request as it arrived, and as this router rewrote it.
    pub arrived: [u8; crate::d3::REQ_LEN],
    pub rewritten: [u8; crate::d3::REQ_LEN],
    /// When it was processed (CLOCK_MONOTONIC ns).
    pub at: u64,
    /// The link (egress interface) that processed it: the agent renews each link's leases
    /// from its flows' records.
    pub ifindex: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<D3Seen>() == 56);

/// Entries of the router's flow record ([`crate::maps::names::D3_SEEN`], an LRU map). A router whose live
/// D3 flows outnumber it forgets some, and the agent stops renewing leases from it.
pub const D3_SEEN_ENTRIES: u32 = 16_384;

impl D3LinkCounters {
    /// A counter that concurrent updates drove below zero reads as 0.
    #[inline(always)]
    pub const fn clamp(v: u64) -> u64 {
        if v > (1 << 62) { 0 } else { v }
    }
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: all of these are `#[repr(C)]`, `Copy`, made only of integers and arrays of
    // integers, with explicit padding fields, so every bit pattern is valid.
    unsafe impl aya::Pod for D3App {}
    unsafe impl aya::Pod for D3Sock {}
    unsafe impl aya::Pod for D3ClassStats {}
    unsafe impl aya::Pod for D3LinkCtl {}
    unsafe impl aya::Pod for D3LinkCounters {}
    unsafe impl aya::Pod for D3Seen {}
}
