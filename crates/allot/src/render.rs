//! Text renderers for the API's answers: aligned tables, human durations.

use std::fmt::Write as _;

use allot_api::{NodeList, ProjectList, Report, Workload, WorkloadList};

/// Columns separated by two spaces, each as wide as its widest cell; the last column is not
/// padded (reasons are long).
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|h| (*h).to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let pad = widths[i].saturating_sub(cell.chars().count());
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', pad + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `45s`, `12m`, `3h05m`, `2d04h`: two units at most, the larger first.
pub(crate) fn duration(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// The `ls` table; `now_ms` is the client's clock (ages).
pub(crate) fn workloads(list: &WorkloadList, now_ms: u64) -> String {
    let rows: Vec<Vec<String>> = list
        .workloads
        .iter()
        .map(|w| {
            vec![
                w.id.to_string(),
                w.name.clone(),
                w.project.clone(),
                w.state.as_str().to_string(),
                w.size(),
                duration(now_ms.saturating_sub(w.submitted_ms)),
                w.reason.clone().unwrap_or_default(),
            ]
        })
        .collect();
    table(&["ID", "NAME", "PROJECT", "STATE", "GPUS", "AGE", "REASON"], &rows)
}

/// One workload after an action (`cancel`, `suspend`, `resume`).
pub(crate) fn workload_line(w: &Workload) -> String {
    let mut line = format!("{} {}: {}", w.id, w.name, w.state.as_str());
    if let Some(reason) = &w.reason {
        let _ = write!(line, " — {reason}");
    }
    line.push('\n');
    line
}

pub(crate) fn why(why: &allot_api::Why) -> String {
    let mut out = format!("{} {}: {}\n", why.id, why.name, why.state.as_str());
    for line in &why.lines {
        let _ = writeln!(out, "  {line}");
    }
    out
}

pub(crate) fn projects(list: &ProjectList) -> String {
    let mut rows = Vec::new();
    for p in &list.projects {
        let lines: Vec<Option<&allot_api::QuotaLine>> =
            if p.quota.is_empty() { vec![None] } else { p.quota.iter().map(Some).collect() };
        for (i, q) in lines.into_iter().enumerate() {
            let first = i == 0;
            let text = |s: &str| if first { s.to_string() } else { String::new() };
            // No limit: "unlimited"; a project without a cohort borrows and lends nothing: "-".
            let limit = |l: Option<f64>| match (&p.cohort, l) {
                (None, _) => "-".to_string(),
                (Some(_), None) => "unlimited".to_string(),
                (Some(_), Some(g)) => g.to_string(),
            };
            rows.push(vec![
                text(&p.name),
                text(p.cohort.as_deref().unwrap_or("-")),
                q.map_or("-".to_string(), |q| q.model.clone()),
                q.map_or("-".to_string(), |q| q.used_gpus.to_string()),
                q.map_or("-".to_string(), |q| q.guaranteed_gpus.to_string()),
                q.map_or("-".to_string(), |q| limit(q.borrow_limit_gpus)),
                q.map_or("-".to_string(), |q| limit(q.lend_limit_gpus)),
                text(&p.running.to_string()),
                text(&p.pending.to_string()),
            ]);
        }
    }
    let mut out = table(
        &[
            "PROJECT",
            "COHORT",
            "MODEL",
            "USED",
            "GUARANTEED",
            "BORROW_LIMIT",
            "LEND_LIMIT",
            "RUNNING",
            "PENDING",
        ],
        &rows,
    );
    // Pre-emption rules that differ from the default, one line per project.
    for p in &list.projects {
        let mut rules = Vec::new();
        match p.preempt_within_project.as_str() {
            "lower_priority" => {}
            "never" => rules.push("never pre-empts its own work".to_string()),
            "lower_or_newer_equal_priority" => rules.push(
                "pre-empts its own work of lower priority, or of equal priority queued later"
                    .to_string(),
            ),
            other => rules.push(format!("pre-empts its own work: {other}")),
        }
        if let Some(b) = &p.borrow_within_cohort {
            rules.push(match b.max_priority_threshold {
                Some(t) => format!(
                    "reclaims while borrowing from work below its own and of priority at most {t}"
                ),
                None => "reclaims while borrowing from work below its own".to_string(),
            });
        }
        if !rules.is_empty() {
            let _ = writeln!(out, "{}: {}", p.name, rules.join("; "));
        }
    }
    out
}

/// Thousandths of a device as a percentage.
pub(crate) fn share(used_shares: u64) -> String {
    format!("{}%", used_shares.div_ceil(10))
}

pub(crate) fn nodes(list: &NodeList) -> String {
    let mut rows = Vec::new();
    for node in &list.nodes {
        for d in &node.devices {
            let mut ids: Vec<String> = d.workloads.iter().map(u64::to_string).collect();
            if node.unmanaged.as_ref().is_some_and(|u| u.devices.contains(&d.index)) {
                ids.push("unmanaged".to_string());
            }
            rows.push(vec![
                node.name.clone(),
                d.index.to_string(),
                d.model.clone(),
                share(d.used_shares),
                if ids.is_empty() { "-".to_string() } else { ids.join(",") },
            ]);
        }
    }
    let mut out = format!("inventory: {}\n", list.source);
    if let Some(gate) = &list.backend.gate {
        out.push_str(&format!("gate: {gate}\n"));
    }
    if !list.backend.reachable && !list.backend.name.is_empty() {
        out.push_str(&format!(
            "backend {}: UNREACHABLE since {} ({}); no new work is placed, running work runs on\n",
            list.backend.name,
            list.backend.unreachable_since_ms.map_or("?".to_string(), utc),
            list.backend.error.as_deref().unwrap_or("no answer")
        ));
    }
    if let Some(note) = &list.inventory_note {
        out.push_str(&format!("last inventory change: {note}\n"));
    }
    let unusable: Vec<String> = list
        .nodes
        .iter()
        .filter_map(|n| Some(format!("  {}: {}", n.name, n.unusable.as_ref()?)))
        .collect();
    if !unusable.is_empty() && list.backend.reachable {
        out.push_str("nodes taking no new work:\n");
        out.push_str(&unusable.join("\n"));
        out.push('\n');
    }
    let unmanaged: Vec<String> = list
        .nodes
        .iter()
        .filter_map(|n| {
            let u = n.unmanaged.as_ref()?;
            let devices: Vec<String> = u.devices.iter().map(u32::to_string).collect();
            Some(format!("  {}[{}]: {}", n.name, devices.join(","), u.by))
        })
        .collect();
    if !unmanaged.is_empty() {
        out.push_str("GPUs held by work allot does not govern (offered to no allot work):\n");
        out.push_str(&unmanaged.join("\n"));
        out.push('\n');
    }
    out.push_str(&table(&["NODE", "DEVICE", "MODEL", "USED", "WORKLOADS"], &rows));
    out
}

/// A time in ms since the Unix epoch as UTC (`2026-12-01 21:57:50 UTC`).
pub(crate) fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (h, m, s) = ((secs % 86_400) / 3600, (secs % 3600) / 60, secs % 60);
    let (year, month, day) = allot_core::civil_from_days((secs / 86_400) as i64);
    format!("{year:04}-{month:02}-{day:02} {h:02}:{m:02}:{s:02} UTC")
}

