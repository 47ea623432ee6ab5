//! [`Host`]: one network namespace of a testbed, and everything that runs inside it: commands
//! (`setns` in `pre_exec`, not `ip netns exec`, so `/sys/fs/bpf` and the cgroup2 mount stay
//! visible), closures on a thread that joined the namespace, sysctls, offloads, interface and
//! qdisc counters.

use super::link::Iface;
use super::process::ChildGuard;
use super::qdisc::{Bottleneck, BottleneckSpec, QdiscStats};
use super::util;
use anyhow::{Context, Result, anyhow, bail};
use nix::sched::CloneFlags;
use serde::{Deserialize, Serialize};
use std::ffi::OsStr;
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(crate) struct HostInner {
    pub(crate) name: String,
    pub(crate) netns: String,
    pub(crate) router: bool,
    pub(crate) ifaces: Mutex<Vec<Iface>>,
}

/// A host of the testbed: a named network namespace (`/run/netns/<netns>`). Cheap to clone; the
/// namespace belongs to the [`super::Testbed`], which deletes it on drop (a `Host` clone kept
/// longer than that refers to a namespace that is gone, and its commands fail).
#[derive(Clone)]
pub struct Host {
    pub(crate) inner: Arc<HostInner>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Host({} in netns {})", self.inner.name, self.inner.netns)
    }
}

/// Interface counters from `ip -s -j link show`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkStats {
    /// Received bytes.
    pub rx_bytes: u64,
    /// Received packets.
    pub rx_packets: u64,
    /// Receive drops.
    pub rx_dropped: u64,
    /// Transmitted bytes.
    pub tx_bytes: u64,
    /// Transmitted packets.
    pub tx_packets: u64,
    /// Transmit drops.
    pub tx_dropped: u64,
}

impl Host {
    /// The host's short name within the testbed (`s0`, `rx`, `router`, ...).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The namespace name (`ip netns list`, `ip -n <netns>`).
    pub fn netns(&self) -> &str {
        &self.inner.netns
    }

