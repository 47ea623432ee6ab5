//! The loaded eBPF object: programs, typed map handles, and the operations the agent and the
//! tests perform on them (write a policy table, in [`super::banks`]; read counters).

use std::os::fd::AsFd;
use std::sync::Arc;

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, ArrayOfMaps, HashMap, MapData, PerCpuArray, ProgramArray, RingBuf},
    programs::{SchedClassifier, SockOps},
};
use paceline_common::{
    dasr::{self, DasrAddr, DasrIface, DasrStats},
    maps::{
        AggClock, CodelState, Counters, CpuState, D3ClassStats, D3LinkCounters, D3LinkCtl,
        DEFAULT_FLOW_TABLE_SIZE, MAX_CLASSES, PolicyTable, SockState, names,
    },
    trace::TraceConfig,
};

use crate::kernel::bpfsys;

mod apps;
mod counters;
pub use counters::{FLOW_COUNT_EVERY, Snapshot};
use paceline_policy::ctab::Image;

/// The eBPF object built by `build.rs` (aya-build) from `datapath-ebpf`.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/paceline-ebpf"));

/// The datapath benchmark's own programs (`datapath-ebpf/src/bench.rs`: its floor, the clock,
/// Cilium's algorithm as the reference), built beside [`EBPF_OBJECT`] by the same aya-build
/// run. The agent never loads it; `plbench datapath` (`paceline-lab`) does.
pub static BENCH_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/paceline-ebpf-bench"));

/// Program names in the object.
pub const TC_EGRESS: &str = "pl_tc_egress";
pub const SOCK_OPS: &str = "pl_sock_ops";
/// The D3 router (tc egress of the router's links).
pub const D3_ROUTER: &str = "pl_d3_router";
/// DASR's tc ingress program (receiver: counts senders; sender: reads shares).
pub const TC_INGRESS: &str = "pl_tc_ingress";
/// The trace program the egress program tail-calls while `paceline trace` runs (verified when
/// the first trace starts).
pub const TC_TRACE: &str = "pl_tc_trace";

/// Options fixed when the object is loaded (changing them needs a restart).
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Entries of the per-flow LRU table.
    pub flow_table_size: u32,
    /// DASR's per-flow and per-address maps at their full size; false: one entry each, for an
    /// agent whose policy has no `spec.dasr` (turning DASR on needs a restart), which then
    /// does not hold their 7 MiB of kernel memory.
    pub dasr_maps: bool,
    /// Load the classifier in count-only mode (no pacing, no tagging): the benchmark's floor.
    pub count_only: bool,
    /// Benchmark only: treat any full socket as a TCP socket's (BPF_PROG_TEST_RUN's socket is
    /// a placeholder that is not TCP), so the per-socket fast path can be measured.
    pub bench_any_socket: bool,
    /// Benchmark only: 0, or how each BPF_PROG_TEST_RUN run makes a flow's first packet:
    /// `BENCH_FLOW_REPLACE` (the lookup taken for a miss, the entry replaced) or
    /// `BENCH_FLOW_NEW` (a new flow each run, evicting once the table is full).
    pub bench_flow_miss: u32,
    /// Benchmark only: load the egress program as if tracing were not built in (every trace
    /// branch and record store pruned by the verifier), to measure what tracing costs while
    /// off.
    pub bench_no_trace: bool,
    /// Benchmark only: 0, or a mark whose packets the egress program takes as unstamped
    /// whatever `skb->tstamp` holds (BPF_PROG_TEST_RUN's skb keeps the departure its previous
    /// run wrote, which a real UDP or forwarded packet does not carry).
    pub bench_unstamped_mark: u32,
    /// Benchmark only: the trace ring buffer's size in bytes (a power of two pages), for runs
    /// that record more packets than the default ring holds between two reads.
    pub trace_ring_bytes: Option<u32>,
    /// Pin every map here (`<dir>/maps/<NAME>`), reusing the maps already pinned there (the
    /// caller checks their layouts first: [`crate::kernel::persist::Pins::prepare`]).
    pub pins: Option<crate::kernel::persist::Pins>,
}