pub(crate) fn report(report: &Report) -> String {
    // Two decimals: a short demo workload's 0.04 GPU-hours must not read as nothing.
    let hours = |h: f64| format!("{h:.2}");
    let rows: Vec<Vec<String>> = report
        .rows
        .iter()
        .map(|r| {
            // What only telemetry can tell is unknown, not 0, where none covered the scope.
            let unmeasured = r.measured_gpu_hours <= 0.0 && r.allocated_gpu_hours > 0.0;
            let measured = |h: f64| if unmeasured { "-".to_string() } else { hours(h) };
            vec![
                r.scope.clone(),
                hours(r.allocated_gpu_hours),
                measured(r.active_gpu_hours),
                hours(r.measured_gpu_hours),
                measured(r.idle_allocated_gpu_hours),
                hours(r.lost_gpu_hours),
                measured(r.useful_gpu_hours),
                match r.goodput {
                    Some(g) if !unmeasured => format!("{:.0}%", g * 100.0),
                    _ => "-".to_string(),
                },
            ]
        })
        .collect();
    let mut out = format!(
        "goodput ledger over the last {} (GPU-hours; MEASURED: covered by telemetry, the rest \
         unmeasured; -: no telemetry covered it, so active, idle, useful and goodput are \
         unknown)\n",
        duration(report.now_ms.saturating_sub(report.since_ms))
    );
    out.push_str(&table(
        &["SCOPE", "ALLOCATED", "ACTIVE", "MEASURED", "IDLE", "LOST", "USEFUL", "GOODPUT"],
        &rows,
    ));
    if let Some(c) =
        report.rows.iter().find(|r| r.scope == "cluster" && r.unmanaged_gpu_hours > 0.0)
    {
        out.push_str(&format!(
            "unmanaged: {} GPU-hours held by work allot does not govern (not in the rows above)\n",
            hours(c.unmanaged_gpu_hours)
        ));
    }
    out
}

