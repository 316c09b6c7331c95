//! A Slurm cluster as a backend (Slurm 22.05, `squeue`/`sinfo --json` data_parser v0.0.38).
//!
//! allot's queue is the gate: a run becomes one Slurm batch job, submitted held
//! (`sbatch --hold`) onto exactly the nodes allot chose (`--nodelist`, `--gres=gpu:TYPE:N` per
//! node) and then released, so Slurm's scheduler only starts what allot admitted. Releases are
//! batched: `launch` submits, and the next `poll` (or a signal of the run) releases every job
//! submitted since in one `scontrol release` — one command per admission round instead of one
//! per job. A job left held by a daemon that died in between is released when a restarted
//! daemon adopts it (`launch` or `recover`). The job is
//! named `<prefix>-<workload>.<attempt>` and its comment is `allot:<workload>.<attempt>`: that
//! is how launches stay idempotent and how a restarted daemon finds its runs (Slurm is the
//! state; this backend keeps no files).
//!
//! Observation polls `squeue` (`--Format` by default) with backoff (kept short while work
//! waits for GPUs, so that an end is seen soon) into a cache of jobs and turns state changes
//! into observations: `Started` only once Slurm reports the job RUNNING
//! (Slurm gives no pids to the daemon's host, so `pids` is empty), `Exited` with the program's
//! code from the job's wait status (`exit_code`), which Slurm keeps for `MinJobAge` after the
//! end.
//!
//! Terminate is Slurm's cancel (`scancel`: SIGTERM, SIGKILL after `KillWait`, CANCELLED in
//! accounting); the checkpoint signal and Kill go through `scancel --signal --full`, which
//! reaches the batch shell (without `--full` only job steps get them). One member runs as the batch shell itself (`exec`); several run as one
//! `srun` task each.
//!
//! Jobs submitted to Slurm directly are foreign work ([`Backend::watch_cluster`]): the gate
//! holds every pending one as soon as it is seen (`scontrol hold`: an administrator's hold
//! when allot runs as root or SlurmUser, which the job's user cannot undo), so Slurm never
//! starts it; a launch that adopts it (`Launch::adopt` = the job id) moves it onto allot's
//! nodes (`scontrol update NumNodes=N-N ReqNodeList=… TresPerNode=gres:gpu:TYPE:G`) and
//! releases it, or, if it already runs, watches it as the run. A job taken over keeps its
//! name and comment and is found by its id. Pre-emption with requeue is `scontrol
//! requeuehold`: the job stops and waits, held, for the launch of the next attempt, which
//! moves and releases it as above (same job id, Slurm's restart count + 1); an adopted job
//! requeued so gets the comment `allot:<next's job name>`, the only trace a restarted daemon
//! can find it by. [`jobcomp`] reads Slurm's job completion log and [`sacct`] its accounting
//! database (slurmdbd) for accounting cross-checks.

mod gate;
pub mod jobcomp;
pub mod parse;
pub mod runner;
pub mod sacct;

#[allow(clippy::disallowed_methods)] // backoff deadlines of the poller are real time
mod clock {
    pub fn now() -> std::time::Instant {
        std::time::Instant::now()
    }
}

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use allot_backend::{
    Backend, BackendError, ClusterNews, DeviceAssignment, ForeignWork, Launch, MemberLaunch,
    NodeStatus, Observation, RunId, StopSignal, Vendor, Waiting,
};
use allot_core::{DeviceSpec, NodeSpec};

pub use gate::{GATE_SCRIPT, gate_script};
pub use jobcomp::{JobcompError, JobcompGpuHours, JobcompRecord, jobcomp_gpu_hours, parse_jobcomp};
pub use parse::{Gres, Partition, SinfoNode, SqueueJob};
pub use runner::{CommandError, Runner, Tool};
pub use sacct::{SACCT_FORMAT, parse_sacct, sacct_args};

use allot_backend::account::Account;

/// The launch environment variable naming the Slurm account (allot's project) of a run.
pub const ACCOUNT_ENV: &str = "ALLOT_PROJECT";

/// The launch environment variable naming the allot user who submitted the workload: with
/// [`SlurmConfig::run_as_submitter`], the Unix account its job runs as.
pub use allot_backend::account::USER_ENV;

/// What a refused account lookup tells the operator to do instead.
const RUN_AS_SUBMITTER_FIX: &str = "run allot without --slurm-run-as-submitter";

/// [`Backend::allocated_devices`] asks `scontrol show job -d` once per newly started job
/// (~11 ms each) for up to this many, or one per 40 jobs in the queue if more; beyond, one
/// `squeue --json` for all (~0.27 ms per job in the queue: 283 ms at 1,087 jobs).
const DETAILS_PER_POLL: usize = 8;
const QUEUE_JOBS_PER_DETAIL: usize = 40;

/// Where a run's batch output goes: its member's log for one member, `batch.log` for a gang
/// (whose members write their own through `srun --output`).
fn batch_log(launch: &Launch) -> std::path::PathBuf {
    if launch.members.len() == 1 {
        launch.log_dir.join("member-0.log")
    } else {
        launch.log_dir.join("batch.log")
    }
}

/// The batch script of every run: its arguments are the command, so nothing is interpolated
/// into shell text. One member: the batch shell becomes the program, so `scancel --full`
/// signals reach it. Several: one `srun` task per member, each with its own log.
const BATCH_SCRIPT: &str = r#"#!/bin/sh
# Written by allot's Slurm backend; the arguments are the workload's command.
if [ "${ALLOT_SLURM_TASKS:-1}" -le 1 ]; then exec "$@"; fi
exec srun --kill-on-bad-exit=1 --ntasks="$ALLOT_SLURM_TASKS" \
  --ntasks-per-node="$ALLOT_SLURM_TASKS_PER_NODE" \
  --output="$(pwd)/member-%t.log" "$@"
"#;

#[derive(Clone, Debug)]
pub struct SlurmConfig {
    pub runner: Runner,
    /// Job names are `<prefix>-<workload>.<attempt>`; jobs without it are foreign.
    pub job_prefix: String,
    /// `--partition` of every job; `None` uses Slurm's default partition.
    pub partition: Option<String>,
    /// `--account` when a launch names no project (`ALLOT_PROJECT` in its env).
    pub default_account: Option<String>,
    /// Partitions allot leaves alone: their nodes are not in the inventory (unless also in a
    /// managed partition) and their jobs are not foreign jobs to import.
    pub unmanaged_partitions: BTreeSet<String>,
    /// Signal name for `StopSignal::Checkpoint` (`USR1`).
    pub checkpoint_signal: String,
    /// Submit held and release (allot is the gate); off submits straight (for comparisons).
    pub submit_held: bool,
    /// Check on this host that the program exists before submitting (sites whose submit host
    /// has the compute nodes' software); a program missing on a node ends with code 127.
    pub verify_program: bool,
    /// Shortest and longest pause between two `squeue` calls of `poll` (it backs off while
    /// nothing changes and starts again from the shortest after a launch or signal).
    pub poll_min: Duration,
    pub poll_max: Duration,
    /// The longest pause while work waits for GPUs (`Backend::set_work_waiting`): the gate
    /// lets nothing start without allot, so a job's end seen late leaves its GPUs idle that
    /// long (on the test cluster, ends 2.5 s apart: a freed GPU taken after 1.85 s on average
    /// with 5 s, 0.57 s with 250 ms, ~1 s under Slurm's own scheduler; docs/benchmarks.md).
    pub poll_while_waiting: Duration,
    /// How `poll` (and `recover`, `launch`'s look-up) reads the queue. The foreign listing of
    /// `watch_cluster` always uses `squeue --Format`; GPU indices come from `squeue --json`
    /// (running foreign jobs, `foreign_jobs`, and `allocated_devices` for many starts) or
    /// `scontrol show job -d` (`allocated_devices` for a few).
    pub poll_query: PollQuery,
    /// GPU memory by GRES type (`h100` → 81559), for the inventory's devices; unknown: 0.
    pub gpu_memory_mib: BTreeMap<String, u64>,
    /// More `sbatch` arguments for every job (a QOS, a time limit, `--exclusive`…).
    pub extra_sbatch_args: Vec<String>,
    /// Run each job as the allot user who submitted the workload (`sbatch --uid --gid`; the
    /// daemon must run as root): that user needs a Unix account of the same name on this host
    /// and the nodes, and is never root. Its log directory and probe files are handed to it.
    /// Off: every job runs as the daemon's user.
    pub run_as_submitter: bool,
}

impl SlurmConfig {
    pub fn new() -> Self {
        SlurmConfig {
            runner: Runner::new(),
            job_prefix: "allot".to_string(),
            partition: None,
            default_account: None,
            unmanaged_partitions: BTreeSet::new(),
            checkpoint_signal: "USR1".to_string(),
            submit_held: true,
            verify_program: true,
            poll_min: Duration::from_millis(250),
            poll_max: Duration::from_secs(5),
            poll_while_waiting: Duration::from_millis(250),
            poll_query: PollQuery::Format,
            gpu_memory_mib: BTreeMap::new(),
            extra_sbatch_args: Vec::new(),
            run_as_submitter: false,
        }
    }
}

