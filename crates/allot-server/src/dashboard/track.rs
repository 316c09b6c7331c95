//! What the dashboard remembers beyond the current view, kept in the `View` by the main loop
//! and bounded: cluster samples over time (for the fleet chart) and, per workload, the steps the
//! view saw it take (for its timeline). Both live in memory only and start empty at each start
//! (the timeline then begins with what the replayed record keeps: submitted, started, ended).

use std::collections::{BTreeMap, VecDeque};

use allot_api::{Workload, WorkloadState};
use allot_core::ledger::ClusterSnapshot;

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

/// One step of a workload's life.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub at_ms: u64,
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
    pub timelines: BTreeMap<u64, Vec<Step>>,
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

    /// Records the step from `old` to `new` (`old` is `None` the first time the view sees it).
    pub(crate) fn observe(&mut self, now: u64, old: Option<&Workload>, new: &Workload) {
        let steps = self.timelines.entry(new.id).or_default();
        let step = |at_ms: u64, what: &str| Step {
            at_ms,
            what: what.to_string(),
            code: new.reason_code.clone(),
            detail: new.reason.clone(),
        };
        let Some(old) = old else {
            if steps.is_empty() {
                steps.push(Step {
                    code: None,
                    detail: None,
                    ..step(new.submitted_ms, "submitted")
                });
                if let Some(at) = new.started_ms {
                    steps.push(Step { code: None, detail: None, ..step(at, "running") });
                }
                if new.state != WorkloadState::Pending && new.state != WorkloadState::Running {
                    steps.push(step(new.ended_ms.unwrap_or(now), new.state.as_str()));
                }
            }
            return;
        };
        let what = if old.state != new.state {
            Some(match (old.state, new.state) {
                (WorkloadState::Pending, WorkloadState::Starting) => "admitted",
                (WorkloadState::Suspended, WorkloadState::Pending) => "resumed",
                (WorkloadState::Stopping, WorkloadState::Pending)
                | (WorkloadState::Starting, WorkloadState::Pending) => "requeued",
                (_, state) => state.as_str(),
            })
        } else if old.reason_code != new.reason_code && new.state == WorkloadState::Running {
            if is_warned(new) {
                Some("warned")
            } else if is_warned(old) {
                Some("warning withdrawn")
            } else {
                None
            }
        } else {
            None
        };
        if let Some(what) = what {
            steps.push(step(now, what));
            if steps.len() > TIMELINE_MAX {
                // Keep the first step (submission); drop the oldest after it.
                steps.remove(1);
            }
        }
    }
}

pub(crate) fn is_warned(w: &Workload) -> bool {
    w.state == WorkloadState::Running && w.reason_code.as_deref() == Some("idle_warning")
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

    use super::{SAMPLE_MS, SAMPLES_MAX, TIMELINE_MAX, Tracker};

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
        let mut t = Tracker::default();
        let pending = w(WorkloadState::Pending, None);
        t.observe(1_000, None, &pending);
        let starting = w(WorkloadState::Starting, Some("within_guarantee"));
        t.observe(2_000, Some(&pending), &starting);
        let running = w(WorkloadState::Running, Some("within_guarantee"));
        t.observe(3_000, Some(&starting), &running);
        let warned = w(WorkloadState::Running, Some("idle_warning"));
        t.observe(4_000, Some(&running), &warned);
        t.observe(4_500, Some(&warned), &warned);
        let withdrawn = w(WorkloadState::Running, Some("within_guarantee"));
        t.observe(5_000, Some(&warned), &withdrawn);
        let suspended = w(WorkloadState::Suspended, Some("idle"));
        t.observe(6_000, Some(&withdrawn), &suspended);
        t.observe(7_000, Some(&suspended), &pending);
        let steps: Vec<&str> = t.timelines[&7].iter().map(|s| s.what.as_str()).collect();
        assert_eq!(
            steps,
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
        for k in 0..100u64 {
            let (a, b) = if k % 2 == 0 { (&pending, &starting) } else { (&starting, &pending) };
            t.observe(8_000 + k, Some(a), b);
        }
        let steps = &t.timelines[&7];
        assert_eq!(steps.len(), TIMELINE_MAX);
        assert_eq!(steps[0].what, "submitted", "the first step stays");
        assert_eq!(steps[TIMELINE_MAX - 1].at_ms, 8_099, "the latest step is kept");
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
