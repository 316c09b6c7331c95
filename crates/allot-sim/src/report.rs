//! Several policies' replay results side by side: an aligned terminal table, JSON and CSV; plus
//! the generic [`table`] and [`csv_line`] the packing experiment uses too.
//!
//! Every renderer is a pure function of its input: same reports, same bytes (house rule 2).
//! Numbers that are not finite never panic: the table shows `n/a` (NaN) or `inf`, JSON writes
//! `null` (as serde_json does for every non-finite float) and CSV leaves the cell empty.
//!
//! The scalar figures are taken from [`ReplayReport`]'s own `Serialize` output, in a fixed order
//! (the struct's, below) followed by any figures added to the struct later, by name. So a new
//! scalar field appears in JSON and CSV without touching this file; the terminal table shows it
//! under "other figures" with generic formatting until it gets a row of its own here.

use std::collections::BTreeMap;

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};

use crate::outcome::{ProjectLedger, ReplayReport, TimelinePoint};

/// At most this many timeline points per policy in JSON; longer timelines are down-sampled
/// evenly (first and last point kept).
pub const JSON_TIMELINE_POINTS_MAX: usize = 1000;
/// Up to this many queue delays per policy are written raw in JSON; above it, the CDF is
/// written as [`QUEUE_DELAY_PERCENTILES`] percentiles instead.
pub const JSON_QUEUE_DELAYS_RAW_MAX: usize = 1000;
/// Percentiles 0, 1, …, 100 of the queue delays.
pub const QUEUE_DELAY_PERCENTILES: usize = 101;
/// At most this many projects in the terminal's ledger table (the most allocated first);
/// JSON always has them all.
pub const TEXT_LEDGER_PROJECTS_MAX: usize = 100;

/// The scalar figures in the order they are shown: `ReplayReport`'s field order.
const REPORT_SCALARS: [&str; 31] = [
    "policy",
    "seed",
    "jobs_total",
    "jobs_finished",
    "jobs_pending",
    "jobs_cancelled",
    "jct_s_mean",
    "queue_delay_s_p50",
    "queue_delay_s_p95",
    "queue_delay_s_p99",
    "big_jobs",
    "big_queue_delay_s_mean",
    "big_queue_delay_s_p50",
    "big_queue_delay_s_p95",
    "big_queue_delay_s_max",
    "gpu_allocated_pct",
    "gpu_active_pct",
    "preemptions",
    "jobs_preempted",
    "preemptions_per_job_max",
    "lost_gpu_hours",
    "goodput",
    "wall_ms",
    "capacity_gpus",
    "span_s",
    "allocated_gpu_hours",
    "active_gpu_hours",
    "useful_gpu_hours",
    "idle_gpu_hours",
    "decide_calls",
    "bad_rows_skipped",
];
/// Fields of `ReplayReport` that are series or tables, rendered on their own.
const REPORT_SERIES: [&str; 3] = ["timeline", "queue_delays_s", "projects"];
const LEDGER_KEYS: [&str; 6] = [
    "project",
    "allocated_gpu_hours",
    "active_gpu_hours",
    "useful_gpu_hours",
    "lost_gpu_hours",
    "jobs_finished",
];
const POINT_KEYS: [&str; 4] = ["t_s", "allocated_gpus", "active_gpus", "pending_jobs"];

// ---------------------------------------------------------------------------------------------
// Terminal table

/// How one known figure is shown in the terminal table.
#[derive(Clone, Copy)]
enum Shown {
    Count,
    Seconds,
    Percent,
    GpuHours,
    /// A ratio in [0, 1] shown as a percentage.
    RatioAsPercent,
    Millis,
}

