//! The daemon's state: the engine, the ledger and one record per workload, changed only by log
//! entries. `apply` is a function of (state, time, entry), so replaying the log rebuilds the
//! same state; what must happen outside (launch, signal) comes back as `Command`s, which the
//! caller executes only after the entries are durable, and drops during a replay.

use std::collections::BTreeMap;
use std::path::PathBuf;

use allot_api::{ApiError, SubmitRequest, WorkloadState};
use allot_backend::files::WorkloadFiles;
use allot_backend::{
    DeviceAssignment, Launch, MemberLaunch, MemberResources, RunId, StopSignal, Vendor, Waiting,
};
use allot_core::ledger::Ledger;
use allot_core::{
    Decision, Engine, Event, Placement, PreemptionMode, Stage, StopReason, Timestamp, WorkloadId,
};
use allot_core::{NodeSpec, PolicySpec, WorkloadSpec};

use serde::{Deserialize, Serialize};

use super::entry::Entry;
use super::submit::{self, Known};
use crate::views;

/// After SIGTERM (or the end of a checkpoint grace and SIGTERM), how long a member has before
/// SIGKILL.
pub(crate) const KILL_AFTER_MS: u64 = 10_000;
/// Ledger periods: one day.
pub(crate) const LEDGER_PERIOD_MS: u64 = 24 * 3600 * 1000;

/// What the user asked for a running workload, carried until it has stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Intent {
    Cancel,
    Suspend,
}

#[derive(Clone, Debug)]
pub(crate) struct Record {
    pub request: SubmitRequest,
    pub spec: WorkloadSpec,
    pub state: WorkloadState,
    pub submitted_ms: u64,
    pub started_ms: Option<u64>,
    pub ended_ms: Option<u64>,
    pub exit_code: Option<i32>,
    /// Runs so far; the current run is `attempt` (0 before the first admission).
    pub attempt: u32,
    /// The last decision about it: (reason code, sentence).
    pub reason: Option<(String, String)>,
    pub intent: Option<Intent>,
    pub placement: Vec<String>,
    /// The engine's placement of the current run, to rebuild its `Launch` after a restart.
    pub launch: Option<Launch>,
    pub pids: Vec<u32>,
    /// The last checkpoint it reported (the engine counts work lost from there).
    pub last_checkpoint_ms: Option<u64>,
    /// The last use a probe (or the heartbeat file) reported.
    pub last_activity_ms: Option<u64>,
    /// Imported from the cluster (`Entry::Imported`): the backend's handle of it (a Slurm job
    /// id). Every run of it takes that work over instead of starting a program.
    pub foreign: Option<String>,
    /// The devices the current run actually holds when the backend picked them itself
    /// (`Entry::DevicesReported`); `None`: as launched.
    pub devices: Option<Vec<MemberLaunch>>,
    /// The attempt the backend keeps this work for (`Entry::Kept`: a requeued job, held),
    /// until a launch takes it or a cancel drops it.
    pub kept: Option<u32>,
    /// Its timeline, bounded (`dashboard::track::push_step`, from `record_steps`).
    pub steps: Vec<crate::view::Step>,
    /// When it was first admitted (its queue wait ends there; the what-if compares it).
    pub first_admitted_ms: Option<u64>,
}

/// A stop under way: when to escalate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StopPlan {
    pub run: RunId,
    pub term_at: u64,
    pub kill_at: u64,
    pub term_sent: bool,
    pub kill_sent: bool,
    /// The work runs again later (pre-empted, reclaimed or suspended, not cancelled or
    /// deleted): instead of SIGTERM the backend is asked to requeue `run` as this next run,
    /// which keeps the work where the backend can (a Slurm job requeued and held).
    #[serde(default)]
    pub requeue_as: Option<RunId>,
}

impl StopPlan {
    /// The step that ends the run: a requeue when the work resumes later, else SIGTERM.
    pub(crate) fn terminate(&self) -> Command {
        match self.requeue_as {
            Some(next) => Command::Requeue { run: self.run, next },
            None => Command::Signal(self.run, StopSignal::Terminate),
        }
    }
}

/// What the caller must do outside, after the entries that caused it are durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Command {
    Launch(Launch),
    Signal(RunId, StopSignal),
    /// Stop `run` keeping the work for `next` (`Backend::requeue`); a backend that cannot
    /// gets SIGTERM instead.
    Requeue {
        run: RunId,
        next: RunId,
    },
    /// Running foreign work the engine refused to adopt goes back to the queue, held
    /// (`Backend::return_foreign`), to be imported again as pending work.
    ReturnForeign(String),
    /// Imported pending work cancelled through allot before any launch took it: the backend
    /// cancels it where it waits (`Backend::cancel_foreign`).
    CancelForeign(String),
    /// Why each of this work, waiting on the cluster for allot, waits, for the cluster's own
    /// tools (`Backend::explain_waiting`): the deferrals whose reason changed this cycle.
    ExplainWaiting(Vec<(Waiting, String)>),
    /// The runs live at start, for a backend that did not answer then (`Backend::recover`,
    /// asked once it answers; never made by `apply`).
    Recover(Vec<Launch>),
}

/// The cluster's own handle of pending work that waits there for allot: a requeued run the
/// backend keeps, or imported work never launched. `None`: nothing of it waits on the cluster.
fn waiting_on_cluster(id: u64, record: &Record) -> Option<Waiting> {
    if record.state != WorkloadState::Pending {
        return None;
    }
    match (record.kept, &record.foreign) {
        (Some(attempt), _) => Some(Waiting::Kept(RunId { workload: id, attempt })),
        (None, Some(handle)) if record.attempt == 0 => Some(Waiting::Foreign(handle.clone())),
        _ => None,
    }
}

/// Counters for `/metrics`, all derived from the log (so they survive a restart).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Counters {
    /// Pre-emptions and reclaims by reason code.
    pub preemptions: BTreeMap<String, u64>,
    pub cycles: u64,
    pub submitted: u64,
    /// Telemetry rounds that had readings (the ledger's active hours then mean something).
    #[serde(default)]
    pub sampled: u64,
    /// Rollouts allot rolled back itself (a condition tripped).
    #[serde(default)]
    pub rollbacks: u64,
}

#[derive(Debug)]
pub(crate) struct Daemon {
    pub engine: Engine,
    pub ledger: Ledger,
    pub nodes: Vec<NodeSpec>,
    /// Bumped each time `nodes` changes, so a reader of it knows without comparing lists.
    pub nodes_generation: u64,
    pub known: Known,
    pub workloads: BTreeMap<u64, Record>,
    pub stops: BTreeMap<u64, StopPlan>,
    pub counters: Counters,
    /// Ids changed since `take_changed` (for the readers' view).
    pub changed: std::collections::BTreeSet<u64>,
    pub(crate) next_id: u64,
    pub(crate) last_now: u64,
    pub(crate) first_ms: Option<u64>,
    /// Work changed since the last cycle.
    pub(crate) dirty: bool,
    pub(crate) last_cycle_ms: u64,
    /// Where workloads' own files go (`allot_backend::files::WorkloadFiles`).
    pub(crate) workload_dir: PathBuf,
    /// The policy in effect: the one the log started with, or the last one applied.
    pub policy_source: String,
    pub policy_text: String,
    /// Every policy the daemon ran under, oldest first; the last is in effect.
    pub policy_versions: Vec<PolicyVersion>,
    /// A candidate policy deciding beside the active one, its decisions only counted.
    pub shadow: Option<super::shadow::Shadow>,
    /// Nodes the backend reports unusable for new work, with its reason (`Entry::NodeState`).
    pub unusable_nodes: BTreeMap<String, String>,
    /// The newest workload imported for each foreign handle.
    pub foreign_ids: BTreeMap<String, u64>,
    /// The policy in effect, parsed (`policy_text`).
    pub policy: PolicySpec,
    /// The backend's last reported inventory while some of it waits for live work to end
    /// (`InventoryChange::kept`); `None` once all of it was taken.
    pub reported_nodes: Option<Vec<NodeSpec>>,
    /// Nodes kept in an old shape for the work on them, with why (no new work there).
    pub kept_nodes: BTreeMap<String, String>,
    /// The backend does not answer (`Entry::BackendUnreachable`): no node takes new work.
    pub backend_down: Option<super::wire::Unreachable>,
    /// What the last inventory change did, for the operator.
    pub inventory_note: Option<String>,
    /// The scoped rollout in effect, or the last one with how it ended.
    pub rollout: Option<super::rollout::Rollout>,
    /// Outcomes of work that rollback conditions measure.
    pub outcomes: allot_config::rollout::Outcomes,
    /// The work the last cycle stopped for other work or for idleness, a line each
    /// (`stopped #ID name (project): <reason> [code]`) for the log stream (`Output::notes`): the record of a victim keeps
    /// its later deferrals, so without these no one can tell afterwards who took its GPUs.
    /// Not state: a cycle replayed at start says nothing.
    pub stopped_for_others: Vec<String>,
}

