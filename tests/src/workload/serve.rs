//! The server side of every workload: a TCP listener and a UDP socket on one port. TCP bulk
//! uploads are counted per flow (the receiver's goodput), requests are answered (RPC,
//! partition-aggregate workers, incast servers) with the [`ResponseHook`] called around each
//! response, UDP bulk flows are counted with loss and one-way delay.

use super::hook::{NoHook, ResponseHook};
use super::proto::{self, Datagram, Request};
use super::stats::{self, LatencySummary};
use super::{SCHEMA_VERSION, Tags, mono_ns};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Options of `plload serve`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct ServeOpts {
    /// Address to bind (default `[::]` dual-stack, or `0.0.0.0` where IPv6 is off).
    #[arg(long)]
    pub bind: Option<IpAddr>,
    /// TCP and UDP port (0: any free port, for library use).
    #[arg(long, default_value_t = 5001)]
    pub port: u16,
    /// Exit once this many bulk flows have finished (TCP: closed by the client; UDP: end
    /// marker received).
    #[arg(long)]
    pub flows: Option<usize>,
    /// Exit after this many seconds (also exits on SIGTERM/SIGINT; the report is written
    /// either way).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Per-response hook: `none`, `log` or `sockopt:LEVEL:OPTNAME` (see [`super::hook`]).
    #[arg(long, default_value = "none")]
    pub hook: String,
    /// Include every UDP packet's one-way delay in the report (`owd_samples_us`).
    #[arg(long)]
    pub samples: bool,
}

impl Default for ServeOpts {
    fn default() -> Self {
        ServeOpts {
            bind: None,
            port: 0,
            flows: None,
            duration: None,
            hook: "none".into(),
            samples: false,
        }
    }
}

/// Receiver-side record of one TCP bulk flow.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TcpFlowReport {
    /// Flow id the client sent.
    pub flow_id: u32,
    /// Client address.
    pub peer: String,
    /// Bytes the client announced (0 = until FIN).
    pub expected_bytes: u64,
    /// Payload bytes received.
    pub bytes: u64,
    /// All announced bytes arrived.
    pub complete: bool,
    /// The client closed the connection.
    pub closed: bool,
    /// Accept time, seconds since the server started.
    pub accept_s: f64,
    /// First payload byte, seconds since the server started.
    pub first_byte_s: f64,
    /// Last payload byte, seconds since the server started.
    pub last_byte_s: f64,
    /// bytes * 8 / (last_byte - first_byte).
    pub goodput_bps: f64,
    /// Accept to last byte, for a sized flow that completed.
    pub fct_s: Option<f64>,
}

/// Receiver-side record of one UDP bulk flow.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UdpFlowReport {
    /// Flow id the client sent.
    pub flow_id: u32,
    /// Client address.
    pub peer: String,
    /// Datagrams received (duplicates included).
    pub packets: u64,
    /// Datagram payload bytes received.
    pub bytes: u64,
    /// Datagrams the client says it sent (from its end marker), if that arrived.
    pub sent_packets: Option<u64>,
    /// sent (or highest seq + 1) - received.
    pub lost_packets: u64,
    /// lost / sent.
    pub loss_rate: f64,
    /// First datagram, seconds since the server started.
    pub first_s: f64,
    /// Last datagram, seconds since the server started.
    pub last_s: f64,
    /// bytes * 8 / (last - first).
    pub goodput_bps: f64,
    /// One-way delay (send timestamp to receive), microseconds.
    pub owd: LatencySummary,
    /// Every one-way delay (with `--samples`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owd_samples_us: Option<Vec<f64>>,
}

