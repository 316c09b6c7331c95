//! The backend's side of the machine: `Executor` runs the machine's commands against a
//! `Backend` in order, polls it, watches the cluster, and turns what it sees into the
//! machine's inputs. Time comes in as an argument (a monotonic ms count), so the production
//! executor thread (`driver.rs`) and the simulation drive the same code.
//!
//! A backend that does not answer (`BackendError::Unreachable`) is reported once
//! (`Input::BackendHealth`), polled on a backoff, and the commands it could not take are run
//! again, in order, once it answers (a stop must not be lost to a controller restart); a
//! launch it could not take goes back to the machine as `LaunchDeferred`, which queues the
//! work again.

use std::collections::VecDeque;

use allot_backend::{Backend, Observation, RunId, StopSignal};

use crate::machine::{Command, Input};
use crate::os::tracing_log;

/// Most commands kept for a retry while the backend is unreachable (stops, requeues,
/// cancels): beyond this the oldest are dropped, said in the log.
pub(crate) const OWED_COMMANDS_MAX: usize = 10_000;
/// Calls while the backend is unreachable back off from this up to `UNREACHABLE_RETRY_MAX_MS`.
const UNREACHABLE_RETRY_MIN_MS: u64 = 1_000;
const UNREACHABLE_RETRY_MAX_MS: u64 = 30_000;

pub(crate) struct Executor {
    backend: Box<dyn Backend>,
    /// Where workloads' heartbeat and checkpoint files go (made before the first launch).
    /// Node states and foreign work are read this often (ms).
    watch_every_ms: u64,
    last_watch_ms: Option<u64>,
    /// The error of the first failed call since the backend last answered.
    down: Option<String>,
    /// When to call again while down, and the current backoff.
    retry_at_ms: u64,
    backoff_ms: u64,
    /// Commands the unreachable backend could not take, to run again in order.
    owed: VecDeque<Command>,
    /// Started runs whose pods the backend could not say (transiently): asked again at the next
    /// poll, so that their telemetry is found by pod as soon as it can be.
    pods_owed: Vec<RunId>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("backend", &self.backend.name())
            .field("down", &self.down)
            .field("owed", &self.owed.len())
            .finish_non_exhaustive()
    }
}

impl Executor {
    /// `down`: what the machine last heard of the backend (its `backend_down`), so that the
    /// first call that succeeds tells it the backend answers again.
    pub(crate) fn new(
        backend: Box<dyn Backend>,
        watch_every_ms: u64,
        down: Option<String>,
    ) -> Executor {
        Executor {
            backend,
            watch_every_ms: watch_every_ms.max(1),
            last_watch_ms: None,
            down,
            retry_at_ms: 0,
            backoff_ms: UNREACHABLE_RETRY_MIN_MS,
            owed: VecDeque::new(),
            pods_owed: Vec::new(),
        }
    }

    fn may_call(&self, now_ms: u64) -> bool {
        self.down.is_none() || now_ms >= self.retry_at_ms
    }

    /// A call failed transiently: said to the machine the first time.
    fn failed(&mut self, now_ms: u64, error: &str, out: &mut Vec<Input>) {
        if self.down.is_none() {
            self.down = Some(error.to_string());
            self.backoff_ms = UNREACHABLE_RETRY_MIN_MS;
            tracing_log(&format!("the backend is unreachable: {error} (retrying with backoff)"));
            out.push(Input::BackendHealth(Some(error.to_string())));
        } else {
            self.backoff_ms = (self.backoff_ms * 2).min(UNREACHABLE_RETRY_MAX_MS);
        }
        self.retry_at_ms = now_ms.saturating_add(self.backoff_ms);
    }

    /// A call succeeded: the backend answers (again).
    fn answered(&mut self, out: &mut Vec<Input>) {
        if self.down.take().is_some() {
            tracing_log("the backend answers again");
            out.push(Input::BackendHealth(None));
        }
    }

    fn owe(&mut self, command: Command) {
        if self.owed.len() >= OWED_COMMANDS_MAX
            && let Some(dropped) = self.owed.pop_front()
        {
            tracing_log(&format!("backend: {dropped:?} dropped: too many commands owed"));
        }
        self.owed.push_back(command);
    }

