//! Errors from reading trace files: always the file, the line, the field and the fix.

use std::fmt;
use std::path::{Path, PathBuf};

/// One problem in one input file. `line` is 1-based; 0 means the file as a whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceError {
    pub file: PathBuf,
    pub line: usize,
    pub field: String,
    pub message: String,
    pub fix: String,
}

impl TraceError {
    pub fn new(file: &Path, line: usize, field: &str, message: String, fix: &str) -> TraceError {
        TraceError {
            file: file.to_path_buf(),
            line,
            field: field.to_owned(),
            message,
            fix: fix.to_owned(),
        }
    }

    /// The file could not be read at all.
    pub fn io(file: &Path, err: &std::io::Error) -> TraceError {
        TraceError::new(
            file,
            0,
            "",
            format!("cannot read: {err}"),
            "check the path and permissions",
        )
    }
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}", self.line)?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)?;
        if !self.fix.is_empty() {
            write!(f, " — {}", self.fix)?;
        }
        Ok(())
    }
}

impl std::error::Error for TraceError {}

/// What a loader does with a malformed row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BadRows {
    /// Stop at the first malformed row with its file and line (the default).
    #[default]
    Fail,
    /// Skip malformed rows and count them (`--skip-bad-rows`).
    Skip,
}

/// Rows a loader skipped under [`BadRows::Skip`]: how many, and the first few errors.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    pub count: usize,
    pub first: Vec<TraceError>,
}

impl Skipped {
    /// Record a bad row under `mode`: `Err` in `Fail` mode, counted in `Skip` mode.
    pub fn record(&mut self, mode: BadRows, err: TraceError) -> Result<(), TraceError> {
        match mode {
            BadRows::Fail => Err(err),
            BadRows::Skip => {
                self.count += 1;
                if self.first.len() < 5 {
                    self.first.push(err);
                }
                Ok(())
            }
        }
    }
}
