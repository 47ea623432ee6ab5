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
    /// `ArrayOfMaps` with one inner `HashMap<SelKey, SelList>` per bank.
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
}

/// What the tc program keeps per local TCP or connected UDP socket (socket storage,
/// `names::SOCK`): the socket's flow clock, and its class with the inputs it was computed
/// from. A TCP socket is one flow while connected (one 5-tuple, one cgroup), a UDP socket for
/// the datagrams it sends to its peer while connected (the tc program checks the packet's
/// 5-tuple against the socket's), so its packets skip classification while the policy
/// generation, mark, DSCP and the socket's transmit hash are those of the cached answer, and
/// its flow clock needs no hash lookup.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SockState {
    /// Earliest departure (CLOCK_MONOTONIC ns) of the socket's next packet.
    pub t_next: u64,
    /// The policy generation `class` was computed under (0: none yet).
    pub generation: u64,
    /// The mark and DSCP `class` was computed for.
    pub mark: u32,
    pub class: u16,
    pub dscp: u8,
    /// Which limit held the socket's last paced packet (as [`FlowState::binding`]).
    pub binding: u8,
    /// DASR: the share its receiver advertised, line / N (wire bytes/s; 0: none), set by the
    /// ingress program from the receiver's ACKs; it caps the flow clock (`crate::dasr::cap`).
    pub dasr_rate: u64,
    /// When the receiver last advertised a share (CLOCK_MONOTONIC ns).
    pub dasr_seen_ns: u64,
    /// Since when the receiver has advertised a share higher than `dasr_rate` (0: it has not;
    /// see `crate::dasr::follow`).
    pub dasr_raise_ns: u64,
    /// The socket's transmit hash when `class` was computed (`skb->hash` of its packets, which
    /// the kernel sets from `sk_txhash`): connecting a socket draws a new one, so a UDP socket
    /// connected again to another peer, or a TCP socket disconnected (`AF_UNSPEC`) and
    /// connected again, is classified again. TCP also draws a new one after a retransmission
    /// timeout, which costs one classification more. Two draws alike: 1 in 2^32.
    pub txhash: u32,
    pub _pad: u32,
}
// 56 bytes: with the 8-byte header of socket storage's (cache-line aligned) data, one line.
const _: () = assert!(size_of::<SockState>() == 56);

impl SockState {
    /// Caches `class`, computed under policy `generation` for `pkt`, sent while the socket's
    /// transmit hash was `txhash`; the clock and the DASR share are kept.
    #[inline(always)]
    pub fn set_class(&mut self, generation: u64, pkt: &crate::classify::PacketInfo, class: u32, txhash: u32) {
        self.generation = generation;
        self.mark = pkt.mark;
        self.dscp = pkt.dscp;
        self.class = class as u16;
        self.txhash = txhash;
    }

    /// The cached class, if it was computed under policy `generation` for a packet with this
    /// mark and DSCP, sent while the socket's transmit hash was `txhash`.
    #[inline(always)]
    pub fn class_for(&self, generation: u64, pkt: &crate::classify::PacketInfo, txhash: u32) -> Option<u16> {
        (self.generation == generation
            && self.mark == pkt.mark
            && self.dscp == pkt.dscp
            && self.txhash == txhash)
            .then_some(self.class)
    }
}

/// One way of a CPU's socket memo ([`SockMemos`]): the class of a socket this CPU sent a packet
/// of, when that class keeps nothing in the socket's storage per packet (no flow clock, no DASR
/// share): the socket's next packet on this CPU takes it from here without touching the socket
/// or its storage (a helper call and three dependent loads through the socket, which the stack
/// has usually evicted from the cache since the socket's last packet: 5-10 ns a packet under
/// real traffic for one socket, `plbench traffic`).
///
/// The socket is told by its address in the kernel (`skb->sk`, compared, never dereferenced)
/// and its transmit hash (a socket freed and another made at the same address draws a new
/// one); the packet must be the socket's flow as the packet that filled the memo was (the same
/// protocol, ports and addresses: a connected UDP socket may `sendto` elsewhere), and the
/// class must hold for it as [`SockState::class_for`] checks (policy generation, mark, DSCP).
/// 32 bytes: a memo of 64 (the addresses whole) cost 5-10 ns more a packet under real traffic.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SockMemo {
    /// The socket's address (an identity only; 0: empty).
    pub sk: u64,
    /// The low 32 bits of the policy generation `class` was computed under.
    pub generation: u32,
    pub txhash: u32,
    pub mark: u32,
    /// `sport << 16 | dport`.
    pub ports: u32,
    /// [`addr_fold`] of the packet's addresses.
    pub addrs: u32,
    pub class: u16,
    pub dscp: u8,
    pub proto: u8,
}
const _: () = assert!(size_of::<SockMemo>() == 32);

