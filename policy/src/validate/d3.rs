//! `spec.d3`: the receiver switch, the first-RTT rate, the router links (each an interface of
//! this host, listed once, with a capacity above its base rate) and the controller's interval.

use super::diag::Diag;
use super::fields::{Bounds, RATE, TransposeOk as _, duration_in, rate_in};
use super::model::{D3Link, D3Spec};
use crate::host::HostFacts;
use crate::raw;
use crate::units;

pub const D3_INTERVAL: Bounds = Bounds {
    min: 100_000,
    max: 1_000_000_000,
    text: "100us..=1s",
};
pub const D3_DEADLINE: Bounds = Bounds {
    min: 100_000,
    max: 3_600_000_000_000,
    text: "100us..=1h",
};
/// `spec.d3.initial_window`, segments.
pub const D3_INITIAL_WINDOW_MAX: u32 = 64;
/// `spec.d3.initial_window` when unset: the request and one more segment in the first RTT.
pub const D3_INITIAL_WINDOW_DEFAULT: u32 = 2;
pub const D3_SIZE: Bounds = Bounds {
    min: 1,
    max: 1 << 40,
    text: "1B..=1TiB",
};

/// `spec.d3`: `Some(None)` when absent, `None` when invalid.
pub(super) fn d3_spec(d: &mut Diag, spec: &raw::Spec, host: &dyn HostFacts) -> Option<Option<D3Spec>> {
    let Some(s) = &spec.d3 else { return Some(None) };
    let mut ok = true;
    let first = match &s.first_rtt_rate {
        Some(r) => match d.check("spec.d3.first_rtt_rate", rate_in(&r.0, RATE)) {
            Some(v) => Some(v),
            None => {
                ok = false;
                None
            }
        },
        None => None,
    };
    let initial_window = match s.initial_window {
        None => D3_INITIAL_WINDOW_DEFAULT,
        Some(w) if (1..=D3_INITIAL_WINDOW_MAX).contains(&w) => w,
        Some(w) => {
            d.error(
                "spec.d3.initial_window",
                format!("{w} segments is out of range; write 1..={D3_INITIAL_WINDOW_MAX}"),
            );
            ok = false;
            0
        }
    };
    let interval_ns = match &s.interval {
        Some(v) => d
            .check("spec.d3.interval", duration_in(&v.0, D3_INTERVAL))
            .unwrap_or_else(|| {
                ok = false;
                0
            }),
        None => 1_000_000,
    };
    let mut router = Vec::new();
    for (i, l) in s.router.iter().enumerate() {
        let p = format!("spec.d3.router[{i}]");
        if !host.is_offline() && !host.interface_exists(&l.interface) {
            d.error(
                format!("{p}.interface"),
                format!("no interface named {:?} on this host", l.interface),
            );
            ok = false;
        }
        if router.iter().any(|r: &D3Link| r.interface == l.interface) {
            d.error(
                format!("{p}.interface"),
                format!("{:?} is listed twice", l.interface),
            );
            ok = false;
        }
        let cap = d.check(&format!("{p}.capacity"), rate_in(&l.capacity.0, RATE));
        let base = l
            .base_rate
            .as_ref()
            .map(|r| d.check(&format!("{p}.base_rate"), rate_in(&r.0, RATE)));
        let fcap = l
            .flow_cap
            .as_ref()
            .map(|r| d.check(&format!("{p}.flow_cap"), rate_in(&r.0, RATE)));
        let (Some(cap), Some(base), Some(fcap)) = (cap, base.transpose_ok(), fcap.transpose_ok()) else {
            ok = false;
            continue;
        };
        let base = base.unwrap_or(cap / 1000);
        if base >= cap {
            d.error(
                format!("{p}.base_rate"),
                format!(
                    "{} must be below the capacity {}",
                    units::fmt_rate(base),
                    units::fmt_rate(cap)
                ),
            );
            ok = false;
        }
        router.push(D3Link {
            interface: l.interface.clone(),
            capacity: cap,
            base_rate: base,
            flow_cap: fcap.unwrap_or(0),
            capacity_mode: l.controller.capacity_mode(),
        });
    }
    ok.then_some(Some(D3Spec {
        receiver: s.receiver,
        first_rtt_rate: first,
        initial_window,
        interval_ns,
        router,
    }))
}

