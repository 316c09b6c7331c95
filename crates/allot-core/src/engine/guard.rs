//! Protection from pre-emption: whether a running workload may be stopped for other work now,
//! and if not, why and until when (`Engine::protection`). The arbiter (`preempt.rs`) and
//! defragmentation (`defrag.rs`) ask it for every candidate victim; `explain` shows it.
//!
//! Four protections, the first that holds is reported:
//! - the workload is not preemptible (its priority class or its own flag);
//! - it is younger than its own `min_runtime`;
//! - it was restarted (it had been pre-empted or reclaimed for idleness before) less than the
//!   policy's `exempt_after_restart` ago — without this, the cheapest victim by lost work is
//!   always the one that just restarted, and one job is stopped over and over;
//! - it was pre-empted `limit.count` times within `limit.window` already.
//!
//! Idle reclaim is not guarded here: the idle rules judge a workload's own idleness, with
//! their own start-up grace.

use super::{Engine, Stage, WorkloadState};
use crate::ids::{Timestamp, WorkloadId};
use crate::model::PreemptionGuard;

/// Why a running workload may not be pre-empted now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Protection {
    /// Its priority class (or its own flag) says it is never pre-empted.
    NotPreemptible,
    /// Started less than its own `min_runtime` ago.
    MinRuntime { until: Timestamp },
    /// Restarted after a stop less than the policy's `exempt_after_restart` ago.
    Restarted { until: Timestamp },
    /// Pre-empted `count` times within the last `window_ms` (the policy's cap).
    Capped { count: u32, window_ms: u64, until: Timestamp },
}

impl Protection {
    /// When it ends by itself; `None`: never (not preemptible).
    pub fn until(self) -> Option<Timestamp> {
        match self {
            Protection::NotPreemptible => None,
            Protection::MinRuntime { until }
            | Protection::Restarted { until }
            | Protection::Capped { until, .. } => Some(until),
        }
    }
}

impl Engine {
    /// Why running `w` may not be pre-empted for other work at `now`, if it may not. A
    /// workload not running (or not started yet) is not protected: it is not a victim either.
    pub(crate) fn protection(&self, now: Timestamp, w: &WorkloadState) -> Option<Protection> {
        if !w.preemptible {
            return Some(Protection::NotPreemptible);
        }
        let started = w.allocation.as_ref().and_then(|a| a.started_at)?;
        let past = |ms: u64| Timestamp(started.0.saturating_add(ms));
        if now.since(started) < w.spec.min_runtime_ms {
            return Some(Protection::MinRuntime { until: past(w.spec.min_runtime_ms) });
        }
        let guard = self.guard;
        if w.preemptions > 0 && now.since(started) < guard.exempt_after_restart_ms {
            return Some(Protection::Restarted { until: past(guard.exempt_after_restart_ms) });
        }
        let limit = guard.limit?;
        let times = self.preempted_at.get(&w.spec.id)?;
        let in_window: Vec<Timestamp> =
            times.iter().copied().filter(|t| now.since(*t) < limit.window_ms).collect();
        let count = limit.count as usize;
        (count > 0 && in_window.len() >= count).then(|| {
            // The oldest of the last `count` leaves the window first.
            let oldest = in_window[in_window.len() - count];
            Protection::Capped {
                count: limit.count,
                window_ms: limit.window_ms,
                until: Timestamp(oldest.0.saturating_add(limit.window_ms)),
            }
        })
    }

    /// Remembers that `id` was just stopped for other work (the cap counts these).
    pub(super) fn record_preemption(&mut self, id: WorkloadId, now: Timestamp) {
        let times = self.preempted_at.entry(id).or_default();
        times.push(now);
        let kept = PreemptionGuard::COUNT_MAX as usize;
        if times.len() > kept {
            times.drain(..times.len() - kept);
        }
    }

    /// How long a claimant waits in the queue before it reclaims quota from borrowers
    /// (`PreemptionGuard::reclaim_after_ms`): a replay that decides only at events wakes the
    /// cycle when such a wait ends.
    pub fn reclaim_after_ms(&self) -> u64 {
        self.guard.reclaim_after_ms
    }

    /// Why running workload `id` may not be pre-empted now (`explain`).
    pub fn protection_of(&self, now: Timestamp, id: WorkloadId) -> Option<Protection> {
        self.workloads
            .get(&id)
            .filter(|w| w.stage == Stage::Running)
            .and_then(|w| self.protection(now, w))
    }
}
