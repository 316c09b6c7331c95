//! What the daemon writes to its log before acting: every input, in order, with its time.
//! Replaying the entries through a fresh `Daemon` rebuilds exactly the same state, because the
//! engine is deterministic and `Decided` marks when each cycle ran.

use allot_api::SubmitRequest;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
// `Submitted` carries the whole request; entries live only between the log and `apply`.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Entry {
    Submitted {
        id: u64,
        user: String,
        request: SubmitRequest,
    },
    CancelRequested {
        id: u64,
    },
    SuspendRequested {
        id: u64,
    },
    ResumeRequested {
        id: u64,
    },
    Started {
        id: u64,
        attempt: u32,
        pids: Vec<u32>,
    },
    /// `requeue`: the failure was the daemon's (it stopped while launching), so the workload
    /// queues again instead of failing.
    LaunchFailed {
        id: u64,
        attempt: u32,
        error: String,
        #[serde(default)]
        requeue: bool,
    },
    Exited {
        id: u64,
        attempt: u32,
        code: Option<i32>,
        detail: String,
        /// Ended by its owner outside allot (`Observation::Cancelled`): cancelled, not failed.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        cancelled: bool,
    },
    /// The workload's heartbeat file changed: it was in use at `last_activity_ms`.
    Probed {
        id: u64,
        last_activity_ms: u64,
    },
    /// The workload reported a checkpoint made at `at_ms` (its checkpoint file's time, or the
    /// API call's).
    CheckpointReported {
        id: u64,
        at_ms: u64,
    },
    /// A telemetry round's readings of running workloads' devices (only workloads with at
    /// least one reading carrying a signal; the others are in `TelemetryMissing`).
    Sampled {
        #[serde(with = "u64_keys")]
        workloads: std::collections::BTreeMap<u64, Vec<super::attribution::Reading>>,
    },
    /// A telemetry round found no reading for these running workloads (no collector covers
    /// their devices yet): each idle rule's `missing_telemetry` says what that means.
    TelemetryMissing {
        ids: Vec<u64>,
    },
    /// A decision cycle ran at the entry's time.
    Decided,
    /// Work found on the cluster that allot did not start (a job submitted to Slurm directly),
    /// imported under its account as project. Running (`running` not empty): adopted where it
    /// runs. Pending: it queues like a submission, held by the backend until allot admits it.
    Imported {
        id: u64,
        user: String,
        request: SubmitRequest,
        /// The backend's handle (the Slurm job id).
        handle: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        running: Vec<allot_backend::MemberLaunch>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        started_ms: Option<u64>,
        /// Why the backend says it cannot be governed as asked: imported as rejected.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        refusal: Option<String>,
    },
    /// Imported pending work left the cluster before allot admitted it (cancelled in Slurm).
    ForeignGone {
        id: u64,
    },
    /// The devices a started run actually holds, where the backend picked them itself (Slurm's
    /// GRES binding): telemetry is attributed by these.
    DevicesReported {
        id: u64,
        attempt: u32,
        members: Vec<allot_backend::MemberLaunch>,
    },
    /// The backend kept a stopped run's work for the workload's next attempt (`attempt`):
    /// a Slurm job requeued held. Cancelling the workload must drop it.
    Kept {
        id: u64,
        attempt: u32,
    },
    /// A node became unusable for new work (down, drained) or usable again.
    NodeState {
        node: String,
        usable: bool,
        reason: String,
    },
    /// The devices of `node` held now by work allot does not govern (the whole set; empty:
    /// none), where that differs from what the engine was told: a job of an unmanaged
    /// partition, or foreign work allot refused and left running. `by` names that work.
    Occupied {
        node: String,
        devices: Vec<u32>,
        by: String,
    },
    /// The backend's inventory now, where it differs from the engine's (at a start, or seen
    /// by a cluster watch): taken as far as live work allows (`inventory.rs`).
    InventoryReported {
        nodes: Vec<super::wire::SavedNode>,
    },
    /// The backend stopped answering (Slurm's controller is down): no node takes new work
    /// until `BackendReachable`; running work runs on.
    BackendUnreachable {
        error: String,
    },
    BackendReachable,
    /// The backend could not take a launch now (unreachable): the workload queues again.
    LaunchDeferred {
        id: u64,
        attempt: u32,
        error: String,
    },
    /// `allot policy apply` (or a restart with another policy file): live work moves to this
    /// policy (`Engine::with_policy`); checked before it is logged.
    PolicyApplied {
        source: String,
        text: String,
        /// The admin who applied it; absent for a policy file read at a start (and in logs
        /// written before policies were versioned).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
        /// The version it brings back (`allot policy rollback`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rollback_of: Option<u32>,
        /// A scoped rollout (`--scope`): `text` is the active policy with the candidate's
        /// rules for the scope, and these are its conditions.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rollout: Option<super::rollout::RolloutPlan>,
        /// Why it was applied, when allot applied it itself (a rollback condition tripped).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        why: Option<String>,
        /// The what-if the dashboard showed for this text before it was applied.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        whatif: Option<allot_api::WhatIfShown>,
    },
    /// `allot policy apply FILE --shadow`: the candidate decides beside the active policy
    /// from now on (replacing a shadow already running); checked before it is logged.
    ShadowStarted {
        source: String,
        text: String,
        by: String,
    },
    /// The shadow stopped (`allot policy shadow --stop`).
    ShadowStopped,
}

