//! # Layout
//!
//! `paceline-policy`: the policy compiler and the classifier compiler, from a YAML file to
//! what the datapath reads. No kernel, no async runtime: the agent (`paceline`) loads what this
//! crate compiles, and asks the host through [`HostFacts`]; `paceline-fuzz` fuzzes it alone.
//!
//! - [`bounds`]: size, depth and node limits checked before any YAML parser runs; reading a
//!   policy file within them.
//! - [`raw`]: the file format (stage 1) and the schema.
//! - `error`: [`PolicyError`], a problem located by file, line and field.
//! - [`units`]: rates, sizes, durations: parsing and formatting.
//! - [`lines`]: path -> line index of a YAML document.
//! - [`protocols`]: the IP protocols a policy may name (one table: parser, messages, schema).
//! - [`host`]: [`HostFacts`], what validation asks the host; [`OfflineHost`], [`FakeHost`]
//!   (the agent's `SystemHost` asks the running machine).
//! - [`validate`]: stage 2, [`Validated`]; the model, the field parsers, and one file per
//!   section of `spec` (levels, classes, rules, d3, dasr, codel), each with its tests.
//! - [`compile`](mod@compile): stage 3, [`Compiled`].
//! - [`ctab`]: the classifier compiler: a first-match rule list into the tries and tables the
//!   datapath looks packets up in, its limits, and the covered-rule warnings.
//! - [`htb`]: the HTB hierarchy of `htb` mode ([`HtbPlan`]), compiled with the table.
//! - [`enforcement`]: what a policy asks for, what the kernel offers ([`KernelSupport`]), the
//!   mode the agent uses ([`decide_mode`]) and what it then does not enforce
//!   ([`degradations_for`]).
//! - [`render`]: the check report and JSON output.
//! - [`diff`](mod@diff): what differs between two compiled policies, as an operator reads them.
//! - `restart`: [`Compiled::restart_needed`], what a reload cannot apply.
//! - [`testing`]: the fixtures' host and parse helpers, for the tests here and in the agent.
//!
//! # Policies: from a YAML file to the `PolicyTable` the datapath reads
//!
//! Three stages, as in ripgrep's `LowArgs -> HiArgs`:
//!
//! 1. [`raw`]: serde types that mirror the file exactly (`deny_unknown_fields`, quantities kept
//!    as text). The JSON schema `policies/schema.json` is generated from them
//!    ([`schema_json`], `paceline policy schema`).
//! 2. [`validate`]: units parsed ([`units`]), ranges checked, names resolved, address lists
//!    expanded, host facts looked up through [`HostFacts`]. Every error is collected, each
//!    pointing at its field and line ([`lines`]) and saying what would be valid:
//!    `policies/x.yaml:14: spec.classes[2].flow_rate: "10 Gbits" is not a rate; write e.g. ...`.
//! 3. [`compile`](compile::compile): a pure function from the validated policy and a
//!    [`CompileContext`] (the enforcement mode the agent uses, the previous policy) to the
//!    [`PolicyTable`](paceline_common::maps::PolicyTable) plus what the agent reports
//!    ([`Compiled`]); [`render`] turns that into `paceline policy check` output.
//!
//! # Decisions a policy author should know
//! - Units are always written out; a bare number is refused (`100` could be bits or bytes).
//!   `Mbps`-style spellings are bits; tc's all-lower-case byte spellings (`mbps`) are refused as
//!   ambiguous. See [`units`].
//! - Levels are listed from the highest to the lowest. Priorities must be unique and decrease
//!   down the list; factors must not decrease; an unlimited level may not sit above a
//!   rate-limited one (it could take the whole link ahead of it). These are errors.
//! - The rates of the rate-limited levels must fit the host's link (`spec.link_rate`, else the
//!   slowest interface the kernel reports, else `spec.qjump.link_rate`): an error with numbers.
//! - Address lists expand to one rule per same-family (src, dst) pair; an entry that pairs with
//!   nothing is an error, as is more than `MAX_RULES` (262,144) rules after expansion. The
//!   classifier compiled from them ([`crate::ctab`]) has its own table limits, checked at
//!   compilation; rules that an earlier rule covers are warned about.
//! - In HTB mode `skb->priority` carries the HTB class id, so a level's hardware priority
//!   reaches switches only through its DSCP/PCP rewrites.

