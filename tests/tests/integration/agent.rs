//! The agent end to end, in network namespaces: real traffic over a veth pair, counters, TCP
//! paced at its class's rate through the mechanism this kernel offers (fq + EDT where the
//! kernel has sch_fq, TCP's own pacing set through sock_ops where it does not), reloads of a
//! good and of a bad policy, clean exits, and recovery after `kill -9`.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use paceline_tests::{
    agent::{Agent, Scratch},
    testbed::{Host, Testbed},
};

use crate::privileged;

const AGENT: &str = env!("CARGO_BIN_EXE_plagent");
const PLLOAD: &str = env!("CARGO_BIN_EXE_plload");

/// What tc shows on an interface: the root qdisc, clsact and egress filters.
fn tc_snapshot(host: &Host, ifname: &str) -> String {
    let q = host
        .run(&["tc", "qdisc", "show", "dev", ifname])
        .expect("tc qdisc");
    let f = host
        .run(&["tc", "filter", "show", "dev", ifname, "egress"])
        .unwrap_or_default();
    // qdisc handles of the kernel's default root are stable; strip counters-free text only.
    format!("{q}{f}")
}

fn sch_fq_available() -> bool {
    paceline::kernel::features::Features::probe().sch_fq
}

fn two_hosts(name: &str) -> (Testbed, Host, Host, String) {
    paceline_tests::testbed::two_hosts(name).expect("testbed")
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write policy");
}

/// [`policy`] for the rate tests: enforcement `auto` and a horizon of 1 s, so a pause of the
/// sender (or of an emulated machine) shorter than that leaves packets queued instead of
/// costing a clock its time.
fn rate_policy(ifname: &str, extra_classes: &str, extra_rules: &str) -> String {
    policy(ifname, "auto", extra_classes, extra_rules)
        .replace("  link_rate: 1Gbit\n", "  link_rate: 1Gbit\n  horizon: 1s\n")
}

fn policy(ifname: &str, enforcement: &str, extra_classes: &str, extra_rules: &str) -> String {
    format!(
        r#"apiVersion: paceline/v1
kind: Policy
metadata:
  name: test
spec:
  interfaces: [{ifname}]
  enforcement: {enforcement}
  link_rate: 1Gbit
  levels:
    - name: high
      priority: 6
      dscp: 46
    - name: low
      priority: 0
  classes:
    - name: probe
      level: high
    - name: other
      level: low
{extra_classes}
  rules:
    - class: probe
      protocol: udp
      dst_port: 7001
{extra_rules}
  default_class: other
"#
    )
}

/// Sends `n` UDP datagrams from `from` to `to:port` (nobody needs to listen).
fn send_udp(from: &Host, to: std::net::Ipv4Addr, port: u16, n: usize) {
    from.in_netns(move || {
        let s = std::net::UdpSocket::bind("0.0.0.0:0").expect("bind");
        for _ in 0..n {
            s.send_to(&[0u8; 200], (to, port)).expect("send");
        }
    })
    .expect("in netns");
}

#[test]
fn agent_counts_tags_real_traffic_and_leaves_nothing_behind() {
    if !privileged("agent_counts_tags_real_traffic_and_leaves_nothing_behind") {
        return;
    }
    let (_tb, a, b, ifname) = two_hosts("agent_counts");
    let scratch = Scratch::new("counts");
    let before = tc_snapshot(&a, &ifname);
    write(&scratch.path("p.yaml"), &policy(&ifname, "auto", "", ""));
    let agent = Agent::start(&a, &scratch.path("p.yaml"), &scratch.path("state"));

    let status = agent.status().expect("status");
    let iface = &status["interfaces"][0];
    assert_eq!(iface["name"], ifname.as_str());
    let expected_attach = if paceline::kernel::features::Features::probe().tcx {
        "tcx"
    } else {
        "clsact"
    };
    assert_eq!(iface["attach"], expected_attach, "attach mode follows the kernel");
    assert_eq!(
        status["enforcement"]["mode"],
        if sch_fq_available() { "fq" } else { "htb" }
    );

    // Capture on b to check the DSCP the datapath wrote (level "high" rewrites to 46).
    let got_tos = b
        .in_netns(|| {
            let s = std::net::UdpSocket::bind("0.0.0.0:7001").expect("bind 7001");
            // IP_RECVTOS lets us read the TOS byte of received datagrams.
            let one: libc::c_int = 1;
            // SAFETY: valid socket and option.
            unsafe {
                libc::setsockopt(
                    std::os::fd::AsRawFd::as_raw_fd(&s),
                    libc::IPPROTO_IP,
                    libc::IP_RECVTOS,
                    (&one as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as u32,
                )
            };
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s
        })
        .expect("netns");
    send_udp(&a, b.ipv4(), 7001, 50);
    send_udp(&a, b.ipv4(), 7002, 30);
    let tos = recv_tos(&got_tos).expect("a datagram with its TOS");
    assert_eq!(tos >> 2, 46, "DSCP rewritten by the level");

    let probe = agent.class_counter("probe", "packets");
    let other = agent.class_counter("other", "packets");
    assert!(probe >= 50, "probe class counted {probe} packets, sent 50");
    assert!(other >= 30, "other class counted {other} packets, sent 30");
    assert!(agent.class_counter("probe", "tagged_packets") >= 50);

    let metrics = agent.http_get("/metrics");
    for name in [
        "paceline_class_packets_total{class=\"probe\",level=\"high\"}",
        "paceline_class_bytes_total",
        "paceline_class_added_delay_seconds_total",
        "paceline_class_dropped_packets_total",
        "paceline_level_packets_total{level=\"high\",priority=\"6\"}",
        "paceline_unparsed_packets_total{reason=\"non_ip\"}",
        "paceline_policy_reloads_total{result=\"rejected\"} 0",
        "paceline_kernel_feature{feature=\"sch_fq\"}",
        "paceline_interface_info{",
        "paceline_policy_info{",
    ] {
        assert!(metrics.contains(name), "/metrics lacks {name}:\n{metrics}");
    }
    let probe_line = metrics
        .lines()
        .find(|l| l.starts_with("paceline_class_packets_total{class=\"probe\""))
        .expect("probe packets");
    let n: u64 = probe_line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n >= 50, "{probe_line}");

    let log = agent.stop();
    assert!(log.contains("nothing left behind"), "log: {log}");
    assert_eq!(tc_snapshot(&a, &ifname), before, "qdiscs and filters restored");
    assert!(!scratch.path("state/state.json").exists(), "no state left");
}

