//! The pre-emption arbiter, the one place that stops running work for pending work: it picks
//! the cheapest victim set (`plan_preemption`, judging who borrows by `committed` usage),
//! tells the victims to stop and makes the claimant wait for them, its quota reserved
//! (`start_preemption`, `mark_stopping`, `end_wait`), and holds the free part of the room it
//! planned for while it waits (`hold_plan`/`release_hold`). Defragmentation (`defrag.rs`)
//! uses the same victim order, cost, what-if (`lift`/`unlift`) and `start_preemption`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use super::book::adjust_line_total;
use super::{Engine, Protection, Stage, StopKind, WorkloadState};
use crate::capacity::Layout;
use crate::decision::{Decision, DeviceShare, MemberPlacement, Placement, PreemptReason, QuotaKey};
use crate::ids::{ModelId, ProjectId, SHARES_PER_GPU, Shares, Timestamp, WorkloadId};
use crate::model::{FairShareStrategy, WithinProject};

/// Victim order (see `Engine::plan_preemption`): (own project, priority, work lost in GPU-ms,
/// latest start first, id).
pub(super) type VictimKey = (u8, i32, u64, Reverse<Timestamp>, WorkloadId);

impl Engine {
    /// The victims a pre-emptor waits for that still hold their devices.
    pub(super) fn victims_still_stopping(&self, preemptor: WorkloadId) -> Vec<WorkloadId> {
        self.workloads.get(&preemptor).map_or(Vec::new(), |w| {
            w.waiting_for
                .iter()
                .copied()
                .filter(|v| self.workloads.get(v).is_some_and(|v| v.stage == Stage::Stopping))
                .collect()
        })
    }

    /// Takes what is free now of the pre-emptor's planned placement, until `release_hold`.
    pub(super) fn hold_plan(&mut self, preemptor: WorkloadId) {
        let (Some(plan), Some(w)) = (self.planned.get(&preemptor), self.workloads.get(&preemptor))
        else {
            return;
        };
        let plan = plan.clone();
        let (cpu, mem) = (w.spec.cpu_millis_per_member, w.spec.memory_mib_per_member);
        for member in &plan.members {
            let node = &self.capacity.nodes[member.node.0 as usize];
            let devices: Vec<DeviceShare> = member
                .devices
                .iter()
                .filter_map(|d| {
                    let dev = node.devices.get(d.device as usize)?;
                    let take = match d.mig {
                        // A MIG instance is held whole, once its slot is free, or not at all.
                        Some(slot) => {
                            if dev.mig_fits_at(slot) {
                                d.shares
                            } else {
                                0
                            }
                        }
                        None => dev.free.min(d.shares),
                    };
                    (take > 0).then_some(DeviceShare { device: d.device, shares: take, mig: d.mig })
                })
                .collect();
            let (c, m) = (node.free_cpu.min(cpu), node.free_mem.min(mem));
            let part = Placement {
                model: plan.model,
                members: vec![MemberPlacement { node: member.node, devices }],
            };
            self.capacity.take(&part, c, m);
            self.held.entry(preemptor).or_default().push((part, c, m));
        }
    }

    /// Gives back what `hold_plan` took; an exact inverse.
    pub(super) fn release_hold(&mut self, preemptor: WorkloadId) {
        for (part, cpu, mem) in self.held.remove(&preemptor).unwrap_or_default() {
            self.capacity.give(&part, cpu, mem);
        }
    }

    /// Finds the cheapest victim set that lets `id` start on model `m` charged to `key`, or
    /// `None`. Candidates, in this order (ARCHITECTURE.md, "Victim ordering"):
    /// 1. work of other projects in the cohort that borrow on `key` (quota reclaim), only when
    ///    the claimant ends within its guarantee, before the claimant's own work;
    /// 2. lower priority first;
    /// 3. less work lost first (GPU-ms since the last checkpoint, or since start);
    /// 4. most recently started first;
    /// 5. lower workload id.
    ///
    /// With `protect`, workloads the guard protects (`guard.rs`: not preemptible, younger than
    /// their min runtime, restarted within `exempt_after_restart`, capped) are never
    /// candidates, idle victims only by the first two; `explain` drops it to name who would
    /// have to go.
    /// Greedy removal in that order until the workload fits, then every victim but the last
    /// is put back if the workload still fits without it (Kueue's minimisation). The state is
    /// unchanged on return.
    pub(crate) fn plan_preemption(
        &mut self,
        now: Timestamp,
        id: WorkloadId,
        m: ModelId,
        key: QuotaKey,
        protect: bool,
    ) -> Option<(Vec<(WorkloadId, PreemptReason)>, Placement)> {
        self.plan_preemption_with(now, id, m, key, protect, &mut EligibleLists::new())
    }

