//! The policy's host facts ([`HostFacts`]) read from this machine, in the caller's network
//! namespace: [`SystemHost`]. The policy crate validates and compiles against the trait; this
//! is the one implementation that reads the running host (`/proc`, an ethtool ioctl, the
//! cgroup2 mount).

use std::ffi::CString;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Component, Path, PathBuf};

use paceline_policy::host::{HostFacts, dedup};

/// This machine, in the caller's network namespace.
///
/// - Interfaces exist when `if_nametoindex(3)` knows them (`/sys/class/net` shows the
///   namespace sysfs was mounted in, not ours).
/// - Default routes come from `/proc/net/route` and `/proc/net/ipv6_route`, which are per
///   network namespace.
/// - Link rates from the `SIOCETHTOOL` ioctl (`ETHTOOL_GSET`, which the kernel answers through
///   `get_link_ksettings`); unknown speeds (`SPEED_UNKNOWN`, 0, no ethtool ops) are `None`.
/// - cgroup ids are inode numbers under the cgroup2 mount found in `/proc/self/mountinfo`
///   (`/sys/fs/cgroup` on unified hosts, `/sys/fs/cgroup/unified` on hybrid ones).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemHost;

impl SystemHost {
    pub fn new() -> Self {
        SystemHost
    }
}

impl HostFacts for SystemHost {
    fn interface_exists(&self, name: &str) -> bool {
        let Ok(c) = CString::new(name) else {
            return false;
        };
        // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
        unsafe { libc::if_nametoindex(c.as_ptr()) != 0 }
    }

    fn default_route_interfaces(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Ok(t) = std::fs::read_to_string("/proc/net/route") {
            out.extend(parse_route_v4(&t));
        }
        if let Ok(t) = std::fs::read_to_string("/proc/net/ipv6_route") {
            out.extend(parse_route_v6(&t));
        }
        dedup(out)
    }

    fn route_interfaces(&self) -> Option<Vec<String>> {
        route_interfaces()
    }

    fn link_rate(&self, iface: &str) -> Option<u64> {
        ethtool_speed_mbps(iface).map(|mbps| mbps * 125_000)
    }

    fn cgroup_id(&self, path: &str) -> Result<u64, String> {
        let info = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
        let mount =
            cgroup2_mount(&info).ok_or("no cgroup2 file system is mounted (see /proc/self/mountinfo)")?;
        cgroup_inode(&mount, path)
    }
}

const RTF_UP: u32 = 0x0001;
const RTF_REJECT: u32 = 0x0200;

/// The interfaces any up, non-reject route (IPv4 or IPv6) leaves through, `lo` excluded, read
/// from `/proc/net/route` and `/proc/net/ipv6_route` (per network namespace): where this
/// host's traffic can go. `None` when neither can be read.
fn route_interfaces() -> Option<Vec<String>> {
    let v4 = std::fs::read_to_string("/proc/net/route").ok();
    let v6 = std::fs::read_to_string("/proc/net/ipv6_route").ok();
    if v4.is_none() && v6.is_none() {
        return None;
    }
    let mut out = Vec::new();
    if let Some(t) = v4 {
        out.extend(parse_route_ifaces_v4(&t));
    }
    if let Some(t) = v6 {
        out.extend(parse_route_ifaces_v6(&t));
    }
    Some(dedup(out))
}

/// One usable route: up and not a reject route.
struct Route<'a> {
    iface: &'a str,
    default: bool,
}

/// The usable routes of `/proc/net/route` (header line first).
fn routes_v4(text: &str) -> impl Iterator<Item = Route<'_>> {
    text.lines().skip(1).filter_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let flags = u32::from_str_radix(f.get(3)?, 16).unwrap_or(0);
        (f.len() >= 8 && flags & RTF_UP != 0 && flags & RTF_REJECT == 0).then(|| Route {
            iface: f[0],
            default: f[1] == "00000000" && f[7] == "00000000",
        })
    })
}

/// The usable routes of `/proc/net/ipv6_route`.
fn routes_v6(text: &str) -> impl Iterator<Item = Route<'_>> {
    text.lines().filter_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let flags = u32::from_str_radix(f.get(8)?, 16).unwrap_or(0);
        (f.len() >= 10 && flags & RTF_UP != 0 && flags & RTF_REJECT == 0).then(|| Route {
            iface: f[9],
            default: f[0].bytes().all(|b| b == b'0') && f[1] == "00",
        })
    })
}

/// Interfaces of every up, non-reject IPv4 route, `lo` excluded.
pub fn parse_route_ifaces_v4(text: &str) -> Vec<String> {
    dedup(
        routes_v4(text)
            .filter(|r| r.iface != "lo")
            .map(|r| r.iface.to_string())
            .collect(),
    )
}

