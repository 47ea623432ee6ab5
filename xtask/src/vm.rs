//! `cargo xtask vm ...`: runs a command inside a VM booting one of Debian 12's stock kernels,
//! 6.1 (clsact) or 6.12 (tcx), where the qdiscs the project needs (sch_fq above all, which
//! enforces EDT timestamps) exist as modules.
//!
//! # Commands
//! Every command takes `--kernel 6.1|6.12|all` (or a comma-separated list): `run` boots 6.1
//! unless told otherwise (with several kernels, one after the other; the exit status is the
//! first non-zero one), `fetch`, `info` and `selftest` do every kernel by default.
//! - `cargo xtask vm run [--timeout SECS] [--mem MiB] [--smp N] [--module M]... [--env K=V]...
//!   [--cwd DIR] [--verbose] -- <command> [args...]`: boots, runs the command, streams its
//!   stdout/stderr live and exits with its exit status. A kernel panic or oops, a timeout
//!   (default 600 s), a failed boot or Ctrl-C fails the run (exit 1, 130 for a signal) with a
//!   message saying which. Defaults: 2048 MiB, 2 vCPUs.
//! - `cargo xtask vm fetch`: only prepares the cache (kernel, initramfs, KVM probe); prints what
//!   `info` prints.
//! - `cargo xtask vm info`: prints the kernel, the accelerator and the paths in use.
//! - `cargo xtask vm selftest`: proves the harness: fq, clsact, veth, mounts, cwd and
//!   environment in the VM, a file written to the share shows up on the host, `false` fails.
//!
//! # Boot flow (about 4 s under TCG on an idle 2-core host, 6-8 s when it is busy compiling)
//! 1. Kernel (`vm/kernel.rs`): the newest `linux-image-6.1.0-NN-amd64-unsigned` (else the signed
//!    `linux-image-6.1.0-NN-amd64`), or for 6.12 `linux-image-6.12.NNN+deb12-amd64[-unsigned]`
//!    (bookworm-security), that `apt-cache` lists is fetched with `apt-get download`,
//!    unpacked with `dpkg-deb -x`, and prepared once. `apt-get update` runs only when apt lists
//!    no such package and none is cached, or when the download fails (stale lists); offline,
//!    the newest cached kernel is used. Preparation: the ELF `vmlinux` is extracted from the
//!    bzImage (6.1: xz with the x86 BCJ filter, via liblzma; 6.12: zstd, via ruzstd) because
//!    under TCG the kernel's own decompressor costs ~7 s of boot; 6.12's `.ko.xz` modules are
//!    decompressed (busybox insmod cannot; the module tree: `vm/modules.rs`); module
//!    signatures are stripped (checking them costs ~60 ms per module under TCG; sig_enforce
//!    is off, so the kernel loads them and marks
//!    itself tainted `E`); `modules.dep` and `modules.alias` (without device-ID aliases) are
//!    generated from each module's `.modinfo` (no kmod needed on the host). Modules built into
//!    a kernel (`modules.builtin`: virtio_pci and virtio_console in 6.12) are not loaded.
//!    Both kernels have as modules: sch_fq, sch_htb, sch_tbf, sch_ingress (clsact), cls_bpf,
//!    act_bpf, veth, bridge, 8021q, tun ([`DEFAULT_MODULES`]), 9pnet_virtio, 9p, overlay; 6.12
//!    has tcx built in (`CONFIG_NET_XGRESS=y`), 6.1 predates it.
//! 2. Initramfs (`vm/initramfs.rs`): the host's static busybox (busybox-static), the modules
//!    needed to reach the host (virtio_pci, virtio_console, 9pnet_virtio, 9p, overlay and
//!    their dependencies, insmod-ed in dependency order by `/init`), and `/init` itself, a
//!    busybox shell script. Rebuilt automatically when the script changes.
//! 3. qemu (`vm/qemu.rs`): `qemu-system-x86_64 -bios qboot.rom -kernel vmlinux -initrd ...`,
//!    KVM (`-cpu host`) when a probe boot shows it works (cached per host boot: `/dev/kvm` may
//!    exist and still hang guests under nested virtualisation, as on the dev machines), else
//!    TCG (`-accel tcg,thread=multi -cpu max`). No network device (`-nic none`): the guest has
//!    loopback only. Kernel command line: `console=ttyS0 quiet loglevel=3 panic=-1 oops=panic
//!    mitigations=off pci=noacpi tsc=reliable ...` (each one is there for boot time or for
//!    failing fast; see `qemu::cmdline`).
//! 4. `/init` in the guest: loads the early modules, mounts the host root read-only over 9p at
//!    /host (`cache=loose`), and builds the command's root: an overlayfs of the host root
//!    under a tmpfs (writes succeed and vanish with the VM), fresh proc, sysfs, devtmpfs,
//!    devpts, tmpfs on /tmp, /run, /var/tmp and /dev/shm (host paths under those that the
//!    command needs, its cwd or program, are bound back in), bpffs at /sys/fs/bpf, cgroup2 at
//!    /sys/fs/cgroup, debugfs, tracefs; binds the module tree at `/lib/modules/<release>`. In
//!    the background meanwhile it insmods the test modules ([`DEFAULT_MODULES`], plus
//!    `--module` and `PACELINE_VM_MODULES`). Any other module loads on demand: the kernel's
//!    autoloader runs busybox modprobe over the generated modules.dep/alias, so e.g.
//!    `tc qdisc add ... netem` or `ip link add ... type dummy` just work. Then `lo` up, and the
//!    command runs (chroot) in the host's current directory, with stdin /dev/null and a clean
//!    environment: RUST_LOG, RUST_BACKTRACE, RUST_LIB_BACKTRACE, PATH, HOME, CARGO_TARGET_DIR,
//!    every `PACELINE_*` variable, `--env` pairs, `PACELINE_IN_VM=1`, `PACELINE_VM_SHARE`.
//! 5. Channels: the command's stdout and stderr go to two virtio-serial ports, a third one
//!    carries status lines (`booted <uptime>`, `exit <code>`, `init-error <why>`). qemu connects
//!    each to a unix socket xtask listens on; xtask copies them to its own stdout/stderr as
//!    they come. The serial console (kernel messages of level error and worse, init's own
//!    diagnostics) goes to stderr as whole lines prefixed `vm| `. After `exit <code>`, init
//!    reboots (`-no-reboot` ends qemu) and `cargo xtask vm run` exits with `<code>`. No status
//!    (panic, init failure, qemu crash) or the timeout fails the run; Ctrl-C/SIGTERM stop qemu
//!    (own process group; SIGTERM, then SIGKILL; PR_SET_PDEATHSIG kills it if xtask dies).
//!
//! # Shares
//! - Host `/`, read-only, 9p tag `hostroot` (the command's root is an overlay of it: anything
//!   written outside the share, e.g. into the repo, is lost when the VM stops).
//! - `<repo>/target/vm-share`, read-write, 9p tag `vmshare`, mounted at the same path in the
//!   VM; its path is in `PACELINE_VM_SHARE`. Tests write results/logs there to bring them back.
//!
//! # Cache
//! `/var/cache/paceline/vm/` (override: `PACELINE_VM_CACHE`; when not writable:
//! `~/.cache/paceline/vm`), outside the repo so fresh clones reuse it:
//! `<release>/{vmlinux,vmlinuz,config,System.map,lib/modules/<release>/,initramfs-<hash>.cpio}`
//! (about 470 MB for 6.1, 570 MB for 6.12), `accel-<boot id>` (KVM probe result),
//! `apt-kernels-<series>` (apt's answer, reused until apt's lists change). Deleting any of it
//! is safe.
//!
//! # Environment
//! - `PACELINE_VM_KERNEL`: a Debian version (`6.1.0-55`, `6.12.107`) instead of the newest of
//!   its series (the other series keeps its newest), or a directory (replacing both series:
//!   one VM run) holding a kernel image (`vmlinux`, `vmlinuz`, `bzImage` or `boot/vmlinuz-<release>`) and
//!   `lib/modules/<release>/` (e.g. an unpacked .deb, or a kernel build with
//!   `make modules_install INSTALL_MOD_PATH=<dir>` and its bzImage copied there; modules may
//!   be .ko or .ko.xz). The directory is only read; it is imported once into the cache.
//! - `PACELINE_VM_ACCEL=kvm|tcg|auto`, `PACELINE_VM_QEMU=<path to qemu-system-x86_64>`,
//!   `PACELINE_VM_MODULES="m1 m2"` (more modules to preload), `PACELINE_VM_CACHE=<dir>`,
//!   `PACELINE_VM_APPEND="<kernel parameters>"`, `PACELINE_VM_DEBUG=1` (prints the qemu
//!   command line and /init's stage timings; `=2` also traces every /init command).

