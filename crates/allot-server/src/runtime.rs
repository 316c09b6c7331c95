//! The main loop: one thread owns the store and the daemon state. API handlers send it requests,
//! the executor thread (which owns the backend) sends it observations; it batches them, makes
//! their entries durable in one transaction, applies them, runs a cycle when one is due, and
//! only then answers and hands commands (launch, signal) to the executor. Readers get a view the
//! loop updates; nothing else writes.

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use allot_api::{
    ApiError, Node, Project, Report, SubmitRequest, SubmitResponse, Why, Workload, WorkloadState,
};
use allot_backend::{Backend, Observation, RunId};
use allot_core::{Timestamp, WorkloadId};
use allot_store::{NewRecord, Store};
use tokio::sync::oneshot;

use crate::auth::Principal;
use crate::daemon::{Command, Daemon};
use crate::entry::Entry;
use crate::metrics::{DeviceLabels, Metrics, ProjectLabel, ReasonLabel, StateLabel};
use crate::views;

/// Most requests made durable in one transaction.
pub(crate) const BATCH_MAX: usize = 1024;
/// Most requests waiting for the loop; more are refused with 503.
pub(crate) const QUEUE_MAX: usize = 16 * 1024;
/// How often the loop wakes without requests (escalations, cycles).
const TICK_MS: u64 = 50;
/// How often the executor polls the backend.
const POLL_MS: u64 = 50;
/// How often heartbeat files are looked at.
const PROBE_MS: u64 = 1_000;
/// Node states and foreign work are read this often (on Slurm a `sinfo --json` and a
/// `squeue --Format`, about 0.2 s at 1,000 jobs).
pub(crate) const CLUSTER_WATCH_MS: u64 = 5_000;
/// How often running workloads get a telemetry round by default. No collector exists yet, so
/// every round reports telemetry missing (the idle rules' `missing_telemetry` decides what that
/// means).
pub(crate) const TELEMETRY_ROUND_MS: u64 = 5_000;
/// How often the readers' project and node views are rebuilt at most.
const VIEW_REFRESH_MS: u64 = 200;

#[derive(Debug)]
pub(crate) struct HttpError {
    pub status: u16,
    pub body: ApiError,
}

impl HttpError {
    pub(crate) fn new(status: u16, body: ApiError) -> HttpError {
        HttpError { status, body }
    }

    pub(crate) fn plain(status: u16, error: impl Into<String>, fix: Option<&str>) -> HttpError {
        HttpError {
            status,
            body: ApiError { error: error.into(), field: None, fix: fix.map(str::to_string) },
        }
    }
}

type Reply<T> = oneshot::Sender<Result<T, HttpError>>;

#[derive(Debug)]
pub(crate) enum Request {
    Submit {
        principal: Principal,
        request: SubmitRequest,
        reply: Reply<SubmitResponse>,
        /// When the API received it (for the submit-to-admit histogram).
        received: std::time::Instant,
    },
    Action {
        principal: Principal,
        id: u64,
        entry: Entry,
        reply: Reply<Workload>,
    },
    Why {
        principal: Principal,
        id: u64,
        reply: Reply<Why>,
    },
    Report {
        principal: Principal,
        reply: Reply<Report>,
    },
    /// `allot policy apply` (admins only; the API checks the role).
    ApplyPolicy {
        source: String,
        text: String,
        reply: Reply<allot_api::PolicyView>,
    },
    /// The workloads as a job trace (`GET /api/v1/history`, the dashboard's what-if).
    History {
        limit: usize,
        reply: Reply<allot_api::HistoryExport>,
    },
    /// What the backend saw (from the executor thread).
    Observed(Vec<Observation>),
    /// Node states and foreign work on the cluster (from the executor thread).
    Cluster(allot_backend::ClusterNews),
    /// Runs the backend keeps stopped work for (accepted requeues, from the executor thread).
    Kept(Vec<RunId>),
    /// The devices started runs actually hold (from the executor thread).
    Placed(Vec<(RunId, Vec<allot_backend::MemberLaunch>)>),
    /// Device samples from the collector thread or a node agent.
    Telemetry(Vec<allot_telemetry::Sample>),
    /// What the backend said of the runs live at start, asked once it answered.
    Recovered(Vec<Observation>),
    /// The backend stopped answering (`Some(error)`) or answers again (from the executor).
    BackendHealth(Option<String>),
    /// An application probe saw the workload in use (from the prober thread).
    Probed {
        id: u64,
        last_activity_ms: u64,
    },
    Shutdown,
}

/// What readers see without asking the loop.
#[derive(Debug, Default)]
pub(crate) struct View {
    pub workloads: BTreeMap<u64, Workload>,
    pub projects: Vec<Project>,
    pub nodes: Vec<Node>,
    pub inventory_source: String,
    pub policy_source: String,
    pub policy_text: String,
    /// The dashboard's fleet samples and workload timelines.
    pub dashboard: crate::dashboard::Tracker,
    /// Some telemetry round had readings: the ledger's active and idle hours are measured.
    pub telemetry_seen: bool,
    /// Whether the backend answers.
    pub backend: allot_api::BackendStatus,
    /// What the last inventory change did.
    pub inventory_note: Option<String>,
}

#[derive(Clone, Debug)]
pub(crate) struct Handle {
    pub sender: SyncSender<Request>,
    pub view: Arc<RwLock<View>>,
}

impl Handle {
    /// Sends to the loop without waiting for an answer; a full queue is a 503.
    pub(crate) fn send(&self, request: Request) -> Result<(), HttpError> {
        match self.sender.try_send(request) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(HttpError::plain(
                503,
                "allot is busy: too many requests queued",
                Some("retry in a moment"),
            )),
            Err(TrySendError::Disconnected(_)) => Err(HttpError::plain(
                500,
                "allot's main loop has stopped",
                Some("see the daemon's log; restart it"),
            )),
        }
    }

    /// Sends to the loop; a full queue is a 503, a stopped loop a 500.
    pub(crate) async fn ask<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> Request,
    ) -> Result<T, HttpError> {
        let (tx, rx) = oneshot::channel();
        match self.sender.try_send(make(tx)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(HttpError::plain(
                    503,
                    "allot is busy: too many requests queued",
                    Some("retry in a moment"),
                ));
            }
            Err(TrySendError::Disconnected(_)) => {
                return Err(HttpError::plain(
                    500,
                    "allot's main loop has stopped",
                    Some("see the daemon's log; restart it"),
                ));
            }
        }
        rx.await.map_err(|_| {
            HttpError::plain(
                500,
                "allot's main loop stopped before answering",
                Some("see the daemon's log; restart it"),
            )
        })?
    }
}

