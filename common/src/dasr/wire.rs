//! The DASR option: 8 bytes, TCP option kind 253 with the 16-bit ExID `0xDA5A` (RFC 6994),
//! carried by a receiver's pure ACKs. `docs/dasr.md` has the byte diagram.
//!
//! ```text
//!  0: kind = 253   1: length = 8   2-3: ExID 0xDA5A
//!  4-5: R (1 bit, reserved, 0) | N (15 bits): senders currently sending to the ACK's source
//!  6-7: E (4 bits) | M (12 bits): the receiver's line rate, M * 2^E Mbit/s (wire rate)
//! ```
//!
//! A receiver that finds more senders than [`MAX_SENDERS`] writes [`MAX_SENDERS`]; a line rate
//! is rounded down to what the encoding holds (whole Mbit/s, 12 significant bits: exact for
//! 1..=4095 Mbit/s and for 10, 25, 40, 50, 100, 200, 400 Gbit/s), so a sender never paces
//! above the receiver's share.

use crate::d3::{TCP_OPTS_MAX, TCPOPT_EXP};

/// DASR's experiment identifier, big-endian after kind and length. Not IANA-registered
/// (check the TCP ExID registry before use outside a lab).
pub const DASR_EXID: u16 = 0xDA5A;
pub const EXID_HI: u8 = (DASR_EXID >> 8) as u8;
pub const EXID_LO: u8 = (DASR_EXID & 0xff) as u8;
/// Length of the option, kind and length bytes included.
pub const OPT_LEN: usize = 8;
/// Byte 4, bit 7: reserved (a later version); sent as 0, an option with it set is ignored.
pub const FLAG_RESERVED: u8 = 0x80;
/// The largest N the option carries.
pub const MAX_SENDERS: u32 = 0x7fff;
/// The unit of the line rate: 1 Mbit/s, in bytes/s.
pub const RATE_UNIT: u64 = 125_000;
/// Bits of the rate's mantissa (the exponent has the other 4 of the 16).
pub const MANTISSA_BITS: u32 = 12;
const MANTISSA_MAX: u64 = (1 << MANTISSA_BITS) - 1;
/// The largest line rate the option holds: 4095 * 2^15 Mbit/s (134 Tbit/s).
pub const MAX_RATE: u64 = (MANTISSA_MAX << 15) * RATE_UNIT;

// An ACK with timestamps (12) and two SACK blocks (NOP NOP + 2 + 16 = 20) still has room.
const _: () = assert!(12 + 20 + OPT_LEN <= TCP_OPTS_MAX);
const _: () = assert!(OPT_LEN.is_multiple_of(4));

/// What a receiver tells a sender: N and its line rate.
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub struct Advert {
    /// Senders currently sending to the receiver's address (1..=[`MAX_SENDERS`]).
    pub senders: u32,
    /// The receiver's line rate, wire bytes/s (a value the encoding holds exactly).
    pub line_rate: u64,
}

/// Why an option was not taken.
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub enum Malformed {
    /// Not kind 253, or a length other than [`OPT_LEN`] (or running past the option area).
    Length,
    /// Another experiment's ExID.
    Exid,
    /// The reserved bit is set (a version this host does not speak).
    Reserved,
    /// N = 0.
    NoSenders,
    /// A line rate of 0.
    NoRate,
}

/// The 16-bit rate field for `rate` bytes/s, rounded down; `None` below 1 Mbit/s. Rates above
/// [`MAX_RATE`] saturate.
#[inline]
pub const fn encode_rate(rate: u64) -> Option<u16> {
    let units = rate / RATE_UNIT;
    if units == 0 {
        return None;
    }
    let mut e = 0u32;
    while e < 15 && (units >> e) > MANTISSA_MAX {
        e += 1;
    }
    let m = if (units >> e) > MANTISSA_MAX {
        MANTISSA_MAX
    } else {
        units >> e
    };
    Some(((e as u16) << MANTISSA_BITS) | m as u16)
}

