//! Time-based replay: a discrete-event simulation that drives the real `allot_core::Engine`
//! with a virtual clock. There is no second scheduler: every admission and pre-emption is the
//! engine's decision; this module only plays the backend (starts, checkpoints, stops, exits)
//! and keeps the books.
//!
//! Events are ordered by (time in ms, class, sequence number): exits, stops, starts and
//! checkpoints first, then arrivals, then the scheduling cycle, so a cycle at time t sees every
//! fact of time t. The engine's cycle runs only when something that can change its answer
//! happened since the last one (an arrival, an exit, a stop) and work is pending — once per
//! such instant by default, or on a coarser grid (`decide_every_s`) that groups arrivals, as
//! a cycle over a deep queue costs the same whether one job or ten arrived. Checkpoints and
//! starts do not trigger a cycle.
//!
//! GPU-hour books, per job and per project: allocated = useful + lost + idle-while-allocated.
//! *Lost* is every GPU-second whose work was thrown away — run time since the last checkpoint
//! at a pre-emption (all of it for a job that does not checkpoint, and everything ever done
//! when a pre-emption requeues from scratch or deletes) — plus the restart delay after a
//! pre-emption. Of the work kept, *useful* is the activity-weighted part and *idle* the rest.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::fmt;

use allot_core::{
    Checkpointing, Decision, DeferReason, Engine, Event, GpuRequest, NodeSpec, PolicySpec,
    PreemptionMode, ProjectSpec, Queueing, QuotaModel, QuotaSpec, Refresh, SHARES_PER_GPU, Shares,
    Timestamp, WorkloadId, WorkloadKind, WorkloadSpec,
};

use crate::activity::{ActivityParams, JobActivity, assign_kind};
use crate::outcome::{ProjectLedger, ReplayReport, TimelinePoint};
use crate::trace::TraceJob;

/// Most points in a timeline: the sampling step grows for long traces to stay under it.
pub const TIMELINE_POINTS_MAX: usize = 5_000;

/// Most cycles at one virtual instant before the next waits a millisecond.
pub const ROUNDS_PER_INSTANT_MAX: u32 = 4;

/// How a replay runs. `Default` is what `allot sim replay` uses without flags.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayConfig {
    /// Seeds the activity model and the kind assignment.
    pub seed: u64,
    /// Stop the replay at this virtual time (seconds); work still queued or running is pending.
    pub until_s: Option<f64>,
    /// Cadence of the engine's cycle, virtual seconds; 0: at every instant something changed
    /// (the engine's clock resolution, 1 ms, is the floor).
    pub decide_every_s: f64,
    /// With a cadence: `true` (`sim replay --decide-every`), cycles fall on its grid, which
    /// groups arrivals; `false`, the daemon's rule (`Daemon::cycle_due`): a cycle as soon as
    /// something changed, but at least the cadence after the one before, so work that arrives
    /// after a quiet spell is decided at once (the what-if replays the daemon this way).
    pub decide_on_grid: bool,
    /// Timeline sampling step, virtual seconds (grown to respect `TIMELINE_POINTS_MAX`).
    pub timeline_step_s: f64,
    /// Admission → start of a job's first run (image pull, process start): allocated, idle.
    pub launch_delay_s: f64,
    /// Admission → start after a pre-emption (reload a checkpoint, warm up): allocated, lost.
    pub restart_delay_s: f64,
    /// Grace a checkpointable job gets between a pre-emption and its stop.
    pub checkpoint_grace_s: f64,
    /// Checkpoint interval for training and batch jobs whose trace gives none; `None`: such
    /// jobs do not checkpoint (a pre-emption loses their whole run).
    pub default_checkpoint_interval_s: Option<f64>,
    pub activity: ActivityParams,
    /// Check the engine's invariants after every cycle (tests; slow on big traces).
    pub audit: bool,
    /// A scoped rollout rehearsed on the trace, with its rollback conditions.
    pub rehearsal: Option<Rehearsal>,
    /// Every job declares a max runtime: its duration rounded up to whole minutes, plus one
    /// minute (the time limit a Slurm user would give). A run never reaches it: a run lasts at
    /// most the duration after its start.
    pub time_limits: bool,
}

/// A rollout rehearsed on history: from `at_s` the replay runs under `policy` (the active
/// policy with the candidate's rules for `scope`, `allot_config::scoped_policy`); every
/// `check_every_s` its conditions are judged on the replay's own outcomes, as the daemon
/// judges them, and when one trips the replay goes back to the active policy.
#[derive(Clone, Debug, PartialEq)]
pub struct Rehearsal {
    pub at_s: f64,
    pub policy: PolicySpec,
    pub scope: allot_config::Scope,
    pub rules: allot_config::rollout::RollbackRules,
    pub check_every_s: f64,
}

impl Default for ReplayConfig {
    fn default() -> ReplayConfig {
        ReplayConfig {
            seed: 42,
            until_s: None,
            decide_every_s: 0.0,
            decide_on_grid: true,
            timeline_step_s: 3600.0,
            launch_delay_s: 0.0,
            restart_delay_s: 60.0,
            checkpoint_grace_s: 30.0,
            default_checkpoint_interval_s: None,
            activity: ActivityParams::default(),
            audit: false,
            rehearsal: None,
            time_limits: false,
        }
    }
}

