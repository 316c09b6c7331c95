//! The engine: facts in (`apply`), decisions out (`decide`), reasons on demand (`explain`).
//!
//! One `decide` is one scheduling cycle, numbered as in ARCHITECTURE.md:
//! 1. reject invalid submissions;
//! 2. stop cancelled and over-time workloads;
//! 3. let pre-emptors whose victims are gone go first;
//! 4. visit every project's queue in fair-share order (in-guarantee heads before borrowing
//!    heads, then lowest standing), taking one workload at a time: admit it if quota and
//!    placement allow, else plan a pre-emption through the single arbiter, else defer it with
//!    a typed reason.
//!
//! This file holds the state the parts share (`Engine`, `WorkloadState`, `ProjectState`),
//! `Engine::new`, the lookups by name and id, and the cycle's orchestration: `decide` calls
//! step 1 itself, then `stop_due` (step 2), `idle_pass`, `admission_cycle` (steps 3 and 4,
//! with the room of waiting pre-emptors held around them) and `amd_pressure_pass`. The parts:
//! - `events.rs`: `apply` and what it calls: submissions resolved against the policy (or kept
//!   for step 1's rejection), adoption, cancellation (a stop owed to step 2), requeue, removal;
//! - `queue.rs`: the order inside a project's queue (`QueueKey`), the order step 4 visits
//!   projects in (`project_order_key`) and the fair-share clock (`advance`);
//! - `admission.rs`: steps 3 and 4 (`admission_steps`) and, per workload, the quota and
//!   placement checks per model (`try_schedule`, `check_model`) with the typed deferrals;
//! - `preempt.rs`: the pre-emption arbiter: victims (`plan_preemption`), telling them to stop,
//!   the claimant's wait and reservation, the room held for it;
//! - `guard.rs`: which running work is protected from pre-emption now, and why;
//! - `defrag.rs`: defragmentation, tried in step 4 after the arbiter found no victims;
//! - `reserve.rs`: reservations for long-waiting requests (held around steps 3 and 4, opened
//!   for their own workload and for backfill), and borrowers held for in-guarantee claimants;
//! - `book.rs`: `commit`, `release` and `book_resources`, the only code that moves capacity
//!   and quota;
//! - `idle.rs`: idle reclaim (`idle_pass` after step 2, `amd_pressure_pass` after step 4);
//! - `audit.rs`: `audit` (the invariants) and `cluster_snapshot` (for the ledger);
//! - `standing.rs`, `eta.rs`: read-only fair-share standings and admission estimates;
//! - `state.rs`, `inventory.rs`: the state saved and rebuilt, and live work carried into
//!   another policy or inventory.

use std::collections::{BTreeMap, BTreeSet};

use crate::capacity::{Capacity, DeviceCap, MemberShape, MigDevice, NodeCap};
use crate::decision::{Decision, Placement, QuotaKey, RejectReason, StopReason};
use crate::ids::{ModelId, NodeId, ProjectId, SHARES_PER_GPU, Shares, Timestamp, WorkloadId};
use crate::mig::MigGpu;
use crate::model::{
    BorrowWithinCohort, Defragmentation, FairSharing, IdlePolicySpec, NodeSpec, PolicySpec,
    PreemptionGuard, PreemptionMode, PriorityClassSpec, Queueing, QuotaModel, Reservations,
    WithinProject, WorkloadSpec,
};
use crate::quota::{CohortQuota, QuotaBook, QuotaLine};

mod admission;
mod audit;
mod book;
mod defrag;
mod demand;
mod eta;
mod events;
mod guard;
mod idle;
mod inventory;
mod preempt;
mod queue;
mod reserve;
mod standing;
mod state;
pub(crate) use admission::{ModelCheck, Request};
pub use defrag::{DefragPlan, DefragVictim};
pub use eta::{ETA_ENDS_MAX, ETA_WORKLOADS_MAX, Eta, EtaCause, EtaUnknown, ROUNDS_PER_INSTANT};
pub use guard::Protection;
pub(crate) use idle::IdleState;
pub use inventory::InventoryChange;
pub(crate) use queue::QueueKey;
pub use reserve::{RESERVE_SCAN_MAX, RESERVE_SCAN_PER_RESERVATION, Reservation};
pub use standing::Standing;
pub use state::StateError;
// `state.rs` rebuilds the line totals `book.rs` keeps and the demand ratio `events.rs` keeps.
use book::adjust_line_total;
use events::cpu_per_gpu;

/// Limits on one submission, so that a malformed request cannot make a cycle unbounded.
pub const MEMBERS_MAX: u32 = 4096;

/// Devices of one node held by work allot does not govern (`Event::DevicesOccupied`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Occupancy {
    /// Device indices on the node.
    pub devices: std::collections::BTreeSet<u16>,
    /// Who holds them, in the cluster's words (`Slurm job 812 (account physics)`).
    pub by: String,
}
pub const WHOLE_GPUS_PER_MEMBER_MAX: u32 = 1024;