fn recv_tos(s: &std::net::UdpSocket) -> Option<u8> {
    use std::os::fd::AsRawFd;
    let mut buf = [0u8; 2048];
    let mut cbuf = [0u64; 16];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr pointing at live buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: valid fd and msghdr.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return None;
    }
    // SAFETY: walking the control messages the kernel wrote into cbuf.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::IPPROTO_IP && (*c).cmsg_type == libc::IP_TOS {
                return Some(*libc::CMSG_DATA(c));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    None
}

#[test]
fn tcp_flow_paced_at_its_class_rate() {
    if !privileged("tcp_flow_paced_at_its_class_rate") {
        return;
    }
    let (_tb, a, b, ifname) = two_hosts("agent_pacing");
    let scratch = Scratch::new("pacing");
    let rate_mbit = 40u64;
    let classes = format!("    - name: paced\n      level: low\n      flow_rate: {rate_mbit}Mbit\n");
    let rules = "    - class: paced\n      protocol: tcp\n      dst_port: 5201\n";
    // The 1 s horizon as in the UDP test: the flow's clock may run ahead through a stall.
    let p = rate_policy(&ifname, &classes, rules);
    write(&scratch.path("p.yaml"), &p);
    let agent = Agent::start(&a, &scratch.path("p.yaml"), &scratch.path("state"));
    let mode = agent.status().expect("status")["enforcement"]["mode"]
        .as_str()
        .unwrap_or("")
        .to_string();

    let _server = b.spawn(&[PLLOAD, "serve", "--port", "5201"]).expect("server");
    std::thread::sleep(Duration::from_millis(500));
    let to = format!("{}:5201", b.ipv4());
    let client = a
        .spawn(&[PLLOAD, "bulk", "--to", &to, "--flows", "1", "--duration", "8"])
        .expect("client");
    // Skip the start (slow start, the first RTTs), then measure 4 s of steady state.
    std::thread::sleep(Duration::from_secs(2));
    let mark = paceline_tests::stolen::Mark::now();
    let measured = a.tx_rate(&ifname, Duration::from_secs(4)).expect("tx rate") * 8.0 / 1e6;
    let stolen = mark.fraction();
    drop(client);
    let configured = agent.class_counter("paced", "tcp_sockets_configured");
    let errors = agent.class_counter("paced", "tcp_sockopt_errors");
    assert!(
        configured >= 1,
        "sock_ops configured no socket of the class; status: {:#}",
        agent.status().unwrap()
    );
    assert_eq!(errors, 0, "the kernel refused a socket option");
    let ratio = measured / rate_mbit as f64;
    eprintln!(
        "mode {mode}: {measured:.2} Mbit/s on the wire for a {rate_mbit} Mbit/s class ({ratio:.3}); {:.1}% of the window stolen",
        stolen * 100.0
    );
    // Unpaced, a flow on a veth runs at Gbit/s. Paced, its frames leave at the class rate:
    // rates are wire rates, whether fq holds EDT timestamps or TCP paces its payload. Within
    // 5% over 4 s. Measured in the VM with the counters
    // read in-process: 0.999-1.000 (0.964-0.967 earlier, when spawning `ip` for each read
    // added its start-up under TCG to the window).
    // Precision is the pacing benchmark's job: 0.997-1.000 for TCP over 8 s windows.
    // The lower bound gives up the part of the window the machine stood still (`stolen`).
    assert!(
        (0.95 * (1.0 - stolen)..=1.03).contains(&ratio),
        "paced rate {measured:.2} Mbit/s vs {rate_mbit} Mbit/s in mode {mode}, {:.1}% stolen",
        stolen * 100.0
    );
    agent.stop();
}