/// A packet's source and destination addresses folded into 32 bits, as a sum of their words
/// times distinct odd constants (mod 2^32): two address pairs that differ in one word never
/// fold alike (an odd multiplier is invertible), and pairs that differ in more do with odds of
/// 1 in 2^32.
#[inline(always)]
pub const fn addr_fold(src: &[u32; 4], dst: &[u32; 4]) -> u32 {
    src[0]
        .wrapping_mul(0x9e37_79b1)
        .wrapping_add(src[1].wrapping_mul(0x85eb_ca77))
        .wrapping_add(src[2].wrapping_mul(0xc2b2_ae3d))
        .wrapping_add(src[3].wrapping_mul(0x27d4_eb2f))
        .wrapping_add(dst[0].wrapping_mul(0x1656_67b1))
        .wrapping_add(dst[1].wrapping_mul(0xd3a2_646d))
        .wrapping_add(dst[2].wrapping_mul(0xfd70_46c5))
        .wrapping_add(dst[3].wrapping_mul(0xb55a_4f09))
}

impl SockMemo {
    #[inline(always)]
    fn ports_of(pkt: &crate::classify::PacketInfo) -> u32 {
        (u32::from(pkt.sport) << 16) | u32::from(pkt.dport)
    }

    /// Remembers `class`, computed under policy `generation`, for the packets like `pkt` of the
    /// socket at `sk` while its transmit hash is `txhash`.
    #[inline(always)]
    pub fn set(
        &mut self,
        generation: u64,
        pkt: &crate::classify::PacketInfo,
        class: u32,
        sk: u64,
        txhash: u32,
    ) {
        self.sk = sk;
        self.generation = generation as u32;
        self.txhash = txhash;
        self.mark = pkt.mark;
        self.ports = Self::ports_of(pkt);
        self.addrs = addr_fold(&pkt.src, &pkt.dst);
        self.class = class as u16;
        self.dscp = pkt.dscp;
        self.proto = pkt.proto;
    }

    /// The remembered class, if `pkt`, sent by the socket at `sk` (nonzero) with transmit hash
    /// `txhash`, is another packet of the remembered socket's flow, under the same policy, mark
    /// and DSCP.
    #[inline(always)]
    pub fn class_for(
        &self,
        generation: u64,
        pkt: &crate::classify::PacketInfo,
        sk: u64,
        txhash: u32,
    ) -> Option<u16> {
        (sk != 0
            && self.sk == sk
            && self.txhash == txhash
            && self.generation == generation as u32
            && self.ports == Self::ports_of(pkt)
            && self.proto == pkt.proto
            && self.mark == pkt.mark
            && self.dscp == pkt.dscp
            && self.addrs == addr_fold(&pkt.src, &pkt.dst))
        .then_some(self.class)
    }
}

/// Ways of a CPU's socket memo (a power of two).
pub const SOCK_MEMO_WAYS: usize = 256;
const _: () = assert!(SOCK_MEMO_WAYS.is_power_of_two());

/// A CPU's socket memo beyond its last socket: [`SOCK_MEMO_WAYS`] ways of [`SockMemo`], one
/// socket a way, chosen by the packet's ports (a server's sockets differ in their peers' ports,
/// a client's in their own), so that a CPU that sends for many sockets in turn keeps each one's
/// class (the last socket alone missed every packet of 64 sockets in turn). 8 KiB a CPU, at
/// the end of its state: a packet reads one way, and only when the last socket is not its own
/// ([`memo_class`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SockMemos {
    pub ways: [SockMemo; SOCK_MEMO_WAYS],
}

impl Default for SockMemos {
    fn default() -> Self {
        SockMemos {
            ways: [SockMemo::default(); SOCK_MEMO_WAYS],
        }
    }
}

impl SockMemos {
    /// The way a packet's socket takes: the top bits of its ports times the golden ratio
    /// (Fibonacci hashing: ports that run in sequence on either side, or on both, spread over
    /// the ways; an XOR of the two ports put `(p, q)` and `(p + 1, q + 1)` in one way).
    #[inline(always)]
    pub fn way(pkt: &crate::classify::PacketInfo) -> usize {
        let ports = (u32::from(pkt.sport) << 16) | u32::from(pkt.dport);
        (ports.wrapping_mul(0x9e37_79b1) >> (32 - SOCK_MEMO_WAYS.trailing_zeros())) as usize
            & (SOCK_MEMO_WAYS - 1)
    }
}

