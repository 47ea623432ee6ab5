//! `spec.track_flows`: which policies keep their flows without a local socket out of the flow
//! table (`TABLE_UNTRACKED_FLOWS`).

use paceline_common::maps::TABLE_UNTRACKED_FLOWS;

use super::*;

/// `classes` under a one-level policy, with `extra` appended to its spec.
fn with(classes: &str, extra: &str) -> String {
    format!(
        r#"
apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [eth0]
  link_rate: 10Gbit
  levels:
    - {{name: low, priority: 0}}
  classes:
{classes}
  default_class: a
{extra}"#
    )
}

fn untracked(text: &str, mode: EnforcementMode) -> bool {
    let c = compile(
        &ok(text, &fake_host()),
        &CompileContext {
            mode,
            previous: None,
            all_routes_managed: false,
        },
    )
    .unwrap();
    c.table.flags & TABLE_UNTRACKED_FLOWS != 0
}

/// A flow stays out of the table exactly when no class keeps anything of it there: a flow
/// clock needs fq (the other modes turn flow clocks off) and a class with a `flow_rate`; a DASR
/// sender keeps every flow's state; `track_flows: all` lists every flow whatever the policy.
/// Checked (2026-12-06): with the compiler's test of `keeps_nothing_per_flow` left out (every
/// `auto` policy untracked), the fq policy with a flow rate failed; with the request ignored,
/// `track_flows: all` failed.
#[test]
fn flows_stay_out_of_the_table_only_where_nothing_is_kept_per_flow() {
    let class_only = "    - {name: a, level: low, class_rate: 1Gbit}\n";
    let flow_rate = "    - {name: a, level: low}\n    - {name: b, level: low, flow_rate: 100Mbit}\n";
    let cases = [
        (class_only, "", EnforcementMode::Fq, true),
        (class_only, "", EnforcementMode::Htb, true),
        (flow_rate, "", EnforcementMode::Fq, false),
        (flow_rate, "", EnforcementMode::Htb, true),
        (flow_rate, "", EnforcementMode::None, true),
        (
            class_only,
            "  dasr: {line_rate: 10Gbit}\n",
            EnforcementMode::Fq,
            false,
        ),
        (class_only, "  track_flows: all\n", EnforcementMode::Fq, false),
        (flow_rate, "  track_flows: all\n", EnforcementMode::Htb, false),
        (class_only, "  track_flows: auto\n", EnforcementMode::Fq, true),
    ];
    for (classes, extra, mode, want) in cases {
        assert_eq!(
            untracked(&with(classes, extra), mode),
            want,
            "{mode:?}, classes:\n{classes}{extra}"
        );
    }
}

/// A value other than `auto` or `all` is refused with the field and the values it takes.
#[test]
fn track_flows_takes_auto_or_all() {
    let e = errors(
        &with("    - {name: a, level: low}\n", "  track_flows: some\n"),
        &fake_host(),
    );
    assert!(
        e.iter()
            .any(|m| m.contains("track_flows") && m.contains("auto") && m.contains("all")),
        "{e:?}"
    );
}