pub mod bounds;
pub mod compile;
mod covered;
pub mod ctab;
pub mod diff;
pub mod enforcement;
mod error;
pub mod host;
pub mod htb;
pub mod lines;
pub mod protocols;
pub mod raw;
pub mod render;
mod restart;
pub mod testing;
pub mod units;
pub mod validate;

#[cfg(test)]
pub(crate) mod tests;

use std::path::Path;

use sha2::{Digest as _, Sha256};

pub use compile::{
    ClassInfo, CompileContext, Compiled, LevelInfo, QJumpInfo, RuleInfo, Slots, compile, compile_after,
};
pub use enforcement::{EnforcementMode, EnforcementRequest, KernelSupport, decide_mode, degradations_for};
pub use error::PolicyError;
pub use host::{FakeHost, HostFacts, OfflineHost};
pub use htb::{HtbClass, HtbPlan};
pub use raw::schema_json;
pub use validate::{LinkRate, LinkRateSource, TcpSettings, Validated};

/// Reads, parses and validates the policy at `path`.
pub fn load(path: &Path, host: &dyn HostFacts) -> Result<Validated, Vec<PolicyError>> {
    let text = read(path)?;
    parse_str(&text, &path.display().to_string(), host)
}

/// Reads the policy at `path` as text (the errors name the file). The agent reads once and
/// validates what it read, so the text it keeps is the text it applied. Reads at most
/// [`bounds::MAX_POLICY_BYTES`] + 1 bytes; [`decode`] turns them into text.
pub fn read(path: &Path) -> Result<String, Vec<PolicyError>> {
    let file = path.display().to_string();
    match bounds::read_file(path) {
        Ok(bytes) => decode(bytes, &file).map_err(|e| vec![e]),
        Err(e) => Err(vec![PolicyError {
            file,
            line: None,
            path: String::new(),
            message: format!("cannot read: {e}"),
        }]),
    }
}

/// A policy file's bytes as text, as editors write them: the size limit is checked first (a
/// file cut at the limit is no longer valid UTF-8), UTF-16 and UTF-32 (by their byte-order
/// mark, or by the NUL bytes ASCII text has in them) are named with what to do, and invalid
/// UTF-8 is located by line. A UTF-8 byte-order mark is kept (the hash is the file's sha256);
/// [`parse_str`] skips it.
pub fn decode(bytes: Vec<u8>, file: &str) -> Result<String, PolicyError> {
    let error = |line: Option<usize>, message: String| PolicyError {
        file: file.to_string(),
        line,
        path: String::new(),
        message,
    };
    if bytes.len() > bounds::MAX_POLICY_BYTES {
        return Err(bounds::too_big(file, bytes.len()));
    }
    if let Some(encoding) = wide_encoding(&bytes) {
        return Err(error(
            Some(1),
            format!(
                "is {encoding} text; a policy is UTF-8: save the file as UTF-8 (in most editors: \"Save with encoding\" or \"File encoding\", then UTF-8)"
            ),
        ));
    }
    String::from_utf8(bytes).map_err(|e| {
        let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let line = valid.iter().filter(|&&b| b == b'\n').count() + 1;
        error(
            Some(line),
            format!(
                "is not UTF-8 text (byte {} is not UTF-8); save the file as UTF-8",
                valid.len()
            ),
        )
    })
}

/// The UTF-16 or UTF-32 encoding `b` is in, from its byte-order mark, or from where the NUL
/// bytes of its first characters are (a policy starts with ASCII: `apiVersion`, `#`, a space).
fn wide_encoding(b: &[u8]) -> Option<&'static str> {
    match b {
        [0xff, 0xfe, 0, 0, ..] => Some("UTF-32LE (with a byte-order mark)"),
        [0, 0, 0xfe, 0xff, ..] => Some("UTF-32BE (with a byte-order mark)"),
        [0xff, 0xfe, ..] => Some("UTF-16LE (with a byte-order mark)"),
        [0xfe, 0xff, ..] => Some("UTF-16BE (with a byte-order mark)"),
        [a, 0, 0, 0, ..] if *a != 0 => Some("UTF-32LE"),
        [0, 0, 0, a, ..] if *a != 0 => Some("UTF-32BE"),
        [a, 0, ..] if *a != 0 => Some("UTF-16LE"),
        [0, a, ..] if *a != 0 => Some("UTF-16BE"),
        _ => None,
    }
}

