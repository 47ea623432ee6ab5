//! Per-packet verdicts (`paceline trace`): what the tc egress program decided for one packet
//! and why, written into a BPF ring buffer while a trace runs.
//!
//! The agent writes a [`TraceConfig`] into [`names::TRACE_CFG`](crate::maps::names::TRACE_CFG);
//! while its `flags` has [`TRACE_ON`] the program records the packets that pass the filters
//! (drops and marks only, one class, one 5-tuple), one in `sample`, at most `per_sec` a second
//! on each CPU ([`TraceGate`]). Off, the cost is one load of the flags word per packet.
//!
//! A [`TraceRecord`] names each clock's slot (flow, class, QJump level: when each would have
//! let the packet go), the departure written and the clock that set it ([`mod@binding`]).

use crate::classify::FlowKey;

/// [`TraceConfig::flags`]: tracing is on.
pub const TRACE_ON: u32 = 1 << 0;
/// Only packets dropped (horizon, CoDel) or CE-marked.
pub const TRACE_DROPS_ONLY: u32 = 1 << 1;
/// Only packets of class [`TraceConfig::class`].
pub const TRACE_CLASS: u32 = 1 << 2;
/// Only packets of the 5-tuple [`TraceConfig::flow`] (either direction is not matched: the
/// tuple as it leaves).
pub const TRACE_FLOW: u32 = 1 << 3;

/// What the agent asks of the datapath (the value of `PL_TRACE_CFG`, one entry).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TraceConfig {
    /// `TRACE_*` bits; 0: off.
    pub flags: u32,
    /// Record one packet in `sample` of those that pass the filters (0 and 1: every one).
    pub sample: u32,
    /// The class index [`TRACE_CLASS`] selects.
    pub class: u32,
    /// At most this many records a second on each CPU (0: none at all).
    pub per_sec: u32,
    /// Identifies the trace session; copied into every record, so that a reader can tell a
    /// record of an earlier session still in the ring from one of its own.
    pub session: u64,
    /// The 5-tuple [`TRACE_FLOW`] selects.
    pub flow: FlowKey,
}
const _: () = assert!(size_of::<TraceConfig>() == 64);

/// [`TraceRecord::action`]: what became of the packet.
pub mod action {
    /// Passed (maybe with a departure time).
    pub const PASSED: u8 = 0;
    /// Dropped: its departure lay beyond the horizon.
    pub const DROP_HORIZON: u8 = 1;
    /// Dropped by CoDel (not ECN-capable).
    pub const DROP_CODEL: u8 = 2;
    /// Passed with its ECN field set to CE by CoDel.
    pub const MARK_CODEL: u8 = 3;
    /// Passed untouched: not IP (after at most two VLAN tags).
    pub const UNPARSED_NON_IP: u8 = 4;
    /// Passed untouched: shorter than its headers, or headers outside the linear data.
    pub const UNPARSED_TRUNCATED: u8 = 5;
    /// Passed untouched: headers that contradict themselves.
    pub const UNPARSED_MALFORMED: u8 = 6;
    /// Passed untouched: more IPv6 extension headers than the parser follows.
    pub const UNPARSED_V6_EXT: u8 = 7;
    /// The number of actions (names in [`super::action_name`]).
    pub const COUNT: usize = 8;
}

/// [`TraceRecord::binding`]: which limit set the departure.
pub mod binding {
    /// No clock applies to the packet's class (no rate), or it was not paced.
    pub const NONE: u8 = 0;
    /// Clocks apply but none held the packet: it left at the stack's own time (`floor`).
    pub const NOT_HELD: u8 = 1;
    /// The flow clock (the flow's rate, or its DASR share) was the latest.
    pub const FLOW: u8 = 2;
    /// The class clock was the latest.
    pub const CLASS: u8 = 3;
    /// The QJump level's clock was the latest.
    pub const LEVEL: u8 = 4;
    /// The number of values (names in [`super::binding_name`]).
    pub const COUNT: usize = 5;
}

