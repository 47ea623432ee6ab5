//! Self-tests of the testbed (root only; they print `SKIPPED: ...` and pass otherwise):
//! topology + ping, a 20 Mbit/s HTB bottleneck holding a TCP bulk flow, TBF and UDP loss,
//! commands/closures inside namespaces, cgroups, prefix uniqueness, leftover cleanup, and that
//! nothing is left after drop.

use super::*;
use crate::workload::{self, bulk, serve};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

fn gone(netns: &[String], prefix: &str) {
    for ns in netns {
        assert!(
            !Path::new("/run/netns").join(ns).exists(),
            "namespace {ns} still exists"
        );
    }
    let list = util::run("ip", &["netns", "list"]).unwrap();
    assert!(
        !list.contains(&format!("{prefix}-")),
        "ip netns list still shows {prefix}-*: {list}"
    );
    let links = util::run("ip", &["-o", "link", "show"]).unwrap();
    assert!(
        !links.contains(prefix),
        "root namespace still has {prefix}* interfaces"
    );
}

/// Runs a bulk TCP (or UDP) transfer from `from` to `to` through the testbed with the library
/// generators and returns the server's report.
fn transfer(
    from: &Host,
    to: &Host,
    opts_fn: impl FnOnce(SocketAddr) -> bulk::BulkOpts,
) -> (serve::ServeReport, bulk::BulkReport) {
    let server = to
        .in_netns(|| {
            serve::Server::start_plain(&serve::ServeOpts {
                port: 5001,
                ..Default::default()
            })
        })
        .unwrap()
        .unwrap();
    let opts = opts_fn(SocketAddr::new(IpAddr::V4(to.ipv4()), server.port()));
    let flows = opts.flows as usize;
    let tags = workload::Tags::new();
    let client = from.in_netns(|| bulk::run(&opts, &tags)).unwrap().unwrap();
    assert!(
        server.wait_flows(flows, Duration::from_secs(10)),
        "server saw {} of {flows} flows finish",
        server.finished_flows()
    );
    (server.report(&tags), client)
}

#[test]
fn star_ping_bottleneck_and_teardown() {
    if skip_if_unprivileged("star_ping_bottleneck_and_teardown") {
        return;
    }
    let tb = Testbed::new("selftest_star").unwrap();
    let star = tb
        .add_star(&StarSpec {
            senders: 1,
            bottleneck: Some(BottleneckSpec::htb(20_000_000, 100_000)),
            link: LinkOpts {
                ipv6: true,
                ..Default::default()
            },
            ..Default::default()
        })
        .unwrap();
    let (s0, rx) = (&star.senders[0], &star.receiver);
    // Names: unique prefix, <= 15 chars.
    for l in tb.links() {
        assert!(l.a.ifname.len() <= 15 && l.a.ifname.starts_with(tb.prefix()));
    }
    // Reachability across the router, both directions, IPv4 and IPv6.
    let rtt = s0.ping_ok(IpAddr::V4(rx.ipv4()), 3).unwrap();
    rx.ping_ok(IpAddr::V4(s0.ipv4()), 3).unwrap();
    s0.ping_ok(IpAddr::V6(rx.ipv6().unwrap()), 3).unwrap();
    println!("ping s0 -> rx: {rtt:?}");
    // Defaults: cubic, forwarding on the router, offloads off.
    assert_eq!(s0.sysctl_get("net.ipv4.tcp_congestion_control").unwrap(), "cubic");
    assert_eq!(star.router.sysctl_get("net.ipv4.ip_forward").unwrap(), "1");
    let k = s0.run(&["ethtool", "-k", &star.sender_iface(0).ifname]).unwrap();
    assert!(
        k.contains("tcp-segmentation-offload: off") && k.contains("generic-segmentation-offload: off"),
        "{k}"
    );

    // A TCP bulk flow through the 20 Mbit/s bottleneck.
    let (srv, cli) = transfer(s0, rx, |to| bulk::BulkOpts::tcp(to, 1, 5.0));
    let f = &srv.tcp_flows[0];
    let mbps = f.goodput_bps / 1e6;
    println!(
        "20 Mbit/s HTB bottleneck: goodput {mbps:.2} Mbit/s over {:.2} s ({} bytes), sender retrans {}",
        f.last_byte_s - f.first_byte_s,
        f.bytes,
        cli.summary.total_retrans
    );
    let q = star.bottleneck.as_ref().unwrap().stats().unwrap();
    println!("bottleneck qdisc: {q:?}");
    // Payload share of a 1514-byte frame is 1448/1514 = 95.6%: 19.1 Mbit/s of goodput.
    assert!(
        (17.0..=20.5).contains(&mbps),
        "goodput {mbps:.2} Mbit/s is not near 20"
    );
    assert!(q.bytes > f.bytes, "qdisc saw {} bytes, flow {}", q.bytes, f.bytes);
    assert_eq!(q.kind, "bfifo");
    let ls = star.router.link_stats(&star.bottleneck_iface().ifname).unwrap();
    assert!(ls.tx_bytes >= q.bytes);

    let names: Vec<String> = tb.hosts().iter().map(|h| h.netns().to_string()).collect();
    let prefix = tb.prefix().to_string();
    drop(star);
    drop(tb);
    gone(&names, &prefix);
}