/// Why a replay could not run.
#[derive(Clone, Debug, PartialEq)]
pub enum ReplayError {
    /// The engine refused the cluster and policy.
    Config(String),
    /// A job the engine cannot take as written (duplicate id, bad shape).
    Job { line: usize, message: String },
    /// The engine's invariants broke (only checked with `ReplayConfig::audit`).
    Invariant { at_s: f64, message: String },
    /// Virtual time stopped moving: more happenings at one millisecond than the trace could
    /// cause. A bug in the replay, reported instead of looping forever.
    Stalled { at_s: f64, happenings: u64 },
    /// The caller asked the replay to stop ([`replay_until_stopped`]) before it ended.
    Stopped { at_s: f64 },
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayError::Config(m) => write!(f, "{m}"),
            ReplayError::Job { line, message } => write!(f, "line {line}: {message}"),
            ReplayError::Invariant { at_s, message } => {
                write!(f, "engine invariant broken at t={at_s}s: {message}")
            }
            ReplayError::Stalled { at_s, happenings } => write!(
                f,
                "virtual time stalled at t={at_s}s after {happenings} happenings at that \
                 instant; this is a bug in allot's replay — please report it with the trace"
            ),
            ReplayError::Stopped { at_s } => {
                write!(f, "stopped at t={at_s}s, as asked, before the trace ended")
            }
        }
    }
}

impl std::error::Error for ReplayError {}

/// Adds a project with no guarantee for every project a trace names that the policy lacks.
/// Each joins the cohort of the policy's first project that has one (so it can only borrow
/// what the cohort lends) with weight 1; without any cohort in the policy it joins a cohort
/// of its own and can never run, which the replay reports as cancelled jobs. Returns the new
/// policy and the names added, in order of first appearance in the trace.
pub fn add_unlisted_projects(policy: &PolicySpec, jobs: &[TraceJob]) -> (PolicySpec, Vec<String>) {
    let known: BTreeSet<&str> = policy.projects.iter().map(|p| p.name.as_str()).collect();
    let cohort = policy.projects.iter().find_map(|p| p.cohort.clone());
    let mut added: Vec<String> = Vec::new();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    for job in jobs {
        if !known.contains(job.project.as_str()) && seen.insert(job.project.as_str()) {
            added.push(job.project.clone());
        }
    }
    let mut out = policy.clone();
    for name in &added {
        out.projects.push(ProjectSpec {
            name: name.clone(),
            cohort: cohort.clone(),
            department: None,
            quotas: vec![QuotaSpec {
                model: QuotaModel::Any,
                guaranteed: Shares::ZERO,
                borrow_limit: None,
                lend_limit: None,
            }],
            weight_milli: 1000,
            queueing: Queueing::BestEffortFifo,
            preemption_mode: None,
            preempt_within_project: Default::default(),
            borrow_within_cohort: None,
        });
    }
    (out, added)
}

/// What happens next to a job; events carry the run number they belong to, so an event of a
/// run that was pre-empted meanwhile is recognised as stale and dropped. `ReclaimDue`: a
/// queued job's reclaim delay (`preemption.reclaim_after`) ends, so a cycle is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Happening {
    Start { job: usize, run: u32 },
    Checkpoint { job: usize, run: u32 },
    Finish { job: usize, run: u32 },
    Stop { job: usize, run: u32 },
    Arrive { job: usize },
    ReclaimDue { job: usize },
    Decide,
}

impl Happening {
    /// Facts of an instant are applied before arrivals, and both before the cycle.
    fn class(self) -> u8 {
        match self {
            Happening::Arrive { .. } => 1,
            Happening::Decide => 2,
            _ => 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Waiting,
    Queued,
    Holding,
    Finished,
    Cancelled,
}

/// The current allocation of a job.
#[derive(Clone, Copy, Debug)]
struct Run {
    admitted_s: f64,
    started_s: Option<f64>,
    /// Progress when this run started (what the last run left saved).
    base_progress_s: f64,
    /// Progress saved by the latest checkpoint of this run (≥ base).
    checkpoint_progress_s: f64,
    /// After a pre-emption: the admission → start delay is lost, not idle.
    is_restart: bool,
    /// Told to stop; the stop event is pending.
    stopping: Option<PreemptionMode>,
}

#[derive(Clone, Debug)]
struct JobState {
    shares: u64,
    project: usize,
    fate: Fate,
    run_no: u32,
    run: Option<Run>,
    saved_progress_s: f64,
    first_admit_s: Option<f64>,
    finish_s: Option<f64>,
    preemptions: u32,
    activity: JobActivity,
    checkpoint_interval_s: Option<f64>,
    // GPU-seconds (× 1000 shares → GPUs below).
    allocated: f64,
    active: f64,
    useful: f64,
    idle: f64,
    lost: f64,
}

struct Sim<'a> {
    config: &'a ReplayConfig,
    /// Called once per job that arrived (for a progress bar).
    on_arrival: &'a (dyn Fn() + 'a),
    jobs: &'a [TraceJob],
    state: Vec<JobState>,
    by_id: BTreeMap<u64, usize>,
    engine: Engine,
    queue: BinaryHeap<Reverse<(u64, u8, u64, Happening)>>,
    seq: u64,
    /// Jobs that hold GPUs (admitted, not yet finished or stopped).
    holding: BTreeSet<usize>,
    held_shares: u64,
    queued: usize,
    /// Something that may change the cycle's answer happened since the last cycle.
    dirty: bool,
    decide_at_ms: Option<u64>,
    last_decide_ms: Option<u64>,
    /// Cycles run so far at `last_decide_ms`.
    rounds_at_instant: u32,
    decide_calls: u64,
    preemptions: u64,
    timeline: Vec<TimelinePoint>,
    /// Outcomes of the jobs, for a rehearsal's conditions (empty without one).
    outcomes: allot_config::rollout::Outcomes,
    rehearsal: Option<RehearsalState>,
}

/// A rehearsal under way.
struct RehearsalState {
    started: bool,
    next_check_ms: u64,
    report: crate::outcome::RehearsalReport,
    /// Stays with the replay: the policy to go back to.
    active: PolicySpec,
    nodes: Vec<NodeSpec>,
    /// The scope's jobs that arrived and were not admitted yet (`p95_wait` counts their
    /// wait so far, as the daemon does).
    waiting: std::collections::BTreeSet<usize>,
}

