//! `/metrics` in the OpenMetrics text format. The main loop sets the gauges after each turn;
//! a scrape only encodes.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProjectLabel {
    pub project: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceLabels {
    pub node: String,
    pub device: String,
    pub model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConditionLabel {
    pub scope: String,
    pub condition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: String,
}

#[derive(Debug)]
pub struct Metrics {
    pub registry: Registry,
    /// GPUs allocated per project (fractions included).
    pub allocated_gpus: Family<ProjectLabel, Gauge<f64, AtomicU64>>,
    /// GPUs of running workloads an idle rule currently warns about.
    pub idle_gpus: Family<ProjectLabel, Gauge<f64, AtomicU64>>,
    pub device_allocated: Family<DeviceLabels, Gauge<f64, AtomicU64>>,
    /// GPUs whose last reading shows at least 10 % of their share busy, per project.
    pub active_gpus: Family<ProjectLabel, Gauge<f64, AtomicU64>>,
    /// GPUs with a reading this round (the rest have no telemetry), per project.
    pub measured_gpus: Family<ProjectLabel, Gauge<f64, AtomicU64>>,
    /// Each device's activity by the best signal its source has (0 to 1).
    pub device_activity: Family<DeviceLabels, Gauge<f64, AtomicU64>>,
    pub queue_length: Family<ProjectLabel, Gauge>,
    pub pending_by_reason: Family<ReasonLabel, Gauge>,
    pub workloads_by_state: Family<StateLabel, Gauge>,
    pub preemptions: Family<ReasonLabel, Gauge>,
    /// 1 while the backend answers, 0 while it does not (no new work is placed then).
    pub backend_up: Gauge,
    /// 1 while a scoped rollout is in effect.
    pub rollout_active: Gauge,
    /// Rollouts allot rolled back itself because a condition tripped.
    pub rollout_rollbacks: Gauge,
    /// Each rollback condition of the rollout in effect: its figure since the rollout.
    pub rollout_condition: Family<ConditionLabel, Gauge<f64, AtomicU64>>,
    pub submissions: Counter,
    pub cycle_seconds: Histogram,
    pub log_append_seconds: Histogram,
    /// Time to take one snapshot of the state (right after a cycle): encode, write, compact.
    pub snapshot_seconds: Histogram,
    /// From a submission's arrival at the API to the cycle that admitted it (first admissions).
    pub submit_to_admit_seconds: Histogram,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("allot");
        let allocated_gpus = Family::<ProjectLabel, Gauge<f64, AtomicU64>>::default();
        let idle_gpus = Family::<ProjectLabel, Gauge<f64, AtomicU64>>::default();
        let device_allocated = Family::<DeviceLabels, Gauge<f64, AtomicU64>>::default();
        let queue_length = Family::<ProjectLabel, Gauge>::default();
        let active_gpus = Family::<ProjectLabel, Gauge<f64, AtomicU64>>::default();
        let measured_gpus = Family::<ProjectLabel, Gauge<f64, AtomicU64>>::default();
        let device_activity = Family::<DeviceLabels, Gauge<f64, AtomicU64>>::default();
        let pending_by_reason = Family::<ReasonLabel, Gauge>::default();
        let workloads_by_state = Family::<StateLabel, Gauge>::default();
        let preemptions = Family::<ReasonLabel, Gauge>::default();
        let submissions = Counter::default();
        let backend_up = Gauge::default();
        let rollout_active = Gauge::default();
        let rollout_rollbacks = Gauge::default();
        let rollout_condition = Family::<ConditionLabel, Gauge<f64, AtomicU64>>::default();
        // A 1-2.5-5 ladder from 0.1 ms to 10 s: round bounds (50 ms is the goal a cycle is
        // held to at depth, issue 20), so a quantile read from the buckets answers it.
        let cycle_seconds = Histogram::new(one_two_five_buckets());
        let log_append_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        let snapshot_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        let submit_to_admit_seconds = Histogram::new(exponential_buckets(0.0005, 1.5, 24));
        registry.register("allocated_gpus", "GPUs allocated, per project", allocated_gpus.clone());
        registry.register(
            "idle_gpus",
            "GPUs of running workloads an idle rule warns about, per project",
            idle_gpus.clone(),
        );
        registry.register(
            "device_allocated_gpus",
            "Part of each device allocated (0 to 1)",
            device_allocated.clone(),
        );
        registry.register(
            "active_gpus",
            "Allocated GPUs at least 10 % busy by their last reading, per project",
            active_gpus.clone(),
        );
        registry.register(
            "measured_gpus",
            "Allocated GPUs with a telemetry reading this round, per project",
            measured_gpus.clone(),
        );
        registry.register(
            "device_activity",
            "Each device's activity by the best signal its source has (0 to 1)",
            device_activity.clone(),
        );
        registry.register("queue_length", "Pending workloads, per project", queue_length.clone());
        registry.register(
            "pending_workloads",
            "Pending workloads by the reason they wait",
            pending_by_reason.clone(),
        );
        registry.register("workloads", "Workloads by state", workloads_by_state.clone());
        registry.register(
            "preemptions",
            "Pre-emptions and idle reclaims since the first start, by reason",
            preemptions.clone(),
        );
        registry.register(
            "backend_up",
            "1 while the backend (Slurm's controller) answers, 0 while it does not",
            backend_up.clone(),
        );
        registry.register(
            "policy_rollout_active",
            "1 while a scoped policy rollout is in effect",
            rollout_active.clone(),
        );
        registry.register(
            "policy_rollbacks",
            "Scoped rollouts allot rolled back itself (a rollback condition tripped), since the first start",
            rollout_rollbacks.clone(),
        );
        registry.register(
            "policy_rollout_condition",
            "Each rollback condition's figure for the rollout's scope since it started",
            rollout_condition.clone(),
        );
        registry.register(
            "submissions",
            "Workloads submitted since this start",
            submissions.clone(),
        );
        registry.register(
            "decision_cycle_seconds",
            "Time of one decision cycle",
            cycle_seconds.clone(),
        );
        registry.register(
            "log_append_seconds",
            "Time to make one batch of entries durable",
            log_append_seconds.clone(),
        );
        registry.register(
            "snapshot_seconds",
            "Time to take one snapshot of the daemon's state: encode, write, compact the log",
            snapshot_seconds.clone(),
        );
        registry.register(
            "submit_to_admit_seconds",
            "From a submission's arrival to the cycle that admitted it",
            submit_to_admit_seconds.clone(),
        );
        Metrics {
            submit_to_admit_seconds,
            registry,
            allocated_gpus,
            idle_gpus,
            device_allocated,
            active_gpus,
            measured_gpus,
            device_activity,
            queue_length,
            pending_by_reason,
            workloads_by_state,
            preemptions,
            backend_up,
            rollout_active,
            rollout_rollbacks,
            rollout_condition,
            submissions,
            cycle_seconds,
            log_append_seconds,
            snapshot_seconds,
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Bucket bounds up a 1-2.5-5 ladder, 0.1 ms to 10 s, written out so that each reads round.
fn one_two_five_buckets() -> impl Iterator<Item = f64> {
    [
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        5.0, 10.0,
    ]
    .into_iter()
}
