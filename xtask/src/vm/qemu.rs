//! Running qemu: the command line, the host ends of the guest's channels (unix sockets that
//! qemu connects to), the timeout, Ctrl-C handling and the KVM probe.

use super::kernel::Kernel;
use anyhow::{Context, Result, anyhow, bail};
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub const QEMU: &str = "qemu-system-x86_64";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

impl std::fmt::Display for Accel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Accel::Kvm => "KVM",
            Accel::Tcg => "TCG",
        })
    }
}

/// Set by the SIGINT/SIGTERM/SIGHUP handler; the wait loops poll it.
static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNALLED.store(sig, Ordering::SeqCst);
}

/// Installs the handler once. qemu runs in its own process group, so a Ctrl-C at the terminal
/// reaches only us; we then stop qemu ourselves and report. (If we die anyway, qemu gets
/// SIGKILL through PR_SET_PDEATHSIG.)
pub fn install_signal_handlers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| unsafe {
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::signal(s, on_signal as *const () as libc::sighandler_t);
        }
    });
}

/// The signal that interrupted us, if any.
pub fn interrupted() -> Option<i32> {
    match SIGNALLED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// The qemu binary: `PACELINE_VM_QEMU` if set, else `qemu-system-x86_64` from PATH.
pub fn check_qemu() -> Result<PathBuf> {
    let found = match std::env::var_os("PACELINE_VM_QEMU") {
        Some(p) if !p.is_empty() => Some(PathBuf::from(p)).filter(|p| p.is_file()),
        _ => find_in_path(QEMU),
    };
    found.ok_or_else(|| {
        anyhow!("{QEMU} not found: install the VM tools with `scripts/bootstrap.sh --test` (qemu-system-x86, qemu-system-data, busybox-static, cpio)")
    })
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or(None)
        .or_else(|| {
            ["/usr/bin", "/usr/local/bin", "/bin"]
                .iter()
                .map(|d| Path::new(d).join(name))
                .find(|p| p.is_file())
        })
}

/// Everything one boot needs.
pub struct Boot<'a> {
    pub kernel: &'a Kernel,
    pub initramfs: &'a Path,
    pub accel: Accel,
    pub mem_mib: u32,
    pub smp: u32,
    pub timeout: Duration,
    pub verbose: bool,
    /// Host directory mounted read-write in the guest (tag `vmshare`).
    pub share: Option<&'a Path>,
    /// Per-run directory (sockets; the guest reads its spec through the host root).
    pub run_dir: &'a Path,
    /// Keep a copy of the command's stdout (the test runner parses it).
    pub capture_stdout: bool,
    /// Where the command's stdout goes as it comes (default: our stdout).
    pub stdout_sink: Option<StdoutSink>,
}

/// Receives the command's stdout in the pieces it arrives in.
pub type StdoutSink = Box<dyn FnMut(&[u8]) + Send>;

#[derive(Debug)]
pub struct Outcome {
    /// The command's exit status inside the VM.
    pub status: i32,
    /// Seconds from qemu start to the command start.
    pub boot_secs: Option<f64>,
    pub total: Duration,
    pub stdout: Vec<u8>,
    /// Kernel messages that look like an oops/BUG/WARN during the run.
    pub kernel_trouble: Vec<String>,
}

fn base_args(b: &Boot) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "-nodefaults".into(),
        "-no-user-config".into(),
        "-display".into(),
        "none".into(),
        "-monitor".into(),
        "none".into(),
        "-no-reboot".into(),
        "-nic".into(),
        "none".into(), // loopback only: the guest has no network device
        "-m".into(),
        b.mem_mib.to_string(),
        "-smp".into(),
        b.smp.to_string(),
    ];
    match b.accel {
        Accel::Kvm => a.extend(["-accel", "kvm", "-cpu", "host"].map(String::from)),
        Accel::Tcg => a.extend(["-accel", "tcg,thread=multi", "-cpu", "max"].map(String::from)),
    }
    // qboot is the fastest firmware for -kernel boots; fall back to qemu's default (SeaBIOS).
    for fw in ["/usr/share/qemu/qboot.rom", "/usr/share/qemu/qboot.bin"] {
        if Path::new(fw).is_file() {
            a.extend(["-bios".into(), fw.into()]);
            break;
        }
    }
    a.extend([
        "-kernel".into(),
        b.kernel.image.display().to_string(),
        "-initrd".into(),
        b.initramfs.display().to_string(),
    ]);
    a
}

