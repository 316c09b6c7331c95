//! What the engine decides, in the imperative, each with a typed reason.
//!
//! Decisions carry ids, not names, so a cycle over 50,000 workloads allocates little;
//! `Engine::render` turns one into a sentence with names.

use crate::idle::{IdleModel, Signal};
use crate::ids::{ModelId, NodeId, ProjectId, Shares, Timestamp, WorkloadId};
use crate::mig::MigProfile;
use crate::model::{IdleWhen, PreemptionMode};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Start the workload on this placement. Assumed until `AllocationStarted`/`AllocationFailed`.
    Admit { workload: WorkloadId, placement: Placement, reason: AdmitReason },
    /// Stop `victim` so that `for_workload` can start. With `checkpoint_grace_ms`, ask for a
    /// checkpoint first and wait that long before stopping.
    Preempt {
        victim: WorkloadId,
        for_workload: WorkloadId,
        mode: PreemptionMode,
        reason: PreemptReason,
        checkpoint_grace_ms: Option<u64>,
    },
    /// Stop a workload for a reason of its own (cancelled, ran past its max runtime).
    Stop { workload: WorkloadId, reason: StopReason },
    /// The workload is idle and will be reclaimed at `action_at` unless it becomes active
    /// (`None` for `report_only` rules and exempt workloads: reported, never acted on).
    Warn { workload: WorkloadId, idle: IdleFacts, action_at: Option<Timestamp> },
    /// Reclaim an idle workload under an `always` rule (no pending workload needs it): stop it
    /// with `mode`, after a checkpoint request and `checkpoint_grace_ms` if checkpointable.
    Reclaim {
        workload: WorkloadId,
        mode: PreemptionMode,
        idle: IdleFacts,
        checkpoint_grace_ms: Option<u64>,
    },
    /// Leave the workload pending this cycle.
    Defer { workload: WorkloadId, reason: DeferReason },
    /// The submission can never run as written; it is dropped. `name` is kept here because
    /// the engine holds nothing else of a rejected workload.
    Reject { workload: WorkloadId, name: String, reason: RejectReason },
}

impl Decision {
    pub fn workload(&self) -> WorkloadId {
        match self {
            Decision::Admit { workload, .. }
            | Decision::Stop { workload, .. }
            | Decision::Defer { workload, .. }
            | Decision::Reject { workload, .. }
            | Decision::Warn { workload, .. }
            | Decision::Reclaim { workload, .. } => *workload,
            Decision::Preempt { victim, .. } => *victim,
        }
    }

    /// The action word used in reports and JSON: `admit`, `preempt`, `stop`, `defer`, `reject`,
    /// `warn`, `reclaim`.
    pub fn action(&self) -> &'static str {
        match self {
            Decision::Admit { .. } => "admit",
            Decision::Preempt { .. } => "preempt",
            Decision::Stop { .. } => "stop",
            Decision::Defer { .. } => "defer",
            Decision::Reject { .. } => "reject",
            Decision::Warn { .. } => "warn",
            Decision::Reclaim { .. } => "reclaim",
        }
    }
}

/// Where each gang member runs.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Placement {
    /// The GPU model of every device used; `None` for a CPU-only workload.
    pub model: Option<ModelId>,
    pub members: Vec<MemberPlacement>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberPlacement {
    pub node: NodeId,
    pub devices: Vec<DeviceShare>,
}

/// A slice of one device: `shares` of device `device` (its index on the node). For a MIG
/// instance, `mig` says which (profile and first memory slice) and `shares` is its charge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeviceShare {
    pub device: u16,
    pub shares: u32,
    pub mig: Option<MigSlot>,
}

/// A MIG instance on a device: its profile and the memory slice it starts at (`3g.40gb@4`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MigSlot {
    pub profile: MigProfile,
    pub start: u8,
}

impl std::fmt::Display for MigSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.profile, self.start)
    }
}

