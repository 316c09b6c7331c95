//! The REST API's wire types, shared by `allot-server` and the `allot` CLI.
//!
//! These are edge types (STYLE.md rule 4): they derive `Serialize`/`Deserialize` and OpenAPI
//! schemas; the core's types do not, and the server converts explicitly. Requests refuse unknown
//! fields so a misspelt field is an error naming it, never silently ignored.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The API's path prefix.
pub const API_PREFIX: &str = "/api/v1";

/// Limits on what one request may ask; the server refuses more with a 400 naming the field.
pub mod limits {
    /// Largest request body, in bytes.
    pub const BODY_BYTES_MAX: usize = 256 * 1024;
    pub const NAME_CHARS_MAX: usize = 200;
    /// A probe's URL.
    pub const URL_CHARS_MAX: usize = 2000;
    /// A probe's JSON pointer.
    pub const POINTER_CHARS_MAX: usize = 1000;
    /// A probe command's program and arguments.
    pub const PROBE_ARGS_MAX: usize = 64;
    /// A device's index on its node (and a MIG instance's or AMD partition's).
    pub const DEVICE_INDEX_MAX: u32 = 1023;
    /// Latest time a reading may carry: the end of year 9999, in ms since the epoch.
    pub const TIME_MS_MAX: u64 = 253_402_300_799_999;
    pub const MEMBERS_MAX: u32 = 1024;
    pub const GPUS_PER_MEMBER_MAX: u32 = 64;
    pub const COMMAND_ARGS_MAX: usize = 4096;
    pub const ENV_VARS_MAX: usize = 256;
    /// 10 years: longer is a mistake, not a plan.
    pub const DURATION_S_MAX: u64 = 10 * 365 * 24 * 3600;
    pub const CPU_MILLIS_MAX: u64 = 100_000_000;
    pub const MEMORY_MIB_MAX: u64 = 1 << 40;
    /// Device readings in one `POST /api/v1/telemetry`.
    pub const TELEMETRY_SAMPLES_MAX: usize = 1024;
    /// Most of a log one `GET /api/v1/workloads/{id}/logs` returns (`?tail_bytes=`).
    pub const LOG_TAIL_BYTES_MAX: u64 = 16 * 1024 * 1024;
    /// Jobs in one `GET /api/v1/history` (the newest; `?limit=` asks for fewer).
    pub const HISTORY_JOBS_MAX: usize = 100_000;
}

/// Device readings a node agent (`allot agent`) forwards (`POST /api/v1/telemetry`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TelemetryPost {
    pub samples: Vec<TelemetrySample>,
}

/// One device (or MIG instance, or AMD partition) at one time. Activity values are permille
/// (0..=1000) of the device; an absent value is not 0.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySample {
    /// The node, as the inventory names it.
    pub hostname: String,
    /// The device's index on its node.
    pub gpu_index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_instance: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amd_partition: Option<u32>,
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilisation: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_active: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_active: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_used_mib: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_total_mib: Option<u64>,
}

/// A workload to run (`POST /api/v1/workloads`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// Shown in lists; defaults to the program's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub project: String,
    /// `training`, `batch`, `notebook`, `inference` or `service`; default `batch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// GPUs per member: a whole number, or a fraction below 1 (e.g. 0.25) for a share of one
    /// device. 0 for CPU-only work. Exclusive with `mig`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<f64>,
    /// A MIG profile per member (e.g. `1g.10gb`), instead of `gpus`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<String>,
    /// Gang size: all members start together or none does. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<u32>,
    /// Acceptable GPU models in order of preference; empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_models: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// All members on one node.
    #[serde(default)]
    pub same_node: bool,
    /// `false` makes the workload non-preemptible (a preemptible class cannot be granted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemptible: Option<bool>,
    /// Seconds between the checkpoint signal and the stop; absent: not checkpointable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_grace_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_runtime_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_runtime_s: Option<u64>,
    /// argv of every member; the first element is the program.
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// How allot sees the workload in use besides its GPUs (its heartbeat file always counts):
    /// asked every 15 s while it runs; a use it reports vetoes idleness.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<Probe>,
}

/// An application probe (PRODUCT.md: idle reclaim's vetoes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Probe {
    /// `GET url`; the JSON pointer names the last-activity time in the answer (RFC 3339 text
    /// or seconds since the epoch), e.g. a Jupyter server's `/api/status` and
    /// `/last_activity`.
    Http { url: String, pointer: String },
    /// A command run on the daemon's host; exit 0 means "in use now".
    Exec { command: Vec<String> },
}