    /// A command the unreachable backend could not take: a launch goes back as deferred (the
    /// work queues again); anything else is owed.
    fn defer_or_owe(&mut self, command: Command, error: &str, deferred: &mut Vec<Observation>) {
        match command {
            Command::Launch(launch) => deferred
                .push(Observation::LaunchDeferred { run: launch.run, error: error.to_string() }),
            other => self.owe(other),
        }
    }

    /// Runs `commands` (after any owed ones) in order.
    pub(crate) fn run(&mut self, now_ms: u64, commands: Vec<Command>) -> Vec<Input> {
        let mut out = Vec::new();
        let mut failed = Vec::new();
        if !self.may_call(now_ms) {
            let error = self.down.clone().unwrap_or_default();
            for command in commands {
                self.defer_or_owe(command, &error, &mut failed);
            }
            if !failed.is_empty() {
                out.push(Input::Observed(failed));
            }
            return out;
        }
        let mut todo: Vec<Command> = self.owed.drain(..).collect();
        todo.extend(commands);
        if todo.is_empty() {
            return out;
        }
        let (mut kept, mut recovered) = (Vec::new(), Vec::new());
        let mut unreachable: Option<String> = None;
        for command in todo {
            if let Some(error) = unreachable.clone() {
                self.defer_or_owe(command, &error, &mut failed);
                continue;
            }
            let result = run_command(
                self.backend.as_mut(),
                &command,
                &mut failed,
                &mut kept,
                &mut recovered,
            );
            if let Err(error) = result {
                self.defer_or_owe(command, &error, &mut failed);
                unreachable = Some(error);
            }
        }
        match &unreachable {
            Some(error) => self.failed(now_ms, error, &mut out),
            None => self.answered(&mut out),
        }
        if !failed.is_empty() {
            out.push(Input::Observed(failed));
        }
        if !kept.is_empty() {
            out.push(Input::Kept(kept));
        }
        // Pods before what started: no telemetry round reads a started run by device index.
        let readopted = started_runs(&recovered);
        if unreachable.is_none() {
            self.ask_pods(readopted, &mut out);
        } else {
            self.pods_owed.extend(readopted);
        }
        if !recovered.is_empty() {
            out.push(Input::Recovered(recovered));
        }
        out
    }

    /// Runs whose pods recovery could not learn: asked at the next poll.
    pub(crate) fn owe_pods(&mut self, runs: Vec<RunId>) {
        self.pods_owed.extend(runs);
    }

    /// Asks which pods started runs are (`Backend::member_pods`), with those owed; a transient
    /// failure leaves them owed (at most `OWED_COMMANDS_MAX`, the newest).
    fn ask_pods(&mut self, started: Vec<RunId>, out: &mut Vec<Input>) {
        let mut runs = std::mem::take(&mut self.pods_owed);
        runs.extend(started);
        if runs.is_empty() {
            return;
        }
        match self.backend.member_pods(&runs) {
            Ok(pods) if !pods.is_empty() => out.push(Input::Pods(pods)),
            Ok(_) => {}
            Err(e) if e.is_transient() => {
                let over = runs.len().saturating_sub(OWED_COMMANDS_MAX);
                runs.drain(..over);
                self.pods_owed = runs;
            }
            Err(e) => tracing_log(&format!("backend member pods: {e}")),
        }
    }