    /// `plan_preemption` drawing its candidates from `lists`, filled as needed: the cycle
    /// keeps them while nothing changes (`CycleMemory`), so that each failing shape does not
    /// look up every running workload of the cohort again. They must have been made with
    /// the same `now` and `protect`, since the last change of the state.
    pub(super) fn plan_preemption_with(
        &mut self,
        now: Timestamp,
        id: WorkloadId,
        m: ModelId,
        key: QuotaKey,
        protect: bool,
        lists: &mut EligibleLists,
    ) -> Option<(Vec<(WorkloadId, PreemptReason)>, Placement)> {
        let w = &self.workloads[&id];
        let (project, priority, total) = (w.project, w.priority, w.spec.total_shares());
        let newer_than_claimant = (w.queued_at, id);
        let (shape, members) = (w.shape(), w.spec.members);
        let layout = Layout::of(w.spec.same_node, w.spec.prefer_same_node);
        let p = &self.projects[project.0 as usize];
        let (cohort, within_project, borrow_within) =
            (p.cohort, p.preempt_within_project, p.borrow_within_cohort);

        // Candidates with what makes them one: quota reclaim from a borrower, the claimant's
        // own lower-priority work, or idle work past its timer under an `on_pressure` rule.
        // Own and reclaim candidates come from disjoint projects; an idle candidate may also
        // be one of them, and then counts as idle (the cheaper tier and reason).
        let mut candidates: Vec<(VictimKey, VictimKind)> = Vec::new();
        let mut own_shares = Shares::ZERO;
        let running = &self.running[project.0 as usize];
        let own_below = match within_project {
            WithinProject::LowerPriority => running.any_below(priority),
            WithinProject::LowerOrNewerEqualPriority => {
                running.any_below(priority.saturating_add(1))
            }
            WithinProject::Never => false,
        };
        let own = if own_below { self.eligible_list(now, project, m, protect, lists) } else { &[] };
        for v in own {
            let newer = || {
                let vw = &self.workloads[&v.id];
                (vw.queued_at, v.id) > newer_than_claimant
            };
            let may = v.priority < priority
                || (within_project == WithinProject::LowerOrNewerEqualPriority
                    && v.priority == priority
                    && newer());
            if may {
                own_shares = own_shares.saturating_add(v.shares);
                candidates.push((self.victim_key(now, &self.workloads[&v.id], 1), VictimKind::Own));
            }
        }
        let guaranteed = self.quota.line(project, key)?.guaranteed;
        // Kueue reclaims only for a claimant under its guarantee now, and that can end within
        // it once its own lower-priority work is gone.
        let committed = self.committed(project, key, id);
        let reclaim_possible = committed < guaranteed
            && committed.saturating_sub(own_shares).saturating_add(total) <= guaranteed;
        let advantage = Advantage::of(self, project, key, cohort, total);
        // With `borrow_within_cohort`, borrowers' work below the claimant (and the threshold)
        // may be reclaimed even though the claimant borrows afterwards. In a tree of cohorts,
        // work outside the claimant's cohort may be reclaimed for a cohort that takes its own
        // quota back.
        let hierarchical = self.quota.parent[cohort].is_some();
        if reclaim_possible || borrow_within.is_some() || hierarchical {
            for q in 0..self.projects.len() {
                let q = ProjectId(q as u32);
                if q == project {
                    continue;
                }
                let Some(level) = self.reclaim_reaches(&advantage.chain, q, key, id) else {
                    continue;
                };
                let possible = if level == 0 {
                    reclaim_possible
                } else {
                    advantage.possible(self, level, id, own_shares)
                };
                for v in self.eligible_list(now, q, m, protect, lists) {
                    let while_borrowing =
                        borrow_within.is_some_and(|b| b.allows(v.priority, priority));
                    if v.line == Some(key) && (possible || while_borrowing) {
                        let vw = &self.workloads[&v.id];
                        let level = possible.then_some(level as u16);
                        let kind = match level {
                            Some(l) if !while_borrowing => VictimKind::Reclaim(l),
                            _ => VictimKind::ReclaimWhileBorrowing(level),
                        };
                        candidates.push((self.victim_key(now, vw, 0), kind));
                    }
                }
            }
        }
        // Fair sharing: other borrowers' work in the same tree that is no reclaim candidate,
        // taken (by share, below) only in passes that let the claimant borrow.
        if self.fair_sharing.is_some() {
            let root = self.quota.ancestors(cohort).last();
            let taken: BTreeSet<WorkloadId> = candidates.iter().map(|c| c.0.4).collect();
            for q in 0..self.projects.len() {
                let q = ProjectId(q as u32);
                if q == project
                    || self.quota.ancestors(self.projects[q.0 as usize].cohort).last() != root
                    || !self.borrows(q, key, id)
                {
                    continue;
                }
                for v in self.eligible_list(now, q, m, protect, lists) {
                    if v.line == Some(key) && !taken.contains(&v.id) {
                        let vw = &self.workloads[&v.id];
                        candidates.push((self.victim_key(now, vw, 0), VictimKind::FairShare));
                    }
                }
            }
        }
        // Idle victims: any project, priority up to the claimant's; an exempt or
        // non-preemptible workload is never ready. `pressure_ready` is this cycle's list
        // (`idle_pass`), so a deep queue does not scan every tracked workload per claimant.
        if !self.pressure_ready.is_empty() {
            let idle: BTreeSet<WorkloadId> = self
                .pressure_ready
                .iter()
                .copied()
                .filter(|&v| {
                    v != id
                        && self.workloads.get(&v).is_some_and(|vw| {
                            vw.priority <= priority
                                && self.idle_victim_eligible(vw, now, m, protect)
                        })
                })
                .collect();
            candidates.retain(|(k, _)| !idle.contains(&k.4));
            candidates.extend(
                idle.into_iter()
                    .map(|v| (self.victim_key(now, &self.workloads[&v], 0), VictimKind::Idle)),
            );
        }
        // A claimant that has not waited `reclaim_after` takes nothing back from borrowers yet
        // (its line is claimed meanwhile, so what borrowed work ends goes to it).
        if now.since(newer_than_claimant.0) < self.guard.reclaim_after_ms {
            candidates.retain(|c| !c.1.is_reclaim());
        }
        candidates.sort();

        // `within`: the claimant must fit within the quota of each level it reclaims at (its
        // own guarantee for work of its cohort; for work farther off in a tree of cohorts, the
        // cohort it shares no lower cohort with), and at the closest of them even before it
        // reclaims anything: not by borrowing.
        let closest = candidates.iter().filter_map(|c| c.1.level()).min();
        // `at`: how many of the victims lifted now are reclaimed at each level.
        let fits = |engine: &mut Engine, within: bool, at: &BTreeMap<usize, usize>| {
            let holds = |level: usize| advantage.holds(engine, level, id, guaranteed);
            engine.quota.view(project, key).is_some_and(|v| v.available >= total)
                && (!within || (closest.is_none_or(holds) && at.keys().all(|&l| holds(l))))
                && engine.capacity.can_place(Some(m), shape, members, layout)
        };
        let count = |at: &mut BTreeMap<usize, usize>, kind: VictimKind, up: bool| {
            if let Some(l) = kind.level() {
                let n = at.entry(l).or_default();
                *n = if up { *n + 1 } else { n.saturating_sub(1) };
                if *n == 0 {
                    at.remove(&l);
                }
            }
        };
        let any_reclaim = candidates.iter().any(|c| c.1.is_reclaim());
        // The passes of Kueue's classical algorithm, each (which reclaim candidates it takes,
        // whether the claimant must fit within its guarantee). Without `borrow_within_cohort`:
        // first every candidate, the claimant within its guarantee (so the pass goes on
        // removing, its own lower-priority work after the reclaim candidates, rather than
        // stop at a set where it would borrow), then no reclaim, borrowing allowed, so that a
        // failed reclaim never hides a priority pre-emption that works by itself. With it:
        // first reclaim only of what it allows, borrowing allowed, then every candidate
        // within the guarantee.
        let passes: &[(ReclaimTaken, bool)] = if borrow_within.is_some() {
            &[(ReclaimTaken::WhileBorrowing, false), (ReclaimTaken::All, true)]
        } else {
            &[(ReclaimTaken::All, any_reclaim), (ReclaimTaken::None, false)]
        };
        let mut tried: Vec<usize> = Vec::new();
        for &(taken, within) in passes {
            let pass: Vec<_> = candidates
                .iter()
                .filter(|c| taken.takes(c.1) && (c.1 != VictimKind::FairShare || !within))
                .collect();
            // A pass the same as one tried already, or one that needs the claimant within
            // its guarantee when it cannot be, is skipped.
            if pass.is_empty() || tried.contains(&pass.len()) || (within && closest.is_none()) {
                continue;
            }
            tried.push(pass.len());
            let mut removed: Vec<(WorkloadId, VictimKind)> = Vec::new();
            let mut at: BTreeMap<usize, usize> = BTreeMap::new();
            // Fair-sharing victims: the strategy that allowed each, and its shares.
            let mut by_share: BTreeMap<WorkloadId, (FairShareStrategy, u64, u64, u64)> =
                BTreeMap::new();
            let mut fit = false;
            for &&(k, kind) in &pass {
                let v = k.4;
                let v_project = self.workloads[&v].project;
                if kind == VictimKind::FairShare {
                    match self.fair_share_allows(project, key, id, total, v, &by_share) {
                        Some(allowed) => {
                            by_share.insert(v, allowed);
                        }
                        None => continue,
                    }
                }
                // A borrower back within its guarantee (or under a cohort that is) is not
                // reclaimed from any further.
                if kind.is_reclaim()
                    && self.reclaim_reaches(&advantage.chain, v_project, key, id).is_none()
                {
                    continue;
                }
                self.lift(v);
                removed.push((v, kind));
                count(&mut at, kind, true);
                if fits(self, within, &at) {
                    fit = true;
                    break;
                }
            }
            let mut kept_out = vec![true; removed.len()];
            if fit && removed.len() > 1 {
                for i in (0..removed.len() - 1).rev() {
                    self.unlift(removed[i].0);
                    count(&mut at, removed[i].1, false);
                    if fits(self, within, &at) {
                        kept_out[i] = false;
                    } else {
                        self.lift(removed[i].0);
                        count(&mut at, removed[i].1, true);
                    }
                }
            }
            // Reclaim is only for a claimant that ends within the quota of the level it
            // reclaims at, unless `borrow_within_cohort` allows that victim.
            let holds = |engine: &Engine, kind: VictimKind| {
                kind.level().is_some_and(|l| advantage.holds(engine, l, id, guaranteed))
            };
            let ok = fit
                && removed.iter().zip(&kept_out).all(|(r, &k)| {
                    !k || !matches!(r.1, VictimKind::Reclaim(_)) || holds(self, r.1)
                });
            let reclaim_levels: BTreeMap<WorkloadId, Option<usize>> = removed
                .iter()
                .filter(|r| r.1.is_reclaim())
                .map(|r| (r.0, holds(self, r.1).then(|| r.1.level()).flatten()))
                .collect();
            // The room the workload will take once its victims are gone.
            let placement =
                if ok { self.capacity.find(Some(m), shape, members, layout) } else { None };
            // Reasons are computed while the victims are still lifted, then the state is
            // restored.
            let mut victims = Vec::new();
            for (i, &(v, kind)) in removed.iter().enumerate().rev() {
                if !kept_out[i] {
                    continue;
                }
                self.unlift(v);
                if ok {
                    let vw = &self.workloads[&v];
                    let idle = (kind == VictimKind::Idle).then(|| self.idle_facts(v)).flatten();
                    let reason = if let Some(idle) = idle {
                        PreemptReason::Idle { idle, gpu_count_only: false }
                    } else if let Some(&(strategy, claimant_share, before, after)) =
                        by_share.get(&v)
                    {
                        PreemptReason::FairShare {
                            borrower: vw.project,
                            claimant: project,
                            key,
                            claimant_share,
                            borrower_share: before,
                            borrower_share_after: after,
                            strategy,
                        }
                    } else if kind.is_reclaim() {
                        let line =
                            self.quota.line(vw.project, key).map_or(Shares::ZERO, |l| l.guaranteed);
                        let borrowed = self.committed(vw.project, key, id).saturating_sub(line);
                        if let Some(level) = reclaim_levels[&v] {
                            PreemptReason::QuotaReclaim {
                                borrower: vw.project,
                                claimant: project,
                                key,
                                borrowed,
                                for_cohort: (level > 0)
                                    .then(|| self.cohort_names[advantage.chain[level - 1]].clone()),
                            }
                        } else {
                            PreemptReason::ReclaimWhileBorrowing {
                                borrower: vw.project,
                                claimant: project,
                                key,
                                borrowed,
                                victim_priority: vw.priority,
                                preemptor_priority: priority,
                            }
                        }
                    } else {
                        PreemptReason::Priority {
                            project,
                            victim_priority: vw.priority,
                            preemptor_priority: priority,
                        }
                    };
                    victims.push((v, reason));
                }
            }
            if let Some(placement) = placement {
                victims.sort_by_key(|(v, _)| *v);
                return Some((victims, placement));
            }
        }
        None
    }

