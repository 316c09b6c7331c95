//! An in-memory backend for tests and the simulator: deterministic, no threads, no clock.
//!
//! The fake splits what a real backend splits: the *world* (the processes a host runs, which
//! survive a daemon restart) and the *backend* (what one daemon life watched and reported). A
//! test drives the world through [`FakeControl`] — it ends runs, fails launches, makes runs ignore
//! signals — and gets a fresh backend on the same world with [`FakeControl::backend`], which is
//! what the daemon sees after a restart.
//!
//! Like the local backend, a restarted fake knows an exit code only if a backend learned it
//! (polled it) before the restart; an adopted run's exit is reported with code `None`.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use allot_core::NodeSpec;

use crate::{
    Backend, BackendError, ClusterNews, ForeignWork, Launch, NodeStatus, Observation, RunId,
    StopSignal,
};

/// Detail of a run ended by Terminate or Kill.
pub const DETAIL_SIGNALLED: &str = "terminated by signal";
/// Detail of a run that ended while no backend watched it, or after re-adoption.
pub const DETAIL_UNKNOWN: &str =
    "exit status unknown: it ended while allot was restarting or after re-adoption";

/// A run as the simulated host holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeRun {
    pub launch: Launch,
    pub state: FakeRunState,
    /// Every signal delivered, in order.
    pub signals: Vec<StopSignal>,
    /// One made-up pid per member.
    pub pids: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FakeRunState {
    Running,
    Exited { code: Option<i32>, detail: String },
    LaunchFailed { error: String },
}

#[derive(Debug, Default)]
struct World {
    nodes: Vec<NodeSpec>,
    /// In launch order, so that observations come out in the order things happened.
    runs: Vec<WorldRun>,
    /// Each run's place in `runs` (the first launch of an id, as a scan in order finds):
    /// a cluster of thousands of runs is polled without a scan per run.
    places: std::collections::BTreeMap<RunId, usize>,
    fail_next_launch: Option<String>,
    /// The next launch is accepted but the cluster never runs it (lost), with this detail.
    lose_next_launch: Option<String>,
    missing_programs: BTreeSet<String>,
    next_pid: u32,
    /// Nodes made unusable by a test, with the reason.
    unusable: std::collections::BTreeMap<String, String>,
    /// Work on the cluster that allot did not start and no launch took over, by handle.
    foreign: std::collections::BTreeMap<String, ForeignWork>,
    /// Running work allot must not govern (`ClusterNews::beside`), by handle.
    beside: std::collections::BTreeMap<String, ForeignWork>,
    /// Whether `requeue` keeps the work (as Slurm does) or is refused (as on a host).
    requeue_supported: bool,
    /// (run, next) of every requeue, in order.
    requeues: Vec<(RunId, RunId)>,
    /// Devices runs hold where the cluster's scheduler bound others than launched.
    bound: std::collections::BTreeMap<RunId, Vec<crate::MemberLaunch>>,
    /// The pod each member of a run is, where a test said (`member_pods` reports them).
    pods: std::collections::BTreeMap<RunId, Vec<crate::PodRef>>,
    /// While set, the controller does not answer: every call fails with this, changing nothing.
    unreachable: Option<String>,
    /// So many next polls fail (a slow or failing status query), changing nothing.
    failing_polls: u32,
    /// The last reason `explain_waiting` gave for each waiting work.
    explained: std::collections::BTreeMap<crate::Waiting, String>,
}

#[derive(Debug)]
struct WorldRun {
    run: FakeRun,
    ignored: BTreeSet<SignalKey>,
    /// A backend polled the exit with its code: a later backend may report it.
    exit_learned: bool,
}

/// `StopSignal` has no `Ord`; the set of ignored signals keys on this.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum SignalKey {
    Checkpoint,
    Terminate,
    Kill,
}

impl From<StopSignal> for SignalKey {
    fn from(s: StopSignal) -> Self {
        match s {
            StopSignal::Checkpoint => SignalKey::Checkpoint,
            StopSignal::Terminate => SignalKey::Terminate,
            StopSignal::Kill => SignalKey::Kill,
        }
    }
}

