//! What the engine is told: the cluster's hardware, the policy, and workload intent.
//!
//! These are plain data with names, not serde types: the config crate, the simulator and the
//! store convert their own formats into them (STYLE.md: serialize at the edges).

use std::collections::BTreeMap;

use crate::idle::IdleRule;
use crate::ids::{Shares, Timestamp, WorkloadId};
use crate::mig::MigProfile;

/// One machine with GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    pub name: String,
    pub cpu_millis: u64,
    pub memory_mib: u64,
    /// Free-form labels; `pool` and `rack` are also surfaced as fields below.
    pub labels: BTreeMap<String, String>,
    pub pool: Option<String>,
    pub rack: Option<String>,
    pub devices: Vec<DeviceSpec>,
}

/// One GPU (or one GPU partition exposed as a device). Each has 1000 shares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSpec {
    pub model: String,
    pub memory_mib: u64,
    /// Devices with the same island id on a node share a fast interconnect (NVLink, xGMI).
    pub island: u32,
    /// MIG-enabled: the device may be split into MIG instances (`GpuRequest::Mig`). Its table
    /// is chosen by `model` (`MigGpu::from_model`); `Engine::new` refuses a model without one.
    /// While any instance is on it, the device takes no whole or fractional request; while a
    /// whole or fractional request holds it, no instance.
    pub mig: bool,
}

/// The whole policy: projects, cohorts (named by projects), priority classes, defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicySpec {
    pub priority_classes: Vec<PriorityClassSpec>,
    /// Used when a workload names no priority class.
    pub default_priority_class: String,
    pub projects: Vec<ProjectSpec>,
    /// Half-life of past usage in fair-share ordering; 0 means point-in-time fairness.
    pub fair_share_half_life_ms: u64,
    /// What a pre-emption does unless the victim's project overrides it.
    pub preemption_mode: PreemptionMode,
    /// Protection from pre-emption thrash: a run after a restart, and a cap per workload.
    pub preemption_guard: PreemptionGuard,
    /// Defragmentation: `Some` lets the arbiter move preemptible work out of the way of a
    /// workload that fits the free capacity in total but not in one place. `None`: off.
    pub defragmentation: Option<Defragmentation>,
    /// Idle reclaim rules, in order: the first whose scope covers a workload judges it. A
    /// workload no rule covers is never judged idle.
    pub idle: Vec<IdlePolicySpec>,
    /// The arbiter's restart cost per GPU of a victim (image pull, start-up, warm-up), on
    /// top of the work it loses since its last checkpoint.
    pub restart_cost_ms: u64,
    /// First wait before work stopped for idleness may resume; doubled for each further idle
    /// reclaim of the same workload in a row, at most `IDLE_BACKOFF_MAX_MS`.
    pub idle_resume_backoff_ms: u64,
    /// Cohorts that hold quota of their own or sit inside another cohort (hierarchical quota).
    /// A cohort a project names and this list does not is a root with no quota of its own.
    pub cohorts: Vec<CohortSpec>,
    /// Fair-sharing pre-emption (Kueue's `fairSharing.preemptionStrategies`): a claimant that
    /// borrows may take borrowed GPUs from a project whose share of the cohort's lendable GPUs
    /// stays at least its own. `None`: off (reclaim only for a claimant within its quota).
    pub fair_sharing: Option<FairSharing>,
    /// Reservations for long-blocked requests (Slurm's backfill reservation): `None`: off.
    pub reservations: Option<Reservations>,
}

impl PolicySpec {
    /// A policy of nothing: no priority classes or projects, point-in-time fairness,
    /// suspend on pre-emption with the default guard, nothing else on, default costs. For
    /// tests and benchmarks, which set what they need with `PolicySpec { .., ..minimal() }`.
    pub fn minimal() -> PolicySpec {
        PolicySpec {
            priority_classes: Vec::new(),
            default_priority_class: String::new(),
            projects: Vec::new(),
            fair_share_half_life_ms: 0,
            preemption_mode: PreemptionMode::Suspend,
            preemption_guard: PreemptionGuard::DEFAULT,
            defragmentation: None,
            idle: Vec::new(),
            restart_cost_ms: PolicySpec::DEFAULT_RESTART_COST_MS,
            idle_resume_backoff_ms: PolicySpec::DEFAULT_IDLE_RESUME_BACKOFF_MS,
            cohorts: Vec::new(),
            fair_sharing: None,
            reservations: None,
        }
    }
}

