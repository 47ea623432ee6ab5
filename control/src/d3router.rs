//! The D3 router side of the agent: configures each router link of the policy, owns each
//! link's capacity C, and runs the soft-state capacity controller every interval T: it reads
//! the link's counters from the datapath and its queue over netlink, steps the controller
//! (`paceline_common::d3::control_step`: under-use raises C, a standing queue lowers it, and
//! when no request arrives for a while the counters reset, so what dead hosts leaked washes
//! out) and writes C and any reset back to the maps. The controller itself, with its tests, is
//! `paceline_common::d3` (`common/src/d3/controller.rs`).

use anyhow::{Context as _, Result};
use paceline_common::{
    d3::{
        D3LinkConfig, D3LinkState, LEASE_RENEW_NS, LeaseTotals, StandingQueue, TICK_RESET, agent_link_config,
        control_step, renew_leases,
    },
    maps::{D3_SEEN_ENTRIES, D3LinkCounters, D3LinkCtl},
};
use serde::{Deserialize, Serialize};

use crate::kernel::{datapath::Datapath, qstats::QdiscStats};
use paceline_policy::validate::D3Link;

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
    /// Lease renewals that changed N, D or A (a flow stopped asking without a FIN, or
    /// concurrent updates drifted).
    pub lease_renewals: u64,
    /// The last queue sample, and the filter that gives the standing queue the controller used.
    pub last_queue: u64,
    queue: StandingQueue,
}

/// A link's figures, for metrics and for status (`/status` carries them as they are, and
/// `paceline status` reads them back).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    pub short_grants: u64,
    pub duplicates: u64,
    pub sent_bytes: u64,
    pub idle_resets: u64,
    pub lease_renewals: u64,
    pub queue_bytes: u64,
    pub standing_queue_bytes: u64,
}

pub struct Router {
    pub links: Vec<Link>,
    pub interval_ns: u64,
    /// When the leases were last renewed (CLOCK_MONOTONIC ns).
    last_lease_ns: u64,
    /// The flow record was too full to renew from (warned once).
    record_full_warned: bool,
    qstats: Option<QdiscStats>,
}

/// The datapath configuration of a policy's router link: the agent's defaults
/// ([`agent_link_config`]) with the policy's base rate, flow cap and controller.
fn link_config(l: &D3Link, interval_ns: u64) -> D3LinkConfig {
    let mut cfg = agent_link_config(l.capacity, l.base_rate, l.flow_cap, interval_ns);
    cfg.capacity_mode = l.capacity_mode;
    cfg
}

