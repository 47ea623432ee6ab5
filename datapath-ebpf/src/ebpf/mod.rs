//! The eBPF programs (bpf target only); see the crate docs.

mod maps;
mod pacer;
mod parse;
mod sockops;
mod tag;

use aya_ebpf::{
    bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC},
    helpers::{bpf_ktime_get_ns, bpf_skb_cgroup_id},
    macros::classifier,
    programs::TcContext,
};
use paceline_common::{
    classify::{PacketInfo, classify},
    maps::{
        CLASS_SET_PRIORITY, LEVEL_SET_DSCP, LEVEL_SET_PCP, MAX_LEVELS, TABLE_NEEDS_CGROUP,
        level_slot,
    },
};

/// Read-only at load (the agent overrides it): 1 when the agent asked for tagging and pacing to
/// be skipped entirely, so the program only counts (used by the benchmark's floor).
#[unsafe(no_mangle)]
static PL_COUNT_ONLY: u32 = 0;

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
    let Some(table) = maps::active_table() else {
        if let Some(g) = maps::global_stats() {
            g.no_policy += 1;
        }
        return Ok(TC_ACT_UNSPEC);
    };
    let skb = ctx.skb.skb;
    let mut pkt = PacketInfo::default();
    let layout = match parse::parse(ctx, &mut pkt) {
        Ok(l) => l,
        Err(why) => {
            if let Some(g) = maps::global_stats() {
                match why {
                    parse::Unparsed::NonIp => g.non_ip += 1,
                    parse::Unparsed::Truncated => g.truncated += 1,
                    parse::Unparsed::V6ExtLimit => g.ipv6_ext_limit += 1,
                }
            }
            return Ok(TC_ACT_UNSPEC);
        }
    };
    // SAFETY: reading __sk_buff fields allowed for tc programs.
    pkt.mark = unsafe { (*skb).mark };
    if table.flags & TABLE_NEEDS_CGROUP != 0 {
        // SAFETY: helper on the program's own context.
        pkt.cgroup_id = unsafe { bpf_skb_cgroup_id(skb) };
    }
    let Some(pkt) = maps::launder(&pkt) else { return Ok(TC_ACT_UNSPEC) };
    let class_idx = classify(table, &pkt);
    let class = &table.classes[class_idx as usize];
    let level_idx = class.level & (MAX_LEVELS as u32 - 1);
    let level = &table.levels[level_idx as usize];
    let len = ctx.len() as u64;

    // SAFETY: volatile read of a load-time constant.
    if unsafe { core::ptr::read_volatile(&PL_COUNT_ONLY) } != 0 {
        count(class_idx, level_idx, len, 0, false, false);
        return Ok(TC_ACT_UNSPEC);
    }

    // SAFETY: reading __sk_buff fields allowed for tc programs.
    let stack_ts = unsafe { (*skb).tstamp };
    let now = unsafe { bpf_ktime_get_ns() };
    let cfg = pacer::Pacing {
        flow_rate: class.flow_rate,
        class_rate: class.class_rate,
        class_slot: class_idx,
        level_rate: level.rate,
        level_slot: level_slot(level_idx),
        horizon_ns: table.horizon_ns,
    };
    let mut delay = 0;
    match pacer::pace(&pkt, len, now, stack_ts, &cfg) {
        pacer::Outcome::Untouched => {}
        pacer::Outcome::Send { depart, added_delay } => {
            // SAFETY: tc programs may write skb->tstamp.
            unsafe { (*skb).tstamp = depart };
            delay = added_delay;
        }
        pacer::Outcome::Drop => {
            for slot in [class_idx, level_slot(level_idx)] {
                if let Some(c) = maps::stats(slot) {
                    c.packets += 1;
                    c.bytes += len;
                    c.drops_horizon += 1;
                }
            }
            return Ok(TC_ACT_SHOT);
        }
    }
    if class.flags & CLASS_SET_PRIORITY != 0 {
        // SAFETY: tc programs may write skb->priority.
        unsafe { (*skb).priority = class.skb_priority };
    }
    let mut tagged = false;
    let mut rewrite_failed = false;
    if level.flags & LEVEL_SET_DSCP != 0 {
        match tag::set_dscp(ctx, layout.l3_off, pkt.is_v6 != 0, level.dscp) {
            Ok(t) => tagged |= t,
            Err(()) => rewrite_failed = true,
        }
    }
    // Last: a hardware-accelerated tag is rewritten with vlan_pop/push, which moves the data.
    if level.flags & LEVEL_SET_PCP != 0 {
        match tag::set_pcp(ctx, layout.vlan_tci_off, level.pcp) {
            Ok(t) => tagged |= t,
            Err(()) => rewrite_failed = true,
        }
    }
    if rewrite_failed {
        if let Some(g) = maps::global_stats() {
            g.rewrite_errors += 1;
        }
    }
    count(class_idx, level_idx, len, delay, delay != 0, tagged);
    Ok(TC_ACT_UNSPEC)
}

#[inline(always)]
fn count(class_idx: u32, level_idx: u32, len: u64, delay: u64, delayed: bool, tagged: bool) {
    for slot in [class_idx, level_slot(level_idx)] {
        if let Some(c) = maps::stats(slot) {
            c.packets += 1;
            c.bytes += len;
            if delayed {
                c.delayed_packets += 1;
                c.delay_ns += delay;
            }
            if tagged {
                c.tagged_packets += 1;
            }
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
