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

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use crate::capacity::{Capacity, DeviceCap, Layout, MemberShape, MigDevice, NodeCap};
use crate::decision::{
    AdmitReason, Decision, DeferReason, DeviceShare, MemberPlacement, Placement, PlacementFacts,
    PreemptReason, QuotaKey, RejectReason, StopReason,
};
use crate::event::Event;
use crate::ids::{ModelId, NodeId, ProjectId, SHARES_PER_GPU, Shares, Timestamp, WorkloadId};
use crate::mig::{COMPUTE_SLICES, MigGpu};
use crate::model::{
    Defragmentation, GpuRequest, IdlePolicySpec, NodeSpec, PolicySpec, PreemptionMode,
    PriorityClassSpec, Queueing, QuotaModel, WorkloadSpec,
};
use crate::quota::{QuotaBook, QuotaLine};

mod defrag;
mod eta;
mod idle;
mod inventory;
mod standing;
mod state;
pub use defrag::{DefragPlan, DefragVictim};
pub use eta::{ETA_ENDS_MAX, ETA_WORKLOADS_MAX, Eta, EtaCause, EtaUnknown, ROUNDS_PER_INSTANT};
pub(crate) use idle::IdleState;
pub use inventory::InventoryChange;
pub use standing::Standing;
pub use state::StateError;

