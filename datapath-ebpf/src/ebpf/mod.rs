//! The eBPF programs (bpf target only); see the crate docs.

mod codel;
mod d3host;
mod d3router;
mod dasr;
mod maps;
mod pacer;
mod parse;
mod sock;
mod sockops;
mod tag;
mod tcp;
mod trace;

use aya_ebpf::{
    bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC},
    helpers::{bpf_ktime_get_coarse_ns, bpf_ktime_get_ns, bpf_skb_cgroup_id},
    macros::classifier,
    programs::TcContext,
};
use paceline_common::{
    classify::PacketInfo,
    codel::CODEL_ON,
    ctab::CT_CGROUP,
    edt::delay_bucket,
    maps::{
        BENCH_FLOW_NEW, BENCH_FLOW_REPLACE, CLASS_SET_PRIORITY, FlowTableKey, LEVEL_SET_DSCP, LEVEL_SET_PCP,
        MAX_CLASSES, MAX_LEVELS, Memo, TABLE_DASR_SENDER, TABLE_NO_FLOW_CLOCKS, TABLE_UNTRACKED_CLASSES,
        TABLE_UNTRACKED_FLOWS, admit_index, admit_tag_of, level_slot,
    },
    trace::{TP_PACED, TR_CACHED, TR_GSO, TR_SOCKET, TR_UNPARSED, TR_V6, TracePending, action, held_binding},
};

use maps::{ADMIT, FLOWS};

/// Read-only at load (the agent overrides it): 1 when the agent asked for tagging and pacing to
/// be skipped entirely, so the program only counts (used by the benchmark's floor).
#[unsafe(no_mangle)]
static PL_COUNT_ONLY: u32 = 0;

/// Read-only at load: in the benchmark's builds that measure a flow's first packet,
/// `BENCH_FLOW_REPLACE` or `BENCH_FLOW_NEW` (see there); the agent leaves it 0.
#[unsafe(no_mangle)]
static PL_BENCH_FLOW_MISS: u32 = 0;

/// Read-only at load: in the benchmark's builds, a mark (nonzero) whose packets are taken as
/// unstamped whatever `skb->tstamp` holds. BPF_PROG_TEST_RUN runs one skb again and again, and
/// it keeps the departure the previous run wrote, which a real unstamped packet (UDP,
/// forwarded traffic) never carries: without this, such rows would skip the clock read a real
/// one pays. The agent leaves it 0.
#[unsafe(no_mangle)]
static PL_BENCH_UNSTAMPED_MARK: u32 = 0;

/// tc egress: classify, pace, tag, count. Returns TC_ACT_UNSPEC (continue to the next tcx
/// program or filter) for every packet it does not drop.
#[classifier]
pub fn pl_tc_egress(ctx: TcContext) -> i32 {
    match try_tc_egress(&ctx) {
        Ok(r) | Err(r) => r,
    }
}

