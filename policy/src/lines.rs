//! Where each field of a YAML document is: a map from paths (`spec.classes[2].flow_rate`) to
//! 1-based line numbers, built with yaml-rust2's marked event parser.
//!
//! serde_yaml reports positions only for its own errors; validation errors are about fields of
//! the already-parsed document, so they are located through this index. A mapping entry is at
//! the line of its key, a sequence item at the line of its first token.
//!
//! The index is built the first time a line is asked for: a policy without errors or warnings
//! never needs one, and building it is a third of parsing a large policy (43 of 128 ms at
//! 100,000 rules) and holds a path string for every field (tens of MB), where the text it is
//! built from is 1.8 MB.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// Keys longer than this are indexed as `?`.
const MAX_KEY: usize = 256;

/// Path -> line index of one document, built on first use from the text it keeps.
#[derive(Clone, Default)]
pub struct LineIndex {
    text: Arc<str>,
    lines: OnceLock<HashMap<String, usize>>,
}

impl std::fmt::Debug for LineIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineIndex")
            .field("text_bytes", &self.text.len())
            .field("built", &self.lines.get().map(HashMap::len))
            .finish()
    }
}

enum Frame {
    Map {
        path: String,
        expecting_key: bool,
        key: Option<String>,
    },
    Seq {
        path: String,
        next: usize,
    },
}

struct Builder {
    stack: Vec<Frame>,
    lines: HashMap<String, usize>,
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

impl Builder {
    /// The path of the node that starts now (and updates the parent's state); `None` for a
    /// mapping key.
    fn node_path(&mut self, ev: &Event, line: usize) -> Option<String> {
        match self.stack.last_mut() {
            None => Some(String::new()),
            Some(Frame::Seq { path, next }) => {
                let p = format!("{path}[{next}]");
                *next += 1;
                self.lines.entry(p.clone()).or_insert(line);
                Some(p)
            }
            Some(Frame::Map {
                path,
                expecting_key,
                key,
            }) => {
                if *expecting_key {
                    *expecting_key = false;
                    // A key longer than any field name is no field: indexed as `?`, so that a
                    // hostile megabyte-long key is not copied into the path of every child.
                    let k = match ev {
                        Event::Scalar(s, ..) if s.len() <= MAX_KEY => s.clone(),
                        _ => "?".to_string(),
                    };
                    let p = join(path, &k);
                    self.lines.entry(p.clone()).or_insert(line);
                    *key = Some(k);
                    // A complex key's children get paths under `<map>.?`; never looked up.
                    match ev {
                        Event::Scalar(..) | Event::Alias(_) => None,
                        _ => Some(join(path, "?")),
                    }
                } else {
                    *expecting_key = true;
                    Some(join(path, key.as_deref().unwrap_or("?")))
                }
            }
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        let line = mark.line();
        match ev {
            Event::Scalar(..) | Event::Alias(_) => {
                self.node_path(&ev, line);
            }
            Event::MappingStart(..) => {
                if let Some(path) = self.node_path(&ev, line) {
                    self.lines.entry(path.clone()).or_insert(line);
                    self.stack.push(Frame::Map {
                        path,
                        expecting_key: true,
                        key: None,
                    });
                } else {
                    self.stack.push(Frame::Map {
                        path: "?".into(),
                        expecting_key: true,
                        key: None,
                    });
                }
            }
            Event::SequenceStart(..) => {
                let path = self.node_path(&ev, line).unwrap_or_else(|| "?".into());
                self.lines.entry(path.clone()).or_insert(line);
                self.stack.push(Frame::Seq { path, next: 0 });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
            }
            _ => {}
        }
    }
}

impl LineIndex {
    /// An index of `text` (a copy of it is kept; the index is built on the first
    /// [`LineIndex::line`]).
    pub fn new(text: &str) -> Self {
        LineIndex {
            text: Arc::from(text),
            lines: OnceLock::new(),
        }
    }

    /// Whether the index has been built (a line was asked for).
    pub fn is_built(&self) -> bool {
        self.lines.get().is_some()
    }

    /// Indexes the text; a document yaml-rust2 cannot parse gives what was indexed before the
    /// error (serde_yaml then reports the syntax error with its own position).
    fn build(text: &str) -> HashMap<String, usize> {
        let mut b = Builder {
            stack: Vec::new(),
            lines: HashMap::new(),
        };
        let mut parser = Parser::new_from_str(text);
        if parser.load(&mut b, false).is_err() {
            // Keep what was indexed before the error: still useful.
        }
        b.lines
    }

    /// The line of `path`, else of its closest indexed ancestor (a missing field points at
    /// the mapping that lacks it).
    pub fn line(&self, path: &str) -> Option<usize> {
        let lines = self.lines.get_or_init(|| Self::build(&self.text));
        let mut p = path;
        loop {
            if let Some(&l) = lines.get(p) {
                return Some(l);
            }
            if p.is_empty() {
                return None;
            }
            p = parent(p);
        }
    }
}

/// `a.b[2].c` -> `a.b[2]` -> `a.b` -> `a` -> ``.
fn parent(p: &str) -> &str {
    if p.ends_with(']')
        && let Some(i) = p.rfind('[')
    {
        return &p[..i];
    }
    match p.rfind('.') {
        Some(i) => &p[..i],
        None => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "\
apiVersion: paceline/v1
kind: Policy
spec:
  interfaces: [eth0, eth1]
  levels:
    - name: latency
      priority: 7

    - name: bulk
      priority: 0
  classes:
    -
      name: a
      tcp: {rto_min: 5ms,
            delack_max: 1ms}
  rules:
    - class: a
      dst:
        - 10.0.0.0/8
        - fd00::/8
";

    #[test]
    fn paths_to_lines() {
        let idx = LineIndex::new(DOC);
        assert_eq!(idx.line("apiVersion"), Some(1));
        assert_eq!(idx.line("spec"), Some(3));
        assert_eq!(idx.line("spec.interfaces"), Some(4));
        assert_eq!(idx.line("spec.interfaces[1]"), Some(4));
        assert_eq!(idx.line("spec.levels[0]"), Some(6));
        assert_eq!(idx.line("spec.levels[0].priority"), Some(7));
        assert_eq!(idx.line("spec.levels[1]"), Some(9));
        assert_eq!(idx.line("spec.levels[1].name"), Some(9));
        assert_eq!(idx.line("spec.classes[0].name"), Some(13));
        assert_eq!(idx.line("spec.classes[0].tcp.delack_max"), Some(15));
        assert_eq!(idx.line("spec.rules[0].dst[1]"), Some(20));
    }

    #[test]
    fn missing_paths_fall_back_to_the_parent() {
        let idx = LineIndex::new(DOC);
        assert_eq!(idx.line("spec.levels[1].factor"), Some(9));
        assert_eq!(idx.line("spec.default_class"), Some(3));
        assert_eq!(idx.line("spec.rules[0].dst[7]"), Some(18));
        // The root mapping starts at the first key.
        assert_eq!(idx.line("nothing"), Some(1));
        assert_eq!(LineIndex::new("# only a comment\n").line("spec"), None);
    }

    #[test]
    fn broken_yaml_keeps_what_came_before() {
        let idx = LineIndex::new("a: 1\nb: [\n");
        assert_eq!(idx.line("a"), Some(1));
    }
}