/// One policy the daemon ran under (`allot policy history`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PolicyVersion {
    /// 1 for the policy the log began with, then one more for each applied.
    pub version: u32,
    /// When it took effect; `None` for the first (in effect since the first start).
    pub at_ms: Option<u64>,
    pub source: String,
    /// The admin who applied it; `None`: a policy file read at a start.
    pub by: Option<String>,
    /// The version whose text this one brought back (`allot policy rollback`).
    pub rollback_of: Option<u32>,
    pub text: String,
    /// The scope of a rollout (`project=nlp`) this version is.
    #[serde(default)]
    pub scope: Option<String>,
    /// Why allot applied it itself (a rollback condition that tripped).
    #[serde(default)]
    pub why: Option<String>,
    /// The what-if shown for its text before it was applied.
    #[serde(default)]
    pub whatif: Option<allot_api::WhatIfShown>,
}

impl PolicyVersion {
    pub(crate) fn first(source: &str, text: &str) -> PolicyVersion {
        PolicyVersion {
            version: 1,
            at_ms: None,
            source: source.to_string(),
            by: None,
            rollback_of: None,
            text: text.to_string(),
            scope: None,
            why: None,
            whatif: None,
        }
    }
}

/// The names a submission may use under `policy` on `nodes`.
pub(crate) fn known(nodes: &[NodeSpec], policy: &PolicySpec) -> Known {
    let mut models: Vec<String> =
        nodes.iter().flat_map(|n| n.devices.iter().map(|d| d.model.clone())).collect();
    models.sort();
    models.dedup();
    Known {
        projects: policy.projects.iter().map(|p| p.name.clone()).collect(),
        classes: policy.priority_classes.iter().map(|c| c.name.clone()).collect(),
        models,
    }
}

fn vendor_of(model: &str) -> Vendor {
    let m = model.to_ascii_lowercase();
    if m.starts_with("mi") || m.contains("instinct") || m.contains("amd") || m.contains("radeon") {
        Vendor::Amd
    } else {
        Vendor::Nvidia
    }
}

impl Daemon {
    pub(crate) fn new(
        nodes: Vec<NodeSpec>,
        policy: &PolicySpec,
        (policy_source, policy_text): (String, String),
        workload_dir: PathBuf,
    ) -> Result<Daemon, allot_core::ConfigError> {
        let engine = Engine::new(&nodes, policy)?;
        let known = known(&nodes, policy);
        Ok(Daemon {
            engine,
            ledger: Ledger::new(LEDGER_PERIOD_MS),
            nodes,
            nodes_generation: 0,
            known,
            workloads: BTreeMap::new(),
            stops: BTreeMap::new(),
            counters: Counters::default(),
            changed: std::collections::BTreeSet::new(),
            next_id: 1,
            last_now: 0,
            first_ms: None,
            dirty: false,
            last_cycle_ms: 0,
            workload_dir,
            policy_versions: vec![PolicyVersion::first(&policy_source, &policy_text)],
            shadow: None,
            policy_source,
            policy_text,
            unusable_nodes: BTreeMap::new(),
            foreign_ids: BTreeMap::new(),
            policy: policy.clone(),
            reported_nodes: None,
            kept_nodes: BTreeMap::new(),
            backend_down: None,
            inventory_note: None,
            rollout: None,
            stopped_for_others: Vec::new(),
            outcomes: allot_config::rollout::Outcomes::default(),
        })
    }

    /// Time only moves forward for the engine, whatever the wall clock does.
    pub(crate) fn clamp(&self, wall_ms: u64) -> u64 {
        wall_ms.max(self.last_now)
    }

    pub(crate) fn first_ms(&self) -> u64 {
        self.first_ms.unwrap_or(self.last_now)
    }

    /// Where members' heartbeat files live (`ALLOT_HEARTBEAT_FILE`).
    pub(crate) fn files(&self, id: u64) -> WorkloadFiles {
        WorkloadFiles::new(&self.workload_dir, id)
    }

    /// A workload touches its heartbeat file (`ALLOT_HEARTBEAT_FILE`) to say it is busy.
    pub(crate) fn heartbeat_path(&self, id: u64) -> PathBuf {
        self.files(id).heartbeat()
    }

    /// A workload touches its checkpoint file (`ALLOT_CHECKPOINT_FILE`) after each checkpoint.
    pub(crate) fn checkpoint_path(&self, id: u64) -> PathBuf {
        self.files(id).checkpoint()
    }

    pub(crate) fn log_dir(&self, id: u64, attempt: u32) -> PathBuf {
        self.files(id).log_dir(attempt)
    }

    /// Checks a submission and makes its entry (with the next id); nothing is changed.
    pub(crate) fn prepare_submit(
        &self,
        user: &str,
        request: SubmitRequest,
    ) -> Result<Entry, crate::view::HttpError> {
        submit::checked_spec(self.next_id, user, &request, &self.known)?;
        Ok(Entry::Submitted { id: self.next_id, user: user.to_string(), request })
    }

    /// Checks a user's action on a workload against its state; nothing is changed.
    pub(crate) fn prepare_action(&self, id: u64, entry: Entry) -> Result<Entry, ApiError> {
        let Some(record) = self.workloads.get(&id) else {
            return Err(ApiError {
                error: format!("no workload {id}"),
                field: Some("id".into()),
                fix: Some("list workloads with `allot ls`".into()),
            });
        };
        let state = record.state;
        let allowed = match entry {
            Entry::CancelRequested { .. } => {
                !state.is_final() && record.intent != Some(Intent::Cancel)
            }
            Entry::SuspendRequested { .. } => {
                matches!(
                    state,
                    WorkloadState::Pending | WorkloadState::Starting | WorkloadState::Running
                ) && record.intent.is_none()
            }
            Entry::ResumeRequested { .. } => state == WorkloadState::Suspended,
            Entry::CheckpointReported { .. } => state == WorkloadState::Running,
            _ => false,
        };
        if allowed {
            Ok(entry)
        } else {
            Err(ApiError {
                error: format!(
                    "workload {id} is {}: {} does not apply",
                    state.as_str(),
                    entry.kind()
                ),
                field: Some("state".into()),
                fix: Some(match entry {
                    Entry::ResumeRequested { .. } => {
                        "only a suspended workload can be resumed".into()
                    }
                    Entry::SuspendRequested { .. } => {
                        "only pending, starting or running work can be suspended".into()
                    }
                    Entry::CheckpointReported { .. } => {
                        "only running work reports checkpoints".into()
                    }
                    _ => "it has already ended or is being cancelled".into(),
                }),
            })
        }
    }

