//! The daemon as a sans-I/O state machine (as quinn-proto is to quinn): inputs go in — API
//! requests, backend observations, telemetry readings, probe results, the clock — and outputs
//! come out — log entries to make durable, answers, backend commands — from `Machine::step`.
//! Nothing here reads a clock, a file, a socket or a thread: the production driver
//! (`driver.rs`: threads, SQLite, the backend, the wall clock) and the whole-system simulation
//! (`simulation.rs`: the same store, the fake backend, a seeded scheduler on a virtual clock)
//! drive the very same code.
//!
//! One rule makes the daemon crash-safe: a step's `Output::entries` are durable before any of
//! its answers or commands leave (`durable.rs` appends them first); if the append fails the
//! driver stops, with memory ahead of the log and nothing acknowledged, and a restart replays.

mod attribution;
mod daemon;
mod derived;
mod entry;
mod foreign;
pub(crate) mod history;
mod inventory;
mod publish;
mod records;
mod rollout;
#[cfg(test)]
mod roundtrip;
mod shadow;
mod snapshot;
mod submit;
mod wire;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use allot_api::{PolicyView, Report, SubmitResponse, Why, WorkloadState};
use allot_backend::{ClusterNews, MemberLaunch, Observation, PodRef, RunId};
use allot_core::{Timestamp, WorkloadId};
use allot_telemetry::Sample;

#[cfg(test)]
pub(crate) use daemon::LEDGER_PERIOD_MS;
pub(crate) use daemon::{Command, Daemon};
pub(crate) use entry::Entry;
pub(crate) use wire::{SavedNode, saved as saved_nodes};

pub(crate) use crate::ask::{Action, Answer, Ask};
use crate::auth::Principal;
use crate::view::HttpError;

/// Most inputs taken in one step (one transaction).
pub(crate) const BATCH_MAX: usize = 1024;
/// Most submissions timed to their admission at once (the rest are not timed).
const AWAITING_ADMISSION_MAX: usize = 100_000;
/// Most process-group entries kept from collectors (pid → group), pruned to running work.
const GROUPS_MAX: usize = 100_000;
/// A rollout's conditions are judged at most this often (each judgement reads every outcome
/// of its windows).
const ROLLOUT_CHECK_MS: u64 = 5_000;

/// Names an `Ask` so that its answer finds the asker (the driver keeps the reply channel).
pub(crate) type Ticket = u64;

/// The entry a user's action logs.
fn action_entry(action: Action, id: u64) -> Entry {
    match action {
        Action::Cancel => Entry::CancelRequested { id },
        Action::Suspend => Entry::SuspendRequested { id },
        Action::Resume => Entry::ResumeRequested { id },
        Action::Checkpoint { at_ms } => Entry::CheckpointReported { id, at_ms },
    }
}

/// A probe file's modification time as the driver read it (`None`: absent, or dated at the
/// epoch — made for a job run as another user and not touched yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileTimes {
    pub id: u64,
    pub heartbeat_ms: Option<u64>,
    pub checkpoint_ms: Option<u64>,
}

/// Everything that reaches the machine.
#[derive(Debug)]
pub(crate) enum Input {
    Ask(Ticket, Ask),
    /// What the backend saw of allot's runs.
    Observed(Vec<Observation>),
    /// What the backend said of the runs live at start (asked once it answered).
    Recovered(Vec<Observation>),
    /// Node states, the inventory and foreign work on the cluster.
    Cluster(ClusterNews),
    /// Runs the backend keeps stopped work for (accepted requeues).
    Kept(Vec<RunId>),
    /// The devices started runs actually hold.
    Placed(Vec<(RunId, Vec<MemberLaunch>)>),
    /// The pod each member of started runs is (Kubernetes), by member.
    Pods(Vec<(RunId, Vec<PodRef>)>),
    /// The backend stopped answering (`Some(error)`) or answers again.
    BackendHealth(Option<String>),
    /// Device samples from a collector or a node agent, with the process groups of the
    /// processes they list (pid → group id, read where the processes run; may be empty).
    Telemetry {
        samples: Vec<Sample>,
        groups: BTreeMap<u32, u32>,
    },
    /// An application probe saw the workload in use.
    Probed {
        id: u64,
        last_activity_ms: u64,
    },
    /// The running workloads' probe files (`Machine::watched_files`), as read now.
    Files(Vec<FileTimes>),
}

/// Distinct unknown telemetry hostnames said at most (a misconfigured fleet says enough).
const UNKNOWN_HOSTS_MAX: usize = 64;
/// Distinct telemetry hostnames remembered as checked at most (a fleet's nodes and then some).
const CHECKED_HOSTS_MAX: usize = 100_000;