    /// `/run/netns/<netns>`: open it to `setns` into the namespace.
    pub fn netns_path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.inner.netns)
    }

    /// True for hosts created with [`super::Testbed::add_router`] (IP forwarding on).
    pub fn is_router(&self) -> bool {
        self.inner.router
    }

    /// The host's interfaces, in the order its links were created.
    pub fn ifaces(&self) -> Vec<Iface> {
        self.inner.ifaces.lock().unwrap().clone()
    }

    /// The IPv4 address of its first interface, if it has one.
    pub fn try_ipv4(&self) -> Option<Ipv4Addr> {
        self.inner.ifaces.lock().unwrap().first().map(|i| i.ipv4)
    }

    /// The IPv4 address of its first interface. Panics when the host has no link yet.
    pub fn ipv4(&self) -> Ipv4Addr {
        self.try_ipv4()
            .unwrap_or_else(|| panic!("host {} has no interface yet", self.name()))
    }

    /// The IPv6 address of its first interface that has one.
    pub fn ipv6(&self) -> Option<Ipv6Addr> {
        self.inner.ifaces.lock().unwrap().iter().find_map(|i| i.ipv6)
    }

    /// The interface of this host on the link towards `peer`, if they share one.
    pub fn iface_to(&self, peer: &Host) -> Option<Iface> {
        self.inner
            .ifaces
            .lock()
            .unwrap()
            .iter()
            .find(|i| i.peer_host == peer.name())
            .cloned()
    }

    fn where_(&self) -> String {
        format!("host {} (netns {})", self.inner.name, self.inner.netns)
    }

    fn open_netns(&self) -> Result<OwnedFd> {
        let p = self.netns_path();
        let f = File::open(&p).with_context(|| format!("{}: open {}", self.where_(), p.display()))?;
        Ok(f.into())
    }

    /// A `Command` whose child enters this namespace (`setns(CLONE_NEWNET)` in `pre_exec`) and
    /// keeps the caller's mount namespace, so `/sys/fs/bpf` and the cgroup2 mount stay as they
    /// are. (`/sys/class/net` still shows the root namespace's devices: use `ip`.) If the
    /// namespace cannot be opened, spawning the command fails with that error.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new(program);
        match self.open_netns() {
            Ok(fd) => {
                // SAFETY: setns is a single async-signal-safe syscall; no allocation.
                unsafe {
                    cmd.pre_exec(move || {
                        nix::sched::setns(&fd, CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)
                    });
                }
            }
            Err(e) => {
                // Spawning fails (ENOENT) instead of running the program in the wrong namespace;
                // say why on stderr since the spawn error alone would look like a missing program.
                eprintln!("testbed: {e:#}");
                // SAFETY: returns an error without allocating.
                unsafe {
                    cmd.pre_exec(|| Err(std::io::Error::from_raw_os_error(libc::ENOENT)));
                }
            }
        }
        cmd
    }

    /// Runs `args[0]` with `args[1..]` in the namespace, waits, and returns its stdout. Errors
    /// (with the command line, exit status, stderr and stdout) when it exits non-zero.
    pub fn run<S: AsRef<OsStr>>(&self, args: &[S]) -> Result<String> {
        let (prog, rest) = args.split_first().ok_or_else(|| anyhow!("run: empty command"))?;
        let mut cmd = self.command(prog);
        cmd.args(rest);
        let out = self.output(&mut cmd)?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs a prepared command (from [`Host::command`]) to completion and checks its status.
    pub fn output(&self, cmd: &mut Command) -> Result<Output> {
        util::check_output(cmd, &self.where_())
    }

    /// Starts `args` in the namespace in its own process group, stdout/stderr captured, stdin
    /// null; the guard kills it (and its group) on drop.
    pub fn spawn<S: AsRef<OsStr>>(&self, args: &[S]) -> Result<ChildGuard> {
        let (prog, rest) = args
            .split_first()
            .ok_or_else(|| anyhow!("spawn: empty command"))?;
        let mut cmd = self.command(prog);
        cmd.args(rest)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        self.spawn_cmd(cmd)
    }

    /// Starts a prepared command (from [`Host::command`], possibly attached to a cgroup with
    /// [`super::Cgroup::attach`]) in its own process group. Stdio is as configured on `cmd`
    /// (piped streams are captured by the guard).
    pub fn spawn_cmd(&self, mut cmd: Command) -> Result<ChildGuard> {
        cmd.process_group(0);
        let desc = format!("{}: `{}`", self.where_(), util::cmdline(&cmd));
        let child = cmd.spawn().with_context(|| format!("spawn {desc}"))?;
        Ok(ChildGuard::new(child, desc, true))
    }

    /// Runs `f` on a fresh thread that joined this namespace and returns its result (a panic in
    /// `f` is propagated). Sockets created inside stay in this namespace wherever they are
    /// used later; threads spawned inside inherit the namespace.
    pub fn in_netns<T, F>(&self, f: F) -> Result<T>
    where
        T: Send,
        F: FnOnce() -> T + Send,
    {
        let fd = self.open_netns()?;
        let where_ = self.where_();
        std::thread::scope(|s| {
            let h = std::thread::Builder::new()
                .name(format!("netns-{}", self.inner.name))
                .spawn_scoped(s, move || -> Result<T> {
                    nix::sched::setns(&fd, CloneFlags::CLONE_NEWNET)
                        .with_context(|| format!("{where_}: setns"))?;
                    drop(fd);
                    Ok(f())
                })
                .context("spawn netns thread")?;
            match h.join() {
                Ok(r) => r,
                Err(p) => std::panic::resume_unwind(p),
            }
        })
    }

    /// Writes a sysctl in this namespace, `key` in dotted (`net.ipv4.ip_forward`) or slash form.
    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        let path = sysctl_path(key);
        let v = value.to_string();
        self.in_netns(move || {
            std::fs::write(&path, &v).with_context(|| format!("write {v:?} to {}", path.display()))
        })?
        .with_context(|| format!("{}: sysctl {key}={value}", self.where_()))
    }

    /// Reads a sysctl in this namespace (trimmed).
    pub fn sysctl_get(&self, key: &str) -> Result<String> {
        let path = sysctl_path(key);
        self.in_netns(move || {
            std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))
        })?
        .map(|s| s.trim().to_string())
        .with_context(|| format!("{}: sysctl {key}", self.where_()))
    }

    /// Sets the namespace's default TCP congestion control (`net.ipv4.tcp_congestion_control`,
    /// per namespace). New namespaces inherit the root's, which may be `bbr` (which paces by
    /// itself), so the testbed sets one explicitly on every host.
    ///
    /// Outside the initial namespace the kernel only accepts algorithms listed in the global
    /// `net.ipv4.tcp_allowed_congestion_control` (EPERM otherwise; `reno` is always allowed).
    /// On EPERM this appends `cc` to that list (from the process's own namespace, which must be
    /// the initial one) and retries: a machine-wide change, but one that only widens what
    /// unprivileged sockets may choose.
    pub fn set_congestion_control(&self, cc: &str) -> Result<()> {
        let key = "net.ipv4.tcp_congestion_control";
        match self.sysctl(key, cc) {
            Ok(()) => Ok(()),
            Err(e) if is_eperm(&e) => {
                allow_congestion_control(cc)
                    .with_context(|| format!("{}: allow {cc} for namespaces", self.where_()))?;
                self.sysctl(key, cc)
            }
            Err(e) => Err(e),
        }
    }

    /// Turns TSO, GSO and GRO on or off on `ifname` (`ethtool -K`), for per-packet behaviour.
    pub fn set_offloads(&self, ifname: &str, on: bool) -> Result<()> {
        let v = if on { "on" } else { "off" };
        self.run(&["ethtool", "-K", ifname, "tso", v, "gso", v, "gro", v])
            .map(drop)
    }

    /// Shorthand for `set_offloads(ifname, false)`.
    pub fn disable_offloads(&self, ifname: &str) -> Result<()> {
        self.set_offloads(ifname, false)
    }

    /// Counters of every qdisc on `ifname`.
    pub fn qdisc_stats(&self, ifname: &str) -> Result<Vec<QdiscStats>> {
        let out = util::run(
            "tc",
            &["-n", self.netns(), "-s", "-j", "qdisc", "show", "dev", ifname],
        )?;
        super::qdisc::parse_qdisc_json(&out)
    }

    /// Interface counters of `ifname`.
    pub fn link_stats(&self, ifname: &str) -> Result<LinkStats> {
        let out = util::run(
            "ip",
            &["-n", self.netns(), "-s", "-j", "link", "show", "dev", ifname],
        )?;
        let v: serde_json::Value = serde_json::from_str(out.trim()).context("parse ip -j link")?;
        let s = v
            .get(0)
            .and_then(|o| o.get("stats64"))
            .context("no stats64 in ip -j -s link output")?;
        let g = |d: &str, k: &str| {
            s.get(d)
                .and_then(|o| o.get(k))
                .and_then(|x| x.as_u64())
                .unwrap_or(0)
        };
        Ok(LinkStats {
            rx_bytes: g("rx", "bytes"),
            rx_packets: g("rx", "packets"),
            rx_dropped: g("rx", "dropped"),
            tx_bytes: g("tx", "bytes"),
            tx_packets: g("tx", "packets"),
            tx_dropped: g("tx", "dropped"),
        })
    }

    /// `ifname`'s transmit counters, read in-process from a thread inside this namespace.
    pub fn dev_counters(&self, ifname: &str) -> Result<DevCounters> {
        self.in_netns(|| read_dev(ifname))?
    }

    /// Bytes per second `ifname` transmitted over `window`. Both counter reads and both clock
    /// reads happen on one thread inside the namespace, back to back: spawning `ip` for each
    /// read instead adds its start-up time to the window but not to the bytes (under TCG, tens
    /// to hundreds of ms, which biased a 3 s measurement several percent low).
    pub fn tx_rate(&self, ifname: &str, window: Duration) -> Result<f64> {
        self.in_netns(|| -> Result<f64> {
            let (t0, c0) = (std::time::Instant::now(), read_dev(ifname)?);
            std::thread::sleep(window);
            let (c1, t1) = (read_dev(ifname)?, std::time::Instant::now());
            Ok(c1.tx_bytes.saturating_sub(c0.tx_bytes) as f64 / (t1 - t0).as_secs_f64())
        })?
    }

    /// Installs a bottleneck on the egress of `ifname` (replacing its root qdisc).
    pub fn set_bottleneck(&self, ifname: &str, spec: &BottleneckSpec) -> Result<Bottleneck> {
        let mtu = self
            .inner
            .ifaces
            .lock()
            .unwrap()
            .iter()
            .find(|i| i.ifname == ifname)
            .map(|i| i.mtu)
            .unwrap_or(1500);
        Bottleneck::install(self, ifname, spec, mtu)
            .with_context(|| format!("{}: bottleneck on {ifname}", self.where_()))
    }
}

