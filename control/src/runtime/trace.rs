//! A trace session (`/trace`, `paceline trace`): one at a time. Starting one writes the
//! datapath's trace configuration and takes the ring buffer; a thread reads the records and
//! sends them, named, to the HTTP response as JSON lines ([`crate::trace::Msg`]). The session
//! ends, and tracing is turned off, when its count or time is reached, when the reader goes
//! away (a heartbeat every second notices it), or when the agent stops.

use std::{
    collections::HashMap,
    os::fd::AsRawFd,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Result, anyhow, bail};
use aya::maps::{MapData, RingBuf};
use paceline_common::{
    maps::FlowKey,
    trace::{TRACE_CLASS, TRACE_DROPS_ONLY, TRACE_FLOW, TRACE_ON, TraceConfig, TraceCpu, TraceRecord},
};
use tokio::sync::mpsc;

use crate::runtime::shared::Shared;
use crate::trace::{End, Line, Msg, Names, Start, Totals};

/// The per-second cap on each CPU when the request names none.
pub const DEFAULT_PER_SEC: u32 = 1000;
/// The highest cap a request may ask for.
pub const MAX_PER_SEC: u32 = 100_000;
/// The sampling a request may ask for: one packet in 1 ..= this.
pub const MAX_SAMPLE: u32 = 1_000_000;

/// What a trace records and for how long (from `/trace`'s query).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Request {
    /// Stop after this many records.
    pub count: Option<u64>,
    /// Stop after this long.
    pub seconds: Option<f64>,
    /// Only this class (by name).
    pub class: Option<String>,
    /// Only this 5-tuple: (protocol, source, destination) as given.
    pub flow: Option<FlowKey>,
    /// Only drops and CE marks.
    pub drops: bool,
    /// One packet in `sample`.
    pub sample: u32,
    /// At most this many records a second on each CPU.
    pub per_sec: u32,
}

fn parse_endpoint(s: &str, what: &str) -> Result<(std::net::IpAddr, u16)> {
    if let Ok(a) = s.parse::<std::net::SocketAddr>() {
        return Ok((a.ip(), a.port()));
    }
    if let Ok(ip) = s.parse::<std::net::IpAddr>() {
        return Ok((ip, 0));
    }
    bail!("flow: {what} {s:?} is neither ADDR:PORT, [ADDR6]:PORT nor an address")
}

fn words(ip: std::net::IpAddr) -> [u32; 4] {
    let b = match ip {
        std::net::IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
        std::net::IpAddr::V6(v) => v.octets(),
    };
    [0, 1, 2, 3].map(|i| u32::from_ne_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]))
}

/// The 5-tuple of `--flow PROTO SRC DST` (`tcp 10.0.0.1:5000 10.0.0.2:80`).
pub fn flow_key(proto: &str, src: &str, dst: &str) -> Result<FlowKey> {
    let p: u8 = match proto {
        "tcp" => 6,
        "udp" => 17,
        "icmp" => 1,
        "icmpv6" => 58,
        "sctp" => 132,
        n => n
            .parse()
            .map_err(|_| anyhow!("flow: protocol {n:?} is not tcp, udp, icmp, icmpv6, sctp or 0..=255"))?,
    };
    let (s, sp) = parse_endpoint(src, "source")?;
    let (d, dp) = parse_endpoint(dst, "destination")?;
    if s.is_ipv4() != d.is_ipv4() {
        bail!("flow: the source and the destination are not of one address family");
    }
    Ok(FlowKey {
        src: words(s),
        dst: words(d),
        sport: sp,
        dport: dp,
        proto: p,
        _pad: [0; 3],
    })
}

impl Request {
    /// From `/trace`'s query: `count`, `seconds`, `class`, `proto`+`src`+`dst`, `drops`,
    /// `sample`, `per_sec`; each error names the parameter and its range.
    pub fn from_query(q: &HashMap<String, String>) -> Result<Request> {
        let num = |k: &str| -> Result<Option<u64>> {
            q.get(k)
                .map(|v| {
                    v.parse::<u64>()
                        .map_err(|_| anyhow!("{k}={v:?}: not a whole number"))
                })
                .transpose()
        };
        let known = [
            "count", "seconds", "class", "proto", "src", "dst", "drops", "sample", "per_sec",
        ];
        if let Some(k) = q.keys().find(|k| !known.contains(&k.as_str())) {
            bail!("unknown parameter {k:?} (known: {})", known.join(", "));
        }
        let count = num("count")?;
        if count == Some(0) {
            bail!("count=0: at least 1");
        }
        let seconds = match q.get("seconds") {
            Some(v) => match v.parse::<f64>() {
                Ok(s) if s > 0.0 && s <= 86_400.0 => Some(s),
                _ => bail!("seconds={v:?}: a number of seconds above 0, at most 86400"),
            },
            None => None,
        };
        let sample = match num("sample")? {
            None => 1,
            Some(n) if (1..=MAX_SAMPLE as u64).contains(&n) => n as u32,
            Some(n) => bail!("sample={n}: one packet in 1..={MAX_SAMPLE}"),
        };
        let per_sec = match num("per_sec")? {
            None => DEFAULT_PER_SEC,
            Some(n) if (1..=MAX_PER_SEC as u64).contains(&n) => n as u32,
            Some(n) => bail!("per_sec={n}: 1..={MAX_PER_SEC} records a second on each CPU"),
        };
        let drops = match q.get("drops").map(String::as_str) {
            None | Some("0") | Some("false") => false,
            Some("1") | Some("true") | Some("") => true,
            Some(v) => bail!("drops={v:?}: 1 or 0"),
        };
        let flow = match (q.get("proto"), q.get("src"), q.get("dst")) {
            (None, None, None) => None,
            (Some(p), Some(s), Some(d)) => Some(flow_key(p, s, d)?),
            _ => bail!("flow: proto, src and dst go together"),
        };
        Ok(Request {
            count,
            seconds,
            class: q.get("class").cloned(),
            flow,
            drops,
            sample,
            per_sec,
        })
    }