    /// Polls the backend (and asks where the runs it saw start were bound), and watches the
    /// cluster when a watch is due; on the backoff while the backend does not answer.
    /// `work_waiting`: whether work waits for GPUs (`Backend::set_work_waiting`).
    pub(crate) fn poll(&mut self, now_ms: u64, work_waiting: bool) -> Vec<Input> {
        let mut out = Vec::new();
        if !self.may_call(now_ms) {
            return out;
        }
        self.backend.set_work_waiting(work_waiting);
        // Owed commands go first once the backend may be called again.
        if !self.owed.is_empty() {
            out.extend(self.run(now_ms, Vec::new()));
            if self.down.is_some() {
                return out;
            }
        }
        match self.backend.poll() {
            Ok(observations) => {
                self.answered(&mut out);
                let started = started_runs(&observations);
                // Pods before what started: no telemetry round reads a started run by index.
                self.ask_pods(started.clone(), &mut out);
                if !observations.is_empty() {
                    out.push(Input::Observed(observations));
                }
                if !started.is_empty() {
                    match self.backend.allocated_devices(&started) {
                        Ok(placed) if !placed.is_empty() => out.push(Input::Placed(placed)),
                        Ok(_) => {}
                        Err(e) => tracing_log(&format!("backend allocated devices: {e}")),
                    }
                }
            }
            Err(e) if e.is_transient() => {
                self.failed(now_ms, &e.to_string(), &mut out);
                return out;
            }
            Err(e) => tracing_log(&format!("backend poll: {e}")),
        }
        if self.last_watch_ms.is_none_or(|at| now_ms.saturating_sub(at) >= self.watch_every_ms) {
            self.last_watch_ms = Some(now_ms);
            match self.backend.watch_cluster() {
                Ok(news)
                    if news.nodes.is_empty()
                        && news.foreign.is_empty()
                        && news.inventory.is_none() => {}
                Ok(news) => out.push(Input::Cluster(news)),
                Err(e) if e.is_transient() => self.failed(now_ms, &e.to_string(), &mut out),
                Err(e) => tracing_log(&format!("backend cluster watch: {e}")),
            }
        }
        out
    }
}

/// The runs `observations` say started.
fn started_runs(observations: &[Observation]) -> Vec<RunId> {
    observations
        .iter()
        .filter(|o| matches!(o, Observation::Started { .. }))
        .map(Observation::run)
        .collect()
}

/// Runs one command; a launch the backend refused with an error (not a `LaunchFailed` it
/// reports itself, e.g. the disk is full) becomes a `LaunchFailed`, so the workload does not
/// stay "starting" for ever. `Err`: the backend was unreachable and nothing was done.
fn run_command(
    backend: &mut dyn Backend,
    command: &Command,
    failed: &mut Vec<Observation>,
    kept: &mut Vec<RunId>,
    recovered: &mut Vec<Observation>,
) -> Result<(), String> {
    let result = match command {
        // The backend makes the log directory, with the owner and mode its account needs
        // (`allot_backend::files::prepare`).
        Command::Launch(launch) => backend.launch(launch),
        Command::Signal(run, signal) => backend.signal(*run, *signal),
        Command::Requeue { run, next } => match backend.requeue(*run, *next) {
            Ok(true) => {
                kept.push(*next);
                Ok(())
            }
            Ok(false) => backend.signal(*run, StopSignal::Terminate),
            Err(e) if e.is_transient() => Err(e),
            Err(e) => {
                tracing_log(&format!("backend: requeue {run} as {next}: {e}; terminating it"));
                backend.signal(*run, StopSignal::Terminate)
            }
        },
        Command::Recover(launches) => backend.recover(launches).map(|observations| {
            recovered.extend(observations);
        }),
        Command::CancelForeign(handle) => match backend.cancel_foreign(handle) {
            Ok(true) => Ok(()),
            Ok(false) => Err(allot_backend::BackendError::Invalid(format!(
                "{handle}: not cancelled on the cluster (gone already, or this backend cannot)"
            ))),
            Err(e) => Err(e),
        },
        // Best effort: a refusal is logged in a line, not with every reason.
        Command::ExplainWaiting(reasons) => match backend.explain_waiting(reasons) {
            Err(e) if !e.is_transient() => {
                tracing_log(&format!("backend: explaining {} waiting: {e}", reasons.len()));
                Ok(())
            }
            other => other,
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
    // A signal to a run that ended is not an error; another failure is the operator's to see.
    tracing_log(&format!("backend: {command:?}: {error}"));
    if let Command::Launch(launch) = command {
        failed.push(Observation::LaunchFailed { run: launch.run, error: error.to_string() });
    }
    Ok(())
}
