//! The idle-reclaim experiment on real telemetry (`allot sim idle --trace genai:DIR`): each
//! container of Alibaba's GenAI serving trace ([`crate::genai`]) is an inference endpoint
//! holding one GPU; its duty cycle is the device's utilisation reading, its served requests are
//! its last-request probe, a slot without a duty row is a telemetry gap. The same
//! `allot_core::Engine` as the modelled experiment decides every warning and reclaim; a reclaim
//! scales the endpoint to zero, and it comes back when it is next needed (a request, or
//! activity), after a cold start. Definitions and the oracle: `docs/design/idle-experiment.md`,
//! "Real telemetry".
//!
//! Pressure: a project `backfill` (guarantee 0, borrowing from the cohort) holds one pending
//! 1-GPU batch job per GPU, always busy, so that `on_pressure` rules always have a claimant and
//! every GPU an endpoint gives back is used. A returning endpoint (project `platform`, whose
//! guarantee is every GPU) takes its GPU back from a borrowing backfill job by the engine's own
//! quota reclaim.
//!
//! Time: slot *s* starts at `s × step`. Its duty cycle is read `readings_per_slot` times
//! during the slot (as an exporter's latest value is polled: AMD polls every 15 s), its
//! requests arrive at its start, and the engine's cycle runs at slot starts (repeated within the
//! instant while stops free GPUs, at most [`ROUNDS_MAX`] times).

use super::Fate;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use allot_core::idle::DeviceReading;
use allot_core::{
    Decision, DeviceSpec, Engine, Event, GpuRequest, NodeSpec, PolicySpec, PreemptReason,
    PreemptionMode, ProjectSpec, Queueing, QuotaModel, QuotaSpec, SHARES_PER_GPU, Shares,
    Timestamp, WorkloadId, WorkloadKind, WorkloadSpec,
};

use super::{ENDPOINT_PROJECT, IdleSimError};
use crate::genai::{GenaiContainer, GenaiTrace};

mod predictors;
mod report;
pub use predictors::*;
pub use report::*;

/// The project of the backfill jobs.
pub const BACKFILL_PROJECT: &str = "backfill";
/// The cohort both projects share.
const COHORT: &str = "lab";
/// GPUs per node of the experiment's cluster.
pub const GPUS_PER_NODE: usize = 8;
/// Cycles within one instant (stops free GPUs, the next cycle admits into them).
pub const ROUNDS_MAX: usize = 8;
/// The default cold start, seconds: pod start with a cached image, CUDA and framework
/// initialisation, and loading the ~20–26 GB the trace's containers hold on their GPUs
/// (`docs/design/idle-experiment.md`, "Cold start").
pub const COLD_START_S: f64 = 60.0;
/// Longest cold start accepted, seconds.
pub const COLD_START_MAX_S: f64 = 3600.0;

/// How the real-telemetry experiment runs.
#[derive(Clone, Debug, PartialEq)]
pub struct GenaiConfig {
    /// From the need that brings a reclaimed endpoint back to its first served request (the
    /// GPU is held meanwhile; requests arriving meanwhile are delayed).
    pub cold_start_s: f64,
    /// Readings of the slot's duty cycle per slot (1..=60).
    pub readings_per_slot: u32,
    /// A reclaim is false when the endpoint is needed within this long after it.
    pub false_window_s: f64,
    /// A slot at or above this duty cycle (%) is activity: the endpoint is needed.
    pub active_pct: f64,
    /// Check the engine's invariants after every cycle (tests).
    pub audit: bool,
}

impl Default for GenaiConfig {
    fn default() -> GenaiConfig {
        GenaiConfig {
            cold_start_s: COLD_START_S,
            readings_per_slot: 4,
            false_window_s: 900.0,
            active_pct: 10.0,
            audit: false,
        }
    }
}

