//! What the dashboard remembers beyond the current view, kept in the `View` by the machine's
//! publishing and bounded: cluster samples over time (for the fleet chart, in memory only),
//! per workload a copy of the steps its daemon record keeps (durable: `Record::steps`, written
//! by `Daemon::record_steps` from `apply`, so they are in snapshots and rebuilt by a replay),
//! and what `machine/derived.rs` computes every few seconds (`Derived`).

use std::collections::{BTreeMap, VecDeque};

use allot_api::{Workload, WorkloadState};
use allot_core::ledger::ClusterSnapshot;
use serde::{Deserialize, Serialize};

/// One cluster sample every this many ms.
pub(crate) const SAMPLE_MS: u64 = 5_000;
/// Samples kept: two hours at one per 5 s.
pub(crate) const SAMPLES_MAX: usize = 1440;
/// Steps kept per workload: the first, and the latest ones.
pub(crate) const TIMELINE_MAX: usize = 32;

/// The cluster at one time, in shares (1/1000 GPU).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FleetSample {
    pub at_ms: u64,
    pub capacity_shares: u64,
    pub allocated_shares: u64,
    pub free_shares: u64,
    /// Free shares no pending request could use (the engine's measure).
    pub stranded_shares: u64,
    /// Shares held by running workloads an idle rule warned about.
    pub warned_idle_shares: u64,
    /// Shares busy by telemetry; `None`: no telemetry.
    pub active_shares: Option<u64>,
}

/// One step of a workload's life (kept in its daemon record and in snapshots).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub at_ms: u64,
    /// The record's state after the step.
    pub state: WorkloadState,
    /// `submitted`, `admitted`, `running`, `warned`, `warning withdrawn`, `stopping`,
    /// `suspended`, `resumed`, `requeued`, or a final state.
    pub what: String,
    /// The reason code and sentence the record held then.
    pub code: Option<String>,
    pub detail: Option<String>,
}

#[derive(Debug, Default)]
pub(crate) struct Tracker {
    pub samples: VecDeque<FleetSample>,
    /// Per workload, its record's steps as of the last view refresh.
    pub timelines: BTreeMap<u64, Vec<Step>>,
    /// Estimated starts, standings and the ledger per period (`derived.rs`).
    pub derived: super::Derived,
}

impl Tracker {
    /// Takes a sample if the last is `SAMPLE_MS` old (or there is none); `snapshot` is only
    /// called then (it walks every device).
    pub(crate) fn sample(
        &mut self,
        now: u64,
        snapshot: impl FnOnce() -> ClusterSnapshot,
        workloads: &BTreeMap<u64, Workload>,
        active_shares: Option<u64>,
    ) {
        if self.samples.back().is_some_and(|s| now.saturating_sub(s.at_ms) < SAMPLE_MS) {
            return;
        }
        let snapshot = snapshot();
        let warned_idle_shares = workloads.values().filter(|w| is_warned(w)).map(shares_of).sum();
        self.samples.push_back(FleetSample {
            at_ms: now,
            capacity_shares: snapshot.capacity_shares,
            allocated_shares: snapshot.allocated_shares,
            free_shares: snapshot.free_shares,
            stranded_shares: snapshot.fragmented_shares,
            warned_idle_shares,
            active_shares,
        });
        while self.samples.len() > SAMPLES_MAX {
            self.samples.pop_front();
        }
    }

    /// Copies a changed workload's steps; a record without any (restored from a snapshot of
    /// a version that kept none) gets what its fields say: submitted, started, ended.
    pub(crate) fn observe(&mut self, new: &Workload, steps: &[Step]) {
        let timeline = if steps.is_empty() { steps_from_record(new) } else { steps.to_vec() };
        self.timelines.insert(new.id, timeline);
    }
}