impl LoadOptions {
    /// The maps sized at load rather than as the object declares them, and their entries (what
    /// a pinned map's layout is checked against: `crate::kernel::persist::expected_layouts`).
    pub fn map_sizes(&self) -> Vec<(&'static str, u32)> {
        let mut sizes = vec![(names::FLOWS, self.flow_table_size)];
        if !self.dasr_maps {
            sizes.push((dasr::names::DASR_FLOWS, 1));
            sizes.push((dasr::names::DASR_ADDRS, 1));
        }
        sizes
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            flow_table_size: DEFAULT_FLOW_TABLE_SIZE,
            dasr_maps: true,
            count_only: false,
            bench_any_socket: false,
            bench_flow_miss: 0,
            bench_no_trace: false,
            bench_unstamped_mark: 0,
            trace_ring_bytes: None,
            pins: None,
        }
    }
}

pub struct Datapath {
    ebpf: Ebpf,
    pub(super) active: Array<MapData, u32>,
    pub(super) tables: Array<MapData, PolicyTable>,
    cpu: PerCpuArray<MapData, CpuState>,
    stats: PerCpuArray<MapData, Counters>,
    pub(super) ctab_words: ArrayOfMaps<MapData, MapData>,
    pub(super) ctab_sels: ArrayOfMaps<MapData, MapData>,
    pub(super) ctab_rules: ArrayOfMaps<MapData, MapData>,
    /// `PL_CTAB_FAST`: each bank's words again, where they fit (`ctab::CT_FAST`).
    pub(super) ctab_fast: MapData,
    /// What each bank's classifier maps hold, when this process wrote them: the next policy
    /// written into a bank rewrites only what differs.
    pub(super) banks: [Option<Bank>; 2],
    /// The grace period that began at the last flip of PL_ACTIVE, while it runs: programs may
    /// still be reading the bank that flip left, the bank the next policy is written into, so
    /// nothing writes there before it ends ([`Datapath::settle`]).
    pub(super) grace: Option<std::thread::JoinHandle<bool>>,
    clocks: Array<MapData, AggClock>,
    pub(super) codel: Array<MapData, CodelState>,
    /// Which level each class slot counts in (`PL_LEDGER`: [`crate::kernel::levels`]).
    ledger: MapData,
    /// The class slots given to another class, and the level slots (bit `l`) given to another
    /// level, since the last policy write ([`Datapath::reset_slot`]): the next write's
    /// [`crate::kernel::levels::write`] starts them from zero.
    pub(super) reassigned: Vec<bool>,
    pub(super) levels_reset: u32,
    flow_table_memlock: Option<u64>,
    /// The last count of the flow table's entries and when it was taken.
    flow_count: std::sync::Mutex<Option<(std::time::Instant, u64)>>,
    flow_capacity: u32,
    /// `None` until DASR's ingress program is first needed; then why it was refused, if it was.
    ingress_error: Option<Option<String>>,
    d3_stats: PerCpuArray<MapData, D3ClassStats>,
    d3_link_ctl: HashMap<MapData, u32, D3LinkCtl>,
    d3_links: HashMap<MapData, u32, D3LinkCounters>,
    /// Kept untyped: pinning needs the map, and the agent never reads it.
    d3_app: aya::maps::Map,
    dasr_ifaces: HashMap<MapData, u32, DasrIface>,
    dasr_addrs: HashMap<MapData, [u32; 4], DasrAddr>,
    dasr_stats: PerCpuArray<MapData, DasrStats>,
    sock: aya::maps::SkStorage<MapData, SockState>,
    /// The socket storage map's fd again (the typed map does not lend its own), for
    /// sock_diag's dump of every socket's value (`paceline flows`).
    sock_fd: std::os::fd::OwnedFd,
    trace_cfg: Array<MapData, TraceConfig>,
    /// The egress program's switch: its `.bss` (the global `PL_TRACE_ON`, nothing else).
    trace_on: Array<MapData, u32>,
    trace_prog: ProgramArray<MapData>,
    /// Until a trace session takes it ([`Datapath::take_trace_ring`]).
    trace_ring: Option<RingBuf<MapData>>,
    pub(super) generation: u64,
}

