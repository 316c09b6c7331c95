//! The engine's state as the API shows it: decisions and explanations as JSON with typed
//! reason codes, workloads, projects, nodes and the ledger as `allot-api` types. `allot plan`
//! renders its decisions with the same functions.

use allot_api::{Device, LedgerRow, Node, Project, QuotaLine, Workload};
use allot_core::ledger::{Books, Ledger, Scope};
use allot_core::{
    AdmitReason, Decision, DeferReason, Engine, Placement, PreemptReason, ProjectId, RejectReason,
    StopReason, Timestamp,
};
use serde_json::{Value, json};

use crate::daemon::Record;
use crate::submit::gpus_text;

pub(crate) fn name(engine: &Engine, id: allot_core::WorkloadId) -> String {
    engine.workload_name(id).map_or_else(|| format!("#{id}"), str::to_string)
}

pub fn reason_code(d: &Decision) -> &'static str {
    match d {
        Decision::Admit { reason, .. } => match reason {
            AdmitReason::WithinGuarantee { .. } => "within_guarantee",
            AdmitReason::Borrowing { .. } => "borrowing",
            AdmitReason::NoGpuRequested => "no_gpu_requested",
        },
        Decision::Preempt { reason, .. } => match reason {
            PreemptReason::QuotaReclaim { .. } => "quota_reclaim",
            PreemptReason::Priority { .. } => "priority",
            PreemptReason::Defragment { .. } => "defragment",
            PreemptReason::Idle { .. } => "idle",
        },
        Decision::Warn { .. } => "idle_warning",
        Decision::Reclaim { .. } => "idle",
        Decision::Stop { reason, .. } => match reason {
            StopReason::Cancelled => "cancelled",
            StopReason::MaxRuntimeExceeded { .. } => "max_runtime_exceeded",
        },
        Decision::Defer { reason, .. } => match reason {
            DeferReason::NoQuotaForModel { .. } => "no_quota_for_model",
            DeferReason::ExceedsMaxQuota { .. } => "exceeds_max_quota",
            DeferReason::QuotaExhausted { .. } => "quota_exhausted",
            DeferReason::NoPlacement(_) => "no_placement",
            DeferReason::NodesUnavailable { .. } => "nodes_unavailable",
            DeferReason::NeverPlaceable { .. } => "never_placeable",
            DeferReason::NoMigProfile { .. } => "no_mig_profile",
            DeferReason::WaitingForPreemption { .. } => "waiting_for_preemption",
            DeferReason::BlockedByFifo { .. } => "blocked_by_fifo",
            DeferReason::IdleBackoff { .. } => "idle_backoff",
            DeferReason::AwaitingUse { .. } => "awaiting_use",
        },
        Decision::Reject { reason, .. } => match reason {
            RejectReason::UnknownProject { .. } => "unknown_project",
            RejectReason::UnknownPriorityClass { .. } => "unknown_priority_class",
            RejectReason::UnknownModel { .. } => "unknown_model",
            RejectReason::DuplicateId => "duplicate_id",
            RejectReason::InvalidRequest { .. } => "invalid_request",
            RejectReason::CannotAdopt { .. } => "cannot_adopt",
        },
    }
}

pub fn decision_json(engine: &Engine, d: &Decision) -> Value {
    let mut v = json!({
        "workload": engine.decision_subject(d),
        "id": d.workload().0,
        "action": d.action(),
        "reason": engine.render_reason(d),
        "reason_code": reason_code(d),
    });
    match d {
        Decision::Admit { placement, .. } => {
            v["gpu_model"] = json!(placement.model.map(|m| engine.model_name(m)));
            v["placement"] = placement
                .members
                .iter()
                .map(|m| {
                    json!({
                        "node": engine.node_name(m.node),
                        "devices": m.devices.iter().map(|d| {
                            let mut dev = json!({"index": d.device, "shares": d.shares});
                            if let Some(slot) = d.mig {
                                dev["mig"] = json!(slot.to_string());
                            }
                            dev
                        }).collect::<Vec<_>>(),
                    })
                })
                .collect();
        }
        Decision::Preempt { for_workload, mode, checkpoint_grace_ms, reason, .. } => {
            v["for_workload"] = json!(name(engine, *for_workload));
            v["mode"] = json!(mode.as_str());
            v["checkpoint_grace_ms"] = json!(checkpoint_grace_ms);
            if let PreemptReason::Defragment {
                model,
                node,
                frees_block,
                gain_gpu_ms,
                cost_gpu_ms,
                replaceable,
            } = reason
            {
                v["defragment"] = json!({
                    "gpu_model": engine.model_name(*model),
                    "node": engine.node_name(*node),
                    "frees_block": frees_block,
                    "gain_gpu_ms": gain_gpu_ms,
                    "cost_gpu_ms": cost_gpu_ms,
                    "replaceable": replaceable,
                });
            }
        }
        _ => {}
    }
    v
}