mod initramfs;
mod kernel;
mod modules;
mod qemu;
pub use qemu::EmulatorFault;

use anyhow::{Context, Result, bail};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use kernel::{Kernel, SERIES, Series};
pub use qemu::{Accel, Outcome, StdoutSink, install_signal_handlers, interrupted};

/// Modules loaded before the command runs (others load on demand through the autoloader).
pub const DEFAULT_MODULES: &[&str] = &[
    "sch_fq",
    "sch_htb",
    "sch_tbf",
    "sch_ingress", // also provides clsact
    "cls_bpf",
    "act_bpf",
    "veth",
    "bridge",
    "8021q",
    "tun", // so that /dev/net/tun exists (no udev/kmod static nodes in the VM)
           // not dummy/ifb: loading them creates dummy0/ifb0/ifb1; they autoload when asked for
];

/// Variables passed into the VM besides every `PACELINE_*`.
const PASS_ENV: &[&str] = &[
    "RUST_LOG",
    "RUST_BACKTRACE",
    "RUST_LIB_BACKTRACE",
    "PATH",
    "HOME",
    "CARGO_TARGET_DIR",
];

#[derive(clap::Args)]
pub struct Args {
    /// Which Debian kernel: 6.1, 6.12 or all (a comma-separated list works too). Default: 6.1
    /// for `run` (one after the other with several), every kernel for the other commands.
    #[arg(long, global = true, value_name = "6.1|6.12|all", value_parser = |s: &str| parse_series(s).map(Kernels))]
    kernel: Option<Kernels>,
    #[command(subcommand)]
    cmd: Cmd,
}

