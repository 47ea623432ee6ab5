//! D3 on end hosts, in sock_ops (docs/d3.md): senders stamp a rate request once per RTT on a
//! single-segment packet (header-option callbacks), pace at the smallest grant echoed back, and
//! return their allocation with a FIN request when a transfer completes; receivers echo the
//! allocations of the requests they get in their next ACK. Completion is checked against the
//! deadline on every ACK (met / missed counted per class).
//!
//! Sizes and deadlines come from the application (an app-owned socket-storage map the agent
//! pins, `D3App`) or from the class's defaults. The math and the wire format are
//! `paceline_common::d3`.

use core::ffi::c_void;

use aya_ebpf::{
    btf_maps::SkStorage,
    helpers::{
        bpf_ktime_get_ns, bpf_load_hdr_opt, bpf_reserve_hdr_opt, bpf_sk_storage_get, bpf_store_hdr_opt,
    },
    macros::{btf_map, map},
    maps::PerCpuArray,
    programs::SockOpsContext,
};
use paceline_common::{
    abi::BPF_SK_STORAGE_GET_F_CREATE,
    d3::{self, D3Feedback, D3FlowState, FB_LEN, HostInput, REQ_LEN},
    edt::tcp_frame_overhead,
    maps::{
        CLASS_D3, ClassConfig, D3App, D3ClassStats, D3S_DEADLINE, D3S_DONE, D3S_FB_PENDING, D3S_FIN_DUE,
        D3S_MISSED, D3S_REQ_DUE, D3S_RETURNED, D3S_SENDER, D3Sock, MAX_CLASSES, PolicyTable,
        TABLE_D3_RECEIVER, d3_hist_bucket,
    },
};

use super::tcp::{
    self, BPF_WRITE_HDR_TCP_CURRENT_MSS, CB_PARSE_UNKNOWN_HDR_OPT, CB_RTT, CB_STATE, CB_WRITE_HDR_OPT,
    set_flags,
};

#[btf_map]
static PL_D3_SOCK: SkStorage<D3Sock> = SkStorage::new();

#[btf_map]
static PL_D3_APP: SkStorage<D3App> = SkStorage::new();

#[map(name = "PL_D3_STATS")]
static PL_D3_STATS: PerCpuArray<D3ClassStats> = PerCpuArray::with_max_entries(MAX_CLASSES as u32, 0);

const TCP_FIN_WAIT1: u32 = 4;
const TCP_LAST_ACK: u32 = 9;
/// Feedback rides the receiver's next ACK, which a delayed ACK can hold for up to 40 ms.
const LOST_FEEDBACK_NS: u64 = 50_000_000;

#[inline(always)]
fn sk(ctx: &SockOpsContext) -> *mut c_void {
    // SAFETY: reading the program's own context.
    unsafe { (*ctx.ops).__bindgen_anon_2.sk.cast() }
}

#[inline(always)]
fn now() -> u64 {
    // SAFETY: helper without arguments.
    unsafe { bpf_ktime_get_ns() }
}

/// This socket's D3 state; `create` makes an empty one when there is none.
#[inline(always)]
fn state(ctx: &SockOpsContext, create: bool) -> Option<&'static mut D3Sock> {
    let sk = sk(ctx);
    if sk.is_null() {
        return None;
    }
    let flags = if create { BPF_SK_STORAGE_GET_F_CREATE } else { 0 };
    // SAFETY: the map pointer is the BTF map itself; sk is the context's full socket.
    let p = unsafe {
        bpf_sk_storage_get(
            core::ptr::addr_of!(PL_D3_SOCK) as *mut c_void,
            sk,
            core::ptr::null_mut(),
            flags,
        )
    };
    if p.is_null() {
        None
    } else {
        Some(unsafe { &mut *p.cast::<D3Sock>() })
    }
}

/// The pacing rate D3 last applied to the full socket `sk` (bytes/s; 0: none), for the tc
/// program's trace records.
#[inline(always)]
pub fn applied_rate(sk: *mut c_void) -> u64 {
    // SAFETY: as above, without creating; `sk` came from bpf_sk_fullsock.
    let p = unsafe {
        bpf_sk_storage_get(
            core::ptr::addr_of!(PL_D3_SOCK) as *mut c_void,
            sk,
            core::ptr::null_mut(),
            0,
        )
    };
    if p.is_null() {
        0
    } else {
        // SAFETY: a socket storage value of this map's type, valid for this program run.
        unsafe { (*p.cast::<D3Sock>()).applied_rate }
    }
}

