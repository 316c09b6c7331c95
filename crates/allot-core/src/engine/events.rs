//! Facts in: `Engine::apply` folds one event into the state. A submission is resolved
//! against the policy (project, priority class, models, limits) and queued, or kept for
//! step 1's `Reject`; adopted work is booked where it already runs; a cancellation of
//! admitted work becomes a stop owed to step 2; starts, failures, stops and finishes move a
//! workload through its stages, requeueing or removing it. Valid GPU submissions also move
//! the recent CPU-per-GPU demand that placement keeps free CPU for.

use std::collections::BTreeSet;

use super::{
    Allocation, Engine, MEMBERS_MAX, Stage, StopKind, WHOLE_GPUS_PER_MEMBER_MAX, WorkloadState,
    demand,
};
use crate::decision::{Placement, QuotaKey, RejectReason, StopReason};
use crate::event::Event;
use crate::ids::{ModelId, NodeId, ProjectId, SHARES_PER_GPU, Timestamp, WorkloadId};
use crate::mig::COMPUTE_SLICES;
use crate::model::{GpuRequest, PreemptionMode, WorkloadSpec};

/// Decay of `recent_demand` per GPU submission: about the last thousand count.
const DEMAND_DECAY: u64 = 1024;

/// The CPU per whole GPU of the recent demand (CPU millicores, GPU shares).
pub(super) fn cpu_per_gpu((cpu, shares): (u64, u64)) -> u64 {
    let ratio = u128::from(cpu) * u128::from(SHARES_PER_GPU) / u128::from(shares.max(1));
    u64::try_from(ratio).unwrap_or(u64::MAX)
}

/// How the target mix counts one member of `spec` (accepting `models`); `None` for MIG
/// requests, which the gradient does not place.
fn demand_class(spec: &WorkloadSpec, models: &[ModelId]) -> Option<demand::DemandClass> {
    let (gpus, gpu_milli) = match spec.gpus_per_member {
        GpuRequest::Whole(0) => (0, 0),
        GpuRequest::Whole(k) => (u8::try_from(k).ok()?, SHARES_PER_GPU as u16),
        GpuRequest::Shares(s) => (1, u16::try_from(s).ok()?),
        GpuRequest::Mig(_) => return None,
    };
    let mut mask = if models.is_empty() { u64::MAX } else { 0 };
    for m in models {
        mask |= if m.0 < 64 { 1u64 << m.0 } else { u64::MAX };
    }
    let models = if gpus == 0 { u64::MAX } else { mask };
    Some(demand::DemandClass { cpu_millis: spec.cpu_millis_per_member, gpus, gpu_milli, models })
}

impl Engine {
    /// The target mix placement uses: the census's, while the fleet has no more models than
    /// a mix tells apart (else placement is best fit).
    pub(super) fn placement_mix(&self) -> Option<crate::packing::TargetMix> {
        if self.models.len() > crate::packing::ModelSet::MODELS_MAX {
            return None;
        }
        self.census.mix()
    }

