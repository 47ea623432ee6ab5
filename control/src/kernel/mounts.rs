//! The filesystems the agent needs, mounted by the agent itself where they are missing: a BPF
//! filesystem for its pins ([`crate::kernel::persist`]) and a cgroup2 hierarchy for sock_ops.
//!
//! `ip netns exec NS paceline agent` runs the agent in a new mount namespace whose `/sys` is a
//! fresh sysfs: no BPF filesystem at `/sys/fs/bpf` and no cgroup2 at `/sys/fs/cgroup` there.
//! A container may lack them too. At start ([`Mounts::ensure`]):
//! - **bpffs**: when the pin directory (`--bpffs-dir`) is not in a BPF filesystem, the agent
//!   mounts one at the pin directory (created if needed), or at `/sys/fs/bpf` when the pin
//!   directory is below sysfs's empty `/sys/fs/bpf` (sysfs creates no directories).
//! - **cgroup2**: when no cgroup2 hierarchy is mounted at all, the agent mounts one at
//!   `<state dir>/cgroup2`. A fresh mount in the initial cgroup namespace shows the whole
//!   hierarchy: sock_ops attached at its root sees every socket, and the datapath keeps to the
//!   sockets of the agent's network namespace (by netns cookie).
//!
//! Where it may not (the mount is refused, the directory cannot be created) the start is
//! refused with the path and the command that fixes it. The agent's mounts carry the source
//! name `paceline` (`findmnt -S paceline`), so a start after `kill -9` in the same mount
//! namespace knows them for its own. A clean stop ([`Mounts::release`]) unmounts them: the
//! cgroup2 mount always, the BPF filesystem once it is empty (the pins are gone; another
//! program's pins keep it mounted).
//!
//! What survives `kill -9`: a mount lives as long as its mount namespace. Under
//! `ip netns exec` that namespace is the agent's alone and ends with it, and with it the BPF
//! filesystem the agent mounted and every pin in it: the tcx and cgroup links are then
//! released (those programs detach), so the datapath does **not** outlive the agent there;
//! clsact filters, qdiscs and the state directory (on the host's `/run`) do, and the next
//! start undoes them as after a crash without pins. In a mount namespace that outlives the
//! agent (the host's, a container's) the mounts stay, the pins in them too, and the next start
//! adopts both.

use std::path::{Component, Path, PathBuf};

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

/// The source name of the agent's own mounts (the mount table's "source" column).
pub const SOURCE: &str = "paceline";

/// Where in the state directory the agent mounts cgroup2 when none is mounted.
pub const CGROUP2_DIR: &str = "cgroup2";

/// One line of `/proc/self/mountinfo`, the fields the agent needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: String,
}

/// Parses a mountinfo text (`id parent maj:min root mountpoint opts [tags] - fstype source
/// superopts`), mount points unescaped.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mp = left.split_whitespace().nth(4)?;
            let mut r = right.split_whitespace();
            let fstype = r.next()?.to_string();
            let source = r.next().unwrap_or("").to_string();
            Some(MountEntry {
                mount_point: PathBuf::from(crate::host::unescape_mount(mp)),
                fstype,
                source,
            })
        })
        .collect()
}

/// The mount `path` lies in: the longest mount point above it, the latest of those stacked on
/// one point (the one on top).
pub fn covering<'a>(mounts: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    let mut best: Option<&MountEntry> = None;
    for m in mounts {
        if path.starts_with(&m.mount_point)
            && best.is_none_or(|b| m.mount_point.components().count() >= b.mount_point.components().count())
        {
            best = Some(m);
        }
    }
    best
}

/// What to do for the pin directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BpffsPlan {
    /// It is in the BPF filesystem mounted at `mount`; `ours` when the agent mounted it (a
    /// previous agent in this mount namespace that did not stop cleanly).
    Present { mount: PathBuf, ours: bool },
    /// Mount a BPF filesystem at `target` (the pin directory, created first, or `/sys/fs/bpf`).
    Mount { target: PathBuf },
    /// The agent cannot mount one where it would need to: why, with the fix.
    Refuse(String),
}