    fn describe(&self) -> String {
        let mut p = Vec::new();
        if let Some(c) = &self.class {
            p.push(format!("class {c}"));
        }
        if self.flow.is_some() {
            p.push("one flow".into());
        }
        if self.drops {
            p.push("drops and marks only".into());
        }
        if self.sample > 1 {
            p.push(format!("1 in {}", self.sample));
        }
        if let Some(n) = self.count {
            p.push(format!("{n} records"));
        }
        if let Some(s) = self.seconds {
            p.push(format!("{s} s"));
        }
        if p.is_empty() {
            "every packet".into()
        } else {
            p.join(", ")
        }
    }
}

/// Why a trace could not start.
#[derive(Debug)]
pub enum StartError {
    /// Another trace runs (HTTP 409).
    Busy,
    /// The request names something the policy does not have (HTTP 400).
    Bad(String),
    /// The datapath refused (HTTP 500).
    Failed(anyhow::Error),
}

/// The session in progress, if any (one at a time: the ring buffer has one reader; one agent
/// a process).
static RUNNING: Mutex<Option<u64>> = Mutex::new(None);
/// The last session's id.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// Starts a session for `req`; its lines go to `tx`.
pub fn start(shared: Arc<Shared>, req: Request, tx: mpsc::Sender<String>) -> Result<(), StartError> {
    let session;
    let ring;
    let names;
    let before;
    {
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        if running.is_some() {
            return Err(StartError::Busy);
        }
        let mut g = shared.lock();
        let class = match &req.class {
            None => None,
            Some(c) => match g
                .compiled
                .class_names
                .iter()
                .position(|n| n.as_deref() == Some(c))
            {
                Some(i) => Some(i as u32),
                None => {
                    let known: Vec<&str> = g
                        .compiled
                        .class_names
                        .iter()
                        .flatten()
                        .map(String::as_str)
                        .collect();
                    return Err(StartError::Bad(format!(
                        "class={c:?}: the policy in force has no such class (it has {})",
                        known.join(", ")
                    )));
                }
            },
        };
        names = Names::new(
            &g.compiled.table,
            &g.compiled.class_names,
            &g.compiled.level_names,
            &g.compiled.rules,
        );
        let dp = g.dp_mut().map_err(StartError::Failed)?;
        before = dp.snapshot().map_err(StartError::Failed)?.trace;
        ring = dp.take_trace_ring().ok_or(StartError::Busy)?;
        session = NEXT.fetch_add(1, Ordering::Relaxed) + 1;
        let mut flags = TRACE_ON;
        if req.drops {
            flags |= TRACE_DROPS_ONLY;
        }
        if class.is_some() {
            flags |= TRACE_CLASS;
        }
        if req.flow.is_some() {
            flags |= TRACE_FLOW;
        }
        let cfg = TraceConfig {
            flags,
            sample: req.sample,
            class: class.unwrap_or(0),
            per_sec: req.per_sec,
            session,
            flow: req.flow.unwrap_or_default(),
        };
        if let Err(e) = dp.start_trace(&cfg) {
            dp.return_trace_ring(ring);
            return Err(StartError::Failed(e));
        }
        *running = Some(session);
    }
    log::info!("trace {session} started: {}", req.describe());
    let start = Msg::Start(Start {
        session,
        filter: req.describe(),
        per_sec: req.per_sec,
    });
    let _ = tx.try_send(json(&start));
    std::thread::Builder::new()
        .name(format!("trace-{session}"))
        .spawn(move || {
            let (ring, reason, totals) = read(&shared, ring, &req, session, &names, before, &tx);
            let mut g = shared.lock();
            if let Some(dp) = g.dp.as_mut() {
                if let Err(e) = dp.stop_trace() {
                    log::error!("trace {session}: turning tracing off: {e:#}");
                }
                dp.return_trace_ring(ring);
            }
            drop(g);
            *RUNNING.lock().unwrap_or_else(|e| e.into_inner()) = None;
            log::info!(
                "trace {session} ended ({reason}): {} records, {} capped, {} lost",
                totals.records,
                totals.capped,
                totals.lost
            );
            let _ = tx.blocking_send(json(&Msg::End(End { reason, totals })));
        })
        .map_err(|e| StartError::Failed(e.into()))?;
    Ok(())
}