    /// What a project's line will hold once the workloads told to stop are gone and its
    /// waiting pre-emptors (other than `except`) have started: the usage by which the arbiter
    /// judges who borrows and whether a claimant ends within its guarantee.
    pub(super) fn committed(
        &self,
        project: ProjectId,
        key: QuotaKey,
        except: WorkloadId,
    ) -> Shares {
        let used = self.quota.line(project, key).map_or(Shares::ZERO, |l| l.used);
        let stopping = self.stopping_shares.get(&(project, key)).copied().unwrap_or_default();
        let reserved = self.reserved_by_line.get(&(project, key)).copied().unwrap_or_default();
        let own = match self.reservations.get(&except) {
            Some(&(p, k, s)) if p == project && k == key => s,
            _ => Shares::ZERO,
        };
        used.saturating_sub(stopping).saturating_add(reserved.saturating_sub(own))
    }

    /// Whether a claimant in cohort `claimant_cohort` may reclaim `q`'s work on `key`: `q`
    /// borrows (by its committed usage), it is in the same cohort tree, and every cohort
    /// between `q`'s and the lowest one above both takes more from its parent than it put in
    /// (Kueue: a candidate is skipped once any level between it and the common ancestor is
    /// back within its quota).
    /// With the level of the claimant's advantage: 0 when `q` is in the claimant's cohort,
    /// `k` when the lowest cohort above both is `chain[k]` (the claimant's cohort's `k`-th
    /// ancestor). `chain`: the claimant's cohort and its ancestors, nearest first.
    fn reclaim_reaches(
        &self,
        chain: &[usize],
        q: ProjectId,
        key: QuotaKey,
        except: WorkloadId,
    ) -> Option<usize> {
        if !self.borrows(q, key, except) {
            return None;
        }
        let mut c = self.projects[q.0 as usize].cohort;
        loop {
            if let Some(level) = chain.iter().position(|&a| a == c) {
                return Some(level);
            }
            let borrowing = self.quota.pools[c].get(&key).is_some_and(|p| p.used > p.subtree);
            match self.quota.parent[c] {
                Some(up) if borrowing => c = up,
                _ => return None,
            }
        }
    }