/// The rows of the figure table: the JSON name (so a reader can find it in `--output json`),
/// the unit shown, and how the value is rounded.
const TEXT_FIGURES: [(&str, &str, Shown); 30] = [
    ("jobs_total", "jobs", Shown::Count),
    ("jobs_finished", "jobs", Shown::Count),
    ("jobs_pending", "jobs", Shown::Count),
    ("jobs_cancelled", "jobs", Shown::Count),
    ("jct_s_mean", "s", Shown::Seconds),
    ("queue_delay_s_p50", "s", Shown::Seconds),
    ("queue_delay_s_p95", "s", Shown::Seconds),
    ("queue_delay_s_p99", "s", Shown::Seconds),
    ("big_jobs", "jobs", Shown::Count),
    ("big_queue_delay_s_mean", "s", Shown::Seconds),
    ("big_queue_delay_s_p50", "s", Shown::Seconds),
    ("big_queue_delay_s_p95", "s", Shown::Seconds),
    ("big_queue_delay_s_max", "s", Shown::Seconds),
    ("gpu_allocated_pct", "%", Shown::Percent),
    ("gpu_active_pct", "%", Shown::Percent),
    ("preemptions", "", Shown::Count),
    ("jobs_preempted", "jobs", Shown::Count),
    ("preemptions_per_job_max", "", Shown::Count),
    ("lost_gpu_hours", "GPU-h", Shown::GpuHours),
    ("goodput", "%", Shown::RatioAsPercent),
    ("wall_ms", "ms", Shown::Millis),
    ("seed", "", Shown::Count),
    ("capacity_gpus", "GPUs", Shown::Count),
    ("span_s", "s", Shown::Seconds),
    ("allocated_gpu_hours", "GPU-h", Shown::GpuHours),
    ("active_gpu_hours", "GPU-h", Shown::GpuHours),
    ("useful_gpu_hours", "GPU-h", Shown::GpuHours),
    ("idle_gpu_hours", "GPU-h", Shown::GpuHours),
    ("decide_calls", "", Shown::Count),
    ("bad_rows_skipped", "rows", Shown::Count),
];

fn figure_value(report: &ReplayReport, name: &str) -> f64 {
    match name {
        "jobs_total" => report.jobs_total as f64,
        "jobs_finished" => report.jobs_finished as f64,
        "jobs_pending" => report.jobs_pending as f64,
        "jobs_cancelled" => report.jobs_cancelled as f64,
        "jct_s_mean" => report.jct_s_mean,
        "queue_delay_s_p50" => report.queue_delay_s_p50,
        "queue_delay_s_p95" => report.queue_delay_s_p95,
        "queue_delay_s_p99" => report.queue_delay_s_p99,
        "big_jobs" => report.big_jobs as f64,
        "big_queue_delay_s_mean" => report.big_queue_delay_s_mean,
        "big_queue_delay_s_p50" => report.big_queue_delay_s_p50,
        "big_queue_delay_s_p95" => report.big_queue_delay_s_p95,
        "big_queue_delay_s_max" => report.big_queue_delay_s_max,
        "gpu_allocated_pct" => report.gpu_allocated_pct,
        "gpu_active_pct" => report.gpu_active_pct,
        "preemptions" => report.preemptions as f64,
        "jobs_preempted" => report.jobs_preempted as f64,
        "preemptions_per_job_max" => f64::from(report.preemptions_per_job_max),
        "lost_gpu_hours" => report.lost_gpu_hours,
        "goodput" => report.goodput,
        "wall_ms" => report.wall_ms as f64,
        "seed" => report.seed as f64,
        "capacity_gpus" => report.capacity_gpus,
        "span_s" => report.span_s,
        "allocated_gpu_hours" => report.allocated_gpu_hours,
        "active_gpu_hours" => report.active_gpu_hours,
        "useful_gpu_hours" => report.useful_gpu_hours,
        "idle_gpu_hours" => report.idle_gpu_hours,
        "decide_calls" => report.decide_calls as f64,
        "bad_rows_skipped" => report.bad_rows_skipped as f64,
        _ => f64::NAN,
    }
}

