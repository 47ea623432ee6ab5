//! sock_ops: per-class TCP settings when a connection is established (active or passive; the
//! MSS is known then). It classifies the connection's tuple with the same rules as the tc program;
//! sock_ops cannot see a socket's cgroup nor a packet's DSCP, so rules that need those do not
//! match here (the agent warns about such policies).
//!
//! Settings: SO_MAX_PACING_RATE (the class's per-flow rate; TCP then paces itself, which is the
//! per-flow enforcement on kernels without sch_fq), TCP_BPF_RTO_MIN and TCP_BPF_DELACK_MAX (the
//! incast mitigations of the incast study), and IP_TOS / IPV6_TCLASS with the DSCP of the class's level
//! where the agent allows it (`TABLE_SOCK_TOS`): TCP then sends its segments already marked,
//! and the tc classifier, which still checks every packet, has nothing to rewrite. A rewrite at
//! tc must first make a TCP segment's headers private (TCP keeps a clone for retransmission),
//! so this saves a copy per segment.

use aya_ebpf::{
    bindings::{BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB, bpf_sock_ops},
    helpers::bpf_get_netns_cookie,
    macros::sock_ops,
    programs::SockOpsContext,
};
use paceline_common::{
    classify::{PacketInfo, UNKNOWN_CGROUP, UNKNOWN_DSCP, UNKNOWN_MARK},
    maps::{
        ClassConfig, LEVEL_SET_DSCP, MAX_CLASSES, MAX_LEVELS, PolicyTable, TABLE_NO_FLOW_CLOCKS,
        TABLE_SOCK_TOS, v4_mapped,
    },
};

use super::{
    d3host, dasr, maps,
    tcp::{
        self, AF_INET6, IP_TOS, IPV6_TCLASS, SO_MAX_PACING_RATE, SOL_IP, SOL_IPV6, SOL_SOCKET, SOL_TCP,
        TCP_BPF_DELACK_MAX, TCP_BPF_RTO_MIN,
    },
};

/// The network namespace the agent manages (its netns cookie), set at load. sock_ops runs for
/// every socket under the cgroup root, in every namespace; the agent configures only its own.
#[unsafe(no_mangle)]
static PL_NETNS_COOKIE: u64 = 0;

const OP_STATE_CB: u32 = 10;
const OP_RTT_CB: u32 = 12;
const OP_PARSE_HDR_OPT_CB: u32 = 13;
const OP_HDR_OPT_LEN_CB: u32 = 14;
const OP_WRITE_HDR_OPT_CB: u32 = 15;

#[sock_ops]
pub fn pl_sock_ops(ctx: SockOpsContext) -> u32 {
    let op = ctx.op();
    // SAFETY: helper on the program's own context; volatile read of a load-time constant.
    let (mine, ours) = unsafe {
        (
            bpf_get_netns_cookie(ctx.ops.cast()),
            core::ptr::read_volatile(&PL_NETNS_COOKIE),
        )
    };
    if mine != ours {
        return 1;
    }
    let Some((table, bank)) = maps::active() else {
        return 1;
    };
    match op {
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB | BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB => {
            configure(&ctx, table, bank)
        }
        OP_HDR_OPT_LEN_CB => {
            d3host::on_hdr_opt_len(&ctx, table);
            dasr::on_hdr_opt_len(&ctx, table);
        }
        OP_WRITE_HDR_OPT_CB => {
            d3host::on_write_hdr_opt(&ctx, table);
            dasr::on_write_hdr_opt(&ctx, table);
        }
        OP_PARSE_HDR_OPT_CB => {
            d3host::on_parse_hdr_opt(&ctx, table);
            dasr::on_parse_hdr_opt(&ctx, table);
        }
        OP_RTT_CB => {
            d3host::on_rtt(&ctx);
            dasr::on_rtt(&ctx, table);
        }
        OP_STATE_CB => d3host::on_state(&ctx),
        _ => {}
    }
    1
}

