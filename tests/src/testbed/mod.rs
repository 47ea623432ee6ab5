//! The network-namespace testbed: hosts are namespaces, links are veth pairs with addresses,
//! an optional router namespace forwards between them, bottlenecks are HTB/TBF qdiscs on a link
//! egress, and every namespace, veth, qdisc and cgroup it creates is removed again when the
//! [`Testbed`] is dropped (also during a panic). Needs root; see [`skip_if_unprivileged`].
//!
//! ```no_run
//! use paceline_tests::testbed::{BottleneckSpec, StarSpec, Testbed};
//! # fn main() -> anyhow::Result<()> {
//! let tb = Testbed::new("pacing_basic")?;
//! let star = tb.add_star(&StarSpec {
//!     senders: 2,
//!     bottleneck: Some(BottleneckSpec::htb(20_000_000, 100_000)),
//!     ..Default::default()
//! })?;
//! star.senders[0].ping_ok(star.receiver.ipv4().into(), 3)?; // raw-socket ICMP, no ping binary
//! star.senders[0].run(&["ip", "route"])?; // runs inside s0's namespace
//! let server = star.receiver.spawn(&["sleep", "10"])?; // killed when `server` drops
//! println!("{:?}", star.bottleneck.as_ref().unwrap().stats()?);
//! # drop(server); Ok(()) }
//! ```
//!
//! # Layout
//! - `mod.rs`: [`Testbed`] (prefix allocation with a lock file, hosts, routers, links, routes,
//!   cgroups, teardown and the cleanup of leftovers from crashed runs), [`TestbedOpts`],
//!   [`skip_if_unprivileged`].
//! - `host.rs`: [`Host`]: `command`/`run`/`spawn` inside the namespace (`setns` in `pre_exec`),
//!   `in_netns` closures, sysctls, congestion control, offloads, interface and qdisc counters.
//! - `link.rs`: [`Link`], [`Iface`], [`LinkOpts`] and the address plan.
//! - `qdisc.rs`: [`BottleneckSpec`] (HTB + bfifo, or TBF), [`Bottleneck`], [`QdiscStats`].
//! - `cgroup.rs`: [`Cgroup`] (cgroup v2 directory guard), [`cgroup2_mount`].
//! - `process.rs`: [`ChildGuard`], [`CapturedOutput`].
//! - `topo.rs`: [`StarSpec`]/[`Star`] (N senders -> router -> receiver, bottleneck on the
//!   router's egress to the receiver) and the route computation behind [`Testbed::route_all`].
//! - `util.rs`: running `ip`/`tc` with readable errors.
//! - `selftest.rs` (tests only): builds a topology, pings, checks a 20 Mbit/s bottleneck with the
//!   bulk generator, and checks that everything is gone after drop.
//!
//! # Names
//! Each testbed gets a 7-character prefix `pl` + 4 hex digits of a hash of its name + one
//! suffix character, held by an `flock` on `/run/paceline-testbed/<prefix>.lock` for its
//! lifetime. Two live testbeds (in one process or several) never share a prefix; a prefix whose
//! lock is free is stale, and whatever carries it (namespaces, root-namespace veths, cgroups) is
//! removed before reuse. Namespaces are `<prefix>-<host>`, interfaces `<prefix>l<link><a|b>`
//! (at most 15 characters), cgroups `<cgroup2>/paceline-tests/<prefix>-<name>`.
//!
//! # Addresses
//! Link `i` (1-based): `10.<i/256>.<i%256>.1/24` on end a and `.2` on end b (or /30 out of
//! `10.128.0.0/9`), and with IPv6 `fd00:706c:<i>::1/64` and `::2`. [`Testbed::route_all`] adds
//! routes so every host reaches every address through routers (shortest path).
//!
//! # Defaults on every host
//! `lo` up, `net.ipv4.tcp_congestion_control` set explicitly ([`TestbedOpts::congestion_control`],
//! default `cubic`: new namespaces inherit the root's, which may be `bbr`), and
//! `net.ipv4.tcp_no_metrics_save=1` so that one run's cached ssthresh does not leak into the
//! next. Links have TSO/GSO/GRO off unless [`LinkOpts::disable_offloads`] is false.
//!
//! One machine-wide side effect: outside the initial namespace Linux only accepts a default
//! congestion control listed in the global `net.ipv4.tcp_allowed_congestion_control`, so the
//! first testbed on a machine appends `cubic` (or whatever it was asked for) there; see
//! [`Host::set_congestion_control`]. Per-socket `TCP_CONGESTION` from root is not restricted.
//!
//! # Teardown
//! Dropping the [`Testbed`] SIGKILLs every process still inside its namespaces (never the
//! test process itself), deletes its veths (which takes their qdiscs), deletes the namespaces
//! and removes its cgroups (killing what is inside). [`ChildGuard`]s and [`Cgroup`]s also
//! clean up on their own drop. Sockets the test process opened with [`Host::in_netns`] keep
//! their (by then unnamed and link-less) namespace alive until they are closed.