fn show(report: &ReplayReport, name: &str, shown: Shown) -> String {
    match (name, shown) {
        // Integers are formatted from the integer, not through f64 (seeds use all 64 bits).
        ("seed", _) => report.seed.to_string(),
        ("jobs_total", _) => group_digits(&report.jobs_total.to_string()),
        ("jobs_finished", _) => group_digits(&report.jobs_finished.to_string()),
        ("jobs_pending", _) => group_digits(&report.jobs_pending.to_string()),
        ("jobs_cancelled", _) => group_digits(&report.jobs_cancelled.to_string()),
        ("big_jobs", _) => group_digits(&report.big_jobs.to_string()),
        ("preemptions", _) => group_digits(&report.preemptions.to_string()),
        ("jobs_preempted", _) => group_digits(&report.jobs_preempted.to_string()),
        ("wall_ms", _) => group_digits(&report.wall_ms.to_string()),
        ("decide_calls", _) => group_digits(&report.decide_calls.to_string()),
        ("bad_rows_skipped", _) => group_digits(&report.bad_rows_skipped.to_string()),
        (_, Shown::RatioAsPercent) => fixed(figure_value(report, name) * 100.0, 1),
        (_, Shown::Seconds | Shown::Percent | Shown::GpuHours) => {
            fixed(figure_value(report, name), 1)
        }
        (_, Shown::Count | Shown::Millis) => fixed(figure_value(report, name), 0),
    }
}

/// The policies side by side as aligned text: one column per policy, one row per figure (its
/// JSON name and unit), then the per-project ledger (most allocated project first, at most
/// [`TEXT_LEDGER_PROJECTS_MAX`] projects). Seconds, percentages and GPU-hours are rounded to
/// one decimal, counts get thousands separators, `goodput` is shown as a percentage.
/// Ends with a newline.
pub fn replay_text(reports: &[ReplayReport]) -> String {
    if reports.is_empty() {
        return "no policies were replayed\n".to_owned();
    }
    let mut headers = vec!["figure", "unit"];
    headers.extend(reports.iter().map(|r| r.policy.as_str()));
    let mut rows: Vec<Vec<String>> = Vec::new();
    for (name, unit, shown) in TEXT_FIGURES {
        let mut row = vec![name.to_owned(), unit.to_owned()];
        row.extend(reports.iter().map(|r| show(r, name, shown)));
        rows.push(row);
    }
    // Figures added to ReplayReport after this file was written: generic formatting.
    let scalars: Vec<Vec<(String, Value)>> = reports.iter().map(scalar_fields).collect();
    let mut extra_names: Vec<String> = Vec::new();
    for fields in &scalars {
        for (key, _) in fields {
            if !REPORT_SCALARS.contains(&key.as_str()) && !extra_names.contains(key) {
                extra_names.push(key.clone());
            }
        }
    }
    extra_names.sort();
    let mut out = table(&headers, &rows);
    if !extra_names.is_empty() {
        let extra_rows: Vec<Vec<String>> = extra_names
            .iter()
            .map(|name| {
                let mut row = vec![name.clone(), String::new()];
                row.extend(scalars.iter().map(|fields| {
                    fields
                        .iter()
                        .find(|(k, _)| k == name)
                        .map_or_else(|| "n/a".to_owned(), |(_, v)| show_value(v))
                }));
                row
            })
            .collect();
        out.push_str("\nother figures\n");
        out.push_str(&table(&headers, &extra_rows));
    }
    out.push('\n');
    out.push_str(&ledger_text(reports));
    for r in reports {
        if let Some(h) = &r.rehearsal {
            out.push_str(&rehearsal_text(&r.policy, h));
        }
    }
    out
}

/// A rehearsed rollout: when it started, whether it rolled back and why, each condition.
fn rehearsal_text(policy: &str, h: &crate::outcome::RehearsalReport) -> String {
    let mut out =
        format!("\nrehearsed rollout ({policy}): {} from t={:.0}s\n", h.scope, h.started_s);
    match (&h.rolled_back_s, &h.why) {
        (Some(at), Some(why)) => {
            out.push_str(&format!("rolled back at t={at:.0}s: {why}\n"));
        }
        _ => out.push_str("not rolled back: no condition tripped\n"),
    }
    let figure = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
    let rows: Vec<Vec<String>> = h
        .conditions
        .iter()
        .map(|c| {
            vec![
                c.condition.clone(),
                format!("{} ({})", figure(c.baseline), c.baseline_samples),
                format!("{} ({})", figure(c.current), c.samples),
                c.state.clone(),
            ]
        })
        .collect();
    if !rows.is_empty() {
        out.push_str(&table(&["condition", "baseline (n)", "since (n)", "state"], &rows));
    }
    out
}