#[test]
fn class_aggregate_rate_enforced_for_udp() {
    if !privileged("class_aggregate_rate_enforced_for_udp") {
        return;
    }
    let (_tb, a, b, ifname) = two_hosts("agent_aggregate");
    let scratch = Scratch::new("aggregate");
    let cap_mbit = 20.0;
    let classes = "    - name: capped\n      level: low\n      class_rate: 20Mbit\n";
    let rules = "    - class: capped\n      protocol: udp\n      dst_port: 5301-5304\n";
    // A horizon of 1 s: the class clock may run that far ahead of the present, so a pause of
    // the sender (or of an emulated machine: TCG stalls for hundreds of ms) shorter than that
    // leaves packets queued and costs the class no time.
    let p = rate_policy(&ifname, classes, rules);
    write(&scratch.path("p.yaml"), &p);
    let agent = Agent::start(&a, &scratch.path("p.yaml"), &scratch.path("state"));
    let mode = agent.status().expect("status")["enforcement"]["mode"]
        .as_str()
        .unwrap_or("")
        .to_string();
    // Four UDP flows at 20 Mbit/s each (80 Mbit/s offered) into a 20 Mbit/s class.
    let _server = b.spawn(&[PLLOAD, "serve", "--port", "5301"]).expect("server");
    let mut clients = Vec::new();
    for port in 5301..=5304 {
        let to = format!("{}:{port}", b.ipv4());
        clients.push(
            a.spawn(&[
                PLLOAD,
                "bulk",
                "--udp",
                "--to",
                &to,
                "--rate-bps",
                "20000000",
                "--duration",
                "8",
            ])
            .expect("client"),
        );
    }
    if mode == "htb" {
        htb_classes_bank_a_millisecond(&a, &ifname);
    }
    std::thread::sleep(Duration::from_secs(2));
    let mark = paceline_tests::stolen::Mark::now();
    let measured = a.tx_rate(&ifname, Duration::from_secs(5)).expect("tx rate") * 8.0 / 1e6;
    let stolen = mark.fraction();
    drop(clients);
    let ratio = measured / cap_mbit;
    eprintln!(
        "mode {mode}: 4 UDP flows, {measured:.2} Mbit/s on the wire for a {cap_mbit} Mbit/s class ({ratio:.3}); horizon drops {}; {:.1}% of the window stolen",
        agent.class_counter("capped", "dropped_horizon"),
        stolen * 100.0
    );
    // HTB (no fq) or the class's EDT clock with fq holds the aggregate at its rate (VM, read
    // in-process: 0.998-0.999 in three runs). The lower bound gives up the part of the window
    // the machine stood still: on the shared host, 0.970 with 5% stolen and 0.895 with 12%.
    assert!(
        (0.95 * (1.0 - stolen)..=1.03).contains(&ratio),
        "aggregate {measured:.2} Mbit/s vs {cap_mbit} Mbit/s in mode {mode}, {:.1}% stolen",
        stolen * 100.0
    );
    agent.stop();
}

/// Each HTB class the agent installed on `ifname` may send a millisecond of its rate back to
/// back (its `burst` and `cburst`): tc's default is one MTU on kernels with high-resolution
/// timers, with which a class loses its rate to every late dequeue (1 Gbit/s classes carried
/// 0.987-0.995 of their rate in `cargo xtask bench pacing --host --aggregates`). Checked by
/// dropping the `burst`/`cburst` arguments from `qdisc::install_htb`: this fails, as the
/// 20 Mbit/s class then reads `burst 1600b` against 2,500 bytes.
fn htb_classes_bank_a_millisecond(host: &Host, ifname: &str) {
    let out = host
        .run(&["tc", "class", "show", "dev", ifname])
        .expect("tc class show");
    let mut checked = 0;
    for line in out.lines().filter(|l| l.starts_with("class htb ")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let after = |key: &str| {
            let i = words
                .iter()
                .position(|w| *w == key)
                .unwrap_or_else(|| panic!("no {key} in {line}"));
            words[i + 1]
        };
        let rate_bytes = tc_rate_bits(after("rate")) / 8;
        let ceil_bytes = tc_rate_bits(after("ceil")) / 8;
        for (what, size, rate) in [
            ("burst", after("burst"), rate_bytes),
            ("cburst", after("cburst"), ceil_bytes),
        ] {
            let bytes = tc_size_bytes(size);
            assert!(
                bytes >= rate / 1000,
                "{what} {size} of an HTB class is less than a millisecond of its rate ({rate} bytes/s): {line}"
            );
        }
        checked += 1;
    }
    assert!(checked > 0, "no HTB class on {ifname}: {out}");
}

/// tc's rate as printed (`20Mbit`, `1Gbit`, `800Kbit`, `96bit`), in bits per second.
fn tc_rate_bits(s: &str) -> u64 {
    let (n, mult) = [("Gbit", 1e9), ("Mbit", 1e6), ("Kbit", 1e3), ("bit", 1.0)]
        .iter()
        .find_map(|(suffix, m)| s.strip_suffix(suffix).map(|n| (n, *m)))
        .unwrap_or_else(|| panic!("not a tc rate: {s}"));
    (n.parse::<f64>().unwrap_or_else(|_| panic!("not a tc rate: {s}")) * mult) as u64
}

/// tc's size as printed (`4018b`, `25Kb`, `1Mb`), in bytes.
fn tc_size_bytes(s: &str) -> u64 {
    let (n, mult) = [("Mb", 1024.0 * 1024.0), ("Kb", 1024.0), ("b", 1.0)]
        .iter()
        .find_map(|(suffix, m)| s.strip_suffix(suffix).map(|n| (n, *m)))
        .unwrap_or_else(|| panic!("not a tc size: {s}"));
    (n.parse::<f64>().unwrap_or_else(|_| panic!("not a tc size: {s}")) * mult) as u64
}

