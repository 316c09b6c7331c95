//! The simulation of one policy: happenings, telemetry, probes, the engine's decisions, and
//! the books.

use super::Fate;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use allot_core::idle::DeviceReading;
use allot_core::ledger::{Ledger, Scope};
use allot_core::{
    Checkpointing, Decision, DeferReason, Engine, Event, GpuRequest, IdleFacts, NodeSpec,
    Placement, PolicySpec, PreemptReason, PreemptionMode, SHARES_PER_GPU, Timestamp, WorkloadId,
    WorkloadKind, WorkloadSpec,
};

use super::{
    ACTIVE_ACTIVITY, FALSE_WINDOW_S, IdleSimConfig, IdleSimError, IdleWorkload, KindMetrics,
    LedgerRow, PolicyMetrics, REQUEST_ACTIVITY, check_config,
};
use crate::activity::{ActivityParams, JobActivity, SLOT_S};
use crate::replay::percentile;
use crate::rng::SimRng;

/// Purposes of the telemetry's and the outages' random streams (`SimRng::fork`).
const PURPOSE_TELEMETRY: u64 = 0x7E1E;
/// The ledger's period: a day.
const LEDGER_PERIOD_MS: u64 = 86_400_000;
/// How often the ledger sees the cluster (capacity, free, fragmented).
const LEDGER_SNAPSHOT_MS: u64 = 300_000;
const PURPOSE_OUTAGE: u64 = 0x0DA6E;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Happening {
    Stop { wl: usize, run: u32 },
    Finish { wl: usize, run: u32 },
    End { wl: usize },
    Start { wl: usize, run: u32 },
    Checkpoint { wl: usize, run: u32 },
    Arrive { origin: usize },
    Redeploy { origin: usize },
}

impl Happening {
    /// Facts of an instant before arrivals.
    fn class(self) -> u8 {
        match self {
            Happening::Arrive { .. } | Happening::Redeploy { .. } => 1,
            _ => 0,
        }
    }
}

#[derive(Clone, Debug)]
struct Run {
    admitted_ms: u64,
    started_ms: Option<u64>,
    base_progress_s: f64,
    checkpoint_progress_s: f64,
    is_restart: bool,
    /// Told to stop (mode); the stop is pending.
    stopping: Option<PreemptionMode>,
    /// (node index, member, shares, device index on the node) per allocated device.
    devices: Vec<(usize, u32, u32, u16)>,
}

#[derive(Clone, Debug, Default)]
struct Books {
    allocated: f64,
    active: f64,
    useful: f64,
    idle: f64,
    lost: f64,
}

/// One engine workload: a submission, or a redeployment of one.
#[derive(Clone, Debug)]
struct Wl {
    origin: usize,
    id: u64,
    shares: u64,
    fate: Fate,
    run_no: u32,
    run: Option<Run>,
    saved_progress_s: f64,
    /// The next start is a restart (after a pre-emption, or a redeployment).
    restart: bool,
    ever_deferred: bool,
    wait_ms: u64,
    submitted_ms: u64,
    /// Submission → first start, once started.
    first_wait_ms: Option<u64>,
    /// Deferred before its first start.
    waited_first: bool,
    /// The pending stop is an idle reclaim.
    idle_stopped: bool,
    queued_since_ms: Option<u64>,
    last_presence_ms: Option<u64>,
    last_request_ms: Option<u64>,
    /// The last activity time the latest probe reported (within the current run).
    probed_ms: Option<u64>,
    books: Books,
}

struct Sim<'a> {
    cfg: &'a IdleSimConfig,
    label: &'a str,
    horizon_ms: u64,
    engine: Engine,
    origins: &'a [IdleWorkload],
    acts: Vec<JobActivity>,
    wls: Vec<Wl>,
    by_id: BTreeMap<u64, usize>,
    next_id: u64,
    queue: BinaryHeap<Reverse<(u64, u8, u64, Happening)>>,
    seq: u64,
    /// Running workloads that get telemetry (started, not told to stop).
    sampled: BTreeSet<usize>,
    /// Notebooks stopped for idleness and waiting: their user opening them again is a probe
    /// (the notebook hub sees the request) that tells the engine they are needed.
    suspended_notebooks: BTreeSet<usize>,
    outages: Vec<Vec<(u64, u64)>>,
    cursors: Vec<usize>,
    down: Vec<bool>,
    telemetry_rng: SimRng,
    dirty: bool,
    /// Per origin, the last idle reclaim not yet followed by a new admission: (time, GPUs,
    /// end of its predicted idleness, the devices it gave back), for
    /// `reclaimed_idle_gpu_hours` and `reused_gpu_hours`.
    open_reclaims: BTreeMap<usize, (u64, f64, f64, Vec<UsedDevice>)>,
    /// Closed reclaims: the kind, the devices given back, and the window (ms) their reclaimed
    /// GPU-hours cover.
    reclaim_windows: Vec<(usize, Vec<UsedDevice>, u64, u64)>,
    /// Per device (node, index): every run's use of it.
    device_use: BTreeMap<(usize, u16), Vec<DeviceUse>>,
    reclaimed_origins: BTreeSet<usize>,
    /// The goodput ledger, folded over the same events and decisions as the engine.
    ledger: Ledger,
    m: PolicyMetrics,
}

