//! DASR (docs/dasr.md) in the datapath: one tc ingress program for both roles, and sock_ops
//! callbacks. The arithmetic, the counting words and the option are `paceline_common::dasr`.
//!
//! - **Receiver** (`IFACE_RECEIVE`): the ingress program counts every arriving TCP segment that
//!   carries data into its local address's epochs (per flow, once per epoch); sock_ops writes
//!   N and the line rate into the pure ACKs of the flows that are counted (header-option
//!   callbacks, as D3's feedback).
//! - **Sender** (`IFACE_SEND`): the ingress program reads the option of arriving ACKs, finds
//!   the local socket (`bpf_sk_lookup_tcp`) and sets its share line / N in the tc program's
//!   socket state, where the flow clock reads it (fq); sock_ops, which the kernel calls for
//!   the same ACK because it carries an option it does not know, mirrors the share into
//!   SO_MAX_PACING_RATE (TCP's own pacing, the enforcement without fq, and what sizes its TSO
//!   bursts), and drops a share its receiver stopped repeating.

use core::{
    ffi::c_void,
    intrinsics::{AtomicOrdering::Relaxed, atomic_cxchg},
    ptr::NonNull,
};

use aya_ebpf::{
    bindings::{BPF_NOEXIST, TC_ACT_UNSPEC, bpf_sock, bpf_sock_tuple},
    btf_maps::SkStorage,
    helpers::{
        bpf_ktime_get_ns, bpf_loop, bpf_reserve_hdr_opt, bpf_sk_lookup_tcp, bpf_sk_release,
        bpf_sk_storage_get, bpf_skb_load_bytes, bpf_store_hdr_opt,
    },
    macros::{btf_map, classifier, map},
    maps::{HashMap, LruHashMap, PerCpuArray},
    programs::{SockOpsContext, TcContext},
};
use paceline_common::{
    abi::BPF_SK_STORAGE_GET_F_CREATE,
    classify::PacketInfo,
    d3::{TCP_OPTS_MAX, TCP_OPTS_OFFSET},
    dasr::{
        self, AddrView, Advert, DASR_ADDR_ENTRIES, DASR_FLOW_ENTRIES, DSOCK_OPT_DUE, DSOCK_RTT_CB, DasrAddr,
        DasrFlow, DasrFlowKey, DasrIface, DasrSock, DasrStats, IFACE_RECEIVE, IFACE_SEND, OPT_LEN, Scan,
        Step,
    },
    maps::{
        CLASS_D3, MAX_CLASSES, PolicyTable, SockState, TABLE_DASR_RECEIVER, TABLE_DASR_SENDER,
        TABLE_NO_FLOW_CLOCKS, v4_mapped,
    },
};

use super::{
    parse, sock,
    tcp::{
        self, BPF_WRITE_HDR_TCP_CURRENT_MSS, CB_PARSE_UNKNOWN_HDR_OPT, CB_RTT, CB_WRITE_HDR_OPT, set_flags,
    },
};

#[map(name = "PL_DASR_IFACES")]
static IFACES: HashMap<u32, DasrIface> = HashMap::with_max_entries(64, 0);

#[map(name = "PL_DASR_ADDRS")]
static ADDRS: LruHashMap<[u32; 4], DasrAddr> = LruHashMap::with_max_entries(DASR_ADDR_ENTRIES, 0);

#[map(name = "PL_DASR_FLOWS")]
static FLOWS: LruHashMap<DasrFlowKey, DasrFlow> = LruHashMap::with_max_entries(DASR_FLOW_ENTRIES, 0);

#[map(name = "PL_DASR_STATS")]
static STATS: PerCpuArray<DasrStats> = PerCpuArray::with_max_entries(1, 0);

#[btf_map]
static PL_DASR_SOCK: SkStorage<DasrSock> = SkStorage::new();

