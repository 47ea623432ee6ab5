//! Is the agent doing its job? `/healthz` (liveness) and `/readyz` (readiness) answer from
//! checks of the kernel's real state, not from the process being up:
//!
//! - `datapath`: the programs and maps are loaded (not shutting down);
//! - `policy_map`: the policy table the datapath reads is the one the agent last wrote (its
//!   generation);
//! - `attached:<iface>`: the classifier is attached to each managed interface (tcx: the
//!   interface's egress program list holds it; clsact: paceline's `bpf` filter is there) and
//!   the interface exists;
//! - `sock_ops`: when the agent attached sock_ops, its link is still in the kernel;
//! - `last_reload` (readiness only): the last reload was applied, so the node enforces its file.
//!
//! Unhealthy: HTTP 503 with a JSON body whose `reasons` say what failed. The systemd watchdog
//! is fed only while healthy (see `agent::watch`), and `STATUS=` carries the first reason.

use serde::{Deserialize, Serialize};

/// One check's result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub check: String,
    pub ok: bool,
    pub detail: String,
}

impl Check {
    pub fn ok(check: impl Into<String>, detail: impl Into<String>) -> Check {
        Check {
            check: check.into(),
            ok: true,
            detail: detail.into(),
        }
    }
    pub fn fail(check: impl Into<String>, detail: impl Into<String>) -> Check {
        Check {
            check: check.into(),
            ok: false,
            detail: detail.into(),
        }
    }
}

/// The document `/healthz` and `/readyz` serve.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// `ok`, or `unhealthy` / `not ready`.
    pub status: String,
    /// The failed checks, one line each (`attached:eth0: interface eth0 is gone`).
    pub reasons: Vec<String>,
    pub checks: Vec<Check>,
}

impl Health {
    /// The verdict over `checks`; `readiness` also counts `last_reload`.
    pub fn of(checks: Vec<Check>, readiness: bool) -> Health {
        let counted = |c: &&Check| readiness || c.check != "last_reload";
        let reasons: Vec<String> = checks
            .iter()
            .filter(counted)
            .filter(|c| !c.ok)
            .map(|c| format!("{}: {}", c.check, c.detail))
            .collect();
        let status = match (reasons.is_empty(), readiness) {
            (true, _) => "ok",
            (false, false) => "unhealthy",
            (false, true) => "not ready",
        };
        Health {
            status: status.into(),
            reasons,
            checks,
        }
    }

    pub fn healthy(&self) -> bool {
        self.reasons.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_check_makes_it_unhealthy_with_a_reason() {
        let h = Health::of(
            vec![
                Check::ok("datapath", "loaded"),
                Check::fail("attached:eth0", "interface eth0 is gone"),
            ],
            false,
        );
        assert!(!h.healthy());
        assert_eq!(h.status, "unhealthy");
        assert_eq!(h.reasons, ["attached:eth0: interface eth0 is gone"]);
    }

    #[test]
    fn a_rejected_reload_fails_readiness_only() {
        let checks = vec![
            Check::ok("datapath", "loaded"),
            Check::fail("last_reload", "rejected: p.yaml:3: spec: ..."),
        ];
        assert!(
            Health::of(checks.clone(), false).healthy(),
            "liveness ignores reloads"
        );
        let r = Health::of(checks, true);
        assert_eq!(r.status, "not ready");
        assert_eq!(r.reasons.len(), 1);
    }
}