impl World {
    fn find(&self, run: RunId) -> Option<&WorldRun> {
        self.runs.get(*self.places.get(&run)?)
    }

    fn find_mut(&mut self, run: RunId) -> Option<&mut WorldRun> {
        self.runs.get_mut(*self.places.get(&run)?)
    }
}

fn lock(world: &Mutex<World>) -> MutexGuard<'_, World> {
    // A test that panicked while holding the lock left consistent data: every update is one step.
    world.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Drives the fake's world from a test. Cheap to clone; every clone drives the same world.
#[derive(Clone, Debug)]
pub struct FakeControl {
    world: Arc<Mutex<World>>,
}

impl FakeControl {
    /// A new backend on this world, as after a daemon restart: it watches nothing until it
    /// launches or recovers runs.
    pub fn backend(&self) -> FakeBackend {
        FakeBackend { world: Arc::clone(&self.world), watched: Vec::new(), pending: Vec::new() }
    }

    /// The next launch fails with `error` (reported as `LaunchFailed`).
    pub fn fail_next_launch(&self, error: impl Into<String>) {
        lock(&self.world).fail_next_launch = Some(error.into());
    }

    /// The next launch is accepted, but the cluster loses it before it runs: polls report it
    /// ended (exit unknown) with `detail`, as a job that vanished from the queue.
    pub fn lose_next_launch(&self, detail: impl Into<String>) {
        lock(&self.world).lose_next_launch = Some(detail.into());
    }

    /// Every launch whose program (`command[0]`) is `program` fails: it does not exist here.
    pub fn set_missing_program(&self, program: impl Into<String>) {
        lock(&self.world).missing_programs.insert(program.into());
    }

    /// The run's program exits with `code`. Returns false (and does nothing) unless it runs.
    pub fn finish(&self, run: RunId, code: i32) -> bool {
        self.end(run, Some(code), format!("exited with code {code}"))
    }

    /// The run ends with `code` and `detail` (`code: None` for a death by signal). Returns false
    /// (and does nothing) unless it runs.
    pub fn end(&self, run: RunId, code: Option<i32>, detail: impl Into<String>) -> bool {
        let mut world = lock(&self.world);
        match world.find_mut(run) {
            Some(r) if r.run.state == FakeRunState::Running => {
                r.run.state = FakeRunState::Exited { code, detail: detail.into() };
                true
            }
            _ => false,
        }
    }

    /// From now on the run's program survives `signal` (it is still recorded). By default
    /// Terminate and Kill end a run and Checkpoint does not; ignoring Kill is allowed so tests
    /// can model a stuck process.
    pub fn ignore_signal(&self, run: RunId, signal: StopSignal) -> bool {
        let mut world = lock(&self.world);
        match world.find_mut(run) {
            Some(r) => r.ignored.insert(signal.into()),
            None => false,
        }
    }

    /// Every launched run, in launch order.
    pub fn runs(&self) -> Vec<FakeRun> {
        lock(&self.world).runs.iter().map(|r| r.run.clone()).collect()
    }

    pub fn run(&self, run: RunId) -> Option<FakeRun> {
        lock(&self.world).find(run).map(|r| r.run.clone())
    }

    /// Work appears on the cluster that allot did not start (as a job submitted to Slurm
    /// directly). Pending work (`running` empty) is held, as the Slurm backend holds it.
    pub fn add_foreign(&self, work: ForeignWork) {
        lock(&self.world).foreign.insert(work.handle.clone(), work);
    }

    /// Foreign work ends (or is cancelled) before a launch took it over. False if unknown.
    pub fn end_foreign(&self, handle: &str) -> bool {
        lock(&self.world).foreign.remove(handle).is_some()
    }