    pub(crate) fn event(&mut self, now: u64, event: Event) {
        // What a stop after a pre-emption lost: the ledger books it as the run closes.
        let stopped = match &event {
            Event::WorkloadStopped { workload } => Some(*workload),
            _ => None,
        };
        let lost = |ledger: &Ledger, w: WorkloadId| {
            ledger.total(&allot_core::ledger::Scope::Workload(w)).lost_to_preemption
        };
        let before = stopped.map(|w| lost(&self.ledger, w));
        self.ledger.event(Timestamp(now), &event);
        if let (Some(w), Some(before)) = (stopped, before) {
            let share_ms = lost(&self.ledger, w).saturating_sub(before);
            if share_ms > 0 {
                let share_ms = u64::try_from(share_ms).unwrap_or(u64::MAX);
                self.outcome(now, w.0, allot_config::rollout::Fact::Lost { share_ms });
            }
        }
        self.engine.apply(Timestamp(now), event);
    }

    /// Notes what happened to workload `id` for rollback conditions.
    fn outcome(&mut self, now: u64, id: u64, fact: allot_config::rollout::Fact) {
        let Some(r) = self.workloads.get(&id) else { return };
        self.outcomes.push(allot_config::rollout::Outcome {
            at_ms: now,
            project: r.spec.project.clone(),
            kind: r.spec.kind,
            models: r.spec.gpu_models.clone(),
            fact,
        });
    }

    /// Work stopped for idleness: its user may undo that (resume it, or submit it again).
    fn idle_reclaimed(&mut self, now: u64, id: u64) {
        let Some(r) = self.workloads.get(&id) else { return };
        let name = allot_config::rollout::name_key(&r.spec.project, &r.spec.user, &r.spec.name);
        self.outcomes.reclaimed.insert(id, now);
        self.outcomes.reclaimed_names.insert(name, now);
        self.outcome(now, id, allot_config::rollout::Fact::IdleReclaimed);
    }

    /// A user brought back work reclaimed for idleness at `reclaimed_ms`.
    fn returned(&mut self, now: u64, id: u64, reclaimed_ms: Option<u64>) {
        if let Some(at) = reclaimed_ms {
            let after_ms = now.saturating_sub(at);
            self.outcome(now, id, allot_config::rollout::Fact::Returned { after_ms });
        }
    }

    fn set_state(&mut self, id: u64, state: WorkloadState, now: u64) {
        if matches!(state, WorkloadState::Succeeded | WorkloadState::Failed)
            && self.workloads.get(&id).is_some_and(|r| !r.state.is_final())
        {
            let workload = allot_core::ledger::Scope::Workload(WorkloadId(id));
            let share_ms =
                u64::try_from(self.ledger.total(&workload).allocated).unwrap_or(u64::MAX);
            let failed = state == WorkloadState::Failed;
            self.outcome(now, id, allot_config::rollout::Fact::Finished { failed, share_ms });
        }
        if let Some(r) = self.workloads.get_mut(&id) {
            r.state = state;
            if state.is_final() || state == WorkloadState::Suspended {
                r.ended_ms = Some(now);
                r.pids.clear();
                if let Some(shadow) = &mut self.shadow {
                    shadow.ended(id);
                }
            }
        }
        self.changed.insert(id);
    }

    /// Applies one durable entry at `at` (ms since the Unix epoch); returns what to do outside.
    pub(crate) fn apply(&mut self, at: u64, entry: &Entry) -> Vec<Command> {
        let earlier = std::mem::take(&mut self.changed);
        let out = self.apply_entry(at, entry);
        self.record_steps(earlier);
        out
    }

