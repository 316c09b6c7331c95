//! The production driver: real threads, the wall clock and the file system around the machine.
//!
//! - the main loop thread owns the `Durable` machine: it batches messages (API asks, inputs
//!   from the other threads), reads the running workloads' probe files, steps the machine
//!   (entries durable first), publishes the view and the gauges, then answers and hands the
//!   commands to the executor;
//! - the executor thread owns the `Executor` (and so the backend): commands in order, polls,
//!   cluster watches;
//! - the collector thread reads telemetry sources, the prober thread asks application probes
//!   (`telemetry.rs`).
//!
//! Nothing here decides anything: the same machine runs under the simulation.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Result;
use tokio::sync::oneshot;

use crate::durable::Durable;
use crate::executor::Executor;
use crate::handle::Message;
use crate::machine::{Answer, BATCH_MAX, Command, FileTimes, Input, Ticket};
use crate::metrics::Metrics;
pub(crate) use crate::os::{tracing_log, wall_ms};
use crate::telemetry::ProbeTable;
use crate::view::View;

/// How often the loop wakes without messages (escalations, cycles).
const TICK_MS: u64 = 50;
/// How often the executor polls the backend.
const POLL_MS: u64 = 50;
/// How often heartbeat and checkpoint files are looked at.
const PROBE_FILES_MS: u64 = 1_000;

/// A monotonic count of ms for the executor's cadences (watches, backoff).
#[allow(clippy::disallowed_methods)] // the executor's cadence is real time
fn monotonic_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64
}

#[allow(clippy::disallowed_methods)] // latency histograms measure real time
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let start = std::time::Instant::now();
    let value = f();
    (value, start.elapsed().as_secs_f64())
}

/// A probe file's modification time in ms since the Unix epoch, if it exists; `None` for one
/// dated at the epoch (made for a job run as another user, not touched by it yet).
fn modified_ms(path: &std::path::Path) -> Option<u64> {
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok()?;
    let ms = modified.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as u64;
    (ms > 0).then_some(ms)
}

/// Starts the executor thread on `executor` (first running `initial`, the commands recovery
/// decided) and returns where to send it commands.
pub(crate) fn spawn_executor(
    mut executor: Executor,
    initial: Vec<Command>,
    loop_tx: SyncSender<Message>,
    work_waiting: Arc<AtomicBool>,
) -> Result<std::sync::mpsc::Sender<Vec<Command>>> {
    let (tx, rx) = std::sync::mpsc::channel::<Vec<Command>>();
    std::thread::Builder::new().name("allot-executor".into()).spawn(move || {
        // Blocking sends: a full loop queue slows the executor, nothing is dropped.
        let send = |inputs: Vec<Input>| {
            inputs.into_iter().all(|i| loop_tx.send(Message::Input(i)).is_ok())
        };
        if !send(executor.run(monotonic_ms(), initial)) {
            return;
        }
        loop {
            match rx.recv_timeout(Duration::from_millis(POLL_MS)) {
                Ok(mut batch) => {
                    while let Ok(more) = rx.try_recv() {
                        batch.extend(more);
                    }
                    if !send(executor.run(monotonic_ms(), batch)) {
                        return;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            if !send(executor.poll(monotonic_ms(), work_waiting.load(Ordering::Relaxed))) {
                return;
            }
        }
    })?;
    Ok(tx)
}

/// The main loop: runs until `Shutdown` or until every sender is gone; an error (the log
/// could not be written) ends it with nothing acknowledged that is not durable.
pub(crate) fn main_loop(
    mut durable: Durable,
    receiver: &Receiver<Message>,
    executor: &std::sync::mpsc::Sender<Vec<Command>>,
    (view, metrics, probes): (&Arc<RwLock<View>>, &Metrics, &ProbeTable),
    webhook: Option<&crate::webhook::Webhook>,
    work_waiting: &AtomicBool,
) -> Result<()> {
    let mut replies: BTreeMap<Ticket, oneshot::Sender<Answer>> = BTreeMap::new();
    let mut next_ticket: Ticket = 0;
    let mut last_files = 0u64;
    loop {
        // Sleep until the next message, the next tick, or the moment the machine wants a step.
        let wait = durable.machine.wake_in_ms(wall_ms(), TICK_MS);
        let first = match receiver.recv_timeout(Duration::from_millis(wait)) {
            Ok(m) => Some(m),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => return Ok(()),
        };
        let mut inputs = Vec::new();
        let mut shutdown = false;
        let mut take = |m: Message, inputs: &mut Vec<Input>| match m {
            Message::Ask(ask, reply) => {
                next_ticket += 1;
                replies.insert(next_ticket, reply);
                inputs.push(Input::Ask(next_ticket, ask));
            }
            Message::Input(input) => inputs.push(input),
            // A shutdown still handles what came with it (observations above all), then stops.
            Message::Shutdown => shutdown = true,
        };
        if let Some(m) = first {
            take(m, &mut inputs);
        }
        while inputs.len() < BATCH_MAX {
            match receiver.try_recv() {
                Ok(m) => take(m, &mut inputs),
                Err(_) => break,
            }
        }
        let now = wall_ms();
        if now.saturating_sub(last_files) >= PROBE_FILES_MS {
            last_files = now;
            if let Ok(mut table) = probes.lock() {
                *table = durable.machine.app_probes();
            }
            let files: Vec<FileTimes> = durable
                .machine
                .watched_files()
                .into_iter()
                .map(|(id, heartbeat, checkpoint)| FileTimes {
                    id,
                    heartbeat_ms: modified_ms(&heartbeat),
                    checkpoint_ms: modified_ms(&checkpoint),
                })
                .collect();
            if !files.is_empty() {
                inputs.push(Input::Files(files));
            }
        }
        // Durable before anything is answered or done: a failure here stops the loop.
        let (turn, seconds) = timed(|| durable.step(now, inputs));
        let turn = turn?;
        metrics.log_append_seconds.observe(turn.append_seconds);
        if let Some(s) = turn.snapshot_seconds {
            metrics.snapshot_seconds.observe(s);
        }
        for note in &turn.output.notes {
            tracing_log(note);
        }
        if let Some(hook) = webhook {
            for event in &turn.output.events {
                hook.send(event.clone());
            }
        }
        if turn.output.cycled {
            let other = turn.append_seconds + turn.snapshot_seconds.unwrap_or(0.0);
            metrics.cycle_seconds.observe((seconds - other).max(0.0));
        }
        for ms in &turn.output.admitted_after_ms {
            metrics.submit_to_admit_seconds.observe(*ms as f64 / 1000.0);
        }
        // Readers see what was acknowledged before the acknowledgement arrives.
        durable.machine.publish(now, false, view, metrics);
        work_waiting.store(durable.machine.daemon.engine.has_pending(), Ordering::Relaxed);
        for (ticket, answer) in turn.output.answers {
            if matches!(answer, Answer::Submitted(Ok(_))) {
                metrics.submissions.inc();
            }
            if let Some(reply) = replies.remove(&ticket) {
                let _ = reply.send(answer);
            }
        }
        if !turn.output.commands.is_empty() && executor.send(turn.output.commands).is_err() {
            tracing_log("the backend executor has stopped; commands are dropped");
        }
        if shutdown {
            return Ok(());
        }
    }
}