/// Decides for the pin directory `dir` (absolute), given the mount table and `existing`, the
/// deepest of `dir` and its ancestors that exists.
pub fn plan_bpffs(mounts: &[MountEntry], dir: &Path, existing: &Path) -> BpffsPlan {
    let Some(m) = covering(mounts, existing) else {
        return BpffsPlan::Mount {
            target: dir.to_path_buf(),
        };
    };
    if m.fstype == "bpf" {
        return BpffsPlan::Present {
            mount: m.mount_point.clone(),
            ours: m.source == SOURCE,
        };
    }
    if m.fstype == "sysfs" {
        // sysfs's /sys/fs/bpf is the empty directory kernels provide for a BPF filesystem;
        // nothing can be created below it, and no other sysfs directory is the agent's to
        // mount over.
        let bpf = m.mount_point.join("fs/bpf");
        if existing == bpf {
            return BpffsPlan::Mount { target: bpf };
        }
        return BpffsPlan::Refuse(format!(
            "--bpffs-dir {} is in sysfs ({}), where the agent cannot create it; mount a BPF \
             filesystem at /sys/fs/bpf and keep the pins below it: `mount -t bpf bpf /sys/fs/bpf`",
            dir.display(),
            m.mount_point.display()
        ));
    }
    BpffsPlan::Mount {
        target: dir.to_path_buf(),
    }
}

/// What to do for cgroup2.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cgroup2Plan {
    /// A cgroup2 hierarchy is mounted at `mount`; `ours` when it is at `target` (mounted by a
    /// previous agent in this mount namespace that did not stop cleanly).
    Present { mount: PathBuf, ours: bool },
    /// None is mounted: mount one at `target`.
    Mount { target: PathBuf },
}

/// Decides for cgroup2, `target` being `<state dir>/cgroup2`.
pub fn plan_cgroup2(mounts: &[MountEntry], target: &Path) -> Cgroup2Plan {
    if let Some(m) = mounts
        .iter()
        .rev()
        .find(|m| m.fstype == "cgroup2" && m.mount_point == target)
    {
        return Cgroup2Plan::Present {
            mount: m.mount_point.clone(),
            ours: true,
        };
    }
    match mounts.iter().find(|m| m.fstype == "cgroup2") {
        Some(m) => Cgroup2Plan::Present {
            mount: m.mount_point.clone(),
            ours: false,
        },
        None => Cgroup2Plan::Mount {
            target: target.to_path_buf(),
        },
    }
}

/// The command that mounts a BPF filesystem at `target` by hand.
pub fn bpffs_fix(target: &Path) -> String {
    if target == Path::new("/sys/fs/bpf") {
        "mount -t bpf bpf /sys/fs/bpf".to_string()
    } else {
        format!("mkdir -p {0} && mount -t bpf bpf {0}", target.display())
    }
}

/// The command that mounts cgroup2 at `target` by hand.
pub fn cgroup2_fix(target: &Path) -> String {
    format!("mkdir -p {0} && mount -t cgroup2 cgroup2 {0}", target.display())
}

/// A filesystem the agent mounted (in `/status` as `mounted`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountedFs {
    /// `bpf` or `cgroup2`.
    pub fstype: String,
    pub path: PathBuf,
    /// Mounted by a previous agent in this mount namespace (it did not stop cleanly); this one
    /// took it over and unmounts it at a clean stop.
    #[serde(default)]
    pub adopted: bool,
}

impl MountedFs {
    /// `bpf at /sys/fs/bpf`, `cgroup2 at /run/paceline/cgroup2 (from a previous agent)`.
    pub fn describe(&self) -> String {
        format!(
            "{} at {}{}",
            self.fstype,
            self.path.display(),
            if self.adopted {
                " (mounted by a previous agent)"
            } else {
                ""
            }
        )
    }
}

/// The agent's own mounts, unmounted by [`Mounts::release`] (also on drop, e.g. a failed
/// start).
#[derive(Debug, Default)]
pub struct Mounts {
    mounted: Vec<MountedFs>,
    /// Directories the agent created to mount on (removed after the unmount, when empty).
    created: Vec<PathBuf>,
}

