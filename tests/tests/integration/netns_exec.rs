//! The agent started the way people try a network tool in a namespace, `ip netns exec NS
//! paceline agent ...`: a mount namespace of its own whose `/sys` is a fresh sysfs, with no BPF
//! filesystem and no cgroup2 mounted. The agent mounts both itself (bpffs at `/sys/fs/bpf`,
//! cgroup2 under its state directory), attaches sock_ops, and unmounts them at SIGTERM; a pin
//! directory it cannot mount is refused with the command that fixes it.

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use paceline_tests::{
    agent::{Agent, Scratch},
    testbed::{Host, two_hosts},
};
use serde_json::Value;

use crate::privileged;

const AGENT: &str = env!("CARGO_BIN_EXE_plagent");

/// Why `ip netns exec` cannot be tested here, if it cannot: `None` when it can. A kernel
/// without mount namespaces or cgroup2 is a reason to skip anywhere; a missing `ip`, or an
/// `ip netns exec` that fails, is one only outside CI (in CI, where the VMs and the host have
/// both, it is a failure).
fn netns_exec_skip(host: &Host) -> Option<String> {
    if !Path::new("/proc/self/ns/mnt").exists() {
        return Some("the kernel has no mount namespaces".into());
    }
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    for want in ["bpf", "cgroup2"] {
        if !fs.lines().any(|l| l.split_whitespace().last() == Some(want)) {
            return Some(format!("the kernel has no {want} file system"));
        }
    }
    let probe = Command::new("ip")
        .args(["netns", "exec", host.netns(), "true"])
        .output();
    let why = match probe {
        Ok(o) if o.status.success() => return None,
        Ok(o) => format!(
            "`ip netns exec` fails here: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("cannot run `ip`: {e}"),
    };
    if std::env::var_os("CI").is_some() {
        panic!("{why} (CI is set: this test must run)");
    }
    Some(why)
}

fn policy(ifname: &str) -> String {
    // enforcement auto needs sock_ops (htb or sockops without sch_fq; fq paces TCP from
    // sock_ops too): the agent attaches it wherever a cgroup2 hierarchy is mounted.
    format!(
        r#"apiVersion: paceline/v1
kind: Policy
metadata:
  name: netns-exec
spec:
  interfaces: [{ifname}]
  enforcement: auto
  link_rate: 1Gbit
  levels:
    - name: high
      priority: 6
    - name: low
      priority: 0
  classes:
    - name: web
      level: high
      flow_rate: 100Mbit
    - name: other
      level: low
  rules:
    - class: web
      protocol: tcp
      dst_port: 5201
  default_class: other
"#
    )
}

/// The mounts of a mountinfo text at `path` as (fstype, source).
fn mounts_at(mountinfo: &str, path: &Path) -> Vec<(String, String)> {
    let path = path.to_string_lossy();
    mountinfo
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            if left.split_whitespace().nth(4)? != path {
                return None;
            }
            let mut r = right.split_whitespace();
            Some((r.next()?.to_string(), r.next()?.to_string()))
        })
        .collect()
}

fn class_counter(status: &Value, class: &str, counter: &str) -> u64 {
    status["counters"]["classes"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == class))
        .and_then(|c| c[counter].as_u64())
        .unwrap_or(0)
}

