//! Whole-system deterministic simulation, in the spirit of TigerBeetle's VOPR and
//! FoundationDB's simulation tests: the daemon's very state machine (`machine/`) with its
//! real log (`durable.rs`: SQLite in a temporary directory), the real start sequence
//! (`boot.rs`) and the real executor (`executor.rs`) over the fake backend behind the
//! `Backend` trait, driven by a seeded scheduler on a virtual clock.
//!
//! Each step the scheduler picks what happens: API traffic (valid and invalid submissions,
//! submissions a member may not make, cancel, suspend, resume, checkpoints, policy applies
//! that are accepted or refused, queries), the world (runs ending, failing, vanishing;
//! launches refused or lost; the controller unreachable for a while; polls failing; nodes going
//! down, drained and back; the inventory changing; foreign work appearing), telemetry
//! (readings, gaps, unknown devices, sentinel-like empty samples, stale samples), probe
//! files, crashes (between steps, or in the middle of one: memory ahead of the log) and
//! clock jumps (forward and backward on the wall clock the daemon reads). After every step
//! it checks the invariants (`World::check`); after a crash, that the daemon rebuilt from
//! the log equals the one that crashed. A liveness phase at the end, with every fault off,
//! checks that nothing stays stuck starting or stopping. A failing seed prints the command
//! that replays it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::RwLock;

use allot_api::{Role, SubmitRequest, WorkloadState};
use allot_backend::{FakeBackend, FakeControl, ForeignWork, MemberLaunch, RunId};
use allot_core::ledger::{Books, Scope};
use allot_core::{DeviceSpec, NodeSpec, Stage, WorkloadId};
use allot_sim::rng::SimRng;
use allot_store::SqliteStore;
use allot_telemetry::{DeviceIdentity, Sample, Vendor};

use crate::ask::{Action, Answer, Ask};
use crate::auth::Principal;
use crate::boot::{self, BootConfig};
use crate::durable::Durable;
use crate::executor::Executor;
use crate::machine::{Cadence, FileTimes, Input, Ticket};
use crate::metrics::Metrics;
use crate::view::View;

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    /// Steps with faults; the liveness phase follows.
    pub steps: u64,
    /// Where the data directory goes (`None`: `/dev/shm` if there is one, else the system's
    /// temporary directory). It is removed at the end.
    pub dir: Option<PathBuf>,
}

/// What a seed did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimReport {
    pub seed: u64,
    /// Steps run, the liveness phase included.
    pub steps: u64,
    /// Faults and happenings injected, by kind.
    pub injected: BTreeMap<String, u64>,
    /// Submissions the daemon acknowledged.
    pub acknowledged: u64,
    /// Log entries made durable.
    pub entries: u64,
    /// Restarts from the log (crashes between and within steps).
    pub recoveries: u64,
}

/// A broken invariant, with what led to it and how to see it again.
#[derive(Clone, Debug)]
pub struct Violation {
    pub seed: u64,
    pub steps: u64,
    pub step: u64,
    pub message: String,
    /// The last happenings before it, oldest first.
    pub trace: Vec<String>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "SEED={} step {}: {}", self.seed, self.step, self.message)?;
        writeln!(f, "last happenings:")?;
        for t in &self.trace {
            writeln!(f, "  {t}")?;
        }
        write!(
            f,
            "replay: ALLOT_SIM_SEED={} ALLOT_SIM_STEPS={} cargo test -p allot-server --test \
             simulation -- one_seed --nocapture",
            self.seed, self.steps
        )
    }
}

impl std::error::Error for Violation {}

/// Turns the daemon's log lines off for the rest of the process: thousands of seeds' restarts
/// and injected faults would bury the figures (replay one seed without it to read them).
pub fn mute_daemon_log() {
    crate::os::mute_log();
}

/// Runs one seed to its end, or to the first broken invariant.
pub fn run(config: &SimConfig) -> Result<SimReport, Violation> {
    let mut world = World::new(config)?;
    let result = world.run();
    let _ = std::fs::remove_dir_all(&world.dir);
    result.map(|()| world.report)
}

/// The policy of every seed: three projects in a cohort (one with a guarantee beyond its
/// share), priorities, suspend pre-emption, and an idle rule that reclaims notebooks fast so
/// that telemetry and probes matter.
const POLICY: &str = "\
priority_classes:
  - {name: low, value: -10, preemptible: true}
  - {name: normal, value: 0, preemptible: true}
  - {name: high, value: 10, preemptible: true}
default_priority_class: normal
preemption: {mode: suspend}
idle_resume_backoff: 1m
projects:
  - {name: a, cohort: c, quotas: [{model: any, guaranteed: 4}]}
  - {name: b, cohort: c, quotas: [{model: any, guaranteed: 4, borrow_limit: 4}]}
  - {name: solo, quotas: [{model: any, guaranteed: 2}]}
idle:
  - name: notebooks
    kinds: [notebook]
    threshold: 10%
    idle_timer: 2m
    sustain: 0s
    missing_telemetry: hold
    min_runtime: 0s
    policy: always
    action: suspend
    warn_before: 30s
";

