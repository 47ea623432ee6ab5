//! # D3: deadline-driven rate allocation (Wilson et al., SIGCOMM 2011) and its wire format
//!
//! Pure, allocation-free, float-free integer math, called from both the eBPF programs and the
//! agent. `docs/d3.md` has the byte diagrams, the units, the exact router math and the
//! deviations from the paper; every number there comes from the constants below.
//!
//! - **Wire format.** A 20-byte *request* option on data segments ([`D3Request`]) and a 12-byte
//!   *feedback* option on ACKs ([`D3Feedback`]), both TCP option kind 253 with the 16-bit
//!   ExID [`D3_EXID`] (RFC 6994), so stacks and routers that do not speak D3 skip them.
//!   Encode/decode over `[u8; N]`, fixed-offset accessors (`req_*`) for in-place rewriting,
//!   an option-list scanner ([`find_d3_option`]) and the incremental checksum update
//!   ([`csum_replace`]).
//! - **Rates** are 1-byte unit counts; the unit is `2^(UNIT_SHIFT + scale)` bytes/s with a
//!   4-bit per-request scale chosen by the sender ([`choose_scale`]).
//! - **Host side.** [`desired_rate`], [`demand`] (including quenching), [`D3FlowState`]
//!   (one request outstanding per flow; it turns feedback into a pacing rate).
//! - **Router side.** [`D3LinkState`] aggregate counters, [`process_request`] (Snippet 1 of the
//!   paper plus burst tolerance, hop chaining and request caps), [`router_rewrite`] (the same,
//!   in place on the option bytes) and the soft-state capacity controller [`capacity_tick`].
//!
//! Rules for the bpf target, kept throughout (outside the tests): no floats, no `u128`, no
//! allocation, no recursion, loops bounded by constants, no runtime-indexed `[]` and no
//! `enumerate()` (index loops with `.get()`: core's iterator counter keeps an overflow-panic
//! path when built with overflow checks), no `/` or `%` by runtime values (only `checked_*`),
//! saturating or wrapping arithmetic on anything that comes from a packet or a counter, no
//! `saturating_mul` / `checked_mul` on `u64` (LLVM lowers them to a 128-bit libcall the bpf
//! target lacks), no `core::fmt` on bpf (`Debug` is derived only off bpf).

// ------------------------------------------------------------------------------------------
// Wire constants
// ------------------------------------------------------------------------------------------

/// TCP option kind shared by experiments (RFC 4727), disambiguated by an ExID (RFC 6994).
pub const TCPOPT_EXP: u8 = 253;
/// D3's 16-bit experiment identifier, sent big-endian right after kind and length.
/// Not IANA-registered (check the TCP ExID registry before use outside a lab).
pub const D3_EXID: u16 = 0xD303;
/// The ExID's bytes as they appear on the wire (the search key of `bpf_load_hdr_opt`).
pub const EXID_HI: u8 = (D3_EXID >> 8) as u8;
pub const EXID_LO: u8 = (D3_EXID & 0xff) as u8;

/// Allocation-vector slots: the largest number of D3 routers on a path (paper: 6).
pub const HOPS: usize = 6;
/// Length of the request option (kind, length, ExID included).
pub const REQ_LEN: usize = 20;
/// Length of the feedback option (kind, length, ExID included).
pub const FB_LEN: usize = 12;
/// Largest TCP option area: a 60-byte header minus the fixed 20.
pub const TCP_OPTS_MAX: usize = 40;
/// Offset of the option area from the start of the TCP header.
pub const TCP_OPTS_OFFSET: usize = 20;

// Request option layout (offsets from the option's kind byte).
/// Kind byte (253).
pub const OFF_KIND: usize = 0;
/// Length byte (20 or 12).
pub const OFF_LEN: usize = 1;
/// ExID, 2 bytes big-endian.
pub const OFF_EXID: usize = 2;
/// Flags in bits 7..3, hop index in bits 2..0. **Rewritten by routers** (hop += 1).
pub const OFF_FLAGS_HOP: usize = 4;
/// Scale of `desired` and `alloc` in bits 7..4, scale of `prev_desired` and `prev_alloc`
/// in bits 3..0.
pub const OFF_SCALES: usize = 5;
/// Desired rate for the next RTT, units of the current scale.
pub const OFF_DESIRED: usize = 6;
/// Desired rate sent in the previous request, units of the previous scale.
pub const OFF_PREV_DESIRED: usize = 7;
/// Allocation vector, one byte per hop. **Slot `hop` is rewritten by the router at `hop`.**
pub const OFF_ALLOC: usize = 8;
/// Allocations the routers granted to the previous request (echoed by the receiver).
pub const OFF_PREV_ALLOC: usize = 14;

// Feedback option layout.
/// `FLAG_ECHO` plus the number of slots the routers filled, in bits 2..0.
pub const FB_OFF_FLAGS_HOPS: usize = 4;
/// Scale of the echoed allocations in bits 7..4 (bits 3..0 sent as zero, ignored).
pub const FB_OFF_SCALE: usize = 5;
/// The echoed allocation vector.
pub const FB_OFF_ALLOC: usize = 6;

/// First request of a flow: the router counts the flow (N += 1) and applies burst tolerance.
pub const FLAG_NEW: u8 = 0x80;
/// Last request of a flow: the router takes back its allocation and demand (N -= 1).
pub const FLAG_FIN: u8 = 0x40;
/// The flow gave up its deadline (quenched) and now asks as a non-deadline flow.
pub const FLAG_QUENCHED: u8 = 0x20;
/// Set on the feedback option only; a request with it set is invalid.
pub const FLAG_ECHO: u8 = 0x10;
/// Reserved, sent as zero; an option with it set is left untouched (future versions).
pub const FLAG_RESERVED: u8 = 0x08;
/// Hop index (request) or filled-slot count (feedback).
pub const HOP_MASK: u8 = 0x07;
const REQ_FLAGS_MASK: u8 = FLAG_NEW | FLAG_FIN | FLAG_QUENCHED;

// Option space (checked at compile time). A Linux SYN uses 20 of the 40 bytes (MSS 4,
// SACK-permitted + timestamps 12, NOP + window scale 4): the request fits exactly.
const _: () = assert!(20 + REQ_LEN <= TCP_OPTS_MAX);
// Data segments: NOP NOP timestamps (12) + request.
const _: () = assert!(12 + REQ_LEN <= TCP_OPTS_MAX);
// ACKs: timestamps + feedback still leave room for one SACK block (NOP NOP kind len 8).
const _: () = assert!(12 + FB_LEN + 2 + 2 + 8 <= TCP_OPTS_MAX);
// Multiples of 4: an option written at a 4-byte boundary keeps the next one aligned.
const _: () = assert!(REQ_LEN.is_multiple_of(4) && FB_LEN.is_multiple_of(4));
// The wire layout adds up.
const _: () = assert!(OFF_PREV_ALLOC + HOPS == REQ_LEN && FB_OFF_ALLOC + HOPS == FB_LEN);

