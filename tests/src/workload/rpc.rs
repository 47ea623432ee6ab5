//! Request/response latency: small requests over TCP (one stream per connection) or UDP, sent
//! closed-loop (one outstanding request per connection) or open-loop at a fixed or Poisson
//! rate. Open-loop latency is measured from the request's *intended* send time, so a stalled
//! connection shows up as latency instead of silently lowering the rate (no coordinated
//! omission).

use super::sockopt::{self, SockOpts};
use super::stats::LatencySummary;
use super::{SCHEMA_VERSION, Tags, mono_ns, proto};
use anyhow::{Result, bail};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Exp};
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Options of `plload rpc`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct RpcOpts {
    /// Server address (`ip:port`).
    #[arg(long)]
    pub to: SocketAddr,
    /// Request size in bytes (min 48).
    #[arg(long, default_value_t = 64)]
    pub req_size: u32,
    /// Response size in bytes (min 24; UDP max 65000).
    #[arg(long, default_value_t = 64)]
    pub resp_size: u64,
    /// Open loop: requests per second over all connections. Without it: closed loop.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Open loop with exponential inter-arrival times (Poisson) instead of a fixed interval.
    #[arg(long)]
    pub poisson: bool,
    /// Parallel connections (TCP) or sockets (UDP).
    #[arg(long, default_value_t = 1)]
    pub conns: u32,
    /// Seconds to run.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Stop after this many requests in total.
    #[arg(long)]
    pub requests: Option<u64>,
    /// Seconds at the start whose samples are dropped.
    #[arg(long, default_value_t = 0.0)]
    pub warmup: f64,
    /// Closed loop: pause between a response and the next request (microseconds).
    #[arg(long, default_value_t = 0)]
    pub think_us: u64,
    /// UDP instead of TCP.
    #[arg(long)]
    pub udp: bool,
    /// UDP: a request without a response after this long is lost (ms).
    #[arg(long, default_value_t = 1000)]
    pub timeout_ms: u64,
    /// Include every latency sample in the report (`samples_us`).
    #[arg(long)]
    pub samples: bool,
    /// RNG seed (Poisson arrivals).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Socket options.
    #[command(flatten)]
    #[serde(flatten)]
    pub sock: SockOpts,
}

impl RpcOpts {
    /// Closed-loop TCP RPCs of 64 B / 64 B to `to` for `duration_s`.
    pub fn closed_loop(to: SocketAddr, duration_s: f64) -> RpcOpts {
        RpcOpts {
            to,
            req_size: 64,
            resp_size: 64,
            rate: None,
            poisson: false,
            conns: 1,
            duration: duration_s,
            requests: None,
            warmup: 0.0,
            think_us: 0,
            udp: false,
            timeout_ms: 1000,
            samples: false,
            seed: 1,
            sock: SockOpts::default(),
        }
    }
}

/// Flat summary: counts, achieved rate, and the latency summary's fields.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RpcSummary {
    /// Requests sent (after warm-up too).
    pub sent: u64,
    /// Responses received.
    pub received: u64,
    /// Requests without a response.
    pub lost: u64,
    /// Responses per second over the run.
    pub rate_rps: f64,
    /// Latency (after warm-up), flattened.
    #[serde(flatten)]
    pub latency: LatencySummary,
}

/// What `plload rpc` prints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RpcReport {
    /// `"rpc"`.
    pub kind: String,
    /// Schema version.
    pub version: u32,
    /// Labels.
    pub tags: Tags,
    /// Options.
    pub params: RpcOpts,
    /// Summary.
    pub summary: RpcSummary,
    /// Latency summary (same numbers as in `summary`).
    pub latency: LatencySummary,
    /// Every latency sample in microseconds, in completion order (with `--samples`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples_us: Option<Vec<f64>>,
}

#[derive(Default)]
struct ConnResult {
    sent: u64,
    received: u64,
    samples_ns: Vec<u64>,
}

struct Plan {
    start_ns: u64,
    end_ns: u64,
    warm_end_ns: u64,
    max_requests: u64,
}