/// The value of `--kernel`.
#[derive(Clone, Debug)]
struct Kernels(Vec<Series>);

/// `--kernel` of the VM commands: `6.1`, `6.12`, `all`, or a comma-separated list.
pub fn parse_series(s: &str) -> Result<Vec<Series>, String> {
    let mut v: Vec<Series> = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let add: Vec<Series> = if part == "all" {
            SERIES.to_vec()
        } else {
            vec![Series::by_name(part).ok_or_else(|| {
                format!(
                    "unknown kernel '{part}' (valid: {}, all)",
                    SERIES.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
                )
            })?]
        };
        for k in add {
            if !v.contains(&k) {
                v.push(k);
            }
        }
    }
    if v.is_empty() {
        return Err("no kernel named".into());
    }
    Ok(v)
}

/// The kernels to boot for `selected`: a custom `PACELINE_VM_KERNEL` directory replaces them
/// all with itself (one run).
pub fn boot_list(selected: &[Series]) -> Vec<Series> {
    if kernel::custom_dir().is_some() {
        selected.iter().take(1).copied().collect()
    } else {
        selected.to_vec()
    }
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Boot the VM and run a command in it; exits with the command's exit status.
    Run(RunArgs),
    /// Fetch and prepare the VM kernel, initramfs and accelerator probe (cached).
    Fetch,
    /// Print the VM kernel, accelerator, cache and share paths.
    Info,
    /// Prove the harness works: fq in the VM, exit status, shared directory, environment.
    Selftest(VmFlags),
}

#[derive(clap::Args, Clone, Debug)]
pub struct VmFlags {
    /// Kill the VM after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 2048)]
    pub mem: u32,
    /// Guest vCPUs.
    #[arg(long, default_value_t = 2)]
    pub smp: u32,
    /// Show the whole kernel log (default: errors only).
    #[arg(long, short)]
    pub verbose: bool,
}