#[allow(clippy::disallowed_methods)] // the daemon's clock: the one place wall time enters
pub(crate) fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[allow(clippy::disallowed_methods)] // latency histograms measure real time
fn elapsed_s(f: impl FnOnce()) -> f64 {
    let start = std::time::Instant::now();
    f();
    start.elapsed().as_secs_f64()
}

pub(crate) struct Loop {
    pub store: Box<dyn Store>,
    pub daemon: Daemon,
    /// The backend until `run` moves it to the executor thread.
    backend: Option<Box<dyn Backend>>,
    /// Commands for the executor thread (set by `run`).
    executor: Option<std::sync::mpsc::Sender<Command>>,
    /// Commands decided before the executor runs (during recovery).
    pending_commands: Vec<Command>,
    pub metrics: Arc<Metrics>,
    pub view: Arc<RwLock<View>>,
    pub decide_interval_ms: u64,
    pub telemetry_round_ms: u64,
    /// How often the executor asks the backend for node states and foreign work.
    pub cluster_watch_ms: u64,
    pub heartbeats: BTreeMap<u64, u64>,
    last_view_ms: u64,
    awaiting_admission: BTreeMap<u64, std::time::Instant>,
    /// Log records between snapshots (taken right after a cycle).
    pub snapshot_every: u64,
    /// The seq of the latest snapshot (0: none).
    snapshot_seq: u64,
    /// The log's last seq (kept by `append`, so a cycle asks the store nothing).
    last_seq: u64,
    /// The newest sample per device, and the last round's attribution.
    pub telemetry: crate::telemetry::Latest,
    /// Running workloads' application probes, for the prober thread.
    probe_table: crate::telemetry::ProbeTable,
    /// The last activity each probe reported (only news is logged).
    probed: BTreeMap<u64, u64>,
    /// Cycles logged since the latest snapshot: a replay re-runs each over the queue of its
    /// time, so they, not records, dominate a restart with a deep queue.
    cycles_since_snapshot: u64,
}

/// Part of its share a device must have busy to count as active in `allot_active_gpus` (the
/// idle rules judge with their own thresholds).
const ACTIVE_PERMILLE: u16 = 100;

/// Log records between snapshots by default: a restart replays at most about this many.
pub(crate) const SNAPSHOT_EVERY: u64 = 10_000;

/// Most submissions timed to their admission at once (the rest are not timed).
const AWAITING_ADMISSION_MAX: usize = 100_000;

/// An entry waiting for durability, and whom to answer once it is.
enum Pending {
    Submitted(Reply<SubmitResponse>, u64),
    Acted(Reply<Workload>, u64),
    Policy(Reply<allot_api::PolicyView>),
}

impl Loop {
    pub(crate) fn new(
        store: Box<dyn Store>,
        daemon: Daemon,
        backend: Box<dyn Backend>,
        metrics: Arc<Metrics>,
        view: Arc<RwLock<View>>,
        decide_interval_ms: u64,
    ) -> Loop {
        Loop {
            store,
            daemon,
            backend: Some(backend),
            executor: None,
            pending_commands: Vec::new(),
            metrics,
            view,
            decide_interval_ms,
            telemetry_round_ms: TELEMETRY_ROUND_MS,
            cluster_watch_ms: CLUSTER_WATCH_MS,
            heartbeats: BTreeMap::new(),
            last_view_ms: 0,
            awaiting_admission: BTreeMap::new(),
            snapshot_every: SNAPSHOT_EVERY,
            snapshot_seq: 0,
            last_seq: 0,
            cycles_since_snapshot: 0,
            telemetry: crate::telemetry::Latest::default(),
            probe_table: crate::telemetry::ProbeTable::default(),
            probed: BTreeMap::new(),
        }
    }

    /// Replays the log into the daemon state (nothing is executed), then asks the backend
    /// what became of the runs the log says were live, and logs what it says.
    pub(crate) fn recover(
        &mut self,
        discovered: Option<&[allot_core::NodeSpec]>,
        unreachable: Option<String>,
    ) -> anyhow::Result<u64> {
        self.last_seq = self.store.last_seq()?;
        let mut after = 0;
        let mut replayed = 0u64;
        if let Some(snapshot) = self.store.latest_snapshot()? {
            let nodes = self.daemon.nodes.clone();
            let data_dir = self.daemon.data_dir.clone();
            match Daemon::from_snapshot(nodes, data_dir, &snapshot.body) {
                Ok(daemon) => {
                    self.daemon = daemon;
                    after = snapshot.seq;
                    self.snapshot_seq = snapshot.seq;
                }
                // Without the records before it the log cannot rebuild the state: stop here
                // rather than start from a partial history.
                Err(e) if self.store.read_after(0, 1)?.first().is_none_or(|r| r.seq > 1) => {
                    return Err(e.context(format!(
                        "the snapshot at log record {} cannot be used and the log before it is \
                         gone; run the allot version that wrote it, or restore the data \
                         directory from a backup",
                        snapshot.seq
                    )));
                }
                Err(e) => tracing_log(&format!(
                    "the snapshot at log record {} is not used ({e:#}); replaying the whole log",
                    snapshot.seq
                )),
            }
        }
        loop {
            let records = self.store.read_after(after, 4096)?;
            if records.is_empty() {
                break;
            }
            for r in &records {
                let entry: Entry = serde_json::from_str(&r.body).map_err(|e| {
                    anyhow::anyhow!(
                        "the log's record {} ({}) cannot be read: {e}; the data directory was written by another allot version or damaged — restore it from a backup",
                        r.seq, r.kind
                    )
                })?;
                self.daemon.apply(r.at_ms, &entry);
                replayed += 1;
            }
            after = records.last().map_or(after, |r| r.seq);
        }
        // The inventory may have changed while the daemon was down: an entry, like any other.
        if let Some(entry) = discovered.and_then(|d| self.daemon.inventory_entry(d)) {
            let now = self.daemon.clamp(wall_ms());
            let commands = self.daemon.apply(now, &entry);
            self.append(now, std::slice::from_ref(&entry))?;
            self.execute(commands);
            if let Some(note) = &self.daemon.inventory_note {
                tracing_log(&format!("the inventory changed since the log was written: {note}"));
            }
        }
        let launches = self.daemon.live_launches();
        let mut down = unreachable;
        let observations = match (self.backend.as_mut(), &down) {
            (Some(backend), None) => match backend.recover(&launches) {
                Ok(observations) => observations,
                Err(e) if e.is_transient() => {
                    down = Some(e.to_string());
                    Vec::new()
                }
                Err(e) => return Err(e.into()),
            },
            _ => Vec::new(),
        };
        let now = self.daemon.clamp(wall_ms());
        let mut entries: Vec<Entry> = Vec::new();
        if let Some(error) = &down {
            // The executor asks again once the backend answers (`Command::Recover`).
            tracing_log(&format!(
                "the backend is unreachable at start ({error}): runs are recovered once it answers"
            ));
            entries.push(Entry::BackendUnreachable { error: error.clone() });
            self.pending_commands.push(Command::Recover(launches));
        } else if self.daemon.backend_down.is_some() {
            entries.push(Entry::BackendReachable);
        }
        entries.extend(recovered_entries(observations));
        let mut commands = Vec::new();
        for e in &entries {
            commands.extend(self.daemon.apply(now, e));
        }
        self.append(now, &entries)?;
        // Stops that were under way: their current step again, then escalate from now
        // (signals are idempotent).
        commands.extend(self.daemon.resend_stops(now));
        commands.extend(self.daemon.due_signals(now));
        self.execute(commands);
        self.daemon.changed.extend(self.daemon.workloads.keys().copied());
        self.refresh_view(now, true);
        Ok(replayed)
    }

