//! Floods and soaks, bounded and local: a million distinct flows through the
//! flow table, a reload soak and a SIGHUP storm, the policy file deleted or replaced by
//! something unreadable while the agent runs, and the metrics port taken at start.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use paceline_tests::{
    agent::{Agent, Scratch, bin},
    testbed::{self, Host, Testbed},
};

use crate::{privileged, test_run};

fn two_hosts(name: &str) -> (Testbed, Host, Host, String) {
    testbed::two_hosts(name).expect("testbed")
}

/// A policy whose every UDP flow gets a flow clock (a per-flow rate), with a flow table of
/// `flow_table` entries and `extra` classes (a different `extra` is a different policy).
fn policy(ifname: &str, flow_table: u32, extra: &str) -> String {
    policy_with(ifname, "none", flow_table, extra)
}

/// The soak policy. `track_flows: all`: without fq (or with `enforcement: none`) no flow clock
/// runs, and a policy left at `auto` would keep no flow in the table these tests fill.
fn policy_with(ifname: &str, enforcement: &str, flow_table: u32, extra: &str) -> String {
    format!(
        r#"apiVersion: paceline/v1
kind: Policy
metadata:
  name: soak
spec:
  interfaces: [{ifname}]
  enforcement: {enforcement}
  link_rate: 1Gbit
  horizon: 10s
  flow_table_size: {flow_table}
  track_flows: all
  levels:
    - name: bulk
      priority: 0
  classes:
    - name: flows
      level: bulk
      flow_rate: 500Mbit
    - name: other
      level: bulk
{extra}
  rules:
    - class: flows
      protocol: udp
  default_class: other
"#
    )
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write policy");
}

/// What the agent process holds: resident memory (KiB), open fds, BPF maps and programs among
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Footprint {
    rss_kib: u64,
    fds: usize,
    bpf_maps: usize,
    bpf_progs: usize,
}

fn footprint(pid: u32) -> Footprint {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/pid/status");
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    let (mut fds, mut bpf_maps, mut bpf_progs) = (0, 0, 0);
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc/pid/fd")
        .flatten()
    {
        fds += 1;
        match std::fs::read_link(e.path()) {
            Ok(t) if t.to_string_lossy() == "anon_inode:bpf-map" => bpf_maps += 1,
            Ok(t) if t.to_string_lossy() == "anon_inode:bpf-prog" => bpf_progs += 1,
            _ => {}
        }
    }
    Footprint {
        rss_kib,
        fds,
        bpf_maps,
        bpf_progs,
    }
}

fn sighup(pid: u32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .expect("SIGHUP");
}

fn u64_at(v: &serde_json::Value, path: &[&str]) -> u64 {
    let mut x = v;
    for p in path {
        x = &x[*p];
    }
    x.as_u64()
        .unwrap_or_else(|| panic!("no number at {path:?} in {v:#}"))
}

