//! Stage 3: a pure function from a [`Validated`] policy to the [`PolicyTable`] the datapath
//! reads, plus everything the agent reports about it ([`Compiled`]) and, in HTB mode, the HTB
//! hierarchy to install ([`HtbPlan`]).
//!
//! # What the enforcement mode changes in the table
//! | mode          | flow_rate | class_rate, level rate | `skb->priority`          |
//! |---------------|-----------|------------------------|--------------------------|
//! | `Fq`          | kept      | kept (EDT clocks)      | the level's priority     |
//! | `Htb`         | kept      | 0: HTB enforces them   | HTB class id `1:minor`   |
//! | `SockopsOnly` | kept      | 0: nothing can         | the level's priority     |
//! | `None`        | 0         | 0                      | the level's priority     |
//!
//! In `Htb` mode the aggregate EDT clocks are off: with no `fq` to hold packets until their
//! timestamps, a clock running at the class rate would only run ahead and drop packets at the
//! horizon. Per-flow rates stay, for `fq` leaf qdiscs under the HTB leaves (and for sock_ops'
//! SO_MAX_PACING_RATE). A level's hardware priority then reaches switches only through its
//! DSCP/PCP rewrites, since `skb->priority` carries the HTB class id.
//! In `SockopsOnly` mode sock_ops still reads `flow_rate` (SO_MAX_PACING_RATE) and the TCP
//! settings; in `None` mode only the TCP settings, tagging and counting remain.

use std::collections::{HashMap, HashSet};

use std::sync::Arc;

use paceline_common::qjump::Network;
use paceline_common::{
    classify::Rule,
    maps::{
        CLASS_D3, CLASS_SET_PRIORITY, ClassConfig, CodelParams, LEVEL_SET_DSCP, LEVEL_SET_PCP, LevelConfig,
        MAX_CLASSES, MAX_LEVELS, PolicyTable, TABLE_D3_RECEIVER, TABLE_DASR_RECEIVER, TABLE_DASR_SENDER,
        TABLE_NO_FLOW_CLOCKS, TABLE_SOCK_TOS, TABLE_UNTRACKED_CLASSES, TABLE_UNTRACKED_FLOWS, level_slot,
    },
};

use super::covered;
use super::enforcement::{EnforcementMode, EnforcementRequest};
use super::htb::{HTB_MAJOR, HtbPlan, htb_leaf, htb_plan};
use super::validate::{Codel, LinkRate, RuleSpec, TcpSettings, Validated};

mod rules;
pub use rules::net_words;
use rules::{rule_origin, rule_text, table_rule};

/// The datapath's form of a policy's `codel` (off without one, or when `keep` is false).
fn codel_params(c: Option<Codel>, keep: bool) -> CodelParams {
    match c {
        Some(c) if keep => CodelParams::on(c.target_ns, c.interval_ns, c.ecn),
        _ => CodelParams::off(),
    }
}

/// What compilation needs besides the policy.
#[derive(Clone, Copy, Debug)]
pub struct CompileContext<'a> {
    pub mode: EnforcementMode,
    /// The policy running now: classes that exist in both keep their index, so their clocks
    /// and counters keep their meaning across a reload.
    pub previous: Option<&'a Slots>,
    /// Every interface this host has a route through is one of the policy's: sock_ops may
    /// then mark TCP sockets with their level's DSCP (`TABLE_SOCK_TOS`, unless a rule
    /// matches on DSCP). `false` where that is not known (offline). Decided by
    /// [`all_routes_managed`](super::host::all_routes_managed).
    pub all_routes_managed: bool,
}

/// The QJump network as reported.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QJumpInfo {
    pub network: Network,
    /// `n*P/R + eps`, seconds.
    pub worst_case_delay_secs: f64,
    /// `2*n*P/R + eps` (the epoch of factor 1), seconds.
    pub epoch_secs: f64,
}

