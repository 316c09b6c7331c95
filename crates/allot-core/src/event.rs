//! Facts the engine is told, in past tense. The caller owns the clock: every event is applied
//! at a `Timestamp` it passes in.

use crate::decision::Placement;
use crate::idle::DeviceReading;
use crate::ids::{NodeId, Timestamp, WorkloadId};
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
    /// Telemetry for the workload's allocation at this time: one reading per allocated device
    /// (each signal optional). No readings, or readings without any signal, is a telemetry
    /// gap (`idle::MissingTelemetry` says what it means).
    ActivitySampled { workload: WorkloadId, readings: Vec<DeviceReading> },
    /// An application probe (HTTP, exec, heartbeat) saw the workload in use at `last_activity`.
    ActivityProbed { workload: WorkloadId, last_activity: Timestamp },
    /// The backend found work running that allot did not start (a job submitted to Slurm
    /// directly) on these devices: the engine takes it as running there, charged to its
    /// project, and governs it like its own from now on. Refused at the next `decide`
    /// (`RejectReason::CannotAdopt`) when its project, class or model is unknown, its devices
    /// are not free, or its project's quota cannot hold it.
    WorkloadAdopted { spec: WorkloadSpec, placement: Placement },
    /// The cluster reports the node down or drained (`reason` as it says it, e.g. Slurm's
    /// `sinfo` reason). From now on no new work is placed on it (admission, pre-emption plans,
    /// defragmentation, resumes) and its free devices, CPU and memory are not counted as free.
    /// Work running there keeps its allocation until the backend reports it ended; what it
    /// then frees stays unusable until `NodeAvailable`. Adopting work that already runs there
    /// is still accepted. Quotas and guarantees do not change. A repeat only updates the
    /// reason; an unknown node is ignored.
    NodeUnavailable { node: NodeId, reason: String },
    /// The node is usable again: its unused capacity is free from now on. Ignored for a node
    /// that is not unavailable or does not exist.
    NodeAvailable { node: NodeId },
    /// These devices of the node are held by work allot does not govern (a Slurm job of
    /// another partition, or one allot refused and left running), `by` saying whose: the
    /// whole set for the node, replacing the last one (empty: none any more). Nothing new is
    /// placed on them (admission, pre-emption plans, defragmentation, resumes) and they are
    /// not free, capacity or fragmented; the node's other devices stay usable. An allocation
    /// already there keeps them; what it gives back stays held until the set drops the
    /// device. Unknown nodes and devices are ignored. CPU and memory are not taken (the
    /// cluster does not say how much such work holds).
    DevicesOccupied { node: NodeId, devices: Vec<u16>, by: String },
}

impl Event {
    /// The workload the event is about; `None` for events about the cluster (a node).
    pub fn workload(&self) -> Option<WorkloadId> {
        match self {
            Event::WorkloadSubmitted(spec) | Event::WorkloadAdopted { spec, .. } => Some(spec.id),
            Event::WorkloadCancelled { workload }
            | Event::AllocationStarted { workload }
            | Event::AllocationFailed { workload, .. }
            | Event::CheckpointSaved { workload }
            | Event::WorkloadStopped { workload }
            | Event::WorkloadFinished { workload }
            | Event::ActivitySampled { workload, .. }
            | Event::ActivityProbed { workload, .. } => Some(*workload),
            Event::NodeUnavailable { .. }
            | Event::NodeAvailable { .. }
            | Event::DevicesOccupied { .. } => None,
        }
    }
}