/// Reservations (`engine/reserve.rs`): a whole-GPU request pending longer than `after_ms`
/// that quota allows gets the nodes where it would start earliest held for it; other work
/// goes there only if its max runtime ends before the reservation's expected start. Also, a
/// borrower is not admitted while a request of another project of its cohort, within its
/// guarantee, waits for room on the same quota line (it would only be reclaimed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservations {
    /// How long a request waits before nodes are held for it.
    pub after_ms: u64,
    /// At most this many reservations per GPU model at once (oldest requests first).
    pub per_model_max: u32,
    /// Quota is held too: for a reserved request, and for the oldest such request a quota
    /// line cannot hold yet, later work of its project and borrowers of other projects are
    /// not admitted on its line if that would leave it short, unless their max runtime ends by
    /// its expected start (`engine/reserve.rs`, `QuotaHold`).
    pub hold_quota: bool,
}

impl Reservations {
    pub const DEFAULT_PER_MODEL_MAX: u32 = 2;
    /// The most the policy may ask for: every reservation is recomputed each cycle. Plain
    /// Slurm reserves for every job its backfill pass tests (500 by default); 64 per model
    /// is what one FIFO queue of Philly at 6× needed to beat its model on every wait
    /// (docs/benchmarks.md, "The engine under plain Slurm's policy").
    pub const PER_MODEL_MAX: u32 = 64;
}

/// Fair-sharing pre-emption: the strategies, tried in order on each candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FairSharing {
    pub strategies: Vec<FairShareStrategy>,
}

impl Default for FairSharing {
    /// Kueue's default: both, the final-share test first.
    fn default() -> Self {
        FairSharing {
            strategies: vec![
                FairShareStrategy::LessThanOrEqualToFinalShare,
                FairShareStrategy::LessThanInitialShare,
            ],
        }
    }
}

/// When a borrower's work may be taken for a claimant that borrows too, by shares: a project's
/// share is what it borrows on the line over what its cohort could ever lend, over its weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FairShareStrategy {
    /// The claimant's share with the workload ≤ the borrower's share without the victim.
    LessThanOrEqualToFinalShare,
    /// The claimant's share with the workload < the borrower's share now; at most one victim
    /// per borrower this way.
    LessThanInitialShare,
}

impl FairShareStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            FairShareStrategy::LessThanOrEqualToFinalShare => "less_than_or_equal_to_final_share",
            FairShareStrategy::LessThanInitialShare => "less_than_initial_share",
        }
    }
}

/// A cohort with quota of its own and/or a parent cohort: a department that holds GPUs for
/// its projects, an organisation above departments. Its quota lines work as a project's:
/// `guaranteed` is its own (beside what its children lend it), `lend_limit` how much of its
/// subtree its parent's other children may borrow, `borrow_limit` how much it may take from
/// its parent beyond what it puts in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CohortSpec {
    pub name: String,
    pub parent: Option<String>,
    pub quotas: Vec<QuotaSpec>,
}

/// Longest wait before idle-reclaimed work may resume.
pub const IDLE_BACKOFF_MAX_MS: u64 = 4 * 3_600_000;

/// When an idle workload is reclaimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum IdleWhen {
    /// Only for a pending workload that quota and priority admit and that can be placed on
    /// real nodes once the chosen victims are gone (the `amd_rm` model: AMD's GPU-count check).
    #[default]
    OnPressure,
    /// As soon as the idle timer has run out (and the warning has been given).
    Always,
    /// Never: warn and record what would have been reclaimed.
    ReportOnly,
}

impl IdleWhen {
    pub fn as_str(self) -> &'static str {
        match self {
            IdleWhen::OnPressure => "on_pressure",
            IdleWhen::Always => "always",
            IdleWhen::ReportOnly => "report_only",
        }
    }
}

/// One idle reclaim rule of the policy (PRODUCT.md §3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdlePolicySpec {
    /// Names the rule in decisions and explanations.
    pub name: String,
    /// Projects covered; empty: every project.
    pub projects: Vec<String>,
    /// Workload kinds covered; empty: every kind.
    pub kinds: Vec<WorkloadKind>,
    /// Priority classes this rule never reclaims (their idleness is still reported).
    pub exempt_classes: Vec<String>,
    /// How idleness is judged: model, threshold, timer, sustain window, missing telemetry,
    /// start-up grace.
    pub rule: IdleRule,
    pub when: IdleWhen,
    /// What a reclaim does to the workload.
    pub action: PreemptionMode,
    /// A `Warn` decision comes this long before the action.
    pub warn_before_ms: u64,
}

impl IdlePolicySpec {
    /// Idle time from which a workload is warned: `warn_before` ahead of the timer.
    pub fn warn_from_ms(&self) -> u64 {
        self.warn_from_timer_ms(self.rule.idle_timer_ms)
    }