impl Default for SlurmConfig {
    fn default() -> Self {
        SlurmConfig::new()
    }
}

/// How the queue is read for observation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollQuery {
    /// `squeue --noheader --states=all --Format=…` with only the fields observation needs:
    /// about 10× cheaper than JSON (29 ms against 356 ms for 520 jobs on the test cluster),
    /// since `squeue --json` ignores filters and prints every field of every job in memory.
    Format,
    /// `squeue --json` (data_parser v0.0.38).
    Json,
}

/// A job on the cluster that allot did not submit, for the daemon to import as running work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForeignJob {
    pub job_id: u64,
    pub name: String,
    /// The Slurm account: the project it is attributed to.
    pub account: String,
    pub partition: String,
    pub user: String,
    /// PENDING, RUNNING, …
    pub state: String,
    /// GPUs per node: the held ones (with Slurm's device indices) while running, the requested
    /// count per node (no node, no indices) while pending.
    pub gpus: Vec<ForeignGpus>,
    /// When it started (seconds since the epoch), if it runs.
    pub start_time: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForeignGpus {
    /// Empty for a pending job's request.
    pub node: String,
    pub gpu_type: Option<String>,
    pub count: u64,
    pub indices: Vec<u32>,
}

/// What the backend knows of one run.
#[derive(Clone, Debug)]
struct Tracked {
    /// 0 when the launch failed before a job existed.
    job_id: u64,
    started: bool,
    ended: bool,
    /// `Started` waits until Slurm's restart count reaches this (a run requeued as this one
    /// must not be taken as started while the previous run still runs).
    min_restarts: u64,
    /// This run was requeued as another run of the same job: it ends when the job stops
    /// running or restarts.
    requeued_at: Option<u64>,
    /// The job was a foreign job that a launch took over (`Launch::adopt`): never cancelled
    /// for a failed release, found by id.
    adopted: bool,
    /// Requeued held for this run: `launch` of this run moves it onto the launch's nodes and
    /// releases it.
    awaiting_launch: bool,
}

impl Tracked {
    fn new(job_id: u64) -> Tracked {
        Tracked {
            job_id,
            started: false,
            ended: false,
            min_restarts: 0,
            requeued_at: None,
            adopted: false,
            awaiting_launch: false,
        }
    }

    fn failed() -> Tracked {
        Tracked { ended: true, ..Tracked::new(0) }
    }
}

#[derive(Debug)]
pub struct SlurmBackend {
    config: SlurmConfig,
    runs: BTreeMap<RunId, Tracked>,
    /// Observations decided outside `poll`, reported by the next `poll` first.
    pending: Vec<Observation>,
    /// The last read of the queue, by job id; `None` before the first.
    jobs: Option<BTreeMap<u64, SqueueJob>>,
    /// GRES type of each node's GPUs, from the last inventory.
    gpu_types: BTreeMap<String, Option<String>>,
    next_poll: Option<Instant>,
    interval: Duration,
    /// Work waits for GPUs (`Backend::set_work_waiting`): the pause is kept short.
    work_waiting: bool,
    /// Jobs submitted held and not yet released, with their runs.
    to_release: BTreeMap<u64, RunId>,
    /// Launches of runs whose held job is to be moved onto the launch's nodes and released
    /// once Slurm reports it pending (a requeued job, one found held after a restart).
    to_place: BTreeMap<RunId, Launch>,
    /// GPUs of running foreign jobs by (job id, restarts), from `squeue --json` (the only
    /// listing with device indices): read once per job start, not on every look.
    foreign_gpus: BTreeMap<(u64, u64), (Vec<MemberLaunch>, u64)>,
    /// Jobs whose admin comment says why allot keeps them waiting (`explain_waiting`): told
    /// "admitted" when released.
    explained: BTreeSet<u64>,
    /// Slurm refused an admin comment (the daemon is not a Slurm administrator): why, said once.
    explain_refused: Option<String>,
}

/// Why `sbatch` did not submit a launch.
#[derive(Debug)]
enum SubmitError {
    /// slurmctld did not answer: transient.
    Unreachable(String),
    /// Slurm (or allot's checks before it) refused the request, naming why.
    Refused(String),
}

/// A failed Slurm command as the daemon sees it: transient when slurmctld did not answer.
fn io(e: CommandError) -> BackendError {
    if e.is_unreachable() {
        BackendError::Unreachable(e.to_string())
    } else {
        BackendError::Io(e.to_string())
    }
}

/// The pause before the next look at the queue, after a look that saw a change or not:
/// from the shortest again after a change, else doubled up to the longest, and never longer
/// than `poll_while_waiting` while work waits for GPUs.
fn next_interval(
    config: &SlurmConfig,
    current: Duration,
    changed: bool,
    work_waiting: bool,
) -> Duration {
    if changed {
        return config.poll_min;
    }
    let backed_off = (current * 2).min(config.poll_max);
    if work_waiting { backed_off.min(config.poll_while_waiting) } else { backed_off }
}

impl SlurmBackend {
    pub fn new(config: SlurmConfig) -> SlurmBackend {
        let interval = config.poll_min;
        SlurmBackend {
            config,
            runs: BTreeMap::new(),
            pending: Vec::new(),
            jobs: None,
            gpu_types: BTreeMap::new(),
            next_poll: None,
            interval,
            work_waiting: false,
            to_release: BTreeMap::new(),
            to_place: BTreeMap::new(),
            foreign_gpus: BTreeMap::new(),
            explained: BTreeSet::new(),
            explain_refused: None,
        }
    }

    pub fn config(&self) -> &SlurmConfig {
        &self.config
    }

    /// The Slurm job name of a run.
    pub fn job_name(&self, run: RunId) -> String {
        format!("{}-{}", self.config.job_prefix, run)
    }

    /// The Slurm job id of a run, when known.
    pub fn job_id(&self, run: RunId) -> Option<u64> {
        self.runs.get(&run).map(|t| t.job_id).filter(|id| *id != 0)
    }

    /// The GPUs Slurm gave a running run, per node with Slurm's device indices (one
    /// `squeue --json`). Slurm picks the indices on each node itself: they may differ from the
    /// launch's `DeviceAssignment::index`, and telemetry attribution should use these. `None`
    /// when the run is unknown or not running.
    pub fn allocated_gpus(
        &mut self,
        run: RunId,
    ) -> Result<Option<Vec<(String, Gres)>>, BackendError> {
        let Some(id) = self.job_id(run) else { return Ok(None) };
        self.refresh_json()?;
        let job = self.jobs.as_ref().and_then(|j| j.get(&id));
        Ok(job.filter(|j| j.is_running()).map(SqueueJob::gpus_per_node))
    }

    fn run(&self, tool: Tool, args: &[String]) -> Result<runner::Output, BackendError> {
        self.config.runner.run(tool, args, &BTreeMap::new()).map_err(io)
    }

    /// An error a `--json` listing reported. Slurm 22.05 says only "Unspecified error" when
    /// the controller does not answer (and exits 0): `scontrol ping` tells that case, which is
    /// transient, from an error that is not.
    fn reported_error(&self, error: String) -> BackendError {
        let down =
            match self.config.runner.run(Tool::Scontrol, &["ping".to_string()], &BTreeMap::new()) {
                Ok(out) => out.stdout.contains("DOWN"),
                // `scontrol ping` exits 1 when a controller is DOWN (the words go to stdout).
                Err(e) => !e.message.starts_with("cannot start it"),
            };
        if down {
            BackendError::Unreachable(format!("{error} (scontrol ping: slurmctld is DOWN)"))
        } else {
            BackendError::Io(error)
        }
    }

    /// Reads the queue into the cache, the way `poll_query` says.
    fn refresh(&mut self) -> Result<(), BackendError> {
        match self.config.poll_query {
            PollQuery::Json => self.refresh_json(),
            PollQuery::Format => self.refresh_format(),
        }
    }

    /// Reads `squeue --Format` (the fields observation and the foreign listing need).
    fn refresh_format(&mut self) -> Result<(), BackendError> {
        let args = [
            "--noheader".to_string(),
            "--states=all".to_string(),
            format!("--Format={}", parse::SQUEUE_FORMAT),
        ];
        let out = self.run(Tool::Squeue, &args)?;
        let jobs = parse::parse_squeue_format(&out.stdout);
        self.jobs = Some(jobs.into_iter().map(|j| (j.job_id, j)).collect());
        Ok(())
    }

    /// Reads `squeue --json` (every field) into the cache.
    fn refresh_json(&mut self) -> Result<(), BackendError> {
        let out = self.run(Tool::Squeue, &["--json".to_string()])?;
        let jobs = parse::parse_squeue(&out.stdout).map_err(|e| self.reported_error(e.0))?;
        self.jobs = Some(jobs.into_iter().map(|j| (j.job_id, j)).collect());
        Ok(())
    }

