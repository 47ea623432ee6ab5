//! Every type that crosses a BPF map, shared by the datapath and the agent.
//!
//! Rules for this file: `#[repr(C)]`, no `bool`, no implicit padding (explicit `_pad` fields),
//! a size assertion beside each type, and user-side `aya::Pod` impls behind the `user` feature.
//! Addresses are 16 bytes in network byte order; IPv4 is carried IPv4-mapped (`::ffff:a.b.c.d`),
//! so a single rule format matches both families and an IPv4 CIDR can never match IPv6 traffic.

use core::mem::size_of;

pub use crate::codel::{CodelParams, CodelState};
use crate::edt::DELAY_BUCKETS;

/// Names of the maps in the eBPF object (the agent looks them up by these names).
pub mod names {
    /// `Array<u32>` with one entry: which of the two [`super::PolicyTable`] slots is live.
    pub const ACTIVE: &str = "PL_ACTIVE";
    /// `Array<PolicyTable>` with two entries: the live policy and the one being written.
    pub const TABLES: &str = "PL_TABLES";
    /// `LruHashMap<FlowTableKey, FlowState>`: per-flow departure clocks and cached classes.
    pub const FLOWS: &str = "PL_FLOWS";
    /// `Array<AggClock>`: class clocks at `[0, MAX_CLASSES)`, level clocks after them.
    pub const AGG_CLOCKS: &str = "PL_AGG_CLOCKS";
    /// `Array<AdmitSlot>` with [`super::ADMIT_SLOTS`] entries (shared by all CPUs): flows seen
    /// once, not yet entered in [`FLOWS`] (see [`super::AdmitSlot`]).
    pub const ADMIT: &str = "PL_ADMIT";
    /// `PerCpuArray<CpuState>` with one entry: the counters that belong to no class, and the
    /// scratch slot.
    pub const CPU: &str = "PL_CPU";
    /// `PerCpuArray<Counters>`: per class slot at `[0, MAX_CLASSES)`. The level slots after
    /// them (see [`super::level_slot`]) are no longer written (a level's counters are its class
    /// slots' summed, see [`LEDGER`]); they stay so that an upgrade keeps the class counters
    /// (and the ledger's first write takes the levels' totals over from them).
    pub const STATS: &str = "PL_STATS";
    /// `Array<Ledger>` with one entry, the agent's alone (no program reads it): which level
    /// each class slot's counters count in, what each slot held when its class took it, and
    /// what each level holds beyond its slots (see [`super::Ledger`]). Pinned, so that it
    /// outlives the agent; one value, written with one update, so that it never tears.
    pub const LEDGER: &str = "PL_LEDGER";
    /// `HashMap<u64, BenchEdt>`: the benchmark's reference program's aggregates.
    pub const BENCH_EDT: &str = "PL_BENCH_EDT";
    /// `ArrayOfMaps` with one inner `Array<u32>` per bank: the compiled classifier's words
    /// (see [`crate::ctab`]).
    pub const CTAB_WORDS: &str = "PL_CTAB_WORDS";
    /// `Array<`[`super::FastWords`]`>` of 2 entries, one a bank (mmap-able; each bank's
    /// [`super::CTAB_FAST_WORDS`] words packed, 4 bytes a word): the classifier's words once
    /// more, where a policy's fit (`ctab::CT_FAST`). A plain array: the tc program looks its
    /// bank's entry up once a packet and reads each word at an index masked to the bank's
    /// size, without a lookup, a bound check or a null test a word (an inner map's reads are
    /// helper calls, one per word). Before, a word to each 8-byte entry of an array of 2 x
    /// `CTAB_FAST_WORDS` (twice the memory, an inlined lookup a word); two words to a `u64`
    /// entry, picked by a shift, made Linux 6.12's verifier walk the egress program seven
    /// times over.
    pub const CTAB_FAST: &str = "PL_CTAB_FAST";
    /// `ArrayOfMaps` with one inner `HashMap<SelKey, u32>` per bank (see `ctab::LIST_AT`).
    pub const CTAB_SELS: &str = "PL_CTAB_SELS";
    /// `ArrayOfMaps` with one inner `HashMap<RuleKey, u32>` per bank.
    pub const CTAB_RULES: &str = "PL_CTAB_RULES";
    /// `SkStorage<SockState>`: the tc program's per-socket class cache and flow clock.
    pub const SOCK: &str = "PL_SOCK";
    /// `SkStorage<D3Sock>`: the kernel's per-socket D3 state.
    pub const D3_SOCK: &str = "PL_D3_SOCK";
    /// `SkStorage<D3App>`: per-socket sizes and deadlines set by applications (pinned).
    pub const D3_APP: &str = "PL_D3_APP";
    /// `PerCpuArray<D3ClassStats>`: per class.
    pub const D3_STATS: &str = "PL_D3_STATS";
    /// `HashMap<u32 ifindex, D3LinkCtl>`: router links, written by the agent.
    pub const D3_LINK_CTL: &str = "PL_D3_LINK_CTL";
    /// `HashMap<u32 ifindex, D3LinkCounters>`: router links, written by the datapath.
    pub const D3_LINKS: &str = "PL_D3_LINKS";
    /// `LruHashMap<FlowKey, D3Seen>`: the router's memory of each flow's last request.
    pub const D3_SEEN: &str = "PL_D3_SEEN";
    /// `Array<CodelState>` (shared by all CPUs): CoDel per class at `[0, MAX_CLASSES)`, per
    /// level after them, like [`AGG_CLOCKS`].
    pub const CODEL: &str = "PL_CODEL";
    /// `Array<TraceConfig>` with one entry: whether and what `paceline trace` records.
    pub const TRACE_CFG: &str = "PL_TRACE_CFG";
    /// `ProgramArray` with one entry: the trace program the tc egress program tail-calls.
    pub const TRACE_PROG: &str = "PL_TRACE_PROG";
    /// `RingBuf` of `TraceRecord`s (see `crate::trace`).
    pub const TRACE_RING: &str = "PL_TRACE_RING";
}