#[inline(always)]
fn app(ctx: &SockOpsContext) -> Option<D3App> {
    let sk = sk(ctx);
    if sk.is_null() {
        return None;
    }
    // SAFETY: as above, without creating.
    let p = unsafe {
        bpf_sk_storage_get(
            core::ptr::addr_of!(PL_D3_APP) as *mut c_void,
            sk,
            core::ptr::null_mut(),
            0,
        )
    };
    if p.is_null() {
        None
    } else {
        Some(unsafe { *p.cast::<D3App>() })
    }
}

#[inline(always)]
fn stats(class: u32) -> Option<&'static mut D3ClassStats> {
    // SAFETY: per-CPU slot; preemption is disabled while the program runs.
    PL_D3_STATS
        .get_ptr_mut(class & (MAX_CLASSES as u32 - 1))
        .map(|p| unsafe { &mut *p })
}

/// Bytes this socket has handed to the network so far (acked + in flight).
#[inline(always)]
fn bytes_sent(ctx: &SockOpsContext) -> u64 {
    // SAFETY: reading the program's own context.
    let (acked, nxt, una) = unsafe { ((*ctx.ops).bytes_acked, (*ctx.ops).snd_nxt, (*ctx.ops).snd_una) };
    acked + nxt.wrapping_sub(una) as u64
}

#[inline(always)]
fn acked(ctx: &SockOpsContext) -> u64 {
    // SAFETY: reading the program's own context.
    unsafe { (*ctx.ops).bytes_acked }
}

/// Starts a transfer of `size` bytes due by `deadline_ns` (0/0: no deadline).
#[inline(always)]
fn start_transfer(st: &mut D3Sock, base: u64, size: u64, deadline_ns: u64) {
    st.size = size;
    st.deadline_ns = deadline_ns;
    st.base_acked = base;
    st.flags &= !(D3S_DONE | D3S_MISSED | D3S_DEADLINE | D3S_RETURNED);
    if let Some(s) = stats(st.class) {
        s.flows += 1;
        if size != 0 && deadline_ns != 0 {
            s.deadline_flows += 1;
        }
    }
    if size != 0 && deadline_ns != 0 {
        st.flags |= D3S_DEADLINE;
    }
}

/// Sets the socket's pacing to `wire_rate` (bytes/s on the wire), as TCP's payload rate.
#[inline(always)]
fn pace(ctx: &SockOpsContext, st: &mut D3Sock, wire_rate: u64) {
    if st.applied_rate == wire_rate {
        return;
    }
    // SAFETY: reading the program's own context.
    let (mss, v6) = unsafe { ((*ctx.ops).mss_cache, (*ctx.ops).family == tcp::AF_INET6) };
    // A payload rate that rounds to 0 is set as 1 byte/s.
    let r = tcp::payload_rate(wire_rate, mss, v6).max(1);
    if tcp::set_max_pacing_rate(ctx.ops, r) {
        st.applied_rate = wire_rate;
    }
}

/// One segment of this socket on the wire, and its smoothed RTT (ns).
#[inline(always)]
fn segment_and_srtt(ctx: &SockOpsContext) -> (u64, u64) {
    // SAFETY: reading the program's own context.
    let (mss, v6, srtt_us) = unsafe {
        (
            (*ctx.ops).mss_cache,
            (*ctx.ops).family == tcp::AF_INET6,
            (*ctx.ops).srtt_us >> 3,
        )
    };
    (mss as u64 + tcp_frame_overhead(v6), srtt_us as u64 * 1000)
}

/// The pacing rate of a flow that has no grant yet: the policy's `first_rtt_rate`, or
/// (unset) one segment per RTT: the request goes out and the next packet leaves about when
/// the grant is back. TCP fixes a packet's successor's departure (len / rate) when it sends
/// it, so a slower rate here would hold the flow back after a higher grant arrived.
#[inline(always)]
fn first_rate(ctx: &SockOpsContext, table: &PolicyTable) -> u64 {
    if table.d3_first_rate != 0 {
        return table.d3_first_rate;
    }
    let (segment, srtt) = segment_and_srtt(ctx);
    d3::pause_rate(0, segment, srtt)
}