/// Runs the RPC client.
pub fn run(opts: &RpcOpts, tags: &Tags) -> Result<RpcReport> {
    if opts.conns == 0 {
        bail!("--conns must be >= 1");
    }
    if opts.rate.is_some_and(|r| r.is_nan() || r <= 0.0) {
        bail!("--rate must be > 0");
    }
    let start_ns = mono_ns() + 1_000_000;
    let plan = |i: u32| {
        let per = opts
            .requests
            .map(|n| n / opts.conns as u64 + u64::from((i as u64) < n % opts.conns as u64))
            .unwrap_or(u64::MAX);
        Plan {
            start_ns,
            end_ns: start_ns + (opts.duration * 1e9) as u64,
            warm_end_ns: start_ns + (opts.warmup * 1e9) as u64,
            max_requests: per,
        }
    };
    let handles: Vec<_> = (0..opts.conns)
        .map(|i| {
            let o = opts.clone();
            let p = plan(i);
            std::thread::Builder::new()
                .name(format!("rpc-{i}"))
                .spawn(move || -> io::Result<ConnResult> {
                    super::precise_timers();
                    match (o.udp, o.rate) {
                        (false, None) => tcp_closed(&o, &p),
                        (false, Some(r)) => {
                            tcp_open(&o, &p, r / o.conns as f64, o.seed.wrapping_add(i as u64))
                        }
                        (true, None) => udp_closed(&o, &p),
                        (true, Some(r)) => {
                            udp_open(&o, &p, r / o.conns as f64, o.seed.wrapping_add(i as u64))
                        }
                    }
                })
        })
        .collect::<io::Result<_>>()?;
    let mut all = ConnResult::default();
    for h in handles {
        let r = h.join().map_err(|_| anyhow::anyhow!("rpc thread panicked"))??;
        all.sent += r.sent;
        all.received += r.received;
        all.samples_ns.extend(r.samples_ns);
    }
    let elapsed = (mono_ns().saturating_sub(start_ns)) as f64 / 1e9;
    let latency = LatencySummary::from_ns(&all.samples_ns);
    let summary = RpcSummary {
        sent: all.sent,
        received: all.received,
        lost: all.sent.saturating_sub(all.received),
        rate_rps: if elapsed > 0.0 {
            all.received as f64 / elapsed.min(opts.duration.max(1e-9))
        } else {
            0.0
        },
        latency: latency.clone(),
    };
    Ok(RpcReport {
        kind: "rpc".into(),
        version: SCHEMA_VERSION,
        tags: tags.clone(),
        params: opts.clone(),
        summary,
        latency,
        samples_us: opts
            .samples
            .then(|| all.samples_ns.iter().map(|&n| n as f64 / 1000.0).collect()),
    })
}

fn request_buf(o: &RpcOpts) -> Vec<u8> {
    vec![0u8; (o.req_size as usize).max(proto::REQ_HDR)]
}

fn fill_request(buf: &mut [u8], o: &RpcOpts, id: u64, ts_ns: u64) {
    let req = proto::Request {
        req_len: buf.len() as u32,
        id,
        ts_ns,
        resp_len: o.resp_size,
        deadline_us: 0,
    };
    buf[..proto::REQ_HDR].copy_from_slice(&req.encode());
}

fn read_response(s: &mut TcpStream, resp_len: u64, scratch: &mut [u8]) -> io::Result<(u64, u64)> {
    let mut hdr = [0u8; proto::RESP_HDR];
    s.read_exact(&mut hdr)?;
    let r = proto::decode_resp_header(&hdr)?;
    proto::skip_exact(
        s,
        resp_len.max(proto::RESP_HDR as u64) - proto::RESP_HDR as u64,
        scratch,
    )?;
    Ok(r)
}

fn connect(o: &RpcOpts) -> io::Result<TcpStream> {
    let s = sockopt::connect_tcp(o.to, &o.sock, Duration::from_secs(10))?;
    s.set_nodelay(true)?;
    Ok(s)
}

fn tcp_closed(o: &RpcOpts, p: &Plan) -> io::Result<ConnResult> {
    let mut s = connect(o)?;
    let mut req = request_buf(o);
    let mut scratch = vec![0u8; 64 * 1024];
    let mut r = ConnResult::default();
    super::sleep_until_ns(p.start_ns);
    let mut id = 0u64;
    while r.sent < p.max_requests {
        let t = mono_ns();
        if t >= p.end_ns {
            break;
        }
        fill_request(&mut req, o, id, t);
        s.write_all(&req)?;
        r.sent += 1;
        read_response(&mut s, o.resp_size, &mut scratch)?;
        let now = mono_ns();
        r.received += 1;
        if t >= p.warm_end_ns {
            r.samples_ns.push(now - t);
        }
        id += 1;
        if o.think_us > 0 {
            std::thread::sleep(Duration::from_micros(o.think_us));
        }
    }
    Ok(r)
}

/// Inter-arrival generator: fixed or exponential with mean 1/rate.
struct Arrivals {
    fixed_ns: f64,
    exp: Option<(Exp<f64>, StdRng)>,
}

impl Arrivals {
    fn new(rate: f64, poisson: bool, seed: u64) -> Arrivals {
        let exp = poisson.then(|| (Exp::new(rate).expect("rate > 0"), StdRng::seed_from_u64(seed)));
        Arrivals {
            fixed_ns: 1e9 / rate,
            exp,
        }
    }
    fn next_gap_ns(&mut self) -> f64 {
        match &mut self.exp {
            Some((e, rng)) => e.sample(rng) * 1e9,
            None => self.fixed_ns,
        }
    }
}

