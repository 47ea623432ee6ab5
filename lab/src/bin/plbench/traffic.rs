//! `plbench traffic`: the tc programs' cost per packet under real traffic, as the kernel's own
//! per-program statistics count it (`BPF_ENABLE_STATS`: `run_time_ns / run_cnt`, what bpftop
//! reads), not BPF_PROG_TEST_RUN's.
//!
//! Two namespaces joined by a veth pair; each program in turn is attached at the sender's
//! egress (tcx) while TCP or UDP flows (one, or 64 of each kind) run through it for a few
//! seconds: the benchmark's empty program (the floor: the statistics' own cost and a program
//! call), the reference (what Cilium's bandwidth manager does per packet), and paceline's
//! egress program under each of the caller's policies. Every program runs once per trial in turn, so machine
//! noise spreads over all of them alike; the figure is the median over the trials.
//!
//! TCP flows and UDP flows from connected sockets have their socket in the sender's namespace
//! (paceline's socket-storage path); UDP datagrams sent with `sendto` from unconnected sockets
//! take the path of forwarded traffic and of a container's, whose socket stays behind in its
//! namespace: the flow table, and, for a flow whose class keeps nothing per flow (no flow clock),
//! the CPU's class memo from its third packet. Under every policy here, a class with
//! one class clock takes the memo; every feature on (a flow clock) takes the table.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd as _, AsRawFd as _};
use std::time::Duration;

use anyhow::{Context as _, Result};
use aya::programs::{
    LinkOrder, SchedClassifier, TcAttachType,
    tc::{SchedClassifierLinkId, TcAttachOptions},
};
use paceline::kernel::datapath::{Datapath, LoadOptions};
use paceline_tests::{
    testbed::{Host, Testbed},
    workload::{
        self,
        bulk::{self, BulkOpts},
        serve::{ServeOpts, Server},
    },
};
use serde::Serialize;

use super::datapath::{Policy, TC_FLOOR, TC_REF_EDT, bench_object, port_rules, table, table_one_clock};
use super::{cpu_model, read_trim, write_report};

/// One kind of traffic: TCP, UDP from connected sockets or UDP sent with `sendto` from
/// unconnected ones, and how many flows.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Tcp,
    Udp,
    UdpUnconnected,
}

#[derive(Clone, Copy, Debug)]
struct Traffic {
    kind: Kind,
    flows: u32,
}

impl Traffic {
    fn name(&self) -> String {
        let k = match self.kind {
            Kind::Tcp => "TCP",
            Kind::Udp => "UDP",
            Kind::UdpUnconnected => "UDP sendto",
        };
        format!("{k} x {}", self.flows)
    }
}

/// The traffic rows: TCP, UDP from connected sockets (the socket-storage path, as TCP) and UDP
/// from unconnected ones (the flow table's path), one flow and 64 each.
const TRAFFIC: [Traffic; 6] = [
    Traffic {
        kind: Kind::Tcp,
        flows: 1,
    },
    Traffic {
        kind: Kind::Tcp,
        flows: 64,
    },
    Traffic {
        kind: Kind::Udp,
        flows: 1,
    },
    Traffic {
        kind: Kind::Udp,
        flows: 64,
    },
    Traffic {
        kind: Kind::UdpUnconnected,
        flows: 1,
    },
    Traffic {
        kind: Kind::UdpUnconnected,
        flows: 64,
    },
];

/// UDP's offered payload rate, all flows together (bit/s): well below what the veth pair
/// carries, so the sender does not spend the window in ENOBUFS.
const UDP_BPS: u64 = 1_000_000_000;

/// The kernel's statistics of one program: total run time and runs.
fn prog_stats(p: &SchedClassifier) -> Result<(u64, u64)> {
    let fd = p.fd().context("program fd")?;
    let path = format!("/proc/self/fdinfo/{}", fd.as_fd().as_raw_fd());
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    let field = |k: &str| -> Result<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(k)?.trim().parse().ok())
            .with_context(|| format!("{path}: no {k}"))
    };
    Ok((field("run_time_ns:")?, field("run_cnt:")?))
}