#[test]
fn tbf_bottleneck_and_udp_loss() {
    if skip_if_unprivileged("tbf_bottleneck_and_udp_loss") {
        return;
    }
    let tb = Testbed::new("selftest_tbf").unwrap();
    let a = tb.add_host("a").unwrap();
    let r = tb.add_router("r").unwrap();
    let b = tb.add_host("b").unwrap();
    tb.link(&a, &r).unwrap();
    let l2 = tb.link(&r, &b).unwrap();
    tb.route_all().unwrap();
    let mut bn = l2
        .bottleneck_a_to_b(&BottleneckSpec::tbf(10_000_000, 50_000))
        .unwrap();
    // UDP at 5 Mbit/s fits: (almost) no loss.
    let (srv, _) = transfer(&a, &b, |to| bulk::BulkOpts {
        udp: true,
        rate_bps: Some(5_000_000),
        ..bulk::BulkOpts::tcp(to, 1, 2.0)
    });
    let u = &srv.udp_flows[0];
    println!(
        "UDP 5 Mbit/s over 10 Mbit/s TBF: loss {:.4}, goodput {:.2} Mbit/s, owd p50 {:.0} us",
        u.loss_rate,
        u.goodput_bps / 1e6,
        u.owd.p50_us
    );
    assert!(u.loss_rate < 0.01, "{u:?}");
    assert!((4.5e6..5.5e6).contains(&u.goodput_bps), "{}", u.goodput_bps);
    // UDP at 20 Mbit/s into 10 Mbit/s: about half is dropped by the TBF.
    let before = bn.stats().unwrap().drops;
    let (srv, _) = transfer(&a, &b, |to| bulk::BulkOpts {
        udp: true,
        rate_bps: Some(20_000_000),
        ..bulk::BulkOpts::tcp(to, 1, 2.0)
    });
    let u = &srv.udp_flows[0];
    let drops = bn.stats().unwrap().drops - before;
    println!(
        "UDP 20 Mbit/s over 10 Mbit/s TBF: loss {:.3}, goodput {:.2} Mbit/s, qdisc drops {drops}, owd p99 {:.0} us",
        u.loss_rate,
        u.goodput_bps / 1e6,
        u.owd.p99_us
    );
    assert!((0.35..0.65).contains(&u.loss_rate), "loss {}", u.loss_rate);
    assert!(drops > 0);
    assert!(
        u.lost_packets.abs_diff(drops) <= 3 + drops / 50,
        "lost {} vs qdisc drops {drops}",
        u.lost_packets
    );
    // Rate change in place.
    bn.set_rate(40_000_000).unwrap();
    let (srv, _) = transfer(&a, &b, |to| bulk::BulkOpts {
        udp: true,
        rate_bps: Some(20_000_000),
        ..bulk::BulkOpts::tcp(to, 1, 1.0)
    });
    assert!(srv.udp_flows[0].loss_rate < 0.02, "{:?}", srv.udp_flows[0]);
    bn.remove().unwrap();
    assert!(
        l2.host_a()
            .qdisc_stats(&l2.a.ifname)
            .unwrap()
            .iter()
            .all(|q| q.kind != "tbf")
    );
}