/// One device a workload held: (node index, device index, shares).
type UsedDevice = (usize, u16, u32);
/// One run's use of a device: (from, to) in ms, shares, the run's origin.
type DeviceUse = (u64, u64, u32, usize);

fn ms(s: f64) -> u64 {
    (s.max(0.0) * 1000.0).round() as u64
}

fn secs(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

fn permille(x: f64) -> u16 {
    (x.clamp(0.0, 1.0) * 1000.0).round() as u16
}

/// Runs one policy on `workloads` (ids unique and > 0) over the horizon of `config`.
/// Deterministic; `wall_ms` is left 0.
pub fn run_policy(
    nodes: &[NodeSpec],
    label: &str,
    policy: &PolicySpec,
    workloads: &[IdleWorkload],
    config: &IdleSimConfig,
) -> Result<PolicyMetrics, IdleSimError> {
    check_config(config)?;
    let engine = Engine::new(nodes, policy)
        .map_err(|e| IdleSimError::Config { policy: label.to_owned(), message: e.to_string() })?;
    let mut seen = BTreeSet::new();
    for w in workloads {
        if w.id == 0 || !seen.insert(w.id) {
            return Err(IdleSimError::Input(format!("workload id {} is 0 or repeated", w.id)));
        }
        if w.members == 0
            || w.gpus_per_member == 0
            || !(w.submit_s.is_finite() && w.submit_s >= 0.0)
            || !(w.duration_s.is_finite() && w.duration_s > 0.0)
        {
            return Err(IdleSimError::Input(format!(
                "workload {}: members, GPUs and duration must be positive, submit ≥ 0",
                w.id
            )));
        }
    }
    let horizon_ms = ms(config.hours * 3600.0);
    let acts = workloads
        .iter()
        .map(|w| {
            let duration = if w.endpoint() { config.hours * 3600.0 } else { w.duration_s };
            JobActivity::new(&config.activity, config.seed, w.id, w.kind, duration)
        })
        .collect();
    let outages = node_outages(nodes.len(), horizon_ms, config);
    let mut sim = Sim {
        cfg: config,
        label,
        horizon_ms,
        engine,
        origins: workloads,
        acts,
        wls: Vec::new(),
        by_id: BTreeMap::new(),
        next_id: workloads.iter().map(|w| w.id).max().unwrap_or(0) + 1,
        queue: BinaryHeap::new(),
        seq: 0,
        sampled: BTreeSet::new(),
        suspended_notebooks: BTreeSet::new(),
        cursors: vec![0; outages.len()],
        down: vec![false; outages.len()],
        outages,
        telemetry_rng: SimRng::new(config.seed).fork(PURPOSE_TELEMETRY),
        dirty: false,
        open_reclaims: BTreeMap::new(),
        reclaim_windows: Vec::new(),
        device_use: BTreeMap::new(),
        reclaimed_origins: BTreeSet::new(),
        ledger: Ledger::new(LEDGER_PERIOD_MS),
        m: PolicyMetrics::default(),
    };
    for (i, w) in workloads.iter().enumerate() {
        let t = ms(w.submit_s);
        if t < horizon_ms {
            sim.push(t, Happening::Arrive { origin: i });
        }
    }
    sim.run()?;
    Ok(sim.finish())
}

/// Each node's exporter outages over the horizon: exponential gaps of the configured mean,
/// uniform lengths, seeded per node.
fn node_outages(nodes: usize, horizon_ms: u64, config: &IdleSimConfig) -> Vec<Vec<(u64, u64)>> {
    let t = &config.telemetry;
    let root = SimRng::new(config.seed).fork(PURPOSE_OUTAGE);
    (0..nodes)
        .map(|n| {
            let Some(mean) = t.outage_mean_interval_s.filter(|m| *m > 0.0) else {
                return Vec::new();
            };
            let mut rng = root.fork(n as u64);
            let mut out = Vec::new();
            let mut at = 0.0;
            loop {
                at += -mean * (1.0 - rng.unit()).ln();
                let len = t.outage_len_s.0 + (t.outage_len_s.1 - t.outage_len_s.0) * rng.unit();
                if ms(at) >= horizon_ms {
                    break;
                }
                out.push((ms(at), ms(at + len)));
                at += len;
            }
            out
        })
        .collect()
}

impl Sim<'_> {
    /// Tells the engine (and the ledger) a fact.
    fn tell(&mut self, now: Timestamp, event: Event) {
        self.ledger.event(now, &event);
        self.engine.apply(now, event);
    }

    fn push(&mut self, t_ms: u64, h: Happening) {
        self.seq += 1;
        self.queue.push(Reverse((t_ms, h.class(), self.seq, h)));
    }

    fn origin(&self, wl: usize) -> &IdleWorkload {
        &self.origins[self.wls[wl].origin]
    }

    fn kind_entry(&mut self, kind: WorkloadKind) -> &mut KindMetrics {
        self.m.by_kind.entry(kind.as_str().to_owned()).or_default()
    }

    fn run(&mut self) -> Result<(), IdleSimError> {
        let tick_ms = ms(self.cfg.tick_s).max(1);
        let probe_ms = ms(self.cfg.probe_every_s).max(tick_ms);
        let mut t = 0u64;
        while t < self.horizon_ms {
            self.happenings_until(t);
            self.update_outages(t);
            self.sample(t, tick_ms);
            if t.is_multiple_of(probe_ms) {
                self.probe(t);
            }
            if self.dirty || self.engine.idle_attention(Timestamp(t)) {
                self.dirty = false;
                self.m.decide_calls += 1;
                let decisions = self.engine.decide_changes(Timestamp(t));
                for d in decisions {
                    self.ledger.decision(Timestamp(t), &d);
                    self.on_decision(t, d);
                }
                if self.cfg.audit {
                    self.engine.audit().map_err(|message| IdleSimError::Invariant {
                        policy: self.label.to_owned(),
                        at_s: secs(t),
                        message,
                    })?;
                }
            }
            if t.is_multiple_of(LEDGER_SNAPSHOT_MS) {
                self.ledger.cluster(Timestamp(t), self.engine.cluster_snapshot());
            }
            t += tick_ms;
        }
        self.happenings_until(self.horizon_ms);
        Ok(())
    }

    fn happenings_until(&mut self, t: u64) {
        while let Some(&Reverse((at, _, _, h))) = self.queue.peek() {
            if at > t {
                break;
            }
            self.queue.pop();
            self.handle(at, h);
        }
    }

    fn update_outages(&mut self, t: u64) {
        for (n, list) in self.outages.iter().enumerate() {
            let c = &mut self.cursors[n];
            while list.get(*c).is_some_and(|&(_, end)| end <= t) {
                *c += 1;
            }
            self.down[n] = list.get(*c).is_some_and(|&(start, end)| start <= t && t < end);
        }
    }

    // ----- happenings ---------------------------------------------------------------------

    fn handle(&mut self, t: u64, h: Happening) {
        let now = Timestamp(t);
        match h {
            Happening::Arrive { origin } => self.submit(t, origin, false),
            Happening::Redeploy { origin } => {
                self.m.redeployed += 1;
                self.submit(t, origin, true);
            }
            Happening::Start { wl, run } => {
                let w = &self.wls[wl];
                if w.run_no != run || w.fate != Fate::Holding {
                    return;
                }
                let Some(r) = self.wls[wl].run.as_mut() else { return };
                if r.started_ms.is_some() {
                    return;
                }
                r.started_ms = Some(t);
                let base = r.base_progress_s;
                let id = WorkloadId(self.wls[wl].id);
                self.tell(now, Event::AllocationStarted { workload: id });
                if let Some(since) = self.wls[wl].queued_since_ms.take() {
                    self.wls[wl].wait_ms += t.saturating_sub(since);
                }
                let w = &mut self.wls[wl];
                if w.first_wait_ms.is_none() {
                    w.first_wait_ms = Some(t.saturating_sub(w.submitted_ms));
                }
                self.sampled.insert(wl);
                let o = self.origin(wl).clone();
                if matches!(o.kind, WorkloadKind::Training | WorkloadKind::Batch) {
                    let remaining = (o.duration_s - base).max(0.0);
                    self.push(t + ms(remaining), Happening::Finish { wl, run });
                    self.push_checkpoint(wl, t, base);
                }
            }
            Happening::Checkpoint { wl, run } => {
                let w = &self.wls[wl];
                if w.run_no != run {
                    return;
                }
                let Some(interval) = self.origin(wl).checkpoint_interval_s else { return };
                let Some(r) = self.wls[wl].run.as_mut() else { return };
                let Some(started) = r.started_ms else { return };
                if r.stopping.is_some() {
                    return;
                }
                let progress = r.base_progress_s + secs(t - started);
                let at = (progress / interval).round() * interval;
                r.checkpoint_progress_s = at.max(r.checkpoint_progress_s);
                let id = WorkloadId(self.wls[wl].id);
                self.tell(now, Event::CheckpointSaved { workload: id });
                self.push_checkpoint(wl, t, progress);
            }
            Happening::Finish { wl, run } => {
                if self.wls[wl].run_no != run || self.wls[wl].fate != Fate::Holding {
                    return;
                }
                self.close_run(wl, t, None);
                self.wls[wl].fate = Fate::Done;
                self.m.jobs_finished += 1;
                let id = WorkloadId(self.wls[wl].id);
                self.tell(now, Event::WorkloadFinished { workload: id });
                self.dirty = true;
            }
            Happening::End { wl } => {
                let id = WorkloadId(self.wls[wl].id);
                match self.wls[wl].fate {
                    Fate::Done => {}
                    Fate::Holding => {
                        self.close_run(wl, t, None);
                        self.wls[wl].fate = Fate::Done;
                        self.m.jobs_finished += 1;
                        self.tell(now, Event::WorkloadFinished { workload: id });
                        self.dirty = true;
                    }
                    Fate::Queued => {
                        self.close_wait(wl, t);
                        self.wls[wl].fate = Fate::Done;
                        self.m.notebooks_ended_pending += 1;
                        self.tell(now, Event::WorkloadCancelled { workload: id });
                        self.dirty = true;
                    }
                }
            }
            Happening::Stop { wl, run } => {
                if self.wls[wl].run_no != run || self.wls[wl].fate != Fate::Holding {
                    return;
                }
                let Some(mode) = self.wls[wl].run.as_ref().and_then(|r| r.stopping) else {
                    return;
                };
                self.close_run(wl, t, Some(mode));
                let id = WorkloadId(self.wls[wl].id);
                self.tell(now, Event::WorkloadStopped { workload: id });
                self.dirty = true;
                let w = &mut self.wls[wl];
                w.restart = true;
                if mode == PreemptionMode::Delete {
                    w.fate = Fate::Done;
                    self.m.deleted += 1;
                    let kind = self.origin(wl).kind;
                    self.kind_entry(kind).deleted += 1;
                    self.schedule_redeploy(wl, t);
                } else {
                    w.fate = Fate::Queued;
                    w.queued_since_ms = Some(t);
                    if w.idle_stopped && self.origins[w.origin].kind == WorkloadKind::Notebook {
                        self.suspended_notebooks.insert(wl);
                    }
                }
            }
        }
    }

    fn submit(&mut self, t: u64, origin: usize, redeploy: bool) {
        let o = &self.origins[origin];
        let id = if redeploy {
            self.next_id += 1;
            self.next_id - 1
        } else {
            o.id
        };
        let wl = self.wls.len();
        self.wls.push(Wl {
            origin,
            id,
            shares: o.gpus() * SHARES_PER_GPU,
            fate: Fate::Queued,
            run_no: 0,
            run: None,
            saved_progress_s: 0.0,
            restart: redeploy,
            ever_deferred: false,
            submitted_ms: t,
            first_wait_ms: None,
            waited_first: false,
            idle_stopped: false,
            wait_ms: 0,
            queued_since_ms: Some(t),
            last_presence_ms: None,
            last_request_ms: None,
            probed_ms: None,
            books: Books::default(),
        });
        self.by_id.insert(id, wl);
        if o.kind == WorkloadKind::Notebook {
            let end = ms(o.submit_s + o.duration_s);
            if end < self.horizon_ms {
                self.push(end.max(t), Happening::End { wl });
            }
        }
        let spec = WorkloadSpec {
            id: WorkloadId(id),
            name: format!("{}-{id}", o.kind.as_str()),
            kind: o.kind,
            project: o.project.clone(),
            user: String::new(),
            priority_class: o.priority_class.clone(),
            members: o.members,
            gpus_per_member: GpuRequest::Whole(o.gpus_per_member),
            gpu_models: Vec::new(),
            cpu_millis_per_member: 0,
            memory_mib_per_member: 0,
            same_node: false,
            prefer_same_node: false,
            preemptible: None,
            checkpointing: o.checkpoint_interval_s.map(|_| Checkpointing {
                grace_ms: ms(self.cfg.checkpoint_grace_s),
                last_checkpoint_at: None,
            }),
            min_runtime_ms: 0,
            max_runtime_ms: None,
            deadline: None,
        };
        self.tell(Timestamp(t), Event::WorkloadSubmitted(spec));
        self.dirty = true;
    }

    fn push_checkpoint(&mut self, wl: usize, t: u64, progress_s: f64) {
        let o = self.origin(wl);
        let Some(interval) = o.checkpoint_interval_s.filter(|i| *i > 0.0) else { return };
        let duration = o.duration_s;
        let mut next = ((progress_s / interval).floor() + 1.0) * interval;
        if ms(next - progress_s) == 0 {
            next += interval;
        }
        if next < duration {
            let run = self.wls[wl].run_no;
            self.push(t + ms(next - progress_s), Happening::Checkpoint { wl, run });
        }
    }

    /// A deleted notebook or endpoint comes back when its user next needs it (a notebook's
    /// user present, an endpoint's traffic), before its end: a new submission.
    fn schedule_redeploy(&mut self, wl: usize, t: u64) {
        let origin = self.wls[wl].origin;
        let o = &self.origins[origin];
        let act = &self.acts[origin];
        let params = &self.cfg.activity;
        let from = secs(t);
        let horizon = secs(self.horizon_ms);
        let at = match o.kind {
            WorkloadKind::Notebook => {
                let end = (o.submit_s + o.duration_s).min(horizon);
                next_presence(act, params, o.submit_s, from, end)
            }
            WorkloadKind::Inference | WorkloadKind::Service => {
                let p0 = from - o.submit_s;
                next_at_least(act, params, o.kind, p0, from, horizon, REQUEST_ACTIVITY)
            }
            WorkloadKind::Training | WorkloadKind::Batch => None,
        };
        if let Some(at) = at {
            let at_ms = ms(at).max(t);
            if at_ms < self.horizon_ms {
                self.push(at_ms, Happening::Redeploy { origin });
            }
        }
    }

    fn close_wait(&mut self, wl: usize, t: u64) {
        let w = &mut self.wls[wl];
        if let Some(since) = w.queued_since_ms.take() {
            w.wait_ms += t.saturating_sub(since);
        }
    }

    /// Progress of a running workload at `t` (training/batch: work done; notebooks: session
    /// time since the original submission; endpoints: time since submission).
    fn progress_at(&self, wl: usize, t: u64) -> f64 {
        let o = self.origin(wl);
        match o.kind {
            WorkloadKind::Training | WorkloadKind::Batch => {
                let Some(r) = &self.wls[wl].run else { return self.wls[wl].saved_progress_s };
                r.base_progress_s + r.started_ms.map_or(0.0, |s| secs(t.saturating_sub(s)))
            }
            _ => secs(t) - o.submit_s,
        }
    }

    /// Books the current run, ending at `t`: kept (`None`: finished, or the horizon) or
    /// stopped by a pre-emption or reclaim with `mode`.
    fn close_run(&mut self, wl: usize, t: u64, stopped: Option<PreemptionMode>) {
        let origin = self.wls[wl].origin;
        let o = &self.origins[origin];
        let act = &self.acts[origin];
        let params = &self.cfg.activity;
        let w = &mut self.wls[wl];
        let Some(r) = w.run.take() else { return };
        w.run_no += 1;
        self.sampled.remove(&wl);
        for &(node, _, shares, device) in &r.devices {
            let used = (r.admitted_ms, t, shares, origin);
            self.device_use.entry((node, device)).or_default().push(used);
        }
        let gpus = w.shares as f64 / SHARES_PER_GPU as f64;
        let started = r.started_ms.unwrap_or(t).min(t);
        let delay = secs(started.saturating_sub(r.admitted_ms));
        let ran = secs(t.saturating_sub(started));
        let b = &mut w.books;
        b.allocated += gpus * (delay + ran);
        let mut lost = 0.0;
        if r.is_restart {
            lost += gpus * delay;
        } else {
            b.idle += gpus * delay;
        }
        let start_s = secs(started);
        let wall_clock = !matches!(o.kind, WorkloadKind::Training | WorkloadKind::Batch);
        let endpoint = matches!(o.kind, WorkloadKind::Inference | WorkloadKind::Service);
        let (active_kept, active_thrown, kept_progress) = if wall_clock {
            let active = act.integral(params, start_s - o.submit_s, start_s, ran);
            // A notebook's kernel state does not survive a stop (no checkpoints); an
            // endpoint's served requests do — stopping it loses only its restart.
            if stopped.is_some() && !endpoint { (0.0, active, 0.0) } else { (active, 0.0, 0.0) }
        } else {
            let reached = r.base_progress_s + ran;
            let kept = match stopped {
                None => reached,
                Some(PreemptionMode::Suspend) if o.checkpoint_interval_s.is_some() => {
                    r.checkpoint_progress_s
                }
                // Nothing saved: what earlier runs saved (for work that never checkpoints,
                // nothing).
                Some(PreemptionMode::Suspend) => r.base_progress_s,
                Some(PreemptionMode::Requeue | PreemptionMode::Delete) => r.base_progress_s,
            }
            .clamp(r.base_progress_s, reached);
            let kept = if reached - kept < 0.000_5 { reached } else { kept };
            let kept_len = kept - r.base_progress_s;
            let a_kept = act.integral(params, r.base_progress_s, start_s, kept_len);
            let a_thrown = act.integral(params, kept, start_s + kept_len, ran - kept_len);
            (a_kept, a_thrown, kept)
        };
        b.active += gpus * (active_kept + active_thrown);
        b.useful += gpus * active_kept;
        lost += gpus * active_thrown;
        b.idle += gpus * (ran - active_kept - active_thrown);
        w.saved_progress_s = kept_progress;
        if !endpoint && matches!(stopped, Some(PreemptionMode::Requeue | PreemptionMode::Delete)) {
            // Everything ever kept is thrown away.
            lost += b.useful;
            b.useful = 0.0;
            w.saved_progress_s = 0.0;
        }
        b.lost += lost;
        let kind = o.kind;
        self.kind_entry(kind).lost_gpu_hours += lost / 3600.0;
    }

    // ----- telemetry ----------------------------------------------------------------------

    fn sample(&mut self, t: u64, tick_ms: u64) {
        let tel = &self.cfg.telemetry;
        let params = &self.cfg.activity;
        let abs = secs(t);
        let periodic = tel.spike_every_s.filter(|e| *e > 0.0).is_some_and(|every| {
            let every_ms = ms(every).max(1);
            t / every_ms > t.saturating_sub(tick_ms) / every_ms && t >= every_ms
        });
        let tick_rng = self.telemetry_rng.fork(t);
        let mut events = Vec::with_capacity(self.sampled.len());
        for &wl in &self.sampled {
            let w = &self.wls[wl];
            let Some(r) = &w.run else { continue };
            let o = &self.origins[w.origin];
            let act = &self.acts[w.origin];
            let progress = match o.kind {
                WorkloadKind::Training | WorkloadKind::Batch => {
                    r.base_progress_s + r.started_ms.map_or(0.0, |s| secs(t.saturating_sub(s)))
                }
                _ => abs - o.submit_s,
            };
            let a = act.at(params, progress, abs);
            let mut rng = tick_rng.fork(w.id);
            let mut readings = Vec::with_capacity(r.devices.len());
            let mut gaps = 0u64;
            for &(node, member, shares, _) in &r.devices {
                let noise = tel.sm_noise.0 + (tel.sm_noise.1 - tel.sm_noise.0) * rng.unit();
                let spike_draw = rng.unit();
                if self.down.get(node).copied().unwrap_or(false) {
                    gaps += 1;
                    readings.push(DeviceReading { member, shares, ..DeviceReading::default() });
                    continue;
                }
                let sm = permille(a * noise);
                let util = if a >= tel.idle_below {
                    permille((2.0 * a + 0.05).min(1.0))
                } else if periodic || spike_draw < tel.spike_share {
                    1000
                } else {
                    0
                };
                readings.push(DeviceReading {
                    member,
                    shares,
                    sm_active: Some(sm),
                    engine_active: Some(sm),
                    utilisation: Some(util),
                });
            }
            self.m.telemetry_gap_samples += gaps;
            events.push((wl, a, readings));
        }
        for (wl, a, readings) in events {
            if a >= REQUEST_ACTIVITY {
                self.wls[wl].last_request_ms = Some(t);
            }
            let id = WorkloadId(self.wls[wl].id);
            self.tell(Timestamp(t), Event::ActivitySampled { workload: id, readings });
        }
    }

    /// Application probes: a notebook's last user presence, an endpoint's last request, both
    /// within the current run (the probe talks to the running process).
    fn probe(&mut self, t: u64) {
        let params = &self.cfg.activity;
        let mut probes = Vec::new();
        for &wl in &self.sampled {
            let w = &self.wls[wl];
            let o = &self.origins[w.origin];
            let Some(started) = w.run.as_ref().and_then(|r| r.started_ms) else { continue };
            let last = match o.kind {
                WorkloadKind::Notebook => {
                    if self.acts[w.origin].user_present(params, secs(t) - o.submit_s) {
                        Some(t)
                    } else {
                        w.last_presence_ms
                    }
                }
                WorkloadKind::Inference | WorkloadKind::Service => w.last_request_ms,
                WorkloadKind::Training | WorkloadKind::Batch => None,
            };
            if let Some(last) = last.filter(|&l| l >= started) {
                probes.push((wl, last));
            }
        }
        // A suspended notebook's user back: the hub sees the request, once per suspension.
        let back: Vec<usize> = self
            .suspended_notebooks
            .iter()
            .copied()
            .filter(|&wl| {
                let w = &self.wls[wl];
                let o = &self.origins[w.origin];
                w.fate == Fate::Queued
                    && self.acts[w.origin].user_present(params, secs(t) - o.submit_s)
            })
            .collect();
        for wl in back {
            self.suspended_notebooks.remove(&wl);
            let id = WorkloadId(self.wls[wl].id);
            let event = Event::ActivityProbed { workload: id, last_activity: Timestamp(t) };
            self.tell(Timestamp(t), event);
            self.dirty = true;
        }
        for (wl, last) in probes {
            if self.origin(wl).kind == WorkloadKind::Notebook {
                self.wls[wl].last_presence_ms = Some(last);
            }
            self.wls[wl].probed_ms = Some(last);
            let id = WorkloadId(self.wls[wl].id);
            self.tell(
                Timestamp(t),
                Event::ActivityProbed { workload: id, last_activity: Timestamp(last) },
            );
        }
    }

    // ----- decisions ----------------------------------------------------------------------

    fn on_decision(&mut self, t: u64, d: Decision) {
        let Some(&wl) = self.by_id.get(&d.workload().0) else { return };
        match d {
            Decision::Admit { placement, .. } => self.admit(wl, t, &placement),
            Decision::Preempt { mode, reason, checkpoint_grace_ms, .. } => {
                let (mode, idle) = match reason {
                    // Work-around for an engine bug (reported): the arbiter's `Preempt` of an
                    // idle victim carries the project's pre-emption mode, not the idle rule's
                    // action. The rule's action is what the policy asks for, so it is what
                    // the backend does here; the engine requeues the victim either way.
                    PreemptReason::Idle { idle, .. } => (idle.action, Some(idle)),
                    _ => (mode, None),
                };
                self.stop_requested(wl, t, mode, idle, checkpoint_grace_ms);
            }
            Decision::Reclaim { mode, idle, checkpoint_grace_ms, .. } => {
                self.stop_requested(wl, t, mode, Some(idle), checkpoint_grace_ms);
            }
            Decision::Stop { .. } => self.stop_requested(wl, t, PreemptionMode::Delete, None, None),
            Decision::Warn { .. } => self.m.warnings += 1,
            Decision::Defer { reason, .. } => {
                self.wls[wl].ever_deferred = true;
                if self.wls[wl].first_wait_ms.is_none() {
                    self.wls[wl].waited_first = true;
                }
                if matches!(
                    reason,
                    DeferReason::NeverPlaceable { .. }
                        | DeferReason::ExceedsMaxQuota { .. }
                        | DeferReason::NoQuotaForModel { .. }
                ) && self.wls[wl].fate == Fate::Queued
                {
                    let id = WorkloadId(self.wls[wl].id);
                    self.tell(Timestamp(t), Event::WorkloadCancelled { workload: id });
                    self.close_wait(wl, t);
                    self.wls[wl].fate = Fate::Done;
                }
            }
            Decision::Reject { .. } => {
                if self.wls[wl].fate == Fate::Queued {
                    self.close_wait(wl, t);
                    self.wls[wl].fate = Fate::Done;
                }
            }
        }
    }

    fn admit(&mut self, wl: usize, t: u64, placement: &Placement) {
        let w = &mut self.wls[wl];
        if w.fate != Fate::Queued {
            return;
        }
        let devices = placement
            .members
            .iter()
            .enumerate()
            .flat_map(|(m, mp)| {
                mp.devices.iter().map(move |d| (mp.node.0 as usize, m as u32, d.shares, d.device))
            })
            .collect();
        w.fate = Fate::Holding;
        w.idle_stopped = false;
        self.suspended_notebooks.remove(&wl);
        let w = &mut self.wls[wl];
        w.run_no += 1;
        w.run = Some(Run {
            admitted_ms: t,
            started_ms: None,
            base_progress_s: w.saved_progress_s,
            checkpoint_progress_s: w.saved_progress_s,
            is_restart: w.restart,
            stopping: None,
            devices,
        });
        let run = w.run_no;
        let origin = w.origin;
        self.push(t + ms(self.cfg.launch_delay_s), Happening::Start { wl, run });
        self.close_reclaim(origin, t);
    }

    /// The workload of `origin` holds GPUs again at `t` (or the run is over): its last idle
    /// reclaim gave back GPUs from the reclaim to `t` or to the end of its idleness.
    fn close_reclaim(&mut self, origin: usize, t: u64) {
        let Some((at, gpus, until, devices)) = self.open_reclaims.remove(&origin) else { return };
        let kind = self.origins[origin].kind;
        let end_s = until.min(secs(t));
        let hours = gpus * (end_s - secs(at)).max(0.0) / 3600.0;
        self.m.reclaimed_idle_gpu_hours += hours;
        self.kind_entry(kind).reclaimed_idle_gpu_hours += hours;
        let end_ms = ms(end_s);
        if end_ms > at {
            self.reclaim_windows.push((origin, devices, at, end_ms));
        }
    }

    /// Of each reclaim's window, the GPU time other work held on the devices it gave back (at
    /// most the shares it gave back, per device): `reused_gpu_hours`.
    fn reused(&mut self) {
        for (origin, devices, from, to) in std::mem::take(&mut self.reclaim_windows) {
            let mut reused_ms_shares: u128 = 0;
            for (node, device, shares) in devices {
                let Some(uses) = self.device_use.get(&(node, device)) else { continue };
                // Share-ms other work used inside the window (not the victim itself, which
                // holds its devices through its grace), capped by what was given back.
                let used: u128 = uses
                    .iter()
                    .filter(|&&(a, b, _, o)| o != origin && a < to && b > from)
                    .map(|&(a, b, sh, _)| u128::from(b.min(to) - a.max(from)) * u128::from(sh))
                    .sum();
                reused_ms_shares += used.min(u128::from(to - from) * u128::from(shares));
            }
            let hours = reused_ms_shares as f64 / SHARES_PER_GPU as f64 / 3_600_000.0;
            let kind = self.origins[origin].kind;
            self.m.reused_gpu_hours += hours;
            self.kind_entry(kind).reused_gpu_hours += hours;
        }
    }

    fn stop_requested(
        &mut self,
        wl: usize,
        t: u64,
        mode: PreemptionMode,
        idle: Option<IdleFacts>,
        grace_ms: Option<u64>,
    ) {
        let progress = self.progress_at(wl, t);
        let checkpointable = self.origin(wl).checkpoint_interval_s.is_some();
        let w = &mut self.wls[wl];
        if w.fate != Fate::Holding {
            return;
        }
        let Some(r) = w.run.as_mut() else { return };
        if r.stopping.is_some() {
            return;
        }
        r.stopping = Some(mode);
        // A checkpointable workload asked to checkpoint within its grace does so at once.
        if checkpointable && grace_ms.is_some() && r.started_ms.is_some() {
            r.checkpoint_progress_s = progress.max(r.checkpoint_progress_s);
        }
        let run = w.run_no;
        self.sampled.remove(&wl);
        self.m.preemptions += 1;
        self.wls[wl].idle_stopped = idle.is_some();
        if idle.is_some() {
            self.judge_reclaim(wl, t, progress);
        }
        self.push(t + grace_ms.unwrap_or(0), Happening::Stop { wl, run });
    }

    /// The ground truth of one idle reclaim: how long the victim would have stayed idle, and
    /// whether it was in use just before or just after.
    fn judge_reclaim(&mut self, wl: usize, t: u64, progress: f64) {
        let origin = self.wls[wl].origin;
        let o = &self.origins[origin];
        let act = &self.acts[origin];
        let params = &self.cfg.activity;
        let gpus = self.wls[wl].shares as f64 / SHARES_PER_GPU as f64;
        let now = secs(t);
        let horizon = secs(self.horizon_ms);
        let end = match o.kind {
            WorkloadKind::Training | WorkloadKind::Batch => now + (o.duration_s - progress),
            WorkloadKind::Notebook => o.submit_s + o.duration_s,
            WorkloadKind::Inference | WorkloadKind::Service => horizon,
        }
        .min(horizon)
        .max(now);
        let next = next_at_least(act, params, o.kind, progress, now, end, ACTIVE_ACTIVITY);
        let reclaimed_s = next.unwrap_or(end).min(end) - now;
        // What the probe last reported, whether or not the policy listens to probes (the
        // notebook server and the endpoint answer the same under every policy).
        let started = self.wls[wl].run.as_ref().and_then(|r| r.started_ms).unwrap_or(t);
        let used_before = self.wls[wl]
            .probed_ms
            .filter(|&p| p >= started)
            .is_some_and(|p| secs(p) > now - FALSE_WINDOW_S);
        let used_after = next.is_some_and(|n| n <= now + FALSE_WINDOW_S);
        let false_reclaim = used_before || used_after;
        self.close_reclaim(origin, t);
        let devices: Vec<UsedDevice> = self.wls[wl]
            .run
            .as_ref()
            .map(|r| {
                r.devices.iter().map(|&(node, _, shares, device)| (node, device, shares)).collect()
            })
            .unwrap_or_default();
        self.open_reclaims.insert(origin, (t, gpus, now + reclaimed_s, devices));
        self.m.idle_reclaims += 1;
        if self.reclaimed_origins.insert(origin) {
            self.m.idle_reclaimed_workloads += 1;
        }
        self.m.reclaimed_idle_gpu_hours_gross += gpus * reclaimed_s / 3600.0;
        self.m.false_reclaims += u64::from(false_reclaim);
        let k = self.kind_entry(o.kind);
        k.idle_reclaims += 1;
        k.reclaimed_idle_gpu_hours_gross += gpus * reclaimed_s / 3600.0;
        k.false_reclaims += u64::from(false_reclaim);
        k.false_by_probe_before += u64::from(used_before);
        k.false_by_activity_after += u64::from(used_after);
    }

    fn finish(mut self) -> PolicyMetrics {
        let h = self.horizon_ms;
        for wl in 0..self.wls.len() {
            if self.wls[wl].fate == Fate::Holding {
                self.close_run(wl, h, None);
            }
            self.close_wait(wl, h);
        }
        let open: Vec<usize> = self.open_reclaims.keys().copied().collect();
        for origin in open {
            self.close_reclaim(origin, h);
        }
        self.reused();
        self.ledger.close(Timestamp(h));
        for scope in self.ledger.scopes() {
            let name = match &scope {
                Scope::Cluster => "cluster".to_owned(),
                Scope::Project(p) => p.clone(),
                Scope::User(_) | Scope::Workload(_) => continue,
            };
            let b = self.ledger.total(&scope);
            self.m.ledger.insert(name, LedgerRow::of(&b));
        }
        let mut waits: Vec<f64> = self
            .wls
            .iter()
            .filter(|w| w.waited_first)
            .map(|w| secs(w.first_wait_ms.unwrap_or(h.saturating_sub(w.submitted_ms))))
            .collect();
        waits.sort_by(f64::total_cmp);
        let mut b = Books::default();
        for w in &self.wls {
            b.allocated += w.books.allocated;
            b.active += w.books.active;
            b.useful += w.books.useful;
            b.idle += w.books.idle;
            b.lost += w.books.lost;
        }
        let m = &mut self.m;
        m.pending_wait_s_p95 = percentile(&waits, 95.0);
        m.allocated_gpu_hours = b.allocated / 3600.0;
        m.active_gpu_hours = b.active / 3600.0;
        m.useful_gpu_hours = b.useful / 3600.0;
        m.idle_allocated_gpu_hours = b.idle / 3600.0;
        m.lost_gpu_hours = b.lost / 3600.0;
        m.goodput = if b.allocated > 0.0 { b.useful / b.allocated } else { 0.0 };
        self.m
    }
}