/// What one step produced. `entries` must be durable before any answer or command leaves.
#[derive(Debug, Default)]
pub(crate) struct Output {
    pub entries: Vec<Entry>,
    pub answers: Vec<(Ticket, Answer)>,
    pub commands: Vec<Command>,
    /// A decision cycle ran in this step (the last entry is `Decided`: a snapshot may follow).
    pub cycled: bool,
    /// Submit-to-admit times (ms) of first admissions this step decided.
    pub admitted_after_ms: Vec<u64>,
    /// What the operator should hear about (the driver writes them to the log stream): not
    /// state, so not logged as entries.
    pub notes: Vec<String>,
    /// Events for the policy webhook (JSON): a rollout that rolled itself back.
    pub events: Vec<serde_json::Value>,
}

/// How often the machine does what it does on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cadence {
    /// Least time between decision cycles.
    pub decide_interval_ms: u64,
    /// Running workloads get a telemetry round this often.
    pub telemetry_round_ms: u64,
}

/// The machine: the daemon's durable state (`Daemon`, rebuilt by replaying the log) and what
/// it keeps between steps that is not logged (the newest samples, probe files seen).
#[derive(Debug)]
pub(crate) struct Machine {
    pub daemon: Daemon,
    pub cadence: Cadence,
    /// The newest sample per device, and the last round's attribution.
    pub telemetry: attribution::Latest,
    /// Process group of each process the collectors listed (pid → group).
    groups: BTreeMap<u32, u32>,
    /// The pods of live runs, by member, as the backend said when they started (not logged:
    /// asked again after a restart; what they attribute is logged as `Sampled`).
    pods: BTreeMap<RunId, Vec<PodRef>>,
    /// Heartbeat file times already logged.
    heartbeats: BTreeMap<u64, u64>,
    /// The last activity each application probe reported (only news is logged).
    probed: BTreeMap<u64, u64>,
    /// Submissions waiting for their first admission: when they were received.
    awaiting_admission: BTreeMap<u64, u64>,
    last_telemetry_ms: u64,
    /// When a rollout's conditions were last judged.
    last_rollout_check_ms: u64,
    /// When the readers' project and node views were last rebuilt (`publish`).
    last_view_ms: u64,
    /// The policy text the readers' view was last rebuilt under (`publish`).
    view_policy: String,
    /// What each live workload holds in the readers' node view (`publish` moves it there).
    view_held: BTreeMap<u64, records::Held>,
    /// The daemon's `nodes_generation` the readers' node view was last rebuilt on (`None`
    /// before the first rebuild).
    view_nodes_generation: Option<u64>,
    /// Telemetry hostnames already checked against the inventory, so each is checked once
    /// (a round has a sample per device); and of those, how many matched no node.
    checked_hosts: BTreeSet<String>,
    unknown_hosts: usize,
}

/// An `Ask` whose entry is logged in this step: answered once the batch is applied.
enum Waiting {
    Submitted(Ticket, u64),
    Acted(Ticket, u64),
    Policy(Ticket),
    Shadow(Ticket),
}

impl Machine {
    pub(crate) fn new(daemon: Daemon, cadence: Cadence) -> Machine {
        Machine {
            daemon,
            cadence,
            telemetry: attribution::Latest::default(),
            groups: BTreeMap::new(),
            pods: BTreeMap::new(),
            heartbeats: BTreeMap::new(),
            probed: BTreeMap::new(),
            awaiting_admission: BTreeMap::new(),
            last_telemetry_ms: 0,
            last_rollout_check_ms: 0,
            last_view_ms: 0,
            view_policy: String::new(),
            view_held: BTreeMap::new(),
            view_nodes_generation: None,
            checked_hosts: BTreeSet::new(),
            unknown_hosts: 0,
        }
    }

    /// Says once per hostname that telemetry came from a host the inventory does not name:
    /// its readings can reach no workload, and without a word the idle rules would only see
    /// "telemetry missing".
    fn note_unknown_hosts(&mut self, samples: &[Sample], out: &mut Output) {
        for host in samples.iter().filter_map(|s| s.identity.hostname.as_deref()) {
            if self.unknown_hosts >= UNKNOWN_HOSTS_MAX
                || self.checked_hosts.len() >= CHECKED_HOSTS_MAX
                || self.checked_hosts.contains(host)
            {
                continue;
            }
            self.checked_hosts.insert(host.to_string());
            if self.daemon.nodes.iter().any(|n| n.name == host) {
                continue;
            }
            self.unknown_hosts += 1;
            let names: Vec<&str> =
                self.daemon.nodes.iter().take(5).map(|n| n.name.as_str()).collect();
            let more = if self.daemon.nodes.len() > 5 { ", …" } else { "" };
            out.notes.push(format!(
                "telemetry from host {host:?} matches no node of the inventory ({}{more}): its \
                 readings reach no workload — fix: name the node as the exporter does (its \
                 Hostname label), or run `allot agent` on that node",
                names.join(", ")
            ));
        }
    }

