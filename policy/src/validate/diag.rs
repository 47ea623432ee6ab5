//! `Diag`: collects a policy's errors and warnings, each located by its field path and,
//! through the [`LineIndex`], its line.

use crate::error::PolicyError;
use crate::lines::LineIndex;

/// Collects errors and warnings with their locations.
pub(super) struct Diag<'a> {
    file: &'a str,
    lines: &'a LineIndex,
    pub errors: Vec<PolicyError>,
    pub warnings: Vec<PolicyError>,
}

impl<'a> Diag<'a> {
    pub fn new(file: &'a str, lines: &'a LineIndex) -> Self {
        Diag {
            file,
            lines,
            errors: Vec::new(),
            warnings: Vec::new(),
        }
    }
    fn make(&self, path: String, message: String) -> PolicyError {
        PolicyError {
            file: self.file.to_string(),
            line: self.lines.line(&path),
            path,
            message,
        }
    }
    pub fn error(&mut self, path: impl Into<String>, message: impl Into<String>) {
        let e = self.make(path.into(), message.into());
        self.errors.push(e);
    }
    pub fn warn(&mut self, path: impl Into<String>, message: impl Into<String>) {
        let w = self.make(path.into(), message.into());
        self.warnings.push(w);
    }
    /// `Ok` passes through; `Err` is recorded at `path`.
    pub fn check<T>(&mut self, path: &str, r: Result<T, String>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(m) => {
                self.error(path, m);
                None
            }
        }
    }
}