    /// Work allot must not govern starts running on the cluster's devices (`running`), as a
    /// job of an unmanaged partition on a shared node; `None` ends the one with `handle`.
    pub fn set_beside(&self, handle: &str, work: Option<ForeignWork>) {
        let mut world = lock(&self.world);
        match work {
            Some(work) => world.beside.insert(handle.to_string(), work),
            None => world.beside.remove(handle),
        };
    }

    /// Foreign work no launch has taken over yet, by handle.
    pub fn foreign(&self) -> Vec<ForeignWork> {
        lock(&self.world).foreign.values().cloned().collect()
    }

    /// The node becomes unusable for new work (`Some(reason)`: drained, down) or usable again.
    pub fn set_node_unusable(&self, node: &str, reason: Option<&str>) {
        let mut world = lock(&self.world);
        match reason {
            Some(r) => world.unusable.insert(node.to_string(), r.to_string()),
            None => world.unusable.remove(node),
        };
    }

    /// From now on `requeue` keeps the work for its next attempt, as the Slurm backend does.
    pub fn support_requeue(&self) {
        lock(&self.world).requeue_supported = true;
    }

    /// The run holds these devices instead of the launched ones (as Slurm binds GRES indices
    /// itself); `allocated_devices` reports them.
    pub fn bind_devices(&self, run: RunId, members: Vec<crate::MemberLaunch>) {
        lock(&self.world).bound.insert(run, members);
    }

    /// The run's members are these pods (as on Kubernetes); `member_pods` reports them.
    pub fn set_member_pods(&self, run: RunId, pods: Vec<crate::PodRef>) {
        lock(&self.world).pods.insert(run, pods);
    }

    /// The controller stops answering (`Some(error)`: every backend call fails with
    /// [`BackendError::Unreachable`] and changes nothing; runs go on) or answers again.
    pub fn set_unreachable(&self, error: Option<&str>) {
        lock(&self.world).unreachable = error.map(str::to_string);
    }

    /// The next `count` polls fail (an I/O error), changing nothing.
    pub fn fail_polls(&self, count: u32) {
        lock(&self.world).failing_polls = count;
    }

    /// The cluster's inventory becomes `nodes` (a node added, removed, or given other
    /// devices); `inventory` and `watch_cluster` report it. Runs go on where they are.
    pub fn set_nodes(&self, nodes: Vec<NodeSpec>) {
        lock(&self.world).nodes = nodes;
    }

    /// The cluster's nodes now.
    pub fn nodes(&self) -> Vec<NodeSpec> {
        lock(&self.world).nodes.clone()
    }

    /// Every (run, next) requeued, in order.
    /// The last reason the daemon gave for each work waiting on the cluster
    /// (`Backend::explain_waiting`).
    pub fn explained(&self) -> std::collections::BTreeMap<crate::Waiting, String> {
        lock(&self.world).explained.clone()
    }

    pub fn requeues(&self) -> Vec<(RunId, RunId)> {
        lock(&self.world).requeues.clone()
    }

    /// The signals the run received, in order (empty for an unknown run).
    pub fn signals(&self, run: RunId) -> Vec<StopSignal> {
        lock(&self.world).find(run).map(|r| r.run.signals.clone()).unwrap_or_default()
    }
}

/// The backend side: what one daemon life launched or recovered, and what it reported.
#[derive(Debug)]
pub struct FakeBackend {
    world: Arc<Mutex<World>>,
    /// Runs this backend reports on, in the order it took them on.
    watched: Vec<Watch>,
    /// Observations decided outside `poll` (recovery through `launch`), reported first.
    pending: Vec<Observation>,
}

#[derive(Debug)]
struct Watch {
    run: RunId,
    started_reported: bool,
    /// Adopted after a restart: its exit status cannot be learned.
    adopted: bool,
    done: bool,
}

impl FakeBackend {
    /// A backend governing `nodes`, and the control that drives its world.
    pub fn new(nodes: Vec<NodeSpec>) -> (FakeBackend, FakeControl) {
        let world = World { nodes, next_pid: 1000, ..World::default() };
        let control = FakeControl { world: Arc::new(Mutex::new(world)) };
        (control.backend(), control)
    }

