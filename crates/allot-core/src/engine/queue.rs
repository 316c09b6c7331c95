//! The queues: one per project, ordered inside by priority, then submit time, then id
//! (`QueueKey`), and the order step 4 of the cycle visits projects in (`project_order_key`:
//! a head that fits in its guarantee before one that would borrow, then the lowest
//! fair-share standing, then the head's priority and submit time), with the fair-share
//! clock that decays past allocation (`advance`).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound::{Excluded, Unbounded};

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
///
/// Entries change only through its methods, which keep `runs` and `by_shape` true: every
/// change to an entry cuts the run covering it around it.
#[derive(Clone, Default)]
pub(crate) struct Queue {
    entries: BTreeMap<QueueKey, QueueEntry>,
    /// Stretches of consecutive entries the cycle found alike (`Run`), keyed by their first
    /// entry's key; disjoint. A cache across cycles, so that the cycle's walk over work it
    /// would pass over (`Engine::serve_next`) steps over a stretch at once instead of entry
    /// by entry: in a deep queue most of it is such stretches.
    runs: BTreeMap<QueueKey, Run>,
    /// The entries by shape, for the walk to find a run's next entry of a shape it cannot
    /// pass over; made when the first run is filed (a queue without runs, the daemon's,
    /// does not keep it: interleaved with the entries' own nodes it slowed the daemon's walk).
    by_shape: Option<BTreeSet<(ShapeId, QueueKey)>>,
}

/// Consecutive queue entries, from the key the run is filed under to `last`, that are all
/// plain, of at most `RUN_SHAPES` shapes, and were last told deferrals of one kind per
/// shape. A cycle that tells a queued workload only a deferral of a new kind
/// (`Refresh::KINDS_ONLY`, the replay's) tells all of a shape's entries the same: nothing,
/// or something.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    pub last: QueueKey,
    /// Filled from the front.
    shapes: [Option<RunShape>; RUN_SHAPES],
}

/// A run's entries of one shape: `told` is one of the deferrals they were last told, all of
/// its kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RunShape {
    pub shape: ShapeId,
    pub told: ReasonId,
}

/// The most shapes a run holds: a project's queue mixes a few request sizes.
const RUN_SHAPES: usize = 4;

/// The shortest run filed: any two alike. A longer one measured no faster on the Philly
/// replay, and would leave the property tests' short queues without runs to check.
pub(crate) const RUN_MIN: usize = 2;

impl Run {
    /// A run of one entry, `key`, of `shape`, last told `told`.
    pub fn new(key: QueueKey, shape: ShapeId, told: ReasonId) -> Run {
        let mut shapes = [None; RUN_SHAPES];
        shapes[0] = Some(RunShape { shape, told });
        Run { last: key, shapes }
    }

    /// Takes in the next entry, if it can (false: a shape too many, or a deferral of
    /// another kind than its shape's).
    pub fn extend(&mut self, key: QueueKey, entry: RunShape, reasons: &Reasons) -> bool {
        if !self.take(entry, reasons) {
            return false;
        }
        self.last = key;
        true
    }

    /// This run's entries followed by `next`'s, if one run can hold them (as `extend`).
    pub fn then(&self, next: &Run, reasons: &Reasons) -> Option<Run> {
        let mut joined = *self;
        for s in next.shapes() {
            if !joined.take(*s, reasons) {
                return None;
            }
        }
        joined.last = next.last;
        Some(joined)
    }

    fn take(&mut self, entry: RunShape, reasons: &Reasons) -> bool {
        for slot in &mut self.shapes {
            match slot {
                Some(s) if s.shape == entry.shape => return reasons.same_kind(s.told, entry.told),
                Some(_) => {}
                None => {
                    *slot = Some(entry);
                    return true;
                }
            }
        }
        false
    }

    pub fn shapes(&self) -> impl Iterator<Item = &RunShape> {
        self.shapes.iter().flatten()
    }
}

impl Queue {
    pub fn insert(&mut self, key: QueueKey, entry: QueueEntry) {
        self.cut_runs_at(key);
        if let Some(old) = self.entries.insert(key, entry) {
            self.index_out(old.shape, key);
        }
        if let Some(index) = &mut self.by_shape {
            index.insert((entry.shape, key));
        }
    }