/// One result row.
#[derive(Serialize, Clone, Debug)]
struct TrafficRow {
    program: String,
    traffic: String,
    /// Median over the trials of run_time_ns / run_cnt.
    ns_per_packet: f64,
    /// That, less the floor's for the same traffic.
    over_floor: f64,
    /// over_floor / the reference's over_floor for the same traffic.
    vs_reference: f64,
    min: f64,
    max: f64,
    /// Packets the program ran on in one trial (the median trial's).
    packets: u64,
}

/// Runs the benchmark. `programs`: the floor first, then the reference, then paceline's, each
/// loaded and with its maps filled.
fn run(
    programs: &mut [(String, &mut SchedClassifier)],
    kinds: &[Traffic],
    trials: usize,
    seconds: f64,
) -> Result<Vec<TrafficRow>> {
    // Statistics on for as long as the descriptor is open (the sysctl is left as it was).
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).context("BPF_ENABLE_STATS")?;
    let tb = Testbed::new("plbench_traffic")?;
    let tx = tb.add_host("tx")?;
    let rx = tb.add_host("rx")?;
    let link = tb.link(&tx, &rx)?;
    let ifname = link.a.ifname.clone();
    let dst = IpAddr::V4(link.b.ipv4);
    // samples[program][traffic] = (ns per run, runs) per trial
    let mut samples = vec![vec![Vec::<(f64, u64)>::new(); kinds.len()]; programs.len()];
    for trial in 0..trials {
        for (ti, t) in kinds.iter().enumerate() {
            for (pi, (name, prog)) in programs.iter_mut().enumerate() {
                let link_id = attach(&tx, prog, &ifname)?;
                let r = (|| -> Result<(u64, u64)> {
                    let s0 = prog_stats(prog)?;
                    drive(
                        &tx,
                        &rx,
                        dst,
                        *t,
                        seconds,
                        6000 + (trial * 100 + ti * 10 + pi) as u16,
                    )?;
                    let s1 = prog_stats(prog)?;
                    Ok((s1.0 - s0.0, s1.1 - s0.1))
                })();
                tx.in_netns(|| prog.detach(link_id))?
                    .with_context(|| format!("detaching {name}"))?;
                let (ns, runs) = r.with_context(|| format!("{name}, {}", t.name()))?;
                anyhow::ensure!(runs > 0, "{name}: no packet ran through it ({})", t.name());
                samples[pi][ti].push((ns as f64 / runs as f64, runs));
                eprintln!(
                    "traffic: trial {trial} {:<15} {:<60} {:>7.1} ns/pkt over {runs} packets",
                    t.name(),
                    name,
                    ns as f64 / runs as f64
                );
            }
        }
    }
    let med = |v: &[(f64, u64)]| -> (f64, f64, f64, u64) {
        let mut s = v.to_vec();
        s.sort_by(|a, b| a.0.total_cmp(&b.0));
        let m = s[s.len() / 2];
        (m.0, s[0].0, s[s.len() - 1].0, m.1)
    };
    let mut rows = Vec::new();
    for (ti, t) in kinds.iter().enumerate() {
        let floor = med(&samples[0][ti]).0;
        let reference = med(&samples[1][ti]).0 - floor;
        for (pi, (name, _)) in programs.iter().enumerate() {
            let (m, min, max, packets) = med(&samples[pi][ti]);
            rows.push(TrafficRow {
                program: name.clone(),
                traffic: t.name(),
                ns_per_packet: m,
                over_floor: m - floor,
                vs_reference: (m - floor) / reference,
                min,
                max,
                packets,
            });
        }
    }
    Ok(rows)
}

/// Attaches `prog` at `ifname`'s egress in `host`'s namespace (tcx, first in line).
fn attach(host: &Host, prog: &mut SchedClassifier, ifname: &str) -> Result<SchedClassifierLinkId> {
    host.in_netns(|| {
        prog.attach_with_options(
            ifname,
            TcAttachType::Egress,
            TcAttachOptions::TcxOrder(LinkOrder::first()),
        )
    })?
    .with_context(|| format!("attaching at {ifname} egress (tcx)"))
}