/// The first time in [`from_s`, `until_s`) at which a workload of `kind`, at progress
/// `progress_s` at `from_s` and advancing with the wall clock, shows activity ≥ `threshold`
/// (as if it kept running). Activity changes only at slot edges of the workload's clock
/// (hangs and abandoned tails only bring it to 0), so the slot edges are all that is looked at.
pub fn next_at_least(
    act: &JobActivity,
    params: &ActivityParams,
    kind: WorkloadKind,
    progress_s: f64,
    from_s: f64,
    until_s: f64,
    threshold: f64,
) -> Option<f64> {
    let diurnal = matches!(kind, WorkloadKind::Inference | WorkloadKind::Service);
    let mut t = from_s;
    // Slot edges are evaluated a hair inside the new slot.
    let mut probe_at = from_s;
    while t < until_s {
        let p = progress_s + (probe_at - from_s);
        if act.at(params, p, probe_at) >= threshold {
            return Some(t);
        }
        let clock = if diurnal { t } else { progress_s + (t - from_s) };
        let step = SLOT_S - clock.rem_euclid(SLOT_S);
        t += if step < 1e-6 { SLOT_S } else { step };
        probe_at = t + 1e-6;
    }
    None
}

/// The first time in [`from_s`, `until_s`) at which a notebook submitted at `submit_s` has its
/// user present (session windows on the time since submission).
pub fn next_presence(
    act: &JobActivity,
    params: &ActivityParams,
    submit_s: f64,
    from_s: f64,
    until_s: f64,
) -> Option<f64> {
    let window_s = SLOT_S * params.notebook_session_slots.max(1) as f64;
    let mut t = from_s;
    let mut probe_at = from_s;
    while t < until_s {
        if act.user_present(params, probe_at - submit_s) {
            return Some(t);
        }
        let clock = t - submit_s;
        let step = window_s - clock.rem_euclid(window_s);
        t += if step < 1e-6 { window_s } else { step };
        probe_at = t + 1e-6;
    }
    None
}
