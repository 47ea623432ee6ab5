//! Running the agent (the `plagent` build of the `paceline` CLI) inside a testbed host, for
//! the integration tests and the experiments.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use paceline::status::LiveStatus;
use serde_json::Value;

use crate::testbed::{ChildGuard, Host};

/// A binary of this package (`plagent`, `plload`, ...): next to the running executable
/// (`target/<profile>/`) or one level up (test executables live in `target/<profile>/deps/`).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("exe dir");
    for d in [dir, dir.parent().unwrap_or(dir)] {
        let p = d.join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "{name} not found next to {}: build it (cargo build -p paceline-tests --bins)",
        exe.display()
    );
}

/// A scratch directory for one test's policy and state, removed on drop.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        // In the VM only the share is writable and comes back to the host; elsewhere /tmp.
        let base = std::env::var_os("PACELINE_VM_SHARE")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        Scratch::under(&base, name)
    }

    /// A scratch directory in the machine's own temporary directory (tmpfs in the VM), for a
    /// test whose files must behave like a local filesystem's (the VM's share is 9p).
    pub fn local(name: &str) -> Scratch {
        Scratch::under(&std::env::temp_dir(), name)
    }

    fn under(base: &std::path::Path, name: &str) -> Scratch {
        let dir = base.join(format!("pl-agent-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running agent inside a host's namespace; stopped with SIGTERM on drop.
pub struct Agent<'a> {
    host: &'a Host,
    policy: PathBuf,
    state_dir: PathBuf,
    child: Option<ChildGuard>,
    /// Its API as `extra` set it (`--api-addr`, `--api-token-file`), for the helpers below.
    api_addr: String,
    token_file: Option<PathBuf>,
}

/// The value after `flag` in `args`.
fn flag_value(args: &[&str], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| *a == flag)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.to_string())
}