mod cgroup;
mod host;
mod link;
mod process;
mod qdisc;
#[cfg(test)]
mod selftest;
mod topo;
mod util;

pub use cgroup::{CGROUP_PARENT, Cgroup, cgroup2_mount};
pub use host::{DevCounters, Host, LinkStats, read_dev};
pub use link::{Iface, Link, LinkOpts};
pub use process::{CapturedOutput, ChildGuard};
pub use qdisc::{Bottleneck, BottleneckSpec, QdiscStats, Shaper, parse_qdisc_json};
pub use topo::{Star, StarSpec};
pub use util::is_root;

use anyhow::{Context, Result, bail, ensure};
use host::HostInner;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// Where the prefix lock files live.
pub const LOCK_DIR: &str = "/run/paceline-testbed";

/// Testbed-wide options.
#[derive(Clone, Debug)]
pub struct TestbedOpts {
    /// Default TCP congestion control of every host (default `cubic`).
    pub congestion_control: String,
    /// Default options for [`Testbed::link`].
    pub link: LinkOpts,
}

impl Default for TestbedOpts {
    fn default() -> Self {
        TestbedOpts {
            congestion_control: "cubic".into(),
            link: LinkOpts::default(),
        }
    }
}

/// Why the privileged tests cannot run here, if they cannot (not root, no `ip`/`tc`, no
/// `/run/netns` support).
pub fn skip_reason() -> Option<String> {
    if !is_root() {
        return Some("needs root (network namespaces, veths, qdiscs)".into());
    }
    for tool in ["ip", "tc"] {
        if !util::run_quiet(tool, &["-V"]) {
            return Some(format!("`{tool}` (iproute2) not found"));
        }
    }
    None
}

/// For tests: when the testbed cannot run here, prints `SKIPPED: <test>: <reason>` and returns
/// true (the test should return).
pub fn skip_if_unprivileged(test: &str) -> bool {
    match skip_reason() {
        Some(r) => {
            println!("SKIPPED: {test}: {r}");
            true
        }
        None => false,
    }
}

struct LockFile {
    file: File,
    path: PathBuf,
}

#[derive(Default)]
struct State {
    hosts: Vec<Host>,
    links: Vec<Link>,
    cgroups: Vec<PathBuf>,
    next_link: u32,
    torn_down: bool,
}

/// A set of namespaces, links and cgroups, removed on drop. `Sync`: share `&Testbed` (or the
/// [`Host`] handles) with threads.
pub struct Testbed {
    name: String,
    prefix: String,
    opts: TestbedOpts,
    lock: Mutex<Option<LockFile>>,
    state: Mutex<State>,
}

const SUFFIXES: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";

// Testbeds and hosts are shared with threads.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Testbed>();
    send_sync::<Host>();
    send_sync::<Link>();
};

impl Testbed {
    /// A new, empty testbed with default options. `name` only needs to be meaningful (the test's
    /// name is a good choice); uniqueness of the namespace and interface names is taken care of.
    pub fn new(name: &str) -> Result<Testbed> {
        Self::with_opts(name, TestbedOpts::default())
    }