/// One level as reported.
#[derive(Clone, Debug, PartialEq)]
pub struct LevelInfo {
    pub name: String,
    pub priority: u8,
    /// The QJump factor; `None` for explicit rates and unlimited levels.
    pub factor: Option<f64>,
    pub epoch_secs: Option<f64>,
    /// Bytes/s; `None` = unlimited. This is the policy's rate, whatever the mode.
    pub rate: Option<u64>,
    pub dscp: Option<u8>,
    pub pcp: Option<u8>,
    /// CoDel on the level's departure queue, as the policy asks (in force in `fq` mode only).
    pub codel: Option<Codel>,
}

impl LevelInfo {
    pub fn is_limited(&self) -> bool {
        self.rate.is_some()
    }
}

/// One class as reported.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassInfo {
    /// Index in the table (stable across reloads).
    pub index: u16,
    pub name: String,
    /// Index into [`Compiled::levels`].
    pub level: usize,
    pub flow_rate: Option<u64>,
    pub class_rate: Option<u64>,
    pub tcp: Option<TcpSettings>,
    /// Table rules that select this class.
    pub rules: usize,
    /// CoDel on the class's departure queue, as the policy asks (in force in `fq` mode only).
    pub codel: Option<Codel>,
}

/// One table rule as reported. Its strings are shared: a reload copies the report of each
/// rule it did not change from the running policy (a reference count each, not three strings:
/// 100,000 rules' copies took 18 ms of a one-rule edit as `String`s), and the rules of a class
/// share its name.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleInfo {
    /// Where it came from: `spec.rules[2]` or `spec.rules[2] (src[1], dst[0])`.
    pub origin: Arc<str>,
    pub class: Arc<str>,
    pub class_index: u16,
    /// The conditions, e.g. `tcp dst_port 11211 dst 10.1.0.0/16`, or `any`.
    pub matches: Arc<str>,
}

/// A compiled policy: the table for the datapath and what the agent reports.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The policy's table; its `ctab` header describes [`Compiled::ctab`].
    pub table: PolicyTable,
    /// The rules in first-match order, as the linear reference matcher reads them
    /// (`classify::first_match`); the datapath gets them compiled into [`Compiled::ctab`].
    pub rule_table: Vec<Rule>,
    /// The compiled classifier the datapath looks packets up in.
    pub ctab: Arc<crate::ctab::Image>,
    pub mode: EnforcementMode,
    pub file: String,
    pub name: Option<String>,
    pub description: Option<String>,
    /// sha256 of the file's bytes, hex.
    pub hash: String,
    /// By table index; `None` for unused indices. Its length is `table.n_classes`.
    pub class_names: Vec<Option<String>>,
    /// By table index, like `class_names`.
    pub class_tcp: Vec<Option<TcpSettings>>,
    /// Classes in index order.
    pub classes: Vec<ClassInfo>,
    /// By level index (= list order, 0 = highest).
    pub level_names: Vec<String>,
    pub levels: Vec<LevelInfo>,
    pub qjump: Option<QJumpInfo>,
    pub link_rate: Option<LinkRate>,
    /// The table's rules, in order (shared: a trace names its records' rules from them).
    pub rules: Arc<[RuleInfo]>,
    pub interfaces: Vec<String>,
    pub interfaces_auto: bool,
    pub enforcement: EnforcementRequest,
    pub flow_table_size: u32,
    /// `spec.track_flows` (whether the datapath tracks them: the table's
    /// `TABLE_UNTRACKED_FLOWS` flag).
    pub track_flows: crate::raw::TrackFlows,
    pub horizon_ns: u64,
    /// The default class's table index.
    pub default_class: u16,
    /// Validation's and compilation's warnings, formatted (`file:line: path: message`).
    pub warnings: Vec<String>,
    /// In HTB mode (when the link rate is known).
    pub htb: Option<HtbPlan>,
    /// `spec.d3`, when D3 is on.
    pub d3: Option<crate::validate::D3Spec>,
    /// `spec.dasr`, when DASR is on; `sender` is off in `none` mode (nothing is enforced).
    pub dasr: Option<crate::validate::DasrSpec>,
    /// Where compiling it took its time.
    pub times: CompileTimes,
    /// The rules it was compiled from: [`compile_after`] reuses the report of a rule that is
    /// the same at the same index.
    specs: Arc<[RuleSpec]>,
    /// The covered-rule search's result: [`compile_after`] searches again only for the rules an
    /// edit reaches.
    pub(crate) covered: Arc<crate::ctab::shadow::Covered>,
}

