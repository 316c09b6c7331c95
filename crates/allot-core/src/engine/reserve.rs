//! Reservations, as Slurm's backfill reserves for its top jobs (policy `reservations`):
//! a whole-GPU request that quota allows and that has been pending longer than `after` gets
//! GPUs held for it on the nodes where it would start earliest, and other work goes there only
//! if its max runtime ends before the reservation's expected start (backfill).
//!
//! A reservation is derived, not remembered: every cycle (`plan_reservations`, called by
//! `Engine::admission_cycle` before steps 3 and 4) recomputes them from the queue and the
//! running work, so that nothing needs saving and a rebuilt engine (`state.rs`) holds the same
//! reservations as the one it was saved from: same events, same decisions.
//!
//! - **Who** (`candidates`): in each project's queue order (priority, then submission), the
//!   first pending workloads that ask two or more whole GPUs in all, are not waiting for
//!   victims or idle-suspended, have been pending `after` or longer and whose quota line has
//!   room for them now (a request blocked by quota gains nothing from nodes). Under strict
//!   FIFO only the project's head may be one (nothing behind it can start first; GPUs held
//!   for such work would keep the head off them while the work waited for the head, for
//!   ever). At most [`RESERVE_SCAN_MAX`] queue entries are read per project per cycle (or
//!   [`RESERVE_SCAN_PER_RESERVATION`] for each of `per_model_max`, if more); all
//!   projects' candidates are then taken in that order, at most `per_model_max` per GPU model.
//! - **Where** (`earliest`): per device of the model, when it will be free: now if free, the
//!   latest known end of what holds it (running work's max runtime; work told to stop: now)
//!   when every holder's end is known, else unknown. The reservation starts at the first
//!   instant at which enough nodes have enough such devices (one node for `same_node`), on the
//!   nodes ready soonest (then with the most room, then lowest id), taking on each as many
//!   devices as its members there need. If no known instant suffices the start is unknown and
//!   the nodes are those with the most devices whose end is known. Devices an earlier
//!   reservation of the cycle took are not offered again. CPU and memory are not reserved.
//! - **Holding** (`hold_reservations`): during the cycle, the free whole devices of each
//!   reservation (up to what it needs per node) are taken from capacity, as the room of a
//!   waiting pre-emptor is (`preempt.rs`). They are given back for the reserved workload
//!   itself, and for work whose max runtime ends by the expected start (`opens`), while it
//!   is scheduled, then taken again if still free (`close`), through `Capacity::hold`, which
//!   gives a node whose devices are taken and given back unchanged its old version, so that
//!   its cached placement scores survive the toggling. Work without a max runtime, and
//!   any work while the start is unknown, never backfills.
//! - **Why**: a workload that would fit were the held devices free is deferred with
//!   `DeferReason::HeldForReservation` and pre-empts nobody for room it only lacks because of
//!   the reservation; `explain` of the reserved workload shows its reservation.
//!
//! The second rule of the same policy (`claim_of`, `borrow_held_for`): while a request of a
//! project that would stay within its guarantee waits for room (no placement, no victims now,
//! e.g. because they are protected), another project of its cohort is not admitted as a
//! borrower on that quota line in the same cycle (`DeferReason::HeldForClaimant`): admitted,
//! it would be reclaimed as soon as the claimant could act. A reservation whose owner would
//! so wait for a claimant gives way to it: its held devices are open to the claimant (`opens`,
//! `waits_for_claim`). Held from it, the claimant would wait for the owner's GPUs while the
//! owner waited for the claimant: on an idle cluster, for ever.
//!
//! The third rule, only with `hold_quota` (`QuotaHold`, `quota_held_for`): a reservation
//! holds quota as well as nodes. For each reserved request, and for the first candidate per
//! quota line and root cohort that quota cannot hold yet (so it gets no nodes), work that does
//! not go before it — later work of its project, and borrowers of other projects of no higher
//! priority — is deferred `QuotaHeldForReservation` rather than admitted on that line when
//! that would leave it short of its ask (or shorter still), and pre-empts nobody to take it
//! either. Work within its own guarantee in
//! another project is never held: a guarantee is not lent against its owner. Work may take
//! held quota if its max runtime ends by the request's expected start (its nodes' start; for
//! a request short of quota, when quota would free if running work ended at its max runtime,
//! `quota_start`). A candidate that an earlier hold keeps from its quota gets no nodes held
//! (it would only keep that request from starting). Without the rule a large borrower waits
//! while every GPU of quota that frees goes to smaller work first.

use std::collections::{BTreeMap, BTreeSet};

