//! Defragmentation: the arbiter's third kind of plan (after priority and quota reclaim).
//!
//! A pending workload of whole GPUs that passes quota but finds no placement, while at least
//! as many whole GPUs of the model are free in total as it asks, is blocked by fragmentation,
//! not by capacity. The arbiter then looks for the cheapest set of running work to move out
//! of its way — same victim order (`victim_key`), same what-if (`lift`/`unlift`), same
//! minimisation and the same `Preempt` decisions as priority pre-emption — under these rules:
//!
//! - candidates run on the model, are not protected (`guard.rs`: preemptible, past their min
//!   runtime, not restarted within `exempt_after_restart`, not capped), of priority at most
//!   the claimant's (a lower priority never pushes out a higher one), and their project's
//!   pre-emption mode is `suspend` or `requeue` (a move, never a delete);
//! - per target node (the nodes holding candidates, cheapest estimate first, at most
//!   `DEFRAG_TARGETS_MAX`), the candidates on that node go first, then the rest, each in victim
//!   order, until the claimant fits; then every victim but the last is put back if it still
//!   fits; the cheapest resulting plan wins (cost, then fewer victims, then node id);
//! - **cost** (GPU-ms) of a victim = its GPUs × (time since its last checkpoint if it is
//!   checkpointable, else since it started) + its GPUs × the policy's `restart_cost_ms`;
//!   **gain** (GPU-ms) = the claimant's GPUs × the time it has waited since it last became
//!   pending (submitted, or requeued after a stop);
//! - a plan is carried out only when every victim can be re-placed elsewhere at once (after
//!   the claimant takes its room; each victim in turn on a model it accepts, within its
//!   quota) or the gain exceeds the cost — and a plan that would leave another project below
//!   its guarantee only when all victims can be re-placed (moving is allowed, shrinking a
//!   guarantee is not);
//! - it runs after the priority/reclaim arbiter found nothing, and, like it, not again in the
//!   same cycle for a request shape that already failed;
//! - with `consolidate_shares`, a claimant of one member (GPU shares, or whole GPUs) is also
//!   blocked by fragmentation when its model has the shares it asks free in total. Per target
//!   node, each device of the model is opened by lifting its single-member candidates, the
//!   smallest first, that could fit some device's free shares elsewhere (others could never
//!   restart at once); the devices opened with the fewest victims (then the cheapest) are
//!   the plan, if the node's CPU and memory then fit the claimant too, and only those victims
//!   are lifted. Moving fractional work into partly used devices elsewhere is what opens the
//!   room, so `replaceable` is the rule that usually lets it run;
//! - with `victims_max`, a plan that moves more workloads is not made.

use std::collections::BTreeSet;

use super::preempt::{VictimKey, victim_cost};
use super::{Engine, Stage, WorkloadState};
use crate::capacity::Layout;
use crate::decision::{Placement, PreemptReason, QuotaKey};
use crate::ids::{ModelId, NodeId, ProjectId, SHARES_PER_GPU, Shares, Timestamp, WorkloadId};
use crate::model::{Defragmentation, GpuRequest, PreemptionMode};

/// Most target nodes a defragmentation plan is tried for, per workload and model.
const DEFRAG_TARGETS_MAX: usize = 8;

/// A plan, the arbiter's victims with their reasons, and the room the claimant will take.
pub(crate) type PlannedDefrag = (DefragPlan, Vec<(WorkloadId, PreemptReason)>, Placement);

/// A defragmentation plan: who moves, what it frees, and the books behind the choice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DefragPlan {
    pub model: ModelId,
    /// The node the plan targets and the whole free devices of the model it has once the
    /// victims are gone.
    pub node: NodeId,
    pub frees_block: u32,
    pub victims: Vec<DefragVictim>,
    /// GPU-ms the claimant has waited (its GPUs × time queued).
    pub gain_gpu_ms: u64,
    /// GPU-ms lost by the victims plus their restart cost.
    pub cost_gpu_ms: u64,
    /// Every victim can be placed elsewhere at once.
    pub replaceable: bool,
    /// A victim belongs to another project that is within its guarantee.
    pub touches_guarantee: bool,
}