/// Where a workload is, as the API reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkloadState {
    /// Waiting for GPUs (see `why`).
    Pending,
    /// Admitted; the backend is starting it.
    Starting,
    Running,
    /// Told to stop (pre-empted, reclaimed, cancelled, suspended); still holds its GPUs.
    Stopping,
    /// Stopped by its user; `resume` queues it again.
    Suspended,
    /// Ended on its own with exit code 0.
    Succeeded,
    /// Ended on its own with a non-zero code, or its status could not be learned.
    Failed,
    Cancelled,
    /// The engine refused it (unknown project, impossible request).
    Rejected,
}

impl WorkloadState {
    /// Every state, in lifecycle order.
    pub const ALL: [WorkloadState; 9] = [
        WorkloadState::Pending,
        WorkloadState::Starting,
        WorkloadState::Running,
        WorkloadState::Stopping,
        WorkloadState::Suspended,
        WorkloadState::Succeeded,
        WorkloadState::Failed,
        WorkloadState::Cancelled,
        WorkloadState::Rejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadState::Pending => "pending",
            WorkloadState::Starting => "starting",
            WorkloadState::Running => "running",
            WorkloadState::Stopping => "stopping",
            WorkloadState::Suspended => "suspended",
            WorkloadState::Succeeded => "succeeded",
            WorkloadState::Failed => "failed",
            WorkloadState::Cancelled => "cancelled",
            WorkloadState::Rejected => "rejected",
        }
    }

    /// No further change will happen.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            WorkloadState::Succeeded
                | WorkloadState::Failed
                | WorkloadState::Cancelled
                | WorkloadState::Rejected
        )
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Workload {
    pub id: u64,
    pub name: String,
    pub project: String,
    pub user: String,
    pub kind: String,
    pub state: WorkloadState,
    /// Per member: whole GPUs (`2`), a share (`0.25`) or a MIG profile.
    pub gpus: String,
    pub members: u32,
    pub command: Vec<String>,
    pub submitted_ms: u64,
    /// When its latest run started; requeued or suspended, it keeps that run's start until
    /// the next one (`attempt` counts the runs, `placement` is empty while it holds none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Runs so far (a requeue or resume starts the next attempt).
    pub attempt: u32,
    /// The last decision's reason in words (why it waits, why it was stopped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Machine-readable code of that reason (`quota_exhausted`, `idle`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_code: Option<String>,
    /// Where it runs: `node: devices`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placement: Vec<String>,
    /// Process (group) ids of its members while it runs, as the backend reported them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pids: Vec<u32>,
    /// When it last reported a checkpoint (`$ALLOT_CHECKPOINT_FILE` touched, or
    /// `POST …/checkpoint`): work before it survives a stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checkpoint_ms: Option<u64>,
    /// The last use an application probe or the heartbeat file reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_activity_ms: Option<u64>,
}

