//! What readers see: the view the machine publishes after each turn (`machine::publish`),
//! read by the API and the dashboard without asking the loop. Data only: this module knows
//! nothing of the machine, the store or the backend.

mod track;

use std::collections::BTreeMap;

use allot_api::{ApiError, Node, Project, Workload};
use allot_core::Standing;

pub(crate) use track::{
    FleetSample, SAMPLE_MS, SAMPLES_MAX, Step, TIMELINE_MAX, Tracker, is_warned, push_step,
};

/// Derived figures (estimated starts, standings, the ledger per period) are made again at
/// most every this many ms (`machine/derived.rs`).
pub(crate) const DERIVE_MS: u64 = 5_000;
/// Ledger periods kept per scope (newest first): two weeks of the daemon's one-day periods.
pub(crate) const PERIODS_MAX: usize = 14;

/// An error answer: HTTP status and the JSON body.
#[derive(Debug)]
pub(crate) struct HttpError {
    pub status: u16,
    pub body: ApiError,
}

impl HttpError {
    pub(crate) fn new(status: u16, body: ApiError) -> HttpError {
        HttpError { status, body }
    }

    pub(crate) fn plain(status: u16, error: impl Into<String>, fix: Option<&str>) -> HttpError {
        HttpError {
            status,
            body: ApiError { error: error.into(), field: None, fix: fix.map(str::to_string) },
        }
    }
}

impl View {
    /// The number of the policy in effect (the history's last version).
    pub(crate) fn policy_version(&self) -> u32 {
        self.policy_versions.last().map_or(1, |v| v.version)
    }
}

/// What readers see without asking the loop.
#[derive(Debug, Default)]
pub(crate) struct View {
    pub workloads: BTreeMap<u64, Workload>,
    pub projects: Vec<Project>,
    pub nodes: Vec<Node>,
    /// The engine's nodes now (for checking a candidate policy against the inventory).
    pub node_specs: Vec<allot_core::NodeSpec>,
    pub inventory_source: String,
    pub policy_source: String,
    pub policy_text: String,
    /// Every policy the daemon ran under, oldest first; the last is in effect.
    pub policy_versions: Vec<allot_api::PolicyVersion>,
    /// The scoped rollout in effect (or the last), with its conditions' figures.
    pub rollout: Option<allot_api::RolloutView>,
    /// The dashboard's fleet samples and workload timelines.
    pub dashboard: Tracker,
    /// Some telemetry round had readings: the ledger's active and idle hours are measured.
    pub telemetry_seen: bool,
    /// Whether the backend answers.
    pub backend: allot_api::BackendStatus,
    /// What the last inventory change did.
    pub inventory_note: Option<String>,
}

/// An estimated start, ready to show: `at_ms` `None` is "unknown", and `note` says why (or
/// what the start waits for).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtaView {
    pub at_ms: Option<u64>,
    pub note: String,
}

/// One scope's books in one ledger period, in GPU-hours.
#[derive(Clone, Debug, PartialEq)]
pub struct PeriodRow {
    /// `cluster` or `project:NAME`.
    pub scope: String,
    pub start_ms: u64,
    pub end_ms: u64,
    pub allocated: f64,
    pub active: f64,
    pub idle: f64,
    pub useful: f64,
    pub lost: f64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Derived {
    /// When this was derived (`None`: not yet).
    pub at_ms: Option<u64>,
    pub etas: BTreeMap<u64, EtaView>,
    pub standings: Vec<Standing>,
    /// Cluster and project rows, per scope newest period first, `PERIODS_MAX` per scope.
    pub periods: Vec<PeriodRow>,
}
