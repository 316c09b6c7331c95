//! The idle-reclaim experiment (`allot sim idle`): the same seeded workload and telemetry under
//! several idle-reclaim policies — AMD Resource Manager's rules, Run:ai's and allot's — driven
//! through the real `allot_core::Engine` on a virtual clock. The method, every number and why:
//! `docs/design/idle-experiment.md`.
//!
//! Like [`crate::replay`], this module plays the backend and keeps the books; every admission,
//! warning, pre-emption and reclaim is the engine's. Unlike the replay it also plays the
//! telemetry: every `tick_s` (15 s, AMD's poll interval) each running workload gets one
//! [`DeviceReading`] per allocated device, made from its activity model ([`JobActivity`]) by a
//! seeded telemetry model (SM-active close to the activity, utilisation overstating it, short
//! kernels in idle slots, exporter outages per node), and every `probe_every_s` an application
//! probe (a notebook's last user presence, an endpoint's last request).
//!
//! Time: happenings (arrivals, starts after the launch delay, checkpoints, finishes, stops after
//! the victim's grace, a notebook's end, a redeployment) are applied at their own millisecond;
//! telemetry, probes and the engine's cycle at the ticks. A cycle runs at a tick when a
//! happening since the last cycle can change its answer or when `Engine::idle_attention` says
//! it has idle work to do.
//!
//! Books per workload, in GPU-seconds: allocated = useful + idle + lost. *Lost* is the
//! activity-weighted work a pre-emption or reclaim throws away (since the last checkpoint; all
//! of the run for work that cannot checkpoint; everything ever kept on requeue or delete) plus
//! the launch delay of every restart; *useful* is the activity-weighted work kept; *idle* is
//! every other allocated GPU-second (allocated without activity, first launches).

use std::collections::BTreeMap;
use std::fmt;

use allot_core::{NodeSpec, PolicySpec};
use rayon::prelude::*;
use serde::ser::{Serialize, SerializeMap, Serializer};

use crate::activity::ActivityParams;

// ---------------------------------------------------------------------------------------------
// Parameters

/// The telemetry an exporter would report for a workload's devices, made from its activity.
#[derive(Clone, Debug, PartialEq)]
pub struct TelemetryModel {
    /// SM-active = activity × U(lo, hi) per device and sample (engine-active is the same).
    pub sm_noise: (f64, f64),
    /// Activity below this is an idle slot: utilisation 0 unless a short kernel ran.
    pub idle_below: f64,
    /// Chance that a short kernel (monitoring, health check, autosave) makes one sample of one
    /// device in an idle slot read 100 % utilisation (SM-active stays at the activity).
    pub spike_share: f64,
    /// Also a short kernel every this many seconds, in every sample window it falls in (a
    /// periodic health check). `None` by default; tests use it for hand-checkable cases.
    pub spike_every_s: Option<f64>,
    /// Mean time between a node's exporter outages (exponential gaps); `None`: no outages.
    pub outage_mean_interval_s: Option<f64>,
    /// An outage's length, uniform in this range, seconds.
    pub outage_len_s: (f64, f64),
}

impl Default for TelemetryModel {
    fn default() -> TelemetryModel {
        TelemetryModel {
            sm_noise: (0.9, 1.1),
            idle_below: 0.02,
            spike_share: 0.05,
            spike_every_s: None,
            outage_mean_interval_s: Some(12.0 * 3600.0),
            outage_len_s: (120.0, 600.0),
        }
    }
}

/// How the experiment runs. `Default` is what `allot sim idle` uses without flags.
#[derive(Clone, Debug, PartialEq)]
pub struct IdleSimConfig {
    /// Seeds the workload, the activity model, the telemetry and the outages.
    pub seed: u64,
    /// The horizon, hours: the cluster is observed from t = 0 to here.
    pub hours: f64,
    /// Telemetry sample interval and the engine's cycle cadence, seconds (AMD polls every 15 s).
    pub tick_s: f64,
    /// Application probes (notebook presence, last endpoint request), seconds.
    pub probe_every_s: f64,
    /// Admission → start of every run (image pull, process start). Allocated; idle for a
    /// first start, lost for a restart (after a pre-emption, or a redeployment).
    pub launch_delay_s: f64,
    /// Grace a checkpointable workload gets to checkpoint before it is stopped.
    pub checkpoint_grace_s: f64,
    /// Offered GPU-hours / (capacity × horizon).
    pub offered_load: f64,
    pub activity: ActivityParams,
    pub telemetry: TelemetryModel,
    /// Check the engine's invariants after every cycle (tests).
    pub audit: bool,
}