impl Datapath {
    /// Loads the object and its programs into the kernel (nothing is attached yet).
    pub fn load(opts: &LoadOptions) -> Result<Self> {
        let count_only: u32 = opts.count_only.into();
        let any_sock: u32 = opts.bench_any_socket.into();
        let flow_miss: u32 = opts.bench_flow_miss;
        let no_trace: u32 = opts.bench_no_trace.into();
        let unstamped: u32 = opts.bench_unstamped_mark;
        let netns = own_netns_cookie().context("reading this process's network namespace cookie")?;
        let mut loader = EbpfLoader::new();
        for (name, entries) in opts.map_sizes() {
            loader.map_max_entries(name, entries);
        }
        loader
            .override_global("PL_COUNT_ONLY", &count_only, true)
            .override_global("PL_ANY_SOCK", &any_sock, true)
            .override_global("PL_BENCH_FLOW_MISS", &flow_miss, true)
            .override_global("PL_BENCH_NO_TRACE", &no_trace, true)
            .override_global("PL_BENCH_UNSTAMPED_MARK", &unstamped, true)
            .override_global("PL_NETNS_COOKIE", &netns, true);
        if let Some(n) = opts.trace_ring_bytes {
            loader.map_max_entries(names::TRACE_RING, n);
        }
        let pinned: Vec<(String, std::path::PathBuf)> = match &opts.pins {
            Some(pins) => crate::kernel::persist::expected_layouts(EBPF_OBJECT, &opts.map_sizes())?
                .into_keys()
                .map(|name| {
                    let path = pins.map(&name);
                    (name, path)
                })
                .collect(),
            None => Vec::new(),
        };
        for (name, path) in &pinned {
            loader.map_pin_path(name.as_str(), path.as_path());
        }
        let mut ebpf = loader.load(EBPF_OBJECT).context(
            "loading the paceline eBPF object (is this a kernel with BPF and BTF, and are we root?)",
        )?;
        let tc: &mut SchedClassifier = prog(&mut ebpf, TC_EGRESS)?.try_into()?;
        tc.load().with_context(|| format!("verifying {TC_EGRESS}"))?;
        // The other programs are verified when first asked for (`sock_ops_program`,
        // `d3_router_program`, `ingress_program`): verification is most of a start's time
        // (under emulation on Linux 6.1, about 13 s for this one's 333,000 instructions and 8 s
        // for sock_ops' 286,000, 216,000 since it reads the words map alone), and an agent without a D3 router, sock_ops or DASR does not
        // pay for theirs. DASR's program is also the one a kernel may
        // refuse (one without `bpf_loop`, before 5.17, or whose verifier still balks at its TCP
        // option walk; 6.1, 6.12 and 6.18 load it: docs/dasr.md): there everything else runs on.
        let ingress_error = None;

        let active = Array::try_from(take(&mut ebpf, names::ACTIVE)?)?;
        let tables = Array::try_from(take(&mut ebpf, names::TABLES)?)?;
        let cpu = PerCpuArray::try_from(take(&mut ebpf, names::CPU)?)?;
        let stats = PerCpuArray::try_from(take(&mut ebpf, names::STATS)?)?;
        let ctab_words = ArrayOfMaps::try_from(take(&mut ebpf, names::CTAB_WORDS)?)?;
        let ctab_sels = ArrayOfMaps::try_from(take(&mut ebpf, names::CTAB_SELS)?)?;
        let ctab_rules = ArrayOfMaps::try_from(take(&mut ebpf, names::CTAB_RULES)?)?;
        let ctab_fast = match take(&mut ebpf, names::CTAB_FAST)? {
            aya::maps::Map::Array(m) => m,
            _ => anyhow::bail!("{} is not an array map", names::CTAB_FAST),
        };
        let clocks = Array::try_from(take(&mut ebpf, names::AGG_CLOCKS)?)?;
        let codel = Array::try_from(take(&mut ebpf, names::CODEL)?)?;
        let ledger = match take(&mut ebpf, names::LEDGER)? {
            aya::maps::Map::Array(m) => m,
            _ => anyhow::bail!("{} is not an array map", names::LEDGER),
        };
        // The flow table stays in the object: only the datapath reads and writes it.
        let flow_table_memlock = match ebpf.map(names::FLOWS) {
            Some(aya::maps::Map::LruHashMap(m)) => crate::kernel::memory::memlock_of(m.fd().as_fd()),
            Some(_) => None,
            None => return Err(anyhow!("map {} missing from the eBPF object", names::FLOWS)),
        };
        let d3_stats = PerCpuArray::try_from(take(&mut ebpf, names::D3_STATS)?)?;
        let d3_link_ctl = HashMap::try_from(take(&mut ebpf, names::D3_LINK_CTL)?)?;
        let d3_links = HashMap::try_from(take(&mut ebpf, names::D3_LINKS)?)?;
        let d3_app = take(&mut ebpf, names::D3_APP)?;
        let dasr_ifaces = HashMap::try_from(take(&mut ebpf, dasr::names::DASR_IFACES)?)?;
        let dasr_addrs = HashMap::try_from(take(&mut ebpf, dasr::names::DASR_ADDRS)?)?;
        let dasr_stats = PerCpuArray::try_from(take(&mut ebpf, dasr::names::DASR_STATS)?)?;
        let sock = take(&mut ebpf, names::SOCK)?;
        let sock_fd = match &sock {
            aya::maps::Map::SkStorage(m) => m
                .fd()
                .as_fd()
                .try_clone_to_owned()
                .context("duplicating the socket storage map's fd")?,
            _ => return Err(anyhow!("map {} is not socket storage", names::SOCK)),
        };
        let sock = aya::maps::SkStorage::try_from(sock)?;
        let mut trace_cfg = Array::try_from(take(&mut ebpf, names::TRACE_CFG)?)?;
        let mut trace_prog = ProgramArray::try_from(take(&mut ebpf, names::TRACE_PROG)?)?;
        // A trace the previous agent left on (killed mid-trace) ends here, and its trace
        // program (of another build, maybe) leaves the array: the next trace installs this
        // build's.
        trace_cfg
            .set(0, TraceConfig::default(), 0)
            .context("turning tracing off")?;
        match trace_prog.clear_index(&0) {
            Ok(()) => {}
            Err(aya::maps::MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e).context("emptying the trace program array"),
        }
        let trace_ring = Some(RingBuf::try_from(take(&mut ebpf, names::TRACE_RING)?)?);
        let trace_on = Array::try_from(take(&mut ebpf, ".bss")?)
            .context("the egress program's .bss (PL_TRACE_ON, one u32)")?;
        Ok(Datapath {
            trace_on,
            trace_cfg,
            trace_prog,
            trace_ring,
            dasr_ifaces,
            dasr_addrs,
            dasr_stats,
            sock,
            sock_fd,
            d3_stats,
            d3_link_ctl,
            d3_links,
            d3_app,
            ebpf,
            active,
            tables,
            cpu,
            stats,
            ctab_words,
            ctab_sels,
            ctab_rules,
            ctab_fast,
            banks: [None, None],
            grace: None,
            clocks,
            codel,
            ledger,
            reassigned: vec![false; MAX_CLASSES],
            levels_reset: 0,
            flow_table_memlock,
            flow_count: std::sync::Mutex::new(None),
            ingress_error,
            flow_capacity: opts.flow_table_size,
            generation: 0,
        })
        .map(|mut dp: Datapath| {
            // Adopted maps keep the policy a previous agent wrote: generations go on from it.
            dp.generation = dp.live_policy().map(|t| t.generation).unwrap_or(0);
            dp
        })
    }

