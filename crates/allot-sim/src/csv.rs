//! A small CSV reader for trace files: a header line names the columns, one record per line,
//! RFC 4180 quotes within a line. Every value it hands out knows its file and line, so a
//! loader's error can name both.

use std::path::{Path, PathBuf};

use crate::error::TraceError;

/// A whole CSV file in memory, split into header and records.
#[derive(Debug)]
pub struct CsvFile {
    path: PathBuf,
    header: Vec<String>,
    /// (1-based line number, fields)
    records: Vec<(usize, Vec<String>)>,
}

impl CsvFile {
    /// Read a whole file (size-capped, UTF-8 checked by [`crate::trace::read_text`]).
    pub fn read(path: &Path) -> Result<CsvFile, TraceError> {
        CsvFile::parse(path, &crate::trace::read_text(path)?)
    }

    pub fn parse(path: &Path, text: &str) -> Result<CsvFile, TraceError> {
        let mut lines = numbered_lines(text);
        let Some((_, header_line)) = lines.next() else {
            return Err(TraceError::new(
                path,
                0,
                "",
                "empty file".into(),
                "expected a header line",
            ));
        };
        let header = split(header_line.trim_start_matches('\u{feff}'))
            .into_iter()
            .map(|h| h.trim().to_owned())
            .collect();
        let records = lines.map(|(i, l)| (i, split(l))).collect();
        Ok(CsvFile { path: path.to_path_buf(), header, records })
    }

    /// The index of the first of `names` present in the header.
    pub fn column(&self, names: &[&str]) -> Result<usize, TraceError> {
        self.optional_column(names).ok_or_else(|| {
            TraceError::new(
                &self.path,
                1,
                names.first().copied().unwrap_or(""),
                format!("missing column (header has: {})", self.header.join(",")),
                "add the column to the header line",
            )
        })
    }

    pub fn optional_column(&self, names: &[&str]) -> Option<usize> {
        names.iter().find_map(|n| self.header.iter().position(|h| h.eq_ignore_ascii_case(n)))
    }

    pub fn rows(&self) -> impl Iterator<Item = Row<'_>> {
        self.records.iter().map(|(line, fields)| Row { path: &self.path, line: *line, fields })
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

/// One record with its file and line.
#[derive(Clone, Copy, Debug)]
pub struct Row<'a> {
    path: &'a Path,
    pub line: usize,
    fields: &'a [String],
}

impl Row<'_> {
    /// The raw value of a column; empty when the record is short.
    pub fn get(&self, column: usize) -> &str {
        self.fields.get(column).map_or("", String::as_str)
    }

    /// A non-empty value.
    pub fn text(&self, column: usize, field: &str) -> Result<&str, TraceError> {
        let value = self.get(column).trim();
        if value.is_empty() {
            Err(self.error(field, "empty".into(), "give a value"))
        } else {
            Ok(value)
        }
    }

    /// A number; floats with an integral value (`12.0`) are accepted for integer fields.
    pub fn number<T: std::str::FromStr>(
        &self,
        column: usize,
        field: &str,
    ) -> Result<T, TraceError> {
        let value = self.text(column, field)?;
        if let Ok(v) = value.parse::<T>() {
            return Ok(v);
        }
        if let Some(integral) = value.strip_suffix(".0").and_then(|v| v.parse::<T>().ok()) {
            return Ok(integral);
        }
        Err(self.error(
            field,
            format!("'{value}' is not a valid number"),
            "write a non-negative number",
        ))
    }

    pub fn error(&self, field: &str, message: String, fix: &str) -> TraceError {
        TraceError::new(self.path, self.line, field, message, fix)
    }
}

/// Non-blank lines with their 1-based numbers; a trailing `\r` is dropped. Every trace reader
/// goes through this, so line numbers in errors mean the same everywhere.
pub fn numbered_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.strip_suffix('\r').unwrap_or(l)))
        .filter(|(_, l)| !l.trim().is_empty())
}

fn split(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', true) => quoted = false,
            ('"', false) if field.is_empty() => quoted = true,
            (',', false) => fields.push(std::mem::take(&mut field)),
            _ => field.push(c),
        }
    }
    fields.push(field);
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_and_empty_fields() {
        assert_eq!(split(r#"a,"b,c",,"d""e""#), vec!["a", "b,c", "", "d\"e"]);
        let lines: Vec<(usize, &str)> = numbered_lines("h\r\n\n  \nx,y\r\n").collect();
        assert_eq!(lines, vec![(1, "h"), (4, "x,y")]);
    }

    #[test]
    fn integral_floats_parse_as_integers() {
        let file = CsvFile::parse(Path::new("t.csv"), "a,b\n12.0,x\n").ok();
        let file = file.as_ref();
        let row = file.and_then(|f| f.rows().next());
        assert_eq!(row.and_then(|r| r.number::<u64>(0, "a").ok()), Some(12));
        let err = row.map(|r| r.number::<u64>(1, "b").is_err());
        assert_eq!(err, Some(true));
    }
}