    /// The pods of started runs, by member, as the backend says (see `Input::Pods`).
    pub(crate) fn take_pods(&mut self, pods: Vec<(RunId, Vec<PodRef>)>) {
        self.pods.extend(pods);
    }

    /// Applies entries made outside a step (at start: the inventory, recovery, a policy
    /// file edited since the last start) and returns what they ask to be done.
    pub(crate) fn apply_all(&mut self, now: u64, entries: &[Entry]) -> Vec<Command> {
        entries.iter().flat_map(|e| self.daemon.apply(now, e)).collect()
    }

    /// One turn: takes `inputs` at wall time `now_wall` (ms since the Unix epoch; the
    /// engine's time never goes back, whatever the clock does), logs and applies what they
    /// say, runs the telemetry round and the cycle when due, and answers.
    pub(crate) fn step(&mut self, now_wall: u64, inputs: Vec<Input>) -> Output {
        let now = self.daemon.clamp(now_wall);
        let mut out = Output::default();
        let mut waiting = Vec::new();
        let mut queries = Vec::new();
        for input in inputs {
            self.take(now, input, &mut out, &mut waiting, &mut queries);
        }
        if now.saturating_sub(self.last_telemetry_ms) >= self.cadence.telemetry_round_ms {
            self.last_telemetry_ms = now;
            for e in self.telemetry_round(now) {
                self.log(now, e, &mut out);
            }
        }
        // A rollout whose condition tripped rolls back before the cycle, so the cycle decides
        // under the policy before it (and `Decided` stays last for a snapshot).
        if now.saturating_sub(self.last_rollout_check_ms) >= ROLLOUT_CHECK_MS {
            self.last_rollout_check_ms = now;
            if let Some(entry) = self.daemon.rollback_due(now) {
                if let Entry::PolicyApplied { why: Some(why), source, rollback_of, .. } = &entry {
                    out.notes.push(format!("policy: {source}: {why}"));
                    let rollout = self.daemon.rollout.as_ref();
                    out.events.push(serde_json::json!({
                        "event": "policy_rolled_back",
                        "at_ms": now,
                        "rollout_version": rollout.map(|r| r.version),
                        "scope": rollout.map(|r| r.plan.scope.clone()),
                        "candidate": rollout.map(|r| r.plan.candidate.clone()),
                        "restored_version": rollback_of,
                        "new_version": self.daemon.policy_version() + 1,
                        "why": why,
                    }));
                }
                self.log(now, entry, &mut out);
            }
        }
        if self.daemon.cycle_due(now, self.cadence.decide_interval_ms) {
            self.log(now, Entry::Decided, &mut out);
            out.cycled = true;
            out.notes.append(&mut self.daemon.stopped_for_others);
        }
        for w in waiting {
            out.answers.push(match w {
                Waiting::Submitted(ticket, id) => {
                    let state =
                        self.daemon.workloads.get(&id).map_or(WorkloadState::Pending, |r| r.state);
                    (ticket, Answer::Submitted(Ok(SubmitResponse { id, state })))
                }
                Waiting::Acted(ticket, id) => {
                    let w = self.daemon.workloads.get(&id).map(|r| records::workload(id, r));
                    let w =
                        w.ok_or_else(|| HttpError::plain(404, format!("no workload {id}"), None));
                    (ticket, Answer::Workload(w))
                }
                Waiting::Policy(ticket) => (ticket, Answer::Policy(Ok(self.policy_view()))),
                Waiting::Shadow(ticket) => (ticket, Answer::Shadow(self.shadow_answer(now))),
            });
        }
        if !self.awaiting_admission.is_empty() {
            out.admitted_after_ms = self.admitted_after(now);
        }
        out.commands.extend(self.daemon.due_signals(now));
        for (ticket, ask) in queries {
            out.answers.push((ticket, self.answer(now, ask)));
        }
        out
    }