/// Zeroes the option bytes eight at a time: `sc.opts = [0; TCP_OPTS_MAX]` is a call of BPF's
/// `memset`, a loop over the 40 bytes one at a time, on every TCP packet with options.
#[inline(always)]
fn clear_options(sc: &mut Scratch) {
    const WORDS: usize = TCP_OPTS_MAX / 8;
    const _: () = assert!(TCP_OPTS_MAX % 8 == 0 && core::mem::offset_of!(Scratch, opts) % 8 == 0);
    let p = sc.opts.as_mut_ptr().cast::<u64>();
    let mut i = 0;
    while i < WORDS {
        // SAFETY: within `opts`, 8-aligned (asserted above: the scratch value is a map value,
        // 8-aligned, and `opts` lies at a multiple of 8 in it); volatile keeps the stores.
        unsafe { p.add(i).write_volatile(0) };
        i += 1;
    }
}

/// The ingress program's working memory (map memory: the verifier does not track what it
/// holds, so every parse path converges into one state).
#[repr(C)]
pub struct Scratch {
    pkt: PacketInfo,
    opts: [u8; TCP_OPTS_MAX],
    key: DasrFlowKey,
    /// The option's offset, passed through map memory (see `d3router`).
    off: u32,
    cfg: DasrIface,
}

#[map(name = "PL_DASR_SCRATCH")]
static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// `bpf_sk_lookup_tcp`'s "the netns of the packet's device".
const BPF_F_CURRENT_NETNS: u64 = u32::MAX as u64;
const TCP_LISTEN: u32 = 10;
const TCPHDR_FIN: u8 = 0x01;
const TCPHDR_SYN: u8 = 0x02;
const TCPHDR_RST: u8 = 0x04;
const TCPHDR_ACK: u8 = 0x10;