// ------------------------------------------------------------------------------------------
// Units
// ------------------------------------------------------------------------------------------

/// One unit at scale 0 is `2^UNIT_SHIFT` = 2048 bytes/s.
pub const UNIT_SHIFT: u32 = 11;
/// Scales are 4 bits.
pub const MAX_SCALE: u8 = 15;
/// A deadline flow's scale is the smallest at which its desired rate needs at most this many
/// units: rounding up costs less than 1/31.5 of the rate, and the largest grant (255 units)
/// is at least 4x the desired rate (up to 63 units at scale 15, about 4.2 GB/s).
pub const DESIRED_TARGET_UNITS: u64 = 63;
/// Largest encodable rate: 255 units at scale 15 = 17_112_760_320 bytes/s (~137 Gbit/s).
pub const MAX_ENCODABLE_RATE: u64 = 255 << (UNIT_SHIFT + MAX_SCALE as u32);
// Headroom above a 100 Gbit/s link (12.5e9 bytes/s).
const _: () = assert!(MAX_ENCODABLE_RATE > 12_500_000_000);

const NS_PER_S: u64 = 1_000_000_000;

/// Bytes/s of one unit at `scale` (only the low 4 bits of `scale` count).
#[inline]
pub const fn unit_rate(scale: u8) -> u64 {
    1u64.wrapping_shl(UNIT_SHIFT + (scale & MAX_SCALE) as u32)
}

/// Bytes/s of `units` at `scale`.
#[inline]
pub const fn units_to_rate(units: u8, scale: u8) -> u64 {
    (units as u64).wrapping_shl(UNIT_SHIFT + (scale & MAX_SCALE) as u32)
}

/// Units at `scale`, rounded down, saturating at 255 (what routers write).
#[inline]
pub const fn rate_to_units_floor(rate: u64, scale: u8) -> u8 {
    let v = rate.wrapping_shr(UNIT_SHIFT + (scale & MAX_SCALE) as u32);
    if v > 255 { 255 } else { v as u8 }
}

/// Units at `scale`, rounded up, not saturated (what senders ask for; may exceed 255).
#[inline]
pub const fn rate_to_units_ceil(rate: u64, scale: u8) -> u64 {
    let shift = UNIT_SHIFT + (scale & MAX_SCALE) as u32;
    let q = rate.wrapping_shr(shift);
    let mask = 1u64.wrapping_shl(shift).wrapping_sub(1);
    if rate & mask != 0 { q.saturating_add(1) } else { q }
}

/// The sender's scale for a request.
///
/// - Deadline flow (`desired > 0`): the smallest scale at which `desired` fits in
///   [`DESIRED_TARGET_UNITS`] units (rounded up), else scale 15; `None` if `desired` exceeds
///   [`MAX_ENCODABLE_RATE`] (the caller quenches).
/// - Non-deadline flow (`desired == 0`): the smallest scale at which 255 units reach
///   `ceiling` (the sender's line rate), so any fair share up to line rate is representable;
///   scale 15 if none does.
#[inline]
pub fn choose_scale(desired: u64, ceiling: u64) -> Option<u8> {
    if desired > MAX_ENCODABLE_RATE {
        return None;
    }
    let mut s = 0u8;
    while s < MAX_SCALE {
        let fits = if desired > 0 {
            rate_to_units_ceil(desired, s) <= DESIRED_TARGET_UNITS
        } else {
            units_to_rate(255, s) >= ceiling
        };
        if fits {
            return Some(s);
        }
        s += 1;
    }
    Some(MAX_SCALE)
}

/// `bytes * 1e9 / ns` without `u128`, rounded up or down; `u64::MAX` for `ns == 0` and
/// `bytes > 0`. For `ns > 2^33` (8.6 s) both are halved until it fits, rounding the result
/// in the requested direction.
#[inline]
fn per_second(bytes: u64, ns: u64, round_up: bool) -> u64 {
    const NS_LIMIT: u64 = 1 << 33;
    let mut b = bytes;
    let mut t = ns;
    let mut i = 0;
    while i < 31 && t > NS_LIMIT {
        t >>= 1;
        b = if round_up { (b >> 1) + (b & 1) } else { b >> 1 };
        i += 1;
    }
    let Some(q) = b.checked_div(t) else {
        return if b == 0 { 0 } else { u64::MAX };
    };
    let r = b.checked_rem(t).unwrap_or(0);
    // r < t <= 2^33, so r * 1e9 < 2^63 cannot wrap. (No `saturating_mul`/`checked_mul`:
    // LLVM lowers u64 overflow-checked multiplication to a 128-bit libcall on bpf.)
    let num = r.wrapping_mul(NS_PER_S);
    let mut frac = num.checked_div(t).unwrap_or(0);
    if round_up && num.checked_rem(t).unwrap_or(0) != 0 {
        frac = frac.saturating_add(1);
    }
    let whole = if q > u64::MAX / NS_PER_S {
        u64::MAX
    } else {
        q.wrapping_mul(NS_PER_S)
    };
    whole.saturating_add(frac)
}

/// Rate needed to send `bytes_left` in `time_left_ns`, bytes/s, rounded up (the paper's
/// `r = s / d`); `u64::MAX` when `time_left_ns == 0` and bytes are left.
#[inline]
pub fn desired_rate(bytes_left: u64, time_left_ns: u64) -> u64 {
    per_second(bytes_left, time_left_ns, true)
}

/// Average rate of `bytes` over `ns`, bytes/s, rounded down (utilisation, queue drain rate).
#[inline]
pub fn bytes_per_second(bytes: u64, ns: u64) -> u64 {
    per_second(bytes, ns, false)
}

// ------------------------------------------------------------------------------------------
// Host side: demand and quenching
// ------------------------------------------------------------------------------------------

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

// ------------------------------------------------------------------------------------------
// Wire format: request and feedback
// ------------------------------------------------------------------------------------------

/// Why bytes are not a valid D3 option.
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub enum WireError {
    /// Kind is not 253.
    Kind,
    /// Length byte does not match the option type.
    Length,
    /// ExID is not [`D3_EXID`].
    ExId,
    /// A request with `FLAG_ECHO`, or a feedback option without it (or with request flags).
    Type,
    /// `FLAG_RESERVED` set.
    Reserved,
    /// Hop index or slot count above [`HOPS`].
    Hop,
}

#[inline]
const fn check_header(kind: u8, len: u8, hi: u8, lo: u8, want_len: usize) -> Result<(), WireError> {
    if kind != TCPOPT_EXP {
        return Err(WireError::Kind);
    }
    if len as usize != want_len {
        return Err(WireError::Length);
    }
    if hi != EXID_HI || lo != EXID_LO {
        return Err(WireError::ExId);
    }
    Ok(())
}