    /// After recovery: the policy given at this start, if it is not the one in effect, is
    /// applied as `allot policy apply` would (logged first); if live work cannot move to it
    /// the start is refused with every problem named, and nothing is changed.
    pub(crate) fn start_with_policy(&mut self, source: &str, text: &str) -> anyhow::Result<()> {
        match self.daemon.prepare_policy(source, text) {
            Ok(None) => Ok(()),
            Ok(Some(entry)) => {
                let now = self.daemon.clamp(wall_ms());
                self.append(now, std::slice::from_ref(&entry))?;
                let commands = self.daemon.apply(now, &entry);
                self.execute(commands);
                tracing_log(&format!(
                    "the policy changed since the last start: {source} applied to the live work"
                ));
                self.refresh_view(now, true);
                Ok(())
            }
            Err(problems) => Err(anyhow::anyhow!(
                "{source} cannot be applied to this data directory's live work: {}; start with \
                 the policy in effect (`allot policy show`), or cancel or suspend the work named",
                problems.join("; ")
            )),
        }
    }

    fn append(&mut self, now: u64, entries: &[Entry]) -> anyhow::Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let bodies: Vec<String> =
            entries.iter().map(serde_json::to_string).collect::<Result<_, _>>()?;
        let records: Vec<NewRecord<'_>> = entries
            .iter()
            .zip(&bodies)
            .map(|(e, b)| NewRecord { at_ms: now, kind: e.kind(), body: b })
            .collect();
        let mut result = Ok(0);
        let seconds = elapsed_s(|| result = self.store.append(&records));
        self.metrics.log_append_seconds.observe(seconds);
        self.last_seq = result?;
        Ok(())
    }

    /// Hands commands to the executor (in order); they run after the entries that caused them
    /// are durable, because the loop calls this only after `append`.
    fn execute(&mut self, commands: Vec<Command>) {
        if commands.iter().any(|c| matches!(c, Command::Launch(_))) {
            let _ = std::fs::create_dir_all(self.daemon.heartbeat_dir());
        }
        for command in commands {
            match &self.executor {
                Some(tx) => {
                    if tx.send(command).is_err() {
                        tracing_log("the backend executor has stopped; commands are dropped");
                    }
                }
                None => self.pending_commands.push(command),
            }
        }
    }

    /// Heartbeat files newer than last seen become probes; checkpoint files newer than the last
    /// checkpoint, checkpoint reports.
    fn probes(&mut self) -> Vec<Entry> {
        let mut out = Vec::new();
        for id in self.daemon.running_ids() {
            let Some(ms) = modified_ms(&self.daemon.heartbeat_path(id)) else { continue };
            if self.heartbeats.get(&id) != Some(&ms) {
                self.heartbeats.insert(id, ms);
                out.push(Entry::Probed { id, last_activity_ms: ms });
            }
        }
        for id in self.daemon.running_ids() {
            let Some(ms) = modified_ms(&self.daemon.checkpoint_path(id)) else { continue };
            let last = self.daemon.workloads.get(&id).and_then(|r| r.last_checkpoint_ms);
            if last.is_none_or(|last| ms > last) {
                out.push(Entry::CheckpointReported { id, at_ms: ms });
            }
        }
        out
    }

    /// The prober thread asks the probes of the workloads running now.
    fn update_probe_table(&mut self) {
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
        if let Ok(mut table) = self.probe_table.lock() {
            *table = running;
        }
    }

    /// This round's readings of the running workloads' devices, and the workloads without any.
    fn telemetry_round(&mut self, now: u64) -> Vec<Entry> {
        let ids = self.daemon.running_ids();
        if ids.is_empty() {
            self.telemetry.readings.clear();
            return Vec::new();
        }
        // Members run in their own process groups; their group ids are the pids they report.
        let groups: BTreeMap<u32, u64> = self
            .daemon
            .workloads
            .iter()
            .filter(|(_, r)| r.state == WorkloadState::Running)
            .flat_map(|(id, r)| r.pids.iter().map(move |pid| (*pid, *id)))
            .collect();
        let owner_of = |pid: u32| groups.get(&process_group(pid)?).copied();
        let sampled = self.telemetry.attribute(now, &self.daemon.allocations(), owner_of);
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

    /// Runs until `Shutdown` or until every sender is gone.
    pub(crate) fn run(
        mut self,
        requests: Receiver<Request>,
        observations: SyncSender<Request>,
    ) -> anyhow::Result<()> {
        {
            let (table, tx) = (self.probe_table.clone(), observations.clone());
            std::thread::Builder::new()
                .name("allot-prober".into())
                .spawn(move || crate::telemetry::run_probes(&table, &tx))?;
        }
        if let Some(backend) = self.backend.take() {
            let watch_every = Duration::from_millis(self.cluster_watch_ms);
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name("allot-executor".into())
                .spawn(move || execute_commands(backend, &rx, &observations, watch_every))?;
            self.executor = Some(tx);
            let pending = std::mem::take(&mut self.pending_commands);
            self.execute(pending);
        }
        let mut last_probe = 0u64;
        let mut last_telemetry = 0u64;
        loop {
            // Sleep until the next request, the next tick, or the moment a due cycle may run.
            let wait =
                self.daemon.cycle_wait_ms(self.daemon.clamp(wall_ms()), self.decide_interval_ms);
            let first = match requests
                .recv_timeout(Duration::from_millis(wait.unwrap_or(TICK_MS).min(TICK_MS)))
            {
                Ok(r) => Some(r),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            };
            let mut batch: Vec<Request> = first.into_iter().collect();
            while batch.len() < BATCH_MAX {
                match requests.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
            // A shutdown still handles what came with it (observations above all), then stops.
            let shutdown = batch.iter().any(|r| matches!(r, Request::Shutdown));
            let now = self.daemon.clamp(wall_ms());
            let mut entries: Vec<Entry> = Vec::new();
            let mut waiting: Vec<Pending> = Vec::new();
            let mut commands: Vec<Command> = Vec::new();
            let mut queries = Vec::new();
            for request in batch {
                match request {
                    Request::Submit { principal, request, reply, received } => {
                        if !principal.can_act(&request.project) {
                            let _ = reply.send(Err(forbidden(&principal, &request.project)));
                            continue;
                        }
                        match self.daemon.prepare_submit(&principal.name, request) {
                            Ok(entry) => {
                                let Entry::Submitted { id, .. } = &entry else { continue };
                                let id = *id;
                                commands.extend(self.daemon.apply(now, &entry));
                                entries.push(entry);
                                waiting.push(Pending::Submitted(reply, id));
                                if self.awaiting_admission.len() < AWAITING_ADMISSION_MAX {
                                    self.awaiting_admission.insert(id, received);
                                }
                            }
                            Err(e) => {
                                let _ = reply.send(Err(HttpError::new(400, e)));
                            }
                        }
                    }
                    Request::Action { principal, id, entry, reply } => {
                        if let Some(project) =
                            self.daemon.workloads.get(&id).map(|r| r.spec.project.clone())
                            && !principal.can_act(&project)
                        {
                            let _ = reply.send(Err(forbidden(&principal, &project)));
                            continue;
                        }
                        match self.daemon.prepare_action(id, entry) {
                            Ok(entry) => {
                                commands.extend(self.daemon.apply(now, &entry));
                                entries.push(entry);
                                waiting.push(Pending::Acted(reply, id));
                            }
                            Err(e) => {
                                let status =
                                    if self.daemon.workloads.contains_key(&id) { 409 } else { 404 };
                                let _ = reply.send(Err(HttpError::new(status, e)));
                            }
                        }
                    }
                    Request::ApplyPolicy { source, text, reply } => {
                        match self.daemon.prepare_policy(&source, &text) {
                            Ok(Some(entry)) => {
                                commands.extend(self.daemon.apply(now, &entry));
                                entries.push(entry);
                                waiting.push(Pending::Policy(reply));
                            }
                            Ok(None) => {
                                let _ = reply.send(Ok(self.policy_view()));
                            }
                            Err(problems) => {
                                let _ = reply.send(Err(policy_refused(&problems)));
                            }
                        }
                    }
                    Request::Telemetry(samples) => self.telemetry.take(samples),
                    Request::Probed { id, last_activity_ms } => {
                        if self.probed.get(&id).is_none_or(|last| last_activity_ms > *last) {
                            self.probed.insert(id, last_activity_ms);
                            let e = Entry::Probed { id, last_activity_ms };
                            apply_logged(&mut self.daemon, now, e, &mut entries, &mut commands);
                        }
                    }
                    Request::Recovered(observations) => {
                        for e in recovered_entries(observations) {
                            apply_logged(&mut self.daemon, now, e, &mut entries, &mut commands);
                        }
                    }
                    Request::BackendHealth(down) => {
                        let e = match down {
                            Some(error) => Entry::BackendUnreachable { error },
                            None => Entry::BackendReachable,
                        };
                        apply_logged(&mut self.daemon, now, e, &mut entries, &mut commands);
                    }
                    Request::Kept(runs) => {
                        for run in runs {
                            let e = Entry::Kept { id: run.workload, attempt: run.attempt };
                            apply_logged(&mut self.daemon, now, e, &mut entries, &mut commands);
                        }
                    }
                    Request::Placed(placed) => {
                        for (run, reported) in placed {
                            let Some(members) = self.daemon.bound_members(run, &reported) else {
                                continue;
                            };
                            let e = Entry::DevicesReported {
                                id: run.workload,
                                attempt: run.attempt,
                                members,
                            };
                            apply_logged(&mut self.daemon, now, e, &mut entries, &mut commands);
                        }
                    }
                    Request::Cluster(news) => {
                        // The shape first, so that node states can name nodes just added.
                        let inventory = news.inventory.as_deref();
                        if let Some(e) = inventory.and_then(|n| self.daemon.inventory_entry(n)) {
                            apply_logged(&mut self.daemon, now, e, &mut entries, &mut commands);
                        }
                        for e in self.daemon.cluster_entries(&news) {
                            apply_logged(&mut self.daemon, now, e, &mut entries, &mut commands);
                        }
                    }
                    Request::Observed(observations) => {
                        for o in observations {
                            let e = observation_entry(o);
                            apply_logged(&mut self.daemon, now, e, &mut entries, &mut commands);
                        }
                    }
                    other => queries.push(other),
                }
            }
            if now.saturating_sub(last_probe) >= PROBE_MS {
                last_probe = now;
                self.update_probe_table();
                for e in self.probes() {
                    apply_logged(&mut self.daemon, now, e, &mut entries, &mut commands);
                }
                if now.saturating_sub(last_telemetry) >= self.telemetry_round_ms {
                    last_telemetry = now;
                    for e in self.telemetry_round(now) {
                        apply_logged(&mut self.daemon, now, e, &mut entries, &mut commands);
                    }
                }
            }
            if self.daemon.cycle_due(now, self.decide_interval_ms) {
                let mut cycle = Vec::new();
                let seconds = elapsed_s(|| cycle = self.daemon.apply(now, &Entry::Decided));
                self.metrics.cycle_seconds.observe(seconds);
                commands.extend(cycle);
                entries.push(Entry::Decided);
            }
            // Durable before anything is answered or done. If this fails the state in memory is
            // ahead of the log: stop (nothing was acknowledged) and let a restart replay.
            self.append(now, &entries)?;
            // Readers see what was acknowledged before the acknowledgement arrives.
            self.refresh_view(now, false);
            for p in waiting {
                match p {
                    Pending::Submitted(reply, id) => {
                        self.metrics.submissions.inc();
                        let state = self
                            .daemon
                            .workloads
                            .get(&id)
                            .map_or(WorkloadState::Pending, |r| r.state);
                        let _ = reply.send(Ok(SubmitResponse { id, state }));
                    }
                    Pending::Acted(reply, id) => {
                        let w = self.daemon.workloads.get(&id).map(|r| views::workload(id, r));
                        let _ = reply.send(w.ok_or_else(|| {
                            HttpError::plain(404, format!("no workload {id}"), None)
                        }));
                    }
                    Pending::Policy(reply) => {
                        let _ = reply.send(Ok(self.policy_view()));
                    }
                }
            }
            if matches!(entries.last(), Some(Entry::Decided)) {
                self.maybe_snapshot(now)?;
            }
            if !self.awaiting_admission.is_empty()
                && entries.iter().any(|e| matches!(e, Entry::Decided))
            {
                self.observe_admissions();
            }
            commands.extend(self.daemon.due_signals(now));
            self.execute(commands);
            for q in queries {
                self.answer(now, q);
            }
            self.refresh_view(now, false);
            if shutdown {
                return Ok(());
            }
        }
    }

    /// Submissions the last cycle decided on for good (admitted, or ended otherwise) leave the
    /// map; admitted ones are timed from their arrival at the API.
    fn observe_admissions(&mut self) {
        let daemon = &self.daemon;
        let metrics = &self.metrics;
        self.awaiting_admission.retain(|id, received| {
            let Some(r) = daemon.workloads.get(id) else { return false };
            match r.state {
                WorkloadState::Pending | WorkloadState::Suspended => true,
                WorkloadState::Starting | WorkloadState::Running if r.attempt == 1 => {
                    metrics.submit_to_admit_seconds.observe(received.elapsed().as_secs_f64());
                    false
                }
                _ => false,
            }
        });
    }

    fn answer(&mut self, now: u64, request: Request) {
        match request {
            Request::Why { principal, id, reply } => {
                let result = match self.daemon.workloads.get(&id) {
                    None => Err(HttpError::plain(
                        404,
                        format!("no workload {id}"),
                        Some("list workloads with `allot ls`"),
                    )),
                    Some(r) if !principal.can_see(&r.spec.project) => {
                        Err(forbidden(&principal, &r.spec.project))
                    }
                    Some(r) => Ok(self.why(now, id, r.state)),
                };
                let _ = reply.send(result);
            }
            Request::Report { principal, reply } => {
                let rows = views::report(&self.daemon.ledger, now)
                    .into_iter()
                    .filter(|row| self.row_visible(&principal, &row.scope))
                    .collect();
                let _ =
                    reply.send(Ok(Report { since_ms: self.daemon.first_ms(), now_ms: now, rows }));
            }
            Request::History { limit, reply } => {
                let _ = reply.send(Ok(crate::whatif::export(&self.daemon, now, limit)));
            }
            _ => {}
        }
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
            lines.extend(
                text.lines().map(|l| views::humanize_times(l.trim())).filter(|l| !l.is_empty()),
            );
            decision = e.decision.as_ref().map(|d| views::decision_json(engine, d));
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

    fn policy_view(&self) -> allot_api::PolicyView {
        allot_api::PolicyView {
            source: self.daemon.policy_source.clone(),
            text: self.daemon.policy_text.clone(),
        }
    }

    /// Right after a cycle, once `snapshot_every` records or a hundredth as many cycles have
    /// followed the last snapshot: saves the state and drops the log before the previous
    /// snapshot (one snapshot's worth of log stays, for inspection). A failure is logged, not
    /// fatal: the log is still whole.
    fn maybe_snapshot(&mut self, now: u64) -> anyhow::Result<()> {
        self.cycles_since_snapshot += 1;
        let last = self.last_seq;
        if last.saturating_sub(self.snapshot_seq) < self.snapshot_every
            && self.cycles_since_snapshot < (self.snapshot_every / 100).max(1)
        {
            return Ok(());
        }
        let mut taken = Ok(None);
        let seconds = elapsed_s(|| taken = self.daemon.snapshot());
        let body = match taken {
            Ok(Some(body)) => body,
            Ok(None) => return Ok(()),
            Err(e) => {
                tracing_log(&format!("no snapshot: {e:#}"));
                return Ok(());
            }
        };
        self.metrics.snapshot_seconds.observe(seconds);
        let previous = self.snapshot_seq;
        match self.store.put_snapshot(&allot_store::Snapshot { seq: last, at_ms: now, body }) {
            Ok(()) => {
                self.snapshot_seq = last;
                self.cycles_since_snapshot = 0;
                if previous > 0
                    && let Err(e) = self.store.compact_through(previous)
                {
                    tracing_log(&format!("the log was not compacted: {e}"));
                }
            }
            Err(e) => tracing_log(&format!("no snapshot: {e}")),
        }
        Ok(())
    }

    fn refresh_view(&mut self, now: u64, force: bool) {
        let changed = std::mem::take(&mut self.daemon.changed);
        let full = force || now.saturating_sub(self.last_view_ms) >= VIEW_REFRESH_MS;
        if changed.is_empty() && !full {
            return;
        }
        let Ok(mut view) = self.view.write() else { return };
        if view.policy_text != self.daemon.policy_text {
            view.policy_text.clone_from(&self.daemon.policy_text);
            view.policy_source.clone_from(&self.daemon.policy_source);
        }
        for id in changed {
            if let Some(r) = self.daemon.workloads.get(&id) {
                let new = views::workload(id, r);
                let fields = &mut *view;
                fields.dashboard.observe(&new, &r.steps);
                fields.workloads.insert(id, new);
            }
        }
        if !full {
            return;
        }
        self.last_view_ms = now;
        let engine = &self.daemon.engine;
        view.projects = views::projects(engine, self.daemon.workloads.values());
        let live = self.daemon.workloads.iter().filter(|(_, r)| {
            matches!(
                r.state,
                WorkloadState::Starting | WorkloadState::Running | WorkloadState::Stopping
            )
        });
        let withheld: BTreeMap<String, String> = self
            .daemon
            .nodes
            .iter()
            .filter_map(|n| Some((n.name.clone(), self.daemon.withheld_reason(&n.name)?)))
            .collect();
        view.nodes = views::nodes(engine, &self.daemon.nodes, &withheld, live);
        view.backend.reachable = self.daemon.backend_down.is_none();
        view.backend.unreachable_since_ms = self.daemon.backend_down.as_ref().map(|d| d.since_ms);
        view.backend.error = self.daemon.backend_down.as_ref().map(|d| d.error.clone());
        view.inventory_note.clone_from(&self.daemon.inventory_note);
        let fields = &mut *view;
        fields.telemetry_seen = self.daemon.counters.sampled > 0;
        let active = self.telemetry.active_shares(ACTIVE_PERMILLE);
        fields.dashboard.sample(now, || engine.cluster_snapshot(), &fields.workloads, active);
        drop(view);
        crate::dashboard::derived::refresh(&self.view, &self.daemon, now);
        self.update_metrics();
    }

    fn update_metrics(&self) {
        let m = &self.metrics;
        let Ok(view) = self.view.read() else { return };
        for p in &view.projects {
            let label = ProjectLabel { project: p.name.clone() };
            let used: f64 = p.quota.iter().filter_map(|q| q.used_gpus.parse::<f64>().ok()).sum();
            m.allocated_gpus.get_or_create(&label).set(used);
            m.queue_length.get_or_create(&label).set(p.pending as i64);
        }
        for n in &view.nodes {
            for d in &n.devices {
                m.device_allocated
                    .get_or_create(&DeviceLabels {
                        node: n.name.clone(),
                        device: d.index.to_string(),
                        model: d.model.clone(),
                    })
                    .set(d.used_shares as f64 / 1000.0);
            }
        }
        let mut by_state: BTreeMap<&str, i64> = BTreeMap::new();
        let mut by_reason: BTreeMap<String, i64> = BTreeMap::new();
        let mut idle: BTreeMap<String, f64> = BTreeMap::new();
        for r in self.daemon.workloads.values() {
            *by_state.entry(r.state.as_str()).or_default() += 1;
            let code = r.reason.as_ref().map(|(c, _)| c.clone()).unwrap_or_default();
            if r.state == WorkloadState::Pending {
                *by_reason.entry(code).or_default() += 1;
            } else if r.state == WorkloadState::Running && code == "idle_warning" {
                *idle.entry(r.spec.project.clone()).or_default() +=
                    r.spec.total_shares().0 as f64 / 1000.0;
            }
        }
        for state in [
            "pending",
            "starting",
            "running",
            "stopping",
            "suspended",
            "succeeded",
            "failed",
            "cancelled",
            "rejected",
        ] {
            m.workloads_by_state
                .get_or_create(&StateLabel { state: state.into() })
                .set(*by_state.get(state).unwrap_or(&0));
        }
        m.pending_by_reason.clear();
        for (reason, n) in by_reason {
            m.pending_by_reason.get_or_create(&ReasonLabel { reason }).set(n);
        }
        for p in &view.projects {
            m.idle_gpus
                .get_or_create(&ProjectLabel { project: p.name.clone() })
                .set(*idle.get(&p.name).unwrap_or(&0.0));
        }
        m.backend_up.set(i64::from(self.daemon.backend_down.is_none()));
        for (reason, n) in &self.daemon.counters.preemptions {
            m.preemptions.get_or_create(&ReasonLabel { reason: reason.clone() }).set(*n as i64);
        }
        // Active: allocated GPUs whose last reading shows at least ACTIVE_PERMILLE of the share
        // busy; only workloads with telemetry count (the rest is neither active nor idle).
        let mut active: BTreeMap<String, f64> = BTreeMap::new();
        let mut measured: BTreeMap<String, f64> = BTreeMap::new();
        for (id, readings) in &self.telemetry.readings {
            let Some(r) = self.daemon.workloads.get(id) else { continue };
            for reading in readings {
                let gpus = f64::from(reading.shares) / 1000.0;
                *measured.entry(r.spec.project.clone()).or_default() += gpus;
                if crate::telemetry::busy(reading, ACTIVE_PERMILLE) {
                    *active.entry(r.spec.project.clone()).or_default() += gpus;
                }
            }
        }
        for p in &view.projects {
            let label = ProjectLabel { project: p.name.clone() };
            m.active_gpus.get_or_create(&label).set(*active.get(&p.name).unwrap_or(&0.0));
            m.measured_gpus.get_or_create(&label).set(*measured.get(&p.name).unwrap_or(&0.0));
        }
        m.device_activity.clear();
        for s in self.telemetry.samples.values() {
            if let (Some(host), Some(index), Some(v)) =
                (&s.identity.hostname, s.identity.gpu_index, s.signal_value())
            {
                m.device_activity
                    .get_or_create(&DeviceLabels {
                        node: host.clone(),
                        device: index.to_string(),
                        model: s.identity.model.clone().unwrap_or_default(),
                    })
                    .set(f64::from(v) / 1000.0);
            }
        }
    }
}

/// Applies an input to the daemon and keeps it for this batch's append, with the commands it
/// caused (they run only once the batch is durable).
fn apply_logged(
    daemon: &mut Daemon,
    now: u64,
    entry: Entry,
    entries: &mut Vec<Entry>,
    commands: &mut Vec<Command>,
) {
    commands.extend(daemon.apply(now, &entry));
    entries.push(entry);
}

/// Most commands kept for a retry while the backend is unreachable (stops, requeues,
/// cancels): beyond this the oldest are dropped, said in the log.
const RETRY_COMMANDS_MAX: usize = 10_000;
/// Polls while the backend is unreachable back off from this up to `UNREACHABLE_POLL_MAX`.
const UNREACHABLE_POLL_MIN: Duration = Duration::from_secs(1);
const UNREACHABLE_POLL_MAX: Duration = Duration::from_secs(30);

/// What the executor knows of the backend's reachability, and the commands it owes.
struct Health {
    /// The error of the first failed call since the backend last answered.
    down: Option<String>,
    /// When to try again while down, and the current backoff.
    retry_at: Option<std::time::Instant>,
    backoff: Duration,
    /// Commands that failed because the backend was unreachable, to run again in order once
    /// it answers (a stop must not be lost to a controller restart).
    owed: std::collections::VecDeque<Command>,
}

impl Health {
    fn new() -> Health {
        Health {
            down: None,
            retry_at: None,
            backoff: UNREACHABLE_POLL_MIN,
            owed: std::collections::VecDeque::new(),
        }
    }

    /// A call failed transiently: tell the loop the first time.
    fn failed(&mut self, error: &str, loop_tx: &SyncSender<Request>) -> bool {
        let now = monotonic_now();
        if self.down.is_none() {
            self.down = Some(error.to_string());
            self.backoff = UNREACHABLE_POLL_MIN;
            tracing_log(&format!("the backend is unreachable: {error} (retrying with backoff)"));
            if loop_tx.send(Request::BackendHealth(Some(error.to_string()))).is_err() {
                return false;
            }
        } else {
            self.backoff = (self.backoff * 2).min(UNREACHABLE_POLL_MAX);
        }
        self.retry_at = Some(now + self.backoff);
        true
    }

    /// A call succeeded: the backend answers again.
    fn answered(&mut self, loop_tx: &SyncSender<Request>) -> bool {
        if self.down.take().is_some() {
            self.retry_at = None;
            tracing_log("the backend answers again");
            return loop_tx.send(Request::BackendHealth(None)).is_ok();
        }
        true
    }

    /// Whether to call the backend now (always while it answers; on the backoff while not).
    fn may_call(&self) -> bool {
        self.down.is_none() || self.retry_at.is_none_or(|at| monotonic_now() >= at)
    }

    fn owe(&mut self, command: Command) {
        if self.owed.len() >= RETRY_COMMANDS_MAX
            && let Some(dropped) = self.owed.pop_front()
        {
            tracing_log(&format!("backend: {dropped:?} dropped: too many commands owed"));
        }
        self.owed.push_back(command);
    }
}

/// The executor thread: runs commands against the backend in order and polls it, sending what
/// it observes to the main loop. Ends when the loop drops its sender. A backend that does not
/// answer (`BackendError::Unreachable`) is reported once, polled on a backoff, and the
/// commands it could not take are run again in order when it answers; a launch it could not
/// take goes back to the loop (`LaunchDeferred`), which queues the work again.
fn execute_commands(
    mut backend: Box<dyn Backend>,
    commands: &Receiver<Command>,
    loop_tx: &SyncSender<Request>,
    watch_every: Duration,
) {
    let mut last_watch: Option<std::time::Instant> = None;
    let mut health = Health::new();
    loop {
        let mut batch = Vec::new();
        match commands.recv_timeout(Duration::from_millis(POLL_MS)) {
            Ok(command) => {
                batch.push(command);
                while let Ok(command) = commands.try_recv() {
                    batch.push(command);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        // Owed commands go first, in order; while the backend is down new ones queue behind.
        if health.may_call() {
            let mut todo: Vec<Command> = health.owed.drain(..).collect();
            todo.append(&mut batch);
            let (mut failed, mut kept, mut recovered) = (Vec::new(), Vec::new(), Vec::new());
            let mut unreachable = None;
            for command in todo {
                if unreachable.is_some() {
                    defer_or_owe(command, &mut health, &mut failed, unreachable.as_deref());
                    continue;
                }
                match run_command(
                    backend.as_mut(),
                    &command,
                    &mut failed,
                    &mut kept,
                    &mut recovered,
                ) {
                    Ok(()) => {}
                    Err(error) => {
                        defer_or_owe(command, &mut health, &mut failed, Some(&error));
                        unreachable = Some(error);
                    }
                }
            }
            if let Some(error) = &unreachable {
                if !health.failed(error, loop_tx) {
                    return;
                }
            } else if !kept.is_empty() || !failed.is_empty() || !recovered.is_empty() {
                // Something was taken: the backend answers.
                if !health.answered(loop_tx) {
                    return;
                }
            }
            if !failed.is_empty() && loop_tx.send(Request::Observed(failed)).is_err() {
                return;
            }
            if !kept.is_empty() && loop_tx.send(Request::Kept(kept)).is_err() {
                return;
            }
            if !recovered.is_empty() && loop_tx.send(Request::Recovered(recovered)).is_err() {
                return;
            }
        } else {
            let mut failed = Vec::new();
            for command in batch {
                let error = health.down.clone();
                defer_or_owe(command, &mut health, &mut failed, error.as_deref());
            }
            if !failed.is_empty() && loop_tx.send(Request::Observed(failed)).is_err() {
                return;
            }
        }
        if !health.may_call() {
            continue;
        }
        match backend.poll() {
            Ok(observations) => {
                if !health.answered(loop_tx) {
                    return;
                }
                if !observations.is_empty()
                    && !send_observed(backend.as_mut(), observations, loop_tx)
                {
                    return;
                }
            }
            Err(e) if e.is_transient() => {
                if !health.failed(&e.to_string(), loop_tx) {
                    return;
                }
                continue;
            }
            Err(e) => tracing_log(&format!("backend poll: {e}")),
        }
        if last_watch.is_none_or(|at| at.elapsed() >= watch_every) {
            last_watch = Some(monotonic_now());
            match backend.watch_cluster() {
                Ok(news)
                    if news.nodes.is_empty()
                        && news.foreign.is_empty()
                        && news.inventory.is_none() => {}
                Ok(news) => {
                    if loop_tx.send(Request::Cluster(news)).is_err() {
                        return;
                    }
                }
                Err(e) if e.is_transient() => {
                    if !health.failed(&e.to_string(), loop_tx) {
                        return;
                    }
                }
                Err(e) => tracing_log(&format!("backend cluster watch: {e}")),
            }
        }
    }
}

/// Sends a poll's observations, then the devices started runs hold where the backend bound
/// them itself. False when the loop is gone.
fn send_observed(
    backend: &mut dyn Backend,
    observations: Vec<Observation>,
    loop_tx: &SyncSender<Request>,
) -> bool {
    let started: Vec<RunId> = observations
        .iter()
        .filter(|o| matches!(o, Observation::Started { .. }))
        .map(Observation::run)
        .collect();
    // Blocking send: a full loop queue slows the executor, nothing is dropped.
    if loop_tx.send(Request::Observed(observations)).is_err() {
        return false;
    }
    if !started.is_empty() {
        match backend.allocated_devices(&started) {
            Ok(placed) if !placed.is_empty() => {
                if loop_tx.send(Request::Placed(placed)).is_err() {
                    return false;
                }
            }
            Ok(_) => {}
            Err(e) => tracing_log(&format!("backend allocated devices: {e}")),
        }
    }
    true
}

/// A command the unreachable backend could not take: a launch goes back to the loop as
/// deferred (the work queues again); anything else is owed and run again later.
fn defer_or_owe(
    command: Command,
    health: &mut Health,
    failed: &mut Vec<Observation>,
    error: Option<&str>,
) {
    match command {
        Command::Launch(launch) => failed.push(Observation::LaunchDeferred {
            run: launch.run,
            error: error.unwrap_or("the backend is unreachable").to_string(),
        }),
        other => health.owe(other),
    }
}

#[allow(clippy::disallowed_methods)] // the executor's watch cadence is real time
fn monotonic_now() -> std::time::Instant {
    std::time::Instant::now()
}

/// Runs one command; a launch the backend refused with an error (not a `LaunchFailed` it
/// reports itself, e.g. the disk is full) becomes a `LaunchFailed`, so the workload does not
/// stay "starting" for ever. `Err`: the backend was unreachable and nothing was done (the
/// caller defers or owes the command).
fn run_command(
    backend: &mut dyn Backend,
    command: &Command,
    failed: &mut Vec<Observation>,
    kept: &mut Vec<RunId>,
    recovered: &mut Vec<Observation>,
) -> Result<(), String> {
    let result = match command {
        Command::Launch(launch) => {
            let _ = std::fs::create_dir_all(&launch.log_dir);
            backend.launch(launch)
        }
        Command::Signal(run, signal) => backend.signal(*run, *signal),
        Command::Requeue { run, next } => match backend.requeue(*run, *next) {
            Ok(true) => {
                kept.push(*next);
                Ok(())
            }
            Ok(false) => backend.signal(*run, allot_backend::StopSignal::Terminate),
            Err(e) if e.is_transient() => Err(e),
            Err(e) => {
                tracing_log(&format!("backend: requeue {run} as {next}: {e}; terminating it"));
                backend.signal(*run, allot_backend::StopSignal::Terminate)
            }
        },
        Command::Recover(launches) => match backend.recover(launches) {
            Ok(observations) => {
                recovered.extend(observations);
                Ok(())
            }
            Err(e) => Err(e),
        },
        Command::CancelForeign(handle) => match backend.cancel_foreign(handle) {
            Ok(true) => Ok(()),
            Ok(false) => Err(allot_backend::BackendError::Invalid(format!(
                "{handle}: not cancelled on the cluster (gone already, or this backend cannot)"
            ))),
            Err(e) => Err(e),
        },
        Command::ReturnForeign(handle) => match backend.return_foreign(handle) {
            Ok(true) => Ok(()),
            Ok(false) => Err(allot_backend::BackendError::Invalid(format!(
                "{handle}: this backend cannot send refused foreign work back to the queue; it \
                 keeps running outside allot's books"
            ))),
            Err(e) => Err(e),
        },
    };
    let Err(error) = result else { return Ok(()) };
    if error.is_transient() {
        return Err(error.to_string());
    }
    tracing_log(&format!("backend: {command:?}: {error}"));
    // A signal to a run that ended is not an error; another failure is the operator's to see.
    if let Command::Launch(launch) = command {
        failed.push(Observation::LaunchFailed { run: launch.run, error: error.to_string() });
    }
    Ok(())
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

/// What the backend said of the runs the log says were live, after a restart: a launch it
/// has no record of was cut short by the restart, so the work queues again.
fn recovered_entries(observations: Vec<Observation>) -> Vec<Entry> {
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
            Entry::Exited { id: run.workload, attempt: run.attempt, code, detail }
        }
        Observation::LaunchDeferred { run, error } => {
            Entry::LaunchDeferred { id: run.workload, attempt: run.attempt, error }
        }
    }
}

/// The daemon's own log lines go to stderr (journald or the terminal).
/// A process's group id (`/proc/PID/stat`, field 5), if it still runs here.
fn process_group(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: read after the last ')'.
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split_whitespace().nth(2)?.parse().ok()
}

/// A probe file's modification time in ms since the Unix epoch, if it exists; `None` for one
/// dated at the epoch (made for a job run as another user, not touched by it yet).
fn modified_ms(path: &std::path::Path) -> Option<u64> {
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok()?;
    let ms = modified.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as u64;
    (ms > 0).then_some(ms)
}

/// A policy `allot policy apply` cannot move live work to: 422, every problem named.
fn policy_refused(problems: &[String]) -> HttpError {
    HttpError::new(
        422,
        ApiError {
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

pub(crate) fn tracing_log(line: &str) {
    #[allow(clippy::print_stderr)]
    {
        eprintln!("allot: {line}");
    }
}