    /// A project's share on `key` (Kueue's dominant resource share for one resource): what it
    /// borrows by its committed usage (with `add` more and `remove` less), over the most its cohort's pool could
    /// ever give, in millionths, over its weight; 0 when it does not borrow, `u64::MAX` when it
    /// borrows with weight 0.
    fn borrowing_share(
        &self,
        q: ProjectId,
        key: QuotaKey,
        except: WorkloadId,
        add: Shares,
        remove: Shares,
    ) -> u64 {
        let Some(line) = self.quota.line(q, key) else { return 0 };
        let used = self.committed(q, key, except).saturating_add(add).saturating_sub(remove);
        let borrowed = used.saturating_sub(line.guaranteed).0 as u128;
        if borrowed == 0 {
            return 0;
        }
        let p = &self.projects[q.0 as usize];
        if p.weight_milli == 0 {
            return u64::MAX;
        }
        let lendable = self.quota.pool_potential(p.cohort, key).0.max(1) as u128;
        (borrowed * 1_000_000 * 1000 / lendable / p.weight_milli as u128).min(u64::MAX as u128)
            as u64
    }

    /// Whether the policy's fair-sharing strategies let `claimant` (of `project`, asking
    /// `total`) take `v` now, and by which, with (claimant's share with the workload, the
    /// borrower's share now, without `v`). The second strategy takes at most one victim per
    /// borrower (`taken`: the victims so far).
    fn fair_share_allows(
        &self,
        project: ProjectId,
        key: QuotaKey,
        claimant: WorkloadId,
        total: Shares,
        v: WorkloadId,
        taken: &BTreeMap<WorkloadId, (FairShareStrategy, u64, u64, u64)>,
    ) -> Option<(FairShareStrategy, u64, u64, u64)> {
        let fs = self.fair_sharing.as_ref()?;
        let vw = &self.workloads[&v];
        let q = vw.project;
        if !self.borrows(q, key, claimant) {
            return None;
        }
        let shares = vw.allocation.as_ref().map_or(Shares::ZERO, |a| a.shares);
        let mine = self.borrowing_share(project, key, claimant, total, Shares::ZERO);
        // Asked before `v` is lifted (the victims chosen before it are): its project's share
        // now, and without it.
        let before = self.borrowing_share(q, key, claimant, Shares::ZERO, Shares::ZERO);
        let after = self.borrowing_share(q, key, claimant, Shares::ZERO, shares);
        fs.strategies.iter().copied().find_map(|s| {
            let ok = match s {
                FairShareStrategy::LessThanOrEqualToFinalShare => mine <= after,
                FairShareStrategy::LessThanInitialShare => {
                    mine < before
                        && !taken.iter().any(|(t, (ts, ..))| {
                            *ts == s && self.workloads.get(t).is_some_and(|tw| tw.project == q)
                        })
                }
            };
            ok.then_some((s, mine, before, after))
        })
    }

