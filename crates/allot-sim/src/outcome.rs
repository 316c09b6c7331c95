//! What one replay of one policy produced: the figures `allot sim replay` prints and the series
//! its charts draw. Data only; `replay` fills it, `report` and `charts` render it.

use serde::Serialize;
use std::collections::BTreeMap;

/// The result of replaying one trace under one policy.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ReplayReport {
    /// The policy's label (its file stem, or `default`).
    pub policy: String,
    pub seed: u64,
    pub jobs_total: usize,
    pub jobs_finished: usize,
    /// Still queued or running when the replay stopped (`--until`).
    pub jobs_pending: usize,
    /// Rejected or cancelled (e.g. asks for more GPUs than the cluster has).
    pub jobs_cancelled: usize,
    /// Mean job completion time (submit → finish) of finished jobs, seconds.
    pub jct_s_mean: f64,
    pub queue_delay_s_p50: f64,
    pub queue_delay_s_p95: f64,
    pub queue_delay_s_p99: f64,
    /// Jobs that ask for [`BIG_JOB_GPUS`] or more GPUs in all (members × GPUs each): the
    /// ones scattered small work can starve.
    pub big_jobs: usize,
    /// The first queue delays of the big jobs admitted, seconds.
    pub big_queue_delay_s_mean: f64,
    pub big_queue_delay_s_p50: f64,
    pub big_queue_delay_s_p95: f64,
    pub big_queue_delay_s_max: f64,
    /// Time-average allocated GPUs as % of capacity over the replayed span.
    pub gpu_allocated_pct: f64,
    /// Time-average GPUs doing work (activity model) as % of capacity.
    pub gpu_active_pct: f64,
    pub preemptions: u64,
    /// Jobs pre-empted at least once.
    pub jobs_preempted: usize,
    /// The most pre-emptions any one job had (thrash shows here, not in the total).
    pub preemptions_per_job_max: u32,
    /// GPU-hours of work redone after pre-emptions (since the last checkpoint) plus restart delay.
    pub lost_gpu_hours: f64,
    /// Useful GPU-hours / allocated GPU-hours.
    pub goodput: f64,
    pub wall_ms: u64,
    /// Allocation over time, for charts.
    pub timeline: Vec<TimelinePoint>,
    /// Every admitted job's first queue delay, seconds, ascending (the CDF's data).
    pub queue_delays_s: Vec<f64>,
    /// The ledger per project.
    pub projects: Vec<ProjectLedger>,
    /// GPUs in the cluster.
    pub capacity_gpus: f64,
    /// Virtual seconds replayed (t = 0 to the last event, or `--until`).
    pub span_s: f64,
    /// The cluster's GPU-hour books: allocated = useful + lost + idle.
    pub allocated_gpu_hours: f64,
    /// GPU-hours of activity (activity model), work later lost included.
    pub active_gpu_hours: f64,
    /// Activity-weighted GPU-hours of work that was kept.
    pub useful_gpu_hours: f64,
    /// Allocated GPU-hours of kept work without activity, and launch delays.
    pub idle_gpu_hours: f64,
    /// Scheduling cycles the engine ran.
    pub decide_calls: u64,
    /// Trace rows skipped as malformed (`--skip-bad-rows`).
    pub bad_rows_skipped: usize,
    /// Each job's own figures, by job id: for comparing a replay with what was recorded (the
    /// what-if's fidelity). Not part of the report's output.
    #[serde(skip)]
    pub by_job: BTreeMap<u64, JobOutcome>,
    /// A rollout rehearsed on this history (`ReplayConfig::rehearsal`), and how it went.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rehearsal: Option<RehearsalReport>,
}

/// A job asking for this many GPUs in all, or more, is a big job in the report (a whole
/// 8-GPU node, as the product contract's starvation rule puts it).
pub const BIG_JOB_GPUS: u32 = 8;

/// One sample of the cluster over time.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TimelinePoint {
    /// Seconds since the start of the trace.
    pub t_s: f64,
    pub allocated_gpus: f64,
    pub active_gpus: f64,
    pub pending_jobs: usize,
}

/// Allocated vs active vs useful GPU-hours of one project.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ProjectLedger {
    pub project: String,
    pub allocated_gpu_hours: f64,
    pub active_gpu_hours: f64,
    pub useful_gpu_hours: f64,
    pub lost_gpu_hours: f64,
    pub jobs_finished: usize,
    /// Allocated GPU-hours of kept work without activity (allocated = useful + lost + idle).
    pub idle_gpu_hours: f64,
    pub jobs_total: usize,
    /// Times this project's jobs were pre-empted.
    pub preemptions: u64,
}

/// How a rehearsed rollout went: when it started, whether and why it rolled back, and each
/// condition's figures at the end (or at the rollback).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RehearsalReport {
    pub scope: String,
    pub started_s: f64,
    /// When a condition tripped and the replay went back to the active policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rolled_back_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    pub conditions: Vec<RehearsedCondition>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RehearsedCondition {
    pub condition: String,
    pub baseline: Option<f64>,
    pub baseline_samples: u64,
    pub current: Option<f64>,
    pub samples: u64,
    /// `ok`, `tripped`, or why it was not judged.
    pub state: String,
}

/// One job's figures in a replay (`ReplayReport::by_job`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobOutcome {
    /// Submission to first admission; `None`: never admitted.
    pub first_wait_s: Option<f64>,
    pub allocated_gpu_hours: f64,
    pub preemptions: u32,
}
