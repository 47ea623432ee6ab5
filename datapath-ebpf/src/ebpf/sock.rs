//! The tc program's per-socket fast path: a local socket's class (cached with the policy
//! generation, mark, DSCP and socket transmit hash it was computed for: `SockState`) and its
//! flow clock, in socket storage, so its packets skip classification and the flow table's hash
//! lookup. A TCP socket is one flow; a UDP socket is one only while it is connected and the
//! packet goes to its peer (a connected UDP socket may still `sendto` another address: such a
//! packet takes the flow table).

use core::ffi::c_void;

use aya_ebpf::{
    bindings::bpf_sock,
    btf_maps::SkStorage,
    helpers::{bpf_sk_fullsock, bpf_sk_storage_get},
    macros::btf_map,
    programs::TcContext,
};
use paceline_common::{abi::BPF_SK_STORAGE_GET_F_CREATE, classify::PacketInfo, maps::SockState};

#[btf_map]
static PL_SOCK: SkStorage<SockState> = SkStorage::new();

/// Read-only at load: 1 only in the benchmark's build, where BPF_PROG_TEST_RUN's socket is a
/// placeholder that is not TCP; the agent leaves it 0.
#[unsafe(no_mangle)]
static PL_ANY_SOCK: u32 = 0;

const IPPROTO_TCP: u32 = 6;
const IPPROTO_UDP: u32 = 17;
const SOCK_STREAM: u32 = 1;
const SOCK_DGRAM: u32 = 2;
/// `sk_state` of a connected UDP socket (it borrows TCP's state names).
const TCP_ESTABLISHED: u32 = 1;

/// The packet's full socket, if it has one (locally sent; not forwarded traffic, not a request
/// or time-wait socket).
#[inline(always)]
fn full_sock(ctx: &TcContext) -> Option<*mut bpf_sock> {
    // SAFETY: reading __sk_buff.sk; the helper checks the pointer it is given.
    unsafe {
        let sk = (*ctx.skb.skb).__bindgen_anon_2.sk;
        if sk.is_null() {
            return None;
        }
        let full = bpf_sk_fullsock(sk);
        (!full.is_null()).then_some(full)
    }
}

/// Whether a full socket is a TCP socket. A raw socket of protocol TCP (a packet generator's,
/// which writes any header) is not one: its packets take the flow table, each flow with its
/// own class.
#[inline(always)]
fn is_tcp(full: *mut bpf_sock) -> bool {
    // SAFETY: a full socket's `struct bpf_sock` fields may be read; volatile read of a
    // load-time constant.
    unsafe {
        ((*full).protocol == IPPROTO_TCP && (*full).type_ == SOCK_STREAM)
            || core::ptr::read_volatile(&PL_ANY_SOCK) != 0
    }
}

/// The packet's full TCP socket, if it has one (locally sent TCP).
#[inline(always)]
pub fn tcp_sock(ctx: &TcContext) -> Option<*mut c_void> {
    let full = full_sock(ctx)?;
    is_tcp(full).then_some(full.cast())
}

/// Whether a full socket is a connected UDP socket whose 5-tuple is the packet's (`p`, as the
/// parser read it: addresses in network order, IPv4 as an IPv4-mapped address; ports in host
/// order). A connected UDP socket may still `sendto` another address: such a packet is not
/// the socket's flow.
#[inline(always)]
fn is_udp_flow(full: *mut bpf_sock, p: &PacketInfo) -> bool {
    // SAFETY: a full socket's `struct bpf_sock` fields may be read.
    unsafe {
        let s = &*full;
        if s.protocol != IPPROTO_UDP
            || s.type_ != SOCK_DGRAM
            || s.state != TCP_ESTABLISHED
            || u16::from_be(s.dst_port) != p.dport
            || s.src_port != u32::from(p.sport)
        {
            return false;
        }
        if p.is_v6 == 0 {
            // A dual-stack socket connected to an IPv4 peer has its IPv4 addresses here too.
            s.dst_ip4 == p.dst[3] && s.src_ip4 == p.src[3]
        } else {
            (s.dst_ip6[0] ^ p.dst[0])
                | (s.dst_ip6[1] ^ p.dst[1])
                | (s.dst_ip6[2] ^ p.dst[2])
                | (s.dst_ip6[3] ^ p.dst[3])
                | (s.src_ip6[0] ^ p.src[0])
                | (s.src_ip6[1] ^ p.src[1])
                | (s.src_ip6[2] ^ p.src[2])
                | (s.src_ip6[3] ^ p.src[3])
                == 0
        }
    }
}

/// The packet's local socket when it is one flow with the packet: a full TCP socket, or a
/// connected UDP socket to the packet's peer (see [`is_udp_flow`]). Forwarded traffic has no
/// socket here, nor a container's once it crossed into this namespace.
#[inline(always)]
pub fn flow_sock(ctx: &TcContext, p: &PacketInfo) -> Option<*mut c_void> {
    match u32::from(p.proto) {
        IPPROTO_TCP => tcp_sock(ctx),
        IPPROTO_UDP => {
            let full = full_sock(ctx)?;
            is_udp_flow(full, p).then_some(full.cast())
        }
        _ => None,
    }
}

/// The socket's state; `create` makes a zeroed one when there is none.
#[inline(always)]
pub fn state(sk: *mut c_void, create: bool) -> Option<&'static mut SockState> {
    let flags = if create { BPF_SK_STORAGE_GET_F_CREATE } else { 0 };
    // SAFETY: the map pointer is the BTF map itself; `sk` came from bpf_sk_fullsock.
    let p = unsafe {
        bpf_sk_storage_get(
            core::ptr::addr_of!(PL_SOCK) as *mut c_void,
            sk,
            core::ptr::null_mut(),
            flags,
        )
    };
    // SAFETY: a socket storage value of this map's type, valid for this program run.
    (!p.is_null()).then(|| unsafe { &mut *p.cast::<SockState>() })
}