    fn apply_entry(&mut self, at: u64, entry: &Entry) -> Vec<Command> {
        let now = self.clamp(at);
        self.last_now = now;
        self.first_ms.get_or_insert(now);
        let mut out = Vec::new();
        match entry {
            Entry::Submitted { id, user, request } => {
                self.next_id = self.next_id.max(id.saturating_add(1));
                self.counters.submitted += 1;
                let (spec, state, reason) = match submit::to_spec(*id, user, request, &self.known) {
                    Ok(spec) => (spec, WorkloadState::Pending, None),
                    // Valid when logged, but the policy given at this start no longer has what it
                    // names: kept as rejected, never silently dropped.
                    Err(e) => {
                        let spec = super::submit::rejected_spec(*id, user, request);
                        (
                            spec,
                            WorkloadState::Rejected,
                            Some((
                                "invalid_under_policy".to_string(),
                                format!("{}: {}", e.field.unwrap_or_default(), e.error),
                            )),
                        )
                    }
                };
                let pending = state == WorkloadState::Pending;
                self.workloads.insert(
                    *id,
                    Record {
                        request: request.clone(),
                        spec: spec.clone(),
                        state,
                        submitted_ms: now,
                        started_ms: None,
                        ended_ms: None,
                        exit_code: None,
                        attempt: 0,
                        reason,
                        intent: None,
                        placement: Vec::new(),
                        launch: None,
                        pids: Vec::new(),
                        last_checkpoint_ms: None,
                        last_activity_ms: None,
                        foreign: None,
                        devices: None,
                        kept: None,
                        steps: Vec::new(),
                        first_admitted_ms: None,
                    },
                );
                self.changed.insert(*id);
                let name = allot_config::rollout::name_key(&spec.project, &spec.user, &spec.name);
                let reclaimed = self.outcomes.reclaimed_names.remove(&name);
                self.returned(now, *id, reclaimed);
                if pending {
                    self.event(now, Event::WorkloadSubmitted(spec));
                    self.dirty = true;
                }
            }
            Entry::CancelRequested { id } | Entry::SuspendRequested { id } => {
                let intent = if matches!(entry, Entry::CancelRequested { .. }) {
                    Intent::Cancel
                } else {
                    Intent::Suspend
                };
                let Some(record) = self.workloads.get_mut(id) else { return out };
                let state = record.state;
                // Work the backend keeps for a next attempt that will not come (a cancel; a
                // suspension keeps it for the resume).
                if intent == Intent::Cancel
                    && matches!(state, WorkloadState::Pending | WorkloadState::Suspended)
                    && let Some(attempt) = record.kept.take()
                {
                    let run = RunId { workload: *id, attempt };
                    out.push(Command::Signal(run, StopSignal::Terminate));
                }
                // Imported work never launched waits held on the cluster: cancel it there.
                if intent == Intent::Cancel
                    && matches!(state, WorkloadState::Pending | WorkloadState::Suspended)
                    && record.attempt == 0
                    && let Some(handle) = &record.foreign
                {
                    out.push(Command::CancelForeign(handle.clone()));
                }
                match state {
                    WorkloadState::Pending => {
                        record.reason = Some(user_action_reason(intent));
                        self.event(now, Event::WorkloadCancelled { workload: WorkloadId(*id) });
                        let done = match intent {
                            Intent::Cancel => WorkloadState::Cancelled,
                            Intent::Suspend => WorkloadState::Suspended,
                        };
                        self.set_state(*id, done, now);
                    }
                    WorkloadState::Suspended if intent == Intent::Cancel => {
                        record.reason = Some(user_action_reason(intent));
                        self.set_state(*id, WorkloadState::Cancelled, now);
                    }
                    WorkloadState::Starting | WorkloadState::Running | WorkloadState::Stopping => {
                        record.intent = Some(intent);
                        self.event(now, Event::WorkloadCancelled { workload: WorkloadId(*id) });
                        self.changed.insert(*id);
                    }
                    _ => {}
                }
                self.dirty = true;
            }
            Entry::ResumeRequested { id } => {
                let Some(record) = self.workloads.get_mut(id) else { return out };
                if record.state == WorkloadState::Suspended {
                    record.intent = None;
                    record.ended_ms = None;
                    record.reason = Some(("resumed".into(), "resumed by its user".into()));
                    let spec = record.spec.clone();
                    self.set_state(*id, WorkloadState::Pending, now);
                    self.event(now, Event::WorkloadSubmitted(spec));
                    self.dirty = true;
                    let reclaimed = self.outcomes.reclaimed.remove(id);
                    self.returned(now, *id, reclaimed);
                }
            }
            Entry::Started { id, attempt, pids } => {
                let Some(record) = self.workloads.get_mut(id) else { return out };
                if record.attempt != *attempt {
                    return out;
                }
                record.pids.clone_from(pids);
                if record.state == WorkloadState::Starting {
                    // Adopted work keeps the start time the cluster reported.
                    record.started_ms.get_or_insert(now);
                    self.set_state(*id, WorkloadState::Running, now);
                }
                self.changed.insert(*id);
                self.event(now, Event::AllocationStarted { workload: WorkloadId(*id) });
                self.dirty = true;
            }
            Entry::LaunchFailed { id, attempt, error, requeue } => {
                let again = requeue.then(|| {
                    let why =
                        format!("queued again: the daemon stopped while launching it ({error})");
                    ("relaunch", why)
                });
                self.not_started(now, *id, *attempt, error, again);
            }
            Entry::Exited { id, attempt, code, detail, cancelled } => {
                self.exited(now, *id, *attempt, *code, detail, *cancelled);
            }
            Entry::Imported { .. } => out.extend(self.imported(now, entry)),
            Entry::ForeignGone { id } => {
                let Some(record) = self.workloads.get_mut(id) else { return out };
                if record.state != WorkloadState::Pending {
                    return out;
                }
                record.reason = Some((
                    "foreign_gone".into(),
                    "left the cluster before allot admitted it (cancelled outside allot)".into(),
                ));
                self.event(now, Event::WorkloadCancelled { workload: WorkloadId(*id) });
                self.set_state(*id, WorkloadState::Cancelled, now);
                self.dirty = true;
            }
            Entry::Kept { id, attempt } => {
                if let Some(r) = self.workloads.get_mut(id)
                    && r.attempt + 1 == *attempt
                    && !r.state.is_final()
                {
                    r.kept = Some(*attempt);
                }
            }
            Entry::DevicesReported { id, attempt, members } => {
                if let Some(r) = self.workloads.get_mut(id)
                    && r.attempt == *attempt
                    && !r.state.is_final()
                {
                    r.devices = Some(members.clone());
                    // The node view shows these devices.
                    self.changed.insert(*id);
                }
            }
            Entry::NodeState { node, usable, reason } => {
                if !self.nodes.iter().any(|n| &n.name == node) {
                    return out;
                }
                if *usable {
                    self.unusable_nodes.remove(node);
                } else {
                    self.unusable_nodes.insert(node.clone(), reason.clone());
                }
                self.sync_availability(now);
                self.dirty = true;
            }
            Entry::InventoryReported { nodes } => {
                self.inventory_reported(now, super::wire::specs(nodes));
            }
            Entry::Occupied { node, devices, by } => self.occupied(now, node, devices, by),
            Entry::BackendUnreachable { error } => self.backend_health(now, Some(error)),
            Entry::BackendReachable => self.backend_health(now, None),
            Entry::LaunchDeferred { id, attempt, error } => {
                // Only a launch not yet started can have been deferred (a late report of an
                // attempt that runs by now changes nothing).
                let waiting = self.workloads.get(id).is_some_and(|r| {
                    matches!(r.state, WorkloadState::Starting | WorkloadState::Stopping)
                });
                if !waiting {
                    return out;
                }
                let why = format!("queued again: the backend could not take it ({error})");
                self.not_started(now, *id, *attempt, error, Some(("backend_unreachable", why)));
            }
            Entry::Probed { id, last_activity_ms } => {
                if let Some(r) = self.workloads.get_mut(id)
                    && r.state == WorkloadState::Running
                {
                    let at = (*last_activity_ms).min(now);
                    r.last_activity_ms = Some(r.last_activity_ms.map_or(at, |last| last.max(at)));
                    self.changed.insert(*id);
                    self.event(
                        now,
                        Event::ActivityProbed {
                            workload: WorkloadId(*id),
                            last_activity: Timestamp((*last_activity_ms).min(now)),
                        },
                    );
                }
            }
            Entry::CheckpointReported { id, at_ms } => {
                let Some(record) = self.workloads.get_mut(id) else { return out };
                // Only a newer one counts: a file seen again after a restart is not new work.
                if record.state == WorkloadState::Running
                    && record.last_checkpoint_ms.is_none_or(|last| *at_ms > last)
                {
                    record.last_checkpoint_ms = Some(*at_ms);
                    self.changed.insert(*id);
                    self.event(now, Event::CheckpointSaved { workload: WorkloadId(*id) });
                }
            }
            Entry::Sampled { workloads } => {
                self.counters.sampled += 1;
                for (id, readings) in workloads {
                    if self.workloads.get(id).is_some_and(|r| r.state == WorkloadState::Running) {
                        let readings = readings.iter().map(|r| (*r).into()).collect();
                        self.event(
                            now,
                            Event::ActivitySampled { workload: WorkloadId(*id), readings },
                        );
                    }
                }
            }
            Entry::TelemetryMissing { ids } => {
                for id in ids {
                    if self.workloads.get(id).is_some_and(|r| r.state == WorkloadState::Running) {
                        self.event(
                            now,
                            Event::ActivitySampled {
                                workload: WorkloadId(*id),
                                readings: Vec::new(),
                            },
                        );
                    }
                }
            }
            Entry::Decided => {
                // Nodes kept in an old shape for their work: taken as soon as it ended.
                if self.reported_nodes.is_some() {
                    self.take_inventory(now);
                }
                out = self.cycle(now);
            }
            Entry::ShadowStarted { source, text, by } => {
                // Checked before it was logged (`prepare_shadow`).
                if let Ok(policy) = allot_config::parse_policy(source, text) {
                    self.shadow = Some(super::shadow::Shadow::new(
                        source,
                        text,
                        by,
                        now,
                        policy,
                        &self.policy,
                    ));
                }
            }
            Entry::ShadowStopped => self.shadow = None,
            Entry::PolicyApplied { source, text, by, rollback_of, rollout, why, whatif } => {
                // Checked before it was logged (`prepare_policy`); the same check again here
                // gives the same answer, so a replay switches at the same point.
                if let Ok((engine, known, policy)) = self.policy_engine(source, text) {
                    self.engine = engine;
                    self.known = known;
                    self.policy = policy;
                    self.policy_source.clone_from(source);
                    self.policy_text.clone_from(text);
                    // A shadow of this very text is the policy in effect now; another one is
                    // compared with the new active policy from here on.
                    if self.shadow.as_ref().is_some_and(|s| &s.text == text) {
                        self.shadow = None;
                    }
                    if let Some(shadow) = &mut self.shadow {
                        shadow.keep_idle =
                            shadow.policy.as_ref().is_some_and(|p| p.idle == self.policy.idle);
                    }
                    let version = self.policy_version() + 1;
                    self.policy_versions.push(PolicyVersion {
                        version,
                        at_ms: Some(now),
                        source: source.clone(),
                        by: by.clone(),
                        rollback_of: *rollback_of,
                        text: text.clone(),
                        scope: rollout.as_ref().map(|r| r.scope.clone()),
                        why: why.clone(),
                        whatif: whatif.clone(),
                    });
                    self.rollout_moved(
                        now,
                        version,
                        (source, by.as_deref()),
                        *rollback_of,
                        rollout.as_ref(),
                        why.as_deref(),
                    );
                    self.changed.extend(self.workloads.keys().copied());
                    self.dirty = true;
                }
            }
        }
        out
    }

