//! Bulk sender: N long-lived TCP flows (for a duration or a byte count each, with per-socket
//! congestion control, pacing rate, mark, TOS, priority), or N UDP flows at a fixed rate each.
//! The receiver's view (goodput, UDP loss) is in the server's report; this side reports what
//! it sent, flow completion times of sized flows (connect to the receiver's ack) and TCP_INFO.

use super::sockopt::{self, SockOpts, TcpInfo};
use super::stats;
use super::{SCHEMA_VERSION, Tags, mono_ns, proto};
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Options of `plload bulk`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct BulkOpts {
    /// Server address (`ip:port`).
    #[arg(long)]
    pub to: SocketAddr,
    /// Number of parallel flows.
    #[arg(long, default_value_t = 1)]
    pub flows: u32,
    /// Seconds each flow sends (default 10 unless --bytes is given).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Bytes per flow; the flow completes when the receiver has them all (FCT).
    #[arg(long)]
    pub bytes: Option<u64>,
    /// UDP instead of TCP (needs --rate-bps).
    #[arg(long)]
    pub udp: bool,
    /// UDP from an unconnected socket, each datagram addressed with sendto() (a server's way),
    /// instead of a socket connected to the receiver.
    #[arg(long, requires = "udp")]
    #[serde(default)]
    pub unconnected: bool,
    /// UDP send rate per flow in bits per second (datagram payload, headers excluded).
    #[arg(long)]
    pub rate_bps: Option<u64>,
    /// Bytes per write (TCP, default 65536) or per datagram (UDP, default 1400, min 24).
    #[arg(long)]
    pub msg_size: Option<usize>,
    /// Id of the first flow (the others count up), to tell senders apart at one receiver.
    #[arg(long, default_value_t = 0)]
    pub first_flow_id: u32,
    /// Socket options.
    #[command(flatten)]
    #[serde(flatten)]
    pub sock: SockOpts,
}

impl BulkOpts {
    /// TCP flows to `to` for `duration` seconds.
    pub fn tcp(to: SocketAddr, flows: u32, duration_s: f64) -> BulkOpts {
        BulkOpts {
            to,
            flows,
            duration: Some(duration_s),
            bytes: None,
            udp: false,
            unconnected: false,
            rate_bps: None,
            msg_size: None,
            first_flow_id: 0,
            sock: SockOpts::default(),
        }
    }
}

/// Sender-side record of one flow.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BulkFlowReport {
    /// Flow id.
    pub flow_id: u32,
    /// Local address of the socket.
    pub local: String,
    /// Payload bytes handed to the kernel.
    pub bytes_sent: u64,
    /// Datagrams sent (UDP) or writes (TCP).
    pub packets_sent: u64,
    /// UDP sends that failed (ENOBUFS and the like).
    pub send_errors: u64,
    /// From connect to the end (ack of a sized flow, else the last write).
    pub duration_s: f64,
    /// bytes_sent * 8 / duration_s.
    pub send_rate_bps: f64,
    /// Connect to the receiver's ack, for a sized TCP flow.
    pub fct_s: Option<f64>,
    /// TCP_INFO at the end (TCP).
    pub tcp: Option<TcpInfo>,
}

/// Flat summary.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BulkSummary {
    /// Flows.
    pub flows: u64,
    /// Bytes sent by all flows.
    pub total_bytes_sent: u64,
    /// Sum of per-flow send rates.
    pub send_rate_bps: f64,
    /// Mean FCT of sized flows (s).
    pub mean_fct_s: f64,
    /// Median FCT (s).
    pub p50_fct_s: f64,
    /// 99th percentile FCT (s).
    pub p99_fct_s: f64,
    /// Largest FCT (s).
    pub max_fct_s: f64,
    /// Sum of TCP retransmissions.
    pub total_retrans: u64,
    /// Sum of failed UDP sends.
    pub udp_send_errors: u64,
}

/// What `plload bulk` prints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BulkReport {
    /// `"bulk"`.
    pub kind: String,
    /// Schema version.
    pub version: u32,
    /// Labels.
    pub tags: Tags,
    /// Options.
    pub params: BulkOpts,
    /// Summary.
    pub summary: BulkSummary,
    /// Per flow.
    pub flows: Vec<BulkFlowReport>,
}

/// Runs the flows (one thread each) and returns when all are done.
pub fn run(opts: &BulkOpts, tags: &Tags) -> Result<BulkReport> {
    if opts.udp && opts.rate_bps.unwrap_or(0) == 0 {
        bail!("--udp needs --rate-bps");
    }
    let duration = match (opts.duration, opts.bytes) {
        (Some(d), _) => Some(d),
        (None, None) => Some(10.0),
        (None, Some(_)) => None,
    };
    let handles: Vec<_> = (0..opts.flows)
        .map(|i| {
            let o = opts.clone();
            let id = opts.first_flow_id + i;
            std::thread::Builder::new()
                .name(format!("bulk-{id}"))
                .spawn(move || {
                    if o.udp {
                        udp_flow(&o, id, duration)
                    } else {
                        tcp_flow(&o, id, duration)
                    }
                })
        })
        .collect::<io::Result<_>>()?;
    let mut flows = Vec::new();
    for h in handles {
        let r = h
            .join()
            .map_err(|_| anyhow::anyhow!("bulk flow thread panicked"))?;
        flows.push(r.context("bulk flow")?);
    }
    let fcts = stats::sorted(flows.iter().filter_map(|f| f.fct_s).collect());
    let summary = BulkSummary {
        flows: flows.len() as u64,
        total_bytes_sent: flows.iter().map(|f| f.bytes_sent).sum(),
        send_rate_bps: flows.iter().map(|f| f.send_rate_bps).sum(),
        mean_fct_s: stats::mean(&fcts),
        p50_fct_s: stats::percentile_sorted(&fcts, 50.0),
        p99_fct_s: stats::percentile_sorted(&fcts, 99.0),
        max_fct_s: fcts.last().copied().unwrap_or(0.0),
        total_retrans: flows
            .iter()
            .filter_map(|f| f.tcp.as_ref())
            .map(|t| t.total_retrans as u64)
            .sum(),
        udp_send_errors: flows.iter().map(|f| f.send_errors).sum(),
    };
    Ok(BulkReport {
        kind: "bulk".into(),
        version: SCHEMA_VERSION,
        tags: tags.clone(),
        params: opts.clone(),
        summary,
        flows,
    })
}