    /// Whether `project` borrows on `key` by its committed usage (see `committed`).
    fn borrows(&self, project: ProjectId, key: QuotaKey, except: WorkloadId) -> bool {
        self.quota
            .line(project, key)
            .is_some_and(|l| self.committed(project, key, except) > l.guaranteed)
    }

    /// Tells an admitted workload to stop: it is no pre-emption candidate any more and no
    /// lasting usage, though it holds its devices and quota until the backend reports the stop.
    pub(super) fn mark_stopping(&mut self, id: WorkloadId, kind: StopKind) {
        let Some(w) = self.workloads.get_mut(&id) else { return };
        w.stage = Stage::Stopping;
        w.stop_kind = Some(kind);
        self.running[w.project.0 as usize].remove(id, w.priority);
        if let Some(a) = &w.allocation
            && let Some(key) = a.key
        {
            let shares = a.shares;
            adjust_line_total(&mut self.stopping_shares, (w.project, key), |t| {
                t.saturating_add(shares)
            });
        }
    }

    /// A pre-emptor stops waiting (its victims are gone, or it left the engine).
    pub(super) fn end_wait(&mut self, id: WorkloadId) {
        self.preemptors.remove(&id);
        if let Some((p, k, s)) = self.reservations.remove(&id) {
            adjust_line_total(&mut self.reserved_by_line, (p, k), |t| t.saturating_sub(s));
        }
        self.planned.remove(&id);
    }