#[inline(always)]
fn configure(ctx: &SockOpsContext, table: &PolicyTable, bank: u32) {
    let mut pkt = PacketInfo {
        proto: 6,
        sport: ctx.local_port() as u16,
        dport: tcp::remote_port(ctx.remote_port()),
        unknown: UNKNOWN_DSCP | UNKNOWN_CGROUP | UNKNOWN_MARK,
        ..PacketInfo::default()
    };
    // The IP version the segments leave with: a v6 socket talking to a v4-mapped peer sends
    // IPv4, whose TOS only IP_TOS on an AF_INET socket sets (there tc keeps rewriting).
    // `(level, name)`, name 0 for none. Plain values rather than an `Option`: Linux 6.1's
    // verifier loses the tie between an option's tag and its payload register across the
    // setsockopt calls and then rejects the payload's spill ("invalid size of register spill").
    let mut tos_via = (SOL_IP, IP_TOS);
    if ctx.family() == AF_INET6 {
        // SAFETY: reads of the program's own context.
        unsafe {
            pkt.src = tcp::ip6(core::ptr::addr_of!((*ctx.ops).local_ip6));
            pkt.dst = tcp::ip6(core::ptr::addr_of!((*ctx.ops).remote_ip6));
        }
        pkt.is_v6 = 1;
        tos_via = if is_v4_mapped(&pkt.dst) {
            (0, 0)
        } else {
            (SOL_IPV6, IPV6_TCLASS)
        };
    } else {
        pkt.src = v4_mapped(ctx.local_ip4());
        pkt.dst = v4_mapped(ctx.remote_ip4());
    }
    let class_idx = maps::classify_once(table, bank, &pkt).0 & (MAX_CLASSES as u32 - 1);
    let class = &table.classes[class_idx as usize];
    // SAFETY: reading the program's own context.
    let mss = unsafe { (*ctx.ops).mss_cache };
    // With EDT flow clocks (fq), the datapath paces the flow exactly; TCP's own cap sits 5%
    // above so the two pacers do not compound their jitter (both at the same rate run ~3% slow).
    let headroom = table.flags & TABLE_NO_FLOW_CLOCKS == 0;
    let level = &table.levels[(class.level as usize) & (MAX_LEVELS - 1)];
    // Only where the agent allows it (`TABLE_SOCK_TOS`): every route leaves through a managed
    // interface, and no rule matches on DSCP.
    let tos_name = if level.flags & LEVEL_SET_DSCP != 0 && table.flags & TABLE_SOCK_TOS != 0 {
        tos_via.1
    } else {
        0
    };
    let tos = (tos_via.0, tos_name, (level.dscp as u32 & 0x3f) << 2);
    let (ok, failed) = apply(ctx.ops, class, mss, pkt.is_v6 != 0, headroom, tos);
    if ok + failed != 0 {
        if let Some(c) = maps::stats(class_idx) {
            c.tcp_sockets += 1;
            c.sockopt_errors += failed;
        }
    }
    d3host::on_established(ctx, table, class_idx, class);
    dasr::on_established(ctx, table);
}

/// `::ffff:a.b.c.d` (as the context's words, network byte order in memory).
#[inline(always)]
fn is_v4_mapped(a: &[u32; 4]) -> bool {
    a[0] == 0 && a[1] == 0 && a[2] == u32::from_ne_bytes([0, 0, 0xff, 0xff])
}

/// Applies the class's settings (and the TOS byte, through `(level, name, value)`, unless name
/// is 0); returns (settings applied, settings refused).
#[inline(always)]
fn apply(
    ops: *mut bpf_sock_ops,
    class: &ClassConfig,
    mss: u32,
    v6: bool,
    headroom: bool,
    tos: (i32, i32, u32),
) -> (u64, u64) {
    let mut ok = 0;
    let mut failed = 0;
    let mut set = |level: i32, name: i32, val: u32| {
        if tcp::setsockopt_u32(ops, level, name, val) {
            ok += 1
        } else {
            failed += 1
        }
    };
    if class.flow_rate != 0 {
        let mut r = tcp::payload_rate(class.flow_rate, mss, v6);
        if headroom {
            r += r / 20;
        }
        set(SOL_SOCKET, SO_MAX_PACING_RATE, tcp::pacing_rate_arg(r));
    }
    if class.rto_min_us != 0 {
        set(SOL_TCP, TCP_BPF_RTO_MIN, class.rto_min_us);
    }
    if class.delack_max_us != 0 {
        set(SOL_TCP, TCP_BPF_DELACK_MAX, class.delack_max_us);
    }
    let (sol, name, v) = tos;
    if name != 0 {
        // The kernel keeps the socket's ECN bits (TCP owns them).
        set(sol, name, v);
    }
    (ok, failed)
}