/// Rules a policy may hold after its address lists are expanded. The classifier's cost per
/// packet does not depend on it (see [`crate::ctab`]); the sizes of its tables do, and the
/// agent refuses a policy whose tables exceed their own limits.
pub const MAX_RULES: usize = 1 << 18;
/// Classes (a power of two: the datapath masks class indices with `MAX_CLASSES - 1`).
pub const MAX_CLASSES: usize = 1024;
pub const MAX_LEVELS: usize = 8;
/// Entries of [`names::AGG_CLOCKS`] and of [`names::STATS`].
pub const AGG_SLOTS: usize = MAX_CLASSES + MAX_LEVELS;
const _: () = assert!(MAX_CLASSES.is_power_of_two() && MAX_LEVELS.is_power_of_two());
/// Words of each bank's part of [`names::CTAB_FAST`] (4 MiB, 8 MiB the map): a policy whose
/// words fit is classified from there. A policy with port or protocol rules pays the protocol
/// table and a 16-bit root per address trie it has (65,536 words each). 100,000 rules of
/// `tcp dst <address>/32 dst_port 11211` take 572,603 words, and 772,605 with their
/// one-address arrays (`ctab::CT_SHAPE_ARRAYS`), which are added only where everything fits.
pub const CTAB_FAST_WORDS: u32 = 1 << 20;
/// A bank's entry of [`names::CTAB_FAST`]: its words, 4 bytes each.
pub type FastWords = [u32; CTAB_FAST_WORDS as usize];
/// The values of [`names::CTAB_FAST`], both banks: its kernel memory, less a page of header.
pub const CTAB_FAST_BYTES: u64 = 2 * core::mem::size_of::<FastWords>() as u64;

/// Default entries of [`names::FLOWS`] (`spec.flow_table_size`): 65 536 flows, a 16-byte key
/// and a 72-byte [`FlowState`] each: 9.5 MiB of kernel memory by the map's memlock, which
/// `paceline status` reports. The agent resizes the map at load time; this is also the size
/// compiled into the object.
pub const DEFAULT_FLOW_TABLE_SIZE: u32 = 65_536;

/// Index of level `l`'s slot in [`names::AGG_CLOCKS`] / [`names::STATS`].
#[inline(always)]
pub const fn level_slot(level: u32) -> u32 {
    MAX_CLASSES as u32 + level
}

// ---- Class flags ([`ClassConfig::flags`]) ----
/// Write [`ClassConfig::skb_priority`] into `skb->priority`.
pub const CLASS_SET_PRIORITY: u32 = 1 << 0;
/// The class's TCP flows speak D3: they send rate requests and pace at the grants.
pub const CLASS_D3: u32 = 1 << 1;