/// GPU-seconds as share-milliseconds (the daemon's unit for outcomes).
fn gpu_s_as_share_ms(gpu_s: f64) -> u64 {
    (gpu_s.max(0.0) * (SHARES_PER_GPU * 1000) as f64).round() as u64
}

/// Judged conditions as the report shows them.
fn rehearsed(judged: &[allot_config::rollout::Judged]) -> Vec<crate::outcome::RehearsedCondition> {
    judged
        .iter()
        .map(|j| crate::outcome::RehearsedCondition {
            condition: j.condition.text(),
            baseline: j.baseline,
            baseline_samples: j.baseline_samples,
            current: j.current,
            samples: j.samples,
            state: match &j.verdict {
                Ok(true) => "tripped".into(),
                Ok(false) => "ok".into(),
                Err(why) => format!("not judged: {why}"),
            },
        })
        .collect()
}

pub(crate) fn ms(s: f64) -> u64 {
    (s.max(0.0) * 1000.0).round() as u64
}

pub(crate) fn secs(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

/// Replays `jobs` on `nodes` under `policy` (which must name every project the jobs use; see
/// [`add_unlisted_projects`]). `label` names the policy in the report. Deterministic: the same
/// inputs and `config` give the same report, `wall_ms` left 0 for the caller to fill.
pub fn replay(
    nodes: &[NodeSpec],
    policy: &PolicySpec,
    label: &str,
    jobs: &[TraceJob],
    config: &ReplayConfig,
) -> Result<ReplayReport, ReplayError> {
    replay_with_progress(nodes, policy, label, jobs, config, &|| {})
}

/// [`replay`], calling `on_arrival` as each job arrives in virtual time (for a progress bar;
/// arrivals are spread over the whole run, finishes bunch at its end).
pub fn replay_with_progress(
    nodes: &[NodeSpec],
    policy: &PolicySpec,
    label: &str,
    jobs: &[TraceJob],
    config: &ReplayConfig,
    on_arrival: &dyn Fn(),
) -> Result<ReplayReport, ReplayError> {
    replay_inner(nodes, policy, label, jobs, config, on_arrival, None)
}

/// [`replay`] that ends early with [`ReplayError::Stopped`] once `stop` is set (checked
/// before every happening): for replays a user may give up on, such as the dashboard's
/// what-if when a newer candidate replaces it.
pub fn replay_until_stopped(
    nodes: &[NodeSpec],
    policy: &PolicySpec,
    label: &str,
    jobs: &[TraceJob],
    config: &ReplayConfig,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<ReplayReport, ReplayError> {
    replay_inner(nodes, policy, label, jobs, config, &|| {}, Some(stop))
}

fn replay_inner(
    nodes: &[NodeSpec],
    policy: &PolicySpec,
    label: &str,
    jobs: &[TraceJob],
    config: &ReplayConfig,
    on_arrival: &dyn Fn(),
    stop: Option<&std::sync::atomic::AtomicBool>,
) -> Result<ReplayReport, ReplayError> {
    let engine = Engine::new(nodes, policy).map_err(|e| ReplayError::Config(e.to_string()))?;
    let capacity_shares: u64 =
        nodes.iter().map(|n| n.devices.len() as u64).sum::<u64>() * SHARES_PER_GPU;
    let project_of: BTreeMap<&str, usize> =
        policy.projects.iter().enumerate().map(|(i, p)| (p.name.as_str(), i)).collect();

    let mut state = Vec::with_capacity(jobs.len());
    let mut by_id = BTreeMap::new();
    for (i, job) in jobs.iter().enumerate() {
        if by_id.insert(job.id, i).is_some() {
            return Err(ReplayError::Job {
                line: job.line,
                message: format!("job id {} appears twice", job.id),
            });
        }
        let shares = job.total_shares();
        let kind =
            job.kind.unwrap_or_else(|| assign_kind(config.seed, job.id, shares, job.duration_s));
        let checkpoint_interval_s = job.checkpoint_interval_s.or(match kind {
            WorkloadKind::Training | WorkloadKind::Batch => config.default_checkpoint_interval_s,
            _ => None,
        });
        state.push(JobState {
            shares,
            // Jobs of a project the policy lacks are rejected by the engine (UnknownProject).
            project: project_of.get(job.project.as_str()).copied().unwrap_or(usize::MAX),
            fate: Fate::Waiting,
            run_no: 0,
            run: None,
            saved_progress_s: 0.0,
            first_admit_s: None,
            finish_s: None,
            preemptions: 0,
            activity: JobActivity::new(&config.activity, config.seed, job.id, kind, job.duration_s),
            checkpoint_interval_s: checkpoint_interval_s.filter(|&i| i > 0.0),
            allocated: 0.0,
            active: 0.0,
            useful: 0.0,
            idle: 0.0,
            lost: 0.0,
        });
    }

    let mut sim = Sim {
        config,
        on_arrival,
        jobs,
        state,
        by_id,
        engine,
        queue: BinaryHeap::new(),
        seq: 0,
        holding: BTreeSet::new(),
        held_shares: 0,
        queued: 0,
        dirty: false,
        decide_at_ms: None,
        last_decide_ms: None,
        rounds_at_instant: 0,
        decide_calls: 0,
        preemptions: 0,
        timeline: Vec::new(),
        outcomes: Default::default(),
        rehearsal: config.rehearsal.as_ref().map(|r| RehearsalState {
            started: false,
            next_check_ms: ms(r.at_s),
            report: crate::outcome::RehearsalReport {
                scope: r.scope.to_string(),
                started_s: r.at_s,
                ..Default::default()
            },
            active: policy.clone(),
            nodes: nodes.to_vec(),
            waiting: Default::default(),
        }),
    };
    for (i, job) in jobs.iter().enumerate() {
        sim.push(ms(job.submit_s), Happening::Arrive { job: i });
    }

    let step_ms = timeline_step_ms(jobs, config);
    let until_ms = config.until_s.map(ms);
    let mut next_sample_ms = 0u64;
    let mut end_ms = 0u64;
    // Every job can arrive, start, checkpoint, stop, finish and be decided on at one instant
    // a few times over; far more than that at one millisecond means time no longer moves.
    let stall_limit = 64 * jobs.len() as u64 + 10_000;
    let mut at_instant = 0u64;

    while let Some(&Reverse((t, _, _, _))) = sim.queue.peek() {
        if until_ms.is_some_and(|u| t > u) {
            break;
        }
        // The state is constant between instants: sample it for every point before `t`.
        while next_sample_ms < t && sim.timeline.len() < TIMELINE_POINTS_MAX {
            sim.sample(next_sample_ms);
            next_sample_ms += step_ms;
        }
        let Some(Reverse((t, _, _, happening))) = sim.queue.pop() else { break };
        if stop.is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed)) {
            return Err(ReplayError::Stopped { at_s: secs(t) });
        }
        at_instant = if t == end_ms { at_instant + 1 } else { 1 };
        if at_instant > stall_limit {
            return Err(ReplayError::Stalled { at_s: secs(t), happenings: at_instant });
        }
        end_ms = t;
        sim.rehearse(t)?;
        sim.handle(t, happening)?;
        if sim.dirty && sim.queued > 0 && sim.decide_at_ms.is_none() {
            sim.schedule_decide(t);
        }
    }
    let end_ms = until_ms.unwrap_or(end_ms);
    while next_sample_ms <= end_ms && sim.timeline.len() < TIMELINE_POINTS_MAX {
        sim.sample(next_sample_ms);
        next_sample_ms += step_ms;
    }
    sim.close_open_runs(secs(end_ms));
    sim.finish_rehearsal(end_ms);
    Ok(sim.report(label, capacity_shares, secs(end_ms)))
}

