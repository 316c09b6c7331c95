//! The goodput ledger: a pure fold over the engine's events and decisions (PRODUCT.md §1,
//! "an honest ledger of allocated vs active vs useful GPU-hours").
//!
//! Feed it what the engine was told and what it decided, in order, with their times
//! ([`Ledger::event`], [`Ledger::decision`]), and, for the cluster-wide books, snapshots of the
//! cluster ([`Ledger::cluster`], from `Engine::cluster_snapshot`). It keeps, per workload, user,
//! project and cluster, and per period (`period_ms`, e.g. a day):
//!
//! - **allocated**: shares held × time, from the `Admit` until the devices are free again
//!   (`WorkloadStopped`/`WorkloadFinished`/`AllocationFailed`); fractional GPUs by share;
//! - **active**: allocated × the activity of the latest sample (`ActivitySampled`, the busiest
//!   member, permille of the share held; piecewise constant until the next sample); time
//!   without a sample (start-up, telemetry gaps) counts as not active;
//! - **measured**: the part of allocated that telemetry covered (a sample with a signal);
//!   allocated − measured is time nobody measured, which is not evidence of idleness;
//! - **idle-allocated** = allocated − active (of which measured − active was seen idle);
//! - **lost to pre-emption**: at a stop after `Preempt`/`Reclaim`, the allocated time since the
//!   last checkpoint of this run (the whole run when there is none, or for `requeue`/`delete`),
//!   and the active part of it, which is no longer useful;
//! - **checkpoint overhead**: allocated time between a pre-emption that asked for a checkpoint
//!   and the stop (the grace);
//! - **useful** = active − the active part of what was lost; **goodput** = useful / allocated;
//! - **queue delay** (submit or requeue → admit) and **startup delay** (admit → started), in
//!   ms, with the number of admissions and starts they are summed over.
//!
//! Cluster-wide, from snapshots (piecewise constant until the next): capacity, allocated, free
//! and fragmented (free, but no pending request could use it) — so allocated + free =
//! capacity × time exactly — and unmanaged: GPUs held by work allot does not govern (outside
//! capacity, like a down node's). Amounts are share-milliseconds (1000 shares × 3,600,000 ms = one
//! GPU-hour) in `u128`: exact, no float until [`Books::gpu_hours`].

use std::collections::BTreeMap;

use crate::codec::Codec;
use crate::decision::Decision;
use crate::event::Event;
use crate::idle::DeviceReading;
use crate::ids::{SHARES_PER_GPU, Timestamp, WorkloadId};
use crate::model::PreemptionMode;

/// One GPU-hour in share-milliseconds.
pub const SHARE_MS_PER_GPU_HOUR: u128 = SHARES_PER_GPU as u128 * 3_600_000;

/// Who a row of the ledger is about.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    Cluster,
    Project(String),
    User(String),
    Workload(WorkloadId),
}

/// The books of one scope in one period. GPU amounts in share-ms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Books {
    pub allocated: u128,
    pub active: u128,
    /// The part of `allocated` telemetry covered.
    pub measured: u128,
    pub lost_to_preemption: u128,
    /// The active part of `lost_to_preemption`.
    pub lost_active: u128,
    pub checkpoint_overhead: u128,
    pub queue_delay_ms: u128,
    pub admissions: u64,
    pub startup_delay_ms: u128,
    pub starts: u64,
    pub preemptions: u64,
    /// Cluster rows only: capacity, free and fragmented (free but unusable by the pending
    /// demand) capacity.
    pub capacity: u128,
    pub free: u128,
    pub fragmented: u128,
    /// Cluster rows only: shares held by work allot does not govern (not in `capacity`).
    pub unmanaged: u128,
}

