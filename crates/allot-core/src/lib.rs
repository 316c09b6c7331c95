//! allot's deterministic core: the model, quotas, placement, the pre-emption arbiter and
//! explanations. Facts come in through [`Engine::apply`], decisions go out of
//! [`Engine::decide`]; the caller owns time and all I/O.
//!
//! This crate knows nothing about Slurm, HTTP, SQLite, serde or the wall clock (see the tidy
//! test in `tests/tidy.rs`).

mod capacity;
mod codec;
mod decision;
mod engine;
mod event;
mod explain;
pub mod idle;
mod ids;
pub mod ledger;
pub mod mig;
mod mig_audit;
mod model;
pub mod packing;
mod quota;
mod render;
mod topology;

pub use codec::CodecError;
pub use decision::{
    AdmitReason, Decision, DeferReason, DeviceShare, HostShortfall, IdleFacts, MemberPlacement,
    MigSlot, Placement, PlacementFacts, PreemptReason, QuotaKey, RejectReason, StopReason,
};
pub use engine::{
    ConfigError, DefragPlan, DefragVictim, ETA_ENDS_MAX, ETA_WORKLOADS_MAX, Engine, Eta, EtaCause,
    EtaUnknown, InventoryChange, MEMBERS_MAX, Occupancy, Protection, RESERVE_SCAN_MAX,
    RESERVE_SCAN_PER_RESERVATION, ROUNDS_PER_INSTANT, Refresh, Reservation, Stage, Standing,
    StateError, WHOLE_GPUS_PER_MEMBER_MAX,
};
pub use event::Event;
pub use explain::{Counterfactual, Explanation, QueuePosition};
pub use ids::{
    ModelId, NodeId, ProjectId, SHARES_PER_GPU, Shares, Timestamp, WorkloadId, civil_from_days,
    days_from_civil,
};
pub use mig::{MigGpu, MigProfile, MigState};
pub use model::{
    BorrowWithinCohort, Checkpointing, CohortSpec, Defragmentation, DeviceSpec, FairShareStrategy,
    FairSharing, GpuRequest, IDLE_BACKOFF_MAX_MS, IdlePolicySpec, IdleWhen, NodeSpec, PolicySpec,
    PreemptionGuard, PreemptionLimit, PreemptionMode, PriorityClassSpec, ProjectSpec, Queueing,
    QuotaModel, QuotaSpec, Reservations, WithinProject, WorkloadKind, WorkloadSpec,
};