/// The datapath alone, on any kernel (BPF_PROG_TEST_RUN), with a 16,384-entry flow table.
/// First, 1,000 established flows (two packets each: a flow enters the table on its second)
/// and then 1,048,576 one-packet flows (65,536 under emulation, where a million took 80 s): the
/// flood inserts nothing and evicts none of the established flows, whose next packets still
/// find their class in the table. Then 65,536 two-packet flows, four times the table: every one
/// gets an entry, the table never holds more than its size, and inserts minus entries are the
/// evictions. Checked (2026-12-05): with every flow entered on its first packet (the admission
/// slot's check taken as a match), the flood evicted the established flows and this failed.
#[test]
fn a_flood_of_flows_through_the_datapath_evicts_and_counts() {
    use paceline::kernel::datapath::{Datapath, LoadOptions};
    use paceline_common::maps::ClassConfig;
    use paceline_tests::{packet, skb::SkBuff};
    if !privileged("a_flood_of_flows_through_the_datapath_evicts_and_counts") {
        return;
    }
    const CAPACITY: u32 = 16_384;
    let mut dp = Datapath::load(&LoadOptions {
        flow_table_size: CAPACITY,
        ..LoadOptions::default()
    })
    .expect("load the datapath");
    let mut t = test_run::table();
    t.classes[0] = ClassConfig {
        flow_rate: 1_000_000_000,
        ..ClassConfig::zeroed()
    };
    dp.write_rules(&t, &[]).expect("policy");
    let mut frame = packet::ipv4(
        [10, 0, 0, 1],
        [10, 0, 0, 2],
        packet::L4::Tcp { sport: 1, dport: 1 },
        0,
        0,
        &[],
        None,
        0,
    );
    // Ethernet (14) + IPv4 without options (20): the ports are the next four bytes; the
    // destination address's last byte tells the three sets of flows apart.
    const PORTS: usize = 14 + 20;
    const DST_LAST: usize = 14 + 19;
    let mut sent = 0u64;
    let mut send = |dp: &mut Datapath, set: u8, i: u64, packets: u32| {
        frame[DST_LAST] = set;
        frame[PORTS..PORTS + 2].copy_from_slice(&((i >> 16) as u16 + 1).to_be_bytes());
        frame[PORTS + 2..PORTS + 4].copy_from_slice(&(i as u16).to_be_bytes());
        for _ in 0..packets {
            let out = test_run::run(dp, &frame, SkBuff::default());
            assert_eq!(out.ret, test_run::TC_ACT_UNSPEC, "flow {set}/{i} passes");
            sent += 1;
        }
    };
    const ESTABLISHED: u64 = 1_000;
    for i in 0..ESTABLISHED {
        send(&mut dp, 2, i, 2);
    }
    let started = Instant::now();
    let flood: u64 = if crate::under_tcg() { 1 << 16 } else { 1 << 20 };
    for i in 0..flood {
        send(&mut dp, 3, i, 1);
    }
    let flood_took = started.elapsed();
    let s = dp.snapshot().expect("snapshot");
    let entries = s.flow_entries.expect("the flow table counted");
    eprintln!(
        "{ESTABLISHED} established flows, then {flood} one-packet flows in {flood_took:?}: {entries} entries, {} inserts, {} first packets",
        s.global.flow_inserts, s.global.flow_first_packets
    );
    assert_eq!(
        (s.global.flow_inserts, s.global.flow_first_packets),
        (ESTABLISHED, ESTABLISHED + flood),
        "the established flows entered the table on their second packets, the flood on none"
    );
    assert_eq!(entries, ESTABLISHED, "the flood evicted no established flow");
    // Their next packets find their class in the table: no insert, no first packet.
    for i in 0..ESTABLISHED {
        send(&mut dp, 2, i, 1);
    }
    let s = dp.snapshot().expect("snapshot");
    assert_eq!(
        (s.global.flow_inserts, s.global.flow_first_packets),
        (ESTABLISHED, ESTABLISHED + flood)
    );

    // Two-packet flows, four times the table: each enters it, the oldest are evicted.
    let flows = 4 * CAPACITY as u64;
    let mut timing = Vec::new();
    for i in 0..flows {
        let t0 = (i % (flows / 8) == 0).then(Instant::now);
        send(&mut dp, 4, i, 2);
        if let Some(t0) = t0 {
            timing.push(t0.elapsed());
        }
    }
    let s = dp.snapshot().expect("snapshot");
    // Counted afresh (the snapshot's count is at most a few seconds old).
    let entries = dp.flows(0).expect("the flow table").1 as u64;
    let inserts = s.global.flow_inserts - ESTABLISHED;
    eprintln!(
        "{flows} two-packet flows: {entries} entries of {CAPACITY}, {inserts} inserts, {} evictions; two test runs at each eighth: {timing:?}",
        s.global.flow_inserts - entries
    );
    assert_eq!(s.classes[0].packets, sent);
    assert_eq!(inserts, flows, "every flow of two packets got an entry");
    assert!(entries <= CAPACITY as u64, "bounded: {entries}");
    assert!(
        entries >= CAPACITY as u64 / 2,
        "a flooded table is mostly full: {entries}"
    );
}

