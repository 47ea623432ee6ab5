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
