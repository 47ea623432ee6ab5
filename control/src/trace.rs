//! `paceline trace`'s records as the agent serves them and the command shows them: one
//! [`Msg`] a line (JSON) on `/trace`, rendered as text or written as pcapng (see
//! [`PcapWriter`]), the verdict as each packet's comment.
//!
//! The datapath's record is `paceline_common::trace::TraceRecord`; [`Line::from_record`]
//! names what it holds with the policy in force when the trace started ([`Names`]).

use std::{net::IpAddr, sync::Arc};

use anyhow::{Context as _, Result};
use paceline_common::maps::{MAX_CLASSES, MAX_LEVELS, PolicyTable};
use paceline_common::trace::{
    NO_RULE, TR_CACHED, TR_GSO, TR_SOCKET, TR_UNPARSED, TR_V6, TraceRecord, action_name, binding,
    binding_name,
};
use paceline_policy::RuleInfo;
use serde::{Deserialize, Serialize};

/// What a line of `/trace` carries.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
#[allow(
    clippy::large_enum_variant,
    reason = "one message per line of a trace's stream, built and sent at once: its size costs nothing"
)]
pub enum Msg {
    /// The trace started: what it records.
    Start(Start),
    /// One traced packet.
    Record(Line),
    /// Sent every second (so that a reader's departure is noticed): the counts so far.
    Heartbeat(Totals),
    /// The last line: why the trace ended, and the counts.
    End(End),
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Start {
    pub session: u64,
    /// The filters and limits, as the agent understood them.
    pub filter: String,
    /// At most this many records a second on each CPU.
    pub per_sec: u32,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Totals {
    /// Records this session received.
    pub records: u64,
    /// Packets the per-second cap left out (all sessions' since the agent started, as
    /// counted by the datapath, minus those before this session).
    pub capped: u64,
    /// Records the ring buffer had no room for (the reader fell behind).
    pub lost: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct End {
    /// `count reached`, `time is up`, `the agent is stopping`, or an error.
    pub reason: String,
    #[serde(flatten)]
    pub totals: Totals,
}

/// One traced packet.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Line {
    /// When the datapath decided (Unix time, ns).
    pub unix_ns: u64,
    /// The same moment on CLOCK_MONOTONIC (the clocks' time base), ns.
    pub mono_ns: u64,
    pub iface: String,
    /// `tcp`, `udp`, `icmp`, the protocol number otherwise; absent for an unparsed frame.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proto: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub src: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dst: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level: Option<String>,
    /// The policy's rule that selected the class, where it is in the file and what it matches
    /// (`spec.rules[2]: udp dst_port 53`); absent when no rule matched (the default class) or
    /// the class came from the socket's or the flow table's cache (`cached` in `flags`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The VLAN id the packet carries (the tag in its bytes or the one the stack keeps beside
    /// them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// `passed`, `dropped-horizon`, `dropped-codel`, `marked-codel`, `unparsed-*`.
    pub action: String,
    /// Which limit set the departure: `flow`, `class`, `level`, `not-held` (clocks apply, none
    /// held it), `none` (no clock applies, or CoDel dropped it first).
    pub binding: String,
    /// The delay the clocks added to the stack's own departure, ns (for a horizon drop, the
    /// delay it would have had).
    pub delay_ns: u64,
    /// How far past the packet's earliest departure each applying clock stood, ns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flow_clock_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class_clock_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level_clock_ns: Option<u64>,
    /// The flow's rate in force (after any DASR share), bytes/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flow_rate: Option<u64>,
    /// The DASR share capping the flow clock, bytes/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dasr_rate: Option<u64>,
    /// The pacing rate D3 last applied to the socket, bytes/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub d3_rate: Option<u64>,
    /// Wire bytes the clocks charged (every GSO segment's headers).
    pub wire_len: u32,
    /// The packet's length (skb->len).
    pub len: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dscp_before: Option<u8>,
    /// As it left (read from the packet's bytes, after any rewrite).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dscp_after: Option<u8>,
    /// `ipv6`, `socket` (a local TCP socket's), `cached` (its class came from the socket's or
    /// the flow table's cache), `gso`.
    pub flags: Vec<String>,
    /// The packet's first bytes (at most 128, from its link-layer header), hex.
    pub head: String,
}

/// The policy's names and rates, to name a record's class and level and to tell which clocks
/// applied to it.
#[derive(Clone, Debug, Default)]
pub struct Names {
    pub classes: Vec<Option<String>>,
    pub levels: Vec<String>,
    pub class_rates: Vec<u64>,
    pub level_rates: Vec<u64>,
    /// The table's rules by index (shared with the compiled policy, not copied).
    pub rules: Arc<[RuleInfo]>,
}

impl Names {
    pub fn new(
        table: &PolicyTable,
        classes: &[Option<String>],
        levels: &[String],
        rules: &Arc<[RuleInfo]>,
    ) -> Names {
        Names {
            classes: classes.to_vec(),
            levels: levels.to_vec(),
            rules: rules.clone(),
            class_rates: table
                .classes
                .iter()
                .take(MAX_CLASSES)
                .map(|c| c.class_rate)
                .collect(),
            level_rates: table.levels.iter().take(MAX_LEVELS).map(|l| l.rate).collect(),
        }
    }
}

/// An interface's name from its index (`ifN` when it is gone).
pub fn iface_name(ifindex: u32) -> String {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: the buffer has IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return format!("if{ifindex}");
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn addr(w: &[u32; 4], v6: bool) -> IpAddr {
    let b: Vec<u8> = w.iter().flat_map(|x| x.to_ne_bytes()).collect();
    let v = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(b.as_slice()).unwrap_or([0; 16]));
    match (v6, v.to_ipv4_mapped()) {
        (false, Some(v4)) => IpAddr::V4(v4),
        _ => IpAddr::V6(v),
    }
}

fn endpoint(a: IpAddr, port: u16, with_port: bool) -> String {
    match (a, with_port) {
        (IpAddr::V6(v), true) => format!("[{v}]:{port}"),
        (a, true) => format!("{a}:{port}"),
        (a, false) => a.to_string(),
    }
}

fn proto_name(p: u8) -> String {
    match p {
        6 => "tcp".into(),
        17 => "udp".into(),
        1 => "icmp".into(),
        58 => "icmpv6".into(),
        132 => "sctp".into(),
        n => n.to_string(),
    }
}

/// The DSCP of the IP packet in an Ethernet frame's first bytes (after at most two VLAN tags).
pub fn frame_dscp(head: &[u8]) -> Option<u8> {
    let mut off = 12;
    let mut ethertype = u16::from_be_bytes([*head.get(off)?, *head.get(off + 1)?]);
    for _ in 0..2 {
        if ethertype == 0x8100 || ethertype == 0x88a8 {
            off += 4;
            ethertype = u16::from_be_bytes([*head.get(off)?, *head.get(off + 1)?]);
        }
    }
    let ip = off + 2;
    match ethertype {
        0x0800 => Some(head.get(ip + 1)? >> 2),
        0x86dd => {
            let tc = (head.get(ip)? & 0x0f) << 4 | head.get(ip + 1)? >> 4;
            Some(tc >> 2)
        }
        _ => None,
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Result<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        anyhow::bail!("odd length");
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).context("not hex"))
        .collect()
}

impl Line {
    /// Names what `r` holds; `mono_to_unix` is Unix time minus CLOCK_MONOTONIC, ns.
    pub fn from_record(r: &TraceRecord, names: &Names, mono_to_unix: i128) -> Line {
        let head = &r.head[..(r.head_len as usize).min(r.head.len())];
        let unix_ns = (r.time_ns as i128 + mono_to_unix).max(0) as u64;
        let mut flags = Vec::new();
        for (bit, name) in [
            (TR_V6, "ipv6"),
            (TR_SOCKET, "socket"),
            (TR_CACHED, "cached"),
            (TR_GSO, "gso"),
        ] {
            if r.flags & bit != 0 {
                flags.push(name.to_string());
            }
        }
        let base = Line {
            unix_ns,
            mono_ns: r.time_ns,
            iface: iface_name(r.ifindex),
            proto: None,
            src: None,
            dst: None,
            class: None,
            level: None,
            rule: None,
            vlan: r.vlan(),
            action: action_name(r.action).to_string(),
            binding: binding_name(binding::NONE).to_string(),
            delay_ns: 0,
            flow_clock_ns: None,
            class_clock_ns: None,
            level_clock_ns: None,
            flow_rate: None,
            dasr_rate: None,
            d3_rate: None,
            wire_len: r.wire_len,
            len: r.pkt_len,
            dscp_before: None,
            dscp_after: frame_dscp(head),
            flags,
            head: hex(head),
        };
        if r.flags & TR_UNPARSED != 0 {
            return base;
        }
        let v6 = r.flags & TR_V6 != 0;
        let k = &r.key;
        let ports = matches!(k.proto, 6 | 17 | 132);
        let class = r.class as usize;
        let level = r.level as usize;
        // Which clocks applied: the flow's when it had a rate; the class's and the level's when
        // the policy gave them one. One that did not apply reads as the floor.
        let c = &r.clocks;
        let paced = c.floor_ns != 0;
        let applies = |yes: bool, t: u64| if yes && paced { t } else { 0 };
        let flow = applies(r.flow_rate != 0, c.flow_ns);
        let cls = applies(
            names.class_rates.get(class).copied().unwrap_or(0) != 0,
            c.class_ns,
        );
        let lvl = applies(
            names.level_rates.get(level).copied().unwrap_or(0) != 0,
            c.level_ns,
        );
        let b = if paced {
            binding(c.floor_ns, flow, cls, lvl, c.depart_ns)
        } else {
            binding::NONE
        };
        let ahead = |t: u64| (t != 0).then(|| t.saturating_sub(c.floor_ns));
        Line {
            proto: Some(proto_name(k.proto)),
            src: Some(endpoint(addr(&k.src, v6), k.sport, ports)),
            dst: Some(endpoint(addr(&k.dst, v6), k.dport, ports)),
            class: Some(
                names
                    .classes
                    .get(class)
                    .cloned()
                    .flatten()
                    .unwrap_or_else(|| format!("#{class}")),
            ),
            level: Some(
                names
                    .levels
                    .get(level)
                    .cloned()
                    .unwrap_or_else(|| format!("#{level}")),
            ),
            rule: (r.rule != NO_RULE && r.flags & TR_CACHED == 0).then(|| {
                match names.rules.get(r.rule as usize) {
                    Some(ri) => format!("{}: {}", ri.origin, ri.matches),
                    None => format!("#{}", r.rule),
                }
            }),
            binding: binding_name(b).to_string(),
            delay_ns: if paced { r.added_delay_ns() } else { 0 },
            flow_clock_ns: ahead(flow),
            class_clock_ns: ahead(cls),
            level_clock_ns: ahead(lvl),
            flow_rate: (r.flow_rate != 0).then_some(r.flow_rate),
            dasr_rate: (r.dasr_rate != 0).then_some(r.dasr_rate),
            d3_rate: (r.d3_rate != 0).then_some(r.d3_rate),
            dscp_before: Some(r.dscp_before),
            ..base
        }
    }

