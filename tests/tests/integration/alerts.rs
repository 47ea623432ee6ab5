//! Alarms that act, with the real Alertmanager (`prometheus-alertmanager` from `bootstrap.sh
//! --test`): an alert labelled `paceline_action: rollback` about the agent's host, sent to
//! Alertmanager's API, is routed to the agent's webhook (with its bearer token), and the agent
//! rolls its policy back and records why; an alert about another host is not acted on.

use std::os::unix::fs::PermissionsExt as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use paceline_tests::{
    agent::{Agent, Scratch},
    testbed::{Host, Testbed},
};

use crate::privileged;

fn policy(iface: &str, extra_class: bool) -> String {
    let extra = if extra_class {
        "    - name: bulk\n      level: normal\n"
    } else {
        ""
    };
    format!(
        r#"apiVersion: paceline/v1
kind: Policy
metadata:
  name: alarms
spec:
  interfaces: [{iface}]
  enforcement: none
  levels:
    - name: normal
      priority: 0
  classes:
    - name: other
      level: normal
{extra}  default_class: other
"#
    )
}

/// POSTs a JSON body in `host`'s namespace: the status code.
fn post_json(host: &Host, addr: &str, path: &str, body: &str, auth: Option<&str>) -> u16 {
    use std::io::{Read as _, Write as _};
    let (addr, path, body) = (addr.to_string(), path.to_string(), body.to_string());
    let auth = auth
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    host.in_netns(move || {
        let mut c = std::net::TcpStream::connect(&addr).expect("connect");
        write!(
            c,
            "POST {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut resp = String::new();
        c.read_to_string(&mut resp).unwrap();
        resp.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
    })
    .expect("in netns")
}

#[test]
fn an_alert_routed_by_alertmanager_rolls_its_host_back() {
    if !privileged("an_alert_routed_by_alertmanager_rolls_its_host_back") {
        return;
    }
    let Some(am) = std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| std::path::Path::new(d).join("prometheus-alertmanager"))
        .find(|p| p.is_file())
    else {
        crate::skip(
            "an_alert_routed_by_alertmanager_rolls_its_host_back",
            "Debian's prometheus-alertmanager is not installed (scripts/bootstrap.sh --test)",
        );
        return;
    };
    let tb = Testbed::new("alerts").expect("testbed");
    let a = tb.add_host("a").expect("a");
    let b = tb.add_host("b").expect("b");
    tb.link(&a, &b).expect("a-b");
    let ib = a.iface_to(&b).unwrap().ifname;
    let scratch = Scratch::local("alerts");
    let tok = scratch.path("token");
    let token = "a1e7a1e7a1e7a1e7a1e7a1e7a1e7a1e7";
    std::fs::write(&tok, token).unwrap();
    std::fs::set_permissions(&tok, std::fs::Permissions::from_mode(0o600)).unwrap();
    let p = scratch.path("p.yaml");
    std::fs::write(&p, policy(&ib, false)).unwrap();
    let agent = Agent::start_with(
        &a,
        &p,
        &scratch.path("state"),
        &["--api-token-file", tok.to_str().unwrap()],
    );
    let before = paceline_policy::hash(policy(&ib, false).as_bytes());
    let after = paceline_policy::hash(policy(&ib, true).as_bytes());
    agent
        .apply_policy(&policy(&ib, true), Duration::from_secs(5))
        .expect("the second policy applies");

    // The webhook refuses a message without the token.
    assert_eq!(
        post_json(&a, "127.0.0.1:9978", "/alertmanager", r#"{"alerts":[]}"#, None),
        401
    );

    // Alertmanager in a's namespace, routing paceline_action=rollback to the agent.
    let config = scratch.path("alertmanager.yaml");
    std::fs::write(
        &config,
        format!(
            r#"route:
  receiver: none
  group_by: [alertname, instance]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
  routes:
    - receiver: paceline-rollback
      matchers: ['paceline_action = "rollback"']
receivers:
  - name: none
  - name: paceline-rollback
    webhook_configs:
      - url: http://127.0.0.1:9978/alertmanager
        send_resolved: false
        http_config:
          authorization:
            type: Bearer
            credentials_file: {}
"#,
            tok.display()
        ),
    )
    .unwrap();
    let mut cmd = a.command(&am);
    cmd.arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.path={}", scratch.path("am").display()))
        .args(["--web.listen-address=127.0.0.1:9093", "--cluster.listen-address="])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let _am = a.spawn_cmd(cmd).expect("start alertmanager");
    let deadline = Instant::now() + Duration::from_secs(30);
    while Agent::request_opt(&a, "127.0.0.1:9093", "/-/ready") != Some(200) {
        assert!(Instant::now() < deadline, "alertmanager did not get ready");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Two alerts: one about another host (not acted on), then one about a's own address.
    let alert = |instance: &str| {
        serde_json::json!([{
            "labels": {
                "alertname": "PacelineDropsAfterReload",
                "instance": instance,
                "paceline_action": "rollback",
                "severity": "warning",
            },
        }])
        .to_string()
    };
    let other = alert("10.99.99.99:9977");
    assert_eq!(
        post_json(&a, "127.0.0.1:9093", "/api/v2/alerts", &other, None),
        200
    );
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        agent.status_retry().unwrap()["policy"]["hash"],
        after.as_str(),
        "an alert about another host rolls nothing back"
    );
    let mine = alert(&format!("{}:9977", a.ipv4()));
    assert_eq!(
        post_json(&a, "127.0.0.1:9093", "/api/v2/alerts", &mine, None),
        200
    );
    // Checked: with the webhook's call of the rollback left out, this timed out.
    let deadline = Instant::now() + Duration::from_secs(30);
    while agent.status_retry().unwrap()["policy"]["hash"] != before.as_str() {
        assert!(
            Instant::now() < deadline,
            "the agent did not roll back within 30 s"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let rollbacks: Vec<serde_json::Value> = agent
        .events()
        .into_iter()
        .filter(|e| e["kind"] == "rollback")
        .collect();
    assert_eq!(rollbacks.len(), 1, "{rollbacks:#?}");
    assert!(
        rollbacks[0]["message"]
            .as_str()
            .unwrap()
            .contains("(alert PacelineDropsAfterReload)"),
        "{rollbacks:#?}"
    );
    agent.stop();
}