    /// How long, from `now_wall`, until a step is due without any input (a cycle waiting out
    /// its interval, the periodic cycle, a telemetry round, a stop to escalate); at most
    /// `max_ms`.
    pub(crate) fn wake_in_ms(&self, now_wall: u64, max_ms: u64) -> u64 {
        let now = self.daemon.clamp(now_wall);
        let cycle = self.daemon.cycle_wait_ms(now, self.cadence.decide_interval_ms);
        let telemetry =
            (self.last_telemetry_ms + self.cadence.telemetry_round_ms).saturating_sub(now);
        let signal = self.daemon.next_signal_ms().map(|at| at.saturating_sub(now));
        [cycle, Some(telemetry), signal, Some(max_ms)].into_iter().flatten().min().unwrap_or(max_ms)
    }

    /// Logs `entry` in this step and applies it; what it asks to be done waits for the append.
    fn log(&mut self, now: u64, entry: Entry, out: &mut Output) {
        out.commands.extend(self.daemon.apply(now, &entry));
        out.entries.push(entry);
    }

    fn take(
        &mut self,
        now: u64,
        input: Input,
        out: &mut Output,
        waiting: &mut Vec<Waiting>,
        queries: &mut Vec<(Ticket, Ask)>,
    ) {
        match input {
            Input::Ask(ticket, ask) => self.ask(now, ticket, ask, out, waiting, queries),
            Input::Telemetry { samples, groups } => {
                self.note_unknown_hosts(&samples, out);
                self.telemetry.take(samples);
                if self.groups.len() + groups.len() > GROUPS_MAX {
                    self.groups.clear();
                }
                self.groups.extend(groups);
            }
            Input::Probed { id, last_activity_ms } => {
                let running = self
                    .daemon
                    .workloads
                    .get(&id)
                    .is_some_and(|r| r.state == WorkloadState::Running);
                if running && self.probed.get(&id).is_none_or(|last| last_activity_ms > *last) {
                    self.probed.insert(id, last_activity_ms);
                    self.log(now, Entry::Probed { id, last_activity_ms }, out);
                }
            }
            Input::Files(files) => {
                for e in self.file_probes(&files) {
                    self.log(now, e, out);
                }
            }
            Input::Kept(runs) => {
                for run in runs {
                    self.log(now, Entry::Kept { id: run.workload, attempt: run.attempt }, out);
                }
            }
            Input::Pods(pods) => self.take_pods(pods),
            Input::Placed(placed) => {
                for (run, reported) in placed {
                    let Some(members) = self.daemon.bound_members(run, &reported) else {
                        continue;
                    };
                    let e =
                        Entry::DevicesReported { id: run.workload, attempt: run.attempt, members };
                    self.log(now, e, out);
                }
            }
            Input::Cluster(news) => {
                // The shape first, so that node states can name nodes just added.
                if let Some(e) =
                    news.inventory.as_deref().and_then(|n| self.daemon.inventory_entry(n))
                {
                    self.log(now, e, out);
                }
                for e in self.daemon.cluster_entries(&news) {
                    self.log(now, e, out);
                }
                for e in self.daemon.occupancy_entries(&news) {
                    self.log(now, e, out);
                }
            }
            Input::BackendHealth(down) => {
                let e = match down {
                    Some(error) => Entry::BackendUnreachable { error },
                    None => Entry::BackendReachable,
                };
                self.log(now, e, out);
            }
            Input::Recovered(observations) => {
                for e in recovered_entries(observations) {
                    self.log(now, e, out);
                }
            }
            Input::Observed(observations) => {
                for o in observations {
                    self.log(now, observation_entry(o), out);
                }
            }
        }
    }