    fn ensure_loaded(&mut self) -> Result<(), BackendError> {
        if self.jobs.is_none() {
            self.refresh()?;
        }
        Ok(())
    }

    /// The newest job in the cache named for `run`: allot's own by name, an adopted foreign job
    /// requeued for `run` by its comment (`allot:<job name>`).
    fn find(&self, run: RunId) -> Option<&SqueueJob> {
        let name = self.job_name(run);
        let comment = format!("allot:{name}");
        self.jobs.as_ref()?.values().rev().find(|j| j.name == name || j.comment == comment)
    }

    /// The later attempt of `run`'s workload that a job in the cache was requeued for (its
    /// name, or an adopted job's comment, says so), with the job id.
    fn requeued_as(&self, run: RunId) -> Option<(RunId, u64)> {
        let prefix = format!("{}-", self.config.job_prefix);
        let attempt_of = |text: &str| {
            let (w, a) = text.strip_prefix(&prefix)?.split_once('.')?;
            let next = RunId { workload: w.parse().ok()?, attempt: a.parse().ok()? };
            (next.workload == run.workload && next.attempt > run.attempt).then_some(next)
        };
        self.jobs.as_ref()?.values().rev().find_map(|j| {
            let by_comment = j.comment.strip_prefix("allot:").and_then(attempt_of);
            attempt_of(&j.name).or(by_comment).map(|next| (next, j.job_id))
        })
    }

    /// The job of a launch: the one it took over (`adopt`), else the one named for its run.
    fn find_for(&self, launch: &Launch) -> Option<&SqueueJob> {
        let adopted = launch.adopt.as_ref().and_then(|h| h.trim().parse::<u64>().ok());
        match adopted.and_then(|id| self.jobs.as_ref()?.get(&id)) {
            Some(job) => Some(job),
            None => self.find(launch.run),
        }
    }

    fn is_ours(&self, job: &SqueueJob) -> bool {
        job.name.starts_with(&format!("{}-", self.config.job_prefix))
            || job.comment.starts_with("allot:")
    }

    fn poll_soon(&mut self) {
        self.interval = self.config.poll_min;
        self.next_poll = None;
    }

    /// The cluster's nodes as `sinfo --json` reports them (every partition), for node status:
    /// a node that is not [`SinfoNode::usable`] (down, drained, draining, not responding) is
    /// one the daemon should take out of placement (an engine event), and back when usable.
    pub fn nodes(&mut self) -> Result<Vec<SinfoNode>, BackendError> {
        let out = self.run(Tool::Sinfo, &["--json".to_string()])?;
        let mut nodes = parse::parse_sinfo(&out.stdout).map_err(|e| self.reported_error(e.0))?;
        let mut seen = BTreeSet::new();
        nodes.retain(|n| seen.insert(n.name.clone()));
        Ok(nodes)
    }

    /// The cluster's partitions (`scontrol show partition -o`).
    pub fn partitions(&mut self) -> Result<Vec<Partition>, BackendError> {
        let out = self.run(Tool::Scontrol, &["show".into(), "partition".into(), "-o".into()])?;
        Ok(parse::parse_partitions(&out.stdout))
    }

    /// Whether allot governs a node: in the configured partition (when set) and in at least
    /// one partition that is not unmanaged.
    fn managed_node(&self, node: &SinfoNode) -> bool {
        let in_partition =
            self.config.partition.as_ref().is_none_or(|p| node.partitions.contains(p));
        in_partition
            && (node.partitions.is_empty()
                || node.partitions.iter().any(|p| !self.config.unmanaged_partitions.contains(p)))
    }

    /// Jobs on the cluster that allot did not submit and that are not over (pending or
    /// running), outside the unmanaged partitions, from `squeue --json`: a look only (nothing
    /// is held; [`SlurmBackend::foreign_work`] is the gate).
    pub fn foreign_jobs(&mut self) -> Result<Vec<ForeignJob>, BackendError> {
        self.refresh_json()?;
        let jobs = self.jobs.as_ref().map(|j| j.values().collect::<Vec<_>>()).unwrap_or_default();
        let unmanaged = &self.config.unmanaged_partitions;
        Ok(jobs
            .into_iter()
            .filter(|j| !self.is_ours(j) && !j.is_terminal())
            // A pending job may list several partitions: unmanaged only if all are.
            .filter(|j| !j.partition.split(',').all(|p| unmanaged.contains(p)))
            .map(|j| {
                let gpus = if j.is_running() {
                    j.gpus_per_node()
                        .into_iter()
                        .map(|(node, g)| ForeignGpus {
                            node,
                            gpu_type: g.gres_type,
                            count: g.count,
                            indices: g.indices,
                        })
                        .collect()
                } else {
                    j.gpu_request_per_node()
                        .ok()
                        .flatten()
                        .into_iter()
                        .map(|g| ForeignGpus {
                            node: String::new(),
                            gpu_type: g.gres_type,
                            count: g.count,
                            indices: Vec::new(),
                        })
                        .collect()
                };
                ForeignJob {
                    job_id: j.job_id,
                    name: j.name.clone(),
                    account: j.account.clone(),
                    partition: j.partition.clone(),
                    user: j.user.clone(),
                    state: j.state.clone(),
                    gpus,
                    start_time: j.is_running().then_some(j.start_time),
                }
            })
            .collect())
    }

    /// Foreign work now, for [`Backend::watch_cluster`]: every job that allot did not submit,
    /// no launch took over and that is pending or running outside the unmanaged partitions.
    /// The gate: every pending one not yet held is held at once (`scontrol hold`, one call),
    /// so that Slurm never starts it; a launch that adopts it releases it. A job its user held
    /// is reported too (held either way). Cost: one `squeue --Format` (the cheap listing),
    /// plus one `squeue --json` only when a running foreign job appeared whose GPU indices
    /// are not known yet.
    pub fn foreign_work(&mut self) -> Result<Vec<ForeignWork>, BackendError> {
        Ok(self.scan_foreign()?.0)
    }

    /// [`SlurmBackend::foreign_work`], and beside it the running jobs allot must not govern
    /// (every partition they name is unmanaged) with the GPUs they hold: on a node a managed
    /// partition shares, those GPUs are occupied ([`ClusterNews::beside`]).
    fn scan_foreign(&mut self) -> Result<(Vec<ForeignWork>, Vec<ForeignWork>), BackendError> {
        self.refresh_format()?;
        let tracked = self.tracked_jobs();
        let unmanaged = &self.config.unmanaged_partitions;
        // A pending job may list several partitions: unmanaged only if all are.
        let all_unmanaged = |j: &SqueueJob| j.partition.split(',').all(|p| unmanaged.contains(p));
        let (beside, foreign): (Vec<SqueueJob>, Vec<SqueueJob>) = self
            .jobs
            .iter()
            .flat_map(|j| j.values())
            .filter(|j| !self.is_ours(j) && !tracked.contains(&j.job_id))
            .filter(|j| j.is_pending() || j.is_running())
            .filter(|j| j.is_running() || !all_unmanaged(j))
            .cloned()
            .partition(all_unmanaged);
        let to_hold: Vec<u64> = foreign
            .iter()
            .filter(|j| j.state == "PENDING" && !j.is_held())
            .map(|j| j.job_id)
            .collect();
        if !to_hold.is_empty() {
            self.hold(&to_hold)?;
        }
        let running: BTreeSet<(u64, u64)> = foreign
            .iter()
            .chain(&beside)
            .filter(|j| j.is_running())
            .map(|j| (j.job_id, j.restarts))
            .collect();
        self.foreign_gpus.retain(|k, _| running.contains(k));
        if running.iter().any(|k| !self.foreign_gpus.contains_key(k)) {
            self.refresh_json()?;
            for j in self.jobs.iter().flat_map(|j| j.values()) {
                let key = (j.job_id, j.restarts);
                if running.contains(&key) && j.is_running() {
                    self.foreign_gpus.insert(key, (members_of(j), j.start_time));
                }
            }
        }
        let describe = |j: &SqueueJob| {
            let asked = j.gpu_request_per_node();
            let refusal = asked
                .as_ref()
                .err()
                .map(|why| format!("{why}; it stays held (cancel it and submit it again)"));
            let asked = asked.ok().flatten();
            let (running, started) = match self.foreign_gpus.get(&(j.job_id, j.restarts)) {
                Some((members, start)) if j.is_running() => {
                    (members.clone(), Some(start.saturating_mul(1000)))
                }
                // Started between the two listings: its nodes without device indices.
                _ if j.is_running() => (members_of(j), None),
                _ => (Vec::new(), None),
            };
            let nodes = if running.is_empty() { j.node_count } else { running.len() as u64 };
            ForeignWork {
                handle: j.job_id.to_string(),
                name: j.name.clone(),
                project: j.account.clone(),
                user: j.user.clone(),
                running,
                nodes: u32::try_from(nodes.max(1)).unwrap_or(u32::MAX),
                gpus_per_node: asked
                    .as_ref()
                    .map_or(0, |g| u32::try_from(g.count).unwrap_or(u32::MAX)),
                models: asked.and_then(|g| g.gres_type).into_iter().collect(),
                started_ms: started,
                // Running work is taken as it runs, whatever it asked.
                refusal: if j.is_pending() { refusal } else { None },
                intent: Default::default(),
            }
        };
        Ok((foreign.iter().map(describe).collect(), beside.iter().map(describe).collect()))
    }

