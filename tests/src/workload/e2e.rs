//! End-to-end tests of the generators over loopback (no root needed): every client against
//! the server, the response hook, and the `plload`/`plreport` binaries when they are built.

use super::hook::ResponseHook;
use super::serve::{ServeOpts, Server};
use super::*;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn server() -> Server {
    Server::start_plain(&ServeOpts {
        bind: Some("127.0.0.1".parse().unwrap()),
        ..Default::default()
    })
    .unwrap()
}

fn addr(s: &Server) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], s.port()))
}

#[test]
fn bulk_tcp_sized_flows() {
    let s = server();
    let mut o = bulk::BulkOpts::tcp(addr(&s), 2, 0.0);
    o.duration = None;
    o.bytes = Some(2_000_000);
    o.sock.cc = Some("reno".into());
    let r = bulk::run(&o, &Tags::new()).unwrap();
    assert_eq!(r.flows.len(), 2);
    assert!(
        r.flows
            .iter()
            .all(|f| f.bytes_sent == 2_000_000 && f.fct_s.is_some() && f.tcp.is_some())
    );
    assert!(s.wait_flows(2, Duration::from_secs(5)));
    let rep = s.report(&Tags::new());
    assert_eq!(rep.summary.tcp_flows, 2);
    assert_eq!(rep.summary.completed_flows, 2);
    assert_eq!(rep.summary.total_bytes, 4_000_000);
    assert!(
        rep.tcp_flows
            .iter()
            .all(|f| f.complete && f.closed && f.goodput_bps > 0.0)
    );
    assert!(rep.summary.jain_fairness > 0.0);
}

#[test]
fn bulk_udp_rate_and_end_marker() {
    let s = server();
    let mut o = bulk::BulkOpts::tcp(addr(&s), 1, 0.5);
    o.udp = true;
    o.rate_bps = Some(8_000_000);
    let r = bulk::run(&o, &Tags::new()).unwrap();
    let f = &r.flows[0];
    // 0.5 s at 8 Mbit/s = 500 kB.
    assert!((450_000..=560_000).contains(&f.bytes_sent), "{f:?}");
    assert!(s.wait_flows(1, Duration::from_secs(2)));
    let rep = s.report(&Tags::new());
    let u = &rep.udp_flows[0];
    assert_eq!(u.sent_packets, Some(f.packets_sent));
    assert_eq!(u.lost_packets, 0, "{u:?}");
    assert!(u.owd.count > 0 && u.owd.p50_us < 10_000.0);
}

#[test]
fn rpc_all_modes() {
    let s = server();
    let t = Tags::new();
    let mut o = rpc::RpcOpts::closed_loop(addr(&s), 0.3);
    let r = rpc::run(&o, &t).unwrap();
    assert!(r.summary.received > 100 && r.summary.lost == 0, "{:?}", r.summary);
    assert!(
        r.latency.p50_us > 0.0
            && r.latency.p50_us <= r.latency.p99_us
            && r.latency.p99_us <= r.latency.max_us
    );
    o.rate = Some(2000.0);
    o.conns = 2;
    o.samples = true;
    o.resp_size = 3000;
    let r = rpc::run(&o, &t).unwrap();
    assert!((550..=650).contains(&r.summary.sent), "{:?}", r.summary);
    assert_eq!(r.summary.received, r.summary.sent);
    assert_eq!(
        r.samples_us.as_ref().unwrap().len() as u64,
        r.summary.latency.count
    );
    o.poisson = true;
    o.udp = true;
    o.timeout_ms = 200;
    let r = rpc::run(&o, &t).unwrap();
    assert!(
        r.summary.sent > 300 && r.summary.received == r.summary.sent,
        "{:?}",
        r.summary
    );
    o.rate = None;
    o.requests = Some(50);
    let r = rpc::run(&o, &t).unwrap();
    assert_eq!((r.summary.sent, r.summary.received), (50, 50));
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["kind"], "rpc");
    assert!(json["summary"]["p99_us"].is_number());
}

struct Recorder(Mutex<Vec<(u64, Option<Duration>)>>);

impl ResponseHook for Recorder {
    fn before_response(&self, fd: RawFd, size: u64, deadline: Option<Duration>) -> std::io::Result<()> {
        assert!(fd >= 0);
        self.0.lock().unwrap().push((size, deadline));
        Ok(())
    }
}

#[derive(Clone)]
struct Shared(Arc<Recorder>);

impl ResponseHook for Shared {
    fn before_response(&self, fd: RawFd, size: u64, deadline: Option<Duration>) -> std::io::Result<()> {
        self.0.before_response(fd, size, deadline)
    }
}

