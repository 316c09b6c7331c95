//! `allot policy validate` and `allot plan`: config files in, engine run, decisions out.

use std::fmt::Write as _;
use std::path::Path;

use allot_config::{Diagnostic, WorkloadFile};
use allot_core::{Decision, Engine, Event, NodeSpec, PolicySpec, Timestamp};
use anyhow::Result;
use serde_json::{Value, json};

use allot_server::views::{decision_json, explain_json};

use crate::{InvalidInput, Output, PlanArgs};

const EMBEDDED_CLUSTER: (&str, &str) =
    ("examples/cluster.yaml (embedded)", include_str!("../../../examples/cluster.yaml"));
const EMBEDDED_POLICY: (&str, &str) =
    ("examples/policy.yaml (embedded)", include_str!("../../../examples/policy.yaml"));
const EMBEDDED_WORKLOADS: (&str, &str) =
    ("examples/workloads.yaml (embedded)", include_str!("../../../examples/workloads.yaml"));

/// Rounds of decide → start/stop before `plan` gives up on reaching a fixed point.
const PLAN_ROUNDS_MAX: usize = 100;

pub(crate) fn invalid(diagnostics: &[Diagnostic]) -> anyhow::Error {
    let mut text = allot_config::render(diagnostics);
    let _ = writeln!(text, "{} problem(s) found; nothing was changed.", diagnostics.len());
    InvalidInput(text).into()
}

type Loaded<T> = std::result::Result<T, Vec<Diagnostic>>;

fn load_cluster(path: Option<&Path>) -> Loaded<Vec<NodeSpec>> {
    match path {
        Some(p) => allot_config::load_cluster(p),
        None => allot_config::parse_cluster(EMBEDDED_CLUSTER.0, EMBEDDED_CLUSTER.1),
    }
}

fn load_policy(path: Option<&Path>) -> Loaded<PolicySpec> {
    match path {
        Some(p) => allot_config::load_policy(p),
        None => allot_config::parse_policy(EMBEDDED_POLICY.0, EMBEDDED_POLICY.1),
    }
}

fn load_workloads(path: Option<&Path>) -> Loaded<WorkloadFile> {
    match path {
        Some(p) => allot_config::load_workloads(p),
        None => allot_config::parse_workloads(EMBEDDED_WORKLOADS.0, EMBEDDED_WORKLOADS.1),
    }
}

/// Builds the engine; a policy the config crate accepted but the core refuses is still the
/// user's input, so it is reported as invalid input naming the file.
fn engine(nodes: &[NodeSpec], policy: &PolicySpec, policy_file: &str) -> Result<Engine> {
    Engine::new(nodes, policy).map_err(|e| {
        InvalidInput(format!("{policy_file}: {e}\n1 problem(s) found; nothing was changed.\n"))
            .into()
    })
}

pub(crate) fn validate(file: &Path, cluster: Option<&Path>) -> Result<String> {
    let policy = allot_config::load_policy(file);
    let nodes = cluster.map_or(Ok(Vec::new()), allot_config::load_cluster);
    let (policy, nodes) = match (policy, nodes) {
        (Ok(p), Ok(n)) => (p, n),
        (p, n) => {
            return Err(invalid(
                &[p.err(), n.err()].into_iter().flatten().flatten().collect::<Vec<_>>(),
            ));
        }
    };
    let engine = engine(&nodes, &policy, &file.display().to_string())?;
    let mut out = format!(
        "{}: ok — {} projects in {} cohorts, {} priority classes (default {}), pre-emption mode {}\n",
        file.display(),
        policy.projects.len(),
        (0..engine.project_count())
            .filter_map(|p| engine.project_declared_cohort(allot_core::ProjectId(p as u32)))
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        policy.priority_classes.len(),
        policy.default_priority_class,
        policy.preemption_mode.as_str(),
    );
    for rule in &policy.idle {
        let model = rule.rule.model.as_str();
        let scope =
            |names: Vec<&str>| if names.is_empty() { "all".to_string() } else { names.join(",") };
        let _ = writeln!(
            out,
            "idle rule {}: {model}, projects {}, kinds {}, {}: {} after {} min idle{}{} ({}){}",
            rule.name,
            scope(rule.projects.iter().map(String::as_str).collect()),
            scope(rule.kinds.iter().map(|k| k.as_str()).collect()),
            if rule.rule.model == allot_core::idle::IdleModel::RunAi {
                "exactly 0 %".to_string()
            } else {
                format!(
                    "below {}.{} %",
                    rule.rule.threshold_permille / 10,
                    rule.rule.threshold_permille % 10
                )
            },
            if rule.when == allot_core::IdleWhen::ReportOnly {
                "reported"
            } else {
                rule.action.as_str()
            },
            rule.rule.idle_timer_ms / 60_000,
            if rule.rule.quiet_timer_ms > 0 {
                format!(
                    " ({} min while fewer than {}.{} % of its other workloads in the project were \
                     active in the last {} min)",
                    rule.rule.quiet_timer_ms / 60_000,
                    rule.rule.quiet_below_permille / 10,
                    rule.rule.quiet_below_permille % 10,
                    rule.rule.quiet_window_ms / 60_000
                )
            } else {
                String::new()
            },
            if rule.warn_before_ms > 0 {
                format!(", warned {} min before", rule.warn_before_ms / 60_000)
            } else {
                String::new()
            },
            rule.when.as_str(),
            if rule.exempt_classes.is_empty() {
                String::new()
            } else {
                format!(", exempt {}", rule.exempt_classes.join(","))
            },
        );
    }
    if cluster.is_some() {
        let gpus: usize = nodes.iter().map(|n| n.devices.len()).sum();
        let _ = writeln!(out, "checked against {} nodes with {gpus} GPUs", nodes.len());
    }
    Ok(out)
}

