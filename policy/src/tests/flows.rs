//! `spec.track_flows`: which policies keep their flows without a local socket out of the flow
//! table (`TABLE_UNTRACKED_FLOWS`), or those of their classes that keep nothing per flow
//! (`TABLE_UNTRACKED_CLASSES`).

use paceline_common::maps::{TABLE_UNTRACKED_CLASSES, TABLE_UNTRACKED_FLOWS};

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

/// (no flow tracked, the flows of the classes that keep nothing not tracked).
fn untracked(text: &str, mode: EnforcementMode) -> (bool, bool) {
    let c = compile(
        &ok(text, &fake_host()),
        &CompileContext {
            mode,
            previous: None,
            all_routes_managed: false,
        },
    )
    .unwrap();
    (
        c.table.flags & TABLE_UNTRACKED_FLOWS != 0,
        c.table.flags & TABLE_UNTRACKED_CLASSES != 0,
    )
}

/// A flow stays out of the table exactly when no class keeps anything of it there: a flow
/// clock needs fq (the other modes turn flow clocks off) and a class with a `flow_rate`; a DASR
/// sender keeps every flow's state; `track_flows: all` lists every flow whatever the policy.
/// Where some class keeps a flow clock (fq, a `flow_rate`), the others' flows stay out.
/// Checked (2026-12-06): with the compiler's test of `keeps_nothing_per_flow` left out (every
/// `auto` policy untracked), the fq policy with a flow rate failed; with the request ignored,
/// `track_flows: all` failed. Checked (2026-12-07): with `TABLE_UNTRACKED_CLASSES` set under a
/// DASR sender too, the DASR case failed.
#[test]
fn flows_stay_out_of_the_table_only_where_nothing_is_kept_per_flow() {
    let class_only = "    - {name: a, level: low, class_rate: 1Gbit}\n";
    let flow_rate = "    - {name: a, level: low}\n    - {name: b, level: low, flow_rate: 100Mbit}\n";
    let none = (true, false);
    let others = (false, true);
    let every = (false, false);
    let cases = [
        (class_only, "", EnforcementMode::Fq, none),
        (class_only, "", EnforcementMode::Htb, none),
        (flow_rate, "", EnforcementMode::Fq, others),
        (flow_rate, "", EnforcementMode::Htb, none),
        (flow_rate, "", EnforcementMode::None, none),
        (
            class_only,
            "  dasr: {line_rate: 10Gbit}\n",
            EnforcementMode::Fq,
            every,
        ),
        (class_only, "  track_flows: all\n", EnforcementMode::Fq, every),
        (flow_rate, "  track_flows: all\n", EnforcementMode::Htb, every),
        (flow_rate, "  track_flows: all\n", EnforcementMode::Fq, every),
        (class_only, "  track_flows: auto\n", EnforcementMode::Fq, none),
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

/// `paceline policy check` says which flows the table keeps: every class's, those of the
/// classes with a flow clock, or none; the JSON the same.
#[test]
fn policy_check_says_which_flows_the_table_keeps() {
    let flow_rate = "    - {name: a, level: low}\n    - {name: b, level: low, flow_rate: 100Mbit}\n";
    let cases = [
        (
            EnforcementMode::Fq,
            "",
            "classes with a flow clock",
            "tracked for classes with a flow clock",
        ),
        (EnforcementMode::Htb, "", "none", "untracked"),
        (
            EnforcementMode::Fq,
            "  track_flows: all\n",
            "every class",
            "socket tracked",
        ),
    ];
    for (mode, extra, json_says, text_says) in cases {
        let c = compile(
            &ok(&with(flow_rate, extra), &fake_host()),
            &CompileContext {
                mode,
                previous: None,
                all_routes_managed: false,
            },
        )
        .unwrap();
        let text = crate::render::check_report(&c);
        let line = text
            .lines()
            .find(|l| l.contains("flow table"))
            .expect("a flow table line");
        assert!(line.contains(text_says), "{mode:?} {extra}: {line}");
        assert_eq!(
            crate::render::json(&c)["flows_tracked_for"],
            json_says,
            "{mode:?} {extra}"
        );
    }
}