/// Why the engine could not be built from a cluster and a policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    DuplicateNode {
        name: String,
    },
    DuplicateProject {
        name: String,
    },
    DuplicatePriorityClass {
        name: String,
    },
    DuplicateQuotaLine {
        project: String,
        model: String,
    },
    UnknownDefaultPriorityClass {
        name: String,
    },
    LendLimitAboveGuarantee {
        project: String,
        model: String,
    },
    /// A borrow or lend limit on a project that has no cohort to borrow from or lend to.
    LimitWithoutCohort {
        project: String,
    },
    DuplicateCohort {
        name: String,
    },
    /// A cohort that is its own ancestor.
    CohortCycle {
        cohort: String,
    },
    TooManyModels,
    /// A device declared MIG-enabled whose model has no MIG table.
    NoMigTable {
        node: String,
        model: String,
    },
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::DuplicateNode { name } => write!(f, "node {name:?} is declared twice"),
            ConfigError::DuplicateProject { name } => {
                write!(f, "project {name:?} is declared twice")
            }
            ConfigError::DuplicatePriorityClass { name } => {
                write!(f, "priority class {name:?} is declared twice")
            }
            ConfigError::DuplicateQuotaLine { project, model } => {
                write!(f, "project {project:?} has two quota lines for {model}")
            }
            ConfigError::UnknownDefaultPriorityClass { name } => {
                write!(f, "default priority class {name:?} is not declared")
            }
            ConfigError::LendLimitAboveGuarantee { project, model } => {
                write!(f, "project {project:?} lends more {model} than it is guaranteed")
            }
            ConfigError::LimitWithoutCohort { project } => write!(
                f,
                "project {project:?} sets a borrow or lend limit but belongs to no cohort"
            ),
            ConfigError::DuplicateCohort { name } => write!(f, "cohort {name:?} is declared twice"),
            ConfigError::CohortCycle { cohort } => {
                write!(f, "cohort {cohort:?} is inside itself (its parents go round in a circle)")
            }
            ConfigError::TooManyModels => write!(f, "more than 65535 GPU models"),
            ConfigError::NoMigTable { node, model } => write!(
                f,
                "node {node:?}: GPU model {model:?} is declared MIG-enabled but has no MIG table \
                 (known: {})",
                MigGpu::known_models().join(", ")
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Where a workload is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Pending,
    /// Admitted; the backend has not confirmed the start yet.
    Assumed,
    Running,
    /// Told to stop; still holds its devices until the backend reports the stop.
    Stopping,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StopKind {
    Preempted(PreemptionMode),
    /// Reclaimed for idleness (by the arbiter, the `amd_rm` pressure check or an `always`
    /// rule); requeued work waits a backoff.
    Idle(PreemptionMode),
    Cancelled,
    MaxRuntime,
}

#[derive(Clone, Debug)]
pub(crate) struct Allocation {
    pub key: Option<QuotaKey>,
    pub placement: Placement,
    pub shares: Shares,
    pub started_at: Option<Timestamp>,
}

#[derive(Clone, Debug)]
pub(crate) struct WorkloadState {
    pub spec: WorkloadSpec,
    pub project: ProjectId,
    pub priority: i32,
    pub preemptible: bool,
    pub models: Vec<ModelId>,
    pub stage: Stage,
    pub stop_kind: Option<StopKind>,
    /// Queue order after priority: submit time, kept across suspensions so work resumes
    /// in its place.
    pub queued_at: Timestamp,
    /// When it last became pending (submitted, or requeued after a stop): defragmentation's
    /// gain counts the wait since then.
    pub pending_since: Timestamp,
    pub allocation: Option<Allocation>,
    pub last_checkpoint_at: Option<Timestamp>,
    /// Victims this pre-emptor waits for.
    pub waiting_for: BTreeSet<WorkloadId>,
    /// Times this workload was pre-empted and requeued (suspended or requeued).
    pub preemptions: u32,
    /// Idle reclaims in a row (reset by sustained activity): the backoff's exponent.
    pub idle_reclaims: u32,
    /// After an idle reclaim: not before this time.
    pub resume_at: Option<Timestamp>,
    /// Stopped for idleness and requeued at this time, not yet back: it resumes only into room
    /// no one else in the cycle takes, without pre-empting anyone, or as soon as a probe
    /// shows its user back (`Event::ActivityProbed` after the stop).
    pub idle_suspended_at: Option<Timestamp>,
    /// An application probe has reported on it: its use is observable, so once stopped for
    /// idleness it waits for its user (a probe) instead of resuming into free room.
    pub probed: bool,
}

impl WorkloadState {
    /// A workload just submitted (pending, queued from `now`), as `Engine::resolve` placed it.
    fn new(
        spec: WorkloadSpec,
        (project, priority, preemptible, models): (ProjectId, i32, bool, Vec<ModelId>),
        now: Timestamp,
    ) -> WorkloadState {
        WorkloadState {
            project,
            priority,
            preemptible,
            models,
            stage: Stage::Pending,
            stop_kind: None,
            queued_at: now,
            pending_since: now,
            allocation: None,
            last_checkpoint_at: spec.checkpointing.and_then(|c| c.last_checkpoint_at),
            waiting_for: BTreeSet::new(),
            preemptions: 0,
            idle_reclaims: 0,
            resume_at: None,
            idle_suspended_at: None,
            probed: false,
            spec,
        }
    }

    fn shape(&self) -> MemberShape {
        MemberShape {
            gpus: self.spec.gpus_per_member,
            cpu: self.spec.cpu_millis_per_member,
            mem: self.spec.memory_mib_per_member,
        }
    }
}

/// A quota line as `Engine::project_lines` reports it: (key, used, guaranteed, borrow limit,
/// lend limit).
type ProjectLineView = (QuotaKey, Shares, Shares, Option<Shares>, Option<Shares>);

#[derive(Clone, Debug)]
pub(crate) struct ProjectState {
    pub name: String,
    pub cohort: usize,
    pub department: Option<String>,
    pub weight_milli: u64,
    pub queueing: Queueing,
    pub mode: PreemptionMode,
    pub preempt_within_project: WithinProject,
    pub borrow_within_cohort: Option<BorrowWithinCohort>,
    /// The project's fair share of its cohort, in shares.
    pub fair_share: f64,
    /// Shares held now by its admitted workloads.
    pub allocated: Shares,
    /// Exponentially decayed average of `allocated`, in shares.
    pub decayed_allocated: f64,
}

/// The deterministic scheduling engine. See the module docs for the cycle.
#[derive(Clone, Debug)]
pub struct Engine {
    pub(crate) models: Vec<String>,
    /// Every model id, in catalogue order: the candidates of an unconstrained workload.
    all_models: Vec<ModelId>,
    model_index: BTreeMap<String, ModelId>,
    pub(crate) node_names: Vec<String>,
    node_index: BTreeMap<String, NodeId>,
    /// Nodes the cluster reports down or drained, with its reason (`Event::NodeUnavailable`):
    /// exactly the nodes `capacity` flags unavailable.
    pub(crate) unavailable: BTreeMap<NodeId, String>,
    /// Devices held by work allot does not govern, per node, with who holds them
    /// (`Event::DevicesOccupied`): exactly the devices `capacity` flags occupied.
    pub(crate) occupied: BTreeMap<NodeId, Occupancy>,
    pub(crate) capacity: Capacity,
    pub(crate) quota: QuotaBook,
    pub(crate) projects: Vec<ProjectState>,
    project_index: BTreeMap<String, ProjectId>,
    pub(crate) cohort_names: Vec<String>,
    classes: Vec<PriorityClassSpec>,
    class_index: BTreeMap<String, usize>,
    default_class: usize,
    half_life_ms: u64,
    /// The defragmentation policy; `None`: off.
    pub(crate) defrag: Option<Defragmentation>,
    pub(crate) workloads: BTreeMap<WorkloadId, WorkloadState>,
    pub(crate) queues: Vec<queue::Queue>,
    /// The request shapes of queued work, numbered (`queue::Shapes`).
    shapes: queue::Shapes,
    /// Started workloads per project: the only pre-emption candidates.
    running: Vec<book::RunningSet>,
    preemptors: BTreeSet<WorkloadId>,
    /// What each waiting pre-emptor will charge once its victims are gone: (project, line,
    /// shares). The arbiter counts it as the project's usage, as Kueue reserves a
    /// pre-emptor's quota, so that two claimants never reclaim for the same guarantee.
    reservations: BTreeMap<WorkloadId, (ProjectId, QuotaKey, Shares)>,
    /// `reservations` summed per line, so the arbiter's `committed` is a lookup.
    reserved_by_line: BTreeMap<(ProjectId, QuotaKey), Shares>,
    /// Shares per (project, line) held by workloads told to stop: still charged until the
    /// backend reports the stop, but no longer lasting usage when judging who borrows.
    stopping_shares: BTreeMap<(ProjectId, QuotaKey), Shares>,
    /// Per waiting pre-emptor, the placement its pre-emption was planned for. During a cycle
    /// the free parts of it are held (`held`), so that nobody else (a requeued victim
    /// included) takes the room it counted on and forces another round of pre-emption.
    planned: BTreeMap<WorkloadId, Placement>,
    /// Room held for waiting pre-emptors during one cycle: single-member placements with the
    /// CPU and memory taken for each. Empty between cycles.
    held: BTreeMap<WorkloadId, Vec<(Placement, u64, u64)>>,
    rejected: Vec<(WorkloadId, String, RejectReason)>,
    stop_requests: BTreeMap<WorkloadId, StopReason>,
    /// (end time, workload) for running workloads with a max runtime.
    deadlines: BTreeSet<(Timestamp, WorkloadId)>,
    clock: Timestamp,
    /// Recent GPU demand, (CPU millicores, GPU shares), each decayed by 1/1024 per GPU
    /// submission: its ratio is the CPU per GPU placement keeps for free GPUs
    /// (`Capacity::cpu_per_gpu`).
    recent_demand: (u64, u64),
    /// The member shapes submitted, and the target mix placement's gradient is measured
    /// against (`engine/demand.rs`).
    census: demand::DemandCensus,
    /// The policy's idle rules, in order (`engine/idle.rs`).
    pub(crate) idle_rules: Vec<IdlePolicySpec>,
    /// Idle state per running workload that a rule covers.
    pub(crate) idle: BTreeMap<WorkloadId, IdleState>,
    /// (resume time, workload) of idle-reclaimed work waiting out its backoff.
    pub(crate) backoffs: BTreeSet<(Timestamp, WorkloadId)>,
    pub(crate) idle_resume_backoff_ms: u64,
    /// This cycle's idle victims for the arbiter: running, ready under an `on_pressure` rule
    /// of a model other than `amd_rm` (set by `idle_pass`).
    pub(crate) pressure_ready: BTreeSet<WorkloadId>,
    /// The arbiter's restart cost per victim GPU.
    pub(crate) restart_cost_ms: u64,
    /// Fair-sharing pre-emption, when the policy asks for it.
    pub(crate) fair_sharing: Option<FairSharing>,
    /// Protection from pre-emption thrash (`guard.rs`).
    pub(crate) guard: PreemptionGuard,
    /// When each workload was last stopped for other work, the latest
    /// `PreemptionGuard::COUNT_MAX` times, oldest first (the guard's cap counts them).
    pub(crate) preempted_at: BTreeMap<WorkloadId, Vec<Timestamp>>,
    pub(crate) default_class_name: String,
    /// The deferrals numbered for `decide_changes` (`queue::Reasons`).
    reasons: queue::Reasons,
    /// Set while `decide_changes` runs: deferrals that repeat what a queued workload was
    /// last told are not emitted.
    changes_only: bool,
    /// Set while `decide_news` runs: how many deferrals that only refresh figures may still
    /// be told this cycle, and how old a workload's last one must be.
    news: Option<(Refresh, usize)>,
    /// Cycles without the cycle's memory (`reference_cycles`): the reference the
    /// incremental cycle is tested against.
    pub(crate) reference: bool,
    /// The policy's reservations (`engine/reserve.rs`); `None`: off.
    reservation_policy: Option<Reservations>,
    /// The latest cycle's reservations, derived afresh each cycle (never saved).
    reserved: BTreeMap<WorkloadId, reserve::Reservation>,
    /// Devices held for reservations during one cycle. Empty between cycles.
    reserve_held: BTreeMap<WorkloadId, Vec<Placement>>,
    /// Quota held for the latest cycle's long-waiting requests (`reserve::QuotaHold`),
    /// derived afresh each cycle (never saved).
    quota_holds: Vec<reserve::QuotaHold>,
}

/// How `Engine::decide_news` tells again a deferral whose kind is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refresh {
    /// Not before the workload's last reported deferral is this old.
    pub min_age_ms: u64,
    /// At most this many refreshes a cycle.
    pub per_cycle: usize,
}