    /// A new, empty testbed with `opts`.
    pub fn with_opts(name: &str, opts: TestbedOpts) -> Result<Testbed> {
        if let Some(r) = skip_reason() {
            bail!("testbed {name}: {r}");
        }
        let base = format!("pl{:04x}", util::fnv1a(name) & 0xffff);
        let (prefix, lock) =
            acquire_prefix(&base).with_context(|| format!("testbed {name}: allocate a name prefix"))?;
        cleanup_prefix(&prefix);
        Ok(Testbed {
            name: name.to_string(),
            prefix,
            opts,
            lock: Mutex::new(Some(lock)),
            state: Mutex::new(State {
                next_link: 1,
                ..Default::default()
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The name it was created with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The unique 7-character prefix of its namespaces, interfaces and cgroups.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Its options.
    pub fn opts(&self) -> &TestbedOpts {
        &self.opts
    }

    /// All hosts, in creation order.
    pub fn hosts(&self) -> Vec<Host> {
        self.state().hosts.clone()
    }

    /// The host called `name`.
    pub fn host(&self, name: &str) -> Option<Host> {
        self.state().hosts.iter().find(|h| h.name() == name).cloned()
    }

    /// All links, in creation order.
    pub fn links(&self) -> Vec<Link> {
        self.state().links.clone()
    }

    /// Adds a host (namespace `<prefix>-<name>`; `name` of `[A-Za-z0-9_-]`, at most 40 chars).
    pub fn add_host(&self, name: &str) -> Result<Host> {
        self.add_host_inner(name, false)
    }

    /// Adds a router: a host with IPv4/IPv6 forwarding on and reverse-path filtering off.
    pub fn add_router(&self, name: &str) -> Result<Host> {
        self.add_host_inner(name, true)
    }

    fn add_host_inner(&self, name: &str, router: bool) -> Result<Host> {
        ensure!(
            !name.is_empty()
                && name.len() <= 40
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "host name {name:?}: use 1-40 characters of [A-Za-z0-9_-]"
        );
        ensure!(
            self.host(name).is_none(),
            "host {name} exists already in testbed {}",
            self.name
        );
        let netns = format!("{}-{name}", self.prefix);
        util::run("ip", &["netns", "add", &netns])
            .with_context(|| format!("testbed {}: add host {name}", self.name))?;
        let host = Host {
            inner: Arc::new(HostInner {
                name: name.to_string(),
                netns: netns.clone(),
                router,
                ifaces: Mutex::new(Vec::new()),
            }),
        };
        // Registered before configuring, so a failure below still tears it down.
        self.state().hosts.push(host.clone());
        util::run("ip", &["-n", &netns, "link", "set", "lo", "up"])?;
        host.set_congestion_control(&self.opts.congestion_control)?;
        host.sysctl("net.ipv4.tcp_no_metrics_save", "1")?;
        if router {
            host.sysctl("net.ipv4.ip_forward", "1")?;
            host.sysctl("net.ipv4.conf.all.rp_filter", "0")?;
            host.sysctl("net.ipv4.conf.default.rp_filter", "0")?;
            // IPv6 may be disabled on the machine; forwarding is then moot.
            let _ = host.sysctl("net.ipv6.conf.all.forwarding", "1");
        }
        Ok(host)
    }

    /// Links `a` and `b` with the testbed's default [`LinkOpts`].
    pub fn link(&self, a: &Host, b: &Host) -> Result<Link> {
        let opts = self.opts.link.clone();
        self.link_with(a, b, &opts)
    }

    /// Links `a` and `b` with a veth pair created directly in their namespaces, addressed,
    /// up, and with offloads off unless `opts` says otherwise.
    pub fn link_with(&self, a: &Host, b: &Host, opts: &LinkOpts) -> Result<Link> {
        ensure!(a.name() != b.name(), "cannot link host {} to itself", a.name());
        let id = {
            let mut st = self.state();
            let id = st.next_link;
            st.next_link += 1;
            id
        };
        let (ifa, ifb) = (format!("{}l{id}a", self.prefix), format!("{}l{id}b", self.prefix));
        ensure!(ifa.len() <= 15, "interface name {ifa} too long");
        let (v4a, v4b, plen) = link::v4_addrs(id, opts.v4_prefix_len)?;
        let v6 = opts.ipv6.then(|| link::v6_addrs(id));
        let mtu = opts.mtu.to_string();
        let ctx = || format!("testbed {}: link {} <-> {}", self.name, a.name(), b.name());
        util::run(
            "ip",
            &[
                "link",
                "add",
                &ifa,
                "netns",
                a.netns(),
                "mtu",
                &mtu,
                "type",
                "veth",
                "peer",
                "name",
                &ifb,
                "netns",
                b.netns(),
                "mtu",
                &mtu,
            ],
        )
        .with_context(ctx)?;
        let mk = |host: &Host,
                  ifname: &str,
                  v4: std::net::Ipv4Addr,
                  v6: Option<std::net::Ipv6Addr>,
                  peer: &Host| Iface {
            host: host.name().to_string(),
            netns: host.netns().to_string(),
            ifname: ifname.to_string(),
            ipv4: v4,
            prefix_len: plen,
            ipv6: v6,
            mtu: opts.mtu,
            peer_host: peer.name().to_string(),
            link_id: id,
        };
        let ia = mk(a, &ifa, v4a, v6.map(|x| x.0), b);
        let ib = mk(b, &ifb, v4b, v6.map(|x| x.1), a);
        let link = Link {
            id,
            a: ia.clone(),
            b: ib.clone(),
            host_a: a.clone(),
            host_b: b.clone(),
            opts: opts.clone(),
        };
        self.state().links.push(link.clone());
        for (host, i) in [(a, &ia), (b, &ib)] {
            let mut lines = vec![format!("addr add {}/{} dev {}", i.ipv4, plen, i.ifname)];
            if let Some(v6) = i.ipv6 {
                lines.push(format!("addr add {v6}/64 dev {} nodad", i.ifname));
            }
            lines.push(format!("link set {} up", i.ifname));
            ip_batch(host.netns(), &lines).with_context(ctx)?;
            if opts.disable_offloads {
                host.disable_offloads(&i.ifname).with_context(ctx)?;
            }
            host.inner
                .ifaces
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(i.clone());
        }
        Ok(link)
    }

    /// Adds routes on every host so that it reaches every link address in the testbed, along a
    /// shortest path whose intermediate hops are routers. Call after the last link; calling
    /// again replaces the routes.
    pub fn route_all(&self) -> Result<()> {
        let (hosts, links) = {
            let st = self.state();
            (st.hosts.clone(), st.links.clone())
        };
        for h in &hosts {
            let lines = topo::routes_for(h, &hosts, &links);
            if !lines.is_empty() {
                ip_batch(h.netns(), &lines)
                    .with_context(|| format!("testbed {}: routes of {}", self.name, h.name()))?;
            }
        }
        Ok(())
    }

    /// Creates a cgroup v2 directory `<cgroup2>/paceline-tests/<prefix>-<name>`, removed when
    /// the returned guard drops (and in any case when the testbed drops).
    pub fn cgroup(&self, name: &str) -> Result<Cgroup> {
        ensure!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "cgroup name {name:?}: use [A-Za-z0-9_-]"
        );
        let rel = Path::new(CGROUP_PARENT).join(format!("{}-{name}", self.prefix));
        let cg = Cgroup::create(&rel)?;
        self.state().cgroups.push(cg.path().to_path_buf());
        Ok(cg)
    }

    /// Tears everything down now and reports what could not be removed (drop does the same
    /// but only prints).
    pub fn teardown(self) -> Result<()> {
        let errs = self.teardown_inner();
        if errs.is_empty() {
            Ok(())
        } else {
            bail!("testbed {} teardown: {}", self.name, errs.join("; "))
        }
    }

    fn teardown_inner(&self) -> Vec<String> {
        let mut errs = Vec::new();
        let (hosts, links, cgroups) = {
            let mut st = self.state();
            if st.torn_down {
                return errs;
            }
            st.torn_down = true;
            (
                std::mem::take(&mut st.hosts),
                std::mem::take(&mut st.links),
                std::mem::take(&mut st.cgroups),
            )
        };
        for h in &hosts {
            kill_netns_pids(h.netns());
        }
        for l in &links {
            // Deleting one end deletes the pair (and its qdiscs) synchronously.
            util::run_quiet("ip", &["-n", &l.a.netns, "link", "del", &l.a.ifname]);
        }
        for h in &hosts {
            if Path::new("/run/netns").join(h.netns()).exists()
                && let Err(e) = util::run("ip", &["netns", "del", h.netns()])
            {
                errs.push(format!("{e:#}"));
            }
        }
        for c in &cgroups {
            if let Err(e) = cgroup::remove_tree(c) {
                errs.push(format!("{e:#}"));
            }
        }
        if let Some(lock) = self.lock.lock().unwrap_or_else(|e| e.into_inner()).take() {
            // Unlink while holding the lock; acquirers check the inode they locked is current.
            let _ = std::fs::remove_file(&lock.path);
            drop(lock.file);
        }
        errs
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for e in self.teardown_inner() {
            eprintln!("testbed {}: teardown: {e}", self.name);
        }
    }
}

impl std::fmt::Debug for Testbed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Testbed")
            .field("name", &self.name)
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// Runs `ip -n <ns> -batch -` with `lines` on stdin.
fn ip_batch(ns: &str, lines: &[String]) -> Result<()> {
    use std::process::{Command, Stdio};
    let mut cmd = Command::new("ip");
    cmd.args(["-n", ns, "-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().context("spawn ip -batch")?;
    {
        let mut stdin = child.stdin.take().context("ip stdin")?;
        stdin.write_all(lines.join("\n").as_bytes())?;
        stdin.write_all(b"\n")?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "ip -n {ns} -batch failed ({}): {}\n  commands:\n    {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            lines.join("\n    ")
        );
    }
    Ok(())
}

/// SIGKILLs every process whose network namespace is `ns` (never this process).
fn kill_netns_pids(ns: &str) {
    let Ok(out) = util::run("ip", &["netns", "pids", ns]) else {
        return;
    };
    let me = std::process::id();
    for pid in out.split_whitespace().filter_map(|p| p.parse::<u32>().ok()) {
        if pid != me {
            // SAFETY: plain kill(2).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

/// Takes the first free prefix `<base><suffix>` by flock-ing its lock file.
fn acquire_prefix(base: &str) -> Result<(String, LockFile)> {
    std::fs::create_dir_all(LOCK_DIR).with_context(|| format!("mkdir {LOCK_DIR}"))?;
    for &s in SUFFIXES {
        let prefix = format!("{base}{}", s as char);
        let path = Path::new(LOCK_DIR).join(format!("{prefix}.lock"));
        for _attempt in 0..5 {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .open(&path)
                .with_context(|| format!("open {}", path.display()))?;
            // SAFETY: flock on a valid fd.
            let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if r != 0 {
                break; // held by a live testbed: next suffix
            }
            // The file may have been unlinked by its previous owner between open and flock.
            let same = match (file.metadata(), std::fs::metadata(&path)) {
                (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
                _ => false,
            };
            if !same {
                continue;
            }
            let _ = file.set_len(0);
            let _ = writeln!(file, "{}", std::process::id());
            return Ok((prefix, LockFile { file, path }));
        }
    }
    bail!("all 36 prefixes {base}? are in use")
}

/// Removes whatever a dead testbed with `prefix` left: namespaces (after killing their
/// processes), root-namespace veths, cgroups.
fn cleanup_prefix(prefix: &str) {
    let ns_prefix = format!("{prefix}-");
    if let Ok(list) = util::run("ip", &["netns", "list"]) {
        for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
            if name.starts_with(&ns_prefix) {
                eprintln!("testbed: removing leftover namespace {name}");
                kill_netns_pids(name);
                util::run_quiet("ip", &["netns", "del", name]);
            }
        }
    }
    if let Ok(list) = util::run("ip", &["-o", "link", "show"]) {
        for l in list.lines() {
            let Some(field) = l.split(": ").nth(1) else {
                continue;
            };
            let name = field.split('@').next().unwrap_or(field);
            if name.starts_with(prefix) {
                eprintln!("testbed: removing leftover interface {name}");
                util::run_quiet("ip", &["link", "del", name]);
            }
        }
    }
    if let Ok(root) = cgroup2_mount()
        && let Ok(rd) = std::fs::read_dir(root.join(CGROUP_PARENT))
    {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with(&ns_prefix) {
                eprintln!("testbed: removing leftover cgroup {}", e.path().display());
                if let Err(err) = cgroup::remove_tree(&e.path()) {
                    eprintln!("testbed: {err:#}");
                }
            }
        }
    }
}

/// The agent tests' topology: a testbed `name` with hosts `a` and `b` joined by one veth pair
/// (MTU 1500), and the name of `a`'s interface towards `b`.
pub fn two_hosts(name: &str) -> Result<(Testbed, Host, Host, String)> {
    let tb = Testbed::new(name)?;
    let a = tb.add_host("a")?;
    let b = tb.add_host("b")?;
    tb.link_with(
        &a,
        &b,
        &LinkOpts {
            mtu: 1500,
            ..LinkOpts::default()
        },
    )?;
    let ifname = a
        .iface_to(&b)
        .ok_or_else(|| anyhow::anyhow!("no interface from a to b"))?
        .ifname;
    Ok((tb, a, b, ifname))
}
