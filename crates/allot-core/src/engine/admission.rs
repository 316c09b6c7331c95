//! Admission: steps 3 and 4 of the cycle (`admission_steps`, called by
//! `Engine::admission_cycle`): waiting pre-emptors first, then the projects' queues in
//! fair-share order one workload at a time, then idle-suspended work into what is left. Per
//! workload (`try_schedule`), per accepted GPU model (`check_model`): quota line, max quota,
//! MIG profile, ever placeable, quota available now (less what waiting pre-emptors of the
//! project hold against it), placement → admit (`commit`, `book.rs`); else the arbiter
//! (`preempt.rs`) or defragmentation (`defrag.rs`); else a typed deferral with the closest
//! reason across models (`rank`). `check_model`, `facts` and `Request` are shared with
//! `explain`.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound::{self, Excluded, Included, Unbounded};

use super::preempt::EligibleLists;
use super::queue::{
    OrderKey, Queue, QueueEntry, QueueKey as Queued, RUN_MIN, ReasonId, Run, RunShape, ShapeId,
    Telling, order_key,
};
use super::reserve::{AmongHolds, HoldPlace, HoldsApart};
use super::{Engine, QueueKey, WorkloadState};
use crate::capacity::{Layout, MemberShape};
use crate::decision::{
    AdmitReason, Decision, DeferReason, HostShortfall, Placement, PlacementFacts, QuotaKey,
};
use crate::ids::{ModelId, NodeId, ProjectId, SHARES_PER_GPU, Shares, Timestamp, WorkloadId};
use crate::model::{GpuRequest, Queueing};

/// A cycle's memory of request shapes that found neither room nor victims. Capacity only
/// shrinks and claimed victims only grow within a cycle, so such a shape fails again. Each
/// failure keeps its deferral with the cycle's count of changes (`changes`, bumped by every
/// admission, pre-emption and pre-emptor let go) when it was made: a deferral is a pure read
/// of the state, so while nothing has changed the same shape gets the same reason, without
/// the quota and placement checks being made again. A deferral for a claim or held quota
/// (`HeldForClaimant`, `QuotaHeldForReservation`) is kept for that repeat only: once the
/// state changes the claim may be gone, and the shape is not known to lack room. Where held
/// quota tells the shape's workloads apart (by queue place or max runtime), such a deferral
/// is kept per place among the holds (`HoldPlace`), for the workloads that stand alike.
#[derive(Default)]
pub(crate) struct CycleMemory {
    /// Per shape (indexed by its number), then by whether it may pre-empt (0: no, 1: yes):
    /// the deferral and the count of changes then. Indexed, not searched: the cycle looks a
    /// shape up for every queued workload it passes.
    /// Each with whether it was a failure to find room or victims (a later change leaves the
    /// shape known to fail: `known_failure`) or only a repeat while nothing changes.
    failed: Vec<[Option<Failure>; 2]>,
    /// Per shape: whether its head would be within guarantee (`project_order_key`), and the
    /// count of changes then.
    within: Vec<Option<(u64, bool)>>,
    /// The arbiter's possible victims per project and model, made since the last change
    /// (the same for every claimant until the state changes).
    victims: EligibleLists,
    changes: u64,
    /// Per (cohort, quota line), the first request of the cycle within its guarantee that
    /// found no room (policy `reservations`): borrowers of other projects wait for it
    /// (`Engine::borrow_held_for`). Only grows within a cycle.
    claims: BTreeMap<(usize, QuotaKey), WorkloadId>,
    /// Per shape (indexed by its number): the quota holds that tell its workloads apart,
    /// and the deferrals kept per place among them, since the last change.
    apart: Vec<ShapeApart>,
}

/// What a cycle knows since its last change (`at`) of the quota holds that tell a shape's
/// workloads apart (`None`: not read yet; holds only go, with their owners' admission, so
/// they are read again after a change), and the deferral a workload got per place among
/// them and whether it may pre-empt.
#[derive(Default)]
struct ShapeApart {
    at: u64,
    holds: Option<HoldsApart>,
    repeats: Vec<(HoldPlace, bool, ReasonId)>,
}

impl CycleMemory {
    /// The state moved (something was admitted, pre-empted for, or let go).
    fn changed(&mut self) {
        self.changes += 1;
        self.victims.clear();
    }

    /// Capacity grew within the cycle (a reservation's own workload was admitted and its
    /// held devices went back): a shape that failed before may fit now.
    fn grew(&mut self) {
        self.changed();
        self.failed.clear();
    }

    /// A shape's failure to find room or victims.
    fn remember(&mut self, shape: Option<(ShapeId, bool)>, reason: ReasonId) {
        self.keep(shape, Failure { at: self.changes, reason, lacks_room: true });
    }

    /// A shape's deferral that holds only while nothing changes: for all of its workloads,
    /// or (`place`) for those that stand at that place among the holds that tell them apart.
    fn remember_repeat(
        &mut self,
        shape: Option<(ShapeId, bool)>,
        reason: ReasonId,
        place: Option<HoldPlace>,
    ) {
        let Some(place) = place else {
            self.keep(shape, Failure { at: self.changes, reason, lacks_room: false });
            return;
        };
        let Some((shape, may_preempt)) = shape else { return };
        self.apart_of(shape).repeats.push((place, may_preempt, reason));
    }

    /// What the cycle knows of the holds that tell `shape`'s workloads apart, as of now.
    fn apart_of(&mut self, shape: ShapeId) -> &mut ShapeApart {
        let at = shape as usize;
        if self.apart.len() <= at {
            self.apart.resize_with(at + 1, ShapeApart::default);
        }
        let apart = &mut self.apart[at];
        if apart.at != self.changes {
            *apart = ShapeApart { at: self.changes, ..ShapeApart::default() };
        }
        apart
    }

    /// The deferral a workload of `shape` (that may pre-empt or not) queued at `key` with max
    /// runtime `max_runtime_ms` got since the last change by its place among the holds.
    fn repeat_at(
        &self,
        (shape, may_preempt): (ShapeId, bool),
        key: QueueKey,
        max_runtime_ms: Option<u64>,
    ) -> Option<ReasonId> {
        let apart = self.apart.get(shape as usize).filter(|a| a.at == self.changes)?;
        if apart.repeats.is_empty() {
            return None;
        }
        let AmongHolds::At(place) = apart.holds.as_ref()?.place(key, max_runtime_ms) else {
            return None;
        };
        apart.repeats.iter().find(|r| r.0 == place && r.1 == may_preempt).map(|r| r.2)
    }

