//! A small parser for the Prometheus text exposition format (0.0.4), the subset exporters emit:
//! `# HELP`/`# TYPE`/other comments, blank lines, and `name{label="value",…} value [timestamp]`.
//! OpenMetrics' `# EOF` is a comment here. Names and unescaped label values borrow the input.
//!
//! Why not a crate: `prometheus-client` only encodes; `prometheus-parse` 0.2.5 pulls regex,
//! chrono, itertools and once_cell, reports errors without a line number and is not actively
//! maintained. Exporters' output is one line per series, so about 200 lines here parse it with
//! line and field in every error, borrow instead of allocating, and are fuzzed in
//! `tests/fuzz.rs`.

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
    for_each_series(text, |series| {
        out.push(Series { labels: series.labels.clone(), ..*series });
        Ok(())
    })?;
    Ok(out)
}

/// Calls `f` with every sample line of `text`, in order, reusing one label buffer: the large
/// scrapes are grouped as they are read, without a vector of all their series. The first error,
/// from the text or from `f`, stops the walk.
pub fn for_each_series<'a>(
    text: &'a str,
    mut f: impl FnMut(&Series<'a>) -> Result<(), ParseError>,
) -> Result<(), ParseError> {
    let mut series = Series {
        name: "",
        labels: Vec::with_capacity(32),
        value: 0.0,
        timestamp_ms: None,
        line: 0,
    };
    for (index, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        parse_line(line, index + 1, &mut series)?;
        f(&series)?;
    }
    Ok(())
}

/// Byte classes for the name scans: a table lookup per byte instead of three comparisons.
const NAME: u8 = 1;
const NAME_CHAR: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        if c.is_ascii_alphanumeric() || c == b'_' || c == b':' {
            table[b] = NAME;
        }
        b += 1;
    }
    table
};

fn error(line: usize, field: &str, message: impl Into<String>) -> ParseError {
    ParseError { line, field: field.to_string(), message: message.into() }
}

fn parse_line<'a>(line: &'a str, line_no: usize, out: &mut Series<'a>) -> Result<(), ParseError> {
    let bytes = line.as_bytes();
    let name_end =
        bytes.iter().position(|&b| NAME_CHAR[usize::from(b)] != NAME).unwrap_or(bytes.len());
    let name = &line[..name_end];
    let name_ok = name_end > 0
        && !bytes[0].is_ascii_digit()
        && matches!(bytes.get(name_end), None | Some(b'{' | b' ' | b'\t'));
    if !name_ok {
        let shown = line.split(|c: char| c == '{' || c.is_ascii_whitespace()).next().unwrap_or("");
        return Err(error(
            line_no,
            "metric name",
            format!("{shown:?} is not a metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)"),
        ));
    }
    out.labels.clear();
    let mut rest = &line[name_end..];
    if bytes.get(name_end) == Some(&b'{') {
        let after = parse_labels(line, name_end + 1, name, line_no, &mut out.labels)?;
        rest = &line[after..];
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
    out.name = name;
    out.value = value;
    out.timestamp_ms = timestamp_ms;
    out.line = line_no;
    Ok(())
}

/// Parses `label="value",…}` from byte `i` of `line` and returns the index after the `}`.
fn parse_labels<'a>(
    line: &'a str,
    mut i: usize,
    metric: &str,
    line_no: usize,
    labels: &mut Vec<(&'a str, Cow<'a, str>)>,
) -> Result<usize, ParseError> {
    let b = line.as_bytes();
    let skip_space = |mut i: usize| {
        while b.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        i
    };
    loop {
        i = skip_space(i);
        match b.get(i) {
            None => return Err(error(line_no, metric, "the label set has no closing '}'")),
            Some(b'}') => return Ok(i + 1),
            Some(_) => {}
        }
        let key_start = i;
        while b.get(i).is_some_and(|&c| NAME_CHAR[usize::from(c)] == NAME && c != b':') {
            i += 1;
        }
        let key = &line[key_start..i];
        i = skip_space(i);
        if key.is_empty() || key.as_bytes()[0].is_ascii_digit() || b.get(i) != Some(&b'=') {
            let shown = line[key_start..].split(['=', ',', '}']).next().unwrap_or("").trim();
            return Err(error(
                line_no,
                metric,
                format!("{shown:?} is not a label name followed by '=' ([a-zA-Z_][a-zA-Z0-9_]*)"),
            ));
        }
        i = skip_space(i + 1);
        if b.get(i) != Some(&b'"') {
            return Err(error(line_no, key, "the label value does not start with '\"'"));
        }
        let (value, after) = parse_quoted(&line[i + 1..])
            .ok_or_else(|| error(line_no, key, "the label value has no closing '\"'"))?;
        labels.push((key, value));
        i = skip_space(line.len() - after.len());
        match b.get(i) {
            Some(b',') => i += 1,
            Some(b'}') => {}
            _ => return Err(error(line_no, key, "expected ',' or '}' after the label value")),
        }
    }
}