fn ledger_text(reports: &[ReplayReport]) -> String {
    // Projects across all policies, most allocated (summed over policies) first, then by name.
    let mut totals: BTreeMap<&str, f64> = BTreeMap::new();
    for report in reports {
        for ledger in &report.projects {
            let hours = finite_or_zero(ledger.allocated_gpu_hours);
            *totals.entry(ledger.project.as_str()).or_insert(0.0) += hours;
        }
    }
    if totals.is_empty() {
        return "per project: no projects\n".to_owned();
    }
    let mut projects: Vec<(&str, f64)> = totals.into_iter().collect();
    projects.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    let hidden = projects.len().saturating_sub(TEXT_LEDGER_PROJECTS_MAX);
    projects.truncate(TEXT_LEDGER_PROJECTS_MAX);

    let headers = [
        "project",
        "policy",
        "allocated GPU-h",
        "active GPU-h",
        "useful GPU-h",
        "lost GPU-h",
        "jobs finished",
        "useful/allocated %",
    ];
    let mut rows = Vec::new();
    for (project, _) in &projects {
        for report in reports {
            for ledger in report.projects.iter().filter(|l| l.project == *project) {
                rows.push(ledger_row(&report.policy, ledger));
            }
        }
    }
    let mut out = String::from("per project\n");
    out.push_str(&table(&headers, &rows));
    if hidden > 0 {
        out.push_str(&format!("… and {hidden} more projects (all are in --output json)\n"));
    }
    out
}

fn ledger_row(policy: &str, ledger: &ProjectLedger) -> Vec<String> {
    let useful_pct = if ledger.allocated_gpu_hours > 0.0 {
        fixed(ledger.useful_gpu_hours / ledger.allocated_gpu_hours * 100.0, 1)
    } else {
        "n/a".to_owned()
    };
    vec![
        ledger.project.clone(),
        policy.to_owned(),
        fixed(ledger.allocated_gpu_hours, 1),
        fixed(ledger.active_gpu_hours, 1),
        fixed(ledger.useful_gpu_hours, 1),
        fixed(ledger.lost_gpu_hours, 1),
        group_digits(&ledger.jobs_finished.to_string()),
        useful_pct,
    ]
}