fn check_config(c: &GenaiConfig, trace: &GenaiTrace) -> Result<(), IdleSimError> {
    let bad = |m: String| Err(IdleSimError::Input(m));
    if !(c.cold_start_s.is_finite() && (0.0..=COLD_START_MAX_S).contains(&c.cold_start_s)) {
        return bad(format!("cold start: {} s is not in [0, {COLD_START_MAX_S}]", c.cold_start_s));
    }
    if !(1..=60).contains(&c.readings_per_slot) {
        return bad(format!("readings per slot: {} is not in [1, 60]", c.readings_per_slot));
    }
    if !(c.false_window_s.is_finite() && c.false_window_s >= 0.0) {
        return bad(format!("false-reclaim window: {} s is not ≥ 0", c.false_window_s));
    }
    if !(c.active_pct.is_finite() && (0.0..=100.0).contains(&c.active_pct)) {
        return bad(format!("activity threshold: {} % is not in [0, 100]", c.active_pct));
    }
    if trace.containers.is_empty() {
        return bad("the trace has no containers".into());
    }
    Ok(())
}

/// The experiment's cluster: one GPU per container, in nodes of [`GPUS_PER_NODE`].
pub fn genai_nodes(gpus: usize) -> Vec<NodeSpec> {
    (0..gpus.div_ceil(GPUS_PER_NODE))
        .map(|n| NodeSpec {
            name: format!("genai-{n}"),
            cpu_millis: 0,
            memory_mib: 0,
            labels: BTreeMap::new(),
            pool: None,
            rack: None,
            devices: (0..GPUS_PER_NODE.min(gpus - n * GPUS_PER_NODE))
                .map(|_| DeviceSpec { model: "GPU".into(), memory_mib: 0, island: 0, mig: false })
                .collect(),
        })
        .collect()
}

/// `policy` for the experiment: its idle rules, classes, pre-emption mode, restart cost and
/// backoff unchanged; its projects replaced by `platform` (the endpoints, every GPU
/// guaranteed) and `backfill` (nothing guaranteed, borrows what `platform` lends).
pub fn genai_policy(policy: &PolicySpec, gpus: usize) -> PolicySpec {
    let project = |name: &str, guaranteed: u64| ProjectSpec {
        name: name.into(),
        cohort: Some(COHORT.into()),
        department: None,
        quotas: vec![QuotaSpec {
            model: QuotaModel::Any,
            guaranteed: Shares::from_gpus(guaranteed),
            borrow_limit: None,
            lend_limit: None,
        }],
        weight_milli: 1000,
        queueing: Queueing::BestEffortFifo,
        preemption_mode: None,
        preempt_within_project: Default::default(),
        borrow_within_cohort: None,
    };
    PolicySpec {
        projects: vec![project(ENDPOINT_PROJECT, gpus as u64), project(BACKFILL_PROJECT, 0)],
        ..policy.clone()
    }
}

/// One policy's figures on the trace (`docs/design/idle-experiment.md`, "Real telemetry").
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct GenaiMetrics {
    /// GPU-hours from each reclaim until the endpoint is needed again (or gets its GPU back,
    /// or ends).
    pub reclaimed_gpu_hours: f64,
    /// Reclaims after which the endpoint is needed (a request or activity) within 15 min.
    pub false_reclaims: u64,
    /// Requests that arrive while their endpoint is reclaimed or still cold-starting.
    pub delayed_requests: u64,
    /// Restarts of reclaimed endpoints (each pays the cold start).
    pub cold_starts: u64,
    /// Idle GPU-hours the oracle reclaims and this policy does not.
    pub missed_gpu_hours: f64,
    /// `reclaimed_gpu_hours` / the oracle's.
    pub reclaimed_share_of_oracle: f64,
    pub reclaims: u64,
    /// Slots of activity without a recorded request (duty ≥ 10 %, no `qps.csv` row) that fall
    /// while the endpoint is reclaimed or cold-starting: work the trace shows but whose
    /// requests it does not record (30 of the 96 containers have no request rows).
    pub delayed_active_slots: u64,
    /// Requests in the slot a reclaim happens in that the endpoint was serving (part of
    /// `delayed_requests`).
    pub interrupted_requests: u64,
    pub warnings: u64,
    /// Endpoints deleted (AMD) and submitted again when next needed.
    pub redeployed: u64,
    /// Backfill jobs pre-empted to give an endpoint its GPU back.
    pub backfill_preemptions: u64,
    /// GPU-hours the endpoints held (cold starts included).
    pub endpoint_gpu_hours: f64,
    pub decide_calls: u64,
    /// Wall time of this run (0 with `--no-timing`).
    pub wall_ms: u64,
}