/// Flat summary of a server run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServeSummary {
    /// TCP bulk flows seen.
    pub tcp_flows: u64,
    /// UDP bulk flows seen.
    pub udp_flows: u64,
    /// Bulk payload bytes received (TCP + UDP).
    pub total_bytes: u64,
    /// total_bytes * 8 / (last byte of any flow - first byte of any flow).
    pub aggregate_goodput_bps: f64,
    /// Mean per-flow goodput.
    pub mean_goodput_bps: f64,
    /// Smallest per-flow goodput.
    pub min_goodput_bps: f64,
    /// Largest per-flow goodput.
    pub max_goodput_bps: f64,
    /// Jain's index over per-flow goodputs.
    pub jain_fairness: f64,
    /// Sized TCP flows that completed.
    pub completed_flows: u64,
    /// Mean server-side FCT of completed flows (s).
    pub mean_fct_s: f64,
    /// 99th percentile FCT (s).
    pub p99_fct_s: f64,
    /// Largest FCT (s).
    pub max_fct_s: f64,
    /// Lost / sent over all UDP flows.
    pub udp_loss_rate: f64,
    /// Requests answered (TCP and UDP).
    pub requests_served: u64,
    /// Failed hook calls.
    pub hook_errors: u64,
}

/// What `plload serve` prints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServeReport {
    /// `"serve"`.
    pub kind: String,
    /// Schema version.
    pub version: u32,
    /// Labels.
    pub tags: Tags,
    /// Options.
    pub params: ServeOpts,
    /// Summary.
    pub summary: ServeSummary,
    /// TCP bulk flows.
    pub tcp_flows: Vec<TcpFlowReport>,
    /// UDP bulk flows.
    pub udp_flows: Vec<UdpFlowReport>,
}

struct TcpFlowRx {
    flow_id: u32,
    peer: SocketAddr,
    expected: u64,
    accept_ns: u64,
    bytes: AtomicU64,
    first_ns: AtomicU64,
    last_ns: AtomicU64,
    complete_ns: AtomicU64,
    closed: AtomicBool,
}

#[derive(Default)]
struct UdpFlowRx {
    packets: u64,
    bytes: u64,
    first_ns: u64,
    last_ns: u64,
    max_seq: Option<u64>,
    fin: Option<u64>,
    owd_ns: Vec<u64>,
}

struct Shared {
    start_ns: u64,
    stop: AtomicBool,
    tcp_flows: Mutex<Vec<Arc<TcpFlowRx>>>,
    udp_flows: Mutex<HashMap<(SocketAddr, u32), UdpFlowRx>>,
    requests: AtomicU64,
    hook_errors: AtomicU64,
    conns: Mutex<HashMap<u64, TcpStream>>,
    next_conn: AtomicU64,
    finished: AtomicUsize,
    finished_cv: (Mutex<()>, Condvar),
    hook: Box<dyn ResponseHook>,
}

impl Shared {
    fn flow_finished(&self) {
        self.finished.fetch_add(1, Relaxed);
        let _g = self.finished_cv.0.lock().unwrap();
        self.finished_cv.1.notify_all();
    }
}

/// A running server. Stops (closing every connection) on drop.
pub struct Server {
    shared: Arc<Shared>,
    port: u16,
    opts: ServeOpts,
    threads: Vec<JoinHandle<()>>,
}

fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

