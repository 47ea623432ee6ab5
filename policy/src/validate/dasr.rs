//! `spec.dasr`: the two roles (at least one on), the line rate each managed interface
//! advertises (written, or `auto`: the interface's speed, else `spec.link_rate`; at least
//! 1 Mbit/s, rounded down to what the option carries), the RTT and the active window.

use paceline_common::dasr::{decode_rate, encode_rate};

use super::diag::Diag;
use super::fields::{Bounds, RATE, duration_in, int_range, rate_in};
use super::model::{DasrLine, DasrSpec};
use crate::host::HostFacts;
use crate::raw::{self, Scalar};
use crate::units;

pub const DASR_RTT: Bounds = Bounds {
    min: 1_000,
    max: 100_000_000,
    text: "1us..=100ms",
};
pub const ACTIVE_RTTS: (i64, i64) = (1, 64);
/// The default RTT: a datacenter network without queueing.
pub const DEFAULT_RTT_NS: u64 = 100_000;

/// `spec.dasr`: `Some(None)` when absent, `None` when invalid. `interfaces` are the resolved
/// managed interfaces, `link_rate` is `spec.link_rate` when valid.
pub(super) fn dasr_spec(
    d: &mut Diag,
    spec: &raw::Spec,
    interfaces: &[String],
    link_rate: Option<u64>,
    host: &dyn HostFacts,
) -> Option<Option<DasrSpec>> {
    let Some(s) = &spec.dasr else { return Some(None) };
    let mut ok = true;
    if !s.receiver && !s.sender {
        d.error(
            "spec.dasr",
            "receiver and sender are both off, so DASR would do nothing; turn one on or remove spec.dasr",
        );
        ok = false;
    }
    let written = match &s.line_rate {
        Some(r) if matches!(&r.0, Scalar::Str(t) if t.trim() == "auto") => None,
        Some(r) => match d.check("spec.dasr.line_rate", rate_in(&r.0, RATE)) {
            Some(v) => Some(v),
            None => {
                ok = false;
                None
            }
        },
        None => None,
    };
    let rtt_ns = match &s.rtt {
        Some(v) => d
            .check("spec.dasr.rtt", duration_in(&v.0, DASR_RTT))
            .unwrap_or_else(|| {
                ok = false;
                0
            }),
        None => DEFAULT_RTT_NS,
    };
    let active_rtts = d
        .check(
            "spec.dasr.active_rtts",
            int_range(s.active_rtts, ACTIVE_RTTS.0, ACTIVE_RTTS.1),
        )
        .unwrap_or_else(|| {
            ok = false;
            0
        }) as u32;
    let mut lines = Vec::new();
    if ok && s.receiver {
        for i in interfaces {
            let (rate, source) = match (written, host.link_rate(i), link_rate) {
                (Some(r), _, _) => (r, "spec.dasr.line_rate".to_string()),
                (None, Some(r), _) => (r, format!("speed of {i}")),
                (None, None, Some(r)) => (r, "spec.link_rate".to_string()),
                (None, None, None) => {
                    let m = format!(
                        "auto: the kernel reports no speed for {i} (virtio and veth interfaces report none: `ethtool {i}` says \"Speed: Unknown!\") and spec.link_rate is not set; write the rate this host's link runs at (e.g. line_rate: 10Gbit)"
                    );
                    if host.is_offline() {
                        d.warn("spec.dasr.line_rate", m);
                    } else {
                        d.error("spec.dasr.line_rate", m);
                        ok = false;
                    }
                    continue;
                }
            };
            // What the option carries: whole Mbit/s, 12 significant bits, rounded down.
            match encode_rate(rate).and_then(decode_rate) {
                Some(carried) => lines.push(DasrLine {
                    interface: i.clone(),
                    line_rate: carried,
                    source,
                }),
                None => {
                    d.error(
                        "spec.dasr.line_rate",
                        format!(
                            "{} ({source}) is below 1 Mbit/s, the smallest line rate the option carries",
                            units::fmt_rate(rate)
                        ),
                    );
                    ok = false;
                }
            }
        }
    }
    ok.then_some(Some(DasrSpec {
        receiver: s.receiver,
        sender: s.sender,
        line_rate: written,
        rtt_ns,
        active_rtts,
        interfaces: lines,
    }))
}

