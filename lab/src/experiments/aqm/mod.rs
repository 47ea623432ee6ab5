//! The AQM benchmark: a class paced at R with 8 TCP flows offered to it, its queue the
//! EDT departure queue fq holds, with only the horizon against it (the default) or with CoDel
//! and ECN (`codel: {target, interval, ecn: true}`); for TCP cubic with ECN, cubic without
//! and DCTCP. Throughput against R, the delay pacing added (p50 and p99 from the class's delay
//! histogram, and the mean), drops (horizon, CoDel), CE marks and retransmissions.
//!
//! # Setup
//! Two namespaces on a veth pair; the sender runs the agent with `enforcement: fq` and a class
//! `paced` (`class_rate` [`Config::rate_bps`]) for the receiver's port; the receiver runs one
//! `plload serve`. Per (queue, congestion control): both ends' `tcp_congestion_control` and
//! `tcp_ecn` set (the server restarted after), the policy switched, [`Config::flows`] bulk flows for
//! [`Config::warmup_s`] + [`Config::duration_s`], measured over the last `duration_s` from
//! the agent's counters and `/metrics`. Needs sch_fq (the VM): the horizon and CoDel act on the
//! departures fq holds.
//!
//! # Aims, reported, not asserted
//! With CoDel and ECN: no drops, throughput at least 95% of R, p99 added delay within target
//! plus one interval.
//!
//! # Outputs (in `--out`)
//! `aqm.json` (config, environment, one entry per point with the histogram deltas) and
//! `aqm.md`.

mod plan;
mod policy;
mod report;
mod run;

pub use plan::*;
use policy::*;
pub use report::*;
pub use run::*;