impl Host {
    /// Sends one ICMP (v4) or ICMPv6 echo request to `dst` from this host and waits up to
    /// `timeout` for the reply; returns the round-trip time. A raw socket, so no `ping` binary
    /// is needed (root only, like the rest of the testbed).
    pub fn ping(&self, dst: IpAddr, timeout: Duration) -> Result<Duration> {
        let where_ = self.where_();
        self.in_netns(move || ping_once(dst, timeout))?
            .with_context(|| format!("{where_}: ping {dst}"))
    }

    /// [`Host::ping`] up to `tries` times (1 s timeout each) until one reply arrives.
    pub fn ping_ok(&self, dst: IpAddr, tries: u32) -> Result<Duration> {
        let mut last = None;
        for _ in 0..tries.max(1) {
            match self.ping(dst, Duration::from_secs(1)) {
                Ok(d) => return Ok(d),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap())
    }
}

fn icmp_checksum(b: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for c in b.chunks(2) {
        let w = if c.len() == 2 {
            u16::from_be_bytes([c[0], c[1]])
        } else {
            u16::from_be_bytes([c[0], 0])
        };
        sum += w as u32;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn ping_once(dst: IpAddr, timeout: Duration) -> Result<Duration> {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    use std::io::Read;
    use std::time::Instant;
    static SEQ: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(1);
    let v6 = dst.is_ipv6();
    let sock = if v6 {
        Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))
    } else {
        Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))
    }
    .context("raw ICMP socket (needs root)")?;
    let id = (std::process::id() as u16) ^ 0x706c;
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut pkt = [0u8; 24];
    pkt[0] = if v6 { 128 } else { 8 };
    pkt[4..6].copy_from_slice(&id.to_be_bytes());
    pkt[6..8].copy_from_slice(&seq.to_be_bytes());
    pkt[8..24].copy_from_slice(b"paceline-testbed");
    if !v6 {
        let c = icmp_checksum(&pkt);
        pkt[2..4].copy_from_slice(&c.to_be_bytes());
    } // the kernel fills in the ICMPv6 checksum
    let t0 = Instant::now();
    sock.send_to(&pkt, &SockAddr::from(std::net::SocketAddr::new(dst, 0)))
        .context("send echo request")?;
    let mut buf = [0u8; 2048];
    loop {
        let left = timeout.checked_sub(t0.elapsed()).filter(|d| !d.is_zero());
        let Some(left) = left else {
            anyhow::bail!("no echo reply within {timeout:?}")
        };
        sock.set_read_timeout(Some(left))?;
        let n = match (&sock).read(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(e) => return Err(e).context("receive"),
        };
        // IPv4 raw sockets deliver the IP header, ICMPv6 raw sockets do not.
        let off = if v6 { 0 } else { ((buf[0] & 0x0f) as usize) * 4 };
        if n < off + 8 {
            continue;
        }
        let icmp = &buf[off..n];
        let reply_type = if v6 { 129 } else { 0 };
        if icmp[0] == reply_type && icmp[4..6] == id.to_be_bytes() && icmp[6..8] == seq.to_be_bytes() {
            return Ok(t0.elapsed());
        }
    }
}