/// A policy the live work can always move to (other guarantees; half of them with a
/// claimant's reclaim delayed, `preemption.reclaim_after`; two in three with reservations,
/// half of those holding quota for them).
fn accepted_policy(rng: &mut SimRng) -> String {
    let g = 2 + rng.below(6);
    let policy = POLICY
        .replace("guaranteed: 4}]}\n  - {name: b", &format!("guaranteed: {g}}}]}}\n  - {{name: b"));
    let reclaim = if rng.below(2) == 0 { "" } else { ", reclaim_after: 20s" };
    let reservations = match rng.below(3) {
        0 => "",
        1 => "reservations: {after: 20s}\n",
        _ => "reservations: {after: 20s, hold_quota: true}\n",
    };
    policy.replace(
        "preemption: {mode: suspend}\n",
        &format!("preemption: {{mode: suspend{reclaim}}}\n{reservations}"),
    )
}

/// A policy without project `solo`: refused while `solo` has live work.
fn refused_policy() -> String {
    POLICY.replace("  - {name: solo, quotas: [{model: any, guaranteed: 2}]}\n", "")
}

const MODELS: [&str; 2] = ["A100", "H100"];
const PROJECTS: [&str; 3] = ["a", "b", "solo"];
const KINDS: [&str; 3] = ["batch", "training", "notebook"];
/// Happenings kept for a violation's report (`ALLOT_SIM_TRACE` raises it).
fn trace_max() -> usize {
    std::env::var("ALLOT_SIM_TRACE").ok().and_then(|v| v.parse().ok()).unwrap_or(40)
}
/// Steps of the liveness phase, and its last part without new submissions.
const LIVENESS_STEPS: u64 = 200;
const SETTLE_STEPS: u64 = 80;

fn node(name: &str, gpus: u64, model: &str) -> NodeSpec {
    NodeSpec {
        name: name.to_string(),
        cpu_millis: 64_000,
        memory_mib: 512 * 1024,
        labels: BTreeMap::from([("state".to_string(), "idle".to_string())]),
        pool: None,
        rack: None,
        devices: (0..gpus)
            .map(|_| DeviceSpec { model: model.into(), memory_mib: 81920, island: 0, mig: false })
            .collect(),
    }
}

/// The running daemon: what a crash drops.
struct Daemon {
    durable: Durable,
    executor: Executor,
    view: RwLock<View>,
    metrics: Metrics,
}

struct World {
    seed: u64,
    steps: u64,
    step: u64,
    rng: SimRng,
    dir: PathBuf,
    wall_ms: u64,
    mono_ms: u64,
    control: FakeControl,
    config: BootConfig,
    daemon: Option<Daemon>,
    /// Inputs the executor produced, for the next step.
    inputs: Vec<Input>,
    /// What the last start's recovery decided, for the executor's first run.
    recovery_commands: Vec<crate::machine::Command>,
    /// Acknowledged submissions: id → the name submitted.
    acked: BTreeMap<u64, String>,
    /// Asks in flight this step: ticket → what was asked (for the answer).
    asked: BTreeMap<Ticket, String>,
    next_ticket: Ticket,
    next_name: u64,
    next_foreign: u64,
    /// While set, the controller is unreachable.
    unreachable: bool,
    /// The digest of the daemon that crashed, to compare with the one rebuilt.
    crashed: Option<String>,
    trace: VecDeque<String>,
    report: SimReport,
    faults: bool,
}

impl World {
    fn new(config: &SimConfig) -> Result<World, Violation> {
        let rng = SimRng::new(config.seed);
        let base = config.dir.clone().unwrap_or_else(|| {
            let shm = PathBuf::from("/dev/shm");
            if shm.is_dir() { shm } else { std::env::temp_dir() }
        });
        let dir = base.join(format!("allot-sim-{}-{}", std::process::id(), config.seed));
        let _ = std::fs::remove_dir_all(&dir);
        let mut shape = rng.fork(1);
        let nodes: Vec<NodeSpec> = (0..2 + shape.below(3))
            .map(|i| node(&format!("n{i}"), 1 + shape.below(8), MODELS[shape.below(2) as usize]))
            .collect();
        let (_, control) = FakeBackend::new(nodes.clone());
        if shape.below(2) == 0 {
            control.support_requeue();
        }
        let policy = allot_config::parse_policy("policy.yaml", POLICY)
            .map_err(|d| violation(config, 0, format!("the simulation's policy: {d:?}")))?;
        let boot_config = BootConfig {
            declared: nodes,
            inventory_source: "simulated".into(),
            policy,
            policy_source: "policy.yaml".into(),
            policy_text: POLICY.into(),
            workload_dir: dir.clone(),
            cadence: Cadence { decide_interval_ms: 0, telemetry_round_ms: 5_000 },
            snapshot_every: 20 + shape.below(200),
        };
        Ok(World {
            seed: config.seed,
            steps: config.steps,
            step: 0,
            rng,
            dir,
            wall_ms: 1_800_000_000_000,
            mono_ms: 0,
            control,
            config: boot_config,
            daemon: None,
            inputs: Vec::new(),
            recovery_commands: Vec::new(),
            acked: BTreeMap::new(),
            asked: BTreeMap::new(),
            next_ticket: 0,
            next_name: 0,
            next_foreign: 0,
            unreachable: false,
            crashed: None,
            trace: VecDeque::new(),
            report: SimReport { seed: config.seed, ..SimReport::default() },
            faults: true,
        })
    }