    /// The engine and names under another policy, with all live work moved to it, or every
    /// reason it cannot be (one line each).
    fn policy_engine(
        &self,
        source: &str,
        text: &str,
    ) -> Result<(Engine, Known, PolicySpec), Vec<String>> {
        let policy = allot_config::parse_policy(source, text).map_err(|diagnostics| {
            diagnostics.iter().map(ToString::to_string).collect::<Vec<_>>()
        })?;
        let engine = self.engine.with_policy(&self.nodes, &policy).map_err(|e| match e {
            allot_core::StateError::Incompatible(problems) => problems,
            other => vec![other.to_string()],
        })?;
        let known = known(&self.nodes, &policy);
        // Suspended work is outside the engine but resumes under the new policy.
        let mut problems = Vec::new();
        for (id, r) in &self.workloads {
            if r.state == WorkloadState::Suspended
                && let Err(e) = submit::to_spec(*id, &r.spec.user, &r.request, &known)
            {
                problems.push(format!(
                    "suspended workload {id} ({}) could not resume: {}",
                    r.spec.name, e.error
                ));
            }
        }
        if problems.is_empty() { Ok((engine, known, policy)) } else { Err(problems) }
    }

    /// Checks a policy for `allot policy apply`; nothing is changed. `Ok(None)`: it is the
    /// policy in effect already. `by`: the admin applying it (`None`: a policy file read at a
    /// start); `rollback_of`: the version it brings back.
    pub(crate) fn prepare_policy(
        &self,
        source: &str,
        text: &str,
        by: Option<&str>,
        rollback_of: Option<u32>,
    ) -> Result<Option<Entry>, Vec<String>> {
        if text == self.policy_text {
            return Ok(None);
        }
        self.policy_engine(source, text)?;
        Ok(Some(Entry::PolicyApplied {
            source: source.to_string(),
            text: text.to_string(),
            by: by.map(str::to_string),
            rollback_of,
            rollout: None,
            why: None,
            whatif: None,
        }))
    }

    /// Checks a candidate for `allot policy apply --shadow`: it must parse and take over the
    /// live work now, as a shadow cycle will. Nothing is changed.
    pub(crate) fn prepare_shadow(
        &self,
        source: &str,
        text: &str,
        by: &str,
    ) -> Result<Entry, Vec<String>> {
        let policy = allot_config::parse_policy(source, text).map_err(|diagnostics| {
            diagnostics.iter().map(ToString::to_string).collect::<Vec<_>>()
        })?;
        self.engine.shadow_of(&self.nodes, &policy, policy.idle == self.policy.idle).map_err(
            |e| match e {
                allot_core::StateError::Incompatible(problems) => problems,
                other => vec![other.to_string()],
            },
        )?;
        Ok(Entry::ShadowStarted { source: source.into(), text: text.into(), by: by.into() })
    }

    /// The number of the policy in effect (the history's last version).
    pub(crate) fn policy_version(&self) -> u32 {
        self.policy_versions.last().map_or(1, |v| v.version)
    }