/// Interfaces of every up, non-reject IPv6 route, `lo` excluded.
pub fn parse_route_ifaces_v6(text: &str) -> Vec<String> {
    dedup(
        routes_v6(text)
            .filter(|r| r.iface != "lo")
            .map(|r| r.iface.to_string())
            .collect(),
    )
}

/// Interfaces with an IPv4 default route (`Destination` and `Mask` 0, up, not a reject route).
pub fn parse_route_v4(text: &str) -> Vec<String> {
    dedup(
        routes_v4(text)
            .filter(|r| r.default)
            .map(|r| r.iface.to_string())
            .collect(),
    )
}

/// Interfaces with an IPv6 default route (`::/0`, up, not a reject route, not `lo`).
pub fn parse_route_v6(text: &str) -> Vec<String> {
    dedup(
        routes_v6(text)
            .filter(|r| r.default && r.iface != "lo")
            .map(|r| r.iface.to_string())
            .collect(),
    )
}

/// The mount point of the first cgroup2 file system in a mountinfo text.
pub fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        if right.split_whitespace().next() == Some("cgroup2") {
            let mp = left.split_whitespace().nth(4)?;
            return Some(PathBuf::from(unescape_mount(mp)));
        }
    }
    None
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
pub(crate) fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The inode number of `mount/path`, which must be a directory inside the mount.
pub fn cgroup_inode(mount: &Path, path: &str) -> Result<u64, String> {
    // The policy's own syntactic check, which `policy check --offline` applies too.
    paceline_policy::host::check_cgroup_path(path).map_err(|e| format!("{path:?} {e}"))?;
    let rel = Path::new(path.trim_start_matches('/'));
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(format!("{path:?} must be a plain path below the cgroup2 mount"));
    }
    let full = mount.join(rel);
    match std::fs::metadata(&full) {
        Ok(m) if m.is_dir() => Ok(m.ino()),
        Ok(_) => Err(format!("{} is not a directory", full.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(format!("no such cgroup under {}", mount.display()))
        }
        Err(e) => Err(format!("{}: {e}", full.display())),
    }
}

const SIOCETHTOOL: u64 = 0x8946;
const ETHTOOL_GSET: u32 = 0x0000_0001;

/// `struct ethtool_cmd` (linux/ethtool.h), 44 bytes.
#[repr(C)]
#[derive(Default)]
struct EthtoolCmd {
    cmd: u32,
    supported: u32,
    advertising: u32,
    speed: u16,
    duplex: u8,
    port: u8,
    phy_address: u8,
    transceiver: u8,
    autoneg: u8,
    mdio_support: u8,
    maxtxpkt: u32,
    maxrxpkt: u32,
    speed_hi: u16,
    eth_tp_mdix: u8,
    eth_tp_mdix_ctrl: u8,
    lp_advertising: u32,
    reserved: [u32; 2],
}
const _: () = assert!(size_of::<EthtoolCmd>() == 44);

/// `struct ifreq` with the `ifr_data` member of its union (40 bytes on 64-bit).
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