fn tcp_open(o: &RpcOpts, p: &Plan, rate: f64, seed: u64) -> io::Result<ConnResult> {
    let s = connect(o)?;
    let mut rx = s.try_clone()?;
    let mut tx = s;
    let warm = p.warm_end_ns;
    let resp_len = o.resp_size;
    let receiver = std::thread::spawn(move || -> io::Result<(u64, Vec<u64>)> {
        let mut scratch = vec![0u8; 64 * 1024];
        let (mut n, mut v) = (0u64, Vec::new());
        loop {
            match read_response(&mut rx, resp_len, &mut scratch) {
                Ok((_id, ts)) => {
                    let now = mono_ns();
                    n += 1;
                    if ts >= warm {
                        v.push(now.saturating_sub(ts));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok((n, v)),
                Err(e) => return Err(e),
            }
        }
    });
    let mut arr = Arrivals::new(rate, o.poisson, seed);
    let mut req = request_buf(o);
    let mut sent = 0u64;
    let mut next = p.start_ns as f64;
    while sent < p.max_requests && (next as u64) < p.end_ns {
        let due = next as u64;
        super::sleep_until_ns(due);
        fill_request(&mut req, o, sent, due);
        tx.write_all(&req)?;
        sent += 1;
        next += arr.next_gap_ns();
    }
    // The server answers what is pending, sees our FIN and closes: the receiver gets EOF.
    tx.shutdown(Shutdown::Write)?;
    let (received, samples_ns) = receiver
        .join()
        .map_err(|_| io::Error::other("receiver panicked"))??;
    Ok(ConnResult {
        sent,
        received,
        samples_ns,
    })
}

fn udp_socket(o: &RpcOpts) -> io::Result<UdpSocket> {
    sockopt::connect_udp(o.to, &o.sock)
}

fn udp_closed(o: &RpcOpts, p: &Plan) -> io::Result<ConnResult> {
    let s = udp_socket(o)?;
    let timeout = Duration::from_millis(o.timeout_ms.max(1));
    s.set_read_timeout(Some(timeout))?;
    let mut req = request_buf(o);
    let mut buf = vec![0u8; 65536];
    let mut r = ConnResult::default();
    super::sleep_until_ns(p.start_ns);
    let mut id = 0u64;
    while r.sent < p.max_requests {
        let t = mono_ns();
        if t >= p.end_ns {
            break;
        }
        fill_request(&mut req, o, id, t);
        s.send(&req)?;
        r.sent += 1;
        let deadline = t + timeout.as_nanos() as u64;
        loop {
            match s.recv(&mut buf) {
                Ok(n) => {
                    if let Ok((rid, _)) = proto::decode_resp_header(&buf[..n])
                        && rid == id
                    {
                        let now = mono_ns();
                        r.received += 1;
                        if t >= p.warm_end_ns {
                            r.samples_ns.push(now - t);
                        }
                        break;
                    }
                    if mono_ns() >= deadline {
                        break;
                    }
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // ICMP port unreachable surfaces as ECONNREFUSED on a connected socket.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => break,
                Err(e) => return Err(e),
            }
        }
        id += 1;
        if o.think_us > 0 {
            std::thread::sleep(Duration::from_micros(o.think_us));
        }
    }
    Ok(r)
}

fn udp_open(o: &RpcOpts, p: &Plan, rate: f64, seed: u64) -> io::Result<ConnResult> {
    let tx = udp_socket(o)?;
    let rx = tx.try_clone()?;
    let timeout = Duration::from_millis(o.timeout_ms.max(1));
    rx.set_read_timeout(Some(Duration::from_millis(20)))?;
    let done_sending = Arc::new(AtomicBool::new(false));
    let last_send = Arc::new(AtomicU64::new(0));
    let (ds, ls, warm) = (done_sending.clone(), last_send.clone(), p.warm_end_ns);
    let receiver = std::thread::spawn(move || -> (u64, Vec<u64>) {
        let mut buf = vec![0u8; 65536];
        let (mut n, mut v) = (0u64, Vec::new());
        loop {
            match rx.recv(&mut buf) {
                Ok(k) => {
                    if let Ok((_id, ts)) = proto::decode_resp_header(&buf[..k]) {
                        let now = mono_ns();
                        n += 1;
                        if ts >= warm {
                            v.push(now.saturating_sub(ts));
                        }
                    }
                }
                Err(_) => {
                    if ds.load(Relaxed) && mono_ns() > ls.load(Relaxed) + timeout.as_nanos() as u64 {
                        return (n, v);
                    }
                }
            }
        }
    });
    let mut arr = Arrivals::new(rate, o.poisson, seed);
    let mut req = request_buf(o);
    let mut sent = 0u64;
    let mut next = p.start_ns as f64;
    while sent < p.max_requests && (next as u64) < p.end_ns {
        let due = next as u64;
        super::sleep_until_ns(due);
        fill_request(&mut req, o, sent, due);
        let _ = tx.send(&req);
        sent += 1;
        last_send.store(mono_ns(), Relaxed);
        next += arr.next_gap_ns();
    }
    last_send.store(mono_ns(), Relaxed);
    done_sending.store(true, Relaxed);
    let (received, samples_ns) = receiver
        .join()
        .map_err(|_| io::Error::other("receiver panicked"))?;
    Ok(ConnResult {
        sent,
        received: received.min(sent),
        samples_ns,
    })
}
