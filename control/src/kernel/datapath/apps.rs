//! The maps of DASR and D3 on the loaded object: DASR's ingress program (verified the first
//! time it is asked for), its interfaces, addresses and counters; D3's per-class counters, a
//! router link's control and counters, the router's memory of flows, and the pinned map
//! applications declare their deadlines in.

use anyhow::{Context as _, Result, anyhow};
use aya::{
    maps::{HashMap, MapData},
    programs::SchedClassifier,
};
use paceline_common::{
    dasr::{DasrAddr, DasrIface, DasrStats},
    maps::{
        D3_SEEN_ENTRIES, D3ClassStats, D3LinkCounters, D3LinkCtl, D3Seen, FlowKey, MAX_CLASSES, SockState,
        names,
    },
};

use super::{Datapath, TC_INGRESS, prog, restrict_pin};

impl Datapath {
    /// Why DASR cannot run on this kernel (the verifier refused its program), if it cannot;
    /// loads the program the first time.
    pub fn dasr_unavailable(&mut self) -> Option<String> {
        self.ingress_program().err().map(|e| format!("{e:#}"))
    }

    /// DASR's ingress program, loaded the first time it is asked for. Where the verifier
    /// refuses it, DASR is unavailable on this kernel and the rest of the datapath runs on.
    pub fn ingress_program(&mut self) -> Result<&mut SchedClassifier> {
        if self.ingress_error.is_none() {
            let p: &mut SchedClassifier = prog(&mut self.ebpf, TC_INGRESS)?.try_into()?;
            let refused = match p.load() {
                Ok(()) => None,
                Err(e) => {
                    let why = format!("{:#}", anyhow::Error::from(e));
                    let first = why.lines().next().unwrap_or_default().to_string();
                    log::warn!(
                        "DASR unavailable on this kernel: the verifier refused {TC_INGRESS} ({first})"
                    );
                    Some(first)
                }
            };
            self.ingress_error = Some(refused);
        }
        if let Some(Some(e)) = &self.ingress_error {
            return Err(anyhow!(
                "DASR is unavailable on this kernel: the verifier refused {TC_INGRESS} ({e})"
            ));
        }
        Ok(prog(&mut self.ebpf, TC_INGRESS)?.try_into()?)
    }

    /// Serves interface `ifindex` with DASR (`cfg`: its line rate, epochs, roles).
    pub fn set_dasr_iface(&mut self, ifindex: u32, cfg: &DasrIface) -> Result<()> {
        Ok(self.dasr_ifaces.insert(ifindex, cfg, 0)?)
    }

    /// DASR's counting state of every local address it has seen (IPv4-mapped, network order).
    pub fn dasr_addrs(&self) -> Result<Vec<([u32; 4], DasrAddr)>> {
        self.dasr_addrs
            .iter()
            .map(|r| r.context("reading PL_DASR_ADDRS"))
            .collect()
    }

    /// DASR's counters, summed over CPUs.
    pub fn dasr_stats(&self) -> Result<DasrStats> {
        let mut s = DasrStats::default();
        for c in self
            .dasr_stats
            .get(&0, 0)
            .context("reading PL_DASR_STATS")?
            .iter()
        {
            s.add(c);
        }
        Ok(s)
    }

    /// The tc program's state of a local TCP socket (its class cache, flow clock and DASR
    /// share), if it has any.
    pub fn sock_state(&self, socket: &impl std::os::fd::AsRawFd) -> Option<SockState> {
        self.sock.get(socket, 0).ok()
    }

    /// D3 counters of every class, summed over CPUs.
    pub fn d3_snapshot(&self) -> Result<Vec<D3ClassStats>> {
        let mut out = vec![D3ClassStats::default(); MAX_CLASSES];
        for (i, slot) in out.iter_mut().enumerate() {
            for c in self
                .d3_stats
                .get(&(i as u32), 0)
                .context("reading PL_D3_STATS")?
                .iter()
            {
                slot.add(c);
            }
        }
        Ok(out)
    }

    /// Sets a router link's configuration and capacity.
    pub fn set_d3_link_ctl(&mut self, ifindex: u32, ctl: &D3LinkCtl) -> Result<()> {
        Ok(self.d3_link_ctl.insert(ifindex, ctl, 0)?)
    }

    pub fn d3_link_ctl(&self, ifindex: u32) -> Result<D3LinkCtl> {
        Ok(self.d3_link_ctl.get(&ifindex, 0)?)
    }

    /// A router link's counters (the datapath's side).
    pub fn d3_link_counters(&self, ifindex: u32) -> Result<D3LinkCounters> {
        Ok(self.d3_links.get(&ifindex, 0)?)
    }

    /// Writes a router link's counters (creation with zeroes; D, A, N zeroed at an idle reset).
    pub fn set_d3_link_counters(&mut self, ifindex: u32, c: &D3LinkCounters) -> Result<()> {
        Ok(self.d3_links.insert(ifindex, c, 0)?)
    }

    /// The D3 router's record of each flow's last request (`PL_D3_SEEN`). Entries evicted
    /// during the walk are skipped.
    pub fn d3_seen(&self) -> Result<Vec<D3Seen>> {
        let m = self
            .ebpf
            .map(names::D3_SEEN)
            .ok_or_else(|| anyhow!("map {} missing from the eBPF object", names::D3_SEEN))?;
        let h: HashMap<&MapData, FlowKey, D3Seen> = HashMap::try_from(m)?;
        Ok(h.iter()
            .take(D3_SEEN_ENTRIES as usize * 2 + 16)
            .flatten()
            .map(|(_, v)| v)
            .collect())
    }

    /// Pins the map applications write their sockets' sizes and deadlines into. Whoever can
    /// open the pin can claim deadlines, and with them a share of every D3 link: the pin is
    /// root's, mode 0600, or with `group` the group's too, mode 0660 (the other pins stay
    /// root's alone).
    pub fn pin_d3_app(&mut self, path: &std::path::Path, group: Option<u32>) -> Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let _ = std::fs::remove_file(path);
        self.d3_app
            .pin(path)
            .with_context(|| format!("pinning the D3 application map at {}", path.display()))?;
        restrict_pin(path, group).with_context(|| format!("setting the owner and mode of {}", path.display()))
    }
}
