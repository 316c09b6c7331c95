//! The queues: one per project, ordered inside by priority, then submit time, then id
//! (`QueueKey`), and the order step 4 of the cycle visits projects in (`project_order_key`:
//! a head that fits in its guarantee before one that would borrow, then the lowest
//! fair-share standing, then the head's priority and submit time), with the fair-share
//! clock that decays past allocation (`advance`).

use std::cmp::Reverse;

use super::{Engine, WorkloadState};
use crate::decision::QuotaKey;
use crate::ids::{ModelId, ProjectId, Shares, Timestamp, WorkloadId};
use crate::model::GpuRequest;

/// Order inside a project: higher priority, then earlier submit, then lower id.
pub(crate) type QueueKey = (Reverse<i32>, Timestamp, WorkloadId);

/// A project's place in step 4's order (`project_order_key`): (borrows, fair-share standing,
/// head's priority, head's submit time, project).
pub(crate) type OrderKey = (u8, u64, Reverse<i32>, Timestamp, ProjectId);

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
    /// then, as Kueue breaks such ties, the head's higher priority and earlier submission;
    /// then the project id.
    pub(super) fn project_order_key(&self, project: ProjectId, head: WorkloadId) -> OrderKey {
        let w = &self.workloads[&head];
        let within = self.head_within_guarantee(w);
        let p = &self.projects[project.0 as usize];
        let standing = if p.weight_milli == 0 {
            u64::MAX
        } else {
            let usage = p.allocated.0 as f64 + p.decayed_allocated;
            (usage / p.fair_share.max(1.0) * 1e6) as u64
        };
        (u8::from(!within), standing, Reverse(w.priority), w.queued_at, project)
    }

    /// Whether the head would be admitted within its guarantee, judged on the model it would
    /// go to: of the models with room for one member now, the first in the workload's order
    /// (any of them, for work that accepts any model, as admission weighs them); with room
    /// on none, its first model with a quota line. Not its first model alone: work whose first
    /// model is full but fits its guarantee on its second is no borrower.
    fn head_within_guarantee(&self, w: &WorkloadState) -> bool {
        let total = w.spec.total_shares();
        if total == Shares::ZERO {
            return true;
        }
        let within_on = |m: ModelId| {
            self.quota.resolve(w.project, QuotaKey::Model(m)).and_then(|key| {
                let l = self.quota.line(w.project, key)?;
                Some(l.used.saturating_add(total) <= l.guaranteed)
            })
        };
        let models = self.candidate_models(w);
        let mut roomy = models.iter().copied().filter(|&m| self.has_room(m, w.shape().gpus));
        let judged = if w.models.is_empty() {
            roomy.filter_map(within_on).reduce(|a, b| a || b)
        } else {
            roomy.find_map(within_on)
        };
        judged.or_else(|| models.iter().find_map(|&m| within_on(m))).unwrap_or(true)
    }

    /// Whether one member asking `gpus` would find a free block of model `m` now (devices
    /// only: a cheap look at the free indexes, for ordering, not for placing).
    fn has_room(&self, m: ModelId, gpus: GpuRequest) -> bool {
        match gpus {
            GpuRequest::Whole(k) => self.capacity.largest_block(m).is_some_and(|(b, _)| b >= k),
            GpuRequest::Shares(s) => self.capacity.largest_share_gap(m) >= s,
            GpuRequest::Mig(_) => true,
        }
    }
}