pub(crate) fn plan(args: &PlanArgs) -> Result<String> {
    let nodes = load_cluster(args.cluster.as_deref());
    let policy = load_policy(args.policy.as_deref());
    let workloads = load_workloads(args.workloads.as_deref());
    // Report the problems of all three files at once.
    let (nodes, policy, workloads) = match (nodes, policy, workloads) {
        (Ok(n), Ok(p), Ok(w)) => (n, p, w),
        (n, p, w) => {
            let problems: Vec<Diagnostic> =
                [n.err(), p.err(), w.err()].into_iter().flatten().flatten().collect();
            return Err(invalid(&problems));
        }
    };
    let problems = allot_config::check_workloads(&workloads, &policy, &nodes);
    if !problems.is_empty() {
        return Err(invalid(&problems));
    }
    let policy_file =
        args.policy.as_ref().map_or(EMBEDDED_POLICY.0.to_string(), |p| p.display().to_string());
    let mut engine = engine(&nodes, &policy, &policy_file)?;

    let now = Timestamp(0);
    for spec in workloads.specs() {
        engine.apply(now, Event::WorkloadSubmitted(spec.clone()));
    }
    // Run to a fixed point: each round's admissions start and its victims stop at once.
    let mut rounds: Vec<Vec<Decision>> = Vec::new();
    let mut final_round = Vec::new();
    for _ in 0..PLAN_ROUNDS_MAX {
        let decisions = engine.decide(now);
        let mut acted = false;
        for d in &decisions {
            match d {
                Decision::Admit { workload, .. } => {
                    engine.apply(now, Event::AllocationStarted { workload: *workload });
                    acted = true;
                }
                Decision::Preempt { victim, .. } | Decision::Stop { workload: victim, .. } => {
                    engine.apply(now, Event::WorkloadStopped { workload: *victim });
                    acted = true;
                }
                _ => {}
            }
        }
        if acted {
            rounds.push(decisions);
        } else {
            final_round = decisions;
            break;
        }
    }
    engine.audit().map_err(|e| anyhow::anyhow!("engine invariant broken: {e}"))?;

    // Report: every action taken, then the workloads that stay pending with their reasons.
    let mut report: Vec<(usize, Decision)> = Vec::new();
    for (i, round) in rounds.iter().enumerate() {
        for d in round {
            if !matches!(d, Decision::Defer { .. }) {
                report.push((i + 1, d.clone()));
            }
        }
    }
    let final_index = rounds.len() + 1;
    for d in final_round {
        report.push((final_index, d));
    }

    match args.output {
        Output::Json => {
            let decisions: Vec<Value> = report
                .iter()
                .map(|(round, d)| {
                    let mut v = decision_json(&engine, d);
                    v["round"] = json!(round);
                    if args.explain && matches!(d, Decision::Defer { .. }) {
                        v["why"] = explain_json(&engine, now, d.workload());
                    }
                    v
                })
                .collect();
            let summary = summary_json(&engine, &report);
            let doc = json!({ "decisions": decisions, "summary": summary });
            Ok(format!("{}\n", serde_json::to_string_pretty(&doc)?))
        }
        Output::Text => {
            let mut out = String::new();
            let _ = writeln!(
                out,
                "allot plan: {} workloads on {} nodes, {} round(s) to a fixed point at t=0\n",
                workloads.specs().len(),
                engine.node_count(),
                final_index
            );
            for (round, d) in &report {
                let _ = writeln!(out, "[{round}] {}", engine.render(d));
                if args.explain
                    && matches!(d, Decision::Defer { .. })
                    && let Some(e) = engine.explain(now, d.workload())
                {
                    for line in engine.render_explanation(&e).lines().skip(1) {
                        let _ = writeln!(out, "      {}", line.trim_start());
                    }
                }
            }
            let admitted = report.iter().filter(|(_, d)| d.action() == "admit").count();
            let pending = report.iter().filter(|(_, d)| d.action() == "defer").count();
            let _ = writeln!(out, "\n{admitted} admitted, {pending} pending");
            for p in 0..engine.project_count() {
                let id = allot_core::ProjectId(p as u32);
                let lines: Vec<String> = engine
                    .project_lines(id)
                    .into_iter()
                    .map(|(k, used, g, _, _)| format!("{} {used}/{g}", engine.key_name(k)))
                    .collect();
                let _ = writeln!(out, "  {:<14} {}", engine.project_name(id), lines.join(", "));
            }
            Ok(out)
        }
    }
}

fn summary_json(engine: &Engine, report: &[(usize, Decision)]) -> Value {
    let projects: Vec<Value> = (0..engine.project_count())
        .map(|p| {
            let id = allot_core::ProjectId(p as u32);
            json!({
                "project": engine.project_name(id),
                "cohort": engine.project_declared_cohort(id),
                "department": engine.project_department(id),
                "quota": engine.project_lines(id).into_iter().map(|(k, used, g, b, l)| json!({
                    "model": engine.key_name(k),
                    "used_gpus": used.as_gpus(),
                    "guaranteed_gpus": g.as_gpus(),
                    "borrow_limit_gpus": b.map(allot_core::Shares::as_gpus),
                    "lend_limit_gpus": l.map(allot_core::Shares::as_gpus),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "admitted": report.iter().filter(|(_, d)| d.action() == "admit").count(),
        "preempted": report.iter().filter(|(_, d)| d.action() == "preempt").count(),
        "pending": report.iter().filter(|(_, d)| d.action() == "defer").count(),
        "rejected": report.iter().filter(|(_, d)| d.action() == "reject").count(),
        "projects": projects,
    })
}
