//! Facts the engine is told, in past tense. The caller owns the clock: every event is applied
//! at a `Timestamp` it passes in.

use crate::ids::WorkloadId;
use crate::model::WorkloadSpec;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A user asked for a workload to run. Invalid references are rejected at the next `decide`.
    WorkloadSubmitted(WorkloadSpec),
    /// The user withdrew the workload. Pending: removed at once. Running: a `Stop` is decided.
    WorkloadCancelled { workload: WorkloadId },
    /// The backend started every member of an admitted workload: the assumed admission holds.
    AllocationStarted { workload: WorkloadId },
    /// The backend could not start an admitted workload; its devices are freed and it requeues.
    AllocationFailed { workload: WorkloadId, reason: String },
    /// The workload reported a completed checkpoint.
    CheckpointSaved { workload: WorkloadId },
    /// The workload stopped after a `Preempt` or `Stop` decision; its devices are free.
    WorkloadStopped { workload: WorkloadId },
    /// The workload exited on its own (success or failure); its devices are free.
    WorkloadFinished { workload: WorkloadId },
}

impl Event {
    pub fn workload(&self) -> WorkloadId {
        match self {
            Event::WorkloadSubmitted(spec) => spec.id,
            Event::WorkloadCancelled { workload }
            | Event::AllocationStarted { workload }
            | Event::AllocationFailed { workload, .. }
            | Event::CheckpointSaved { workload }
            | Event::WorkloadStopped { workload }
            | Event::WorkloadFinished { workload } => *workload,
        }
    }
}