#[derive(clap::Args)]
struct RunArgs {
    #[command(flatten)]
    flags: VmFlags,
    /// Extra kernel module to load before the command (repeatable).
    #[arg(long = "module", value_name = "NAME")]
    modules: Vec<String>,
    /// Extra environment variable for the command (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Working directory in the VM (default: the current directory).
    #[arg(long)]
    cwd: Option<PathBuf>,
    /// The command and its arguments (after `--`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    command: Vec<String>,
}

pub fn run(a: Args) -> Result<()> {
    // errors here are the user's to fix (missing qemu, no network...): a message, no backtrace
    if let Err(e) = run_inner(a) {
        eprintln!("vm: error: {e:#}");
        std::process::exit(if interrupted().is_some() { 130 } else { 1 });
    }
    Ok(())
}

fn run_inner(a: Args) -> Result<()> {
    let every = a.kernel.clone().map(|k| k.0).unwrap_or_else(|| SERIES.to_vec());
    match a.cmd {
        Cmd::Run(r) => {
            let env = r
                .env
                .iter()
                .map(|kv| {
                    kv.split_once('=')
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .with_context(|| format!("--env {kv}: expected KEY=VALUE"))
                })
                .collect::<Result<Vec<_>>>()?;
            let req = Request {
                flags: r.flags,
                command: r.command,
                cwd: r.cwd,
                env,
                modules: r.modules,
                capture_stdout: false,
            };
            let kernels = boot_list(&a.kernel.map(|k| k.0).unwrap_or_else(|| vec![SERIES[0]]));
            let several = kernels.len() > 1;
            let mut worst = 0;
            for series in kernels {
                if several {
                    eprintln!("vm: ==> kernel {}", series.name);
                }
                let vm = Vm::prepare(series)?;
                match vm.run(&req) {
                    Ok(out) => {
                        let _ = std::io::Write::flush(&mut std::io::stdout());
                        if out.status != 0 {
                            eprintln!(
                                "vm: command exited with status {} in the VM ({})",
                                out.status, vm.kernel.release
                            );
                            if worst == 0 {
                                worst = out.status.clamp(1, 255);
                            }
                        }
                    }
                    Err(e) => {
                        eprintln!("vm: error: {e:#}");
                        std::process::exit(if interrupted().is_some() { 130 } else { 1 });
                    }
                }
            }
            std::process::exit(worst);
        }
        Cmd::Fetch | Cmd::Info => {
            for series in boot_list(&every) {
                let vm = Vm::prepare(series)?;
                vm.print_info();
            }
            Ok(())
        }
        Cmd::Selftest(f) => {
            let (mut passed, mut failed) = (0, 0);
            for series in boot_list(&every) {
                let vm = Vm::prepare(series)?;
                let (p, fl) = vm.selftest(&f)?;
                println!("vm selftest on {}: {p} passed, {fl} failed", vm.kernel.release);
                passed += p;
                failed += fl;
            }
            println!("vm selftest: {passed} passed, {failed} failed");
            let _ = std::io::Write::flush(&mut std::io::stdout());
            if failed > 0 {
                std::process::exit(1);
            }
            Ok(())
        }
    }
}

/// One command to run in the VM.
pub struct Request {
    pub flags: VmFlags,
    pub command: Vec<String>,
    /// Default: the current directory.
    pub cwd: Option<PathBuf>,
    pub env: Vec<(String, String)>,
    pub modules: Vec<String>,
    pub capture_stdout: bool,
}

/// A prepared VM: kernel, initramfs, accelerator.
pub struct Vm {
    pub kernel: Kernel,
    initramfs: PathBuf,
    pub accel: Accel,
    accel_why: String,
    cache_root: PathBuf,
}

impl Vm {
    /// Fetches/prepares everything for `series` (cached) and decides KVM vs TCG.
    pub fn prepare(series: Series) -> Result<Vm> {
        qemu::check_qemu()?;
        let kernel = kernel::ensure(series)?;
        let initramfs = initramfs::ensure(&kernel)?;
        let cache_root = kernel::cache_root()?;
        let (accel, accel_why) = qemu::detect_accel(&kernel, &initramfs, &cache_root)?;
        Ok(Vm {
            kernel,
            initramfs,
            accel,
            accel_why,
            cache_root,
        })
    }