fn is_eperm(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .and_then(|io| io.raw_os_error())
            == Some(libc::EPERM)
    })
}

/// Appends `cc` to the global `net.ipv4.tcp_allowed_congestion_control` (written from a thread
/// in this process's own network namespace, normally the initial one, where that sysctl lives).
fn allow_congestion_control(cc: &str) -> Result<()> {
    let cc = cc.to_string();
    std::thread::spawn(move || -> Result<()> {
        let own = File::open("/proc/self/ns/net").context("open /proc/self/ns/net")?;
        nix::sched::setns(&own, CloneFlags::CLONE_NEWNET).context("setns to the process namespace")?;
        let p = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";
        let cur = std::fs::read_to_string(p).with_context(|| format!("read {p}"))?;
        if cur.split_whitespace().any(|x| x == cc) {
            return Ok(());
        }
        let new = format!("{} {cc}", cur.trim());
        std::fs::write(p, &new).with_context(|| format!("write {new:?} to {p}"))?;
        eprintln!("testbed: added {cc} to net.ipv4.tcp_allowed_congestion_control ({new})");
        Ok(())
    })
    .join()
    .map_err(|_| anyhow!("allow_congestion_control thread panicked"))?
}

fn sysctl_path(key: &str) -> PathBuf {
    if key.starts_with('/') {
        return PathBuf::from(key);
    }
    let rel = if key.contains('/') {
        key.to_string()
    } else {
        key.replace('.', "/")
    };
    PathBuf::from("/proc/sys").join(rel)
}

#[cfg(test)]
mod tests {
    #[test]
    fn sysctl_paths() {
        assert_eq!(
            super::sysctl_path("net.ipv4.ip_forward").to_str(),
            Some("/proc/sys/net/ipv4/ip_forward")
        );
        assert_eq!(
            super::sysctl_path("net/ipv4/conf/eth0.1/rp_filter").to_str(),
            Some("/proc/sys/net/ipv4/conf/eth0.1/rp_filter")
        );
    }
}

/// Transmit counters of one interface.
#[derive(Clone, Copy, Debug, Default)]
pub struct DevCounters {
    pub tx_bytes: u64,
    pub tx_packets: u64,
}

/// Reads `ifname`'s counters from `/proc/thread-self/net/dev`: the calling thread's network
/// namespace (call from inside [`Host::in_netns`], or use [`Host::dev_counters`]).
pub fn read_dev(ifname: &str) -> Result<DevCounters> {
    let text =
        std::fs::read_to_string("/proc/thread-self/net/dev").context("read /proc/thread-self/net/dev")?;
    for line in text.lines() {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        if name.trim() != ifname {
            continue;
        }
        let f: Vec<u64> = rest.split_whitespace().map(|x| x.parse().unwrap_or(0)).collect();
        if f.len() < 10 {
            bail!("short line for {ifname} in /proc/net/dev: {line}");
        }
        return Ok(DevCounters {
            tx_bytes: f[8],
            tx_packets: f[9],
        });
    }
    bail!("{ifname} not in /proc/thread-self/net/dev")
}