pub fn explain_json(engine: &Engine, now: Timestamp, id: allot_core::WorkloadId) -> Value {
    match engine.explain(now, id) {
        Some(e) => {
            let text = engine.render_explanation(&e);
            json!(text.lines().skip(1).map(str::trim).collect::<Vec<_>>())
        }
        None => Value::Null,
    }
}

/// A placement as `node: devices` lines (`gpu-01: 0,1`, `gpu-02: 3 (250‰)`, `… 2 (3g.40gb@4)`).
pub(crate) fn placement_lines(engine: &Engine, placement: &Placement) -> Vec<String> {
    placement
        .members
        .iter()
        .map(|m| {
            let devices: Vec<String> = m
                .devices
                .iter()
                .map(|d| match d.mig {
                    Some(slot) => format!("{} ({slot})", d.device),
                    None if d.shares < 1000 => format!("{} ({}‰)", d.device, d.shares),
                    None => d.device.to_string(),
                })
                .collect();
            format!("{}: {}", engine.node_name(m.node), devices.join(","))
        })
        .collect()
}

pub(crate) fn workload(id: u64, r: &Record) -> Workload {
    Workload {
        id,
        name: r.spec.name.clone(),
        project: r.spec.project.clone(),
        user: r.spec.user.clone(),
        kind: r.spec.kind.as_str().to_string(),
        state: r.state,
        gpus: gpus_text(&r.spec.gpus_per_member),
        members: r.spec.members,
        command: r.request.command.clone(),
        submitted_ms: r.submitted_ms,
        started_ms: r.started_ms,
        ended_ms: r.ended_ms,
        exit_code: r.exit_code,
        attempt: r.attempt,
        reason: r.reason.as_ref().map(|(_, text)| text.clone()),
        reason_code: r.reason.as_ref().map(|(code, _)| code.clone()),
        placement: r.placement.clone(),
        pids: r.pids.clone(),
        last_checkpoint_ms: r.last_checkpoint_ms,
        last_activity_ms: r.last_activity_ms,
    }
}

pub(crate) fn projects<'a>(
    engine: &Engine,
    records: impl Iterator<Item = &'a Record>,
) -> Vec<Project> {
    let mut counts = vec![(0u64, 0u64); engine.project_count()];
    for r in records {
        if let Some(p) = engine.project_id(&r.spec.project) {
            let c = &mut counts[p.0 as usize];
            match r.state {
                allot_api::WorkloadState::Pending => c.0 += 1,
                allot_api::WorkloadState::Starting
                | allot_api::WorkloadState::Running
                | allot_api::WorkloadState::Stopping => c.1 += 1,
                _ => {}
            }
        }
    }
    (0..engine.project_count())
        .map(|p| {
            let id = ProjectId(p as u32);
            Project {
                name: engine.project_name(id).to_string(),
                cohort: engine.project_cohort(id).map(str::to_string),
                department: engine.project_department(id).map(str::to_string),
                quota: engine
                    .project_lines(id)
                    .into_iter()
                    .map(|(k, used, g, b, l)| QuotaLine {
                        model: engine.key_name(k).to_string(),
                        used_gpus: used.to_string(),
                        guaranteed_gpus: g.to_string(),
                        borrow_limit_gpus: b.map(|b| b.to_string()),
                        lend_limit_gpus: l.map(|l| l.to_string()),
                    })
                    .collect(),
                pending: counts[p].0,
                running: counts[p].1,
            }
        })
        .collect()
}

