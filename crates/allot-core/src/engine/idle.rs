//! Idle reclaim in the engine (PRODUCT.md §3; ARCHITECTURE.md, "Idle reclaim").
//!
//! Each running workload that a policy rule covers has an [`IdleTracker`] fed by
//! `Event::ActivitySampled` and `Event::ActivityProbed`. Every cycle, before admission, the idle
//! pass warns workloads whose idle time comes within `warn_before` of the timer (and withdraws
//! the warning if they become active again), and reclaims those under `always` rules once the
//! timer has run out and the warning is at least `warn_before` old. Under `on_pressure` rules
//! the ready workloads are victims of the one arbiter (`plan_preemption`), which takes them only
//! for a pending workload that quota admits and that can be placed once they are gone. The
//! `amd_rm` model keeps AMD's own pressure check instead ([`Engine::amd_pressure_pass`]):
//! pending workloads oldest first, idle victims longest-idle first until their GPU *count*
//! covers the request, all or nothing, placement not checked.
//!
//! A rule with a quiet timer (`IdleRule::quiet_timer_ms`, model `allot`) uses it instead of its
//! idle timer while fewer than `quiet_below` of the *other* workloads it judges in the same
//! project are active (idle less than `quiet_window`; those stopped for idleness and waiting
//! count as quiet): replicas of one service share their traffic, so a quiet service predicts
//! that an idle replica stays idle ([`Peers`], computed once per pass).
//!
//! Work stopped for idleness and requeued waits a backoff before it may resume (first
//! `idle_resume_backoff_ms`, doubled per further idle reclaim in a row, at most
//! `IDLE_BACKOFF_MAX_MS`), so that a workload that comes back idle does not thrash; the count
//! restarts once it shows sustained activity.

use std::collections::{BTreeMap, BTreeSet};

use crate::decision::{Decision, DeferReason, IdleFacts, PreemptReason};
use crate::engine::{Engine, Stage, StopKind, WorkloadState};
use crate::idle::{IdleModel, IdleStatus, IdleTracker};
use crate::ids::{ProjectId, SHARES_PER_GPU, Timestamp, WorkloadId};
use crate::model::{IDLE_BACKOFF_MAX_MS, IdlePolicySpec, IdleWhen};

/// The idle state of one running workload.
#[derive(Clone, Debug)]
pub(crate) struct IdleState {
    /// Index of the rule in the policy's `idle` list.
    pub rule: u32,
    pub tracker: IdleTracker,
    /// Never reclaimed: an exempt priority class, or not preemptible. Still warned (reported).
    pub exempt: bool,
    /// When the current warning was given; `None`: not warned (or withdrawn).
    pub warned_at: Option<Timestamp>,
    /// A cycle has seen it ready under `on_pressure` (so `idle_attention` asks for no more).
    pub offered: bool,
}

/// Per (rule, project), for rules with a quiet timer: the workloads the rule judges — running
/// and tracked, or stopped for idleness and waiting to be needed — and how many are active.
#[derive(Debug, Default)]
pub(crate) struct Peers(BTreeMap<(u32, ProjectId), (u32, u32)>);

impl Engine {
    /// The peers of every rule with a quiet timer (empty, and free, when no rule has one).
    pub(crate) fn quiet_peers(&self) -> Peers {
        let mut peers = Peers::default();
        let quiet =
            |rule: u32| self.idle_rules.get(rule as usize).filter(|r| r.rule.quiet_timer_ms > 0);
        if !self.idle_rules.iter().any(|r| r.rule.quiet_timer_ms > 0) {
            return peers;
        }
        for (id, state) in &self.idle {
            let Some(spec) = quiet(state.rule) else { continue };
            let Some(w) = self.workloads.get(id) else { continue };
            let active = match (w.stage, w.stop_kind) {
                (Stage::Running, _) => state.tracker.idle_ms() < spec.rule.quiet_window_ms,
                // Told to stop for idleness: quiet, as it will be once stopped.
                (Stage::Stopping, Some(StopKind::Idle(_))) => false,
                _ => continue,
            };
            let e = peers.0.entry((state.rule, w.project)).or_default();
            e.0 += 1;
            e.1 += u32::from(active);
        }
        for w in self.workloads.values() {
            if w.stage != Stage::Pending || w.idle_suspended_at.is_none() {
                continue;
            }
            if let Some((rule, spec)) = self.idle_rule_for(w)
                && spec.rule.quiet_timer_ms > 0
            {
                peers.0.entry((rule, w.project)).or_default().0 += 1;
            }
        }
        peers
    }