    fn violation(&self, message: impl Into<String>) -> Violation {
        Violation {
            seed: self.seed,
            steps: self.steps,
            step: self.step,
            message: message.into(),
            trace: self.trace.iter().cloned().collect(),
        }
    }

    fn note(&mut self, what: impl Into<String>) {
        if self.trace.len() >= trace_max() {
            self.trace.pop_front();
        }
        self.trace.push_back(format!("{} t={}: {}", self.step, self.wall_ms, what.into()));
    }

    fn injected(&mut self, kind: &str) {
        *self.report.injected.entry(kind.to_string()).or_default() += 1;
    }

    fn run(&mut self) -> Result<(), Violation> {
        self.start()?;
        while self.step < self.steps {
            self.step += 1;
            self.turn()?;
        }
        // Liveness: every fault off; runs end; nothing may stay starting or stopping.
        self.faults = false;
        self.control.set_unreachable(None);
        self.unreachable = false;
        for n in self.control.nodes() {
            self.control.set_node_unusable(&n.name, None);
        }
        for _ in 0..LIVENESS_STEPS {
            self.step += 1;
            for r in self.control.runs().into_iter().filter(|r| r.is_running()) {
                self.control.finish(r.launch.run, 0);
            }
            self.turn()?;
        }
        self.report.steps = self.step;
        let daemon = self.daemon.as_ref().map(|d| &d.durable.machine.daemon);
        let stuck: Vec<String> = daemon
            .map(|d| {
                d.workloads
                    .iter()
                    .filter(|(_, r)| {
                        matches!(r.state, WorkloadState::Starting | WorkloadState::Stopping)
                    })
                    .map(|(id, r)| format!("{id} {} ({:?})", r.state.as_str(), r.reason))
                    .collect()
            })
            .unwrap_or_default();
        if let Some(down) = daemon.and_then(|d| d.backend_down.as_ref()) {
            return Err(self.violation(format!(
                "liveness: the controller has answered for {LIVENESS_STEPS} steps, but the \
                 daemon still holds it unreachable since {} ({})",
                down.since_ms, down.error
            )));
        }
        if !stuck.is_empty() {
            return Err(self.violation(format!(
                "liveness: after {LIVENESS_STEPS} quiet steps these are still starting or \
                 stopping: {stuck:?}"
            )));
        }
        Ok(())
    }

    /// Opens the store, rebuilds the daemon from it (comparing it with the one that crashed,
    /// if one did) and recovers from the backend, as a start does.
    fn start(&mut self) -> Result<(), Violation> {
        let store = SqliteStore::open(&self.dir)
            .map_err(|e| self.violation(format!("the store does not open: {e}")))?;
        let mut backend: Box<dyn allot_backend::Backend> = Box::new(self.control.backend());
        let opened = boot::open(Box::new(store), backend.as_mut(), &self.config)
            .map_err(|e| self.violation(format!("the daemon does not start: {e:#}")))?;
        if let Some(expected) = self.crashed.take() {
            let rebuilt = opened.durable.machine.daemon.digest();
            if rebuilt != expected {
                let at = rebuilt.bytes().zip(expected.bytes()).take_while(|(a, b)| a == b).count();
                let lo = at.saturating_sub(200);
                return Err(self.violation(format!(
                    "the daemon rebuilt from the log differs from the one that crashed, at byte \
                     {at}:\n  rebuilt: …{}…\n  crashed: …{}…",
                    &rebuilt[lo..(at + 200).min(rebuilt.len())],
                    &expected[lo..(at + 200).min(expected.len())]
                )));
            }
        }
        let mut booted = boot::recover(opened, backend.as_mut(), &self.config, self.wall_ms)
            .map_err(|e| self.violation(format!("the daemon does not recover: {e:#}")))?;
        let down = booted.durable.machine.daemon.backend_down.as_ref().map(|d| d.error.clone());
        let mut executor = Executor::new(backend, 5_000, down);
        executor.owe_pods(std::mem::take(&mut booted.pods_owed));
        // The executor thread starts a moment after the start: the world may change before it
        // runs what recovery decided (the next step's commands go after these).
        self.recovery_commands = booted.commands;
        self.daemon = Some(Daemon {
            durable: booted.durable,
            executor,
            view: RwLock::new(View::default()),
            metrics: Metrics::new(),
        });
        Ok(())
    }

    fn crash(&mut self, digest: String) -> Result<(), Violation> {
        self.daemon = None;
        self.inputs.clear();
        self.recovery_commands.clear();
        self.asked.clear();
        self.crashed = Some(digest);
        self.report.recoveries += 1;
        self.start()
    }

    fn principal(&mut self) -> Principal {
        match self.rng.below(10) {
            0 => Principal {
                token_id: "v".into(),
                name: "viewer".into(),
                role: Role::Viewer,
                projects: Vec::new(),
            },
            1..=3 => {
                let p = PROJECTS[self.rng.below(3) as usize].to_string();
                Principal {
                    token_id: "m".into(),
                    name: format!("member-{p}"),
                    role: Role::Member,
                    projects: vec![p],
                }
            }
            _ => Principal {
                token_id: "a".into(),
                name: "admin".into(),
                role: Role::Admin,
                projects: Vec::new(),
            },
        }
    }