/// Kernel command line. `mitigations=off` saves ~1.5 s under TCG, `pci=noacpi` ~1 s (virtio
/// devices probe without ACPI interrupt-link setup); `tsc=reliable` keeps the TSC
/// as clocksource (the watchdog would otherwise flip to hpet under TCG: slow and coarse);
/// `oops=panic panic=-1`: a kernel oops ends the VM at once (reported as a panic) instead of
/// leaving a wedged guest to run into the timeout. `PACELINE_VM_APPEND` adds parameters.
fn cmdline(b: &Boot, extra: &str) -> String {
    let quiet = if b.verbose {
        "loglevel=7"
    } else {
        "quiet loglevel=3"
    };
    let user = std::env::var("PACELINE_VM_APPEND").unwrap_or_default();
    format!(
        "console=ttyS0 panic=-1 oops=panic mitigations=off pci=noacpi tsc=reliable no_timer_check 8250.nr_uarts=1 rdinit=/init {quiet} {extra} {user}"
    )
}

fn fsdev_security() -> &'static str {
    // passthrough keeps owners and modes (needs root, as qemu then runs as root)
    if unsafe { libc::geteuid() } == 0 {
        "passthrough"
    } else {
        "none"
    }
}

/// Boots, runs the command described in `b.run_dir`, returns its status.
pub fn run(b: &mut Boot) -> Result<Outcome> {
    let qemu = check_qemu()?;
    install_signal_handlers();
    let sock = |n: &str| b.run_dir.join(format!("{n}.sock"));
    let listeners = ["console", "status", "stdout", "stderr"]
        .iter()
        .map(|n| {
            let p = sock(n);
            let l = UnixListener::bind(&p).with_context(|| format!("binding {}", p.display()))?;
            l.set_nonblocking(true)?;
            Ok(l)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut args = base_args(b);
    args.push("-append".into());
    let debug = match std::env::var("PACELINE_VM_DEBUG") {
        Ok(v) if !v.is_empty() && v != "0" => {
            format!(" paceline.debug={}", if v == "2" { "2" } else { "1" })
        }
        _ => String::new(),
    };
    args.push(cmdline(
        b,
        &format!("paceline.run={}{debug}", b.run_dir.display()),
    ));
    let fsdev = fsdev_security();
    args.extend([
        "-chardev".into(),
        format!("socket,id=con,path={}", sock("console").display()),
        "-serial".into(),
        "chardev:con".into(),
        "-device".into(),
        "virtio-serial-pci,id=vser".into(),
    ]);
    for (i, n) in ["status", "stdout", "stderr"].iter().enumerate() {
        args.extend([
            "-chardev".into(),
            format!("socket,id=ch{n},path={}", sock(n).display()),
            "-device".into(),
            format!(
                "virtserialport,bus=vser.0,nr={},chardev=ch{n},name=paceline.{n}",
                i + 1
            ),
        ]);
    }
    args.extend([
        "-fsdev".into(),
        format!("local,id=hostroot,path=/,security_model={fsdev},readonly=on,multidevs=remap"),
        "-device".into(),
        "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot".into(),
    ]);
    if let Some(share) = b.share {
        args.extend([
            "-fsdev".into(),
            format!(
                "local,id=vmshare,path={},security_model={fsdev},multidevs=remap",
                share.display()
            ),
            "-device".into(),
            "virtio-9p-pci,fsdev=vmshare,mount_tag=vmshare".into(),
        ]);
    }
    if std::env::var_os("PACELINE_VM_DEBUG").is_some() {
        eprintln!("vm: {} {}", qemu.display(), args.join(" "));
    }

    let start = Instant::now();
    let mut child = spawn(&qemu, &args)?;
    let stop = Arc::new(AtomicBool::new(false));
    let [l_console, l_status, l_stdout, l_stderr]: [UnixListener; 4] =
        listeners.try_into().map_err(|_| anyhow!("listeners"))?;

    // console: kernel messages (errors only unless verbose) and init's own diagnostics
    let console_lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let t_console = {
        let (stop, lines) = (stop.clone(), console_lines.clone());
        let verbose = b.verbose;
        forward(l_console, stop, move |r| {
            for line in BufReader::new(r).split(b'\n').map_while(|l| l.ok()) {
                let s = String::from_utf8_lossy(&line).trim_end_matches('\r').to_string();
                if s.is_empty() {
                    continue;
                }
                // the kernel announces every reboot at emergency level; that is our normal exit
                if !verbose && (s.ends_with("reboot: Restarting system") || s.ends_with("reboot: Power down"))
                {
                    continue;
                }
                eprintln!("vm| {s}");
                lines.lock().unwrap().push(s);
            }
        })
    };
    let status_lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let booted = Arc::new(Mutex::new(None::<f64>));
    let t_status = {
        let (stop, lines, booted) = (stop.clone(), status_lines.clone(), booted.clone());
        let verbose = b.verbose;
        forward(l_status, stop, move |r| {
            for line in BufReader::new(r).lines().map_while(|l| l.ok()) {
                if let Some(uptime) = line.strip_prefix("booted ") {
                    let secs = start.elapsed().as_secs_f64();
                    *booted.lock().unwrap() = Some(secs);
                    if verbose {
                        eprintln!("vm: booted in {secs:.1} s (guest uptime {uptime})");
                    }
                }
                lines.lock().unwrap().push(line);
            }
        })
    };
    let captured = Arc::new(Mutex::new(Vec::<u8>::new()));
    let t_stdout = {
        let (stop, cap) = (stop.clone(), captured.clone());
        let capture = b.capture_stdout;
        let mut sink = b.stdout_sink.take();
        forward(l_stdout, stop, move |mut r| {
            let mut buf = [0u8; 16384];
            loop {
                match r.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if let Some(sink) = sink.as_mut() {
                            sink(&buf[..n]);
                        } else {
                            let mut o = std::io::stdout().lock();
                            let _ = o.write_all(&buf[..n]);
                            let _ = o.flush();
                        }
                        if capture {
                            cap.lock().unwrap().extend_from_slice(&buf[..n]);
                        }
                    }
                }
            }
        })
    };
    let t_stderr = forward(l_stderr, stop.clone(), move |mut r| {
        let mut buf = [0u8; 16384];
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let mut o = std::io::stderr().lock();
                    let _ = o.write_all(&buf[..n]);
                    let _ = o.flush();
                }
            }
        }
    });
    let t_qemu_err = child.stderr.take().map(|e| {
        std::thread::spawn(move || {
            for line in BufReader::new(e).lines().map_while(|l| l.ok()) {
                if line.contains("terminating on signal") {
                    continue; // we stopped it and say why
                }
                eprintln!("qemu: {line}");
            }
        })
    });

    // wait for qemu, the timeout or a signal
    let mut failure: Option<String> = None;
    let exit = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if let Some(sig) = interrupted() {
            failure = Some(format!("interrupted by signal {sig}; VM stopped"));
            kill(&mut child);
            break None;
        }
        if start.elapsed() >= b.timeout {
            failure = Some(format!(
                "timeout: the VM did not finish within {} s (raise it with --timeout); VM killed",
                b.timeout.as_secs()
            ));
            kill(&mut child);
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    stop.store(true, Ordering::SeqCst);
    for t in [t_console, t_status, t_stdout, t_stderr] {
        let _ = t.join();
    }
    if let Some(t) = t_qemu_err {
        let _ = t.join();
    }
    let total = start.elapsed();
    let console = console_lines.lock().unwrap().clone();
    let trouble: Vec<String> = console
        .iter()
        .filter(|l| {
            [
                "Oops",
                "BUG:",
                "WARNING:",
                "Call Trace",
                "general protection",
                "Kernel panic",
            ]
            .iter()
            .any(|k| l.contains(k))
        })
        .cloned()
        .collect();
    let status = status_lines.lock().unwrap().clone();
    if let Some(f) = failure {
        bail!("{f}");
    }
    if let Some(e) = status.iter().find_map(|l| l.strip_prefix("init-error ")) {
        bail!("VM init failed: {e}");
    }
    let code = status
        .iter()
        .find_map(|l| l.strip_prefix("exit ").and_then(|c| c.trim().parse::<i32>().ok()));
    match code {
        Some(status) => Ok(Outcome {
            status,
            boot_secs: *booted.lock().unwrap(),
            total,
            stdout: std::mem::take(&mut *captured.lock().unwrap()),
            kernel_trouble: trouble,
        }),
        None => {
            let panic = console.iter().any(|l| l.contains("Kernel panic"));
            if panic && let Some(f) = stale_breakpoint(&console) {
                return Err(anyhow::Error::new(f));
            }
            let what = if panic {
                "the VM kernel panicked".to_string()
            } else {
                format!(
                    "qemu exited ({}) without the command's exit status",
                    exit.map(|e| e.to_string()).unwrap_or_default()
                )
            };
            if !b.verbose && console.is_empty() {
                bail!("{what}; rerun with --verbose (or PACELINE_VM_DEBUG=1) for the boot log");
            }
            bail!("{what}; kernel/console messages are above (prefixed 'vm|')");
        }
    }
}