/// The oracle's reclaims: per container (trace order), the intervals (ms) it holds no GPU.
pub type Intervals = Vec<Vec<(u64, u64)>>;

/// Whether a container is needed in its slot `i` (of its lifetime): it serves a request, or
/// its duty cycle is at least `active_pct`.
fn needed(c: &GenaiContainer, i: usize, active_pct: f64) -> bool {
    c.requests[i] > 0 || c.duty_pct[i].is_some_and(|d| d >= active_pct)
}

/// The clairvoyant oracle: at the start of every run of slots in which the endpoint is not
/// needed, it reclaims if the run is longer than the cold start, and starts the endpoint again
/// a cold start before the run ends, so that it is warm for the next need (a run reaching the
/// container's end needs no restart). It delays no request; its reclaimed GPU-hours are the
/// most any rule with this cold start can take without delaying one.
pub fn genai_oracle(trace: &GenaiTrace, config: &GenaiConfig) -> (GenaiMetrics, Intervals) {
    let step_ms = trace.step_s * 1000;
    let cold_ms = ms(config.cold_start_s);
    let window_ms = ms(config.false_window_s);
    let mut m = GenaiMetrics::default();
    let mut all = Vec::with_capacity(trace.containers.len());
    for c in &trace.containers {
        let mut intervals = Vec::new();
        let end_ms = (u64::from(c.last_slot) + 1) * step_ms;
        let mut i = 0;
        while i < c.slots() {
            if needed(c, i, config.active_pct) {
                i += 1;
                continue;
            }
            let from = i;
            while i < c.slots() && !needed(c, i, config.active_pct) {
                i += 1;
            }
            let start_ms = (u64::from(c.first_slot) + from as u64) * step_ms;
            let next_ms = (u64::from(c.first_slot) + i as u64) * step_ms;
            if i == c.slots() {
                intervals.push((start_ms, end_ms));
                m.reclaims += 1;
            } else if next_ms - start_ms > cold_ms {
                intervals.push((start_ms, next_ms - cold_ms));
                m.reclaims += 1;
                m.cold_starts += 1;
                m.false_reclaims += u64::from(next_ms - start_ms <= window_ms);
            }
        }
        m.reclaimed_gpu_hours += intervals.iter().map(|&(a, b)| hours(b - a)).sum::<f64>();
        let lifetime_ms = end_ms - u64::from(c.first_slot) * step_ms;
        let off: u64 = intervals.iter().map(|&(a, b)| b - a).sum();
        m.endpoint_gpu_hours += hours(lifetime_ms - off);
        all.push(intervals);
    }
    m.reclaimed_share_of_oracle = if m.reclaimed_gpu_hours > 0.0 { 1.0 } else { 0.0 };
    (m, all)
}

fn ms(s: f64) -> u64 {
    (s.max(0.0) * 1000.0).round() as u64
}

fn hours(ms: u64) -> f64 {
    ms as f64 / 3_600_000.0
}