    fn ask(&mut self, ask: Ask, what: String) -> Input {
        self.next_ticket += 1;
        self.note(format!("ask #{}: {what}", self.next_ticket));
        self.asked.insert(self.next_ticket, what);
        Input::Ask(self.next_ticket, ask)
    }

    fn submission(&mut self, valid: bool) -> SubmitRequest {
        self.next_name += 1;
        let kind = KINDS[self.rng.below(3) as usize];
        let mut r = SubmitRequest {
            name: Some(format!("w{}", self.next_name)),
            project: PROJECTS[self.rng.below(3) as usize].into(),
            kind: Some(kind.into()),
            gpus: Some(match self.rng.below(6) {
                0 => 0.5,
                1 => 2.0,
                2 => 4.0,
                _ => 1.0,
            }),
            members: (self.rng.below(5) == 0).then_some(2),
            priority_class: ["low", "normal", "high"]
                .get(self.rng.below(4) as usize)
                .map(|s| (*s).into()),
            checkpoint_grace_s: (self.rng.below(3) == 0).then_some(1 + self.rng.below(20)),
            max_runtime_s: (self.rng.below(4) == 0).then_some(60 + self.rng.below(600)),
            command: vec!["sleep".into(), "100".into()],
            ..SubmitRequest::default()
        };
        if self.rng.below(4) == 0 {
            r.gpu_models = vec![MODELS[self.rng.below(2) as usize].into()];
        }
        if !valid {
            match self.rng.below(4) {
                0 => r.project = "nobody".into(),
                1 => r.gpus = Some(-1.0),
                2 => r.command.clear(),
                _ => r.priority_class = Some("urgent".into()),
            }
        }
        r
    }

    /// A workload id the daemon knows, if any.
    fn some_workload(&mut self) -> Option<u64> {
        let d = &self.daemon.as_ref()?.durable.machine.daemon;
        let ids: Vec<u64> = d.workloads.keys().copied().collect();
        (!ids.is_empty()).then(|| ids[self.rng.below(ids.len() as u64) as usize])
    }

    fn some_run(&mut self) -> Option<RunId> {
        let runs: Vec<RunId> = self
            .control
            .runs()
            .into_iter()
            .filter(|r| r.is_running())
            .map(|r| r.launch.run)
            .collect();
        (!runs.is_empty()).then(|| runs[self.rng.below(runs.len() as u64) as usize])
    }

    fn advance_clock(&mut self) {
        let dt = match self.rng.below(20) {
            0 => 30_000 + self.rng.below(60_000),
            1..=4 => self.rng.below(50),
            _ => 200 + self.rng.below(3_000),
        };
        self.wall_ms += dt;
        self.mono_ms += dt;
    }