/// [`TraceRecord::flags`]: the packet is IPv6.
pub const TR_V6: u8 = 1 << 0;
/// It belongs to a local socket that is one flow with it (TCP, or connected UDP to its peer;
/// class and flow clock in socket storage), or, its class taken from the CPU's class memo, it
/// carries a local socket of any kind.
pub const TR_SOCKET: u8 = 1 << 1;
/// Its class came from a cache (socket storage or the flow table), not the classifier.
pub const TR_CACHED: u8 = 1 << 2;
/// A GSO packet (`len` counts every segment's headers).
pub const TR_GSO: u8 = 1 << 3;
/// Its DSCP or PCP was rewritten.
pub const TR_TAGGED: u8 = 1 << 4;
/// The fields after `action` are unknown: the packet was not parsed.
pub const TR_UNPARSED: u8 = 1 << 5;
/// The packet carries a VLAN tag outside its bytes (`skb->vlan_tci`, a hardware-accelerated
/// tag): [`TraceRecord::vlan_tci`] holds it. A tag inside the bytes is in `head`.
pub const TR_VLAN: u8 = 1 << 6;

/// [`TraceRecord::rule`]: no rule matched (the default class), or the class came from a cache.
pub const NO_RULE: u32 = u32::MAX;
const _: () = assert!(NO_RULE == crate::ctab::NONE);

/// The ring buffer's size (a power of two pages): about 1,900 records.
pub const TRACE_RING_BYTES: u32 = 512 * 1024;

/// At most this many bytes of the packet (from its link-layer header) ride in a record.
pub const TRACE_HEAD: usize = 128;

/// The clocks' view of one packet, gathered while it is paced (in the CPU's scratch state).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TraceClocks {
    /// The earliest the packet could leave: the stack's timestamp, or now.
    pub floor_ns: u64,
    /// When each clock would have let it go (its slot start; 0: the clock does not apply).
    pub flow_ns: u64,
    pub class_ns: u64,
    pub level_ns: u64,
    /// The departure written (0: the timestamp was left alone).
    pub depart_ns: u64,
}
const _: () = assert!(size_of::<TraceClocks>() == 40);

/// What the tc program knows of a decided packet, stored before the record is built: the
/// record's code then reads it back from memory, so the verifier walks that code once rather
/// than once for each combination of values the program's paths arrive with.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TracePending {
    pub flow_rate: u64,
    pub dasr_rate: u64,
    pub wire_len: u32,
    /// The rule the classifier matched ([`NO_RULE`]: none, the default class). Stored by the
    /// classifier's path only, whether a trace runs or not; a cached packet's (`TR_CACHED`) is
    /// stale and not recorded.
    pub rule: u32,
    pub class: u16,
    pub level: u8,
    pub action: u8,
    /// `TR_*` bits, and [`TP_PACED`].
    pub flags: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(size_of::<TracePending>() == 32);

/// [`TracePending::flags`] (not in records): the pacer ran, so the clocks are the packet's.
pub const TP_PACED: u8 = 1 << 7;

/// One CPU's tracing state (in `CpuState`): the per-second cap's window, the clocks of the
/// packet being decided, and counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TraceCpu {
    /// Written on every paced packet, traced or not, and `pending` on every packet: first, so
    /// that they sit beside the rest of what a packet touches in `CpuState`.
    pub clocks: TraceClocks,
    pub pending: TracePending,
    pub gate: TraceGate,
    /// Records written into the ring buffer.
    pub emitted: u64,
    /// Packets that passed the filters and the sampling but not the per-second cap.
    pub capped: u64,
    /// Records the ring buffer had no room for (the reader fell behind).
    pub lost: u64,
}
const _: () = assert!(size_of::<TraceCpu>() == 40 + 32 + 16 + 24);

impl TraceCpu {
    pub fn add(&mut self, o: &TraceCpu) {
        self.emitted = self.emitted.wrapping_add(o.emitted);
        self.capped = self.capped.wrapping_add(o.capped);
        self.lost = self.lost.wrapping_add(o.lost);
    }
}

/// The per-second cap and the sampling counter of one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TraceGate {
    /// Start of the current one-second window (ns).
    pub window_ns: u64,
    /// Records admitted in the window.
    pub in_window: u32,
    /// Packets seen since the last sampled one.
    pub skipped: u32,
}

/// What [`TraceGate::admit`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Record this packet.
    Yes,
    /// Not this one (1 in `sample`).
    Sampled,
    /// The second's cap is reached (counted in [`TraceCpu::capped`]).
    Capped,
}

impl TraceGate {
    /// One in `sample` packets (0 and 1: each); needs no clock, so the packets sampled out
    /// do not pay for reading it.
    #[inline(always)]
    pub fn sampled(&mut self, sample: u32) -> bool {
        if sample > 1 {
            self.skipped += 1;
            if self.skipped < sample {
                return false;
            }
            self.skipped = 0;
        }
        true
    }

