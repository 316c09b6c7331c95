//! The engine's state, saved and rebuilt: for the daemon's snapshots (`Engine::state`,
//! `Engine::from_state`), and for carrying live work into another policy
//! (`Engine::with_policy`, behind `allot policy apply`).
//!
//! Only what the events made is saved: the workloads, the pre-emptors' plans, the fair-share
//! clock and averages, the idle trackers and backoffs, the unavailable nodes with their
//! reasons. Everything derived from them — queues, device and CPU occupancy, quota charges,
//! running sets, withheld capacity — is rebuilt by booking each allocation again
//! (`rebuild`), through the same `book_resources` admission uses, then withholding what is
//! left on the unavailable nodes, so a restored engine cannot hold a share the allocations
//! do not explain.

use std::collections::{BTreeMap, BTreeSet};

use super::demand::DemandCensus;
use super::idle::IdleState;
use super::{Allocation, Engine, Stage, StopKind, WorkloadState};
use crate::codec::{self, Codec, CodecError, bad, codec_struct, codec_unit_enum};
use crate::decision::{Placement, QuotaKey};
use crate::ids::{ModelId, NodeId, ProjectId, Shares, Timestamp, WorkloadId};
use crate::model::{NodeSpec, PolicySpec, PreemptionMode};

codec_unit_enum!(Stage { Pending, Assumed, Running, Stopping });
codec_struct!(Allocation { key, placement, shares, started_at });
codec_struct!(IdleState { rule, tracker, exempt, warned_at, offered });
codec_struct!(WorkloadState {
    spec,
    project,
    priority,
    preemptible,
    models,
    stage,
    stop_kind,
    queued_at,
    pending_since,
    allocation,
    last_checkpoint_at,
    waiting_for,
    preemptions,
    idle_reclaims,
    resume_at,
    idle_suspended_at,
    probed,
});

impl Codec for StopKind {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            StopKind::Preempted(mode) => (0u8, *mode).encode(out),
            StopKind::Idle(mode) => (1u8, *mode).encode(out),
            StopKind::Cancelled => out.push(2),
            StopKind::MaxRuntime => out.push(3),
        }
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        match u8::decode(input)? {
            0 => Ok(StopKind::Preempted(PreemptionMode::decode(input)?)),
            1 => Ok(StopKind::Idle(PreemptionMode::decode(input)?)),
            2 => Ok(StopKind::Cancelled),
            3 => Ok(StopKind::MaxRuntime),
            _ => Err(bad("unknown stop kind")),
        }
    }
}

/// Bumped whenever the saved fields change meaning. Version 2 appends the unavailable nodes
/// after `Saved`, version 3 the demand census after those, version 4 the pre-emption times
/// (`Engine::preempted_at`) after that, version 5 the occupied devices (`Engine::occupied`)
/// after those; versions 1 (none), 2 (no census: placement starts learning the mix again),
/// 3 (no times: the pre-emption cap counts from the restart) and 4 (nothing occupied: the
/// next cluster watch says what is) are still read.
const STATE_VERSION: u32 = 5;

/// What `Engine::state` writes: the configuration's names (to refuse a foreign state) and
/// the event-made fields; from version 2 followed by the unavailable nodes
/// (`BTreeMap<NodeId, String>`: node, the cluster's reason).
struct Saved {
    version: u32,
    node_names: Vec<String>,
    models: Vec<String>,
    project_names: Vec<String>,
    workloads: BTreeMap<WorkloadId, WorkloadState>,
    preemptors: BTreeSet<WorkloadId>,
    reservations: BTreeMap<WorkloadId, (ProjectId, QuotaKey, Shares)>,
    planned: BTreeMap<WorkloadId, Placement>,
    clock: Timestamp,
    recent_demand: (u64, u64),
    decayed_allocated: Vec<f64>,
    idle: BTreeMap<WorkloadId, IdleState>,
    backoffs: BTreeSet<(Timestamp, WorkloadId)>,
    pressure_ready: BTreeSet<WorkloadId>,
    deadlines: BTreeSet<(Timestamp, WorkloadId)>,
}

codec_struct!(Saved {
    version,
    node_names,
    models,
    project_names,
    workloads,
    preemptors,
    reservations,
    planned,
    clock,
    recent_demand,
    decayed_allocated,
    idle,
    backoffs,
    pressure_ready,
    deadlines,
});

/// Whether live work carried into another engine keeps its idle timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CarryIdle {
    /// Another policy: its rules judge from now.
    Restart,
    /// The same rules (the inventory changed): timers run on.
    Keep,
}