/// The quota line a workload is charged to: a model-specific line or the project's "any" line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QuotaKey {
    Any,
    Model(ModelId),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdmitReason {
    /// Fits in the project's own guarantee; `used` is the line's usage with this workload.
    WithinGuarantee { project: ProjectId, key: QuotaKey, used: Shares, guaranteed: Shares },
    /// Uses `borrowed` shares of the cohort's lendable capacity beyond the guarantee.
    Borrowing {
        project: ProjectId,
        key: QuotaKey,
        borrowed: Shares,
        used: Shares,
        guaranteed: Shares,
    },
    /// A workload that needs no GPU.
    NoGpuRequested,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PreemptReason {
    /// `claimant` is within its guarantee and takes back what `borrower` borrowed.
    /// `for_cohort`: in a tree of cohorts, the claimant's cohort (or one above it) whose own
    /// quota `borrower`, outside it, borrows; `None`: the claimant's own guarantee.
    QuotaReclaim {
        borrower: ProjectId,
        claimant: ProjectId,
        key: QuotaKey,
        borrowed: Shares,
        for_cohort: Option<String>,
    },
    /// `claimant`'s project may reclaim while it borrows itself (`borrow_within_cohort`):
    /// `borrower` borrows and this work's priority is below the claimant's (and the
    /// project's threshold).
    ReclaimWhileBorrowing {
        borrower: ProjectId,
        claimant: ProjectId,
        key: QuotaKey,
        borrowed: Shares,
        victim_priority: i32,
        preemptor_priority: i32,
    },
    /// Fair-sharing pre-emption: `borrower` and `claimant` both borrow; `claimant`'s share
    /// with the workload (`claimant_share`) is at most `borrower`'s without this victim
    /// (`LessThanOrEqualToFinalShare`), or below its share now (`LessThanInitialShare`).
    /// Shares in millionths of what the cohort could lend, over the project's weight.
    FairShare {
        borrower: ProjectId,
        claimant: ProjectId,
        key: QuotaKey,
        claimant_share: u64,
        borrower_share: u64,
        borrower_share_after: u64,
        strategy: crate::model::FairShareStrategy,
    },
    /// A higher-priority workload of the same project needs the devices.
    Priority { project: ProjectId, victim_priority: i32, preemptor_priority: i32 },
    /// Defragmentation: the pre-emptor fits the free capacity in total but not in one place;
    /// moving this work frees a block of `frees_block` whole devices on `node`. `gain_gpu_ms`
    /// (the pre-emptor's GPUs × time waited) and `cost_gpu_ms` (the whole plan's lost work
    /// plus restart) are the books behind it; `replaceable`: every victim of the plan can be
    /// placed elsewhere at once.
    Defragment {
        model: ModelId,
        node: NodeId,
        frees_block: u32,
        gain_gpu_ms: u64,
        cost_gpu_ms: u64,
        replaceable: bool,
    },
    /// The victim has been idle past its rule's timer (and was warned); reclaiming it lets
    /// the pre-emptor start. Under the `amd_rm` model the pre-emptor was only counted, not
    /// placed (`gpu_count_only`).
    Idle { idle: IdleFacts, gpu_count_only: bool },
}

/// The evidence behind an idle warning or reclaim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdleFacts {
    /// Index of the policy's idle rule that judged the workload, and the rule's model.
    pub rule: u32,
    pub model: IdleModel,
    /// Idle time by that rule's model, and its timer.
    pub idle_ms: u64,
    pub idle_timer_ms: u64,
    /// The rule's threshold, permille of the allocated share.
    pub threshold_permille: u16,
    /// The weakest signal the last sample needed; `None`: no sample yet.
    pub signal: Option<Signal>,
    pub when: IdleWhen,
    pub action: PreemptionMode,
    /// Telemetry has been missing since then.
    pub telemetry_gap_since: Option<Timestamp>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    Cancelled,
    MaxRuntimeExceeded { max_runtime_ms: u64, ran_ms: u64 },
}

/// What a request no node could ever hold asks beyond the nodes' host resources, when that
/// and not its GPUs is why (`DeferReason::NeverPlaceable`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum HostShortfall {
    /// CPU in millicores asked on one node, and the most any node of the model has.
    Cpu { asked: u64, largest: u64 },
    /// Memory in MiB asked on one node, and the most any node of the model has.
    Memory { asked: u64, largest: u64 },
    /// No node has its GPUs and its CPU and memory together (or, for a gang spread over
    /// nodes: even empty, the nodes' GPUs, CPU and memory together hold fewer of its members
    /// than it has).
    Spread,
}