    /// Project `q`'s running work on model `m` that may be a victim at `now`, from `lists` or
    /// made there.
    fn eligible_list<'a>(
        &self,
        now: Timestamp,
        q: ProjectId,
        m: ModelId,
        protect: bool,
        lists: &'a mut EligibleLists,
    ) -> &'a [Eligible] {
        lists.entry((q, m)).or_insert_with(|| {
            self.running[q.0 as usize]
                .iter()
                .map(|v| &self.workloads[v])
                .filter(|vw| self.victim_eligible(vw, now, m, protect))
                .map(|vw| Eligible {
                    id: vw.spec.id,
                    priority: vw.priority,
                    shares: vw.spec.total_shares(),
                    line: vw.allocation.as_ref().and_then(|a| a.key),
                })
                .collect()
        })
    }

    /// A running workload that may be stopped for other work on model `m`: running there
    /// and, with `protect`, started and not protected (`guard.rs`).
    fn victim_eligible(
        &self,
        v: &WorkloadState,
        now: Timestamp,
        m: ModelId,
        protect: bool,
    ) -> bool {
        running_on(v, m) && (!protect || (started(v) && self.protection(now, v).is_none()))
    }

    /// As `victim_eligible`, for an idle victim: its idle rule judged it, so only its own
    /// flag and min runtime protect it, not the policy's guard against thrash.
    fn idle_victim_eligible(
        &self,
        v: &WorkloadState,
        now: Timestamp,
        m: ModelId,
        protect: bool,
    ) -> bool {
        running_on(v, m)
            && (!protect
                || (started(v)
                    && !matches!(
                        self.protection(now, v),
                        Some(Protection::NotPreemptible | Protection::MinRuntime { .. })
                    )))
    }

    pub(super) fn victim_key(&self, now: Timestamp, v: &WorkloadState, tier: u8) -> VictimKey {
        let started = v.allocation.as_ref().and_then(|a| a.started_at).unwrap_or(now);
        let cost = victim_cost(now, v, self.idle_discount_ms(v.spec.id), self.restart_cost_ms);
        (tier, v.priority, cost, Reverse(started), v.spec.id)
    }

    /// Temporarily frees a running workload's quota and devices (the arbiter's what-if).
    pub(super) fn lift(&mut self, v: WorkloadId) {
        self.book_resources(v, false);
    }

    /// Exact inverse of `lift`.
    pub(super) fn unlift(&mut self, v: WorkloadId) {
        self.book_resources(v, true);
    }

    pub(super) fn start_preemption(
        &mut self,
        preemptor: WorkloadId,
        key: QuotaKey,
        victims: Vec<(WorkloadId, PreemptReason)>,
        placement: Placement,
    ) -> Vec<Decision> {
        let mut decisions = Vec::with_capacity(victims.len());
        for (v, reason) in victims {
            let Some(vw) = self.workloads.get(&v) else { continue };
            let checkpoint_grace_ms = vw.spec.checkpointing.map(|c| c.grace_ms);
            // An idle victim gets its rule's action and the idle backoff; others the mode of
            // their project.
            let (mode, kind) = match &reason {
                PreemptReason::Idle { idle, .. } => (idle.action, StopKind::Idle(idle.action)),
                _ => {
                    let mode = self.projects[vw.project.0 as usize].mode;
                    (mode, StopKind::Preempted(mode))
                }
            };
            self.mark_stopping(v, kind);
            decisions.push(Decision::Preempt {
                victim: v,
                for_workload: preemptor,
                mode,
                reason,
                checkpoint_grace_ms,
            });
        }
        if let Some(w) = self.workloads.get_mut(&preemptor) {
            w.waiting_for = decisions.iter().map(Decision::workload).collect();
            let shares = w.spec.total_shares();
            self.reservations.insert(preemptor, (w.project, key, shares));
            adjust_line_total(&mut self.reserved_by_line, (w.project, key), |t| {
                t.saturating_add(shares)
            });
        }
        self.preemptors.insert(preemptor);
        self.planned.insert(preemptor, placement);
        // Hold its free room for the rest of this cycle too.
        self.hold_plan(preemptor);
        decisions
    }
}