/// Total length of `a` not covered by `b` (both sorted, each without overlaps), ms.
fn uncovered_ms(a: &[(u64, u64)], b: &[(u64, u64)]) -> u64 {
    let mut total = 0;
    let mut j = 0;
    for &(lo, hi) in a {
        let mut at = lo;
        while j < b.len() && b[j].1 <= at {
            j += 1;
        }
        let mut k = j;
        while at < hi {
            match b.get(k) {
                Some(&(blo, bhi)) if blo < hi => {
                    total += blo.saturating_sub(at).min(hi - at);
                    at = at.max(bhi);
                    k += 1;
                }
                _ => {
                    total += hi - at;
                    at = hi;
                }
            }
        }
    }
    total
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Happening {
    Stop { wl: usize, run: u32 },
    Start { wl: usize, run: u32 },
}

/// One engine workload: an endpoint's submission (or redeployment), or a backfill job.
#[derive(Clone, Debug)]
struct Wl {
    id: u64,
    /// The container it serves; `None` for backfill.
    container: Option<usize>,
    fate: Fate,
    run_no: u32,
    started: bool,
    /// Told to stop, with this mode.
    stopping: Option<PreemptionMode>,
    /// The next start is a restart after a reclaim (pays the cold start).
    restart: bool,
}

/// A reclaim of an endpoint not yet followed by its next need (or its GPU back, or its end).
#[derive(Clone, Copy, Debug)]
struct Open {
    stop_ms: u64,
}

#[derive(Clone, Debug, Default)]
struct Endpoint {
    /// The engine workload serving it now (the latest submission).
    wl: Option<usize>,
    alive: bool,
    open: Option<Open>,
    /// Reclaimed, and not yet warm again: requests arriving now are delayed.
    cold: bool,
    /// Deleted by its rule: the next need submits it again.
    deleted: bool,
    /// The last request served in the current run, ms.
    last_request_ms: Option<u64>,
    /// When the current run started (after any cold start), ms.
    started_ms: Option<u64>,
    held_since_ms: Option<u64>,
    /// The intervals it held no GPU after a reclaim, until needed again.
    off: Vec<(u64, u64)>,
}

struct Sim<'a> {
    trace: &'a GenaiTrace,
    cfg: &'a GenaiConfig,
    label: &'a str,
    step_ms: u64,
    engine: Engine,
    wls: Vec<Wl>,
    by_id: BTreeMap<u64, usize>,
    next_id: u64,
    eps: Vec<Endpoint>,
    queue: BinaryHeap<Reverse<(u64, u64, Happening)>>,
    seq: u64,
    /// Workloads that get readings: started, not told to stop.
    sampled: BTreeSet<usize>,
    dirty: bool,
    m: GenaiMetrics,
}

/// Runs one policy (as given: pass it through [`genai_policy`] first) on the trace; `oracle`
/// is [`genai_oracle`]'s intervals (for `missed_gpu_hours`). Deterministic; `wall_ms` is 0.
pub fn run_genai_policy(
    trace: &GenaiTrace,
    label: &str,
    policy: &PolicySpec,
    config: &GenaiConfig,
    oracle: &Intervals,
) -> Result<GenaiMetrics, IdleSimError> {
    check_config(config, trace)?;
    let gpus = trace.containers.len();
    let nodes = genai_nodes(gpus);
    let engine = Engine::new(&nodes, policy)
        .map_err(|e| IdleSimError::Config { policy: label.to_owned(), message: e.to_string() })?;
    let mut sim = Sim {
        trace,
        cfg: config,
        label,
        step_ms: trace.step_s * 1000,
        engine,
        wls: Vec::new(),
        by_id: BTreeMap::new(),
        next_id: 1,
        eps: vec![Endpoint::default(); gpus],
        queue: BinaryHeap::new(),
        seq: 0,
        sampled: BTreeSet::new(),
        dirty: false,
        m: GenaiMetrics::default(),
    };
    sim.run()?;
    let oracle_hours: f64 = oracle.iter().flatten().map(|&(a, b)| hours(b - a)).sum();
    let mut m = sim.finish(oracle);
    m.reclaimed_share_of_oracle =
        if oracle_hours > 0.0 { m.reclaimed_gpu_hours / oracle_hours } else { 0.0 };
    Ok(m)
}