#[test]
fn partition_aggregate_and_hook() {
    let rec = Arc::new(Recorder(Mutex::new(Vec::new())));
    let s = Server::start(
        &ServeOpts {
            bind: Some("127.0.0.1".parse().unwrap()),
            ..Default::default()
        },
        Box::new(Shared(rec.clone())),
    )
    .unwrap();
    let mut o = pa::PaOpts::new(vec![addr(&s); 3], 20.0);
    o.queries = 20;
    o.interval_ms = 1.0;
    let r = pa::run(&o, &Tags::new()).unwrap();
    assert_eq!(r.summary.responses, 60);
    assert_eq!(r.summary.met + r.summary.missed, 60);
    assert!(r.summary.app_throughput > 0.8, "{:?}", r.summary);
    let plan: Vec<(u64, u64)> = pa::draws(&o).unwrap().into_iter().flatten().collect();
    for (resp, (size, d_us)) in r.responses.iter().zip(&plan) {
        assert_eq!(resp.size, *size);
        assert_eq!(resp.deadline_ms, *d_us as f64 / 1000.0);
        assert_eq!(resp.met, resp.fct_ms <= resp.deadline_ms);
    }
    // The hook saw every (size, deadline), in some order per query.
    let mut seen: Vec<(u64, u64)> = rec
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|(s, d)| (*s, d.unwrap().as_micros() as u64))
        .collect();
    let mut want = plan.clone();
    seen.sort();
    want.sort();
    assert_eq!(seen, want);
}

#[test]
fn incast_blocks() {
    let s = server();
    let mut o = incast::IncastOpts::new(vec![addr(&s); 4]);
    o.fragment = 65536;
    o.blocks = 10;
    let r = incast::run(&o, &Tags::new()).unwrap();
    assert_eq!(r.block_ms.len(), 10);
    assert_eq!(r.summary.total_bytes, 4 * 10 * 65536);
    assert!(r.summary.goodput_bps > 0.0 && r.summary.max_block_ms >= r.summary.p50_block_ms);
    assert_eq!(s.report(&Tags::new()).summary.requests_served, 40);
}

/// The built binaries next to the test executable (target/<profile>/), if cargo built them.
fn bin(name: &str) -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.parent()?.join(name);
    p.exists().then_some(p)
}

#[test]
fn plload_and_plreport_binaries() {
    let (Some(plload), Some(plreport)) = (bin("plload"), bin("plreport")) else {
        println!("SKIPPED: plload_and_plreport_binaries: binaries not built (cargo build --bins)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("plload-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let srv_out = dir.join("serve.json");
    let mut srv = std::process::Command::new(&plload)
        .args([
            "serve",
            "--bind",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--flows",
            "1",
            "--duration",
            "20",
            "--tag",
            "role=rx",
        ])
        .arg("--out")
        .arg(&srv_out)
        .spawn()
        .unwrap();
    let to = format!("127.0.0.1:{port}");
    let mut outs = Vec::new();
    for (mode, rate) in [("paced", "2000"), ("unpaced", "4000")] {
        let o = dir.join(format!("rpc-{mode}.json"));
        let st = std::process::Command::new(&plload)
            .args([
                "rpc",
                "--to",
                &to,
                "--rate",
                rate,
                "--duration",
                "0.3",
                "--samples",
                "--tag",
                &format!("mode={mode}"),
                "--tag",
                &format!("rate={rate}"),
            ])
            .arg("--out")
            .arg(&o)
            .status()
            .unwrap();
        assert!(st.success());
        outs.push(o);
    }
    let st = std::process::Command::new(&plload)
        .args([
            "bulk", "--to", &to, "--bytes", "1000000", "--cc", "cubic", "--dscp", "10", "--mark", "7",
        ])
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    assert!(srv.wait().unwrap().success());
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&srv_out).unwrap()).unwrap();
    assert_eq!(v["kind"], "serve");
    assert_eq!(v["tags"]["role"], "rx");
    assert_eq!(v["summary"]["completed_flows"], 1);
    let table = std::process::Command::new(&plreport)
        .arg("table")
        .args(&outs)
        .output()
        .unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(
        table.contains("| mode") && table.contains("p99_us") && table.contains("unpaced"),
        "{table}"
    );
    let svg = dir.join("cdf.svg");
    let st = std::process::Command::new(&plreport)
        .args([
            "plot",
            "--kind",
            "cdf",
            "--samples",
            "/samples_us",
            "--series",
            "/tags/mode",
            "--log-x",
            "--out",
        ])
        .arg(&svg)
        .args(&outs)
        .status()
        .unwrap();
    assert!(st.success() && std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    let svg = dir.join("xy.svg");
    let st = std::process::Command::new(&plreport)
        .args([
            "plot",
            "--kind",
            "xy",
            "--x",
            "/tags/rate",
            "--y",
            "/summary/p99_us",
            "--out",
        ])
        .arg(&svg)
        .args(&outs)
        .status()
        .unwrap();
    assert!(st.success());
    let _ = std::fs::remove_dir_all(&dir);
}