/// What the datapath does with a packet of one class.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassConfig {
    /// Per-flow pacing rate in bytes/s; 0 = no per-flow clock.
    pub flow_rate: u64,
    /// Aggregate rate of the whole class in bytes/s; 0 = no class clock.
    pub class_rate: u64,
    /// Value for `skb->priority`: the level's priority, or an HTB class id `major:minor`
    /// when the interface enforces aggregates with HTB.
    pub skb_priority: u32,
    pub flags: u32,
    /// TCP minimum RTO in microseconds set through sock_ops (TCP_BPF_RTO_MIN); 0 = leave.
    pub rto_min_us: u32,
    /// TCP delayed-ACK ceiling in microseconds (TCP_BPF_DELACK_MAX); 0 = leave.
    pub delack_max_us: u32,
    /// The QJump level this class belongs to (index into [`PolicyTable::levels`]).
    pub level: u32,
    /// D3: default deadline of the class's flows in microseconds (0: none; applications can
    /// set a deadline per socket). Used with [`CLASS_D3`].
    pub d3_deadline_us: u32,
    /// D3: default size of the class's transfers in bytes (with `d3_deadline_us`).
    pub d3_size: u64,
    /// CoDel on the class's departure queue (needs `class_rate`).
    pub codel: CodelParams,
}
const _: () = assert!(size_of::<ClassConfig>() == 64);

impl ClassConfig {
    pub const fn zeroed() -> Self {
        ClassConfig {
            flow_rate: 0,
            class_rate: 0,
            skb_priority: 0,
            flags: 0,
            rto_min_us: 0,
            delack_max_us: 0,
            level: 0,
            d3_deadline_us: 0,
            d3_size: 0,
            codel: CodelParams::off(),
        }
    }
}

// ---- Level flags ([`LevelConfig::flags`]) ----
/// Rewrite the DSCP of IPv4/IPv6 packets to [`LevelConfig::dscp`] (ECN bits kept).
pub const LEVEL_SET_DSCP: u32 = 1 << 0;
/// Rewrite the 802.1p PCP of the packet's VLAN tag to [`LevelConfig::pcp`].
pub const LEVEL_SET_PCP: u32 = 1 << 1;

/// One QJump level on this host.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LevelConfig {
    /// The level's rate limit for this host in bytes/s; 0 = not rate-limited (the lowest level).
    pub rate: u64,
    pub flags: u32,
    pub dscp: u8,
    pub pcp: u8,
    pub _pad: [u8; 2],
    /// CoDel on the level's departure queue (needs `rate`).
    pub codel: CodelParams,
}
const _: () = assert!(size_of::<LevelConfig>() == 32);

impl LevelConfig {
    pub const fn zeroed() -> Self {
        LevelConfig {
            rate: 0,
            flags: 0,
            dscp: 0,
            pcp: 0,
            _pad: [0; 2],
            codel: CodelParams::off(),
        }
    }
}

// ---- Table flags ([`PolicyTable::flags`]) ----
/// Some rule matches on cgroup: the datapath must look up the packet's cgroup id.
pub const TABLE_NEEDS_CGROUP: u32 = 1 << 0;
/// D3: echo the allocations of incoming rate requests in ACKs (this host is a D3 receiver).
pub const TABLE_D3_RECEIVER: u32 = 1 << 2;
/// No per-flow clocks in the tc program: nothing (no fq) would hold packets until their
/// departure, so TCP paces itself (sock_ops) and `flow_rate` serves only sock_ops.
pub const TABLE_NO_FLOW_CLOCKS: u32 = 1 << 1;
/// sock_ops may set TCP sockets' TOS to their level's DSCP: every interface with a route is
/// managed (a socket's segments carry that DSCP wherever they leave; `IP_TOS` also sets the
/// socket's priority from the TOS, which the classifier overrides on managed interfaces), and
/// no rule matches on DSCP (a segment marked by its socket could match another rule at tc).
pub const TABLE_SOCK_TOS: u32 = 1 << 3;
/// DASR receiver: sock_ops writes N and the line rate into the pure ACKs of the flows the
/// ingress program counts (`crate::dasr`).
pub const TABLE_DASR_RECEIVER: u32 = 1 << 4;
/// DASR sender: sock_ops mirrors the shares the ingress program read into SO_MAX_PACING_RATE.
pub const TABLE_DASR_SENDER: u32 = 1 << 5;
/// No class keeps anything per flow for a packet without a local socket (no flow clock, no
/// DASR share: [`PolicyTable::keeps_nothing_per_flow`]) and the policy does not ask for such
/// flows to be listed (`spec.track_flows: all`): the tc program keeps them out of the flow
/// table (no lookup, no admission slot, no insert), their class in its CPU's class memo alone.
pub const TABLE_UNTRACKED_FLOWS: u32 = 1 << 6;
/// `spec.track_flows: auto`: a flow without a local socket whose class keeps nothing per flow
/// ([`PolicyTable::class_keeps_nothing_per_flow`]) stays out of the flow table under a policy
/// whose other classes keep flow clocks there: classified, it takes its CPU's class memo
/// instead of an admission slot and, on its second packet, an insert. (Its first packet still
/// looks the table up: only the classifier tells its class.)
pub const TABLE_UNTRACKED_CLASSES: u32 = 1 << 7;