impl<'a> Agent<'a> {
    pub fn start(host: &'a Host, policy: &Path, state_dir: &Path) -> Agent<'a> {
        Self::start_with(host, policy, state_dir, &[])
    }

    /// [`Agent::start`] with more `paceline agent` arguments (e.g. `--metrics-addr`).
    pub fn start_with(host: &'a Host, policy: &Path, state_dir: &Path, extra: &[&str]) -> Agent<'a> {
        let mut cmd = host.command(bin("plagent"));
        cmd.args(["agent", "--policy"])
            .arg(policy)
            .arg("--state-dir")
            .arg(state_dir)
            .arg("--bpffs-dir")
            .arg(Self::bpffs_dir(state_dir))
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // A clean stop detaches programs and deletes qdiscs over netlink: about 2 s under TCG
        // emulation on a loaded machine, which the default grace of 2 s cut short with a
        // SIGKILL (and a failed `stop`). A hung agent still fails, 20 s later.
        let child = host
            .spawn_cmd(cmd)
            .expect("spawn the agent")
            .grace(Duration::from_secs(20));
        let mut agent = Agent {
            host,
            policy: policy.to_path_buf(),
            state_dir: state_dir.to_path_buf(),
            child: Some(child),
            api_addr: flag_value(extra, "--api-addr").unwrap_or_else(|| "127.0.0.1:9978".into()),
            token_file: flag_value(extra, "--api-token-file").map(PathBuf::from),
        };
        // A start verifies the egress program: about 16 s under emulation of Linux 6.1 on a
        // quiet machine, over 45 s on a loaded one (2026-12-05). A start that fails fails at
        // once; the deadline only catches a hang.
        let up_within = if crate::gate::under_tcg() { 150 } else { 60 };
        let deadline = Instant::now() + Duration::from_secs(up_within);
        loop {
            if agent.status().is_some() {
                return agent;
            }
            let exited = agent
                .child
                .as_mut()
                .expect("child")
                .try_wait()
                .ok()
                .flatten()
                .is_some();
            if exited || Instant::now() > deadline {
                let out = agent.child.take().expect("child").stop();
                panic!(
                    "the agent did not come up ({:?}):\n{}\n{}",
                    out.status, out.stdout, out.stderr
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Where an agent with `state_dir` pins its maps: a BPF filesystem is shared by every
    /// network namespace, so each test agent gets its own directory.
    pub fn bpffs_dir(state_dir: &Path) -> PathBuf {
        use std::hash::{Hash as _, Hasher as _};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        state_dir.hash(&mut h);
        PathBuf::from(format!("/sys/fs/bpf/paceline-test-{:016x}", h.finish()))
    }

    /// The pinned D3 application map of this agent.
    pub fn d3_app_map(&self) -> PathBuf {
        Self::bpffs_dir(&self.state_dir).join("d3_app")
    }

    /// GET `path` from the agent's HTTP endpoint (the default address, 127.0.0.1:9977, in its
    /// namespace); the whole response, headers included. Panics unless it answers 200.
    pub fn http_get(&self, path: &str) -> String {
        use std::io::{Read as _, Write as _};
        self.host
            .in_netns(|| {
                let mut c = std::net::TcpStream::connect("127.0.0.1:9977").expect("connect to the agent");
                write!(c, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
                let mut body = String::new();
                c.read_to_string(&mut body).unwrap();
                assert!(
                    body.starts_with("HTTP/1.0 200") || body.starts_with("HTTP/1.1 200"),
                    "{body}"
                );
                body
            })
            .expect("in netns")
    }

    /// The agent's `/status` document (via `paceline status --json` in its namespace, which
    /// reads it through the typed model, `paceline::status::LiveStatus`).
    pub fn status(&self) -> Option<Value> {
        let mut cmd = self.host.command(bin("plagent"));
        cmd.args(["status", "--json", "--addr", &self.api_addr]);
        if let Some(t) = &self.token_file {
            cmd.arg("--token-file").arg(t);
        }
        let out = cmd.output().ok()?;
        // Exit 1 is a degraded or not-ready agent: it still printed its status.
        if !matches!(out.status.code(), Some(0 | 1)) {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// GET or POST `path` on the agent's API (127.0.0.1:9978 in its namespace, or its
    /// `--api-addr`, with its token when it has one): (status code, body), whatever the code.
    pub fn api(&self, method: &str, path: &str) -> (u16, String) {
        let auth = self.token_file.as_ref().map(|t| {
            let token = std::fs::read_to_string(t).expect("read the API token file");
            format!("Authorization: Bearer {}", token.trim_end())
        });
        Self::request_with(self.host, &self.api_addr, method, path, auth.as_slice())
    }

    /// The same on the metrics listener (127.0.0.1:9977): `/metrics`, `/healthz`, `/readyz`.
    pub fn metrics_listener(&self, path: &str) -> (u16, String) {
        Self::request(self.host, "127.0.0.1:9977", "GET", path)
    }

    /// One HTTP/1.0 request in `host`'s namespace: (status code, body).
    pub fn request(host: &Host, addr: &str, method: &str, path: &str) -> (u16, String) {
        Self::request_with(host, addr, method, path, &[])
    }

    /// [`Agent::request`] with more header lines (`Name: value`).
    pub fn request_with(
        host: &Host,
        addr: &str,
        method: &str,
        path: &str,
        headers: &[String],
    ) -> (u16, String) {
        use std::io::{Read as _, Write as _};
        let addr = addr.to_string();
        let (method, path) = (method.to_string(), path.to_string());
        let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
        host.in_netns(move || {
            let mut c = std::net::TcpStream::connect(&addr).expect("connect to the agent");
            write!(
                c,
                "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: 0\r\n{extra}\r\n"
            )
            .unwrap();
            let mut resp = String::new();
            c.read_to_string(&mut resp).unwrap();
            let code = resp
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let body = resp
                .split_once("\r\n\r\n")
                .map(|(_, b)| b.to_string())
                .unwrap_or_default();
            (code, body)
        })
        .expect("in netns")
    }

    /// The status code of GET `path` at `addr` in `host`'s namespace; `None` when nothing
    /// answers.
    pub fn request_opt(host: &Host, addr: &str, path: &str) -> Option<u16> {
        use std::io::{Read as _, Write as _};
        let (addr, path) = (addr.to_string(), path.to_string());
        host.in_netns(move || {
            let mut c = std::net::TcpStream::connect(&addr).ok()?;
            write!(c, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
            let mut resp = String::new();
            c.read_to_string(&mut resp).ok()?;
            resp.split_whitespace().nth(1)?.parse().ok()
        })
        .ok()
        .flatten()
    }

    /// The agent's log so far is not readable while it runs; its event log is.
    pub fn events(&self) -> Vec<Value> {
        let (_, body) = self.api("GET", "/events");
        body.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The agent's `/status` document as the agent's own typed model.
    pub fn live_status(&self) -> Option<LiveStatus> {
        self.status().map(|v| {
            serde_json::from_value(v).unwrap_or_else(|e| panic!("/status does not fit LiveStatus: {e}"))
        })
    }

    /// The slot of `class` in the running policy (its index in the pinned counters).
    pub fn class_index(&self, class: &str) -> usize {
        let s = self.live_status().expect("status");
        s.status
            .policy
            .classes
            .iter()
            .find(|c| c.name == class)
            .unwrap_or_else(|| panic!("no class {class} in the running policy"))
            .index as usize
    }

    /// A class's counter by its name in `/status` (`packets`, `tcp_sockets_configured`, ...).
    pub fn class_counter(&self, class: &str, counter: &str) -> u64 {
        let s = self.live_status().expect("status");
        let c = s
            .counters
            .classes
            .iter()
            .find(|c| c.name == class)
            .unwrap_or_else(|| panic!("no class {class} in {:?}", s.counters.classes));
        serde_json::to_value(&c.counters).expect("counters")[counter]
            .as_u64()
            .unwrap_or_else(|| panic!("no counter {counter} in {:?}", c.counters))
    }

    /// Waits until `pred(status)` holds.
    pub fn wait_for(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = self.status() {
                if pred(&s) {
                    return s;
                }
                if Instant::now() > deadline {
                    panic!("timed out waiting for {what}; status: {s:#}");
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").pid()
    }

    /// SIGTERM and wait; returns the agent's log.
    pub fn stop(mut self) -> String {
        let out = self.child.take().expect("running").stop();
        assert!(
            out.success(),
            "the agent exited with {:?}:\n{}",
            out.status,
            out.stderr
        );
        out.stderr
    }

    /// The agent's status, retried for 3 s (the agent may be busy under emulation).
    pub fn status_retry(&self) -> anyhow::Result<Value> {
        for _ in 0..10 {
            if let Some(s) = self.status() {
                return Ok(s);
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        anyhow::bail!("{}: the agent does not answer status queries", self.host.name())
    }

    /// Replaces the agent's policy file with `text` (by rename, as an editor does) and waits
    /// until the agent runs it: its file watch, else SIGHUP after `hup_after`; an error if the
    /// agent rejects the policy or has not loaded it after 30 s.
    pub fn apply_policy(&self, text: &str, hup_after: Duration) -> anyhow::Result<()> {
        use anyhow::Context as _;
        let who = self.host.name();
        let want = paceline_policy::hash(text.as_bytes());
        if self.status_retry()?["policy"]["hash"] == want.as_str() {
            return Ok(());
        }
        let tmp = self.policy.with_extension("yaml.new");
        std::fs::write(&tmp, text).context("write policy")?;
        std::fs::rename(&tmp, &self.policy).context("rename policy")?;
        let start = Instant::now();
        let mut hupped = false;
        loop {
            let st = self.status_retry()?;
            if st["policy"]["hash"] == want.as_str() {
                return Ok(());
            }
            if st["reloads"]["last"]["applied"] == false
                && let Some(errs) = st["reloads"]["last"]["errors"].as_array()
                && !errs.is_empty()
            {
                anyhow::bail!("{who}: the agent rejected the policy: {errs:?}");
            }
            if !hupped && start.elapsed() > hup_after {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(self.pid() as i32),
                    nix::sys::signal::Signal::SIGHUP,
                );
                hupped = true;
            }
            if start.elapsed() > Duration::from_secs(30) {
                anyhow::bail!("{who}: the agent did not load the new policy");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the agent patiently: SIGTERM, then up to a minute for it to exit by itself. Under
    /// TCG the agent needs several seconds to remove its qdiscs and programs, more than the 2 s
    /// [`Agent::stop`] grants before SIGKILL, and a killed agent leaves its qdiscs behind.
    /// Returns whether it exited in time (the guard reaps it either way).
    pub fn stop_patiently(self) -> bool {
        let pid = self.pid();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let end = Instant::now() + Duration::from_secs(60);
        while Instant::now() < end {
            // Exited but not reaped yet: a zombie (state Z), or gone.
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|st| {
                    st.rsplit_once(')')
                        .and_then(|(_, r)| r.split_whitespace().next().map(str::to_string))
                });
            if state.as_deref().is_none_or(|s| s == "Z") {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    pub fn kill9(mut self) {
        let mut c = self.child.take().expect("running");
        c.signal(nix::sys::signal::Signal::SIGKILL).expect("kill -9");
        c.wait_timeout(Duration::from_secs(10)).expect("wait");
    }
}

impl Drop for Agent<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.child.take() {
            let _ = c.stop();
        }
        let _ = &self.state_dir;
    }
}
