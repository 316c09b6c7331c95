//! The queues: one per project, ordered inside by priority, then submit time, then id
//! (`QueueKey`), and the order step 4 of the cycle visits projects in (`project_order_key`:
//! a head that fits in its guarantee before one that would borrow, then the lowest
//! fair-share standing, then the head's priority and submit time), with the fair-share
//! clock that decays past allocation (`advance`).

use std::cmp::Reverse;
use std::collections::BTreeMap;

use super::{Engine, WorkloadState};
use crate::capacity::Layout;
use crate::decision::{DeferReason, QuotaKey};
use crate::ids::{ModelId, ProjectId, Shares, Timestamp, WorkloadId};
use crate::model::GpuRequest;

/// Order inside a project: higher priority, then earlier submit, then lower id.
pub(crate) type QueueKey = (Reverse<i32>, Timestamp, WorkloadId);

/// One project's pending work in queue order, each with its request shape's number
/// (`ShapeId`), so that the cycle knows a workload's shape without reading the workload.
/// Its `Debug` shows the keys only: shape numbers are derived, and differ in a rebuilt
/// engine that is otherwise equal.
#[derive(Clone, Default)]
pub(crate) struct Queue(BTreeMap<QueueKey, QueueEntry>);

/// What the cycle knows of a queued workload without reading it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QueueEntry {
    pub shape: ShapeId,
    /// Queued with no idle suspension or backoff (none set since): the cycle may answer it
    /// from its memory of failed shapes without reading the workload.
    pub plain: bool,
    /// The deferral `decide_changes` last reported for it (numbered in `Reasons`).
    pub reported: Option<ReasonId>,
    /// When that deferral was reported (`decide_news` refreshes figures by its age).
    pub reported_at: Timestamp,
    /// A pre-emptor step 3 of the current cycle decided, which step 4 passes over (set and
    /// cleared within one cycle).
    pub handled: bool,
}

impl QueueEntry {
    /// Whether a deferral numbered `number` is reported to this queued workload now, under
    /// `decide_changes` (`news`: under `decide_news`, with its refreshes left this cycle);
    /// if so, it becomes the one last reported.
    pub fn report(
        &mut self,
        number: ReasonId,
        reasons: &Reasons,
        news: &mut Option<(super::Refresh, usize)>,
        now: Timestamp,
    ) -> bool {
        match self.tells(number, reasons, news, now) {
            Telling::Nothing => return false,
            Telling::Refresh => {
                if let Some((_, left)) = news {
                    *left -= 1;
                }
            }
            Telling::News => {}
        }
        self.reported = Some(number);
        self.reported_at = now;
        true
    }

    /// What `report` would do with a deferral numbered `number`, changing nothing: the
    /// cycle passes over queued workloads it would tell nothing (`Engine::serve_next`).
    #[inline]
    pub fn tells(
        &self,
        number: ReasonId,
        reasons: &Reasons,
        news: &Option<(super::Refresh, usize)>,
        now: Timestamp,
    ) -> Telling {
        let Some(last) = self.reported else { return Telling::News };
        if last == number {
            return Telling::Nothing;
        }
        match news {
            Some((refresh, left)) if reasons.same_kind(last, number) => {
                if *left == 0 || now.since(self.reported_at) < refresh.min_age_ms {
                    Telling::Nothing
                } else {
                    Telling::Refresh
                }
            }
            _ => Telling::News,
        }
    }
}

/// What a queued workload is told of a deferral (`QueueEntry::tells`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Telling {
    /// Nothing: it was told this, or one of its kind too recently or past the cycle's refreshes.
    Nothing,
    /// The same kind with new figures, counted against the cycle's refreshes.
    Refresh,
    /// A deferral of a new kind, or its first.
    News,
}