impl Default for IdleSimConfig {
    fn default() -> IdleSimConfig {
        IdleSimConfig {
            seed: 42,
            hours: 48.0,
            tick_s: 15.0,
            probe_every_s: 60.0,
            launch_delay_s: 30.0,
            checkpoint_grace_s: 60.0,
            offered_load: 1.15,
            activity: ActivityParams::default(),
            telemetry: TelemetryModel::default(),
            audit: false,
        }
    }
}

/// An endpoint request probe counts a slot at or above this activity as served traffic.
pub const REQUEST_ACTIVITY: f64 = 0.05;
/// An idle reclaim is false when the victim shows this activity within `FALSE_WINDOW_S` after
/// it (or its probe showed use within `FALSE_WINDOW_S` before); reclaimed idle time ends when
/// the victim first shows it.
pub const ACTIVE_ACTIVITY: f64 = 0.10;
pub const FALSE_WINDOW_S: f64 = 900.0;
/// Longest horizon the experiment accepts, hours (a limit on memory and time).
pub const HOURS_MAX: f64 = 24.0 * 31.0;

pub mod genai;
mod policies;
mod render;
mod sim;
mod workload;

/// Where one engine workload of a simulation stands: waiting in the engine's queue, holding
/// devices (starting, running or stopping), or done for good.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Queued,
    Holding,
    Done,
}

pub use policies::idle_policies;
pub use render::{idle_json, idle_text};
pub use sim::{next_at_least, next_presence, run_policy};
pub use workload::*;

// ---------------------------------------------------------------------------------------------
// Results

/// Figures of one kind under one policy.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct KindMetrics {
    pub idle_reclaims: u64,
    pub false_reclaims: u64,
    /// False reclaims by each test (a reclaim may fail both).
    pub false_by_probe_before: u64,
    pub false_by_activity_after: u64,
    pub reclaimed_idle_gpu_hours_gross: f64,
    pub reclaimed_idle_gpu_hours: f64,
    /// The part of `reclaimed_idle_gpu_hours` other work held.
    pub reused_gpu_hours: f64,
    pub lost_gpu_hours: f64,
    pub deleted: u64,
}

/// What one policy did with the workload (`docs/design/idle-experiment.md`, "Metrics").
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct PolicyMetrics {
    /// Idle GPU-hours taken back: per idle reclaim, victim GPUs × the time from the reclaim
    /// until its activity model next shows activity ≥ 10 % (or its end, capped at the horizon)
    /// *or it holds GPUs again* (resumed, or redeployed after a delete), whichever is first —
    /// the idle GPU time it did not hold. A workload reclaimed, resumed and reclaimed again does
    /// not count the same idle future twice.
    pub reclaimed_idle_gpu_hours: f64,
    /// As `reclaimed_idle_gpu_hours` without the "holds GPUs again" cut: each reclaim counts
    /// the victim's whole idle future (counts it again after a resume).
    pub reclaimed_idle_gpu_hours_gross: f64,
    /// Of `reclaimed_idle_gpu_hours`, the GPU-hours other work held on the devices given
    /// back, inside each reclaim's window (at most the shares given back per device): a
    /// reclaim that frees GPUs no pending work can use only costs its victim.
    pub reused_gpu_hours: f64,
    /// Idle reclaims whose probe showed use within 15 min before, or whose activity model
    /// shows ≥ 10 % within 15 min after.
    pub false_reclaims: u64,
    /// Activity-weighted work thrown away by pre-emptions and reclaims, plus restart delays.
    pub lost_gpu_hours: f64,
    /// p95 over submissions that had to wait (deferred at least once before their first
    /// start) of their wait from submission to first start, censored at the horizon; seconds.
    /// Waits to resume after an idle reclaim are not counted: that work was not using its
    /// GPUs.
    pub pending_wait_s_p95: f64,
    /// useful / allocated.
    pub goodput: f64,
    /// Pre-emptions and reclaims for idleness (`Preempt` with an idle reason, `Reclaim`).
    pub idle_reclaims: u64,
    /// Distinct submissions reclaimed at least once (a redeployment counts as its original).
    pub idle_reclaimed_workloads: u64,
    /// Every pre-emption and reclaim, idle or not.
    pub preemptions: u64,
    pub warnings: u64,
    pub deleted: u64,
    /// Deleted notebooks and endpoints submitted again by their users when next needed.
    pub redeployed: u64,
    pub allocated_gpu_hours: f64,
    /// Activity-weighted allocated GPU-hours (work later lost included).
    pub active_gpu_hours: f64,
    /// Activity-weighted GPU-hours of work kept.
    pub useful_gpu_hours: f64,
    /// Allocated GPU-hours without activity (kept or thrown away) and first launches.
    pub idle_allocated_gpu_hours: f64,
    /// Training and batch that completed their work; notebooks running at their session's end.
    pub jobs_finished: u64,
    /// Notebooks whose session ended while they waited.
    pub notebooks_ended_pending: u64,
    /// Device samples without any reading (exporter outages).
    pub telemetry_gap_samples: u64,
    pub decide_calls: u64,
    /// Wall time of this policy's run (0 with `--no-timing`).
    pub wall_ms: u64,
    /// The idle figures per workload kind.
    pub by_kind: BTreeMap<String, KindMetrics>,
    /// The goodput ledger (`allot_core::ledger`, folded over the engine's events and
    /// decisions) per project, and `cluster`.
    pub ledger: BTreeMap<String, LedgerRow>,
}