use super::{Engine, QueueKey, Stage, WorkloadState};
use crate::capacity::{Layout, Refine};
use crate::decision::{DeferReason, DeviceShare, MemberPlacement, Placement, QuotaKey};
use crate::ids::{ModelId, NodeId, ProjectId, SHARES_PER_GPU, Shares, Timestamp, WorkloadId};
use crate::model::{GpuRequest, Queueing};

/// Queue entries read per project per cycle when looking for requests to reserve for, at
/// least; a policy asking more reservations reads [`RESERVE_SCAN_PER_RESERVATION`] entries
/// for each (1-GPU and young requests are read and passed over).
pub const RESERVE_SCAN_MAX: usize = 64;
/// Queue entries read per project per cycle for each reservation the policy allows a model.
pub const RESERVE_SCAN_PER_RESERVATION: usize = 16;

const FULL: u32 = SHARES_PER_GPU as u32;

/// GPUs held for a long-waiting request (`Engine::reservation`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub model: ModelId,
    /// Nodes and how many whole GPUs of each are held for it.
    pub nodes: Vec<(NodeId, u32)>,
    /// When it is expected to start: every device it needs is free by then if running work
    /// ends at its max runtime. `None`: some of it is held by work with no known end.
    pub start: Option<Timestamp>,
    /// Since when nodes are held for it: its wait passed the policy's `after`.
    pub since: Timestamp,
}

/// Quota held for a long-waiting request (`Engine::quota_holds`, the third rule): work that
/// does not go before it is not admitted on its line if that would leave it less quota than
/// it asks, or less than it has while short.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QuotaHold {
    pub owner: WorkloadId,
    pub project: ProjectId,
    pub priority: i32,
    pub queue_key: QueueKey,
    pub key: QuotaKey,
    pub total: Shares,
    /// Work whose max runtime is at most this long may take the quota anyway: it gives it back
    /// by the owner's expected start (on its held nodes, or `quota_start` for an owner its
    /// quota blocks). `None` (that start is unknown): no work may.
    pub backfill_ms: Option<u64>,
}

/// The quota holds that tell a shape's workloads apart (`Engine::holds_apart`), sorted so
/// that where a workload stands among them is two searches.
#[derive(Clone, Debug, Default)]
pub(crate) struct HoldsApart {
    /// The queue places of the owners of holds of the shape's own project.
    owners: Vec<QueueKey>,
    /// The holds' backfill windows (work whose max runtime is at most one passes that hold).
    windows: Vec<u64>,
}

/// Where a workload stands among its shape's `HoldsApart`: how many owners it is queued
/// ahead of, and how many windows its max runtime fits in. Each set is nested in the next as
/// the queue place (or max runtime) grows, so the counts name the sets: two workloads of a
/// shape at one place pass the same holds, and `quota_held_for` answers them alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HoldPlace {
    ahead_of: usize,
    fits: usize,
}

/// How held quota treats a workload among the others of its shape.
pub(crate) enum AmongHolds {
    /// As every other: no hold tells them apart.
    Alike,
    At(HoldPlace),
    /// It owns a hold, which every other workload meets and it does not.
    Owner,
}

impl HoldsApart {
    pub(crate) fn place(&self, key: QueueKey, max_runtime_ms: Option<u64>) -> AmongHolds {
        if self.owners.is_empty() && self.windows.is_empty() {
            return AmongHolds::Alike;
        }
        let behind = self.owners.partition_point(|o| *o < key);
        if self.owners.get(behind) == Some(&key) {
            return AmongHolds::Owner;
        }
        let fits = max_runtime_ms
            .map_or(0, |m| self.windows.len() - self.windows.partition_point(|window| *window < m));
        AmongHolds::At(HoldPlace { ahead_of: self.owners.len() - behind, fits })
    }
}

/// When each device becomes free, `Some(t)` where known: indexed by `offset[node] + device`.
struct DeviceEndsAll {
    offset: Vec<usize>,
    at: Vec<Option<Timestamp>>,
}
/// Where a request would start earliest: (start, nodes with the GPUs needed on each, the
/// devices counted).
type Earliest = (Option<Timestamp>, Vec<(NodeId, u32)>, Vec<(NodeId, u16)>);