/// A rate request (20 bytes on the wire), decoded.
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub struct D3Request {
    /// Any of [`FLAG_NEW`], [`FLAG_FIN`], [`FLAG_QUENCHED`].
    pub flags: u8,
    /// Index of the next slot to fill; each D3 router writes `alloc[hop]` then adds 1.
    pub hop: u8,
    /// Scale of `desired` and `alloc` (0..=15).
    pub scale: u8,
    /// Scale of `prev_desired` and `prev_alloc` (0..=15).
    pub prev_scale: u8,
    /// Desired rate for the next RTT (r_t+1), units.
    pub desired: u8,
    /// Desired rate of the previous request (r_t), units.
    pub prev_desired: u8,
    /// Allocations being filled by the routers (a_t+1), units; the sender sends zeros.
    pub alloc: [u8; HOPS],
    /// Allocations of the previous request (a_t), units; zeros where no router wrote.
    pub prev_alloc: [u8; HOPS],
}

impl D3Request {
    /// All fields zero.
    pub const EMPTY: Self = Self {
        flags: 0,
        hop: 0,
        scale: 0,
        prev_scale: 0,
        desired: 0,
        prev_desired: 0,
        alloc: [0; HOPS],
        prev_alloc: [0; HOPS],
    };

    /// The option's bytes (flags other than NEW/FIN/QUENCHED are dropped; scales and hop are
    /// masked to their widths).
    #[inline]
    pub const fn encode(&self) -> [u8; REQ_LEN] {
        let a = &self.alloc;
        let p = &self.prev_alloc;
        [
            TCPOPT_EXP,
            REQ_LEN as u8,
            EXID_HI,
            EXID_LO,
            (self.flags & REQ_FLAGS_MASK) | (self.hop & HOP_MASK),
            ((self.scale & MAX_SCALE) << 4) | (self.prev_scale & MAX_SCALE),
            self.desired,
            self.prev_desired,
            a[0],
            a[1],
            a[2],
            a[3],
            a[4],
            a[5],
            p[0],
            p[1],
            p[2],
            p[3],
            p[4],
            p[5],
        ]
    }

    /// Parses and validates a request option.
    #[inline]
    pub const fn decode(b: &[u8; REQ_LEN]) -> Result<Self, WireError> {
        if let Err(e) = check_header(b[OFF_KIND], b[OFF_LEN], b[OFF_EXID], b[OFF_EXID + 1], REQ_LEN) {
            return Err(e);
        }
        let fh = b[OFF_FLAGS_HOP];
        if fh & FLAG_ECHO != 0 {
            return Err(WireError::Type);
        }
        if fh & FLAG_RESERVED != 0 {
            return Err(WireError::Reserved);
        }
        let hop = fh & HOP_MASK;
        if hop as usize > HOPS {
            return Err(WireError::Hop);
        }
        Ok(Self {
            flags: fh & REQ_FLAGS_MASK,
            hop,
            scale: b[OFF_SCALES] >> 4,
            prev_scale: b[OFF_SCALES] & MAX_SCALE,
            desired: b[OFF_DESIRED],
            prev_desired: b[OFF_PREV_DESIRED],
            alloc: [b[8], b[9], b[10], b[11], b[12], b[13]],
            prev_alloc: [b[14], b[15], b[16], b[17], b[18], b[19]],
        })
    }
}

/// Rate feedback (12 bytes on the wire): the allocation vector of one request, echoed by the
/// receiver on an ACK.
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub struct D3Feedback {
    /// Slots the routers filled (the request's final hop index), 0..=6.
    pub hops: u8,
    /// Scale of the request the allocations were written in.
    pub scale: u8,
    /// The allocations; slots at or past `hops` are zero.
    pub alloc: [u8; HOPS],
}

impl D3Feedback {
    /// What the receiver echoes for a request it received.
    #[inline]
    pub fn from_request(req: &D3Request) -> Self {
        let hops = if req.hop as usize > HOPS {
            HOPS as u8
        } else {
            req.hop
        };
        let mut alloc = [0u8; HOPS];
        let mut i = 0;
        while i < HOPS && i < hops as usize {
            if let (Some(dst), Some(src)) = (alloc.get_mut(i), req.alloc.get(i)) {
                *dst = *src;
            }
            i += 1;
        }
        Self {
            hops,
            scale: req.scale & MAX_SCALE,
            alloc,
        }
    }

    /// The option's bytes.
    #[inline]
    pub const fn encode(&self) -> [u8; FB_LEN] {
        let a = &self.alloc;
        [
            TCPOPT_EXP,
            FB_LEN as u8,
            EXID_HI,
            EXID_LO,
            FLAG_ECHO | (self.hops & HOP_MASK),
            (self.scale & MAX_SCALE) << 4,
            a[0],
            a[1],
            a[2],
            a[3],
            a[4],
            a[5],
        ]
    }

    /// Parses and validates a feedback option.
    #[inline]
    pub const fn decode(b: &[u8; FB_LEN]) -> Result<Self, WireError> {
        if let Err(e) = check_header(b[OFF_KIND], b[OFF_LEN], b[OFF_EXID], b[OFF_EXID + 1], FB_LEN) {
            return Err(e);
        }
        let fh = b[FB_OFF_FLAGS_HOPS];
        if fh & FLAG_ECHO == 0 || fh & REQ_FLAGS_MASK != 0 {
            return Err(WireError::Type);
        }
        if fh & FLAG_RESERVED != 0 {
            return Err(WireError::Reserved);
        }
        let hops = fh & HOP_MASK;
        if hops as usize > HOPS {
            return Err(WireError::Hop);
        }
        Ok(Self {
            hops,
            scale: b[FB_OFF_SCALE] >> 4,
            alloc: [b[6], b[7], b[8], b[9], b[10], b[11]],
        })
    }

    /// Smallest allocation over the filled slots, units; `None` if no D3 router was on the path.
    #[inline]
    pub fn min_units(&self) -> Option<u8> {
        min_prefix(&self.alloc, self.hops as usize)
    }

    /// The rate the sender paces at (bytes/s): the path's smallest allocation.
    #[inline]
    pub fn min_rate(&self) -> Option<u64> {
        self.min_units().map(|u| units_to_rate(u, self.scale))
    }
}

/// Receiver fast path: the feedback bytes to echo for request bytes (`None` if invalid, and
/// for a FIN request: its slots are zero and its sender, done with the transfer, waits for no
/// answer; an echo would only arrive at a sender that has nothing outstanding).
#[inline]
pub fn feedback_for(req: &[u8; REQ_LEN]) -> Option<[u8; FB_LEN]> {
    match D3Request::decode(req) {
        Ok(r) if r.flags & FLAG_FIN != 0 => None,
        Ok(r) => Some(D3Feedback::from_request(&r).encode()),
        Err(_) => None,
    }
}

// Fixed-offset accessors over the request bytes, for patching in place.

