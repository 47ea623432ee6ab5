//! `plbench datapath`: the tc classifier's cost per packet on each path, measured with
//! BPF_PROG_TEST_RUN against an empty classifier (the floor) and against a reference that does
//! what Cilium's bandwidth manager does per packet, in the same run; at 1 to 100,000 rules.
//!
//! Each path runs `--repeat` packets per trial in the kernel (the kernel reports the mean time
//! per run); the figure is the median over `--trials` trials, every path once per trial in
//! turn so that machine noise spreads over all of them alike. Run by `cargo xtask bench
//! datapath`, which writes results/bench-datapath.json.

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use aya::programs::SchedClassifier;
use paceline::kernel::datapath::{Datapath, LoadOptions};

use super::testrun::{measure, measure_pair};
use paceline_common::{
    maps::{
        BENCH_FLOW_NEW, BENCH_FLOW_REPLACE, BenchEdt, DEFAULT_FLOW_TABLE_SIZE, FlowKey, FlowState,
        FlowTableKey, MAX_CLASSES, names,
    },
    trace::{TRACE_CLASS, TRACE_ON, TraceConfig},
};
use serde::Serialize;

use super::{cpu_model, read_trim, write_report};

mod cases;
pub(crate) use cases::{Policy, port_rules, table, table_one_clock};

/// The benchmark object's programs (`datapath-ebpf/src/bench.rs`): an empty classifier (the
/// floor), one that only reads the clock, and Cilium's bandwidth-manager algorithm (the
/// reference).
pub(super) const TC_FLOOR: &str = "pl_tc_floor";
const TC_CLOCK: &str = "pl_tc_clock";
pub(super) const TC_REF_EDT: &str = "pl_tc_ref_edt";

#[derive(Serialize)]
struct Row {
    path: String,
    ns_per_packet: f64,
    over_floor: f64,
    min: f64,
    max: f64,
}

#[derive(Serialize)]
struct Report {
    kind: &'static str,
    kernel: String,
    cpu: String,
    repeat: u32,
    trials: usize,
    rows: Vec<Row>,
}

/// The mark of the benchmark's unstamped packets (UDP, forwarded traffic): every run of such a
/// packet is taken as unstamped (`LoadOptions::bench_unstamped_mark`), as a real one is, though
/// the test run's skb keeps the departure its previous run wrote.
const UNSTAMPED_MARK: u32 = 0x5eed;