impl Engine {
    /// Recomputes this cycle's reservations and holds their free devices (see the module
    /// docs). Nothing without the policy.
    pub(super) fn plan_reservations(&mut self, now: Timestamp) {
        self.reserved.clear();
        self.quota_holds.clear();
        let Some(policy) = self.reservation_policy else { return };
        let candidates = self.candidates(now, policy.after_ms, policy.per_model_max);
        if candidates.is_empty() {
            return;
        }
        let ends = self.device_ends(now);
        // Devices an earlier reservation of the cycle counted, as `ends` indexes them.
        let mut taken = vec![false; ends.at.len()];
        let mut per_model: BTreeMap<ModelId, u32> = BTreeMap::new();
        // (root cohort, line) already held for a request blocked by quota.
        let mut quota_blocked: BTreeSet<(usize, QuotaKey)> = BTreeSet::new();
        for (id, since) in candidates {
            // Every model has its reservations: the rest of the candidates get none.
            if self
                .all_models
                .iter()
                .all(|m| per_model.get(m).is_some_and(|n| *n >= policy.per_model_max))
            {
                break;
            }
            let Some(w) = self.workloads.get(&id) else { continue };
            let GpuRequest::Whole(k) = w.spec.gpus_per_member else { continue };
            let (members, same_node, shape) = (w.spec.members, w.spec.same_node, w.shape());
            let request = super::Request::of(w);
            let (project, total, queue_key) = (request.project, request.total, w.queue_key());
            let hold = |key, backfill_ms| QuotaHold {
                owner: id,
                project,
                priority: request.priority,
                queue_key,
                key,
                total,
                backfill_ms,
            };
            let models = self.candidate_models(w).to_vec();
            let allowed: Vec<bool> =
                models.iter().map(|&m| self.quota_allows(project, m, total)).collect();
            // Blocked by quota on every model it may use: the quota of its first model that
            // could ever hold it is held for it, one request per line and root cohort.
            if !allowed.contains(&true) {
                let line = models.iter().find_map(|&m| {
                    let key = self.quota.resolve(project, QuotaKey::Model(m))?;
                    (self.quota.view(project, key)?.max >= total).then_some(key)
                });
                let cohort = self.quota.cohort_of[project.0 as usize];
                let root = self.quota.ancestors(cohort).last().unwrap_or(cohort);
                if let Some(key) = line
                    && policy.hold_quota
                    && !quota_blocked.contains(&(root, key))
                {
                    quota_blocked.insert((root, key));
                    let start = self.quota_start(now, project, key, total);
                    let hold = hold(key, start.map(|start| start.0.saturating_sub(now.0)));
                    self.quota_holds.push(hold);
                }
                continue;
            }
            let mut best: Option<(Reservation, Vec<(NodeId, u16)>)> = None;
            for (&m, &allows) in models.iter().zip(&allowed) {
                if per_model.get(&m).is_some_and(|n| *n >= policy.per_model_max) {
                    continue;
                }
                let Some(key) = self.quota.resolve(project, QuotaKey::Model(m)) else { continue };
                // No quota, or quota held for an earlier request: nodes held for it would
                // only keep that request from starting. Nor for a request no node could ever
                // hold (its host asks too): held GPUs would wait for it for ever.
                if !allows
                    || self.quota_held_for(&request, key).is_some()
                    || !self.ever_placeable(m, shape, members, same_node)
                {
                    continue;
                }
                let Some((start, nodes, devices)) =
                    self.earliest(now, m, k, members, same_node, &ends, &taken)
                else {
                    continue;
                };
                // Earliest known start wins; unknown starts last; ties to the first model.
                let better = best.as_ref().is_none_or(|(r, _)| match (start, r.start) {
                    (Some(a), Some(b)) => a < b,
                    (Some(_), None) => true,
                    _ => false,
                });
                if better {
                    best = Some((Reservation { model: m, nodes, start, since }, devices));
                }
            }
            if let Some((r, devices)) = best {
                *per_model.entry(r.model).or_default() += 1;
                if policy.hold_quota
                    && let Some(key) = self.quota.resolve(project, QuotaKey::Model(r.model))
                {
                    let backfill_ms = r.start.map(|start| start.0.saturating_sub(now.0));
                    self.quota_holds.push(hold(key, backfill_ms));
                }
                for (node, d) in devices {
                    if let Some(t) = ends
                        .offset
                        .get(node.0 as usize)
                        .and_then(|&o| taken.get_mut(o + d as usize))
                    {
                        *t = true;
                    }
                }
                self.reserved.insert(id, r);
            }
        }
        for id in self.reserved.keys().copied().collect::<Vec<_>>() {
            self.close(id);
        }
    }