    /// Requeues a running run as `next` (pre-emption with requeue): Slurm stops the job and
    /// puts it back in the queue held (`scontrol requeuehold`), as the same job id, so it does
    /// not start again on its own (on the old nodes); `launch` of `next` moves it onto the
    /// launch's nodes and releases it. `run` is reported `Exited` (code `None`) once the job
    /// stopped running, `next` `Started` when it runs again. allot's own jobs are renamed to
    /// `next` (name and comment); an adopted foreign job keeps its name and gets the comment
    /// `allot:<next's job name>`, the only way a restarted daemon (whose launch of `next` names
    /// no job) can find it. Send the checkpoint signal and wait the grace before calling this.
    pub fn requeue(&mut self, run: RunId, next: RunId) -> Result<(), BackendError> {
        self.ensure_known(run)?;
        if self.runs.contains_key(&next) {
            return Err(BackendError::Invalid(format!(
                "{next}: already known; requeue {run} as an attempt never launched"
            )));
        }
        let Some(t) = self.runs.get(&run).cloned() else {
            return Err(BackendError::UnknownRun { run });
        };
        if t.ended || t.job_id == 0 || t.requeued_at.is_some() {
            return Err(BackendError::Invalid(format!(
                "{run}: already ended; launch {next} instead of requeueing"
            )));
        }
        self.refresh()?;
        let restarts = self.jobs.as_ref().and_then(|j| j.get(&t.job_id)).map_or(0, |j| j.restarts);
        self.requeue_held(t.job_id)?;
        let id = t.job_id.to_string();
        let mut rename = vec!["update".to_string(), format!("jobid={id}")];
        if t.adopted {
            rename.push(format!("comment=allot:{}", self.job_name(next)));
        } else {
            rename.push(format!("name={}", self.job_name(next)));
            rename.push(format!("comment=allot:{next}"));
        }
        self.run(Tool::Scontrol, &rename)?;
        if let Some(old) = self.runs.get_mut(&run) {
            old.requeued_at = Some(restarts);
        }
        self.runs.insert(
            next,
            Tracked {
                min_restarts: restarts + 1,
                adopted: t.adopted,
                awaiting_launch: true,
                ..Tracked::new(t.job_id)
            },
        );
        self.poll_soon();
        Ok(())
    }

    /// `scontrol requeuehold` of a running job. Slurm refuses it for a job submitted
    /// `--no-requeue` (allot's own, and foreign ones that chose so): the flag is set for the
    /// requeue and put back after.
    fn requeue_held(&self, job_id: u64) -> Result<(), BackendError> {
        let id = job_id.to_string();
        let requeue = ["requeuehold".to_string(), id.clone()];
        match self.config.runner.run(Tool::Scontrol, &requeue, &BTreeMap::new()) {
            Ok(_) => Ok(()),
            Err(e) if e.stderr.contains("presently disabled") => {
                let flag = |on: &str| {
                    ["update".to_string(), format!("jobid={id}"), format!("requeue={on}")]
                };
                self.run(Tool::Scontrol, &flag("1"))?;
                let requeued = self.run(Tool::Scontrol, &requeue);
                self.run(Tool::Scontrol, &flag("0"))?;
                requeued.map(|_| ())
            }
            Err(e) => Err(io(e)),
        }
    }

    /// Moves a pending (held) job onto a launch's nodes — `NumNodes=N-N`, `ReqNodeList`, and
    /// `TresPerNode=gres:gpu[:TYPE]:G` when the members have GPUs — and queues its release
    /// with the next batch. With `own_output` (allot's own job requeued for this attempt), its
    /// output and working directory move to this attempt's log directory too: Slurm keeps
    /// the first attempt's `--output` and would truncate that log on the restart.
    fn place_and_release(
        &mut self,
        job_id: u64,
        launch: &Launch,
        own_output: bool,
    ) -> Result<(), String> {
        let shape = node_shape(launch);
        let nodes: Vec<&str> = shape.keys().map(String::as_str).collect();
        let gpus_per_node = shape.values().next().map_or(0, |s| s.1);
        let mut args = vec![
            "update".to_string(),
            format!("jobid={job_id}"),
            format!("NumNodes={0}-{0}", nodes.len()),
            format!("ReqNodeList={}", nodes.join(",")),
        ];
        if gpus_per_node > 0 {
            // Typed only as the job asked (see `asks_typed_gpus`); a job that asked no GPU
            // (allot's own ask by type) gets the node's type.
            let job = self.jobs.as_ref().and_then(|j| j.get(&job_id));
            let gpu_type = nodes
                .first()
                .and_then(|n| self.gpu_types.get(*n).cloned().flatten())
                .filter(|_| job.and_then(SqueueJob::asks_typed_gpus) != Some(false));
            args.push(match gpu_type {
                Some(t) => format!("TresPerNode=gres:gpu:{t}:{gpus_per_node}"),
                None => format!("TresPerNode=gres:gpu:{gpus_per_node}"),
            });
        }
        if own_output {
            let log = batch_log(launch);
            // Slurm cannot update `StdErr`; jobs are submitted without `--error`, so their
            // stderr follows `StdOut`.
            args.push(format!("StdOut={}", log.display()));
            args.push(format!("WorkDir={}", launch.log_dir.display()));
        }
        self.run(Tool::Scontrol, &args)
            .map_err(|e| format!("cannot move Slurm job {job_id} onto {}: {e}", nodes.join(",")))?;
        self.to_release.insert(job_id, launch.run);
        Ok(())
    }

    /// Takes over foreign job `handle` as `launch.run` (`Launch::adopt`): a running job is
    /// watched (`Started` once Slurm says RUNNING), a pending one moved onto the launch's nodes
    /// and released; a job that is gone or not a job id fails the launch.
    fn take_over(&mut self, launch: &Launch, handle: &str) -> Result<(), BackendError> {
        let run = launch.run;
        let Ok(job_id) = handle.trim().parse::<u64>() else {
            self.fail_launch(run, format!("cannot take over {handle:?}: not a Slurm job id"));
            return Ok(());
        };
        self.refresh()?;
        let job = self.jobs.as_ref().and_then(|j| j.get(&job_id)).cloned();
        let job = match job {
            Some(job) if !job.is_terminal() => job,
            other => {
                let why = other.map_or("no longer in squeue".to_string(), |j| {
                    format!("ended {} ({})", j.state, j.reason)
                });
                self.fail_launch(run, format!("cannot take over Slurm job {job_id}: it {why}"));
                return Ok(());
            }
        };
        let mut tracked =
            Tracked { adopted: true, min_restarts: job.restarts, ..Tracked::new(job_id) };
        if job.is_pending() {
            if self.gpu_types.is_empty() && launch.members.iter().any(|m| !m.devices.is_empty()) {
                self.inventory()?;
            }
            if let Err(e) = self.place_and_release(job_id, launch, false) {
                self.fail_launch(run, e);
                return Ok(());
            }
        } else if !job.is_running() {
            tracked.ended = true;
            self.pending.push(Observation::LaunchFailed {
                run,
                error: format!("cannot take over Slurm job {job_id}: it is {}", job.state),
            });
        }
        self.runs.insert(run, tracked);
        self.poll_soon();
        Ok(())
    }

    /// Job ids that allot watches (its own and adopted ones): not foreign work.
    fn tracked_jobs(&self) -> BTreeSet<u64> {
        self.runs.values().filter(|t| !t.ended && t.job_id != 0).map(|t| t.job_id).collect()
    }

    /// Holds every pending job in `ids` (`scontrol hold`, 500 ids a call; one by one if a
    /// call fails). A job that started meanwhile cannot be held and is left alone (the next
    /// look shows it running); any other failure is an error naming the jobs.
    fn hold(&mut self, ids: &[u64]) -> Result<(), BackendError> {
        let mut failed = Vec::new();
        for chunk in ids.chunks(500) {
            let list: Vec<String> = chunk.iter().map(u64::to_string).collect();
            if self.run(Tool::Scontrol, &["hold".into(), list.join(",")]).is_ok() {
                continue;
            }
            for id in chunk {
                if let Err(e) = self.run(Tool::Scontrol, &["hold".into(), id.to_string()]) {
                    failed.push((*id, e));
                }
            }
        }
        if failed.is_empty() {
            return Ok(());
        }
        self.refresh()?;
        let jobs = self.jobs.as_ref();
        let still_pending: Vec<String> = failed
            .iter()
            .filter(|(id, _)| jobs.and_then(|j| j.get(id)).is_some_and(|j| j.state == "PENDING"))
            .map(|(id, e)| format!("job {id}: {e}"))
            .collect();
        if still_pending.is_empty() {
            return Ok(());
        }
        Err(BackendError::Io(format!(
            "cannot hold foreign Slurm jobs, so Slurm may start them behind allot's back (does \
             allot run as root, SlurmUser or an operator?): {}",
            still_pending.join("; ")
        )))
    }

