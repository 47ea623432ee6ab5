//! [`PolicyError`]: a problem in a policy file, what every stage reports.

use std::fmt;

/// A problem in a policy file, located by file, line (when known) and field path. Also used
/// for warnings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    pub file: String,
    /// 1-based.
    pub line: Option<usize>,
    /// `spec.classes[2].flow_rate`; empty for problems with the whole file.
    pub path: String,
    pub message: String,
}

impl fmt::Display for PolicyError {
    /// `policies/x.yaml:14: spec.classes[2].flow_rate: "10 Gbits" is not a rate; ...`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{l}: ", self.file)?,
            None => write!(f, "{}: ", self.file)?,
        }
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for PolicyError {}
