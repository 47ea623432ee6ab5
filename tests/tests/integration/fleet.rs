//! Fleet workflows against real agents: three agents in their namespaces, their APIs on their
//! links behind one bearer token, asked from a management host: `paceline fleet diff` (two
//! agents, and a group against its majority), `fleet backup` (every running policy and its
//! history, with a manifest), `fleet rollback` of the group to a backed-up hash (stopping at
//! the first agent that cannot) and `fleet events` (the logs merged in time order, filtered).

use std::os::unix::fs::PermissionsExt as _;
use std::process::Output;

use paceline_tests::{
    agent::{Agent, Scratch},
    testbed::{Host, Testbed},
};
use serde_json::json;

use crate::ops::text;
use crate::privileged;

const AGENT: &str = env!("CARGO_BIN_EXE_plagent");
const TOKEN: &str = "f1ee7f1ee7f1ee7f1ee7f1ee7f1ee7f1";

/// One policy text for every node (`auto`: each node's default route leaves through its link
/// to the management host), so that the same file has the same hash everywhere.
fn policy(extra_class: bool) -> String {
    let extra = if extra_class {
        "    - name: bulk\n      level: normal\n"
    } else {
        ""
    };
    format!(
        r#"apiVersion: paceline/v1
kind: Policy
metadata:
  name: fleet
spec:
  interfaces: [auto]
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

#[test]
fn a_group_is_compared_backed_up_and_rolled_back() {
    if !privileged("a_group_is_compared_backed_up_and_rolled_back") {
        return;
    }
    let tb = Testbed::new("fleet").expect("testbed");
    let m = tb.add_host("m").expect("management host");
    let nodes: Vec<Host> = (1..=3)
        .map(|i| tb.add_host(&format!("n{i}")).expect("node"))
        .collect();
    for n in &nodes {
        tb.link(&m, n).expect("link");
        let via = m.iface_to(n).unwrap().ipv4.to_string();
        let dev = n.iface_to(&m).unwrap().ifname;
        n.run(&["ip", "route", "replace", "default", "via", &via, "dev", &dev])
            .expect("default route");
    }
    let scratch = Scratch::local("fleet");
    let tok = scratch.path("token");
    std::fs::write(&tok, TOKEN).unwrap();
    std::fs::set_permissions(&tok, std::fs::Permissions::from_mode(0o600)).unwrap();
    let tok_s = tok.to_str().unwrap().to_string();
    let ip = |n: &Host| n.iface_to(&m).unwrap().ipv4.to_string();
    let mut agents = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let file = scratch.path(&format!("n{}.yaml", i + 1));
        std::fs::write(&file, policy(false)).unwrap();
        let api = format!("{}:9978", ip(n));
        agents.push(Agent::start_with(
            n,
            &file,
            &scratch.path(&format!("state{}", i + 1)),
            &[
                "--metrics-addr",
                "0.0.0.0:9977",
                "--api-addr",
                &api,
                "--api-token-file",
                &tok_s,
            ],
        ));
    }
    let api = |i: usize| format!("{}:9978", ip(&nodes[i]));
    let targets = scratch.path("targets.json");
    std::fs::write(
        &targets,
        serde_json::to_vec(&json!([{
            // n3 first: the reference must be the majority's, not the first agent asked.
            "targets": ([2usize, 0, 1]).into_iter().map(|i| format!("{}:9977", ip(&nodes[i]))).collect::<Vec<_>>(),
            "labels": {"group": "main"},
        }]))
        .unwrap(),
    )
    .unwrap();
    let fleet = |args: &[&str], token: bool| -> Output {
        let mut c = m.command(AGENT);
        c.args(["fleet", "diff"]).args(args);
        if token {
            c.env("PACELINE_API_TOKEN_FILE", &tok);
        }
        c.output().unwrap()
    };
    let out = |o: &Output| String::from_utf8_lossy(&o.stdout).into_owned();
    let group = ["--group", "main", "--targets", targets.to_str().unwrap()];

    // The same file everywhere: 0, also per group.
    let o = fleet(&[&api(0), &api(1)], true);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(out(&o).contains("same policy"), "{}", text(&o));
    let o = fleet(&group, true);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // Without the token the agents refuse: 2, and the command says why.
    let o = fleet(&[&api(0), &api(1)], false);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("401"), "{}", text(&o));

    // n3 gets a class the others lack: it alone is reported, against the majority's policy.
    agents[2]
        .apply_policy(&policy(true), std::time::Duration::from_secs(5))
        .expect("n3 runs the new policy");
    let o = fleet(&group, true);
    let s = out(&o);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let majority = paceline_policy::hash(policy(false).as_bytes());
    assert!(
        s.contains(&format!("majority runs policy {} (2 of them", &majority[..12])),
        "{}",
        text(&o)
    );
    assert!(
        s.contains(&format!("+++ the running agent at {}", api(2))),
        "{}",
        text(&o)
    );
    assert!(s.contains("bulk"), "the change names the class: {}", text(&o));
    // Checked: with `fleet::majority` taking the first agent asked (n3), the majority line
    // above named n3's policy, 1 of them, and this test failed there.
    assert!(
        !s.contains(&format!("+++ the running agent at {}", api(1))),
        "{}",
        text(&o)
    );
    let o = fleet(&[&api(0), &api(2)], true);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));

    // Backup: each agent's running policy and history, with a manifest.
    let bdir = scratch.path("backup");
    let run = |args: &[&str]| -> Output {
        m.command(AGENT)
            .arg("fleet")
            .args(args)
            .env("PACELINE_API_TOKEN_FILE", &tok)
            .output()
            .unwrap()
    };
    let t = targets.to_str().unwrap();
    let o = run(&["backup", "--targets", t, bdir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let man: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bdir.join("manifest.json")).unwrap()).unwrap();
    let backed = man["agents"].as_array().unwrap();
    assert_eq!(backed.len(), 3, "{man:#}");
    let diverged = paceline_policy::hash(policy(true).as_bytes());
    for (i, want) in [(0usize, &majority), (1, &majority), (2, &diverged)] {
        let b = backed
            .iter()
            .find(|b| b["host"] == api(i).as_str())
            .unwrap_or_else(|| panic!("{} not in {man:#}", api(i)));
        assert_eq!(b["hash"], want.as_str(), "{b:#}");
        assert_eq!(b["group"], "main");
        let text = std::fs::read_to_string(bdir.join(b["policy"].as_str().unwrap())).unwrap();
        assert_eq!(paceline_policy::hash(text.as_bytes()), *want);
        // n3's history holds both policies, each file its entry's text.
        let hist = b["history"].as_array().unwrap();
        assert_eq!(hist.len(), if i == 2 { 2 } else { 1 }, "{b:#}");
        for e in hist {
            let t = std::fs::read_to_string(bdir.join(e["file"].as_str().unwrap())).unwrap();
            assert_eq!(e["hash"], paceline_policy::hash(t.as_bytes()).as_str());
        }
    }
    // A hash no agent's history holds: the first agent asked (n3) fails and the rollback
    // stops there, the others named as left alone.
    let o = run(&[
        "rollback",
        "--targets",
        t,
        "--group",
        "main",
        "--to",
        "deadbeef00",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        err.contains("not in its history")
            && err.contains(&format!("not rolled back: {}, {}", api(0), api(1))),
        "{}",
        text(&o)
    );
    assert_eq!(fleet(&group, true).status.code(), Some(1), "still diverged");
    // The group back to the backed-up majority hash: n3 rolls back, n1 and n2 are there.
    let o = run(&[
        "rollback",
        "--targets",
        t,
        "--group",
        "main",
        "--to",
        &majority[..12],
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        out(&o).contains(&format!("{}: runs policy {} already", api(0), &majority[..12])),
        "{}",
        text(&o)
    );
    let o = fleet(&group, true);
    assert_eq!(o.status.code(), Some(0), "converged again: {}", text(&o));

    // The fleet's event log: the three starts in the order they happened (the targets list
    // n3 first), n3's rollback among them, each line with its host.
    let o = run(&["events", "--targets", t, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let evs: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let at: Vec<f64> = evs.iter().map(|e| e["at"].as_f64().unwrap()).collect();
    assert!(at.windows(2).all(|w| w[0] <= w[1]), "not in time order: {at:?}");
    let starts: Vec<&str> = evs
        .iter()
        .filter(|e| e["kind"] == "start")
        .map(|e| e["host"].as_str().unwrap())
        .collect();
    assert_eq!(starts, [api(0), api(1), api(2)], "{evs:#?}");
    assert!(
        evs.iter()
            .any(|e| e["kind"] == "rollback" && e["host"] == api(2).as_str() && e["group"] == "main"),
        "{evs:#?}"
    );
    // Filters: one host, kinds, a time range.
    let o = run(&[
        "events",
        "--targets",
        t,
        "--host",
        &ip(&nodes[0]),
        "--kind",
        "start",
    ]);
    let s = out(&o);
    assert_eq!((o.status.code(), s.lines().count()), (Some(0), 1), "{}", text(&o));
    assert!(s.starts_with(&api(0)) && s.contains(" start "), "{}", text(&o));
    let o = run(&["events", "--targets", t, "--until", "1h"]);
    assert_eq!(
        (o.status.code(), out(&o).as_str()),
        (Some(0), ""),
        "nothing an hour old: {}",
        text(&o)
    );
    let o = run(&["events", "--targets", t, "--since", "10m", "--kind", "rollback"]);
    // (an event's details follow on indented lines)
    let firsts = out(&o).lines().filter(|l| !l.starts_with(' ')).count();
    assert_eq!(firsts, 1, "{}", text(&o));

    // Diverge again, for what follows.
    agents[2]
        .apply_policy(&policy(true), std::time::Duration::from_secs(5))
        .expect("n3 runs the new policy again");

    // An agent that stops: 2, the others still compared (a tie of one each now: the first
    // asked, n3, is the reference, and n1 differs from it).
    agents.remove(1).stop();
    let o = fleet(&group, true);
    let s = out(&o);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        s.contains(&format!("--- the running agent at {}", api(2)))
            && s.contains(&format!("+++ the running agent at {}", api(0)))
            && s.contains("bulk"),
        "{}",
        text(&o)
    );
    for a in agents {
        a.stop();
    }
}