    /// Makes `run` tracked if Slurm has a job for it (after a restart); `UnknownRun` otherwise.
    fn ensure_known(&mut self, run: RunId) -> Result<(), BackendError> {
        if self.runs.contains_key(&run) {
            return Ok(());
        }
        self.refresh()?;
        let Some(job) = self.find(run) else { return Err(BackendError::UnknownRun { run }) };
        self.runs.insert(run, Tracked::new(job.job_id));
        Ok(())
    }

    /// Why a launch's program cannot run, checked before anything reaches Slurm (when
    /// `verify_program`).
    fn program_refusal(&self, launch: &Launch) -> Option<String> {
        let Some(program) = launch.command.first() else {
            return Some("empty command: nothing to run".to_string());
        };
        if self.config.verify_program {
            let path_var = launch.env.get("PATH").cloned().or_else(|| std::env::var("PATH").ok());
            return allot_backend::resolve_program(program, path_var.as_deref()).err();
        }
        None
    }

    /// Reads the nodes' GRES types (from the inventory) if a launch needs GPUs and they are
    /// not known yet.
    fn load_gpu_types(&mut self, launch: &Launch) -> Result<(), BackendError> {
        if self.gpu_types.is_empty() && launch.members.iter().any(|m| !m.devices.is_empty()) {
            self.inventory()?;
        }
        Ok(())
    }

    /// A launch of a requeued run that cannot be placed: the run fails; allot's own job is
    /// cancelled (it must not linger held), an adopted one stays held as foreign work.
    /// A requeued job's next attempt writes to a log directory of its own: made as a new
    /// submission's is (the daemon's, then the job's account's with `run_as_submitter`).
    fn prepare_log_dir(&self, launch: &Launch, own: bool) -> Result<(), String> {
        if !own {
            return Ok(());
        }
        allot_backend::files::prepare(launch, None)?;
        if self.config.run_as_submitter {
            let owner = Account::of_user(
                launch.env.get(USER_ENV).map_or("", String::as_str),
                RUN_AS_SUBMITTER_FIX,
            )?;
            allot_backend::files::prepare(launch, Some(&owner))?;
        }
        Ok(())
    }

    fn fail_requeued(&mut self, run: RunId, why: String) -> Result<(), BackendError> {
        let Some(t) = self.runs.get_mut(&run) else { return Ok(()) };
        t.ended = true;
        t.awaiting_launch = false;
        let (job_id, adopted) = (t.job_id, t.adopted);
        self.pending.push(Observation::LaunchFailed { run, error: why });
        if !adopted {
            self.scancel(job_id, &[])?;
        }
        Ok(())
    }

    fn fail_launch(&mut self, run: RunId, error: String) {
        self.runs.insert(run, Tracked::failed());
        self.pending.push(Observation::LaunchFailed { run, error });
    }

    /// The `sbatch` arguments of a launch (everything but the script and the command).
    pub fn sbatch_args(&self, launch: &Launch) -> Vec<String> {
        let shape = node_shape(launch);
        let nodes: Vec<&str> = shape.keys().map(String::as_str).collect();
        let (tasks_per_node, gpus_per_node) = shape.values().next().copied().unwrap_or((1, 0));
        let log = batch_log(launch);
        let mut args = vec![
            "--parsable".to_string(),
            format!("--job-name={}", self.job_name(launch.run)),
            format!("--comment=allot:{}", launch.run),
            format!("--nodes={}", nodes.len()),
            format!("--nodelist={}", nodes.join(",")),
            format!("--ntasks={}", launch.members.len()),
            format!("--ntasks-per-node={tasks_per_node}"),
            // stderr goes with stdout (no `--error`), so that a requeue can move both.
            format!("--output={}", log.display()),
            format!("--chdir={}", launch.log_dir.display()),
            "--no-requeue".to_string(),
            "--export=ALL".to_string(),
        ];
        if self.config.submit_held {
            args.push("--hold".to_string());
        }
        if gpus_per_node > 0 {
            // Every node of the job has the same GPU type in allot's placement; take the first.
            let gpu_type = nodes.first().and_then(|n| self.gpu_types.get(*n).cloned().flatten());
            args.push(match gpu_type {
                Some(t) => format!("--gres=gpu:{t}:{gpus_per_node}"),
                None => format!("--gres=gpu:{gpus_per_node}"),
            });
        }
        let account = launch.env.get(ACCOUNT_ENV).or(self.config.default_account.as_ref());
        if let Some(a) = account {
            args.push(format!("--account={a}"));
        }
        if let Some(p) = &self.config.partition {
            args.push(format!("--partition={p}"));
        }
        args.extend(self.config.extra_sbatch_args.iter().cloned());
        args
    }

    fn submit(&mut self, launch: &Launch) -> Result<u64, SubmitError> {
        let owner = if self.config.run_as_submitter {
            Some(
                Account::of_user(
                    launch.env.get(USER_ENV).map_or("", String::as_str),
                    RUN_AS_SUBMITTER_FIX,
                )
                .map_err(SubmitError::Refused)?,
            )
        } else {
            None
        };
        // The daemon's own directories first, and the script written while the log directory is
        // still the daemon's; then the log directory and probe files go to the job's account.
        allot_backend::files::prepare(launch, None).map_err(SubmitError::Refused)?;
        let script = launch.log_dir.join("allot-batch.sh");
        std::fs::write(&script, BATCH_SCRIPT).map_err(|e| {
            SubmitError::Refused(format!("cannot write the batch script {}: {e}", script.display()))
        })?;
        if let Some(owner) = &owner {
            allot_backend::files::prepare(launch, Some(owner)).map_err(SubmitError::Refused)?;
        }
        let shape = node_shape(launch);
        let tasks_per_node = shape.values().next().map_or(1, |s| s.0);
        // `--export=ALL` passes sbatch's environment to the job: only the account's identity,
        // a known PATH and the launch's variables, never the daemon's (its token above all).
        let account = match &owner {
            Some(owner) => owner.clone(),
            None => Account::current().map_err(SubmitError::Refused)?,
        };
        let mut env = allot_backend::account::base_env(&account, &launch.env);
        env.insert("ALLOT_SLURM_TASKS".into(), launch.members.len().to_string());
        env.insert("ALLOT_SLURM_TASKS_PER_NODE".into(), tasks_per_node.to_string());
        let mut args = self.sbatch_args(launch);
        if let Some(owner) = &owner {
            args.push(format!("--uid={}", owner.uid));
            args.push(format!("--gid={}", owner.gid));
        }
        args.push(script.display().to_string());
        args.extend(launch.command.iter().cloned());
        let out = self.config.runner.run_clean(Tool::Sbatch, &args, &env).map_err(|e| {
            if e.is_unreachable() {
                SubmitError::Unreachable(e.to_string())
            } else {
                SubmitError::Refused(e.to_string())
            }
        })?;
        let id = parse::parse_sbatch_job_id(&out.stdout).ok_or_else(|| {
            SubmitError::Refused(format!(
                "sbatch printed no job id: {:?} {:?}",
                out.stdout, out.stderr
            ))
        })?;
        if self.config.submit_held {
            self.to_release.insert(id, launch.run);
        }
        Ok(id)
    }

    /// Releases every job submitted held since the last call: in one `scontrol release` per
    /// 500 jobs; if that fails, one by one, and a job that cannot be released is cancelled and
    /// its run reported `LaunchFailed` (a held job must not linger for a later launch to adopt).
    fn release_submitted(&mut self) {
        let batch: Vec<(u64, RunId)> = std::mem::take(&mut self.to_release).into_iter().collect();
        // Jobs that may carry a waiting reason: explained by this backend, or adopted or
        // requeued ones (explained, maybe, before a daemon restart).
        let admitted: Vec<u64> = batch
            .iter()
            .filter(|(id, run)| {
                let kept = self.runs.get(run).is_some_and(|t| t.adopted || t.min_restarts > 0);
                self.explained.remove(id) || kept
            })
            .map(|(id, _)| *id)
            .collect();
        if !admitted.is_empty() {
            let _ = self.set_admin_comment(&admitted, "admitted; released to run");
        }
        for chunk in batch.chunks(500) {
            let ids: Vec<String> = chunk.iter().map(|(id, _)| id.to_string()).collect();
            if self.run(Tool::Scontrol, &["release".into(), ids.join(",")]).is_ok() {
                continue;
            }
            for (id, run) in chunk {
                if let Err(e) = self.run(Tool::Scontrol, &["release".into(), id.to_string()]) {
                    // A foreign job stays (held): it is the user's, and shows up as foreign
                    // work again. allot's own is cancelled.
                    let adopted = self.runs.get(run).is_some_and(|t| t.adopted);
                    let cancel = match adopted {
                        true => "; it stays held".to_string(),
                        false => match self.scancel(*id, &[]) {
                            Ok(()) => String::new(),
                            Err(c) => format!("; cancelling it failed too ({c}): scancel {id}"),
                        },
                    };
                    if let Some(t) = self.runs.get_mut(run) {
                        t.ended = true;
                    }
                    self.pending.push(Observation::LaunchFailed {
                        run: *run,
                        error: format!("Slurm job {id} was held but not released: {e}{cancel}"),
                    });
                }
            }
        }
    }