impl Sim<'_> {
    /// Notes what happened to `job` for a rehearsal's conditions.
    fn outcome(&mut self, t_ms: u64, job: usize, fact: allot_config::rollout::Fact) {
        if self.rehearsal.is_none() {
            return;
        }
        let j = &self.jobs[job];
        self.outcomes.push(allot_config::rollout::Outcome {
            at_ms: t_ms,
            project: j.project.clone(),
            kind: self.state[job].activity.kind(),
            models: j.gpu_models.clone(),
            fact,
        });
    }

    /// A job of the rehearsal's scope starts (`true`: it arrived) or stops (admitted or
    /// rejected) waiting for its first admission.
    fn rehearsal_waits(&mut self, job: usize, waits: bool) {
        let (Some(plan), Some(state)) = (self.config.rehearsal.as_ref(), self.rehearsal.as_mut())
        else {
            return;
        };
        let j = &self.jobs[job];
        if !waits {
            state.waiting.remove(&job);
        } else if plan.scope.covers(&j.project, self.state[job].activity.kind(), &j.gpu_models) {
            state.waiting.insert(job);
        }
    }

    /// The rehearsal at `t_ms`: the scoped policy takes over at its time; its conditions are
    /// judged on the replay's outcomes; a tripped one brings the active policy back.
    fn rehearse(&mut self, t_ms: u64) -> Result<(), ReplayError> {
        let Some(plan) = self.config.rehearsal.as_ref() else { return Ok(()) };
        let Some(state) = self.rehearsal.as_mut() else { return Ok(()) };
        if state.report.rolled_back_s.is_some() || t_ms < state.next_check_ms {
            return Ok(());
        }
        if !state.started {
            state.started = true;
            state.report.started_s = secs(t_ms);
            self.engine = self
                .engine
                .with_policy(&state.nodes, &plan.policy)
                .map_err(|e| ReplayError::Config(format!("the rehearsed rollout: {e}")))?;
            self.dirty = true;
        } else {
            let started_ms = ms(state.report.started_s);
            let waiting: Vec<u64> =
                state.waiting.iter().map(|j| ms(self.jobs[*j].submit_s)).collect();
            let judged = plan.rules.judge(&plan.scope, &self.outcomes, &waiting, started_ms, t_ms);
            if let Some(why) = allot_config::rollout::RollbackRules::tripped(&judged, &plan.scope) {
                state.report.rolled_back_s = Some(secs(t_ms));
                state.report.why = Some(why);
                state.report.conditions = rehearsed(&judged);
                self.engine = self
                    .engine
                    .with_policy(&state.nodes, &state.active)
                    .map_err(|e| ReplayError::Config(format!("rolling the rehearsal back: {e}")))?;
                self.dirty = true;
                return Ok(());
            }
        }
        state.next_check_ms = t_ms + ms(plan.check_every_s.max(1.0));
        Ok(())
    }

    /// The conditions' figures at the end, for a rehearsal that did not roll back.
    fn finish_rehearsal(&mut self, end_ms: u64) {
        let Some(plan) = self.config.rehearsal.as_ref() else { return };
        let Some(state) = self.rehearsal.as_mut() else { return };
        if state.started && state.report.rolled_back_s.is_none() {
            let started_ms = ms(state.report.started_s);
            let waiting: Vec<u64> =
                state.waiting.iter().map(|j| ms(self.jobs[*j].submit_s)).collect();
            state.report.conditions = rehearsed(&plan.rules.judge(
                &plan.scope,
                &self.outcomes,
                &waiting,
                started_ms,
                end_ms,
            ));
        }
    }

    fn push(&mut self, t_ms: u64, h: Happening) {
        self.seq += 1;
        self.queue.push(Reverse((t_ms, h.class(), self.seq, h)));
    }

    /// The next cycle: on the cadence grid, at least one cadence after the previous cycle.
    /// Per instant (cadence 0), a cycle may run again at the same instant — a victim stopped
    /// without grace frees its GPUs at once — up to `ROUNDS_PER_INSTANT_MAX` times, then the
    /// next one waits a millisecond so that virtual time always moves on.
    fn schedule_decide(&mut self, now_ms: u64) {
        let every = ms(self.config.decide_every_s);
        let mut at = if every == 0 || !self.config.decide_on_grid {
            now_ms
        } else {
            now_ms.div_ceil(every) * every
        };
        if let Some(last) = self.last_decide_ms {
            let again =
                every == 0 && last == now_ms && self.rounds_at_instant < ROUNDS_PER_INSTANT_MAX;
            if !again {
                at = at.max(last + every.max(1));
            }
        }
        self.decide_at_ms = Some(at);
        self.push(at, Happening::Decide);
    }

    fn handle(&mut self, t_ms: u64, h: Happening) -> Result<(), ReplayError> {
        let now = Timestamp(t_ms);
        let t = secs(t_ms);
        match h {
            Happening::Arrive { job } => {
                (self.on_arrival)();
                let spec = self.spec(job);
                self.engine.apply(now, Event::WorkloadSubmitted(spec));
                self.state[job].fate = Fate::Queued;
                self.rehearsal_waits(job, true);
                self.queued += 1;
                self.dirty = true;
                let delay = self.engine.reclaim_after_ms();
                if delay > 0 {
                    self.push(t_ms.saturating_add(delay), Happening::ReclaimDue { job });
                }
            }
            Happening::ReclaimDue { job } => {
                if self.state[job].fate == Fate::Queued {
                    self.dirty = true;
                }
            }
            Happening::Decide => {
                self.decide_at_ms = None;
                if self.last_decide_ms == Some(t_ms) {
                    self.rounds_at_instant += 1;
                } else {
                    self.rounds_at_instant = 1;
                }
                self.last_decide_ms = Some(t_ms);
                self.dirty = false;
                self.decide_calls += 1;
                // The replay acts on a deferral's kind alone (`on_decision`): figures that
                // move are not news to it.
                let decisions = self.engine.decide_news(now, Refresh::KINDS_ONLY);
                if self.config.audit {
                    self.engine
                        .audit()
                        .map_err(|message| ReplayError::Invariant { at_s: t, message })?;
                }
                for d in decisions {
                    self.on_decision(t_ms, d);
                }
            }
            Happening::Start { job, run } => {
                if self.state[job].run_no == run
                    && let Some(r) = self.state[job].run.as_mut()
                    && r.started_s.is_none()
                {
                    r.started_s = Some(t);
                    self.engine.apply(now, Event::AllocationStarted { workload: self.wid(job) });
                    self.on_start(job, t_ms);
                }
            }
            Happening::Checkpoint { job, run } => {
                let s = &mut self.state[job];
                if s.run_no == run
                    && let Some(r) = s.run.as_mut()
                    && let Some(started) = r.started_s
                {
                    let progress = r.base_progress_s + (t - started);
                    r.checkpoint_progress_s = progress;
                    self.engine.apply(now, Event::CheckpointSaved { workload: self.wid(job) });
                    self.push_next_checkpoint(job, t_ms, progress);
                }
            }
            Happening::Finish { job, run } => {
                if self.state[job].run_no == run && self.state[job].run.is_some() {
                    let duration = self.jobs[job].duration_s;
                    self.close_run(job, t, Some(duration));
                    let s = &mut self.state[job];
                    s.saved_progress_s = duration;
                    s.fate = Fate::Finished;
                    s.finish_s = Some(t);
                    s.run_no += 1;
                    let share_ms = gpu_s_as_share_ms(s.allocated);
                    self.engine.apply(now, Event::WorkloadFinished { workload: self.wid(job) });
                    self.dirty = true;
                    let finished =
                        allot_config::rollout::Fact::Finished { failed: false, share_ms };
                    self.outcome(t_ms, job, finished);
                }
            }
            Happening::Stop { job, run } => {
                if self.state[job].run_no == run
                    && let Some(r) = self.state[job].run
                {
                    let lost_before = self.state[job].lost;
                    self.stop(job, t, r.stopping);
                    let lost = gpu_s_as_share_ms(self.state[job].lost - lost_before);
                    if lost > 0 {
                        self.outcome(
                            t_ms,
                            job,
                            allot_config::rollout::Fact::Lost { share_ms: lost },
                        );
                    }
                    self.engine.apply(now, Event::WorkloadStopped { workload: self.wid(job) });
                    self.dirty = true;
                }
            }
        }
        Ok(())
    }

    fn wid(&self, job: usize) -> WorkloadId {
        WorkloadId(self.jobs[job].id)
    }

    fn spec(&self, job: usize) -> WorkloadSpec {
        let j = &self.jobs[job];
        let s = &self.state[job];
        WorkloadSpec {
            id: WorkloadId(j.id),
            name: j.name.clone(),
            kind: s.activity.kind(),
            project: j.project.clone(),
            user: String::new(),
            priority_class: j.priority_class.clone(),
            members: j.members,
            gpus_per_member: if j.gpu_milli < 1000 {
                GpuRequest::Shares(j.gpu_milli)
            } else {
                GpuRequest::Whole(j.gpus)
            },
            gpu_models: j.gpu_models.clone(),
            cpu_millis_per_member: j.cpu_milli,
            memory_mib_per_member: j.memory_mib,
            same_node: false,
            prefer_same_node: false,
            preemptible: None,
            checkpointing: s.checkpoint_interval_s.map(|_| Checkpointing {
                grace_ms: ms(self.config.checkpoint_grace_s),
                last_checkpoint_at: None,
            }),
            min_runtime_ms: 0,
            max_runtime_ms: self.config.time_limits.then(|| time_limit_ms(j.duration_s)),
            deadline: None,
        }
    }

    fn on_decision(&mut self, t_ms: u64, decision: Decision) {
        let t = secs(t_ms);
        let Some(&job) = self.by_id.get(&decision.workload().0) else { return };
        match decision {
            Decision::Admit { .. } => {
                let s = &mut self.state[job];
                let is_restart = s.preemptions > 0;
                s.run_no += 1;
                s.fate = Fate::Holding;
                let first = s.first_admit_s.is_none();
                s.first_admit_s.get_or_insert(t);
                s.run = Some(Run {
                    admitted_s: t,
                    started_s: None,
                    base_progress_s: s.saved_progress_s,
                    checkpoint_progress_s: s.saved_progress_s,
                    is_restart,
                    stopping: None,
                });
                let run = s.run_no;
                let shares = s.shares;
                self.queued = self.queued.saturating_sub(1);
                self.holding.insert(job);
                self.held_shares += shares;
                let delay = if is_restart {
                    self.config.restart_delay_s
                } else {
                    self.config.launch_delay_s
                };
                self.push(t_ms + ms(delay), Happening::Start { job, run });
                if first {
                    let wait_ms = t_ms.saturating_sub(ms(self.jobs[job].submit_s));
                    self.outcome(t_ms, job, allot_config::rollout::Fact::Admitted { wait_ms });
                    self.rehearsal_waits(job, false);
                }
            }
            Decision::Warn { .. } => {}
            Decision::Preempt { mode, checkpoint_grace_ms, .. }
            | Decision::Reclaim { mode, checkpoint_grace_ms, .. } => {
                self.preemptions += 1;
                if matches!(
                    decision,
                    Decision::Reclaim { .. }
                        | Decision::Preempt { reason: allot_core::PreemptReason::Idle { .. }, .. }
                ) {
                    self.outcome(t_ms, job, allot_config::rollout::Fact::IdleReclaimed);
                }
                let s = &mut self.state[job];
                if let Some(r) = s.run.as_mut() {
                    r.stopping = Some(mode);
                    let run = s.run_no;
                    self.push(
                        t_ms + checkpoint_grace_ms.unwrap_or(0),
                        Happening::Stop { job, run },
                    );
                }
            }
            Decision::Stop { .. } => {
                // Cancellation or max runtime: the engine removes the job when it stops.
                let s = &mut self.state[job];
                if let Some(r) = s.run.as_mut() {
                    r.stopping = Some(PreemptionMode::Delete);
                    let run = s.run_no;
                    self.push(t_ms, Happening::Stop { job, run });
                }
            }
            Decision::Reject { .. } => {
                self.cancel_queued(job);
            }
            Decision::Defer { reason, .. } => {
                // Reasons that no amount of waiting changes: cancel, as a real user would
                // have to, rather than leave the job queued forever.
                if matches!(
                    reason,
                    DeferReason::NeverPlaceable { .. }
                        | DeferReason::ExceedsMaxQuota { .. }
                        | DeferReason::NoQuotaForModel { .. }
                ) {
                    self.engine.apply(
                        Timestamp(t_ms),
                        Event::WorkloadCancelled { workload: self.wid(job) },
                    );
                    self.cancel_queued(job);
                }
            }
        }
    }

    fn cancel_queued(&mut self, job: usize) {
        if self.state[job].fate == Fate::Queued {
            self.state[job].fate = Fate::Cancelled;
            self.queued = self.queued.saturating_sub(1);
            self.rehearsal_waits(job, false);
        }
    }

    /// A run has started: its exit is due once the remaining work is done.
    fn on_start(&mut self, job: usize, t_ms: u64) {
        let s = &self.state[job];
        let Some(r) = s.run else { return };
        let run = s.run_no;
        let remaining = (self.jobs[job].duration_s - r.base_progress_s).max(0.0);
        self.push(t_ms + ms(remaining), Happening::Finish { job, run });
        self.push_next_checkpoint(job, t_ms, r.base_progress_s);
    }

    /// Schedules the run's next periodic checkpoint, if the job checkpoints and it comes
    /// before the job's end. Checkpoints fall at multiples of the interval of progress.
    fn push_next_checkpoint(&mut self, job: usize, t_ms: u64, progress_s: f64) {
        let s = &self.state[job];
        let Some(interval) = s.checkpoint_interval_s else { return };
        let run = s.run_no;
        let mut next = ((progress_s / interval).floor() + 1.0) * interval;
        // Progress is measured in whole milliseconds, so at a checkpoint it may sit a hair
        // below the multiple it stands on; that multiple is this checkpoint, not the next
        // (rescheduling it at the same millisecond would never let time move on).
        if ms(next - progress_s) == 0 {
            next += interval;
        }
        if next < self.jobs[job].duration_s {
            self.push(t_ms + ms(next - progress_s), Happening::Checkpoint { job, run });
        }
    }

    /// Books a run that ends at `t`, keeping progress up to `kept_progress_s` (`None`: up to
    /// the last checkpoint of this run). Returns the progress kept.
    fn close_run(&mut self, job: usize, t: f64, kept_progress_s: Option<f64>) -> f64 {
        let params = &self.config.activity;
        let s = &mut self.state[job];
        let Some(r) = s.run.take() else { return s.saved_progress_s };
        self.holding.remove(&job);
        self.held_shares = self.held_shares.saturating_sub(s.shares);
        let gpus = s.shares as f64 / SHARES_PER_GPU as f64;
        let started = r.started_s.unwrap_or(t).min(t);
        let delay = (started - r.admitted_s).max(0.0);
        let ran = (t - started).max(0.0);
        let reached = r.base_progress_s + ran;
        let kept =
            kept_progress_s.unwrap_or(r.checkpoint_progress_s).clamp(r.base_progress_s, reached);
        // Within the clock's millisecond of the end of the run is the end of the run: a job
        // that finished keeps all of it, not all but a float residue booked as lost.
        let kept = if reached - kept < 0.000_5 { reached } else { kept };
        let kept_len = kept - r.base_progress_s;
        s.allocated += gpus * (delay + ran);
        if r.is_restart {
            s.lost += gpus * delay;
        } else {
            s.idle += gpus * delay;
        }
        let active_kept = s.activity.integral(params, r.base_progress_s, started, kept_len);
        let active_lost = s.activity.integral(params, kept, started + kept_len, ran - kept_len);
        s.useful += gpus * active_kept;
        s.idle += gpus * (kept_len - active_kept);
        s.lost += gpus * (ran - kept_len);
        s.active += gpus * (active_kept + active_lost);
        kept
    }

    /// A pre-empted (or cancelled) job stops at `t`.
    fn stop(&mut self, job: usize, t: f64, mode: Option<PreemptionMode>) {
        let mode = mode.unwrap_or(PreemptionMode::Suspend);
        let checkpointable = self.state[job].checkpoint_interval_s.is_some();
        let kept = match mode {
            PreemptionMode::Suspend if checkpointable => self.close_run(job, t, None),
            // Nothing saved: the job resumes from what earlier runs saved (for a job that
            // never checkpoints, nothing).
            PreemptionMode::Suspend => {
                let base = self.state[job].run.map_or(0.0, |r| r.base_progress_s);
                self.close_run(job, t, Some(base))
            }
            PreemptionMode::Requeue | PreemptionMode::Delete => {
                self.close_run(job, t, None);
                // Everything ever kept is thrown away: it moves from useful/idle to lost.
                let s = &mut self.state[job];
                s.lost += s.useful + s.idle;
                s.useful = 0.0;
                s.idle = 0.0;
                0.0
            }
        };
        let s = &mut self.state[job];
        s.saved_progress_s = kept;
        s.run_no += 1;
        s.preemptions += 1;
        if mode == PreemptionMode::Delete {
            s.fate = Fate::Cancelled;
        } else {
            s.fate = Fate::Queued;
            self.queued += 1;
        }
    }

    /// At the end of the replay (`--until`), runs still open are booked up to `end_s` as if
    /// they stopped there keeping their progress: their future is unknown, not lost.
    fn close_open_runs(&mut self, end_s: f64) {
        for job in self.holding.clone() {
            let reached = self.state[job].run.map_or(0.0, |r| {
                r.base_progress_s + r.started_s.map_or(0.0, |st| (end_s - st).max(0.0))
            });
            self.close_run(job, end_s, Some(reached));
        }
    }

    fn sample(&mut self, t_ms: u64) {
        let t = secs(t_ms);
        let params = &self.config.activity;
        let mut active = 0.0;
        for &job in &self.holding {
            let s = &self.state[job];
            if let Some(r) = s.run
                && let Some(started) = r.started_s
                && started <= t
            {
                let progress = r.base_progress_s + (t - started);
                active +=
                    s.shares as f64 / SHARES_PER_GPU as f64 * s.activity.at(params, progress, t);
            }
        }
        self.timeline.push(TimelinePoint {
            t_s: t,
            allocated_gpus: self.held_shares as f64 / SHARES_PER_GPU as f64,
            active_gpus: active,
            pending_jobs: self.queued,
        });
    }

    fn report(mut self, label: &str, capacity_shares: u64, end_s: f64) -> ReplayReport {
        let names: Vec<String> = (0..self.engine.project_count())
            .map(|p| self.engine.project_name(allot_core::ProjectId(p as u32)).to_owned())
            .collect();
        let books = self.state.iter().map(|s| JobBook {
            project: s.project,
            outcome: match s.fate {
                Fate::Finished => BookedFate::Finished,
                Fate::Cancelled => BookedFate::Cancelled,
                Fate::Waiting | Fate::Queued | Fate::Holding => BookedFate::Pending,
            },
            first_admit_s: s.first_admit_s,
            finish_s: s.finish_s,
            preemptions: s.preemptions,
            allocated: s.allocated,
            active: s.active,
            useful: s.useful,
            idle: s.idle,
            lost: s.lost,
        });
        let run = RunTotals {
            label,
            seed: self.config.seed,
            jobs: self.jobs,
            projects: names,
            capacity_shares,
            end_s,
            preemptions: self.preemptions,
            decide_calls: self.decide_calls,
            timeline: std::mem::take(&mut self.timeline),
        };
        let mut report = build_report(run, books);
        report.rehearsal = self.rehearsal.take().map(|r| r.report);
        report
    }
}