/// The same through the agent, with real datagrams, and the counters it exports. Every flow
/// without a local TCP socket enters the flow table on its second packet (its class cached
/// there; its clock kept only where fq enforces it), so this runs with fq where the kernel has
/// it and with `enforcement: none` where it does not.
#[test]
fn new_flows_four_times_the_flow_table_stay_within_it_and_their_evictions_are_counted() {
    if !privileged("new_flows_four_times_the_flow_table_stay_within_it_and_their_evictions_are_counted") {
        return;
    }
    let mode = if paceline::kernel::features::Features::probe().sch_fq {
        "fq"
    } else {
        "none"
    };
    let (_tb, a, b, ifname) = two_hosts("soak_flood");
    let scratch = Scratch::new("flood");
    let p = scratch.path("p.yaml");
    const CAPACITY: u32 = 16_384;
    write(&p, &policy_with(&ifname, mode, CAPACITY, ""));
    let agent = Agent::start(&a, &p, &scratch.path("state"));
    let before = agent.status().expect("status");
    let memlock_before = before["flow_table"]["memlock_bytes"].clone();

    // One socket x 65,535 destination ports (port 0 is sent to port 1): 65,535 distinct UDP
    // flows, four times the table, two 32-byte datagrams each (a flow enters the table on its
    // second; a million datagrams took 160 s under emulation). Nobody listens; the datapath
    // sees every one on the way out.
    let to = b.ipv4();
    let started = Instant::now();
    let sent = a
        .in_netns(move || {
            let mut sent = 0u64;
            let s = std::net::UdpSocket::bind("0.0.0.0:0").expect("bind");
            for port in 0..=u16::MAX {
                // Port 0 is no destination; the socket's buffer may fill: retry.
                let port = port.max(1);
                for _ in 0..2 {
                    while s.send_to(&[0u8; 32], (to, port)).is_err() {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                    sent += 1;
                }
            }
            sent
        })
        .expect("in netns");
    eprintln!(
        "sent {sent} datagrams in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let flows = 65_535u64; // port 0 mapped onto port 1

    // The entries are counted every 5 s: wait for a count taken after the flood.
    std::thread::sleep(Duration::from_secs(6));
    let s = agent.wait_for("the flow table's counters", |s| {
        !s["counters"]["flow_table"].is_null()
    });
    let ft = &s["counters"]["flow_table"];
    let (entries, inserts, evictions, first_packets) = (
        u64_at(ft, &["entries"]),
        u64_at(ft, &["inserts"]),
        u64_at(ft, &["evictions"]),
        u64_at(ft, &["first_packets"]),
    );
    eprintln!(
        "flow table: {entries} entries of {CAPACITY}, {inserts} inserts, {evictions} evictions, {first_packets} first packets"
    );
    assert!(entries <= CAPACITY as u64, "bounded: {entries} > {CAPACITY}");
    assert!(
        entries >= CAPACITY as u64 / 2,
        "a flooded table is mostly full: {entries}"
    );
    // Every new flow got a clock (a few may have been sent twice: port 0 became port 1). The
    // namespace's own packets are flows of the table too (IPv6 neighbour discovery and MLD on
    // its interface; one CI run counted 131,073 inserts for 131,072 datagrams): a few more.
    const OWN_PACKETS: u64 = 64;
    assert!(
        inserts >= flows && inserts <= flows + OWN_PACKETS,
        "{inserts} inserts for {flows} flows ({sent} datagrams, and at most {OWN_PACKETS} of the namespace's own)"
    );
    assert!(
        first_packets >= flows && first_packets <= flows + OWN_PACKETS,
        "{first_packets} first packets for {flows} flows"
    );
    assert_eq!(evictions, inserts - entries);
    // The table's memory is allocated once: a flood does not grow it.
    let after = agent.status().expect("status");
    assert_eq!(after["flow_table"]["memlock_bytes"], memlock_before);
    // The counters the operator scrapes.
    let metrics = agent.http_get("/metrics");
    let metric = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<f64>().ok()))
            .unwrap_or_else(|| panic!("{name} missing from /metrics"))
            .round() as u64
    };
    assert!(metric("paceline_flow_table_evictions_total ") >= flows - CAPACITY as u64);
    assert!(metric("paceline_flow_table_inserts_total ") >= flows);
    assert!(metric("paceline_flow_first_packets_total ") >= flows);
    assert!(metric("paceline_flow_table_entries ") <= CAPACITY as u64);
    agent.stop();
}