    /// Adopts the job of `run` found in squeue (after a daemon restart): tracked from now on.
    /// A job left held by allot — submitted held by a daemon that died before releasing it, or
    /// requeued held for this run — is moved onto the launch's nodes and released.
    fn adopt(&mut self, launch: &Launch, job: &SqueueJob) -> Tracked {
        // The gate's hold (`scontrol hold`) of a foreign job is an administrator's when allot
        // runs as root or SlurmUser; allot's own holds are the user's.
        let held_by_allot = job.is_pending()
            && (matches!(job.reason.as_str(), "JobHeldUser" | "job requeued in held state")
                || (launch.adopt.is_some() && job.is_held()));
        if held_by_allot {
            self.to_place.insert(launch.run, launch.clone());
        }
        Tracked {
            adopted: !self.is_ours(job),
            min_restarts: job.restarts,
            ..Tracked::new(job.job_id)
        }
    }

    /// Places and releases the runs whose launch waits for their job to be pending (a job
    /// requeued moments ago may still be completing on its old nodes); a job that is gone
    /// or cannot be moved fails the launch.
    fn place_waiting(&mut self) {
        let Some(jobs) = &self.jobs else { return };
        let mut ready = Vec::new();
        for run in self.to_place.keys() {
            let Some(t) = self.runs.get(run) else { continue };
            match jobs.get(&t.job_id) {
                Some(job) if job.is_running() => {}
                Some(job) if job.is_pending() => ready.push((*run, t.job_id, None)),
                other => {
                    let why = other.map_or("is no longer in squeue".to_string(), |j| {
                        format!("ended {}", j.state)
                    });
                    ready.push((*run, t.job_id, Some(why)));
                }
            }
        }
        for (run, job_id, gone) in ready {
            let Some(launch) = self.to_place.remove(&run) else { continue };
            let own = self.runs.get(&run).is_some_and(|t| !t.adopted);
            let result = match gone {
                Some(why) => Err(format!("Slurm job {job_id} {why} before {run} could start")),
                None => self
                    .prepare_log_dir(&launch, own)
                    .and_then(|()| self.place_and_release(job_id, &launch, own)),
            };
            if let Err(error) = result {
                if let Some(t) = self.runs.get_mut(&run) {
                    t.ended = true;
                }
                self.pending.push(Observation::LaunchFailed { run, error });
            }
        }
    }

    fn scancel(&self, job_id: u64, extra: &[&str]) -> Result<(), BackendError> {
        let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        args.push(job_id.to_string());
        match self.config.runner.run(Tool::Scancel, &args, &BTreeMap::new()) {
            Ok(_) => Ok(()),
            // A job that ended meanwhile: signalling an ended run is fine.
            Err(e)
                if e.stderr.contains("already completing or completed")
                    || e.stderr.contains("Invalid job id") =>
            {
                Ok(())
            }
            Err(e) => Err(io(e)),
        }
    }

    /// Observations from the cache for every run not yet ended.
    fn reconcile(&mut self) -> Vec<Observation> {
        let Some(jobs) = &self.jobs else { return Vec::new() };
        let mut out = Vec::new();
        for (run, t) in self.runs.iter_mut().filter(|(_, t)| !t.ended) {
            let run = *run;
            let Some(job) = jobs.get(&t.job_id) else {
                t.ended = true;
                out.push(Observation::Exited {
                    run,
                    code: None,
                    detail: format!(
                        "exit status unknown: Slurm job {} is no longer in squeue (it ended \
                         more than MinJobAge ago or was purged)",
                        t.job_id
                    ),
                });
                continue;
            };
            if let Some(at) = t.requeued_at {
                if !job.is_running() || job.restarts > at {
                    t.ended = true;
                    out.push(Observation::Exited {
                        run,
                        code: None,
                        detail: format!("requeued by allot (Slurm job {})", job.job_id),
                    });
                }
                continue;
            }
            if job.restarts < t.min_restarts {
                continue;
            }
            // Confirmed only by RUNNING: COMPLETING right after a requeue is the previous run.
            if job.state == "RUNNING" && !t.started {
                t.started = true;
                out.push(Observation::Started { run, pids: Vec::new() });
            } else if job.is_terminal() {
                t.ended = true;
                if !job.ran() {
                    out.push(Observation::LaunchFailed {
                        run,
                        error: format!(
                            "Slurm job {} ended {} before it ran ({})",
                            job.job_id, job.state, job.reason
                        ),
                    });
                    continue;
                }
                if !t.started {
                    t.started = true;
                    out.push(Observation::Started { run, pids: Vec::new() });
                }
                out.push(exited(run, job));
            } else if job.is_pending() && t.started {
                // Requeued outside allot (an administrator, a node failure): this run is over;
                // the daemon decides what runs next.
                t.ended = true;
                out.push(Observation::Exited {
                    run,
                    code: None,
                    detail: format!(
                        "Slurm job {} was requeued outside allot ({}) and is pending again",
                        job.job_id, job.reason
                    ),
                });
            }
        }
        out
    }
}

fn exited(run: RunId, job: &SqueueJob) -> Observation {
    let code = job.exit_code();
    let how = match (code, job.exit_signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("signal {s}"),
        (None, None) => "no status".to_string(),
    };
    let code = if matches!(job.state.as_str(), "COMPLETED" | "FAILED") { code } else { None };
    Observation::Exited {
        run,
        code,
        detail: format!("Slurm job {} {} ({how}, {})", job.job_id, job.state, job.reason),
    }
}

/// Why Slurm cannot run a launch's members as one job (checked before anything reaches Slurm).
fn shape_refusal(launch: &Launch) -> Option<String> {
    if launch.members.is_empty() {
        return Some("no members to launch".to_string());
    }
    if launch.members.iter().flat_map(|m| &m.devices).any(|d| d.shares != 1000) {
        return Some(
            "a device share below a whole GPU: Slurm GRES allocate whole GPUs; give the \
             workload whole GPUs or run it on the local backend"
                .to_string(),
        );
    }
    let shape = node_shape(launch);
    let first = shape.values().next().copied().unwrap_or_default();
    if shape.values().any(|s| *s != first) {
        return Some(format!(
            "members need the same tasks and GPUs on every node (Slurm gives every node of \
             a job the same --ntasks-per-node and --gres); got {shape:?} as (members, GPUs) \
             per node"
        ));
    }
    None
}

/// The operator's words for a node's state: Slurm's state (DRAINED/DRAINING for a drained
/// node), its other flags, and the reason an administrator gave (`DRAINED: bad GPU 3`).
pub fn node_state_words(node: &SinfoNode) -> String {
    let drain = node.state_flags.iter().any(|f| f.starts_with("DRAIN"));
    let mut words = match (drain, node.state.as_str()) {
        (true, "allocated" | "mixed" | "completing") => "DRAINING".to_string(),
        (true, _) => "DRAINED".to_string(),
        (false, state) => state.to_ascii_uppercase(),
    };
    for flag in node.state_flags.iter().filter(|f| !f.starts_with("DRAIN")) {
        words.push('+');
        words.push_str(flag);
    }
    if !node.reason.is_empty() {
        words.push_str(": ");
        words.push_str(&node.reason);
    }
    words
}

/// One member per node a job holds, with the GPU indices Slurm gave it there.
fn members_of(job: &SqueueJob) -> Vec<MemberLaunch> {
    let no_gpu = parse::Gres { name: "gpu".into(), gres_type: None, count: 0, indices: vec![] };
    // Every node it holds is a member, with or without a GPU entry there.
    members_on(
        job.nodes
            .iter()
            .enumerate()
            .map(|(i, node)| (node.clone(), job.gres_detail.get(i).unwrap_or(&no_gpu).clone()))
            .collect(),
    )
}

/// One member per node, holding the GPUs Slurm bound there.
fn members_on(gpus_per_node: Vec<(String, parse::Gres)>) -> Vec<MemberLaunch> {
    gpus_per_node
        .into_iter()
        .map(|(node, gres)| MemberLaunch {
            node,
            devices: gres
                .indices
                .into_iter()
                .map(|index| DeviceAssignment {
                    index,
                    uuid: None,
                    vendor: Vendor::Nvidia,
                    shares: 1000,
                })
                .collect(),
        })
        .collect()
}

/// Members and GPUs per node of a launch, by node.
fn node_shape(launch: &Launch) -> BTreeMap<String, (usize, usize)> {
    let mut shape: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for m in &launch.members {
        let e = shape.entry(m.node.clone()).or_default();
        e.0 += 1;
        e.1 += m.devices.len();
    }
    shape
}