fn spawn(qemu: &Path, args: &[String]) -> Result<Child> {
    let mut cmd = Command::new(qemu);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
    unsafe {
        cmd.pre_exec(|| {
            // qemu must not outlive us, whatever kills us
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() == 1 {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    cmd.spawn()
        .with_context(|| format!("starting {}", qemu.display()))
}

/// SIGTERM, then SIGKILL after a second; always reaps.
fn kill(child: &mut Child) {
    let pid = child.id() as libc::pid_t;
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(1) {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Accepts the one connection qemu makes to `l` (giving up once `stop` is set) and hands it to `f`.
fn forward<F>(l: UnixListener, stop: Arc<AtomicBool>, f: F) -> JoinHandle<()>
where
    F: FnOnce(std::os::unix::net::UnixStream) + Send + 'static,
{
    std::thread::spawn(move || {
        loop {
            match l.accept() {
                Ok((s, _)) => {
                    let _ = s.set_nonblocking(false);
                    f(s);
                    return;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return,
            }
        }
    })
}

/// Decides between KVM and TCG. `PACELINE_VM_ACCEL=kvm|tcg` forces one; otherwise, when
/// /dev/kvm is usable, one quick boot under KVM (the guest prints a marker and reboots)
/// tells whether KVM really runs a guest here (nested virtualisation often does not: the guest
/// hangs). The result is cached per host boot in `<cache>/accel-<boot id>`.
pub fn detect_accel(kernel: &Kernel, initramfs: &Path, cache_root: &Path) -> Result<(Accel, String)> {
    match std::env::var("PACELINE_VM_ACCEL").as_deref() {
        Ok("kvm") => return Ok((Accel::Kvm, "forced by PACELINE_VM_ACCEL".into())),
        Ok("tcg") => return Ok((Accel::Tcg, "forced by PACELINE_VM_ACCEL".into())),
        Ok("" | "auto") | Err(_) => {}
        Ok(other) => bail!("PACELINE_VM_ACCEL={other}: expected kvm, tcg or auto"),
    }
    let kvm_open = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    if !kvm_open {
        return Ok((Accel::Tcg, "no usable /dev/kvm".into()));
    }
    let boot_id = fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap_or_default()
        .trim()
        .to_string();
    let cache = cache_root.join(format!(
        "accel-{}",
        if boot_id.is_empty() { "unknown" } else { &boot_id }
    ));
    if let Ok(s) = fs::read_to_string(&cache) {
        match s.trim() {
            "kvm" => return Ok((Accel::Kvm, "KVM boots guests here (cached probe)".into())),
            "tcg" => {
                return Ok((
                    Accel::Tcg,
                    "/dev/kvm cannot boot a guest here (cached probe)".into(),
                ));
            }
            _ => {}
        }
    }
    eprintln!("vm: probing whether KVM can boot a guest on this machine (once per host boot)...");
    let ok = probe_kvm(kernel, initramfs)?;
    let _ = fs::write(&cache, if ok { "kvm\n" } else { "tcg\n" });
    Ok(if ok {
        (Accel::Kvm, "KVM boots guests here (probed)".into())
    } else {
        (Accel::Tcg, "/dev/kvm cannot boot a guest here (probed)".into())
    })
}

fn probe_kvm(kernel: &Kernel, initramfs: &Path) -> Result<bool> {
    let qemu = check_qemu()?;
    install_signal_handlers();
    let dir = tempdir("probe")?;
    let log = dir.path().join("console.log");
    let b = Boot {
        kernel,
        initramfs,
        accel: Accel::Kvm,
        mem_mib: 256,
        smp: 1,
        timeout: Duration::from_secs(10),
        verbose: false,
        share: None,
        run_dir: dir.path(),
        capture_stdout: false,
        stdout_sink: None,
    };
    let mut args = base_args(&b);
    args.extend([
        "-append".into(),
        cmdline(&b, "paceline.probe=1"),
        "-serial".into(),
        format!("file:{}", log.display()),
    ]);
    let mut child = spawn(&qemu, &args)?;
    let t = Instant::now();
    let ok = loop {
        let seen = fs::read_to_string(&log)
            .map(|s| s.contains("PACELINE_PROBE_OK"))
            .unwrap_or(false);
        if seen {
            break true;
        }
        if let Some(_st) = child.try_wait()? {
            break fs::read_to_string(&log)
                .map(|s| s.contains("PACELINE_PROBE_OK"))
                .unwrap_or(false);
        }
        if t.elapsed() > b.timeout || interrupted().is_some() {
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    kill(&mut child);
    if let Some(sig) = interrupted() {
        bail!("interrupted by signal {sig}");
    }
    Ok(ok)
}

/// A directory removed on drop.
pub struct TempDir(PathBuf);
impl TempDir {
    pub fn path(&self) -> &Path {
        &self.0
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A fresh directory for one run. Under /tmp (short paths: unix sockets allow 107 bytes) unless
/// TMPDIR is set and short enough. The guest reads it through the host root, before its own
/// tmpfs hides /tmp.
pub fn tempdir(what: &str) -> Result<TempDir> {
    use std::sync::atomic::AtomicU32;
    static N: AtomicU32 = AtomicU32::new(0);
    let base = std::env::temp_dir();
    let base = if base.as_os_str().len() > 60 {
        PathBuf::from("/tmp")
    } else {
        base
    };
    remove_stale(&base);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let p = base.join(format!(
        "paceline-vm-{what}-{}-{}-{nanos:x}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    fs::create_dir_all(&p)?;
    let p = fs::canonicalize(&p)?;
    Ok(TempDir(p))
}

/// Removes run directories left by runs that were SIGKILLed (their pid is gone).
fn remove_stale(base: &Path) {
    let Ok(rd) = fs::read_dir(base) else { return };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("paceline-vm-") else {
            continue;
        };
        let pid = rest.split('-').nth(1).and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && pid != std::process::id()
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// A fault of the emulator, not of the code under test: the guest kernel died of an `int3`
/// at an address whose byte in memory is not `int3` any more. The kernel patches its own text
/// (static keys: attaching a tc program or a qdisc turns some on) by writing a breakpoint
/// first and the new instruction after, synchronising every CPU in between; under TCG a vCPU
/// can still run a translation made while the breakpoint was there, after the kernel has
/// stopped expecting it. Seen once on Debian's 6.12 in a CI run (`__dev_queue_xmit`, the
/// code bytes there a `nopl`). The remedy is a new VM.
#[derive(Debug)]
pub struct EmulatorFault(pub String);

impl std::fmt::Display for EmulatorFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the VM kernel died of a stale breakpoint ({}): an emulator fault while the kernel patched its own text, not a failure of the code under test",
            self.0
        )
    }
}

impl std::error::Error for EmulatorFault {}

/// The console's first oops, when it is an `int3` whose faulting byte (the one the `Code:`
/// line marks `<..>`) is no longer `int3` (0xcc).
pub fn stale_breakpoint(console: &[String]) -> Option<EmulatorFault> {
    let i = console.iter().position(|l| l.contains("Oops:"))?;
    if !console[i].contains("Oops: int3") {
        return None;
    }
    let rip = console[i..]
        .iter()
        .take(12)
        .find_map(|l| l.split_once("RIP: ").map(|(_, r)| r.trim().to_string()))
        .unwrap_or_default();
    let code = console[i..].iter().take(12).find(|l| l.contains("Code: "))?;
    let marked = code.split_once('<')?.1.split_once('>')?.0;
    (marked != "cc").then(|| EmulatorFault(format!("int3 at {rip}, where the code is now {marked}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn console(text: &str) -> Vec<String> {
        text.lines().map(str::to_string).collect()
    }

    /// The CI run's console: an int3 oops at a byte that is a `nopl` now is the emulator's;
    /// an int3 at a real breakpoint, or any other oops, is not.
    #[test]
    fn only_an_int3_at_a_byte_that_is_not_int3_is_the_emulators() {
        let ci = "vm| [  196.585781] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI
vm| [  196.587739] CPU: 1 UID: 0 PID: 1660 Comm: serve-conn Tainted: G            E      6.12.117+deb12-amd64 #1
vm| [  196.588379] RIP: 0010:__dev_queue_xmit+0x18f/0xf70
vm| [  196.589094] Code: f9 0c 0f 84 2a 06 00 00 0f b7 80 ac 02 00 00 3b 42 10 73 0d 89 c0 8b 44 82 14 41 89 86 90 00 00 00 41 80 a6 81 00 00 00 fb 0f <1f> 44 00 00 49 8b 7e 58
vm| [  196.594444] Kernel panic - not syncing: Fatal exception in interrupt";
        let f = stale_breakpoint(&console(ci)).expect("the emulator's");
        assert!(
            f.0.contains("__dev_queue_xmit+0x18f") && f.0.contains("1f"),
            "{}",
            f.0
        );
        assert!(stale_breakpoint(&console(&ci.replace("<1f>", "<cc>"))).is_none());
        assert!(
            stale_breakpoint(&console(
                &ci.replace("Oops: int3", "Oops: general protection fault")
            ))
            .is_none()
        );
        assert!(stale_breakpoint(&console("vm| Kernel panic - not syncing: VFS")).is_none());
    }
}