    /// At most `per_sec` a one-second window ending at `now`.
    #[inline(always)]
    pub fn within_cap(&mut self, now: u64, per_sec: u32) -> bool {
        if now.wrapping_sub(self.window_ns) >= 1_000_000_000 {
            self.window_ns = now;
            self.in_window = 0;
        }
        if self.in_window >= per_sec {
            return false;
        }
        self.in_window += 1;
        true
    }

    /// Both, in that order.
    #[inline(always)]
    pub fn admit(&mut self, now: u64, sample: u32, per_sec: u32) -> Admit {
        if !self.sampled(sample) {
            return Admit::Sampled;
        }
        if !self.within_cap(now, per_sec) {
            return Admit::Capped;
        }
        Admit::Yes
    }
}

/// One traced packet (a ring buffer record). Times are CLOCK_MONOTONIC ns.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceRecord {
    /// When the program decided (read only for traced packets).
    pub time_ns: u64,
    pub session: u64,
    pub clocks: TraceClocks,
    /// The DASR share capping the flow clock (wire bytes/s; 0: none).
    pub dasr_rate: u64,
    /// The pacing rate D3 last applied to the packet's socket (bytes/s; 0: none).
    pub d3_rate: u64,
    /// The flow's rate in force, after any DASR cap (bytes/s; 0: no flow clock).
    pub flow_rate: u64,
    /// The 5-tuple as it leaves (addresses as IPv4-mapped IPv6 words, network byte order).
    pub key: FlowKey,
    pub ifindex: u32,
    /// Wire bytes the clocks charged (every GSO segment's headers).
    pub wire_len: u32,
    /// `skb->len`.
    pub pkt_len: u32,
    pub class: u16,
    pub level: u8,
    pub action: u8,
    /// Unused by the datapath (0): the reader computes the binding clock with [`binding()`].
    pub binding: u8,
    /// The DSCP the packet arrived with (the one after any rewrite is in `head`).
    pub dscp_before: u8,
    pub _pad1: u8,
    /// `TR_*` bits.
    pub flags: u8,
    /// How many bytes of `head` hold the packet.
    pub head_len: u16,
    /// The VLAN tag outside the packet's bytes, with [`TR_VLAN`] (see [`TraceRecord::vlan`]).
    pub vlan_tci: u16,
    /// The index of the policy's rule that selected the class ([`NO_RULE`]: none matched, or
    /// the class came from a cache and the classifier did not run).
    pub rule: u32,
    pub _pad: u32,
    pub head: [u8; TRACE_HEAD],
}
const _: () = assert!(size_of::<TraceRecord>() == 16 + 40 + 24 + 40 + 12 + 8 + 4 + 8 + TRACE_HEAD);

impl TraceRecord {
    /// A record of zeroes (what the datapath starts from).
    pub const ZERO: TraceRecord = TraceRecord {
        time_ns: 0,
        session: 0,
        clocks: TraceClocks {
            floor_ns: 0,
            flow_ns: 0,
            class_ns: 0,
            level_ns: 0,
            depart_ns: 0,
        },
        dasr_rate: 0,
        d3_rate: 0,
        flow_rate: 0,
        key: FlowKey {
            src: [0; 4],
            dst: [0; 4],
            sport: 0,
            dport: 0,
            proto: 0,
            _pad: [0; 3],
        },
        ifindex: 0,
        wire_len: 0,
        pkt_len: 0,
        class: 0,
        level: 0,
        action: 0,
        binding: 0,
        dscp_before: 0,
        _pad1: 0,
        flags: 0,
        head_len: 0,
        vlan_tci: 0,
        rule: NO_RULE,
        _pad: 0,
        head: [0; TRACE_HEAD],
    };

    /// The record from the bytes the ring buffer delivered (`None`: too short).
    pub fn from_bytes(b: &[u8]) -> Option<TraceRecord> {
        if b.len() < size_of::<TraceRecord>() {
            return None;
        }
        // SAFETY: the length is checked; every bit pattern is a valid TraceRecord (integers
        // and byte arrays only); read_unaligned copes with any alignment.
        Some(unsafe { core::ptr::read_unaligned(b.as_ptr().cast::<TraceRecord>()) })
    }

    /// The delay the clocks added beyond the stack's own departure (ns).
    pub fn added_delay_ns(&self) -> u64 {
        self.clocks.depart_ns.saturating_sub(self.clocks.floor_ns)
    }

