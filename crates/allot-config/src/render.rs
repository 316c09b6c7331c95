//! A policy written back as a policy file: every setting spelled out, so that reading the
//! text gives the same `PolicySpec` (`parse_policy(render_policy(p)) == p`, tested on every
//! example and on scoped merges). A scoped rollout (`scope.rs`) is applied as such a text:
//! every policy version the daemon keeps is a whole file an operator can read and re-apply.

use std::fmt::Write as _;

use allot_core::idle::{IdleModel, MissingTelemetry};
use allot_core::{
    CohortSpec, IdlePolicySpec, PolicySpec, ProjectSpec, Queueing, QuotaModel, QuotaSpec, Shares,
};

use crate::decode::format_duration;

/// `policy` as YAML, after `header` (each line written as a comment).
pub fn render_policy(policy: &PolicySpec, header: &str) -> String {
    let mut out = String::new();
    for line in header.lines() {
        let _ = writeln!(out, "# {line}");
    }
    if policy.fair_share_half_life_ms > 0 {
        let _ = writeln!(
            out,
            "fair_share: {{half_life: {}}}",
            format_duration(policy.fair_share_half_life_ms)
        );
    }
    out.push_str("preemption:\n");
    let _ = writeln!(out, "  mode: {}", policy.preemption_mode.as_str());
    let guard = &policy.preemption_guard;
    let _ =
        writeln!(out, "  exempt_after_restart: {}", format_duration(guard.exempt_after_restart_ms));
    if guard.reclaim_after_ms > 0 {
        let _ = writeln!(out, "  reclaim_after: {}", format_duration(guard.reclaim_after_ms));
    }
    match guard.limit {
        Some(limit) => {
            let _ = writeln!(
                out,
                "  max_per_workload: {{count: {}, window: {}}}",
                limit.count,
                format_duration(limit.window_ms)
            );
        }
        None => out.push_str("  max_per_workload: false\n"),
    }
    if let Some(fair) = &policy.fair_sharing {
        let strategies: Vec<&str> = fair.strategies.iter().map(|s| s.as_str()).collect();
        let _ = writeln!(out, "  fair_sharing: {{strategies: [{}]}}", strategies.join(", "));
    }
    match &policy.defragmentation {
        Some(d) => {
            let _ = writeln!(
                out,
                "defragmentation: {{enabled: true, restart_cost: {}}}",
                format_duration(d.restart_cost_ms)
            );
        }
        None => out.push_str("defragmentation: false\n"),
    }
    if let Some(r) = &policy.reservations {
        let _ = writeln!(
            out,
            "reservations: {{after: {}, per_model_max: {}, hold_quota: {}}}",
            format_duration(r.after_ms),
            r.per_model_max,
            r.hold_quota
        );
    }
    let _ = writeln!(out, "restart_cost: {}", format_duration(policy.restart_cost_ms));
    let _ =
        writeln!(out, "idle_resume_backoff: {}", format_duration(policy.idle_resume_backoff_ms));
    out.push_str("priority_classes:\n");
    for c in &policy.priority_classes {
        let _ = writeln!(
            out,
            "  - {{name: \"{}\", value: {}, preemptible: {}}}",
            c.name, c.value, c.preemptible
        );
    }
    let _ = writeln!(out, "default_priority_class: \"{}\"", policy.default_priority_class);
    out.push_str("projects:\n");
    for p in &policy.projects {
        project(&mut out, p);
    }
    if !policy.cohorts.is_empty() {
        out.push_str("cohorts:\n");
        for c in &policy.cohorts {
            cohort(&mut out, c);
        }
    }
    if !policy.idle.is_empty() {
        out.push_str("idle:\n");
        for rule in &policy.idle {
            idle_rule(&mut out, rule);
        }
    }
    out
}

fn project(out: &mut String, p: &ProjectSpec) {
    let _ = writeln!(out, "  - name: \"{}\"", p.name);
    if let Some(cohort) = &p.cohort {
        let _ = writeln!(out, "    cohort: \"{cohort}\"");
    }
    if let Some(department) = &p.department {
        let _ = writeln!(out, "    department: \"{department}\"");
    }
    let _ = writeln!(out, "    weight: {}", milli(p.weight_milli));
    let queueing = match p.queueing {
        Queueing::StrictFifo => "strict_fifo",
        Queueing::BestEffortFifo => "best_effort_fifo",
    };
    let _ = writeln!(out, "    queueing: {queueing}");
    if let Some(mode) = p.preemption_mode {
        let _ = writeln!(out, "    preemption_mode: {}", mode.as_str());
    }
    let _ = writeln!(out, "    preempt_within_project: {}", p.preempt_within_project.as_str());
    if let Some(b) = &p.borrow_within_cohort {
        match b.max_priority_threshold {
            Some(t) => {
                let _ = writeln!(
                    out,
                    "    borrow_within_cohort: {{policy: lower_priority, max_priority_threshold: {t}}}"
                );
            }
            None => out.push_str("    borrow_within_cohort: lower_priority\n"),
        }
    }
    quotas(out, &p.quotas);
}

fn cohort(out: &mut String, c: &CohortSpec) {
    let _ = writeln!(out, "  - name: \"{}\"", c.name);
    if let Some(parent) = &c.parent {
        let _ = writeln!(out, "    parent: \"{parent}\"");
    }
    quotas(out, &c.quotas);
}

