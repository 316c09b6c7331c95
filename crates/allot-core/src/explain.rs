//! `explain`: why a workload is where it is, computed by the same checks as `decide`.
//!
//! The engine is cloned and a cycle is run on the clone up to the workload in question, so
//! the explanation sees exactly the state the workload would meet: those ahead of it in the
//! fair-share order have already taken what they take.

use crate::decision::{Decision, DeferReason, Placement, QuotaKey};
use crate::engine::{DefragPlan, Engine, ModelCheck, Protection, Request, Stage};
use crate::ids::{ModelId, Shares, Timestamp, WorkloadId};
use crate::model::GpuRequest;

/// How many workloads ahead are named.
pub const AHEAD_NAMED_MAX: usize = 10;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    pub workload: WorkloadId,
    pub stage: Stage,
    /// What a cycle run now would decide for it (pending workloads only).
    pub decision: Option<Decision>,
    /// Place in its project's queue.
    pub queue: Option<QueuePosition>,
    /// For each GPU model it accepts, why it cannot start there now.
    pub blocking: Vec<DeferReason>,
    /// Changes that would let it start now.
    pub counterfactuals: Vec<Counterfactual>,
    /// Where it runs, when admitted.
    pub placement: Option<Placement>,
    /// Times it was stopped and requeued (pre-empted or reclaimed for idleness); a pending
    /// workload with some is *suspended*.
    pub preemptions: u32,
    /// Idle reclaims in a row (the backoff's exponent; reset by sustained activity).
    pub idle_reclaims: u32,
    /// Its latest stop was an idle reclaim (and it has not run since, nor was its user back).
    pub last_stop_idle: bool,
    /// The finish time its user asked for, if any.
    pub deadline: Option<Timestamp>,
    /// Running under an idle rule: what the rule sees now, and when it warned.
    pub idle: Option<(crate::decision::IdleFacts, Option<Timestamp>)>,
    /// Warned and not exempt: when the rule acts if the workload stays idle.
    pub idle_action_at: Option<Timestamp>,
    /// Admitted on a line its project borrows on: who lends it, level by level (its cohort
    /// first, then each cohort above that itself borrows from its parent), on that line.
    pub borrowing: Option<(QuotaKey, Vec<(String, Shares)>)>,
    /// Running: why it may not be pre-empted for other work now, if it may not.
    pub protection: Option<Protection>,
    /// Pending: the GPUs held for it (policy `reservations`), as a cycle run now holds them.
    pub reservation: Option<crate::engine::Reservation>,
    /// Pending with `reservations.hold_quota`: the quota line held for it, and when it is
    /// expected to have that quota (`None`: unknown).
    pub quota_hold: Option<(QuotaKey, Option<Timestamp>)>,
    /// Deferred while its reclaim delay runs (policy `preemption.reclaim_after`): when it may
    /// start taking quota back from borrowers.
    pub reclaim_from: Option<Timestamp>,
}