/// Limits on one submission, so that a malformed request cannot make a cycle unbounded.
pub const MEMBERS_MAX: u32 = 4096;
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

    fn queue_key(&self) -> QueueKey {
        (Reverse(self.priority), self.queued_at, self.spec.id)
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

/// Victim order (see `Engine::plan_preemption`): (own project, priority, work lost in GPU-ms,
/// latest start first, id).
type VictimKey = (u8, i32, u64, Reverse<Timestamp>, WorkloadId);

/// Order inside a project: higher priority, then earlier submit, then lower id.
pub(crate) type QueueKey = (Reverse<i32>, Timestamp, WorkloadId);

#[derive(Clone, Debug)]
pub(crate) struct ProjectState {
    pub name: String,
    pub cohort: usize,
    pub department: Option<String>,
    pub weight_milli: u64,
    pub queueing: Queueing,
    pub mode: PreemptionMode,
    /// The project's fair share of its cohort, in shares.
    pub fair_share: f64,
    /// Shares held now by its admitted workloads.
    pub allocated: Shares,
    /// Exponentially decayed average of `allocated`, in shares.
    pub decayed_allocated: f64,
}

/// A cycle's memory of request shapes that found neither room nor victims. Capacity only
/// shrinks and claimed victims only grow within a cycle, so such a shape fails again.
type ShapeKey = (ProjectId, i32, u32, GpuRequest, Vec<ModelId>, u64, u64, Layout);

pub(crate) enum Outcome {
    Admitted(Decision),
    Preempting(Vec<Decision>),
    Deferred(DeferReason),
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
    pub(crate) queues: Vec<BTreeSet<QueueKey>>,
    /// Started workloads per project: the only pre-emption candidates.
    running: Vec<BTreeSet<WorkloadId>>,
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
    pub(crate) default_class_name: String,
}

/// Decay of `recent_demand` per GPU submission: about the last thousand count.
const DEMAND_DECAY: u64 = 1024;

/// The CPU per whole GPU of the recent demand (CPU millicores, GPU shares).
fn cpu_per_gpu((cpu, shares): (u64, u64)) -> u64 {
    let ratio = u128::from(cpu) * u128::from(SHARES_PER_GPU) / u128::from(shares.max(1));
    u64::try_from(ratio).unwrap_or(u64::MAX)
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
        for p in &policy.projects {
            for q in &p.quotas {
                if let QuotaModel::Model(m) = &q.model {
                    model_names.insert(m.clone());
                }
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
        let quota = QuotaBook::new(lines, cohort_of.clone());

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
            queues: vec![BTreeSet::new(); project_count],
            running: vec![BTreeSet::new(); project_count],
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
            idle_rules: policy.idle.clone(),
            idle: BTreeMap::new(),
            backoffs: BTreeSet::new(),
            idle_resume_backoff_ms: policy.idle_resume_backoff_ms,
            pressure_ready: BTreeSet::new(),
            restart_cost_ms: policy.restart_cost_ms,
            default_class_name: policy.default_priority_class.clone(),
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
    pub fn project_department(&self, id: ProjectId) -> Option<&str> {
        self.projects.get(id.0 as usize).and_then(|p| p.department.as_deref())
    }
    /// The cohort's name; a project without a cohort is in `<project>:solo`.
    pub fn project_cohort(&self, id: ProjectId) -> Option<&str> {
        self.projects.get(id.0 as usize).map(|p| self.cohort_names[p.cohort].as_str())
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

    /// Checks the invariants every cycle relies on, recomputing them from the allocations:
    /// no device share or CPU held twice (free + withheld + held = capacity on every device
    /// and node; nothing free on an unavailable node, nothing withheld on an available one,
    /// the unavailable nodes those the events named);
    /// quota `used` = the sum of charged allocations; cohort pools agree with their lines;
    /// no line above guarantee + borrow limit; stages agree with allocations and queues.
    pub fn audit(&self) -> Result<(), String> {
        let mut held: Vec<Vec<u64>> =
            self.capacity.nodes.iter().map(|n| vec![0; n.devices.len()]).collect();
        let mut cpu_held = vec![0u64; self.capacity.nodes.len()];
        let mut mem_held = vec![0u64; self.capacity.nodes.len()];
        let mut charged: BTreeMap<(ProjectId, QuotaKey), Shares> = BTreeMap::new();
        let mut stopping: BTreeMap<(ProjectId, QuotaKey), Shares> = BTreeMap::new();
        let mut allocated = vec![Shares::ZERO; self.projects.len()];
        for (id, w) in &self.workloads {
            let queued = self.queues[w.project.0 as usize].contains(&w.queue_key());
            match (w.stage, &w.allocation) {
                (Stage::Pending, None) if queued => {}
                (Stage::Pending, _) => {
                    return Err(format!("pending {id} holds devices or is not queued"));
                }
                (_, None) => return Err(format!("{id} is {:?} without an allocation", w.stage)),
                (_, Some(a)) => {
                    if queued {
                        return Err(format!("{id} is admitted and still queued"));
                    }
                    if a.placement.members.len() != w.spec.members as usize {
                        return Err(format!(
                            "{id} placed {} of {} members",
                            a.placement.members.len(),
                            w.spec.members
                        ));
                    }
                    for m in &a.placement.members {
                        let n = m.node.0 as usize;
                        cpu_held[n] += w.spec.cpu_millis_per_member;
                        mem_held[n] += w.spec.memory_mib_per_member;
                        for d in &m.devices {
                            held[n][d.device as usize] += u64::from(d.shares);
                            if self.capacity.nodes[n].devices[d.device as usize].model
                                != a.placement.model.unwrap_or(ModelId(u16::MAX))
                            {
                                return Err(format!("{id} holds a device of another model"));
                            }
                        }
                    }
                    if let Some(key) = a.key {
                        let c = charged.entry((w.project, key)).or_default();
                        *c = c.saturating_add(a.shares);
                        if w.stage == Stage::Stopping {
                            let st = stopping.entry((w.project, key)).or_default();
                            *st = st.saturating_add(a.shares);
                        }
                    }
                    allocated[w.project.0 as usize] =
                        allocated[w.project.0 as usize].saturating_add(a.shares);
                }
            }
        }
        if !self.held.is_empty() {
            return Err("room still held for pre-emptors between cycles".into());
        }
        if self.planned.keys().any(|p| !self.preemptors.contains(p))
            || self.reservations.keys().any(|p| !self.preemptors.contains(p))
        {
            return Err("a plan or reservation for a workload that waits for no victim".into());
        }
        let mut reserved: BTreeMap<(ProjectId, QuotaKey), Shares> = BTreeMap::new();
        for &(p, k, shares) in self.reservations.values() {
            adjust_line_total(&mut reserved, (p, k), |t| t.saturating_add(shares));
        }
        if reserved != self.reserved_by_line {
            return Err(format!(
                "reserved per line {:?} but reservations sum to {reserved:?}",
                self.reserved_by_line
            ));
        }
        if stopping != self.stopping_shares {
            return Err(format!(
                "stopping shares {:?} but stopping workloads hold {stopping:?}",
                self.stopping_shares
            ));
        }
        for (n, node) in self.capacity.nodes.iter().enumerate() {
            for (d, dev) in node.devices.iter().enumerate() {
                if u64::from(dev.free) + u64::from(dev.withheld) + held[n][d] != SHARES_PER_GPU {
                    return Err(format!(
                        "node {} device {d}: free {} + withheld {} + held {} != {SHARES_PER_GPU}",
                        self.node_names[n], dev.free, dev.withheld, held[n][d]
                    ));
                }
            }
            if node.free_cpu + node.withheld_cpu + cpu_held[n] != node.cpu_total
                || node.free_mem + node.withheld_mem + mem_held[n] != node.mem_total
            {
                return Err(format!("node {}: CPU or memory double-counted", self.node_names[n]));
            }
            let named = self.unavailable.contains_key(&NodeId(n as u32));
            let (free, withheld) = if node.unavailable {
                (node.free_cpu + node.free_mem, 0)
            } else {
                (0, node.withheld_cpu + node.withheld_mem)
            };
            let devices_wrong = node
                .devices
                .iter()
                .any(|d| if node.unavailable { d.free > 0 } else { d.withheld > 0 });
            if named != node.unavailable || free > 0 || withheld > 0 || devices_wrong {
                return Err(format!(
                    "node {}: unavailable {} (events say {named}) but free and withheld \
                     capacity disagree",
                    self.node_names[n], node.unavailable
                ));
            }
        }
        if self.unavailable.keys().any(|n| n.0 as usize >= self.capacity.nodes.len()) {
            return Err("an unavailable node that does not exist".into());
        }
        if self.capacity.domains.recount(&self.capacity) != self.capacity.domains {
            return Err("rack or pool free counts out of step with the devices".into());
        }
        for (p, lines) in self.quota.lines.iter().enumerate() {
            let project = ProjectId(p as u32);
            for (key, line) in lines {
                let expect = charged.get(&(project, *key)).copied().unwrap_or_default();
                if line.used != expect {
                    return Err(format!(
                        "{} {:?}: used {} but allocations hold {}",
                        self.projects[p].name, key, line.used, expect
                    ));
                }
                if let Some(view) = self.quota.view(project, *key)
                    && line.used > view.max
                {
                    return Err(format!(
                        "{} {:?}: used {} above its maximum {}",
                        self.projects[p].name, key, line.used, view.max
                    ));
                }
            }
            if allocated[p] != self.projects[p].allocated {
                return Err(format!("{}: allocated total out of step", self.projects[p].name));
            }
        }
        self.audit_mig()?;
        for (c, pools) in self.quota.pools.iter().enumerate() {
            for (key, pool) in pools {
                let used: u64 = self
                    .quota
                    .lines
                    .iter()
                    .enumerate()
                    .filter(|(p, _)| self.quota.cohort_of[*p] == c)
                    .filter_map(|(_, l)| l.get(key))
                    .map(|l| l.pool_use().0)
                    .sum();
                if used != pool.used.0 || pool.used > pool.contributed {
                    return Err(format!(
                        "cohort {}: pool {:?} used {} (lines say {used}) of {}",
                        self.cohort_names[c], key, pool.used, pool.contributed
                    ));
                }
            }
        }
        Ok(())
    }

    /// The cluster now, for the ledger: capacity, allocated and free shares, and the free
    /// shares no pending request could use (fragmented: on a device or node where no pending
    /// member fits — wrong model, too few whole devices or shares, or the host's CPU or memory
    /// gone). Capacity is what is usable: shares withheld on unavailable nodes (down or
    /// drained, held by no allocation) are neither capacity nor free, so allocated + free =
    /// capacity still holds; work still running on such a node counts as allocated.
    /// Costs O(devices × distinct pending shapes).
    pub fn cluster_snapshot(&self) -> crate::ledger::ClusterSnapshot {
        let mut shapes: BTreeSet<(Vec<ModelId>, MemberShape)> = BTreeSet::new();
        for queue in &self.queues {
            for &(_, _, id) in queue {
                if let Some(w) = self.workloads.get(&id)
                    && w.spec.total_shares() > Shares::ZERO
                {
                    shapes.insert((self.candidate_models(w).to_vec(), w.shape()));
                }
            }
        }
        let (mut capacity, mut free, mut fragmented) = (0u64, 0u64, 0u64);
        for node in &self.capacity.nodes {
            for d in &node.devices {
                capacity += SHARES_PER_GPU - u64::from(d.withheld);
                let f = u64::from(d.free);
                free += f;
                if f == 0 {
                    continue;
                }
                let usable = shapes.iter().any(|(models, shape)| {
                    models.contains(&d.model)
                        && node.fits_host(shape.cpu, shape.mem)
                        && match shape.gpus {
                            GpuRequest::Whole(k) => {
                                f == SHARES_PER_GPU && node.whole_free(d.model) >= k
                            }
                            GpuRequest::Shares(s) => f >= u64::from(s),
                            GpuRequest::Mig(p) => d.mig.is_some() && f >= p.shares().0,
                        }
                });
                if !usable {
                    fragmented += f;
                }
            }
        }
        crate::ledger::ClusterSnapshot {
            capacity_shares: capacity,
            allocated_shares: capacity - free,
            free_shares: free,
            fragmented_shares: fragmented,
        }
    }

    // ----- events ---------------------------------------------------------------------------

    /// Applies one fact. Events about unknown workloads or nodes are ignored, so duplicated or
    /// late acknowledgements are harmless.
    pub fn apply(&mut self, now: Timestamp, event: Event) {
        self.advance(now);
        match event {
            Event::WorkloadSubmitted(spec) => self.submit(now, spec),
            Event::WorkloadAdopted { spec, placement } => self.adopt(now, spec, placement),
            Event::WorkloadCancelled { workload } => self.cancel(workload),
            Event::AllocationStarted { workload } => {
                if let Some(w) = self.workloads.get_mut(&workload)
                    && w.stage == Stage::Assumed
                    && let Some(alloc) = w.allocation.as_mut()
                {
                    w.stage = Stage::Running;
                    alloc.started_at = Some(now);
                    if let Some(max) = w.spec.max_runtime_ms {
                        self.deadlines.insert((Timestamp(now.0.saturating_add(max)), workload));
                    }
                    self.running[w.project.0 as usize].insert(workload);
                    self.start_idle_tracking(workload, now);
                }
            }
            Event::AllocationFailed { workload, .. } => {
                if self.workloads.get(&workload).is_some_and(|w| w.stage == Stage::Assumed) {
                    self.release(workload);
                    self.requeue(workload);
                    if let Some(w) = self.workloads.get_mut(&workload) {
                        w.pending_since = now;
                    }
                }
            }
            Event::CheckpointSaved { workload } => {
                if let Some(w) = self.workloads.get_mut(&workload) {
                    w.last_checkpoint_at = Some(now);
                }
            }
            Event::WorkloadStopped { workload } => {
                let Some(w) = self.workloads.get(&workload) else { return };
                match (w.stage, w.stop_kind) {
                    (Stage::Pending, _) => {}
                    (
                        Stage::Stopping,
                        Some(kind @ (StopKind::Preempted(mode) | StopKind::Idle(mode))),
                    ) if mode != PreemptionMode::Delete => {
                        self.release(workload);
                        if let Some(w) = self.workloads.get_mut(&workload) {
                            w.preemptions = w.preemptions.saturating_add(1);
                            if mode == PreemptionMode::Requeue {
                                // Requeued work starts over; the old checkpoint is gone.
                                w.last_checkpoint_at = None;
                            }
                            if matches!(kind, StopKind::Idle(_)) {
                                // Idle work gave its GPUs up for not using them: it queues
                                // again behind those who waited, not in its old place.
                                w.queued_at = now;
                                w.idle_suspended_at = Some(now);
                            }
                        }
                        self.requeue(workload);
                        if let Some(w) = self.workloads.get_mut(&workload) {
                            w.pending_since = now;
                        }
                        if matches!(kind, StopKind::Idle(_)) {
                            self.start_idle_backoff(workload, now);
                        }
                    }
                    _ => self.remove(workload),
                }
            }
            Event::WorkloadFinished { workload } => self.remove(workload),
            Event::ActivitySampled { workload, readings } => {
                self.observe_idle(now, workload, Some(&readings), None);
            }
            Event::ActivityProbed { workload, last_activity } => {
                self.observe_idle(now, workload, None, Some(last_activity));
                self.user_back(workload, last_activity);
            }
            Event::NodeUnavailable { node, reason } => {
                if (node.0 as usize) < self.capacity.nodes.len() {
                    self.capacity.set_unavailable(node);
                    self.unavailable.insert(node, reason);
                }
            }
            Event::NodeAvailable { node } => {
                if self.unavailable.remove(&node).is_some() {
                    self.capacity.set_available(node);
                }
            }
        }
    }

    fn submit(&mut self, now: Timestamp, spec: WorkloadSpec) {
        let id = spec.id;
        if self.workloads.contains_key(&id) {
            self.rejected.push((id, spec.name.clone(), RejectReason::DuplicateId));
            return;
        }
        let (project, priority, preemptible, models) = match self.resolve(&spec) {
            Ok(resolved) => resolved,
            Err(reason) => {
                self.rejected.push((id, spec.name.clone(), reason));
                return;
            }
        };
        self.note_demand(&spec);
        let state = WorkloadState::new(spec, (project, priority, preemptible, models), now);
        self.queues[project.0 as usize].insert(state.queue_key());
        self.workloads.insert(id, state);
    }

    /// Work running outside allot, taken over where it runs (`Event::WorkloadAdopted`).
    fn adopt(&mut self, now: Timestamp, spec: WorkloadSpec, placement: Placement) {
        let id = spec.id;
        if self.workloads.contains_key(&id) {
            self.rejected.push((id, spec.name.clone(), RejectReason::DuplicateId));
            return;
        }
        let (project, priority, preemptible, models) = match self.resolve(&spec) {
            Ok(resolved) => resolved,
            Err(reason) => {
                self.rejected.push((id, spec.name.clone(), reason));
                return;
            }
        };
        let key = match self.adoptable(project, &spec, &placement) {
            Ok(key) => key,
            Err(detail) => {
                self.rejected.push((id, spec.name.clone(), RejectReason::CannotAdopt { detail }));
                return;
            }
        };
        let shares = spec.total_shares();
        let mut state = WorkloadState::new(spec, (project, priority, preemptible, models), now);
        state.stage = Stage::Running;
        state.allocation = Some(Allocation { key, placement, shares, started_at: Some(now) });
        if let Some(max) = state.spec.max_runtime_ms {
            self.deadlines.insert((Timestamp(now.0.saturating_add(max)), id));
        }
        self.workloads.insert(id, state);
        self.book_resources(id, true);
        let p = &mut self.projects[project.0 as usize];
        p.allocated = p.allocated.saturating_add(shares);
        self.running[project.0 as usize].insert(id);
        self.start_idle_tracking(id, now);
    }

    /// The quota line adopted work is charged to, if its placement matches its request, its
    /// devices are free and its project's quota can hold it; else what is wrong.
    fn adoptable(
        &self,
        project: ProjectId,
        spec: &WorkloadSpec,
        placement: &Placement,
    ) -> Result<Option<QuotaKey>, String> {
        if placement.members.len() != spec.members as usize {
            return Err(format!(
                "{} members placed for {} requested",
                placement.members.len(),
                spec.members
            ));
        }
        let per_member = spec.gpus_per_member.shares().0;
        if matches!(spec.gpus_per_member, GpuRequest::Mig(_)) {
            return Err("MIG instances are not adopted (their layout is not known)".into());
        }
        let model = placement.model;
        let mut seen = BTreeSet::new();
        for m in &placement.members {
            let Some(node) = self.capacity.nodes.get(m.node.0 as usize) else {
                return Err(format!("node {} does not exist", m.node.0));
            };
            let name = &self.node_names[m.node.0 as usize];
            // On an unavailable node the work already runs where nothing is free: what no
            // allocation holds is withheld there, and that is what it may take.
            let (cpu_free, mem_free) = if node.unavailable {
                (node.withheld_cpu, node.withheld_mem)
            } else {
                (node.free_cpu, node.free_mem)
            };
            if cpu_free < spec.cpu_millis_per_member || mem_free < spec.memory_mib_per_member {
                return Err(format!("{name} has not that much CPU or memory free"));
            }
            let held: u64 = m.devices.iter().map(|d| u64::from(d.shares)).sum();
            if held != per_member {
                return Err(format!("{name}: {held} shares placed for {per_member} requested"));
            }
            for d in &m.devices {
                let Some(dev) = node.devices.get(usize::from(d.device)) else {
                    return Err(format!("{name} has no device {}", d.device));
                };
                if !seen.insert((m.node, d.device)) || d.mig.is_some() {
                    return Err(format!("{name} device {} is listed twice", d.device));
                }
                if Some(dev.model) != model {
                    return Err(format!("{name} device {} is not the placement's model", d.device));
                }
                let free = if node.unavailable { dev.withheld } else { dev.free };
                if free < d.shares {
                    return Err(format!(
                        "{name} device {} has {} shares free, {} needed (allot placed other \
                         work there)",
                        d.device, free, d.shares
                    ));
                }
            }
        }
        let Some(model) = model else {
            return if per_member == 0 { Ok(None) } else { Err("no GPU model given".into()) };
        };
        let Some(key) = self.quota.resolve(project, QuotaKey::Model(model)) else {
            return Err(format!(
                "project {} has no quota for {}",
                self.projects[project.0 as usize].name,
                self.models[usize::from(model.0)]
            ));
        };
        let shares = spec.total_shares();
        if let Some(view) = self.quota.view(project, key)
            && view.used.saturating_add(shares) > view.max
        {
            return Err(format!(
                "project {} would hold {} shares on its {} line, above its maximum {}",
                self.projects[project.0 as usize].name,
                view.used.0.saturating_add(shares.0),
                self.key_name(key),
                view.max.0
            ));
        }
        Ok(Some(key))
    }

    /// A request's project, priority, preemptibility and acceptable models under this
    /// engine's policy, or why it can never run here.
    fn resolve(
        &self,
        spec: &WorkloadSpec,
    ) -> Result<(ProjectId, i32, bool, Vec<ModelId>), RejectReason> {
        let Some(&project) = self.project_index.get(&spec.project) else {
            return Err(RejectReason::UnknownProject { name: spec.project.clone() });
        };
        let class = match &spec.priority_class {
            None => self.default_class,
            Some(name) => match self.class_index.get(name) {
                Some(&c) => c,
                None => return Err(RejectReason::UnknownPriorityClass { name: name.clone() }),
            },
        };
        let mut models = Vec::new();
        for name in &spec.gpu_models {
            match self.model_index.get(name) {
                Some(&m) if !models.contains(&m) => models.push(m),
                Some(_) => {}
                None => return Err(RejectReason::UnknownModel { name: name.clone() }),
            }
        }
        if let Some(detail) = invalid_request(spec) {
            return Err(RejectReason::InvalidRequest { detail });
        }
        let class_spec = &self.classes[class];
        let preemptible = class_spec.preemptible && spec.preemptible != Some(false);
        Ok((project, class_spec.value, preemptible, models))
    }

    /// Fold a valid GPU submission into the recent demand and the CPU per GPU placement uses.
    fn note_demand(&mut self, spec: &WorkloadSpec) {
        let shares = spec.total_shares().0;
        if shares == 0 {
            return;
        }
        let cpu = spec.cpu_millis_per_member.saturating_mul(u64::from(spec.members));
        let (c, g) = self.recent_demand;
        let c = (c - c / DEMAND_DECAY).saturating_add(cpu);
        let g = (g - g / DEMAND_DECAY).saturating_add(shares);
        self.recent_demand = (c, g);
        self.capacity.cpu_per_gpu = cpu_per_gpu(self.recent_demand);
    }

    fn cancel(&mut self, id: WorkloadId) {
        let Some(w) = self.workloads.get_mut(&id) else { return };
        match w.stage {
            Stage::Pending => self.remove(id),
            Stage::Assumed | Stage::Running => {
                self.stop_requests.insert(id, StopReason::Cancelled);
            }
            // Already stopping: make sure it is not requeued afterwards.
            Stage::Stopping => w.stop_kind = Some(StopKind::Cancelled),
        }
    }

    /// Frees what the workload holds; it stays in the map (the caller decides its fate).
    fn release(&mut self, id: WorkloadId) {
        self.book_resources(id, false);
        let Some(w) = self.workloads.get_mut(&id) else { return };
        let stopping = w.stage == Stage::Stopping;
        let Some(alloc) = w.allocation.take() else { return };
        let project = w.project;
        if stopping && let Some(key) = alloc.key {
            adjust_line_total(&mut self.stopping_shares, (project, key), |t| {
                t.saturating_sub(alloc.shares)
            });
        }
        if let (Some(max), Some(started)) = (w.spec.max_runtime_ms, alloc.started_at) {
            self.deadlines.remove(&(Timestamp(started.0.saturating_add(max)), id));
        }
        let p = &mut self.projects[project.0 as usize];
        p.allocated = p.allocated.saturating_sub(alloc.shares);
        self.running[project.0 as usize].remove(&id);
        self.idle.remove(&id);
    }

    fn requeue(&mut self, id: WorkloadId) {
        let Some(w) = self.workloads.get_mut(&id) else { return };
        w.stage = Stage::Pending;
        w.stop_kind = None;
        let key = w.queue_key();
        self.queues[w.project.0 as usize].insert(key);
    }

    fn remove(&mut self, id: WorkloadId) {
        self.release(id);
        if let Some(w) = self.workloads.remove(&id) {
            self.queues[w.project.0 as usize].remove(&w.queue_key());
            self.end_wait(id);
            self.stop_requests.remove(&id);
            if let Some(at) = w.resume_at {
                self.backoffs.remove(&(at, id));
            }
        }
    }

    /// Moves the fair-share clock: decays each project's average allocation toward its
    /// current allocation with the configured half-life (exact for piecewise-constant use).
    pub(crate) fn advance(&mut self, now: Timestamp) {
        if now <= self.clock {
            return;
        }
        let dt = now.since(self.clock);
        self.clock = now;
        let keep = if self.half_life_ms == 0 {
            0.0
        } else {
            0.5f64.powf(dt as f64 / self.half_life_ms as f64)
        };
        for p in &mut self.projects {
            p.decayed_allocated = p.decayed_allocated * keep + p.allocated.0 as f64 * (1.0 - keep);
        }
    }

    // ----- the cycle ------------------------------------------------------------------------

    /// Runs one scheduling cycle at `now` and returns every decision it made: each pending
    /// workload gets exactly one `Admit`, `Defer` or `Reject`.
    pub fn decide(&mut self, now: Timestamp) -> Vec<Decision> {
        self.advance(now);
        let mut out = Vec::new();

        // 1. Submissions that can never run.
        for (workload, name, reason) in std::mem::take(&mut self.rejected) {
            out.push(Decision::Reject { workload, name, reason });
        }

        self.stop_due(now, &mut out);
        self.idle_pass(now, &mut out);
        self.admission_cycle(now, &mut out, None);
        self.amd_pressure_pass(now, &mut out);
        out
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
        self.admission_steps(now, out, only);
        for id in self.held.keys().copied().collect::<Vec<_>>() {
            self.release_hold(id);
        }
    }

    /// The victims a pre-emptor waits for that still hold their devices.
    fn victims_still_stopping(&self, preemptor: WorkloadId) -> Vec<WorkloadId> {
        self.workloads.get(&preemptor).map_or(Vec::new(), |w| {
            w.waiting_for
                .iter()
                .copied()
                .filter(|v| self.workloads.get(v).is_some_and(|v| v.stage == Stage::Stopping))
                .collect()
        })
    }

    /// Takes what is free now of the pre-emptor's planned placement, until `release_hold`.
    fn hold_plan(&mut self, preemptor: WorkloadId) {
        let (Some(plan), Some(w)) = (self.planned.get(&preemptor), self.workloads.get(&preemptor))
        else {
            return;
        };
        let plan = plan.clone();
        let (cpu, mem) = (w.spec.cpu_millis_per_member, w.spec.memory_mib_per_member);
        for member in &plan.members {
            let node = &self.capacity.nodes[member.node.0 as usize];
            let devices: Vec<DeviceShare> = member
                .devices
                .iter()
                .filter_map(|d| {
                    let dev = node.devices.get(d.device as usize)?;
                    let take = match d.mig {
                        // A MIG instance is held whole, once its slot is free, or not at all.
                        Some(slot) => {
                            if dev.mig_fits_at(slot) {
                                d.shares
                            } else {
                                0
                            }
                        }
                        None => dev.free.min(d.shares),
                    };
                    (take > 0).then_some(DeviceShare { device: d.device, shares: take, mig: d.mig })
                })
                .collect();
            let (c, m) = (node.free_cpu.min(cpu), node.free_mem.min(mem));
            let part = Placement {
                model: plan.model,
                members: vec![MemberPlacement { node: member.node, devices }],
            };
            self.capacity.take(&part, c, m);
            self.held.entry(preemptor).or_default().push((part, c, m));
        }
    }

    /// Gives back what `hold_plan` took; an exact inverse.
    fn release_hold(&mut self, preemptor: WorkloadId) {
        for (part, cpu, mem) in self.held.remove(&preemptor).unwrap_or_default() {
            self.capacity.give(&part, cpu, mem);
        }
    }

    fn admission_steps(
        &mut self,
        now: Timestamp,
        out: &mut Vec<Decision>,
        only: Option<WorkloadId>,
    ) {
        let mut failed_shapes: BTreeSet<ShapeKey> = BTreeSet::new();
        let mut handled: BTreeSet<WorkloadId> = BTreeSet::new();

        // Pre-emptors that did not start, per project: under strict FIFO they are heads that
        // block everyone queued behind them in step 4.
        let mut stuck: BTreeMap<usize, (QueueKey, WorkloadId)> = BTreeMap::new();

        // 3. Pre-emptors: wait while a victim still holds devices; go first once all are gone.
        for id in self.preemptors.clone() {
            let still = self.victims_still_stopping(id);
            let Some(w) = self.workloads.get(&id) else {
                self.end_wait(id);
                continue;
            };
            handled.insert(id);
            let (p, key) = (w.project.0 as usize, w.queue_key());
            let started = if still.is_empty() {
                self.end_wait(id);
                self.release_hold(id);
                if let Some(w) = self.workloads.get_mut(&id) {
                    w.waiting_for.clear();
                }
                self.schedule_one(now, id, &mut failed_shapes, out) == OutcomeKind::Admitted
            } else {
                let reason = DeferReason::WaitingForPreemption { victims: still };
                out.push(Decision::Defer { workload: id, reason });
                false
            };
            if !started && stuck.get(&p).is_none_or(|&(k, _)| key < k) {
                stuck.insert(p, (key, id));
            }
            if only == Some(id) {
                return;
            }
        }

        // 4. Projects in fair-share order, one workload at a time.
        let snapshot: Vec<Vec<WorkloadId>> = self
            .queues
            .iter()
            .map(|q| q.iter().map(|k| k.2).filter(|id| !handled.contains(id)).collect())
            .collect();
        let mut cursor = vec![0usize; snapshot.len()];
        let mut last_resumes: Vec<WorkloadId> = Vec::new();
        let mut order: BTreeSet<(u8, u64, ProjectId)> = BTreeSet::new();
        for (p, queue) in snapshot.iter().enumerate() {
            if let Some(&head) = queue.first() {
                order.insert(self.project_order_key(ProjectId(p as u32), head));
            }
        }
        while let Some((_, _, project)) = order.pop_first() {
            let p = project.0 as usize;
            let strict = self.projects[p].queueing == Queueing::StrictFifo;
            let id = snapshot[p][cursor[p]];
            let stuck_head = stuck
                .get(&p)
                .filter(|&&(k, _)| strict && k < self.workloads[&id].queue_key())
                .map(|&(_, head)| head);
            let head = match stuck_head {
                // Behind a pre-emptor that has not started: blocked like the rest below.
                Some(head) => head,
                None => {
                    cursor[p] += 1;
                    // Idle-suspended work past its backoff resumes after everyone else
                    // (below), into room nobody in this cycle took.
                    let resuming = self.workloads.get(&id).is_some_and(|w| {
                        w.idle_suspended_at.is_some() && w.resume_at.is_none_or(|t| t <= now)
                    });
                    let awaiting_use = self
                        .workloads
                        .get(&id)
                        .and_then(|w| w.idle_suspended_at.filter(|_| w.probed));
                    if let Some(since) = awaiting_use {
                        let reason = DeferReason::AwaitingUse { since };
                        out.push(Decision::Defer { workload: id, reason });
                        if only == Some(id) {
                            return;
                        }
                        if let Some(&next) = snapshot[p].get(cursor[p]) {
                            order.insert(self.project_order_key(project, next));
                        }
                        continue;
                    }
                    if resuming {
                        last_resumes.push(id);
                        if let Some(&next) = snapshot[p].get(cursor[p]) {
                            order.insert(self.project_order_key(project, next));
                        }
                        continue;
                    }
                    let outcome = self.schedule_one(now, id, &mut failed_shapes, out);
                    if only == Some(id) {
                        return;
                    }
                    // Work waiting out an idle backoff is not a head that blocks its
                    // project: it chose to wait, nobody behind it should.
                    let backing_off = self
                        .workloads
                        .get(&id)
                        .is_some_and(|w| w.resume_at.is_some_and(|t| t > now));
                    if outcome == OutcomeKind::Admitted || backing_off {
                        if let Some(&next) = snapshot[p].get(cursor[p]) {
                            order.insert(self.project_order_key(project, next));
                        }
                        continue;
                    }
                    id
                }
            };
            if strict {
                for &behind in &snapshot[p][cursor[p]..] {
                    let reason = DeferReason::BlockedByFifo { head };
                    out.push(Decision::Defer { workload: behind, reason });
                    if only == Some(behind) {
                        return;
                    }
                }
                cursor[p] = snapshot[p].len();
            }
            if let Some(&next) = snapshot[p].get(cursor[p]) {
                order.insert(self.project_order_key(project, next));
            }
        }

        // 5. Idle-suspended work resumes into what is left, oldest suspension first; it never
        // pre-empts (`try_schedule`).
        last_resumes.sort_by_key(|id| self.workloads.get(id).map(|w| (w.queued_at, *id)));
        for id in last_resumes {
            self.schedule_one(now, id, &mut failed_shapes, out);
            if only == Some(id) {
                return;
            }
        }
    }

    /// Projects whose next workload fits in their guarantee go before those that would
    /// borrow (a guarantee is honoured before lending); then the lowest fair-share standing;
    /// then the project id.
    fn project_order_key(&self, project: ProjectId, head: WorkloadId) -> (u8, u64, ProjectId) {
        let w = &self.workloads[&head];
        let total = w.spec.total_shares();
        let within = self.first_key(w).is_none_or(|key| {
            self.quota
                .line(project, key)
                .is_some_and(|l| l.used.saturating_add(total) <= l.guaranteed)
        });
        let p = &self.projects[project.0 as usize];
        let standing = if p.weight_milli == 0 {
            u64::MAX
        } else {
            let usage = p.allocated.0 as f64 + p.decayed_allocated;
            (usage / p.fair_share.max(1.0) * 1e6) as u64
        };
        (u8::from(!within), standing, project)
    }

    /// The quota line the workload's first acceptable model is charged to.
    fn first_key(&self, w: &WorkloadState) -> Option<QuotaKey> {
        if w.spec.total_shares() == Shares::ZERO {
            return None;
        }
        self.candidate_models(w)
            .iter()
            .find_map(|&m| self.quota.resolve(w.project, QuotaKey::Model(m)))
    }

    /// The GPU models a workload accepts, in order of preference: its own list, else all.
    pub(crate) fn candidate_models<'a>(&'a self, w: &'a WorkloadState) -> &'a [ModelId] {
        if w.models.is_empty() { &self.all_models } else { &w.models }
    }

    fn schedule_one(
        &mut self,
        now: Timestamp,
        id: WorkloadId,
        failed_shapes: &mut BTreeSet<ShapeKey>,
        out: &mut Vec<Decision>,
    ) -> OutcomeKind {
        match self.try_schedule(now, id, failed_shapes) {
            Outcome::Admitted(d) => {
                out.push(d);
                OutcomeKind::Admitted
            }
            Outcome::Preempting(decisions) => {
                let victims = decisions.iter().map(Decision::workload).collect();
                out.extend(decisions);
                let reason = DeferReason::WaitingForPreemption { victims };
                out.push(Decision::Defer { workload: id, reason });
                OutcomeKind::Waiting
            }
            Outcome::Deferred(reason) => {
                out.push(Decision::Defer { workload: id, reason });
                OutcomeKind::Deferred
            }
        }
    }

    /// Admit, pre-empt for, or defer one pending workload, against the current state.
    pub(crate) fn try_schedule(
        &mut self,
        now: Timestamp,
        id: WorkloadId,
        failed_shapes: &mut BTreeSet<ShapeKey>,
    ) -> Outcome {
        let w = &self.workloads[&id];
        if let Some(reason) = self.in_idle_backoff(w, now) {
            return Outcome::Deferred(reason);
        }
        let request = Request::of(w);
        let Request { project, shape, members, same_node, total, .. } = request;
        let shape_key: ShapeKey = (
            project,
            w.priority,
            members,
            shape.gpus,
            w.models.clone(),
            shape.cpu,
            shape.mem,
            request.layout(),
        );
        let known_failure = failed_shapes.contains(&shape_key);

        if total == Shares::ZERO {
            if !known_failure
                && let Some(placement) = self.capacity.find(None, shape, members, request.layout())
            {
                self.commit(id, None, placement.clone());
                return Outcome::Admitted(Decision::Admit {
                    workload: id,
                    placement,
                    reason: AdmitReason::NoGpuRequested,
                });
            }
            failed_shapes.insert(shape_key);
            return Outcome::Deferred(self.no_room(
                None,
                shape,
                members,
                request.layout(),
                same_node,
            ));
        }

        let models: Vec<ModelId> = self.candidate_models(w).to_vec();
        let mut best: Option<DeferReason> = None;
        let mut preemptible_models = Vec::new();
        let mut placement_blocked = Vec::new();
        for &m in &models {
            match self.check_model(&request, m, !known_failure) {
                ModelCheck::Fits(key, placement) => {
                    let before = self.quota.line(project, key).map_or(Shares::ZERO, |l| l.used);
                    self.commit(id, Some(key), placement.clone());
                    let (used, guaranteed) = self
                        .quota
                        .line(project, key)
                        .map_or((Shares::ZERO, Shares::ZERO), |l| (l.used, l.guaranteed));
                    let reason = if used > guaranteed {
                        AdmitReason::Borrowing {
                            project,
                            key,
                            borrowed: used.saturating_sub(guaranteed.max(before)),
                            used,
                            guaranteed,
                        }
                    } else {
                        AdmitReason::WithinGuarantee { project, key, used, guaranteed }
                    };
                    return Outcome::Admitted(Decision::Admit { workload: id, placement, reason });
                }
                ModelCheck::Blocked { reason, preempt_key } => {
                    if let Some(key) = preempt_key {
                        preemptible_models.push((m, key));
                        if reason.is_placement() {
                            placement_blocked.push((m, key));
                        }
                    }
                    if best.as_ref().is_none_or(|b| rank(&reason) > rank(b)) {
                        best = Some(reason);
                    }
                }
            }
        }

        // Idle-suspended work resumes only into free room: it was not using its GPUs.
        let may_preempt = self.workloads.get(&id).is_some_and(|w| w.idle_suspended_at.is_none());
        if !known_failure && may_preempt {
            for (m, key) in preemptible_models {
                if let Some((victims, placement)) = self.plan_preemption(now, id, m, key, true) {
                    return Outcome::Preempting(self.start_preemption(id, key, victims, placement));
                }
            }
            // Defragmentation: quota allows it, placement does not, the model has the room
            // in total (engine/defrag.rs).
            if let Some(policy) = self.defrag {
                for (m, key) in placement_blocked {
                    if let Some((plan, victims, placement)) =
                        self.plan_defrag(now, id, m, key, policy)
                        && plan.allowed()
                    {
                        return Outcome::Preempting(
                            self.start_preemption(id, key, victims, placement),
                        );
                    }
                }
            }
        }
        failed_shapes.insert(shape_key);
        Outcome::Deferred(best.unwrap_or(DeferReason::NoQuotaForModel { project }))
    }

    /// The checks `decide` and `explain` share: may this request start on model `m` now?
    /// Without `search`, a request that passes quota is reported as not placeable without a
    /// search (the cycle already knows its shape fails).
    pub(crate) fn check_model(&mut self, r: &Request, m: ModelId, search: bool) -> ModelCheck {
        let project = r.project;
        let Some(key) = self.quota.resolve(project, QuotaKey::Model(m)) else {
            return ModelCheck::blocked(DeferReason::NoQuotaForModel { project });
        };
        let Some(view) = self.quota.view(project, key) else {
            return ModelCheck::blocked(DeferReason::NoQuotaForModel { project });
        };
        if r.total > view.max {
            return ModelCheck::blocked(DeferReason::ExceedsMaxQuota {
                project,
                key,
                requested: r.total,
                max: view.max,
            });
        }
        if let GpuRequest::Mig(profile) = r.shape.gpus
            && !self.capacity.offers_mig(m, profile)
        {
            return ModelCheck::blocked(DeferReason::NoMigProfile { model: m, profile });
        }
        if !self.ever_placeable(m, r.shape, r.members, r.same_node) {
            return ModelCheck::blocked(DeferReason::NeverPlaceable {
                model: Some(m),
                members: r.members,
                per_member: r.shape.gpus.shares(),
                same_node: r.same_node,
            });
        }
        // Quota a waiting pre-emptor of this project reclaimed (its victims are stopping) is
        // not for work it outranks: else that work takes the quota the victims free, the
        // pre-emptor reclaims again, and the two take turns for ever. Work of equal priority
        // competes in queue order as ever (holding against it multiplied pre-emptions).
        let held = self.reserved_against(r, key).min(view.available);
        let available = view.available.saturating_sub(held);
        if r.total > available {
            // Blocked only by what waiting pre-emptors hold: it waits for them and reclaims
            // nothing for itself (its own pre-emptions would stop more work for quota that is
            // being freed already — at 3× the Philly trace's load, 14× the pre-emptions).
            let only_held = r.total <= view.available;
            return ModelCheck::Blocked {
                reason: DeferReason::QuotaExhausted {
                    project,
                    key,
                    requested: r.total,
                    used: view.used,
                    guaranteed: view.guaranteed,
                    available,
                    borrow_limited: view.borrow_limited,
                    held_for_preemptors: held,
                },
                preempt_key: (!only_held).then_some(key),
            };
        }
        if search
            && let Some(placement) = self.capacity.find(Some(m), r.shape, r.members, r.layout())
        {
            return ModelCheck::Fits(key, placement);
        }
        ModelCheck::Blocked {
            reason: self.no_room(Some(m), r.shape, r.members, r.layout(), r.same_node),
            preempt_key: Some(key),
        }
    }

    /// The quota of `r`'s project line `key` held for its waiting pre-emptors that outrank
    /// `r`.
    fn reserved_against(&self, r: &Request, key: QuotaKey) -> Shares {
        if self.reserved_by_line.get(&(r.project, key)).is_none_or(|s| *s == Shares::ZERO) {
            return Shares::ZERO;
        }
        self.reservations
            .iter()
            .filter(|&(id, &(p, k, _))| *id != r.id && p == r.project && k == key)
            .filter(|(id, _)| self.workloads.get(id).is_some_and(|w| w.priority > r.priority))
            .fold(Shares::ZERO, |sum, (_, &(_, _, s))| sum.saturating_add(s))
    }

    /// Why a request that passed quota finds no room: `NoPlacement` with the free capacity,
    /// or `NodesUnavailable` naming the unavailable nodes a placement would use if they were
    /// usable (a what-if search, made only while some node is unavailable).
    fn no_room(
        &mut self,
        model: Option<ModelId>,
        shape: MemberShape,
        members: u32,
        layout: Layout,
        same_node: bool,
    ) -> DeferReason {
        let facts = self.facts(model, shape, members, same_node);
        if self.unavailable.is_empty() {
            return DeferReason::NoPlacement(facts);
        }
        let down: Vec<NodeId> = self.unavailable.keys().copied().collect();
        let found =
            self.capacity.with_nodes_usable(&down, |cap| cap.find(model, shape, members, layout));
        let needed: BTreeSet<NodeId> =
            found.iter().flat_map(|p| p.members.iter().map(|m| m.node)).collect();
        let nodes: Vec<(NodeId, String)> = needed
            .into_iter()
            .filter_map(|n| self.unavailable.get(&n).map(|reason| (n, reason.clone())))
            .collect();
        if nodes.is_empty() {
            DeferReason::NoPlacement(facts)
        } else {
            DeferReason::NodesUnavailable { facts, nodes }
        }
    }

    fn ever_placeable(
        &self,
        m: ModelId,
        shape: MemberShape,
        members: u32,
        same_node: bool,
    ) -> bool {
        let per_node = self.capacity.max_devices_per_node.get(m.0 as usize).copied().unwrap_or(0);
        match shape.gpus {
            GpuRequest::Whole(k) if same_node => k.saturating_mul(members) <= per_node,
            GpuRequest::Whole(k) => k <= per_node,
            GpuRequest::Shares(s) if same_node => {
                u64::from(s) * u64::from(members) <= u64::from(per_node) * SHARES_PER_GPU
            }
            GpuRequest::Shares(_) => per_node > 0,
            GpuRequest::Mig(profile) => {
                self.capacity.mig_ever_placeable(m, profile, members, same_node)
            }
        }
    }

    pub(crate) fn facts(
        &self,
        model: Option<ModelId>,
        shape: MemberShape,
        members: u32,
        same_node: bool,
    ) -> PlacementFacts {
        let (block, block_node) = model
            .and_then(|m| self.capacity.largest_block(m))
            .map_or((0, None), |(n, node)| (n, Some(node)));
        let m = model.map(|m| m.0 as usize);
        PlacementFacts {
            model,
            members,
            per_member: shape.gpus.shares(),
            same_node,
            largest_free_block: block,
            largest_free_block_node: block_node.filter(|_| block > 0),
            free_whole_gpus: m.and_then(|m| self.capacity.free_whole.get(m).copied()).unwrap_or(0),
            free_shares: Shares(
                m.and_then(|m| self.capacity.free_shares.get(m).copied()).unwrap_or(0),
            ),
            nodes_with_free: model.map_or(0, |m| self.capacity.nodes_with_free(m)),
            largest_device_free: Shares(u64::from(
                model.map_or(0, |m| self.capacity.largest_share_gap(m)),
            )),
            mig: match shape.gpus {
                GpuRequest::Mig(profile) => Some(profile),
                _ => None,
            },
        }
    }

    fn commit(&mut self, id: WorkloadId, key: Option<QuotaKey>, placement: Placement) {
        let Some(w) = self.workloads.get_mut(&id) else { return };
        let shares = w.spec.total_shares();
        let p = &mut self.projects[w.project.0 as usize];
        p.allocated = p.allocated.saturating_add(shares);
        self.queues[w.project.0 as usize].remove(&w.queue_key());
        w.stage = Stage::Assumed;
        w.allocation = Some(Allocation { key, placement, shares, started_at: None });
        w.idle_suspended_at = None;
        self.book_resources(id, true);
    }

    // ----- the pre-emption arbiter ----------------------------------------------------------

    /// Finds the cheapest victim set that lets `id` start on model `m` charged to `key`, or
    /// `None`. Candidates, in this order (ARCHITECTURE.md, "Victim ordering"):
    /// 1. work of other projects in the cohort that borrow on `key` (quota reclaim), only when
    ///    the claimant ends within its guarantee, before the claimant's own work;
    /// 2. lower priority first;
    /// 3. less work lost first (GPU-ms since the last checkpoint, or since start);
    /// 4. most recently started first;
    /// 5. lower workload id.
    ///
    /// With `protect`, non-preemptible workloads and those younger than their min runtime are
    /// never candidates; `explain` drops it to name who would have to go.
    /// Greedy removal in that order until the workload fits, then every victim but the last
    /// is put back if the workload still fits without it (Kueue's minimisation). The state is
    /// unchanged on return.
    pub(crate) fn plan_preemption(
        &mut self,
        now: Timestamp,
        id: WorkloadId,
        m: ModelId,
        key: QuotaKey,
        protect: bool,
    ) -> Option<(Vec<(WorkloadId, PreemptReason)>, Placement)> {
        let w = &self.workloads[&id];
        let (project, priority, total) = (w.project, w.priority, w.spec.total_shares());
        let (shape, members) = (w.shape(), w.spec.members);
        let layout = Layout::of(w.spec.same_node, w.spec.prefer_same_node);
        let cohort = self.projects[project.0 as usize].cohort;

        let eligible = |v: &WorkloadState| -> bool {
            v.stage == Stage::Running
                && v.allocation.as_ref().is_some_and(|a| a.placement.model == Some(m))
                && (!protect
                    || (v.preemptible
                        && v.allocation
                            .as_ref()
                            .and_then(|a| a.started_at)
                            .is_some_and(|s| now.since(s) >= v.spec.min_runtime_ms)))
        };
        // Candidates with what makes them one: quota reclaim from a borrower, the claimant's
        // own lower-priority work, or idle work past its timer under an `on_pressure` rule.
        // Own and reclaim candidates come from disjoint projects; an idle candidate may also
        // be one of them, and then counts as idle (the cheaper tier and reason).
        let mut picked: Vec<(WorkloadId, VictimKind)> = Vec::new();
        let mut own_shares = Shares::ZERO;
        for &v in &self.running[project.0 as usize] {
            let vw = &self.workloads[&v];
            if eligible(vw) && vw.priority < priority {
                own_shares = own_shares.saturating_add(vw.spec.total_shares());
                picked.push((v, VictimKind::Own));
            }
        }
        let guaranteed = self.quota.line(project, key)?.guaranteed;
        let reclaim_possible =
            self.committed(project, key, id).saturating_sub(own_shares).saturating_add(total)
                <= guaranteed;
        if reclaim_possible {
            for (q, other) in self.projects.iter().enumerate() {
                let q = ProjectId(q as u32);
                if q == project || other.cohort != cohort || !self.borrows(q, key, id) {
                    continue;
                }
                for &v in &self.running[q.0 as usize] {
                    let vw = &self.workloads[&v];
                    if eligible(vw) && vw.allocation.as_ref().is_some_and(|a| a.key == Some(key)) {
                        picked.push((v, VictimKind::Reclaim));
                    }
                }
            }
        }
        // Idle victims: any project, priority up to the claimant's; an exempt or
        // non-preemptible workload is never ready. `pressure_ready` is this cycle's list
        // (`idle_pass`), so a deep queue does not scan every tracked workload per claimant.
        if !self.pressure_ready.is_empty() {
            let idle: BTreeSet<WorkloadId> = self
                .pressure_ready
                .iter()
                .copied()
                .filter(|&v| {
                    v != id
                        && self
                            .workloads
                            .get(&v)
                            .is_some_and(|vw| vw.priority <= priority && eligible(vw))
                })
                .collect();
            picked.retain(|(v, _)| !idle.contains(v));
            picked.extend(idle.into_iter().map(|v| (v, VictimKind::Idle)));
        }
        let mut candidates: Vec<(VictimKey, VictimKind)> = picked
            .into_iter()
            .map(|(v, kind)| {
                let tier = u8::from(kind == VictimKind::Own);
                (self.victim_key(now, &self.workloads[&v], tier), kind)
            })
            .collect();
        candidates.sort();

        let fits = |engine: &mut Engine| -> bool {
            engine.quota.view(project, key).is_some_and(|v| v.available >= total)
                && engine.capacity.can_place(Some(m), shape, members, layout)
        };
        // Two passes, as Kueue's classical algorithm: first with reclaim candidates (valid
        // only if the claimant ends within its guarantee), then with the claimant's own
        // lower-priority work alone, so that a failed reclaim never hides a priority
        // pre-emption that works by itself.
        for with_reclaim in [true, false] {
            let pass: Vec<_> =
                candidates.iter().filter(|c| with_reclaim || c.1 != VictimKind::Reclaim).collect();
            if pass.is_empty() || (!with_reclaim && pass.len() == candidates.len()) {
                continue;
            }
            let mut removed: Vec<(WorkloadId, VictimKind)> = Vec::new();
            let mut fit = false;
            for &&(k, kind) in &pass {
                let v = k.4;
                let v_project = self.workloads[&v].project;
                // A borrower back within its guarantee is not reclaimed from any further.
                if kind == VictimKind::Reclaim && !self.borrows(v_project, key, id) {
                    continue;
                }
                self.lift(v);
                removed.push((v, kind));
                if fits(self) {
                    fit = true;
                    break;
                }
            }
            let mut kept_out = vec![true; removed.len()];
            if fit && removed.len() > 1 {
                for i in (0..removed.len() - 1).rev() {
                    self.unlift(removed[i].0);
                    if fits(self) {
                        kept_out[i] = false;
                    } else {
                        self.lift(removed[i].0);
                    }
                }
            }
            // Reclaim is only for a claimant that ends within its guarantee.
            let uses_reclaim =
                removed.iter().zip(&kept_out).any(|(r, &k)| k && r.1 == VictimKind::Reclaim);
            let within_after = self.committed(project, key, id).saturating_add(total) <= guaranteed;
            let ok = fit && (!uses_reclaim || within_after);
            // The room the workload will take once its victims are gone.
            let placement =
                if ok { self.capacity.find(Some(m), shape, members, layout) } else { None };
            // Reasons are computed while the victims are still lifted, then the state is
            // restored.
            let mut victims = Vec::new();
            for (i, &(v, kind)) in removed.iter().enumerate().rev() {
                if !kept_out[i] {
                    continue;
                }
                self.unlift(v);
                if ok {
                    let vw = &self.workloads[&v];
                    let idle = (kind == VictimKind::Idle).then(|| self.idle_facts(v)).flatten();
                    let reason = if let Some(idle) = idle {
                        PreemptReason::Idle { idle, gpu_count_only: false }
                    } else if kind == VictimKind::Reclaim {
                        let line =
                            self.quota.line(vw.project, key).map_or(Shares::ZERO, |l| l.guaranteed);
                        PreemptReason::QuotaReclaim {
                            borrower: vw.project,
                            claimant: project,
                            key,
                            borrowed: self.committed(vw.project, key, id).saturating_sub(line),
                        }
                    } else {
                        PreemptReason::Priority {
                            project,
                            victim_priority: vw.priority,
                            preemptor_priority: priority,
                        }
                    };
                    victims.push((v, reason));
                }
            }
            if let Some(placement) = placement {
                victims.sort_by_key(|(v, _)| *v);
                return Some((victims, placement));
            }
        }
        None
    }

    /// What a project's line will hold once the workloads told to stop are gone and its
    /// waiting pre-emptors (other than `except`) have started: the usage by which the arbiter
    /// judges who borrows and whether a claimant ends within its guarantee.
    fn committed(&self, project: ProjectId, key: QuotaKey, except: WorkloadId) -> Shares {
        let used = self.quota.line(project, key).map_or(Shares::ZERO, |l| l.used);
        let stopping = self.stopping_shares.get(&(project, key)).copied().unwrap_or_default();
        let reserved = self.reserved_by_line.get(&(project, key)).copied().unwrap_or_default();
        let own = match self.reservations.get(&except) {
            Some(&(p, k, s)) if p == project && k == key => s,
            _ => Shares::ZERO,
        };
        used.saturating_sub(stopping).saturating_add(reserved.saturating_sub(own))
    }

    /// Whether `project` borrows on `key` by its committed usage (see `committed`).
    fn borrows(&self, project: ProjectId, key: QuotaKey, except: WorkloadId) -> bool {
        self.quota
            .line(project, key)
            .is_some_and(|l| self.committed(project, key, except) > l.guaranteed)
    }

    /// Tells an admitted workload to stop: it is no pre-emption candidate any more and no
    /// lasting usage, though it holds its devices and quota until the backend reports the stop.
    fn mark_stopping(&mut self, id: WorkloadId, kind: StopKind) {
        let Some(w) = self.workloads.get_mut(&id) else { return };
        w.stage = Stage::Stopping;
        w.stop_kind = Some(kind);
        self.running[w.project.0 as usize].remove(&id);
        if let Some(a) = &w.allocation
            && let Some(key) = a.key
        {
            let shares = a.shares;
            adjust_line_total(&mut self.stopping_shares, (w.project, key), |t| {
                t.saturating_add(shares)
            });
        }
    }

    /// A pre-emptor stops waiting (its victims are gone, or it left the engine).
    fn end_wait(&mut self, id: WorkloadId) {
        self.preemptors.remove(&id);
        if let Some((p, k, s)) = self.reservations.remove(&id) {
            adjust_line_total(&mut self.reserved_by_line, (p, k), |t| t.saturating_sub(s));
        }
        self.planned.remove(&id);
    }

    fn victim_key(&self, now: Timestamp, v: &WorkloadState, tier: u8) -> VictimKey {
        let started = v.allocation.as_ref().and_then(|a| a.started_at).unwrap_or(now);
        let cost = victim_cost(now, v, self.idle_discount_ms(v.spec.id), self.restart_cost_ms);
        (tier, v.priority, cost, Reverse(started), v.spec.id)
    }

    /// Temporarily frees a running workload's quota and devices (the arbiter's what-if).
    fn lift(&mut self, v: WorkloadId) {
        self.book_resources(v, false);
    }

    /// Exact inverse of `lift`.
    fn unlift(&mut self, v: WorkloadId) {
        self.book_resources(v, true);
    }

    /// Takes (`hold`) or gives back the devices, CPU, memory and quota of `v`'s allocation.
    /// The only place that moves them, so admission, release and the arbiter's what-if can
    /// never disagree.
    fn book_resources(&mut self, v: WorkloadId, hold: bool) {
        let Some(w) = self.workloads.get(&v) else { return };
        let Some(a) = &w.allocation else { return };
        let (cpu, mem) = (w.spec.cpu_millis_per_member, w.spec.memory_mib_per_member);
        if hold {
            self.capacity.take(&a.placement, cpu, mem);
        } else {
            self.capacity.give(&a.placement, cpu, mem);
        }
        if let Some(key) = a.key {
            if hold {
                self.quota.charge(w.project, key, a.shares);
            } else {
                self.quota.release(w.project, key, a.shares);
            }
        }
    }

    fn start_preemption(
        &mut self,
        preemptor: WorkloadId,
        key: QuotaKey,
        victims: Vec<(WorkloadId, PreemptReason)>,
        placement: Placement,
    ) -> Vec<Decision> {
        let mut decisions = Vec::with_capacity(victims.len());
        for (v, reason) in victims {
            let Some(vw) = self.workloads.get(&v) else { continue };
            let checkpoint_grace_ms = vw.spec.checkpointing.map(|c| c.grace_ms);
            // An idle victim gets its rule's action and the idle backoff; others the mode of
            // their project.
            let (mode, kind) = match &reason {
                PreemptReason::Idle { idle, .. } => (idle.action, StopKind::Idle(idle.action)),
                _ => {
                    let mode = self.projects[vw.project.0 as usize].mode;
                    (mode, StopKind::Preempted(mode))
                }
            };
            self.mark_stopping(v, kind);
            decisions.push(Decision::Preempt {
                victim: v,
                for_workload: preemptor,
                mode,
                reason,
                checkpoint_grace_ms,
            });
        }
        if let Some(w) = self.workloads.get_mut(&preemptor) {
            w.waiting_for = decisions.iter().map(Decision::workload).collect();
            let shares = w.spec.total_shares();
            self.reservations.insert(preemptor, (w.project, key, shares));
            adjust_line_total(&mut self.reserved_by_line, (w.project, key), |t| {
                t.saturating_add(shares)
            });
        }
        self.preemptors.insert(preemptor);
        self.planned.insert(preemptor, placement);
        // Hold its free room for the rest of this cycle too.
        self.hold_plan(preemptor);
        decisions
    }
}

/// Why a running workload is a pre-emption candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum VictimKind {
    /// Its project borrows on the claimant's line and the claimant needs its guarantee.
    Reclaim,
    /// The claimant's own project, lower priority.
    Own,
    /// Idle past its `on_pressure` rule's timer and warned.
    Idle,
}

/// The arbiter's one cost of stopping `v` now, in GPU-ms (ARCHITECTURE.md, "One cost"): the
/// work lost since its last checkpoint (since its start if it has none) less the time it has
/// been idle (idle time is no work), plus `restart_cost_ms`, both per GPU it holds — so a gang
/// costs in proportion to its size.
pub(crate) fn victim_cost(
    now: Timestamp,
    v: &WorkloadState,
    idle_ms: u64,
    restart_cost_ms: u64,
) -> u64 {
    let shares = v.spec.total_shares().0;
    let started = v.allocation.as_ref().and_then(|a| a.started_at).unwrap_or(now);
    let since = v.last_checkpoint_at.filter(|&c| c > started).unwrap_or(started);
    let lost = now.since(since).saturating_sub(idle_ms);
    shares.saturating_mul(lost.saturating_add(restart_cost_ms)) / SHARES_PER_GPU
}

/// One pending request, as the checks see it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request {
    pub id: WorkloadId,
    pub priority: i32,
    pub project: ProjectId,
    pub shape: MemberShape,
    pub members: u32,
    pub same_node: bool,
    pub prefer_same_node: bool,
    pub total: Shares,
}

impl Request {
    pub(crate) fn of(w: &WorkloadState) -> Request {
        Request {
            id: w.spec.id,
            priority: w.priority,
            project: w.project,
            shape: w.shape(),
            members: w.spec.members,
            same_node: w.spec.same_node,
            prefer_same_node: w.spec.prefer_same_node,
            total: w.spec.total_shares(),
        }
    }

    pub(crate) fn layout(&self) -> Layout {
        Layout::of(self.same_node, self.prefer_same_node)
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

pub(crate) enum ModelCheck {
    Fits(QuotaKey, Placement),
    /// With `preempt_key`, removing victims charged to that line could help.
    Blocked {
        reason: DeferReason,
        preempt_key: Option<QuotaKey>,
    },
}

impl ModelCheck {
    fn blocked(reason: DeferReason) -> ModelCheck {
        ModelCheck::Blocked { reason, preempt_key: None }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OutcomeKind {
    Admitted,
    Waiting,
    Deferred,
}

/// Updates a per-line running total, dropping the entry at zero so that totals compare equal
/// to a recomputation in `audit`.
fn adjust_line_total(
    totals: &mut BTreeMap<(ProjectId, QuotaKey), Shares>,
    line: (ProjectId, QuotaKey),
    f: impl FnOnce(Shares) -> Shares,
) {
    let next = f(totals.get(&line).copied().unwrap_or_default());
    if next == Shares::ZERO {
        totals.remove(&line);
    } else {
        totals.insert(line, next);
    }
}

/// How close a deferral came to starting; the closest reason across models is reported.
fn rank(reason: &DeferReason) -> u8 {
    match reason {
        DeferReason::NoQuotaForModel { .. } => 0,
        DeferReason::NeverPlaceable { .. } | DeferReason::NoMigProfile { .. } => 1,
        DeferReason::ExceedsMaxQuota { .. } => 2,
        DeferReason::QuotaExhausted { .. } => 3,
        DeferReason::NoPlacement(_) | DeferReason::NodesUnavailable { .. } => 4,
        DeferReason::BlockedByFifo { .. }
        | DeferReason::WaitingForPreemption { .. }
        | DeferReason::IdleBackoff { .. }
        | DeferReason::AwaitingUse { .. } => 5,
    }
}

fn invalid_request(spec: &WorkloadSpec) -> Option<String> {
    if spec.members == 0 {
        return Some("members must be at least 1".into());
    }
    if spec.members > MEMBERS_MAX {
        return Some(format!("members must be at most {MEMBERS_MAX}"));
    }
    match spec.gpus_per_member {
        GpuRequest::Whole(n) if n > WHOLE_GPUS_PER_MEMBER_MAX => {
            Some(format!("at most {WHOLE_GPUS_PER_MEMBER_MAX} GPUs per member"))
        }
        GpuRequest::Shares(s) if s == 0 || u64::from(s) >= SHARES_PER_GPU => {
            Some(format!("a fractional GPU must be 1..=999 shares, got {s}"))
        }
        GpuRequest::Mig(p) if !(1..=COMPUTE_SLICES).contains(&p.compute_slices) => {
            Some(format!("a MIG profile has 1 to {COMPUTE_SLICES} compute slices, got {p}"))
        }
        _ => None,
    }
}