/// Bytes/s of a rate field; `None` for a zero mantissa.
#[inline]
pub const fn decode_rate(code: u16) -> Option<u64> {
    let m = (code as u64) & MANTISSA_MAX;
    if m == 0 {
        return None;
    }
    let e = (code >> MANTISSA_BITS) as u32;
    Some((m << e) * RATE_UNIT)
}

/// The option for `senders` (saturated at [`MAX_SENDERS`]) and the encoded line rate
/// `rate_code` ([`encode_rate`]).
#[inline]
pub const fn encode(senders: u32, rate_code: u16) -> [u8; OPT_LEN] {
    let n = if senders > MAX_SENDERS {
        MAX_SENDERS
    } else {
        senders
    };
    [
        TCPOPT_EXP,
        OPT_LEN as u8,
        EXID_HI,
        EXID_LO,
        (n >> 8) as u8,
        n as u8,
        (rate_code >> 8) as u8,
        rate_code as u8,
    ]
}

impl Advert {
    /// The option bytes (`None` for N = 0 or a line rate below 1 Mbit/s).
    #[inline]
    pub const fn encode(&self) -> Option<[u8; OPT_LEN]> {
        if self.senders == 0 {
            return None;
        }
        match encode_rate(self.line_rate) {
            Some(code) => Some(encode(self.senders, code)),
            None => None,
        }
    }

    /// Reads an option as found in a segment.
    #[inline]
    pub fn decode(b: &[u8; OPT_LEN]) -> Result<Advert, Malformed> {
        if b[0] != TCPOPT_EXP || b[1] != OPT_LEN as u8 {
            return Err(Malformed::Length);
        }
        if b[2] != EXID_HI || b[3] != EXID_LO {
            return Err(Malformed::Exid);
        }
        if b[4] & FLAG_RESERVED != 0 {
            return Err(Malformed::Reserved);
        }
        let senders = (((b[4] & !FLAG_RESERVED) as u32) << 8) | b[5] as u32;
        if senders == 0 {
            return Err(Malformed::NoSenders);
        }
        match decode_rate(u16::from_be_bytes([b[6], b[7]])) {
            Some(line_rate) => Ok(Advert { senders, line_rate }),
            None => Err(Malformed::NoRate),
        }
    }

    /// The rate a sender paces at: line / N (wire bytes/s).
    #[inline]
    pub const fn share(&self) -> u64 {
        super::rate::share(self.line_rate, self.senders)
    }
}

/// What a scan of a TCP option area found.
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub enum Scan {
    /// No DASR option.
    Absent,
    /// A DASR option of the right length at this offset of the option area.
    Found(usize),
    /// An option with DASR's kind and ExID but another length, or one that runs past the
    /// option area (truncated): ignored, and counted.
    Malformed,
}

/// One step of the walk over a TCP option area: what the option starting at `pos` says.
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub enum Step {
    /// Not ours: the next option starts here.
    Next(usize),
    /// The walk is over.
    Done(Scan),
}

/// Looks at the option starting at `pos` of an option area whose first `end` bytes (at most
/// [`TCP_OPTS_MAX`]) are options. Stops at EOL, at the end, and at an option whose length is
/// invalid or runs past the area.
///
/// One step per call, so the datapath can run it as a `bpf_loop` callback: the verifier then
/// checks one step with `pos` unknown, instead of every path through a 40-byte walk (which
/// went past Linux 6.12's million-instruction limit).
#[inline(always)]
pub fn option_step(opts: &[u8; TCP_OPTS_MAX], end: usize, pos: usize) -> Step {
    let end = if end < TCP_OPTS_MAX { end } else { TCP_OPTS_MAX };
    if pos >= end {
        return Step::Done(Scan::Absent);
    }
    let Some(&kind) = opts.get(pos) else {
        return Step::Done(Scan::Absent);
    };
    if kind == 0 {
        return Step::Done(Scan::Absent);
    }
    if kind == 1 {
        return Step::Next(pos + 1);
    }
    let Some(&len) = opts.get(pos + 1) else {
        return Step::Done(Scan::Absent);
    };
    let len = len as usize;
    let ours = kind == TCPOPT_EXP
        && pos + 3 < end
        && opts.get(pos + 2) == Some(&EXID_HI)
        && opts.get(pos + 3) == Some(&EXID_LO);
    if len < 2 || pos + len > end {
        return Step::Done(if ours { Scan::Malformed } else { Scan::Absent });
    }
    if ours {
        return Step::Done(if len == OPT_LEN {
            Scan::Found(pos)
        } else {
            Scan::Malformed
        });
    }
    Step::Next(pos + len)
}