    /// Gives back every reservation's held devices (end of the cycle); the reservations stay
    /// readable until the next cycle.
    pub(super) fn release_reservations(&mut self) {
        for (_, parts) in std::mem::take(&mut self.reserve_held) {
            for part in parts {
                self.capacity.hold(&part, false);
            }
        }
    }

    /// The reservations whose held devices workload `id` may use now: its own, those it
    /// backfills (its max runtime ends by their known start), and those that give way to it:
    /// `id` is within its guarantee on a line whose claim the reservation's owner, a
    /// borrower of another project of the cohort, would wait for (`borrow_held_for`). Held
    /// from `id`, the two would wait for each other (the owner for the claimant, the
    /// claimant for the held GPUs) for as long as nothing else changed, on an idle cluster
    /// for ever; and the owner, let in first, would be the claimant's to reclaim.
    pub(super) fn opens(&self, now: Timestamp, id: WorkloadId) -> Vec<WorkloadId> {
        if self.reserve_held.is_empty() {
            return Vec::new();
        }
        let claim = self.claim_of(id);
        // Read the workload only if it could backfill (the cycle visits every pending one).
        if claim.is_none()
            && !self.reserve_held.contains_key(&id)
            && self.reserved.values().all(|r| r.start.is_none())
        {
            return Vec::new();
        }
        let max_runtime = self.workloads.get(&id).and_then(|w| w.spec.max_runtime_ms);
        self.reserve_held
            .keys()
            .copied()
            .filter(|r| {
                *r == id
                    || max_runtime.is_some_and(|max| {
                        self.reserved
                            .get(r)
                            .and_then(|res| res.start)
                            .is_some_and(|start| Timestamp(now.0.saturating_add(max)) <= start)
                    })
                    || claim.is_some_and(|claim| self.waits_for_claim(*r, id, claim))
            })
            .collect()
    }

    /// Whether reservation owner `owner` would be held for `claimant`'s claim `(cohort, key)`
    /// were it scheduled now (`borrow_held_for`): of another project of that cohort, on that
    /// line, borrowing.
    fn waits_for_claim(
        &self,
        owner: WorkloadId,
        claimant: WorkloadId,
        (cohort, key): (usize, QuotaKey),
    ) -> bool {
        let (Some(o), Some(c)) = (self.workloads.get(&owner), self.workloads.get(&claimant)) else {
            return false;
        };
        let Some(res) = self.reserved.get(&owner) else { return false };
        o.project != c.project
            && self.projects[o.project.0 as usize].cohort == cohort
            && self.quota.resolve(o.project, QuotaKey::Model(res.model)) == Some(key)
            && self
                .quota
                .line(o.project, key)
                .is_some_and(|l| l.used.saturating_add(o.spec.total_shares()) > l.guaranteed)
    }

    /// Gives back the held devices of these reservations, for the workload being scheduled.
    pub(super) fn open(&mut self, reservations: &[WorkloadId]) {
        for r in reservations {
            for part in self.reserve_held.remove(r).unwrap_or_default() {
                self.capacity.hold(&part, false);
            }
        }
    }

    /// Takes again what is free of a reservation's devices, up to what it needs per node,
    /// unless its workload no longer waits (admitted, or gone). The inverse of `open` when
    /// nothing was admitted in between.
    pub(super) fn close(&mut self, id: WorkloadId) {
        if self.workloads.get(&id).is_none_or(|w| w.stage != Stage::Pending) {
            self.reserved.remove(&id);
            return;
        }
        let Some(r) = self.reserved.get(&id) else { return };
        let model = r.model;
        let mut parts = Vec::new();
        for &(node, need) in &r.nodes {
            let Some(n) = self.capacity.nodes.get(node.0 as usize) else { continue };
            if n.unavailable {
                continue;
            }
            let devices: Vec<DeviceShare> = n
                .devices
                .iter()
                .enumerate()
                .filter(|(_, d)| {
                    d.model == model && d.free == FULL && !d.occupied && !d.mig_in_use()
                })
                .take(need as usize)
                .map(|(i, _)| DeviceShare { device: i as u16, shares: FULL, mig: None })
                .collect();
            if !devices.is_empty() {
                parts.push(Placement {
                    model: Some(model),
                    members: vec![MemberPlacement { node, devices }],
                });
            }
        }
        for part in &parts {
            self.capacity.hold(part, true);
        }
        if !parts.is_empty() {
            self.reserve_held.insert(id, parts);
        }
    }

