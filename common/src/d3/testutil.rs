//! Helpers shared by the D3 tests.

use super::*;

/// 1 Gbit/s in bytes/s.
pub const GBPS: u64 = 125_000_000;
/// Unit at scale 8 (what a non-deadline flow on a 1G host uses): 524_288 B/s.
pub const U8: u64 = 524_288;

pub fn cfg_1g() -> D3LinkConfig {
    D3LinkConfig::for_line_rate(GBPS)
}

pub fn request(flags: u8, scale: u8, desired: u8) -> D3Request {
    D3Request {
        flags,
        scale,
        desired,
        ..D3Request::EMPTY
    }
}

/// The request a flow sends after `prev` was answered with `grant_units` at `hop`.
pub fn follow_up(prev: &D3Request, grant_units: u8, desired: u8) -> D3Request {
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

pub fn input(bytes_left: u64, time_left_ns: i64) -> HostInput {
    HostInput {
        has_deadline: true,
        bytes_left,
        time_left_ns,
        line_rate: GBPS,
        fin: false,
    }
}