impl Refresh {
    /// Only changes of kind, never a refresh of figures: for callers that act on a deferral's
    /// kind alone (the simulator's replay).
    pub const KINDS_ONLY: Refresh = Refresh { min_age_ms: u64::MAX, per_cycle: 0 };
}

impl Default for Refresh {
    /// The daemon's: figures at most 2 s old, at most 1,000 refreshes a cycle (about a
    /// millisecond of words a cycle however deep the queue).
    fn default() -> Refresh {
        Refresh { min_age_ms: 2_000, per_cycle: 1_000 }
    }
}

impl Engine {
    /// Builds an engine over a cluster and a policy, checking what the core itself relies on.
    pub fn new(nodes: &[NodeSpec], policy: &PolicySpec) -> Result<Engine, ConfigError> {
        let mut model_names: BTreeSet<String> = BTreeSet::new();
        for node in nodes {
            for d in &node.devices {
                model_names.insert(d.model.clone());
            }
        }
        for q in policy
            .projects
            .iter()
            .flat_map(|p| &p.quotas)
            .chain(policy.cohorts.iter().flat_map(|c| &c.quotas))
        {
            if let QuotaModel::Model(m) = &q.model {
                model_names.insert(m.clone());
            }
        }
        if model_names.len() > usize::from(u16::MAX) {
            return Err(ConfigError::TooManyModels);
        }
        let models: Vec<String> = model_names.into_iter().collect();
        let model_index: BTreeMap<String, ModelId> =
            models.iter().enumerate().map(|(i, m)| (m.clone(), ModelId(i as u16))).collect();

        let mut seen_nodes = BTreeSet::new();
        let mut node_caps = Vec::with_capacity(nodes.len());
        for node in nodes {
            if !seen_nodes.insert(node.name.as_str()) {
                return Err(ConfigError::DuplicateNode { name: node.name.clone() });
            }
            let mut devices = Vec::with_capacity(node.devices.len());
            for d in &node.devices {
                let mig = match (d.mig, MigGpu::from_model(&d.model)) {
                    (false, _) => None,
                    (true, Some(gpu)) => Some(MigDevice::new(gpu)),
                    (true, None) => {
                        return Err(ConfigError::NoMigTable {
                            node: node.name.clone(),
                            model: d.model.clone(),
                        });
                    }
                };
                devices.push(DeviceCap {
                    model: model_index[&d.model],
                    island: d.island,
                    free: SHARES_PER_GPU as u32,
                    withheld: 0,
                    occupied: false,
                    mig,
                });
            }
            node_caps.push(NodeCap {
                cpu_total: node.cpu_millis,
                mem_total: node.memory_mib,
                free_cpu: node.cpu_millis,
                free_mem: node.memory_mib,
                devices,
                unavailable: false,
                withheld_cpu: 0,
                withheld_mem: 0,
            });
        }
        let mut capacity = Capacity::new(node_caps, models.len());
        capacity.set_domains(topology_domains(nodes, true), topology_domains(nodes, false));

        let mut class_index = BTreeMap::new();
        for (i, c) in policy.priority_classes.iter().enumerate() {
            if class_index.insert(c.name.clone(), i).is_some() {
                return Err(ConfigError::DuplicatePriorityClass { name: c.name.clone() });
            }
        }
        let default_class = *class_index.get(&policy.default_priority_class).ok_or_else(|| {
            ConfigError::UnknownDefaultPriorityClass { name: policy.default_priority_class.clone() }
        })?;

        let mut project_index = BTreeMap::new();
        let mut cohort_index: BTreeMap<String, usize> = BTreeMap::new();
        let mut cohort_names = Vec::new();
        // Declared cohorts first, so that their indices follow the policy file.
        for c in &policy.cohorts {
            if cohort_index.insert(c.name.clone(), cohort_names.len()).is_some() {
                return Err(ConfigError::DuplicateCohort { name: c.name.clone() });
            }
            cohort_names.push(c.name.clone());
        }
        let mut cohort_of = Vec::new();
        let mut lines = Vec::new();
        for (i, p) in policy.projects.iter().enumerate() {
            if project_index.insert(p.name.clone(), ProjectId(i as u32)).is_some() {
                return Err(ConfigError::DuplicateProject { name: p.name.clone() });
            }
            // A project without a cohort is a cohort of one, named after the project.
            let cohort_name = p.cohort.clone().unwrap_or_else(|| format!("{}:solo", p.name));
            let cohort = *cohort_index.entry(cohort_name.clone()).or_insert_with(|| {
                cohort_names.push(cohort_name);
                cohort_names.len() - 1
            });
            cohort_of.push(cohort);
            let mut project_lines = BTreeMap::new();
            for q in &p.quotas {
                let (key, model_label) = match &q.model {
                    QuotaModel::Any => (QuotaKey::Any, "any".to_string()),
                    QuotaModel::Model(m) => (QuotaKey::Model(model_index[m]), m.clone()),
                };
                if q.lend_limit.is_some_and(|l| l > q.guaranteed) {
                    return Err(ConfigError::LendLimitAboveGuarantee {
                        project: p.name.clone(),
                        model: model_label,
                    });
                }
                if p.cohort.is_none() && (q.lend_limit.is_some() || q.borrow_limit.is_some()) {
                    return Err(ConfigError::LimitWithoutCohort { project: p.name.clone() });
                }
                let line = QuotaLine {
                    guaranteed: q.guaranteed,
                    borrow_limit: q.borrow_limit,
                    lend_limit: q.lend_limit,
                    used: Shares::ZERO,
                };
                if project_lines.insert(key, line).is_some() {
                    return Err(ConfigError::DuplicateQuotaLine {
                        project: p.name.clone(),
                        model: model_label,
                    });
                }
            }
            lines.push(project_lines);
        }
        // The tree above the projects' cohorts: parents (a parent nobody declared is a root of
        // its own), each cohort's own quota, and no cycle.
        let mut parent: Vec<Option<usize>> = vec![None; cohort_names.len()];
        let mut own: Vec<BTreeMap<QuotaKey, CohortQuota>> =
            vec![BTreeMap::new(); cohort_names.len()];
        for (i, c) in policy.cohorts.iter().enumerate() {
            if let Some(name) = &c.parent {
                let up = *cohort_index.entry(name.clone()).or_insert_with(|| {
                    cohort_names.push(name.clone());
                    parent.push(None);
                    own.push(BTreeMap::new());
                    cohort_names.len() - 1
                });
                parent[i] = Some(up);
            }
            for q in &c.quotas {
                let (key, model_label) = match &q.model {
                    QuotaModel::Any => (QuotaKey::Any, "any".to_string()),
                    QuotaModel::Model(m) => (QuotaKey::Model(model_index[m]), m.clone()),
                };
                let quota = CohortQuota {
                    guaranteed: q.guaranteed,
                    borrow_limit: q.borrow_limit,
                    lend_limit: q.lend_limit,
                };
                if own[i].insert(key, quota).is_some() {
                    return Err(ConfigError::DuplicateQuotaLine {
                        project: format!("cohort {}", c.name),
                        model: model_label,
                    });
                }
            }
        }
        for (start, name) in cohort_names.iter().enumerate() {
            let (mut at, mut steps) = (start, 0);
            while let Some(up) = parent[at] {
                at = up;
                steps += 1;
                if steps > parent.len() {
                    return Err(ConfigError::CohortCycle { cohort: name.clone() });
                }
            }
        }
        let quota = QuotaBook::new(lines, cohort_of.clone(), parent, own);

        // Fair share: the cohort's total guarantee split by weight. A cohort with no
        // guarantee splits a nominal 1000 shares per unit of weight.
        let mut cohort_guarantee = vec![0u64; cohort_names.len()];
        let mut cohort_weight = vec![0u64; cohort_names.len()];
        for (i, p) in policy.projects.iter().enumerate() {
            let c = cohort_of[i];
            cohort_guarantee[c] += quota.lines[i].values().map(|l| l.guaranteed.0).sum::<u64>();
            cohort_weight[c] += p.weight_milli;
        }
        let projects = policy
            .projects
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let c = cohort_of[i];
                let fair_share = if cohort_guarantee[c] == 0 || cohort_weight[c] == 0 {
                    p.weight_milli as f64
                } else {
                    cohort_guarantee[c] as f64 * p.weight_milli as f64 / cohort_weight[c] as f64
                };
                ProjectState {
                    name: p.name.clone(),
                    cohort: c,
                    department: p.department.clone(),
                    weight_milli: p.weight_milli,
                    queueing: p.queueing,
                    mode: p.preemption_mode.unwrap_or(policy.preemption_mode),
                    preempt_within_project: p.preempt_within_project,
                    borrow_within_cohort: p.borrow_within_cohort,
                    fair_share,
                    allocated: Shares::ZERO,
                    decayed_allocated: 0.0,
                }
            })
            .collect::<Vec<_>>();
        let project_count = projects.len();

        Ok(Engine {
            all_models: (0..models.len()).map(|m| ModelId(m as u16)).collect(),
            models,
            model_index,
            node_names: nodes.iter().map(|n| n.name.clone()).collect(),
            node_index: nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.name.clone(), NodeId(i as u32)))
                .collect(),
            unavailable: BTreeMap::new(),
            occupied: BTreeMap::new(),
            capacity,
            quota,
            projects,
            project_index,
            cohort_names,
            classes: policy.priority_classes.clone(),
            class_index,
            default_class,
            half_life_ms: policy.fair_share_half_life_ms,
            defrag: policy.defragmentation,
            workloads: BTreeMap::new(),
            queues: vec![queue::Queue::default(); project_count],
            shapes: queue::Shapes::default(),
            running: vec![book::RunningSet::default(); project_count],
            preemptors: BTreeSet::new(),
            reservations: BTreeMap::new(),
            reserved_by_line: BTreeMap::new(),
            stopping_shares: BTreeMap::new(),
            planned: BTreeMap::new(),
            held: BTreeMap::new(),
            rejected: Vec::new(),
            stop_requests: BTreeMap::new(),
            deadlines: BTreeSet::new(),
            clock: Timestamp(0),
            recent_demand: (0, 0),
            census: demand::DemandCensus::default(),
            idle_rules: policy.idle.clone(),
            idle: BTreeMap::new(),
            backoffs: BTreeSet::new(),
            idle_resume_backoff_ms: policy.idle_resume_backoff_ms,
            pressure_ready: BTreeSet::new(),
            restart_cost_ms: policy.restart_cost_ms,
            fair_sharing: policy.fair_sharing.clone(),
            guard: policy.preemption_guard,
            preempted_at: BTreeMap::new(),
            default_class_name: policy.default_priority_class.clone(),
            reasons: queue::Reasons::default(),
            changes_only: false,
            news: None,
            reference: false,
            reservation_policy: policy.reservations,
            reserved: BTreeMap::new(),
            reserve_held: BTreeMap::new(),
            quota_holds: Vec::new(),
        })
    }

    // ----- names, for rendering at the edges -------------------------------------------------

    pub fn model_name(&self, id: ModelId) -> &str {
        self.models.get(id.0 as usize).map_or("?", String::as_str)
    }
    pub fn node_name(&self, id: NodeId) -> &str {
        self.node_names.get(id.0 as usize).map_or("?", String::as_str)
    }
    pub fn project_name(&self, id: ProjectId) -> &str {
        self.projects.get(id.0 as usize).map_or("?", |p| p.name.as_str())
    }
    pub fn model_id(&self, name: &str) -> Option<ModelId> {
        self.model_index.get(name).copied()
    }
    pub fn project_id(&self, name: &str) -> Option<ProjectId> {
        self.project_index.get(name).copied()
    }
    /// The node of that name in the cluster the engine was built with.
    pub fn node_id(&self, name: &str) -> Option<NodeId> {
        self.node_index.get(name).copied()
    }
    /// Why the node is unavailable (the cluster's reason), or `None` when it is usable.
    pub fn node_unavailable(&self, node: NodeId) -> Option<&str> {
        self.unavailable.get(&node).map(String::as_str)
    }
    /// Every unavailable node with its reason, by node id.
    pub fn unavailable_nodes(&self) -> impl Iterator<Item = (NodeId, &str)> + '_ {
        self.unavailable.iter().map(|(n, r)| (*n, r.as_str()))
    }
    /// Every node with devices held by work allot does not govern, by node id.
    pub fn occupied_devices(&self) -> impl Iterator<Item = (NodeId, &Occupancy)> + '_ {
        self.occupied.iter().map(|(n, o)| (*n, o))
    }
    pub fn key_name(&self, key: QuotaKey) -> &str {
        match key {
            QuotaKey::Any => "any",
            QuotaKey::Model(m) => self.model_name(m),
        }
    }
    pub fn workload_name(&self, id: WorkloadId) -> Option<&str> {
        self.workloads.get(&id).map(|w| w.spec.name.as_str())
    }
    /// What pre-empting this workload would do: its project's mode.
    pub fn victim_mode(&self, id: WorkloadId) -> Option<PreemptionMode> {
        self.workloads.get(&id).map(|w| self.projects[w.project.0 as usize].mode)
    }
    pub fn stage(&self, id: WorkloadId) -> Option<Stage> {
        self.workloads.get(&id).map(|w| w.stage)
    }
    /// Workloads the engine holds (pending, admitted, running or stopping), by id.
    pub fn workload_ids(&self) -> impl Iterator<Item = WorkloadId> + '_ {
        self.workloads.keys().copied()
    }
    pub fn node_count(&self) -> usize {
        self.node_names.len()
    }
    /// Whether any workload waits in a queue for admission (so an end of running work may
    /// let it in: a backend that polls for ends looks more often, `Backend::set_work_waiting`).
    pub fn has_pending(&self) -> bool {
        self.queues.iter().any(|q| !q.is_empty())
    }
    pub fn project_department(&self, id: ProjectId) -> Option<&str> {
        self.projects.get(id.0 as usize).and_then(|p| p.department.as_deref())
    }
    /// Which of its own work the project's pending work may pre-empt, and whether it may
    /// reclaim while it borrows (`None` for an unknown project).
    pub fn project_preemption_rules(
        &self,
        id: ProjectId,
    ) -> Option<(WithinProject, Option<BorrowWithinCohort>)> {
        self.projects.get(id.0 as usize).map(|p| (p.preempt_within_project, p.borrow_within_cohort))
    }
    /// The cohort's name; a project without a cohort is in `<project>:solo`.
    pub fn project_cohort(&self, id: ProjectId) -> Option<&str> {
        self.projects.get(id.0 as usize).map(|p| self.cohort_names[p.cohort].as_str())
    }
    /// The cohort the policy names for a project; `None` for one without (its cohort of one,
    /// `<project>:solo`, is the engine's bookkeeping: it neither borrows nor lends).
    pub fn project_declared_cohort(&self, id: ProjectId) -> Option<&str> {
        let p = self.projects.get(id.0 as usize)?;
        let cohort = self.cohort_names[p.cohort].as_str();
        (cohort.strip_suffix(":solo") != Some(p.name.as_str())).then_some(cohort)
    }
    pub fn project_count(&self) -> usize {
        self.projects.len()
    }
    /// The quota lines of a project: (key, used, guaranteed, borrow limit, lend limit).
    pub fn project_lines(&self, id: ProjectId) -> Vec<ProjectLineView> {
        self.quota.lines.get(id.0 as usize).map_or(Vec::new(), |lines| {
            lines
                .iter()
                .map(|(k, l)| (*k, l.used, l.guaranteed, l.borrow_limit, l.lend_limit))
                .collect()
        })
    }
    /// The placement a workload holds, if admitted.
    pub fn placement(&self, id: WorkloadId) -> Option<&Placement> {
        self.workloads.get(&id).and_then(|w| w.allocation.as_ref()).map(|a| &a.placement)
    }

    /// Replaces the defragmentation policy from the next cycle on, as a policy reload that
    /// changes only that part would: running work and the queue are untouched. `None`: off.
    pub fn set_defragmentation(&mut self, defragmentation: Option<Defragmentation>) {
        self.defrag = defragmentation;
    }

    // ----- the cycle ------------------------------------------------------------------------

    /// Runs one scheduling cycle at `now` and returns every decision it made: each pending
    /// workload gets exactly one `Admit`, `Defer` or `Reject`.
    pub fn decide(&mut self, now: Timestamp) -> Vec<Decision> {
        self.advance(now);
        self.prune_numbers();
        let mut out = Vec::new();

        // 1. Submissions that can never run.
        for (workload, name, reason) in std::mem::take(&mut self.rejected) {
            // A duplicate id's rejection is the last word on that id: the queued workload's
            // next deferral is news again.
            if self.changes_only {
                self.forget_reported(workload);
            }
            out.push(Decision::Reject { workload, name, reason });
        }

        self.stop_due(now, &mut out);
        self.idle_pass(now, &mut out);
        self.admission_cycle(now, &mut out, None);
        self.amd_pressure_pass(now, &mut out);
        out
    }

    /// `decide`, less each deferral that repeats the one this method last reported for the
    /// same workload: for callers that keep every workload's reason (the simulator), so that
    /// a deep queue does not hand them each pending workload every cycle. Every other
    /// decision, and the order of all, is `decide`'s.
    pub fn decide_changes(&mut self, now: Timestamp) -> Vec<Decision> {
        self.changes_only = true;
        let decisions = self.decide(now);
        self.changes_only = false;
        decisions
    }

    /// `decide_changes`, but a deferral of the same kind as the one last reported (only its
    /// figures moved: usage, free devices, the victims awaited) is told again only once the
    /// last report is `refresh.min_age_ms` old, and at most `refresh.per_cycle` such a cycle
    /// (the rest wait their turn, oldest report first by queue order). A change of kind is
    /// told at once. For the daemon: in a deep queue every finish moves the figures of most
    /// deferrals, and telling them all each cycle costs more than the cycle; what it keeps is
    /// at most that old in its figures (`explain` is always current). Every other decision,
    /// and the order of all, is `decide`'s.
    pub fn decide_news(&mut self, now: Timestamp, refresh: Refresh) -> Vec<Decision> {
        self.news = Some((refresh, refresh.per_cycle));
        let decisions = self.decide_changes(now);
        self.news = None;
        decisions
    }

    /// Makes every later cycle examine each pending workload from scratch, without the
    /// cycle's memory of failed shapes: the reference the property tests hold the incremental
    /// cycle to (`tests/properties.rs`). Slower; same decisions.
    #[doc(hidden)]
    pub fn reference_cycles(&mut self) {
        self.reference = true;
    }

    /// Step 2, shared with `explain` so that it sees the state the cycle sees.
    pub(crate) fn stop_due(&mut self, now: Timestamp, out: &mut Vec<Decision>) {
        // 2. Stops the engine owes: cancellations, then max runtimes that have passed.
        for (id, reason) in std::mem::take(&mut self.stop_requests) {
            if self
                .workloads
                .get(&id)
                .is_some_and(|w| matches!(w.stage, Stage::Assumed | Stage::Running))
            {
                self.mark_stopping(id, StopKind::Cancelled);
                out.push(Decision::Stop { workload: id, reason });
            }
        }
        while let Some(&(end, id)) = self.deadlines.first() {
            if end > now {
                break;
            }
            self.deadlines.pop_first();
            if let Some(w) = self.workloads.get(&id)
                && w.stage == Stage::Running
            {
                let started = w.allocation.as_ref().and_then(|a| a.started_at).unwrap_or(now);
                let reason = StopReason::MaxRuntimeExceeded {
                    max_runtime_ms: w.spec.max_runtime_ms.unwrap_or(0),
                    ran_ms: now.since(started),
                };
                self.mark_stopping(id, StopKind::MaxRuntime);
                out.push(Decision::Stop { workload: id, reason });
            }
        }
    }

    /// Steps 3 and 4. With `only`, stops after deciding that workload (used by `explain`).
    pub(crate) fn admission_cycle(
        &mut self,
        now: Timestamp,
        out: &mut Vec<Decision>,
        only: Option<WorkloadId>,
    ) {
        // Hold the free parts of every still-waiting pre-emptor's planned placement.
        for id in self.preemptors.clone() {
            if !self.victims_still_stopping(id).is_empty() {
                self.hold_plan(id);
            }
        }
        // Hold what is free of the reservations' nodes (engine/reserve.rs).
        self.plan_reservations(now);
        self.admission_steps(now, out, only);
        for id in self.held.keys().copied().collect::<Vec<_>>() {
            self.release_hold(id);
        }
        self.release_reservations();
        // Derived afresh every cycle: nothing is kept between cycles but for `explain`'s clone.
        if only.is_none() {
            self.reserved.clear();
            self.quota_holds.clear();
        }
    }
}

/// Per node, its rack (`racks`) or pool domain id: nodes with the same pool and rack share a
/// rack domain, nodes with the same pool a pool domain; a node without one has none.
fn topology_domains(nodes: &[NodeSpec], racks: bool) -> Vec<Option<u32>> {
    let mut ids: BTreeMap<(Option<&str>, Option<&str>), u32> = BTreeMap::new();
    nodes
        .iter()
        .map(|n| {
            let key = if racks {
                (n.pool.as_deref(), Some(n.rack.as_deref()?))
            } else {
                (Some(n.pool.as_deref()?), None)
            };
            let next = ids.len() as u32;
            Some(*ids.entry(key).or_insert(next))
        })
        .collect()
}