impl Explanation {
    /// How it came to be suspended, in words: `pre-empted 2 times`, `reclaimed for idleness`,
    /// or, when both kinds of stop may be among its stops, says so. `None` if never stopped.
    pub fn stops(&self) -> Option<String> {
        let n = self.preemptions;
        let times = |n: u32| if n == 1 { "1 time".to_string() } else { format!("{n} times") };
        match n {
            0 => None,
            _ if self.last_stop_idle && n == 1 => Some("reclaimed for idleness".into()),
            _ if self.last_stop_idle => {
                Some(format!("reclaimed for idleness; stopped {} in all", times(n)))
            }
            _ if self.idle_reclaims > 0 => {
                Some(format!("stopped {}: pre-empted or reclaimed for idleness", times(n)))
            }
            _ => Some(format!("pre-empted {}", times(n))),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuePosition {
    /// 1-based position in its project's queue.
    pub position: usize,
    pub ahead_total: usize,
    /// The first `AHEAD_NAMED_MAX` workloads ahead, in queue order.
    pub ahead: Vec<WorkloadId>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Counterfactual {
    /// Asking for this much instead would start now.
    FewerGpus { members: u32, gpus_per_member: GpuRequest },
    /// Accepting this model would start now.
    OtherModel { model: ModelId },
    /// Dropping `same_node` would start now.
    SplitAcrossNodes,
    /// Stopping these workloads would start it now (named even when protected, so that an
    /// operator can act), with the protection of each that has one now.
    Reclaim { victims: Vec<WorkloadId>, protected: Vec<(WorkloadId, Protection)> },
    /// The free capacity is enough in total but fragmented: moving the plan's victims would
    /// free a block for it. Shown when the engine did not do it: `enabled` false (the policy
    /// has defragmentation off), or the plan's rules (`DefragPlan::allowed`) say no.
    Defragment { plan: DefragPlan, enabled: bool },
}

impl Engine {
    /// Explains one workload at `now`; `None` if the engine does not hold it.
    pub fn explain(&self, now: Timestamp, id: WorkloadId) -> Option<Explanation> {
        let w = self.workloads.get(&id)?;
        let mut explanation = Explanation {
            workload: id,
            stage: w.stage,
            decision: None,
            queue: None,
            blocking: Vec::new(),
            counterfactuals: Vec::new(),
            placement: w.allocation.as_ref().map(|a| a.placement.clone()),
            preemptions: w.preemptions,
            idle_reclaims: w.idle_reclaims,
            last_stop_idle: w.idle_suspended_at.is_some(),
            deadline: w.spec.deadline,
            idle: self.idle_facts(id).map(|f| (f, self.idle.get(&id).and_then(|s| s.warned_at))),
            idle_action_at: self.idle_action_at(now, id),
            protection: self.protection_of(now, id),
            reservation: None,
            quota_hold: None,
            reclaim_from: None,
            borrowing: w.allocation.as_ref().and_then(|a| a.key).and_then(|key| {
                let path = self.quota.borrowing_path(w.project, key);
                (!path.is_empty()).then(|| {
                    let levels = path
                        .into_iter()
                        .map(|l| (self.cohort_names[l.cohort].clone(), l.lent))
                        .collect();
                    (key, levels)
                })
            }),
        };
        if w.stage != Stage::Pending {
            return Some(explanation);
        }
        let queue = &self.queues[w.project.0 as usize];
        let ahead: Vec<WorkloadId> =
            queue.keys().map(|k| k.2).take_while(|&other| other != id).collect();
        explanation.queue = Some(QueuePosition {
            position: ahead.len() + 1,
            ahead_total: ahead.len(),
            ahead: ahead.iter().copied().take(AHEAD_NAMED_MAX).collect(),
        });

        // The clone runs the cycle as `decide` would at `now`: clock moved, owed stops made.
        let mut sim = self.clone();
        let mut decisions = Vec::new();
        sim.advance(now);
        sim.stop_due(now, &mut decisions);
        sim.idle_pass(now, &mut decisions);
        sim.admission_cycle(now, &mut decisions, Some(id));
        explanation.reservation = sim.reservation(id).cloned();
        explanation.quota_hold = sim
            .quota_hold(id)
            .map(|h| (h.key, h.backfill_ms.map(|ms| Timestamp(now.0.saturating_add(ms)))));
        explanation.decision = decisions
            .iter()
            .rev()
            .find(|d| {
                matches!(d, Decision::Admit { .. } | Decision::Defer { .. }) && d.workload() == id
            })
            .cloned();
        if !matches!(explanation.decision, Some(Decision::Defer { .. })) {
            return Some(explanation);
        }
        let reclaim_from = Timestamp(w.queued_at.0.saturating_add(self.guard.reclaim_after_ms));
        // Only work within its guarantee reclaims at all.
        explanation.reclaim_from =
            (now < reclaim_from && self.head_within_guarantee(w)).then_some(reclaim_from);
        if let Some(Decision::Defer { reason: DeferReason::WaitingForPreemption { .. }, .. }) =
            &explanation.decision
        {
            return Some(explanation);
        }

        // The clone now holds the state this workload met in the cycle.
        let w = &sim.workloads[&id];
        let request = Request::of(w);
        let constrained = !w.models.is_empty();
        let accepted: Vec<ModelId> = sim.candidate_models(w).to_vec();
        let mut keys = Vec::new();
        let mut placement_keys = Vec::new();
        for &m in &accepted {
            match sim.check_model(&request, m, true) {
                ModelCheck::Blocked { reason, preempt_key } => {
                    if let Some(key) = preempt_key {
                        keys.push((m, key));
                        if reason.is_placement() {
                            placement_keys.push((m, key));
                        }
                    }
                    // A model the project holds no quota for blocks nothing the user can act
                    // on (the reason names no model, and says "any" model): it is the reason
                    // only when no model has quota, and then it is the decision's. Equal
                    // reasons from several models are listed once.
                    if !matches!(reason, DeferReason::NoQuotaForModel { .. })
                        && !explanation.blocking.contains(&reason)
                    {
                        explanation.blocking.push(reason);
                    }
                }
                // Fits only after the cycle's order changed nothing for it: report no block.
                ModelCheck::Fits(..) | ModelCheck::Claimed(_) => {}
            }
        }

        let fits_any = |sim: &mut Engine, r: &Request, models: &[ModelId]| {
            models.iter().any(|&m| matches!(sim.check_model(r, m, true), ModelCheck::Fits(..)))
        };
        // Fewer GPUs: the largest smaller request that fits, members first kept.
        match request.shape.gpus {
            GpuRequest::Whole(k) if k > 1 || request.members > 1 => {
                let mut found = None;
                'search: for members in (1..=request.members).rev() {
                    for per in (1..=k).rev() {
                        if members == request.members && per == k {
                            continue;
                        }
                        let mut r = request;
                        r.members = members;
                        r.shape.gpus = GpuRequest::Whole(per);
                        r.total =
                            crate::ids::Shares::from_gpus(u64::from(per) * u64::from(members));
                        if fits_any(&mut sim, &r, &accepted) {
                            found = Some((members, GpuRequest::Whole(per)));
                            break 'search;
                        }
                    }
                }
                if let Some((members, gpus_per_member)) = found {
                    explanation
                        .counterfactuals
                        .push(Counterfactual::FewerGpus { members, gpus_per_member });
                }
            }
            _ => {}
        }
        // Other models.
        if constrained {
            for m in (0..sim.models.len()).map(|m| ModelId(m as u16)) {
                if !accepted.contains(&m) && fits_any(&mut sim, &request, &[m]) {
                    explanation.counterfactuals.push(Counterfactual::OtherModel { model: m });
                }
            }
        }
        // Splitting a same-node gang.
        if request.same_node && request.members > 1 {
            let mut r = request;
            r.same_node = false;
            if fits_any(&mut sim, &r, &accepted) {
                explanation.counterfactuals.push(Counterfactual::SplitAcrossNodes);
            }
        }
        // Named victims, ignoring protections.
        for (m, key) in keys {
            if let Some((victims, _)) = sim.plan_preemption(now, id, m, key, false) {
                let victims: Vec<WorkloadId> = victims.into_iter().map(|(v, _)| v).collect();
                // An idle victim (judged idle, ready under pressure) is not guarded against
                // thrash: only its own flag and min runtime protect it.
                let protected = victims
                    .iter()
                    .filter_map(|&v| Some((v, self.protection_of(now, v)?)))
                    .filter(|(v, p)| {
                        !self.pressure_ready.contains(v)
                            || matches!(
                                p,
                                Protection::NotPreemptible | Protection::MinRuntime { .. }
                            )
                    })
                    .collect();
                explanation.counterfactuals.push(Counterfactual::Reclaim { victims, protected });
                break;
            }
        }
        // Fragmentation: what moving work would free, whether or not the policy allows it.
        let policy = sim.defrag.unwrap_or_default();
        for (m, key) in placement_keys {
            if let Some((plan, _, _)) = sim.plan_defrag(now, id, m, key, policy) {
                let enabled = sim.defrag.is_some();
                explanation.counterfactuals.push(Counterfactual::Defragment { plan, enabled });
                break;
            }
        }
        Some(explanation)
    }
}