/// The link speed in Mbit/s, `None` when unknown or the query fails.
fn ethtool_speed_mbps(iface: &str) -> Option<u64> {
    if iface.is_empty() || iface.len() >= libc::IFNAMSIZ || iface.contains('\0') {
        return None;
    }
    let mut cmd = EthtoolCmd {
        cmd: ETHTOOL_GSET,
        ..Default::default()
    };
    let mut ifr = IfReq {
        name: [0; libc::IFNAMSIZ],
        data: (&mut cmd as *mut EthtoolCmd).cast(),
        _pad: [0; 16],
    };
    ifr.name[..iface.len()].copy_from_slice(iface.as_bytes());
    // SAFETY: plain socket(2); the fd is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `ifr` and `cmd` are live, correctly laid out for SIOCETHTOOL/ETHTOOL_GSET.
    let r = unsafe { libc::ioctl(fd, SIOCETHTOOL as _, &mut ifr as *mut IfReq) };
    // SAFETY: `fd` is ours.
    unsafe { libc::close(fd) };
    if r != 0 {
        return None;
    }
    let speed = (u32::from(cmd.speed_hi) << 16) | u32::from(cmd.speed);
    // SPEED_UNKNOWN is -1 (all ones); 0 also means unknown.
    if speed == 0 || speed == u32::MAX || speed == 0xffff {
        return None;
    }
    Some(u64::from(speed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use paceline_policy::host::{FakeHost, OfflineHost, all_routes_managed};
    use paceline_policy::{CompileContext, EnforcementMode};

    #[test]
    fn v4_default_routes() {
        let t = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                 eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                 eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                 eth1\t00000000\t010200C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n\
                 eth2\t00000000\t00000000\t0201\t0\t0\t0\t00000000\t0\t0\t0\n";
        assert_eq!(parse_route_v4(t), vec!["eth0", "eth1"]);
    }

    #[test]
    fn every_route_interface() {
        let v4 = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                  eth0\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                  mgmt0\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                  dead0\t0000A8C0\t00000000\t0000\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                  lo\t0000007F\t00000000\t0001\t0\t0\t0\t000000FF\t0\t0\t0\n";
        assert_eq!(parse_route_ifaces_v4(v4), ["eth0", "mgmt0"]);
        let v6 = "fe800000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001 eth0\n\
                  00000000000000000000000000000001 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000002 00000000 80200001 lo\n\
                  fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001 stor0\n";
        assert_eq!(parse_route_ifaces_v6(v6), ["eth0", "stor0"]);
    }

    #[test]
    fn v6_default_routes() {
        let t = "\
00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003 bond0
fd000000000000000000000000000000 08 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001 bond0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200 lo
";
        assert_eq!(parse_route_v6(t), vec!["bond0"]);
    }

    #[test]
    fn cgroup2_mount_point() {
        let hybrid = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
                      32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
                      41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let odd = "41 31 0:38 / /mnt/my\\040cgroups rw shared:9 - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount(odd), Some(PathBuf::from("/mnt/my cgroups")));
        assert_eq!(
            cgroup2_mount("32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"),
            None
        );
    }

    #[test]
    fn cgroup_inode_of_a_directory() {
        let dir = std::env::temp_dir().join(format!("paceline-cg-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("system.slice/a.service")).unwrap();
        let ino = std::fs::metadata(dir.join("system.slice/a.service"))
            .unwrap()
            .ino();
        assert_eq!(cgroup_inode(&dir, "/system.slice/a.service"), Ok(ino));
        assert_eq!(cgroup_inode(&dir, "system.slice/a.service"), Ok(ino));
        let e = cgroup_inode(&dir, "/system.slice/b.service").unwrap_err();
        assert_eq!(e, format!("no such cgroup under {}", dir.display()));
        assert!(cgroup_inode(&dir, "/../etc").unwrap_err().contains("\"..\""));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn system_host_basics() {
        let h = SystemHost::new();
        assert!(h.interface_exists("lo"));
        assert!(!h.interface_exists("no-such-if0"));
        assert!(!h.interface_exists("bad\0name"));
        // lo has no ethtool speed.
        assert_eq!(h.link_rate("lo"), None);
        assert_eq!(h.link_rate("no-such-if0"), None);
        assert!(!h.default_route_interfaces().iter().any(|i| i == "lo"));
    }

    #[test]
    fn routes_managed_only_when_every_route_interface_is() {
        let managed = ["eth0".to_string(), "eth1".to_string()];
        let host = FakeHost::new().with_default_route("eth0").with_route("eth1");
        assert!(all_routes_managed(&host, &managed));
        assert!(!all_routes_managed(&host.with_route("mgmt0"), &managed));
        assert!(!all_routes_managed(&OfflineHost, &managed), "unknown routes");
        // A host whose routes cannot be read says so rather than "none".
        assert!(SystemHost.route_interfaces().is_some());
    }

    #[test]
    fn system_host_cgroups() {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let Some(mount) = cgroup2_mount(&info) else {
            eprintln!("skipped: no cgroup2 mount");
            return;
        };
        let h = SystemHost::new();
        assert_eq!(h.cgroup_id("/"), Ok(std::fs::metadata(&mount).unwrap().ino()));
        let e = h.cgroup_id("/no/such/cgroup.service").unwrap_err();
        assert_eq!(e, format!("no such cgroup under {}", mount.display()));
    }

    #[test]
    fn default_policy_validates_on_this_host() {
        let host = SystemHost::new();
        if host.default_route_interfaces().is_empty() {
            eprintln!("skipped: this machine has no default route");
            return;
        }
        let v = paceline_policy::load(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/default.yaml"),
            &host,
        )
        .unwrap_or_else(|es| panic!("{}", es.iter().map(|e| format!("{e}\n")).collect::<String>()));
        assert!(!v.interfaces.is_empty());
        assert!(v.interfaces_auto);
        let mode = v.enforcement().fixed().unwrap_or(EnforcementMode::Fq);
        let c = paceline_policy::compile(
            &v,
            &CompileContext {
                mode,
                previous: None,
                all_routes_managed: false,
            },
        )
        .unwrap();
        assert_eq!(
            c.warnings,
            Vec::<String>::new(),
            "the default policy has no warnings"
        );
        // Safe: nothing paced, nothing rewritten.
        assert!(
            c.table
                .classes
                .iter()
                .all(|k| k.flow_rate == 0 && k.class_rate == 0)
        );
        assert!(c.table.levels.iter().all(|l| l.rate == 0 && l.flags == 0));
        assert_eq!(c.enforcement, paceline_policy::EnforcementRequest::None);
    }
}