    /// One step: the clock moves, the scheduler picks what happens, the daemon takes it.
    fn turn(&mut self) -> Result<(), Violation> {
        self.advance_clock();
        let mut inputs = std::mem::take(&mut self.inputs);
        if self.unreachable && self.rng.below(8) == 0 {
            self.unreachable = false;
            self.control.set_unreachable(None);
            self.note("controller answers again");
        }
        // The liveness phase submits in its first part only, then lets everything settle.
        let settling = self.step > self.steps + LIVENESS_STEPS - SETTLE_STEPS;
        let pick = match (self.faults, settling) {
            (true, _) => self.rng.below(100),
            (false, false) => 100 + self.rng.below(40),
            (false, true) => 200,
        };
        let mut crash_mid_step = false;
        match pick {
            0..=21 => {
                let r = self.submission(true);
                let p = self.principal();
                let what =
                    format!("submit {} {:?}×{:?} by {}", r.project, r.gpus, r.members, p.name);
                self.injected("submit");
                inputs.push(self.ask(
                    Ask::Submit { principal: p, request: Box::new(r), received_ms: self.wall_ms },
                    what,
                ));
            }
            22..=24 => {
                let r = self.submission(false);
                self.injected("submit_invalid");
                let p = self.principal();
                inputs.push(self.ask(
                    Ask::Submit { principal: p, request: Box::new(r), received_ms: self.wall_ms },
                    "submit invalid".into(),
                ));
            }
            25..=33 => {
                if let Some(id) = self.some_workload() {
                    let action = match self.rng.below(7) {
                        0..=2 => Action::Cancel,
                        3 | 4 => Action::Suspend,
                        5 => Action::Resume,
                        _ => Action::Checkpoint { at_ms: self.wall_ms },
                    };
                    self.injected("action");
                    let p = self.principal();
                    inputs.push(
                        self.ask(Ask::Act { principal: p, id, action }, format!("{action:?} {id}")),
                    );
                }
            }
            34 => {
                self.injected("policy_apply");
                let text = accepted_policy(&mut self.rng);
                inputs.push(self.ask(
                    Ask::ApplyPolicy {
                        source: "edited.yaml".into(),
                        text,
                        by: "admin".into(),
                        rollback_of: None,
                        rollout: None,
                        whatif: None,
                    },
                    "apply a policy".into(),
                ));
            }
            35 => {
                self.injected("policy_apply_removing_a_project");
                let text = refused_policy();
                inputs.push(self.ask(
                    Ask::ApplyPolicy {
                        source: "cut.yaml".into(),
                        text,
                        by: "admin".into(),
                        rollback_of: None,
                        rollout: None,
                        whatif: None,
                    },
                    "apply a policy without solo".into(),
                ));
            }
            36 | 37 => {
                let id = self.some_workload().unwrap_or(1);
                let p = self.principal();
                let ask = match self.rng.below(3) {
                    0 => Ask::Why { principal: p, id },
                    1 => Ask::Report { principal: p },
                    _ => Ask::History { limit: 1_000 },
                };
                inputs.push(self.ask(ask, format!("query about {id}")));
            }
            38..=49 => {
                if let Some(run) = self.some_run() {
                    let code = if self.rng.below(6) == 0 { 1 } else { 0 };
                    self.control.finish(run, code);
                    self.injected("run_ends");
                    self.note(format!("run {run} exits {code}"));
                }
            }
            50 => {
                if let Some(run) = self.some_run() {
                    self.control.end(run, None, "vanished: the cluster lost the job");
                    self.injected("run_vanishes");
                    self.note(format!("run {run} vanishes"));
                }
            }
            51 if self.rng.below(3) == 0 => {
                self.control.lose_next_launch("lost: the cluster never ran it");
                self.injected("launch_lost");
                self.note("the next launch is lost");
            }
            51 => {
                self.control.fail_next_launch("sbatch: error: Invalid account");
                self.injected("launch_refused");
                self.note("the next launch is refused");
            }
            52 if !self.unreachable => {
                self.unreachable = true;
                self.control
                    .set_unreachable(Some("Unable to contact slurm controller (connect failure)"));
                self.injected("controller_unreachable");
                self.note("controller unreachable");
            }
            53 => {
                self.control.fail_polls(1 + self.rng.below(5) as u32);
                self.injected("polls_fail");
                self.note("polls fail");
            }
            54 | 55 => {
                let nodes = self.control.nodes();
                if !nodes.is_empty() {
                    let n = nodes[self.rng.below(nodes.len() as u64) as usize].name.clone();
                    let reason =
                        ["DOWN: not responding", "DRAINED: bad GPU"][self.rng.below(2) as usize];
                    let back = self.rng.below(2) == 0;
                    self.control.set_node_unusable(&n, if back { None } else { Some(reason) });
                    self.injected(if back { "node_back" } else { "node_down_or_drained" });
                    self.note(format!("node {n} {}", if back { "back" } else { reason }));
                }
            }
            56 => {
                let mut nodes = self.control.nodes();
                match self.rng.below(4) {
                    0 => {
                        let i = nodes.len();
                        nodes.push(node(
                            &format!("n{}", 10 + i),
                            1 + self.rng.below(8),
                            MODELS[self.rng.below(2) as usize],
                        ));
                        self.note("a node is added");
                    }
                    1 if nodes.len() > 1 => {
                        let i = self.rng.below(nodes.len() as u64) as usize;
                        let gone = nodes.remove(i);
                        self.note(format!("node {} leaves the inventory", gone.name));
                    }
                    2 => {
                        let i = self.rng.below(nodes.len() as u64) as usize;
                        let keep = self.rng.below(nodes[i].devices.len() as u64 + 1) as usize;
                        nodes[i].devices.truncate(keep.max(1));
                        self.note(format!(
                            "node {} now has {} GPUs",
                            nodes[i].name,
                            nodes[i].devices.len()
                        ));
                    }
                    _ => {
                        for n in &mut nodes {
                            n.labels.insert(
                                "state".into(),
                                ["idle", "mixed", "allocated"][self.rng.below(3) as usize].into(),
                            );
                        }
                        self.note("node labels change");
                    }
                }
                self.control.set_nodes(nodes);
                self.injected("inventory_changes");
            }
            57 => {
                self.next_foreign += 1;
                let handle = format!("{}", 9000 + self.next_foreign);
                self.control.add_foreign(ForeignWork {
                    handle: handle.clone(),
                    name: format!("sbatch-{handle}"),
                    project: PROJECTS[self.rng.below(3) as usize].into(),
                    user: "carla".into(),
                    running: Vec::new(),
                    nodes: 1,
                    gpus_per_node: 1,
                    models: Vec::new(),
                    started_ms: None,
                    refusal: None,
                    intent: Default::default(),
                });
                self.injected("foreign_work");
                self.note(format!("foreign job {handle} appears, pending"));
            }
            58..=65 => {
                inputs.push(self.telemetry(true));
                self.injected("telemetry");
            }
            66 | 67 => {
                inputs.push(self.telemetry(false));
                self.injected("telemetry_noise");
            }
            68..=70 => {
                if let Some(files) = self.files() {
                    inputs.push(files);
                    self.injected("probe_files");
                }
            }
            71 | 72 => {
                self.injected("crash");
                let digest = self.daemon.as_ref().map(|d| d.durable.machine.daemon.digest());
                self.note("crash between steps");
                if let Some(digest) = digest {
                    self.crash(digest)?;
                }
                // What the dead process's executor had seen dies with it: the new daemon
                // hears only from its own executor (which starts from the log's view).
                inputs.clear();
            }
            73 => {
                crash_mid_step = true;
            }
            74 => {
                self.wall_ms += 600_000 + self.rng.below(3_600_000);
                self.injected("clock_jump_forward");
                self.note("the wall clock jumps forward");
            }
            75 => {
                self.wall_ms = self.wall_ms.saturating_sub(60_000 + self.rng.below(600_000));
                self.injected("clock_jump_backward");
                self.note("the wall clock jumps backward");
            }
            76 | 77 => {
                // Work allot does not govern (a job of an unmanaged partition) starts on some
                // devices of a node, or the one there ends.
                let nodes = self.control.nodes();
                if !nodes.is_empty() {
                    let n = &nodes[self.rng.below(nodes.len() as u64) as usize];
                    let handle = format!("beside-{}", n.name);
                    let count = n.devices.len() as u64;
                    if count > 0 && self.rng.below(2) == 0 {
                        let first = self.rng.below(count) as u32;
                        let take = 1 + self.rng.below(count - u64::from(first)) as u32;
                        let devices = (first..first + take)
                            .map(|index| allot_backend::DeviceAssignment {
                                index,
                                uuid: None,
                                vendor: allot_backend::Vendor::Nvidia,
                                shares: 1000,
                            })
                            .collect();
                        let member = MemberLaunch { node: n.name.clone(), devices };
                        self.control.set_beside(
                            &handle,
                            Some(ForeignWork {
                                handle: handle.clone(),
                                name: "unmanaged-job".into(),
                                project: "physics".into(),
                                user: "dora".into(),
                                running: vec![member],
                                nodes: 1,
                                gpus_per_node: take,
                                models: Vec::new(),
                                started_ms: Some(self.wall_ms),
                                refusal: None,
                                intent: Default::default(),
                            }),
                        );
                        self.injected("work_beside");
                        self.note(format!("unmanaged work holds {take} device(s) of {}", n.name));
                    } else {
                        self.control.set_beside(&handle, None);
                        self.injected("work_beside_ends");
                        self.note(format!("unmanaged work on {} ends", n.name));
                    }
                }
            }
            78 => {
                // A candidate policy starts (or replaces one) in shadow, or the shadow stops.
                if self.rng.below(3) == 0 {
                    inputs.push(self.ask(Ask::StopShadow, "shadow stop".into()));
                    self.injected("shadow_stop");
                } else {
                    let text = accepted_policy(&mut self.rng);
                    inputs.push(self.ask(
                        Ask::StartShadow { source: "shadow.yaml".into(), text, by: "admin".into() },
                        "shadow start".into(),
                    ));
                    self.injected("shadow_start");
                }
            }
            // The liveness phase: submissions and telemetry only.
            100..=104 => {
                let r = self.submission(true);
                let p = Principal {
                    token_id: "a".into(),
                    name: "admin".into(),
                    role: Role::Admin,
                    projects: Vec::new(),
                };
                inputs.push(self.ask(
                    Ask::Submit { principal: p, request: Box::new(r), received_ms: self.wall_ms },
                    "submit (liveness)".into(),
                ));
            }
            _ => {}
        }
        let Some(daemon) = self.daemon.as_mut() else { return Err(self.violation("no daemon")) };
        if crash_mid_step {
            // The step is applied in memory, then the process dies before the append: nothing
            // of it is durable, nothing was answered or done.
            let before = daemon.durable.machine.daemon.digest();
            let _ = daemon.durable.machine.step(self.wall_ms, inputs);
            self.injected("crash_mid_step");
            self.note("crash within a step, before its append");
            return self.crash(before);
        }
        let turn = daemon.durable.step(self.wall_ms, inputs).map_err(|e| Violation {
            seed: self.seed,
            steps: self.steps,
            step: self.step,
            message: format!("the log could not be written: {e:#}"),
            trace: Vec::new(),
        })?;
        self.report.entries += turn.output.entries.len() as u64;
        // Published after every step as the driver does (whole at most every 200 ms, and here
        // every 16th step): the node view never lags what allot's work holds.
        let whole = self.step.is_multiple_of(16);
        daemon.durable.machine.publish(self.wall_ms, whole, &daemon.view, &daemon.metrics);
        let lag = daemon.view.read().ok().and_then(|v| daemon.durable.machine.node_view_lag(&v));
        if let Some(lag) = lag {
            return Err(self.violation(format!("the readers' node view lags: {lag}")));
        }
        let mut answered = Vec::new();
        for (ticket, answer) in turn.output.answers {
            answered.push((ticket, answer));
        }
        let commands: Vec<String> =
            self.recovery_commands.iter().chain(&turn.output.commands).map(command_note).collect();
        let mut commands_now = std::mem::take(&mut self.recovery_commands);
        commands_now.extend(turn.output.commands);
        let more = daemon.executor.run(self.mono_ms, commands_now);
        let waiting = daemon.durable.machine.daemon.engine.has_pending();
        let polled = daemon.executor.poll(self.mono_ms, waiting);
        let seen: Vec<String> = more.iter().chain(&polled).map(input_note).collect();
        self.inputs.extend(more);
        self.inputs.extend(polled);
        if !commands.is_empty() {
            self.note(format!("commands: {}", commands.join(", ")));
        }
        // `ALLOT_SIM_WATCH=ID,ID`: the watched workloads' state and reason after every step.
        if let Ok(ids) = std::env::var("ALLOT_SIM_WATCH") {
            let lines: Vec<String> = ids
                .split(',')
                .filter_map(|i| i.trim().parse::<u64>().ok())
                .filter_map(|id| {
                    let r = self.daemon.as_ref()?.durable.machine.daemon.workloads.get(&id)?;
                    Some(format!(
                        "workload {id} {} ({:?} {}): {} attempt {} {:?}",
                        r.spec.name,
                        r.spec.priority_class,
                        r.spec.project,
                        r.state.as_str(),
                        r.attempt,
                        r.reason
                    ))
                })
                .collect();
            for line in lines {
                self.note(line);
            }
        }
        if !seen.is_empty() {
            self.note(format!("executor saw: {}", seen.join(", ")));
        }
        for (ticket, answer) in answered {
            let asked = self.asked.remove(&ticket);
            match (&answer, &asked) {
                (Answer::Submitted(Ok(r)), Some(what)) => {
                    self.report.acknowledged += 1;
                    if self.acked.insert(r.id, what.clone()).is_some() {
                        return Err(
                            self.violation(format!("workload id {} acknowledged twice", r.id))
                        );
                    }
                    self.note(format!("#{ticket} acknowledged as workload {}", r.id));
                }
                (_, None) => return Err(self.violation(format!("an answer to no ask: #{ticket}"))),
                (
                    Answer::Submitted(Err(e))
                    | Answer::Workload(Err(e))
                    | Answer::Policy(Err(e))
                    | Answer::Shadow(Err(e)),
                    _,
                ) if e.status >= 500 => {
                    return Err(self.violation(format!("a 5xx answer: {e:?}")));
                }
                _ => {}
            }
        }
        if !self.asked.is_empty() {
            return Err(self.violation(format!("asks without an answer: {:?}", self.asked)));
        }
        self.check()
    }