    /// The verdict in a few words (the text view and the pcapng comment):
    /// `class bulk level 1: passed, held 1.20 ms by the class clock (flow +0.30 ms, class +1.20 ms)`.
    pub fn verdict(&self) -> String {
        let mut s = String::new();
        if let (Some(c), Some(l)) = (&self.class, &self.level) {
            s.push_str(&format!("class {c} level {l}"));
            match &self.rule {
                Some(r) => s.push_str(&format!(" (rule {r}): ")),
                None => s.push_str(": "),
            }
        }
        s.push_str(&self.action);
        match self.binding.as_str() {
            "flow" | "class" | "level" => s.push_str(&format!(
                ", held {} by the {} clock",
                ms(self.delay_ns),
                self.binding
            )),
            "not-held" => s.push_str(", not held"),
            _ => {}
        }
        let clocks: Vec<String> = [
            ("flow", self.flow_clock_ns),
            ("class", self.class_clock_ns),
            ("level", self.level_clock_ns),
        ]
        .iter()
        .filter_map(|(n, v)| v.map(|v| format!("{n} +{}", ms(v))))
        .collect();
        if !clocks.is_empty() {
            s.push_str(&format!(" ({})", clocks.join(", ")));
        }
        if let Some(r) = self.dasr_rate {
            s.push_str(&format!(", DASR share {}", rate(r)));
        }
        if let Some(r) = self.d3_rate {
            s.push_str(&format!(", D3 rate {}", rate(r)));
        }
        if let (Some(a), Some(b)) = (self.dscp_before, self.dscp_after)
            && a != b
        {
            s.push_str(&format!(", dscp {a} -> {b}"));
        }
        s
    }

