//! # paceline-tests
//!
//! # Layout
//! - [`testbed`]: topologies of network namespaces joined by veth links, torn down by RAII guards.
//! - [`workload`]: traffic generators (bulk flows, RPCs, partition-aggregate, incast) with JSON results.
//! - [`agent`]: the agent run inside a testbed host (start, status, stop, kill -9).
//! - [`skb`]: the `__sk_buff` mirror for BPF_PROG_TEST_RUN contexts.
//! - [`stolen`]: the time the machine stood still (a hypervisor's steal), which rate tests' lower
//!   bounds give up.
//! - [`packet`]: test packet builders and checkers.
//! - [`gate`]: whether a privileged test can run (root, CI, emulation) and its SKIPPED line.
//! - [`frames`]: random and mutated frames for the datapath's differential test, and what the
//!   reference parser and classifier in `paceline_common` expect of each.
//! - [`policygen`]: large generated policies (YAML and datapath rules) for the scale tests.
//! - [`tables`]: the loaded datapath's maps opened for writing (a planted flow-table entry).
//! - `tests/`: the privileged integration suite (one binary, flat module list).
//!
//! The experiments, benchmarks and report tool that run on this testbed are `paceline-lab`'s.

pub mod agent;
pub mod frames;
pub mod gate;
pub mod packet;
pub mod policygen;
pub mod skb;
pub mod stolen;
pub mod tables;
pub mod testbed;
pub mod workload;

/// Sets its flag when dropped: a test's helper threads in a `std::thread::scope` loop until a
/// stop flag, and a failed assertion in the scope's body must still stop them, or the scope
/// waits for them forever and the test hangs instead of failing.
pub struct StopOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The calling thread pinned to one CPU until dropped (its affinity restored then): per-CPU
/// state a test reads (the class memo, a CPU's counters) stays the one its packets saw.
pub struct PinnedCpu(nix::sched::CpuSet);

impl PinnedCpu {
    /// Pins to `cpu`.
    pub fn to(cpu: usize) -> PinnedCpu {
        use nix::{sched, unistd::Pid};
        let was = sched::sched_getaffinity(Pid::from_raw(0)).expect("reading the thread's affinity");
        let mut one = sched::CpuSet::new();
        one.set(cpu).expect("a CPU number within the set");
        sched::sched_setaffinity(Pid::from_raw(0), &one)
            .unwrap_or_else(|e| panic!("pinning to CPU {cpu}: {e}"));
        PinnedCpu(was)
    }

    /// Pins to the first CPU the thread may run on.
    pub fn first() -> PinnedCpu {
        let was = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
            .expect("reading the thread's affinity");
        let cpu = (0..nix::sched::CpuSet::count())
            .find(|c| was.is_set(*c).unwrap_or(false))
            .expect("a CPU the thread may run on");
        PinnedCpu::to(cpu)
    }
}

impl Drop for PinnedCpu {
    fn drop(&mut self) {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &self.0);
    }
}