#[inline(always)]
fn now_ns() -> u64 {
    // SAFETY: helper without arguments.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
fn stats() -> Option<&'static mut DasrStats> {
    // SAFETY: per-CPU slot; preemption is disabled while the program runs.
    STATS.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

// ---------------------------------------------------------------------------------------
// tc ingress
// ---------------------------------------------------------------------------------------

/// tc ingress of every managed interface when DASR is on: counts senders (receiver) and reads
/// shares (sender). Never drops, never changes a packet.
#[classifier]
pub fn pl_tc_ingress(ctx: TcContext) -> i32 {
    let _ = try_ingress(&ctx);
    TC_ACT_UNSPEC
}

#[inline(always)]
fn try_ingress(ctx: &TcContext) -> Option<()> {
    // SAFETY: reading __sk_buff fields allowed for tc programs.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    // SAFETY: a value the agent writes only while the interface is not served.
    let cfg = unsafe { IFACES.get(&ifindex)? };
    // SAFETY: per-CPU slot; preemption is disabled while the program runs.
    let sc = unsafe { &mut *SCRATCH.get_ptr_mut(0)? };
    // Field by field: a whole-struct copy is a call of BPF's `memmove`, one byte at a time.
    sc.cfg.line_rate = cfg.line_rate;
    sc.cfg.min_window_ns = cfg.min_window_ns;
    sc.cfg.per_sender_ns = cfg.per_sender_ns;
    sc.cfg.flags = cfg.flags;
    sc.cfg.line_code = cfg.line_code;
    parse::clear_unwritten(&mut sc.pkt);
    let layout = parse::parse(ctx, &mut sc.pkt).ok()?;
    if sc.pkt.proto != 6 {
        return None;
    }
    let l4 = layout.l4_off?;
    let doff = ctx.load::<u8>(l4 + 12).ok()?;
    let hdr = ((doff >> 4) as usize) * 4;
    if hdr < TCP_OPTS_OFFSET {
        return None;
    }
    let st = stats()?;
    if sc.cfg.flags & IFACE_RECEIVE != 0 {
        // The payload by the IP header's length (a frame may be padded).
        let l3 = layout.l3_off;
        let ip_end = if sc.pkt.is_v6 != 0 {
            l3 + 40 + u16::from_be_bytes(ctx.load::<[u8; 2]>(l3 + 4).ok()?) as usize
        } else {
            l3 + u16::from_be_bytes(ctx.load::<[u8; 2]>(l3 + 2).ok()?) as usize
        };
        if ip_end > l4 + hdr {
            count(sc, st);
        }
    }
    if sc.cfg.flags & IFACE_SEND != 0 && hdr >= TCP_OPTS_OFFSET + OPT_LEN {
        read_option(ctx, l4, hdr - TCP_OPTS_OFFSET, sc, st);
    }
    Some(())
}

/// Counts the data segment in `sc.pkt` for its destination address.
#[inline(always)]
fn count(sc: &mut Scratch, st: &mut DasrStats) -> Option<()> {
    let now = dasr::ticks(now_ns());
    let w = sc.cfg.window();
    let addr = match ADDRS.get_ptr_mut(&sc.pkt.dst) {
        Some(a) => a,
        None => {
            let v = dasr::first_epoch(now, &w);
            let fresh = DasrAddr {
                word: v.word,
                slots: [0, 0],
                line_rate: sc.cfg.line_rate,
                len: v.len,
                line_code: sc.cfg.line_code,
                _pad: 0,
            };
            // Another CPU may create it at the same time: either value will do.
            let _ = ADDRS.insert(&sc.pkt.dst, &fresh, BPF_NOEXIST as u64);
            ADDRS.get_ptr_mut(&sc.pkt.dst)?
        }
    };
    st.data_segments += 1;
    // SAFETY (every access to `addr` below): a map value, valid while the program runs;
    // `word` and `slots` are changed only by compare-and-swap, the rest by plain stores
    // of values every CPU computes alike.
    unsafe {
        if (*addr).line_code != sc.cfg.line_code {
            (*addr).line_rate = sc.cfg.line_rate;
            (*addr).line_code = sc.cfg.line_code;
        }
        let word_p = core::ptr::addr_of_mut!((*addr).word);
        let mut word = word_p.read_volatile();
        let view = AddrView {
            word,
            slots: (*addr).slots,
            len: (*addr).len,
        };
        if let Some((next, len)) = dasr::roll(&view, now, &w) {
            let (seen, ok) = atomic_cxchg::<u64, { Relaxed }, { Relaxed }>(word_p, word, next);
            if ok {
                (*addr).len = len;
                st.epochs += 1;
                word = next;
            } else {
                // Another CPU started the epoch.
                word = seen;
            }
        }
        let seq = dasr::epoch_seq(word);
        sc.key = DasrFlowKey {
            local: sc.pkt.dst,
            remote: sc.pkt.src,
            local_port: sc.pkt.dport,
            remote_port: sc.pkt.sport,
        };
        let flow = FLOWS.get_ptr_mut(&sc.key).and_then(|f| NonNull::new(f));
        let flow_seq = match flow {
            Some(f) => Some((*f.as_ptr()).seq),
            None => None,
        };
        let moved = dasr::sighting(flow_seq, seq)?;
        match flow {
            Some(f) => (*f.as_ptr()).seq = seq,
            None => {
                // A flood of new flows evicts the least recently seen (LRU map).
                let _ = FLOWS.insert(&sc.key, &DasrFlow { seq, _pad: 0 }, 0);
            }
        }
        let slot_p: *mut u64 = if dasr::slot_index(seq) == 0 {
            core::ptr::addr_of_mut!((*addr).slots[0])
        } else {
            core::ptr::addr_of_mut!((*addr).slots[1])
        };
        let mut cur = slot_p.read_volatile();
        let mut tries = 0;
        while tries < 4 {
            let (seen, ok) =
                atomic_cxchg::<u64, { Relaxed }, { Relaxed }>(slot_p, cur, dasr::slot_after(cur, seq, moved));
            if ok {
                st.sightings += 1;
                break;
            }
            cur = seen;
            tries += 1;
        }
    }
    Some(())
}

/// Loads the option area (`opts_len` bytes, a multiple of 4) into `sc.opts`: one load of a
/// constant length per possible value (the verifier cannot follow a computed length).
#[inline(always)]
fn load_options(ctx: &TcContext, base: u32, opts_len: usize, sc: &mut Scratch) -> bool {
    let p: *mut c_void = sc.opts.as_mut_ptr().cast();
    let skb = ctx.skb.skb.cast();
    // SAFETY: the program's context; `opts` has room for 40 bytes.
    let r = unsafe {
        match opts_len {
            8 => bpf_skb_load_bytes(skb, base, p, 8),
            12 => bpf_skb_load_bytes(skb, base, p, 12),
            16 => bpf_skb_load_bytes(skb, base, p, 16),
            20 => bpf_skb_load_bytes(skb, base, p, 20),
            24 => bpf_skb_load_bytes(skb, base, p, 24),
            28 => bpf_skb_load_bytes(skb, base, p, 28),
            32 => bpf_skb_load_bytes(skb, base, p, 32),
            36 => bpf_skb_load_bytes(skb, base, p, 36),
            40 => bpf_skb_load_bytes(skb, base, p, 40),
            _ => -1,
        }
    };
    r == 0
}

/// The state of an option walk, on the stack of `read_option`.
#[repr(C)]
struct Walk {
    /// Where the next option starts.
    pos: u32,
    /// Bytes of options.
    end: u32,
    /// The DASR option's offset (`WALK_FOUND`).
    found: u32,
    state: u32,
}

const WALK_RUNNING: u32 = 0;
const WALK_ABSENT: u32 = 1;
const WALK_FOUND: u32 = 2;
const WALK_MALFORMED: u32 = 3;

/// One step of the option walk (`dasr::option_step`) as a `bpf_loop` callback: the verifier
/// checks it once, with the position unknown, rather than every path through the whole walk
/// (more than a million instructions on Linux 6.12). Returns 1 to stop.
#[inline(never)]
extern "C" fn walk_step(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes read_option's `Walk`.
    let w = unsafe { &mut *ctx.cast::<Walk>() };
    // SAFETY: per-CPU slot; the program that filled it is still running on this CPU.
    let Some(sc) = SCRATCH.get_ptr(0) else {
        w.state = WALK_ABSENT;
        return 1;
    };
    // Bounded for the verifier; a real position is below TCP_OPTS_MAX anyway.
    let pos = (w.pos & 0x3f) as usize;
    // SAFETY: a map value, valid while the program runs.
    match dasr::option_step(unsafe { &(*sc).opts }, w.end as usize, pos) {
        Step::Next(p) => {
            w.pos = p as u32;
            0
        }
        Step::Done(Scan::Found(off)) => {
            w.found = off as u32;
            w.state = WALK_FOUND;
            1
        }
        Step::Done(Scan::Malformed) => {
            w.state = WALK_MALFORMED;
            1
        }
        Step::Done(Scan::Absent) => {
            w.state = WALK_ABSENT;
            1
        }
    }
}

/// Reads a DASR option from the segment in `sc.pkt` (an ACK from a receiver) and sets the share
/// on the local socket it acknowledges.
#[inline(always)]
fn read_option(
    ctx: &TcContext,
    l4: usize,
    opts_len: usize,
    sc: &mut Scratch,
    st: &mut DasrStats,
) -> Option<()> {
    clear_options(sc);
    if !load_options(ctx, (l4 + TCP_OPTS_OFFSET) as u32, opts_len, sc) {
        return None;
    }
    // The walk of `dasr::find_option`, one `bpf_loop` step at a time (see `walk_step`).
    let mut w = Walk {
        pos: 0,
        end: opts_len as u32,
        found: 0,
        state: WALK_RUNNING,
    };
    // SAFETY: a callback of bpf_loop's type and a context on this stack, alive for the call.
    unsafe {
        bpf_loop(
            dasr::MAX_STEPS,
            walk_step as *const () as *mut c_void,
            core::ptr::addr_of_mut!(w).cast(),
            0,
        )
    };
    let off = match w.state {
        WALK_FOUND => w.found as usize,
        WALK_MALFORMED => {
            st.options_malformed += 1;
            return None;
        }
        _ => return None,
    };
    // As in d3router: the scan leaves the offset as a constant on each of its exits; a round
    // trip through map memory makes it one bounded unknown.
    // SAFETY: a field of the per-CPU scratch value.
    let off = unsafe {
        core::ptr::write_volatile(&mut sc.off, off as u32);
        (core::ptr::read_volatile(&sc.off) & 0x3f) as usize
    };
    if off > TCP_OPTS_MAX - OPT_LEN {
        return None;
    }
    let bytes = dasr::option_at(&sc.opts, off)?;
    let Ok(advert) = Advert::decode(&bytes) else {
        st.options_malformed += 1;
        return None;
    };
    let share = advert.share();
    let sk = lookup(ctx, &sc.pkt);
    let Some(sk) = NonNull::new(sk) else {
        st.options_no_socket += 1;
        return None;
    };
    // From here on every path releases the socket.
    // SAFETY: a socket the lookup returned, referenced until released below.
    let listening = unsafe { (*sk.as_ptr()).state } == TCP_LISTEN;
    if listening {
        st.options_no_socket += 1;
    } else if let Some(s) = sock::state(sk.as_ptr().cast(), true) {
        let now = now_ns();
        let (applied, raise) = dasr::follow(s.dasr_rate, share, s.dasr_raise_ns, now);
        if s.dasr_rate != applied {
            st.rates_set += 1;
            if let Some(b) = st.rate_hist.get_mut(dasr::rate_bucket(applied)) {
                *b += 1;
            }
        }
        s.dasr_rate = applied;
        s.dasr_raise_ns = raise;
        s.dasr_seen_ns = now;
        st.options_read += 1;
    }
    // SAFETY: the reference the lookup took.
    unsafe { bpf_sk_release(sk.as_ptr().cast()) };
    Some(())
}

/// The local TCP socket a segment of `pkt` is for (null when there is none).
#[inline(always)]
fn lookup(ctx: &TcContext, pkt: &PacketInfo) -> *mut bpf_sock {
    // SAFETY: a zeroed tuple is valid; the union's fields are plain integers.
    let mut t: bpf_sock_tuple = unsafe { core::mem::zeroed() };
    let size;
    // SAFETY: writes to the union's plain integer fields.
    unsafe {
        if pkt.is_v6 != 0 {
            let v6 = &mut t.__bindgen_anon_1.ipv6;
            v6.saddr = pkt.src;
            v6.daddr = pkt.dst;
            v6.sport = pkt.sport.to_be();
            v6.dport = pkt.dport.to_be();
            size = core::mem::size_of_val(v6) as u32;
        } else {
            let v4 = &mut t.__bindgen_anon_1.ipv4;
            v4.saddr = pkt.src[3];
            v4.daddr = pkt.dst[3];
            v4.sport = pkt.sport.to_be();
            v4.dport = pkt.dport.to_be();
            size = core::mem::size_of_val(v4) as u32;
        }
        bpf_sk_lookup_tcp(ctx.skb.skb.cast(), &mut t, size, BPF_F_CURRENT_NETNS, 0)
    }
}

// ---------------------------------------------------------------------------------------
// sock_ops
// ---------------------------------------------------------------------------------------

#[inline(always)]
fn sk(ctx: &SockOpsContext) -> *mut c_void {
    // SAFETY: reading the program's own context.
    unsafe { (*ctx.ops).__bindgen_anon_2.sk.cast() }
}

/// This socket's DASR state; `create` makes an empty one when there is none.
#[inline(always)]
fn dsock(ctx: &SockOpsContext, create: bool) -> Option<&'static mut DasrSock> {
    let sk = sk(ctx);
    if sk.is_null() {
        return None;
    }
    let flags = if create { BPF_SK_STORAGE_GET_F_CREATE } else { 0 };
    // SAFETY: the map pointer is the BTF map itself; sk is the context's full socket.
    let p = unsafe {
        bpf_sk_storage_get(
            core::ptr::addr_of!(PL_DASR_SOCK) as *mut c_void,
            sk,
            core::ptr::null_mut(),
            flags,
        )
    };
    // SAFETY: a socket storage value of this map's type, valid for this program run.
    (!p.is_null()).then(|| unsafe { &mut *p.cast::<DasrSock>() })
}