/// Runs `t` from `tx` to a server on `rx` for `seconds`.
fn drive(tx: &Host, rx: &Host, dst: IpAddr, t: Traffic, seconds: f64, port: u16) -> Result<()> {
    let server = rx.in_netns(|| {
        Server::start_plain(&ServeOpts {
            port,
            ..ServeOpts::default()
        })
    })??;
    let mut o = BulkOpts::tcp(SocketAddr::new(dst, port), t.flows, seconds);
    if matches!(t.kind, Kind::Udp | Kind::UdpUnconnected) {
        o.udp = true;
        o.unconnected = matches!(t.kind, Kind::UdpUnconnected);
        o.rate_bps = Some(UDP_BPS / u64::from(t.flows));
        o.msg_size = Some(1400);
    }
    tx.in_netns(|| bulk::run(&o, &workload::Tags::default()))?
        .context("the traffic's sender")?;
    // The last datagrams in flight reach the server.
    std::thread::sleep(Duration::from_millis(50));
    drop(server);
    Ok(())
}

#[derive(Serialize)]
struct TrafficReport {
    kind: &'static str,
    kernel: String,
    cpu: String,
    trials: usize,
    seconds: f64,
    rows: Vec<TrafficRow>,
}

/// `plbench traffic`.
pub(super) fn traffic(
    trials: usize,
    seconds: f64,
    only: &[String],
    out: Option<std::path::PathBuf>,
) -> Result<()> {
    // The reference's aggregate for unmarked packets, at the rate of the class it is compared
    // with.
    let mut refs = bench_object(&[TC_FLOOR, TC_REF_EDT], 0, 10_000_000_000)?;
    let mut full = Datapath::load(&LoadOptions::default())?;
    let p = Policy::new(table(true), &port_rules());
    full.write_policy(&p.table, &p.image)?;
    let mut one = Datapath::load(&LoadOptions::default())?;
    let p = Policy::new(table_one_clock(), &port_rules());
    one.write_policy(&p.table, &p.image)?;
    let mut floor = None;
    let mut reference = None;
    for (name, prog) in refs.programs_mut() {
        match name {
            TC_FLOOR => floor = Some(prog),
            TC_REF_EDT => reference = Some(prog),
            _ => {}
        }
    }
    let (Some(floor), Some(reference)) = (floor, reference) else {
        anyhow::bail!("the benchmark's object lacks {TC_FLOOR} or {TC_REF_EDT}");
    };
    let mut programs: Vec<(String, &mut SchedClassifier)> = vec![
        ("floor: empty classifier".into(), floor.try_into()?),
        (
            "reference: Cilium's EDT per packet (hash lookup, clock, departure, tstamp)".into(),
            reference.try_into()?,
        ),
        (
            "paceline, one class clock (what the reference does)".into(),
            one.tc_program()?,
        ),
        (
            "paceline, flow+class+level clocks, DSCP, priority".into(),
            full.tc_program()?,
        ),
    ];
    let kinds: Vec<Traffic> = TRAFFIC
        .into_iter()
        .filter(|t| only.is_empty() || only.iter().any(|o| t.name().contains(o.as_str())))
        .collect();
    anyhow::ensure!(!kinds.is_empty(), "no kind of traffic matches {only:?}");
    let rows = run(&mut programs, &kinds, trials, seconds)?;
    println!(
        "{:<15} {:<76} {:>8} {:>11} {:>9}",
        "traffic", "program", "ns/pkt", "over floor", "x ref"
    );
    for r in &rows {
        println!(
            "{:<15} {:<76} {:>8.1} {:>11.1} {:>9.2}",
            r.traffic, r.program, r.ns_per_packet, r.over_floor, r.vs_reference
        );
    }
    let report = TrafficReport {
        kind: "bench-traffic",
        kernel: read_trim("/proc/sys/kernel/osrelease"),
        cpu: cpu_model(),
        trials,
        seconds,
        rows,
    };
    write_report(&report, out)
}
