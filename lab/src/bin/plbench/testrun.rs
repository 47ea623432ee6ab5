//! BPF_PROG_TEST_RUN timings of a tc program: a frame run `repeat` times in the kernel, on
//! one CPU or on two at once.

use anyhow::{Context as _, Result};
use aya::{TestRun, TestRunOptions};
use paceline_tests::skb::SkBuff;

/// Mean ns per run over `repeat` runs in the kernel. `stack_ts`: nonzero for a packet with the
/// EDT timestamp TCP sets (stamped at the call), 0 for UDP or forwarded traffic; `mark`: the
/// packet's mark.
pub(super) fn measure(
    prog: &aya::programs::SchedClassifier,
    frame: &[u8],
    stack_ts: u64,
    mark: u32,
    repeat: u32,
) -> Result<f64> {
    // A stamped packet is stamped now, as TCP stamps its segments microseconds before tc sees
    // them: the datapath trusts a stamp only within 10 s of the clock, and a stamp taken when
    // the benchmark started would make the first run of every later measurement read it.
    let stack_ts = if stack_ts != 0 {
        paceline_tests::skb::mono_now_ns()
    } else {
        0
    };
    let ctx = SkBuff {
        tstamp: stack_ts,
        mark,
        ..SkBuff::default()
    };
    let r = prog
        .test_run(TestRunOptions {
            data_in: Some(frame),
            ctx_in: Some(ctx.as_bytes()),
            repeat,
            ..TestRunOptions::default()
        })
        .context("BPF_PROG_TEST_RUN")?;
    Ok(r.duration.as_nanos() as f64)
}

/// [`measure`] of two frames at once, each on its own CPU (threads pinned to CPUs 0 and 1,
/// started together): the mean of the two ns per packet.
pub(super) fn measure_pair(
    prog: &aya::programs::SchedClassifier,
    frames: [&[u8]; 2],
    stack_ts: u64,
    mark: u32,
    repeat: u32,
) -> Result<f64> {
    let start = std::sync::Barrier::new(2);
    let each: Vec<Result<f64>> = std::thread::scope(|s| {
        let threads: Vec<_> = frames
            .into_iter()
            .enumerate()
            .map(|(cpu, frame)| {
                let start = &start;
                s.spawn(move || {
                    pin_to_cpu(cpu)?;
                    start.wait();
                    measure(prog, frame, stack_ts, mark, repeat)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a measuring thread panicked")))
            })
            .collect()
    });
    let mut sum = 0.0;
    for ns in each {
        sum += ns?;
    }
    Ok(sum / 2.0)
}

/// Pins the calling thread to `cpu`.
fn pin_to_cpu(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set)
    };
    anyhow::ensure!(
        rc == 0,
        "pinning a thread to CPU {cpu}: {} (the two-CPU rows need two CPUs)",
        std::io::Error::last_os_error()
    );
    Ok(())
}