/// A whole compiled policy: what one slot of [`names::TABLES`] holds.
///
/// The agent writes a new policy into the bank that is not live (this slot and the
/// classifier's maps of the same bank) and then flips [`names::ACTIVE`], so every packet sees
/// either the old or the new policy, never a mix.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyTable {
    /// Class of packets no rule matches.
    pub default_class: u32,
    pub flags: u32,
    /// Number of classes in use (for the agent; the datapath never loops over classes).
    pub n_classes: u32,
    /// D3: congestion window (segments) a sender's connection starts with; 0: the kernel's.
    pub d3_initial_window: u32,
    /// A packet whose departure would lie further than this in the future is dropped.
    pub horizon_ns: u64,
    /// Increments with every policy the agent writes (shows up in status and tests).
    pub generation: u64,
    /// D3: this host's line rate (bytes/s): the quench threshold and the scale ceiling.
    pub d3_line_rate: u64,
    /// D3: pacing rate of a flow until its first grant, bytes/s; 0: one segment per RTT.
    pub d3_first_rate: u64,
    /// Where the compiled classifier's parts are in this bank's maps.
    pub ctab: crate::ctab::CtabHeader,
    pub classes: [ClassConfig; MAX_CLASSES],
    pub levels: [LevelConfig; MAX_LEVELS],
}
const _: () = assert!(
    size_of::<PolicyTable>()
        == 48 + size_of::<crate::ctab::CtabHeader>() + 64 * MAX_CLASSES + 32 * MAX_LEVELS
);

impl PolicyTable {
    /// A table that puts everything in class 0 at level 0 and does nothing to it.
    pub const fn empty() -> Self {
        PolicyTable {
            default_class: 0,
            flags: 0,
            n_classes: 1,
            d3_initial_window: 0,
            horizon_ns: 0,
            generation: 0,
            d3_line_rate: 0,
            d3_first_rate: 0,
            ctab: crate::ctab::CtabHeader::empty(),
            classes: [ClassConfig::zeroed(); MAX_CLASSES],
            levels: [LevelConfig::zeroed(); MAX_LEVELS],
        }
    }

    /// Whether class `c` keeps nothing per flow for a packet without a local socket: no flow
    /// clock (none under this mode, or none in the class) and no DASR share (which only a
    /// socket's storage holds, and which makes the tc program keep every flow's state).
    #[inline(always)]
    pub fn class_keeps_nothing_per_flow(&self, c: u32) -> bool {
        let class = &self.classes[(c & (MAX_CLASSES as u32 - 1)) as usize];
        self.flags & TABLE_DASR_SENDER == 0
            && (self.flags & TABLE_NO_FLOW_CLOCKS != 0 || class.flow_rate == 0)
    }

    /// Whether no class keeps anything per flow for a packet without a local socket (see
    /// [`Self::class_keeps_nothing_per_flow`]): the flow table would hold such a flow's class
    /// alone (the compiler's test for [`TABLE_UNTRACKED_FLOWS`]; not for the datapath).
    pub fn keeps_nothing_per_flow(&self) -> bool {
        (0..MAX_CLASSES as u32).all(|c| self.class_keeps_nothing_per_flow(c))
    }
}

