//! TCP socket helpers shared by the sock_ops callbacks: `sockops` sets a class's options when a
//! connection is established, `d3host` paces a D3 sender at its grant, `dasr` keys its flows
//! by their addresses and ports. Socket option numbers, the callback flags (defined here once
//! for `d3host` and `dasr`), a `bpf_setsockopt` wrapper for 4-byte options, and the conversion
//! of paceline's wire rates into the payload rate TCP paces at.

use core::ffi::c_void;

use aya_ebpf::{bindings::bpf_sock_ops, helpers::bpf_setsockopt, programs::SockOpsContext};
use paceline_common::edt::tcp_frame_overhead;

pub const AF_INET6: u32 = 10;
pub const SOL_SOCKET: i32 = 1;
pub const SO_MAX_PACING_RATE: i32 = 47;
pub const SOL_TCP: i32 = 6;
pub const TCP_BPF_IW: i32 = 1001;
pub const TCP_BPF_DELACK_MAX: i32 = 1003;
pub const TCP_BPF_RTO_MIN: i32 = 1004;
pub const SOL_IP: i32 = 0;
pub const IP_TOS: i32 = 1;
pub const SOL_IPV6: i32 = 41;
pub const IPV6_TCLASS: i32 = 67;

/// sock_ops callback flags (`BPF_SOCK_OPS_*_CB_FLAG`): which callbacks a socket asks for.
pub const CB_STATE: i32 = 1 << 2;
pub const CB_RTT: i32 = 1 << 3;
pub const CB_PARSE_UNKNOWN_HDR_OPT: i32 = 1 << 5;
pub const CB_WRITE_HDR_OPT: i32 = 1 << 6;
/// HDR_OPT_LEN's argument: the kernel asks for the space to reserve while computing the MSS
/// (nothing is written then).
pub const BPF_WRITE_HDR_TCP_CURRENT_MSS: u32 = 1;

/// Asks for the callbacks `add` on this socket, besides those it has.
#[inline(always)]
pub fn set_flags(ctx: &SockOpsContext, add: i32) {
    let _ = ctx.set_cb_flags(ctx.cb_flags() as i32 | add);
}

/// Sets a 4-byte socket option; true when the kernel took it.
#[inline(always)]
pub fn setsockopt_u32(ops: *mut bpf_sock_ops, level: i32, name: i32, val: u32) -> bool {
    let mut v = val;
    // SAFETY: `ops` is the program's context; `v` is a live 4-byte value.
    unsafe { bpf_setsockopt(ops.cast(), level, name, (&mut v as *mut u32).cast::<c_void>(), 4) == 0 }
}

/// SO_MAX_PACING_RATE's value for a payload rate of `payload_rate` bytes/s: the kernel takes a
/// 4-byte rate in bytes/s here; larger rates saturate (~34 Gbit/s).
#[inline(always)]
pub fn pacing_rate_arg(payload_rate: u64) -> u32 {
    if payload_rate > u32::MAX as u64 {
        u32::MAX
    } else {
        payload_rate as u32
    }
}

/// Caps TCP's own pacing at `payload_rate` bytes/s (SO_MAX_PACING_RATE); true when the kernel
/// took it.
#[inline(always)]
pub fn set_max_pacing_rate(ops: *mut bpf_sock_ops, payload_rate: u64) -> bool {
    setsockopt_u32(ops, SOL_SOCKET, SO_MAX_PACING_RATE, pacing_rate_arg(payload_rate))
}

/// The payload rate TCP must pace at for its frames to leave at `wire_rate` (bytes/s): TCP's
/// pacing counts segment payload, while paceline's rates (and fq's EDT clocks) count whole
/// frames: `tcp_frame_overhead` bytes of headers on top of each `mss`.
#[inline(always)]
pub fn payload_rate(wire_rate: u64, mss: u32, v6: bool) -> u64 {
    let hdr = tcp_frame_overhead(v6);
    let mss = mss as u64;
    if mss == 0 {
        wire_rate
    } else {
        wire_rate * mss / (mss + hdr)
    }
}

/// `bpf_sock_ops.remote_port` holds the port in network byte order; little-endian kernels put
/// it in the upper 16 bits of the 32-bit field (the context rewrite shifts it), so take
/// whichever half is set.
#[inline(always)]
pub fn remote_port(raw: u32) -> u16 {
    let be = if raw >> 16 != 0 {
        (raw >> 16) as u16
    } else {
        raw as u16
    };
    u16::from_be(be)
}

/// Reads an IPv6 address from the context one word at a time: the verifier only allows context
/// loads at constant offsets from the context pointer, and a plain array copy may be compiled
/// into loads through a derived pointer.
#[inline(always)]
pub unsafe fn ip6(a: *const [u32; 4]) -> [u32; 4] {
    let w = a.cast::<u32>();
    // SAFETY: caller passes a pointer into the context; each read is a fixed-offset u32 load.
    unsafe {
        [
            w.read_volatile(),
            w.add(1).read_volatile(),
            w.add(2).read_volatile(),
            w.add(3).read_volatile(),
        ]
    }
}