/// Nodes and devices with what runs on them, from the records' placements.
pub(crate) fn nodes<'a>(
    engine: &Engine,
    nodes: &[allot_core::NodeSpec],
    unusable: &std::collections::BTreeMap<String, String>,
    records: impl Iterator<Item = (&'a u64, &'a Record)>,
) -> Vec<Node> {
    let mut out: Vec<Node> = nodes
        .iter()
        .map(|n| Node {
            unusable: unusable.get(&n.name).cloned(),
            name: n.name.clone(),
            devices: n
                .devices
                .iter()
                .enumerate()
                .map(|(i, d)| Device {
                    index: i as u32,
                    model: d.model.clone(),
                    used_shares: 0,
                    workloads: Vec::new(),
                })
                .collect(),
        })
        .collect();
    for (id, _) in records {
        let Some(placement) = engine.placement(allot_core::WorkloadId(*id)) else { continue };
        for m in &placement.members {
            let Some(node) = out.get_mut(m.node.0 as usize) else { continue };
            for d in &m.devices {
                if let Some(dev) = node.devices.get_mut(usize::from(d.device)) {
                    dev.used_shares += u64::from(d.shares);
                    if dev.workloads.last() != Some(id) {
                        dev.workloads.push(*id);
                    }
                }
            }
        }
    }
    out
}

fn ledger_row(scope: String, b: &Books) -> LedgerRow {
    let hours = |v: u128| Books::gpu_hours(v);
    LedgerRow {
        scope,
        allocated_gpu_hours: hours(b.allocated),
        active_gpu_hours: hours(b.active),
        measured_gpu_hours: hours(b.measured),
        idle_allocated_gpu_hours: hours(b.idle_allocated()),
        lost_gpu_hours: hours(b.lost_to_preemption),
        useful_gpu_hours: hours(b.useful()),
        goodput: (b.allocated > 0).then(|| b.goodput()),
    }
}

/// The ledger's totals per scope (cluster first, then projects, users, workloads) as of `now`:
/// open books are closed on a copy.
pub(crate) fn report(ledger: &Ledger, now: u64) -> Vec<LedgerRow> {
    let mut closed = ledger.clone();
    closed.close(Timestamp(now));
    closed
        .scopes()
        .into_iter()
        .map(|scope| {
            let name = match &scope {
                Scope::Cluster => "cluster".to_string(),
                Scope::Project(p) => format!("project:{p}"),
                Scope::User(u) => format!("user:{u}"),
                Scope::Workload(w) => format!("workload:{}", w.0),
            };
            ledger_row(name, &closed.total(&scope))
        })
        .collect()
}

/// The engine writes times as `t=<ms> ms` (its clock is abstract); the daemon's clock is the
/// Unix epoch, so these become UTC times (`2026-11-30 13:44:51 UTC`) for people.
pub(crate) fn humanize_times(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("t=") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        let (number, tail) = after.split_at(digits);
        match (number.parse::<u64>(), tail.strip_prefix(" ms")) {
            // Only plausible epoch times (after 2001); small numbers stay as they are.
            (Ok(ms), Some(tail)) if ms >= 1_000_000_000_000 => {
                out.push_str(&utc(ms));
                rest = tail;
            }
            _ => {
                out.push_str("t=");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// `YYYY-MM-DD hh:mm:ss UTC` from ms since the Unix epoch.
pub(crate) fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let (h, m, s) = ((secs % 86_400) / 3600, (secs % 3600) / 60, secs % 60);
    let (year, month, day) = allot_core::civil_from_days(days);
    format!("{year:04}-{month:02}-{day:02} {h:02}:{m:02}:{s:02} UTC")
}

#[cfg(test)]
mod tests {
    use super::{humanize_times, utc};

    #[test]
    fn epoch_times_become_utc_and_small_ones_stay() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_796_046_291_054), "2026-11-30 13:44:51 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(
            humanize_times("will suspend at t=1796046291054 ms unless; at t=5000 ms; t=x"),
            "will suspend at 2026-11-30 13:44:51 UTC unless; at t=5000 ms; t=x"
        );
    }
}