/// The tc program's state of this socket (where the ingress program put the share).
#[inline(always)]
fn sock_state(ctx: &SockOpsContext) -> Option<&'static mut SockState> {
    let sk = sk(ctx);
    if sk.is_null() {
        return None;
    }
    sock::state(sk, false)
}

/// At ESTABLISHED: a receiver writes options (on pure ACKs), a sender hears the ACKs that
/// carry one (the kernel calls PARSE_HDR_OPT only for options it does not know).
#[inline(always)]
pub fn on_established(ctx: &SockOpsContext, table: &PolicyTable) {
    let mut add = 0;
    if table.flags & TABLE_DASR_RECEIVER != 0 {
        add |= CB_WRITE_HDR_OPT;
    }
    if table.flags & TABLE_DASR_SENDER != 0 {
        add |= CB_PARSE_UNKNOWN_HDR_OPT;
    }
    if add != 0 {
        set_flags(ctx, add);
    }
}

/// The receiver's view of this connection as a flow arriving at it.
#[inline(always)]
fn flow_key(ctx: &SockOpsContext) -> DasrFlowKey {
    let (local, remote) = if ctx.family() == tcp::AF_INET6 {
        // SAFETY: fixed-offset reads of the program's own context.
        unsafe {
            (
                tcp::ip6(core::ptr::addr_of!((*ctx.ops).local_ip6)),
                tcp::ip6(core::ptr::addr_of!((*ctx.ops).remote_ip6)),
            )
        }
    } else {
        (v4_mapped(ctx.local_ip4()), v4_mapped(ctx.remote_ip4()))
    };
    DasrFlowKey {
        local,
        remote,
        local_port: ctx.local_port() as u16,
        remote_port: tcp::remote_port(ctx.remote_port()),
    }
}