    fn keep(&mut self, shape: Option<(ShapeId, bool)>, failure: Failure) {
        if let Some((shape, may_preempt)) = shape {
            let at = shape as usize;
            if self.failed.len() <= at {
                self.failed.resize(at + 1, [None; 2]);
            }
            self.failed[at][usize::from(may_preempt)] = Some(failure);
        }
    }

    /// The last failure of a shape in this cycle.
    fn failure(&self, (shape, may_preempt): (ShapeId, bool)) -> Option<Failure> {
        self.failed.get(shape as usize).and_then(|f| f[usize::from(may_preempt)])
    }

    /// The deferral remembered for a plain queued workload of `shape` (no idle state: it
    /// may pre-empt) while nothing has changed since.
    fn known(&self, shape: ShapeId) -> Option<ReasonId> {
        self.failure((shape, true)).filter(|f| f.at == self.changes).map(|f| f.reason)
    }

    /// Whether a head of `shape` is within guarantee, if judged since the last change.
    fn within(&self, shape: ShapeId) -> Option<bool> {
        let (at, within) = (*self.within.get(shape as usize)?)?;
        (at == self.changes).then_some(within)
    }

    fn remember_within(&mut self, shape: ShapeId, within: bool) {
        let at = shape as usize;
        if self.within.len() <= at {
            self.within.resize(at + 1, None);
        }
        self.within[at] = Some((self.changes, within));
    }
}

/// A shape's deferral in `CycleMemory`: the count of changes when it was made, and whether
/// the shape lacked room or victims (else it holds only while nothing changes).
#[derive(Clone, Copy)]
struct Failure {
    at: u64,
    reason: ReasonId,
    lacks_room: bool,
}

/// Per project, the next queued workload step 4 serves (`None`: none left).
type Nexts = Vec<Option<(Queued, QueueEntry)>>;

/// Queues a project under its next key, unless it goes first anyway: then it is returned, to
/// be served at once.
fn queue_next(order: &mut BTreeSet<OrderKey>, key: OrderKey) -> Option<OrderKey> {
    if order.first().is_none_or(|first| key < *first) {
        return Some(key);
    }
    order.insert(key);
    None
}

pub(crate) enum Outcome {
    Admitted(Decision),
    Preempting(Vec<Decision>),
    Deferred(DeferReason),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OutcomeKind {
    Admitted,
    Waiting,
    Deferred,
}

impl Engine {
    pub(super) fn admission_steps(
        &mut self,
        now: Timestamp,
        out: &mut Vec<Decision>,
        only: Option<WorkloadId>,
    ) {
        let mut handled = Vec::new();
        self.admission_walk(now, out, only, &mut handled);
        for id in handled {
            self.modify_queued(id, |e| e.handled = false);
        }
    }