#[inline(always)]
fn try_tc_egress(ctx: &TcContext) -> Result<i32, i32> {
    let Some(cpu) = maps::cpu() else {
        return Ok(TC_ACT_UNSPEC);
    };
    let Some((table, bank)) = maps::active() else {
        cpu.global.no_policy += 1;
        return Ok(TC_ACT_UNSPEC);
    };
    let skb = ctx.skb.skb;
    // The parser writes the packet straight into this CPU's scratch value, which is read back
    // below (see `maps::read_back`): no copy through the stack. What it leaves unwritten for
    // some packets (ports, the unknown fields) or writes only later (the cgroup) is cleared
    // first.
    let scratch: *mut PacketInfo = &mut cpu.scratch;
    parse::clear_unwritten(scratch);
    // SAFETY: as above; no other reference to the scratch value lives across the parse.
    let layout = match parse::parse_with(ctx, unsafe { &mut *scratch }, &mut cpu.layout) {
        Ok(l) => l,
        Err(why) => {
            let a = match why {
                parse::Unparsed::NonIp => {
                    cpu.global.non_ip += 1;
                    action::UNPARSED_NON_IP
                }
                parse::Unparsed::Truncated => {
                    cpu.global.truncated += 1;
                    action::UNPARSED_TRUNCATED
                }
                parse::Unparsed::Malformed => {
                    cpu.global.malformed += 1;
                    action::UNPARSED_MALFORMED
                }
                parse::Unparsed::V6ExtLimit => {
                    cpu.global.ipv6_ext_limit += 1;
                    action::UNPARSED_V6_EXT
                }
            };
            if trace::on() {
                cpu.trace.pending = TracePending {
                    action: a,
                    flags: TR_UNPARSED,
                    ..TracePending::default()
                };
                trace::hand_over(ctx);
            }
            return Ok(TC_ACT_UNSPEC);
        }
    };
    // SAFETY: reading __sk_buff fields allowed for tc programs; fields of this CPU's value.
    unsafe {
        core::ptr::addr_of_mut!((*scratch).mark).write_volatile((*skb).mark);
        if table.ctab.flags & CT_CGROUP != 0 {
            core::ptr::addr_of_mut!((*scratch).cgroup_id).write_volatile(bpf_skb_cgroup_id(skb));
        }
    }
    let pkt = maps::read_back(cpu);
    // A local socket that is one flow with the packet (TCP, or connected UDP to its peer: see
    // `sock::flow_sock`) keeps its class (and its flow clock) in socket storage: a packet whose
    // socket holds a class computed under this policy, for this mark and DSCP, since the socket
    // last connected, skips classification. Every other flow keeps them in the flow table,
    // keyed by its 5-tuple and checked against the policy generation, mark, DSCP, cgroup and
    // unknown fields the same way, unless the policy keeps nothing per flow
    // (`TABLE_UNTRACKED_FLOWS`: the flow's class is then cached in the CPU's class memo alone,
    // and a new flow pays no table lookup, admission slot or insert), or its class keeps
    // nothing per flow (`TABLE_UNTRACKED_CLASSES`: the same, after the table's lookup). (Neither the socket nor
    // the table entry stays live across `classify`: the verifier walks the classifier once, not
    // once per case.) `off_table`: the flow table is not read, the packet having such a socket,
    // its class from the CPU's class memo, or the policy tracking no flow in the table (one
    // variable, not three: the verifier would walk the rest once for each).
    let mut off_table = false;
    let mut sock_state = None;
    // SAFETY: reading an __sk_buff field allowed for tc programs. A local socket's packets
    // carry its transmit hash (see `SockState::txhash`).
    let txhash = unsafe { (*skb).hash };
    // The class cached for the packet's flow: by this CPU's class memo (a later packet of a
    // flow this CPU sent packets of, when its class keeps nothing per flow, told by the
    // classifier's inputs: see `Memo`), or below by the socket's storage or the flow table's
    // entry. `NOT_CACHED` when none (a plain integer, not an `Option`: LLVM may copy an
    // `Option`'s undefined payload, a register the verifier refuses to read).
    let mut cached = NOT_CACHED;
    // SAFETY: reading __sk_buff.sk, as an identity only (whether the packet has a socket).
    let sk = unsafe { (*skb).__bindgen_anon_2.sk } as u64;
    // In the benchmark's builds that measure a new flow's first packet, each run misses the
    // memo as it misses the table: its lookup is made for another policy generation (the same
    // reads and compares as a real miss).
    // SAFETY: volatile read of a load-time constant.
    let bench_new = unsafe { core::ptr::read_volatile(&PL_BENCH_FLOW_MISS) } == BENCH_FLOW_NEW;
    if let Some(c) = memo(cpu).class(table.generation ^ u64::from(bench_new), &pkt) {
        off_table = true;
        cached = u32::from(c);
    } else if let Some(s) = sock::flow_sock(ctx, &pkt) {
        off_table = true;
        if let Some(st) = sock::state(s, false)
            && st.class_for(table.generation, &pkt, txhash).is_some()
        {
            sock_state = Some(st);
        }
    } else if table.flags & TABLE_UNTRACKED_FLOWS != 0 {
        off_table = true;
    }
    // The flow clock: the socket's, the table entry's, or (a flow not in the table yet) the
    // per-CPU value inserted after pacing. Null: none (a socket without storage). `bind` is
    // the same state's `binding` byte.
    let mut clock: *mut u64 = core::ptr::null_mut();
    let mut bind: *mut u8 = core::ptr::null_mut();
    let mut insert = false;
    let mut in_table = false;
    if !off_table {
        // SAFETY: volatile read of a load-time constant.
        let bench_miss = unsafe { core::ptr::read_volatile(&PL_BENCH_FLOW_MISS) };
        let src = flow_src(cpu, &pkt);
        let words = FlowTableKey::words_for(&src, &pkt.dst, pkt.sport, pkt.dport, pkt.proto, pkt.is_v6 != 0);
        // SAFETY: a field of this CPU's map value, 16 bytes like the words (see `words_for`).
        unsafe {
            core::ptr::addr_of_mut!(cpu.table_key)
                .cast::<[u32; 4]>()
                .write_volatile(words)
        };
        if let Some(f) = FLOWS.get_ptr_mut(&cpu.table_key)
            && bench_miss != BENCH_FLOW_REPLACE
            // SAFETY: a map value of this type, valid for this program run.
            && (pkt.is_v6 == 0 || unsafe { same_addr(&(*f).src, &pkt.src) && same_addr(&(*f).dst, &pkt.dst) })
        {
            // An IPv6 entry whose addresses are another flow's (their hashes met): this flow
            // is not in the table, and its insert below takes the entry over.
            in_table = true;
            // SAFETY: as above.
            let f = unsafe { &mut *f };
            if let Some(c) = f.class_for(table.generation, &pkt) {
                cached = c;
                clock = &mut f.t_next;
                bind = &mut f.binding;
                // A flow in the table whose class keeps nothing per flow (under `track_flows:
                // all`, or entered under an earlier policy) takes the CPU's class memo from its
                // third packet: it still enters the table, which `paceline flows` lists. Here, not with the sockets' below: a flag carried there would make the
                // verifier walk pacing once more.
                if table.class_keeps_nothing_per_flow(c) {
                    memo(cpu).set(table.generation, &pkt, c);
                }
            }
        }
    }
    // For a trace record: stored now, without a branch on whether a trace runs, so that no
    // register carries it through classification and pacing (the verifier would walk them
    // once for each value); `built()` is a load-time constant the verifier resolves.
    if trace::built() {
        cpu.trace.pending.flags = ((off_table && sk != 0) as u8) * TR_SOCKET
            | ((sock_state.is_some() || cached != NOT_CACHED) as u8) * TR_CACHED;
    }
    let class_idx = match (&sock_state, cached) {
        (Some(st), _) => u32::from(st.class),
        (None, c) if c != NOT_CACHED => c,
        (None, _) => {
            let (c, rule) = maps::classify(table, bank, &pkt);
            // For a trace record (read only when TR_CACHED is clear).
            if trace::built() {
                cpu.trace.pending.rule = rule;
            }
            if off_table {
                if let Some(st) = sock::flow_sock(ctx, &pkt).and_then(|s| sock::state(s, true)) {
                    st.set_class(table.generation, &pkt, c, txhash);
                    sock_state = Some(st);
                }
            } else if !in_table
                && table.flags & TABLE_UNTRACKED_CLASSES != 0
                && table.class_keeps_nothing_per_flow(c)
            {
                // A new flow of a class that keeps nothing per flow, under a policy whose
                // other classes keep flow clocks in the table: its class goes into the CPU's
                // class memo (below, as an untracked policy's flows' do), not into an admission
                // slot and the table. The same state as those flows': the verifier walks the
                // rest once for both.
                off_table = true;
            } else if in_table && let Some(f) = FLOWS.get_ptr_mut(&cpu.table_key) {
                // A flow classified under another policy (or for another mark, DSCP or
                // cgroup): the new class, the same clock.
                // SAFETY: as above.
                let f = unsafe { &mut *f };
                f.set_class(table.generation, &pkt, c);
                clock = &mut f.t_next;
                bind = &mut f.binding;
            } else {
                // Field by field, each written: a whole `FlowState::default()` becomes a call of
                // BPF's `memset`, a byte loop (about 10 ns of a first packet, in a profile).
                // The fields `set_class` and the lines below do not write, zeroed here.
                // SAFETY: fields of this CPU's map value; volatile keeps them the stores they are.
                unsafe {
                    let fs = core::ptr::addr_of_mut!(cpu.flow_state);
                    core::ptr::addr_of_mut!((*fs).t_next).write_volatile(0);
                    core::ptr::addr_of_mut!((*fs).rate_override).write_volatile(0);
                    core::ptr::addr_of_mut!((*fs).binding).write_volatile(0);
                    core::ptr::addr_of_mut!((*fs)._pad).write_volatile(0);
                }
                cpu.flow_state.src = pkt.src;
                cpu.flow_state.dst = pkt.dst;
                cpu.flow_state.set_class(table.generation, &pkt, c);
                // A flow seen once continues from the clock its first packet left (the slot's
                // tag read before its clock: see `AdmitSlot`).
                let tag = admit_tag_of(&flow_src(cpu, &pkt), &pkt.dst, pkt.sport, pkt.dport, pkt.proto);
                cpu.admit_tag = tag;
                if let Some(slot) = ADMIT.get_ptr(admit_index(tag)) {
                    // SAFETY: a slot of an array map, valid for this program run.
                    unsafe {
                        if core::ptr::addr_of!((*slot).tag).read_volatile() == tag {
                            cpu.flow_state.t_next = core::ptr::addr_of!((*slot).t_next).read_volatile();
                        }
                    }
                }
                clock = &mut cpu.flow_state.t_next;
                bind = &mut cpu.flow_state.binding;
                insert = true;
            }
            c
        }
    };
    if let Some(st) = &mut sock_state {
        clock = &mut st.t_next;
        bind = &mut st.binding;
    }
    let class_idx = class_idx & (MAX_CLASSES as u32 - 1);
    let class = &table.classes[class_idx as usize];
    let level_idx = class.level & (MAX_LEVELS as u32 - 1);
    let level = &table.levels[level_idx as usize];
    // What the packet occupies on the wire: a GSO packet leaves as gso_segs frames, each with
    // the headers skb->len counts once.
    // SAFETY: reading __sk_buff fields allowed for tc programs.
    let segs = unsafe { (*skb).gso_segs } as u64;
    let len = if segs > 1 {
        gso_wire_len(ctx, &layout, pkt.proto, segs)
    } else {
        ctx.len() as u64
    };
    let level_slot = level_slot(level_idx);

    // SAFETY: volatile read of a load-time constant.
    if unsafe { core::ptr::read_volatile(&PL_COUNT_ONLY) } != 0 {
        count(cpu, class_idx, len, 0, 0, 3);
        return Ok(TC_ACT_UNSPEC);
    }

    let mut delay = 0;
    // A DASR share its receiver advertised caps the socket's flow clock (never raises it).
    let dasr_rate = match &sock_state {
        Some(st) => st.dasr_rate,
        None => 0,
    };
    let mut how = 0;
    let flow_rate = if table.flags & TABLE_NO_FLOW_CLOCKS != 0 {
        0
    } else {
        paceline_common::dasr::cap(class.flow_rate, dasr_rate)
    };
    // A local socket whose class keeps nothing per flow (no flow clock, no DASR share) is
    // remembered for its next packet on this CPU (see `PolicyTable::class_keeps_nothing_per_flow`), and keeps no
    // binding either (the memo's packets could not write it): `paceline flows` shows a
    // socket's HELD BY only where a flow clock applies; the class's own (`paceline top`)
    // counts every packet.
    if off_table && flow_rate == 0 && table.flags & TABLE_DASR_SENDER == 0 {
        bind = core::ptr::null_mut();
        // Not a packet the memo served (`cached` holds its class): its class came from the
        // socket's storage or the classifier.
        if cached == NOT_CACHED {
            memo(cpu).set(table.generation, &pkt, class_idx);
        }
    }
    // What a trace record says of this packet, in this CPU's state (not on the stack: see
    // `CpuState::table_key`); written only while a trace runs, but for the bits the exits
    // below set.
    if trace::on() {
        let t = &mut cpu.trace.pending;
        t.flow_rate = flow_rate;
        t.dasr_rate = dasr_rate;
        t.wire_len = len as u32;
        t.class = class_idx as u16;
        t.level = level_idx as u8;
        t.action = action::PASSED;
        t.flags |= (pkt.is_v6 != 0) as u8 * TR_V6 | (segs > 1) as u8 * TR_GSO;
    }
    // Only packets that some clock applies to pay for reading the time.
    if flow_rate | class.class_rate | level.rate != 0 {
        // SAFETY: reading __sk_buff fields allowed for tc programs; volatile read of a
        // load-time constant.
        let raw_ts = unsafe {
            let unstamped = core::ptr::read_volatile(&PL_BENCH_UNSTAMPED_MARK);
            if unstamped != 0 && pkt.mark == unstamped {
                0
            } else {
                (*skb).tstamp
            }
        };
        let (now, stack_ts) = time_base(raw_ts);
        if stack_ts != raw_ts {
            cpu.global.foreign_tstamp += 1;
        }
        // CoDel on the class's and the level's departure queues, before any clock moves.
        let mut signal = 0;
        if (class.codel.flags | level.codel.flags) & CODEL_ON != 0 {
            let floor = if stack_ts > now { stack_ts } else { now };
            signal = codel::check(
                ctx,
                layout.l3_off,
                pkt.is_v6 != 0,
                (class_idx, class),
                (level_slot, level),
                floor,
                len,
            );
        }
        let signal = codel::opaque(&mut cpu.opaque[0], signal);
        if signal & codel::DROP != 0 {
            if let Some(c) = maps::stats(class_idx) {
                c.packets += 1;
                c.bytes += len;
                c.drops_codel += 1;
            }
            if trace::on() {
                cpu.trace.pending.action = action::DROP_CODEL;
                trace::hand_over(ctx);
            }
            return Ok(TC_ACT_SHOT);
        }
        let cfg = pacer::Pacing {
            flow_rate,
            class_rate: class.class_rate,
            class_slot: class_idx,
            level_rate: level.rate,
            level_slot,
            horizon_ns: table.horizon_ns,
        };
        match pacer::pace(len, now, stack_ts, &cfg, clock, &mut cpu.trace.clocks) {
            pacer::Outcome::Untouched => {}
            pacer::Outcome::Send { depart, added_delay } => {
                // SAFETY: tc programs may write skb->tstamp.
                unsafe { (*skb).tstamp = depart };
                delay = added_delay;
                how |= PACED;
                if trace::built() {
                    cpu.trace.pending.flags |= TP_PACED;
                }
                if signal & codel::MARK != 0 {
                    match codel::set_ce(ctx, layout.l3_off, pkt.is_v6 != 0) {
                        Ok(()) => how |= MARKED,
                        Err(()) => cpu.global.rewrite_errors += 1,
                    }
                }
            }
            pacer::Outcome::Drop => {
                if let Some(c) = maps::stats(class_idx) {
                    c.packets += 1;
                    c.bytes += len;
                    c.drops_horizon += 1;
                }
                if trace::on() {
                    cpu.trace.pending.action = action::DROP_HORIZON;
                    cpu.trace.pending.flags |= TP_PACED;
                    trace::hand_over(ctx);
                }
                return Ok(TC_ACT_SHOT);
            }
        }
    }
    if class.flags & CLASS_SET_PRIORITY != 0 {
        // SAFETY: tc programs may write skb->priority.
        unsafe { (*skb).priority = class.skb_priority };
    }
    let mut tagged = false;
    if level.flags & (LEVEL_SET_DSCP | LEVEL_SET_PCP) != 0 {
        let mut rewrite_failed = false;
        // A packet that already carries the level's DSCP (the socket set it, or an earlier
        // hop) is left alone without reading its header again: the parser read the DSCP.
        if level.flags & LEVEL_SET_DSCP != 0 && pkt.dscp != level.dscp {
            match tag::set_dscp(ctx, layout.l3_off, pkt.is_v6 != 0, level.dscp) {
                Ok(t) => tagged |= t,
                Err(()) => rewrite_failed = true,
            }
        }
        // Last: a hardware-accelerated tag is rewritten with vlan_pop/push, which moves data.
        if level.flags & LEVEL_SET_PCP != 0 {
            match tag::set_pcp(ctx, layout.vlan_tci_off, level.pcp) {
                Ok(t) => tagged |= t,
                Err(()) => rewrite_failed = true,
            }
        }
        if rewrite_failed {
            cpu.global.rewrite_errors += 1;
        }
    }
    if tagged {
        how |= TAGGED;
    }
    // Which clock held a delayed packet (from the slots the pacer stored).
    let held = if delay != 0 {
        let c = &cpu.trace.clocks;
        // SAFETY: fields of this CPU's map value (volatile: the verifier sees unknown values,
        // not the pacer's, so the paths that reach here stay one).
        let (f, k, d) = unsafe {
            (
                core::ptr::addr_of!(c.flow_ns).read_volatile(),
                core::ptr::addr_of!(c.class_ns).read_volatile(),
                core::ptr::addr_of!(c.depart_ns).read_volatile(),
            )
        };
        paceline_common::trace::held_index(f, k, d)
    } else {
        3
    };
    // The flow keeps the limit that held its last paced packet (`paceline flows`).
    if how & PACED != 0 && !bind.is_null() {
        // SAFETY: the binding byte of the flow's state (socket storage, the table's entry or
        // this CPU's value), valid for this program run.
        unsafe { bind.write_volatile(held_binding(delay != 0, held)) };
    }
    if insert {
        // A flow enters the table on its second packet (see `AdmitSlot`): its first leaves its
        // clock in this CPU's slot, so a flood of one-packet flows inserts nothing and evicts
        // no established flow. Once the table is full, an insert evicts the least recently
        // used entry (LRU map). The tag is read back from memory: the verifier sees one state.
        // SAFETY: a field of this CPU's map value.
        let tag = unsafe { core::ptr::addr_of!(cpu.admit_tag).read_volatile() };
        if let Some(slot) = ADMIT.get_ptr_mut(admit_index(tag)) {
            // SAFETY: a slot of an array map, valid for this program run; the clock is written
            // before the tag (see `AdmitSlot`).
            unsafe {
                if core::ptr::addr_of!((*slot).tag).read_volatile() == tag {
                    if FLOWS.insert(&cpu.table_key, &cpu.flow_state, 0).is_ok() {
                        cpu.global.flow_inserts += 1;
                    }
                } else {
                    core::ptr::addr_of_mut!((*slot).t_next).write_volatile(cpu.flow_state.t_next);
                    core::ptr::addr_of_mut!((*slot).tag).write_volatile(tag);
                    cpu.global.flow_first_packets += 1;
                }
            }
        }
    }
    count(cpu, class_idx, len, delay, how, held);
    if trace::on() {
        if how & MARKED != 0 {
            cpu.trace.pending.action = action::MARK_CODEL;
        }
        trace::hand_over(ctx);
    }
    Ok(TC_ACT_UNSPEC)
}