impl Books {
    pub fn idle_allocated(&self) -> u128 {
        self.allocated.saturating_sub(self.active)
    }
    /// Allocated time telemetry saw idle (measured, not active).
    pub fn measured_idle(&self) -> u128 {
        self.measured.saturating_sub(self.active)
    }
    pub fn useful(&self) -> u128 {
        self.active.saturating_sub(self.lost_active)
    }
    /// Useful / allocated; 0 with nothing allocated.
    pub fn goodput(&self) -> f64 {
        if self.allocated == 0 { 0.0 } else { self.useful() as f64 / self.allocated as f64 }
    }
    /// Share-ms as GPU-hours.
    pub fn gpu_hours(share_ms: u128) -> f64 {
        share_ms as f64 / SHARE_MS_PER_GPU_HOUR as f64
    }
    fn add(&mut self, other: &Books) {
        self.allocated += other.allocated;
        self.active += other.active;
        self.measured += other.measured;
        self.lost_to_preemption += other.lost_to_preemption;
        self.lost_active += other.lost_active;
        self.checkpoint_overhead += other.checkpoint_overhead;
        self.queue_delay_ms += other.queue_delay_ms;
        self.admissions += other.admissions;
        self.startup_delay_ms += other.startup_delay_ms;
        self.starts += other.starts;
        self.preemptions += other.preemptions;
        self.capacity += other.capacity;
        self.free += other.free;
        self.fragmented += other.fragmented;
        self.unmanaged += other.unmanaged;
    }
}

/// The cluster at one time, as the ledger needs it (`Engine::cluster_snapshot`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterSnapshot {
    pub capacity_shares: u64,
    pub allocated_shares: u64,
    pub free_shares: u64,
    /// Free shares that no pending request could use now.
    pub fragmented_shares: u64,
    /// Shares held by work allot does not govern (`Event::DevicesOccupied`), outside
    /// `capacity_shares`.
    pub unmanaged_shares: u64,
}

/// What the ledger remembers of one workload.
#[derive(Clone, Debug, Default)]
struct Tracked {
    project: String,
    user: String,
    /// Submitted or requeued and not yet admitted: since then.
    queued_since: Option<Timestamp>,
    /// Holding devices: the shares and since when (the last time its books were brought up
    /// to date).
    shares: u64,
    held_since: Option<Timestamp>,
    admitted_at: Option<Timestamp>,
    started_at: Option<Timestamp>,
    /// Activity (permille of the share) of the latest sample of this run.
    activity: Option<u16>,
    last_checkpoint: Option<Timestamp>,
    /// Allocated and active share-ms of this run since its last checkpoint (or its start).
    since_checkpoint: (u128, u128),
    /// The same since the run's admission (what `requeue`/`delete` lose).
    this_run: (u128, u128),
    /// Told to stop by a pre-emption: its mode and, if it was asked for a checkpoint, since
    /// when the grace runs.
    preempted: Option<(PreemptionMode, Option<Timestamp>)>,
    /// Books of one period not yet added to the rows (a sample then costs no row lookups):
    /// flushed when the period changes, at a release and at `close`.
    open: Option<(u64, Books)>,
}

/// The ledger. See the module docs.
#[derive(Clone, Debug)]
pub struct Ledger {
    period_ms: u64,
    workloads: BTreeMap<WorkloadId, Tracked>,
    rows: BTreeMap<(Scope, u64), Books>,
    cluster: Option<(Timestamp, ClusterSnapshot)>,
}

impl Ledger {
    /// A ledger with periods of `period_ms` (at least 1 ms) from time 0.
    pub fn new(period_ms: u64) -> Ledger {
        Ledger {
            period_ms: period_ms.max(1),
            workloads: BTreeMap::new(),
            rows: BTreeMap::new(),
            cluster: None,
        }
    }

    /// Every row: (scope, period index) → books. Period `p` covers `[p × period, (p+1) × period)`.
    /// Complete after [`Ledger::close`] (books of a running period are kept per workload until
    /// then).
    pub fn rows(&self) -> &BTreeMap<(Scope, u64), Books> {
        &self.rows
    }

    /// One scope's books summed over every period.
    pub fn total(&self, scope: &Scope) -> Books {
        let mut sum = Books::default();
        for ((s, _), b) in self.rows.range((scope.clone(), 0)..) {
            if s != scope {
                break;
            }
            sum.add(b);
        }
        sum
    }

    /// The scopes of one kind that have rows, e.g. every project.
    pub fn scopes(&self) -> Vec<Scope> {
        let mut out: Vec<Scope> = Vec::new();
        for (s, _) in self.rows.keys() {
            if out.last() != Some(s) {
                out.push(s.clone());
            }
        }
        out
    }