/// An aggregate's departure clock, shared by all CPUs (updated with a compare-and-swap on
/// every paced packet), alone in a cache line: packed eight to a line, two classes sent from
/// two CPUs moved one line back and forth and each packet cost as much as if both classes
/// shared one clock (`plbench datapath`'s two-CPU rows: 133-143 ns over the floor against
/// 53-55 for one CPU, and 53 once each clock had a line of its own).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AggClock {
    pub t_next: u64,
    pub _pad: [u64; 7],
}
const _: () = assert!(size_of::<AggClock>() == 64);

/// Per-CPU counters of one class or one level.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counters {
    pub packets: u64,
    pub bytes: u64,
    /// Packets whose departure the datapath moved into the future.
    pub delayed_packets: u64,
    /// Sum over delayed packets of (departure - max(now, stack timestamp)), ns.
    pub delay_ns: u64,
    /// Packets dropped because their departure lay beyond the horizon.
    pub drops_horizon: u64,
    /// Packets whose DSCP or PCP the datapath rewrote.
    pub tagged_packets: u64,
    /// TCP sockets the sock_ops program configured for this class.
    pub tcp_sockets: u64,
    /// bpf_setsockopt calls that failed for this class's sockets.
    pub sockopt_errors: u64,
    /// Packets dropped by CoDel (the class's or its level's): a signal on a packet that is
    /// not ECN-capable, or with `ecn` off.
    pub drops_codel: u64,
    /// Packets marked CE by CoDel (the class's or its level's) instead of being dropped.
    pub marks_codel: u64,
    /// Packets some pacing clock applied to, by the delay pacing added (`edt::delay_bucket`).
    pub delay_hist: [u64; DELAY_BUCKETS],
    /// Delayed packets by the clock that held them: flow, class, level
    /// (`crate::trace::held_index`).
    pub held_by: [u64; 3],
}
const _: () = assert!(size_of::<Counters>() == 80 + 8 * DELAY_BUCKETS + 24);

impl Default for Counters {
    fn default() -> Self {
        Counters {
            packets: 0,
            bytes: 0,
            delayed_packets: 0,
            delay_ns: 0,
            drops_horizon: 0,
            tagged_packets: 0,
            tcp_sockets: 0,
            sockopt_errors: 0,
            drops_codel: 0,
            marks_codel: 0,
            delay_hist: [0; DELAY_BUCKETS],
            held_by: [0; 3],
        }
    }
}

impl Counters {
    /// Adds `other` into `self` (summing per-CPU values on the user side).
    pub fn add(&mut self, other: &Counters) {
        self.packets = self.packets.wrapping_add(other.packets);
        self.bytes = self.bytes.wrapping_add(other.bytes);
        self.delayed_packets = self.delayed_packets.wrapping_add(other.delayed_packets);
        self.delay_ns = self.delay_ns.wrapping_add(other.delay_ns);
        self.drops_horizon = self.drops_horizon.wrapping_add(other.drops_horizon);
        self.tagged_packets = self.tagged_packets.wrapping_add(other.tagged_packets);
        self.tcp_sockets = self.tcp_sockets.wrapping_add(other.tcp_sockets);
        self.sockopt_errors = self.sockopt_errors.wrapping_add(other.sockopt_errors);
        self.drops_codel = self.drops_codel.wrapping_add(other.drops_codel);
        self.marks_codel = self.marks_codel.wrapping_add(other.marks_codel);
        for (a, b) in self.delay_hist.iter_mut().zip(other.delay_hist.iter()) {
            *a = a.wrapping_add(*b);
        }
        for (a, b) in self.held_by.iter_mut().zip(other.held_by.iter()) {
            *a = a.wrapping_add(*b);
        }
    }
}

impl Counters {
    /// Takes `other` out of `self` (wrapping: a level's base may lie below zero, its totals
    /// never do).
    pub fn sub(&mut self, other: &Counters) {
        let mut neg = *other;
        for v in neg.words_mut() {
            *v = v.wrapping_neg();
        }
        self.add(&neg);
    }

    fn words_mut(&mut self) -> impl Iterator<Item = &mut u64> {
        [
            &mut self.packets,
            &mut self.bytes,
            &mut self.delayed_packets,
            &mut self.delay_ns,
            &mut self.drops_horizon,
            &mut self.tagged_packets,
            &mut self.tcp_sockets,
            &mut self.sockopt_errors,
            &mut self.drops_codel,
            &mut self.marks_codel,
        ]
        .into_iter()
        .chain(self.delay_hist.iter_mut())
        .chain(self.held_by.iter_mut())
    }
}