impl Sim<'_> {
    fn push(&mut self, t_ms: u64, h: Happening) {
        self.seq += 1;
        self.queue.push(Reverse((t_ms, self.seq, h)));
    }

    fn slot_ms(&self, slot: u32) -> u64 {
        u64::from(slot) * self.step_ms
    }

    fn run(&mut self) -> Result<(), IdleSimError> {
        let per_slot = u64::from(self.cfg.readings_per_slot);
        for slot in 0..self.trace.slots {
            let t = self.slot_ms(slot);
            self.happenings_until(t);
            self.lifecycle(slot, t);
            self.needs(slot, t);
            self.served(slot, t);
            self.read(slot, t);
            self.probe(t);
            self.cycle(slot, t)?;
            self.delayed(slot);
            for k in 1..per_slot {
                let at = t + k * self.step_ms / per_slot;
                self.happenings_until(at);
                self.read(slot, at);
            }
        }
        let end = self.slot_ms(self.trace.slots);
        self.happenings_until(end);
        for c in 0..self.eps.len() {
            if self.eps[c].alive {
                self.end(c, end);
            }
        }
        Ok(())
    }

    /// Engine cycles at `t` until nothing changes (stops free GPUs, the next cycle fills them).
    fn cycle(&mut self, slot: u32, t: u64) -> Result<(), IdleSimError> {
        for _ in 0..ROUNDS_MAX {
            if !(self.dirty || self.engine.idle_attention(Timestamp(t))) {
                break;
            }
            self.dirty = false;
            self.m.decide_calls += 1;
            for d in self.engine.decide_changes(Timestamp(t)) {
                self.on_decision(t, d);
            }
            if self.cfg.audit {
                self.engine.audit().map_err(|message| IdleSimError::Invariant {
                    policy: self.label.to_owned(),
                    at_s: t as f64 / 1000.0,
                    message,
                })?;
            }
            self.happenings_until(t);
            // An endpoint reclaimed in a slot that needs it is needed again at once.
            self.needs(slot, t);
        }
        Ok(())
    }

    fn happenings_until(&mut self, t: u64) {
        while let Some(&Reverse((at, _, h))) = self.queue.peek() {
            if at > t {
                break;
            }
            self.queue.pop();
            self.handle(at, h);
        }
    }

    fn tell(&mut self, t: u64, event: Event) {
        self.engine.apply(Timestamp(t), event);
    }

    fn submit(&mut self, t: u64, container: Option<usize>) {
        let id = self.next_id;
        self.next_id += 1;
        let wl = self.wls.len();
        self.wls.push(Wl {
            id,
            container,
            fate: Fate::Queued,
            run_no: 0,
            started: false,
            stopping: None,
            restart: container.is_some_and(|c| self.eps[c].deleted),
        });
        self.by_id.insert(id, wl);
        let (kind, project, name) = match container {
            Some(c) => {
                self.eps[c].wl = Some(wl);
                self.eps[c].deleted = false;
                let ip = &self.trace.containers[c].ip;
                (
                    WorkloadKind::Inference,
                    ENDPOINT_PROJECT,
                    format!("endpoint-{}", &ip[..ip.len().min(8)]),
                )
            }
            None => (WorkloadKind::Batch, BACKFILL_PROJECT, format!("backfill-{id}")),
        };
        let spec =
            WorkloadSpec { kind, ..WorkloadSpec::new(id, &name, project, GpuRequest::Whole(1)) };
        self.tell(t, Event::WorkloadSubmitted(spec));
        self.dirty = true;
    }

    /// Containers that ended before slot `slot`, then those that start in it; at slot 0 the
    /// backfill jobs too (after the endpoints, so that the endpoints queue first).
    fn lifecycle(&mut self, slot: u32, t: u64) {
        for c in 0..self.eps.len() {
            if self.eps[c].alive && self.trace.containers[c].last_slot < slot {
                self.end(c, t);
            }
        }
        for c in 0..self.eps.len() {
            if self.trace.containers[c].first_slot == slot {
                self.eps[c].alive = true;
                self.submit(t, Some(c));
            }
        }
        if slot == 0 {
            for _ in 0..self.eps.len() {
                self.submit(t, None);
            }
        }
    }

    /// Container `c` is gone at `t`.
    fn end(&mut self, c: usize, t: u64) {
        self.close_open(c, t);
        let ep = &mut self.eps[c];
        ep.alive = false;
        ep.cold = false;
        self.release_held(c, t);
        if let Some(wl) = self.eps[c].wl.take() {
            let id = WorkloadId(self.wls[wl].id);
            match self.wls[wl].fate {
                Fate::Holding => {
                    self.sampled.remove(&wl);
                    self.wls[wl].fate = Fate::Done;
                    self.tell(t, Event::WorkloadFinished { workload: id });
                }
                Fate::Queued => {
                    self.wls[wl].fate = Fate::Done;
                    self.tell(t, Event::WorkloadCancelled { workload: id });
                }
                Fate::Done => {}
            }
            self.dirty = true;
        }
    }

    fn release_held(&mut self, c: usize, t: u64) {
        if let Some(since) = self.eps[c].held_since_ms.take() {
            self.m.endpoint_gpu_hours += hours(t.saturating_sub(since));
        }
    }

    /// The reclaim of `c` that is open ends at `t` (needed again, its GPU back, or its end).
    fn close_open(&mut self, c: usize, t: u64) {
        if let Some(open) = self.eps[c].open.take() {
            let until = t.max(open.stop_ms);
            self.m.reclaimed_gpu_hours += hours(until - open.stop_ms);
            if until > open.stop_ms {
                self.eps[c].off.push((open.stop_ms, until));
            }
        }
    }

    /// Reclaimed endpoints needed in slot `slot` come back: a deleted one is submitted again,
    /// a suspended one is told (a probe of its pending workload: the gateway sees the request).
    fn needs(&mut self, slot: u32, t: u64) {
        for c in 0..self.eps.len() {
            let ep = &self.eps[c];
            if !ep.alive || ep.open.is_none() {
                continue;
            }
            let container = &self.trace.containers[c];
            let i = (slot - container.first_slot) as usize;
            if !needed(container, i, self.cfg.active_pct) {
                continue;
            }
            self.close_open(c, t);
            if self.eps[c].deleted {
                self.m.redeployed += 1;
                self.submit(t, Some(c));
            } else if let Some(wl) = self.eps[c].wl {
                let id = WorkloadId(self.wls[wl].id);
                self.tell(t, Event::ActivityProbed { workload: id, last_activity: Timestamp(t) });
                self.dirty = true;
            }
        }
    }

    /// Readings of slot `slot` at `t`: every running endpoint's duty cycle as utilisation (a
    /// reading without a signal in a gap), every running backfill job busy.
    fn read(&mut self, slot: u32, t: u64) {
        let mut events = Vec::with_capacity(self.sampled.len());
        for &wl in &self.sampled {
            let w = &self.wls[wl];
            let reading = match w.container {
                Some(c) => {
                    let duty = self.trace.containers[c].duty_at(slot);
                    DeviceReading {
                        member: 0,
                        shares: SHARES_PER_GPU as u32,
                        utilisation: duty.map(|d| (d * 10.0).round().clamp(0.0, 1000.0) as u16),
                        ..DeviceReading::default()
                    }
                }
                None => DeviceReading {
                    member: 0,
                    shares: SHARES_PER_GPU as u32,
                    sm_active: Some(1000),
                    engine_active: Some(1000),
                    utilisation: Some(1000),
                },
            };
            events.push(Event::ActivitySampled {
                workload: WorkloadId(w.id),
                readings: vec![reading],
            });
        }
        for e in events {
            self.tell(t, e);
        }
    }

    /// The last-request probe of every running endpoint that served a request in this run.
    fn probe(&mut self, t: u64) {
        let mut events = Vec::new();
        for &wl in &self.sampled {
            let Some(c) = self.wls[wl].container else { continue };
            let ep = &self.eps[c];
            if let (Some(last), Some(started)) = (ep.last_request_ms, ep.started_ms)
                && last >= started
            {
                let id = WorkloadId(self.wls[wl].id);
                events.push(Event::ActivityProbed { workload: id, last_activity: Timestamp(last) });
            }
        }
        for e in events {
            self.tell(t, e);
        }
    }

    /// Slot `slot`'s requests served by warm endpoints: their probe reports them.
    fn served(&mut self, slot: u32, t: u64) {
        for c in 0..self.eps.len() {
            let container = &self.trace.containers[c];
            let ep = &mut self.eps[c];
            if ep.alive && !ep.cold && container.requests_at(slot) > 0 {
                ep.last_request_ms = Some(t);
            }
        }
    }

    /// After slot `slot`'s cycle: the requests (and activity without requests) of endpoints
    /// reclaimed or still cold-starting are delayed.
    fn delayed(&mut self, slot: u32) {
        for c in 0..self.eps.len() {
            if !(self.eps[c].alive && self.eps[c].cold) {
                continue;
            }
            let container = &self.trace.containers[c];
            let requests = container.requests_at(slot);
            let active = container.duty_at(slot).is_some_and(|d| d >= self.cfg.active_pct);
            self.m.delayed_requests += u64::from(requests);
            self.m.delayed_active_slots += u64::from(requests == 0 && active);
        }
    }

    fn handle(&mut self, t: u64, h: Happening) {
        match h {
            Happening::Start { wl, run } => {
                let w = &self.wls[wl];
                if w.run_no != run || w.fate != Fate::Holding || w.started {
                    return;
                }
                self.wls[wl].started = true;
                self.sampled.insert(wl);
                let id = WorkloadId(self.wls[wl].id);
                self.tell(t, Event::AllocationStarted { workload: id });
                if let Some(c) = self.wls[wl].container {
                    let ep = &mut self.eps[c];
                    ep.cold = false;
                    ep.started_ms = Some(t);
                }
            }
            Happening::Stop { wl, run } => {
                let w = &self.wls[wl];
                if w.run_no != run || w.fate != Fate::Holding {
                    return;
                }
                let Some(mode) = w.stopping else { return };
                let id = WorkloadId(w.id);
                self.tell(t, Event::WorkloadStopped { workload: id });
                self.dirty = true;
                let w = &mut self.wls[wl];
                w.run_no += 1;
                w.started = false;
                w.stopping = None;
                w.fate = if mode == PreemptionMode::Delete { Fate::Done } else { Fate::Queued };
                if let Some(c) = w.container {
                    self.release_held(c, t);
                    let ep = &mut self.eps[c];
                    if mode == PreemptionMode::Delete {
                        ep.deleted = true;
                        ep.wl = None;
                    }
                }
            }
        }
    }

    fn on_decision(&mut self, t: u64, d: Decision) {
        let Some(&wl) = self.by_id.get(&d.workload().0) else { return };
        match d {
            Decision::Admit { .. } => self.admit(wl, t),
            Decision::Preempt { mode, reason, checkpoint_grace_ms, .. } => {
                let (mode, idle) = match reason {
                    // As in the modelled experiment: an idle victim stops with its rule's
                    // action (the arbiter's `Preempt` carries the project's mode).
                    PreemptReason::Idle { idle, .. } => (idle.action, true),
                    _ => (mode, false),
                };
                self.stop_requested(wl, t, mode, idle, checkpoint_grace_ms);
            }
            Decision::Reclaim { mode, checkpoint_grace_ms, .. } => {
                self.stop_requested(wl, t, mode, true, checkpoint_grace_ms);
            }
            Decision::Stop { .. } => {
                self.stop_requested(wl, t, PreemptionMode::Delete, false, None);
            }
            Decision::Warn { .. } => self.m.warnings += 1,
            Decision::Defer { .. } | Decision::Reject { .. } => {}
        }
    }

    fn admit(&mut self, wl: usize, t: u64) {
        let w = &mut self.wls[wl];
        if w.fate != Fate::Queued {
            return;
        }
        w.fate = Fate::Holding;
        w.run_no += 1;
        w.started = false;
        let run = w.run_no;
        let restart = w.restart;
        let mut start = t;
        if let Some(c) = w.container {
            // Its GPU back before it was needed again (resumed into free room).
            self.close_open(c, t);
            self.eps[c].held_since_ms = Some(t);
            if restart {
                self.m.cold_starts += 1;
                start = t + ms(self.cfg.cold_start_s);
            }
        }
        self.push(start, Happening::Start { wl, run });
    }

    fn stop_requested(
        &mut self,
        wl: usize,
        t: u64,
        mode: PreemptionMode,
        idle: bool,
        grace_ms: Option<u64>,
    ) {
        let w = &mut self.wls[wl];
        if w.fate != Fate::Holding || w.stopping.is_some() {
            return;
        }
        w.stopping = Some(mode);
        let run = w.run_no;
        let stop_at = t + grace_ms.unwrap_or(0);
        self.sampled.remove(&wl);
        match self.wls[wl].container {
            Some(c) if idle => {
                self.wls[wl].restart = true;
                self.judge(c, stop_at);
            }
            Some(_) => self.wls[wl].restart = true,
            None => self.m.backfill_preemptions += 1,
        }
        self.push(stop_at, Happening::Stop { wl, run });
    }

    /// One reclaim of container `c`, stopping at `stop_ms`: false if the endpoint is needed
    /// within the window; its requests from now until it is warm again are delayed.
    fn judge(&mut self, c: usize, stop_ms: u64) {
        let container = &self.trace.containers[c];
        let window_ms = ms(self.cfg.false_window_s);
        let first = stop_ms.div_ceil(self.step_ms);
        let mut false_reclaim = false;
        let mut slot = first.max(u64::from(container.first_slot));
        while slot <= u64::from(container.last_slot) && slot * self.step_ms <= stop_ms + window_ms {
            if needed(
                container,
                (slot - u64::from(container.first_slot)) as usize,
                self.cfg.active_pct,
            ) {
                false_reclaim = true;
                break;
            }
            slot += 1;
        }
        // The requests of the slot the reclaim happens at the start of arrive as it happens:
        // delayed (counted with the slot's requests), and also counted here.
        if stop_ms.is_multiple_of(self.step_ms) {
            let slot = stop_ms / self.step_ms;
            if let Ok(slot) = u32::try_from(slot) {
                self.m.interrupted_requests += u64::from(container.requests_at(slot));
            }
        }
        self.m.reclaims += 1;
        self.m.false_reclaims += u64::from(false_reclaim);
        let ep = &mut self.eps[c];
        ep.open = Some(Open { stop_ms });
        ep.cold = true;
        ep.last_request_ms = None;
        ep.started_ms = None;
    }

    fn finish(mut self, oracle: &Intervals) -> GenaiMetrics {
        let mut missed = 0;
        for (c, ep) in self.eps.iter_mut().enumerate() {
            ep.off.sort_unstable();
            missed += uncovered_ms(oracle.get(c).map_or(&[][..], |v| v), &ep.off);
        }
        self.m.missed_gpu_hours = hours(missed);
        self.m
    }
}

#[cfg(test)]
mod tests {
    use super::uncovered_ms;

    #[test]
    fn uncovered_length_of_intervals() {
        assert_eq!(uncovered_ms(&[(0, 10)], &[]), 10);
        assert_eq!(uncovered_ms(&[(0, 10)], &[(2, 4), (6, 7)]), 7);
        assert_eq!(uncovered_ms(&[(0, 10), (20, 30)], &[(5, 25)]), 10);
        assert_eq!(uncovered_ms(&[(5, 8)], &[(0, 100)]), 0);
        assert_eq!(uncovered_ms(&[(0, 4), (6, 9)], &[(3, 7)]), 5);
    }
}
