//! Estimated start times for pending work (`Engine::etas`): a what-if on a clone of the
//! engine, never on the engine itself.
//!
//! The clone lets every running workload end at its known end — its max runtime — and runs a
//! cycle at each such instant, as the daemon would after the stop. What it assumes, so the estimate is a floor under
//! today's facts, not a promise:
//! - admitted work starts at once, stops asked for (pre-emption, reclaim, max runtime) take
//!   effect at once (no checkpoint grace, no launch time);
//! - running work without a max runtime never ends; nothing new is submitted;
//! - no idle rule acts (the clone has none): idleness cannot be foreseen;
//! - idle-reclaim backoffs end when they are due.
//!
//! **Cost bound.** Only the first [`ETA_WORKLOADS_MAX`] pending workloads (by priority, then
//! submission time, then id) are kept in the clone; the others are removed from it and get
//! [`EtaUnknown::NotEstimated`]. At most [`ETA_ENDS_MAX`] simulated instants (max-runtime ends
//! or backoff ends) are visited, each with at most [`ROUNDS_PER_INSTANT`] cycles, so one call
//! costs at most `ETA_ENDS_MAX × ROUNDS_PER_INSTANT` cycles over at most `ETA_WORKLOADS_MAX`
//! pending workloads (plus any work the clone pre-empts) and the running ones, and one clone.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use crate::decision::{Decision, DeferReason};
use crate::event::Event;
use crate::ids::{Timestamp, WorkloadId};

use super::{Engine, Stage};

/// Pending workloads estimated per call; the rest are `NotEstimated`.
pub const ETA_WORKLOADS_MAX: usize = 100;
/// Simulated instants (a max-runtime or backoff end) per call at most.
pub const ETA_ENDS_MAX: usize = 256;
/// Cycles per instant at most: one, and another after each cycle that stopped work
/// (pre-emption), whose room the next cycle at the same time gives out.
pub const ROUNDS_PER_INSTANT: usize = 4;

/// When a pending workload would be admitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Eta {
    /// Admitted at `at` by the cycle that ran after `after`.
    At {
        at: Timestamp,
        after: EtaCause,
    },
    Unknown(EtaUnknown),
}

/// What the admission waited for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EtaCause {
    /// Nothing: the next cycle admits it (room is free, or pre-emption makes room now).
    NextCycle,
    /// This workload reached its max runtime and its devices were freed.
    MaxRuntime(WorkloadId),
    /// This workload's idle-reclaim backoff ended (possibly the estimated workload itself).
    BackoffEnds(WorkloadId),
}

/// Why no time can be given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EtaUnknown {
    /// Not among the first `limit` pending workloads (the bound on the estimate's cost).
    NotEstimated { limit: usize },
    /// It still waits once every workload with a max runtime has ended: the rest of the
    /// running work (`count` workloads, e.g. `example`) has no max runtime, so no end is known.
    NoMaxRuntime { count: usize, example: WorkloadId, reason: Option<DeferReason> },
    /// Nothing is left running and it is still not admitted: it does not fit the cluster or its
    /// quota as they are; `reason` is the last cycle's.
    NeverFits { reason: Option<DeferReason> },
    /// It can never start under this policy and fleet, whatever ends: larger than its project
    /// may ever hold, placeable on no node, or no quota for any model it accepts.
    Never { reason: DeferReason },
    /// It waits for its user to come back (idle-suspended with a probe): not foreseeable.
    AwaitingUse,
    /// Still waiting after `ends` simulated ends (the bound was reached).
    BeyondHorizon { ends: usize },
}