/// The packet's source address as its flow's key takes it: in the benchmark's builds that
/// measure a new flow's first packet, altered by a per-CPU count, so that each run is a new
/// flow (the same count for the table's key and the admission tag: the counters move after).
#[inline(always)]
fn flow_src(cpu: &paceline_common::maps::CpuState, p: &PacketInfo) -> [u32; 4] {
    let mut s = p.src;
    // SAFETY: volatile read of a load-time constant.
    if unsafe { core::ptr::read_volatile(&PL_BENCH_FLOW_MISS) } == BENCH_FLOW_NEW {
        let n = cpu
            .global
            .flow_inserts
            .wrapping_add(cpu.global.flow_first_packets) as u32;
        s[0] ^= n;
        s[3] ^= n;
    }
    s
}

/// Whether two addresses are equal, word by word (an array's `==` may become a call of
/// `bcmp`, which BPF has not).
#[inline(always)]
fn same_addr(a: &[u32; 4], b: &[u32; 4]) -> bool {
    (a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3]) == 0
}

/// This CPU's class memo.
#[inline(always)]
fn memo(cpu: &mut paceline_common::maps::CpuState) -> Memo<'_> {
    Memo {
        last: &mut cpu.memo,
        ways: &mut cpu.memo_ways,
        ways6: &mut cpu.memo_ways6,
    }
}

