//! Per-response timelines from a packet capture at the aggregator (`PLEXP_D3_CAPTURE=1`):
//! `tcpdump` records the first 128 bytes of every packet on the workers' port during a point,
//! and each response's connection is read back as what happened to it, in milliseconds after
//! its query left: the first byte in, the requests as the router rewrote them (desired rate
//! and grant), the feedback the aggregator echoed, pauses (a grant of 0), retransmissions, and
//! the last byte in. Missed deadlines are then split into where their time went.
//!
//! The connections are fresh per (query, worker) (`Conn::Fresh`): a query's connections are
//! the N opened after the previous query's, in SYN order, and within a query a response is
//! the one from its worker's address that carried exactly its size.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;

use anyhow::{Context, Result, bail};
use paceline_common::d3::{
    D3Feedback, D3Request, EXID_HI, EXID_LO, FB_LEN, REQ_LEN, TCPOPT_EXP, units_to_rate,
};
use serde::Serialize;

use paceline_tests::workload::{pa, proto};

/// One TCP segment of the capture.
#[derive(Clone, Debug)]
struct Segment {
    t_ns: u64,
    src: Ipv4Addr,
    sport: u16,
    dport: u16,
    seq: u32,
    flags: u8,
    payload: u32,
    d3: Option<D3Opt>,
}

#[derive(Clone, Copy, Debug)]
enum D3Opt {
    /// A request as it arrived (after the router): desired and the first hop's grant, bytes/s.
    Request {
        desired: u64,
        grant: u64,
        fin: bool,
        quenched: bool,
    },
    /// Feedback the aggregator sent: the grant it echoes, bytes/s.
    Feedback { grant: u64 },
}

const SYN: u8 = 0x02;

/// Reads a pcap file (Ethernet, Linux cooked v1 or v2; IPv4 TCP only).
fn read_pcap(path: &Path) -> Result<Vec<Segment>> {
    let b = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    if b.len() < 24 {
        bail!("{}: not a pcap file", path.display());
    }
    let magic = u32::from_le_bytes(b[0..4].try_into()?);
    let nano = match magic {
        0xa1b2_c3d4 => false,
        0xa1b2_3c4d => true,
        _ => bail!("{}: not a little-endian pcap file", path.display()),
    };
    let link = u32::from_le_bytes(b[20..24].try_into()?);
    let l2 = match link {
        1 => 14,
        113 => 16,
        276 => 20,
        _ => bail!("{}: link type {link} not handled", path.display()),
    };
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= b.len() {
        let sec = u32::from_le_bytes(b[at..at + 4].try_into()?) as u64;
        let frac = u32::from_le_bytes(b[at + 4..at + 8].try_into()?) as u64;
        let incl = u32::from_le_bytes(b[at + 8..at + 12].try_into()?) as usize;
        at += 16;
        let Some(d) = b.get(at..at + incl) else { break };
        at += incl;
        let t_ns = sec * 1_000_000_000 + if nano { frac } else { frac * 1000 };
        if let Some(s) = parse_frame(d, l2, t_ns) {
            out.push(s);
        }
    }
    Ok(out)
}

fn parse_frame(d: &[u8], l2: usize, t_ns: u64) -> Option<Segment> {
    let ip = d.get(l2..)?;
    if ip.len() < 20 || ip[0] >> 4 != 4 || ip[9] != 6 {
        return None;
    }
    let ihl = (ip[0] & 15) as usize * 4;
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    let tcp = ip.get(ihl..)?;
    if tcp.len() < 20 {
        return None;
    }
    let doff = (tcp[12] >> 4) as usize * 4;
    let opts = tcp.get(20..doff.min(tcp.len()))?;
    Some(Segment {
        t_ns,
        src: Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
        sport: u16::from_be_bytes([tcp[0], tcp[1]]),
        dport: u16::from_be_bytes([tcp[2], tcp[3]]),
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
        flags: tcp[13],
        payload: total.saturating_sub(ihl + doff) as u32,
        d3: d3_option(opts),
    })
}