impl Backend for SlurmBackend {
    fn name(&self) -> &str {
        "slurm"
    }

    fn gate(&mut self) -> Option<String> {
        let config = self.run(Tool::Scontrol, &["show".to_string(), "config".to_string()]);
        Some(gate::describe(config.ok().map(|out| out.stdout).as_deref()))
    }

    fn submitter_check(&self) -> Option<allot_backend::SubmitterCheck> {
        self.config.run_as_submitter.then(|| {
            let check: allot_backend::SubmitterCheck = std::sync::Arc::new(|user: &str| {
                Account::of_user(user, RUN_AS_SUBMITTER_FIX).map(|_| ())
            });
            check
        })
    }

    /// Nodes of the managed partitions with their GPUs (one device per GPU of each `gpu`
    /// GRES, the GRES type as model). Nodes that are down or drained are included (the
    /// cluster's shape does not change); see [`SlurmBackend::nodes`] for their state.
    fn inventory(&mut self) -> Result<Vec<NodeSpec>, BackendError> {
        let nodes = self.nodes()?;
        Ok(self.node_specs(&nodes))
    }

    fn launch(&mut self, launch: &Launch) -> Result<(), BackendError> {
        let run = launch.run;
        if let Some(t) = self.runs.get(&run) {
            if t.awaiting_launch && !t.ended {
                // Requeued held as this run: onto this launch's nodes, then released.
                if let Some(why) = shape_refusal(launch) {
                    return self.fail_requeued(run, why);
                }
                self.load_gpu_types(launch)?;
                if let Some(t) = self.runs.get_mut(&run) {
                    t.awaiting_launch = false;
                }
                self.to_place.insert(run, launch.clone());
                self.poll_soon();
            }
            return Ok(());
        }
        // A launch Slurm cannot express was never submitted: refuse it before asking Slurm.
        if let Some(why) = shape_refusal(launch) {
            self.fail_launch(run, why);
            return Ok(());
        }
        if let Some(handle) = &launch.adopt {
            return self.take_over(launch, handle);
        }
        self.ensure_loaded()?;
        if let Some(job) = self.find(run).cloned() {
            // Submitted (or requeued for this run) by an earlier daemon: adopt it; poll
            // reports what it does.
            self.load_gpu_types(launch)?;
            let tracked = self.adopt(launch, &job);
            self.runs.insert(run, tracked);
            self.poll_soon();
            return Ok(());
        }
        if let Some(why) = self.program_refusal(launch) {
            self.fail_launch(run, why);
            return Ok(());
        }
        self.load_gpu_types(launch)?;
        match self.submit(launch) {
            Ok(job_id) => {
                self.runs.insert(run, Tracked::new(job_id));
            }
            // slurmctld did not answer: nothing was submitted that allot knows of; the daemon
            // queues the work again and launches it once the controller answers.
            Err(SubmitError::Unreachable(e)) => return Err(BackendError::Unreachable(e)),
            Err(SubmitError::Refused(e)) => self.fail_launch(run, e),
        }
        self.poll_soon();
        Ok(())
    }

    fn signal(&mut self, run: RunId, signal: StopSignal) -> Result<(), BackendError> {
        self.ensure_known(run)?;
        let Some(t) = self.runs.get(&run).cloned() else {
            return Err(BackendError::UnknownRun { run });
        };
        if t.ended || t.job_id == 0 || t.requeued_at.is_some() {
            return Ok(());
        }
        if self.to_release.contains_key(&t.job_id) {
            // Submitted and not yet released: nothing runs to checkpoint; a stop cancels it.
            if signal != StopSignal::Checkpoint {
                self.to_release.remove(&t.job_id);
                self.scancel(t.job_id, &[])?;
                self.poll_soon();
            }
            return Ok(());
        }
        if !t.started {
            // The cache may be older than the job's start: look again.
            self.refresh()?;
        }
        let job = self.jobs.as_ref().and_then(|j| j.get(&t.job_id));
        let running = job.is_some_and(SqueueJob::is_running);
        let checkpoint = format!("--signal={}", self.config.checkpoint_signal);
        match (signal, running) {
            // Nothing runs yet that could checkpoint.
            (StopSignal::Checkpoint, false) => {}
            (StopSignal::Checkpoint, true) => self.scancel(t.job_id, &[&checkpoint, "--full"])?,
            // Slurm's own cancel: SIGTERM, SIGKILL after the cluster's `KillWait`, and the job
            // ends CANCELLED in Slurm's accounting (a SIGTERM sent with `--signal` would end
            // it FAILED). A later Kill is then refused as "Invalid job id": Slurm kills it.
            (StopSignal::Terminate, _) => self.scancel(t.job_id, &[])?,
            (StopSignal::Kill, true) => self.scancel(t.job_id, &["--signal=KILL", "--full"])?,
            // Pending or held: cancel it.
            (StopSignal::Kill, false) => self.scancel(t.job_id, &[])?,
        }
        self.poll_soon();
        Ok(())
    }

    fn poll(&mut self) -> Result<Vec<Observation>, BackendError> {
        self.release_submitted();
        let watching = self.runs.values().any(|t| !t.ended);
        let now = clock::now();
        if watching && self.next_poll.is_none_or(|at| now >= at) {
            // A failed squeue keeps what `pending` holds for the next poll.
            self.refresh()?;
            self.place_waiting();
            self.release_submitted();
            let seen = self.reconcile();
            // A run waiting to be placed is looked at again soon (its job is completing).
            let changed = !seen.is_empty() || !self.to_place.is_empty();
            self.interval = next_interval(&self.config, self.interval, changed, self.work_waiting);
            self.next_poll = Some(now + self.interval);
            self.pending.extend(seen);
        }
        Ok(std::mem::take(&mut self.pending))
    }

    fn set_work_waiting(&mut self, waiting: bool) {
        if waiting && !self.work_waiting {
            let soon = clock::now() + self.config.poll_while_waiting;
            self.interval = self.interval.min(self.config.poll_while_waiting);
            self.next_poll = self.next_poll.map(|at| at.min(soon));
        }
        self.work_waiting = waiting;
    }

    fn recover(&mut self, runs: &[Launch]) -> Result<Vec<Observation>, BackendError> {
        self.refresh()?;
        let mut out = Vec::new();
        for launch in runs {
            let run = launch.run;
            let job = self.find_for(launch).cloned();
            if let Some((next, job_id)) = self.requeued_as(run)
                && job.as_ref().is_none_or(|j| j.job_id == job_id)
            {
                // Requeued for a later attempt before the daemon saw this run end.
                self.runs.insert(run, Tracked { ended: true, ..Tracked::new(job_id) });
                out.push(Observation::Exited {
                    run,
                    code: None,
                    detail: format!("requeued by allot as {next} (Slurm job {job_id})"),
                });
                continue;
            }
            let Some(job) = job else {
                self.runs.insert(run, Tracked::failed());
                let what = match &launch.adopt {
                    Some(handle) => format!("Slurm job {handle} (taken over)"),
                    None => format!("Slurm job named {}", self.job_name(run)),
                };
                out.push(Observation::LaunchFailed {
                    run,
                    error: format!(
                        "no {what} (never submitted, or it ended more than MinJobAge ago)"
                    ),
                });
                continue;
            };
            self.load_gpu_types(launch)?;
            let mut t = self.adopt(launch, &job);
            if job.state == "RUNNING" {
                t.started = true;
                out.push(Observation::Started { run, pids: Vec::new() });
            } else if job.is_terminal() {
                t.ended = true;
                out.push(if job.ran() {
                    exited(run, &job)
                } else {
                    Observation::LaunchFailed {
                        run,
                        error: format!(
                            "Slurm job {} ended {} before it ran",
                            job.job_id, job.state
                        ),
                    }
                });
            }
            // Pending: Started comes through poll when it runs.
            self.runs.insert(run, t);
        }
        self.poll_soon();
        Ok(out)
    }

    /// Node states from `sinfo --json` (managed nodes) and foreign work from
    /// [`SlurmBackend::foreign_work`], which holds every pending foreign job it sees.
    fn watch_cluster(&mut self) -> Result<ClusterNews, BackendError> {
        let listed = self.nodes()?;
        let nodes = listed
            .iter()
            .filter(|n| self.managed_node(n))
            .map(|n| NodeStatus {
                node: n.name.clone(),
                usable: n.usable(),
                reason: node_state_words(n),
            })
            .collect();
        let (foreign, beside) = self.scan_foreign()?;
        // The same `sinfo` as the node states: nodes added, removed or given other GRES.
        let inventory = Some(self.node_specs(&listed));
        Ok(ClusterNews { inventory, nodes, foreign, beside })
    }

    fn requeue(&mut self, run: RunId, next: RunId) -> Result<bool, BackendError> {
        SlurmBackend::requeue(self, run, next).map(|()| true)
    }