/// The most steps a walk takes: one per byte (an area of NOPs).
pub const MAX_STEPS: u32 = TCP_OPTS_MAX as u32;

/// Finds the first DASR option in the first `opts_len` bytes of a TCP option area: the walk of
/// [`option_step`], as the datapath runs it.
#[inline]
pub fn find_option(opts: &[u8; TCP_OPTS_MAX], opts_len: usize) -> Scan {
    let mut pos = 0;
    let mut i = 0;
    while i < MAX_STEPS {
        i += 1;
        match option_step(opts, opts_len, pos) {
            Step::Next(p) => pos = p,
            Step::Done(scan) => return scan,
        }
    }
    Scan::Absent
}

/// The 8 bytes at `offset` of an option area (`None` if they do not fit).
#[inline]
pub fn option_at(opts: &[u8; TCP_OPTS_MAX], offset: usize) -> Option<[u8; OPT_LEN]> {
    crate::d3::copy_option(opts, offset)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic, reason = "tests panic with a message")]
mod tests {
    extern crate std;
    use super::*;

    fn area(bytes: &[u8]) -> [u8; TCP_OPTS_MAX] {
        let mut a = [0u8; TCP_OPTS_MAX];
        a[..bytes.len()].copy_from_slice(bytes);
        a
    }

    #[test]
    fn the_walk_covers_an_area_of_nops_and_an_option_at_its_end() {
        assert_eq!(find_option(&[1u8; TCP_OPTS_MAX], TCP_OPTS_MAX), Scan::Absent);
        let mut a = [1u8; TCP_OPTS_MAX];
        a[32..].copy_from_slice(&encode(3, encode_rate(125_000_000).unwrap()));
        assert_eq!(find_option(&a, TCP_OPTS_MAX), Scan::Found(32));
        // Cut one byte short: the option runs past the area.
        assert_eq!(find_option(&a, TCP_OPTS_MAX - 1), Scan::Malformed);
        // Each step is what the datapath's loop runs.
        assert_eq!(option_step(&a, TCP_OPTS_MAX, 0), Step::Next(1));
        assert_eq!(option_step(&a, TCP_OPTS_MAX, 32), Step::Done(Scan::Found(32)));
        assert_eq!(option_step(&a, TCP_OPTS_MAX, 40), Step::Done(Scan::Absent));
        assert_eq!(
            option_step(&a, 200, 63),
            Step::Done(Scan::Absent),
            "end is capped"
        );
    }

    #[test]
    fn rates_round_down_and_common_line_rates_are_exact() {
        for gbit in [1u64, 10, 25, 40, 50, 100, 200, 400] {
            let r = gbit * 125_000_000;
            assert_eq!(decode_rate(encode_rate(r).unwrap()), Some(r), "{gbit} Gbit/s");
        }
        for mbit in [1u64, 20, 100, 4095] {
            let r = mbit * RATE_UNIT;
            assert_eq!(decode_rate(encode_rate(r).unwrap()), Some(r), "{mbit} Mbit/s");
        }
        // 4097 Mbit/s needs 13 bits: rounded down to 4096.
        assert_eq!(
            decode_rate(encode_rate(4097 * RATE_UNIT).unwrap()),
            Some(4096 * RATE_UNIT)
        );
        assert_eq!(encode_rate(RATE_UNIT - 1), None, "below 1 Mbit/s");
        assert_eq!(
            decode_rate(encode_rate(u64::MAX).unwrap()),
            Some(MAX_RATE),
            "saturates"
        );
        // Never above what was asked; below it by less than 1 Mbit/s or one part in 2048.
        for r in [123_456_789u64, 987_654_321_000, 3 * RATE_UNIT + 7] {
            let d = decode_rate(encode_rate(r).unwrap()).unwrap();
            assert!(d <= r && r - d < RATE_UNIT.max(r / 2048), "{r} -> {d}");
        }
    }