/// Runs a TCP bulk flow from `a` to a server on `b` at `port` and returns `ss -tin --tos` for
/// it once data flows (the connection established, sock_ops done). Polled rather than taken
/// after a fixed wait: under emulation on a loaded machine the flow once had not connected 2 s
/// in (2026-12-05).
fn bulk_and_ss(a: &Host, b: &Host, port: u16) -> String {
    let _server = b
        .spawn(&[PLLOAD, "serve", "--port", &port.to_string()])
        .expect("server");
    std::thread::sleep(Duration::from_millis(500));
    let to = format!("{}:{port}", b.ipv4());
    let client = a
        .spawn(&[PLLOAD, "bulk", "--to", &to, "--flows", "1", "--duration", "60"])
        .expect("client");
    let start = std::time::Instant::now();
    let ss = loop {
        std::thread::sleep(Duration::from_millis(500));
        let ss = a
            .run(&[
                "ss",
                "-tin",
                "--tos",
                "state",
                "established",
                "dport",
                &port.to_string(),
            ])
            .expect("ss");
        if (ss.contains("rto:") && ss.contains("bytes_acked:")) || start.elapsed() > Duration::from_secs(50) {
            break ss;
        }
    };
    drop(client);
    ss
}

/// The value of `key` (e.g. `"rto:"`) in `ss` output; panics when absent.
fn ss_field<'a>(ss: &'a str, key: &str) -> &'a str {
    ss.split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in ss output: {ss}"))
}

#[test]
fn class_tcp_settings_reach_the_socket() {
    if !privileged("class_tcp_settings_reach_the_socket") {
        return;
    }
    let (_tb, a, b, ifname) = two_hosts("agent_tcpopts");
    let scratch = Scratch::new("tcpopts");
    let classes =
        "    - name: rpc\n      level: high\n      tcp:\n        rto_min: 5ms\n        delack_max: 5ms\n";
    let rules = "    - class: rpc\n      protocol: tcp\n      dst_port: 5401\n";
    write(&scratch.path("p.yaml"), &policy(&ifname, "auto", classes, rules));
    let agent = Agent::start(&a, &scratch.path("p.yaml"), &scratch.path("state"));
    // The kernel's view of the socket: ss reports the current RTO in ms. On a veth the RTT is
    // tens of microseconds, so the RTO sits at its minimum: 200 ms by default, 5 ms here.
    let ss = bulk_and_ss(&a, &b, 5401);
    let rto: f64 = ss_field(&ss, "rto:")
        .parse()
        .unwrap_or_else(|_| panic!("no rto in ss output: {ss}"));
    assert!(
        rto < 50.0,
        "rto {rto} ms: rto_min 5ms did not reach the socket\n{ss}"
    );
    // The class's level (high) marks DSCP 46: sock_ops set the socket's TOS to 0xb8, so TCP
    // sends its segments marked and the classifier rewrites none of them after the handshake
    // (it still checks every packet; the SYN left before sock_ops ran).
    let tos = ss_field(&ss, "tos:");
    assert_eq!(tos, "0xb8", "the level's DSCP did not reach the socket\n{ss}");
    assert_eq!(
        agent.status().expect("status")["policy"]["tcp_dscp_by_socket"],
        true
    );
    let (packets, rewritten) = (
        agent.class_counter("rpc", "packets"),
        agent.class_counter("rpc", "tagged_packets"),
    );
    assert!(
        packets > 100 && rewritten <= 3,
        "{rewritten} of {packets} packets of the class needed a DSCP rewrite at tc"
    );
    assert!(agent.class_counter("rpc", "tcp_sockets_configured") >= 1);
    assert_eq!(
        agent.class_counter("rpc", "tcp_sockopt_errors"),
        0,
        "the kernel refused an option"
    );
    agent.stop();
}

#[test]
fn socket_dscp_is_left_to_the_classifier_when_a_route_is_unmanaged() {
    if !privileged("socket_dscp_is_left_to_the_classifier_when_a_route_is_unmanaged") {
        return;
    }
    let (tb, a, b, ifname) = two_hosts("agent_tos_unmanaged");
    // A second link gives host a a route through an interface the policy does not manage: a
    // mark set on the socket would leave there too, so sock_ops must not set one.
    let c = tb.add_host("c").expect("host c");
    tb.link(&a, &c).expect("second link");
    let scratch = Scratch::new("tos-unmanaged");
    let classes = "    - name: rpc\n      level: high\n";
    let rules = "    - class: rpc\n      protocol: tcp\n      dst_port: 5402\n";
    write(&scratch.path("p.yaml"), &policy(&ifname, "auto", classes, rules));
    let agent = Agent::start(&a, &scratch.path("p.yaml"), &scratch.path("state"));
    let ss = bulk_and_ss(&a, &b, 5402);
    let tos = ss_field(&ss, "tos:");
    assert_eq!(
        tos, "0",
        "sock_ops marked a socket whose host has an unmanaged route\n{ss}"
    );
    assert_eq!(
        agent.status().expect("status")["policy"]["tcp_dscp_by_socket"],
        false
    );
    // The classifier marks the segments on the managed interface instead.
    let (packets, rewritten) = (
        agent.class_counter("rpc", "packets"),
        agent.class_counter("rpc", "tagged_packets"),
    );
    assert!(
        packets > 100 && rewritten * 10 >= packets * 9,
        "{rewritten} of {packets} packets of the class rewritten at tc"
    );
    agent.stop();
}