#[test]
fn commands_closures_and_cgroups() {
    if skip_if_unprivileged("commands_closures_and_cgroups") {
        return;
    }
    let tb = Testbed::new("selftest_cmd").unwrap();
    let a = tb.add_host("a").unwrap();
    let b = tb.add_host("b").unwrap();
    let l = tb.link(&a, &b).unwrap();
    // Commands see the namespace's interfaces and keep the root mount namespace.
    let out = a.run(&["ip", "-o", "link"]).unwrap();
    assert!(out.contains(&l.a.ifname) && !out.contains(&l.b.ifname), "{out}");
    let err = a.run(&["ip", "link", "show", "dev", "nonexistent0"]).unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("nonexistent0") && msg.contains("stderr") && msg.contains(a.netns()),
        "{msg}"
    );
    // Closures run on a thread inside the namespace.
    let dev = a
        .in_netns(|| std::fs::read_to_string("/proc/thread-self/net/dev").unwrap())
        .unwrap();
    assert!(dev.contains(&l.a.ifname) && !dev.contains(&l.b.ifname));
    let here = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
    assert!(!here.contains(&l.a.ifname));
    // Panics propagate.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.in_netns(|| panic!("boom"))));
    assert!(r.is_err());
    // Spawned children are killed on drop; output is captured.
    let c = a.spawn(&["sh", "-c", "echo hi; echo err >&2; sleep 30"]).unwrap();
    let pid = c.pid();
    std::thread::sleep(Duration::from_millis(200));
    let out = c.stop();
    assert_eq!(out.stdout.trim(), "hi");
    assert_eq!(out.stderr.trim(), "err");
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| s.contains(") Z"))
                .unwrap_or(true)
    );
    let done = a
        .spawn(&["true"])
        .unwrap()
        .wait_output(Duration::from_secs(5))
        .unwrap();
    assert!(done.success());
    assert!(
        a.spawn(&["false"])
            .unwrap()
            .wait_output(Duration::from_secs(5))
            .is_err()
    );
    // Set the congestion control per namespace.
    b.set_congestion_control("reno").unwrap();
    assert_eq!(b.sysctl_get("net.ipv4.tcp_congestion_control").unwrap(), "reno");
    assert_eq!(a.sysctl_get("net.ipv4.tcp_congestion_control").unwrap(), "cubic");
    // cgroups: a child starts inside, the directory goes away on drop.
    let cg = tb.cgroup("agent").unwrap();
    let mut cmd = a.command("sleep");
    cmd.arg("30");
    cg.attach(&mut cmd);
    let child = a.spawn_cmd(cmd).unwrap();
    let procs = cg.procs().unwrap();
    assert!(procs.contains(&child.pid()), "{procs:?} vs {}", child.pid());
    assert!(cg.path().starts_with(cgroup2_mount().unwrap()));
    let dir = cg.path().to_path_buf();
    drop(child);
    drop(cg);
    assert!(!dir.exists());
    // A cgroup with a live process is still removed (the process is killed).
    let cg = tb.cgroup("busy").unwrap();
    let mut cmd = a.command("sleep");
    cmd.arg("30");
    cg.attach(&mut cmd);
    let child = a.spawn_cmd(cmd).unwrap();
    let dir = cg.path().to_path_buf();
    drop(cg);
    assert!(!dir.exists());
    drop(child);
}

#[test]
fn prefixes_are_unique_and_leftovers_cleaned() {
    if skip_if_unprivileged("prefixes_are_unique_and_leftovers_cleaned") {
        return;
    }
    let t1 = Testbed::new("selftest_same").unwrap();
    let t2 = Testbed::new("selftest_same").unwrap();
    assert_ne!(t1.prefix(), t2.prefix());
    assert_eq!(t1.prefix().len(), 7);
    let h1 = t1.add_host("h").unwrap();
    let h2 = t2.add_host("h").unwrap();
    assert_ne!(h1.netns(), h2.netns());
    let p1 = t1.prefix().to_string();
    drop(t1);
    drop(t2);
    // Simulate a crashed run: a namespace with a process in it and a cgroup, no lock holder.
    let ns = format!("{p1}-crashed");
    util::run("ip", &["netns", "add", &ns]).unwrap();
    let ghost = Host {
        inner: Arc::new(HostInner {
            name: "crashed".into(),
            netns: ns.clone(),
            router: false,
            ifaces: Mutex::new(Vec::new()),
        }),
    };
    let mut sleeper = ghost.command("sleep");
    sleeper.arg("60");
    let mut sleeper = sleeper.spawn().unwrap();
    let cgdir = cgroup2_mount()
        .unwrap()
        .join(CGROUP_PARENT)
        .join(format!("{p1}-old"));
    std::fs::create_dir_all(&cgdir).unwrap();
    let t3 = Testbed::new("selftest_same").unwrap();
    assert_eq!(t3.prefix(), p1, "a free prefix is reused");
    assert!(
        !Path::new("/run/netns").join(&ns).exists(),
        "leftover namespace removed"
    );
    assert!(!cgdir.exists(), "leftover cgroup removed");
    let st = sleeper.wait().unwrap();
    assert!(!st.success(), "leftover process was killed");
    drop(t3);
}