/// HDR_OPT_LEN: on a pure ACK of a flow the ingress program counts, reserve room for N and
/// the line rate, and prepare the option. Never on data segments, so no MSS is reserved: data
/// keeps its full segment size.
#[inline(always)]
pub fn on_hdr_opt_len(ctx: &SockOpsContext, table: &PolicyTable) {
    if table.flags & TABLE_DASR_RECEIVER == 0 || ctx.arg(0) & BPF_WRITE_HDR_TCP_CURRENT_MSS != 0 {
        return;
    }
    // SAFETY: reading the program's own context.
    let (skb_len, tcp_flags) = unsafe { ((*ctx.ops).skb_len, (*ctx.ops).skb_tcp_flags as u8) };
    if skb_len != 0 || tcp_flags & (TCPHDR_SYN | TCPHDR_FIN | TCPHDR_RST) != 0 || tcp_flags & TCPHDR_ACK == 0
    {
        return;
    }
    let key = flow_key(ctx);
    // SAFETY: map values read once, copied.
    let Some(flow) = (unsafe { FLOWS.get(&key) }).copied() else {
        return;
    };
    let Some(addr) = (unsafe { ADDRS.get(&key.local) }).copied() else {
        return;
    };
    let now = dasr::ticks(now_ns());
    let view = addr.view();
    if !dasr::counted(&view, flow.seq, now) {
        return;
    }
    let n = dasr::senders(&view, now);
    if n == 0 {
        return;
    }
    let Some(ds) = dsock(ctx, true) else { return };
    // SAFETY: the program's own context.
    if unsafe { bpf_reserve_hdr_opt(ctx.ops, OPT_LEN as u32, 0) } != 0 {
        if let Some(s) = stats() {
            s.options_no_room += 1;
        }
        return;
    }
    ds.opt = dasr::encode(n, addr.line_code);
    ds.flags |= DSOCK_OPT_DUE;
}