/// At ESTABLISHED: a D3 class's socket becomes a sender; with D3 receiving on, every socket
/// listens for requests (the parse callback runs only for packets with unknown options).
#[inline(always)]
pub fn on_established(ctx: &SockOpsContext, table: &PolicyTable, class_idx: u32, class: &ClassConfig) {
    if table.flags & TABLE_D3_RECEIVER != 0 {
        set_flags(ctx, CB_PARSE_UNKNOWN_HDR_OPT);
        // The ACK that completed the handshake may carry the first request: the parse
        // callback was not on yet when it arrived, but its options are readable here.
        if ctx.op() == aya_ebpf::bindings::BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB {
            on_parse_hdr_opt(ctx, table);
        }
    }
    if class.flags & CLASS_D3 == 0 {
        return;
    }
    let Some(st) = state(ctx, true) else { return };
    st.flow = D3FlowState::new(table.d3_first_rate);
    st.flags = D3S_SENDER;
    st.class = class_idx;
    st.applied_rate = 0;
    st.last_req_ns = 0;
    let t = now();
    let base = bytes_sent(ctx);
    match app(ctx) {
        Some(a) if a.generation != 0 => {
            st.app_generation = a.generation;
            start_transfer(st, base, a.size, a.deadline_ns);
        }
        _ if class.d3_deadline_us != 0 => {
            start_transfer(st, base, class.d3_size, t + class.d3_deadline_us as u64 * 1000)
        }
        _ => start_transfer(st, base, 0, 0),
    }
    // The first RTT of a fresh connection: TCP sends its initial window unpaced, so it is
    // what a grant cannot hold back. Refused once data has gone out (a later transfer).
    if table.d3_initial_window != 0 {
        tcp::setsockopt_u32(ctx.ops, tcp::SOL_TCP, tcp::TCP_BPF_IW, table.d3_initial_window);
    }
    // Until the first grant: the first-RTT rate, or one segment per RTT.
    let r = first_rate(ctx, table);
    pace(ctx, st, r);
    set_flags(
        ctx,
        CB_PARSE_UNKNOWN_HDR_OPT | CB_WRITE_HDR_OPT | CB_RTT | CB_STATE,
    );
}

/// HDR_OPT_LEN: reserve room for a request that is due and for feedback that is pending.
#[inline(always)]
pub fn on_hdr_opt_len(ctx: &SockOpsContext, table: &PolicyTable) {
    let Some(st) = state(ctx, false) else { return };
    if ctx.arg(0) & BPF_WRITE_HDR_TCP_CURRENT_MSS != 0 {
        // The kernel sizes the MSS: reserve the most this socket writes at once (one option
        // per segment: the kernel refuses a second one with the same kind and magic).
        let mut max = 0;
        if table.flags & TABLE_D3_RECEIVER != 0 {
            max = FB_LEN as u32;
        }
        if st.flags & D3S_SENDER != 0 {
            max = REQ_LEN as u32;
        }
        if max != 0 {
            // SAFETY: the program's own context.
            unsafe { bpf_reserve_hdr_opt(ctx.ops, max, 0) };
        }
        return;
    }
    let mut len = 0u32;
    if st.flags & D3S_FB_PENDING != 0 {
        len += FB_LEN as u32;
    }
    let mut want_req = false;
    if st.flags & D3S_SENDER != 0 {
        let t = now();
        // A new transfer announced by the application (a new response, a new deadline).
        if let Some(a) = app(ctx) {
            if a.generation != 0 && a.generation != st.app_generation {
                st.app_generation = a.generation;
                start_transfer(st, bytes_sent(ctx), a.size, a.deadline_ns);
            }
        }
        // SAFETY: reading the program's own context.
        let (srtt_us, skb_len) = unsafe { ((*ctx.ops).srtt_us >> 3, (*ctx.ops).skb_len) };
        // The segment that sends the transfer's last byte returns the allocation: after it,
        // the flow needs no rate (and may have no segment left to say so).
        if st.flags & (D3S_DEADLINE | D3S_FIN_DUE) == D3S_DEADLINE
            && st.flow.state & d3::FLOW_STARTED != 0
            && (bytes_sent(ctx) + skb_len as u64).saturating_sub(st.base_acked) >= st.size
        {
            st.flags |= D3S_FIN_DUE;
        }
        let rtt = (srtt_us as u64 * 1000).max(d3::MIN_REQUEST_RTT_NS);
        let since = t.saturating_sub(st.last_req_ns);
        let due = if st.flags & D3S_FIN_DUE != 0 {
            // Routers return what they recorded for the flow, so the FIN need not wait for
            // the outstanding feedback.
            st.flow.state & d3::FLOW_STARTED != 0
        } else if st.flags & (D3S_DONE | D3S_RETURNED) != 0 {
            false
        } else if st.flow.awaiting_feedback() {
            // The feedback was lost (or the receiver does not speak D3): ask again. Not before
            // a delayed ACK could have carried it.
            since >= (4 * rtt).max(LOST_FEEDBACK_NS)
        } else {
            since >= rtt
        };
        // Not on a segment that already carries feedback (one option of a kind and magic per
        // segment). A TSO/GSO packet copies the request into each of its segments: routers
        // recognise the copies (same flow, same bytes, within a millisecond) and count one.
        want_req = due && len == 0;
    }
    if want_req {
        len += REQ_LEN as u32;
    }
    if len == 0 {
        return;
    }
    // SAFETY: the program's own context.
    if unsafe { bpf_reserve_hdr_opt(ctx.ops, len, 0) } != 0 {
        return;
    }
    if want_req {
        build_request(ctx, table, st);
    }
}

