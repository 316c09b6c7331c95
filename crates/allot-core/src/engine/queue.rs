//! The queues: one per project, ordered inside by priority, then submit time, then id
//! (`QueueKey`), and the order step 4 of the cycle visits projects in (`project_order_key`:
//! a head that fits in its guarantee before one that would borrow, then the lowest
//! fair-share standing), with the fair-share clock that decays past allocation (`advance`).

use std::cmp::Reverse;

use super::{Engine, WorkloadState};
use crate::decision::QuotaKey;
use crate::ids::{ProjectId, Shares, Timestamp, WorkloadId};

/// Order inside a project: higher priority, then earlier submit, then lower id.
pub(crate) type QueueKey = (Reverse<i32>, Timestamp, WorkloadId);

impl WorkloadState {
    pub(super) fn queue_key(&self) -> QueueKey {
        (Reverse(self.priority), self.queued_at, self.spec.id)
    }
}

impl Engine {
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

    /// Projects whose next workload fits in their guarantee go before those that would
    /// borrow (a guarantee is honoured before lending); then the lowest fair-share standing;
    /// then the project id.
    pub(super) fn project_order_key(
        &self,
        project: ProjectId,
        head: WorkloadId,
    ) -> (u8, u64, ProjectId) {
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
}