fn quotas(out: &mut String, quotas: &[QuotaSpec]) {
    if quotas.is_empty() {
        return;
    }
    out.push_str("    quotas:\n");
    for q in quotas {
        let model = match &q.model {
            QuotaModel::Any => "any".to_string(),
            QuotaModel::Model(m) => format!("\"{m}\""),
        };
        let _ = write!(out, "      - {{model: {model}, guaranteed: {}", gpus(q.guaranteed));
        if let Some(b) = q.borrow_limit {
            let _ = write!(out, ", borrow_limit: {}", gpus(b));
        }
        if let Some(l) = q.lend_limit {
            let _ = write!(out, ", lend_limit: {}", gpus(l));
        }
        out.push_str("}\n");
    }
}

fn idle_rule(out: &mut String, rule: &IdlePolicySpec) {
    let _ = writeln!(out, "  - name: \"{}\"", rule.name);
    if !rule.projects.is_empty() {
        let names: Vec<String> = rule.projects.iter().map(|p| format!("\"{p}\"")).collect();
        let _ = writeln!(out, "    projects: [{}]", names.join(", "));
    }
    if !rule.kinds.is_empty() {
        let kinds: Vec<&str> = rule.kinds.iter().map(|k| k.as_str()).collect();
        let _ = writeln!(out, "    kinds: [{}]", kinds.join(", "));
    }
    if !rule.exempt_classes.is_empty() {
        let names: Vec<String> = rule.exempt_classes.iter().map(|c| format!("\"{c}\"")).collect();
        let _ = writeln!(out, "    exempt_classes: [{}]", names.join(", "));
    }
    let r = &rule.rule;
    let model = match r.model {
        IdleModel::Allot => "allot",
        IdleModel::AmdRm => "amd_rm",
        IdleModel::RunAi => "runai",
    };
    let _ = writeln!(out, "    model: {model}");
    // The baselines refuse the settings only allot has: those are written for `allot` alone.
    if r.model != IdleModel::RunAi {
        let _ = writeln!(out, "    threshold: {}", percent(r.threshold_permille));
    }
    let _ = writeln!(out, "    idle_timer: {}", format_duration(r.idle_timer_ms));
    if r.model == IdleModel::Allot {
        let missing = match r.missing {
            MissingTelemetry::Hold => "hold",
            MissingTelemetry::Idle => "idle",
            MissingTelemetry::Active => "active",
        };
        let _ = writeln!(out, "    sustain: {}", format_duration(r.sustain_ms));
        let _ = writeln!(out, "    missing_telemetry: {missing}");
        let _ = writeln!(out, "    min_runtime: {}", format_duration(r.min_runtime_ms));
        if r.quiet_timer_ms > 0 {
            let _ = writeln!(out, "    quiet_timer: {}", format_duration(r.quiet_timer_ms));
            let _ = writeln!(out, "    quiet_below: {}", percent(r.quiet_below_permille));
            let _ = writeln!(out, "    quiet_window: {}", format_duration(r.quiet_window_ms));
        }
    }
    let _ = writeln!(out, "    policy: {}", rule.when.as_str());
    let _ = writeln!(out, "    action: {}", rule.action.as_str());
    let _ = writeln!(out, "    warn_before: {}", format_duration(rule.warn_before_ms));
}

/// Thousandths as a decimal without trailing zeros: 1500 → `1.5`.
fn milli(value: u64) -> String {
    let (whole, frac) = (value / 1000, value % 1000);
    if frac == 0 {
        whole.to_string()
    } else {
        format!("{whole}.{frac:03}").trim_end_matches('0').to_string()
    }
}

fn gpus(shares: Shares) -> String {
    milli(shares.0)
}

/// Permille as a percentage: 25 → `2.5%`.
fn percent(permille: u16) -> String {
    if permille.is_multiple_of(10) {
        format!("{}%", permille / 10)
    } else {
        format!("{}.{}%", permille / 10, permille % 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every policy file in the repository reads back the same after rendering.
    #[test]
    fn every_example_policy_reads_back_the_same() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        let mut files = Vec::new();
        for dir in ["examples", "examples/idle"] {
            let Ok(entries) = std::fs::read_dir(format!("{root}/{dir}")) else { continue };
            for entry in entries.flatten() {
                let path = entry.path();
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if name.ends_with(".yaml") && (dir != "examples" || name.contains("policy")) {
                    files.push(path);
                }
            }
        }
        files.sort();
        assert!(files.len() >= 3, "policy examples found: {files:?}");
        for path in files {
            let text = std::fs::read_to_string(&path).expect("read");
            let policy = crate::parse_policy("p.yaml", &text).expect("example parses");
            let rendered = render_policy(&policy, "rendered\nfor the test");
            let again = crate::parse_policy("rendered.yaml", &rendered).unwrap_or_else(|d| {
                panic!("{}: {}\n{rendered}", path.display(), crate::render(&d))
            });
            assert_eq!(again, policy, "{}:\n{rendered}", path.display());
        }
    }

    #[test]
    fn numbers_are_written_exactly() {
        assert_eq!(milli(1500), "1.5");
        assert_eq!(milli(2125), "2.125");
        assert_eq!(milli(2000), "2");
        assert_eq!(milli(5), "0.005");
        assert_eq!(percent(25), "2.5%");
        assert_eq!(percent(1000), "100%");
        assert_eq!(percent(0), "0%");
    }
}