/// The D3 option among `opts`, decoded.
fn d3_option(opts: &[u8]) -> Option<D3Opt> {
    let mut i = 0;
    while i < opts.len() {
        match opts[i] {
            0 => return None,
            1 => i += 1,
            kind => {
                let len = *opts.get(i + 1)? as usize;
                if len < 2 {
                    return None;
                }
                let o = opts.get(i..i + len)?;
                if kind == TCPOPT_EXP && len >= 4 && o[2] == EXID_HI && o[3] == EXID_LO {
                    if len == REQ_LEN {
                        let r = D3Request::decode(o.try_into().ok()?).ok()?;
                        return Some(D3Opt::Request {
                            desired: units_to_rate(r.desired, r.scale),
                            grant: units_to_rate(r.alloc[0], r.scale),
                            fin: r.flags & paceline_common::d3::FLAG_FIN != 0,
                            quenched: r.flags & paceline_common::d3::FLAG_QUENCHED != 0,
                        });
                    }
                    if len == FB_LEN {
                        let f = D3Feedback::decode(o.try_into().ok()?).ok()?;
                        return Some(D3Opt::Feedback {
                            grant: units_to_rate(f.alloc[0], f.scale),
                        });
                    }
                }
                i += len;
            }
        }
    }
    None
}

/// What happened to one response, ms after its query left the aggregator.
#[derive(Clone, Debug, Serialize)]
pub struct ResponseTimeline {
    pub query: u64,
    pub worker: u32,
    pub size: u64,
    pub deadline_ms: f64,
    pub met: bool,
    /// First byte of the response in.
    pub first_byte_ms: f64,
    /// First feedback the aggregator echoed for this response's requests, and its grant.
    pub first_grant_ms: Option<f64>,
    pub first_grant_bps: Option<f64>,
    /// Every distinct (desired, grant) the response's requests carried in, in order, bit/s.
    pub requests: Vec<(f64, f64, f64)>,
    /// The first request that said the flow gave up its deadline (quenched: it asks for no
    /// rate of its own from then on).
    pub quenched_ms: Option<f64>,
    /// Time under a grant of 0 (from an echo of 0 to the next echo above 0, or the end).
    pub paused_ms: f64,
    /// Data segments seen again (retransmissions that reached the aggregator).
    pub retransmissions: u32,
    /// Last byte in.
    pub last_byte_ms: f64,
}

#[derive(Default)]
struct Conn {
    syn_ns: u64,
    worker_ip: Option<Ipv4Addr>,
    queries: Vec<u64>,
    data: Vec<(u64, u32, u32)>,
    requests: Vec<(u64, u64, u64)>,
    quenched_ns: Option<u64>,
    feedback: Vec<(u64, u64)>,
}