    /// Instructions the verifier processed for each loaded program (5.16+; `None` before): how
    /// close each is to the verifier's limit of 1,000,000.
    pub fn verified_insns(&self) -> Vec<(&'static str, Option<u32>)> {
        [TC_EGRESS, SOCK_OPS, D3_ROUTER, TC_INGRESS, TC_TRACE]
            .into_iter()
            .map(|name| {
                let n = self
                    .ebpf
                    .program(name)
                    .and_then(|p| p.info().ok())
                    .and_then(|i| i.verified_instruction_count());
                (name, n)
            })
            .collect()
    }

    /// Starts recording what `cfg` asks for: verifies the trace program the first time, installs
    /// it for the egress program's tail call, then writes the configuration.
    pub fn start_trace(&mut self, cfg: &TraceConfig) -> Result<()> {
        let p = sched_loaded(&mut self.ebpf, TC_TRACE)?;
        let fd = p.fd().context("the trace program's fd")?;
        self.trace_prog
            .set(0, fd, 0)
            .context("installing the trace program")?;
        self.trace_cfg
            .set(0, *cfg, 0)
            .context("writing the trace configuration")?;
        self.trace_on
            .set(0, u32::from(cfg.flags != 0), 0)
            .context("turning tracing on")?;
        Ok(())
    }