    /// The timer that judges a tracked workload now: its rule's quiet timer while the other
    /// workloads of the rule in its project are quiet, else its idle timer.
    pub(crate) fn idle_timer_now(&self, id: WorkloadId, peers: &Peers) -> u64 {
        let Some(state) = self.idle.get(&id) else { return u64::MAX };
        let Some(spec) = self.idle_rules.get(state.rule as usize) else { return u64::MAX };
        let r = &spec.rule;
        let Some(w) = self.workloads.get(&id).filter(|_| r.quiet_timer_ms > 0) else {
            return r.idle_timer_ms;
        };
        let Some(&(n, active)) = peers.0.get(&(state.rule, w.project)) else {
            return r.idle_timer_ms;
        };
        let me_active = u32::from(state.tracker.idle_ms() < r.quiet_window_ms);
        let (others, active_others) = (n.saturating_sub(1), active.saturating_sub(me_active));
        let quiet = others > 0
            && u64::from(active_others) * 1000
                < u64::from(r.quiet_below_permille) * u64::from(others);
        if quiet { r.quiet_timer_ms } else { r.idle_timer_ms }
    }

    /// The rule that covers a workload, if any: the first in the policy's order.
    pub(crate) fn idle_rule_for(&self, w: &WorkloadState) -> Option<(u32, &IdlePolicySpec)> {
        let project = &self.projects[w.project.0 as usize].name;
        self.idle_rules
            .iter()
            .enumerate()
            .find(|(_, r)| r.covers(project, w.spec.kind))
            .map(|(i, r)| (i as u32, r))
    }

    /// The name of rule `index`, for rendering.
    pub fn idle_rule_name(&self, index: u32) -> &str {
        self.idle_rules.get(index as usize).map_or("?", |r| r.name.as_str())
    }

    /// Starts judging a workload that just started, if a rule covers it.
    pub(crate) fn start_idle_tracking(&mut self, id: WorkloadId, now: Timestamp) {
        let Some(w) = self.workloads.get(&id) else { return };
        let Some((index, spec)) = self.idle_rule_for(w) else { return };
        let mut rule = spec.rule;
        if rule.model == IdleModel::Allot {
            // The workload's own protection is a start-up grace as well.
            rule.min_runtime_ms = rule.min_runtime_ms.max(w.spec.min_runtime_ms);
        }
        let class = w.spec.priority_class.as_deref().unwrap_or(&self.default_class_name);
        let exempt = !w.preemptible || spec.exempt_classes.iter().any(|c| c == class);
        self.idle.insert(
            id,
            IdleState {
                rule: index,
                tracker: IdleTracker::new(rule, now),
                exempt,
                warned_at: None,
                offered: false,
            },
        );
    }

    /// Feeds telemetry or a probe to a running workload's tracker (ignored otherwise).
    pub(crate) fn observe_idle(
        &mut self,
        now: Timestamp,
        id: WorkloadId,
        readings: Option<&[crate::idle::DeviceReading]>,
        probe: Option<Timestamp>,
    ) {
        let running = self.workloads.get(&id).is_some_and(|w| w.stage == Stage::Running);
        let Some(state) = self.idle.get_mut(&id).filter(|_| running) else { return };
        if let Some(readings) = readings {
            state.tracker.observe(now, readings);
        }
        if let Some(last) = probe {
            state.tracker.probe(now, last);
        }
        let active = state.tracker.active_seen() && state.tracker.idle_ms() == 0;
        if active && let Some(w) = self.workloads.get_mut(&id) {
            // Sustained activity since the last resume: the backoff count starts over.
            w.idle_reclaims = 0;
        }
    }

