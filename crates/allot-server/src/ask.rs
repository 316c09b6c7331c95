//! What users ask the daemon (through the API or the dashboard) and what it answers: the
//! requests the machine takes (`Input::Ask`) and the answers it gives, in the words of the
//! API's types. A leaf beside the view: readers build these and nothing else.

use allot_api::{
    HistoryExport, PolicyView, Report, ShadowReport, SubmitRequest, SubmitResponse, Why, Workload,
};

use crate::auth::Principal;
use crate::view::HttpError;

/// What a user asks through the API or the dashboard.
#[derive(Clone, Debug)]
pub(crate) enum Ask {
    Submit {
        principal: Principal,
        request: Box<SubmitRequest>,
        /// When the API received it (ms since the Unix epoch; for the submit-to-admit figure).
        received_ms: u64,
    },
    Act {
        principal: Principal,
        id: u64,
        action: Action,
    },
    Why {
        principal: Principal,
        id: u64,
    },
    Report {
        principal: Principal,
    },
    /// `allot policy apply` or `rollback` (admins only; the API checks the role).
    ApplyPolicy {
        source: String,
        text: String,
        /// The admin applying it.
        by: String,
        /// The version it brings back (`allot policy rollback`).
        rollback_of: Option<u32>,
        /// `--scope …`: a scoped rollout of `text` (the candidate) with its conditions.
        rollout: Option<RolloutAsk>,
        /// The what-if the dashboard showed for `text`, kept with the version.
        whatif: Option<allot_api::WhatIfShown>,
    },
    /// The workloads as a job trace (`GET /api/v1/history`, the dashboard's what-if).
    History {
        limit: usize,
    },
    /// `allot policy apply FILE --shadow` (admins only; the API checks the role).
    StartShadow {
        source: String,
        text: String,
        by: String,
    },
    /// `allot policy shadow --stop` (admins only): the last report.
    StopShadow,
    /// `allot policy shadow`: what the candidate would have done differently so far.
    ShadowReport,
}

/// A scoped rollout as asked (`allot policy apply FILE --scope … --rollback-if …`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RolloutAsk {
    /// `project=NAME`, `pool=MODEL` or `kind=KIND`.
    pub scope: String,
    /// `METRIC>LIMIT` or `METRIC>FACTORx`, each.
    pub conditions: Vec<String>,
    pub baseline_ms: u64,
    pub false_reclaim_within_ms: u64,
    pub min_sample: u64,
}

/// A user's action on one workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    Cancel,
    Suspend,
    Resume,
    /// The workload reports a checkpoint made at `at_ms`.
    Checkpoint {
        at_ms: u64,
    },
}

/// The answer to an `Ask`, of the kind asked.
#[derive(Debug)]
pub(crate) enum Answer {
    Submitted(Result<SubmitResponse, HttpError>),
    Workload(Result<Workload, HttpError>),
    Why(Result<Why, HttpError>),
    Report(Result<Report, HttpError>),
    Policy(Result<PolicyView, HttpError>),
    History(Result<HistoryExport, HttpError>),
    Shadow(Result<ShadowReport, HttpError>),
}
