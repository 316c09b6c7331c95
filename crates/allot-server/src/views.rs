//! The engine's decisions and explanations as the API shows them: JSON with typed reason codes,
//! placements and times as text. Pure functions of the engine (no daemon state): `allot plan`
//! renders its decisions with the same functions; workloads, projects, nodes and the ledger as
//! `allot-api` types are built in `machine/records.rs`.

use allot_core::{
    AdmitReason, Decision, DeferReason, Engine, Placement, PreemptReason, RejectReason, StopReason,
    Timestamp,
};
use serde_json::{Value, json};

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
            PreemptReason::ReclaimWhileBorrowing { .. } => "reclaim_while_borrowing",
            PreemptReason::FairShare { .. } => "fair_share",
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
            DeferReason::HeldForReservation { .. } => "held_for_reservation",
            DeferReason::HeldForClaimant { .. } => "held_for_claimant",
            DeferReason::QuotaHeldForReservation { .. } => "quota_held_for_reservation",
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