    /// The packet's VLAN id: the tag outside its bytes ([`TR_VLAN`]), else the outer 802.1Q
    /// or 802.1ad tag of the Ethernet frame in `head`; `None`: untagged.
    pub fn vlan(&self) -> Option<u16> {
        if self.flags & TR_VLAN != 0 {
            return Some(self.vlan_tci & 0x0fff);
        }
        let head = &self.head[..(self.head_len as usize).min(TRACE_HEAD)];
        match head.get(12..16)? {
            [0x81, 0x00, hi, lo] | [0x88, 0xa8, hi, lo] => Some(u16::from_be_bytes([*hi, *lo]) & 0x0fff),
            _ => None,
        }
    }
}

/// The [`mod@binding`] value a paced packet's flow keeps (`FlowState::binding`,
/// `SockState::binding`): the clock that held it ([`held_index`]'s value, when `delayed`), or
/// [`binding::NOT_HELD`].
#[inline(always)]
pub const fn held_binding(delayed: bool, held: usize) -> u8 {
    match (delayed, held) {
        (false, _) => binding::NOT_HELD,
        (true, 0) => binding::FLOW,
        (true, 1) => binding::CLASS,
        _ => binding::LEVEL,
    }
}

/// Which clock set `depart`: the latest slot among those that apply (0: not applying), the
/// flow clock first, then the class, then the level on a tie. `NOT_HELD` when the departure is
/// the floor itself (no clock held the packet) and `NONE` when no clock applied.
#[inline(always)]
pub fn binding(floor: u64, flow: u64, class: u64, level: u64, depart: u64) -> u8 {
    if flow | class | level == 0 {
        return binding::NONE;
    }
    if depart <= floor {
        return binding::NOT_HELD;
    }
    if flow != 0 && flow >= class && flow >= level {
        binding::FLOW
    } else if class != 0 && class >= level {
        binding::CLASS
    } else {
        binding::LEVEL
    }
}

/// Which of [`Counters::held_by`](crate::maps::Counters::held_by) a delayed packet counts in:
/// 0 its flow clock, 1 its class clock, 2 its level clock; the clock whose slot is the
/// departure, in [`mod@binding`]'s order on a tie (flow, class, level). A departure that no slot
/// equals (another CPU reserved the class's or level's clock in between) counts as the
/// level's. Call it only for a delayed packet (a clock that does not apply reads as the floor,
/// which a delayed packet's departure lies past).
#[inline(always)]
pub fn held_index(flow_ns: u64, class_ns: u64, depart_ns: u64) -> usize {
    if flow_ns == depart_ns {
        0
    } else if class_ns == depart_ns {
        1
    } else {
        2
    }
}

/// The names of [`held_index`]'s values.
pub const HELD_BY: [&str; 3] = ["flow", "class", "level"];

/// The name of an [`action`] (`"?"` for a value this build does not know).
pub fn action_name(a: u8) -> &'static str {
    match a {
        action::PASSED => "passed",
        action::DROP_HORIZON => "dropped-horizon",
        action::DROP_CODEL => "dropped-codel",
        action::MARK_CODEL => "marked-codel",
        action::UNPARSED_NON_IP => "unparsed-non-ip",
        action::UNPARSED_TRUNCATED => "unparsed-truncated",
        action::UNPARSED_MALFORMED => "unparsed-malformed",
        action::UNPARSED_V6_EXT => "unparsed-ipv6-ext-limit",
        _ => "?",
    }
}

/// The name of a [`mod@binding`] value.
pub fn binding_name(b: u8) -> &'static str {
    match b {
        binding::NONE => "none",
        binding::NOT_HELD => "not-held",
        binding::FLOW => "flow",
        binding::CLASS => "class",
        binding::LEVEL => "level",
        _ => "?",
    }
}