/// How the class slots' counters (`PL_STATS`) make up each class's and each level's: the
/// datapath counts a packet in its class slot only, and a level's counters are the sum of the
/// slots this ledger puts in it, beyond their marks, plus its base.
///
/// A slot counts in one level from the policy write that gives it a class until the write
/// that gives it another class or another level, whether or not the live policy still uses
/// it: packets classified by a policy just replaced (in flight at the flip, until the grace
/// period after it) count where that policy put them. The agent reassigns a slot only where
/// no program can still count in it under its old owner (the policy compiler gives a new class,
/// and a class that changes level, a slot the live policy does not use), so a level's totals
/// are exact across reloads. The arithmetic is `control/src/kernel/levels.rs`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Ledger {
    /// Nonzero once the agent has written it.
    pub written: u32,
    pub _pad: u32,
    /// Per class slot, the level its counters count in, plus one (0: none).
    pub slot_level: [u8; MAX_CLASSES],
    /// Per class slot, what its counters held when its class took it: the class's own
    /// counters are the slot's beyond this (wrapping).
    pub marks: [Counters; MAX_CLASSES],
    /// Per level, what it holds beyond its slots (wrapping: a base may lie below zero, a
    /// level's totals never do).
    pub bases: [Counters; MAX_LEVELS],
}

/// Per-CPU counters that belong to no class.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct GlobalCounters {
    /// Frames whose ethertype, after at most two VLAN tags, is neither IPv4 nor IPv6 (ARP,
    /// LLDP, MPLS, a third tag): passed untouched.
    pub non_ip: u64,
    /// Frames shorter than what their headers announce (an IP header, the IPv4 total length or
    /// IPv6 payload length, an extension header, a TCP/UDP/SCTP header), or whose headers are
    /// not in the packet's linear data: passed untouched.
    pub truncated: u64,
    /// IPv6 packets with more extension headers than the parser follows (6), or whose transport
    /// header starts past byte 512: passed untouched.
    pub ipv6_ext_limit: u64,
    /// Packets seen while no policy was loaded.
    pub no_policy: u64,
    /// Rewrites (DSCP, PCP) the kernel refused.
    pub rewrite_errors: u64,
    /// Paced packets whose stack timestamp was not CLOCK_MONOTONIC (SO_TXTIME with REALTIME
    /// or TAI): the timestamp was ignored and replaced by the pacing departure.
    pub foreign_tstamp: u64,
    /// Frames whose IP or TCP header contradicts itself: a version that is not the ethertype's,
    /// an IPv4 header length below 20 bytes or beyond the total length, a TCP data offset
    /// below 5: passed untouched.
    pub malformed: u64,
    /// Flows entered in the flow table ([`names::FLOWS`]): every flow without a local TCP or
    /// connected UDP socket, for its class and its clock, on its second packet (see
    /// [`AdmitSlot`]). The table is an LRU map: once it is full, each insert evicts the least
    /// recently seen flow, so evictions are inserts minus the entries present (the agent
    /// counts them).
    pub flow_inserts: u64,
    /// First packets of flows without a local TCP or connected UDP socket: each left its
    /// clock in an [`AdmitSlot`] instead of entering the flow table. Much above
    /// `flow_inserts`: many flows of a single packet (a scan, a flood, DNS) that the table was
    /// spared.
    pub flow_first_packets: u64,
}
const _: () = assert!(size_of::<GlobalCounters>() == 72);

impl GlobalCounters {
    pub fn add(&mut self, o: &GlobalCounters) {
        self.non_ip = self.non_ip.wrapping_add(o.non_ip);
        self.truncated = self.truncated.wrapping_add(o.truncated);
        self.ipv6_ext_limit = self.ipv6_ext_limit.wrapping_add(o.ipv6_ext_limit);
        self.no_policy = self.no_policy.wrapping_add(o.no_policy);
        self.rewrite_errors = self.rewrite_errors.wrapping_add(o.rewrite_errors);
        self.foreign_tstamp = self.foreign_tstamp.wrapping_add(o.foreign_tstamp);
        self.malformed = self.malformed.wrapping_add(o.malformed);
        self.flow_inserts = self.flow_inserts.wrapping_add(o.flow_inserts);
        self.flow_first_packets = self.flow_first_packets.wrapping_add(o.flow_first_packets);
    }
}

