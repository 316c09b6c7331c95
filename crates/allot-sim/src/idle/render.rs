//! The report as JSON and as text.

use std::fmt::Write as _;

use super::IdleReport;
use crate::report;

/// The report as pretty JSON with a trailing newline.
pub fn idle_json(report: &IdleReport) -> String {
    let mut text = serde_json::to_string_pretty(report).unwrap_or_else(|e| {
        // Serializing in-memory values to a String cannot fail; say so if it ever does.
        format!("{{\"error\": {}}}", serde_json::Value::String(e.to_string()))
    });
    text.push('\n');
    text
}

/// The report as text: the setting, the mix, one row per policy, the goal.
pub fn idle_text(report: &IdleReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "idle reclaim: seed {}, {} h, {} machines, {} GPUs, offered load {:.2} × capacity",
        report.seed,
        report.hours,
        report.cluster_machines,
        report.cluster_gpus,
        report.offered_load
    );
    let mix: Vec<String> = report
        .mix
        .0
        .iter()
        .filter(|(k, _)| k != "total")
        .map(|(k, e)| format!("{k} {:.0} GPU-h ({:.1} %)", e.offered_gpu_hours, 100.0 * e.share))
        .collect();
    let _ = writeln!(out, "offered: {}\n", mix.join(", "));
    let headers = [
        "policy",
        "idle reclaims",
        "workloads",
        "false",
        "reclaimed GPU-h",
        "reused GPU-h",
        "gross GPU-h",
        "lost GPU-h",
        "wait p95 s",
        "goodput",
        "warnings",
        "deleted",
        "redeployed",
        "allocated GPU-h",
        "active GPU-h",
        "idle GPU-h",
        "finished",
        "gap samples",
        "wall ms",
    ];
    let rows: Vec<Vec<String>> = report
        .policies
        .0
        .iter()
        .map(|(label, m)| {
            vec![
                label.clone(),
                m.idle_reclaims.to_string(),
                m.idle_reclaimed_workloads.to_string(),
                m.false_reclaims.to_string(),
                format!("{:.1}", m.reclaimed_idle_gpu_hours),
                format!("{:.1}", m.reused_gpu_hours),
                format!("{:.1}", m.reclaimed_idle_gpu_hours_gross),
                format!("{:.1}", m.lost_gpu_hours),
                format!("{:.0}", m.pending_wait_s_p95),
                format!("{:.4}", m.goodput),
                m.warnings.to_string(),
                m.deleted.to_string(),
                m.redeployed.to_string(),
                format!("{:.1}", m.allocated_gpu_hours),
                format!("{:.1}", m.active_gpu_hours),
                format!("{:.1}", m.idle_allocated_gpu_hours),
                m.jobs_finished.to_string(),
                m.telemetry_gap_samples.to_string(),
                m.wall_ms.to_string(),
            ]
        })
        .collect();
    out.push_str(&report::table(&headers, &rows));
    // The goodput ledger per project (allot_core::ledger), one table per policy.
    let ledger_headers = [
        "ledger",
        "allocated GPU-h",
        "active GPU-h",
        "idle GPU-h",
        "lost GPU-h",
        "ckpt GPU-h",
        "goodput",
        "queue s (mean)",
        "startup s (mean)",
        "fragmented GPU-h",
    ];
    for (label, m) in &report.policies.0 {
        let rows: Vec<Vec<String>> = m
            .ledger
            .iter()
            .map(|(scope, r)| {
                vec![
                    format!("{label}/{scope}"),
                    format!("{:.1}", r.allocated_gpu_hours),
                    format!("{:.1}", r.active_gpu_hours),
                    format!("{:.1}", r.idle_allocated_gpu_hours),
                    format!("{:.1}", r.lost_to_preemption_gpu_hours),
                    format!("{:.1}", r.checkpoint_overhead_gpu_hours),
                    format!("{:.4}", r.goodput),
                    format!("{:.0}", r.queue_delay_s_mean),
                    format!("{:.0}", r.startup_delay_s_mean),
                    format!("{:.1}", r.fragmented_gpu_hours),
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&report::table(&ledger_headers, &rows));
    }
    if let Some(g) = &report.goal {
        let yes = |b: bool| if b { "holds" } else { "does not hold" };
        let _ = writeln!(
            out,
            "\ngoal ({}):\n  reclaimed idle GPU-h: allot {:.1} ≥ amd_rm {:.1}: {}\n  false \
             reclaims: allot {} ≤ amd_rm {} / 3: {}\n  lost GPU-h: allot {:.1} ≤ amd_rm {:.1} / 2: \
             {}",
            yes(g.holds),
            g.reclaimed_idle_gpu_hours.allot,
            g.reclaimed_idle_gpu_hours.amd_rm,
            yes(g.reclaimed_idle_gpu_hours.holds),
            g.false_reclaims.allot,
            g.false_reclaims.amd_rm,
            yes(g.false_reclaims.holds),
            g.lost_gpu_hours.allot,
            g.lost_gpu_hours.amd_rm,
            yes(g.lost_gpu_hours.holds),
        );
    }
    out
}