fn json(m: &Msg) -> String {
    let mut s = serde_json::to_string(m).unwrap_or_default();
    s.push('\n');
    s
}

/// Unix time minus CLOCK_MONOTONIC, ns.
fn mono_to_unix() -> i128 {
    let now = |c| {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec to fill.
        unsafe { libc::clock_gettime(c, &mut t) };
        t.tv_sec as i128 * 1_000_000_000 + t.tv_nsec as i128
    };
    now(libc::CLOCK_REALTIME) - now(libc::CLOCK_MONOTONIC)
}

/// Reads records until the session ends; returns the ring, why it ended and the counts.
fn read(
    shared: &Shared,
    mut ring: RingBuf<MapData>,
    req: &Request,
    session: u64,
    names: &Names,
    before: TraceCpu,
    tx: &mpsc::Sender<String>,
) -> (RingBuf<MapData>, String, Totals) {
    let deadline = req.seconds.map(|s| Instant::now() + Duration::from_secs_f64(s));
    let offset = mono_to_unix();
    let mut totals = Totals::default();
    let mut beat = Instant::now();
    let counters = |totals: &mut Totals| {
        if let Ok(s) = shared.lock().dp().and_then(|d| d.snapshot()) {
            totals.capped = s.trace.capped.wrapping_sub(before.capped);
            totals.lost = s.trace.lost.wrapping_sub(before.lost);
        }
    };
    let reason = 'session: loop {
        if tx.is_closed() {
            break "the reader went away".to_string();
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break "time is up".to_string();
        }
        if shared.lock().dp.is_none() {
            break "the agent is stopping".to_string();
        }
        let mut pfd = libc::pollfd {
            fd: ring.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, 100) };
        while let Some(item) = ring.next() {
            let Some(r) = TraceRecord::from_bytes(&item) else {
                continue;
            };
            drop(item);
            if r.session != session {
                continue; // left in the ring by an earlier session
            }
            let line = Msg::Record(Line::from_record(&r, names, offset));
            if tx.blocking_send(json(&line)).is_err() {
                break 'session "the reader went away".to_string();
            }
            totals.records += 1;
            if req.count.is_some_and(|n| totals.records >= n) {
                break 'session "count reached".to_string();
            }
        }
        if beat.elapsed() >= Duration::from_secs(1) {
            beat = Instant::now();
            counters(&mut totals);
            if tx.blocking_send(json(&Msg::Heartbeat(totals))).is_err() {
                break "the reader went away".to_string();
            }
        }
    };
    counters(&mut totals);
    (ring, reason, totals)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_request_reads_its_query_and_names_each_bad_parameter() {
        let r = Request::from_query(&q(&[("count", "5"), ("drops", "1"), ("class", "bulk")])).unwrap();
        assert_eq!(
            (r.count, r.drops, r.class.as_deref(), r.sample, r.per_sec),
            (Some(5), true, Some("bulk"), 1, DEFAULT_PER_SEC)
        );
        let r = Request::from_query(&q(&[
            ("proto", "udp"),
            ("src", "10.0.0.1:5000"),
            ("dst", "[::1]:80"),
        ]));
        assert!(r.unwrap_err().to_string().contains("one address family"));
        let r = Request::from_query(&q(&[
            ("proto", "tcp"),
            ("src", "10.0.0.1:5000"),
            ("dst", "10.0.0.2:80"),
        ]))
        .unwrap();
        let k = r.flow.unwrap();
        assert_eq!((k.proto, k.sport, k.dport), (6, 5000, 80));
        assert_eq!(
            k.src,
            paceline_common::maps::v4_mapped(u32::from_ne_bytes([10, 0, 0, 1]))
        );
        for (bad, says) in [
            (vec![("count", "0")], "count=0"),
            (vec![("count", "x")], "count=\"x\""),
            (vec![("seconds", "-1")], "seconds"),
            (vec![("sample", "0")], "sample=0"),
            (vec![("per_sec", "1000000")], "per_sec=1000000"),
            (vec![("drops", "maybe")], "drops"),
            (vec![("proto", "tcp")], "go together"),
            (
                vec![("proto", "tcpp"), ("src", "1.1.1.1"), ("dst", "1.1.1.2")],
                "protocol \"tcpp\"",
            ),
            (vec![("colour", "red")], "unknown parameter \"colour\""),
        ] {
            let e = Request::from_query(&q(&bad)).unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }
}