fn steps_from_record(w: &Workload) -> Vec<Step> {
    let step = |at_ms: u64, state: WorkloadState, what: &str| Step {
        at_ms,
        state,
        what: what.to_string(),
        code: None,
        detail: None,
    };
    let mut steps = vec![step(w.submitted_ms, WorkloadState::Pending, "submitted")];
    if let Some(at) = w.started_ms {
        steps.push(step(at, WorkloadState::Running, "running"));
    }
    if let Some(at) = w.ended_ms.filter(|_| w.state != WorkloadState::Running) {
        steps.push(Step {
            code: w.reason_code.clone(),
            detail: w.reason.clone(),
            ..step(at, w.state, w.state.as_str())
        });
    }
    steps
}

/// The step a workload takes from `last` (its latest step, `None` for a new record) to
/// `state` with `reason`, if any: a change of state, or a running workload warned for
/// idleness or no longer warned.
fn next_step(
    last: Option<&Step>,
    state: WorkloadState,
    reason: Option<&(String, String)>,
) -> Option<String> {
    let Some(last) = last else { return Some("submitted".into()) };
    let code = reason.map(|(c, _)| c.as_str());
    if last.state != state {
        return Some(
            match (last.state, state) {
                (WorkloadState::Pending, WorkloadState::Starting) => "admitted",
                (WorkloadState::Suspended, WorkloadState::Pending) => "resumed",
                (WorkloadState::Stopping, WorkloadState::Pending)
                | (WorkloadState::Starting, WorkloadState::Pending) => "requeued",
                (_, state) => state.as_str(),
            }
            .to_string(),
        );
    }
    let warned_before = last.code.as_deref() == Some(IDLE_WARNING);
    let warned_now = code == Some(IDLE_WARNING);
    match (state, warned_before, warned_now) {
        (WorkloadState::Running, false, true) => Some("warned".into()),
        (WorkloadState::Running, true, false) => Some("warning withdrawn".into()),
        _ => None,
    }
}

const IDLE_WARNING: &str = "idle_warning";

/// Appends the step a record took to `state` with `reason` at `now`, if it took one; keeps at
/// most `TIMELINE_MAX` steps: the first (submission) and the latest.
pub(crate) fn push_step(
    steps: &mut Vec<Step>,
    now: u64,
    submitted_ms: u64,
    state: WorkloadState,
    reason: Option<&(String, String)>,
) {
    let Some(what) = next_step(steps.last(), state, reason) else { return };
    let (code, detail) = reason.cloned().map_or((None, None), |(c, d)| (Some(c), Some(d)));
    if steps.is_empty() {
        steps.push(Step {
            at_ms: submitted_ms,
            state: WorkloadState::Pending,
            what,
            code: None,
            detail: None,
        });
        // Rejected at submission: that step follows at once.
        if state != WorkloadState::Pending {
            steps.push(Step { at_ms: now, state, what: state.as_str().to_string(), code, detail });
        }
        return;
    }
    steps.push(Step { at_ms: now, state, what, code, detail });
    if steps.len() > TIMELINE_MAX {
        steps.remove(1);
    }
}

pub(crate) fn is_warned(w: &Workload) -> bool {
    w.state == WorkloadState::Running && w.reason_code.as_deref() == Some(IDLE_WARNING)
}