/// `cached` when the flow table's entry holds no class for this packet (classes are below
/// `MAX_CLASSES`).
const NOT_CACHED: u32 = u32::MAX;

/// [`count`]'s `how` bits: the packet's DSCP or PCP was rewritten.
const TAGGED: u32 = 1 << 0;
/// A pacing clock applied (the delay goes into the histogram, even when 0).
const PACED: u32 = 1 << 1;
/// CoDel marked it CE.
const MARKED: u32 = 1 << 2;

/// Wire bytes of a GSO packet: its headers (through the TCP or UDP header) once per segment.
#[inline(always)]
fn gso_wire_len(ctx: &TcContext, layout: &parse::Layout, proto: u8, segs: u64) -> u64 {
    let len = ctx.len() as u64;
    let Some(l4) = layout.l4_off else { return len };
    let l4_hdr = match proto {
        6 => match ctx.load::<u8>(l4 + 12) {
            Ok(doff) => ((doff >> 4) as u64) * 4,
            Err(_) => return len,
        },
        17 => 8,
        _ => return len,
    };
    paceline_common::edt::wire_len(len, segs, l4 as u64 + l4_hdr)
}

/// The current time (CLOCK_MONOTONIC ns) for pacing decisions, and the stack's departure
/// timestamp to honour (0 when there is none to honour).
///
/// TCP stamps every segment with its own EDT departure, taken from a clock read microseconds
/// earlier (tcp_wstamp_ns); that stamp serves as "now" and saves a clock read, which costs
/// 30-100 ns on virtual machines. A stamp is trusted only when it lies within 10 s of the
/// coarse monotonic clock (one tick old, nearly free to read). That rules out REALTIME or TAI
/// stamps (SO_TXTIME for the etf qdisc), which are neither a time base nor a departure this
/// datapath can honour: they are ignored (and counted). Packets without a stamp (UDP,
/// forwarded traffic) read the clock.
#[inline(always)]
fn time_base(stack_ts: u64) -> (u64, u64) {
    const WINDOW_NS: u64 = 10_000_000_000;
    if stack_ts != 0 {
        // SAFETY: helper without arguments.
        let coarse = unsafe { bpf_ktime_get_coarse_ns() };
        if stack_ts.wrapping_sub(coarse).wrapping_add(WINDOW_NS) < 2 * WINDOW_NS {
            return (stack_ts, stack_ts);
        }
    }
    // SAFETY: helper without arguments.
    (unsafe { bpf_ktime_get_ns() }, 0)
}