/// Timelines of the scored `responses` from the capture at `path`: `n` workers per query,
/// `addrs[w]` the address of worker `w`.
pub fn timelines(
    path: &Path,
    port: u16,
    n: usize,
    addrs: &[Ipv4Addr],
    responses: &[pa::PaResponse],
) -> Result<Vec<ResponseTimeline>> {
    let segs = read_pcap(path)?;
    // Each connection by the aggregator's port (fresh connections: one per (query, worker)).
    let mut conns: BTreeMap<u16, Conn> = BTreeMap::new();
    let mut order: Vec<u16> = Vec::new();
    for s in &segs {
        let from_worker = s.sport == port;
        let key = if from_worker { s.dport } else { s.sport };
        if !from_worker && s.dport != port {
            continue;
        }
        if !from_worker && s.flags & SYN != 0 && s.payload == 0 {
            // A new connection on a reused port replaces the old record.
            if let Some(old) = conns.remove(&key) {
                let tmp = 0u16.wrapping_sub(1 + order.len() as u16);
                order.iter_mut().filter(|k| **k == key).for_each(|k| *k = tmp);
                conns.insert(tmp, old);
            }
            conns.insert(
                key,
                Conn {
                    syn_ns: s.t_ns,
                    ..Default::default()
                },
            );
            order.push(key);
            continue;
        }
        let Some(c) = conns.get_mut(&key) else { continue };
        if from_worker {
            c.worker_ip = Some(s.src);
            if s.payload > 0 {
                c.data.push((s.t_ns, s.seq, s.payload));
            }
            if let Some(D3Opt::Request {
                desired,
                grant,
                fin,
                quenched,
            }) = s.d3
                && !fin
            {
                if quenched && c.quenched_ns.is_none() {
                    c.quenched_ns = Some(s.t_ns);
                }
                if c.requests.last().map(|r| (r.1, r.2)) != Some((desired, grant)) {
                    c.requests.push((s.t_ns, desired, grant));
                }
            }
        } else {
            if s.payload as usize == proto::REQ_HDR {
                c.queries.push(s.t_ns);
            }
            if let Some(D3Opt::Feedback { grant }) = s.d3 {
                c.feedback.push((s.t_ns, grant));
            }
        }
    }
    let mut by_syn: Vec<(u64, &Conn)> = conns.values().map(|c| (c.syn_ns, c)).collect();
    by_syn.sort_by_key(|x| x.0);
    let first_q = responses.iter().map(|r| r.query).min().unwrap_or(0);
    let mut out = Vec::new();
    for r in responses {
        // The query's connections, counted from the first query the capture saw.
        let lo = (r.query - first_q) as usize * n;
        let Some(group) = by_syn.get(lo..(lo + n).min(by_syn.len())) else {
            continue;
        };
        let want_ip = addrs.get(r.worker as usize).copied();
        let Some(c) = group.iter().map(|x| x.1).find(|c| {
            c.worker_ip == want_ip
                && c.data.iter().map(|d| d.2 as u64).sum::<u64>() >= r.size
                && distinct_bytes(c) == r.size + proto::RESP_HDR as u64
        }) else {
            continue;
        };
        // The second 48-byte segment is the query (the first is the warm-up).
        let Some(&t_q) = c.queries.get(1) else { continue };
        let ms = |t: u64| t.saturating_sub(t_q) as f64 / 1e6;
        let resp: Vec<&(u64, u32, u32)> = c.data.iter().filter(|d| d.0 >= t_q).collect();
        let (Some(first), Some(last)) = (resp.first(), resp.last()) else {
            continue;
        };
        let mut seen = std::collections::HashSet::new();
        let retransmissions = resp.iter().filter(|d| !seen.insert(d.1)).count() as u32;
        let fb: Vec<&(u64, u64)> = c.feedback.iter().filter(|f| f.0 >= first.0).collect();
        let mut paused_ns = 0u64;
        let mut since: Option<u64> = None;
        for f in &fb {
            match (f.1 == 0, since) {
                (true, None) => since = Some(f.0),
                (false, Some(t)) => {
                    paused_ns += f.0 - t;
                    since = None;
                }
                _ => {}
            }
        }
        if let Some(t) = since {
            paused_ns += last.0.saturating_sub(t);
        }
        out.push(ResponseTimeline {
            query: r.query,
            worker: r.worker,
            size: r.size,
            deadline_ms: r.deadline_ms,
            met: r.met,
            first_byte_ms: ms(first.0),
            first_grant_ms: fb.first().map(|f| ms(f.0)),
            first_grant_bps: fb.first().map(|f| f.1 as f64 * 8.0),
            requests: c
                .requests
                .iter()
                .filter(|q| q.0 >= t_q)
                .map(|q| (ms(q.0), q.1 as f64 * 8.0, q.2 as f64 * 8.0))
                .collect(),
            quenched_ms: c.quenched_ns.filter(|&t| t >= t_q).map(ms),
            paused_ms: paused_ns as f64 / 1e6,
            retransmissions,
            last_byte_ms: ms(last.0),
        });
    }
    Ok(out)
}

/// Payload bytes of distinct sequence numbers (a retransmission counts once).
fn distinct_bytes(c: &Conn) -> u64 {
    let mut seen = std::collections::HashSet::new();
    c.data
        .iter()
        .filter(|d| seen.insert(d.1))
        .map(|d| d.2 as u64)
        .sum()
}

/// What a quench did to the other responses of its query: for each response that quenched and
/// each other response of the same query still asking (not quenched before it), that other
/// response's last grant within `window_ms` before the quench against its first one within
/// `window_ms` after: how many rose, fell and stayed. A quenched flow stops claiming capacity,
/// so the others' grants should rise more often than they fall.
pub fn quench_effect(t: &[ResponseTimeline], window_ms: f64) -> (u64, u64, u64) {
    let mut by_query: BTreeMap<u64, Vec<&ResponseTimeline>> = BTreeMap::new();
    for r in t {
        by_query.entry(r.query).or_default().push(r);
    }
    let (mut rose, mut fell, mut same) = (0, 0, 0);
    for rs in by_query.values() {
        for q in rs {
            let Some(tq) = q.quenched_ms else { continue };
            for o in rs {
                if std::ptr::eq(*o, *q) || o.quenched_ms.is_some_and(|x| x <= tq) {
                    continue;
                }
                let before = o
                    .requests
                    .iter()
                    .rev()
                    .find(|r| r.0 < tq && r.0 >= tq - window_ms);
                let after = o.requests.iter().find(|r| r.0 > tq && r.0 <= tq + window_ms);
                if let (Some(b), Some(a)) = (before, after) {
                    match a.2.partial_cmp(&b.2) {
                        Some(std::cmp::Ordering::Greater) => rose += 1,
                        Some(std::cmp::Ordering::Less) => fell += 1,
                        _ => same += 1,
                    }
                }
            }
        }
    }
    (rose, fell, same)
}