/// A value of a figure this file does not know yet.
fn show_value(value: &Value) -> String {
    match value {
        Value::Null => "n/a".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) if n.is_f64() => fixed(n.as_f64().unwrap_or(f64::NAN), 3),
        Value::Number(n) => group_digits(&n.to_string()),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `x` rounded to `decimals` places with thousands separators; `n/a` for NaN, `inf`/`-inf`.
pub(crate) fn fixed(x: f64, decimals: usize) -> String {
    if x.is_nan() {
        return "n/a".to_owned();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    let text = format!("{x:.decimals$}");
    // "-0.0" after rounding reads as a sign error: show it as 0.
    let text = if text.starts_with('-') && text[1..].chars().all(|c| c == '0' || c == '.') {
        text[1..].to_owned()
    } else {
        text
    };
    group_digits(&text)
}

/// Thousands separators in the integer part of a plain decimal number (`-1234.5` → `-1,234.5`).
fn group_digits(number: &str) -> String {
    let (sign, rest) = match number.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", number),
    };
    let (int, frac) = match rest.find('.') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if !int.bytes().all(|b| b.is_ascii_digit()) {
        return number.to_owned();
    }
    let mut grouped = String::with_capacity(number.len() + int.len() / 3);
    grouped.push_str(sign);
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    grouped.push_str(frac);
    grouped
}

fn finite_or_zero(x: f64) -> f64 {
    if x.is_finite() { x } else { 0.0 }
}

/// An aligned text table: columns separated by two spaces, a column right-aligned when every
/// cell in it (ignoring empty cells and `n/a`, `-`, `—`) reads as a number — digits with an
/// optional sign, `,` separators, decimal point, exponent and trailing `%`, or `inf`/`NaN`.
/// Headers follow their column's alignment. Rows may be shorter or longer than `headers`;
/// missing cells are empty. Control characters in cells become spaces so that one cell is one
/// line. Width counts `char`s. No trailing spaces; every line ends with a newline; no headers
/// and no rows give an empty string.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).chain([headers.len()]).max().unwrap_or(0);
    if columns == 0 {
        return String::new();
    }
    let clean = |cell: &str| -> String {
        cell.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
    };
    let header: Vec<String> =
        (0..columns).map(|i| headers.get(i).map_or_else(String::new, |h| clean(h))).collect();
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            (0..columns).map(|i| row.get(i).map_or_else(String::new, |c| clean(c))).collect()
        })
        .collect();
    let mut widths = vec![0usize; columns];
    let mut numeric = vec![!body.is_empty(); columns];
    for row in std::iter::once(&header).chain(&body) {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    for row in &body {
        for (i, cell) in row.iter().enumerate() {
            if !is_placeholder(cell) && !looks_numeric(cell) {
                numeric[i] = false;
            }
        }
    }
    // A column of placeholders only is text.
    for (i, flag) in numeric.iter_mut().enumerate() {
        if body.iter().all(|row| is_placeholder(&row[i])) {
            *flag = false;
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&body) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = widths[i] - cell.chars().count();
            if numeric[i] {
                line.extend(std::iter::repeat_n(' ', pad));
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn is_placeholder(cell: &str) -> bool {
    matches!(cell.trim(), "" | "n/a" | "-" | "—")
}

fn looks_numeric(cell: &str) -> bool {
    let text = cell.trim();
    let text = text.strip_suffix('%').unwrap_or(text).trim_end();
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    if matches!(unsigned, "inf" | "NaN") {
        return true;
    }
    let starts_like_number = unsigned.starts_with(|c: char| c.is_ascii_digit())
        || (unsigned.starts_with('.') && unsigned[1..].starts_with(|c: char| c.is_ascii_digit()));
    starts_like_number && text.replace(',', "").parse::<f64>().is_ok()
}

/// One CSV record with RFC 4180 quoting: a field containing a comma, a double quote, CR or LF
/// is wrapped in double quotes and its double quotes are doubled; other fields are written as
/// they are. No line ending is added — join records with `\n` (or `\r\n`).
pub fn csv_line(fields: &[String]) -> String {
    let mut line = String::new();
    for (i, field) in fields.iter().enumerate() {
        if i > 0 {
            line.push(',');
        }
        if field.contains([',', '"', '\r', '\n']) {
            line.push('"');
            line.push_str(&field.replace('"', "\"\""));
            line.push('"');
        } else {
            line.push_str(field);
        }
    }
    line
}

// ---------------------------------------------------------------------------------------------
// JSON and CSV

/// A report's fields as JSON values, series left out (they are rendered separately), scalar
/// figures first in [`REPORT_SCALARS`] order, then any other field by name.
fn scalar_fields(report: &ReplayReport) -> Vec<(String, Value)> {
    // Serialize a copy without the series, so that a long timeline is not turned into JSON
    // values only to be thrown away (copying it is far cheaper).
    let mut shell = report.clone();
    shell.timeline = Vec::new();
    shell.queue_delays_s = Vec::new();
    shell.projects = Vec::new();
    // A rehearsal has a section of its own (and in the CSV, no column).
    shell.rehearsal = None;
    let Ok(Value::Object(map)) = serde_json::to_value(&shell) else {
        return Vec::new();
    };
    ordered(map, &REPORT_SCALARS)
        .into_iter()
        .filter(|(key, _)| !REPORT_SERIES.contains(&key.as_str()))
        .collect()
}

/// `map`'s entries: those named in `first`, in that order, then the rest by name.
fn ordered(mut map: Map<String, Value>, first: &[&str]) -> Vec<(String, Value)> {
    let mut out = Vec::with_capacity(map.len());
    for key in first {
        if let Some(value) = map.remove(*key) {
            out.push(((*key).to_owned(), value));
        }
    }
    let mut rest: Vec<(String, Value)> = map.into_iter().collect();
    rest.sort_by(|a, b| a.0.cmp(&b.0));
    out.extend(rest);
    out
}

/// A JSON value whose objects keep the order they were built in (serde_json's `Map` sorts keys
/// unless its `preserve_order` feature is on, and turning that on would change every other
/// crate's JSON).
enum Node {
    Value(Value),
    Object(Vec<(String, Node)>),
    Array(Vec<Node>),
}

impl Serialize for Node {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Node::Value(value) => value.serialize(serializer),
            Node::Array(items) => serializer.collect_seq(items),
            Node::Object(entries) => {
                let mut map = serializer.serialize_map(Some(entries.len()))?;
                for (key, value) in entries {
                    map.serialize_entry(key, value)?;
                }
                map.end()
            }
        }
    }
}

fn object<T: Serialize>(item: &T, first: &[&str]) -> Node {
    match serde_json::to_value(item) {
        Ok(Value::Object(map)) => Node::Object(
            ordered(map, first).into_iter().map(|(k, v)| (k, Node::Value(v))).collect(),
        ),
        Ok(other) => Node::Value(other),
        Err(_) => Node::Value(Value::Null),
    }
}

fn number(x: f64) -> Value {
    serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
}

/// Indices of at most `max` items out of `len`, evenly spaced, first and last included.
pub(crate) fn even_indices(len: usize, max: usize) -> Vec<usize> {
    if len <= max {
        return (0..len).collect();
    }
    if max <= 1 {
        return vec![0; max.min(len)];
    }
    let (len, max) = (len as u128, max as u128);
    // Rounded k·(len−1)/(max−1): strictly increasing because len > max.
    (0..max).map(|k| ((k * (len - 1) + (max - 1) / 2) / (max - 1)) as usize).collect()
}

/// The `p`-th percentiles (p = 0, 1, …, 100) of `values`, NaN left out, by linear
/// interpolation between the closest ranks (numpy's default). Non-decreasing; empty when no
/// value is a number.
pub fn percentiles_101(values: &[f64]) -> Vec<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if sorted.is_empty() {
        return Vec::new();
    }
    sorted.sort_by(f64::total_cmp);
    let last = sorted.len() - 1;
    (0..QUEUE_DELAY_PERCENTILES)
        .map(|p| {
            let rank = last as f64 * p as f64 / 100.0;
            let lo = rank.floor() as usize;
            let hi = (lo + 1).min(last);
            let frac = rank - lo as f64;
            let (a, b) = (sorted[lo], sorted[hi]);
            if frac == 0.0 || a == b { a } else { a + (b - a) * frac }
        })
        .collect()
}