    /// As [`IdlePolicySpec::warn_from_ms`] for the timer that judges a workload now (the
    /// rule's quiet timer while its peers are quiet).
    pub fn warn_from_timer_ms(&self, timer_ms: u64) -> u64 {
        timer_ms.saturating_sub(self.warn_before_ms).max(1)
    }

    /// Whether the rule covers a workload of `project` and `kind`.
    pub fn covers(&self, project: &str, kind: WorkloadKind) -> bool {
        (self.projects.is_empty() || self.projects.iter().any(|p| p == project))
            && (self.kinds.is_empty() || self.kinds.contains(&kind))
    }
}

/// Protection from pre-emption thrash (ARCHITECTURE.md, "Pre-emption: one arbiter, one cost"). Covers every
/// pre-emption for other work — quota reclaim, priority, fair sharing, defragmentation — but
/// not idle reclaim, which the idle rules' own `min_runtime` governs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreemptionGuard {
    /// A workload restarted after a pre-emption or an idle reclaim is not pre-empted again
    /// this long after the restart (Slurm's `PreemptExemptTime`, for restarts: the cheapest
    /// victim by lost work is always the one that just restarted). 0: off.
    pub exempt_after_restart_ms: u64,
    /// At most this many pre-emptions of one workload in a sliding window. `None`: no cap.
    pub limit: Option<PreemptionLimit>,
    /// A claimant takes quota back from borrowers only once it has waited this long in the
    /// queue (since its place there: its submission, kept across pre-emptions): borrowed work
    /// that ends meanwhile makes its room without a stop. Cuts the work lost to reclaim where
    /// borrowed work is short. 0: at once (Kueue's behaviour). By queue place, not by its
    /// last requeue, so that a shape's earlier workloads have waited at least as long as its
    /// later ones (the cycle's memory of failed shapes relies on it).
    pub reclaim_after_ms: u64,
}

/// A workload pre-empted `count` times within `window_ms` is not pre-empted again until the
/// oldest of those leaves the window. A claimant within its guarantee may wait that long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreemptionLimit {
    pub count: u32,
    pub window_ms: u64,
}

impl PreemptionGuard {
    /// The most pre-emption times kept per workload, so the largest `count` a cap may have.
    pub const COUNT_MAX: u32 = 16;
    /// Nothing protected (Kueue's behaviour).
    pub const OFF: PreemptionGuard =
        PreemptionGuard { exempt_after_restart_ms: 0, limit: None, reclaim_after_ms: 0 };
    /// What a policy file that says nothing gets: a restarted workload runs at least about
    /// as long as the default restart cost before it may be taken again. Longer protection
    /// cuts thrash further but costs work: measured on the Philly replay at 6× load
    /// (docs/benchmarks.md), each protected restart makes the arbiter take a victim with more
    /// unsaved work instead.
    pub const DEFAULT: PreemptionGuard =
        PreemptionGuard { exempt_after_restart_ms: 2 * 60_000, limit: None, reclaim_after_ms: 0 };
}

impl Default for PreemptionGuard {
    fn default() -> Self {
        PreemptionGuard::DEFAULT
    }
}

/// The defragmentation policy (ARCHITECTURE.md, "Defragmentation").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Defragmentation {
    /// What restarting a moved workload costs, per GPU it holds, on top of the work it loses
    /// since its last checkpoint: image pull, start-up, warm-up.
    pub restart_cost_ms: u64,
    /// Also make room by moving work that holds GPU shares, for any claimant of one member
    /// (shares, or whole GPUs from one): the claimant is blocked by fragmentation when its
    /// model has its shares free in total, and a plan may consolidate fractional work onto
    /// partly used devices to open one. Off: only gangs of at least two whole GPUs while as
    /// many whole GPUs are free (the rule before fractional work was moved).
    pub consolidate_shares: bool,
    /// Most workloads one plan may move; a plan that needs more is not carried out. Bounds
    /// the disruption one claimant may cause. `None`: no cap.
    pub victims_max: Option<u32>,
}

impl Defragmentation {
    /// Two minutes of restart per GPU moved.
    pub const DEFAULT_RESTART_COST_MS: u64 = 120_000;
}

impl PolicySpec {
    /// The arbiter's default restart cost per GPU: two minutes.
    pub const DEFAULT_RESTART_COST_MS: u64 = 120_000;
    /// The default first backoff before idle-reclaimed work resumes: five minutes.
    pub const DEFAULT_IDLE_RESUME_BACKOFF_MS: u64 = 300_000;
}