    fn ask(
        &mut self,
        now: u64,
        ticket: Ticket,
        ask: Ask,
        out: &mut Output,
        waiting: &mut Vec<Waiting>,
        queries: &mut Vec<(Ticket, Ask)>,
    ) {
        match ask {
            Ask::Submit { principal, request, received_ms } => {
                if !principal.can_act(&request.project) {
                    let denied = forbidden(&principal, &request.project);
                    out.answers.push((ticket, Answer::Submitted(Err(denied))));
                    return;
                }
                match self.daemon.prepare_submit(&principal.name, *request) {
                    Ok(entry) => {
                        let Entry::Submitted { id, .. } = &entry else { return };
                        let id = *id;
                        self.log(now, entry, out);
                        waiting.push(Waiting::Submitted(ticket, id));
                        if self.awaiting_admission.len() < AWAITING_ADMISSION_MAX {
                            self.awaiting_admission.insert(id, received_ms);
                        }
                    }
                    Err(e) => {
                        out.answers.push((ticket, Answer::Submitted(Err(e))));
                    }
                }
            }
            Ask::Act { principal, id, action } => {
                if let Some(project) =
                    self.daemon.workloads.get(&id).map(|r| r.spec.project.clone())
                    && !principal.can_act(&project)
                {
                    out.answers
                        .push((ticket, Answer::Workload(Err(forbidden(&principal, &project)))));
                    return;
                }
                match self.daemon.prepare_action(id, action_entry(action, id)) {
                    Ok(entry) => {
                        self.log(now, entry, out);
                        waiting.push(Waiting::Acted(ticket, id));
                    }
                    Err(e) => {
                        let status =
                            if self.daemon.workloads.contains_key(&id) { 409 } else { 404 };
                        out.answers
                            .push((ticket, Answer::Workload(Err(HttpError::new(status, e)))));
                    }
                }
            }
            Ask::ApplyPolicy { source, text, by, rollback_of, rollout, whatif } => {
                let prepared = match &rollout {
                    Some(ask) => self.daemon.prepare_rollout(&source, &text, &by, ask).map(Some),
                    None => self.daemon.prepare_policy(&source, &text, Some(&by), rollback_of),
                };
                match prepared {
                    Ok(Some(mut entry)) => {
                        if let Entry::PolicyApplied { whatif: shown, .. } = &mut entry {
                            *shown = whatif;
                        }
                        self.log(now, entry, out);
                        waiting.push(Waiting::Policy(ticket));
                    }
                    Ok(None) => out.answers.push((ticket, Answer::Policy(Ok(self.policy_view())))),
                    Err(problems) => {
                        out.answers.push((ticket, Answer::Policy(Err(policy_refused(&problems)))));
                    }
                }
            }
            Ask::StartShadow { source, text, by } => {
                match self.daemon.prepare_shadow(&source, &text, &by) {
                    Ok(entry) => {
                        self.log(now, entry, out);
                        waiting.push(Waiting::Shadow(ticket));
                    }
                    Err(problems) => {
                        out.answers.push((ticket, Answer::Shadow(Err(policy_refused(&problems)))));
                    }
                }
            }
            Ask::StopShadow => match self.shadow_answer(now) {
                Ok(report) => {
                    self.log(now, Entry::ShadowStopped, out);
                    out.answers.push((ticket, Answer::Shadow(Ok(report))));
                }
                Err(e) => out.answers.push((ticket, Answer::Shadow(Err(e)))),
            },
            query @ (Ask::Why { .. }
            | Ask::Report { .. }
            | Ask::History { .. }
            | Ask::ShadowReport) => {
                queries.push((ticket, query));
            }
        }
    }

    /// Submissions decided on for good since the last publish (admitted, or ended otherwise)
    /// stop being timed; first admissions give their time since arrival. Only the workloads
    /// that changed are looked at (every state change marks its workload changed), not every
    /// submission still waiting: a deep queue waits long.
    fn admitted_after(&mut self, now: u64) -> Vec<u64> {
        let daemon = &self.daemon;
        let mut out = Vec::new();
        for id in &daemon.changed {
            let Some(&received) = self.awaiting_admission.get(id) else { continue };
            let decided = match daemon.workloads.get(id) {
                None => true,
                Some(r) => match r.state {
                    WorkloadState::Pending | WorkloadState::Suspended => false,
                    WorkloadState::Starting | WorkloadState::Running if r.attempt == 1 => {
                        out.push(now.saturating_sub(received));
                        true
                    }
                    _ => true,
                },
            };
            if decided {
                self.awaiting_admission.remove(id);
            }
        }
        out
    }

    fn answer(&self, now: u64, ask: Ask) -> Answer {
        match ask {
            Ask::Why { principal, id } => Answer::Why(match self.daemon.workloads.get(&id) {
                None => Err(HttpError::plain(
                    404,
                    format!("no workload {id}"),
                    Some("list workloads with `allot ls`"),
                )),
                Some(r) if !principal.can_see(&r.spec.project) => {
                    Err(forbidden(&principal, &r.spec.project))
                }
                Some(r) => Ok(self.why(now, id, r.state)),
            }),
            Ask::Report { principal } => {
                let rows = records::report(&self.daemon.ledger, now)
                    .into_iter()
                    .filter(|row| self.row_visible(&principal, &row.scope))
                    .collect();
                Answer::Report(Ok(Report { since_ms: self.daemon.first_ms(), now_ms: now, rows }))
            }
            Ask::History { limit } => {
                let mut export = history::export(&self.daemon, now, limit);
                export.decide_interval_s = Some(self.cadence.decide_interval_ms as f64 / 1000.0);
                Answer::History(Ok(export))
            }
            Ask::Submit { .. } => {
                Answer::Submitted(Err(HttpError::plain(500, "not a query", None)))
            }
            Ask::Act { .. } => Answer::Workload(Err(HttpError::plain(500, "not a query", None))),
            Ask::ApplyPolicy { .. } => {
                Answer::Policy(Err(HttpError::plain(500, "not a query", None)))
            }
            Ask::ShadowReport => Answer::Shadow(self.shadow_answer(now)),
            Ask::StartShadow { .. } | Ask::StopShadow => {
                Answer::Shadow(Err(HttpError::plain(500, "not a query", None)))
            }
        }
    }