#[test]
fn reload_applies_a_good_policy_and_keeps_running_one_on_a_bad_one() {
    if !privileged("reload_applies_a_good_policy_and_keeps_running_one_on_a_bad_one") {
        return;
    }
    let (_tb, a, _b, ifname) = two_hosts("agent_reload");
    let scratch = Scratch::new("reload");
    let p = scratch.path("p.yaml");
    write(&p, &policy(&ifname, "none", "", ""));
    let agent = Agent::start(&a, &p, &scratch.path("state"));
    let first = agent.status().expect("status");
    assert_eq!(first["policy"]["generation"], 1);
    let hash1 = first["policy"]["hash"].as_str().unwrap().to_string();

    // A good change: a new class. Written by rename, as editors do.
    let tmp = scratch.path("p.yaml.new");
    write(
        &tmp,
        &policy(
            &ifname,
            "none",
            "    - name: web\n      level: high\n",
            "    - class: web\n      protocol: tcp\n      dst_port: 443\n",
        ),
    );
    std::fs::rename(&tmp, &p).unwrap();
    let s = agent.wait_for("the reload", |s| s["reloads"]["applied"] == 1);
    assert_eq!(s["policy"]["generation"], 2);
    // The file and what runs are the same policy; the first version differs from it.
    let diff = |other: Option<&Path>| {
        let mut c = a.command(AGENT);
        c.args(["policy", "diff"]).arg(&p);
        match other {
            Some(o) => c.arg(o),
            None => c.arg("--running"),
        };
        c.output().expect("policy diff")
    };
    assert_eq!(
        diff(None).status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&diff(None).stdout)
    );
    write(&scratch.path("first.yaml"), &policy(&ifname, "none", "", ""));
    let d = diff(Some(&scratch.path("first.yaml")));
    assert_eq!(d.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&d.stdout).contains("classes.web: removed"),
        "{}",
        String::from_utf8_lossy(&d.stdout)
    );
    assert!(
        s["policy"]["classes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "web")
    );
    let hash2 = s["policy"]["hash"].as_str().unwrap().to_string();
    assert_ne!(hash1, hash2);

    // A bad change: an unknown field and a bad unit. Rejected, the running policy stays.
    // Written by rename too: a plain write truncates first, and a watcher reading between
    // the truncation and the write (a stall under TCG) sees a torn file, rejected for other
    // reasons than the ones checked here.
    let replace = |text: &str| {
        write(&tmp, text);
        std::fs::rename(&tmp, &p).unwrap();
    };
    replace(
        &policy(
            &ifname,
            "none",
            "    - name: web\n      level: high\n      flow_rate: 10 Gbits\n",
            "",
        )
        .replace("link_rate", "lnk_rate"),
    );
    let s = agent.wait_for("the rejection", |s| s["reloads"]["rejected"] == 1);
    assert_eq!(
        s["policy"]["hash"],
        hash2.as_str(),
        "the running policy stays in force"
    );
    assert_eq!(s["policy"]["generation"], 2);
    let errors = s["reloads"]["last"]["errors"].to_string();
    assert!(errors.contains("p.yaml"), "errors name the file: {errors}");
    assert!(errors.contains("lnk_rate"), "errors name the field: {errors}");

    // SIGHUP re-applies the file even when it did not change (here: still bad -> rejected again).
    // Counted from where the rejections settle: the watcher may read one change twice (a 6.12
    // run under emulation counted the bad file's rejection twice before the signal).
    let rejected = |s: &serde_json::Value| s["reloads"]["rejected"].as_u64().unwrap_or(0);
    let mut settled = rejected(&s);
    loop {
        std::thread::sleep(Duration::from_millis(1500));
        let now = rejected(&agent.status().expect("status"));
        if now == settled {
            break;
        }
        settled = now;
    }
    let pid = agent.pid();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    agent.wait_for("the SIGHUP reload", |s| rejected(s) > settled);
    // A restart-only change is refused with a message saying so.
    replace(&policy(&ifname, "none", "", "").replace(
        "  link_rate: 1Gbit\n",
        "  link_rate: 1Gbit\n  flow_table_size: 4096\n",
    ));
    let s = agent.wait_for("the refusal", |s| {
        rejected(s) > settled + 1 && s["reloads"]["last"]["errors"].to_string().contains("restart")
    });
    assert_eq!(s["policy"]["generation"], 2, "the running policy stays in force");
    agent.stop();
}