    /// Stops recording (the egress program no longer calls the trace program).
    pub fn stop_trace(&mut self) -> Result<()> {
        self.trace_on.set(0, 0, 0).context("turning tracing off")?;
        self.trace_cfg
            .set(0, TraceConfig::default(), 0)
            .context("turning tracing off")
    }

    /// The trace configuration in force (`flags` 0: off).
    pub fn trace_config(&self) -> Result<TraceConfig> {
        Ok(self.trace_cfg.get(&0, 0)?)
    }

    /// The ring buffer the trace records arrive in, for the one reader; `None` once taken.
    pub fn take_trace_ring(&mut self) -> Option<RingBuf<MapData>> {
        self.trace_ring.take()
    }

    /// The records waiting in the ring buffer, if this handle still holds it (tests, the
    /// benchmark).
    pub fn drain_trace(&mut self) -> Vec<paceline_common::trace::TraceRecord> {
        let mut out = Vec::new();
        if let Some(r) = self.trace_ring.as_mut() {
            while let Some(item) = r.next() {
                if let Some(rec) = paceline_common::trace::TraceRecord::from_bytes(&item) {
                    out.push(rec);
                }
            }
        }
        out
    }

    /// Gives the ring buffer back after a trace session.
    pub fn return_trace_ring(&mut self, r: RingBuf<MapData>) {
        self.trace_ring = Some(r);
    }

    pub fn tc_program(&mut self) -> Result<&mut SchedClassifier> {
        Ok(prog(&mut self.ebpf, TC_EGRESS)?.try_into()?)
    }

    /// The D3 router program, verified the first time it is asked for.
    pub fn d3_router_program(&mut self) -> Result<&mut SchedClassifier> {
        sched_loaded(&mut self.ebpf, D3_ROUTER)
    }

    /// Empties every map the loaded programs use, as a fresh load has them: no policy (both
    /// tables zeroed), no clocks, counters, flows, D3 links or DASR state. Left as they are:
    /// the classifier's banks and fast words (no zeroed table refers to them; the next policy
    /// replaces them), the per-socket storages (they belong to sockets) and read-only data. For
    /// tests that share one load, where verifying the programs takes seconds under emulation; a
    /// datapath serving traffic keeps its clocks and counters.
    pub fn clear(&mut self) -> Result<()> {
        self.settle();
        let mut ids = std::collections::BTreeSet::new();
        for name in [TC_EGRESS, SOCK_OPS, D3_ROUTER, TC_INGRESS, TC_TRACE] {
            let Some(Ok(info)) = self.ebpf.program(name).map(|p| p.info()) else {
                continue; // not loaded
            };
            ids.extend(info.map_ids()?.unwrap_or_default());
        }
        for id in ids {
            let info = aya::maps::MapInfo::from_id(id)?;
            if info.map_flags() & bpfsys::BPF_F_RDONLY_PROG != 0 {
                continue;
            }
            // The fast words are read only under a policy that says they are there, and the
            // banks are forgotten below (the next policy writes them whole): a million entries
            // cleared one syscall each took seconds under emulation.
            if info.name_as_str() == Some(names::CTAB_FAST) {
                continue;
            }
            let shape = bpfsys::MapShape {
                map_type: info.map_type()? as u32,
                key_size: info.key_size(),
                value_size: info.value_size(),
                max_entries: info.max_entries(),
            };
            let fd = info.fd()?;
            bpfsys::clear(fd.as_fd(), &shape)
                .with_context(|| format!("clearing map {}", info.name_as_str().unwrap_or("?")))?;
        }
        // The ledger: no program uses its map.
        self.write_ledger(&crate::kernel::levels::empty())?;
        self.reassigned = vec![false; MAX_CLASSES];
        self.levels_reset = 0;
        self.generation = 0;
        // What the banks hold is no longer what this process wrote (`PL_CTAB_FAST` is empty):
        // the next policies are written whole.
        self.banks = [None, None];
        *self.flow_count.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Ok(())
    }