#[inline(always)]
fn build_request(ctx: &SockOpsContext, table: &PolicyTable, st: &mut D3Sock) {
    let t = now();
    // SAFETY: reading the program's own context.
    let srtt_ns = unsafe { ((*ctx.ops).srtt_us >> 3) as u64 * 1000 };
    let fin = st.flags & D3S_FIN_DUE != 0;
    let sent = acked(ctx).saturating_sub(st.base_acked);
    let has_deadline = st.flags & D3S_DEADLINE != 0 && st.flags & D3S_DONE == 0;
    // The grant takes effect about one RTT from now.
    let time_left = if has_deadline {
        st.deadline_ns as i64 - t as i64 - srtt_ns as i64
    } else {
        0
    };
    let inp = HostInput {
        has_deadline,
        bytes_left: st.size.saturating_sub(sent),
        time_left_ns: time_left,
        line_rate: table.d3_line_rate,
        fin,
    };
    let Some(hr) = st.flow.next_request(&inp) else {
        return;
    };
    st.req = hr.req.encode();
    st.flags |= D3S_REQ_DUE;
    if let Some(s) = stats(st.class) {
        s.requests += 1;
        if hr.outcome & d3::HOST_QUENCHED_NOW != 0 {
            s.quenched += 1;
        }
        if let Some(b) = s.requested.get_mut(d3_hist_bucket(hr.desired_rate)) {
            *b += 1;
        }
    }
}

/// WRITE_HDR_OPT: write what HDR_OPT_LEN prepared.
#[inline(always)]
pub fn on_write_hdr_opt(ctx: &SockOpsContext, table: &PolicyTable) {
    let Some(st) = state(ctx, false) else { return };
    if st.flags & D3S_REQ_DUE != 0 {
        st.flags &= !D3S_REQ_DUE;
        let mut req = st.req;
        // SAFETY: the program's own context and a live buffer of REQ_LEN bytes.
        unsafe { bpf_store_hdr_opt(ctx.ops, req.as_mut_ptr().cast(), REQ_LEN as u32, 0) };
        st.last_req_ns = now();
        if st.flags & D3S_FIN_DUE != 0 {
            // The allocation is returned: the connection's next transfer starts a new flow, at
            // the first-RTT rate until its first grant.
            st.flags = (st.flags & !D3S_FIN_DUE) | D3S_RETURNED;
            st.flow = D3FlowState::new(table.d3_first_rate);
            let r = first_rate(ctx, table);
            pace(ctx, st, r);
        }
    }
    if st.flags & D3S_FB_PENDING != 0 {
        st.flags &= !D3S_FB_PENDING;
        let mut fb = st.fb;
        // SAFETY: as above with FB_LEN bytes.
        unsafe { bpf_store_hdr_opt(ctx.ops, fb.as_mut_ptr().cast(), FB_LEN as u32, 0) };
        if let Some(s) = stats(st.class) {
            s.echoes += 1;
        }
    }
}