    #[test]
    fn an_advert_round_trips() {
        let a = Advert {
            senders: 64,
            line_rate: 1_250_000_000,
        };
        let b = a.encode().unwrap();
        assert_eq!(b, [253, 8, 0xDA, 0x5A, 0, 64, 0x29, 0xC4]);
        assert_eq!(Advert::decode(&b), Ok(a));
        assert_eq!(a.share(), 1_250_000_000 / 64);
        let many = Advert {
            senders: 100_000,
            line_rate: 125_000_000,
        };
        assert_eq!(
            Advert::decode(&many.encode().unwrap()).unwrap().senders,
            MAX_SENDERS
        );
        assert_eq!(Advert { senders: 0, ..a }.encode(), None);
    }

    #[test]
    fn malformed_options_are_refused_with_their_reason() {
        let good = encode(3, encode_rate(125_000_000).unwrap());
        let with = |i: usize, v: u8| {
            let mut b = good;
            b[i] = v;
            b
        };
        assert_eq!(Advert::decode(&with(0, 254)), Err(Malformed::Length));
        assert_eq!(Advert::decode(&with(1, 12)), Err(Malformed::Length));
        assert_eq!(Advert::decode(&with(3, 0x03)), Err(Malformed::Exid));
        assert_eq!(Advert::decode(&with(4, 0x80)), Err(Malformed::Reserved));
        assert_eq!(Advert::decode(&with(5, 0)), Err(Malformed::NoSenders));
        let mut no_rate = good;
        no_rate[6] = 0x30;
        no_rate[7] = 0;
        assert_eq!(Advert::decode(&no_rate), Err(Malformed::NoRate));
    }

    #[test]
    fn the_scan_finds_the_option_after_others_and_refuses_bad_ones() {
        let opt = encode(2, encode_rate(125_000_000).unwrap());
        // NOP NOP timestamps, then the option.
        let mut a = std::vec![1u8, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2];
        a.extend_from_slice(&opt);
        assert_eq!(find_option(&area(&a), a.len()), Scan::Found(12));
        assert_eq!(option_at(&area(&a), 12), Some(opt));
        // A D3 feedback option (another ExID) first.
        let mut b = std::vec![253u8, 12, 0xD3, 0x03, 0x10, 0, 0, 0, 0, 0, 0, 0];
        b.extend_from_slice(&opt);
        assert_eq!(find_option(&area(&b), b.len()), Scan::Found(12));
        // Only timestamps: absent.
        assert_eq!(find_option(&area(&a[..12]), 12), Scan::Absent);
        // Truncated: the option area ends inside the option.
        assert_eq!(find_option(&area(&a), 16), Scan::Malformed);
        // Our ExID with another length.
        let c = [253u8, 12, 0xDA, 0x5A, 0, 2, 0, 100, 0, 0, 0, 0];
        assert_eq!(find_option(&area(&c), 12), Scan::Malformed);
        // A length of 0 before it stops the walk (and is not ours).
        let d = [8u8, 0, 253, 8, 0xDA, 0x5A, 0, 1];
        assert_eq!(find_option(&area(&d), 8), Scan::Absent);
        // EOL ends the area.
        let mut e = std::vec![0u8, 0, 0, 0];
        e.extend_from_slice(&opt);
        assert_eq!(find_option(&area(&e), e.len()), Scan::Absent);
    }
}