impl Workload {
    /// What it asks for, the same in the CLI and the dashboard: `4`, `0.25`, `1g.10gb`, or
    /// `2×4` for a gang of two members of 4 GPUs each (members first, as `--members 2
    /// --gpus 4` and "2 nodes of 4" say it).
    pub fn size(&self) -> String {
        if self.members > 1 {
            format!("{}×{}", self.members, self.gpus)
        } else {
            self.gpus.clone()
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SubmitResponse {
    pub id: u64,
    pub state: WorkloadState,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WorkloadList {
    pub workloads: Vec<Workload>,
}

/// `GET /workloads/{id}/why`: the explanation in sentences plus the facts behind it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Why {
    pub id: u64,
    pub name: String,
    pub state: WorkloadState,
    /// One sentence per line: stage, queue position, blocking facts, counterfactuals.
    pub lines: Vec<String>,
    /// What a cycle run now would decide, with its typed reason (pending work only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub decision: Option<serde_json::Value>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QuotaLine {
    pub model: String,
    /// GPUs of this model the project holds now (fractions for shared GPUs: 0.5).
    pub used_gpus: f64,
    pub guaranteed_gpus: f64,
    /// Most it may borrow from its cohort beyond its guarantee; absent: no limit (a project
    /// without a cohort borrows nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrow_limit_gpus: Option<f64>,
    /// Most of its unused guarantee its cohort may borrow; absent: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lend_limit_gpus: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Project {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cohort: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub department: Option<String>,
    pub quota: Vec<QuotaLine>,
    pub pending: u64,
    pub running: u64,
    /// Which of its own running work its pending work may pre-empt: `lower_priority`,
    /// `lower_or_newer_equal_priority` or `never`.
    #[serde(default = "lower_priority")]
    pub preempt_within_project: String,
    /// Whether its work may reclaim GPUs other projects borrow while it borrows itself, and
    /// from work of which priorities; absent: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrow_within_cohort: Option<BorrowWithinCohortView>,
}

fn lower_priority() -> String {
    "lower_priority".into()
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BorrowWithinCohortView {
    /// Only work of priority below the claimant's is taken; with a threshold, also at most
    /// this priority. Absent: no threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_priority_threshold: Option<i32>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ProjectList {
    pub projects: Vec<Project>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Device {
    pub index: u32,
    pub model: String,
    /// Thousandths of the device in use.
    pub used_shares: u64,
    /// Workload ids on it.
    pub workloads: Vec<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Node {
    pub name: String,
    pub devices: Vec<Device>,
    /// Why the node takes no new work (the backend reports it down or drained); absent when
    /// it is usable. Work running there keeps running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unusable: Option<String>,
    /// Devices held by work allot does not govern (a job of an unmanaged partition, foreign
    /// work allot refused): offered to no allot work until it ends. Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmanaged: Option<UnmanagedDevices>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UnmanagedDevices {
    /// Device indices on the node.
    pub devices: Vec<u32>,
    /// The work holding them, in the cluster's words (`job 812 of bob (account physics, …)`).
    pub by: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeList {
    /// Where the inventory came from: `nvml`, `amd-sysfs` or the declared file's path.
    pub source: String,
    pub nodes: Vec<Node>,
    /// Whether the backend answers; while it does not, no node takes new work.
    #[serde(default)]
    pub backend: BackendStatus,
    /// What the last change of the inventory did (nodes added, removed, changed, or kept in
    /// their old shape while work runs there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inventory_note: Option<String>,
}

/// The backend's reachability (Slurm: whether slurmctld answers).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BackendStatus {
    /// `local`, `slurm`, …
    pub name: String,
    pub reachable: bool,
    /// Since when it does not answer (ms since the Unix epoch), and what it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreachable_since_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What keeps work from starting on the cluster without allot, read at start (Slurm:
    /// `submit-time: a job_submit/lua plugin …` or `watch only: …`); absent where only allot starts
    /// work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<String>,
}

/// One row of the goodput ledger, GPU-hours.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LedgerRow {
    /// `cluster`, `project:NAME`, `user:NAME` or `workload:ID`.
    pub scope: String,
    pub allocated_gpu_hours: f64,
    pub active_gpu_hours: f64,
    /// The part of allocated that telemetry covered; allocated − measured went unmeasured
    /// (no collector or agent read those devices), which is not evidence of idleness.
    #[serde(default)]
    pub measured_gpu_hours: f64,
    pub idle_allocated_gpu_hours: f64,
    pub lost_gpu_hours: f64,
    pub useful_gpu_hours: f64,
    /// useful / allocated; null when nothing was allocated.
    #[serde(default)]
    pub goodput: Option<f64>,
    /// Cluster row only: GPU-hours held by work allot does not govern (jobs of unmanaged
    /// partitions, foreign work allot refused), outside capacity and allocation.
    #[serde(default)]
    pub unmanaged_gpu_hours: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Report {
    /// Since the daemon's first start (ms since the Unix epoch).
    pub since_ms: u64,
    pub now_ms: u64,
    pub rows: Vec<LedgerRow>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PolicyView {
    /// Where the active policy came from.
    pub source: String,
    /// The policy file's text.
    pub text: String,
    /// Its number in the daemon's policy history (`GET /api/v1/policy/versions`).
    #[serde(default)]
    pub version: u32,
    /// The scoped rollout in effect, or the last one and how it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutView>,
}

/// A scoped rollout (`allot policy apply FILE --scope … --rollback-if …`): the candidate's
/// rules for one scope, the active policy's elsewhere, watched by its rollback conditions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RolloutView {
    /// The policy version the rollout is, and the one before it (what a rollback restores).
    pub version: u32,
    pub base_version: u32,
    /// `project=NAME`, `pool=MODEL` or `kind=KIND`.
    pub scope: String,
    /// The candidate's file (or form).
    pub candidate: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    pub since_ms: u64,
    /// The window before the rollout its figures are compared with.
    pub baseline_ms: u64,
    /// An idle reclaim its user undid within this long counts as a false one.
    pub false_reclaim_within_ms: u64,
    /// Observations a window needs before an average or percentile is judged.
    pub min_sample: u64,
    /// What of the candidate the rollout carries, and what it leaves out (kept as before).
    pub carried: Vec<String>,
    pub left_out: Vec<String>,
    pub conditions: Vec<RolloutCondition>,
    /// How it ended (`rolled back by allot …: why`, `promoted …`); absent while in effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
}

/// One rollback condition with its figures for the scope now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RolloutCondition {
    /// As written: `p95_wait>1.5x`, `failure_rate>0.2`.
    pub condition: String,
    /// The figure in the baseline window before the rollout, and since it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<f64>,
    pub baseline_samples: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<f64>,
    pub samples: u64,
    /// `ok`, `tripped`, or why it is not judged yet (`2 of 5 observations since the rollout`).
    pub state: String,
}

/// Every policy the daemon ran under, oldest first (`allot policy history`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PolicyHistory {
    /// The version in effect (the last).
    pub active: u32,
    pub versions: Vec<PolicyVersion>,
}

/// A candidate policy run in shadow beside the active one (`allot policy apply FILE
/// --shadow`): at every decision cycle it decides over the same live work; what it would have
/// done differently is counted here, never executed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ShadowReport {
    /// The candidate's file (or form).
    pub source: String,
    /// The admin who started the shadow.
    pub by: String,
    /// When it started (ms since the epoch), and now.
    pub since_ms: u64,
    pub now_ms: u64,
    /// Decision cycles the candidate decided beside the active policy.
    pub cycles: u64,
    /// Cycles the candidate could not take the live work over (e.g. it lacks a project that
    /// has running work), with the last reason; they count nothing.
    pub failed_cycles: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<String>,
    /// Whether idle reclaims are compared: only when the candidate's idle rules are the
    /// active ones (otherwise its idle timers would start afresh every cycle).
    pub idle_compared: bool,
    /// The candidate's policy text.
    pub text: String,
    pub projects: Vec<ShadowProject>,
}

/// Per project: what the active policy did and what the candidate would have done.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ShadowProject {
    pub project: String,
    /// Workloads the candidate would have admitted sooner; of those, the active policy has
    /// since admitted `admitted_since` (sooner by `wait_saved_ms` in all).
    pub sooner: u64,
    pub admitted_since: u64,
    pub wait_saved_ms: u64,
    /// Workloads the active policy admitted that the candidate would have kept waiting.
    pub held_back: u64,
    /// Distinct workloads pre-empted for other work: by the active policy, by the candidate.
    pub preempted_active: u64,
    pub preempted_candidate: u64,
    /// Distinct workloads reclaimed for idleness: by the active policy, by the candidate.
    pub reclaimed_active: u64,
    pub reclaimed_candidate: u64,
}

/// One policy the daemon ran under.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PolicyVersion {
    /// 1 for the policy the daemon's data began with, then one more per policy applied.
    pub version: u32,
    /// When it took effect (ms since the epoch); absent for version 1, in effect since the
    /// first start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
    /// The file (or form) it came from.
    pub source: String,
    /// The admin who applied it; absent for a policy file read when the daemon started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The earlier version whose text it brought back (`allot policy rollback`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_of: Option<u32>,
    /// The policy file's text.
    pub text: String,
    /// The scope of the rollout this version is (`project=nlp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Why allot applied it itself (the rollback condition that tripped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// The what-if the dashboard showed for this policy's text against the version before it,
    /// if one finished before it was applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub whatif: Option<WhatIfShown>,
}

/// A what-if as it was shown before a policy was applied: the history replayed under the
/// policy then in effect and under the candidate. Whole units (ms, milli-GPU-hours) so a
/// version reads back exactly as it was written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WhatIfShown {
    /// The dashboard's number of the what-if (`/policy/whatif/N`).
    pub run: u64,
    /// When it finished (ms since the epoch).
    pub at_ms: u64,
    /// The version it was compared with (in effect when it ran).
    pub active_version: u32,
    /// Workloads of the history it replayed.
    pub jobs: u64,
    pub active: WhatIfFigures,
    pub candidate: WhatIfFigures,
    /// The largest gap, in percent, between the active policy's replay and what was recorded
    /// (waits, GPU-hours, pre-emptions; per project): how far the side-by-side can be trusted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fidelity_gap_pct: Option<u32>,
}