    /// Adds the workload's open books to its rows (cluster, project, user, workload).
    fn flush(&mut self, id: WorkloadId) {
        let Some(t) = self.workloads.get_mut(&id) else { return };
        let Some((period, books)) = t.open.take() else { return };
        let scopes = [
            Scope::Cluster,
            Scope::Project(t.project.clone()),
            Scope::User(t.user.clone()),
            Scope::Workload(id),
        ];
        for scope in scopes {
            self.rows.entry((scope, period)).or_default().add(&books);
        }
    }

    /// The workload's open books for `period`, flushing another period's first.
    fn open_books(&mut self, id: WorkloadId, period: u64) -> Option<&mut Books> {
        if self.workloads.get(&id)?.open.as_ref().is_some_and(|(p, _)| *p != period) {
            self.flush(id);
        }
        let t = self.workloads.get_mut(&id)?;
        Some(&mut t.open.get_or_insert((period, Books::default())).1)
    }

    /// Adds `amount(len)` through `apply` for the span `[from, to)` split by period.
    fn book_span(
        &mut self,
        id: WorkloadId,
        from: Timestamp,
        to: Timestamp,
        apply: impl Fn(&mut Books, u128),
        amount: impl Fn(u64) -> u128,
    ) {
        let mut at = from.0;
        while at < to.0 {
            let period = at / self.period_ms;
            let end = ((period + 1).saturating_mul(self.period_ms)).min(to.0);
            let piece = amount(end - at);
            if let Some(b) = self.open_books(id, period) {
                apply(b, piece);
            }
            at = end;
        }
    }

    /// Adds a count or delay at one instant to the workload's books.
    fn book_at(&mut self, id: WorkloadId, at: Timestamp, apply: impl Fn(&mut Books)) {
        let period = at.0 / self.period_ms;
        if let Some(b) = self.open_books(id, period) {
            apply(b);
        }
    }

    /// Brings a holding workload's books up to `now`.
    fn catch_up(&mut self, id: WorkloadId, now: Timestamp) {
        let Some(t) = self.workloads.get(&id) else { return };
        let Some(since) = t.held_since.filter(|&s| s < now) else { return };
        let (shares, activity) = (u128::from(t.shares), t.activity.map_or(0, u128::from));
        let measured = u128::from(t.activity.is_some());
        let grace_from = t.preempted.and_then(|(_, g)| g);
        self.book_span(id, since, now, |b, v| b.allocated += v, |len| shares * u128::from(len));
        self.book_span(
            id,
            since,
            now,
            |b, v| b.active += v,
            |len| shares * u128::from(len) * activity / 1000,
        );
        if measured > 0 {
            self.book_span(id, since, now, |b, v| b.measured += v, |len| shares * u128::from(len));
        }
        if let Some(g) = grace_from {
            let from = g.max(since);
            self.book_span(
                id,
                from,
                now,
                |b, v| b.checkpoint_overhead += v,
                |len| shares * u128::from(len),
            );
        }
        let len = u128::from(now.since(since));
        if let Some(t) = self.workloads.get_mut(&id) {
            let (alloc, act) = (shares * len, shares * len * activity / 1000);
            t.since_checkpoint.0 += alloc;
            t.since_checkpoint.1 += act;
            t.this_run.0 += alloc;
            t.this_run.1 += act;
            t.held_since = Some(now);
        }
    }

    /// The devices are free again: close the run; book what a pre-emption lost.
    fn release(&mut self, id: WorkloadId, now: Timestamp, requeued: bool) {
        self.catch_up(id, now);
        let Some(t) = self.workloads.get_mut(&id) else { return };
        let preempted = t.preempted.take();
        let lost = match preempted {
            Some((PreemptionMode::Suspend, _)) => Some(t.since_checkpoint),
            Some((_, _)) => Some(t.this_run),
            None => None,
        };
        t.held_since = None;
        t.admitted_at = None;
        t.started_at = None;
        t.activity = None;
        t.since_checkpoint = (0, 0);
        t.this_run = (0, 0);
        t.queued_since = requeued.then_some(now);
        if let Some((alloc, act)) = lost {
            self.book_at(id, now, |b| {
                b.lost_to_preemption += alloc;
                b.lost_active += act;
                b.preemptions += 1;
            });
        }
        self.flush(id);
    }

