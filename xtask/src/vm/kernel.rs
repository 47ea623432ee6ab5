//! The VM kernels: Debian 12's stock `linux-image-6.1.0-NN-amd64` and
//! `linux-image-6.12.NNN+deb12-amd64` (the two [`Series`]), each fetched once with apt and
//! prepared in a cache directory (uncompressed vmlinux, module tree uncompressed and without
//! signatures, generated `modules.dep`/`modules.alias`). See the module docs of `vm.rs`.

use anyhow::{Context, Result, anyhow, bail};
use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::modules::prepare_modules;

/// Bumped whenever the layout or the preparation steps of a cached kernel change.
const CACHE_FORMAT: &str = "paceline-vm-kernel-cache v2";
const READY_MARKER: &str = ".ready";

/// A Debian 12 kernel series the VM can boot. Releases are `<stem><N><suffix>` (`N` the
/// Debian ABI for 6.1, the upstream patch level for 6.12); packages are
/// `linux-image-<release>[-unsigned]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Series {
    /// What `--kernel` calls it: `6.1`, `6.12`.
    pub name: &'static str,
    stem: &'static str,
    suffix: &'static str,
    /// What it offers the agent, for messages and the README (checked against the agent's
    /// own probe by `cargo xtask test`).
    pub offers: &'static str,
}

/// Every series `--kernel all` runs, oldest first.
pub const SERIES: &[Series] = &[
    Series {
        name: "6.1",
        stem: "6.1.0-",
        suffix: "-amd64",
        offers: "clsact, sch_fq",
    },
    Series {
        name: "6.12",
        stem: "6.12.",
        suffix: "+deb12-amd64",
        offers: "tcx, sch_fq",
    },
];

impl Series {
    pub fn by_name(name: &str) -> Option<Series> {
        SERIES.iter().copied().find(|s| s.name == name)
    }

    fn release(&self, n: u32) -> String {
        format!("{}{n}{}", self.stem, self.suffix)
    }

    /// `N` of a release of this series (`6.12.117+deb12-amd64` -> 117).
    fn parse_release(&self, release: &str) -> Option<u32> {
        release
            .strip_prefix(self.stem)?
            .strip_suffix(self.suffix)?
            .parse()
            .ok()
    }

    /// `N` of a version the user wrote: `6.1.0-55`, `6.1.0-55-amd64`, `6.12.107`,
    /// `6.12.107+deb12-amd64`, `linux-image-...`.
    fn parse_user(&self, v: &str) -> Option<u32> {
        let v = v.trim_start_matches("linux-image-");
        let v = v.strip_suffix("-unsigned").unwrap_or(v);
        let rest = v.strip_prefix(self.stem)?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let tail = &rest[digits.len()..];
        if !(tail.is_empty() || tail == self.suffix) {
            return None;
        }
        digits.parse().ok()
    }

    /// `N` of a package name of this series, if it is the plain amd64 flavour.
    fn parse_package(&self, pkg: &str) -> Option<u32> {
        let r = pkg.strip_prefix("linux-image-")?;
        self.parse_release(r.strip_suffix("-unsigned").unwrap_or(r))
    }
}

/// A kernel ready to boot: an image for `qemu -kernel` and its module tree.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// `uname -r` of the VM kernel, e.g. `6.1.0-57-amd64`.
    pub release: String,
    /// The image qemu boots (the uncompressed ELF vmlinux when we could extract it).
    pub image: PathBuf,
    /// `<...>/lib/modules/<release>`.
    pub modules_dir: PathBuf,
    /// Where derived files (the initramfs, probes) are written for this kernel.
    pub work_dir: PathBuf,
    /// Where it came from, for messages ("Debian package ...", "PACELINE_VM_KERNEL=...").
    pub origin: String,
}