fn policy_json(report: &ReplayReport) -> Node {
    let mut entries: Vec<(String, Node)> =
        scalar_fields(report).into_iter().map(|(k, v)| (k, Node::Value(v))).collect();
    entries.push((
        "projects".to_owned(),
        Node::Array(report.projects.iter().map(|p| object(p, &LEDGER_KEYS)).collect()),
    ));
    let timeline = &report.timeline;
    entries.push(("timeline_points_total".to_owned(), Node::Value(Value::from(timeline.len()))));
    let picked: Vec<Node> = even_indices(timeline.len(), JSON_TIMELINE_POINTS_MAX)
        .into_iter()
        .map(|i| object::<TimelinePoint>(&timeline[i], &POINT_KEYS))
        .collect();
    entries.push(("timeline".to_owned(), Node::Array(picked)));
    if let Some(rehearsal) = &report.rehearsal
        && let Ok(value) = serde_json::to_value(rehearsal)
    {
        entries.push(("rehearsal".to_owned(), Node::Value(value)));
    }
    let delays = &report.queue_delays_s;
    entries.push(("queue_delays_total".to_owned(), Node::Value(Value::from(delays.len()))));
    if delays.len() > JSON_QUEUE_DELAYS_RAW_MAX {
        let cdf = percentiles_101(delays).into_iter().map(number).collect();
        entries.push(("queue_delay_percentiles_s".to_owned(), Node::Value(Value::Array(cdf))));
    } else {
        let raw = delays.iter().copied().map(number).collect();
        entries.push(("queue_delays_s".to_owned(), Node::Value(Value::Array(raw))));
    }
    Node::Object(entries)
}