    /// Folds one event the engine was told at `now`.
    pub fn event(&mut self, now: Timestamp, event: &Event) {
        match event {
            Event::WorkloadSubmitted(spec) => {
                self.workloads.entry(spec.id).or_insert_with(|| Tracked {
                    project: spec.project.clone(),
                    user: spec.user.clone(),
                    queued_since: Some(now),
                    ..Tracked::default()
                });
            }
            Event::AllocationStarted { workload } => {
                let Some(t) = self.workloads.get_mut(workload) else { return };
                if t.held_since.is_none() || t.started_at.is_some() {
                    return;
                }
                t.started_at = Some(now);
                let delay = t.admitted_at.map_or(0, |a| u128::from(now.since(a)));
                self.book_at(*workload, now, |b| {
                    b.startup_delay_ms += delay;
                    b.starts += 1;
                });
            }
            Event::AllocationFailed { workload, .. } => {
                if self.workloads.get(workload).is_some_and(|t| t.held_since.is_some()) {
                    self.release(*workload, now, true);
                }
            }
            Event::CheckpointSaved { workload } => {
                self.catch_up(*workload, now);
                if let Some(t) = self.workloads.get_mut(workload) {
                    t.last_checkpoint = Some(now);
                    t.since_checkpoint = (0, 0);
                }
            }
            Event::WorkloadStopped { workload } => {
                let Some(t) = self.workloads.get(workload) else { return };
                if t.held_since.is_none() {
                    return;
                }
                let requeued = matches!(
                    t.preempted,
                    Some((PreemptionMode::Suspend | PreemptionMode::Requeue, _))
                );
                self.release(*workload, now, requeued);
            }
            Event::WorkloadFinished { workload } => {
                if self.workloads.get(workload).is_some_and(|t| t.held_since.is_some()) {
                    self.release(*workload, now, false);
                }
            }
            Event::WorkloadCancelled { workload } => {
                if let Some(t) = self.workloads.get_mut(workload)
                    && t.held_since.is_none()
                {
                    t.queued_since = None;
                }
            }
            Event::ActivitySampled { workload, readings } => {
                self.catch_up(*workload, now);
                if let Some(t) = self.workloads.get_mut(workload)
                    && t.held_since.is_some()
                {
                    t.activity = busiest_member(readings);
                }
            }
            Event::ActivityProbed { .. } => {}
            // The cluster's books follow from the next `Engine::cluster_snapshot` (an
            // unavailable node's unused capacity is neither capacity nor free; an occupied
            // device's is unmanaged).
            Event::NodeUnavailable { .. }
            | Event::NodeAvailable { .. }
            | Event::DevicesOccupied { .. } => {}
            // Work found running outside allot: held from now (its time before is not ours
            // to book). The caller folds it only once the engine took it.
            Event::WorkloadAdopted { spec, placement } => {
                let shares: u64 = placement
                    .members
                    .iter()
                    .flat_map(|m| m.devices.iter())
                    .map(|d| u64::from(d.shares))
                    .sum();
                self.workloads.entry(spec.id).or_insert_with(|| Tracked {
                    project: spec.project.clone(),
                    user: spec.user.clone(),
                    shares,
                    held_since: Some(now),
                    admitted_at: Some(now),
                    started_at: Some(now),
                    ..Tracked::default()
                });
                self.book_at(spec.id, now, |b| {
                    b.admissions += 1;
                    b.starts += 1;
                });
            }
        }
    }

