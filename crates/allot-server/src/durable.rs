//! The machine with its log: `Durable` owns the store and the machine, makes each step's
//! entries durable before the step's answers and commands are handed back, snapshots right
//! after a cycle, and rebuilds the machine from the latest snapshot plus the log after it.
//! The production driver and the simulation both go through here, so both run the same
//! write-ahead rule against a real store.

use allot_store::{NewRecord, Store};
use anyhow::anyhow;

use crate::machine::{Command, Daemon, Entry, Input, Machine, Output};

/// Log records between snapshots by default: a restart replays at most about this many.
pub(crate) const SNAPSHOT_EVERY: u64 = 10_000;

/// What one durable step hands back, and what it cost.
#[derive(Debug)]
pub(crate) struct Turn {
    /// Answers and commands to deliver now (the entries are durable).
    pub output: Output,
    pub append_seconds: f64,
    /// Set when a snapshot was taken: the time it took to encode, write and compact after.
    pub snapshot_seconds: Option<f64>,
}

pub(crate) struct Durable {
    pub store: Box<dyn Store>,
    pub machine: Machine,
    /// Log records between snapshots (taken right after a cycle).
    pub snapshot_every: u64,
    /// The seq of the latest snapshot (0: none).
    snapshot_seq: u64,
    /// The log's last seq (kept by `append`, so a step asks the store nothing).
    last_seq: u64,
    /// Cycles logged since the latest snapshot: a replay re-runs each over the queue of its
    /// time, so they, not records, dominate a restart with a deep queue.
    cycles_since_snapshot: u64,
}

impl std::fmt::Debug for Durable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Durable")
            .field("snapshot_seq", &self.snapshot_seq)
            .field("last_seq", &self.last_seq)
            .finish_non_exhaustive()
    }
}

#[allow(clippy::disallowed_methods)] // the append and snapshot figures measure real time
fn elapsed_s<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let start = std::time::Instant::now();
    let value = f();
    (value, start.elapsed().as_secs_f64())
}

impl Durable {
    /// The machine as the store's latest snapshot and the log after it leave it, starting from
    /// `machine` (a fresh daemon over the log's first inventory and policy). Nothing is
    /// executed. Returns the number of log records replayed.
    pub(crate) fn open(
        store: Box<dyn Store>,
        mut machine: Machine,
        snapshot_every: u64,
    ) -> anyhow::Result<(Durable, u64)> {
        let last_seq = store.last_seq()?;
        let mut after = 0;
        let mut snapshot_seq = 0;
        let mut replayed = 0u64;
        if let Some(snapshot) = store.latest_snapshot()? {
            let nodes = machine.daemon.nodes.clone();
            let workload_dir = machine.daemon.workload_dir.clone();
            match Daemon::from_snapshot(nodes, workload_dir, &snapshot.body) {
                Ok(daemon) => {
                    machine.daemon = daemon;
                    after = snapshot.seq;
                    snapshot_seq = snapshot.seq;
                }
                // Without the records before it the log cannot rebuild the state: stop here
                // rather than start from a partial history.
                Err(e) if store.read_after(0, 1)?.first().is_none_or(|r| r.seq > 1) => {
                    return Err(e.context(format!(
                        "the snapshot at log record {} cannot be used and the log before it is \
                         gone; run the allot version that wrote it, or restore the data \
                         directory from a backup",
                        snapshot.seq
                    )));
                }
                Err(e) => crate::os::tracing_log(&format!(
                    "the snapshot at log record {} is not used ({e:#}); replaying the whole log",
                    snapshot.seq
                )),
            }
        }
        loop {
            let records = store.read_after(after, 4096)?;
            if records.is_empty() {
                break;
            }
            for r in &records {
                let entry: Entry = serde_json::from_str(&r.body).map_err(|e| {
                    anyhow!(
                        "the log's record {} ({}) cannot be read: {e}; the data directory was \
                         written by another allot version or damaged — restore it from a backup",
                        r.seq,
                        r.kind
                    )
                })?;
                machine.daemon.apply(r.at_ms, &entry);
                replayed += 1;
            }
            after = records.last().map_or(after, |r| r.seq);
        }
        let durable = Durable {
            store,
            machine,
            snapshot_every: snapshot_every.max(1),
            snapshot_seq,
            last_seq,
            cycles_since_snapshot: 0,
        };
        Ok((durable, replayed))
    }