    /// Workloads to reserve for, in the order they are served: (workload, since when).
    fn candidates(
        &self,
        now: Timestamp,
        after_ms: u64,
        per_model_max: u32,
    ) -> Vec<(WorkloadId, Timestamp)> {
        let scan = RESERVE_SCAN_MAX.max(RESERVE_SCAN_PER_RESERVATION * per_model_max as usize);
        let mut found = Vec::new();
        for (p, queue) in self.queues.iter().enumerate() {
            let strict = self.projects[p].queueing == Queueing::StrictFifo;
            for (key, _) in queue.iter().take(scan) {
                let Some(w) = self.workloads.get(&key.2) else { continue };
                // Idle-suspended work and work in an idle backoff block nobody behind them.
                let steps_aside =
                    w.idle_suspended_at.is_some() || w.resume_at.is_some_and(|t| t > now);
                let since = Timestamp(w.pending_since.0.saturating_add(after_ms));
                let waiting = w.stage == Stage::Pending
                    && !self.preemptors.contains(&key.2)
                    && !steps_aside
                    && w.resume_at.is_none()
                    && since <= now
                    // A one-GPU request takes the first GPU that frees anywhere: it needs
                    // no reservation, and would only keep one from the requests that do.
                    && matches!(w.spec.gpus_per_member,
                        GpuRequest::Whole(k) if k.saturating_mul(w.spec.members) >= 2);
                if waiting {
                    found.push((*key, since));
                }
                // Under strict FIFO nothing starts before the project's head does: GPUs held
                // for work behind it would keep the head off them while that work waited for
                // the head, and neither would ever start.
                if strict && !steps_aside {
                    break;
                }
            }
        }
        found.sort();
        found.into_iter().map(|(key, since)| (key.2, since)).collect()
    }

    /// When `project`'s line `key` would have room for `total` if running work ended at its
    /// max runtime (work told to stop: now), `None` if work with no known end must end first.
    /// Optimistic: quota a project gets back is counted as lent, though its own queued work
    /// may take it first. A what-if on the engine's own book: what it releases, it charges
    /// back before returning.
    fn quota_start(
        &mut self,
        now: Timestamp,
        project: ProjectId,
        key: QuotaKey,
        total: Shares,
    ) -> Option<Timestamp> {
        // (project, shares) released, as the line's usage fell: charged back in reverse.
        let mut released: Vec<(ProjectId, Shares)> = Vec::new();
        let mut release = |quota: &mut crate::quota::QuotaBook, p: ProjectId, shares: Shares| {
            let used = |quota: &crate::quota::QuotaBook| quota.line(p, key).map(|l| l.used);
            let before = used(quota);
            quota.release(p, key, shares);
            if let (Some(before), Some(after)) = (before, used(quota)) {
                released.push((p, before.saturating_sub(after)));
            }
        };
        for (&(p, k), &shares) in &self.stopping_shares {
            if k == key {
                release(&mut self.quota, p, shares);
            }
        }
        let mut at = now;
        let mut ends = self.deadlines.iter();
        let start = loop {
            match self.quota.view(project, key) {
                None => break None,
                Some(v) if v.available >= total => break Some(at),
                Some(_) => {}
            }
            let Some(&(end, id)) = ends.next() else { break None };
            let Some(w) = self.workloads.get(&id) else { continue };
            let Some(a) = w.allocation.as_ref().filter(|a| a.key == Some(key)) else { continue };
            if w.stage == Stage::Running {
                release(&mut self.quota, w.project, a.shares);
                at = end.max(now);
            }
        };
        for (p, shares) in released.into_iter().rev() {
            self.quota.charge(p, key, shares);
        }
        start
    }

    /// Whether `project`'s quota line for model `m` has room for `total` now.
    fn quota_allows(&self, project: crate::ids::ProjectId, m: ModelId, total: Shares) -> bool {
        self.quota
            .resolve(project, QuotaKey::Model(m))
            .and_then(|key| self.quota.view(project, key))
            .is_some_and(|v| total <= v.available)
    }