/// A quoted label value (after the opening quote): the value and what follows the closing quote.
/// Without escapes it borrows; '"' and '\\' are ASCII, so scanning bytes is UTF-8 safe.
fn parse_quoted(body: &str) -> Option<(Cow<'_, str>, &str)> {
    let bytes = body.as_bytes();
    let special = find_quote_or_backslash(bytes)?;
    if bytes[special] == b'"' {
        return Some((Cow::Borrowed(&body[..special]), &body[special + 1..]));
    }
    let mut value = String::new();
    let mut start = 0;
    let mut i = special;
    while i < bytes.len() {
        match bytes[i] {
            b'"' if start == 0 => return Some((Cow::Borrowed(&body[..i]), &body[i + 1..])),
            b'"' => {
                value.push_str(&body[start..i]);
                return Some((Cow::Owned(value), &body[i + 1..]));
            }
            b'\\' => {
                value.push_str(&body[start..i]);
                let next = body.get(i + 1..)?.chars().next()?;
                match next {
                    'n' => value.push('\n'),
                    '\\' => value.push('\\'),
                    '"' => value.push('"'),
                    // Unknown escapes are kept as written (Prometheus does the same).
                    other => {
                        value.push('\\');
                        value.push(other);
                    }
                }
                i += 1 + next.len_utf8();
                start = i;
            }
            _ => i += 1,
        }
    }
    None
}

/// The first '"' or '\\' in `bytes`, eight bytes at a time (label values are most of a
/// scrape's bytes; a byte loop was a fifth of the parse).
fn find_quote_or_backslash(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // Bit 7 of each byte of the result is set where `word` has byte `b` (exact for the first
    // such byte, which is all that is used).
    let has = |word: u64, b: u8| {
        let x = word ^ (ONES * u64::from(b));
        x.wrapping_sub(ONES) & !x & HIGHS
    };
    let mut chunks = bytes.chunks_exact(8);
    let mut offset = 0;
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let word = u64::from_le_bytes(word);
        let found = has(word, b'"') | has(word, b'\\');
        if found != 0 {
            return Some(offset + (found.trailing_zeros() / 8) as usize);
        }
        offset += 8;
    }
    chunks.remainder().iter().position(|&b| b == b'"' || b == b'\\').map(|p| offset + p)
}

fn parse_value(text: &str) -> Option<f64> {
    match text {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => text.parse::<f64>().ok().filter(|_| !text.eq_ignore_ascii_case("inf")),
    }
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
    fn finds_the_first_quote_or_backslash_at_any_offset() {
        for len in 0..40 {
            for at in 0..len {
                for special in [b'"', b'\\'] {
                    let mut bytes = vec![b'a'; len];
                    bytes[at] = special;
                    if at + 1 < len {
                        bytes[at + 1] = b'"';
                    }
                    assert_eq!(find_quote_or_backslash(&bytes), Some(at), "{len} {at}");
                }
            }
            assert_eq!(find_quote_or_backslash(&vec![0xffu8; len]), None);
        }
        // Bytes just above and below the needles, and a zero byte, are not matches.
        assert_eq!(find_quote_or_backslash(b"\x00!#[]\x01\x7f\xff\"x"), Some(8));
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
        assert_eq!(parse("{a=\"1\"} 1").expect_err("no name").field, "metric name");
        assert_eq!(parse("m-x 1").expect_err("bad name").field, "metric name");
    }
}