impl Server {
    /// Binds TCP and UDP on `opts.port` and starts serving with `hook`. (Sockets are created in
    /// the calling thread's network namespace: call inside [`crate::testbed::Host::in_netns`]
    /// to serve in a testbed host.)
    pub fn start(opts: &ServeOpts, hook: Box<dyn ResponseHook>) -> Result<Server> {
        let (listener, udp) = bind_pair(opts.bind, opts.port)?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            start_ns: mono_ns(),
            stop: AtomicBool::new(false),
            tcp_flows: Mutex::new(Vec::new()),
            udp_flows: Mutex::new(HashMap::new()),
            requests: AtomicU64::new(0),
            hook_errors: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
            finished: AtomicUsize::new(0),
            finished_cv: (Mutex::new(()), Condvar::new()),
            hook,
        });
        let mut threads = Vec::new();
        let sh = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("serve-accept".into())
                .spawn(move || accept_loop(listener, sh))?,
        );
        let sh = shared.clone();
        let keep = opts.samples;
        threads.push(
            std::thread::Builder::new()
                .name("serve-udp".into())
                .spawn(move || udp_loop(udp, sh, keep))?,
        );
        Ok(Server {
            shared,
            port,
            opts: opts.clone(),
            threads,
        })
    }

    /// Starts with the hook named in `opts.hook`.
    pub fn start_with_opts_hook(opts: &ServeOpts) -> Result<Server> {
        let hook = super::hook::parse_hook(&opts.hook).map_err(anyhow::Error::msg)?;
        Self::start(opts, hook)
    }

    /// Starts with no hook.
    pub fn start_plain(opts: &ServeOpts) -> Result<Server> {
        Self::start(opts, Box::new(NoHook))
    }

    /// The bound port (useful with `port: 0`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Bulk flows finished so far (TCP closed by the client, UDP end marker received).
    pub fn finished_flows(&self) -> usize {
        self.shared.finished.load(Relaxed)
    }

    /// Waits until `n` bulk flows have finished; false on timeout.
    pub fn wait_flows(&self, n: usize, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        let mut g = self.shared.finished_cv.0.lock().unwrap();
        while self.finished_flows() < n {
            let now = Instant::now();
            if now >= end {
                return false;
            }
            g = self
                .shared
                .finished_cv
                .1
                .wait_timeout(g, (end - now).min(Duration::from_millis(100)))
                .unwrap()
                .0;
        }
        true
    }

    /// Blocks until `opts.flows` flows finished, `opts.duration` passed, or `interrupted`
    /// becomes true (whichever first; with neither limit, only `interrupted` ends it).
    pub fn run_until(&self, interrupted: &AtomicBool) {
        let end = self.opts.duration.map(|d| Instant::now() + super::secs(d));
        loop {
            if interrupted.load(Relaxed) {
                return;
            }
            if let Some(n) = self.opts.flows
                && self.finished_flows() >= n
            {
                return;
            }
            if let Some(e) = end
                && Instant::now() >= e
            {
                return;
            }
            let g = self.shared.finished_cv.0.lock().unwrap();
            let _ = self
                .shared
                .finished_cv
                .1
                .wait_timeout(g, Duration::from_millis(50));
        }
    }

    /// A snapshot of what was received so far.
    pub fn report(&self, tags: &Tags) -> ServeReport {
        let sh = &self.shared;
        let rel = |ns: u64| {
            if ns == 0 {
                0.0
            } else {
                ns.saturating_sub(sh.start_ns) as f64 / 1e9
            }
        };
        let tcp: Vec<TcpFlowReport> = sh
            .tcp_flows
            .lock()
            .unwrap()
            .iter()
            .map(|f| {
                let bytes = f.bytes.load(Relaxed);
                let (first, last) = (f.first_ns.load(Relaxed), f.last_ns.load(Relaxed));
                let complete_ns = f.complete_ns.load(Relaxed);
                TcpFlowReport {
                    flow_id: f.flow_id,
                    peer: f.peer.to_string(),
                    expected_bytes: f.expected,
                    bytes,
                    complete: complete_ns != 0,
                    closed: f.closed.load(Relaxed),
                    accept_s: rel(f.accept_ns),
                    first_byte_s: rel(first),
                    last_byte_s: rel(last),
                    goodput_bps: rate(bytes, first, last),
                    fct_s: (complete_ns != 0).then(|| (complete_ns - f.accept_ns) as f64 / 1e9),
                }
            })
            .collect();
        let udp: Vec<UdpFlowReport> = {
            let m = sh.udp_flows.lock().unwrap();
            let mut v: Vec<_> = m
                .iter()
                .map(|((peer, id), f)| {
                    let sent = f.fin.or(f.max_seq.map(|s| s + 1)).unwrap_or(0);
                    let lost = sent.saturating_sub(f.packets);
                    UdpFlowReport {
                        flow_id: *id,
                        peer: peer.to_string(),
                        packets: f.packets,
                        bytes: f.bytes,
                        sent_packets: f.fin,
                        lost_packets: lost,
                        loss_rate: if sent > 0 { lost as f64 / sent as f64 } else { 0.0 },
                        first_s: rel(f.first_ns),
                        last_s: rel(f.last_ns),
                        goodput_bps: rate(f.bytes, f.first_ns, f.last_ns),
                        owd: LatencySummary::from_ns(&f.owd_ns),
                        owd_samples_us: self
                            .opts
                            .samples
                            .then(|| f.owd_ns.iter().map(|&n| n as f64 / 1000.0).collect()),
                    }
                })
                .collect();
            v.sort_by(|a, b| (a.peer.as_str(), a.flow_id).cmp(&(b.peer.as_str(), b.flow_id)));
            v
        };
        let mut gp: Vec<f64> = tcp.iter().map(|f| f.goodput_bps).collect();
        gp.extend(udp.iter().map(|f| f.goodput_bps));
        let total_bytes: u64 =
            tcp.iter().map(|f| f.bytes).sum::<u64>() + udp.iter().map(|f| f.bytes).sum::<u64>();
        let firsts = tcp
            .iter()
            .filter(|f| f.bytes > 0)
            .map(|f| f.first_byte_s)
            .chain(udp.iter().map(|f| f.first_s));
        let lasts = tcp
            .iter()
            .filter(|f| f.bytes > 0)
            .map(|f| f.last_byte_s)
            .chain(udp.iter().map(|f| f.last_s));
        let first = firsts.fold(f64::INFINITY, f64::min);
        let last = lasts.fold(0.0, f64::max);
        let fcts = stats::sorted(tcp.iter().filter_map(|f| f.fct_s).collect());
        let usent: u64 = udp
            .iter()
            .map(|f| f.sent_packets.unwrap_or(f.packets + f.lost_packets))
            .sum();
        let ulost: u64 = udp.iter().map(|f| f.lost_packets).sum();
        let summary = ServeSummary {
            tcp_flows: tcp.len() as u64,
            udp_flows: udp.len() as u64,
            total_bytes,
            aggregate_goodput_bps: if last > first {
                total_bytes as f64 * 8.0 / (last - first)
            } else {
                0.0
            },
            mean_goodput_bps: stats::mean(&gp),
            min_goodput_bps: if gp.is_empty() {
                0.0
            } else {
                gp.iter().copied().fold(f64::INFINITY, f64::min)
            },
            max_goodput_bps: gp.iter().copied().fold(0.0, f64::max),
            jain_fairness: stats::jain(&gp),
            completed_flows: fcts.len() as u64,
            mean_fct_s: stats::mean(&fcts),
            p99_fct_s: stats::percentile_sorted(&fcts, 99.0),
            max_fct_s: fcts.last().copied().unwrap_or(0.0),
            udp_loss_rate: if usent > 0 {
                ulost as f64 / usent as f64
            } else {
                0.0
            },
            requests_served: sh.requests.load(Relaxed),
            hook_errors: sh.hook_errors.load(Relaxed),
        };
        ServeReport {
            kind: "serve".into(),
            version: SCHEMA_VERSION,
            tags: tags.clone(),
            params: self.opts.clone(),
            summary,
            tcp_flows: tcp,
            udp_flows: udp,
        }
    }

    /// Stops accepting, closes every connection and joins the server threads.
    pub fn stop(&mut self) {
        self.shared.stop.store(true, Relaxed);
        for (_, c) in self.shared.conns.lock().unwrap().drain() {
            let _ = c.shutdown(Shutdown::Both);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn rate(bytes: u64, first_ns: u64, last_ns: u64) -> f64 {
    if last_ns > first_ns {
        bytes as f64 * 8.0 / ((last_ns - first_ns) as f64 / 1e9)
    } else {
        0.0
    }
}

fn bind_pair(bind: Option<IpAddr>, port: u16) -> Result<(TcpListener, UdpSocket)> {
    let try_bind = |ip: IpAddr| -> io::Result<(TcpListener, UdpSocket)> {
        let l = TcpListener::bind(SocketAddr::new(ip, port))?;
        let p = l.local_addr()?.port();
        let u = UdpSocket::bind(SocketAddr::new(ip, p))?;
        Ok((l, u))
    };
    match bind {
        Some(ip) => try_bind(ip).with_context(|| format!("bind {ip} port {port}")),
        None => try_bind(IpAddr::V6(Ipv6Addr::UNSPECIFIED))
            .or_else(|_| try_bind(IpAddr::V4(Ipv4Addr::UNSPECIFIED)))
            .with_context(|| format!("bind port {port}")),
    }
}

fn poll_in(fd: i32, timeout_ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, timeout_ms) > 0 }
}