    /// When each in-use device becomes free, from the known ends of the work holding it;
    /// `None` for a device some holder of which has no known end (and for free devices).
    fn device_ends(&self, now: Timestamp) -> DeviceEndsAll {
        let mut offset = Vec::with_capacity(self.capacity.nodes.len() + 1);
        let mut count = 0usize;
        for n in &self.capacity.nodes {
            offset.push(count);
            count += n.devices.len();
        }
        offset.push(count);
        // (latest end, shares of the holders counted) per device.
        let mut known: Vec<Option<(Timestamp, u32)>> = vec![None; count];
        for &(end, id) in &self.deadlines {
            let Some(w) = self.workloads.get(&id) else { continue };
            let end = match w.stage {
                Stage::Running => end.max(now),
                Stage::Stopping => now,
                _ => continue,
            };
            let Some(a) = &w.allocation else { continue };
            for member in &a.placement.members {
                let Some(&base) = offset.get(member.node.0 as usize) else { continue };
                for d in &member.devices {
                    let Some(e) = known.get_mut(base + d.device as usize) else { continue };
                    let (at, shares) = e.get_or_insert((end, 0));
                    *at = (*at).max(end);
                    *shares = shares.saturating_add(d.shares);
                }
            }
        }
        let mut at = vec![None; count];
        for (n, node) in self.capacity.nodes.iter().enumerate() {
            for (d, dev) in node.devices.iter().enumerate() {
                let i = offset[n] + d;
                if let Some((end, shares)) = known[i]
                    && dev.free.saturating_add(shares) >= FULL
                {
                    at[i] = Some(end);
                }
            }
        }
        DeviceEndsAll { offset, at }
    }

    /// Where and when a request of `members` × `k` whole GPUs of model `m` starts earliest
    /// (module docs): (start, nodes with the GPUs needed on each, the devices counted).
    ///
    /// Run for every candidate every cycle, so it allocates per call, not per node: the
    /// devices of all nodes go in one buffer, and the start is the `wanted`-th soonest slot
    /// (a node's n-th slot frees with its (n × per-node need)-th soonest device), found by
    /// selection rather than by sorting every device's end.
    #[allow(clippy::too_many_arguments)]
    fn earliest(
        &self,
        now: Timestamp,
        m: ModelId,
        k: u32,
        members: u32,
        same_node: bool,
        ends: &DeviceEndsAll,
        taken: &[bool],
    ) -> Option<Earliest> {
        let per_node_needed = if same_node { k.saturating_mul(members) } else { k };
        // No node could ever hold a slot (a request too big for the model's nodes is read
        // every cycle: it must cost nothing).
        let most = self.capacity.max_devices_per_node.get(m.0 as usize).copied().unwrap_or(0);
        if per_node_needed == 0 || per_node_needed > most {
            return None;
        }
        let need = per_node_needed as usize;
        // Per usable node: its devices of the model with when each is free, soonest first
        // (a range of `devices`).
        let mut devices: Vec<(u16, Option<Timestamp>)> = Vec::with_capacity(ends.at.len());
        let mut nodes: Vec<(NodeId, usize, usize)> = Vec::new();
        for (i, n) in self.capacity.nodes.iter().enumerate() {
            if n.unavailable {
                continue;
            }
            let node = NodeId(i as u32);
            let from = devices.len();
            for (d, dev) in n.devices.iter().enumerate() {
                let d = d as u16;
                let at_index = ends.offset[i] + d as usize;
                if dev.model != m || dev.occupied || taken[at_index] {
                    continue;
                }
                let at = if dev.free == FULL && !dev.mig_in_use() {
                    Some(now)
                } else {
                    ends.at[at_index]
                };
                devices.push((d, at));
            }
            if devices.len() == from {
                continue;
            }
            devices[from..].sort_unstable_by_key(|&(d, at)| (at.is_none(), at, d));
            nodes.push((node, from, devices.len()));
        }
        // Slots (members) a node's devices hold by `t` (`None`: counting every device).
        let slots = |devs: &[(u16, Option<Timestamp>)], t: Option<Timestamp>| -> u32 {
            let free =
                devs.iter().filter(|(_, at)| t.is_none_or(|t| at.is_some_and(|a| a <= t))).count()
                    as u32;
            if same_node { u32::from(free >= per_node_needed) } else { free / k }
        };
        let wanted = if same_node { 1 } else { members };
        let everything: u32 = nodes.iter().map(|&(_, a, b)| slots(&devices[a..b], None)).sum();
        if everything < wanted {
            return None;
        }
        // The first instant at which the nodes hold `wanted` slots: the `wanted`-th soonest
        // known slot time over all nodes.
        let mut slot_times: Vec<Timestamp> = Vec::new();
        for &(_, a, b) in &nodes {
            let devs = &devices[a..b];
            if same_node {
                slot_times.extend(devs.get(need - 1).and_then(|&(_, at)| at));
            } else {
                slot_times
                    .extend(devs.iter().skip(need - 1).step_by(need).map_while(|&(_, at)| at));
            }
        }
        let start = (slot_times.len() >= wanted as usize)
            .then(|| *slot_times.select_nth_unstable(wanted as usize - 1).1);
        // When each node first holds a slot, and its slots: at the start, or (unknown start)
        // counting every device, ranked by the room whose end is known.
        let mut ranked: Vec<(Option<Timestamp>, u32, NodeId, usize, u32)> = nodes
            .iter()
            .enumerate()
            .filter_map(|(i, &(node, a, b))| {
                let devs = &devices[a..b];
                let ready = devs.get(need - 1).and_then(|&(_, at)| at);
                let (room, usable) = match start {
                    Some(t) => {
                        let room = slots(devs, Some(t));
                        (room, room)
                    }
                    // Unknown start: the room whose end is known counts first.
                    None => {
                        let known = devs.iter().filter(|(_, at)| at.is_some()).count() as u32;
                        let room =
                            if same_node { u32::from(known >= per_node_needed) } else { known / k };
                        (room, slots(devs, None))
                    }
                };
                (usable > 0).then_some((ready, room, node, i, usable))
            })
            .collect();
        // Only the first `wanted` nodes of the ranking can be chosen (each gives a slot or more).
        let key = |&(ready, room, node, ..): &(Option<Timestamp>, u32, NodeId, usize, u32)| {
            (ready.is_none(), ready, std::cmp::Reverse(room), node)
        };
        if ranked.len() > wanted as usize {
            ranked.select_nth_unstable_by_key(wanted as usize - 1, key);
            ranked.truncate(wanted as usize);
        }
        ranked.sort_unstable_by_key(key);
        let mut chosen = Vec::new();
        let mut counted = Vec::new();
        let mut left = wanted;
        for (_, _, node, i, usable) in ranked {
            if left == 0 {
                break;
            }
            let slots_here = usable.min(left);
            left -= slots_here;
            let gpus = if same_node { per_node_needed } else { slots_here * k };
            let (_, a, b) = nodes[i];
            counted.extend(devices[a..b].iter().take(gpus as usize).map(|&(d, _)| (node, d)));
            chosen.push((node, gpus));
        }
        (left == 0).then(|| {
            chosen.sort();
            (start, chosen, counted)
        })
    }