fn running_on(v: &WorkloadState, m: ModelId) -> bool {
    v.stage == Stage::Running && v.allocation.as_ref().is_some_and(|a| a.placement.model == Some(m))
}

fn started(v: &WorkloadState) -> bool {
    v.allocation.as_ref().is_some_and(|a| a.started_at.is_some())
}

/// A possible victim as `EligibleList`s keep it.
pub(super) struct Eligible {
    id: WorkloadId,
    priority: i32,
    shares: Shares,
    line: Option<QuotaKey>,
}

/// Possible victims per (project, model), made on demand (`Engine::eligible_list`).
pub(super) type EligibleLists = std::collections::BTreeMap<(ProjectId, ModelId), Vec<Eligible>>;

/// Why a running workload is a pre-emption candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum VictimKind {
    /// Its project borrows on the claimant's line and the claimant needs its guarantee (or,
    /// in a tree of cohorts, its cohort's quota) back: at this level (`Advantage`).
    Reclaim(u16),
    /// As `Reclaim`, and the claimant's `borrow_within_cohort` allows taking it even though
    /// the claimant borrows afterwards; with the level at which an ordinary reclaim would be
    /// possible too.
    ReclaimWhileBorrowing(Option<u16>),
    /// Another borrower's work, taken by the policy's fair-sharing strategies.
    FairShare,
    /// The claimant's own project, lower priority.
    Own,
    /// Idle past its `on_pressure` rule's timer and warned.
    Idle,
}