    /// The shadow's report, or 404 when none runs.
    fn shadow_answer(&self, now: u64) -> Result<allot_api::ShadowReport, HttpError> {
        self.daemon.shadow_report(now).ok_or_else(|| {
            HttpError::plain(
                404,
                "no policy runs in shadow",
                Some("start one with `allot policy apply FILE --shadow`"),
            )
        })
    }

    fn row_visible(&self, principal: &Principal, scope: &str) -> bool {
        if principal.role != allot_api::Role::Member {
            return true;
        }
        match scope.split_once(':') {
            None => true,
            Some(("project", p)) => principal.can_see(p),
            Some(("user", u)) => u == principal.name,
            Some(("workload", id)) => id
                .parse::<u64>()
                .ok()
                .and_then(|id| self.daemon.workloads.get(&id))
                .is_some_and(|r| principal.can_see(&r.spec.project)),
            Some(_) => false,
        }
    }

    fn why(&self, now: u64, id: u64, state: WorkloadState) -> Why {
        let engine = &self.daemon.engine;
        let record = self.daemon.workloads.get(&id);
        let mut lines = Vec::new();
        let mut decision = None;
        if let Some(e) = engine.explain(Timestamp(now), WorkloadId(id)) {
            let text = engine.render_explanation(&e);
            // The explanation's first line is "name: stage", which every reader of `Why`
            // already shows from `name` and `state`; what it adds is how it was stopped.
            lines.extend(e.stops());
            lines.extend(
                text.lines()
                    .skip(1)
                    .map(|l| crate::views::humanize_times(l.trim()))
                    .filter(|l| !l.is_empty()),
            );
            decision = e.decision.as_ref().map(|d| crate::views::decision_json(engine, d));
        } else {
            lines.push(format!(
                "{} is {}.",
                record.map_or("it", |r| r.spec.name.as_str()),
                state.as_str()
            ));
            if let Some((_, reason)) = record.and_then(|r| r.reason.as_ref()) {
                lines.push(reason.clone());
            }
        }
        Why {
            id,
            name: record.map_or(String::new(), |r| r.spec.name.clone()),
            state,
            lines,
            decision,
        }
    }

    pub(crate) fn policy_view(&self) -> PolicyView {
        PolicyView {
            source: self.daemon.policy_source.clone(),
            text: self.daemon.policy_text.clone(),
            version: self.daemon.policy_version(),
            rollout: self.daemon.rollout_view(self.daemon.last_now),
        }
    }

    /// The probe files of the running workloads, for the driver to read: (workload, heartbeat
    /// file, checkpoint file).
    pub(crate) fn watched_files(&self) -> Vec<(u64, PathBuf, PathBuf)> {
        self.daemon
            .running_ids()
            .into_iter()
            .map(|id| {
                // The files its launch named: a run started by an older allot keeps its paths.
                let launched = |key: &str| {
                    let launch = self.daemon.workloads.get(&id)?.launch.as_ref()?;
                    launch.env.get(key).map(PathBuf::from)
                };
                (
                    id,
                    launched("ALLOT_HEARTBEAT_FILE")
                        .unwrap_or_else(|| self.daemon.heartbeat_path(id)),
                    launched("ALLOT_CHECKPOINT_FILE")
                        .unwrap_or_else(|| self.daemon.checkpoint_path(id)),
                )
            })
            .collect()
    }

    /// The application probes of the running workloads, for the prober.
    pub(crate) fn app_probes(&mut self) -> BTreeMap<u64, allot_api::Probe> {
        let running: BTreeMap<u64, allot_api::Probe> = self
            .daemon
            .running_ids()
            .into_iter()
            .filter_map(|id| {
                let probe = self.daemon.workloads.get(&id)?.request.probe.clone()?;
                Some((id, probe))
            })
            .collect();
        self.probed.retain(|id, _| running.contains_key(id));
        running
    }

