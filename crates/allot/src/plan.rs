//! `allot policy validate` and `allot plan`: config files in, engine run, decisions out.

use std::fmt::Write as _;
use std::path::Path;

use allot_config::{Diagnostic, WorkloadFile};
use std::collections::BTreeMap;

use allot_core::{
    Decision, DeviceShare, Engine, Event, GpuRequest, MemberPlacement, NodeId, NodeSpec, Placement,
    PolicySpec, SHARES_PER_GPU, Timestamp, WorkloadId, WorkloadSpec,
};
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
    let guard = policy.preemption_guard;
    let exempt = match guard.exempt_after_restart_ms {
        0 => "restarted work is not exempt".to_string(),
        ms => format!("restarted work is exempt for {}", crate::render::duration(ms)),
    };
    let cap = guard.limit.map_or("no cap per workload".to_string(), |l| {
        format!(
            "at most {} pre-emptions per workload per {}",
            l.count,
            crate::render::duration(l.window_ms)
        )
    });
    let _ = writeln!(out, "pre-emption guard: {exempt}, {cap}");
    if let Some(fs) = &policy.fair_sharing {
        let names: Vec<&str> = fs.strategies.iter().map(|s| s.as_str()).collect();
        let _ = writeln!(out, "fair-sharing pre-emption: {}", names.join(", "));
    }
    for c in &policy.cohorts {
        let quotas: Vec<String> = c
            .quotas
            .iter()
            .map(|q| {
                let model = match &q.model {
                    allot_core::QuotaModel::Any => "any".to_string(),
                    allot_core::QuotaModel::Model(m) => m.clone(),
                };
                let mut text = format!("{model} {}", q.guaranteed);
                if let Some(b) = q.borrow_limit {
                    let _ = write!(text, " (borrow ≤ {b})");
                }
                if let Some(l) = q.lend_limit {
                    let _ = write!(text, " (lend ≤ {l})");
                }
                text
            })
            .collect();
        let _ = writeln!(
            out,
            "cohort {}{}: {}",
            c.name,
            c.parent.as_ref().map(|p| format!(" in {p}")).unwrap_or_default(),
            if quotas.is_empty() { "no quota of its own".to_string() } else { quotas.join(", ") }
        );
    }
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

    // Work stated as running started `since` ago: the plan's "now" is the longest `since`, so
    // that every start is a time on the engine's clock; times the file states from the plan's
    // start (deadlines, last checkpoints) move with it.
    let shift = (0..workloads.specs().len())
        .filter_map(|i| workloads.running(i))
        .map(|r| r.since_ms)
        .max()
        .unwrap_or(0);
    let now = Timestamp(shift);
    let running = adopt_running(&mut engine, &workloads, &nodes, now)?;
    for (i, spec) in workloads.specs().iter().enumerate() {
        if workloads.running(i).is_none() {
            engine.apply(now, Event::WorkloadSubmitted(shifted(spec, shift)));
        }
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
                "allot plan: {} workloads{} on {} nodes, {} round(s) to a fixed point at t=0\n",
                workloads.specs().len(),
                if running == 0 { String::new() } else { format!(" ({running} running)") },
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

/// A spec with the times the file states from the plan's start moved by `shift`.
fn shifted(spec: &WorkloadSpec, shift: u64) -> WorkloadSpec {
    let mut spec = spec.clone();
    spec.deadline = spec.deadline.map(|d| Timestamp(d.0.saturating_add(shift)));
    if let Some(c) = spec.checkpointing.as_mut() {
        c.last_checkpoint_at = c.last_checkpoint_at.map(|t| Timestamp(t.0.saturating_add(shift)));
    }
    spec
}

/// Takes the work the file states as running into the engine where it runs (oldest start
/// first, each at its start time), with its last checkpoint; returns how many. Work the engine
/// cannot take (its devices are not free, its project's quota cannot hold it) is the file's
/// problem, reported at its `running` field, and nothing is planned.
fn adopt_running(
    engine: &mut Engine,
    workloads: &WorkloadFile,
    nodes: &[NodeSpec],
    now: Timestamp,
) -> Result<usize> {
    // (start, file index, spec, placement), oldest first.
    let mut starts: Vec<(Timestamp, usize, WorkloadSpec, Placement)> = Vec::new();
    // Shares used per (node, device) by the work placed so far.
    let mut used: BTreeMap<(usize, usize), u32> = BTreeMap::new();
    let mut shortfalls: Vec<Diagnostic> = Vec::new();
    for (i, spec) in workloads.specs().iter().enumerate() {
        let Some(running) = workloads.running(i) else { continue };
        let per_device = match spec.gpus_per_member {
            GpuRequest::Shares(s) => s,
            _ => SHARES_PER_GPU as u32,
        };
        let wanted = match spec.gpus_per_member {
            GpuRequest::Whole(k) => k as usize,
            _ => 1,
        };
        let mut model = None;
        let mut members = Vec::new();
        for m in &running.members {
            // check_workloads has made sure the node exists and the devices are valid.
            let Some(n) = nodes.iter().position(|n| n.name == m.node) else { continue };
            let node = &nodes[n];
            let accepts = |d: &allot_core::DeviceSpec| {
                spec.gpu_models.is_empty() || spec.gpu_models.contains(&d.model)
            };
            let devices: Vec<usize> = match &m.devices {
                Some(list) => list.iter().map(|&d| d as usize).collect(),
                None => {
                    let fits = |d: usize| {
                        let u = used.get(&(n, d)).copied().unwrap_or(0);
                        accepts(&node.devices[d]) && u + per_device <= SHARES_PER_GPU as u32
                    };
                    // The devices of the first model with room for the whole member.
                    let mut chosen = Vec::new();
                    for d in (0..node.devices.len()).filter(|&d| fits(d)) {
                        if chosen
                            .first()
                            .is_none_or(|&c: &usize| node.devices[c].model == node.devices[d].model)
                        {
                            chosen.push(d);
                        }
                        if chosen.len() == wanted {
                            break;
                        }
                    }
                    if chosen.len() < wanted {
                        let (line, field) = workloads.running_source(i).unwrap_or_default();
                        shortfalls.push(Diagnostic {
                            file: workloads.file().to_string(),
                            line,
                            column: 0,
                            field,
                            message: format!(
                                "{} has no {wanted} free GPU(s) of one model it accepts left for \
                                 it (the work stated before it holds the rest)",
                                node.name
                            ),
                            fix: "name the devices it runs on, or another node".to_string(),
                        });
                    }
                    chosen
                }
            };
            let mut shares = Vec::new();
            for d in devices {
                *used.entry((n, d)).or_default() += per_device;
                model = engine.model_id(&node.devices[d].model);
                shares.push(DeviceShare { device: d as u16, shares: per_device, mig: None });
            }
            members.push(MemberPlacement { node: NodeId(n as u32), devices: shares });
        }
        let start = Timestamp(now.0.saturating_sub(running.since_ms));
        starts.push((start, i, shifted(spec, now.0), Placement { model, members }));
    }
    if !shortfalls.is_empty() {
        return Err(invalid(&shortfalls));
    }
    starts.sort_by_key(|(start, i, _, _)| (*start, *i));
    let count = starts.len();
    // Starts and checkpoints in time order.
    let mut events: Vec<(Timestamp, usize, Event)> = Vec::new();
    for (start, i, spec, placement) in starts {
        let running = workloads.running(i).expect("listed above");
        if let Some(ago) = running.last_checkpoint_ago_ms {
            let at = Timestamp(now.0.saturating_sub(ago));
            events.push((at, 1, Event::CheckpointSaved { workload: spec.id }));
        }
        events.push((start, 0, Event::WorkloadAdopted { spec, placement }));
    }
    events.sort_by_key(|(at, order, _)| (*at, *order));
    for (at, _, event) in events {
        engine.apply(at, event);
    }
    let refused: Vec<(usize, WorkloadId)> = (0..workloads.specs().len())
        .filter(|&i| workloads.running(i).is_some())
        .map(|i| (i, workloads.specs()[i].id))
        .filter(|&(_, id)| engine.stage(id).is_none())
        .collect();
    if refused.is_empty() {
        return Ok(count);
    }
    // The engine says why at its next cycle; ask a copy.
    let decisions = engine.clone().decide(now);
    let problems: Vec<Diagnostic> = refused
        .into_iter()
        .map(|(i, id)| {
            let (line, field) = workloads.running_source(i).unwrap_or_default();
            let why = decisions
                .iter()
                .find(|d| d.workload() == id && matches!(d, Decision::Reject { .. }))
                .map_or_else(|| "the engine does not take it".to_string(), |d| engine.render(d));
            Diagnostic {
                file: workloads.file().to_string(),
                line,
                column: 0,
                field,
                message: format!("it cannot be running as stated: {why}"),
                fix: "give it free devices, or a project whose quota can hold it".to_string(),
            }
        })
        .collect();
    Err(invalid(&problems))
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