/// The datapath's load options in this benchmark.
fn bench_options() -> LoadOptions {
    LoadOptions {
        bench_unstamped_mark: UNSTAMPED_MARK,
        ..LoadOptions::default()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Prog {
    Floor,
    Clock,
    Reference,
    /// The tc program loaded to take every flow-table lookup for a miss: each run looks the
    /// flow up, classifies, finds the flow in its admission slot and enters it in the table,
    /// as a flow's second packet does; the insert replaces the previous run's entry (in cache,
    /// nothing evicted).
    Full,
    /// Each run a new flow (the program alters the key's first word with its count of first
    /// packets and inserts): the lookup misses, the flow is classified and leaves its clock in
    /// an admission slot, as a new flow's first packet does. The table stays empty.
    NewFlow,
    /// [`Prog::NewFlow`] with the flow table full of 65,536 other flows: every lookup walks a
    /// full table's bucket.
    NewFlowFullTable,
    /// The tc program as the agent loads it; BPF_PROG_TEST_RUN's placeholder socket is not
    /// TCP, so from the second run every packet finds its class (and its flow clock) in the
    /// flow table, as the later packets of a flow without a local socket do (UDP, forwarded
    /// traffic, a container's packets at the host's device); a flow whose class keeps nothing
    /// per flow (no flow clock) finds its class in the CPU's class memo from the third.
    Table,
    /// The tc program loaded to take the placeholder socket for a TCP one: after the first
    /// run, every packet finds its class (and its flow clock) in the socket's storage, as a
    /// TCP flow's later packets do.
    Cached,
    CountOnly,
    /// [`Prog::Table`]'s path loaded as if tracing were not built in (every trace branch and
    /// record store pruned by the verifier): against [`Prog::Table`], what tracing costs while
    /// off.
    NoTrace,
    /// The tc program as the agent loads it ([`Prog::Table`]'s path) while a trace runs for a
    /// class the packet is not of: the tail call and the filter.
    TraceFiltered,
    /// While a trace records one packet in 1,000 (at most 100,000 a second on each CPU).
    TraceSampled,
    /// While a trace records every packet: runs of at most [`TRACE_EVERY_RUNS`] packets, each
    /// recorded (the ring is read between runs).
    TraceEvery,
}

/// Packets per measurement of [`Prog::TraceEvery`]: every one of them is recorded, within the
/// per-second cap of 100,000 and a ring of [`TRACE_RING_BYTES`].
const TRACE_EVERY_RUNS: u32 = 20_000;
/// The benchmark's trace ring: 64 MiB, about 240,000 records.
const TRACE_RING_BYTES: u32 = 64 << 20;

/// One row: the program, the policy (index into the policies), the frame, the stack
/// timestamp, the mark.
struct Case {
    name: String,
    prog: Prog,
    policy: usize,
    frame: Vec<u8>,
    ts: u64,
    mark: u32,
    /// Another frame sent through the same program on the other CPU at the same time (the row
    /// reads the mean of the two CPUs' ns per packet): what sharing the clocks' cache lines
    /// across CPUs costs.
    pair: Option<Vec<u8>>,
}

pub(super) fn datapath(
    repeat: u32,
    trials: usize,
    max_rules: u32,
    only: Vec<String>,
    out: Option<PathBuf>,
) -> Result<()> {
    let (policies, mut cases) = cases::cases(max_rules);

    if !only.is_empty() {
        cases.retain(|c| {
            matches!(c.prog, Prog::Floor | Prog::Reference)
                || only.iter().any(|o| c.name.contains(o.as_str()))
        });
    }
    let mut dp = Datapath::load(&bench_options())?;
    let mut first = Datapath::load(&LoadOptions {
        bench_flow_miss: BENCH_FLOW_REPLACE,
        ..bench_options()
    })?;
    let mut fresh = Datapath::load(&LoadOptions {
        bench_flow_miss: BENCH_FLOW_NEW,
        ..bench_options()
    })?;
    let mut crowded = Datapath::load(&LoadOptions {
        bench_flow_miss: BENCH_FLOW_NEW,
        ..bench_options()
    })?;
    fill_flow_table(&mut crowded, DEFAULT_FLOW_TABLE_SIZE)?;
    let mut cached = Datapath::load(&LoadOptions {
        bench_any_socket: true,
        ..bench_options()
    })?;
    let mut count_only = Datapath::load(&LoadOptions {
        count_only: true,
        ..bench_options()
    })?;
    let mut untraced = Datapath::load(&LoadOptions {
        bench_no_trace: true,
        ..bench_options()
    })?;
    let mut traced = Datapath::load(&LoadOptions {
        trace_ring_bytes: Some(TRACE_RING_BYTES),
        ..bench_options()
    })?;
    let trace_cfg = |flags: u32, class: u32, sample: u32| TraceConfig {
        flags: TRACE_ON | flags,
        class,
        sample,
        per_sec: 100_000,
        session: 1,
        ..TraceConfig::default()
    };
    // The floor, the clock and the reference: the benchmark's own object, not the agent's. The
    // reference's aggregate (the packets' mark, 1): a rate low enough that every packet takes
    // the full path (delayed: the departure computed and written).
    let refs = bench_object(&[TC_FLOOR, TC_CLOCK, TC_REF_EDT], 1, 1_000_000)?;
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..trials {
        for (pi, p) in policies.iter().enumerate() {
            if !cases.iter().any(|c| c.policy == pi) {
                continue;
            }
            dp.write_policy(&p.table, &p.image)?;
            first.write_policy(&p.table, &p.image)?;
            fresh.write_policy(&p.table, &p.image)?;
            crowded.write_policy(&p.table, &p.image)?;
            cached.write_policy(&p.table, &p.image)?;
            count_only.write_policy(&p.table, &p.image)?;
            traced.write_policy(&p.table, &p.image)?;
            untraced.write_policy(&p.table, &p.image)?;
            for (i, c) in cases.iter().enumerate().filter(|(_, c)| c.policy == pi) {
                let mut runs = repeat;
                match c.prog {
                    Prog::TraceFiltered => {
                        traced.start_trace(&trace_cfg(TRACE_CLASS, MAX_CLASSES as u32 - 1, 1))?
                    }
                    Prog::TraceSampled => traced.start_trace(&trace_cfg(0, 0, 1000))?,
                    Prog::TraceEvery => {
                        traced.start_trace(&trace_cfg(0, 0, 1))?;
                        runs = repeat.min(TRACE_EVERY_RUNS);
                        // A new second: the cap's window opens fresh.
                        std::thread::sleep(std::time::Duration::from_millis(1000));
                    }
                    _ => {}
                }
                let reference = |name: &str| -> Result<&SchedClassifier> {
                    Ok(refs
                        .program(name)
                        .with_context(|| format!("program {name} missing"))?
                        .try_into()?)
                };
                let prog: &SchedClassifier = match c.prog {
                    Prog::Floor => reference(TC_FLOOR)?,
                    Prog::Clock => reference(TC_CLOCK)?,
                    Prog::Reference => reference(TC_REF_EDT)?,
                    Prog::Full => first.tc_program()?,
                    Prog::NewFlow => fresh.tc_program()?,
                    Prog::NewFlowFullTable => crowded.tc_program()?,
                    Prog::Table => dp.tc_program()?,
                    Prog::Cached => cached.tc_program()?,
                    Prog::CountOnly => count_only.tc_program()?,
                    Prog::NoTrace => untraced.tc_program()?,
                    Prog::TraceFiltered | Prog::TraceSampled | Prog::TraceEvery => traced.tc_program()?,
                };
                samples[i].push(match &c.pair {
                    None => measure(prog, &c.frame, c.ts, c.mark, runs)?,
                    Some(other) => measure_pair(prog, [&c.frame, other], c.ts, c.mark, runs)?,
                });
                if matches!(
                    c.prog,
                    Prog::TraceFiltered | Prog::TraceSampled | Prog::TraceEvery
                ) {
                    let n = traced.drain_trace().len();
                    traced.stop_trace()?;
                    if c.prog == Prog::TraceEvery && (n as u32) < runs {
                        let t = traced.snapshot()?.trace;
                        anyhow::bail!(
                            "{}: {n} of {runs} packets recorded ({} capped, {} lost since the start): the row would not measure what it says",
                            c.name,
                            t.capped,
                            t.lost
                        );
                    }
                }
            }
        }
    }
    let stats: Vec<(f64, f64, f64)> = samples
        .into_iter()
        .map(|mut v| {
            v.sort_by(f64::total_cmp);
            (v[v.len() / 2], v[0], v[v.len() - 1])
        })
        .collect();
    let floor_ns = stats[0].0;
    println!(
        "{:<76} {:>8} {:>11} {:>8} {:>8}",
        "path", "ns/pkt", "over floor", "min", "max"
    );
    let rows: Vec<Row> = cases
        .iter()
        .zip(stats)
        .map(|(c, (med, min, max))| {
            println!(
                "{:<76} {med:>8.1} {:>11.1} {min:>8.1} {max:>8.1}",
                c.name,
                med - floor_ns
            );
            Row {
                path: c.name.clone(),
                ns_per_packet: med,
                over_floor: med - floor_ns,
                min,
                max,
            }
        })
        .collect();
    let report = Report {
        kind: "bench-datapath",
        kernel: read_trim("/proc/sys/kernel/osrelease"),
        cpu: cpu_model(),
        repeat,
        trials,
        rows,
    };
    write_report(&report, out)
}

/// The benchmark's own eBPF object with `programs` verified, and the reference's aggregate for
/// packets of mark `mark` at `bps` bytes/s, with a horizon it never reaches.
pub(super) fn bench_object(programs: &[&str], mark: u64, bps: u64) -> Result<aya::Ebpf> {
    let mut refs = aya::Ebpf::load(paceline::kernel::datapath::BENCH_OBJECT)
        .context("loading the benchmark's eBPF object")?;
    for name in programs {
        let p: &mut SchedClassifier = refs
            .program_mut(name)
            .with_context(|| format!("program {name} missing from the benchmark's object"))?
            .try_into()?;
        p.load().with_context(|| format!("verifying {name}"))?;
    }
    let mut aggs: aya::maps::HashMap<_, u64, BenchEdt> = aya::maps::HashMap::try_from(
        refs.map_mut(names::BENCH_EDT)
            .with_context(|| format!("map {} missing from the benchmark's object", names::BENCH_EDT))?,
    )?;
    aggs.insert(
        mark,
        BenchEdt {
            bps,
            t_last: 0,
            horizon_ns: u64::MAX / 2,
        },
        0,
    )?;
    Ok(refs)
}

/// Fills `dp`'s flow table with `n` flows no benchmark packet belongs to (UDP from
/// 198.51.100.1 to 203.0.113.x), as a busy host's table holds its established flows.
fn fill_flow_table(dp: &mut Datapath, n: u32) -> Result<()> {
    let mut flows = paceline_tests::tables::flow_table(dp)?;
    let v4 = |a: [u8; 4]| [0, 0, 0xffff_0000u32.to_be(), u32::from_ne_bytes(a)];
    for i in 0..n {
        let key = FlowKey {
            src: v4([198, 51, 100, 1]),
            dst: v4([203, 0, 113, (i >> 16) as u8]),
            sport: i as u16,
            dport: 53,
            proto: 17,
            _pad: [0; 3],
        };
        let state = FlowState {
            src: key.src,
            dst: key.dst,
            ..FlowState::default()
        };
        flows.insert(FlowTableKey::of(&key, false), state, 0)?;
    }
    Ok(())
}