#[test]
fn reload_follows_a_configmap_style_symlink_swap() {
    if !privileged("reload_follows_a_configmap_style_symlink_swap") {
        return;
    }
    let (_tb, a, _b, ifname) = two_hosts("agent_cmswap");
    // A ConfigMap volume is a tmpfs; the VM's share (9p) is not where kubelet would put one.
    let scratch = Scratch::local("cmswap");
    // The layout kubelet gives a ConfigMap volume: policy.yaml -> ..data/policy.yaml,
    // ..data -> ..<timestamp>/; an update writes a new timestamp dir and renames ..data.
    let vol = scratch.path("vol");
    let v1 = vol.join("..2026_11_29_v1");
    std::fs::create_dir_all(&v1).unwrap();
    write(&v1.join("policy.yaml"), &policy(&ifname, "none", "", ""));
    std::os::unix::fs::symlink("..2026_11_29_v1", vol.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/policy.yaml", vol.join("policy.yaml")).unwrap();
    let p = vol.join("policy.yaml");
    let agent = Agent::start(&a, &p, &scratch.path("state"));
    assert_eq!(agent.status().expect("status")["policy"]["generation"], 1);

    // Unrelated churn in the directory does not count as a reload of any kind.
    write(&vol.join("unrelated.txt"), "noise");
    std::thread::sleep(Duration::from_millis(1500));
    let s = agent.status().expect("status");
    assert_eq!(s["reloads"]["applied"], 0, "{s:#}");
    assert_eq!(s["reloads"]["rejected"], 0, "{s:#}");

    let v2 = vol.join("..2026_11_29_v2");
    std::fs::create_dir_all(&v2).unwrap();
    write(
        &v2.join("policy.yaml"),
        &policy(
            &ifname,
            "none",
            "    - name: web\n      level: high\n",
            "    - class: web\n      protocol: tcp\n      dst_port: 443\n",
        ),
    );
    std::os::unix::fs::symlink("..2026_11_29_v2", vol.join("..data_tmp")).unwrap();
    std::fs::rename(vol.join("..data_tmp"), vol.join("..data")).unwrap();
    std::fs::remove_dir_all(&v1).unwrap();
    let s = agent.wait_for("the reload after the ..data swap", |s| {
        s["reloads"]["applied"] == 1
    });
    assert_eq!(s["policy"]["generation"], 2);
    assert!(
        s["policy"]["classes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "web"),
        "{s:#}"
    );
    agent.stop();
}

/// The packets counted in class slot `index` (all CPUs), read from the pinned counters map:
/// what the datapath counts while no agent runs.
fn pinned_class_packets(state_dir: &Path, index: usize) -> u64 {
    let path = Agent::bpffs_dir(state_dir).join("maps").join("PL_STATS");
    let data = aya::maps::MapData::from_pin(&path).expect("the pinned counters map");
    let map: aya::maps::PerCpuArray<_, paceline_common::maps::Counters> =
        aya::maps::PerCpuArray::try_from(aya::maps::Map::PerCpuArray(data)).expect("a per-CPU array");
    map.get(&(index as u32), 0)
        .expect("read the counters")
        .iter()
        .map(|c| c.packets)
        .sum()
}

#[test]
fn kill9_leaves_the_datapath_running_and_the_next_start_adopts_it() {
    if !privileged("kill9_leaves_the_datapath_running_and_the_next_start_adopts_it") {
        return;
    }
    let (_tb, a, b, ifname) = two_hosts("agent_kill9");
    let scratch = Scratch::new("kill9");
    let state = scratch.path("state");
    let pins = Agent::bpffs_dir(&state);
    let before = tc_snapshot(&a, &ifname);
    // fq where the kernel has it, HTB otherwise: either way a root qdisc the agent installed.
    let mode = if sch_fq_available() { "fq" } else { "htb" };
    write(&scratch.path("p.yaml"), &policy(&ifname, mode, "", ""));
    let agent = Agent::start(&a, &scratch.path("p.yaml"), &state);
    let probe = agent.class_index("probe");
    // fq as root on a single-queue device, mq with an fq per queue on a multi-queue one.
    let root = |snap: &str| {
        ["fq", "mq", "htb"]
            .iter()
            .any(|k| snap.contains(&format!("qdisc {k} 1: root")))
    };
    let installed = tc_snapshot(&a, &ifname);
    assert!(root(&installed), "root qdisc installed: {installed}");
    send_udp(&a, b.ipv4(), 7001, 10);
    agent.kill9();
    // The datapath goes on: the qdisc stays, and the classifier still counts the probe class.
    assert_eq!(
        tc_snapshot(&a, &ifname),
        installed,
        "kill -9 leaves the interface as it was"
    );
    let counted = pinned_class_packets(&state, probe);
    send_udp(&a, b.ipv4(), 7001, 20);
    assert_eq!(
        pinned_class_packets(&state, probe),
        counted + 20,
        "the classifier kept counting with no agent running"
    );

    // The next start adopts it: the same counters go on.
    let agent = Agent::start(&a, &scratch.path("p.yaml"), &state);
    send_udp(&a, b.ipv4(), 7001, 5);
    assert_eq!(
        agent.class_counter("probe", "packets"),
        counted + 25,
        "no counter went back"
    );
    agent.kill9();

    // `paceline cleanup` removes everything a killed agent left...
    let out = a
        .command(AGENT)
        .args(["cleanup", "--state-dir"])
        .arg(&state)
        .arg("--bpffs-dir")
        .arg(&pins)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(tc_snapshot(&a, &ifname), before, "cleanup restored the interface");
    assert!(!pins.exists(), "cleanup removed the pins: {}", pins.display());

    // ... and a clean stop after an adoption leaves nothing either.
    let agent = Agent::start(&a, &scratch.path("p.yaml"), &state);
    agent.kill9();
    let agent = Agent::start(&a, &scratch.path("p.yaml"), &state);
    let log = agent.stop();
    assert!(
        log.contains("did not exit cleanly"),
        "the restart reports the crash: {log}"
    );
    assert!(
        log.contains("adopt"),
        "and that it adopted the running datapath: {log}"
    );
    assert_eq!(tc_snapshot(&a, &ifname), before);
    assert!(!pins.exists(), "a clean stop removes the pins");
}

/// An upgrade whose policy table changed type starts `PL_TABLES` again, and with it the policy
/// generations (from 1): the maps that cache classes under a generation (the CPU's class memo
/// in `PL_CPU`, the flow table, socket storage) start again with it, so that no class cached
/// under the old numbering is taken for a new policy's of the same number; the others (the
/// counters) are kept. Seen by recording another fingerprint for `PL_TABLES` in `pins.json`
/// behind a killed agent's back. Checked (2026-12-06, host 6.18): with `numbering_restarts`
/// answering nothing, the start kept `PL_CPU` (and the flow table and socket storage) and this
/// failed.
#[test]
fn a_policy_table_of_another_type_starts_the_generation_keyed_caches_again() {
    if !privileged("a_policy_table_of_another_type_starts_the_generation_keyed_caches_again") {
        return;
    }
    let (_tb, a, b, ifname) = two_hosts("agent_gen");
    let scratch = Scratch::new("gen");
    let state = scratch.path("state");
    let mode = if sch_fq_available() { "fq" } else { "htb" };
    write(&scratch.path("p.yaml"), &policy(&ifname, mode, "", ""));
    let agent = Agent::start(&a, &scratch.path("p.yaml"), &state);
    send_udp(&a, b.ipv4(), 7001, 10);
    let counted = agent.class_counter("probe", "packets");
    agent.kill9();
    let pins_json = state.join("pins.json");
    let mut record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&pins_json).expect("pins.json")).expect("JSON");
    record["types"]["PL_TABLES"] = "0000000000000000".into();
    std::fs::write(&pins_json, record.to_string()).unwrap();
    let agent = Agent::start(&a, &scratch.path("p.yaml"), &state);
    send_udp(&a, b.ipv4(), 7001, 5);
    assert_eq!(
        agent.class_counter("probe", "packets"),
        counted + 5,
        "the counters were kept"
    );
    let log = agent.stop();
    for m in ["PL_TABLES", "PL_CPU", "PL_FLOWS", "PL_SOCK"] {
        assert!(log.contains(&format!("reset {m}")), "{m} started again: {log}");
    }
    assert!(!log.contains("reset PL_STATS"), "{log}");
}

