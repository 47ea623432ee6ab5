//! # paceline benchmark programs
//!
//! A second eBPF object, `paceline-ebpf-bench`, that only the datapath benchmark (`plbench
//! datapath` in `paceline-lab`) loads; the agent never does, so production loads only
//! production code. Its programs: the benchmark's floor, the cost of reading the clock, and a
//! reference that does what Cilium's bandwidth manager does per packet, so paceline's path is
//! compared with it in the same run.
//!
//! Compiled for the bpf target only; on the host this binary is an empty `main`.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[cfg(target_arch = "bpf")]
mod progs {
    use aya_ebpf::{
        bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC},
        helpers::bpf_ktime_get_ns,
        macros::{classifier, map},
        maps::HashMap,
        programs::TcContext,
    };
    use paceline_common::{edt::NSEC_PER_SEC, maps::BenchEdt};

    /// An empty classifier: the benchmark's floor (the cost of BPF_PROG_TEST_RUN itself and of a
    /// program call).
    #[classifier]
    pub fn pl_tc_floor(_ctx: TcContext) -> i32 {
        TC_ACT_UNSPEC
    }

    /// Reads the clock and returns: the cost of `bpf_ktime_get_ns` on this machine.
    #[classifier]
    pub fn pl_tc_clock(_ctx: TcContext) -> i32 {
        // SAFETY: helper without arguments.
        let t = unsafe { bpf_ktime_get_ns() };
        if t == 0 { TC_ACT_SHOT } else { TC_ACT_UNSPEC }
    }

    /// The reference's aggregates, keyed by an aggregate id (the benchmark uses `skb->mark`;
    /// Cilium takes the endpoint id that an earlier program left in the packet's metadata).
    #[map(name = "PL_BENCH_EDT")]
    static BENCH_EDT: HashMap<u64, BenchEdt> = HashMap::with_max_entries(16, 0);

    /// The published EDT algorithm of Cilium's bandwidth manager, written for the benchmark: an
    /// IP frame's ethertype read by direct packet access, its aggregate looked up in a hash map,
    /// the clock read, the departure computed from the aggregate's last departure and rate
    /// (dropped past the horizon), `skb->tstamp` written. One hash lookup, one clock read, no
    /// classification.
    #[classifier]
    pub fn pl_tc_ref_edt(ctx: TcContext) -> i32 {
        // Direct packet access, as Cilium's validate_ethertype reads it (not a helper call).
        let (data, end) = (ctx.data(), ctx.data_end());
        if data + 14 > end {
            return TC_ACT_UNSPEC;
        }
        // SAFETY: bytes 12 and 13 lie within the bounds checked above.
        let ethertype = unsafe { *((data + 12) as *const [u8; 2]) };
        if ethertype != [0x08, 0x00] && ethertype != [0x86, 0xdd] {
            return TC_ACT_UNSPEC;
        }
        let skb = ctx.skb.skb;
        // SAFETY: reading __sk_buff fields allowed for tc programs.
        let id = unsafe { (*skb).mark } as u64;
        let Some(info) = BENCH_EDT.get_ptr_mut(&id) else {
            return TC_ACT_UNSPEC;
        };
        // SAFETY: helper without arguments; the map value pointer is valid for this run.
        unsafe {
            let now = bpf_ktime_get_ns();
            let stack = (*skb).tstamp;
            let t = if stack > now { stack } else { now };
            let delay = (ctx.len() as u64 * NSEC_PER_SEC)
                .checked_div((*info).bps)
                .unwrap_or(0);
            let next = core::ptr::read_volatile(&(*info).t_last) + delay;
            if next <= t {
                core::ptr::write_volatile(&mut (*info).t_last, t);
                return TC_ACT_UNSPEC;
            }
            if next - now >= (*info).horizon_ns {
                return TC_ACT_SHOT;
            }
            core::ptr::write_volatile(&mut (*info).t_last, next);
            (*skb).tstamp = next;
        }
        TC_ACT_UNSPEC
    }
}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
