//! Alarms that act: Alertmanager's webhook (`POST /alertmanager` on the API, behind its token).
//!
//! For each alert of the message that is firing, is about this host and carries the label
//! `paceline_action: rollback`, the agent rolls back to the policy before the one in force
//! (as `paceline policy rollback` does) and records it in the event log, naming the alert.
//! Everything else is ignored and counted in the answer. An alert is about this host when
//! the host part of its `instance` label (the scrape target, `10.1.2.3:9977`) is this
//! machine's hostname or one of its addresses. Alertmanager repeats a firing alert every
//! `repeat_interval`: each alert (fingerprint and start) acts once.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// The label that asks for an action, and the one action there is.
pub const ACTION_LABEL: &str = "paceline_action";
pub const ROLLBACK: &str = "rollback";

/// How many handled alerts are remembered (to act once per alert).
const REMEMBER: usize = 1024;

/// Alertmanager's webhook message (version 4), the fields used.
#[derive(Debug, Deserialize)]
pub struct Message {
    #[serde(default)]
    pub alerts: Vec<Alert>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Alert {
    /// `firing` or `resolved`.
    pub status: String,
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    #[serde(default, rename = "startsAt")]
    pub starts_at: String,
    #[serde(default)]
    pub fingerprint: String,
}

impl Alert {
    pub fn name(&self) -> &str {
        self.labels.get("alertname").map_or("?", String::as_str)
    }

    fn key(&self) -> String {
        format!("{}@{}", self.fingerprint, self.starts_at)
    }
}

/// What the webhook did with an alert.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Handled {
    pub alert: String,
    pub instance: String,
    /// `rolled back`, `rollback rejected: ...`, `already handled`.
    pub outcome: String,
}

/// The webhook's answer.
#[derive(Debug, Default, Serialize)]
pub struct Answer {
    pub handled: Vec<Handled>,
    /// Alerts not for this agent to act on (resolved, no action label, another host).
    pub ignored: usize,
}

/// The host part of an `instance` label (`host:port`, `[v6]:port`, or a bare host).
pub fn instance_host(instance: &str) -> &str {
    let h = match instance.rsplit_once(':') {
        Some((h, p)) if p.parse::<u16>().is_ok() && (h.starts_with('[') || !h.contains(':')) => h,
        _ => instance,
    };
    h.trim_start_matches('[').trim_end_matches(']')
}

/// This machine as an alert's `instance` names it: its hostname and its addresses.
#[derive(Debug, Default, Clone)]
pub struct Local {
    pub hostname: Option<String>,
    pub addrs: Vec<IpAddr>,
}

impl Local {
    /// The UTS namespace's hostname and every address of this network namespace.
    pub fn probe() -> Local {
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty());
        let addrs = nix::ifaddrs::getifaddrs()
            .map(|it| {
                it.filter_map(|a| {
                    let s = a.address?;
                    s.as_sockaddr_in()
                        .map(|v| IpAddr::V4(v.ip()))
                        .or_else(|| s.as_sockaddr_in6().map(|v| IpAddr::V6(v.ip())))
                })
                .collect()
            })
            .unwrap_or_default();
        Local { hostname, addrs }
    }

    pub fn is(&self, instance: &str) -> bool {
        let h = instance_host(instance);
        if h.is_empty() {
            return false;
        }
        match h.parse::<IpAddr>() {
            Ok(ip) => self.addrs.contains(&ip),
            Err(_) => self.hostname.as_deref().is_some_and(|n| {
                n.eq_ignore_ascii_case(h)
                    || n.split('.')
                        .next()
                        .is_some_and(|short| short.eq_ignore_ascii_case(h))
            }),
        }
    }
}

/// Which alerts of a message to act on, and the ones already handled, remembered.
#[derive(Default)]
pub struct Alerts {
    seen: Mutex<VecDeque<String>>,
}

/// What to do with one alert.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    Ignore,
    AlreadyHandled,
    Rollback,
}

impl Alerts {
    /// Decides for `a`, remembering an alert it acts on.
    pub fn decide(&self, a: &Alert, local: &Local) -> Decision {
        let acts = a.status == "firing"
            && a.labels.get(ACTION_LABEL).map(String::as_str) == Some(ROLLBACK)
            && a.labels.get("instance").is_some_and(|i| local.is(i));
        if !acts {
            return Decision::Ignore;
        }
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let key = a.key();
        if seen.contains(&key) {
            return Decision::AlreadyHandled;
        }
        if seen.len() >= REMEMBER {
            seen.pop_front();
        }
        seen.push_back(key);
        Decision::Rollback
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alert(status: &str, instance: &str, action: Option<&str>, fp: &str) -> Alert {
        let mut labels = std::collections::BTreeMap::new();
        labels.insert("alertname".into(), "PacelineDropsAfterReload".into());
        labels.insert("instance".into(), instance.into());
        if let Some(a) = action {
            labels.insert(ACTION_LABEL.into(), a.into());
        }
        Alert {
            status: status.into(),
            labels,
            starts_at: "2026-12-04T21:00:00Z".into(),
            fingerprint: fp.into(),
        }
    }

    #[test]
    fn instance_hosts_and_this_machine() {
        assert_eq!(instance_host("10.1.2.3:9977"), "10.1.2.3");
        assert_eq!(instance_host("[fd00::1]:9977"), "fd00::1");
        assert_eq!(instance_host("node-a"), "node-a");
        assert_eq!(instance_host("fd00::1"), "fd00::1");
        let l = Local {
            hostname: Some("node-a.dc1.example".into()),
            addrs: vec!["10.1.2.3".parse().unwrap(), "fd00::1".parse().unwrap()],
        };
        for yes in [
            "10.1.2.3:9977",
            "[fd00::1]:9977",
            "node-a:9977",
            "NODE-A.dc1.example:9977",
        ] {
            assert!(l.is(yes), "{yes}");
        }
        for no in ["10.1.2.4:9977", "node-b:9977", "", ":9977"] {
            assert!(!l.is(no), "{no}");
        }
    }

    #[test]
    fn only_a_firing_rollback_alert_about_this_host_acts_and_only_once() {
        let l = Local {
            hostname: Some("node-a".into()),
            addrs: vec!["10.1.2.3".parse().unwrap()],
        };
        let a = Alerts::default();
        assert_eq!(
            a.decide(&alert("resolved", "10.1.2.3:9977", Some("rollback"), "f1"), &l),
            Decision::Ignore
        );
        assert_eq!(
            a.decide(&alert("firing", "10.1.2.3:9977", None, "f1"), &l),
            Decision::Ignore
        );
        assert_eq!(
            a.decide(&alert("firing", "10.1.2.3:9977", Some("page"), "f1"), &l),
            Decision::Ignore
        );
        assert_eq!(
            a.decide(&alert("firing", "10.9.9.9:9977", Some("rollback"), "f1"), &l),
            Decision::Ignore
        );
        let go = alert("firing", "10.1.2.3:9977", Some("rollback"), "f1");
        assert_eq!(a.decide(&go, &l), Decision::Rollback);
        assert_eq!(
            a.decide(&go, &l),
            Decision::AlreadyHandled,
            "Alertmanager's repeat"
        );
        // The same alert firing again later (a new start) acts again.
        let again = Alert {
            starts_at: "2026-12-04T22:00:00Z".into(),
            ..go
        };
        assert_eq!(a.decide(&again, &l), Decision::Rollback);
    }
}