    /// The facts behind a warning or reclaim of a tracked workload (`idle_timer_ms`: the
    /// timer that judges it now, the quiet one while its peers are quiet).
    /// When a warned workload's rule acts if it stays idle: the warning's notice has run
    /// (`warn_before` since the warning) and its idle time has reached the timer — what the
    /// warning promised. `None` when not warned, exempt or report-only.
    pub(crate) fn idle_action_at(&self, now: Timestamp, id: WorkloadId) -> Option<Timestamp> {
        let state = self.idle.get(&id)?;
        let warned = state.warned_at?;
        let spec = self.idle_rules.get(state.rule as usize)?;
        if state.exempt || spec.when == IdleWhen::ReportOnly {
            return None;
        }
        let facts = self.idle_facts(id)?;
        let left = facts.idle_timer_ms.saturating_sub(facts.idle_ms);
        let notice_over = warned.0.saturating_add(spec.warn_before_ms);
        Some(Timestamp(notice_over.max(now.0.saturating_add(left))))
    }

    pub(crate) fn idle_facts(&self, id: WorkloadId) -> Option<IdleFacts> {
        let spec = self.idle_rules.get(self.idle.get(&id)?.rule as usize)?;
        let timer = if spec.rule.quiet_timer_ms > 0 {
            self.idle_timer_now(id, &self.quiet_peers())
        } else {
            spec.rule.idle_timer_ms
        };
        self.idle_facts_with(id, timer)
    }

    /// [`Engine::idle_facts`] with the timer that judges the workload now already known.
    fn idle_facts_with(&self, id: WorkloadId, idle_timer_ms: u64) -> Option<IdleFacts> {
        let state = self.idle.get(&id)?;
        let spec = self.idle_rules.get(state.rule as usize)?;
        Some(IdleFacts {
            rule: state.rule,
            model: spec.rule.model,
            idle_ms: state.tracker.idle_ms(),
            idle_timer_ms,
            threshold_permille: spec.rule.threshold_permille,
            signal: state.tracker.signal_used(),
            when: spec.when,
            action: spec.action,
            telemetry_gap_since: state.tracker.telemetry_gap_since(),
        })
    }

    /// Whether a tracked, running workload may be reclaimed now under a rule of `when`: not
    /// exempt, its timer now (`idle_timer_now`) run out, warned at least `warn_before` ago.
    pub(crate) fn idle_ready(
        &self,
        now: Timestamp,
        id: WorkloadId,
        when: IdleWhen,
        peers: &Peers,
    ) -> bool {
        let Some(state) = self.idle.get(&id) else { return false };
        let Some(spec) = self.idle_rules.get(state.rule as usize) else { return false };
        spec.when == when
            && !state.exempt
            && self.workloads.get(&id).is_some_and(|w| w.stage == Stage::Running && w.preemptible)
            && state.tracker.expired_after(now, self.idle_timer_now(id, peers))
            && state.warned_at.is_some_and(|t| now.since(t) >= spec.warn_before_ms)
    }

    /// Idle time to discount from a victim's cost (0 for a workload not judged idle).
    pub(crate) fn idle_discount_ms(&self, id: WorkloadId) -> u64 {
        self.idle.get(&id).map_or(0, |s| s.tracker.idle_ms())
    }