/// How a job's replay ended, for the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BookedFate {
    Finished,
    Cancelled,
    /// Queued or running when the replay stopped.
    Pending,
}

/// One job's books at the end of a replay (GPU-seconds), whatever scheduler ran it: the
/// engine's replay and the Slurm baseline (`crate::slurm`) report through the same code.
#[derive(Clone, Copy, Debug)]
pub(crate) struct JobBook {
    /// Index into `RunTotals::projects`; out of range: counted in no project's ledger.
    pub project: usize,
    pub outcome: BookedFate,
    pub first_admit_s: Option<f64>,
    pub finish_s: Option<f64>,
    pub preemptions: u32,
    pub allocated: f64,
    pub active: f64,
    pub useful: f64,
    pub idle: f64,
    pub lost: f64,
}

/// The run-wide figures a report needs besides the jobs' books.
pub(crate) struct RunTotals<'a> {
    pub label: &'a str,
    pub seed: u64,
    pub jobs: &'a [TraceJob],
    pub projects: Vec<String>,
    pub capacity_shares: u64,
    pub end_s: f64,
    pub preemptions: u64,
    pub decide_calls: u64,
    pub timeline: Vec<TimelinePoint>,
}

/// The report of a replay from each job's books (in the order of `run.jobs`).
pub(crate) fn build_report(
    run: RunTotals<'_>,
    books: impl Iterator<Item = JobBook>,
) -> ReplayReport {
    let hours = |gpu_s: f64| gpu_s / 3600.0;
    let end_s = run.end_s;
    let mut projects: Vec<ProjectLedger> = run
        .projects
        .iter()
        .map(|name| ProjectLedger { project: name.clone(), ..ProjectLedger::default() })
        .collect();
    let (mut allocated, mut active, mut useful, mut idle, mut lost) = (0.0, 0.0, 0.0, 0.0, 0.0);
    let (mut finished, mut cancelled, mut pending) = (0usize, 0usize, 0usize);
    let mut jct_sum = 0.0;
    let mut delays: Vec<f64> = Vec::new();
    let (mut big_jobs, mut big_delays) = (0usize, Vec::new());
    let mut by_job = BTreeMap::new();
    let (mut jobs_preempted, mut preemptions_per_job_max) = (0usize, 0u32);
    for (job, s) in run.jobs.iter().zip(books) {
        jobs_preempted += usize::from(s.preemptions > 0);
        preemptions_per_job_max = preemptions_per_job_max.max(s.preemptions);
        allocated += s.allocated;
        active += s.active;
        useful += s.useful;
        idle += s.idle;
        lost += s.lost;
        // Times in whole milliseconds, as the engine saw them (the submit time is rounded
        // to the engine's clock), so that a delay is never a float residue below zero.
        let submitted_ms = ms(job.submit_s);
        let since_submit = |t: f64| secs(ms(t).saturating_sub(submitted_ms));
        let big = job.gpu_milli >= SHARES_PER_GPU as u32
            && job.gpus.saturating_mul(job.members) >= crate::outcome::BIG_JOB_GPUS;
        big_jobs += usize::from(big);
        if let Some(a) = s.first_admit_s {
            delays.push(since_submit(a));
            if big {
                big_delays.push(since_submit(a));
            }
        }
        by_job.insert(
            job.id,
            crate::outcome::JobOutcome {
                first_wait_s: s.first_admit_s.map(since_submit),
                allocated_gpu_hours: hours(s.allocated),
                preemptions: s.preemptions,
            },
        );
        match s.outcome {
            BookedFate::Finished => {
                finished += 1;
                jct_sum += since_submit(s.finish_s.unwrap_or(end_s));
            }
            BookedFate::Cancelled => cancelled += 1,
            BookedFate::Pending => pending += 1,
        }
        if let Some(p) = projects.get_mut(s.project) {
            p.jobs_total += 1;
            p.allocated_gpu_hours += hours(s.allocated);
            p.active_gpu_hours += hours(s.active);
            p.useful_gpu_hours += hours(s.useful);
            p.idle_gpu_hours += hours(s.idle);
            p.lost_gpu_hours += hours(s.lost);
            p.preemptions += u64::from(s.preemptions);
            p.jobs_finished += usize::from(s.outcome == BookedFate::Finished);
        }
    }
    delays.sort_by(f64::total_cmp);
    big_delays.sort_by(f64::total_cmp);
    let capacity_gpu_s = run.capacity_shares as f64 / SHARES_PER_GPU as f64 * end_s;
    let pct = |gpu_s: f64| if capacity_gpu_s > 0.0 { 100.0 * gpu_s / capacity_gpu_s } else { 0.0 };
    ReplayReport {
        policy: run.label.to_owned(),
        seed: run.seed,
        jobs_total: run.jobs.len(),
        jobs_finished: finished,
        jobs_pending: pending,
        jobs_cancelled: cancelled,
        jct_s_mean: if finished > 0 { jct_sum / finished as f64 } else { 0.0 },
        queue_delay_s_p50: percentile(&delays, 50.0),
        queue_delay_s_p95: percentile(&delays, 95.0),
        queue_delay_s_p99: percentile(&delays, 99.0),
        big_jobs,
        big_queue_delay_s_mean: if big_delays.is_empty() {
            0.0
        } else {
            big_delays.iter().sum::<f64>() / big_delays.len() as f64
        },
        big_queue_delay_s_p50: percentile(&big_delays, 50.0),
        big_queue_delay_s_p95: percentile(&big_delays, 95.0),
        big_queue_delay_s_max: big_delays.last().copied().unwrap_or(0.0),
        gpu_allocated_pct: pct(allocated),
        gpu_active_pct: pct(active),
        preemptions: run.preemptions,
        jobs_preempted,
        preemptions_per_job_max,
        lost_gpu_hours: hours(lost),
        goodput: if allocated > 0.0 { useful / allocated } else { 0.0 },
        wall_ms: 0,
        timeline: run.timeline,
        queue_delays_s: delays,
        projects,
        capacity_gpus: run.capacity_shares as f64 / SHARES_PER_GPU as f64,
        span_s: end_s,
        allocated_gpu_hours: hours(allocated),
        active_gpu_hours: hours(active),
        useful_gpu_hours: hours(useful),
        idle_gpu_hours: hours(idle),
        decide_calls: run.decide_calls,
        bad_rows_skipped: 0,
        rehearsal: None,
        by_job,
    }
}

/// The timeline's step, ms: as configured, grown so that the expected span fits the cap.
pub(crate) fn timeline_step_ms(jobs: &[TraceJob], config: &ReplayConfig) -> u64 {
    let horizon_s = jobs.iter().map(|j| j.submit_s + j.duration_s).fold(0.0, f64::max);
    // (An estimate: queueing can stretch the real span; the cap then ends the timeline early.)
    let horizon_s = config.until_s.unwrap_or(horizon_s);
    ms(config.timeline_step_s.max(1.0).max(horizon_s / TIMELINE_POINTS_MAX as f64).ceil())
}

/// The time limit a Slurm user gives a job of this duration, ms: the duration rounded up to
/// whole minutes, plus one minute (`ReplayConfig::time_limits`, the Slurm baseline).
pub fn time_limit_ms(duration_s: f64) -> u64 {
    ((duration_s.max(0.0) / 60.0).ceil() as u64 + 1) * 60_000
}

/// Nearest-rank percentile of ascending values; 0 for none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
