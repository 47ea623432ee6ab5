//! Who may use the agent's API: a bearer token from `--api-token-file`, asked for on every API
//! route but the probes, from another host on the link as from the agent's own; the commands
//! sending it from `PACELINE_API_TOKEN_FILE`; rotation by replacing the file; and the starts
//! that are refused: an API on a non-loopback address with no token, a token file others can
//! read.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use paceline_tests::{
    agent::{Agent, Scratch},
    testbed::Testbed,
};

use crate::ops::text;
use crate::privileged;

const AGENT: &str = env!("CARGO_BIN_EXE_plagent");

fn policy(iface: &str) -> String {
    format!(
        r#"apiVersion: paceline/v1
kind: Policy
metadata:
  name: token
spec:
  interfaces: [{iface}]
  enforcement: none
  levels:
    - name: normal
      priority: 0
  classes:
    - name: other
      level: normal
  default_class: other
"#
    )
}

fn token_file(path: &Path, token: &str, mode: u32) {
    std::fs::write(path, format!("{token}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn bearer(token: &str) -> Vec<String> {
    vec![format!("Authorization: Bearer {token}")]
}

/// The value of a sample line of `/metrics` (0 when absent).
fn sample(metrics: &str, line_start: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn the_api_asks_for_its_token_and_without_one_listens_on_loopback_only() {
    if !privileged("the_api_asks_for_its_token_and_without_one_listens_on_loopback_only") {
        return;
    }
    let tb = Testbed::new("api_token").expect("testbed");
    let a = tb.add_host("a").expect("a");
    let b = tb.add_host("b").expect("b");
    tb.link(&a, &b).expect("a-b");
    let ib = a.iface_to(&b).unwrap().ifname;
    let scratch = Scratch::local("api_token");
    let p = scratch.path("p.yaml");
    std::fs::write(&p, policy(&ib)).unwrap();
    let state = scratch.path("state");
    let api = format!("{}:9978", a.ipv4());
    let tok = scratch.path("token");
    // A start that must be refused: an agent still running after 30 s is killed, and the
    // test fails on its exit status (not a hang).
    let start = |extra: &[&str]| {
        let mut c = a.command(AGENT);
        c.args(["agent", "--policy"])
            .arg(&p)
            .arg("--state-dir")
            .arg(&state)
            .arg("--bpffs-dir")
            .arg(Agent::bpffs_dir(&state))
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().expect("run the agent");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        if child.try_wait().unwrap().is_none() {
            // SIGTERM: a clean stop that removes what it installed.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        child.wait_with_output().expect("the agent's output")
    };

    // The API on the link's address with no token: refused before anything is installed.
    let o = start(&["--api-addr", &api]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.code() != Some(0)
            && err.contains(&format!("--api-addr {api}"))
            && err.contains("--api-token-file"),
        "{}",
        text(&o)
    );
    // A token file the group or others can read: refused, naming the file and the fix.
    token_file(&tok, "0123456789abcdef0123456789abcdef", 0o644);
    let tok_s = tok.to_str().unwrap();
    let o = start(&["--api-addr", &api, "--api-token-file", tok_s]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.code() != Some(0) && err.contains(tok_s) && err.contains("chmod 600"),
        "{}",
        text(&o)
    );
    let clean = a
        .command(AGENT)
        .args(["cleanup", "--check", "--state-dir"])
        .arg(&state)
        .arg("--bpffs-dir")
        .arg(Agent::bpffs_dir(&state))
        .output()
        .unwrap();
    assert_eq!(
        clean.status.code(),
        Some(0),
        "a refused start leaves nothing: {}",
        text(&clean)
    );

    // Mode 0600: the agent runs, its API on the link's address. Agent::start_with's readiness
    // check itself goes through `paceline status --token-file`.
    token_file(&tok, "0123456789abcdef0123456789abcdef", 0o600);
    let agent = Agent::start_with(&a, &p, &state, &["--api-addr", &api, "--api-token-file", tok_s]);
    let good = bearer("0123456789abcdef0123456789abcdef");
    // Checked: with the token layer left out of `http::serve`, GET /status from b answered
    // 200 here.
    // From the other host on the link, as from anywhere that reaches the address.
    for path in ["/status", "/policy", "/events", "/flows", "/history"] {
        let (code, body) = Agent::request(&b, &api, "GET", path);
        assert_eq!(code, 401, "GET {path} without a token: {body}");
    }
    let (code, body) = Agent::request(&b, &api, "POST", "/rollback");
    assert_eq!(code, 401, "POST /rollback without a token: {body}");
    let (code, body) = Agent::request_with(
        &b,
        &api,
        "GET",
        "/policy",
        &bearer("0123456789abcdef0123456789abcdeX"),
    );
    assert_eq!(code, 401, "a wrong token: {body}");
    let (code, body) = Agent::request_with(&b, &api, "GET", "/policy", &good);
    assert_eq!((code, body.as_str()), (200, policy(&ib).as_str()));
    // The probes stay open on the API's listener, /metrics on its own.
    assert_eq!(Agent::request(&b, &api, "GET", "/healthz").0, 200);
    assert_eq!(Agent::request(&b, &api, "GET", "/readyz").0, 200);
    let (code, m) = agent.metrics_listener("/metrics");
    assert_eq!(code, 200);
    assert_eq!(
        sample(&m, "paceline_api_requests_refused_total{reason=\"missing\"}"),
        6.0,
        "{m}"
    );
    assert_eq!(
        sample(&m, "paceline_api_requests_refused_total{reason=\"wrong\"}"),
        1.0,
        "{m}"
    );

    // The commands: refused without the token, with a hint; fine with it.
    let o = a
        .command(AGENT)
        .args(["status", "--addr", &api])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.code() == Some(2) && err.contains("401") && err.contains("PACELINE_API_TOKEN_FILE"),
        "{}",
        text(&o)
    );
    let o = a
        .command(AGENT)
        .args(["status", "--addr", &api])
        .env("PACELINE_API_TOKEN_FILE", &tok)
        .output()
        .unwrap();
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
    let o = a
        .command(AGENT)
        .args(["reload", "--addr", &api])
        .env("PACELINE_API_TOKEN_FILE", &tok)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // Rotation: the file is read for each request.
    token_file(&tok, "fedcba9876543210fedcba9876543210", 0o600);
    assert_eq!(
        Agent::request_with(&b, &api, "GET", "/status", &good).0,
        401,
        "the old token"
    );
    let (code, body) = Agent::request_with(
        &b,
        &api,
        "GET",
        "/status",
        &bearer("fedcba9876543210fedcba9876543210"),
    );
    assert_eq!(code, 200, "the new token: {body}");
    // A token file that cannot be read: every request refused, not let through.
    std::fs::remove_file(&tok).unwrap();
    let (code, body) = Agent::request_with(&b, &api, "GET", "/status", &good);
    assert_eq!(code, 503, "{body}");
    assert!(body.contains(tok_s), "{body}");
    token_file(&tok, "fedcba9876543210fedcba9876543210", 0o600);
    agent.stop();
}