    /// `Err` while the controller is unreachable ([`FakeControl::set_unreachable`]).
    fn reachable(&self) -> Result<(), BackendError> {
        match &lock(&self.world).unreachable {
            Some(error) => Err(BackendError::Unreachable(error.clone())),
            None => Ok(()),
        }
    }

    fn watching(&self, run: RunId) -> bool {
        self.watched.iter().any(|w| w.run == run)
    }

    /// What a backend without memory of `run` says about it from the world's state; runs still
    /// running are watched from now on.
    fn adopt(&mut self, world: &World, launch: &Launch) -> Observation {
        let run = launch.run;
        let Some(r) = world.find(run) else {
            return Observation::LaunchFailed {
                run,
                error: "never launched: the backend has no record of this run".to_string(),
            };
        };
        match &r.run.state {
            FakeRunState::Running => {
                self.watched.push(Watch {
                    run,
                    started_reported: true,
                    adopted: true,
                    done: false,
                });
                Observation::Started { run, pids: r.run.pids.clone() }
            }
            FakeRunState::Exited { code, detail } if r.exit_learned => {
                Observation::Exited { run, code: *code, detail: detail.clone() }
            }
            FakeRunState::Exited { .. } => {
                Observation::Exited { run, code: None, detail: DETAIL_UNKNOWN.to_string() }
            }
            FakeRunState::LaunchFailed { error } => {
                Observation::LaunchFailed { run, error: error.clone() }
            }
        }
    }

    /// Why `launch` cannot start, if it cannot.
    fn refusal(world: &mut World, launch: &Launch) -> Option<String> {
        if let Some(error) = world.fail_next_launch.take() {
            return Some(error);
        }
        let Some(program) = launch.command.first() else {
            return Some("empty command: nothing to run".to_string());
        };
        if world.missing_programs.contains(program) {
            return Some(format!("program {program:?} not found"));
        }
        if launch.members.is_empty() {
            return Some("no members to launch".to_string());
        }
        for (i, member) in launch.members.iter().enumerate() {
            if !world.nodes.iter().any(|n| n.name == member.node) {
                return Some(format!("member {i}: unknown node {:?}", member.node));
            }
        }
        None
    }
}

impl Backend for FakeBackend {
    fn name(&self) -> &str {
        "fake"
    }

    fn inventory(&mut self) -> Result<Vec<NodeSpec>, BackendError> {
        self.reachable()?;
        Ok(lock(&self.world).nodes.clone())
    }

    fn launch(&mut self, launch: &Launch) -> Result<(), BackendError> {
        self.reachable()?;
        if self.watching(launch.run) {
            return Ok(());
        }
        let world = Arc::clone(&self.world);
        let mut world = lock(&world);
        if world.find(launch.run).is_some() {
            // Launched by an earlier daemon life: adopt instead of starting it twice.
            let observation = self.adopt(&world, launch);
            self.pending.push(observation);
            return Ok(());
        }
        let adopted = launch.adopt.as_ref().map(|h| world.foreign.remove(h).ok_or(h));
        let refusal = match adopted {
            Some(Err(handle)) => Some(format!(
                "no foreign work {handle:?} to take over: it ended or was taken over before"
            )),
            Some(Ok(_)) => None,
            None => Self::refusal(&mut world, launch),
        };
        let lost = if refusal.is_none() { world.lose_next_launch.take() } else { None };
        // A lost launch never started: its watch reports the end alone.
        let never_started = lost.is_some();
        let (state, pids) = match (refusal, lost) {
            (Some(error), _) => (FakeRunState::LaunchFailed { error }, Vec::new()),
            (None, Some(detail)) => (FakeRunState::Exited { code: None, detail }, Vec::new()),
            (None, None) => {
                let first = world.next_pid;
                let count = u32::try_from(launch.members.len()).unwrap_or(u32::MAX);
                world.next_pid = first.saturating_add(count);
                (FakeRunState::Running, (first..first.saturating_add(count)).collect())
            }
        };
        let place = world.runs.len();
        world.places.entry(launch.run).or_insert(place);
        world.runs.push(WorldRun {
            run: FakeRun { launch: launch.clone(), state, signals: Vec::new(), pids },
            ignored: BTreeSet::new(),
            exit_learned: false,
        });
        self.watched.push(Watch {
            run: launch.run,
            started_reported: never_started,
            adopted: false,
            done: false,
        });
        Ok(())
    }