    /// Heartbeat files newer than last seen become probes; checkpoint files newer than the
    /// last checkpoint, checkpoint reports.
    fn file_probes(&mut self, files: &[FileTimes]) -> Vec<Entry> {
        let running: std::collections::BTreeSet<u64> =
            self.daemon.running_ids().into_iter().collect();
        self.heartbeats.retain(|id, _| running.contains(id));
        let mut out = Vec::new();
        for f in files.iter().filter(|f| running.contains(&f.id)) {
            if let Some(ms) = f.heartbeat_ms
                && self.heartbeats.get(&f.id) != Some(&ms)
            {
                self.heartbeats.insert(f.id, ms);
                out.push(Entry::Probed { id: f.id, last_activity_ms: ms });
            }
        }
        for f in files.iter().filter(|f| running.contains(&f.id)) {
            let Some(ms) = f.checkpoint_ms else { continue };
            let last = self.daemon.workloads.get(&f.id).and_then(|r| r.last_checkpoint_ms);
            if last.is_none_or(|last| ms > last) {
                out.push(Entry::CheckpointReported { id: f.id, at_ms: ms });
            }
        }
        out
    }

    /// This round's readings of the running workloads' devices, and the workloads without any.
    fn telemetry_round(&mut self, now: u64) -> Vec<Entry> {
        let ids = self.daemon.running_ids();
        let workloads = &self.daemon.workloads;
        self.pods.retain(|run, _| {
            workloads.get(&run.workload).is_some_and(|r| {
                r.launch.as_ref().is_some_and(|l| l.run == *run)
                    && matches!(
                        r.state,
                        WorkloadState::Starting | WorkloadState::Running | WorkloadState::Stopping
                    )
            })
        });
        if ids.is_empty() {
            self.telemetry.readings.clear();
            return Vec::new();
        }
        // Members run in their own process groups; their group ids are the pids they report.
        let members: BTreeMap<u32, u64> = self
            .daemon
            .workloads
            .iter()
            .filter(|(_, r)| r.state == WorkloadState::Running)
            .flat_map(|(id, r)| r.pids.iter().map(move |pid| (*pid, *id)))
            .collect();
        let groups = &self.groups;
        let owner_of = |pid: u32| members.get(groups.get(&pid)?).copied();
        let allocations = self.daemon.allocations(&self.pods);
        let sampled = self.telemetry.attribute(now, &allocations, owner_of);
        let missing: Vec<u64> = ids.into_iter().filter(|id| !sampled.contains_key(id)).collect();
        let mut out = Vec::new();
        if !sampled.is_empty() {
            let workloads = sampled
                .into_iter()
                .map(|(id, readings)| (id, readings.into_iter().map(Into::into).collect()))
                .collect();
            out.push(Entry::Sampled { workloads });
        }
        if !missing.is_empty() {
            out.push(Entry::TelemetryMissing { ids: missing });
        }
        out
    }
}

/// What the backend said of the runs the log says were live, after a restart: a launch it
/// has no record of was cut short by the restart, so the work queues again.
pub(crate) fn recovered_entries(observations: Vec<Observation>) -> Vec<Entry> {
    observations
        .into_iter()
        .map(|o| match observation_entry(o) {
            Entry::LaunchFailed { id, attempt, error, .. } => {
                Entry::LaunchFailed { id, attempt, error, requeue: true }
            }
            other => other,
        })
        .collect()
}

fn observation_entry(o: Observation) -> Entry {
    match o {
        Observation::Started { run, pids } => {
            Entry::Started { id: run.workload, attempt: run.attempt, pids }
        }
        Observation::LaunchFailed { run, error } => {
            Entry::LaunchFailed { id: run.workload, attempt: run.attempt, error, requeue: false }
        }
        Observation::Exited { run, code, detail } => {
            Entry::Exited { id: run.workload, attempt: run.attempt, code, detail, cancelled: false }
        }
        Observation::Cancelled { run, detail } => Entry::Exited {
            id: run.workload,
            attempt: run.attempt,
            code: None,
            detail,
            cancelled: true,
        },
        Observation::LaunchDeferred { run, error } => {
            Entry::LaunchDeferred { id: run.workload, attempt: run.attempt, error }
        }
    }
}

fn forbidden(principal: &Principal, project: &str) -> HttpError {
    HttpError::plain(
        403,
        format!(
            "{} ({}) may not act on project {project:?}",
            principal.name,
            principal.role.as_str()
        ),
        Some("use a token of that project's member, or an admin token"),
    )
}

/// A policy `allot policy apply` cannot move live work to: 422, every problem named.
fn policy_refused(problems: &[String]) -> HttpError {
    HttpError::new(
        422,
        allot_api::ApiError {
            error: format!("the policy cannot be applied: {}", problems.join("; ")),
            field: Some("policy".into()),
            fix: Some(
                "fix the policy file (see `allot policy validate`), or cancel or suspend the \
                 work named, then apply again; nothing was changed"
                    .into(),
            ),
        },
    )
}