    /// Step 2b of the cycle: warnings, withdrawn warnings, `always` reclaims, and the end of
    /// expired backoffs.
    pub(crate) fn idle_pass(&mut self, now: Timestamp, out: &mut Vec<Decision>) {
        while let Some(&(at, _)) = self.backoffs.first() {
            if at > now {
                break;
            }
            self.backoffs.pop_first();
        }
        self.pressure_ready.clear();
        let peers = self.quiet_peers();
        let ids: Vec<WorkloadId> = self.idle.keys().copied().collect();
        for id in ids {
            let Some(w) = self.workloads.get(&id) else { continue };
            if w.stage != Stage::Running {
                continue;
            }
            let Some(state) = self.idle.get(&id) else { continue };
            let Some(spec) = self.idle_rules.get(state.rule as usize) else { continue };
            let (when, action, warn_before) = (spec.when, spec.action, spec.warn_before_ms);
            let model = spec.rule.model;
            let timer = self.idle_timer_now(id, &peers);
            let status = state.tracker.status(now);
            let idle_ms = match status {
                IdleStatus::Idle { idle_ms } => idle_ms,
                IdleStatus::Grace | IdleStatus::Active => 0,
            };
            let warn_from = spec.warn_from_timer_ms(timer);
            let exempt = state.exempt;
            let warned_at = state.warned_at;
            if idle_ms < warn_from {
                if let Some(s) = self.idle.get_mut(&id) {
                    s.warned_at = None;
                    s.offered = false;
                }
                continue;
            }
            let Some(facts) = self.idle_facts_with(id, timer) else { continue };
            if warned_at.is_none() {
                let acts = !exempt && when != IdleWhen::ReportOnly;
                let action_at = acts.then(|| {
                    Timestamp(now.0.saturating_add(warn_before.max(timer.saturating_sub(idle_ms))))
                });
                out.push(Decision::Warn { workload: id, idle: facts, action_at });
                if let Some(s) = self.idle.get_mut(&id) {
                    s.warned_at = Some(now);
                }
            }
            if when == IdleWhen::OnPressure
                && self.idle_ready(now, id, IdleWhen::OnPressure, &peers)
                && let Some(s) = self.idle.get_mut(&id)
            {
                s.offered = true;
                if model != IdleModel::AmdRm {
                    self.pressure_ready.insert(id);
                }
            }
            if self.idle_ready(now, id, IdleWhen::Always, &peers) {
                let checkpoint_grace_ms =
                    self.workloads.get(&id).and_then(|w| w.spec.checkpointing).map(|c| c.grace_ms);
                self.mark_stopping(id, StopKind::Idle(action));
                out.push(Decision::Reclaim {
                    workload: id,
                    mode: action,
                    idle: facts,
                    checkpoint_grace_ms,
                });
            }
        }
    }

    /// The `amd_rm` model's pressure check, after admission: the cycle's deferred GPU
    /// workloads oldest first; for each, ready idle victims of `amd_rm` `on_pressure` rules,
    /// longest idle first, until their GPUs (counted, any model, any node) cover its request;
    /// if they do not, nobody is taken for it. Victims taken for one are not counted again.
    pub(crate) fn amd_pressure_pass(&mut self, now: Timestamp, out: &mut Vec<Decision>) {
        // `amd_rm` rules have no quiet timer.
        let peers = Peers::default();
        let mut candidates: Vec<(std::cmp::Reverse<u64>, WorkloadId)> = self
            .idle
            .iter()
            .filter(|(id, s)| {
                self.idle_rules
                    .get(s.rule as usize)
                    .is_some_and(|r| r.rule.model == IdleModel::AmdRm)
                    && self.idle_ready(now, **id, IdleWhen::OnPressure, &peers)
            })
            .map(|(id, s)| (std::cmp::Reverse(s.tracker.idle_ms()), *id))
            .collect();
        if candidates.is_empty() {
            return;
        }
        candidates.sort();
        let pressing = |reason: &DeferReason| {
            !matches!(
                reason,
                DeferReason::WaitingForPreemption { .. }
                    | DeferReason::IdleBackoff { .. }
                    | DeferReason::AwaitingUse { .. }
                    | DeferReason::HeldForReservation { .. }
                    | DeferReason::HeldForClaimant { .. }
                    | DeferReason::QuotaHeldForReservation { .. }
            )
        };
        let deferred: Vec<WorkloadId> = if self.changes_only {
            // `decide_changes` left out the deferrals that repeat; every queued workload's
            // deferral this cycle is the one its queue entry was last told.
            let reasons = &self.reasons;
            self.queues
                .iter()
                .flat_map(|q| q.iter())
                .filter(|(_, e)| e.reported.is_some_and(|r| pressing(reasons.get(r))))
                .map(|(k, _)| k.2)
                .collect()
        } else {
            out.iter()
                .filter_map(|d| match d {
                    Decision::Defer { workload, reason } if pressing(reason) => Some(*workload),
                    _ => None,
                })
                .collect()
        };
        let mut pending: Vec<(Timestamp, WorkloadId)> = deferred
            .into_iter()
            .filter_map(|id| {
                let w = self.workloads.get(&id)?;
                (w.spec.total_shares().0 > 0).then_some((w.queued_at, id))
            })
            .collect();
        pending.sort();
        let mut claimed: BTreeSet<WorkloadId> = BTreeSet::new();
        for (_, claimant) in pending {
            let Some(need) = self.workloads.get(&claimant).map(|w| w.spec.total_shares().0) else {
                continue;
            };
            let mut chosen = Vec::new();
            let mut got = 0u64;
            for &(_, v) in &candidates {
                if got >= need {
                    break;
                }
                if claimed.contains(&v) {
                    continue;
                }
                // AMD counts whole devices by resource name: a fraction counts as one GPU.
                let gpus = self
                    .workloads
                    .get(&v)
                    .map_or(0, |w| w.spec.total_shares().0.div_ceil(SHARES_PER_GPU));
                got += gpus * SHARES_PER_GPU;
                chosen.push(v);
            }
            if got < need {
                continue;
            }
            for v in chosen {
                claimed.insert(v);
                let Some(facts) = self.idle_facts(v) else { continue };
                self.mark_stopping(v, StopKind::Idle(facts.action));
                out.push(Decision::Preempt {
                    victim: v,
                    for_workload: claimant,
                    mode: facts.action,
                    reason: PreemptReason::Idle { idle: facts, gpu_count_only: true },
                    checkpoint_grace_ms: None,
                });
            }
        }
    }