/// Why a saved state or a new policy cannot be taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateError {
    /// `Engine::state` between an event and the next `decide`: facts not yet decided on.
    NotAtCycleBoundary,
    /// The bytes are damaged or from another version.
    Codec(CodecError),
    /// The state was saved over another cluster or policy.
    Mismatch(String),
    /// Live work the new policy cannot hold, one line per problem.
    Incompatible(Vec<String>),
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateError::NotAtCycleBoundary => {
                f.write_str("engine state is saved only right after a decision cycle")
            }
            StateError::Codec(e) => write!(f, "{e}"),
            StateError::Mismatch(what) => write!(f, "saved state does not match: {what}"),
            StateError::Incompatible(problems) => f.write_str(&problems.join("; ")),
        }
    }
}

impl std::error::Error for StateError {}

impl Engine {
    /// The engine's state, right after a `decide` (no event since): the caller stores it and
    /// later rebuilds the same engine with `Engine::from_state` over the same nodes and policy.
    pub fn state(&self) -> Result<Vec<u8>, StateError> {
        if !self.rejected.is_empty() || !self.stop_requests.is_empty() || !self.held.is_empty() {
            return Err(StateError::NotAtCycleBoundary);
        }
        let saved = Saved {
            version: STATE_VERSION,
            node_names: self.node_names.clone(),
            models: self.models.clone(),
            project_names: self.projects.iter().map(|p| p.name.clone()).collect(),
            workloads: self.workloads.clone(),
            preemptors: self.preemptors.clone(),
            reservations: self.reservations.clone(),
            planned: self.planned.clone(),
            clock: self.clock,
            recent_demand: self.recent_demand,
            decayed_allocated: self.projects.iter().map(|p| p.decayed_allocated).collect(),
            idle: self.idle.clone(),
            backoffs: self.backoffs.clone(),
            pressure_ready: self.pressure_ready.clone(),
            deadlines: self.deadlines.clone(),
        };
        let mut bytes = codec::to_bytes(&saved);
        self.unavailable.encode(&mut bytes);
        self.census.encode(&mut bytes);
        self.preempted_at.encode(&mut bytes);
        self.saved_occupancy().encode(&mut bytes);
        Ok(bytes)
    }

    /// The engine `state` was taken from, over the same nodes and policy. Damaged bytes, a
    /// state from another cluster or policy, or one whose allocations do not add up, are an
    /// error (the caller then replays its log instead), never a panic.
    pub fn from_state(
        nodes: &[NodeSpec],
        policy: &PolicySpec,
        bytes: &[u8],
    ) -> Result<Engine, StateError> {
        let mut engine = Engine::new(nodes, policy)
            .map_err(|e| StateError::Mismatch(format!("the configuration: {e}")))?;
        let mut input = bytes;
        let saved = Saved::decode(&mut input).map_err(StateError::Codec)?;
        if !(1..=STATE_VERSION).contains(&saved.version) {
            return Err(StateError::Mismatch(format!(
                "state version {} (this allot reads 1 to {STATE_VERSION})",
                saved.version
            )));
        }
        let unavailable: BTreeMap<NodeId, String> = if saved.version >= 2 {
            Codec::decode(&mut input).map_err(StateError::Codec)?
        } else {
            BTreeMap::new()
        };
        let census: DemandCensus = if saved.version >= 3 {
            Codec::decode(&mut input).map_err(StateError::Codec)?
        } else {
            DemandCensus::default()
        };
        let preempted_at: BTreeMap<WorkloadId, Vec<Timestamp>> = if saved.version >= 4 {
            Codec::decode(&mut input).map_err(StateError::Codec)?
        } else {
            BTreeMap::new()
        };
        let occupied: BTreeMap<NodeId, (Vec<u16>, String)> = if saved.version >= 5 {
            Codec::decode(&mut input).map_err(StateError::Codec)?
        } else {
            BTreeMap::new()
        };
        if !input.is_empty() {
            return Err(StateError::Codec(bad("bytes left over")));
        }
        let names: Vec<String> = engine.projects.iter().map(|p| p.name.clone()).collect();
        if saved.node_names != engine.node_names
            || saved.models != engine.models
            || saved.project_names != names
            || saved.decayed_allocated.len() != engine.projects.len()
        {
            return Err(StateError::Mismatch("nodes, models or projects differ".into()));
        }
        for (id, w) in &saved.workloads {
            engine.check_saved_workload(*id, w)?;
        }
        let projects = engine.projects.len();
        if saved.reservations.values().any(|(p, _, _)| p.0 as usize >= projects)
            || saved.planned.values().any(|pl| !engine.placement_in_range(pl))
            || saved.idle.values().any(|s| s.rule as usize >= engine.idle_rules.len())
            || saved.idle.keys().any(|id| !saved.workloads.contains_key(id))
            || preempted_at.keys().any(|id| !saved.workloads.contains_key(id))
        {
            return Err(StateError::Mismatch("a plan or idle state out of range".into()));
        }
        if unavailable
            .keys()
            .chain(occupied.keys())
            .any(|n| n.0 as usize >= engine.node_names.len())
        {
            return Err(StateError::Mismatch(
                "an unavailable or occupied node out of range".into(),
            ));
        }
        engine.workloads = saved.workloads;
        engine.preemptors = saved.preemptors;
        engine.reservations = saved.reservations;
        engine.planned = saved.planned;
        engine.clock = saved.clock;
        engine.recent_demand = saved.recent_demand;
        engine.census = census;
        for (p, d) in engine.projects.iter_mut().zip(saved.decayed_allocated) {
            p.decayed_allocated = d;
        }
        engine.idle = saved.idle;
        for state in engine.idle.values_mut() {
            // In range: checked above.
            if let Some(spec) = engine.idle_rules.get(state.rule as usize) {
                state.tracker.restore_quiet(&spec.rule);
            }
        }
        engine.backoffs = saved.backoffs;
        engine.pressure_ready = saved.pressure_ready;
        engine.deadlines = saved.deadlines;
        engine.preempted_at = preempted_at;
        engine.rebuild();
        engine.withhold_unavailable(unavailable);
        for (node, (devices, by)) in occupied {
            engine.occupy(node, &devices, by);
        }
        engine.audit().map_err(StateError::Mismatch)?;
        Ok(engine)
    }