impl Mounts {
    /// Mounts a BPF filesystem for `pin_dir` and a cgroup2 hierarchy under `state_dir` where
    /// none is mounted (see the module documentation); an error names the path and the fix.
    pub fn ensure(pin_dir: &Path, state_dir: &Path) -> Result<Mounts> {
        let mut out = Mounts::default();
        let pin_dir = absolute(pin_dir)?;
        let table = read_mountinfo()?;
        let existing = deepest_existing(&pin_dir);
        if !existing.is_dir() {
            bail!(
                "cannot create the pin directory {}: {} is not a directory. The agent pins its maps \
                 in a BPF filesystem there (and mounts one when none is); point --bpffs-dir at a \
                 directory that can be created, or mount one: `{}`",
                pin_dir.display(),
                existing.display(),
                bpffs_fix(&pin_dir)
            );
        }
        match plan_bpffs(&table, &pin_dir, &existing) {
            BpffsPlan::Present { mount, ours } => {
                if ours {
                    log::info!(
                        "the BPF filesystem at {} was mounted by a previous agent in this mount namespace: \
                         this one unmounts it at a clean stop",
                        mount.display()
                    );
                    out.mounted.push(MountedFs {
                        fstype: "bpf".into(),
                        path: mount,
                        adopted: true,
                    });
                }
            }
            BpffsPlan::Refuse(why) => bail!("{why}"),
            BpffsPlan::Mount { target } => {
                out.create_dirs(&target, || bpffs_fix(&target))?;
                mount_fs("bpf", &target, "mode=0755").map_err(|e| {
                    anyhow::anyhow!(
                        "no BPF filesystem holds --bpffs-dir {} and mounting one at {} failed: {e}; \
                         mount it before starting the agent: `{}`",
                        pin_dir.display(),
                        target.display(),
                        bpffs_fix(&target)
                    )
                })?;
                log::info!(
                    "mounted a BPF filesystem at {} for the pins (none was mounted there in this mount \
                     namespace, e.g. under `ip netns exec`, which mounts its own /sys); the agent \
                     unmounts it at a clean stop",
                    target.display()
                );
                out.mounted.push(MountedFs {
                    fstype: "bpf".into(),
                    path: target,
                    adopted: false,
                });
            }
        }
        let cg_target = absolute(state_dir)?.join(CGROUP2_DIR);
        match plan_cgroup2(&table, &cg_target) {
            Cgroup2Plan::Present { mount, ours } => {
                if ours {
                    log::info!(
                        "the cgroup2 hierarchy at {} was mounted by a previous agent in this mount namespace: \
                         this one unmounts it at a clean stop",
                        mount.display()
                    );
                    out.mounted.push(MountedFs {
                        fstype: "cgroup2".into(),
                        path: mount,
                        adopted: true,
                    });
                }
            }
            Cgroup2Plan::Mount { target } => {
                out.create_dirs(&target, || cgroup2_fix(&target))?;
                match mount_fs("cgroup2", &target, "") {
                    Ok(()) => {
                        log::info!(
                            "mounted a cgroup2 hierarchy at {} for sock_ops (none was mounted in this mount \
                             namespace); the agent unmounts it at a clean stop",
                            target.display()
                        );
                        out.mounted.push(MountedFs {
                            fstype: "cgroup2".into(),
                            path: target,
                            adopted: false,
                        });
                    }
                    // The kernel has no cgroup v2: sock_ops is unavailable, as the feature
                    // probe then says.
                    Err(nix::errno::Errno::ENODEV) => {
                        log::warn!(
                            "this kernel has no cgroup2 file system to mount at {}",
                            target.display()
                        );
                        out.remove_created();
                    }
                    Err(e) => bail!(
                        "no cgroup2 hierarchy is mounted and mounting one at {} failed: {e}; sock_ops needs \
                         one: mount it before starting the agent: `{}`",
                        target.display(),
                        cgroup2_fix(&target)
                    ),
                }
            }
        }
        Ok(out)
    }

    /// What the agent mounted (or took over from a previous agent).
    pub fn mounted(&self) -> &[MountedFs] {
        &self.mounted
    }

    /// Unmounts what the agent mounted: cgroup2 always, a BPF filesystem when it is empty (the
    /// pins removed). Each step is logged.
    pub fn release(mut self) {
        self.release_all();
    }

    fn release_all(&mut self) {
        for m in std::mem::take(&mut self.mounted).into_iter().rev() {
            if m.fstype == "bpf" && holds_pins(&m.path) {
                log::warn!(
                    "left the BPF filesystem at {} mounted: it still holds pins (a running datapath's, \
                     or another program's)",
                    m.path.display()
                );
                continue;
            }
            match nix::mount::umount2(&m.path, nix::mount::MntFlags::empty()) {
                Ok(()) => log::info!(
                    "unmounted the {} the agent mounted at {}",
                    m.fstype,
                    m.path.display()
                ),
                Err(e) => log::warn!("unmounting {} at {}: {e}", m.fstype, m.path.display()),
            }
            if m.fstype == "cgroup2" {
                // The agent's own directory in its state directory.
                let _ = std::fs::remove_dir(&m.path);
            }
        }
        self.remove_created();
    }