    /// One line of `paceline trace`'s text output.
    pub fn text(&self) -> String {
        let t = chrono_like(self.unix_ns);
        let mut what = match (&self.proto, &self.src, &self.dst) {
            (Some(p), Some(s), Some(d)) => format!("{p} {s} > {d}"),
            _ => "(not parsed)".to_string(),
        };
        if let Some(v) = self.vlan {
            what.push_str(&format!(" vlan {v}"));
        }
        format!("{t} {} {what} len {}: {}", self.iface, self.len, self.verdict())
    }

    /// The packet's first bytes.
    pub fn head_bytes(&self) -> Result<Vec<u8>> {
        unhex(&self.head).context("the record's head is not hex")
    }
}

fn ms(ns: u64) -> String {
    format!("{:.2} ms", ns as f64 / 1e6)
}

fn rate(bytes_per_s: u64) -> String {
    format!("{:.1} Mbit/s", bytes_per_s as f64 * 8.0 / 1e6)
}

/// `HH:MM:SS.micros` (UTC) of a Unix time in ns.
fn chrono_like(unix_ns: u64) -> String {
    let secs = unix_ns / 1_000_000_000;
    let micros = (unix_ns % 1_000_000_000) / 1000;
    let d = secs % 86_400;
    format!("{:02}:{:02}:{:02}.{micros:06}", d / 3600, d % 3600 / 60, d % 60)
}

/// Writes traced packets as pcapng: one interface description per interface seen, and each
/// packet's first bytes as an enhanced packet block whose comment is its verdict.
pub struct PcapWriter<W: std::io::Write> {
    w: pcap_file::pcapng::PcapNgWriter<W>,
    ifaces: Vec<String>,
}

impl<W: std::io::Write> PcapWriter<W> {
    pub fn new(w: W) -> Result<Self> {
        Ok(PcapWriter {
            w: pcap_file::pcapng::PcapNgWriter::new(w).context("writing the pcapng header")?,
            ifaces: Vec::new(),
        })
    }