/// The class a CPU's socket memo holds for `pkt` (sent by the socket at `sk` with transmit hash
/// `txhash`, under policy `generation`): the last socket's ([`CpuState::sock_memo`], beside
/// the parsed packet), else its way's, which then becomes the last socket's (a CPU sending
/// for one socket reads no line more than the packet's own).
#[inline(always)]
pub fn memo_class(
    last: &mut SockMemo,
    ways: &SockMemos,
    generation: u64,
    pkt: &crate::classify::PacketInfo,
    sk: u64,
    txhash: u32,
) -> Option<u16> {
    // A packet without a socket (forwarded, a container's) reads no way.
    if sk == 0 {
        return None;
    }
    if let Some(c) = last.class_for(generation, pkt, sk, txhash) {
        return Some(c);
    }
    let c = ways.ways[SockMemos::way(pkt)].class_for(generation, pkt, sk, txhash)?;
    last.set(generation, pkt, u32::from(c), sk, txhash);
    Some(c)
}

/// Remembers `class` for the socket's later packets on this CPU: as the last socket, and in its
/// way (the socket that held the way before is forgotten).
#[inline(always)]
pub fn memo_set(
    last: &mut SockMemo,
    ways: &mut SockMemos,
    generation: u64,
    pkt: &crate::classify::PacketInfo,
    class: u32,
    sk: u64,
    txhash: u32,
) {
    last.set(generation, pkt, class, sk, txhash);
    ways.ways[SockMemos::way(pkt)].set(generation, pkt, class, sk, txhash);
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
    // so the fewer bytes it spans, the fewer cache lines): the packet, its layout, the socket
    // memo's last socket, the trace's clocks and pending record (written whether a trace runs
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
    /// The last socket this CPU sent a packet of whose class keeps nothing in socket storage
    /// (see [`SockMemo`], [`memo_class`]).
    pub sock_memo: SockMemo,
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
    /// The other sockets this CPU sent packets of whose class keeps nothing in socket storage
    /// (see [`SockMemos`]): last, since a packet reads at most one way of it.
    pub sock_ways: SockMemos,
}
const _: () =
    assert!(size_of::<CpuState>() == 56 + 16 + 8 + 32 + 112 + 16 + 72 + 72 + 8 + 32 * SOCK_MEMO_WAYS);

pub use crate::d3::maps::*;

mod flows;
pub use flows::*;

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
    unsafe impl aya::Pod for crate::ctab::SelList {}
    unsafe impl aya::Pod for crate::ctab::RuleKey {}
}

/// IPv4-mapped form of a network-order IPv4 address word.
#[inline(always)]
pub const fn v4_mapped(addr_be: u32) -> [u32; 4] {
    [0, 0, u32::from_ne_bytes([0, 0, 0xff, 0xff]), addr_be]
}

#[cfg(test)]
mod sock_state_tests {
    use super::*;
    use crate::classify::PacketInfo;

    /// The cached class holds for the generation, mark, DSCP and transmit hash it was computed
    /// for, and for nothing else (a socket connected again has a new hash).
    #[test]
    fn a_socket_state_holds_for_what_it_was_computed_for() {
        let p = PacketInfo {
            mark: 9,
            dscp: 10,
            ..PacketInfo::default()
        };
        let mut st = SockState::default();
        assert_eq!(st.class_for(7, &p, 0x1234), None, "an empty state holds nothing");
        st.set_class(7, &p, 3, 0x1234);
        assert_eq!(st.class_for(7, &p, 0x1234), Some(3));
        assert_eq!(st.class_for(8, &p, 0x1234), None, "another policy");
        assert_eq!(st.class_for(7, &p, 0x1235), None, "connected again");
        assert_eq!(st.class_for(7, &PacketInfo { mark: 8, ..p }, 0x1234), None);
        assert_eq!(st.class_for(7, &PacketInfo { dscp: 0, ..p }, 0x1234), None);
    }