    pub fn remove(&mut self, key: &QueueKey) -> Option<QueueEntry> {
        let removed = self.entries.remove(key)?;
        // The rest of its run is still one; filed under its next entry if it led.
        if let Some(run) = self.runs.remove(key)
            && let Some((&after, _)) = self.entries.range((Excluded(*key), Unbounded)).next()
            && after <= run.last
        {
            self.runs.insert(after, run);
        }
        self.index_out(removed.shape, *key);
        Some(removed)
    }

    /// Changes the entry under `key`, if queued; a change takes it out of its run.
    pub fn modify<R>(&mut self, key: &QueueKey, f: impl FnOnce(&mut QueueEntry) -> R) -> Option<R> {
        let entry = self.entries.get_mut(key)?;
        let before = *entry;
        let result = f(entry);
        let after = *entry;
        if after != before {
            self.cut_runs_at(*key);
        }
        if after.shape != before.shape {
            self.index_out(before.shape, *key);
            if let Some(index) = &mut self.by_shape {
                index.insert((after.shape, *key));
            }
        }
        Some(result)
    }

    /// Changes every entry (numbers renumbered): all runs go.
    pub fn modify_all(&mut self, mut f: impl FnMut(&QueueKey, &mut QueueEntry)) {
        self.runs.clear();
        for (key, entry) in &mut self.entries {
            f(key, entry);
        }
        self.by_shape = None;
    }

    /// The first entry of `shape` after `after` (with no index, just the next entry: no
    /// later than it).
    pub fn next_of_shape(&self, shape: ShapeId, after: QueueKey) -> Option<QueueKey> {
        let Some(index) = &self.by_shape else {
            // No index (no run filed yet): the next entry, whatever its shape.
            return self.entries.range((Excluded(after), Unbounded)).next().map(|(k, _)| *k);
        };
        let next = index.range((Excluded((shape, after)), Unbounded)).next()?;
        (next.0 == shape).then_some(next.1)
    }

    fn index_out(&mut self, shape: ShapeId, key: QueueKey) {
        if let Some(index) = &mut self.by_shape {
            index.remove(&(shape, key));
        }
    }

    /// Files a run the cycle just walked over, from `first`, replacing any it overlaps.
    pub fn file_run(&mut self, first: QueueKey, run: Run) {
        if self.by_shape.is_none() {
            self.by_shape = Some(self.entries.iter().map(|(k, e)| (e.shape, *k)).collect());
        }
        let mut overlapped: Vec<QueueKey> =
            self.runs.range(first..=run.last).map(|(k, _)| *k).collect();
        overlapped.extend(self.run_over(first).map(|(k, _)| k));
        for k in overlapped {
            self.runs.remove(&k);
        }
        self.runs.insert(first, run);
    }

    /// Whether every filed run is true of the entries it covers (`Run`), and the index by
    /// shape holds the entries (`Engine::audit`).
    pub fn check_runs(&self, reasons: &Reasons) -> Result<(), String> {
        if let Some(index) = &self.by_shape
            && (index.len() != self.entries.len()
                || !index.iter().all(|(s, k)| self.entries.get(k).is_some_and(|e| e.shape == *s)))
        {
            return Err("its index by shape is not its entries".into());
        }
        let mut end: Option<QueueKey> = None;
        for (first, run) in &self.runs {
            if !self.entries.contains_key(first) || end.is_some_and(|end| *first <= end) {
                return Err(format!("a run filed under {first:?} is no entry's or overlaps"));
            }
            end = Some(run.last);
            for (key, e) in self.entries.range(first..=&run.last) {
                let told = e.reported.filter(|_| e.plain && !e.handled);
                let fits = run.shapes().any(|s| {
                    s.shape == e.shape && told.is_some_and(|t| reasons.same_kind(t, s.told))
                });
                if !fits {
                    return Err(format!("{key:?} in the run from {first:?} is not like it: {e:?}"));
                }
            }
        }
        Ok(())
    }

