//! A mirror of the kernel's `struct __sk_buff` (include/uapi/linux/bpf.h) for
//! BPF_PROG_TEST_RUN's `ctx_in`/`ctx_out`: aya 0.14 exposes test runs but not this struct.
//!
//! The kernel accepts only some fields in `ctx_in` (mark, priority, ifindex, cb, tstamp,
//! wire_len, gso_segs, gso_size, hwtstamp) and rejects a context with others set; it writes the
//! same fields back to `ctx_out`.

use std::mem::{offset_of, size_of};

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SkBuff {
    pub len: u32,
    pub pkt_type: u32,
    pub mark: u32,
    pub queue_mapping: u32,
    pub protocol: u32,
    pub vlan_present: u32,
    pub vlan_tci: u32,
    pub vlan_proto: u32,
    pub priority: u32,
    pub ingress_ifindex: u32,
    pub ifindex: u32,
    pub tc_index: u32,
    pub cb: [u32; 5],
    pub hash: u32,
    pub tc_classid: u32,
    pub data: u32,
    pub data_end: u32,
    pub napi_id: u32,
    pub family: u32,
    pub remote_ip4: u32,
    pub local_ip4: u32,
    pub remote_ip6: [u32; 4],
    pub local_ip6: [u32; 4],
    pub remote_port: u32,
    pub local_port: u32,
    pub data_meta: u32,
    pub flow_keys: u64,
    pub tstamp: u64,
    pub wire_len: u32,
    pub gso_segs: u32,
    pub sk: u64,
    pub gso_size: u32,
    pub tstamp_type: u8,
    pub _pad1: [u8; 3],
    pub hwtstamp: u64,
}

// The layout of the uapi header, checked field by field where it matters.
const _: () = assert!(size_of::<SkBuff>() == 192);
const _: () = assert!(offset_of!(SkBuff, mark) == 8);
const _: () = assert!(offset_of!(SkBuff, priority) == 32);
const _: () = assert!(offset_of!(SkBuff, ifindex) == 40);
const _: () = assert!(offset_of!(SkBuff, cb) == 48);
const _: () = assert!(offset_of!(SkBuff, data_meta) == 140);
const _: () = assert!(offset_of!(SkBuff, flow_keys) == 144);
const _: () = assert!(offset_of!(SkBuff, tstamp) == 152);
const _: () = assert!(offset_of!(SkBuff, wire_len) == 160);
const _: () = assert!(offset_of!(SkBuff, sk) == 168);
const _: () = assert!(offset_of!(SkBuff, gso_size) == 176);
const _: () = assert!(offset_of!(SkBuff, tstamp_type) == 180);
const _: () = assert!(offset_of!(SkBuff, hwtstamp) == 184);

impl SkBuff {
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: repr(C), integers only, explicit padding.
        unsafe { std::slice::from_raw_parts((self as *const Self).cast::<u8>(), size_of::<Self>()) }
    }

    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above; every bit pattern is a valid SkBuff.
        unsafe { std::slice::from_raw_parts_mut((self as *mut Self).cast::<u8>(), size_of::<Self>()) }
    }
}

/// CLOCK_MONOTONIC in ns: the clock of `bpf_ktime_get_ns()` and of EDT timestamps.
pub fn mono_now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// BPF_PROG_TEST_RUN of a tc program by its descriptor, `repeat` times over `frame`, from any
/// thread (aya's `TestRun` needs the program object, which the datapath's owner holds): the
/// program's last return value. Runs on the calling thread's CPU.
pub fn test_run_fd(prog: std::os::fd::BorrowedFd<'_>, frame: &[u8], repeat: u32) -> std::io::Result<u32> {
    use std::os::fd::AsRawFd as _;
    /// The `test` member of `union bpf_attr` (include/uapi/linux/bpf.h).
    #[repr(C)]
    #[derive(Default)]
    struct TestAttr {
        prog_fd: u32,
        retval: u32,
        data_size_in: u32,
        data_size_out: u32,
        data_in: u64,
        data_out: u64,
        repeat: u32,
        duration: u32,
        ctx_size_in: u32,
        ctx_size_out: u32,
        ctx_in: u64,
        ctx_out: u64,
        flags: u32,
        cpu: u32,
        batch_size: u32,
        _pad: u32,
    }
    const BPF_PROG_TEST_RUN: libc::c_long = 10;
    let mut attr = TestAttr {
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in: frame.len() as u32,
        data_in: frame.as_ptr() as u64,
        repeat,
        ..TestAttr::default()
    };
    // SAFETY: `attr` is a valid bpf_attr prefix of its own size; `frame` outlives the call and
    // the kernel only reads it (no output buffers are given).
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            &mut attr as *mut TestAttr,
            size_of::<TestAttr>() as libc::c_uint,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(attr.retval)
}