impl std::ops::Deref for Queue {
    type Target = BTreeMap<QueueKey, QueueEntry>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Queue {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// A request's shape: everything about a pending workload that its deferral and its place
/// in the project order depend on, bar whether it may pre-empt (which changes while it
/// waits). Workloads of one shape get the same answer from the same state.
pub(crate) type Shape = (ProjectId, i32, u32, GpuRequest, ModelList, u64, u64, Layout);

/// A shape's number in the engine's table of shapes (`Shapes`); numbers are never reused.
pub(crate) type ShapeId = u32;

/// How many shape or reason numbers beyond twice the queued work are kept before pruning.
const NUMBERS_KEPT_FREE: usize = 4096;

/// A deferral's number in the engine's table of reasons (`Reasons`).
pub(crate) type ReasonId = u32;

/// The deferrals of the cycle's memory, numbered by value, so that `decide_changes` tells a
/// repeated deferral by its number. Derived, not saved (its `Debug` shows nothing); pruned
/// to the reasons still reported when it grows (`Engine::prune_numbers`).
#[derive(Clone, Default)]
pub(crate) struct Reasons {
    ids: BTreeMap<DeferReason, ReasonId>,
    list: Vec<DeferReason>,
    /// Each one's kind, apart: the cycle compares kinds for every queued workload it passes.
    kinds: Vec<std::mem::Discriminant<DeferReason>>,
}

impl Reasons {
    pub fn number(&mut self, reason: &DeferReason) -> ReasonId {
        if let Some(&id) = self.ids.get(reason) {
            return id;
        }
        let id = self.list.len() as ReasonId;
        self.ids.insert(reason.clone(), id);
        self.list.push(reason.clone());
        self.kinds.push(std::mem::discriminant(reason));
        id
    }

    /// Whether the deferrals numbered `a` and `b` are of one kind (figures aside).
    pub fn same_kind(&self, a: ReasonId, b: ReasonId) -> bool {
        self.kinds[a as usize] == self.kinds[b as usize]
    }

    pub fn get(&self, id: ReasonId) -> &DeferReason {
        &self.list[id as usize]
    }
}

impl std::fmt::Debug for Reasons {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reasons")
    }
}

/// A workload's accepted models, in order, as a shape key: packed into one integer when
/// short (nearly always: none, or a few), so comparing shapes allocates nothing.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum ModelList {
    Packed(u128),
    Long(Vec<ModelId>),
}

impl ModelList {
    fn of(models: &[ModelId]) -> ModelList {
        if models.len() > 7 {
            return ModelList::Long(models.to_vec());
        }
        // Length in the low byte, then 16 bits per model: distinct lists, distinct numbers.
        let packed = models
            .iter()
            .enumerate()
            .fold(models.len() as u128, |acc, (i, m)| acc | (u128::from(m.0) << (8 + 16 * i)));
        ModelList::Packed(packed)
    }
}

/// The shapes of the work queued so far, numbered in the order first seen. Derived, not
/// saved: a restored engine numbers them afresh, and numbers only key the cycle's memory
/// (so its `Debug` shows nothing).
#[derive(Clone, Default)]
pub(crate) struct Shapes(BTreeMap<Shape, ShapeId>);

impl std::fmt::Debug for Shapes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Shapes")
    }
}

impl Shapes {
    fn number(&mut self, w: &WorkloadState) -> ShapeId {
        let shape = shape_of(w);
        let next = self.0.len() as ShapeId;
        *self.0.entry(shape).or_insert(next)
    }
}

fn shape_of(w: &WorkloadState) -> Shape {
    let member = w.shape();
    (
        w.project,
        w.priority,
        w.spec.members,
        member.gpus,
        ModelList::of(&w.models),
        member.cpu,
        member.mem,
        Layout::of(w.spec.same_node, w.spec.prefer_same_node),
    )
}

/// A project's place in step 4's order (`project_order_key`): (borrows, fair-share standing,
/// head's priority, head's submit time, project).
pub(crate) type OrderKey = (u8, u64, Reverse<i32>, Timestamp, ProjectId);

/// The order key of `project` with standing `standing` and head `key`, within its guarantee
/// or not.
pub(super) fn order_key(
    project: ProjectId,
    standing: u64,
    key: QueueKey,
    within: bool,
) -> OrderKey {
    (u8::from(!within), standing, key.0, key.1, project)
}