    /// Checks a scoped rollout for `allot policy apply FILE --scope …`: the candidate's rules
    /// for the scope merged into the policy in effect, written out whole, then checked as any
    /// apply is. Refused while another rollout is in effect. Nothing is changed.
    pub(crate) fn prepare_rollout(
        &self,
        source: &str,
        candidate_text: &str,
        by: &str,
        ask: &crate::ask::RolloutAsk,
    ) -> Result<Entry, Vec<String>> {
        if let Some(r) = self.rollout.as_ref().filter(|r| r.ended.is_none()) {
            return Err(vec![format!(
                "version {} rolls out {} to {} already: promote it with `allot policy apply                  FILE`, or end it with `allot policy rollback`",
                r.version, r.plan.candidate, r.plan.scope
            )]);
        }
        let scope = allot_config::Scope::parse(&ask.scope).map_err(|e| vec![e])?;
        let candidate =
            allot_config::parse_policy(source, candidate_text).map_err(|diagnostics| {
                diagnostics.iter().map(ToString::to_string).collect::<Vec<_>>()
            })?;
        let scoped =
            allot_config::scoped_policy(&self.policy, &candidate, &scope).map_err(|e| vec![e])?;
        let conditions = ask
            .conditions
            .iter()
            .map(|c| allot_config::rollout::Condition::parse(c))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| vec![e])?;
        let header = format!(
            "Scoped rollout of {source} to {scope}, on top of version {} ({}).\n\
             Carried: {}.\nLeft out (kept as version {}): {}.",
            self.policy_version(),
            self.policy_source,
            scoped.carried.join(", "),
            self.policy_version(),
            if scoped.left_out.is_empty() { "nothing".into() } else { scoped.left_out.join(", ") },
        );
        let text = allot_config::render_policy(&scoped.policy, &header);
        let plan = super::rollout::RolloutPlan {
            scope: scope.to_string(),
            candidate: source.to_string(),
            conditions,
            baseline_ms: ask.baseline_ms,
            false_reclaim_within_ms: ask.false_reclaim_within_ms,
            min_sample: ask.min_sample,
            carried: scoped.carried,
            left_out: scoped.left_out,
        };
        let scoped_source = format!("{source} scoped to {scope}");
        self.policy_engine(&scoped_source, &text)?;
        Ok(Entry::PolicyApplied {
            source: scoped_source,
            text,
            by: Some(by.to_string()),
            rollback_of: None,
            rollout: Some(plan),
            why: None,
            whatif: None,
        })
    }

    /// A policy version took effect: a rollout in effect ends (rolled back, promoted or
    /// replaced), and one starts if this version is one.
    fn rollout_moved(
        &mut self,
        now: u64,
        version: u32,
        (source, by): (&str, Option<&str>),
        rollback_of: Option<u32>,
        plan: Option<&super::rollout::RolloutPlan>,
        why: Option<&str>,
    ) {
        if let Some(r) = self.rollout.as_mut().filter(|r| r.ended.is_none()) {
            let how = match (rollback_of, why) {
                (Some(v), Some(why)) if v == r.base_version => {
                    format!("rolled back by allot as version {version}: {why}")
                }
                (Some(v), None) if v == r.base_version => {
                    format!("rolled back by {} as version {version}", by.unwrap_or("an admin"))
                }
                _ if source == r.plan.candidate => {
                    format!("promoted to the whole fleet as version {version}")
                }
                _ => format!("replaced by version {version} ({source})"),
            };
            r.ended = Some((now, how));
            self.counters.rollbacks += u64::from(why.is_some());
        }
        if let Some(plan) = plan {
            self.rollout = Some(super::rollout::Rollout {
                version,
                base_version: version.saturating_sub(1).max(1),
                by: by.map(str::to_string),
                started_ms: now,
                plan: plan.clone(),
                ended: None,
            });
        }
    }

    /// When each workload of the rollout's scope that waits for its first admission was
    /// submitted; empty unless a condition reads it (`p95_wait`).
    fn waiting_in(&self, plan: &super::rollout::RolloutPlan) -> Vec<u64> {
        let reads =
            plan.conditions.iter().any(|c| c.metric == allot_config::rollout::Metric::P95Wait);
        let Some(scope) = plan.scope().filter(|_| reads) else { return Vec::new() };
        self.workloads
            .values()
            .filter(|r| r.attempt == 0 && r.state == WorkloadState::Pending)
            .filter(|r| scope.covers(&r.spec.project, r.spec.kind, &r.spec.gpu_models))
            .map(|r| r.submitted_ms)
            .collect()
    }

    /// The rollout in effect (or the last one) with its conditions' figures at `now` (at its
    /// end, for one that ended).
    pub(crate) fn rollout_view(&self, now: u64) -> Option<allot_api::RolloutView> {
        let r = self.rollout.as_ref()?;
        let at = r.ended.as_ref().map_or(now, |(ended, _)| *ended);
        // What waited when an ended rollout ended is not kept: its figures are the outcomes'.
        let waiting = if r.ended.is_some() { Vec::new() } else { self.waiting_in(&r.plan) };
        let conditions = r
            .judge(&self.outcomes, &waiting, at)
            .into_iter()
            .map(|j| allot_api::RolloutCondition {
                condition: j.condition.text(),
                baseline: j.baseline,
                baseline_samples: j.baseline_samples,
                current: j.current,
                samples: j.samples,
                state: match j.verdict {
                    Ok(true) => "tripped".into(),
                    Ok(false) => "ok".into(),
                    Err(why) => format!("not judged: {why}"),
                },
            })
            .collect();
        Some(allot_api::RolloutView {
            version: r.version,
            base_version: r.base_version,
            scope: r.plan.scope.clone(),
            candidate: r.plan.candidate.clone(),
            by: r.by.clone(),
            since_ms: r.started_ms,
            baseline_ms: r.plan.baseline_ms,
            false_reclaim_within_ms: r.plan.false_reclaim_within_ms,
            min_sample: r.plan.min_sample,
            carried: r.plan.carried.clone(),
            left_out: r.plan.left_out.clone(),
            conditions,
            ended: r.ended.as_ref().map(|(_, how)| how.clone()),
            ended_ms: r.ended.as_ref().map(|(at, _)| *at),
        })
    }

    /// The rollout in effect's first tripped condition at `now`, as the entry that rolls it
    /// back (the version before it, with why).
    pub(crate) fn rollback_due(&self, now: u64) -> Option<Entry> {
        let r = self.rollout.as_ref().filter(|r| r.ended.is_none())?;
        let judged = r.judge(&self.outcomes, &self.waiting_in(&r.plan), now);
        let why = allot_config::rollout::RollbackRules::tripped(&judged, &r.plan.scope()?)?;
        let base = self.policy_versions.iter().find(|v| v.version == r.base_version)?;
        Some(Entry::PolicyApplied {
            source: format!("rollback to version {} ({})", base.version, base.source),
            text: base.text.clone(),
            by: Some("allot".into()),
            rollback_of: Some(base.version),
            rollout: None,
            why: Some(why),
            whatif: None,
        })
    }

    /// The shadow's report now, per project.
    pub(crate) fn shadow_report(&self, now: u64) -> Option<allot_api::ShadowReport> {
        let shadow = self.shadow.as_ref()?;
        Some(shadow.report(now, |id| self.workloads.get(&id).map(|r| r.spec.project.clone())))
    }

    /// A launch that did not start: `LaunchFailed`, or `LaunchDeferred` (the backend could not
    /// take it). With `again` (a reason), the daemon or the backend is to blame: the work
    /// queues again, or, told to stop meanwhile, ends as that stop would. Without, the
    /// workload fails (a program that cannot start would fail the same way on every try),
    /// or ends as the user's suspend or cancel asked.
    fn not_started(
        &mut self,
        now: u64,
        id: u64,
        attempt: u32,
        error: &str,
        again: Option<(&str, String)>,
    ) {
        let Some(record) = self.workloads.get_mut(&id) else { return };
        if record.attempt != attempt || record.state.is_final() {
            return;
        }
        if again.is_some() && record.state == WorkloadState::Stopping {
            let detail = format!("never started: {error}");
            self.exited(now, id, attempt, None, &detail, false);
            return;
        }
        let failed = Event::AllocationFailed { workload: WorkloadId(id), reason: error.into() };
        if let Some((code, why)) = again
            && record.state == WorkloadState::Starting
            && record.intent.is_none()
        {
            record.reason = Some((code.to_string(), why));
            self.event(now, failed);
            self.set_state(id, WorkloadState::Pending, now);
            self.dirty = true;
            return;
        }
        record.reason = Some(("launch_failed".into(), format!("could not start: {error}")));
        self.stops.remove(&id);
        self.event(now, failed);
        self.event(now, Event::WorkloadCancelled { workload: WorkloadId(id) });
        let done = match self.workloads.get(&id).and_then(|r| r.intent) {
            Some(Intent::Suspend) => WorkloadState::Suspended,
            Some(Intent::Cancel) => WorkloadState::Cancelled,
            None => WorkloadState::Failed,
        };
        self.set_state(id, done, now);
        self.dirty = true;
    }

    /// A run ended. `cancelled`: by its owner outside allot (a pod deleted with kubectl): the
    /// workload ends cancelled, with the backend's words, where allot was not stopping it.
    fn exited(
        &mut self,
        now: u64,
        id: u64,
        attempt: u32,
        code: Option<i32>,
        detail: &str,
        cancelled: bool,
    ) {
        let Some(record) = self.workloads.get_mut(&id) else { return };
        if record.attempt != attempt
            || record.state.is_final()
            || record.state == WorkloadState::Suspended
        {
            return;
        }
        self.stops.remove(&id);
        record.exit_code = code;
        record.pids.clear();
        let intent = record.intent;
        let was_stopping = record.state == WorkloadState::Stopping;
        // Foreign work lives on the cluster: unless the backend kept it for the next run (a
        // Slurm job requeued, a Job suspended), it is gone (a pod evicted) and cannot run again.
        let lost_on_cluster = record.foreign.is_some() && record.kept != Some(attempt + 1);
        self.dirty = true;
        if !was_stopping && intent.is_none() {
            self.event(now, Event::WorkloadFinished { workload: WorkloadId(id) });
            let state = match code {
                _ if cancelled => WorkloadState::Cancelled,
                Some(0) => WorkloadState::Succeeded,
                _ => WorkloadState::Failed,
            };
            if let Some(r) = self.workloads.get_mut(&id) {
                r.reason = Some(match code {
                    _ if cancelled => ("cancelled_outside".into(), detail.to_string()),
                    Some(0) => ("exited".into(), "exited with code 0".into()),
                    Some(c) => ("exited".into(), format!("exited with code {c}")),
                    None => ("exited".into(), detail.to_string()),
                });
            }
            self.set_state(id, state, now);
            return;
        }
        self.event(now, Event::WorkloadStopped { workload: WorkloadId(id) });
        let requeued = self.engine.stage(WorkloadId(id)) == Some(Stage::Pending);
        let state = match (intent, requeued) {
            (Some(Intent::Suspend), true) | (Some(Intent::Cancel), true) => {
                self.event(now, Event::WorkloadCancelled { workload: WorkloadId(id) });
                if intent == Some(Intent::Suspend) {
                    WorkloadState::Suspended
                } else {
                    WorkloadState::Cancelled
                }
            }
            (Some(Intent::Suspend), false) => WorkloadState::Suspended,
            (Some(Intent::Cancel), false) => WorkloadState::Cancelled,
            (None, true) if lost_on_cluster => {
                self.event(now, Event::WorkloadCancelled { workload: WorkloadId(id) });
                if let Some(r) = self.workloads.get_mut(&id) {
                    let why = r.reason.as_ref().map_or(String::new(), |(_, text)| text.clone());
                    r.reason = Some((
                        "deleted".into(),
                        format!(
                            "deleted when stopped: {why}; the cluster could not keep it for a \
                             later run (an evicted pod is gone: its controller, if any, makes \
                             a new one, which is new work)"
                        ),
                    ));
                }
                WorkloadState::Failed
            }
            (None, true) => WorkloadState::Pending,
            (None, false) => {
                if let Some(r) = self.workloads.get_mut(&id) {
                    let why = r.reason.as_ref().map_or(String::new(), |(_, text)| text.clone());
                    r.reason = Some(("deleted".into(), format!("deleted when stopped: {why}")));
                }
                WorkloadState::Failed
            }
        };
        self.set_state(id, state, now);
    }

    /// Whether a cycle is due: new work, idle timers the engine wants looked at, or the
    /// periodic cycle that catches max-runtime stops and idle rules.
    pub(crate) fn cycle_due(&self, now: u64, interval_ms: u64) -> bool {
        let since = now.saturating_sub(self.last_cycle_ms);
        if since < interval_ms {
            return false;
        }
        self.dirty
            || self.engine.idle_attention(Timestamp(now))
            || (since >= 5_000
                && self
                    .workloads
                    .values()
                    .any(|r| !r.state.is_final() && r.state != WorkloadState::Suspended))
    }

    /// With work changed since the last cycle: how long until a cycle may run.
    pub(crate) fn cycle_wait_ms(&self, now: u64, interval_ms: u64) -> Option<u64> {
        self.dirty.then(|| (self.last_cycle_ms + interval_ms).saturating_sub(now))
    }

    fn cycle(&mut self, now: u64) -> Vec<Command> {
        self.dirty = false;
        self.stopped_for_others.clear();
        self.last_cycle_ms = now;
        self.counters.cycles += 1;
        // The shadow decides first, over the live work as the real cycle finds it.
        let candidate = match &mut self.shadow {
            Some(shadow) => shadow.decide(&self.engine, &self.nodes, now),
            None => None,
        };
        // Only deferrals whose reason changed (each record keeps the reason it was last told),
        // and of those whose kind is unchanged only so many a cycle, each at most every 2 s
        // (`Refresh::default`): a deep queue's words (most repeat, or move a figure, every
        // cycle) cost more than the cycle itself. `allot why` is always current.
        let decisions = self.engine.decide_news(Timestamp(now), allot_core::Refresh::default());
        if let (Some(shadow), Some(candidate)) = (&mut self.shadow, candidate) {
            shadow.compare(now, &decisions, &candidate);
        }
        let mut out = Vec::new();
        let mut explain = Vec::new();
        for d in &decisions {
            self.ledger.decision(Timestamp(now), d);
            let id = d.workload().0;
            let reason = (
                views::reason_code(d).to_string(),
                views::humanize_times(&self.engine.render_reason(d)),
            );
            match d {
                Decision::Admit { placement, .. } => {
                    if let Some(r) = self.workloads.get(&id)
                        && r.attempt == 0
                    {
                        let wait_ms = now.saturating_sub(r.submitted_ms);
                        self.outcome(now, id, allot_config::rollout::Fact::Admitted { wait_ms });
                    }
                    if let Some(launch) = self.admit(now, id, placement) {
                        out.push(Command::Launch(launch));
                    }
                    if let Some(r) = self.workloads.get_mut(&id) {
                        // Its usage figures are the project's then, not now: say so, or a
                        // running workload reads "22 used" while its project uses 7.
                        r.reason = Some((reason.0, format!("at admission: {}", reason.1)));
                    }
                }
                Decision::Preempt { checkpoint_grace_ms, mode, .. }
                | Decision::Reclaim { checkpoint_grace_ms, mode, .. } => {
                    *self.counters.preemptions.entry(reason.0.clone()).or_default() += 1;
                    self.stopped_for_others.push(format!(
                        "stopped #{id} {} ({}): {} [{}]",
                        self.engine.decision_subject(d),
                        self.workloads.get(&id).map_or("?", |r| r.spec.project.as_str()),
                        reason.1,
                        reason.0
                    ));
                    if reason.0 == "idle" {
                        self.idle_reclaimed(now, id);
                    }
                    let resumes = *mode != PreemptionMode::Delete;
                    out.extend(self.stop(now, id, *checkpoint_grace_ms, reason, resumes));
                }
                Decision::Stop { reason: stop, .. } => {
                    let grace = self.workloads.get(&id).and_then(|r| {
                        (r.intent == Some(Intent::Suspend))
                            .then(|| r.spec.checkpointing.map(|c| c.grace_ms))
                            .flatten()
                    });
                    // A suspension resumes later; a cancel or a max-runtime stop does not.
                    let resumes =
                        self.workloads.get(&id).is_some_and(|r| r.intent == Some(Intent::Suspend));
                    // The engine knows only that the user stopped it (a cancel of admitted
                    // work): a suspension is said as one, not as a cancel.
                    let reason = if resumes && *stop == StopReason::Cancelled {
                        user_action_reason(Intent::Suspend)
                    } else {
                        reason
                    };
                    out.extend(self.stop(now, id, grace, reason, resumes));
                }
                Decision::Defer { .. } | Decision::Warn { .. } => {
                    if let Some(r) = self.workloads.get_mut(&id)
                        && r.reason.as_ref() != Some(&reason)
                    {
                        if let Decision::Defer { .. } = d
                            && let Some(waiting) = waiting_on_cluster(id, r)
                        {
                            explain.push((waiting, reason.1.clone()));
                        }
                        r.reason = Some(reason);
                        self.changed.insert(id);
                    }
                }
                Decision::Reject { .. } => {
                    if let Some(r) = self.workloads.get_mut(&id) {
                        r.reason = Some(reason);
                    }
                    self.set_state(id, WorkloadState::Rejected, now);
                }
            }
        }
        self.ledger.cluster(Timestamp(now), self.engine.cluster_snapshot());
        if !explain.is_empty() {
            out.push(Command::ExplainWaiting(explain));
        }
        out
    }

    fn admit(&mut self, now: u64, id: u64, placement: &Placement) -> Option<Launch> {
        let members: Vec<MemberLaunch> = placement
            .members
            .iter()
            .map(|m| {
                let node = self.engine.node_name(m.node).to_string();
                let spec = self.nodes.iter().find(|n| n.name == node);
                MemberLaunch {
                    devices: m
                        .devices
                        .iter()
                        .map(|d| DeviceAssignment {
                            index: u32::from(d.device),
                            uuid: None,
                            vendor: spec
                                .and_then(|n| n.devices.get(usize::from(d.device)))
                                .map_or(Vendor::Nvidia, |dev| vendor_of(&dev.model)),
                            shares: u64::from(d.shares),
                        })
                        .collect(),
                    node,
                }
            })
            .collect();
        let text = views::placement_lines(&self.engine, placement);
        let heartbeat = self.heartbeat_path(id);
        let checkpoint = self.checkpoint_path(id);
        let attempt = self.workloads.get(&id)?.attempt + 1;
        let log_dir = self.log_dir(id, attempt);
        let record = self.workloads.get_mut(&id)?;
        record.attempt = attempt;
        record.first_admitted_ms.get_or_insert(now);
        record.placement = text;
        let mut env = record.request.env.clone();
        env.insert("ALLOT_HEARTBEAT_FILE".into(), heartbeat.display().to_string());
        env.insert("ALLOT_CHECKPOINT_FILE".into(), checkpoint.display().to_string());
        // The Slurm backend charges the job to this account; backends that run work as its
        // submitter run it as this user's account.
        env.insert("ALLOT_PROJECT".into(), record.spec.project.clone());
        env.insert(allot_backend::account::USER_ENV.into(), record.spec.user.clone());
        let launch = Launch {
            run: RunId { workload: id, attempt: record.attempt },
            command: record.request.command.clone(),
            env,
            members,
            log_dir,
            adopt: record.foreign.clone(),
            resources: MemberResources {
                cpu_millis: record.spec.cpu_millis_per_member,
                memory_mib: record.spec.memory_mib_per_member,
            },
        };
        record.launch = Some(launch.clone());
        record.devices = None;
        record.kept = None;
        record.started_ms = None;
        record.exit_code = None;
        self.set_state(id, WorkloadState::Starting, now);
        Some(launch)
    }

    /// Starts a stop: the checkpoint signal and its grace when given, then the terminating
    /// step (`StopPlan::terminate`), then SIGKILL. `resumes`: the work runs again later.
    fn stop(
        &mut self,
        now: u64,
        id: u64,
        grace_ms: Option<u64>,
        reason: (String, String),
        resumes: bool,
    ) -> Vec<Command> {
        let Some(record) = self.workloads.get_mut(&id) else { return Vec::new() };
        record.reason = Some(reason);
        let run = RunId { workload: id, attempt: record.attempt };
        let requeue_as = resumes.then_some(RunId { workload: id, attempt: run.attempt + 1 });
        self.set_state(id, WorkloadState::Stopping, now);
        let term_at = grace_ms.map_or(now, |g| now.saturating_add(g));
        let mut plan = StopPlan {
            run,
            term_at,
            kill_at: term_at.saturating_add(KILL_AFTER_MS),
            term_sent: grace_ms.is_none(),
            kill_sent: false,
            requeue_as,
        };
        let first = match grace_ms {
            Some(_) => Command::Signal(run, StopSignal::Checkpoint),
            None => plan.terminate(),
        };
        plan.term_sent = grace_ms.is_none();
        self.stops.insert(id, plan);
        vec![first]
    }

    /// Escalations whose time has come (SIGTERM after the grace, SIGKILL after that). Not
    /// logged: signals are idempotent, and after a restart the plan is rebuilt from the log.
    pub(crate) fn due_signals(&mut self, now: u64) -> Vec<Command> {
        let mut out = Vec::new();
        for plan in self.stops.values_mut() {
            if !plan.term_sent && now >= plan.term_at {
                plan.term_sent = true;
                out.push(plan.terminate());
            }
            if !plan.kill_sent && now >= plan.kill_at {
                plan.kill_sent = true;
                out.push(Command::Signal(plan.run, StopSignal::Kill));
            }
        }
        out
    }

    /// Everything the log made, as text (the readers' change list aside): a daemon rebuilt
    /// from the log — snapshot and replay — equals the one that wrote it. A stop's sent flags
    /// are not in it: escalations are not logged, and a start resends each stop's current step
    /// (`resend_stops`). Nor are the figures in a pending workload's reason, only its code:
    /// the engine's memory of what it last told each pending workload is not saved, so a
    /// rebuilt daemon tells every one afresh where the one that crashed may still show figures
    /// up to `Refresh::default().min_age_ms` old (a change of code is told at once by both).
    pub(crate) fn digest(&self) -> String {
        let workloads: BTreeMap<&u64, std::borrow::Cow<'_, Record>> = self
            .workloads
            .iter()
            .map(|(id, r)| {
                let r = match &r.reason {
                    Some((code, _)) if r.state == WorkloadState::Pending => {
                        let mut r = r.clone();
                        r.reason = Some((code.clone(), String::new()));
                        std::borrow::Cow::Owned(r)
                    }
                    _ => std::borrow::Cow::Borrowed(r),
                };
                (id, r)
            })
            .collect();
        let stops: Vec<_> = self
            .stops
            .iter()
            .map(|(id, p)| (id, p.run, p.term_at, p.kill_at, p.requeue_as))
            .collect();
        format!(
            "{:?}",
            (
                (&self.engine, &self.ledger, &self.nodes, workloads, stops),
                (&self.counters, self.next_id, self.last_now, self.first_ms, self.dirty),
                (self.last_cycle_ms, &self.policy_source, &self.policy_text, &self.unusable_nodes),
                (&self.foreign_ids, &self.reported_nodes, &self.kept_nodes, &self.backend_down),
                (&self.inventory_note, &self.policy_versions, &self.shadow),
            )
        )
    }

    /// When the next escalation of a stop under way is due, if any.
    pub(crate) fn next_signal_ms(&self) -> Option<u64> {
        self.stops
            .values()
            .flat_map(|p| {
                [(!p.term_sent).then_some(p.term_at), (!p.kill_sent).then_some(p.kill_at)]
            })
            .flatten()
            .min()
    }

    /// After a restart: the signal each stop under way is at (its first step may have been
    /// decided and logged but never sent before the crash).
    pub(crate) fn resend_stops(&self, now: u64) -> Vec<Command> {
        self.stops
            .values()
            .map(|plan| {
                if now < plan.term_at {
                    Command::Signal(plan.run, StopSignal::Checkpoint)
                } else {
                    plan.terminate()
                }
            })
            .collect()
    }

    /// Runs the log says were launched and have not ended: what the backend must re-adopt.
    pub(crate) fn live_launches(&self) -> Vec<Launch> {
        self.workloads
            .values()
            .filter(|r| {
                matches!(
                    r.state,
                    WorkloadState::Starting | WorkloadState::Running | WorkloadState::Stopping
                )
            })
            .filter_map(|r| r.launch.clone())
            .collect()
    }

    /// The devices running workloads hold, for attributing telemetry. A run with `pods` (the
    /// backend said which pod each member is) is found by pod; a member past its pods has none
    /// known and is left out (no reading, never a device guessed by index).
    pub(crate) fn allocations(
        &self,
        pods: &BTreeMap<RunId, Vec<allot_backend::PodRef>>,
    ) -> Vec<allot_telemetry::attribution::Allocation> {
        let mut out = Vec::new();
        for (id, r) in &self.workloads {
            let (WorkloadState::Running, Some(launch)) = (r.state, &r.launch) else { continue };
            let members = r.devices.as_ref().unwrap_or(&launch.members);
            let run_pods = pods.get(&launch.run);
            for (member, m) in members.iter().enumerate() {
                let pod = match run_pods.map(|p| p.get(member)) {
                    None => None,
                    Some(None) => continue,
                    Some(Some(p)) => Some(allot_telemetry::attribution::PodRef {
                        namespace: p.namespace.clone(),
                        name: p.name.clone(),
                    }),
                };
                for d in &m.devices {
                    out.push(allot_telemetry::attribution::Allocation {
                        node: m.node.clone(),
                        device_index: d.index,
                        mig_instance: None,
                        amd_partition: None,
                        workload: WorkloadId(*id),
                        member: member as u32,
                        shares: u32::try_from(d.shares).unwrap_or(1000),
                        pod: pod.clone(),
                    });
                }
            }
        }
        out
    }

    /// Running workloads with a heartbeat file to watch.
    pub(crate) fn running_ids(&self) -> Vec<u64> {
        self.workloads
            .iter()
            .filter(|(_, r)| r.state == WorkloadState::Running)
            .map(|(id, _)| *id)
            .collect()
    }
}

/// The reason a workload the user stopped shows (code, words): a suspension or a cancel.
fn user_action_reason(intent: Intent) -> (String, String) {
    match intent {
        Intent::Suspend => {
            ("suspended".into(), "suspended by its user; `allot resume` queues it again".into())
        }
        Intent::Cancel => ("cancelled".into(), "cancelled by its user".into()),
    }
}

impl Daemon {
    /// Records the steps of the workloads an entry changed (`self.changed` holds exactly
    /// those; `earlier` is what it held before the entry, put back). Called by `apply` after
    /// every entry, so a replay writes the same steps again. At most `TIMELINE_MAX` per
    /// workload: the first (submission) and the latest.
    pub(crate) fn record_steps(&mut self, earlier: std::collections::BTreeSet<u64>) {
        let touched = std::mem::replace(&mut self.changed, earlier);
        let now = self.last_now;
        for id in &touched {
            if let Some(r) = self.workloads.get_mut(id) {
                crate::view::push_step(
                    &mut r.steps,
                    now,
                    r.submitted_ms,
                    r.state,
                    r.reason.as_ref(),
                );
            }
        }
        if self.changed.is_empty() {
            self.changed = touched;
        } else {
            self.changed.extend(touched);
        }
    }
}