#[cfg(test)]
mod tests {
    use crate::host::{FakeHost, OfflineHost};
    use crate::tests::{errors, fake_host, ok};

    const BASE: &str = r#"
apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [eth0]
  levels: [{name: all, priority: 0}]
  classes: [{name: x, level: all}]
  default_class: x
  dasr: {}
"#;

    #[test]
    fn defaults_take_the_interface_speed() {
        let d = ok(BASE, &fake_host()).dasr.expect("dasr");
        assert!(d.receiver && d.sender);
        assert_eq!((d.rtt_ns, d.active_rtts), (100_000, 2));
        // 200 us of RTTs are shorter than two paced bursts (~1 ms apart).
        assert_eq!(d.min_window_ns(), 2 * paceline_common::dasr::PACED_BURST_GAP_NS);
        assert_eq!(d.interfaces.len(), 1);
        assert_eq!(d.interfaces[0].line_rate, 1_250_000_000);
        assert_eq!(d.interfaces[0].source, "speed of eth0");
    }

    #[test]
    fn a_written_rate_wins_and_is_rounded_down_to_what_the_option_carries() {
        let text = BASE.replace(
            "dasr: {}",
            "dasr: {line_rate: 1000.5Mbit, rtt: 50us, active_rtts: 4}",
        );
        let d = ok(&text, &fake_host()).dasr.expect("dasr");
        assert_eq!(d.interfaces[0].line_rate, 125_000_000, "1000 Mbit/s");
        assert_eq!(d.interfaces[0].source, "spec.dasr.line_rate");
        assert_eq!(d.min_window_ns(), 2 * paceline_common::dasr::PACED_BURST_GAP_NS);
        let long = BASE.replace("dasr: {}", "dasr: {rtt: 2ms, active_rtts: 4}");
        assert_eq!(
            ok(&long, &fake_host()).dasr.expect("dasr").min_window_ns(),
            8_000_000
        );
    }

    #[test]
    fn auto_without_a_speed_falls_back_to_link_rate_or_says_what_to_write() {
        let host = FakeHost::new().with_interface("veth0", None);
        let text = BASE.replace("[eth0]", "[veth0]");
        assert_eq!(
            errors(&text, &host),
            [
                "test.yaml:9: spec.dasr.line_rate: auto: the kernel reports no speed for veth0 (virtio and veth interfaces report none: `ethtool veth0` says \"Speed: Unknown!\") and spec.link_rate is not set; write the rate this host's link runs at (e.g. line_rate: 10Gbit)"
            ]
        );
        let with_link = text.replace("  dasr: {}", "  link_rate: 1Gbit\n  dasr: {}");
        let d = ok(&with_link, &host).dasr.expect("dasr");
        assert_eq!(
            (d.interfaces[0].line_rate, d.interfaces[0].source.as_str()),
            (125_000_000, "spec.link_rate")
        );
        // Offline it is only a warning.
        let v = ok(&text, &OfflineHost);
        assert!(v.dasr.expect("dasr").interfaces.is_empty());
    }

    #[test]
    fn invalid_values_are_listed_with_what_would_be_valid() {
        let text = BASE.replace(
            "dasr: {}",
            "dasr: {receiver: false, sender: false, line_rate: 500kbit, rtt: 1s, active_rtts: 0}",
        );
        assert_eq!(
            errors(&text, &fake_host()),
            [
                "test.yaml:9: spec.dasr: receiver and sender are both off, so DASR would do nothing; turn one on or remove spec.dasr",
                "test.yaml:9: spec.dasr.rtt: \"1s\" is out of range; valid: 1us..=100ms",
                "test.yaml:9: spec.dasr.active_rtts: 0 is out of range; valid: 1..=64",
            ]
        );
        let slow = BASE.replace("dasr: {}", "dasr: {line_rate: 500kbit}");
        assert_eq!(
            errors(&slow, &fake_host()),
            [
                "test.yaml:9: spec.dasr.line_rate: 500 kbit/s (spec.dasr.line_rate) is below 1 Mbit/s, the smallest line rate the option carries"
            ]
        );
    }
}