#[cfg(test)]
mod tests {
    use allot_telemetry::{DeviceIdentity, Sample, Vendor};

    use super::{Cadence, Daemon, Input, Machine};
    use crate::machine::entry::Entry;

    const CLUSTER: &str = include_str!("../../../../examples/cluster.yaml");
    const POLICY: &str = include_str!("../../../../examples/policy.yaml");

    fn sample(host: &str) -> Sample {
        let mut identity = DeviceIdentity::new(Vendor::Nvidia);
        identity.hostname = Some(host.into());
        identity.gpu_index = Some(0);
        Sample::new(identity)
    }

    /// A machine on `cluster` under `policy` (texts), cycling every second.
    fn machine(cluster: &str, policy: &str, telemetry_round_ms: u64) -> Machine {
        let nodes = allot_config::parse_cluster("cluster.yaml", cluster).expect("cluster");
        let parsed = allot_config::parse_policy("policy.yaml", policy).expect("policy");
        let dir = std::env::temp_dir().join("allot-machine-test");
        let daemon = Daemon::new(nodes, &parsed, ("policy.yaml".into(), policy.into()), dir)
            .expect("daemon");
        Machine::new(daemon, Cadence { decide_interval_ms: 1000, telemetry_round_ms })
    }

    #[test]
    fn telemetry_from_a_host_the_inventory_lacks_is_said_once() {
        let mut machine = machine(CLUSTER, POLICY, 5000);
        let round = || Input::Telemetry {
            samples: vec![sample("h100-0"), sample("gpu-box-7.example.com")],
            groups: Default::default(),
        };
        let out = machine.step(1_000, vec![round()]);
        assert_eq!(out.notes.len(), 1, "{:?}", out.notes);
        assert!(
            out.notes[0].contains("\"gpu-box-7.example.com\" matches no node"),
            "{:?}",
            out.notes
        );
        assert!(out.notes[0].contains("h100-0"), "names nodes it has: {:?}", out.notes);
        assert!(machine.step(2_000, vec![round()]).notes.is_empty(), "said once");
    }

    /// Who took a victim's GPUs is said when it happens: the victim's record keeps only its
    /// later deferrals.
    #[test]
    fn a_preemption_is_said_with_its_victim_claimant_and_reason() {
        let cluster = "nodes:\n  - name: box\n    cpu: 64\n    memory: 512Gi\n    gpus:\n      - {model: H100, count: 2, memory: 80Gi}\n";
        let policy_text = "preemption:\n  mode: requeue\npriority_classes:\n  - {name: normal, value: 0, preemptible: true}\ndefault_priority_class: normal\nprojects:\n  - name: lender\n    cohort: lab\n    quotas:\n      - {model: H100, guaranteed: 1, borrow_limit: 1}\n  - name: borrower\n    cohort: lab\n    quotas:\n      - {model: H100, guaranteed: 1, borrow_limit: 1}\n";
        let mut machine = machine(cluster, policy_text, 3_600_000);
        let submit = |m: &mut Machine, at: u64, id: u64, project: &str, name: &str| {
            let request: allot_api::SubmitRequest = serde_json::from_value(serde_json::json!({
                "name": name, "project": project, "gpus": 1, "command": ["sleep", "600"]}))
            .expect("request");
            m.daemon.apply(at, &Entry::Submitted { id, user: "alice".into(), request });
        };
        submit(&mut machine, 1_000, 1, "borrower", "first");
        submit(&mut machine, 1_000, 2, "borrower", "second");
        let out = machine.step(1_000, vec![]);
        assert!(out.cycled && out.notes.is_empty(), "{:?}", out.notes);
        for id in [1, 2] {
            machine.daemon.apply(1_500, &Entry::Started { id, attempt: 1, pids: vec![] });
        }
        submit(&mut machine, 60_000, 3, "lender", "claimant");
        let out = machine.step(61_000, vec![]);
        let said: Vec<&String> = out.notes.iter().filter(|n| n.starts_with("stopped ")).collect();
        assert_eq!(said.len(), 1, "{:?}", out.notes);
        assert!(said[0].starts_with("stopped #1 first (borrower): "), "{said:?}");
        assert!(said[0].contains("requeue for claimant: quota reclaim"), "{said:?}");
        assert!(said[0].ends_with("[quota_reclaim]"), "{said:?}");
        // Said once: the next cycle decides nothing new.
        assert!(machine.step(62_000, vec![]).notes.is_empty());
    }
}