/// Where the time of the missed responses went, averaged (ms): before the first byte arrived
/// (the worker's start and the bottleneck's queue), from the first byte to the first grant,
/// paused, and the rest of the transfer; with their retransmissions and how many quenched.
pub fn missed_summary(t: &[ResponseTimeline]) -> serde_json::Value {
    let missed: Vec<&ResponseTimeline> = t.iter().filter(|r| !r.met).collect();
    let mean = |f: &dyn Fn(&ResponseTimeline) -> f64| {
        if missed.is_empty() {
            0.0
        } else {
            missed.iter().map(|r| f(r)).sum::<f64>() / missed.len() as f64
        }
    };
    serde_json::json!({
        "responses_timed": t.len(),
        "missed_timed": missed.len(),
        "missed_late_at_first_byte": missed.iter().filter(|r| r.first_byte_ms > r.deadline_ms).count(),
        "mean_deadline_ms": mean(&|r| r.deadline_ms),
        "mean_first_byte_ms": mean(&|r| r.first_byte_ms),
        "mean_to_first_grant_ms": mean(&|r| r.first_grant_ms.map(|g| (g - r.first_byte_ms).max(0.0)).unwrap_or(0.0)),
        "mean_paused_ms": mean(&|r| r.paused_ms),
        "mean_last_byte_ms": mean(&|r| r.last_byte_ms),
        "retransmissions": missed.iter().map(|r| r.retransmissions as u64).sum::<u64>(),
        "missed_quenched": missed.iter().filter(|r| r.quenched_ms.is_some()).count(),
        "met_quenched": t.iter().filter(|r| r.met && r.quenched_ms.is_some()).count(),
        "after_a_quench_others_grant_rose_fell_same": quench_effect(t, 3.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(query: u64, quenched_ms: Option<f64>, grants: &[(f64, f64)]) -> ResponseTimeline {
        ResponseTimeline {
            query,
            worker: 0,
            size: 1,
            deadline_ms: 1.0,
            met: quenched_ms.is_none(),
            first_byte_ms: 0.0,
            first_grant_ms: None,
            first_grant_bps: None,
            requests: grants.iter().map(|&(t, g)| (t, 0.0, g)).collect(),
            quenched_ms,
            paused_ms: 0.0,
            retransmissions: 0,
            last_byte_ms: 0.0,
        }
    }

    /// The others' grants around a quench in the same query: one rose, one fell, one stayed;
    /// a response of another query, one that quenched earlier and one with no request within
    /// the window are not counted.
    #[test]
    fn a_quench_is_judged_by_the_other_responses_grants_around_it() {
        let t = vec![
            response(1, Some(5.0), &[(1.0, 8.0)]),
            response(1, None, &[(4.0, 1.0), (6.0, 2.0)]),
            response(1, None, &[(4.5, 3.0), (5.5, 1.0)]),
            response(1, None, &[(4.0, 2.0), (7.0, 2.0)]),
            response(1, Some(2.0), &[(4.0, 1.0), (6.0, 9.0)]),
            response(1, None, &[(0.5, 1.0), (9.5, 9.0)]),
            response(2, None, &[(4.0, 1.0), (6.0, 9.0)]),
        ];
        assert_eq!(quench_effect(&t, 3.0), (1, 1, 1));
    }

    /// A request option as the router leaves it: desired 10 units and a grant of 20 at scale
    /// 4 (32 KB/s units), after NOP NOP and a timestamp.
    #[test]
    fn d3_options_decode_from_a_tcp_option_area() {
        let req = D3Request {
            scale: 4,
            desired: 10,
            hop: 1,
            alloc: [20, 0, 0, 0, 0, 0],
            ..D3Request::EMPTY
        };
        let mut opts = vec![1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2];
        opts.extend_from_slice(&req.encode());
        match d3_option(&opts) {
            Some(D3Opt::Request {
                desired,
                grant,
                fin,
                quenched,
            }) => {
                assert_eq!(
                    (desired, grant, fin, quenched),
                    (10 * 32768, 20 * 32768, false, false)
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(d3_option(&[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]).is_none());
        // A truncated option is not read past the buffer.
        assert!(d3_option(&[253, 20, 0xD3]).is_none());
    }
}