    /// `admission_steps`, noting in `handled` the pre-emptors step 3 decided (their queue
    /// entries are marked for step 4 to pass over until the caller unmarks them).
    fn admission_walk(
        &mut self,
        now: Timestamp,
        out: &mut Vec<Decision>,
        only: Option<WorkloadId>,
        handled: &mut Vec<WorkloadId>,
    ) {
        let mut memory = CycleMemory::default();

        // Pre-emptors that did not start, per project: under strict FIFO they are heads that
        // block everyone queued behind them in step 4.
        let mut stuck: BTreeMap<usize, (QueueKey, WorkloadId)> = BTreeMap::new();

        // 3. Pre-emptors: wait while a victim still holds devices; go first once all are gone.
        for id in self.preemptors.clone() {
            let still = self.victims_still_stopping(id);
            let Some(w) = self.workloads.get(&id) else {
                self.end_wait(id);
                continue;
            };
            let (p, key) = (w.project.0 as usize, w.queue_key());
            handled.push(id);
            self.queues[p].modify(&key, |e| e.handled = true);
            let started = if still.is_empty() {
                memory.changed();
                self.end_wait(id);
                self.release_hold(id);
                if let Some(w) = self.workloads.get_mut(&id) {
                    w.waiting_for.clear();
                }
                let shape = self.workloads.get(&id).and_then(|w| self.queued_shape(w));
                self.schedule_one(now, id, shape, &mut memory, out) == OutcomeKind::Admitted
            } else {
                let reason = DeferReason::WaitingForPreemption { victims: still };
                self.report_defer(out, id, reason);
                false
            };
            if !started && stuck.get(&p).is_none_or(|&(k, _)| key < k) {
                stuck.insert(p, (key, id));
            }
            if only == Some(id) {
                return;
            }
        }

        // 4. Projects in fair-share order, one workload at a time, read from the live queues:
        // nothing is queued within a cycle, and what it admits leaves behind its project's
        // place. Per project, the next workload to serve and its key in `order`.
        let mut last_resumes: Vec<WorkloadId> = Vec::new();
        let mut order: BTreeSet<OrderKey> = BTreeSet::new();
        let mut next: Nexts = vec![None; self.queues.len()];
        for (p, slot) in next.iter_mut().enumerate() {
            if let Some(head) = self.queue_after(p, None) {
                *slot = Some(head);
                order.insert(self.memo_order_key(ProjectId(p as u32), head, &mut memory));
            }
        }
        // The project served next when its next workload still goes before every other
        // project's head: taken without a round trip through `order`, the same sequence.
        let mut next_up: Option<OrderKey> = None;
        while let Some((.., project)) = next_up.take().or_else(|| order.pop_first()) {
            let p = project.0 as usize;
            let strict = self.projects[p].queueing == Queueing::StrictFifo;
            let Some((queued, entry)) = next[p].take() else { continue };
            let id = queued.2;
            let stuck_head =
                stuck.get(&p).filter(|&&(k, _)| strict && k < queued).map(|&(_, head)| head);
            // Work that may use reserved devices sees more room than its shape's others.
            let known = if self.reference || !entry.plain || !self.opens(now, id).is_empty() {
                None
            } else {
                Self::known_for(&memory, (queued, entry))
            };
            let head = match (stuck_head, known) {
                // Behind a pre-emptor that has not started: blocked like the rest below.
                (Some(head), _) => head,
                // A plain workload of a shape that failed since the last change: the same
                // deferral, without reading the workload.
                (None, Some(reason)) => {
                    self.report_known(out, p, (queued, entry), reason);
                    if only == Some(id) {
                        return;
                    }
                    id
                }
                (None, None) => {
                    let w = self.workloads.get(&id);
                    // Idle-suspended work past its backoff resumes after everyone else
                    // (below), into room nobody in this cycle took.
                    let resuming = w.is_some_and(|w| {
                        w.idle_suspended_at.is_some() && w.resume_at.is_none_or(|t| t <= now)
                    });
                    let awaiting_use = w.and_then(|w| w.idle_suspended_at.filter(|_| w.probed));
                    // Work waiting out an idle backoff is not a head that blocks its
                    // project: it chose to wait, nobody behind it should. (Scheduling does
                    // not move a backoff: only events do.)
                    let backing_off = w.is_some_and(|w| w.resume_at.is_some_and(|t| t > now));
                    let goes_on = if let Some(since) = awaiting_use {
                        let reason = DeferReason::AwaitingUse { since };
                        self.report_defer(out, id, reason);
                        if only == Some(id) {
                            return;
                        }
                        true
                    } else if resuming {
                        // Decided in step 5, `only` or not.
                        last_resumes.push(id);
                        true
                    } else {
                        let outcome =
                            self.schedule_one(now, id, Some(entry.shape), &mut memory, out);
                        if only == Some(id) {
                            return;
                        }
                        outcome == OutcomeKind::Admitted || backing_off
                    };
                    if goes_on {
                        next_up = self.serve_next(
                            now,
                            (p, queued, only),
                            &mut memory,
                            (&mut next, &mut order),
                        );
                        continue;
                    }
                    id
                }
            };
            if strict {
                // Behind a stuck pre-emptor, the workload served is blocked too.
                let from = if stuck_head.is_some() { Included(queued) } else { Excluded(queued) };
                let behind: Vec<WorkloadId> = self.queues[p]
                    .range((from, Unbounded))
                    .filter(|(_, e)| !e.handled)
                    .map(|(k, _)| k.2)
                    .collect();
                for behind in behind {
                    let reason = DeferReason::BlockedByFifo { head };
                    self.report_defer(out, behind, reason);
                    if only == Some(behind) {
                        return;
                    }
                }
                continue;
            }
            next_up = self.serve_next(now, (p, queued, only), &mut memory, (&mut next, &mut order));
        }

        // 5. Idle-suspended work resumes into what is left, oldest suspension first; it never
        // pre-empts (`try_schedule`).
        last_resumes.sort_by_key(|id| self.workloads.get(id).map(|w| (w.queued_at, *id)));
        for id in last_resumes {
            let shape = self.workloads.get(&id).and_then(|w| self.queued_shape(w));
            self.schedule_one(now, id, shape, &mut memory, out);
            if only == Some(id) {
                return;
            }
        }
    }

    /// The GPU models a workload accepts, in order of preference: its own list, else all.
    pub(crate) fn candidate_models<'a>(&'a self, w: &'a WorkloadState) -> &'a [ModelId] {
        if w.models.is_empty() { &self.all_models } else { &w.models }
    }

    /// Emits a deferral; under `decide_changes`, only if it is not what the queued workload
    /// was last told.
    fn report_defer(&mut self, out: &mut Vec<Decision>, id: WorkloadId, reason: DeferReason) {
        if self.changes_only {
            let number = self.reasons.number(&reason);
            let (reasons, news, clock) = (&self.reasons, &mut self.news, self.clock);
            if let Some(w) = self.workloads.get(&id)
                && self.queues[w.project.0 as usize]
                    .modify(&w.queue_key(), |e| e.report(number, reasons, news, clock))
                    == Some(false)
            {
                return;
            }
        }
        out.push(Decision::Defer { workload: id, reason });
    }

    /// `report_defer` of a remembered deferral for a queued workload of project `p`, from
    /// the cycle's copy of its queue entry (it is deferred once a cycle, so the copy is
    /// current).
    fn report_known(
        &mut self,
        out: &mut Vec<Decision>,
        p: usize,
        (key, entry): (Queued, QueueEntry),
        reason: ReasonId,
    ) {
        if self.changes_only {
            let mut entry = entry;
            if !entry.report(reason, &self.reasons, &mut self.news, self.clock) {
                return;
            }
            self.queues[p].modify(&key, |e| *e = entry);
        }
        out.push(Decision::Defer { workload: key.2, reason: self.reasons.get(reason).clone() });
    }

    /// The deferral the cycle's memory holds for a plain queued workload (no idle state: it
    /// may pre-empt) while nothing has changed: its shape's, or the one that workloads
    /// standing where it stands among the holds that tell them apart got.
    fn known_for(memory: &CycleMemory, (key, entry): (Queued, QueueEntry)) -> Option<ReasonId> {
        memory
            .known(entry.shape)
            .or_else(|| memory.repeat_at((entry.shape, true), key, entry.max_runtime_ms))
    }

    /// Where workload `w` of `shape` stands among the quota holds that tell the shape's
    /// workloads apart (found once per shape while nothing changes).
    fn among_holds(
        &self,
        memory: &mut CycleMemory,
        shape: ShapeId,
        w: &WorkloadState,
    ) -> AmongHolds {
        if self.quota_holds.is_empty() {
            return AmongHolds::Alike;
        }
        let apart = memory.apart_of(shape);
        apart
            .holds
            .get_or_insert_with(|| self.holds_apart(w))
            .place(w.queue_key(), w.spec.max_runtime_ms)
    }

    /// `project_order_key` of a queued head, with whether it is within guarantee taken from
    /// the cycle's memory while nothing has changed (it depends on the head's shape and the
    /// state alone).
    fn memo_order_key(
        &self,
        project: ProjectId,
        (key, entry): (Queued, QueueEntry),
        memory: &mut CycleMemory,
    ) -> OrderKey {
        let within = self.memo_within(memory, (key, entry));
        self.order_key_of(project, key, within)
    }