    /// Readings for the devices of running workloads (`real`), or noise: samples of devices
    /// nobody holds, samples without any signal, samples from long ago.
    fn telemetry(&mut self, real: bool) -> Input {
        let mut samples = Vec::new();
        let held: Vec<(String, u32)> = self
            .control
            .runs()
            .into_iter()
            .filter(|r| r.is_running())
            .flat_map(|r| {
                r.launch
                    .members
                    .into_iter()
                    .flat_map(|m| m.devices.into_iter().map(move |d| (m.node.clone(), d.index)))
            })
            .collect();
        let sample = |host: String, index: u32, at_ms: u64, sm: Option<u16>| {
            let mut identity = DeviceIdentity::new(Vendor::Nvidia);
            identity.hostname = Some(host);
            identity.gpu_index = Some(index);
            let mut s = Sample::new(identity);
            s.at_ms = Some(at_ms);
            s.sm_active = sm;
            s.classify();
            s
        };
        if real {
            for (host, index) in held {
                if self.rng.below(5) == 0 {
                    continue; // a gap
                }
                let sm = [0u16, 20, 300, 900][self.rng.below(4) as usize];
                samples.push(sample(host, index, self.wall_ms, Some(sm)));
            }
        } else {
            samples.push(sample("ghost".into(), self.rng.below(8) as u32, self.wall_ms, Some(500)));
            samples.push(sample("n0".into(), 99, self.wall_ms, Some(500)));
            samples.push(sample("n0".into(), 0, self.wall_ms, None));
            samples.push(sample("n1".into(), 0, self.wall_ms.saturating_sub(3_600_000), Some(800)));
        }
        Input::Telemetry { samples, groups: BTreeMap::new() }
    }