    /// Folds one decision the engine made at `now`.
    pub fn decision(&mut self, now: Timestamp, decision: &Decision) {
        match decision {
            Decision::Admit { workload, placement, .. } => {
                let shares: u64 = placement
                    .members
                    .iter()
                    .flat_map(|m| m.devices.iter())
                    .map(|d| u64::from(d.shares))
                    .sum();
                let Some(t) = self.workloads.get_mut(workload) else { return };
                if t.held_since.is_some() {
                    return;
                }
                let delay = t.queued_since.map_or(0, |q| u128::from(now.since(q)));
                t.queued_since = None;
                t.shares = shares;
                t.held_since = Some(now);
                t.admitted_at = Some(now);
                t.last_checkpoint = None;
                self.book_at(*workload, now, |b| {
                    b.queue_delay_ms += delay;
                    b.admissions += 1;
                });
            }
            Decision::Preempt { victim: workload, mode, checkpoint_grace_ms, .. }
            | Decision::Reclaim { workload, mode, checkpoint_grace_ms, .. } => {
                self.catch_up(*workload, now);
                if let Some(t) = self.workloads.get_mut(workload)
                    && t.held_since.is_some()
                {
                    t.preempted = Some((*mode, checkpoint_grace_ms.map(|_| now)));
                }
            }
            Decision::Reject { workload, .. } => {
                self.flush(*workload);
                self.workloads.remove(workload);
            }
            Decision::Stop { .. } | Decision::Defer { .. } | Decision::Warn { .. } => {}
        }
    }

    /// Folds a snapshot of the cluster at `now`: the previous one's state is booked up to now.
    pub fn cluster(&mut self, now: Timestamp, snapshot: ClusterSnapshot) {
        if let Some((since, prev)) = self.cluster.take()
            && since < now
        {
            let mut at = since.0;
            while at < now.0 {
                let period = at / self.period_ms;
                let end = ((period + 1).saturating_mul(self.period_ms)).min(now.0);
                let len = u128::from(end - at);
                let b = self.rows.entry((Scope::Cluster, period)).or_default();
                b.capacity += u128::from(prev.capacity_shares) * len;
                b.free += u128::from(prev.free_shares) * len;
                b.fragmented += u128::from(prev.fragmented_shares) * len;
                b.unmanaged += u128::from(prev.unmanaged_shares) * len;
                at = end;
            }
        }
        self.cluster = Some((now, snapshot));
    }

    /// Brings every open span (holding workloads, the cluster snapshot) up to `now`, so that
    /// the books cover `[start, now)`.
    pub fn close(&mut self, now: Timestamp) {
        let holding: Vec<WorkloadId> = self
            .workloads
            .iter()
            .filter(|(_, t)| t.held_since.is_some())
            .map(|(&id, _)| id)
            .collect();
        for id in holding {
            self.catch_up(id, now);
        }
        let ids: Vec<WorkloadId> = self.workloads.keys().copied().collect();
        for id in ids {
            self.flush(id);
        }
        if let Some((_, snapshot)) = self.cluster {
            self.cluster(now, snapshot);
        }
    }
}

/// A sample's activity as the ledger books it: per member the share-weighted mean of its
/// devices' best signal, normalised by the share held; the busiest member counts (as the idle
/// evaluation's `Allot` model). `None` when no device reported anything.
fn busiest_member(readings: &[DeviceReading]) -> Option<u16> {
    let mut members: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for d in readings {
        let Some((_, raw)) = d.best_signal() else { continue };
        let shares = u64::from(d.shares.clamp(1, SHARES_PER_GPU as u32));
        let value = (u64::from(raw) * SHARES_PER_GPU / shares).min(1000);
        let e = members.entry(d.member).or_default();
        e.0 += value * shares;
        e.1 += shares;
    }
    members.values().map(|&(sum, w)| (sum / w.max(1)) as u16).max()
}