/// One scope of the goodput ledger over the whole run, in GPU-hours.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct LedgerRow {
    pub allocated_gpu_hours: f64,
    pub active_gpu_hours: f64,
    pub idle_allocated_gpu_hours: f64,
    pub lost_to_preemption_gpu_hours: f64,
    pub checkpoint_overhead_gpu_hours: f64,
    pub goodput: f64,
    pub queue_delay_s_mean: f64,
    pub startup_delay_s_mean: f64,
    pub preemptions: u64,
    /// Cluster row only: capacity, free, and free but unusable by the pending demand.
    pub capacity_gpu_hours: f64,
    pub free_gpu_hours: f64,
    pub fragmented_gpu_hours: f64,
}

impl LedgerRow {
    pub fn of(b: &allot_core::ledger::Books) -> LedgerRow {
        use allot_core::ledger::Books;
        let mean = |sum: u128, n: u64| if n == 0 { 0.0 } else { sum as f64 / n as f64 / 1000.0 };
        LedgerRow {
            allocated_gpu_hours: Books::gpu_hours(b.allocated),
            active_gpu_hours: Books::gpu_hours(b.active),
            idle_allocated_gpu_hours: Books::gpu_hours(b.idle_allocated()),
            lost_to_preemption_gpu_hours: Books::gpu_hours(b.lost_to_preemption),
            checkpoint_overhead_gpu_hours: Books::gpu_hours(b.checkpoint_overhead),
            goodput: b.goodput(),
            queue_delay_s_mean: mean(b.queue_delay_ms, b.admissions),
            startup_delay_s_mean: mean(b.startup_delay_ms, b.starts),
            preemptions: b.preemptions,
            capacity_gpu_hours: Books::gpu_hours(b.capacity),
            free_gpu_hours: Books::gpu_hours(b.free),
            fragmented_gpu_hours: Books::gpu_hours(b.fragmented),
        }
    }
}

/// One of the goal's comparisons.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GoalCheck {
    pub allot: f64,
    pub amd_rm: f64,
    /// What allot must reach: at least it (`reclaimed`) or at most it (the others).
    pub limit: f64,
    pub holds: bool,
}

/// allot against AMD's rules: reclaim at least as much, at most a third of the false reclaims,
/// at most half the lost work.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Goal {
    pub reclaimed_idle_gpu_hours: GoalCheck,
    pub false_reclaims: GoalCheck,
    pub lost_gpu_hours: GoalCheck,
    pub holds: bool,
}

impl Goal {
    /// The goal from the policies labelled `allot` and `amd_rm`; `None` without both.
    pub fn of(policies: &[(String, PolicyMetrics)]) -> Option<Goal> {
        let get = |l: &str| policies.iter().find(|(label, _)| label == l).map(|(_, m)| m);
        let (a, m) = (get("allot")?, get("amd_rm")?);
        let reclaimed = GoalCheck {
            allot: a.reclaimed_idle_gpu_hours,
            amd_rm: m.reclaimed_idle_gpu_hours,
            limit: m.reclaimed_idle_gpu_hours,
            holds: a.reclaimed_idle_gpu_hours >= m.reclaimed_idle_gpu_hours,
        };
        let false_reclaims = GoalCheck {
            allot: a.false_reclaims as f64,
            amd_rm: m.false_reclaims as f64,
            limit: m.false_reclaims as f64 / 3.0,
            // Integers: 3 × allot ≤ amd_rm is exact.
            holds: 3 * a.false_reclaims <= m.false_reclaims,
        };
        let lost = GoalCheck {
            allot: a.lost_gpu_hours,
            amd_rm: m.lost_gpu_hours,
            limit: m.lost_gpu_hours / 2.0,
            holds: 2.0 * a.lost_gpu_hours <= m.lost_gpu_hours,
        };
        let holds = reclaimed.holds && false_reclaims.holds && lost.holds;
        Some(Goal {
            reclaimed_idle_gpu_hours: reclaimed,
            false_reclaims,
            lost_gpu_hours: lost,
            holds,
        })
    }
}