/// Traffic straight through `kill -9`, a second without an agent, and the restart: a class
/// paced at its rate keeps it over windows that hold each instant (HTB on this kernel, fq in
/// the VMs), and a probe datagram sent every 100 us is neither lost nor left unclassified
/// (each one reaches the receiver and counts in its class, in the pinned counters the
/// restarted agent adopts).
///
/// Checked (2026-12-03, host 6.18): with the classifier's tcx link left unpinned (so it
/// detaches when the killed agent's descriptors close), 18,043 of 72,954 probes counted in no
/// class and the capped class ran at 5.2x its rate around the kill (1 s windows then); with the restarted agent
/// creating a fresh stats map instead of adopting the pinned one (`Pins::prepare`), 49,829 of
/// 75,605 probes went uncounted. Both failed here. A restart that replaces the root qdisc
/// instead of keeping it could not be tried this way: HTB refuses a `replace` of itself, so
/// that patch made the agent fail to start.
#[test]
fn a_class_rate_and_a_probe_every_100us_hold_straight_through_kill9_and_a_restart() {
    use std::net::UdpSocket;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    if !privileged("a_class_rate_and_a_probe_every_100us_hold_straight_through_kill9_and_a_restart") {
        return;
    }
    let (_tb, a, b, ifname) = two_hosts("agent_nogap");
    let scratch = Scratch::new("nogap");
    let state = scratch.path("state");
    let cap_mbit = 20.0;
    let classes = "    - name: capped\n      level: low\n      class_rate: 20Mbit\n";
    let rules = "    - class: capped\n      protocol: udp\n      dst_port: 5301-5304\n";
    write(&scratch.path("p.yaml"), &rate_policy(&ifname, classes, rules));
    let agent = Agent::start(&a, &scratch.path("p.yaml"), &state);
    let probe = agent.class_index("probe");
    // Four UDP flows at 15 Mbit/s each (60 Mbit/s offered) into the 20 Mbit/s class, for the
    // whole test.
    let _server = b.spawn(&[PLLOAD, "serve", "--port", "5301"]).expect("server");
    let mut clients = Vec::new();
    for port in 5301..=5304 {
        let to = format!("{}:{port}", b.ipv4());
        clients.push(
            a.spawn(&[
                PLLOAD,
                "bulk",
                "--udp",
                "--to",
                &to,
                "--rate-bps",
                "15000000",
                "--duration",
                "60",
            ])
            .expect("client"),
        );
    }
    // The probe: a numbered datagram every 100 us (late sends catch up, so the count follows
    // the clock) to the probe class's port, and a receiver that marks each number it gets.
    const PROBE_LEN: usize = 64;
    let probe_frame = (14 + 20 + 8 + PROBE_LEN) as u64;
    let rx = b
        .in_netns(|| UdpSocket::bind("0.0.0.0:7001"))
        .unwrap()
        .expect("bind the probe receiver");
    let rcvbuf: libc::c_int = 8 << 20;
    // SAFETY: an int option of a socket this test owns.
    let r = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&rx),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&rcvbuf as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "SO_RCVBUFFORCE: {}", std::io::Error::last_os_error());
    rx.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let tx = a
        .in_netns(|| UdpSocket::bind("0.0.0.0:0"))
        .unwrap()
        .expect("bind the probe sender");
    let dst = (b.ipv4(), 7001);
    let (stop, sent) = (AtomicBool::new(false), AtomicU64::new(0));
    let first_count = pinned_class_packets(&state, probe);
    let (received, report) = std::thread::scope(|s| {
        let _stop = paceline_tests::StopOnDrop(&stop);
        let sender = s.spawn(|| {
            let start = Instant::now();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let due = start.elapsed().as_micros() as u64 / 100;
                while n < due {
                    let mut buf = [0u8; PROBE_LEN];
                    buf[..8].copy_from_slice(&n.to_le_bytes());
                    tx.send_to(&buf, dst).expect("send a probe");
                    n += 1;
                    sent.store(n, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_micros(50));
            }
            n
        });
        let receiver = s.spawn(|| {
            let mut seen = Vec::<bool>::new();
            let mut buf = [0u8; 2048];
            let mut idle = 0;
            // Until the sender stopped and a second passed with nothing more.
            while idle < 5 {
                match rx.recv(&mut buf) {
                    Ok(n) if n == PROBE_LEN => {
                        idle = 0;
                        let i = u64::from_le_bytes(buf[..8].try_into().unwrap()) as usize;
                        if seen.len() <= i {
                            seen.resize(i + 1, false);
                        }
                        seen[i] = true;
                    }
                    Ok(_) => {}
                    Err(_) if stop.load(Ordering::Relaxed) => idle += 1,
                    Err(_) => {}
                }
            }
            seen
        });
        // The capped class's bytes on the wire between two instants: the device's bytes less
        // the probes' (the only other traffic).
        // With each mark the machine's stolen time, which a window's lower bound gives up.
        let mark = || {
            let c = a.dev_counters(&ifname).expect("device counters");
            let stolen = paceline_tests::stolen::Mark::now();
            (stolen, c.tx_bytes, sent.load(Ordering::Relaxed))
        };
        type M = (paceline_tests::stolen::Mark, u64, u64);
        let ratio = |(s0, b0, p0): &M, (s1, b1, p1): &M| {
            let bytes = (b1 - b0).saturating_sub((p1 - p0) * probe_frame);
            let secs = (s1.at() - s0.at()).as_secs_f64();
            (bytes as f64 * 8.0 / 1e6 / secs / cap_mbit, s1.fraction_since(s0))
        };
        // Windows of about 3 s around each instant, each giving up the part of it the machine
        // stood still (this one is shared: 0.78 of the rate with about 20% stolen), while a
        // gap of the datapath shows in the probes.
        std::thread::sleep(Duration::from_secs(2));
        let m0 = mark();
        std::thread::sleep(Duration::from_millis(1500));
        agent.kill9();
        std::thread::sleep(Duration::from_millis(1500));
        let m1 = mark();
        let agent = Agent::start(&a, &state.parent().unwrap().join("p.yaml"), &state);
        std::thread::sleep(Duration::from_millis(2500));
        let m2 = mark();
        std::thread::sleep(Duration::from_secs(1));
        stop.store(true, Ordering::Relaxed);
        let n = sender.join().unwrap();
        let seen = receiver.join().unwrap();
        let counted = agent.class_counter("probe", "packets") - first_count;
        agent.stop();
        let report = [
            ("around the kill", ratio(&m0, &m1)),
            ("around the restart", ratio(&m1, &m2)),
        ];
        ((n, seen, counted), report)
    });
    drop(clients);
    let (n, seen, counted) = received;
    let lost: Vec<usize> = (0..n as usize)
        .filter(|&i| !seen.get(i).copied().unwrap_or(false))
        .collect();
    eprintln!(
        "{n} probes sent, {} lost, {counted} counted in the probe class; {report:?}",
        lost.len()
    );
    assert!(n > 30_000, "a probe every 100 us for about six seconds: {n} sent");
    assert!(
        lost.is_empty(),
        "{} of {n} probes lost, the first {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    assert_eq!(
        counted, n,
        "every probe counted in its class, none left unclassified"
    );
    for (what, (r, stolen)) in report {
        assert!(
            (0.95 * (1.0 - stolen)..=1.05).contains(&r),
            "{what}: {r:.3} of the class rate, {:.1}% of the window stolen",
            stolen * 100.0
        );
    }
}

