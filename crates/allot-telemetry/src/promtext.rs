//! A small parser for the Prometheus text exposition format (0.0.4), the subset exporters emit:
//! `# HELP`/`# TYPE`/other comments, blank lines, and `name{label="value",…} value [timestamp]`.
//! OpenMetrics' `# EOF` is a comment here. Names and unescaped label values borrow the input.
//!
//! Why not a crate: `prometheus-client` only encodes; `prometheus-parse` 0.2.5 pulls regex,
//! chrono, itertools and once_cell, reports errors without a line number and is not actively
//! maintained. Exporters' output is one line per series, so ~150 lines here parse it with line and
//! field in every error, borrow instead of allocating, and are fuzzed in `tests/fuzz.rs`.

use std::borrow::Cow;

use crate::ParseError;

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Series<'a> {
    pub name: &'a str,
    pub labels: Vec<(&'a str, Cow<'a, str>)>,
    pub value: f64,
    /// Milliseconds since the epoch, when the line carries a timestamp.
    pub timestamp_ms: Option<i64>,
    /// 1-based line number in the input (0 for series that did not come from text).
    pub line: usize,
}

impl Series<'_> {
    /// The value of label `name`, if present.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_ref())
    }

    /// The value of the first of `names` that is present and not empty.
    pub fn label_any(&self, names: &[&str]) -> Option<&str> {
        names.iter().find_map(|n| self.label(n).filter(|v| !v.is_empty()))
    }
}

/// Parses every sample line of `text`. Comments and blank lines are skipped.
pub fn parse(text: &str) -> Result<Vec<Series<'_>>, ParseError> {
    let mut out = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line_no = index + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push(parse_line(line, line_no)?);
    }
    Ok(out)
}

fn error(line: usize, field: &str, message: impl Into<String>) -> ParseError {
    ParseError { line, field: field.to_string(), message: message.into() }
}

fn parse_line(line: &str, line_no: usize) -> Result<Series<'_>, ParseError> {
    let name_end = line.find(|c: char| c == '{' || c.is_ascii_whitespace()).unwrap_or(line.len());
    let name = &line[..name_end];
    if !valid_metric_name(name) {
        return Err(error(
            line_no,
            "metric name",
            format!("{name:?} is not a metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)"),
        ));
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = parse_labels(after, name, line_no, &mut labels)?;
    }
    let mut fields = rest.split_ascii_whitespace();
    let value_text = fields
        .next()
        .ok_or_else(|| error(line_no, name, "the sample has no value after the name/labels"))?;
    let value = parse_value(value_text).ok_or_else(|| {
        error(line_no, name, format!("value {value_text:?} is not a number (or NaN, +Inf, -Inf)"))
    })?;
    let timestamp_ms = match fields.next() {
        None => None,
        Some(t) => Some(t.parse::<i64>().map_err(|_| {
            error(line_no, name, format!("timestamp {t:?} is not integer milliseconds"))
        })?),
    };
    if let Some(extra) = fields.next() {
        return Err(error(line_no, name, format!("unexpected {extra:?} after the timestamp")));
    }
    Ok(Series { name, labels, value, timestamp_ms, line: line_no })
}

/// Parses `label="value",…}` and returns what follows the closing brace.
fn parse_labels<'a>(
    mut rest: &'a str,
    metric: &str,
    line_no: usize,
    labels: &mut Vec<(&'a str, Cow<'a, str>)>,
) -> Result<&'a str, ParseError> {
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix('}') {
            return Ok(after);
        }
        let eq = rest
            .find('=')
            .ok_or_else(|| error(line_no, metric, "a label has no '=' (or the '}' is missing)"))?;
        let key = rest[..eq].trim();
        if !valid_label_name(key) {
            return Err(error(
                line_no,
                metric,
                format!("{key:?} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)"),
            ));
        }
        rest = rest[eq + 1..].trim_start();
        let Some(body) = rest.strip_prefix('"') else {
            return Err(error(line_no, key, "the label value does not start with '\"'"));
        };
        let (value, after) = parse_quoted(body)
            .ok_or_else(|| error(line_no, key, "the label value has no closing '\"'"))?;
        labels.push((key, value));
        rest = after.trim_start();
        if let Some(after) = rest.strip_prefix(',') {
            rest = after;
        } else if !rest.starts_with('}') {
            return Err(error(line_no, key, "expected ',' or '}' after the label value"));
        }
    }
}

/// A quoted label value (after the opening quote): the value and what follows the closing quote.
fn parse_quoted(body: &str) -> Option<(Cow<'_, str>, &str)> {
    let bytes = body.as_bytes();
    let mut i = 0;
    let mut owned: Option<String> = None;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                let value = match owned {
                    Some(s) => Cow::Owned(s),
                    None => Cow::Borrowed(&body[..i]),
                };
                return Some((value, &body[i + 1..]));
            }
            b'\\' => {
                let s = owned.get_or_insert_with(|| body[..i].to_string());
                match bytes.get(i + 1)? {
                    b'n' => s.push('\n'),
                    b'\\' => s.push('\\'),
                    b'"' => s.push('"'),
                    // Unknown escapes are kept as written (Prometheus does the same).
                    _ => {
                        let next = body[i + 1..].chars().next()?;
                        s.push('\\');
                        s.push(next);
                        i += next.len_utf8() + 1;
                        continue;
                    }
                }
                i += 2;
            }
            _ => {
                let c = body[i..].chars().next()?;
                if let Some(s) = owned.as_mut() {
                    s.push(c);
                }
                i += c.len_utf8();
            }
        }
    }
    None
}

fn parse_value(text: &str) -> Option<f64> {
    match text {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => text.parse::<f64>().ok().filter(|_| !text.eq_ignore_ascii_case("inf")),
    }
}

fn valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_labels_with_spaces_escapes_and_timestamps() {
        let text = "# HELP x y\n\nm{a=\"1\", b=\"q\\\"t\\\\n\\n\"} 2.5 1700000000000\nn 3\n";
        let series = parse(text).expect("valid text");
        assert_eq!(series.len(), 2);
        assert_eq!(series[0].name, "m");
        assert_eq!(series[0].label("a"), Some("1"));
        assert_eq!(series[0].label("b"), Some("q\"t\\n\n"));
        assert_eq!(series[0].value, 2.5);
        assert_eq!(series[0].timestamp_ms, Some(1_700_000_000_000));
        assert_eq!(series[0].line, 3);
        assert_eq!(series[1].labels, Vec::new());
        assert_eq!(series[1].value, 3.0);
    }

    #[test]
    fn special_values_and_trailing_comma() {
        let series = parse("a{x=\"1\",} NaN\nb +Inf\nc -Inf\n").expect("valid text");
        assert!(series[0].value.is_nan());
        assert_eq!(series[1].value, f64::INFINITY);
        assert_eq!(series[2].value, f64::NEG_INFINITY);
    }

    #[test]
    fn errors_name_the_line_and_field() {
        let e = parse("ok 1\nbad{gpu=\"0\" 1\n").expect_err("unclosed labels");
        assert_eq!(e.line, 2);
        assert_eq!(e.field, "gpu");
        let e = parse("m{a=\"1\"} zero\n").expect_err("bad value");
        assert_eq!((e.line, e.field.as_str()), (1, "m"));
        assert!(e.message.contains("\"zero\""), "{e}");
        let e = parse("9m 1\n").expect_err("bad name");
        assert_eq!(e.field, "metric name");
        assert!(parse("m{a=1} 1").is_err());
        assert!(parse("m 1 2 3").is_err());
        assert!(parse("m").is_err());
    }
}