    /// Whether a request deferred for placement would fit were every reservation it may not
    /// use open: then it is held for the reservation whose nodes that placement uses.
    pub(super) fn held_for_reservation(
        &mut self,
        r: &super::Request,
        models: &[ModelId],
    ) -> Option<DeferReason> {
        if self.reserve_held.is_empty() {
            return None;
        }
        let held: Vec<WorkloadId> = self.reserve_held.keys().copied().collect();
        self.open(&held);
        // A feasibility check (best fit, as the arbiter's what-ifs), not the kept placement.
        let mut found = None;
        for &m in models {
            let placed = match r.layout() {
                Layout::SameNode if r.members > 1 => {
                    self.capacity.find(Some(m), r.shape, r.members, r.layout())
                }
                _ => self.capacity.find_each(Some(m), r.shape, r.members, Refine::BestFit),
            };
            if placed.is_some() {
                found = placed;
                break;
            }
        }
        for &id in &held {
            self.close(id);
        }
        let placement = found?;
        let used: BTreeSet<NodeId> = placement.members.iter().map(|m| m.node).collect();
        let (id, res) = self
            .reserved
            .iter()
            .find(|(_, res)| res.nodes.iter().any(|(n, _)| used.contains(n)))
            .or_else(|| self.reserved.iter().next())?;
        Some(DeferReason::HeldForReservation {
            reservation: *id,
            nodes: res.nodes.iter().map(|(n, _)| *n).collect(),
            start: res.start,
        })
    }

    /// Whether admitting request `r` on line `key` would take quota held for a request that
    /// goes before it (`quota_holds`): then the deferral it gets instead. A request goes
    /// before the owner of a hold if it is of the owner's project and ahead of it in its
    /// queue, or of another project and of higher priority or within its guarantee (a
    /// guarantee is never held for another project's borrower).
    pub(super) fn quota_held_for(
        &mut self,
        r: &super::Request,
        key: QuotaKey,
    ) -> Option<DeferReason> {
        // Most holds are on other lines: the cheap tests go first, lookups after.
        let others_on_line = |h: &QuotaHold| h.key == key && h.owner != r.id;
        if !self.quota_holds.iter().any(others_on_line) {
            return None;
        }
        let line = self.quota.line(r.project, key)?;
        let borrows = line.used.saturating_add(r.total) > line.guaranteed;
        for i in 0..self.quota_holds.len() {
            let h = self.quota_holds[i];
            if !others_on_line(&h) {
                continue;
            }
            let goes_before = if h.project == r.project {
                r.queue_key < h.queue_key
            } else {
                r.priority > h.priority || !borrows
            };
            let backfills = h.backfill_ms.is_some_and(|b| r.max_runtime_ms.is_some_and(|m| m <= b));
            if goes_before || backfills {
                continue;
            }
            let Some(before) = self.quota.view(h.project, key).map(|v| v.available) else {
                continue;
            };
            // Admitting `r` takes at most its own ask from anyone's room.
            if before >= h.total.saturating_add(r.total) {
                continue;
            }
            self.quota.charge(r.project, key, r.total);
            let after = self.quota.view(h.project, key).map_or(before, |v| v.available);
            self.quota.release(r.project, key, r.total);
            if after < before && after < h.total {
                return Some(DeferReason::QuotaHeldForReservation { reservation: h.owner, key });
            }
        }
        None
    }