    /// Applies one fact. Events about unknown workloads or nodes are ignored, so duplicated or
    /// late acknowledgements are harmless.
    pub fn apply(&mut self, now: Timestamp, event: Event) {
        self.advance(now);
        match event {
            Event::WorkloadSubmitted(spec) => self.submit(now, spec),
            Event::WorkloadAdopted { spec, placement } => self.adopt(now, spec, placement),
            Event::WorkloadCancelled { workload } => self.cancel(workload),
            Event::AllocationStarted { workload } => {
                if let Some(w) = self.workloads.get_mut(&workload)
                    && w.stage == Stage::Assumed
                    && let Some(alloc) = w.allocation.as_mut()
                {
                    w.stage = Stage::Running;
                    alloc.started_at = Some(now);
                    if let Some(max) = w.spec.max_runtime_ms {
                        self.deadlines.insert((Timestamp(now.0.saturating_add(max)), workload));
                    }
                    self.running[w.project.0 as usize].insert(workload, w.priority);
                    self.start_idle_tracking(workload, now);
                }
            }
            Event::AllocationFailed { workload, .. } => {
                if self.workloads.get(&workload).is_some_and(|w| w.stage == Stage::Assumed) {
                    self.release(workload);
                    self.requeue(workload);
                    if let Some(w) = self.workloads.get_mut(&workload) {
                        w.pending_since = now;
                    }
                }
            }
            Event::CheckpointSaved { workload } => {
                if let Some(w) = self.workloads.get_mut(&workload) {
                    w.last_checkpoint_at = Some(now);
                }
            }
            Event::WorkloadStopped { workload } => {
                let Some(w) = self.workloads.get(&workload) else { return };
                match (w.stage, w.stop_kind) {
                    (Stage::Pending, _) => {}
                    (
                        Stage::Stopping,
                        Some(kind @ (StopKind::Preempted(mode) | StopKind::Idle(mode))),
                    ) if mode != PreemptionMode::Delete => {
                        self.release(workload);
                        if matches!(kind, StopKind::Preempted(_)) {
                            self.record_preemption(workload, now);
                        }
                        if let Some(w) = self.workloads.get_mut(&workload) {
                            w.preemptions = w.preemptions.saturating_add(1);
                            if mode == PreemptionMode::Requeue {
                                // Requeued work starts over; the old checkpoint is gone.
                                w.last_checkpoint_at = None;
                            }
                            if matches!(kind, StopKind::Idle(_)) {
                                // Idle work gave its GPUs up for not using them: it queues
                                // again behind those who waited, not in its old place.
                                w.queued_at = now;
                                w.idle_suspended_at = Some(now);
                            }
                        }
                        self.requeue(workload);
                        if let Some(w) = self.workloads.get_mut(&workload) {
                            w.pending_since = now;
                        }
                        if matches!(kind, StopKind::Idle(_)) {
                            self.start_idle_backoff(workload, now);
                        }
                    }
                    _ => self.remove(workload),
                }
            }
            Event::WorkloadFinished { workload } => self.remove(workload),
            Event::ActivitySampled { workload, readings } => {
                self.observe_idle(now, workload, Some(&readings), None);
            }
            Event::ActivityProbed { workload, last_activity } => {
                self.observe_idle(now, workload, None, Some(last_activity));
                self.user_back(workload, last_activity);
            }
            Event::NodeUnavailable { node, reason } => {
                if (node.0 as usize) < self.capacity.nodes.len() {
                    self.capacity.set_unavailable(node);
                    self.unavailable.insert(node, reason);
                }
            }
            Event::NodeAvailable { node } => {
                if self.unavailable.remove(&node).is_some() {
                    self.capacity.set_available(node);
                }
            }
            Event::DevicesOccupied { node, devices, by } => self.occupy(node, &devices, by),
        }
    }

    /// Applies `Event::DevicesOccupied`: the node's occupied set becomes `devices` (those the
    /// node has).
    pub(crate) fn occupy(&mut self, node: NodeId, devices: &[u16], by: String) {
        let Some(count) = self.capacity.nodes.get(node.0 as usize).map(|n| n.devices.len()) else {
            return;
        };
        let now: BTreeSet<u16> =
            devices.iter().copied().filter(|&d| usize::from(d) < count).collect();
        let before = self.occupied.remove(&node).map(|o| o.devices).unwrap_or_default();
        for &d in before.difference(&now) {
            self.capacity.set_occupied(node, d, false);
        }
        for &d in &now {
            self.capacity.set_occupied(node, d, true);
        }
        if !now.is_empty() {
            self.occupied.insert(node, crate::engine::Occupancy { devices: now, by });
        }
    }

    fn submit(&mut self, now: Timestamp, spec: WorkloadSpec) {
        let id = spec.id;
        let Some((project, priority, preemptible, models)) = self.accept(&spec) else { return };
        self.note_demand(&spec, &models);
        let state = WorkloadState::new(spec, (project, priority, preemptible, models), now);
        self.workloads.insert(id, state);
        self.enqueue(id);
    }

    /// Work running outside allot, taken over where it runs (`Event::WorkloadAdopted`).
    fn adopt(&mut self, now: Timestamp, spec: WorkloadSpec, placement: Placement) {
        let id = spec.id;
        let Some((project, priority, preemptible, models)) = self.accept(&spec) else { return };
        let key = match self.adoptable(project, &spec, &placement) {
            Ok(key) => key,
            Err(detail) => {
                self.rejected.push((id, spec.name.clone(), RejectReason::CannotAdopt { detail }));
                return;
            }
        };
        let shares = spec.total_shares();
        let mut state = WorkloadState::new(spec, (project, priority, preemptible, models), now);
        state.stage = Stage::Running;
        state.allocation = Some(Allocation { key, placement, shares, started_at: Some(now) });
        if let Some(max) = state.spec.max_runtime_ms {
            self.deadlines.insert((Timestamp(now.0.saturating_add(max)), id));
        }
        self.workloads.insert(id, state);
        self.book_resources(id, true);
        let p = &mut self.projects[project.0 as usize];
        p.allocated = p.allocated.saturating_add(shares);
        self.running[project.0 as usize].insert(id, priority);
        self.start_idle_tracking(id, now);
    }