/// Where [`compile`] spent its time (the apply benchmark prints it): the classifier's stages
/// are in `ctab.times`.
#[derive(Clone, Copy, Debug, Default)]
pub struct CompileTimes {
    /// The rule table and what is reported of each rule (origin, conditions).
    pub rules: std::time::Duration,
    /// The classifier ([`crate::ctab::build`]).
    pub classifier: std::time::Duration,
    /// The search for rules an earlier rule covers.
    pub shadow: std::time::Duration,
}

impl Compiled {
    /// The `AGG_CLOCKS`/`STATS` slots whose owner changed since `previous` (a new class at an
    /// index, a renamed level): the agent zeroes them before flipping to this policy.
    pub fn slots_to_reset(&self, previous: Option<&Slots>) -> Vec<u32> {
        let mut out = Vec::new();
        for (i, n) in self.class_names.iter().enumerate() {
            let before = previous.and_then(|p| p.class_names.get(i).cloned().flatten());
            if n.is_some() && *n != before {
                out.push(i as u32);
            }
        }
        for (i, n) in self.level_names.iter().enumerate() {
            if previous.and_then(|p| p.level_names.get(i)) != Some(n) {
                out.push(level_slot(i as u32));
            }
        }
        out
    }
}

/// Which class and level owns each counter and clock slot: what a policy's successor needs to
/// keep indices stable (a class keeps its counters and clock across reloads, and across agent
/// restarts, where it is read back from the state directory).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Slots {
    /// By table index; `None` for unused indices.
    pub class_names: Vec<Option<String>>,
    /// By level index.
    pub level_names: Vec<String>,
    /// By table index, like `class_names`: the level index of each class (empty in the
    /// records of agents that did not keep it).
    #[serde(default)]
    pub class_levels: Vec<Option<u32>>,
}

impl Compiled {
    /// This policy's slot owners.
    pub fn slots(&self) -> Slots {
        Slots {
            class_names: self.class_names.clone(),
            level_names: self.level_names.clone(),
            class_levels: self
                .class_names
                .iter()
                .enumerate()
                .map(|(i, n)| n.as_ref().map(|_| self.table.classes[i].level))
                .collect(),
        }
    }
}

/// Assigns table indices: classes of `previous` keep theirs, at the same level index; new
/// classes, and classes that change level, take the lowest index used neither now nor by
/// `previous`, else the lowest free one. A slot the running policy does not use is one no
/// packet can still count in under its old owner once the policy is written, so a removed
/// class's counters are not inherited and each level's counters stay exact across the reload
/// (the agent's ledger, `control/src/kernel/levels.rs`); only a policy that needs every slot
/// reuses one the running policy uses.
fn class_indices(v: &Validated, previous: Option<&Slots>) -> Vec<u16> {
    let prev: HashMap<&str, usize> = previous
        .map(|p| {
            p.class_names
                .iter()
                .enumerate()
                .filter_map(|(i, n)| n.as_deref().map(|n| (n, i)))
                .collect()
        })
        .unwrap_or_default();
    let same_level = |p: usize, level: usize| {
        previous
            .and_then(|s| s.class_levels.get(p).copied().flatten())
            .is_none_or(|l| l as usize == level)
    };
    let prev_used: HashSet<usize> = prev.values().copied().collect();
    let mut used = [false; MAX_CLASSES];
    let mut idx: Vec<Option<u16>> = vec![None; v.classes.len()];
    for (i, c) in v.classes.iter().enumerate() {
        if let Some(&p) = prev.get(c.name.as_str())
            && p < MAX_CLASSES
            && !used[p]
            && same_level(p, c.level)
        {
            used[p] = true;
            idx[i] = Some(p as u16);
        }
    }
    for slot in idx.iter_mut().filter(|s| s.is_none()) {
        let free = (0..MAX_CLASSES)
            .find(|j| !used[*j] && !prev_used.contains(j))
            .or_else(|| (0..MAX_CLASSES).find(|j| !used[*j]))
            .expect("validation allows at most MAX_CLASSES classes");
        used[free] = true;
        *slot = Some(free as u16);
    }
    idx.into_iter().map(|i| i.expect("assigned")).collect()
}