    /// A workload stopped for idleness was requeued: it may resume after its backoff.
    pub(crate) fn start_idle_backoff(&mut self, id: WorkloadId, now: Timestamp) {
        let base = self.idle_resume_backoff_ms;
        let Some(w) = self.workloads.get_mut(&id) else { return };
        w.idle_reclaims = w.idle_reclaims.saturating_add(1);
        let factor = 1u64 << (w.idle_reclaims - 1).min(20);
        let wait = base.saturating_mul(factor).min(IDLE_BACKOFF_MAX_MS);
        let until = Timestamp(now.0.saturating_add(wait));
        w.resume_at = Some(until);
        self.backoffs.insert((until, id));
        self.unmark_plain(id);
    }

    /// Whether a pending workload still waits out an idle backoff at `now`.
    pub(crate) fn in_idle_backoff(&self, w: &WorkloadState, now: Timestamp) -> Option<DeferReason> {
        w.resume_at
            .filter(|&t| t > now)
            .map(|until| DeferReason::IdleBackoff { until, reclaims: w.idle_reclaims })
    }

    /// Whether a cycle at `now` has idle work to do: a warning or reclaim due, a ready
    /// `on_pressure` victim while work is pending, or a backoff that ended. A caller that
    /// runs the cycle only when something changed asks this after feeding telemetry.
    pub fn idle_attention(&self, now: Timestamp) -> bool {
        if self.backoffs.first().is_some_and(|&(t, _)| t <= now) {
            return true;
        }
        let pending = self.queues.iter().any(|q| !q.is_empty());
        let peers = self.quiet_peers();
        self.idle.iter().any(|(&id, s)| {
            let Some(spec) = self.idle_rules.get(s.rule as usize) else { return false };
            if self.workloads.get(&id).is_none_or(|w| w.stage != Stage::Running) {
                return false;
            }
            let idle_ms = s.tracker.idle_ms();
            let warn_from = spec.warn_from_timer_ms(self.idle_timer_now(id, &peers));
            match s.warned_at {
                None => idle_ms >= warn_from,
                Some(_) if idle_ms < warn_from => true,
                Some(_) => {
                    self.idle_ready(now, id, spec.when, &peers)
                        && (spec.when == IdleWhen::Always || (pending && !s.offered))
                }
            }
        })
    }

    /// A probe saw an idle-suspended workload's user back (activity after its stop): it needs
    /// its GPUs again, so it queues as ordinary work from now on — no backoff, may pre-empt.
    pub(crate) fn user_back(&mut self, id: WorkloadId, last_activity: Timestamp) {
        let Some(w) = self.workloads.get_mut(&id) else { return };
        w.probed = true;
        let Some(stopped) = w.idle_suspended_at else { return };
        if w.stage != Stage::Pending || last_activity < stopped {
            return;
        }
        w.idle_suspended_at = None;
        if let Some(at) = w.resume_at.take() {
            self.backoffs.remove(&(at, id));
        }
    }
}