    /// The quota line adopted work is charged to, if its placement matches its request, its
    /// devices are free and its project's quota can hold it; else what is wrong.
    fn adoptable(
        &self,
        project: ProjectId,
        spec: &WorkloadSpec,
        placement: &Placement,
    ) -> Result<Option<QuotaKey>, String> {
        if placement.members.len() != spec.members as usize {
            return Err(format!(
                "{} members placed for {} requested",
                placement.members.len(),
                spec.members
            ));
        }
        let per_member = spec.gpus_per_member.shares().0;
        if matches!(spec.gpus_per_member, GpuRequest::Mig(_)) {
            return Err("MIG instances are not adopted (their layout is not known)".into());
        }
        let model = placement.model;
        let mut seen = BTreeSet::new();
        for m in &placement.members {
            let Some(node) = self.capacity.nodes.get(m.node.0 as usize) else {
                return Err(format!("node {} does not exist", m.node.0));
            };
            let name = &self.node_names[m.node.0 as usize];
            // On an unavailable node the work already runs where nothing is free: what no
            // allocation holds is withheld there, and that is what it may take.
            let (cpu_free, mem_free) = if node.unavailable {
                (node.withheld_cpu, node.withheld_mem)
            } else {
                (node.free_cpu, node.free_mem)
            };
            if cpu_free < spec.cpu_millis_per_member || mem_free < spec.memory_mib_per_member {
                return Err(format!("{name} has not that much CPU or memory free"));
            }
            let held: u64 = m.devices.iter().map(|d| u64::from(d.shares)).sum();
            if held != per_member {
                return Err(format!("{name}: {held} shares placed for {per_member} requested"));
            }
            for d in &m.devices {
                let Some(dev) = node.devices.get(usize::from(d.device)) else {
                    return Err(format!("{name} has no device {}", d.device));
                };
                if !seen.insert((m.node, d.device)) || d.mig.is_some() {
                    return Err(format!("{name} device {} is listed twice", d.device));
                }
                if Some(dev.model) != model {
                    return Err(format!("{name} device {} is not the placement's model", d.device));
                }
                if dev.occupied {
                    return Err(format!(
                        "{name} device {} is held by work allot does not govern",
                        d.device
                    ));
                }
                let free = if node.unavailable { dev.withheld } else { dev.free };
                if free < d.shares {
                    return Err(format!(
                        "{name} device {} has {} shares free, {} needed (allot placed other \
                         work there)",
                        d.device, free, d.shares
                    ));
                }
            }
        }
        let Some(model) = model else {
            return if per_member == 0 { Ok(None) } else { Err("no GPU model given".into()) };
        };
        let Some(key) = self.quota.resolve(project, QuotaKey::Model(model)) else {
            return Err(format!(
                "project {} has no quota for {}",
                self.projects[project.0 as usize].name,
                self.models[usize::from(model.0)]
            ));
        };
        let shares = spec.total_shares();
        if let Some(view) = self.quota.view(project, key)
            && view.used.saturating_add(shares) > view.max
        {
            return Err(format!(
                "project {} would hold {} shares on its {} line, above its maximum {}",
                self.projects[project.0 as usize].name,
                view.used.0.saturating_add(shares.0),
                self.key_name(key),
                view.max.0
            ));
        }
        Ok(Some(key))
    }

    /// A request's project, priority, preemptibility and acceptable models under this
    /// engine's policy, or why it can never run here.
    /// `resolve` for a new workload, or its rejection recorded (a duplicate id included).
    fn accept(&mut self, spec: &WorkloadSpec) -> Option<(ProjectId, i32, bool, Vec<ModelId>)> {
        let reason = if self.workloads.contains_key(&spec.id) {
            RejectReason::DuplicateId
        } else {
            match self.resolve(spec) {
                Ok(resolved) => return Some(resolved),
                Err(reason) => reason,
            }
        };
        self.rejected.push((spec.id, spec.name.clone(), reason));
        None
    }