impl WorkloadState {
    pub(super) fn queue_key(&self) -> QueueKey {
        (Reverse(self.priority), self.queued_at, self.spec.id)
    }
}

impl Engine {
    /// Puts a pending workload in its project's queue, under its shape's number.
    pub(super) fn enqueue(&mut self, id: WorkloadId) {
        let Some(w) = self.workloads.get(&id) else { return };
        let shape = self.shapes.number(w);
        let plain = w.idle_suspended_at.is_none() && w.resume_at.is_none();
        let entry =
            QueueEntry { shape, plain, reported: None, reported_at: Timestamp(0), handled: false };
        self.queues[w.project.0 as usize].insert(w.queue_key(), entry);
    }

    /// The queue entry of a queued workload (`None`: not queued).
    pub(super) fn queue_entry_mut(&mut self, id: WorkloadId) -> Option<&mut QueueEntry> {
        let w = self.workloads.get(&id)?;
        self.queues[w.project.0 as usize].get_mut(&w.queue_key())
    }

    /// The shape number a queued workload is filed under (`None`: not queued).
    pub(super) fn queued_shape(&self, w: &WorkloadState) -> Option<ShapeId> {
        self.queues[w.project.0 as usize].get(&w.queue_key()).map(|e| e.shape)
    }

    /// `decide_changes` reports the queued workload's next deferral, repeat or not.
    pub(super) fn forget_reported(&mut self, id: WorkloadId) {
        if let Some(e) = self.queue_entry_mut(id) {
            e.reported = None;
        }
    }

    /// A queued workload got an idle backoff: the cycle must read it again.
    pub(super) fn unmark_plain(&mut self, id: WorkloadId) {
        if let Some(e) = self.queue_entry_mut(id) {
            e.plain = false;
        }
    }

    /// Drops the reasons no queued workload was last told, and the shapes no queued workload
    /// has, once they outnumber the queued work (a long replay meets many distinct numbers, a
    /// daemon many shapes), renumbering the rest. Between cycles only: the cycle's memory is
    /// keyed by these numbers.
    pub(super) fn prune_numbers(&mut self) {
        let queued: usize = self.queues.iter().map(|q| q.len()).sum();
        if self.reasons.list.len() > NUMBERS_KEPT_FREE + 2 * queued {
            let old = std::mem::take(&mut self.reasons);
            for q in &mut self.queues {
                for e in q.0.values_mut() {
                    e.reported = e.reported.map(|r| self.reasons.number(old.get(r)));
                }
            }
        }
        if self.shapes.0.len() > NUMBERS_KEPT_FREE + 2 * queued {
            self.shapes = Shapes::default();
            for q in &mut self.queues {
                for (key, e) in q.0.iter_mut() {
                    if let Some(w) = self.workloads.get(&key.2) {
                        e.shape = self.shapes.number(w);
                    }
                }
            }
        }
    }

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
        self.order_key_of(project, w.queue_key(), self.head_within_guarantee(w))
    }

    /// `project_order_key` for a head with queue key `key`, given whether it is within its
    /// guarantee.
    pub(super) fn order_key_of(&self, project: ProjectId, key: QueueKey, within: bool) -> OrderKey {
        order_key(project, self.standing(project.0 as usize), key, within)
    }

    /// Project `p`'s fair-share standing: its allocation, now and decayed, over its fair
    /// share, in millionths (a project of weight 0 stands last).
    pub(super) fn standing(&self, p: usize) -> u64 {
        let p = &self.projects[p];
        if p.weight_milli == 0 {
            u64::MAX
        } else {
            let usage = p.allocated.0 as f64 + p.decayed_allocated;
            (usage / p.fair_share.max(1.0) * 1e6) as u64
        }
    }

    /// Whether the head would be admitted within its guarantee, judged on the model it would
    /// go to: of the models with room for one member now, the first in the workload's order
    /// (any of them, for work that accepts any model, as admission weighs them); with room
    /// on none, its first model with a quota line. Not its first model alone: work whose first
    /// model is full but fits its guarantee on its second is no borrower.
    pub(crate) fn head_within_guarantee(&self, w: &WorkloadState) -> bool {
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