/// WRITE_HDR_OPT: write what HDR_OPT_LEN prepared.
#[inline(always)]
pub fn on_write_hdr_opt(ctx: &SockOpsContext, table: &PolicyTable) {
    if table.flags & TABLE_DASR_RECEIVER == 0 {
        return;
    }
    let Some(ds) = dsock(ctx, false) else { return };
    if ds.flags & DSOCK_OPT_DUE == 0 {
        return;
    }
    ds.flags &= !DSOCK_OPT_DUE;
    let mut opt = ds.opt;
    // SAFETY: the program's own context and a live buffer of OPT_LEN bytes.
    if unsafe { bpf_store_hdr_opt(ctx.ops, opt.as_mut_ptr().cast(), OPT_LEN as u32, 0) } == 0 {
        if let Some(s) = stats() {
            s.options_written += 1;
        }
    }
}

/// PARSE_HDR_OPT (an ACK with an option the kernel does not know, here the receiver's, which
/// the ingress program has read): mirror the socket's share into SO_MAX_PACING_RATE.
#[inline(always)]
pub fn on_parse_hdr_opt(ctx: &SockOpsContext, table: &PolicyTable) {
    if table.flags & TABLE_DASR_SENDER == 0 {
        return;
    }
    let Some(st) = sock_state(ctx) else { return };
    let share = st.dasr_rate;
    let Some(ds) = dsock(ctx, share != 0) else { return };
    // SAFETY: reading the program's own context.
    ds.segs_at_seen = unsafe { (*ctx.ops).data_segs_out };
    if ds.applied != share {
        apply(ctx, table, st, ds, share);
    }
}