/// Shares a workload holds: GPUs per member × members (a MIG profile counts as unknown, 0).
pub(crate) fn shares_of(w: &Workload) -> u64 {
    let per_member = w.gpus.parse::<f64>().unwrap_or(0.0);
    if per_member.is_finite() && per_member > 0.0 {
        (per_member * 1000.0).round() as u64 * u64::from(w.members.max(1))
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use allot_api::{Workload, WorkloadState};
    use allot_core::ledger::ClusterSnapshot;

    use super::{SAMPLE_MS, SAMPLES_MAX, TIMELINE_MAX, Tracker, push_step};

    fn w(state: WorkloadState, code: Option<&str>) -> Workload {
        Workload {
            id: 7,
            name: "n".into(),
            project: "p".into(),
            user: "u".into(),
            kind: "notebook".into(),
            state,
            gpus: "0.5".into(),
            members: 2,
            command: vec![],
            submitted_ms: 1_000,
            started_ms: None,
            ended_ms: None,
            exit_code: None,
            attempt: 0,
            reason: None,
            reason_code: code.map(str::to_string),
            placement: vec![],
            pids: vec![],
            last_checkpoint_ms: None,
            last_activity_ms: None,
        }
    }

    #[test]
    fn steps_are_named_by_transition_and_bounded() {
        let mut steps = Vec::new();
        let reason = |code: &str| Some((code.to_string(), format!("{code} sentence")));
        let at = |steps: &mut Vec<super::Step>, ms, state, code: Option<(String, String)>| {
            push_step(steps, ms, 1_000, state, code.as_ref());
        };
        at(&mut steps, 1_000, WorkloadState::Pending, None);
        at(&mut steps, 1_500, WorkloadState::Pending, reason("quota_exhausted"));
        at(&mut steps, 2_000, WorkloadState::Starting, reason("within_guarantee"));
        at(&mut steps, 3_000, WorkloadState::Running, reason("within_guarantee"));
        at(&mut steps, 4_000, WorkloadState::Running, reason("idle_warning"));
        at(&mut steps, 4_500, WorkloadState::Running, reason("idle_warning"));
        at(&mut steps, 5_000, WorkloadState::Running, reason("within_guarantee"));
        at(&mut steps, 6_000, WorkloadState::Suspended, reason("idle"));
        at(&mut steps, 7_000, WorkloadState::Pending, reason("resumed"));
        let names: Vec<&str> = steps.iter().map(|s| s.what.as_str()).collect();
        assert_eq!(
            names,
            [
                "submitted",
                "admitted",
                "running",
                "warned",
                "warning withdrawn",
                "suspended",
                "resumed"
            ]
        );
        assert_eq!(steps[3].code.as_deref(), Some("idle_warning"), "a step keeps its reason");
        assert_eq!(steps[0].at_ms, 1_000);
        for k in 0..100u64 {
            let state = if k % 2 == 0 { WorkloadState::Starting } else { WorkloadState::Pending };
            at(&mut steps, 8_000 + k, state, None);
        }
        assert_eq!(steps.len(), TIMELINE_MAX);
        assert_eq!(steps[0].what, "submitted", "the first step stays");
        assert_eq!(steps[TIMELINE_MAX - 1].at_ms, 8_099, "the latest step is kept");
    }

    #[test]
    fn work_rejected_at_submission_has_both_steps() {
        let mut steps = Vec::new();
        let reason = ("invalid_under_policy".to_string(), "no such project".to_string());
        push_step(&mut steps, 5_000, 5_000, WorkloadState::Rejected, Some(&reason));
        let names: Vec<&str> = steps.iter().map(|s| s.what.as_str()).collect();
        assert_eq!(names, ["submitted", "rejected"]);
    }

    #[test]
    fn samples_come_every_interval_and_are_bounded() {
        let mut t = Tracker::default();
        let mut workloads = BTreeMap::new();
        workloads.insert(7, w(WorkloadState::Running, Some("idle_warning")));
        let snapshot = || ClusterSnapshot {
            capacity_shares: 8000,
            allocated_shares: 1000,
            free_shares: 7000,
            fragmented_shares: 0,
            unmanaged_shares: 0,
        };
        let mut asked = 0;
        for k in 0..(SAMPLES_MAX as u64 + 10) * 5 {
            t.sample(
                k * SAMPLE_MS / 5,
                || {
                    asked += 1;
                    snapshot()
                },
                &workloads,
                None,
            );
        }
        assert_eq!(asked, SAMPLES_MAX + 10, "the snapshot is taken only when a sample is due");
        assert_eq!(t.samples.len(), SAMPLES_MAX);
        let last = t.samples.back().copied().unwrap_or_default();
        assert_eq!(last.warned_idle_shares, 1000, "0.5 GPU × 2 members");
        assert_eq!(last.active_shares, None, "no telemetry is not 0");
    }
}