    /// The occupied devices as saved: node, device indices, who holds them.
    fn saved_occupancy(&self) -> BTreeMap<NodeId, (Vec<u16>, String)> {
        self.occupied
            .iter()
            .map(|(n, o)| (*n, (o.devices.iter().copied().collect(), o.by.clone())))
            .collect()
    }

    /// Marks `nodes` unavailable, after `rebuild` booked every allocation: what no
    /// allocation holds there is withheld, as it was in the engine the state came from.
    fn withhold_unavailable(&mut self, nodes: BTreeMap<NodeId, String>) {
        for (node, reason) in nodes {
            self.capacity.set_unavailable(node);
            self.unavailable.insert(node, reason);
        }
    }

    /// Ids inside a saved workload must index this engine's tables before anything books them.
    fn check_saved_workload(&self, id: WorkloadId, w: &WorkloadState) -> Result<(), StateError> {
        let mismatch = |what: &str| Err(StateError::Mismatch(format!("workload {id}: {what}")));
        if w.spec.id != id || w.project.0 as usize >= self.projects.len() {
            return mismatch("id or project out of range");
        }
        if w.models.iter().any(|m| usize::from(m.0) >= self.models.len()) {
            return mismatch("model out of range");
        }
        if let Some(a) = &w.allocation
            && !self.placement_in_range(&a.placement)
        {
            return mismatch("placement out of range");
        }
        Ok(())
    }

    fn placement_in_range(&self, placement: &Placement) -> bool {
        placement.model.is_none_or(|m| usize::from(m.0) < self.models.len())
            && placement.members.iter().all(|m| {
                self.capacity.nodes.get(m.node.0 as usize).is_some_and(|n| {
                    m.devices.iter().all(|d| {
                        n.devices.get(usize::from(d.device)).is_some_and(|dev| {
                            d.shares <= crate::ids::SHARES_PER_GPU as u32
                                && (d.mig.is_none() || dev.mig.is_some())
                        })
                    })
                })
            })
    }

    /// Everything derived from the workloads and plans: queues, occupancy, quota charges,
    /// allocation totals, running sets, stopping and reserved shares, and the CPU
    /// per GPU placement keeps. Expects an engine fresh from `new` with `workloads` set.
    /// (Max-runtime deadlines are saved as they are: the cycle drops passed ones.)
    fn rebuild(&mut self) {
        let ids: Vec<WorkloadId> = self.workloads.keys().copied().collect();
        for id in ids {
            let Some(w) = self.workloads.get(&id) else { continue };
            let project = w.project;
            let p = project.0 as usize;
            match (&w.stage, &w.allocation) {
                (Stage::Pending, _) => self.enqueue(id),
                (stage, Some(a)) => {
                    let (stage, shares, key, priority) = (*stage, a.shares, a.key, w.priority);
                    self.book_resources(id, true);
                    let pr = &mut self.projects[p];
                    pr.allocated = pr.allocated.saturating_add(shares);
                    if stage == Stage::Running {
                        self.running[p].insert(id, priority);
                    }
                    if stage == Stage::Stopping
                        && let Some(key) = key
                    {
                        super::adjust_line_total(&mut self.stopping_shares, (project, key), |t| {
                            t.saturating_add(shares)
                        });
                    }
                }
                (_, None) => {}
            }
        }
        for &(p, k, s) in self.reservations.values() {
            super::adjust_line_total(&mut self.reserved_by_line, (p, k), |t| t.saturating_add(s));
        }
        self.capacity.cpu_per_gpu = super::cpu_per_gpu(self.recent_demand);
        self.capacity.set_target_mix(self.placement_mix());
    }