/// Parses and validates policy text; `file_name` is used in messages. A leading UTF-8
/// byte-order mark is skipped; the text is checked against [`bounds`] first.
pub fn parse_str(text: &str, file_name: &str, host: &dyn HostFacts) -> Result<Validated, Vec<PolicyError>> {
    // A UTF-8 byte-order mark (some editors write one) is no part of the YAML; the hash below
    // is still of the whole text, the file's sha256.
    let body = text.strip_prefix('\u{feff}').unwrap_or(text);
    let text_checked = bounds::check(body, file_name).map_err(|e| vec![e])?;
    let lines = lines::LineIndex::new(text_checked);
    let raw = parse_raw(text_checked, file_name, &lines).map_err(|e| vec![e])?;
    let mut v = validate::validate(&raw, file_name, hash(text.as_bytes()), &lines, host)?;
    v.lines = std::sync::Arc::new(lines);
    Ok(v)
}

/// Stage 1 only: the file as serde sees it. serde stops at the first error, so this returns
/// one error; its position comes from serde_yaml.
pub fn parse_raw(
    text: &str,
    file_name: &str,
    lines: &lines::LineIndex,
) -> Result<raw::PolicyFile, PolicyError> {
    if text
        .trim()
        .lines()
        .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
    {
        return Err(PolicyError {
            file: file_name.to_string(),
            line: None,
            path: String::new(),
            message: "is empty; a policy starts with `apiVersion: paceline/v1` and `kind: Policy`".into(),
        });
    }
    serde_yaml::from_str::<raw::PolicyFile>(text).map_err(|e| serde_error(file_name, &e, lines))
}

/// sha256 of `bytes`, lower-case hex.
pub fn hash(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Turns a serde_yaml error (`spec.classes[0]: unknown field ... at line 3 column 5`) into a
/// [`PolicyError`] with the path split out and a friendlier message.
fn serde_error(file: &str, e: &serde_yaml::Error, lines: &lines::LineIndex) -> PolicyError {
    let mut msg = e.to_string();
    // Drop serde_yaml's trailing " at line L column C" when it is the position reported in
    // front; libyaml's syntax errors end with the position of their context, which stays.
    if let Some(loc) = e.location() {
        let suffix = format!(" at line {} column {}", loc.line(), loc.column());
        if msg.ends_with(&suffix) {
            msg.truncate(msg.len() - suffix.len());
        }
    }
    let (path, message) = match msg.split_once(": ") {
        Some((p, m))
            if !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '[' | ']' | '?')) =>
        {
            (p.to_string(), m.to_string())
        }
        _ => (String::new(), msg.clone()),
    };
    let message = friendlier(&message);
    let line = e
        .location()
        .map(|l| l.line())
        .or_else(|| if path.is_empty() { None } else { lines.line(&path) });
    PolicyError {
        file: file.to_string(),
        line,
        path,
        message,
    }
}

/// Serde's wording, made to say what would be valid in the policy's terms.
fn friendlier(m: &str) -> String {
    let m = m
        .replace("expected i64", "expected an integer")
        .replace("expected a sequence", "expected a list")
        .replace("expected a string", "expected text")
        .replace("expected struct ", "expected a mapping of ")
        .replace(
            "deserializing from YAML containing more than one document is not supported",
            "holds more than one YAML document (a `---` line); a policy file holds exactly one",
        );
    // unknown field `flow_rat`, expected one of `name`, `level`, `flow_rate`, ...
    if let Some(rest) = m.clone().strip_prefix("unknown field `")
        && let Some((field, valid)) = rest.split_once("`, expected ")
    {
        let names: Vec<&str> = valid.split('`').skip(1).step_by(2).collect();
        let best = names
            .iter()
            .map(|n| (edit_distance(field, n), *n))
            .filter(|(dist, n)| *dist <= 2.max(n.len() / 4))
            .min();
        let field = field.to_string();
        let mut m = format!(
            "unknown field `{field}`; valid fields: {}",
            names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        if let Some((_, b)) = best {
            m.push_str(&format!(" (did you mean `{b}`?)"));
        }
        return m;
    }
    m
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}