    /// Creates `target` and its missing ancestors, remembering them.
    fn create_dirs(&mut self, target: &Path, fix: impl Fn() -> String) -> Result<()> {
        let mut missing = Vec::new();
        let mut p = target;
        while !p.exists() {
            missing.push(p.to_path_buf());
            match p.parent() {
                Some(q) => p = q,
                None => break,
            }
        }
        for d in missing.into_iter().rev() {
            if let Err(e) = std::fs::create_dir(&d) {
                self.remove_created();
                bail!(
                    "cannot create {} to mount on: {e}; mount it before starting the agent: `{}`",
                    d.display(),
                    fix()
                );
            }
            self.created.push(d);
        }
        Ok(())
    }

    fn remove_created(&mut self) {
        for d in std::mem::take(&mut self.created).into_iter().rev() {
            let _ = std::fs::remove_dir(&d);
        }
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        self.release_all();
    }
}

/// The files the kernel puts in every new BPF filesystem when `bpf_preload` is loaded (its
/// iterators), not pins of anyone's.
const PRELOADED: &[&str] = &["maps.debug", "progs.debug"];

/// Whether the BPF filesystem at `root` holds anything but the kernel's own files.
fn holds_pins(root: &Path) -> bool {
    std::fs::read_dir(root).is_ok_and(|d| {
        d.flatten()
            .any(|e| !PRELOADED.contains(&e.file_name().to_string_lossy().as_ref()))
    })
}

fn mount_fs(fstype: &str, target: &Path, data: &str) -> Result<(), nix::errno::Errno> {
    use nix::mount::MsFlags;
    nix::mount::mount(
        Some(SOURCE),
        target,
        Some(fstype),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        (!data.is_empty()).then_some(data),
    )
}

fn read_mountinfo() -> Result<Vec<MountEntry>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| anyhow::anyhow!("reading /proc/self/mountinfo: {e}"))?;
    Ok(parse_mountinfo(&text))
}

/// `p` made absolute against the working directory, `.` and `..` resolved lexically.
fn absolute(p: &Path) -> Result<PathBuf> {
    let joined = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    };
    let mut out = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    Ok(out)
}