    pub fn write(&mut self, l: &Line) -> Result<()> {
        use pcap_file::pcapng::blocks::{
            enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption},
            interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption},
        };
        let id = match self.ifaces.iter().position(|i| *i == l.iface) {
            Some(i) => i,
            None => {
                let idb = InterfaceDescriptionBlock {
                    linktype: pcap_file::DataLink::ETHERNET,
                    snaplen: paceline_common::trace::TRACE_HEAD as u32,
                    options: vec![
                        InterfaceDescriptionOption::IfName(l.iface.clone().into()),
                        // Nanosecond timestamps (if_tsresol = 9).
                        InterfaceDescriptionOption::IfTsResol(9),
                    ],
                };
                self.w
                    .write_pcapng_block(idb)
                    .context("writing an interface description")?;
                self.ifaces.push(l.iface.clone());
                self.ifaces.len() - 1
            }
        };
        let data = l.head_bytes()?;
        let epb = EnhancedPacketBlock {
            interface_id: id as u32,
            timestamp: std::time::Duration::from_nanos(l.unix_ns),
            original_len: l.len.max(data.len() as u32),
            data: data.into(),
            options: vec![EnhancedPacketOption::Comment(
                format!("paceline: {}", l.verdict()).into(),
            )],
        };
        self.w.write_pcapng_block(epb).context("writing a packet")?;
        Ok(())
    }

    pub fn into_inner(self) -> W {
        self.w.into_inner()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paceline_common::trace::action;

    fn names() -> Names {
        Names {
            classes: vec![Some("bulk".into()), Some("rpc".into())],
            levels: vec!["high".into(), "low".into()],
            class_rates: vec![1_000_000, 0],
            level_rates: vec![0, 500_000],
            rules: vec![RuleInfo {
                origin: "spec.rules[0]".into(),
                class: "bulk".into(),
                class_index: 0,
                matches: "udp dst_port 80".into(),
            }]
            .into(),
        }
    }

    fn record() -> TraceRecord {
        let mut r = TraceRecord::ZERO;
        r.time_ns = 5_000_000_000;
        r.key.src = paceline_common::maps::v4_mapped(u32::from_ne_bytes([10, 0, 0, 1]));
        r.key.dst = paceline_common::maps::v4_mapped(u32::from_ne_bytes([10, 0, 0, 2]));
        r.key.sport = 5000;
        r.key.dport = 80;
        r.key.proto = 17;
        r.pkt_len = 1000;
        r.wire_len = 1000;
        // an Ethernet frame with IPv4, TOS 0x28 (DSCP 10)
        let mut head = [0u8; 34];
        head[12] = 0x08;
        head[14] = 0x45;
        head[15] = 0x28;
        r.head[..34].copy_from_slice(&head);
        r.head_len = 34;
        r
    }

    #[test]
    fn the_class_clock_binds_when_it_stands_latest() {
        let mut r = record();
        r.class = 0;
        r.level = 1;
        r.flow_rate = 2_000_000;
        r.clocks.floor_ns = 1_000_000;
        r.clocks.flow_ns = 1_300_000;
        r.clocks.class_ns = 2_200_000;
        r.clocks.level_ns = 1_000_000;
        r.clocks.depart_ns = 2_200_000;
        let l = Line::from_record(&r, &names(), 0);
        assert_eq!(l.binding, "class");
        assert_eq!(l.delay_ns, 1_200_000);
        assert_eq!(l.flow_clock_ns, Some(300_000));
        assert_eq!(l.class_clock_ns, Some(1_200_000));
        // the level (rate 500 kB/s) applies and stood at the floor
        assert_eq!(l.level_clock_ns, Some(0));
        assert_eq!(l.class.as_deref(), Some("bulk"));
        assert_eq!(l.src.as_deref(), Some("10.0.0.1:5000"));
        assert_eq!(l.dscp_after, Some(10));
        assert!(
            l.verdict().contains("held 1.20 ms by the class clock"),
            "{}",
            l.verdict()
        );
    }

    #[test]
    fn the_rule_is_named_unless_the_class_was_cached_and_the_vlan_is_read() {
        let mut r = record();
        r.rule = 0;
        let l = Line::from_record(&r, &names(), 0);
        assert_eq!(l.rule.as_deref(), Some("spec.rules[0]: udp dst_port 80"));
        assert!(
            l.verdict().contains("(rule spec.rules[0]: udp dst_port 80)"),
            "{}",
            l.verdict()
        );
        assert_eq!(l.vlan, None);
        r.flags |= TR_CACHED;
        assert_eq!(Line::from_record(&r, &names(), 0).rule, None, "a cached class");
        let mut r = record();
        r.rule = NO_RULE;
        assert_eq!(Line::from_record(&r, &names(), 0).rule, None, "the default class");
        r.rule = 7;
        assert_eq!(Line::from_record(&r, &names(), 0).rule.as_deref(), Some("#7"));
        r.flags |= paceline_common::trace::TR_VLAN;
        r.vlan_tci = 300;
        let l = Line::from_record(&r, &names(), 0);
        assert_eq!(l.vlan, Some(300));
        assert!(l.text().contains("vlan 300"), "{}", l.text());
    }

    #[test]
    fn a_clock_without_a_rate_never_binds() {
        let mut r = record();
        r.class = 1; // no class rate
        r.level = 0; // no level rate
        r.flow_rate = 0;
        r.clocks.floor_ns = 1_000_000;
        // the pacer reads a clock that does not apply as the floor; a stale value must not bind
        r.clocks.class_ns = 9_000_000;
        r.clocks.depart_ns = 1_000_000;
        let l = Line::from_record(&r, &names(), 0);
        assert_eq!(l.binding, "none");
        assert_eq!(l.class_clock_ns, None);
    }

    #[test]
    fn drops_and_unparsed_frames_are_named() {
        let mut r = record();
        r.action = action::DROP_CODEL;
        let l = Line::from_record(&r, &names(), 0);
        assert_eq!(l.action, "dropped-codel");
        assert_eq!(l.binding, "none");
        let mut r = record();
        r.flags = TR_UNPARSED;
        r.action = action::UNPARSED_NON_IP;
        let l = Line::from_record(&r, &names(), 0);
        assert_eq!(l.action, "unparsed-non-ip");
        assert_eq!(l.class, None);
        assert!(l.text().contains("(not parsed)"), "{}", l.text());
    }

    #[test]
    fn pcapng_holds_each_packet_with_its_verdict() {
        let mut r = record();
        r.class = 0;
        r.level = 1;
        r.clocks.floor_ns = 1;
        r.clocks.class_ns = 11;
        r.clocks.depart_ns = 11;
        let l = Line::from_record(&r, &names(), 1_700_000_000_000_000_000);
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write(&l).unwrap();
        w.write(&l).unwrap();
        let bytes = w.into_inner();
        let mut rd = pcap_file::pcapng::PcapNgReader::new(&bytes[..]).unwrap();
        let mut packets = 0;
        let mut ifaces = 0;
        while let Some(b) = rd.next_block() {
            match b.unwrap() {
                pcap_file::pcapng::Block::InterfaceDescription(_) => ifaces += 1,
                pcap_file::pcapng::Block::EnhancedPacket(p) => {
                    packets += 1;
                    assert_eq!(p.data.len(), 34);
                    assert!(p.options.iter().any(|o| matches!(o,
                        pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketOption::Comment(c)
                            if c.contains("by the class clock"))));
                }
                _ => {}
            }
        }
        assert_eq!((ifaces, packets), (1, 2));
    }

    #[test]
    fn messages_read_back_from_their_json() {
        let l = Line::from_record(&record(), &names(), 0);
        for m in [
            Msg::Record(l),
            Msg::Heartbeat(Totals::default()),
            Msg::End(End {
                reason: "count reached".into(),
                totals: Totals {
                    records: 3,
                    capped: 1,
                    lost: 0,
                },
            }),
        ] {
            let j = serde_json::to_string(&m).unwrap();
            assert_eq!(serde_json::from_str::<Msg>(&j).unwrap(), m, "{j}");
        }
    }
}