    pub(super) fn resolve(
        &self,
        spec: &WorkloadSpec,
    ) -> Result<(ProjectId, i32, bool, Vec<ModelId>), RejectReason> {
        let Some(&project) = self.project_index.get(&spec.project) else {
            return Err(RejectReason::UnknownProject { name: spec.project.clone() });
        };
        let class = match &spec.priority_class {
            None => self.default_class,
            Some(name) => match self.class_index.get(name) {
                Some(&c) => c,
                None => return Err(RejectReason::UnknownPriorityClass { name: name.clone() }),
            },
        };
        let mut models = Vec::new();
        for name in &spec.gpu_models {
            match self.model_index.get(name) {
                Some(&m) if !models.contains(&m) => models.push(m),
                Some(_) => {}
                None => return Err(RejectReason::UnknownModel { name: name.clone() }),
            }
        }
        if let Some(detail) = invalid_request(spec) {
            return Err(RejectReason::InvalidRequest { detail });
        }
        let class_spec = &self.classes[class];
        let preemptible = class_spec.preemptible && spec.preemptible != Some(false);
        Ok((project, class_spec.value, preemptible, models))
    }

    /// Fold a valid submission into the target mix placement measures fragmentation against
    /// and, when it asks GPUs, the recent demand and the CPU per GPU placement keeps.
    fn note_demand(&mut self, spec: &WorkloadSpec, models: &[ModelId]) {
        if let Some(class) = demand_class(spec, models)
            && self.census.note(class, spec.members)
        {
            self.capacity.set_target_mix(self.placement_mix());
        }
        let shares = spec.total_shares().0;
        if shares == 0 {
            return;
        }
        let cpu = spec.cpu_millis_per_member.saturating_mul(u64::from(spec.members));
        let (c, g) = self.recent_demand;
        let c = (c - c / DEMAND_DECAY).saturating_add(cpu);
        let g = (g - g / DEMAND_DECAY).saturating_add(shares);
        self.recent_demand = (c, g);
        self.capacity.cpu_per_gpu = cpu_per_gpu(self.recent_demand);
    }

    fn cancel(&mut self, id: WorkloadId) {
        let Some(w) = self.workloads.get_mut(&id) else { return };
        match w.stage {
            Stage::Pending => self.remove(id),
            Stage::Assumed | Stage::Running => {
                self.stop_requests.insert(id, StopReason::Cancelled);
            }
            // Already stopping: make sure it is not requeued afterwards.
            Stage::Stopping => w.stop_kind = Some(StopKind::Cancelled),
        }
    }

    fn requeue(&mut self, id: WorkloadId) {
        let Some(w) = self.workloads.get_mut(&id) else { return };
        w.stage = Stage::Pending;
        w.stop_kind = None;
        self.enqueue(id);
    }

    fn remove(&mut self, id: WorkloadId) {
        self.release(id);
        self.preempted_at.remove(&id);
        if let Some(w) = self.workloads.remove(&id) {
            self.queues[w.project.0 as usize].remove(&w.queue_key());
            self.end_wait(id);
            self.stop_requests.remove(&id);
            if let Some(at) = w.resume_at {
                self.backoffs.remove(&(at, id));
            }
        }
    }
}

fn invalid_request(spec: &WorkloadSpec) -> Option<String> {
    if spec.members == 0 {
        return Some("members must be at least 1".into());
    }
    if spec.members > MEMBERS_MAX {
        return Some(format!("members must be at most {MEMBERS_MAX}"));
    }
    match spec.gpus_per_member {
        GpuRequest::Whole(n) if n > WHOLE_GPUS_PER_MEMBER_MAX => {
            Some(format!("at most {WHOLE_GPUS_PER_MEMBER_MAX} GPUs per member"))
        }
        GpuRequest::Shares(s) if s == 0 || u64::from(s) >= SHARES_PER_GPU => {
            Some(format!("a fractional GPU must be 1..=999 shares, got {s}"))
        }
        GpuRequest::Mig(p) if !(1..=COMPUTE_SLICES).contains(&p.compute_slices) => {
            Some(format!("a MIG profile has 1 to {COMPUTE_SLICES} compute slices, got {p}"))
        }
        _ => None,
    }
}