/// The deepest of `p` and its ancestors that exists (`/` at worst).
fn deepest_existing(p: &Path) -> PathBuf {
    let mut q = p;
    loop {
        if q.symlink_metadata().is_ok() {
            return q.to_path_buf();
        }
        match q.parent() {
            Some(parent) => q = parent,
            None => return PathBuf::from("/"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mount table under `ip netns exec` on a host with bpffs and a hybrid cgroup layout
    /// (taken on the development machine): a fresh sysfs on /sys, nothing below it.
    const NETNS_EXEC: &str = "\
23 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
46 23 0:5 / /dev rw,nosuid master:2 - devtmpfs devtmpfs rw
47 23 0:22 / /proc rw,nosuid,nodev,noexec,relatime master:12 - proc proc rw
48 23 0:25 / /run rw,nosuid,nodev master:5 - tmpfs tmpfs rw,mode=755
49 46 0:40 / /sys rw,relatime - sysfs pltry rw
";

    /// The host's own table: bpffs at /sys/fs/bpf, cgroup2 at /sys/fs/cgroup/unified.
    const HOST: &str = "\
23 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
24 23 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 24 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:8 - tmpfs tmpfs ro,mode=755
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw
42 24 0:39 / /sys/fs/bpf rw,relatime shared:10 - bpf bpf rw
";

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn parses_mount_points_types_and_sources() {
        let t = parse_mountinfo(HOST);
        assert_eq!(t.len(), 5);
        assert_eq!(t[3].mount_point, p("/sys/fs/cgroup/unified"));
        assert_eq!(t[3].fstype, "cgroup2");
        assert_eq!(t[4].source, "bpf");
        let odd = parse_mountinfo("50 23 0:41 / /mnt/my\\040pins rw - bpf paceline rw,mode=755\n");
        assert_eq!(odd[0].mount_point, p("/mnt/my pins"));
        assert_eq!(odd[0].source, SOURCE);
    }

    #[test]
    fn covering_mount_is_the_longest_and_the_topmost() {
        let t = parse_mountinfo(HOST);
        assert_eq!(covering(&t, &p("/sys/fs/bpf/paceline")).unwrap().fstype, "bpf");
        assert_eq!(covering(&t, &p("/sys/fs/bpfx")).unwrap().fstype, "sysfs");
        assert_eq!(covering(&t, &p("/var/lib")).unwrap().fstype, "ext4");
        let stacked = format!("{HOST}60 42 0:50 / /sys/fs/bpf rw - tmpfs none rw\n");
        let t = parse_mountinfo(&stacked);
        assert_eq!(covering(&t, &p("/sys/fs/bpf/x")).unwrap().fstype, "tmpfs");
    }

    #[test]
    fn host_with_bpffs_and_cgroup2_mounts_nothing() {
        let t = parse_mountinfo(HOST);
        assert_eq!(
            plan_bpffs(&t, &p("/sys/fs/bpf/paceline"), &p("/sys/fs/bpf")),
            BpffsPlan::Present {
                mount: p("/sys/fs/bpf"),
                ours: false
            }
        );
        assert_eq!(
            plan_cgroup2(&t, &p("/run/paceline/cgroup2")),
            Cgroup2Plan::Present {
                mount: p("/sys/fs/cgroup/unified"),
                ours: false
            }
        );
    }

    #[test]
    fn under_ip_netns_exec_mounts_bpffs_at_sys_fs_bpf_and_cgroup2_in_the_state_dir() {
        let t = parse_mountinfo(NETNS_EXEC);
        assert_eq!(
            plan_bpffs(&t, &p("/sys/fs/bpf/paceline"), &p("/sys/fs/bpf")),
            BpffsPlan::Mount {
                target: p("/sys/fs/bpf")
            }
        );
        assert_eq!(
            plan_cgroup2(&t, &p("/run/paceline/cgroup2")),
            Cgroup2Plan::Mount {
                target: p("/run/paceline/cgroup2")
            }
        );
    }

    #[test]
    fn a_pin_dir_elsewhere_gets_its_own_bpffs() {
        let t = parse_mountinfo(NETNS_EXEC);
        assert_eq!(
            plan_bpffs(&t, &p("/run/paceline-pins/x"), &p("/run")),
            BpffsPlan::Mount {
                target: p("/run/paceline-pins/x")
            }
        );
    }

    #[test]
    fn other_sysfs_directories_are_refused_with_the_fix() {
        let t = parse_mountinfo(NETNS_EXEC);
        let BpffsPlan::Refuse(why) = plan_bpffs(&t, &p("/sys/kernel/paceline"), &p("/sys/kernel")) else {
            panic!("a pin dir in sysfs outside /sys/fs/bpf must be refused");
        };
        assert!(why.contains("/sys/kernel/paceline"), "{why}");
        assert!(why.contains("`mount -t bpf bpf /sys/fs/bpf`"), "{why}");
    }

    #[test]
    fn the_agents_own_mounts_are_recognised_after_kill_9() {
        let ours = format!(
            "{NETNS_EXEC}60 49 0:50 / /sys/fs/bpf rw - bpf paceline rw,mode=755\n\
             61 48 0:51 / /run/paceline/cgroup2 rw - cgroup2 paceline rw\n"
        );
        let t = parse_mountinfo(&ours);
        assert_eq!(
            plan_bpffs(&t, &p("/sys/fs/bpf/paceline"), &p("/sys/fs/bpf")),
            BpffsPlan::Present {
                mount: p("/sys/fs/bpf"),
                ours: true
            }
        );
        assert_eq!(
            plan_cgroup2(&t, &p("/run/paceline/cgroup2")),
            Cgroup2Plan::Present {
                mount: p("/run/paceline/cgroup2"),
                ours: true
            }
        );
    }

    #[test]
    fn fixes_name_the_command() {
        assert_eq!(bpffs_fix(&p("/sys/fs/bpf")), "mount -t bpf bpf /sys/fs/bpf");
        assert_eq!(
            bpffs_fix(&p("/x/pins")),
            "mkdir -p /x/pins && mount -t bpf bpf /x/pins"
        );
        assert_eq!(
            cgroup2_fix(&p("/run/paceline/cgroup2")),
            "mkdir -p /run/paceline/cgroup2 && mount -t cgroup2 cgroup2 /run/paceline/cgroup2"
        );
    }

    #[test]
    fn absolute_resolves_dots() {
        assert_eq!(absolute(&p("/a/b/../c/./d")).unwrap(), p("/a/c/d"));
    }
}
