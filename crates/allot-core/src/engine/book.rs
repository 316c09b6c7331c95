//! Booking allocations: `commit` admits a workload (out of its queue, devices and quota
//! taken), `release` frees what it holds, and `book_resources` is the only code that moves
//! devices, CPU, memory and quota, so that admission, release, a rebuilt state and the
//! arbiter's what-if never disagree. `adjust_line_total` keeps the per-line running totals
//! (shares of stopping work, pre-emptors' reservations).

use std::collections::BTreeMap;

use super::{Allocation, Engine, Stage};
use crate::decision::{Placement, QuotaKey};
use crate::ids::{ProjectId, Shares, Timestamp, WorkloadId};

impl Engine {
    pub(super) fn commit(&mut self, id: WorkloadId, key: Option<QuotaKey>, placement: Placement) {
        let Some(w) = self.workloads.get_mut(&id) else { return };
        let shares = w.spec.total_shares();
        let p = &mut self.projects[w.project.0 as usize];
        p.allocated = p.allocated.saturating_add(shares);
        self.queues[w.project.0 as usize].remove(&w.queue_key());
        w.stage = Stage::Assumed;
        w.allocation = Some(Allocation { key, placement, shares, started_at: None });
        w.idle_suspended_at = None;
        self.book_resources(id, true);
        // Quota held for it is its own now (engine/reserve.rs: a hold lasts while its owner waits).
        if !self.quota_holds.is_empty() {
            self.quota_holds.retain(|h| h.owner != id);
        }
    }

    /// Frees what the workload holds; it stays in the map (the caller decides its fate).
    pub(super) fn release(&mut self, id: WorkloadId) {
        self.book_resources(id, false);
        let Some(w) = self.workloads.get_mut(&id) else { return };
        let stopping = w.stage == Stage::Stopping;
        let Some(alloc) = w.allocation.take() else { return };
        let (project, priority) = (w.project, w.priority);
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
        self.running[project.0 as usize].remove(id, priority);
        self.idle.remove(&id);
    }

    /// Takes (`hold`) or gives back the devices, CPU, memory and quota of `v`'s allocation.
    /// The only place that moves them, so admission, release and the arbiter's what-if can
    /// never disagree.
    pub(super) fn book_resources(&mut self, v: WorkloadId, hold: bool) {
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
}

/// Updates a per-line running total, dropping the entry at zero so that totals compare equal
/// to a recomputation in `audit`.
pub(super) fn adjust_line_total(
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

/// One project's started workloads (the only pre-emption candidates), with how many run at
/// each priority: the arbiter skips the project's own work at once when none of it runs
/// below the claimant, instead of reading every running workload.
#[derive(Clone, Debug, Default)]
pub(super) struct RunningSet {
    ids: std::collections::BTreeSet<WorkloadId>,
    priorities: std::collections::BTreeMap<i32, u32>,
}

impl RunningSet {
    pub fn insert(&mut self, id: WorkloadId, priority: i32) {
        if self.ids.insert(id) {
            *self.priorities.entry(priority).or_default() += 1;
        }
    }

    pub fn remove(&mut self, id: WorkloadId, priority: i32) {
        if self.ids.remove(&id)
            && let Some(count) = self.priorities.get_mut(&priority)
        {
            *count -= 1;
            if *count == 0 {
                self.priorities.remove(&priority);
            }
        }
    }

    /// Whether some workload here runs at a priority below `priority`.
    pub fn any_below(&self, priority: i32) -> bool {
        self.priorities.first_key_value().is_some_and(|(&p, _)| p < priority)
    }

    pub fn iter(&self) -> impl Iterator<Item = &WorkloadId> {
        self.ids.iter()
    }
}

impl<'a> IntoIterator for &'a RunningSet {
    type Item = &'a WorkloadId;
    type IntoIter = std::collections::btree_set::Iter<'a, WorkloadId>;
    fn into_iter(self) -> Self::IntoIter {
        self.ids.iter()
    }
}
