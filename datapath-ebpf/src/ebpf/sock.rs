//! The tc program's per-socket fast path: a local TCP socket's class (cached with the policy
//! generation, mark and DSCP it was computed for) and its flow clock, in socket storage, so its
//! packets skip classification and the flow table's hash lookup.

use core::ffi::c_void;

use aya_ebpf::{
    btf_maps::SkStorage,
    helpers::{bpf_sk_fullsock, bpf_sk_storage_get},
    macros::btf_map,
    programs::TcContext,
};
use paceline_common::abi::BPF_SK_STORAGE_GET_F_CREATE;
use paceline_common::maps::SockState;

#[btf_map]
static PL_SOCK: SkStorage<SockState> = SkStorage::new();

/// Read-only at load: 1 only in the benchmark's build, where BPF_PROG_TEST_RUN's socket is a
/// placeholder that is not TCP; the agent leaves it 0.
#[unsafe(no_mangle)]
static PL_ANY_SOCK: u32 = 0;

const IPPROTO_TCP: u32 = 6;

/// The packet's full TCP socket, if it has one (locally sent TCP; not forwarded traffic, not a
/// request socket).
#[inline(always)]
pub fn tcp_sock(ctx: &TcContext) -> Option<*mut c_void> {
    // SAFETY: reading __sk_buff.sk; the helper checks the pointer it is given.
    unsafe {
        let sk = (*ctx.skb.skb).__bindgen_anon_2.sk;
        if sk.is_null() {
            return None;
        }
        let full = bpf_sk_fullsock(sk);
        if full.is_null() {
            return None;
        }
        if (*full).protocol != IPPROTO_TCP && core::ptr::read_volatile(&PL_ANY_SOCK) == 0 {
            return None;
        }
        Some(full.cast())
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