/// Pretty JSON ending with a newline, byte-identical for identical input: one report's object
/// as the whole document, or `{"policies": [...]}` with one object per report in the given
/// order when there are several (or none) — the same shape as `allot sim pack`.
///
/// Each policy object has the scalar figures (in `ReplayReport`'s field order, then any field
/// added later, by name), `projects` (the ledger), and the series, bounded so that a long trace
/// still gives a file a person can open:
/// - `timeline_points_total` and `timeline`: at most [`JSON_TIMELINE_POINTS_MAX`] points,
///   picked at evenly spaced indices (first and last kept) when the replay sampled more;
/// - `queue_delays_total`, then either `queue_delays_s` (the raw list, when it has at most
///   [`JSON_QUEUE_DELAYS_RAW_MAX`] entries) or `queue_delay_percentiles_s`: the 101
///   percentiles p0, p1, …, p100 (see [`percentiles_101`]), which is the CDF at 1 % steps.
///
/// Non-finite numbers are written as `null`.
pub fn replay_json(reports: &[ReplayReport]) -> String {
    let doc = match reports {
        [one] => policy_json(one),
        many => Node::Object(vec![(
            "policies".to_owned(),
            Node::Array(many.iter().map(policy_json).collect()),
        )]),
    };
    let mut text = serde_json::to_string_pretty(&doc).unwrap_or_else(|e| {
        // Serializing in-memory values to a String cannot fail; say so if it ever does.
        format!("{{\"error\": {}}}", Value::String(e.to_string()))
    });
    text.push('\n');
    text
}

/// One CSV row per policy with the scalar figures (no series, no ledger), header line first,
/// lines ending with `\n`. Columns: the figures in `ReplayReport`'s field order, then figures
/// added later, by name. Floats are written in Rust's shortest round-trip form; NaN and
/// infinities leave the cell empty.
pub fn replay_csv(reports: &[ReplayReport]) -> String {
    let rows: Vec<Vec<(String, Value)>> = reports.iter().map(scalar_fields).collect();
    let mut header: Vec<String> = REPORT_SCALARS.iter().map(|s| (*s).to_owned()).collect();
    let mut extras: Vec<String> = Vec::new();
    for row in &rows {
        for (key, _) in row {
            if !header.contains(key) && !extras.contains(key) {
                extras.push(key.clone());
            }
        }
    }
    extras.sort();
    header.extend(extras);
    let mut out = csv_line(&header);
    out.push('\n');
    for row in &rows {
        let fields: Vec<String> = header
            .iter()
            .map(|name| {
                row.iter().find(|(k, _)| k == name).map_or_else(String::new, |(_, v)| csv_value(v))
            })
            .collect();
        out.push_str(&csv_line(&fields));
        out.push('\n');
    }
    out
}

fn csv_value(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => u.to_string(),
            (_, Some(i), _) => i.to_string(),
            (_, _, Some(f)) if f.is_finite() => format!("{f}"),
            _ => String::new(),
        },
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_are_grouped() {
        assert_eq!(group_digits("0"), "0");
        assert_eq!(group_digits("999"), "999");
        assert_eq!(group_digits("1000"), "1,000");
        assert_eq!(group_digits("-1234567.25"), "-1,234,567.25");
        assert_eq!(fixed(-0.04, 1), "0.0");
        assert_eq!(fixed(f64::NAN, 1), "n/a");
        assert_eq!(fixed(f64::NEG_INFINITY, 1), "-inf");
        assert_eq!(fixed(65797.0, 0), "65,797");
    }

    #[test]
    fn even_indices_keep_ends_and_bound() {
        assert_eq!(even_indices(3, 10), vec![0, 1, 2]);
        assert_eq!(even_indices(10, 4), vec![0, 3, 6, 9]);
        let picked = even_indices(5000, 1000);
        assert_eq!(picked.len(), 1000);
        assert_eq!((picked[0], picked[999]), (0, 4999));
        assert!(picked.windows(2).all(|w| w[0] < w[1]));
        assert!(even_indices(5, 0).is_empty());
        assert_eq!(even_indices(5, 1), vec![0]);
    }

    #[test]
    fn percentiles_interpolate_and_ignore_nan() {
        let p = percentiles_101(&[f64::NAN, 10.0, 0.0]);
        assert_eq!(p.len(), 101);
        assert_eq!((p[0], p[50], p[100]), (0.0, 5.0, 10.0));
        assert!(percentiles_101(&[f64::NAN]).is_empty());
        let p = percentiles_101(&[1.0, f64::INFINITY, f64::INFINITY]);
        assert!(p.windows(2).all(|w| w[0] <= w[1]), "{p:?}");
    }
}