// Snapshot encoding (`codec.rs`). The unmanaged amounts came later: they are written after
// the rest of the ledger (`Ledger`'s codec below), so that a state written before reads back
// with none.
impl crate::codec::Codec for Books {
    fn encode(&self, out: &mut Vec<u8>) {
        (self.allocated, self.active, self.measured, self.lost_to_preemption).encode(out);
        (self.lost_active, self.checkpoint_overhead, self.queue_delay_ms).encode(out);
        (self.admissions, self.startup_delay_ms, self.starts, self.preemptions).encode(out);
        (self.capacity, self.free, self.fragmented).encode(out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, crate::codec::CodecError> {
        let (allocated, active, measured, lost_to_preemption) = Codec::decode(input)?;
        let (lost_active, checkpoint_overhead, queue_delay_ms) = Codec::decode(input)?;
        let (admissions, startup_delay_ms, starts, preemptions) = Codec::decode(input)?;
        let (capacity, free, fragmented) = Codec::decode(input)?;
        Ok(Books {
            allocated,
            active,
            measured,
            lost_to_preemption,
            lost_active,
            checkpoint_overhead,
            queue_delay_ms,
            admissions,
            startup_delay_ms,
            starts,
            preemptions,
            capacity,
            free,
            fragmented,
            unmanaged: 0,
        })
    }
}
impl crate::codec::Codec for ClusterSnapshot {
    fn encode(&self, out: &mut Vec<u8>) {
        (self.capacity_shares, self.allocated_shares, self.free_shares, self.fragmented_shares)
            .encode(out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, crate::codec::CodecError> {
        let (capacity_shares, allocated_shares, free_shares, fragmented_shares) =
            Codec::decode(input)?;
        Ok(ClusterSnapshot {
            capacity_shares,
            allocated_shares,
            free_shares,
            fragmented_shares,
            unmanaged_shares: 0,
        })
    }
}
crate::codec::codec_struct!(Tracked {
    project,
    user,
    queued_since,
    shares,
    held_since,
    admitted_at,
    started_at,
    activity,
    last_checkpoint,
    since_checkpoint,
    this_run,
    preempted,
    open,
});
impl crate::codec::Codec for Ledger {
    fn encode(&self, out: &mut Vec<u8>) {
        self.period_ms.encode(out);
        self.workloads.encode(out);
        self.rows.encode(out);
        self.cluster.encode(out);
        // The unmanaged amounts: per cluster period, and the last snapshot's.
        let unmanaged: BTreeMap<u64, u128> = self
            .rows
            .iter()
            .filter(|((scope, _), b)| *scope == Scope::Cluster && b.unmanaged > 0)
            .map(|((_, period), b)| (*period, b.unmanaged))
            .collect();
        (unmanaged, self.cluster.map_or(0, |(_, c)| c.unmanaged_shares)).encode(out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, crate::codec::CodecError> {
        let (period_ms, workloads, rows, cluster) = Codec::decode(input)?;
        let mut ledger = Ledger { period_ms, workloads, rows, cluster };
        if input.is_empty() {
            return Ok(ledger);
        }
        let (unmanaged, now): (BTreeMap<u64, u128>, u64) = Codec::decode(input)?;
        for (period, amount) in unmanaged {
            ledger.rows.entry((Scope::Cluster, period)).or_default().unmanaged = amount;
        }
        if let Some((_, c)) = ledger.cluster.as_mut() {
            c.unmanaged_shares = now;
        }
        Ok(ledger)
    }
}

impl crate::codec::Codec for Scope {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Scope::Cluster => out.push(0),
            Scope::Project(name) => (1u8, name.clone()).encode(out),
            Scope::User(name) => (2u8, name.clone()).encode(out),
            Scope::Workload(id) => (3u8, *id).encode(out),
        }
    }
    fn decode(input: &mut &[u8]) -> Result<Self, crate::codec::CodecError> {
        match u8::decode(input)? {
            0 => Ok(Scope::Cluster),
            1 => Ok(Scope::Project(String::decode(input)?)),
            2 => Ok(Scope::User(String::decode(input)?)),
            3 => Ok(Scope::Workload(WorkloadId::decode(input)?)),
            _ => Err(crate::codec::bad("unknown ledger scope")),
        }
    }
}

impl Ledger {
    /// The ledger's whole state, for a snapshot (`Ledger::from_state` reads it back).
    pub fn state(&self) -> Vec<u8> {
        crate::codec::to_bytes(self)
    }

    /// A ledger from `Ledger::state`; damaged or foreign bytes are an error, never a panic.
    pub fn from_state(bytes: &[u8]) -> Result<Ledger, crate::codec::CodecError> {
        crate::codec::from_bytes(bytes)
    }
}