    /// `head_within_guarantee` of a queued workload, from the cycle's memory of its shape
    /// while nothing has changed (it depends on the shape and the state alone).
    fn memo_within(&self, memory: &mut CycleMemory, (key, entry): (Queued, QueueEntry)) -> bool {
        match memory.within(entry.shape) {
            Some(within) if !self.reference => within,
            _ => {
                let within = self.head_within_guarantee(&self.workloads[&key.2]);
                memory.remember_within(entry.shape, within);
                within
            }
        }
    }

    /// The first workload queued in project `p` after `after` (from its head: `None`), less
    /// the pre-emptors step 3 handled.
    fn queue_after(&self, p: usize, after: Option<Queued>) -> Option<(Queued, QueueEntry)> {
        let from = after.map_or(Unbounded, Excluded);
        self.queues[p].range((from, Unbounded)).find(|(_, e)| !e.handled).map(|(k, e)| (*k, *e))
    }

    /// Moves project `p` on past `served`: finds its next workload and queues the project
    /// under that workload's key, or returns the key when the project goes first anyway
    /// (`queue_next`). On the way it passes over every workload the cycle would serve at
    /// once and tell nothing: not strict FIFO, plain, of a shape that failed since the last
    /// change, with that deferral already told (`QueueEntry::tells`), no reservation to
    /// open, and a key before every other project's (not under `explain`'s `only`). Serving
    /// those changes nothing and says nothing, so passing them over is the same cycle; in a
    /// deep queue they are nearly all. Stretches of them alike (`queue::Run`) are stepped
    /// over whole, and the ones walked entry by entry are filed for the next walks.
    fn serve_next(
        &mut self,
        now: Timestamp,
        at: (usize, Queued, Option<WorkloadId>),
        memory: &mut CycleMemory,
        nexts: (&mut Nexts, &mut BTreeSet<OrderKey>),
    ) -> Option<OrderKey> {
        let mut walked = Vec::new();
        let next = self.walk_to_next(now, at, memory, nexts, &mut walked);
        for (first, run) in walked {
            self.queues[at.0].file_run(first, run);
        }
        next
    }

    /// `serve_next`'s walk, noting in `walked` the runs it passed over entry by entry.
    fn walk_to_next(
        &self,
        now: Timestamp,
        (p, served, only): (usize, Queued, Option<WorkloadId>),
        memory: &mut CycleMemory,
        (next, order): (&mut Nexts, &mut BTreeSet<OrderKey>),
        walked: &mut Vec<(Queued, Run)>,
    ) -> Option<OrderKey> {
        let project = ProjectId(p as u32);
        let passes = self.changes_only
            && !self.reference
            && only.is_none()
            && self.projects[p].queueing != Queueing::StrictFifo;
        let first = order.first().copied();
        let reservations = !self.reserve_held.is_empty();
        // Runs hold where a queued workload is told only a deferral of a new kind (the
        // replay's `Refresh::KINDS_ONLY`), and what is passed over needs no check of its own
        // (no reservation a workload could open). The daemon refreshes figures: a run of
        // its queue would say little, and filing them measured slower.
        let runs = passes
            && !reservations
            && matches!(self.news, Some((refresh, _)) if refresh.per_cycle == 0);
        // The run being walked entry by entry, and its length.
        let mut walking: Option<(Queued, Run, usize)> = None;
        // The filed run the walk is inside, if any: it records no run there.
        let mut inside: Option<Run> = None;
        let file = |walked: &mut Vec<(Queued, Run)>, run: Option<(Queued, Run, usize)>| {
            if let Some((first, run, _)) = run.filter(|(.., len)| *len >= RUN_MIN) {
                walked.push((first, run));
            }
        };
        // The filed run passed over whole just before (merged with those passed right
        // before it): one that follows it at once joins it, if one run can hold both.
        let mut chain: Option<(Queued, Run)> = None;
        // Nothing the walk passes over changes the state: the project's standing, and what
        // the cycle knows of a shape (asked again only when the shape changes), hold.
        let standing = self.standing(p);
        let context = (project, standing, first);
        let queue = &self.queues[p];
        let mut last: Option<(ShapeId, bool, Option<ReasonId>)> = None;
        let mut entries = queue.range((Excluded(served), Unbounded));
        while let Some((k, e)) = entries.next() {
            let before = chain.take();
            if e.handled {
                file(walked, walking.take());
                continue;
            }
            let (within, known) = match last {
                Some((shape, within, known)) if shape == e.shape => (within, known),
                _ => {
                    let within = self.memo_within(memory, (*k, *e));
                    let known = memory.known(e.shape);
                    last = Some((e.shape, within, known));
                    (within, known)
                }
            };
            // Held quota may tell the shape's workloads apart: then each by its own place.
            let known = known.or_else(|| {
                let at = memory.repeat_at((e.shape, true), *k, e.max_runtime_ms);
                at.filter(|_| e.plain)
            });
            let key = order_key(project, standing, *k, within);
            let silent = passes
                && e.plain
                && first.is_none_or(|first| key < first)
                && known.is_some_and(|reason| {
                    e.tells(reason, &self.reasons, &self.news, self.clock) == Telling::Nothing
                })
                && (!reservations || self.opens(now, k.2).is_empty());
            if !silent {
                file(walked, walking.take());
                next[p] = Some((*k, *e));
                return queue_next(order, key);
            }
            let Some(told) = e.reported.filter(|_| runs) else { continue };
            // Inside a filed run, past the entry it stepped to: entry by entry (a shape it
            // could not pass over is often most of it).
            if inside.is_some_and(|run| *k <= run.last) {
                continue;
            }
            inside = None;
            let entry = RunShape { shape: e.shape, told };
            let extended = walking.as_mut().is_some_and(|(_, run, len)| {
                let taken = run.extend(*k, entry, &self.reasons);
                *len += usize::from(taken);
                taken
            });
            if !extended {
                file(walked, walking.take());
                if let Some((first_entry, run)) = queue.run_over(*k) {
                    inside = Some(run);
                    let step = self.run_step(queue, &run, *k, memory, context);
                    if let Some(from) = step {
                        entries = queue.range((from, Unbounded));
                    }
                    if step == Some(Excluded(run.last)) {
                        let joined = before
                            .filter(|_| first_entry == *k)
                            .and_then(|(f, b)| Some((f, b.then(&run, &self.reasons)?)));
                        walked.extend(joined);
                        chain = Some(joined.unwrap_or((first_entry, run)));
                    }
                    continue;
                }
                walking = Some((*k, Run::new(*k, e.shape, told), 1));
            }
        }
        file(walked, walking.take());
        None
    }

