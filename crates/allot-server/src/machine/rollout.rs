//! Scoped rollout with rollback conditions (`allot policy apply FILE --scope … --rollback-if …`).
//!
//! A rollout is a policy version like any other — the active policy with the candidate's
//! rules for one scope (`allot_config::scoped_policy`), written out whole — plus a plan: the
//! scope, the conditions, and the baseline window. Outcomes of work in the scope are kept as
//! they happen (`Outcomes`, derived from the log, so a restart rebuilds them); the machine
//! evaluates the conditions after each cycle on the live path only, and when one trips it logs
//! the version before the rollout again, with the reason. A replay applies that entry; it never
//! re-evaluates.

use allot_config::rollout::{Condition, Judged, Outcomes, RollbackRules};
use serde::{Deserialize, Serialize};

/// What the rollout was asked to do, as logged with its policy version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RolloutPlan {
    /// `project=NAME`, `pool=MODEL` or `kind=KIND` (`allot_config::Scope`).
    pub scope: String,
    /// The candidate's file (or form).
    pub candidate: String,
    pub conditions: Vec<Condition>,
    /// The window before the rollout its figures are compared with.
    pub baseline_ms: u64,
    /// A reclaim undone within this long was a false one.
    pub false_reclaim_within_ms: u64,
    /// Observations a window needs before an average or percentile is judged.
    pub min_sample: u64,
    /// What of the candidate the scoped version carries, and what it leaves out.
    pub carried: Vec<String>,
    pub left_out: Vec<String>,
}

impl RolloutPlan {
    pub(crate) fn scope(&self) -> Option<allot_config::Scope> {
        allot_config::Scope::parse(&self.scope).ok()
    }

    pub(crate) fn rules(&self) -> RollbackRules {
        RollbackRules {
            conditions: self.conditions.clone(),
            baseline_ms: self.baseline_ms,
            false_reclaim_within_ms: self.false_reclaim_within_ms,
            min_sample: self.min_sample,
        }
    }
}

/// A rollout in effect: its version, the one before it, and when it started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Rollout {
    pub version: u32,
    pub base_version: u32,
    pub by: Option<String>,
    pub started_ms: u64,
    pub plan: RolloutPlan,
    /// How it ended, once it has: `promoted …`, `rolled back: …`, `replaced …`.
    #[serde(default)]
    pub ended: Option<(u64, String)>,
}

impl Rollout {
    /// Every condition judged on `outcomes` at `now`; `waiting_since_ms`: the submission times
    /// of the scope's work not admitted yet (`Daemon::waiting_in`).
    pub(crate) fn judge(
        &self,
        outcomes: &Outcomes,
        waiting_since_ms: &[u64],
        now: u64,
    ) -> Vec<Judged> {
        let Some(scope) = self.plan.scope() else { return Vec::new() };
        self.plan.rules().judge(&scope, outcomes, waiting_since_ms, self.started_ms, now)
    }
}