    /// Slurm binds GRES indices on each node itself: one `squeue --json` for the whole batch
    /// gives every running run's indices, one member per node.
    fn allocated_devices(
        &mut self,
        runs: &[RunId],
    ) -> Result<Vec<(RunId, Vec<MemberLaunch>)>, BackendError> {
        let ids: Vec<(RunId, u64)> =
            runs.iter().filter_map(|r| Some((*r, self.job_id(*r)?))).collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // A few starts: one small `scontrol show job -d` each, instead of `squeue --json`,
        // which lists every field of every job.
        let queued = self.jobs.as_ref().map_or(0, BTreeMap::len);
        if ids.len() <= DETAILS_PER_POLL.max(queued / QUEUE_JOBS_PER_DETAIL) {
            let mut out = Vec::new();
            for (run, id) in ids {
                let args =
                    ["--oneliner", "show", "job", "--details", &id.to_string()].map(str::to_string);
                let Ok(text) = self.run(Tool::Scontrol, &args) else { continue };
                let Some(job) = parse::parse_job_details(&text.stdout) else { continue };
                if job.job_id != id || job.state != "RUNNING" {
                    continue;
                }
                let members = members_on(job.gpus_per_node);
                if members.iter().any(|m| !m.devices.is_empty()) {
                    out.push((run, members));
                }
            }
            return Ok(out);
        }
        self.refresh_json()?;
        let Some(jobs) = &self.jobs else { return Ok(Vec::new()) };
        Ok(ids
            .into_iter()
            .filter_map(|(run, id)| {
                let job = jobs.get(&id).filter(|j| j.is_running())?;
                let members = members_of(job);
                members.iter().any(|m| !m.devices.is_empty()).then_some((run, members))
            })
            .collect())
    }

    /// `scancel` of a foreign job no launch took over (held by the gate). `Ok(false)` for a
    /// handle that is not a job id or is one of allot's runs.
    fn cancel_foreign(&mut self, handle: &str) -> Result<bool, BackendError> {
        let Ok(job_id) = handle.trim().parse::<u64>() else { return Ok(false) };
        if self.tracked_jobs().contains(&job_id) {
            return Ok(false);
        }
        self.scancel(job_id, &[])?;
        self.poll_soon();
        Ok(true)
    }

    /// The reason in each waiting job's admin comment (`scontrol update AdminComment=allot:
    /// waiting: …`), one call per distinct reason; the job's comment stays the user's (and
    /// allot's run key). Shown by `scontrol show job` and `squeue --json` (and `squeue -O
    /// AdminComment` from Slurm 23.02).
    fn explain_waiting(&mut self, reasons: &[(Waiting, String)]) -> Result<(), BackendError> {
        let mut by_text: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for (waiting, text) in reasons {
            let job = match waiting {
                Waiting::Foreign(handle) => handle.trim().parse::<u64>().ok(),
                Waiting::Kept(run) => self.runs.get(run).map(|t| t.job_id).filter(|id| *id != 0),
            };
            if let Some(job) = job {
                by_text.entry(text.as_str()).or_default().push(job);
            }
        }
        for (text, jobs) in by_text {
            self.set_admin_comment(&jobs, &format!("waiting: {text}"))?;
            self.explained.extend(jobs);
        }
        Ok(())
    }

    /// `scontrol requeuehold` of a running foreign job: pending (held) foreign work again.
    /// `Ok(false)` for a handle that is not a foreign job on the cluster (gone, allot's own,
    /// taken over); `Ok(true)` for one already pending (the gate holds it).
    fn return_foreign(&mut self, handle: &str) -> Result<bool, BackendError> {
        let Ok(job_id) = handle.trim().parse::<u64>() else { return Ok(false) };
        if self.tracked_jobs().contains(&job_id) {
            return Ok(false);
        }
        self.refresh()?;
        let Some(job) = self.jobs.as_ref().and_then(|j| j.get(&job_id)).cloned() else {
            return Ok(false);
        };
        if self.is_ours(&job) || job.is_terminal() {
            return Ok(false);
        }
        if job.is_pending() {
            if !job.is_held() {
                self.hold(&[job_id])?;
            }
            return Ok(true);
        }
        self.requeue_held(job_id)?;
        Ok(true)
    }
}

impl SlurmBackend {
    /// Sets the admin comment of `jobs` to `allot: <text>`, 500 jobs a call. Admin comments
    /// are an administrator's to set: once Slurm refuses one, allot stops trying (and says so
    /// in the daemon's log, once).
    fn set_admin_comment(&mut self, jobs: &[u64], text: &str) -> Result<(), BackendError> {
        if self.explain_refused.is_some() {
            return Ok(());
        }
        // One line, without the `|` that would shift a `squeue --Format` field, and short.
        let mut text: String =
            text.chars().map(|c| if c == '|' || c.is_control() { ' ' } else { c }).collect();
        if let Some((cut, _)) = text.char_indices().nth(400) {
            text.truncate(cut);
        }
        for chunk in jobs.chunks(500) {
            let ids: Vec<String> = chunk.iter().map(u64::to_string).collect();
            let args = [
                "update".to_string(),
                format!("jobid={}", ids.join(",")),
                format!("AdminComment=allot: {text}"),
            ];
            match self.config.runner.run(Tool::Scontrol, &args, &BTreeMap::new()) {
                Ok(_) => {}
                Err(e) if e.is_unreachable() => return Err(io(e)),
                Err(e) if e.stderr.contains("ermission denied") || e.stderr.contains("Access") => {
                    let why = format!(
                        "Slurm refused allot's reasons in admin comments ({}); run the daemon \
                         as root or SlurmUser to show them in scontrol show job",
                        e.stderr.trim()
                    );
                    self.explain_refused = Some(why.clone());
                    return Err(BackendError::Invalid(why));
                }
                // A job that ended meanwhile makes the whole call fail: one by one then.
                Err(_) if chunk.len() > 1 => {
                    for id in chunk {
                        let _ = self.set_admin_comment(&[*id], &text);
                    }
                }
                Err(e) => return Err(io(e)),
            }
        }
        Ok(())
    }

    /// The managed nodes of a `sinfo` listing as the engine's specs (GRES GPUs by type),
    /// remembering each node's GRES type for launches.
    fn node_specs(&mut self, nodes: &[SinfoNode]) -> Vec<NodeSpec> {
        let mut specs = Vec::new();
        self.gpu_types.clear();
        let managed: Vec<&SinfoNode> = nodes.iter().filter(|n| self.managed_node(n)).collect();
        for node in managed {
            let gpus = node.gpus();
            self.gpu_types
                .insert(node.name.clone(), gpus.first().and_then(|g| g.gres_type.clone()));
            let devices = gpus
                .iter()
                .flat_map(|g| {
                    let model = g.gres_type.clone().unwrap_or_else(|| "gpu".to_string());
                    let memory_mib = self.config.gpu_memory_mib.get(&model).copied().unwrap_or(0);
                    let count = usize::try_from(g.count).unwrap_or(0).min(1024);
                    std::iter::repeat_n(
                        DeviceSpec { model, memory_mib, island: 0, mig: false },
                        count,
                    )
                })
                .collect();
            let mut labels = BTreeMap::new();
            labels.insert("slurm.partitions".to_string(), node.partitions.join(","));
            specs.push(NodeSpec {
                name: node.name.clone(),
                cpu_millis: node.cpus.saturating_mul(1000),
                memory_mib: node.real_memory_mib,
                labels,
                pool: node.partitions.first().cloned(),
                rack: None,
                devices,
            });
        }
        specs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_backs_off_while_nothing_changes_and_stays_short_while_work_waits() {
        let config = SlurmConfig::new();
        let (min, max, waiting) = (config.poll_min, config.poll_max, config.poll_while_waiting);
        let mut quiet = min;
        let mut busy = min;
        for _ in 0..10 {
            quiet = next_interval(&config, quiet, false, false);
            busy = next_interval(&config, busy, false, true);
        }
        assert_eq!(quiet, max);
        assert_eq!(busy, waiting);
        assert_eq!(next_interval(&config, max, true, false), min);
        assert_eq!(next_interval(&config, min, false, false), min * 2);
    }

    #[test]
    fn work_that_starts_waiting_brings_the_next_look_forward() {
        let mut config = SlurmConfig::new();
        config.runner.bin_dir = Some(std::path::PathBuf::from("/nonexistent/slurm/bin"));
        let mut backend = SlurmBackend::new(config);
        let far = clock::now() + Duration::from_secs(60);
        backend.interval = Duration::from_secs(5);
        backend.next_poll = Some(far);
        backend.set_work_waiting(true);
        let cap = clock::now() + backend.config.poll_while_waiting;
        assert!(backend.next_poll.is_some_and(|at| at <= cap));
        assert_eq!(backend.interval, backend.config.poll_while_waiting);
        // Work that stops waiting leaves the pause as it is; the backoff lengthens it again.
        backend.set_work_waiting(false);
        assert_eq!(backend.interval, backend.config.poll_while_waiting);
    }
}