/// Compiles a validated policy. Pure: the same inputs give the same output. Fails only when the
/// classifier's tables would pass their limits (the error names the limit and the count).
pub fn compile(v: &Validated, ctx: &CompileContext) -> Result<Compiled, super::PolicyError> {
    compile_with(v, ctx, None)
}

/// [`compile`] for the policy that replaces `running`: the classifier takes the parts whose
/// inputs did not change from `running`'s ([`crate::ctab::build_after`]), so a reload that
/// changes a few rules rebuilds only what they touch. The result is [`compile`]'s.
pub fn compile_after(
    v: &Validated,
    ctx: &CompileContext,
    running: &Compiled,
) -> Result<Compiled, super::PolicyError> {
    compile_with(v, ctx, Some(running))
}

fn compile_with(
    v: &Validated,
    ctx: &CompileContext,
    running: Option<&Compiled>,
) -> Result<Compiled, super::PolicyError> {
    let mode = ctx.mode;
    let idx = class_indices(v, ctx.previous);
    let mut warnings: Vec<String> = v.warnings.iter().map(|w| w.to_string()).collect();
    // Mode-wide warnings are located at `spec.enforcement` (or `spec` when it is left out).
    let mut warn = |m: String| warnings.push(located(v, "spec.enforcement", "", m));

    let htb = if mode == EnforcementMode::Htb {
        let p = htb_plan(v, &idx);
        if p.is_none() {
            warn("enforcement htb: no HTB plan, the link rate is unknown; set spec.link_rate".into());
        }
        p
    } else {
        None
    };
    let (keep_flow, keep_aggregates) = match mode {
        EnforcementMode::Fq => (true, true),
        EnforcementMode::Htb | EnforcementMode::SockopsOnly => (true, false),
        EnforcementMode::None => (false, false),
    };
    if let Some(want) = v.enforcement.fixed()
        && want != mode
    {
        warn(format!(
            "spec.enforcement asks for {} but the agent enforces with {}",
            v.enforcement.as_str(),
            mode.as_str()
        ));
    }
    let any_aggregate =
        v.levels.iter().any(|l| l.rate.is_some()) || v.classes.iter().any(|c| c.class_rate.is_some());
    let any_flow = v.classes.iter().any(|c| c.flow_rate.is_some());
    match mode {
        EnforcementMode::SockopsOnly if any_aggregate => warn(
            "enforcement sockops: level and class rates are reported but not enforced (only flow_rate, as SO_MAX_PACING_RATE of TCP sockets, and the tcp settings apply)".into(),
        ),
        EnforcementMode::None if any_aggregate || any_flow => {
            warn("enforcement none: rates are reported but not enforced (classification, tagging, counting and tcp settings only)".into())
        }
        _ => {}
    }
    let any_codel = v.levels.iter().any(|l| l.codel.is_some()) || v.classes.iter().any(|c| c.codel.is_some());
    if any_codel && !keep_aggregates {
        warn(format!(
            "enforcement {}: codel is off (CoDel acts on EDT departure queues, which only fq enforcement has)",
            mode.as_str()
        ));
    }

    let mut table = PolicyTable::empty();
    for (li, l) in v.levels.iter().enumerate().take(MAX_LEVELS) {
        let mut flags = 0;
        if l.dscp.is_some() {
            flags |= LEVEL_SET_DSCP;
        }
        if l.pcp.is_some() {
            flags |= LEVEL_SET_PCP;
        }
        table.levels[li] = LevelConfig {
            rate: if keep_aggregates { l.rate.unwrap_or(0) } else { 0 },
            flags,
            dscp: l.dscp.unwrap_or(0),
            pcp: l.pcp.unwrap_or(0),
            _pad: [0; 2],
            codel: codel_params(l.codel, keep_aggregates),
        };
    }
    let n_classes = idx.iter().map(|i| usize::from(*i) + 1).max().unwrap_or(1);
    let mut class_names = vec![None; n_classes];
    let mut class_tcp = vec![None; n_classes];
    let mut classes = Vec::new();
    // Table rules per class, counted in one pass (a count per class was classes x rules).
    let mut class_rules = vec![0usize; v.classes.len()];
    for r in v.rules.iter() {
        class_rules[r.class] += 1;
    }
    for (ci, c) in v.classes.iter().enumerate() {
        let i = usize::from(idx[ci]);
        let level = &v.levels[c.level];
        let skb_priority = match &htb {
            Some(_) => (u32::from(HTB_MAJOR) << 16) | u32::from(htb_leaf(v, ci, &idx)),
            None => u32::from(level.priority),
        };
        let tcp = c.tcp.unwrap_or_default();
        table.classes[i] = ClassConfig {
            flow_rate: if keep_flow { c.flow_rate.unwrap_or(0) } else { 0 },
            class_rate: if keep_aggregates {
                c.class_rate.unwrap_or(0)
            } else {
                0
            },
            skb_priority,
            flags: CLASS_SET_PRIORITY | if c.d3.is_some() { CLASS_D3 } else { 0 },
            rto_min_us: tcp.rto_min_us.unwrap_or(0),
            delack_max_us: tcp.delack_max_us.unwrap_or(0),
            level: c.level as u32,
            d3_deadline_us: c
                .d3
                .and_then(|k| k.default)
                .map(|(dl, _)| (dl / 1000).min(u32::MAX as u64) as u32)
                .unwrap_or(0),
            d3_size: c.d3.and_then(|k| k.default).map(|(_, sz)| sz).unwrap_or(0),
            codel: codel_params(c.codel, keep_aggregates),
        };
        class_names[i] = Some(c.name.clone());
        class_tcp[i] = c.tcp;
        classes.push(ClassInfo {
            index: idx[ci],
            name: c.name.clone(),
            level: c.level,
            flow_rate: c.flow_rate,
            class_rate: c.class_rate,
            tcp: c.tcp,
            rules: class_rules[ci],
            codel: c.codel,
        });
    }
    classes.sort_by_key(|c| c.index);

    let mut times = CompileTimes::default();
    let t_rules = std::time::Instant::now();
    let mut rule_table = Vec::with_capacity(v.rules.len());
    let mut dscp_rules = false;
    // The running policy's report of each rule, when it is the same rule at the same index in
    // the same class.
    let mut same: Vec<Option<&RuleInfo>> = Vec::with_capacity(v.rules.len());
    // The indices whose table rule may not be the running policy's.
    let mut edited: Vec<usize> = Vec::new();
    for (i, r) in v.rules.iter().enumerate() {
        let class = idx[r.class];
        if r.dscp.is_some() {
            dscp_rules = true;
        }
        let class_name = &v.classes[r.class].name;
        let info = running.and_then(|c| {
            let info = c.rules.get(i)?;
            (c.specs.get(i) == Some(r) && info.class_index == class && *info.class == **class_name)
                .then_some(info)
        });
        // The same spec in the same class index makes the same table rule: the running
        // policy's is copied, not made again.
        match info.and(running).and_then(|c| c.rule_table.get(i)) {
            Some(t) => rule_table.push(*t),
            None => {
                rule_table.push(table_rule(r, class));
                if running.is_some() {
                    // Its table rule may differ from the running policy's.
                    edited.push(i);
                }
            }
        }
        same.push(info);
    }
    // What is reported of each rule: the running policy's report where the rule is the same
    // (its shared strings), else made.
    let shared_names: Vec<Arc<str>> = v.classes.iter().map(|c| Arc::from(c.name.as_str())).collect();
    // Collected straight into the shared slice: a vector turned into one afterwards was
    // copied, both held at once (21 MB at 262,144 rules).
    let rules: Arc<[RuleInfo]> = v
        .rules
        .iter()
        .zip(same)
        .map(|(r, same)| match same {
            Some(info) => info.clone(),
            None => RuleInfo {
                origin: rule_origin(r).into(),
                class: shared_names[r.class].clone(),
                class_index: idx[r.class],
                matches: rule_text(r).into(),
            },
        })
        .collect();
    if ctx.all_routes_managed && !dscp_rules {
        table.flags |= TABLE_SOCK_TOS;
    }
    // Without fq nothing holds packets until their timestamp: a per-flow clock would only run
    // ahead and turn into a policer (drops at the horizon). TCP flows pace themselves through
    // sock_ops at `flow_rate` instead, which reads it from the same table.
    if mode != EnforcementMode::Fq {
        table.flags |= TABLE_NO_FLOW_CLOCKS;
    }
    if let Some(d3) = &v.d3 {
        if d3.receiver {
            table.flags |= TABLE_D3_RECEIVER;
        }
        // The host's line rate bounds what a flow can ask for (quench) and picks the scale of
        // non-deadline requests; 10 Gbit/s when the host reports none.
        let line = v.link_rate.as_ref().map(|l| l.rate).unwrap_or(1_250_000_000);
        table.d3_line_rate = line;
        // Unset (0): a new transfer sends its request and waits about one RTT for the grant
        // (one segment per RTT, as a paused flow), instead of a fixed base rate. TCP schedules
        // a packet's successor at len / rate when it sends it, and a grant cannot pull that
        // departure in: at line/100 a response's second packet left 15 ms after its first on
        // a 400 Mbit/s testbed, whatever the grant (docs/d3.md, "The first RTT").
        table.d3_first_rate = d3.first_rtt_rate.unwrap_or(0);
        // TCP sends its initial window unpaced (its pacing starts at the tenth segment), so
        // the first RTT of a fresh connection is held to this many segments, before any grant.
        table.d3_initial_window = d3.initial_window;
    }
    let mut dasr = v.dasr.clone();
    if let Some(d) = &mut dasr {
        if d.receiver {
            table.flags |= TABLE_DASR_RECEIVER;
        }
        if d.sender && mode == EnforcementMode::None {
            d.sender = false;
            warnings.push(located(
                v,
                "spec.dasr.sender",
                "spec.dasr.sender",
                "enforcement none enforces no rate, so this host does not pace at the shares its receivers advertise".into(),
            ));
        }
        if d.sender {
            table.flags |= TABLE_DASR_SENDER;
        }
    }
    // Flows without a local socket enter the flow table only where it keeps something of
    // theirs: under a policy where no class does, none (no lookup either); under one where some
    // do, those classes' flows (the others' first packets still look the table up); a DASR
    // sender keeps every flow's. `track_flows: all` lists every flow.
    if v.track_flows == crate::raw::TrackFlows::Auto {
        if table.keeps_nothing_per_flow() {
            table.flags |= TABLE_UNTRACKED_FLOWS;
        } else if table.flags & TABLE_DASR_SENDER == 0 {
            table.flags |= TABLE_UNTRACKED_CLASSES;
        }
    }
    times.rules = t_rules.elapsed();
    let built = {
        let t_ctab = std::time::Instant::now();
        // Normalized once, for the classifier and for the covered-rule search.
        let norms = crate::ctab::normalize_all(&rule_table);
        let normalize = t_ctab.elapsed();
        let built = norms.and_then(|norms| {
            let prev = running.map(|c| &*c.ctab);
            let mut image = crate::ctab::build_after(&rule_table, &norms, &crate::ctab::LIMITS, prev)?;
            image.times.normalize = normalize;
            Ok((image, norms))
        });
        times.classifier = t_ctab.elapsed();
        let t_shadow = std::time::Instant::now();
        let built = built.map(|(image, norms)| {
            let covered = covered::covered_rules(
                &rule_table,
                &norms,
                running.map(|r| (&r.rule_table[..], &*r.covered)),
                &edited,
            );
            // Not needed past here: freed before the rest of the policy is put together.
            drop(norms);
            (image, covered)
        });
        times.shadow = t_shadow.elapsed();
        built
    };
    let (ctab, covered) = built.map_err(|e| super::PolicyError {
        file: v.file.clone(),
        line: None,
        path: "spec.rules".into(),
        message: match &e {
            crate::ctab::BuildError::Unsupported { rule, why } => {
                let origin = v.rules.get(*rule).map_or_else(|| "a rule".into(), rule_origin);
                format!("{origin}: {why}")
            }
            _ => e.to_string(),
        },
    })?;
    table.ctab = ctab.header;
    let t_shadow = std::time::Instant::now();
    let covered = Arc::new(covered);
    covered::shadow_warnings(
        &rule_table,
        &covered,
        |i| (&*rules[i].origin, &*rules[i].matches),
        &mut warnings,
        |at, path, message| located(v, at, path, message),
    );
    times.shadow += t_shadow.elapsed();
    table.n_classes = n_classes as u32;
    table.default_class = u32::from(idx[v.default_class]);
    table.horizon_ns = v.horizon_ns;

    let levels = v
        .levels
        .iter()
        .map(|l| LevelInfo {
            name: l.name.clone(),
            priority: l.priority,
            factor: match l.limit {
                super::validate::Limit::Factor(f) => Some(f),
                _ => None,
            },
            epoch_secs: l.epoch_secs,
            rate: l.rate,
            dscp: l.dscp,
            pcp: l.pcp,
            codel: l.codel,
        })
        .collect();
    let qjump = v.qjump.map(|n| QJumpInfo {
        network: n,
        worst_case_delay_secs: n.worst_case_delay_secs(),
        epoch_secs: n.epoch_secs(1.0),
    });

    Ok(Compiled {
        d3: v.d3.clone(),
        dasr,
        table,
        rule_table,
        ctab: Arc::new(ctab),
        mode,
        file: v.file.clone(),
        name: v.name.clone(),
        description: v.description.clone(),
        hash: v.hash.clone(),
        class_names,
        class_tcp,
        classes,
        level_names: v.levels.iter().map(|l| l.name.clone()).collect(),
        levels,
        qjump,
        link_rate: v.link_rate.clone(),
        rules,
        interfaces: v.interfaces.clone(),
        interfaces_auto: v.interfaces_auto,
        enforcement: v.enforcement,
        flow_table_size: v.flow_table_size,
        track_flows: v.track_flows,
        horizon_ns: v.horizon_ns,
        default_class: idx[v.default_class],
        warnings,
        htb,
        times,
        specs: v.rules.clone(),
        covered,
    })
}

/// A warning as validation's are printed: `file:line: path: message`, the line that of `at`
/// (or of the nearest field above it that the file has).
pub(crate) fn located(v: &Validated, at: &str, path: &str, message: String) -> String {
    super::PolicyError {
        file: v.file.clone(),
        line: v.lines.line(at),
        path: path.to_string(),
        message,
    }
    .to_string()
}