    /// The quota holds on the lines of `w`'s shape that may treat its workloads differently
    /// (`quota_held_for`): those of its own project, where a workload queued ahead of the
    /// owner goes first, and those that let short work through, where its max runtime
    /// decides. Other holds treat every workload of the shape alike.
    pub(super) fn holds_apart(&self, w: &WorkloadState) -> HoldsApart {
        let lines: Vec<QuotaKey> = self
            .candidate_models(w)
            .iter()
            .filter_map(|&m| self.quota.resolve(w.project, QuotaKey::Model(m)))
            .collect();
        let mut apart = HoldsApart::default();
        for h in self.quota_holds.iter().filter(|h| lines.contains(&h.key)) {
            if h.project == w.project {
                apart.owners.push(h.queue_key);
            }
            apart.windows.extend(h.backfill_ms);
        }
        apart.owners.sort_unstable();
        apart.windows.sort_unstable();
        apart
    }

    /// The (cohort, quota line) on which a deferred workload waits for room within its
    /// guarantee, if it does: it claims that line against borrowers of other projects.
    pub(super) fn claim_of(&self, id: WorkloadId) -> Option<(usize, QuotaKey)> {
        self.reservation_policy?;
        let w = self.workloads.get(&id)?;
        let total = w.spec.total_shares();
        if total == Shares::ZERO {
            return None;
        }
        self.candidate_models(w).iter().find_map(|&m| {
            let key = self.quota.resolve(w.project, QuotaKey::Model(m))?;
            let l = self.quota.line(w.project, key)?;
            (l.used.saturating_add(total) <= l.guaranteed)
                .then_some((self.projects[w.project.0 as usize].cohort, key))
        })
    }

    /// Whether admitting request `r` on line `key` would make its project borrow while a
    /// claimant of another project of the cohort waits on that line (`claims`, this cycle's):
    /// then the deferral it gets instead.
    pub(super) fn borrow_held_for(
        &self,
        r: &super::Request,
        key: QuotaKey,
        claims: &BTreeMap<(usize, QuotaKey), WorkloadId>,
    ) -> Option<DeferReason> {
        if claims.is_empty() {
            return None;
        }
        let cohort = self.projects[r.project.0 as usize].cohort;
        let &claimant = claims.get(&(cohort, key))?;
        let other = self.workloads.get(&claimant).is_some_and(|c| c.project != r.project);
        let line = self.quota.line(r.project, key)?;
        let borrows = line.used.saturating_add(r.total) > line.guaranteed;
        (other && borrows).then_some(DeferReason::HeldForClaimant { claimant, key })
    }

    /// The quota `explain`'s cycle held for a pending workload, if any.
    pub(crate) fn quota_hold(&self, id: WorkloadId) -> Option<&QuotaHold> {
        self.quota_holds.iter().find(|h| h.owner == id)
    }

    /// The reservation `explain`'s cycle made for a pending workload, if any.
    pub(crate) fn reservation(&self, id: WorkloadId) -> Option<&Reservation> {
        self.reserved.get(&id)
    }

    /// The reservations a cycle run at `now` would make, by workload (a what-if on a clone:
    /// the engine keeps none between cycles).
    pub fn reservations(&self, now: Timestamp) -> Vec<(WorkloadId, Reservation)> {
        if self.reservation_policy.is_none() {
            return Vec::new();
        }
        let mut sim = self.clone();
        let mut decisions = Vec::new();
        sim.advance(now);
        sim.stop_due(now, &mut decisions);
        for id in sim.preemptors.clone() {
            if !sim.victims_still_stopping(id).is_empty() {
                sim.hold_plan(id);
            }
        }
        sim.plan_reservations(now);
        std::mem::take(&mut sim.reserved).into_iter().collect()
    }
}