    fn signal(&mut self, run: RunId, signal: StopSignal) -> Result<(), BackendError> {
        self.reachable()?;
        if !self.watching(run) {
            return Err(BackendError::UnknownRun { run });
        }
        let mut world = lock(&self.world);
        let Some(r) = world.find_mut(run) else {
            return Err(BackendError::UnknownRun { run });
        };
        if r.run.state != FakeRunState::Running {
            return Ok(());
        }
        r.run.signals.push(signal);
        let ends = matches!(signal, StopSignal::Terminate | StopSignal::Kill)
            && !r.ignored.contains(&signal.into());
        if ends {
            r.run.state = FakeRunState::Exited { code: None, detail: DETAIL_SIGNALLED.to_string() };
        }
        Ok(())
    }

    fn poll(&mut self) -> Result<Vec<Observation>, BackendError> {
        self.reachable()?;
        let mut world = lock(&self.world);
        if world.failing_polls > 0 {
            world.failing_polls -= 1;
            return Err(BackendError::Io("squeue: status query failed (injected)".into()));
        }
        let mut observations = std::mem::take(&mut self.pending);
        for watch in self.watched.iter_mut().filter(|w| !w.done) {
            let Some(r) = world.find_mut(watch.run) else { continue };
            let run = watch.run;
            if let FakeRunState::LaunchFailed { error } = &r.run.state {
                observations.push(Observation::LaunchFailed { run, error: error.clone() });
                watch.done = true;
                continue;
            }
            if !watch.started_reported {
                observations.push(Observation::Started { run, pids: r.run.pids.clone() });
                watch.started_reported = true;
            }
            if let FakeRunState::Exited { code, detail } = &r.run.state {
                if watch.adopted {
                    observations.push(Observation::Exited {
                        run,
                        code: None,
                        detail: DETAIL_UNKNOWN.to_string(),
                    });
                } else {
                    observations.push(Observation::Exited {
                        run,
                        code: *code,
                        detail: detail.clone(),
                    });
                    r.exit_learned = true;
                }
                watch.done = true;
            }
        }
        Ok(observations)
    }

    fn watch_cluster(&mut self) -> Result<ClusterNews, BackendError> {
        self.reachable()?;
        let world = lock(&self.world);
        let nodes = world
            .nodes
            .iter()
            .map(|n| NodeStatus {
                node: n.name.clone(),
                usable: !world.unusable.contains_key(&n.name),
                reason: world.unusable.get(&n.name).cloned().unwrap_or_else(|| "idle".into()),
            })
            .collect();
        Ok(ClusterNews {
            inventory: Some(world.nodes.clone()),
            nodes,
            foreign: world.foreign.values().cloned().collect(),
            beside: world.beside.values().cloned().collect(),
        })
    }

    /// Like Slurm: the run stops (reported `Exited` with code `None`) and `next` is launched
    /// later as usual. Refused unless the test called [`FakeControl::support_requeue`].
    fn requeue(&mut self, run: RunId, next: RunId) -> Result<bool, BackendError> {
        self.reachable()?;
        if !self.watching(run) {
            return Err(BackendError::UnknownRun { run });
        }
        let mut world = lock(&self.world);
        if !world.requeue_supported {
            return Ok(false);
        }
        world.requeues.push((run, next));
        if let Some(r) = world.find_mut(run).filter(|r| r.run.state == FakeRunState::Running) {
            r.run.state =
                FakeRunState::Exited { code: None, detail: format!("requeued as {next}") };
        }
        Ok(true)
    }