/// One CPU's state that belongs to no class (the value of [`names::CPU`]). Per-class and
/// per-level counters are in [`names::STATS`]: a per-CPU value is limited to 32 KiB, which
/// [`MAX_CLASSES`] counters would exceed.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CpuState {
    // What every packet touches comes first, together (a per-CPU value is only 8-byte aligned,
    // so the fewer bytes it spans, the fewer cache lines): the packet, its layout, the class
    // memo's last flow, the trace's clocks and pending record (written whether a trace runs
    // or not), the laundering words.
    /// The parser writes the packet here and the program reads it back (see the datapath's
    /// `maps::read_back`).
    pub scratch: crate::classify::PacketInfo,
    /// The parsed packet's layout passes through here (see the datapath's `parse::launder`),
    /// beside the packet: one cache line fewer per packet than a map of its own.
    pub layout: [u32; 4],
    /// Words the classifier's lookups and the delay histogram's bucket pass through so that
    /// LLVM cannot fold them into the verifier's blind spots (see the datapath's `opaque`);
    /// never read as data.
    pub opaque: [u32; 2],
    /// The last IPv4 flow this CPU sent a packet of whose class keeps nothing per flow (see
    /// [`Memo`]).
    pub memo: ClassMemo,
    /// `paceline trace`: the clocks of the packet being decided, its pending record, the cap's
    /// window, counters.
    pub trace: crate::trace::TraceCpu,
    /// The flow table's key and new value are built here, not on the stack: Linux 6.1 allows
    /// the tc program and the CoDel function it calls 512 bytes of stack together.
    pub table_key: FlowTableKey,
    pub global: GlobalCounters,
    pub flow_state: FlowState,
    /// The [`admit_tag`] of a new flow's key while its packet is decided (in memory, not a
    /// register: the verifier would walk pacing once for each outcome of the admission).
    pub admit_tag: u64,
    /// The other flows this CPU sent packets of whose class keeps nothing per flow (see
    /// [`ClassMemos`], [`ClassMemos6`]): last, since a packet reads at most one way of them.
    pub memo_ways: ClassMemos,
    pub memo_ways6: ClassMemos6,
}
const _: () = assert!(
    size_of::<CpuState>()
        == 56 + 16 + 8 + 32 + 112 + 16 + 72 + 72 + 8 + 32 * CLASS_MEMO_WAYS + 64 * CLASS_MEMO6_WAYS
);

pub use crate::d3::maps::*;

mod flows;
pub use flows::*;

mod memo;
pub use memo::*;

mod sock;
pub use sock::*;

/// An aggregate of the benchmark's reference program (`pl_tc_ref_edt`, what Cilium's bandwidth
/// manager keeps per aggregate): its rate, its last departure, its drop horizon.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BenchEdt {
    /// Bytes/s.
    pub bps: u64,
    pub t_last: u64,
    pub horizon_ns: u64,
}
const _: () = assert!(size_of::<BenchEdt>() == 24);

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: all of these are `#[repr(C)]`, `Copy`, made only of integers and arrays of
    // integers, with explicit padding fields, so every bit pattern is valid.
    unsafe impl aya::Pod for ClassConfig {}
    unsafe impl aya::Pod for LevelConfig {}
    unsafe impl aya::Pod for PolicyTable {}
    unsafe impl aya::Pod for FlowKey {}
    unsafe impl aya::Pod for FlowTableKey {}
    unsafe impl aya::Pod for FlowState {}
    unsafe impl aya::Pod for AdmitSlot {}
    unsafe impl aya::Pod for AggClock {}
    unsafe impl aya::Pod for SockState {}
    unsafe impl aya::Pod for Counters {}
    unsafe impl aya::Pod for Ledger {}
    unsafe impl aya::Pod for GlobalCounters {}
    unsafe impl aya::Pod for CpuState {}
    unsafe impl aya::Pod for BenchEdt {}
    unsafe impl aya::Pod for CodelState {}
    unsafe impl aya::Pod for crate::trace::TraceConfig {}
    unsafe impl aya::Pod for crate::trace::TraceRecord {}
    unsafe impl aya::Pod for crate::ctab::SelKey {}
    unsafe impl aya::Pod for crate::ctab::RuleKey {}
}

/// IPv4-mapped form of a network-order IPv4 address word.
#[inline(always)]
pub const fn v4_mapped(addr_be: u32) -> [u32; 4] {
    [0, 0, u32::from_ne_bytes([0, 0, 0xff, 0xff]), addr_be]
}