fn tcp_flow(o: &BulkOpts, id: u32, duration: Option<f64>) -> io::Result<BulkFlowReport> {
    let t0 = mono_ns();
    let mut s = sockopt::connect_tcp(o.to, &o.sock, Duration::from_secs(10))?;
    // Writes block while the send buffer is full; time out now and then to check the clock.
    s.set_write_timeout(Some(Duration::from_millis(200)))?;
    let local = s.local_addr().map(|a| a.to_string()).unwrap_or_default();
    let total = o.bytes.unwrap_or(0);
    s.write_all(&proto::encode_bulk_header(id, total))?;
    let end_ns = duration.map(|d| t0 + (d * 1e9) as u64);
    let buf = vec![0u8; o.msg_size.unwrap_or(65536).max(1)];
    let (mut sent, mut writes) = (0u64, 0u64);
    loop {
        if total > 0 && sent >= total {
            break;
        }
        if end_ns.is_some_and(|e| mono_ns() >= e) {
            break;
        }
        let k = if total > 0 {
            ((total - sent) as usize).min(buf.len())
        } else {
            buf.len()
        };
        match s.write(&buf[..k]) {
            Ok(n) => {
                sent += n as u64;
                writes += 1;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    let mut fct = None;
    let mut t_end = mono_ns();
    if total > 0 && sent >= total {
        // The receiver acks a sized flow with one byte once everything arrived.
        s.set_read_timeout(Some(Duration::from_secs(120)))?;
        let mut k = [0u8; 1];
        s.read_exact(&mut k)
            .map_err(|e| io::Error::new(e.kind(), format!("waiting for the receiver's ack: {e}")))?;
        t_end = mono_ns();
        fct = Some((t_end - t0) as f64 / 1e9);
    }
    let tcp = sockopt::tcp_info(s.as_raw_fd()).ok();
    let _ = s.shutdown(Shutdown::Write);
    // Wait for the server to close after our FIN (bounded), so its counters are final.
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut sink = [0u8; 64];
    while let Ok(n) = s.read(&mut sink) {
        if n == 0 {
            break;
        }
    }
    let dur = (t_end - t0) as f64 / 1e9;
    Ok(BulkFlowReport {
        flow_id: id,
        local,
        bytes_sent: sent,
        packets_sent: writes,
        send_errors: 0,
        duration_s: dur,
        send_rate_bps: if dur > 0.0 { sent as f64 * 8.0 / dur } else { 0.0 },
        fct_s: fct,
        tcp,
    })
}

fn udp_flow(o: &BulkOpts, id: u32, duration: Option<f64>) -> io::Result<BulkFlowReport> {
    super::precise_timers();
    let s = if o.unconnected {
        sockopt::unconnected_udp(o.to, &o.sock)?
    } else {
        sockopt::connect_udp(o.to, &o.sock)?
    };
    let send = |b: &[u8]| {
        if o.unconnected {
            s.send_to(b, o.to)
        } else {
            s.send(b)
        }
    };
    let local = s.local_addr().map(|a| a.to_string()).unwrap_or_default();
    let size = o.msg_size.unwrap_or(1400).max(proto::UDP_HDR);
    let rate = o.rate_bps.unwrap_or(1) as f64;
    let interval_ns = ((size as f64 * 8.0 / rate) * 1e9).max(1.0);
    let total = o.bytes.unwrap_or(0);
    let t0 = mono_ns();
    let end_ns = duration.map(|d| t0 + (d * 1e9) as u64);
    let mut buf = vec![0u8; size];
    let (mut seq, mut sent, mut errors) = (0u64, 0u64, 0u64);
    'outer: loop {
        let now = mono_ns();
        if end_ns.is_some_and(|e| now >= e) {
            break;
        }
        // Send every datagram that is due, then sleep until the next one.
        loop {
            let due = t0 + (seq as f64 * interval_ns) as u64;
            if due > now {
                super::sleep_until_ns(due.min(end_ns.unwrap_or(u64::MAX)));
                break;
            }
            if total > 0 && sent >= total {
                break 'outer;
            }
            proto::encode_udp_data(&mut buf, id, seq, mono_ns());
            match send(&buf) {
                Ok(n) => sent += n as u64,
                Err(_) => errors += 1,
            }
            seq += 1;
        }
    }
    let t_end = mono_ns();
    // End markers: three times, a little apart, in case one is dropped.
    for _ in 0..3 {
        let _ = send(&proto::encode_udp_fin(id, seq - errors, sent));
        std::thread::sleep(Duration::from_millis(5));
    }
    let dur = (t_end - t0) as f64 / 1e9;
    Ok(BulkFlowReport {
        flow_id: id,
        local,
        bytes_sent: sent,
        packets_sent: seq - errors,
        send_errors: errors,
        duration_s: dur,
        send_rate_bps: if dur > 0.0 { sent as f64 * 8.0 / dur } else { 0.0 },
        fct_s: None,
        tcp: None,
    })
}