/// Flag bits (NEW/FIN/QUENCHED/ECHO/RESERVED) of a request.
#[inline]
pub const fn req_flags(b: &[u8; REQ_LEN]) -> u8 {
    b[OFF_FLAGS_HOP] & !HOP_MASK
}
/// Hop index of a request.
#[inline]
pub const fn req_hop(b: &[u8; REQ_LEN]) -> u8 {
    b[OFF_FLAGS_HOP] & HOP_MASK
}
/// Sets the hop index, keeping the flags.
#[inline]
pub fn req_set_hop(b: &mut [u8; REQ_LEN], hop: u8) {
    b[OFF_FLAGS_HOP] = (b[OFF_FLAGS_HOP] & !HOP_MASK) | (hop & HOP_MASK);
}
/// Scale of `desired` and `alloc`.
#[inline]
pub const fn req_scale(b: &[u8; REQ_LEN]) -> u8 {
    b[OFF_SCALES] >> 4
}
/// Scale of `prev_desired` and `prev_alloc`.
#[inline]
pub const fn req_prev_scale(b: &[u8; REQ_LEN]) -> u8 {
    b[OFF_SCALES] & MAX_SCALE
}
/// Desired rate, units.
#[inline]
pub const fn req_desired(b: &[u8; REQ_LEN]) -> u8 {
    b[OFF_DESIRED]
}
/// Previous desired rate, units.
#[inline]
pub const fn req_prev_desired(b: &[u8; REQ_LEN]) -> u8 {
    b[OFF_PREV_DESIRED]
}
/// `alloc[slot]`, `None` if `slot >= HOPS`.
#[inline]
pub fn req_alloc(b: &[u8; REQ_LEN], slot: usize) -> Option<u8> {
    if slot < HOPS {
        b.get(OFF_ALLOC + slot).copied()
    } else {
        None
    }
}
/// Writes `alloc[slot]`; false (nothing written) if `slot >= HOPS`.
#[inline]
pub fn req_set_alloc(b: &mut [u8; REQ_LEN], slot: usize, units: u8) -> bool {
    if slot >= HOPS {
        return false;
    }
    match b.get_mut(OFF_ALLOC + slot) {
        Some(x) => {
            *x = units;
            true
        }
        None => false,
    }
}
/// `prev_alloc[slot]`, `None` if `slot >= HOPS`.
#[inline]
pub fn req_prev_alloc(b: &[u8; REQ_LEN], slot: usize) -> Option<u8> {
    if slot < HOPS {
        b.get(OFF_PREV_ALLOC + slot).copied()
    } else {
        None
    }
}

/// The two 16-bit words (even offsets from the option's kind byte) a router at `hop` changes:
/// the flags/hop word and the word holding `alloc[hop]`. They are TCP checksum words when the
/// option starts at an even offset from the TCP header (the sender's alignment, see
/// `docs/d3.md`); otherwise use [`csum_replace`] with `odd = true`.
#[inline]
pub const fn rewritten_words(hop: u8) -> [usize; 2] {
    [OFF_FLAGS_HOP, (OFF_ALLOC + (hop & HOP_MASK) as usize) & !1]
}

// ------------------------------------------------------------------------------------------
// Option scanning and checksum
// ------------------------------------------------------------------------------------------

/// Where a D3 option sits in a TCP option area.
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub struct FoundOption {
    /// Offset of the kind byte from the start of the option area (add [`TCP_OPTS_OFFSET`]
    /// for the offset from the TCP header; its parity is the `odd` of [`csum_replace`]).
    pub offset: usize,
    /// [`REQ_LEN`] (a request) or [`FB_LEN`] (feedback).
    pub len: usize,
}

/// Finds the first D3 option (kind 253, our ExID, length 20 or 12) in the first `opts_len`
/// bytes of a TCP option area. Stops at EOL or at a malformed length.
///
/// Written for the verifier: the walk visits every position with a constant index and keeps
/// only where the next option starts as data. An index that follows the option lengths is an
/// unknown the verifier must track precisely (it indexes memory), so older kernels (6.1) walk
/// every combination of lengths and give up at a million instructions; here the unknown is
/// only compared, never used as an index, and the paths through one position prune together.
#[inline]
pub fn find_d3_option(opts: &[u8; TCP_OPTS_MAX], opts_len: usize) -> Option<FoundOption> {
    let end = if opts_len < TCP_OPTS_MAX {
        opts_len
    } else {
        TCP_OPTS_MAX
    };
    // `pos < 40` and `len <= 255`: the wrapping adds below never wrap (and, unlike `+`, leave
    // no overflow-panic path in a bpf build with overflow checks).
    let mut next = 0usize;
    let mut pos = 0usize;
    while pos < TCP_OPTS_MAX {
        let here = pos;
        pos += 1;
        if here >= end {
            return None;
        }
        if here != next {
            continue; // inside an option
        }
        let kind = *opts.get(here)?;
        if kind == 0 {
            return None;
        }
        if kind == 1 {
            next = here.wrapping_add(1);
            continue;
        }
        let len = *opts.get(here.wrapping_add(1))? as usize;
        if len < 2 || here.wrapping_add(len) > end {
            return None;
        }
        if kind == TCPOPT_EXP
            && (len == REQ_LEN || len == FB_LEN)
            && opts.get(here.wrapping_add(2)) == Some(&EXID_HI)
            && opts.get(here.wrapping_add(3)) == Some(&EXID_LO)
        {
            return Some(FoundOption { offset: here, len });
        }
        next = here.wrapping_add(len);
    }
    None
}

/// Copies `N` bytes at `offset` out of an option area (`None` if they do not fit).
#[inline]
pub fn copy_option<const N: usize>(opts: &[u8; TCP_OPTS_MAX], offset: usize) -> Option<[u8; N]> {
    let mut out = [0u8; N];
    let mut j = 0;
    while j < N {
        *out.get_mut(j)? = *opts.get(offset.checked_add(j)?)?;
        j += 1;
    }
    Some(out)
}

/// Writes `src` back at `offset` (false, nothing written, if it does not fit).
#[inline]
pub fn write_option<const N: usize>(opts: &mut [u8; TCP_OPTS_MAX], offset: usize, src: &[u8; N]) -> bool {
    match offset.checked_add(N) {
        Some(end) if end <= TCP_OPTS_MAX => {}
        _ => return false,
    }
    let mut j = 0;
    while j < N {
        if let (Some(dst), Some(v)) = (opts.get_mut(offset.saturating_add(j)), src.get(j)) {
            *dst = *v;
        }
        j += 1;
    }
    true
}

#[inline]
const fn fold(s: u32) -> u16 {
    let s = (s & 0xffff) + (s >> 16);
    let s = (s & 0xffff) + (s >> 16);
    s as u16
}

/// One's-complement sum of `b` as big-endian 16-bit words starting at byte 0 (a trailing odd
/// byte is the high byte of a last word), folded.
#[inline]
fn ones_sum<const N: usize>(b: &[u8; N]) -> u16 {
    let mut s: u32 = 0;
    let mut i = 0;
    while i < N {
        let v = match b.get(i) {
            Some(v) => *v as u32,
            None => 0,
        };
        s = s.wrapping_add(if i & 1 == 0 { v << 8 } else { v });
        i += 1;
    }
    fold(s)
}