/// One side of a what-if.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WhatIfFigures {
    pub wait_p50_ms: u64,
    pub wait_p95_ms: u64,
    pub allocated_milli_gpu_hours: u64,
    pub lost_milli_gpu_hours: u64,
    pub preemptions: u64,
    pub finished: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Everything, including tokens and policy.
    Admin,
    /// Reads and acts on its own projects' workloads only.
    Member,
    /// Reads everything, changes nothing.
    Viewer,
}

impl Role {
    pub fn as_str(&self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Member => "member",
            Role::Viewer => "viewer",
        }
    }

    pub fn parse(text: &str) -> Option<Role> {
        match text {
            "admin" => Some(Role::Admin),
            "member" => Some(Role::Member),
            "viewer" => Some(Role::Viewer),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    pub role: Role,
    /// Who holds it (becomes the `user` of what it submits).
    pub name: String,
    /// For members: the projects it may see and act on.
    #[serde(default)]
    pub projects: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TokenCreated {
    pub id: String,
    /// Shown once; only its hash is stored.
    pub token: String,
    pub role: Role,
    pub name: String,
    pub projects: Vec<String>,
}

/// Every error body: what went wrong, the field when one is to blame, and what to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiError {
    pub error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// `POST /policy/validate`: a candidate policy (YAML text as the body) checked against this
/// daemon's inventory; nothing is changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PolicyValidation {
    pub ok: bool,
    /// What `allot policy validate` prints for it.
    pub summary: String,
    pub problems: Vec<ApiError>,
}

/// `GET /api/v1/history`: the daemon's workloads as a job trace for `allot sim replay`
/// (`allot history export` writes `jobs` in the allot trace format, `cluster_yaml` as the
/// cluster file and `policy_text` as the policy file).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct HistoryExport {
    /// When the export was made, ms since the Unix epoch.
    pub exported_ms: u64,
    /// Submit time of the first exported job: every `submit_s` counts from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_submit_ms: Option<u64>,
    /// Oldest first.
    pub jobs: Vec<HistoryJob>,
    pub counts: HistoryCounts,
    /// The daemon's inventory as a cluster file (`allot sim replay --cluster`).
    pub cluster_yaml: String,
    /// The policy in effect and where it came from (`allot sim replay --policy`).
    pub policy_source: String,
    pub policy_text: String,
    /// The mean time from admission to start the daemon measured (its ledger): the what-if's
    /// start-up and restart delay, instead of a modelled one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_delay_s: Option<f64>,
    /// The least time between the daemon's decision cycles: the what-if decides as often.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decide_interval_s: Option<f64>,
}

