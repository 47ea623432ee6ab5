//! The loaded eBPF object: programs, typed map handles, and the operations the agent and the
//! tests perform on them (write a policy table, read counters).

use std::os::fd::AsFd;

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, PerCpuArray},
    programs::{SchedClassifier, SockOps},
};
use paceline_common::maps::{
    AggClock, Counters, CpuState, D3ClassStats, D3LinkCounters, D3LinkCtl, DEFAULT_FLOW_TABLE_SIZE,
    GlobalCounters, MAX_CLASSES, MAX_LEVELS, PolicyTable, names,
};

/// The eBPF object built by `build.rs` (aya-build) from `datapath-ebpf`.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/paceline"));

/// Program names in the object.
pub const TC_EGRESS: &str = "pl_tc_egress";
pub const SOCK_OPS: &str = "pl_sock_ops";
/// The D3 router (tc egress of the router's links).
pub const D3_ROUTER: &str = "pl_d3_router";
/// An empty classifier, loaded only by the benchmark as its floor.
pub const TC_FLOOR: &str = "pl_tc_floor";
/// A classifier that only reads the clock: what `bpf_ktime_get_ns` costs (benchmark only).
pub const TC_CLOCK: &str = "pl_tc_clock";

/// Options fixed when the object is loaded (changing them needs a restart).
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Entries of the per-flow LRU table.
    pub flow_table_size: u32,
    /// Load the classifier in count-only mode (no pacing, no tagging): the benchmark's floor.
    pub count_only: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            flow_table_size: DEFAULT_FLOW_TABLE_SIZE,
            count_only: false,
        }
    }
}

/// Summed (over CPUs) counters of every class and level.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub classes: Vec<Counters>,
    pub levels: Vec<Counters>,
    pub global: GlobalCounters,
}

pub struct Datapath {
    ebpf: Ebpf,
    active: Array<MapData, u32>,
    tables: Array<MapData, PolicyTable>,
    cpu: PerCpuArray<MapData, CpuState>,
    clocks: Array<MapData, AggClock>,
    flow_table_memlock: Option<u64>,
    d3_stats: PerCpuArray<MapData, D3ClassStats>,
    d3_link_ctl: HashMap<MapData, u32, D3LinkCtl>,
    d3_links: HashMap<MapData, u32, D3LinkCounters>,
    /// Kept untyped: pinning needs the map, and the agent never reads it.
    d3_app: aya::maps::Map,
    generation: u64,
}

impl Datapath {
    /// Loads the object and its programs into the kernel (nothing is attached yet).
    pub fn load(opts: &LoadOptions) -> Result<Self> {
        let count_only: u32 = opts.count_only.into();
        let netns = own_netns_cookie().context("reading this process's network namespace cookie")?;
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(names::FLOWS, opts.flow_table_size)
            .override_global("PL_COUNT_ONLY", &count_only, true)
            .override_global("PL_NETNS_COOKIE", &netns, true)
            .load(EBPF_OBJECT)
            .context(
                "loading the paceline eBPF object (is this a kernel with BPF and BTF, and are we root?)",
            )?;
        let tc: &mut SchedClassifier = prog(&mut ebpf, TC_EGRESS)?.try_into()?;
        tc.load().with_context(|| format!("verifying {TC_EGRESS}"))?;
        let so: &mut SockOps = prog(&mut ebpf, SOCK_OPS)?.try_into()?;
        so.load().with_context(|| format!("verifying {SOCK_OPS}"))?;
        let router: &mut SchedClassifier = prog(&mut ebpf, D3_ROUTER)?.try_into()?;
        router.load().with_context(|| format!("verifying {D3_ROUTER}"))?;

        let active = Array::try_from(take(&mut ebpf, names::ACTIVE)?)?;
        let tables = Array::try_from(take(&mut ebpf, names::TABLES)?)?;
        let cpu = PerCpuArray::try_from(take(&mut ebpf, names::CPU)?)?;
        let clocks = Array::try_from(take(&mut ebpf, names::AGG_CLOCKS)?)?;
        // The flow table stays in the object: only the datapath reads and writes it.
        let flow_table_memlock = match ebpf.map(names::FLOWS) {
            Some(aya::maps::Map::LruHashMap(m)) => memlock_of(m.fd().as_fd()),
            Some(_) => None,
            None => return Err(anyhow!("map {} missing from the eBPF object", names::FLOWS)),
        };
        let d3_stats = PerCpuArray::try_from(take(&mut ebpf, names::D3_STATS)?)?;
        let d3_link_ctl = HashMap::try_from(take(&mut ebpf, names::D3_LINK_CTL)?)?;
        let d3_links = HashMap::try_from(take(&mut ebpf, names::D3_LINKS)?)?;
        let d3_app = take(&mut ebpf, names::D3_APP)?;
        Ok(Datapath {
            d3_stats,
            d3_link_ctl,
            d3_links,
            d3_app,
            ebpf,
            active,
            tables,
            cpu,
            clocks,
            flow_table_memlock,
            generation: 0,
        })
    }