/// Incremental Internet checksum update (RFC 1624, eqn. 3) for bytes `old` replaced by `new`
/// in a checksummed region: returns the new checksum field value given the old one. `odd`:
/// the replaced bytes start at an odd offset from the start of the checksummed data (the TCP
/// header), so their words are byte-swapped relative to the checksum's words.
#[inline]
pub fn csum_replace<const N: usize>(check: u16, old: &[u8; N], new: &[u8; N], odd: bool) -> u16 {
    let (mut so, mut sn) = (ones_sum(old), ones_sum(new));
    if odd {
        so = so.swap_bytes();
        sn = sn.swap_bytes();
    }
    !fold((!check) as u32 + (!so) as u32 + sn as u32)
}

// ------------------------------------------------------------------------------------------
// Host side: per-flow state
// ------------------------------------------------------------------------------------------

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

// ------------------------------------------------------------------------------------------
// Router side
// ------------------------------------------------------------------------------------------

/// [`D3LinkConfig::capacity_mode`]: utilisation term `alpha * (line_rate - u/T)` (RCP's form;
/// the default, see `docs/d3.md`).
pub const CAP_MODE_LINE: u32 = 0;
/// Utilisation term `alpha * (C(t) - u/T)`, the paper's formula as printed.
pub const CAP_MODE_PAPER: u32 = 1;
/// alpha = 1 / `ALPHA_DEN` (paper: 0.1). beta = 1.
pub const ALPHA_DEN: u64 = 10;

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
/// flow. Concurrent updates from several CPUs must hold a lock (e.g. `bpf_spin_lock`).
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