    /// Appends `entries` (at `now`) in one transaction. If this fails the machine is ahead
    /// of the log: the caller must stop without acknowledging anything.
    pub(crate) fn append(&mut self, now: u64, entries: &[Entry]) -> anyhow::Result<f64> {
        if entries.is_empty() {
            return Ok(0.0);
        }
        let bodies: Vec<String> =
            entries.iter().map(serde_json::to_string).collect::<Result<_, _>>()?;
        let records: Vec<NewRecord<'_>> = entries
            .iter()
            .zip(&bodies)
            .map(|(e, b)| NewRecord { at_ms: now, kind: e.kind(), body: b })
            .collect();
        let (result, seconds) = elapsed_s(|| self.store.append(&records));
        self.last_seq = result?;
        Ok(seconds)
    }

    /// Entries made outside a step (at start), applied and made durable; returns what they
    /// ask to be done.
    pub(crate) fn apply_logged(
        &mut self,
        now: u64,
        entries: &[Entry],
    ) -> anyhow::Result<Vec<Command>> {
        let commands = self.machine.apply_all(now, entries);
        self.append(now, entries)?;
        Ok(commands)
    }

    /// One machine step, made durable: the entries are appended before the output is handed
    /// back; right after a cycle, a snapshot when one is due.
    pub(crate) fn step(&mut self, now_wall: u64, inputs: Vec<Input>) -> anyhow::Result<Turn> {
        let output = self.machine.step(now_wall, inputs);
        let now = self.machine.daemon.clamp(now_wall);
        let append_seconds = self.append(now, &output.entries)?;
        let snapshot_seconds = if matches!(output.entries.last(), Some(Entry::Decided)) {
            let (taken, seconds) = elapsed_s(|| self.maybe_snapshot(now));
            taken.then_some(seconds)
        } else {
            None
        };
        Ok(Turn { output, append_seconds, snapshot_seconds })
    }

    /// Right after a cycle, once `snapshot_every` records or a hundredth as many cycles have
    /// followed the last snapshot: saves the state and drops the log before the previous
    /// snapshot (one snapshot's worth of log stays, for inspection). A failure is logged, not
    /// fatal: the log is still whole. Returns whether one was attempted (it is timed as
    /// `snapshot_seconds`, written or not).
    fn maybe_snapshot(&mut self, now: u64) -> bool {
        self.cycles_since_snapshot += 1;
        let last = self.last_seq;
        if last.saturating_sub(self.snapshot_seq) < self.snapshot_every
            && self.cycles_since_snapshot < (self.snapshot_every / 100).max(1)
        {
            return false;
        }
        let body = match self.machine.daemon.snapshot() {
            Ok(Some(body)) => body,
            Ok(None) => return false,
            Err(e) => {
                crate::os::tracing_log(&format!("no snapshot: {e:#}"));
                return false;
            }
        };
        let previous = self.snapshot_seq;
        match self.store.put_snapshot(&allot_store::Snapshot { seq: last, at_ms: now, body }) {
            Ok(()) => {
                self.snapshot_seq = last;
                self.cycles_since_snapshot = 0;
                if previous > 0
                    && let Err(e) = self.store.compact_through(previous)
                {
                    crate::os::tracing_log(&format!("the log was not compacted: {e}"));
                }
            }
            Err(e) => crate::os::tracing_log(&format!("no snapshot: {e}")),
        }
        true
    }
}