impl Router {
    /// Configures the links in the datapath (C = the line rate, zero counters). Attaching the
    /// program is the caller's (it records attachments for cleanup).
    pub fn new(dp: &mut Datapath, links: &[D3Link], interval_ns: u64) -> Result<Router> {
        let mut out = Vec::new();
        for l in links {
            let ifindex = nix::net::if_::if_nametoindex(l.interface.as_str())
                .with_context(|| format!("D3 router link {}: no such interface", l.interface))?;
            let cfg = link_config(l, interval_ns);
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
                lease_renewals: 0,
                last_queue: 0,
                queue: StandingQueue::new(l.capacity, interval_ns),
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
            last_lease_ns: crate::flows::monotonic_ns(),
            record_full_warned: false,
            qstats,
        })
    }

    /// Every [`LEASE_RENEW_NS`]: what the flows heard from within their lease hold at each link, from
    /// the router's record of each flow's last request; `None` when it is not time, or when
    /// the record may have forgotten live flows (it holds nearly [`D3_SEEN_ENTRIES`]).
    fn lease_totals(&mut self, dp: &Datapath) -> Result<Option<Vec<LeaseTotals>>> {
        let now = crate::flows::monotonic_ns();
        if now.saturating_sub(self.last_lease_ns) < LEASE_RENEW_NS {
            return Ok(None);
        }
        self.last_lease_ns = now;
        let records = dp.d3_seen()?;
        if records.len() as u64 * 10 >= D3_SEEN_ENTRIES as u64 * 9 {
            if !self.record_full_warned {
                self.record_full_warned = true;
                log::warn!(
                    "D3 router: {} flows recorded, near the record's {} entries: leases are not \
                     renewed (allocations of flows that end without a FIN are released only by \
                     the idle reset)",
                    records.len(),
                    D3_SEEN_ENTRIES
                );
            }
            return Ok(None);
        }
        let now = crate::flows::monotonic_ns();
        Ok(Some(
            self.links
                .iter()
                .map(|l| {
                    let mut t = LeaseTotals::default();
                    for r in records.iter().filter(|r| r.ifindex == l.ifindex) {
                        t.add(&l.cfg, &r.rewritten, r.at, now);
                    }
                    t
                })
                .collect(),
        ))
    }

    /// One controller interval for every link.
    pub fn tick(&mut self, dp: &mut Datapath) -> Result<()> {
        let leases = self.lease_totals(dp)?;
        for (i, l) in self.links.iter_mut().enumerate() {
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
            let out = control_step(&mut l.state, &l.cfg, &mut l.queue, sent, q, self.interval_ns);
            if q > 0 || l.state.flows > 0 {
                log::trace!(
                    "D3 {}: C {} -> {} B/s, D {}, A {}, N {}, sent {} B, queue {} B (standing {} B)",
                    l.name,
                    before,
                    l.state.capacity,
                    l.state.demand,
                    l.state.allocated,
                    l.state.flows,
                    sent,
                    q,
                    l.queue.value()
                );
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
            } else if let Some(live) = leases.as_ref().and_then(|v| v.get(i)) {
                // Read again right before the write: the datapath's concurrent additions
                // between the two are lost (fewer than one request's worth, microseconds), and
                // the next renewal recomputes N, D and A from the flows' records anyway.
                let mut c = dp.d3_link_counters(l.ifindex)?;
                let mut st = l.state;
                st.flows = D3LinkCounters::clamp(c.flows);
                st.demand = D3LinkCounters::clamp(c.demand);
                st.allocated = D3LinkCounters::clamp(c.allocated);
                if renew_leases(&mut st, live) {
                    log::debug!(
                        "D3 {}: leases renewed: N {} -> {}, D {} -> {}, A {} -> {}",
                        l.name,
                        c.flows,
                        st.flows,
                        c.demand,
                        st.demand,
                        c.allocated,
                        st.allocated
                    );
                    c.flows = st.flows;
                    c.demand = st.demand;
                    c.allocated = st.allocated;
                    dp.set_d3_link_counters(l.ifindex, &c)?;
                    l.state = st;
                    l.lease_renewals += 1;
                }
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
                    short_grants: c.short,
                    duplicates: c.duplicates,
                    sent_bytes: c.sent_bytes,
                    idle_resets: l.resets,
                    lease_renewals: l.lease_renewals,
                    queue_bytes: l.last_queue,
                    standing_queue_bytes: l.queue.value(),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use paceline_common::d3::{CAP_MODE_LINE, CAP_MODE_PAPER};

    use super::*;

    #[test]
    fn a_links_config_carries_the_policys_rates_and_controller() {
        let mut l = D3Link {
            interface: "eth1".into(),
            capacity: 125_000_000,
            base_rate: 1_000,
            flow_cap: 50_000_000,
            capacity_mode: CAP_MODE_PAPER,
        };
        let cfg = link_config(&l, 1_000_000);
        assert_eq!(
            (
                cfg.line_rate,
                cfg.capacity_max,
                cfg.base_rate,
                cfg.flow_cap,
                cfg.capacity_mode
            ),
            (125_000_000, 125_000_000, 1_000, 50_000_000, CAP_MODE_PAPER)
        );
        l.capacity_mode = CAP_MODE_LINE;
        assert_eq!(link_config(&l, 1_000_000).capacity_mode, CAP_MODE_LINE);
    }
}
