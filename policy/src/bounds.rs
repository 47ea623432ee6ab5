//! Limits a policy text must keep before the YAML parsers that build it (serde_yaml and
//! yaml-rust2's line index) see it, so that any input is accepted or refused in bounded time
//! and memory: a size, a nesting depth and a node count after alias expansion.
//!
//! Without them, ~200 KB of `[` kept `policy check` busy for seconds, 20,000 nested `- ` or
//! indented mappings overflowed the stack, and a few lines of nested aliases ("billion laughs")
//! expand to billions of nodes. The limits leave room for the largest legitimate policies
//! (100,000 rules after expansion: a 10-20 MB file of long CIDR lists):
//! - [`MAX_POLICY_BYTES`]: 32 MiB. Every path that reads a policy (a file, the agent's reload,
//!   an agent's `/policy` over HTTP) reads at most one byte more ([`read_bounded`]).
//! - [`MAX_DEPTH`]: 64 nested collections (a policy uses 5).
//! - [`MAX_NODES`]: 4,000,000 YAML nodes (scalars and collections) with every alias counted
//!   as the nodes it stands for.
//!
//! The check is one pass of yaml-rust2's event parser, which is iterative and stops at the
//! first violation. Text after a syntax error yaml-rust2 finds is not checked, so serde_yaml
//! (which reports syntax errors with the positions users see) gets the text only up to there.

use std::collections::HashMap;
use std::io::Read as _;
use std::path::Path;

use yaml_rust2::parser::{Event, Parser};

use super::PolicyError;

/// The largest policy text accepted: 32 MiB.
pub const MAX_POLICY_BYTES: usize = 32 << 20;
/// The deepest nesting of sequences and mappings accepted.
pub const MAX_DEPTH: usize = 64;
/// The most YAML nodes a policy may have, aliases expanded.
pub const MAX_NODES: u64 = 4_000_000;

fn error(file: &str, line: Option<usize>, message: String) -> PolicyError {
    PolicyError {
        file: file.to_string(),
        line,
        path: String::new(),
        message,
    }
}

pub(crate) fn too_big(file: &str, len: usize) -> PolicyError {
    error(
        file,
        None,
        format!(
            "is {}; a policy may be at most {} MiB ({MAX_POLICY_BYTES} bytes)",
            if len > MAX_POLICY_BYTES {
                format!("larger than {} MiB", MAX_POLICY_BYTES >> 20)
            } else {
                format!("{len} bytes")
            },
            MAX_POLICY_BYTES >> 20
        ),
    )
}

/// Reads at most [`MAX_POLICY_BYTES`] + 1 bytes from `r`: enough to tell a text that is too
/// large, never more (a policy path pointing at `/dev/zero` or a huge file costs nothing).
pub fn read_bounded(r: impl std::io::Read) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    r.take(MAX_POLICY_BYTES as u64 + 1).read_to_end(&mut buf)?;
    Ok(buf)
}

/// [`read_bounded`] on a file. Opening does not wait for a writer: a FIFO nobody writes
/// reads as empty instead of blocking the reader (the agent's reload) forever.
pub fn read_file(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let t = f.metadata()?.file_type();
    if t.is_dir() {
        return Err(std::io::Error::other("is a directory, not a policy file"));
    }
    if t.is_fifo() {
        // A pipe with a writer (`<(...)`) is read as it comes: back to blocking reads.
        // SAFETY: fcntl on an fd this function owns.
        unsafe {
            let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    read_bounded(f)
}

/// Checks `text` against the limits. On success returns the part of `text` a YAML parser may
/// be given: all of it, or the text up to just past a syntax error yaml-rust2 found (where the
/// structure was last checked).
pub fn check<'a>(text: &'a str, file: &str) -> Result<&'a str, PolicyError> {
    if text.len() > MAX_POLICY_BYTES {
        return Err(too_big(file, text.len()));
    }
    let mut parser = Parser::new_from_str(text);
    // (anchor id, nodes counted when its collection started) of each open collection.
    let mut open: Vec<(usize, u64)> = Vec::new();
    let mut anchors: HashMap<usize, u64> = HashMap::new();
    let mut nodes: u64 = 0;
    loop {
        let (ev, mark) = match parser.next_token() {
            Ok(x) => x,
            Err(e) => {
                if e.info().contains("recursion limit") {
                    return Err(error(
                        file,
                        Some(e.marker().line()),
                        format!("nests deeper than {MAX_DEPTH} levels; a policy needs at most 5"),
                    ));
                }
                return Ok(prefix_through(text, e.marker().index()));
            }
        };
        let added = match ev {
            Event::StreamEnd => return Ok(text),
            Event::Scalar(_, _, anchor, _) => {
                if anchor > 0 {
                    anchors.insert(anchor, 1);
                }
                1
            }
            Event::Alias(id) => anchors.get(&id).copied().unwrap_or(1),
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                if open.len() >= MAX_DEPTH {
                    return Err(error(
                        file,
                        Some(mark.line()),
                        format!("nests deeper than {MAX_DEPTH} levels; a policy needs at most 5"),
                    ));
                }
                open.push((anchor, nodes));
                1
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((anchor, start)) = open.pop()
                    && anchor > 0
                {
                    anchors.insert(anchor, nodes - start);
                }
                0
            }
            _ => 0,
        };
        nodes = nodes.saturating_add(added);
        if nodes > MAX_NODES {
            return Err(error(
                file,
                Some(mark.line()),
                format!(
                    "has more than {MAX_NODES} YAML nodes with its aliases expanded; a policy of 100,000 rules has about 1,500,000"
                ),
            ));
        }
    }
}