    /// The running workloads' heartbeat (and now and then checkpoint) files, touched now.
    fn files(&mut self) -> Option<Input> {
        let daemon = self.daemon.as_ref()?;
        let watched = daemon.durable.machine.watched_files();
        if watched.is_empty() {
            return None;
        }
        let mut files = Vec::new();
        for (id, _, _) in watched {
            if self.rng.below(2) == 0 {
                files.push(FileTimes {
                    id,
                    heartbeat_ms: Some(self.wall_ms),
                    checkpoint_ms: (self.rng.below(4) == 0).then_some(self.wall_ms),
                });
            }
        }
        Some(Input::Files(files))
    }

    /// The invariants, after every step.
    fn check(&self) -> Result<(), Violation> {
        let Some(daemon) = self.daemon.as_ref() else { return Err(self.violation("no daemon")) };
        let d = &daemon.durable.machine.daemon;
        // Every acknowledged submission exists, once, as submitted.
        for (id, what) in &self.acked {
            match d.workloads.get(id) {
                None => {
                    return Err(
                        self.violation(format!("acknowledged workload {id} ({what}) is lost"))
                    );
                }
                Some(r)
                    if !what.contains(&format!("submit {} ", r.spec.project))
                        && !what.contains("liveness") =>
                {
                    return Err(self.violation(format!(
                        "acknowledged workload {id} ({what}) came back as another: project {}",
                        r.spec.project
                    )));
                }
                Some(_) => {}
            }
        }
        // The engine's own invariants.
        d.engine.audit().map_err(|e| self.violation(format!("engine audit: {e}")))?;
        // Nothing runs that the engine does not hold; no device is double-booked.
        let mut shares: BTreeMap<(String, u32), u64> = BTreeMap::new();
        let mut live: BTreeSet<u64> = BTreeSet::new();
        for run in self.control.runs().into_iter().filter(|r| r.is_running()) {
            let RunId { workload, attempt } = run.launch.run;
            if !live.insert(workload) {
                return Err(
                    self.violation(format!("workload {workload} runs twice on the cluster"))
                );
            }
            let Some(r) = d.workloads.get(&workload) else {
                return Err(self.violation(format!("run {} runs for no workload", run.launch.run)));
            };
            let engine_holds = matches!(
                d.engine.stage(WorkloadId(workload)),
                Some(Stage::Assumed | Stage::Running | Stage::Stopping)
            ) && d.engine.placement(WorkloadId(workload)).is_some();
            let record_live = matches!(
                r.state,
                WorkloadState::Starting | WorkloadState::Running | WorkloadState::Stopping
            ) && r.attempt == attempt;
            if !engine_holds || !record_live {
                return Err(self.violation(format!(
                    "run {} runs but the daemon has workload {workload} {} at attempt {} and the \
                     engine {:?}",
                    run.launch.run,
                    r.state.as_str(),
                    r.attempt,
                    d.engine.stage(WorkloadId(workload))
                )));
            }
            for m in &run.launch.members {
                for dev in &m.devices {
                    let used = shares.entry((m.node.clone(), dev.index)).or_default();
                    *used += dev.shares;
                    if *used > 1000 {
                        return Err(self.violation(format!(
                            "device {}#{} is booked {used}/1000 by the running runs",
                            m.node, dev.index
                        )));
                    }
                }
            }
        }
        // The ledger's books balance: allocated = useful + idle + lost-while-active, active
        // within measured within allocated, and the projects and users each add up to the
        // cluster.
        let ledger = &d.ledger;
        let cluster = ledger.total(&Scope::Cluster);
        let balanced = |b: &Books| {
            b.active <= b.measured
                && b.measured <= b.allocated
                && b.lost_active <= b.active
                && b.lost_active <= b.lost_to_preemption
                && b.useful() + b.idle_allocated() + b.lost_active == b.allocated
        };
        let mut projects = Books::default();
        let mut users = Books::default();
        for scope in ledger.scopes() {
            let b = ledger.total(&scope);
            if !balanced(&b) {
                return Err(self
                    .violation(format!("the ledger's books of {scope:?} do not balance: {b:?}")));
            }
            let sum = match scope {
                Scope::Project(_) => &mut projects,
                Scope::User(_) => &mut users,
                _ => continue,
            };
            sum.allocated += b.allocated;
            sum.active += b.active;
            sum.lost_to_preemption += b.lost_to_preemption;
        }
        for (what, sum) in [("projects", &projects), ("users", &users)] {
            if cluster.allocated > 0
                && (sum.allocated, sum.active, sum.lost_to_preemption)
                    != (cluster.allocated, cluster.active, cluster.lost_to_preemption)
            {
                return Err(self.violation(format!(
                    "the {what}' books do not add up to the cluster's: {sum:?} vs {cluster:?}"
                )));
            }
        }
        Ok(())
    }
}