fn accept_loop(listener: TcpListener, sh: Arc<Shared>) {
    let _ = listener.set_nonblocking(true);
    while !sh.stop.load(Relaxed) {
        if !poll_in(listener.as_raw_fd(), 100) {
            continue;
        }
        match listener.accept() {
            Ok((s, peer)) => {
                let _ = s.set_nonblocking(false);
                // A clone lets stop() shut the connection down; removed when it ends.
                let id = sh.next_conn.fetch_add(1, Relaxed);
                if let Ok(c) = s.try_clone() {
                    sh.conns.lock().unwrap().insert(id, c);
                }
                let sh2 = sh.clone();
                let _ = std::thread::Builder::new()
                    .name("serve-conn".into())
                    .spawn(move || {
                        serve_conn(s, canonical(peer), &sh2);
                        if let Some(c) = sh2.conns.lock().unwrap().remove(&id) {
                            let _ = c.shutdown(Shutdown::Both);
                        }
                    });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                eprintln!("plload serve: accept: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn serve_conn(mut s: TcpStream, peer: SocketAddr, sh: &Shared) {
    let accept_ns = mono_ns();
    let mut magic = [0u8; 4];
    if s.read_exact(&mut magic).is_err() {
        return;
    }
    let r = match magic {
        proto::MAGIC_BULK => bulk_rx(s, peer, accept_ns, sh),
        proto::MAGIC_REQ => {
            let _ = s.set_nodelay(true);
            requests(s, magic, sh)
        }
        _ => Ok(()),
    };
    if let Err(e) = r
        && !sh.stop.load(Relaxed)
        && e.kind() != io::ErrorKind::UnexpectedEof
        && e.kind() != io::ErrorKind::ConnectionReset
    {
        eprintln!("plload serve: connection from {peer}: {e}");
    }
}

fn bulk_rx(mut s: TcpStream, peer: SocketAddr, accept_ns: u64, sh: &Shared) -> io::Result<()> {
    let mut rest = [0u8; proto::BULK_HDR - 4];
    s.read_exact(&mut rest)?;
    let (flow_id, expected) = proto::decode_bulk_rest(&rest);
    let f = Arc::new(TcpFlowRx {
        flow_id,
        peer,
        expected,
        accept_ns,
        bytes: AtomicU64::new(0),
        first_ns: AtomicU64::new(0),
        last_ns: AtomicU64::new(0),
        complete_ns: AtomicU64::new(0),
        closed: AtomicBool::new(false),
    });
    sh.tcp_flows.lock().unwrap().push(f.clone());
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    let res = loop {
        match s.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) => {
                let now = mono_ns();
                if total == 0 {
                    f.first_ns.store(now, Relaxed);
                }
                total += n as u64;
                f.bytes.store(total, Relaxed);
                f.last_ns.store(now, Relaxed);
                if expected > 0 && total >= expected && f.complete_ns.load(Relaxed) == 0 {
                    f.complete_ns.store(now, Relaxed);
                    let _ = s.write_all(b"K");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    f.closed.store(true, Relaxed);
    sh.flow_finished();
    res
}

fn requests(mut s: TcpStream, first_magic: [u8; 4], sh: &Shared) -> io::Result<()> {
    let fd = s.as_raw_fd();
    let mut hdr = [0u8; proto::REQ_HDR];
    hdr[0..4].copy_from_slice(&first_magic);
    let mut buf = vec![0u8; 64 * 1024];
    let mut have_magic = true;
    loop {
        if have_magic {
            s.read_exact(&mut hdr[4..])?;
            have_magic = false;
        } else {
            // EOF between requests is the normal end.
            match s.read(&mut hdr[..1]) {
                Ok(0) => return Ok(()),
                Ok(_) => s.read_exact(&mut hdr[1..])?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        let req = Request::decode(&hdr)?;
        proto::skip_exact(
            &mut s,
            (req.req_len as u64).saturating_sub(proto::REQ_HDR as u64),
            &mut buf,
        )?;
        let deadline = (req.deadline_us > 0).then(|| Duration::from_micros(req.deadline_us));
        if sh.hook.before_response(fd, req.resp_len, deadline).is_err() {
            sh.hook_errors.fetch_add(1, Relaxed);
        }
        proto::encode_resp_header(&mut buf, req.id, req.ts_ns);
        let mut left = req.resp_len;
        let mut first = true;
        while left > 0 {
            let k = (left as usize).min(buf.len());
            s.write_all(&buf[..k])?;
            if first {
                buf[..proto::RESP_HDR].fill(0);
                first = false;
            }
            left -= k as u64;
        }
        if sh.hook.after_response(fd).is_err() {
            sh.hook_errors.fetch_add(1, Relaxed);
        }
        sh.requests.fetch_add(1, Relaxed);
    }
}

fn udp_loop(sock: UdpSocket, sh: Arc<Shared>, _keep_samples: bool) {
    let _ = sock.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = vec![0u8; 65536];
    let mut resp = vec![0u8; proto::MAX_UDP_RESP as usize];
    while !sh.stop.load(Relaxed) {
        let (n, peer) = match sock.recv_from(&mut buf) {
            Ok(x) => x,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(e) => {
                eprintln!("plload serve: udp recv: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let now = mono_ns();
        let peer_c = canonical(peer);
        match proto::parse_datagram(&buf[..n]) {
            Datagram::Data { flow_id, seq, ts_ns } => {
                let mut m = sh.udp_flows.lock().unwrap();
                let f = m.entry((peer_c, flow_id)).or_default();
                if f.packets == 0 {
                    f.first_ns = now;
                }
                f.packets += 1;
                f.bytes += n as u64;
                f.last_ns = now;
                f.max_seq = Some(f.max_seq.map_or(seq, |m| m.max(seq)));
                f.owd_ns.push(now.saturating_sub(ts_ns));
            }
            Datagram::Fin { flow_id, packets, .. } => {
                let first_fin = {
                    let mut m = sh.udp_flows.lock().unwrap();
                    let f = m.entry((peer_c, flow_id)).or_default();
                    let first = f.fin.is_none();
                    f.fin = Some(packets);
                    first
                };
                if first_fin {
                    sh.flow_finished();
                }
            }
            Datagram::Req(req) => {
                let k = req.resp_len.min(proto::MAX_UDP_RESP) as usize;
                proto::encode_resp_header(&mut resp, req.id, req.ts_ns);
                if sock.send_to(&resp[..k], peer).is_ok() {
                    sh.requests.fetch_add(1, Relaxed);
                }
            }
            Datagram::Unknown => {}
        }
    }
}