impl Engine {
    /// Estimated admission times of pending workloads at `now` (see the module docs for the
    /// assumptions and the cost bound). Every pending workload has an entry. The engine itself
    /// is not changed.
    pub fn etas(&self, now: Timestamp) -> BTreeMap<WorkloadId, Eta> {
        let mut out = BTreeMap::new();
        let mut order: Vec<(Reverse<i32>, Timestamp, WorkloadId)> =
            self.queues.iter().flat_map(|q| q.keys().copied()).collect();
        order.sort_unstable();
        let split = order.len().min(ETA_WORKLOADS_MAX);
        let mut sim = self.clone();
        sim.idle_rules.clear();
        sim.idle.clear();
        sim.pressure_ready.clear();
        let t0 = Timestamp(now.0.max(self.clock.0));
        for &(_, _, id) in &order[split..] {
            out.insert(id, Eta::Unknown(EtaUnknown::NotEstimated { limit: ETA_WORKLOADS_MAX }));
            sim.apply(t0, Event::WorkloadCancelled { workload: id });
        }
        let mut waiting: BTreeSet<WorkloadId> = order[..split].iter().map(|k| k.2).collect();
        // Starts and stops under way complete now.
        let settling: Vec<(WorkloadId, Stage)> =
            sim.workloads.iter().map(|(id, w)| (*id, w.stage)).collect();
        for (id, stage) in settling {
            match stage {
                Stage::Assumed => sim.apply(t0, Event::AllocationStarted { workload: id }),
                Stage::Stopping => sim.apply(t0, Event::WorkloadStopped { workload: id }),
                Stage::Pending | Stage::Running => {}
            }
        }
        let mut last_reason: BTreeMap<WorkloadId, DeferReason> = BTreeMap::new();
        let (mut t, mut cause, mut ends) = (t0, EtaCause::NextCycle, 0usize);
        let horizon = loop {
            // Work whose max runtime has passed ends now (as the cycle's stop would make it).
            while let Some(&(end, id)) = sim.deadlines.first() {
                if end > t {
                    break;
                }
                sim.apply(t, Event::WorkloadStopped { workload: id });
                sim.deadlines.remove(&(end, id));
            }
            // Admissions take all the room a cycle finds; only stops (pre-emptions) free more
            // room at the same instant, for another cycle.
            for _ in 0..ROUNDS_PER_INSTANT {
                let mut stopped = false;
                for d in sim.decide(t) {
                    match d {
                        Decision::Admit { workload, .. } => {
                            sim.apply(t, Event::AllocationStarted { workload });
                            if waiting.remove(&workload) {
                                out.insert(workload, Eta::At { at: t, after: cause });
                            }
                        }
                        Decision::Preempt { victim: workload, .. }
                        | Decision::Reclaim { workload, .. }
                        | Decision::Stop { workload, .. } => {
                            stopped = true;
                            sim.apply(t, Event::WorkloadStopped { workload });
                        }
                        Decision::Defer { workload, reason } => {
                            last_reason.insert(workload, reason);
                        }
                        Decision::Warn { .. } | Decision::Reject { .. } => {}
                    }
                }
                if !stopped {
                    break;
                }
            }
            if waiting.is_empty() {
                break false;
            }
            let deadline = sim.deadlines.first().copied();
            let backoff = sim.backoffs.iter().find(|(at, _)| *at > t).copied();
            let next = match (deadline, backoff) {
                (Some(d), Some(b)) if b.0 < d.0 => (b.0, EtaCause::BackoffEnds(b.1)),
                (Some(d), _) => (d.0, EtaCause::MaxRuntime(d.1)),
                (None, Some(b)) => (b.0, EtaCause::BackoffEnds(b.1)),
                (None, None) => break false,
            };
            if ends >= ETA_ENDS_MAX {
                break true;
            }
            ends += 1;
            (t, cause) = (Timestamp(next.0.0.max(t.0)), next.1);
        };
        let running: Vec<WorkloadId> = sim
            .workloads
            .iter()
            .filter(|(_, w)| w.stage == Stage::Running)
            .map(|(id, _)| *id)
            .collect();
        for id in waiting {
            let reason = last_reason.remove(&id);
            let unknown = if let Some(reason) = reason.clone().filter(never_starts) {
                EtaUnknown::Never { reason }
            } else if horizon {
                EtaUnknown::BeyondHorizon { ends }
            } else if matches!(reason, Some(DeferReason::AwaitingUse { .. })) {
                EtaUnknown::AwaitingUse
            } else if let Some(&example) = running.first() {
                EtaUnknown::NoMaxRuntime { count: running.len(), example, reason }
            } else {
                EtaUnknown::NeverFits { reason }
            };
            out.insert(id, Eta::Unknown(unknown));
        }
        out
    }
}

/// Whether a cycle's reason holds whatever running work ends: the request exceeds what its
/// project may ever hold, fits no node as built, or finds no quota line or MIG profile.
fn never_starts(reason: &DeferReason) -> bool {
    matches!(
        reason,
        DeferReason::ExceedsMaxQuota { .. }
            | DeferReason::NeverPlaceable { .. }
            | DeferReason::NoQuotaForModel { .. }
            | DeferReason::NoMigProfile { .. }
    )
}