    /// This engine's live work carried into an engine over `nodes` (the same cluster) and
    /// another `policy`: running work keeps its devices, pending work its place in the
    /// queue (by priority, then submit time), fair-share averages carry over by project name,
    /// unavailable nodes stay unavailable.
    /// Waiting pre-emptors start over (their victims still stop), idle timers restart now
    /// under the new rules, so no one is reclaimed sooner than the new policy allows.
    /// Refused, with every problem named, when live work names a project, priority class or
    /// GPU model the new policy lacks, is charged to a quota line that is gone, or would leave
    /// a project above the most its new quota allows.
    pub fn with_policy(
        &self,
        nodes: &[NodeSpec],
        policy: &PolicySpec,
    ) -> Result<Engine, StateError> {
        if nodes.iter().map(|n| &n.name).ne(self.node_names.iter()) {
            return Err(StateError::Incompatible(vec!["the nodes differ".into()]));
        }
        self.carry_over(nodes, policy, CarryIdle::Restart)
    }

    /// The engine another policy would be now, over the same live work, for a shadow run
    /// (decisions recorded, never executed): as `with_policy`, except that with `keep_idle`
    /// (the candidate's idle rules are the active ones) idle timers run on, so the shadow's
    /// idle reclaims can be compared with the real ones.
    pub fn shadow_of(
        &self,
        nodes: &[NodeSpec],
        policy: &PolicySpec,
        keep_idle: bool,
    ) -> Result<Engine, StateError> {
        if !keep_idle {
            return self.with_policy(nodes, policy);
        }
        if nodes.iter().map(|n| &n.name).ne(self.node_names.iter()) {
            return Err(StateError::Incompatible(vec!["the nodes differ".into()]));
        }
        self.carry_over(nodes, policy, CarryIdle::Keep)
    }

