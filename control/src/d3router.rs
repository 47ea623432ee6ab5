//! The D3 router side of the agent: attaches `pl_d3_router` to the egress of each router link
//! of the policy, owns each link's capacity C, and runs the soft-state capacity controller
//! every interval T (`paceline_common::d3::capacity_tick`): under-use raises C, a queue lowers
//! it, and when no request arrives for a few intervals the counters reset (what dead hosts
//! leaked washes out).

use anyhow::{Context as _, Result};
use paceline_common::{
    d3::{self, D3LinkConfig, D3LinkState, TICK_RESET},
    maps::{D3LinkCounters, D3LinkCtl},
};
use serde::Serialize;

use crate::{datapath::Datapath, policy::validate::D3Link, qstats::QdiscStats};

/// The controller lowers C by at most 1/5 per interval.
pub const MAX_DECREASE_DEN: u64 = 5;

/// Quiet time after which a link's counters reset.
pub const IDLE_RESET_NS: u64 = 100_000_000;

/// One router link as the agent tracks it.
pub struct Link {
    pub name: String,
    pub ifindex: u32,
    pub cfg: D3LinkConfig,
    /// The controller's view of C, D, A, N between ticks.
    state: D3LinkState,
    last_sent: u64,
    last_requests: u64,
    pub resets: u64,
    pub last_queue: u64,
}

/// A link's figures for metrics and status.
#[derive(Clone, Debug, Serialize)]
pub struct LinkReport {
    pub interface: String,
    pub capacity_bytes_per_second: u64,
    pub line_rate_bytes_per_second: u64,
    pub flows: u64,
    pub demand_bytes_per_second: u64,
    pub allocated_bytes_per_second: u64,
    pub requests: u64,
    pub fins: u64,
    pub new_flows: u64,
    pub clamped: u64,
    pub unprocessed: u64,
    pub base_floor: u64,
    pub duplicates: u64,
    pub sent_bytes: u64,
    pub idle_resets: u64,
    pub queue_bytes: u64,
}

pub struct Router {
    pub links: Vec<Link>,
    pub interval_ns: u64,
    qstats: Option<QdiscStats>,
}

impl Router {
    /// Configures the links in the datapath (C = the line rate, zero counters). Attaching the
    /// program is the caller's (it records attachments for cleanup).
    pub fn new(dp: &mut Datapath, links: &[D3Link], interval_ns: u64) -> Result<Router> {
        let mut out = Vec::new();
        for l in links {
            let ifindex = nix::net::if_::if_nametoindex(l.interface.as_str())
                .with_context(|| format!("D3 router link {}: no such interface", l.interface))?;
            let mut cfg = D3LinkConfig::for_line_rate(l.capacity);
            cfg.base_rate = l.base_rate;
            cfg.flow_cap = l.flow_cap;
            // No overbooking: the controller may lower C under a queue and raise it back,
            // but not above the link. Above it, an idle link's first flow is granted more
            // than the link (measured: 13.7 MB/s on 12.5 MB/s) and the next ones wait.
            cfg.capacity_max = l.capacity;
            // "Idle" means no request for about 100 ms: a flow paced at the base rate sends
            // a request only every ~10-20 ms (one per segment-carrying RTT), and resetting
            // under live flows forgets their allocations.
            cfg.idle_reset_intervals = (IDLE_RESET_NS / interval_ns.max(1)).clamp(4, u32::MAX as u64) as u32;
            let state = D3LinkState::new(&cfg);
            dp.set_d3_link_ctl(
                ifindex,
                &D3LinkCtl {
                    cfg,
                    capacity: state.capacity,
                },
            )?;
            dp.set_d3_link_counters(ifindex, &D3LinkCounters::default())?;
            out.push(Link {
                name: l.interface.clone(),
                ifindex,
                cfg,
                state,
                last_sent: 0,
                last_requests: 0,
                resets: 0,
                last_queue: 0,
            });
        }
        let qstats = match QdiscStats::new() {
            Ok(q) => Some(q),
            Err(e) => {
                log::warn!("D3 router: cannot read queue lengths ({e:#}); the controller runs without q");
                None
            }
        };
        Ok(Router {
            links: out,
            interval_ns,
            qstats,
        })
    }

    /// One controller interval for every link.
    pub fn tick(&mut self, dp: &mut Datapath) -> Result<()> {
        for l in &mut self.links {
            let c = dp.d3_link_counters(l.ifindex)?;
            let sent = c.sent_bytes.wrapping_sub(l.last_sent);
            l.last_sent = c.sent_bytes;
            l.state.requests = c.requests.wrapping_sub(l.last_requests);
            l.last_requests = c.requests;
            l.state.demand = D3LinkCounters::clamp(c.demand);
            l.state.allocated = D3LinkCounters::clamp(c.allocated);
            l.state.flows = D3LinkCounters::clamp(c.flows);
            let q = match &mut self.qstats {
                Some(s) => s.root_backlog(l.ifindex).unwrap_or(0),
                None => 0,
            };
            l.last_queue = q;
            let before = l.state.capacity;
            let out = d3::capacity_tick(&mut l.state, &l.cfg, sent, q, self.interval_ns);
            // beta * q / T with beta = 1 removes the whole queue's worth of rate in one
            // interval: on a 100 Mbit/s link a 30 KB queue took C from the line rate to its
            // floor in one 1 ms tick and every grant went to 0. A queue lowers C by at most
            // MAX_DECREASE of it per interval instead (the paper's constants suit 1 Gbit/s).
            let floor = before - before / MAX_DECREASE_DEN;
            if out & TICK_RESET == 0 && l.state.capacity < floor {
                l.state.capacity = floor.max(l.cfg.capacity_min);
            }
            dp.set_d3_link_ctl(
                l.ifindex,
                &D3LinkCtl {
                    cfg: l.cfg,
                    capacity: l.state.capacity,
                },
            )?;
            if out & TICK_RESET != 0 {
                // No request for a while: nothing adds concurrently, so zeroing is safe.
                let mut z = c;
                z.demand = 0;
                z.allocated = 0;
                z.flows = 0;
                dp.set_d3_link_counters(l.ifindex, &z)?;
                l.resets += 1;
            }
        }
        Ok(())
    }

    pub fn report(&self, dp: &Datapath) -> Vec<LinkReport> {
        self.links
            .iter()
            .filter_map(|l| {
                let c = dp.d3_link_counters(l.ifindex).ok()?;
                let ctl = dp.d3_link_ctl(l.ifindex).ok()?;
                Some(LinkReport {
                    interface: l.name.clone(),
                    capacity_bytes_per_second: ctl.capacity,
                    line_rate_bytes_per_second: l.cfg.line_rate,
                    flows: D3LinkCounters::clamp(c.flows),
                    demand_bytes_per_second: D3LinkCounters::clamp(c.demand),
                    allocated_bytes_per_second: D3LinkCounters::clamp(c.allocated),
                    requests: c.requests,
                    fins: c.fins,
                    new_flows: c.news,
                    clamped: c.clamped,
                    unprocessed: c.unprocessed,
                    base_floor: c.base_floor,
                    duplicates: c.duplicates,
                    sent_bytes: c.sent_bytes,
                    idle_resets: l.resets,
                    queue_bytes: l.last_queue,
                })
            })
            .collect()
    }
}