    fn allocated_devices(
        &mut self,
        runs: &[RunId],
    ) -> Result<Vec<(RunId, Vec<crate::MemberLaunch>)>, BackendError> {
        let world = lock(&self.world);
        Ok(runs.iter().filter_map(|r| Some((*r, world.bound.get(r)?.clone()))).collect())
    }

    fn member_pods(
        &mut self,
        runs: &[RunId],
    ) -> Result<Vec<(RunId, Vec<crate::PodRef>)>, BackendError> {
        self.reachable()?;
        let world = lock(&self.world);
        Ok(runs.iter().filter_map(|r| Some((*r, world.pods.get(r)?.clone()))).collect())
    }

    fn cancel_foreign(&mut self, handle: &str) -> Result<bool, BackendError> {
        self.reachable()?;
        Ok(lock(&self.world).foreign.remove(handle).is_some())
    }

    /// Running foreign work goes back to the queue, held: pending foreign work again.
    fn return_foreign(&mut self, handle: &str) -> Result<bool, BackendError> {
        self.reachable()?;
        let mut world = lock(&self.world);
        match world.foreign.get_mut(handle) {
            Some(work) => {
                work.running.clear();
                work.started_ms = None;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn explain_waiting(
        &mut self,
        reasons: &[(crate::Waiting, String)],
    ) -> Result<(), BackendError> {
        self.reachable()?;
        lock(&self.world).explained.extend(reasons.iter().cloned());
        Ok(())
    }

    fn recover(&mut self, runs: &[Launch]) -> Result<Vec<Observation>, BackendError> {
        self.reachable()?;
        let world = Arc::clone(&self.world);
        let world = lock(&world);
        let mut observations = Vec::new();
        for launch in runs {
            if let Some(watch) = self.watched.iter().find(|w| w.run == launch.run && !w.done) {
                // Still watched by this backend: nothing was lost; say where it stands.
                if let Some(r) = world.find(watch.run).filter(|_| watch.started_reported) {
                    observations
                        .push(Observation::Started { run: launch.run, pids: r.run.pids.clone() });
                }
                continue;
            }
            observations.push(self.adopt(&world, launch));
        }
        Ok(observations)
    }
}

impl FakeRun {
    pub fn is_running(&self) -> bool {
        self.state == FakeRunState::Running
    }
}

#[cfg(test)]
mod tests {
    //! The contract suite against the fake, with a harness that plays the programs: it reads
    //! each running run's command and moves the world as that program would, in steps of
    //! 100 ms of simulated time.

    use std::path::{Path, PathBuf};

    use std::collections::BTreeMap;

    use super::*;
    use crate::MemberLaunch;
    use crate::contract::{self, Harness};

    const STEP_MS: u64 = 100;

    struct FakeHarness {
        control: FakeControl,
        /// Held only to hand out; the suite asks for backends itself.
        first: Option<FakeBackend>,
        now_ms: u64,
        started_ms: BTreeMap<RunId, u64>,
        dir: tempfile::TempDir,
    }

    fn node(name: &str) -> NodeSpec {
        NodeSpec {
            name: name.to_string(),
            cpu_millis: 8000,
            memory_mib: 65536,
            labels: BTreeMap::new(),
            pool: None,
            rack: None,
            devices: Vec::new(),
        }
    }

    impl FakeHarness {
        fn new() -> Self {
            let (backend, control) = FakeBackend::new(vec![node("n1")]);
            control.set_missing_program("no-such-program");
            FakeHarness {
                control,
                first: Some(backend),
                now_ms: 0,
                started_ms: BTreeMap::new(),
                dir: tempfile::tempdir().expect("temp dir for the fake harness"),
            }
        }

        fn touch(path: &str) {
            std::fs::write(path, b"").expect("marker file in the harness's temp dir");
        }

        /// One step of the simulated programs.
        fn step(&mut self) {
            self.now_ms += STEP_MS;
            for r in self.control.runs().into_iter().filter(FakeRun::is_running) {
                let run = r.launch.run;
                let started = *self.started_ms.entry(run).or_insert(self.now_ms);
                let args: Vec<&str> = r.launch.command.iter().map(String::as_str).collect();
                match args.as_slice() {
                    ["sleep", seconds] => {
                        let seconds: u64 = seconds.parse().expect("sleep takes seconds");
                        if self.now_ms - started >= seconds * 1000 {
                            self.control.finish(run, 0);
                        }
                    }
                    ["exit", code] => {
                        self.control.finish(run, code.parse().expect("exit takes a code"));
                    }
                    ["trap-checkpoint", ready, marker] => {
                        Self::touch(ready);
                        if r.signals.contains(&StopSignal::Checkpoint) {
                            Self::touch(marker);
                            self.control.finish(run, 0);
                        }
                    }
                    ["ignore-terminate", ready] => {
                        self.control.ignore_signal(run, StopSignal::Terminate);
                        Self::touch(ready);
                    }
                    other => panic!("the fake harness has no program {other:?}"),
                }
            }
        }
    }

    fn path_arg(p: &Path) -> String {
        p.to_str().expect("temp paths are UTF-8").to_string()
    }

    impl Harness for FakeHarness {
        type B = FakeBackend;

        fn backend(&mut self) -> FakeBackend {
            self.first.take().unwrap_or_else(|| self.control.backend())
        }
        fn node(&self) -> String {
            "n1".to_string()
        }
        fn program_sleep(&self, seconds: u32) -> Vec<String> {
            vec!["sleep".to_string(), seconds.to_string()]
        }
        fn program_exit(&self, code: i32) -> Vec<String> {
            vec!["exit".to_string(), code.to_string()]
        }
        fn program_trap_checkpoint(&self, ready: &Path, marker: &Path) -> Vec<String> {
            vec!["trap-checkpoint".to_string(), path_arg(ready), path_arg(marker)]
        }
        fn program_ignore_terminate(&self, ready: &Path) -> Vec<String> {
            vec!["ignore-terminate".to_string(), path_arg(ready)]
        }
        fn program_missing(&self) -> Vec<String> {
            vec!["no-such-program".to_string()]
        }
        fn settle(&mut self) {
            self.step();
        }
        fn pass_time(&mut self, seconds: u32) {
            for _ in 0..(u64::from(seconds) * 1000 / STEP_MS) {
                self.step();
            }
        }
        fn tmp_dir(&self) -> PathBuf {
            self.dir.path().to_path_buf()
        }
    }

    #[test]
    fn contract_run_all_on_one_harness() {
        contract::run_all(&mut FakeHarness::new());
    }

    #[test]
    fn contract_rules_each_on_a_fresh_harness() {
        for (name, rule) in contract::rules::<FakeHarness>() {
            let mut h = FakeHarness::new();
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rule(&mut h)));
            assert!(result.is_ok(), "contract rule {name} failed on the fake");
        }
    }

    fn launch(workload: u64, command: &[&str]) -> Launch {
        Launch {
            run: RunId { workload, attempt: 1 },
            command: command.iter().map(|s| s.to_string()).collect(),
            env: BTreeMap::new(),
            members: vec![
                MemberLaunch { node: "n1".to_string(), devices: Vec::new() },
                MemberLaunch { node: "n1".to_string(), devices: Vec::new() },
            ],
            log_dir: PathBuf::from("/nonexistent"),
            adopt: None,
            resources: Default::default(),
        }
    }

    #[test]
    fn fail_next_launch_fails_only_the_next() {
        let (mut backend, control) = FakeBackend::new(vec![node("n1")]);
        control.fail_next_launch("no GPUs left");
        backend.launch(&launch(1, &["train"])).expect("launch");
        backend.launch(&launch(2, &["train"])).expect("launch");
        let got = backend.poll().expect("poll");
        assert_eq!(
            got,
            vec![
                Observation::LaunchFailed {
                    run: RunId { workload: 1, attempt: 1 },
                    error: "no GPUs left".to_string()
                },
                Observation::Started {
                    run: RunId { workload: 2, attempt: 1 },
                    pids: vec![1000, 1001]
                },
            ]
        );
    }

    #[test]
    fn a_lost_launch_is_accepted_and_then_reported_ended() {
        let (mut backend, control) = FakeBackend::new(vec![node("n1")]);
        control.lose_next_launch("lost by the cluster");
        backend.launch(&launch(1, &["train"])).expect("the launch is accepted");
        backend.launch(&launch(2, &["train"])).expect("launch");
        let got = backend.poll().expect("poll");
        assert_eq!(
            got,
            vec![
                Observation::Exited {
                    run: RunId { workload: 1, attempt: 1 },
                    code: None,
                    detail: "lost by the cluster".to_string()
                },
                Observation::Started {
                    run: RunId { workload: 2, attempt: 1 },
                    pids: vec![1000, 1001]
                },
            ]
        );
    }

    #[test]
    fn unknown_node_fails_the_launch() {
        let (mut backend, _control) = FakeBackend::new(vec![node("other")]);
        backend.launch(&launch(1, &["train"])).expect("launch");
        let got = backend.poll().expect("poll");
        assert!(
            matches!(got.as_slice(), [Observation::LaunchFailed { error, .. }] if error.contains("unknown node \"n1\"")),
            "{got:?}"
        );
    }

    #[test]
    fn signals_are_recorded_in_order_and_checkpoint_does_not_end() {
        let (mut backend, control) = FakeBackend::new(vec![node("n1")]);
        let l = launch(1, &["train"]);
        backend.launch(&l).expect("launch");
        backend.poll().expect("poll");
        backend.signal(l.run, StopSignal::Checkpoint).expect("signal");
        assert!(control.run(l.run).expect("launched").is_running());
        control.ignore_signal(l.run, StopSignal::Terminate);
        backend.signal(l.run, StopSignal::Terminate).expect("signal");
        assert!(control.run(l.run).expect("launched").is_running());
        backend.signal(l.run, StopSignal::Kill).expect("signal");
        backend.signal(l.run, StopSignal::Kill).expect("a second Kill after the end is Ok");
        assert_eq!(
            control.signals(l.run),
            vec![StopSignal::Checkpoint, StopSignal::Terminate, StopSignal::Kill]
        );
        assert_eq!(
            backend.poll().expect("poll"),
            vec![Observation::Exited {
                run: l.run,
                code: None,
                detail: DETAIL_SIGNALLED.to_string()
            }]
        );
    }

    #[test]
    fn finish_sets_the_code_and_is_false_for_ended_runs() {
        let (mut backend, control) = FakeBackend::new(vec![node("n1")]);
        let l = launch(1, &["train"]);
        backend.launch(&l).expect("launch");
        assert!(control.finish(l.run, 7));
        assert!(!control.finish(l.run, 8));
        assert!(!control.finish(RunId { workload: 9, attempt: 1 }, 0));
        let got = backend.poll().expect("poll");
        assert!(
            matches!(
                got.as_slice(),
                [Observation::Started { .. }, Observation::Exited { code: Some(7), .. }]
            ),
            "{got:?}"
        );
    }

    #[test]
    fn adopted_run_exit_is_unknown() {
        let (mut backend, control) = FakeBackend::new(vec![node("n1")]);
        let l = launch(1, &["train"]);
        backend.launch(&l).expect("launch");
        backend.poll().expect("poll");
        drop(backend);
        let mut backend = control.backend();
        let got = backend.recover(std::slice::from_ref(&l)).expect("recover");
        assert!(matches!(got.as_slice(), [Observation::Started { .. }]), "{got:?}");
        control.finish(l.run, 0);
        assert_eq!(
            backend.poll().expect("poll"),
            vec![Observation::Exited {
                run: l.run,
                code: None,
                detail: DETAIL_UNKNOWN.to_string()
            }]
        );
    }
}
