//! The D3 option inside a TCP segment: finding it in the option area, copying it out and back,
//! and fixing the TCP checksum incrementally after a router rewrote it.

use super::wire::{EXID_HI, EXID_LO, FB_LEN, REQ_LEN, TCP_OPTS_MAX, TCPOPT_EXP};

/// Where a D3 option sits in a TCP option area.
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub struct FoundOption {
    /// Offset of the kind byte from the start of the option area (add
    /// [`TCP_OPTS_OFFSET`](super::TCP_OPTS_OFFSET) for the offset from the TCP header; its
    /// parity is the `odd` of [`csum_replace`]).
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

/// A 32-bit one's-complement sum (or a `bpf_csum_diff` result) folded to 16 bits: the carries
/// added back twice, which folds any `u32` completely.
#[inline]
pub const fn fold(s: u32) -> u16 {
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
}
