//! One problem in one file, and how to fix it.

use std::fmt;

/// One problem found in a config file: where it is, which field, what is wrong, how to fix it.
///
/// Diagnostics sort by file, then line, then column, which is the order they are reported in.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Diagnostic {
    /// The file as the caller named it (e.g. `examples/policy.yaml`).
    pub file: String,
    /// 1-based line; 0 when the problem is about the whole file (e.g. it cannot be read).
    pub line: usize,
    /// 1-based column (in characters); 0 when unknown.
    pub column: usize,
    /// Path of the field in the file, e.g. `projects[2].quotas[0].guaranteed`; list indexes
    /// are 0-based. Empty when the problem is not in one field (e.g. a YAML syntax error at the
    /// top level).
    pub field: String,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub fix: String,
}

impl fmt::Display for Diagnostic {
    /// `file:line:column: field: message — fix: fix`, leaving out the parts that are unknown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if self.line > 0 {
            write!(f, ":{}", self.line)?;
            if self.column > 0 {
                write!(f, ":{}", self.column)?;
            }
        }
        write!(f, ": ")?;
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        write!(f, "{}", self.message)?;
        if !self.fix.is_empty() {
            write!(f, " — fix: {}", self.fix)?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostic {}

/// All diagnostics, one per line, each line ending in `\n`.
pub fn render(diagnostics: &[Diagnostic]) -> String {
    let mut out = String::new();
    for diagnostic in diagnostics {
        out.push_str(&diagnostic.to_string());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_file_line_field_and_fix() {
        let d = Diagnostic {
            file: "examples/policy.yaml".to_string(),
            line: 12,
            column: 5,
            field: "projects[1].quotas[0].guaranteed".to_string(),
            message: "must be ≥ 0, got -4".to_string(),
            fix: "set a non-negative number of GPUs (e.g. 4 or 0.5)".to_string(),
        };
        assert_eq!(
            d.to_string(),
            "examples/policy.yaml:12:5: projects[1].quotas[0].guaranteed: must be ≥ 0, got -4 \
             — fix: set a non-negative number of GPUs (e.g. 4 or 0.5)"
        );
    }

    #[test]
    fn display_leaves_out_unknown_parts() {
        let d = Diagnostic {
            file: "x.yaml".to_string(),
            line: 0,
            column: 0,
            field: String::new(),
            message: "cannot read the file".to_string(),
            fix: String::new(),
        };
        assert_eq!(d.to_string(), "x.yaml: cannot read the file");
    }
}