#[test]
fn second_agent_with_same_state_dir_is_refused() {
    if !privileged("second_agent_with_same_state_dir_is_refused") {
        return;
    }
    let (_tb, a, _b, ifname) = two_hosts("agent_lock");
    let scratch = Scratch::new("lock");
    write(&scratch.path("p.yaml"), &policy(&ifname, "none", "", ""));
    let agent = Agent::start(&a, &scratch.path("p.yaml"), &scratch.path("state"));
    let out = a
        .command(AGENT)
        .args(["agent", "--metrics-addr", "127.0.0.1:9978", "--policy"])
        .arg(scratch.path("p.yaml"))
        .arg("--state-dir")
        .arg(scratch.path("state"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("another paceline agent"));
    agent.stop();
}

#[test]
fn invalid_policy_refuses_to_start_and_changes_nothing() {
    if !privileged("invalid_policy_refuses_to_start_and_changes_nothing") {
        return;
    }
    let (_tb, a, _b, ifname) = two_hosts("agent_badstart");
    let scratch = Scratch::new("badstart");
    let before = tc_snapshot(&a, &ifname);
    write(
        &scratch.path("p.yaml"),
        &policy(&ifname, "auto", "", "").replace("dst_port: 7001", "dst_port: 70001"),
    );
    let out = a
        .command(AGENT)
        .args(["agent", "--policy"])
        .arg(scratch.path("p.yaml"))
        .arg("--state-dir")
        .arg(scratch.path("state"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("spec.rules[0].dst_port"), "names the field: {err}");
    assert!(err.contains("70001"), "shows the value: {err}");
    assert_eq!(tc_snapshot(&a, &ifname), before);
}