    /// The run covering `key`, and the key it is filed under.
    pub fn run_over(&self, key: QueueKey) -> Option<(QueueKey, Run)> {
        let (&first, &run) = self.runs.range(..=key).next_back()?;
        (run.last >= key).then_some((first, run))
    }

    /// Takes `key` out of the run covering it (the entry there is about to come, or has
    /// changed): what is before it and what is after it stay runs, since a part of a run is
    /// one too. A run's `last` may name an entry gone since (`remove`); it is still an upper
    /// bound, and nothing can be queued between without a cut.
    fn cut_runs_at(&mut self, key: QueueKey) {
        let Some((first, run)) = self.run_over(key) else { return };
        self.runs.remove(&first);
        if first < key
            && let Some((&before, _)) = self.entries.range(first..key).next_back()
        {
            self.runs.insert(first, Run { last: before, ..run });
        }
        if let Some((&after, _)) = self.entries.range((Excluded(key), Unbounded)).next()
            && after <= run.last
        {
            self.runs.insert(after, run);
        }
    }
}

/// What the cycle knows of a queued workload without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QueueEntry {
    pub shape: ShapeId,
    /// Its max runtime (held quota lets short work through: `HoldsApart`).
    pub max_runtime_ms: Option<u64>,
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
        &self.entries
    }
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.entries.keys()).finish()
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
        let entry = QueueEntry {
            shape,
            max_runtime_ms: w.spec.max_runtime_ms,
            plain,
            reported: None,
            reported_at: Timestamp(0),
            handled: false,
        };
        self.queues[w.project.0 as usize].insert(w.queue_key(), entry);
    }

    /// Changes the queue entry of a queued workload (`None`: not queued).
    pub(super) fn modify_queued<R>(
        &mut self,
        id: WorkloadId,
        f: impl FnOnce(&mut QueueEntry) -> R,
    ) -> Option<R> {
        let w = self.workloads.get(&id)?;
        self.queues[w.project.0 as usize].modify(&w.queue_key(), f)
    }

    /// The shape number a queued workload is filed under (`None`: not queued).
    pub(super) fn queued_shape(&self, w: &WorkloadState) -> Option<ShapeId> {
        self.queues[w.project.0 as usize].get(&w.queue_key()).map(|e| e.shape)
    }

    /// `decide_changes` reports the queued workload's next deferral, repeat or not.
    pub(super) fn forget_reported(&mut self, id: WorkloadId) {
        self.modify_queued(id, |e| e.reported = None);
    }

    /// A queued workload got an idle backoff: the cycle must read it again.
    pub(super) fn unmark_plain(&mut self, id: WorkloadId) {
        self.modify_queued(id, |e| e.plain = false);
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
                q.modify_all(|_, e| {
                    e.reported = e.reported.map(|r| self.reasons.number(old.get(r)));
                });
            }
        }
        if self.shapes.0.len() > NUMBERS_KEPT_FREE + 2 * queued {
            self.shapes = Shapes::default();
            for q in &mut self.queues {
                q.modify_all(|key, e| {
                    if let Some(w) = self.workloads.get(&key.2) {
                        e.shape = self.shapes.number(w);
                    }
                });
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(t: u64) -> QueueKey {
        (Reverse(0), Timestamp(t), WorkloadId(t))
    }

    /// A queue of entries 1..=8, all told `told`, of shapes alternating 0 and 1, with one
    /// run over them all, as the cycle files it.
    fn queue_with_run(reasons: &mut Reasons) -> Queue {
        let told = reasons.number(&DeferReason::NoQuotaForModel { project: ProjectId(0) });
        let mut queue = Queue::default();
        for t in 1..=8 {
            let shape = (t % 2) as ShapeId;
            let entry = QueueEntry {
                shape,
                max_runtime_ms: None,
                plain: true,
                reported: Some(told),
                reported_at: Timestamp(t),
                handled: false,
            };
            queue.insert(key(t), entry);
        }
        let mut run = Run::new(key(1), 1, told);
        for t in 2..=8 {
            assert!(run.extend(key(t), RunShape { shape: (t % 2) as ShapeId, told }, reasons));
        }
        queue.file_run(key(1), run);
        assert_eq!(queue.check_runs(reasons), Ok(()));
        queue
    }

    fn filed(queue: &Queue) -> Vec<(u64, u64)> {
        queue.runs.iter().map(|(first, run)| (first.1.0, run.last.1.0)).collect()
    }

    #[test]
    fn a_run_is_cut_where_an_entry_comes_changes_or_leads_out() {
        let mut reasons = Reasons::default();
        let mut queue = queue_with_run(&mut reasons);
        assert_eq!(filed(&queue), [(1, 8)]);

        // Queued in the middle (a requeue keeps its place): the run splits around it.
        let fresh = QueueEntry {
            shape: 0,
            max_runtime_ms: None,
            plain: true,
            reported: None,
            reported_at: Timestamp(0),
            handled: false,
        };
        queue.insert((Reverse(0), Timestamp(4), WorkloadId(100)), fresh);
        assert_eq!(queue.check_runs(&reasons), Ok(()));
        assert_eq!(filed(&queue), [(1, 4), (5, 8)]);

        // Told something else: out of its run.
        queue.modify(&key(6), |e| e.plain = false);
        assert_eq!(queue.check_runs(&reasons), Ok(()));
        assert_eq!(filed(&queue), [(1, 4), (5, 5), (7, 8)]);

        // A change that changes nothing cuts nothing.
        queue.modify(&key(2), |e| e.plain = true);
        assert_eq!(filed(&queue), [(1, 4), (5, 5), (7, 8)]);

        // Leaving: the rest stays a run, under its next entry when the one leaving led.
        queue.remove(&key(1));
        queue.remove(&key(3));
        assert_eq!(queue.check_runs(&reasons), Ok(()));
        assert_eq!(filed(&queue), [(2, 4), (5, 5), (7, 8)]);

        // A run filed over others replaces them; renumbering drops them all.
        queue.modify(&key(6), |e| e.plain = true);
        let Some(told) = queue[&key(6)].reported else { panic!("entry 6 was told") };
        let mut run = Run::new(key(5), 1, told);
        for t in 6..=8 {
            assert!(run.extend(key(t), RunShape { shape: (t % 2) as ShapeId, told }, &reasons));
        }
        queue.file_run(key(5), run);
        assert_eq!(queue.check_runs(&reasons), Ok(()));
        assert_eq!(filed(&queue), [(2, 4), (5, 8)]);
        queue.modify_all(|_, _| {});
        assert_eq!(filed(&queue), []);
    }

    #[test]
    fn a_run_holds_few_shapes_and_one_kind_of_deferral_each() {
        let mut reasons = Reasons::default();
        let a = reasons.number(&DeferReason::NoQuotaForModel { project: ProjectId(0) });
        let b = reasons.number(&DeferReason::NoQuotaForModel { project: ProjectId(1) });
        let other = reasons.number(&DeferReason::WaitingForPreemption { victims: Vec::new() });
        let entry = |shape: ShapeId, told| RunShape { shape, told };
        let mut run = Run::new(key(1), 0, a);
        // Of the kind, figures aside; not of another kind.
        assert!(run.extend(key(2), entry(0, b), &reasons));
        assert!(!run.extend(key(3), entry(0, other), &reasons));
        assert_eq!(run.last, key(2));
        for shape in 1..RUN_SHAPES as ShapeId {
            assert!(run.extend(key(3), entry(shape, other), &reasons));
        }
        assert!(!run.extend(key(4), entry(RUN_SHAPES as ShapeId, a), &reasons));
        assert_eq!(run.shapes().count(), RUN_SHAPES);
        // Two runs join as one under the same rules.
        let joined = run.then(&Run::new(key(5), 1, other), &reasons);
        assert_eq!(joined.map(|j| (j.last, j.shapes().count())), Some((key(5), RUN_SHAPES)));
        assert!(run.then(&Run::new(key(5), 0, other), &reasons).is_none());
        assert!(run.then(&Run::new(key(5), RUN_SHAPES as ShapeId, a), &reasons).is_none());
    }
}