    pub fn tc_program(&mut self) -> Result<&mut SchedClassifier> {
        Ok(prog(&mut self.ebpf, TC_EGRESS)?.try_into()?)
    }

    /// The D3 router program.
    pub fn d3_router_program(&mut self) -> Result<&mut SchedClassifier> {
        Ok(prog(&mut self.ebpf, D3_ROUTER)?.try_into()?)
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

    /// Pins the map applications write their sockets' sizes and deadlines into.
    pub fn pin_d3_app(&mut self, path: &std::path::Path) -> Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let _ = std::fs::remove_file(path);
        self.d3_app
            .pin(path)
            .with_context(|| format!("pinning the D3 application map at {}", path.display()))?;
        Ok(())
    }

    /// A benchmark-only classifier ([`TC_FLOOR`], [`TC_CLOCK`]), loaded on first use.
    pub fn bench_program(&mut self, name: &str) -> Result<&mut SchedClassifier> {
        let p: &mut SchedClassifier = prog(&mut self.ebpf, name)?.try_into()?;
        if p.fd().is_err() {
            p.load()?;
        }
        Ok(p)
    }

    pub fn sock_ops_program(&mut self) -> Result<&mut SockOps> {
        Ok(prog(&mut self.ebpf, SOCK_OPS)?.try_into()?)
    }

    /// Writes `table` into the slot that is not live, then makes it live. Packets in flight see
    /// the old or the new table, never a mix; flow and aggregate clocks are untouched.
    pub fn write_policy(&mut self, table: &PolicyTable) -> Result<u64> {
        let live = self.active.get(&0, 0).context("reading PL_ACTIVE")? & 1;
        let next = live ^ 1;
        self.generation += 1;
        let mut t = *table;
        t.generation = self.generation;
        self.tables.set(next, t, 0).context("writing PL_TABLES")?;
        self.active.set(0, next, 0).context("flipping PL_ACTIVE")?;
        Ok(self.generation)
    }

    /// The table the datapath currently uses.
    pub fn live_policy(&self) -> Result<PolicyTable> {
        let live = self.active.get(&0, 0)? & 1;
        Ok(self.tables.get(&live, 0)?)
    }

    /// Counters of every class and level, summed over CPUs.
    pub fn snapshot(&self) -> Result<Snapshot> {
        let mut s = Snapshot {
            classes: vec![Counters::default(); MAX_CLASSES],
            levels: vec![Counters::default(); MAX_LEVELS],
            global: GlobalCounters::default(),
        };
        for cpu in self.cpu.get(&0, 0).context("reading PL_CPU")?.iter() {
            for (slot, c) in cpu.stats.iter().enumerate() {
                if slot < MAX_CLASSES {
                    s.classes[slot].add(c);
                } else {
                    s.levels[slot - MAX_CLASSES].add(c);
                }
            }
            s.global.add(&cpu.global);
        }
        Ok(s)
    }

    /// Zeroes a class or level slot's counters and aggregate clock (the slot now names another
    /// class or level).
    pub fn reset_slot(&mut self, class: u32) -> Result<()> {
        // Racy against packets counting on other CPUs at this instant; only used when a slot
        // changes hands at a reload, when its new class has not seen traffic yet.
        let mut per_cpu: Vec<CpuState> = self
            .cpu
            .get(&0, 0)
            .context("reading PL_CPU")?
            .iter()
            .copied()
            .collect();
        for cpu in per_cpu.iter_mut() {
            if let Some(c) = cpu.stats.get_mut(class as usize) {
                *c = Counters::default();
            }
        }
        let values = aya::maps::PerCpuValues::try_from(per_cpu)?;
        self.cpu
            .set(0, values, 0)
            .context("zeroing a class slot in PL_CPU")?;
        self.clocks
            .set(class, AggClock::default(), 0)
            .context("zeroing PL_AGG_CLOCKS")?;
        Ok(())
    }

    /// An aggregate clock's value (tests and diagnostics).
    pub fn agg_clock(&self, slot: u32) -> Result<u64> {
        Ok(self.clocks.get(&slot, 0)?.t_next)
    }

    /// Kernel memory charged to the flow table, from `/proc/self/fdinfo` (bytes).
    pub fn flow_table_memlock(&self) -> Option<u64> {
        self.flow_table_memlock
    }
}

fn prog<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::programs::Program> {
    ebpf.program_mut(name)
        .ok_or_else(|| anyhow!("program {name} missing from the eBPF object"))
}

fn take(ebpf: &mut Ebpf, name: &str) -> Result<aya::maps::Map> {
    ebpf.take_map(name)
        .ok_or_else(|| anyhow!("map {name} missing from the eBPF object"))
}

/// The cookie of the calling thread's network namespace (SO_NETNS_COOKIE, Linux 5.14+): what
/// `bpf_get_netns_cookie` returns for sockets of the same namespace.
pub fn own_netns_cookie() -> Result<u64> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: plain socket(2); the fd is owned and closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: fd was just created and is not shared.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: valid fd, pointer and length for an 8-byte option.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(cookie)
}

fn memlock_of(fd: std::os::fd::BorrowedFd<'_>) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("memlock:"))
        .and_then(|v| v.trim().parse().ok())
}