    /// Where the walk goes on from `after`, an entry inside `run` it passed over (of
    /// `project`, with `standing`, before the next project's key `first`): past the run
    /// when every shape of it failed since the last change with a deferral that tells its
    /// entries nothing; else to the run's next entry of a shape that did not (`None`: on to
    /// the next entry, when the run's last key is not before `first`). Keys grow along a
    /// shape's entries; a shape not judged within guarantee since the last change counts as
    /// borrowing, the later key.
    fn run_step(
        &self,
        queue: &Queue,
        run: &Run,
        after: Queued,
        memory: &CycleMemory,
        (project, standing, first): (ProjectId, u64, Option<OrderKey>),
    ) -> Option<Bound<Queued>> {
        let mut within = true;
        let mut stop: Option<Queued> = None;
        for s in run.shapes() {
            let passes = memory.known(s.shape).is_some_and(|r| self.reasons.same_kind(s.told, r));
            if passes {
                within &= memory.within(s.shape).unwrap_or(false);
            } else if let Some(next) = queue.next_of_shape(s.shape, after) {
                stop = Some(stop.map_or(next, |stop| stop.min(next)));
            }
        }
        if first.is_some_and(|first| order_key(project, standing, run.last, within) >= first) {
            return None;
        }
        Some(match stop {
            Some(stop) if stop <= run.last => Included(stop),
            _ => Excluded(run.last),
        })
    }

    fn schedule_one(
        &mut self,
        now: Timestamp,
        id: WorkloadId,
        shape: Option<ShapeId>,
        memory: &mut CycleMemory,
        out: &mut Vec<Decision>,
    ) -> OutcomeKind {
        // Reservations it may use are opened while it is scheduled (engine/reserve.rs); its
        // room differs from its shape's, so the cycle's memory is not used for it.
        let opened = self.opens(now, id);
        let shape = if opened.is_empty() { shape } else { None };
        self.open(&opened);
        let outcome = self.try_schedule(now, id, shape, memory);
        if matches!(outcome, Outcome::Admitted(_)) && opened.contains(&id) {
            memory.grew();
        }
        for r in opened {
            self.close(r);
        }
        // A request within its guarantee that finds no quota or room now claims its line:
        // borrowers of other projects wait for it (engine/reserve.rs).
        if let Outcome::Deferred(reason) = &outcome
            && (reason.is_placement()
                || matches!(
                    reason,
                    DeferReason::QuotaExhausted { .. } | DeferReason::HeldForReservation { .. }
                ))
            && let Some(claim) = self.claim_of(id)
        {
            memory.claims.entry(claim).or_insert(id);
        }
        match outcome {
            Outcome::Admitted(d) => {
                memory.changed();
                out.push(d);
                OutcomeKind::Admitted
            }
            Outcome::Preempting(decisions) => {
                memory.changed();
                let victims = decisions.iter().map(Decision::workload).collect();
                out.extend(decisions);
                let reason = DeferReason::WaitingForPreemption { victims };
                self.report_defer(out, id, reason);
                OutcomeKind::Waiting
            }
            Outcome::Deferred(reason) => {
                self.report_defer(out, id, reason);
                OutcomeKind::Deferred
            }
        }
    }