impl Default for Defragmentation {
    fn default() -> Self {
        Defragmentation {
            restart_cost_ms: Defragmentation::DEFAULT_RESTART_COST_MS,
            consolidate_shares: false,
            victims_max: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PriorityClassSpec {
    pub name: String,
    /// Higher runs first and may pre-empt lower within a project.
    pub value: i32,
    /// Whether workloads of this class may be pre-empted (a workload may only narrow it).
    pub preemptible: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProjectSpec {
    pub name: String,
    /// Projects naming the same cohort lend to each other. `None`: a cohort of one.
    pub cohort: Option<String>,
    /// Reporting group above projects.
    pub department: Option<String>,
    pub quotas: Vec<QuotaSpec>,
    /// Relative weight in fair-share ordering, in thousandths (1000 = weight 1.0).
    pub weight_milli: u64,
    pub queueing: Queueing,
    /// Overrides `PolicySpec::preemption_mode` for this project's victims.
    pub preemption_mode: Option<PreemptionMode>,
    /// Which of the project's own running work its pending work may pre-empt (Kueue's
    /// `withinClusterQueue`).
    pub preempt_within_project: WithinProject,
    /// Whether its work may reclaim borrowed GPUs from other projects of the cohort and still
    /// borrow itself afterwards (Kueue's `borrowWithinCohort`). `None`: never (a claimant that
    /// reclaims must end within its guarantee).
    pub borrow_within_cohort: Option<BorrowWithinCohort>,
}

/// Which of a project's own running work its pending work may pre-empt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum WithinProject {
    /// Work of strictly lower priority.
    #[default]
    LowerPriority,
    /// Work of lower priority, or of equal priority submitted later than the pre-emptor.
    LowerOrNewerEqualPriority,
    /// None of it.
    Never,
}

impl WithinProject {
    pub fn as_str(self) -> &'static str {
        match self {
            WithinProject::LowerPriority => "lower_priority",
            WithinProject::LowerOrNewerEqualPriority => "lower_or_newer_equal_priority",
            WithinProject::Never => "never",
        }
    }
}

/// Reclaim while borrowing: a claimant of the project may take borrowed GPUs back from other
/// projects' work of strictly lower priority (and, with a threshold, of priority at most
/// `max_priority_threshold`) even though it borrows once they are gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct BorrowWithinCohort {
    pub max_priority_threshold: Option<i32>,
}

impl BorrowWithinCohort {
    /// Whether work of `victim` priority may be reclaimed by a claimant of `claimant` priority
    /// that will borrow.
    pub fn allows(&self, victim: i32, claimant: i32) -> bool {
        victim < claimant && self.max_priority_threshold.is_none_or(|t| victim <= t)
    }
}

/// The GPU model a quota line covers.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QuotaModel {
    /// Covers every model the project has no line of its own for.
    Any,
    Model(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaSpec {
    pub model: QuotaModel,
    pub guaranteed: Shares,
    /// How much beyond `guaranteed` the project may take from its cohort. `None`: no limit.
    pub borrow_limit: Option<Shares>,
    /// How much of its unused guarantee the cohort may borrow. `None`: all of it.
    pub lend_limit: Option<Shares>,
}

/// Order of a project's own queue when its head cannot start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Queueing {
    /// The head blocks everyone behind it in its project.
    StrictFifo,
    /// Workloads behind a blocked head may start if they fit.
    #[default]
    BestEffortFifo,
}

/// What happens to a pre-empted workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum PreemptionMode {
    /// Stopped (after a checkpoint request if checkpointable), requeued, resumed automatically.
    #[default]
    Suspend,
    /// Stopped and requeued to start over.
    Requeue,
    /// Stopped and removed.
    Delete,
}

impl PreemptionMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PreemptionMode::Suspend => "suspend",
            PreemptionMode::Requeue => "requeue",
            PreemptionMode::Delete => "delete",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum WorkloadKind {
    #[default]
    Training,
    Batch,
    Notebook,
    Inference,
    Service,
}

impl WorkloadKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::Training => "training",
            WorkloadKind::Batch => "batch",
            WorkloadKind::Notebook => "notebook",
            WorkloadKind::Inference => "inference",
            WorkloadKind::Service => "service",
        }
    }
}

/// GPUs asked by each member of a gang.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GpuRequest {
    /// Whole devices, all on the member's node.
    Whole(u32),
    /// Shares (1..=999) of one device.
    Shares(u32),
    /// One MIG instance of this profile on a MIG-enabled device, charged
    /// `MigProfile::shares` (compute slices × 1000 / 7, rounded down).
    Mig(MigProfile),
}