    pub fn print_info(&self) {
        println!("kernel:     {} ({})", self.kernel.release, self.kernel.origin);
        let config = self.kernel.config();
        let has = |k: &str| matches!(config.get(k).map(String::as_str), Some("y" | "m"));
        println!(
            "offers:     tcx {}, sch_fq {}, sch_htb {}, clsact {} (from its config)",
            has("CONFIG_NET_XGRESS"),
            has("CONFIG_NET_SCH_FQ"),
            has("CONFIG_NET_SCH_HTB"),
            has("CONFIG_NET_SCH_INGRESS")
        );
        println!("image:      {}", self.kernel.image.display());
        println!("modules:    {}", self.kernel.modules_dir.display());
        println!("initramfs:  {}", self.initramfs.display());
        println!("accel:      {} ({})", self.accel, self.accel_why);
        println!("cache:      {}", self.cache_root.display());
        println!(
            "share:      {} (read-write in the VM, $PACELINE_VM_SHARE)",
            share_dir().display()
        );
    }

    /// Boots the VM and runs `req.command`; `Ok` carries the command's exit status, `Err` means
    /// the VM itself failed (boot, panic, timeout, signal).
    pub fn run(&self, req: &Request) -> Result<Outcome> {
        self.run_with(req, None)
    }

    /// [`Vm::run`] with the command's stdout handed to `sink` as it comes.
    pub fn run_with(&self, req: &Request, sink: Option<qemu::StdoutSink>) -> Result<Outcome> {
        let run_dir = qemu::tempdir("run")?;
        let share = share_dir();
        fs::create_dir_all(&share).with_context(|| format!("creating {}", share.display()))?;
        let share = fs::canonicalize(&share)?;
        let cwd = match &req.cwd {
            Some(c) => c.clone(),
            None => std::env::current_dir()?,
        };
        let cwd = fs::canonicalize(&cwd).with_context(|| format!("working directory {}", cwd.display()))?;

        // the module load list
        let mut names: Vec<String> = DEFAULT_MODULES.iter().map(|s| s.to_string()).collect();
        if let Ok(v) = std::env::var("PACELINE_VM_MODULES") {
            names.extend(v.split([' ', ',']).filter(|s| !s.is_empty()).map(String::from));
        }
        names.extend(req.modules.iter().cloned());
        let idx = modules::ModIndex::load(&self.kernel.modules_dir)?;
        let (order, missing) = idx.resolve(&names);
        let missing: Vec<_> = missing
            .into_iter()
            .filter(|m| req.modules.contains(m) || !DEFAULT_MODULES.contains(&m.as_str()))
            .collect();
        if !missing.is_empty() {
            eprintln!(
                "vm: warning: modules not in kernel {}: {}",
                self.kernel.release,
                missing.join(" ")
            );
        }

        // host paths hidden by the guest's fresh tmpfs mounts but needed by the command
        let mut keep = Vec::new();
        let hidden = ["/tmp", "/run", "/var/tmp", "/dev/shm"];
        // The workspace too: the tests look for the agent and tools next to their own
        // executable's directory (target/debug), which a checkout under /tmp would hide.
        let mut want_visible = vec![repo_root(), cwd.clone()];
        if let Some(parent) = req
            .command
            .first()
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .and_then(|p| fs::canonicalize(p).ok())
            .and_then(|p| p.parent().map(Path::to_path_buf))
        {
            want_visible.push(parent);
        }
        if let Some(t) = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .and_then(|p| fs::canonicalize(p).ok())
        {
            want_visible.push(t);
        }
        for p in want_visible {
            if hidden.iter().any(|h| p.starts_with(h)) && !keep.contains(&p) {
                keep.push(p);
            }
        }
        for k in &keep {
            check_path(k)?;
        }
        check_path(&share)?;
        check_path(&self.kernel.modules_dir)?;
        check_path(run_dir.path())?;
        // /lib is a symlink on merged-/usr systems: bind the module tree at the real path
        let lib = fs::canonicalize("/lib").unwrap_or_else(|_| PathBuf::from("/lib"));
        let modmnt = lib.join("modules").join(&self.kernel.release);

        let spec = format!(
            "PL_KREL={}\nPL_MODDIR={}\nPL_MODMNT={}\nPL_SHARE={}\nPL_KEEP={}\nPL_MODULES={}\n",
            sh_quote(&self.kernel.release),
            sh_quote(&self.kernel.modules_dir.to_string_lossy()),
            sh_quote(&modmnt.to_string_lossy()),
            sh_quote(&share.to_string_lossy()),
            sh_quote(
                &keep
                    .iter()
                    .map(|p| p.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            sh_quote(&order.join(" ")),
        );
        fs::write(run_dir.path().join("vm-run.sh"), spec)?;

        // the command script, run by the host's /bin/sh inside the chroot with an empty env
        let mut env: Vec<(String, String)> = Vec::new();
        for (k, v) in std::env::vars() {
            if PASS_ENV.contains(&k.as_str())
                || (k.starts_with("PACELINE_") && k != "PACELINE_IN_VM" && k != "PACELINE_VM_SHARE")
            {
                env.push((k, v));
            }
        }
        if !env.iter().any(|(k, _)| k == "PATH") {
            env.push((
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ));
        }
        env.push(("PACELINE_IN_VM".into(), "1".into()));
        env.push(("PACELINE_VM_SHARE".into(), share.to_string_lossy().into_owned()));
        for (k, v) in &req.env {
            env.retain(|(k2, _)| k2 != k);
            env.push((k.clone(), v.clone()));
        }
        let mut script = String::from("# generated by cargo xtask vm run\n");
        for (k, v) in &env {
            if !k
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                continue;
            }
            script.push_str(&format!("export {k}={}\n", sh_quote(v)));
        }
        script.push_str(&format!(
            "cd {} || {{ echo \"paceline-vm: cannot enter {}\" >&2; exit 126; }}\n",
            sh_quote(&cwd.to_string_lossy()),
            cwd.display()
        ));
        script.push_str("exec");
        for a in &req.command {
            script.push(' ');
            script.push_str(&sh_quote(a));
        }
        script.push('\n');
        fs::write(run_dir.path().join("cmd.sh"), script)?;

        eprintln!(
            "vm: {} kernel {} under {}, {} vCPU, {} MiB; running: {}",
            if self.kernel.origin.starts_with("Debian") {
                "Debian"
            } else {
                "custom"
            },
            self.kernel.release,
            self.accel,
            req.flags.smp,
            req.flags.mem,
            shell_words(&req.command)
        );
        let mut boot = qemu::Boot {
            kernel: &self.kernel,
            initramfs: &self.initramfs,
            accel: self.accel,
            mem_mib: req.flags.mem,
            smp: req.flags.smp,
            timeout: Duration::from_secs(req.flags.timeout),
            verbose: req.flags.verbose,
            share: Some(&share),
            run_dir: run_dir.path(),
            capture_stdout: req.capture_stdout,
            stdout_sink: sink,
        };
        let out = qemu::run(&mut boot)?;
        eprintln!(
            "vm: exit status {} (boot {}, total {:.1} s)",
            out.status,
            out.boot_secs
                .map(|b| format!("{b:.1} s"))
                .unwrap_or_else(|| "?".into()),
            out.total.as_secs_f64()
        );
        if !out.kernel_trouble.is_empty() {
            eprintln!(
                "vm: warning: the VM kernel logged {} oops/BUG/WARNING line(s) (see 'vm|' lines above)",
                out.kernel_trouble.len()
            );
        }
        Ok(out)
    }

    /// Boots a few times and checks what the harness promises. Returns (passed, failed).
    pub fn selftest(&self, f: &VmFlags) -> Result<(u32, u32)> {
        let share = share_dir();
        fs::create_dir_all(&share)?;
        let marker = share.join("selftest.txt");
        let _ = fs::remove_file(&marker);
        let script = r#"set -e
echo "kernel: $(uname -r)"
tc qdisc replace dev lo root fq
tc qdisc show dev lo | grep -q '^qdisc fq ' || { echo "fq not installed on lo" >&2; exit 1; }
tc qdisc show dev lo
tc qdisc add dev lo clsact
tc qdisc del dev lo clsact
ip link add pl-veth0 type veth peer name pl-veth1
ip link del pl-veth0
[ "$PACELINE_IN_VM" = 1 ] || { echo "PACELINE_IN_VM not set" >&2; exit 1; }
[ "$(pwd)" = "$PL_EXPECT_CWD" ] || { echo "cwd is $(pwd), expected $PL_EXPECT_CWD" >&2; exit 1; }
[ -z "$PL_EXPECT_ENTRY" ] || [ -e "$PL_EXPECT_ENTRY" ] || { echo "$PL_EXPECT_ENTRY missing in the cwd" >&2; exit 1; }
mount | grep -q ' /sys/fs/bpf type bpf' || { echo "no bpffs" >&2; exit 1; }
mount | grep -q ' /sys/fs/cgroup type cgroup2' || { echo "no cgroup2" >&2; exit 1; }
ip -br link show lo | grep -q UP || { echo "loopback is down" >&2; exit 1; }
if [ -x /bin/busybox ]; then /bin/busybox ping -c 1 -W 2 127.0.0.1 >/dev/null || { echo "loopback does not answer" >&2; exit 1; }; fi
echo "written in the VM on $(uname -r)" > "$PACELINE_VM_SHARE/selftest.txt"
echo "selftest inside the VM: ok"
"#;
        let cwd = std::env::current_dir()?;
        // something the host sees in the cwd, which the VM must see too
        let entry = fs::read_dir(&cwd)?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.contains(char::is_whitespace))
            .min()
            .unwrap_or_default();
        let mut passed = 0;
        let mut failed = 0;
        let mut check = |name: &str, ok: bool, detail: String| {
            if ok {
                passed += 1;
                println!("vm selftest: {name}: ok {detail}");
            } else {
                failed += 1;
                println!("vm selftest: {name}: FAILED {detail}");
            }
        };
        let req = Request {
            flags: f.clone(),
            command: vec!["sh".into(), "-c".into(), script.into()],
            cwd: None,
            env: vec![
                (
                    "PL_EXPECT_CWD".into(),
                    fs::canonicalize(&cwd)?.to_string_lossy().into_owned(),
                ),
                ("PL_EXPECT_ENTRY".into(), entry),
            ],
            modules: vec![],
            capture_stdout: true,
        };
        match self.run(&req) {
            Ok(o) => {
                let out = String::from_utf8_lossy(&o.stdout);
                check(
                    "fq, clsact, veth, mounts, env, cwd in the VM",
                    o.status == 0 && out.contains("qdisc fq "),
                    format!("(exit {})", o.status),
                );
                let back = fs::read_to_string(&marker).unwrap_or_default();
                check(
                    "file written to $PACELINE_VM_SHARE is on the host",
                    back.contains(&self.kernel.release),
                    format!("({})", marker.display()),
                );
            }
            Err(e) => check("boot and run", false, format!("({e:#})")),
        }
        let req = Request {
            flags: f.clone(),
            command: vec!["false".into()],
            cwd: None,
            env: vec![],
            modules: vec![],
            capture_stdout: false,
        };
        match self.run(&req) {
            Ok(o) => check(
                "`false` in the VM gives a non-zero status",
                o.status != 0,
                format!("(exit {})", o.status),
            ),
            Err(e) => check("`false` in the VM", false, format!("({e:#})")),
        }
        Ok((passed, failed))
    }
}

/// `<repo>/target/vm-share`: read-write in the VM at the same path.
pub fn share_dir() -> PathBuf {
    repo_root().join("target/vm-share")
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Paths go into a shell script split on whitespace (PL_KEEP) and a 9p/qemu option list.
fn check_path(p: &Path) -> Result<()> {
    let s = p.to_string_lossy();
    if s.chars()
        .any(|c| c.is_whitespace() || c == ',' || c == '\'' || c == '"' || c == '\\')
    {
        bail!("path {s:?} contains whitespace, a comma or quotes; the VM harness does not support that");
    }
    Ok(())
}

fn sh_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn shell_words(v: &[String]) -> String {
    let s = v
        .iter()
        .map(|a| sh_quote(a))
        .collect::<Vec<_>>()
        .join(" ")
        .replace('\n', "\\n");
    if s.len() > 120 {
        format!(
            "{}...",
            &s[..s
                .char_indices()
                .take_while(|(i, _)| *i < 117)
                .last()
                .map(|(i, c)| i + c.len_utf8())
                .unwrap_or(0)]
        )
    } else {
        s
    }
}