/// Smallest of the first `n` slots (`None` if `n == 0`). Index loops with `.get()` rather
/// than `enumerate()`: core's iterator counter keeps an overflow-panic path when the bpf crate
/// is built with overflow checks.
#[inline]
fn min_prefix(alloc: &[u8; HOPS], n: usize) -> Option<u8> {
    let mut m: Option<u8> = None;
    let mut i = 0;
    while i < HOPS && i < n {
        if let Some(v) = alloc.get(i) {
            m = match m {
                Some(x) if x <= *v => Some(x),
                _ => Some(*v),
            };
        }
        i += 1;
    }
    m
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
/// a = left > r_t1 ? r_t1 + fs : left
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
    let mut a = if left > r_t1 {
        out |= OUT_DESIRED_MET;
        r_t1.saturating_add(fs)
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
/// [`rewritten_words`]; fix the TCP checksum with [`csum_replace`] (old vs new bytes).
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

#[cfg(feature = "user")]
// SAFETY: `#[repr(C)]`, integer fields only, no implicit padding (sizes asserted above).
unsafe impl aya::Pod for D3FlowState {}
#[cfg(feature = "user")]
// SAFETY: as above.
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
    use super::*;
    use std::vec::Vec;

    /// 1 Gbit/s in bytes/s.
    const GBPS: u64 = 125_000_000;
    /// Unit at scale 8 (what a non-deadline flow on a 1G host uses): 524_288 B/s.
    const U8: u64 = 524_288;

    fn cfg_1g() -> D3LinkConfig {
        D3LinkConfig::for_line_rate(GBPS)
    }

    fn request(flags: u8, scale: u8, desired: u8) -> D3Request {
        D3Request {
            flags,
            scale,
            desired,
            ..D3Request::EMPTY
        }
    }

    /// The request a flow sends after `prev` was answered with `grant_units` at `hop`.
    fn follow_up(prev: &D3Request, grant_units: u8, desired: u8) -> D3Request {
        let mut prev_alloc = [0u8; HOPS];
        prev_alloc[prev.hop as usize] = grant_units;
        D3Request {
            flags: 0,
            hop: 0,
            scale: prev.scale,
            prev_scale: prev.scale,
            desired,
            prev_desired: prev.desired,
            alloc: [0; HOPS],
            prev_alloc,
        }
    }

    // ---------------------------------------------------------------- wire format

    #[test]
    fn new_request_encodes_to_known_bytes() {
        // A new 50 KB / 20 ms flow: 2.5 MB/s -> scale 5 (65_536 B/s units), 39 units.
        let r = request(FLAG_NEW, 5, 39);
        assert_eq!(
            r.encode(),
            [
                0xFD, 0x14, 0xD3, 0x03, 0x80, 0x50, 39, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
            ]
        );
    }

    #[test]
    fn full_request_and_feedback_encode_to_known_bytes() {
        let r = D3Request {
            flags: FLAG_QUENCHED,
            hop: 2,
            scale: 9,
            prev_scale: 8,
            desired: 0,
            prev_desired: 12,
            alloc: [200, 150, 0, 0, 0, 0],
            prev_alloc: [1, 2, 3, 4, 5, 6],
        };
        let b = r.encode();
        assert_eq!(
            b,
            [
                0xFD, 20, 0xD3, 0x03, 0x22, 0x98, 0, 12, 200, 150, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6
            ]
        );
        assert_eq!(req_flags(&b), FLAG_QUENCHED);
        assert_eq!(req_hop(&b), 2);
        assert_eq!(req_scale(&b), 9);
        assert_eq!(req_prev_scale(&b), 8);
        assert_eq!(req_desired(&b), 0);
        assert_eq!(req_prev_desired(&b), 12);
        assert_eq!(req_alloc(&b, 1), Some(150));
        assert_eq!(req_alloc(&b, 6), None);
        assert_eq!(req_prev_alloc(&b, 5), Some(6));
        assert_eq!(req_prev_alloc(&b, 6), None);

        let fb = D3Feedback::from_request(&r);
        assert_eq!(
            fb,
            D3Feedback {
                hops: 2,
                scale: 9,
                alloc: [200, 150, 0, 0, 0, 0]
            }
        );
        assert_eq!(
            fb.encode(),
            [0xFD, 12, 0xD3, 0x03, 0x12, 0x90, 200, 150, 0, 0, 0, 0]
        );
        assert_eq!(feedback_for(&b), Some(fb.encode()));
        // A FIN request gets no echo.
        let mut fin = b;
        fin[OFF_FLAGS_HOP] |= FLAG_FIN;
        assert_eq!(feedback_for(&fin), None);
        assert_eq!(fb.min_units(), Some(150));
        assert_eq!(fb.min_rate(), Some(150 * (2048 << 9)));
    }

    #[test]
    fn feedback_copies_only_filled_slots() {
        // Garbage in unfilled slots (a sender bug) is not echoed.
        let r = D3Request {
            hop: 1,
            scale: 3,
            alloc: [7, 99, 99, 0, 0, 0],
            ..D3Request::EMPTY
        };
        let fb = D3Feedback::from_request(&r);
        assert_eq!(fb.alloc, [7, 0, 0, 0, 0, 0]);
        assert_eq!(fb.min_units(), Some(7));
        let none = D3Feedback::from_request(&D3Request::EMPTY);
        assert_eq!(none.min_rate(), None);
    }

    #[test]
    fn encode_decode_round_trip() {
        let mut n = 0;
        for flags in [
            0,
            FLAG_NEW,
            FLAG_FIN,
            FLAG_QUENCHED,
            FLAG_NEW | FLAG_FIN | FLAG_QUENCHED,
        ] {
            for hop in 0..=HOPS as u8 {
                for (scale, prev_scale) in [(0u8, 0u8), (15, 0), (0, 15), (7, 9)] {
                    let v = hop.wrapping_mul(37).wrapping_add(scale);
                    let r = D3Request {
                        flags,
                        hop,
                        scale,
                        prev_scale,
                        desired: v,
                        prev_desired: 255 - v,
                        alloc: [v, 1, 2, 3, 4, 255],
                        prev_alloc: [255, v, 0, 9, 8, 7],
                    };
                    assert_eq!(D3Request::decode(&r.encode()), Ok(r));
                    let fb = D3Feedback::from_request(&r);
                    assert_eq!(D3Feedback::decode(&fb.encode()), Ok(fb));
                    n += 1;
                }
            }
        }
        assert_eq!(n, 5 * 7 * 4);
    }

    #[test]
    fn decode_rejects_malformed_options() {
        let good = request(FLAG_NEW, 5, 39).encode();
        let mut b = good;
        b[0] = 254;
        assert_eq!(D3Request::decode(&b), Err(WireError::Kind));
        let mut b = good;
        b[1] = 12;
        assert_eq!(D3Request::decode(&b), Err(WireError::Length));
        let mut b = good;
        b[3] = 0x04;
        assert_eq!(D3Request::decode(&b), Err(WireError::ExId));
        let mut b = good;
        b[4] |= FLAG_ECHO;
        assert_eq!(D3Request::decode(&b), Err(WireError::Type));
        let mut b = good;
        b[4] |= FLAG_RESERVED;
        assert_eq!(D3Request::decode(&b), Err(WireError::Reserved));
        let mut b = good;
        b[4] |= 7;
        assert_eq!(D3Request::decode(&b), Err(WireError::Hop));

        let fb = D3Feedback {
            hops: 1,
            scale: 2,
            alloc: [5, 0, 0, 0, 0, 0],
        }
        .encode();
        let mut f = fb;
        f[4] &= !FLAG_ECHO;
        assert_eq!(D3Feedback::decode(&f), Err(WireError::Type));
        let mut f = fb;
        f[4] |= FLAG_NEW;
        assert_eq!(D3Feedback::decode(&f), Err(WireError::Type));
        let mut f = fb;
        f[4] |= 7;
        assert_eq!(D3Feedback::decode(&f), Err(WireError::Hop));
        let mut f = fb;
        f[1] = 20;
        assert_eq!(D3Feedback::decode(&f), Err(WireError::Length));
        // The request-sized prefix of a feedback option is not a request, and vice versa.
        let mut as_req = [0u8; REQ_LEN];
        as_req[..FB_LEN].copy_from_slice(&fb);
        assert_eq!(D3Request::decode(&as_req), Err(WireError::Length));
    }

    #[test]
    fn rewritten_words_are_even_and_cover_the_changed_bytes() {
        for hop in 0..HOPS as u8 {
            let [w0, w1] = rewritten_words(hop);
            assert_eq!(w0 % 2, 0);
            assert_eq!(w1 % 2, 0);
            assert_eq!(w0, OFF_FLAGS_HOP);
            let slot = OFF_ALLOC + hop as usize;
            assert!(w1 == slot || w1 + 1 == slot);
        }
    }

    // ---------------------------------------------------------------- option scan, checksum

    /// A TCP header (20 bytes, checksum field zero) with `opts` and 8 payload bytes.
    fn segment(opts: &[u8]) -> Vec<u8> {
        let mut s = std::vec![
            0x1f, 0x90, 0xc3, 0x51, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0x18, 0x01, 0xf5, 0, 0, 0, 0
        ];
        s[12] = (((20 + opts.len()) / 4) as u8) << 4;
        s.extend_from_slice(opts);
        s.extend_from_slice(b"payload!");
        s
    }

    /// Full Internet checksum over `data` (the pseudo-header is constant, so left out).
    fn full_csum(data: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        for (i, b) in data.iter().enumerate() {
            sum += if i % 2 == 0 { (*b as u32) << 8 } else { *b as u32 };
        }
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    fn router_pass_over_segment(prefix: &[u8], expect_offset: usize) {
        let req = D3Request {
            flags: 0,
            hop: 1,
            scale: 8,
            prev_scale: 8,
            desired: 0,
            prev_desired: 0,
            alloc: [200, 0, 0, 0, 0, 0],
            prev_alloc: [180, 170, 0, 0, 0, 0],
        };
        let mut opts = Vec::from(prefix);
        opts.extend_from_slice(&req.encode());
        while opts.len() % 4 != 0 {
            opts.push(0); // EOL padding
        }
        let mut seg = segment(&opts);
        let c = full_csum(&seg);
        seg[16..18].copy_from_slice(&c.to_be_bytes());
        assert_eq!(full_csum(&seg), 0, "a checksummed segment sums to zero");

        // The router's view: the option area copied into a fixed 40-byte buffer.
        let mut area = [0u8; TCP_OPTS_MAX];
        area[..opts.len()].copy_from_slice(&opts);
        let found = find_d3_option(&area, opts.len()).expect("option found");
        assert_eq!(
            found,
            FoundOption {
                offset: expect_offset,
                len: REQ_LEN
            }
        );
        let old: [u8; REQ_LEN] = copy_option(&area, found.offset).expect("fits");
        let mut new = old;
        let cfg = cfg_1g();
        let mut st = D3LinkState::new(&cfg);
        let g = router_rewrite(&mut new, &mut st, &cfg);
        assert_eq!(g.outcome & (OUT_INVALID | OUT_HOP_OVERFLOW), 0);
        assert_ne!(old, new);
        assert!(write_option(&mut area, found.offset, &new));

        let tcp_off = TCP_OPTS_OFFSET + found.offset;
        let odd = tcp_off % 2 == 1;
        let check = u16::from_be_bytes([seg[16], seg[17]]);
        let incremental = csum_replace(check, &old, &new, odd);
        seg[tcp_off..tcp_off + REQ_LEN].copy_from_slice(&new);
        seg[16..18].copy_from_slice(&incremental.to_be_bytes());
        assert_eq!(
            full_csum(&seg),
            0,
            "incremental checksum (odd = {odd}) matches a full recomputation"
        );

        // Only the words rewritten_words() names changed (for even alignment).
        if !odd {
            let words = rewritten_words(1);
            for w in (0..REQ_LEN).step_by(2) {
                if !words.contains(&w) {
                    assert_eq!(old[w..w + 2], new[w..w + 2], "word {w} unchanged");
                }
            }
        }
    }

    #[test]
    fn router_rewrite_with_incremental_checksum_even_offset() {
        // NOP NOP timestamps, then the option on a 4-byte boundary (TCP offset 32).
        let ts = [1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2];
        router_pass_over_segment(&ts, 12);
    }

    #[test]
    fn router_rewrite_with_incremental_checksum_odd_offset() {
        // A misaligned writer: timestamps then one NOP puts the option at TCP offset 33.
        let ts = [1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2, 1];
        router_pass_over_segment(&ts, 13);
    }

    #[test]
    fn find_option_skips_other_experiments_and_stops_on_garbage() {
        let d3 = request(0, 1, 2).encode();
        let fb = D3Feedback {
            hops: 1,
            scale: 1,
            alloc: [3, 0, 0, 0, 0, 0],
        }
        .encode();
        // A TFO-style experimental option (ExID 0xF989) before ours.
        let mut area = [0u8; TCP_OPTS_MAX];
        let other = [253, 6, 0xF9, 0x89, 0xAA, 0xBB];
        area[..6].copy_from_slice(&other);
        area[6..26].copy_from_slice(&d3);
        assert_eq!(
            find_d3_option(&area, 26),
            Some(FoundOption {
                offset: 6,
                len: REQ_LEN
            })
        );
        // Truncated area: the option does not fit.
        assert_eq!(find_d3_option(&area, 25), None);
        // Feedback option.
        let mut area = [1u8; TCP_OPTS_MAX];
        area[3..15].copy_from_slice(&fb);
        assert_eq!(
            find_d3_option(&area, 15),
            Some(FoundOption {
                offset: 3,
                len: FB_LEN
            })
        );
        // EOL before it hides it; a zero length stops the scan.
        area[0] = 0;
        assert_eq!(find_d3_option(&area, 15), None);
        let mut area = [0u8; TCP_OPTS_MAX];
        area[0] = 8;
        area[1] = 0;
        assert_eq!(find_d3_option(&area, 40), None);
        // 40 NOPs: bounded, nothing found.
        assert_eq!(find_d3_option(&[1u8; TCP_OPTS_MAX], TCP_OPTS_MAX), None);
        // Our kind and ExID with another length is not ours.
        let mut area = [0u8; TCP_OPTS_MAX];
        area[..4].copy_from_slice(&[253, 16, 0xD3, 0x03]);
        assert_eq!(find_d3_option(&area, 16), None);
        assert_eq!(copy_option::<REQ_LEN>(&area, 21), None);
        assert!(!write_option(&mut area, 21, &d3));
    }

    // ---------------------------------------------------------------- units, rates

    #[test]
    fn units_cover_small_deadline_flows_and_100g() {
        assert_eq!(unit_rate(0), 2048);
        assert_eq!(unit_rate(8), U8);
        assert_eq!(MAX_ENCODABLE_RATE, 17_112_760_320);
        // 1 Gbit/s at scale 8 is 238 units (the paper's 125 units of MB/s).
        assert_eq!(rate_to_units_floor(GBPS, 8), 238);
        assert_eq!(rate_to_units_floor(u64::MAX, 0), 255);
        assert_eq!(rate_to_units_ceil(2048, 0), 1);
        assert_eq!(rate_to_units_ceil(2049, 0), 2);
        // Non-deadline flows: scale so 255 units reach the sender's line rate.
        assert_eq!(choose_scale(0, GBPS), Some(8));
        assert_eq!(choose_scale(0, 100 * GBPS), Some(15));
        assert_eq!(choose_scale(0, 0), Some(0));
        assert_eq!(choose_scale(MAX_ENCODABLE_RATE + 1, GBPS), None);
    }

    #[test]
    fn desired_rate_encoding_is_tight_and_rounds_up() {
        // The paper's range: 2 KB in 40 ms (50 KB/s) .. 50 KB in 20 ms (2.5 MB/s), and up.
        assert_eq!(desired_rate(2_000, 40_000_000), 50_000);
        assert_eq!(desired_rate(50_000, 20_000_000), 2_500_000);
        assert_eq!(choose_scale(50_000, GBPS), Some(0));
        assert_eq!(rate_to_units_ceil(50_000, 0), 25);
        assert_eq!(choose_scale(2_500_000, GBPS), Some(5));
        assert_eq!(rate_to_units_ceil(2_500_000, 5), 39);
        let mut r = 1u64;
        let mut checked = 0;
        while r <= MAX_ENCODABLE_RATE {
            let s = choose_scale(r, GBPS).expect("encodable");
            let units = rate_to_units_ceil(r, s);
            assert!(units <= 255);
            let enc = units_to_rate(units as u8, s);
            assert!(enc >= r, "never ask for less than needed ({r})");
            assert!(enc - r < unit_rate(s), "rounded up by less than one unit");
            if s > 0 && s < MAX_SCALE {
                // Over-ask bounded by 1/31.5 of the rate, and room for a 4x grant.
                assert!((enc - r) * 63 < 2 * r, "precision at {r}: {enc}");
                assert!(units_to_rate(255, s) >= 4 * r, "headroom at {r}");
            }
            r = r * 9 / 8 + 1;
            checked += 1;
        }
        assert!(checked > 150);
    }

    #[test]
    fn desired_rate_edge_cases() {
        assert_eq!(desired_rate(1, 3), 333_333_334);
        assert_eq!(desired_rate(0, 0), 0);
        assert_eq!(desired_rate(5, 0), u64::MAX);
        assert_eq!(desired_rate(u64::MAX, 1), u64::MAX);
        assert_eq!(bytes_per_second(100_000, 800_000), 125_000_000);
        assert_eq!(bytes_per_second(1, 3), 333_333_333);
        // Long deadlines take the halving path: 10 GB in 100 s = 100 MB/s (+ tiny round-up).
        let r = desired_rate(10_000_000_000, 100_000_000_000);
        assert!((100_000_000..=100_000_100).contains(&r), "{r}");
        let f = bytes_per_second(10_000_000_000, 100_000_000_000);
        assert!((99_999_900..=100_000_100).contains(&f), "{f}");
        // Halving both rounds the rate up, never down.
        assert!((1_000_000_000..=1_000_000_001).contains(&desired_rate(u64::MAX, u64::MAX)));
    }

    // ---------------------------------------------------------------- quenching, host state

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

    fn input(bytes_left: u64, time_left_ns: i64) -> HostInput {
        HostInput {
            has_deadline: true,
            bytes_left,
            time_left_ns,
            line_rate: GBPS,
            fin: false,
        }
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

    // ---------------------------------------------------------------- router: the paper's cases

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

    #[test]
    fn burst_onto_busy_link_converges_within_two_rtts() {
        let cfg = cfg_1g();
        let mut st = D3LinkState::new(&cfg);
        // A long non-deadline flow holds (almost) the whole link.
        let long = request(FLAG_NEW, 8, 0);
        let g = process_request(&mut st, &cfg, &long);
        let mut long = follow_up(&long, g.units, 0);
        let g = process_request(&mut st, &cfg, &long);
        assert_eq!(g.units, 238);
        let mut long_units = g.units;
        // Ten new deadline flows arrive: nothing is left, they get the base rate.
        let mut dl: Vec<D3Request> = (0..10).map(|_| request(FLAG_NEW, 5, 39)).collect();
        let mut dl_units: Vec<u8> = dl
            .iter()
            .map(|r| process_request(&mut st, &cfg, r).units)
            .collect();
        // The first is left 219_456 B/s (3 units at scale 5), the rest the base rate (1 unit).
        assert_eq!(dl_units, [3, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
        // Two more RTTs (deadline flows first, the worst order): the long flow's fair share
        // shrinks and the deadline flows get their rate.
        for round in 0..2 {
            dl = dl
                .iter()
                .zip(&dl_units)
                .map(|(r, u)| follow_up(r, *u, 39))
                .collect();
            dl_units = dl
                .iter()
                .map(|r| process_request(&mut st, &cfg, r).units)
                .collect();
            long = follow_up(&long, long_units, 0);
            long_units = process_request(&mut st, &cfg, &long).units;
            if round == 1 {
                assert!(dl_units.iter().all(|u| *u >= 39), "{dl_units:?}");
            }
        }
        assert!(st.allocated <= st.capacity);
        assert_eq!(st.demand, 10 * 39 * 65_536);
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

    // ---------------------------------------------------------------- soft state

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

    // ---------------------------------------------------------------- simulation

    struct SimFlow {
        st: D3FlowState,
        deadline_ns: Option<u64>,
        start_round: u64,
        bytes_left: u64,
        done_ns: Option<u64>,
        fin_sent: bool,
    }

    /// Deadline flows (2-50 KB, 20-40 ms) and two long non-deadline flows share one 1 Gbit/s
    /// link with 300 us RTTs. Every request goes through the wire format, the router, the
    /// receiver's echo and the sender's feedback handling; the controller runs every 3 RTTs.
    #[test]
    fn simulation_deadline_flows_share_a_link() {
        const RTT: u64 = 300_000;
        let cfg = cfg_1g();
        let mut link = D3LinkState::new(&cfg);
        let ms = 1_000_000u64;
        let deadline_flows: [(u64, u64, u64); 10] = [
            (2_000, 20, 0),
            (10_000, 25, 0),
            (20_000, 30, 1),
            (30_000, 40, 2),
            (40_000, 20, 3),
            (50_000, 30, 3),
            (25_000, 22, 5),
            (45_000, 35, 8),
            (50_000, 20, 8),
            (2_000, 40, 9),
        ];
        let mut flows: Vec<SimFlow> = deadline_flows
            .iter()
            .map(|(size, dl, start)| SimFlow {
                st: D3FlowState::new(0),
                deadline_ns: Some(start * RTT + dl * ms),
                start_round: *start,
                bytes_left: *size,
                done_ns: None,
                fin_sent: false,
            })
            .collect();
        for start in [0, 4] {
            flows.push(SimFlow {
                st: D3FlowState::new(0),
                deadline_ns: None,
                start_round: start,
                bytes_left: 3_000_000,
                done_ns: None,
                fin_sent: false,
            });
        }
        let last_arrival = flows.iter().map(|f| f.start_round).max().unwrap_or(0);
        let mut queue = 0u64;
        let mut served_in_interval = 0u64;
        let mut t = 0u64;
        while flows.iter().any(|f| !f.fin_sent) {
            assert!(t < 2_000, "simulation did not finish");
            let now = t * RTT;
            // 1. Requests (one per flow per RTT), through router and receiver, back to sender.
            let mut grants_sum = 0u64;
            let mut any_new = false;
            for f in flows.iter_mut() {
                if t < f.start_round || f.fin_sent {
                    continue;
                }
                let inp = HostInput {
                    has_deadline: f.deadline_ns.is_some(),
                    bytes_left: f.bytes_left,
                    time_left_ns: f.deadline_ns.map_or(0, |d| d as i64 - (now + RTT) as i64),
                    line_rate: GBPS,
                    fin: f.done_ns.is_some(),
                };
                let hr = f.st.next_request(&inp).expect("request");
                assert_eq!(
                    hr.outcome & (HOST_QUENCHED_NOW | HOST_FEEDBACK_LOST),
                    0,
                    "flow {t}"
                );
                any_new |= hr.outcome & HOST_NEW != 0;
                let mut wire = hr.req.encode();
                let g = router_rewrite(&mut wire, &mut link, &cfg);
                assert_eq!(g.outcome & (OUT_INVALID | OUT_HOP_OVERFLOW | OUT_CLAMPED), 0);
                if hr.outcome & HOST_FIN != 0 {
                    f.fin_sent = true;
                    continue;
                }
                let echo = feedback_for(&wire).expect("receiver echoes");
                let fb = D3Feedback::decode(&echo).expect("sender parses");
                let pace = f.st.apply_feedback(&fb).expect("one D3 hop");
                if let Some(dl) = f.deadline_ns {
                    // After its first RTT a deadline flow always gets at least what it asked.
                    if hr.outcome & HOST_NEW == 0 && link.demand <= link.capacity {
                        assert!(pace >= hr.desired_rate, "round {t}: {pace} < {}", hr.desired_rate);
                    }
                    assert!(now < dl, "still sending after the deadline");
                }
                grants_sum += pace;
            }
            // Grants never exceed what the router hands out once arrivals have settled.
            if t > last_arrival + 2 && !any_new {
                assert!(
                    grants_sum <= link.capacity,
                    "round {t}: {grants_sum} > {}",
                    link.capacity
                );
            }
            // 2. Data for this RTT at the paced rate (the grant came back with the feedback).
            let mut arrivals = 0u64;
            for f in flows.iter_mut() {
                if t < f.start_round || f.done_ns.is_some() || f.fin_sent || f.st.awaiting_feedback() {
                    continue;
                }
                let sent = f.bytes_left.min(f.st.pace_rate * RTT / 1_000_000_000);
                f.bytes_left -= sent;
                arrivals += sent;
            }
            let capacity_bytes = GBPS * RTT / 1_000_000_000;
            let served = (queue + arrivals).min(capacity_bytes);
            queue = queue + arrivals - served;
            served_in_interval += served;
            for f in flows.iter_mut() {
                if f.done_ns.is_none() && f.bytes_left == 0 {
                    // Last byte leaves the link after the queue ahead of it drains.
                    f.done_ns = Some(now + RTT + queue * 1_000_000_000 / GBPS);
                }
            }
            // 3. Capacity controller every 3 RTTs.
            if t % 3 == 2 {
                capacity_tick(&mut link, &cfg, served_in_interval, queue, 3 * RTT);
                served_in_interval = 0;
                assert!(link.capacity >= cfg.capacity_min && link.capacity <= cfg.capacity_max);
            }
            t += 1;
        }
        for (i, f) in flows.iter().enumerate() {
            let done = f.done_ns.expect("finished");
            if let Some(dl) = f.deadline_ns {
                assert!(done <= dl, "flow {i} missed its deadline: {done} > {dl}");
            }
        }
        // Every flow sent a FIN and the router's counters are exactly back to zero.
        assert_eq!((link.flows, link.demand, link.allocated), (0, 0, 0));
    }
}