/// `text` up to 64 bytes past the character at `char_index` (within its line): enough for a
/// parser to see the token that is wrong, too little to nest deeper than the limit.
fn prefix_through(text: &str, char_index: usize) -> &str {
    let start = text.char_indices().nth(char_index).map_or(text.len(), |(i, _)| i);
    let mut end = start;
    for (i, c) in text[start..].char_indices() {
        if i > 64 || c == '\n' {
            break;
        }
        end = start + i + c.len_utf8();
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::{FakeHost, parse_str};

    /// Whatever the input, the whole pipeline answers in well under a second.
    fn quick(text: &str) -> Vec<String> {
        let t = Instant::now();
        let r = parse_str(text, "adv.yaml", &FakeHost::new().with_interface("eth0", None));
        let took = t.elapsed();
        assert!(
            // What this guards against is parsing that grows faster than the input (200 KB of
            // `[` once took over 20 s), not a slow machine: the bound leaves room for a loaded
            // one (a release build took 404 ms here while two builds shared the machine).
            // Debug builds run the parsers (generic code, compiled here) about 10x slower.
            took < Duration::from_millis(if cfg!(debug_assertions) { 5000 } else { 2000 }),
            "{} bytes took {took:?}",
            text.len()
        );
        match r {
            Ok(_) => vec![],
            Err(e) => e.iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn deep_flow_nesting_is_refused_quickly() {
        // Regression: 200 KB of `[` kept `policy check` busy for more than 20 s.
        let e = quick(&"[".repeat(200_000));
        assert_eq!(
            e,
            ["adv.yaml:1: nests deeper than 64 levels; a policy needs at most 5"]
        );
        let e = quick(&format!("a: {}", "{a: ".repeat(100_000)));
        assert!(e[0].contains("nests deeper than 64 levels"), "{e:?}");
    }

    #[test]
    fn deep_block_nesting_is_refused_quickly() {
        // Both overflowed the stack before the limit.
        let e = quick(&("- ".repeat(20_000) + "a"));
        assert!(e[0].contains("nests deeper than 64 levels"), "{e:?}");
        let indented: String = (0..3000).map(|i| format!("{}a{i}:\n", " ".repeat(i))).collect();
        let e = quick(&indented);
        assert!(e[0].contains("nests deeper than 64 levels"), "{e:?}");
    }

    #[test]
    fn billion_laughs_is_refused_quickly() {
        let mut t = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let p = (b'a' + i - 1) as char;
            let n = (b'a' + i) as char;
            t.push_str(&format!(
                "{n}: &{n} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
            ));
        }
        let e = quick(&t);
        assert!(e[0].contains("more than 4000000 YAML nodes"), "{e:?}");
    }

    #[test]
    fn huge_inputs_are_refused_by_size_or_answered_quickly() {
        let e = quick(&"#".repeat(MAX_POLICY_BYTES + 1));
        assert_eq!(
            e,
            ["adv.yaml: is larger than 32 MiB; a policy may be at most 32 MiB (33554432 bytes)"]
        );
        // One long line, a long key over a long list, many keys: under the limits, refused for
        // what they say. (Sizes that debug builds, whose YAML parsing is some 30x slower than
        // release, still answer in time; the release agent takes ~1 s for 20 MB.)
        let e = quick(&format!("apiVersion: {}\n", "a".repeat(256 << 10)));
        assert!(!e.is_empty());
        let e = quick(&format!(
            "{}: [{}]\n",
            "k".repeat(128 << 10),
            "1, ".repeat(30_000)
        ));
        assert!(!e.is_empty());
        let many: String = (0..30_000).map(|i| format!("k{i}: v\n")).collect();
        assert!(!quick(&many).is_empty());
        let read = read_bounded(std::io::repeat(b'a')).unwrap();
        assert_eq!(read.len(), MAX_POLICY_BYTES + 1, "a reader never yields more");
    }

    #[test]
    fn syntax_errors_keep_their_message_and_position() {
        let t = "apiVersion: paceline/v1\nkind: Policy\nspec:\n  levels: [a, b\n  classes: []\n";
        let e = quick(t);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].starts_with("adv.yaml:"), "{e:?}");
    }

    #[test]
    fn long_cidr_lists_are_within_the_limits() {
        // What a 100,000-rule policy looks like, scaled down for debug builds: rules with long
        // address lists. 20 MB of this is ~1.3M nodes, a third of MAX_NODES.
        let mut t = String::from("apiVersion: paceline/v1\nkind: Policy\nspec:\n  rules:\n");
        for r in 0..40 {
            t.push_str(&format!("    - class: c{r}\n      dst:\n"));
            for i in 0..1500 {
                t.push_str(&format!("        - 10.{}.{}.0/24\n", r, i % 256));
            }
        }
        assert!(t.len() > 1 << 20);
        assert_eq!(check(&t, "big.yaml").map(str::len), Ok(t.len()));
    }

    #[test]
    fn anchors_and_aliases_within_limits_are_fine() {
        let t = "apiVersion: paceline/v1\nkind: Policy\nspec:\n  interfaces: [eth0]\n  levels: [{name: bulk, priority: 0}]\n  classes: [{name: c, level: bulk}]\n  rules:\n    - {class: c, dst: &nets [10.0.0.0/8, 192.168.0.0/16]}\n    - {class: c, src: *nets}\n  default_class: c\n";
        let e = quick(t);
        assert!(e.is_empty(), "{e:?}");
    }
}
