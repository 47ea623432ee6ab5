//! The wire format: the 20-byte request option and the 12-byte feedback option (TCP option kind
//! 253, ExID `0xD303`), decoded and encoded over `[u8; N]`, and fixed-offset accessors for
//! patching a request in place (what routers do). `docs/d3.md` has the byte diagrams.

use super::units::{MAX_SCALE, units_to_rate};

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
/// Sets the previous desired rate (units of the previous scale).
#[inline]
pub fn req_set_prev_desired(b: &mut [u8; REQ_LEN], units: u8) {
    b[OFF_PREV_DESIRED] = units;
}
/// Sets the scale of `prev_desired` and `prev_alloc`, keeping the current scale.
#[inline]
pub fn req_set_prev_scale(b: &mut [u8; REQ_LEN], scale: u8) {
    b[OFF_SCALES] = (b[OFF_SCALES] & !MAX_SCALE) | (scale & MAX_SCALE);
}
/// Writes `prev_alloc[slot]`; false (nothing written) if `slot >= HOPS`.
#[inline]
pub fn req_set_prev_alloc(b: &mut [u8; REQ_LEN], slot: usize, units: u8) -> bool {
    if slot >= HOPS {
        return false;
    }
    match b.get_mut(OFF_PREV_ALLOC + slot) {
        Some(x) => {
            *x = units;
            true
        }
        None => false,
    }
}

/// The two 16-bit words (even offsets from the option's kind byte) a router at `hop` changes:
/// the flags/hop word and the word holding `alloc[hop]`. They are TCP checksum words when the
/// option starts at an even offset from the TCP header (the sender's alignment, see
/// `docs/d3.md`); otherwise use [`csum_replace`](super::csum_replace) with `odd = true`.
#[inline]
pub const fn rewritten_words(hop: u8) -> [usize; 2] {
    [OFF_FLAGS_HOP, (OFF_ALLOC + (hop & HOP_MASK) as usize) & !1]
}

/// Smallest of the first `n` slots (`None` if `n == 0`). Index loops with `.get()` rather
/// than `enumerate()`: core's iterator counter keeps an overflow-panic path when the bpf crate
/// is built with overflow checks.
#[inline]
pub(super) fn min_prefix(alloc: &[u8; HOPS], n: usize) -> Option<u8> {
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
        // The setters a router uses to put its own record into a request.
        let mut c = b;
        req_set_prev_desired(&mut c, 7);
        req_set_prev_scale(&mut c, 3);
        assert!(req_set_prev_alloc(&mut c, 2, 99));
        assert!(!req_set_prev_alloc(&mut c, 6, 99));
        let d = D3Request::decode(&c).expect("still valid");
        assert_eq!((d.prev_desired, d.prev_scale, d.scale), (7, 3, 9));
        assert_eq!(d.prev_alloc, [1, 2, 99, 4, 5, 6]);
        assert_eq!(
            D3Request {
                prev_desired: 12,
                prev_scale: 8,
                prev_alloc: r.prev_alloc,
                ..d
            },
            r
        );

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
}