/// Counts the packet in its class's counters. A level's are its classes' summed by the agent
/// (`names::LEDGER`): one cache line less for every packet.
#[inline(always)]
fn count(
    cpu: &mut paceline_common::maps::CpuState,
    class_idx: u32,
    len: u64,
    delay: u64,
    how: u32,
    held: usize,
) {
    if let Some(c) = maps::stats(class_idx) {
        c.packets += 1;
        c.bytes += len;
        if delay != 0 {
            c.delayed_packets += 1;
            c.delay_ns += delay;
        }
        if how & TAGGED != 0 {
            c.tagged_packets += 1;
        }
        if how & PACED != 0 {
            // The bucket passes through memory and is bounds-checked right where it is
            // used: Linux 6.1's verifier loses the bound of `delay_bucket`'s arithmetic
            // (a leading-zero count is a sequence of shifts in BPF) when LLVM checks one
            // copy of it and spills another.
            let bucket = codel::opaque(&mut cpu.opaque[1], delay_bucket(delay) as u32) as usize;
            if let Some(b) = c.delay_hist.get_mut(bucket) {
                *b += 1;
            }
        }
        if how & MARKED != 0 {
            c.marks_codel += 1;
        }
        if let Some(h) = c.held_by.get_mut(held) {
            *h += 1;
        }
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