impl GpuRequest {
    /// Quota charged for one member.
    pub fn shares(self) -> Shares {
        match self {
            GpuRequest::Whole(n) => Shares::from_gpus(u64::from(n)),
            GpuRequest::Shares(s) => Shares(u64::from(s)),
            GpuRequest::Mig(p) => p.shares(),
        }
    }
}

/// How to ask a workload for a checkpoint before it is stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checkpointing {
    /// Time between the checkpoint request and the stop.
    pub grace_ms: u64,
    /// Last checkpoint the workload reported; work after it is lost on a stop.
    pub last_checkpoint_at: Option<Timestamp>,
}

/// A user's request (PRODUCT.md §2.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadSpec {
    pub id: WorkloadId,
    pub name: String,
    pub kind: WorkloadKind,
    pub project: String,
    pub user: String,
    /// `None`: the policy's default class.
    pub priority_class: Option<String>,
    /// Number of gang members (≥ 1); all start together or none does.
    pub members: u32,
    pub gpus_per_member: GpuRequest,
    /// Acceptable GPU models, in order of preference. Empty: any model.
    pub gpu_models: Vec<String>,
    pub cpu_millis_per_member: u64,
    pub memory_mib_per_member: u64,
    /// All members on one node (required).
    pub same_node: bool,
    /// Members on one node when some node has room; otherwise spread as little as possible
    /// (one rack, else one pool). Ignored when `same_node` is set.
    pub prefer_same_node: bool,
    /// `Some(false)` makes a workload of a preemptible class non-preemptible. `Some(true)` on a
    /// non-preemptible class is ignored: only the class can grant preemptibility.
    pub preemptible: Option<bool>,
    pub checkpointing: Option<Checkpointing>,
    /// Protection from pre-emption after start.
    pub min_runtime_ms: u64,
    /// Stopped after this long running.
    pub max_runtime_ms: Option<u64>,
    /// Wanted finish time; reported in explanations.
    pub deadline: Option<Timestamp>,
}

impl WorkloadSpec {
    /// A one-member workload with defaults, for tests and builders.
    pub fn new(id: u64, name: &str, project: &str, gpus: GpuRequest) -> WorkloadSpec {
        WorkloadSpec {
            id: WorkloadId(id),
            name: name.to_string(),
            kind: WorkloadKind::default(),
            project: project.to_string(),
            user: String::new(),
            priority_class: None,
            members: 1,
            gpus_per_member: gpus,
            gpu_models: Vec::new(),
            cpu_millis_per_member: 0,
            memory_mib_per_member: 0,
            same_node: false,
            prefer_same_node: false,
            preemptible: None,
            checkpointing: None,
            min_runtime_ms: 0,
            max_runtime_ms: None,
            deadline: None,
        }
    }

    /// Total quota charged for the whole gang.
    pub fn total_shares(&self) -> Shares {
        Shares(self.gpus_per_member.shares().0.saturating_mul(u64::from(self.members)))
    }
}

// Snapshot encoding (`codec.rs`).
crate::codec::codec_unit_enum!(WorkloadKind { Training, Batch, Notebook, Inference, Service });
crate::codec::codec_unit_enum!(PreemptionMode { Suspend, Requeue, Delete });
crate::codec::codec_struct!(Checkpointing { grace_ms, last_checkpoint_at });
crate::codec::codec_struct!(WorkloadSpec {
    id,
    name,
    kind,
    project,
    user,
    priority_class,
    members,
    gpus_per_member,
    gpu_models,
    cpu_millis_per_member,
    memory_mib_per_member,
    same_node,
    prefer_same_node,
    preemptible,
    checkpointing,
    min_runtime_ms,
    max_runtime_ms,
    deadline,
});

impl crate::codec::Codec for GpuRequest {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            GpuRequest::Whole(n) => (0u8, *n).encode(out),
            GpuRequest::Shares(n) => (1u8, *n).encode(out),
            GpuRequest::Mig(p) => {
                2u8.encode(out);
                p.encode(out);
            }
        }
    }
    fn decode(input: &mut &[u8]) -> Result<Self, crate::codec::CodecError> {
        match u8::decode(input)? {
            0 => Ok(GpuRequest::Whole(u32::decode(input)?)),
            1 => Ok(GpuRequest::Shares(u32::decode(input)?)),
            2 => Ok(GpuRequest::Mig(MigProfile::decode(input)?)),
            _ => Err(crate::codec::bad("unknown GPU request kind")),
        }
    }
}
