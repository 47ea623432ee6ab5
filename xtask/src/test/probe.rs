//! The agent's feature probe on each kernel: a throwaway start in a network namespace, its log
//! read back, and what it found checked against the kernel's build configuration.

use super::*;

/// Starts the agent (`$1`) in a throwaway network namespace on a veth pair with `enforcement:
/// auto`, waits until it runs (at most 2 min: TCG), stops it and prints its log, each line
/// prefixed `paceline-probe: `.
pub(super) const PROBE_SCRIPT: &str = r#"
agent=$1
d=$(mktemp -d /tmp/paceline-probe.XXXXXX) || exit 1
cat >"$d/p.yaml" <<'EOF'
apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [plprobe0]
  enforcement: auto
  link_rate: 1Gbit
  levels:
    - {name: all, priority: 0}
  classes:
    - {name: all, level: all}
  default_class: all
EOF
unshare --net sh -c '
  ip link set lo up
  ip link add plprobe0 type veth peer name plprobe1 || exit 1
  ip link set plprobe0 up; ip link set plprobe1 up
  RUST_LOG=info "$1" agent --policy "$2/p.yaml" --state-dir "$2/state" \
    --bpffs-dir "/sys/fs/bpf/paceline-probe-$$" --metrics-addr 127.0.0.1:9979 >"$2/log" 2>&1 &
  pid=$!
  i=0
  while [ $i -lt 1200 ] && kill -0 $pid 2>/dev/null && ! grep -qs "paceline running" "$2/log"; do
    sleep 0.1; i=$((i+1))
  done
  kill -TERM $pid 2>/dev/null; wait $pid
' sh "$agent" "$d"
sed 's/^/paceline-probe: /' "$d/log"
rm -rf "$d"
"#;

/// What the agent's start-up log said.
#[derive(Default, Debug)]
pub(super) struct Probe {
    pub(super) features: HashMap<String, String>,
    pub(super) attach: Option<String>,
    pub(super) root_qdisc: Option<String>,
    pub(super) running: bool,
}

impl Probe {
    pub(super) fn parse(text: &str) -> Probe {
        let mut p = Probe::default();
        for line in text.lines().filter_map(|l| l.strip_prefix("paceline-probe: ")) {
            // `[... INFO  paceline::agent] kernel 6.12.57+deb12-amd64: tcx=true sch_fq=true ...`
            if let Some((_, rest)) = line.split_once("] kernel ")
                && let Some((release, kv)) = rest.split_once(": ")
            {
                p.features.insert("release".into(), release.to_string());
                for w in kv.split_whitespace() {
                    if let Some((k, v)) = w.split_once('=') {
                        p.features.insert(k.to_string(), v.to_string());
                    }
                }
            }
            // `[...] plprobe0: classifier attached (tcx), root qdisc htb`
            if let Some((_, rest)) = line.split_once("classifier attached (")
                && let Some((mode, tail)) = rest.split_once(')')
            {
                p.attach = Some(mode.to_string());
                p.root_qdisc = tail
                    .split_once("root qdisc ")
                    .and_then(|(_, q)| q.split_whitespace().next())
                    .map(|q| q.trim_end_matches(',').to_string());
            }
            if line.contains("paceline running") {
                p.running = true;
            }
        }
        p
    }

    pub(super) fn flag(&self, k: &str) -> Option<bool> {
        self.features.get(k).map(|v| v == "true")
    }
}

/// What a kernel's build configuration says it offers.
pub(super) struct Expected {
    pub(super) known: bool,
    pub(super) tcx: bool,
    pub(super) sch_fq: bool,
    pub(super) sch_htb: bool,
    pub(super) clsact: bool,
}

impl Expected {
    pub(super) fn from_config(config: &HashMap<String, String>) -> Expected {
        let has = |k: &str| matches!(config.get(k).map(String::as_str), Some("y" | "m"));
        Expected {
            known: !config.is_empty(),
            tcx: has("CONFIG_NET_XGRESS"),
            sch_fq: has("CONFIG_NET_SCH_FQ"),
            sch_htb: has("CONFIG_NET_SCH_HTB"),
            clsact: has("CONFIG_NET_SCH_INGRESS"),
        }
    }
}

/// The host kernel's configuration: /proc/config.gz or `/boot/config-<release>`.
pub(super) fn host_config() -> HashMap<String, String> {
    let text = Command::new("zcat")
        .arg("/proc/config.gz")
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .or_else(|| std::fs::read_to_string(format!("/boot/config-{}", uname_r())).ok())
        .unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The summary line of the agent's probe on one kernel: what it found, how it attached and
/// enforced, and whether that is what the kernel's configuration offers.
pub(super) fn probe_row(kernel: &str, p: &Probe, want: &Expected) -> Row {
    let mut problems = Vec::new();
    if !p.running {
        problems.push("the agent did not start (its log is above, prefixed paceline-probe:)".to_string());
    }
    let (mut have, mut lacks) = (Vec::new(), Vec::new());
    for (k, expect) in [
        ("tcx", want.tcx),
        ("sch_fq", want.sch_fq),
        ("sch_htb", want.sch_htb),
        ("clsact", want.clsact),
    ] {
        match p.flag(k) {
            Some(true) => have.push(k),
            Some(false) => lacks.push(k),
            None => problems.push(format!("the probe did not report {k}")),
        }
        if want.known
            && let Some(v) = p.flag(k)
            && v != expect
        {
            problems.push(format!(
                "the agent's probe says {k}={v} but the kernel's config says {}",
                if expect { "it is there" } else { "it is not" }
            ));
        }
    }
    let attach = p.attach.clone().unwrap_or_else(|| "?".into());
    let root = p.root_qdisc.clone().unwrap_or_else(|| "?".into());
    if want.known && p.running {
        let want_attach = if want.tcx { "tcx" } else { "clsact" };
        if attach != want_attach {
            problems.push(format!("attached with {attach}, expected {want_attach}"));
        }
        let (root_ok, want_root) = if want.sch_fq {
            (root == "fq" || root == "mq", "fq (or mq of fq)")
        } else if want.sch_htb {
            (root == "htb", "htb")
        } else {
            (true, "")
        };
        if !root_ok {
            problems.push(format!("root qdisc {root}, expected {want_root}"));
        }
    }
    let mut note = format!(
        "has {}; lacks {}; attached {attach}, root qdisc {root}",
        if have.is_empty() {
            "-".into()
        } else {
            have.join(" ")
        },
        if lacks.is_empty() {
            "-".into()
        } else {
            lacks.join(" ")
        },
    );
    if !want.known {
        note.push_str(" (no kernel config to check against)");
    } else if problems.is_empty() {
        note.push_str(" (as its config says)");
    }
    if !problems.is_empty() {
        note.push_str(&format!(": {}", problems.join("; ")));
    }
    Row {
        kernel: kernel.to_string(),
        what: "the agent's feature probe".into(),
        counts: Counts::default(),
        ok: problems.is_empty(),
        note,
        secs: None,
    }
}