/// PARSE_HDR_OPT (a received segment has an option the kernel does not know): feedback for a
/// sender, a request for a receiver.
#[inline(always)]
pub fn on_parse_hdr_opt(ctx: &SockOpsContext, table: &PolicyTable) {
    // The search key of an experimental option is its kind, the kind-length of the magic (4
    // for a 16-bit ExID) and the magic; the option found (request or feedback, a segment
    // carries at most one) is copied over the key.
    let mut buf = [0u8; REQ_LEN];
    buf[0] = d3::TCPOPT_EXP;
    buf[1] = 4;
    buf[2] = d3::EXID_HI;
    buf[3] = d3::EXID_LO;
    // SAFETY: the program's own context; buf holds the search key and receives the option.
    let n = unsafe { bpf_load_hdr_opt(ctx.ops, buf.as_mut_ptr().cast(), REQ_LEN as u32, 0) };
    if n > 0 {
        if let Some(s) = state(ctx, false).and_then(|st| stats(st.class)) {
            s.options_seen += 1;
        }
    }
    if n == FB_LEN as i64 && buf[d3::OFF_LEN] == FB_LEN as u8 {
        let mut fb_bytes = [0u8; FB_LEN];
        let mut i = 0;
        while i < FB_LEN {
            fb_bytes[i] = buf[i];
            i += 1;
        }
        let (Some(st), Ok(fb)) = (state(ctx, false), D3Feedback::decode(&fb_bytes)) else {
            return;
        };
        if st.flags & D3S_SENDER == 0 {
            return;
        }
        match st.flow.apply_feedback(&fb) {
            Some(rate) => {
                // A grant of 0 means "pause": one segment (carrying the next request) per RTT.
                let (segment, srtt) = segment_and_srtt(ctx);
                let pause = d3::pause_rate(table.d3_first_rate, segment, srtt);
                pace(ctx, st, d3::paced_rate(rate, pause));
                if let Some(s) = stats(st.class) {
                    s.grants += 1;
                    if let Some(b) = s.granted.get_mut(d3_hist_bucket(rate)) {
                        *b += 1;
                    }
                }
            }
            None => {
                if let Some(s) = stats(st.class) {
                    s.feedback_ignored += 1;
                }
            }
        }
        return;
    }
    if n != REQ_LEN as i64 || buf[d3::OFF_LEN] != REQ_LEN as u8 || table.flags & TABLE_D3_RECEIVER == 0 {
        return;
    }
    let Some(fb) = d3::feedback_for(&buf) else { return };
    let Some(st) = state(ctx, true) else { return };
    // Every segment of a TSO/GSO packet carries the same request: echo it once.
    let mut d = 0u8;
    let mut i = 0;
    while i < REQ_LEN {
        d |= st.echoed[i] ^ buf[i];
        i += 1;
    }
    if d == 0 {
        return;
    }
    st.echoed = buf;
    st.fb = fb;
    st.flags |= D3S_FB_PENDING;
    set_flags(ctx, CB_WRITE_HDR_OPT);
}

/// RTT (every ACK with an RTT sample): has the transfer completed, or missed its deadline?
#[inline(always)]
pub fn on_rtt(ctx: &SockOpsContext) {
    let Some(st) = state(ctx, false) else { return };
    if st.flags & D3S_SENDER == 0 || st.flags & D3S_DONE != 0 || st.size == 0 {
        return;
    }
    let t = now();
    let done = acked(ctx).saturating_sub(st.base_acked) >= st.size;
    let late = st.deadline_ns != 0 && t > st.deadline_ns;
    if done {
        st.flags |= D3S_DONE | D3S_FIN_DUE;
        if st.flags & D3S_DEADLINE != 0 && st.flags & D3S_MISSED == 0 {
            if let Some(s) = stats(st.class) {
                if late {
                    s.missed += 1;
                } else {
                    s.met += 1;
                }
            }
        }
    } else if late && st.flags & D3S_DEADLINE != 0 && st.flags & D3S_MISSED == 0 {
        st.flags |= D3S_MISSED;
        if let Some(s) = stats(st.class) {
            s.missed += 1;
        }
    }
}

/// STATE: the connection is closing: return the allocation on the FIN segment.
#[inline(always)]
pub fn on_state(ctx: &SockOpsContext) {
    let new_state = ctx.arg(1);
    if new_state != TCP_FIN_WAIT1 && new_state != TCP_LAST_ACK {
        return;
    }
    let Some(st) = state(ctx, false) else { return };
    if st.flags & D3S_SENDER != 0
        && st.flow.state & d3::FLOW_STARTED != 0
        && st.flow.state & d3::FLOW_FIN_SENT == 0
    {
        st.flags |= D3S_FIN_DUE;
    }
}