/// What the export holds and what it left out, and why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HistoryCounts {
    /// Ended work that ran: `duration_s` is its real run time.
    pub ended: usize,
    /// Running (or stopping) work: `duration_s` is the time so far, a lower bound.
    pub running: usize,
    /// Pending (or suspended) work with an estimated `duration_s`.
    pub pending_estimated: usize,
    /// Pending work left out: no max runtime, and its project has no ended work to take a
    /// median from.
    pub pending_skipped: usize,
    /// Ended without ever running (cancelled while queued, rejected): left out.
    pub never_ran: usize,
    /// Older workloads left out by the job limit.
    pub older_left_out: usize,
}

/// Where a job's `duration_s` comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DurationBasis {
    /// Ended: the last run's start to its end.
    Ran,
    /// Still running: its start to the export, so the real run time is at least this.
    ElapsedLowerBound,
    /// Pending: its max runtime.
    MaxRuntime,
    /// Pending without a max runtime: the median run time of its project's ended work.
    ProjectMedian,
}

/// One job of the export; the fields of the allot trace format (`docs/design/trace-format.md`)
/// plus its state and where its duration comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct HistoryJob {
    /// The workload's id.
    pub id: u64,
    pub name: String,
    pub state: WorkloadState,
    /// Seconds since `first_submit_ms`.
    pub submit_s: f64,
    pub duration_s: f64,
    pub duration_basis: DurationBasis,
    pub project: String,
    /// `training`, `batch`, `notebook`, `inference` or `service`.
    pub kind: String,
    /// Whole GPUs per member (1 with `gpu_milli` below 1000 for a share or MIG instance).
    pub gpus: u32,
    /// Shares of one GPU per member (1000 for whole GPUs; a MIG instance as its compute share).
    pub gpu_milli: u32,
    pub members: u32,
    /// Acceptable GPU models in order of preference; empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_models: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class: Option<String>,
    /// Seconds between periodic checkpoints, when known (the daemon records reported
    /// checkpoints, not an interval, so this is absent for now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_interval_s: Option<f64>,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// What happened to it in the daemon, from its ledger: the what-if compares its replay
    /// of the active policy with this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded: Option<RecordedOutcome>,
}

/// One workload's recorded outcome (`HistoryJob::recorded`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RecordedOutcome {
    /// Submission to first admission; absent if it was never admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_delay_s: Option<f64>,
    /// GPU-hours allocated to it over all its runs so far.
    pub allocated_gpu_hours: f64,
    /// Times it was pre-empted or reclaimed.
    pub preemptions: u64,
}