/// A list of named values written as a JSON object in the list's order.
#[derive(Clone, Debug, PartialEq)]
pub struct Ordered<T>(pub Vec<(String, T)>);

impl<T: Serialize> Serialize for Ordered<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

/// The whole experiment: every policy on the same workload, and the goal.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct IdleReport {
    pub policies: Ordered<PolicyMetrics>,
    pub goal: Option<Goal>,
    pub seed: u64,
    pub hours: f64,
    pub tick_s: f64,
    pub cluster_machines: usize,
    pub cluster_gpus: u64,
    /// The target: offered GPU-hours / (capacity × horizon).
    pub offered_load: f64,
    /// What was generated, per kind and in total.
    pub mix: Ordered<MixEntry>,
}

/// Why the experiment could not run.
#[derive(Clone, Debug, PartialEq)]
pub enum IdleSimError {
    /// The engine refused the cluster and a policy.
    Config { policy: String, message: String },
    /// A parameter out of range (horizon, tick, workload).
    Input(String),
    /// The engine's invariants broke (only checked with `IdleSimConfig::audit`).
    Invariant { policy: String, at_s: f64, message: String },
}

impl fmt::Display for IdleSimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdleSimError::Config { policy, message } => write!(f, "policy {policy}: {message}"),
            IdleSimError::Input(m) => f.write_str(m),
            IdleSimError::Invariant { policy, at_s, message } => {
                write!(f, "policy {policy}: engine invariant broken at t={at_s}s: {message}")
            }
        }
    }
}

impl std::error::Error for IdleSimError {}

fn check_config(config: &IdleSimConfig) -> Result<(), IdleSimError> {
    let bad = |m: String| Err(IdleSimError::Input(m));
    if !(config.hours.is_finite() && config.hours > 0.0 && config.hours <= HOURS_MAX) {
        return bad(format!("hours: {} is not in (0, {HOURS_MAX}]", config.hours));
    }
    if !(config.tick_s.is_finite() && config.tick_s >= 1.0 && config.tick_s <= 3600.0) {
        return bad(format!("tick: {} s is not in [1, 3600]", config.tick_s));
    }
    if !(config.probe_every_s.is_finite() && config.probe_every_s >= config.tick_s) {
        return bad(format!("probe interval {} s is shorter than a tick", config.probe_every_s));
    }
    for (name, v) in [
        ("launch delay", config.launch_delay_s),
        ("checkpoint grace", config.checkpoint_grace_s),
        ("offered load", config.offered_load),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return bad(format!("{name}: {v} is not a number ≥ 0"));
        }
    }
    Ok(())
}

/// Runs every policy on the same generated workload (in parallel) and assembles the report.
/// `now_ms` is the caller's wall clock for `wall_ms` (the library reads none): pass `&|| 0`
/// for byte-identical output.
pub fn run_idle_experiment(
    nodes: &[NodeSpec],
    policies: &[(String, PolicySpec)],
    config: &IdleSimConfig,
    now_ms: &(dyn Fn() -> u64 + Sync),
) -> Result<IdleReport, IdleSimError> {
    check_config(config)?;
    let capacity: u64 = nodes.iter().map(|n| n.devices.len() as u64).sum();
    let (workloads, mix) = generate_workloads(capacity, config);
    let results: Vec<Result<PolicyMetrics, IdleSimError>> = policies
        .par_iter()
        .map(|(label, policy)| {
            let started = now_ms();
            let mut m = run_policy(nodes, label, policy, &workloads, config)?;
            m.wall_ms = now_ms().saturating_sub(started);
            Ok(m)
        })
        .collect();
    let mut out = Vec::with_capacity(results.len());
    for ((label, _), r) in policies.iter().zip(results) {
        out.push((label.clone(), r?));
    }
    let goal = Goal::of(&out);
    Ok(IdleReport {
        policies: Ordered(out),
        goal,
        seed: config.seed,
        hours: config.hours,
        tick_s: config.tick_s,
        cluster_machines: nodes.len(),
        cluster_gpus: capacity,
        offered_load: config.offered_load,
        mix: Ordered(mix),
    })
}