fn status(host: &Host) -> Option<Value> {
    let out = host.command(AGENT).args(["status", "--json"]).output().ok()?;
    if !matches!(out.status.code(), Some(0 | 1)) {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

// Checked to fail without the mechanism (each patch applied alone, the test run, reverted):
// - the bpffs mount patched out of `Mounts::ensure` (`BpffsPlan::Mount` doing nothing): the
//   agent exits at start, "creating /sys/fs/bpf/paceline-test-.../maps: No such file or
//   directory", and the test panics "the agent did not come up";
// - the cgroup2 mount patched out (`Cgroup2Plan::Mount` doing nothing): the agent runs with
//   sock_ops off ("no cgroup v2 mount"); the test fails at "feature detection sees the
//   agent's cgroup2" (`kernel.cgroup2` null);
// - `Mounts::release` doing nothing: after SIGTERM the shell still in the agent's mount
//   namespace lists the bpf and cgroup2 mounts, and the test fails at "mounts of the agent
//   left behind after SIGTERM".
#[test]
fn agent_under_ip_netns_exec_mounts_bpffs_and_cgroup2_and_unmounts_them() {
    let test = "agent_under_ip_netns_exec_mounts_bpffs_and_cgroup2_and_unmounts_them";
    if !privileged(test) || paceline_tests::testbed::skip_if_unprivileged(test) {
        return;
    }
    let (_tb, a, b, ifname) = two_hosts("netns_exec").expect("testbed");
    if let Some(why) = netns_exec_skip(&a) {
        println!("SKIPPED: {test}: {why}");
        return;
    }
    // Local: the agent mounts cgroup2 under its state directory (the VM's share is 9p).
    let scratch = Scratch::local("netns-exec");
    let state = scratch.path("state");
    let pins = Agent::bpffs_dir(&state);
    let cg = state.join("cgroup2");
    std::fs::write(scratch.path("p.yaml"), policy(&ifname)).expect("policy");
    let pidfile = scratch.path("agent.pid");

    // The shell stays in the agent's mount namespace after the agent exits and prints that
    // namespace's mount table: what the agent left behind, seen from inside.
    let script = r#"pidfile="$1"; shift
"$@" & echo $! > "$pidfile"
wait $!; echo "agent exit $?"
echo "--- mountinfo"; cat /proc/self/mountinfo"#;
    let mut args: Vec<std::ffi::OsString> = ["ip", "netns", "exec", a.netns(), "sh", "-c", script, "sh"]
        .iter()
        .map(Into::into)
        .collect();
    args.push(pidfile.clone().into());
    args.extend([AGENT, "agent", "--policy"].map(Into::into));
    args.push(scratch.path("p.yaml").into());
    args.push("--state-dir".into());
    args.push(state.clone().into());
    args.push("--bpffs-dir".into());
    args.push(pins.clone().into());
    let mut shell = a.spawn(&args).expect("spawn ip netns exec");

    // Up: /readyz answers 200 in the namespace.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if Agent::request_opt(&a, "127.0.0.1:9977", "/readyz") == Some(200) {
            break;
        }
        if shell.try_wait().ok().flatten().is_some() || Instant::now() > deadline {
            let out = shell.stop();
            panic!(
                "the agent did not come up under ip netns exec:\n{}\n{}",
                out.stdout, out.stderr
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid");

    // What it says it mounted, and what feature detection saw.
    let st = status(&a).expect("status");
    assert_eq!(
        st["kernel"]["cgroup2"],
        cg.to_string_lossy().as_ref(),
        "feature detection sees the agent's cgroup2: {st:#}"
    );
    let mounted: Vec<(String, String)> = st["mounted"]
        .as_array()
        .expect("status lists what the agent mounted")
        .iter()
        .map(|m| {
            (
                m["fstype"].as_str().unwrap_or("").to_string(),
                m["path"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        mounted,
        vec![
            ("bpf".to_string(), "/sys/fs/bpf".to_string()),
            ("cgroup2".to_string(), cg.to_string_lossy().into_owned()),
        ]
    );
    let text = a.command(AGENT).arg("status").output().expect("paceline status");
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(
        text.contains(
            "mounted by the agent (none was mounted in its mount namespace): bpf at /sys/fs/bpf, cgroup2 at"
        ),
        "{text}"
    );

    // sock_ops attached at the root of that hierarchy sees a socket of the namespace: a TCP
    // connection from a to b on the class's port is configured.
    let listener = b
        .in_netns(|| std::net::TcpListener::bind("0.0.0.0:5201").expect("listen"))
        .expect("in netns");
    let to = (b.ipv4(), 5201u16);
    let conn = a
        .in_netns(move || std::net::TcpStream::connect(to).expect("connect"))
        .expect("in netns");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let st = status(&a).expect("status");
        if class_counter(&st, "web", "tcp_sockets_configured") >= 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sock_ops configured no socket of the class under ip netns exec; status: {st:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(conn);
    drop(listener);

    // What it mounted, seen from its own mount namespace.
    let inside = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("agent's mountinfo");
    assert_eq!(
        mounts_at(&inside, Path::new("/sys/fs/bpf")),
        vec![("bpf".to_string(), "paceline".to_string())],
        "a BPF filesystem the agent mounted at /sys/fs/bpf:\n{inside}"
    );
    assert_eq!(
        mounts_at(&inside, &cg),
        vec![("cgroup2".to_string(), "paceline".to_string())],
        "a cgroup2 hierarchy the agent mounted at {}:\n{inside}",
        cg.display()
    );
    let own = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        mounts_at(&own, &cg).is_empty(),
        "the agent's mounts stay in its mount namespace"
    );

    // SIGTERM the agent alone (not the shell, which reports after it).
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM)
        .expect("SIGTERM");
    let out = shell
        .wait_output(Duration::from_secs(60))
        .expect("the shell ends");
    assert!(
        out.stdout.contains("agent exit 0"),
        "the agent's exit:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    let after = out
        .stdout
        .split_once("--- mountinfo")
        .map(|(_, m)| m)
        .unwrap_or("");
    assert!(
        !after.is_empty(),
        "no mount table from the namespace:\n{}",
        out.stdout
    );
    let left: Vec<String> = after
        .lines()
        .filter(|l| {
            l.split_once(" - ")
                .is_some_and(|(_, r)| r.split_whitespace().nth(1) == Some("paceline"))
        })
        .map(str::to_string)
        .collect();
    assert!(
        left.is_empty(),
        "mounts of the agent left behind after SIGTERM: {left:#?}"
    );
    assert!(
        mounts_at(after, Path::new("/sys/fs/bpf")).is_empty() && mounts_at(after, &cg).is_empty(),
        "left behind:\n{after}"
    );
    let log = &out.stderr;
    for want in [
        "mounted a BPF filesystem at /sys/fs/bpf",
        "mounted a cgroup2 hierarchy at",
        "paceline running",
        "unmounted the bpf the agent mounted at /sys/fs/bpf",
        "unmounted the cgroup2 the agent mounted at",
    ] {
        assert!(log.contains(want), "the log lacks {want:?}:\n{log}");
    }
    assert!(
        !cg.exists(),
        "the cgroup2 mount point {} is removed",
        cg.display()
    );
}

// Checked to fail without the mechanism: with `Mounts::ensure` replaced by an empty `Mounts`
// in `agent::run`, the agent fails later with "creating .../file/pins/maps: Not a directory",
// which names no command: the test fails at "names the fix".
#[test]
fn agent_refuses_a_pin_dir_it_cannot_mount_and_names_the_fix() {
    let test = "agent_refuses_a_pin_dir_it_cannot_mount_and_names_the_fix";
    if !privileged(test) {
        return;
    }
    let scratch = Scratch::local("netns-refuse");
    let file = scratch.path("file");
    std::fs::write(&file, "not a directory").expect("file");
    let pins = file.join("pins");
    std::fs::write(scratch.path("p.yaml"), policy("lo")).expect("policy");
    let out = Command::new(AGENT)
        .args(["agent", "--policy"])
        .arg(scratch.path("p.yaml"))
        .arg("--state-dir")
        .arg(scratch.path("state"))
        .arg("--bpffs-dir")
        .arg(&pins)
        .output()
        .expect("run the agent");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the agent must refuse: {err}");
    let fix = format!("`mkdir -p {0} && mount -t bpf bpf {0}`", pins.display());
    assert!(err.contains(&pins.display().to_string()), "names the path: {err}");
    assert!(err.contains(&fix), "names the fix {fix}: {err}");
    assert!(
        !scratch.path("state").join("cgroup2").exists(),
        "nothing mounted before the refusal"
    );
}