fn violation(config: &SimConfig, step: u64, message: String) -> Violation {
    Violation { seed: config.seed, steps: config.steps, step, message, trace: Vec::new() }
}

fn command_note(c: &crate::machine::Command) -> String {
    use crate::machine::Command;
    match c {
        Command::Launch(l) => format!(
            "launch {} on {:?}",
            l.run,
            l.members.iter().map(|m| &m.node).collect::<Vec<_>>()
        ),
        Command::Signal(run, s) => format!("{s:?} {run}"),
        Command::Requeue { run, next } => format!("requeue {run} as {next}"),
        Command::ReturnForeign(h) => format!("return foreign {h}"),
        Command::CancelForeign(h) => format!("cancel foreign {h}"),
        Command::ExplainWaiting(reasons) => format!("explain {} waiting", reasons.len()),
        Command::Recover(l) => format!("recover {} runs", l.len()),
    }
}

fn input_note(i: &Input) -> String {
    match i {
        Input::Observed(o) | Input::Recovered(o) => format!("{o:?}"),
        Input::Cluster(news) => format!(
            "cluster ({} nodes, {} foreign{})",
            news.nodes.len(),
            news.foreign.len(),
            if news.inventory.is_some() { ", inventory" } else { "" }
        ),
        Input::BackendHealth(h) => format!("backend health {h:?}"),
        Input::Kept(k) => format!("kept {k:?}"),
        other => format!("{other:?}"),
    }
}