/// The client's wall clock in ms since the Unix epoch, for ages in `ls` and `top`.
#[allow(clippy::disallowed_methods)] // ages are shown against the user's real clock
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_without_telemetry_says_unknown_not_zero() {
        let row = |scope: &str, measured: f64| allot_api::LedgerRow {
            scope: scope.into(),
            allocated_gpu_hours: 0.04,
            active_gpu_hours: 0.0,
            measured_gpu_hours: measured,
            idle_allocated_gpu_hours: 0.04,
            lost_gpu_hours: 0.0,
            useful_gpu_hours: 0.0,
            goodput: Some(0.0),
            unmanaged_gpu_hours: 0.0,
        };
        let text = report(&Report {
            since_ms: 0,
            now_ms: 60_000,
            rows: vec![row("project:research", 0.0), row("project:vision", 0.04)],
        });
        let research = text.lines().find(|l| l.starts_with("project:research")).unwrap_or("");
        let cells: Vec<&str> = research.split_whitespace().collect();
        assert_eq!(cells, ["project:research", "0.04", "-", "0.00", "-", "0.00", "-", "-"]);
        let vision = text.lines().find(|l| l.starts_with("project:vision")).unwrap_or("");
        assert!(vision.split_whitespace().any(|c| c == "0%"), "{text}");
    }

    #[test]
    fn durations_read_like_a_person_writes_them() {
        assert_eq!(duration(999), "0s");
        assert_eq!(duration(45_000), "45s");
        assert_eq!(duration(12 * 60_000 + 5_000), "12m");
        assert_eq!(duration(3 * 3_600_000 + 5 * 60_000), "3h05m");
        assert_eq!(duration(2 * 86_400_000 + 4 * 3_600_000), "2d04h");
    }

    #[test]
    fn tables_align_columns_and_leave_the_last_unpadded() {
        let rows = vec![
            vec!["1".to_string(), "a-long-name".to_string(), "x".to_string()],
            vec!["12".to_string(), "b".to_string(), String::new()],
        ];
        assert_eq!(
            table(&["ID", "NAME", "REASON"], &rows),
            "ID  NAME         REASON\n1   a-long-name  x\n12  b\n"
        );
    }

    #[test]
    fn shares_round_up_to_a_visible_percentage() {
        assert_eq!(share(0), "0%");
        assert_eq!(share(1), "1%");
        assert_eq!(share(250), "25%");
        assert_eq!(share(1000), "100%");
    }
}