/// RTT (every ACK with an RTT sample, turned on while a share applies): a share the receiver
/// stopped repeating while the flow kept sending is dropped, and so is every share once a
/// policy no longer makes this host a DASR sender (an agent started again without the role,
/// adopting the pinned socket storage: the share would otherwise hold the connection's
/// SO_MAX_PACING_RATE, and the tc program's flow clock, for as long as it lives).
#[inline(always)]
pub fn on_rtt(ctx: &SockOpsContext, table: &PolicyTable) {
    let Some(ds) = dsock(ctx, false) else { return };
    if ds.applied == 0 {
        return;
    }
    let Some(st) = sock_state(ctx) else { return };
    if table.flags & TABLE_DASR_SENDER == 0 {
        st.dasr_rate = 0;
        st.dasr_raise_ns = 0;
        apply(ctx, table, st, ds, 0);
        return;
    }
    // SAFETY: reading the program's own context.
    let (srtt_ns, segs) = unsafe { (((*ctx.ops).srtt_us >> 3) as u64 * 1000, (*ctx.ops).data_segs_out) };
    if !dasr::stale(
        now_ns(),
        st.dasr_seen_ns,
        srtt_ns,
        segs.wrapping_sub(ds.segs_at_seen),
    ) {
        return;
    }
    st.dasr_rate = 0;
    st.dasr_raise_ns = 0;
    if let Some(s) = stats() {
        s.stale_resets += 1;
    }
    apply(ctx, table, st, ds, 0);
}

/// Sets SO_MAX_PACING_RATE to the class's flow rate capped by `share` (with fq 5% above it, as
/// sock_ops does for class rates: the EDT clock paces exactly).
#[inline(always)]
fn apply(ctx: &SockOpsContext, table: &PolicyTable, st: &SockState, ds: &mut DasrSock, share: u64) {
    let (class_rate, d3) = if st.generation == table.generation {
        let c = &table.classes[(st.class as usize) & (MAX_CLASSES - 1)];
        (c.flow_rate, c.flags & CLASS_D3 != 0)
    } else {
        (0, false)
    };
    // A D3 flow's TCP pacing follows its grants; DASR caps it through the flow clock only.
    if d3 {
        ds.applied = share;
        return;
    }
    let wire = dasr::cap(class_rate, share);
    let arg = if wire == 0 {
        u32::MAX // unlimited
    } else {
        // SAFETY: reading the program's own context.
        let (mss, v6) = unsafe { ((*ctx.ops).mss_cache, (*ctx.ops).family == tcp::AF_INET6) };
        let mut r = tcp::payload_rate(wire, mss, v6).max(1);
        if table.flags & TABLE_NO_FLOW_CLOCKS == 0 {
            r += r / 20;
        }
        tcp::pacing_rate_arg(r)
    };
    let ok = tcp::setsockopt_u32(ctx.ops, tcp::SOL_SOCKET, tcp::SO_MAX_PACING_RATE, arg);
    if let Some(s) = stats() {
        if ok {
            s.pacing_updates += 1;
        } else {
            s.sockopt_errors += 1;
        }
    }
    if ok {
        ds.applied = share;
    }
    if share != 0 && ds.flags & DSOCK_RTT_CB == 0 {
        ds.flags |= DSOCK_RTT_CB;
        set_flags(ctx, CB_RTT);
    }
}