/// Why a workload did not start this cycle. Every variant carries the numbers behind it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DeferReason {
    /// The project has no quota line that covers any GPU model the workload accepts.
    NoQuotaForModel { project: ProjectId },
    /// Larger than the project could ever hold: guarantee plus what it may borrow.
    ExceedsMaxQuota { project: ProjectId, key: QuotaKey, requested: Shares, max: Shares },
    /// Not enough quota now: used of guaranteed, plus what the cohort can lend now.
    QuotaExhausted {
        project: ProjectId,
        key: QuotaKey,
        requested: Shares,
        used: Shares,
        guaranteed: Shares,
        available: Shares,
        /// Whether the borrow limit, not the cohort's free capacity, is what binds.
        borrow_limited: bool,
        /// Quota reclaimed for the project's waiting pre-emptors that this workload does
        /// not outrank (its victims are still stopping): not in `available`.
        held_for_preemptors: Shares,
    },
    /// Quota allows it but no set of nodes has room now.
    NoPlacement(PlacementFacts),
    /// Quota allows it and it would fit now if these unavailable nodes (down or drained:
    /// `Event::NodeUnavailable`, with the reason the cluster gave) were usable; `facts` are
    /// the room without them. Only the nodes the placement found with them would use are named.
    NodesUnavailable { facts: PlacementFacts, nodes: Vec<(NodeId, String)> },
    /// A MIG instance asked on a model with no MIG-enabled device offering that profile.
    NoMigProfile { model: ModelId, profile: MigProfile },
    /// Bigger than any node of the accepted models could hold even when empty; `host`: when
    /// CPU or memory, not GPUs, is why.
    NeverPlaceable {
        model: Option<ModelId>,
        members: u32,
        per_member: Shares,
        same_node: bool,
        host: Option<HostShortfall>,
    },
    /// Victims were told to stop; the workload starts when they are gone.
    WaitingForPreemption { victims: Vec<WorkloadId> },
    /// Strict FIFO: the project's head is blocked, and this workload is behind it.
    BlockedByFifo { head: WorkloadId },
    /// Stopped for idleness; it may resume at `until` (backoff against reclaim thrash).
    IdleBackoff { until: Timestamp, reclaims: u32 },
    /// Stopped for idleness at `since`; its use is observable by a probe, so it resumes when
    /// a probe shows its user back, not into free room while nobody uses it.
    AwaitingUse { since: Timestamp },
    /// It would fit now on GPUs held for `reservation`, a request pending longer (policy
    /// `reservations`), on `nodes`; work may use them only if its max runtime ends by `start`
    /// (`None`: the start is unknown, so nothing may).
    HeldForReservation { reservation: WorkloadId, nodes: Vec<NodeId>, start: Option<Timestamp> },
    /// It would borrow on `key` while `claimant`, of another project of its cohort, waits for
    /// room there within its guarantee (policy `reservations`): admitted now, it would only be
    /// reclaimed.
    HeldForClaimant { claimant: WorkloadId, key: QuotaKey },
    /// It would take quota on `key` that `reservation`, a request pending longer (policy
    /// `reservations`), waits for: admitted now, it would leave that request short of its
    /// ask, or shorter still. Work may take it only if its max runtime ends by the
    /// reservation's expected start: on its held nodes, or, for a request its quota blocks,
    /// when running work ending at its max runtime would leave the line room for it.
    QuotaHeldForReservation { reservation: WorkloadId, key: QuotaKey },
}

impl DeferReason {
    /// Quota allows it, placement does not (`NoPlacement` or `NodesUnavailable`): moving
    /// work (pre-emption, defragmentation) may help.
    pub fn is_placement(&self) -> bool {
        matches!(self, DeferReason::NoPlacement(_) | DeferReason::NodesUnavailable { .. })
    }
}

impl PlacementFacts {
    /// Whole GPUs the request asks for, if it asks whole GPUs.
    pub fn whole_gpus_asked(&self) -> Option<u64> {
        (self.per_member.0.is_multiple_of(crate::ids::SHARES_PER_GPU) && self.per_member.0 > 0)
            .then(|| self.per_member.0 / crate::ids::SHARES_PER_GPU * u64::from(self.members))
    }

    /// Fragmentation, not capacity: at least as many whole GPUs are free as the request
    /// asks, but no node has a free block as large as one member (the whole gang when
    /// `same_node`) needs.
    pub fn fragmented(&self) -> bool {
        let Some(asked) = self.whole_gpus_asked() else { return false };
        let block = if self.same_node { asked } else { asked / u64::from(self.members.max(1)) };
        asked >= 2 && self.free_whole_gpus >= asked && u64::from(self.largest_free_block) < block
    }
}

/// The free capacity of one GPU model when a placement failed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PlacementFacts {
    pub model: Option<ModelId>,
    pub members: u32,
    pub per_member: Shares,
    pub same_node: bool,
    /// Most whole free devices of this model on one node, and that node.
    pub largest_free_block: u32,
    pub largest_free_block_node: Option<NodeId>,
    /// Whole free devices of this model in the cluster.
    pub free_whole_gpus: u64,
    /// Free shares of this model in the cluster, partial devices included.
    pub free_shares: Shares,
    /// Nodes with at least one whole free device of this model.
    pub nodes_with_free: u32,
    /// Most shares free on any single device of this model (for fractional requests).
    pub largest_device_free: Shares,
    /// The MIG profile asked, for a MIG request.
    pub mig: Option<MigProfile>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RejectReason {
    UnknownProject {
        name: String,
    },
    UnknownPriorityClass {
        name: String,
    },
    UnknownModel {
        name: String,
    },
    DuplicateId,
    /// The request is malformed (zero members, shares outside 1..=999, …).
    InvalidRequest {
        detail: String,
    },
    /// Work found running outside allot cannot be taken over as it is placed.
    CannotAdopt {
        detail: String,
    },
}

// Snapshot encoding (`codec.rs`).
crate::codec::codec_struct!(MigSlot { profile, start });
crate::codec::codec_struct!(DeviceShare { device, shares, mig });
crate::codec::codec_struct!(MemberPlacement { node, devices });
crate::codec::codec_struct!(Placement { model, members });

impl crate::codec::Codec for QuotaKey {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            QuotaKey::Any => out.push(0),
            QuotaKey::Model(m) => {
                out.push(1);
                m.encode(out);
            }
        }
    }
    fn decode(input: &mut &[u8]) -> Result<Self, crate::codec::CodecError> {
        match u8::decode(input)? {
            0 => Ok(QuotaKey::Any),
            1 => Ok(QuotaKey::Model(ModelId::decode(input)?)),
            _ => Err(crate::codec::bad("unknown quota key")),
        }
    }
}