    /// Admit, pre-empt for, or defer one pending workload, against the current state.
    /// `queued_shape` keys the cycle's memory (`None`: the workload is not remembered).
    pub(crate) fn try_schedule(
        &mut self,
        now: Timestamp,
        id: WorkloadId,
        queued_shape: Option<ShapeId>,
        memory: &mut CycleMemory,
    ) -> Outcome {
        let w = &self.workloads[&id];
        if let Some(reason) = self.in_idle_backoff(w, now) {
            return Outcome::Deferred(reason);
        }
        // Idle-suspended work resumes only into free room: it was not using its GPUs.
        let may_preempt = w.idle_suspended_at.is_none();
        let shape_key = queued_shape.map(|s| (s, may_preempt));
        let known_failure = match shape_key.and_then(|k| memory.failure(k)) {
            Some(f) if f.at == memory.changes && !self.reference => {
                return Outcome::Deferred(self.reasons.get(f.reason).clone());
            }
            Some(f) => f.lacks_room,
            None => false,
        };
        if let Some(key) = shape_key
            && !self.reference
            && let Some(reason) = memory.repeat_at(key, w.queue_key(), w.spec.max_runtime_ms)
        {
            return Outcome::Deferred(self.reasons.get(reason).clone());
        }
        let request = Request::of(w);
        let Request { project, shape, members, same_node, total, .. } = request;

        if total == Shares::ZERO {
            if !known_failure
                && let Some(placement) = self.capacity.find(None, shape, members, request.layout())
            {
                self.commit(id, None, placement.clone());
                return Outcome::Admitted(Decision::Admit {
                    workload: id,
                    placement,
                    reason: AdmitReason::NoGpuRequested,
                });
            }
            let reason = self.no_room(None, shape, members, request.layout(), same_node);
            memory.remember(shape_key, self.reasons.number(&reason));
            return Outcome::Deferred(reason);
        }

        // Work that names its models takes the first that fits, in its order of preference;
        // work that accepts any model goes where placement rates best over all of them (within
        // guarantee before borrowing), not to the fleet's first model.
        let weigh_models = w.models.is_empty() && self.capacity.gradient_active();
        let models: Vec<ModelId> = self.candidate_models(w).to_vec();
        let mut best: Option<DeferReason> = None;
        let mut preemptible_models = Vec::new();
        let mut placement_blocked = Vec::new();
        // Some model lacks only room (quota held for another included, which may not pre-empt).
        let mut room_blocked = false;
        // ((within guarantee, placement rank), line, placement) of the best model so far.
        type Candidate = ((bool, (i64, i64)), QuotaKey, Placement);
        let mut best_fit: Option<Candidate> = None;
        for &m in &models {
            match self.check_model_claimed(&request, m, !known_failure, &memory.claims) {
                ModelCheck::Claimed(reason) => {
                    if best.as_ref().is_none_or(|b| rank(&reason) > rank(b)) {
                        best = Some(reason);
                    }
                }
                ModelCheck::Fits(key, placement) => {
                    if !weigh_models {
                        return Outcome::Admitted(self.admit(id, project, key, placement));
                    }
                    let within = self
                        .quota
                        .view(project, key)
                        .is_some_and(|v| v.used.saturating_add(request.total) <= v.guaranteed);
                    let rank = self
                        .capacity
                        .placement_rank(Some(m), request.shape, &placement)
                        .unwrap_or((i64::MIN, i64::MIN));
                    if best_fit.as_ref().is_none_or(|(r, _, _)| (within, rank) > *r) {
                        best_fit = Some(((within, rank), key, placement));
                    }
                }
                ModelCheck::Blocked { reason, preempt_key } => {
                    room_blocked |= reason.is_placement();
                    if let Some(key) = preempt_key {
                        preemptible_models.push((m, key));
                        if reason.is_placement() {
                            placement_blocked.push((m, key));
                        }
                    }
                    if best.as_ref().is_none_or(|b| rank(&reason) > rank(b)) {
                        best = Some(reason);
                    }
                }
            }
        }

        if let Some((_, key, placement)) = best_fit {
            return Outcome::Admitted(self.admit(id, project, key, placement));
        }
        // Room it lacks only because devices are held for a reservation: it waits, and
        // stops nobody for it (engine/reserve.rs).
        // (Checked even for a shape that failed before: the reason must be the one a fresh
        // check gives, as the cycle's memory hands it to the shape's next workloads.)
        if room_blocked && let Some(reason) = self.held_for_reservation(&request, &models) {
            memory.remember(shape_key, self.reasons.number(&reason));
            return Outcome::Deferred(reason);
        }
        // Not a failure of placement, which a later workload of the shape could take for
        // granted (`known_failure`), but the same for every workload of the shape until the
        // state changes (claims only grow within a cycle, the first per line staying), unless
        // held quota lets some of them through by their own queue place or max runtime.
        if let Some(
            reason @ (DeferReason::HeldForClaimant { .. }
            | DeferReason::QuotaHeldForReservation { .. }),
        ) = best
        {
            if let Some((shape, _)) = shape_key {
                let place = match self.among_holds(memory, shape, &self.workloads[&id]) {
                    AmongHolds::Alike => None,
                    AmongHolds::At(place) => Some(place),
                    AmongHolds::Owner => return Outcome::Deferred(reason),
                };
                memory.remember_repeat(shape_key, self.reasons.number(&reason), place);
            }
            return Outcome::Deferred(reason);
        }
        if !known_failure && may_preempt {
            if self.reference {
                memory.victims.clear();
            }
            for (m, key) in preemptible_models {
                let plan = self.plan_preemption_with(now, id, m, key, true, &mut memory.victims);
                if let Some((victims, placement)) = plan {
                    return Outcome::Preempting(self.start_preemption(id, key, victims, placement));
                }
            }
            // Defragmentation: quota allows it, placement does not, the model has the room
            // in total (engine/defrag.rs).
            if let Some(policy) = self.defrag {
                for (m, key) in placement_blocked {
                    if let Some((plan, victims, placement)) =
                        self.plan_defrag(now, id, m, key, policy)
                        && plan.allowed()
                    {
                        return Outcome::Preempting(
                            self.start_preemption(id, key, victims, placement),
                        );
                    }
                }
            }
        }
        let reason = best.unwrap_or(DeferReason::NoQuotaForModel { project });
        memory.remember(shape_key, self.reasons.number(&reason));
        Outcome::Deferred(reason)
    }

    /// Books `placement` for `id` on quota line `key` and says why it is admitted.
    fn admit(
        &mut self,
        id: WorkloadId,
        project: ProjectId,
        key: QuotaKey,
        placement: Placement,
    ) -> Decision {
        let before = self.quota.line(project, key).map_or(Shares::ZERO, |l| l.used);
        self.commit(id, Some(key), placement.clone());
        let (used, guaranteed) = self
            .quota
            .line(project, key)
            .map_or((Shares::ZERO, Shares::ZERO), |l| (l.used, l.guaranteed));
        let reason = if used > guaranteed {
            AdmitReason::Borrowing {
                project,
                key,
                borrowed: used.saturating_sub(guaranteed.max(before)),
                used,
                guaranteed,
            }
        } else {
            AdmitReason::WithinGuarantee { project, key, used, guaranteed }
        };
        Decision::Admit { workload: id, placement, reason }
    }

    /// The checks `decide` and `explain` share: may this request start on model `m` now?
    /// Without `search`, a request that passes quota is reported as not placeable without a
    /// search (the cycle already knows its shape fails).
    pub(crate) fn check_model(&mut self, r: &Request, m: ModelId, search: bool) -> ModelCheck {
        self.check_model_claimed(r, m, search, &BTreeMap::new())
    }