/// Where a claimant's right to reclaim is judged. Level 0: its own line (the victim is of its
/// cohort): it must end within its guarantee. Level `k`: the victim is outside the claimant's
/// cohort and the lowest cohort above both is `chain[k]`; the claimant must keep
/// `chain[k - 1]` (the cohort below it on the claimant's side) within that cohort's quota —
/// Kueue's hierarchical advantage.
struct Advantage {
    chain: Vec<usize>,
    project: ProjectId,
    key: QuotaKey,
    total: Shares,
}

impl Advantage {
    fn of(
        engine: &Engine,
        project: ProjectId,
        key: QuotaKey,
        cohort: usize,
        total: Shares,
    ) -> Self {
        Advantage { chain: engine.quota.ancestors(cohort).collect(), project, key, total }
    }

    /// The pool at which level `level > 0` is judged, as (used, subtree).
    fn pool(&self, engine: &Engine, level: usize) -> (Shares, Shares) {
        engine.quota.pools[self.chain[level - 1]]
            .get(&self.key)
            .map_or((Shares::ZERO, Shares::ZERO), |p| (p.used, p.subtree))
    }

    /// Whether the claimant could ever end within that level's quota: with its own
    /// project's work there less `own`, were everything else under that cohort reclaimed.
    fn possible(&self, engine: &Engine, level: usize, id: WorkloadId, own: Shares) -> bool {
        let (_, subtree) = self.pool(engine, level);
        let mine = engine.committed(self.project, self.key, id);
        mine.saturating_sub(own).saturating_add(self.total) <= subtree
    }

    /// Whether the claimant, admitted now, stays within that level's quota.
    fn holds(&self, engine: &Engine, level: usize, id: WorkloadId, guaranteed: Shares) -> bool {
        if level == 0 {
            return engine.committed(self.project, self.key, id).saturating_add(self.total)
                <= guaranteed;
        }
        let (used, subtree) = self.pool(engine, level);
        used.saturating_add(self.total) <= subtree
    }
}

impl VictimKind {
    fn is_reclaim(self) -> bool {
        matches!(self, VictimKind::Reclaim(_) | VictimKind::ReclaimWhileBorrowing(_))
    }

    /// The level of the claimant's advantage over it, for a reclaim that may be ordinary.
    fn level(self) -> Option<usize> {
        match self {
            VictimKind::Reclaim(l) | VictimKind::ReclaimWhileBorrowing(Some(l)) => {
                Some(usize::from(l))
            }
            _ => None,
        }
    }
}

/// Which reclaim candidates a victim pass takes (own and idle candidates it always takes).
#[derive(Clone, Copy, PartialEq, Eq)]
enum ReclaimTaken {
    All,
    WhileBorrowing,
    None,
}

impl ReclaimTaken {
    fn takes(self, kind: VictimKind) -> bool {
        match kind {
            VictimKind::Reclaim(_) => self == ReclaimTaken::All,
            VictimKind::ReclaimWhileBorrowing(_) => self != ReclaimTaken::None,
            VictimKind::Own | VictimKind::Idle | VictimKind::FairShare => true,
        }
    }
}

/// The arbiter's one cost of stopping `v` now, in GPU-ms (ARCHITECTURE.md, "One cost"): the
/// work lost since its last checkpoint (since its start if it has none) less the time it has
/// been idle (idle time is no work), plus `restart_cost_ms`, both per GPU it holds — so a gang
/// costs in proportion to its size.
pub(crate) fn victim_cost(
    now: Timestamp,
    v: &WorkloadState,
    idle_ms: u64,
    restart_cost_ms: u64,
) -> u64 {
    let shares = v.spec.total_shares().0;
    let started = v.allocation.as_ref().and_then(|a| a.started_at).unwrap_or(now);
    let since = v.last_checkpoint_at.filter(|&c| c > started).unwrap_or(started);
    let lost = now.since(since).saturating_sub(idle_ms);
    shares.saturating_mul(lost.saturating_add(restart_cost_ms)) / SHARES_PER_GPU
}