#[cfg(test)]
mod tests {
    use crate::tests::{errors, fake_host, ok};

    const BASE: &str = r#"
apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [eth0]
  levels: [{name: all, priority: 0}]
  classes: [{name: x, level: all, d3: {}}]
  default_class: x
  d3: {router: [{interface: eth1, capacity: 1Gbit}]}
"#;

    #[test]
    fn router_links() {
        let v = ok(BASE, &fake_host());
        let d3 = v.d3.expect("d3");
        assert!(d3.receiver);
        assert_eq!(d3.interval_ns, 1_000_000, "default interval");
        assert_eq!(
            (
                d3.router[0].capacity,
                d3.router[0].base_rate,
                d3.router[0].flow_cap
            ),
            (125_000_000, 125_000, 0),
            "base rate capacity / 1000, no flow cap"
        );
        let bad = BASE.replace(
            "[{interface: eth1, capacity: 1Gbit}]",
            "[{interface: eth1, capacity: 1Gbit, base_rate: 2Gbit}, {interface: eth1, capacity: 1Gbit}, {interface: eth9, capacity: 1Gbit}]",
        );
        assert_eq!(
            errors(&bad, &fake_host()),
            [
                "test.yaml:9: spec.d3.router[0].base_rate: 2.00 Gbit/s must be below the capacity 1.00 Gbit/s",
                "test.yaml:9: spec.d3.router[1].interface: \"eth1\" is listed twice",
                "test.yaml:9: spec.d3.router[2].interface: no interface named \"eth9\" on this host",
            ]
        );
    }

    /// The first RTT of a fresh D3 connection: 2 segments unless the policy says otherwise,
    /// within 1..=64.
    #[test]
    fn the_initial_window_defaults_to_two_segments_within_one_to_sixty_four() {
        assert_eq!(ok(BASE, &fake_host()).d3.expect("d3").initial_window, 2);
        let ten = BASE.replace("d3: {router:", "d3: {initial_window: 10, router:");
        assert_eq!(ok(&ten, &fake_host()).d3.expect("d3").initial_window, 10);
        let bad = BASE.replace("d3: {router:", "d3: {initial_window: 0, router:");
        assert_eq!(
            errors(&bad, &fake_host()),
            ["test.yaml:9: spec.d3.initial_window: 0 segments is out of range; write 1..=64"]
        );
        let bad = BASE.replace("d3: {router:", "d3: {initial_window: 65, router:");
        assert_eq!(
            errors(&bad, &fake_host()),
            ["test.yaml:9: spec.d3.initial_window: 65 segments is out of range; write 1..=64"]
        );
    }

    #[test]
    fn the_controller_is_line_referenced_unless_the_paper_is_asked_for() {
        use paceline_common::d3::{CAP_MODE_LINE, CAP_MODE_PAPER};
        let mode = |text: &str| ok(text, &fake_host()).d3.expect("d3").router[0].capacity_mode;
        assert_eq!(mode(BASE), CAP_MODE_LINE);
        let with = |c: &str| BASE.replace("capacity: 1Gbit}", &format!("capacity: 1Gbit, controller: {c}}}"));
        assert_eq!(mode(&with("paper")), CAP_MODE_PAPER);
        assert_eq!(mode(&with("line")), CAP_MODE_LINE);
        let e = errors(&with("rcp"), &fake_host());
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].contains("spec.d3.router[0].controller: unknown variant `rcp`"),
            "names the field: {e:?}"
        );
        assert!(
            e[0].contains("line") && e[0].contains("paper"),
            "lists the valid values: {e:?}"
        );
    }

    #[test]
    fn a_d3_class_needs_spec_d3() {
        let text = BASE.replace("  d3: {router: [{interface: eth1, capacity: 1Gbit}]}\n", "");
        assert_eq!(
            errors(&text, &fake_host()),
            [
                "test.yaml:7: spec.classes[0].d3: needs spec.d3 (add `d3: {}` to spec to turn D3 on for this host)"
            ]
        );
    }
}