#[test]
fn a_reload_soak_and_a_sighup_storm_leave_the_agent_as_it_was() {
    if !privileged("a_reload_soak_and_a_sighup_storm_leave_the_agent_as_it_was") {
        return;
    }
    let (_tb, a, _b, ifname) = two_hosts("soak_reload");
    // A local filesystem: on the VM's 9p share a file replaced a hundred times a second is read
    // torn (zeros, or cut short) for longer than the agent's re-reads wait (measured on 6.12:
    // 8 of 230 reloads, 2 with the re-reads), which is the share's behaviour, not a policy's.
    let scratch = Scratch::local("reload_soak");
    let p = scratch.path("p.yaml");
    let one = policy(&ifname, 4096, "");
    let two = policy(&ifname, 4096, "    - name: web\n      level: bulk\n");
    write(&p, &one);
    let agent = Agent::start(&a, &p, &scratch.path("state"));
    let pid = agent.pid();
    // The first reload allocates what every later one reuses (a classifier bank, buffers).
    write(&p, &two);
    agent.wait_for("the first reload", |s| s["reloads"]["applied"] == 1);
    write(&p, &one);
    agent.wait_for("the second reload", |s| s["reloads"]["applied"] == 2);
    let base = footprint(pid);

    // 100 reload requests a second for 60 s (PACELINE_SOAK_SECONDS to change), each a
    // different policy than the last: the file alternates, then SIGHUP.
    let secs: u64 = std::env::var("PACELINE_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let start = Instant::now();
    let mut requests = 0u64;
    let mut mid = None;
    while start.elapsed() < Duration::from_secs(secs) {
        let text = if requests.is_multiple_of(2) { &two } else { &one };
        let tmp = scratch.path("p.yaml.new");
        write(&tmp, text);
        std::fs::rename(&tmp, &p).expect("rename");
        sighup(pid);
        requests += 1;
        if mid.is_none() && start.elapsed() >= Duration::from_secs(secs / 2) {
            mid = Some(footprint(pid));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // A storm: 5,000 SIGHUPs back to back.
    for _ in 0..5000 {
        sighup(pid);
    }
    // The last text the file holds is the one that runs once the agent has caught up.
    let last = if requests.is_multiple_of(2) { &one } else { &two };
    let want_web = last.contains("name: web");
    let s = agent.wait_for("the agent to catch up", |s| {
        let has_web = s["policy"]["classes"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["name"] == "web"));
        has_web == want_web || s["reloads"]["rejected"] != 0
    });
    // Every text was valid: a rejection is a defect; say what the agent said.
    if s["reloads"]["rejected"] != 0 {
        let why: Vec<String> = agent
            .events()
            .iter()
            .filter(|e| e.to_string().contains("reload_rejected"))
            .map(|e| e.to_string())
            .take(5)
            .collect();
        panic!(
            "{} of the valid reloads were rejected: {why:#?}",
            s["reloads"]["rejected"]
        );
    }
    let applied = u64_at(&s, &["reloads", "applied"]);
    // Let the storm's last reloads finish before measuring.
    std::thread::sleep(Duration::from_secs(3));
    let end = footprint(pid);
    let mid = mid.expect("a mid-point measurement");
    eprintln!(
        "{requests} reload requests in {secs} s, {applied} reloads applied ({:.0}/s); \
         footprint before {base:?}, mid {mid:?}, after {end:?}",
        applied as f64 / start.elapsed().as_secs_f64()
    );
    assert!(applied >= 10, "reloads happened: {applied}");
    // Maps and programs exactly as before; descriptors no more than before. A connection of
    // the API or the metrics listener may be open at either measurement (a CI run on 6.1 had
    // one fewer at the end than at the start, 55 against 56), so the count is read again for
    // a few seconds until it is back; a leak of one per reload would be hundreds.
    let mut end = end;
    for _ in 0..5 {
        if end.fds <= base.fds {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
        end = footprint(pid);
    }
    assert_eq!(
        (end.bpf_maps, end.bpf_progs),
        (base.bpf_maps, base.bpf_progs),
        "no map or program leaks: {base:?} before, {end:?} after"
    );
    assert!(
        end.fds <= base.fds,
        "no descriptor leaks: {base:?} before, {end:?} after"
    );
    // Memory: no growth over the second half of the soak beyond allocator noise.
    assert!(
        end.rss_kib <= mid.rss_kib + 16 * 1024,
        "RSS grew from {} KiB at mid-soak to {} KiB",
        mid.rss_kib,
        end.rss_kib
    );
    let log = agent.stop();
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn a_policy_file_deleted_or_unreadable_keeps_the_running_policy() {
    if !privileged("a_policy_file_deleted_or_unreadable_keeps_the_running_policy") {
        return;
    }
    let (_tb, a, _b, ifname) = two_hosts("soak_file");
    let scratch = Scratch::local("file_gone");
    let p = scratch.path("p.yaml");
    let good = policy(&ifname, 4096, "");
    write(&p, &good);
    let agent = Agent::start(&a, &p, &scratch.path("state"));
    let hash = agent.status().expect("status")["policy"]["hash"].clone();
    let pid = agent.pid();
    let mut rejected = 0;
    // Each hostile replacement, then a SIGHUP (a watcher may miss a change; SIGHUP may not).
    type Make<'a> = Box<dyn Fn() + 'a>;
    let cases: Vec<(&str, Make)> = vec![
        ("deleted", Box::new(|| std::fs::remove_file(&p).expect("rm"))),
        (
            "a directory",
            Box::new(|| std::fs::create_dir(&p).expect("mkdir")),
        ),
        (
            "a dangling symlink",
            Box::new(|| std::os::unix::fs::symlink(scratch.path("nowhere.yaml"), &p).expect("ln")),
        ),
        (
            "a FIFO nobody writes",
            Box::new(|| nix::unistd::mkfifo(&p, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo")),
        ),
    ];
    for (what, make) in &cases {
        make();
        sighup(pid);
        rejected += 1;
        let s = agent.wait_for(&format!("the rejection of {what}"), |s| {
            s["reloads"]["rejected"].as_u64() >= Some(rejected)
        });
        rejected = u64_at(&s, &["reloads", "rejected"]);
        assert_eq!(s["policy"]["hash"], hash, "{what}: the running policy stays");
        let errors = s["reloads"]["last"]["errors"].to_string();
        assert!(
            errors.contains("p.yaml"),
            "{what}: the error names the file: {errors}"
        );
        // Clear the way for the next case.
        if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
            std::fs::remove_dir(&p).expect("rmdir");
        } else {
            let _ = std::fs::remove_file(&p);
        }
    }
    // The agent still serves and a good file is applied again.
    write(&p, &policy(&ifname, 4096, "    - name: web\n      level: bulk\n"));
    sighup(pid);
    let s = agent.wait_for("a good policy again", |s| {
        s["reloads"]["last"]["applied"] == true && s["policy"]["hash"] != hash
    });
    assert_eq!(s["reloads"]["last"]["errors"].as_array().map(Vec::len), Some(0));
    assert!(
        agent
            .http_get("/metrics")
            .contains("paceline_policy_last_reload_success 1")
    );
    agent.stop();
}

#[test]
fn a_metrics_port_already_taken_fails_the_start_with_a_clear_error() {
    if !privileged("a_metrics_port_already_taken_fails_the_start_with_a_clear_error") {
        return;
    }
    let (_tb, a, _b, ifname) = two_hosts("soak_port");
    let scratch = Scratch::new("port_taken");
    let p = scratch.path("p.yaml");
    write(&p, &policy(&ifname, 4096, ""));
    // Whatever listens on the agent's default address in its namespace.
    let _squatter = a
        .in_netns(|| std::net::TcpListener::bind("127.0.0.1:9977").expect("bind 9977"))
        .expect("in netns");
    let state = scratch.path("state");
    let bpffs = Agent::bpffs_dir(&state);
    let out = a
        .command(bin("plagent"))
        .args(["agent", "--policy"])
        .arg(&p)
        .arg("--state-dir")
        .arg(&state)
        .arg("--bpffs-dir")
        .arg(&bpffs)
        .output()
        .expect("run the agent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the agent must not run without its port:\n{stderr}"
    );
    assert!(
        stderr.contains("127.0.0.1:9977") && stderr.to_lowercase().contains("in use"),
        "the error names the address and the cause:\n{stderr}"
    );
    // Nothing left behind: no pins, no filters.
    assert!(
        !bpffs.exists() || std::fs::read_dir(&bpffs).map(|d| d.count()).unwrap_or(0) == 0,
        "pins left in {}",
        bpffs.display()
    );
}

/// Who may set deadlines: the D3 application map's pin is root's alone unless
/// the agent names a group, which then may open it read-write. The other pins stay root's.
#[test]
fn the_d3_application_map_opens_to_root_and_the_named_group_only() {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    if !privileged("the_d3_application_map_opens_to_root_and_the_named_group_only") {
        return;
    }
    let (_tb, a, _b, ifname) = two_hosts("soak_d3pin");
    let scratch = Scratch::new("d3pin");
    let p = scratch.path("p.yaml");
    write(
        &p,
        &policy(&ifname, 4096, "").replace("  default_class: other\n", "  default_class: other\n  d3: {}\n"),
    );
    // systemd mounts the BPF filesystem mode 0700 (the VMs' too): a group reaches its pin only
    // through directories it may search, as the agent's warning tells the operator.
    let bpffs = Path::new("/sys/fs/bpf");
    let bpffs_mode = std::fs::metadata(bpffs).expect("bpffs").permissions().mode();
    std::fs::set_permissions(bpffs, std::fs::Permissions::from_mode(bpffs_mode | 0o001)).expect("chmod");
    let mode_of = |path: &Path| {
        let m = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        (m.permissions().mode() & 0o777, m.uid(), m.gid())
    };
    for (group, want) in [(None, (0o600, 0, 0)), (Some(4242u32), (0o660, 0, 4242))] {
        let state = scratch.path(&format!("state-{group:?}"));
        let gid = group.map(|g| g.to_string());
        let extra: Vec<&str> = match &gid {
            Some(g) => vec!["--d3-app-group", g.as_str()],
            None => vec![],
        };
        let agent = Agent::start_with(&a, &p, &state, &extra);
        let pin = agent.d3_app_map();
        assert_eq!(mode_of(&pin), want, "{} with group {group:?}", pin.display());
        // A process of that group (and no other) opens it; nobody else does.
        let opens = |uid: u32, gid: u32| -> bool {
            use std::os::unix::process::CommandExt as _;
            let path = std::ffi::CString::new(pin.as_os_str().as_encoded_bytes()).expect("path");
            // BPF_OBJ_GET's attribute: pathname (u64), bpf_fd, file_flags.
            let mut attr = [0u64; 2];
            attr[0] = path.as_ptr() as u64;
            let mut cmd = std::process::Command::new("/bin/true");
            // SAFETY: only syscalls between fork and exec; the memory was prepared before.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setgroups(0, std::ptr::null()) != 0
                        || libc::setgid(gid) != 0
                        || libc::setuid(uid) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    let fd = libc::syscall(
                        libc::SYS_bpf,
                        paceline::kernel::bpfsys::BPF_OBJ_GET,
                        attr.as_ptr(),
                        16usize,
                    );
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                })
            };
            match cmd.status() {
                Ok(s) => s.success(),
                Err(e) => {
                    assert_eq!(
                        e.raw_os_error(),
                        Some(libc::EACCES),
                        "refused for want of permission: {e}"
                    );
                    false
                }
            }
        };
        assert!(!opens(65534, 65534), "nobody may open the pin");
        assert_eq!(opens(65534, 4242), group.is_some(), "the named group may open it");
        // The maps directory's pins are root's alone in both cases.
        let maps = Agent::bpffs_dir(&state).join("maps");
        for e in std::fs::read_dir(&maps).expect("maps dir").flatten() {
            assert_eq!(
                mode_of(&e.path()).0 & 0o077,
                0,
                "{} is root's",
                e.path().display()
            );
        }
        let log = agent.stop();
        assert!(!log.contains("cannot reach"), "{log}");
    }
    std::fs::set_permissions(bpffs, std::fs::Permissions::from_mode(bpffs_mode)).expect("chmod back");
}