#[test]
fn star_fanout_workloads() {
    if skip_if_unprivileged("star_fanout_workloads") {
        return;
    }
    use crate::workload::{incast, pa, rpc};
    let t0 = std::time::Instant::now();
    let tb = Testbed::new("selftest_fanout").unwrap();
    let star = tb
        .add_star(&StarSpec {
            senders: 8,
            bottleneck: Some(BottleneckSpec::htb(100_000_000, 100_000)),
            ..Default::default()
        })
        .unwrap();
    println!("star with 8 senders built in {:?}", t0.elapsed());
    // One server per sender (the partition-aggregate workers / incast servers).
    let servers: Vec<serve::Server> = star
        .senders
        .iter()
        .map(|s| {
            s.in_netns(|| {
                serve::Server::start_plain(&serve::ServeOpts {
                    port: 5001,
                    ..Default::default()
                })
            })
            .unwrap()
            .unwrap()
        })
        .collect();
    let addrs: Vec<SocketAddr> = star
        .senders
        .iter()
        .map(|s| SocketAddr::new(IpAddr::V4(s.ipv4()), 5001))
        .collect();
    let tags = workload::Tags::new();
    let mut po = pa::PaOpts::new(addrs.clone(), 30.0);
    po.queries = 30;
    let p = star.receiver.in_netns(|| pa::run(&po, &tags)).unwrap().unwrap();
    println!(
        "pa 8 workers, 100 Mbit/s: app throughput {:.3}, fct p50 {:.2} ms p99 {:.2} ms, goodput {:.1} Mbit/s",
        p.summary.app_throughput,
        p.summary.p50_fct_ms,
        p.summary.p99_fct_ms,
        p.summary.goodput_bps / 1e6
    );
    assert_eq!(p.summary.responses, 240);
    assert!(p.summary.goodput_bps < 100e6);
    let mut io = incast::IncastOpts::new(addrs.clone());
    io.blocks = 10;
    io.fragment = 65536;
    let i = star
        .receiver
        .in_netns(|| incast::run(&io, &tags))
        .unwrap()
        .unwrap();
    println!(
        "incast 8 x 64 KiB x 10 blocks: goodput {:.1} Mbit/s, block p50 {:.2} ms max {:.2} ms",
        i.summary.goodput_bps / 1e6,
        i.summary.p50_block_ms,
        i.summary.max_block_ms
    );
    assert_eq!(i.block_ms.len(), 10);
    let served: u64 = servers
        .iter()
        .map(|s| s.report(&tags).summary.requests_served)
        .sum();
    assert_eq!(served, 240 + 80);
    // RPC from a sender to a server on the receiver, through the router.
    let rxs = star
        .receiver
        .in_netns(|| {
            serve::Server::start_plain(&serve::ServeOpts {
                port: 5002,
                ..Default::default()
            })
        })
        .unwrap()
        .unwrap();
    let ro = rpc::RpcOpts::closed_loop(SocketAddr::new(IpAddr::V4(star.receiver.ipv4()), rxs.port()), 0.5);
    let r = star.senders[3]
        .in_netns(|| rpc::run(&ro, &tags))
        .unwrap()
        .unwrap();
    println!(
        "rpc s3 -> rx: {} requests, p50 {:.0} us p99 {:.0} us",
        r.summary.received, r.latency.p50_us, r.latency.p99_us
    );
    assert!(r.summary.received > 50 && r.summary.lost == 0);
    drop(rxs);
    drop(servers);
    let t1 = std::time::Instant::now();
    drop(star);
    drop(tb);
    println!("teardown in {:?}", t1.elapsed());
}

#[test]
fn plload_binary_in_namespaces() {
    if skip_if_unprivileged("plload_binary_in_namespaces") {
        return;
    }
    // The binary next to the test executable (target/<profile>/plload), if cargo built it.
    let Some(plload) = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.parent()?.join("plload")))
        .filter(|p| p.exists())
    else {
        println!("SKIPPED: plload_binary_in_namespaces: plload not built (cargo build --bins)");
        return;
    };
    let tb = Testbed::new("selftest_plload").unwrap();
    let star = tb
        .add_star(&StarSpec {
            senders: 2,
            bottleneck: Some(BottleneckSpec::htb(50_000_000, 150_000)),
            ..Default::default()
        })
        .unwrap();
    let srv = star
        .receiver
        .spawn(&[
            plload.to_str().unwrap(),
            "serve",
            "--port",
            "6000",
            "--flows",
            "2",
            "--duration",
            "30",
            "--tag",
            "mode=test",
        ])
        .unwrap();
    let to = format!("{}:6000", star.receiver.ipv4());
    let clients: Vec<ChildGuard> = star
        .senders
        .iter()
        .enumerate()
        .map(|(i, s)| {
            s.spawn(&[
                plload.to_str().unwrap(),
                "bulk",
                "--to",
                &to,
                "--duration",
                "2",
                "--first-flow-id",
                &i.to_string(),
                "--cc",
                "reno",
            ])
            .unwrap()
        })
        .collect();
    for c in clients {
        let out = c.wait_output(Duration::from_secs(20)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(v["kind"], "bulk");
    }
    let out = srv.wait_output(Duration::from_secs(20)).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let agg = v["summary"]["aggregate_goodput_bps"].as_f64().unwrap();
    println!(
        "2 reno flows through 50 Mbit/s: aggregate {:.1} Mbit/s, jain {:.3}",
        agg / 1e6,
        v["summary"]["jain_fairness"].as_f64().unwrap()
    );
    assert!((40e6..=51e6).contains(&agg), "{agg}");
}