/// Whether an action is what `--drops` asks for (a drop or a CE mark).
#[inline(always)]
pub const fn is_drop_or_mark(a: u8) -> bool {
    matches!(a, action::DROP_HORIZON | action::DROP_CODEL | action::MARK_CODEL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_clock_binds_and_ties_go_to_the_flow_then_the_class() {
        // no clock applies
        assert_eq!(binding(100, 0, 0, 0, 100), binding::NONE);
        // clocks apply, none later than the floor
        assert_eq!(binding(100, 100, 100, 0, 100), binding::NOT_HELD);
        assert_eq!(binding(100, 150, 120, 110, 150), binding::FLOW);
        assert_eq!(binding(100, 120, 150, 110, 150), binding::CLASS);
        assert_eq!(binding(100, 120, 130, 150, 150), binding::LEVEL);
        assert_eq!(binding(100, 0, 0, 150, 150), binding::LEVEL);
        assert_eq!(binding(100, 0, 150, 0, 150), binding::CLASS);
        assert_eq!(binding(100, 150, 150, 150, 150), binding::FLOW);
        assert_eq!(binding(100, 0, 150, 150, 150), binding::CLASS);
    }

    #[test]
    fn held_index_agrees_with_the_binding_clock() {
        let floor = 100;
        for (f, c, l) in [
            (150, 120, 110),
            (120, 150, 110),
            (120, 130, 150),
            (150, 150, 150),
            (100, 150, 150),
            (100, 100, 150),
            (150, 100, 100),
        ] {
            let depart = f.max(c).max(l);
            let b = binding(floor, f, c, l, depart);
            assert_eq!(HELD_BY[held_index(f, c, depart)], binding_name(b), "{f} {c} {l}");
            assert_eq!(
                held_binding(depart > floor, held_index(f, c, depart)),
                b,
                "{f} {c} {l}"
            );
        }
    }

    #[test]
    fn the_gate_samples_one_in_n_and_caps_each_second() {
        let mut g = TraceGate::default();
        let t0 = 5_000_000_000;
        // one in 4
        let got: [Admit; 8] = core::array::from_fn(|_| g.admit(t0, 4, 100));
        assert_eq!(got.iter().filter(|a| **a == Admit::Yes).count(), 2, "{got:?}");
        assert_eq!(got[3], Admit::Yes);
        // every packet, three a second
        let mut g = TraceGate::default();
        let got: [Admit; 5] = core::array::from_fn(|i| g.admit(t0 + i as u64, 1, 3));
        assert_eq!(
            got,
            [Admit::Yes, Admit::Yes, Admit::Yes, Admit::Capped, Admit::Capped]
        );
        // the next second opens a new window
        assert_eq!(g.admit(t0 + 1_000_000_000, 0, 3), Admit::Yes);
        // a cap of 0 admits nothing
        let mut g = TraceGate::default();
        assert_eq!(g.admit(t0, 1, 0), Admit::Capped);
    }

    #[test]
    fn a_record_reads_back_from_its_bytes() {
        let mut r = TraceRecord::ZERO;
        r.class = 7;
        r.action = action::MARK_CODEL;
        r.head[0] = 0xaa;
        r.head_len = 1;
        // SAFETY: plain old data.
        let bytes = unsafe {
            core::slice::from_raw_parts((&r as *const TraceRecord).cast::<u8>(), size_of::<TraceRecord>())
        };
        assert_eq!(TraceRecord::from_bytes(bytes), Some(r));
        assert_eq!(TraceRecord::from_bytes(&bytes[..10]), None);
        assert_eq!(r.rule, NO_RULE);
        assert!(is_drop_or_mark(r.action));
        assert!(!is_drop_or_mark(action::PASSED));
        for a in 0..action::COUNT as u8 {
            assert_ne!(action_name(a), "?");
        }
        for b in 0..binding::COUNT as u8 {
            assert_ne!(binding_name(b), "?");
        }
    }

    #[test]
    fn a_record_names_its_vlan_in_or_outside_the_bytes() {
        let mut r = TraceRecord::ZERO;
        assert_eq!(r.vlan(), None, "no bytes");
        // dst, src, 802.1Q tag (PCP 5, VLAN 100), IPv4
        let frame = [
            0u8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0x81, 0x00, 0xa0, 100, 0x08, 0x00,
        ];
        r.head[..frame.len()].copy_from_slice(&frame);
        r.head_len = frame.len() as u16;
        assert_eq!(r.vlan(), Some(100));
        r.head[12] = 0x88;
        r.head[13] = 0xa8;
        assert_eq!(r.vlan(), Some(100), "802.1ad");
        r.head[12] = 0x08;
        r.head[13] = 0x00;
        assert_eq!(r.vlan(), None, "untagged IPv4");
        r.flags |= TR_VLAN;
        r.vlan_tci = 0xe000 | 42;
        assert_eq!(
            r.vlan(),
            Some(42),
            "the accelerated tag, without its priority bits"
        );
    }
}