    /// `check_model`, where a request that would borrow on a line a claimant of another
    /// project waits on (`borrow_held_for`, `claims`) is `Claimed` if it fits at all: known
    /// by the indexed feasibility check, without the placement search (while a claim stands
    /// every pending borrower meets it, every cycle).
    fn check_model_claimed(
        &mut self,
        r: &Request,
        m: ModelId,
        search: bool,
        claims: &BTreeMap<(usize, QuotaKey), WorkloadId>,
    ) -> ModelCheck {
        let project = r.project;
        let Some(key) = self.quota.resolve(project, QuotaKey::Model(m)) else {
            return ModelCheck::blocked(DeferReason::NoQuotaForModel { project });
        };
        let Some(view) = self.quota.view(project, key) else {
            return ModelCheck::blocked(DeferReason::NoQuotaForModel { project });
        };
        if r.total > view.max {
            return ModelCheck::blocked(DeferReason::ExceedsMaxQuota {
                project,
                key,
                requested: r.total,
                max: view.max,
            });
        }
        if let GpuRequest::Mig(profile) = r.shape.gpus
            && !self.capacity.offers_mig(m, profile)
        {
            return ModelCheck::blocked(DeferReason::NoMigProfile { model: m, profile });
        }
        if let Some(why) = self.never_fits(m, r.shape, r.members, r.same_node) {
            return ModelCheck::blocked(DeferReason::NeverPlaceable {
                model: Some(m),
                members: r.members,
                per_member: r.shape.gpus.shares(),
                same_node: r.same_node,
                host: match why {
                    NeverFits::Host(shortfall) => Some(shortfall),
                    NeverFits::Gpus => None,
                },
            });
        }
        // Quota a waiting pre-emptor of this project reclaimed (its victims are stopping) is
        // not for work it outranks: else that work takes the quota the victims free, the
        // pre-emptor reclaims again, and the two take turns for ever. Work of equal priority
        // competes in queue order as ever (holding against it multiplied pre-emptions).
        let held = self.reserved_against(r, key).min(view.available);
        let available = view.available.saturating_sub(held);
        if r.total > available {
            // Blocked only by what waiting pre-emptors hold: it waits for them and reclaims
            // nothing for itself (its own pre-emptions would stop more work for quota that is
            // being freed already — at 3× the Philly trace's load, 14× the pre-emptions).
            let only_held = r.total <= view.available;
            return ModelCheck::Blocked {
                reason: DeferReason::QuotaExhausted {
                    project,
                    key,
                    requested: r.total,
                    used: view.used,
                    guaranteed: view.guaranteed,
                    available,
                    borrow_limited: view.borrow_limited,
                    held_for_preemptors: held,
                },
                preempt_key: (!only_held).then_some(key),
            };
        }
        // Quota held for a request pending longer (engine/reserve.rs), or a line a claimant
        // waits on. Checked only where the shape is not known to fail, so that a shape's
        // remembered failure stays the reason every later workload of it gets.
        let claimed = if search {
            self.quota_held_for(r, key).or_else(|| self.borrow_held_for(r, key, claims))
        } else {
            None
        };
        if let Some(reason) = claimed {
            if self.capacity.can_place(Some(m), r.shape, r.members, r.layout()) {
                return ModelCheck::Claimed(reason);
            }
            // Without room it still stops nobody for quota held for another.
            if matches!(reason, DeferReason::QuotaHeldForReservation { .. }) {
                return ModelCheck::Blocked {
                    reason: self.no_room(Some(m), r.shape, r.members, r.layout(), r.same_node),
                    preempt_key: None,
                };
            }
        } else if search
            && let Some(placement) = self.capacity.find(Some(m), r.shape, r.members, r.layout())
        {
            return ModelCheck::Fits(key, placement);
        }
        ModelCheck::Blocked {
            reason: self.no_room(Some(m), r.shape, r.members, r.layout(), r.same_node),
            preempt_key: Some(key),
        }
    }

    /// The quota of `r`'s project line `key` held for its waiting pre-emptors that outrank
    /// `r`.
    fn reserved_against(&self, r: &Request, key: QuotaKey) -> Shares {
        if self.reserved_by_line.get(&(r.project, key)).is_none_or(|s| *s == Shares::ZERO) {
            return Shares::ZERO;
        }
        self.reservations
            .iter()
            .filter(|&(id, &(p, k, _))| *id != r.id && p == r.project && k == key)
            .filter(|(id, _)| self.workloads.get(id).is_some_and(|w| w.priority > r.priority))
            .fold(Shares::ZERO, |sum, (_, &(_, _, s))| sum.saturating_add(s))
    }

    /// Why a request that passed quota finds no room: `NoPlacement` with the free capacity,
    /// or `NodesUnavailable` naming the unavailable nodes a placement would use if they were
    /// usable (a what-if search, made only while some node is unavailable).
    fn no_room(
        &mut self,
        model: Option<ModelId>,
        shape: MemberShape,
        members: u32,
        layout: Layout,
        same_node: bool,
    ) -> DeferReason {
        let facts = self.facts(model, shape, members, same_node);
        if self.unavailable.is_empty() {
            return DeferReason::NoPlacement(facts);
        }
        let down: Vec<NodeId> = self.unavailable.keys().copied().collect();
        let found =
            self.capacity.with_nodes_usable(&down, |cap| cap.find(model, shape, members, layout));
        let needed: BTreeSet<NodeId> =
            found.iter().flat_map(|p| p.members.iter().map(|m| m.node)).collect();
        let nodes: Vec<(NodeId, String)> = needed
            .into_iter()
            .filter_map(|n| self.unavailable.get(&n).map(|reason| (n, reason.clone())))
            .collect();
        if nodes.is_empty() {
            DeferReason::NoPlacement(facts)
        } else {
            DeferReason::NodesUnavailable { facts, nodes }
        }
    }

    pub(super) fn ever_placeable(
        &self,
        m: ModelId,
        shape: MemberShape,
        members: u32,
        same_node: bool,
    ) -> bool {
        self.never_fits(m, shape, members, same_node).is_none()
    }