/// Every record kind, in declaration order: the round-trip property test generates each of
/// them and fails on a kind it does not cover.
#[cfg(test)]
pub(crate) const ENTRY_KINDS: [&str; 25] = [
    "submitted",
    "cancel_requested",
    "suspend_requested",
    "resume_requested",
    "started",
    "launch_failed",
    "exited",
    "probed",
    "checkpoint_reported",
    "telemetry_missing",
    "sampled",
    "decided",
    "policy_applied",
    "imported",
    "foreign_gone",
    "node_state",
    "devices_reported",
    "kept",
    "inventory_reported",
    "backend_unreachable",
    "backend_reachable",
    "launch_deferred",
    "occupied",
    "shadow_started",
    "shadow_stopped",
];

impl Entry {
    /// The store's record kind.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Entry::Submitted { .. } => "submitted",
            Entry::CancelRequested { .. } => "cancel_requested",
            Entry::SuspendRequested { .. } => "suspend_requested",
            Entry::ResumeRequested { .. } => "resume_requested",
            Entry::Started { .. } => "started",
            Entry::LaunchFailed { .. } => "launch_failed",
            Entry::Exited { .. } => "exited",
            Entry::Probed { .. } => "probed",
            Entry::CheckpointReported { .. } => "checkpoint_reported",
            Entry::TelemetryMissing { .. } => "telemetry_missing",
            Entry::Sampled { .. } => "sampled",
            Entry::Decided => "decided",
            Entry::PolicyApplied { .. } => "policy_applied",
            Entry::Imported { .. } => "imported",
            Entry::ForeignGone { .. } => "foreign_gone",
            Entry::NodeState { .. } => "node_state",
            Entry::DevicesReported { .. } => "devices_reported",
            Entry::Kept { .. } => "kept",
            Entry::InventoryReported { .. } => "inventory_reported",
            Entry::BackendUnreachable { .. } => "backend_unreachable",
            Entry::BackendReachable => "backend_reachable",
            Entry::LaunchDeferred { .. } => "launch_deferred",
            Entry::Occupied { .. } => "occupied",
            Entry::ShadowStarted { .. } => "shadow_started",
            Entry::ShadowStopped => "shadow_stopped",
        }
    }
}

/// A map keyed by ids inside an entry. JSON object keys are strings, and an internally tagged
/// enum (`kind`) buffers its fields before decoding them, which loses serde_json's conversion
/// of `"1"` into `1`: the keys are read as strings and parsed here. (Every log written so far
/// has them as strings, so the encoding stays as it is.)
mod u64_keys {
    use std::collections::BTreeMap;

    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<S: Serializer, V: Serialize>(
        map: &BTreeMap<u64, V>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        map.serialize(serializer)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>, V: Deserialize<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<u64, V>, D::Error> {
        BTreeMap::<String, V>::deserialize(deserializer)?
            .into_iter()
            .map(|(key, value)| {
                key.parse::<u64>().map(|id| (id, value)).map_err(|_| {
                    D::Error::custom(format!("workload id {key:?} is not a whole number"))
                })
            })
            .collect()
    }
}