    /// The socket memo holds for the socket, flow, policy, mark and DSCP it was filled for, and
    /// for nothing else: another socket (address or transmit hash), another destination or
    /// source of the same socket (a connected UDP socket's `sendto`), other ports or protocol.
    /// Checked (2026-12-06): with the address fold's check patched out, "another destination"
    /// failed.
    #[test]
    fn a_socket_memo_holds_for_that_socket_and_flow_only() {
        let p = PacketInfo {
            src: v4_mapped(u32::from_ne_bytes([10, 0, 0, 1])),
            dst: v4_mapped(u32::from_ne_bytes([10, 0, 0, 2])),
            mark: 9,
            dscp: 10,
            proto: 17,
            sport: 4000,
            dport: 5000,
            ..PacketInfo::default()
        };
        let (sk, hash) = (0xffff_8880_1234_5600, 0xabcd);
        let mut m = SockMemo::default();
        assert_eq!(m.class_for(7, &p, sk, hash), None, "an empty memo holds nothing");
        assert_eq!(
            m.class_for(7, &p, 0, 0),
            None,
            "nor for a packet without a socket"
        );
        m.set(7, &p, 3, sk, hash);
        assert_eq!(m.class_for(7, &p, sk, hash), Some(3));
        assert_eq!(m.class_for(8, &p, sk, hash), None, "another policy");
        assert_eq!(m.class_for(7, &p, sk + 64, hash), None, "another socket");
        assert_eq!(
            m.class_for(7, &p, sk, hash + 1),
            None,
            "a socket made again at that address"
        );
        assert_eq!(m.class_for(7, &p, 0, hash), None, "no socket");
        for (what, q) in [
            ("mark", PacketInfo { mark: 8, ..p }),
            ("DSCP", PacketInfo { dscp: 0, ..p }),
            ("protocol", PacketInfo { proto: 6, ..p }),
            ("source port", PacketInfo { sport: 4001, ..p }),
            ("destination port", PacketInfo { dport: 5001, ..p }),
            (
                "destination",
                PacketInfo {
                    dst: v4_mapped(u32::from_ne_bytes([10, 0, 0, 3])),
                    ..p
                },
            ),
            (
                "source",
                PacketInfo {
                    src: v4_mapped(u32::from_ne_bytes([10, 0, 0, 9])),
                    ..p
                },
            ),
        ] {
            assert_eq!(m.class_for(7, &q, sk, hash), None, "another {what}");
        }
        // IPv6 destinations that differ only in a high word (same low word, same ports).
        let v6 = |w1: u32| PacketInfo {
            src: [0x2001_0db8u32.to_be(), 0, 0, 1u32.to_be()],
            dst: [0x2001_0db8u32.to_be(), w1.to_be(), 0, 5u32.to_be()],
            is_v6: 1,
            ..p
        };
        m.set(7, &v6(1), 4, sk, hash);
        assert_eq!(m.class_for(7, &v6(1), sk, hash), Some(4));
        assert_eq!(m.class_for(7, &v6(2), sk, hash), None, "another IPv6 destination");
    }

    /// A CPU's memo holds its last socket and one socket a way: sockets whose ports fold to
    /// other ways are all held, one whose ports fold to a held socket's way takes its place
    /// (unless it is the last socket).
    #[test]
    fn the_memo_holds_a_socket_a_way() {
        let p = |sport: u16, dport: u16| PacketInfo {
            proto: 6,
            sport,
            dport,
            ..PacketInfo::default()
        };
        let sk = |i: u16| 0x1000 + u64::from(i) * 2048;
        let (mut last, mut ways) = (SockMemo::default(), SockMemos::default());
        // A server's sockets: one local port, many peers' ports.
        for i in 0..64u16 {
            memo_set(
                &mut last,
                &mut ways,
                1,
                &p(443, 40000 + i),
                u32::from(i),
                sk(i),
                7,
            );
        }
        for i in (0..64u16).rev() {
            assert_eq!(
                memo_class(&mut last, &ways, 1, &p(443, 40000 + i), sk(i), 7),
                Some(i),
                "socket {i}"
            );
            assert_eq!(last.sk, sk(i), "a way's hit becomes the last socket");
        }
        let a = p(443, 40000);
        let other = (0..u16::MAX)
            .map(|d| p(443, d))
            .find(|q| q.dport != a.dport && SockMemos::way(q) == SockMemos::way(&a))
            .expect("ports in the same way");
        memo_set(&mut last, &mut ways, 1, &other, 99, 0x9000, 7);
        assert_eq!(
            memo_class(&mut last, &ways, 1, &a, sk(0), 7),
            None,
            "its way taken"
        );
        assert_eq!(memo_class(&mut last, &ways, 1, &other, 0x9000, 7), Some(99));
        assert_eq!(
            memo_class(&mut last, &ways, 2, &other, 0x9000, 7),
            None,
            "another policy"
        );
        assert!((0..u16::MAX).all(|d| SockMemos::way(&p(d, 80)) < SOCK_MEMO_WAYS));
    }

    /// Address pairs that differ in one word never fold alike (each word's multiplier is odd).
    #[test]
    fn address_pairs_one_word_apart_fold_apart() {
        let base = ([1u32, 2, 3, 4], [5u32, 6, 7, 8]);
        let f0 = addr_fold(&base.0, &base.1);
        for word in 0..8 {
            for delta in [1u32, 2, 0x8000_0000, 0xffff_ffff, 0x1234_5678] {
                let (mut s, mut d) = base;
                if word < 4 {
                    s[word] = s[word].wrapping_add(delta);
                } else {
                    d[word - 4] = d[word - 4].wrapping_add(delta);
                }
                assert_ne!(addr_fold(&s, &d), f0, "word {word} moved by {delta:#x}");
            }
        }
        // Source and destination swapped fold apart too.
        assert_ne!(addr_fold(&base.1, &base.0), f0);
    }
}