    /// Why a request can never be placed on model `m`, whatever frees: `None` when some
    /// node of the model could hold it.
    fn never_fits(
        &self,
        m: ModelId,
        shape: MemberShape,
        members: u32,
        same_node: bool,
    ) -> Option<NeverFits> {
        // Host first: a member (the whole gang on one node) asking more CPU or memory than
        // any node of the model has waits for ever, and must not claim quota meanwhile.
        let (cpu, mem) =
            self.capacity.max_host_per_node.get(m.0 as usize).copied().unwrap_or((0, 0));
        let on_one = if same_node { u64::from(members) } else { 1 };
        let (asked_cpu, asked_mem) =
            (shape.cpu.saturating_mul(on_one), shape.mem.saturating_mul(on_one));
        if asked_cpu > cpu {
            return Some(NeverFits::Host(HostShortfall::Cpu { asked: asked_cpu, largest: cpu }));
        }
        if asked_mem > mem {
            return Some(NeverFits::Host(HostShortfall::Memory { asked: asked_mem, largest: mem }));
        }
        let per_node = self.capacity.max_devices_per_node.get(m.0 as usize).copied().unwrap_or(0);
        let gpus_fit = match shape.gpus {
            GpuRequest::Whole(k) if same_node => k.saturating_mul(members) <= per_node,
            GpuRequest::Whole(k) => k <= per_node,
            GpuRequest::Shares(s) if same_node => {
                u64::from(s) * u64::from(members) <= u64::from(per_node) * SHARES_PER_GPU
            }
            GpuRequest::Shares(_) => per_node > 0,
            GpuRequest::Mig(profile) => {
                self.capacity.mig_ever_placeable(m, profile, members, same_node)
            }
        };
        if !gpus_fit {
            return Some(NeverFits::Gpus);
        }
        // The GPUs and the host resources must be on the same nodes: the node with the most
        // GPUs need not be the one with the most CPU; and a gang spread over nodes needs
        // enough nodes with room for its members, GPUs first. (Read only for gangs and for
        // requests that ask host resources: the common request skips the walk.)
        let host = shape.cpu > 0 || shape.mem > 0;
        let one = u64::from(members);
        let fits = |cpu: u64, mem: u64| match shape.gpus {
            GpuRequest::Whole(k) if same_node => self.capacity.spread_ever_fits(
                m,
                k.saturating_mul(members),
                cpu.saturating_mul(one),
                mem.saturating_mul(one),
                1,
            ),
            GpuRequest::Whole(k) => self.capacity.spread_ever_fits(m, k, cpu, mem, members),
            GpuRequest::Shares(_) => self.capacity.spread_ever_fits(m, 1, cpu, mem, 1),
            GpuRequest::Mig(_) => true,
        };
        let walk = match shape.gpus {
            GpuRequest::Whole(_) => host || (members > 1 && !same_node),
            GpuRequest::Shares(_) => host && members == 1,
            GpuRequest::Mig(_) => false,
        };
        if walk && !fits(shape.cpu, shape.mem) {
            return Some(if host && fits(0, 0) {
                NeverFits::Host(HostShortfall::Spread)
            } else {
                NeverFits::Gpus
            });
        }
        None
    }

    pub(crate) fn facts(
        &self,
        model: Option<ModelId>,
        shape: MemberShape,
        members: u32,
        same_node: bool,
    ) -> PlacementFacts {
        let (block, block_node) = model
            .and_then(|m| self.capacity.largest_block(m))
            .map_or((0, None), |(n, node)| (n, Some(node)));
        let m = model.map(|m| m.0 as usize);
        PlacementFacts {
            model,
            members,
            per_member: shape.gpus.shares(),
            same_node,
            largest_free_block: block,
            largest_free_block_node: block_node.filter(|_| block > 0),
            free_whole_gpus: m.and_then(|m| self.capacity.free_whole.get(m).copied()).unwrap_or(0),
            free_shares: Shares(
                m.and_then(|m| self.capacity.free_shares.get(m).copied()).unwrap_or(0),
            ),
            nodes_with_free: model.map_or(0, |m| self.capacity.nodes_with_free(m)),
            largest_device_free: Shares(u64::from(
                model.map_or(0, |m| self.capacity.largest_share_gap(m)),
            )),
            mig: match shape.gpus {
                GpuRequest::Mig(profile) => Some(profile),
                _ => None,
            },
        }
    }
}

/// One pending request, as the checks see it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request {
    pub id: WorkloadId,
    pub priority: i32,
    pub project: ProjectId,
    pub shape: MemberShape,
    pub members: u32,
    pub same_node: bool,
    pub prefer_same_node: bool,
    pub total: Shares,
    /// Its place in its project's queue.
    pub queue_key: QueueKey,
    pub max_runtime_ms: Option<u64>,
}

impl Request {
    pub(crate) fn of(w: &WorkloadState) -> Request {
        Request {
            id: w.spec.id,
            priority: w.priority,
            project: w.project,
            shape: w.shape(),
            members: w.spec.members,
            same_node: w.spec.same_node,
            prefer_same_node: w.spec.prefer_same_node,
            total: w.spec.total_shares(),
            queue_key: w.queue_key(),
            max_runtime_ms: w.spec.max_runtime_ms,
        }
    }

    pub(crate) fn layout(&self) -> Layout {
        Layout::of(self.same_node, self.prefer_same_node)
    }
}

pub(crate) enum ModelCheck {
    Fits(QuotaKey, Placement),
    /// It fits, but it would borrow on a line a claimant waits on: the deferral it gets.
    Claimed(DeferReason),
    /// With `preempt_key`, removing victims charged to that line could help.
    Blocked {
        reason: DeferReason,
        preempt_key: Option<QuotaKey>,
    },
}

impl ModelCheck {
    fn blocked(reason: DeferReason) -> ModelCheck {
        ModelCheck::Blocked { reason, preempt_key: None }
    }
}

/// How close a deferral came to starting; the closest reason across models is reported.
fn rank(reason: &DeferReason) -> u8 {
    match reason {
        DeferReason::NoQuotaForModel { .. } => 0,
        DeferReason::NeverPlaceable { .. } | DeferReason::NoMigProfile { .. } => 1,
        DeferReason::ExceedsMaxQuota { .. } => 2,
        DeferReason::QuotaExhausted { .. } => 3,
        DeferReason::NoPlacement(_) | DeferReason::NodesUnavailable { .. } => 4,
        DeferReason::BlockedByFifo { .. }
        | DeferReason::WaitingForPreemption { .. }
        | DeferReason::IdleBackoff { .. }
        | DeferReason::AwaitingUse { .. }
        | DeferReason::HeldForReservation { .. }
        | DeferReason::HeldForClaimant { .. }
        | DeferReason::QuotaHeldForReservation { .. } => 5,
    }
}

/// Why a request never fits its model: a host resource of every node is too small, or its
/// GPUs are more than any node has.
enum NeverFits {
    Host(HostShortfall),
    Gpus,
}