impl Kernel {
    /// The kernel's build configuration (`CONFIG_X=y|m`), when the cache has it.
    pub fn config(&self) -> HashMap<String, String> {
        fs::read_to_string(self.work_dir.join("config"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
            .collect()
    }
}

/// The root of the cache: `PACELINE_VM_CACHE`, else `/var/cache/paceline/vm` when writable
/// (we are root on the project's machines), else `~/.cache/paceline/vm`.
pub fn cache_root() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("PACELINE_VM_CACHE") {
        let p = PathBuf::from(p);
        fs::create_dir_all(&p).with_context(|| format!("creating PACELINE_VM_CACHE {}", p.display()))?;
        return Ok(p);
    }
    let sys = PathBuf::from("/var/cache/paceline/vm");
    if fs::create_dir_all(&sys).is_ok() && is_writable(&sys) {
        return Ok(sys);
    }
    let home = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .ok_or_else(|| anyhow!("no writable cache directory: set PACELINE_VM_CACHE"))?;
    let p = home.join("paceline/vm");
    fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
    Ok(p)
}

fn is_writable(p: &Path) -> bool {
    let probe = p.join(format!(".w-{}", std::process::id()));
    let ok = fs::write(&probe, b"").is_ok();
    let _ = fs::remove_file(&probe);
    ok
}

/// `PACELINE_VM_KERNEL` when it names a directory: a custom kernel that replaces the Debian
/// ones (one VM run, not one per series).
pub fn custom_dir() -> Option<PathBuf> {
    std::env::var_os("PACELINE_VM_KERNEL")
        .map(PathBuf::from)
        .filter(|p| !p.as_os_str().is_empty() && p.is_dir())
}

/// Finds (and if needed fetches and prepares) the kernel of `series` to boot.
///
/// `PACELINE_VM_KERNEL` overrides the choice:
/// - a directory: either a prepared cache entry, or any tree holding a kernel image
///   (`vmlinux`, `vmlinuz*`, `bzImage` or `boot/vmlinuz-*`) and `lib/modules/<release>/`
///   (e.g. an unpacked `linux-image-*.deb`); it is used read-only, whatever the series;
/// - a Debian version of a series, such as `6.1.0-55` or `6.12.107`: that package instead of
///   the newest of its series (the other series keep the newest).
pub fn ensure(series: Series) -> Result<Kernel> {
    let root = cache_root()?;
    if let Some(dir) = custom_dir() {
        return from_dir(&dir, &root);
    }
    match std::env::var("PACELINE_VM_KERNEL") {
        Ok(v) if !v.is_empty() => {
            if !SERIES.iter().any(|s| s.parse_user(&v).is_some()) {
                bail!(
                    "PACELINE_VM_KERNEL={v}: neither a directory nor a Debian version like 6.1.0-55 or 6.12.107"
                );
            }
            ensure_debian(&root, series, series.parse_user(&v))
        }
        _ => ensure_debian(&root, series, None),
    }
}

fn ensure_debian(root: &Path, series: Series, want: Option<u32>) -> Result<Kernel> {
    let is_ready = |d: &Path| {
        fs::read_to_string(d.join(READY_MARKER))
            .unwrap_or_default()
            .trim()
            == CACHE_FORMAT
    };
    let pick = |list: &[(u32, String)]| -> Option<(u32, String)> {
        match want {
            Some(n) => list.iter().find(|(a, _)| *a == n).cloned(),
            None => list.first().cloned(),
        }
    };
    let cached = cached_debian(root, series);
    let cached_pick = match want {
        Some(n) => cached.iter().find(|(a, _)| *a == n),
        None => cached.first(),
    }
    .map(|(_, d)| d.clone());
    // What apt knows, newest first (a local look-up, no network).
    let mut known = apt_kernels(series);
    let mut updated = false;
    if pick(&known).is_none() {
        // apt knows nothing usable: use the cache when it has the kernel, else refresh the lists.
        if let Some(dir) = &cached_pick {
            return load_prepared(dir, "Debian package (cached)");
        }
        apt_update()?;
        updated = true;
        known = apt_kernels(series);
    }
    loop {
        let (abi, pkg) = pick(&known).ok_or_else(|| match want {
            Some(n) => anyhow!(
                "apt has no linux-image-{}[-unsigned] package",
                series.release(n)
            ),
            None => anyhow!(
                "apt has no linux-image-{}*{} package (Debian 12 'bookworm' sources needed, with bookworm-security for 6.12)",
                series.stem,
                series.suffix
            ),
        })?;
        let release = series.release(abi);
        let dir = root.join(&release);
        let origin = format!("Debian package {pkg}");
        if is_ready(&dir) {
            return load_prepared(&dir, &origin);
        }
        let lock = Flock::exclusive(&root.join(".lock"))?;
        if is_ready(&dir) {
            return load_prepared(&dir, &origin);
        }
        // leftovers of runs killed while preparing (we hold the lock: nobody else is staging)
        if let Ok(rd) = fs::read_dir(root) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with(".staging-") {
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
        eprintln!(
            "vm: fetching Debian kernel {release} ({pkg}) into {} (once)...",
            dir.display()
        );
        let t0 = std::time::Instant::now();
        match fetch_and_prepare(root, &pkg, &release, &dir) {
            Ok(()) => {
                eprintln!(
                    "vm: kernel {release} prepared in {:.1} s",
                    t0.elapsed().as_secs_f64()
                );
                return load_prepared(&dir, &origin);
            }
            // stale package lists name a file the archive no longer has: refresh once, retry
            Err(e) if !updated && apt_update().is_ok() => {
                eprintln!("vm: warning: {e:#}; retrying with refreshed package lists");
                updated = true;
                known = apt_kernels(series);
                drop(lock);
            }
            Err(e) => {
                // offline: an older prepared kernel still does the job
                if let Some(old) = &cached_pick {
                    eprintln!(
                        "vm: warning: {e:#}\nvm: using the cached kernel in {} instead",
                        old.display()
                    );
                    return load_prepared(old, "Debian package (cached; newer one not fetched)");
                }
                return Err(e);
            }
        }
    }
}

fn apt_update() -> Result<()> {
    eprintln!("vm: refreshing apt's package lists (apt-get update)...");
    let out = Command::new("apt-get")
        .args(["update", "-qq"])
        .stdin(Stdio::null())
        .output()
        .context("running apt-get update (is this Debian?)")?;
    if !out.status.success() {
        bail!(
            "apt-get update failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Prepared kernels of `series` in the cache, newest first.
fn cached_debian(root: &Path, series: Series) -> Vec<(u32, PathBuf)> {
    let mut v = Vec::new();
    if let Ok(rd) = fs::read_dir(root) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(abi) = series.parse_release(&name)
                && fs::read_to_string(e.path().join(READY_MARKER))
                    .unwrap_or_default()
                    .trim()
                    == CACHE_FORMAT
            {
                v.push((abi, e.path()));
            }
        }
    }
    v.sort_by_key(|(abi, _)| std::cmp::Reverse(*abi));
    v
}

/// `linux-image-<release>[-unsigned]` packages of `series` apt can install, newest first,
/// the unsigned flavour preferred (same kernel and modules, no secure-boot wrapper).
/// apt-cache takes ~1 s per call here, so the answer is remembered in the cache until apt's
/// package lists change.
fn apt_kernels(series: Series) -> Vec<(u32, String)> {
    let lists_mtime = fs::metadata("/var/lib/apt/lists")
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_nanos().to_string());
    let memo = cache_root()
        .ok()
        .map(|r| r.join(format!("apt-kernels-{}", series.name)));
    if let (Some(stamp), Some(memo)) = (&lists_mtime, &memo)
        && let Ok(text) = fs::read_to_string(memo)
    {
        let mut lines = text.lines();
        if lines.next() == Some(stamp.as_str()) {
            return lines
                .filter_map(|l| l.split_once(' '))
                .filter_map(|(a, n)| Some((a.parse().ok()?, n.to_string())))
                .collect();
        }
    }
    let res = apt_kernels_uncached(series);
    if let (Some(stamp), Some(memo), false) = (&lists_mtime, &memo, res.is_empty()) {
        let body: String = res.iter().map(|(a, n)| format!("{a} {n}\n")).collect();
        let _ = fs::write(memo, format!("{stamp}\n{body}"));
    }
    res
}

fn apt_kernels_uncached(series: Series) -> Vec<(u32, String)> {
    let out = match Command::new("apt-cache")
        .args(["pkgnames", &format!("linux-image-{}", series.stem)])
        .stderr(Stdio::null())
        .output()
    {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(_) => return Vec::new(),
    };
    let mut names: Vec<(u32, String)> = out
        .lines()
        .map(str::trim)
        .filter_map(|name| Some((series.parse_package(name)?, name.to_string())))
        .collect();
    if names.is_empty() {
        return names;
    }
    // pkgnames also lists names that are only referenced; keep those with a candidate version
    // (one apt-cache call for all of them).
    let shown = Command::new("apt-cache")
        .args(["show", "--no-all-versions"])
        .args(names.iter().map(|(_, n)| n))
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let available: HashSet<&str> = shown
        .lines()
        .filter_map(|l| l.strip_prefix("Package: "))
        .map(str::trim)
        .collect();
    names.retain(|(_, n)| available.contains(n.as_str()));
    // newest first; within a version the unsigned flavour first
    names.sort_by(|a, b| {
        b.0.cmp(&a.0)
            .then_with(|| b.1.ends_with("-unsigned").cmp(&a.1.ends_with("-unsigned")))
    });
    names.dedup_by_key(|(a, _)| *a);
    names
}

fn fetch_and_prepare(root: &Path, pkg: &str, release: &str, dir: &Path) -> Result<()> {
    let staging = root.join(format!(".staging-{release}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(&staging)?;
    let guard = RemoveOnDrop(staging.clone());
    // apt's sandbox user must be able to write the download directory.
    fs::set_permissions(&staging, fs::Permissions::from_mode(0o777))?;
    let out = Command::new("apt-get")
        .args(["download", "-q", pkg])
        .current_dir(&staging)
        .stdin(Stdio::null())
        .output()
        .context("running apt-get download")?;
    if !out.status.success() {
        bail!(
            "apt-get download {pkg} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    fs::set_permissions(&staging, fs::Permissions::from_mode(0o755))?;
    let deb = fs::read_dir(&staging)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .ok_or_else(|| anyhow!("apt-get download {pkg} produced no .deb"))?;
    let x = staging.join("x");
    let st = Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(&x)
        .status()
        .context("running dpkg-deb")?;
    if !st.success() {
        bail!("dpkg-deb -x {} failed ({st})", deb.display());
    }
    fs::remove_file(&deb)?;
    let out_dir = staging.join("kernel");
    fs::create_dir_all(out_dir.join("lib/modules"))?;
    let mods = [
        x.join("lib/modules").join(release),
        x.join("usr/lib/modules").join(release),
    ]
    .into_iter()
    .find(|p| p.is_dir())
    .ok_or_else(|| anyhow!("{pkg} has no lib/modules/{release}"))?;
    fs::rename(&mods, out_dir.join("lib/modules").join(release))?;
    let vmlinuz = x.join("boot").join(format!("vmlinuz-{release}"));
    for f in ["config", "System.map"] {
        let p = x.join("boot").join(format!("{f}-{release}"));
        if p.is_file() {
            fs::rename(&p, out_dir.join(f))?;
        }
    }
    fs::rename(&vmlinuz, out_dir.join("vmlinuz"))
        .with_context(|| format!("{pkg} has no boot/vmlinuz-{release}"))?;
    prepare_image(&out_dir.join("vmlinuz"), &out_dir.join("vmlinux"));
    prepare_modules(&out_dir.join("lib/modules").join(release))?;
    fs::write(out_dir.join(READY_MARKER), format!("{CACHE_FORMAT}\n"))?;
    fs::write(out_dir.join("SOURCE"), format!("{pkg}\n"))?;
    let _ = fs::remove_dir_all(dir); // an unfinished/older-format entry
    fs::rename(&out_dir, dir).with_context(|| format!("moving the prepared kernel to {}", dir.display()))?;
    drop(guard);
    Ok(())
}

/// Extracts the uncompressed vmlinux out of a bzImage (under TCG, the kernel's own
/// decompressor costs ~7 s of boot time; the ELF vmlinux boots via PVH straight away).
/// On failure, leaves no vmlinux and says so: the bzImage is booted instead.
fn prepare_image(bzimage: &Path, vmlinux: &Path) {
    match extract_vmlinux(bzimage) {
        Ok(elf) => {
            let tmp = vmlinux.with_extension("tmp");
            if let Err(e) = fs::write(&tmp, &elf).and_then(|_| fs::rename(&tmp, vmlinux)) {
                eprintln!(
                    "vm: warning: cannot write {}: {e}; booting the compressed kernel (slower)",
                    vmlinux.display()
                );
            }
        }
        Err(e) => eprintln!(
            "vm: warning: cannot extract vmlinux from {}: {e:#}; booting the compressed kernel (slower)",
            bzimage.display()
        ),
    }
}

pub fn extract_vmlinux(bzimage: &Path) -> Result<Vec<u8>> {
    let d = fs::read(bzimage)?;
    if d.len() < 0x250 || &d[0x202..0x206] != b"HdrS" {
        bail!("not an x86 bzImage");
    }
    let setup_sects = match d[0x1f1] {
        0 => 4,
        n => n as usize,
    };
    let u32le = |o: usize| u32::from_le_bytes(d[o..o + 4].try_into().unwrap()) as usize;
    let (off, len) = ((setup_sects + 1) * 512 + u32le(0x248), u32le(0x24c));
    let payload = d
        .get(off..off + len)
        .ok_or_else(|| anyhow!("payload out of bounds"))?;
    let out = if payload.starts_with(b"\xfd7zXZ\x00") {
        unxz_kernel(payload)?
    } else if payload.starts_with(b"\x28\xb5\x2f\xfd") {
        // Debian's 6.12 compresses the kernel with zstd; one frame, then the size field.
        let mut out = Vec::with_capacity(80 << 20);
        let mut dec = ruzstd::decoding::StreamingDecoder::new(payload)
            .map_err(|e| anyhow!("zstd frame header: {e}"))?;
        std::io::Read::read_to_end(&mut dec, &mut out).context("zstd decompression")?;
        out
    } else {
        bail!(
            "payload is neither xz nor zstd (magic {:02x?})",
            &payload[..6.min(payload.len())]
        );
    };
    if !out.starts_with(b"\x7fELF") {
        bail!("decompressed payload is not an ELF file");
    }
    Ok(out)
}

/// The kernel's xz stream uses the x86 BCJ filter; liblzma handles it. The 4 bytes after the
/// stream (uncompressed size) are ignored by the single-stream decoder.
fn unxz_kernel(payload: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(80 << 20);
    let mut s = xz2::stream::Stream::new_stream_decoder(u64::MAX, 0).context("liblzma")?;
    let mut input = payload;
    loop {
        if out.capacity() - out.len() < (1 << 20) {
            out.reserve(16 << 20);
        }
        let before = s.total_in();
        let status = s
            .process_vec(input, &mut out, xz2::stream::Action::Run)
            .context("xz decompression")?;
        input = &input[(s.total_in() - before) as usize..];
        if status == xz2::stream::Status::StreamEnd {
            break; // what follows is the kernel's appended size field
        }
        if input.is_empty() && s.total_in() == before && out.capacity() > out.len() {
            bail!("xz stream truncated");
        }
    }
    Ok(out)
}

fn load_prepared(dir: &Path, origin: &str) -> Result<Kernel> {
    let mods_root = dir.join("lib/modules");
    let release = fs::read_dir(&mods_root)
        .with_context(|| format!("{} has no lib/modules", dir.display()))?
        .flatten()
        .filter(|e| e.path().join("modules.dep").is_file() || e.path().join("kernel").is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .max()
        .ok_or_else(|| anyhow!("{} has no lib/modules/<release>", dir.display()))?;
    let image = if dir.join("vmlinux").is_file() {
        dir.join("vmlinux")
    } else {
        dir.join("vmlinuz")
    };
    Ok(Kernel {
        modules_dir: mods_root.join(&release),
        release,
        image,
        work_dir: dir.to_path_buf(),
        origin: origin.to_string(),
    })
}

/// `PACELINE_VM_KERNEL=<dir>`: the directory is only read. Unless it already has the cache
/// layout, its kernel is imported once into `<cache>/custom-<release>-<hash>/` (image made an
/// ELF vmlinux, module tree copied without signatures, modules.dep generated), keyed by the
/// directory's path and the image's and module tree's modification times.
fn from_dir(dir: &Path, root: &Path) -> Result<Kernel> {
    let dir = fs::canonicalize(dir)?;
    let origin = format!("PACELINE_VM_KERNEL={}", dir.display());
    if fs::read_to_string(dir.join(READY_MARKER))
        .unwrap_or_default()
        .trim()
        == CACHE_FORMAT
    {
        return load_prepared(&dir, &origin);
    }
    let mods_root = dir.join("lib/modules");
    let release = fs::read_dir(&mods_root)
        .with_context(|| format!("{origin}: no lib/modules/<release> inside"))?
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .max()
        .ok_or_else(|| anyhow!("{origin}: lib/modules is empty"))?;
    let candidates = [
        dir.join("vmlinux"),
        dir.join("vmlinuz"),
        dir.join("bzImage"),
        dir.join(format!("vmlinuz-{release}")),
        dir.join("boot").join(format!("vmlinuz-{release}")),
        dir.join("arch/x86/boot/bzImage"),
    ];
    let img = candidates
        .iter()
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow!("{origin}: no vmlinux/vmlinuz/bzImage found"))?;
    let mtime = |p: &Path| {
        fs::metadata(p)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    };
    let moddir = mods_root.join(&release);
    let key = format!("{}|{}|{}", dir.display(), mtime(img), mtime(&moddir));
    let work = root.join(format!("custom-{release}-{:016x}", hash_str(&key)));
    let ready = || {
        fs::read_to_string(work.join(READY_MARKER))
            .unwrap_or_default()
            .trim()
            == CACHE_FORMAT
    };
    if !ready() {
        let _lock = Flock::exclusive(&root.join(".lock"))?;
        if !ready() {
            eprintln!(
                "vm: importing the kernel {release} from {} into {} (once)...",
                dir.display(),
                work.display()
            );
            let staging = root.join(format!(".staging-custom-{}", std::process::id()));
            let _ = fs::remove_dir_all(&staging);
            let guard = RemoveOnDrop(staging.clone());
            let target = staging.join("lib/modules").join(&release);
            copy_tree(&moddir, &target)?;
            let data = fs::read(img)?;
            if data.starts_with(b"\x7fELF") {
                fs::write(staging.join("vmlinux"), &data)?;
            } else {
                fs::write(staging.join("vmlinuz"), &data)?;
                prepare_image(&staging.join("vmlinuz"), &staging.join("vmlinux"));
            }
            prepare_modules(&target)?;
            fs::write(staging.join("SOURCE"), format!("{}\n", dir.display()))?;
            fs::write(staging.join(READY_MARKER), format!("{CACHE_FORMAT}\n"))?;
            let _ = fs::remove_dir_all(&work);
            fs::rename(&staging, &work)?;
            drop(guard);
        }
    }
    load_prepared(&work, &origin)
}

/// Copies directories and regular files (not symlinks: a module tree's `build`/`source` links
/// point into kernel sources).
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to)?;
    for e in fs::read_dir(from)
        .with_context(|| format!("reading {}", from.display()))?
        .flatten()
    {
        let ft = e.file_type()?;
        let dst = to.join(e.file_name());
        if ft.is_dir() {
            copy_tree(&e.path(), &dst)?;
        } else if ft.is_file() {
            fs::copy(e.path(), &dst).with_context(|| format!("copying {}", e.path().display()))?;
        }
    }
    Ok(())
}

pub fn hash_str(s: &str) -> u64 {
    // FNV-1a: stable across Rust releases (cache file names depend on it)
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

struct RemoveOnDrop(PathBuf);
impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// An advisory lock file (so that two first runs do not both download the kernel).
pub struct Flock(#[allow(dead_code)] fs::File);
impl Flock {
    pub fn exclusive(path: &Path) -> Result<Flock> {
        use std::os::fd::AsRawFd;
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            eprintln!(
                "vm: waiting for another run preparing the VM cache ({})...",
                path.display()
            );
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
                bail!("flock {}: {}", path.display(), std::io::Error::last_os_error());
            }
        }
        Ok(Flock(f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_parse_their_own_packages_and_versions_only() {
        let (s61, s612) = (SERIES[0], SERIES[1]);
        assert_eq!(s61.parse_package("linux-image-6.1.0-57-amd64"), Some(57));
        assert_eq!(s61.parse_package("linux-image-6.1.0-57-amd64-unsigned"), Some(57));
        assert_eq!(s61.parse_package("linux-image-6.1.0-57-cloud-amd64"), None);
        assert_eq!(s61.parse_package("linux-image-6.1.0-57-amd64-dbg"), None);
        assert_eq!(
            s612.parse_package("linux-image-6.12.117+deb12-amd64-unsigned"),
            Some(117)
        );
        assert_eq!(s612.parse_package("linux-image-6.12.117+deb12-rt-amd64"), None);
        assert_eq!(s612.parse_package("linux-image-6.1.0-57-amd64"), None);
        assert_eq!(s612.release(117), "6.12.117+deb12-amd64");
        assert_eq!(s61.parse_release("6.12.117+deb12-amd64"), None);
        assert_eq!(s61.parse_user("6.1.0-55"), Some(55));
        assert_eq!(s61.parse_user("6.1.0-55-amd64"), Some(55));
        assert_eq!(s612.parse_user("6.12.107"), Some(107));
        assert_eq!(s612.parse_user("linux-image-6.12.107+deb12-amd64"), Some(107));
        assert_eq!(s612.parse_user("6.1.0-55"), None);
    }
}