    /// Verifies every program not yet loaded (the tests that check the verifier's cost of
    /// each). DASR's counts as loaded where the verifier refused it: see `dasr_unavailable`.
    pub fn load_all(&mut self) -> Result<()> {
        self.sock_ops_program()?;
        self.d3_router_program()?;
        sched_loaded(&mut self.ebpf, TC_TRACE)?;
        let _ = self.ingress_program();
        Ok(())
    }

    /// The sock_ops program, verified the first time it is asked for.
    pub fn sock_ops_program(&mut self) -> Result<&mut SockOps> {
        let p: &mut SockOps = prog(&mut self.ebpf, SOCK_OPS)?.try_into()?;
        if p.fd().is_err() {
            p.load().with_context(|| format!("verifying {SOCK_OPS}"))?;
        }
        Ok(p)
    }

    /// The table the datapath currently uses.
    pub fn live_policy(&self) -> Result<PolicyTable> {
        let live = self.active.get(&0, 0)? & 1;
        Ok(self.tables.get(&live, 0)?)
    }

    /// The kernel's id of a loaded program (the health check looks for it in the interfaces'
    /// and the cgroup's attachments).
    pub fn program_id(&self, name: &str) -> Option<u32> {
        self.ebpf
            .program(name)
            .and_then(|p| p.info().ok())
            .map(|i| i.id())
    }

    /// The socket storage map (every local TCP socket's class, clock and binding), for a
    /// sock_diag dump.
    pub fn sock_storage_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.sock_fd.as_fd()
    }

    /// The generation of the last policy written (the live table holds it).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Kernel memory charged to the flow table, from `/proc/self/fdinfo` (bytes).
    pub fn flow_table_memlock(&self) -> Option<u64> {
        self.flow_table_memlock
    }
}

/// One of a bank's classifier maps, as this process wrote it.
pub(super) struct BankMap {
    pub(super) data: MapData,
    /// The kernel's id of the map (to tell whether a bank still holds it).
    pub(super) id: u32,
    /// Its `max_entries`.
    pub(super) capacity: usize,
}

impl BankMap {
    pub(super) fn new(fd: std::os::fd::OwnedFd, capacity: usize) -> Result<Self> {
        let data = MapData::from_fd(fd)?;
        let id = data.info()?.id();
        Ok(BankMap { data, id, capacity })
    }

    pub(super) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.data.fd().as_fd()
    }
}

/// A bank's classifier maps (words, selectors, rules) and the image they hold.
pub(super) struct Bank {
    pub(super) image: Arc<Image>,
    pub(super) maps: [BankMap; 3],
    /// The bank's part of `PL_CTAB_FAST` holds the image's words (and NONE after them).
    pub(super) fast: bool,
}

fn prog<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::programs::Program> {
    ebpf.program_mut(name)
        .ok_or_else(|| anyhow!("program {name} missing from the eBPF object"))
}

/// Classifier program `name`, verified if this is the first time it is asked for.
fn sched_loaded<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut SchedClassifier> {
    let p: &mut SchedClassifier = prog(ebpf, name)?.try_into()?;
    if p.fd().is_err() {
        p.load().with_context(|| format!("verifying {name}"))?;
    }
    Ok(p)
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

/// Makes `path` root's (and `group`'s, when given) alone.
pub fn restrict_pin(path: &std::path::Path, group: Option<u32>) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let gid = group.map(nix::unistd::Gid::from_raw);
    nix::unistd::chown(
        path,
        Some(nix::unistd::Uid::from_raw(0)),
        gid.or(Some(nix::unistd::Gid::from_raw(0))),
    )?;
    let mode = if group.is_some() { 0o660 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    if let Some(g) = group {
        // The group must also reach the pin: systemd mounts /sys/fs/bpf mode 0700.
        use std::os::unix::fs::MetadataExt as _;
        for dir in path.ancestors().skip(1) {
            let Ok(m) = std::fs::metadata(dir) else { continue };
            let mode = m.mode();
            let searchable = mode & 0o001 != 0 || (m.gid() == g && mode & 0o010 != 0);
            if !searchable {
                log::warn!(
                    "members of group {g} cannot reach {}: {} is mode {:o}; let them through with \
                     `chmod o+x {}` (search only, no listing)",
                    path.display(),
                    dir.display(),
                    mode & 0o7777,
                    dir.display()
                );
            }
        }
    }
    Ok(())
}