    /// Live work carried into an engine over `nodes` and `policy`. Nodes are matched by name
    /// (their ids may differ); every allocation must find its node and devices there.
    /// `idle`: restart idle timers (another policy) or keep them (the same rules).
    pub(super) fn carry_over(
        &self,
        nodes: &[NodeSpec],
        policy: &PolicySpec,
        idle: CarryIdle,
    ) -> Result<Engine, StateError> {
        let mut next = Engine::new(nodes, policy)
            .map_err(|e| StateError::Incompatible(vec![format!("the new policy: {e}")]))?;
        let node_map: Vec<Option<NodeId>> =
            self.node_names.iter().map(|name| next.node_index.get(name).copied()).collect();
        let map_node = |n: NodeId| node_map.get(n.0 as usize).copied().flatten();
        let mut problems = Vec::new();
        let model_map: BTreeMap<ModelId, Option<ModelId>> = self
            .models
            .iter()
            .enumerate()
            .map(|(i, name)| (ModelId(i as u16), next.model_index.get(name).copied()))
            .collect();
        let map_model = |m: ModelId| model_map.get(&m).copied().flatten();
        for (id, w) in &self.workloads {
            let (project, priority, preemptible, models) = match next.resolve(&w.spec) {
                Ok(r) => r,
                Err(reason) => {
                    problems.push(format!("workload {id} ({}): {reason:?}", w.spec.name));
                    continue;
                }
            };
            let allocation = match &w.allocation {
                None => None,
                Some(a) => {
                    let key = match a.key {
                        None => None,
                        Some(QuotaKey::Any) => Some(QuotaKey::Any),
                        Some(QuotaKey::Model(m)) => map_model(m).map(QuotaKey::Model),
                    };
                    let key_gone = match key {
                        Some(k) => next.quota.view(project, k).is_none(),
                        None => a.key.is_some(),
                    };
                    if key_gone {
                        problems.push(format!(
                            "workload {id} ({}) holds {} GPUs of project {}'s {} quota line, \
                             which the new policy removes",
                            w.spec.name,
                            a.shares,
                            w.spec.project,
                            a.key.map_or("?".to_string(), |k| self.key_name(k).to_string()),
                        ));
                        continue;
                    }
                    let mut placement = a.placement.clone();
                    placement.model = placement.model.and_then(map_model);
                    let mut lost = None;
                    for member in &mut placement.members {
                        match map_node(member.node) {
                            Some(n) => member.node = n,
                            None => lost = Some(self.node_name(member.node).to_string()),
                        }
                    }
                    if let Some(node) = lost {
                        problems.push(format!(
                            "workload {id} ({}) runs on node {node}, which is gone",
                            w.spec.name
                        ));
                        continue;
                    }
                    if !next.placement_in_range(&placement) {
                        problems.push(format!(
                            "workload {id} ({}) holds devices its nodes no longer have",
                            w.spec.name
                        ));
                        continue;
                    }
                    Some(Allocation { key, placement, shares: a.shares, started_at: a.started_at })
                }
            };
            let mut moved = w.clone();
            moved.project = project;
            moved.priority = priority;
            moved.preemptible = preemptible;
            moved.models = models;
            moved.allocation = allocation;
            moved.waiting_for.clear();
            next.workloads.insert(*id, moved);
        }
        if !problems.is_empty() {
            return Err(StateError::Incompatible(problems));
        }
        next.clock = self.clock;
        next.recent_demand = self.recent_demand;
        if next.models == self.models {
            // Model masks are indexes into the model list: another list starts over.
            next.census = self.census.clone();
        }
        for p in &mut next.projects {
            if let Some(old) = self.projects.iter().find(|o| o.name == p.name) {
                p.decayed_allocated = old.decayed_allocated;
            }
        }
        next.backoffs = self.backoffs.clone();
        next.preempted_at.clone_from(&self.preempted_at);
        // Undecided facts (a cancel, a rejection) still reach the next cycle.
        next.rejected.clone_from(&self.rejected);
        next.stop_requests.clone_from(&self.stop_requests);
        if idle == CarryIdle::Keep {
            next.idle.clone_from(&self.idle);
            next.pressure_ready.clone_from(&self.pressure_ready);
        }
        next.rebuild();
        let unavailable = self
            .unavailable
            .iter()
            .filter_map(|(n, reason)| Some((map_node(*n)?, reason.clone())))
            .collect();
        next.withhold_unavailable(unavailable);
        for (node, o) in &self.occupied {
            if let Some(n) = map_node(*node) {
                let devices: Vec<u16> = o.devices.iter().copied().collect();
                next.occupy(n, &devices, o.by.clone());
            }
        }
        for (id, w) in &next.workloads {
            if let (Some(max), Some(started)) =
                (w.spec.max_runtime_ms, w.allocation.as_ref().and_then(|a| a.started_at))
                && w.stage == Stage::Running
            {
                next.deadlines.insert((Timestamp(started.0.saturating_add(max)), *id));
            }
        }
        for (p, lines) in next.quota.lines.iter().enumerate() {
            for (key, line) in lines {
                if let Some(view) = next.quota.view(ProjectId(p as u32), *key)
                    && line.used > view.max
                {
                    // The work holding the line, largest first: what the fix asks to stop.
                    let mut holders: Vec<(Shares, WorkloadId, &str)> = next
                        .workloads
                        .iter()
                        .filter(|(_, w)| w.project.0 as usize == p)
                        .filter_map(|(id, w)| {
                            let a = w.allocation.as_ref()?;
                            (a.key == Some(*key)).then_some((a.shares, *id, w.spec.name.as_str()))
                        })
                        .collect();
                    holders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
                    let named: Vec<String> = holders
                        .iter()
                        .take(5)
                        .map(|(s, id, name)| format!("workload {id} ({name}) {s}"))
                        .collect();
                    let more = holders.len().saturating_sub(named.len());
                    let more = if more > 0 { format!(" and {more} more") } else { String::new() };
                    problems.push(format!(
                        "project {} holds {} GPUs on its {} line, above the {} the new policy \
                         allows (guarantee plus borrowing); stop or suspend some of its work \
                         first: {}{more}",
                        next.projects[p].name,
                        line.used,
                        next.key_name(*key),
                        view.max,
                        named.join(", ")
                    ));
                }
            }
        }
        if !problems.is_empty() {
            return Err(StateError::Incompatible(problems));
        }
        let running: Vec<WorkloadId> = next
            .workloads
            .iter()
            .filter(|(_, w)| w.stage == Stage::Running)
            .map(|(id, _)| *id)
            .collect();
        if idle == CarryIdle::Restart {
            for id in running {
                next.start_idle_tracking(id, self.clock);
            }
        }
        next.audit().map_err(|e| StateError::Incompatible(vec![e]))?;
        Ok(next)
    }
}