impl DefragPlan {
    /// Whether the rules let the engine carry it out (module docs).
    pub fn allowed(&self) -> bool {
        self.replaceable || (!self.touches_guarantee && self.gain_gpu_ms > self.cost_gpu_ms)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DefragVictim {
    pub workload: WorkloadId,
    /// What it holds, in shares.
    pub held: Shares,
    /// Time since its last checkpoint; `None` when it is not checkpointable or never saved.
    pub checkpoint_age_ms: Option<u64>,
    /// Its cost in the plan: lost GPU-ms plus restart.
    pub cost_gpu_ms: u64,
}

impl Engine {
    /// Whether `id` is blocked on `m` by fragmentation alone: whole GPUs asked, at least two,
    /// and at least that many whole GPUs of `m` free in the cluster.
    pub(crate) fn fragmented_for(&self, id: WorkloadId, m: ModelId) -> bool {
        let Some(w) = self.workloads.get(&id) else { return false };
        let GpuRequest::Whole(k) = w.spec.gpus_per_member else { return false };
        let need = u64::from(k) * u64::from(w.spec.members);
        need >= 2 && self.capacity.free_whole.get(m.0 as usize).is_some_and(|&f| f >= need)
    }

    /// Plans the cheapest defragmentation for `id` on model `m` (charged to `key`), allowed
    /// or not (`DefragPlan::allowed`); `None` when no set of candidates makes room. The state
    /// is unchanged on return.
    pub(crate) fn plan_defrag(
        &mut self,
        now: Timestamp,
        id: WorkloadId,
        m: ModelId,
        key: QuotaKey,
        policy: Defragmentation,
    ) -> Option<PlannedDefrag> {
        let consolidate = policy.consolidate_shares && self.consolidation_claimant(id, m);
        if !consolidate && !self.fragmented_for(id, m) {
            return None;
        }
        let w = self.workloads.get(&id)?;
        let (project, priority, total) = (w.project, w.priority, w.spec.total_shares());
        let (shape, members) = (w.shape(), w.spec.members);
        let layout = Layout::of(w.spec.same_node, w.spec.prefer_same_node);
        let block_needed = match shape.gpus {
            GpuRequest::Whole(k) if layout == Layout::SameNode => k.saturating_mul(members),
            GpuRequest::Whole(k) => k,
            _ if consolidate => 0,
            _ => return None,
        };
        let gain = total.0.saturating_mul(now.since(w.pending_since)) / SHARES_PER_GPU;
        let (cpu, mem) = (shape.cpu, shape.mem);

        // Candidates, in victim order, with their cost.
        let mut candidates: Vec<(VictimKey, u64)> = Vec::new();
        for running in &self.running {
            for &v in running {
                let Some(vw) = self.workloads.get(&v) else { continue };
                if v != id && self.defrag_candidate(now, vw, m, priority, consolidate) {
                    let cost =
                        victim_cost(now, vw, self.idle_discount_ms(v), policy.restart_cost_ms);
                    candidates.push((self.victim_key(now, vw, 0), cost));
                }
            }
        }
        candidates.sort();
        if candidates.is_empty() {
            return None;
        }

        // Target nodes by an estimate: the victim-order prefix on the node that frees the block.
        let mut on_node: std::collections::BTreeMap<NodeId, Vec<usize>> = Default::default();
        for (i, (k, _)) in candidates.iter().enumerate() {
            let nodes: BTreeSet<NodeId> = self
                .workloads
                .get(&k.4)
                .and_then(|v| v.allocation.as_ref())
                .map(|a| a.placement.members.iter().map(|mp| mp.node).collect())
                .unwrap_or_default();
            for n in nodes {
                on_node.entry(n).or_default().push(i);
            }
        }
        let mut targets: Vec<(u64, NodeId)> = Vec::new();
        // Consolidation: per target, the candidates to lift, and the most shares any device
        // has free (a victim asking more can never restart at once).
        let mut consolidation_lifts: std::collections::BTreeMap<NodeId, Vec<usize>> =
            Default::default();
        let rooms = if consolidate { FreeRooms::of(self) } else { FreeRooms::default() };
        for (&n, idx) in &on_node {
            if consolidate {
                if let Some((est, lifts)) =
                    self.room_after_lifting(n, idx, &candidates, m, shape, &rooms)
                {
                    targets.push((est, n));
                    consolidation_lifts.insert(n, lifts);
                }
                continue;
            }
            let mut have = self.capacity.nodes[n.0 as usize].whole_free(m);
            let mut est = 0u64;
            for &i in idx {
                if have >= block_needed {
                    break;
                }
                have += self.devices_held_on(candidates[i].0.4, n);
                est = est.saturating_add(candidates[i].1);
            }
            if have >= block_needed {
                targets.push((est, n));
            }
        }
        targets.sort();

        let fits = |engine: &mut Engine| -> bool {
            engine.quota.view(project, key).is_some_and(|v| v.available >= total)
                && engine.capacity.can_place(Some(m), shape, members, layout)
        };
        let mut best: Option<(DefragPlan, Vec<WorkloadId>, Placement)> = None;
        for &(_, target) in targets.iter().take(DEFRAG_TARGETS_MAX) {
            let mut order: Vec<usize> = on_node.get(&target).cloned().unwrap_or_default();
            if consolidate {
                order = consolidation_lifts.get(&target).cloned().unwrap_or_default();
            } else {
                let first: BTreeSet<usize> = order.iter().copied().collect();
                order.extend((0..candidates.len()).filter(|i| !first.contains(i)));
            }
            let mut removed: Vec<usize> = Vec::new();
            let mut fit = false;
            for i in order {
                self.lift(candidates[i].0.4);
                removed.push(i);
                if fits(self) {
                    fit = true;
                    break;
                }
            }
            let mut kept_out = vec![true; removed.len()];
            if fit && removed.len() > 1 {
                for j in (0..removed.len() - 1).rev() {
                    self.unlift(candidates[removed[j]].0.4);
                    if fits(self) {
                        kept_out[j] = false;
                    } else {
                        self.lift(candidates[removed[j]].0.4);
                    }
                }
            }
            let victims: Vec<usize> =
                removed.iter().zip(&kept_out).filter(|(_, k)| **k).map(|(&i, _)| i).collect();
            let placement =
                if fit { self.capacity.find(Some(m), shape, members, layout) } else { None };
            let plan = placement.as_ref().map(|placement| {
                let ids: Vec<WorkloadId> = victims.iter().map(|&i| candidates[i].0.4).collect();
                // Consolidation lifts only the target's work, so the claimant lands there.
                let node = if consolidate {
                    target
                } else {
                    placement
                        .members
                        .iter()
                        .map(|mp| mp.node)
                        .find(|n| ids.iter().any(|&v| self.devices_held_on(v, *n) > 0))
                        .unwrap_or(target)
                };
                let frees_block = self.capacity.nodes[node.0 as usize].whole_free(m);
                let touches_guarantee = ids.iter().any(|v| {
                    self.workloads.get(v).is_some_and(|vw| {
                        vw.project != project
                            && vw.allocation.as_ref().and_then(|a| a.key).is_some_and(|vk| {
                                // Lifted now: below its guarantee once the victims are gone.
                                self.quota.line(vw.project, vk).is_some_and(|l| {
                                    self.committed(vw.project, vk, id) < l.guaranteed
                                })
                            })
                    })
                });
                let claimant = (project, key, total, cpu, mem);
                let replaceable = self.victims_replaceable(&ids, claimant, placement);
                let victims_out: Vec<DefragVictim> = victims
                    .iter()
                    .map(|&i| {
                        let v = candidates[i].0.4;
                        let vw = &self.workloads[&v];
                        DefragVictim {
                            workload: v,
                            held: vw.spec.total_shares(),
                            checkpoint_age_ms: vw
                                .spec
                                .checkpointing
                                .and(vw.last_checkpoint_at)
                                .map(|c| now.since(c)),
                            cost_gpu_ms: candidates[i].1,
                        }
                    })
                    .collect();
                let cost =
                    victims_out.iter().map(|v| v.cost_gpu_ms).fold(0u64, u64::saturating_add);
                (
                    DefragPlan {
                        model: m,
                        node,
                        frees_block,
                        victims: victims_out,
                        gain_gpu_ms: gain,
                        cost_gpu_ms: cost,
                        replaceable,
                        touches_guarantee,
                    },
                    ids,
                    placement.clone(),
                )
            });
            for &i in removed.iter().zip(&kept_out).filter(|(_, k)| **k).map(|(i, _)| i) {
                self.unlift(candidates[i].0.4);
            }
            let within_cap = |p: &DefragPlan| {
                policy.victims_max.is_none_or(|cap| p.victims.len() <= cap as usize)
            };
            if let Some(plan) = plan.filter(|p| within_cap(&p.0)) {
                let better = best.as_ref().is_none_or(|(b, _, _)| {
                    (!plan.0.allowed(), plan.0.cost_gpu_ms, plan.0.victims.len(), plan.0.node)
                        < (!b.allowed(), b.cost_gpu_ms, b.victims.len(), b.node)
                });
                if better {
                    best = Some(plan);
                }
            }
        }
        let (plan, ids, placement) = best?;
        let reasons = ids
            .into_iter()
            .map(|v| {
                (
                    v,
                    PreemptReason::Defragment {
                        model: plan.model,
                        node: plan.node,
                        frees_block: plan.frees_block,
                        gain_gpu_ms: plan.gain_gpu_ms,
                        cost_gpu_ms: plan.cost_gpu_ms,
                        replaceable: plan.replaceable,
                    },
                )
            })
            .collect();
        Some((plan, reasons, placement))
    }

    /// Whether `id` may be planned for by consolidation on `m`: one member asking GPU shares or
    /// whole GPUs, and at least that many shares of `m` free in the cluster.
    fn consolidation_claimant(&self, id: WorkloadId, m: ModelId) -> bool {
        let Some(w) = self.workloads.get(&id) else { return false };
        let asks = match w.spec.gpus_per_member {
            GpuRequest::Whole(k) => k > 0,
            GpuRequest::Shares(s) => s > 0,
            _ => false,
        };
        let need = w.spec.total_shares().0;
        asks && w.spec.members == 1
            && self.capacity.free_shares.get(m.0 as usize).is_some_and(|&f| f >= need)
    }

    /// Consolidation's plan for target `n` (module docs): the candidates `on_node` holds
    /// there to lift, and their summed cost; `None` when no choice of them makes room. Counts
    /// only, nothing is lifted.
    fn room_after_lifting(
        &self,
        n: NodeId,
        on_node: &[usize],
        candidates: &[(VictimKey, u64)],
        m: ModelId,
        shape: crate::capacity::MemberShape,
        rooms: &FreeRooms,
    ) -> Option<(u64, Vec<usize>)> {
        let node = &self.capacity.nodes[n.0 as usize];
        if node.unavailable {
            return None;
        }
        let full = SHARES_PER_GPU as u32;
        let (need, devices_needed) = match shape.gpus {
            GpuRequest::Shares(s) => (s, 1usize),
            GpuRequest::Whole(k) => (full, k as usize),
            _ => return None,
        };
        // Per device: the movable candidates on it alone (single member, one device, and some
        // device's free shares with its node's free CPU and memory could take them), as
        // (shares, cost, index).
        let mut on_device: std::collections::BTreeMap<u16, Vec<(u32, u64, usize)>> =
            Default::default();
        // Movable CPU-only work on the node: (CPU, memory, index).
        let mut host_only: Vec<(u64, u64, usize)> = Vec::new();
        for &i in on_node {
            let Some(v) = self.workloads.get(&candidates[i].0.4) else { continue };
            let Some(a) = v.allocation.as_ref() else { continue };
            let [member] = a.placement.members.as_slice() else { continue };
            if member.devices.is_empty() {
                let vs = v.shape();
                if member.node == n && rooms.may_take(0, vs.cpu, vs.mem) {
                    host_only.push((vs.cpu, vs.mem, i));
                }
                continue;
            }
            let [d] = member.devices.as_slice() else { continue };
            let vs = v.shape();
            if member.node == n && d.mig.is_none() && rooms.may_take(d.shares, vs.cpu, vs.mem) {
                on_device.entry(d.device).or_default().push((d.shares, candidates[i].1, i));
            }
        }
        // Per device of the model: the fewest, smallest victims that leave `need` free.
        let mut options: Vec<(usize, u64, Vec<usize>, u64, u64)> = Vec::new();
        for (dev, d) in node.devices.iter().enumerate() {
            if d.model != m || d.mig_in_use() {
                continue;
            }
            let mut free = d.free;
            let (mut cost, mut cpu, mut mem) = (0u64, 0u64, 0u64);
            let mut lifts = Vec::new();
            let mut victims = on_device.get(&(dev as u16)).cloned().unwrap_or_default();
            victims.sort();
            for (shares, c, i) in victims {
                if free >= need {
                    break;
                }
                free = (free + shares).min(full);
                cost = cost.saturating_add(c);
                if let Some(v) = self.workloads.get(&candidates[i].0.4) {
                    let vs = v.shape();
                    cpu = cpu.saturating_add(vs.cpu);
                    mem = mem.saturating_add(vs.mem);
                }
                lifts.push(i);
            }
            if free >= need {
                options.push((lifts.len(), cost, lifts, cpu, mem));
            }
        }
        if options.len() < devices_needed {
            return None;
        }
        options.sort();
        let chosen = &options[..devices_needed];
        let mut cpu = node.free_cpu.saturating_add(chosen.iter().map(|o| o.3).sum());
        let mut mem = node.free_mem.saturating_add(chosen.iter().map(|o| o.4).sum());
        let est = chosen.iter().map(|o| o.1).fold(0u64, u64::saturating_add);
        let mut lifts: Vec<usize> = chosen.iter().flat_map(|o| o.2.iter().copied()).collect();
        // Short of CPU or memory: move CPU-only work off the node, the largest first.
        host_only.sort_by(|a, b| b.cmp(a));
        for (c, mm, i) in host_only {
            if cpu >= shape.cpu && mem >= shape.mem {
                break;
            }
            cpu = cpu.saturating_add(c);
            mem = mem.saturating_add(mm);
            lifts.push(i);
        }
        if cpu < shape.cpu || mem < shape.mem {
            return None;
        }
        lifts.sort_by_key(|&i| candidates[i].0);
        Some((est, lifts))
    }

    fn defrag_candidate(
        &self,
        now: Timestamp,
        v: &WorkloadState,
        m: ModelId,
        priority: i32,
        consolidate: bool,
    ) -> bool {
        // Consolidation may also move CPU-only work, to free a node's CPU and memory.
        let cpu_only = consolidate && v.spec.total_shares() == Shares::ZERO;
        v.stage == Stage::Running
            && v.priority <= priority
            && self.projects[v.project.0 as usize].mode != PreemptionMode::Delete
            && v.allocation.as_ref().is_some_and(|a| {
                (a.placement.model == Some(m) || cpu_only) && a.started_at.is_some()
            })
            && self.protection(now, v).is_none()
    }

    /// Whole devices `v` holds on `node`.
    fn devices_held_on(&self, v: WorkloadId, node: NodeId) -> u32 {
        self.workloads.get(&v).and_then(|w| w.allocation.as_ref()).map_or(0, |a| {
            a.placement
                .members
                .iter()
                .filter(|mp| mp.node == node)
                .map(|mp| {
                    mp.devices.iter().filter(|d| u64::from(d.shares) == SHARES_PER_GPU).count()
                        as u32
                })
                .sum()
        })
    }

    /// With the victims lifted: after the claimant takes `placement` (and its quota), can
    /// every victim, one by one, be placed again on a model it accepts, within quota? The
    /// state is unchanged on return.
    fn victims_replaceable(
        &mut self,
        victims: &[WorkloadId],
        claimant: (ProjectId, QuotaKey, Shares, u64, u64),
        placement: &Placement,
    ) -> bool {
        let (project, key, total, ccpu, cmem) = claimant;
        self.capacity.take(placement, ccpu, cmem);
        self.quota.charge(project, key, total);
        let mut undo: Vec<(Placement, u64, u64, ProjectId, QuotaKey, Shares)> = Vec::new();
        let mut all = true;
        for &v in victims {
            let Some(vw) = self.workloads.get(&v) else {
                all = false;
                break;
            };
            let (vp, shape, members, vtotal) =
                (vw.project, vw.shape(), vw.spec.members, vw.spec.total_shares());
            let layout = Layout::of(vw.spec.same_node, vw.spec.prefer_same_node);
            let models: Vec<ModelId> = self.candidate_models(vw).to_vec();
            let mut placed = false;
            for vm in models {
                let Some(vk) = self.quota.resolve(vp, QuotaKey::Model(vm)) else { continue };
                if self.quota.view(vp, vk).is_none_or(|q| q.available < vtotal) {
                    continue;
                }
                if let Some(p) = self.capacity.find(Some(vm), shape, members, layout) {
                    self.capacity.take(&p, shape.cpu, shape.mem);
                    self.quota.charge(vp, vk, vtotal);
                    undo.push((p, shape.cpu, shape.mem, vp, vk, vtotal));
                    placed = true;
                    break;
                }
            }
            if !placed {
                all = false;
                break;
            }
        }
        for (p, cpu, mem, vp, vk, vtotal) in undo.into_iter().rev() {
            self.quota.release(vp, vk, vtotal);
            self.capacity.give(&p, cpu, mem);
        }
        self.quota.release(project, key, total);
        self.capacity.give(placement, ccpu, cmem);
        all
    }
}

/// Per usable node: the most shares one device has free, and its free CPU and memory; for a
/// quick "could this work restart somewhere at once?" that tells models apart nowhere (so it
/// may say yes wrongly, never no wrongly). Answers are kept per shape: few shapes recur.
#[derive(Default)]
struct FreeRooms {
    /// (most free shares on one device, free CPU, free memory), most free shares first.
    nodes: Vec<(u32, u64, u64)>,
    answers: std::cell::RefCell<std::collections::BTreeMap<(u32, u64, u64), bool>>,
}

impl FreeRooms {
    fn of(engine: &Engine) -> FreeRooms {
        let mut nodes: Vec<(u32, u64, u64)> = engine
            .capacity
            .nodes
            .iter()
            .filter(|n| !n.unavailable)
            .map(|n| {
                let most = n.devices.iter().filter(|d| !d.mig_in_use()).map(|d| d.free).max();
                (most.unwrap_or(0), n.free_cpu, n.free_mem)
            })
            .collect();
        nodes.sort_by(|a, b| b.cmp(a));
        FreeRooms { nodes, answers: Default::default() }
    }

    fn may_take(&self, shares: u32, cpu: u64, mem: u64) -> bool {
        *self.answers.borrow_mut().entry((shares, cpu, mem)).or_insert_with(|| {
            self.nodes.iter().take_while(|n| n.0 >= shares).any(|&(_, c, m)| c >= cpu && m >= mem)
        })
    }
}
